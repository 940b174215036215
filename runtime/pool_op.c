/* pool_op.c — lj_state_pool_gather and lj_state_pool_scatter: copies of states between a pool
 * [P, H, R, C] and a batch [n, H, R, C] by slot index (the LAJIT_SLOT_* encoding of
 * include/lajit.h), which context parallelism over varlen batches uses to move each sequence's
 * state between its pool slot and the compact batch the exchange and the scan work on. Both are
 * checked here in their own terms and launched through lajit_launch on the built-in custom family
 * la_state_pool (templates/la_state_pool), whose scalar `scatter` picks the direction; the family
 * checks what its declaration says on top (CUDA memory on this device, 16-byte alignment, unit
 * last stride, the two state tensors sharing no element). R and C are a state's rows and columns
 * as stored (D, E or VK's E, D: the copy is elementwise).
 *
 * The hot path is lajit_launch's (no allocation, no Lua, no synchronisation, graph-capturable);
 * n = 0 launches nothing. Checked mode (LAJIT_CTX_CHECKED) reads the slots back and refuses one
 * outside the encoding or the pool, and in a scatter a slot named twice (two states racing for
 * it). */
#include <stdio.h>
#include <string.h>

#include "op_args.h"

/* The pool or the batch: float32 of rank 4; *want_rest (H, R, C) when not NULL. */
static lajit_status check_states(lj_env *env, const char *fn, const char *name, const DLTensor *t,
                                 const int64_t *want_rest)
{
    lj_elem e;
    if (!t->shape || t->ndim != 4)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: %s must be float32 [%s, H, R, C] (states as stored: [.., D, E] or "
                        "[.., E, D]); it has %d dimensions",
                        fn, name, strcmp(name, "pool") == 0 ? "P" : "n", t->shape ? t->ndim : 0);
    if (!lj_tensor_elem(t->dtype, &e) || e != LJ_ELEM_F32)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: %s is %s; pooled states are float32",
                        fn, name, lj_tensor_dtype_name(t->dtype));
    for (int i = 1; want_rest && i < 4; i++) {
        if (t->shape[i] != want_rest[i - 1]) {
            char got[128], exp[128];
            lj_shape_text(t->shape, 4, ", ", got, sizeof got);
            lj_shape_text(want_rest, 3, ", ", exp, sizeof exp);
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: %s is %s; the pool makes its states %s (H, R, C)", fn, name, got,
                            exp);
        }
    }
    return LAJIT_OK;
}

/* Checked mode: every slot is −1, s or LAJIT_SLOT_FRESH(s) with s in [0, P); a scatter names no
 * slot twice. Read back on the stream (the host waits: checked mode only). */
static lajit_status check_slots(lajit_ctx *ctx, const char *fn, const DLTensor *slots, long long n,
                                long long P, int scatter, void *stream)
{
    lj_env *env = &ctx->env;
    lajit_status st;
    if (slots->device.device_type != kDLCUDA && slots->device.device_type != kDLCUDAManaged)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: slots is not CUDA memory (device_type %d)", fn,
                        (int)slots->device.device_type);
    if ((st = lj_tensor_check_device(env, "slots", slots, ctx->ordinal)) != LAJIT_OK)
        return st;
    lj_device *dev;
    if ((st = lajit__ctx_device(ctx, &dev)) != LAJIT_OK ||
        (st = lj_device_make_current(env, dev)) != LAJIT_OK)
        return st;
    long long step = n > 1 ? (slots->strides ? slots->strides[0] : 1) : 0, last;
    if (step < 0 || __builtin_mul_overflow(n - 1, step, &last) || last >= (1LL << 28))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: slots' stride is negative or reaches too far to be read back", fn);
    size_t count = (size_t)last + 1;
    /* The values, then (scatter) one byte per pool slot for "named already". */
    size_t marks = scatter ? (size_t)P : 0;
    unsigned char *buf = lj_malloc(env, count * 4 + marks);
    if (!buf)
        return lj_oom(env);
    memset(buf + count * 4, 0, marks);
    const lj_driver *drv = dev->drv;
    CUdeviceptr at = (CUdeviceptr)lj_tensor_address(slots);
    CUresult r = LJ_CU(env, drv, cuMemcpyDtoHAsync, buf, at, count * 4, (CUstream)stream);
    if (r == CUDA_SUCCESS)
        r = LJ_CU(env, drv, cuStreamSynchronize, (CUstream)stream);
    st = r == CUDA_SUCCESS ? LAJIT_OK : lj_driver_error(env, drv, r, "checked mode read-back");
    for (long long i = 0; st == LAJIT_OK && i < n; i++) {
        int32_t x;
        memcpy(&x, buf + (size_t)(i * step) * 4, 4);
        if (x == LAJIT_SLOT_SKIP)
            continue;
        long long s = LAJIT_SLOT_IS_FRESH(x) ? LAJIT_SLOT_FRESH_SLOT((long long)x) : x;
        if (s >= P)
            st = lj_error(env, LAJIT_ERR_CHECK_FAILED,
                          "%s: slots[%lld] = %d names slot %lld; the pool holds %lld (slots are "
                          "-1, s or LAJIT_SLOT_FRESH(s) = -2 - s with s in [0, P))",
                          fn, i, (int)x, s, P);
        else if (scatter && buf[count * 4 + (size_t)s]++)
            st = lj_error(env, LAJIT_ERR_CHECK_FAILED,
                          "%s: slots[%lld] = %d names slot %lld again; a scatter writes each slot "
                          "at most once",
                          fn, i, (int)x, s);
    }
    lj_free(env, buf);
    return st;
}

/* Both directions: the checks, then one launch of la_state_pool. */
static lajit_status pool_copy(lajit_ctx *ctx, const char *fn, const DLTensor *pool,
                              const DLTensor *slots, const DLTensor *states, int scatter,
                              int fresh_mode, void *stream)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lj_env *env = &ctx->env;
    const char *batch = scatter ? "src" : "dst";
    if (!pool || !slots || !states)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: pool, slots and %s are required", fn,
                        batch);
    lajit_status st;
    if ((st = check_states(env, fn, "pool", pool, NULL)) != LAJIT_OK)
        return st;
    const int64_t *ps = pool->shape;
    for (int i = 0; i < 4; i++) {
        static const char *const dims[4] = {"P", "H", "R", "C"};
        if (ps[i] < 1)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: pool [P, H, R, C] has %s = %lld; every size must be at least 1",
                            fn, dims[i], (long long)ps[i]);
    }
    if ((st = check_states(env, fn, batch, states, ps + 1)) != LAJIT_OK)
        return st;
    const long long n = states->shape[0];
    lj_elem se;
    if (!lj_tensor_elem(slots->dtype, &se) || se != LJ_ELEM_I32 || !slots->shape ||
        slots->ndim != 1 || slots->shape[0] != n) {
        char got[128] = "no shape";
        if (slots->shape)
            lj_shape_text(slots->shape, slots->ndim, ", ", got, sizeof got);
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: slots is %s %s; expected int32 [n] = [%lld] (one per state of %s)", fn,
                        lj_tensor_dtype_name(slots->dtype), got, n, batch);
    }
    if (n < 0)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: %s has n = %lld states", fn, batch,
                        n);
    if (n == 0)
        return LAJIT_OK; /* nothing to copy (the declaration wants sizes of at least 1) */
    if ((ctx->flags & LAJIT_CTX_CHECKED) &&
        (st = check_slots(ctx, fn, slots, n, ps[0], scatter, stream)) != LAJIT_OK)
        return st;

    /* The declaration's names (templates/la_state_pool/family.lua). */
    const lajit_tensor_arg t[3] = {{"pool", pool}, {"slots", slots}, {"states", states}};
    const lajit_scalar_arg sc[2] = {{"scatter", scatter ? 1.0 : 0.0},
                                    {"fresh_mode", (double)fresh_mode}};
    lajit_launch_args la;
    memset(&la, 0, sizeof la);
    la.struct_size = sizeof la;
    la.family = "la_state_pool";
    la.tensors = t;
    la.n_tensors = 3;
    la.scalars = sc;
    la.n_scalars = 2;
    la.dtype = "f32";
    la.stream = stream;
    return lajit_launch(ctx, &la);
}

lajit_status lj_state_pool_gather(lajit_ctx *ctx, const DLTensor *pool, const DLTensor *slots,
                                  DLTensor *dst, int fresh_reads, void *stream)
{
    return pool_copy(ctx, "lj_state_pool_gather", pool, slots, dst, 0, fresh_reads ? 1 : -1,
                     stream);
}

lajit_status lj_state_pool_scatter(lajit_ctx *ctx, const DLTensor *src, const DLTensor *slots,
                                   DLTensor *pool, int fresh_writes, void *stream)
{
    return pool_copy(ctx, "lj_state_pool_scatter", pool, slots, src, 1, fresh_writes ? -1 : 0,
                     stream);
}
