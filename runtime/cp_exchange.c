/* cp_exchange.c — the exchanges of context parallelism (cp.h): from every rank's carry (its
 * span's local state and length; the first rank's includes S_0, or in the gradient direction the
 * last rank's includes dS_N) to the carry entering each rank, over a transport (NCCL, or copies
 * between simulated ranks).
 *
 * All-gather (LASP-2's exchange): one in-place all-gather of every rank's [carry, length], then
 * lajit_attn_state_scan over the P gathered slots. One collective, but every rank receives P
 * states: P·B·H·D·E·4 bytes, growing with P.
 *
 * Log-step: a Hillis–Steele scan of point-to-point sends. In walk order (ranks from the first,
 * or from the last for gradients) rank v holds (X, L), its running carry and the tokens it
 * covers; at step d = 1, 2, 4, … it sends them to v + d and combines what v − d sent,
 *     X ← λ^L X_received + X,   L ← L + L_received,
 * so after ⌈log2 P⌉ steps X is the inclusive carry through v; one more shift makes it the carry
 * entering v + 1, and a broadcast from the last gives everyone S_N when it is wanted. Each step
 * moves one state per rank, whatever P. The combine is the state scan over two spans (the
 * received one, then the own one) with its total length (lj_state_scan), so there is no kernel
 * of its own. */
#include <stdio.h>
#include <string.h>

#include "cp.h"
#include "op_args.h"

static const DLDataType F32 = {kDLFloat, 32, 1};
static const DLDataType I64 = {kDLInt, 64, 1};

lajit_status lj_cp_driver_fail(lajit_ctx *ctx, const cp_call *c, CUresult cr, const char *what)
{
    char text[160];
    snprintf(text, sizeof text, "%s: %s", c->fn, what);
    return lj_driver_error(&ctx->env, ctx->device.drv, cr, text);
}

/* ---- The buffer --------------------------------------------------------------------------------- */

static int add(size_t *acc, size_t a, size_t count)
{
    size_t n;
    return !__builtin_mul_overflow(lj_round16(a), count, &n) &&
           !__builtin_add_overflow(*acc, n, acc);
}

/* Region sizes in the order lj_cp_place lays them out. */
static int regions(const cp_rank *r, size_t *exch, size_t *scratch, size_t *in, size_t *ds)
{
    const size_t P = (size_t)r->P;
    *exch = *scratch = *in = *ds = 0;
    if (r->c.logstep)
        return add(exch, r->slot, 4) && add(scratch, r->state_bytes, 2) &&
               add(in, r->state_bytes, 1) &&
               (!r->c.ds || (add(ds, r->ds_slot, 2 * P + 1) && add(ds, 8 * P, 1)));
    return add(exch, r->slot, P) && add(in, r->state_bytes, P) &&
           (!r->c.ds || (add(ds, r->ds_slot, 2 * P + 1) && add(ds, 8 * P, 1)));
}

size_t lj_cp_rank_bytes(const cp_rank *r)
{
    size_t exch, scratch, in, ds, total = 0, varlen = 0;
    if (!regions(r, &exch, &scratch, &in, &ds) || !add(&total, exch, 1) ||
        !add(&total, scratch, 1) || !add(&total, in, r->c.bwd ? 2 : 1) || !add(&total, ds, 1))
        return 0;
    if (r->c.cu_seqlens && ((varlen = lj_cp_varlen_bytes(r)) == 0 || !add(&total, varlen, 1)))
        return 0;
    const size_t spans = (size_t)lj_cp_segments_spans(r);
    if (spans && (!add(&total, r->state_bytes, 2 * spans) || !add(&total, 4 * spans, 1)))
        return 0;
    return total;
}

void lj_cp_place(cp_rank *r, CUdeviceptr base)
{
    size_t exch = 0, scratch = 0, in = 0, ds = 0;
    regions(r, &exch, &scratch, &in, &ds);
    r->base = base;
    r->gather = base;
    r->scratch = r->gather + exch;
    r->incoming = r->scratch + scratch;
    r->incoming_g = r->c.bwd ? r->incoming + in : 0;
    r->ds_gather = r->c.ds ? r->incoming + in * (r->c.bwd ? 2 : 1) : 0;
    r->carry = r->gather + (CUdeviceptr)(r->c.logstep ? 1 : r->rank) * r->slot;
    r->own = r->carry;
    const CUdeviceptr end =
        lj_round16(r->ds_gather ? r->ds_gather + ds : r->incoming + in * (r->c.bwd ? 2 : 1));
    if (r->c.cu_seqlens)
        lj_cp_varlen_place(r, end);
    const size_t spans = (size_t)lj_cp_segments_spans(r); /* dense calls only: after ds */
    r->s_w = spans ? end : 0;
    r->s_in = spans ? end + lj_round16(r->state_bytes) * spans : 0;
    r->s_lens = spans ? r->s_in + lj_round16(r->state_bytes) * spans : 0;
}

CUdeviceptr lj_cp_incoming(const cp_rank *r, int grad)
{
    const CUdeviceptr in = grad ? r->incoming_g : r->incoming;
    return r->c.logstep ? in : in + (CUdeviceptr)r->rank * r->state_bytes;
}

int lj_cp_receives(const cp_rank *r)
{
    return r->c.cu_seqlens ? r->c.cont_in : r->rank > 0;
}

CUdeviceptr lj_cp_entering(const cp_rank *r)
{
    return r->c.saved_incoming ? lj_tensor_address(r->c.saved_incoming) : lj_cp_incoming(r, 0);
}

/* ---- Views and the scan ------------------------------------------------------------------------- */

/* n states of r's shape from base, `step` bytes apart (compact when step is a state's bytes). */
static void states_view(DLTensor *t, int64_t shape[5], int64_t strides[5], const cp_rank *r,
                        CUdeviceptr base, int64_t n, size_t step, int ordinal)
{
    const int64_t R = r->vk ? r->E : r->D, C = r->vk ? r->D : r->E;
    const int64_t sh[5] = {n, r->B, r->H, R, C};
    const int64_t st[5] = {(int64_t)(step / 4), r->H * R * C, R * C, C, 1};
    memcpy(shape, sh, sizeof sh);
    memcpy(strides, st, sizeof st);
    lj_device_view(t, base, ordinal, 5, shape, strides, F32);
}

/* The same as one state [B,H,R,C] (a 5-d view's last four dimensions). */
static void one_state(DLTensor *t, const DLTensor *five)
{
    *t = *five;
    t->ndim = 4;
    t->shape = five->shape + 1;
    t->strides = five->strides + 1;
}

/* n int64 lengths at base, `step` bytes apart. */
static void lengths_view(DLTensor *t, int64_t shape[1], int64_t strides[1], CUdeviceptr base,
                         int64_t n, size_t step, int ordinal)
{
    shape[0] = n;
    strides[0] = (int64_t)(step / 8);
    lj_device_view(t, base, ordinal, 1, shape, strides, I64);
}

/* lj_state_scan over n slots at `slots` (`step` bytes apart, lengths at len_off in each), the
 * per-span outputs into `out` (n compact states), the carry into final (may be NULL) and the
 * total length into total (may be NULL). */
static lajit_status scan_slots(lajit_ctx *ctx, const cp_rank *r, CUdeviceptr slots, int64_t n,
                               size_t step, int reverse, CUdeviceptr out, DLTensor *final,
                               DLTensor *total, const char *what)
{
    int64_t ls_shape[5], ls_strides[5], in_shape[5], in_strides[5], len_shape[1], len_strides[1];
    DLTensor ls, in, len;
    states_view(&ls, ls_shape, ls_strides, r, slots, n, step, ctx->ordinal);
    states_view(&in, in_shape, in_strides, r, out, n, r->state_bytes, ctx->ordinal);
    lengths_view(&len, len_shape, len_strides, slots + r->len_off, n, step, ctx->ordinal);
    lajit_attn_state_scan_args sc;
    memset(&sc, 0, sizeof sc);
    sc.struct_size = sizeof sc;
    sc.local_states = &ls;
    sc.lengths = &len;
    sc.s = r->c.s;
    sc.incoming_states = &in;
    sc.final_state = final;
    sc.flags = (r->c.flags & LAJIT_STATE_VK) | (reverse ? LAJIT_SCAN_REVERSE : 0);
    sc.stream = r->c.stream;
    lajit_status st = lj_state_scan(ctx, &sc, total);
    if (st != LAJIT_OK)
        lj_error_prefix(&ctx->env, "%s (rank %d, %s): ", r->c.fn, r->rank, what);
    return st;
}

/* ---- The exchanges ------------------------------------------------------------------------------ */

/* Walk order: the forward from rank 0, gradients from the last rank. */
static int walk_pos(const cp_rank *r, int grad)
{
    return grad ? r->P - 1 - r->rank : r->rank;
}

static int real_rank(const cp_rank *r, int grad, int pos)
{
    return pos < 0 || pos >= r->P ? -1 : grad ? r->P - 1 - pos : pos;
}

/* ⌈log2 P⌉: the log-step scan's combining rounds. */
static int steps(int P)
{
    int k = 0;
    while ((1 << k) < P)
        k++;
    return k;
}

int lj_cp_exchange_rounds(const cp_rank *r, int want_final)
{
    return r->c.logstep ? steps(r->P) + 1 + (want_final ? 1 : 0) : 1;
}

lajit_status lj_cp_exchange_transfer(lajit_ctx *ctx, cp_rank *r, int grad, int want_final, int i,
                                     const cp_transport *t)
{
    (void)want_final;
    if (!r->c.logstep)
        return t->gather(ctx, r, r->gather, r->slot, t->user);
    const int K = steps(r->P), v = walk_pos(r, grad);
    const CUdeviceptr R = r->own - r->slot; /* the receiving slot just below the own one */
    if (i < K)                              /* combining step d = 2^i */
        return t->sendrecv(ctx, r, real_rank(r, grad, v + (1 << i)), R,
                           real_rank(r, grad, v - (1 << i)), t->user);
    if (i == K) /* the shift: the inclusive carry of v − 1 is what enters v */
        return t->sendrecv(ctx, r, real_rank(r, grad, v + 1), R, real_rank(r, grad, v - 1),
                           t->user);
    return t->broadcast(ctx, r, R, real_rank(r, grad, r->P - 1), t->user); /* S_N */
}

lajit_status lj_cp_exchange_compute(lajit_ctx *ctx, cp_rank *r, int grad, int want_final, int i)
{
    const cp_call *c = &r->c;
    lajit_status st = LAJIT_OK;
    if (!c->logstep) {
        /* The scan over the P gathered slots (the first rank in walk order needs it only for the
         * forward's S_N: its incoming state is S_0, or dS_N, which it holds). */
        if (walk_pos(r, grad) > 0 || want_final)
            st = scan_slots(ctx, r, r->gather, r->P, r->slot, grad,
                            grad ? r->incoming_g : r->incoming, want_final ? c->final_state : NULL,
                            NULL,
                            grad ? "the scan of the gathered gradient states"
                                 : "the scan of the gathered states");
        return st;
    }
    const int K = steps(r->P), v = walk_pos(r, grad);
    /* Slots [R_A][A][R_T][T]: the own carry is A or T, what arrives lands just below it, so a
     * combine's two inputs are adjacent and its output lies outside their view. */
    const CUdeviceptr A = r->gather + r->slot, T = A + 2 * r->slot, R = r->own - r->slot;
    if (i < K) {
        if (v - (1 << i) < 0)
            return LAJIT_OK;
        /* X_other = λ^{L_own} X_R + X_own, L_other = L_R + L_own: the scan over [R, own]. */
        const CUdeviceptr other = r->own == A ? T : A;
        int64_t o_shape[5], o_strides[5], t_shape[1] = {1};
        DLTensor o5, o4, total;
        states_view(&o5, o_shape, o_strides, r, other, 1, r->state_bytes, ctx->ordinal);
        one_state(&o4, &o5);
        lj_device_view(&total, other + r->len_off, ctx->ordinal, 1, t_shape, NULL, I64);
        st = scan_slots(ctx, r, R, 2, r->slot, 0, r->scratch, &o4, &total,
                        "a step of the log-step exchange");
        if (st == LAJIT_OK)
            r->own = other;
        return st;
    }
    if (i == K) {
        if (!want_final)
            r->own = r->carry; /* the next exchange starts from the carry slot again */
        if (v == 0)
            return LAJIT_OK;
        CUresult cr = LJ_CU(&ctx->env, ctx->device.drv, cuMemcpyDtoDAsync, lj_cp_incoming(r, grad),
                            R, r->state_bytes, (CUstream)c->stream);
        return cr == CUDA_SUCCESS ? LAJIT_OK
                                  : lj_cp_driver_fail(ctx, c, cr,
                                                      "cuMemcpyDtoDAsync (the carry "
                                                      "entering the span)");
    }
    /* S_N, broadcast into R, written into final_state by a one-span scan (its strides). */
    r->own = r->carry;
    return scan_slots(ctx, r, R, 1, r->slot, 0, r->scratch, c->final_state, NULL,
                      "the final state of the log-step exchange");
}

/* ---- ds ----------------------------------------------------------------------------------------- */

lajit_status lj_cp_ds_transfer(lajit_ctx *ctx, cp_rank *r, const cp_transport *t)
{
    return t->gather(ctx, r, r->ds_gather, r->ds_slot, t->user);
}

/* The parts' sum in rank order: the state scan with no decay over P spans of [1, 1, 1, H']
 * "states" (H' = ds_slot/4), X = X + part_j — the same order, so the same bits, on every rank —
 * then copied into ds. */
lajit_status lj_cp_ds_sum(lajit_ctx *ctx, const cp_rank *r)
{
    const cp_call *c = &r->c;
    const size_t P = (size_t)r->P;
    const CUdeviceptr sum = r->ds_gather + 2 * r->ds_slot * P;
    lajit_status st = lj_sum_rows(
        ctx, r->ds_gather, r->P, (int64_t)(r->ds_slot / 4), r->ds_gather + r->ds_slot * P,
        r->ds_gather + lj_round16(r->ds_slot * (2 * P + 1)), sum, c->stream);
    if (st != LAJIT_OK) {
        lj_error_prefix(&ctx->env, "%s (rank %d, the sum of ds's parts): ", c->fn, r->rank);
        return st;
    }
    CUresult cr = LJ_CU(&ctx->env, ctx->device.drv, cuMemcpyDtoDAsync, lj_tensor_address(c->ds),
                        sum, (size_t)r->H * 4, (CUstream)c->stream);
    return cr == CUDA_SUCCESS ? LAJIT_OK : lj_cp_driver_fail(ctx, c, cr, "cuMemcpyDtoDAsync (ds)");
}

/* ---- NCCL --------------------------------------------------------------------------------------- */

static lajit_status nccl_fail(lajit_ctx *ctx, const cp_rank *r, const cp_nccl_user *u,
                              lj_nccl_result nr, const char *what)
{
    if (nr == LJ_NCCL_IN_PROGRESS) /* the kernels after it would not be ordered behind it */
        return lj_error(&ctx->env, LAJIT_ERR_NCCL,
                        "%s: %s returned ncclInProgress: a non-blocking communicator; use a "
                        "blocking one",
                        r->c.fn, what);
    char text[128];
    snprintf(text, sizeof text, "%s: %s", r->c.fn, what);
    return lj_nccl_error(&ctx->env, u->nccl, nr, text);
}

static lajit_status nccl_gather(lajit_ctx *ctx, const cp_rank *r, CUdeviceptr base, size_t bytes,
                                void *user)
{
    const cp_nccl_user *u = user;
    void *all = (void *)(uintptr_t)base;
    const void *mine = (const char *)all + (size_t)r->rank * bytes;
    lj_nccl_result nr = u->nccl->ncclAllGather(mine, all, bytes / 4, LJ_NCCL_FLOAT32, u->comm,
                                               (CUstream)r->c.stream);
    return nr == LJ_NCCL_SUCCESS
               ? LAJIT_OK
               : nccl_fail(ctx, r, u, nr,
                           base == r->ds_gather ? "ncclAllGather of ds's parts"
                                                : "ncclAllGather of the span states");
}

static lajit_status nccl_sendrecv(lajit_ctx *ctx, const cp_rank *r, int to, CUdeviceptr dst,
                                  int from, void *user)
{
    const cp_nccl_user *u = user;
    const CUstream s = (CUstream)r->c.stream;
    const size_t n = r->slot / 4;
    if (to < 0 && from < 0)
        return LAJIT_OK;
    lj_nccl_result nr = u->nccl->ncclGroupStart();
    if (nr != LJ_NCCL_SUCCESS)
        return nccl_fail(ctx, r, u, nr, "ncclGroupStart");
    lj_nccl_result sr = LJ_NCCL_SUCCESS, rr = LJ_NCCL_SUCCESS;
    if (to >= 0)
        sr = u->nccl->ncclSend((const void *)(uintptr_t)r->own, n, LJ_NCCL_FLOAT32, to, u->comm, s);
    if (from >= 0)
        rr = u->nccl->ncclRecv((void *)(uintptr_t)dst, n, LJ_NCCL_FLOAT32, from, u->comm, s);
    nr = u->nccl->ncclGroupEnd(); /* always: a group left open would swallow later calls */
    if (sr != LJ_NCCL_SUCCESS)
        return nccl_fail(ctx, r, u, sr, "ncclSend");
    if (rr != LJ_NCCL_SUCCESS)
        return nccl_fail(ctx, r, u, rr, "ncclRecv");
    return nr == LJ_NCCL_SUCCESS ? LAJIT_OK : nccl_fail(ctx, r, u, nr, "ncclGroupEnd");
}

static lajit_status nccl_broadcast(lajit_ctx *ctx, const cp_rank *r, CUdeviceptr dst, int root,
                                   void *user)
{
    const cp_nccl_user *u = user;
    lj_nccl_result nr =
        u->nccl->ncclBroadcast((const void *)(uintptr_t)r->own, (void *)(uintptr_t)dst, r->slot / 4,
                               LJ_NCCL_FLOAT32, root, u->comm, (CUstream)r->c.stream);
    return nr == LJ_NCCL_SUCCESS ? LAJIT_OK : nccl_fail(ctx, r, u, nr, "ncclBroadcast");
}

const cp_transport lj_cp_nccl_transport = {nccl_gather, nccl_sendrecv, nccl_broadcast, NULL};

/* ---- Simulated ranks (tests) -------------------------------------------------------------------- */

static lajit_status sim_copy(lajit_ctx *ctx, const cp_rank *r, CUdeviceptr dst, CUdeviceptr src,
                             size_t bytes)
{
    CUresult cr = LJ_CU(&ctx->env, ctx->device.drv, cuMemcpyDtoDAsync, dst, src, bytes,
                        (CUstream)r->c.stream);
    return cr == CUDA_SUCCESS
               ? LAJIT_OK
               : lj_cp_driver_fail(ctx, &r->c, cr, "cuMemcpyDtoDAsync (the simulated exchange)");
}

/* The other ranks' slots, each at the same offset in its own buffer, into r's. */
static lajit_status sim_gather(lajit_ctx *ctx, const cp_rank *r, CUdeviceptr base, size_t bytes,
                               void *user)
{
    const cp_rank *all = user;
    const CUdeviceptr region = base - r->base;
    lajit_status st = LAJIT_OK;
    for (int j = 0; j < r->P && st == LAJIT_OK; j++) {
        const CUdeviceptr off = region + (CUdeviceptr)j * bytes;
        if (j != r->rank)
            st = sim_copy(ctx, r, r->base + off, all[j].base + off, bytes);
    }
    return st;
}

/* The receiving side only: rank `from`'s own slot into dst. */
static lajit_status sim_sendrecv(lajit_ctx *ctx, const cp_rank *r, int to, CUdeviceptr dst,
                                 int from, void *user)
{
    const cp_rank *all = user;
    (void)to;
    return from < 0 ? LAJIT_OK : sim_copy(ctx, r, dst, all[from].own, r->slot);
}

static lajit_status sim_broadcast(lajit_ctx *ctx, const cp_rank *r, CUdeviceptr dst, int root,
                                  void *user)
{
    const cp_rank *all = user;
    return sim_copy(ctx, r, dst, all[root].own, r->slot);
}

const cp_transport lj_cp_sim_transport = {sim_gather, sim_sendrecv, sim_broadcast, NULL};
