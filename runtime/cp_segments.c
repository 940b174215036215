/* cp_segments.c — context parallelism's forward over a rank's dense span cut into segments (cp.h
 * says why).
 *
 * With few heads a long span is too little work for the GPU walked whole, so the one-GPU forward
 * splits it (common/split.cuh): the segments' local states from k and v, then the outputs from
 * the states they combine into. Context parallelism already has both phases as steps — the span's
 * carry before the exchange, its outputs after — so it keeps the segments itself:
 *   local    W[j] ← each segment's local state (lajit_attn_fwd with o NULL: per batch row one
 *            batched call over the segments as [seg_n, H, seg_len, D] views of the row's span,
 *            and one for the tail; W is [spans, B, H, D, E]);
 *            the state scan over W (rank 0 from S_0) gives the span's carry into the exchange
 *            slot, and the segments' incoming states from zero, which nothing reads;
 *   outputs  the state scan over W again from the state entering the span (S_0 on rank 0): IN[j],
 *            the state entering segment j; then the outputs, the batched call and the tail's,
 *            each segment from its IN.
 * Bytes: k and v once for W, then q, k, v and o once — what the one-GPU split forward moves —
 * where the span's state-only pass followed by a forward that splits again reads k and v once
 * more. The segments are views of the caller's tensors (strides, no copies); the lengths are
 * two memsets. Everything runs through the public ops on the caller's stream. */
#include <stdint.h>
#include <string.h>

#include "cp.h"
#include "op_args.h"

#define SEG_ALIGN 64 /* a segment is whole 64-token chunks (the tail takes the rest) */

void lj_cp_segments_plan(lajit_ctx *ctx, cp_rank *r)
{
    r->seg_n = r->seg_len = r->seg_tail = 0;
    const cp_call *c = &r->c;
    if (c->bwd || c->cu_seqlens || r->N <= 0)
        return;
    const int G = lj_segments_for(ctx, ctx->cp_segments, r->B, r->H, r->N, r->E);
    const int64_t len = G >= 2 ? r->N / G / SEG_ALIGN * SEG_ALIGN : 0;
    if (len == 0 || r->N - (G - 1) * len > INT32_MAX) /* lengths are int32 (two memsets) */
        return;
    r->seg_n = G;
    r->seg_len = len;
    r->seg_tail = r->N - G * len;
}

int64_t lj_cp_segments_spans(const cp_rank *r)
{
    return r->seg_n ? r->seg_n + (r->seg_tail > 0) : 0;
}

static const DLDataType F32 = {kDLFloat, 32, 1};

/* Batch row b's states of n spans from span j0 of W or IN ([spans, B, H, R, C] at p): an
 * [n, H, R, C] view, a span's state apart. */
static DLTensor *row_states(DLTensor *t, int64_t shape[4], int64_t strides[4], const cp_rank *r,
                            CUdeviceptr p, int64_t j0, int64_t b, int64_t n, int ordinal)
{
    const int64_t R = r->vk ? r->E : r->D, C = r->vk ? r->D : r->E;
    shape[0] = n;
    shape[1] = r->H;
    shape[2] = R;
    shape[3] = C;
    strides[0] = (int64_t)(lj_round16(r->state_bytes) / 4);
    strides[1] = R * C;
    strides[2] = C;
    strides[3] = 1;
    const CUdeviceptr at =
        p + (CUdeviceptr)j0 * lj_round16(r->state_bytes) + (CUdeviceptr)(b * r->H * R * C * 4);
    return lj_device_view(t, at, ordinal, 4, shape, strides, F32);
}

/* The forward over the segments (per batch row, the batched call, then the tail): outputs is 0
 * for the local states into W, 1 for the outputs from IN. */
static lajit_status walk_segments(lajit_ctx *ctx, const cp_rank *r, int outputs)
{
    const cp_call *c = &r->c;
    for (int64_t b = 0; b < r->B; b++)
        for (int part = 0; part < 2; part++) {
            const int64_t n = part ? 1 : r->seg_n, len = part ? r->seg_tail : r->seg_len;
            const int64_t from = part ? r->seg_n * r->seg_len : 0;
            if (len == 0)
                continue;
            int64_t sq[4], tq[4], sk[4], tk[4], sv[4], tv[4], so[4], to[4], ss[4], ts[4];
            DLTensor q, k, v, o, states;
            lajit_attn_fwd_args f;
            lj_cp_fwd_args(c, &f);
            f.k = lj_tensor_segments(&k, sk, tk, c->k, b, from, len, n);
            f.v = lj_tensor_segments(&v, sv, tv, c->v, b, from, len, n);
            row_states(&states, ss, ts, r, outputs ? r->s_in : r->s_w, part ? r->seg_n : 0, b, n,
                       ctx->ordinal);
            if (outputs) {
                f.q = lj_tensor_segments(&q, sq, tq, c->q, b, from, len, n);
                f.o = (DLTensor *)lj_tensor_segments(&o, so, to, c->o, b, from, len, n);
                f.initial_state = &states;
            } else {
                f.q = NULL; /* the local states alone: k and v */
                f.o = NULL;
                f.final_state = &states;
            }
            lajit_status s = lajit_attn_fwd(ctx, &f);
            if (s != LAJIT_OK) {
                lj_error_prefix(&ctx->env,
                                "%s (rank %d, its span's %s by %lld segments%s): ", c->fn, r->rank,
                                outputs ? "outputs" : "local state", (long long)r->seg_n,
                                part ? ", the tail" : "");
                return s;
            }
        }
    return LAJIT_OK;
}

/* The state scan over the segments' local states W from `initial` (NULL: zero): IN, and the
 * carry after the span into `final` when given. */
static lajit_status scan_segments(lajit_ctx *ctx, const cp_rank *r, const DLTensor *initial,
                                  DLTensor *final)
{
    const cp_call *c = &r->c;
    const int64_t spans = lj_cp_segments_spans(r);
    int64_t sw[5], si[5], sl[1] = {spans};
    DLTensor w, in, lens;
    lajit_attn_state_scan_args sc;
    memset(&sc, 0, sizeof sc);
    sc.struct_size = sizeof sc;
    sc.local_states = lj_cp_states(&w, sw, r, r->s_w, spans, ctx->ordinal);
    sc.incoming_states = lj_cp_states(&in, si, r, r->s_in, spans, ctx->ordinal);
    sc.lengths =
        lj_device_view(&lens, r->s_lens, ctx->ordinal, 1, sl, NULL, (DLDataType){kDLInt, 32, 1});
    sc.s = c->s;
    sc.initial_state = initial;
    sc.final_state = final;
    sc.flags = c->flags & LAJIT_STATE_VK;
    sc.stream = c->stream;
    lajit_status s = lajit_attn_state_scan(ctx, &sc);
    if (s != LAJIT_OK)
        lj_error_prefix(&ctx->env, "%s (rank %d, the scan of its %lld segments): ", c->fn, r->rank,
                        (long long)r->seg_n);
    return s;
}

lajit_status lj_cp_segments_local(lajit_ctx *ctx, const cp_rank *r)
{
    const cp_call *c = &r->c;
    const lj_driver *drv = ctx->device.drv;
    /* The lengths: seg_len for each segment, then the tail's. */
    CUresult cr = LJ_CU(&ctx->env, drv, cuMemsetD32Async, r->s_lens, (unsigned)r->seg_len,
                        (size_t)r->seg_n, (CUstream)c->stream);
    if (cr == CUDA_SUCCESS && r->seg_tail)
        cr = LJ_CU(&ctx->env, drv, cuMemsetD32Async, r->s_lens + (CUdeviceptr)r->seg_n * 4,
                   (unsigned)r->seg_tail, 1, (CUstream)c->stream);
    if (cr != CUDA_SUCCESS)
        return lj_cp_driver_fail(ctx, c, cr, "cuMemsetD32Async (the segments' lengths)");
    lajit_status s = walk_segments(ctx, r, 0);
    if (s != LAJIT_OK)
        return s;
    int64_t shape[5];
    DLTensor carry;
    return scan_segments(ctx, r, r->rank == 0 ? c->initial_state : NULL,
                         lj_cp_states(&carry, shape, r, r->carry, 0, ctx->ordinal));
}

lajit_status lj_cp_segments_outputs(lajit_ctx *ctx, const cp_rank *r)
{
    int64_t shape[5];
    DLTensor entering;
    const DLTensor *in =
        r->rank == 0 ? r->c.initial_state
                     : lj_cp_states(&entering, shape, r, lj_cp_entering(r), 0, ctx->ordinal);
    lajit_status s = scan_segments(ctx, r, in, NULL);
    return s == LAJIT_OK ? walk_segments(ctx, r, 1) : s;
}
