/* nvrtc.c — NVRTC compile without a GPU: cubins for every target arch, PTX, compile errors with
 * the error line in errmsg, a missing NVRTC (LAJIT_NVRTC_PATH), and every NVRTC call failed in
 * turn by fault injection (a failure status each time, never a crash or a leak under ASan);
 * parallel compiles allocating through the caller's allocator, every allocation failed in turn. */
#include <pthread.h>
#include <stdlib.h>

#include "cache_helpers.h"
#include "kernel.h"
#include "nvrtc.h"
#include "test.h"

static const char k_header[] = "#pragma once\n"
                               "__device__ inline float lj_twice(float x) { return 2.0f * x; }\n";

static const char k_source[] = "#include \"common/x.cuh\"\n"
                               "extern \"C\" __global__ void k(float *out, float a)\n"
                               "{\n"
                               "    __shared__ float buf[64];\n"
                               "    buf[threadIdx.x] = lj_twice(a) + threadIdx.x;\n"
                               "    __syncthreads();\n"
                               "    out[threadIdx.x] = buf[63 - threadIdx.x];\n"
                               "}\n";

static lj_header header(void)
{
    lj_header h = {"common/x.cuh", k_header, sizeof k_header - 1};
    return h;
}

static void compile_cubin(const char *arch)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_DEBUG);
    lj_header h = header();
    lj_compiled c;
    lajit_status s = lj_nvrtc_compile(&env, "test/x.cu", k_source, &h, 1, arch, 0, &c);
    if (s != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", arch, env.errmsg);
    ASSERT_TRUE(c.image_size > 4);
    ASSERT_TRUE(memcmp(c.image,
                       "\x7f"
                       "ELF",
                       4) == 0);
    ASSERT_TRUE(c.log != NULL);
    ASSERT_TRUE(c.regs >= 0);
    ASSERT_EQ(c.smem_static, 64 * 4);
    ASSERT_EQ(c.spill_stores, 0);
    ASSERT_EQ(c.spill_loads, 0);
    lj_compiled_free(&env, &c);
}

LJ_TEST(cubin_sm_80)
{
    compile_cubin("sm_80");
}

LJ_TEST(cubin_sm_90a)
{
    compile_cubin("sm_90a");
}

LJ_TEST(cubin_sm_100a)
{
    compile_cubin("sm_100a");
}

LJ_TEST(cubin_sm_120)
{
    compile_cubin("sm_120");
}

LJ_TEST(ptx_output)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_DEBUG);
    lj_header h = header();
    lj_compiled c;
    ASSERT_OK(lj_nvrtc_compile(&env, "test/x.cu", k_source, &h, 1, "sm_90a", 1, &c));
    const char *ptx = c.image;
    ASSERT_EQ(ptx[c.image_size], 0);
    ASSERT_CONTAINS(ptx, ".target sm_90a");
    ASSERT_CONTAINS(ptx, ".entry k");
    ASSERT_EQ(c.regs, -1); /* no ptxas ran: nothing to report */
    lj_compiled_free(&env, &c);
}

LJ_TEST(options)
{
    const char *o[8];
    int n = lj_nvrtc_options("sm_90a", 0, o, 8);
    ASSERT_TRUE(n >= 5);
    ASSERT_STREQ(o[0], "--gpu-architecture=sm_90a");
    int has_v = 0;
    for (int i = 0; i < n; i++)
        has_v |= strcmp(o[i], "--ptxas-options=-v") == 0;
    ASSERT_TRUE(has_v);
    n = lj_nvrtc_options("sm_90a", 1, o, 8);
    ASSERT_STREQ(o[0], "--gpu-architecture=compute_90a");
    for (int i = 0; i < n; i++)
        ASSERT_TRUE(strcmp(o[i], "--ptxas-options=-v") != 0);
    ASSERT_EQ(lj_nvrtc_options("sm_42", 0, o, 8), 0);
    /* A short array gets the first entries; the count is still the whole. */
    ASSERT_EQ(lj_nvrtc_options("sm_80", 0, o, 1), lj_nvrtc_options("sm_80", 0, NULL, 0));

    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_DEBUG);
    lj_compiled c;
    ASSERT_STATUS(lj_nvrtc_compile(&env, "x.cu", k_source, NULL, 0, "sm_42", 0, &c),
                  LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(env.errmsg, "sm_42");
}

LJ_TEST(version)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_DEBUG);
    int major = 0, minor = -1;
    ASSERT_OK(lj_nvrtc_version(&env, &major, &minor));
    ASSERT_TRUE(major >= 12);
    ASSERT_TRUE(minor >= 0);
}

LJ_TEST(compile_error)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_DEBUG);
    const char *bad = "extern \"C\" __global__ void k(float *out)\n"
                      "{\n"
                      "    out[0] = undeclared_thing;\n"
                      "}\n";
    lj_compiled c;
    memset(&c, 0x5a, sizeof c);
    ASSERT_STATUS(lj_nvrtc_compile(&env, "la_bad/bad.cu", bad, NULL, 0, "sm_90a", 0, &c),
                  LAJIT_ERR_COMPILE);
    ASSERT_TRUE(strncmp(env.errmsg, "la_bad/bad.cu: ", 15) == 0);
    ASSERT_CONTAINS(env.errmsg, "error");
    ASSERT_CONTAINS(env.errmsg, "undeclared_thing");
    ASSERT_CONTAINS(env.errmsg, "la_bad/bad.cu(3)"); /* points at the line */
    /* Outputs are written only on success. */
    unsigned char poison[sizeof c];
    memset(poison, 0x5a, sizeof poison);
    ASSERT_TRUE(memcmp(&c, poison, sizeof c) == 0);
    ASSERT_EQ(lj_nvrtc_live_programs(), 0);
}

LJ_TEST(missing_header_is_compile_error)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_DEBUG);
    lj_compiled c;
    ASSERT_STATUS(lj_nvrtc_compile(&env, "x.cu", k_source, NULL, 0, "sm_80", 0, &c),
                  LAJIT_ERR_COMPILE);
    ASSERT_CONTAINS(env.errmsg, "common/x.cuh");
}

LJ_TEST(no_compiler)
{
    setenv("LAJIT_NVRTC_PATH", "/nonexistent/libnvrtc.so", 1);
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_DEBUG);
    int major, minor;
    ASSERT_STATUS(lj_nvrtc_version(&env, &major, &minor), LAJIT_ERR_NO_COMPILER);
    ASSERT_CONTAINS(env.errmsg, "/nonexistent/libnvrtc.so");
    lj_header h = header();
    lj_compiled c;
    ASSERT_STATUS(lj_nvrtc_compile(&env, "x.cu", k_source, &h, 1, "sm_80", 0, &c),
                  LAJIT_ERR_NO_COMPILER);
    /* Loading is decided once per process: unsetting the override does not bring NVRTC back. */
    unsetenv("LAJIT_NVRTC_PATH");
    ASSERT_STATUS(lj_nvrtc_version(&env, &major, &minor), LAJIT_ERR_NO_COMPILER);
}

/* Fails the N-th NVRTC call for N = 1, 2, ... until a run succeeds. Every run before must
 * return a failure status with a message and leave the output untouched; ASan checks that no
 * program or buffer leaks. Covers the cubin and the PTX path. */
static void fault_sweep(int ptx)
{
    lj_header h = header();
    int failures = 0;
    for (uint64_t n = 1; n < 100; n++) {
        lj_env env;
        lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_DEBUG);
        env.fault_at[LJ_FAULT_NVRTC] = n;
        int major, minor;
        lajit_status sv = lj_nvrtc_version(&env, &major, &minor);
        lj_compiled c;
        memset(&c, 0, sizeof c);
        lajit_status s = lj_nvrtc_compile(&env, "f.cu", k_source, &h, 1, "sm_90a", ptx, &c);
        ASSERT_EQ(lj_nvrtc_live_programs(), 0); /* every created program was destroyed */
        if (sv == LAJIT_OK && s == LAJIT_OK) {
            ASSERT_TRUE(c.image != NULL);
            lj_compiled_free(&env, &c);
            ASSERT_TRUE(failures >= 4); /* version, create, compile, size, get at least */
            return;
        }
        failures++;
        ASSERT_TRUE(env.errmsg[0] != 0);
        /* Every failed call is reported by the name of the result it returned (a hit is
         * NVRTC_ERROR_INTERNAL_ERROR), not the generic "NVRTC error" of an unknown code. */
        ASSERT_CONTAINS(env.errmsg, "NVRTC_ERROR_INTERNAL_ERROR");
        if (sv != LAJIT_OK) {
            /* The version call took the fault; the compile after it ran normally. */
            ASSERT_STATUS(sv, LAJIT_ERR_NO_COMPILER);
            ASSERT_OK(s);
            lj_compiled_free(&env, &c);
            continue;
        }
        ASSERT_TRUE(s == LAJIT_ERR_COMPILE || s == LAJIT_ERR_OUT_OF_MEMORY);
        ASSERT_TRUE(c.image == NULL);
    }
    lj_test_fail(__FILE__, __LINE__, "no success within 100 injected faults");
}

LJ_TEST(fault_nvrtc_cubin)
{
    fault_sweep(0);
}

LJ_TEST(fault_nvrtc_ptx)
{
    fault_sweep(1);
}

/* The allocator failing at each allocation of a compile: a status, never a crash or leak. */
LJ_TEST(fault_alloc)
{
    lj_header h = header();
    for (uint64_t n = 1; n < 100; n++) {
        lj_env env;
        lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_DEBUG);
        env.fault_at[LJ_FAULT_ALLOC] = n;
        lj_compiled c;
        lajit_status s = lj_nvrtc_compile(&env, "f.cu", k_source, &h, 1, "sm_80", 0, &c);
        if (s == LAJIT_OK) {
            lj_compiled_free(&env, &c);
            return;
        }
        ASSERT_STATUS(s, LAJIT_ERR_OUT_OF_MEMORY);
    }
    lj_test_fail(__FILE__, __LINE__, "no success within 100 injected faults");
}

/* ptxas's report is parsed from the log: a dynamically indexed local array lives on the stack,
 * and with two kernels each figure is the larger of the two. */
LJ_TEST(resource_report)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_DEBUG);
    const char *src = "extern \"C\" __global__ void a(float *o, int n)\n"
                      "{\n"
                      "    float t[256];\n"
                      "    for (int i = 0; i < 256; i++) t[i] = o[i * n];\n"
                      "    o[threadIdx.x] = t[(n * threadIdx.x) & 255];\n"
                      "}\n"
                      "extern \"C\" __global__ void b(float *o)\n"
                      "{\n"
                      "    __shared__ float s[300];\n"
                      "    s[threadIdx.x] = 1.0f;\n"
                      "    __syncthreads();\n"
                      "    o[0] = s[5];\n"
                      "}\n";
    lj_compiled c;
    ASSERT_OK(lj_nvrtc_compile(&env, "r.cu", src, NULL, 0, "sm_80", 0, &c));
    ASSERT_CONTAINS(c.log, "Used ");
    ASSERT_TRUE(c.regs > 0);
    ASSERT_TRUE(c.stack_bytes >= 1024);
    ASSERT_EQ(c.smem_static, 1200);
    lj_compiled_free(&env, &c);
}

/* ---- Parallel compiles through the caller's allocator ------------------------------------- */

/* A user allocator that counts its blocks and notes calls from any thread but its owner's or
 * overlapping calls (the header promises neither happens). */
typedef struct counting_alloc {
    pthread_t owner;
    long allocs, live_blocks;
    size_t live_bytes;
    int foreign, concurrent, inside;
    long fail_at; /* the allocation (counting from 1) that returns NULL; 0: none */
} counting_alloc;

static void *count_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    counting_alloc *c = user;
    if (!pthread_equal(pthread_self(), c->owner))
        c->foreign++;
    if (c->inside++)
        c->concurrent++;
    void *p = NULL;
    if (new_size == 0) {
        if (ptr) {
            c->live_blocks--;
            c->live_bytes -= old_size;
        }
        free(ptr);
    } else if (++c->allocs != c->fail_at) {
        p = realloc(ptr, new_size);
        if (p) {
            c->live_blocks += ptr == NULL;
            c->live_bytes += new_size - old_size;
        }
    }
    c->inside--;
    return p;
}

enum { N_TASKS = 3 };

static void make_jobs(lj_kernel_job jobs[N_TASKS], lj_header *h)
{
    memset(jobs, 0, sizeof(lj_kernel_job) * N_TASKS);
    for (int i = 0; i < N_TASKS; i++) {
        jobs[i].source = (char *)k_source;
        jobs[i].headers = h;
        jobs[i].n_headers = 1;
        snprintf(jobs[i].arch, sizeof jobs[i].arch, "%s", i == 1 ? "sm_90a" : "sm_80");
        snprintf(jobs[i].name, sizeof jobs[i].name, "job%d.cu", i);
    }
}

/* Runs the jobs on 3 threads with env; returns how many tasks failed, checking each failure
 * is out of memory with its message, and gives every image back through env. */
static int compile_all(lj_env *env, lj_kernel_job jobs[N_TASKS])
{
    lj_compile_task tasks[N_TASKS];
    memset(tasks, 0, sizeof tasks);
    for (int i = 0; i < N_TASKS; i++)
        tasks[i].job = &jobs[i];
    lj_kernel_compile_parallel(env, tasks, N_TASKS, N_TASKS);
    int failed = 0;
    for (int i = 0; i < N_TASKS; i++) {
        if (tasks[i].status != LAJIT_OK) {
            failed++;
            ASSERT_STATUS(tasks[i].status, LAJIT_ERR_OUT_OF_MEMORY);
            ASSERT_CONTAINS(tasks[i].error, "out of host memory");
            ASSERT_TRUE(tasks[i].compiled.image == NULL);
        } else {
            ASSERT_TRUE(memcmp(tasks[i].compiled.image,
                               "\x7f"
                               "ELF",
                               4) == 0);
        }
        lj_compile_task_free(env, &tasks[i]);
    }
    return failed;
}

/* The workers' allocations (log, image, header copies) go through the caller's allocator, on
 * the caller's thread only, one at a time; the images are given back through it. */
LJ_TEST(parallel_compiles_use_the_callers_allocator)
{
    counting_alloc c;
    memset(&c, 0, sizeof c);
    c.owner = pthread_self();
    lj_env env;
    lj_env_init(&env, count_alloc, &c, NULL, NULL, LAJIT_LOG_ERROR);
    lj_header h = header();
    lj_kernel_job jobs[N_TASKS];
    make_jobs(jobs, &h);
    ASSERT_EQ(compile_all(&env, jobs), 0);
    /* At least the log and the image of each compile. */
    ASSERT_TRUE(c.allocs >= 2 * N_TASKS);
    ASSERT_EQ(env.fault_count[LJ_FAULT_ALLOC], c.allocs);
    ASSERT_EQ(c.foreign, 0);
    ASSERT_EQ(c.concurrent, 0);
    ASSERT_EQ(c.live_blocks, 0);
    ASSERT_EQ(c.live_bytes, 0);
}

/* Every allocation of the parallel compiles failed in turn, by fault injection (LJ_FAULT_ALLOC)
 * and by the user's allocator returning NULL: exactly the task that asked fails, out of
 * memory with its message; the others succeed; nothing leaks (the counting allocator and
 * ASan). */
LJ_TEST(parallel_compiles_fault_every_allocation)
{
    lj_header h = header();
    lj_kernel_job jobs[N_TASKS];
    make_jobs(jobs, &h);
    for (int by_user = 0; by_user < 2; by_user++) {
        long n;
        int failures = 0;
        for (n = 1; n < 200; n++) {
            counting_alloc c;
            memset(&c, 0, sizeof c);
            c.owner = pthread_self();
            lj_env env;
            lj_env_init(&env, count_alloc, &c, NULL, NULL, LAJIT_LOG_ERROR);
            if (by_user)
                c.fail_at = n;
            else
                env.fault_at[LJ_FAULT_ALLOC] = (uint64_t)n;
            int failed = compile_all(&env, jobs);
            ASSERT_EQ(c.foreign, 0);
            ASSERT_EQ(c.concurrent, 0);
            ASSERT_EQ(c.live_blocks, 0);
            if ((long)env.fault_count[LJ_FAULT_ALLOC] < n) {
                ASSERT_EQ(failed, 0);
                break;
            }
            ASSERT_EQ(failed, 1);
            failures++;
        }
        ASSERT_TRUE(n < 200);
        printf("%s: %d allocations, each failure one task out of memory\n",
               by_user ? "user allocator" : "LJ_FAULT_ALLOC", failures);
        ASSERT_TRUE(failures >= 2 * N_TASKS);
    }
}
