/* probe_elem.h — host-side element storage shared by the standalone probes (fwd_probe.cu,
 * decode_probe.cu): float to bf16/f16 and back with round to nearest even, matching the device's
 * cvt.rn, and reading or writing element i of a buffer of dtype dt (0 f32, 1 f16, 2 bf16) so the
 * probes' float64 references see exactly the rounded values the kernels read. */
#ifndef LAJIT_PROBE_ELEM_H
#define LAJIT_PROBE_ELEM_H

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

static uint16_t f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static float bf2f(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f2h(float f)
{
    return __half_as_ushort(__float2half_rn(f));
}

static float h2f(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

/* Rounds x to dtype dt, writes its storage bytes as element i of dst, returns the rounded
 * value. */
static float store_elem(int dt, void *dst, size_t i, float x)
{
    if (dt == 0) {
        ((float *)dst)[i] = x;
        return x;
    }
    uint16_t b = dt == 1 ? f2h(x) : f2bf(x);
    ((uint16_t *)dst)[i] = b;
    return dt == 1 ? h2f(b) : bf2f(b);
}

static double load_elem(int dt, const void *src, size_t i)
{
    if (dt == 0)
        return ((const float *)src)[i];
    uint16_t b = ((const uint16_t *)src)[i];
    return dt == 1 ? h2f(b) : bf2f(b);
}

#endif
