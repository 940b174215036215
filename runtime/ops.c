/* ops.c — the op entry points: validate the arguments, describe the problem, find (or build,
 * once per bucket) the launch plan, fill la_params and launch.
 *
 * The hot path — a call whose bucket already has a plan — does tensor checks, a plan-table
 * probe and one cuLaunchKernel: no allocation, no Lua, no lock, no synchronisation, so it can
 * be captured in a CUDA graph. Everything else happens in build_plan, once per bucket. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "context.h"
#include "kernel.h"
#include "problem.h"
#include "search.h"
#include "tensor.h"

/* ---- Plans --------------------------------------------------------------------------------- */

static int family_index(const lajit_ctx *ctx, const char *name)
{
    for (int i = 0; i < ctx->n_families; i++)
        if (strcmp(lj_family_name(ctx->families[i]), name) == 0)
            return i;
    return -1;
}

/* The families an op tries, in order, when the caller names none: the fast family first, then
 * the ones that cover what it does not (la_fwd_sm90: sm_90a, 16-bit, D a multiple of 64; la_fwd:
 * every arch and dtype; la_recurrent: what no chunked config fits; la_bwd_sm90: the backward's
 * scans there, la_bwd the rest and the decay gradient). */
static const char *const fwd_defaults[] = {"la_fwd_sm90", "la_fwd", "la_recurrent", NULL};
static const char *const bwd_defaults[] = {"la_bwd_sm90", "la_bwd", NULL};
static const char *const decode_defaults[] = {"la_decode", NULL};

static const char *const *default_families(lj_op op)
{
    switch (op) {
    case LJ_OP_FWD: return fwd_defaults;
    case LJ_OP_BWD: return bwd_defaults;
    case LJ_OP_DECODE: return decode_defaults;
    }
    return decode_defaults;
}

/* Plans built for "no family named" are keyed by this index, whichever family served them. */
#define DEFAULT_FAMILY_INDEX 255

/* ---- Autotune policy (the slow path only) ------------------------------------------------- */

/* How long a tuning lease lasts: longer than any one bucket's search. */
#define TUNE_LEASE_S 1800

/* The tuning database of the context, opened on first need; NULL when there is none (memory
 * cache only, or unusable: said once in the log, then defaults for the context's life). */
static lj_tunedb *context_tunedb(lajit_ctx *ctx)
{
    if (ctx->tunedb || ctx->tunedb_failed)
        return ctx->tunedb;
    if (!ctx->cache_dir || lj_tunedb_open(&ctx->env, ctx->cache_dir, &ctx->tunedb) != LAJIT_OK) {
        ctx->tunedb_failed = 1;
        if (ctx->cache_dir)
            lj_log(&ctx->env, LAJIT_LOG_WARN, "no tuning database, using defaults: %s",
                   ctx->env.errmsg);
        lj_clear_error(&ctx->env);
    }
    return ctx->tunedb;
}

/* Replaces *cfg (f's default for p, valid) by the tuned configuration when the policy finds or
 * makes one. Tuning never fails an op: any problem is logged and the default stays. A winner
 * from the database is used only when it still parses and is valid for this problem. */
static void apply_tuning(lajit_ctx *ctx, lj_family *f, lj_lua *L, lj_cache *cache, lj_device *dev,
                         const lj_problem *p, lj_config *cfg)
{
    lj_env *env = &ctx->env;
    lj_tunedb *db = context_tunedb(ctx);
    if (!db)
        return;
    lj_tune_id id;
    char text[256];
    int found = 0, ok = 0;
    lj_config tuned;
    char reason[256];
    if (lj_tune_id_make(env, f, dev, p, &id) != LAJIT_OK ||
        lj_tunedb_winner(db, &id, text, sizeof text, NULL, &found) != LAJIT_OK)
        goto failed;
    if (found) {
        if (lj_config_parse(env, f, cfg, text, &tuned) != LAJIT_OK ||
            lj_family_valid(f, &tuned, p, &dev->info, &ok, reason, sizeof reason) != LAJIT_OK) {
            lj_log(env, LAJIT_LOG_WARN, "tuned [%s] for %s is unusable (%s): default", text,
                   id.bucket, env->errmsg);
            lj_clear_error(env);
        } else if (!ok) {
            lj_log(env, LAJIT_LOG_WARN, "tuned [%s] for %s is not valid here (%s): default",
                   text, id.bucket, reason);
        } else {
            *cfg = tuned;
            return;
        }
    }
    if (ctx->autotune != LAJIT_AUTOTUNE_EAGER || found)
        return;
    int got = 0;
    if (lj_tunedb_lease(db, &id, TUNE_LEASE_S, &got) != LAJIT_OK)
        goto failed;
    if (!got) {
        lj_log(env, LAJIT_LOG_INFO, "%s %s is being tuned by another process: default for now",
               id.family, id.bucket);
        return;
    }
    lj_log(env, LAJIT_LOG_INFO, "tuning %s %s", id.family, id.bucket);
    lj_search_out res;
    lajit_status st = lj_search_run(env, L, f, cache, dev, p, NULL, &res);
    if (st == LAJIT_OK) {
        char dtext[256];
        lj_config_format(&res.dflt, dtext, sizeof dtext);
        st = lj_tunedb_record(db, &id, res.results, res.n_results, dtext, res.default_ms);
        if (res.have_best)
            *cfg = res.best;
        lj_search_out_free(env, &res);
    }
    lj_tunedb_release(db, &id);
    if (st == LAJIT_OK)
        return;
failed:
    lj_log(env, LAJIT_LOG_WARN, "autotune: %s; using the default", env->errmsg);
    lj_clear_error(env);
}

/* ---- Bundles: kernels from an offline set before any compile ------------------------------- */

/* The bundle's configuration for this bucket on this arch, when it has one. */
static void bundle_config(lajit_ctx *ctx, lj_family *f, const lj_device *dev, const lj_problem *p,
                          lj_config *cfg, int *from_bundle)
{
    lj_env *env = &ctx->env;
    char bucket[256], text[256];
    int found = 0;
    lj_config parsed;
    if (lj_family_key(f, p, bucket, sizeof bucket) == LAJIT_OK &&
        lj_bundle_config(ctx->bundle, lj_family_name(f), bucket, dev->info.arch, text, sizeof text,
                         &found) == LAJIT_OK &&
        found && lj_config_parse(env, f, cfg, text, &parsed) == LAJIT_OK) {
        *cfg = parsed;
        *from_bundle = 1;
    }
    lj_clear_error(env);
}

/* The image of (f, cfg, p) from the bundle: the cubin for this exact arch, else (NVRTC missing)
 * the PTX of an older plain arch for the driver to compile. *image stays NULL when the caller
 * should compile (NVRTC present); with neither a kernel nor NVRTC, an error saying so. */
static lajit_status bundle_image(lajit_ctx *ctx, lj_family *f, lj_lua *L, const lj_device *dev,
                                 const lj_problem *p, const lj_config *cfg, const void **image,
                                 const char **source)
{
    lj_env *env = &ctx->env;
    lj_kernel_job job;
    lajit_status st = lj_kernel_prepare_ex(L, f, cfg, p, &dev->info, 0, 0, &job);
    if (st != LAJIT_OK)
        return st;
    int no_nvrtc = job.nvrtc_major < 0, found = 0;
    size_t size;
    char cfgtext[256], bucket[256], arch[16];
    lj_config_format(cfg, cfgtext, sizeof cfgtext);
    st = lj_bundle_find(ctx->bundle, job.source_key, dev->info.arch, 0, image, &size, &found);
    lj_kernel_job_free(L, &job);
    if (st != LAJIT_OK || found) {
        *source = "bundle";
        return st;
    }
    *image = NULL;
    if (!no_nvrtc) {
        lj_log(env, LAJIT_LOG_INFO, "bundle %s has no %s kernel of %s [%s]: compiling with NVRTC",
               lj_bundle_path(ctx->bundle), dev->info.arch, lj_family_name(f), cfgtext);
        return LAJIT_OK;
    }
    if ((st = lj_family_key(f, p, bucket, sizeof bucket)) != LAJIT_OK)
        return st;
    st = lj_bundle_find_ptx(ctx->bundle, lj_family_name(f), bucket, cfgtext, dev->info.cc, image,
                            &size, arch, &found);
    if (st != LAJIT_OK)
        return st;
    if (found) {
        lj_log(env, LAJIT_LOG_WARN,
               "bundle %s has no %s kernel of %s [%s] and NVRTC is not available: loading its %s PTX "
               "(the driver compiles it)",
               lj_bundle_path(ctx->bundle), dev->info.arch, lj_family_name(f), cfgtext, arch);
        *source = "bundle PTX";
        return LAJIT_OK;
    }
    int major, minor;
    st = lj_nvrtc_version(env, &major, &minor);
    lj_error_prefix(env, "bundle %s has no %s kernel of %s [%s] for %s, and no PTX to fall back on",
                    lj_bundle_path(ctx->bundle), dev->info.arch, lj_family_name(f), cfgtext, bucket);
    return st != LAJIT_OK ? st : LAJIT_ERR_INTERNAL;
}

static lajit_status build_plan(lajit_ctx *ctx, const char *requested, const lj_problem *p,
                               const lj_plan **out)
{
    lj_env *env = &ctx->env;
    lj_device *dev;
    lajit_status st = lajit__ctx_device(ctx, &dev);
    if (st != LAJIT_OK)
        return st;
    lj_lua *L;
    lj_cache *cache;
    if ((st = lajit__ctx_lua(ctx, &L)) != LAJIT_OK || (st = lajit__ctx_cache(ctx, &cache)) != LAJIT_OK)
        return st;

    /* The named family, or the op's defaults in order: the first whose default configuration
     * is valid for this problem on this device. */
    const char *single[2] = {requested, NULL};
    const char *const *names = requested ? single : default_families(p->op);
    lj_family *f = NULL;
    const char *name = NULL;
    lj_plan plan;
    memset(&plan, 0, sizeof plan);
    char reasons[768] = "";
    for (int i = 0; names[i] && !f; i++) {
        lj_family *cand;
        if ((st = lajit__ctx_family(ctx, names[i], &cand)) != LAJIT_OK) {
            if (st == LAJIT_ERR_NOT_FOUND && !requested)
                continue; /* a default family this build does not have */
            return st;
        }
        if (lj_family_op(cand) != p->op)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "family %s does not implement %s",
                            names[i], lj_op_name(p->op));
        if (!requested && !lj_family_serves(cand, dev->info.arch))
            continue; /* an arch-specific default family (la_fwd_sm90) on another arch */
        if ((st = lj_family_default(cand, p, &dev->info, &plan.config)) != LAJIT_OK)
            return st;
        int ok;
        char reason[256];
        if ((st = lj_family_valid(cand, &plan.config, p, &dev->info, &ok, reason, sizeof reason)) != LAJIT_OK)
            return st;
        if (ok) {
            f = cand;
            name = names[i];
        } else {
            size_t used = strlen(reasons);
            snprintf(reasons + used, sizeof reasons - used, "%s%s: %s", used ? "; " : "", names[i], reason);
        }
    }
    if (!f) {
        char what[256];
        lj_problem_format(p, what, sizeof what);
        return lj_error(env, LAJIT_ERR_UNSUPPORTED, "no family supports %s on %s (%s)", what,
                        dev->info.arch, reasons);
    }
    int from_bundle = 0;
    if (ctx->bundle)
        bundle_config(ctx, f, dev, p, &plan.config, &from_bundle);
    if (!from_bundle)
        apply_tuning(ctx, f, L, cache, dev, p, &plan.config);
    plan.key = lj_plan_key_make(p, requested ? family_index(ctx, requested) : DEFAULT_FAMILY_INDEX);
    st = lj_family_launch(f, &plan.config, p, &dev->info, &plan.launch);
    if (st != LAJIT_OK)
        return st;
    lj_kernel k;
    memset(&k, 0, sizeof k);
    const char *source = NULL;
    if (ctx->bundle && (st = bundle_image(ctx, f, L, dev, p, &plan.config, &k.entry.image, &source)) != LAJIT_OK)
        return st;
    if (!k.entry.image && (st = lj_kernel_build(L, f, cache, &plan.config, p, &dev->info, 0, &k)) != LAJIT_OK)
        return st;
    if ((st = lj_device_make_current(env, dev)) != LAJIT_OK)
        return st;
    st = lj_module_load(env, dev, k.entry.image, plan.launch.entry, plan.launch.smem,
                        &plan.module, &plan.fn);
    if (st != LAJIT_OK)
        return st;
    st = lj_plan_add(env, &ctx->plans, &plan);
    if (st != LAJIT_OK) {
        LJ_CU(env, dev->drv, cuModuleUnload, plan.module);
        return st;
    }
    char cfgtext[256], what[256];
    lj_config_format(&plan.config, cfgtext, sizeof cfgtext);
    lj_problem_format(p, what, sizeof what);
    lj_log(env, LAJIT_LOG_INFO, "plan %s [%s] for %s on %s (%s)", name, cfgtext, what,
           dev->info.arch, source ? source : k.compiled ? "compiled" : k.entry.from_disk ? "disk cache" : "memory");
    *out = lj_plan_find(&ctx->plans, &plan.key);
    return LAJIT_OK;
}

/* Finds or builds the plan of p and launches it with lp on stream. */
static lajit_status launch(lajit_ctx *ctx, const char *family, const lj_problem *p,
                           const la_params *lp, void *stream)
{
    lj_env *env = &ctx->env;
    int index = family ? family_index(ctx, family) : DEFAULT_FAMILY_INDEX;
    const lj_plan *plan = NULL;
    if (index >= 0) {
        lj_plan_key key = lj_plan_key_make(p, index);
        plan = lj_plan_find(&ctx->plans, &key);
    }
    lajit_status st;
    if (!plan && (st = build_plan(ctx, family, p, &plan)) != LAJIT_OK)
        return st;
    const char *name = family ? family : "the default family";
    unsigned grid[3];
    if (!lj_plan_grid(&plan->launch, lp->B, lp->H, lp->N, lp->nseq, lp->T, grid))
        return lj_error(env, LAJIT_ERR_UNSUPPORTED,
                        "%s: the grid for B=%d H=%d exceeds the driver's limits", name, lp->B,
                        lp->H);
    if ((st = lj_device_make_current(env, &ctx->device)) != LAJIT_OK)
        return st;
    void *kernel_args[] = {(void *)lp};
    CUresult r = LJ_CU(env, ctx->device.drv, cuLaunchKernel, plan->fn, grid[0], grid[1], grid[2],
                       plan->launch.block[0], plan->launch.block[1], plan->launch.block[2],
                       plan->launch.smem, (CUstream)stream, kernel_args, NULL);
    if (r != CUDA_SUCCESS)
        return lj_driver_error(env, ctx->device.drv, r, "cuLaunchKernel");
    return LAJIT_OK;
}

/* ---- Checked mode: device-side values read back and validated ------------------------------ */

static lajit_status read_back(lajit_ctx *ctx, unsigned long long ptr, size_t bytes, void *host,
                              void *stream)
{
    lj_env *env = &ctx->env;
    const lj_driver *drv = ctx->device.drv;
    CUresult r = LJ_CU(env, drv, cuMemcpyDtoHAsync, host, (CUdeviceptr)ptr, bytes, (CUstream)stream);
    if (r == CUDA_SUCCESS)
        r = LJ_CU(env, drv, cuStreamSynchronize, (CUstream)stream);
    return r == CUDA_SUCCESS ? LAJIT_OK : lj_driver_error(env, drv, r, "checked mode read-back");
}

/* Checks s (finite, >= 0), cu_seqlens (0, non-decreasing, ending at T) and slots (-1 or in
 * [0, P), no slot twice). */
static lajit_status check_device_values(lajit_ctx *ctx, const la_params *lp, int n_slots,
                                        long long total_tokens, void *stream)
{
    lj_env *env = &ctx->env;
    lj_device *dev;
    lajit_status st = lajit__ctx_device(ctx, &dev);
    if (st != LAJIT_OK)
        return st;
    if ((st = lj_device_make_current(env, dev)) != LAJIT_OK)
        return st;
    size_t n = (size_t)lp->H;
    if ((size_t)lp->nseq + 1 > n)
        n = (size_t)lp->nseq + 1;
    if ((size_t)n_slots > n)
        n = (size_t)n_slots;
    int *buf = lj_malloc(env, n * sizeof(int) + (size_t)(lp->P > 0 ? lp->P : 1));
    if (!buf)
        return lj_oom(env);
    unsigned char *seen = (unsigned char *)(buf + n);
    if (lp->decay && (st = read_back(ctx, lp->decay, (size_t)lp->H * 4, buf, stream)) == LAJIT_OK) {
        for (int h = 0; h < lp->H && st == LAJIT_OK; h++) {
            float s;
            memcpy(&s, &buf[h], 4);
            if (!isfinite(s) || s < 0)
                st = lj_error(env, LAJIT_ERR_CHECK_FAILED, "s[%d] = %g: must be finite and >= 0",
                              h, (double)s);
        }
    }
    if (st == LAJIT_OK && lp->cu_seqlens &&
        (st = read_back(ctx, lp->cu_seqlens, ((size_t)lp->nseq + 1) * 4, buf, stream)) == LAJIT_OK) {
        if (buf[0] != 0)
            st = lj_error(env, LAJIT_ERR_CHECK_FAILED, "cu_seqlens[0] = %d, must be 0", buf[0]);
        for (int i = 0; st == LAJIT_OK && i < lp->nseq; i++)
            if (buf[i + 1] < buf[i])
                st = lj_error(env, LAJIT_ERR_CHECK_FAILED, "cu_seqlens decreases at %d", i + 1);
        if (st == LAJIT_OK && buf[lp->nseq] != total_tokens)
            st = lj_error(env, LAJIT_ERR_CHECK_FAILED, "cu_seqlens ends at %d, not at T = %lld",
                          buf[lp->nseq], total_tokens);
    }
    if (st == LAJIT_OK && lp->slots &&
        (st = read_back(ctx, lp->slots, (size_t)n_slots * 4, buf, stream)) == LAJIT_OK) {
        memset(seen, 0, (size_t)(lp->P > 0 ? lp->P : 1));
        for (int i = 0; st == LAJIT_OK && i < n_slots; i++) {
            if (buf[i] == -1)
                continue;
            if (buf[i] < 0 || buf[i] >= lp->P)
                st = lj_error(env, LAJIT_ERR_CHECK_FAILED, "slot %d of row %d is outside [0, %d)",
                              buf[i], i, lp->P);
            else if (seen[buf[i]]++)
                st = lj_error(env, LAJIT_ERR_CHECK_FAILED, "slot %d is used by two rows", buf[i]);
        }
    }
    lj_free(env, buf);
    return st;
}

/* ---- Shared argument checks ---------------------------------------------------------------- */

/* What every op checks first: arguments given, a struct_size this build knows, known flags, and
 * a finite nonzero scale. struct_size is NULL when the arguments are. */
static lajit_status check_args(lj_env *env, const char *fn, const size_t *struct_size,
                               size_t expected, uint32_t flags, float scale)
{
    if (!struct_size)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: args is NULL", fn);
    if (*struct_size != expected)
        return lj_error(env, LAJIT_ERR_STRUCT_SIZE, "%s: struct_size %zu, this build knows %zu", fn,
                        *struct_size, expected);
    if (flags & ~LAJIT_STATE_VK)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: unknown flags 0x%x", fn, flags);
    if (!isfinite(scale) || scale == 0.0f)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: scale = %g: must be finite and nonzero (1 for the lightning convention)",
                        fn, (double)scale);
    return LAJIT_OK;
}

static lajit_status check_head_dims(lj_env *env, long long D, long long E)
{
    if (D % 16 || E % 16 || D > 256 || E > 256)
        return lj_error(env, LAJIT_ERR_UNSUPPORTED,
                        "D = %lld, E = %lld: head dimensions must be multiples of 16 up to 256", D,
                        E);
    return LAJIT_OK;
}

#define FLOAT_TYPES LJ_TENSOR_FLOATS
#define F32_ONLY LJ_TENSOR_F32

/* Every tensor of a call on the context's device; outputs with distinct elements and not
 * overlapping any input, except `same` pairs (an in-place state) which may be the same view. */
typedef struct io_tensor {
    const char *name;
    const DLTensor *t;
    int output;
} io_tensor;

/* The bytes a tensor spans: [lo, hi). Views have non-negative strides (lj_tensor_view). */
static void byte_range(const DLTensor *t, uint64_t *lo, uint64_t *hi)
{
    uint64_t el = (uint64_t)(t->dtype.bits * t->dtype.lanes + 7) / 8;
    int64_t last = 0, stride = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t s = t->strides ? t->strides[d] : stride;
        last += (t->shape[d] - 1) * s;
        stride *= t->shape[d];
    }
    *lo = (uint64_t)(uintptr_t)t->data + t->byte_offset;
    *hi = *lo + ((uint64_t)last + 1) * el;
}

static lajit_status check_io(lajit_ctx *ctx, const io_tensor *io, int n, const char *same_a,
                             const char *same_b)
{
    lj_env *env = &ctx->env;
    lajit_status st;
    uint64_t lo[16], hi[16];
    for (int i = 0; i < n; i++) {
        if (!io[i].t)
            continue;
        if ((st = lj_tensor_check_device(env, io[i].name, io[i].t, ctx->ordinal)) != LAJIT_OK)
            return st;
        byte_range(io[i].t, &lo[i], &hi[i]);
    }
    for (int i = 0; i < n; i++) {
        if (!io[i].t || !io[i].output)
            continue;
        if ((st = lj_tensor_check_writable(env, io[i].name, io[i].t)) != LAJIT_OK)
            return st;
        for (int j = 0; j < n; j++) {
            if (j == i || !io[j].t || (io[j].output && j < i))
                continue;
            /* Cheap test first; the precise check (and its message) only for intersecting
             * ranges, which well-formed calls never have except an in-place state. */
            if (hi[i] <= lo[j] || hi[j] <= lo[i])
                continue;
            int pair = same_a && ((strcmp(io[i].name, same_a) == 0 && strcmp(io[j].name, same_b) == 0) ||
                                  (strcmp(io[i].name, same_b) == 0 && strcmp(io[j].name, same_a) == 0));
            st = lj_tensor_check_disjoint(env, io[i].name, io[i].t, io[j].name, io[j].t, pair);
            if (st != LAJIT_OK)
                return st;
        }
    }
    return LAJIT_OK;
}

/* The decay rates: float32 [H], or absent. */
static lajit_status view_decay(lj_env *env, const DLTensor *s, long long H, unsigned long long *ptr)
{
    *ptr = 0;
    if (!s)
        return LAJIT_OK;
    int64_t shape[1] = {H};
    la_tensor4 t;
    lajit_status st = lj_tensor_view(env, "s", s, 1, shape, F32_ONLY, &t, NULL);
    if (st == LAJIT_OK)
        *ptr = t.ptr;
    return st;
}

/* A state or pool: float32 [P, H, D, E] (KV) or [P, H, E, D] (VK), expressed to kernels as
 * logical (slot, h, d, e) strides. P < 0: any (returned in *P). */
static lajit_status view_state(lj_env *env, const char *name, const DLTensor *t, long long *P,
                               long long H, long long D, long long E, int vk, la_tensor4 *out)
{
    int64_t shape[4] = {*P, H, vk ? E : D, vk ? D : E};
    la_tensor4 v;
    lajit_status st = lj_tensor_view(env, name, t, 4, shape, F32_ONLY, &v, NULL);
    if (st != LAJIT_OK)
        return st;
    *P = shape[0];
    *out = v;
    if (vk) { /* logical (d, e) = memory (e, d): swap the last two strides */
        out->s2 = v.s3;
        out->s3 = v.s2;
    }
    return LAJIT_OK;
}

static int same_view(const la_tensor4 *a, const la_tensor4 *b)
{
    return a->ptr == b->ptr && a->s0 == b->s0 && a->s1 == b->s1 && a->s2 == b->s2 && a->s3 == b->s3;
}

/* One sequence tensor of an op: q-like (width D) or v-like (width E). */
typedef struct seq_tensor {
    const char *name;
    const DLTensor *t;
    int v_like;
    la_tensor4 *out;
} seq_tensor;

typedef struct seq_shape {
    lj_dtype dtype;
    long long B, H, N, D, E; /* varlen: B = sequences, N = total tokens */
} seq_shape;

/* The sequence tensors of fwd and bwd: [B,H,N,D|E] (any strided view with a unit last stride)
 * or, with cu_seqlens, packed [T,H,D|E]. The first tensor fixes the shape and the dtype; the
 * first v-like one fixes E. Kernels index (b, h, t, d), so packed views get their token stride
 * in s2 and their head stride in s1. */
static lajit_status view_sequences(lj_env *env, const DLTensor *cu_seqlens, const seq_tensor *t,
                                   int n, seq_shape *sh, unsigned long long *cu_ptr)
{
    const int varlen = cu_seqlens != NULL, nd = varlen ? 3 : 4;
    int64_t qs[4] = {-1, -1, -1, -1}, vs[4] = {-1, -1, -1, -1};
    int have_v = 0;
    lj_dtype dt = LJ_BF16, dt2;
    lajit_status st;
    for (int i = 0; i < n; i++) {
        unsigned mask = i == 0 ? FLOAT_TYPES : 1u << dt;
        if (t[i].v_like && !have_v) {
            for (int d = 0; d < nd - 1; d++)
                vs[d] = qs[d];
            have_v = 1;
        }
        if ((st = lj_tensor_view(env, t[i].name, t[i].t, nd, t[i].v_like ? vs : qs, mask, t[i].out,
                                 i == 0 ? &dt : &dt2)) != LAJIT_OK)
            return st;
        if (varlen) {
            la_tensor4 *v = t[i].out;
            long long token = v->s1, head = v->s2;
            v->s0 = 0;
            v->s1 = head;
            v->s2 = token;
        }
    }
    sh->dtype = dt;
    sh->D = qs[nd - 1];
    sh->E = vs[nd - 1];
    *cu_ptr = 0;
    if (varlen) {
        sh->H = qs[1];
        sh->N = qs[0];
        int64_t cs[1] = {-1};
        la_tensor4 cu;
        if ((st = lj_tensor_view(env, "cu_seqlens", cu_seqlens, 1, cs, LJ_TENSOR_INT32, &cu, NULL)) != LAJIT_OK)
            return st;
        if (cs[0] < 2)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "cu_seqlens needs at least 2 entries");
        sh->B = cs[0] - 1;
        *cu_ptr = cu.ptr;
    } else {
        sh->B = qs[0];
        sh->H = qs[1];
        sh->N = qs[2];
    }
    return LAJIT_OK;
}

/* ---- Forward -------------------------------------------------------------------------------- */

LAJIT_API lajit_status lajit_attn_fwd(lajit_ctx *ctx, const lajit_attn_fwd_args *a)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lj_env *env = &ctx->env;
    lajit_status st = check_args(env, "lajit_attn_fwd", a ? &a->struct_size : NULL, sizeof *a,
                                 a ? a->flags : 0, a ? a->scale : 0);
    if (st != LAJIT_OK)
        return st;
    if (!a->q || !a->k || !a->v || !a->o)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "lajit_attn_fwd: q, k, v and o are required");

    la_params lp;
    memset(&lp, 0, sizeof lp);
    lj_problem p;
    memset(&p, 0, sizeof p);
    p.op = LJ_OP_FWD;
    p.varlen = a->cu_seqlens != NULL;
    p.vk = (a->flags & LAJIT_STATE_VK) != 0;
    const seq_tensor seqs[] = {{"q", a->q, 0, &lp.q}, {"k", a->k, 0, &lp.k},
                               {"v", a->v, 1, &lp.v}, {"o", a->o, 1, &lp.o}};
    seq_shape sh = {0}; /* filled by check_seq_tensors; zeroed for -O3 flow analysis */
    if ((st = view_sequences(env, a->cu_seqlens, seqs, 4, &sh, &lp.cu_seqlens)) != LAJIT_OK)
        return st;
    p.dtype = sh.dtype;
    long long B = sh.B, H = sh.H, N = sh.N, D = sh.D, E = sh.E;
    if ((st = check_head_dims(env, D, E)) != LAJIT_OK)
        return st;
    if ((st = view_decay(env, a->s, H, &lp.decay)) != LAJIT_OK)
        return st;
    p.decay = a->s != NULL;

    long long P = p.varlen ? -1 : B;
    if (a->initial_state) {
        if ((st = view_state(env, "initial_state", a->initial_state, &P, H, D, E, p.vk, &lp.s0)) != LAJIT_OK)
            return st;
        p.has_initial = 1;
    }
    if (a->final_state) {
        long long P2 = p.varlen ? (a->initial_state ? P : -1) : B;
        if ((st = view_state(env, "final_state", a->final_state, &P2, H, D, E, p.vk, &lp.sn)) != LAJIT_OK)
            return st;
        P = P2;
        p.has_final = 1;
        if (p.has_initial && lp.s0.ptr == lp.sn.ptr && !same_view(&lp.s0, &lp.sn))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "final_state aliases initial_state with different strides");
    }
    if (p.varlen && (p.has_initial || p.has_final)) {
        if (!a->state_slots)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "varlen with states needs state_slots (int32 [nseq])");
        int64_t ss[1] = {B};
        la_tensor4 sl;
        if ((st = lj_tensor_view(env, "state_slots", a->state_slots, 1, ss, LJ_TENSOR_INT32, &sl, NULL)) != LAJIT_OK)
            return st;
        lp.slots = sl.ptr;
    } else if (a->state_slots) {
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "state_slots is only used with cu_seqlens and a state");
    }

    const io_tensor io[] = {
        {"q", a->q, 0}, {"k", a->k, 0}, {"v", a->v, 0}, {"s", a->s, 0},
        {"initial_state", a->initial_state, 0}, {"cu_seqlens", a->cu_seqlens, 0},
        {"state_slots", a->state_slots, 0}, {"o", a->o, 1}, {"final_state", a->final_state, 1},
    };
    if ((st = check_io(ctx, io, (int)(sizeof io / sizeof io[0]), "final_state", "initial_state")) != LAJIT_OK)
        return st;
    p.B = (int)B;
    p.H = (int)H;
    p.N = (int)N;
    p.D = (int)D;
    p.E = (int)E;
    p.T = 1;
    lp.B = (int)B;
    lp.H = (int)H;
    lp.N = (int)N;
    lp.D = (int)D;
    lp.E = (int)E;
    lp.T = 1;
    lp.nseq = (int)B;
    lp.P = (int)(P > 0 ? P : 0);
    lp.scale = a->scale;
    if (ctx->flags & LAJIT_CTX_CHECKED) {
        st = check_device_values(ctx, &lp, lp.slots ? (int)B : 0, N, a->stream);
        if (st != LAJIT_OK)
            return st;
    }
    return launch(ctx, a->family, &p, &lp, a->stream);
}

/* ---- Backward ------------------------------------------------------------------------------- */

LAJIT_API size_t lajit_attn_bwd_workspace_size(int64_t nseq, int64_t H, int64_t E)
{
    if (nseq <= 0 || H <= 0 || E <= 0)
        return 0;
    /* A ticket counter, then one fp32 partial per (sequence, head, slice of >= 16 columns). */
    return 16 + (((size_t)nseq * (size_t)H * (size_t)((E + 15) / 16) * 4 + 15) & ~(size_t)15);
}

/* The ds workspace: the caller's (float32 or int32 [n], 4n >= bytes) or the context's own,
 * grown when too small. */
static lajit_status bwd_workspace(lajit_ctx *ctx, const DLTensor *given, size_t bytes,
                                  unsigned long long *ptr)
{
    lj_env *env = &ctx->env;
    lajit_status st;
    if (given) {
        int64_t shape[1] = {-1};
        la_tensor4 w;
        if ((st = lj_tensor_view(env, "workspace", given, 1, shape, LJ_TENSOR_F32 | LJ_TENSOR_INT32, &w, NULL)) != LAJIT_OK)
            return st;
        if ((size_t)shape[0] * 4 < bytes)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "workspace has %lld bytes, ds needs %zu (lajit_attn_bwd_workspace_size)",
                            (long long)shape[0] * 4, bytes);
        if (w.s3 != 1 && shape[0] > 1)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "workspace must be contiguous");
        *ptr = w.ptr;
        return LAJIT_OK;
    }
    if (ctx->scratch_bytes < bytes) {
        lj_device *dev;
        if ((st = lajit__ctx_device(ctx, &dev)) != LAJIT_OK || (st = lj_device_make_current(env, dev)) != LAJIT_OK)
            return st;
        if (ctx->scratch) {
            LJ_CU(env, dev->drv, cuMemFree, ctx->scratch);
            ctx->scratch = 0;
            ctx->scratch_bytes = 0;
        }
        CUdeviceptr d;
        CUresult r = LJ_CU(env, dev->drv, cuMemAlloc, &d, bytes);
        if (r != CUDA_SUCCESS)
            return lj_driver_error(env, dev->drv, r, "cuMemAlloc of the backward's ds workspace");
        ctx->scratch = d;
        ctx->scratch_bytes = bytes;
    }
    *ptr = (unsigned long long)ctx->scratch;
    return LAJIT_OK;
}

/* A state given as KV [.., D, E] seen by a scan whose rows are E wide: swap (d, e). */
static la_tensor4 transposed(la_tensor4 t)
{
    long long s2 = t.s2;
    t.s2 = t.s3;
    t.s3 = s2;
    return t;
}

LAJIT_API lajit_status lajit_attn_bwd(lajit_ctx *ctx, const lajit_attn_bwd_args *a)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lj_env *env = &ctx->env;
    lajit_status st = check_args(env, "lajit_attn_bwd", a ? &a->struct_size : NULL, sizeof *a,
                                 a ? a->flags : 0, a ? a->scale : 0);
    if (st != LAJIT_OK)
        return st;
    if (!a->q || !a->k || !a->v || !a->dout || !a->dq || !a->dk || !a->dv)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "lajit_attn_bwd: q, k, v, dout, dq, dk and dv are required");
    if (a->ds && !a->s)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "lajit_attn_bwd: ds (the gradient of s) needs s");

    la_params lp;
    memset(&lp, 0, sizeof lp);
    lj_problem p;
    memset(&p, 0, sizeof p);
    p.op = LJ_OP_BWD;
    p.varlen = a->cu_seqlens != NULL;
    p.vk = (a->flags & LAJIT_STATE_VK) != 0;
    const seq_tensor seqs[] = {{"q", a->q, 0, &lp.q},     {"k", a->k, 0, &lp.k},
                               {"v", a->v, 1, &lp.v},     {"dout", a->dout, 1, &lp.dout},
                               {"dq", a->dq, 0, &lp.dq},  {"dk", a->dk, 0, &lp.dk},
                               {"dv", a->dv, 1, &lp.dv}};
    seq_shape sh = {0};
    if ((st = view_sequences(env, a->cu_seqlens, seqs, 7, &sh, &lp.cu_seqlens)) != LAJIT_OK)
        return st;
    p.dtype = sh.dtype;
    long long B = sh.B, H = sh.H, N = sh.N, D = sh.D, E = sh.E;
    if ((st = check_head_dims(env, D, E)) != LAJIT_OK)
        return st;
    if ((st = view_decay(env, a->s, H, &lp.decay)) != LAJIT_OK)
        return st;
    p.decay = a->s != NULL;
    if (a->ds) {
        int64_t shape[1] = {H};
        la_tensor4 t;
        if ((st = lj_tensor_view(env, "ds", a->ds, 1, shape, F32_ONLY, &t, NULL)) != LAJIT_OK)
            return st;
        lp.dsdecay = t.ptr;
        p.want_ds = 1;
    }

    /* States and their gradients: [B,H,D,E] each, or pools of one size P with varlen. */
    long long P = p.varlen ? -1 : B;
    struct {
        const char *name;
        const DLTensor *t;
        la_tensor4 *out;
        int *flag;
    } states[] = {{"initial_state", a->initial_state, &lp.s0, &p.has_initial},
                  {"d_final_state", a->d_final_state, &lp.dsn, &p.has_dsn},
                  {"d_initial_state", a->d_initial_state, &lp.ds0, &p.has_final}};
    for (int i = 0; i < 3; i++) {
        if (!states[i].t)
            continue;
        if ((st = view_state(env, states[i].name, states[i].t, &P, H, D, E, p.vk, states[i].out)) != LAJIT_OK)
            return st;
        *states[i].flag = 1;
    }
    if (p.varlen && (p.has_initial || p.has_dsn || p.has_final)) {
        if (!a->state_slots)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "varlen with states needs state_slots (int32 [nseq])");
        int64_t ss[1] = {B};
        la_tensor4 sl;
        if ((st = lj_tensor_view(env, "state_slots", a->state_slots, 1, ss, LJ_TENSOR_INT32, &sl, NULL)) != LAJIT_OK)
            return st;
        lp.slots = sl.ptr;
    } else if (a->state_slots) {
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "state_slots is only used with cu_seqlens and a state");
    }

    const io_tensor io[] = {
        {"q", a->q, 0}, {"k", a->k, 0}, {"v", a->v, 0}, {"dout", a->dout, 0}, {"s", a->s, 0},
        {"initial_state", a->initial_state, 0}, {"d_final_state", a->d_final_state, 0},
        {"cu_seqlens", a->cu_seqlens, 0}, {"state_slots", a->state_slots, 0},
        {"dq", a->dq, 1}, {"dk", a->dk, 1}, {"dv", a->dv, 1}, {"ds", a->ds, 1},
        {"d_initial_state", a->d_initial_state, 1}, {"workspace", a->ds ? a->workspace : NULL, 1},
    };
    if ((st = check_io(ctx, io, (int)(sizeof io / sizeof io[0]), NULL, NULL)) != LAJIT_OK)
        return st;
    if (a->ds && (st = bwd_workspace(ctx, a->workspace, lajit_attn_bwd_workspace_size(B, H, E), &lp.workspace)) != LAJIT_OK)
        return st;

    p.B = (int)B;
    p.H = (int)H;
    p.N = (int)N;
    p.D = (int)D;
    p.E = (int)E;
    p.T = 1;
    lp.B = (int)B;
    lp.H = (int)H;
    lp.N = (int)N;
    lp.D = (int)D;
    lp.E = (int)E;
    lp.T = 1;
    lp.nseq = (int)B;
    lp.P = (int)(P > 0 ? P : 0);
    lp.scale = a->scale;
    if (ctx->flags & LAJIT_CTX_CHECKED) {
        st = check_device_values(ctx, &lp, lp.slots ? (int)B : 0, N, a->stream);
        if (st != LAJIT_OK)
            return st;
    }

    /* The parts (templates/la_bwd/family.lua): dq, dv (+ dS_0), dk are the forward's scan over
     * permuted inputs; ds its own kernel. Each part's problem keeps only the flags its kernel
     * uses, so identical kernels share one plan and one tuning bucket. */
    for (int part = 0; part < 4; part++) {
        lj_problem pp = p;
        pp.part = part;
        la_params sp = lp;
        memset(&sp.dout, 0, 4 * sizeof sp.dout);
        sp.s0 = sp.sn = sp.ds0 = sp.dsn = (la_tensor4){0};
        sp.dsdecay = sp.workspace = 0;
        switch (part) {
        case 0: /* dq: scan (dO, v, k) from S_0ᵀ */
            pp.has_final = pp.has_dsn = pp.want_ds = 0;
            sp.q = lp.dout, sp.k = lp.v, sp.v = lp.k, sp.o = lp.dq;
            if (p.has_initial)
                sp.s0 = transposed(lp.s0);
            sp.D = (int)E, sp.E = (int)D;
            break;
        case 1: /* dv and dS_0: reversed scan (k, q, dO) from dS_N */
            pp.has_initial = pp.want_ds = 0;
            sp.q = lp.k, sp.k = lp.q, sp.v = lp.dout, sp.o = lp.dv;
            sp.s0 = lp.dsn;
            sp.sn = lp.ds0;
            break;
        case 2: /* dk: reversed scan (v, dO, q) from dS_Nᵀ */
            pp.has_initial = pp.has_final = pp.want_ds = 0;
            sp.q = lp.v, sp.k = lp.dout, sp.v = lp.q, sp.o = lp.dk;
            if (p.has_dsn)
                sp.s0 = transposed(lp.dsn);
            sp.D = (int)E, sp.E = (int)D;
            break;
        default: /* ds */
            if (!p.want_ds)
                continue;
            pp.has_final = 0;
            sp = lp;
            break;
        }
        if (part == 3) {
            CUresult r = LJ_CU(env, ctx->device.drv, cuMemsetD32Async, (CUdeviceptr)lp.workspace, 0u,
                               4, (CUstream)a->stream);
            if (r != CUDA_SUCCESS)
                return lj_driver_error(env, ctx->device.drv, r, "cuMemsetD32Async (ds ticket)");
        }
        if ((st = launch(ctx, a->family, &pp, &sp, a->stream)) != LAJIT_OK)
            return st;
    }
    return LAJIT_OK;
}

/* ---- Decode --------------------------------------------------------------------------------- */

LAJIT_API lajit_status lajit_attn_decode(lajit_ctx *ctx, const lajit_attn_decode_args *a)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lj_env *env = &ctx->env;
    lajit_status st = check_args(env, "lajit_attn_decode", a ? &a->struct_size : NULL, sizeof *a,
                                 a ? a->flags : 0, a ? a->scale : 0);
    if (st != LAJIT_OK)
        return st;
    if (!a->q || !a->k || !a->v || !a->o || !a->state)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "lajit_attn_decode: q, k, v, o and state are required");

    la_params lp;
    memset(&lp, 0, sizeof lp);
    lj_problem p;
    memset(&p, 0, sizeof p);
    p.op = LJ_OP_DECODE;
    p.vk = (a->flags & LAJIT_STATE_VK) != 0;
    int nd = a->q->ndim == 4 ? 4 : 3; /* [B,T,H,D] or [B,H,D] */
    int64_t qs[4] = {-1, -1, -1, -1};
    lj_dtype dt, dt2;
    la_tensor4 q, k, v, o;
    if ((st = lj_tensor_view(env, "q", a->q, nd, qs, FLOAT_TYPES, &q, &dt)) != LAJIT_OK)
        return st;
    if ((st = lj_tensor_view(env, "k", a->k, nd, qs, 1u << dt, &k, &dt2)) != LAJIT_OK)
        return st;
    int64_t vs[4] = {qs[0], qs[1], qs[2], -1};
    if (nd == 3)
        vs[2] = -1;
    if ((st = lj_tensor_view(env, "v", a->v, nd, vs, 1u << dt, &v, &dt2)) != LAJIT_OK)
        return st;
    if ((st = lj_tensor_view(env, "o", a->o, nd, vs, 1u << dt, &o, &dt2)) != LAJIT_OK)
        return st;
    p.dtype = dt;
    long long B = qs[0], T = nd == 4 ? qs[1] : 1, H = qs[nd - 2], D = qs[nd - 1], E = vs[nd - 1];
    if (T > 8)
        return lj_error(env, LAJIT_ERR_UNSUPPORTED, "decode: T = %lld steps, at most 8", T);
    if ((st = check_head_dims(env, D, E)) != LAJIT_OK)
        return st;
    /* Kernels see logical [B, H, T, D]: (row, head, step, d). tensor views right-align a 3-D
     * tensor into s1..s3, so map explicitly. */
    la_tensor4 *dst[4] = {&lp.q, &lp.k, &lp.v, &lp.o};
    const la_tensor4 *src[4] = {&q, &k, &v, &o};
    for (int i = 0; i < 4; i++) {
        dst[i]->ptr = src[i]->ptr;
        dst[i]->s3 = 1;
        if (nd == 4) {
            dst[i]->s0 = src[i]->s0;
            dst[i]->s1 = src[i]->s2;
            dst[i]->s2 = src[i]->s1;
        } else {
            dst[i]->s0 = src[i]->s1;
            dst[i]->s1 = src[i]->s2;
            dst[i]->s2 = 0;
        }
    }
    if ((st = view_decay(env, a->s, H, &lp.decay)) != LAJIT_OK)
        return st;
    p.decay = a->s != NULL;
    long long P = -1;
    if ((st = view_state(env, "state", a->state, &P, H, D, E, p.vk, &lp.s0)) != LAJIT_OK)
        return st;
    lp.sn = lp.s0;
    if (a->state_slots) {
        int64_t ss[1] = {B};
        la_tensor4 sl;
        if ((st = lj_tensor_view(env, "state_slots", a->state_slots, 1, ss, LJ_TENSOR_INT32, &sl, NULL)) != LAJIT_OK)
            return st;
        lp.slots = sl.ptr;
    } else if (P < B) {
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "state has %lld slots for %lld rows and no state_slots", P, B);
    }
    if (a->step_states) {
        long long rows = B * T;
        la_tensor4 ss;
        /* Compact [B,T,H,D,E] is the same memory as [B*T,H,D,E]; require compactness by
         * viewing it as 5-D and checking strides. */
        if (a->step_states->ndim != 5)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "step_states must be [B,T,H,%s]",
                            p.vk ? "E,D" : "D,E");
        DLTensor flat = *a->step_states;
        int64_t fshape[4];
        if (flat.shape[0] != B || flat.shape[1] != T)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "step_states is [%lld,%lld,...], expected [%lld,%lld,...]",
                            (long long)flat.shape[0], (long long)flat.shape[1], B, T);
        if (flat.strides) {
            long long expect = 1;
            for (int d = 4; d >= 0; d--) {
                if (flat.strides[d] != expect)
                    return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "step_states must be compact");
                expect *= flat.shape[d];
            }
        }
        fshape[0] = rows;
        for (int d = 1; d < 4; d++)
            fshape[d] = flat.shape[d + 1];
        flat.ndim = 4;
        flat.shape = fshape;
        flat.strides = NULL;
        long long rowsP = rows;
        if ((st = view_state(env, "step_states", &flat, &rowsP, H, D, E, p.vk, &ss)) != LAJIT_OK)
            return st;
        lp.step_states = ss;
        p.step_states = 1;
    }
    const io_tensor io[] = {
        {"q", a->q, 0}, {"k", a->k, 0}, {"v", a->v, 0}, {"s", a->s, 0},
        {"state_slots", a->state_slots, 0}, {"o", a->o, 1}, {"state", a->state, 1},
        {"step_states", a->step_states, 1},
    };
    if ((st = check_io(ctx, io, (int)(sizeof io / sizeof io[0]), NULL, NULL)) != LAJIT_OK)
        return st;
    p.B = (int)B;
    p.H = (int)H;
    p.N = (int)T;
    p.D = (int)D;
    p.E = (int)E;
    p.T = (int)T;
    p.has_initial = p.has_final = 1;
    lp.B = (int)B;
    lp.H = (int)H;
    lp.N = (int)T;
    lp.D = (int)D;
    lp.E = (int)E;
    lp.T = (int)T;
    lp.nseq = (int)B;
    lp.P = (int)P;
    lp.scale = a->scale;
    if (ctx->flags & LAJIT_CTX_CHECKED) {
        st = check_device_values(ctx, &lp, lp.slots ? (int)B : 0, 0, a->stream);
        if (st != LAJIT_OK)
            return st;
    }
    return launch(ctx, a->family, &p, &lp, a->stream);
}
