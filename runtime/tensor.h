/* tensor.h — validation of the DLPack tensors every op receives, and their translation into the
 * kernels' la_tensor4 (a device address and element strides).
 *
 * A tensor that passes lj_tensor_view is safe for every kernel: it lives in CUDA memory, has
 * a supported dtype and the expected shape with no zero dimension, its rows are contiguous
 * (unit last stride), its address and every other stride are multiples of 16 bytes (kernels
 * use 16-byte vector accesses), no stride is negative or zero, every size is at most
 * 2^31 - 2^16 (sizes reach kernels as int), every element offset fits in a signed 64-bit integer (kernels index
 * with 64-bit bases: a tensor may span 2^31 elements or more), and neither data + byte_offset
 * nor the view's end wraps past 2^64. Anything else is LAJIT_ERR_INVALID_ARGUMENT
 * with a message naming the tensor and the problem. Nothing here touches the device or
 * allocates; all functions are thread-safe apart from writing env's message. */
#ifndef LAJIT_TENSOR_H
#define LAJIT_TENSOR_H

#include "core.h"
#include "family.h"
#include "la_params.h"

/* dtype masks: bit (1u << dt) accepts lj_dtype dt; LJ_TENSOR_INT32 accepts int32 (indices:
 * cu_seqlens, slots). */
#define LJ_TENSOR_F32    (1u << LJ_F32)
#define LJ_TENSOR_F16    (1u << LJ_F16)
#define LJ_TENSOR_BF16   (1u << LJ_BF16)
#define LJ_TENSOR_FLOATS (LJ_TENSOR_F32 | LJ_TENSOR_F16 | LJ_TENSOR_BF16)
#define LJ_TENSOR_INT32  (1u << 8)

/* The alignment every tensor's address and non-last strides must have, in bytes. */
#define LJ_TENSOR_ALIGN 16
/* Every size is at most this: sizes reach kernels as int (la_params), and the chunk kernels
 * round a sequence up to whole chunks (n + BLOCK - 1) in int. No tensor near it fits on a
 * device anyway (2^31 tokens of 16 values are 64 GiB). Element offsets have no limit below 2^63. */
#define LJ_TENSOR_MAX_SIZE ((1LL << 31) - (1LL << 16))

/* Validates t as a tensor of ndim (1..4) dimensions.
 *   name        the argument's name for messages ("q", "final_state").
 *   t           NULL is an error ("q is required"): callers test optional tensors first.
 *   shape       NULL: any shape. Otherwise ndim entries; an entry >= 0 must equal the tensor's
 *               size, -1 accepts any size. On success every entry is overwritten with the
 *               tensor's actual size, so a caller learns sizes from the first tensor and
 *               imposes them on the next.
 *   dtype_mask  the accepted dtypes (LJ_TENSOR_* bits).
 *   out         receives the device address (data + byte_offset) and the element strides,
 *               right-aligned: dimension i of an n-dimensional tensor goes to stride
 *               s[4 - n + i] and the 4 - n leading strides are 0. So [B,H,N,D] fills s0..s3,
 *               [T,H,D] fills s1 = T's, s2 = H's, s3 = D's stride with s0 = 0, and [H] fills
 *               s3 = 1. The stride of a dimension of size 1 is never used to address memory:
 *               it is reported as 0 (1 for the last dimension), whatever the tensor says.
 *   dtype_out   NULL, or receives the tensor's lj_dtype (not written for int32).
 * Outputs are written only on success. Returns LAJIT_OK or LAJIT_ERR_INVALID_ARGUMENT (with
 * a message in env), or LAJIT_ERR_INTERNAL for an ndim outside 1..4. */
lajit_status lj_tensor_view(lj_env *env, const char *name, const DLTensor *t, int ndim,
                            int64_t *shape, unsigned dtype_mask, la_tensor4 *out,
                            lj_dtype *dtype_out);

/* Kernels that walk a small tile of a tensor (decode's T steps of one row, each one of D or E
 * values) address it with 32-bit offsets from a 64-bit base: the offsets the tile spans,
 * (rows - 1) * row_stride + (cols - 1) * col_stride, must stay below 2^31. Real layouts are far
 * inside (a step row of a packed [B, T, H, 3D] buffer is 3HD apart); a view whose tile spans
 * more is refused with a message naming `what` ("one row's T steps"). Strides as lj_tensor_view
 * returned them (non-negative); sizes at least 1. */
lajit_status lj_tensor_tile_span(lj_env *env, const char *name, const char *what, int64_t rows,
                                 int64_t row_stride, int64_t cols, int64_t col_stride);

/* A shape for messages: "[2,3,4,64]" with sep ",", or "[2, 3, 4, 64]" with ", "; entries below
 * 0 print as "*" (a size left free). */
void lj_shape_text(const int64_t *shape, int ndim, const char *sep, char *out, size_t cap);

/* The following take tensors already accepted by lj_tensor_view. */

/* t must be on CUDA device `ordinal` (the context's): "q is on CUDA device 1, but the context
 * uses device 0". */
lajit_status lj_tensor_check_device(lj_env *env, const char *name, const DLTensor *t, int ordinal);

/* a and b must be on the same CUDA device. */
lajit_status lj_tensor_same_device(lj_env *env, const char *a_name, const DLTensor *a,
                                   const char *b_name, const DLTensor *b);

/* 1 when a and b are the same view of the same memory: same address (data + byte_offset),
 * dtype, shape and strides (NULL strides and explicit compact strides compare equal, strides
 * of size-1 dimensions are ignored). Such aliasing is allowed where the API says so (S_N may
 * be S_0). */
int lj_tensor_same_memory(const DLTensor *a, const DLTensor *b);

/* An output's elements must be distinct memory: a view where two indices reach the same
 * element (e.g. shape [4, 64] with strides [16, 1]) would make the kernels race. Checked
 * conservatively: ordered by stride, each dimension must step past the whole extent of the
 * smaller ones. */
lajit_status lj_tensor_check_writable(lj_env *env, const char *name, const DLTensor *t);

/* The element type of dt as a custom family declares them (lj_elem: f32, f16, bf16, i32, i64);
 * 0 for any other. */
int lj_tensor_elem(DLDataType dt, lj_elem *out);
/* "float32", "float16", "bfloat16", "int32", "int64", or "unsupported". */
const char *lj_tensor_dtype_name(DLDataType dt);

/* 1 when t's elements are contiguous in row-major order from its first (NULL strides, or strides
 * that match; dimensions of size 1 may have any stride): one memcpy of its bytes moves it. */
int lj_tensor_compact(const DLTensor *t);

/* The address of t's first element (data + byte_offset). */
uint64_t lj_tensor_address(const DLTensor *t);

/* *t made a view of device memory at addr on CUDA device `ordinal`: ndim sizes, strides in
 * elements (NULL: compact), dtype. shape and strides stay the caller's arrays and must outlive
 * t (the runtime's own views of its buffers, handed to the public ops). Returns t. */
DLTensor *lj_device_view(DLTensor *t, uint64_t addr, int ordinal, int ndim, int64_t *shape,
                         int64_t *strides, DLDataType dtype);

/* Batch row b of t [B, H, N, W] (any strides) as n segments of len tokens from token `from`,
 * each after the one before: an [n, H, len, W] view into out, shape and strides in the caller's
 * arrays (n = 1, from = 0, len = N: the row alone). NULL stays NULL. Returns out. */
const DLTensor *lj_tensor_segments(DLTensor *out, int64_t shape[4], int64_t strides[4],
                                   const DLTensor *t, int64_t b, int64_t from, int64_t len,
                                   int64_t n);

#endif
