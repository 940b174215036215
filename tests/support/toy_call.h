/* toy_call.h — one forward call of the test family "toy" (tests/data/templates) on the fake
 * driver, shared by the tests of tuning (tests/cpu/autotune.c) and of shipped tuning tables
 * (tests/cpu/tuned.c): its problem, its buffers and arguments, the configuration a launch ran,
 * and the bucket's tuning identity as the op path computes it. */
#ifndef LAJIT_TEST_TOY_CALL_H
#define LAJIT_TEST_TOY_CALL_H

#include "context.h"
#include "fake_driver.h"
#include "search.h"

typedef struct toy_call {
    CUcontext cuctx;
    CUdeviceptr q, k, v, o, s;
    int64_t qshape[4], vshape[4], sshape[1];
    DLTensor tq, tk, tv, to, ts;
    lajit_attn_fwd_args args;
} toy_call;

/* A device tensor of the given shape and DLPack type (code, bits), compact. */
DLTensor toy_tensor(CUdeviceptr p, int ndim, int64_t *shape, uint8_t code, uint8_t bits);
/* bf16, B = 2, H = 3, N = 100, D = 32, E = 16, decay: the problem of every toy call. */
lj_problem toy_problem(void);
/* Retains the fake device's primary context, allocates the tensors and fills u->args (family
 * "toy"); toy_close gives them back. */
void toy_open(toy_call *u);
void toy_close(toy_call *u);
/* Block size and shared memory of the last launch: the toy configuration the plan ran
 * (block = 32 WARPS, smem = 1 KiB UNROLL). */
void toy_last_launch(unsigned *block, unsigned *smem);
/* The tuning identity of the toy problem on the fake device. */
lj_tune_id toy_id(lajit_ctx *ctx);

#endif
