/* launch_path.c — the whole op path with no GPU, through the fake driver (tests/support/
 * fake_driver.h): plan building (family spec, template, NVRTC, cache, module load), the launch
 * geometry and the la_params the kernel receives, plan reuse on the hot path, the disk cache
 * shared by a second context, graph capture, and fault injection at every allocation, NVRTC
 * call and driver call along the path, each ending in a clear status with nothing leaked
 * (ASan) and every driver resource given back (the fake counts them). */
#include <pthread.h>

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

/* The backward's passes through the fake driver: dq, dv (+ dS_0), dk as scans of the forward
 * kernel over permuted inputs, then ds after zeroing its ticket; a second call reuses the four
 * plans; the context's ds workspace is freed with the context. */
LJ_TEST(bwd_passes_and_their_params)
{
    require_nvrtc();
    lj_fake_driver_reset();
    setup u;
    setup_open(&u);
    const lj_driver *drv = lj_fake_driver();
    CUdeviceptr g, dq, dk, dv, dsn, ds0, ds;
    size_t nq = (size_t)B * H * N * D * 4, nv = (size_t)B * H * N * E * 4,
           ns = (size_t)B * H * D * E * 4;
    ASSERT_EQ(drv->cuMemAlloc(&g, nv), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&dq, nq), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&dk, nq), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&dv, nv), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&dsn, ns), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&ds0, ns), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&ds, H * 4), CUDA_SUCCESS);
    DLTensor tg = make(g, 4, u.vshape, kDLFloat, 32), tdq = make(dq, 4, u.qshape, kDLFloat, 32);
    DLTensor tdk = make(dk, 4, u.qshape, kDLFloat, 32), tdv = make(dv, 4, u.vshape, kDLFloat, 32);
    DLTensor tdsn = make(dsn, 4, u.stshape, kDLFloat, 32),
             tds0 = make(ds0, 4, u.stshape, kDLFloat, 32);
    DLTensor tds = make(ds, 1, u.sshape, kDLFloat, 32);
    lajit_attn_bwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &u.tq, a.k = &u.tk, a.v = &u.tv, a.dout = &tg;
    a.dq = &tdq, a.dk = &tdk, a.dv = &tdv;
    a.s = &u.ts, a.ds = &tds, a.scale = 0.5f;
    a.initial_state = &u.ts0, a.d_final_state = &tdsn, a.d_initial_state = &tds0;

    lajit_ctx *ctx = fake_ctx(0);
    int allocs = lj_fake_driver_counts()->allocs;
    ASSERT_OK(lajit_attn_bwd(ctx, &a));
    ASSERT_EQ(lj_fake_driver_counts()->allocs, allocs + 1); /* the context's ds workspace */
    ASSERT_EQ(lj_fake_launch_count(), 4);
    const lj_fake_launch *l0 = lj_fake_launch_get(0), *l1 = lj_fake_launch_get(1);
    const lj_fake_launch *l2 = lj_fake_launch_get(2), *l3 = lj_fake_launch_get(3);
    ASSERT_STREQ(l0->entry, "la_fwd");
    ASSERT_STREQ(l3->entry, "la_bwd_ds");
    /* dq: (dO, v, k) -> dq, from S_0ᵀ (strides swapped); a scan of width E rows, D outputs. */
    ASSERT_EQ(l0->params.q.ptr, g);
    ASSERT_EQ(l0->params.k.ptr, u.v);
    ASSERT_EQ(l0->params.v.ptr, u.k);
    ASSERT_EQ(l0->params.o.ptr, dq);
    ASSERT_EQ(l0->params.s0.ptr, u.s0);
    ASSERT_EQ(l0->params.s0.s2, 1);
    ASSERT_EQ(l0->params.s0.s3, E);
    ASSERT_EQ(l0->params.sn.ptr, 0);
    /* dv: (k, q, dO) -> dv from dS_N, writing dS_0. */
    ASSERT_EQ(l1->params.q.ptr, u.k);
    ASSERT_EQ(l1->params.k.ptr, u.q);
    ASSERT_EQ(l1->params.v.ptr, g);
    ASSERT_EQ(l1->params.o.ptr, dv);
    ASSERT_EQ(l1->params.s0.ptr, dsn);
    ASSERT_EQ(l1->params.s0.s2, E);
    ASSERT_EQ(l1->params.sn.ptr, ds0);
    /* dk: (v, dO, q) -> dk from dS_Nᵀ. */
    ASSERT_EQ(l2->params.q.ptr, u.v);
    ASSERT_EQ(l2->params.k.ptr, g);
    ASSERT_EQ(l2->params.v.ptr, u.q);
    ASSERT_EQ(l2->params.o.ptr, dk);
    ASSERT_EQ(l2->params.s0.ptr, dsn);
    ASSERT_EQ(l2->params.s0.s2, 1);
    /* ds: the plain inputs, the workspace and the output. */
    ASSERT_EQ(l3->params.q.ptr, u.q);
    ASSERT_EQ(l3->params.dout.ptr, g);
    ASSERT_EQ(l3->params.dsn.ptr, dsn);
    ASSERT_EQ(l3->params.dsdecay, ds);
    ASSERT_TRUE(l3->params.workspace != 0 && l3->params.workspace % 16 == 0);
    ASSERT_EQ(l3->grid[1], H);
    ASSERT_EQ(l3->grid[2], B);

    /* Without ds three launches: the dq pass's problem no longer asks for ds, so its bucket
     * (another plan: on sm_90a another kernel) is built once, one module; then the hot path: no
     * new module, no new allocation. */
    int loads = lj_fake_driver_counts()->loads;
    a.ds = NULL;
    ASSERT_OK(lajit_attn_bwd(ctx, &a));
    ASSERT_EQ(lj_fake_launch_count(), 7);
    ASSERT_EQ(lj_fake_driver_counts()->loads, loads + 1);
    ASSERT_OK(lajit_attn_bwd(ctx, &a));
    ASSERT_EQ(lj_fake_launch_count(), 10);
    ASSERT_EQ(lj_fake_driver_counts()->loads, loads + 1);
    ASSERT_EQ(lj_fake_driver_counts()->allocs, allocs + 1);

    /* A caller's workspace that is too small is refused; a large enough one is used. */
    CUdeviceptr ws;
    size_t need = lajit_attn_bwd_workspace_size(B, H, E);
    ASSERT_TRUE(need >= 16 + (size_t)B * H * 4);
    ASSERT_EQ(drv->cuMemAlloc(&ws, need), CUDA_SUCCESS);
    int64_t wshape[1] = {(int64_t)(need / 4) - 1};
    DLTensor tws = make(ws, 1, wshape, kDLFloat, 32);
    a.ds = &tds;
    a.workspace = &tws;
    ASSERT_STATUS(lajit_attn_bwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_TRUE(strstr(lajit_errmsg(ctx), "workspace") != NULL);
    wshape[0] = (int64_t)(need / 4);
    ASSERT_OK(lajit_attn_bwd(ctx, &a));
    ASSERT_EQ(lj_fake_launch_get(lj_fake_launch_count() - 1)->params.workspace, ws);

    lajit_ctx_destroy(ctx);
    CUdeviceptr all[] = {g, dq, dk, dv, dsn, ds0, ds, ws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ASSERT_EQ(drv->cuMemFree(all[i]), CUDA_SUCCESS);
    setup_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* ---- Driver errors an application can tell apart ------------------------------------------ */

static int fault_every_launch(const lj_fake_launch *launch, void *user)
{
    (void)launch;
    (void)user;
    return 1;
}

/* Out of device memory (in a module load, a launch, the backward's workspace allocation) is
 * LAJIT_ERR_DEVICE_OUT_OF_MEMORY; a kernel fault is LAJIT_ERR_DEVICE_FAULT; anything else stays
 * LAJIT_ERR_DRIVER. lajit_last_driver_error gives the raw CUresult and its name, and 0 once a
 * later failure was not a driver call's. */
LJ_TEST(driver_errors_tell_oom_from_fault)
{
    require_nvrtc();
    lj_fake_driver_reset();
    setup u;
    setup_open(&u);
    lajit_ctx *ctx = fake_ctx(0);
    const char *name = "unset";
    ASSERT_EQ(lajit_last_driver_error(ctx, &name), 0);
    ASSERT_STREQ(name, "");
    ASSERT_EQ(lajit_last_driver_error(NULL, &name), 0);
    ASSERT_STREQ(name, "");

    /* Module load: the first call builds the plan. */
    lj_fake_driver_fail("cuModuleLoadData", CUDA_ERROR_OUT_OF_MEMORY);
    ASSERT_STATUS(lajit_attn_fwd(ctx, &u.args), LAJIT_ERR_DEVICE_OUT_OF_MEMORY);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "cuModuleLoadData");
    ASSERT_EQ(lajit_last_driver_error(ctx, &name), CUDA_ERROR_OUT_OF_MEMORY);
    ASSERT_STREQ(name, "CUDA_ERROR_OUT_OF_MEMORY");
    ASSERT_EQ(lajit_last_driver_error(ctx, NULL), CUDA_ERROR_OUT_OF_MEMORY);

    /* The context stays usable once memory is back. */
    lj_fake_driver_fail(NULL, CUDA_SUCCESS);
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));

    /* A launch out of memory, then an ordinary driver error. */
    lj_fake_driver_fail("cuLaunchKernel", CUDA_ERROR_OUT_OF_MEMORY);
    ASSERT_STATUS(lajit_attn_fwd(ctx, &u.args), LAJIT_ERR_DEVICE_OUT_OF_MEMORY);
    ASSERT_EQ(lajit_last_driver_error(ctx, &name), CUDA_ERROR_OUT_OF_MEMORY);
    lj_fake_driver_fail("cuLaunchKernel", CUDA_ERROR_INVALID_VALUE);
    ASSERT_STATUS(lajit_attn_fwd(ctx, &u.args), LAJIT_ERR_DRIVER);
    ASSERT_EQ(lajit_last_driver_error(ctx, &name), CUDA_ERROR_INVALID_VALUE);
    ASSERT_STREQ(name, "CUDA_ERROR_INVALID_VALUE");
    /* A result the driver cannot name. */
    lj_fake_driver_fail("cuLaunchKernel", (CUresult)12345);
    ASSERT_STATUS(lajit_attn_fwd(ctx, &u.args), LAJIT_ERR_DRIVER);
    ASSERT_EQ(lajit_last_driver_error(ctx, &name), 12345);
    ASSERT_STREQ(name, "CUDA error 12345");
    lj_fake_driver_fail(NULL, CUDA_SUCCESS);

    /* A failure that is not the driver's forgets the driver's result. */
    float scale = u.args.scale;
    u.args.scale = 0.0f;
    ASSERT_STATUS(lajit_attn_fwd(ctx, &u.args), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_EQ(lajit_last_driver_error(ctx, &name), 0);
    ASSERT_STREQ(name, "");
    u.args.scale = scale;

    /* The backward's ds workspace allocation. */
    const lj_driver *drv = lj_fake_driver();
    CUdeviceptr g, dq, dk, dv, ds;
    size_t nq = (size_t)B * H * N * D * 4, nv = (size_t)B * H * N * E * 4;
    ASSERT_EQ(drv->cuMemAlloc(&g, nv), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&dq, nq), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&dk, nq), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&dv, nv), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&ds, H * 4), CUDA_SUCCESS);
    DLTensor tg = make(g, 4, u.vshape, kDLFloat, 32), tdq = make(dq, 4, u.qshape, kDLFloat, 32);
    DLTensor tdk = make(dk, 4, u.qshape, kDLFloat, 32), tdv = make(dv, 4, u.vshape, kDLFloat, 32);
    DLTensor tds = make(ds, 1, u.sshape, kDLFloat, 32);
    lajit_attn_bwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &u.tq, a.k = &u.tk, a.v = &u.tv, a.dout = &tg;
    a.dq = &tdq, a.dk = &tdk, a.dv = &tdv;
    a.s = &u.ts, a.ds = &tds, a.scale = 0.5f;
    lj_fake_driver_fail("cuMemAlloc", CUDA_ERROR_OUT_OF_MEMORY);
    ASSERT_STATUS(lajit_attn_bwd(ctx, &a), LAJIT_ERR_DEVICE_OUT_OF_MEMORY);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "workspace");
    ASSERT_EQ(lajit_last_driver_error(ctx, &name), CUDA_ERROR_OUT_OF_MEMORY);
    lj_fake_driver_fail(NULL, CUDA_SUCCESS);

    /* A kernel that faults: its launch succeeds, the next call in the context fails with the
     * sticky error, which says the context is lost. */
    lj_fake_driver_fault_launches(fault_every_launch, NULL, CUDA_ERROR_ILLEGAL_ADDRESS);
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    lj_fake_driver_fault_launches(NULL, NULL, CUDA_SUCCESS);
    ASSERT_STATUS(lajit_attn_fwd(ctx, &u.args), LAJIT_ERR_DEVICE_FAULT);
    ASSERT_EQ(lajit_last_driver_error(ctx, &name), CUDA_ERROR_ILLEGAL_ADDRESS);
    ASSERT_STREQ(name, "CUDA_ERROR_ILLEGAL_ADDRESS");
    lajit_ctx_destroy(ctx);
    /* The fake's broken primary context cannot give memory back: forget it. */
    lj_fake_driver_reset();
}

/* ---- The context's allocator on the eager tuner's path ------------------------------------ */

/* A user allocator that notes calls from any thread but its owner's, and overlapping calls. */
typedef struct owner_alloc {
    pthread_t owner;
    long calls, live;
    int foreign, concurrent, inside;
} owner_alloc;

static void *owner_realloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    owner_alloc *c = user;
    (void)old_size;
    if (!pthread_equal(pthread_self(), c->owner))
        c->foreign++;
    if (c->inside++)
        c->concurrent++;
    void *p = NULL;
    c->calls++;
    if (new_size == 0) {
        c->live -= ptr != NULL;
        free(ptr);
    } else {
        p = realloc(ptr, new_size);
        c->live += p && !ptr;
    }
    c->inside--;
    return p;
}

/* The eager tuner compiles its candidates on worker threads; the context's allocator is still
 * called only on the calling thread, one call at a time, and gets every block back (a guard of
 * lajit.h's promise on the whole path; tests/cpu/nvrtc.c proves the workers' allocations reach
 * it). */
LJ_TEST(eager_tuner_allocates_on_the_calling_thread)
{
    require_nvrtc();
    lj_fake_driver_reset();
    setup u;
    setup_open(&u);
    owner_alloc c;
    memset(&c, 0, sizeof c);
    c.owner = pthread_self();
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.alloc = owner_realloc;
    desc.alloc_user = &c;
    desc.autotune = LAJIT_AUTOTUNE_EAGER; /* the case's fresh cache: every candidate compiles */
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lajit__ctx_set_driver(ctx, lj_fake_driver());
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    ASSERT_TRUE(lj_fake_driver_counts()->contexts_created >= 1); /* the tuner's own context */
    ASSERT_TRUE(c.calls > 0);
    ASSERT_EQ(c.foreign, 0);
    ASSERT_EQ(c.concurrent, 0);
    lajit_ctx_destroy(ctx);
    ASSERT_EQ(c.live, 0);
    setup_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}
