/* cp_fwd.c — context parallelism's forward on one GPU against the float64 whole sequence.
 *
 * Each case draws one batch of sequences (B = 2, H = 2, bf16 q, k, v rounded on the host), cuts
 * every sequence into P contiguous spans of ragged lengths (a span of 1 token and, where P
 * allows, an empty span included) and gives each span to a simulated rank: its own q, k, v, o
 * buffers, o and the final state NaN-poisoned. lajit__cp_attn_fwd_sim runs every rank's steps
 * with the all-gather replaced by device copies; the outputs, put back in sequence order, and
 * each rank's final state must match la_ref_forward over the whole sequence (DESIGN.md's check,
 * tests/support/attn_cases.c's bf16 tolerance). Cases: P = 2, 3, 8; no decay, s = 0 through the
 * decay path, strong decay (s up to 2); S_0 given or not; D = E = 64 and 128; one call replayed
 * from a captured CUDA graph (the first call sized the workspace). Then the real NCCL path with
 * a one-rank communicator (ncclCommInitAll on device 0), skipped with a message when
 * libnccl.so.2 cannot be loaded: set LAJIT_NCCL_PATH (e.g. the nvidia-nccl wheel's
 * site-packages/nvidia/nccl/lib/libnccl.so.2; the test looks there through python3 when the
 * variable is unset and the system has no libnccl.so.2). Needs an sm_90a GPU: the local states
 * come from la_fwd_sm90's state-only walk. The segments case runs the forward by segments
 * (LAJIT_CP_SEGMENTS). */
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
    int graph;     /* check a captured graph's replay of the call */
    unsigned xchg; /* LAJIT_CP_ALLGATHER, LAJIT_CP_LOGSTEP or 0 (the choice by P) */
    int n[MAXP];   /* span lengths */
    unsigned seed;
} cp_case;

typedef struct rank_bufs {
    CUdeviceptr q, k, v, o, sn;
    lj_test_tensor tq, tk, tv, to, tsn;
} rank_bufs;

static float rate(const cp_case *c, int h)
{
    return c->decay == 2 ? (h == 0 ? 0.05f : 2.0f) : 0.0f;
}

static void need_sm90a(void)
{
    lj_gpu_init();
    if (strcmp(lj_gpu_device()->info.arch, "sm_90a") != 0)
        lj_test_skip("context parallelism's local state needs la_fwd_sm90: an sm_90a GPU");
}

/* Runs one case through `call` (the simulated ranks, or the NCCL path when comm is given). */
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
    /* Host inputs [B,H,N,D] (whole sequence), rounded to bf16. */
    float *q = malloc(BH * N * D * 4), *k = malloc(BH * N * D * 4), *v = malloc(BH * N * E * 4);
    float *s0 = malloc(BH * DE * 4), s[H];
    case_seed(c->seed);
    case_random_fill(q, BH * N * D, 1.0f, dt);
    case_random_fill(k, BH * N * D, 1.0f, dt);
    case_random_fill(v, BH * N * E, 1.0f, dt);
    case_random_fill(s0, BH * DE, 1.0f, LJ_F32);
    for (int h = 0; h < H; h++)
        s[h] = rate(c, h);

    lajit_ctx *ctx = case_open_ctx();
    const DLDataType bf16 = lj_test_dl_dtype(dt), f32 = lj_test_dl_dtype(LJ_F32);
    CUdeviceptr ds = lj_gpu_alloc(H * 4), ds0 = lj_gpu_alloc(BH * DE * 4);
    lj_gpu_upload(ds, s, H * 4);
    lj_gpu_upload(ds0, s0, BH * DE * 4);
    lj_test_tensor ts, ts0;
    const int64_t hshape[1] = {H}, sshape[4] = {B, H, D, E};
    rank_bufs rb[MAXP];
    lajit_cp_attn_fwd_args a[MAXP];
    for (int r = 0; r < P; r++) {
        const int n = c->n[r];
        const size_t qn = BH * n * D, vn = BH * n * E;
        rank_bufs *u = &rb[r];
        u->q = lj_gpu_alloc(qn * 2 + 16);
        u->k = lj_gpu_alloc(qn * 2 + 16);
        u->v = lj_gpu_alloc(vn * 2 + 16);
        u->o = lj_gpu_alloc(vn * 2 + 16);
        u->sn = lj_gpu_alloc(BH * DE * 4);
        /* The span's tokens of every (b, h). */
        float *tq = malloc(qn * 4 + 4), *tk = malloc(qn * 4 + 4), *tv = malloc(vn * 4 + 4);
        for (size_t bh = 0; bh < BH; bh++) {
            memcpy(tq + bh * n * D, q + (bh * N + start[r]) * D, (size_t)n * D * 4);
            memcpy(tk + bh * n * D, k + (bh * N + start[r]) * D, (size_t)n * D * 4);
            memcpy(tv + bh * n * E, v + (bh * N + start[r]) * E, (size_t)n * E * 4);
        }
        if (n) {
            lj_gpu_upload_as(u->q, tq, qn, dt);
            lj_gpu_upload_as(u->k, tk, qn, dt);
            lj_gpu_upload_as(u->v, tv, vn, dt);
            lj_gpu_poison(u->o, vn * 2);
        }
        lj_gpu_poison(u->sn, BH * DE * 4);
        free(tq);
        free(tk);
        free(tv);
        const int64_t qs[4] = {B, H, n, D}, vs[4] = {B, H, n, E};
        memset(&a[r], 0, sizeof a[r]);
        a[r].struct_size = sizeof a[r];
        a[r].comm = comm;
        a[r].q = lj_gpu_tensor(&u->tq, u->q, 0, 4, qs, NULL, bf16);
        a[r].k = lj_gpu_tensor(&u->tk, u->k, 0, 4, qs, NULL, bf16);
        a[r].v = lj_gpu_tensor(&u->tv, u->v, 0, 4, vs, NULL, bf16);
        a[r].o = lj_gpu_tensor(&u->to, u->o, 0, 4, vs, NULL, bf16);
        a[r].s = c->decay ? lj_gpu_tensor(&ts, ds, 0, 1, hshape, NULL, f32) : NULL;
        a[r].scale = sigma;
        a[r].flags = c->xchg;
        a[r].initial_state = c->init ? lj_gpu_tensor(&ts0, ds0, 0, 4, sshape, NULL, f32) : NULL;
        a[r].final_state = lj_gpu_tensor(&u->tsn, u->sn, 0, 4, sshape, NULL, f32);
    }

    lajit_status st;
    if (comm) {
        ASSERT_EQ(P, 1);
        st = lajit_cp_attn_fwd(ctx, &a[0]);
    } else {
        st = lajit__cp_attn_fwd_sim(ctx, P, a);
    }
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(st), lajit_errmsg(ctx));
    if (c->graph) {
        /* Poison again, then replay the same call from a captured graph on a stream of ours. */
        const lj_driver *drv = lj_gpu_driver();
        CUstream stream;
        CUgraph graph;
        CUgraphExec exec;
        lj_gpu_sync();
        ASSERT_EQ(drv->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
        for (int r = 0; r < P; r++) {
            a[r].stream = stream;
            if (c->n[r])
                lj_gpu_poison(rb[r].o, BH * c->n[r] * E * 2);
            lj_gpu_poison(rb[r].sn, BH * DE * 4);
        }
        lj_gpu_sync(); /* the memsets ran on the legacy stream, which ours does not wait for */
        /* One uncaptured call on the new stream first: the workspace is the context's. */
        ASSERT_OK(lajit__cp_attn_fwd_sim(ctx, P, a));
        lj_gpu_stream_sync(stream);
        for (int r = 0; r < P; r++) {
            if (c->n[r])
                lj_gpu_poison(rb[r].o, BH * c->n[r] * E * 2);
            lj_gpu_poison(rb[r].sn, BH * DE * 4);
        }
        lj_gpu_sync();
        ASSERT_EQ(drv->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                  CUDA_SUCCESS);
        st = lajit__cp_attn_fwd_sim(ctx, P, a);
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

    /* The reference over each whole sequence, and the spans' outputs put back in order. */
    const double tol = case_tolerance(dt);
    double *dq = malloc((size_t)N * D * 8), *dk = malloc((size_t)N * D * 8);
    double *dv = malloc((size_t)N * E * 8), *ref = malloc((size_t)N * E * 8);
    double *got = malloc((size_t)N * E * 8), *S0 = malloc(DE * 8), *SN = malloc(DE * 8);
    double *gsn = malloc(DE * 8);
    float *ho = malloc(BH * N * E * 4 + 4), *hs = malloc(BH * DE * 4);
    for (int r = 0; r < P; r++) {
        const size_t vn = BH * c->n[r] * E;
        if (!vn)
            continue;
        float *tmp = malloc(vn * 4);
        lj_gpu_download_as(tmp, rb[r].o, vn, dt);
        for (size_t bh = 0; bh < BH; bh++)
            memcpy(ho + (bh * N + start[r]) * E, tmp + bh * c->n[r] * E, (size_t)c->n[r] * E * 4);
        free(tmp);
    }
    double worst = 0;
    for (size_t bh = 0; bh < BH; bh++) {
        const int h = (int)(bh % H);
        for (size_t i = 0; i < (size_t)N * D; i++) {
            dq[i] = q[bh * N * D + i];
            dk[i] = k[bh * N * D + i];
        }
        for (size_t i = 0; i < (size_t)N * E; i++) {
            dv[i] = v[bh * N * E + i];
            got[i] = ho[bh * N * E + i];
        }
        for (size_t i = 0; i < DE; i++)
            S0[i] = s0[bh * DE + i];
        const double lambda = c->decay ? exp(-(double)s[h]) : 1.0;
        la_ref_forward(N, D, E, dq, dk, dv, lambda, sigma, c->init ? S0 : NULL, ref, SN);
        char what[128];
        double rel;
        snprintf(what, sizeof what, "o (P=%d D=%d decay=%d init=%d b,h=%zu seed %u)", P, D,
                 c->decay, c->init, bh, c->seed);
        case_check(what, got, ref, (size_t)N, (size_t)E, tol, &rel);
        worst = fmax(worst, rel);
        for (int r = 0; r < P; r++) {
            lj_gpu_download(hs, rb[r].sn, BH * DE * 4);
            for (size_t i = 0; i < DE; i++)
                gsn[i] = hs[bh * DE + i];
            snprintf(what, sizeof what,
                     "final_state of rank %d (P=%d D=%d decay=%d init=%d bh=%zu)", r, P, D,
                     c->decay, c->init, bh);
            case_check(what, gsn, SN, (size_t)D, (size_t)E, tol, NULL);
        }
    }
    printf("P=%d D=%d N=%d decay=%d init=%d graph=%d: worst relative L2 of o %.3g\n", P, D, N,
           c->decay, c->init, c->graph, worst);

    for (int r = 0; r < P; r++) {
        lj_gpu_free(rb[r].q);
        lj_gpu_free(rb[r].k);
        lj_gpu_free(rb[r].v);
        lj_gpu_free(rb[r].o);
        lj_gpu_free(rb[r].sn);
    }
    lj_gpu_free(ds);
    lj_gpu_free(ds0);
    lajit_ctx_destroy(ctx);
    free(q);
    free(k);
    free(v);
    free(s0);
    free(dq);
    free(dk);
    free(dv);
    free(ref);
    free(got);
    free(S0);
    free(SN);
    free(gsn);
    free(ho);
    free(hs);
}

LJ_TEST(two_ranks)
{
    need_sm90a();
    for (int D = 64; D <= 128; D += 64)
        for (int decay = 0; decay < 3; decay++)
            for (int init = 0; init < 2; init++) {
                cp_case c = {.P = 2, .D = D, .decay = decay, .init = init, .n = {97, 160}};
                c.seed = 100u + (unsigned)(D + 10 * decay + init);
                run_case(&c, NULL);
            }
}

/* Three ranks: a one-token span, an empty first span (rank 0 passes S_0 on by a copy), an empty
 * middle span. */
LJ_TEST(three_ranks_ragged)
{
    need_sm90a();
    static const int spans[3][3] = {{64, 1, 130}, {0, 77, 5}, {33, 0, 1}};
    for (int D = 64; D <= 128; D += 64)
        for (int i = 0; i < 3; i++)
            for (int decay = 0; decay < 3; decay += 2)
                for (int init = 0; init < 2; init++) {
                    cp_case c = {.P = 3, .D = D, .decay = decay, .init = init};
                    memcpy(c.n, spans[i], sizeof spans[i]);
                    c.seed = 300u + (unsigned)(D + 10 * i + 3 * decay + init);
                    run_case(&c, NULL);
                }
}

LJ_TEST(eight_ranks)
{
    need_sm90a();
    for (int D = 64; D <= 128; D += 64)
        for (int decay = 0; decay < 3; decay++)
            for (int init = 0; init < 2; init++) {
                cp_case c = {.P = 8,
                             .D = D,
                             .decay = decay,
                             .init = init,
                             .n = {50, 1, 0, 128, 17, 64, 200, 3}};
                c.seed = 800u + (unsigned)(D + 10 * decay + init);
                run_case(&c, NULL);
            }
}

/* The workspace is sized by the first call; a replay of the captured call gives the same. */
LJ_TEST(graph_replay)
{
    need_sm90a();
    cp_case c = {.P = 3, .D = 128, .decay = 2, .init = 1, .graph = 1, .n = {40, 0, 90}};
    c.seed = 999;
    run_case(&c, NULL);
}

/* The real path: NCCL with one rank on device 0. */
LJ_TEST(nccl_one_rank)
{
    need_sm90a();
    const lj_nccl *nccl = lj_gpu_nccl();
    printf("NCCL %d\n", nccl->version);
    lj_nccl_comm comm = lj_gpu_nccl_one_rank();
    for (int decay = 0; decay < 3; decay += 2)
        for (int init = 0; init < 2; init++) {
            cp_case c = {.P = 1, .D = 128, .decay = decay, .init = init, .n = {150}};
            c.seed = 1234u + (unsigned)(decay + init);
            run_case(&c, comm);
            c.xchg = LAJIT_CP_LOGSTEP; /* no steps; S_N through a one-rank ncclBroadcast */
            run_case(&c, comm);
        }
    ASSERT_EQ(nccl->ncclCommDestroy(comm), LJ_NCCL_SUCCESS);
}

/* The log-step exchange (LAJIT_CP_LOGSTEP): P = 2, 3 (ragged, empty first and middle spans), 5
 * and 8 (three combining steps, a rank past the last power of two), S_0 and S_N, decay or not;
 * a graph replay; P = 8 without the flag (the all-gather by default) beside it. */
LJ_TEST(logstep_ranks)
{
    need_sm90a();
    static const int spans[5][MAXP] = {
        {97, 160}, {0, 77, 5}, {33, 0, 1}, {10, 20, 0, 40, 7}, {50, 1, 0, 128, 17, 64, 200, 3}};
    static const int Ps[5] = {2, 3, 3, 5, 8};
    for (int i = 0; i < 5; i++)
        for (int decay = 0; decay < 3; decay += 2)
            for (int init = 0; init < 2; init++) {
                cp_case c = {
                    .P = Ps[i], .D = 64, .decay = decay, .init = init, .xchg = LAJIT_CP_LOGSTEP};
                memcpy(c.n, spans[i], sizeof spans[i]);
                c.seed = 5000u + (unsigned)(10 * i + 3 * decay + init);
                run_case(&c, NULL);
            }
    cp_case g = {.P = 5,
                 .D = 128,
                 .decay = 2,
                 .init = 1,
                 .graph = 1,
                 .xchg = LAJIT_CP_LOGSTEP,
                 .n = {40, 0, 90, 3, 64}};
    g.seed = 5999;
    run_case(&g, NULL);
}

/* The forward by segments (LAJIT_CP_SEGMENTS, cp_segments.c): each rank's span cut into forced
 * or automatic segments (a tail included), both exchanges, S_0 or not, strong decay and none; a
 * graph replay; the one-rank NCCL path. The same checks against float64 as every case. */
LJ_TEST(segments)
{
    need_sm90a();
    static const int spans[3][MAXP] = {{900, 0, 1300}, {130, 700, 64}, {4100, 9000, 12001}};
    static const char *const setting[3] = {"3", "2", "auto"};
    for (int i = 0; i < 3; i++) {
        setenv("LAJIT_CP_SEGMENTS", setting[i], 1); /* read when run_case opens its context */
        for (int x = 0; x < 2; x++)
            for (int decay = 0; decay < 3; decay += 2) {
                cp_case c = {.P = 3,
                             .D = i == 2 ? 128 : 64,
                             .decay = decay,
                             .init = decay == 2,
                             .xchg = x ? LAJIT_CP_LOGSTEP : LAJIT_CP_ALLGATHER};
                memcpy(c.n, spans[i], sizeof spans[i]);
                c.seed = 9000u + (unsigned)(10 * i + 3 * x + decay);
                run_case(&c, NULL);
            }
    }
    setenv("LAJIT_CP_SEGMENTS", "4", 1);
    cp_case g = {.P = 3, .D = 128, .decay = 2, .init = 1, .graph = 1, .n = {1000, 0, 700}};
    g.seed = 9999;
    run_case(&g, NULL);
    const lj_nccl *nccl = lj_gpu_nccl();
    lj_nccl_comm comm = lj_gpu_nccl_one_rank();
    cp_case one = {.P = 1, .D = 128, .decay = 2, .init = 1, .n = {2000}};
    one.seed = 9998;
    run_case(&one, comm);
    ASSERT_EQ(nccl->ncclCommDestroy(comm), LJ_NCCL_SUCCESS);
    unsetenv("LAJIT_CP_SEGMENTS");
}
