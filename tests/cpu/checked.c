/* checked.c — checked mode (LAJIT_CTX_CHECKED, or LAJIT_CHECK=1) through the fake driver for
 * every op: forward, backward and decode, dense and varlen with state pools. The fake's device
 * memory is host memory, so each case writes bad device-side values directly: a decay rate that
 * is NaN, infinite or negative; cu_seqlens that do not start at 0, decrease, or do not end at T;
 * a slot outside [0, P) or named by two rows. Each is refused with LAJIT_ERR_CHECK_FAILED, a
 * message naming the value, and nothing launched; valid values (empty sequences, slots of -1,
 * repeated -1 included) pass and launch. Without checked mode the same bad values launch (the
 * fast path trusts them, as DESIGN.md says). */
#include "test.h"

#include "context.h"
#include "fake_driver.h"

enum { B = 2, H = 3, N = 5, D = 32, E = 16, T = 7, NSEQ = 3, P = 4 };

/* A tensor with its own shape storage. */
typedef struct tensor {
    DLTensor t;
    int64_t shape[5];
} tensor;

static CUdeviceptr allocs[64];
static int n_allocs;

/* Zeroed fake device memory the test can read and write through a host pointer. */
static CUdeviceptr dalloc(size_t bytes)
{
    CUdeviceptr p;
    ASSERT_EQ(lj_fake_driver()->cuMemAlloc(&p, bytes), CUDA_SUCCESS);
    memset((void *)(uintptr_t)p, 0, bytes);
    ASSERT_TRUE(n_allocs < 64);
    allocs[n_allocs++] = p;
    return p;
}

static void make(tensor *x, int ndim, const int64_t *shape, uint8_t code, uint8_t bits)
{
    memset(x, 0, sizeof *x);
    size_t elems = 1;
    for (int i = 0; i < ndim; i++) {
        x->shape[i] = shape[i];
        elems *= (size_t)shape[i];
    }
    x->t.data = (void *)(uintptr_t)dalloc(elems * bits / 8);
    x->t.device.device_type = kDLCUDA;
    x->t.ndim = ndim;
    x->t.dtype.code = code;
    x->t.dtype.bits = bits;
    x->t.dtype.lanes = 1;
    x->t.shape = x->shape;
}

#define F32(x, ...)                                                                            \
    make(x, (int)(sizeof(int64_t[]){__VA_ARGS__} / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}, \
         kDLFloat, 32)
#define I32(x, ...)                                                                            \
    make(x, (int)(sizeof(int64_t[]){__VA_ARGS__} / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}, \
         kDLInt, 32)

static float *floats(tensor *x)
{
    return (float *)x->t.data;
}

static void set_ints(tensor *x, const int32_t *v, int n)
{
    memcpy(x->t.data, v, sizeof *v * (size_t)n);
}

static void require_nvrtc(void)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    int major, minor;
    if (lj_nvrtc_version(&env, &major, &minor) != LAJIT_OK)
        lj_test_skip("NVRTC not available");
}

static CUcontext primary;

static void open_fake(void)
{
    require_nvrtc();
    lj_fake_driver_reset();
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&primary, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(primary), CUDA_SUCCESS);
    n_allocs = 0;
}

static void close_fake(void)
{
    const lj_driver *drv = lj_fake_driver();
    ASSERT_EQ(drv->cuCtxSetCurrent(primary), CUDA_SUCCESS);
    for (int i = 0; i < n_allocs; i++)
        ASSERT_EQ(drv->cuMemFree(allocs[i]), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    ASSERT_TRUE(lj_fake_driver_balanced());
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

/* An op call: one of the three, on prepared arguments. */
typedef lajit_status (*op_fn)(lajit_ctx *ctx, const void *args);

static lajit_status call_fwd(lajit_ctx *ctx, const void *a)
{
    return lajit_attn_fwd(ctx, a);
}
static lajit_status call_bwd(lajit_ctx *ctx, const void *a)
{
    return lajit_attn_bwd(ctx, a);
}
static lajit_status call_decode(lajit_ctx *ctx, const void *a)
{
    return lajit_attn_decode(ctx, a);
}

/* The call must be refused in checked mode with `needle` in the message and nothing launched. */
static void expect_refused(lajit_ctx *ctx, op_fn op, const void *args, const char *needle, int line)
{
    int launches = lj_fake_launch_count();
    lajit_status st = op(ctx, args);
    if (st != LAJIT_ERR_CHECK_FAILED)
        lj_test_fail(__FILE__, line, "status %d (%s), want check failed; message \"%s\"", st,
                     lajit_status_string(st), lajit_errmsg(ctx));
    if (!strstr(lajit_errmsg(ctx), needle))
        lj_test_fail(__FILE__, line, "message \"%s\" lacks \"%s\"", lajit_errmsg(ctx), needle);
    if (lj_fake_launch_count() != launches)
        lj_test_fail(__FILE__, line, "a launch after a failed check");
}
#define REFUSED(ctx, op, args, needle) expect_refused(ctx, op, args, needle, __LINE__)

/* The call must pass and launch at least once. */
static void expect_launched(lajit_ctx *ctx, op_fn op, const void *args, int line)
{
    int launches = lj_fake_launch_count();
    lajit_status st = op(ctx, args);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, line, "status %d (%s): %s", st, lajit_status_string(st),
                     lajit_errmsg(ctx));
    if (lj_fake_launch_count() <= launches)
        lj_test_fail(__FILE__, line, "nothing launched");
}
#define LAUNCHED(ctx, op, args) expect_launched(ctx, op, args, __LINE__)

/* The decay-rate checks every op shares: NaN, ±infinity and negative values are refused by
 * head; zero, -0 and positive values pass. */
static void check_decay_rates(lajit_ctx *ctx, op_fn op, const void *args, tensor *s)
{
    float *v = floats(s);
    v[0] = 0.5f, v[1] = NAN, v[2] = 0.0f;
    REFUSED(ctx, op, args, "s[1] = nan");
    v[1] = 0.25f, v[2] = -0.5f;
    REFUSED(ctx, op, args, "s[2] = -0.5: must be finite and >= 0");
    v[2] = INFINITY;
    REFUSED(ctx, op, args, "s[2] = inf");
    v[0] = -INFINITY, v[2] = 1.0f;
    REFUSED(ctx, op, args, "s[0] = -inf");
    v[0] = -0.0f, v[1] = 0.0f, v[2] = 3.0f;
    LAUNCHED(ctx, op, args);
}

/* The varlen checks: cu_seqlens and slots, each bad in turn, then valid values. cu and slots
 * are restored to valid values on return. */
static void check_varlen(lajit_ctx *ctx, op_fn op, const void *args, tensor *cu, tensor *slots)
{
    static const int32_t valid_cu[NSEQ + 1] = {0, 0, 4, T}; /* an empty sequence is allowed */
    static const int32_t valid_slots[NSEQ] = {2, 0, 3};
    set_ints(slots, valid_slots, NSEQ);
    set_ints(cu, (const int32_t[]){1, 3, 5, T}, NSEQ + 1);
    REFUSED(ctx, op, args, "cu_seqlens[0] = 1, must be 0");
    set_ints(cu, (const int32_t[]){0, 4, 2, T}, NSEQ + 1);
    REFUSED(ctx, op, args, "cu_seqlens decreases at 2");
    set_ints(cu, (const int32_t[]){0, 2, 5, T - 1}, NSEQ + 1);
    REFUSED(ctx, op, args, "cu_seqlens ends at 6, not at T = 7");
    set_ints(cu, (const int32_t[]){0, 2, 5, T + 2}, NSEQ + 1);
    REFUSED(ctx, op, args, "cu_seqlens ends at 9, not at T = 7");
    set_ints(cu, (const int32_t[]){0, INT32_MIN, 5, T}, NSEQ + 1);
    REFUSED(ctx, op, args, "cu_seqlens decreases at 1");
    set_ints(cu, valid_cu, NSEQ + 1);

    set_ints(slots, (const int32_t[]){0, P, 1}, NSEQ);
    REFUSED(ctx, op, args, "slot 4 of row 1 is outside [0, 4)");
    /* Fresh indices (LAJIT_SLOT_FRESH(s) = -2 - s) name their slot: the same range and
     * uniqueness rules; INT32_MIN is slot 2^31 - 2 (no overflow in the decoding). */
    set_ints(slots, (const int32_t[]){0, LAJIT_SLOT_FRESH(P), 1}, NSEQ);
    REFUSED(ctx, op, args, "slot 4 of row 1 (a fresh index, LAJIT_SLOT_FRESH) is outside [0, 4)");
    set_ints(slots, (const int32_t[]){INT32_MIN, 0, 1}, NSEQ);
    REFUSED(ctx, op, args, "slot 2147483646 of row 0 (a fresh index");
    set_ints(slots, (const int32_t[]){0, LAJIT_SLOT_FRESH(0), 1}, NSEQ);
    REFUSED(ctx, op, args, "slot 0 is used by two rows");
    set_ints(slots, (const int32_t[]){LAJIT_SLOT_FRESH(2), 0, LAJIT_SLOT_FRESH(3)}, NSEQ);
    LAUNCHED(ctx, op, args);
    set_ints(slots, (const int32_t[]){3, 1, 3}, NSEQ);
    REFUSED(ctx, op, args, "slot 3 is used by two rows");
    /* -1 (no state) may repeat. */
    set_ints(slots, (const int32_t[]){-1, 1, -1}, NSEQ);
    LAUNCHED(ctx, op, args);
    set_ints(slots, valid_slots, NSEQ);
    LAUNCHED(ctx, op, args);
}

/* ---- Forward -------------------------------------------------------------------------------- */

LJ_TEST(fwd_dense_decay_rates)
{
    open_fake();
    tensor q, k, v, o, s, s0;
    F32(&q, B, H, N, D);
    F32(&k, B, H, N, D);
    F32(&v, B, H, N, E);
    F32(&o, B, H, N, E);
    F32(&s, H);
    F32(&s0, B, H, D, E);
    lajit_attn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &q.t, a.k = &k.t, a.v = &v.t, a.o = &o.t, a.s = &s.t, a.scale = 1.0f;
    a.initial_state = &s0.t, a.final_state = &s0.t;
    a.family = "la_recurrent";
    lajit_ctx *ctx = fake_ctx(LAJIT_CTX_CHECKED);
    check_decay_rates(ctx, call_fwd, &a, &s);
    /* Not checked: the fast path trusts the values and launches. */
    lajit_ctx *fast = fake_ctx(0);
    floats(&s)[1] = NAN;
    LAUNCHED(fast, call_fwd, &a);
    lajit_ctx_destroy(fast);
    /* LAJIT_CHECK=1 turns checked mode on for a context that did not ask. */
    setenv("LAJIT_CHECK", "1", 1);
    lajit_ctx *env_checked = fake_ctx(0);
    unsetenv("LAJIT_CHECK");
    REFUSED(env_checked, call_fwd, &a, "s[1] = nan");
    lajit_ctx_destroy(env_checked);
    lajit_ctx_destroy(ctx);
    close_fake();
}

LJ_TEST(fwd_varlen_pool)
{
    open_fake();
    tensor q, k, v, o, s, pool, cu, slots;
    F32(&q, T, H, D);
    F32(&k, T, H, D);
    F32(&v, T, H, E);
    F32(&o, T, H, E);
    F32(&s, H);
    F32(&pool, P, H, D, E);
    I32(&cu, NSEQ + 1);
    I32(&slots, NSEQ);
    lajit_attn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &q.t, a.k = &k.t, a.v = &v.t, a.o = &o.t, a.s = &s.t, a.scale = 1.0f;
    a.initial_state = &pool.t, a.final_state = &pool.t;
    a.cu_seqlens = &cu.t, a.state_slots = &slots.t;
    a.family = "la_recurrent";
    lajit_ctx *ctx = fake_ctx(LAJIT_CTX_CHECKED);
    check_varlen(ctx, call_fwd, &a, &cu, &slots);
    check_decay_rates(ctx, call_fwd, &a, &s);
    /* Varlen without states: no slots to check, cu_seqlens still checked. */
    a.initial_state = a.final_state = NULL, a.state_slots = NULL;
    set_ints(&cu, (const int32_t[]){0, 5, 4, T}, NSEQ + 1);
    REFUSED(ctx, call_fwd, &a, "cu_seqlens decreases at 2");
    set_ints(&cu, (const int32_t[]){0, 4, 4, T}, NSEQ + 1);
    LAUNCHED(ctx, call_fwd, &a);
    lajit_ctx_destroy(ctx);
    close_fake();
}

/* ---- Backward ------------------------------------------------------------------------------- */

typedef struct bwd_tensors {
    tensor q, k, v, dout, dq, dk, dv, s, ds;
} bwd_tensors;

static void bwd_common(bwd_tensors *x, lajit_attn_bwd_args *a, int varlen)
{
    if (varlen) {
        F32(&x->q, T, H, D);
        F32(&x->k, T, H, D);
        F32(&x->v, T, H, E);
        F32(&x->dout, T, H, E);
        F32(&x->dq, T, H, D);
        F32(&x->dk, T, H, D);
        F32(&x->dv, T, H, E);
    } else {
        F32(&x->q, B, H, N, D);
        F32(&x->k, B, H, N, D);
        F32(&x->v, B, H, N, E);
        F32(&x->dout, B, H, N, E);
        F32(&x->dq, B, H, N, D);
        F32(&x->dk, B, H, N, D);
        F32(&x->dv, B, H, N, E);
    }
    F32(&x->s, H);
    F32(&x->ds, H);
    memset(a, 0, sizeof *a);
    a->struct_size = sizeof *a;
    a->q = &x->q.t, a->k = &x->k.t, a->v = &x->v.t, a->dout = &x->dout.t;
    a->dq = &x->dq.t, a->dk = &x->dk.t, a->dv = &x->dv.t;
    a->s = &x->s.t, a->ds = &x->ds.t, a->scale = 0.5f;
}

LJ_TEST(bwd_dense_decay_rates)
{
    open_fake();
    bwd_tensors x;
    lajit_attn_bwd_args a;
    bwd_common(&x, &a, 0);
    tensor s0, dsn, ds0;
    F32(&s0, B, H, D, E);
    F32(&dsn, B, H, D, E);
    F32(&ds0, B, H, D, E);
    a.initial_state = &s0.t, a.d_final_state = &dsn.t, a.d_initial_state = &ds0.t;
    lajit_ctx *ctx = fake_ctx(LAJIT_CTX_CHECKED);
    check_decay_rates(ctx, call_bwd, &a, &x.s);
    lajit_ctx_destroy(ctx);
    close_fake();
}

LJ_TEST(bwd_varlen_pools)
{
    open_fake();
    bwd_tensors x;
    lajit_attn_bwd_args a;
    bwd_common(&x, &a, 1);
    tensor s0, dsn, ds0, cu, slots;
    F32(&s0, P, H, D, E);
    F32(&dsn, P, H, D, E);
    F32(&ds0, P, H, D, E);
    I32(&cu, NSEQ + 1);
    I32(&slots, NSEQ);
    a.initial_state = &s0.t, a.d_final_state = &dsn.t, a.d_initial_state = &ds0.t;
    a.cu_seqlens = &cu.t, a.state_slots = &slots.t;
    lajit_ctx *ctx = fake_ctx(LAJIT_CTX_CHECKED);
    check_varlen(ctx, call_bwd, &a, &cu, &slots);
    check_decay_rates(ctx, call_bwd, &a, &x.s);
    lajit_ctx_destroy(ctx);
    close_fake();
}

/* ---- Decode --------------------------------------------------------------------------------- */

enum { ROWS = 3 };

LJ_TEST(decode_pool_slots_and_decay)
{
    open_fake();
    tensor q, k, v, o, s, pool, slots;
    F32(&q, ROWS, H, D);
    F32(&k, ROWS, H, D);
    F32(&v, ROWS, H, E);
    F32(&o, ROWS, H, E);
    F32(&s, H);
    F32(&pool, P, H, D, E);
    I32(&slots, ROWS);
    lajit_attn_decode_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &q.t, a.k = &k.t, a.v = &v.t, a.o = &o.t, a.s = &s.t, a.scale = 1.0f;
    a.state = &pool.t, a.state_slots = &slots.t;
    lajit_ctx *ctx = fake_ctx(LAJIT_CTX_CHECKED);
    set_ints(&slots, (const int32_t[]){0, P, 1}, ROWS);
    REFUSED(ctx, call_decode, &a, "slot 4 of row 1 is outside [0, 4)");
    set_ints(&slots, (const int32_t[]){0, 1, LAJIT_SLOT_FRESH(P)}, ROWS);
    REFUSED(ctx, call_decode, &a, "slot 4 of row 2 (a fresh index, LAJIT_SLOT_FRESH) is outside");
    set_ints(&slots, (const int32_t[]){0, 1, LAJIT_SLOT_FRESH(1)}, ROWS);
    REFUSED(ctx, call_decode, &a, "slot 1 is used by two rows");
    set_ints(&slots, (const int32_t[]){LAJIT_SLOT_FRESH(0), 1, -1}, ROWS);
    LAUNCHED(ctx, call_decode, &a);
    set_ints(&slots, (const int32_t[]){2, 2, -1}, ROWS);
    REFUSED(ctx, call_decode, &a, "slot 2 is used by two rows");
    set_ints(&slots, (const int32_t[]){-1, 3, -1}, ROWS);
    LAUNCHED(ctx, call_decode, &a);
    set_ints(&slots, (const int32_t[]){3, 0, 2}, ROWS);
    check_decay_rates(ctx, call_decode, &a, &s);
    /* Without slots row b uses slot b: nothing device-side to check but s. */
    a.state_slots = NULL;
    LAUNCHED(ctx, call_decode, &a);
    /* Not checked: the same duplicate slots launch. */
    lajit_ctx *fast = fake_ctx(0);
    a.state_slots = &slots.t;
    set_ints(&slots, (const int32_t[]){2, 2, -1}, ROWS);
    LAUNCHED(fast, call_decode, &a);
    lajit_ctx_destroy(fast);
    lajit_ctx_destroy(ctx);
    close_fake();
}
