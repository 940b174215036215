/* la_fwd_sm90.c — the Hopper (wgmma) forward on the GPU against the float64 reference, named
 * explicitly so the cases run this family and not the fallback: chunk boundaries (N = 1, 63, 64,
 * 65, 913, 4096), D = 64 … 256 with D != E and E down to 16 (all three swizzle widths of the
 * value tiles), f16 and bf16, decay and none, states in and out (in place, VK), [B,N,H,D] views
 * and varlen with a pool and a -1 slot; then configurations the defaults do not reach, pinned.
 * Skipped on a GPU that is not sm_90a. */
#include <string.h>

#include "attn_cases.h"
#include "gpu.h"
#include "test.h"

#define F "la_fwd_sm90"

static void run(fwd_case c)
{
    lj_gpu_init();
    if (strcmp(lj_gpu_device()->info.arch, "sm_90a") != 0)
        lj_test_skip("la_fwd_sm90 needs an sm_90a GPU");
    run_fwd_case(&c);
}

LJ_TEST(n1_bf16_decay_states)
{
    run((fwd_case){F, LJ_BF16, 2, 3, 1, 64, 64, 1, 1, 1, 0, 0, 0, 0, {0}, 0, 0, 31, NULL});
}

LJ_TEST(n63_f16_nodecay)
{
    run((fwd_case){F, LJ_F16, 2, 4, 63, 128, 128, 0, 0, 0, 0, 0, 0, 0, {0}, 0, 0, 32, NULL});
}

LJ_TEST(n64_bf16_d64_e16)
{
    run((fwd_case){F, LJ_BF16, 3, 2, 64, 64, 16, 1, 0, 1, 0, 0, 0, 0, {0}, 0, 0, 33, NULL});
}

LJ_TEST(n65_f16_d128_e96_vk_in_place)
{
    run((fwd_case){F, LJ_F16, 2, 3, 65, 128, 96, 1, 1, 1, 1, 1, 0, 0, {0}, 0, 0.5f, 34, NULL});
}

LJ_TEST(n913_bf16_d192_e256_bnhd)
{
    run((fwd_case){F, LJ_BF16, 1, 2, 913, 192, 256, 1, 1, 1, 0, 0, 1, 0, {0}, 0, 0, 35, NULL});
}

LJ_TEST(n913_f16_d192_e32)
{
    run((fwd_case){F, LJ_F16, 1, 4, 913, 192, 32, 1, 0, 1, 0, 0, 0, 0, {0}, 0, 0, 36, NULL});
}

LJ_TEST(n4096_bf16_d128_states)
{
    run((fwd_case){F, LJ_BF16, 1, 4, 4096, 128, 128, 1, 1, 1, 0, 0, 0, 0, {0}, 0, 0, 37, NULL});
}

LJ_TEST(n4096_f16_d64_nodecay_bnhd)
{
    run((fwd_case){F, LJ_F16, 2, 2, 4096, 64, 64, 0, 0, 1, 0, 0, 1, 0, {0}, 0, 0, 38, NULL});
}

LJ_TEST(n4096_bf16_d128_b4h32_full_grid)
{
    run((fwd_case){F, LJ_BF16, 4, 32, 4096, 128, 128, 1, 0, 1, 0, 0, 0, 0, {0}, 0, 0, 39, NULL});
}

LJ_TEST(n65_bf16_d256_states)
{
    run((fwd_case){F, LJ_BF16, 2, 3, 65, 256, 256, 1, 1, 1, 0, 0, 0, 0, {0}, 0, 0, 47, NULL});
}

LJ_TEST(n913_f16_d256_e64_bnhd)
{
    run((fwd_case){F, LJ_F16, 1, 4, 913, 256, 64, 1, 0, 1, 0, 0, 1, 0, {0}, 0, 0, 48, NULL});
}

LJ_TEST(n4096_bf16_d256_b2h8_nodecay)
{
    run((fwd_case){F, LJ_BF16, 2, 8, 4096, 256, 256, 0, 0, 1, 0, 0, 0, 0, {0}, 0, 0, 49, NULL});
}

LJ_TEST(varlen_d256_e128_vk)
{
    run((fwd_case){
        F, LJ_BF16, 0, 2, 0, 256, 128, 1, 1, 1, 0, 1, 0, 4, {1, 64, 333, 129}, 1, 0, 50, NULL});
}

LJ_TEST(varlen_pool_with_minus_one)
{
    run((fwd_case){F,
                   LJ_BF16,
                   0,
                   4,
                   0,
                   128,
                   64,
                   1,
                   1,
                   1,
                   1,
                   0,
                   0,
                   6,
                   {1, 0, 63, 65, 130, 700},
                   1,
                   0,
                   40,
                   NULL});
}

LJ_TEST(varlen_f16_vk)
{
    run((fwd_case){F, LJ_F16, 0, 2, 0, 64, 96, 1, 1, 1, 0, 1, 0, 3, {17, 1, 200}, 0, 0, 41, NULL});
}

/* Configurations the defaults of the cases above do not reach, pinned (attn_cases.h): two
 * warpgroups sharing the Q/K tiles, with and without the third stage and PREFETCH, every value
 * tile width, ragged chunks, states and varlen. */
LJ_TEST(pinned_wgs2_prefetch_bf16_d128_states)
{
    run((fwd_case){F,
                   LJ_BF16,
                   2,
                   3,
                   913,
                   128,
                   128,
                   1,
                   1,
                   1,
                   0,
                   0,
                   0,
                   0,
                   {0},
                   0,
                   0,
                   42,
                   "BLOCK=64 WGS=2 TILE_V=64 STAGES=3 PREFETCH=1 SPLIT_QK=0 SPLIT=1"});
}

LJ_TEST(pinned_wgs2_two_stages_f16_d64_nodecay_bnhd)
{
    run((fwd_case){F,
                   LJ_F16,
                   2,
                   2,
                   65,
                   64,
                   64,
                   0,
                   0,
                   0,
                   0,
                   0,
                   1,
                   0,
                   {0},
                   0,
                   0,
                   43,
                   "BLOCK=64 WGS=2 TILE_V=32 STAGES=2 PREFETCH=0 SPLIT_QK=0 SPLIT=1"});
}

LJ_TEST(pinned_wgs2_tv16_varlen_d192_e96)
{
    run((fwd_case){F,
                   LJ_BF16,
                   0,
                   2,
                   0,
                   192,
                   96,
                   1,
                   1,
                   1,
                   1,
                   0,
                   0,
                   5,
                   {1, 64, 129, 300, 7},
                   1,
                   0,
                   44,
                   "BLOCK=64 WGS=2 TILE_V=16 STAGES=3 PREFETCH=1 SPLIT_QK=0 SPLIT=1"});
}

LJ_TEST(pinned_wgs2_vk_in_place_f16_d128_e256)
{
    run((fwd_case){F,
                   LJ_F16,
                   1,
                   2,
                   700,
                   128,
                   256,
                   1,
                   1,
                   1,
                   1,
                   1,
                   0,
                   0,
                   {0},
                   0,
                   0.25f,
                   45,
                   "BLOCK=64 WGS=2 TILE_V=64 STAGES=2 PREFETCH=0 SPLIT_QK=0 SPLIT=1"});
}

LJ_TEST(pinned_wgs1_prefetch_d64_e128)
{
    run((fwd_case){F,
                   LJ_BF16,
                   1,
                   2,
                   1000,
                   64,
                   128,
                   1,
                   0,
                   1,
                   0,
                   0,
                   0,
                   0,
                   {0},
                   0,
                   0,
                   46,
                   "BLOCK=64 WGS=1 TILE_V=64 STAGES=3 PREFETCH=1 SPLIT_QK=0 SPLIT=1"});
}

/* A CTA of one warpgroup loads a row of Q or K in several 16-byte pieces per thread: two at
 * D = 256, three at D = 192 (load_tile's PPT). */
LJ_TEST(pinned_wgs1_tv32_prefetch_d256)
{
    run((fwd_case){F,
                   LJ_BF16,
                   1,
                   2,
                   913,
                   256,
                   256,
                   1,
                   1,
                   1,
                   0,
                   0,
                   0,
                   0,
                   {0},
                   0,
                   0,
                   51,
                   "BLOCK=64 WGS=1 TILE_V=32 STAGES=3 PREFETCH=1 SPLIT_QK=0 SPLIT=1"});
}

/* Without states: with S_0/S_N this configuration spills (220 bytes by ptxas) and the register
 * model in family.lua rejects it; the three-piece row loads at D = 192 are what it pins. */
LJ_TEST(pinned_wgs1_tv64_d192_f16_bnhd)
{
    run((fwd_case){F,
                   LJ_F16,
                   2,
                   2,
                   700,
                   192,
                   192,
                   1,
                   0,
                   0,
                   0,
                   0,
                   1,
                   0,
                   {0},
                   0,
                   0,
                   52,
                   "BLOCK=64 WGS=1 TILE_V=64 STAGES=2 PREFETCH=0 SPLIT_QK=0 SPLIT=1"});
}

LJ_TEST(pinned_wgs2_tv16_d256_e64_ragged)
{
    run((fwd_case){F,
                   LJ_F16,
                   1,
                   3,
                   129,
                   256,
                   64,
                   1,
                   1,
                   1,
                   0,
                   0,
                   0,
                   0,
                   {0},
                   0,
                   0,
                   53,
                   "BLOCK=64 WGS=2 TILE_V=16 STAGES=3 PREFETCH=1 SPLIT_QK=0 SPLIT=1"});
}

/* SPLIT_QK: each warpgroup computes half of Q Kᵀ and the masked scores P meet in shared memory
 * (with PREFETCH in two tiles, written a chunk ahead). */
LJ_TEST(pinned_split_prefetch_bf16_d128_states)
{
    run((fwd_case){F,
                   LJ_BF16,
                   2,
                   3,
                   913,
                   128,
                   128,
                   1,
                   1,
                   1,
                   0,
                   0,
                   0,
                   0,
                   {0},
                   0,
                   0,
                   54,
                   "BLOCK=64 WGS=2 TILE_V=64 STAGES=3 PREFETCH=1 SPLIT_QK=1 SPLIT=1"});
}

LJ_TEST(pinned_split_two_stages_f16_d256_nodecay_bnhd)
{
    run((fwd_case){F,
                   LJ_F16,
                   1,
                   3,
                   700,
                   256,
                   256,
                   0,
                   1,
                   1,
                   0,
                   0,
                   1,
                   0,
                   {0},
                   0,
                   0.5f,
                   55,
                   "BLOCK=64 WGS=2 TILE_V=32 STAGES=2 PREFETCH=0 SPLIT_QK=1 SPLIT=1"});
}

LJ_TEST(pinned_split_two_stages_bf16_d256_decay)
{
    run((fwd_case){F,
                   LJ_BF16,
                   2,
                   2,
                   1000,
                   256,
                   256,
                   1,
                   0,
                   1,
                   0,
                   0,
                   0,
                   0,
                   {0},
                   0,
                   0,
                   56,
                   "BLOCK=64 WGS=2 TILE_V=32 STAGES=2 PREFETCH=0 SPLIT_QK=1 SPLIT=1"});
}

LJ_TEST(pinned_split_prefetch_varlen_d64_vk)
{
    run((fwd_case){F,
                   LJ_BF16,
                   0,
                   2,
                   0,
                   64,
                   64,
                   1,
                   1,
                   1,
                   0,
                   1,
                   0,
                   5,
                   {1, 64, 65, 300, 2},
                   1,
                   0,
                   57,
                   "BLOCK=64 WGS=2 TILE_V=32 STAGES=3 PREFETCH=1 SPLIT_QK=1 SPLIT=1"});
}

LJ_TEST(pinned_split_tv16_f16_d192_e64)
{
    run((fwd_case){F,
                   LJ_F16,
                   1,
                   4,
                   129,
                   192,
                   64,
                   1,
                   1,
                   1,
                   1,
                   0,
                   0,
                   0,
                   {0},
                   0,
                   0,
                   58,
                   "BLOCK=64 WGS=2 TILE_V=16 STAGES=2 PREFETCH=0 SPLIT_QK=1 SPLIT=1"});
}

/* SPLIT (common/split.cuh): each sequence cut into segments walked by their own CTAs, the
 * incoming states chained through the workspace. Ragged last segments, S_0 and S_N (in place),
 * decay 0 and strong (head 1: s = 2^-4, λ^2048 underflows), no decay, [B,N,H,D] views, VK, and
 * varlen mixing long sequences with short ones that stay whole and a -1 slot. */
LJ_TEST(split8_bf16_d128_states)
{
    run((fwd_case){F,
                   LJ_BF16,
                   1,
                   2,
                   16421,
                   128,
                   128,
                   1,
                   1,
                   1,
                   0,
                   0,
                   0,
                   0,
                   {0},
                   0,
                   0,
                   71,
                   "BLOCK=64 WGS=2 TILE_V=64 STAGES=3 PREFETCH=1 SPLIT_QK=1 SPLIT=8"});
}

LJ_TEST(split4_f16_d64_nodecay_bnhd_in_place)
{
    run((fwd_case){F,
                   LJ_F16,
                   2,
                   1,
                   5000,
                   64,
                   64,
                   0,
                   1,
                   1,
                   1,
                   0,
                   1,
                   0,
                   {0},
                   0,
                   0,
                   72,
                   "BLOCK=64 WGS=1 TILE_V=64 STAGES=2 PREFETCH=0 SPLIT_QK=0 SPLIT=4"});
}

LJ_TEST(split4_varlen_f16_d256_e64_vk_pool_with_minus_one)
{
    run((fwd_case){F,
                   LJ_F16,
                   0,
                   2,
                   0,
                   256,
                   64,
                   1,
                   1,
                   1,
                   0,
                   1,
                   0,
                   5,
                   {1, 9000, 300, 4097, 2048},
                   1,
                   0,
                   73,
                   "BLOCK=64 WGS=2 TILE_V=16 STAGES=2 PREFETCH=0 SPLIT_QK=1 SPLIT=4"});
}

LJ_TEST(split32_bf16_d128_wide_slice_scale)
{
    run((fwd_case){F,
                   LJ_BF16,
                   1,
                   2,
                   65536,
                   128,
                   128,
                   1,
                   0,
                   1,
                   0,
                   0,
                   0,
                   0,
                   {0},
                   0,
                   0.088f,
                   74,
                   "BLOCK=64 WGS=2 TILE_V=32 STAGES=2 PREFETCH=0 SPLIT_QK=1 SPLIT=32"});
}

/* The family's own choice at few heads (it splits) up to N = 1M. */
LJ_TEST(default_b1_h2_n1m_bf16_d64_e16)
{
    run((fwd_case){F, LJ_BF16, 1, 2, 1048576, 64, 16, 1, 1, 1, 0, 0, 0, 0, {0}, 0, 0, 75, NULL});
}

LJ_TEST(default_b1_h8_n65536_bf16_d128)
{
    run((fwd_case){F, LJ_BF16, 1, 8, 65536, 128, 128, 1, 0, 0, 0, 0, 0, 0, {0}, 0, 0, 76, NULL});
}
