/* state_pool.c — lj_state_pool_gather and lj_state_pool_scatter with no GPU: the built-in custom
 * family la_state_pool as they reach it (its kernel compiled by NVRTC for the fake sm_90 device
 * and launched through the fake driver: entry, grid, block, every packed argument including the
 * scalar that picks the direction, the plan reused by both directions, a launch inside a stream
 * capture, n = 0 launching nothing), the argument errors each names in its own terms, the
 * declaration's refusals they rely on (alignment, aliasing), and checked mode reading the slots
 * back. Values are checked on a GPU by tests/gpu/state_pool.c. */
#include "test.h"

#include "context.h"
#include "fake_driver.h"
#include "gpu.h"
#include "nvrtc.h"
#include "op_args.h"

enum { P = 5, N = 3, H = 3, R = 64, C = 32 };
#define RC ((size_t)R * C)

typedef struct pool_views {
    CUcontext cuctx;
    CUdeviceptr pool, batch, slots;
    lj_test_tensor tpool, tbatch, tslots;
    DLTensor *p, *b, *s;
} pool_views;

static const int64_t pool_shape[4] = {P, H, R, C}, batch_shape[4] = {N, H, R, C},
                     slots_shape[1] = {N};

/* Fake device memory and valid tensors: slots {4, -1, FRESH(0)}. */
static void views_open(pool_views *u)
{
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    memset(u, 0, sizeof *u);
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&u->cuctx, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(u->cuctx), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->pool, P * H * RC * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->batch, N * H * RC * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->slots, 16 * 4), CUDA_SUCCESS);
    int32_t *sl = (int32_t *)(uintptr_t)u->slots; /* fake device memory is host memory */
    sl[0] = 4;
    sl[1] = LAJIT_SLOT_SKIP;
    sl[2] = LAJIT_SLOT_FRESH(0);
    const DLDataType f32 = lj_test_dl_dtype(LJ_F32);
    u->p = lj_gpu_tensor(&u->tpool, u->pool, 0, 4, pool_shape, NULL, f32);
    u->b = lj_gpu_tensor(&u->tbatch, u->batch, 0, 4, batch_shape, NULL, f32);
    u->s = lj_gpu_tensor(&u->tslots, u->slots, 0, 1, slots_shape, NULL, lj_test_dl_int32());
}

static void views_close(pool_views *u)
{
    const lj_driver *drv = lj_fake_driver();
    drv->cuMemFree(u->pool);
    drv->cuMemFree(u->batch);
    drv->cuMemFree(u->slots);
    drv->cuDevicePrimaryCtxRelease(0);
}

static lajit_ctx *fake_ctx(uint32_t flags)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DISK_CACHE | flags;
    desc.autotune = LAJIT_AUTOTUNE_OFF;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lajit__ctx_set_driver(ctx, lj_fake_driver());
    return ctx;
}

static void need_nvrtc(void)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    int major, minor;
    if (lj_nvrtc_version(&env, &major, &minor) != LAJIT_OK)
        lj_test_skip("NVRTC not available");
}

static void ok(lajit_ctx *ctx, lajit_status st, int line)
{
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, line, "%s: %s", lajit_status_string(st), lajit_errmsg(ctx));
}

/* One bad call: the status and a piece of the message. */
static void refused(lajit_ctx *ctx, lajit_status st, lajit_status want, const char *msg, int line)
{
    if (st != want)
        lj_test_fail(__FILE__, line, "expected %s (\"%s\"), got %s: %s", lajit_status_string(want),
                     msg, lajit_status_string(st), lajit_errmsg(ctx));
    if (!strstr(lajit_errmsg(ctx), msg))
        lj_test_fail(__FILE__, line, "message \"%s\" lacks \"%s\"", lajit_errmsg(ctx), msg);
}

/* An lj_arg<rank> as packed at byte offset off of the launch's parameters. */
static void packed_tensor(const lj_fake_launch *l, size_t off, int rank, long long *out)
{
    memcpy(out, (const unsigned char *)&l->params + off, (size_t)(1 + 2 * rank) * 8);
}

LJ_TEST(family_is_builtin_custom)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DEVICE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    int found = 0;
    for (const char *const *n = lajit_family_names(); *n; n++)
        found += strcmp(*n, "la_state_pool") == 0;
    ASSERT_EQ(found, 1);
    lajit_family_info info = {.struct_size = sizeof info};
    ASSERT_OK(lajit_family_describe(ctx, "la_state_pool", &info));
    ASSERT_STREQ(info.op, "custom");
    ASSERT_EQ(info.n_params, 1);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(launch_through_the_fake_driver)
{
    need_nvrtc();
    lj_fake_driver_reset();
    pool_views u;
    views_open(&u);
    lajit_ctx *ctx = fake_ctx(0);
    ok(ctx, lj_state_pool_gather(ctx, u.p, u.s, u.b, 0, NULL), __LINE__);
    ASSERT_EQ(lj_fake_launch_count(), 1);
    const lj_fake_launch *l = lj_fake_launch_get(0);
    ASSERT_STREQ(l->entry, "la_state_pool");
    /* 64 x 32 floats in 16-byte vectors: 512 vectors per state, the default's 256 threads; the
     * batch's states on x, a state's CTAs on y, heads on z. */
    ASSERT_EQ(l->block[0], 256u);
    ASSERT_EQ(l->grid[0], (unsigned)N);
    ASSERT_EQ(l->grid[1], 2u);
    ASSERT_EQ(l->grid[2], (unsigned)H);
    /* The packed parameters (8-byte aligned, in declared order): pool lj_arg<4> at 0, slots
     * lj_arg<1> at 72, states lj_arg<4> at 96, the int scatter at 168. */
    _Static_assert(sizeof(la_params) >= 172, "the fake driver's record holds every parameter");
    long long t[9];
    packed_tensor(l, 0, 4, t);
    ASSERT_EQ((unsigned long long)t[0], (unsigned long long)u.pool);
    ASSERT_EQ(t[1], P);
    ASSERT_EQ(t[2], H);
    ASSERT_EQ(t[3], R);
    ASSERT_EQ(t[4], C);
    ASSERT_EQ(t[5], (long long)H * RC);
    ASSERT_EQ(t[8], 1);
    packed_tensor(l, 72, 1, t);
    ASSERT_EQ((unsigned long long)t[0], (unsigned long long)u.slots);
    ASSERT_EQ(t[1], N);
    ASSERT_EQ(t[2], 1);
    packed_tensor(l, 96, 4, t);
    ASSERT_EQ((unsigned long long)t[0], (unsigned long long)u.batch);
    ASSERT_EQ(t[1], N);
    ASSERT_EQ(t[6], (long long)RC);
    int scatter;
    memcpy(&scatter, (const unsigned char *)&l->params + 168, 4);
    ASSERT_EQ(scatter, 0);
    int loads = lj_fake_driver_counts()->loads;

    /* Scatter: the same plan, scatter = 1. */
    ok(ctx, lj_state_pool_scatter(ctx, u.b, u.s, u.p, 1, NULL), __LINE__);
    ASSERT_EQ(lj_fake_driver_counts()->loads, loads);
    ASSERT_EQ(lj_fake_launch_count(), 2);
    memcpy(&scatter, (const unsigned char *)&lj_fake_launch_get(1)->params + 168, 4);
    ASSERT_EQ(scatter, 1);

    /* Inside a stream capture: recorded as captured, nothing built. */
    const lj_driver *drv = lj_fake_driver();
    CUstream s;
    CUgraph g;
    ASSERT_EQ(drv->cuStreamCreate(&s, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
    ok(ctx, lj_state_pool_gather(ctx, u.p, u.s, u.b, 0, s), __LINE__);
    ASSERT_EQ(drv->cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    ASSERT_TRUE(lj_fake_launch_get(2)->captured);
    ASSERT_EQ(lj_fake_driver_counts()->loads, loads);
    drv->cuGraphDestroy(g);
    drv->cuStreamDestroy(s);

    /* n = 0: nothing to copy, nothing launched. */
    const int64_t empty4[4] = {0, H, R, C}, empty1[1] = {0};
    lj_test_tensor tb, ts;
    DLTensor *b0 = lj_gpu_tensor(&tb, u.batch, 0, 4, empty4, NULL, lj_test_dl_dtype(LJ_F32));
    DLTensor *s0 = lj_gpu_tensor(&ts, u.slots, 0, 1, empty1, NULL, lj_test_dl_int32());
    ok(ctx, lj_state_pool_scatter(ctx, b0, s0, u.p, 1, NULL), __LINE__);
    ASSERT_EQ(lj_fake_launch_count(), 3);

    /* A narrow width (pairs of floats) with a strided slots view: another plan, launched. */
    const int64_t p6[4] = {P, H, 16, 6}, b6[4] = {N, H, 16, 6}, sstride[1] = {2};
    const int64_t padded[4] = {H * 16 * 8, 16 * 8, 8, 1}; /* rows 16-byte aligned */
    lj_test_tensor tp6, tb6, ts2;
    DLTensor *pp = lj_gpu_tensor(&tp6, u.pool, 0, 4, p6, padded, lj_test_dl_dtype(LJ_F32));
    DLTensor *bb = lj_gpu_tensor(&tb6, u.batch, 0, 4, b6, padded, lj_test_dl_dtype(LJ_F32));
    DLTensor *ss = lj_gpu_tensor(&ts2, u.slots, 0, 1, slots_shape, sstride, lj_test_dl_int32());
    ok(ctx, lj_state_pool_gather(ctx, pp, ss, bb, 0, NULL), __LINE__);
    ASSERT_EQ(lj_fake_launch_count(), 4);
    ASSERT_EQ(lj_fake_launch_get(3)->block[0], 64u); /* 48 pairs: the narrowest CTA, one */
    ASSERT_EQ(lj_fake_launch_get(3)->grid[1], 1u);
    packed_tensor(lj_fake_launch_get(3), 72, 1, t);
    ASSERT_EQ(t[2], 2);

    lajit_ctx_destroy(ctx);
    views_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(argument_errors)
{
    lj_fake_driver_reset();
    pool_views u;
    views_open(&u);
    lajit_ctx *ctx = fake_ctx(0);
    const DLDataType f32 = lj_test_dl_dtype(LJ_F32), f16 = lj_test_dl_dtype(LJ_F16);
    lj_test_tensor t, t2;

    ASSERT_STATUS(lj_state_pool_gather(NULL, u.p, u.s, u.b, 0, NULL), LAJIT_ERR_INVALID_ARGUMENT);
    refused(ctx, lj_state_pool_gather(ctx, u.p, NULL, u.b, 0, NULL), LAJIT_ERR_INVALID_ARGUMENT,
            "lj_state_pool_gather: pool, slots and dst are required", __LINE__);
    refused(ctx, lj_state_pool_scatter(ctx, NULL, u.s, u.p, 1, NULL), LAJIT_ERR_INVALID_ARGUMENT,
            "lj_state_pool_scatter: pool, slots and src are required", __LINE__);
    /* Dtypes and ranks. */
    refused(ctx,
            lj_state_pool_gather(ctx, lj_gpu_tensor(&t, u.pool, 0, 4, pool_shape, NULL, f16), u.s,
                                 u.b, 0, NULL),
            LAJIT_ERR_INVALID_ARGUMENT, "pool is float16; pooled states are float32", __LINE__);
    refused(ctx,
            lj_state_pool_scatter(ctx, lj_gpu_tensor(&t, u.batch, 0, 3, batch_shape, NULL, f32),
                                  u.s, u.p, 1, NULL),
            LAJIT_ERR_INVALID_ARGUMENT, "src must be float32 [n, H, R, C]", __LINE__);
    refused(ctx,
            lj_state_pool_gather(
                ctx, u.p,
                lj_gpu_tensor(&t, u.slots, 0, 1, slots_shape, NULL, (DLDataType){kDLInt, 64, 1}),
                u.b, 0, NULL),
            LAJIT_ERR_INVALID_ARGUMENT, "slots is int64 [3]; expected int32 [n] = [3]", __LINE__);
    /* Shapes. */
    const int64_t zero_h[4] = {P, 0, R, C}, other_c[4] = {N, H, R, C + 4}, four[1] = {N + 1};
    refused(ctx,
            lj_state_pool_gather(ctx, lj_gpu_tensor(&t, u.pool, 0, 4, zero_h, NULL, f32), u.s, u.b,
                                 0, NULL),
            LAJIT_ERR_INVALID_ARGUMENT, "pool [P, H, R, C] has H = 0", __LINE__);
    refused(ctx,
            lj_state_pool_gather(ctx, u.p, u.s,
                                 lj_gpu_tensor(&t, u.batch, 0, 4, other_c, NULL, f32), 0, NULL),
            LAJIT_ERR_INVALID_ARGUMENT,
            "dst is [3, 3, 64, 36]; the pool makes its states [3, 64, 32] (H, R, C)", __LINE__);
    refused(ctx,
            lj_state_pool_scatter(ctx, u.b,
                                  lj_gpu_tensor(&t, u.slots, 0, 1, four, NULL, lj_test_dl_int32()),
                                  u.p, 1, NULL),
            LAJIT_ERR_INVALID_ARGUMENT, "slots is int32 [4]; expected int32 [n] = [3]", __LINE__);
    /* What the family's declaration checks: alignment, unit last stride, aliasing. */
    refused(ctx,
            lj_state_pool_gather(ctx, lj_gpu_tensor(&t, u.pool, 4, 4, pool_shape, NULL, f32), u.s,
                                 u.b, 0, NULL),
            LAJIT_ERR_INVALID_ARGUMENT, "la_state_pool: pool's address", __LINE__);
    const int64_t strided[4] = {(int64_t)H * RC * 2, (int64_t)RC * 2, C * 2, 2};
    refused(ctx,
            lj_state_pool_gather(ctx, u.p, u.s,
                                 lj_gpu_tensor(&t, u.batch, 0, 4, batch_shape, strided, f32), 0,
                                 NULL),
            LAJIT_ERR_INVALID_ARGUMENT, "last stride", __LINE__);
    refused(ctx,
            lj_state_pool_scatter(ctx, lj_gpu_tensor(&t2, u.pool, 0, 4, batch_shape, NULL, f32),
                                  u.s, u.p, 1, NULL),
            LAJIT_ERR_INVALID_ARGUMENT, "outputs pool and states share elements", __LINE__);
    lajit_ctx_destroy(ctx);
    views_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* Checked mode reads the slots back: -1, s and FRESH(s) with s < P pass; a slot at or past P is
 * refused both ways, and a slot named twice in a scatter (a gather may read one twice). */
LJ_TEST(checked_mode_reads_the_slots)
{
    need_nvrtc();
    lj_fake_driver_reset();
    pool_views u;
    views_open(&u);
    lajit_ctx *ctx = fake_ctx(LAJIT_CTX_CHECKED);
    int32_t *sl = (int32_t *)(uintptr_t)u.slots;
    ok(ctx, lj_state_pool_gather(ctx, u.p, u.s, u.b, 0, NULL), __LINE__);
    ok(ctx, lj_state_pool_scatter(ctx, u.b, u.s, u.p, 1, NULL), __LINE__);
    ASSERT_EQ(lj_fake_launch_count(), 2);
    sl[0] = P;
    refused(ctx, lj_state_pool_gather(ctx, u.p, u.s, u.b, 0, NULL), LAJIT_ERR_CHECK_FAILED,
            "lj_state_pool_gather: slots[0] = 5 names slot 5; the pool holds 5", __LINE__);
    sl[0] = 4;
    sl[2] = LAJIT_SLOT_FRESH(P);
    refused(ctx, lj_state_pool_scatter(ctx, u.b, u.s, u.p, 1, NULL), LAJIT_ERR_CHECK_FAILED,
            "slots[2] = -7 names slot 5", __LINE__);
    sl[2] = INT32_MIN; /* FRESH(2^31 - 2) */
    refused(ctx, lj_state_pool_gather(ctx, u.p, u.s, u.b, 0, NULL), LAJIT_ERR_CHECK_FAILED,
            "names slot 2147483646", __LINE__);
    sl[2] = LAJIT_SLOT_FRESH(4); /* slot 4 twice */
    ok(ctx, lj_state_pool_gather(ctx, u.p, u.s, u.b, 0, NULL), __LINE__);
    refused(ctx, lj_state_pool_scatter(ctx, u.b, u.s, u.p, 1, NULL), LAJIT_ERR_CHECK_FAILED,
            "slots[2] = -6 names slot 4 again", __LINE__);
    /* A strided view reads the elements it names: slots {4, FRESH(4)->skip at 2, ...}. */
    sl[1] = 3;
    sl[2] = LAJIT_SLOT_SKIP;
    sl[3] = 1;
    sl[4] = 1;
    const int64_t sstride[1] = {2};
    lj_test_tensor ts;
    DLTensor *ss = lj_gpu_tensor(&ts, u.slots, 0, 1, slots_shape, sstride, lj_test_dl_int32());
    ok(ctx, lj_state_pool_scatter(ctx, u.b, ss, u.p, 1, NULL), __LINE__); /* 4, -1, 1 */
    sl[2] = 4;
    refused(ctx, lj_state_pool_scatter(ctx, u.b, ss, u.p, 1, NULL), LAJIT_ERR_CHECK_FAILED,
            "slots[1] = 4 names slot 4 again", __LINE__);
    lajit_ctx_destroy(ctx);
    views_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}
