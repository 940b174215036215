/* scan_op.c — lajit_attn_state_scan: the scan over a sequence's spans that context parallelism
 * exchanges (include/lajit.h has the mathematics). The call is checked here in the op's own terms
 * (which tensor, which layout, what was expected), then launched through lajit_launch on the
 * built-in custom family la_state_scan (templates/la_state_scan), whose declaration the call's
 * tensors are mapped onto:
 *
 *   local_states, incoming_states  [P, B, H, R, C]   R, C = D, E (or E, D with LAJIT_STATE_VK:
 *   initial_state, final_state     [B, H, R, C]      the scan is elementwise, so it is the same
 *                                                     kernel; only these messages say D or E)
 *   lengths                        int32 -> "lengths", int64 -> "lengths64", as [P, LB]: a [P]
 *                                  tensor becomes a [P, 1] view, a [P, B] one passes as it is
 *   s                              "s" (absent: no decay)
 *   LAJIT_SCAN_REVERSE             the scalar "reverse"
 *
 * The hot path is lajit_launch's (a plan-table probe and one cuLaunchKernel: no allocation, no
 * Lua, no synchronisation, graph-capturable); the views made here live on the stack. Checked
 * mode reads s and the lengths back before the launch. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "op_args.h"

#define FN "lajit_attn_state_scan"

static int is_f32(const DLTensor *t)
{
    lj_elem e;
    return lj_tensor_elem(t->dtype, &e) && e == LJ_ELEM_F32;
}

/* "[P, B, H, D, E]" or "[B, H, E, D]" for messages: the layout a state argument must have. */
static const char *layout(int spans, int vk)
{
    if (spans)
        return vk ? "[P, B, H, E, D]" : "[P, B, H, D, E]";
    return vk ? "[B, H, E, D]" : "[B, H, D, E]";
}

/* "[8, 2, 3, 64, 32]" into out. */
static void shape_text(const DLTensor *t, char *out, size_t cap)
{
    lj_shape_text(t->shape, t->ndim, ", ", out, cap);
}

/* A state argument: float32, the layout's rank, and (when want is not NULL) want's sizes. */
static lajit_status check_state(lj_env *env, const char *name, const DLTensor *t, int spans, int vk,
                                const int64_t *want)
{
    int rank = spans ? 5 : 4;
    if (!t->shape || t->ndim != rank)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, FN ": %s must be %s; it has %d dimensions",
                        name, layout(spans, vk), t->shape ? t->ndim : 0);
    if (!is_f32(t))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        FN ": %s is %s; the scan's states are float32", name,
                        lj_tensor_dtype_name(t->dtype));
    for (int i = 0; want && i < rank; i++) {
        if (t->shape[i] != want[i]) {
            char got[128], exp[128];
            DLTensor w = *t;
            w.shape = (int64_t *)want;
            shape_text(t, got, sizeof got);
            shape_text(&w, exp, sizeof exp);
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            FN ": %s is %s; local_states makes it %s %s", name, got, exp,
                            layout(spans, vk));
        }
    }
    return LAJIT_OK;
}

/* Checked mode reads t back: it must be CUDA memory of the context's device. */
static lajit_status on_device(lajit_ctx *ctx, const char *name, const DLTensor *t)
{
    if (t->device.device_type != kDLCUDA && t->device.device_type != kDLCUDAManaged)
        return lj_error(&ctx->env, LAJIT_ERR_INVALID_ARGUMENT,
                        FN ": %s is not CUDA memory (device_type %d)", name,
                        (int)t->device.device_type);
    return lj_tensor_check_device(&ctx->env, name, t, ctx->ordinal);
}

/* Checked mode: s finite and >= 0 (op_args.c's check), every length >= 0 or -1 (a span that
 * starts a new sequence), read back here, the whole extent of the [P, LB] view at once. */
static lajit_status check_values(lajit_ctx *ctx, const DLTensor *s, long long H,
                                 const DLTensor *len, void *stream)
{
    lj_env *env = &ctx->env;
    lajit_status st;
    if (s) {
        la_params lp;
        memset(&lp, 0, sizeof lp);
        lp.decay = lj_tensor_address(s);
        lp.H = (int)H;
        if ((st = lj_check_device_values(ctx, &lp, 0, 0, stream)) != LAJIT_OK)
            return st;
    }
    lj_device *dev;
    if ((st = lajit__ctx_device(ctx, &dev)) != LAJIT_OK ||
        (st = lj_device_make_current(env, dev)) != LAJIT_OK)
        return st;
    const int wide = len->dtype.bits == 64;
    const size_t es = wide ? 8 : 4;
    long long P = len->shape[0], LB = len->shape[1];
    long long s0 = P > 1 ? (len->strides ? len->strides[0] : LB) : 0;
    long long s1 = LB > 1 ? (len->strides ? len->strides[1] : 1) : 0;
    long long a0, a1, last;
    if (s0 < 0 || s1 < 0 || __builtin_mul_overflow(P - 1, s0, &a0) ||
        __builtin_mul_overflow(LB - 1, s1, &a1) || __builtin_add_overflow(a0, a1, &last) ||
        last >= (1LL << 28))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        FN ": lengths' strides are negative or reach too far to be read back");
    size_t count = (size_t)last + 1;
    unsigned char *buf = lj_malloc(env, count * es);
    if (!buf)
        return lj_oom(env);
    const lj_driver *drv = dev->drv;
    CUdeviceptr at = (CUdeviceptr)lj_tensor_address(len);
    CUresult r = LJ_CU(env, drv, cuMemcpyDtoHAsync, buf, at, count * es, (CUstream)stream);
    if (r == CUDA_SUCCESS)
        r = LJ_CU(env, drv, cuStreamSynchronize, (CUstream)stream);
    st = r == CUDA_SUCCESS ? LAJIT_OK : lj_driver_error(env, drv, r, "checked mode read-back");
    for (long long j = 0; st == LAJIT_OK && j < P; j++) {
        for (long long b = 0; st == LAJIT_OK && b < LB; b++) {
            size_t i = (size_t)(j * s0 + b * s1);
            long long n;
            if (wide) {
                int64_t v;
                memcpy(&v, buf + i * 8, 8);
                n = v;
            } else {
                int32_t v;
                memcpy(&v, buf + i * 4, 4);
                n = v;
            }
            if (n < -1 && LB > 1)
                st = lj_error(env, LAJIT_ERR_CHECK_FAILED,
                              FN ": lengths[%lld, %lld] = %lld: span lengths must be >= 0, or -1 "
                                 "(a span starting a new sequence)",
                              j, b, n);
            else if (n < -1)
                st = lj_error(env, LAJIT_ERR_CHECK_FAILED,
                              FN ": lengths[%lld] = %lld: span lengths must be >= 0, or -1 (a "
                                 "span starting a new sequence)",
                              j, n);
        }
    }
    lj_free(env, buf);
    return st;
}

LAJIT_API lajit_status lajit_attn_state_scan(lajit_ctx *ctx, const lajit_attn_state_scan_args *a)
{
    return lj_state_scan(ctx, a, NULL);
}

lajit_status lj_sum_rows(lajit_ctx *ctx, CUdeviceptr rows, int64_t n, int64_t w,
                         CUdeviceptr scratch, CUdeviceptr zeros, CUdeviceptr sum, void *stream)
{
    const DLDataType f32 = {kDLFloat, 32, 1}, i64 = {kDLInt, 64, 1};
    int64_t rows_shape[5] = {n, 1, 1, 1, w}, sum_shape[4] = {1, 1, 1, w}, len_shape[1] = {n};
    DLTensor local, incoming, total, lengths;
    lj_device_view(&local, rows, ctx->ordinal, 5, rows_shape, NULL, f32);
    lj_device_view(&incoming, scratch, ctx->ordinal, 5, rows_shape, NULL, f32);
    lj_device_view(&total, sum, ctx->ordinal, 4, sum_shape, NULL, f32);
    lj_device_view(&lengths, zeros, ctx->ordinal, 1, len_shape, NULL, i64);
    /* Zero lengths of their own: the scan reads lengths even without s (a −1 would restart the
     * sum), so they cannot be any bytes. */
    lj_device *dev;
    lajit_status st = lajit__ctx_device(ctx, &dev);
    if (st != LAJIT_OK)
        return st;
    CUresult cr =
        LJ_CU(&ctx->env, dev->drv, cuMemsetD32Async, zeros, 0u, 2 * (size_t)n, (CUstream)stream);
    if (cr != CUDA_SUCCESS)
        return lj_driver_error(&ctx->env, dev->drv, cr, "cuMemsetD32Async (the sum's lengths)");
    lajit_attn_state_scan_args sc;
    memset(&sc, 0, sizeof sc);
    sc.struct_size = sizeof sc;
    sc.local_states = &local;
    sc.lengths = &lengths;
    sc.incoming_states = &incoming;
    sc.final_state = &total;
    sc.stream = stream;
    return lj_state_scan(ctx, &sc, NULL);
}

lajit_status lj_state_scan(lajit_ctx *ctx, const lajit_attn_state_scan_args *a,
                           DLTensor *total_lengths)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lj_env *env = &ctx->env;
    if (!a)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, FN ": args is NULL");
    if (a->struct_size != sizeof *a)
        return lj_error(env, LAJIT_ERR_STRUCT_SIZE, FN ": struct_size %zu, this build knows %zu",
                        a->struct_size, sizeof *a);
    if (a->flags & ~(LAJIT_STATE_VK | LAJIT_SCAN_REVERSE))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        FN ": unknown flags 0x%x (LAJIT_STATE_VK and LAJIT_SCAN_REVERSE are taken)",
                        a->flags);
    if (!a->local_states || !a->lengths || !a->incoming_states)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        FN ": local_states, lengths and incoming_states are required");
    const int vk = (a->flags & LAJIT_STATE_VK) != 0;
    lajit_status st;

    /* local_states fixes P, B, H and the state's two sizes; every other tensor follows it. */
    if ((st = check_state(env, "local_states", a->local_states, 1, vk, NULL)) != LAJIT_OK)
        return st;
    const int64_t *ls = a->local_states->shape;
    static const char *const dims[5] = {"P (spans)", "B", "H", "D", "E"};
    for (int i = 0; i < 5; i++) {
        if (ls[i] < 1) {
            const char *d = dims[i < 3 || !vk ? i : 7 - i]; /* VK: dimension 3 is E, 4 is D */
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            FN ": local_states %s has %s = %lld; every size must be at least 1",
                            layout(1, vk), d, (long long)ls[i]);
        }
    }
    const long long P = ls[0], B = ls[1], H = ls[2];
    if ((st = check_state(env, "incoming_states", a->incoming_states, 1, vk, ls)) != LAJIT_OK)
        return st;
    if (a->initial_state &&
        (st = check_state(env, "initial_state", a->initial_state, 0, vk, ls + 1)) != LAJIT_OK)
        return st;
    if (a->final_state &&
        (st = check_state(env, "final_state", a->final_state, 0, vk, ls + 1)) != LAJIT_OK)
        return st;

    /* Lengths: int32 or int64, [P] (every row) or [P, B] (per row), any strides. */
    const DLTensor *len = a->lengths;
    lj_elem le;
    if (!lj_tensor_elem(len->dtype, &le) || (le != LJ_ELEM_I32 && le != LJ_ELEM_I64))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        FN ": lengths is %s; span lengths are int32 or int64",
                        lj_tensor_dtype_name(len->dtype));
    if (!len->shape || (len->ndim != 1 && len->ndim != 2) || len->shape[0] != P ||
        (len->ndim == 2 && len->shape[1] != B)) {
        char got[128] = "no shape";
        if (len->shape)
            shape_text(len, got, sizeof got);
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        FN ": lengths is %s; expected [P] = [%lld] or [P, B] = [%lld, %lld] (a "
                           "[B, P] buffer passes as its transposed view)",
                        got, P, P, B);
    }
    int64_t len_shape[2] = {P, 1}, len_strides[2] = {1, 1};
    DLTensor len2 = *len;
    if (len->ndim == 1) {
        len_strides[0] = len->strides ? len->strides[0] : 1;
        len2.ndim = 2;
        len2.shape = len_shape;
        len2.strides = len_strides;
    }
    if (a->s) {
        if (!is_f32(a->s) || !a->s->shape || a->s->ndim != 1 || a->s->shape[0] != H ||
            (H > 1 && a->s->strides && a->s->strides[0] != 1)) {
            char got[128] = "no shape";
            if (a->s->shape)
                shape_text(a->s, got, sizeof got);
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            FN ": s is %s %s; expected float32 [H] = [%lld], contiguous",
                            lj_tensor_dtype_name(a->s->dtype), got, H);
        }
    }

    /* The declaration's names (templates/la_state_scan/family.lua); what it checks on top of the
     * above (CUDA memory on this device, alignment, strides, extents, outputs sharing no element
     * with anything else) comes back with the family's name. */
    if (total_lengths) {
        lj_elem te;
        const int64_t rows = len->ndim == 2 ? B : 1;
        if (!lj_tensor_elem(total_lengths->dtype, &te) || te != LJ_ELEM_I64 ||
            !total_lengths->shape || total_lengths->ndim != 1 || total_lengths->shape[0] != rows)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            FN ": total_lengths must be int64 [%lld] (one per lengths row)",
                            (long long)rows);
    }
    lajit_tensor_arg t[8];
    size_t n = 0;
    t[n++] = (lajit_tensor_arg){"local_states", a->local_states};
    t[n++] = (lajit_tensor_arg){le == LJ_ELEM_I64 ? "lengths64" : "lengths", &len2};
    if (a->s)
        t[n++] = (lajit_tensor_arg){"s", a->s};
    if (a->initial_state)
        t[n++] = (lajit_tensor_arg){"initial_state", a->initial_state};
    t[n++] = (lajit_tensor_arg){"incoming_states", a->incoming_states};
    if (a->final_state)
        t[n++] = (lajit_tensor_arg){"final_state", a->final_state};
    if (total_lengths)
        t[n++] = (lajit_tensor_arg){"total_lengths64", total_lengths};
    const lajit_scalar_arg reverse = {"reverse", (a->flags & LAJIT_SCAN_REVERSE) ? 1.0 : 0.0};
    lajit_launch_args la;
    memset(&la, 0, sizeof la);
    la.struct_size = sizeof la;
    la.family = a->family ? a->family : "la_state_scan";
    la.tensors = t;
    la.n_tensors = n;
    la.scalars = &reverse;
    la.n_scalars = 1;
    la.dtype = "f32";
    la.stream = a->stream;
    if (ctx->flags & LAJIT_CTX_CHECKED) {
        /* Read back only CUDA memory of this device (the launch checks the rest after). */
        if ((st = on_device(ctx, "lengths", len)) != LAJIT_OK ||
            (a->s && (st = on_device(ctx, "s", a->s)) != LAJIT_OK) ||
            (st = check_values(ctx, a->s, H, &len2, a->stream)) != LAJIT_OK)
            return st;
    }
    return lajit_launch(ctx, &la);
}
