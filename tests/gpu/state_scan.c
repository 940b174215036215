/* state_scan.c — lajit_attn_state_scan on the GPU against the whole sequence in float64.
 *
 * Each case draws random tokens for every (b, h) and cuts the sequence into P spans of random
 * lengths (0 and 1 included). The kernel's input is what each span computes alone, in float64
 * from its own tokens: forward, the span's final state from zero (M_j); reverse, the d_initial_state
 * of its backward without d_final_state (Mg_j). What it must return is read off one float64
 * recurrence over the whole sequence, DESIGN.md's and not the scan's formula: forward, the state
 * S_{a_j} after all tokens before span j (and S_N); reverse, the gradient λ G_{a_j+n_j+1} reaching
 * the span's final state from every later token and dS_N (dS_N itself when nothing follows), and
 * dS_0 = λ G_1, with G_t = λ G_{t+1} + σ q_tᵀ dO_t, G_N = dS_N + σ q_Nᵀ dO_N.
 *
 * Outputs are NaN-poisoned first; the relative L2 error of incoming_states and of final_state must
 * be ≤ 1e-5 and each span's ≤ 3e-5 of max(its norm, the mean norm) (fp32 carries over ≤ 17 spans
 * of float32-rounded inputs). Cases: forward and reverse, with and without the initial and final
 * states, no / weak / strong decay (s up to 4), P = 1, 2, 3, 17, int32 and int64 lengths, one per
 * span or per row (a [B, P] buffer as its transposed view), B = 2, H = 3, D = 64, E = 32 and
 * D = E = 128, the VK layout, incoming_states as a [B, P, ...] buffer's permuted view, one call
 * inside a captured CUDA graph, every span empty; and lengths beyond 2^31 (int64) checked by the scan formula, the
 * one case with no tokens behind it. Segments (n_j = -1: a span starting a new sequence, the
 * carry not passing through it) are checked against the scan's own recurrence with resets in
 * float64, with each row's total length (lj_state_scan's total_lengths: -1 for a row with a
 * reset). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "op_args.h"
#include "test.h"

#define TOL 1e-5

typedef struct scan_case {
    int B, H, P, D, E;
    int reverse; /* LAJIT_SCAN_REVERSE: gradient states */
    int vk;      /* LAJIT_STATE_VK: every state stored [.., E, D] */
    int len64;   /* lengths int64 (else int32) */
    int per_row; /* lengths [P, B] (a [B, P] buffer's transposed view), else [P] */
    int init;    /* initial_state given (S_0, or dS_N in reverse) */
    int final;   /* final_state wanted (S_N, or dS_0) */
    int decay;   /* 0: s NULL; 1: weak (s ≤ 0.05); 2: strong (s = 0.5, 2, 4) */
    int maxlen;  /* span lengths drawn from 0..maxlen */
    int bp_out;  /* incoming_states stored [B, P, H, .]: a permuted view */
    int graph;   /* the checked call is a captured graph's replay */
    int empty;   /* every span empty (N = 0): the carry passes through untouched */
    unsigned seed;
} scan_case;

static unsigned rng_state;

static double uniform(void) /* [-0.5, 0.5) */
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (double)(rng_state >> 8) / 16777216.0 - 0.5;
}

static int rand_int(int n) /* 0 .. n */
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (int)((rng_state >> 8) % (unsigned)(n + 1));
}

static float rate_of(const scan_case *c, int h)
{
    static const float strong[3] = {0.5f, 2.0f, 4.0f};
    if (c->decay == 1)
        return 0.002f + 0.016f * (float)h;
    return strong[h % 3];
}

/* Memory index of logical state element (d, e) inside one [D, E] (or VK [E, D]) state. */
static size_t elem(const scan_case *c, int d, int e)
{
    return c->vk ? (size_t)e * c->D + d : (size_t)d * c->E + e;
}

/* x += a * yᵀ z for row vectors y [D], z [E], into a [D, E] double state. */
static void outer(double *x, const double *y, const double *z, int D, int E, double a)
{
    for (int d = 0; d < D; d++)
        for (int e = 0; e < E; e++)
            x[(size_t)d * E + e] += a * y[d] * z[e];
}

static void scale(double *x, size_t n, double a)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= a;
}

/* Compares a device result with the float64 reference: relative L2 over all, and each state's
 * own bound. Returns the relative error; fails the test on a violation. */
static double compare(const scan_case *c, const char *what, const float *got, const double *ref,
                      int n_states)
{
    const size_t DE = (size_t)c->D * c->E;
    double err2 = 0, ref2 = 0, mean = 0;
    for (int i = 0; i < n_states; i++) {
        double r = 0;
        for (size_t k = 0; k < DE; k++)
            r += ref[i * DE + k] * ref[i * DE + k];
        mean += sqrt(r) / n_states;
    }
    for (int i = 0; i < n_states; i++) {
        double e2 = 0, r2 = 0;
        for (size_t k = 0; k < DE; k++) {
            double g = got[i * DE + k], r = ref[i * DE + k];
            if (!isfinite(g))
                lj_test_fail(__FILE__, __LINE__, "%s[%d] element %zu is %g (seed %u)", what, i, k,
                             g, c->seed);
            e2 += (g - r) * (g - r);
            r2 += r * r;
        }
        double bound = 3 * TOL * fmax(sqrt(r2), mean);
        if (!(sqrt(e2) <= bound))
            lj_test_fail(__FILE__, __LINE__,
                         "%s[%d]: error %.3g > %.3g (norm %.3g, mean %.3g; P=%d D=%d E=%d rev=%d "
                         "vk=%d decay=%d seed %u)",
                         what, i, sqrt(e2), bound, sqrt(r2), mean, c->P, c->D, c->E, c->reverse,
                         c->vk, c->decay, c->seed);
        err2 += e2;
        ref2 += r2;
    }
    double rel = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    if (!(rel <= TOL))
        lj_test_fail(__FILE__, __LINE__, "%s: relative L2 error %.3g > %.3g (seed %u)", what, rel,
                     TOL, c->seed);
    return rel;
}

static void run_case(lajit_ctx *ctx, const scan_case *c)
{
    const int B = c->B, H = c->H, P = c->P, D = c->D, E = c->E;
    const size_t DE = (size_t)D * E, BH = (size_t)B * H, NS = (size_t)P * BH;
    const double sigma = 0.5;
    ASSERT_TRUE(P <= 64);
    rng_state = c->seed;

    /* Lengths: per row, or one row for all; a 0 and a 1 planted when P allows. */
    int *len = calloc((size_t)B * P, sizeof *len); /* [b][j] */
    for (int b = 0; b < B; b++) {
        for (int j = 0; j < P; j++)
            len[b * P + j] = (b == 0 || c->per_row) ? rand_int(c->maxlen) : len[j];
        if (P >= 3 && (b == 0 || c->per_row)) {
            len[b * P + 1 + b % (P - 2)] = 0;
            len[b * P + (2 + b) % P] = 1;
        }
        int N = 0;
        for (int j = 0; j < P; j++)
            N += len[b * P + j];
        if (N == 0) /* a sequence with tokens unless the case asks for none */
            len[b * P + P - 1] = 1 + rand_int(c->maxlen - 1);
        if (c->empty)
            memset(len + (size_t)b * P, 0, (size_t)P * sizeof *len);
    }
    float *s = malloc((size_t)H * sizeof *s);
    for (int h = 0; h < H; h++)
        s[h] = c->decay ? rate_of(c, h) : 0.0f;

    /* Host images in device order, and the float64 answers in logical [.., D, E] order. */
    float *m_host = malloc(NS * DE * 4), *init_host = malloc(BH * DE * 4);
    double *ref_out = calloc(NS * DE, sizeof(double)), *ref_fin = calloc(BH * DE, sizeof(double));
    double *x = malloc(DE * 8), *carry = malloc(DE * 8), *mloc = malloc(DE * 8);
    for (int b = 0; b < B; b++) {
        int N = 0;
        for (int j = 0; j < P; j++)
            N += len[b * P + j];
        for (int h = 0; h < H; h++) {
            const double lam = c->decay ? exp(-(double)s[h]) : 1.0;
            const size_t bh = (size_t)b * H + h;
            /* Tokens: y_t [D], z_t [E] (k, v forward; q, dO reverse), t = 0 .. N−1. */
            double *y = malloc(((size_t)N + 1) * D * 8), *z = malloc(((size_t)N + 1) * E * 8);
            for (size_t i = 0; i < (size_t)N * D; i++)
                y[i] = uniform();
            for (size_t i = 0; i < (size_t)N * E; i++)
                z[i] = uniform();
            /* The initial carry (S_0, or dS_N): float32 values, used exactly by the reference. */
            for (int d = 0; d < D; d++) {
                for (int e = 0; e < E; e++) {
                    float v = c->init ? (float)(0.5 * uniform()) : 0.0f;
                    init_host[bh * DE + elem(c, d, e)] = v;
                    carry[(size_t)d * E + e] = v;
                }
            }
            /* Each span alone, in float64 from its own tokens. */
            int a = 0;
            for (int j = 0; j < P; j++) {
                const int n = len[b * P + j];
                memset(mloc, 0, DE * 8);
                if (!c->reverse) {
                    for (int t = a; t < a + n; t++) { /* M_j: the span's state from zero */
                        scale(mloc, DE, lam);
                        outer(mloc, y + (size_t)t * D, z + (size_t)t * E, D, E, 1.0);
                    }
                } else {
                    for (int t = a + n - 1; t >= a; t--) { /* G within the span, zero after it */
                        scale(mloc, DE, lam);
                        outer(mloc, y + (size_t)t * D, z + (size_t)t * E, D, E, sigma);
                    }
                    scale(mloc, DE, lam); /* Mg_j = λ G_{a_j+1}: the span's dS_0 */
                }
                float *dst = m_host + ((size_t)j * BH + bh) * DE;
                for (int d = 0; d < D; d++)
                    for (int e = 0; e < E; e++)
                        dst[elem(c, d, e)] = (float)mloc[(size_t)d * E + e];
                a += n;
            }
            /* The whole sequence, token by token. */
            double *out = ref_out + bh * DE; /* span j at out + j * BH * DE */
            if (!c->reverse) {
                memcpy(x, carry, DE * 8); /* S_0 */
                int t = 0;
                for (int j = 0; j < P; j++) {
                    memcpy(out + (size_t)j * BH * DE, x, DE * 8); /* S_{a_j} */
                    for (int k = 0; k < len[b * P + j]; k++, t++) {
                        scale(x, DE, lam);
                        outer(x, y + (size_t)t * D, z + (size_t)t * E, D, E, 1.0);
                    }
                }
                memcpy(ref_fin + bh * DE, x, DE * 8); /* S_N */
            } else {
                /* End of each span (1-based token index e_j); spans ending at N get dS_N. */
                int ends[64];
                int acc = 0;
                for (int j = 0; j < P; j++) {
                    acc += len[b * P + j];
                    ends[j] = acc;
                    if (acc == N)
                        memcpy(out + (size_t)j * BH * DE, carry, DE * 8);
                }
                /* G_t from t = N down to 1 (x holds G_t); λ G_t is what reaches S_{t−1}. */
                for (int t = N; t >= 1; t--) {
                    if (t == N) {
                        memcpy(x, carry, DE * 8); /* dS_N, undecayed */
                    } else {
                        scale(x, DE, lam);
                    }
                    outer(x, y + (size_t)(t - 1) * D, z + (size_t)(t - 1) * E, D, E, sigma);
                    for (int j = 0; j < P; j++) {
                        if (ends[j] != t - 1)
                            continue;
                        double *o = out + (size_t)j * BH * DE;
                        for (size_t i = 0; i < DE; i++)
                            o[i] = lam * x[i];
                    }
                }
                double *fin = ref_fin + bh * DE; /* dS_0 = λ G_1, or dS_N with no token */
                for (size_t i = 0; i < DE; i++)
                    fin[i] = N ? lam * x[i] : carry[i];
            }
            free(y);
            free(z);
        }
    }

    /* Device tensors. */
    const int X = c->vk ? E : D, Y = c->vk ? D : E;
    CUdeviceptr dm = lj_gpu_alloc(NS * DE * 4), dout = lj_gpu_alloc(NS * DE * 4);
    CUdeviceptr dinit = lj_gpu_alloc(BH * DE * 4), dfin = lj_gpu_alloc(BH * DE * 4);
    CUdeviceptr ds = lj_gpu_alloc((size_t)H * 4), dlen = lj_gpu_alloc((size_t)B * P * 8);
    lj_gpu_upload(dm, m_host, NS * DE * 4);
    lj_gpu_upload(dinit, init_host, BH * DE * 4);
    lj_gpu_upload(ds, s, (size_t)H * 4);
    /* Lengths in memory: [B][P] per row (passed as its [P, B] view), else [P]. */
    if (c->len64) {
        int64_t *l = malloc((size_t)B * P * 8);
        for (int i = 0; i < B * P; i++)
            l[i] = len[i];
        lj_gpu_upload(dlen, l, (size_t)(c->per_row ? B : 1) * P * 8);
        free(l);
    } else {
        lj_gpu_upload(dlen, len, (size_t)(c->per_row ? B : 1) * P * 4);
    }
    lj_test_tensor tm, tout, tinit, tfin, ts, tlen;
    const int64_t sshape[5] = {P, B, H, X, Y};
    const int64_t bp_strides[5] = {(int64_t)H * DE, (int64_t)P * H * DE, (int64_t)DE, Y, 1};
    const int64_t st_shape[4] = {B, H, X, Y}, hshape[1] = {H};
    const int64_t lshape[2] = {P, B}, lstrides[2] = {1, P};
    const DLDataType f32 = lj_test_dl_dtype(LJ_F32);
    const DLDataType i64 = {kDLInt, 64, 1};
    lajit_attn_state_scan_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.local_states = lj_gpu_tensor(&tm, dm, 0, 5, sshape, NULL, f32);
    a.incoming_states =
        lj_gpu_tensor(&tout, dout, 0, 5, sshape, c->bp_out ? bp_strides : NULL, f32);
    a.lengths = lj_gpu_tensor(&tlen, dlen, 0, c->per_row ? 2 : 1, lshape,
                              c->per_row ? lstrides : NULL, c->len64 ? i64 : lj_test_dl_int32());
    a.s = c->decay ? lj_gpu_tensor(&ts, ds, 0, 1, hshape, NULL, f32) : NULL;
    a.initial_state = c->init ? lj_gpu_tensor(&tinit, dinit, 0, 4, st_shape, NULL, f32) : NULL;
    a.final_state = c->final ? lj_gpu_tensor(&tfin, dfin, 0, 4, st_shape, NULL, f32) : NULL;
    a.flags = (c->vk ? LAJIT_STATE_VK : 0u) | (c->reverse ? LAJIT_SCAN_REVERSE : 0u);

    const lj_driver *drv = lj_gpu_driver();
    CUstream stream;
    ASSERT_EQ(drv->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    a.stream = stream;
    lj_gpu_poison(dout, NS * DE * 4);
    lj_gpu_poison(dfin, BH * DE * 4);
    lajit_status st = lajit_attn_state_scan(ctx, &a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "lajit_attn_state_scan: %s: %s", lajit_status_string(st),
                     lajit_errmsg(ctx));
    lj_gpu_stream_sync(stream);
    if (c->graph) {
        /* The plan exists now: capture the call, poison again, replay the graph. */
        CUgraph g;
        CUgraphExec ge;
        lj_gpu_poison(dout, NS * DE * 4);
        lj_gpu_poison(dfin, BH * DE * 4);
        ASSERT_EQ(drv->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                  CUDA_SUCCESS);
        ASSERT_OK(lajit_attn_state_scan(ctx, &a));
        ASSERT_EQ(drv->cuStreamEndCapture(stream, &g), CUDA_SUCCESS);
        ASSERT_EQ(drv->cuGraphInstantiate(&ge, g, 0), CUDA_SUCCESS);
        ASSERT_EQ(drv->cuGraphLaunch(ge, stream), CUDA_SUCCESS);
        lj_gpu_stream_sync(stream);
        drv->cuGraphExecDestroy(ge);
        drv->cuGraphDestroy(g);
    }

    /* Results back to logical [j][b][h][d][e] order. */
    float *mem = malloc(NS * DE * 4), *got = malloc(NS * DE * 4);
    lj_gpu_download(mem, dout, NS * DE * 4);
    for (int j = 0; j < P; j++)
        for (size_t bh = 0; bh < BH; bh++) {
            size_t b = bh / H, h = bh % H;
            size_t base = c->bp_out ? ((b * P + j) * H + h) * DE : ((size_t)j * BH + bh) * DE;
            for (int d = 0; d < D; d++)
                for (int e = 0; e < E; e++)
                    got[((size_t)j * BH + bh) * DE + (size_t)d * E + e] = mem[base + elem(c, d, e)];
        }
    double rel = compare(c, "incoming_states", got, ref_out, (int)NS), relf = 0;
    if (c->final) {
        lj_gpu_download(mem, dfin, BH * DE * 4);
        for (size_t bh = 0; bh < BH; bh++)
            for (int d = 0; d < D; d++)
                for (int e = 0; e < E; e++)
                    got[bh * DE + (size_t)d * E + e] = mem[bh * DE + elem(c, d, e)];
        relf = compare(c, "final_state", got, ref_fin, (int)BH);
    } else {
        /* Not asked for: untouched. */
        lj_gpu_download(mem, dfin, BH * DE * 4);
        for (size_t i = 0; i < BH * DE; i++)
            if (!isnan(mem[i]))
                lj_test_fail(__FILE__, __LINE__, "final_state written though not given");
    }
    printf("P=%d B=%d H=%d D=%d E=%d %s vk=%d len%s%s init=%d final=%d decay=%d graph=%d: "
           "incoming %.2e final %.2e\n",
           P, B, H, D, E, c->reverse ? "reverse" : "forward", c->vk, c->len64 ? "64" : "32",
           c->per_row ? " per-row" : "", c->init, c->final, c->decay, c->graph, rel, relf);

    drv->cuStreamDestroy(stream);
    lj_gpu_free(dm);
    lj_gpu_free(dout);
    lj_gpu_free(dinit);
    lj_gpu_free(dfin);
    lj_gpu_free(ds);
    lj_gpu_free(dlen);
    free(len);
    free(s);
    free(m_host);
    free(init_host);
    free(ref_out);
    free(ref_fin);
    free(x);
    free(carry);
    free(mloc);
    free(mem);
    free(got);
}

static lajit_ctx *open_ctx(void)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DISK_CACHE;
    desc.autotune = LAJIT_AUTOTUNE_OFF;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    return ctx;
}

static scan_case base(int P, int reverse, unsigned seed)
{
    scan_case c = {.B = 2,
                   .H = 3,
                   .P = P,
                   .D = 64,
                   .E = 32,
                   .reverse = reverse,
                   .init = 1,
                   .final = 1,
                   .decay = 1,
                   .maxlen = 9,
                   .seed = seed};
    return c;
}

/* Forward: every P, each decay, with and without the states. */
LJ_TEST(forward_against_the_whole_sequence)
{
    lj_gpu_init();
    lajit_ctx *ctx = open_ctx();
    static const int Ps[4] = {1, 2, 3, 17};
    unsigned seed = 101;
    for (int i = 0; i < 4; i++) {
        for (int decay = 0; decay <= 2; decay++) {
            scan_case c = base(Ps[i], 0, seed++);
            c.decay = decay;
            run_case(ctx, &c);
        }
        scan_case c = base(Ps[i], 0, seed++);
        c.init = 0;
        c.final = i % 2;
        run_case(ctx, &c);
    }
    lajit_ctx_destroy(ctx);
}

/* Reverse (gradient states): the same sweep against DESIGN's G_t. */
LJ_TEST(reverse_against_the_whole_sequence)
{
    lj_gpu_init();
    lajit_ctx *ctx = open_ctx();
    static const int Ps[4] = {1, 2, 3, 17};
    unsigned seed = 201;
    for (int i = 0; i < 4; i++) {
        for (int decay = 0; decay <= 2; decay++) {
            scan_case c = base(Ps[i], 1, seed++);
            c.decay = decay;
            run_case(ctx, &c);
        }
        scan_case c = base(Ps[i], 1, seed++);
        c.init = 0; /* no dS_N */
        c.final = (i + 1) % 2;
        run_case(ctx, &c);
    }
    lajit_ctx_destroy(ctx);
}

/* Layouts and argument forms: int64 and per-row lengths, VK, a permuted incoming_states, the
 * wide state, a graph replay. */
LJ_TEST(layouts_lengths_and_graph)
{
    lj_gpu_init();
    lajit_ctx *ctx = open_ctx();
    scan_case c = base(3, 0, 301);
    c.len64 = 1;
    c.per_row = 1;
    run_case(ctx, &c);
    c = base(17, 1, 302);
    c.per_row = 1;
    c.decay = 2;
    run_case(ctx, &c);
    c = base(3, 0, 303); /* VK, D ≠ E */
    c.vk = 1;
    c.decay = 2;
    run_case(ctx, &c);
    c = base(17, 1, 304);
    c.vk = 1;
    c.len64 = 1;
    run_case(ctx, &c);
    c = base(3, 0, 305);
    c.bp_out = 1;
    c.per_row = 1;
    run_case(ctx, &c);
    c = base(3, 1, 306); /* D = E = 128 */
    c.D = c.E = 128;
    c.maxlen = 6;
    c.decay = 2;
    run_case(ctx, &c);
    c = base(2, 0, 307);
    c.D = c.E = 128;
    c.maxlen = 6;
    c.graph = 1;
    run_case(ctx, &c);
    c = base(17, 1, 308);
    c.graph = 1;
    c.bp_out = 1;
    run_case(ctx, &c);
    for (int rev = 0; rev <= 1; rev++) { /* no token at all: S_N = S_0, dS_0 = dS_N */
        c = base(3, rev, 309 + (unsigned)rev);
        c.empty = 1;
        c.decay = 2;
        run_case(ctx, &c);
    }
    lajit_ctx_destroy(ctx);
}

/* Lengths past 2^31 (int64): no tokens can stand behind them, so the reference is the scan's own
 * recurrence in float64 over random local states, with rates small enough that λ^n stays in
 * float's range (s·n up to ~3). */
LJ_TEST(lengths_beyond_int32)
{
    lj_gpu_init();
    lajit_ctx *ctx = open_ctx();
    enum { B = 2, H = 3, P = 5, D = 16, E = 16, DE = D * E };
    static const int64_t n[P] = {3000000000LL, 0, 1, 1LL << 40, 7000000000LL};
    float s[3] = {1e-12f, 2.5e-12f, 1e-10f};
    for (int rev = 0; rev <= 1; rev++) {
        rng_state = 401u + (unsigned)rev;
        const size_t NS = (size_t)P * B * H;
        float *m = malloc(NS * DE * 4), *got = malloc(NS * DE * 4),
              *fin = malloc((size_t)B * H * DE * 4);
        for (size_t i = 0; i < NS * DE; i++)
            m[i] = (float)uniform();
        CUdeviceptr dm = lj_gpu_alloc(NS * DE * 4), dout = lj_gpu_alloc(NS * DE * 4),
                    dfin = lj_gpu_alloc((size_t)B * H * DE * 4), dlen = lj_gpu_alloc(P * 8),
                    ds = lj_gpu_alloc(H * 4);
        lj_gpu_upload(dm, m, NS * DE * 4);
        lj_gpu_upload(dlen, n, P * 8);
        lj_gpu_upload(ds, s, H * 4);
        lj_gpu_poison(dout, NS * DE * 4);
        lj_gpu_poison(dfin, (size_t)B * H * DE * 4);
        lj_test_tensor tm, tout, tfin, tlen, ts;
        const int64_t sshape[5] = {P, B, H, D, E}, fshape[4] = {B, H, D, E}, lshape[1] = {P},
                      hshape[1] = {H};
        const DLDataType f32 = lj_test_dl_dtype(LJ_F32), i64 = {kDLInt, 64, 1};
        lajit_attn_state_scan_args a;
        memset(&a, 0, sizeof a);
        a.struct_size = sizeof a;
        a.local_states = lj_gpu_tensor(&tm, dm, 0, 5, sshape, NULL, f32);
        a.incoming_states = lj_gpu_tensor(&tout, dout, 0, 5, sshape, NULL, f32);
        a.final_state = lj_gpu_tensor(&tfin, dfin, 0, 4, fshape, NULL, f32);
        a.lengths = lj_gpu_tensor(&tlen, dlen, 0, 1, lshape, NULL, i64);
        a.s = lj_gpu_tensor(&ts, ds, 0, 1, hshape, NULL, f32);
        a.flags = rev ? LAJIT_SCAN_REVERSE : 0u;
        ASSERT_OK(lajit_attn_state_scan(ctx, &a));
        lj_gpu_sync();
        lj_gpu_download(got, dout, NS * DE * 4);
        lj_gpu_download(fin, dfin, (size_t)B * H * DE * 4);
        double err2 = 0, ref2 = 0;
        for (int bh = 0; bh < B * H; bh++) {
            const double rate = s[bh % H];
            for (int k = 0; k < DE; k++) {
                double x = 0;
                for (int i = 0; i < P; i++) {
                    int j = rev ? P - 1 - i : i;
                    double g = got[((size_t)j * B * H + bh) * DE + k];
                    err2 += (g - x) * (g - x);
                    ref2 += x * x;
                    x = exp(-rate * (double)n[j]) * x + m[((size_t)j * B * H + bh) * DE + k];
                }
                double g = fin[(size_t)bh * DE + k];
                err2 += (g - x) * (g - x);
                ref2 += x * x;
            }
        }
        double rel = sqrt(err2 / ref2);
        printf("lengths up to 2^40, %s: relative error %.2e\n", rev ? "reverse" : "forward", rel);
        ASSERT_LE_F(rel, TOL);
        lj_gpu_free(dm);
        lj_gpu_free(dout);
        lj_gpu_free(dfin);
        lj_gpu_free(dlen);
        lj_gpu_free(ds);
        free(m);
        free(got);
        free(fin);
    }
    lajit_ctx_destroy(ctx);
}

/* One segmented scan: P spans, lengths drawn from -1 .. 5 (a -1 planted in every row that the
 * draw left without one, except a row kept free of resets when the lengths are per row), the
 * reference the recurrence X <- (n_j = -1 ? M_j : λ^{n_j} X + M_j) in float64, and the totals (-1
 * for a row holding a reset, else Σ n_j) read back through lj_state_scan. An infinite initial
 * state checks that a reset selects M_j: the spans after it must be finite. */
static void run_segments(lajit_ctx *ctx, int P, int reverse, int decay, int len64, int per_row,
                         int inf_init, unsigned seed)
{
    enum { B = 2, H = 3, D = 16, E = 12, DE = D * E };
    const int LB = per_row ? B : 1;
    const size_t BH = (size_t)B * H, NS = (size_t)P * BH;
    rng_state = seed;
    int64_t *n = malloc((size_t)LB * P * sizeof *n); /* [lb][j] */
    for (int lb = 0; lb < LB; lb++) {
        int resets = 0;
        for (int j = 0; j < P; j++) {
            n[lb * P + j] = (int64_t)rand_int(6) - 1;
            resets += n[lb * P + j] == -1;
        }
        if (lb == 1) { /* the second row: no reset (its total is Σ n_j) */
            for (int j = 0; j < P; j++)
                if (n[lb * P + j] == -1)
                    n[lb * P + j] = 2;
        } else if (!resets) {
            n[lb * P + (P > 1 ? 1 : 0)] = -1;
        }
    }
    if (inf_init) /* the first span in walk order carries the infinite state; the next resets */
        n[reverse ? P - 2 : 1] = -1;
    float s[H];
    for (int h = 0; h < H; h++)
        s[h] = decay ? 0.1f + 0.4f * (float)h : 0.0f;
    float *m = malloc(NS * DE * 4), *init = malloc(BH * DE * 4), *got = malloc(NS * DE * 4),
          *fin = malloc(BH * DE * 4);
    for (size_t i = 0; i < NS * DE; i++)
        m[i] = (float)uniform();
    for (size_t i = 0; i < BH * DE; i++)
        init[i] = inf_init ? INFINITY : (float)uniform();
    CUdeviceptr dm = lj_gpu_alloc(NS * DE * 4), dout = lj_gpu_alloc(NS * DE * 4),
                dinit = lj_gpu_alloc(BH * DE * 4), dfin = lj_gpu_alloc(BH * DE * 4),
                dlen = lj_gpu_alloc((size_t)LB * P * 8), ds = lj_gpu_alloc(H * 4),
                dtot = lj_gpu_alloc((size_t)LB * 8);
    lj_gpu_upload(dm, m, NS * DE * 4);
    lj_gpu_upload(dinit, init, BH * DE * 4);
    lj_gpu_upload(ds, s, H * 4);
    if (len64) {
        lj_gpu_upload(dlen, n, (size_t)LB * P * 8);
    } else {
        int32_t *n32 = malloc((size_t)LB * P * 4);
        for (int i = 0; i < LB * P; i++)
            n32[i] = (int32_t)n[i];
        lj_gpu_upload(dlen, n32, (size_t)LB * P * 4);
        free(n32);
    }
    lj_gpu_poison(dout, NS * DE * 4);
    lj_gpu_poison(dfin, BH * DE * 4);
    lj_gpu_poison(dtot, (size_t)LB * 8);
    lj_test_tensor tm, tout, tinit, tfin, tlen, ts, ttot;
    const int64_t sshape[5] = {P, B, H, D, E}, fshape[4] = {B, H, D, E}, hshape[1] = {H};
    const int64_t lshape[2] = {P, B}, lstrides[2] = {1, P}, tshape[1] = {LB};
    const DLDataType f32 = lj_test_dl_dtype(LJ_F32), i64 = {kDLInt, 64, 1};
    lajit_attn_state_scan_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.local_states = lj_gpu_tensor(&tm, dm, 0, 5, sshape, NULL, f32);
    a.incoming_states = lj_gpu_tensor(&tout, dout, 0, 5, sshape, NULL, f32);
    a.initial_state = lj_gpu_tensor(&tinit, dinit, 0, 4, fshape, NULL, f32);
    a.final_state = lj_gpu_tensor(&tfin, dfin, 0, 4, fshape, NULL, f32);
    a.lengths = lj_gpu_tensor(&tlen, dlen, 0, per_row ? 2 : 1, lshape, per_row ? lstrides : NULL,
                              len64 ? i64 : lj_test_dl_int32());
    a.s = decay ? lj_gpu_tensor(&ts, ds, 0, 1, hshape, NULL, f32) : NULL;
    a.flags = reverse ? LAJIT_SCAN_REVERSE : 0u;
    DLTensor *tot = lj_gpu_tensor(&ttot, dtot, 0, 1, tshape, NULL, i64);
    lajit_status st = lj_state_scan(ctx, &a, tot);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "lj_state_scan: %s: %s", lajit_status_string(st),
                     lajit_errmsg(ctx));
    lj_gpu_sync();
    lj_gpu_download(got, dout, NS * DE * 4);
    lj_gpu_download(fin, dfin, BH * DE * 4);
    int64_t totals[B];
    lj_gpu_download(totals, dtot, (size_t)LB * 8);
    for (int lb = 0; lb < LB; lb++) {
        int64_t want = 0;
        int reset = 0;
        for (int j = 0; j < P; j++) {
            want += n[lb * P + j];
            reset |= n[lb * P + j] == -1;
        }
        want = reset ? -1 : want;
        if (totals[lb] != want)
            lj_test_fail(__FILE__, __LINE__, "total_lengths[%d] = %lld, expected %lld (seed %u)",
                         lb, (long long)totals[lb], (long long)want, seed);
    }
    double err2 = 0, ref2 = 0;
    for (size_t bh = 0; bh < BH; bh++) {
        const int b = (int)(bh / H), h = (int)(bh % H), lb = per_row ? b : 0;
        for (int k = 0; k < DE; k++) {
            double x = init[bh * DE + k];
            for (int i = 0; i <= P; i++) {
                const int j = reverse ? P - 1 - i : i;
                const double g = i < P ? got[((size_t)j * BH + bh) * DE + k] : fin[bh * DE + k];
                if (!isfinite(x)) { /* the infinite carry before the first reset: itself */
                    if (g != x)
                        lj_test_fail(__FILE__, __LINE__,
                                     "span %d element %d is %g, expected %g (seed %u)", j, k, g, x,
                                     seed);
                } else {
                    if (!isfinite(g))
                        lj_test_fail(__FILE__, __LINE__, "span %d element %d is %g (seed %u)", j, k,
                                     g, seed);
                    err2 += (g - x) * (g - x);
                    ref2 += x * x;
                }
                if (i == P)
                    break;
                const int64_t nj = n[lb * P + j];
                const double mj = m[((size_t)j * BH + bh) * DE + k];
                x = nj == -1 ? mj : (decay ? exp(-(double)s[h] * (double)nj) : 1.0) * x + mj;
            }
        }
    }
    double rel = sqrt(err2 / ref2);
    printf("segments P=%d %s decay=%d len%d%s%s: relative error %.2e, totals %lld %lld\n", P,
           reverse ? "reverse" : "forward", decay, len64 ? 64 : 32, per_row ? " per-row" : "",
           inf_init ? " inf-init" : "", rel, (long long)totals[0],
           (long long)(LB > 1 ? totals[1] : 0));
    ASSERT_LE_F(rel, TOL);
    lj_gpu_free(dm);
    lj_gpu_free(dout);
    lj_gpu_free(dinit);
    lj_gpu_free(dfin);
    lj_gpu_free(dlen);
    lj_gpu_free(ds);
    lj_gpu_free(dtot);
    free(n);
    free(m);
    free(init);
    free(got);
    free(fin);
}

/* Segments: both directions, with and without decay, int32 and int64 lengths, one row and per
 * row, an infinite carry cut by a reset, P from 2 to 17 (a reset inside an UNROLL group and at
 * its edges). */
LJ_TEST(segments_reset_the_carry)
{
    lj_gpu_init();
    lajit_ctx *ctx = open_ctx();
    unsigned seed = 501;
    static const int Ps[3] = {2, 5, 17};
    for (int i = 0; i < 3; i++)
        for (int reverse = 0; reverse <= 1; reverse++)
            for (int decay = 0; decay <= 1; decay++)
                for (int len64 = 0; len64 <= 1; len64++)
                    run_segments(ctx, Ps[i], reverse, decay, len64, (i + len64) % 2, 0, seed++);
    for (int reverse = 0; reverse <= 1; reverse++)
        for (int decay = 0; decay <= 1; decay++)
            run_segments(ctx, 9, reverse, decay, reverse, 1, 1, seed++);
    lajit_ctx_destroy(ctx);
}
