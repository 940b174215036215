/* lajit_bench.c — lajit's benchmark: times the ops through the public C API on a GPU and
 * prints one JSON object per measurement, in the row format of DESIGN.md ("Benchmark reports"),
 * so bench/report.py can merge them with the peers' rows of the same run.
 *
 * Method (METHOD.md): random inputs (never zeros), one untimed warm-up call (compile, module
 * load), then each repetition timed alone with device events after overwriting a 256 MiB buffer
 * so no repetition finds its inputs in L2 (as triton.testing.do_bench does for the peers); the
 * median is reported. Decode is timed as the peers' decode is: a CUDA graph of many steps, each
 * on another state of a rotating set of at least 256 MiB ("cold" L2), beside an in-place update
 * (x *= c) of the same states captured the same way — the physical limit of that step.
 *
 * Modes: prefill (fwd rows), fwdbwd (fwd and fwd+bwd rows), decode (decode rows + their ceilings), dispatch (host cost of one
 * C API call on a cached kernel beside a bare cuLaunchKernel of an empty kernel), jit (a first
 * call's wall time), cp (context parallelism over this host's GPUs, one process per GPU: its own
 * file, bench/cp_bench.c, with its own arguments; bench/bench.h holds what the modes share). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "kernel.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- Helper kernels (compiled with the library's own NVRTC path) --------------------------- */

static const char helper_src[] =
    "extern \"C\" __global__ void lj_bench_empty() {}\n"
    "extern \"C\" __global__ void lj_bench_scale(float4 *x, long long n4, float c) {\n"
    "    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
    "    if (i < n4) { float4 v = x[i]; v.x *= c; v.y *= c; v.z *= c; v.w *= c; x[i] = v; }\n"
    "}\n"
    /* The same for launches with programmatic stream serialization (--pdl 1), ordered as
     * la_decode orders it (templates/common/pdl.cuh): wait for the previous kernel before any
     * access, then let the next one be scheduled. */
    "extern \"C\" __global__ void lj_bench_scale_pdl(float4 *x, long long n4, float c) {\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n"
    "    asm volatile(\"griddepcontrol.launch_dependents;\" ::: \"memory\");\n"
    "#endif\n"
    "    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
    "    if (i < n4) { float4 v = x[i]; v.x *= c; v.y *= c; v.z *= c; v.w *= c; x[i] = v; }\n"
    "}\n";

static CUfunction fn_empty, fn_scale, fn_scale_pdl;
static int sm_count;
/* Whether launches with programmatic stream serialization mean anything here: cc 9.0 or later
 * and a driver with cuLaunchKernelEx (what lajit's own launch checks, runtime/plan_build.c). */
static int pdl_supported;

static void load_helpers(lajit_ctx *ctx)
{
    lj_device *dev;
    lj_bench_check(ctx, lajit__ctx_device(ctx, &dev), "device");
    sm_count = dev->info.sms;
    pdl_supported = dev->info.cc >= 90 && lj_bench_drv->cuLaunchKernelEx != NULL;
    lj_bench_check(ctx, lj_device_make_current(lajit__ctx_env(ctx), dev), "make current");
    lj_compiled c;
    lj_bench_check(ctx,
                   lj_nvrtc_compile(lajit__ctx_env(ctx), "bench_helpers.cu", helper_src, NULL, 0,
                                    dev->info.arch, 0, &c),
                   "compiling helper kernels");
    CUmodule m;
    CU(cuModuleLoadData(&m, c.image));
    CU(cuModuleGetFunction(&fn_empty, m, "lj_bench_empty"));
    CU(cuModuleGetFunction(&fn_scale, m, "lj_bench_scale"));
    CU(cuModuleGetFunction(&fn_scale_pdl, m, "lj_bench_scale_pdl"));
    lj_compiled_free(lajit__ctx_env(ctx), &c);
}

/* pdl: launched with programmatic stream serialization (the kernel that waits first). */
static void scale_launch(CUdeviceptr p, size_t bytes, CUstream s, int pdl)
{
    long long n4 = (long long)(bytes / 16);
    float c = 0.999f;
    void *args[] = {&p, &n4, &c};
    /* One float4 per thread: the fastest in-place update measured on an H200
     * (docs/notes/la_decode.md). */
    unsigned blocks = (unsigned)((n4 + 255) / 256);
    if (pdl) {
        CUlaunchAttribute attr;
        memset(&attr, 0, sizeof attr);
        attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        CUlaunchConfig cfg = {.gridDimX = blocks,
                              .gridDimY = 1,
                              .gridDimZ = 1,
                              .blockDimX = 256,
                              .blockDimY = 1,
                              .blockDimZ = 1,
                              .hStream = s,
                              .attrs = &attr,
                              .numAttrs = 1};
        CU(cuLaunchKernelEx(&cfg, fn_scale_pdl, args, NULL));
        return;
    }
    CU(cuLaunchKernel(fn_scale, blocks, 1, 1, 256, 1, 1, 0, s, args, NULL));
}

/* ---- Timing -------------------------------------------------------------------------------- */

typedef void (*op_fn)(void *user, CUstream s);

static CUdeviceptr flush_buf;
static const size_t flush_bytes = 256u << 20;

/* Median milliseconds of fn over reps, each after an L2-clearing write of 256 MiB. */
static double time_op(op_fn fn, void *user, CUstream s, int reps)
{
    CUevent a, b;
    CU(cuEventCreate(&a, 0));
    CU(cuEventCreate(&b, 0));
    fn(user, s); /* warm-up */
    CU(cuStreamSynchronize(s));
    double *ms = malloc(sizeof(double) * (size_t)reps);
    for (int r = 0; r < reps; r++) {
        CU(cuMemsetD32Async(flush_buf, (unsigned)r, flush_bytes / 4, s));
        CU(cuEventRecord(a, s));
        fn(user, s);
        CU(cuEventRecord(b, s));
        CU(cuEventSynchronize(b));
        float t;
        CU(cuEventElapsedTime(&t, a, b));
        ms[r] = t;
    }
    double m = lj_bench_median(ms, reps);
    free(ms);
    CU(cuEventDestroy(a));
    CU(cuEventDestroy(b));
    return m;
}

/* Per-step microseconds of `steps` calls of fn captured in one graph, median of reps replays. */
static double time_graph(op_fn fn, void *user, CUstream s, int steps, int reps)
{
    for (int i = 0; i < 2; i++)
        fn(user, s);
    CU(cuStreamSynchronize(s));
    CUgraph g;
    CUgraphExec ge;
    CU(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    for (int i = 0; i < steps; i++)
        fn(user, s);
    CU(cuStreamEndCapture(s, &g));
    CU(cuGraphInstantiate(&ge, g, 0));
    CU(cuGraphLaunch(ge, s));
    CU(cuStreamSynchronize(s));
    CUevent a, b;
    CU(cuEventCreate(&a, 0));
    CU(cuEventCreate(&b, 0));
    double *us = malloc(sizeof(double) * (size_t)reps);
    for (int r = 0; r < reps; r++) {
        CU(cuEventRecord(a, s));
        CU(cuGraphLaunch(ge, s));
        CU(cuEventRecord(b, s));
        CU(cuEventSynchronize(b));
        float t;
        CU(cuEventElapsedTime(&t, a, b));
        us[r] = 1e3 * t / steps;
    }
    double m = lj_bench_median(us, reps);
    free(us);
    CU(cuEventDestroy(a));
    CU(cuEventDestroy(b));
    CU(cuGraphExecDestroy(ge));
    CU(cuGraphDestroy(g));
    return m;
}

/* ---- Prefill ------------------------------------------------------------------------------- */

typedef struct fwd_case {
    lajit_ctx *ctx;
    lajit_attn_fwd_args args;
    lajit_attn_bwd_args bwd;
} fwd_case;

static void run_fwd(void *user, CUstream s)
{
    fwd_case *c = user;
    c->args.stream = s;
    lj_bench_check(c->ctx, lajit_attn_fwd(c->ctx, &c->args), "lajit_attn_fwd");
}

/* One training step's attention: the forward, then the backward from dO (the forward's o is
 * what the caller's next layer would read; the backward needs only q, k, v and dO). */
static void run_fwdbwd(void *user, CUstream s)
{
    fwd_case *c = user;
    run_fwd(user, s);
    c->bwd.stream = s;
    lj_bench_check(c->ctx, lajit_attn_bwd(c->ctx, &c->bwd), "lajit_attn_bwd");
}

static size_t free_device_bytes(void)
{
    size_t fr, total;
    CU(cuMemGetInfo(&fr, &total));
    return fr;
}

/* fwd rows and, with `bwd`, fwdbwd rows (with ms_ds: the same step with the decay gradient).
 * extra_MiB: the device memory one step needs above its inputs, counted as the peers' allocator
 * counts it: the outputs o, dq, dk, dv (the library allocates nothing else without ds). */
static void bench_prefill(lajit_ctx *ctx, CUstream s, int B, int H, const int *Ds, int nD,
                          const int *Ns, int nN, const char *family, int bwd, const char *dtype)
{
    /* q, k, v, o and the gradients in `dtype`. */
    const int bits = strcmp(dtype, "f32") == 0 ? 32 : 16, el = bits / 8;
    const uint8_t code = strcmp(dtype, "bf16") == 0 ? kDLBfloat : kDLFloat;
    for (int di = 0; di < nD; di++) {
        for (int ni = 0; ni < nN; ni++) {
            int D = Ds[di], E = Ds[di], N = Ns[ni];
            size_t nq = (size_t)B * H * N * D, nv = (size_t)B * H * N * E;
            CUdeviceptr q = lj_bench_alloc(nq * el), k = lj_bench_alloc(nq * el),
                        v = lj_bench_alloc(nv * el), sl = lj_bench_alloc((size_t)H * 4),
                        g = bwd ? lj_bench_alloc(nv * el) : 0, dsb = lj_bench_alloc((size_t)H * 4);
            lj_bench_fill_random_dtype(q, nq, dtype, 0.1f, 1);
            lj_bench_fill_random_dtype(k, nq, dtype, 0.1f, 2);
            lj_bench_fill_random_dtype(v, nv, dtype, 0.1f, 3);
            if (bwd)
                lj_bench_fill_random_dtype(g, nv, dtype, 0.1f, 4);
            float *slopes = malloc((size_t)H * 4);
            lj_bench_check(ctx, lajit_decay_alibi(H, 0, 1, slopes), "slopes");
            CU(cuMemcpyHtoD(sl, slopes, (size_t)H * 4));
            free(slopes);
            CUdeviceptr o = lj_bench_alloc(nv * el), dq = 0, dk = 0, dv = 0;
            if (bwd)
                dq = lj_bench_alloc(nq * el), dk = lj_bench_alloc(nq * el),
                dv = lj_bench_alloc(nv * el);
            int64_t qs[4] = {B, H, N, D}, vs[4] = {B, H, N, E}, ss[1] = {H};
            DLTensor tq = lj_bench_tensor(q, 4, qs, bits, code, 0),
                     tk = lj_bench_tensor(k, 4, qs, bits, code, 0);
            DLTensor tv = lj_bench_tensor(v, 4, vs, bits, code, 0),
                     to = lj_bench_tensor(o, 4, vs, bits, code, 0);
            DLTensor ts = lj_bench_tensor(sl, 1, ss, 32, kDLFloat, 0),
                     tds = lj_bench_tensor(dsb, 1, ss, 32, kDLFloat, 0);
            DLTensor tg = lj_bench_tensor(g, 4, vs, bits, code, 0),
                     tdq = lj_bench_tensor(dq, 4, qs, bits, code, 0);
            DLTensor tdk = lj_bench_tensor(dk, 4, qs, bits, code, 0),
                     tdv = lj_bench_tensor(dv, 4, vs, bits, code, 0);
            fwd_case c;
            memset(&c, 0, sizeof c);
            c.ctx = ctx;
            c.args.struct_size = sizeof c.args;
            c.args.q = &tq;
            c.args.k = &tk;
            c.args.v = &tv;
            c.args.o = &to;
            c.args.s = &ts;
            c.args.scale = 1.0f;
            c.args.family = family;
            c.bwd.struct_size = sizeof c.bwd;
            c.bwd.q = &tq;
            c.bwd.k = &tk;
            c.bwd.v = &tv;
            c.bwd.dout = &tg;
            c.bwd.dq = &tdq;
            c.bwd.dk = &tdk;
            c.bwd.dv = &tdv;
            c.bwd.s = &ts;
            c.bwd.scale = 1.0f;
            double ms = time_op(run_fwd, &c, s, 50);
            printf("{\"op\": \"fwd\", \"impl\": \"lajit\", \"family\": \"%s\", \"dtype\": \"%s\", "
                   "\"B\": %d, \"H\": %d, \"D\": %d, \"E\": %d, \"N\": %d, \"decay\": true, "
                   "\"ms\": %.5f}\n",
                   family ? family : "default", dtype, B, H, D, E, N, ms);
            fflush(stdout);
            if (bwd) {
                run_fwdbwd(&c, s); /* plans built, kernels loaded */
                CU(cuStreamSynchronize(s));
                size_t before = free_device_bytes();
                run_fwdbwd(&c, s);
                CU(cuStreamSynchronize(s));
                size_t after = free_device_bytes();
                /* Allocator-level, as the peers' torch.cuda.max_memory_allocated: the outputs
                 * (lajit's backward allocates nothing without ds). The driver's free-memory
                 * drop across the call is reported beside it. */
                double extra = (double)(2 * nv + 2 * nq) * el / 1048576.0;
                double drop = (double)(before > after ? before - after : 0) / 1048576.0;
                double fb = time_op(run_fwdbwd, &c, s, 20);
                c.bwd.ds = &tds;
                double fbds = time_op(run_fwdbwd, &c, s, 10);
                c.bwd.ds = NULL;
                printf("{\"op\": \"fwdbwd\", \"impl\": \"lajit\", \"dtype\": \"%s\", \"B\": %d, "
                       "\"H\": %d, \"D\": %d, \"E\": %d, \"N\": %d, \"decay\": true, \"ms\": %.5f, "
                       "\"ms_ds\": %.5f, \"extra_MiB\": %.1f, \"driver_free_drop_MiB\": %.1f}\n",
                       dtype, B, H, D, E, N, fb, fbds, extra, drop);
                fflush(stdout);
            }
            CUdeviceptr frees[] = {q, k, v, o, sl, g, dq, dk, dv, dsb};
            for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++)
                if (frees[i])
                    CU(cuMemFree(frees[i]));
        }
    }
}

/* ---- JIT start-up ----------------------------------------------------------------------- */

/* The wall time of an application's first training step through lajit, in this (fresh)
 * process: context creation, plan building (template expansion, cache or NVRTC, module load) of
 * the forward and the backward's passes, and the launches, until the stream is done. The
 * application's CUDA context and tensors exist already, as they would in a framework. `what`
 * only labels the row: the caller sets up the cache directory (empty, warm) or the bundle. The
 * families are the ops' defaults on this GPU (la_fwd_sm90 and la_bwd_sm90 on sm_90a), so the row
 * says "default". */
static void bench_jit(CUstream s, const char *what, int D, int N)
{
    const int B = 4, H = 32, E = D;
    size_t nq = (size_t)B * H * N * D, nv = (size_t)B * H * N * E;
    CUdeviceptr q = lj_bench_alloc(nq * 2), k = lj_bench_alloc(nq * 2), v = lj_bench_alloc(nv * 2),
                o = lj_bench_alloc(nv * 2), g = lj_bench_alloc(nv * 2), dq = lj_bench_alloc(nq * 2),
                dk = lj_bench_alloc(nq * 2), dv = lj_bench_alloc(nv * 2),
                sl = lj_bench_alloc((size_t)H * 4);
    lj_bench_fill_random(q, nq, 16, 0.1f, 1);
    lj_bench_fill_random(k, nq, 16, 0.1f, 2);
    lj_bench_fill_random(v, nv, 16, 0.1f, 3);
    lj_bench_fill_random(g, nv, 16, 0.1f, 4);
    float slopes[256];
    lj_bench_check(NULL, lajit_decay_alibi(H, 0, 1, slopes), "slopes");
    CU(cuMemcpyHtoD(sl, slopes, (size_t)H * 4));
    CU(cuCtxSynchronize());
    int64_t qs[4] = {B, H, N, D}, vs[4] = {B, H, N, E}, ss[1] = {H};
    DLTensor tq = lj_bench_tensor(q, 4, qs, 16, kDLBfloat, 0),
             tk = lj_bench_tensor(k, 4, qs, 16, kDLBfloat, 0);
    DLTensor tv = lj_bench_tensor(v, 4, vs, 16, kDLBfloat, 0),
             to = lj_bench_tensor(o, 4, vs, 16, kDLBfloat, 0);
    DLTensor tg = lj_bench_tensor(g, 4, vs, 16, kDLBfloat, 0),
             tdq = lj_bench_tensor(dq, 4, qs, 16, kDLBfloat, 0);
    DLTensor tdk = lj_bench_tensor(dk, 4, qs, 16, kDLBfloat, 0),
             tdv = lj_bench_tensor(dv, 4, vs, 16, kDLBfloat, 0);
    DLTensor ts = lj_bench_tensor(sl, 1, ss, 32, kDLFloat, 0);
    fwd_case c;
    memset(&c, 0, sizeof c);
    c.args.struct_size = sizeof c.args;
    c.args.q = &tq, c.args.k = &tk, c.args.v = &tv, c.args.o = &to, c.args.s = &ts;
    c.args.scale = 1.0f;
    c.bwd.struct_size = sizeof c.bwd;
    c.bwd.q = &tq, c.bwd.k = &tk, c.bwd.v = &tv, c.bwd.dout = &tg;
    c.bwd.dq = &tdq, c.bwd.dk = &tdk, c.bwd.dv = &tdv, c.bwd.s = &ts, c.bwd.scale = 1.0f;

    double t0 = now_s();
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    lj_bench_check(NULL, lajit_ctx_create(&desc, &c.ctx), "context");
    run_fwdbwd(&c, s);
    CU(cuStreamSynchronize(s));
    double t1 = now_s();
    printf("{\"op\": \"jit\", \"what\": \"%s\", \"family\": \"default\", \"dtype\": \"bf16\", "
           "\"B\": %d, \"H\": %d, \"D\": %d, \"N\": %d, \"s\": %.4f}\n",
           what, B, H, D, N, t1 - t0);
    fflush(stdout);
    lajit_ctx_destroy(c.ctx);
    CUdeviceptr frees[] = {q, k, v, o, g, dq, dk, dv, sl};
    for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++)
        CU(cuMemFree(frees[i]));
}

/* ---- Decode -------------------------------------------------------------------------------- */

typedef struct decode_case {
    lajit_ctx *ctx;
    lajit_attn_decode_args args;
    DLTensor states[64];
    int64_t state_shape[4];
    CUdeviceptr state_ptr[64];
    size_t state_bytes;
    int nbuf, next;
    int pdl; /* the ceiling's launches: 1 with programmatic stream serialization */
} decode_case;

static void run_decode(void *user, CUstream s)
{
    decode_case *c = user;
    c->args.state = &c->states[c->next];
    c->args.stream = s;
    c->next = (c->next + 1) % c->nbuf;
    lj_bench_check(c->ctx, lajit_attn_decode(c->ctx, &c->args), "lajit_attn_decode");
}

static void run_scale(void *user, CUstream s)
{
    decode_case *c = user;
    scale_launch(c->state_ptr[c->next], c->state_bytes, s, c->pdl);
    c->next = (c->next + 1) % c->nbuf;
}

/* state_bits: 32 (a float32 pool) or 16 (a bfloat16 pool: half the bytes; its ceiling is the
 * in-place update of a buffer of that size). pdl: -1 when --pdl was not given (rows without the
 * field, the ceiling launched plainly); 0 or 1: ctx was created with LAJIT_PDL set to it, the
 * ceiling is launched the same way and the rows say "pdl". */
/* What a decode row varies besides B: the input dtype (q, k, v, o; "bf16", "f16" or "f32") and
 * the state layout (vk: [.., E, D]). */
typedef struct decode_variant {
    const char *in;
    int vk;
} decode_variant;

static void bench_decode(lajit_ctx *ctx, CUstream s, const int *Bs, int nB, int H, int D, int T,
                         int state_bits, int pdl, decode_variant dv)
{
    const int in_bits = strcmp(dv.in, "f32") == 0 ? 32 : 16;
    const int in_code = strcmp(dv.in, "bf16") == 0 ? kDLBfloat : kDLFloat; /* f16, f32 */
    for (int bi = 0; bi < nB; bi++) {
        int B = Bs[bi], E = D;
        decode_case c;
        memset(&c, 0, sizeof c);
        c.ctx = ctx;
        c.pdl = pdl == 1;
        c.state_bytes = (size_t)B * H * D * E * (size_t)(state_bits / 8);
        size_t want = 256u << 20;
        c.nbuf = (int)((want + c.state_bytes - 1) / c.state_bytes);
        if (c.nbuf > 64)
            c.nbuf = 64;
        if (c.nbuf < 1)
            c.nbuf = 1;
        int steps = c.nbuf * ((20 + c.nbuf - 1) / c.nbuf);
        c.state_shape[0] = B;
        c.state_shape[1] = H;
        c.state_shape[2] = D;
        c.state_shape[3] = E;
        for (int i = 0; i < c.nbuf; i++) {
            c.state_ptr[i] = lj_bench_alloc(c.state_bytes);
            lj_bench_fill_random(c.state_ptr[i], c.state_bytes / (size_t)(state_bits / 8),
                                 state_bits, 1.0f, 100 + (unsigned)i);
            c.states[i] = lj_bench_tensor(c.state_ptr[i], 4, c.state_shape, state_bits,
                                          state_bits == 32 ? kDLFloat : kDLBfloat, 0);
        }
        size_t nq = (size_t)B * T * H * D, eb = (size_t)in_bits / 8;
        CUdeviceptr q = lj_bench_alloc(nq * eb), k = lj_bench_alloc(nq * eb),
                    v = lj_bench_alloc(nq * eb), o = lj_bench_alloc(nq * eb),
                    sl = lj_bench_alloc((size_t)H * 4);
        lj_bench_fill_random_dtype(q, nq, dv.in, 1.0f, 7);
        lj_bench_fill_random_dtype(k, nq, dv.in, 1.0f, 8);
        lj_bench_fill_random_dtype(v, nq, dv.in, 1.0f, 9);
        float *slopes = malloc((size_t)H * 4);
        lj_bench_check(ctx, lajit_decay_alibi(H, 0, 1, slopes), "slopes");
        CU(cuMemcpyHtoD(sl, slopes, (size_t)H * 4));
        free(slopes);
        int64_t qs4[4] = {B, T, H, D}, qs3[3] = {B, H, D}, ss[1] = {H};
        int nd = T > 1 ? 4 : 3;
        int64_t *qs = T > 1 ? qs4 : qs3;
        DLTensor tq = lj_bench_tensor(q, nd, qs, in_bits, in_code, 0),
                 tk = lj_bench_tensor(k, nd, qs, in_bits, in_code, 0);
        DLTensor tv = lj_bench_tensor(v, nd, qs, in_bits, in_code, 0),
                 to = lj_bench_tensor(o, nd, qs, in_bits, in_code, 0);
        DLTensor ts = lj_bench_tensor(sl, 1, ss, 32, kDLFloat, 0);
        c.args.struct_size = sizeof c.args;
        c.args.q = &tq;
        c.args.k = &tk;
        c.args.v = &tv;
        c.args.o = &to;
        c.args.s = &ts;
        c.args.scale = 1.0f;
        c.args.flags = dv.vk ? LAJIT_STATE_VK : 0;
        double us = time_graph(run_decode, &c, s, steps, 20);
        c.next = 0;
        double ceil_us = time_graph(run_scale, &c, s, steps, 20);
        double tb = 2.0 * (double)c.state_bytes / (us * 1e-6) / 1e12;
        double ctb = 2.0 * (double)c.state_bytes / (ceil_us * 1e-6) / 1e12;
        char pdl_field[64] = "";
        if (pdl >= 0)
            snprintf(pdl_field, sizeof pdl_field, "\"pdl\": %d, ", pdl);
        printf(
            "{\"op\": \"decode\", \"impl\": \"lajit\", \"dtype\": \"%s\", \"state_dtype\": "
            "\"%s\", %s"
            "\"B\": %d, \"H\": %d, "
            "\"D\": %d, \"E\": %d, \"T\": %d, \"us\": %.3f, \"TBps\": %.4f, \"ceiling_us\": %.3f, "
            "\"ceiling_TBps\": %.4f, \"l2\": \"cold\", \"nbuf\": %d, %s"
            "\"how\": \"CUDA graph of %d steps over %d rotating states; ceiling: x *= c on the "
            "same states, same graph shape%s\"}\n",
            dv.in, state_bits == 32 ? "f32" : "bf16", dv.vk ? "\"vk\": 1, " : "", B, H, D, E, T, us,
            tb, ceil_us, ctb, c.nbuf, pdl_field, steps, c.nbuf,
            pdl == 1 ? "; both with programmatic dependent launch" : "");
        fflush(stdout);
        for (int i = 0; i < c.nbuf; i++)
            CU(cuMemFree(c.state_ptr[i]));
        CU(cuMemFree(q));
        CU(cuMemFree(k));
        CU(cuMemFree(v));
        CU(cuMemFree(o));
        CU(cuMemFree(sl));
    }
}

/* Every combination of the decode lists: head width, input dtype, layout, steps, pool dtype. */
static void bench_decode_all(lajit_ctx *ctx, CUstream s, const int *Bs, int nB, int H,
                             const int *Ds, int nD, const int *Ts, int nT, const int *Sbits, int nS,
                             const char *const *ins, int nI, const int *vks, int nV, int pdl)
{
    for (int di = 0; di < nD; di++)
        for (int ii = 0; ii < nI; ii++)
            for (int vi = 0; vi < nV; vi++)
                for (int t = 0; t < nT; t++)
                    for (int si = 0; si < nS; si++) {
                        decode_variant dv = {ins[ii], vks[vi] != 0};
                        bench_decode(ctx, s, Bs, nB, H, Ds[di], Ts[t], Sbits[si] == 16 ? 16 : 32,
                                     pdl, dv);
                    }
}

/* ---- Dispatch cost ------------------------------------------------------------------------- */

/* Host wall time per call of `call` on a cached kernel (best of 5 rounds of 20,000 back-to-back
 * calls), beside the same number of bare cuLaunchKernel calls of an empty kernel on the same
 * stream; one JSON row. */
typedef lajit_status (*dispatch_fn)(lajit_ctx *ctx, const void *args);
static lajit_status call_decode(lajit_ctx *ctx, const void *args)
{
    return lajit_attn_decode(ctx, args);
}
static lajit_status call_launch(lajit_ctx *ctx, const void *args)
{
    return lajit_launch(ctx, args);
}

static void time_dispatch(const char *what, dispatch_fn call, lajit_ctx *ctx, const void *args,
                          CUstream s)
{
    const int calls = 20000;
    double best_api = 1e9, best_bare = 1e9;
    for (int round = 0; round < 5; round++) {
        double t0 = now_s();
        for (int i = 0; i < calls; i++)
            call(ctx, args);
        double t1 = now_s();
        CU(cuStreamSynchronize(s));
        double t2 = now_s();
        for (int i = 0; i < calls; i++)
            lj_bench_drv->cuLaunchKernel(fn_empty, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL);
        double t3 = now_s();
        CU(cuStreamSynchronize(s));
        double api = (t1 - t0) / calls * 1e6, bare = (t3 - t2) / calls * 1e6;
        if (api < best_api)
            best_api = api;
        if (bare < best_bare)
            best_bare = bare;
    }
    printf("{\"op\": \"dispatch\", \"impl\": \"lajit\", \"what\": \"%s\", \"us_host\": %.3f, "
           "\"us_launch\": %.3f, \"calls\": %d, \"how\": \"best of 5 rounds of %d back-to-back "
           "calls, host wall time per call\"}\n",
           what, best_api, best_bare, calls, calls);
    fflush(stdout);
}

static void bench_dispatch(lajit_ctx *ctx, CUstream s)
{
    /* A small decode (B=1, H=1, D=E=64) so the GPU keeps up and host time dominates. */
    int64_t qs[3] = {1, 1, 64}, ps[4] = {1, 1, 64, 64};
    CUdeviceptr q = lj_bench_alloc(256), st = lj_bench_alloc(64 * 64 * 4), o = lj_bench_alloc(256);
    lj_bench_fill_random(q, 64, 16, 1.0f, 1);
    lj_bench_fill_random(st, 64 * 64, 32, 1.0f, 2);
    DLTensor tq = lj_bench_tensor(q, 3, qs, 16, kDLBfloat, 0),
             to = lj_bench_tensor(o, 3, qs, 16, kDLBfloat, 0);
    DLTensor ts = lj_bench_tensor(st, 4, ps, 32, kDLFloat, 0);
    lajit_attn_decode_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = a.k = a.v = &tq;
    a.o = &to;
    a.state = &ts;
    a.scale = 1.0f;
    a.stream = s;
    lj_bench_check(ctx, lajit_attn_decode(ctx, &a), "decode warm-up");
    CU(cuStreamSynchronize(s));
    time_dispatch("lajit_attn_decode", call_decode, ctx, &a, s);
    CU(cuMemFree(q));
    CU(cuMemFree(st));
    CU(cuMemFree(o));
}

/* The generic launch's host cost: lajit_launch of the toy_axpy family (tests/data/families, a
 * custom family with two tensors and a scalar; found through LAJIT_FAMILY_PATH) on a cached
 * kernel, beside the same bare cuLaunchKernel of an empty kernel. Skipped with a note when the
 * family path does not hold it. */
static void bench_dispatch_custom(lajit_ctx *ctx, CUstream s)
{
    lajit_family_info info = {.struct_size = sizeof info};
    if (lajit_family_describe(ctx, "toy_axpy", &info) != LAJIT_OK) {
        printf("{\"op\": \"dispatch\", \"impl\": \"lajit\", \"what\": \"lajit_launch\", "
               "\"skipped\": \"toy_axpy not in LAJIT_FAMILY_PATH\"}\n");
        return;
    }
    int64_t shape[2] = {1, 64};
    CUdeviceptr x = lj_bench_alloc(256), y = lj_bench_alloc(256);
    lj_bench_fill_random(x, 64, 32, 1.0f, 3);
    lj_bench_fill_random(y, 64, 32, 1.0f, 4);
    DLTensor tx = lj_bench_tensor(x, 2, shape, 32, kDLFloat, 0),
             ty = lj_bench_tensor(y, 2, shape, 32, kDLFloat, 0);
    lajit_tensor_arg tensors[2] = {{"x", &tx}, {"y", &ty}};
    lajit_scalar_arg scalars[1] = {{"alpha", 0.5}};
    lajit_launch_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.family = "toy_axpy";
    a.tensors = tensors;
    a.n_tensors = 2;
    a.scalars = scalars;
    a.n_scalars = 1;
    a.stream = s;
    lj_bench_check(ctx, lajit_launch(ctx, &a), "lajit_launch warm-up");
    CU(cuStreamSynchronize(s));
    time_dispatch("lajit_launch toy_axpy", call_launch, ctx, &a, s);
    CU(cuMemFree(x));
    CU(cuMemFree(y));
}

/* ---- main ---------------------------------------------------------------------------------- */

/* --log: lajit's log lines (which plan ran which configuration, and where a tuned one came
 * from) on stderr beside the rows. */
static int log_info;
static void print_log_line(void *user, lajit_log_level level, const char *message)
{
    (void)user;
    static const char *const names[] = {"error", "warn", "info", "debug"};
    fprintf(stderr, "lajit %s: %s\n", (unsigned)level < 4 ? names[level] : "?", message);
}

int main(int argc, char **argv)
{
    const char *mode = "all", *family = NULL, *jit_what = "first_call", *dtype = "bf16";
    int Ds[8] = {64, 128}, nD = 2, Ns[16] = {1024, 2048, 4096, 8192, 16384, 32768}, nN = 6;
    int Bs[16] = {1, 4, 16, 32, 64, 128, 256}, nB = 7, Ts[8] = {1, 4}, nT = 2;
    int B = 4, H = 32, dH = 64, dDs[8] = {128}, nDD = 1, Sbits[2] = {32}, nS = 1;
    int vks[2] = {0}, nV = 1;      /* --vk: state layouts, 0 KV and/or 1 VK */
    const char *ins[3] = {"bf16"}; /* --decode-in: input dtypes */
    int nI = 1;
    char in_list[64] = "";
    int pdls[2] = {-1}, nP = 0; /* --pdl: LAJIT_PDL values to measure decode with */
    /* cp runs its ranks in child processes, before anything here touches CUDA. */
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--mode") == 0 && strcmp(argv[i + 1], "cp") == 0)
            return lj_bench_cp_main(argc, argv);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (strcmp(a, "--help") == 0) {
            printf(
                "usage: lajit_bench [--mode prefill|fwdbwd|decode|dispatch|jit|all] [--family "
                "NAME]\n"
                "       lajit_bench --mode cp --help   (context parallelism: its own arguments)\n"
                "  [--jit-what first_call_cold|first_call_warm_disk|first_call_bundle]\n"
                "  [--B 4] [--H 32] [--D 64,128] [--N 1024,...] [--dtype bf16|f16|f32]\n"
                "  [--decode-B 1,4,...]\n"
                "  [--decode-H 64] [--decode-D 128,...] [--T 1,4,...] [--state 32,16] [--pdl 0,1]\n"
                "  [--decode-in bf16,f16,f32] [--vk 0,1] [--log info|warn]\n"
                "Prints one JSON row per measurement (DESIGN.md's report rows).\n");
            return 0;
        }
        if (strcmp(a, "--mode") == 0)
            mode = v;
        else if (strcmp(a, "--family") == 0)
            family = v;
        else if (strcmp(a, "--jit-what") == 0)
            jit_what = v;
        else if (strcmp(a, "--dtype") == 0) { /* prefill and fwdbwd rows */
            dtype = v;
            if (strcmp(v, "bf16") != 0 && strcmp(v, "f16") != 0 && strcmp(v, "f32") != 0) {
                fprintf(stderr, "lajit_bench: --dtype takes bf16, f16 or f32\n");
                return 2;
            }
        } else if (strcmp(a, "--B") == 0)
            B = atoi(v);
        else if (strcmp(a, "--H") == 0)
            H = atoi(v);
        else if (strcmp(a, "--D") == 0)
            nD = lj_bench_parse_list(v, Ds, 8);
        else if (strcmp(a, "--N") == 0)
            nN = lj_bench_parse_list(v, Ns, 16);
        else if (strcmp(a, "--decode-B") == 0)
            nB = lj_bench_parse_list(v, Bs, 16);
        else if (strcmp(a, "--decode-H") == 0)
            dH = atoi(v);
        else if (strcmp(a, "--decode-D") == 0)
            nDD = lj_bench_parse_list(v, dDs, 8);
        else if (strcmp(a, "--T") == 0)
            nT = lj_bench_parse_list(v, Ts, 8);
        else if (strcmp(a, "--vk") == 0)
            nV = lj_bench_parse_list(v, vks, 2);
        else if (strcmp(a, "--decode-in") == 0) { /* input dtypes of decode rows */
            snprintf(in_list, sizeof in_list, "%s", v);
            nI = 0;
            for (char *t = strtok(in_list, ","); t && nI < 3; t = strtok(NULL, ",")) {
                if (strcmp(t, "bf16") != 0 && strcmp(t, "f16") != 0 && strcmp(t, "f32") != 0) {
                    fprintf(stderr, "lajit_bench: --decode-in takes bf16, f16 and/or f32\n");
                    return 2;
                }
                ins[nI++] = t;
            }
        } else if (strcmp(a, "--state") == 0) /* decode pools: 32 (float32), 16 (bfloat16) */
            nS = lj_bench_parse_list(v, Sbits, 2);
        else if (strcmp(a, "--pdl") == 0) { /* decode with LAJIT_PDL=0 and/or 1 */
            nP = lj_bench_parse_list(v, pdls, 2);
            for (int j = 0; j < nP; j++)
                if (pdls[j] != 0 && pdls[j] != 1) {
                    fprintf(stderr, "lajit_bench: --pdl takes 0, 1 or 0,1\n");
                    return 2;
                }
        } else if (strcmp(a, "--log") == 0) { /* lajit's info lines to stderr */
            if (strcmp(v, "info") != 0 && strcmp(v, "warn") != 0) {
                fprintf(stderr, "lajit_bench: --log takes info or warn\n");
                return 2;
            }
            log_info = strcmp(v, "info") == 0;
        } else {
            fprintf(stderr, "lajit_bench: unknown argument %s\n", a);
            return 2;
        }
        i++;
    }
    if (lj_bench_load_driver() != LAJIT_OK) {
        fprintf(stderr, "lajit_bench: %s\n", lj_bench_env.errmsg);
        return 77;
    }
    lajit_ctx *ctx;
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.log = print_log_line; /* the library never prints: the bench does, to stderr */
    desc.log_level = log_info ? LAJIT_LOG_INFO : LAJIT_LOG_WARN;
    lj_bench_check(NULL, lajit_ctx_create(&desc, &ctx), "context");
    if (strcmp(mode, "jit") == 0) {
        /* Alone, in a fresh process: the application's CUDA context exists (made current here
         * without NVRTC, which the helpers below would load), nothing of lajit's is warm. */
        lj_device *dev;
        lj_bench_check(ctx, lajit__ctx_device(ctx, &dev), "device");
        lj_bench_check(ctx, lj_device_make_current(lajit__ctx_env(ctx), dev), "make current");
        CUstream s;
        CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        bench_jit(s, jit_what, Ds[nD - 1], Ns[nN - 1]);
        CU(cuStreamDestroy(s));
        lajit_ctx_destroy(ctx);
        return 0;
    }
    load_helpers(ctx);
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    flush_buf = lj_bench_alloc(flush_bytes);
    int all = strcmp(mode, "all") == 0;
    if (all || strcmp(mode, "dispatch") == 0) {
        bench_dispatch(ctx, s);
        bench_dispatch_custom(ctx, s);
    }
    if ((all || strcmp(mode, "decode") == 0) && nP == 0)
        bench_decode_all(ctx, s, Bs, nB, dH, dDs, nDD, Ts, nT, Sbits, nS, ins, nI, vks, nV, -1);
    /* --pdl: one context per value, LAJIT_PDL set while it is created (the switch is read then);
     * the variable is restored after. */
    for (int pi = 0; (all || strcmp(mode, "decode") == 0) && pi < nP; pi++) {
        if (pdls[pi] == 1 && !pdl_supported) {
            fprintf(stderr, "lajit_bench: --pdl 1 skipped: needs compute capability 9.0 or later "
                            "and a driver with cuLaunchKernelEx\n");
            continue;
        }
        const char *was = getenv("LAJIT_PDL");
        char *saved = was ? strdup(was) : NULL;
        setenv("LAJIT_PDL", pdls[pi] ? "1" : "0", 1);
        lajit_ctx *pctx;
        lj_bench_check(NULL, lajit_ctx_create(&desc, &pctx), "context (--pdl)");
        if (saved)
            setenv("LAJIT_PDL", saved, 1);
        else
            unsetenv("LAJIT_PDL");
        free(saved);
        bench_decode_all(pctx, s, Bs, nB, dH, dDs, nDD, Ts, nT, Sbits, nS, ins, nI, vks, nV,
                         pdls[pi]);
        lajit_ctx_destroy(pctx);
    }
    if (all || strcmp(mode, "prefill") == 0 || strcmp(mode, "fwdbwd") == 0)
        bench_prefill(ctx, s, B, H, Ds, nD, Ns, nN, family, all || strcmp(mode, "fwdbwd") == 0,
                      dtype);
    CU(cuMemFree(flush_buf));
    CU(cuStreamDestroy(s));
    lajit_ctx_destroy(ctx);
    return 0;
}
