/* la_bwd.c — the chunked backward on the GPU against the float64 reference: every gradient (dq,
 * dk, dv, dS_0, ds) with and without decay and states, chunk boundaries (N = 1, 63, 65, 913,
 * 4096), head dims 16 to 256 with D != E, every dtype, both state layouts, [B,N,H,D] views,
 * varlen with a pool and a −1 slot, ds against a finite difference, a CUDA-graph capture whose
 * replays give the bits of a direct call, and each case run twice for the same bits. */
#include "attn_cases.h"
#include "test.h"

/* family, dtype, B, H, N, D, E, decay, want_ds, initial, dsn, ds0, vk, bnhd, nseq, lens,
 * slot_minus_one, scale, finite_diff, seed. F names la_bwd, so that its scans run on an sm_90a
 * GPU too; the two cases with NULL take the op's defaults (there: la_bwd_sm90's scans and
 * la_bwd's decay gradient in one call). */
#define F "la_bwd"

LJ_TEST(n1_bf16_everything)
{
    bwd_case c = {F, LJ_BF16, 2, 3, 1, 64, 64, 1, 1, 1, 1, 1, 0, 0, 0, {0}, 0, 0, 1, 31, 0};
    run_bwd_case(&c);
}

LJ_TEST(n63_f16_nodecay)
{
    bwd_case c = {F, LJ_F16, 2, 4, 63, 128, 128, 0, 0, 0, 0, 0, 0, 0, 0, {0}, 0, 0, 0, 32, 0};
    run_bwd_case(&c);
}

LJ_TEST(n65_f16_d96_e64_vk_states_scale)
{
    bwd_case c = {F, LJ_F16, 2, 3, 65, 96, 64, 1, 1, 1, 1, 1, 1, 0, 0, {0}, 0, 0.5f, 0, 33, 0};
    run_bwd_case(&c);
}

LJ_TEST(n913_bf16_d192_e256_bnhd)
{
    bwd_case c = {F, LJ_BF16, 1, 2, 913, 192, 256, 1, 1, 0, 1, 1, 0, 1, 0, {0}, 0, 0, 0, 34, 0};
    run_bwd_case(&c);
}

LJ_TEST(n913_f16_d256_e32)
{
    bwd_case c = {F, LJ_F16, 1, 2, 913, 256, 32, 1, 0, 1, 0, 1, 0, 0, 0, {0}, 0, 0, 0, 35, 0};
    run_bwd_case(&c);
}

LJ_TEST(n64_bf16_d16_e16_ds_finite_difference)
{
    bwd_case c = {F, LJ_BF16, 3, 2, 64, 16, 16, 1, 1, 1, 1, 0, 0, 0, 0, {0}, 0, 0, 1, 36, 0};
    run_bwd_case(&c);
}

LJ_TEST(n4096_bf16_d128_ds)
{
    bwd_case c = {NULL, LJ_BF16, 1, 4, 4096, 128, 128, 1, 1, 0, 0, 0, 0, 0, 0, {0}, 0, 0, 0, 37, 0};
    run_bwd_case(&c);
}

LJ_TEST(n4096_f16_d64_nodecay_bnhd)
{
    bwd_case c = {F, LJ_F16, 2, 2, 4096, 64, 64, 0, 0, 1, 1, 1, 0, 1, 0, {0}, 0, 0, 0, 38, 0};
    run_bwd_case(&c);
}

LJ_TEST(f32_tf32_d64_e96_states_ds)
{
    bwd_case c = {F, LJ_F32, 2, 2, 300, 64, 96, 1, 1, 1, 1, 1, 0, 0, 0, {0}, 0, 0, 0, 39, 0};
    run_bwd_case(&c);
}

LJ_TEST(varlen_pool_with_minus_one)
{
    bwd_case c = {F, LJ_BF16, 0, 4,  0, 128, 64, 1, 1, 1, 1, 1, 0, 0, 6, {1, 0, 63, 65, 130, 700},
                  1, 0,       0, 40, 0};
    run_bwd_case(&c);
}

LJ_TEST(graph_capture_with_ds_and_states)
{
    bwd_case c = {NULL, LJ_BF16, 2, 4, 777, 128, 64, 1, 1,  1,         1,
                  1,    0,       0, 0, {0}, 0,   0,  0, 42, .graph = 1};
    run_bwd_case(&c);
}

LJ_TEST(varlen_f16_vk_finite_difference)
{
    bwd_case c = {F, LJ_F16, 0, 2, 0, 64, 96, 1, 1, 1, 1, 1, 1, 0, 3, {17, 1, 200}, 0, 0, 1, 41, 0};
    run_bwd_case(&c);
}
