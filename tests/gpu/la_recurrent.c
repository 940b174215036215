/* la_recurrent.c — the recurrent forward family on the GPU against the float64 reference:
 * odd lengths, head dims from 16 to 256 with D != E, every dtype, both state layouts, decay and
 * none, states in and out (in place too), [B,N,H,D] views, and varlen with a pool. */
#include "attn_cases.h"
#include "test.h"

#define F "la_recurrent"

LJ_TEST(n1_bf16_decay_states)
{
    fwd_case c = {F, LJ_BF16, 2, 3, 1, 64, 64, 1, 1, 1, 0, 0, 0, 0, {0}, 0, 0, 1, NULL};
    run_fwd_case(&c);
}

LJ_TEST(n63_f32_nodecay)
{
    fwd_case c = {F, LJ_F32, 2, 4, 63, 96, 96, 0, 0, 0, 0, 0, 0, 0, {0}, 0, 0, 2, NULL};
    run_fwd_case(&c);
}

LJ_TEST(n65_f16_decay_d_ne_e)
{
    fwd_case c = {F, LJ_F16, 1, 4, 65, 192, 64, 1, 1, 1, 0, 0, 0, 0, {0}, 0, 0.5f, 3, NULL};
    run_fwd_case(&c);
}

LJ_TEST(n913_bf16_d256_vk_in_place)
{
    fwd_case c = {F, LJ_BF16, 1, 2, 913, 256, 256, 1, 1, 1, 1, 1, 0, 0, {0}, 0, 0, 4, NULL};
    run_fwd_case(&c);
}

LJ_TEST(n913_f32_d16_e48_bnhd)
{
    fwd_case c = {F, LJ_F32, 3, 5, 913, 16, 48, 1, 0, 1, 0, 0, 1, 0, {0}, 0, 0, 5, NULL};
    run_fwd_case(&c);
}

LJ_TEST(n4096_f16_e16_bnhd_initial_only)
{
    fwd_case c = {F, LJ_F16, 1, 2, 4096, 64, 16, 1, 1, 0, 0, 0, 1, 0, {0}, 0, 0, 6, NULL};
    run_fwd_case(&c);
}

LJ_TEST(varlen_pool_with_minus_one)
{
    fwd_case c = {F, LJ_BF16, 0, 4,   0, 128, 64, 1, 1, 1, 1, 0, 0, 5, {1, 0, 63, 65, 130},
                  1, 0,       7, NULL};
    run_fwd_case(&c);
}

LJ_TEST(varlen_f32_vk_no_states)
{
    fwd_case c = {F, LJ_F32, 0, 2, 0, 32, 96, 0, 0, 0, 0, 1, 0, 3, {17, 1, 200}, 0, 0, 8, NULL};
    run_fwd_case(&c);
}
