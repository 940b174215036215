/* state_scan.c — lajit_attn_state_scan with no GPU: the built-in custom family la_state_scan as
 * the op reaches it (its kernel compiled by NVRTC for the fake sm_90 device and launched through
 * the fake driver: entry, grid, block, the first packed argument, the hot path's reuse of the
 * plan, a launch inside a stream capture), every argument error the op names in its own terms,
 * the declaration's refusals it relies on (alignment, aliasing), and checked mode reading the
 * lengths and s back (-1, a span starting a new sequence, accepted; -2 and below refused).
 * Values are checked on a GPU by tests/gpu/state_scan.c. */
#include "test.h"

#include "context.h"
#include "fake_driver.h"
#include "gpu.h"
#include "nvrtc.h"

enum { P = 3, B = 2, H = 3, D = 64, E = 32 };
#define DE ((size_t)D * E)

typedef struct scan_views {
    CUcontext cuctx;
    CUdeviceptr m, out, init, fin, s, len;
    lj_test_tensor tm, tout, tinit, tfin, ts, tlen;
    lajit_attn_state_scan_args a;
} scan_views;

static const int64_t states_shape[5] = {P, B, H, D, E}, state_shape[4] = {B, H, D, E};

/* Fake device memory and a valid forward call: decay, int32 [P] lengths, both states. */
static void views_open(scan_views *u)
{
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    memset(u, 0, sizeof *u);
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&u->cuctx, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(u->cuctx), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->m, P * B * H * DE * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->out, P * B * H * DE * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->init, B * H * DE * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->fin, B * H * DE * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->s, H * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->len, P * B * 8), CUDA_SUCCESS);
    /* Fake device memory is host memory: valid values for checked mode. */
    float *s = (float *)(uintptr_t)u->s;
    for (int h = 0; h < H; h++)
        s[h] = 0.25f * (float)h;
    int32_t *len = (int32_t *)(uintptr_t)u->len;
    for (int i = 0; i < P * B; i++)
        len[i] = i;
    const DLDataType f32 = lj_test_dl_dtype(LJ_F32);
    const int64_t hshape[1] = {H}, lshape[1] = {P};
    u->a.struct_size = sizeof u->a;
    u->a.local_states = lj_gpu_tensor(&u->tm, u->m, 0, 5, states_shape, NULL, f32);
    u->a.incoming_states = lj_gpu_tensor(&u->tout, u->out, 0, 5, states_shape, NULL, f32);
    u->a.initial_state = lj_gpu_tensor(&u->tinit, u->init, 0, 4, state_shape, NULL, f32);
    u->a.final_state = lj_gpu_tensor(&u->tfin, u->fin, 0, 4, state_shape, NULL, f32);
    u->a.s = lj_gpu_tensor(&u->ts, u->s, 0, 1, hshape, NULL, f32);
    u->a.lengths = lj_gpu_tensor(&u->tlen, u->len, 0, 1, lshape, NULL, lj_test_dl_int32());
}

static void views_close(scan_views *u)
{
    const lj_driver *drv = lj_fake_driver();
    drv->cuMemFree(u->m);
    drv->cuMemFree(u->out);
    drv->cuMemFree(u->init);
    drv->cuMemFree(u->fin);
    drv->cuMemFree(u->s);
    drv->cuMemFree(u->len);
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

/* The op's family is a built-in custom family with two tunable parameters. */
LJ_TEST(family_is_builtin_custom)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DEVICE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    int found = 0;
    for (const char *const *n = lajit_family_names(); *n; n++)
        found += strcmp(*n, "la_state_scan") == 0;
    ASSERT_EQ(found, 1);
    lajit_family_info info = {.struct_size = sizeof info};
    ASSERT_OK(lajit_family_describe(ctx, "la_state_scan", &info));
    ASSERT_STREQ(info.op, "custom");
    ASSERT_EQ(info.n_params, 2);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(launch_through_the_fake_driver)
{
    need_nvrtc();
    lj_fake_driver_reset();
    scan_views u;
    views_open(&u);
    lajit_ctx *ctx = fake_ctx(0);
    lajit_status st = lajit_attn_state_scan(ctx, &u.a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(st), lajit_errmsg(ctx));
    ASSERT_EQ(lj_fake_launch_count(), 1);
    const lj_fake_launch *l = lj_fake_launch_get(0);
    ASSERT_STREQ(l->entry, "la_state_scan");
    /* 64 x 32 floats in 16-byte vectors: 512 vectors per state, the default's 256 threads. */
    ASSERT_EQ(l->block[0], 256u);
    ASSERT_EQ(l->grid[0], 2u);
    ASSERT_EQ(l->grid[1], (unsigned)H);
    ASSERT_EQ(l->grid[2], (unsigned)B);
    /* The first parameter: local_states' lj_arg<5> (address, sizes, compact strides). */
    long long first[11];
    memcpy(first, &l->params, sizeof first);
    ASSERT_EQ((unsigned long long)first[0], (unsigned long long)u.m);
    ASSERT_EQ(first[1], P);
    ASSERT_EQ(first[2], B);
    ASSERT_EQ(first[3], H);
    ASSERT_EQ(first[4], D);
    ASSERT_EQ(first[5], E);
    ASSERT_EQ(first[6], (long long)B * H * DE);
    ASSERT_EQ(first[10], 1);
    int loads = lj_fake_driver_counts()->loads;

    /* The same bucket again (reverse is a run-time scalar): no new module, one more launch. */
    u.a.flags = LAJIT_SCAN_REVERSE;
    ASSERT_OK(lajit_attn_state_scan(ctx, &u.a));
    ASSERT_EQ(lj_fake_driver_counts()->loads, loads);
    ASSERT_EQ(lj_fake_launch_count(), 2);

    /* Inside a stream capture: recorded as captured, nothing built. */
    const lj_driver *drv = lj_fake_driver();
    CUstream s;
    CUgraph g;
    ASSERT_EQ(drv->cuStreamCreate(&s, 0), CUDA_SUCCESS);
    u.a.stream = s;
    ASSERT_EQ(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
    ASSERT_OK(lajit_attn_state_scan(ctx, &u.a));
    ASSERT_EQ(drv->cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    ASSERT_TRUE(lj_fake_launch_get(2)->captured);
    ASSERT_EQ(lj_fake_driver_counts()->loads, loads);
    drv->cuGraphDestroy(g);
    drv->cuStreamDestroy(s);
    u.a.stream = NULL;

    /* VK states with D != E ([P, B, H, E, D]), int64 per-row lengths as the transposed view of a
     * [B, P] buffer, no s, no initial state: another bucket, launched. */
    const DLDataType f32 = lj_test_dl_dtype(LJ_F32), i64 = {kDLInt, 64, 1};
    const int64_t vk5[5] = {P, B, H, E, D}, vk4[4] = {B, H, E, D}, lshape[2] = {P, B},
                  lstrides[2] = {1, P};
    lj_test_tensor tm, tout, tfin, tlen;
    u.a.local_states = lj_gpu_tensor(&tm, u.m, 0, 5, vk5, NULL, f32);
    u.a.incoming_states = lj_gpu_tensor(&tout, u.out, 0, 5, vk5, NULL, f32);
    u.a.final_state = lj_gpu_tensor(&tfin, u.fin, 0, 4, vk4, NULL, f32);
    u.a.initial_state = NULL;
    u.a.s = NULL;
    u.a.lengths = lj_gpu_tensor(&tlen, u.len, 0, 2, lshape, lstrides, i64);
    u.a.flags = LAJIT_STATE_VK;
    st = lajit_attn_state_scan(ctx, &u.a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "VK: %s: %s", lajit_status_string(st), lajit_errmsg(ctx));
    ASSERT_EQ(lj_fake_launch_count(), 4);
    ASSERT_EQ(lj_fake_launch_get(3)->grid[0], 2u);
    /* Without the flag the same tensors are a KV call of D = 32, E = 64: also served (the scan
     * is elementwise), but VK-shaped states beside a KV-shaped one are refused. */
    u.a.flags = 0;
    ASSERT_OK(lajit_attn_state_scan(ctx, &u.a));
    u.a.flags = LAJIT_STATE_VK;
    lj_test_tensor tinit;
    u.a.initial_state = lj_gpu_tensor(&tinit, u.init, 0, 4, state_shape, NULL, f32);
    ASSERT_STATUS(lajit_attn_state_scan(ctx, &u.a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "initial_state is [2, 3, 64, 32]; local_states makes it "
                                       "[2, 3, 32, 64] [B, H, E, D]");

    lajit_ctx_destroy(ctx);
    views_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* One bad call: the status and a piece of the message. */
static void refused(lajit_ctx *ctx, const lajit_attn_state_scan_args *a, lajit_status want,
                    const char *msg)
{
    lajit_status st = lajit_attn_state_scan(ctx, a);
    if (st != want)
        lj_test_fail(__FILE__, __LINE__, "expected %s (\"%s\"), got %s: %s",
                     lajit_status_string(want), msg, lajit_status_string(st), lajit_errmsg(ctx));
    ASSERT_CONTAINS(lajit_errmsg(ctx), msg);
}

LJ_TEST(argument_errors)
{
    lj_fake_driver_reset();
    scan_views u;
    views_open(&u);
    lajit_ctx *ctx = fake_ctx(0);
    const DLDataType f32 = lj_test_dl_dtype(LJ_F32), f16 = lj_test_dl_dtype(LJ_F16);
    lajit_attn_state_scan_args a;
    lj_test_tensor t, t2;

    ASSERT_STATUS(lajit_attn_state_scan(NULL, &u.a), LAJIT_ERR_INVALID_ARGUMENT);
    refused(ctx, NULL, LAJIT_ERR_INVALID_ARGUMENT, "args is NULL");
    a = u.a;
    a.struct_size--;
    refused(ctx, &a, LAJIT_ERR_STRUCT_SIZE, "struct_size");
    a = u.a;
    a.flags = 0x4;
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT, "unknown flags 0x4");
    a = u.a;
    a.lengths = NULL;
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT,
            "local_states, lengths and incoming_states are "
            "required");
    a = u.a;
    a.incoming_states = NULL;
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT, "are required");

    /* Dtypes. */
    a = u.a;
    a.local_states = lj_gpu_tensor(&t, u.m, 0, 5, states_shape, NULL, f16);
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT,
            "local_states is float16; the scan's states are "
            "float32");
    a = u.a;
    a.final_state = lj_gpu_tensor(&t, u.fin, 0, 4, state_shape, NULL, f16);
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT, "final_state is float16");
    const int64_t lshape[1] = {P};
    a = u.a;
    a.lengths = lj_gpu_tensor(&t, u.len, 0, 1, lshape, NULL, f32);
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT,
            "lengths is float32; span lengths are int32 or "
            "int64");
    const int64_t hshape[1] = {H};
    a = u.a;
    a.s = lj_gpu_tensor(&t, u.s, 0, 1, hshape, NULL, lj_test_dl_int32());
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT, "s is int32 [3]; expected float32 [H] = [3]");

    /* Ranks and shapes. */
    a = u.a;
    a.local_states = lj_gpu_tensor(&t, u.m, 0, 4, state_shape, NULL, f32);
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT,
            "local_states must be [P, B, H, D, E]; it has 4 dimensions");
    a = u.a;
    a.flags = LAJIT_STATE_VK;
    a.local_states = lj_gpu_tensor(&t, u.m, 0, 4, state_shape, NULL, f32);
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT, "must be [P, B, H, E, D]");
    const int64_t neg[5] = {-1, B, H, D, E}, zero_h[5] = {P, B, 0, D, E};
    a = u.a;
    a.local_states = lj_gpu_tensor(&t, u.m, 0, 5, neg, NULL, f32);
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT, "P (spans) = -1; every size must be at least 1");
    a = u.a;
    a.local_states = lj_gpu_tensor(&t, u.m, 0, 5, zero_h, NULL, f32);
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT, "H = 0");
    const int64_t other_p[5] = {P - 1, B, H, D, E};
    a = u.a;
    a.incoming_states = lj_gpu_tensor(&t, u.out, 0, 5, other_p, NULL, f32);
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT,
            "incoming_states is [2, 2, 3, 64, 32]; local_states makes it [3, 2, 3, 64, 32]");
    const int64_t other_b[4] = {B + 1, H, D, E};
    a = u.a;
    a.initial_state = lj_gpu_tensor(&t, u.init, 0, 4, other_b, NULL, f32);
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT, "initial_state is [3, 3, 64, 32]");
    const int64_t lbad[1] = {P + 1}, lbad2[2] = {P, B + 1}, lbad3[2] = {B, P};
    a = u.a;
    a.lengths = lj_gpu_tensor(&t, u.len, 0, 1, lbad, NULL, lj_test_dl_int32());
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT, "lengths is [4]; expected [P] = [3] or [P, B]");
    a = u.a;
    a.lengths = lj_gpu_tensor(&t, u.len, 0, 2, lbad2, NULL, lj_test_dl_int32());
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT, "lengths is [3, 3]");
    a = u.a;
    a.lengths = lj_gpu_tensor(&t, u.len, 0, 2, lbad3, NULL, lj_test_dl_int32());
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT, "transposed view");
    const int64_t hbad[1] = {H + 1}, hstride[1] = {2};
    a = u.a;
    a.s = lj_gpu_tensor(&t, u.s, 0, 1, hbad, NULL, f32);
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT, "s is float32 [4]");
    a = u.a;
    a.s = lj_gpu_tensor(&t, u.s, 0, 1, hshape, hstride, f32);
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT, "contiguous");

    /* What the family's declaration checks: 16-byte alignment of the states, a unit last
     * stride, outputs that share no element with anything else. */
    a = u.a;
    a.local_states = lj_gpu_tensor(&t, u.m, 4, 5, states_shape, NULL, f32);
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT, "la_state_scan: local_states's address");
    const int64_t strided[5] = {(int64_t)B * H * DE * 2, (int64_t)H * DE * 2, DE * 2, E * 2, 2};
    a = u.a;
    a.incoming_states = lj_gpu_tensor(&t, u.out, 0, 5, states_shape, strided, f32);
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT, "last stride");
    a = u.a;
    a.incoming_states = lj_gpu_tensor(&t, u.m, 0, 5, states_shape, NULL, f32);
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT,
            "incoming_states shares elements with input "
            "local_states");
    a = u.a;
    a.final_state = lj_gpu_tensor(&t2, u.init, 0, 4, state_shape, NULL, f32);
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT,
            "final_state shares elements with input "
            "initial_state");
    a = u.a;
    a.family = "la_fwd";
    refused(ctx, &a, LAJIT_ERR_INVALID_ARGUMENT, "la_fwd is an attention family");

    lajit_ctx_destroy(ctx);
    views_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* Checked mode reads the lengths (int32 and int64, [P] and [P, B] views) and s back. */
LJ_TEST(checked_mode_reads_lengths_and_s)
{
    need_nvrtc();
    lj_fake_driver_reset();
    scan_views u;
    views_open(&u);
    lajit_ctx *ctx = fake_ctx(LAJIT_CTX_CHECKED);
    ASSERT_OK(lajit_attn_state_scan(ctx, &u.a));
    int32_t *len = (int32_t *)(uintptr_t)u.len;
    len[2] = -5;
    refused(ctx, &u.a, LAJIT_ERR_CHECK_FAILED, "lengths[2] = -5: span lengths must be >= 0, or -1");
    /* -1 marks a span that starts a new sequence: accepted; -2 is not a mark. */
    len[2] = -1;
    ASSERT_OK(lajit_attn_state_scan(ctx, &u.a));
    len[2] = -2;
    refused(ctx, &u.a, LAJIT_ERR_CHECK_FAILED, "lengths[2] = -2");
    len[2] = 2;
    /* Per row, as the transposed view of [B, P] int64 memory: row 1 of span 2 is element 5. */
    int64_t *len64 = (int64_t *)(uintptr_t)u.len;
    for (int i = 0; i < P * B; i++)
        len64[i] = (int64_t)i << 32;
    const int64_t lshape[2] = {P, B}, lstrides[2] = {1, P};
    lj_test_tensor tl;
    lajit_attn_state_scan_args a = u.a;
    a.lengths = lj_gpu_tensor(&tl, u.len, 0, 2, lshape, lstrides, (DLDataType){kDLInt, 64, 1});
    ASSERT_OK(lajit_attn_state_scan(ctx, &a));
    len64[5] = -1;
    ASSERT_OK(lajit_attn_state_scan(ctx, &a));
    len64[5] = -2;
    refused(
        ctx, &a, LAJIT_ERR_CHECK_FAILED,
        "lengths[2, 1] = -2: span lengths must be >= 0, or -1 (a span starting a new sequence)");
    len64[5] = INT64_MIN;
    refused(ctx, &a, LAJIT_ERR_CHECK_FAILED, "lengths[2, 1] = -9223372036854775808");
    len64[5] = 0;
    float *s = (float *)(uintptr_t)u.s;
    s[1] = -0.5f;
    refused(ctx, &a, LAJIT_ERR_CHECK_FAILED, "s[1] = -0.5");
    s[1] = 0.5f;
    ASSERT_OK(lajit_attn_state_scan(ctx, &a));
    lajit_ctx_destroy(ctx);
    views_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}
