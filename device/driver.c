/* driver.c — the process's CUDA driver table: libcuda opened with dlopen, every entry point
 * found with cuGetProcAddress at a pinned ABI version, cuInit(0) called once.
 *
 * Nothing links against libcuda, so the library loads (and generates and compiles kernels) on a
 * machine with no driver; the first op that needs the device learns here why there is none.
 * The outcome of the one load — the table, or a status with its message — is remembered for
 * the life of the process and is the only driver state lajit keeps outside a context. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

/* Every entry point is requested at the ABI of CUDA 12.0, whatever the installed driver: the
 * function-pointer types of lj_driver are those of that version (e.g. cuGraphInstantiate with a
 * flags argument, cuStreamBeginCapture with a mode, the _v2 memory calls). */
#define LJ_DRIVER_ABI 12000

typedef CUresult (*lj_get_proc_fn)(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                   CUdriverProcAddressQueryResult *status);

_Static_assert(sizeof(void *) == sizeof(lj_get_proc_fn),
               "function pointers travel through void * (dlsym, cuGetProcAddress)");

/* Base names as cuGetProcAddress knows them, and where each lands in the table. The member
 * names pass through cuda.h's version macros (cuMemAlloc -> cuMemAlloc_v2), the same way they
 * did in the struct declaration, while #fn keeps the base name. */
#define LJ_ENTRY(fn)                       \
    {                                      \
#fn, offsetof(lj_driver, fn), 0, 0 \
    }
/* An entry whose ABI changed after the version the table is declared for: cuGetProcAddress
 * returns the newest variant not newer than the version asked for, so cuCtxCreate at 12000
 * would be cuCtxCreate_v3 (affinity parameters first); 11000 selects the (flags, device) one. */
#define LJ_ENTRY_AT(fn, version)                 \
    {                                            \
#fn, offsetof(lj_driver, fn), version, 0 \
    }
/* An entry newer drivers have and lajit can do without: left NULL when the driver lacks it. */
#define LJ_ENTRY_OPTIONAL(fn, version)           \
    {                                            \
#fn, offsetof(lj_driver, fn), version, 1 \
    }
static const struct {
    const char *name;
    size_t offset;
    int version; /* 0: LJ_DRIVER_ABI */
    int optional;
} entries[] = {
    LJ_ENTRY(cuInit),
    LJ_ENTRY(cuDriverGetVersion),
    LJ_ENTRY(cuGetErrorName),
    LJ_ENTRY(cuGetErrorString),
    LJ_ENTRY(cuDeviceGetCount),
    LJ_ENTRY(cuDeviceGet),
    LJ_ENTRY(cuDeviceGetName),
    LJ_ENTRY(cuDeviceGetAttribute),
    LJ_ENTRY(cuDevicePrimaryCtxRetain),
    LJ_ENTRY(cuDevicePrimaryCtxRelease),
    LJ_ENTRY(cuCtxGetCurrent),
    LJ_ENTRY(cuCtxSetCurrent),
    LJ_ENTRY(cuCtxPushCurrent),
    LJ_ENTRY(cuCtxPopCurrent),
    LJ_ENTRY(cuCtxSynchronize),
    LJ_ENTRY_AT(cuCtxCreate, 11000),
    LJ_ENTRY(cuCtxDestroy),
    LJ_ENTRY(cuModuleLoadData),
    LJ_ENTRY(cuModuleUnload),
    LJ_ENTRY(cuModuleGetFunction),
    LJ_ENTRY(cuFuncSetAttribute),
    LJ_ENTRY(cuFuncGetAttribute),
    LJ_ENTRY_OPTIONAL(cuFuncGetParamInfo, 12040),
    LJ_ENTRY(cuLaunchKernel),
    LJ_ENTRY_OPTIONAL(cuLaunchKernelEx, 11080),
    LJ_ENTRY(cuMemAlloc),
    LJ_ENTRY(cuMemFree),
    LJ_ENTRY(cuMemcpyHtoD),
    LJ_ENTRY(cuMemcpyHtoDAsync),
    LJ_ENTRY(cuMemcpyDtoH),
    LJ_ENTRY(cuMemcpyDtoHAsync),
    LJ_ENTRY(cuMemcpyDtoDAsync),
    LJ_ENTRY(cuMemsetD8),
    LJ_ENTRY(cuMemsetD32),
    LJ_ENTRY(cuMemsetD32Async),
    LJ_ENTRY(cuMemGetInfo),
    LJ_ENTRY(cuPointerGetAttribute),
    LJ_ENTRY(cuStreamCreate),
    LJ_ENTRY(cuStreamDestroy),
    LJ_ENTRY(cuStreamSynchronize),
    LJ_ENTRY(cuStreamBeginCapture),
    LJ_ENTRY(cuStreamEndCapture),
    /* The flags form under its own name: the base name can resolve to the older
     * five-argument cuGraphInstantiate. */
    {"cuGraphInstantiateWithFlags", offsetof(lj_driver, cuGraphInstantiate), 0, 0},
    LJ_ENTRY(cuGraphLaunch),
    LJ_ENTRY(cuGraphExecDestroy),
    LJ_ENTRY(cuGraphDestroy),
    LJ_ENTRY(cuEventCreate),
    LJ_ENTRY(cuEventDestroy),
    LJ_ENTRY(cuEventRecord),
    LJ_ENTRY(cuEventSynchronize),
    LJ_ENTRY(cuEventElapsedTime),
};
#undef LJ_ENTRY

_Static_assert(sizeof entries / sizeof entries[0] * sizeof(void *) == sizeof(lj_driver),
               "every member of lj_driver has an entry");

/* The remembered outcome of the load. Written once inside pthread_once, read-only after. */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static lj_driver table;
static lajit_status load_status;
static char load_message[1024];

/* Statuses for results meaning "there is no usable driver" rather than "a call failed". */
static lajit_status status_of(CUresult r, int at_init)
{
    switch (r) {
        case CUDA_ERROR_NO_DEVICE: return LAJIT_ERR_NO_DEVICE;
        case CUDA_ERROR_STUB_LIBRARY:
        case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
        case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE: return LAJIT_ERR_NO_DRIVER;
        case CUDA_ERROR_NOT_INITIALIZED: return at_init ? LAJIT_ERR_NO_DRIVER : LAJIT_ERR_DRIVER;
        /* Device memory ran out (an allocation, a module load, a launch's local memory): the
     * application may free memory and retry. */
        case CUDA_ERROR_OUT_OF_MEMORY: return LAJIT_ERR_DEVICE_OUT_OF_MEMORY;
        /* Sticky errors: a kernel faulted and the CUDA context is unusable; every later call in it
     * fails the same way until the context is destroyed (for the primary context, shared with
     * the rest of the process, that means resetting the device or restarting the process). */
        case CUDA_ERROR_ILLEGAL_ADDRESS:
        case CUDA_ERROR_LAUNCH_FAILED:
        case CUDA_ERROR_ILLEGAL_INSTRUCTION:
        case CUDA_ERROR_MISALIGNED_ADDRESS:
        case CUDA_ERROR_INVALID_ADDRESS_SPACE:
        case CUDA_ERROR_INVALID_PC:
        case CUDA_ERROR_HARDWARE_STACK_ERROR:
        case CUDA_ERROR_ASSERT:
        case CUDA_ERROR_LAUNCH_TIMEOUT:
        case CUDA_ERROR_ECC_UNCORRECTABLE: return LAJIT_ERR_DEVICE_FAULT;
        default: return LAJIT_ERR_DRIVER;
    }
}

/* The result's name ("CUDA_ERROR_OUT_OF_MEMORY") from the table when it can say, else NULL. */
static const char *name_of(const lj_driver *drv, CUresult r)
{
    const char *name = NULL;
    if (drv && drv->cuGetErrorName && drv->cuGetErrorName(r, &name) != CUDA_SUCCESS)
        name = NULL;
    return name;
}

/* "CUDA_ERROR_X (text)" from the table when it can say, else "CUDA error N". */
static void describe(const lj_driver *drv, CUresult r, char *out, size_t cap)
{
    const char *name = name_of(drv, r), *text = NULL;
    if (drv && drv->cuGetErrorString && drv->cuGetErrorString(r, &text) != CUDA_SUCCESS)
        text = NULL;
    if (name && text)
        snprintf(out, cap, "%s (%s)", name, text);
    else if (name)
        snprintf(out, cap, "%s", name);
    else
        snprintf(out, cap, "CUDA error %d", (int)r);
}

static void fail(lajit_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(lajit_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(load_message, sizeof load_message, fmt, ap);
    va_end(ap);
    load_status = st;
}

static void load(void)
{
    const char *override = getenv("LAJIT_DRIVER_PATH");
    const char *path = override && *override ? override : "libcuda.so.1";
    const char *from = override && *override ? " (LAJIT_DRIVER_PATH)" : "";
    dlerror();
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        fail(LAJIT_ERR_NO_DRIVER, "no CUDA driver: cannot load %s%s: %s", path, from,
             why ? why : "unknown reason");
        return;
    }
    void *sym = dlsym(lib, "cuGetProcAddress_v2");
    if (!sym) {
        fail(LAJIT_ERR_NO_DRIVER,
             "no CUDA driver: %s%s has no cuGetProcAddress_v2 (a driver older than CUDA 12.0?)",
             path, from);
        dlclose(lib);
        return;
    }
    lj_get_proc_fn get_proc;
    memcpy(&get_proc, &sym, sizeof get_proc);

    lj_driver t;
    memset(&t, 0, sizeof t);
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        CUresult r =
            get_proc(entries[i].name, &fn, entries[i].version ? entries[i].version : LJ_DRIVER_ABI,
                     CU_GET_PROC_ADDRESS_DEFAULT, &found);
        if (r == CUDA_ERROR_STUB_LIBRARY) {
            fail(LAJIT_ERR_NO_DRIVER,
                 "no CUDA driver: %s%s is the toolkit's stub libcuda (CUDA_ERROR_STUB_LIBRARY); "
                 "install the NVIDIA driver or fix the library path",
                 path, from);
            dlclose(lib);
            return;
        }
        if (entries[i].optional && (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS))
            continue; /* an older driver: the entry stays NULL */
        if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS || !fn) {
            fail(LAJIT_ERR_NO_DRIVER,
                 "no usable CUDA driver: %s%s does not provide %s at CUDA %d.%d (result %d, "
                 "query status %d)",
                 path, from, entries[i].name, LJ_DRIVER_ABI / 1000, LJ_DRIVER_ABI % 1000 / 10,
                 (int)r, (int)found);
            dlclose(lib);
            return;
        }
        memcpy((char *)&t + entries[i].offset, &fn, sizeof fn);
    }

    CUresult r = t.cuInit(0);
    if (r != CUDA_SUCCESS) {
        char text[256];
        describe(&t, r, text, sizeof text);
        lajit_status st = status_of(r, 1);
        if (r == CUDA_ERROR_STUB_LIBRARY)
            fail(st, "no CUDA driver: %s%s is the toolkit's stub libcuda (CUDA_ERROR_STUB_LIBRARY)",
                 path, from);
        else if (st == LAJIT_ERR_NO_DEVICE)
            fail(st, "no CUDA device: cuInit: %s", text);
        else if (st == LAJIT_ERR_NO_DRIVER)
            fail(st, "no usable CUDA driver: cuInit: %s", text);
        else
            fail(st, "cuInit: %s", text);
        dlclose(lib);
        return;
    }
    /* The library stays open for the life of the process: the table points into it. */
    table = t;
    load_status = LAJIT_OK;
}

lajit_status lj_driver_load(lj_env *env, const lj_driver **out)
{
    pthread_once(&load_once, load);
    if (load_status != LAJIT_OK)
        return lj_error(env, load_status, "%s", load_message);
    *out = &table;
    return LAJIT_OK;
}

lajit_status lj_driver_error(lj_env *env, const lj_driver *drv, CUresult r, const char *what)
{
    char text[256];
    describe(drv, r, text, sizeof text);
    lajit_status st =
        lj_error(env, status_of(r, 0), "%s: %s", what ? what : "CUDA driver call", text);
    /* After lj_error, which forgets the previous failure's result. */
    const char *name = name_of(drv, r);
    env->driver_result = (int)r;
    if (name)
        snprintf(env->driver_result_name, sizeof env->driver_result_name, "%s", name);
    else
        snprintf(env->driver_result_name, sizeof env->driver_result_name, "CUDA error %d", (int)r);
    return st;
}
