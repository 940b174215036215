/* nvrtc.c — NVRTC compile without a GPU: cubins for every target arch, PTX, compile errors with
 * the error line in errmsg, a missing NVRTC (LAJIT_NVRTC_PATH), and every NVRTC call failed in
 * turn by fault injection (a failure status each time, never a crash or a leak under ASan). */
#include <stdlib.h>

#include "cache_helpers.h"
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
    ASSERT_TRUE(memcmp(c.image, "\x7f" "ELF", 4) == 0);
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
