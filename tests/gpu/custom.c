/* custom.c — lajit_launch on a real GPU with the smallest custom family
 * (tests/data/families/toy_axpy, y = alpha * w * x + y): values against a double-precision
 * host computation in f32 and bf16, with and without the optional w, on strided rows, inside a
 * captured CUDA graph; and a family whose kernel does not take what its spec declares, refused
 * when its module loads (cuFuncGetParamInfo) instead of launching with the wrong arguments. */
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "gpu.h"

static lajit_ctx *open_ctx(const char *family_path)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DISK_CACHE;
    desc.autotune = LAJIT_AUTOTUNE_OFF;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    ASSERT_OK(lajit_ctx_add_families(ctx, family_path));
    return ctx;
}

static const char *families_dir(void)
{
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/data/families", lj_test_source_dir());
    return dir;
}

static float frand(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}

/* One case: B rows of N (row stride ld >= N elements), dtype dt, w given or not, in a graph or
 * not. The result must equal alpha * w * x + y computed in double from the rounded inputs,
 * within one rounding of dt; elements between rows must stay as poisoned. */
static void run_case(lajit_ctx *ctx, int B, int N, int ld, lj_dtype dt, int with_w, int graph)
{
    size_t es = lj_test_dtype_size(dt), total = (size_t)B * ld;
    float *x = malloc(total * sizeof *x), *y = malloc(total * sizeof *y),
          *w = malloc((size_t)N * 4);
    float *got = malloc(total * sizeof *got);
    unsigned seed = 12345u + (unsigned)(B * 7 + N + ld + dt * 3 + with_w);
    for (size_t i = 0; i < total; i++) {
        x[i] = lj_round_to(frand(&seed), dt);
        y[i] = lj_round_to(frand(&seed), dt);
    }
    for (int i = 0; i < N; i++)
        w[i] = 1.0f + frand(&seed);
    CUdeviceptr dx = lj_gpu_alloc(total * es), dy = lj_gpu_alloc(total * es),
                dw = lj_gpu_alloc((size_t)N * 4);
    lj_gpu_upload_as(dx, x, total, dt);
    lj_gpu_upload_as(dy, y, total, dt);
    lj_gpu_upload(dw, w, (size_t)N * 4);
    /* The gaps between rows are poisoned: the kernel must not touch them. */
    if (ld > N)
        for (int b = 0; b < B; b++)
            lj_gpu_poison(dy + ((size_t)b * ld + N) * es, (size_t)(ld - N) * es);
    lj_test_tensor tx, ty, tw;
    int64_t shape[2] = {B, N}, strides[2] = {ld, 1}, wshape[1] = {N};
    lajit_tensor_arg tensors[3] = {
        {"x", lj_gpu_tensor(&tx, dx, 0, 2, shape, strides, lj_test_dl_dtype(dt))},
        {"y", lj_gpu_tensor(&ty, dy, 0, 2, shape, strides, lj_test_dl_dtype(dt))},
        {"w", lj_gpu_tensor(&tw, dw, 0, 1, wshape, NULL, lj_test_dl_dtype(LJ_F32))}};
    lajit_scalar_arg scalars[1] = {{"alpha", 0.75}};
    lajit_launch_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.family = "toy_axpy";
    a.tensors = tensors;
    a.n_tensors = with_w ? 3 : 2;
    a.scalars = scalars;
    a.n_scalars = 1;
    const lj_driver *drv = lj_gpu_driver();
    CUstream s;
    ASSERT_EQ(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    a.stream = s;
    if (graph) {
        /* The plan is built outside the capture (a first call compiles), then y is reset and
         * the captured launch replayed once. */
        ASSERT_OK(lajit_launch(ctx, &a));
        lj_gpu_stream_sync(s);
        lj_gpu_upload_as(dy, y, total, dt);
        if (ld > N)
            for (int b = 0; b < B; b++)
                lj_gpu_poison(dy + ((size_t)b * ld + N) * es, (size_t)(ld - N) * es);
        CUgraph g;
        CUgraphExec ge;
        ASSERT_EQ(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
        ASSERT_OK(lajit_launch(ctx, &a));
        ASSERT_EQ(drv->cuStreamEndCapture(s, &g), CUDA_SUCCESS);
        ASSERT_EQ(drv->cuGraphInstantiate(&ge, g, 0), CUDA_SUCCESS);
        ASSERT_EQ(drv->cuGraphLaunch(ge, s), CUDA_SUCCESS);
        lj_gpu_stream_sync(s);
        drv->cuGraphExecDestroy(ge);
        drv->cuGraphDestroy(g);
    } else {
        ASSERT_OK(lajit_launch(ctx, &a));
        lj_gpu_stream_sync(s);
    }
    lj_gpu_download_as(got, dy, total, dt);
    double tol = dt == LJ_F32 ? 1e-6 : 1.0 / 128;
    int bad = 0;
    for (int b = 0; b < B; b++) {
        for (int n = 0; n < ld; n++) {
            size_t i = (size_t)b * ld + n;
            if (n >= N) {
                bad += !isnan(got[i]);
                continue;
            }
            double want = 0.75 * (with_w ? (double)w[n] : 1.0) * x[i] + y[i];
            bad += !(fabs(got[i] - want) <= tol * (1.0 + fabs(want)));
        }
    }
    if (bad)
        lj_test_fail(__FILE__, __LINE__, "toy_axpy B=%d N=%d ld=%d %s w=%d graph=%d: %d wrong", B,
                     N, ld, lj_dtype_name(dt), with_w, graph, bad);
    drv->cuStreamDestroy(s);
    lj_gpu_free(dx);
    lj_gpu_free(dy);
    lj_gpu_free(dw);
    free(x);
    free(y);
    free(w);
    free(got);
}

LJ_TEST(toy_axpy_against_double)
{
    lj_gpu_init();
    lajit_ctx *ctx = open_ctx(families_dir());
    run_case(ctx, 3, 1000, 1000, LJ_F32, 0, 0);
    run_case(ctx, 3, 1000, 1000, LJ_F32, 1, 0);
    run_case(ctx, 5, 1000, 1024, LJ_BF16, 1, 0); /* strided rows, another B bucket */
    run_case(ctx, 2, 1000, 1008, LJ_BF16, 0, 1); /* inside a CUDA graph */
    run_case(ctx, 200, 1024, 1024, LJ_F32, 0, 1);
    lajit_ctx_destroy(ctx);
}

/* toy_rowsum (tests/data/families): four CTAs per row meet in the family's workspace, which
 * lajit allocates (zeroed) and keeps. Each row's sum against double; the same bits on every
 * launch (the kernel leaves its tickets as it found them, so a second launch on the same
 * workspace is right too); a larger B grows the workspace; a graph replays a captured launch. */
static void rowsum_case(lajit_ctx *ctx, int B, int N, int reps, int graph)
{
    float *x = malloc((size_t)B * N * 4), *got = malloc((size_t)B * 4),
          *first = malloc((size_t)B * 4);
    unsigned seed = 777u + (unsigned)B;
    for (size_t i = 0; i < (size_t)B * N; i++)
        x[i] = frand(&seed);
    CUdeviceptr dx = lj_gpu_alloc((size_t)B * N * 4), dy = lj_gpu_alloc((size_t)B * 4);
    lj_gpu_upload(dx, x, (size_t)B * N * 4);
    lj_test_tensor tx, ty;
    int64_t xs[2] = {B, N}, ys[1] = {B};
    lajit_tensor_arg t[2] = {
        {"x", lj_gpu_tensor(&tx, dx, 0, 2, xs, NULL, lj_test_dl_dtype(LJ_F32))},
        {"y", lj_gpu_tensor(&ty, dy, 0, 1, ys, NULL, lj_test_dl_dtype(LJ_F32))}};
    lajit_launch_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.family = "toy_rowsum";
    a.tensors = t;
    a.n_tensors = 2;
    const lj_driver *drv = lj_gpu_driver();
    for (int r = 0; r < reps; r++) {
        lj_gpu_poison(dy, (size_t)B * 4);
        if (graph && r > 0) {
            CUstream s;
            ASSERT_EQ(drv->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
            a.stream = s;
            CUgraph g;
            CUgraphExec ge;
            ASSERT_EQ(drv->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                      CUDA_SUCCESS);
            ASSERT_OK(lajit_launch(ctx, &a));
            ASSERT_EQ(drv->cuStreamEndCapture(s, &g), CUDA_SUCCESS);
            ASSERT_EQ(drv->cuGraphInstantiate(&ge, g, 0), CUDA_SUCCESS);
            ASSERT_EQ(drv->cuGraphLaunch(ge, s), CUDA_SUCCESS);
            ASSERT_EQ(drv->cuGraphLaunch(ge, s), CUDA_SUCCESS);
            lj_gpu_stream_sync(s);
            drv->cuGraphExecDestroy(ge);
            drv->cuGraphDestroy(g);
            drv->cuStreamDestroy(s);
            a.stream = NULL;
        } else {
            ASSERT_OK(lajit_launch(ctx, &a));
            lj_gpu_stream_sync(NULL);
        }
        lj_gpu_download(got, dy, (size_t)B * 4);
        int bad = 0;
        for (int b = 0; b < B; b++) {
            double want = 0, mag = 0;
            for (int n = 0; n < N; n++) {
                want += x[(size_t)b * N + n];
                mag += fabs(x[(size_t)b * N + n]);
            }
            bad += !(fabs(got[b] - want) <= 1e-5 * mag);
        }
        if (bad)
            lj_test_fail(__FILE__, __LINE__, "toy_rowsum B=%d N=%d launch %d: %d rows wrong", B, N,
                         r, bad);
        if (r == 0)
            memcpy(first, got, (size_t)B * 4);
        else if (memcmp(first, got, (size_t)B * 4) != 0)
            lj_test_fail(__FILE__, __LINE__, "toy_rowsum B=%d: launch %d differs in its bits", B,
                         r);
    }
    lj_gpu_free(dx);
    lj_gpu_free(dy);
    free(x);
    free(got);
    free(first);
}

LJ_TEST(toy_rowsum_through_its_workspace)
{
    lj_gpu_init();
    lajit_ctx *ctx = open_ctx(families_dir());
    rowsum_case(ctx, 8, 4096, 3, 0);
    rowsum_case(ctx, 40, 4096, 2, 0); /* a larger B: the workspace grows */
    rowsum_case(ctx, 8, 4096, 2, 1);  /* a captured launch replayed twice */
    lajit_ctx_destroy(ctx);
}

/* A family whose kernel takes a float where its spec declares an i64 scalar. */
LJ_TEST(kernel_that_disagrees_with_its_declaration_is_refused)
{
    lj_gpu_init();
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s/bad_families", lj_test_tmpdir());
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/bad_args", dir);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/bad_args/family.lua", dir);
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fputs("return { name = 'bad_args', op = 'custom',\n"
          "  args = { { name = 'x', dtype = 'f32', shape = { 'N' }, output = true },\n"
          "           { name = 'count', scalar = 'i64' } },\n"
          "  dtypes = { 'f32' }, params = { T = { 32 } },\n"
          "  problems = { { N = 32 } },\n"
          "  valid = function() return true end, default = function() return { T = 32 } end,\n"
          "  key = function(p) return 'N' .. p.N end,\n"
          "  launch = function() return { grid = { 1, 1, 1 }, block = { 32, 1, 1 }, smem = 0,\n"
          "                               entry = 'bad_args' } end,\n"
          "  source = function() return { template = 'bad_args/k.cu', consts = {} } end }\n",
          f);
    fclose(f);
    snprintf(path, sizeof path, "%s/bad_args/k.cu", dir);
    f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fputs("#include \"common/args.cuh\"\n"
          "extern \"C\" __global__ void bad_args(lj_arg<1> x, float count)\n"
          "{ static_cast<float *>(x.ptr)[threadIdx.x] = count; }\n",
          f);
    fclose(f);
    lajit_ctx *ctx = open_ctx(dir);
    CUdeviceptr dx = lj_gpu_alloc(32 * 4);
    lj_test_tensor tx;
    int64_t shape[1] = {32};
    lajit_tensor_arg tensors[1] = {
        {"x", lj_gpu_tensor(&tx, dx, 0, 1, shape, NULL, lj_test_dl_dtype(LJ_F32))}};
    lajit_scalar_arg scalars[1] = {{"count", 3}};
    lajit_launch_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.family = "bad_args";
    a.tensors = tensors;
    a.n_tensors = 1;
    a.scalars = scalars;
    a.n_scalars = 1;
    int driver = 0;
    ASSERT_EQ(lj_gpu_driver()->cuDriverGetVersion(&driver), CUDA_SUCCESS);
    if (driver < 12040 || !lj_gpu_driver()->cuFuncGetParamInfo)
        lj_test_skip("the driver has no cuFuncGetParamInfo (CUDA < 12.4)");
    ASSERT_STATUS(lajit_launch(ctx, &a), LAJIT_ERR_TEMPLATE);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "parameter 2 is 4 bytes; args declares count, 8 bytes");
    lj_gpu_free(dx);
    lajit_ctx_destroy(ctx);
}
