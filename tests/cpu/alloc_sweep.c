/* alloc_sweep.c — every host allocation of an op's first call made to fail in turn, through the
 * fake driver (tests/support/op_sweep.h): the backward with ds and every state, the backward
 * without ds (bf16, the sm90 family's scans), the backward's ds by segments over two long rows
 * (bwd_segments.c, the default at few heads), decode with pool slots and per-step states, and
 * the varlen forward with a state pool. Each failure must end in LAJIT_ERR_OUT_OF_MEMORY with a
 * message (or be recovered from), the same call in the same context must then succeed with the
 * reference launches, and every driver resource must be given back; the ASan build adds that no
 * host memory leaks. launch_path.c sweeps the plain forward the same way (one shot per fresh
 * context); these also check the context after the failure. The backward and varlen sweeps
 * inject an even sample of their sites (thousands, most of them Lua allocations that Lua's
 * emergency collection recovers from) to keep the suite fast; LAJIT_SWEEP_ALL=1 injects all. */
#include "test.h"

#include "op_sweep.h"

enum { B = 2, H = 3, N = 5, D = 32, E = 16 };

static DLDataType f32(void)
{
    return lj_test_dl_dtype(LJ_F32);
}

/* ---- Backward ------------------------------------------------------------------------------- */

/* Float32 [B,H,N,D|E] with decay, ds, S_0, dS_N and dS_0 (four launches: dq, dv, dk, ds). */
static void build_bwd_full(sweep_fixture *x)
{
    int64_t qs[4] = {B, H, N, D}, vs[4] = {B, H, N, E}, st[4] = {B, H, D, E}, hs[1] = {H};
    lajit_attn_bwd_args *a = &x->bwd;
    memset(a, 0, sizeof *a);
    a->struct_size = sizeof *a;
    a->q = sweep_buffer(x, 4, qs, f32());
    a->k = sweep_buffer(x, 4, qs, f32());
    a->v = sweep_buffer(x, 4, vs, f32());
    a->dout = sweep_buffer(x, 4, vs, f32());
    a->dq = sweep_buffer(x, 4, qs, f32());
    a->dk = sweep_buffer(x, 4, qs, f32());
    a->dv = sweep_buffer(x, 4, vs, f32());
    a->s = sweep_buffer(x, 1, hs, f32());
    a->ds = sweep_buffer(x, 1, hs, f32());
    a->initial_state = sweep_buffer(x, 4, st, f32());
    a->d_final_state = sweep_buffer(x, 4, st, f32());
    a->d_initial_state = sweep_buffer(x, 4, st, f32());
    a->scale = 0.5f;
}

/* bf16 [b,h,n,64] with decay and S_0; with ds also ds and dS_N. */
static void build_bwd_bf16(sweep_fixture *x, int64_t b, int64_t h, int64_t n, int ds)
{
    int64_t qs[4] = {b, h, n, 64}, st[4] = {b, h, 64, 64}, hs[1] = {h};
    DLDataType bf = lj_test_dl_dtype(LJ_BF16);
    lajit_attn_bwd_args *a = &x->bwd;
    memset(a, 0, sizeof *a);
    a->struct_size = sizeof *a;
    a->q = sweep_buffer(x, 4, qs, bf);
    a->k = sweep_buffer(x, 4, qs, bf);
    a->v = sweep_buffer(x, 4, qs, bf);
    a->dout = sweep_buffer(x, 4, qs, bf);
    a->dq = sweep_buffer(x, 4, qs, bf);
    a->dk = sweep_buffer(x, 4, qs, bf);
    a->dv = sweep_buffer(x, 4, qs, bf);
    a->s = sweep_buffer(x, 1, hs, f32());
    a->initial_state = sweep_buffer(x, 4, st, f32());
    if (ds) {
        a->ds = sweep_buffer(x, 1, hs, f32());
        a->d_final_state = sweep_buffer(x, 4, st, f32());
    }
    a->scale = 1.0f;
}

/* D = E = 64, decay and S_0 but no ds (three scans; la_bwd_sm90 on the fake sm_90). */
static void build_bwd_no_ds(sweep_fixture *x)
{
    build_bwd_bf16(x, B, H, N, 0);
}

/* B = 2, H = 1, N = 16384 with ds, S_0 and dS_N: few heads and long rows, so the automatic rule
 * takes ds by segments (bwd_segments.c: four a row, the rows in turn). */
static void build_bwd_segments(sweep_fixture *x)
{
    build_bwd_bf16(x, 2, 1, 16384, 1);
}

static lajit_status call_bwd(lajit_ctx *ctx, sweep_fixture *x)
{
    return lajit_attn_bwd(ctx, &x->bwd);
}

LJ_TEST(bwd_with_ds_and_states)
{
    sweep_require_nvrtc();
    sweep_case c = {.name = "bwd (ds, S_0, dS_N, dS_0; f32)",
                    .build = build_bwd_full,
                    .call = call_bwd,
                    .max_injections = 300};
    sweep_result r;
    sweep_run(&c, &r);
}

LJ_TEST(bwd_without_ds)
{
    sweep_require_nvrtc();
    sweep_case c = {.name = "bwd (no ds, S_0; bf16 D=64)",
                    .build = build_bwd_no_ds,
                    .call = call_bwd,
                    .max_injections = 300};
    sweep_result r;
    sweep_run(&c, &r);
}

LJ_TEST(bwd_ds_by_segments)
{
    sweep_require_nvrtc();
    sweep_case c = {.name = "bwd (ds by segments, two rows; bf16 D=64 N=16384)",
                    .build = build_bwd_segments,
                    .call = call_bwd,
                    .max_injections = 300};
    sweep_result r;
    sweep_run(&c, &r);
}

/* ---- Decode --------------------------------------------------------------------------------- */

enum { DB = 3, DT = 2, DP = 4 };

/* Float32 [B,T,H,D|E], T = 2 steps, decay, a pool of 4 slots addressed by state_slots and the
 * per-step states. */
static void build_decode(sweep_fixture *x)
{
    int64_t qs[4] = {DB, DT, H, D}, vs[4] = {DB, DT, H, E}, pool[4] = {DP, H, D, E};
    int64_t steps[5] = {DB, DT, H, D, E}, hs[1] = {H}, rows[1] = {DB};
    lajit_attn_decode_args *a = &x->dec;
    memset(a, 0, sizeof *a);
    a->struct_size = sizeof *a;
    a->q = sweep_buffer(x, 4, qs, f32());
    a->k = sweep_buffer(x, 4, qs, f32());
    a->v = sweep_buffer(x, 4, vs, f32());
    a->o = sweep_buffer(x, 4, vs, f32());
    a->s = sweep_buffer(x, 1, hs, f32());
    a->state = sweep_buffer(x, 4, pool, f32());
    a->state_slots = sweep_buffer(x, 1, rows, lj_test_dl_int32());
    a->step_states = sweep_buffer(x, 5, steps, f32());
    a->scale = 0.25f;
}

static lajit_status call_decode(lajit_ctx *ctx, sweep_fixture *x)
{
    return lajit_attn_decode(ctx, &x->dec);
}

LJ_TEST(decode_with_slots_and_step_states)
{
    sweep_require_nvrtc();
    sweep_case c = {
        .name = "decode (T=2, slots, step states)", .build = build_decode, .call = call_decode};
    sweep_result r;
    sweep_run(&c, &r);
}

/* ---- Varlen forward with a pool ------------------------------------------------------------- */

enum { VT = 9, VSEQ = 3, VP = 4 };

/* Packed [T,H,D|E] with cu_seqlens for 3 sequences, decay, and one pool [P,H,D,E] both read
 * (initial) and written (final) through state_slots. */
static void build_varlen(sweep_fixture *x)
{
    int64_t qs[3] = {VT, H, D}, vs[3] = {VT, H, E}, pool[4] = {VP, H, D, E}, hs[1] = {H};
    int64_t cu[1] = {VSEQ + 1}, slots[1] = {VSEQ};
    lajit_attn_fwd_args *a = &x->fwd;
    memset(a, 0, sizeof *a);
    a->struct_size = sizeof *a;
    a->q = sweep_buffer(x, 3, qs, f32());
    a->k = sweep_buffer(x, 3, qs, f32());
    a->v = sweep_buffer(x, 3, vs, f32());
    a->o = sweep_buffer(x, 3, vs, f32());
    a->s = sweep_buffer(x, 1, hs, f32());
    DLTensor *p = sweep_buffer(x, 4, pool, f32());
    a->initial_state = p;
    a->final_state = p;
    a->cu_seqlens = sweep_buffer(x, 1, cu, lj_test_dl_int32());
    a->state_slots = sweep_buffer(x, 1, slots, lj_test_dl_int32());
    a->scale = 1.0f;
}

static lajit_status call_fwd(lajit_ctx *ctx, sweep_fixture *x)
{
    return lajit_attn_fwd(ctx, &x->fwd);
}

LJ_TEST(varlen_fwd_with_pool)
{
    sweep_require_nvrtc();
    sweep_case c = {.name = "varlen fwd (3 sequences, pool in place)",
                    .build = build_varlen,
                    .call = call_fwd,
                    .max_injections = 600};
    sweep_result r;
    sweep_run(&c, &r);
}
