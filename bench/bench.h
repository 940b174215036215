/* bench.h — what lajit_bench's modes share (bench/lajit_bench.c, bench/cp_bench.c): the driver
 * table, failing checks, device buffers filled with random numbers, DLPack views and medians.
 *
 * A benchmark has nothing to recover from: every helper that fails prints what failed and ends
 * the process with status 1 (lj_bench_die), which in a rank of the context-parallel mode lets the
 * launcher see the failure and stop the other ranks. */
#ifndef LAJIT_BENCH_H
#define LAJIT_BENCH_H

#include <stddef.h>

#include "context.h"

/* The process's driver table (lj_bench_load_driver) and the env its loaders report into. */
extern const lj_driver *lj_bench_drv;
extern lj_env lj_bench_env;

/* Loads the driver into lj_bench_drv; returns the loader's status (message in lj_bench_env). */
lajit_status lj_bench_load_driver(void);

/* Flushes every stream and ends the process with status 1 (never returns). */
void lj_bench_die(void) __attribute__((noreturn));

/* A driver call that must succeed: on failure prints the call, the result's name and the line. */
#define CU(call)                                                                         \
    do {                                                                                 \
        CUresult r_ = (lj_bench_drv->call);                                              \
        if (r_ != CUDA_SUCCESS) {                                                        \
            const char *n_ = "?";                                                        \
            lj_bench_drv->cuGetErrorName(r_, &n_);                                       \
            fprintf(stderr, "lajit_bench: %s failed: %s (%s:%d)\n", #call, n_, __FILE__, \
                    __LINE__);                                                           \
            lj_bench_die();                                                              \
        }                                                                                \
    } while (0)

/* A lajit call that must succeed: prints what, the status and lajit_errmsg(ctx). */
void lj_bench_check(lajit_ctx *ctx, lajit_status st, const char *what);

/* Median of n values (sorts v). */
double lj_bench_median(double *v, int n);
/* Comma-separated integers of s into out (at most cap); returns how many. */
int lj_bench_parse_list(const char *s, int *out, int cap);

/* A device allocation of bytes in the current context. */
CUdeviceptr lj_bench_alloc(size_t bytes);

/* Fills n values of `bits` (32: float32, 16: bfloat16) with uniform random numbers in
 * [-amp, amp) drawn from seed. */
void lj_bench_fill_random(CUdeviceptr p, size_t n, int bits, float amp, unsigned seed);
/* The same values in a dtype by name: "bf16", "f16" (IEEE half) or "f32". */
void lj_bench_fill_random_dtype(CUdeviceptr p, size_t n, const char *dtype, float amp,
                                unsigned seed);

/* A compact DLPack view (strides NULL) of device memory p on device `ordinal`. shape is not
 * copied: it must outlive the view. */
DLTensor lj_bench_tensor(CUdeviceptr p, int ndim, int64_t *shape, int bits, int code, int ordinal);

/* lajit_bench --mode cp (bench/cp_bench.c): parses its own arguments, returns the exit status. */
int lj_bench_cp_main(int argc, char **argv);

#endif
