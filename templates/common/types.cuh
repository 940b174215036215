// types.cuh — 16-bit storage types and conversions for kernels, with no toolkit header.
//
// NVRTC finds no toolkit headers by itself and cuda_fp16.h / cuda_bf16.h are ~670 KB to parse
// on every compile, so kernels use these small types instead. lj_f16 and lj_bf16 are storage
// only (16 bits); arithmetic happens in fp32 or in the tensor cores. Conversions round to
// nearest even, as the mathematics of DESIGN.md assumes.
#ifndef LAJIT_TYPES_CUH
#define LAJIT_TYPES_CUH

struct __align__(2) lj_f16 { unsigned short bits; };
struct __align__(2) lj_bf16 { unsigned short bits; };

__device__ __forceinline__ float lj_to_float(float x) { return x; }
__device__ __forceinline__ float lj_to_float(lj_f16 x)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ float lj_to_float(lj_bf16 x)
{
    return __uint_as_float(((unsigned)x.bits) << 16);
}

template <typename T> __device__ __forceinline__ T lj_from_float(float x);
template <> __device__ __forceinline__ float lj_from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ lj_f16 lj_from_float<lj_f16>(float x)
{
    lj_f16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
}
template <> __device__ __forceinline__ lj_bf16 lj_from_float<lj_bf16>(float x)
{
    lj_bf16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
}

// States (S_0, S_N, pools, decode's per-step states) are stored as float (the default), lj_bf16
// or lj_f16 (the STATE_T constant of a kernel) and always accumulated in fp32: every kernel
// reads a state element through lj_state_load and writes one through lj_state_store (rounding
// to nearest even), so one substitution in each kernel gives it 16-bit state storage.
template <typename S> __device__ __forceinline__ float lj_state_load(const S *p) { return lj_to_float(*p); }
template <typename S> __device__ __forceinline__ void lj_state_store(S *p, float x) { *p = lj_from_float<S>(x); }

// Two fp32 values packed into one 32-bit register of two 16-bit values (low half = a), the
// operand format of mma.sync / wgmma for f16 and bf16.
template <typename T> __device__ __forceinline__ unsigned lj_pack2(float a, float b);
template <> __device__ __forceinline__ unsigned lj_pack2<lj_f16>(float a, float b)
{
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(a), "f"(b));
    return r;
}
template <> __device__ __forceinline__ unsigned lj_pack2<lj_bf16>(float a, float b)
{
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(a), "f"(b));
    return r;
}

// Round an fp32 value to tf32 (nearest, ties away: cvt.rna), as DESIGN.md requires for fp32
// inputs on tensor cores. Returns the bit pattern in a 32-bit register.
__device__ __forceinline__ unsigned lj_tf32(float x)
{
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// 16-byte vector access. Pointers must be 16-byte aligned (the host checks base pointers and
// strides for this).
struct __align__(16) lj_vec16 { unsigned x, y, z, w; };

__device__ __forceinline__ lj_vec16 lj_load16(const void *p)
{
    return *reinterpret_cast<const lj_vec16 *>(p);
}
__device__ __forceinline__ void lj_store16(void *p, lj_vec16 v)
{
    *reinterpret_cast<lj_vec16 *>(p) = v;
}

// Unpack the 16-bit value at index i (0..7) of a 16-byte vector of T, or the float at i (0..3).
template <typename T> __device__ __forceinline__ float lj_vec_get(const lj_vec16 &v, int i);
template <> __device__ __forceinline__ float lj_vec_get<float>(const lj_vec16 &v, int i)
{
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
    return __uint_as_float(w[i]);
}
template <> __device__ __forceinline__ float lj_vec_get<lj_f16>(const lj_vec16 &v, int i)
{
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
    lj_f16 h;
    h.bits = (unsigned short)(w[i >> 1] >> ((i & 1) * 16));
    return lj_to_float(h);
}
template <> __device__ __forceinline__ float lj_vec_get<lj_bf16>(const lj_vec16 &v, int i)
{
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
    return __uint_as_float((w[i >> 1] >> ((i & 1) * 16)) << 16);
}

// Elements of T per 16-byte vector.
template <typename T> struct lj_vec_elems { static constexpr int value = 16 / sizeof(T); };

#endif
