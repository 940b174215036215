/* cp_op.c — context parallelism (include/lajit.h has the mathematics): one sequence's tokens
 * spread over the ranks of an NCCL communicator, forward (lajit_cp_attn_fwd) and backward
 * (lajit_cp_attn_bwd). A rank's call is a short program of steps:
 *   local     the span's carry into this rank's exchange slot with its length n_r beside it
 *             (two 32-bit memsets: no host copy): forward, its local state M_r (rank 0 from S_0);
 *             gradient, its local gradient state Mg_r (the last rank from dS_N);
 *   exchange  the carries of all ranks turned into the carry entering this rank's span, in
 *             rounds (cp_exchange.c: an all-gather and a scan, or the log2(P)-step scan);
 *   outputs   forward: the span's outputs from its incoming state; backward: its gradients from
 *             its incoming state and the gradient reaching its end;
 *   ds        backward with ds: every rank's part exchanged and summed in rank order.
 * The forward can hand the state entering the span to the caller (incoming_state); a backward
 * given it back skips the forward direction's local and exchange steps.
 * Every kernel runs through the public ops (lajit_attn_fwd, lajit_attn_bwd, the state scan), so
 * their checks, plans and hot path are the ones used. The buffer is the context's (grow-only,
 * like the backward's ds workspace): after the first call of a shape nothing is allocated and no
 * call synchronises. The simulated ranks (tests) run the same program with each exchange round's
 * transfers done for every rank before any rank computes. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cp.h"
#include "cp_op.h"
#include "op_args.h"

#define FN_FWD "lajit_cp_attn_fwd"
#define FN_BWD "lajit_cp_attn_bwd"

static const DLDataType F32 = {kDLFloat, 32, 1};

/* The exchange the flags force: 0 the all-gather, 1 the log-step scan, −1 the choice by P. */
static int exchange_choice(uint32_t flags)
{
    return (flags & LAJIT_CP_LOGSTEP) ? 1 : (flags & LAJIT_CP_ALLGATHER) ? 0 : -1;
}

/* lj_check_args with the context-parallel flags taken out (both at once: refused). A struct_size
 * of `before` (the struct as it was before incoming_state was added) is accepted too. */
static lajit_status check_args(lj_env *env, const char *fn, const size_t *struct_size,
                               size_t expected, size_t before, uint32_t flags, float scale)
{
    const uint32_t both = LAJIT_CP_ALLGATHER | LAJIT_CP_LOGSTEP;
    const uint32_t cp = both | LAJIT_CP_CONTINUES_IN | LAJIT_CP_CONTINUES_OUT;
    if (struct_size && (flags & both) == both)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: LAJIT_CP_ALLGATHER and LAJIT_CP_LOGSTEP are exclusive", fn);
    if (struct_size && *struct_size == before)
        expected = before;
    return lj_check_args(env, fn, struct_size, expected, flags & ~cp, scale);
}

#define FWD_BEFORE offsetof(lajit_cp_attn_fwd_args, incoming_state)
#define BWD_BEFORE offsetof(lajit_cp_attn_bwd_args, incoming_state)

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
    c.save_incoming = a->struct_size > FWD_BEFORE ? a->incoming_state : NULL;
    c.cu_seqlens = a->cu_seqlens;
    c.state_slots = a->state_slots;
    c.cont_in = (a->flags & LAJIT_CP_CONTINUES_IN) != 0;
    c.cont_out = (a->flags & LAJIT_CP_CONTINUES_OUT) != 0;
    c.flags = a->flags & LAJIT_STATE_VK;
    c.logstep = exchange_choice(a->flags);
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
    c.saved_incoming = a->struct_size > BWD_BEFORE ? a->incoming_state : NULL;
    c.cu_seqlens = a->cu_seqlens;
    c.state_slots = a->state_slots;
    c.cont_in = (a->flags & LAJIT_CP_CONTINUES_IN) != 0;
    c.cont_out = (a->flags & LAJIT_CP_CONTINUES_OUT) != 0;
    c.flags = a->flags & LAJIT_STATE_VK;
    c.logstep = exchange_choice(a->flags);
    c.stream = a->stream;
    return c;
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

/* The op arguments a rank's local call starts from (cp.h). */
void lj_cp_fwd_args(const cp_call *c, lajit_attn_fwd_args *f)
{
    memset(f, 0, sizeof *f);
    f->struct_size = sizeof *f;
    f->q = c->q;
    f->k = c->k;
    f->v = c->v;
    f->o = c->o;
    f->s = c->s;
    f->scale = c->scale;
    f->flags = c->flags;
    f->stream = c->stream;
}

void lj_cp_bwd_args(const cp_call *c, lajit_attn_bwd_args *b)
{
    memset(b, 0, sizeof *b);
    b->struct_size = sizeof *b;
    b->q = c->q;
    b->k = c->k;
    b->v = c->v;
    b->dout = c->dout;
    b->dq = c->dq;
    b->dk = c->dk;
    b->dv = c->dv;
    b->s = c->s;
    b->scale = c->scale;
    b->flags = c->flags;
    b->stream = c->stream;
}

/* Everything one rank's call can check alone; fills r's sizes and layout (not its buffers).
 * ordinal: the context's device. */
static lajit_status check_rank(lj_env *env, const cp_call *c, int rank, int P, int ordinal,
                               cp_rank *r)
{
    memset(r, 0, sizeof *r);
    r->c = *c;
    r->rank = rank;
    r->P = P;
    r->vk = (c->flags & LAJIT_STATE_VK) != 0;
    if (r->c.logstep < 0)
        r->c.logstep = P > LJ_CP_ALLGATHER_MAX_P;
    lajit_status st;
    if (!c->cu_seqlens && (c->cont_in || c->cont_out || c->state_slots))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: state_slots and LAJIT_CP_CONTINUES_IN/_OUT are for varlen calls "
                        "(cu_seqlens)",
                        c->fn);
    if (c->cu_seqlens) { /* the pieces and the pools (cp_varlen.c) */
        if ((st = lj_cp_varlen_check(env, r)) != LAJIT_OK)
            return st;
    } else if ((st = check_seqs(env, r)) != LAJIT_OK ||
               (rank == 0 && c->initial_state &&
                (st = check_state(env, "initial_state", c->initial_state, r)) != LAJIT_OK) ||
               (c->final_state &&
                (st = check_state(env, "final_state", c->final_state, r)) != LAJIT_OK) ||
               (rank == 0 && c->d_initial_state &&
                (st = check_state(env, "d_initial_state", c->d_initial_state, r)) != LAJIT_OK) ||
               (rank == P - 1 && c->d_final_state &&
                (st = check_state(env, "d_final_state", c->d_final_state, r)) != LAJIT_OK)) {
        return st;
    }
    if (c->ds) {
        lj_elem e;
        if (!c->s)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: ds (the gradient of s) needs s",
                            c->fn);
        if (!c->ds->shape || c->ds->ndim != 1 || c->ds->shape[0] != r->H ||
            !lj_tensor_elem(c->ds->dtype, &e) || e != LJ_ELEM_F32 || !lj_tensor_compact(c->ds))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: ds must be float32 [H] = [%lld], contiguous", c->fn,
                            (long long)r->H);
    }
    const DLTensor *in = c->bwd ? c->saved_incoming : c->save_incoming;
    if (in && (st = check_state(env, "incoming_state", in, r)) != LAJIT_OK)
        return st;
    if (in && !lj_tensor_compact(in))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: incoming_state must be contiguous",
                        c->fn);
    /* Used by address (copied into or out of), not through an op that would check it. */
    if (in && (!in->data ||
               (in->device.device_type != kDLCUDA && in->device.device_type != kDLCUDAManaged)))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: incoming_state must be CUDA device memory (device_type %d, data %s)",
                        c->fn, (int)in->device.device_type, in->data ? "given" : "NULL");
    if (in && (st = lj_tensor_check_device(env, "incoming_state", in, ordinal)) != LAJIT_OK)
        return st;
    size_t n;
    if (__builtin_mul_overflow((size_t)r->B * (size_t)r->H, (size_t)r->D * (size_t)r->E, &n) ||
        __builtin_mul_overflow(n, (size_t)4, &r->state_bytes) || r->state_bytes > ((size_t)1 << 40))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: the state of B = %lld, H = %lld, D = %lld, E = %lld is too large",
                        c->fn, (long long)r->B, (long long)r->H, (long long)r->D, (long long)r->E);
    r->len_off = lj_round16(r->state_bytes);
    r->slot = r->len_off + 16;
    r->ds_slot = lj_round16((size_t)r->H * 4);
    r->piece_state = r->state_bytes; /* varlen: B = 1, one piece's state */
    return LAJIT_OK;
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

DLTensor *lj_cp_states(DLTensor *t, int64_t shape[5], const cp_rank *r, CUdeviceptr p, int64_t n,
                       int ordinal)
{
    int i = 0;
    if (n)
        shape[i++] = n;
    shape[i++] = r->B;
    shape[i++] = r->H;
    shape[i++] = r->vk ? r->E : r->D;
    shape[i++] = r->vk ? r->D : r->E;
    return lj_device_view(t, p, ordinal, i, shape, NULL, F32);
}

/* A device copy of a compact tensor's bytes (S_0 or dS_N into the exchange, H_0 out to dS_0). */
static lajit_status copy_state(lajit_ctx *ctx, const cp_rank *r, CUdeviceptr dst, CUdeviceptr src,
                               size_t bytes, const char *what)
{
    CUresult cr = LJ_CU(&ctx->env, ctx->device.drv, cuMemcpyDtoDAsync, dst, src, bytes,
                        (CUstream)r->c.stream);
    return cr == CUDA_SUCCESS ? LAJIT_OK : lj_cp_driver_fail(ctx, &r->c, cr, what);
}

/* The carry of this rank's span and n_r into its slot. Forward (grad = 0): M_r, rank 0's from
 * S_0 (its final state). Gradient (grad = 1): Mg_r, the last rank's from dS_N (its dS_0). */
static lajit_status cp_local(lajit_ctx *ctx, const cp_rank *r, int grad)
{
    lj_env *env = &ctx->env;
    const cp_call *c = &r->c;
    const lj_driver *drv = ctx->device.drv;
    const CUdeviceptr mine = r->carry;
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
        return lj_cp_driver_fail(ctx, c, cr, "cuMemsetD32Async (the span's length)");
    if (!grad && r->seg_n) /* by segments (cp_segments.c) */
        return lj_cp_segments_local(ctx, r);
    if (r->N > 0) {
        int64_t shape[5];
        DLTensor m;
        lajit_status st;
        if (!grad) {
            lajit_attn_fwd_args f;
            lj_cp_fwd_args(c, &f);
            f.q = NULL; /* the local state alone: k and v */
            f.o = NULL;
            f.initial_state = carry_in;
            f.final_state = lj_cp_states(&m, shape, r, mine, 0, ctx->ordinal);
            st = lajit_attn_fwd(ctx, &f);
        } else {
            lajit_attn_bwd_args b;
            lj_cp_bwd_args(c, &b);
            b.k = b.v = NULL; /* the local gradient state alone: q and dout */
            b.dq = b.dk = b.dv = NULL;
            b.d_final_state = carry_in;
            b.d_initial_state = lj_cp_states(&m, shape, r, mine, 0, ctx->ordinal);
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
                   : lj_cp_driver_fail(ctx, c, cr, "cuMemsetD32Async (an empty span's state)");
    }
    /* An end rank with no tokens passes its carry (S_0, or dS_N) on as it is. */
    if (!lj_tensor_compact(carry_in))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: rank %d has no tokens, so %s is copied into the exchange as it is: it "
                        "must be contiguous",
                        c->fn, r->rank, grad ? "d_final_state" : "initial_state");
    return copy_state(ctx, r, mine, lj_tensor_address(carry_in), r->state_bytes,
                      grad ? "cuMemcpyDtoDAsync (dS_N)" : "cuMemcpyDtoDAsync (S_0)");
}

/* The state entering r's span in direction grad: what the exchange computed, or for the first
 * rank in walk order what it holds (S_0 on rank 0, dS_N on the last; NULL: zero). */
static const DLTensor *incoming_state(lajit_ctx *ctx, const cp_rank *r, int grad, DLTensor *t,
                                      int64_t shape[5])
{
    if (!grad && r->rank == 0)
        return r->c.initial_state;
    if (grad && r->rank == r->P - 1)
        return r->c.d_final_state;
    return lj_cp_states(t, shape, r, grad ? lj_cp_incoming(r, 1) : lj_cp_entering(r), 0,
                        ctx->ordinal);
}

/* Forward: S_{a_r} out to the caller's incoming_state, where one comes from another rank. */
static lajit_status cp_save_incoming(lajit_ctx *ctx, const cp_rank *r)
{
    if (!r->c.save_incoming || !lj_cp_receives(r))
        return LAJIT_OK;
    return copy_state(ctx, r, lj_tensor_address(r->c.save_incoming), lj_cp_incoming(r, 0),
                      r->state_bytes, "cuMemcpyDtoDAsync (incoming_state)");
}

/* Forward: the span's outputs from its incoming state. */
static lajit_status cp_fwd_outputs(lajit_ctx *ctx, const cp_rank *r)
{
    const cp_call *c = &r->c;
    if (r->N == 0)
        return LAJIT_OK;
    if (r->seg_n) /* by segments (cp_segments.c) */
        return lj_cp_segments_outputs(ctx, r);
    int64_t in_shape[5];
    DLTensor in_state;
    lajit_attn_fwd_args f;
    lj_cp_fwd_args(c, &f);
    f.initial_state = incoming_state(ctx, r, 0, &in_state, in_shape);
    lajit_status st = lajit_attn_fwd(ctx, &f);
    if (st != LAJIT_OK)
        lj_error_prefix(&ctx->env, "%s (rank %d, its span's outputs): ", c->fn, r->rank);
    return st;
}

/* Backward: the span's gradients from S_{a_r} and H_r; ds's part of this rank into its slot. */
static lajit_status cp_bwd_grads(lajit_ctx *ctx, const cp_rank *r)
{
    lj_env *env = &ctx->env;
    const cp_call *c = &r->c;
    lajit_status st;
    int64_t in_shape[5], h_shape[5], ds_shape[1] = {r->H};
    DLTensor in_state, h_state, ds_part;
    const DLTensor *incoming = incoming_state(ctx, r, 0, &in_state, in_shape);
    const DLTensor *reaching = incoming_state(ctx, r, 1, &h_state, h_shape);
    const CUdeviceptr part = r->ds_gather + (CUdeviceptr)r->rank * r->ds_slot;
    if (r->N == 0) {
        /* No tokens: no gradients, a zero part of ds, and rank 0's dS_0 is what reaches it. */
        if (c->ds) {
            CUresult cr = LJ_CU(env, ctx->device.drv, cuMemsetD32Async, part, 0u, r->ds_slot / 4,
                                (CUstream)c->stream);
            if (cr != CUDA_SUCCESS)
                return lj_cp_driver_fail(ctx, c, cr,
                                         "cuMemsetD32Async (an empty span's part of ds)");
        }
        if (r->rank != 0 || !c->d_initial_state)
            return LAJIT_OK;
        if (!lj_tensor_compact(c->d_initial_state))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: rank 0 has no tokens, so d_initial_state is copied from the "
                            "exchange as it is: it must be contiguous",
                            c->fn);
        if (!reaching) { /* P = 1, no tokens, no dS_N: dS_0 = 0 */
            CUresult cr =
                LJ_CU(env, ctx->device.drv, cuMemsetD32Async, lj_tensor_address(c->d_initial_state),
                      0u, r->state_bytes / 4, (CUstream)c->stream);
            return cr == CUDA_SUCCESS ? LAJIT_OK
                                      : lj_cp_driver_fail(ctx, c, cr, "cuMemsetD32Async (dS_0)");
        }
        if (!lj_tensor_compact(reaching))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: rank 0 has no tokens and is the last rank, so d_final_state is "
                            "copied to d_initial_state: it must be contiguous",
                            c->fn);
        return copy_state(ctx, r, lj_tensor_address(c->d_initial_state),
                          lj_tensor_address(reaching), r->state_bytes, "cuMemcpyDtoDAsync (dS_0)");
    }
    lajit_attn_bwd_args b;
    lj_cp_bwd_args(c, &b);
    b.initial_state = incoming;
    b.d_final_state = reaching;
    b.d_initial_state = r->rank == 0 ? c->d_initial_state : NULL;
    if (c->ds) {
        b.ds = lj_device_view(&ds_part, part, ctx->ordinal, 1, ds_shape, NULL, F32);
    }
    if ((st = lajit_attn_bwd(ctx, &b)) != LAJIT_OK)
        lj_error_prefix(env, "%s (rank %d, its span's gradients): ", c->fn, r->rank);
    return st;
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

/* ---- A rank's program ----------------------------------------------------------------------- */

/* The steps of a call, in order. An exchange step has rounds (lj_cp_exchange_rounds); each round
 * is a transfer and then a compute, and the simulated ranks do every rank's transfer of a round
 * before any rank's compute. */
typedef enum cp_step_kind {
    CP_LOCAL_STATE, /* the forward carry into the exchange slot */
    CP_EXCHANGE,    /* the forward states (S_{a_r}; the forward's S_N) */
    CP_SAVE_STATE,  /* S_{a_r} out to the forward's incoming_state */
    CP_FWD_OUTPUTS, /* o */
    CP_LOCAL_GRAD,  /* the gradient carry into the exchange slot (after the exchange above) */
    CP_EXCHANGE_G,  /* the gradient states (H_r) */
    CP_BWD_GRADS,   /* dq, dk, dv, dS_0, ds's part */
    CP_DS,          /* ds's parts: one all-gather round, then the sum */
} cp_step_kind;

static const cp_step_kind fwd_program[] = {CP_LOCAL_STATE, CP_EXCHANGE, CP_SAVE_STATE,
                                           CP_FWD_OUTPUTS};
static const cp_step_kind bwd_program[] = {CP_LOCAL_STATE, CP_EXCHANGE,  CP_LOCAL_GRAD,
                                           CP_EXCHANGE_G,  CP_BWD_GRADS, CP_DS};

/* The forward's S_N: a dense call's final_state (a varlen call's is a pool, by pieces). */
static int wants_final(const cp_rank *r)
{
    return !r->c.bwd && !r->c.cu_seqlens && r->c.final_state != NULL;
}

/* A step's rounds; the simulated ranks take rank 0's for every rank, so a count may depend only
 * on what every rank shares (the backward's saved incoming state: every rank's or none). */
static int step_rounds(const cp_rank *r, cp_step_kind k)
{
    if (k == CP_EXCHANGE)
        return r->c.saved_incoming ? 0 : lj_cp_exchange_rounds(r, wants_final(r));
    if (k == CP_EXCHANGE_G)
        return lj_cp_exchange_rounds(r, 0);
    if (k == CP_DS)
        return r->c.ds ? 1 : 0;
    return 1;
}

/* Round i of step k: the transfer (exchanges only; `t` NULL: none), then the compute. */
static lajit_status step_transfer(lajit_ctx *ctx, cp_rank *r, cp_step_kind k, int i,
                                  const cp_transport *t)
{
    const int want_final = wants_final(r);
    switch (k) {
        case CP_EXCHANGE: return lj_cp_exchange_transfer(ctx, r, 0, want_final, i, t);
        case CP_EXCHANGE_G: return lj_cp_exchange_transfer(ctx, r, 1, 0, i, t);
        case CP_DS: return lj_cp_ds_transfer(ctx, r, t);
        default: return LAJIT_OK;
    }
}

static lajit_status step_compute(lajit_ctx *ctx, cp_rank *r, cp_step_kind k, int i)
{
    const int want_final = wants_final(r);
    switch (k) {
        case CP_LOCAL_STATE: /* a backward given the forward's S_{a_r}: varlen's pools only */
            return r->c.cu_seqlens       ? lj_cp_varlen_local(ctx, r, 0)
                   : r->c.saved_incoming ? LAJIT_OK
                                         : cp_local(ctx, r, 0);
        case CP_EXCHANGE: return lj_cp_exchange_compute(ctx, r, 0, want_final, i);
        case CP_SAVE_STATE: return cp_save_incoming(ctx, r);
        case CP_FWD_OUTPUTS:
            return r->c.cu_seqlens ? lj_cp_varlen_fwd_outputs(ctx, r) : cp_fwd_outputs(ctx, r);
        case CP_LOCAL_GRAD: /* the gradient exchange reuses the slots the forward one has read */
            return r->c.cu_seqlens ? lj_cp_varlen_local(ctx, r, 1) : cp_local(ctx, r, 1);
        case CP_EXCHANGE_G: return lj_cp_exchange_compute(ctx, r, 1, 0, i);
        case CP_BWD_GRADS:
            return r->c.cu_seqlens ? lj_cp_varlen_bwd_grads(ctx, r) : cp_bwd_grads(ctx, r);
        default: return lj_cp_ds_sum(ctx, r);
    }
}

static void program_of(const cp_call *c, const cp_step_kind **steps, int *n)
{
    *steps = c->bwd ? bwd_program : fwd_program;
    *n = c->bwd ? (int)(sizeof bwd_program / sizeof bwd_program[0])
                : (int)(sizeof fwd_program / sizeof fwd_program[0]);
}

/* ---- The NCCL path -------------------------------------------------------------------------- */

/* The communicator's size, this rank and its device (which must be the context's), then the
 * rank's program. */
static lajit_status cp_run_nccl(lajit_ctx *ctx, const cp_call *c, void *comm)
{
    lj_env *env = &ctx->env;
    if (!comm)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: comm is NULL (an ncclComm_t of the ranks sharing the sequence)",
                        c->fn);
    lajit_status st;
    cp_nccl_user u = {ctx->nccl_override, (lj_nccl_comm)comm};
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
    CUdeviceptr base;
    if ((st = check_rank(env, c, rank, P, ctx->ordinal, &r)) != LAJIT_OK)
        return st;
    lj_cp_segments_plan(ctx, &r);
    const size_t bytes = lj_cp_rank_bytes(&r);
    if (!bytes)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: %d ranks' states do not fit in memory", c->fn, P);
    if ((st = device_ready(ctx, c->fn)) != LAJIT_OK ||
        (st = workspace(ctx, bytes, &base)) != LAJIT_OK)
        return st;
    lj_cp_place(&r, base);
    cp_transport t = lj_cp_nccl_transport;
    t.user = &u;
    const cp_step_kind *prog;
    int n;
    program_of(c, &prog, &n);
    for (int s = 0; s < n; s++)
        for (int i = 0; i < step_rounds(&r, prog[s]); i++)
            if ((st = step_transfer(ctx, &r, prog[s], i, &t)) != LAJIT_OK ||
                (st = step_compute(ctx, &r, prog[s], i)) != LAJIT_OK)
                return st;
    return LAJIT_OK;
}

LAJIT_API lajit_status lajit_cp_attn_fwd(lajit_ctx *ctx, const lajit_cp_attn_fwd_args *a)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lajit_status st = check_args(&ctx->env, FN_FWD, a ? &a->struct_size : NULL, sizeof *a,
                                 FWD_BEFORE, a ? a->flags : 0, a ? a->scale : 0);
    if (st != LAJIT_OK)
        return st;
    const cp_call c = fwd_call(a);
    return cp_run_nccl(ctx, &c, a->comm);
}

LAJIT_API lajit_status lajit_cp_attn_bwd(lajit_ctx *ctx, const lajit_cp_attn_bwd_args *a)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lajit_status st = check_args(&ctx->env, FN_BWD, a ? &a->struct_size : NULL, sizeof *a,
                                 BWD_BEFORE, a ? a->flags : 0, a ? a->scale : 0);
    if (st != LAJIT_OK)
        return st;
    const cp_call c = bwd_call(a);
    return cp_run_nccl(ctx, &c, a->comm);
}

/* ---- Simulated ranks (tests) ---------------------------------------------------------------- */

/* P simulated ranks' calls: every rank's buffer in the context's workspace, then the program
 * step by step and round by round, every rank's transfer of a round before any rank's compute
 * (one stream, so a round's copies follow every rank's writes of the round before). */
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
        if ((st = check_rank(env, &calls[j], j, P, ctx->ordinal, &r[j])) != LAJIT_OK)
            lj_error_prefix(env, "rank %d: ", j);
        else if (j > 0 &&
                 (r[j].B != r[0].B || r[j].H != r[0].H || r[j].D != r[0].D || r[j].E != r[0].E ||
                  r[j].vk != r[0].vk || r[j].c.logstep != r[0].c.logstep))
            st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                          "%s (simulated): rank %d's B, H, D, E or flags differ from rank 0's", fn,
                          j);
        else if (calls[j].stream != calls[0].stream)
            st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                          "%s (simulated): every rank must use one stream", fn);
        else if ((calls[j].ds != NULL) != (calls[0].ds != NULL))
            st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                          "%s (simulated): ds is given by some ranks and not others", fn);
        else if ((calls[j].saved_incoming != NULL) != (calls[0].saved_incoming != NULL))
            st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                          "%s (simulated): incoming_state is given by some ranks and not others",
                          fn);
        else if (r[0].c.logstep && (calls[j].final_state != NULL) != (calls[0].final_state != NULL))
            st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                          "%s (simulated): with the log-step exchange final_state is given by "
                          "every rank or none",
                          fn);
    }
    /* Every rank's buffer as large as the largest (varlen ranks differ in their pieces, dense ones
     * in their segments). */
    for (int j = 0; j < P && st == LAJIT_OK; j++)
        lj_cp_segments_plan(ctx, &r[j]);
    for (int j = 0; j < P && st == LAJIT_OK; j++) {
        const size_t bytes = lj_cp_rank_bytes(&r[j]);
        if (!bytes)
            each = SIZE_MAX;
        else if (each != SIZE_MAX && bytes > each)
            each = bytes;
    }
    if (st == LAJIT_OK && (each == SIZE_MAX || each == 0 ||
                           __builtin_mul_overflow(lj_round16(each), (size_t)P, &total)))
        st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                      "%s (simulated): %d ranks' states do not fit in memory", fn, P);
    CUdeviceptr base = 0;
    if (st == LAJIT_OK && (st = device_ready(ctx, fn)) == LAJIT_OK)
        st = workspace(ctx, total, &base);
    for (int j = 0; j < P && st == LAJIT_OK; j++)
        lj_cp_place(&r[j], base + (CUdeviceptr)j * lj_round16(each));
    cp_transport t = lj_cp_sim_transport;
    t.user = r;
    const cp_step_kind *prog;
    int n;
    program_of(&calls[0], &prog, &n);
    for (int s = 0; s < n && st == LAJIT_OK; s++) {
        const int rounds = step_rounds(&r[0], prog[s]);
        for (int i = 0; i < rounds && st == LAJIT_OK; i++) {
            for (int j = 0; j < P && st == LAJIT_OK; j++)
                st = step_transfer(ctx, &r[j], prog[s], i, &t);
            for (int j = 0; j < P && st == LAJIT_OK; j++)
                st = step_compute(ctx, &r[j], prog[s], i);
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
        if ((st = check_args(&ctx->env, FN_FWD, &ranks[j].struct_size, sizeof ranks[j], FWD_BEFORE,
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
        if ((st = check_args(&ctx->env, FN_BWD, &ranks[j].struct_size, sizeof ranks[j], BWD_BEFORE,
                             ranks[j].flags, ranks[j].scale)) == LAJIT_OK)
            c[j] = bwd_call(&ranks[j]);
    if (st == LAJIT_OK)
        st = cp_run_sim(ctx, P, c);
    lj_free(&ctx->env, c);
    return st;
}
