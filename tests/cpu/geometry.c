/* geometry.c — kernel geometry derived once: each spec hands its derived values (SMEM and the
 * family's splits) to the template as constants, and the kernels static_assert that their layout
 * fits them. For every representative problem of every family, the default configuration's
 * expansion carries the spec's shared-memory figure and compiles with NVRTC for sm_90a and sm_80
 * (where the family serves them) within the resources the spec claims (no spills); an
 * inconsistent SMEM constant trips the kernel's static_assert; the resource check itself
 * (generator/resources.h) fails on spills, stack, registers and shared memory. */
#include <stdlib.h>

#include "context.h"
#include "kernel.h"
#include "nvrtc.h"
#include "resources.h"
#include "test.h"

static lajit_ctx *ctx_open(void)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DEVICE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    return ctx;
}

/* Skips the case when NVRTC cannot be loaded (a machine without the toolkit's compiler). */
static void need_nvrtc(void)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_DEBUG);
    int major, minor;
    if (lj_nvrtc_version(&env, &major, &minor) != LAJIT_OK)
        lj_test_skip("NVRTC not available");
}

/* Every problem of family `name`, default config, on sm_90a and sm_80: SMEM in the expansion
 * equals the spec's figure, the kernel compiles (its static_asserts hold) and fits its claim. */
static void check_family(const char *name)
{
    need_nvrtc();
    lajit_ctx *ctx = ctx_open();
    lj_env *env = lajit__ctx_env(ctx);
    lj_lua *L;
    lj_family *f;
    ASSERT_OK(lajit__ctx_lua(ctx, &L));
    ASSERT_OK(lajit__ctx_family(ctx, name, &f));
    lj_problem *problems;
    int np, compiled = 0;
    ASSERT_OK(lj_family_problems(f, &problems, &np));
    static const char *const archs[] = {"sm_90a", "sm_80"};
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        if (!lj_family_serves(f, archs[a]))
            continue;
        lj_device_info dev;
        ASSERT_TRUE(lj_device_info_for_arch(archs[a], &dev));
        for (int i = 0; i < np; i++) {
            lj_config cfg;
            lj_launch launch;
            lj_resources claim;
            ASSERT_OK(lj_family_default(f, &problems[i], &dev, &cfg));
            ASSERT_OK(lj_family_launch(f, &cfg, &problems[i], &dev, &launch));
            ASSERT_OK(lj_family_resources(f, &cfg, &problems[i], &dev, &claim));
            lj_kernel_job job;
            ASSERT_OK(lj_kernel_prepare(L, f, &cfg, &problems[i], &dev, 0, &job));
            /* The spec's figure: the launch's dynamic shared memory, or for a kernel with only
             * static shared memory (la_recurrent) the claim. */
            char want[64];
            snprintf(want, sizeof want, "constexpr unsigned SMEM = %u;",
                     launch.smem ? launch.smem : (unsigned)claim.smem);
            ASSERT_CONTAINS(job.source, want);
            lj_compiled c;
            if (lj_kernel_compile(env, &job, &c) != LAJIT_OK)
                lj_test_fail(__FILE__, __LINE__, "%s problem %d on %s: %s", name, i, archs[a],
                             lajit_errmsg(ctx));
            lj_cache_entry e = {c.image,       c.image_size,  c.regs,        c.spill_stores,
                                c.spill_loads, c.stack_bytes, c.smem_static, 0};
            char why[512];
            if (!lj_resources_check(&claim, &e, launch.smem, why, sizeof why))
                lj_test_fail(__FILE__, __LINE__, "%s problem %d on %s: %s", name, i, archs[a], why);
            lj_compiled_free(env, &c);
            lj_kernel_job_free(L, &job);
            compiled++;
        }
    }
    ASSERT_TRUE(compiled > 0);
    lj_free(env, problems);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(la_fwd_constants_compile)
{
    check_family("la_fwd");
}
LJ_TEST(la_fwd_sm90_constants_compile)
{
    check_family("la_fwd_sm90");
}
LJ_TEST(la_bwd_constants_compile)
{
    check_family("la_bwd");
}
LJ_TEST(la_bwd_sm90_constants_compile)
{
    check_family("la_bwd_sm90");
}
LJ_TEST(la_decode_constants_compile)
{
    check_family("la_decode");
}
LJ_TEST(la_recurrent_constants_compile)
{
    check_family("la_recurrent");
}

/* A kernel given less shared memory than its layout needs does not compile: the static_assert
 * is live (for each family whose kernel checks SMEM against a dynamic layout). */
static void check_smem_assert(const char *name, const char *arch)
{
    need_nvrtc();
    lajit_ctx *ctx = ctx_open();
    lj_env *env = lajit__ctx_env(ctx);
    lj_lua *L;
    lj_family *f;
    ASSERT_OK(lajit__ctx_lua(ctx, &L));
    ASSERT_OK(lajit__ctx_family(ctx, name, &f));
    lj_problem *problems;
    int np;
    ASSERT_OK(lj_family_problems(f, &problems, &np));
    lj_device_info dev;
    ASSERT_TRUE(lj_device_info_for_arch(arch, &dev));
    lj_config cfg;
    ASSERT_OK(lj_family_default(f, &problems[0], &dev, &cfg));
    lj_kernel_job job;
    ASSERT_OK(lj_kernel_prepare(L, f, &cfg, &problems[0], &dev, 0, &job));
    /* Replace the figure with 16 bytes, padded with blanks so the text keeps its length. */
    char *at = strstr(job.source, "constexpr unsigned SMEM = ");
    ASSERT_TRUE(at != NULL);
    char *num = at + strlen("constexpr unsigned SMEM = ");
    char *semi = strchr(num, ';');
    ASSERT_TRUE(semi != NULL && semi - num >= 2);
    memset(num, ' ', (size_t)(semi - num));
    memcpy(num, "16", 2);
    lj_compiled c;
    ASSERT_STATUS(lj_kernel_compile(env, &job, &c), LAJIT_ERR_COMPILE);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "exceed");
    ASSERT_CONTAINS(lajit_errmsg(ctx), "SMEM");
    lj_kernel_job_free(L, &job);
    lj_free(env, problems);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(inconsistent_smem_trips_static_assert_la_fwd)
{
    check_smem_assert("la_fwd", "sm_80");
}
LJ_TEST(inconsistent_smem_trips_static_assert_la_fwd_sm90)
{
    check_smem_assert("la_fwd_sm90", "sm_90a");
}
LJ_TEST(inconsistent_smem_trips_static_assert_la_decode)
{
    check_smem_assert("la_decode", "sm_90a");
}

/* The resource check: within the claim passes; spills, a stack frame, too many registers or too
 * much shared memory (static + dynamic) each fail with a reason. */
LJ_TEST(resource_check)
{
    lj_resources claim = {128, 1000};
    lj_cache_entry ok = {NULL, 0, 128, 0, 0, 0, 100, 0};
    char why[256];
    ASSERT_TRUE(lj_resources_check(&claim, &ok, 900, why, sizeof why));
    ASSERT_STREQ(why, "");
    lj_cache_entry e = ok;
    e.spill_stores = 4;
    ASSERT_TRUE(!lj_resources_check(&claim, &e, 0, why, sizeof why));
    ASSERT_CONTAINS(why, "spills");
    e = ok;
    e.stack_bytes = 8;
    ASSERT_TRUE(!lj_resources_check(&claim, &e, 0, why, sizeof why));
    ASSERT_CONTAINS(why, "stack");
    e = ok;
    e.regs = 129;
    ASSERT_TRUE(!lj_resources_check(&claim, &e, 0, why, sizeof why));
    ASSERT_CONTAINS(why, "129 registers");
    ASSERT_TRUE(!lj_resources_check(&claim, &ok, 901, why, sizeof why));
    ASSERT_CONTAINS(why, "1001 bytes of shared memory");
    /* Several findings in one message; a tiny buffer is cut, never overrun. */
    e.spill_loads = 4;
    e.stack_bytes = 8;
    ASSERT_TRUE(!lj_resources_check(&claim, &e, 2000, why, sizeof why));
    ASSERT_CONTAINS(why, "; ");
    char tiny[8];
    ASSERT_TRUE(!lj_resources_check(&claim, &e, 2000, tiny, sizeof tiny));
    ASSERT_TRUE(strlen(tiny) < sizeof tiny);
}

/* A spec's claim: la_fwd's registers are its launch bounds' (8 warps, MINB 1: 255; 16 warps
 * would be 128), its shared memory launch()'s; a spec without resources() claims the limits. */
LJ_TEST(spec_claims)
{
    lajit_ctx *ctx = ctx_open();
    lj_env *env = lajit__ctx_env(ctx);
    lj_family *f;
    ASSERT_OK(lajit__ctx_family(ctx, "la_fwd", &f));
    lj_problem *problems;
    int np;
    ASSERT_OK(lj_family_problems(f, &problems, &np));
    lj_device_info dev;
    ASSERT_TRUE(lj_device_info_for_arch("sm_90a", &dev));
    lj_config cfg;
    ASSERT_OK(lj_family_default(f, &problems[0], &dev, &cfg));
    lj_launch launch;
    lj_resources claim;
    ASSERT_OK(lj_family_launch(f, &cfg, &problems[0], &dev, &launch));
    ASSERT_OK(lj_family_resources(f, &cfg, &problems[0], &dev, &claim));
    ASSERT_EQ(claim.smem, (long long)launch.smem);
    long long threads = lj_config_get(&cfg, "WARPS", 0) * 32;
    long long cap = dev.regs_per_sm / threads < 255 ? dev.regs_per_sm / threads : 255;
    ASSERT_EQ(claim.regs, cap);
    lj_free(env, problems);
    lajit_ctx_destroy(ctx);
}
