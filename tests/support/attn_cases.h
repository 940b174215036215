/* attn_cases.h — one gpu test case of an attention op, described as data and run against the
 * float64 reference: fresh random inputs, NaN-poisoned outputs, every element checked with the
 * tolerances of DESIGN.md, and memory that must stay untouched compared byte for byte. Shared by
 * the gpu tests of every family of an op (tests/gpu/<family>.c). */
#ifndef LAJIT_ATTN_CASES_H
#define LAJIT_ATTN_CASES_H

#include "family.h"

typedef struct fwd_case {
    const char *family; /* NULL: the default forward family */
    lj_dtype dtype;
    int B, H, N, D, E;
    int decay;          /* s given (head 0 gets s = 0 to exercise the decay path at 0) */
    int initial, final; /* S_0 given, S_N wanted */
    int alias;          /* S_N written over S_0 (in place) */
    int vk;             /* states [.., E, D] */
    int bnhd;           /* q, k, v, o stored [B, N, H, D] (strided view) */
    int nseq;           /* > 0: varlen with these sequence lengths (B ignored) */
    int lens[16];
    int slot_minus_one; /* varlen with states: one sequence gets slot -1 */
    float scale;        /* 0: 1 */
    unsigned seed;
    const char *config; /* NULL: the family's own choice; else a whole configuration ("BLOCK=64
                            TILE_V=64 ...", every parameter): pinned as the bucket's tuned
                            winner in a private tuning database; the test checks the op ran it */
} fwd_case;

/* Runs the case (the test skips with no GPU) and fails the test on any mismatch. Prints one
 * line with the errors seen. */
void run_fwd_case(const fwd_case *c);

typedef struct decode_case {
    const char *family; /* NULL: la_decode */
    lj_dtype dtype;
    int B, H, D, E, T;
    int decay;
    int vk;
    int slots;       /* 1: shuffled pool slots with -1 rows; 0: NULL (row b = slot b) */
    int step_states; /* per-step states requested */
    int calls;       /* consecutive calls (fresh q, k, v each) */
    int graph;       /* capture one call in a CUDA graph and replay it `calls` times */
    unsigned seed;
} decode_case;

void run_decode_case(const decode_case *c);

typedef struct bwd_case {
    const char *family; /* NULL: the default backward family */
    lj_dtype dtype;
    int B, H, N, D, E;
    int decay;   /* s given: 1 ALiBi-like (head 0 gets s = 0), 2 s_h cycling through 0, 0.01, 1
                    and 4 (λ^N underflows in long sequences) */
    int want_ds; /* ds requested (needs decay) */
    int initial; /* S_0 given */
    int dsn;     /* dS_N given */
    int ds0;     /* dS_0 wanted */
    int vk;
    int bnhd;
    int nseq; /* > 0: varlen with these lengths */
    int lens[16];
    int slot_minus_one;
    float scale;     /* 0: 1 */
    int finite_diff; /* also check ds against a float64 finite difference of the forward */
    unsigned seed;
    int graph; /* also capture the call in a CUDA graph; its replay must give the same bits */
} bwd_case;

/* Runs the backward twice (the second run must give the same bits) and checks every gradient
 * against the float64 reference (tests/support/bwd_case.c). */
void run_bwd_case(const bwd_case *c);

/* Shared by the case files. */
double case_tolerance(lj_dtype dt);
void case_seed(unsigned seed);
void case_random_fill(float *x, size_t n, float amp, lj_dtype dt);
struct lajit_ctx *case_open_ctx(void);
void case_check(const char *what, const double *got, const double *ref, size_t rows, size_t cols,
                double tol, double *rel_out);

#endif
