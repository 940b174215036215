/* ops_build.c — where a plan's kernel comes from, through the fake driver: the cache levels in
 * DESIGN.md's order (a kernel in the context's memory cache is used without consulting the
 * bundle), and a bundle's configuration checked by the family's valid() like a tuned one (an
 * invalid one is logged and the default runs). The bundles are written here with lj_bundle_add,
 * their images marked so the test can tell which one the driver received. */
#include "test.h"

#include <stdlib.h>
#include <unistd.h>

#include "bundle.h"
#include "context.h"
#include "fake_driver.h"
#include "kernel.h"
#include "nvrtc.h"

enum { B = 2, H = 3, N = 5, D = 32, E = 16 };

static char log_seen[16384];

static void capture_log(void *user, lajit_log_level level, const char *message)
{
    (void)user, (void)level;
    size_t used = strlen(log_seen);
    snprintf(log_seen + used, sizeof log_seen - used, "%s\n", message);
}

static DLTensor make(CUdeviceptr p, int ndim, int64_t *shape)
{
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = (void *)(uintptr_t)p;
    t.device.device_type = kDLCUDA;
    t.ndim = ndim;
    t.dtype.code = kDLFloat;
    t.dtype.bits = 32;
    t.dtype.lanes = 1;
    t.shape = shape;
    return t;
}

typedef struct fwd_case {
    int64_t qs[4], vs[4];
    DLTensor tq, tk, tv, to;
    lajit_attn_fwd_args args;
    lj_problem p; /* what the op path describes for it */
} fwd_case;

static void fwd_case_open(fwd_case *c)
{
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    CUcontext cu;
    memset(c, 0, sizeof *c);
    lj_fake_driver_reset();
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&cu, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(cu), CUDA_SUCCESS);
    int64_t qs[4] = {B, H, N, D}, vs[4] = {B, H, N, E};
    memcpy(c->qs, qs, sizeof qs);
    memcpy(c->vs, vs, sizeof vs);
    CUdeviceptr m[4];
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(drv->cuMemAlloc(&m[i], (size_t)B * H * N * D * 4), CUDA_SUCCESS);
    c->tq = make(m[0], 4, c->qs), c->tk = make(m[1], 4, c->qs);
    c->tv = make(m[2], 4, c->vs), c->to = make(m[3], 4, c->vs);
    c->args.struct_size = sizeof c->args;
    c->args.q = &c->tq, c->args.k = &c->tk, c->args.v = &c->tv, c->args.o = &c->to;
    c->args.scale = 1.0f;
    c->args.family = "la_recurrent";
    c->p.op = LJ_OP_FWD;
    c->p.dtype = LJ_F32;
    c->p.B = B, c->p.H = H, c->p.N = N, c->p.D = D, c->p.E = E, c->p.T = 1;
}

static const char memory_image[] = "\x7f"
                                   "ELF memory cache image";
static const char bundle_image[] = "\x7f"
                                   "ELF bundle image";

/* A bundle at path holding bundle_image for la_recurrent on the fake device's arch with the
 * configuration `config` (for the source key of `key_config`, or none when NULL). */
static void write_bundle(lajit_ctx *ctx, const char *path, const lj_problem *p, const char *config,
                         const lj_config *key_config)
{
    lj_env *env = lajit__ctx_env(ctx);
    lj_lua *L;
    lj_family *f;
    lj_device *dev;
    ASSERT_OK(lajit__ctx_lua(ctx, &L));
    ASSERT_OK(lajit__ctx_family(ctx, "la_recurrent", &f));
    ASSERT_OK(lajit__ctx_device(ctx, &dev));
    char bucket[256];
    ASSERT_OK(lj_family_key(f, p, bucket, sizeof bucket));
    lj_bundle *b;
    ASSERT_OK(lj_bundle_create(env, path, &b));
    lj_bundle_item it;
    memset(&it, 0, sizeof it);
    it.family = "la_recurrent", it.arch = dev->info.arch, it.bucket = bucket, it.config = config;
    it.entry = "la_recurrent_fwd";
    it.image = bundle_image, it.size = sizeof bundle_image;
    if (key_config) {
        lj_kernel_job job;
        ASSERT_OK(lj_kernel_prepare_ex(L, f, key_config, p, &dev->info, 0, 0, &job));
        it.source_key = job.source_key;
        lj_kernel_job_free(L, &job);
    }
    ASSERT_OK(lj_bundle_add(b, &it));
    ASSERT_OK(lj_bundle_finish(b));
}

static lajit_ctx *bundle_ctx(const char *bundle)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.bundle = bundle;
    desc.flags = LAJIT_CTX_NO_DISK_CACHE;
    desc.log = capture_log;
    desc.log_level = LAJIT_LOG_INFO;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lajit__ctx_set_driver(ctx, lj_fake_driver());
    return ctx;
}

static void tmp_bundle(char *out, size_t cap)
{
    snprintf(out, cap, "%s/ops-build-%ld.bundle", lj_test_tmpdir(), (long)getpid());
}

static void require_nvrtc(void)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    int major, minor;
    if (lj_nvrtc_version(&env, &major, &minor) != LAJIT_OK)
        lj_test_skip("NVRTC not available");
}

/* The kernel is in the context's memory cache and in the bundle: memory serves it (the first
 * level), the bundle's image never reaches the driver. */
LJ_TEST(memory_cache_before_bundle)
{
    require_nvrtc();
    fwd_case c;
    fwd_case_open(&c);
    char path[512];
    tmp_bundle(path, sizeof path);
    /* A context without the bundle finds the default configuration's key. */
    lajit_ctx *ctx0 = bundle_ctx(NULL);
    lj_family *f;
    lj_device *dev;
    lj_lua *L;
    lj_config dflt;
    ASSERT_OK(lajit__ctx_family(ctx0, "la_recurrent", &f));
    ASSERT_OK(lajit__ctx_device(ctx0, &dev));
    ASSERT_OK(lj_family_default(f, &c.p, &dev->info, &dflt));
    char text[256];
    lj_config_format(&dflt, text, sizeof text);
    write_bundle(ctx0, path, &c.p, text, &dflt);
    lajit_ctx_destroy(ctx0);

    lajit_ctx *ctx = bundle_ctx(path);
    lj_cache *cache;
    ASSERT_OK(lajit__ctx_lua(ctx, &L));
    ASSERT_OK(lajit__ctx_cache(ctx, &cache));
    ASSERT_OK(lajit__ctx_family(ctx, "la_recurrent", &f));
    ASSERT_OK(lajit__ctx_device(ctx, &dev));
    lj_kernel_job job;
    ASSERT_OK(lj_kernel_prepare(L, f, &dflt, &c.p, &dev->info, 0, &job));
    lj_compiled comp;
    memset(&comp, 0, sizeof comp);
    comp.image = (void *)memory_image;
    comp.image_size = sizeof memory_image;
    comp.regs = -1;
    ASSERT_OK(lj_cache_put(cache, job.key, 0, &comp));
    lj_kernel_job_free(L, &job);

    log_seen[0] = 0;
    ASSERT_OK(lajit_attn_fwd(ctx, &c.args));
    ASSERT_TRUE(lj_fake_last_image() != NULL);
    ASSERT_EQ(memcmp(lj_fake_last_image(), memory_image, sizeof memory_image), 0);
    ASSERT_CONTAINS(log_seen, "(memory)");
    lajit_ctx_destroy(ctx);

    /* With the memory cache empty the bundle serves it. */
    ctx = bundle_ctx(path);
    log_seen[0] = 0;
    ASSERT_OK(lajit_attn_fwd(ctx, &c.args));
    ASSERT_EQ(memcmp(lj_fake_last_image(), bundle_image, sizeof bundle_image), 0);
    ASSERT_CONTAINS(log_seen, "(bundle)");
    lajit_ctx_destroy(ctx);
    unlink(path);
}

/* A bundle's configuration that the family's valid() refuses for this problem (TILE_V=32 does
 * not divide E=16) is logged and not used: the default runs. */
LJ_TEST(invalid_bundle_config_refused)
{
    require_nvrtc();
    fwd_case c;
    fwd_case_open(&c);
    char path[512];
    tmp_bundle(path, sizeof path);
    lajit_ctx *ctx0 = bundle_ctx(NULL);
    write_bundle(ctx0, path, &c.p, "TILE_V=32 WARPS=1", NULL);
    lajit_ctx_destroy(ctx0);

    lajit_ctx *ctx = bundle_ctx(path);
    log_seen[0] = 0;
    ASSERT_OK(lajit_attn_fwd(ctx, &c.args));
    ASSERT_CONTAINS(log_seen, "[TILE_V=32 WARPS=1] for la_recurrent");
    ASSERT_CONTAINS(log_seen, "is not valid here (TILE_V=32 does not divide E=16): default");
    ASSERT_CONTAINS(log_seen, "plan la_recurrent [TILE_V=16");
    lajit_ctx_destroy(ctx);
    unlink(path);
}
