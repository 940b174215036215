/* cp_multi.c — context parallelism over real ranks: one process per GPU, an NCCL communicator
 * made with ncclCommInitRank, each rank's outputs and gradients against the float64 whole
 * sequence.
 *
 * The case's own process (the launcher) never touches CUDA, because a child forked after cuInit
 * cannot use the driver. A first child reports the device count and device 0's arch (its
 * lj_gpu_init skips the case when there is no GPU); the launcher loads NCCL (the case is
 * skipped without it), draws every case's inputs on the host and forks P ranks, which inherit
 * them. Rank r opens device r, joins the communicator (rank 0 makes the id: shared memory,
 * released through a pipe), uploads its span of each case, makes the calls on a stream of its
 * own and writes its outputs, widened to float, into shared memory at its span's place. When
 * every rank has exited with 0, the launcher checks the assembled results against la_ref over
 * each whole sequence (DESIGN.md's checks, tests/support's bf16 tolerance): o, every rank's
 * final state against S_N; with the backward dq, dk, dv, rank 0's dS_0 and ds (its normwise
 * bound, and the same bits on every rank). A rank that fails (an assertion, a lajit status)
 * exits with 1; the launcher then kills the others, which would wait in a collective for ever,
 * and fails.
 *
 * P is the device count, or LAJIT_CP_TEST_GPUS (at most the count); with one GPU the case runs
 * one rank and says so. Spans are ragged: different lengths, a one-token span, and for P > 2 an
 * empty span (a middle rank's, or rank 0's, which passes S_0 on). Both exchanges
 * (LAJIT_CP_ALLGATHER, LAJIT_CP_LOGSTEP) in every group. B = 2, H = 2, bf16; no decay,
 * s = 0 through the decay path, strong decay (s up to 2); S_0 and dS_N given or not; D = E = 64
 * and 128; outputs, states and gradients NaN-poisoned on the device and in shared memory.
 * graph_replay also captures each call in a CUDA graph on every rank and replays it: the replays
 * must give the direct calls' bits. Needs sm_90a, as tests/gpu/cp_fwd.c does. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attn_cases.h"
#include "gpu.h"
#include "la_ref.h"
#include "nccl.h"
#include "test.h"

enum { B = 2, H = 2, MAXP = 16, MAXCASES = 32, TIMEOUT_S = 480 };

/* What the ranks computed, widened to float, in shared memory: o [B,H,N,E] and every rank's
 * final state [P][B,H,D,E]; with the backward dq, dk [B,H,N,D], dv [B,H,N,E], every rank's ds
 * [P][H] and rank 0's dS_0 [B,H,D,E]. */
typedef struct mp_out {
    float *o, *sn, *dq, *dk, *dv, *ds, *ds0;
} mp_out;

typedef struct mp_case {
    int D;           /* E = D */
    int decay;       /* 0: s NULL; 1: s = 0 (the decay path, λ = 1); 2: strong */
    int init;        /* S_0 given (rank 0 reads it) */
    int bwd;         /* also the backward: dq, dk, dv, dS_0, and ds when s is given */
    int dsn;         /* backward: dS_N given (the last rank reads it) */
    int empty_first; /* P > 2: rank 0's span is the empty one (else a middle rank's) */
    int graph;       /* also replay captured graphs of the calls */
    int logstep;     /* the exchange: 0 LAJIT_CP_ALLGATHER, 1 LAJIT_CP_LOGSTEP */
    int keep;        /* the forward writes incoming_state, the backward starts from it */
    unsigned seed;
    /* Filled by the launcher before the fork. */
    int P, N, n[MAXP], start[MAXP + 1];
    /* Host, the whole sequence: q, k [B,H,N,D], v, dO [B,H,N,E], S_0, dS_N [B,H,D,E]. */
    float *q, *k, *v, *dout, *s0, *dsn_h, s[H];
    mp_out out, graph_out; /* the direct calls', the graph replays' */
    float *shared;
    size_t shared_bytes;
} mp_case;

/* Shared with the ranks: what the probe found, and the NCCL id. */
typedef struct mp_shared {
    int devices;
    char arch[16];
    lj_nccl_unique_id id;
} mp_shared;

static float rate(const mp_case *c, int h)
{
    return c->decay == 2 ? (h == 0 ? 0.05f : 2.0f) : 0.0f;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- One rank ------------------------------------------------------------------------------ */

static int g_rank = -1; /* in a rank: its index, for messages */

static void rank_fail_status(lajit_ctx *ctx, lajit_status st, const char *what)
{
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "rank %d: %s: %s: %s", g_rank, what,
                     lajit_status_string(st), lajit_errmsg(ctx));
}

static void nccl_ok(const lj_nccl *nccl, lj_nccl_result r, const char *what)
{
    if (r != LJ_NCCL_SUCCESS)
        lj_test_fail(__FILE__, __LINE__, "rank %d: %s: NCCL error %d: %s", g_rank, what, r,
                     nccl->ncclGetErrorString(r));
}

/* The span's values of a [B,H,N,X] host array, widened from the device's bf16 into shared
 * memory at the span's place (or copied out of it for the upload). */
static void span_rows(const mp_case *c, int r, int X, float *whole, float *span, int to_span)
{
    const int n = c->n[r], N = c->N;
    for (size_t bh = 0; bh < (size_t)B * H; bh++) {
        float *w = whole + (bh * N + (size_t)c->start[r]) * X, *p = span + bh * n * X;
        memcpy(to_span ? p : w, to_span ? w : p, (size_t)n * X * 4);
    }
}

/* Downloads this rank's span of a [B,H,n,X] bf16 device tensor into whole [B,H,N,X]. */
static void collect_span(const mp_case *c, int r, CUdeviceptr x, float *whole)
{
    const size_t n = (size_t)B * H * c->n[r] * c->D; /* X = D = E */
    if (!n)
        return;
    float *tmp = malloc(n * 4);
    lj_gpu_download_as(tmp, x, n, LJ_BF16);
    span_rows(c, r, c->D, whole, tmp, 0);
    free(tmp);
}

/* The forward's outputs: o (this rank's span) and its final state. */
static void collect(const mp_case *c, int r, CUdeviceptr o, CUdeviceptr sn, const mp_out *out)
{
    const size_t BH = (size_t)B * H, DE = (size_t)c->D * c->D;
    collect_span(c, r, o, out->o);
    lj_gpu_download(out->sn + (size_t)r * BH * DE, sn, BH * DE * 4);
}

/* Runs `call` once on stream, or (graph) captures it in a graph and replays that. */
typedef lajit_status (*rank_call)(lajit_ctx *ctx, const void *args);
static lajit_status call_fwd(lajit_ctx *ctx, const void *args)
{
    return lajit_cp_attn_fwd(ctx, args);
}
static lajit_status call_bwd(lajit_ctx *ctx, const void *args)
{
    return lajit_cp_attn_bwd(ctx, args);
}

static void run_call(lajit_ctx *ctx, CUstream stream, rank_call call, const void *args, int graph,
                     const char *what)
{
    if (!graph) {
        rank_fail_status(ctx, call(ctx, args), what);
        lj_gpu_stream_sync(stream);
        return;
    }
    /* The workspace was sized by the direct call before. */
    const lj_driver *drv = lj_gpu_driver();
    CUgraph g;
    CUgraphExec exec;
    ASSERT_EQ(drv->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
    lajit_status st = call(ctx, args);
    ASSERT_EQ(drv->cuStreamEndCapture(stream, &g), CUDA_SUCCESS);
    rank_fail_status(ctx, st, what);
    ASSERT_EQ(drv->cuGraphInstantiate(&exec, g, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
    lj_gpu_stream_sync(stream);
    drv->cuGraphExecDestroy(exec);
    drv->cuGraphDestroy(g);
}

/* The backward of the forward call f (its q, k, v, s, scale, S_0 and stream): dO and dS_N from
 * the case, dq, dk, dv, ds and dS_0 NaN-poisoned, then collected (and again from a graph). */
static void rank_bwd(lajit_ctx *ctx, CUstream stream, const mp_case *c, int r,
                     const lajit_cp_attn_fwd_args *f)
{
    const int n = c->n[r], D = c->D, E = c->D;
    const size_t BH = (size_t)B * H, DE = (size_t)D * E, qn = BH * n * D, vn = BH * n * E;
    const DLDataType bf16 = lj_test_dl_dtype(LJ_BF16), f32 = lj_test_dl_dtype(LJ_F32);
    CUdeviceptr g = lj_gpu_alloc(vn * 2 + 16), dq = lj_gpu_alloc(qn * 2 + 16),
                dk = lj_gpu_alloc(qn * 2 + 16), dv = lj_gpu_alloc(vn * 2 + 16),
                ds = lj_gpu_alloc(H * 4), ds0 = lj_gpu_alloc(BH * DE * 4),
                dsn = lj_gpu_alloc(BH * DE * 4);
    float *tmp = malloc(vn * 4 + 4);
    span_rows(c, r, E, c->dout, tmp, 1);
    lj_gpu_upload_as(g, tmp, vn, LJ_BF16);
    free(tmp);
    lj_gpu_upload(dsn, c->dsn_h, BH * DE * 4);
    lj_test_tensor tg, tdq, tdk, tdv, tds, tds0, tdsn;
    const int64_t qs[4] = {B, H, n, D}, vs[4] = {B, H, n, E}, hs[1] = {H};
    const int64_t ss[4] = {B, H, D, E};
    lajit_cp_attn_bwd_args b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.comm = f->comm;
    b.q = f->q;
    b.k = f->k;
    b.v = f->v;
    b.dout = lj_gpu_tensor(&tg, g, 0, 4, vs, NULL, bf16);
    b.dq = lj_gpu_tensor(&tdq, dq, 0, 4, qs, NULL, bf16);
    b.dk = lj_gpu_tensor(&tdk, dk, 0, 4, qs, NULL, bf16);
    b.dv = lj_gpu_tensor(&tdv, dv, 0, 4, vs, NULL, bf16);
    b.s = f->s;
    b.ds = f->s ? lj_gpu_tensor(&tds, ds, 0, 1, hs, NULL, f32) : NULL;
    b.scale = f->scale;
    b.initial_state = f->initial_state;
    b.d_initial_state = lj_gpu_tensor(&tds0, ds0, 0, 4, ss, NULL, f32);
    b.d_final_state = c->dsn ? lj_gpu_tensor(&tdsn, dsn, 0, 4, ss, NULL, f32) : NULL;
    b.flags = f->flags;
    b.stream = stream;
    b.incoming_state = f->incoming_state;
    for (int graph = 0; graph <= c->graph; graph++) {
        lj_gpu_poison(dq, qn * 2 + 16);
        lj_gpu_poison(dk, qn * 2 + 16);
        lj_gpu_poison(dv, vn * 2 + 16);
        lj_gpu_poison(ds, H * 4);
        lj_gpu_poison(ds0, BH * DE * 4);
        lj_gpu_sync();
        run_call(ctx, stream, call_bwd, &b, graph,
                 graph ? "lajit_cp_attn_bwd (graph)" : "lajit_cp_attn_bwd");
        const mp_out *out = graph ? &c->graph_out : &c->out;
        collect_span(c, r, dq, out->dq);
        collect_span(c, r, dk, out->dk);
        collect_span(c, r, dv, out->dv);
        if (f->s)
            lj_gpu_download(out->ds + (size_t)r * H, ds, H * 4);
        if (r == 0)
            lj_gpu_download(out->ds0, ds0, BH * DE * 4);
    }
    CUdeviceptr frees[] = {g, dq, dk, dv, ds, ds0, dsn};
    for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++)
        lj_gpu_free(frees[i]);
}

static void rank_case(lajit_ctx *ctx, void *comm, CUstream stream, const mp_case *c, int r)
{
    const int n = c->n[r], D = c->D, E = c->D;
    const size_t BH = (size_t)B * H, DE = (size_t)D * E, qn = BH * n * D, vn = BH * n * E;
    const DLDataType bf16 = lj_test_dl_dtype(LJ_BF16), f32 = lj_test_dl_dtype(LJ_F32);
    CUdeviceptr q = lj_gpu_alloc(qn * 2 + 16), k = lj_gpu_alloc(qn * 2 + 16),
                v = lj_gpu_alloc(vn * 2 + 16), o = lj_gpu_alloc(vn * 2 + 16),
                sn = lj_gpu_alloc(BH * DE * 4), dev_s = lj_gpu_alloc(H * 4),
                dev_s0 = lj_gpu_alloc(BH * DE * 4), in = lj_gpu_alloc(BH * DE * 4);
    float *tmp = malloc(qn * 4 + vn * 4 + 4);
    span_rows(c, r, D, c->q, tmp, 1);
    lj_gpu_upload_as(q, tmp, qn, LJ_BF16);
    span_rows(c, r, D, c->k, tmp, 1);
    lj_gpu_upload_as(k, tmp, qn, LJ_BF16);
    span_rows(c, r, E, c->v, tmp, 1);
    lj_gpu_upload_as(v, tmp, vn, LJ_BF16);
    free(tmp);
    lj_gpu_upload(dev_s, c->s, H * 4);
    lj_gpu_upload(dev_s0, c->s0, BH * DE * 4);
    lj_gpu_poison(o, vn * 2 + 16);
    lj_gpu_poison(sn, BH * DE * 4);
    lj_gpu_poison(in, BH * DE * 4); /* rank 0's stays so: neither written nor read */
    lj_gpu_sync(); /* the memsets ran on the legacy stream, which ours does not wait for */

    lj_test_tensor tq, tk, tv, to, tsn, ts, ts0, tin;
    const int64_t qs[4] = {B, H, n, D}, vs[4] = {B, H, n, E}, hs[1] = {H};
    const int64_t ss[4] = {B, H, D, E};
    lajit_cp_attn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.comm = comm;
    a.q = lj_gpu_tensor(&tq, q, 0, 4, qs, NULL, bf16);
    a.k = lj_gpu_tensor(&tk, k, 0, 4, qs, NULL, bf16);
    a.v = lj_gpu_tensor(&tv, v, 0, 4, vs, NULL, bf16);
    a.o = lj_gpu_tensor(&to, o, 0, 4, vs, NULL, bf16);
    a.s = c->decay ? lj_gpu_tensor(&ts, dev_s, 0, 1, hs, NULL, f32) : NULL;
    a.scale = 1.0f / sqrtf((float)D);
    a.initial_state = c->init ? lj_gpu_tensor(&ts0, dev_s0, 0, 4, ss, NULL, f32) : NULL;
    a.final_state = lj_gpu_tensor(&tsn, sn, 0, 4, ss, NULL, f32);
    a.flags = c->logstep ? LAJIT_CP_LOGSTEP : LAJIT_CP_ALLGATHER;
    a.stream = stream;
    a.incoming_state = c->keep ? lj_gpu_tensor(&tin, in, 0, 4, ss, NULL, f32) : NULL;
    for (int graph = 0; graph <= c->graph; graph++) {
        if (graph) { /* poisoned again: the replay must write everything itself */
            lj_gpu_poison(o, vn * 2 + 16);
            lj_gpu_poison(sn, BH * DE * 4);
            lj_gpu_poison(in, BH * DE * 4);
            lj_gpu_sync();
        }
        run_call(ctx, stream, call_fwd, &a, graph,
                 graph ? "lajit_cp_attn_fwd (graph)" : "lajit_cp_attn_fwd");
        collect(c, r, o, sn, graph ? &c->graph_out : &c->out);
    }
    if (c->keep && r == 0) { /* rank 0's incoming state is S_0: nothing written */
        uint32_t *words = malloc(BH * DE * 4);
        lj_gpu_download(words, in, BH * DE * 4);
        for (size_t i = 0; i < BH * DE; i++)
            if (words[i] != 0xFFFFFFFFu)
                lj_test_fail(__FILE__, __LINE__, "rank 0's incoming_state was written (word %zu)",
                             i);
        free(words);
    }
    if (c->bwd)
        rank_bwd(ctx, stream, c, r, &a);
    CUdeviceptr frees[] = {q, k, v, o, sn, dev_s, dev_s0, in};
    for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++)
        lj_gpu_free(frees[i]);
}

/* Rank r: runs in a forked child and ends it. idfd: the pipe's write end on rank 0 (one byte
 * per other rank once the id is in shared memory), its read end elsewhere. */
static void rank_main(mp_case *cases, int ncases, int r, int P, const lj_nccl *nccl, mp_shared *sh,
                      int idfd) __attribute__((noreturn));
static void rank_main(mp_case *cases, int ncases, int r, int P, const lj_nccl *nccl, mp_shared *sh,
                      int idfd)
{
    g_rank = r;
    lj_gpu_init_device(r);
    if (r == 0) {
        nccl_ok(nccl, nccl->ncclGetUniqueId(&sh->id), "ncclGetUniqueId");
        for (int i = 1; i < P; i++)
            if (write(idfd, "x", 1) != 1)
                lj_test_fail(__FILE__, __LINE__, "rank 0: handing out the NCCL id: %s",
                             strerror(errno));
    } else {
        char x;
        if (read(idfd, &x, 1) != 1)
            lj_test_fail(__FILE__, __LINE__, "rank %d: rank 0 ended before making the NCCL id", r);
    }
    close(idfd);
    /* NCCL joins on the device of the context current on this thread: device r's. */
    lj_nccl_comm comm = NULL;
    nccl_ok(nccl, nccl->ncclCommInitRank(&comm, P, sh->id, r), "ncclCommInitRank");
    int dev = -1;
    nccl_ok(nccl, nccl->ncclCommCuDevice(comm, &dev), "ncclCommCuDevice");
    ASSERT_EQ(dev, r);
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.device = r;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    CUstream stream;
    ASSERT_EQ(lj_gpu_driver()->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    for (int i = 0; i < ncases; i++)
        rank_case(ctx, comm, stream, &cases[i], r);
    lj_gpu_stream_sync(stream);
    nccl_ok(nccl, nccl->ncclCommDestroy(comm), "ncclCommDestroy");
    lj_gpu_driver()->cuStreamDestroy(stream);
    lajit_ctx_destroy(ctx);
    fflush(NULL);
    _exit(0);
}

/* ---- The launcher -------------------------------------------------------------------------- */

/* Waits for the n children in pids; when one fails or the time runs out, kills the others.
 * Returns the first failed rank, or -1 when all exited with 0 (*status: the failed one's). */
static int wait_ranks(pid_t *pids, int n, int *failed_status)
{
    int alive = n, failed = -1;
    const double end = now_s() + TIMEOUT_S;
    while (alive > 0) {
        int status;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p < 0)
            lj_test_fail(__FILE__, __LINE__, "waitpid: %s", strerror(errno));
        if (p == 0) {
            if (failed < 0 && now_s() > end) {
                fprintf(stderr, "ranks still running after %d s: stopped\n", TIMEOUT_S);
                failed = n;
                *failed_status = -1;
            }
            if (failed >= 0)
                for (int i = 0; i < n; i++)
                    if (pids[i] > 0)
                        kill(pids[i], SIGKILL);
            struct timespec pause = {0, 20 * 1000 * 1000};
            nanosleep(&pause, NULL);
            continue;
        }
        for (int i = 0; i < n; i++) {
            if (pids[i] != p)
                continue;
            pids[i] = 0;
            alive--;
            if ((!WIFEXITED(status) || WEXITSTATUS(status) != 0) && failed < 0) {
                failed = i;
                *failed_status = status;
            }
        }
    }
    return failed;
}

/* The number of ranks: the device count or LAJIT_CP_TEST_GPUS; skips without a GPU, an sm_90a
 * device 0 or NCCL. */
static int ranks_or_skip(mp_shared *sh, const lj_nccl **nccl)
{
    sh->devices = 0;
    fflush(NULL);
    pid_t p = fork();
    if (p < 0)
        lj_test_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
    if (p == 0) {
        lj_gpu_init(); /* exits 77 with no GPU */
        int n = 0;
        if (lj_gpu_driver()->cuDeviceGetCount(&n) != CUDA_SUCCESS)
            n = -1;
        snprintf(sh->arch, sizeof sh->arch, "%s", lj_gpu_device()->info.arch);
        sh->devices = n;
        fflush(NULL);
        _exit(0);
    }
    int status;
    if (waitpid(p, &status, 0) != p || !WIFEXITED(status))
        lj_test_fail(__FILE__, __LINE__, "the device probe did not exit");
    if (WEXITSTATUS(status) == 77)
        lj_test_skip("no GPU (the probe's message is above)");
    if (WEXITSTATUS(status) != 0 || sh->devices < 1)
        lj_test_fail(__FILE__, __LINE__, "the device probe failed (status %d, %d devices)",
                     WEXITSTATUS(status), sh->devices);
    if (strcmp(sh->arch, "sm_90a") != 0)
        lj_test_skip("context parallelism's local state needs la_fwd_sm90: an sm_90a GPU");
    /* NVLink multicast stays off: the test does not need it, and on a shared host it can put
     * every GPU out of service. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    *nccl = lj_gpu_nccl();
    int P = sh->devices;
    const char *want = getenv("LAJIT_CP_TEST_GPUS");
    if (want && *want) {
        P = atoi(want);
        if (P < 1 || P > sh->devices)
            lj_test_fail(__FILE__, __LINE__, "LAJIT_CP_TEST_GPUS=%s: this machine has %d GPUs",
                         want, sh->devices);
    }
    if (P > MAXP) {
        printf("%d GPUs: the test uses %d of them\n", P, MAXP);
        P = MAXP;
    }
    if (P == 1)
        printf("P = 1: one GPU %s, so the communicator has one rank (no exchange between "
               "GPUs)\n",
               sh->devices == 1 ? "here" : "asked for (LAJIT_CP_TEST_GPUS)");
    else
        printf("P = %d ranks, one process per GPU (of %d here), NCCL %d\n", P, sh->devices,
               (*nccl)->version);
    return P;
}

/* Ragged spans: distinct lengths, rank 1's a single token (P > 2), one empty span (P > 2). */
static void make_spans(mp_case *c, int P)
{
    static const int lens[MAXP] = {97, 1, 160, 64, 33, 200, 5, 128, 17, 90, 3, 150, 41, 77, 11, 66};
    c->P = P;
    for (int r = 0; r < P; r++)
        c->n[r] = lens[r];
    if (P == 1)
        c->n[0] = 150;
    if (P == 2)
        c->n[1] = 160;
    if (P > 2)
        c->n[c->empty_first ? 0 : P / 2] = 0;
    c->N = 0;
    for (int r = 0; r < P; r++) {
        c->start[r] = c->N;
        c->N += c->n[r];
    }
    c->start[P] = c->N;
}

static float *host_alloc(size_t n)
{
    float *p = malloc(n * 4 + 4);
    if (!p)
        lj_test_fail(__FILE__, __LINE__, "out of host memory");
    return p;
}

/* Carves one mp_out from *m: o_n floats for o (and dq, dk, dv), sn_n for the final states. */
static void carve(mp_out *out, float **m, const mp_case *c, size_t o_n, size_t sn_n)
{
    const size_t BH = (size_t)B * H, DE = (size_t)c->D * c->D;
    out->o = *m;
    out->sn = out->o + o_n;
    *m = out->sn + sn_n;
    if (!c->bwd)
        return;
    out->dq = *m;
    out->dk = out->dq + o_n;
    out->dv = out->dk + o_n;
    out->ds = out->dv + o_n;
    out->ds0 = out->ds + (size_t)c->P * H;
    *m = out->ds0 + BH * DE;
}

/* The case's inputs (host) and its shared outputs, NaN-filled. */
static void prepare(mp_case *c, int P)
{
    make_spans(c, P);
    const size_t BH = (size_t)B * H, D = (size_t)c->D, N = (size_t)c->N, DE = D * D;
    c->q = host_alloc(BH * N * D);
    c->k = host_alloc(BH * N * D);
    c->v = host_alloc(BH * N * D);
    c->dout = host_alloc(BH * N * D);
    c->s0 = host_alloc(BH * DE);
    c->dsn_h = host_alloc(BH * DE);
    case_seed(c->seed);
    case_random_fill(c->q, BH * N * D, 1.0f, LJ_BF16);
    case_random_fill(c->k, BH * N * D, 1.0f, LJ_BF16);
    case_random_fill(c->v, BH * N * D, 1.0f, LJ_BF16);
    case_random_fill(c->dout, BH * N * D, 1.0f, LJ_BF16);
    case_random_fill(c->s0, BH * DE, 1.0f, LJ_F32);
    case_random_fill(c->dsn_h, BH * DE, 1.0f, LJ_F32);
    for (int h = 0; h < H; h++)
        c->s[h] = rate(c, h);
    const size_t o_n = BH * N * D, sn_n = (size_t)P * BH * DE;
    size_t per = o_n + sn_n;
    if (c->bwd)
        per += 3 * o_n + (size_t)P * H + BH * DE;
    c->shared_bytes = per * 4 * (c->graph ? 2 : 1);
    float *m =
        mmap(NULL, c->shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        lj_test_fail(__FILE__, __LINE__, "mmap: %s", strerror(errno));
    memset(m, 0xFF, c->shared_bytes); /* NaN: a span no rank wrote cannot pass */
    c->shared = m;
    carve(&c->out, &m, c, o_n, sn_n);
    if (c->graph)
        carve(&c->graph_out, &m, c, o_n, sn_n);
}

/* One (b, h)'s [N, X] rows of a [B,H,N,X] float array, as doubles. */
static void rows(double *dst, const float *src, size_t bh, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = src[bh * n + i];
}

/* The launcher's check of one case against the float64 whole sequence. */
static void check_case(const mp_case *c)
{
    const int P = c->P, N = c->N, D = c->D, E = c->D;
    const size_t BH = (size_t)B * H, DE = (size_t)D * E, ND = (size_t)N * D;
    const double tol = case_tolerance(LJ_BF16), sigma = 1.0 / sqrt((double)D);
    double *q = malloc(ND * 8), *k = malloc(ND * 8), *v = malloc(ND * 8), *g = malloc(ND * 8);
    double *ref = malloc(ND * 8), *got = malloc(ND * 8), *S0 = malloc(DE * 8);
    double *dSN = malloc(DE * 8), *SN = malloc(DE * 8), *gst = malloc(DE * 8);
    double *rdq = malloc(ND * 8), *rdk = malloc(ND * 8), *rdv = malloc(ND * 8);
    double *rds0 = malloc(DE * 8), ref_ds[H] = {0}, bound[H] = {0};
    double worst = 0, worst_g = 0;
    const mp_out *out = &c->out;
    char what[200];
    for (size_t bh = 0; bh < BH; bh++) {
        const int h = (int)(bh % H);
        rows(q, c->q, bh, ND);
        rows(k, c->k, bh, ND);
        rows(v, c->v, bh, ND);
        rows(g, c->dout, bh, ND);
        rows(S0, c->s0, bh, DE);
        rows(dSN, c->dsn_h, bh, DE);
        const double lambda = c->decay ? exp(-(double)c->s[h]) : 1.0;
        la_ref_forward(N, D, E, q, k, v, lambda, sigma, c->init ? S0 : NULL, ref, SN);
        double rel;
        snprintf(what, sizeof what,
                 "o (%s P=%d D=%d decay=%d init=%d empty_first=%d bh=%zu seed %u)",
                 c->logstep ? "logstep" : "allgather", P, D, c->decay, c->init, c->empty_first, bh,
                 c->seed);
        rows(got, out->o, bh, ND);
        case_check(what, got, ref, (size_t)N, (size_t)E, tol, &rel);
        worst = fmax(worst, rel);
        for (int r = 0; r < P; r++) {
            rows(gst, out->sn + (size_t)r * BH * DE, bh, DE);
            snprintf(what, sizeof what,
                     "final_state of rank %d (%s P=%d D=%d decay=%d init=%d bh=%zu)", r,
                     c->logstep ? "logstep" : "allgather", P, D, c->decay, c->init, bh);
            case_check(what, gst, SN, (size_t)D, (size_t)E, tol, NULL);
        }
        if (!c->bwd)
            continue;
        double dsv = 0, dsb = 0;
        la_ref_backward(N, D, E, q, k, v, g, lambda, sigma, c->init ? S0 : NULL,
                        c->dsn ? dSN : NULL, rdq, rdk, rdv, rds0, &dsv, &dsb);
        ref_ds[h] += dsv;
        bound[h] += dsb;
        const struct {
            const char *name;
            const float *got;
            const double *ref;
            size_t rows;
        } grads[4] = {{"dq", out->dq, rdq, (size_t)N},
                      {"dk", out->dk, rdk, (size_t)N},
                      {"dv", out->dv, rdv, (size_t)N},
                      {"dS_0 (rank 0)", out->ds0, rds0, (size_t)D}};
        for (int i = 0; i < 4; i++) {
            rows(got, grads[i].got, bh, grads[i].rows * E);
            snprintf(what, sizeof what,
                     "%s (%s P=%d D=%d decay=%d init=%d dsn=%d empty_first=%d bh=%zu seed %u)",
                     grads[i].name, c->logstep ? "logstep" : "allgather", P, D, c->decay, c->init,
                     c->dsn, c->empty_first, bh, c->seed);
            case_check(what, got, grads[i].ref, grads[i].rows, (size_t)E, tol, &rel);
            worst_g = fmax(worst_g, rel);
        }
    }
    if (c->bwd && c->decay) {
        /* ds over the whole sequence and batch, the same bits on every rank. */
        for (int h = 0; h < H; h++) {
            const double err = fabs((double)out->ds[h] - ref_ds[h]);
            if (!isfinite(out->ds[h]) || !(err <= tol * bound[h]))
                lj_test_fail(__FILE__, __LINE__, "ds[%d] = %.9g, reference %.9g (bound %.3g)", h,
                             (double)out->ds[h], ref_ds[h], tol * bound[h]);
            for (int r = 1; r < P; r++)
                if (memcmp(&out->ds[(size_t)r * H + h], &out->ds[h], 4) != 0)
                    lj_test_fail(__FILE__, __LINE__, "ds[%d]: rank %d has %.9g, rank 0 %.9g", h, r,
                                 (double)out->ds[(size_t)r * H + h], (double)out->ds[h]);
        }
    }
    if (c->graph) {
        /* Deterministic: the replays give the direct calls' bits (everything shared, compared
         * as bytes: the two halves of the mapping). */
        const size_t half = c->shared_bytes / 2;
        if (memcmp(c->shared, (const char *)c->shared + half, half) != 0)
            lj_test_fail(__FILE__, __LINE__,
                         "the graph replays' outputs differ from the direct calls'");
    }
    printf("P=%d spans", P);
    for (int r = 0; r < P; r++)
        printf(" %d", c->n[r]);
    printf(" %s D=%d decay=%d init=%d%s%s%s: worst relative L2 of o %.3g",
           c->logstep ? "logstep" : "allgather", D, c->decay, c->init, c->bwd ? " bwd" : "",
           c->dsn ? " dS_N" : "", c->graph ? " graph replay = direct" : "", worst);
    if (c->bwd)
        printf(", of dq dk dv dS_0 %.3g", worst_g);
    printf("\n");
    free(q);
    free(k);
    free(v);
    free(g);
    free(ref);
    free(got);
    free(S0);
    free(dSN);
    free(SN);
    free(gst);
    free(rdq);
    free(rdk);
    free(rdv);
    free(rds0);
}

/* Runs the cases on P ranks (one fork of them all) and checks each. */
static void run_group(mp_case *cases, int ncases)
{
    mp_shared *sh =
        mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        lj_test_fail(__FILE__, __LINE__, "mmap: %s", strerror(errno));
    const lj_nccl *nccl = NULL;
    const int P = ranks_or_skip(sh, &nccl);
    for (int i = 0; i < ncases; i++)
        prepare(&cases[i], P);
    int fd[2];
    if (pipe(fd) != 0)
        lj_test_fail(__FILE__, __LINE__, "pipe: %s", strerror(errno));
    fflush(NULL); /* nothing buffered is written again by the ranks */
    pid_t pids[MAXP];
    for (int r = 0; r < P; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            for (int i = 0; i < r; i++)
                kill(pids[i], SIGKILL);
            lj_test_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
        }
        if (pids[r] == 0) {
            close(fd[r == 0 ? 0 : 1]);
            rank_main(cases, ncases, r, P, nccl, sh, fd[r == 0 ? 1 : 0]);
        }
    }
    close(fd[0]);
    close(fd[1]);
    int status = 0;
    const int failed = wait_ranks(pids, P, &status);
    if (failed == P)
        lj_test_fail(__FILE__, __LINE__, "the ranks did not finish in %d s", TIMEOUT_S);
    if (failed >= 0)
        lj_test_fail(__FILE__, __LINE__, "rank %d of %d %s %d (its message is above)", failed, P,
                     WIFEXITED(status) ? "exited with status" : "was killed by signal",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    for (int i = 0; i < ncases; i++) {
        check_case(&cases[i]);
        munmap(cases[i].shared, cases[i].shared_bytes);
        free(cases[i].q);
        free(cases[i].k);
        free(cases[i].v);
        free(cases[i].dout);
        free(cases[i].s0);
        free(cases[i].dsn_h);
    }
    munmap(sh, sizeof *sh);
}

/* The forward on every rank, with each exchange: D = 64 and 128, no decay / s = 0 / strong
 * decay, S_0 or not, the empty span (P > 2) in the middle or on rank 0. */
LJ_TEST(forward)
{
    mp_case cases[MAXCASES];
    int n = 0;
    for (int logstep = 0; logstep < 2; logstep++)
        for (int D = 64; D <= 128; D += 64)
            for (int decay = 0; decay < 3; decay++)
                for (int init = 0; init < 2; init++) {
                    mp_case c = {.D = D,
                                 .decay = decay,
                                 .init = init,
                                 .empty_first = (decay + init) % 2,
                                 .logstep = logstep};
                    c.seed = 4000u + (unsigned)(100 * logstep + D + 10 * decay + 3 * init);
                    cases[n++] = c;
                }
    run_group(cases, n);
}

/* The backward on every rank (after the forward, checked too), with each exchange: dq, dk, dv,
 * dS_0 and ds over the whole sequence; S_0 and dS_N given or not; ds with s = 0 and with strong
 * decay; at D = 128 the backward starts from the forward's incoming_state (rank 0's poisoned). */
LJ_TEST(backward)
{
    mp_case cases[MAXCASES];
    int n = 0;
    for (int logstep = 0; logstep < 2; logstep++)
        for (int D = 64; D <= 128; D += 64)
            for (int decay = 0; decay < 3; decay++)
                for (int states = 0; states < 2; states++) {
                    mp_case c = {.D = D,
                                 .decay = decay,
                                 .init = states,
                                 .dsn = states,
                                 .bwd = 1,
                                 .empty_first = (decay + states) % 2,
                                 .logstep = logstep,
                                 .keep = D == 128};
                    c.seed = 6000u + (unsigned)(100 * logstep + D + 10 * decay + 3 * states);
                    cases[n++] = c;
                }
    run_group(cases, n);
}

/* CUDA graphs of the forward and the backward (their exchanges included) replayed on every
 * rank, with each exchange: the direct calls' bits, and right against the reference. */
LJ_TEST(graph_replay)
{
    mp_case cases[4] = {
        {.D = 128, .decay = 2, .init = 1, .bwd = 1, .dsn = 1, .graph = 1, .seed = 4999},
        {.D = 64,
         .decay = 1,
         .init = 1,
         .bwd = 1,
         .empty_first = 1,
         .graph = 1,
         .keep = 1,
         .seed = 5001},
        {.D = 128,
         .decay = 2,
         .init = 1,
         .bwd = 1,
         .dsn = 1,
         .graph = 1,
         .logstep = 1,
         .seed = 5003},
        {.D = 64,
         .decay = 1,
         .bwd = 1,
         .empty_first = 1,
         .graph = 1,
         .logstep = 1,
         .keep = 1,
         .seed = 5005},
    };
    run_group(cases, 4);
}
