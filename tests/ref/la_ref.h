/* la_ref.h — the mathematics of DESIGN.md in float64 C: the reference every kernel is checked
 * against (the project's own copy of ../shared/reference/la_reference.py, which it must agree
 * with: tests/cpu/reference.c), and the error checks of DESIGN.md.
 *
 * One (batch, head) at a time; arrays are row-major doubles: q, k [N,D], v, o [N,E], states
 * [D,E] ("KV"). λ = exp(−s) (1 with no decay), σ the scale. */
#ifndef LAJIT_LA_REF_H
#define LAJIT_LA_REF_H

#include <stddef.h>

/* o_t = σ q_t S_t with S_t = λ S_{t−1} + k_tᵀ v_t; S0 NULL means zero; SN may be NULL. */
void la_ref_forward(int N, int D, int E, const double *q, const double *k, const double *v,
                    double lambda, double sigma, const double *S0, double *o, double *SN);

/* Backward (DESIGN.md): given dO [N,E] and dSN (NULL: zero), writes dq, dk [N,D], dv [N,E],
 * dS0 [D,E] and *ds (the gradient of s, i.e. −λ Σ_t ⟨G_t, S_{t−1}⟩), and *ds_bound =
 * λ Σ_t ‖G_t‖·‖S_{t−1}‖ (the scale of DESIGN.md's ds tolerance). */
void la_ref_backward(int N, int D, int E, const double *q, const double *k, const double *v,
                     const double *dO, double lambda, double sigma, const double *S0,
                     const double *dSN, double *dq, double *dk, double *dv, double *dS0, double *ds,
                     double *ds_bound);

/* One decode step on S in place: S ← λ S + kᵀ v; o = σ q S. */
void la_ref_decode_step(int D, int E, double *S, const double *q, const double *k, const double *v,
                        double lambda, double sigma, double *o);

/* DESIGN.md's check of one output of `rows` tokens of `cols` values: relative L2 over the whole
 * ≤ tol, and each row ‖e_t‖ ≤ 3·tol·max(‖ref_t‖, mean_t ‖ref_t‖); NaN or Inf never passes.
 * Returns 1 when it passes; otherwise 0 with the reason in why. *rel receives the relative L2. */
int la_ref_check(const double *got, const double *ref, size_t rows, size_t cols, double tol,
                 double *rel, char *why, size_t cap);

#endif
