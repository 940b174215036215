/* serve_states.c — issue 23's serving formats on the GPU against the float64 reference: decode on
 * bf16 and f16 pools (T = 1 and T = 4, per-step states), varlen prefill on a 16-bit pool with
 * fresh slots (LAJIT_SLOT_FRESH: start from zero, write the slot), fp32 inputs with a bf16 output
 * (forward and decode), and the drift of 512 decode steps on a bf16 pool beside an fp32 pool.
 *
 * Tolerances. The kernels keep the state in fp32 for a whole call and round it to its storage once
 * when writing it (pool, final state, each per-step state). The reference starts from the stored
 * (already rounded) values, so the outputs o carry only the inputs' and o's own rounding: the
 * tolerance of DESIGN.md for the coarser of the two dtypes. A written state carries one rounding
 * to nearest on top: at most u·|x| per element (u = 2^-8 for bf16, 2^-11 for f16), so its relative
 * L2 error is at most u plus the fp32 path's; it is checked at the coarser of the inputs' tolerance
 * and the storage's (bf16 6e-3 > 2^-8 = 3.9e-3; f16 1e-3 > 2^-11 = 4.9e-4). A kernel that ignored
 * the state dtype (reading 16-bit data as float or the reverse) gives errors of order 1 or NaN;
 * one that read a fresh slot reads the NaN poison planted there. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_cases.h"
#include "gpu.h"
#include "la_ref.h"
#include "lajit.h"
#include "test.h"

static double tol2(lj_dtype a, lj_dtype b)
{
    double x = case_tolerance(a), y = case_tolerance(b);
    return x > y ? x : y;
}

/* A shared pseudo-random stream (independent of attn_cases' own). */
static unsigned rng = 1;
static float uni(float amp)
{
    rng = rng * 1664525u + 1013904223u;
    return amp * ((float)(rng >> 8) / 8388608.0f - 1.0f);
}
static void fill(float *x, size_t n, float amp, lj_dtype dt)
{
    for (size_t i = 0; i < n; i++)
        x[i] = lj_round_to(uni(amp), dt);
}

/* ---- Decode ----------------------------------------------------------------------------------- */

typedef struct dec_case {
    lj_dtype in, out, state;
    int B, H, D, E, T;
    int step_states;
    int fresh; /* row 0 starts fresh from a NaN-poisoned slot */
    unsigned seed;
} dec_case;

/* Rows: row 0 fresh (or normal), row 1 skipped (-1), the others slots in reverse order. The pool
 * has B + 2 slots: the last is named by nobody and must stay untouched. */
static void run_dec(const dec_case *c)
{
    lj_gpu_init();
    rng = c->seed;
    const int B = c->B, H = c->H, D = c->D, E = c->E, T = c->T, P = B + 2;
    const size_t DE = (size_t)D * E, nst = (size_t)P * H * DE;
    const size_t ssz = lj_test_dtype_size(c->state), isz = lj_test_dtype_size(c->in),
                 osz = lj_test_dtype_size(c->out);
    int slots[64], rows_slot[64]; /* rows_slot: the decoded slot a row writes (-1: skipped) */
    for (int b = 0; b < B; b++) {
        rows_slot[b] = B - 1 - b;
        slots[b] = rows_slot[b];
    }
    if (c->fresh)
        slots[0] = LAJIT_SLOT_FRESH(rows_slot[0]);
    slots[1] = -1;
    rows_slot[1] = -1;

    float *pool = malloc(nst * 4);
    fill(pool, nst, 1.0f, c->state); /* the stored values: the reference starts from these */
    if (c->fresh)
        for (size_t i = 0; i < (size_t)H * DE; i++)
            pool[(size_t)rows_slot[0] * H * DE + i] = NAN; /* reading it would poison the row */
    double *S = malloc(nst * sizeof(double));
    for (size_t i = 0; i < nst; i++)
        S[i] = pool[i];
    if (c->fresh)
        memset(S + (size_t)rows_slot[0] * H * DE, 0, (size_t)H * DE * sizeof(double));
    unsigned char *pool_bytes = malloc(nst * ssz), *pool_after = malloc(nst * ssz);
    lj_host_from_f32(pool_bytes, pool, nst, c->state);
    CUdeviceptr dpool = lj_gpu_alloc(nst * ssz);
    lj_gpu_upload(dpool, pool_bytes, nst * ssz);

    const size_t nq = (size_t)B * T * H * D, nv = (size_t)B * T * H * E;
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), s[64];
    fill(q, nq, 1.0f, c->in);
    fill(k, nq, 1.0f, c->in);
    fill(v, nv, 1.0f, c->in);
    for (int h = 0; h < H; h++)
        s[h] = h == 0 ? 0.0f : powf(2.0f, -8.0f * (float)h / (float)H);
    CUdeviceptr dq = lj_gpu_alloc(nq * isz), dk = lj_gpu_alloc(nq * isz),
                dv = lj_gpu_alloc(nv * isz), dout = lj_gpu_alloc(nv * osz),
                ds = lj_gpu_alloc((size_t)H * 4), dslots = lj_gpu_alloc((size_t)B * 4);
    lj_gpu_upload_as(dq, q, nq, c->in);
    lj_gpu_upload_as(dk, k, nq, c->in);
    lj_gpu_upload_as(dv, v, nv, c->in);
    lj_gpu_upload(ds, s, (size_t)H * 4);
    lj_gpu_upload(dslots, slots, (size_t)B * 4);
    lj_gpu_poison(dout, nv * osz);
    const size_t nsteps = (size_t)B * T * H * DE;
    CUdeviceptr dsteps = c->step_states ? lj_gpu_alloc(nsteps * ssz) : 0;
    if (dsteps)
        lj_gpu_poison(dsteps, nsteps * ssz);

    lj_test_tensor tq, tk, tv, to, tpool, tslots, ts, tsteps;
    int64_t qs[4] = {B, T, H, D}, vs[4] = {B, T, H, E}, ps[4] = {P, H, D, E}, sl[1] = {B},
            hs[1] = {H}, st[5] = {B, T, H, D, E};
    lajit_attn_decode_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = lj_gpu_tensor(&tq, dq, 0, 4, qs, NULL, lj_test_dl_dtype(c->in));
    a.k = lj_gpu_tensor(&tk, dk, 0, 4, qs, NULL, lj_test_dl_dtype(c->in));
    a.v = lj_gpu_tensor(&tv, dv, 0, 4, vs, NULL, lj_test_dl_dtype(c->in));
    a.o = lj_gpu_tensor(&to, dout, 0, 4, vs, NULL, lj_test_dl_dtype(c->out));
    a.s = lj_gpu_tensor(&ts, ds, 0, 1, hs, NULL, lj_test_dl_dtype(LJ_F32));
    a.state = lj_gpu_tensor(&tpool, dpool, 0, 4, ps, NULL, lj_test_dl_dtype(c->state));
    a.state_slots = lj_gpu_tensor(&tslots, dslots, 0, 1, sl, NULL, lj_test_dl_int32());
    if (dsteps)
        a.step_states = lj_gpu_tensor(&tsteps, dsteps, 0, 5, st, NULL, lj_test_dl_dtype(c->state));
    a.scale = 0.5f;
    lajit_ctx *ctx = case_open_ctx();
    lajit_status rs = lajit_attn_decode(ctx, &a);
    if (rs != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "decode: %s", lajit_errmsg(ctx));
    lj_gpu_sync();

    /* Reference: every row that runs, T steps from its (stored or zero) state. */
    double *ref_o = calloc(nv, sizeof(double)), *got_o = calloc(nv, sizeof(double));
    double *ref_steps = c->step_states ? calloc(nsteps, sizeof(double)) : NULL;
    float *o = malloc(nv * 4);
    lj_gpu_download_as(o, dout, nv, c->out);
    size_t orows = 0;
    for (int b = 0; b < B; b++) {
        if (rows_slot[b] < 0)
            continue;
        for (int h = 0; h < H; h++) {
            double *Sb = S + ((size_t)rows_slot[b] * H + h) * DE;
            for (int t = 0; t < T; t++) {
                double qd[256], kd[256], vd[256], od[256];
                size_t r = ((size_t)b * T + t) * H + h;
                for (int d = 0; d < D; d++)
                    qd[d] = q[r * D + d], kd[d] = k[r * D + d];
                for (int e = 0; e < E; e++)
                    vd[e] = v[r * E + e];
                la_ref_decode_step(D, E, Sb, qd, kd, vd, exp(-(double)s[h]), 0.5, od);
                for (int e = 0; e < E; e++) {
                    ref_o[orows * E + e] = od[e];
                    got_o[orows * E + e] = o[r * E + e];
                }
                if (ref_steps)
                    memcpy(ref_steps + r * DE, Sb, DE * sizeof(double));
                orows++;
            }
        }
    }
    double rel_o, rel_s = 0, rel_steps = 0;
    case_check("o", got_o, ref_o, orows, (size_t)E, tol2(c->in, c->out), &rel_o);

    /* The pool: written slots against the reference, the others byte for byte. */
    lj_gpu_download(pool_after, dpool, nst * ssz);
    float *pool_got = malloc(nst * 4);
    lj_host_to_f32(pool_got, pool_after, nst, c->state);
    for (int slot = 0; slot < P; slot++) {
        int written = 0;
        for (int b = 0; b < B; b++)
            written |= rows_slot[b] == slot;
        size_t off = (size_t)slot * H * DE;
        if (!written) {
            if (memcmp(pool_after + off * ssz, pool_bytes + off * ssz, (size_t)H * DE * ssz))
                lj_test_fail(__FILE__, __LINE__, "slot %d is named by no row but changed", slot);
            continue;
        }
        double *got = malloc((size_t)H * DE * sizeof(double));
        for (size_t i = 0; i < (size_t)H * DE; i++)
            got[i] = pool_got[off + i];
        char what[64];
        snprintf(what, sizeof what, "state of slot %d", slot);
        case_check(what, got, S + off, (size_t)H * D, (size_t)E, tol2(c->in, c->state), &rel_s);
        free(got);
    }
    if (ref_steps) {
        float *steps = malloc(nsteps * 4);
        double *got = malloc(nsteps * sizeof(double)), *ref = malloc(nsteps * sizeof(double));
        lj_gpu_download_as(steps, dsteps, nsteps, c->state);
        size_t n = 0; /* rows that ran; a skipped row's step states stay poisoned (untouched) */
        for (int b = 0; b < B; b++) {
            size_t per = (size_t)T * H * DE, off = (size_t)b * per;
            if (rows_slot[b] < 0) {
                for (size_t i = 0; i < per; i++)
                    if (!isnan(steps[off + i]))
                        lj_test_fail(__FILE__, __LINE__, "skipped row %d's step states written", b);
                continue;
            }
            for (size_t i = 0; i < per; i++, n++)
                got[n] = steps[off + i], ref[n] = ref_steps[off + i];
        }
        case_check("step_states", got, ref, n / (size_t)E, (size_t)E, tol2(c->in, c->state),
                   &rel_steps);
        free(steps);
        free(got);
        free(ref);
    }
    printf("decode in=%s out=%s state=%s T=%d%s%s: rel o %.2e, state %.2e, steps %.2e\n",
           lj_dtype_name(c->in), lj_dtype_name(c->out), lj_dtype_name(c->state), T,
           c->step_states ? " step_states" : "", c->fresh ? " fresh" : "", rel_o, rel_s, rel_steps);
    lajit_ctx_destroy(ctx);
    free(pool), free(S), free(pool_bytes), free(pool_after), free(pool_got), free(q), free(k);
    free(v), free(o), free(ref_o), free(got_o), free(ref_steps);
    lj_gpu_free(dq), lj_gpu_free(dk), lj_gpu_free(dv), lj_gpu_free(dout), lj_gpu_free(ds);
    lj_gpu_free(dslots), lj_gpu_free(dpool), lj_gpu_free(dsteps);
}

LJ_TEST(decode_bf16_pool_t1)
{
    dec_case c = {LJ_BF16, LJ_BF16, LJ_BF16, 6, 4, 128, 128, 1, 0, 1, 11};
    run_dec(&c);
}

/* B·H = 192, above the SM count's bucket: the large-batch tile (128 columns) without PACKED; the
 * case above (B·H = 24) runs the small batches' PACKED tile. */
LJ_TEST(decode_bf16_pool_t1_large_batch)
{
    dec_case c = {LJ_BF16, LJ_BF16, LJ_BF16, 6, 32, 128, 128, 1, 0, 1, 17};
    run_dec(&c);
}

/* B·H = 512, about four states per SM on a 132-SM GPU: one-warp CTAs of 16 packed rows per
 * thread (the default there). */
LJ_TEST(decode_bf16_pool_t1_four_states_per_sm)
{
    dec_case c = {LJ_BF16, LJ_BF16, LJ_BF16, 8, 64, 128, 128, 1, 0, 1, 18};
    run_dec(&c);
}

LJ_TEST(decode_f16_pool_t1_d_ne_e)
{
    dec_case c = {LJ_F16, LJ_F16, LJ_F16, 5, 3, 64, 192, 1, 0, 0, 12};
    run_dec(&c);
}

/* One step with its per-step state on 16-bit pools, at small B·H (the packed tiles): the step
 * state and the pool get the same rounded values. */
LJ_TEST(decode_bf16_pool_t1_step_states_fresh)
{
    dec_case c = {LJ_BF16, LJ_BF16, LJ_BF16, 5, 4, 128, 128, 1, 1, 1, 19};
    run_dec(&c);
}

LJ_TEST(decode_f16_pool_t1_step_states_d_ne_e)
{
    dec_case c = {LJ_F16, LJ_F16, LJ_F16, 3, 4, 64, 96, 1, 1, 0, 20};
    run_dec(&c);
}

LJ_TEST(decode_bf16_pool_t4_step_states)
{
    dec_case c = {LJ_BF16, LJ_BF16, LJ_BF16, 4, 4, 64, 128, 4, 1, 1, 13};
    run_dec(&c);
}

LJ_TEST(decode_f16_pool_t4_step_states)
{
    dec_case c = {LJ_F16, LJ_F16, LJ_F16, 4, 2, 96, 48, 4, 1, 1, 14};
    run_dec(&c);
}

LJ_TEST(decode_f32_in_bf16_out)
{
    dec_case c = {LJ_F32, LJ_BF16, LJ_F32, 6, 4, 128, 128, 1, 0, 1, 15};
    run_dec(&c);
}

LJ_TEST(decode_f32_in_bf16_out_bf16_pool)
{
    dec_case c = {LJ_F32, LJ_BF16, LJ_BF16, 6, 4, 128, 128, 2, 1, 1, 16};
    run_dec(&c);
}

/* ---- Forward ---------------------------------------------------------------------------------- */

/* Varlen prefill over a pool of `state` storage: sequence 0 fresh (its slot NaN-poisoned), 1
 * skipped (-1), the others read and write their slots; or dense [B,H,N] with no states when
 * nseq = 0 (the mixed-output case). */
typedef struct fwd_serve {
    const char *family;
    lj_dtype in, out, state;
    int H, D, E;
    int nseq, lens[8]; /* varlen with a pool; 0: dense B = 2, N = lens[0], no states */
    unsigned seed;
} fwd_serve;

static void run_fwd(const fwd_serve *c)
{
    lj_gpu_init();
    rng = c->seed;
    const int H = c->H, D = c->D, E = c->E, varlen = c->nseq > 0;
    const int nseq = varlen ? c->nseq : 2, P = nseq + 1;
    int cu[9] = {0};
    for (int i = 0; i < nseq; i++)
        cu[i + 1] = cu[i] + (varlen ? c->lens[i] : c->lens[0]);
    const int Tt = cu[nseq]; /* tokens in all */
    const size_t DE = (size_t)D * E, nst = (size_t)P * H * DE;
    const size_t isz = lj_test_dtype_size(c->in), osz = lj_test_dtype_size(c->out),
                 ssz = lj_test_dtype_size(c->state);
    /* Token-major [T, H, D] (varlen) or [B, H, N, D] (dense): index helpers below. */
    const size_t nq = (size_t)Tt * H * D, nv = (size_t)Tt * H * E;
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), s[64];
    /* Scaled so outputs stay O(1) whatever the length (fp16 range; DESIGN.md). */
    fill(q, nq, 0.25f, c->in);
    fill(k, nq, 0.25f, c->in);
    fill(v, nv, 1.0f, c->in);
    for (int h = 0; h < H; h++)
        s[h] = h == 0 ? 0.0f : powf(2.0f, -8.0f * (float)h / (float)H);
    int slots[8], wslot[8], rslot[8];
    for (int i = 0; i < nseq; i++)
        slots[i] = wslot[i] = rslot[i] = nseq - 1 - i;
    if (varlen) {
        slots[0] = LAJIT_SLOT_FRESH(wslot[0]);
        rslot[0] = -1;
        if (nseq > 1)
            slots[1] = wslot[1] = rslot[1] = -1;
    }
    float *pool = malloc(nst * 4);
    fill(pool, nst, 1.0f, c->state);
    if (varlen)
        for (size_t i = 0; i < (size_t)H * DE; i++)
            pool[(size_t)wslot[0] * H * DE + i] = NAN;
    unsigned char *pool_bytes = malloc(nst * ssz), *pool_after = malloc(nst * ssz);
    lj_host_from_f32(pool_bytes, pool, nst, c->state);

    CUdeviceptr dq = lj_gpu_alloc(nq * isz), dk = lj_gpu_alloc(nq * isz),
                dv = lj_gpu_alloc(nv * isz), dout = lj_gpu_alloc(nv * osz),
                ds = lj_gpu_alloc((size_t)H * 4), dcu = lj_gpu_alloc(sizeof cu),
                dslots = lj_gpu_alloc(sizeof slots), dpool = lj_gpu_alloc(nst * ssz);
    lj_gpu_upload_as(dq, q, nq, c->in);
    lj_gpu_upload_as(dk, k, nq, c->in);
    lj_gpu_upload_as(dv, v, nv, c->in);
    lj_gpu_upload(ds, s, (size_t)H * 4);
    lj_gpu_upload(dcu, cu, sizeof cu);
    lj_gpu_upload(dslots, slots, sizeof slots);
    lj_gpu_upload(dpool, pool_bytes, nst * ssz);
    lj_gpu_poison(dout, nv * osz);

    lj_test_tensor tq, tk, tv, to, ts, tcu, tsl, tpool;
    lajit_attn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.family = c->family;
    a.scale = 1.0f;
    int64_t hs[1] = {H}, cs[1] = {nseq + 1}, ss[1] = {nseq}, ps[4] = {P, H, D, E};
    a.s = lj_gpu_tensor(&ts, ds, 0, 1, hs, NULL, lj_test_dl_dtype(LJ_F32));
    if (varlen) {
        int64_t qs[3] = {Tt, H, D}, vs[3] = {Tt, H, E};
        a.q = lj_gpu_tensor(&tq, dq, 0, 3, qs, NULL, lj_test_dl_dtype(c->in));
        a.k = lj_gpu_tensor(&tk, dk, 0, 3, qs, NULL, lj_test_dl_dtype(c->in));
        a.v = lj_gpu_tensor(&tv, dv, 0, 3, vs, NULL, lj_test_dl_dtype(c->in));
        a.o = lj_gpu_tensor(&to, dout, 0, 3, vs, NULL, lj_test_dl_dtype(c->out));
        a.cu_seqlens = lj_gpu_tensor(&tcu, dcu, 0, 1, cs, NULL, lj_test_dl_int32());
        a.state_slots = lj_gpu_tensor(&tsl, dslots, 0, 1, ss, NULL, lj_test_dl_int32());
        a.initial_state = a.final_state =
            lj_gpu_tensor(&tpool, dpool, 0, 4, ps, NULL, lj_test_dl_dtype(c->state));
    } else {
        /* Dense [B, N, H, D] memory (token-major like the varlen buffers) as [B, H, N, D]. */
        const int N = c->lens[0];
        int64_t qs[4] = {nseq, H, N, D}, vs[4] = {nseq, H, N, E};
        int64_t qst[4] = {(int64_t)N * H * D, D, (int64_t)H * D, 1},
                vst[4] = {(int64_t)N * H * E, E, (int64_t)H * E, 1};
        a.q = lj_gpu_tensor(&tq, dq, 0, 4, qs, qst, lj_test_dl_dtype(c->in));
        a.k = lj_gpu_tensor(&tk, dk, 0, 4, qs, qst, lj_test_dl_dtype(c->in));
        a.v = lj_gpu_tensor(&tv, dv, 0, 4, vs, vst, lj_test_dl_dtype(c->in));
        a.o = lj_gpu_tensor(&to, dout, 0, 4, vs, vst, lj_test_dl_dtype(c->out));
    }
    lajit_ctx *ctx = case_open_ctx();
    if (lajit_attn_fwd(ctx, &a) != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "fwd: %s", lajit_errmsg(ctx));
    lj_gpu_sync();

    float *o = malloc(nv * 4), *pool_got = malloc(nst * 4);
    lj_gpu_download_as(o, dout, nv, c->out);
    lj_gpu_download(pool_after, dpool, nst * ssz);
    lj_host_to_f32(pool_got, pool_after, nst, c->state);
    double *ref_o = calloc(nv, sizeof(double)), *got_o = calloc(nv, sizeof(double));
    double rel_o = 0, rel_s = 0;
    size_t rows = 0;
    for (int i = 0; i < nseq; i++) {
        int n = cu[i + 1] - cu[i];
        for (int h = 0; h < H; h++) {
            double *qd = malloc((size_t)(n + 1) * D * 8), *kd = malloc((size_t)(n + 1) * D * 8),
                   *vd = malloc((size_t)(n + 1) * E * 8), *od = malloc((size_t)(n + 1) * E * 8),
                   *S0 = malloc(DE * 8), *SN = malloc(DE * 8), *got = malloc(DE * 8);
            for (int t = 0; t < n; t++) {
                size_t r = (size_t)(cu[i] + t) * H + h;
                for (int d = 0; d < D; d++)
                    qd[(size_t)t * D + d] = q[r * D + d], kd[(size_t)t * D + d] = k[r * D + d];
                for (int e = 0; e < E; e++)
                    vd[(size_t)t * E + e] = v[r * E + e];
            }
            if (varlen && rslot[i] >= 0)
                for (size_t x = 0; x < DE; x++)
                    S0[x] = pool[((size_t)rslot[i] * H + h) * DE + x];
            la_ref_forward(n, D, E, qd, kd, vd, exp(-(double)s[h]), 1.0,
                           varlen && rslot[i] >= 0 ? S0 : NULL, od, SN);
            for (int t = 0; t < n; t++, rows++)
                for (int e = 0; e < E; e++) {
                    ref_o[rows * E + e] = od[(size_t)t * E + e];
                    got_o[rows * E + e] = o[((size_t)(cu[i] + t) * H + h) * E + e];
                }
            if (varlen && wslot[i] >= 0) {
                for (size_t x = 0; x < DE; x++)
                    got[x] = pool_got[((size_t)wslot[i] * H + h) * DE + x];
                char what[64];
                snprintf(what, sizeof what, "final state of sequence %d head %d", i, h);
                case_check(what, got, SN, (size_t)D, (size_t)E, tol2(c->in, c->state), &rel_s);
            }
            free(qd), free(kd), free(vd), free(od), free(S0), free(SN), free(got);
        }
    }
    case_check("o", got_o, ref_o, rows, (size_t)E, tol2(c->in, c->out), &rel_o);
    /* Slots nobody writes (the skipped sequence's, the spare one) stay as they were. */
    for (int slot = 0; varlen && slot < P; slot++) {
        int written = 0;
        for (int i = 0; i < nseq; i++)
            written |= wslot[i] == slot;
        size_t off = (size_t)slot * H * DE * ssz;
        if (!written && memcmp(pool_after + off, pool_bytes + off, (size_t)H * DE * ssz))
            lj_test_fail(__FILE__, __LINE__, "slot %d is written by no sequence but changed", slot);
    }
    printf("fwd %s in=%s out=%s state=%s%s: rel o %.2e, last state %.2e\n",
           c->family ? c->family : "(default)", lj_dtype_name(c->in), lj_dtype_name(c->out),
           lj_dtype_name(c->state), varlen ? " varlen fresh" : "", rel_o, rel_s);
    lajit_ctx_destroy(ctx);
    free(q), free(k), free(v), free(o), free(pool), free(pool_got), free(pool_bytes);
    free(pool_after), free(ref_o), free(got_o);
    lj_gpu_free(dq), lj_gpu_free(dk), lj_gpu_free(dv), lj_gpu_free(dout), lj_gpu_free(ds);
    lj_gpu_free(dcu), lj_gpu_free(dslots), lj_gpu_free(dpool);
}

LJ_TEST(prefill_varlen_bf16_pool_fresh_default)
{
    fwd_serve c = {NULL, LJ_BF16, LJ_BF16, LJ_BF16, 4, 128, 128, 4, {70, 33, 129, 1}, 21};
    run_fwd(&c);
}

LJ_TEST(prefill_varlen_f16_pool_fresh_la_fwd)
{
    fwd_serve c = {"la_fwd", LJ_F16, LJ_F16, LJ_F16, 3, 64, 96, 3, {65, 2, 200}, 22};
    run_fwd(&c);
}

LJ_TEST(prefill_varlen_bf16_pool_f32_inputs_la_fwd)
{
    fwd_serve c = {"la_fwd", LJ_F32, LJ_F32, LJ_BF16, 2, 64, 64, 3, {100, 7, 64}, 23};
    run_fwd(&c);
}

LJ_TEST(prefill_varlen_bf16_pool_la_recurrent)
{
    fwd_serve c = {"la_recurrent", LJ_BF16, LJ_BF16, LJ_BF16, 2, 64, 64, 3, {31, 4, 50}, 24};
    run_fwd(&c);
}

LJ_TEST(fwd_f32_in_bf16_out)
{
    fwd_serve c = {NULL, LJ_F32, LJ_BF16, LJ_F32, 4, 128, 128, 0, {913}, 25};
    run_fwd(&c);
}

LJ_TEST(fwd_bf16_in_f32_out)
{
    fwd_serve c = {NULL, LJ_BF16, LJ_F32, LJ_F32, 4, 64, 64, 0, {257}, 26};
    run_fwd(&c);
}

/* ---- Drift ------------------------------------------------------------------------------------ */

/* 512 decode steps (T = 1 each) on a bf16 pool and on an fp32 pool from the same zero start and
 * the same fp32 inputs, both against float64. The fp32 pool carries only fp32 arithmetic. The
 * bf16 pool is rounded once per step: a fresh error of at most u = 2^-8 of each element, the steps'
 * errors independent, decayed by λ ≤ 1 afterwards; they add like a random walk, so after N steps
 * the relative error of the state stays below u·√N (= 0.088 at N = 512; less where λ < 1 forgets
 * old errors or the state grows, which shrinks the older errors' share). o inherits it. The test
 * asserts that bound for the bf16 pool, 1e-4 for the fp32 pool (512 fp32 steps: ~1e-5 seen in
 * la_decode's thousand-step test at the same shape class), and prints both. */
LJ_TEST(drift_512_steps_bf16_vs_f32_pool)
{
    lj_gpu_init();
    rng = 31;
    enum { Bn = 2, Hn = 4, Dn = 64, En = 64, STEPS = 512 };
    const size_t DE = (size_t)Dn * En, nst = (size_t)Bn * Hn * DE;
    const size_t nq = (size_t)Bn * Hn * Dn, nv = (size_t)Bn * Hn * En;
    float s[Hn];
    for (int h = 0; h < Hn; h++)
        s[h] = h == 0 ? 0.0f : powf(2.0f, -8.0f * (float)h / (float)Hn);
    CUdeviceptr pool32 = lj_gpu_alloc(nst * 4), pool16 = lj_gpu_alloc(nst * 2),
                dq = lj_gpu_alloc(nq * 4), dk = lj_gpu_alloc(nq * 4), dv = lj_gpu_alloc(nv * 4),
                o32 = lj_gpu_alloc(nv * 4), o16 = lj_gpu_alloc(nv * 4), ds = lj_gpu_alloc(Hn * 4);
    lj_gpu_memset(pool32, 0, nst * 4);
    lj_gpu_memset(pool16, 0, nst * 2);
    lj_gpu_upload(ds, s, sizeof s);
    double *S = calloc(nst, sizeof(double));
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), *g32 = malloc(nv * 4),
          *g16 = malloc(nv * 4);
    double *ref_o = malloc(nv * sizeof(double)), *go32 = malloc(nv * sizeof(double)),
           *go16 = malloc(nv * sizeof(double));
    lj_test_tensor tq, tk, tv, to32, to16, tp32, tp16, ts;
    int64_t qs[3] = {Bn, Hn, Dn}, vs[3] = {Bn, Hn, En}, ps[4] = {Bn, Hn, Dn, En}, hs[1] = {Hn};
    lajit_attn_decode_args a32, a16;
    memset(&a32, 0, sizeof a32);
    a32.struct_size = sizeof a32;
    a32.q = lj_gpu_tensor(&tq, dq, 0, 3, qs, NULL, lj_test_dl_dtype(LJ_F32));
    a32.k = lj_gpu_tensor(&tk, dk, 0, 3, qs, NULL, lj_test_dl_dtype(LJ_F32));
    a32.v = lj_gpu_tensor(&tv, dv, 0, 3, vs, NULL, lj_test_dl_dtype(LJ_F32));
    a32.s = lj_gpu_tensor(&ts, ds, 0, 1, hs, NULL, lj_test_dl_dtype(LJ_F32));
    a32.scale = 1.0f;
    a16 = a32;
    a32.o = lj_gpu_tensor(&to32, o32, 0, 3, vs, NULL, lj_test_dl_dtype(LJ_F32));
    a16.o = lj_gpu_tensor(&to16, o16, 0, 3, vs, NULL, lj_test_dl_dtype(LJ_F32));
    a32.state = lj_gpu_tensor(&tp32, pool32, 0, 4, ps, NULL, lj_test_dl_dtype(LJ_F32));
    a16.state = lj_gpu_tensor(&tp16, pool16, 0, 4, ps, NULL, lj_test_dl_dtype(LJ_BF16));
    lajit_ctx *ctx = case_open_ctx();
    double rel_o32 = 0, rel_o16 = 0;
    for (int step = 0; step < STEPS; step++) {
        fill(q, nq, 0.25f, LJ_F32);
        fill(k, nq, 0.25f, LJ_F32);
        fill(v, nv, 1.0f, LJ_F32);
        lj_gpu_upload(dq, q, nq * 4);
        lj_gpu_upload(dk, k, nq * 4);
        lj_gpu_upload(dv, v, nv * 4);
        ASSERT_OK(lajit_attn_decode(ctx, &a32));
        ASSERT_OK(lajit_attn_decode(ctx, &a16));
        for (int r = 0; r < Bn * Hn; r++) {
            double qd[Dn], kd[Dn], vd[En];
            for (int d = 0; d < Dn; d++)
                qd[d] = q[(size_t)r * Dn + d], kd[d] = k[(size_t)r * Dn + d];
            for (int e = 0; e < En; e++)
                vd[e] = v[(size_t)r * En + e];
            la_ref_decode_step(Dn, En, S + (size_t)r * DE, qd, kd, vd, exp(-(double)s[r % Hn]), 1.0,
                               ref_o + (size_t)r * En);
        }
        if (step == STEPS - 1) {
            lj_gpu_sync();
            lj_gpu_download(g32, o32, nv * 4);
            lj_gpu_download(g16, o16, nv * 4);
            for (size_t i = 0; i < nv; i++)
                go32[i] = g32[i], go16[i] = g16[i];
        }
    }
    lj_gpu_sync();
    float *st32 = malloc(nst * 4), *st16 = malloc(nst * 4);
    lj_gpu_download(st32, pool32, nst * 4);
    lj_gpu_download_as(st16, pool16, nst, LJ_BF16);
    double *gs32 = malloc(nst * sizeof(double)), *gs16 = malloc(nst * sizeof(double));
    for (size_t i = 0; i < nst; i++)
        gs32[i] = st32[i], gs16[i] = st16[i];
    const double bound16 = ldexp(1.0, -8) * sqrt((double)STEPS);
    double rel_s32, rel_s16;
    case_check("fp32 pool state", gs32, S, (size_t)Bn * Hn * Dn, En, 1e-4, &rel_s32);
    case_check("fp32 pool o", go32, ref_o, (size_t)Bn * Hn, En, 1e-4, &rel_o32);
    case_check("bf16 pool state", gs16, S, (size_t)Bn * Hn * Dn, En, bound16, &rel_s16);
    case_check("bf16 pool o", go16, ref_o, (size_t)Bn * Hn, En, bound16, &rel_o16);
    printf("drift after %d decode steps (relative L2 against float64): fp32 pool state %.3e o "
           "%.3e; bf16 pool state %.3e o %.3e (bound u*sqrt(N) = %.3e)\n",
           STEPS, rel_s32, rel_o32, rel_s16, rel_o16, bound16);
    /* The bf16 pool must really have been rounded: at least one bf16 ulp of drift. */
    ASSERT_TRUE(rel_s16 > rel_s32);
    lajit_ctx_destroy(ctx);
    free(S), free(q), free(k), free(v), free(g32), free(g16), free(ref_o), free(go32);
    free(go16), free(st32), free(st16), free(gs32), free(gs16);
    lj_gpu_free(pool32), lj_gpu_free(pool16), lj_gpu_free(dq), lj_gpu_free(dk);
    lj_gpu_free(dv), lj_gpu_free(o32), lj_gpu_free(o16), lj_gpu_free(ds);
}
