/* simple_gla.c — the outside family examples/families/simple_gla_fwd (the gated chunked forward,
 * issue 21) on the GPU through the public path only: a context given, with lajit_ctx_add_families, the source
 * tree's examples/families, lajit_launch with the tensors and the scale by name, checked against
 * the float64 recurrence (tests/ref/gla_ref.c) with DESIGN.md's tolerances. Fresh random inputs
 * and gates, NaN-poisoned outputs; ragged last chunks (N = 1000, 1, 65), D = E = 128, 64/64 and
 * 128/64, f16 and bf16, with and without h0 / ht, FLA's [B, N, H, .] layout as strided views
 * (g included), and strong gates (down to -8 per token: factors outside float's range if they
 * were split as exp(b_i)·exp(−b_j)), and shapes whose defaults take each kind of configuration.
 * Skipped (exit 77) without an sm_90a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_cases.h"
#include "gla_ref.h"
#include "gpu.h"
#include "la_ref.h"
#include "test.h"

typedef struct gla_case {
    lj_dtype dtype;
    int B, H, N, D, E;
    int h0, ht;  /* initial state given, final state wanted */
    int bnhd;    /* q, k, v, o stored [B, N, H, .] and g [B, N, H] (strided views) */
    float gmin;  /* gates uniform in [gmin, 0] */
    float scale; /* 0: 1/sqrt(D) */
    unsigned seed;
    int graph; /* launched on a stream once (the plan), then captured in a CUDA graph and the
                  graph replayed on fresh poison: what is checked is the replay's output */
} gla_case;

static unsigned gate_rng;

static float gate_uniform(float lo)
{
    gate_rng = gate_rng * 1664525u + 1013904223u;
    return lo * ((float)(gate_rng >> 8) / 16777216.0f);
}

/* Memory offset of logical element (b, h, t, x) of a [B, H, N, X] tensor stored [B, H, N, X]
 * or, with bnhd, [B, N, H, X]; and the view's strides. */
static void strides_of(const gla_case *c, int X, int64_t s[4])
{
    const int64_t H = c->H, N = c->N;
    if (c->bnhd) {
        s[0] = N * H * X, s[1] = X, s[2] = H * X, s[3] = 1;
    } else {
        s[0] = H * N * X, s[1] = N * X, s[2] = X, s[3] = 1;
    }
}

/* Host logical (b, h, t, x) floats to device memory order, as dt. */
static CUdeviceptr upload_seq(const gla_case *c, const float *logical, int X, lj_dtype dt,
                              const int64_t s[4])
{
    size_t n = (size_t)c->B * c->H * c->N * X;
    float *mem = malloc(n * 4);
    ASSERT_TRUE(mem);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++)
            for (int t = 0; t < c->N; t++)
                memcpy(mem + b * s[0] + h * s[1] + t * s[2],
                       logical + (((size_t)b * c->H + h) * c->N + t) * X, (size_t)X * 4);
    CUdeviceptr d = lj_gpu_alloc(n * lj_test_dtype_size(dt));
    lj_gpu_upload_as(d, mem, n, dt);
    free(mem);
    return d;
}

static void run(gla_case c)
{
    lj_gpu_init();
    if (strcmp(lj_gpu_device()->info.arch, "sm_90a") != 0)
        lj_test_skip("simple_gla_fwd needs an sm_90a GPU");
    case_seed(c.seed);
    gate_rng = c.seed * 7919u + 1u;
    const lj_dtype dt = c.dtype;
    const int B = c.B, H = c.H, N = c.N, D = c.D, E = c.E;
    const double sigma = c.scale != 0 ? c.scale : 1.0 / sqrt((double)D);
    const size_t heads = (size_t)B * H, nq = heads * N * D, nv = heads * N * E, ng = heads * N,
                 nst = heads * D * E;

    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), *g = malloc(ng * 4);
    float *h0 = malloc(nst * 4);
    ASSERT_TRUE(q && k && v && g && h0);
    case_random_fill(q, nq, 0.5f, dt);
    case_random_fill(k, nq, 0.5f, dt);
    case_random_fill(v, nv, 0.5f, dt);
    for (size_t i = 0; i < ng; i++)
        g[i] = gate_uniform(c.gmin);
    case_random_fill(h0, nst, 1.0f, LJ_F32);

    int64_t sq[4], sv[4], sg[3];
    strides_of(&c, D, sq);
    strides_of(&c, E, sv);
    if (c.bnhd) {
        sg[0] = (int64_t)N * H, sg[1] = 1, sg[2] = H;
    } else {
        sg[0] = (int64_t)H * N, sg[1] = N, sg[2] = 1;
    }
    CUdeviceptr dq = upload_seq(&c, q, D, dt, sq), dk = upload_seq(&c, k, D, dt, sq);
    CUdeviceptr dv = upload_seq(&c, v, E, dt, sv);
    float *gmem = malloc(ng * 4);
    ASSERT_TRUE(gmem);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < N; t++)
                gmem[b * sg[0] + h * sg[1] + t * sg[2]] = g[((size_t)b * H + h) * N + t];
    CUdeviceptr dg = lj_gpu_alloc(ng * 4), dh0 = lj_gpu_alloc(nst * 4);
    CUdeviceptr dout = lj_gpu_alloc(nv * lj_test_dtype_size(dt)), dht = lj_gpu_alloc(nst * 4);
    lj_gpu_upload(dg, gmem, ng * 4);
    lj_gpu_upload(dh0, h0, nst * 4);
    lj_gpu_poison(dout, nv * lj_test_dtype_size(dt));
    lj_gpu_poison(dht, nst * 4);

    const int64_t shq[4] = {B, H, N, D}, shv[4] = {B, H, N, E}, shg[3] = {B, H, N},
                  shs[4] = {B, H, D, E};
    lj_test_tensor tq, tk, tv, tg, th0, to, tht;
    DLDataType ddt = lj_test_dl_dtype(dt), f32 = lj_test_dl_dtype(LJ_F32);
    lajit_tensor_arg tensors[7];
    size_t nt = 0;
    tensors[nt++] = (lajit_tensor_arg){"q", lj_gpu_tensor(&tq, dq, 0, 4, shq, sq, ddt)};
    tensors[nt++] = (lajit_tensor_arg){"k", lj_gpu_tensor(&tk, dk, 0, 4, shq, sq, ddt)};
    tensors[nt++] = (lajit_tensor_arg){"v", lj_gpu_tensor(&tv, dv, 0, 4, shv, sv, ddt)};
    tensors[nt++] = (lajit_tensor_arg){"g", lj_gpu_tensor(&tg, dg, 0, 3, shg, sg, f32)};
    tensors[nt++] = (lajit_tensor_arg){"o", lj_gpu_tensor(&to, dout, 0, 4, shv, sv, ddt)};
    if (c.h0)
        tensors[nt++] = (lajit_tensor_arg){"h0", lj_gpu_tensor(&th0, dh0, 0, 4, shs, NULL, f32)};
    if (c.ht)
        tensors[nt++] = (lajit_tensor_arg){"ht", lj_gpu_tensor(&tht, dht, 0, 4, shs, NULL, f32)};
    const lajit_scalar_arg scalars[1] = {{"scale", sigma}};

    char path[4096];
    snprintf(path, sizeof path, "%s/examples/families", lj_test_source_dir());
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    ASSERT_OK(lajit_ctx_add_families(ctx, path));

    lajit_launch_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.family = "simple_gla_fwd";
    a.tensors = tensors;
    a.n_tensors = nt;
    a.scalars = scalars;
    a.n_scalars = 1;
    lajit_status st = LAJIT_OK;
    if (c.graph) {
        const lj_driver *drv = lj_gpu_driver();
        CUstream stream;
        CUgraph graph;
        CUgraphExec exec;
        ASSERT_EQ(drv->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
        a.stream = stream;
        ASSERT_OK(lajit_launch(ctx, &a)); /* builds the plan outside the capture */
        ASSERT_EQ(drv->cuStreamSynchronize(stream), CUDA_SUCCESS);
        lj_gpu_poison(dout, nv * lj_test_dtype_size(dt));
        lj_gpu_poison(dht, nst * 4);
        lj_gpu_sync(); /* the poison (legacy stream) lands before the replay */
        ASSERT_EQ(drv->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                  CUDA_SUCCESS);
        st = lajit_launch(ctx, &a);
        ASSERT_EQ(drv->cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
        ASSERT_OK(st);
        ASSERT_EQ(drv->cuGraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
        ASSERT_EQ(drv->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
        ASSERT_EQ(drv->cuStreamSynchronize(stream), CUDA_SUCCESS);
        drv->cuGraphExecDestroy(exec);
        drv->cuGraphDestroy(graph);
        drv->cuStreamDestroy(stream);
    } else {
        st = lajit_launch(ctx, &a);
        if (st != LAJIT_OK)
            lj_test_fail(__FILE__, __LINE__, "lajit_launch: %s: %s", lajit_status_string(st),
                         lajit_errmsg(ctx));
        lj_gpu_sync();
    }

    /* The reference, head by head, from the same rounded inputs. */
    double *rq = malloc((size_t)N * D * 8), *rk = malloc((size_t)N * D * 8);
    double *rv = malloc((size_t)N * E * 8), *rg = malloc((size_t)N * 8);
    double *rs0 = malloc((size_t)D * E * 8), *ro = malloc(nv * 8), *rsn = malloc(nst * 8);
    ASSERT_TRUE(rq && rk && rv && rg && rs0 && ro && rsn);
    for (size_t bh = 0; bh < heads; bh++) {
        for (size_t i = 0; i < (size_t)N * D; i++)
            rq[i] = q[bh * N * D + i], rk[i] = k[bh * N * D + i];
        for (size_t i = 0; i < (size_t)N * E; i++)
            rv[i] = v[bh * N * E + i];
        for (int t = 0; t < N; t++)
            rg[t] = g[bh * N + t];
        for (size_t i = 0; i < (size_t)D * E; i++)
            rs0[i] = h0[bh * D * E + i];
        gla_ref_forward(N, D, E, rq, rk, rv, rg, sigma, c.h0 ? rs0 : NULL, ro + bh * N * E,
                        rsn + bh * D * E);
    }

    /* The outputs, back in logical order. */
    float *mo = malloc(nv * 4), *mht = malloc(nst * 4);
    double *got_o = malloc(nv * 8), *got_ht = malloc(nst * 8);
    ASSERT_TRUE(mo && mht && got_o && got_ht);
    lj_gpu_download_as(mo, dout, nv, dt);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < N; t++)
                for (int e = 0; e < E; e++)
                    got_o[(((size_t)b * H + h) * N + t) * E + e] =
                        mo[b * sv[0] + h * sv[1] + t * sv[2] + e];
    double tol = case_tolerance(dt), rel_o = 0, rel_s = 0;
    case_check("o", got_o, ro, heads * N, (size_t)E, tol, &rel_o);
    if (c.ht) {
        lj_gpu_download(mht, dht, nst * 4);
        for (size_t i = 0; i < nst; i++)
            got_ht[i] = mht[i];
        case_check("ht", got_ht, rsn, heads * D, (size_t)E, tol, &rel_s);
    } else {
        /* Not asked for: the buffer keeps its poison. */
        lj_gpu_download(mht, dht, nst * 4);
        for (size_t i = 0; i < nst; i++)
            ASSERT_TRUE(isnan(mht[i]));
    }
    printf(
        "simple_gla_fwd %s B=%d H=%d N=%d D=%d E=%d%s%s%s gates [%g, 0]: rel L2 o %.3g ht %.3g\n",
        dt == LJ_BF16 ? "bf16" : "f16", B, H, N, D, E, c.h0 ? " h0" : "", c.ht ? " ht" : "",
        c.bnhd ? " bnhd" : "", c.gmin, rel_o, rel_s);

    lajit_ctx_destroy(ctx);
    lj_gpu_free(dq), lj_gpu_free(dk), lj_gpu_free(dv), lj_gpu_free(dg);
    lj_gpu_free(dh0), lj_gpu_free(dout), lj_gpu_free(dht);
    free(q), free(k), free(v), free(g), free(h0), free(gmem);
    free(rq), free(rk), free(rv), free(rg), free(rs0), free(ro), free(rsn);
    free(mo), free(mht), free(got_o), free(got_ht);
}

LJ_TEST(bf16_d128_n1000)
{
    run((gla_case){LJ_BF16, 2, 3, 1000, 128, 128, 0, 0, 0, -0.1f, 0, 1, 0});
}

LJ_TEST(f16_d128_n1000_states)
{
    run((gla_case){LJ_F16, 2, 3, 1000, 128, 128, 1, 1, 0, -0.1f, 0, 2, 0});
}

LJ_TEST(bf16_d64_e64_n1000_states_bnhd)
{
    run((gla_case){LJ_BF16, 2, 4, 1000, 64, 64, 1, 1, 1, -0.1f, 0, 3, 0});
}

LJ_TEST(f16_d64_e64_n65)
{
    run((gla_case){LJ_F16, 3, 2, 65, 64, 64, 0, 1, 0, -0.1f, 0, 4, 0});
}

LJ_TEST(f16_d128_e64_n1000_bnhd)
{
    run((gla_case){LJ_F16, 2, 3, 1000, 128, 64, 0, 0, 1, -0.1f, 0, 5, 0});
}

LJ_TEST(bf16_d128_e64_n1_h0_only)
{
    run((gla_case){LJ_BF16, 2, 3, 1, 128, 64, 1, 0, 0, -0.1f, 0.5f, 6, 0});
}

LJ_TEST(bf16_d128_n1000_strong_gates_states)
{
    run((gla_case){LJ_BF16, 1, 4, 1000, 128, 128, 1, 1, 0, -8.0f, 0, 7, 0});
}

LJ_TEST(f16_d128_e64_n1000_ht_only_bnhd)
{
    run((gla_case){LJ_F16, 2, 3, 1000, 128, 64, 0, 1, 1, -1.0f, 0, 8, 0});
}

/* A grid that fills the H200 (the default takes two warpgroups, the third stage and SPLIT_QK
 * here). */
LJ_TEST(bf16_d128_b4h32_n4096_bnhd)
{
    run((gla_case){LJ_BF16, 4, 32, 4096, 128, 128, 0, 0, 1, -0.1f, 0, 9, 0});
}

/* Shapes whose defaults (family.lua) take the other configurations: 32- and 64-column slices of
 * one warpgroup, and two stages without PREFETCH (many heads: a third stage would cost a CTA its
 * place on the SM). Checked with `lajit expand -p ...` when written. */
LJ_TEST(f16_d128_b4h8_n700_tv32)
{
    run((gla_case){LJ_F16, 4, 8, 700, 128, 128, 1, 1, 0, -0.5f, 0, 10, 0});
}

LJ_TEST(bf16_d128_b2h32_n1000_tv64_wgs1_bnhd)
{
    run((gla_case){LJ_BF16, 2, 32, 1000, 128, 128, 1, 1, 1, -0.1f, 0, 11, 0});
}

LJ_TEST(bf16_d64_b16h32_n200_two_stages_no_prefetch)
{
    run((gla_case){LJ_BF16, 16, 32, 200, 64, 64, 1, 1, 0, -0.1f, 0, 12, 0});
}

/* Long walks with the SM to itself take a deeper ring (family.lua): five chunks in flight at
 * D = E = 64, four at D = 128 with one warpgroup (the ring's slots reused mod 5 and 4 while the
 * helper's barriers alternate by parity), with a ragged last chunk. */
LJ_TEST(bf16_d64_b4h32_n4100_five_stages_states)
{
    run((gla_case){LJ_BF16, 4, 32, 4100, 64, 64, 1, 1, 0, -0.1f, 0, 31, 0});
}

LJ_TEST(f16_d128_b2h32_n4160_four_stages_strong_ht_bnhd)
{
    run((gla_case){LJ_F16, 2, 32, 4160, 128, 128, 0, 1, 1, -2.f, 0, 32, 0});
}

/* Defaults with SPLIT_QK (two warpgroups, each computing half of Q Kᵀ and its gate mask, P
 * shared through shared memory): with PREFETCH (two P tiles, P written after the chunk's gate
 * scan) at D = E = 128, with states, and in f16 with FLA's strided layout and strong gates; and
 * without PREFETCH (an extra barrier before P V) at D = E = 256, where the third stage does not
 * fit. Checked with `lajit expand -p ...` when written (TILE_V 64 / 64 / 32, WGS 2, SPLIT_QK 1,
 * PREFETCH 1 / 1 / 0). */
LJ_TEST(bf16_d128_b4h32_n1000_split_qk_states)
{
    run((gla_case){LJ_BF16, 4, 32, 1000, 128, 128, 1, 1, 0, -0.1f, 0, 14, 0});
}

LJ_TEST(f16_d128_b4h32_n1000_split_qk_ht_bnhd)
{
    run((gla_case){LJ_F16, 4, 32, 1000, 128, 128, 0, 1, 1, -1.0f, 0, 15, 0});
}

LJ_TEST(bf16_d256_b4h32_n300_split_qk_no_prefetch_states)
{
    run((gla_case){LJ_BF16, 4, 32, 300, 256, 256, 1, 1, 0, -0.1f, 0, 16, 0});
}

/* lajit_launch captured in a CUDA graph (a cached plan: no allocation, no synchronisation). */
LJ_TEST(bf16_d128_e64_n1000_states_graph)
{
    run((gla_case){LJ_BF16, 2, 3, 1000, 128, 64, 1, 1, 1, -0.1f, 0, 13, 1});
}

/* Few heads, long sequences: the defaults cut each sequence into segments walked by their own
 * CTAs, chained through the family's workspace (fwd.cu's SPLIT). SPLIT 16 with 1280-token
 * segments and a ragged last one (800 tokens) from h0 to ht; SPLIT 8 in f16 with FLA's strided
 * layout and strong gates (a segment's total gate underflows to 0), 16-column slices; SPLIT 8 at
 * D = E = 64 inside a CUDA graph; SPLIT 4 of a short sequence (320-token segments, the last of
 * 140) in 32-column slices. The defaults were read with `lajit compile simple_gla_fwd -p ...`
 * (the configuration each case runs) when written. */
LJ_TEST(bf16_d128_b1h4_n20000_split_states)
{
    run((gla_case){LJ_BF16, 1, 4, 20000, 128, 128, 1, 1, 0, -0.05f, 0, 17, 0});
}

LJ_TEST(f16_d128_e64_b2h2_n9000_split_strong_ht_bnhd)
{
    run((gla_case){LJ_F16, 2, 2, 9000, 128, 64, 0, 1, 1, -8.0f, 0, 18, 0});
}

LJ_TEST(bf16_d64_b1h2_n5000_split_states_graph)
{
    run((gla_case){LJ_BF16, 1, 2, 5000, 64, 64, 1, 1, 0, -0.02f, 0, 19, 1});
}

LJ_TEST(bf16_d128_b2h4_n1100_short_segments_states)
{
    run((gla_case){LJ_BF16, 2, 4, 1100, 128, 128, 1, 1, 0, -0.1f, 0, 20, 0});
}

/* The split's local states at D = 192 and 256 (three and four m64 blocks of the state in each
 * thread's 16-byte pieces): SPLIT 16 in 64-column slices, and SPLIT 8 in 32-column slices of an
 * f16 E = 256. */
LJ_TEST(bf16_d192_b1h4_n6000_split_states)
{
    run((gla_case){LJ_BF16, 1, 4, 6000, 192, 192, 1, 1, 0, -0.05f, 0, 21, 0});
}

LJ_TEST(f16_d256_b1h2_n8000_split_states)
{
    run((gla_case){LJ_F16, 1, 2, 8000, 256, 256, 1, 1, 0, -0.05f, 0, 22, 0});
}
