// split.cuh — one sequence walked by several CTAs at once (issue 16, docs/notes/split.md), for
// the chunk kernels whose configuration has SPLIT > 1 segments per sequence.
//
// A sequence of n tokens is cut into nseg segments of `len` tokens (the last one shorter), in the
// kernel's walk order (from the last token when REVERSE). The state entering segment j is
//     S_in,0 = S_0        S_in,j = λ^{n_{j−1}} S_in,j−1 + M_{j−1}
// with M_j the state segment j builds from zero (its local state). Each CTA of a segment j <
// nseg − 1 first walks its segment without outputs to form M_j and publishes it; then every CTA
// forms its S_in,j from S_0 and the published M_0 .. M_{j−1} (Horner's rule, the segments before
// it being whole: n_i = len) and walks its segment again from S_in,j with outputs. No CTA waits
// for another's S_in, only for local states that are all formed at once: no serial chain (a
// first version passed S_in from segment to segment and spent ~20 µs per link, notes). K and V
// are read twice; segment j reads j local states of its column slice.
//
// No CTA may wait for one that has not started, or it could deadlock on a full GPU: a CTA takes
// its (segment, slice, head, sequence) from an arrival ticket, segments slowest, so every CTA it
// waits for took an earlier ticket and is running. A flag is set to the launch's epoch + 1, so
// flags need no clearing; the last CTA to finish resets the ticket and the count and advances the
// epoch. The flags buffer is zeroed once when allocated; a launch needs no memset and can be
// captured in a graph; launches sharing the buffers must be ordered (one stream). (After 2^32
// launches on one buffer the epoch wraps: a flag left from 2^32 launches before would pass.)
// The flags live apart from the states: a launch of another layout (the backward's passes swap D
// and E) never reads states as flags.
//
// Buffers (the family spec's split_ws() and split_flags() compute WS_PER and FLAGS_PER;
// runtime/plan_build.c sizes them):
//     p.splitws: bytes 0..15          ticket, finished-CTA count, epoch (unsigned)
//                from byte 16, per (sequence b, head h), FLAGS_PER bytes:
//                unsigned flag[SPLIT − 1][E/16]  epoch + 1 once M_j of those columns is written
//     p.splitst: per (sequence b, head h), WS_PER bytes:
//                float M[SPLIT − 1][D][E]        the local states of segments 0 .. SPLIT − 2
#ifndef LAJIT_SPLIT_CUH
#define LAJIT_SPLIT_CUH

#include "la_params.h"

// A boolean as a type: the compile-time flag a generic lambda takes (a walk with or without
// outputs is one body instantiated twice).
template <bool B> struct lj_bool {
    static constexpr bool value = B;
};

// This CTA's place: segment j, column slice xs, head h, sequence b, from the arrival ticket over
// a grid of {slices · SPLIT, H, sequences}; and the launch's epoch.
template <int SPLIT>
__device__ __forceinline__ void lj_split_claim(unsigned long long ws, int &j, int &xs, int &h, int &b,
                                               unsigned &epoch)
{
    __shared__ unsigned ticket, ep;
    if (threadIdx.x == 0) {
        ticket = atomicAdd(reinterpret_cast<unsigned *>(ws), 1u);
        ep = *reinterpret_cast<volatile unsigned *>(ws + 8);
    }
    __syncthreads();
    const unsigned nsl = gridDim.x / SPLIT, per_seg = nsl * gridDim.y * gridDim.z;
    unsigned v = ticket;
    epoch = ep;
    j = (int)(v / per_seg);
    v %= per_seg;
    xs = (int)(v % nsl);
    v /= nsl;
    h = (int)(v % gridDim.y);
    b = (int)(v / gridDim.y);
}

// The segments of a sequence of n tokens: `len` tokens each (a multiple of the chunk, at least
// SEG_MIN, so short sequences of a varlen batch stay whole), nseg of them (1 for n = 0).
template <int SPLIT, int SEG_MIN, int BLOCK>
__device__ __forceinline__ void lj_split_segments(int n, int &len, int &nseg)
{
    const int per = (n + SPLIT - 1) / SPLIT;
    len = max(SEG_MIN, (per + BLOCK - 1) / BLOCK * BLOCK);
    nseg = n > 0 ? (n + len - 1) / len : 1;
}

// The local state M_j of segment j (0 ≤ j < SPLIT − 1) of (sequence b, head h), and its flag for
// the 16-column group of column c.
template <int SPLIT, int D, int E>
__device__ __forceinline__ float *lj_split_state(unsigned long long st, unsigned long long ws_per, int b, int H,
                                                 int h, int j)
{
    const unsigned long long base = st + ((unsigned long long)b * H + h) * ws_per;
    return reinterpret_cast<float *>(base) + (long long)j * D * E;
}
template <int SPLIT, int D, int E>
__device__ __forceinline__ unsigned *lj_split_flag(unsigned long long ws, unsigned long long flags_per, int b,
                                                   int H, int h, int j, int c)
{
    const unsigned long long base = ws + 16 + ((unsigned long long)b * H + h) * flags_per;
    return reinterpret_cast<unsigned *>(base) + j * (E / 16) + c / 16;
}

// Every thread calls these. Publish: after this thread's stores of M_j, set the flag. Wait: until
// the flag is set in this launch.
__device__ __forceinline__ void lj_split_publish(unsigned *flag, unsigned epoch)
{
    __threadfence(); // this thread's part of the state is visible before the flag
    __syncthreads();
    if (threadIdx.x == 0) atomicExch(flag, epoch + 1u);
}
__device__ __forceinline__ void lj_split_wait(unsigned *flag, unsigned epoch)
{
    if (threadIdx.x == 0) {
        volatile unsigned *f = flag;
        while (*f != epoch + 1u) __nanosleep(32);
        __threadfence();
    }
    __syncthreads();
}

// Every CTA calls this last (also one whose segment is empty): the last to finish resets the
// ticket and the count and advances the epoch for the next launch.
__device__ __forceinline__ void lj_split_done(unsigned long long ws)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned *cnt = reinterpret_cast<unsigned *>(ws);
        if (atomicAdd(cnt + 1, 1u) == gridDim.x * gridDim.y * gridDim.z - 1) {
            cnt[0] = 0u;
            cnt[1] = 0u;
            cnt[2] += 1u;
        }
    }
}

#endif
