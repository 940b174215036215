/* pdl.c — programmatic dependent launch (issue 20) without a GPU: which launches ask for
 * programmatic stream serialization and which do not, through the fake driver (which records the
 * attribute and refuses it below cc 9.0). la_decode on a cc 9.0 device gets it with LAJIT_PDL
 * unset or 1, not with LAJIT_PDL=0, not on a cc 8.0 device, not with a driver that lacks
 * cuLaunchKernelEx; the other families never; a captured decode keeps it; a bad LAJIT_PDL fails
 * context creation. And the device side: la_decode's PTX holds griddepcontrol.wait before
 * griddepcontrol.launch_dependents for sm_90a, sm_100a and sm_120, and neither for sm_80. Whether
 * the overlap happens and what it saves is measured on a GPU (lajit_bench --mode decode --pdl). */
#include "test.h"

#include <stdint.h>
#include <string.h>

#include "config.h"
#include "context.h"
#include "embedded.h"
#include "fake_driver.h"
#include "kernel.h"
#include "nvrtc.h"

enum { B = 2, H = 3, N = 5, D = 32, E = 16, P = 4 };

static void require_nvrtc(void)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    int major, minor;
    if (lj_nvrtc_version(&env, &major, &minor) != LAJIT_OK)
        lj_test_skip("NVRTC not available");
}

/* The fake device of compute capability major.0 with its primary context current. */
static void open_fake(int major)
{
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    CUcontext c;
    lj_fake_driver_reset();
    lj_fake_driver_set_cc(major, 0);
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&c, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(c), CUDA_SUCCESS);
}

/* A context on drv with LAJIT_PDL set to pdl (NULL: unset). */
static lajit_ctx *fake_ctx(const char *pdl, const lj_driver *drv)
{
    if (pdl)
        setenv("LAJIT_PDL", pdl, 1);
    else
        unsetenv("LAJIT_PDL");
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DISK_CACHE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    unsetenv("LAJIT_PDL");
    lajit__ctx_set_driver(ctx, drv);
    return ctx;
}

/* A compact tensor of its own fake allocation. */
typedef struct tensor {
    DLTensor t;
    int64_t shape[5];
} tensor;

static void make(tensor *x, int code, int bits, int ndim, const int64_t *shape)
{
    memset(x, 0, sizeof *x);
    size_t n = (size_t)bits / 8;
    for (int i = 0; i < ndim; i++) {
        x->shape[i] = shape[i];
        n *= (size_t)shape[i];
    }
    CUdeviceptr p;
    ASSERT_EQ(lj_fake_driver()->cuMemAlloc(&p, n), CUDA_SUCCESS);
    x->t.data = (void *)(uintptr_t)p;
    x->t.device.device_type = kDLCUDA;
    x->t.ndim = ndim;
    x->t.dtype.code = (uint8_t)code;
    x->t.dtype.bits = (uint8_t)bits;
    x->t.dtype.lanes = 1;
    x->t.shape = x->shape;
}

/* One decode step of B rows from a float32 pool of P slots, bf16 inputs. */
typedef struct decode_call {
    tensor q, k, v, o, pool, slots;
    lajit_attn_decode_args a;
} decode_call;

static void decode_init(decode_call *c)
{
    int64_t qs[3] = {B, H, D}, vs[3] = {B, H, E}, ps[4] = {P, H, D, E}, sl[1] = {B};
    make(&c->q, kDLBfloat, 16, 3, qs);
    make(&c->k, kDLBfloat, 16, 3, qs);
    make(&c->v, kDLBfloat, 16, 3, vs);
    make(&c->o, kDLBfloat, 16, 3, vs);
    make(&c->pool, kDLFloat, 32, 4, ps);
    make(&c->slots, kDLInt, 32, 1, sl);
    memset(&c->a, 0, sizeof c->a);
    c->a.struct_size = sizeof c->a;
    c->a.q = &c->q.t, c->a.k = &c->k.t, c->a.v = &c->v.t, c->a.o = &c->o.t;
    c->a.state = &c->pool.t;
    c->a.state_slots = &c->slots.t;
    c->a.scale = 1.0f;
}

/* Decodes twice (the plan's build, then the hot path) on a cc `major`.0 fake device with
 * LAJIT_PDL = pdl; returns how many of the two launches asked for PDL. */
static int decode_pdl_launches(int major, const char *pdl, const lj_driver *drv)
{
    require_nvrtc();
    open_fake(major);
    lajit_ctx *ctx = fake_ctx(pdl, drv);
    decode_call c;
    decode_init(&c);
    ASSERT_OK(lajit_attn_decode(ctx, &c.a));
    ASSERT_OK(lajit_attn_decode(ctx, &c.a));
    ASSERT_EQ(lj_fake_launch_count(), 2);
    for (int i = 0; i < 2; i++)
        ASSERT_STREQ(lj_fake_launch_get(i)->entry, "la_decode");
    int n = lj_fake_launch_get(0)->pdl + lj_fake_launch_get(1)->pdl;
    ASSERT_EQ(lj_fake_driver_counts()->pdl_launches, n);
    lajit_ctx_destroy(ctx);
    return n;
}

LJ_TEST(decode_on_sm90_launches_with_pdl_by_default)
{
    ASSERT_EQ(decode_pdl_launches(9, NULL, lj_fake_driver()), 2);
}

LJ_TEST(decode_with_pdl_1_launches_with_pdl)
{
    ASSERT_EQ(decode_pdl_launches(9, "1", lj_fake_driver()), 2);
    /* Empty is unset, as for the other LAJIT_* variables. */
    ASSERT_EQ(decode_pdl_launches(9, "", lj_fake_driver()), 2);
}

LJ_TEST(decode_with_pdl_0_launches_without)
{
    ASSERT_EQ(decode_pdl_launches(9, "0", lj_fake_driver()), 0);
}

/* The fake refuses the attribute below 9.0: asking for it there would fail the launch. */
LJ_TEST(decode_on_sm80_launches_without)
{
    ASSERT_EQ(decode_pdl_launches(8, "1", lj_fake_driver()), 0);
}

LJ_TEST(decode_with_a_driver_without_launch_kernel_ex_launches_without)
{
    static lj_driver old;
    old = *lj_fake_driver();
    old.cuLaunchKernelEx = NULL;
    ASSERT_EQ(decode_pdl_launches(9, "1", &old), 0);
}

/* A failed cuLaunchKernelEx is an ordinary driver error, named. */
LJ_TEST(a_failed_pdl_launch_says_so)
{
    require_nvrtc();
    open_fake(9);
    lajit_ctx *ctx = fake_ctx(NULL, lj_fake_driver());
    decode_call c;
    decode_init(&c);
    lj_fake_driver_fail("cuLaunchKernelEx", CUDA_ERROR_INVALID_VALUE);
    ASSERT_STATUS(lajit_attn_decode(ctx, &c.a), LAJIT_ERR_DRIVER);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "cuLaunchKernelEx");
    ASSERT_EQ(lajit_last_driver_error(ctx, NULL), CUDA_ERROR_INVALID_VALUE);
    lj_fake_driver_fail(NULL, CUDA_SUCCESS);
    ASSERT_OK(lajit_attn_decode(ctx, &c.a));
    ASSERT_EQ(lj_fake_launch_get(0)->pdl, 1);
    lajit_ctx_destroy(ctx);
}

/* Graph capture needs nothing of lajit: the launch is captured with its attribute (the driver
 * turns it into a programmatic edge of the graph). */
LJ_TEST(captured_decode_keeps_pdl)
{
    require_nvrtc();
    open_fake(9);
    lajit_ctx *ctx = fake_ctx(NULL, lj_fake_driver());
    decode_call c;
    decode_init(&c);
    ASSERT_OK(lajit_attn_decode(ctx, &c.a)); /* the plan, outside the capture */
    const lj_driver *drv = lj_fake_driver();
    CUstream s;
    CUgraph g;
    ASSERT_EQ(drv->cuStreamCreate(&s, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
    c.a.stream = s;
    ASSERT_OK(lajit_attn_decode(ctx, &c.a));
    ASSERT_EQ(drv->cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuGraphDestroy(g), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuStreamDestroy(s), CUDA_SUCCESS);
    ASSERT_EQ(lj_fake_launch_count(), 2);
    ASSERT_EQ(lj_fake_launch_get(1)->captured, 1);
    ASSERT_EQ(lj_fake_launch_get(1)->pdl, 1);
    lajit_ctx_destroy(ctx);
}

/* The forward and backward kernels do not wait before their first access: never with PDL, on a
 * cc 9.0 device with the switch on. */
LJ_TEST(other_ops_launch_without)
{
    require_nvrtc();
    open_fake(9);
    lajit_ctx *ctx = fake_ctx("1", lj_fake_driver());
    int64_t qs[4] = {B, H, N, D}, vs[4] = {B, H, N, E};
    tensor q, k, v, o, dq, dk, dv, dout;
    make(&q, kDLBfloat, 16, 4, qs);
    make(&k, kDLBfloat, 16, 4, qs);
    make(&v, kDLBfloat, 16, 4, vs);
    make(&o, kDLBfloat, 16, 4, vs);
    make(&dq, kDLBfloat, 16, 4, qs);
    make(&dk, kDLBfloat, 16, 4, qs);
    make(&dv, kDLBfloat, 16, 4, vs);
    make(&dout, kDLBfloat, 16, 4, vs);
    const char *fwd_families[] = {NULL, "la_fwd", "la_recurrent"};
    for (size_t i = 0; i < sizeof fwd_families / sizeof fwd_families[0]; i++) {
        lajit_attn_fwd_args a;
        memset(&a, 0, sizeof a);
        a.struct_size = sizeof a;
        a.q = &q.t, a.k = &k.t, a.v = &v.t, a.o = &o.t;
        a.scale = 1.0f;
        a.family = fwd_families[i];
        ASSERT_OK(lajit_attn_fwd(ctx, &a));
    }
    lajit_attn_bwd_args b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.q = &q.t, b.k = &k.t, b.v = &v.t, b.dout = &dout.t;
    b.dq = &dq.t, b.dk = &dk.t, b.dv = &dv.t;
    b.scale = 1.0f;
    ASSERT_OK(lajit_attn_bwd(ctx, &b));
    int n = lj_fake_launch_count();
    ASSERT_TRUE(n >= 4);
    for (int i = 0; i < n; i++)
        if (lj_fake_launch_get(i)->pdl)
            lj_test_fail(__FILE__, __LINE__, "%s launched with PDL", lj_fake_launch_get(i)->entry);
    ASSERT_EQ(lj_fake_driver_counts()->pdl_launches, 0);
    lajit_ctx_destroy(ctx);
}

/* Every built-in family's launch() for each of its representative problems, default config: only
 * la_decode says pdl, and only for single steps (T = 1) on cc >= 90 (its representative problems
 * include T = 4 and 8, which must not). */
LJ_TEST(only_decode_specs_say_pdl)
{
    lajit_ctx *ctx = fake_ctx(NULL, lj_fake_driver());
    const char *archs[] = {"sm_80", "sm_90a", "sm_100a", "sm_120"};
    int decode_checked = 0, decode_multi_step_checked = 0;
    for (int fi = 0; lj_embedded_families[fi]; fi++) {
        const char *name = lj_embedded_families[fi];
        lj_family *f;
        ASSERT_OK(lajit__ctx_family(ctx, name, &f));
        lj_problem *problems;
        int np;
        ASSERT_OK(lj_family_problems(f, &problems, &np));
        for (size_t ai = 0; ai < sizeof archs / sizeof archs[0]; ai++) {
            if (!lj_family_serves(f, archs[ai]))
                continue;
            lj_device_info dev;
            ASSERT_TRUE(lj_device_info_for_arch(archs[ai], &dev));
            for (int pi = 0; pi < np; pi++) {
                lj_config cfg;
                ASSERT_OK(lj_family_default(f, &problems[pi], &dev, &cfg));
                int ok = 0;
                char reason[256];
                ASSERT_OK(
                    lj_family_valid(f, &cfg, &problems[pi], &dev, &ok, reason, sizeof reason));
                if (!ok)
                    continue;
                lj_launch l;
                ASSERT_OK(lj_family_launch(f, &cfg, &problems[pi], &dev, &l));
                int want = strcmp(name, "la_decode") == 0 && dev.cc >= 90 && problems[pi].T == 1;
                if ((int)l.pdl != want)
                    lj_test_fail(__FILE__, __LINE__, "%s on %s, problem %d: pdl %u, want %d", name,
                                 archs[ai], pi, l.pdl, want);
                decode_checked += strcmp(name, "la_decode") == 0;
                decode_multi_step_checked +=
                    strcmp(name, "la_decode") == 0 && dev.cc >= 90 && problems[pi].T > 1;
            }
        }
        lj_free(&ctx->env, problems);
    }
    ASSERT_TRUE(decode_checked >= 4);
    ASSERT_TRUE(decode_multi_step_checked >= 2);
    lajit_ctx_destroy(ctx);
}

/* The one exception inside la_decode: its one-warp packed tiles (the default for a 16-bit pool at
 * about four states per SM) launch without PDL — measured slower with it (docs/notes/la_decode.md,
 * session 22) — while another configuration of the same problem asks for it. */
LJ_TEST(decode_one_warp_packed_tiles_launch_without_pdl)
{
    lajit_ctx *ctx = fake_ctx(NULL, lj_fake_driver());
    lj_family *f;
    ASSERT_OK(lajit__ctx_family(ctx, "la_decode", &f));
    lj_device_info dev;
    ASSERT_TRUE(lj_device_info_for_arch("sm_90a", &dev));
    lj_problem p;
    memset(&p, 0, sizeof p);
    p.op = LJ_OP_DECODE;
    p.dtype = LJ_BF16;
    p.B = 8, p.H = 64, p.N = 1, p.D = 128, p.E = 128, p.T = 1, p.decay = 1;
    p.state_dtype = LJ_BF16;
    lj_config def, other;
    char text[256];
    ASSERT_OK(lj_family_default(f, &p, &dev, &def));
    lj_config_format(&def, text, sizeof text);
    /* The parameters print in name order: WARPS last. */
    size_t n = strlen(text);
    if (!strstr(text, "PACKED=1") || n < 8 || strcmp(text + n - 8, " WARPS=1") != 0)
        lj_test_fail(__FILE__, __LINE__, "default is [%s], not a one-warp packed tile", text);
    lj_launch l;
    ASSERT_OK(lj_family_launch(f, &def, &p, &dev, &l));
    ASSERT_EQ(l.pdl, 0);
    ASSERT_OK(lj_config_parse(&ctx->env, f, &def, "CACHE=1 DIRECT=1 PACKED=0 TILE_V=128 WARPS=16",
                              &other));
    ASSERT_OK(lj_family_launch(f, &other, &p, &dev, &l));
    ASSERT_EQ(l.pdl, 1);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(a_bad_lajit_pdl_fails_context_creation)
{
    const char *bad[] = {"yes", "2", "on", "1 "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("LAJIT_PDL", bad[i], 1);
        lajit_ctx *ctx = NULL;
        ASSERT_STATUS(lajit_ctx_create(NULL, &ctx), LAJIT_ERR_INVALID_ARGUMENT);
        ASSERT_TRUE(ctx == NULL);
        ASSERT_CONTAINS(lajit_errmsg(NULL), "LAJIT_PDL");
        ASSERT_CONTAINS(lajit_errmsg(NULL), bad[i]);
    }
    unsetenv("LAJIT_PDL");
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(NULL, &ctx));
    lajit_ctx_destroy(ctx);
}

/* The PTX of la_decode's default configuration for arch. */
static char *decode_ptx(lajit_ctx *ctx, const char *arch, lj_compiled *out)
{
    lj_lua *L;
    lj_family *f;
    ASSERT_OK(lajit__ctx_lua(ctx, &L));
    ASSERT_OK(lajit__ctx_family(ctx, "la_decode", &f));
    lj_problem *problems;
    int np;
    ASSERT_OK(lj_family_problems(f, &problems, &np));
    lj_device_info dev;
    ASSERT_TRUE(lj_device_info_for_arch(arch, &dev));
    lj_config cfg;
    ASSERT_OK(lj_family_default(f, &problems[0], &dev, &cfg));
    lj_kernel_job job;
    ASSERT_OK(lj_kernel_prepare(L, f, &cfg, &problems[0], &dev, 1, &job));
    lajit_status st = lj_kernel_compile(&ctx->env, &job, out);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", arch, ctx->env.errmsg);
    lj_kernel_job_free(L, &job);
    lj_free(&ctx->env, problems);
    return out->image;
}

LJ_TEST(decode_ptx_waits_first_on_sm90_and_later)
{
    require_nvrtc();
    lajit_ctx *ctx = fake_ctx(NULL, lj_fake_driver());
    const char *archs[] = {"sm_80", "sm_90a", "sm_100a", "sm_120"};
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        lj_compiled c;
        const char *ptx = decode_ptx(ctx, archs[i], &c);
        const char *wait = strstr(ptx, "griddepcontrol.wait");
        const char *dep = strstr(ptx, "griddepcontrol.launch_dependents");
        if (strcmp(archs[i], "sm_80") == 0) {
            ASSERT_TRUE(wait == NULL && dep == NULL);
        } else {
            if (!wait || !dep || wait > dep)
                lj_test_fail(__FILE__, __LINE__, "%s: wait at %p, launch_dependents at %p",
                             archs[i], (const void *)wait, (const void *)dep);
            /* Before the wait, nothing but the kernel parameter is read and nothing is
             * written: no load other than ld.param, no store, no cp.async. */
            const char *entry = strstr(ptx, ".entry la_decode");
            ASSERT_TRUE(entry != NULL && entry < wait);
            for (const char *x = entry; (x = strstr(x, "\n\t")) != NULL && x < wait; x++) {
                const char *ins = x + 2;
                if ((strncmp(ins, "ld.", 3) == 0 && strncmp(ins, "ld.param", 8) != 0) ||
                    strncmp(ins, "st.", 3) == 0 || strncmp(ins, "cp.", 3) == 0 ||
                    strncmp(ins, "atom.", 5) == 0 || strncmp(ins, "red.", 4) == 0)
                    lj_test_fail(__FILE__, __LINE__, "%s: %.40s before the wait", archs[i], ins);
            }
        }
        lj_compiled_free(&ctx->env, &c);
    }
    lajit_ctx_destroy(ctx);
}
