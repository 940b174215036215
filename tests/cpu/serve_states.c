/* serve_states.c — issue 23's serving formats without a GPU: 16-bit state storage (bf16, f16) for
 * the forward's states and decode's pool, fp32/16-bit mixed outputs, and fresh slots. The problem's
 * new fields (text assignments, summaries, family keys, plan keys), the constants each template
 * bakes for them, and the ops' argument checks through the fake driver: what is accepted launches
 * the family it should, what is refused says why. The kernels themselves are checked against the
 * float64 reference by tests/gpu/serve_states.c. */
#include "test.h"

#include <stdint.h>

#include "context.h"
#include "fake_driver.h"
#include "plan.h"
#include "problem.h"

enum { B = 2, H = 3, N = 5, D = 32, E = 16, P = 4 };

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

static void open_fake(void)
{
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    CUcontext c;
    lj_fake_driver_reset();
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&c, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(c), CUDA_SUCCESS);
}

/* A compact tensor of its own fake allocation; shape copied in. */
typedef struct tensor {
    DLTensor t;
    int64_t shape[5];
} tensor;

static void make(tensor *x, int code, int bits, int ndim, const int64_t *shape)
{
    memset(x, 0, sizeof *x);
    size_t n = (size_t)bits / 8;
    for (int i = 0; i < ndim; i++) {
        x->shape[i] = shape[i];
        n *= (size_t)shape[i];
    }
    CUdeviceptr p;
    ASSERT_EQ(lj_fake_driver()->cuMemAlloc(&p, n), CUDA_SUCCESS);
    x->t.data = (void *)(uintptr_t)p;
    x->t.device.device_type = kDLCUDA;
    x->t.ndim = ndim;
    x->t.dtype.code = (uint8_t)code;
    x->t.dtype.bits = (uint8_t)bits;
    x->t.dtype.lanes = 1;
    x->t.shape = x->shape;
}

#define F32  kDLFloat, 32
#define F16  kDLFloat, 16
#define BF16 kDLBfloat, 16
#define I32  kDLInt, 32

/* ---- The problem's fields --------------------------------------------------------------------- */

static lj_family *family(lajit_ctx *ctx, const char *name)
{
    lj_family *f;
    ASSERT_OK(lajit__ctx_family(ctx, name, &f));
    return f;
}

/* Applies assignments to the family's first representative problem. */
static lj_problem problem_of(lajit_ctx *ctx, lj_family *f, const char *const *as, size_t n)
{
    lj_problem *list;
    int count;
    ASSERT_OK(lj_family_problems(f, &list, &count));
    lj_problem p = list[0];
    lj_free(&ctx->env, list);
    lj_config cfg;
    lj_device_info dev;
    ASSERT_EQ(lj_device_info_for_arch("sm_90a", &dev), 1);
    ASSERT_OK(lj_assign_all(&ctx->env, f, as, n, &dev, &p, &cfg));
    return p;
}

LJ_TEST(problem_assign_and_format)
{
    lajit_ctx *ctx = fake_ctx();
    lj_family *f = family(ctx, "la_decode");
    const char *plain[] = {"dtype=bf16"};
    lj_problem p = problem_of(ctx, f, plain, 1);
    char text[256];
    lj_problem_format(&p, text, sizeof text);
    ASSERT_TRUE(strstr(text, "state=") == NULL);
    ASSERT_TRUE(strstr(text, "out=") == NULL);
    ASSERT_EQ(p.state_dtype, LJ_F32);
    ASSERT_EQ(lj_problem_out(&p), LJ_BF16);

    const char *mixed[] = {"out_dtype=bf16", "dtype=f32", "state_dtype=f16"};
    p = problem_of(ctx, f, mixed, 3);
    ASSERT_EQ(p.dtype, LJ_F32);
    ASSERT_EQ(p.state_dtype, LJ_F16);
    ASSERT_EQ(lj_problem_out(&p), LJ_BF16);
    lj_problem_format(&p, text, sizeof text);
    ASSERT_CONTAINS(text, "decode f32 ");
    ASSERT_CONTAINS(text, " state=f16 out=bf16");

    /* An out_dtype equal to dtype is no mixed problem. */
    const char *same[] = {"dtype=f16", "out_dtype=f16"};
    p = problem_of(ctx, f, same, 2);
    lj_problem_format(&p, text, sizeof text);
    ASSERT_TRUE(strstr(text, "out=") == NULL);

    lj_config cfg;
    ASSERT_STATUS(lj_assign(&ctx->env, f, "state_dtype=int8", &p, &cfg),
                  LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "state_dtype=int8: expected f32, f16 or bf16");
    ASSERT_STATUS(lj_assign(&ctx->env, f, "out_dtype=", &p, &cfg), LAJIT_ERR_INVALID_ARGUMENT);
    lajit_ctx_destroy(ctx);
}

/* Every family's key() and the plan key tell the new fields apart, and leave the keys of the
 * default problems as they were (tuned winners and bundles keep their buckets). */
LJ_TEST(keys_distinguish_state_and_out_dtypes)
{
    lajit_ctx *ctx = fake_ctx();
    static const char *const names[] = {"la_decode", "la_fwd", "la_fwd_sm90", "la_recurrent"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        lj_family *f = family(ctx, names[i]);
        const char *base_as[] = {"dtype=bf16"};
        const char *state_as[] = {"dtype=bf16", "state_dtype=bf16"};
        const char *state16_as[] = {"dtype=bf16", "state_dtype=f16"};
        const char *out_as[] = {"dtype=bf16", "out_dtype=f32"};
        lj_problem base = problem_of(ctx, f, base_as, 1);
        lj_problem st = problem_of(ctx, f, state_as, 2);
        lj_problem st16 = problem_of(ctx, f, state16_as, 2);
        lj_problem out = problem_of(ctx, f, out_as, 2);
        char kb[256], ks[256], ks16[256], ko[256];
        ASSERT_OK(lj_family_key(f, &base, kb, sizeof kb));
        ASSERT_OK(lj_family_key(f, &st, ks, sizeof ks));
        ASSERT_OK(lj_family_key(f, &st16, ks16, sizeof ks16));
        ASSERT_OK(lj_family_key(f, &out, ko, sizeof ko));
        ASSERT_TRUE(strstr(kb, "_sbf16") == NULL && strstr(kb, "_sf16") == NULL);
        ASSERT_TRUE(strstr(kb, "_of32") == NULL && strstr(kb, "_obf16") == NULL);
        ASSERT_CONTAINS(ks, "_sbf16");
        ASSERT_CONTAINS(ks16, "_sf16");
        ASSERT_CONTAINS(ko, "_of32");
        lj_plan_key a = lj_plan_key_make(&base, 0), b = lj_plan_key_make(&st, 0),
                    c = lj_plan_key_make(&out, 0), d = lj_plan_key_make(&st16, 0);
        ASSERT_NE(memcmp(&a, &b, sizeof a), 0);
        ASSERT_NE(memcmp(&a, &c, sizeof a), 0);
        ASSERT_NE(memcmp(&b, &d, sizeof a), 0);
    }
    lajit_ctx_destroy(ctx);
}

/* The constants each template bakes for the storage and output types. */
static void expands_with(lajit_ctx *ctx, const char *fam, const char *const *as, size_t n,
                         const char *const *needles, size_t k)
{
    char *src;
    ASSERT_OK(lajit_expand(ctx, fam, "sm_90a", as, n, &src));
    for (size_t i = 0; i < k; i++)
        ASSERT_CONTAINS(src, needles[i]);
    lajit_free(ctx, src);
}

LJ_TEST(templates_bake_state_and_out_types)
{
    lajit_ctx *ctx = fake_ctx();
    const char *dec[] = {"dtype=f32", "state_dtype=bf16", "out_dtype=bf16"};
    const char *dec_n[] = {"using state_t = lj_bf16;", "using out_t = lj_bf16;",
                           "using elem_t = float;"};
    expands_with(ctx, "la_decode", dec, 3, dec_n, 3);
    const char *fwd[] = {"dtype=f32", "state_dtype=f16", "out_dtype=bf16", "has_initial=1",
                         "has_final=1"};
    const char *fwd_n[] = {"using ST = lj_f16;", "using OT = lj_bf16;"};
    expands_with(ctx, "la_fwd", fwd, 5, fwd_n, 2);
    const char *sm90[] = {"dtype=bf16", "state_dtype=bf16", "has_initial=1", "has_final=1"};
    const char *sm90_n[] = {"using ST0 = lj_bf16;", "using STN = lj_bf16;"};
    expands_with(ctx, "la_fwd_sm90", sm90, 4, sm90_n, 2);
    const char *rec[] = {"dtype=bf16", "state_dtype=f16", "out_dtype=f32"};
    const char *rec_n[] = {"using state_t = lj_f16;", "using out_t = float;"};
    expands_with(ctx, "la_recurrent", rec, 3, rec_n, 2);
    /* The backward's passes bake float states whatever they are given (they refuse 16-bit). */
    const char *bwd[] = {"dtype=bf16", "has_initial=1"};
    const char *bwd_n[] = {"using ST = float;"};
    expands_with(ctx, "la_bwd", bwd, 2, bwd_n, 1);
    /* A mixed problem is no la_fwd_sm90 problem (16-bit in and out only) and f16 with bf16 is
     * nobody's. */
    const char *sm90_mixed[] = {"dtype=bf16", "out_dtype=f32"};
    char *src = NULL;
    lajit_status st = lajit_expand(ctx, "la_fwd_sm90", "sm_90a", sm90_mixed, 2, &src);
    lajit_free(ctx, src);
    (void)st; /* expansion of an invalid problem may still succeed; valid() is what refuses */
    lj_family *f = family(ctx, "la_fwd_sm90");
    lj_problem p = problem_of(ctx, f, sm90_mixed, 2);
    lj_device_info dev;
    ASSERT_EQ(lj_device_info_for_arch("sm_90a", &dev), 1);
    lj_config cfg;
    ASSERT_OK(lj_family_default(f, &p, &dev, &cfg));
    int ok;
    char reason[256];
    ASSERT_OK(lj_family_valid(f, &cfg, &p, &dev, &ok, reason, sizeof reason));
    ASSERT_EQ(ok, 0);
    ASSERT_CONTAINS(reason, "mixed call goes to la_fwd");
    lj_family *lf = family(ctx, "la_fwd");
    const char *bad[] = {"dtype=bf16", "out_dtype=f16"};
    p = problem_of(ctx, lf, bad, 2);
    ASSERT_OK(lj_family_default(lf, &p, &dev, &cfg));
    ASSERT_OK(lj_family_valid(lf, &cfg, &p, &dev, &ok, reason, sizeof reason));
    ASSERT_EQ(ok, 0);
    ASSERT_CONTAINS(reason, "one f32 side");
    lajit_ctx_destroy(ctx);
}

/* ---- The ops' arguments through the fake driver ----------------------------------------------- */

typedef struct fwd_call {
    tensor q, k, v, o, s0, sn;
    lajit_attn_fwd_args a;
} fwd_call;

static void fwd_init(fwd_call *c, int qcode, int qbits, int ocode, int obits)
{
    int64_t qs[4] = {B, H, N, D}, vs[4] = {B, H, N, E}, ss[4] = {B, H, D, E};
    make(&c->q, qcode, qbits, 4, qs);
    make(&c->k, qcode, qbits, 4, qs);
    make(&c->v, qcode, qbits, 4, vs);
    make(&c->o, ocode, obits, 4, vs);
    make(&c->s0, F32, 4, ss);
    make(&c->sn, F32, 4, ss);
    memset(&c->a, 0, sizeof c->a);
    c->a.struct_size = sizeof c->a;
    c->a.q = &c->q.t, c->a.k = &c->k.t, c->a.v = &c->v.t, c->a.o = &c->o.t;
    c->a.scale = 1.0f;
}

static void set_dtype(tensor *x, int code, int bits)
{
    x->t.dtype.code = (uint8_t)code;
    x->t.dtype.bits = (uint8_t)bits;
}

LJ_TEST(fwd_16bit_states_accepted_mismatch_refused)
{
    require_nvrtc();
    open_fake();
    lajit_ctx *ctx = fake_ctx();
    fwd_call c;
    fwd_init(&c, F32, F32);
    c.a.family = "la_fwd";
    c.a.initial_state = &c.s0.t;
    c.a.final_state = &c.sn.t;
    set_dtype(&c.s0, BF16);
    set_dtype(&c.sn, BF16);
    ASSERT_OK(lajit_attn_fwd(ctx, &c.a));
    ASSERT_EQ(lj_fake_launch_count(), 1);
    set_dtype(&c.s0, F16);
    set_dtype(&c.sn, F16);
    ASSERT_OK(lajit_attn_fwd(ctx, &c.a));
    /* The states of one call share a dtype. */
    set_dtype(&c.sn, F32);
    ASSERT_STATUS(lajit_attn_fwd(ctx, &c.a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "final_state is f32 but initial_state is f16");
    ASSERT_CONTAINS(lajit_errmsg(ctx), "share a dtype");
    set_dtype(&c.sn, I32);
    ASSERT_STATUS(lajit_attn_fwd(ctx, &c.a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx),
                    "final_state is int32; expected float32, float16 or bfloat16");
    lajit_ctx_destroy(ctx);
}

/* A 16-bit state's strides are checked in bytes of its own element: 8 elements (16 bytes) pass,
 * 4 elements (8 bytes: enough for float32) do not. */
LJ_TEST(state_alignment_follows_element_size)
{
    require_nvrtc();
    open_fake();
    lajit_ctx *ctx = fake_ctx();
    fwd_call c;
    fwd_init(&c, F32, F32);
    c.a.family = "la_fwd";
    tensor big;
    int64_t bs[4] = {B, H, D, E + 8};
    make(&big, BF16, 4, bs);
    int64_t strides[4] = {(int64_t)H * D * (E + 8), (int64_t)D * (E + 8), E + 8, 1};
    big.t.shape = c.s0.shape; /* [B, H, D, E] view of rows E + 8 wide */
    big.t.strides = strides;
    c.a.initial_state = &big.t;
    ASSERT_OK(lajit_attn_fwd(ctx, &c.a));
    strides[0] = (int64_t)H * D * (E + 8) + 4; /* 8 bytes off */
    ASSERT_STATUS(lajit_attn_fwd(ctx, &c.a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "stride of");
    ASSERT_CONTAINS(lajit_errmsg(ctx), "elements of 2 bytes");
    set_dtype(&big, F32); /* the same strides in float32 elements are 16-byte multiples */
    big.t.data = c.s0.t.data;
    strides[0] = (int64_t)H * D * E + 4, strides[1] = (int64_t)D * E, strides[2] = E;
    ASSERT_OK(lajit_attn_fwd(ctx, &c.a));
    lajit_ctx_destroy(ctx);
}

LJ_TEST(bwd_refuses_16bit_states)
{
    open_fake();
    lajit_ctx *ctx = fake_ctx();
    int64_t qs[4] = {B, H, N, D}, vs[4] = {B, H, N, E}, ss[4] = {B, H, D, E};
    tensor q, k, v, dout, dq, dk, dv, s0, dsn;
    make(&q, BF16, 4, qs);
    make(&k, BF16, 4, qs);
    make(&v, BF16, 4, vs);
    make(&dout, BF16, 4, vs);
    make(&dq, BF16, 4, qs);
    make(&dk, BF16, 4, qs);
    make(&dv, BF16, 4, vs);
    make(&s0, BF16, 4, ss);
    make(&dsn, F16, 4, ss);
    lajit_attn_bwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &q.t, a.k = &k.t, a.v = &v.t, a.dout = &dout.t, a.dq = &dq.t, a.dk = &dk.t, a.dv = &dv.t;
    a.scale = 1.0f;
    a.initial_state = &s0.t;
    ASSERT_STATUS(lajit_attn_bwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "lajit_attn_bwd: initial_state is bf16; the backward's "
                                       "states");
    ASSERT_CONTAINS(lajit_errmsg(ctx), "must be float32");
    a.initial_state = NULL;
    a.d_final_state = &dsn.t;
    ASSERT_STATUS(lajit_attn_bwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "d_final_state is f16");
    lajit_ctx_destroy(ctx);
}

/* fp32 q, k, v with a 16-bit o go to la_fwd (tf32); 16-bit in, fp32 out too (la_fwd_sm90 takes
 * one dtype); 16-bit in and out stay on la_fwd_sm90 (the fake device is sm_90); f16 with bf16 is
 * refused. */
LJ_TEST(fwd_mixed_dtypes)
{
    require_nvrtc();
    open_fake();
    lajit_ctx *ctx = fake_ctx();
    fwd_call c;
    fwd_init(&c, F32, BF16);
    ASSERT_OK(lajit_attn_fwd(ctx, &c.a));
    ASSERT_EQ(lj_fake_launch_count(), 1);
    ASSERT_STREQ(lj_fake_launch_get(0)->entry, "la_fwd");
    fwd_init(&c, BF16, F32);
    ASSERT_OK(lajit_attn_fwd(ctx, &c.a));
    ASSERT_STREQ(lj_fake_launch_get(lj_fake_launch_count() - 1)->entry, "la_fwd");
    fwd_init(&c, F16, BF16);
    ASSERT_STATUS(lajit_attn_fwd(ctx, &c.a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "o is bf16 with f16 inputs");
    /* Only o may mix: a float32 v with 16-bit q, k stays refused. */
    fwd_init(&c, BF16, BF16);
    set_dtype(&c.v, F32);
    ASSERT_STATUS(lajit_attn_fwd(ctx, &c.a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "v is float32; expected bfloat16");
    /* An explicit la_fwd_sm90 refuses a mixed call with its reason. */
    fwd_init(&c, BF16, F32);
    c.a.family = "la_fwd_sm90";
    ASSERT_STATUS(lajit_attn_fwd(ctx, &c.a), LAJIT_ERR_UNSUPPORTED);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "mixed call goes to la_fwd");
    lajit_ctx_destroy(ctx);
}

typedef struct decode_call {
    tensor q, k, v, o, pool, slots, steps;
    lajit_attn_decode_args a;
} decode_call;

/* T = 4 steps, a pool of P slots of state dtype scode/sbits. */
static void decode_init(decode_call *c, int qcode, int qbits, int ocode, int obits, int scode,
                        int sbits)
{
    int64_t qs[4] = {B, 4, H, D}, vs[4] = {B, 4, H, E}, ps[4] = {P, H, D, E}, sl[1] = {B},
            st[5] = {B, 4, H, D, E};
    make(&c->q, qcode, qbits, 4, qs);
    make(&c->k, qcode, qbits, 4, qs);
    make(&c->v, qcode, qbits, 4, vs);
    make(&c->o, ocode, obits, 4, vs);
    make(&c->pool, scode, sbits, 4, ps);
    make(&c->slots, I32, 1, sl);
    make(&c->steps, scode, sbits, 5, st);
    memset(&c->a, 0, sizeof c->a);
    c->a.struct_size = sizeof c->a;
    c->a.q = &c->q.t, c->a.k = &c->k.t, c->a.v = &c->v.t, c->a.o = &c->o.t;
    c->a.state = &c->pool.t;
    c->a.state_slots = &c->slots.t;
    c->a.step_states = &c->steps.t;
    c->a.scale = 1.0f;
}

LJ_TEST(decode_16bit_pool_and_mixed_output)
{
    require_nvrtc();
    open_fake();
    lajit_ctx *ctx = fake_ctx();
    decode_call c;
    decode_init(&c, BF16, BF16, BF16);
    ASSERT_OK(lajit_attn_decode(ctx, &c.a));
    ASSERT_EQ(lj_fake_launch_count(), 1);
    decode_init(&c, F32, BF16, F16);
    ASSERT_OK(lajit_attn_decode(ctx, &c.a));
    decode_init(&c, F16, F32, F32);
    ASSERT_OK(lajit_attn_decode(ctx, &c.a));
    ASSERT_EQ(lj_fake_launch_count(), 3);
    /* step_states are written as the pool is: the pool's dtype. */
    decode_init(&c, BF16, BF16, BF16);
    set_dtype(&c.steps, F32);
    ASSERT_STATUS(lajit_attn_decode(ctx, &c.a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "step_states is float32; expected bfloat16");
    decode_init(&c, BF16, F16, BF16);
    ASSERT_STATUS(lajit_attn_decode(ctx, &c.a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "o is f16 with bf16 inputs");
    lajit_ctx_destroy(ctx);
}

/* The encoding of lajit.h, as a server uses it. */
LJ_TEST(fresh_slot_encoding)
{
    ASSERT_EQ(LAJIT_SLOT_FRESH(0), -2);
    ASSERT_EQ(LAJIT_SLOT_FRESH(5), -7);
    ASSERT_EQ(LAJIT_SLOT_FRESH(INT32_MAX - 1), INT32_MIN);
    for (int s = 0; s < 1000; s++) {
        ASSERT_EQ(LAJIT_SLOT_IS_FRESH(LAJIT_SLOT_FRESH(s)), 1);
        ASSERT_EQ(LAJIT_SLOT_FRESH_SLOT(LAJIT_SLOT_FRESH(s)), s);
        ASSERT_EQ(LAJIT_SLOT_IS_FRESH(s), 0);
    }
    ASSERT_EQ(LAJIT_SLOT_IS_FRESH(LAJIT_SLOT_SKIP), 0);
}
