/* cp_bwd.c — context parallelism's backward on one GPU against the float64 whole sequence, and
 * its building block: lajit_attn_bwd with dq, dk and dv NULL (dS_0 alone, a span's local
 * gradient state).
 *
 * Each cp case draws one batch (B = 2, H = 2, bf16 q, k, v, dO rounded on the host), cuts every
 * sequence into P contiguous spans of ragged lengths (one-token and empty spans where P allows)
 * and gives each span to a simulated rank: its own q, k, v, dO and its own NaN-poisoned dq, dk,
 * dv and ds (every rank asks for ds), rank 0 a poisoned dS_0. lajit__cp_attn_bwd_sim runs every
 * rank's steps with the exchanges replaced by device copies. The gradients, put back in sequence
 * order, must match la_ref_backward over each whole sequence (DESIGN.md's check at the bf16
 * tolerance of tests/support/attn_cases.c); rank 0's dS_0 likewise; every rank's ds within
 * DESIGN.md's normwise bound (tol · λ Σ_t ‖G_t‖‖S_{t−1}‖, summed over the batch) and the same bits
 * on every rank. Cases: P = 2, 3, 8; s = 0 through the decay path and strong decay (s up to 2,
 * with ds), no decay (no ds); S_0 and dS_N given or not; D = E = 64 and 128; a CUDA-graph replay;
 * the real NCCL path with a one-rank communicator. Needs an sm_90a GPU (la_fwd_sm90's state-only
 * walks). keep: the backward runs once as above, then lajit_cp_attn_fwd hands every rank its
 * incoming state (rank 0's buffer NaN-poisoned: it is neither written nor read) and the backward
 * runs again from those states, skipping its own forward exchange: the same bits as the first
 * run, then the float64 checks (after a forward by segments, LAJIT_CP_SEGMENTS: the float64
 * checks alone, the states being summed in another order). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_cases.h"
#include "context.h"
#include "cp_op.h"
#include "gpu.h"
#include "la_ref.h"
#include "nccl.h"
#include "test.h"

enum { B = 2, H = 2, MAXP = 8 };

typedef struct cp_case {
    int P, D;      /* E = D */
    int decay;     /* 0: s NULL; 1: s = 0 (the decay path, λ = 1); 2: strong */
    int init;      /* S_0 given (rank 0 reads it) */
    int dsn;       /* dS_N given (the last rank reads it) */
    int graph;     /* check a captured graph's replay of the call */
    int keep;      /* the backward again from the forward's incoming_state: the same bits (1),
                    * or, the forward by segments, the float64 checks alone (2) */
    unsigned xchg; /* LAJIT_CP_ALLGATHER, LAJIT_CP_LOGSTEP or 0 (the choice by P) */
    int n[MAXP];   /* span lengths */
    unsigned seed;
} cp_case;

typedef struct rank_bufs {
    CUdeviceptr q, k, v, dout, dq, dk, dv, ds, o, in;
    lj_test_tensor tq, tk, tv, tdo, tdq, tdk, tdv, tds, to, tin;
} rank_bufs;

static float rate(const cp_case *c, int h)
{
    return c->decay == 2 ? (h == 0 ? 0.05f : 2.0f) : 0.0f;
}

static void need_sm90a(void)
{
    lj_gpu_init();
    if (strcmp(lj_gpu_device()->info.arch, "sm_90a") != 0)
        lj_test_skip("context parallelism's local states need la_fwd_sm90: an sm_90a GPU");
}

/* The span [start, start + n) of every (b, h) of a [B·H, N, w] host array, compact. */
static float *span_of(const float *x, int N, int w, int start, int n)
{
    float *t = malloc((size_t)B * H * n * w * 4 + 4);
    for (size_t bh = 0; bh < (size_t)B * H; bh++)
        memcpy(t + bh * n * w, x + (bh * N + start) * w, (size_t)n * w * 4);
    return t;
}

/* Rank r's gradient span into the whole [B·H, N, w] host array. */
static void put_span(float *whole, CUdeviceptr dev, int N, int w, int start, int n)
{
    const size_t cnt = (size_t)B * H * n * w;
    if (!cnt)
        return;
    float *t = malloc(cnt * 4);
    lj_gpu_download_as(t, dev, cnt, LJ_BF16);
    for (size_t bh = 0; bh < (size_t)B * H; bh++)
        memcpy(whole + (bh * N + start) * w, t + bh * n * w, (size_t)n * w * 4);
    free(t);
}

static void poison_outputs(const cp_case *c, rank_bufs *rb, CUdeviceptr dds0, size_t state_bytes)
{
    const size_t BH = (size_t)B * H;
    for (int r = 0; r < c->P; r++) {
        const size_t n = (size_t)c->n[r];
        if (n) {
            lj_gpu_poison(rb[r].dq, BH * n * c->D * 2);
            lj_gpu_poison(rb[r].dk, BH * n * c->D * 2);
            lj_gpu_poison(rb[r].dv, BH * n * c->D * 2);
        }
        lj_gpu_poison(rb[r].ds, H * 4);
    }
    lj_gpu_poison(dds0, state_bytes);
}

/* Every rank's dq, dk, dv, ds and rank 0's dS_0 as bytes, appended to out (NULL: the byte count). */
static size_t grad_bytes(const cp_case *c, const rank_bufs *rb, CUdeviceptr dds0,
                         size_t state_bytes, unsigned char *out)
{
    size_t off = 0;
    for (int r = 0; r < c->P; r++) {
        const size_t n = (size_t)B * H * c->n[r] * c->D * 2;
        const CUdeviceptr each[3] = {rb[r].dq, rb[r].dk, rb[r].dv};
        for (int i = 0; i < 3 && n; i++, off += n)
            if (out)
                lj_gpu_download(out + off, each[i], n);
        if (out)
            lj_gpu_download(out + off, rb[r].ds, H * 4);
        off += H * 4;
    }
    if (out)
        lj_gpu_download(out + off, dds0, state_bytes);
    return off + state_bytes;
}

/* keep: the first backward's bits, then the forward's incoming states, then the backward again
 * from them (rank 0's incoming_state poisoned: neither written nor read). A forward by segments
 * (keep 2) sums the incoming state in another order: its gradients differ by rounding, and the
 * float64 checks that follow are on them. */
static void rerun_from_the_forward(const cp_case *c, lajit_ctx *ctx, rank_bufs *rb,
                                   lajit_cp_attn_bwd_args *a, CUdeviceptr dds0, size_t state_bytes)
{
    const int P = c->P;
    const size_t total = grad_bytes(c, rb, dds0, state_bytes, NULL);
    unsigned char *first = malloc(total), *again = malloc(total);
    lj_gpu_sync();
    grad_bytes(c, rb, dds0, state_bytes, first);
    const DLDataType f32 = lj_test_dl_dtype(LJ_F32);
    const int64_t ss[4] = {B, H, c->D, c->D};
    lajit_cp_attn_fwd_args f[MAXP];
    for (int r = 0; r < P; r++) {
        lj_gpu_poison(rb[r].in, state_bytes);
        memset(&f[r], 0, sizeof f[r]);
        f[r].struct_size = sizeof f[r];
        f[r].comm = a[r].comm;
        f[r].q = a[r].q;
        f[r].k = a[r].k;
        f[r].v = a[r].v;
        f[r].o = lj_gpu_tensor(&rb[r].to, rb[r].o, 0, 4, a[r].dout->shape, NULL, a[r].dout->dtype);
        f[r].s = a[r].s;
        f[r].scale = a[r].scale;
        f[r].initial_state = a[r].initial_state;
        f[r].flags = a[r].flags;
        f[r].incoming_state = lj_gpu_tensor(&rb[r].tin, rb[r].in, 0, 4, ss, NULL, f32);
        a[r].incoming_state = f[r].incoming_state;
    }
    lajit_status st = a[0].comm ? lajit_cp_attn_fwd(ctx, &f[0]) : lajit__cp_attn_fwd_sim(ctx, P, f);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "forward: %s: %s", lajit_status_string(st),
                     lajit_errmsg(ctx));
    poison_outputs(c, rb, dds0, state_bytes);
    lj_gpu_sync();
    st = a[0].comm ? lajit_cp_attn_bwd(ctx, &a[0]) : lajit__cp_attn_bwd_sim(ctx, P, a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "backward from the kept states: %s: %s",
                     lajit_status_string(st), lajit_errmsg(ctx));
    lj_gpu_sync();
    grad_bytes(c, rb, dds0, state_bytes, again);
    if (c->keep == 1 && memcmp(first, again, total) != 0)
        lj_test_fail(__FILE__, __LINE__,
                     "P=%d: the backward from the forward's incoming states differs from the one "
                     "that recomputes them",
                     P);
    free(first);
    free(again);
}

/* Runs one case through the simulated ranks, or the NCCL path when comm is given (P = 1). */
static void run_case(const cp_case *c, void *comm)
{
    const int P = c->P, D = c->D, E = c->D;
    const lj_dtype dt = LJ_BF16;
    const float sigma = 1.0f / sqrtf((float)D);
    int N = 0, start[MAXP + 1];
    for (int r = 0; r < P; r++) {
        start[r] = N;
        N += c->n[r];
    }
    start[P] = N;
    ASSERT_TRUE(N > 0);
    const size_t BH = (size_t)B * H, DE = (size_t)D * E;
    float *q = malloc(BH * N * D * 4), *k = malloc(BH * N * D * 4), *v = malloc(BH * N * E * 4);
    float *dO = malloc(BH * N * E * 4), *s0 = malloc(BH * DE * 4), *dsn = malloc(BH * DE * 4);
    float s[H];
    case_seed(c->seed);
    case_random_fill(q, BH * N * D, 1.0f, dt);
    case_random_fill(k, BH * N * D, 1.0f, dt);
    case_random_fill(v, BH * N * E, 1.0f, dt);
    case_random_fill(dO, BH * N * E, 1.0f, dt);
    case_random_fill(s0, BH * DE, 1.0f, LJ_F32);
    case_random_fill(dsn, BH * DE, 0.1f, LJ_F32);
    for (int h = 0; h < H; h++)
        s[h] = rate(c, h);

    lajit_ctx *ctx = case_open_ctx();
    const DLDataType bf16 = lj_test_dl_dtype(dt), f32 = lj_test_dl_dtype(LJ_F32);
    CUdeviceptr d_s = lj_gpu_alloc(H * 4), d_s0 = lj_gpu_alloc(BH * DE * 4);
    CUdeviceptr d_dsn = lj_gpu_alloc(BH * DE * 4), d_ds0 = lj_gpu_alloc(BH * DE * 4);
    lj_gpu_upload(d_s, s, H * 4);
    lj_gpu_upload(d_s0, s0, BH * DE * 4);
    lj_gpu_upload(d_dsn, dsn, BH * DE * 4);
    lj_test_tensor ts, ts0, tdsn, tds0;
    const int64_t hshape[1] = {H}, sshape[4] = {B, H, D, E};
    rank_bufs rb[MAXP];
    lajit_cp_attn_bwd_args a[MAXP];
    for (int r = 0; r < P; r++) {
        const int n = c->n[r];
        const size_t qn = BH * n * D, vn = BH * n * E;
        rank_bufs *u = &rb[r];
        u->q = lj_gpu_alloc(qn * 2 + 16);
        u->k = lj_gpu_alloc(qn * 2 + 16);
        u->v = lj_gpu_alloc(vn * 2 + 16);
        u->dout = lj_gpu_alloc(vn * 2 + 16);
        u->dq = lj_gpu_alloc(qn * 2 + 16);
        u->dk = lj_gpu_alloc(qn * 2 + 16);
        u->dv = lj_gpu_alloc(vn * 2 + 16);
        u->ds = lj_gpu_alloc(H * 4);
        u->o = lj_gpu_alloc(vn * 2 + 16);
        u->in = lj_gpu_alloc(BH * DE * 4);
        float *tq = span_of(q, N, D, start[r], n), *tk = span_of(k, N, D, start[r], n);
        float *tv = span_of(v, N, E, start[r], n), *tdo = span_of(dO, N, E, start[r], n);
        if (n) {
            lj_gpu_upload_as(u->q, tq, qn, dt);
            lj_gpu_upload_as(u->k, tk, qn, dt);
            lj_gpu_upload_as(u->v, tv, vn, dt);
            lj_gpu_upload_as(u->dout, tdo, vn, dt);
        }
        free(tq);
        free(tk);
        free(tv);
        free(tdo);
        const int64_t qs[4] = {B, H, n, D}, vs[4] = {B, H, n, E};
        memset(&a[r], 0, sizeof a[r]);
        a[r].struct_size = sizeof a[r];
        a[r].comm = comm;
        a[r].q = lj_gpu_tensor(&u->tq, u->q, 0, 4, qs, NULL, bf16);
        a[r].k = lj_gpu_tensor(&u->tk, u->k, 0, 4, qs, NULL, bf16);
        a[r].v = lj_gpu_tensor(&u->tv, u->v, 0, 4, vs, NULL, bf16);
        a[r].dout = lj_gpu_tensor(&u->tdo, u->dout, 0, 4, vs, NULL, bf16);
        a[r].dq = lj_gpu_tensor(&u->tdq, u->dq, 0, 4, qs, NULL, bf16);
        a[r].dk = lj_gpu_tensor(&u->tdk, u->dk, 0, 4, qs, NULL, bf16);
        a[r].dv = lj_gpu_tensor(&u->tdv, u->dv, 0, 4, vs, NULL, bf16);
        a[r].s = c->decay ? lj_gpu_tensor(&ts, d_s, 0, 1, hshape, NULL, f32) : NULL;
        a[r].ds = c->decay ? lj_gpu_tensor(&u->tds, u->ds, 0, 1, hshape, NULL, f32) : NULL;
        a[r].scale = sigma;
        a[r].flags = c->xchg;
        /* Every rank passes the same list: rank 0 reads S_0 and writes dS_0, the last reads dS_N. */
        a[r].initial_state = c->init ? lj_gpu_tensor(&ts0, d_s0, 0, 4, sshape, NULL, f32) : NULL;
        a[r].d_final_state = c->dsn ? lj_gpu_tensor(&tdsn, d_dsn, 0, 4, sshape, NULL, f32) : NULL;
        a[r].d_initial_state = lj_gpu_tensor(&tds0, d_ds0, 0, 4, sshape, NULL, f32);
    }
    poison_outputs(c, rb, d_ds0, BH * DE * 4);

    lajit_status st = comm ? lajit_cp_attn_bwd(ctx, &a[0]) : lajit__cp_attn_bwd_sim(ctx, P, a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(st), lajit_errmsg(ctx));
    if (c->keep)
        rerun_from_the_forward(c, ctx, rb, a, d_ds0, BH * DE * 4);
    if (c->graph) {
        /* Poison again, then replay the same call from a captured graph on a stream of ours. */
        const lj_driver *drv = lj_gpu_driver();
        CUstream stream;
        CUgraph graph;
        CUgraphExec exec;
        lj_gpu_sync();
        ASSERT_EQ(drv->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
        for (int r = 0; r < P; r++)
            a[r].stream = stream;
        ASSERT_OK(lajit__cp_attn_bwd_sim(ctx, P, a)); /* the workspace is the context's */
        lj_gpu_stream_sync(stream);
        poison_outputs(c, rb, d_ds0, BH * DE * 4);
        lj_gpu_sync(); /* the memsets ran on the legacy stream, which ours does not wait for */
        ASSERT_EQ(drv->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                  CUDA_SUCCESS);
        st = lajit__cp_attn_bwd_sim(ctx, P, a);
        ASSERT_EQ(drv->cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
        if (st != LAJIT_OK)
            lj_test_fail(__FILE__, __LINE__, "captured: %s: %s", lajit_status_string(st),
                         lajit_errmsg(ctx));
        ASSERT_EQ(drv->cuGraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
        ASSERT_EQ(drv->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
        lj_gpu_stream_sync(stream);
        drv->cuGraphExecDestroy(exec);
        drv->cuGraphDestroy(graph);
        drv->cuStreamDestroy(stream);
    }
    lj_gpu_sync();

    /* The spans' gradients in sequence order. */
    float *gq = malloc(BH * N * D * 4), *gk = malloc(BH * N * D * 4), *gv = malloc(BH * N * E * 4);
    for (int r = 0; r < P; r++) {
        put_span(gq, rb[r].dq, N, D, start[r], c->n[r]);
        put_span(gk, rb[r].dk, N, D, start[r], c->n[r]);
        put_span(gv, rb[r].dv, N, E, start[r], c->n[r]);
    }
    float *gs0 = malloc(BH * DE * 4), gds[MAXP][H];
    lj_gpu_download(gs0, d_ds0, BH * DE * 4);
    for (int r = 0; r < P; r++)
        lj_gpu_download(gds[r], rb[r].ds, H * 4);

    /* The reference over each whole sequence. */
    const double tol = case_tolerance(dt);
    double *x[4], *rq = malloc((size_t)N * D * 8), *rk = malloc((size_t)N * D * 8);
    /* got holds one gradient of a (b, h) or one dS_0, whichever is larger. */
    const size_t got_n = (size_t)N * (D > E ? D : E) > DE ? (size_t)N * (D > E ? D : E) : DE;
    double *rv = malloc((size_t)N * E * 8), *got = malloc(got_n * 8);
    double *S0 = malloc(DE * 8), *dSN = malloc(DE * 8), *rs0 = malloc(DE * 8);
    for (int i = 0; i < 4; i++)
        x[i] = malloc((size_t)N * (i < 2 ? D : E) * 8);
    double ref_ds[H] = {0}, bound[H] = {0}, worst = 0;
    for (size_t bh = 0; bh < BH; bh++) {
        const int h = (int)(bh % H);
        for (size_t i = 0; i < (size_t)N * D; i++) {
            x[0][i] = q[bh * N * D + i];
            x[1][i] = k[bh * N * D + i];
        }
        for (size_t i = 0; i < (size_t)N * E; i++) {
            x[2][i] = v[bh * N * E + i];
            x[3][i] = dO[bh * N * E + i];
        }
        for (size_t i = 0; i < DE; i++) {
            S0[i] = s0[bh * DE + i];
            dSN[i] = dsn[bh * DE + i];
        }
        const double lambda = c->decay ? exp(-(double)s[h]) : 1.0;
        double ds_one = 0, bound_one = 0;
        la_ref_backward(N, D, E, x[0], x[1], x[2], x[3], lambda, sigma, c->init ? S0 : NULL,
                        c->dsn ? dSN : NULL, rq, rk, rv, rs0, &ds_one, &bound_one);
        ref_ds[h] += ds_one;
        bound[h] += bound_one;
        char what[160];
        double rel;
        static const char *const names[3] = {"dq", "dk", "dv"};
        const float *whole[3] = {gq, gk, gv};
        const double *ref[3] = {rq, rk, rv};
        for (int i = 0; i < 3; i++) {
            const int w = i < 2 ? D : E;
            for (size_t j = 0; j < (size_t)N * w; j++)
                got[j] = whole[i][bh * N * w + j];
            snprintf(what, sizeof what, "%s (P=%d D=%d decay=%d init=%d dsn=%d bh=%zu seed %u)",
                     names[i], P, D, c->decay, c->init, c->dsn, bh, c->seed);
            case_check(what, got, ref[i], (size_t)N, (size_t)w, tol, &rel);
            worst = fmax(worst, rel);
        }
        for (size_t j = 0; j < DE; j++)
            got[j] = gs0[bh * DE + j];
        snprintf(what, sizeof what, "dS0 (P=%d D=%d decay=%d init=%d dsn=%d bh=%zu)", P, D,
                 c->decay, c->init, c->dsn, bh);
        case_check(what, got, rs0, (size_t)D, (size_t)E, tol, NULL);
    }
    double worst_ds = 0;
    for (int h = 0; c->decay && h < H; h++) {
        const double err = fabs((double)gds[0][h] - ref_ds[h]);
        if (!isfinite(gds[0][h]) || !(err <= tol * bound[h]))
            lj_test_fail(__FILE__, __LINE__, "ds[%d] = %.9g, reference %.9g (bound %.3g), P=%d", h,
                         (double)gds[0][h], ref_ds[h], tol * bound[h], P);
        if (bound[h] > 0)
            worst_ds = fmax(worst_ds, err / bound[h]);
        for (int r = 1; r < P; r++)
            if (memcmp(&gds[r][h], &gds[0][h], 4) != 0)
                lj_test_fail(__FILE__, __LINE__, "ds[%d]: rank %d has %.9g, rank 0 %.9g", h, r,
                             (double)gds[r][h], (double)gds[0][h]);
    }
    printf("P=%d D=%d N=%d decay=%d init=%d dsn=%d graph=%d keep=%d: worst rel L2 of dq/dk/dv "
           "%.3g, ds err/bound %.3g\n",
           P, D, N, c->decay, c->init, c->dsn, c->graph, c->keep, worst, worst_ds);

    for (int r = 0; r < P; r++) {
        CUdeviceptr *all[10] = {&rb[r].q,  &rb[r].k,  &rb[r].v,  &rb[r].dout, &rb[r].dq,
                                &rb[r].dk, &rb[r].dv, &rb[r].ds, &rb[r].o,    &rb[r].in};
        for (int i = 0; i < 10; i++)
            lj_gpu_free(*all[i]);
    }
    lj_gpu_free(d_s);
    lj_gpu_free(d_s0);
    lj_gpu_free(d_dsn);
    lj_gpu_free(d_ds0);
    lajit_ctx_destroy(ctx);
    void *host[] = {q,  k,  v,   dO, s0,  dsn, gq,   gk,   gv,   gs0, rq,
                    rk, rv, got, S0, dSN, rs0, x[0], x[1], x[2], x[3]};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
}

LJ_TEST(two_ranks)
{
    need_sm90a();
    for (int D = 64; D <= 128; D += 64)
        for (int decay = 0; decay < 3; decay++)
            for (int st = 0; st < 4; st++) {
                cp_case c = {.P = 2, .D = D, .decay = decay, .init = st & 1, .dsn = st >> 1};
                c.n[0] = 97;
                c.n[1] = 160;
                c.seed = 100u + (unsigned)(D + 10 * decay + st);
                run_case(&c, NULL);
            }
}

/* Three ranks: a one-token span, an empty first span (rank 0's dS_0 is what reaches it), an
 * empty last span (the last rank passes dS_N on by a copy), an empty middle span. */
LJ_TEST(three_ranks_ragged)
{
    need_sm90a();
    static const int spans[4][3] = {{64, 1, 130}, {0, 77, 5}, {33, 0, 1}, {70, 90, 0}};
    for (int D = 64; D <= 128; D += 64)
        for (int i = 0; i < 4; i++)
            for (int decay = 1; decay < 3; decay++) {
                cp_case c = {.P = 3, .D = D, .decay = decay, .init = 1, .dsn = 1};
                memcpy(c.n, spans[i], sizeof spans[i]);
                c.seed = 300u + (unsigned)(D + 10 * i + 3 * decay);
                run_case(&c, NULL);
            }
}

LJ_TEST(eight_ranks)
{
    need_sm90a();
    static const int spans[MAXP] = {50, 1, 0, 128, 17, 64, 200, 3};
    for (int D = 64; D <= 128; D += 64)
        for (int decay = 0; decay < 3; decay++)
            for (int st = 0; st < 4; st += 3) {
                cp_case c = {.P = 8, .D = D, .decay = decay, .init = st & 1, .dsn = st >> 1};
                memcpy(c.n, spans, sizeof spans);
                c.seed = 800u + (unsigned)(D + 10 * decay + st);
                run_case(&c, NULL);
            }
}

/* Long spans: the local and gradient states from split walks (few heads, thousands of tokens). */
LJ_TEST(long_spans)
{
    need_sm90a();
    cp_case c = {.P = 3, .D = 128, .decay = 2, .init = 1, .dsn = 1, .n = {9000, 4100, 12001}};
    c.seed = 4242;
    run_case(&c, NULL);
}

/* The workspace is sized by the first call; a replay of the captured call gives the same. */
LJ_TEST(graph_replay)
{
    need_sm90a();
    cp_case c = {.P = 3, .D = 128, .decay = 2, .init = 1, .dsn = 1, .graph = 1, .n = {40, 0, 90}};
    c.seed = 999;
    run_case(&c, NULL);
}

/* The real path: NCCL with one rank on device 0. */
LJ_TEST(nccl_one_rank)
{
    need_sm90a();
    const lj_nccl *nccl = lj_gpu_nccl();
    lj_nccl_comm comm = lj_gpu_nccl_one_rank();
    for (int decay = 0; decay < 3; decay += 2)
        for (int st = 0; st < 4; st += 3) {
            cp_case c = {.P = 1, .D = 128, .decay = decay, .init = st & 1, .dsn = st >> 1};
            c.n[0] = 150;
            c.seed = 1234u + (unsigned)(decay + st);
            run_case(&c, comm);
            c.xchg = LAJIT_CP_LOGSTEP;
            run_case(&c, comm);
        }
    ASSERT_EQ(nccl->ncclCommDestroy(comm), LJ_NCCL_SUCCESS);
}

/* The building block alone: lajit_attn_bwd with dq, dk and dv NULL writes dS_0 only (the local
 * gradient state Mg without dS_N, λ^N dS_N + Mg with it), on the default family (la_bwd_sm90,
 * split at few heads and long N) and on la_bwd's mma.sync kernels, against la_ref_backward's
 * dS_0 (which depends on q, dO, λ and dS_N only). */
static void state_only_case(const char *family, int N, int D, int E, int decay, int dsn,
                            unsigned seed)
{
    const lj_dtype dt = LJ_BF16;
    const size_t BH = (size_t)B * H, DE = (size_t)D * E;
    const float sigma = 1.0f / sqrtf((float)D);
    float *q = malloc(BH * N * D * 4), *dO = malloc(BH * N * E * 4), *hs = malloc(BH * DE * 4);
    float *g = malloc(BH * DE * 4), s[H] = {0.02f, 1.5f};
    case_seed(seed);
    case_random_fill(q, BH * N * D, 1.0f, dt);
    case_random_fill(dO, BH * N * E, 1.0f, dt);
    case_random_fill(hs, BH * DE, 0.1f, LJ_F32);
    lajit_ctx *ctx = case_open_ctx();
    CUdeviceptr d_q = lj_gpu_alloc(BH * N * D * 2), d_do = lj_gpu_alloc(BH * N * E * 2);
    CUdeviceptr d_s = lj_gpu_alloc(H * 4), d_dsn = lj_gpu_alloc(BH * DE * 4),
                d_ds0 = lj_gpu_alloc(BH * DE * 4);
    lj_gpu_upload_as(d_q, q, BH * N * D, dt);
    lj_gpu_upload_as(d_do, dO, BH * N * E, dt);
    lj_gpu_upload(d_s, s, H * 4);
    lj_gpu_upload(d_dsn, hs, BH * DE * 4);
    lj_gpu_poison(d_ds0, BH * DE * 4);
    const int64_t qs[4] = {B, H, N, D}, vs[4] = {B, H, N, E}, hsh[1] = {H}, ss[4] = {B, H, D, E};
    const DLDataType bf16 = lj_test_dl_dtype(dt), f32 = lj_test_dl_dtype(LJ_F32);
    lj_test_tensor tq, tdo, ts, tdsn, tds0;
    lajit_attn_bwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = lj_gpu_tensor(&tq, d_q, 0, 4, qs, NULL, bf16);
    a.dout = lj_gpu_tensor(&tdo, d_do, 0, 4, vs, NULL, bf16);
    a.s = decay ? lj_gpu_tensor(&ts, d_s, 0, 1, hsh, NULL, f32) : NULL;
    a.scale = sigma;
    a.d_final_state = dsn ? lj_gpu_tensor(&tdsn, d_dsn, 0, 4, ss, NULL, f32) : NULL;
    a.d_initial_state = lj_gpu_tensor(&tds0, d_ds0, 0, 4, ss, NULL, f32);
    a.family = family;
    lajit_status st = lajit_attn_bwd(ctx, &a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(st), lajit_errmsg(ctx));
    lj_gpu_sync();
    lj_gpu_download(g, d_ds0, BH * DE * 4);
    /* The reference needs k and v only for the parts not compared: zeros will do. */
    double *x[4], *rq = malloc((size_t)N * D * 8), *rk = malloc((size_t)N * D * 8);
    double *rv = malloc((size_t)N * E * 8), *dSN = malloc(DE * 8), *rs0 = malloc(DE * 8);
    double *got = malloc(DE * 8);
    for (int i = 0; i < 4; i++)
        x[i] = calloc((size_t)N * (i < 2 ? D : E), 8);
    double worst = 0;
    for (size_t bh = 0; bh < BH; bh++) {
        for (size_t i = 0; i < (size_t)N * D; i++)
            x[0][i] = q[bh * N * D + i];
        for (size_t i = 0; i < (size_t)N * E; i++)
            x[3][i] = dO[bh * N * E + i];
        for (size_t i = 0; i < DE; i++) {
            dSN[i] = hs[bh * DE + i];
            got[i] = g[bh * DE + i];
        }
        const double lambda = decay ? exp(-(double)s[bh % H]) : 1.0;
        double ds_unused, bound_unused;
        la_ref_backward(N, D, E, x[0], x[1], x[2], x[3], lambda, sigma, NULL, dsn ? dSN : NULL, rq,
                        rk, rv, rs0, &ds_unused, &bound_unused);
        char what[160];
        double rel;
        snprintf(what, sizeof what, "dS0 alone (%s N=%d D=%d E=%d decay=%d dsn=%d bh=%zu)",
                 family ? family : "default", N, D, E, decay, dsn, bh);
        case_check(what, got, rs0, (size_t)D, (size_t)E, case_tolerance(dt), &rel);
        worst = fmax(worst, rel);
    }
    printf("state only %s N=%d D=%d E=%d decay=%d dsn=%d: dS0 rel L2 %.3g\n",
           family ? family : "default", N, D, E, decay, dsn, worst);
    lj_gpu_free(d_q);
    lj_gpu_free(d_do);
    lj_gpu_free(d_s);
    lj_gpu_free(d_dsn);
    lj_gpu_free(d_ds0);
    lajit_ctx_destroy(ctx);
    void *host[] = {q, dO, hs, g, rq, rk, rv, dSN, rs0, got, x[0], x[1], x[2], x[3]};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
}

LJ_TEST(bwd_state_only_default)
{
    need_sm90a();
    state_only_case(NULL, 1, 128, 128, 1, 0, 11);
    state_only_case(NULL, 700, 64, 128, 1, 1, 12);
    state_only_case(NULL, 3000, 128, 128, 0, 1, 13);
    state_only_case(NULL, 20000, 128, 128, 1, 1, 14); /* B·H = 4: split walks */
}

LJ_TEST(bwd_state_only_la_bwd)
{
    lj_gpu_init();
    state_only_case("la_bwd", 1, 64, 64, 1, 1, 21);
    state_only_case("la_bwd", 333, 64, 96, 1, 0, 22);
    state_only_case("la_bwd", 2000, 128, 128, 0, 1, 23);
}

/* The log-step exchange (LAJIT_CP_LOGSTEP) in both directions: P = 2, 3 (an empty first, last and
 * middle span), 5 and 8, S_0, dS_N and ds; a graph replay. */
LJ_TEST(logstep_ranks)
{
    need_sm90a();
    static const int spans[5][MAXP] = {
        {97, 160}, {0, 77, 5}, {70, 90, 0}, {10, 20, 0, 40, 7}, {50, 1, 0, 128, 17, 64, 200, 3}};
    static const int Ps[5] = {2, 3, 3, 5, 8};
    for (int i = 0; i < 5; i++)
        for (int decay = 1; decay < 3; decay++) {
            cp_case c = {
                .P = Ps[i], .D = 64, .decay = decay, .init = 1, .dsn = 1, .xchg = LAJIT_CP_LOGSTEP};
            memcpy(c.n, spans[i], sizeof spans[i]);
            c.seed = 6000u + (unsigned)(10 * i + decay);
            run_case(&c, NULL);
        }
    cp_case g = {.P = 5,
                 .D = 128,
                 .decay = 2,
                 .init = 1,
                 .dsn = 1,
                 .graph = 1,
                 .xchg = LAJIT_CP_LOGSTEP,
                 .n = {40, 0, 90, 3, 64}};
    g.seed = 6999;
    run_case(&g, NULL);
}

/* The backward from the forward's incoming states (incoming_state), both exchanges: ragged spans
 * with empty first, middle and last ranks, S_0, dS_N, ds, strong decay and none; a graph replay of
 * the backward that skips its forward exchange; the NCCL path with one rank. Each case checks the
 * same bits as the backward that recomputes the states, then float64. */
LJ_TEST(keep_incoming_state)
{
    need_sm90a();
    /* The same bits need the forward the backward recomputes: not by segments. */
    setenv("LAJIT_CP_SEGMENTS", "off", 1);
    static const int spans[3][MAXP] = {{0, 77, 5}, {70, 90, 0}, {50, 1, 0, 128, 17, 64, 200, 3}};
    static const int Ps[3] = {3, 3, 8};
    for (int i = 0; i < 3; i++)
        for (int x = 0; x < 2; x++)
            for (int decay = 0; decay < 3; decay += 2) {
                cp_case c = {.P = Ps[i], .D = 64, .decay = decay, .init = 1, .dsn = 1, .keep = 1};
                c.xchg = x ? LAJIT_CP_LOGSTEP : LAJIT_CP_ALLGATHER;
                memcpy(c.n, spans[i], sizeof spans[i]);
                c.seed = 7000u + (unsigned)(10 * i + 3 * x + decay);
                run_case(&c, NULL);
            }
    cp_case g = {
        .P = 3, .D = 128, .decay = 2, .init = 1, .dsn = 1, .graph = 1, .keep = 1, .n = {40, 0, 90}};
    g.seed = 7999;
    run_case(&g, NULL);
    const lj_nccl *nccl = lj_gpu_nccl();
    lj_nccl_comm comm = lj_gpu_nccl_one_rank();
    cp_case one = {.P = 1, .D = 128, .decay = 2, .init = 1, .dsn = 1, .keep = 1, .n = {150}};
    one.seed = 7777;
    run_case(&one, comm);
    ASSERT_EQ(nccl->ncclCommDestroy(comm), LJ_NCCL_SUCCESS);
    /* The states of a forward by segments (two and three a span), both exchanges: the float64
     * checks on the backward from them. */
    static const char *const segs[2] = {"2", "3"};
    for (int x = 0; x < 2; x++) {
        setenv("LAJIT_CP_SEGMENTS", segs[x], 1);
        cp_case sg = {
            .P = 3, .D = 128, .decay = 2, .init = 1, .dsn = 1, .keep = 2, .n = {300, 200, 517}};
        sg.xchg = x ? LAJIT_CP_LOGSTEP : LAJIT_CP_ALLGATHER;
        sg.seed = 7100u + (unsigned)x;
        run_case(&sg, NULL);
    }
    unsetenv("LAJIT_CP_SEGMENTS");
}
