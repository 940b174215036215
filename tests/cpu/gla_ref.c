/* gla_ref.c — checks of the gated forward's float64 reference (tests/ref/gla_ref.c), which the
 * simple_gla_fwd gpu test trusts: with one gate value throughout it must be the constant-decay
 * recurrence (la_ref_forward with λ = exp(g)), and a hand-worked three-token case with varying
 * gates and a start state must come out exactly. */
#include <math.h>

#include "gla_ref.h"
#include "la_ref.h"
#include "test.h"

static unsigned rng = 99;

static double uni(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (double)(rng >> 8) / 8388608.0 - 1.0;
}

LJ_TEST(constant_gates_match_la_ref)
{
    enum { N = 37, D = 5, E = 3 };
    double q[N * D], k[N * D], v[N * E], g[N], S0[D * E];
    double o1[N * E], o2[N * E], S1[D * E], S2[D * E];
    for (int i = 0; i < N * D; i++)
        q[i] = uni(), k[i] = uni();
    for (int i = 0; i < N * E; i++)
        v[i] = uni();
    for (int i = 0; i < D * E; i++)
        S0[i] = uni();
    for (int t = 0; t < N; t++)
        g[t] = -0.3;
    gla_ref_forward(N, D, E, q, k, v, g, 0.7, S0, o1, S1);
    la_ref_forward(N, D, E, q, k, v, exp(-0.3), 0.7, S0, o2, S2);
    for (int i = 0; i < N * E; i++)
        ASSERT_LE_F(fabs(o1[i] - o2[i]), 1e-12 * (1 + fabs(o2[i])));
    for (int i = 0; i < D * E; i++)
        ASSERT_LE_F(fabs(S1[i] - S2[i]), 1e-12 * (1 + fabs(S2[i])));
}

/* D = E = 1: S_1 = e^{g1} s0 + k1 v1, S_2 = e^{g2} S_1 + k2 v2, S_3 = e^{g3} S_2 + k3 v3, o_t =
 * σ q_t S_t, written out by hand. */
LJ_TEST(three_tokens_by_hand)
{
    const double q[3] = {1.5, -2, 0.25}, k[3] = {0.5, 1, -1}, v[3] = {2, -1, 4};
    const double g[3] = {-0.5, 0, -2}, s0 = 3, sigma = 0.5;
    double o[3], sn;
    gla_ref_forward(3, 1, 1, q, k, v, g, sigma, &s0, o, &sn);
    const double S1 = exp(-0.5) * 3 + 0.5 * 2, S2 = S1 + 1 * -1, S3 = exp(-2) * S2 + -1 * 4.0;
    ASSERT_LE_F(fabs(o[0] - sigma * 1.5 * S1), 1e-14);
    ASSERT_LE_F(fabs(o[1] - sigma * -2 * S2), 1e-14);
    ASSERT_LE_F(fabs(o[2] - sigma * 0.25 * S3), 1e-14);
    ASSERT_LE_F(fabs(sn - S3), 1e-14);
}
