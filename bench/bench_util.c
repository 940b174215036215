/* bench_util.c — the helpers lajit_bench's modes share (bench.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

const lj_driver *lj_bench_drv;
lj_env lj_bench_env;

lajit_status lj_bench_load_driver(void)
{
    lj_env_init(&lj_bench_env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    return lj_driver_load(&lj_bench_env, &lj_bench_drv);
}

void lj_bench_die(void)
{
    fflush(NULL);
    exit(1);
}

void lj_bench_check(lajit_ctx *ctx, lajit_status st, const char *what)
{
    if (st != LAJIT_OK) {
        fprintf(stderr, "lajit_bench: %s: %s: %s\n", what, lajit_status_string(st),
                lajit_errmsg(ctx));
        lj_bench_die();
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double lj_bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

CUdeviceptr lj_bench_alloc(size_t bytes)
{
    CUdeviceptr p;
    CU(cuMemAlloc(&p, bytes ? bytes : 1));
    return p;
}

void lj_bench_fill_random(CUdeviceptr p, size_t n, int bits, float amp, unsigned seed)
{
    size_t bytes = n * (size_t)(bits / 8);
    unsigned char *h = malloc(bytes ? bytes : 1);
    if (!h) {
        fprintf(stderr, "lajit_bench: out of host memory (%zu bytes)\n", bytes);
        lj_bench_die();
    }
    unsigned x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        float f = amp * ((float)(x >> 8) / 8388608.0f - 1.0f);
        unsigned u;
        memcpy(&u, &f, 4);
        if (bits == 32) {
            memcpy(h + 4 * i, &u, 4);
        } else { /* bf16, round to nearest even */
            unsigned short b = (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
            memcpy(h + 2 * i, &b, 2);
        }
    }
    if (bytes)
        CU(cuMemcpyHtoD(p, h, bytes));
    free(h);
}

DLTensor lj_bench_tensor(CUdeviceptr p, int ndim, int64_t *shape, int bits, int code, int ordinal)
{
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = (void *)(uintptr_t)p;
    t.device.device_type = kDLCUDA;
    t.device.device_id = ordinal;
    t.ndim = ndim;
    t.dtype.code = (uint8_t)code;
    t.dtype.bits = (uint8_t)bits;
    t.dtype.lanes = 1;
    t.shape = shape;
    return t;
}

int lj_bench_parse_list(const char *s, int *out, int cap)
{
    int n = 0;
    while (*s && n < cap) {
        out[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c)
            break;
        s = c + 1;
    }
    return n;
}
