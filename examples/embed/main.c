/* main.c — a small application embedding lajit: it creates a context, allocates device buffers
 * with the CUDA driver API, runs one forward op and checks the result against a few lines of
 * plain C. With no GPU it stops at the status lajit reports (exit 3) — which is how the tests
 * run it on a machine without one.
 *
 * The application loads libcuda itself with dlopen, as lajit does, so it starts on machines
 * without a driver; an application that links the CUDA runtime would use cudaMalloc instead. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lajit.h>

typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_device_get_fn)(int *, int);
typedef int (*cu_retain_fn)(void **, int);
typedef int (*cu_set_current_fn)(void *);
typedef int (*cu_alloc_fn)(unsigned long long *, size_t);
typedef int (*cu_free_fn)(unsigned long long);
typedef int (*cu_htod_fn)(unsigned long long, const void *, size_t);
typedef int (*cu_dtoh_fn)(void *, unsigned long long, size_t);
typedef int (*cu_sync_fn)(void);

struct cuda {
    cu_init_fn init;
    cu_device_get_fn device_get;
    cu_retain_fn retain;
    cu_set_current_fn set_current;
    cu_alloc_fn alloc;
    cu_free_fn free;
    cu_htod_fn htod;
    cu_dtoh_fn dtoh;
    cu_sync_fn sync;
};

static int load(void *h, const char *name, void *out, size_t size)
{
    void *p = dlsym(h, name);
    if (!p)
        return 0;
    memcpy(out, &p, size); /* object pointer to function pointer, as ISO C allows via memcpy */
    return 1;
}

enum { B = 1, H = 2, N = 37, D = 32, E = 16 };

int main(void)
{
    lajit_ctx *ctx;
    lajit_status st = lajit_ctx_create(NULL, &ctx);
    if (st != LAJIT_OK) {
        fprintf(stderr, "lajit_ctx_create: %s\n", lajit_status_string(st));
        return 1;
    }
    printf("lajit %s, families:", lajit_version_string());
    for (const char *const *f = lajit_family_names(); *f; f++)
        printf(" %s", *f);
    printf("\n");

    struct cuda cu;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    int dev = 0;
    void *cuctx = NULL;
    if (!h || !load(h, "cuInit", &cu.init, sizeof cu.init) ||
        !load(h, "cuDeviceGet", &cu.device_get, sizeof cu.device_get) ||
        !load(h, "cuDevicePrimaryCtxRetain", &cu.retain, sizeof cu.retain) ||
        !load(h, "cuCtxSetCurrent", &cu.set_current, sizeof cu.set_current) ||
        !load(h, "cuMemAlloc_v2", &cu.alloc, sizeof cu.alloc) ||
        !load(h, "cuMemFree_v2", &cu.free, sizeof cu.free) ||
        !load(h, "cuMemcpyHtoD_v2", &cu.htod, sizeof cu.htod) ||
        !load(h, "cuMemcpyDtoH_v2", &cu.dtoh, sizeof cu.dtoh) ||
        !load(h, "cuCtxSynchronize", &cu.sync, sizeof cu.sync) || cu.init(0) != 0 ||
        cu.device_get(&dev, 0) != 0 || cu.retain(&cuctx, dev) != 0 || cu.set_current(cuctx) != 0) {
        /* No usable driver: show what lajit itself says about it. */
        DLTensor none;
        memset(&none, 0, sizeof none);
        lajit_attn_fwd_args args;
        memset(&args, 0, sizeof args);
        args.struct_size = sizeof args;
        printf("no GPU here; lajit_attn_fwd on no tensors says: %s\n",
               lajit_status_string(lajit_attn_fwd(ctx, &args)));
        lajit_ctx_destroy(ctx);
        return 3;
    }

    /* Random q, k, v in float32, [B,H,N,D] compact. */
    size_t nq = (size_t)B * H * N * D, nv = (size_t)B * H * N * E;
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), *o = malloc(nv * 4);
    srand(1);
    for (size_t i = 0; i < nq; i++) {
        q[i] = (float)rand() / RAND_MAX - 0.5f;
        k[i] = (float)rand() / RAND_MAX - 0.5f;
    }
    for (size_t i = 0; i < nv; i++)
        v[i] = (float)rand() / RAND_MAX - 0.5f;
    unsigned long long dq, dk, dv, dout;
    cu.alloc(&dq, nq * 4);
    cu.alloc(&dk, nq * 4);
    cu.alloc(&dv, nv * 4);
    cu.alloc(&dout, nv * 4);
    cu.htod(dq, q, nq * 4);
    cu.htod(dk, k, nq * 4);
    cu.htod(dv, v, nv * 4);

    int64_t qshape[4] = {B, H, N, D}, vshape[4] = {B, H, N, E};
    DLDataType f32 = {kDLFloat, 32, 1};
    DLDevice gpu = {kDLCUDA, 0};
    DLTensor tq = {(void *)(uintptr_t)dq, gpu, 4, f32, qshape, NULL, 0};
    DLTensor tk = {(void *)(uintptr_t)dk, gpu, 4, f32, qshape, NULL, 0};
    DLTensor tv = {(void *)(uintptr_t)dv, gpu, 4, f32, vshape, NULL, 0};
    DLTensor to = {(void *)(uintptr_t)dout, gpu, 4, f32, vshape, NULL, 0};
    lajit_attn_fwd_args args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.q = &tq;
    args.k = &tk;
    args.v = &tv;
    args.o = &to;
    args.scale = 1.0f;
    st = lajit_attn_fwd(ctx, &args);
    if (st != LAJIT_OK) {
        fprintf(stderr, "lajit_attn_fwd: %s: %s\n", lajit_status_string(st), lajit_errmsg(ctx));
        return 1;
    }
    cu.sync();
    cu.dtoh(o, dout, nv * 4);

    /* The recurrence in double: S += k_t^T v_t; o_t = q_t S (no decay, scale 1). */
    double err = 0, ref_norm = 0;
    for (int bh = 0; bh < B * H; bh++) {
        static double S[D][E];
        memset(S, 0, sizeof S);
        for (int t = 0; t < N; t++) {
            const float *qt = q + ((size_t)bh * N + t) * D, *kt = k + ((size_t)bh * N + t) * D;
            const float *vt = v + ((size_t)bh * N + t) * E;
            for (int d = 0; d < D; d++)
                for (int e = 0; e < E; e++)
                    S[d][e] += (double)kt[d] * vt[e];
            for (int e = 0; e < E; e++) {
                double r = 0;
                for (int d = 0; d < D; d++)
                    r += qt[d] * S[d][e];
                double got = o[((size_t)bh * N + t) * E + e];
                err += (got - r) * (got - r);
                ref_norm += r * r;
            }
        }
    }
    double rel = sqrt(err / ref_norm);
    printf("forward B=%d H=%d N=%d D=%d E=%d fp32: relative L2 error %.2e %s\n", B, H, N, D, E, rel,
           rel < 1e-3 ? "(ok)" : "(TOO LARGE)");
    cu.free(dq);
    cu.free(dk);
    cu.free(dv);
    cu.free(dout);
    free(q);
    free(k);
    free(v);
    free(o);
    lajit_ctx_destroy(ctx);
    return rel < 1e-3 ? 0 : 1;
}
