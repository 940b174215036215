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
 * rank. Both exchanges; s = 0 through the decay path and strong decay. Needs sm_90a. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_cases.h"
#include "context.h"
#include "cp_op.h"
#include "gpu.h"
#include "la_ref.h"
#include "test.h"

enum { H = 2, D = 64, E = 64, MAXP = 8, MAXS = 16 };

typedef struct vcase {
    int P, nseq;
    int len[MAXS];     /* sequence lengths */
    int cut[MAXP + 1]; /* rank r holds packed tokens [cut[r], cut[r+1]) */
    int decay;         /* 1: s = 0 through the decay path; 2: strong */
    unsigned xchg;
    unsigned seed;
} vcase;

typedef struct rank_v {
    int T, pieces, first_seq, cont_in, cont_out;
    int32_t cu[MAXS + 2], slots[MAXS + 1];
    CUdeviceptr q, k, v, dout, o, dq, dk, dv, cu_d, slots_d, s0, sn, dsn, ds0, ds;
    lj_test_tensor tq, tk, tv, tdo, to, tdq, tdk, tdv, tcu, tsl, ts0, tsn, tdsn, tds0, tds;
} rank_v;

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

static void run(const vcase *c)
{
    const int P = c->P, nseq = c->nseq, NS = nseq; /* pool slots: one per sequence */
    const lj_dtype dt = LJ_BF16;
    const float sigma = 0.125f;
    const size_t DE = (size_t)D * E, st = (size_t)H * DE;
    int start[MAXS + 1] = {0};
    for (int i = 0; i < nseq; i++)
        start[i + 1] = start[i] + c->len[i];
    const int T = start[nseq];
    ASSERT_EQ(c->cut[0], 0);
    ASSERT_EQ(c->cut[P], T);
    /* Packed [T, H, D|E] host inputs; pools [NS, H, D, E]. */
    float *q = malloc((size_t)T * H * D * 4 + 4), *k = malloc((size_t)T * H * D * 4 + 4);
    float *v = malloc((size_t)T * H * E * 4 + 4), *dO = malloc((size_t)T * H * E * 4 + 4);
    float *s0 = malloc(NS * st), *dsn = malloc(NS * st), s[H];
    case_seed(c->seed);
    case_random_fill(q, (size_t)T * H * D, 1.0f, dt);
    case_random_fill(k, (size_t)T * H * D, 1.0f, dt);
    case_random_fill(v, (size_t)T * H * E, 1.0f, dt);
    case_random_fill(dO, (size_t)T * H * E, 1.0f, dt);
    case_random_fill(s0, NS * st / 4, 1.0f, LJ_F32);
    case_random_fill(dsn, NS * st / 4, 0.1f, LJ_F32);
    for (int h = 0; h < H; h++)
        s[h] = c->decay == 2 ? (h == 0 ? 0.05f : 1.5f) : 0.0f;
    int slot_of[MAXS];
    for (int i = 0; i < nseq; i++)
        slot_of[i] = i == 1 ? -1 : i; /* sequence 1 has no states */

    lajit_ctx *ctx = case_open_ctx();
    const DLDataType bf16 = lj_test_dl_dtype(dt), f32 = lj_test_dl_dtype(LJ_F32);
    const DLDataType i32 = lj_test_dl_int32();
    CUdeviceptr d_s = lj_gpu_alloc(H * 4);
    lj_gpu_upload(d_s, s, H * 4);
    lj_test_tensor ts;
    const int64_t hs[1] = {H}, pool_shape[4] = {NS, H, D, E};
    rank_v rv[MAXP];
    lajit_cp_attn_fwd_args fa[MAXP];
    lajit_cp_attn_bwd_args ba[MAXP];
    for (int r = 0; r < P; r++) {
        rank_v *u = &rv[r];
        memset(u, 0, sizeof *u);
        const int a = c->cut[r], b = c->cut[r + 1];
        u->T = b - a;
        /* Its pieces: every sequence overlapping [a, b) (and, for an empty slice, the sequence
         * it sits in), clipped. */
        int first = 0;
        while (first < nseq - 1 && start[first + 1] <= a && !(start[first + 1] == a && a == b))
            first++;
        u->first_seq = first;
        u->cu[0] = 0;
        int n = 0;
        for (int i = first; i < nseq; i++) {
            const int lo = start[i] > a ? start[i] : a, hi = start[i + 1] < b ? start[i + 1] : b;
            if (start[i] >= b && n > 0)
                break;
            u->cu[n + 1] = (hi > lo ? hi : lo) - a;
            if (u->cu[n + 1] < u->cu[n])
                u->cu[n + 1] = u->cu[n];
            u->slots[n] = slot_of[i];
            n++;
            if (start[i + 1] >= b)
                break;
        }
        u->pieces = n;
        u->cont_in = r > 0 && start[first] < a;
        const int last = first + n - 1;
        u->cont_out = r < P - 1 && start[last + 1] > b;
        const size_t qn = (size_t)u->T * H * D, vn = (size_t)u->T * H * E;
        CUdeviceptr *bufs[] = {&u->q, &u->k, &u->dq, &u->dk};
        for (int i = 0; i < 4; i++)
            *bufs[i] = lj_gpu_alloc(qn * 2 + 16);
        CUdeviceptr *vb[] = {&u->v, &u->dout, &u->o, &u->dv};
        for (int i = 0; i < 4; i++)
            *vb[i] = lj_gpu_alloc(vn * 2 + 16);
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
        u->cu_d = lj_gpu_alloc((size_t)(n + 1) * 4);
        u->slots_d = lj_gpu_alloc((size_t)n * 4);
        lj_gpu_upload(u->cu_d, u->cu, (size_t)(n + 1) * 4);
        lj_gpu_upload(u->slots_d, u->slots, (size_t)n * 4);
        u->s0 = lj_gpu_alloc(NS * st);
        u->dsn = lj_gpu_alloc(NS * st);
        u->sn = lj_gpu_alloc(NS * st);
        u->ds0 = lj_gpu_alloc(NS * st);
        u->ds = lj_gpu_alloc(H * 4);
        lj_gpu_upload(u->s0, s0, NS * st);
        lj_gpu_upload(u->dsn, dsn, NS * st);
        lj_gpu_poison(u->sn, NS * st);
        lj_gpu_poison(u->ds0, NS * st);
        lj_gpu_poison(u->ds, H * 4);
        const int64_t qs[3] = {u->T, H, D}, vs[3] = {u->T, H, E}, cs[1] = {n + 1}, ss[1] = {n};
        const uint32_t flags = c->xchg | (u->cont_in ? LAJIT_CP_CONTINUES_IN : 0) |
                               (u->cont_out ? LAJIT_CP_CONTINUES_OUT : 0);
        lajit_cp_attn_fwd_args *f = &fa[r];
        memset(f, 0, sizeof *f);
        f->struct_size = sizeof *f;
        f->q = lj_gpu_tensor(&u->tq, u->q, 0, 3, qs, NULL, bf16);
        f->k = lj_gpu_tensor(&u->tk, u->k, 0, 3, qs, NULL, bf16);
        f->v = lj_gpu_tensor(&u->tv, u->v, 0, 3, vs, NULL, bf16);
        f->o = lj_gpu_tensor(&u->to, u->o, 0, 3, vs, NULL, bf16);
        f->s = c->decay ? lj_gpu_tensor(&ts, d_s, 0, 1, hs, NULL, f32) : NULL;
        f->scale = sigma;
        f->initial_state = lj_gpu_tensor(&u->ts0, u->s0, 0, 4, pool_shape, NULL, f32);
        f->final_state = lj_gpu_tensor(&u->tsn, u->sn, 0, 4, pool_shape, NULL, f32);
        f->cu_seqlens = lj_gpu_tensor(&u->tcu, u->cu_d, 0, 1, cs, NULL, i32);
        f->state_slots = lj_gpu_tensor(&u->tsl, u->slots_d, 0, 1, ss, NULL, i32);
        f->flags = flags;
        lajit_cp_attn_bwd_args *g = &ba[r];
        memset(g, 0, sizeof *g);
        g->struct_size = sizeof *g;
        g->q = f->q;
        g->k = f->k;
        g->v = f->v;
        g->dout = lj_gpu_tensor(&u->tdo, u->dout, 0, 3, vs, NULL, bf16);
        g->dq = lj_gpu_tensor(&u->tdq, u->dq, 0, 3, qs, NULL, bf16);
        g->dk = lj_gpu_tensor(&u->tdk, u->dk, 0, 3, qs, NULL, bf16);
        g->dv = lj_gpu_tensor(&u->tdv, u->dv, 0, 3, vs, NULL, bf16);
        g->s = f->s;
        g->ds = c->decay ? lj_gpu_tensor(&u->tds, u->ds, 0, 1, hs, NULL, f32) : NULL;
        g->scale = sigma;
        g->initial_state = f->initial_state;
        g->d_final_state = lj_gpu_tensor(&u->tdsn, u->dsn, 0, 4, pool_shape, NULL, f32);
        g->d_initial_state = lj_gpu_tensor(&u->tds0, u->ds0, 0, 4, pool_shape, NULL, f32);
        g->cu_seqlens = f->cu_seqlens;
        g->state_slots = f->state_slots;
        g->flags = flags;
    }
    lajit_status stt = lajit__cp_attn_fwd_sim(ctx, P, fa);
    if (stt != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "forward: %s: %s", lajit_status_string(stt),
                     lajit_errmsg(ctx));
    lj_gpu_sync();
    if (getenv("CPV_DEBUG")) {
        for (int r = 0; r < P; r++) {
            float *oo = malloc((size_t)rv[r].T * H * E * 4 + 4);
            if (rv[r].T)
                lj_gpu_download_as(oo, rv[r].o, (size_t)rv[r].T * H * E, dt);
            for (int p = 0; p < rv[r].pieces; p++) {
                int nan = 0;
                for (int t = rv[r].cu[p]; t < rv[r].cu[p + 1]; t++)
                    nan += isnan(oo[(size_t)t * H * E]);
                printf("rank %d piece %d [%d,%d) slot %d: %d NaN rows (in %d out %d)\n", r, p,
                       rv[r].cu[p], rv[r].cu[p + 1], rv[r].slots[p], nan, rv[r].cont_in,
                       rv[r].cont_out);
            }
            free(oo);
        }
        int32_t ids[8] = {0};
        lj_gpu_download(ids, ctx->cp_ids.ptr, (size_t)(ctx->cp_ids_n < 8 ? ctx->cp_ids_n : 8) * 4);
        printf("ids (%lld, %zu bytes):", (long long)ctx->cp_ids_n, ctx->cp_ids.bytes);
        for (int i = 0; i < ctx->cp_ids_n && i < 8; i++)
            printf(" %d", ids[i]);
        printf("\n");
        fflush(stdout);
    }
    stt = lajit__cp_attn_bwd_sim(ctx, P, ba);
    if (stt != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "backward: %s: %s", lajit_status_string(stt),
                     lajit_errmsg(ctx));
    lj_gpu_sync();

    /* Every rank's outputs back into packed order. */
    float *go = malloc((size_t)T * H * E * 4 + 4), *gq = malloc((size_t)T * H * D * 4 + 4);
    float *gk = malloc((size_t)T * H * D * 4 + 4), *gv = malloc((size_t)T * H * E * 4 + 4);
    float *pool = malloc(NS * st), gds[MAXP][H];
    for (int r = 0; r < P; r++) {
        const rank_v *u = &rv[r];
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
            const int sl = slot_of[i];
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
                lj_gpu_download(pool, rv[re].sn, NS * st);
                for (size_t j = 0; j < DE; j++)
                    got[j] = pool[(size_t)sl * H * DE + h * DE + j];
                snprintf(what, sizeof what, "S_N of sequence %d head %d on rank %d", i, h, re);
                case_check(what, got, SN, D, E, tol, NULL);
                lj_gpu_download(pool, rv[rs].ds0, NS * st);
                for (size_t j = 0; j < DE; j++)
                    got[j] = pool[(size_t)sl * H * DE + h * DE + j];
                snprintf(what, sizeof what, "dS_0 of sequence %d head %d on rank %d", i, h, rs);
                case_check(what, got, dS0, D, E, tol, NULL);
                /* No other rank wrote that slot. */
                for (int r = 0; r < P; r++) {
                    if (r != re) {
                        lj_gpu_download(pool, rv[r].sn, NS * st);
                        if (!is_poison(pool + (size_t)sl * H * DE, H * DE))
                            lj_test_fail(__FILE__, __LINE__,
                                         "rank %d wrote S_N of sequence %d (it ends on rank %d)", r,
                                         i, re);
                    }
                    if (r != rs) {
                        lj_gpu_download(pool, rv[r].ds0, NS * st);
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
    printf("varlen P=%d nseq=%d T=%d decay=%d xchg=0x%x: passed\n", P, nseq, T, c->decay, c->xchg);
    for (int r = 0; r < P; r++) {
        rank_v *u = &rv[r];
        CUdeviceptr all[] = {u->q,    u->k,       u->v,  u->dout, u->o,   u->dq,  u->dk, u->dv,
                             u->cu_d, u->slots_d, u->s0, u->sn,   u->dsn, u->ds0, u->ds};
        for (size_t j = 0; j < sizeof all / sizeof all[0]; j++)
            lj_gpu_free(all[j]);
    }
    lj_gpu_free(d_s);
    lajit_ctx_destroy(ctx);
    void *host[] = {q, k, v, dO, s0, dsn, go, gq, gk, gv, pool};
    for (size_t j = 0; j < sizeof host / sizeof host[0]; j++)
        free(host[j]);
}

/* Four sequences over three ranks: sequence 0 starts on rank 0 and ends on rank 1, sequence 2
 * passes through rank 1 entirely? No: rank 1 holds the end of 0, all of 1 (no states, slot −1)
 * and the start of 2; rank 2 the rest of 2 and all of 3. */
LJ_TEST(three_ranks)
{
    need_sm90a();
    for (int decay = 1; decay <= 2; decay++)
        for (int x = 0; x < 2; x++) {
            vcase c = {.P = 3,
                       .nseq = 4,
                       .len = {300, 70, 500, 90},
                       .cut = {0, 200, 600, 960},
                       .decay = decay,
                       .xchg = x ? LAJIT_CP_LOGSTEP : LAJIT_CP_ALLGATHER,
                       .seed = 40u + (unsigned)(2 * decay + x)};
            run(&c);
        }
}

/* Five ranks and a long sequence passing through two of them whole (a rank that is one piece
 * continuing in and out), an empty sequence, a cut at a sequence boundary. */
LJ_TEST(five_ranks_pass_through)
{
    need_sm90a();
    for (int x = 0; x < 2; x++) {
        vcase c = {.P = 5,
                   .nseq = 5,
                   .len = {100, 0, 1500, 64, 200},
                   .cut = {0, 100, 500, 900, 1700, 1864},
                   .decay = 2,
                   .xchg = x ? LAJIT_CP_LOGSTEP : LAJIT_CP_ALLGATHER,
                   .seed = 77u + (unsigned)x};
        run(&c);
    }
}
