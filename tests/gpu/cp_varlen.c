/* cp_varlen.c — context parallelism over a packed varlen batch whose sequences cross ranks
 * (runtime/cp_varlen.c), on one GPU with simulated ranks, against the float64 reference of each
 * whole sequence.
 *
 * A case draws nseq sequences (ragged lengths, an empty one), packs them (H = 2, bf16 q, k, v, dO
 * rounded on the host) and cuts the packed tokens into P contiguous rank slices at given token
 * offsets, so sequences start, end, pass through and are cut in the middle of ranks. Each rank
 * gets its pieces (its own cu_seqlens, state_slots and LAJIT_CP_CONTINUES_IN / _OUT), its own
 * copy of the initial-state and dS_N pools (slot = sequence index; one sequence has slot −1) and
 * its own NaN-poisoned outputs and final-state / dS_0 pools. Checked: o, dq, dk, dv of every
 * token; each sequence's S_N in the pool of the rank where it ends and its dS_0 in the pool of the
 * rank where it starts (DESIGN.md's bf16 tolerance); every other slot of those pools still
 * poisoned; ds (every rank asks) within DESIGN.md's normwise bound and the same bits on every
 * rank. Both exchanges; s = 0 through the decay path and strong decay. Needs sm_90a. The cases,
 * each rank's pieces and its buffers are tests/support/cp_varlen_case.c's, which the cpu test
 * cp.varlen_gpu_cases_on_the_fake_driver replays on the fake driver. keep: the forward hands each
 * rank the state entering its first piece (incoming_state, NaN-poisoned before: a rank whose first
 * piece does not continue neither writes nor reads it) and the backward starts from it. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_cases.h"
#include "cp_op.h"
#include "cp_varlen_case.h"
#include "gpu.h"
#include "la_ref.h"
#include "test.h"

enum { H = LJ_CPV_H, D = LJ_CPV_D, E = LJ_CPV_E, MAXP = LJ_CPV_MAXP, MAXS = LJ_CPV_MAXS };

static void need_sm90a(void)
{
    lj_gpu_init();
    if (strcmp(lj_gpu_device()->info.arch, "sm_90a") != 0)
        lj_test_skip("context parallelism's local states need la_fwd_sm90: an sm_90a GPU");
}

static int is_poison(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &x[i], 4);
        if (b != 0xFFFFFFFFu)
            return 0;
    }
    return 1;
}

static void run(const lj_cpv_case *c, int keep)
{
    const int P = c->P, nseq = c->nseq;
    const lj_dtype dt = LJ_BF16;
    const float sigma = LJ_CPV_SCALE;
    const size_t DE = (size_t)D * E, pool_n = lj_cpv_pool_floats(c), pool_b = lj_cpv_pool_bytes(c);
    int start[MAXS + 1];
    lj_cpv_starts(c, start);
    const int T = start[nseq];
    ASSERT_EQ(c->cut[0], 0);
    ASSERT_EQ(c->cut[P], T);
    /* Packed [T, H, D|E] host inputs; pools [nseq, H, D, E] (slot i: sequence i). */
    float *q = malloc((size_t)T * H * D * 4 + 4), *k = malloc((size_t)T * H * D * 4 + 4);
    float *v = malloc((size_t)T * H * E * 4 + 4), *dO = malloc((size_t)T * H * E * 4 + 4);
    float *s0 = malloc(pool_b), *dsn = malloc(pool_b), s[H];
    case_seed(c->seed);
    case_random_fill(q, (size_t)T * H * D, 1.0f, dt);
    case_random_fill(k, (size_t)T * H * D, 1.0f, dt);
    case_random_fill(v, (size_t)T * H * E, 1.0f, dt);
    case_random_fill(dO, (size_t)T * H * E, 1.0f, dt);
    case_random_fill(s0, pool_n, 1.0f, LJ_F32);
    case_random_fill(dsn, pool_n, 0.1f, LJ_F32);
    for (int h = 0; h < H; h++)
        s[h] = c->decay == 2 ? (h == 0 ? 0.05f : 1.5f) : 0.0f;

    lajit_ctx *ctx = case_open_ctx();
    CUdeviceptr d_s = lj_gpu_alloc(H * 4);
    lj_gpu_upload(d_s, s, H * 4);
    lj_test_tensor ts;
    const int64_t hs[1] = {H};
    const DLTensor *s_t = lj_gpu_tensor(&ts, d_s, 0, 1, hs, NULL, lj_test_dl_dtype(LJ_F32));
    lj_cpv_rank rv[MAXP]; /* its tensors point into it: opened in place, never copied */
    lajit_cp_attn_fwd_args fa[MAXP];
    lajit_cp_attn_bwd_args ba[MAXP];
    for (int r = 0; r < P; r++) {
        lj_cpv_rank *u = &rv[r];
        lj_cpv_rank_open(u, c, r, lj_gpu_alloc, s_t);
        const int a = c->cut[r];
        const size_t qn = (size_t)u->T * H * D, vn = (size_t)u->T * H * E;
        if (u->T) {
            lj_gpu_upload_as(u->q, q + (size_t)a * H * D, qn, dt);
            lj_gpu_upload_as(u->k, k + (size_t)a * H * D, qn, dt);
            lj_gpu_upload_as(u->v, v + (size_t)a * H * E, vn, dt);
            lj_gpu_upload_as(u->dout, dO + (size_t)a * H * E, vn, dt);
            lj_gpu_poison(u->o, vn * 2);
            lj_gpu_poison(u->dq, qn * 2);
            lj_gpu_poison(u->dk, qn * 2);
            lj_gpu_poison(u->dv, vn * 2);
        }
        lj_gpu_upload(u->cu_d, u->cu, (size_t)(u->pieces + 1) * 4);
        lj_gpu_upload(u->slots_d, u->slots, (size_t)u->pieces * 4);
        lj_gpu_upload(u->s0, s0, pool_b);
        lj_gpu_upload(u->dsn, dsn, pool_b);
        lj_gpu_poison(u->sn, pool_b);
        lj_gpu_poison(u->ds0, pool_b);
        lj_gpu_poison(u->ds, H * 4);
        lj_gpu_poison(u->in, (size_t)H * D * E * 4);
        if (keep)
            lj_cpv_rank_keep_incoming(u);
        fa[r] = u->fa;
        ba[r] = u->ba;
    }
    lajit_status stt = lajit__cp_attn_fwd_sim(ctx, P, fa);
    if (stt != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "forward: %s: %s", lajit_status_string(stt),
                     lajit_errmsg(ctx));
    lj_gpu_sync();
    stt = lajit__cp_attn_bwd_sim(ctx, P, ba);
    if (stt != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "backward: %s: %s", lajit_status_string(stt),
                     lajit_errmsg(ctx));
    lj_gpu_sync();

    /* Every rank's outputs back into packed order. */
    float *go = malloc((size_t)T * H * E * 4 + 4), *gq = malloc((size_t)T * H * D * 4 + 4);
    float *gk = malloc((size_t)T * H * D * 4 + 4), *gv = malloc((size_t)T * H * E * 4 + 4);
    float *pool = malloc(pool_b), gds[MAXP][H];
    for (int r = 0; r < P; r++) {
        const lj_cpv_rank *u = &rv[r];
        const size_t a = (size_t)c->cut[r];
        if (u->T) {
            lj_gpu_download_as(go + a * H * E, u->o, (size_t)u->T * H * E, dt);
            lj_gpu_download_as(gq + a * H * D, u->dq, (size_t)u->T * H * D, dt);
            lj_gpu_download_as(gk + a * H * D, u->dk, (size_t)u->T * H * D, dt);
            lj_gpu_download_as(gv + a * H * E, u->dv, (size_t)u->T * H * E, dt);
        }
        lj_gpu_download(gds[r], u->ds, H * 4);
    }
    const double tol = case_tolerance(dt);
    double ref_ds[H] = {0}, bound[H] = {0};
    for (int i = 0; i < nseq; i++) {
        const int n = c->len[i];
        /* The ranks where sequence i starts and ends. */
        int rs = 0, re = 0;
        for (int r = 0; r < P; r++) {
            if (c->cut[r] <= start[i] &&
                (start[i] < c->cut[r + 1] || r == P - 1 || (n == 0 && start[i] == c->cut[r])))
                rs = rs ? rs : r + 1;
            if (c->cut[r] < start[i + 1] && start[i + 1] <= c->cut[r + 1])
                re = r + 1;
        }
        rs = rs ? rs - 1 : 0;
        re = n ? re - 1 : rs;
        for (int h = 0; h < H; h++) {
            double *x[4], *ro = malloc((size_t)n * E * 8 + 8), *rq = malloc((size_t)n * D * 8 + 8);
            double *rk = malloc((size_t)n * D * 8 + 8), *rv_ = malloc((size_t)n * E * 8 + 8);
            double S0[D * E], dSN[D * E], SN[D * E], dS0[D * E], got[D * E], ds1 = 0, b1 = 0;
            double *g = malloc((size_t)(n ? n : 1) * (D > E ? D : E) * 8);
            for (int j = 0; j < 4; j++)
                x[j] = malloc((size_t)(n ? n : 1) * (j < 2 ? D : E) * 8);
            for (int t = 0; t < n; t++) {
                const size_t tok = (size_t)(start[i] + t) * H + h;
                for (int d = 0; d < D; d++) {
                    x[0][t * D + d] = q[tok * D + d];
                    x[1][t * D + d] = k[tok * D + d];
                }
                for (int e = 0; e < E; e++) {
                    x[2][t * E + e] = v[tok * E + e];
                    x[3][t * E + e] = dO[tok * E + e];
                }
            }
            const int sl = lj_cpv_slot_of(i);
            for (size_t j = 0; j < DE; j++) {
                S0[j] = sl >= 0 ? s0[(size_t)sl * H * DE + h * DE + j] : 0;
                dSN[j] = sl >= 0 ? dsn[(size_t)sl * H * DE + h * DE + j] : 0;
            }
            const double lam = c->decay ? exp(-(double)s[h]) : 1.0;
            la_ref_forward(n, D, E, x[0], x[1], x[2], lam, sigma, S0, ro, SN);
            la_ref_backward(n, D, E, x[0], x[1], x[2], x[3], lam, sigma, S0, dSN, rq, rk, rv_, dS0,
                            &ds1, &b1);
            ref_ds[h] += ds1;
            bound[h] += b1;
            char what[128];
            const float *whole[4] = {go, gq, gk, gv};
            const double *ref[4] = {ro, rq, rk, rv_};
            static const char *const names[4] = {"o", "dq", "dk", "dv"};
            for (int m = 0; m < 4 && n; m++) {
                const int w = m == 1 || m == 2 ? D : E;
                for (int t = 0; t < n; t++)
                    for (int d = 0; d < w; d++)
                        g[t * w + d] = whole[m][((size_t)(start[i] + t) * H + h) * w + d];
                snprintf(what, sizeof what, "%s of sequence %d head %d (P=%d seed %u)", names[m], i,
                         h, P, c->seed);
                case_check(what, g, ref[m], (size_t)n, (size_t)w, tol, NULL);
            }
            if (sl >= 0) {
                lj_gpu_download(pool, rv[re].sn, pool_b);
                for (size_t j = 0; j < DE; j++)
                    got[j] = pool[(size_t)sl * H * DE + h * DE + j];
                snprintf(what, sizeof what, "S_N of sequence %d head %d on rank %d", i, h, re);
                case_check(what, got, SN, D, E, tol, NULL);
                lj_gpu_download(pool, rv[rs].ds0, pool_b);
                for (size_t j = 0; j < DE; j++)
                    got[j] = pool[(size_t)sl * H * DE + h * DE + j];
                snprintf(what, sizeof what, "dS_0 of sequence %d head %d on rank %d", i, h, rs);
                case_check(what, got, dS0, D, E, tol, NULL);
                /* No other rank wrote that slot. */
                for (int r = 0; r < P; r++) {
                    if (r != re) {
                        lj_gpu_download(pool, rv[r].sn, pool_b);
                        if (!is_poison(pool + (size_t)sl * H * DE, H * DE))
                            lj_test_fail(__FILE__, __LINE__,
                                         "rank %d wrote S_N of sequence %d (it ends on rank %d)", r,
                                         i, re);
                    }
                    if (r != rs) {
                        lj_gpu_download(pool, rv[r].ds0, pool_b);
                        if (!is_poison(pool + (size_t)sl * H * DE, H * DE))
                            lj_test_fail(__FILE__, __LINE__,
                                         "rank %d wrote dS_0 of sequence %d (it starts on rank %d)",
                                         r, i, rs);
                    }
                }
            }
            for (int j = 0; j < 4; j++)
                free(x[j]);
            free(ro);
            free(rq);
            free(rk);
            free(rv_);
            free(g);
        }
    }
    for (int h = 0; c->decay && h < H; h++) {
        const double err = fabs((double)gds[0][h] - ref_ds[h]);
        if (!isfinite(gds[0][h]) || !(err <= tol * bound[h]))
            lj_test_fail(__FILE__, __LINE__, "ds[%d] = %.9g, reference %.9g (bound %.3g)", h,
                         (double)gds[0][h], ref_ds[h], tol * bound[h]);
        for (int r = 1; r < P; r++)
            if (memcmp(&gds[r][h], &gds[0][h], 4) != 0)
                lj_test_fail(__FILE__, __LINE__, "ds[%d]: rank %d differs from rank 0", h, r);
    }
    printf("varlen P=%d nseq=%d T=%d decay=%d xchg=0x%x keep=%d: passed\n", P, nseq, T, c->decay,
           c->xchg, keep);
    for (int r = 0; r < P; r++)
        lj_cpv_rank_close(&rv[r], lj_gpu_free);
    lj_gpu_free(d_s);
    lajit_ctx_destroy(ctx);
    void *host[] = {q, k, v, dO, s0, dsn, go, gq, gk, gv, pool};
    for (size_t j = 0; j < sizeof host / sizeof host[0]; j++)
        free(host[j]);
}

/* Four sequences over three ranks (cp_varlen_case.h: a middle rank continuing both ways with
 * three pieces, one of them a sequence without a slot). */
LJ_TEST(three_ranks)
{
    need_sm90a();
    for (int decay = 1; decay <= 2; decay++)
        for (int x = 0; x < 2; x++) {
            const lj_cpv_case c = lj_cpv_three_ranks(decay, x);
            run(&c, 0);
        }
}

/* Five ranks and a long sequence passing through two of them whole (a rank that is one piece
 * continuing in and out), an empty sequence, a cut at a sequence boundary. */
LJ_TEST(five_ranks_pass_through)
{
    need_sm90a();
    for (int x = 0; x < 2; x++) {
        const lj_cpv_case c = lj_cpv_five_ranks(x);
        run(&c, 0);
    }
}

/* Both layouts again with the backward started from the forward's incoming states. */
LJ_TEST(keep_incoming_state)
{
    need_sm90a();
    for (int x = 0; x < 2; x++) {
        const lj_cpv_case three = lj_cpv_three_ranks(2, x), five = lj_cpv_five_ranks(x);
        run(&three, 1);
        run(&five, 1);
    }
}
