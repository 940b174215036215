/* simple_gla_launch.c — the outside family examples/families/simple_gla_fwd with no GPU: found
 * through lajit_ctx_add_families, its default kernel compiled by NVRTC for the fake sm_90
 * device, and launched through lajit_launch and the fake driver with the views the gpu test and
 * the FLA benchmark pass (q, k, v, o as [B, N, H, .] memory, g as a strided [B, N, H] view, the
 * states left out): the grid {E / (WGS·TILE_V), H, B}, the block and the first packed parameter
 * (q's lj_arg<4>) are checked, and the declaration's refusals that the kernel relies on (a q row
 * not 16-byte aligned, a last stride other than 1) are seen. */
#include "test.h"

#include "context.h"
#include "fake_driver.h"
#include "nvrtc.h"

enum { B = 2, H = 3, N = 1000, D = 128, E = 128 };

typedef struct gla_views {
    CUcontext cuctx;
    CUdeviceptr q, k, v, g, o;
    int64_t qshape[4], vshape[4], gshape[3], qstr[4], vstr[4], gstr[3];
    DLTensor tq, tk, tv, tg, to;
    lajit_tensor_arg tensors[5];
    lajit_scalar_arg scalars[1];
    lajit_launch_args args;
} gla_views;

static DLTensor view(CUdeviceptr p, int ndim, int64_t *shape, int64_t *strides, uint8_t code,
                     uint8_t bits)
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
    t.strides = strides;
    return t;
}

static void gla_open(gla_views *u)
{
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    memset(u, 0, sizeof *u);
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&u->cuctx, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(u->cuctx), CUDA_SUCCESS);
    size_t nq = (size_t)B * N * H * D, nv = (size_t)B * N * H * E;
    ASSERT_EQ(drv->cuMemAlloc(&u->q, nq * 2), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->k, nq * 2), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->v, nv * 2), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->o, nv * 2), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->g, (size_t)B * N * H * 4), CUDA_SUCCESS);
    /* [B, H, N, .] views of [B, N, H, .] memory (FLA's layout). */
    const int64_t qs[4] = {(int64_t)N * H * D, D, (int64_t)H * D, 1};
    const int64_t vs[4] = {(int64_t)N * H * E, E, (int64_t)H * E, 1};
    const int64_t gs[3] = {(int64_t)N * H, 1, H};
    const int64_t qsh[4] = {B, H, N, D}, vsh[4] = {B, H, N, E}, gsh[3] = {B, H, N};
    memcpy(u->qstr, qs, sizeof qs);
    memcpy(u->vstr, vs, sizeof vs);
    memcpy(u->gstr, gs, sizeof gs);
    memcpy(u->qshape, qsh, sizeof qsh);
    memcpy(u->vshape, vsh, sizeof vsh);
    memcpy(u->gshape, gsh, sizeof gsh);
    u->tq = view(u->q, 4, u->qshape, u->qstr, kDLBfloat, 16);
    u->tk = view(u->k, 4, u->qshape, u->qstr, kDLBfloat, 16);
    u->tv = view(u->v, 4, u->vshape, u->vstr, kDLBfloat, 16);
    u->to = view(u->o, 4, u->vshape, u->vstr, kDLBfloat, 16);
    u->tg = view(u->g, 3, u->gshape, u->gstr, kDLFloat, 32);
    u->tensors[0] = (lajit_tensor_arg){"q", &u->tq};
    u->tensors[1] = (lajit_tensor_arg){"k", &u->tk};
    u->tensors[2] = (lajit_tensor_arg){"v", &u->tv};
    u->tensors[3] = (lajit_tensor_arg){"g", &u->tg};
    u->tensors[4] = (lajit_tensor_arg){"o", &u->to};
    u->scalars[0] = (lajit_scalar_arg){"scale", 0.08838834764831845};
    u->args.struct_size = sizeof u->args;
    u->args.family = "simple_gla_fwd";
    u->args.tensors = u->tensors;
    u->args.n_tensors = 5; /* h0 and ht left out */
    u->args.scalars = u->scalars;
    u->args.n_scalars = 1;
}

static void gla_close(gla_views *u)
{
    const lj_driver *drv = lj_fake_driver();
    drv->cuMemFree(u->q);
    drv->cuMemFree(u->k);
    drv->cuMemFree(u->v);
    drv->cuMemFree(u->o);
    drv->cuMemFree(u->g);
    drv->cuDevicePrimaryCtxRelease(0);
}

static lajit_ctx *gla_ctx(void)
{
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s/examples/families", lj_test_source_dir());
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DISK_CACHE;
    desc.autotune = LAJIT_AUTOTUNE_OFF;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    ASSERT_OK(lajit_ctx_add_families(ctx, dir));
    lajit__ctx_set_driver(ctx, lj_fake_driver());
    return ctx;
}

LJ_TEST(default_launch_through_family_path)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    int major, minor;
    if (lj_nvrtc_version(&env, &major, &minor) != LAJIT_OK)
        lj_test_skip("NVRTC not available");
    lj_fake_driver_reset();
    gla_views u;
    gla_open(&u);
    lajit_ctx *ctx = gla_ctx();
    lajit_status st = lajit_launch(ctx, &u.args);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "lajit_launch: %s: %s", lajit_status_string(st),
                     lajit_errmsg(ctx));
    ASSERT_EQ(lj_fake_launch_count(), 1);
    const lj_fake_launch *l = lj_fake_launch_get(0);
    ASSERT_STREQ(l->entry, "simple_gla_fwd");
    /* B·H = 6 heads on the fake device's SMs: one warpgroup of 16 columns and the helper
     * warpgroup (family.lua's default: HELPER with PREFETCH, the CTA alone on its SM), so E / 16
     * CTAs per head of 256 threads. */
    ASSERT_EQ(l->grid[0], E / 16);
    ASSERT_EQ(l->grid[1], (unsigned)H);
    ASSERT_EQ(l->grid[2], (unsigned)B);
    ASSERT_EQ(l->block[0], 256u);
    ASSERT_TRUE(l->smem > 100000u);
    /* q's lj_arg<4>: address, sizes [B, H, N, D], strides of the [B, N, H, D] memory. */
    long long first[9];
    memcpy(first, &l->params, sizeof first);
    ASSERT_EQ((unsigned long long)first[0], (unsigned long long)u.q);
    ASSERT_EQ(first[1], B);
    ASSERT_EQ(first[2], H);
    ASSERT_EQ(first[3], N);
    ASSERT_EQ(first[4], D);
    ASSERT_EQ(first[5], (long long)N * H * D);
    ASSERT_EQ(first[6], D);
    ASSERT_EQ(first[7], (long long)H * D);
    ASSERT_EQ(first[8], 1);

    /* The kernel copies rows in 16-byte pieces: a q view one element in is refused, and so is a
     * last stride other than 1. */
    u.tq.byte_offset = 2;
    ASSERT_STATUS(lajit_launch(ctx, &u.args), LAJIT_ERR_INVALID_ARGUMENT);
    u.tq.byte_offset = 0;
    int64_t bad[4] = {(int64_t)N * H * D, D, (int64_t)H * D, 2};
    u.tk.strides = bad;
    ASSERT_STATUS(lajit_launch(ctx, &u.args), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "last stride");
    u.tk.strides = u.qstr;
    ASSERT_OK(lajit_launch(ctx, &u.args));
    ASSERT_EQ(lj_fake_launch_count(), 2);
    lajit_ctx_destroy(ctx);
    gla_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}
