/* fake_driver.c — the fake lj_driver table (see fake_driver.h). Handles point into fixed
 * arrays of this file; a handle that was never given out, or was given back, is rejected with
 * CUDA_ERROR_INVALID_HANDLE / INVALID_VALUE, so double frees and use after unload show up as
 * errors in the tests that cause them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_driver.h"
#include "family.h"

#define MAX_MODULES   64
#define MAX_FUNCTIONS 256
#define MAX_ALLOCS    1024
#define MAX_HANDLES   64
#define MAX_CONTEXTS  8
#define DEFAULT_SMEM  (48 * 1024)

struct fake_module {
    int live;
    const void *image;
    CUcontext ctx; /* the context it was loaded in */
};
struct fake_function {
    int live;
    struct fake_module *module;
    char name[64];
    int max_dynamic_smem;
};
struct fake_handle { /* streams, events, graphs, graph execs */
    int live;
    CUcontext ctx; /* streams and events: the context they belong to */
    double t;      /* events: the virtual clock when recorded; graphs and execs: the virtual time
                      of the kernels captured into them, spent again at each replay */
};
/* A context made with cuCtxCreate. sticky: the error a faulted kernel left in it (every later
 * call that needs it fails with this until it is destroyed, as with the real driver). */
struct fake_context {
    int live;
    CUresult sticky;
};

static struct {
    int device_count;
    CUresult init_result;
    char fail_name[64];
    CUresult fail_result;
    int retained;
    CUcontext current;
    struct fake_module modules[MAX_MODULES];
    struct fake_function functions[MAX_FUNCTIONS];
    void *allocs[MAX_ALLOCS];
    size_t alloc_sizes[MAX_ALLOCS];
    CUcontext alloc_ctx[MAX_ALLOCS];
    struct fake_context contexts[MAX_CONTEXTS];
    CUresult primary_sticky;
    lj_fake_fault_fn fault_fn;
    void *fault_user;
    CUresult fault_result;
    lj_fake_time_fn time_fn;
    void *time_user;
    double clock_ms;   /* virtual time: advanced by each launch's kernel time */
    double capture_ms; /* kernel time captured into the graph being recorded */
    struct fake_handle streams[MAX_HANDLES], events[MAX_HANDLES], graphs[MAX_HANDLES],
        execs[MAX_HANDLES];
    CUstream capturing; /* the stream under capture */
    int capture_active;
    const void *last_image;
    lj_fake_counts counts;
    lj_fake_launch log[LJ_FAKE_MAX_LAUNCHES];
    CUstream last_htod_stream; /* of the last cuMemcpyHtoDAsync */
    lj_fake_copy copies[LJ_FAKE_MAX_LAUNCHES];
    int cc_major, cc_minor;
} fk = {.device_count = 1, .cc_major = 9};

/* The primary context: an address of ours that the fake never dereferences. */
static char primary_ctx_storage;
#define PRIMARY ((CUcontext)(void *)&primary_ctx_storage)

static CUresult err(CUresult r)
{
    fk.counts.errors++;
    return r;
}

/* An injected failure for the entry named fn. */
#define FAKE_ENTRY(fn)                                        \
    do {                                                      \
        if (fk.fail_name[0] && strcmp(fk.fail_name, fn) == 0) \
            return err(fk.fail_result);                       \
    } while (0)

static struct fake_context *private_ctx(CUcontext c)
{
    struct fake_context *p = (struct fake_context *)(void *)c;
    if (p < fk.contexts || p >= fk.contexts + MAX_CONTEXTS || !p->live)
        return NULL;
    return p;
}

/* CUDA_SUCCESS when a usable context is current, else the error a call needing one gets: no
 * context, or the sticky error of a faulted one. */
static CUresult current_state(void)
{
    if (fk.current == PRIMARY && fk.retained)
        return fk.primary_sticky;
    struct fake_context *p = private_ctx(fk.current);
    return p ? p->sticky : CUDA_ERROR_INVALID_CONTEXT;
}

#define NEED_CONTEXT()                     \
    do {                                   \
        CUresult state_ = current_state(); \
        if (state_ != CUDA_SUCCESS)        \
            return err(state_);            \
    } while (0)

/* ---- Handles ----------------------------------------------------------------------------- */

static void *take_handle(struct fake_handle *pool, int *counter)
{
    for (int i = 0; i < MAX_HANDLES; i++) {
        if (!pool[i].live) {
            pool[i].live = 1;
            pool[i].ctx = fk.current;
            pool[i].t = 0;
            (*counter)++;
            return &pool[i];
        }
    }
    return NULL;
}

/* Gives back h (counted in *counter); 0 when h is not a live handle of pool. */
static int give_handle(struct fake_handle *pool, void *h, int *counter)
{
    struct fake_handle *p = h;
    if (p < pool || p >= pool + MAX_HANDLES || !p->live)
        return 0;
    p->live = 0;
    (*counter)++;
    return 1;
}

static int live_handle(struct fake_handle *pool, void *h)
{
    struct fake_handle *p = h;
    return p >= pool && p < pool + MAX_HANDLES && p->live;
}

/* The allocation holding [ptr, ptr + bytes), or -1. */
static int find_alloc(CUdeviceptr ptr, size_t bytes)
{
    for (int i = 0; i < MAX_ALLOCS; i++) {
        uintptr_t base = (uintptr_t)fk.allocs[i];
        if (fk.allocs[i] && ptr >= base && ptr - base <= fk.alloc_sizes[i] &&
            bytes <= fk.alloc_sizes[i] - (ptr - base))
            return i;
    }
    return -1;
}

static struct fake_function *function_of(CUfunction f)
{
    struct fake_function *p = (struct fake_function *)(void *)f;
    if (p < fk.functions || p >= fk.functions + MAX_FUNCTIONS || !p->live || !p->module->live)
        return NULL;
    return p;
}

/* ---- Initialisation, errors, devices ------------------------------------------------------- */

static CUresult f_cuInit(unsigned int flags)
{
    FAKE_ENTRY("cuInit");
    if (flags != 0)
        return err(CUDA_ERROR_INVALID_VALUE);
    fk.counts.inits++;
    return fk.init_result == CUDA_SUCCESS ? CUDA_SUCCESS : err(fk.init_result);
}

static CUresult f_cuDriverGetVersion(int *v)
{
    FAKE_ENTRY("cuDriverGetVersion");
    *v = 13000;
    return CUDA_SUCCESS;
}

static const struct {
    CUresult r;
    const char *name, *text;
} error_names[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
     "too many resources requested for launch"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult f_cuGetErrorName(CUresult r, const char **out)
{
    for (size_t i = 0; i < sizeof error_names / sizeof error_names[0]; i++) {
        if (error_names[i].r == r) {
            *out = error_names[i].name;
            return CUDA_SUCCESS;
        }
    }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult f_cuGetErrorString(CUresult r, const char **out)
{
    for (size_t i = 0; i < sizeof error_names / sizeof error_names[0]; i++) {
        if (error_names[i].r == r) {
            *out = error_names[i].text;
            return CUDA_SUCCESS;
        }
    }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult f_cuDeviceGetCount(int *n)
{
    FAKE_ENTRY("cuDeviceGetCount");
    *n = fk.device_count;
    return CUDA_SUCCESS;
}

static CUresult f_cuDeviceGet(CUdevice *d, int ordinal)
{
    FAKE_ENTRY("cuDeviceGet");
    if (ordinal < 0 || ordinal >= fk.device_count)
        return err(CUDA_ERROR_INVALID_DEVICE);
    *d = ordinal;
    return CUDA_SUCCESS;
}

static CUresult f_cuDeviceGetName(char *name, int len, CUdevice d)
{
    FAKE_ENTRY("cuDeviceGetName");
    if (d < 0 || d >= fk.device_count)
        return err(CUDA_ERROR_INVALID_DEVICE);
    if (len <= 0)
        return err(CUDA_ERROR_INVALID_VALUE);
    strncpy(name, "lajit fake sm_90", (size_t)len - 1);
    name[len - 1] = '\0';
    return CUDA_SUCCESS;
}

static CUresult f_cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
    FAKE_ENTRY("cuDeviceGetAttribute");
    if (d < 0 || d >= fk.device_count)
        return err(CUDA_ERROR_INVALID_DEVICE);
    switch (a) {
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = fk.cc_major; break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = fk.cc_minor; break;
        case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
        case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = LJ_FAKE_SMEM_OPTIN; break;
        case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *v = 228 * 1024; break;
        case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *v = DEFAULT_SMEM; break;
        case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: *v = 65536; break;
        case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *v = 65536; break;
        case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *v = 50 * 1024 * 1024; break;
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
        case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = 2048; break;
        case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *v = 2147483647; break;
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
        case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *v = 65535; break;
        case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *v = 1980000; break;
        case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *v = 2619000; break;
        case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *v = 6144; break;
        default: return err(CUDA_ERROR_INVALID_VALUE);
    }
    return CUDA_SUCCESS;
}

/* ---- Contexts ------------------------------------------------------------------------------ */

static CUresult f_cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    FAKE_ENTRY("cuDevicePrimaryCtxRetain");
    if (d < 0 || d >= fk.device_count)
        return err(CUDA_ERROR_INVALID_DEVICE);
    fk.retained++;
    fk.counts.retains++;
    *c = PRIMARY;
    return CUDA_SUCCESS;
}

static CUresult f_cuDevicePrimaryCtxRelease(CUdevice d)
{
    FAKE_ENTRY("cuDevicePrimaryCtxRelease");
    if (d < 0 || d >= fk.device_count || fk.retained == 0)
        return err(CUDA_ERROR_INVALID_CONTEXT);
    fk.retained--;
    fk.counts.releases++;
    if (fk.retained == 0 && fk.current == PRIMARY)
        fk.current = NULL; /* the context is destroyed; a later retain makes a new one */
    return CUDA_SUCCESS;
}

static CUresult f_cuCtxGetCurrent(CUcontext *c)
{
    FAKE_ENTRY("cuCtxGetCurrent");
    *c = fk.current;
    return CUDA_SUCCESS;
}

static CUresult f_cuCtxSetCurrent(CUcontext c)
{
    FAKE_ENTRY("cuCtxSetCurrent");
    if (c && (c != PRIMARY || !fk.retained) && !private_ctx(c))
        return err(CUDA_ERROR_INVALID_CONTEXT);
    fk.current = c;
    fk.counts.set_current++;
    return CUDA_SUCCESS;
}

static CUresult f_cuCtxCreate(CUcontext *c, unsigned int flags, CUdevice d)
{
    FAKE_ENTRY("cuCtxCreate");
    if (d < 0 || d >= fk.device_count)
        return err(CUDA_ERROR_INVALID_DEVICE);
    for (int i = 0; i < MAX_CONTEXTS; i++) {
        if (!fk.contexts[i].live) {
            fk.contexts[i].live = 1;
            fk.contexts[i].sticky = CUDA_SUCCESS;
            fk.counts.contexts_created++;
            *c = (CUcontext)(void *)&fk.contexts[i];
            fk.current = *c; /* made current, as the driver does */
            return CUDA_SUCCESS;
        }
    }
    return err(CUDA_ERROR_OUT_OF_MEMORY);
}

/* Destroying a context frees everything made in it: memory, modules, streams, events. */
static CUresult f_cuCtxDestroy(CUcontext c)
{
    FAKE_ENTRY("cuCtxDestroy");
    struct fake_context *p = private_ctx(c);
    if (!p)
        return err(CUDA_ERROR_INVALID_CONTEXT);
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (fk.allocs[i] && fk.alloc_ctx[i] == c) {
            free(fk.allocs[i]);
            fk.allocs[i] = NULL;
            fk.counts.frees++;
        }
    }
    for (int i = 0; i < MAX_MODULES; i++) {
        if (fk.modules[i].live && fk.modules[i].ctx == c) {
            fk.modules[i].live = 0;
            fk.counts.unloads++;
            for (int j = 0; j < MAX_FUNCTIONS; j++)
                if (fk.functions[j].live && fk.functions[j].module == &fk.modules[i])
                    fk.functions[j].live = 0;
        }
    }
    for (int i = 0; i < MAX_HANDLES; i++) {
        if (fk.streams[i].live && fk.streams[i].ctx == c) {
            fk.streams[i].live = 0;
            fk.counts.streams_destroyed++;
        }
        if (fk.events[i].live && fk.events[i].ctx == c) {
            fk.events[i].live = 0;
            fk.counts.events_destroyed++;
        }
    }
    p->live = 0;
    fk.counts.contexts_destroyed++;
    if (fk.current == c)
        fk.current = NULL;
    return CUDA_SUCCESS;
}

/* The fake keeps no context stack: push sets, pop clears. */
static CUresult f_cuCtxPushCurrent(CUcontext c)
{
    FAKE_ENTRY("cuCtxPushCurrent");
    if (c != PRIMARY || !fk.retained)
        return err(CUDA_ERROR_INVALID_CONTEXT);
    fk.current = c;
    return CUDA_SUCCESS;
}

static CUresult f_cuCtxPopCurrent(CUcontext *c)
{
    FAKE_ENTRY("cuCtxPopCurrent");
    if (!fk.current)
        return err(CUDA_ERROR_INVALID_CONTEXT);
    if (c)
        *c = fk.current;
    fk.current = NULL;
    return CUDA_SUCCESS;
}

static CUresult f_cuCtxSynchronize(void)
{
    FAKE_ENTRY("cuCtxSynchronize");
    NEED_CONTEXT();
    return CUDA_SUCCESS;
}

/* ---- Modules and launches ------------------------------------------------------------------ */

static CUresult f_cuModuleLoadData(CUmodule *m, const void *image)
{
    FAKE_ENTRY("cuModuleLoadData");
    NEED_CONTEXT();
    /* A cubin (ELF) or PTX text (which the driver compiles: a comment first, then .version and
     * .target directives). */
    int ptx = image && memcmp(image, "//", 2) == 0 && strstr(image, "\n.version ") &&
              strstr(image, "\n.target ");
    if (!image || (memcmp(image,
                          "\x7f"
                          "ELF",
                          4) != 0 &&
                   !ptx)) {
        fk.counts.rejected_images++;
        return err(CUDA_ERROR_INVALID_IMAGE);
    }
    for (int i = 0; i < MAX_MODULES; i++) {
        if (!fk.modules[i].live) {
            fk.modules[i].live = 1;
            fk.modules[i].image = image;
            fk.modules[i].ctx = fk.current;
            fk.last_image = image;
            fk.counts.loads++;
            *m = (CUmodule)(void *)&fk.modules[i];
            return CUDA_SUCCESS;
        }
    }
    return err(CUDA_ERROR_OUT_OF_MEMORY);
}

static CUresult f_cuModuleUnload(CUmodule m)
{
    FAKE_ENTRY("cuModuleUnload");
    struct fake_module *p = (struct fake_module *)(void *)m;
    if (p < fk.modules || p >= fk.modules + MAX_MODULES || !p->live)
        return err(CUDA_ERROR_INVALID_HANDLE);
    p->live = 0;
    for (int i = 0; i < MAX_FUNCTIONS; i++)
        if (fk.functions[i].live && fk.functions[i].module == p)
            fk.functions[i].live = 0;
    fk.counts.unloads++;
    return CUDA_SUCCESS;
}

static CUresult f_cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    FAKE_ENTRY("cuModuleGetFunction");
    struct fake_module *p = (struct fake_module *)(void *)m;
    if (p < fk.modules || p >= fk.modules + MAX_MODULES || !p->live)
        return err(CUDA_ERROR_INVALID_HANDLE);
    if (!name || !*name || strlen(name) >= sizeof fk.functions[0].name)
        return err(CUDA_ERROR_NOT_FOUND);
    for (int i = 0; i < MAX_FUNCTIONS; i++) {
        struct fake_function *fn = &fk.functions[i];
        if (fn->live && fn->module == p && strcmp(fn->name, name) == 0) {
            *f = (CUfunction)(void *)fn;
            return CUDA_SUCCESS;
        }
    }
    for (int i = 0; i < MAX_FUNCTIONS; i++) {
        struct fake_function *fn = &fk.functions[i];
        if (!fn->live) {
            fn->live = 1;
            fn->module = p;
            strcpy(fn->name, name);
            fn->max_dynamic_smem = DEFAULT_SMEM;
            fk.counts.functions++;
            *f = (CUfunction)(void *)fn;
            return CUDA_SUCCESS;
        }
    }
    return err(CUDA_ERROR_OUT_OF_MEMORY);
}

static CUresult f_cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v)
{
    FAKE_ENTRY("cuFuncSetAttribute");
    struct fake_function *fn = function_of(f);
    if (!fn)
        return err(CUDA_ERROR_INVALID_HANDLE);
    if (a != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
        return CUDA_SUCCESS; /* other attributes: accepted, ignored */
    if (v < 0 || v > LJ_FAKE_SMEM_OPTIN)
        return err(CUDA_ERROR_INVALID_VALUE);
    fn->max_dynamic_smem = v;
    fk.counts.smem_attrs++;
    return CUDA_SUCCESS;
}

static CUresult f_cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f)
{
    FAKE_ENTRY("cuFuncGetAttribute");
    struct fake_function *fn = function_of(f);
    if (!fn)
        return err(CUDA_ERROR_INVALID_HANDLE);
    switch (a) {
        case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
        case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = 64; break;
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *v = fn->max_dynamic_smem; break;
        case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES:
        case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES:
        case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: *v = 0; break;
        case CU_FUNC_ATTRIBUTE_PTX_VERSION:
        case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *v = 90; break;
        default: return err(CUDA_ERROR_INVALID_VALUE);
    }
    return CUDA_SUCCESS;
}

/* Both launch entries: the checks and the record; pdl is 1 when cuLaunchKernelEx passed
 * programmatic stream serialization. */
static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned smem, CUstream stream, void **params,
                       void **extra, int pdl)
{
    NEED_CONTEXT();
    struct fake_function *fn = function_of(f);
    if (!fn)
        return err(CUDA_ERROR_INVALID_HANDLE);
    if (stream && !live_handle(fk.streams, stream))
        return err(CUDA_ERROR_INVALID_HANDLE);
    if (!gx || !gy || !gz || !bx || !by || !bz || gy > 65535 || gz > 65535 || bz > 64 ||
        (unsigned long long)bx * by * bz > 1024)
        return err(CUDA_ERROR_INVALID_VALUE);
    if ((int)smem > fn->max_dynamic_smem || smem > (unsigned)LJ_FAKE_SMEM_OPTIN)
        return err(CUDA_ERROR_INVALID_VALUE);
    if (!params || !params[0] || extra)
        return err(CUDA_ERROR_INVALID_VALUE);
    int captured = fk.capture_active && stream == fk.capturing;
    lj_fake_launch record, *l = &record;
    {
        memset(l, 0, sizeof *l);
        strcpy(l->entry, fn->name);
        l->grid[0] = gx;
        l->grid[1] = gy;
        l->grid[2] = gz;
        l->block[0] = bx;
        l->block[1] = by;
        l->block[2] = bz;
        l->smem = smem;
        l->stream = stream;
        l->captured = captured;
        l->pdl = pdl;
        memcpy(&l->params, params[0], sizeof l->params);
    }
    /* The kernel "runs": virtual time passes, and a kernel the test marks as faulting leaves
     * its context with a sticky error, seen by the next call (the launch itself succeeds, as
     * launches are asynchronous). */
    /* A captured kernel does not run: its time is spent when its graph is launched. */
    const double kernel_ms = fk.time_fn ? fk.time_fn(l, fk.time_user) : 0.001;
    if (captured)
        fk.capture_ms += kernel_ms;
    else
        fk.clock_ms += kernel_ms;
    if (fk.fault_fn && fk.fault_fn(l, fk.fault_user)) {
        if (fk.current == PRIMARY)
            fk.primary_sticky = fk.fault_result;
        else
            private_ctx(fk.current)->sticky = fk.fault_result;
        fk.counts.faults++;
    }
    if (fk.counts.launches < LJ_FAKE_MAX_LAUNCHES)
        fk.log[fk.counts.launches] = record;
    fk.counts.launches++;
    fk.counts.captured_launches += captured;
    fk.counts.pdl_launches += pdl;
    return CUDA_SUCCESS;
}

static CUresult f_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned smem, CUstream stream,
                                 void **params, void **extra)
{
    FAKE_ENTRY("cuLaunchKernel");
    return launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra, 0);
}

/* Attributes as the driver takes them: the programmatic stream serialization one is the only one
 * lajit passes, and the fake refuses it below compute capability 9.0 so that a test sees a launch
 * that should not have asked for it fail; any other attribute is refused too. */
static CUresult f_cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params,
                                   void **extra)
{
    FAKE_ENTRY("cuLaunchKernelEx");
    if (!c || (c->numAttrs && !c->attrs))
        return err(CUDA_ERROR_INVALID_VALUE);
    int pdl = 0;
    for (unsigned i = 0; i < c->numAttrs; i++) {
        if (c->attrs[i].id != CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
            return err(CUDA_ERROR_INVALID_VALUE);
        if (fk.cc_major < 9)
            return err(CUDA_ERROR_NOT_SUPPORTED);
        pdl = c->attrs[i].value.programmaticStreamSerializationAllowed != 0;
    }
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY,
                  c->blockDimZ, c->sharedMemBytes, c->hStream, params, extra, pdl);
}

/* ---- Memory -------------------------------------------------------------------------------- */

static CUresult f_cuMemAlloc(CUdeviceptr *p, size_t bytes)
{
    FAKE_ENTRY("cuMemAlloc");
    NEED_CONTEXT();
    if (bytes == 0)
        return err(CUDA_ERROR_INVALID_VALUE);
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (!fk.allocs[i]) {
            /* 256-byte aligned like cudaMalloc's guarantee, so alignment checks behave. */
            size_t rounded = (bytes + 255) & ~(size_t)255;
            void *mem = aligned_alloc(256, rounded);
            if (!mem)
                return err(CUDA_ERROR_OUT_OF_MEMORY);
            fk.allocs[i] = mem;
            fk.alloc_sizes[i] = bytes;
            fk.alloc_ctx[i] = fk.current;
            fk.counts.allocs++;
            *p = (CUdeviceptr)(uintptr_t)mem;
            return CUDA_SUCCESS;
        }
    }
    return err(CUDA_ERROR_OUT_OF_MEMORY);
}

static CUresult f_cuMemFree(CUdeviceptr p)
{
    FAKE_ENTRY("cuMemFree");
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (fk.allocs[i] && (uintptr_t)fk.allocs[i] == p) {
            free(fk.allocs[i]);
            fk.allocs[i] = NULL;
            fk.counts.frees++;
            return CUDA_SUCCESS;
        }
    }
    return err(CUDA_ERROR_INVALID_VALUE);
}

static CUresult f_cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t bytes)
{
    FAKE_ENTRY("cuMemcpyHtoD");
    NEED_CONTEXT();
    if (find_alloc(dst, bytes) < 0)
        return err(CUDA_ERROR_INVALID_VALUE);
    memcpy((void *)(uintptr_t)dst, src, bytes);
    fk.counts.htod_copies++;
    return CUDA_SUCCESS;
}

static CUresult f_cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t bytes, CUstream s)
{
    FAKE_ENTRY("cuMemcpyHtoDAsync");
    NEED_CONTEXT();
    if ((s && !live_handle(fk.streams, s)) || find_alloc(dst, bytes) < 0)
        return err(CUDA_ERROR_INVALID_VALUE);
    memcpy((void *)(uintptr_t)dst, src, bytes);
    fk.counts.htod_async_copies++;
    fk.last_htod_stream = s;
    return CUDA_SUCCESS;
}

CUstream lj_fake_last_htod_stream(void)
{
    return fk.last_htod_stream;
}

static CUresult f_cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t bytes)
{
    FAKE_ENTRY("cuMemcpyDtoH");
    NEED_CONTEXT();
    if (find_alloc(src, bytes) < 0)
        return err(CUDA_ERROR_INVALID_VALUE);
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    return CUDA_SUCCESS;
}

static CUresult f_cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t bytes, CUstream s)
{
    FAKE_ENTRY("cuMemcpyDtoHAsync");
    NEED_CONTEXT();
    if ((s && !live_handle(fk.streams, s)) || find_alloc(src, bytes) < 0)
        return err(CUDA_ERROR_INVALID_VALUE);
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    return CUDA_SUCCESS;
}

static CUresult f_cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s)
{
    FAKE_ENTRY("cuMemcpyDtoDAsync");
    NEED_CONTEXT();
    if ((s && !live_handle(fk.streams, s)) || find_alloc(src, bytes) < 0 ||
        find_alloc(dst, bytes) < 0)
        return err(CUDA_ERROR_INVALID_VALUE);
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
    if (fk.counts.dtod_copies < LJ_FAKE_MAX_LAUNCHES)
        fk.copies[fk.counts.dtod_copies] = (lj_fake_copy){dst, src, bytes, s, fk.counts.launches};
    fk.counts.dtod_copies++;
    return CUDA_SUCCESS;
}

static CUresult f_cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n)
{
    FAKE_ENTRY("cuMemsetD8");
    NEED_CONTEXT();
    if (find_alloc(dst, n) < 0)
        return err(CUDA_ERROR_INVALID_VALUE);
    memset((void *)(uintptr_t)dst, v, n);
    return CUDA_SUCCESS;
}

static CUresult f_cuMemsetD32(CUdeviceptr dst, unsigned int v, size_t n)
{
    FAKE_ENTRY("cuMemsetD32");
    NEED_CONTEXT();
    if (dst % 4 || n > SIZE_MAX / 4 || find_alloc(dst, n * 4) < 0)
        return err(CUDA_ERROR_INVALID_VALUE);
    for (size_t i = 0; i < n; i++)
        memcpy((char *)(uintptr_t)dst + 4 * i, &v, 4);
    return CUDA_SUCCESS;
}

static CUresult f_cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s)
{
    FAKE_ENTRY("cuMemsetD32Async");
    NEED_CONTEXT();
    if ((s && !live_handle(fk.streams, s)) || dst % 4 || n > SIZE_MAX / 4 ||
        find_alloc(dst, n * 4) < 0)
        return err(CUDA_ERROR_INVALID_VALUE);
    for (size_t i = 0; i < n; i++)
        memcpy((char *)(uintptr_t)dst + 4 * i, &v, 4);
    return CUDA_SUCCESS;
}

static CUresult f_cuMemGetInfo(size_t *free_bytes, size_t *total)
{
    FAKE_ENTRY("cuMemGetInfo");
    NEED_CONTEXT();
    *total = (size_t)141 << 30;
    *free_bytes = (size_t)140 << 30;
    return CUDA_SUCCESS;
}

static CUresult f_cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p)
{
    FAKE_ENTRY("cuPointerGetAttribute");
    if (find_alloc(p, 0) < 0)
        return err(CUDA_ERROR_INVALID_VALUE);
    switch (a) {
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = 0; break;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)data = CU_MEMORYTYPE_DEVICE; break;
        case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = PRIMARY; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = p; break;
        default: return err(CUDA_ERROR_INVALID_VALUE);
    }
    return CUDA_SUCCESS;
}

/* ---- Streams, graphs, events ---------------------------------------------------------------- */

static CUresult f_cuStreamCreate(CUstream *s, unsigned int flags)
{
    FAKE_ENTRY("cuStreamCreate");
    NEED_CONTEXT();
    void *h = take_handle(fk.streams, &fk.counts.streams_created);
    if (!h)
        return err(CUDA_ERROR_OUT_OF_MEMORY);
    *s = (CUstream)h;
    return CUDA_SUCCESS;
}

static CUresult f_cuStreamDestroy(CUstream s)
{
    FAKE_ENTRY("cuStreamDestroy");
    if (fk.capture_active && s == fk.capturing)
        return err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    return give_handle(fk.streams, s, &fk.counts.streams_destroyed)
               ? CUDA_SUCCESS
               : err(CUDA_ERROR_INVALID_HANDLE);
}

static CUresult f_cuStreamSynchronize(CUstream s)
{
    FAKE_ENTRY("cuStreamSynchronize");
    NEED_CONTEXT();
    if (s && !live_handle(fk.streams, s))
        return err(CUDA_ERROR_INVALID_HANDLE);
    if (fk.capture_active && s == fk.capturing)
        return err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED); /* syncing a capturing stream */
    return CUDA_SUCCESS;
}

static CUresult f_cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode)
{
    FAKE_ENTRY("cuStreamBeginCapture");
    NEED_CONTEXT();
    if (!s || !live_handle(fk.streams, s) || fk.capture_active)
        return err(CUDA_ERROR_INVALID_VALUE); /* the legacy stream cannot be captured */
    fk.capture_active = 1;
    fk.capturing = s;
    fk.capture_ms = 0;
    fk.counts.captures_begun++;
    return CUDA_SUCCESS;
}

static CUresult f_cuStreamEndCapture(CUstream s, CUgraph *g)
{
    FAKE_ENTRY("cuStreamEndCapture");
    if (!fk.capture_active || s != fk.capturing)
        return err(CUDA_ERROR_ILLEGAL_STATE);
    fk.capture_active = 0;
    fk.capturing = NULL;
    fk.counts.captures_ended++;
    int dummy = 0;
    void *h = take_handle(fk.graphs, &dummy);
    if (!h)
        return err(CUDA_ERROR_OUT_OF_MEMORY);
    ((struct fake_handle *)h)->t = fk.capture_ms;
    *g = (CUgraph)h;
    return CUDA_SUCCESS;
}

static CUresult f_cuGraphInstantiate(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
    FAKE_ENTRY("cuGraphInstantiate");
    if (!live_handle(fk.graphs, g))
        return err(CUDA_ERROR_INVALID_HANDLE);
    void *h = take_handle(fk.execs, &fk.counts.graphs_instantiated);
    if (!h)
        return err(CUDA_ERROR_OUT_OF_MEMORY);
    ((struct fake_handle *)h)->t = ((struct fake_handle *)(void *)g)->t;
    *e = (CUgraphExec)h;
    return CUDA_SUCCESS;
}

static CUresult f_cuGraphLaunch(CUgraphExec e, CUstream s)
{
    FAKE_ENTRY("cuGraphLaunch");
    if (!live_handle(fk.execs, e) || (s && !live_handle(fk.streams, s)))
        return err(CUDA_ERROR_INVALID_HANDLE);
    fk.counts.graph_launches++;
    fk.clock_ms += ((struct fake_handle *)(void *)e)->t;
    return CUDA_SUCCESS;
}

static CUresult f_cuGraphExecDestroy(CUgraphExec e)
{
    FAKE_ENTRY("cuGraphExecDestroy");
    return give_handle(fk.execs, e, &fk.counts.graph_execs_destroyed)
               ? CUDA_SUCCESS
               : err(CUDA_ERROR_INVALID_HANDLE);
}

static CUresult f_cuGraphDestroy(CUgraph g)
{
    FAKE_ENTRY("cuGraphDestroy");
    return give_handle(fk.graphs, g, &fk.counts.graphs_destroyed) ? CUDA_SUCCESS
                                                                  : err(CUDA_ERROR_INVALID_HANDLE);
}

static CUresult f_cuEventCreate(CUevent *e, unsigned int flags)
{
    FAKE_ENTRY("cuEventCreate");
    NEED_CONTEXT();
    void *h = take_handle(fk.events, &fk.counts.events_created);
    if (!h)
        return err(CUDA_ERROR_OUT_OF_MEMORY);
    *e = (CUevent)h;
    return CUDA_SUCCESS;
}

static CUresult f_cuEventDestroy(CUevent e)
{
    FAKE_ENTRY("cuEventDestroy");
    return give_handle(fk.events, e, &fk.counts.events_destroyed) ? CUDA_SUCCESS
                                                                  : err(CUDA_ERROR_INVALID_HANDLE);
}

static CUresult f_cuEventRecord(CUevent e, CUstream s)
{
    FAKE_ENTRY("cuEventRecord");
    NEED_CONTEXT();
    if (!live_handle(fk.events, e) || (s && !live_handle(fk.streams, s)))
        return err(CUDA_ERROR_INVALID_HANDLE);
    ((struct fake_handle *)(void *)e)->t = fk.clock_ms;
    return CUDA_SUCCESS;
}

static CUresult f_cuEventSynchronize(CUevent e)
{
    FAKE_ENTRY("cuEventSynchronize");
    NEED_CONTEXT();
    return live_handle(fk.events, e) ? CUDA_SUCCESS : err(CUDA_ERROR_INVALID_HANDLE);
}

/* Every pair of events is 1 ms apart, unless a kernel-time function is set: then the virtual
 * time between the two records. */
static CUresult f_cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    FAKE_ENTRY("cuEventElapsedTime");
    if (!live_handle(fk.events, a) || !live_handle(fk.events, b))
        return err(CUDA_ERROR_INVALID_HANDLE);
    *ms = fk.time_fn
              ? (float)(((struct fake_handle *)(void *)b)->t - ((struct fake_handle *)(void *)a)->t)
              : 1.0f;
    return CUDA_SUCCESS;
}

/* ---- The table ------------------------------------------------------------------------------ */

/* Member names go through cuda.h's version macros exactly as in lj_driver's declaration. */
static const lj_driver fake_table = {
    .cuInit = f_cuInit,
    .cuDriverGetVersion = f_cuDriverGetVersion,
    .cuGetErrorName = f_cuGetErrorName,
    .cuGetErrorString = f_cuGetErrorString,
    .cuDeviceGetCount = f_cuDeviceGetCount,
    .cuDeviceGet = f_cuDeviceGet,
    .cuDeviceGetName = f_cuDeviceGetName,
    .cuDeviceGetAttribute = f_cuDeviceGetAttribute,
    .cuDevicePrimaryCtxRetain = f_cuDevicePrimaryCtxRetain,
    .cuDevicePrimaryCtxRelease = f_cuDevicePrimaryCtxRelease,
    .cuCtxGetCurrent = f_cuCtxGetCurrent,
    .cuCtxSetCurrent = f_cuCtxSetCurrent,
    .cuCtxPushCurrent = f_cuCtxPushCurrent,
    .cuCtxPopCurrent = f_cuCtxPopCurrent,
    .cuCtxSynchronize = f_cuCtxSynchronize,
    .cuCtxCreate = f_cuCtxCreate,
    .cuCtxDestroy = f_cuCtxDestroy,
    .cuModuleLoadData = f_cuModuleLoadData,
    .cuModuleUnload = f_cuModuleUnload,
    .cuModuleGetFunction = f_cuModuleGetFunction,
    .cuFuncSetAttribute = f_cuFuncSetAttribute,
    .cuFuncGetAttribute = f_cuFuncGetAttribute,
    .cuLaunchKernel = f_cuLaunchKernel,
    .cuLaunchKernelEx = f_cuLaunchKernelEx,
    .cuMemAlloc = f_cuMemAlloc,
    .cuMemFree = f_cuMemFree,
    .cuMemcpyHtoD = f_cuMemcpyHtoD,
    .cuMemcpyHtoDAsync = f_cuMemcpyHtoDAsync,
    .cuMemcpyDtoH = f_cuMemcpyDtoH,
    .cuMemcpyDtoHAsync = f_cuMemcpyDtoHAsync,
    .cuMemcpyDtoDAsync = f_cuMemcpyDtoDAsync,
    .cuMemsetD8 = f_cuMemsetD8,
    .cuMemsetD32 = f_cuMemsetD32,
    .cuMemGetInfo = f_cuMemGetInfo,
    .cuMemsetD32Async = f_cuMemsetD32Async,
    .cuPointerGetAttribute = f_cuPointerGetAttribute,
    .cuStreamCreate = f_cuStreamCreate,
    .cuStreamDestroy = f_cuStreamDestroy,
    .cuStreamSynchronize = f_cuStreamSynchronize,
    .cuStreamBeginCapture = f_cuStreamBeginCapture,
    .cuStreamEndCapture = f_cuStreamEndCapture,
    .cuGraphInstantiate = f_cuGraphInstantiate,
    .cuGraphLaunch = f_cuGraphLaunch,
    .cuGraphExecDestroy = f_cuGraphExecDestroy,
    .cuGraphDestroy = f_cuGraphDestroy,
    .cuEventCreate = f_cuEventCreate,
    .cuEventDestroy = f_cuEventDestroy,
    .cuEventRecord = f_cuEventRecord,
    .cuEventSynchronize = f_cuEventSynchronize,
    .cuEventElapsedTime = f_cuEventElapsedTime,
};

const lj_driver *lj_fake_driver(void)
{
    return &fake_table;
}

void lj_fake_driver_reset(void)
{
    for (int i = 0; i < MAX_ALLOCS; i++)
        free(fk.allocs[i]);
    memset(&fk, 0, sizeof fk);
    fk.device_count = 1;
    fk.init_result = CUDA_SUCCESS;
    fk.cc_major = 9;
}

const lj_fake_counts *lj_fake_driver_counts(void)
{
    return &fk.counts;
}

int lj_fake_driver_balanced(void)
{
    const lj_fake_counts *c = &fk.counts;
    int graphs = 0;
    for (int i = 0; i < MAX_HANDLES; i++)
        graphs += fk.graphs[i].live;
    return c->retains == c->releases && c->contexts_created == c->contexts_destroyed &&
           c->loads == c->unloads && c->allocs == c->frees &&
           c->streams_created == c->streams_destroyed && c->events_created == c->events_destroyed &&
           c->graphs_instantiated == c->graph_execs_destroyed && graphs == 0 && !fk.capture_active;
}

const lj_fake_copy *lj_fake_copy_get(int i)
{
    return i >= 0 && i < fk.counts.dtod_copies && i < LJ_FAKE_MAX_LAUNCHES ? &fk.copies[i] : NULL;
}

int lj_fake_launch_count(void)
{
    return fk.counts.launches;
}

int lj_fake_memory_holds(CUdeviceptr p, size_t bytes)
{
    return find_alloc(p, bytes) >= 0;
}

const lj_fake_launch *lj_fake_launch_get(int i)
{
    if (i < 0 || i >= fk.counts.launches || i >= LJ_FAKE_MAX_LAUNCHES)
        return NULL;
    return &fk.log[i];
}

void lj_fake_driver_set_device_count(int n)
{
    fk.device_count = n;
}

void lj_fake_driver_set_cc(int major, int minor)
{
    fk.cc_major = major;
    fk.cc_minor = minor;
}

void lj_fake_driver_set_init_result(CUresult r)
{
    fk.init_result = r;
}

void lj_fake_driver_fail(const char *fn, CUresult r)
{
    fk.fail_name[0] = '\0';
    if (fn) {
        strncpy(fk.fail_name, fn, sizeof fk.fail_name - 1);
        fk.fail_name[sizeof fk.fail_name - 1] = '\0';
    }
    fk.fail_result = r;
}

void lj_fake_driver_fault_launches(lj_fake_fault_fn fn, void *user, CUresult r)
{
    fk.fault_fn = fn;
    fk.fault_user = user;
    fk.fault_result = r;
}

void lj_fake_driver_set_kernel_time(lj_fake_time_fn fn, void *user)
{
    fk.time_fn = fn;
    fk.time_user = user;
}

const void *lj_fake_last_image(void)
{
    return fk.last_image;
}

/* TEMPORARY: the arch table lives in generator/family.c (another stage). Until that file is
 * merged, tests that open a device need this fallback; the real definition, when linked,
 * replaces it. Delete this once generator/family.c defines lj_arch_for_cc. */
__attribute__((weak)) void lj_arch_for_cc(int cc, char arch[16])
{
    if (cc == 90 || cc == 100 || cc == 101 || cc == 103)
        snprintf(arch, 16, "sm_%da", cc);
    else
        snprintf(arch, 16, "sm_%d", cc);
}
