/* la_ref.c — the float64 reference and error checks (la_ref.h). Written for clarity: the
 * recurrence exactly as DESIGN.md states it, no reordering. */
#include "la_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void la_ref_forward(int N, int D, int E, const double *q, const double *k, const double *v,
                    double lambda, double sigma, const double *S0, double *o, double *SN)
{
    double *S = calloc((size_t)D * E, sizeof *S);
    if (S0)
        memcpy(S, S0, sizeof *S * (size_t)D * E);
    for (int t = 0; t < N; t++) {
        for (int d = 0; d < D; d++)
            for (int e = 0; e < E; e++)
                S[d * E + e] = lambda * S[d * E + e] + k[(size_t)t * D + d] * v[(size_t)t * E + e];
        for (int e = 0; e < E; e++) {
            double acc = 0;
            for (int d = 0; d < D; d++)
                acc += q[(size_t)t * D + d] * S[d * E + e];
            o[(size_t)t * E + e] = sigma * acc;
        }
    }
    if (SN)
        memcpy(SN, S, sizeof *S * (size_t)D * E);
    free(S);
}

void la_ref_backward(int N, int D, int E, const double *q, const double *k, const double *v,
                     const double *dO, double lambda, double sigma, const double *S0,
                     const double *dSN, double *dq, double *dk, double *dv, double *dS0, double *ds,
                     double *ds_bound)
{
    size_t DE = (size_t)D * E;
    /* Every state S_0..S_N, recomputed forward (never by dividing by λ). */
    double *states = calloc(DE * (size_t)(N + 1), sizeof *states);
    if (S0)
        memcpy(states, S0, sizeof *states * DE);
    for (int t = 0; t < N; t++)
        for (int d = 0; d < D; d++)
            for (int e = 0; e < E; e++)
                states[(size_t)(t + 1) * DE + d * E + e] =
                    lambda * states[(size_t)t * DE + d * E + e] +
                    k[(size_t)t * D + d] * v[(size_t)t * E + e];
    double *G = calloc(DE, sizeof *G);
    if (dSN)
        memcpy(G, dSN, sizeof *G * DE);
    double sum = 0, bound = 0;
    for (int t = N - 1; t >= 0; t--) {
        if (t < N - 1)
            for (size_t i = 0; i < DE; i++)
                G[i] *= lambda;
        for (int d = 0; d < D; d++)
            for (int e = 0; e < E; e++)
                G[d * E + e] += sigma * q[(size_t)t * D + d] * dO[(size_t)t * E + e];
        const double *St = states + (size_t)(t + 1) * DE, *Sprev = states + (size_t)t * DE;
        for (int d = 0; d < D; d++) {
            double a = 0, b = 0;
            for (int e = 0; e < E; e++) {
                a += dO[(size_t)t * E + e] * St[d * E + e];
                b += G[d * E + e] * v[(size_t)t * E + e];
            }
            dq[(size_t)t * D + d] = sigma * a;
            dk[(size_t)t * D + d] = b;
        }
        for (int e = 0; e < E; e++) {
            double a = 0;
            for (int d = 0; d < D; d++)
                a += k[(size_t)t * D + d] * G[d * E + e];
            dv[(size_t)t * E + e] = a;
        }
        double dot = 0, gn = 0, sn = 0;
        for (size_t i = 0; i < DE; i++) {
            dot += G[i] * Sprev[i];
            gn += G[i] * G[i];
            sn += Sprev[i] * Sprev[i];
        }
        sum += dot;
        bound += sqrt(gn) * sqrt(sn);
    }
    /* With no token S_N is S_0, so dS_0 is dS_N itself (G was never decayed into S_0). */
    for (size_t i = 0; i < DE; i++)
        dS0[i] = N > 0 ? lambda * G[i] : G[i];
    *ds = -lambda * sum;
    *ds_bound = lambda * bound;
    free(G);
    free(states);
}

void la_ref_decode_step(int D, int E, double *S, const double *q, const double *k, const double *v,
                        double lambda, double sigma, double *o)
{
    for (int d = 0; d < D; d++)
        for (int e = 0; e < E; e++)
            S[d * E + e] = lambda * S[d * E + e] + k[d] * v[e];
    for (int e = 0; e < E; e++) {
        double acc = 0;
        for (int d = 0; d < D; d++)
            acc += q[d] * S[d * E + e];
        o[e] = sigma * acc;
    }
}

int la_ref_check(const double *got, const double *ref, size_t rows, size_t cols, double tol,
                 double *rel, char *why, size_t cap)
{
    double err2 = 0, ref2 = 0, mean_norm = 0;
    for (size_t i = 0; i < rows * cols; i++) {
        if (!isfinite(got[i])) {
            snprintf(why, cap, "element %zu (row %zu) is %g", i, i / cols, got[i]);
            *rel = INFINITY;
            return 0;
        }
        double e = got[i] - ref[i];
        err2 += e * e;
        ref2 += ref[i] * ref[i];
    }
    for (size_t r = 0; r < rows; r++) {
        double n = 0;
        for (size_t c = 0; c < cols; c++)
            n += ref[r * cols + c] * ref[r * cols + c];
        mean_norm += sqrt(n);
    }
    mean_norm /= rows ? (double)rows : 1.0;
    *rel = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    if (!(*rel <= tol)) {
        snprintf(why, cap, "relative L2 error %.3g > %.3g", *rel, tol);
        return 0;
    }
    for (size_t r = 0; r < rows; r++) {
        double e2 = 0, n2 = 0;
        for (size_t c = 0; c < cols; c++) {
            double e = got[r * cols + c] - ref[r * cols + c];
            e2 += e * e;
            n2 += ref[r * cols + c] * ref[r * cols + c];
        }
        double limit = 3 * tol * fmax(sqrt(n2), mean_norm);
        if (sqrt(e2) > limit && sqrt(e2) > 1e-30) {
            snprintf(why, cap, "row %zu: error %.3g > %.3g (3·tol·max(‖ref_t‖, mean))", r, sqrt(e2),
                     limit);
            return 0;
        }
    }
    return 1;
}
