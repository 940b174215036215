/* driver.h — the CUDA driver API reached through dlopen("libcuda.so.1") and cuGetProcAddress,
 * never linked, so the library loads and generates kernels on a machine with no driver.
 *
 * The table is loaded once per process (the only process-wide state lajit keeps besides
 * NVRTC's). Tests substitute a fake table per context (lj_driver_set_override) to run the
 * launch path with no GPU and to fail the N-th driver call. Every call goes through LJ_CU, which
 * counts it for fault injection. */
#ifndef LAJIT_DRIVER_H
#define LAJIT_DRIVER_H

#include <cuda.h>

#include "core.h"

typedef struct lj_driver {
    CUresult (*cuInit)(unsigned int);
    CUresult (*cuDriverGetVersion)(int *);
    CUresult (*cuGetErrorName)(CUresult, const char **);
    CUresult (*cuGetErrorString)(CUresult, const char **);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDeviceGetName)(char *, int, CUdevice);
    CUresult (*cuDeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
    CUresult (*cuCtxGetCurrent)(CUcontext *);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuCtxPushCurrent)(CUcontext);
    CUresult (*cuCtxPopCurrent)(CUcontext *);
    CUresult (*cuCtxSynchronize)(void);
    /* Private contexts (the tuner times candidates in one, so a faulting kernel poisons only
     * it): cuCtxCreate_v2 (flags, device), resolved at CUDA 11.0's ABI (driver.c says why),
     * and cuCtxDestroy_v2. */
    CUresult (*cuCtxCreate)(CUcontext *, unsigned int, CUdevice);
    CUresult (*cuCtxDestroy)(CUcontext);
    CUresult (*cuModuleLoadData)(CUmodule *, const void *);
    CUresult (*cuModuleUnload)(CUmodule);
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*cuFuncSetAttribute)(CUfunction, CUfunction_attribute, int);
    CUresult (*cuFuncGetAttribute)(int *, CUfunction_attribute, CUfunction);
    /* CUDA 12.4+, NULL on older drivers: a kernel's parameter offsets and sizes (lajit_launch
     * checks a custom family's kernel against its declared arguments). */
    CUresult (*cuFuncGetParamInfo)(CUfunction, size_t, size_t *, size_t *);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **);
    /* CUDA 11.8+, NULL when the driver lacks it: a launch with attributes. lajit passes one,
     * programmatic stream serialization, for kernels whose spec says pdl (runtime/plan_build.c,
     * lj_plan_launch); without this entry those kernels launch with cuLaunchKernel. */
    CUresult (*cuLaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
    /* Ordered on the stream; from pageable memory it returns once the source is staged, so the
     * buffer may be reused at once (the op's small tables, written before their kernels). */
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*cuMemsetD32)(CUdeviceptr, unsigned int, size_t);
    CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
    CUresult (*cuMemGetInfo)(size_t *, size_t *);
    CUresult (*cuPointerGetAttribute)(void *, CUpointer_attribute, CUdeviceptr);
    CUresult (*cuStreamCreate)(CUstream *, unsigned int);
    CUresult (*cuStreamDestroy)(CUstream);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuStreamBeginCapture)(CUstream, CUstreamCaptureMode);
    CUresult (*cuStreamEndCapture)(CUstream, CUgraph *);
    CUresult (*cuGraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
    CUresult (*cuGraphExecDestroy)(CUgraphExec);
    CUresult (*cuGraphDestroy)(CUgraph);
    CUresult (*cuEventCreate)(CUevent *, unsigned int);
    CUresult (*cuEventDestroy)(CUevent);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventSynchronize)(CUevent);
    CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
} lj_driver;

/* Loads the process's driver table once (thread-safe) and calls cuInit(0). Returns
 * LAJIT_ERR_NO_DRIVER when libcuda is absent, is the toolkit's stub (CUDA_ERROR_STUB_LIBRARY)
 * or reports no driver; LAJIT_ERR_NO_DEVICE when cuInit says there is no device. The message
 * says which. LAJIT_DRIVER_PATH overrides the library name (tests point it at a missing file). */
lajit_status lj_driver_load(lj_env *env, const lj_driver **out);

/* Converts a failed CUresult into a status and message: "cuModuleLoadData: CUDA_ERROR_...
 * (text)". LAJIT_ERR_NO_DEVICE for CUDA_ERROR_NO_DEVICE, LAJIT_ERR_NO_DRIVER for
 * CUDA_ERROR_STUB_LIBRARY / NO_DRIVER / NOT_INITIALIZED-at-init, LAJIT_ERR_DEVICE_OUT_OF_MEMORY
 * for CUDA_ERROR_OUT_OF_MEMORY, LAJIT_ERR_DEVICE_FAULT for the sticky errors a faulting kernel
 * leaves (illegal address, launch failure, ...), LAJIT_ERR_DRIVER otherwise. Records r and its
 * name in env (driver_result) for lajit_last_driver_error. */
lajit_status lj_driver_error(lj_env *env, const lj_driver *drv, CUresult r, const char *what);

/* Every driver call: counts it for fault injection (a hit returns CUDA_ERROR_UNKNOWN without
 * making the call). */
#define LJ_CU(env, drv, fn, ...) \
    (lj_fault_hit((env), LJ_FAULT_DRIVER) ? CUDA_ERROR_UNKNOWN : (drv)->fn(__VA_ARGS__))

#endif
