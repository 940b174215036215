/* op_args.c — the argument path the ops share (see op_args.h): argument and tensor checks, the
 * views that become la_params, element-level aliasing checks and checked mode's read-back. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "op_args.h"
#include "overlap.h"

/* ---- Checked mode: device-side values read back and validated ------------------------------ */

static lajit_status read_back(lajit_ctx *ctx, unsigned long long ptr, size_t bytes, void *host,
                              void *stream)
{
    lj_env *env = &ctx->env;
    const lj_driver *drv = ctx->device.drv;
    CUresult r =
        LJ_CU(env, drv, cuMemcpyDtoHAsync, host, (CUdeviceptr)ptr, bytes, (CUstream)stream);
    if (r == CUDA_SUCCESS)
        r = LJ_CU(env, drv, cuStreamSynchronize, (CUstream)stream);
    return r == CUDA_SUCCESS ? LAJIT_OK : lj_driver_error(env, drv, r, "checked mode read-back");
}

/* Checks s (finite, >= 0), cu_seqlens (0, non-decreasing, ending at T) and slots (-1, or in
 * [0, P) as itself or LAJIT_SLOT_FRESH, no slot twice). */
lajit_status lj_check_device_values(lajit_ctx *ctx, const la_params *lp, int n_slots,
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
                st = lj_error(env, LAJIT_ERR_CHECK_FAILED, "s[%d] = %g: must be finite and >= 0", h,
                              (double)s);
        }
    }
    if (st == LAJIT_OK && lp->cu_seqlens &&
        (st = read_back(ctx, lp->cu_seqlens, ((size_t)lp->nseq + 1) * 4, buf, stream)) ==
            LAJIT_OK) {
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
            if (buf[i] == LAJIT_SLOT_SKIP)
                continue;
            /* A fresh index names its slot as -2 - slot: INT_MIN is slot 2^31 - 2, no overflow. */
            int fresh = LAJIT_SLOT_IS_FRESH(buf[i]);
            int slot = fresh ? LAJIT_SLOT_FRESH_SLOT(buf[i]) : buf[i];
            if (slot >= lp->P)
                st = lj_error(env, LAJIT_ERR_CHECK_FAILED, "slot %d of row %d%s is outside [0, %d)",
                              slot, i, fresh ? " (a fresh index, LAJIT_SLOT_FRESH)" : "", lp->P);
            else if (seen[slot]++)
                st = lj_error(env, LAJIT_ERR_CHECK_FAILED, "slot %d is used by two rows", slot);
        }
    }
    lj_free(env, buf);
    return st;
}

/* ---- Shared argument checks ---------------------------------------------------------------- */

/* What every op checks first: arguments given, a struct_size this build knows, known flags, and
 * a finite nonzero scale. struct_size is NULL when the arguments are. */
lajit_status lj_check_args(lj_env *env, const char *fn, const size_t *struct_size, size_t expected,
                           uint32_t flags, float scale)
{
    if (!struct_size)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: args is NULL", fn);
    if (*struct_size != expected)
        return lj_error(env, LAJIT_ERR_STRUCT_SIZE, "%s: struct_size %zu, this build knows %zu", fn,
                        *struct_size, expected);
    if (flags & ~LAJIT_STATE_VK)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: unknown flags 0x%x", fn, flags);
    if (!isfinite(scale) || scale == 0.0f)
        return lj_error(
            env, LAJIT_ERR_INVALID_ARGUMENT,
            "%s: scale = %g: must be finite and nonzero (1 for the lightning convention)", fn,
            (double)scale);
    return LAJIT_OK;
}

lajit_status lj_check_head_dims(lj_env *env, long long D, long long E)
{
    if (D % 16 || E % 16 || D > 256 || E > 256)
        return lj_error(env, LAJIT_ERR_UNSUPPORTED,
                        "D = %lld, E = %lld: head dimensions must be multiples of 16 up to 256", D,
                        E);
    return LAJIT_OK;
}

static int same_pair(const lj_io_tensor *x, const lj_io_tensor *y, const char *a, const char *b)
{
    return a && ((strcmp(x->name, a) == 0 && strcmp(y->name, b) == 0) ||
                 (strcmp(x->name, b) == 0 && strcmp(y->name, a) == 0));
}

lajit_status lj_check_io(lajit_ctx *ctx, const lj_io_tensor *io, int n, const char *same_a,
                         const char *same_b)
{
    lj_env *env = &ctx->env;
    lajit_status st;
    for (int i = 0; i < n; i++)
        if (io[i].t &&
            (st = lj_tensor_check_device(env, io[i].name, io[i].t, ctx->ordinal)) != LAJIT_OK)
            return st;
    for (int i = 0; i < n; i++) {
        if (!io[i].t || !io[i].output)
            continue;
        if ((st = lj_tensor_check_writable(env, io[i].name, io[i].t)) != LAJIT_OK)
            return st;
        for (int j = 0; j < n; j++) {
            if (j == i || !io[j].t || (io[j].output && j < i))
                continue; /* each pair of outputs once */
            if (!lj_tensors_may_share(io[i].t, io[j].t))
                continue; /* no element in common: interleaved slices of one buffer are fine */
            if (same_pair(&io[i], &io[j], same_a, same_b)) {
                if (lj_tensor_same_memory(io[i].t, io[j].t))
                    continue; /* the in-place state the API allows */
                return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                                "%s and %s share elements without being the same view (same "
                                "address, shape and strides), which is the only aliasing allowed "
                                "between them",
                                io[i].name, io[j].name);
            }
            if (io[j].output)
                return lj_error(
                    env, LAJIT_ERR_INVALID_ARGUMENT,
                    "outputs %s and %s share elements: two kernels would write the same "
                    "memory",
                    io[i].name, io[j].name);
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "output %s shares elements with input %s: writing %s would change %s "
                            "while it is being read",
                            io[i].name, io[j].name, io[i].name, io[j].name);
        }
    }
    return LAJIT_OK;
}

/* The decay rates: float32 [H], or absent. */
lajit_status lj_view_decay(lj_env *env, const DLTensor *s, long long H, unsigned long long *ptr)
{
    *ptr = 0;
    if (!s)
        return LAJIT_OK;
    int64_t shape[1] = {H};
    la_tensor4 t;
    lajit_status st = lj_tensor_view(env, "s", s, 1, shape, LJ_TENSOR_F32, &t, NULL);
    if (st == LAJIT_OK)
        *ptr = t.ptr;
    return st;
}

/* A state or pool: [P, H, D, E] (KV) or [P, H, E, D] (VK), expressed to kernels as logical
 * (slot, h, d, e) strides. P < 0: any (returned in *P). Its alignment (address and strides in
 * multiples of 16 bytes) is checked by lj_tensor_view in bytes of its own element size, which
 * is what decode's 16-byte state vectors need for 4 floats or 8 16-bit values. */
lajit_status lj_view_state(lj_env *env, const char *name, const DLTensor *t, long long *P,
                           long long H, long long D, long long E, int vk, unsigned dtype_mask,
                           lj_dtype *dtype, la_tensor4 *out)
{
    int64_t shape[4] = {*P, H, vk ? E : D, vk ? D : E};
    la_tensor4 v;
    lj_dtype dt = LJ_F32;
    lajit_status st = lj_tensor_view(env, name, t, 4, shape, dtype_mask, &v, &dt);
    if (st != LAJIT_OK)
        return st;
    *P = shape[0];
    *out = v;
    if (dtype)
        *dtype = dt;
    if (vk) { /* logical (d, e) = memory (e, d): swap the last two strides */
        out->s2 = v.s3;
        out->s3 = v.s2;
    }
    return LAJIT_OK;
}

lajit_status lj_check_out_dtype(lj_env *env, const char *name, lj_dtype in, lj_dtype out)
{
    if (out == in || in == LJ_F32 || out == LJ_F32)
        return LAJIT_OK;
    return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                    "%s is %s with %s inputs: o has the inputs' dtype, or one of the two is "
                    "float32 (fp32 q, k, v with a 16-bit o, or the reverse)",
                    name, lj_dtype_name(out), lj_dtype_name(in));
}

static int same_view(const la_tensor4 *a, const la_tensor4 *b)
{
    return a->ptr == b->ptr && a->s0 == b->s0 && a->s1 == b->s1 && a->s2 == b->s2 && a->s3 == b->s3;
}

/* The sequence tensors of fwd and bwd: [B,H,N,D|E] (any strided view with a unit last stride)
 * or, with cu_seqlens, packed [T,H,D|E]. The first tensor fixes the shape and the dtype; the
 * first v-like one fixes E. Kernels index (b, h, t, d), so packed views get their token stride
 * in s2 and their head stride in s1. */
static lajit_status view_sequences(lj_env *env, const DLTensor *cu_seqlens, const lj_seq_tensor *t,
                                   int n, const char *mixed, lj_seq_shape *sh,
                                   unsigned long long *cu_ptr)
{
    const int varlen = cu_seqlens != NULL, nd = varlen ? 3 : 4;
    int64_t qs[4] = {-1, -1, -1, -1}, vs[4] = {-1, -1, -1, -1};
    int have_v = 0;
    lj_dtype dt = LJ_BF16, dt2;
    lajit_status st;
    sh->out_dtype = (lj_dtype)-1;
    for (int i = 0; i < n; i++) {
        const int mix = i > 0 && mixed && strcmp(t[i].name, mixed) == 0;
        unsigned mask = i == 0 || mix ? LJ_TENSOR_FLOATS : 1u << dt;
        if (t[i].v_like && !have_v) {
            for (int d = 0; d < nd - 1; d++)
                vs[d] = qs[d];
            have_v = 1;
        }
        if ((st = lj_tensor_view(env, t[i].name, t[i].t, nd, t[i].v_like ? vs : qs, mask, t[i].out,
                                 i == 0 ? &dt : &dt2)) != LAJIT_OK)
            return st;
        if (mix) {
            if ((st = lj_check_out_dtype(env, t[i].name, dt, dt2)) != LAJIT_OK)
                return st;
            sh->out_dtype = dt2;
        }
        if (varlen) {
            la_tensor4 *v = t[i].out;
            long long token = v->s1, head = v->s2;
            v->s0 = 0;
            v->s1 = head;
            v->s2 = token;
        }
    }
    sh->dtype = dt;
    if ((int)sh->out_dtype < 0)
        sh->out_dtype = dt;
    sh->D = qs[nd - 1];
    sh->E = vs[nd - 1];
    *cu_ptr = 0;
    if (varlen) {
        sh->H = qs[1];
        sh->N = qs[0];
        int64_t cs[1] = {-1};
        la_tensor4 cu;
        if ((st = lj_tensor_view(env, "cu_seqlens", cu_seqlens, 1, cs, LJ_TENSOR_INT32, &cu,
                                 NULL)) != LAJIT_OK)
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

lajit_status lj_seq_begin(lj_env *env, const lj_seq_call *c, lj_problem *p, la_params *lp,
                          lj_seq_shape *sh, long long *P)
{
    memset(p, 0, sizeof *p);
    memset(lp, 0, sizeof *lp);
    memset(sh, 0, sizeof *sh);
    for (int i = 0; i < c->n_seqs; i++)
        if (!c->seqs[i].t)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: %s are required", c->fn,
                            c->required);
    p->op = c->op;
    p->varlen = c->cu_seqlens != NULL;
    p->vk = (c->flags & LAJIT_STATE_VK) != 0;
    lajit_status st =
        view_sequences(env, c->cu_seqlens, c->seqs, c->n_seqs, c->mixed, sh, &lp->cu_seqlens);
    if (st != LAJIT_OK)
        return st;
    p->dtype = sh->dtype;
    p->out_dtype = sh->out_dtype != sh->dtype ? (int)sh->out_dtype + 1 : 0;
    if ((st = lj_check_head_dims(env, sh->D, sh->E)) != LAJIT_OK)
        return st;
    if ((st = lj_view_decay(env, c->s, sh->H, &lp->decay)) != LAJIT_OK)
        return st;
    p->decay = c->s != NULL;

    /* States: [B,H,D,E] each, or pools of one size P with varlen; one dtype for all of them (a
     * kernel bakes one storage type), float32 unless the op stores 16-bit states. */
    *P = p->varlen ? -1 : sh->B;
    int any_state = 0;
    const char *first = NULL;
    for (int i = 0; i < c->n_states; i++) {
        const lj_state_arg *s = &c->states[i];
        if (!s->t)
            continue;
        lj_dtype sdt;
        if ((st = lj_view_state(env, s->name, s->t, P, sh->H, sh->D, sh->E, p->vk, LJ_TENSOR_FLOATS,
                                &sdt, s->out)) != LAJIT_OK)
            return st;
        if (sdt != LJ_F32 && !c->states16)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: %s is %s; the backward's states (initial_state, d_final_state, "
                            "d_initial_state) must be float32 (16-bit state storage is served by "
                            "lajit_attn_fwd and lajit_attn_decode only)",
                            c->fn, s->name, lj_dtype_name(sdt));
        if (first && sdt != p->state_dtype)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: %s is %s but %s is %s: the states of one call share a dtype",
                            c->fn, s->name, lj_dtype_name(sdt), first,
                            lj_dtype_name(p->state_dtype));
        p->state_dtype = sdt;
        first = s->name;
        *s->flag = 1;
        any_state = 1;
    }
    if (lp->s0.ptr && lp->sn.ptr && lp->s0.ptr == lp->sn.ptr && !same_view(&lp->s0, &lp->sn))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "final_state aliases initial_state with different strides");
    if (p->varlen && any_state) {
        if (!c->state_slots)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "varlen with states needs state_slots (int32 [nseq])");
        int64_t ss[1] = {sh->B};
        la_tensor4 sl;
        if ((st = lj_tensor_view(env, "state_slots", c->state_slots, 1, ss, LJ_TENSOR_INT32, &sl,
                                 NULL)) != LAJIT_OK)
            return st;
        lp->slots = sl.ptr;
    } else if (c->state_slots) {
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "state_slots is only used with cu_seqlens and a state");
    }
    return LAJIT_OK;
}

lajit_status lj_seq_finish(lajit_ctx *ctx, const lj_io_tensor *io, int n_io, const char *same_a,
                           const char *same_b, const lj_seq_shape *sh, long long P, float scale,
                           void *stream, lj_problem *p, la_params *lp)
{
    lajit_status st = lj_check_io(ctx, io, n_io, same_a, same_b);
    if (st != LAJIT_OK)
        return st;
    p->B = lp->B = lp->nseq = (int)sh->B;
    p->H = lp->H = (int)sh->H;
    p->N = lp->N = (int)sh->N;
    p->D = lp->D = (int)sh->D;
    p->E = lp->E = (int)sh->E;
    p->T = lp->T = 1;
    lp->P = (int)(P > 0 ? P : 0);
    lp->scale = scale;
    if (ctx->flags & LAJIT_CTX_CHECKED)
        return lj_check_device_values(ctx, lp, lp->slots ? (int)sh->B : 0, sh->N, stream);
    return LAJIT_OK;
}
