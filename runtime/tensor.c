/* tensor.c — DLTensor validation (see tensor.h for the contract).
 *
 * Checks run in a fixed order (presence, rank, data pointer, memory kind, dtype, sizes,
 * shape, strides, address wrap, alignment, offset range, extent wrap) so a tensor with several
 * problems always reports the same first one.
 *
 * Offsets are 64-bit: the kernels form their per-sequence, per-head and per-chunk bases in
 * 64-bit arithmetic, so a tensor may span any number of elements the device can hold. What is
 * refused is what no 64-bit arithmetic could serve (an offset past 2^63, a view whose bytes run
 * past the end of the address space) and sizes that do not fit the kernels' int fields. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tensor.h"

/* The tensor's layout after normalisation: address, element size, and strides with those of
 * size-1 dimensions replaced (0, or 1 for the last) so equal views compare equal. */
/* Up to 5 dimensions: decode's step_states [B,T,H,D,E] is checked through these too. */
#define MAX_DIMS 5

typedef struct layout {
    uint64_t ptr;
    int64_t stride[MAX_DIMS];
    int64_t max_offset; /* largest element offset, in elements */
    int elsize;         /* bytes */
} layout;

enum { DT_NONE = -1, DT_INT32 = 8 };

/* The lj_dtype of dt (LJ_F32, LJ_F16, LJ_BF16), DT_INT32, or DT_NONE. */
static int classify(DLDataType dt)
{
    if (dt.lanes != 1)
        return DT_NONE;
    if (dt.code == kDLFloat && dt.bits == 32)
        return LJ_F32;
    if (dt.code == kDLFloat && dt.bits == 16)
        return LJ_F16;
    if (dt.code == kDLBfloat && dt.bits == 16)
        return LJ_BF16;
    if (dt.code == kDLInt && dt.bits == 32)
        return DT_INT32;
    return DT_NONE;
}

const char *lj_tensor_dtype_name(DLDataType dt)
{
    switch (classify(dt)) {
        case LJ_F32: return "float32";
        case LJ_F16: return "float16";
        case LJ_BF16: return "bfloat16";
        case DT_INT32: return "int32";
    }
    if (dt.lanes == 1 && dt.code == kDLInt && dt.bits == 64)
        return "int64";
    return "unsupported";
}

int lj_tensor_elem(DLDataType dt, lj_elem *out)
{
    int c = classify(dt);
    if (c == LJ_F32 || c == LJ_F16 || c == LJ_BF16)
        *out = (lj_elem)c; /* lj_elem's float values are lj_dtype's */
    else if (c == DT_INT32)
        *out = LJ_ELEM_I32;
    else if (dt.lanes == 1 && dt.code == kDLInt && dt.bits == 64)
        *out = LJ_ELEM_I64;
    else
        return 0;
    return 1;
}

/* "float32 or bfloat16" for a mask. */
static void mask_text(unsigned mask, char *out, size_t cap)
{
    static const struct {
        unsigned bit;
        const char *name;
    } names[] = {{LJ_TENSOR_F32, "float32"},
                 {LJ_TENSOR_F16, "float16"},
                 {LJ_TENSOR_BF16, "bfloat16"},
                 {LJ_TENSOR_INT32, "int32"}};
    int n = 0, total = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        total += (mask & names[i].bit) != 0;
    size_t len = 0;
    out[0] = '\0';
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!(mask & names[i].bit))
            continue;
        const char *sep = n == 0 ? "" : n == total - 1 ? " or " : ", ";
        int w = snprintf(out + len, cap - len, "%s%s", sep, names[i].name);
        if (w < 0 || (size_t)w >= cap - len)
            return;
        len += (size_t)w;
        n++;
    }
    if (total == 0)
        snprintf(out, cap, "nothing");
}

void lj_shape_text(const int64_t *shape, int ndim, const char *sep, char *out, size_t cap)
{
    size_t len = 0;
    int w = snprintf(out, cap, "[");
    len = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < ndim && len < cap; i++) {
        if (shape[i] < 0)
            w = snprintf(out + len, cap - len, "%s*", i ? sep : "");
        else
            w = snprintf(out + len, cap - len, "%s%lld", i ? sep : "", (long long)shape[i]);
        if (w < 0)
            return;
        len += (size_t)w;
    }
    if (len < cap)
        snprintf(out + len, cap - len, "]");
}

/* Strides as the tensor gives them (compact row-major when NULL), normalised for size-1
 * dimensions. Assumes ndim in 1..MAX_DIMS and positive sizes. Returns 0 when the compact strides
 * overflow 64 bits. */
static int strides_of(const DLTensor *t, int64_t stride[MAX_DIMS])
{
    int n = t->ndim;
    int64_t compact = 1;
    for (int i = n - 1; i >= 0; i--) {
        stride[i] = t->strides ? t->strides[i] : compact;
        if (t->shape[i] == 1)
            stride[i] = i == n - 1 ? 1 : 0;
        if (i > 0 && __builtin_mul_overflow(compact, t->shape[i], &compact))
            return 0;
    }
    return 1;
}

/* The layout of a tensor lj_tensor_view accepted. */
static void layout_of(const DLTensor *t, layout *l)
{
    memset(l, 0, sizeof *l);
    l->ptr = (uint64_t)(uintptr_t)t->data + t->byte_offset;
    l->elsize = (t->dtype.bits * t->dtype.lanes + 7) / 8;
    strides_of(t, l->stride);
    for (int i = 0; i < t->ndim; i++)
        l->max_offset += (t->shape[i] - 1) * l->stride[i];
}

static const char *device_text(DLDeviceType type)
{
    switch (type) {
        case kDLCPU: return "host memory (kDLCPU)";
        case kDLCUDAHost: return "pinned host memory (kDLCUDAHost)";
        case kDLROCM: return "ROCm memory (kDLROCM)";
        default: return "non-CUDA memory";
    }
}

lajit_status lj_tensor_view(lj_env *env, const char *name, const DLTensor *t, int ndim,
                            int64_t *shape, unsigned dtype_mask, la_tensor4 *out,
                            lj_dtype *dtype_out)
{
    if (ndim < 1 || ndim > 4)
        return lj_error(env, LAJIT_ERR_INTERNAL, "lj_tensor_view(%s): ndim %d is not 1..4", name,
                        ndim);
    if (!t)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s is required (got NULL)", name);
    if (t->ndim != ndim)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s has %d dimension%s, expected %d", name,
                        t->ndim, t->ndim == 1 ? "" : "s", ndim);
    if (!t->shape)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s has no shape (NULL)", name);
    if (!t->data)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s has a NULL data pointer", name);
    if (t->device.device_type != kDLCUDA && t->device.device_type != kDLCUDAManaged)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s is in %s, not CUDA device memory (device_type %d; kDLCUDA or "
                        "kDLCUDAManaged expected)",
                        name, device_text(t->device.device_type), (int)t->device.device_type);

    char want[64];
    int dt = classify(t->dtype);
    unsigned bit = dt == DT_NONE ? 0 : 1u << dt;
    if (!(bit & dtype_mask)) {
        mask_text(dtype_mask, want, sizeof want);
        if (dt == DT_NONE)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s has an unsupported dtype (code %u, bits %u, lanes %u); expected %s",
                            name, (unsigned)t->dtype.code, (unsigned)t->dtype.bits,
                            (unsigned)t->dtype.lanes, want);
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s is %s; expected %s", name,
                        lj_tensor_dtype_name(t->dtype), want);
    }

    char got[96];
    for (int i = 0; i < ndim; i++) {
        if (t->shape[i] <= 0) {
            lj_shape_text(t->shape, ndim, ",", got, sizeof got);
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s has a %s dimension: %s %s", name,
                            t->shape[i] == 0 ? "zero" : "negative", name, got);
        }
        /* Sizes reach the kernels as int (la_params: B, H, N, P, ...) with room for a chunk's
         * rounding; offsets are 64-bit. */
        if (t->shape[i] > LJ_TENSOR_MAX_SIZE) {
            lj_shape_text(t->shape, ndim, ",", got, sizeof got);
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s's dimension %d has %lld elements: each size must be at most "
                            "2^31 - 2^16 (%s %s)",
                            name, i, (long long)t->shape[i], name, got);
        }
    }
    if (shape) {
        for (int i = 0; i < ndim; i++) {
            if (shape[i] >= 0 && shape[i] != t->shape[i]) {
                lj_shape_text(t->shape, ndim, ",", got, sizeof got);
                char exp[96];
                lj_shape_text(shape, ndim, ",", exp, sizeof exp);
                return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                                "%s is %s, expected %s (dimension %d differs)", name, got, exp, i);
            }
        }
    }

    int64_t stride[MAX_DIMS];
    if (!strides_of(t, stride)) {
        lj_shape_text(t->shape, ndim, ",", got, sizeof got);
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s's offsets overflow 64 bits: %s %s has more elements than a 64-bit "
                        "offset can count",
                        name, name, got);
    }
    for (int i = 0; i < ndim; i++) {
        if (stride[i] < 0)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s has a negative stride (%lld) in dimension %d; flip the data "
                            "instead",
                            name, (long long)stride[i], i);
    }
    if (stride[ndim - 1] != 1)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s has stride %lld in its last dimension; it must be 1 (rows "
                        "contiguous)",
                        name, (long long)stride[ndim - 1]);
    for (int i = 0; i < ndim - 1; i++) {
        if (stride[i] == 0 && t->shape[i] > 1)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s has stride 0 in dimension %d of size %lld (broadcast views are "
                            "not supported; materialise the tensor)",
                            name, i, (long long)t->shape[i]);
    }

    int elsize = t->dtype.bits / 8;
    /* data + byte_offset must be a real address: a sum that wraps past 2^64 would reach memory
     * below data (a view that points anywhere the caller's offset arithmetic went wrong). */
    uint64_t ptr;
    if (__builtin_add_overflow((uint64_t)(uintptr_t)t->data, t->byte_offset, &ptr))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s's address wraps: data 0x%llx + byte_offset %llu overflows 64 bits",
                        name, (unsigned long long)(uintptr_t)t->data,
                        (unsigned long long)t->byte_offset);
    if (ptr % LJ_TENSOR_ALIGN)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s is misaligned: its address 0x%llx (data + byte_offset %llu) is not a "
                        "multiple of %d bytes (kernels use 16-byte vector accesses)",
                        name, (unsigned long long)ptr, (unsigned long long)t->byte_offset,
                        LJ_TENSOR_ALIGN);
    for (int i = 0; i < ndim - 1; i++) {
        /* (stride * elsize) mod 16 without forming the product, which may overflow before
         * the offset check below rejects the tensor. */
        if ((stride[i] % LJ_TENSOR_ALIGN) * elsize % LJ_TENSOR_ALIGN)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s is misaligned: dimension %d has a stride of %lld elements of "
                            "%d bytes, not a multiple of %d bytes (kernels use 16-byte vector "
                            "accesses)",
                            name, i, (long long)stride[i], elsize, LJ_TENSOR_ALIGN);
    }

    /* The largest element offset, sum of (size - 1) * stride, must be a signed 64-bit value:
     * kernels compute it (and every smaller one) in long long. */
    int64_t max_offset = 0;
    for (int i = 0; i < ndim; i++) {
        int64_t term;
        if (__builtin_mul_overflow(t->shape[i] - 1, stride[i], &term) ||
            __builtin_add_overflow(max_offset, term, &max_offset) || max_offset == INT64_MAX) {
            lj_shape_text(t->shape, ndim, ",", got, sizeof got);
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s's offsets overflow 64 bits: %s %s with stride %lld in dimension "
                            "%d reaches an element offset of 2^63 - 1 or more",
                            name, name, got, (long long)stride[i], i);
        }
    }

    /* The view's end (one past its last byte) must be an address too: kernels add byte offsets
     * to the address and the overlap checks compute address + extent, neither of which may
     * wrap. max_offset + 1 cannot overflow (max_offset < INT64_MAX above); the bytes can. */
    uint64_t bytes, end;
    if (__builtin_mul_overflow((uint64_t)max_offset + 1, (uint64_t)elsize, &bytes) ||
        __builtin_add_overflow(ptr, bytes, &end))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s's extent wraps: %lld elements of %d bytes from address 0x%llx run "
                        "past the end of the 64-bit address space",
                        name, (long long)max_offset + 1, elsize, (unsigned long long)ptr);

    if (shape)
        for (int i = 0; i < ndim; i++)
            shape[i] = t->shape[i];
    if (dtype_out && dt != DT_INT32)
        *dtype_out = (lj_dtype)dt;
    int64_t s[4] = {0, 0, 0, 0};
    for (int i = 0; i < ndim; i++)
        s[4 - ndim + i] = stride[i];
    out->ptr = ptr;
    out->s0 = s[0];
    out->s1 = s[1];
    out->s2 = s[2];
    out->s3 = s[3];
    return LAJIT_OK;
}

lajit_status lj_tensor_tile_span(lj_env *env, const char *name, const char *what, int64_t rows,
                                 int64_t row_stride, int64_t cols, int64_t col_stride)
{
    int64_t a, b, span;
    if (__builtin_mul_overflow(rows - 1, row_stride, &a) ||
        __builtin_mul_overflow(cols - 1, col_stride, &b) || __builtin_add_overflow(a, b, &span) ||
        span >= (1LL << 31))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: %s (%lld x %lld with strides %lld, %lld) span 2^31 elements or more; "
                        "kernels address them with 32-bit offsets from a 64-bit base",
                        name, what, (long long)rows, (long long)cols, (long long)row_stride,
                        (long long)col_stride);
    return LAJIT_OK;
}

lajit_status lj_tensor_check_device(lj_env *env, const char *name, const DLTensor *t, int ordinal)
{
    if (t && t->device.device_id != ordinal)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s is on CUDA device %d, but the context uses device %d", name,
                        (int)t->device.device_id, ordinal);
    return LAJIT_OK;
}

lajit_status lj_tensor_same_device(lj_env *env, const char *a_name, const DLTensor *a,
                                   const char *b_name, const DLTensor *b)
{
    if (a && b && a->device.device_id != b->device.device_id)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s is on CUDA device %d, but %s is on device %d", b_name,
                        (int)b->device.device_id, a_name, (int)a->device.device_id);
    return LAJIT_OK;
}

int lj_tensor_same_memory(const DLTensor *a, const DLTensor *b)
{
    if (a == b)
        return 1;
    if (!a || !b || a->ndim != b->ndim || a->ndim < 1 || a->ndim > 4)
        return 0;
    if (a->dtype.code != b->dtype.code || a->dtype.bits != b->dtype.bits ||
        a->dtype.lanes != b->dtype.lanes || a->device.device_id != b->device.device_id)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    layout la, lb;
    layout_of(a, &la);
    layout_of(b, &lb);
    if (la.ptr != lb.ptr)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (la.stride[i] != lb.stride[i])
            return 0;
    return 1;
}

lajit_status lj_tensor_check_writable(lj_env *env, const char *name, const DLTensor *t)
{
    if (!t)
        return LAJIT_OK;
    layout l;
    layout_of(t, &l);
    /* Dimensions of size > 1 ordered by stride (insertion sort of at most MAX_DIMS). */
    int order[MAX_DIMS], n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 1)
            continue;
        int j = n++;
        while (j > 0 && l.stride[order[j - 1]] > l.stride[i]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    int64_t extent = 1; /* elements spanned by the dimensions so far */
    for (int k = 0; k < n; k++) {
        int i = order[k];
        if (l.stride[i] < extent)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s has overlapping elements: dimension %d's stride %lld is smaller "
                            "than the %lld elements spanned by its inner dimensions, so kernels "
                            "would write one element twice",
                            name, i, (long long)l.stride[i], (long long)extent);
        /* stride * size is one stride past the largest offset and may overflow, but only for
         * the dimension of the largest stride, whose extent nothing reads (a dimension after
         * it would put an offset past 2^63, which lj_tensor_view refused). */
        if (__builtin_mul_overflow(l.stride[i], t->shape[i], &extent))
            extent = INT64_MAX;
    }
    return LAJIT_OK;
}

int lj_tensor_compact(const DLTensor *t)
{
    if (!t->strides)
        return 1;
    int64_t want = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] > 1 && t->strides[d] != want)
            return 0;
        want *= t->shape[d];
    }
    return 1;
}

uint64_t lj_tensor_address(const DLTensor *t)
{
    return (uint64_t)(uintptr_t)t->data + t->byte_offset;
}

const DLTensor *lj_tensor_segments(DLTensor *out, int64_t shape[4], int64_t strides[4],
                                   const DLTensor *t, int64_t b, int64_t from, int64_t len,
                                   int64_t n)
{
    if (!t)
        return NULL;
    const int64_t *sh = t->shape;
    int64_t s[4] = {sh[1] * sh[2] * sh[3], sh[2] * sh[3], sh[3], 1};
    if (t->strides)
        memcpy(s, t->strides, sizeof s);
    *out = *t;
    shape[0] = n;
    shape[1] = sh[1];
    shape[2] = len;
    shape[3] = sh[3];
    strides[0] = len * s[2];
    strides[1] = s[1];
    strides[2] = s[2];
    strides[3] = s[3];
    out->shape = shape;
    out->strides = strides;
    out->byte_offset += (uint64_t)(b * s[0] + from * s[2]) * (uint64_t)(t->dtype.bits / 8);
    return out;
}

DLTensor *lj_device_view(DLTensor *t, uint64_t addr, int ordinal, int ndim, int64_t *shape,
                         int64_t *strides, DLDataType dtype)
{
    memset(t, 0, sizeof *t);
    t->data = (void *)(uintptr_t)addr;
    t->device = (DLDevice){kDLCUDA, ordinal};
    t->ndim = ndim;
    t->dtype = dtype;
    t->shape = shape;
    t->strides = strides;
    return t;
}
