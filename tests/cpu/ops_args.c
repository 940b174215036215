/* ops_args.c — the ops' argument path through the fake driver: tensors that interleave in one
 * packed buffer but share no element are accepted by the forward, backward and decode (the
 * natural layout of a fused qkv projection and of its gradient), views that really share an
 * element are refused with both names and the reason, the element-level test itself on the
 * layouts it must decide exactly, and the backward workspace size on inputs that would wrap. */
#include "test.h"

#include <stdint.h>

#include "context.h"
#include "fake_driver.h"
#include "op_args.h"
#include "overlap.h"

enum { B = 2, H = 3, N = 5, D = 32, E = 16 };

static DLTensor view(CUdeviceptr p, uint64_t byte_offset, int ndim, int64_t *shape,
                     int64_t *strides)
{
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = (void *)(uintptr_t)p;
    t.byte_offset = byte_offset;
    t.device.device_type = kDLCUDA;
    t.ndim = ndim;
    t.dtype.code = kDLFloat;
    t.dtype.bits = 32;
    t.dtype.lanes = 1;
    t.shape = shape;
    t.strides = strides;
    return t;
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

static CUdeviceptr alloc(size_t bytes)
{
    CUdeviceptr p;
    ASSERT_EQ(lj_fake_driver()->cuMemAlloc(&p, bytes), CUDA_SUCCESS);
    return p;
}

static CUcontext open_fake(void)
{
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    CUcontext c;
    lj_fake_driver_reset();
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&c, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(c), CUDA_SUCCESS);
    return c;
}

/* A packed [B, N, H, W] float32 buffer seen as [B, H, N, width] column slices. */
typedef struct packed {
    int64_t shape[3][4], strides[4];
} packed;

static void packed_init(packed *pk, int W, const int *widths)
{
    int64_t s[4] = {(int64_t)N * H * W, W, (int64_t)H * W, 1};
    memcpy(pk->strides, s, sizeof s);
    for (int i = 0; i < 3; i++) {
        int64_t sh[4] = {B, H, N, widths[i]};
        memcpy(pk->shape[i], sh, sizeof sh);
    }
}

/* The backward's dq, dk, dv as the three slices of one [B, N, H, 2D+E] gradient buffer (a fused
 * qkv projection's): no element shared, so accepted and launched. Real overlaps are refused
 * naming both tensors: dk shifted into dq's columns, and dq on top of the input q. */
LJ_TEST(bwd_packed_qkv_gradient_accepted_real_overlap_refused)
{
    require_nvrtc();
    open_fake();
    const int W = 2 * D + E, widths[3] = {D, D, E};
    packed pk;
    packed_init(&pk, W, widths);
    CUdeviceptr q = alloc((size_t)B * H * N * D * 4), k = alloc((size_t)B * H * N * D * 4);
    CUdeviceptr v = alloc((size_t)B * H * N * E * 4), g = alloc((size_t)B * H * N * E * 4);
    CUdeviceptr grad = alloc((size_t)B * N * H * W * 4);
    int64_t qs[4] = {B, H, N, D}, vs[4] = {B, H, N, E};
    DLTensor tq = view(q, 0, 4, qs, NULL), tk = view(k, 0, 4, qs, NULL);
    DLTensor tv = view(v, 0, 4, vs, NULL), tg = view(g, 0, 4, vs, NULL);
    DLTensor tdq = view(grad, 0, 4, pk.shape[0], pk.strides);
    DLTensor tdk = view(grad, (uint64_t)D * 4, 4, pk.shape[1], pk.strides);
    DLTensor tdv = view(grad, (uint64_t)2 * D * 4, 4, pk.shape[2], pk.strides);
    lajit_attn_bwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &tq, a.k = &tk, a.v = &tv, a.dout = &tg;
    a.dq = &tdq, a.dk = &tdk, a.dv = &tdv;
    a.scale = 1.0f;
    a.family = "la_bwd";
    lajit_ctx *ctx = fake_ctx();
    ASSERT_OK(lajit_attn_bwd(ctx, &a));
    ASSERT_EQ(lj_fake_launch_count(), 3);
    ASSERT_EQ(lj_fake_launch_get(0)->params.o.ptr, grad);
    ASSERT_EQ(lj_fake_launch_get(0)->params.o.s2, H * W);
    ASSERT_EQ(lj_fake_launch_get(2)->params.o.ptr, grad + (CUdeviceptr)D * 4);

    /* dk moved 16 columns left: its first half is dq's second half. */
    tdk.byte_offset = (uint64_t)(D - 16) * 4;
    ASSERT_STATUS(lajit_attn_bwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "outputs dq and dk share elements");
    tdk.byte_offset = (uint64_t)D * 4;
    /* dq written over q, which the dk pass reads. */
    a.dq = &tq;
    ASSERT_STATUS(lajit_attn_bwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "output dq shares elements with input q");
    lajit_ctx_destroy(ctx);
}

/* The forward with q, k, v and o as slices of one [B, N, H, 2D+2E] buffer: accepted; o moved onto
 * v's columns: refused, naming o and v. */
LJ_TEST(fwd_packed_qkvo_accepted_overlap_refused)
{
    require_nvrtc();
    open_fake();
    const int W = 2 * D + 2 * E, widths[3] = {D, E, E};
    packed pk;
    packed_init(&pk, W, widths);
    CUdeviceptr buf = alloc((size_t)B * N * H * W * 4);
    DLTensor tq = view(buf, 0, 4, pk.shape[0], pk.strides);
    DLTensor tk = view(buf, (uint64_t)D * 4, 4, pk.shape[0], pk.strides);
    DLTensor tv = view(buf, (uint64_t)2 * D * 4, 4, pk.shape[1], pk.strides);
    DLTensor to = view(buf, (uint64_t)(2 * D + E) * 4, 4, pk.shape[2], pk.strides);
    lajit_attn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &tq, a.k = &tk, a.v = &tv, a.o = &to;
    a.scale = 1.0f;
    a.family = "la_recurrent";
    lajit_ctx *ctx = fake_ctx();
    ASSERT_OK(lajit_attn_fwd(ctx, &a));
    ASSERT_EQ(lj_fake_launch_count(), 1);
    ASSERT_EQ(lj_fake_launch_get(0)->params.o.ptr, buf + (CUdeviceptr)(2 * D + E) * 4);
    to.byte_offset = (uint64_t)2 * D * 4;
    ASSERT_STATUS(lajit_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "output o shares elements with input v");
    lajit_ctx_destroy(ctx);
}

/* Decode with q, k, v, o as slices of one [B, H, 2D+2E] buffer: accepted; o on k: refused. */
LJ_TEST(decode_packed_qkvo_accepted_overlap_refused)
{
    require_nvrtc();
    open_fake();
    const int W = 2 * D + 2 * E;
    CUdeviceptr buf = alloc((size_t)B * H * W * 4), state = alloc((size_t)B * H * D * E * 4);
    int64_t qs[3] = {B, H, D}, vs[3] = {B, H, E}, strides[3] = {(int64_t)H * W, W, 1};
    int64_t ss[4] = {B, H, D, E};
    DLTensor tq = view(buf, 0, 3, qs, strides), tk = view(buf, (uint64_t)D * 4, 3, qs, strides);
    DLTensor tv = view(buf, (uint64_t)2 * D * 4, 3, vs, strides);
    DLTensor to = view(buf, (uint64_t)(2 * D + E) * 4, 3, vs, strides);
    DLTensor ts = view(state, 0, 4, ss, NULL);
    lajit_attn_decode_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &tq, a.k = &tk, a.v = &tv, a.o = &to, a.state = &ts;
    a.scale = 1.0f;
    lajit_ctx *ctx = fake_ctx();
    ASSERT_OK(lajit_attn_decode(ctx, &a));
    ASSERT_EQ(lj_fake_launch_count(), 1);
    to.byte_offset = (uint64_t)D * 4;
    ASSERT_STATUS(lajit_attn_decode(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "output o shares elements with input k");
    lajit_ctx_destroy(ctx);
}

/* The element-level test on its own: exact where it must be, never missing a shared element. */
LJ_TEST(element_level_overlap)
{
    char *base = (char *)(uintptr_t)0x100000;
    int64_t rows[2] = {8, 16}, packed_strides[2] = {48, 1}, every_other[2] = {96, 1};
    DLTensor a = view((CUdeviceptr)(uintptr_t)base, 0, 2, rows, packed_strides);
    DLTensor b = a;
    /* Column slices [0,16) and [16,32) of 48-wide rows: disjoint; [8,24): shares. */
    b.byte_offset = 16 * 4;
    ASSERT_EQ(lj_tensors_may_share(&a, &b), 0);
    ASSERT_EQ(lj_tensors_may_share(&b, &a), 0);
    b.byte_offset = 8 * 4;
    ASSERT_EQ(lj_tensors_may_share(&a, &b), 1);
    ASSERT_EQ(lj_tensors_may_share(&b, &a), 1);
    /* The last 16 columns against the first 16 of the next row: disjoint; 17 wide: shares. */
    b.byte_offset = 32 * 4;
    ASSERT_EQ(lj_tensors_may_share(&a, &b), 0);
    int64_t wide[2] = {8, 17};
    DLTensor c = b;
    c.shape = wide;
    ASSERT_EQ(lj_tensors_may_share(&a, &c), 1);
    /* Even rows against odd rows of a 48-wide buffer: disjoint. */
    int64_t half[2] = {4, 48};
    DLTensor even = view((CUdeviceptr)(uintptr_t)base, 0, 2, half, every_other), odd = even;
    odd.byte_offset = 48 * 4;
    ASSERT_EQ(lj_tensors_may_share(&even, &odd), 0);
    /* Heads 0..1 and 2..3 of a [N, 4, 16] buffer: each run of two heads is contiguous. */
    int64_t hs[3] = {6, 2, 16}, hst[3] = {64, 16, 1};
    DLTensor h0 = view((CUdeviceptr)(uintptr_t)base, 0, 3, hs, hst), h1 = h0;
    h1.byte_offset = 32 * 4;
    ASSERT_EQ(lj_tensors_may_share(&h0, &h1), 0);
    h1.byte_offset = 16 * 4;
    ASSERT_EQ(lj_tensors_may_share(&h0, &h1), 1);
    /* Separate buffers, a view against itself, an int32 run inside a float buffer. */
    DLTensor far = a;
    far.data = base + (1 << 20);
    ASSERT_EQ(lj_tensors_may_share(&a, &far), 0);
    ASSERT_EQ(lj_tensors_may_share(&a, &a), 1);
    int64_t one[1] = {4};
    DLTensor i32 = view((CUdeviceptr)(uintptr_t)base, 12 * 4, 1, one, NULL);
    i32.dtype.code = kDLInt;
    ASSERT_EQ(lj_tensors_may_share(&a, &i32), 1);
    i32.byte_offset = 40 * 4;
    ASSERT_EQ(lj_tensors_may_share(&a, &i32), 0);
    ASSERT_EQ(lj_tensors_may_share(&a, NULL), 0);
}

/* lajit_attn_bwd_workspace_size never wraps: sizes past size_t give SIZE_MAX. */
LJ_TEST(bwd_workspace_size_overflow)
{
    ASSERT_EQ(lajit_attn_bwd_workspace_size(4, 32, 128), 16 + 4 * 32 * 8 * 4);
    ASSERT_EQ(lajit_attn_bwd_workspace_size(1, 1, 16), 32);
    ASSERT_EQ(lajit_attn_bwd_workspace_size(INT64_MAX, INT64_MAX, 256), SIZE_MAX);
    ASSERT_EQ(lajit_attn_bwd_workspace_size((int64_t)1 << 40, (int64_t)1 << 20, 256), SIZE_MAX);
    ASSERT_EQ(lajit_attn_bwd_workspace_size(INT64_MAX / 2, 1, 16), SIZE_MAX);
}

/* lj_check_io, the one pairwise check of every op: the in-place state (the pair the API lets
 * alias) passes only as the very same view; an output that shares elements with an input is
 * refused naming both; a tensor not given is not checked. */
LJ_TEST(check_io_same_view_and_overlap)
{
    lajit_ctx *ctx = fake_ctx();
    CUdeviceptr p = 0x7f0000000000ull; /* only addresses are compared: nothing is allocated */
    int64_t shape[4] = {2, 4, 64, 64};
    int64_t compact[4] = {4 * 64 * 64, 64 * 64, 64, 1};
    int64_t swapped[4] = {4 * 64 * 64, 64 * 64, 1, 64}; /* same memory, rows and columns swapped */
    DLTensor s0 = view(p, 0, 4, shape, NULL), sn = view(p, 0, 4, shape, compact);
    DLTensor other = view(p, 0, 4, shape, swapped);

    lj_io_tensor same[2] = {{"initial_state", &s0, 0}, {"final_state", &sn, 1}};
    ASSERT_OK(lj_check_io(ctx, same, 2, "final_state", "initial_state"));
    lj_io_tensor crossed[2] = {{"initial_state", &s0, 0}, {"final_state", &other, 1}};
    ASSERT_STATUS(lj_check_io(ctx, crossed, 2, "final_state", "initial_state"),
                  LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx),
                    "final_state and initial_state share elements without being the same view");
    lj_io_tensor out_in[2] = {{"q", &s0, 0}, {"o", &sn, 1}};
    ASSERT_STATUS(lj_check_io(ctx, out_in, 2, NULL, NULL), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "output o shares elements with input q");
    lj_io_tensor absent[2] = {{"q", &s0, 0}, {"o", NULL, 1}};
    ASSERT_OK(lj_check_io(ctx, absent, 2, NULL, NULL));
    lajit_ctx_destroy(ctx);
}
