// mma.cuh — warp-level tensor-core wrappers (mma.sync, ldmatrix, cp.async) as inline PTX, with
// no toolkit header, for kernels compiled by NVRTC for sm_80 and newer.
//
// Fragment layouts follow the PTX ISA for mma.m16n8k16 (f16/bf16) and mma.m16n8k8 (tf32). With
// g = lane / 4 and t = lane % 4, the fp32 accumulator c[4] of a 16x8 tile holds (g, 2t), (g, 2t+1),
// (g+8, 2t), (g+8, 2t+1) for every one of these shapes; kernels rely on that to reuse one
// accumulator layout across dtypes. The lj_frag<T> traits below hide the operand differences:
// for 16-bit types an operand register holds two elements and a k-step is 16, for fp32 it holds
// one tf32 value (rounded to nearest with cvt.rna, as DESIGN.md requires) and a k-step is 8.
#ifndef LAJIT_MMA_CUH
#define LAJIT_MMA_CUH

#include "types.cuh"

// ---- cp.async: global -> shared copies that bypass registers, grouped for pipelining.

__device__ __forceinline__ unsigned lj_smem_addr(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

// Copies 16 bytes when pred is true, else writes 16 zero bytes (src-size 0: nothing is read, so
// src may point anywhere). Zero fill is how ragged chunks get neutral rows.
__device__ __forceinline__ void lj_cp_async16(void *smem, const void *gmem, bool pred)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(lj_smem_addr(smem)),
                 "l"(gmem), "r"(pred ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void lj_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void lj_cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- ldmatrix: four (x4) or two (x2) 8x8 tiles of 16-bit elements, optionally transposed.

__device__ __forceinline__ void lj_ldsm_x4(unsigned r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(lj_smem_addr(p)));
}
__device__ __forceinline__ void lj_ldsm_x4_t(unsigned r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(lj_smem_addr(p)));
}
__device__ __forceinline__ void lj_ldsm_x2(unsigned r[2], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(lj_smem_addr(p)));
}
__device__ __forceinline__ void lj_ldsm_x2_t(unsigned r[2], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(lj_smem_addr(p)));
}

// ---- mma.sync, fp32 accumulate: d = a * b + d. Not volatile: a pure function of registers, so
// the compiler may interleave independent products (ldmatrix stays volatile: it reads memory).

__device__ __forceinline__ void lj_mma_bf16(float d[4], const unsigned a[4], const unsigned b[2])
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void lj_mma_f16(float d[4], const unsigned a[4], const unsigned b[2])
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void lj_mma_tf32(float d[4], const unsigned a[4], const unsigned b[2])
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- Operand fragments from shared memory, per element type.
//
// Shared tiles are row-major with a row stride `ld` in elements. "mk" means the tile is stored
// [m][k] (A operand read as is), "km" stored [k][m] (A read transposed); for B, "nk" means
// stored [n][k] and "kn" stored [k][n]. p points at element (row 0, col 0) of the 16 x KSTEP (A)
// or KSTEP x 8 (B) block. Rows must be 16-byte aligned for the 16-bit (ldmatrix) paths.

template <typename T> struct lj_frag;

template <typename T> struct lj_frag16 {
    static constexpr int KSTEP = 16;
    static __device__ __forceinline__ void a_mk(unsigned a[4], const T *p, int ld, int lane)
    {
        lj_ldsm_x4(a, p + (lane & 15) * ld + (lane >> 4) * 8);
    }
    static __device__ __forceinline__ void a_km(unsigned a[4], const T *p, int ld, int lane)
    {
        lj_ldsm_x4_t(a, p + ((lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8);
    }
    static __device__ __forceinline__ void b_nk(unsigned b[2], const T *p, int ld, int lane)
    {
        lj_ldsm_x2(b, p + (lane & 7) * ld + ((lane >> 3) & 1) * 8);
    }
    // Two adjacent n8 tiles at once: b[0..1] for columns n 0-7, b[2..3] for 8-15.
    static __device__ __forceinline__ void b_nk2(unsigned b[4], const T *p, int ld, int lane)
    {
        lj_ldsm_x4(b, p + ((lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8);
    }
    static __device__ __forceinline__ void b_kn(unsigned b[2], const T *p, int ld, int lane)
    {
        lj_ldsm_x2_t(b, p + (lane & 15) * ld);
    }
    static __device__ __forceinline__ void b_kn2(unsigned b[4], const T *p, int ld, int lane)
    {
        lj_ldsm_x4_t(b, p + (lane & 15) * ld + (lane >> 4) * 8);
    }
    // Scales the two k rows held by one B register (k = 2t and 2t + 1 of its half) and rounds.
    static __device__ __forceinline__ unsigned scale2(unsigned r, float s0, float s1)
    {
        T lo, hi;
        lo.bits = (unsigned short)(r & 0xffff);
        hi.bits = (unsigned short)(r >> 16);
        return lj_pack2<T>(lj_to_float(lo) * s0, lj_to_float(hi) * s1);
    }
    // Weights of the k rows this lane holds in a B fragment (rows 2t, 2t+1, 2t+8, 2t+9 of the
    // k-step): row r gets pw[max(top - r, 0)] (the decayed keys/values of a state update).
    static __device__ __forceinline__ void row_weights(float w[4], int lane, const float *pw, int top)
    {
        const int r = 2 * (lane & 3);
        w[0] = pw[max(top - r, 0)];
        w[1] = pw[max(top - r - 1, 0)];
        w[2] = pw[max(top - r - 8, 0)];
        w[3] = pw[max(top - r - 9, 0)];
    }
    // Scales a B fragment by its row weights and rounds back to T.
    static __device__ __forceinline__ void weigh(unsigned b[2], const float w[4])
    {
        b[0] = scale2(b[0], w[0], w[1]);
        b[1] = scale2(b[1], w[2], w[3]);
    }
    static __device__ __forceinline__ void b_kn_weighted(unsigned b[2], const T *p, int ld,
                                                         int lane, const float w[4])
    {
        b_kn(b, p, ld, lane);
        weigh(b, w);
    }
    // A operand of k-step kk from the accumulators of n8 tiles 2kk and 2kk+1 of a 16 x n
    // product (the probabilities-times-values reuse of flash attention).
    template <int NT8>
    static __device__ __forceinline__ void a_from_acc(unsigned a[4], const float (&c)[NT8][4],
                                                      int kk, int)
    {
        a[0] = lj_pack2<T>(c[2 * kk][0], c[2 * kk][1]);
        a[1] = lj_pack2<T>(c[2 * kk][2], c[2 * kk][3]);
        a[2] = lj_pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
        a[3] = lj_pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
    }
};

template <> struct lj_frag<lj_bf16> : lj_frag16<lj_bf16> {
    static __device__ __forceinline__ void mma(float d[4], const unsigned a[4], const unsigned b[2])
    {
        lj_mma_bf16(d, a, b);
    }
};
template <> struct lj_frag<lj_f16> : lj_frag16<lj_f16> {
    static __device__ __forceinline__ void mma(float d[4], const unsigned a[4], const unsigned b[2])
    {
        lj_mma_f16(d, a, b);
    }
};

// fp32 inputs: tf32 m16n8k8 operands gathered with 32-bit shared loads and rounded with cvt.rna.
// A row stride of 4 (mod 32) words keeps the row-indexed gathers free of bank conflicts.
template <> struct lj_frag<float> {
    static constexpr int KSTEP = 8;
    static __device__ __forceinline__ void a_mk(unsigned a[4], const float *p, int ld, int lane)
    {
        const int g = lane >> 2, t = lane & 3;
        a[0] = lj_tf32(p[g * ld + t]);
        a[1] = lj_tf32(p[(g + 8) * ld + t]);
        a[2] = lj_tf32(p[g * ld + t + 4]);
        a[3] = lj_tf32(p[(g + 8) * ld + t + 4]);
    }
    static __device__ __forceinline__ void a_km(unsigned a[4], const float *p, int ld, int lane)
    {
        const int g = lane >> 2, t = lane & 3;
        a[0] = lj_tf32(p[t * ld + g]);
        a[1] = lj_tf32(p[t * ld + g + 8]);
        a[2] = lj_tf32(p[(t + 4) * ld + g]);
        a[3] = lj_tf32(p[(t + 4) * ld + g + 8]);
    }
    static __device__ __forceinline__ void b_nk(unsigned b[2], const float *p, int ld, int lane)
    {
        const int g = lane >> 2, t = lane & 3;
        b[0] = lj_tf32(p[g * ld + t]);
        b[1] = lj_tf32(p[g * ld + t + 4]);
    }
    static __device__ __forceinline__ void b_kn(unsigned b[2], const float *p, int ld, int lane)
    {
        const int g = lane >> 2, t = lane & 3;
        b[0] = lj_tf32(p[t * ld + g]);
        b[1] = lj_tf32(p[(t + 4) * ld + g]);
    }
    // Weights of the k rows this lane holds in a B fragment (rows t and t + 4 of the k-step).
    static __device__ __forceinline__ void row_weights(float w[4], int lane, const float *pw, int top)
    {
        const int t = lane & 3;
        w[0] = pw[max(top - t, 0)];
        w[1] = pw[max(top - t - 4, 0)];
        w[2] = w[3] = 0.f;
    }
    // B from [k][n] scaled by the row weights before rounding to tf32 (rounding first and
    // scaling after would leave the tensor core to truncate the product).
    static __device__ __forceinline__ void b_kn_weighted(unsigned b[2], const float *p, int ld,
                                                         int lane, const float w[4])
    {
        const int g = lane >> 2, t = lane & 3;
        b[0] = lj_tf32(p[t * ld + g] * w[0]);
        b[1] = lj_tf32(p[(t + 4) * ld + g] * w[1]);
    }
    // Two-tile loads exist only for the 16-bit types; kernels test KSTEP before using them.
    static __device__ __forceinline__ void b_nk2(unsigned[4], const float *, int, int) {}
    static __device__ __forceinline__ void b_kn2(unsigned[4], const float *, int, int) {}
    static __device__ __forceinline__ void weigh(unsigned[2], const float[4]) {}
    // A operand (16 x 8, tf32) of k-step kk from the accumulator of n8 tile kk: element (g, t)
    // lives in lane 4g + t/2 as c[t & 1], (g, t + 4) in lane 4g + 2 + t/2; rows g + 8 likewise in
    // c[2], c[3].
    template <int NT8>
    static __device__ __forceinline__ void a_from_acc(unsigned a[4], const float (&cc)[NT8][4],
                                                      int kk, int lane)
    {
        const float *c = cc[kk];
        const int t = lane & 3;
        const int src0 = (lane & ~3) | (t >> 1), src1 = src0 + 2;
        const float x00 = __shfl_sync(0xffffffffu, c[0], src0);
        const float x01 = __shfl_sync(0xffffffffu, c[1], src0);
        const float x10 = __shfl_sync(0xffffffffu, c[2], src0);
        const float x11 = __shfl_sync(0xffffffffu, c[3], src0);
        const float y00 = __shfl_sync(0xffffffffu, c[0], src1);
        const float y01 = __shfl_sync(0xffffffffu, c[1], src1);
        const float y10 = __shfl_sync(0xffffffffu, c[2], src1);
        const float y11 = __shfl_sync(0xffffffffu, c[3], src1);
        const bool odd = t & 1;
        a[0] = lj_tf32(odd ? x01 : x00);
        a[1] = lj_tf32(odd ? x11 : x10);
        a[2] = lj_tf32(odd ? y01 : y00);
        a[3] = lj_tf32(odd ? y11 : y10);
    }
    static __device__ __forceinline__ void mma(float d[4], const unsigned a[4], const unsigned b[2])
    {
        lj_mma_tf32(d, a, b);
    }
};

#endif
