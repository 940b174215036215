/* cp_bench.c — lajit_bench --mode cp: context parallelism (lajit_cp_attn_fwd and _bwd) timed
 * over the GPUs of this host, one process per GPU, printed as DESIGN.md's `cp` rows.
 *
 * The launcher (this process) never touches CUDA, because a child forked after cuInit cannot use
 * the driver: a first child counts the devices, then each job (P ranks, n_r tokens on rank r)
 * forks P ranks. Rank 0 makes the NCCL id and hands it to the others (shared memory, released
 * through a pipe); rank r opens device r, joins with ncclCommInitRank and times its calls. Every
 * repetition starts behind an L2-clearing write of 256 MiB and a one-float all-gather (a barrier
 * on the GPUs, so no rank's time counts another's late start) and is timed with device events.
 * The times come back through shared memory; the launcher takes, per repetition, the slowest
 * rank (a layer is done when its last rank is), then the median over the repetitions.
 *
 * Measured per job, with each exchange (LAJIT_CP_ALLGATHER, LAJIT_CP_LOGSTEP: --exchange): one
 * layer's forward (lajit_cp_attn_fwd, which hands out the state entering the rank's span) and
 * forward + backward (then lajit_cp_attn_bwd from that state, without and with ds), and their
 * exchanges alone (the NCCL calls the exchange makes, of the same bytes, on the same stream, timed
 * the same way, without the compute between its rounds: one exchange for the forward, two for
 * forward + backward); on one GPU, where neither exchange moves
 * anything and one job serves both, also the plain ops (lajit_attn_fwd
 * and lajit_attn_bwd, no context parallelism) on the same tokens. Weak scaling keeps the tokens
 * per GPU (--tokens-per-gpu) at every P, strong scaling the tokens in all (--tokens). A row's
 * efficiency is t(1)/t(P): the same calls on one GPU (a one-rank communicator) for the row's
 * tokens per GPU, over the row's time; *_vs_single puts the plain ops' time in the numerator
 * instead (what context parallelism costs on top of the layer). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "context.h"
#include "nccl.h"

enum { MAX_GPUS = 64, MAX_REPS = 200 };

/* What a job times, per rank and repetition. */
enum cp_what {
    W_FWD,           /* lajit_cp_attn_fwd */
    W_FWDBWD,        /* lajit_cp_attn_fwd, then lajit_cp_attn_bwd without ds (from the forward's
                        incoming_state, as a training step keeps it) */
    W_FWDBWD_DS,     /* the same with ds */
    W_XFWD,          /* the forward's exchange alone (its NCCL calls) */
    W_XFWDBWD,       /* fwd+bwd's (without ds): two exchanges */
    W_SINGLE_FWD,    /* one GPU only: lajit_attn_fwd over the same tokens */
    W_SINGLE_FWDBWD, /* one GPU only: lajit_attn_fwd, then lajit_attn_bwd */
    W_COUNT
};

typedef struct cp_opts {
    int gpus[MAX_GPUS], ngpus;
    int64_t tokens_per_gpu, tokens;
    int weak, strong;
    int allgather, logstep; /* the exchanges measured */
    int B, H, D, reps, timeout_s;
} cp_opts;

/* One job: P ranks with n[r] tokens each; the medians (ms) the launcher made of the ranks'
 * times. */
typedef struct cp_job {
    int P;
    int logstep; /* the exchange: 0 LAJIT_CP_ALLGATHER, 1 LAJIT_CP_LOGSTEP */
    int64_t n[MAX_GPUS];
    double ms[W_COUNT];
    int have[W_COUNT];
} cp_job;

/* Shared between the launcher and the ranks (an anonymous shared mapping made before fork). */
typedef struct cp_shared {
    int devices; /* the probe's cuDeviceGetCount; -1: no driver */
    lj_nccl_unique_id id;
    struct {
        int have[W_COUNT];
        double ms[W_COUNT][MAX_REPS];
    } rank[MAX_GPUS];
} cp_shared;

/* ---- One rank ------------------------------------------------------------------------------ */

typedef struct cp_rank {
    const cp_opts *o;
    int rank, P, logstep;
    lajit_ctx *ctx;
    const lj_nccl *nccl;
    lj_nccl_comm comm;
    CUstream s;
    lajit_cp_attn_fwd_args fwd;
    lajit_cp_attn_bwd_args bwd;
    lajit_attn_fwd_args single;
    lajit_attn_bwd_args single_bwd;
    CUdeviceptr xbuf, bar, flush;
    DLTensor *ds; /* the decay gradient, for W_FWDBWD_DS */
    size_t slot;  /* bytes each rank contributes to the exchange */
} cp_rank;

static const size_t flush_bytes = 256u << 20;

static void nccl_check(const cp_rank *c, lj_nccl_result r, const char *what)
{
    if (r != LJ_NCCL_SUCCESS) {
        fprintf(stderr, "lajit_bench rank %d: %s: NCCL error %d: %s\n", c->rank, what, r,
                c->nccl->ncclGetErrorString(r));
        lj_bench_die();
    }
}

static void op_fwd(cp_rank *c)
{
    lj_bench_check(c->ctx, lajit_cp_attn_fwd(c->ctx, &c->fwd), "lajit_cp_attn_fwd");
}

/* One exchange's NCCL traffic as runtime/cp_exchange.c makes it, without the compute between
 * its rounds; grad: the gradient direction (walked from the last rank). All-gather: every
 * rank's slot (its [B,H,D,E] float32 carry padded to 16 bytes, then its length in 16 more)
 * gathered in place. Log-step: ⌈log2 P⌉ rounds in which the rank at walk position v sends one
 * slot to v + 2^i and receives one from v − 2^i, then a shift round (v + 1, v − 1), each round
 * one ncclGroupStart/End of a send and a receive. */
static void exchange(cp_rank *c, int grad)
{
    const lj_nccl *n = c->nccl;
    const char *x = (const char *)(uintptr_t)c->xbuf;
    if (!c->logstep) {
        nccl_check(c,
                   n->ncclAllGather(x + (size_t)c->rank * c->slot, (void *)x, c->slot / 4,
                                    LJ_NCCL_FLOAT32, c->comm, c->s),
                   "ncclAllGather (the exchange)");
        return;
    }
    const int P = c->P, v = grad ? P - 1 - c->rank : c->rank;
    int K = 0;
    while ((1 << K) < P)
        K++;
    for (int i = 0; i <= K; i++) {
        const int d = i < K ? 1 << i : 1, to = v + d, from = v - d;
        if (to >= P && from < 0)
            continue;
        nccl_check(c, n->ncclGroupStart(), "ncclGroupStart");
        if (to < P)
            nccl_check(
                c,
                n->ncclSend(x, c->slot / 4, LJ_NCCL_FLOAT32, grad ? P - 1 - to : to, c->comm, c->s),
                "ncclSend (the exchange)");
        if (from >= 0)
            nccl_check(c,
                       n->ncclRecv((void *)(x + c->slot), c->slot / 4, LJ_NCCL_FLOAT32,
                                   grad ? P - 1 - from : from, c->comm, c->s),
                       "ncclRecv (the exchange)");
        nccl_check(c, n->ncclGroupEnd(), "ncclGroupEnd");
    }
}

static void op_xfwd(cp_rank *c)
{
    exchange(c, 0);
}

/* Every rank at the same point on its GPU: a one-float all-gather. */
static void barrier(cp_rank *c)
{
    const float *all = (const float *)(uintptr_t)c->bar;
    nccl_check(
        c, c->nccl->ncclAllGather(all + c->rank, (void *)all, 1, LJ_NCCL_FLOAT32, c->comm, c->s),
        "ncclAllGather (the barrier)");
}

/* One training step's attention layer: the forward, then the backward from dO. */
static void op_fwdbwd(cp_rank *c)
{
    op_fwd(c);
    lj_bench_check(c->ctx, lajit_cp_attn_bwd(c->ctx, &c->bwd), "lajit_cp_attn_bwd");
}

static void op_fwdbwd_ds(cp_rank *c)
{
    c->bwd.ds = c->ds;
    op_fwdbwd(c);
    c->bwd.ds = NULL;
}

/* fwd+bwd's exchanges: the forward's and the backward's gradient states (the backward starts
 * from the forward's incoming_state, so it does not exchange the states again). ds's own
 * all-gather (H floats per rank) is left out. */
static void op_xfwdbwd(cp_rank *c)
{
    exchange(c, 0);
    exchange(c, 1);
}

static void op_single_fwd(cp_rank *c)
{
    lj_bench_check(c->ctx, lajit_attn_fwd(c->ctx, &c->single), "lajit_attn_fwd");
}

static void op_single_fwdbwd(cp_rank *c)
{
    op_single_fwd(c);
    lj_bench_check(c->ctx, lajit_attn_bwd(c->ctx, &c->single_bwd), "lajit_attn_bwd");
}

/* n random bf16 values: 16 Mi of them drawn on the host, then copied over the rest on the device
 * (a million tokens' q at H = 8 is a billion values: drawing them all would take seconds per
 * tensor, and repeating a block changes no timing). */
static void fill_bf16(CUdeviceptr p, size_t n, unsigned seed)
{
    const size_t block = (size_t)1 << 24;
    lj_bench_fill_random(p, n < block ? n : block, 16, 0.1f, seed);
    for (size_t done = block; done < n; done *= 2)
        CU(cuMemcpyDtoDAsync(p + done * 2, p, (n - done < done ? n - done : done) * 2, NULL));
    CU(cuCtxSynchronize());
}

/* One untimed call, then o->reps timed ones, each behind the L2-clearing write and the barrier. */
static void time_reps(cp_rank *c, void (*op)(cp_rank *), double *out)
{
    CUevent a, b;
    CU(cuEventCreate(&a, 0));
    CU(cuEventCreate(&b, 0));
    op(c);
    CU(cuStreamSynchronize(c->s));
    for (int r = 0; r < c->o->reps; r++) {
        CU(cuMemsetD32Async(c->flush, (unsigned)r, flush_bytes / 4, c->s));
        barrier(c);
        CU(cuEventRecord(a, c->s));
        op(c);
        CU(cuEventRecord(b, c->s));
        CU(cuEventSynchronize(b));
        float t;
        CU(cuEventElapsedTime(&t, a, b));
        out[r] = t;
    }
    CU(cuEventDestroy(a));
    CU(cuEventDestroy(b));
}

/* Rank r of job j: runs in a forked child and ends it. idfd: the pipe's write end on rank 0 (it
 * writes one byte per other rank once the id is in shared memory), its read end elsewhere. */
static void rank_main(const cp_opts *o, const cp_job *j, int r, cp_shared *sh, int idfd)
    __attribute__((noreturn));
static void rank_main(const cp_opts *o, const cp_job *j, int r, cp_shared *sh, int idfd)
{
    cp_rank c;
    memset(&c, 0, sizeof c);
    c.o = o;
    c.rank = r;
    c.P = j->P;
    c.logstep = j->logstep;
    if (lj_bench_load_driver() != LAJIT_OK) {
        fprintf(stderr, "lajit_bench rank %d: %s\n", r, lj_bench_env.errmsg);
        lj_bench_die();
    }
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.device = r;
    lj_bench_check(NULL, lajit_ctx_create(&desc, &c.ctx), "context");
    lj_device *dev;
    lj_bench_check(c.ctx, lajit__ctx_device(c.ctx, &dev), "device");
    lj_bench_check(c.ctx, lj_device_make_current(lajit__ctx_env(c.ctx), dev), "make current");
    lj_bench_check(NULL, lj_nccl_load(&lj_bench_env, &c.nccl), "NCCL"); /* loaded before fork */

    /* The communicator: NCCL takes the device of the context current on this thread. */
    if (r == 0) {
        nccl_check(&c, c.nccl->ncclGetUniqueId(&sh->id), "ncclGetUniqueId");
        for (int i = 1; i < c.P; i++)
            if (write(idfd, "x", 1) != 1) {
                fprintf(stderr, "lajit_bench rank 0: handing out the NCCL id: %s\n",
                        strerror(errno));
                lj_bench_die();
            }
    } else {
        char x;
        if (read(idfd, &x, 1) != 1) {
            fprintf(stderr, "lajit_bench rank %d: rank 0 ended before making the NCCL id\n", r);
            lj_bench_die();
        }
    }
    close(idfd);
    nccl_check(&c, c.nccl->ncclCommInitRank(&c.comm, c.P, sh->id, r), "ncclCommInitRank");
    CU(cuStreamCreate(&c.s, CU_STREAM_NON_BLOCKING));

    const int B = o->B, H = o->H, D = o->D, E = o->D;
    const int64_t n = j->n[r];
    const size_t nq = (size_t)B * H * (size_t)n * D, nv = (size_t)B * H * (size_t)n * E;
    CUdeviceptr q = lj_bench_alloc(nq * 2), k = lj_bench_alloc(nq * 2), v = lj_bench_alloc(nv * 2),
                out = lj_bench_alloc(nv * 2), sl = lj_bench_alloc((size_t)H * 4),
                g = lj_bench_alloc(nv * 2), dq = lj_bench_alloc(nq * 2),
                dk = lj_bench_alloc(nq * 2), dv = lj_bench_alloc(nv * 2),
                dsb = lj_bench_alloc((size_t)H * 4), in = lj_bench_alloc((size_t)B * H * D * E * 4);
    fill_bf16(q, nq, 1 + 10u * (unsigned)r);
    fill_bf16(k, nq, 2 + 10u * (unsigned)r);
    fill_bf16(v, nv, 3 + 10u * (unsigned)r);
    fill_bf16(g, nv, 4 + 10u * (unsigned)r);
    float slopes[1024];
    if (H > 1024) {
        fprintf(stderr, "lajit_bench: --H %d is more than 1024\n", H);
        lj_bench_die();
    }
    lj_bench_check(NULL, lajit_decay_alibi(H, 0, 1, slopes), "slopes");
    CU(cuMemcpyHtoD(sl, slopes, (size_t)H * 4));
    c.slot = (((size_t)B * H * D * E * 4 + 15) & ~(size_t)15) + 16;
    const size_t slots = c.P < 2 ? 2 : (size_t)c.P; /* log-step: a send slot, a receive slot */
    c.xbuf = lj_bench_alloc(c.slot * slots);
    c.bar = lj_bench_alloc((size_t)c.P * 4);
    c.flush = lj_bench_alloc(flush_bytes);
    CU(cuMemsetD32(c.xbuf, 0, c.slot * slots / 4));

    int64_t qs[4] = {B, H, n, D}, vs[4] = {B, H, n, E}, ss[1] = {H}, states[4] = {B, H, D, E};
    DLTensor tq = lj_bench_tensor(q, 4, qs, 16, kDLBfloat, r);
    DLTensor tk = lj_bench_tensor(k, 4, qs, 16, kDLBfloat, r);
    DLTensor tv = lj_bench_tensor(v, 4, vs, 16, kDLBfloat, r);
    DLTensor to = lj_bench_tensor(out, 4, vs, 16, kDLBfloat, r);
    DLTensor ts = lj_bench_tensor(sl, 1, ss, 32, kDLFloat, r);
    DLTensor tg = lj_bench_tensor(g, 4, vs, 16, kDLBfloat, r);
    DLTensor tdq = lj_bench_tensor(dq, 4, qs, 16, kDLBfloat, r);
    DLTensor tdk = lj_bench_tensor(dk, 4, qs, 16, kDLBfloat, r);
    DLTensor tdv = lj_bench_tensor(dv, 4, vs, 16, kDLBfloat, r);
    DLTensor tds = lj_bench_tensor(dsb, 1, ss, 32, kDLFloat, r);
    DLTensor tin = lj_bench_tensor(in, 4, states, 32, kDLFloat, r);
    c.ds = &tds;
    c.fwd.struct_size = sizeof c.fwd;
    c.fwd.comm = c.comm;
    c.fwd.q = &tq;
    c.fwd.k = &tk;
    c.fwd.v = &tv;
    c.fwd.o = &to;
    c.fwd.s = &ts;
    c.fwd.scale = 1.0f;
    c.fwd.flags = j->logstep ? LAJIT_CP_LOGSTEP : LAJIT_CP_ALLGATHER;
    c.fwd.stream = c.s;
    c.fwd.incoming_state = &tin;
    c.bwd.struct_size = sizeof c.bwd;
    c.bwd.comm = c.comm;
    c.bwd.q = &tq;
    c.bwd.k = &tk;
    c.bwd.v = &tv;
    c.bwd.dout = &tg;
    c.bwd.dq = &tdq;
    c.bwd.dk = &tdk;
    c.bwd.dv = &tdv;
    c.bwd.s = &ts;
    c.bwd.scale = 1.0f;
    c.bwd.flags = c.fwd.flags;
    c.bwd.stream = c.s;
    c.bwd.incoming_state = &tin;
    c.single.struct_size = sizeof c.single;
    c.single.q = &tq;
    c.single.k = &tk;
    c.single.v = &tv;
    c.single.o = &to;
    c.single.s = &ts;
    c.single.scale = 1.0f;
    c.single.stream = c.s;
    c.single_bwd.struct_size = sizeof c.single_bwd;
    c.single_bwd.q = &tq;
    c.single_bwd.k = &tk;
    c.single_bwd.v = &tv;
    c.single_bwd.dout = &tg;
    c.single_bwd.dq = &tdq;
    c.single_bwd.dk = &tdk;
    c.single_bwd.dv = &tdv;
    c.single_bwd.s = &ts;
    c.single_bwd.scale = 1.0f;
    c.single_bwd.stream = c.s;

    /* Every rank makes the same sequence of collectives; the plain ops only with one rank. */
    static void (*const ops[W_COUNT])(cp_rank *) = {[W_FWD] = op_fwd,
                                                    [W_FWDBWD] = op_fwdbwd,
                                                    [W_FWDBWD_DS] = op_fwdbwd_ds,
                                                    [W_XFWD] = op_xfwd,
                                                    [W_XFWDBWD] = op_xfwdbwd,
                                                    [W_SINGLE_FWD] = op_single_fwd,
                                                    [W_SINGLE_FWDBWD] = op_single_fwdbwd};
    for (int w = 0; w < W_COUNT; w++) {
        if (c.P > 1 && (w == W_SINGLE_FWD || w == W_SINGLE_FWDBWD))
            continue;
        time_reps(&c, ops[w], sh->rank[r].ms[w]);
        sh->rank[r].have[w] = 1;
    }

    CU(cuStreamSynchronize(c.s));
    nccl_check(&c, c.nccl->ncclCommDestroy(c.comm), "ncclCommDestroy");
    CUdeviceptr frees[] = {q, k, v, out, sl, g, dq, dk, dv, dsb, in, c.xbuf, c.bar, c.flush};
    for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++)
        CU(cuMemFree(frees[i]));
    CU(cuStreamDestroy(c.s));
    lajit_ctx_destroy(c.ctx);
    fflush(NULL);
    _exit(0);
}

/* ---- The launcher -------------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Waits for the n children in pids; when one fails or the time runs out, kills the others (a
 * rank waiting in a collective for a dead one would wait for ever). Returns 0 when all exited
 * with status 0. */
static int wait_children(pid_t *pids, int n, int timeout_s, const char *what)
{
    int alive = n, failed = 0;
    const double end = now_s() + timeout_s;
    while (alive > 0) {
        int status;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p < 0) {
            fprintf(stderr, "lajit_bench: waitpid: %s\n", strerror(errno));
            return 1;
        }
        if (p == 0) {
            if (!failed && now_s() > end) {
                fprintf(stderr, "lajit_bench: %s: still running after %d s: stopped\n", what,
                        timeout_s);
                failed = 1;
            }
            if (failed)
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
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                if (!failed)
                    fprintf(stderr, "lajit_bench: %s: rank %d %s %d\n", what, i,
                            WIFEXITED(status) ? "exited with status" : "killed by signal",
                            WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
                failed = 1;
            }
        }
    }
    return failed;
}

/* The device count, from a child (the launcher stays free of CUDA). */
static int probe_devices(cp_shared *sh)
{
    sh->devices = -1;
    pid_t p = fork();
    if (p < 0)
        return -1;
    if (p == 0) {
        int n = 0;
        if (lj_bench_load_driver() == LAJIT_OK && lj_bench_drv->cuDeviceGetCount(&n) == 0)
            sh->devices = n;
        else
            fprintf(stderr, "lajit_bench: %s\n", lj_bench_env.errmsg);
        fflush(NULL);
        _exit(0);
    }
    int status;
    waitpid(p, &status, 0);
    return sh->devices;
}

static int cmp_int(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

/* Runs job j (its P ranks) and reduces the ranks' times into j->ms. */
static void run_job(const cp_opts *o, cp_job *j, cp_shared *sh)
{
    memset(sh->rank, 0, sizeof sh->rank);
    int fd[2];
    if (pipe(fd) != 0) {
        fprintf(stderr, "lajit_bench: pipe: %s\n", strerror(errno));
        exit(1);
    }
    fflush(NULL); /* nothing buffered is written twice by the children */
    pid_t pids[MAX_GPUS];
    for (int r = 0; r < j->P; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            fprintf(stderr, "lajit_bench: fork: %s\n", strerror(errno));
            for (int i = 0; i < r; i++)
                kill(pids[i], SIGKILL);
            exit(1);
        }
        if (pids[r] == 0) {
            close(fd[r == 0 ? 0 : 1]);
            rank_main(o, j, r, sh, fd[r == 0 ? 1 : 0]);
        }
    }
    close(fd[0]);
    close(fd[1]);
    char what[64];
    snprintf(what, sizeof what, "%d GPUs, %lld tokens on rank 0", j->P, (long long)j->n[0]);
    if (wait_children(pids, j->P, o->timeout_s, what) != 0)
        exit(1);
    double *slowest = malloc(sizeof(double) * (size_t)o->reps);
    for (int w = 0; w < W_COUNT; w++) {
        j->have[w] = sh->rank[0].have[w];
        if (!j->have[w])
            continue;
        for (int i = 0; i < o->reps; i++) {
            slowest[i] = 0;
            for (int r = 0; r < j->P; r++)
                if (sh->rank[r].ms[w][i] > slowest[i])
                    slowest[i] = sh->rank[r].ms[w][i];
        }
        j->ms[w] = lj_bench_median(slowest, o->reps);
    }
    free(slowest);
}

/* The job of P ranks, n0 tokens on rank 0 and that exchange. One GPU has one job per size:
 * with one rank neither exchange moves anything, so the all-gather's serves both. */
static cp_job *find_job(cp_job *jobs, int njobs, int P, int64_t n0, int logstep)
{
    for (int i = 0; i < njobs; i++)
        if (jobs[i].P == P && jobs[i].n[0] == n0 && (P == 1 || jobs[i].logstep == logstep))
            return &jobs[i];
    return NULL;
}

/* The jobs one scaling needs at P GPUs: the row's, and its one-GPU baselines (the row's tokens
 * per GPU; strong scaling also the whole sequence on one GPU, for the speedup). */
static int add_job(cp_job *jobs, int njobs, int P, int64_t total, int logstep)
{
    if (find_job(jobs, njobs, P, total / P + (total % P > 0), logstep))
        return njobs;
    cp_job *j = &jobs[njobs];
    memset(j, 0, sizeof *j);
    j->P = P;
    j->logstep = P > 1 && logstep;
    for (int r = 0; r < P; r++) /* the remainder one token each on the first ranks */
        j->n[r] = total / P + (r < total % P);
    return njobs + 1;
}

static void print_row(const cp_opts *o, const char *scaling, const cp_job *j, const cp_job *one,
                      const cp_job *whole)
{
    const int64_t N = j->n[j->P - 1]; /* every rank's, or the last's when the split is ragged */
    int64_t total = 0;
    for (int r = 0; r < j->P; r++)
        total += j->n[r];
    const double *t = j->ms, *t1 = one->ms;
    printf("{\"op\": \"cp\", \"impl\": \"lajit\", \"scaling\": \"%s\", \"gpus\": %d, \"dtype\": "
           "\"bf16\", \"B\": %d, \"H\": %d, \"D\": %d, \"E\": %d, \"N\": %lld, \"N_total\": %lld, "
           "\"decay\": true, \"ms\": %.4f, \"ms_ds\": %.4f, \"ms_fwd\": %.4f, \"exchange_ms\": "
           "%.4f, \"exchange_fwd_ms\": %.4f, \"exchange_share\": %.4f, \"exchange\": \"%s\", "
           "\"weak_efficiency\": %.4f, \"weak_efficiency_fwd\": %.4f",
           scaling, j->P, o->B, o->H, o->D, o->D, (long long)N, (long long)total, t[W_FWDBWD],
           t[W_FWDBWD_DS], t[W_FWD], t[W_XFWDBWD], t[W_XFWD], t[W_XFWDBWD] / t[W_FWDBWD],
           j->logstep ? "logstep" : "allgather", t1[W_FWDBWD] / t[W_FWDBWD], t1[W_FWD] / t[W_FWD]);
    if (one->have[W_SINGLE_FWD])
        printf(", \"ms_single\": %.4f, \"ms_fwd_single\": %.4f, \"weak_efficiency_vs_single\": "
               "%.4f, \"weak_efficiency_fwd_vs_single\": %.4f",
               t1[W_SINGLE_FWDBWD], t1[W_SINGLE_FWD], t1[W_SINGLE_FWDBWD] / t[W_FWDBWD],
               t1[W_SINGLE_FWD] / t[W_FWD]);
    if (whole)
        printf(", \"speedup\": %.4f, \"speedup_fwd\": %.4f", whole->ms[W_FWDBWD] / t[W_FWDBWD],
               whole->ms[W_FWD] / t[W_FWD]);
    const char *nvls = getenv("NCCL_NVLS_ENABLE"), *segs = getenv("LAJIT_CP_SEGMENTS");
    /* LAJIT_CP_SEGMENTS as the ranks' contexts read it (automatic by default). */
    int bad;
    const int seg = lj_segments_parse(segs, 0, &bad);
    char seg_text[16];
    snprintf(seg_text, sizeof seg_text, "%d", seg);
    if (seg <= 1)
        strcpy(seg_text, seg ? "off" : "auto");
    printf(", \"segments\": \"%s\"", seg_text);
    printf(", \"reps\": %d, \"how\": \"one process per GPU, NCCL_NVLS_ENABLE=%s; ms: "
           "lajit_cp_attn_fwd then lajit_cp_attn_bwd from the forward's incoming_state (ms_ds: "
           "with ds); each repetition behind a "
           "256 MiB L2-clearing write and a one-float all-gather, timed with device events; per "
           "repetition the slowest rank, then the median of %d; N: the tokens of the last rank; "
           "exchange: the NCCL calls of the calls' exchanges alone on the same stream, the "
           "compute between them left out (%s; %zu bytes a slot; fwd+bwd: two exchanges, ds's "
           "own small all-gather not counted); efficiency: the one-rank calls on N tokens over "
           "this row's (_vs_single: lajit_attn_fwd/bwd)\"}\n",
           o->reps, nvls ? nvls : "unset", o->reps,
           j->logstep ? "log-step: ceil(log2 P) + 1 rounds of a grouped ncclSend/ncclRecv of one "
                        "slot"
                      : "all-gather: one in-place ncclAllGather of every rank's slot",
           (((size_t)o->B * o->H * o->D * o->D * 4 + 15) & ~(size_t)15) + 16);
    fflush(stdout);
}

static int in_list(const int *v, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (v[i] == x)
            return 1;
    return 0;
}

static void usage(void)
{
    printf("usage: lajit_bench --mode cp [--gpus 1,2,4,8] [--tokens-per-gpu 262144]\n"
           "  [--tokens 1048576] [--scaling weak,strong] [--exchange allgather,logstep]\n"
           "  [--B 1] [--H 8] [--D 128] [--reps 20] [--timeout 600]\n"
           "Context parallelism over the GPUs of this host, one process per GPU (GPU counts\n"
           "above cuDeviceGetCount are dropped); NCCL from LAJIT_NCCL_PATH or libnccl.so.2.\n"
           "Prints one JSON row per (scaling, GPU count): DESIGN.md's cp rows.\n");
}

int lj_bench_cp_main(int argc, char **argv)
{
    cp_opts o = {.gpus = {1, 2, 4, 8},
                 .ngpus = 4,
                 .tokens_per_gpu = 262144,
                 .tokens = 1048576,
                 .weak = 1,
                 .strong = 1,
                 .allgather = 1,
                 .logstep = 1,
                 .B = 1,
                 .H = 8,
                 .D = 128,
                 .reps = 20,
                 .timeout_s = 600};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (strcmp(a, "--help") == 0) {
            usage();
            return 0;
        }
        if (strcmp(a, "--mode") == 0)
            ;
        else if (strcmp(a, "--gpus") == 0)
            o.ngpus = lj_bench_parse_list(v, o.gpus, MAX_GPUS);
        else if (strcmp(a, "--tokens-per-gpu") == 0)
            o.tokens_per_gpu = atoll(v);
        else if (strcmp(a, "--tokens") == 0)
            o.tokens = atoll(v);
        else if (strcmp(a, "--scaling") == 0) {
            o.weak = strstr(v, "weak") != NULL;
            o.strong = strstr(v, "strong") != NULL;
        } else if (strcmp(a, "--exchange") == 0) {
            o.allgather = strstr(v, "allgather") != NULL;
            o.logstep = strstr(v, "logstep") != NULL;
        } else if (strcmp(a, "--B") == 0)
            o.B = atoi(v);
        else if (strcmp(a, "--H") == 0)
            o.H = atoi(v);
        else if (strcmp(a, "--D") == 0)
            o.D = atoi(v);
        else if (strcmp(a, "--reps") == 0)
            o.reps = atoi(v);
        else if (strcmp(a, "--timeout") == 0)
            o.timeout_s = atoi(v);
        else {
            fprintf(stderr, "lajit_bench: unknown argument %s (--mode cp)\n", a);
            return 2;
        }
        i++;
    }
    if (o.reps < 1 || o.reps > MAX_REPS || o.B < 1 || o.H < 1 || o.D < 1 || o.tokens_per_gpu < 1 ||
        o.tokens < 1 || o.timeout_s < 1 || (!o.weak && !o.strong) || (!o.allgather && !o.logstep)) {
        fprintf(stderr, "lajit_bench: bad --mode cp arguments (--reps is 1..%d)\n", MAX_REPS);
        return 2;
    }
    /* NVLink multicast stays off unless asked for: on a shared host it can put every GPU out of
     * service, and the all-gather measured here is NCCL's ring or tree without it. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    const lj_nccl *nccl;
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    if (lj_nccl_load(&env, &nccl) != LAJIT_OK) {
        fprintf(stderr, "lajit_bench: %s (set LAJIT_NCCL_PATH)\n", env.errmsg);
        return 77;
    }
    cp_shared *sh =
        mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        fprintf(stderr, "lajit_bench: mmap: %s\n", strerror(errno));
        return 1;
    }
    int devices = probe_devices(sh);
    if (devices < 1) {
        fprintf(stderr, "lajit_bench: no GPU\n");
        return 77;
    }
    /* The GPU counts asked for that this host has, in increasing order, once each. */
    int Ps[MAX_GPUS], nP = 0;
    qsort(o.gpus, (size_t)o.ngpus, sizeof o.gpus[0], cmp_int);
    for (int i = 0; i < o.ngpus; i++) {
        if (o.gpus[i] < 1 || (nP && Ps[nP - 1] == o.gpus[i]))
            continue;
        if (o.gpus[i] > devices || o.gpus[i] > MAX_GPUS) {
            fprintf(stderr, "lajit_bench: %d GPUs asked for, %d here: dropped\n", o.gpus[i],
                    devices);
            continue;
        }
        Ps[nP++] = o.gpus[i];
    }
    fprintf(stderr, "lajit_bench: NCCL %d, %d GPUs here\n", nccl->version, devices);
    /* The jobs, one-GPU baselines first (they are every row's t(1)). */
    cp_job *jobs = calloc(8 * MAX_GPUS, sizeof *jobs);
    int njobs = 0;
    for (int i = 0; i < nP; i++) {
        if (o.weak)
            njobs = add_job(jobs, njobs, 1, o.tokens_per_gpu, 0);
        if (o.strong) {
            njobs = add_job(jobs, njobs, 1, o.tokens / Ps[i], 0);
            njobs = add_job(jobs, njobs, 1, o.tokens, 0);
        }
    }
    for (int x = 0; x < 2; x++) {
        if (!(x ? o.logstep : o.allgather))
            continue;
        for (int i = 0; i < nP; i++) {
            if (o.weak)
                njobs = add_job(jobs, njobs, Ps[i], o.tokens_per_gpu * Ps[i], x);
            if (o.strong)
                njobs = add_job(jobs, njobs, Ps[i], o.tokens, x);
        }
    }
    /* Each row as soon as its job is done (the baselines ran first). A one-GPU job's rows are
     * labelled with the all-gather (its flag) and printed once. */
    for (int i = 0; i < njobs; i++) {
        cp_job *j = &jobs[i];
        run_job(&o, j, sh);
        fprintf(stderr,
                "lajit_bench: %d GPUs, %lld tokens on rank 0, %s: fwd %.3f ms, fwd+bwd %.3f ms\n",
                j->P, (long long)j->n[0], j->logstep ? "logstep" : "allgather", j->ms[W_FWD],
                j->ms[W_FWDBWD]);
        const int P = j->P, x = j->logstep;
        if (!in_list(Ps, nP, P))
            continue;
        if (o.weak && j == find_job(jobs, njobs, P, o.tokens_per_gpu, x))
            print_row(&o, "weak", j, find_job(jobs, njobs, 1, o.tokens_per_gpu, 0), NULL);
        if (o.strong && j == find_job(jobs, njobs, P, o.tokens / P + (o.tokens % P > 0), x))
            print_row(&o, "strong", j, find_job(jobs, njobs, 1, j->n[P - 1], 0),
                      find_job(jobs, njobs, 1, o.tokens, 0));
    }
    free(jobs);
    munmap(sh, sizeof *sh);
    return 0;
}
