/* fake_driver.h — an lj_driver table with no GPU behind it, for CPU tests of the launch path.
 *
 * One device, "lajit fake sm_90": compute capability 9.0 (lj_fake_driver_set_cc sets another),
 * 132 SMs, 227 KiB opt-in shared memory per block, 228 KiB per SM, 64 Ki registers per SM,
 * 50 MiB of L2, driver 13000.
 * - Device memory is host memory: cuMemAlloc returns a malloc'ed block as a CUdeviceptr, so a
 *   test can read and write it directly; cuMemcpy* and cuMemset* operate on it.
 * - cuModuleLoadData accepts any image starting with "\x7fELF" (CUDA_ERROR_INVALID_IMAGE
 *   otherwise); cuModuleGetFunction succeeds for any name and remembers it.
 * - cuLaunchKernel checks its arguments as the driver would (live function, nonzero grid, at
 *   most 1024 threads, dynamic shared memory within the function's limit, a current context)
 *   and records the launch, with the bytes of its first kernel parameter (an la_params).
 *   cuLaunchKernelEx does the same and records whether programmatic stream serialization was
 *   asked for (refused with CUDA_ERROR_NOT_SUPPORTED below cc 9.0, as any other attribute is).
 * - Streams, events and graphs are handles that do nothing; a launch during stream capture is
 *   recorded with captured = 1. Events read a virtual clock that launches advance (by the
 *   kernel-time function when one is set; elapsed times are 1 ms when none is).
 * - cuCtxCreate makes private contexts (current at once); destroying one frees the memory,
 *   modules, streams and events made in it. A launch the fault function picks "faults": it
 *   succeeds, and its context then fails every call needing it with the sticky error until
 *   destroyed, as an illegal address does on a GPU.
 * - Calls that need a context (memory, modules, launches) fail with CUDA_ERROR_INVALID_CONTEXT
 *   unless the primary context has been made current, as with the real driver.
 * The fake counts everything taken and given back so tests can assert that every path,
 * failures included, is balanced. State is process-wide and not thread-safe: one test case
 * per process, as the harness runs them. */
#ifndef LAJIT_FAKE_DRIVER_H
#define LAJIT_FAKE_DRIVER_H

#include "driver.h"
#include "la_params.h"

#define LJ_FAKE_MAX_LAUNCHES 256
#define LJ_FAKE_SMEM_OPTIN   (227 * 1024)

typedef struct lj_fake_launch {
    char entry[64]; /* the function's name */
    unsigned grid[3], block[3];
    unsigned smem; /* dynamic shared memory bytes */
    CUstream stream;
    int captured;     /* launched while a stream capture was active */
    int pdl;          /* cuLaunchKernelEx with programmatic stream serialization allowed */
    la_params params; /* the first kernel parameter's bytes */
} lj_fake_launch;

/* A recorded cuMemcpyDtoDAsync (device-to-device copies: the simulated ranks' exchange). */
typedef struct lj_fake_copy {
    CUdeviceptr dst, src;
    size_t bytes;
    CUstream stream;
    int after_launches; /* launches recorded before it: its place in the sequence */
} lj_fake_copy;

typedef struct lj_fake_counts {
    int inits;
    int retains, releases; /* primary context */
    int set_current;       /* cuCtxSetCurrent calls */
    int loads, unloads;    /* successful module loads; unloads of live modules */
    int rejected_images;   /* cuModuleLoadData refusals */
    int functions;         /* cuModuleGetFunction successes */
    int smem_attrs;        /* cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) */
    int allocs, frees;
    int dtod_copies; /* cuMemcpyDtoDAsync calls that succeeded (the log keeps the first 256) */
    int htod_copies, htod_async_copies; /* cuMemcpyHtoD / cuMemcpyHtoDAsync that succeeded */
    int launches;                       /* all successful launches (the log keeps the first 256) */
    int captured_launches;
    int pdl_launches; /* launches with programmatic stream serialization */
    int streams_created, streams_destroyed;
    int events_created, events_destroyed;
    int captures_begun, captures_ended;
    int graphs_instantiated, graph_launches, graph_execs_destroyed, graphs_destroyed;
    int errors; /* calls that returned an error (misuse, injected failures) */
    int contexts_created, contexts_destroyed; /* private contexts (cuCtxCreate) */
    int faults;                               /* launches the fault function made fault */
} lj_fake_counts;

/* The stream of the last successful cuMemcpyHtoDAsync. */
CUstream lj_fake_last_htod_stream(void);

/* The table. Its state starts reset. */
const lj_driver *lj_fake_driver(void);

/* Forgets everything (frees fake device memory and modules), restores the defaults. */
void lj_fake_driver_reset(void);

const lj_fake_counts *lj_fake_driver_counts(void);
/* 1 when every retain, load, allocation, stream, event, graph and exec was given back. */
int lj_fake_driver_balanced(void);

/* Recorded launches, oldest first: count, and the i-th (NULL when out of range or beyond the
 * log's capacity). */
int lj_fake_launch_count(void);
const lj_fake_launch *lj_fake_launch_get(int i);

/* The i-th successful cuMemcpyDtoDAsync, oldest first (NULL when out of range or beyond 256). */
const lj_fake_copy *lj_fake_copy_get(int i);

/* 1 when [p, p + bytes) lies inside one live allocation of fake device memory: a test can hold a
 * recorded launch's tensor arguments to the buffers they point into (the fake runs no kernel, so
 * nothing else would notice a view reaching past its allocation). */
int lj_fake_memory_holds(CUdeviceptr p, size_t bytes);

/* Configuration: the number of devices cuDeviceGetCount reports (default 1); what cuInit
 * returns (default CUDA_SUCCESS); and a failure injected by name: every later call of the entry
 * named fn (its base name, "cuModuleLoadData") returns r. fn NULL clears it. */
void lj_fake_driver_set_device_count(int n);
/* The compute capability the device reports (default 9.0); before the context opens it. */
void lj_fake_driver_set_cc(int major, int minor);
void lj_fake_driver_set_init_result(CUresult r);
void lj_fake_driver_fail(const char *fn, CUresult r);

/* Launches for which fn returns nonzero fault with r (sticky, see above); fn NULL: none. */
typedef int (*lj_fake_fault_fn)(const lj_fake_launch *launch, void *user);
void lj_fake_driver_fault_launches(lj_fake_fault_fn fn, void *user, CUresult r);
/* The time in ms a launch takes on the virtual clock; fn NULL: 0.001 ms and elapsed times of
 * 1 ms (the default). */
typedef double (*lj_fake_time_fn)(const lj_fake_launch *launch, void *user);
void lj_fake_driver_set_kernel_time(lj_fake_time_fn fn, void *user);

/* The image the last successful cuModuleLoadData received (NULL before any). */
const void *lj_fake_last_image(void);

#endif
