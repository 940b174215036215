/* reference.c — the float64 C reference (tests/ref/la_ref.c) is itself checked: against the
 * executable specification la_reference.py (data in tests/data/ref_small.txt), against finite
 * differences, decode against the forward, the chunked form of DESIGN.md against the
 * recurrence, and the error checks against what they must reject. */
#include "test.h"

#include "la_ref.h"

enum { N = 9, D = 6, E = 4 };

typedef struct data {
    double s, sigma;
    double q[N * D], k[N * D], v[N * E], S0[D * E], dO[N * E], dSN[D * E];
    double o[N * E], SN[D * E], dq[N * D], dk[N * D], dv[N * E], dS0[D * E], ds;
} data;

static void read_array(FILE *f, const char *name, double *out, int n)
{
    char got[16];
    int count;
    if (fscanf(f, "%15s %d", got, &count) != 2 || strcmp(got, name) != 0 || count != n)
        lj_test_fail(__FILE__, __LINE__, "ref_small.txt: expected %s with %d values", name, n);
    for (int i = 0; i < n; i++)
        if (fscanf(f, "%lf", &out[i]) != 1)
            lj_test_fail(__FILE__, __LINE__, "ref_small.txt: short %s", name);
}

static void load(data *d)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/ref_small.txt", lj_test_source_dir());
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    int n, dd, e;
    ASSERT_EQ(fscanf(f, "N %d D %d E %d s %lf sigma %lf", &n, &dd, &e, &d->s, &d->sigma), 5);
    ASSERT_TRUE(n == N && dd == D && e == E);
    read_array(f, "q", d->q, N * D);
    read_array(f, "k", d->k, N * D);
    read_array(f, "v", d->v, N * E);
    read_array(f, "S0", d->S0, D * E);
    read_array(f, "dO", d->dO, N * E);
    read_array(f, "dSN", d->dSN, D * E);
    read_array(f, "o", d->o, N * E);
    read_array(f, "SN", d->SN, D * E);
    read_array(f, "dq", d->dq, N * D);
    read_array(f, "dk", d->dk, N * D);
    read_array(f, "dv", d->dv, N * E);
    read_array(f, "dS0", d->dS0, D * E);
    read_array(f, "ds", &d->ds, 1);
    fclose(f);
}

static double max_diff(const double *a, const double *b, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++)
        m = fmax(m, fabs(a[i] - b[i]));
    return m;
}

LJ_TEST(forward_and_backward_match_the_python_specification)
{
    data d;
    load(&d);
    double lam = exp(-d.s), o[N * E], SN[D * E], dq[N * D], dk[N * D], dv[N * E], dS0[D * E], ds,
           bound;
    la_ref_forward(N, D, E, d.q, d.k, d.v, lam, d.sigma, d.S0, o, SN);
    ASSERT_LE_F(max_diff(o, d.o, N * E), 1e-12);
    ASSERT_LE_F(max_diff(SN, d.SN, D * E), 1e-12);
    la_ref_backward(N, D, E, d.q, d.k, d.v, d.dO, lam, d.sigma, d.S0, d.dSN, dq, dk, dv, dS0, &ds,
                    &bound);
    ASSERT_LE_F(max_diff(dq, d.dq, N * D), 1e-12);
    ASSERT_LE_F(max_diff(dk, d.dk, N * D), 1e-12);
    ASSERT_LE_F(max_diff(dv, d.dv, N * E), 1e-12);
    ASSERT_LE_F(max_diff(dS0, d.dS0, D * E), 1e-12);
    ASSERT_LE_F(fabs(ds - d.ds), 1e-12);
    ASSERT_TRUE(bound >= fabs(ds));
}

/* loss = Σ o·dO + Σ S_N·dS_N */
static double loss(const data *d, const double *q, const double *k, const double *v, double s,
                   const double *S0)
{
    double o[N * E], SN[D * E], l = 0;
    la_ref_forward(N, D, E, q, k, v, exp(-s), d->sigma, S0, o, SN);
    for (int i = 0; i < N * E; i++)
        l += o[i] * d->dO[i];
    for (int i = 0; i < D * E; i++)
        l += SN[i] * d->dSN[i];
    return l;
}

LJ_TEST(backward_matches_finite_differences)
{
    data d;
    load(&d);
    double lam = exp(-d.s), dq[N * D], dk[N * D], dv[N * E], dS0[D * E], ds, bound;
    la_ref_backward(N, D, E, d.q, d.k, d.v, d.dO, lam, d.sigma, d.S0, d.dSN, dq, dk, dv, dS0, &ds,
                    &bound);
    const double h = 1e-6;
    double *params[4] = {d.q, d.k, d.v, d.S0};
    const double *grads[4] = {dq, dk, dv, dS0};
    const int sizes[4] = {N * D, N * D, N * E, D * E};
    for (int p = 0; p < 4; p++) {
        for (int i = 0; i < sizes[p]; i++) {
            double keep = params[p][i];
            params[p][i] = keep + h;
            double up = loss(&d, d.q, d.k, d.v, d.s, d.S0);
            params[p][i] = keep - h;
            double down = loss(&d, d.q, d.k, d.v, d.s, d.S0);
            params[p][i] = keep;
            ASSERT_LE_F(fabs((up - down) / (2 * h) - grads[p][i]), 1e-6);
        }
    }
    double fd =
        (loss(&d, d.q, d.k, d.v, d.s + h, d.S0) - loss(&d, d.q, d.k, d.v, d.s - h, d.S0)) / (2 * h);
    ASSERT_LE_F(fabs(fd - ds), 1e-6);
}

LJ_TEST(decode_steps_equal_the_forward)
{
    data d;
    load(&d);
    double lam = exp(-d.s), o[N * E], SN[D * E], S[D * E], step[E];
    la_ref_forward(N, D, E, d.q, d.k, d.v, lam, d.sigma, d.S0, o, SN);
    memcpy(S, d.S0, sizeof S);
    for (int t = 0; t < N; t++) {
        la_ref_decode_step(D, E, S, d.q + t * D, d.k + t * D, d.v + t * E, lam, d.sigma, step);
        ASSERT_LE_F(max_diff(step, o + t * E, E), 1e-12);
    }
    ASSERT_LE_F(max_diff(S, SN, D * E), 1e-12);
}

LJ_TEST(chunked_form_equals_the_recurrence)
{
    /* DESIGN.md's chunk formulas with chunk 4 on N = 9 (a ragged last chunk of 1):
     * o_i = σ[(QKᵀ ⊙ M)V]_i + σ λ^{i+1} q_i S, then S ← λ^L S + Σ_j λ^{L−1−j} k_jᵀ v_j. */
    data d;
    load(&d);
    double lam = exp(-d.s), o[N * E], SN[D * E], S[D * E], oc[N * E];
    la_ref_forward(N, D, E, d.q, d.k, d.v, lam, d.sigma, d.S0, o, SN);
    memcpy(S, d.S0, sizeof S);
    const int C = 4;
    for (int c0 = 0; c0 < N; c0 += C) {
        int L = N - c0 < C ? N - c0 : C;
        for (int i = 0; i < L; i++) {
            for (int e = 0; e < E; e++) {
                double intra = 0, inter = 0;
                for (int j = 0; j <= i; j++) {
                    double qk = 0;
                    for (int x = 0; x < D; x++)
                        qk += d.q[(c0 + i) * D + x] * d.k[(c0 + j) * D + x];
                    intra += qk * pow(lam, i - j) * d.v[(c0 + j) * E + e];
                }
                for (int x = 0; x < D; x++)
                    inter += d.q[(c0 + i) * D + x] * S[x * E + e];
                oc[(c0 + i) * E + e] = d.sigma * intra + d.sigma * pow(lam, i + 1) * inter;
            }
        }
        for (int x = 0; x < D; x++)
            for (int e = 0; e < E; e++) {
                double acc = pow(lam, L) * S[x * E + e];
                for (int j = 0; j < L; j++)
                    acc += pow(lam, L - 1 - j) * d.k[(c0 + j) * D + x] * d.v[(c0 + j) * E + e];
                S[x * E + e] = acc;
            }
    }
    ASSERT_LE_F(max_diff(oc, o, N * E), 1e-12);
    ASSERT_LE_F(max_diff(S, SN, D * E), 1e-12);
}

LJ_TEST(checks_reject_one_bad_token_and_nan)
{
    enum { R = 4096, Cc = 8 };
    static double ref[R * Cc], got[R * Cc];
    unsigned x = 1;
    for (int i = 0; i < R * Cc; i++) {
        x = x * 1664525u + 1013904223u;
        ref[i] = (double)(x >> 8) / 8388608.0 - 1.0;
        got[i] = ref[i] * (1 + 1e-4);
    }
    double rel;
    char why[256];
    ASSERT_TRUE(la_ref_check(got, ref, R, Cc, 6e-3, &rel, why, sizeof why));
    ASSERT_LE_F(rel, 2e-4);
    /* One token wrong by 10 %: invisible in the relative L2 of 4096 tokens, caught per token. */
    for (int c = 0; c < Cc; c++)
        got[1234 * Cc + c] = ref[1234 * Cc + c] * 1.1;
    ASSERT_TRUE(!la_ref_check(got, ref, R, Cc, 6e-3, &rel, why, sizeof why));
    ASSERT_LE_F(rel, 6e-3);
    ASSERT_CONTAINS(why, "row 1234");
    for (int c = 0; c < Cc; c++)
        got[1234 * Cc + c] = ref[1234 * Cc + c];
    got[77] = NAN;
    ASSERT_TRUE(!la_ref_check(got, ref, R, Cc, 6e-3, &rel, why, sizeof why));
    got[77] = INFINITY;
    ASSERT_TRUE(!la_ref_check(got, ref, R, Cc, 6e-3, &rel, why, sizeof why));
}
