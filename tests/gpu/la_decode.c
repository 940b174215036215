/* la_decode.c — the decode family on the GPU against the float64 reference: T = 1..8 steps, both
 * layouts, every dtype, D != E, pools with shuffled slots and skipped (-1) rows whose outputs and
 * states stay untouched, per-step states, 1000 consecutive calls without drift, and graph capture
 * and replay. */
#include "attn_cases.h"
#include "test.h"

LJ_TEST(t1_bf16_kv_slots)
{
    decode_case c = {NULL, LJ_BF16, 8, 16, 128, 128, 1, 1, 0, 1, 0, 1, 0, 1};
    run_decode_case(&c);
}

LJ_TEST(t1_f32_vk_d_ne_e)
{
    decode_case c = {NULL, LJ_F32, 5, 3, 64, 192, 1, 1, 1, 1, 0, 2, 0, 2};
    run_decode_case(&c);
}

LJ_TEST(t4_f16_step_states_kv)
{
    decode_case c = {NULL, LJ_F16, 6, 4, 96, 48, 4, 1, 0, 1, 1, 2, 0, 3};
    run_decode_case(&c);
}

LJ_TEST(t8_bf16_step_states_vk_nodecay)
{
    decode_case c = {NULL, LJ_BF16, 3, 2, 32, 256, 8, 0, 1, 1, 1, 1, 0, 4};
    run_decode_case(&c);
}

LJ_TEST(t1_d256_no_slots)
{
    decode_case c = {NULL, LJ_F16, 1, 8, 256, 256, 1, 1, 0, 0, 0, 3, 0, 5};
    run_decode_case(&c);
}

LJ_TEST(t1_d16_large_batch)
{
    decode_case c = {NULL, LJ_BF16, 64, 8, 16, 16, 1, 1, 1, 1, 0, 2, 0, 6};
    run_decode_case(&c);
}

LJ_TEST(thousand_steps_no_drift)
{
    decode_case c = {NULL, LJ_F32, 4, 4, 64, 64, 1, 1, 0, 1, 0, 1000, 0, 7};
    run_decode_case(&c);
}

LJ_TEST(graph_capture_and_replay)
{
    decode_case c = {NULL, LJ_BF16, 8, 8, 128, 128, 2, 1, 0, 1, 1, 50, 1, 8};
    run_decode_case(&c);
}
