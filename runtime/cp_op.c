/* cp_op.c — lajit_cp_attn_fwd: the forward of context parallelism (include/lajit.h has the
 * mathematics), one sequence's tokens spread over the ranks of an NCCL communicator.
 *
 * A rank's call is three pieces, the middle one behind a function pointer:
 *   cp_local     (a) the span's local state into this rank's slot of the exchange buffer, and
 *                    the span's length n_r beside it (two 32-bit memsets: no host copy);
 *   cp_gather_fn (b) the exchange: every rank's slot into every rank's buffer. nccl_gather is an
 *                    in-place ncclAllGather (LASP-2's exchange); the tests' sim_gather copies
 *                    the other simulated ranks' slots with cuMemcpyDtoDAsync. The log2(P)-step
 *                    point-to-point scan (issue 17's "exchange that scales") is to be a third
 *                    function here, producing this rank's incoming state instead of P slots;
 *   cp_finish    (c) the state scan over the P gathered slots, (d) the outputs from the
 *                    incoming state, both through the public ops (lajit_attn_state_scan,
 *                    lajit_attn_fwd), so their checks, plans and hot path are the ones used.
 *
 * The exchange buffer of one rank is P slots of `slot` bytes: the [B,H,D,E] float32 state
 * (padded to 16 bytes), then n_r as an int64 (and 8 bytes of padding), so one all-gather of
 * slot/4 floats moves states and lengths together; the scan reads the states as a [P,B,H,D,E]
 * view of stride slot/4 and the lengths as an int64 [P] view of stride slot/8. The incoming
 * states follow, [P,B,H,D,E]. The buffer is the context's (grow-only, like the backward's ds
 * workspace): after the first call of a shape nothing is allocated and no call synchronises. */
#include <string.h>

#include "cp_op.h"
#include "op_args.h"

#define FN "lajit_cp_attn_fwd"

/* One rank's call: its arguments, its place and the sizes every rank must share. */
typedef struct cp_rank {
    const lajit_cp_attn_fwd_args *a;
    int rank, P, vk;
    int64_t B, H, N, D, E; /* N: this rank's n_r */
    size_t state_bytes;    /* B·H·D·E·4 */
    size_t slot;           /* bytes per rank in the exchange buffer */
    size_t len_off;        /* the length's offset inside a slot */
    CUdeviceptr gather;    /* [P][slot] */
    CUdeviceptr incoming;  /* [P,B,H,D,E] float32 */
} cp_rank;

/* (b): fills r->gather's P slots from every rank's own slot (r->gather + rank·slot). */
typedef lajit_status (*cp_gather_fn)(lajit_ctx *ctx, const cp_rank *r, void *user);

static const DLDataType F32 = {kDLFloat, 32, 1};
static const DLDataType I64 = {kDLInt, 64, 1};

static size_t round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* ---- Argument checks ------------------------------------------------------------------------ */

/* q, k [B,H,n,D], v, o [B,H,n,E]: rank 4, the same B, H, n; q's D is k's, o's E is v's. n may be
 * 0 (an empty span); everything else at least 1. What lajit_attn_fwd checks on top (dtype,
 * strides, device, aliasing) it checks when it runs. */
static lajit_status check_seqs(lj_env *env, const lajit_cp_attn_fwd_args *a, cp_rank *r)
{
    const DLTensor *t[4] = {a->q, a->k, a->v, a->o};
    static const char *const names[4] = {"q", "k", "v", "o"};
    for (int i = 0; i < 4; i++) {
        if (!t[i])
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, FN ": q, k, v and o are required");
        if (!t[i]->shape || t[i]->ndim != 4)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            FN
                            ": %s must be [B, H, N, %c] (this rank's span); it has %d dimensions",
                            names[i], i < 2 ? 'D' : 'E', t[i]->shape ? t[i]->ndim : 0);
        for (int d = 0; d < 4; d++)
            if (t[i]->shape[d] < (d == 2 ? 0 : 1))
                return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                                FN ": %s has size %lld in dimension %d", names[i],
                                (long long)t[i]->shape[d], d);
    }
    r->B = a->k->shape[0];
    r->H = a->k->shape[1];
    r->N = a->k->shape[2];
    r->D = a->k->shape[3];
    r->E = a->v->shape[3];
    for (int i = 0; i < 4; i++) {
        const int64_t *s = t[i]->shape;
        int64_t w = i < 2 ? r->D : r->E;
        if (s[0] != r->B || s[1] != r->H || s[2] != r->N || s[3] != w)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            FN ": %s is [%lld, %lld, %lld, %lld]; k and v make it [%lld, %lld, "
                               "%lld, %lld] (B, H, this rank's N, %c)",
                            names[i], (long long)s[0], (long long)s[1], (long long)s[2],
                            (long long)s[3], (long long)r->B, (long long)r->H, (long long)r->N,
                            (long long)w, i < 2 ? 'D' : 'E');
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
                        FN ": %s must be [B, H, %s] = [%lld, %lld, %lld, %lld]", name,
                        r->vk ? "E, D" : "D, E", (long long)want[0], (long long)want[1],
                        (long long)want[2], (long long)want[3]);
    if (!lj_tensor_elem(t->dtype, &e) || e != LJ_ELEM_F32)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        FN ": %s is %s; context parallelism keeps states in float32", name,
                        lj_tensor_dtype_name(t->dtype));
    return LAJIT_OK;
}

/* Everything one rank's call can check alone; fills r's sizes and layout (not its buffers). */
static lajit_status check_rank(lj_env *env, const lajit_cp_attn_fwd_args *a, int rank, int P,
                               cp_rank *r)
{
    lajit_status st = lj_check_args(env, FN, a ? &a->struct_size : NULL, sizeof *a,
                                    a ? a->flags : 0, a ? a->scale : 0);
    if (st != LAJIT_OK)
        return st;
    if (a->cu_seqlens)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        FN ": cu_seqlens must be NULL: a varlen batch across ranks is not "
                           "supported yet (each rank holds a span of every sequence of a "
                           "[B, H, N, D] batch)");
    memset(r, 0, sizeof *r);
    r->a = a;
    r->rank = rank;
    r->P = P;
    r->vk = (a->flags & LAJIT_STATE_VK) != 0;
    if ((st = check_seqs(env, a, r)) != LAJIT_OK)
        return st;
    if (rank == 0 && a->initial_state &&
        (st = check_state(env, "initial_state", a->initial_state, r)) != LAJIT_OK)
        return st;
    if (a->final_state && (st = check_state(env, "final_state", a->final_state, r)) != LAJIT_OK)
        return st;
    size_t n;
    if (__builtin_mul_overflow((size_t)r->B * (size_t)r->H, (size_t)r->D * (size_t)r->E, &n) ||
        __builtin_mul_overflow(n, (size_t)4, &r->state_bytes) || r->state_bytes > ((size_t)1 << 40))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        FN ": the state of B = %lld, H = %lld, D = %lld, E = %lld is too large",
                        (long long)r->B, (long long)r->H, (long long)r->D, (long long)r->E);
    r->len_off = round16(r->state_bytes);
    r->slot = r->len_off + 16;
    return LAJIT_OK;
}

/* One rank's exchange buffer and incoming states, in bytes. */
static int rank_bytes(const cp_rank *r, size_t *out)
{
    size_t a, b;
    return !__builtin_mul_overflow(r->slot, (size_t)r->P, &a) &&
           !__builtin_mul_overflow(r->state_bytes, (size_t)r->P, &b) &&
           !__builtin_add_overflow(round16(a), round16(b), out);
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

/* (a): M_r (rank 0: its final state from S_0) and n_r into this rank's slot. */
static lajit_status cp_local(lajit_ctx *ctx, const cp_rank *r)
{
    lj_env *env = &ctx->env;
    const lajit_cp_attn_fwd_args *a = r->a;
    const lj_driver *drv = ctx->device.drv;
    const CUdeviceptr mine = r->gather + (CUdeviceptr)r->rank * r->slot;
    const CUstream stream = (CUstream)a->stream;
    const DLTensor *s0 = r->rank == 0 ? a->initial_state : NULL;
    const uint64_t n = (uint64_t)r->N;
    CUresult cr = LJ_CU(env, drv, cuMemsetD32Async, mine + r->len_off, (unsigned)(n & 0xffffffffu),
                        1, stream);
    if (cr == CUDA_SUCCESS)
        cr = LJ_CU(env, drv, cuMemsetD32Async, mine + r->len_off + 4, (unsigned)(n >> 32), 1,
                   stream);
    if (cr != CUDA_SUCCESS)
        return lj_driver_error(env, drv, cr, FN ": cuMemsetD32Async (the span's length)");
    if (r->N > 0) {
        int64_t shape[4];
        DLTensor m;
        lajit_attn_fwd_args f;
        memset(&f, 0, sizeof f);
        f.struct_size = sizeof f;
        f.k = a->k;
        f.v = a->v;
        f.s = a->s;
        f.scale = a->scale;
        f.initial_state = s0;
        f.final_state = state_view(&m, shape, r, mine, 0, ctx->ordinal);
        f.flags = a->flags;
        f.stream = a->stream;
        lajit_status st = lajit_attn_fwd(ctx, &f);
        if (st != LAJIT_OK)
            lj_error_prefix(env, FN " (rank %d, its span's local state): ", r->rank);
        return st;
    }
    if (!s0) { /* an empty span: M = 0 */
        cr = LJ_CU(env, drv, cuMemsetD32Async, mine, 0u, r->state_bytes / 4, stream);
        return cr == CUDA_SUCCESS
                   ? LAJIT_OK
                   : lj_driver_error(env, drv, cr, FN ": cuMemsetD32Async (an empty span's state)");
    }
    /* Rank 0 with no tokens passes S_0 on as it is. */
    const int64_t *st = s0->strides, *sh = s0->shape;
    if (st && !(st[3] == 1 && st[2] == sh[3] && st[1] == sh[2] * sh[3] && st[0] == sh[1] * st[1]))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        FN ": rank 0 has no tokens, so initial_state is copied into the exchange "
                           "as it is: it must be contiguous");
    cr = LJ_CU(env, drv, cuMemcpyDtoDAsync, mine,
               (CUdeviceptr)(uintptr_t)s0->data + s0->byte_offset, r->state_bytes, stream);
    return cr == CUDA_SUCCESS ? LAJIT_OK
                              : lj_driver_error(env, drv, cr, FN ": cuMemcpyDtoDAsync (S_0)");
}

/* (c) and (d): the incoming state from the gathered slots, then the span's outputs. */
static lajit_status cp_finish(lajit_ctx *ctx, const cp_rank *r)
{
    lj_env *env = &ctx->env;
    const lajit_cp_attn_fwd_args *a = r->a;
    lajit_status st;
    int64_t in_shape[4];
    DLTensor in_state;
    const DLTensor *incoming = r->rank == 0 ? a->initial_state : NULL;
    if (r->rank > 0 || a->final_state) {
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
        in.data = (void *)(uintptr_t)r->incoming;
        in.strides = NULL;
        lajit_attn_state_scan_args sc;
        memset(&sc, 0, sizeof sc);
        sc.struct_size = sizeof sc;
        sc.local_states = &ls;
        sc.lengths = &len;
        sc.s = a->s;
        sc.incoming_states = &in;
        sc.final_state = a->final_state;
        sc.flags = a->flags & LAJIT_STATE_VK;
        sc.stream = a->stream;
        if ((st = lajit_attn_state_scan(ctx, &sc)) != LAJIT_OK) {
            lj_error_prefix(env, FN " (rank %d, the scan of the gathered states): ", r->rank);
            return st;
        }
        if (r->rank > 0)
            incoming = state_view(&in_state, in_shape, r, r->incoming,
                                  (size_t)r->rank * r->state_bytes, ctx->ordinal);
    }
    if (r->N == 0)
        return LAJIT_OK;
    lajit_attn_fwd_args f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.q = a->q;
    f.k = a->k;
    f.v = a->v;
    f.o = a->o;
    f.s = a->s;
    f.scale = a->scale;
    f.initial_state = incoming;
    f.flags = a->flags;
    f.stream = a->stream;
    if ((st = lajit_attn_fwd(ctx, &f)) != LAJIT_OK)
        lj_error_prefix(env, FN " (rank %d, its span's outputs): ", r->rank);
    return st;
}

/* The device current, its driver in ctx->device.drv (cp_local reads it). */
static lajit_status device_ready(lajit_ctx *ctx)
{
    lj_device *dev;
    lajit_status st = lajit__ctx_device(ctx, &dev);
    if (st == LAJIT_OK)
        st = lj_device_make_current(&ctx->env, dev);
    if (st != LAJIT_OK)
        lj_error_prefix(&ctx->env, FN ": ");
    return st;
}

/* ---- The NCCL path -------------------------------------------------------------------------- */

typedef struct nccl_user {
    const lj_nccl *nccl;
    lj_nccl_comm comm;
} nccl_user;

/* (b) as LASP-2 does it: one in-place all-gather of every rank's slot. */
static lajit_status nccl_gather(lajit_ctx *ctx, const cp_rank *r, void *user)
{
    const nccl_user *u = user;
    void *all = (void *)(uintptr_t)r->gather;
    const void *mine = (const char *)all + (size_t)r->rank * r->slot;
    lj_nccl_result nr = u->nccl->ncclAllGather(mine, all, r->slot / 4, LJ_NCCL_FLOAT32, u->comm,
                                               (CUstream)r->a->stream);
    if (nr == LJ_NCCL_IN_PROGRESS) /* the kernels after it would not be ordered behind it */
        return lj_error(&ctx->env, LAJIT_ERR_NCCL,
                        FN ": ncclAllGather returned ncclInProgress: a non-blocking communicator; "
                           "use a blocking one");
    return nr == LJ_NCCL_SUCCESS
               ? LAJIT_OK
               : lj_nccl_error(&ctx->env, u->nccl, nr, FN ": ncclAllGather of the span states");
}

LAJIT_API lajit_status lajit_cp_attn_fwd(lajit_ctx *ctx, const lajit_cp_attn_fwd_args *a)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lj_env *env = &ctx->env;
    lajit_status st = lj_check_args(env, FN, a ? &a->struct_size : NULL, sizeof *a,
                                    a ? a->flags : 0, a ? a->scale : 0);
    if (st != LAJIT_OK)
        return st;
    if (!a->comm)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        FN ": comm is NULL (an ncclComm_t of the ranks sharing the sequence)");
    nccl_user u = {ctx->nccl_override, (lj_nccl_comm)a->comm};
    if (!u.nccl && (st = lj_nccl_load(env, &u.nccl)) != LAJIT_OK)
        return st;
    int P = 0, rank = -1, dev = -1;
    lj_nccl_result nr = u.nccl->ncclCommCount(u.comm, &P);
    if (nr != LJ_NCCL_SUCCESS)
        return lj_nccl_error(env, u.nccl, nr, FN ": ncclCommCount (is comm a live communicator?)");
    if ((nr = u.nccl->ncclCommUserRank(u.comm, &rank)) != LJ_NCCL_SUCCESS)
        return lj_nccl_error(env, u.nccl, nr, FN ": ncclCommUserRank");
    if ((nr = u.nccl->ncclCommCuDevice(u.comm, &dev)) != LJ_NCCL_SUCCESS)
        return lj_nccl_error(env, u.nccl, nr, FN ": ncclCommCuDevice");
    if (P < 1 || rank < 0 || rank >= P)
        return lj_error(env, LAJIT_ERR_NCCL, FN ": the communicator says rank %d of %d", rank, P);
    if (dev != ctx->ordinal)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        FN ": the communicator's rank %d is on CUDA device %d, the context on %d",
                        rank, dev, ctx->ordinal);
    cp_rank r;
    size_t bytes;
    if ((st = check_rank(env, a, rank, P, &r)) != LAJIT_OK)
        return st;
    if (!rank_bytes(&r, &bytes))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        FN ": %d ranks' states do not fit in memory", P);
    if ((st = device_ready(ctx)) != LAJIT_OK || (st = workspace(ctx, bytes, &r.gather)) != LAJIT_OK)
        return st;
    r.incoming = r.gather + round16(r.slot * (size_t)P);
    const cp_gather_fn gather = nccl_gather;
    if ((st = cp_local(ctx, &r)) != LAJIT_OK || (st = gather(ctx, &r, &u)) != LAJIT_OK)
        return st;
    return cp_finish(ctx, &r);
}

/* ---- Simulated ranks (tests) ---------------------------------------------------------------- */

typedef struct sim_user {
    const cp_rank *ranks;
} sim_user;

/* (b) with the other simulated ranks' buffers at hand: their own slots copied into r's. */
static lajit_status sim_gather(lajit_ctx *ctx, const cp_rank *r, void *user)
{
    const sim_user *u = user;
    lj_env *env = &ctx->env;
    for (int j = 0; j < r->P; j++) {
        if (j == r->rank)
            continue;
        const CUdeviceptr off = (CUdeviceptr)j * r->slot;
        CUresult cr = LJ_CU(env, ctx->device.drv, cuMemcpyDtoDAsync, r->gather + off,
                            u->ranks[j].gather + off, r->slot, (CUstream)r->a->stream);
        if (cr != CUDA_SUCCESS)
            return lj_driver_error(env, ctx->device.drv, cr,
                                   FN " (simulated exchange): cuMemcpyDtoDAsync");
    }
    return LAJIT_OK;
}

lajit_status lajit__cp_attn_fwd_sim(lajit_ctx *ctx, int P, const lajit_cp_attn_fwd_args *ranks)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lj_env *env = &ctx->env;
    if (P < 1 || P > 1024 || !ranks)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, FN " (simulated): P = %d ranks", P);
    cp_rank *r = lj_calloc(env, (size_t)P, sizeof *r);
    if (!r)
        return lj_oom(env);
    lajit_status st = LAJIT_OK;
    size_t each = 0, total = 0;
    for (int j = 0; j < P && st == LAJIT_OK; j++) {
        if ((st = check_rank(env, &ranks[j], j, P, &r[j])) != LAJIT_OK)
            lj_error_prefix(env, "rank %d: ", j);
        else if (j > 0 && (r[j].B != r[0].B || r[j].H != r[0].H || r[j].D != r[0].D ||
                           r[j].E != r[0].E || r[j].vk != r[0].vk))
            st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                          FN " (simulated): rank %d's B, H, D, E or flags differ from rank 0's", j);
        else if (ranks[j].stream != ranks[0].stream)
            st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                          FN " (simulated): every rank must use one stream");
    }
    if (st == LAJIT_OK &&
        (!rank_bytes(&r[0], &each) || __builtin_mul_overflow(round16(each), (size_t)P, &total)))
        st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                      FN " (simulated): %d ranks' states do not fit in memory", P);
    CUdeviceptr base = 0;
    if (st == LAJIT_OK && (st = device_ready(ctx)) == LAJIT_OK)
        st = workspace(ctx, total, &base);
    for (int j = 0; j < P && st == LAJIT_OK; j++) {
        r[j].gather = base + (CUdeviceptr)j * round16(each);
        r[j].incoming = r[j].gather + round16(r[j].slot * (size_t)P);
    }
    for (int j = 0; j < P && st == LAJIT_OK; j++)
        st = cp_local(ctx, &r[j]);
    sim_user u = {r};
    const cp_gather_fn gather = sim_gather;
    for (int j = 0; j < P && st == LAJIT_OK; j++)
        if ((st = gather(ctx, &r[j], &u)) == LAJIT_OK)
            st = cp_finish(ctx, &r[j]);
    lj_free(env, r);
    return st;
}
