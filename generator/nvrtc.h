/* nvrtc.h — compiling expanded CUDA text to a cubin (or PTX) with NVRTC, loaded with dlopen only
 * when a compile is needed. Works with no GPU and no driver. The compile log (and ptxas's
 * resource report, -v) is parsed for registers, spills, shared memory and stack. Independent
 * compiles may run on several threads, each with its own lj_env. */
#ifndef LAJIT_NVRTC_H
#define LAJIT_NVRTC_H

#include "core.h"

/* An in-memory header handed to NVRTC ("common/types.cuh" and its text). */
typedef struct lj_header {
    const char *name;
    const char *text;
    size_t len;
} lj_header;

typedef struct lj_compiled {
    void *image; /* cubin, or PTX text when ptx was requested (NUL-terminated) */
    size_t image_size;
    char *log;        /* NVRTC's log (may be ""), owned */
    int regs;         /* registers per thread, -1 unknown */
    int spill_stores; /* bytes */
    int spill_loads;
    int stack_bytes;
    int smem_static; /* static shared memory, bytes */
} lj_compiled;

/* Loads NVRTC (once per process; thread-safe) and reports its version. LAJIT_ERR_NO_COMPILER
 * when it cannot be loaded (message names what was tried). LAJIT_NVRTC_PATH overrides the
 * library path (tests point it at a missing file). */
lajit_status lj_nvrtc_version(lj_env *env, int *major, int *minor);

/* The fixed options lajit compiles with for arch (e.g. "--gpu-architecture=sm_90a", "-std=c++17",
 * "--use_fast_math" is NOT used, "-default-device", "--ptxas-options=-v"). They enter the cache
 * key. Static strings; returns the count. */
int lj_nvrtc_options(const char *arch, int ptx, const char **opts, int cap);

/* Compiles source (named name, e.g. "la_fwd/fwd.cu") with the headers for arch. ptx != 0 asks
 * for PTX instead of a cubin. LAJIT_ERR_COMPILE with a log excerpt (first errors) in errmsg. */
lajit_status lj_nvrtc_compile(lj_env *env, const char *name, const char *source,
                              const lj_header *headers, int n_headers, const char *arch, int ptx,
                              lj_compiled *out);
void lj_compiled_free(lj_env *env, lj_compiled *c);

#endif
