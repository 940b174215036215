/* decay.c — conversions from the decay conventions users train with to lajit's per-head rate
 * s >= 0 (λ = exp(−s)). One kernel, many conventions: these helpers, never other kernels. */
#include <math.h>

#include "lajit.h"

/* ALiBi's slopes for n heads: for n a power of two 2^(−8(h+1)/n); otherwise the slopes of the
 * largest power of two below n, followed by every other slope of twice that power (the
 * interleaved extension of the ALiBi paper's reference code). */
static double alibi_slope(int n, int h)
{
    int p = 1;
    while (p * 2 <= n)
        p *= 2;
    if (h < p)
        return pow(2.0, -8.0 * (h + 1) / p);
    /* Extra heads take the odd-indexed slopes of 2p heads: 2^(−8(2j+1)/(2p)). */
    int j = h - p;
    return pow(2.0, -8.0 * (2 * j + 1) / (2.0 * p));
}

LAJIT_API lajit_status lajit_decay_alibi(int n_heads, int layer, int n_layers, float *s)
{
    if (!s || n_heads <= 0 || n_layers <= 0 || layer < 0 || layer >= n_layers)
        return LAJIT_ERR_INVALID_ARGUMENT;
    double factor = n_layers == 1 ? 1.0 + 1e-5 : 1.0 - (double)layer / (n_layers - 1) + 1e-5;
    for (int h = 0; h < n_heads; h++)
        s[h] = (float)(alibi_slope(n_heads, h) * factor);
    return LAJIT_OK;
}

LAJIT_API lajit_status lajit_decay_tnl(int n_heads, int layer, int n_layers, float *s)
{
    if (!s || n_heads <= 0 || n_layers <= 0 || layer < 0 || layer >= n_layers)
        return LAJIT_ERR_INVALID_ARGUMENT;
    for (int h = 0; h < n_heads; h++)
        s[h] = (float)(8.0 * h / n_heads * (1.0 - (double)layer / n_layers));
    return LAJIT_OK;
}

LAJIT_API lajit_status lajit_decay_from_log(const float *log_lambda, int n, float *s)
{
    if (!log_lambda || !s || n <= 0)
        return LAJIT_ERR_INVALID_ARGUMENT;
    for (int i = 0; i < n; i++)
        if (!(log_lambda[i] <= 0.0f) || !isfinite(log_lambda[i]))
            return LAJIT_ERR_INVALID_ARGUMENT;
    for (int i = 0; i < n; i++)
        s[i] = -log_lambda[i];
    return LAJIT_OK;
}
