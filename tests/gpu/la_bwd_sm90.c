/* la_bwd_sm90.c — the backward's scans on Hopper's wgmma (la_fwd_sm90's kernel walked forward for
 * dq and reversed with the gradient state for dv, dk and dS_0) against the float64 reference,
 * named explicitly: chunk boundaries (N = 1, 63, 65, 913), D and E from 64 to 256 with D != E
 * (dq and dk swap them), f16 and bf16, decay and none, S_0, dS_N and dS_0, VK states, [B,N,H,D]
 * views, varlen with a pool and a -1 slot, the full-grid default (two warpgroups, SPLIT_QK), a
 * CUDA-graph capture, each case run twice for the same bits. The decay gradient computed in the
 * dq pass (la_fwd_sm90/fwd.cu's DS): the family named, so la_bwd's walk cannot stand in for it
 * (part 3 is not this family's); ds within DESIGN.md's normwise bound at N up to 32768 with s_h
 * 0, 0.01, 1 and 4, with S_0 and dS_N, in varlen with ragged lengths and a -1 slot, against a
 * float64 finite difference, and in a graph. The fused dv/dk pass (dkdv.cu: D = E = 64 or 128,
 * 16-bit, at least 128 sequences x heads; the b4h32 cases above take it too): N = 1, 65, 913,
 * 2048, decay and none and strong, S_0, dS_N and dS_0, VK, [B,N,H,D], varlen with empty and
 * ragged sequences and a -1 slot, a graph. Skipped on a GPU that is not sm_90a. */
#include <string.h>

#include "attn_cases.h"
#include "gpu.h"
#include "test.h"

#define F "la_bwd_sm90"

static void run(bwd_case c)
{
    lj_gpu_init();
    if (strcmp(lj_gpu_device()->info.arch, "sm_90a") != 0)
        lj_test_skip("la_bwd_sm90 needs an sm_90a GPU");
    run_bwd_case(&c);
}

/* family, dtype, B, H, N, D, E, decay, want_ds, initial, dsn, ds0, vk, bnhd, nseq, lens,
 * slot_minus_one, scale, finite_diff, seed */

LJ_TEST(n1_bf16_states)
{
    run((bwd_case){F, LJ_BF16, 2, 3, 1, 64, 64, 1, 0, 1, 1, 1, 0, 0, 0, {0}, 0, 0, 0, 61, 0});
}

LJ_TEST(n63_f16_nodecay)
{
    run((bwd_case){F, LJ_F16, 2, 4, 63, 128, 128, 0, 0, 0, 0, 0, 0, 0, 0, {0}, 0, 0, 0, 62, 0});
}

LJ_TEST(n65_f16_d64_e128_vk_states_scale)
{
    run((bwd_case){F, LJ_F16, 2, 3, 65, 64, 128, 1, 0, 1, 1, 1, 1, 0, 0, {0}, 0, 0.5f, 0, 63, 0});
}

LJ_TEST(n913_bf16_d192_e64_bnhd)
{
    run((bwd_case){F, LJ_BF16, 1, 2, 913, 192, 64, 1, 0, 0, 1, 1, 0, 1, 0, {0}, 0, 0, 0, 64, 0});
}

LJ_TEST(n913_f16_d256_e128_initial)
{
    run((bwd_case){F, LJ_F16, 1, 2, 913, 256, 128, 1, 0, 1, 0, 0, 0, 0, 0, {0}, 0, 0, 0, 65, 0});
}

LJ_TEST(n1024_bf16_d128_b4h32_full_grid)
{
    run((bwd_case){F, LJ_BF16, 4, 32, 1024, 128, 128, 1, 0, 0, 1, 0, 0, 0, 0, {0}, 0, 0, 0, 66, 0});
}

LJ_TEST(varlen_pool_with_minus_one)
{
    run((bwd_case){F, LJ_BF16, 0, 4,  0, 128, 64, 1, 0, 1, 1, 1, 0, 0, 6, {1, 0, 63, 65, 130, 700},
                   1, 0,       0, 67, 0});
}

LJ_TEST(graph_capture_with_states)
{
    run((bwd_case){F, LJ_BF16, 2, 4, 777, 128, 128, 1, 0,  1,         1,
                   1, 0,       0, 0, {0}, 0,   0,   0, 68, .graph = 1});
}

/* dv and dk in one pass (la_bwd_sm90/dkdv.cu): B·H >= 128, D = E = 64 or 128. */

LJ_TEST(fused_n1_bf16_d128_states)
{
    run((bwd_case){F, LJ_BF16, 4, 32, 1, 128, 128, 1, 0, 1, 1, 1, 0, 0, 0, {0}, 0, 0, 0, 90, 0});
}

LJ_TEST(fused_n65_f16_d64_vk_states_scale)
{
    run((bwd_case){F, LJ_F16, 2, 64, 65, 64, 64, 1, 0, 1, 1, 1, 1, 0, 0, {0}, 0, 0.5f, 0, 91, 0});
}

LJ_TEST(fused_n913_bf16_d128_bnhd_nodecay)
{
    run((bwd_case){F, LJ_BF16, 1, 128, 913, 128, 128, 0, 0, 0, 1, 1, 0, 1, 0, {0}, 0, 0, 0, 92, 0});
}

LJ_TEST(fused_n2048_f16_d64_strong_decay_ds)
{
    run((bwd_case){F, LJ_F16, 1, 128, 2048, 64, 64, 2, 1, 1, 1, 1, 0, 0, 0, {0}, 0, 0, 0, 93, 0});
}

LJ_TEST(fused_varlen_pool_with_minus_one)
{
    run((bwd_case){F, LJ_BF16, 0, 32, 0, 128, 128, 1, 0, 1, 1, 1, 0, 0, 6, {1, 0, 63, 65, 130, 700},
                   1, 0,       0, 94, 0});
}

LJ_TEST(fused_graph_capture_with_states)
{
    run((bwd_case){F, LJ_BF16, 4, 32, 777, 128, 128, 1, 0,  1,         1,
                   1, 0,       0, 0,  {0}, 0,   0,   0, 95, .graph = 1});
}

/* ds in the dq pass. */

LJ_TEST(ds_n65_bf16_d64_finite_difference)
{
    run((bwd_case){F, LJ_BF16, 2, 2, 65, 64, 64, 1, 1, 1, 1, 1, 0, 0, 0, {0}, 0, 0, 1, 70, 0});
}

LJ_TEST(ds_n1_f16_states)
{
    run((bwd_case){F, LJ_F16, 2, 3, 1, 64, 128, 1, 1, 1, 1, 1, 0, 0, 0, {0}, 0, 0, 0, 71, 0});
}

LJ_TEST(ds_n4096_bf16_d128_b2h8_states)
{
    run((bwd_case){F, LJ_BF16, 2, 8, 4096, 128, 128, 1, 1, 1, 1, 0, 0, 0, 0, {0}, 0, 0, 0, 72, 0});
}

LJ_TEST(ds_n32768_bf16_d128_strong_decay)
{
    run((bwd_case){F, LJ_BF16, 1, 4, 32768, 128, 128, 2, 1, 1, 1, 0, 0, 0, 0, {0}, 0, 0, 0, 73, 0});
}

LJ_TEST(ds_n8192_f16_d64_e192_vk_bnhd_strong_decay)
{
    run((bwd_case){F, LJ_F16, 1, 4, 8192, 64, 192, 2, 1, 0, 1, 1, 1, 1, 0, {0}, 0, 0.5f, 0, 74, 0});
}

LJ_TEST(ds_n913_bf16_d256_e64)
{
    run((bwd_case){F, LJ_BF16, 1, 3, 913, 256, 64, 1, 1, 1, 1, 0, 0, 0, 0, {0}, 0, 0, 0, 75, 0});
}

LJ_TEST(ds_n1024_bf16_d128_b4h32_full_grid)
{
    run((bwd_case){F, LJ_BF16, 4, 32, 1024, 128, 128, 1, 1, 0, 0, 0, 0, 0, 0, {0}, 0, 0, 0, 76, 0});
}

LJ_TEST(ds_varlen_ragged_pool_with_minus_one)
{
    run((bwd_case){F, LJ_BF16, 0, 4,  0, 128, 64, 2,
                   1, 1,       1, 1,  0, 0,   7,  {1, 0, 63, 65, 130, 700, 5000},
                   1, 0,       0, 77, 0});
}

LJ_TEST(ds_graph_capture_with_states)
{
    run((bwd_case){F, LJ_BF16, 2, 4, 777, 128, 128, 1, 1,  1,         1,
                   1, 0,       0, 0, {0}, 0,   0,   0, 78, .graph = 1});
}

/* Few heads and long sequences: the family's own choice splits every scan (common/split.cuh),
 * dq forward and dv, dk reversed with the gradient state; s_h 0, 0.01, 1 and 4; S_0, dS_N and
 * dS_0; varlen with long and short sequences and a -1 slot; with ds the dq pass walks whole
 * sequences (DS) while dv and dk split. */
LJ_TEST(split_b1_h4_n40000_bf16_d128_states)
{
    run((bwd_case){F, LJ_BF16, 1, 4, 40000, 128, 128, 2, 0, 1, 1, 1, 0, 0, 0, {0}, 0, 0, 0, 81, 0});
}

LJ_TEST(split_varlen_f16_d64_e128_vk_ragged)
{
    run((bwd_case){F, LJ_F16, 0, 4,  0, 64, 128, 2, 0, 1, 1, 1, 1, 0, 4, {20000, 77, 9000, 4500},
                   1, 0,      0, 82, 0});
}

LJ_TEST(split_b1_h4_n131072_bf16_d64_ds)
{
    run((bwd_case){F, LJ_BF16, 1, 4, 131072, 64, 64, 2, 1, 0, 1, 0, 0, 0, 0, {0}, 0, 0, 0, 83, 0});
}

LJ_TEST(split_b1_h2_n65536_bf16_d128_graph)
{
    run((bwd_case){F, LJ_BF16, 1, 2, 65536, 128, 128, 1, 0, 0, 1, 1, 0, 1, 0, {0}, 0, 0, 0, 84, 1});
}
