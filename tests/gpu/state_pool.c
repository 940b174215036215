/* state_pool.c — lj_state_pool_gather and lj_state_pool_scatter on the GPU against host copies.
 *
 * A pool of random states and a batch of slots mixing ordinary slots, −1 (LAJIT_SLOT_SKIP) and
 * LAJIT_SLOT_FRESH(s). Gather: the batch is NaN-poisoned first, and each state must equal its pool
 * slot bit for bit, or be zero for −1 and for a fresh slot (whose pool slot holds NaN, so a read of
 * it would show). Scatter: the pool is NaN-poisoned first, and every slot named (ordinary or
 * fresh) must equal its batch state bit for bit while every other slot keeps its poison. Cases:
 * D = 64, E = 32 and D = E = 128 (16-byte vectors), a width of 6 in padded rows (pairs), a VK-like
 * D ≠ E in padded rows, strided slots views, more slots than states and the reverse, a batch of
 * 70000 tiny states (past 65535: the grid's x), the calls replayed from a captured graph, and
 * checked mode (passing good slots, refusing one past the pool). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "op_args.h"
#include "test.h"

static unsigned rng_state;

static double uniform(void) /* [-0.5, 0.5) */
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (double)(rng_state >> 8) / 16777216.0 - 0.5;
}

typedef struct pool_case {
    int P, n, H, R, C;
    int row;         /* row stride in floats (>= C, a multiple of 4) */
    int slot_stride; /* slots' stride in elements */
    int graph;       /* the checked calls are a captured graph's replays */
    int checked;     /* a LAJIT_CTX_CHECKED context */
    unsigned seed;
} pool_case;

static lajit_ctx *open_ctx(int checked)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DISK_CACHE | (checked ? LAJIT_CTX_CHECKED : 0u);
    desc.autotune = LAJIT_AUTOTUNE_OFF;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    return ctx;
}

/* Runs one call, directly or as a captured graph's replay: then a first call builds the plan,
 * and out (the call's output, poisoned by the caller) is poisoned again before the capture. */
static void call(lajit_ctx *ctx, const pool_case *c, int scatter, const DLTensor *pool,
                 const DLTensor *slots, DLTensor *batch, CUstream stream, CUdeviceptr out,
                 size_t out_bytes)
{
    const lj_driver *drv = lj_gpu_driver();
    CUgraph g;
    CUgraphExec ge;
    if (c->graph) {
        ASSERT_OK(scatter ? lj_state_pool_scatter(ctx, batch, slots, (DLTensor *)pool, 1, stream)
                          : lj_state_pool_gather(ctx, pool, slots, batch, 0, stream));
        lj_gpu_stream_sync(stream);
        lj_gpu_poison(out, out_bytes);
    }
    if (c->graph)
        ASSERT_EQ(drv->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                  CUDA_SUCCESS);
    lajit_status st = scatter
                          ? lj_state_pool_scatter(ctx, batch, slots, (DLTensor *)pool, 1, stream)
                          : lj_state_pool_gather(ctx, pool, slots, batch, 0, stream);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s: %s", scatter ? "scatter" : "gather",
                     lajit_status_string(st), lajit_errmsg(ctx));
    if (c->graph) {
        ASSERT_EQ(drv->cuStreamEndCapture(stream, &g), CUDA_SUCCESS);
        ASSERT_EQ(drv->cuGraphInstantiate(&ge, g, 0), CUDA_SUCCESS);
        ASSERT_EQ(drv->cuGraphLaunch(ge, stream), CUDA_SUCCESS);
    }
    lj_gpu_stream_sync(stream);
    if (c->graph) {
        drv->cuGraphExecDestroy(ge);
        drv->cuGraphDestroy(g);
    }
}

static void run_case(const pool_case *c)
{
    const int P = c->P, n = c->n, H = c->H, R = c->R, C = c->C, row = c->row;
    const size_t st = (size_t)R * row; /* floats of one stored (padded) state */
    const size_t pool_f = (size_t)P * H * st, batch_f = (size_t)n * H * st;
    rng_state = c->seed;
    lajit_ctx *ctx = open_ctx(c->checked);

    /* Slots: distinct pool slots (a scatter writes each once) taken in a shuffled order, every
     * third state −1 and every fifth one fresh; n may exceed P only with -1s. */
    int32_t *slots = calloc((size_t)n * c->slot_stride, 4);
    int *perm = malloc((size_t)P * sizeof *perm);
    for (int s = 0; s < P; s++)
        perm[s] = s;
    for (int s = P - 1; s > 0; s--) {
        int k = (int)((uniform() + 0.5) * (s + 1)) % (s + 1), x = perm[s];
        perm[s] = perm[k];
        perm[k] = x;
    }
    int next = 0;
    for (int i = 0; i < n; i++) {
        int32_t v = LAJIT_SLOT_SKIP;
        if (i % 3 != 1 && next < P) {
            int s = perm[next++];
            v = i % 5 == 2 ? LAJIT_SLOT_FRESH(s) : s;
        }
        slots[(size_t)i * c->slot_stride] = v;
    }
    float *pool = malloc(pool_f * 4), *batch = malloc(batch_f * 4),
          *got = malloc((pool_f > batch_f ? pool_f : batch_f) * 4);
    for (size_t k = 0; k < pool_f; k++)
        pool[k] = (float)uniform();
    for (size_t k = 0; k < batch_f; k++)
        batch[k] = (float)uniform();
    /* A fresh slot's pool state is NaN: a gather that read it would show. */
    for (int i = 0; i < n; i++) {
        int32_t v = slots[(size_t)i * c->slot_stride];
        if (LAJIT_SLOT_IS_FRESH(v))
            for (size_t k = 0; k < (size_t)H * st; k++)
                pool[(size_t)LAJIT_SLOT_FRESH_SLOT(v) * H * st + k] = NAN;
    }

    CUdeviceptr dpool = lj_gpu_alloc(pool_f * 4), dbatch = lj_gpu_alloc(batch_f * 4),
                dslots = lj_gpu_alloc((size_t)n * c->slot_stride * 4);
    lj_gpu_upload(dpool, pool, pool_f * 4);
    lj_gpu_upload(dslots, slots, (size_t)n * c->slot_stride * 4);
    lj_test_tensor tp, tb, ts;
    const int64_t pshape[4] = {P, H, R, C}, bshape[4] = {n, H, R, C}, sshape[1] = {n};
    const int64_t pstr[4] = {(int64_t)H * st, (int64_t)st, row, 1};
    const int64_t sstr[1] = {c->slot_stride};
    const DLDataType f32 = lj_test_dl_dtype(LJ_F32);
    DLTensor *tpool = lj_gpu_tensor(&tp, dpool, 0, 4, pshape, pstr, f32);
    DLTensor *tbatch = lj_gpu_tensor(&tb, dbatch, 0, 4, bshape, pstr, f32);
    DLTensor *tslots = lj_gpu_tensor(&ts, dslots, 0, 1, sshape, sstr, lj_test_dl_int32());
    CUstream stream;
    ASSERT_EQ(lj_gpu_driver()->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

    /* Gather into a poisoned batch. */
    lj_gpu_poison(dbatch, batch_f * 4);
    call(ctx, c, 0, tpool, tslots, tbatch, stream, dbatch, batch_f * 4);
    lj_gpu_download(got, dbatch, batch_f * 4);
    long long bad = 0;
    for (int i = 0; i < n; i++) {
        int32_t v = slots[(size_t)i * c->slot_stride];
        for (int h = 0; h < H; h++)
            for (int r = 0; r < R; r++)
                for (int e = 0; e < C; e++) {
                    size_t at = ((size_t)i * H + h) * st + (size_t)r * row + e;
                    float want =
                        v >= 0 ? pool[((size_t)v * H + h) * st + (size_t)r * row + e] : 0.f;
                    if (memcmp(&got[at], &want, 4) != 0 && bad++ < 5)
                        fprintf(stderr, "gather: state %d (slot %d) h %d [%d, %d] = %g, want %g\n",
                                i, (int)v, h, r, e, got[at], want);
                }
    }
    if (bad)
        lj_test_fail(__FILE__, __LINE__, "gather: %lld elements differ (P=%d n=%d R=%d C=%d)", bad,
                     P, n, R, C);

    /* Scatter a random batch into a poisoned pool. */
    lj_gpu_upload(dbatch, batch, batch_f * 4);
    lj_gpu_poison(dpool, pool_f * 4);
    call(ctx, c, 1, tpool, tslots, tbatch, stream, dpool, pool_f * 4);
    lj_gpu_download(got, dpool, pool_f * 4);
    int *from = malloc((size_t)P * sizeof *from); /* the batch state written to each slot */
    for (int s = 0; s < P; s++)
        from[s] = -1;
    for (int i = 0; i < n; i++) {
        int32_t v = slots[(size_t)i * c->slot_stride];
        if (v != LAJIT_SLOT_SKIP)
            from[LAJIT_SLOT_IS_FRESH(v) ? LAJIT_SLOT_FRESH_SLOT(v) : v] = i;
    }
    int written = 0;
    for (int s = 0; s < P; s++) {
        written += from[s] >= 0;
        for (int h = 0; h < H; h++)
            for (int r = 0; r < R; r++)
                for (int e = 0; e < C; e++) {
                    size_t at = ((size_t)s * H + h) * st + (size_t)r * row + e;
                    int ok_ =
                        from[s] >= 0
                            ? memcmp(&got[at],
                                     &batch[((size_t)from[s] * H + h) * st + (size_t)r * row + e],
                                     4) == 0
                            : isnan(got[at]);
                    if (!ok_ && bad++ < 5)
                        fprintf(stderr, "scatter: slot %d (state %d) h %d [%d, %d] = %g\n", s,
                                from[s], h, r, e, got[at]);
                }
    }
    if (bad)
        lj_test_fail(__FILE__, __LINE__, "scatter: %lld elements wrong (P=%d n=%d R=%d C=%d)", bad,
                     P, n, R, C);
    /* The padding between rows is never written: still poison. */
    if (row > C && !isnan(got[C]))
        lj_test_fail(__FILE__, __LINE__, "scatter wrote a row's padding");
    printf("P=%d n=%d H=%d R=%d C=%d row=%d slot_stride=%d graph=%d checked=%d: gather and "
           "scatter exact (%d slots written)\n",
           P, n, H, R, C, row, c->slot_stride, c->graph, c->checked, written);

    lj_gpu_driver()->cuStreamDestroy(stream);
    lj_gpu_free(dpool);
    lj_gpu_free(dbatch);
    lj_gpu_free(dslots);
    free(slots);
    free(perm);
    free(pool);
    free(batch);
    free(got);
    free(from);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(gather_and_scatter_against_host_copies)
{
    lj_gpu_init();
    pool_case c = {
        .P = 9, .n = 7, .H = 3, .R = 64, .C = 32, .row = 32, .slot_stride = 1, .seed = 11};
    run_case(&c);
    c = (pool_case){.P = 6,
                    .n = 10,
                    .H = 2,
                    .R = 128,
                    .C = 128,
                    .row = 128,
                    .slot_stride = 2,
                    .seed = 12}; /* more states than slots: the rest -1 */
    run_case(&c);
    c = (pool_case){.P = 5,
                    .n = 4,
                    .H = 3,
                    .R = 16,
                    .C = 6,
                    .row = 8,
                    .slot_stride = 1,
                    .seed = 13}; /* pairs of floats in padded rows */
    run_case(&c);
    c = (pool_case){.P = 4,
                    .n = 3,
                    .H = 2,
                    .R = 32,
                    .C = 64,
                    .row = 68,
                    .slot_stride = 3,
                    .seed = 14}; /* D ≠ E the other way, padded rows */
    run_case(&c);
    c = (pool_case){.P = 70001,
                    .n = 70000,
                    .H = 1,
                    .R = 4,
                    .C = 4,
                    .row = 4,
                    .slot_stride = 1,
                    .seed = 15}; /* more than 65535 states: the grid's x */
    run_case(&c);
}

LJ_TEST(graph_and_checked_mode)
{
    lj_gpu_init();
    pool_case c = {.P = 9,
                   .n = 7,
                   .H = 3,
                   .R = 64,
                   .C = 32,
                   .row = 32,
                   .slot_stride = 1,
                   .graph = 1,
                   .seed = 21};
    run_case(&c);
    c.graph = 0;
    c.checked = 1;
    c.seed = 22;
    run_case(&c);
    /* Checked mode refuses a slot past the pool, read back from the device. */
    lajit_ctx *ctx = open_ctx(1);
    enum { P = 3, H = 2, R = 8, C = 8 };
    CUdeviceptr dpool = lj_gpu_alloc(P * H * R * C * 4), dbatch = lj_gpu_alloc(2 * H * R * C * 4),
                dslots = lj_gpu_alloc(8);
    const int32_t bad[2] = {0, LAJIT_SLOT_FRESH(P)};
    lj_gpu_upload(dslots, bad, 8);
    lj_test_tensor tp, tb, ts;
    const int64_t pshape[4] = {P, H, R, C}, bshape[4] = {2, H, R, C}, sshape[1] = {2};
    const DLDataType f32 = lj_test_dl_dtype(LJ_F32);
    DLTensor *tpool = lj_gpu_tensor(&tp, dpool, 0, 4, pshape, NULL, f32);
    DLTensor *tbatch = lj_gpu_tensor(&tb, dbatch, 0, 4, bshape, NULL, f32);
    DLTensor *tslots = lj_gpu_tensor(&ts, dslots, 0, 1, sshape, NULL, lj_test_dl_int32());
    ASSERT_STATUS(lj_state_pool_scatter(ctx, tbatch, tslots, tpool, 1, NULL),
                  LAJIT_ERR_CHECK_FAILED);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "slots[1] = -5 names slot 3; the pool holds 3");
    lj_gpu_free(dpool);
    lj_gpu_free(dbatch);
    lj_gpu_free(dslots);
    lajit_ctx_destroy(ctx);
}
