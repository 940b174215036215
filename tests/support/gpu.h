/* gpu.h — helpers for gpu tests: the real driver through device/driver.h, device memory that
 * fails the test on any error, DLTensor views of device buffers, and host conversions between
 * float and the 16-bit storage types.
 *
 * A gpu test starts with lj_gpu_init(), which skips the case (exit 77) when the machine has no
 * driver or no device, and leaves device 0's primary context current on the calling thread.
 * Every other lj_gpu_* function needs that first. Not thread-safe (one test case per process).
 * The tensor builders and conversions need no device and may be used by cpu tests too. */
#ifndef LAJIT_TEST_GPU_H
#define LAJIT_TEST_GPU_H

#include <stdint.h>

#include "device.h"
#include "test.h"

/* ---- The device ---------------------------------------------------------------------------- */

void lj_gpu_init(void);
/* As lj_gpu_init, on device `ordinal` (a test that runs one process per GPU opens device r in
 * rank r): every helper then works on it and lj_gpu_tensor's views name it. Once per process. */
void lj_gpu_init_device(int ordinal);
/* NCCL's table (device/nccl.h), for the context-parallel tests: LAJIT_NCCL_PATH, else the
 * system's libnccl.so.2, else the nvidia-nccl wheel's copy when python3 can say where it is
 * (LAJIT_NCCL_PATH is then set to it); skips the case (exit 77) when none loads. */
struct lj_nccl;
const struct lj_nccl *lj_gpu_nccl(void);
/* A communicator of one rank on device 0 (ncclCommInitAll), the device made current again after
 * it; fails the test when NCCL refuses. Destroy it with lj_gpu_nccl()->ncclCommDestroy. */
void *lj_gpu_nccl_one_rank(void);
/* The env the helpers use (fault injection off), the driver table and the opened device. */
lj_env *lj_gpu_env(void);
const lj_driver *lj_gpu_driver(void);
lj_device *lj_gpu_device(void);

/* ---- Device memory (each fails the test on a driver error) ---------------------------------- */

CUdeviceptr lj_gpu_alloc(size_t bytes);
void lj_gpu_free(CUdeviceptr p); /* accepts 0 */
void lj_gpu_upload(CUdeviceptr dst, const void *src, size_t bytes);
void lj_gpu_download(void *dst, CUdeviceptr src, size_t bytes);
void lj_gpu_memset(CUdeviceptr dst, unsigned char byte, size_t bytes);
/* Fills with 0xFF bytes: NaN in float32, float16 and bfloat16, -1 in int32, so an element a
 * kernel forgot to write cannot pass a comparison. */
void lj_gpu_poison(CUdeviceptr dst, size_t bytes);
/* Waits for all work of the context (lj_gpu_sync) or of one stream (NULL: legacy stream). */
void lj_gpu_sync(void);
void lj_gpu_stream_sync(CUstream s);

/* n floats converted to dt (rounded to nearest even) and uploaded, or downloaded and widened. */
void lj_gpu_upload_as(CUdeviceptr dst, const float *src, size_t n, lj_dtype dt);
void lj_gpu_download_as(float *dst, CUdeviceptr src, size_t n, lj_dtype dt);

/* ---- DLTensor views ------------------------------------------------------------------------- */

#define LJ_TEST_MAX_DIMS 8

/* A DLTensor with its own shape and stride arrays. It points into itself: initialise it in
 * place with lj_gpu_tensor and do not copy it. */
typedef struct lj_test_tensor {
    DLTensor t;
    int64_t shape[LJ_TEST_MAX_DIMS];
    int64_t strides[LJ_TEST_MAX_DIMS];
} lj_test_tensor;

/* Describes ndim-dimensional memory at base + byte_offset on the opened CUDA device (0 unless
 * lj_gpu_init_device opened another): strides NULL gives
 * t.strides = NULL (compact row-major); otherwise they are copied (in elements). Returns &out->t.
 * base is any address (a CPU test may use a made-up one). */
DLTensor *lj_gpu_tensor(lj_test_tensor *out, uint64_t base, uint64_t byte_offset, int ndim,
                        const int64_t *shape, const int64_t *strides, DLDataType dtype);

DLDataType lj_test_dl_dtype(lj_dtype dt); /* float32, float16, bfloat16 */
DLDataType lj_test_dl_int32(void);
size_t lj_test_dtype_size(lj_dtype dt); /* 4, 2, 2 */

/* ---- Host conversions (round to nearest even; NaN stays NaN, overflow becomes Inf) ---------- */

uint16_t lj_f32_to_f16(float x);
float lj_f16_to_f32(uint16_t h);
uint16_t lj_f32_to_bf16(float x);
float lj_bf16_to_f32(uint16_t h);
/* x rounded to dt's precision and back (identity for float32). */
float lj_round_to(float x, lj_dtype dt);
/* Arrays: n floats to dt storage (2 or 4 bytes each), and back. */
void lj_host_from_f32(void *dst, const float *src, size_t n, lj_dtype dt);
void lj_host_to_f32(float *dst, const void *src, size_t n, lj_dtype dt);

#endif
