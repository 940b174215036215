/* state_only.c — lajit_attn_fwd with o NULL (issue 16's building block: a span's local state)
 * through the fake driver: without final_state the call is refused with a message that says so;
 * with it, the plan's problem is state_only (the plan log line names it), la_fwd's STATE_ONLY
 * kernel is launched with q and o absent (a different module from the full forward's), and the
 * final state is the one given. No GPU needed (NVRTC compiles la_fwd for the fake device). */
#include <string.h>

#include "test.h"

#include "context.h"
#include "fake_driver.h"

enum { B = 1, H = 2, N = 37, D = 32, E = 16 };

static DLTensor make(CUdeviceptr p, int ndim, int64_t *shape)
{
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = (void *)(uintptr_t)p;
    t.device.device_type = kDLCUDA;
    t.ndim = ndim;
    t.dtype.code = kDLFloat;
    t.dtype.bits = 32;
    t.dtype.lanes = 1;
    t.shape = shape;
    return t;
}

typedef struct plan_log {
    char text[4096];
} plan_log;

static void keep_plans(void *user, lajit_log_level level, const char *message)
{
    (void)level;
    plan_log *log = user;
    if (strncmp(message, "plan ", 5) == 0) {
        size_t used = strlen(log->text);
        snprintf(log->text + used, sizeof log->text - used, "%s\n", message);
    }
}

static void require_nvrtc(void)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    int major, minor;
    if (lj_nvrtc_version(&env, &major, &minor) != LAJIT_OK)
        lj_test_skip("NVRTC not available");
}

LJ_TEST(o_null_routes_a_state_only_plan)
{
    require_nvrtc();
    lj_fake_driver_reset();
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    CUcontext cuctx;
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&cuctx, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(cuctx), CUDA_SUCCESS);
    CUdeviceptr q, k, v, o, s, sn;
    ASSERT_EQ(drv->cuMemAlloc(&q, (size_t)B * H * N * D * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&k, (size_t)B * H * N * D * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&v, (size_t)B * H * N * E * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&o, (size_t)B * H * N * E * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&s, H * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&sn, (size_t)B * H * D * E * 4), CUDA_SUCCESS);
    int64_t qshape[4] = {B, H, N, D}, vshape[4] = {B, H, N, E}, stshape[4] = {B, H, D, E};
    int64_t hshape[1] = {H};
    DLTensor tq = make(q, 4, qshape), tk = make(k, 4, qshape), tv = make(v, 4, vshape);
    DLTensor to = make(o, 4, vshape), ts = make(s, 1, hshape), tsn = make(sn, 4, stshape);

    plan_log log;
    memset(&log, 0, sizeof log);
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DISK_CACHE;
    desc.log = keep_plans;
    desc.log_user = &log;
    desc.log_level = LAJIT_LOG_INFO;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lajit__ctx_set_driver(ctx, drv);

    lajit_attn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.k = &tk;
    a.v = &tv;
    a.s = &ts;
    a.scale = 1.0f;
    a.family = "la_fwd";

    /* No o and no final state: nothing to compute. */
    ASSERT_STATUS(lajit_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_TRUE(strstr(lajit_errmsg(ctx), "o is NULL and so is final_state") != NULL);
    ASSERT_EQ(lj_fake_launch_count(), 0);

    /* The local state: a state_only plan, la_fwd's kernel with q and o absent. */
    a.final_state = &tsn;
    ASSERT_OK(lajit_attn_fwd(ctx, &a));
    ASSERT_EQ(lj_fake_launch_count(), 1);
    const lj_fake_launch *l = lj_fake_launch_get(0);
    ASSERT_STREQ(l->entry, "la_fwd");
    ASSERT_EQ(l->params.q.ptr, 0);
    ASSERT_EQ(l->params.o.ptr, 0);
    ASSERT_EQ(l->params.k.ptr, k);
    ASSERT_EQ(l->params.sn.ptr, sn);
    ASSERT_TRUE(strstr(log.text, "state_only") != NULL);
    int loads = lj_fake_driver_counts()->loads;

    /* With q and o the same shapes build another plan (another kernel), not state_only. */
    memset(&log, 0, sizeof log);
    a.q = &tq;
    a.o = &to;
    ASSERT_OK(lajit_attn_fwd(ctx, &a));
    ASSERT_EQ(lj_fake_launch_count(), 2);
    ASSERT_EQ(lj_fake_launch_get(1)->params.o.ptr, o);
    ASSERT_EQ(lj_fake_driver_counts()->loads, loads + 1);
    ASSERT_TRUE(log.text[0] != 0 && strstr(log.text, "state_only") == NULL);

    lajit_ctx_destroy(ctx);
    CUdeviceptr all[] = {q, k, v, o, s, sn};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ASSERT_EQ(drv->cuMemFree(all[i]), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    ASSERT_TRUE(lj_fake_driver_balanced());
}
