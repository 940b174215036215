/* gla_ref.h — the float64 reference of the gated linear-attention forward (simple GLA: one
 * data-dependent scalar decay per token and head), the recurrence of
 * examples/families/simple_gla_fwd exactly as stated, token by token:
 *     S_t = exp(g_t) S_{t−1} + k_tᵀ v_t,   o_t = σ q_t S_t,   S_0 given or zero, S_N returned.
 * One (batch, head) at a time; arrays are row-major doubles: q, k [N,D], v, o [N,E], g [N] (the
 * log-gates, ≤ 0 in use but not required here), states [D,E]. Checks go through la_ref_check
 * (la_ref.h). */
#ifndef LAJIT_GLA_REF_H
#define LAJIT_GLA_REF_H

/* S0 NULL means zero; SN may be NULL. */
void gla_ref_forward(int N, int D, int E, const double *q, const double *k, const double *v,
                     const double *g, double sigma, const double *S0, double *o, double *SN);

#endif
