/* launch_path.c — the whole op path with no GPU, through the fake driver (tests/support/
 * fake_driver.h): plan building (family spec, template, NVRTC, cache, module load), the launch
 * geometry and the la_params the kernel receives, plan reuse on the hot path, the disk cache
 * shared by a second context, graph capture, and fault injection at every allocation, NVRTC
 * call and driver call along the path, each ending in a clear status with nothing leaked
 * (ASan) and every driver resource given back (the fake counts them). */
#include "test.h"

#include "context.h"
#include "fake_driver.h"

enum { B = 2, H = 3, N = 5, D = 32, E = 16 };

typedef struct setup {
    CUcontext cuctx;
    CUdeviceptr q, k, v, o, s, s0;
    int64_t qshape[4], vshape[4], sshape[1], stshape[4];
    DLTensor tq, tk, tv, to, ts, ts0;
    lajit_attn_fwd_args args;
} setup;

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

/* Fake device memory for a float32 forward with decay and both states (final aliases initial). */
static void setup_open(setup *u)
{
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    memset(u, 0, sizeof *u);
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&u->cuctx, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(u->cuctx), CUDA_SUCCESS);
    size_t nq = (size_t)B * H * N * D * 4, nv = (size_t)B * H * N * E * 4;
    ASSERT_EQ(drv->cuMemAlloc(&u->q, nq), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->k, nq), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->v, nv), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->o, nv), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->s, H * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->s0, (size_t)B * H * D * E * 4), CUDA_SUCCESS);
    int64_t qs[4] = {B, H, N, D}, vs[4] = {B, H, N, E}, st[4] = {B, H, D, E};
    memcpy(u->qshape, qs, sizeof qs);
    memcpy(u->vshape, vs, sizeof vs);
    memcpy(u->stshape, st, sizeof st);
    u->sshape[0] = H;
    u->tq = make(u->q, 4, u->qshape, kDLFloat, 32);
    u->tk = make(u->k, 4, u->qshape, kDLFloat, 32);
    u->tv = make(u->v, 4, u->vshape, kDLFloat, 32);
    u->to = make(u->o, 4, u->vshape, kDLFloat, 32);
    u->ts = make(u->s, 1, u->sshape, kDLFloat, 32);
    u->ts0 = make(u->s0, 4, u->stshape, kDLFloat, 32);
    u->args.struct_size = sizeof u->args;
    u->args.q = &u->tq;
    u->args.k = &u->tk;
    u->args.v = &u->tv;
    u->args.o = &u->to;
    u->args.s = &u->ts;
    u->args.scale = 0.5f;
    u->args.initial_state = &u->ts0;
    u->args.final_state = &u->ts0;
    u->args.family = "la_recurrent";
}

static void setup_close(setup *u)
{
    const lj_driver *drv = lj_fake_driver();
    ASSERT_EQ(drv->cuCtxSetCurrent(u->cuctx), CUDA_SUCCESS);
    CUdeviceptr all[] = {u->q, u->k, u->v, u->o, u->s, u->s0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ASSERT_EQ(drv->cuMemFree(all[i]), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

static lajit_ctx *fake_ctx(uint32_t flags)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = flags;
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

LJ_TEST(fwd_launch_geometry_and_params)
{
    require_nvrtc();
    lj_fake_driver_reset();
    setup u;
    setup_open(&u);
    lajit_ctx *ctx = fake_ctx(0);
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    ASSERT_EQ(lj_fake_launch_count(), 1);
    const lj_fake_launch *l = lj_fake_launch_get(0);
    ASSERT_STREQ(l->entry, "la_recurrent_fwd");
    ASSERT_TRUE(l->grid[0] >= 1 && l->grid[1] == H && l->grid[2] == B);
    ASSERT_EQ(l->params.q.ptr, u.q);
    ASSERT_EQ(l->params.o.ptr, u.o);
    ASSERT_EQ(l->params.q.s0, H * N * D);
    ASSERT_EQ(l->params.q.s1, N * D);
    ASSERT_EQ(l->params.q.s2, D);
    ASSERT_EQ(l->params.q.s3, 1);
    ASSERT_EQ(l->params.s0.ptr, u.s0);
    ASSERT_EQ(l->params.sn.ptr, u.s0);
    ASSERT_EQ(l->params.s0.s2, E); /* KV: row d has stride E */
    ASSERT_EQ(l->params.decay, u.s);
    ASSERT_EQ(l->params.B, B);
    ASSERT_EQ(l->params.N, N);
    ASSERT_EQ(l->params.D, D);
    ASSERT_EQ(l->params.E, E);
    ASSERT_TRUE(l->params.scale == 0.5f);

    /* Same bucket: the hot path reuses the plan (no second module load). */
    int loads = lj_fake_driver_counts()->loads;
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    ASSERT_EQ(lj_fake_driver_counts()->loads, loads);
    ASSERT_EQ(lj_fake_launch_count(), 2);

    /* VK states: logical (d, e) strides swap. */
    u.stshape[2] = E;
    u.stshape[3] = D;
    u.args.flags = LAJIT_STATE_VK;
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    l = lj_fake_launch_get(2);
    ASSERT_EQ(l->params.s0.s2, 1);
    ASSERT_EQ(l->params.s0.s3, D);
    lajit_ctx_destroy(ctx);
    setup_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(second_context_served_by_disk_cache)
{
    require_nvrtc();
    lj_fake_driver_reset();
    setup u;
    setup_open(&u);
    lajit_ctx *a = fake_ctx(0);
    ASSERT_OK(lajit_attn_fwd(a, &u.args));
    lajit_ctx_destroy(a);
    /* A new context finds the cubin on disk: it must not compile. Fail the first NVRTC call
     * that is not the version query, by failing any call after the version's (count them). */
    lajit_ctx *b = fake_ctx(0);
    lj_env *env = lajit__ctx_env(b);
    ASSERT_OK(lajit_attn_fwd(b, &u.args));
    uint64_t nvrtc_calls = env->fault_count[LJ_FAULT_NVRTC];
    lajit_ctx_destroy(b);
    lajit_ctx *c = fake_ctx(LAJIT_CTX_NO_DISK_CACHE);
    env = lajit__ctx_env(c);
    ASSERT_OK(lajit_attn_fwd(c, &u.args));
    ASSERT_TRUE(env->fault_count[LJ_FAULT_NVRTC] > nvrtc_calls + 2); /* it compiled */
    lajit_ctx_destroy(c);
    setup_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(graph_capture_of_a_cached_kernel)
{
    require_nvrtc();
    lj_fake_driver_reset();
    setup u;
    setup_open(&u);
    lajit_ctx *ctx = fake_ctx(0);
    const lj_driver *drv = lj_fake_driver();
    CUstream s;
    ASSERT_EQ(drv->cuStreamCreate(&s, 0), CUDA_SUCCESS);
    u.args.stream = s;
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args)); /* builds the plan */
    lj_env *env = lajit__ctx_env(ctx);
    uint64_t allocs = env->fault_count[LJ_FAULT_ALLOC];
    ASSERT_EQ(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    CUgraph g;
    ASSERT_EQ(drv->cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuGraphDestroy(g), CUDA_SUCCESS);
    ASSERT_EQ(lj_fake_driver_counts()->captured_launches, 1);
    /* The hot path allocated nothing. */
    ASSERT_EQ(env->fault_count[LJ_FAULT_ALLOC], allocs);
    ASSERT_EQ(drv->cuStreamDestroy(s), CUDA_SUCCESS);
    lajit_ctx_destroy(ctx);
    setup_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* Runs the op with the n-th call of `kind` failing in a fresh context; returns the status and
 * whether the fault was reached. */
static lajit_status run_with_fault(setup *u, lj_fault_kind kind, uint64_t n, uint32_t flags,
                                   int *reached)
{
    lajit_ctx *ctx = fake_ctx(flags);
    lj_env *env = lajit__ctx_env(ctx);
    env->fault_at[kind] = n;
    lajit_status st = lajit_attn_fwd(ctx, &u->args);
    *reached = env->fault_count[kind] >= n;
    if (st != LAJIT_OK && lajit_errmsg(ctx)[0] == 0)
        lj_test_fail(__FILE__, __LINE__, "fault %d at call %llu: status %s with no message",
                     (int)kind, (unsigned long long)n, lajit_status_string(st));
    env->fault_at[kind] = 0; /* let destruction give everything back */
    lajit_ctx_destroy(ctx);
    return st;
}

static void sweep(lj_fault_kind kind, uint32_t flags, uint64_t limit)
{
    require_nvrtc();
    lj_fake_driver_reset();
    setup u;
    setup_open(&u);
    /* Warm the disk cache first so allocation and driver sweeps do not recompile each time. */
    lajit_ctx *warm = fake_ctx(0);
    ASSERT_OK(lajit_attn_fwd(warm, &u.args));
    lajit_ctx_destroy(warm);
    uint64_t n;
    int failures = 0;
    for (n = 1; n <= limit; n++) {
        int reached;
        lajit_status st = run_with_fault(&u, kind, n, flags, &reached);
        if (!reached) {
            ASSERT_OK(st);
            break;
        }
        if (st == LAJIT_OK) {
            /* A failure that was recovered from: allowed only where lajit degrades on purpose
             * (a disk-cache write or read failure falls back to memory / compile). */
            continue;
        }
        failures++;
    }
    if (n > limit)
        lj_test_fail(__FILE__, __LINE__, "the path made more than %llu calls of kind %d",
                     (unsigned long long)limit, (int)kind);
    printf("fault kind %d: %llu calls on the path, %d ended in an error status\n", (int)kind,
           (unsigned long long)n - 1, failures);
    ASSERT_TRUE(failures > 0);
    setup_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(fault_every_allocation)
{
    sweep(LJ_FAULT_ALLOC, 0, 20000);
}

LJ_TEST(fault_every_nvrtc_call)
{
    /* Memory-only cache: every run compiles. */
    sweep(LJ_FAULT_NVRTC, LAJIT_CTX_NO_DISK_CACHE, 100);
}

LJ_TEST(fault_every_driver_call)
{
    sweep(LJ_FAULT_DRIVER, 0, 200);
}
