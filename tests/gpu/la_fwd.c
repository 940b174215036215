/* la_fwd.c — the chunked forward (tensor cores) on the GPU against the float64 reference: chunk
 * boundaries (N = 1, 63, 64, 65, 913, 4096), head dims 16 to 256 with D != E, f16 and bf16, both
 * state layouts, decay and none, states in and out (in place too), [B,N,H,D] views and varlen with
 * a pool; and the op's default family (la_fwd; fp32 inputs through its tf32 path). */
#include "attn_cases.h"
#include "test.h"

#define F "la_fwd"

LJ_TEST(n1_bf16_decay_states)
{
    fwd_case c = {F, LJ_BF16, 2, 3, 1, 64, 64, 1, 1, 1, 0, 0, 0, 0, {0}, 0, 0, 11, NULL};
    run_fwd_case(&c);
}

LJ_TEST(n63_f16_nodecay)
{
    fwd_case c = {F, LJ_F16, 2, 4, 63, 128, 128, 0, 0, 0, 0, 0, 0, 0, {0}, 0, 0, 12, NULL};
    run_fwd_case(&c);
}

LJ_TEST(n64_bf16_d16_e16)
{
    fwd_case c = {F, LJ_BF16, 3, 2, 64, 16, 16, 1, 0, 1, 0, 0, 0, 0, {0}, 0, 0, 13, NULL};
    run_fwd_case(&c);
}

LJ_TEST(n65_f16_d96_e64_vk_in_place)
{
    fwd_case c = {F, LJ_F16, 2, 3, 65, 96, 64, 1, 1, 1, 1, 1, 0, 0, {0}, 0, 0.5f, 14, NULL};
    run_fwd_case(&c);
}

LJ_TEST(n913_bf16_d192_e256_bnhd)
{
    fwd_case c = {F, LJ_BF16, 1, 2, 913, 192, 256, 1, 1, 1, 0, 0, 1, 0, {0}, 0, 0, 15, NULL};
    run_fwd_case(&c);
}

LJ_TEST(n913_f16_d256_e32)
{
    fwd_case c = {F, LJ_F16, 1, 4, 913, 256, 32, 1, 0, 1, 0, 0, 0, 0, {0}, 0, 0, 16, NULL};
    run_fwd_case(&c);
}

LJ_TEST(n4096_bf16_d128_states)
{
    fwd_case c = {F, LJ_BF16, 1, 4, 4096, 128, 128, 1, 1, 1, 0, 0, 0, 0, {0}, 0, 0, 17, NULL};
    run_fwd_case(&c);
}

LJ_TEST(n4096_f16_d64_nodecay_bnhd)
{
    fwd_case c = {F, LJ_F16, 2, 2, 4096, 64, 64, 0, 0, 1, 0, 0, 1, 0, {0}, 0, 0, 18, NULL};
    run_fwd_case(&c);
}

LJ_TEST(varlen_pool_with_minus_one)
{
    fwd_case c = {F, LJ_BF16, 0,  4,   0, 128, 64, 1, 1, 1, 1, 0, 0, 6, {1, 0, 63, 65, 130, 700},
                  1, 0,       19, NULL};
    run_fwd_case(&c);
}

LJ_TEST(varlen_f16_vk)
{
    fwd_case c = {F, LJ_F16, 0, 2, 0, 64, 96, 1, 1, 1, 0, 1, 0, 3, {17, 1, 200}, 0, 0, 20, NULL};
    run_fwd_case(&c);
}

LJ_TEST(default_family_bf16)
{
    fwd_case c = {NULL, LJ_BF16, 2, 4, 300, 128, 128, 1, 1, 1, 0, 0, 0, 0, {0}, 0, 0, 21, NULL};
    run_fwd_case(&c);
}

LJ_TEST(default_family_f32_tf32)
{
    fwd_case c = {NULL, LJ_F32, 2, 2, 100, 64, 64, 1, 1, 1, 0, 0, 0, 0, {0}, 0, 0, 22, NULL};
    run_fwd_case(&c);
}
