// ds_share.cuh — the last step of the decay gradient, shared by the kernels that compute it
// (la_bwd/ds.cu's walk and la_fwd_sm90/fwd.cu's dq pass with DS): each CTA's threads hold parts
// of its share of Σ_t ⟨G_t, S_{t−1}⟩ for one (sequence b, head h, column slice blockIdx.x); the
// CTA adds them in a fixed order (a shuffle tree per warp, then the warps in order) and writes its
// share to the workspace; the last CTA to finish (an integer ticket) adds every share per head,
// over sequences and slices in order, and writes ds_h = −λ_h · sum. No floating-point atomics: the
// same inputs give the same bits.
//
// Workspace (lajit_attn_bwd_workspace_size): an unsigned ticket at byte 0, zeroed before the
// launch and left zero by the last CTA, then the shares from byte 16 at
// ((sequence · H) + h) · gridDim.x + blockIdx.x.
#ifndef LAJIT_DS_SHARE_CUH
#define LAJIT_DS_SHARE_CUH

#include "la_params.h"

// Every thread of the CTA (NT of them, a multiple of 32) calls this once with its part.
template <int NT>
__device__ __forceinline__ void lj_ds_share(float part, const la_params &p, int b, int h)
{
    static_assert(NT % 32 == 0, "whole warps");
    __shared__ float warp_part[NT / 32];
    __shared__ int is_last;
    const int tid = threadIdx.x;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
    if ((tid & 31) == 0) warp_part[tid >> 5] = part;
    __syncthreads();
    unsigned *ticket = reinterpret_cast<unsigned *>(p.workspace);
    float *shares = reinterpret_cast<float *>(p.workspace + 16);
    const int nslice = (int)gridDim.x;
    if (tid == 0) {
        float sum = 0.f;
        for (int w = 0; w < NT / 32; w++) sum += warp_part[w];
        shares[((long long)b * p.H + h) * nslice + blockIdx.x] = sum;
        __threadfence(); // the share is visible before the ticket is taken
        is_last = atomicAdd(ticket, 1u) == gridDim.x * gridDim.y * gridDim.z - 1;
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    const float *s = reinterpret_cast<const float *>(p.decay);
    float *ds = reinterpret_cast<float *>(p.dsdecay);
    for (int hh = tid; hh < p.H; hh += NT) {
        float sum = 0.f;
        for (int bb = 0; bb < p.nseq; bb++)
            for (int sl = 0; sl < nslice; sl++) sum += __ldcg(shares + ((long long)bb * p.H + hh) * nslice + sl);
        ds[hh] = -expf(-s[hh]) * sum;
    }
    if (tid == 0) *ticket = 0u;
}

#endif
