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

/* The fills' generator: the next value in [-amp, amp) of the sequence x. */
static float next_value(unsigned *x, float amp)
{
    *x = *x * 1664525u + 1013904223u;
    return amp * ((float)(*x >> 8) / 8388608.0f - 1.0f);
}

/* f to IEEE fp16, rounded to nearest even (|f| below 65504; subnormals kept). */
static unsigned short to_half(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    const unsigned sign = (u >> 16) & 0x8000u, mant = u & 0x7fffffu;
    const int exp = (int)((u >> 23) & 0xffu) - 127 + 15;
    if (exp >= 31)
        return (unsigned short)(sign | 0x7c00u);
    unsigned m = mant | 0x800000u, shift = 13;
    unsigned h = sign | ((unsigned)exp << 10);
    if (exp <= 0) { /* subnormal: the implicit 1 shifted in */
        if (exp < -10)
            return (unsigned short)sign;
        shift = (unsigned)(14 - exp);
        h = sign;
    } else {
        m = mant;
    }
    const unsigned half = 1u << (shift - 1), rest = m & ((1u << shift) - 1);
    unsigned r = m >> shift;
    if (rest > half || (rest == half && (r & 1)))
        r++; /* may carry into the exponent: still the right value */
    return (unsigned short)(h + r);
}

static void fill_random_f16(CUdeviceptr p, size_t n, float amp, unsigned seed)
{
    /* lj_bench_fill_random's values, converted on the host. */
    unsigned short *h = malloc(n ? n * 2 : 1);
    if (!h) {
        fprintf(stderr, "lajit_bench: out of host memory (%zu bytes)\n", n * 2);
        lj_bench_die();
    }
    unsigned x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++)
        h[i] = to_half(next_value(&x, amp));
    if (n)
        CU(cuMemcpyHtoD(p, h, n * 2));
    free(h);
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
        float f = next_value(&x, amp);
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

void lj_bench_fill_random_dtype(CUdeviceptr p, size_t n, const char *dtype, float amp,
                                unsigned seed)
{
    if (strcmp(dtype, "f16") == 0)
        fill_random_f16(p, n, amp, seed);
    else
        lj_bench_fill_random(p, n, strcmp(dtype, "f32") == 0 ? 32 : 16, amp, seed);
}
