/* gla_ref.c — the float64 reference of the gated forward (gla_ref.h). Written for clarity, as
 * la_ref.c is: the recurrence step by step, no chunking and no reordering, so that it shares
 * nothing with the kernel's chunked factorisation (prefix sums, exp of differences). */
#include "gla_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void gla_ref_forward(int N, int D, int E, const double *q, const double *k, const double *v,
                     const double *g, double sigma, const double *S0, double *o, double *SN)
{
    double *S = calloc((size_t)D * E, sizeof *S);
    if (!S)
        abort();
    if (S0)
        memcpy(S, S0, sizeof *S * (size_t)D * E);
    for (int t = 0; t < N; t++) {
        const double a = exp(g[t]);
        for (int d = 0; d < D; d++)
            for (int e = 0; e < E; e++)
                S[d * E + e] = a * S[d * E + e] + k[(size_t)t * D + d] * v[(size_t)t * E + e];
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
