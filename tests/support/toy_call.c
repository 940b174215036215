/* toy_call.c — the test family "toy"'s forward call on the fake driver (toy_call.h). */
#include "toy_call.h"

#include "test.h"

lj_problem toy_problem(void)
{
    lj_problem p;
    memset(&p, 0, sizeof p);
    p.op = LJ_OP_FWD;
    p.dtype = LJ_BF16;
    p.B = 2;
    p.H = 3;
    p.N = 100;
    p.D = 32;
    p.E = 16;
    p.T = 1;
    p.decay = 1;
    return p;
}

DLTensor toy_tensor(CUdeviceptr p, int ndim, int64_t *shape, uint8_t code, uint8_t bits)
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

void toy_open(toy_call *u)
{
    const lj_driver *drv = lj_fake_driver();
    memset(u, 0, sizeof *u);
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&u->cuctx, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(u->cuctx), CUDA_SUCCESS);
    lj_problem p = toy_problem();
    size_t nq = (size_t)p.B * p.H * p.N * p.D * 2, nv = (size_t)p.B * p.H * p.N * p.E * 2;
    ASSERT_EQ(drv->cuMemAlloc(&u->q, nq), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->k, nq), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->v, nv), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->o, nv), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->s, (size_t)p.H * 4), CUDA_SUCCESS);
    int64_t qs[4] = {p.B, p.H, p.N, p.D}, vs[4] = {p.B, p.H, p.N, p.E};
    memcpy(u->qshape, qs, sizeof qs);
    memcpy(u->vshape, vs, sizeof vs);
    u->sshape[0] = p.H;
    u->tq = toy_tensor(u->q, 4, u->qshape, kDLBfloat, 16);
    u->tk = toy_tensor(u->k, 4, u->qshape, kDLBfloat, 16);
    u->tv = toy_tensor(u->v, 4, u->vshape, kDLBfloat, 16);
    u->to = toy_tensor(u->o, 4, u->vshape, kDLBfloat, 16);
    u->ts = toy_tensor(u->s, 1, u->sshape, kDLFloat, 32);
    u->args.struct_size = sizeof u->args;
    u->args.q = &u->tq;
    u->args.k = &u->tk;
    u->args.v = &u->tv;
    u->args.o = &u->to;
    u->args.s = &u->ts;
    u->args.scale = 1.0f;
    u->args.family = "toy";
}

void toy_close(toy_call *u)
{
    const lj_driver *drv = lj_fake_driver();
    ASSERT_EQ(drv->cuCtxSetCurrent(u->cuctx), CUDA_SUCCESS);
    CUdeviceptr all[] = {u->q, u->k, u->v, u->o, u->s};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ASSERT_EQ(drv->cuMemFree(all[i]), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

void toy_last_launch(unsigned *block, unsigned *smem)
{
    const lj_fake_launch *l = lj_fake_launch_get(lj_fake_launch_count() - 1);
    ASSERT_TRUE(l != NULL);
    *block = l->block[0];
    *smem = l->smem;
}

lj_tune_id toy_id(lajit_ctx *ctx)
{
    lj_family *f;
    lj_device *dev;
    ASSERT_OK(lajit__ctx_family(ctx, "toy", &f));
    ASSERT_OK(lajit__ctx_device(ctx, &dev));
    lj_problem p = toy_problem();
    lj_tune_id id;
    ASSERT_OK(lj_tune_id_make(lajit__ctx_env(ctx), f, dev, &p, &id));
    return id;
}
