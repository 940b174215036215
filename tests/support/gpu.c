/* gpu.c — helpers for gpu tests (see gpu.h). */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "nccl.h"

static struct {
    int ready;
    lj_env env;
    const lj_driver *drv;
    lj_device dev;
    int ordinal; /* the device opened (lj_gpu_tensor's views name it) */
} g;

/* Fails the test with the driver's name for r. */
static void check(CUresult r, const char *what, int line)
{
    if (r == CUDA_SUCCESS)
        return;
    lj_driver_error(&g.env, g.drv, r, what);
    lj_test_fail(__FILE__, line, "%s", g.env.errmsg);
}
#define CHECK(call, what) check((call), (what), __LINE__)

static void need_init(const char *who)
{
    if (!g.ready)
        lj_test_fail(__FILE__, __LINE__, "%s before lj_gpu_init()", who);
}

void lj_gpu_init(void)
{
    lj_gpu_init_device(0);
}

void lj_gpu_init_device(int ordinal)
{
    if (g.ready) {
        if (ordinal != g.ordinal)
            lj_test_fail(__FILE__, __LINE__, "lj_gpu_init_device(%d) after device %d was opened",
                         ordinal, g.ordinal);
        return;
    }
    lj_env_init(&g.env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    lajit_status st = lj_driver_load(&g.env, &g.drv);
    if (st == LAJIT_ERR_NO_DRIVER || st == LAJIT_ERR_NO_DEVICE) {
        char why[sizeof g.env.errmsg + 16];
        snprintf(why, sizeof why, "no GPU: %s", g.env.errmsg);
        lj_test_skip(why);
    }
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "loading the driver: %s", g.env.errmsg);
    st = lj_device_open(&g.env, g.drv, ordinal, &g.dev);
    if (st == LAJIT_ERR_NO_DEVICE) {
        char why[sizeof g.env.errmsg + 16];
        snprintf(why, sizeof why, "no GPU: %s", g.env.errmsg);
        lj_test_skip(why);
    }
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "opening device %d: %s", ordinal, g.env.errmsg);
    if (lj_device_make_current(&g.env, &g.dev) != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "making device %d current: %s", ordinal, g.env.errmsg);
    g.ordinal = ordinal;
    g.ready = 1;
}

lj_env *lj_gpu_env(void)
{
    need_init("lj_gpu_env");
    return &g.env;
}

const lj_driver *lj_gpu_driver(void)
{
    need_init("lj_gpu_driver");
    return g.drv;
}

lj_device *lj_gpu_device(void)
{
    need_init("lj_gpu_device");
    return &g.dev;
}

CUdeviceptr lj_gpu_alloc(size_t bytes)
{
    need_init("lj_gpu_alloc");
    CUdeviceptr p = 0;
    CHECK(g.drv->cuMemAlloc(&p, bytes ? bytes : 1), "cuMemAlloc");
    return p;
}

void lj_gpu_free(CUdeviceptr p)
{
    need_init("lj_gpu_free");
    if (p)
        CHECK(g.drv->cuMemFree(p), "cuMemFree");
}

void lj_gpu_upload(CUdeviceptr dst, const void *src, size_t bytes)
{
    need_init("lj_gpu_upload");
    if (bytes)
        CHECK(g.drv->cuMemcpyHtoD(dst, src, bytes), "cuMemcpyHtoD");
}

void lj_gpu_download(void *dst, CUdeviceptr src, size_t bytes)
{
    need_init("lj_gpu_download");
    if (bytes)
        CHECK(g.drv->cuMemcpyDtoH(dst, src, bytes), "cuMemcpyDtoH");
}

void lj_gpu_memset(CUdeviceptr dst, unsigned char byte, size_t bytes)
{
    need_init("lj_gpu_memset");
    if (!bytes)
        return;
    CHECK(g.drv->cuMemsetD8(dst, byte, bytes), "cuMemsetD8");
    /* cuMemsetD8 may return before the memset is done, and it runs on the legacy stream, which a
     * non-blocking stream does not wait for: finish it here, so a poison is in place before any
     * kernel of any stream (a state scan test saw its poison land after the kernel's output). */
    CHECK(g.drv->cuCtxSynchronize(), "cuCtxSynchronize");
}

void lj_gpu_poison(CUdeviceptr dst, size_t bytes)
{
    lj_gpu_memset(dst, 0xFF, bytes);
}

void lj_gpu_sync(void)
{
    need_init("lj_gpu_sync");
    CHECK(g.drv->cuCtxSynchronize(), "cuCtxSynchronize");
}

void lj_gpu_stream_sync(CUstream s)
{
    need_init("lj_gpu_stream_sync");
    CHECK(g.drv->cuStreamSynchronize(s), "cuStreamSynchronize");
}

void lj_gpu_upload_as(CUdeviceptr dst, const float *src, size_t n, lj_dtype dt)
{
    size_t bytes = n * lj_test_dtype_size(dt);
    void *tmp = malloc(bytes ? bytes : 1);
    if (!tmp)
        lj_test_fail(__FILE__, __LINE__, "out of host memory (%zu bytes)", bytes);
    lj_host_from_f32(tmp, src, n, dt);
    lj_gpu_upload(dst, tmp, bytes);
    free(tmp);
}

void lj_gpu_download_as(float *dst, CUdeviceptr src, size_t n, lj_dtype dt)
{
    size_t bytes = n * lj_test_dtype_size(dt);
    void *tmp = malloc(bytes ? bytes : 1);
    if (!tmp)
        lj_test_fail(__FILE__, __LINE__, "out of host memory (%zu bytes)", bytes);
    lj_gpu_download(tmp, src, bytes);
    lj_host_to_f32(dst, tmp, n, dt);
    free(tmp);
}

/* ---- DLTensor views ------------------------------------------------------------------------- */

DLTensor *lj_gpu_tensor(lj_test_tensor *out, uint64_t base, uint64_t byte_offset, int ndim,
                        const int64_t *shape, const int64_t *strides, DLDataType dtype)
{
    if (ndim < 0 || ndim > LJ_TEST_MAX_DIMS)
        lj_test_fail(__FILE__, __LINE__, "lj_gpu_tensor: ndim %d", ndim);
    memset(out, 0, sizeof *out);
    for (int i = 0; i < ndim; i++) {
        out->shape[i] = shape[i];
        if (strides)
            out->strides[i] = strides[i];
    }
    out->t.data = (void *)(uintptr_t)base;
    out->t.device.device_type = kDLCUDA;
    out->t.device.device_id = g.ordinal; /* 0 unless lj_gpu_init_device opened another */
    out->t.ndim = ndim;
    out->t.dtype = dtype;
    out->t.shape = out->shape;
    out->t.strides = strides ? out->strides : NULL;
    out->t.byte_offset = byte_offset;
    return &out->t;
}

DLDataType lj_test_dl_dtype(lj_dtype dt)
{
    DLDataType d = {kDLFloat, 32, 1};
    if (dt == LJ_F16)
        d.bits = 16;
    else if (dt == LJ_BF16) {
        d.code = kDLBfloat;
        d.bits = 16;
    }
    return d;
}

DLDataType lj_test_dl_int32(void)
{
    DLDataType d = {kDLInt, 32, 1};
    return d;
}

size_t lj_test_dtype_size(lj_dtype dt)
{
    return dt == LJ_F32 ? 4 : 2;
}

/* ---- Host conversions ----------------------------------------------------------------------- */

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

uint16_t lj_f32_to_f16(float x)
{
    uint32_t u = bits_of(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* Inf, or NaN made quiet */
        return (uint16_t)(sign | (a > 0x7f800000u ? 0x7e00 : 0x7c00));
    if (a >= 0x47800000u) /* >= 65536: beyond the largest finite value after any rounding */
        return (uint16_t)(sign | 0x7c00);
    if (a < 0x38800000u) {
        /* Below 2^-14: a subnormal half counts units of 2^-24. Scaling by 2^24 is exact and
         * nearbyintf rounds to nearest even in the default mode; 1024 is the smallest normal. */
        float scaled = float_of(a) * 16777216.0f;
        return (uint16_t)(sign | (uint16_t)nearbyintf(scaled));
    }
    uint32_t h = ((((a >> 23) - 127 + 15) << 10) | ((a & 0x7fffffu) >> 13));
    uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1)))
        h++; /* a carry into the exponent is correct, up to Inf */
    return (uint16_t)(sign | h);
}

float lj_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ffu;
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return sign ? -v : v;
    }
    if (e == 31)
        return float_of(sign | 0x7f800000u | (m << 13));
    return float_of(sign | ((e - 15 + 127) << 23) | (m << 13));
}

uint16_t lj_f32_to_bf16(float x)
{
    uint32_t u = bits_of(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float lj_bf16_to_f32(uint16_t h)
{
    return float_of((uint32_t)h << 16);
}

float lj_round_to(float x, lj_dtype dt)
{
    switch (dt) {
        case LJ_F16: return lj_f16_to_f32(lj_f32_to_f16(x));
        case LJ_BF16: return lj_bf16_to_f32(lj_f32_to_bf16(x));
        default: return x;
    }
}

void lj_host_from_f32(void *dst, const float *src, size_t n, lj_dtype dt)
{
    if (dt == LJ_F32) {
        memcpy(dst, src, n * 4);
        return;
    }
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++)
        d[i] = dt == LJ_F16 ? lj_f32_to_f16(src[i]) : lj_f32_to_bf16(src[i]);
}

void lj_host_to_f32(float *dst, const void *src, size_t n, lj_dtype dt)
{
    if (dt == LJ_F32) {
        memcpy(dst, src, n * 4);
        return;
    }
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++)
        dst[i] = dt == LJ_F16 ? lj_f16_to_f32(s[i]) : lj_bf16_to_f32(s[i]);
}

/* TEMPORARY: see the same fallback in fake_driver.c; delete both once generator/family.c
 * defines lj_arch_for_cc. */
__attribute__((weak)) void lj_arch_for_cc(int cc, char arch[16])
{
    if (cc == 90 || cc == 100 || cc == 101 || cc == 103)
        snprintf(arch, 16, "sm_%da", cc);
    else
        snprintf(arch, 16, "sm_%d", cc);
}

const lj_nccl *lj_gpu_nccl(void)
{
    const char *env_path = getenv("LAJIT_NCCL_PATH");
    if (!env_path || !*env_path) {
        void *probe = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (probe) {
            dlclose(probe);
        } else {
            /* The nvidia-nccl wheel's copy, when python3 can say where it is. */
            FILE *p = popen("python3 -c 'import nvidia.nccl, os; "
                            "print(os.path.join(list(nvidia.nccl.__path__)[0], \"lib\", "
                            "\"libnccl.so.2\"))' 2>/dev/null",
                            "r");
            char line[1024] = "";
            if (p) {
                if (!fgets(line, sizeof line, p))
                    line[0] = 0;
                pclose(p);
            }
            line[strcspn(line, "\n")] = 0;
            if (line[0])
                setenv("LAJIT_NCCL_PATH", line, 1);
        }
    }
    const lj_nccl *nccl;
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    if (lj_nccl_load(&env, &nccl) != LAJIT_OK) {
        char why[sizeof env.errmsg + 64];
        snprintf(why, sizeof why, "%s (set LAJIT_NCCL_PATH to libnccl.so.2)", env.errmsg);
        lj_test_skip(why);
    }
    return nccl;
}

void *lj_gpu_nccl_one_rank(void)
{
    const lj_nccl *nccl = lj_gpu_nccl();
    lj_nccl_comm comm = NULL;
    const int devs[1] = {0};
    lj_nccl_result nr = nccl->ncclCommInitAll(&comm, 1, devs);
    if (nr != LJ_NCCL_SUCCESS)
        lj_test_fail(__FILE__, __LINE__, "ncclCommInitAll: %d %s", nr,
                     nccl->ncclGetErrorString(nr));
    lj_device_make_current(lj_gpu_env(), lj_gpu_device());
    return comm;
}
