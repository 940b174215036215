/* launch.c — lajit_launch: one launch of a family that declares its own arguments (op "custom",
 * generator/family_args.c). The caller's tensors, scalars and problem values arrive by name;
 * they are matched to the declaration, checked as rigorously as the attention ops check theirs
 * (dtype, rank, sizes that agree wherever a symbol repeats, CUDA memory on the context's device,
 * alignment, element offsets, outputs that share no element with anything else), turned into
 * the problem (dtype and symbol values) whose plan the shared plan table holds, packed in the
 * declared order (device/args.h) and launched. A workspace argument is not the caller's: it is
 * the context's buffer for the family, grown (and zeroed) to the size the plan's launch says.
 *
 * The hot path — a bucket that has its plan — does name matching over at most LJ_MAX_ARGS
 * names (the caller's order first, so arguments given in the declared order cost one strcmp
 * each), the checks, a plan-table probe and one cuLaunchKernel: no allocation, no Lua, no
 * synchronisation, so it can be captured in a CUDA graph. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "context.h"
#include "op_args.h"
#include "plan_build.h"
#include "tensor.h"

/* Whether declared argument a is of the kind the caller gives as a tensor (1) or a scalar (0);
 * a workspace is neither. */
static int of_kind(const lj_arg_decl *a, int want_tensor)
{
    if (a->kind == LJ_ARG_WORKSPACE)
        return 0;
    return (a->kind == LJ_ARG_TENSOR) == want_tensor;
}

/* The declared argument named name of kind tensor (want_tensor) or scalar, trying `hint` (the
 * caller's position) first; -1 when there is none. */
static int match(const lj_args_decl *d, const char *name, int want_tensor, int hint)
{
    if (hint < d->n_args && of_kind(&d->arg[hint], want_tensor) &&
        strcmp(d->arg[hint].name, name) == 0)
        return hint;
    for (int i = 0; i < d->n_args; i++)
        if (of_kind(&d->arg[i], want_tensor) && strcmp(d->arg[i].name, name) == 0)
            return i;
    return -1;
}

/* A name the caller gave that is the family's workspace: a message of its own. */
static lajit_status refuse_workspace(lj_env *env, const char *family, const lj_args_decl *d,
                                     const char *name)
{
    if (name && d->workspace >= 0 && strcmp(d->arg[d->workspace].name, name) == 0)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: %s is the family's workspace: lajit provides it, the caller does not",
                        family, name);
    return LAJIT_OK;
}

/* "q, k, v, o" — the declared names of one kind, for messages. */
static void names_of(const lj_args_decl *d, int tensors, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < d->n_args && used < cap; i++) {
        if (!of_kind(&d->arg[i], tensors))
            continue;
        int n = snprintf(out + used, cap - used, "%s%s", used ? ", " : "", d->arg[i].name);
        if (n < 0)
            break;
        used += (size_t)n;
    }
    if (!out[0])
        snprintf(out, cap, "none");
}

/* Checks tensor t against declaration a (the problem's dtype known), binds the symbols its
 * shape names that are not yet known, and fills v. */
static lajit_status check_tensor(lj_env *env, const char *family, const lj_arg_decl *a,
                                 const DLTensor *t, lj_problem *p, unsigned *known,
                                 const char **bound_by, lj_arg_value *v)
{
    const lj_args_decl *d = p->decl;
    lj_elem want = a->elem == LJ_ELEM_PROBLEM ? (lj_elem)p->dtype : a->elem, got;
    if (t->device.device_type != kDLCUDA && t->device.device_type != kDLCUDAManaged)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: %s is not CUDA memory (device_type %d)", family, a->name,
                        (int)t->device.device_type);
    if (!lj_tensor_elem(t->dtype, &got) || got != want)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: %s is %s; expected %s%s", family,
                        a->name, lj_tensor_dtype_name(t->dtype), lj_elem_name(want),
                        a->elem == LJ_ELEM_PROBLEM ? " (the problem's dtype)" : "");
    if (t->ndim != a->rank)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: %s has %d dimensions; the family declares %d", family, a->name,
                        t->ndim, a->rank);
    if (!t->shape)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: %s has no shape", family, a->name);
    long long esize = lj_elem_size(want);
    long long align = a->align > esize ? a->align : esize;
    uint64_t addr;
    if (!t->data || __builtin_add_overflow((uint64_t)(uintptr_t)t->data, t->byte_offset, &addr))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: %s's address is NULL or data + byte_offset wraps", family, a->name);
    if (addr % (uint64_t)align)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: %s's address 0x%llx is not a multiple of %lld bytes", family, a->name,
                        (unsigned long long)addr, align);
    /* Sizes against the symbols; strides (compact when NULL) against the alignment; the last
     * element's offset within 63 bits. */
    long long stride = 1, reach = 0;
    for (int i = a->rank - 1; i >= 0; i--) {
        long long n = t->shape[i];
        int s = a->shape[i];
        if (n < 1)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: %s's dimension %d (%s) is %lld",
                            family, a->name, i, d->sym[s].name, n);
        if (*known & (1u << s)) {
            if (p->sym[s] != n)
                return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                                "%s: %s's dimension %d (%s) is %lld, but %s = %lld (%s)", family,
                                a->name, i, d->sym[s].name, n, d->sym[s].name, p->sym[s],
                                bound_by[s]);
        } else {
            p->sym[s] = n;
            *known |= 1u << s;
            bound_by[s] = a->name;
        }
        long long st = t->strides ? t->strides[i] : stride;
        if (st < 0 || (st == 0 && n > 1))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: %s's stride %d is %lld (negative or zero strides are refused)",
                            family, a->name, i, st);
        if (n == 1)
            st = i == a->rank - 1 ? 1 : 0; /* never used to address memory */
        if (i == a->rank - 1 && a->unit_stride && st != 1)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: %s's last stride is %lld; the family needs 1", family, a->name,
                            st);
        if (n > 1 && st != 1 && st % (align / esize)) /* both powers of two, align >= esize */
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: %s's stride %d (%lld elements) is not a multiple of %lld bytes",
                            family, a->name, i, st, align);
        long long part;
        if (__builtin_mul_overflow(n - 1, st, &part) ||
            __builtin_add_overflow(reach, part, &reach) || reach > (1LL << 62) / esize)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: %s spans more than 2^62 bytes",
                            family, a->name);
        if (!t->strides && __builtin_mul_overflow(stride, n, &stride))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: %s is too large", family,
                            a->name);
        v->size[i] = n;
        v->stride[i] = st;
    }
    uint64_t end;
    if (__builtin_add_overflow(addr, (uint64_t)((reach + 1) * esize), &end))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: %s's extent wraps past 2^64", family,
                        a->name);
    v->ptr = addr;
    return LAJIT_OK;
}

/* The workspace argument of a launch: the context's buffer for family f, grown and zeroed to the
 * bytes the plan's launch says for these symbol values (NULL and size 0 for none). */
static lajit_status fill_workspace(lajit_ctx *ctx, const lj_family *f, const char *fam,
                                   const lj_plan *plan, const long long *vars, void *stream,
                                   lj_arg_value *v)
{
    unsigned long long bytes = 0;
    if (!lj_plan_ws_bytes(&plan->launch, vars, LJ_N_GRID_VARS, &bytes) || bytes > SIZE_MAX)
        return lj_error(&ctx->env, LAJIT_ERR_UNSUPPORTED,
                        "%s: the workspace of this launch passes 2^50 bytes", fam);
    v->ptr = 0, v->size[0] = 0, v->stride[0] = 1;
    if (!bytes)
        return LAJIT_OK;
    int slot = 0;
    while (slot < ctx->n_families && ctx->families[slot] != f)
        slot++;
    if (slot == ctx->n_families) /* lajit__ctx_family gave f: it is loaded */
        return lj_error(&ctx->env, LAJIT_ERR_INTERNAL, "%s: not among the context's families", fam);
    lj_dev_buf *buf = &ctx->family_ws[slot];
    lajit_status st = lj_ctx_buffer(ctx, buf, (size_t)bytes, 1, stream, "a family's workspace");
    if (st != LAJIT_OK)
        return st;
    v->ptr = (unsigned long long)buf->ptr;
    v->size[0] = (long long)bytes;
    return LAJIT_OK;
}

LAJIT_API lajit_status lajit_launch(lajit_ctx *ctx, const lajit_launch_args *a)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lj_env *env = &ctx->env;
    if (!a)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "lajit_launch: args is NULL");
    if (a->struct_size != sizeof *a)
        return lj_error(env, LAJIT_ERR_STRUCT_SIZE,
                        "lajit_launch: struct_size %zu, this build knows %zu", a->struct_size,
                        sizeof *a);
    if (!a->family)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "lajit_launch: no family named");
    const char *fam = a->family;
    if ((a->n_tensors && !a->tensors) || (a->n_scalars && !a->scalars) ||
        (a->n_problem && !a->problem))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: a count is nonzero but its array is NULL", fam);
    lj_family *f;
    lajit_status st = lajit__ctx_family(ctx, fam, &f); /* a table probe once loaded */
    if (st != LAJIT_OK)
        return st;
    const lj_args_decl *d = lj_family_args(f);
    if (!d)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s is an attention family (op %s): call lajit_attn_%s", fam,
                        lj_op_name(lj_family_op(f)), lj_op_name(lj_family_op(f)));
    if (a->n_tensors > LJ_MAX_ARGS || a->n_scalars > LJ_MAX_ARGS || a->n_problem > LJ_MAX_SYMBOLS)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: more arguments than it declares",
                        fam);

    /* Match the caller's names to the declaration. */
    const DLTensor *given[LJ_MAX_ARGS] = {0};
    unsigned char seen[LJ_MAX_ARGS] = {0};
    double scalar[LJ_MAX_ARGS] = {0};
    char list[512];
    for (size_t j = 0; j < a->n_tensors; j++) {
        const char *name = a->tensors[j].name;
        int i = name ? match(d, name, 1, (int)j) : -1;
        if (i < 0 && (st = refuse_workspace(env, fam, d, name)) != LAJIT_OK)
            return st;
        if (i < 0) {
            names_of(d, 1, list, sizeof list);
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: tensor %zu is named %s%s%s, which the family does not declare "
                            "(its tensors: %s)",
                            fam, j, name ? "\"" : "", name ? name : "NULL", name ? "\"" : "", list);
        }
        if (seen[i])
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: tensor %s is given twice", fam,
                            name);
        seen[i] = 1;
        given[i] = a->tensors[j].tensor;
    }
    for (size_t j = 0; j < a->n_scalars; j++) {
        const char *name = a->scalars[j].name;
        int i = name ? match(d, name, 0, (int)j) : -1;
        if (i < 0 && (st = refuse_workspace(env, fam, d, name)) != LAJIT_OK)
            return st;
        if (i < 0) {
            names_of(d, 0, list, sizeof list);
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: scalar %zu is named %s, which the family does not declare (its "
                            "scalars: %s)",
                            fam, j, name ? name : "NULL", list);
        }
        if (seen[i])
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: scalar %s is given twice", fam,
                            name);
        seen[i] = 1;
        scalar[i] = a->scalars[j].value;
    }

    /* Every required argument is there before any is examined: a missing one is named first. */
    for (int i = 0; i < d->n_args; i++) {
        const lj_arg_decl *ad = &d->arg[i];
        if (ad->kind == LJ_ARG_WORKSPACE)
            continue;
        if (ad->kind == LJ_ARG_TENSOR ? !given[i] && !ad->optional : !seen[i])
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: %s %s is required", fam,
                            ad->kind == LJ_ARG_TENSOR ? "tensor" : "scalar", ad->name);
    }

    /* The problem: dtype, the symbols the caller gives, then the flags of optional tensors. */
    lj_problem p;
    memset(&p, 0, sizeof p);
    p.op = LJ_OP_CUSTOM;
    p.decl = d;
    p.T = 1;
    int have_dtype = 0;
    if (a->dtype) {
        if (!lj_dtype_parse(a->dtype, &p.dtype))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: dtype \"%s\": expected f32, f16 or bf16", fam, a->dtype);
        have_dtype = 1;
    }
    for (int i = 0; i < d->n_args && !have_dtype; i++) {
        lj_elem e;
        if (d->arg[i].kind == LJ_ARG_TENSOR && d->arg[i].elem == LJ_ELEM_PROBLEM && given[i] &&
            lj_tensor_elem(given[i]->dtype, &e) && e <= LJ_ELEM_BF16) {
            p.dtype = (lj_dtype)e;
            have_dtype = 1;
        }
    }
    /* A family that takes one dtype needs none said (its tensors may all have fixed types). */
    for (int dt = LJ_F32; !have_dtype && dt <= LJ_BF16; dt++) {
        if (d->dtypes == 1u << dt) {
            p.dtype = (lj_dtype)dt;
            have_dtype = 1;
        }
    }
    if (!have_dtype)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: no dtype given and no tensor of the problem's dtype to take it from",
                        fam);
    if (!(d->dtypes & (1u << p.dtype)))
        return lj_error(env, LAJIT_ERR_UNSUPPORTED, "%s does not take dtype %s", fam,
                        lj_dtype_name(p.dtype));
    unsigned known = 0;
    const char *bound_by[LJ_MAX_SYMBOLS];
    for (size_t j = 0; j < a->n_problem; j++) {
        const char *name = a->problem[j].name;
        int s = name ? lj_args_symbol(d, name) : -1;
        if (s < 0 || d->sym[s].flag)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: problem value %s is not a shape symbol of the family", fam,
                            name ? name : "NULL");
        if (known & (1u << s))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: problem value %s given twice",
                            fam, name);
        if (a->problem[j].value < 1 || a->problem[j].value > (1LL << 62))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: %s = %lld: out of range", fam,
                            name, (long long)a->problem[j].value);
        p.sym[s] = a->problem[j].value;
        known |= 1u << s;
        bound_by[s] = "given in problem";
    }

    /* Tensors in the declared order: present ones checked and bound, absent ones legal only
     * when optional. Scalars converted. */
    lj_arg_value v[LJ_MAX_ARGS];
    lj_io_tensor io[LJ_MAX_ARGS];
    int n_io = 0;
    for (int i = 0; i < d->n_args; i++) {
        const lj_arg_decl *ad = &d->arg[i];
        memset(&v[i], 0, sizeof v[i]);
        if (ad->kind == LJ_ARG_WORKSPACE)
            continue; /* filled once the plan says its size */
        if (ad->kind == LJ_ARG_TENSOR) {
            if (ad->optional)
                p.sym[ad->flag] = given[i] != NULL;
            if (!given[i])
                continue; /* an optional one left out (a required one was caught above) */
            if ((st = check_tensor(env, fam, ad, given[i], &p, &known, bound_by, &v[i])) !=
                LAJIT_OK)
                return st;
            io[n_io++] = (lj_io_tensor){ad->name, given[i], ad->output};
            continue;
        }
        double x = scalar[i];
        if (ad->kind == LJ_ARG_F32) {
            if (!isfinite(x) || fabs(x) > 3.4028234663852886e38)
                return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                                "%s: scalar %s = %g is not a finite float", fam, ad->name, x);
            v[i].f = x;
        } else {
            double lim = ad->kind == LJ_ARG_I32 ? 2147483648.0 : 9223372036854775808.0;
            if (!(x >= -lim && x < lim) || x != floor(x))
                return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                                "%s: scalar %s = %g is not an integer of its type (%s)", fam,
                                ad->name, x, ad->kind == LJ_ARG_I32 ? "i32" : "i64");
            v[i].i = (long long)x;
        }
    }
    for (int s = 0; s < d->n_syms; s++)
        if (!d->sym[s].flag && !(known & (1u << s)))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: symbol %s has no value: only optional tensors left out use it; "
                            "give it in problem",
                            fam, d->sym[s].name);
    if ((st = lj_check_io(ctx, io, n_io, NULL, NULL)) != LAJIT_OK)
        return st;

    const lj_plan *plan;
    if ((st = lj_plan_get(ctx, fam, &p, &plan)) != LAJIT_OK)
        return st;
    long long vars[LJ_N_GRID_VARS];
    vars[LJ_VAR_ONE] = 1;
    for (int s = 0; s < LJ_MAX_SYMBOLS; s++)
        vars[LJ_VAR_SYM0 + s] = p.sym[s];
    unsigned grid[3];
    if (!lj_plan_grid(&plan->launch, vars, LJ_N_GRID_VARS, grid))
        return lj_error(env, LAJIT_ERR_UNSUPPORTED, "%s: the grid exceeds the driver's limits",
                        fam);
    if (d->workspace >= 0 &&
        (st = fill_workspace(ctx, f, fam, plan, vars, a->stream, &v[d->workspace])) != LAJIT_OK)
        return st;
    lj_packed_args packed;
    lj_args_pack(d, v, &packed);
    if ((st = lj_device_make_current(env, &ctx->device)) != LAJIT_OK)
        return st;
    return lj_plan_launch(ctx, plan, grid, a->stream, packed.params);
}
