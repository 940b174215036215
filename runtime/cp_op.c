/* cp_op.c — context parallelism (include/lajit.h has the mathematics): one sequence's tokens
 * spread over the ranks of an NCCL communicator, forward (lajit_cp_attn_fwd) and backward
 * (lajit_cp_attn_bwd).
 *
 * A rank's call is a few steps, the exchange behind a function pointer:
 *   cp_local     the span's carry into this rank's slot of the exchange buffer, and the span's
 *                length n_r beside it (two 32-bit memsets: no host copy): forward, its local
 *                state M_r (rank 0 from S_0); backward's second exchange, its local gradient
 *                state Mg_r (the last rank from dS_N);
 *   cp_gather_fn the exchange: every rank's slot into every rank's buffer. nccl_gather is an
 *                in-place ncclAllGather (LASP-2's exchange); the tests' sim_gather copies the
 *                other simulated ranks' slots with cuMemcpyDtoDAsync. The log2(P)-step
 *                point-to-point scan (issue 17's "exchange that scales") is to be a third
 *                function here, producing this rank's incoming state instead of P slots;
 *   cp_scan      the state scan over the P gathered slots (forward, or reverse for gradients);
 *   cp_outputs   forward: the span's outputs from its incoming state; backward: the span's
 *                gradients from its incoming state and the gradient reaching its end, then
 *                (ds) every rank's part gathered and summed in rank order.
 * Every kernel runs through the public ops (lajit_attn_fwd, lajit_attn_bwd,
 * lajit_attn_state_scan), so their checks, plans and hot path are the ones used.
 *
 * The exchange buffer of one rank is P slots of `slot` bytes: the [B,H,D,E] float32 state
 * (padded to 16 bytes), then n_r as an int64 (and 8 bytes of padding), so one all-gather of
 * slot/4 floats moves states and lengths together; the scan reads the states as a [P,B,H,D,E]
 * view of stride slot/4 and the lengths as an int64 [P] view of stride slot/8. The incoming
 * states follow, [P,B,H,D,E]; the backward adds the gradient scan's [P,B,H,D,E] and, for ds, P
 * slots of H floats (padded to 16 bytes), the scan's P outputs and the sum. The buffer is the
 * context's (grow-only, like the backward's ds workspace): after the first call of a shape
 * nothing is allocated and no call synchronises. */
#include <stdio.h>
#include <string.h>

#include "cp_op.h"
#include "op_args.h"

#define FN_FWD "lajit_cp_attn_fwd"
#define FN_BWD "lajit_cp_attn_bwd"

/* One rank's call, forward or backward, in common terms (the other direction's fields NULL). */
typedef struct cp_call {
    const char *fn;
    int bwd;
    const DLTensor *q, *k, *v;
    DLTensor *o;                 /* forward */
    const DLTensor *dout;        /* backward */
    DLTensor *dq, *dk, *dv, *ds; /* backward */
    const DLTensor *s;
    float scale;
    const DLTensor *initial_state; /* rank 0's S_0 */
    DLTensor *final_state;         /* forward: S_N */
    DLTensor *d_initial_state;     /* backward: rank 0's dS_0 */
    const DLTensor *d_final_state; /* backward: the last rank's dS_N */
    const DLTensor *cu_seqlens;
    uint32_t flags;
    void *stream;
} cp_call;

/* One rank's call: its arguments, its place and the sizes every rank must share. */
typedef struct cp_rank {
    cp_call c;
    int rank, P, vk;
    int64_t B, H, N, D, E;  /* N: this rank's n_r */
    size_t state_bytes;     /* B·H·D·E·4 */
    size_t slot;            /* bytes per rank in the exchange buffer */
    size_t len_off;         /* the length's offset inside a slot */
    size_t ds_slot;         /* bytes per rank of ds's exchange: H floats, padded to 16 bytes */
    CUdeviceptr gather;     /* [P][slot] */
    CUdeviceptr incoming;   /* [P,B,H,D,E] float32: the forward scan's */
    CUdeviceptr incoming_g; /* backward: [P,B,H,D,E], the reverse scan's */
    CUdeviceptr ds_gather;  /* backward with ds: [P][ds_slot], then the scan's [P][ds_slot] and
                              the sum [ds_slot] */
} cp_rank;

/* The exchange: fills the P slots of `bytes` bytes at base (this rank's buffer) from every
 * rank's own slot (base + rank·bytes). */
typedef lajit_status (*cp_gather_fn)(lajit_ctx *ctx, const cp_rank *r, CUdeviceptr base,
                                     size_t bytes, void *user);

static const DLDataType F32 = {kDLFloat, 32, 1};
static const DLDataType I64 = {kDLInt, 64, 1};

static size_t round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

static cp_call fwd_call(const lajit_cp_attn_fwd_args *a)
{
    cp_call c;
    memset(&c, 0, sizeof c);
    c.fn = FN_FWD;
    c.q = a->q;
    c.k = a->k;
    c.v = a->v;
    c.o = a->o;
    c.s = a->s;
    c.scale = a->scale;
    c.initial_state = a->initial_state;
    c.final_state = a->final_state;
    c.cu_seqlens = a->cu_seqlens;
    c.flags = a->flags;
    c.stream = a->stream;
    return c;
}

static cp_call bwd_call(const lajit_cp_attn_bwd_args *a)
{
    cp_call c;
    memset(&c, 0, sizeof c);
    c.fn = FN_BWD;
    c.bwd = 1;
    c.q = a->q;
    c.k = a->k;
    c.v = a->v;
    c.dout = a->dout;
    c.dq = a->dq;
    c.dk = a->dk;
    c.dv = a->dv;
    c.ds = a->ds;
    c.s = a->s;
    c.scale = a->scale;
    c.initial_state = a->initial_state;
    c.d_initial_state = a->d_initial_state;
    c.d_final_state = a->d_final_state;
    c.cu_seqlens = a->cu_seqlens;
    c.flags = a->flags;
    c.stream = a->stream;
    return c;
}

/* A failed driver call of r's call: "fn: what" (lj_driver_error takes a fixed text). */
static lajit_status drv_fail(lajit_ctx *ctx, const cp_call *c, CUresult cr, const char *what)
{
    char text[160];
    snprintf(text, sizeof text, "%s: %s", c->fn, what);
    return lj_driver_error(&ctx->env, ctx->device.drv, cr, text);
}

/* ---- Argument checks ------------------------------------------------------------------------ */

/* The span's tensors: forward q, k [B,H,n,D], v, o [B,H,n,E]; backward q, k, dq, dk [B,H,n,D],
 * v, dout, dv [B,H,n,E]: rank 4, the same B, H, n; D from k, E from v. n may be 0 (an empty
 * span); everything else at least 1. What the ops check on top (dtype, strides, device,
 * aliasing) they check when they run. */
static lajit_status check_seqs(lj_env *env, cp_rank *r)
{
    const cp_call *c = &r->c;
    const DLTensor *t[7] = {c->q, c->k, c->v, c->bwd ? c->dout : c->o, c->dq, c->dk, c->dv};
    static const char *const fwd_names[4] = {"q", "k", "v", "o"};
    static const char *const bwd_names[7] = {"q", "k", "v", "dout", "dq", "dk", "dv"};
    static const int e_like[7] = {0, 0, 1, 1, 0, 0, 1};
    const char *const *names = c->bwd ? bwd_names : fwd_names;
    const int n = c->bwd ? 7 : 4;
    for (int i = 0; i < n; i++) {
        if (!t[i])
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: %s are required", c->fn,
                            c->bwd ? "q, k, v, dout, dq, dk and dv" : "q, k, v and o");
        if (!t[i]->shape || t[i]->ndim != 4)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: %s must be [B, H, N, %c] (this rank's span); it has %d dimensions",
                            c->fn, names[i], e_like[i] ? 'E' : 'D', t[i]->shape ? t[i]->ndim : 0);
        for (int d = 0; d < 4; d++)
            if (t[i]->shape[d] < (d == 2 ? 0 : 1))
                return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                                "%s: %s has size %lld in dimension %d", c->fn, names[i],
                                (long long)t[i]->shape[d], d);
    }
    r->B = c->k->shape[0];
    r->H = c->k->shape[1];
    r->N = c->k->shape[2];
    r->D = c->k->shape[3];
    r->E = c->v->shape[3];
    for (int i = 0; i < n; i++) {
        const int64_t *s = t[i]->shape;
        int64_t w = e_like[i] ? r->E : r->D;
        if (s[0] != r->B || s[1] != r->H || s[2] != r->N || s[3] != w)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: %s is [%lld, %lld, %lld, %lld]; k and v make it [%lld, %lld, "
                            "%lld, %lld] (B, H, this rank's N, %c)",
                            c->fn, names[i], (long long)s[0], (long long)s[1], (long long)s[2],
                            (long long)s[3], (long long)r->B, (long long)r->H, (long long)r->N,
                            (long long)w, e_like[i] ? 'E' : 'D');
    }
    return LAJIT_OK;
}

/* A state argument: float32 [B,H,D,E] ([B,H,E,D] with LAJIT_STATE_VK). */
static lajit_status check_state(lj_env *env, const char *name, const DLTensor *t, const cp_rank *r)
{
    const int64_t want[4] = {r->B, r->H, r->vk ? r->E : r->D, r->vk ? r->D : r->E};
    lj_elem e;
    if (!t->shape || t->ndim != 4 || memcmp(t->shape, want, sizeof want) != 0)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: %s must be [B, H, %s] = [%lld, %lld, %lld, %lld]", r->c.fn, name,
                        r->vk ? "E, D" : "D, E", (long long)want[0], (long long)want[1],
                        (long long)want[2], (long long)want[3]);
    if (!lj_tensor_elem(t->dtype, &e) || e != LJ_ELEM_F32)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: %s is %s; context parallelism keeps states in float32", r->c.fn, name,
                        lj_tensor_dtype_name(t->dtype));
    return LAJIT_OK;
}

/* Compact float32 of `count` elements from its first (a copy source or destination). */
static int compact(const DLTensor *t)
{
    if (!t->strides)
        return 1;
    int64_t want = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] > 1 && t->strides[d] != want)
            return 0;
        want *= t->shape[d];
    }
    return 1;
}

/* Everything one rank's call can check alone; fills r's sizes and layout (not its buffers). */
static lajit_status check_rank(lj_env *env, const cp_call *c, int rank, int P, cp_rank *r)
{
    if (c->cu_seqlens)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: cu_seqlens must be NULL: a varlen batch across ranks is not "
                        "supported yet (each rank holds a span of every sequence of a "
                        "[B, H, N, D] batch)",
                        c->fn);
    memset(r, 0, sizeof *r);
    r->c = *c;
    r->rank = rank;
    r->P = P;
    r->vk = (c->flags & LAJIT_STATE_VK) != 0;
    lajit_status st;
    if ((st = check_seqs(env, r)) != LAJIT_OK)
        return st;
    if (rank == 0 && c->initial_state &&
        (st = check_state(env, "initial_state", c->initial_state, r)) != LAJIT_OK)
        return st;
    if (c->final_state && (st = check_state(env, "final_state", c->final_state, r)) != LAJIT_OK)
        return st;
    if (rank == 0 && c->d_initial_state &&
        (st = check_state(env, "d_initial_state", c->d_initial_state, r)) != LAJIT_OK)
        return st;
    if (rank == P - 1 && c->d_final_state &&
        (st = check_state(env, "d_final_state", c->d_final_state, r)) != LAJIT_OK)
        return st;
    if (c->ds) {
        lj_elem e;
        if (!c->s)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: ds (the gradient of s) needs s",
                            c->fn);
        if (!c->ds->shape || c->ds->ndim != 1 || c->ds->shape[0] != r->H ||
            !lj_tensor_elem(c->ds->dtype, &e) || e != LJ_ELEM_F32 || !compact(c->ds))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: ds must be float32 [H] = [%lld], contiguous", c->fn,
                            (long long)r->H);
    }
    size_t n;
    if (__builtin_mul_overflow((size_t)r->B * (size_t)r->H, (size_t)r->D * (size_t)r->E, &n) ||
        __builtin_mul_overflow(n, (size_t)4, &r->state_bytes) || r->state_bytes > ((size_t)1 << 40))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: the state of B = %lld, H = %lld, D = %lld, E = %lld is too large",
                        c->fn, (long long)r->B, (long long)r->H, (long long)r->D, (long long)r->E);
    r->len_off = round16(r->state_bytes);
    r->slot = r->len_off + 16;
    r->ds_slot = round16((size_t)r->H * 4);
    return LAJIT_OK;
}

/* One rank's buffer, in bytes: the exchange slots and the incoming states; the backward adds
 * the gradient scan's states and, with ds, its parts, their scan and their sum. */
static int rank_bytes(const cp_rank *r, size_t *out)
{
    size_t a, b, d = 0;
    if (__builtin_mul_overflow(r->slot, (size_t)r->P, &a) ||
        __builtin_mul_overflow(r->state_bytes, (size_t)r->P, &b) ||
        __builtin_add_overflow(round16(a), round16(b), out))
        return 0;
    if (r->c.bwd && __builtin_add_overflow(*out, round16(b), out))
        return 0;
    if (r->c.ds && (__builtin_mul_overflow(r->ds_slot, (size_t)(2 * r->P + 1), &d) ||
                    __builtin_add_overflow(*out, d, out)))
        return 0;
    return 1;
}

/* r's regions inside its buffer at base (rank_bytes's order). */
static void place(cp_rank *r, CUdeviceptr base)
{
    const size_t states = round16(r->state_bytes * (size_t)r->P);
    r->gather = base;
    r->incoming = r->gather + round16(r->slot * (size_t)r->P);
    r->incoming_g = r->c.bwd ? r->incoming + states : 0;
    r->ds_gather = r->c.ds ? r->incoming_g + states : 0;
}

/* The context's workspace, grown (never shrunk) to bytes. */
static lajit_status workspace(lajit_ctx *ctx, size_t bytes, CUdeviceptr *out)
{
    lajit_status st =
        lj_ctx_buffer(ctx, &ctx->cp_ws, bytes, 0, NULL, "context parallelism's exchange buffer");
    *out = ctx->cp_ws.ptr;
    return st;
}

/* ---- The steps ------------------------------------------------------------------------------ */

/* A float32 state view [B,H,D,E] (VK: [B,H,E,D]) of compact memory at base + off. */
static DLTensor *state_view(DLTensor *t, int64_t shape[4], const cp_rank *r, CUdeviceptr base,
                            size_t off, int ordinal)
{
    shape[0] = r->B;
    shape[1] = r->H;
    shape[2] = r->vk ? r->E : r->D;
    shape[3] = r->vk ? r->D : r->E;
    memset(t, 0, sizeof *t);
    t->data = (void *)(uintptr_t)base;
    t->byte_offset = off;
    t->device = (DLDevice){kDLCUDA, ordinal};
    t->ndim = 4;
    t->dtype = F32;
    t->shape = shape;
    return t;
}

/* A device copy of a compact tensor's bytes (S_0 or dS_N into the exchange, H_0 out to dS_0). */
static lajit_status copy_state(lajit_ctx *ctx, const cp_rank *r, CUdeviceptr dst, CUdeviceptr src,
                               size_t bytes, const char *what)
{
    CUresult cr = LJ_CU(&ctx->env, ctx->device.drv, cuMemcpyDtoDAsync, dst, src, bytes,
                        (CUstream)r->c.stream);
    return cr == CUDA_SUCCESS ? LAJIT_OK : drv_fail(ctx, &r->c, cr, what);
}

static CUdeviceptr address(const DLTensor *t)
{
    return (CUdeviceptr)(uintptr_t)t->data + t->byte_offset;
}

/* The carry of this rank's span and n_r into its slot. Forward (grad = 0): M_r, rank 0's from
 * S_0 (its final state). Gradient (grad = 1): Mg_r, the last rank's from dS_N (its dS_0). */
static lajit_status cp_local(lajit_ctx *ctx, const cp_rank *r, int grad)
{
    lj_env *env = &ctx->env;
    const cp_call *c = &r->c;
    const lj_driver *drv = ctx->device.drv;
    const CUdeviceptr mine = r->gather + (CUdeviceptr)r->rank * r->slot;
    const CUstream stream = (CUstream)c->stream;
    const DLTensor *carry_in = grad ? (r->rank == r->P - 1 ? c->d_final_state : NULL)
                                    : (r->rank == 0 ? c->initial_state : NULL);
    const uint64_t n = (uint64_t)r->N;
    CUresult cr = LJ_CU(env, drv, cuMemsetD32Async, mine + r->len_off, (unsigned)(n & 0xffffffffu),
                        1, stream);
    if (cr == CUDA_SUCCESS)
        cr = LJ_CU(env, drv, cuMemsetD32Async, mine + r->len_off + 4, (unsigned)(n >> 32), 1,
                   stream);
    if (cr != CUDA_SUCCESS)
        return drv_fail(ctx, c, cr, "cuMemsetD32Async (the span's length)");
    if (r->N > 0) {
        int64_t shape[4];
        DLTensor m;
        lajit_status st;
        if (!grad) {
            lajit_attn_fwd_args f;
            memset(&f, 0, sizeof f);
            f.struct_size = sizeof f;
            f.k = c->k;
            f.v = c->v;
            f.s = c->s;
            f.scale = c->scale;
            f.initial_state = carry_in;
            f.final_state = state_view(&m, shape, r, mine, 0, ctx->ordinal);
            f.flags = c->flags;
            f.stream = c->stream;
            st = lajit_attn_fwd(ctx, &f);
        } else {
            lajit_attn_bwd_args b;
            memset(&b, 0, sizeof b);
            b.struct_size = sizeof b;
            b.q = c->q;
            b.dout = c->dout;
            b.s = c->s;
            b.scale = c->scale;
            b.d_final_state = carry_in;
            b.d_initial_state = state_view(&m, shape, r, mine, 0, ctx->ordinal);
            b.flags = c->flags;
            b.stream = c->stream;
            st = lajit_attn_bwd(ctx, &b);
        }
        if (st != LAJIT_OK)
            lj_error_prefix(env, "%s (rank %d, its span's local %sstate): ", c->fn, r->rank,
                            grad ? "gradient " : "");
        return st;
    }
    if (!carry_in) { /* an empty span: M = 0 */
        cr = LJ_CU(env, drv, cuMemsetD32Async, mine, 0u, r->state_bytes / 4, stream);
        return cr == CUDA_SUCCESS
                   ? LAJIT_OK
                   : drv_fail(ctx, c, cr, "cuMemsetD32Async (an empty span's state)");
    }
    /* An end rank with no tokens passes its carry (S_0, or dS_N) on as it is. */
    if (!compact(carry_in))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: rank %d has no tokens, so %s is copied into the exchange as it is: it "
                        "must be contiguous",
                        c->fn, r->rank, grad ? "d_final_state" : "initial_state");
    return copy_state(ctx, r, mine, address(carry_in), r->state_bytes,
                      grad ? "cuMemcpyDtoDAsync (dS_N)" : "cuMemcpyDtoDAsync (S_0)");
}

/* The scan of the gathered slots into `out` ([P,B,H,D,E]): forward S_{a_j}, or (grad) the
 * reverse H_j; `final` (may be NULL) receives the walk's carry (S_N). */
static lajit_status cp_scan(lajit_ctx *ctx, const cp_rank *r, int grad, CUdeviceptr out,
                            DLTensor *final)
{
    const cp_call *c = &r->c;
    const int64_t R = r->vk ? r->E : r->D, C = r->vk ? r->D : r->E;
    int64_t ls_shape[5] = {r->P, r->B, r->H, R, C};
    int64_t ls_strides[5] = {(int64_t)(r->slot / 4), r->H * R * C, R * C, C, 1};
    int64_t len_shape[1] = {r->P}, len_strides[1] = {(int64_t)(r->slot / 8)};
    DLTensor ls, len, in;
    memset(&ls, 0, sizeof ls);
    ls.data = (void *)(uintptr_t)r->gather;
    ls.device = (DLDevice){kDLCUDA, ctx->ordinal};
    ls.ndim = 5;
    ls.dtype = F32;
    ls.shape = ls_shape;
    ls.strides = ls_strides;
    len = ls;
    len.byte_offset = r->len_off;
    len.ndim = 1;
    len.dtype = I64;
    len.shape = len_shape;
    len.strides = len_strides;
    in = ls;
    in.data = (void *)(uintptr_t)out;
    in.strides = NULL;
    lajit_attn_state_scan_args sc;
    memset(&sc, 0, sizeof sc);
    sc.struct_size = sizeof sc;
    sc.local_states = &ls;
    sc.lengths = &len;
    sc.s = c->s;
    sc.incoming_states = &in;
    sc.final_state = final;
    sc.flags = (c->flags & LAJIT_STATE_VK) | (grad ? LAJIT_SCAN_REVERSE : 0);
    sc.stream = c->stream;
    lajit_status st = lajit_attn_state_scan(ctx, &sc);
    if (st != LAJIT_OK)
        lj_error_prefix(&ctx->env, "%s (rank %d, the scan of the gathered %sstates): ", c->fn,
                        r->rank, grad ? "gradient " : "");
    return st;
}

/* Forward: the incoming state (and S_N), then the span's outputs. */
static lajit_status cp_fwd_outputs(lajit_ctx *ctx, const cp_rank *r)
{
    lj_env *env = &ctx->env;
    const cp_call *c = &r->c;
    lajit_status st;
    int64_t in_shape[4];
    DLTensor in_state;
    const DLTensor *incoming = r->rank == 0 ? c->initial_state : NULL;
    /* Rank 0's incoming state is S_0: it scans only for S_N. */
    if (r->rank > 0 || c->final_state) {
        if ((st = cp_scan(ctx, r, 0, r->incoming, c->final_state)) != LAJIT_OK)
            return st;
        if (r->rank > 0)
            incoming = state_view(&in_state, in_shape, r, r->incoming,
                                  (size_t)r->rank * r->state_bytes, ctx->ordinal);
    }
    if (r->N == 0)
        return LAJIT_OK;
    lajit_attn_fwd_args f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.q = c->q;
    f.k = c->k;
    f.v = c->v;
    f.o = c->o;
    f.s = c->s;
    f.scale = c->scale;
    f.initial_state = incoming;
    f.flags = c->flags;
    f.stream = c->stream;
    if ((st = lajit_attn_fwd(ctx, &f)) != LAJIT_OK)
        lj_error_prefix(env, "%s (rank %d, its span's outputs): ", c->fn, r->rank);
    return st;
}

/* Backward, after the forward exchange: S_{a_r} (rank 0: S_0) into r->incoming's slot r. */
static lajit_status cp_bwd_incoming(lajit_ctx *ctx, const cp_rank *r)
{
    return r->rank > 0 ? cp_scan(ctx, r, 0, r->incoming, NULL) : LAJIT_OK;
}

/* Backward, after the gradient exchange: H_r (the last rank: dS_N), then the span's gradients
 * from S_{a_r} and H_r, ds's part of this rank into its ds slot. */
static lajit_status cp_bwd_grads(lajit_ctx *ctx, const cp_rank *r)
{
    lj_env *env = &ctx->env;
    const cp_call *c = &r->c;
    const int last = r->rank == r->P - 1;
    lajit_status st;
    if (!last && (st = cp_scan(ctx, r, 1, r->incoming_g, NULL)) != LAJIT_OK)
        return st;
    int64_t in_shape[4], h_shape[4], ds_shape[1] = {r->H};
    DLTensor in_state, h_state, ds_part;
    const DLTensor *incoming = r->rank == 0
                                   ? c->initial_state
                                   : state_view(&in_state, in_shape, r, r->incoming,
                                                (size_t)r->rank * r->state_bytes, ctx->ordinal);
    const DLTensor *reaching = last ? c->d_final_state
                                    : state_view(&h_state, h_shape, r, r->incoming_g,
                                                 (size_t)r->rank * r->state_bytes, ctx->ordinal);
    const CUdeviceptr part = r->ds_gather + (CUdeviceptr)r->rank * r->ds_slot;
    if (r->N == 0) {
        /* No tokens: no gradients, a zero part of ds, and rank 0's dS_0 is what reaches it. */
        if (c->ds) {
            CUresult cr = LJ_CU(env, ctx->device.drv, cuMemsetD32Async, part, 0u, r->ds_slot / 4,
                                (CUstream)c->stream);
            if (cr != CUDA_SUCCESS)
                return drv_fail(ctx, c, cr, "cuMemsetD32Async (an empty span's part of ds)");
        }
        if (r->rank != 0 || !c->d_initial_state)
            return LAJIT_OK;
        if (!compact(c->d_initial_state))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: rank 0 has no tokens, so d_initial_state is copied from the "
                            "exchange as it is: it must be contiguous",
                            c->fn);
        if (!reaching) { /* P = 1, no tokens, no dS_N: dS_0 = 0 */
            CUresult cr = LJ_CU(env, ctx->device.drv, cuMemsetD32Async, address(c->d_initial_state),
                                0u, r->state_bytes / 4, (CUstream)c->stream);
            return cr == CUDA_SUCCESS ? LAJIT_OK : drv_fail(ctx, c, cr, "cuMemsetD32Async (dS_0)");
        }
        if (!compact(reaching))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: rank 0 has no tokens and is the last rank, so d_final_state is "
                            "copied to d_initial_state: it must be contiguous",
                            c->fn);
        return copy_state(ctx, r, address(c->d_initial_state), address(reaching), r->state_bytes,
                          "cuMemcpyDtoDAsync (dS_0)");
    }
    lajit_attn_bwd_args b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.q = c->q;
    b.k = c->k;
    b.v = c->v;
    b.dout = c->dout;
    b.dq = c->dq;
    b.dk = c->dk;
    b.dv = c->dv;
    b.s = c->s;
    b.scale = c->scale;
    b.initial_state = incoming;
    b.d_final_state = reaching;
    b.d_initial_state = r->rank == 0 ? c->d_initial_state : NULL;
    if (c->ds) {
        memset(&ds_part, 0, sizeof ds_part);
        ds_part.data = (void *)(uintptr_t)part;
        ds_part.device = (DLDevice){kDLCUDA, ctx->ordinal};
        ds_part.ndim = 1;
        ds_part.dtype = F32;
        ds_part.shape = ds_shape;
        b.ds = &ds_part;
    }
    b.flags = c->flags;
    b.stream = c->stream;
    if ((st = lajit_attn_bwd(ctx, &b)) != LAJIT_OK)
        lj_error_prefix(env, "%s (rank %d, its span's gradients): ", c->fn, r->rank);
    return st;
}

/* Backward with ds, after the parts' exchange: their sum in rank order (the state scan with no
 * decay over P spans of [1, 1, 1, H'] "states", H' = ds_slot/4: X = X + part_j, the same order
 * and so the same bits on every rank), copied into ds. */
static lajit_status cp_ds_sum(lajit_ctx *ctx, const cp_rank *r)
{
    const cp_call *c = &r->c;
    const int64_t w = (int64_t)(r->ds_slot / 4);
    int64_t ls_shape[5] = {r->P, 1, 1, 1, w}, sum_shape[4] = {1, 1, 1, w};
    int64_t len_shape[1] = {r->P}, len_strides[1] = {(int64_t)(r->slot / 8)};
    DLTensor ls, in, sum, len;
    memset(&ls, 0, sizeof ls);
    ls.data = (void *)(uintptr_t)r->ds_gather;
    ls.device = (DLDevice){kDLCUDA, ctx->ordinal};
    ls.ndim = 5;
    ls.dtype = F32;
    ls.shape = ls_shape;
    in = ls;
    in.byte_offset = r->ds_slot * (size_t)r->P;
    sum = ls;
    sum.byte_offset = 2 * r->ds_slot * (size_t)r->P;
    sum.ndim = 4;
    sum.shape = sum_shape;
    /* Lengths are not read without s; the exchange's are a valid [P] view. */
    memset(&len, 0, sizeof len);
    len.data = (void *)(uintptr_t)r->gather;
    len.byte_offset = r->len_off;
    len.device = ls.device;
    len.ndim = 1;
    len.dtype = I64;
    len.shape = len_shape;
    len.strides = len_strides;
    lajit_attn_state_scan_args sc;
    memset(&sc, 0, sizeof sc);
    sc.struct_size = sizeof sc;
    sc.local_states = &ls;
    sc.lengths = &len;
    sc.incoming_states = &in;
    sc.final_state = &sum;
    sc.stream = c->stream;
    lajit_status st = lajit_attn_state_scan(ctx, &sc);
    if (st != LAJIT_OK) {
        lj_error_prefix(&ctx->env, "%s (rank %d, the sum of ds's parts): ", c->fn, r->rank);
        return st;
    }
    return copy_state(ctx, r, address(c->ds), r->ds_gather + 2 * r->ds_slot * (size_t)r->P,
                      (size_t)r->H * 4, "cuMemcpyDtoDAsync (ds)");
}

/* The device current, its driver in ctx->device.drv (cp_local reads it). */
static lajit_status device_ready(lajit_ctx *ctx, const char *fn)
{
    lj_device *dev;
    lajit_status st = lajit__ctx_device(ctx, &dev);
    if (st == LAJIT_OK)
        st = lj_device_make_current(&ctx->env, dev);
    if (st != LAJIT_OK)
        lj_error_prefix(&ctx->env, "%s: ", fn);
    return st;
}

/* ---- One rank's whole call ------------------------------------------------------------------ */

/* The steps of r's call in order, every exchange through gather. The simulated ranks run the
 * same steps phase by phase over all ranks (cp_run_sim). */
enum { CP_PHASES = 7 };

static lajit_status cp_phase(lajit_ctx *ctx, const cp_rank *r, int phase, cp_gather_fn gather,
                             void *user)
{
    const cp_call *c = &r->c;
    switch (phase) {
        case 0: return cp_local(ctx, r, 0);
        case 1: return gather(ctx, r, r->gather, r->slot, user);
        case 2: return c->bwd ? cp_bwd_incoming(ctx, r) : cp_fwd_outputs(ctx, r);
        case 3: /* the gradient exchange reuses the slots: the forward scan before it has read them */
            return c->bwd ? cp_local(ctx, r, 1) : LAJIT_OK;
        case 4: return c->bwd ? gather(ctx, r, r->gather, r->slot, user) : LAJIT_OK;
        case 5: return c->bwd ? cp_bwd_grads(ctx, r) : LAJIT_OK;
        default:
            if (!c->ds)
                return LAJIT_OK;
            lajit_status st = gather(ctx, r, r->ds_gather, r->ds_slot, user);
            return st == LAJIT_OK ? cp_ds_sum(ctx, r) : st;
    }
}

/* ---- The NCCL path -------------------------------------------------------------------------- */

typedef struct nccl_user {
    const lj_nccl *nccl;
    lj_nccl_comm comm;
} nccl_user;

/* The exchange as LASP-2 does it: one in-place all-gather of every rank's slot. */
static lajit_status nccl_gather(lajit_ctx *ctx, const cp_rank *r, CUdeviceptr base, size_t bytes,
                                void *user)
{
    const nccl_user *u = user;
    void *all = (void *)(uintptr_t)base;
    const void *mine = (const char *)all + (size_t)r->rank * bytes;
    lj_nccl_result nr = u->nccl->ncclAllGather(mine, all, bytes / 4, LJ_NCCL_FLOAT32, u->comm,
                                               (CUstream)r->c.stream);
    if (nr == LJ_NCCL_IN_PROGRESS) /* the kernels after it would not be ordered behind it */
        return lj_error(&ctx->env, LAJIT_ERR_NCCL,
                        "%s: ncclAllGather returned ncclInProgress: a non-blocking communicator; "
                        "use a blocking one",
                        r->c.fn);
    if (nr == LJ_NCCL_SUCCESS)
        return LAJIT_OK;
    char what[96];
    snprintf(what, sizeof what, "%s: ncclAllGather of the span %s", r->c.fn,
             base == r->gather ? "states" : "parts of ds");
    return lj_nccl_error(&ctx->env, u->nccl, nr, what);
}

/* The communicator's size, this rank and its device (which must be the context's), then the
 * rank's whole call. */
static lajit_status cp_run_nccl(lajit_ctx *ctx, const cp_call *c, void *comm)
{
    lj_env *env = &ctx->env;
    if (!comm)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: comm is NULL (an ncclComm_t of the ranks sharing the sequence)",
                        c->fn);
    lajit_status st;
    nccl_user u = {ctx->nccl_override, (lj_nccl_comm)comm};
    if (!u.nccl && (st = lj_nccl_load(env, &u.nccl)) != LAJIT_OK)
        return st;
    int P = 0, rank = -1, dev = -1;
    char what[96];
    lj_nccl_result nr = u.nccl->ncclCommCount(u.comm, &P);
    if (nr != LJ_NCCL_SUCCESS) {
        snprintf(what, sizeof what, "%s: ncclCommCount (is comm a live communicator?)", c->fn);
        return lj_nccl_error(env, u.nccl, nr, what);
    }
    if ((nr = u.nccl->ncclCommUserRank(u.comm, &rank)) != LJ_NCCL_SUCCESS) {
        snprintf(what, sizeof what, "%s: ncclCommUserRank", c->fn);
        return lj_nccl_error(env, u.nccl, nr, what);
    }
    if ((nr = u.nccl->ncclCommCuDevice(u.comm, &dev)) != LJ_NCCL_SUCCESS) {
        snprintf(what, sizeof what, "%s: ncclCommCuDevice", c->fn);
        return lj_nccl_error(env, u.nccl, nr, what);
    }
    if (P < 1 || rank < 0 || rank >= P)
        return lj_error(env, LAJIT_ERR_NCCL, "%s: the communicator says rank %d of %d", c->fn, rank,
                        P);
    if (dev != ctx->ordinal)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: the communicator's rank %d is on CUDA device %d, the context on %d",
                        c->fn, rank, dev, ctx->ordinal);
    cp_rank r;
    size_t bytes;
    CUdeviceptr base;
    if ((st = check_rank(env, c, rank, P, &r)) != LAJIT_OK)
        return st;
    if (!rank_bytes(&r, &bytes))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: %d ranks' states do not fit in memory", c->fn, P);
    if ((st = device_ready(ctx, c->fn)) != LAJIT_OK ||
        (st = workspace(ctx, bytes, &base)) != LAJIT_OK)
        return st;
    place(&r, base);
    for (int phase = 0; phase < CP_PHASES; phase++)
        if ((st = cp_phase(ctx, &r, phase, nccl_gather, &u)) != LAJIT_OK)
            return st;
    return LAJIT_OK;
}

LAJIT_API lajit_status lajit_cp_attn_fwd(lajit_ctx *ctx, const lajit_cp_attn_fwd_args *a)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lajit_status st = lj_check_args(&ctx->env, FN_FWD, a ? &a->struct_size : NULL, sizeof *a,
                                    a ? a->flags : 0, a ? a->scale : 0);
    if (st != LAJIT_OK)
        return st;
    const cp_call c = fwd_call(a);
    return cp_run_nccl(ctx, &c, a->comm);
}

LAJIT_API lajit_status lajit_cp_attn_bwd(lajit_ctx *ctx, const lajit_cp_attn_bwd_args *a)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lajit_status st = lj_check_args(&ctx->env, FN_BWD, a ? &a->struct_size : NULL, sizeof *a,
                                    a ? a->flags : 0, a ? a->scale : 0);
    if (st != LAJIT_OK)
        return st;
    const cp_call c = bwd_call(a);
    return cp_run_nccl(ctx, &c, a->comm);
}

/* ---- Simulated ranks (tests) ---------------------------------------------------------------- */

typedef struct sim_user {
    const cp_rank *ranks;
} sim_user;

/* The exchange with the other simulated ranks' buffers at hand: their own slots copied into r's
 * (each rank's region at the same offset in its buffer). */
static lajit_status sim_gather(lajit_ctx *ctx, const cp_rank *r, CUdeviceptr base, size_t bytes,
                               void *user)
{
    const sim_user *u = user;
    lj_env *env = &ctx->env;
    const CUdeviceptr region = base - r->gather;
    for (int j = 0; j < r->P; j++) {
        if (j == r->rank)
            continue;
        const CUdeviceptr off = region + (CUdeviceptr)j * bytes;
        CUresult cr = LJ_CU(env, ctx->device.drv, cuMemcpyDtoDAsync, r->gather + off,
                            u->ranks[j].gather + off, bytes, (CUstream)r->c.stream);
        if (cr != CUDA_SUCCESS)
            return drv_fail(ctx, &r->c, cr, "cuMemcpyDtoDAsync (the simulated exchange)");
    }
    return LAJIT_OK;
}

/* P simulated ranks' calls: every rank's buffer in the context's workspace, then each phase for
 * every rank in rank order (on one stream, so an exchange's copies follow every rank's writes
 * of the phase before). */
static lajit_status cp_run_sim(lajit_ctx *ctx, int P, const cp_call *calls)
{
    lj_env *env = &ctx->env;
    const char *fn = calls[0].fn;
    cp_rank *r = lj_calloc(env, (size_t)P, sizeof *r);
    if (!r)
        return lj_oom(env);
    lajit_status st = LAJIT_OK;
    size_t each = 0, total = 0;
    for (int j = 0; j < P && st == LAJIT_OK; j++) {
        if ((st = check_rank(env, &calls[j], j, P, &r[j])) != LAJIT_OK)
            lj_error_prefix(env, "rank %d: ", j);
        else if (j > 0 && (r[j].B != r[0].B || r[j].H != r[0].H || r[j].D != r[0].D ||
                           r[j].E != r[0].E || r[j].vk != r[0].vk))
            st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                          "%s (simulated): rank %d's B, H, D, E or flags differ from rank 0's", fn,
                          j);
        else if (calls[j].stream != calls[0].stream)
            st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                          "%s (simulated): every rank must use one stream", fn);
        else if ((calls[j].ds != NULL) != (calls[0].ds != NULL))
            st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                          "%s (simulated): ds is given by some ranks and not others", fn);
    }
    if (st == LAJIT_OK &&
        (!rank_bytes(&r[0], &each) || __builtin_mul_overflow(round16(each), (size_t)P, &total)))
        st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                      "%s (simulated): %d ranks' states do not fit in memory", fn, P);
    CUdeviceptr base = 0;
    if (st == LAJIT_OK && (st = device_ready(ctx, fn)) == LAJIT_OK)
        st = workspace(ctx, total, &base);
    for (int j = 0; j < P && st == LAJIT_OK; j++)
        place(&r[j], base + (CUdeviceptr)j * round16(each));
    sim_user u = {r};
    for (int phase = 0; phase < CP_PHASES && st == LAJIT_OK; phase++) {
        /* The forward's scan and outputs follow each rank's own copies (as a rank's stream
         * orders them): phases 1 and 2 run per rank together, as the earlier version did. */
        if (phase == 2 && !calls[0].bwd)
            continue;
        for (int j = 0; j < P && st == LAJIT_OK; j++) {
            st = cp_phase(ctx, &r[j], phase, sim_gather, &u);
            if (st == LAJIT_OK && phase == 1 && !calls[0].bwd)
                st = cp_phase(ctx, &r[j], 2, sim_gather, &u);
        }
    }
    lj_free(env, r);
    return st;
}

static lajit_status sim_args(lajit_ctx *ctx, int P, const void *ranks, const char *fn)
{
    if (P < 1 || P > 1024 || !ranks)
        return lj_error(&ctx->env, LAJIT_ERR_INVALID_ARGUMENT, "%s (simulated): P = %d ranks", fn,
                        P);
    return LAJIT_OK;
}

lajit_status lajit__cp_attn_fwd_sim(lajit_ctx *ctx, int P, const lajit_cp_attn_fwd_args *ranks)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lajit_status st = sim_args(ctx, P, ranks, FN_FWD);
    cp_call *c = st == LAJIT_OK ? lj_calloc(&ctx->env, (size_t)P, sizeof *c) : NULL;
    if (st == LAJIT_OK && !c)
        st = lj_oom(&ctx->env);
    for (int j = 0; j < P && st == LAJIT_OK; j++)
        if ((st = lj_check_args(&ctx->env, FN_FWD, &ranks[j].struct_size, sizeof ranks[j],
                                ranks[j].flags, ranks[j].scale)) == LAJIT_OK)
            c[j] = fwd_call(&ranks[j]);
    if (st == LAJIT_OK)
        st = cp_run_sim(ctx, P, c);
    lj_free(&ctx->env, c);
    return st;
}

lajit_status lajit__cp_attn_bwd_sim(lajit_ctx *ctx, int P, const lajit_cp_attn_bwd_args *ranks)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lajit_status st = sim_args(ctx, P, ranks, FN_BWD);
    cp_call *c = st == LAJIT_OK ? lj_calloc(&ctx->env, (size_t)P, sizeof *c) : NULL;
    if (st == LAJIT_OK && !c)
        st = lj_oom(&ctx->env);
    for (int j = 0; j < P && st == LAJIT_OK; j++)
        if ((st = lj_check_args(&ctx->env, FN_BWD, &ranks[j].struct_size, sizeof ranks[j],
                                ranks[j].flags, ranks[j].scale)) == LAJIT_OK)
            c[j] = bwd_call(&ranks[j]);
    if (st == LAJIT_OK)
        st = cp_run_sim(ctx, P, c);
    lj_free(&ctx->env, c);
    return st;
}
