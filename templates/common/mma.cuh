// mma.cuh — tensor-core matrix multiply-accumulate (mma.sync, sm_80 and newer) as inline PTX.
//
// m16n8k16 with 16-bit A and B and fp32 accumulators. Fragment layout per lane (g = lane / 4,
// t = lane % 4), each 32-bit register holding two 16-bit values with the lower column/row first:
//   A (16×16, row-major):  a0 = (g, 2t..2t+1)  a1 = (g+8, 2t..)  a2 = (g, 2t+8..)  a3 = (g+8, 2t+8..)
//   B (16×8, "col"):       b0 = (k 2t..2t+1, n g)                b1 = (k 2t+8..2t+9, n g)
//   C (16×8, fp32):        c0, c1 = (g, 2t, 2t+1)                c2, c3 = (g+8, 2t, 2t+1)
// Two neighbouring C tiles (n 0..7 and 8..15) of a row block are, packed to 16 bits, exactly an A
// fragment of k 0..15: the "register operand" reuse of attention kernels.
#ifndef LAJIT_MMA_CUH
#define LAJIT_MMA_CUH

#include "common/types.cuh"

template <typename T> struct lj_mma;

template <> struct lj_mma<lj_bf16> {
    static __device__ __forceinline__ void run(float c[4], const unsigned a[4], unsigned b0, unsigned b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <> struct lj_mma<lj_f16> {
    static __device__ __forceinline__ void run(float c[4], const unsigned a[4], unsigned b0, unsigned b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// A 32-bit shared-memory load of two neighbouring 16-bit values.
__device__ __forceinline__ unsigned lj_ld2(const unsigned short *p)
{
    return *reinterpret_cast<const unsigned *>(p);
}

#endif
