/* custom.c — families from outside the library (op "custom", issue 21) with no GPU: the family
 * path (listing, name clashes, the override flag), a custom family expanded and compiled, its
 * declared arguments enforced by lajit_launch (every refusal with its status and a message
 * naming the argument), launches through the fake driver (grid from the symbols, the packed
 * lj_arg parameter, plan reuse within a bucket of the dynamic symbol), and the tuner, a bundle
 * written by lj_gen_write and a context served from it with no compiler. The family is
 * tests/data/families/toy_axpy. */
#include "test.h"

#include <sys/stat.h>

#include "context.h"
#include "fake_driver.h"
#include "gen.h"
#include "gpu.h"
#include "op_sweep.h"
#include "search.h"

static const char *families_dir(void)
{
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/data/families", lj_test_source_dir());
    return dir;
}

/* What the plans were built from: the log's "plan ... (<source>)" lines. */
static char plan_log[4096];
static void keep_plans(void *user, lajit_log_level level, const char *message)
{
    (void)user;
    (void)level;
    if (strncmp(message, "plan ", 5) == 0 &&
        strlen(plan_log) + strlen(message) + 2 < sizeof plan_log) {
        strcat(plan_log, message);
        strcat(plan_log, "\n");
    }
}

static lajit_ctx *family_ctx(const char *bundle)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.log = keep_plans;
    desc.log_level = LAJIT_LOG_INFO;
    plan_log[0] = 0;
    desc.flags = LAJIT_CTX_NO_DISK_CACHE;
    desc.bundle = bundle;
    desc.autotune = LAJIT_AUTOTUNE_OFF;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    ASSERT_OK(lajit_ctx_add_families(ctx, families_dir()));
    lajit__ctx_set_driver(ctx, lj_fake_driver());
    return ctx;
}

LJ_TEST(family_path_lists_and_expands)
{
    lajit_ctx *ctx = family_ctx(NULL);
    const char *const *names;
    size_t n;
    ASSERT_OK(lajit_family_list(ctx, &names, &n));
    int found = 0;
    for (size_t i = 0; i < n; i++)
        found += strcmp(names[i], "toy_axpy") == 0;
    ASSERT_EQ(found, 1);
    ASSERT_TRUE(names[n] == NULL);
    lajit_family_info info = {.struct_size = sizeof info};
    ASSERT_OK(lajit_family_describe(ctx, "toy_axpy", &info));
    ASSERT_STREQ(info.op, "custom");
    ASSERT_EQ(info.n_params, 2);
    const char *assign[] = {"N=512", "dtype=bf16", "has_w=1", "THREADS=64"};
    char *src = NULL;
    ASSERT_OK(lajit_expand(ctx, "toy_axpy", "sm_90a", assign, 4, &src));
    ASSERT_CONTAINS(src, "constexpr long long N = 512;");
    ASSERT_CONTAINS(src, "constexpr bool HAS_W = true;");
    ASSERT_CONTAINS(src, "using T = lj_bf16;");
    ASSERT_CONTAINS(src, "__launch_bounds__(64)");
    lajit_free(ctx, src);
    /* A symbol out of range, a dtype the family does not take, an unknown key. */
    const char *bad[][1] = {{"N=0"}, {"dtype=f16"}, {"M=3"}, {"has_w=2"}};
    for (int i = 0; i < 4; i++) {
        ASSERT_STATUS(lajit_expand(ctx, "toy_axpy", "sm_90a", bad[i], 1, &src),
                      LAJIT_ERR_INVALID_ARGUMENT);
        ASSERT_TRUE(lajit_errmsg(ctx)[0] != 0);
    }
    lajit_ctx_destroy(ctx);
}

/* A family folder named name holding a copy of toy_axpy's spec, under dir. */
static void make_family(const char *dir, const char *name)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    mkdir(dir, 0700);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/%s/family.lua", dir, name);
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fprintf(f, "return { name = \"%s\" }\n", name);
    fclose(f);
}

LJ_TEST(family_path_name_rules)
{
    char a[1024], b[1024], c[1024], both[2100];
    snprintf(a, sizeof a, "%s/fp_a", lj_test_tmpdir());
    snprintf(b, sizeof b, "%s/fp_b", lj_test_tmpdir());
    snprintf(c, sizeof c, "%s/fp_c", lj_test_tmpdir());
    make_family(a, "mine");
    make_family(b, "mine");
    make_family(c, "la_fwd");
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DISK_CACHE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    /* Defined twice: in one call, or by a second call; nothing is added by a refused call. */
    snprintf(both, sizeof both, "%s:%s", a, b);
    ASSERT_STATUS(lajit_ctx_add_families(ctx, both), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "defined twice");
    const char *const *names;
    size_t n, builtin;
    ASSERT_OK(lajit_family_list(ctx, &names, &builtin));
    ASSERT_OK(lajit_ctx_add_families(ctx, a));
    ASSERT_OK(lajit_family_list(ctx, &names, &n));
    ASSERT_EQ(n, builtin + 1);
    ASSERT_STREQ(names[n - 1], "mine");
    ASSERT_STATUS(lajit_ctx_add_families(ctx, b), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "defined twice");
    /* A built-in's name: refused, unless the context asks for the override. */
    ASSERT_STATUS(lajit_ctx_add_families(ctx, c), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "built-in family");
    /* A missing folder is an error, not silence. */
    ASSERT_STATUS(lajit_ctx_add_families(ctx, "/nonexistent/lajit-families"), LAJIT_ERR_IO);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "/nonexistent/lajit-families");
    ASSERT_STATUS(lajit_ctx_add_families(ctx, NULL), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(lajit_ctx_add_families(NULL, a), LAJIT_ERR_INVALID_ARGUMENT);
    lajit_ctx_destroy(ctx);

    desc.flags |= LAJIT_CTX_FAMILY_OVERRIDE;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    ASSERT_OK(lajit_ctx_add_families(ctx, c));
    /* The outside la_fwd (a spec with only a name) is the one loaded now. */
    lajit_family_info info = {.struct_size = sizeof info};
    ASSERT_STATUS(lajit_family_describe(ctx, "la_fwd", &info), LAJIT_ERR_TEMPLATE);
    lajit_ctx_destroy(ctx);
    /* Too late: the built-in is in use already. */
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    ASSERT_OK(lajit_family_describe(ctx, "la_fwd", &info));
    ASSERT_STATUS(lajit_ctx_add_families(ctx, c), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "has used already");
    lajit_ctx_destroy(ctx);
    /* LAJIT_FAMILY_PATH is added at creation; a bad one fails the creation. */
    desc.flags = LAJIT_CTX_NO_DISK_CACHE;
    setenv("LAJIT_FAMILY_PATH", both, 1);
    ASSERT_STATUS(lajit_ctx_create(&desc, &ctx), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(NULL), "defined twice");
    setenv("LAJIT_FAMILY_PATH", a, 1);
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    ASSERT_OK(lajit_family_list(ctx, &names, &n));
    ASSERT_STREQ(names[n - 1], "mine");
    lajit_ctx_destroy(ctx);
    unsetenv("LAJIT_FAMILY_PATH");
}

/* Fake device memory for x, y [B, N] and w [N]. */
typedef struct axpy {
    CUcontext cuctx;
    CUdeviceptr x, y, w;
    int64_t xshape[2], yshape[2], wshape[1];
    DLTensor tx, ty, tw;
    lajit_tensor_arg tensors[3];
    lajit_scalar_arg scalars[1];
    lajit_launch_args args;
} axpy;

/* A compact float32 view of fake device memory, its shape in shape (which the test may change
 * afterwards: the view points at it). */
static DLTensor make(CUdeviceptr p, int ndim, int64_t *shape)
{
    lj_test_tensor t;
    DLTensor v = *lj_gpu_tensor(&t, p, 0, ndim, shape, NULL, lj_test_dl_dtype(LJ_F32));
    v.shape = shape;
    return v;
}

static void axpy_open(axpy *u, int B, int N)
{
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    memset(u, 0, sizeof *u);
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&u->cuctx, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(u->cuctx), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->x, (size_t)B * N * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->y, (size_t)B * N * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->w, (size_t)N * 4), CUDA_SUCCESS);
    u->xshape[0] = u->yshape[0] = B;
    u->xshape[1] = u->yshape[1] = u->wshape[0] = N;
    u->tx = make(u->x, 2, u->xshape);
    u->ty = make(u->y, 2, u->yshape);
    u->tw = make(u->w, 1, u->wshape);
    u->tensors[0] = (lajit_tensor_arg){"x", &u->tx};
    u->tensors[1] = (lajit_tensor_arg){"y", &u->ty};
    u->tensors[2] = (lajit_tensor_arg){"w", &u->tw};
    u->scalars[0] = (lajit_scalar_arg){"alpha", 0.5};
    u->args.struct_size = sizeof u->args;
    u->args.family = "toy_axpy";
    u->args.tensors = u->tensors;
    u->args.n_tensors = 2; /* w left out */
    u->args.scalars = u->scalars;
    u->args.n_scalars = 1;
}

static void axpy_close(axpy *u)
{
    const lj_driver *drv = lj_fake_driver();
    drv->cuMemFree(u->x);
    drv->cuMemFree(u->y);
    drv->cuMemFree(u->w);
    drv->cuDevicePrimaryCtxRelease(0);
}

LJ_TEST(launch_packs_declared_arguments)
{
    sweep_require_nvrtc();
    lj_fake_driver_reset();
    axpy u;
    axpy_open(&u, 3, 1000);
    lajit_ctx *ctx = family_ctx(NULL);
    ASSERT_OK(lajit_launch(ctx, &u.args));
    ASSERT_EQ(lj_fake_launch_count(), 1);
    const lj_fake_launch *l = lj_fake_launch_get(0);
    ASSERT_STREQ(l->entry, "toy_axpy");
    ASSERT_EQ(l->grid[0], 8u); /* ceil(1000 / 128) */
    ASSERT_EQ(l->grid[1], 3u);
    ASSERT_EQ(l->block[0], 128u);
    /* The first parameter is x's lj_arg<2>: address, sizes, strides. */
    long long first[5];
    memcpy(first, &l->params, sizeof first);
    ASSERT_EQ((unsigned long long)first[0], (unsigned long long)u.x);
    ASSERT_EQ(first[1], 3);
    ASSERT_EQ(first[2], 1000);
    ASSERT_EQ(first[3], 1000);
    ASSERT_EQ(first[4], 1);
    int loads = lj_fake_driver_counts()->loads;
    /* B is dynamic: B = 2 is in B = 3's log2 bucket (one plan); B = 5 is not. */
    u.xshape[0] = u.yshape[0] = 2;
    ASSERT_OK(lajit_launch(ctx, &u.args));
    ASSERT_EQ(lj_fake_driver_counts()->loads, loads);
    ASSERT_EQ(lj_fake_launch_get(1)->grid[1], 2u);
    /* With w: has_w is part of the problem, so another kernel. */
    u.args.n_tensors = 3;
    ASSERT_OK(lajit_launch(ctx, &u.args));
    ASSERT_EQ(lj_fake_driver_counts()->loads, loads + 1);
    /* Arguments in another order than declared are matched by name. */
    lajit_tensor_arg swapped[3] = {u.tensors[2], u.tensors[1], u.tensors[0]};
    u.args.tensors = swapped;
    ASSERT_OK(lajit_launch(ctx, &u.args));
    ASSERT_EQ(lj_fake_driver_counts()->loads, loads + 1);
    /* Graph capture: the cached launch records into the capture. */
    CUstream s;
    ASSERT_EQ(lj_fake_driver()->cuStreamCreate(&s, 0), CUDA_SUCCESS);
    ASSERT_EQ(lj_fake_driver()->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL),
              CUDA_SUCCESS);
    u.args.stream = s;
    ASSERT_OK(lajit_launch(ctx, &u.args));
    CUgraph g;
    ASSERT_EQ(lj_fake_driver()->cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    ASSERT_EQ(lj_fake_driver_counts()->captured_launches, 1);
    lj_fake_driver()->cuGraphDestroy(g);
    lj_fake_driver()->cuStreamDestroy(s);
    lajit_ctx_destroy(ctx);
    axpy_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(launch_refuses_what_the_declaration_does_not_allow)
{
    sweep_require_nvrtc();
    lj_fake_driver_reset();
    axpy u;
    axpy_open(&u, 3, 1000);
    lajit_ctx *ctx = family_ctx(NULL);
    lajit_launch_args a = u.args;
    /* y in another dtype than x (the problem's). */
    u.ty.dtype.code = kDLBfloat;
    u.ty.dtype.bits = 16;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "y is bfloat16; expected f32");
    u.ty = make(u.y, 2, u.yshape);
    /* A dtype the family does not take. */
    u.tx.dtype.bits = u.ty.dtype.bits = 16;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_UNSUPPORTED);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "does not take dtype f16");
    u.tx.dtype.bits = u.ty.dtype.bits = 32;
    /* Sizes that disagree on a symbol. */
    int64_t short_shape[2] = {3, 999};
    u.ty.shape = short_shape;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "y's dimension 1 (N) is 999, but N = 1000 (x)");
    u.ty.shape = u.yshape;
    /* A problem value that contradicts the tensors. */
    lajit_int_arg n_wrong = {"N", 1024};
    a.problem = &n_wrong;
    a.n_problem = 1;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "x's dimension 1 (N) is 1000, but N = 1024");
    lajit_int_arg not_symbol = {"has_w", 1};
    a.problem = &not_symbol;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "not a shape symbol");
    a.problem = NULL;
    a.n_problem = 0;
    /* Missing, unknown and repeated names. */
    a.n_tensors = 1;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "tensor y is required");
    lajit_tensor_arg odd[2] = {{"x", &u.tx}, {"z", &u.ty}};
    a.tensors = odd;
    a.n_tensors = 2;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "named \"z\", which the family does not declare (its "
                                       "tensors: x, w, y)");
    lajit_tensor_arg twice[3] = {{"x", &u.tx}, {"y", &u.ty}, {"x", &u.tx}};
    a.tensors = twice;
    a.n_tensors = 3;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "tensor x is given twice");
    a.tensors = u.tensors;
    a.n_tensors = 2;
    a.n_scalars = 0;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "scalar alpha is required");
    lajit_scalar_arg inf = {"alpha", 1e300};
    a.scalars = &inf;
    a.n_scalars = 1;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "not a finite float");
    a.scalars = u.scalars;
    /* The last stride must be 1 (unit_stride); the optional w with a wrong size. */
    int64_t strides[2] = {2000, 2};
    u.tx.strides = strides;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "x's last stride is 2; the family needs 1");
    /* A stride whose byte offset overflows: refused, not wrapped. */
    int64_t huge[2] = {(int64_t)1 << 61, 1};
    u.tx.strides = huge;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "x spans more than 2^62 bytes");
    u.tx.strides = NULL;
    int64_t wshape[1] = {999};
    u.tw.shape = wshape;
    a.n_tensors = 3;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "w's dimension 0 (N) is 999");
    u.tw.shape = u.wshape;
    /* An output that overlaps an input; a misaligned address; host memory. */
    u.ty.data = u.tx.data;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "shares elements");
    u.ty.data = (void *)(uintptr_t)(u.y + 2);
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "not a multiple of 4 bytes");
    u.ty = make(u.y, 2, u.yshape);
    u.tw.device.device_type = kDLCPU;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "w is not CUDA memory");
    u.tw.device.device_type = kDLCUDA;
    /* Not a custom family; no such family; a bad struct size. */
    a.family = "la_fwd";
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "call lajit_attn_fwd");
    a.family = "no_such_family";
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_NOT_FOUND);
    a.family = "toy_axpy";
    a.struct_size--;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_STRUCT_SIZE);
    a.struct_size++;
    ASSERT_EQ(lj_fake_launch_count(), 0);
    ASSERT_OK(lajit_launch(ctx, &a));
    ASSERT_EQ(lj_fake_launch_count(), 1);
    ASSERT_STATUS(lajit_launch(NULL, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(lajit_launch(ctx, NULL), LAJIT_ERR_INVALID_ARGUMENT);
    lajit_ctx_destroy(ctx);
    axpy_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* A family whose tensors all have fixed dtypes and which takes one problem dtype needs no dtype
 * said; one that takes several must be told. */
LJ_TEST(fixed_dtype_family_needs_no_dtype)
{
    sweep_require_nvrtc();
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s/fixed_families", lj_test_tmpdir());
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/fill_f32", dir);
    mkdir(path, 0700);
    for (int dtypes = 1; dtypes <= 2; dtypes++) {
        snprintf(path, sizeof path, "%s/fill_f32/family.lua", dir);
        FILE *f = fopen(path, "w");
        ASSERT_TRUE(f != NULL);
        fprintf(f,
                "return { name = 'fill_f32', op = 'custom',\n"
                "  args = { { name = 'x', dtype = 'f32', shape = { 'N' }, output = true },\n"
                "           { name = 'value', scalar = 'f32' } },\n"
                "  dtypes = { %s }, params = { T = { 32 } }, problems = { { N = 32 } },\n"
                "  valid = function() return true end, default = function() return { T = 32 } "
                "end,\n"
                "  key = function(p) return p.dtype .. ' N' .. p.N end,\n"
                "  launch = function() return { grid = { { 'N', 32 }, 1, 1 }, block = { 32, 1, 1 "
                "}, smem = 0, entry = 'fill_f32' } end,\n"
                "  source = function() return { template = 'fill_f32/k.cu', consts = {} } end }\n",
                dtypes == 1 ? "'f32'" : "'f32', 'f16'");
        fclose(f);
        snprintf(path, sizeof path, "%s/fill_f32/k.cu", dir);
        f = fopen(path, "w");
        ASSERT_TRUE(f != NULL);
        fputs("#include \"common/args.cuh\"\n"
              "extern \"C\" __global__ void fill_f32(lj_arg<1> x, float value)\n"
              "{ const long long i = blockIdx.x * 32ll + threadIdx.x;\n"
              "  if (i < x.size[0]) static_cast<float *>(x.ptr)[i * x.stride[0]] = value; }\n",
              f);
        fclose(f);
        lj_fake_driver_reset();
        axpy u;
        axpy_open(&u, 1, 100);
        lajit_ctx *ctx = family_ctx(NULL);
        ASSERT_OK(lajit_ctx_add_families(ctx, dir));
        int64_t shape[1] = {100};
        DLTensor tx = make(u.x, 1, shape);
        lajit_tensor_arg t[1] = {{"x", &tx}};
        lajit_scalar_arg v[1] = {{"value", 2.0}};
        lajit_launch_args a;
        memset(&a, 0, sizeof a);
        a.struct_size = sizeof a;
        a.family = "fill_f32";
        a.tensors = t;
        a.n_tensors = 1;
        a.scalars = v;
        a.n_scalars = 1;
        if (dtypes == 1) {
            ASSERT_OK(lajit_launch(ctx, &a));
            ASSERT_EQ(lj_fake_launch_get(0)->grid[0], 4u);
        } else {
            ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
            ASSERT_CONTAINS(lajit_errmsg(ctx), "no dtype given");
            a.dtype = "f16";
            ASSERT_OK(lajit_launch(ctx, &a));
        }
        lajit_ctx_destroy(ctx);
        axpy_close(&u);
        ASSERT_TRUE(lj_fake_driver_balanced());
    }
}

static lajit_status load_family(void *user, const char *name, lj_family **out)
{
    return lajit__ctx_family(user, name, out);
}

/* The fake clock: more threads are faster, so THREADS=256 wins. */
static double axpy_time(const lj_fake_launch *l, void *user)
{
    (void)user;
    return 1.0 / l->block[0];
}

/* Tunes the first representative problem of family (the fake clock set by the caller) on ctx's
 * fake device into *res. */
static void tune_first_problem(lajit_ctx *ctx, const char *family, lj_search_out *res)
{
    lj_env *env = lajit__ctx_env(ctx);
    lj_family *f;
    lj_lua *L;
    lj_cache *cache;
    lj_device *dev;
    ASSERT_OK(lajit__ctx_family(ctx, family, &f));
    ASSERT_OK(lajit__ctx_lua(ctx, &L));
    ASSERT_OK(lajit__ctx_cache(ctx, &cache));
    ASSERT_OK(lajit__ctx_device(ctx, &dev));
    lj_problem *probs;
    int np;
    ASSERT_OK(lj_family_problems(f, &probs, &np));
    lj_search_opts opts = {0};
    ASSERT_OK(lj_search_run(env, L, f, cache, dev, &probs[0], &opts, res));
    lj_free(env, probs);
}

LJ_TEST(tuned_bundled_and_served_without_a_compiler)
{
    sweep_require_nvrtc();
    lj_fake_driver_reset();
    lj_fake_driver_set_kernel_time(axpy_time, NULL);
    lajit_ctx *ctx = family_ctx(NULL);
    lj_env *env = lajit__ctx_env(ctx);
    lj_lua *L;
    ASSERT_OK(lajit__ctx_lua(ctx, &L));
    lj_search_out res;
    tune_first_problem(ctx, "toy_axpy", &res);
    ASSERT_EQ(res.have_best, 1);
    ASSERT_EQ(lj_config_get(&res.best, "THREADS", 0), 256);
    lj_search_out_free(env, &res);

    char path[1200];
    snprintf(path, sizeof path, "%s/custom.lajitpack", lj_test_tmpdir());
    const char *fams[] = {"toy_axpy"}, *archs[] = {"sm_90a"};
    lj_gen_opts o;
    memset(&o, 0, sizeof o);
    o.families = fams;
    o.n_families = 1;
    o.archs = archs;
    o.n_archs = 1;
    const char *assign[] = {"N=1000"};
    o.assign = assign;
    o.n_assign = 1;
    lj_gen_summary sum;
    ASSERT_OK(lj_gen_write(env, L, load_family, ctx, &o, path, &sum));
    ASSERT_TRUE(sum.cubins >= 1);
    lajit_ctx_destroy(ctx);

    /* The bundle's kernel serves the launch (no compile: the plan says where it came from). */
    lj_fake_driver_reset();
    axpy u;
    axpy_open(&u, 4, 1000);
    ctx = family_ctx(path);
    ASSERT_OK(lajit_launch(ctx, &u.args));
    ASSERT_EQ(lj_fake_launch_count(), 1);
    ASSERT_STREQ(lj_fake_launch_get(0)->entry, "toy_axpy");
    ASSERT_CONTAINS(plan_log, "toy_axpy [THREADS=128 UNROLL=1] for custom f32 B=4 N=1000 on "
                              "sm_90a (bundle)");
    /* With w in f32: a problem the bundle does not hold (it has bf16 with w) is compiled. */
    u.args.n_tensors = 3;
    ASSERT_OK(lajit_launch(ctx, &u.args));
    ASSERT_CONTAINS(plan_log, "N=1000 has_w on sm_90a (compiled)");
    lajit_ctx_destroy(ctx);
    axpy_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* A family's workspace argument (tests/data/families/toy_rowsum: its ws first, so the fake
 * driver's record of the first parameter shows it): the context's buffer, sized per launch by
 * the spec (16-byte ticket + 16 bytes of partial sums per row of B), reused while it is large
 * enough, grown for a larger B; never the caller's to give. */
LJ_TEST(workspace_is_the_contexts_and_sized_per_launch)
{
    sweep_require_nvrtc();
    lj_fake_driver_reset();
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    CUcontext cu;
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&cu, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(cu), CUDA_SUCCESS);
    CUdeviceptr x, y;
    ASSERT_EQ(drv->cuMemAlloc(&x, 16 * 4096 * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&y, 16 * 4), CUDA_SUCCESS);
    int64_t xs[2] = {8, 4096}, ys[1] = {8};
    DLTensor tx = make(x, 2, xs), ty = make(y, 1, ys);
    lajit_tensor_arg t[3] = {{"x", &tx}, {"y", &ty}, {"ws", &ty}};
    lajit_launch_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.family = "toy_rowsum";
    a.tensors = t;
    a.n_tensors = 2;
    lajit_ctx *ctx = family_ctx(NULL);
    ASSERT_OK(lajit_launch(ctx, &a));
    long long ws[3];
    memcpy(ws, &lj_fake_launch_get(0)->params, sizeof ws);
    ASSERT_TRUE(ws[0] != 0);
    ASSERT_EQ(ws[1], 8 * 32); /* PARTS = 4 (the default): 16 + 16 bytes per row */
    ASSERT_EQ(ws[2], 1);
    ASSERT_EQ(lj_fake_launch_get(0)->grid[0], 4u);
    /* A smaller B: the same buffer, its size for this launch. */
    xs[0] = ys[0] = 5;
    ASSERT_OK(lajit_launch(ctx, &a));
    long long ws2[3];
    memcpy(ws2, &lj_fake_launch_get(1)->params, sizeof ws2);
    ASSERT_EQ(ws2[0], ws[0]);
    ASSERT_EQ(ws2[1], 5 * 32);
    /* A larger B grows it. */
    xs[0] = ys[0] = 16;
    ASSERT_OK(lajit_launch(ctx, &a));
    memcpy(ws2, &lj_fake_launch_get(2)->params, sizeof ws2);
    ASSERT_TRUE(ws2[0] != 0);
    ASSERT_EQ(ws2[1], 16 * 32);
    /* The caller may not give it, as a tensor or as a scalar. */
    a.n_tensors = 3;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "ws is the family's workspace: lajit provides it");
    a.n_tensors = 2;
    lajit_scalar_arg s = {"ws", 1.0};
    a.scalars = &s;
    a.n_scalars = 1;
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "ws is the family's workspace");
    lajit_ctx_destroy(ctx);
    ASSERT_EQ(drv->cuMemFree(x), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemFree(y), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* The fake clock for toy_rowsum: PARTS = 1 (no workspace) is slower, so the tuner must time the
 * configurations that need one. */
static double rowsum_time(const lj_fake_launch *l, void *user)
{
    (void)user;
    return 1.0 / l->grid[0] + 1.0 / l->block[0];
}

/* The tuner times a workspace family's configurations with a workspace of each one's size (and
 * none for those that need none): the candidate that needs one wins and nothing faults. */
LJ_TEST(tuner_gives_each_candidate_its_workspace)
{
    sweep_require_nvrtc();
    lj_fake_driver_reset();
    lj_fake_driver_set_kernel_time(rowsum_time, NULL);
    lajit_ctx *ctx = family_ctx(NULL);
    lj_search_out res;
    int first = lj_fake_launch_count();
    tune_first_problem(ctx, "toy_rowsum", &res);
    ASSERT_EQ(res.have_best, 1);
    ASSERT_EQ(lj_config_get(&res.best, "PARTS", 0), 4);
    ASSERT_EQ(lj_config_get(&res.best, "THREADS", 0), 256);
    int with = 0, without = 0;
    for (int i = first; i < lj_fake_launch_count(); i++) {
        const lj_fake_launch *l = lj_fake_launch_get(i);
        long long ws[2];
        memcpy(ws, &l->params, sizeof ws);
        if (l->grid[0] == 4) {
            ASSERT_TRUE(ws[0] != 0);
            ASSERT_EQ(ws[1], 8 * 32);
            with++;
        } else {
            ASSERT_EQ(ws[0], 0);
            ASSERT_EQ(ws[1], 0);
            without++;
        }
    }
    ASSERT_TRUE(with > 0 && without > 0);
    lj_search_out_free(lajit__ctx_env(ctx), &res);
    lajit_ctx_destroy(ctx);
    ASSERT_TRUE(lj_fake_driver_balanced());
}
