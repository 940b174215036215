/* building_blocks.c — issue 16's building blocks on the GPU, composed as a multi-GPU split would
 * compose them, against the float64 reference of the whole sequence.
 *
 * One sequence (B = 1, H = 2, head 0 with s = 0 and head 1 with s = 0.05, D = E = 64, N = 3001)
 * is cut into P spans of uneven lengths (a span of 1 token and an empty one among them). For each
 * span lajit_attn_fwd with o = NULL and q = NULL writes the span's local state M_j (its final
 * state from zero) into slot j of a [P, B, H, D, E] float32 buffer; lajit_attn_state_scan turns
 * them and the lengths (int32 [P] on the device) and S_0 into each span's incoming state and S_N;
 * lajit_attn_fwd then runs each span from its incoming state, writing that span's rows of o.
 * Every row of o and S_N must match la_ref_forward over the whole sequence within the tolerances
 * of tests/support/attn_cases.c (case_tolerance). Outputs are NaN-poisoned first. An empty span
 * calls nothing: its local state is zero (set here), and the scan must pass its carry through.
 * Cases: bf16 on the default family (la_fwd_sm90 on sm_90a) with P = 1, 3, 5, bf16 forced to
 * la_fwd, and f32 (la_fwd's tf32 path). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_cases.h"
#include "gpu.h"
#include "la_ref.h"
#include "test.h"

#define H    2
#define D    64
#define E    64
#define MAXP 8

typedef struct blocks_case {
    const char *family; /* NULL: the default forward family */
    lj_dtype dtype;
    int P;
    int lens[MAXP]; /* span lengths, summing to N */
    unsigned seed;
} blocks_case;

static const float rates[H] = {0.0f, 0.05f};

static void run_blocks_case(const blocks_case *c)
{
    lj_gpu_init();
    case_seed(c->seed);
    const lj_dtype dt = c->dtype;
    const int P = c->P;
    const size_t esz = lj_test_dtype_size(dt), DE = (size_t)D * E, HDE = (size_t)H * DE;
    int N = 0, start[MAXP];
    for (int j = 0; j < P; j++) {
        start[j] = N;
        N += c->lens[j];
    }
    const size_t nq = (size_t)H * N * D, nv = (size_t)H * N * E;

    /* Inputs [1, H, N, X] (logical = memory order), S_0 [1, H, D, E]. */
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), *s0 = malloc(HDE * 4);
    case_random_fill(q, nq, 0.5f, dt);
    case_random_fill(k, nq, 0.5f, dt);
    case_random_fill(v, nv, 0.5f, dt);
    case_random_fill(s0, HDE, 1.0f, LJ_F32);
    CUdeviceptr dq = lj_gpu_alloc(nq * esz), dk = lj_gpu_alloc(nq * esz);
    CUdeviceptr dv = lj_gpu_alloc(nv * esz), dout = lj_gpu_alloc(nv * esz);
    CUdeviceptr ds = lj_gpu_alloc(H * 4), ds0 = lj_gpu_alloc(HDE * 4), dsn = lj_gpu_alloc(HDE * 4);
    CUdeviceptr dloc = lj_gpu_alloc((size_t)P * HDE * 4), dinc = lj_gpu_alloc((size_t)P * HDE * 4);
    CUdeviceptr dlen = lj_gpu_alloc((size_t)P * 4);
    lj_gpu_upload_as(dq, q, nq, dt);
    lj_gpu_upload_as(dk, k, nq, dt);
    lj_gpu_upload_as(dv, v, nv, dt);
    lj_gpu_upload(ds, rates, H * 4);
    lj_gpu_upload(ds0, s0, HDE * 4);
    lj_gpu_upload(dlen, c->lens, (size_t)P * 4);
    lj_gpu_poison(dout, nv * esz);
    lj_gpu_poison(dsn, HDE * 4);
    lj_gpu_poison(dloc, (size_t)P * HDE * 4);
    lj_gpu_poison(dinc, (size_t)P * HDE * 4);

    lajit_ctx *ctx = case_open_ctx();
    const DLDataType dl = lj_test_dl_dtype(dt), f32 = lj_test_dl_dtype(LJ_F32);
    const int64_t hshape[1] = {H}, stshape[4] = {1, H, D, E}, all[5] = {P, 1, H, D, E};
    const int64_t lshape[1] = {P};
    lj_test_tensor ts, tk, tv, tq, to, tst, tin;
    lj_gpu_tensor(&ts, ds, 0, 1, hshape, NULL, f32);

    /* 1. Each span's local state M_j: o = NULL, q = NULL. An empty span's is zero. */
    for (int j = 0; j < P; j++) {
        const int n = c->lens[j];
        if (n == 0) {
            lj_gpu_memset(dloc + (CUdeviceptr)j * HDE * 4, 0, HDE * 4);
            continue;
        }
        const int64_t qshape[4] = {1, H, n, D}, vshape[4] = {1, H, n, E};
        const int64_t qstr[4] = {(int64_t)H * N * D, (int64_t)N * D, D, 1};
        const int64_t vstr[4] = {(int64_t)H * N * E, (int64_t)N * E, E, 1};
        lajit_attn_fwd_args a;
        memset(&a, 0, sizeof a);
        a.struct_size = sizeof a;
        a.k = lj_gpu_tensor(&tk, dk, (uint64_t)start[j] * D * esz, 4, qshape, qstr, dl);
        a.v = lj_gpu_tensor(&tv, dv, (uint64_t)start[j] * E * esz, 4, vshape, vstr, dl);
        a.s = &ts.t;
        a.scale = 1.0f;
        a.final_state = lj_gpu_tensor(&tst, dloc, (uint64_t)j * HDE * 4, 4, stshape, NULL, f32);
        a.family = c->family;
        lajit_status st = lajit_attn_fwd(ctx, &a);
        if (st != LAJIT_OK)
            lj_test_fail(__FILE__, __LINE__, "lajit_attn_fwd (state only, span %d): %s: %s", j,
                         lajit_status_string(st), lajit_errmsg(ctx));
    }

    /* 2. The scan: incoming states and S_N. */
    {
        lj_test_tensor tl, tlen, t0, tn;
        lajit_attn_state_scan_args a;
        memset(&a, 0, sizeof a);
        a.struct_size = sizeof a;
        a.local_states = lj_gpu_tensor(&tl, dloc, 0, 5, all, NULL, f32);
        a.incoming_states = lj_gpu_tensor(&tin, dinc, 0, 5, all, NULL, f32);
        a.lengths = lj_gpu_tensor(&tlen, dlen, 0, 1, lshape, NULL, lj_test_dl_int32());
        a.s = &ts.t;
        a.initial_state = lj_gpu_tensor(&t0, ds0, 0, 4, stshape, NULL, f32);
        a.final_state = lj_gpu_tensor(&tn, dsn, 0, 4, stshape, NULL, f32);
        lajit_status st = lajit_attn_state_scan(ctx, &a);
        if (st != LAJIT_OK)
            lj_test_fail(__FILE__, __LINE__, "lajit_attn_state_scan: %s: %s",
                         lajit_status_string(st), lajit_errmsg(ctx));
    }

    /* 3. Each span's o from its incoming state. */
    for (int j = 0; j < P; j++) {
        const int n = c->lens[j];
        if (n == 0)
            continue;
        const int64_t qshape[4] = {1, H, n, D}, vshape[4] = {1, H, n, E};
        const int64_t qstr[4] = {(int64_t)H * N * D, (int64_t)N * D, D, 1};
        const int64_t vstr[4] = {(int64_t)H * N * E, (int64_t)N * E, E, 1};
        lajit_attn_fwd_args a;
        memset(&a, 0, sizeof a);
        a.struct_size = sizeof a;
        a.q = lj_gpu_tensor(&tq, dq, (uint64_t)start[j] * D * esz, 4, qshape, qstr, dl);
        a.k = lj_gpu_tensor(&tk, dk, (uint64_t)start[j] * D * esz, 4, qshape, qstr, dl);
        a.v = lj_gpu_tensor(&tv, dv, (uint64_t)start[j] * E * esz, 4, vshape, vstr, dl);
        a.o = lj_gpu_tensor(&to, dout, (uint64_t)start[j] * E * esz, 4, vshape, vstr, dl);
        a.s = &ts.t;
        a.scale = 1.0f;
        a.initial_state = lj_gpu_tensor(&tst, dinc, (uint64_t)j * HDE * 4, 4, stshape, NULL, f32);
        a.family = c->family;
        lajit_status st = lajit_attn_fwd(ctx, &a);
        if (st != LAJIT_OK)
            lj_test_fail(__FILE__, __LINE__, "lajit_attn_fwd (span %d): %s: %s", j,
                         lajit_status_string(st), lajit_errmsg(ctx));
    }
    lj_gpu_sync();

    /* The whole sequence in float64. */
    float *mo = malloc(nv * 4), *msn = malloc(HDE * 4);
    lj_gpu_download_as(mo, dout, nv, dt);
    lj_gpu_download(msn, dsn, HDE * 4);
    double *ref_o = malloc(nv * 8), *got_o = malloc(nv * 8);
    double *ref_sn = malloc(HDE * 8), *got_sn = malloc(HDE * 8);
    double *bq = malloc((size_t)N * D * 8), *bk = malloc((size_t)N * D * 8);
    double *bv = malloc((size_t)N * E * 8), *bs0 = malloc(DE * 8);
    for (int h = 0; h < H; h++) {
        for (size_t i = 0; i < (size_t)N * D; i++) {
            bq[i] = q[(size_t)h * N * D + i];
            bk[i] = k[(size_t)h * N * D + i];
        }
        for (size_t i = 0; i < (size_t)N * E; i++)
            bv[i] = v[(size_t)h * N * E + i];
        for (size_t i = 0; i < DE; i++)
            bs0[i] = s0[h * DE + i];
        la_ref_forward(N, D, E, bq, bk, bv, exp(-(double)rates[h]), 1.0, bs0,
                       ref_o + (size_t)h * N * E, ref_sn + h * DE);
    }
    for (size_t i = 0; i < nv; i++)
        got_o[i] = mo[i];
    for (size_t i = 0; i < HDE; i++)
        got_sn[i] = msn[i];
    double tol = case_tolerance(dt), rel_o = 0, rel_s = 0;
    case_check("o", got_o, ref_o, (size_t)H * N, E, tol, &rel_o);
    case_check("final state", got_sn, ref_sn, (size_t)H * D, E, tol, &rel_s);
    printf("%s %s P=%d N=%d: o %.2e, S_N %.2e\n", c->family ? c->family : "(default)",
           dt == LJ_F32 ? "f32" : "bf16", P, N, rel_o, rel_s);

    lajit_ctx_destroy(ctx);
    CUdeviceptr bufs[] = {dq, dk, dv, dout, ds, ds0, dsn, dloc, dinc, dlen};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        lj_gpu_free(bufs[i]);
    free(q);
    free(k);
    free(v);
    free(s0);
    free(mo);
    free(msn);
    free(ref_o);
    free(got_o);
    free(ref_sn);
    free(got_sn);
    free(bq);
    free(bk);
    free(bv);
    free(bs0);
}

LJ_TEST(default_family_one_span)
{
    blocks_case c = {NULL, LJ_BF16, 1, {3001}, 41};
    run_blocks_case(&c);
}

LJ_TEST(default_family_three_spans)
{
    blocks_case c = {NULL, LJ_BF16, 3, {1, 1777, 1223}, 42};
    run_blocks_case(&c);
}

LJ_TEST(default_family_five_spans_one_and_empty)
{
    blocks_case c = {NULL, LJ_BF16, 5, {1000, 1, 0, 1337, 663}, 43};
    run_blocks_case(&c);
}

LJ_TEST(la_fwd_five_spans_bf16)
{
    blocks_case c = {"la_fwd", LJ_BF16, 5, {700, 0, 1, 1500, 800}, 44};
    run_blocks_case(&c);
}

LJ_TEST(la_fwd_three_spans_f32)
{
    blocks_case c = {"la_fwd", LJ_F32, 3, {1234, 1, 1766}, 45};
    run_blocks_case(&c);
}
