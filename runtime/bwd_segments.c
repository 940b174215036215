/* bwd_segments.c — lajit_attn_bwd's decay gradient for one long sequence with few heads, by
 * segments of the sequence run as a varlen batch.
 *
 * The backward's kernels split a long sequence across the GPU (common/split.cuh), except the pass
 * that computes ds (la_bwd_sm90's dq pass with DS, la_bwd's ds walk): its second state is not
 * chained between segments, so at B = 1 and few heads it runs on a handful of CTAs — 3.7× the
 * step without ds at H = 8, N = 64K on the H200, 4.6× at 256K. The decomposition of context
 * parallelism (cp_op.c) serves here on one GPU: cut the sequence into P segments, and
 *   1. each segment's carry (the state-only forward over the segments as varlen sequences; the
 *      first from S_0), scanned into the state entering each segment;
 *   2. each segment's gradient carry (lajit_attn_bwd with dq, dk, dv NULL; the last from dS_N),
 *      scanned from the last segment into the gradient reaching each segment's end;
 *   3. lajit_attn_bwd over the segments as a varlen batch, from those states: every gradient of
 *      every segment exactly, and ds summed over the segments — the sum over the sequence's
 *      steps that ds is (docs/notes/context_parallel.md: a span's backward sums its own steps).
 * All through the public ops, on the caller's stream. The segment boundaries, slots and lengths
 * live in a context buffer written when the shape changes (that first call synchronises its
 * stream, as an allocation would); the states are six pools of P states there.
 *
 * Taken only where it pays and the plain path's promises hold: ds wanted, the default family,
 * one dense sequence (B = 1, no cu_seqlens), no caller workspace (sized for one sequence), the
 * states given contiguous, and few heads (H·E/64 under half the SMs) — or as LAJIT_DS_SEGMENTS
 * says. */
#include <string.h>

#include "op_args.h"

#define MAX_SEGMENTS   64
#define SEGMENT_TOKENS 4096 /* the shortest segment the automatic rule makes */

/* A state the segments copy as bytes: absent, or compact. */
static int compact_state(const DLTensor *t)
{
    return !t || lj_tensor_compact(t);
}

int lj_bwd_segments(lajit_ctx *ctx, const lajit_attn_bwd_args *a, long long H, long long N,
                    long long E)
{
    if (!a->ds || !a->s || a->cu_seqlens || a->workspace || a->family || !a->q || !a->q->shape ||
        a->q->ndim != 4 || a->q->shape[0] != 1 || !compact_state(a->initial_state) ||
        !compact_state(a->d_final_state) || !compact_state(a->d_initial_state))
        return 0;
    return lj_segments_for(ctx, ctx->ds_segments, H, N, E);
}

int lj_segments_for(lajit_ctx *ctx, int setting, long long H, long long N, long long E)
{
    int P = setting;
    lj_device *dev;
    if (P == 1)
        return 0;
    if (P < 2) { /* automatic: about the SMs' worth of CTAs in the ds pass */
        if (lajit__ctx_device(ctx, &dev) != LAJIT_OK)
            return 0; /* the plain path reports it */
        const long long slices = E / 64 > 0 ? E / 64 : 1, sms = dev->info.sms;
        if (sms <= 0 || 2 * H * slices >= sms)
            return 0;
        P = 1;
        while (P < MAX_SEGMENTS && P * H * slices < sms)
            P *= 2;
        while (P > 1 && N / P < SEGMENT_TOKENS)
            P /= 2;
    }
    if (P > N)
        P = (int)N;
    return P >= 2 ? P : 0;
}

/* A [N, H, W] packed view of a [1, H, N, W] tensor (its data, strides in elements). */
static DLTensor *packed(DLTensor *out, int64_t shape[3], int64_t strides[3], const DLTensor *t)
{
    const int64_t *sh = t->shape;
    int64_t s[4] = {sh[1] * sh[2] * sh[3], sh[2] * sh[3], sh[3], 1};
    if (t->strides)
        memcpy(s, t->strides, sizeof s);
    *out = *t;
    shape[0] = sh[2];
    shape[1] = sh[1];
    shape[2] = sh[3];
    strides[0] = s[2];
    strides[1] = s[1];
    strides[2] = s[3];
    out->ndim = 3;
    out->shape = shape;
    out->strides = strides;
    return out;
}

/* n states [n, H, R, C] (or, five-dimensional, [n, 1, H, R, C]) at base, compact. */
static DLTensor *pool(DLTensor *out, int64_t shape[5], CUdeviceptr base, int n, int five,
                      long long H, long long R, long long C, int ordinal)
{
    int i = 0;
    shape[i++] = n;
    if (five)
        shape[i++] = 1;
    shape[i++] = H;
    shape[i++] = R;
    shape[i++] = C;
    return lj_device_view(out, base, ordinal, i, shape, NULL, (DLDataType){kDLFloat, 32, 1});
}

static DLTensor *ints(DLTensor *out, int64_t shape[1], CUdeviceptr base, int64_t n, int bits,
                      int ordinal)
{
    shape[0] = n;
    return lj_device_view(out, base, ordinal, 1, shape, NULL,
                          (DLDataType){kDLInt, (uint8_t)bits, 1});
}

lajit_status lj_bwd_ds_by_segments(lajit_ctx *ctx, const lajit_attn_bwd_args *a, int P, long long H,
                                   long long N, long long D, long long E)
{
    lj_env *env = &ctx->env;
    lj_device *device;
    lajit_status s;
    if ((s = lajit__ctx_device(ctx, &device)) != LAJIT_OK) /* open before its driver is used */
        return s;
    const lj_driver *drv = device->drv;
    const CUstream stream = (CUstream)a->stream;
    const int vk = (a->flags & LAJIT_STATE_VK) != 0;
    const long long R = vk ? E : D, C = vk ? D : E;
    const size_t st = (size_t)H * D * E * 4, pools = lj_round16(st * (size_t)P);
    const size_t cu_b = lj_round16((size_t)(P + 1) * 4), slots_b = lj_round16((size_t)P * 4),
                 lens_b = lj_round16((size_t)P * 8);
    if ((s = lj_ctx_buffer(ctx, &ctx->seg_ws, cu_b + slots_b + lens_b + 6 * pools, 0, NULL,
                           "the backward's segments")) != LAJIT_OK)
        return s;
    const CUdeviceptr cu = ctx->seg_ws.ptr, slots = cu + cu_b, lens = slots + slots_b;
    const CUdeviceptr W = lens + lens_b, IN = W + pools, G = IN + pools, GM = G + pools,
                      HH = GM + pools, DS0 = HH + pools;
    CUresult cr = CUDA_SUCCESS;
    /* The boundaries (segments of whole 64-token chunks), slots 0 .. P − 1 and lengths, written
     * when the shape changes, after the stream's earlier calls that may still read them. */
    if (ctx->seg_at != cu || ctx->seg_N != N || ctx->seg_P != P) {
        int32_t hcu[MAX_SEGMENTS + 1], hslots[MAX_SEGMENTS];
        int64_t hlens[MAX_SEGMENTS];
        long long seg = ((N + P - 1) / P + 63) / 64 * 64;
        for (int j = 0; j <= P; j++)
            hcu[j] = (int32_t)((long long)j * seg < N ? (long long)j * seg : N);
        for (int j = 0; j < P; j++) {
            hslots[j] = j;
            hlens[j] = hcu[j + 1] - hcu[j];
        }
        /* On the caller's stream: a plain cuMemcpyHtoD from pageable memory may return before
         * its DMA lands, unordered with a non-blocking stream's kernels. */
        cr = LJ_CU(env, drv, cuStreamSynchronize, stream);
        if (cr == CUDA_SUCCESS)
            cr = LJ_CU(env, drv, cuMemcpyHtoDAsync, cu, hcu, (size_t)(P + 1) * 4, stream);
        if (cr == CUDA_SUCCESS)
            cr = LJ_CU(env, drv, cuMemcpyHtoDAsync, slots, hslots, (size_t)P * 4, stream);
        if (cr == CUDA_SUCCESS)
            cr = LJ_CU(env, drv, cuMemcpyHtoDAsync, lens, hlens, (size_t)P * 8, stream);
        if (cr != CUDA_SUCCESS)
            return lj_driver_error(env, drv, cr, "lajit_attn_bwd (segments): their boundaries");
        ctx->seg_at = cu;
        ctx->seg_N = N;
        ctx->seg_P = P;
    }
    const int o = ctx->ordinal;
    int64_t sq[3], tq[3], sk[3], tk[3], sv[3], tv[3], sd[3], td[3];
    int64_t sdq[3], tdq[3], sdk[3], tdk[3], sdv[3], tdv[3];
    int64_t shW[5], shIN[5], shG[5], shGM[5], shHH[5], shDS0[5], shW5[5], shIN5[5], shGM5[5],
        shHH5[5], shcu[1], shsl[1], shln[1];
    DLTensor q, k, v, dout, dq, dk, dv, w, in, g, gm, hh, ds0, w5, in5, gm5, hh5, tcu, tsl, tln;
    packed(&q, sq, tq, a->q);
    packed(&k, sk, tk, a->k);
    packed(&v, sv, tv, a->v);
    packed(&dout, sd, td, a->dout);
    packed(&dq, sdq, tdq, a->dq);
    packed(&dk, sdk, tdk, a->dk);
    packed(&dv, sdv, tdv, a->dv);
    pool(&w, shW, W, P, 0, H, R, C, o);
    pool(&in, shIN, IN, P, 0, H, R, C, o);
    pool(&g, shG, G, P, 0, H, R, C, o);
    pool(&gm, shGM, GM, P, 0, H, R, C, o);
    pool(&hh, shHH, HH, P, 0, H, R, C, o);
    pool(&ds0, shDS0, DS0, P, 0, H, R, C, o);
    pool(&w5, shW5, W, P, 1, H, R, C, o);
    pool(&in5, shIN5, IN, P, 1, H, R, C, o);
    pool(&gm5, shGM5, GM, P, 1, H, R, C, o);
    pool(&hh5, shHH5, HH, P, 1, H, R, C, o);
    ints(&tcu, shcu, cu, P + 1, 32, o);
    ints(&tsl, shsl, slots, P, 32, o);
    ints(&tln, shln, lens, P, 64, o);
    const char *step = "";

    /* 1. The forward carries (the first from S_0), scanned into the incoming states. */
    cr = LJ_CU(env, drv, cuMemsetD32Async, W, 0u, st / 4 * (size_t)P, stream);
    if (cr == CUDA_SUCCESS && a->initial_state)
        cr = LJ_CU(env, drv, cuMemcpyDtoDAsync, W, lj_tensor_address(a->initial_state), st, stream);
    if (cr != CUDA_SUCCESS)
        return lj_driver_error(env, drv, cr, "lajit_attn_bwd (segments): the forward carries");
    lajit_attn_fwd_args f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.k = &k;
    f.v = &v;
    f.s = a->s;
    f.scale = a->scale;
    f.initial_state = &w;
    f.final_state = &w;
    f.cu_seqlens = &tcu;
    f.state_slots = &tsl;
    f.flags = a->flags;
    f.stream = a->stream;
    lajit_attn_state_scan_args sc;
    memset(&sc, 0, sizeof sc);
    sc.struct_size = sizeof sc;
    sc.lengths = &tln;
    sc.s = a->s;
    sc.flags = a->flags & LAJIT_STATE_VK;
    sc.stream = a->stream;
    sc.local_states = &w5;
    sc.incoming_states = &in5;
    if ((s = lajit_attn_fwd(ctx, &f)) != LAJIT_OK) {
        step = "the segments' local states";
        goto failed;
    }
    if ((s = lajit_attn_state_scan(ctx, &sc)) != LAJIT_OK) {
        step = "the scan of the local states";
        goto failed;
    }
    if (a->initial_state &&
        (cr = LJ_CU(env, drv, cuMemcpyDtoDAsync, IN, lj_tensor_address(a->initial_state), st,
                    stream)) != CUDA_SUCCESS)
        return lj_driver_error(env, drv, cr, "lajit_attn_bwd (segments): S_0");

    /* 2. The gradient carries (the last from dS_N), scanned from the last segment. */
    cr = LJ_CU(env, drv, cuMemsetD32Async, G, 0u, st / 4 * (size_t)P, stream);
    if (cr == CUDA_SUCCESS && a->d_final_state)
        cr = LJ_CU(env, drv, cuMemcpyDtoDAsync, G + (CUdeviceptr)(P - 1) * st,
                   lj_tensor_address(a->d_final_state), st, stream);
    if (cr != CUDA_SUCCESS)
        return lj_driver_error(env, drv, cr, "lajit_attn_bwd (segments): the gradient carries");
    lajit_attn_bwd_args b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.q = &q;
    b.dout = &dout;
    b.s = a->s;
    b.scale = a->scale;
    b.d_final_state = &g;
    b.d_initial_state = &gm;
    b.cu_seqlens = &tcu;
    b.state_slots = &tsl;
    b.flags = a->flags;
    b.stream = a->stream;
    if ((s = lajit_attn_bwd(ctx, &b)) != LAJIT_OK) {
        step = "the segments' local gradient states";
        goto failed;
    }
    sc.local_states = &gm5;
    sc.incoming_states = &hh5;
    sc.flags |= LAJIT_SCAN_REVERSE;
    if ((s = lajit_attn_state_scan(ctx, &sc)) != LAJIT_OK) {
        step = "the scan of the gradient states";
        goto failed;
    }
    if (a->d_final_state &&
        (cr = LJ_CU(env, drv, cuMemcpyDtoDAsync, HH + (CUdeviceptr)(P - 1) * st,
                    lj_tensor_address(a->d_final_state), st, stream)) != CUDA_SUCCESS)
        return lj_driver_error(env, drv, cr, "lajit_attn_bwd (segments): dS_N");

    /* 3. Every segment's gradients from its two states; ds summed over the segments. */
    b.k = &k;
    b.v = &v;
    b.dq = &dq;
    b.dk = &dk;
    b.dv = &dv;
    b.ds = a->ds;
    b.initial_state = &in;
    b.d_final_state = &hh;
    b.d_initial_state = a->d_initial_state ? &ds0 : NULL;
    if ((s = lajit_attn_bwd(ctx, &b)) != LAJIT_OK) {
        step = "the segments' gradients";
        goto failed;
    }
    if (a->d_initial_state &&
        (cr = LJ_CU(env, drv, cuMemcpyDtoDAsync, lj_tensor_address(a->d_initial_state), DS0, st,
                    stream)) != CUDA_SUCCESS)
        return lj_driver_error(env, drv, cr, "lajit_attn_bwd (segments): dS_0");
    return LAJIT_OK;
failed:
    lj_error_prefix(env, "lajit_attn_bwd (ds by %d segments, %s): ", P, step);
    return s;
}
