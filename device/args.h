/* args.h — the kernel arguments of a custom family (op "custom", templates/common/args.cuh): the
 * values one launch passes, packed in the declared order into the parameter list
 * cuLaunchKernel takes, and the check, at module load, that the kernel's parameters are the
 * ones the spec declares. Shared by lajit_launch (runtime/launch.c) and the tuner, which
 * times candidates on tensors it allocates from the same declaration. */
#ifndef LAJIT_ARGS_H
#define LAJIT_ARGS_H

#include "driver.h"
#include "family.h"

/* One argument's value: a tensor's device address (0: an optional one left out), sizes and
 * strides in elements, or a scalar (f for f32, i for i32/i64). */
typedef struct lj_arg_value {
    unsigned long long ptr;
    long long size[LJ_MAX_RANK];
    long long stride[LJ_MAX_RANK];
    double f;
    long long i;
} lj_arg_value;

/* The largest parameter block: every argument a rank-LJ_MAX_RANK tensor. */
#define LJ_ARGS_BYTES (LJ_MAX_ARGS * (8 + 16 * LJ_MAX_RANK))

typedef struct lj_packed_args {
    _Alignas(8) unsigned char buf[LJ_ARGS_BYTES];
    void *params[LJ_MAX_ARGS + 1]; /* cuLaunchKernel's kernelParams, NULL-terminated */
} lj_packed_args;

/* The bytes of argument a as a kernel parameter: lj_arg<R> is 8 + 16 R, f32 and i32 4, i64 8. */
size_t lj_arg_param_bytes(const lj_arg_decl *a);

/* Packs v[0 .. d->n_args - 1] (in d's order) into out. No allocation; the hot path. */
void lj_args_pack(const lj_args_decl *d, const lj_arg_value *v, lj_packed_args *out);

/* The kernel fn (entry, of family) must take exactly d's parameters, each of its size:
 * LAJIT_ERR_TEMPLATE naming the first that differs otherwise. Needs the driver's
 * cuFuncGetParamInfo (CUDA 12.4); without it the check is skipped (said in the log). */
lajit_status lj_args_check_kernel(lj_env *env, const lj_driver *drv, CUfunction fn,
                                  const lj_args_decl *d, const char *family, const char *entry);

#endif
