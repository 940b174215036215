/* tensor.c — DLTensor validation: every rejection with its status and message, the accepted
 * layouts (compact, permuted, packed qkv slices, byte offsets, size-1 dimensions), aliasing and
 * overlap checks; and the test helpers' fp16/bf16 conversions. No device is touched: tensors
 * point at made-up, suitably aligned addresses. */
#include "gpu.h"
#include "overlap.h"
#include "tensor.h"
#include "test.h"

#define BASE 0x7f0000000000ull /* a made-up device address, 256-byte aligned */

static lj_env env;

static void setup(void)
{
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
}

static DLTensor *make(lj_test_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                      lj_dtype dt)
{
    return lj_gpu_tensor(t, BASE, 0, ndim, shape, strides, lj_test_dl_dtype(dt));
}

/* Runs lj_tensor_view and expects INVALID_ARGUMENT with `needle` in the message, and the
 * outputs untouched. */
static void expect_reject(const char *name, const DLTensor *t, int ndim, const int64_t *want,
                          unsigned mask, const char *needle, int line)
{
    int64_t shape[4] = {-1, -1, -1, -1};
    if (want)
        memcpy(shape, want, sizeof(int64_t) * (size_t)ndim);
    int64_t before[4];
    memcpy(before, shape, sizeof before);
    la_tensor4 out;
    memset(&out, 0x5a, sizeof out);
    lj_dtype dt = (lj_dtype)77;
    lajit_status st = lj_tensor_view(&env, name, t, ndim, shape, mask, &out, &dt);
    if (st != LAJIT_ERR_INVALID_ARGUMENT)
        lj_test_fail(__FILE__, line, "status %d (%s), want invalid argument; message \"%s\"", st,
                     lajit_status_string(st), env.errmsg);
    if (!strstr(env.errmsg, needle))
        lj_test_fail(__FILE__, line, "message \"%s\" lacks \"%s\"", env.errmsg, needle);
    if (memcmp(before, shape, sizeof before) != 0 || dt != (lj_dtype)77 ||
        out.s0 != 0x5a5a5a5a5a5a5a5aLL)
        lj_test_fail(__FILE__, line, "outputs written on failure");
}
#define REJECT(name, t, ndim, want, mask, needle) \
    expect_reject(name, t, ndim, want, mask, needle, __LINE__)

/* ---- Accepted layouts -------------------------------------------------------------------- */

LJ_TEST(accepts_compact_bhnd)
{
    setup();
    lj_test_tensor q;
    int64_t shape[4] = {2, 3, 5, 64};
    make(&q, 4, shape, NULL, LJ_F16);
    int64_t want[4] = {-1, 3, -1, 64};
    la_tensor4 v;
    lj_dtype dt;
    ASSERT_OK(lj_tensor_view(&env, "q", &q.t, 4, want, LJ_TENSOR_FLOATS, &v, &dt));
    ASSERT_EQ(dt, LJ_F16);
    ASSERT_EQ(want[0], 2);
    ASSERT_EQ(want[2], 5);
    ASSERT_EQ(v.ptr, BASE);
    ASSERT_EQ(v.s0, 3 * 5 * 64);
    ASSERT_EQ(v.s1, 5 * 64);
    ASSERT_EQ(v.s2, 64);
    ASSERT_EQ(v.s3, 1);
    /* Explicit compact strides give the same view; NULL shape and dtype_out are allowed. */
    lj_test_tensor q2;
    int64_t strides[4] = {960, 320, 64, 1};
    make(&q2, 4, shape, strides, LJ_F16);
    la_tensor4 v2;
    ASSERT_OK(lj_tensor_view(&env, "q", &q2.t, 4, NULL, LJ_TENSOR_F16, &v2, NULL));
    ASSERT_TRUE(memcmp(&v, &v2, sizeof v) == 0);
    ASSERT_TRUE(lj_tensor_same_memory(&q.t, &q2.t));
}

LJ_TEST(accepts_permuted_bnhd)
{
    setup();
    /* Memory [B, N, H, D] viewed as [B, H, N, D]. */
    const int64_t B = 2, N = 7, H = 4, D = 32;
    int64_t shape[4] = {B, H, N, D};
    int64_t strides[4] = {N * H * D, D, H * D, 1};
    lj_test_tensor k;
    make(&k, 4, shape, strides, LJ_BF16);
    int64_t want[4] = {B, H, N, D};
    la_tensor4 v;
    lj_dtype dt;
    ASSERT_OK(lj_tensor_view(&env, "k", &k.t, 4, want, LJ_TENSOR_FLOATS, &v, &dt));
    ASSERT_EQ(dt, LJ_BF16);
    ASSERT_EQ(v.s0, N * H * D);
    ASSERT_EQ(v.s1, D);
    ASSERT_EQ(v.s2, H * D);
    ASSERT_EQ(v.s3, 1);
    ASSERT_OK(lj_tensor_check_writable(&env, "k", &k.t));
}

LJ_TEST(accepts_packed_qkv_slices)
{
    setup();
    /* One buffer [B, N, 3, H, D] (fp16); q, k, v are [B, H, N, D] views at offsets 0, H*D,
     * 2*H*D elements. */
    const int64_t B = 2, N = 9, H = 3, D = 64;
    int64_t shape[4] = {B, H, N, D};
    int64_t strides[4] = {N * 3 * H * D, D, 3 * H * D, 1};
    lj_test_tensor t[3];
    la_tensor4 v[3];
    for (int i = 0; i < 3; i++) {
        lj_gpu_tensor(&t[i], BASE, (uint64_t)(i * H * D * 2), 4, shape, strides,
                      lj_test_dl_dtype(LJ_F16));
        int64_t want[4] = {B, H, N, D};
        ASSERT_OK(lj_tensor_view(&env, "qkv", &t[i].t, 4, want, LJ_TENSOR_F16, &v[i], NULL));
        ASSERT_EQ(v[i].ptr, BASE + (uint64_t)(i * H * D * 2));
        ASSERT_EQ(v[i].s2, 3 * H * D);
    }
    /* Interleaved slices share no element but their byte ranges intersect (coarse check). */
    ASSERT_TRUE(!lj_tensor_same_memory(&t[0].t, &t[1].t));
    ASSERT_TRUE(lj_tensors_may_share(&t[0].t, &t[1].t));
}

LJ_TEST(accepts_byte_offset_and_right_aligns)
{
    setup();
    /* Packed varlen [T, H, D] float32 at byte_offset 48 of an allocation. */
    int64_t shape[3] = {10, 2, 16};
    lj_test_tensor t;
    lj_gpu_tensor(&t, BASE, 48, 3, shape, NULL, lj_test_dl_dtype(LJ_F32));
    int64_t want[3] = {-1, 2, 16};
    la_tensor4 v;
    ASSERT_OK(lj_tensor_view(&env, "q", &t.t, 3, want, LJ_TENSOR_F32, &v, NULL));
    ASSERT_EQ(v.ptr, BASE + 48);
    ASSERT_EQ(want[0], 10);
    ASSERT_EQ(v.s0, 0);
    ASSERT_EQ(v.s1, 32); /* T */
    ASSERT_EQ(v.s2, 16); /* H */
    ASSERT_EQ(v.s3, 1);  /* D */
    /* A 1-D int32 tensor (cu_seqlens) lands in s3; dtype_out is left alone for int32. */
    int64_t cs[1] = {5};
    lj_test_tensor c;
    lj_gpu_tensor(&c, BASE + 4096, 0, 1, cs, NULL, lj_test_dl_int32());
    int64_t n[1] = {-1};
    lj_dtype dt = LJ_BF16;
    ASSERT_OK(lj_tensor_view(&env, "cu_seqlens", &c.t, 1, n, LJ_TENSOR_INT32, &v, &dt));
    ASSERT_EQ(n[0], 5);
    ASSERT_EQ(dt, LJ_BF16);
    ASSERT_EQ(v.s0, 0);
    ASSERT_EQ(v.s2, 0);
    ASSERT_EQ(v.s3, 1);
}

LJ_TEST(size_one_dimensions_ignore_their_strides)
{
    setup();
    /* PyTorch gives size-1 dimensions arbitrary strides, negative or unaligned included. */
    int64_t shape[4] = {1, 4, 1, 64};
    int64_t strides[4] = {-7, 64, 3, 1};
    lj_test_tensor t;
    make(&t, 4, shape, strides, LJ_F32);
    la_tensor4 v;
    ASSERT_OK(lj_tensor_view(&env, "o", &t.t, 4, NULL, LJ_TENSOR_F32, &v, NULL));
    ASSERT_EQ(v.s0, 0);
    ASSERT_EQ(v.s1, 64);
    ASSERT_EQ(v.s2, 0);
    ASSERT_EQ(v.s3, 1);
    lj_test_tensor u;
    make(&u, 4, shape, NULL, LJ_F32);
    ASSERT_TRUE(lj_tensor_same_memory(&t.t, &u.t));
    /* The last dimension of size 1: any stride (H = 1 decay vector). */
    int64_t h1[1] = {1}, s1[1] = {5};
    make(&t, 1, h1, s1, LJ_F32);
    ASSERT_OK(lj_tensor_view(&env, "s", &t.t, 1, h1, LJ_TENSOR_F32, &v, NULL));
    ASSERT_EQ(v.s3, 1);
}

/* ---- Rejections ------------------------------------------------------------------------------ */

LJ_TEST(rejects_missing_and_non_device)
{
    setup();
    int64_t shape[4] = {2, 3, 5, 64};
    lj_test_tensor t;
    REJECT("q", NULL, 4, NULL, LJ_TENSOR_FLOATS, "q is required");
    make(&t, 4, shape, NULL, LJ_F32);
    t.t.data = NULL;
    REJECT("q", &t.t, 4, NULL, LJ_TENSOR_FLOATS, "q has a NULL data pointer");
    make(&t, 4, shape, NULL, LJ_F32);
    t.t.shape = NULL;
    REJECT("q", &t.t, 4, NULL, LJ_TENSOR_FLOATS, "q has no shape");
    make(&t, 4, shape, NULL, LJ_F32);
    t.t.device.device_type = kDLCPU;
    REJECT("v", &t.t, 4, NULL, LJ_TENSOR_FLOATS, "v is in host memory");
    t.t.device.device_type = kDLCUDAHost;
    REJECT("v", &t.t, 4, NULL, LJ_TENSOR_FLOATS, "pinned host memory");
    /* Managed memory is accepted. */
    t.t.device.device_type = kDLCUDAManaged;
    la_tensor4 v;
    ASSERT_OK(lj_tensor_view(&env, "v", &t.t, 4, NULL, LJ_TENSOR_FLOATS, &v, NULL));
    /* A caller asking for an impossible rank is a bug in lajit. */
    ASSERT_STATUS(lj_tensor_view(&env, "v", &t.t, 5, NULL, LJ_TENSOR_FLOATS, &v, NULL),
                  LAJIT_ERR_INTERNAL);
}

LJ_TEST(rejects_rank_and_sizes)
{
    setup();
    lj_test_tensor t;
    int64_t s3[3] = {2, 3, 64};
    make(&t, 3, s3, NULL, LJ_F32);
    REJECT("q", &t.t, 4, NULL, LJ_TENSOR_FLOATS, "q has 3 dimensions, expected 4");
    int64_t zero[4] = {2, 3, 0, 64};
    make(&t, 4, zero, NULL, LJ_F32);
    REJECT("q", &t.t, 4, NULL, LJ_TENSOR_FLOATS, "q has a zero dimension");
    int64_t neg[4] = {2, -3, 5, 64};
    make(&t, 4, neg, NULL, LJ_F32);
    REJECT("q", &t.t, 4, NULL, LJ_TENSOR_FLOATS, "q has a negative dimension");
    int64_t shape[4] = {2, 3, 5, 64};
    make(&t, 4, shape, NULL, LJ_F32);
    int64_t want[4] = {2, -1, 5, 128};
    REJECT("k", &t.t, 4, want, LJ_TENSOR_FLOATS, "k is [2,3,5,64], expected [2,*,5,128]");
}

LJ_TEST(rejects_dtypes)
{
    setup();
    int64_t shape[2] = {4, 64};
    lj_test_tensor t;
    make(&t, 2, shape, NULL, LJ_F16);
    REJECT("k", &t.t, 2, NULL, LJ_TENSOR_F32, "k is float16; expected float32");
    REJECT("k", &t.t, 2, NULL, LJ_TENSOR_F32 | LJ_TENSOR_BF16, "expected float32 or bfloat16");
    REJECT("s", &t.t, 2, NULL, LJ_TENSOR_INT32, "expected int32");
    make(&t, 2, shape, NULL, LJ_F32);
    t.t.dtype.bits = 64; /* float64 */
    REJECT("q", &t.t, 2, NULL, LJ_TENSOR_FLOATS,
           "q has an unsupported dtype (code 2, bits 64, lanes 1); expected float32, float16 or "
           "bfloat16");
    t.t.dtype.bits = 32;
    t.t.dtype.lanes = 4;
    REJECT("q", &t.t, 2, NULL, LJ_TENSOR_FLOATS, "lanes 4");
    t.t.dtype = lj_test_dl_int32();
    t.t.dtype.bits = 64; /* int64 indices */
    REJECT("cu_seqlens", &t.t, 2, NULL, LJ_TENSOR_INT32, "cu_seqlens has an unsupported dtype");
    t.t.dtype = lj_test_dl_int32();
    REJECT("q", &t.t, 2, NULL, LJ_TENSOR_FLOATS, "q is int32");
}

LJ_TEST(rejects_strides)
{
    setup();
    int64_t shape[4] = {2, 3, 5, 64};
    lj_test_tensor t;
    int64_t last[4] = {1920, 640, 128, 2};
    make(&t, 4, shape, last, LJ_F16);
    REJECT("q", &t.t, 4, NULL, LJ_TENSOR_FLOATS, "q has stride 2 in its last dimension");
    int64_t neg[4] = {960, -320, 64, 1};
    make(&t, 4, shape, neg, LJ_F16);
    REJECT("q", &t.t, 4, NULL, LJ_TENSOR_FLOATS, "q has a negative stride (-320) in dimension 1");
    int64_t bcast[4] = {0, 320, 64, 1};
    make(&t, 4, shape, bcast, LJ_F16);
    REJECT("q", &t.t, 4, NULL, LJ_TENSOR_FLOATS, "q has stride 0 in dimension 0");
}

LJ_TEST(rejects_misalignment)
{
    setup();
    int64_t shape[4] = {2, 3, 5, 64};
    lj_test_tensor t;
    /* data + byte_offset not a multiple of 16, whether from the pointer or the offset. */
    lj_gpu_tensor(&t, BASE + 8, 0, 4, shape, NULL, lj_test_dl_dtype(LJ_F16));
    REJECT("q", &t.t, 4, NULL, LJ_TENSOR_FLOATS, "q is misaligned: its address");
    lj_gpu_tensor(&t, BASE, 2, 4, shape, NULL, lj_test_dl_dtype(LJ_F16));
    REJECT("q", &t.t, 4, NULL, LJ_TENSOR_FLOATS, "byte_offset 2");
    lj_gpu_tensor(&t, BASE + 8, 8, 4, shape, NULL, lj_test_dl_dtype(LJ_F16));
    la_tensor4 v;
    ASSERT_OK(lj_tensor_view(&env, "q", &t.t, 4, NULL, LJ_TENSOR_FLOATS, &v, NULL));
    ASSERT_EQ(v.ptr, BASE + 16);
    /* A row stride of 72 fp16 elements = 144 bytes is fine; 68 = 136 bytes is not. */
    int64_t ok[4] = {3 * 5 * 72, 5 * 72, 72, 1};
    make(&t, 4, shape, ok, LJ_F16);
    ASSERT_OK(lj_tensor_view(&env, "q", &t.t, 4, NULL, LJ_TENSOR_FLOATS, &v, NULL));
    int64_t bad[4] = {3 * 5 * 72, 5 * 72, 68, 1};
    make(&t, 4, shape, bad, LJ_F16);
    REJECT("q", &t.t, 4, NULL, LJ_TENSOR_FLOATS,
           "q is misaligned: dimension 2 has a stride of 68 elements of 2 bytes");
    /* Compact shapes can be misaligned too: D = 6 float32 rows are 24 bytes. */
    int64_t odd[2] = {4, 6};
    make(&t, 2, odd, NULL, LJ_F32);
    REJECT("v", &t.t, 2, NULL, LJ_TENSOR_FLOATS, "v is misaligned: dimension 0");
}

/* Kernels index with 64-bit bases: a view whose element offsets pass 2^31 is accepted, with its
 * strides unchanged. What stays refused is what 64 bits cannot serve: an offset of 2^63 or more,
 * a byte extent past the end of the address space, and sizes that do not fit an int. */
LJ_TEST(accepts_offsets_past_2_31)
{
    setup();
    lj_test_tensor t;
    la_tensor4 v;
    /* 2^31 elements exactly, and one batch more: both accepted now. */
    int64_t fits[4] = {64, 32, 8192, 128};
    make(&t, 4, fits, NULL, LJ_BF16);
    ASSERT_OK(lj_tensor_view(&env, "q", &t.t, 4, NULL, LJ_TENSOR_FLOATS, &v, NULL));
    int64_t over[4] = {65, 32, 8192, 128};
    make(&t, 4, over, NULL, LJ_BF16);
    ASSERT_OK(lj_tensor_view(&env, "q", &t.t, 4, NULL, LJ_TENSOR_FLOATS, &v, NULL));
    ASSERT_EQ(v.s0, 32LL * 8192 * 128);
    /* The long-context shapes of issue 16: B=1 H=16 N=1M D=128 (2^31 elements) and H=64 at
     * N=256K, compact and as a [B,N,H,D] view. */
    int64_t long1[4] = {1, 16, 1 << 20, 128}, long2[4] = {2, 64, 1 << 18, 128};
    make(&t, 4, long1, NULL, LJ_BF16);
    ASSERT_OK(lj_tensor_view(&env, "q", &t.t, 4, NULL, LJ_TENSOR_FLOATS, &v, NULL));
    int64_t bnhd[4] = {64LL * (1 << 18) * 128, 128, 64 * 128, 1};
    make(&t, 4, long2, bnhd, LJ_BF16);
    ASSERT_OK(lj_tensor_view(&env, "q", &t.t, 4, NULL, LJ_TENSOR_FLOATS, &v, NULL));
    ASSERT_EQ(v.s0, 64LL * (1 << 18) * 128);
    ASSERT_EQ(v.s2, 64 * 128);
    /* Small shape, huge strides: a batch stride of 2^31 and of 2^40 elements. */
    int64_t shape[2] = {2, 64};
    int64_t s31[2] = {1ll << 31, 1}, s40[2] = {1ll << 40, 1};
    make(&t, 2, shape, s31, LJ_F32);
    ASSERT_OK(lj_tensor_view(&env, "k", &t.t, 2, NULL, LJ_TENSOR_FLOATS, &v, NULL));
    ASSERT_EQ(v.s2, 1ll << 31);
    make(&t, 2, shape, s40, LJ_F32);
    ASSERT_OK(lj_tensor_view(&env, "k", &t.t, 2, NULL, LJ_TENSOR_FLOATS, &v, NULL));
    ASSERT_EQ(v.s2, 1ll << 40);
    /* A state pool whose last slot starts past element 2^31 (decode's wide case). */
    int64_t pool[4] = {2049, 8, 128, 128};
    make(&t, 4, pool, NULL, LJ_F32);
    ASSERT_OK(lj_tensor_view(&env, "state", &t.t, 4, NULL, LJ_TENSOR_FLOATS, &v, NULL));
    ASSERT_OK(lj_tensor_check_writable(&env, "state", &t.t));
    /* An output whose outer stride times its size passes 2^63 (3 * 2^61 * 2): accepted and
     * writable, the product never formed in a way that overflows. */
    int64_t two[2] = {2, 16}, s61[2] = {3ll << 61, 1};
    make(&t, 2, two, s61, LJ_BF16);
    ASSERT_OK(lj_tensor_view(&env, "o", &t.t, 2, NULL, LJ_TENSOR_FLOATS, &v, NULL));
    ASSERT_OK(lj_tensor_check_writable(&env, "o", &t.t));
}

LJ_TEST(rejects_offsets_beyond_64_bits)
{
    setup();
    lj_test_tensor t;
    int64_t shape[2] = {2, 64};
    /* Products that overflow 64 bits are caught, not wrapped (sizes below 2^31 each). */
    int64_t huge[4] = {1ll << 30, 1ll << 30, 1ll << 30, 16};
    make(&t, 4, huge, NULL, LJ_F32);
    REJECT("k", &t.t, 4, NULL, LJ_TENSOR_FLOATS, "k's offsets overflow 64 bits");
    /* The largest offset is exactly INT64_MAX (16 float32 from a stride of 2^63 - 16): refused,
     * one less would leave no room for the element count. */
    int64_t top[2] = {2, 16}, s_top[2] = {INT64_MAX - 15, 1};
    make(&t, 2, top, s_top, LJ_F32);
    REJECT("k", &t.t, 2, NULL, LJ_TENSOR_FLOATS, "k's offsets overflow 64 bits");
    /* Offsets that fit in 63 bits but whose bytes do not: 2^62 float32 elements are 2^64
     * bytes. */
    int64_t hs[2] = {1ll << 62, 1};
    make(&t, 2, shape, hs, LJ_F32);
    REJECT("k", &t.t, 2, NULL, LJ_TENSOR_FLOATS, "k's extent wraps");
    /* 3 * 2^60 float32 elements (3 * 2^62 bytes) from BASE fit below 2^64: accepted. */
    la_tensor4 v;
    int64_t s3[2] = {3ll << 60, 1};
    make(&t, 2, shape, s3, LJ_F32);
    ASSERT_OK(lj_tensor_view(&env, "k", &t.t, 2, NULL, LJ_TENSOR_FLOATS, &v, NULL));
    /* ... but not from an address in the top 2^62 bytes: the sum wraps. */
    lj_gpu_tensor(&t, 0xc000000000000000ull, 0, 2, shape, s3, lj_test_dl_dtype(LJ_F32));
    REJECT("k", &t.t, 2, NULL, LJ_TENSOR_FLOATS, "k's extent wraps");
    /* A size past the kernels' int range (with room for a chunk's rounding), though its
     * offsets would fit in 64 bits; the largest size allowed passes. */
    int64_t wide[3] = {1, (1ll << 31) - (1ll << 16) + 1, 64};
    make(&t, 3, wide, NULL, LJ_BF16);
    REJECT("q", &t.t, 3, NULL, LJ_TENSOR_FLOATS,
           "q's dimension 1 has 2147418113 elements: each size must be at most 2^31 - 2^16");
    int64_t widest[3] = {1, (1ll << 31) - (1ll << 16), 64};
    make(&t, 3, widest, NULL, LJ_BF16);
    ASSERT_OK(lj_tensor_view(&env, "q", &t.t, 3, NULL, LJ_TENSOR_FLOATS, &v, NULL));
}

/* ---- Aliasing, overlap, devices ---------------------------------------------------------------- */

LJ_TEST(aliasing_and_overlap)
{
    setup();
    int64_t shape[4] = {2, 4, 64, 64};
    lj_test_tensor s0, sn, other, far;
    lj_gpu_tensor(&s0, BASE, 0, 4, shape, NULL, lj_test_dl_dtype(LJ_F32));
    int64_t strides[4] = {4 * 64 * 64, 64 * 64, 64, 1};
    lj_gpu_tensor(&sn, BASE, 0, 4, shape, strides, lj_test_dl_dtype(LJ_F32));
    /* The same memory with rows and columns swapped: overlaps, not the same view. */
    int64_t swapped[4] = {4 * 64 * 64, 64 * 64, 1, 64};
    lj_gpu_tensor(&other, BASE, 0, 4, shape, swapped, lj_test_dl_dtype(LJ_F32));
    size_t bytes = 2 * 4 * 64 * 64 * 4;
    lj_gpu_tensor(&far, BASE + bytes, 0, 4, shape, NULL, lj_test_dl_dtype(LJ_F32));

    ASSERT_TRUE(lj_tensor_same_memory(&s0.t, &sn.t));
    ASSERT_TRUE(!lj_tensor_same_memory(&s0.t, &other.t));
    ASSERT_TRUE(lj_tensors_may_share(&s0.t, &other.t));
    ASSERT_TRUE(!lj_tensors_may_share(&s0.t, &far.t)); /* adjacent, not overlapping */
    lj_gpu_tensor(&far, BASE + bytes - 16, 0, 4, shape, NULL, lj_test_dl_dtype(LJ_F32));
    ASSERT_TRUE(lj_tensors_may_share(&s0.t, &far.t));

    /* The ops' pairwise check over these views (lj_check_io) is in ops_args.c:
     * check_io_same_view_and_overlap. */
    /* On another device the same address is other memory. */
    sn.t.device.device_id = 1;
    ASSERT_TRUE(!lj_tensors_may_share(&s0.t, &sn.t));
    ASSERT_TRUE(!lj_tensor_same_memory(&s0.t, &sn.t));
}

LJ_TEST(writable_rejects_self_overlap)
{
    setup();
    int64_t shape[2] = {4, 64};
    int64_t strides[2] = {16, 1}; /* rows overlap */
    lj_test_tensor t;
    make(&t, 2, shape, strides, LJ_F32);
    la_tensor4 v;
    ASSERT_OK(lj_tensor_view(&env, "o", &t.t, 2, NULL, LJ_TENSOR_F32, &v, NULL));
    ASSERT_STATUS(lj_tensor_check_writable(&env, "o", &t.t), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(env.errmsg, "o has overlapping elements");
    int64_t padded[2] = {80, 1}; /* rows with padding: fine */
    make(&t, 2, shape, padded, LJ_F32);
    ASSERT_OK(lj_tensor_check_writable(&env, "o", &t.t));
}

LJ_TEST(device_checks)
{
    setup();
    int64_t shape[1] = {4};
    lj_test_tensor a, b;
    make(&a, 1, shape, NULL, LJ_F32);
    make(&b, 1, shape, NULL, LJ_F32);
    ASSERT_OK(lj_tensor_same_device(&env, "q", &a.t, "k", &b.t));
    ASSERT_OK(lj_tensor_check_device(&env, "q", &a.t, 0));
    b.t.device.device_id = 1;
    ASSERT_STATUS(lj_tensor_same_device(&env, "q", &a.t, "k", &b.t), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(env.errmsg, "k is on CUDA device 1, but q is on device 0");
    ASSERT_STATUS(lj_tensor_check_device(&env, "k", &b.t, 0), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(env.errmsg, "k is on CUDA device 1, but the context uses device 0");
    ASSERT_STREQ(lj_tensor_dtype_name(lj_test_dl_dtype(LJ_BF16)), "bfloat16");
}

/* ---- The test helpers' conversions -------------------------------------------------------------- */

LJ_TEST(half_conversions_round_to_nearest_even)
{
    ASSERT_EQ(lj_f32_to_f16(1.0f), 0x3c00);
    ASSERT_EQ(lj_f32_to_f16(-2.0f), 0xc000);
    ASSERT_EQ(lj_f32_to_f16(-0.0f), 0x8000);
    ASSERT_EQ(lj_f32_to_f16(65504.0f), 0x7bff);
    ASSERT_EQ(lj_f32_to_f16(65519.0f), 0x7bff);
    ASSERT_EQ(lj_f32_to_f16(65520.0f), 0x7c00); /* the tie rounds to even: Inf */
    ASSERT_EQ(lj_f32_to_f16(1e9f), 0x7c00);
    ASSERT_EQ(lj_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);     /* tie, to even */
    ASSERT_EQ(lj_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie, to even */
    ASSERT_EQ(lj_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    ASSERT_EQ(lj_f32_to_f16(0x1p-24f), 0x0001);
    ASSERT_EQ(lj_f32_to_f16(0x1p-25f), 0x0000);            /* tie, to even */
    ASSERT_EQ(lj_f32_to_f16(3 * 0x1p-25f), 0x0002);        /* tie, to even */
    ASSERT_EQ(lj_f32_to_f16(0x1p-14f - 0x1p-26f), 0x0400); /* rounds up to the normal */
    ASSERT_TRUE(isnan(lj_f16_to_f32(lj_f32_to_f16(NAN))));
    ASSERT_TRUE(isinf(lj_f16_to_f32(lj_f32_to_f16(-INFINITY))));
    ASSERT_EQ(lj_f32_to_bf16(1.0f), 0x3f80);
    ASSERT_EQ(lj_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);     /* tie, to even */
    ASSERT_EQ(lj_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82); /* tie, to even */
    ASSERT_EQ(lj_f32_to_bf16(3.4e38f), 0x7f80);            /* overflows to Inf */
    ASSERT_TRUE(isnan(lj_bf16_to_f32(lj_f32_to_bf16(NAN))));
    /* Every non-NaN 16-bit value survives a round trip exactly. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = lj_f16_to_f32((uint16_t)h);
        if (!isnan(f))
            ASSERT_EQ(lj_f32_to_f16(f), h);
        float b = lj_bf16_to_f32((uint16_t)h);
        if (!isnan(b))
            ASSERT_EQ(lj_f32_to_bf16(b), h);
    }
    /* Arrays, and the poison pattern reads as NaN in every float type. */
    float src[3] = {0.5f, -3.0f, 1e-3f}, back[3];
    uint16_t buf[3];
    lj_host_from_f32(buf, src, 3, LJ_BF16);
    lj_host_to_f32(back, buf, 3, LJ_BF16);
    for (int i = 0; i < 3; i++)
        ASSERT_TRUE(back[i] == lj_round_to(src[i], LJ_BF16));
    ASSERT_TRUE(isnan(lj_f16_to_f32(0xffff)) && isnan(lj_bf16_to_f32(0xffff)));
    uint32_t p32 = 0xffffffffu;
    float f32;
    memcpy(&f32, &p32, 4);
    ASSERT_TRUE(isnan(f32));
}

/* An address that wraps through byte_offset, or a view whose end runs past 2^64, is refused:
 * the wrapped address is aligned and small, so no other check would catch it. */
LJ_TEST(rejects_address_wrap)
{
    setup();
    lj_test_tensor t;
    int64_t shape[2] = {2, 64};
    la_tensor4 v;
    /* data + byte_offset = 2^64 + 0x100: wraps to 0x100. */
    lj_gpu_tensor(&t, 0xffffffffffffff00ull, 0x200, 2, shape, NULL, lj_test_dl_dtype(LJ_F32));
    REJECT("q", &t.t, 2, NULL, LJ_TENSOR_FLOATS, "q's address wraps");
    lj_gpu_tensor(&t, BASE, 0xfffffffffffffff0ull, 2, shape, NULL, lj_test_dl_dtype(LJ_F32));
    REJECT("q", &t.t, 2, NULL, LJ_TENSOR_FLOATS, "overflows 64 bits");
    /* Near the top of the address space: 512 bytes fit below 2^64, 16 KiB do not. */
    lj_gpu_tensor(&t, 0xfffffffffffff000ull, 0, 2, shape, NULL, lj_test_dl_dtype(LJ_F32));
    ASSERT_OK(lj_tensor_view(&env, "q", &t.t, 2, NULL, LJ_TENSOR_FLOATS, &v, NULL));
    int64_t big[2] = {64, 64};
    lj_gpu_tensor(&t, 0xfffffffffffff000ull, 0, 2, big, NULL, lj_test_dl_dtype(LJ_F32));
    REJECT("q", &t.t, 2, NULL, LJ_TENSOR_FLOATS, "q's extent wraps");
    /* The end (one past the last byte) must be representable, since overlap checks form it:
     * 0xf00 bytes from 2^64 - 0x1000 pass, 0x1000 bytes (end = 2^64) do not. */
    int64_t below[2] = {15, 64}, exact[2] = {16, 64};
    lj_gpu_tensor(&t, 0xfffffffffffff000ull, 0, 2, below, NULL, lj_test_dl_dtype(LJ_F32));
    ASSERT_OK(lj_tensor_view(&env, "q", &t.t, 2, NULL, LJ_TENSOR_FLOATS, &v, NULL));
    lj_gpu_tensor(&t, 0xfffffffffffff000ull, 0, 2, exact, NULL, lj_test_dl_dtype(LJ_F32));
    REJECT("q", &t.t, 2, NULL, LJ_TENSOR_FLOATS, "q's extent wraps");
    /* A strided view: the extent counts the strides, not the element count (9 rows of 64
     * float32 are 2.25 KiB of elements; with a row stride of 128 they span 4.25 KiB: wraps). */
    int64_t nine[2] = {9, 64}, st[2] = {2 * 64, 1};
    lj_gpu_tensor(&t, 0xfffffffffffff000ull, 0, 2, nine, st, lj_test_dl_dtype(LJ_F32));
    REJECT("q", &t.t, 2, NULL, LJ_TENSOR_FLOATS, "q's extent wraps");
}

/* The stride audit: negative strides in any dimension (the last, a size-1 one whose stride is
 * never used, the most negative value), and products of shape and stride that overflow 64 bits
 * in any dimension, each rejected with a message and no wrap. */
LJ_TEST(rejects_negative_and_overflowing_strides)
{
    setup();
    lj_test_tensor t;
    la_tensor4 v;
    int64_t shape[3] = {4, 2, 64};
    int64_t neg_last[3] = {128, 64, -1};
    make(&t, 3, shape, neg_last, LJ_F32);
    REJECT("k", &t.t, 3, NULL, LJ_TENSOR_FLOATS, "k has a negative stride (-1) in dimension 2");
    int64_t most_neg[3] = {INT64_MIN, 64, 1};
    make(&t, 3, shape, most_neg, LJ_F32);
    REJECT("k", &t.t, 3, NULL, LJ_TENSOR_FLOATS, "negative stride");
    /* A size-1 dimension's stride addresses nothing: even a negative one is accepted. */
    int64_t one[3] = {1, 2, 64};
    int64_t neg_unused[3] = {-5, 64, 1};
    make(&t, 3, one, neg_unused, LJ_F32);
    ASSERT_OK(lj_tensor_view(&env, "k", &t.t, 3, NULL, LJ_TENSOR_FLOATS, &v, NULL));
    ASSERT_EQ(v.s1, 0);
    /* (size - 1) * stride overflowing 64 bits in the outer, middle and last-but-one dims. */
    int64_t wide[3] = {1ll << 30, 1ll << 30, 64};
    int64_t s_outer[3] = {1ll << 40, 64, 1};
    make(&t, 3, wide, s_outer, LJ_F32);
    REJECT("k", &t.t, 3, NULL, LJ_TENSOR_FLOATS, "k's offsets overflow 64 bits");
    int64_t s_huge[3] = {INT64_MAX - 15, 64, 1};
    make(&t, 3, shape, s_huge, LJ_F32);
    REJECT("k", &t.t, 3, NULL, LJ_TENSOR_FLOATS, "overflow 64 bits");
    /* Terms that fit alone but whose sum overflows. */
    int64_t two[3] = {2, 2, 64};
    int64_t s_sum[3] = {INT64_MAX / 2 + 16 - (INT64_MAX / 2) % 16,
                        INT64_MAX / 2 + 16 - (INT64_MAX / 2) % 16, 1};
    make(&t, 3, two, s_sum, LJ_F32);
    REJECT("k", &t.t, 3, NULL, LJ_TENSOR_FLOATS, "overflow 64 bits");
}
