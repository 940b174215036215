/* driver.c — the driver loader's no-driver paths, error formatting, and the device and module
 * layer over the fake driver, with every driver call failed in turn. */
#include <unistd.h>

#include "device.h"
#include "fake_driver.h"
#include "gpu.h"
#include "test.h"

/* A minimal "cubin": the fake driver only looks at the ELF magic. */
static const char elf_image[64] = "\x7f"
                                  "ELF fake cubin";

static void env_init(lj_env *env)
{
    lj_env_init(env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
}

/* ---- Loading libcuda ------------------------------------------------------------------------- */

LJ_TEST(load_missing_path_is_no_driver)
{
    setenv("LAJIT_DRIVER_PATH", "/nonexistent/libcuda.so.1", 1);
    lj_env env;
    env_init(&env);
    const lj_driver *drv = NULL;
    ASSERT_STATUS(lj_driver_load(&env, &drv), LAJIT_ERR_NO_DRIVER);
    ASSERT_CONTAINS(env.errmsg, "/nonexistent/libcuda.so.1");
    ASSERT_CONTAINS(env.errmsg, "LAJIT_DRIVER_PATH");
    ASSERT_TRUE(drv == NULL);
    /* The outcome is remembered: a second context gets the same answer without retrying. */
    setenv("LAJIT_DRIVER_PATH", "/another/path", 1);
    lj_env env2;
    env_init(&env2);
    ASSERT_STATUS(lj_driver_load(&env2, &drv), LAJIT_ERR_NO_DRIVER);
    ASSERT_CONTAINS(env2.errmsg, "/nonexistent/libcuda.so.1");
}

LJ_TEST(load_toolkit_stub_is_no_driver)
{
    static const char *const candidates[] = {
        "/usr/local/cuda/lib64/stubs/libcuda.so",
        "/usr/local/cuda/targets/x86_64-linux/lib/stubs/libcuda.so",
    };
    const char *stub = NULL;
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0] && !stub; i++)
        if (access(candidates[i], R_OK) == 0)
            stub = candidates[i];
    if (!stub)
        lj_test_skip("the CUDA toolkit's stub libcuda.so is not installed");
    setenv("LAJIT_DRIVER_PATH", stub, 1);
    lj_env env;
    env_init(&env);
    const lj_driver *drv = NULL;
    ASSERT_STATUS(lj_driver_load(&env, &drv), LAJIT_ERR_NO_DRIVER);
    ASSERT_CONTAINS(env.errmsg, "stub");
    ASSERT_CONTAINS(env.errmsg, "CUDA_ERROR_STUB_LIBRARY");
    ASSERT_CONTAINS(env.errmsg, stub);
}

LJ_TEST(load_default_without_gpu_is_no_driver)
{
    unsetenv("LAJIT_DRIVER_PATH");
    lj_env env;
    env_init(&env);
    const lj_driver *drv = NULL;
    lajit_status st = lj_driver_load(&env, &drv);
    if (st == LAJIT_OK || st == LAJIT_ERR_NO_DEVICE)
        lj_test_skip("this machine has a CUDA driver");
    ASSERT_STATUS(st, LAJIT_ERR_NO_DRIVER);
    ASSERT_CONTAINS(env.errmsg, "libcuda.so.1");
    ASSERT_TRUE(drv == NULL);
}

/* ---- Error formatting ------------------------------------------------------------------------- */

LJ_TEST(error_names_and_statuses)
{
    lj_env env;
    env_init(&env);
    const lj_driver *fake = lj_fake_driver();
    ASSERT_STATUS(lj_driver_error(&env, fake, CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData"),
                  LAJIT_ERR_DRIVER);
    ASSERT_STREQ(env.errmsg,
                 "cuModuleLoadData: CUDA_ERROR_INVALID_IMAGE (device kernel image is invalid)");
    ASSERT_STATUS(lj_driver_error(&env, fake, CUDA_ERROR_NO_DEVICE, "cuInit"), LAJIT_ERR_NO_DEVICE);
    ASSERT_CONTAINS(env.errmsg, "CUDA_ERROR_NO_DEVICE");
    ASSERT_STATUS(lj_driver_error(&env, fake, CUDA_ERROR_STUB_LIBRARY, "cuInit"),
                  LAJIT_ERR_NO_DRIVER);
    ASSERT_EQ(env.driver_result, CUDA_ERROR_STUB_LIBRARY);
    /* Out of device memory and the sticky faults have statuses of their own. */
    ASSERT_STATUS(lj_driver_error(&env, fake, CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc"),
                  LAJIT_ERR_DEVICE_OUT_OF_MEMORY);
    ASSERT_EQ(env.driver_result, CUDA_ERROR_OUT_OF_MEMORY);
    ASSERT_STREQ(env.driver_result_name, "CUDA_ERROR_OUT_OF_MEMORY");
    static const CUresult sticky[] = {
        CUDA_ERROR_ILLEGAL_ADDRESS,       CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_ILLEGAL_INSTRUCTION,
        CUDA_ERROR_MISALIGNED_ADDRESS,    CUDA_ERROR_INVALID_PC,    CUDA_ERROR_HARDWARE_STACK_ERROR,
        CUDA_ERROR_INVALID_ADDRESS_SPACE, CUDA_ERROR_ASSERT,        CUDA_ERROR_LAUNCH_TIMEOUT,
        CUDA_ERROR_ECC_UNCORRECTABLE,
    };
    for (size_t i = 0; i < sizeof sticky / sizeof sticky[0]; i++) {
        ASSERT_STATUS(lj_driver_error(&env, fake, sticky[i], "cuStreamSynchronize"),
                      LAJIT_ERR_DEVICE_FAULT);
        ASSERT_EQ(env.driver_result, sticky[i]);
    }
    /* Running out of launch resources is a configuration problem, not memory. */
    ASSERT_STATUS(lj_driver_error(&env, fake, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "cuLaunchKernel"),
                  LAJIT_ERR_DRIVER);
    /* An error that is not a driver call's forgets the result. */
    lj_error(&env, LAJIT_ERR_INVALID_ARGUMENT, "not the driver");
    ASSERT_EQ(env.driver_result, 0);
    /* A code the table cannot name, and no table at all: the number. */
    ASSERT_STATUS(lj_driver_error(&env, fake, (CUresult)12345, "cuX"), LAJIT_ERR_DRIVER);
    ASSERT_STREQ(env.errmsg, "cuX: CUDA error 12345");
    ASSERT_STATUS(lj_driver_error(&env, NULL, CUDA_ERROR_INVALID_VALUE, "cuY"), LAJIT_ERR_DRIVER);
    ASSERT_STREQ(env.errmsg, "cuY: CUDA error 1");
}

LJ_TEST(lj_cu_counts_and_injects)
{
    lj_fake_driver_reset();
    lj_env env;
    env_init(&env);
    const lj_driver *drv = lj_fake_driver();
    int v = 0;
    env.fault_at[LJ_FAULT_DRIVER] = 2;
    ASSERT_EQ(LJ_CU(&env, drv, cuDriverGetVersion, &v), CUDA_SUCCESS);
    ASSERT_EQ(v, 13000);
    v = 0;
    ASSERT_EQ(LJ_CU(&env, drv, cuDriverGetVersion, &v), CUDA_ERROR_UNKNOWN);
    ASSERT_EQ(v, 0); /* the call was not made */
    ASSERT_EQ(LJ_CU(&env, drv, cuDriverGetVersion, &v), CUDA_SUCCESS);
    ASSERT_EQ(env.fault_count[LJ_FAULT_DRIVER], 3);
}

/* ---- Devices over the fake driver ------------------------------------------------------------ */

LJ_TEST(device_open_reads_attributes)
{
    lj_fake_driver_reset();
    lj_env env;
    env_init(&env);
    lj_device d;
    ASSERT_OK(lj_device_open(&env, lj_fake_driver(), 0, &d));
    ASSERT_STREQ(d.info.name, "lajit fake sm_90");
    ASSERT_EQ(d.info.cc, 90);
    ASSERT_STREQ(d.info.arch, "sm_90a");
    ASSERT_EQ(d.info.sms, 132);
    ASSERT_EQ(d.info.smem_optin, 227 * 1024);
    ASSERT_EQ(d.info.smem_per_sm, 228 * 1024);
    ASSERT_EQ(d.info.regs_per_sm, 65536);
    ASSERT_EQ(d.info.l2_bytes, 50 * 1024 * 1024);
    ASSERT_EQ(d.driver_version, 13000);
    ASSERT_TRUE(d.cuctx != NULL);
    ASSERT_TRUE(d.drv == lj_fake_driver());
    ASSERT_EQ(lj_fake_driver_counts()->retains, 1);
    lj_device_close(&env, &d);
    ASSERT_EQ(lj_fake_driver_counts()->releases, 1);
    ASSERT_TRUE(d.cuctx == NULL);
    lj_device_close(&env, &d); /* a closed device closes again harmlessly */
    ASSERT_EQ(lj_fake_driver_counts()->releases, 1);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(device_bad_ordinal_is_no_device)
{
    lj_fake_driver_reset();
    lj_env env;
    env_init(&env);
    lj_device d;
    memset(&d, 0x5a, sizeof d);
    ASSERT_STATUS(lj_device_open(&env, lj_fake_driver(), 1, &d), LAJIT_ERR_NO_DEVICE);
    ASSERT_CONTAINS(env.errmsg, "no CUDA device 1");
    ASSERT_CONTAINS(env.errmsg, "1 device ");
    ASSERT_STATUS(lj_device_open(&env, lj_fake_driver(), -1, &d), LAJIT_ERR_NO_DEVICE);
    lj_fake_driver_set_device_count(0);
    ASSERT_STATUS(lj_device_open(&env, lj_fake_driver(), 0, &d), LAJIT_ERR_NO_DEVICE);
    ASSERT_CONTAINS(env.errmsg, "reports none");
    /* Outputs untouched, nothing retained. */
    unsigned char *bytes = (unsigned char *)&d;
    for (size_t i = 0; i < sizeof d; i++)
        ASSERT_EQ(bytes[i], 0x5a);
    ASSERT_EQ(lj_fake_driver_counts()->retains, 0);
}

LJ_TEST(make_current_sets_only_when_needed)
{
    lj_fake_driver_reset();
    lj_env env;
    env_init(&env);
    lj_device d;
    ASSERT_OK(lj_device_open(&env, lj_fake_driver(), 0, &d));
    ASSERT_OK(lj_device_make_current(&env, &d));
    ASSERT_EQ(lj_fake_driver_counts()->set_current, 1);
    ASSERT_OK(lj_device_make_current(&env, &d));
    ASSERT_OK(lj_device_make_current(&env, &d));
    ASSERT_EQ(lj_fake_driver_counts()->set_current, 1);
    lj_device_close(&env, &d);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* ---- Modules ------------------------------------------------------------------------------------ */

static void open_current(lj_env *env, lj_device *d)
{
    lj_fake_driver_reset();
    env_init(env);
    ASSERT_OK(lj_device_open(env, lj_fake_driver(), 0, d));
    ASSERT_OK(lj_device_make_current(env, d));
}

LJ_TEST(module_load_and_launch)
{
    lj_env env;
    lj_device d;
    open_current(&env, &d);
    CUmodule m = NULL;
    CUfunction f = NULL;
    ASSERT_OK(lj_module_load(&env, &d, elf_image, "la_fwd_kernel", 100 * 1024, &m, &f));
    ASSERT_TRUE(m != NULL && f != NULL);
    ASSERT_TRUE(lj_fake_last_image() == elf_image);
    ASSERT_EQ(lj_fake_driver_counts()->smem_attrs, 1);
    /* The raised limit lets a launch use the shared memory (the fake checks it). */
    la_params p;
    memset(&p, 0, sizeof p);
    p.B = 3;
    p.q.ptr = 0x1000;
    p.scale = 0.5f;
    void *args[] = {&p};
    ASSERT_EQ(
        LJ_CU(&env, d.drv, cuLaunchKernel, f, 4, 2, 1, 256, 1, 1, 100 * 1024, NULL, args, NULL),
        CUDA_SUCCESS);
    ASSERT_EQ(lj_fake_launch_count(), 1);
    const lj_fake_launch *l = lj_fake_launch_get(0);
    ASSERT_STREQ(l->entry, "la_fwd_kernel");
    ASSERT_EQ(l->grid[0], 4);
    ASSERT_EQ(l->grid[1], 2);
    ASSERT_EQ(l->block[0], 256);
    ASSERT_EQ(l->smem, 100 * 1024);
    ASSERT_EQ(l->params.B, 3);
    ASSERT_EQ(l->params.q.ptr, 0x1000);
    ASSERT_TRUE(l->params.scale == 0.5f);
    ASSERT_EQ(l->captured, 0);

    /* Without the opt-in, the same launch is refused, as by the real driver. */
    CUmodule m2;
    CUfunction f2;
    ASSERT_OK(lj_module_load(&env, &d, elf_image, "small", 1024, &m2, &f2));
    ASSERT_EQ(lj_fake_driver_counts()->smem_attrs, 1);
    ASSERT_NE(
        LJ_CU(&env, d.drv, cuLaunchKernel, f2, 1, 1, 1, 32, 1, 1, 64 * 1024, NULL, args, NULL),
        CUDA_SUCCESS);

    ASSERT_EQ(LJ_CU(&env, d.drv, cuModuleUnload, m), CUDA_SUCCESS);
    ASSERT_EQ(LJ_CU(&env, d.drv, cuModuleUnload, m2), CUDA_SUCCESS);
    lj_device_close(&env, &d);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(module_load_rejects_non_elf)
{
    lj_env env;
    lj_device d;
    open_current(&env, &d);
    CUmodule m = (CUmodule)(void *)&env;
    CUfunction f = (CUfunction)(void *)&env;
    ASSERT_STATUS(lj_module_load(&env, &d, "// PTX? no: garbage", "k", 0, &m, &f),
                  LAJIT_ERR_DRIVER);
    ASSERT_CONTAINS(env.errmsg, "CUDA_ERROR_INVALID_IMAGE");
    ASSERT_CONTAINS(env.errmsg, "loading the module of k");
    ASSERT_TRUE(m == (CUmodule)(void *)&env && f == (CUfunction)(void *)&env); /* untouched */
    ASSERT_EQ(lj_fake_driver_counts()->rejected_images, 1);
    ASSERT_EQ(lj_fake_driver_counts()->loads, 0);
    lj_device_close(&env, &d);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(module_load_missing_entry_is_internal)
{
    lj_env env;
    lj_device d;
    open_current(&env, &d);
    lj_fake_driver_fail("cuModuleGetFunction", CUDA_ERROR_NOT_FOUND);
    CUmodule m;
    CUfunction f;
    ASSERT_STATUS(lj_module_load(&env, &d, elf_image, "la_missing", 0, &m, &f), LAJIT_ERR_INTERNAL);
    ASSERT_CONTAINS(env.errmsg, "la_missing");
    ASSERT_EQ(lj_fake_driver_counts()->loads, 1);
    ASSERT_EQ(lj_fake_driver_counts()->unloads, 1);
    lj_fake_driver_fail(NULL, CUDA_SUCCESS);
    lj_device_close(&env, &d);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(module_load_smem_limits)
{
    lj_env env;
    lj_device d;
    open_current(&env, &d);
    CUmodule m;
    CUfunction f;
    /* Beyond the device's opt-in limit: refused before any driver call. */
    ASSERT_STATUS(lj_module_load(&env, &d, elf_image, "big", 228 * 1024, &m, &f),
                  LAJIT_ERR_UNSUPPORTED);
    ASSERT_CONTAINS(env.errmsg, "big");
    ASSERT_EQ(lj_fake_driver_counts()->loads, 0);
    /* The attribute call failing unloads the module. */
    lj_fake_driver_fail("cuFuncSetAttribute", CUDA_ERROR_INVALID_VALUE);
    ASSERT_STATUS(lj_module_load(&env, &d, elf_image, "mid", 64 * 1024, &m, &f), LAJIT_ERR_DRIVER);
    ASSERT_CONTAINS(env.errmsg, "cuFuncSetAttribute");
    ASSERT_CONTAINS(env.errmsg, "mid");
    ASSERT_EQ(lj_fake_driver_counts()->loads, lj_fake_driver_counts()->unloads);
    lj_fake_driver_fail(NULL, CUDA_SUCCESS);
    lj_device_close(&env, &d);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(module_load_needs_current_context)
{
    lj_fake_driver_reset();
    lj_env env;
    env_init(&env);
    lj_device d;
    ASSERT_OK(lj_device_open(&env, lj_fake_driver(), 0, &d));
    CUmodule m;
    CUfunction f;
    ASSERT_STATUS(lj_module_load(&env, &d, elf_image, "k", 0, &m, &f), LAJIT_ERR_DRIVER);
    ASSERT_CONTAINS(env.errmsg, "CUDA_ERROR_INVALID_CONTEXT");
    lj_device_close(&env, &d);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* Fails the N-th driver call of open + make_current + module load, for every N until the path
 * succeeds: each failure returns an error with a message and gives back what it took. */
LJ_TEST(fault_every_driver_call_open_and_load)
{
    int n;
    for (n = 1; n < 1000; n++) {
        lj_fake_driver_reset();
        lj_env env;
        env_init(&env);
        env.fault_at[LJ_FAULT_DRIVER] = (uint64_t)n;
        lj_device d;
        lajit_status st = lj_device_open(&env, lj_fake_driver(), 0, &d);
        if (st != LAJIT_OK) {
            ASSERT_NE(st, LAJIT_OK);
            ASSERT_TRUE(env.errmsg[0] != '\0');
            ASSERT_TRUE(lj_fake_driver_balanced());
            continue;
        }
        CUmodule m;
        CUfunction f;
        st = lj_device_make_current(&env, &d);
        if (st == LAJIT_OK)
            st = lj_module_load(&env, &d, elf_image, "la_fwd_kernel", 100 * 1024, &m, &f);
        env.fault_at[LJ_FAULT_DRIVER] = 0; /* clean-up calls are not failed */
        if (st != LAJIT_OK) {
            ASSERT_TRUE(env.errmsg[0] != '\0');
            ASSERT_EQ(lj_fake_driver_counts()->loads, lj_fake_driver_counts()->unloads);
            lj_device_close(&env, &d);
            ASSERT_TRUE(lj_fake_driver_balanced());
            continue;
        }
        /* Success: every earlier N failed one of the calls this run made. */
        ASSERT_EQ(env.fault_count[LJ_FAULT_DRIVER], n - 1);
        ASSERT_EQ(LJ_CU(&env, d.drv, cuModuleUnload, m), CUDA_SUCCESS);
        lj_device_close(&env, &d);
        ASSERT_TRUE(lj_fake_driver_balanced());
        break;
    }
    /* getcount, get, name, 7 attributes, version, retain; get/set current; load, function,
     * attribute. */
    ASSERT_EQ(n, 18); /* 17 calls */
}

/* ---- The fake itself: capture bookkeeping the launch-path tests rely on -------------------- */

LJ_TEST(fake_records_captured_launches)
{
    lj_env env;
    lj_device d;
    open_current(&env, &d);
    const lj_driver *drv = d.drv;
    CUmodule m;
    CUfunction f;
    ASSERT_OK(lj_module_load(&env, &d, elf_image, "k", 0, &m, &f));
    CUstream s;
    ASSERT_EQ(drv->cuStreamCreate(&s, 0), CUDA_SUCCESS);
    la_params p;
    memset(&p, 0, sizeof p);
    void *args[] = {&p};
    ASSERT_EQ(drv->cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, args, NULL), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuLaunchKernel(f, 2, 1, 1, 32, 1, 1, 0, s, args, NULL), CUDA_SUCCESS);
    ASSERT_NE(drv->cuStreamSynchronize(s), CUDA_SUCCESS); /* not allowed while capturing */
    CUgraph g;
    CUgraphExec e;
    ASSERT_EQ(drv->cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuGraphInstantiate(&e, g, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuGraphLaunch(e, s), CUDA_SUCCESS);
    ASSERT_EQ(lj_fake_launch_count(), 2);
    ASSERT_EQ(lj_fake_launch_get(0)->captured, 0);
    ASSERT_EQ(lj_fake_launch_get(1)->captured, 1);
    ASSERT_EQ(lj_fake_driver_counts()->captured_launches, 1);
    ASSERT_EQ(lj_fake_driver_counts()->graph_launches, 1);
    ASSERT_TRUE(!lj_fake_driver_balanced());
    ASSERT_EQ(drv->cuGraphExecDestroy(e), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuGraphDestroy(g), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuStreamDestroy(s), CUDA_SUCCESS);
    ASSERT_NE(drv->cuStreamDestroy(s), CUDA_SUCCESS); /* double destroy is caught */

    /* Fake device memory is host memory. */
    CUdeviceptr buf;
    ASSERT_EQ(drv->cuMemAlloc(&buf, 100), CUDA_SUCCESS);
    ASSERT_EQ(buf % 256, 0);
    ASSERT_EQ(drv->cuMemsetD32(buf, 0x3f800000u, 25), CUDA_SUCCESS);
    float host[25];
    ASSERT_EQ(drv->cuMemcpyDtoH(host, buf, sizeof host), CUDA_SUCCESS);
    ASSERT_TRUE(host[24] == 1.0f);
    ASSERT_NE(drv->cuMemcpyDtoH(host, buf + 4, sizeof host), CUDA_SUCCESS); /* out of bounds */
    ASSERT_EQ(drv->cuMemFree(buf), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuModuleUnload(m), CUDA_SUCCESS);
    /* A function of an unloaded module cannot launch. */
    ASSERT_EQ(drv->cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL),
              CUDA_ERROR_INVALID_HANDLE);
    lj_device_close(&env, &d);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* ---- The real driver, where there is one (skipped elsewhere) ---------------------------------- */

/* A kernel with no parameters, as PTX the driver compiles for any device. */
static const char empty_ptx[] = ".version 7.0\n"
                                ".target sm_50\n"
                                ".address_size 64\n"
                                ".visible .entry lj_empty()\n"
                                "{\n"
                                "    ret;\n"
                                "}\n";

LJ_TEST(real_driver_when_present)
{
    unsetenv("LAJIT_DRIVER_PATH");
    lj_gpu_init(); /* skips without a driver or device */
    lj_env *env = lj_gpu_env();
    lj_device *d = lj_gpu_device();
    ASSERT_TRUE(d->info.cc >= 80);
    ASSERT_TRUE(d->info.sms > 0 && d->info.smem_optin >= 48 * 1024 && d->info.l2_bytes > 0);
    ASSERT_TRUE(strncmp(d->info.arch, "sm_", 3) == 0);
    ASSERT_TRUE(d->driver_version >= 12000);
    printf("device: %s %s, %d SMs, %d B opt-in smem, driver %d\n", d->info.name, d->info.arch,
           d->info.sms, d->info.smem_optin, d->driver_version);

    /* Memory through the helpers. */
    float host[64], back[64];
    for (int i = 0; i < 64; i++)
        host[i] = (float)i * 0.25f - 3.0f;
    CUdeviceptr buf = lj_gpu_alloc(64 * 4);
    lj_gpu_poison(buf, 64 * 4);
    lj_gpu_download(back, buf, sizeof back);
    ASSERT_TRUE(isnan(back[17]));
    lj_gpu_upload_as(buf, host, 64, LJ_BF16);
    lj_gpu_download_as(back, buf, 64, LJ_BF16);
    for (int i = 0; i < 64; i++)
        ASSERT_TRUE(back[i] == lj_round_to(host[i], LJ_BF16));

    /* A module: load, launch with one la_params argument (ignored by the kernel), raise the
     * shared memory limit, and a missing entry. */
    CUmodule m;
    CUfunction f;
    ASSERT_OK(lj_module_load(env, d, empty_ptx, "lj_empty", 100 * 1024, &m, &f));
    la_params p;
    memset(&p, 0, sizeof p);
    void *args[] = {&p};
    ASSERT_EQ(d->drv->cuLaunchKernel(f, 2, 1, 1, 128, 1, 1, 100 * 1024, NULL, args, NULL),
              CUDA_SUCCESS);
    lj_gpu_sync();
    ASSERT_EQ(d->drv->cuModuleUnload(m), CUDA_SUCCESS);
    ASSERT_STATUS(lj_module_load(env, d, empty_ptx, "lj_absent", 0, &m, &f), LAJIT_ERR_INTERNAL);
    ASSERT_CONTAINS(env->errmsg, "lj_absent");
    ASSERT_STATUS(lj_module_load(env, d, "not an image", "lj_empty", 0, &m, &f), LAJIT_ERR_DRIVER);
    ASSERT_CONTAINS(env->errmsg, "cuModuleLoadData");

    /* Events and graph capture, the calls the autotuner and the benchmarks use. */
    const lj_driver *drv = d->drv;
    CUevent e0, e1;
    CUstream s;
    ASSERT_EQ(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuEventCreate(&e0, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuEventCreate(&e1, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuEventRecord(e0, s), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemsetD32(buf, 0, 64), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuEventRecord(e1, s), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuEventSynchronize(e1), CUDA_SUCCESS);
    float ms = -1;
    ASSERT_EQ(drv->cuEventElapsedTime(&ms, e0, e1), CUDA_SUCCESS);
    ASSERT_TRUE(ms >= 0);
    ASSERT_EQ(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
    CUgraph g;
    CUgraphExec ge;
    ASSERT_EQ(drv->cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuGraphInstantiate(&ge, g, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuGraphLaunch(ge, s), CUDA_SUCCESS);
    lj_gpu_stream_sync(s);
    ASSERT_EQ(drv->cuGraphExecDestroy(ge), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuGraphDestroy(g), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuEventDestroy(e0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuEventDestroy(e1), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuStreamDestroy(s), CUDA_SUCCESS);
    lj_gpu_free(buf);
}
