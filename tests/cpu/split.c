/* split.c — the host side of a split scan (templates/common/split.cuh) with no GPU, through the
 * fake driver: at few heads and a long sequence the default forward on sm_90a launches SPLIT
 * segments per sequence, and the op hands the kernel two buffers of the context — flags zeroed
 * once when allocated, states — sized by the launch's split_ws and split_flags; the next call of
 * the same shape allocates nothing and gets the same buffers; a call whose grid fills the GPU
 * gets none; the backward's passes get them too. */
#include "test.h"

#include "context.h"
#include "fake_driver.h"
#include "op_args.h"

typedef struct seqs {
    CUcontext cuctx;
    CUdeviceptr q, k, v, o, s;
    int64_t shape[4], hshape[1];
    DLTensor tq, tk, tv, to, ts;
} seqs;

static DLTensor make(CUdeviceptr p, int ndim, int64_t *shape, uint8_t code, uint8_t bits)
{
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = (void *)(uintptr_t)p;
    t.device.device_type = kDLCUDA;
    t.ndim = ndim;
    t.dtype.code = code;
    t.dtype.bits = bits;
    t.dtype.lanes = 1;
    t.shape = shape;
    return t;
}

/* bf16 q, k, v, o [B, H, N, D] (D = E) and s [H] in fake device memory. */
static void seqs_open(seqs *u, int B, int H, int N, int D)
{
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    memset(u, 0, sizeof *u);
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&u->cuctx, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(u->cuctx), CUDA_SUCCESS);
    size_t bytes = (size_t)B * H * N * D * 2;
    CUdeviceptr *all[] = {&u->q, &u->k, &u->v, &u->o};
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(drv->cuMemAlloc(all[i], bytes), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->s, (size_t)H * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemsetD8(u->s, 0, (size_t)H * 4), CUDA_SUCCESS);
    int64_t sh[4] = {B, H, N, D};
    memcpy(u->shape, sh, sizeof sh);
    u->hshape[0] = H;
    u->tq = make(u->q, 4, u->shape, kDLBfloat, 16);
    u->tk = make(u->k, 4, u->shape, kDLBfloat, 16);
    u->tv = make(u->v, 4, u->shape, kDLBfloat, 16);
    u->to = make(u->o, 4, u->shape, kDLBfloat, 16);
    u->ts = make(u->s, 1, u->hshape, kDLFloat, 32);
}

static void seqs_close(seqs *u)
{
    const lj_driver *drv = lj_fake_driver();
    ASSERT_EQ(drv->cuCtxSetCurrent(u->cuctx), CUDA_SUCCESS);
    CUdeviceptr all[] = {u->q, u->k, u->v, u->o, u->s};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ASSERT_EQ(drv->cuMemFree(all[i]), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

static lajit_ctx *fake_ctx(void)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DISK_CACHE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lajit__ctx_set_driver(ctx, lj_fake_driver());
    return ctx;
}

static void require_nvrtc(void)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    int major, minor;
    if (lj_nvrtc_version(&env, &major, &minor) != LAJIT_OK)
        lj_test_skip("NVRTC not available");
}

static lajit_attn_fwd_args fwd_args(seqs *u)
{
    lajit_attn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &u->tq;
    a.k = &u->tk;
    a.v = &u->tv;
    a.o = &u->to;
    a.s = &u->ts;
    a.scale = 1.0f;
    return a;
}

/* B = 1, H = 1, D = E = 64, N = 16384 on the fake sm_90 (132 SMs): one 64-column CTA per
 * sequence, so the default cuts it into as many segments as SEG_MIN (1024 tokens) allows, 16. */
LJ_TEST(few_heads_long_sequence_split_with_context_buffers)
{
    require_nvrtc();
    lj_fake_driver_reset();
    seqs u;
    seqs_open(&u, 1, 1, 16384, 64);
    lajit_ctx *ctx = fake_ctx();
    lajit_attn_fwd_args a = fwd_args(&u);
    int allocs = lj_fake_driver_counts()->allocs;
    ASSERT_OK(lajit_attn_fwd(ctx, &a));
    ASSERT_EQ(lj_fake_launch_count(), 1);
    const lj_fake_launch *l = lj_fake_launch_get(0);
    ASSERT_STREQ(l->entry, "la_fwd_sm90");
    ASSERT_EQ(l->grid[0], 16u); /* one slice x SPLIT = 16 */
    ASSERT_EQ(l->grid[1], 1u);
    ASSERT_EQ(l->grid[2], 1u);
    ASSERT_TRUE(l->params.splitws != 0 && l->params.splitst != 0);
    ASSERT_TRUE(l->params.splitws != l->params.splitst);
    ASSERT_EQ(lj_fake_driver_counts()->allocs, allocs + 2);
    /* The flags buffer: 16 bytes of counters, then (SPLIT - 1) x E / 16 flags, all zero. */
    const unsigned *flags = (const unsigned *)(uintptr_t)l->params.splitws;
    for (int i = 0; i < 4 + 15 * 4; i++)
        ASSERT_EQ(flags[i], 0u);
    unsigned long long ws = l->params.splitws, st = l->params.splitst;

    /* Same shape: no allocation, the same buffers. */
    ASSERT_OK(lajit_attn_fwd(ctx, &a));
    ASSERT_EQ(lj_fake_launch_count(), 2);
    ASSERT_EQ(lj_fake_driver_counts()->allocs, allocs + 2);
    ASSERT_EQ(lj_fake_launch_get(1)->params.splitws, ws);
    ASSERT_EQ(lj_fake_launch_get(1)->params.splitst, st);

    /* The final state only (o NULL, q NULL): the same split, the state-only kernel. */
    CUdeviceptr sn;
    ASSERT_EQ(lj_fake_driver()->cuMemAlloc(&sn, 64 * 64 * 4), CUDA_SUCCESS);
    int64_t stshape[4] = {1, 1, 64, 64};
    DLTensor tsn = make(sn, 4, stshape, kDLFloat, 32);
    lajit_attn_fwd_args so = a;
    so.o = NULL;
    so.q = NULL;
    so.final_state = &tsn;
    ASSERT_OK(lajit_attn_fwd(ctx, &so));
    ASSERT_EQ(lj_fake_launch_count(), 3);
    ASSERT_EQ(lj_fake_launch_get(2)->grid[0], 16u);
    ASSERT_EQ(lj_fake_launch_get(2)->params.o.ptr, 0u);
    ASSERT_EQ(lj_fake_launch_get(2)->params.sn.ptr, sn);
    so.final_state = NULL;
    ASSERT_EQ(lajit_attn_fwd(ctx, &so), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_TRUE(strstr(lajit_errmsg(ctx), "o is NULL and so is final_state") != NULL);
    ASSERT_EQ(lj_fake_driver()->cuMemFree(sn), CUDA_SUCCESS);

    /* The backward's passes split too, on the same buffers (grown when a pass needs more). */
    lajit_attn_bwd_args b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.q = &u.tq;
    b.k = &u.tk;
    b.v = &u.tv;
    b.dout = &u.to;
    CUdeviceptr g[3];
    DLTensor tg[3];
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(lj_fake_driver()->cuMemAlloc(&g[i], (size_t)16384 * 64 * 2), CUDA_SUCCESS);
        tg[i] = make(g[i], 4, u.shape, kDLBfloat, 16);
    }
    b.dq = &tg[0];
    b.dk = &tg[1];
    b.dv = &tg[2];
    b.s = &u.ts;
    b.scale = 1.0f;
    ASSERT_OK(lajit_attn_bwd(ctx, &b));
    ASSERT_EQ(lj_fake_launch_count(), 6);
    for (int i = 3; i < 6; i++) {
        const lj_fake_launch *p = lj_fake_launch_get(i);
        ASSERT_STREQ(p->entry, "la_fwd_sm90");
        ASSERT_EQ(p->grid[0], 16u);
        ASSERT_TRUE(p->params.splitws != 0 && p->params.splitst != 0);
    }
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(lj_fake_driver()->cuMemFree(g[i]), CUDA_SUCCESS);
    lajit_ctx_destroy(ctx);
    seqs_close(&u);
    ASSERT_EQ(lj_fake_driver_counts()->allocs, lj_fake_driver_counts()->frees);
}

/* B = 4, H = 32: the grid fills the GPU without a split; no buffers. */
LJ_TEST(many_heads_no_split_no_buffers)
{
    require_nvrtc();
    lj_fake_driver_reset();
    seqs u;
    seqs_open(&u, 4, 32, 4096, 64);
    lajit_ctx *ctx = fake_ctx();
    lajit_attn_fwd_args a = fwd_args(&u);
    int allocs = lj_fake_driver_counts()->allocs;
    ASSERT_OK(lajit_attn_fwd(ctx, &a));
    const lj_fake_launch *l = lj_fake_launch_get(0);
    ASSERT_STREQ(l->entry, "la_fwd_sm90");
    ASSERT_EQ(l->grid[1], 32u);
    ASSERT_EQ(l->grid[2], 4u);
    ASSERT_EQ(l->params.splitws, 0u);
    ASSERT_EQ(l->params.splitst, 0u);
    ASSERT_EQ(lj_fake_driver_counts()->allocs, allocs);
    lajit_ctx_destroy(ctx);
    seqs_close(&u);
}

/* The backward with ds at B = 1, H = 1, N = 16384 on the fake sm_90 (132 SMs): by segments
 * (runtime/bwd_segments.c) — as many as the SMs would take (1 head, one 64-column slice: 64,
 * the most), but no segment under 4096 tokens, so four. In order: the segments' local states (one
 * state-only varlen forward over 4 sequences), their scan, the local gradient states (one
 * state-only varlen pass), the reverse scan, then the backward over the 4 segments as a varlen
 * batch (its dq pass computing ds, dv, dk). The boundaries are written once per shape; a second
 * call allocates nothing. LAJIT_DS_SEGMENTS=off: the plain passes. */
LJ_TEST(backward_ds_by_segments)
{
    require_nvrtc();
    lj_fake_driver_reset();
    seqs u;
    seqs_open(&u, 1, 1, 16384, 64);
    unsetenv("LAJIT_DS_SEGMENTS");
    lajit_ctx *ctx = fake_ctx();
    lajit_attn_bwd_args b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.q = &u.tq;
    b.k = &u.tk;
    b.v = &u.tv;
    b.dout = &u.to;
    CUdeviceptr g[4];
    DLTensor tg[3];
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(lj_fake_driver()->cuMemAlloc(&g[i], (size_t)16384 * 64 * 2), CUDA_SUCCESS);
        tg[i] = make(g[i], 4, u.shape, kDLBfloat, 16);
    }
    ASSERT_EQ(lj_fake_driver()->cuMemAlloc(&g[3], 16), CUDA_SUCCESS);
    DLTensor tds = make(g[3], 1, u.hshape, kDLFloat, 32);
    b.dq = &tg[0];
    b.dk = &tg[1];
    b.dv = &tg[2];
    b.s = &u.ts;
    b.ds = &tds;
    b.scale = 1.0f;
    /* On a stream of the caller's: the segments' boundaries are written on it (ordered before
     * its kernels), never by a synchronous copy, which a non-blocking stream does not wait for. */
    CUstream stream;
    ASSERT_EQ(lj_fake_driver()->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    b.stream = stream;
    ASSERT_OK(lajit_attn_bwd(ctx, &b));
    ASSERT_EQ(lj_fake_driver_counts()->htod_copies, 0);
    ASSERT_EQ(lj_fake_driver_counts()->htod_async_copies, 3);
    ASSERT_TRUE(lj_fake_last_htod_stream() == stream);
    b.stream = NULL;
    static const char *const want[] = {"la_fwd_sm90",   "la_state_scan", "la_fwd_sm90",
                                       "la_state_scan", "la_fwd_sm90",   "la_fwd_sm90",
                                       "la_fwd_sm90"};
    ASSERT_EQ(lj_fake_launch_count(), 7);
    for (int i = 0; i < 7; i++)
        ASSERT_STREQ(lj_fake_launch_get(i)->entry, want[i]);
    ASSERT_EQ(ctx->seg_P, 4);
    ASSERT_EQ(ctx->seg_N, 16384);
    const int32_t *cu = (const int32_t *)(uintptr_t)ctx->seg_ws.ptr;
    for (int j = 0; j <= 4; j++)
        ASSERT_EQ(cu[j], 4096 * j);
    /* The varlen passes see 4 sequences (grid z) and the segment pools. */
    ASSERT_EQ(lj_fake_launch_get(0)->grid[2], 4u);
    ASSERT_EQ(lj_fake_launch_get(6)->grid[2], 4u);
    ASSERT_EQ(lj_fake_launch_get(4)->params.cu_seqlens, ctx->seg_ws.ptr);
    const int allocs = lj_fake_driver_counts()->allocs;
    ASSERT_OK(lajit_attn_bwd(ctx, &b));
    ASSERT_EQ(lj_fake_launch_count(), 14);
    ASSERT_EQ(lj_fake_driver_counts()->allocs, allocs);
    lajit_ctx_destroy(ctx);

    /* Forced (three segments of whole chunks: 5504, 5504, 5376), as a new context's first call:
     * the device is opened before the segments' buffer and boundaries are made. */
    setenv("LAJIT_DS_SEGMENTS", "3", 1);
    ctx = fake_ctx();
    ASSERT_OK(lajit_attn_bwd(ctx, &b));
    ASSERT_EQ(lj_fake_launch_count(), 21);
    ASSERT_EQ(ctx->seg_P, 3);
    cu = (const int32_t *)(uintptr_t)ctx->seg_ws.ptr;
    ASSERT_EQ(cu[1], 5504);
    ASSERT_EQ(cu[2], 11008);
    ASSERT_EQ(cu[3], 16384);
    lajit_ctx_destroy(ctx);

    setenv("LAJIT_DS_SEGMENTS", "off", 1);
    ctx = fake_ctx();
    ASSERT_OK(lajit_attn_bwd(ctx, &b));
    ASSERT_EQ(lj_fake_launch_count(), 21 + 3);
    ASSERT_EQ(ctx->seg_ws.bytes, 0u);
    lajit_ctx_destroy(ctx);
    unsetenv("LAJIT_DS_SEGMENTS");
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(lj_fake_driver()->cuMemFree(g[i]), CUDA_SUCCESS);
    ASSERT_EQ(lj_fake_driver()->cuStreamDestroy(stream), CUDA_SUCCESS);
    seqs_close(&u);
    ASSERT_EQ(lj_fake_driver_counts()->allocs, lj_fake_driver_counts()->frees);
}

/* A backward with ds over two long rows on fake memory (B = 2, H = 1, N = 16384, D = E = 64,
 * bf16): q, k, v and dO from seqs, then dq, dk, dv (g[0..2]), ds (g[3]), S_0 (g[4]) and dS_N
 * (g[5]), and with ds0 also dS_0 (g[6]). Self-referential: open it where it stays. */
typedef struct two_rows {
    seqs u;
    CUdeviceptr g[7];
    int n;
    int64_t sshape[4];
    DLTensor tg[3], tds, ts0, tdsn, tds0;
    lajit_attn_bwd_args b;
} two_rows;

enum { ROW_BYTES = 16384 * 64 * 2, ROW_STATE = 64 * 64 * 4 };

static void two_rows_open(two_rows *w, int ds0)
{
    memset(w, 0, sizeof *w);
    seqs_open(&w->u, 2, 1, 16384, 64);
    const size_t bytes[7] = {2 * ROW_BYTES, 2 * ROW_BYTES, 2 * ROW_BYTES, 16,
                             2 * ROW_STATE, 2 * ROW_STATE, 2 * ROW_STATE};
    w->n = ds0 ? 7 : 6;
    for (int i = 0; i < w->n; i++)
        ASSERT_EQ(lj_fake_driver()->cuMemAlloc(&w->g[i], bytes[i]), CUDA_SUCCESS);
    for (int i = 0; i < 3; i++)
        w->tg[i] = make(w->g[i], 4, w->u.shape, kDLBfloat, 16);
    const int64_t sshape[4] = {2, 1, 64, 64};
    memcpy(w->sshape, sshape, sizeof sshape);
    w->tds = make(w->g[3], 1, w->u.hshape, kDLFloat, 32);
    w->ts0 = make(w->g[4], 4, w->sshape, kDLFloat, 32);
    w->tdsn = make(w->g[5], 4, w->sshape, kDLFloat, 32);
    lajit_attn_bwd_args *b = &w->b;
    b->struct_size = sizeof *b;
    b->q = &w->u.tq;
    b->k = &w->u.tk;
    b->v = &w->u.tv;
    b->dout = &w->u.to;
    b->dq = &w->tg[0];
    b->dk = &w->tg[1];
    b->dv = &w->tg[2];
    b->s = &w->u.ts;
    b->ds = &w->tds;
    b->scale = 1.0f;
    b->initial_state = &w->ts0;
    b->d_final_state = &w->tdsn;
    if (ds0) {
        w->tds0 = make(w->g[6], 4, w->sshape, kDLFloat, 32);
        b->d_initial_state = &w->tds0;
    }
}

static void two_rows_close(two_rows *w)
{
    for (int i = 0; i < w->n; i++)
        ASSERT_EQ(lj_fake_driver()->cuMemFree(w->g[i]), CUDA_SUCCESS);
    seqs_close(&w->u);
}

/* Two batch rows (B = 2, H = 1, N = 16384). LAJIT_DS_SEGMENTS=off: the plain passes (three
 * launches). The automatic choice takes them by four segments (4 CTAs of plain passes on a GPU of
 * many SMs; 16384 / 4096 tokens): each row's seven launches of the one-row case, on that row's
 * tensors (every sequence operand a row further on, the segment pools and boundaries the same),
 * its ds into a part of its own; then one scan sums the parts in row order and a copy writes ds.
 * With initial and final-gradient states, each row copies its own. */
LJ_TEST(backward_ds_by_segments_two_rows)
{
    require_nvrtc();
    lj_fake_driver_reset();
    two_rows *w = malloc(sizeof *w);
    ASSERT_TRUE(w != NULL);
    two_rows_open(w, 0);
    const CUdeviceptr *g = w->g;
    const size_t row = ROW_BYTES, st = ROW_STATE;
    setenv("LAJIT_DS_SEGMENTS", "off", 1);
    lajit_ctx *plain = fake_ctx();
    unsetenv("LAJIT_DS_SEGMENTS");
    lajit_ctx *ctx = fake_ctx();
    ASSERT_OK(lajit_attn_bwd(plain, &w->b));
    ASSERT_EQ(lj_fake_launch_count(), 3);
    ASSERT_EQ(plain->seg_ws.bytes, 0u);
    lajit_ctx_destroy(plain);
    const int l0 = lj_fake_launch_count(), c0 = lj_fake_driver_counts()->dtod_copies;
    ASSERT_OK(lajit_attn_bwd(ctx, &w->b));
    ASSERT_EQ(ctx->seg_P, 4);
    static const char *const want[] = {"la_fwd_sm90",   "la_state_scan", "la_fwd_sm90",
                                       "la_state_scan", "la_fwd_sm90",   "la_fwd_sm90",
                                       "la_fwd_sm90"};
    ASSERT_EQ(lj_fake_launch_count() - l0, 2 * 7 + 1);
    for (int i = 0; i < 14; i++)
        ASSERT_STREQ(lj_fake_launch_get(l0 + i)->entry, want[i % 7]);
    ASSERT_STREQ(lj_fake_launch_get(l0 + 14)->entry, "la_state_scan");
    int moved = 0;
    for (int i = 0; i < 7; i++) {
        const la_params *r0 = &lj_fake_launch_get(l0 + i)->params,
                        *r1 = &lj_fake_launch_get(l0 + 7 + i)->params;
        if (strcmp(lj_fake_launch_get(l0 + i)->entry, "la_fwd_sm90") != 0)
            continue;
        const la_tensor4 *a0[9] = {&r0->q,  &r0->k,  &r0->v,  &r0->o, &r0->dout,
                                   &r0->dq, &r0->dk, &r0->dv, &r0->x};
        const la_tensor4 *a1[9] = {&r1->q,  &r1->k,  &r1->v,  &r1->o, &r1->dout,
                                   &r1->dq, &r1->dk, &r1->dv, &r1->x};
        for (int j = 0; j < 9; j++) {
            ASSERT_EQ(a1[j]->ptr, a0[j]->ptr ? a0[j]->ptr + row : 0ull);
            moved += a0[j]->ptr != 0;
        }
        ASSERT_EQ(r1->s0.ptr, r0->s0.ptr); /* the segments' pools */
        ASSERT_EQ(r1->dsn.ptr, r0->dsn.ptr);
        ASSERT_EQ(r1->cu_seqlens, r0->cu_seqlens);
        if (r0->dsdecay) /* each row's ds into its own part */
            ASSERT_EQ(r1->dsdecay, r0->dsdecay + 16);
    }
    ASSERT_TRUE(moved >= 6);
    /* The rows' copies of S_0 and dS_N: row 1's a state further on. */
    int s0_rows = 0, dsn_rows = 0;
    for (int i = c0; i < lj_fake_driver_counts()->dtod_copies; i++) {
        const lj_fake_copy *c = lj_fake_copy_get(i);
        s0_rows += c->src == g[4] || c->src == g[4] + st;
        dsn_rows += c->src == g[5] || c->src == g[5] + st;
    }
    ASSERT_EQ(s0_rows, 4);  /* each row: into W[0] and IN[0] */
    ASSERT_EQ(dsn_rows, 4); /* each row: into G[P-1] and HH[P-1] */
    const lj_fake_copy *last = lj_fake_copy_get(lj_fake_driver_counts()->dtod_copies - 1);
    ASSERT_EQ(last->dst, g[3]); /* the sum into ds */
    ASSERT_EQ(last->bytes, 4u);
    const int allocs = lj_fake_driver_counts()->allocs;
    ASSERT_OK(lajit_attn_bwd(ctx, &w->b));
    ASSERT_EQ(lj_fake_driver_counts()->allocs, allocs);
    lajit_ctx_destroy(ctx);
    two_rows_close(w);
    free(w);
    ASSERT_EQ(lj_fake_driver_counts()->allocs, lj_fake_driver_counts()->frees);
}

/* The automatic segment count on the fake sm_90 (132 SMs), and a forced one. Segments where the
 * plain passes leave most SMs idle and each row gets at least two (the rows run one after
 * another); none where a row would get fewer (B 8, H 2, N 16K: four segments of 4096 tokens for
 * eight rows) or the plain passes' CTAs fill half the SMs. */
LJ_TEST(automatic_segment_counts)
{
    lj_fake_driver_reset();
    seqs u;
    seqs_open(&u, 1, 1, 64, 64); /* the fake device, current */
    unsetenv("LAJIT_DS_SEGMENTS");
    lajit_ctx *ctx = fake_ctx();
    ASSERT_EQ(lj_segments_for(ctx, 0, 1, 8, 65536, 128), 16);
    ASSERT_EQ(lj_segments_for(ctx, 0, 2, 16, 131072, 64), 16);
    ASSERT_EQ(lj_segments_for(ctx, 0, 2, 1, 16384, 64), 4);
    ASSERT_EQ(lj_segments_for(ctx, 0, 2, 8, 16384, 128), 4);
    ASSERT_EQ(lj_segments_for(ctx, 0, 4, 4, 65536, 128), 16);
    ASSERT_EQ(lj_segments_for(ctx, 0, 8, 2, 16384, 64), 0);  /* 4 segments, 8 rows */
    ASSERT_EQ(lj_segments_for(ctx, 0, 4, 4, 16384, 128), 0); /* 4 segments, 4 rows */
    ASSERT_EQ(lj_segments_for(ctx, 0, 2, 4, 8192, 64), 0);   /* 2 segments, 2 rows */
    ASSERT_EQ(lj_segments_for(ctx, 0, 4, 32, 8192, 128), 0); /* the plain passes fill the GPU */
    ASSERT_EQ(lj_segments_for(ctx, 0, 1, 8, 4096, 128), 0);  /* too short for two */
    ASSERT_EQ(lj_segments_for(ctx, 3, 8, 2, 16384, 64), 3);  /* forced */
    ASSERT_EQ(lj_segments_for(ctx, 1, 1, 8, 65536, 128), 0); /* off */
    lajit_ctx_destroy(ctx);
    seqs_close(&u);
}

/* The backward's ds by segments over two batch rows (automatic: B = 2, H = 1, N = 16384, four
 * segments a row), with S_0 and dS_N: every driver call of a call failing in turn gives a status
 * whose message says what failed, never a crash, and the context serves the next call; nothing
 * leaks. */
LJ_TEST(backward_ds_by_segments_driver_failures)
{
    require_nvrtc();
    lj_fake_driver_reset();
    two_rows *w = malloc(sizeof *w);
    ASSERT_TRUE(w != NULL);
    two_rows_open(w, 1);
    unsetenv("LAJIT_DS_SEGMENTS");
    lajit_ctx *ctx = fake_ctx();
    lajit_attn_bwd_args *b = &w->b;
    ASSERT_OK(lajit_attn_bwd(ctx, b)); /* compiles, writes the segments' boundaries */
    ASSERT_EQ(ctx->seg_P, 4);
    lj_env *env = lajit__ctx_env(ctx);
    const uint64_t c0 = env->fault_count[LJ_FAULT_DRIVER];
    ASSERT_OK(lajit_attn_bwd(ctx, b));
    const uint64_t calls = env->fault_count[LJ_FAULT_DRIVER] - c0;
    ASSERT_TRUE(calls >= 2 * 7 + 1); /* at least each row's seven launches and the sum */
    for (uint64_t k = 1; k <= calls; k++) {
        env->fault_at[LJ_FAULT_DRIVER] = env->fault_count[LJ_FAULT_DRIVER] + k;
        lajit_status s = lajit_attn_bwd(ctx, b);
        env->fault_at[LJ_FAULT_DRIVER] = 0;
        if (s == LAJIT_OK)
            lj_test_fail(__FILE__, __LINE__, "driver call %llu of %llu failed, the call passed",
                         (unsigned long long)k, (unsigned long long)calls);
        if (!strstr(lajit_errmsg(ctx), "CUDA_ERROR_UNKNOWN"))
            lj_test_fail(__FILE__, __LINE__, "driver call %llu: the message does not say: %s",
                         (unsigned long long)k, lajit_errmsg(ctx));
        ASSERT_OK(lajit_attn_bwd(ctx, b));
    }
    printf("%llu driver calls failed in turn\n", (unsigned long long)calls);
    lajit_ctx_destroy(ctx);
    two_rows_close(w);
    free(w);
    ASSERT_EQ(lj_fake_driver_counts()->allocs, lj_fake_driver_counts()->frees);
}
