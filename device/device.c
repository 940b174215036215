/* device.c — one CUDA device as a context uses it: the primary context (shared with the CUDA
 * runtime and every other library in the process, so lajit's memory and streams interoperate
 * with PyTorch's), its properties translated into the family's terms, and modules.
 *
 * Every driver call goes through LJ_CU, so tests can fail any one of them; each failure path
 * gives back what the function took before returning. */
#include <stdio.h>
#include <string.h>

#include "device.h"

/* The dynamic shared memory a kernel gets without opting in. */
#define LJ_DEFAULT_SMEM (48 * 1024)

static lajit_status get_attr(lj_env *env, const lj_driver *drv, CUdevice dev,
                             CUdevice_attribute attr, const char *what, int *out)
{
    CUresult r = LJ_CU(env, drv, cuDeviceGetAttribute, out, attr, dev);
    if (r != CUDA_SUCCESS) {
        char call[96];
        snprintf(call, sizeof call, "cuDeviceGetAttribute(%s)", what);
        return lj_driver_error(env, drv, r, call);
    }
    return LAJIT_OK;
}

lajit_status lj_device_open(lj_env *env, const lj_driver *drv, int ordinal, lj_device *out)
{
    lj_device d;
    memset(&d, 0, sizeof d);
    d.drv = drv;
    int count = 0;
    CUresult r = LJ_CU(env, drv, cuDeviceGetCount, &count);
    if (r != CUDA_SUCCESS)
        return lj_driver_error(env, drv, r, "cuDeviceGetCount");
    if (count == 0)
        return lj_error(env, LAJIT_ERR_NO_DEVICE, "no CUDA device: the driver reports none");
    if (ordinal < 0 || ordinal >= count)
        return lj_error(env, LAJIT_ERR_NO_DEVICE,
                        "no CUDA device %d: the driver reports %d device%s (ordinals 0..%d)",
                        ordinal, count, count == 1 ? "" : "s", count - 1);
    if ((r = LJ_CU(env, drv, cuDeviceGet, &d.dev, ordinal)) != CUDA_SUCCESS)
        return lj_driver_error(env, drv, r, "cuDeviceGet");
    if ((r = LJ_CU(env, drv, cuDeviceGetName, d.info.name, (int)sizeof d.info.name, d.dev)) !=
        CUDA_SUCCESS)
        return lj_driver_error(env, drv, r, "cuDeviceGetName");
    d.info.name[sizeof d.info.name - 1] = '\0';

    int major = 0, minor = 0;
    lajit_status st;
    if ((st = get_attr(env, drv, d.dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                       "compute capability major", &major)) != LAJIT_OK ||
        (st = get_attr(env, drv, d.dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                       "compute capability minor", &minor)) != LAJIT_OK ||
        (st = get_attr(env, drv, d.dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                       "multiprocessor count", &d.info.sms)) != LAJIT_OK ||
        (st = get_attr(env, drv, d.dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                       "opt-in shared memory per block", &d.info.smem_optin)) != LAJIT_OK ||
        (st = get_attr(env, drv, d.dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                       "shared memory per multiprocessor", &d.info.smem_per_sm)) != LAJIT_OK ||
        (st = get_attr(env, drv, d.dev, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
                       "registers per multiprocessor", &d.info.regs_per_sm)) != LAJIT_OK ||
        (st = get_attr(env, drv, d.dev, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, "L2 cache size",
                       &d.info.l2_bytes)) != LAJIT_OK)
        return st;
    d.info.cc = major * 10 + minor;
    lj_arch_for_cc(d.info.cc, d.info.arch);
    if ((r = LJ_CU(env, drv, cuDriverGetVersion, &d.driver_version)) != CUDA_SUCCESS)
        return lj_driver_error(env, drv, r, "cuDriverGetVersion");

    /* Retained last, so no earlier failure has anything to give back. */
    if ((r = LJ_CU(env, drv, cuDevicePrimaryCtxRetain, &d.cuctx, d.dev)) != CUDA_SUCCESS)
        return lj_driver_error(env, drv, r, "cuDevicePrimaryCtxRetain");
    lj_log(env, LAJIT_LOG_INFO, "device %d: %s, %s, %d SMs, %d KiB opt-in shared memory, driver %d",
           ordinal, d.info.name, d.info.arch, d.info.sms, d.info.smem_optin / 1024,
           d.driver_version);
    *out = d;
    return LAJIT_OK;
}

void lj_device_close(lj_env *env, lj_device *d)
{
    if (!d)
        return;
    if (d->cuctx && d->drv)
        LJ_CU(env, d->drv, cuDevicePrimaryCtxRelease, d->dev);
    memset(d, 0, sizeof *d);
}

lajit_status lj_device_make_current(lj_env *env, lj_device *d)
{
    CUcontext cur = NULL;
    CUresult r = LJ_CU(env, d->drv, cuCtxGetCurrent, &cur);
    if (r != CUDA_SUCCESS)
        return lj_driver_error(env, d->drv, r, "cuCtxGetCurrent");
    if (cur == d->cuctx)
        return LAJIT_OK;
    if ((r = LJ_CU(env, d->drv, cuCtxSetCurrent, d->cuctx)) != CUDA_SUCCESS)
        return lj_driver_error(env, d->drv, r, "cuCtxSetCurrent");
    return LAJIT_OK;
}

lajit_status lj_module_load(lj_env *env, lj_device *d, const void *image, const char *entry,
                            unsigned smem, CUmodule *module, CUfunction *fn)
{
    const lj_driver *drv = d->drv;
    if (!image || !entry)
        return lj_error(env, LAJIT_ERR_INTERNAL, "lj_module_load: %s is NULL",
                        image ? "entry" : "image");
    if (smem > LJ_DEFAULT_SMEM && (long long)smem > (long long)d->info.smem_optin)
        return lj_error(env, LAJIT_ERR_UNSUPPORTED,
                        "kernel %s needs %u bytes of shared memory; %s allows %d per block", entry,
                        smem, d->info.name, d->info.smem_optin);
    CUmodule m = NULL;
    CUresult r = LJ_CU(env, drv, cuModuleLoadData, &m, image);
    if (r != CUDA_SUCCESS) {
        lajit_status st = lj_driver_error(env, drv, r, "cuModuleLoadData");
        lj_error_prefix(env, "loading the module of %s: ", entry);
        return st;
    }
    CUfunction f = NULL;
    r = LJ_CU(env, drv, cuModuleGetFunction, &f, m, entry);
    lajit_status st = LAJIT_OK;
    if (r == CUDA_ERROR_NOT_FOUND)
        st = lj_error(env, LAJIT_ERR_INTERNAL,
                      "kernel entry %s is not in its module (the family's launch() names a "
                      "function its template does not define)",
                      entry);
    else if (r != CUDA_SUCCESS)
        st = lj_driver_error(env, drv, r, "cuModuleGetFunction");
    if (st == LAJIT_OK && smem > LJ_DEFAULT_SMEM) {
        r = LJ_CU(env, drv, cuFuncSetAttribute, f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                  (int)smem);
        if (r != CUDA_SUCCESS) {
            st = lj_driver_error(env, drv, r, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
            lj_error_prefix(env, "kernel %s, %u bytes of shared memory: ", entry, smem);
        }
    }
    if (st != LAJIT_OK) {
        LJ_CU(env, drv, cuModuleUnload, m);
        return st;
    }
    *module = m;
    *fn = f;
    return LAJIT_OK;
}

lajit_status lj_dev_buf_grow(lj_env *env, const lj_driver *drv, lj_dev_buf *buf, size_t bytes,
                             int zero, CUstream stream, const char *what)
{
    if (buf->bytes >= bytes)
        return LAJIT_OK;
    if (bytes > SIZE_MAX - 15)
        return lj_error(env, LAJIT_ERR_DEVICE_OUT_OF_MEMORY, "%s: %zu bytes cannot be allocated",
                        what, bytes);
    bytes = lj_round16(bytes);
    if (buf->ptr)
        LJ_CU(env, drv, cuMemFree, buf->ptr);
    buf->ptr = 0;
    buf->bytes = 0;
    CUdeviceptr d;
    char text[160];
    CUresult r = LJ_CU(env, drv, cuMemAlloc, &d, bytes);
    if (r != CUDA_SUCCESS) {
        snprintf(text, sizeof text, "cuMemAlloc of %s", what);
        return lj_driver_error(env, drv, r, text);
    }
    if (zero && (r = LJ_CU(env, drv, cuMemsetD32Async, d, 0u, bytes / 4, stream)) != CUDA_SUCCESS) {
        LJ_CU(env, drv, cuMemFree, d);
        snprintf(text, sizeof text, "cuMemsetD32Async of %s", what);
        return lj_driver_error(env, drv, r, text);
    }
    buf->ptr = d;
    buf->bytes = bytes;
    return LAJIT_OK;
}
