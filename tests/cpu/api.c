/* api.c — misuse of the public API: each gets a clear status (and a message on the context),
 * never a crash. Also the decay-convention helpers. No GPU needed: argument checks come before
 * any driver call. */
#include "test.h"

#include <stddef.h>
#include <stdint.h>

static lajit_ctx *make_ctx(void)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    lajit_ctx *ctx = NULL;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    ASSERT_TRUE(ctx != NULL);
    return ctx;
}

/* A plausible device tensor: compact [B,H,N,D] bf16 at a 256-byte aligned fake address. The
 * driver is never reached in these tests, so the address is never dereferenced. */
typedef struct fake_tensor {
    DLTensor t;
    int64_t shape[5];
    int64_t strides[5];
} fake_tensor;

static void fake(fake_tensor *f, uintptr_t addr, int ndim, const int64_t *shape, uint8_t code,
                 uint8_t bits)
{
    memset(f, 0, sizeof *f);
    f->t.data = (void *)addr;
    f->t.device.device_type = kDLCUDA;
    f->t.ndim = ndim;
    f->t.dtype.code = code;
    f->t.dtype.bits = bits;
    f->t.dtype.lanes = 1;
    memcpy(f->shape, shape, sizeof(int64_t) * (size_t)ndim);
    f->t.shape = f->shape;
    f->t.strides = NULL;
}

typedef struct fwd_setup {
    fake_tensor q, k, v, o;
    lajit_attn_fwd_args args;
} fwd_setup;

static void fwd_valid(fwd_setup *s)
{
    int64_t shape[4] = {2, 4, 64, 128};
    fake(&s->q, 0x100000, 4, shape, kDLBfloat, 16);
    fake(&s->k, 0x200000, 4, shape, kDLBfloat, 16);
    fake(&s->v, 0x300000, 4, shape, kDLBfloat, 16);
    fake(&s->o, 0x400000, 4, shape, kDLBfloat, 16);
    memset(&s->args, 0, sizeof s->args);
    s->args.struct_size = sizeof s->args;
    s->args.q = &s->q.t;
    s->args.k = &s->k.t;
    s->args.v = &s->v.t;
    s->args.o = &s->o.t;
    s->args.scale = 1.0f;
}

LJ_TEST(ctx_create_null_out)
{
    ASSERT_STATUS(lajit_ctx_create(NULL, NULL), LAJIT_ERR_INVALID_ARGUMENT);
}

LJ_TEST(ctx_create_wrong_struct_size)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    lajit_ctx *ctx = (lajit_ctx *)0x1;
    /* A later version's (larger) struct and a size no version had; the sizes ending before the
     * fields added in 0.1 (autotune, bundle) are accepted. */
    size_t bad[] = {sizeof desc + 8, 12};
    for (int i = 0; i < 2; i++) {
        desc.struct_size = bad[i];
        ASSERT_STATUS(lajit_ctx_create(&desc, &ctx), LAJIT_ERR_STRUCT_SIZE);
        ASSERT_TRUE(ctx == (lajit_ctx *)0x1); /* outputs written only on success */
    }
    desc.struct_size = offsetof(lajit_ctx_desc, bundle);
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lajit_ctx_destroy(ctx);
}

LJ_TEST(ctx_destroy_null_and_errmsg_null)
{
    lajit_ctx_destroy(NULL);
    ASSERT_TRUE(lajit_errmsg(NULL) != NULL);
    lajit_ctx *ctx = make_ctx();
    ASSERT_STREQ(lajit_errmsg(ctx), "");
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_null_ctx_and_args)
{
    fwd_setup s;
    fwd_valid(&s);
    ASSERT_STATUS(lajit_attn_fwd(NULL, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_fwd(ctx, NULL), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "NULL");
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_wrong_struct_size)
{
    fwd_setup s;
    fwd_valid(&s);
    s.args.struct_size = 8;
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_STRUCT_SIZE);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "struct_size");
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_missing_tensor)
{
    fwd_setup s;
    fwd_valid(&s);
    s.args.v = NULL;
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_bad_scale)
{
    fwd_setup s;
    fwd_valid(&s);
    lajit_ctx *ctx = make_ctx();
    s.args.scale = 0.0f;
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "scale");
    s.args.scale = NAN;
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_wrong_dtype)
{
    fwd_setup s;
    fwd_valid(&s);
    s.q.t.dtype.code = kDLInt;
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "q");
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_mixed_dtypes)
{
    fwd_setup s;
    fwd_valid(&s);
    s.k.t.dtype.code = kDLFloat; /* float16 k with bfloat16 q */
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "k");
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_host_memory)
{
    fwd_setup s;
    fwd_valid(&s);
    s.o.t.device.device_type = kDLCPU;
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "o");
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_shape_mismatch)
{
    fwd_setup s;
    fwd_valid(&s);
    s.k.shape[2] = 63;
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_zero_size)
{
    fwd_setup s;
    fwd_valid(&s);
    s.q.shape[2] = s.k.shape[2] = s.v.shape[2] = s.o.shape[2] = 0;
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_head_dim_unsupported)
{
    fwd_setup s;
    fwd_valid(&s);
    s.q.shape[3] = s.k.shape[3] = 40; /* 80-byte rows: aligned, but not a multiple of 16 */
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_UNSUPPORTED);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "multiples of 16");
    s.q.shape[3] = s.k.shape[3] = 512;
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_UNSUPPORTED);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_misaligned_pointer)
{
    fwd_setup s;
    fwd_valid(&s);
    s.q.t.byte_offset = 2;
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "align");
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_non_unit_last_stride)
{
    fwd_setup s;
    fwd_valid(&s);
    int64_t strides[4] = {4 * 64 * 256, 64 * 256, 256, 2};
    memcpy(s.q.strides, strides, sizeof strides);
    s.q.t.strides = s.q.strides;
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_offsets_past_2_31_reach_the_device)
{
    /* 2 x 4 x 64 x 128 elements, but a batch stride of 2^31 elements: kernels index with 64-bit
     * bases, so the call is well-formed and gets as far as the driver. */
    fwd_setup s;
    fwd_valid(&s);
    int64_t strides[4] = {(int64_t)1 << 31, 64 * 128, 128, 1};
    memcpy(s.q.strides, strides, sizeof strides);
    s.q.t.strides = s.q.strides;
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DEVICE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_NO_DEVICE);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_offsets_overflow_64_bits)
{
    fwd_setup s;
    fwd_valid(&s);
    /* A batch stride of 2^63 - 16 elements: the second batch's offsets pass 2^63. */
    int64_t strides[4] = {INT64_MAX - 15, 64 * 128, 128, 1};
    memcpy(s.q.strides, strides, sizeof strides);
    s.q.t.strides = s.q.strides;
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "q's offsets overflow 64 bits");
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_extent_past_the_address_space)
{
    fwd_setup s;
    fwd_valid(&s);
    /* A batch stride of 3 * 2^61 bf16 elements from an address in the top quarter of the address
     * space: the offsets fit in 63 bits, the bytes run past 2^64. */
    int64_t strides[4] = {(int64_t)3 << 61, 64 * 128, 128, 1};
    memcpy(s.q.strides, strides, sizeof strides);
    s.q.t.strides = s.q.strides;
    s.q.t.data = (void *)(uintptr_t)0xc000000000000000ull;
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "q's extent wraps");
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_unknown_flags)
{
    fwd_setup s;
    fwd_valid(&s);
    s.args.flags = 0x80;
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_state_wrong_dtype_and_shape)
{
    fwd_setup s;
    fwd_valid(&s);
    fake_tensor st;
    int64_t shape[4] = {2, 4, 128, 128};
    fake(&st, 0x500000, 4, shape, kDLInt, 32); /* states are float32, bfloat16 or float16 */
    s.args.initial_state = &st.t;
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    st.t.dtype.code = kDLFloat;
    st.t.dtype.bits = 32;
    st.shape[1] = 5; /* wrong H */
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_varlen_without_slots)
{
    fake_tensor q, k, v, o, cu, pool;
    int64_t shape[3] = {100, 4, 64}, cs[1] = {3}, ps[4] = {8, 4, 64, 64};
    fake(&q, 0x100000, 3, shape, kDLFloat, 16);
    fake(&k, 0x200000, 3, shape, kDLFloat, 16);
    fake(&v, 0x300000, 3, shape, kDLFloat, 16);
    fake(&o, 0x400000, 3, shape, kDLFloat, 16);
    fake(&cu, 0x500000, 1, cs, kDLInt, 32);
    fake(&pool, 0x600000, 4, ps, kDLFloat, 32);
    lajit_attn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &q.t;
    a.k = &k.t;
    a.v = &v.t;
    a.o = &o.t;
    a.scale = 1.0f;
    a.cu_seqlens = &cu.t;
    a.initial_state = &pool.t;
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "state_slots");
    lajit_ctx_destroy(ctx);
}

LJ_TEST(fwd_valid_args_need_a_device)
{
    /* Everything is well-formed: the call gets as far as the driver, which this context may
     * not use. */
    fwd_setup s;
    fwd_valid(&s);
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DEVICE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    ASSERT_STATUS(lajit_attn_fwd(ctx, &s.args), LAJIT_ERR_NO_DEVICE);
    lajit_ctx_destroy(ctx);
}

/* Decode past element 2^31: a pool whose last slot starts there and q, k, v, o with a batch
 * stride past it are well-formed (the call reaches the device); a row whose T steps span 2^31
 * elements or more is refused (la_decode reads a row's steps at 32-bit offsets). */
LJ_TEST(decode_wide_pool_and_step_span)
{
    fake_tensor q, k, v, o, pool;
    int64_t qs[4] = {2, 2, 8, 64}, ps[4] = {(1 << 16) + 1, 8, 64, 64};
    int64_t wide[4] = {(int64_t)1 << 32, 8 * 64, 64, 1};
    fake(&q, 0x100000, 4, qs, kDLBfloat, 16);
    fake(&k, 0x200000, 4, qs, kDLBfloat, 16);
    fake(&v, 0x300000, 4, qs, kDLBfloat, 16);
    fake(&o, 0x400000, 4, qs, kDLBfloat, 16);
    fake(&pool, 0x600000, 4, ps, kDLFloat, 32); /* slot 2^16 starts at element 2^31 */
    fake_tensor *all[4] = {&q, &k, &v, &o};
    for (int i = 0; i < 4; i++) { /* batch 1 of each sits past element 2^32 */
        memcpy(all[i]->strides, wide, sizeof wide);
        all[i]->t.strides = all[i]->strides;
        all[i]->t.data = (void *)(uintptr_t)(0x100000ull << (i + 2 * 8));
    }
    lajit_attn_decode_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &q.t, a.k = &k.t, a.v = &v.t, a.o = &o.t, a.state = &pool.t, a.scale = 1.0f;
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DEVICE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    ASSERT_STATUS(lajit_attn_decode(ctx, &a), LAJIT_ERR_NO_DEVICE);
    /* Steps 2^31 elements apart in q. */
    int64_t far_steps[4] = {(int64_t)1 << 33, (int64_t)1 << 31, 64, 1};
    memcpy(q.strides, far_steps, sizeof far_steps);
    ASSERT_STATUS(lajit_attn_decode(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "q: one row's T steps");
    memcpy(q.strides, wide, sizeof wide);
    ASSERT_STATUS(lajit_attn_decode(ctx, &a), LAJIT_ERR_NO_DEVICE);
    /* One state whose 64 rows lie 2^26 elements apart spans 2^31 or more: refused; 2^25 apart
     * (63 * 2^25 + 63 < 2^31) passes. */
    int64_t tall[4] = {2, 1, 64, 64}, rows26[4] = {(int64_t)1 << 32, 0, (int64_t)1 << 26, 1};
    fake(&pool, 0x600000, 4, tall, kDLFloat, 32);
    memcpy(pool.strides, rows26, sizeof rows26);
    pool.t.strides = pool.strides;
    int64_t q1[4] = {2, 2, 1, 64};
    for (int i = 0; i < 4; i++)
        memcpy(all[i]->shape, q1, sizeof q1);
    ASSERT_STATUS(lajit_attn_decode(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "state: one state's D x E values");
    pool.strides[2] = (int64_t)1 << 25;
    ASSERT_STATUS(lajit_attn_decode(ctx, &a), LAJIT_ERR_NO_DEVICE);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(decode_too_many_steps)
{
    fake_tensor q, k, v, o, pool;
    int64_t shape[4] = {4, 9, 8, 64}, ps[4] = {4, 8, 64, 64};
    fake(&q, 0x100000, 4, shape, kDLBfloat, 16);
    fake(&k, 0x200000, 4, shape, kDLBfloat, 16);
    fake(&v, 0x300000, 4, shape, kDLBfloat, 16);
    fake(&o, 0x400000, 4, shape, kDLBfloat, 16);
    fake(&pool, 0x600000, 4, ps, kDLFloat, 32);
    lajit_attn_decode_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &q.t;
    a.k = &k.t;
    a.v = &v.t;
    a.o = &o.t;
    a.state = &pool.t;
    a.scale = 1.0f;
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_decode(ctx, &a), LAJIT_ERR_UNSUPPORTED);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "T = 9");
    q.shape[1] = k.shape[1] = v.shape[1] = o.shape[1] = 2;
    pool.shape[0] = 2; /* fewer slots than rows and no state_slots */
    ASSERT_STATUS(lajit_attn_decode(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(decay_helpers)
{
    float s[12];
    ASSERT_OK(lajit_decay_alibi(8, 0, 1, s));
    /* 2^(-8(h+1)/8) (1 + 1e-5) */
    for (int h = 0; h < 8; h++)
        ASSERT_LE_F(fabs(s[h] - pow(2.0, -(h + 1)) * (1 + 1e-5)), 1e-7);
    /* 12 heads: 8 power-of-two slopes, then 2^(-8(2j+1)/16) for j = 0..3. */
    ASSERT_OK(lajit_decay_alibi(12, 0, 1, s));
    ASSERT_LE_F(fabs(s[8] - pow(2.0, -0.5) * (1 + 1e-5)), 1e-7);
    ASSERT_LE_F(fabs(s[11] - pow(2.0, -3.5) * (1 + 1e-5)), 1e-7);
    /* Last layer of 4: factor 1e-5. */
    ASSERT_OK(lajit_decay_alibi(8, 3, 4, s));
    ASSERT_LE_F(fabs(s[0] - 0.5 * 1e-5), 1e-9);
    ASSERT_OK(lajit_decay_tnl(8, 1, 4, s));
    ASSERT_LE_F(fabs(s[2] - 8.0 * 2 / 8 * 0.75), 1e-6);
    float logl[2] = {-0.25f, 0.0f};
    ASSERT_OK(lajit_decay_from_log(logl, 2, s));
    ASSERT_LE_F(fabs(s[0] - 0.25f), 0);
    logl[1] = 0.5f;
    ASSERT_STATUS(lajit_decay_from_log(logl, 2, s), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(lajit_decay_alibi(0, 0, 1, s), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(lajit_decay_alibi(8, 4, 4, s), LAJIT_ERR_INVALID_ARGUMENT);
}

/* The tensor-parallel rule (lajit.h, "Decay conventions"): a shard's rates are the slice of the
 * model's, not the adapter called with the shard's head count, which gives other slopes. */
LJ_TEST(decay_tensor_parallel_rule)
{
    enum { H = 64, SHARDS = 8, HS = H / SHARDS, LAYERS = 80 };
    float total[H], own[HS];
    for (int layer = 0; layer < LAYERS; layer += 79) {
        ASSERT_OK(lajit_decay_alibi(H, layer, LAYERS, total));
        double factor = 1.0 - (double)layer / (LAYERS - 1) + 1e-5;
        for (int r = 0; r < SHARDS; r++) {
            /* GPU r's slice is the formula at the global head index. */
            for (int i = 0; i < HS; i++) {
                int h = r * HS + i;
                double want = pow(2.0, -8.0 * (h + 1) / H) * factor;
                ASSERT_LE_F(fabs(total[h] - want), 1e-6 * want);
            }
        }
        /* The shard's own count gives other slopes: 2^(-8(i+1)/8) for i = 0..7. */
        ASSERT_OK(lajit_decay_alibi(HS, layer, LAYERS, own));
        double worst = 0;
        for (int i = 0; i < HS; i++)
            worst = fmax(worst, fabs(own[i] - total[i]) / own[i]);
        ASSERT_TRUE(worst > 0.9);
        ASSERT_LE_F(fabs(own[0] - 0.5 * factor), 1e-6);
        ASSERT_LE_F(fabs(total[0] - pow(2.0, -0.125) * factor), 1e-6);
    }
}

/* ---- Backward ------------------------------------------------------------------------------ */

typedef struct bwd_setup {
    fake_tensor q, k, v, g, dq, dk, dv, s, ds, st;
    lajit_attn_bwd_args args;
} bwd_setup;

static void bwd_valid(bwd_setup *s)
{
    int64_t shape[4] = {2, 4, 64, 128}, h[1] = {4}, st[4] = {2, 4, 128, 128};
    fake(&s->q, 0x100000, 4, shape, kDLBfloat, 16);
    fake(&s->k, 0x200000, 4, shape, kDLBfloat, 16);
    fake(&s->v, 0x300000, 4, shape, kDLBfloat, 16);
    fake(&s->g, 0x400000, 4, shape, kDLBfloat, 16);
    fake(&s->dq, 0x500000, 4, shape, kDLBfloat, 16);
    fake(&s->dk, 0x600000, 4, shape, kDLBfloat, 16);
    fake(&s->dv, 0x700000, 4, shape, kDLBfloat, 16);
    fake(&s->s, 0x800000, 1, h, kDLFloat, 32);
    fake(&s->ds, 0x900000, 1, h, kDLFloat, 32);
    fake(&s->st, 0xa00000, 4, st, kDLFloat, 32);
    memset(&s->args, 0, sizeof s->args);
    s->args.struct_size = sizeof s->args;
    s->args.q = &s->q.t;
    s->args.k = &s->k.t;
    s->args.v = &s->v.t;
    s->args.dout = &s->g.t;
    s->args.dq = &s->dq.t;
    s->args.dk = &s->dk.t;
    s->args.dv = &s->dv.t;
    s->args.scale = 1.0f;
}

LJ_TEST(bwd_null_ctx_args_and_struct_size)
{
    bwd_setup s;
    bwd_valid(&s);
    ASSERT_STATUS(lajit_attn_bwd(NULL, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_bwd(ctx, NULL), LAJIT_ERR_INVALID_ARGUMENT);
    s.args.struct_size = sizeof s.args - 8;
    ASSERT_STATUS(lajit_attn_bwd(ctx, &s.args), LAJIT_ERR_STRUCT_SIZE);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(bwd_missing_gradient_tensor)
{
    bwd_setup s;
    bwd_valid(&s);
    s.args.dk = NULL;
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_bwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_TRUE(strstr(lajit_errmsg(ctx), "dk") != NULL);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(bwd_ds_needs_s)
{
    bwd_setup s;
    bwd_valid(&s);
    s.args.ds = &s.ds.t;
    lajit_ctx *ctx = make_ctx();
    ASSERT_STATUS(lajit_attn_bwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_TRUE(strstr(lajit_errmsg(ctx), "needs s") != NULL);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(bwd_shape_and_dtype_mismatch)
{
    bwd_setup s;
    bwd_valid(&s);
    lajit_ctx *ctx = make_ctx();
    s.dq.shape[2] = 63; /* dq must be shaped like q */
    ASSERT_STATUS(lajit_attn_bwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_TRUE(strstr(lajit_errmsg(ctx), "dq") != NULL);
    s.dq.shape[2] = 64;
    s.g.t.dtype.code = kDLFloat; /* dO in another dtype */
    ASSERT_STATUS(lajit_attn_bwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    s.g.t.dtype.code = kDLBfloat;
    s.args.s = &s.s.t;
    s.ds.shape[0] = 3; /* ds must be [H] */
    s.args.ds = &s.ds.t;
    ASSERT_STATUS(lajit_attn_bwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(bwd_state_gradients_checked)
{
    bwd_setup s;
    bwd_valid(&s);
    lajit_ctx *ctx = make_ctx();
    s.st.t.dtype.bits = 16; /* states are float32 */
    s.st.t.dtype.code = kDLBfloat;
    s.args.d_final_state = &s.st.t;
    ASSERT_STATUS(lajit_attn_bwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_TRUE(strstr(lajit_errmsg(ctx), "d_final_state") != NULL);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(bwd_slots_only_with_varlen)
{
    bwd_setup s;
    bwd_valid(&s);
    lajit_ctx *ctx = make_ctx();
    fake_tensor sl;
    int64_t n[1] = {2};
    fake(&sl, 0xb00000, 1, n, kDLInt, 32);
    s.args.state_slots = &sl.t;
    ASSERT_STATUS(lajit_attn_bwd(ctx, &s.args), LAJIT_ERR_INVALID_ARGUMENT);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(bwd_workspace_size)
{
    ASSERT_EQ(lajit_attn_bwd_workspace_size(0, 4, 64), 0);
    ASSERT_EQ(lajit_attn_bwd_workspace_size(2, 4, -1), 0);
    size_t w = lajit_attn_bwd_workspace_size(4, 32, 128);
    ASSERT_TRUE(w >= 16 + 4 * 32 * 8 * 4 && w % 16 == 0);
}

/* Decode's NULL arguments and struct_size: a NULL context or args, each required tensor NULL,
 * and a struct_size of 0, too small, or larger than this build knows (even with a zero tail:
 * op arguments must match exactly) each get a clear status and message; the same arguments
 * with the right size reach the device (LAJIT_ERR_NO_DEVICE with LAJIT_CTX_NO_DEVICE). */
LJ_TEST(decode_null_args_and_struct_size)
{
    fake_tensor q, k, v, o, pool;
    int64_t qs[3] = {4, 8, 64}, ps[4] = {4, 8, 64, 64};
    fake(&q, 0x100000, 3, qs, kDLBfloat, 16);
    fake(&k, 0x200000, 3, qs, kDLBfloat, 16);
    fake(&v, 0x300000, 3, qs, kDLBfloat, 16);
    fake(&o, 0x400000, 3, qs, kDLBfloat, 16);
    fake(&pool, 0x600000, 4, ps, kDLFloat, 32);
    struct {
        lajit_attn_decode_args a;
        unsigned char tail[16];
    } big;
    memset(&big, 0, sizeof big);
    lajit_attn_decode_args *a = &big.a;
    a->struct_size = sizeof *a;
    a->q = &q.t, a->k = &k.t, a->v = &v.t, a->o = &o.t, a->state = &pool.t, a->scale = 1.0f;

    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DEVICE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    ASSERT_STATUS(lajit_attn_decode(NULL, a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(lajit_attn_decode(ctx, NULL), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "lajit_attn_decode: args is NULL");

    const size_t sizes[] = {0, sizeof(size_t), sizeof *a - sizeof(void *), sizeof *a + 1,
                            sizeof big};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        a->struct_size = sizes[i];
        ASSERT_STATUS(lajit_attn_decode(ctx, a), LAJIT_ERR_STRUCT_SIZE);
        ASSERT_CONTAINS(lajit_errmsg(ctx), "struct_size");
        ASSERT_CONTAINS(lajit_errmsg(ctx), "this build knows");
    }
    a->struct_size = sizeof *a;

    const DLTensor **req[] = {&a->q, &a->k, &a->v, (const DLTensor **)&a->o,
                              (const DLTensor **)&a->state};
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
        const DLTensor *keep = *req[i];
        *req[i] = NULL;
        ASSERT_STATUS(lajit_attn_decode(ctx, a), LAJIT_ERR_INVALID_ARGUMENT);
        ASSERT_CONTAINS(lajit_errmsg(ctx), "q, k, v, o and state are required");
        *req[i] = keep;
    }
    /* Everything present and the right size: the arguments pass and the op needs a device. */
    ASSERT_STATUS(lajit_attn_decode(ctx, a), LAJIT_ERR_NO_DEVICE);
    lajit_ctx_destroy(ctx);
}
