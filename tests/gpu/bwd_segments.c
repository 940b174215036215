/* bwd_segments.c — lajit_attn_bwd's decay gradient by segments of one long sequence
 * (runtime/bwd_segments.c) against the float64 reference: every gradient (dq, dk, dv, dS_0) and
 * ds within DESIGN.md's bound, each case run twice for the same bits (tests/support/bwd_case.c).
 * The automatic rule at few heads and long N (B = 1, H = 4: eight segments on an H200), and
 * LAJIT_DS_SEGMENTS forcing 3 and 5 segments on short sequences: ragged last segments and empty
 * ones (N = 100 in five 64-token segments), s_h 0, 0.01, 1 and 4, S_0, dS_N, dS_0, VK states,
 * [B,N,H,D] views, f16 and bf16, a float64 finite difference of ds, a CUDA-graph capture. One
 * direct call checks that the segments were really taken (the context's buffer and count).
 * Several batch rows (B = 2, 3: each row by segments, ds summed over the rows) likewise. */
#include <stdlib.h>
#include <string.h>

#include "attn_cases.h"
#include "context.h"
#include "gpu.h"
#include "test.h"

static void run(bwd_case c, const char *segments)
{
    lj_gpu_init();
    if (segments)
        setenv("LAJIT_DS_SEGMENTS", segments, 1);
    else
        unsetenv("LAJIT_DS_SEGMENTS");
    run_bwd_case(&c);
}

LJ_TEST(auto_b1_h4_n40000_bf16_d128_states)
{
    run((bwd_case){.dtype = LJ_BF16,
                   .B = 1,
                   .H = 4,
                   .N = 40000,
                   .D = 128,
                   .E = 128,
                   .decay = 2,
                   .want_ds = 1,
                   .initial = 1,
                   .dsn = 1,
                   .ds0 = 1,
                   .seed = 901},
        NULL);
}

LJ_TEST(forced3_n913_bf16_d64_states)
{
    run((bwd_case){.dtype = LJ_BF16,
                   .B = 1,
                   .H = 4,
                   .N = 913,
                   .D = 64,
                   .E = 64,
                   .decay = 2,
                   .want_ds = 1,
                   .initial = 1,
                   .dsn = 1,
                   .ds0 = 1,
                   .seed = 902},
        "3");
}

LJ_TEST(forced5_n100_empty_segments_f16_vk_bnhd)
{
    run((bwd_case){.dtype = LJ_F16,
                   .B = 1,
                   .H = 3,
                   .N = 100,
                   .D = 64,
                   .E = 128,
                   .decay = 2,
                   .want_ds = 1,
                   .initial = 1,
                   .dsn = 1,
                   .ds0 = 1,
                   .vk = 1,
                   .bnhd = 1,
                   .seed = 903},
        "5");
}

LJ_TEST(forced3_n65_finite_difference_no_states)
{
    run((bwd_case){.dtype = LJ_BF16,
                   .B = 1,
                   .H = 2,
                   .N = 65,
                   .D = 64,
                   .E = 64,
                   .decay = 1,
                   .want_ds = 1,
                   .finite_diff = 1,
                   .seed = 904},
        "3");
}

LJ_TEST(forced3_n3000_graph)
{
    run((bwd_case){.dtype = LJ_BF16,
                   .B = 1,
                   .H = 2,
                   .N = 3000,
                   .D = 128,
                   .E = 128,
                   .decay = 1,
                   .want_ds = 1,
                   .initial = 1,
                   .dsn = 1,
                   .ds0 = 1,
                   .seed = 905,
                   .graph = 1},
        "3");
}

/* The path is taken: the context's segment buffer is allocated and holds P = 3 boundaries for
 * the call's N, and a second shape rewrites them; LAJIT_DS_SEGMENTS=off leaves it unused. */
LJ_TEST(segments_are_taken)
{
    lj_gpu_init();
    enum { H = 2, D = 64, E = 64 };
    const lj_dtype dt = LJ_BF16;
    for (int pass = 0; pass < 2; pass++) {
        setenv("LAJIT_DS_SEGMENTS", pass == 0 ? "3" : "off", 1);
        lajit_ctx *ctx = case_open_ctx();
        for (int N = 500; N <= 700; N += 200) {
            CUdeviceptr q = lj_gpu_alloc((size_t)H * N * D * 2),
                        g = lj_gpu_alloc((size_t)H * N * D * 2);
            CUdeviceptr s = lj_gpu_alloc(H * 4), ds = lj_gpu_alloc(H * 4);
            const float rate[H] = {0.1f, 1.0f};
            float *x = malloc((size_t)H * N * D * 4);
            case_seed(7u + (unsigned)N);
            case_random_fill(x, (size_t)H * N * D, 1.0f, dt);
            lj_gpu_upload_as(q, x, (size_t)H * N * D, dt);
            lj_gpu_upload(s, rate, H * 4);
            lj_gpu_memset(g, 0, (size_t)H * N * D * 2);
            const int64_t sh[4] = {1, H, N, D}, hs[1] = {H};
            const DLDataType b16 = lj_test_dl_dtype(dt), f32 = lj_test_dl_dtype(LJ_F32);
            lj_test_tensor tq, tg, tdq, tdk, tdv, ts, tds;
            CUdeviceptr dq = lj_gpu_alloc((size_t)H * N * D * 2),
                        dk = lj_gpu_alloc((size_t)H * N * D * 2),
                        dv = lj_gpu_alloc((size_t)H * N * D * 2);
            lajit_attn_bwd_args a;
            memset(&a, 0, sizeof a);
            a.struct_size = sizeof a;
            a.q = a.k = lj_gpu_tensor(&tq, q, 0, 4, sh, NULL, b16);
            a.v = a.dout = lj_gpu_tensor(&tg, g, 0, 4, sh, NULL, b16);
            a.dq = lj_gpu_tensor(&tdq, dq, 0, 4, sh, NULL, b16);
            a.dk = lj_gpu_tensor(&tdk, dk, 0, 4, sh, NULL, b16);
            a.dv = lj_gpu_tensor(&tdv, dv, 0, 4, sh, NULL, b16);
            a.s = lj_gpu_tensor(&ts, s, 0, 1, hs, NULL, f32);
            a.ds = lj_gpu_tensor(&tds, ds, 0, 1, hs, NULL, f32);
            a.scale = 1.0f;
            lajit_status st = lajit_attn_bwd(ctx, &a);
            if (st != LAJIT_OK)
                lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(st),
                             lajit_errmsg(ctx));
            lj_gpu_sync();
            if (pass == 0) {
                ASSERT_TRUE(ctx->seg_ws.bytes > 0);
                ASSERT_EQ(ctx->seg_P, 3);
                ASSERT_EQ(ctx->seg_N, N);
                int32_t cu[4];
                lj_gpu_download(cu, ctx->seg_ws.ptr, sizeof cu);
                ASSERT_EQ(cu[0], 0);
                ASSERT_EQ(cu[3], N);
                ASSERT_TRUE(cu[1] % 64 == 0 && cu[1] < cu[2] && cu[2] <= N);
            } else {
                ASSERT_EQ(ctx->seg_ws.bytes, 0);
            }
            CUdeviceptr all[7] = {q, g, s, ds, dq, dk, dv};
            for (int i = 0; i < 7; i++)
                lj_gpu_free(all[i]);
            free(x);
        }
        lajit_ctx_destroy(ctx);
    }
    unsetenv("LAJIT_DS_SEGMENTS");
}

/* Several batch rows, each by segments in turn and ds summed over the rows in row order (taken
 * only when forced for now): 4 segments at B = 2, H = 4, N = 20000, 3 at B = 3 with S_0, dS_N,
 * dS_0, VK states and [B,N,H,D] views; f16 at B = 2 with a graph. */
LJ_TEST(forced4_b2_h4_n20000_bf16_d128_states)
{
    run((bwd_case){.dtype = LJ_BF16,
                   .B = 2,
                   .H = 4,
                   .N = 20000,
                   .D = 128,
                   .E = 128,
                   .decay = 2,
                   .want_ds = 1,
                   .initial = 1,
                   .dsn = 1,
                   .ds0 = 1,
                   .seed = 911},
        "4");
}

LJ_TEST(forced3_b3_n913_vk_bnhd_states)
{
    run((bwd_case){.dtype = LJ_BF16,
                   .B = 3,
                   .H = 2,
                   .N = 913,
                   .D = 64,
                   .E = 128,
                   .decay = 2,
                   .want_ds = 1,
                   .initial = 1,
                   .dsn = 1,
                   .ds0 = 1,
                   .vk = 1,
                   .bnhd = 1,
                   .seed = 912},
        "3");
}

LJ_TEST(forced4_b2_n3000_f16_graph)
{
    run((bwd_case){.dtype = LJ_F16,
                   .B = 2,
                   .H = 2,
                   .N = 3000,
                   .D = 64,
                   .E = 64,
                   .decay = 1,
                   .want_ds = 1,
                   .initial = 1,
                   .dsn = 1,
                   .seed = 913,
                   .graph = 1},
        "4");
}
