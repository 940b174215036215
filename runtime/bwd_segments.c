/* bwd_segments.c — lajit_attn_bwd's decay gradient for long sequences with few heads, by
 * segments of each sequence run as a varlen batch.
 *
 * The backward's kernels split a long sequence across the GPU (common/split.cuh), except the pass
 * that computes ds (la_bwd_sm90's dq pass with DS, la_bwd's ds walk): its second state is not
 * chained between segments, so with few sequences and heads it runs on a handful of CTAs — 3.7×
 * the step without ds at B = 1, H = 8, N = 64K on the H200, 4.6× at 256K, 2.24× at B = 2, H = 16,
 * D = 64, N = 128K. The decomposition of context parallelism (cp_op.c) serves here on one GPU:
 * cut each sequence (batch row) into P segments, and
 *   1. each segment's carry (the state-only forward over the segments as varlen sequences; the
 *      first from S_0), scanned into the state entering each segment;
 *   2. each segment's gradient carry (lajit_attn_bwd with dq, dk, dv NULL; the last from dS_N),
 *      scanned from the last segment into the gradient reaching each segment's end;
 *   3. lajit_attn_bwd over the segments as a varlen batch, from those states: every gradient of
 *      every segment exactly, and ds summed over the segments — the sum over the sequence's
 *      steps that ds is (docs/notes/context_parallel.md: a span's backward sums its own steps).
 * The rows run one after another on the same buffers (a varlen view cannot take two rows of a
 * [B, H, N, D] tensor: their tokens are not one stride apart), each row's ds into a part of its
 * own, and the parts are summed in row order by the state scan with no decay, so the bits repeat.
 * All through the public ops, on the caller's stream. The segment boundaries, slots and lengths
 * live in a context buffer written when the shape changes (that first call synchronises its
 * stream, as an allocation would); the states are six pools of P states there.
 *
 * Taken only where it pays and the plain path's promises hold: ds wanted, the default family,
 * dense sequences (no cu_seqlens), no caller workspace (sized for the plain passes), the states
 * given contiguous, and few of them (B·H·E/64 under half the SMs, at least two segments a row) —
 * or as LAJIT_DS_SEGMENTS says. */
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
        a->q->ndim != 4 || a->q->shape[0] < 1 || !compact_state(a->initial_state) ||
        !compact_state(a->d_final_state) || !compact_state(a->d_initial_state))
        return 0;
    return lj_segments_for(ctx, ctx->ds_segments, a->q->shape[0], H, N, E);
}

int lj_segments_for(lajit_ctx *ctx, int setting, long long rows, long long H, long long N,
                    long long E)
{
    int P = setting;
    lj_device *dev;
    if (P == 1)
        return 0;
    if (P < 2) { /* automatic: about the SMs' worth of CTAs in each row's calls */
        if (lajit__ctx_device(ctx, &dev) != LAJIT_OK)
            return 0; /* the plain path reports it */
        const long long slices = E / 64 > 0 ? E / 64 : 1, sms = dev->info.sms;
        if (sms <= 0 || 2 * rows * H * slices >= sms) /* the plain passes fill the GPU */
            return 0;
        P = 1;
        while (P < MAX_SEGMENTS && P * H * slices < sms)
            P *= 2;
        while (P > 1 && N / P < SEGMENT_TOKENS)
            P /= 2;
        /* The rows run one after another, each walking N/P tokens per pass, where the plain
         * passes walk all rows' N at once: fewer than two segments a row loses (H200, session 14:
         * B 8, H 2, N 16K, P 4: 3.1× → 9.3× for ds; B 4, H 4, D 128, N 16K, P 4: 2.2× → 3.8×;
         * with P = 2B, B 2, H 8, D 128, N 16K: 2.23× → 2.11×). */
        if (P < 2 * rows)
            return 0;
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

/* The places in the context's buffer (lj_bwd_ds_by_segments lays them out). */
typedef struct seg_bufs {
    CUdeviceptr cu, slots, lens, W, IN, G, GM, HH, DS0;
} seg_bufs;

/* One batch row's backward by segments (the three steps above): a holds the row's [1, H, N, W]
 * tensors; s0, dsn, ds0 the row's states (0: absent); ds the row's [H] (the op's own when B = 1). */
static lajit_status one_row(lajit_ctx *ctx, const lajit_attn_bwd_args *a, const seg_bufs *m, int P,
                            long long H, long long D, long long E, CUdeviceptr s0, CUdeviceptr dsn,
                            CUdeviceptr ds0, DLTensor *ds)
{
    lj_env *env = &ctx->env;
    const lj_driver *drv = ctx->device.drv;
    const CUstream stream = (CUstream)a->stream;
    const int vk = (a->flags & LAJIT_STATE_VK) != 0;
    const long long R = vk ? E : D, C = vk ? D : E;
    const size_t st = (size_t)H * D * E * 4;
    const int o = ctx->ordinal;
    int64_t sq[3], tq[3], sk[3], tk[3], sv[3], tv[3], sd[3], td[3];
    int64_t sdq[3], tdq[3], sdk[3], tdk[3], sdv[3], tdv[3];
    int64_t shW[5], shIN[5], shG[5], shGM[5], shHH[5], shDS0[5], shW5[5], shIN5[5], shGM5[5],
        shHH5[5], shcu[1], shsl[1], shln[1];
    DLTensor q, k, v, dout, dq, dk, dv, w, in, g, gm, hh, d0, w5, in5, gm5, hh5, tcu, tsl, tln;
    packed(&q, sq, tq, a->q);
    packed(&k, sk, tk, a->k);
    packed(&v, sv, tv, a->v);
    packed(&dout, sd, td, a->dout);
    packed(&dq, sdq, tdq, a->dq);
    packed(&dk, sdk, tdk, a->dk);
    packed(&dv, sdv, tdv, a->dv);
    pool(&w, shW, m->W, P, 0, H, R, C, o);
    pool(&in, shIN, m->IN, P, 0, H, R, C, o);
    pool(&g, shG, m->G, P, 0, H, R, C, o);
    pool(&gm, shGM, m->GM, P, 0, H, R, C, o);
    pool(&hh, shHH, m->HH, P, 0, H, R, C, o);
    pool(&d0, shDS0, m->DS0, P, 0, H, R, C, o);
    pool(&w5, shW5, m->W, P, 1, H, R, C, o);
    pool(&in5, shIN5, m->IN, P, 1, H, R, C, o);
    pool(&gm5, shGM5, m->GM, P, 1, H, R, C, o);
    pool(&hh5, shHH5, m->HH, P, 1, H, R, C, o);
    ints(&tcu, shcu, m->cu, P + 1, 32, o);
    ints(&tsl, shsl, m->slots, P, 32, o);
    ints(&tln, shln, m->lens, P, 64, o);
    const char *step = "";
    lajit_status s;

    /* 1. The forward carries (the first from S_0), scanned into the incoming states. */
    CUresult cr = LJ_CU(env, drv, cuMemsetD32Async, m->W, 0u, st / 4 * (size_t)P, stream);
    if (cr == CUDA_SUCCESS && s0)
        cr = LJ_CU(env, drv, cuMemcpyDtoDAsync, m->W, s0, st, stream);
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
    if (s0 && (cr = LJ_CU(env, drv, cuMemcpyDtoDAsync, m->IN, s0, st, stream)) != CUDA_SUCCESS)
        return lj_driver_error(env, drv, cr, "lajit_attn_bwd (segments): S_0");

    /* 2. The gradient carries (the last from dS_N), scanned from the last segment. */
    cr = LJ_CU(env, drv, cuMemsetD32Async, m->G, 0u, st / 4 * (size_t)P, stream);
    if (cr == CUDA_SUCCESS && dsn)
        cr = LJ_CU(env, drv, cuMemcpyDtoDAsync, m->G + (CUdeviceptr)(P - 1) * st, dsn, st, stream);
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
    if (dsn && (cr = LJ_CU(env, drv, cuMemcpyDtoDAsync, m->HH + (CUdeviceptr)(P - 1) * st, dsn, st,
                           stream)) != CUDA_SUCCESS)
        return lj_driver_error(env, drv, cr, "lajit_attn_bwd (segments): dS_N");

    /* 3. Every segment's gradients from its two states; ds summed over the segments. */
    b.k = &k;
    b.v = &v;
    b.dq = &dq;
    b.dk = &dk;
    b.dv = &dv;
    b.ds = ds;
    b.initial_state = &in;
    b.d_final_state = &hh;
    b.d_initial_state = ds0 ? &d0 : NULL;
    if ((s = lajit_attn_bwd(ctx, &b)) != LAJIT_OK) {
        step = "the segments' gradients";
        goto failed;
    }
    if (ds0 && (cr = LJ_CU(env, drv, cuMemcpyDtoDAsync, ds0, m->DS0, st, stream)) != CUDA_SUCCESS)
        return lj_driver_error(env, drv, cr, "lajit_attn_bwd (segments): dS_0");
    return LAJIT_OK;
failed:
    lj_error_prefix(env, "lajit_attn_bwd (ds by %d segments, %s): ", P, step);
    return s;
}

lajit_status lj_bwd_ds_by_segments(lajit_ctx *ctx, const lajit_attn_bwd_args *a, int P, long long B,
                                   long long H, long long N, long long D, long long E)
{
    lj_env *env = &ctx->env;
    lj_device *device;
    lajit_status s;
    if ((s = lajit__ctx_device(ctx, &device)) != LAJIT_OK) /* open before its driver is used */
        return s;
    const lj_driver *drv = device->drv;
    const CUstream stream = (CUstream)a->stream;
    const size_t st = (size_t)H * D * E * 4, pools = lj_round16(st * (size_t)P);
    const size_t cu_b = lj_round16((size_t)(P + 1) * 4), slots_b = lj_round16((size_t)P * 4),
                 lens_b = lj_round16((size_t)P * 8);
    /* With several rows: each row's ds, the sum's (unread) incoming states, the sum and its zero
     * lengths. */
    const size_t part = lj_round16((size_t)H * 4), sums_b = B > 1 ? part * (size_t)(2 * B + 1) : 0,
                 zeros_b = B > 1 ? lj_round16((size_t)B * 8) : 0;
    if ((s = lj_ctx_buffer(ctx, &ctx->seg_ws,
                           cu_b + slots_b + lens_b + 6 * pools + sums_b + zeros_b, 0, NULL,
                           "the backward's segments")) != LAJIT_OK)
        return s;
    seg_bufs m;
    m.cu = ctx->seg_ws.ptr;
    m.slots = m.cu + cu_b;
    m.lens = m.slots + slots_b;
    m.W = m.lens + lens_b;
    m.IN = m.W + pools;
    m.G = m.IN + pools;
    m.GM = m.G + pools;
    m.HH = m.GM + pools;
    m.DS0 = m.HH + pools;
    const CUdeviceptr parts = m.DS0 + pools, zeros = parts + sums_b;
    CUresult cr = CUDA_SUCCESS;
    /* The boundaries (segments of whole 64-token chunks), slots 0 .. P − 1 and lengths, written
     * when the shape changes, after the stream's earlier calls that may still read them. */
    if (ctx->seg_at != m.cu || ctx->seg_N != N || ctx->seg_P != P) {
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
            cr = LJ_CU(env, drv, cuMemcpyHtoDAsync, m.cu, hcu, (size_t)(P + 1) * 4, stream);
        if (cr == CUDA_SUCCESS)
            cr = LJ_CU(env, drv, cuMemcpyHtoDAsync, m.slots, hslots, (size_t)P * 4, stream);
        if (cr == CUDA_SUCCESS)
            cr = LJ_CU(env, drv, cuMemcpyHtoDAsync, m.lens, hlens, (size_t)P * 8, stream);
        if (cr != CUDA_SUCCESS)
            return lj_driver_error(env, drv, cr, "lajit_attn_bwd (segments): their boundaries");
        ctx->seg_at = m.cu;
        ctx->seg_N = N;
        ctx->seg_P = P;
    }
    /* The rows one after another, each on the same buffers (one stream orders them). */
    for (long long r = 0; r < B; r++) {
        int64_t sh[7][4], strd[7][4], dsh[1] = {H};
        DLTensor rows[7], ds_row;
        lajit_attn_bwd_args row = *a;
        row.q = lj_tensor_segments(&rows[0], sh[0], strd[0], a->q, r, 0, N, 1);
        row.k = lj_tensor_segments(&rows[1], sh[1], strd[1], a->k, r, 0, N, 1);
        row.v = lj_tensor_segments(&rows[2], sh[2], strd[2], a->v, r, 0, N, 1);
        row.dout = lj_tensor_segments(&rows[3], sh[3], strd[3], a->dout, r, 0, N, 1);
        row.dq = (DLTensor *)lj_tensor_segments(&rows[4], sh[4], strd[4], a->dq, r, 0, N, 1);
        row.dk = (DLTensor *)lj_tensor_segments(&rows[5], sh[5], strd[5], a->dk, r, 0, N, 1);
        row.dv = (DLTensor *)lj_tensor_segments(&rows[6], sh[6], strd[6], a->dv, r, 0, N, 1);
        DLTensor *ds = B > 1 ? lj_device_view(&ds_row, parts + (CUdeviceptr)r * part, ctx->ordinal,
                                              1, dsh, NULL, (DLDataType){kDLFloat, 32, 1})
                             : a->ds;
        const CUdeviceptr at = (CUdeviceptr)r * st;
        s = one_row(ctx, &row, &m, P, H, D, E,
                    a->initial_state ? lj_tensor_address(a->initial_state) + at : 0,
                    a->d_final_state ? lj_tensor_address(a->d_final_state) + at : 0,
                    a->d_initial_state ? lj_tensor_address(a->d_initial_state) + at : 0, ds);
        if (s != LAJIT_OK) {
            if (B > 1)
                lj_error_prefix(env, "batch row %lld: ", r);
            return s;
        }
    }
    if (B == 1)
        return LAJIT_OK;
    /* ds: the rows' parts summed in row order (the same bits every run). */
    const CUdeviceptr sum = parts + (CUdeviceptr)(2 * B) * part;
    if ((s = lj_sum_rows(ctx, parts, B, (int64_t)(part / 4), parts + (CUdeviceptr)B * part, zeros,
                         sum, a->stream)) != LAJIT_OK) {
        lj_error_prefix(env, "lajit_attn_bwd (ds by %d segments, the sum over %lld rows): ", P, B);
        return s;
    }
    cr = LJ_CU(env, drv, cuMemcpyDtoDAsync, lj_tensor_address(a->ds), sum, (size_t)H * 4, stream);
    return cr == CUDA_SUCCESS ? LAJIT_OK
                              : lj_driver_error(env, drv, cr, "lajit_attn_bwd (segments): ds");
}
