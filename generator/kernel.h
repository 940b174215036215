/* kernel.h — from (family, config, problem, arch) to a kernel: expand the template and compute
 * the cache key over every byte NVRTC would see (prepare), then compile it with NVRTC, alone or
 * many at once on worker threads. Which cache level serves a kernel is levels.h's
 * lj_kernel_fetch (the op path); the CLI and the tuner prepare, look up the cache and compile
 * in parallel themselves. */
#ifndef LAJIT_KERNEL_H
#define LAJIT_KERNEL_H

#include "cache.h"
#include "family.h"

/* The in-memory headers of templates/common (from the template dir or the embedded copy), in
 * path order, named "common/<file>". Texts are borrowed from L;
 * the list and its names are freed with lj_kernel_headers_free. */
lajit_status lj_kernel_headers(lj_lua *L, lj_header **headers, int *count);
void lj_kernel_headers_free(lj_lua *L, lj_header *headers, int count);

/* A kernel in two phases, so independent compiles can run on several threads: prepare
 * (expansion and key; uses L, so one thread), then compile (NVRTC only; any thread, with its
 * own env), then store the result in the cache (one thread). */
typedef struct lj_kernel_job {
    char *source;
    lj_header *headers;
    int n_headers;
    const char *options[16];
    int n_options;
    int nvrtc_major, nvrtc_minor;
    char arch[16];
    char name[64];
    int ptx;
    lj_key key;        /* the cache key (with the NVRTC version) */
    lj_key source_key; /* the same without the NVRTC version: how bundles find kernels */
} lj_kernel_job;

lajit_status lj_kernel_prepare(lj_lua *L, lj_family *f, const lj_config *cfg, const lj_problem *p,
                               const lj_device_info *device, int ptx, lj_kernel_job *job);
/* The same; with require_nvrtc 0 a missing NVRTC is not an error: job->nvrtc_major is then -1,
 * job->key is unset and only job->source_key (and the expansion) may be used (bundle lookups). */
lajit_status lj_kernel_prepare_ex(lj_lua *L, lj_family *f, const lj_config *cfg,
                                  const lj_problem *p, const lj_device_info *device, int ptx,
                                  int require_nvrtc, lj_kernel_job *job);
lajit_status lj_kernel_compile(lj_env *env, const lj_kernel_job *job, lj_compiled *out);
void lj_kernel_job_free(lj_lua *L, lj_kernel_job *job);

/* Many compiles on worker threads: each task with a job runs lj_kernel_compile on one of up to
 * `threads` threads (0: 4; at most 16). Tasks with job NULL are skipped. On return every task's
 * status, compiled, error text and seconds are filled. Every host allocation of the compiles
 * goes through env's allocator (and its fault injection), called only on the calling thread:
 * workers hand their allocations to it while it waits for them (kernel.c says how), so a
 * user's allocator is never called from another thread. The compiled images belong to env:
 * give each back with lj_compile_task_free(env, ...). Used by `lajit compile`, `lajit gen` and
 * the tuner. */
typedef struct lj_compile_task {
    const lj_kernel_job *job;
    lj_compiled compiled;
    lajit_status status;
    char error[1024];
    double seconds;
} lj_compile_task;
void lj_kernel_compile_parallel(lj_env *env, lj_compile_task *tasks, int n, int threads);
void lj_compile_task_free(lj_env *env, lj_compile_task *task);

/* Key only (expansion + key), for listing and tests. */
lajit_status lj_kernel_key(lj_lua *L, lj_family *f, const lj_config *cfg, const lj_problem *p,
                           const lj_device_info *device, int ptx, lj_key *out);

#endif
