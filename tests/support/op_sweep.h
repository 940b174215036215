/* op_sweep.h — allocation-failure sweeps of an op's first call through the fake driver
 * (fake_driver.h), shared by tests/cpu/alloc_sweep.c and tests/cpu/tune_sweep.c.
 *
 * A sweep runs the call once in a fresh context with injection off, to learn how many host
 * allocations (LJ_FAULT_ALLOC, counted by the context's lj_env) the call makes and which
 * launches it makes; then, for each allocation n in turn, a fresh fake driver, fresh buffers and
 * a fresh context in which the n-th allocation of the call fails. Each failure must end in a
 * status the sweep allows with a message (or be recovered from, with the same launches); the
 * same call in the same context, injection off, must then succeed and make exactly the
 * reference launches (same kernels, geometry and la_params, pointers compared as buffer and
 * offset); and once the context is destroyed and the buffers freed, every driver resource must
 * have been given back. Leaks of host memory are left to the ASan build (LeakSanitizer).
 *
 * Each iteration starts from lj_fake_driver_reset() because the fake's launch log keeps only
 * the first 256 launches. */
#ifndef LAJIT_OP_SWEEP_H
#define LAJIT_OP_SWEEP_H

#include "fake_driver.h"
#include "gpu.h"

#define SWEEP_MAX_BUFS     16
#define SWEEP_MAX_LAUNCHES 16

/* The device buffers and arguments of one call. Self-referential (tensors point into it):
 * initialise in place, never copy. */
typedef struct sweep_fixture {
    CUcontext cuctx;
    int n;
    CUdeviceptr ptr[SWEEP_MAX_BUFS];
    size_t bytes[SWEEP_MAX_BUFS];
    lj_test_tensor t[SWEEP_MAX_BUFS];
    lajit_attn_fwd_args fwd;
    lajit_attn_bwd_args bwd;
    lajit_attn_decode_args dec;
} sweep_fixture;

/* A compact tensor of fresh fake device memory (zeroed), registered in x. */
DLTensor *sweep_buffer(sweep_fixture *x, int ndim, const int64_t *shape, DLDataType dtype);

/* A launch with every device pointer replaced by (buffer index + 1) << 48 | offset, or by
 * 0xFFFF << 48 for memory the fixture does not own (the context's ds workspace). */
typedef struct sweep_launch {
    char entry[64];
    unsigned grid[3], block[3], smem;
    la_params p;
} sweep_launch;

typedef struct sweep_case {
    const char *name;
    void (*build)(sweep_fixture *x); /* after lj_fake_driver_reset: buffers and arguments */
    lajit_status (*call)(lajit_ctx *ctx, sweep_fixture *x);
    uint32_t ctx_flags;
    uint32_t autotune;  /* LAJIT_AUTOTUNE_OFF unless the case says otherwise */
    const char *bundle; /* lajit_ctx_desc.bundle (NULL: none) */
    /* Run before each iteration (e.g. remove the tuning database); may be NULL. */
    void (*before)(void);
    /* Launches a retry after a failure may make instead of the reference ones (e.g. the
     * default configuration after a failed tuning); n_alt 0: none. */
    const sweep_launch *alt;
    int n_alt;
    /* Called after each iteration with the reference launches, once the faulted context is
     * gone (e.g. a fresh context must tune to the same winner); may be NULL. */
    void (*after)(const struct sweep_case *c, const sweep_launch *ref, int n_ref);
    /* At most this many injections (sites sampled evenly when the call makes more); 0: all.
     * LAJIT_SWEEP_ALL=1 in the environment injects every site whatever this says. */
    int max_injections;
} sweep_case;

typedef struct sweep_result {
    uint64_t sites; /* allocations the call makes */
    int injected;   /* failures injected */
    int errors;     /* calls that ended in an error status (all LAJIT_ERR_OUT_OF_MEMORY) */
    int recovered;  /* calls that succeeded anyway (Lua's emergency collection and retry) */
    int sampled;    /* 1 when not every site was injected */
} sweep_result;

/* The reference run (injection off): fills ref (n_ref launches) and returns the allocation
 * count. */
uint64_t sweep_reference(const sweep_case *c, sweep_launch *ref, int *n_ref);

/* One clean call in a fresh context without c->before: it must succeed with the launches ref
 * (what: the check's name in the failure message). */
void sweep_expect(const sweep_case *c, const sweep_launch *ref, int n_ref, const char *what);

/* The sweep; fails the test on the first unclean site. Prints one summary line. */
void sweep_run(const sweep_case *c, sweep_result *out);

/* A fresh context for c with the fake driver (injection off). */
lajit_ctx *sweep_ctx(const sweep_case *c);

/* One call in ctx; its launches on the legacy stream (the cases' stream: the tuner's timing
 * launches on its own stream are left out), normalised against x, into out (at most
 * SWEEP_MAX_LAUNCHES). */
lajit_status sweep_call(const sweep_case *c, lajit_ctx *ctx, sweep_fixture *x, sweep_launch *out,
                        int *n_out);

void sweep_fixture_open(sweep_fixture *x);
void sweep_fixture_close(sweep_fixture *x);

/* Skips the case (exit 77) when NVRTC cannot be loaded. */
void sweep_require_nvrtc(void);

#endif
