#line 1 "la_bwd/ds.cu"
// ds.cu — the decay gradient of la_bwd (DESIGN.md): ds_h = −λ Σ_t ⟨G_t, S_{t−1}⟩, summed over the
// batch and over varlen sequences, fp32, deterministic.
//
// With Y_t = λ Y_{t−1} + S_{t−1} (Y_{−1} = 0: the decayed running sum of the earlier states),
//     Σ_t ⟨G_t, S_{t−1}⟩ = σ Σ_t q_t Y_t dO_tᵀ + ⟨dS_N, Y_{N−1}⟩
// (expand G_t = σ Σ_{m≥t} λ^{m−t} q_mᵀ dO_m + λ^{N−1−t} dS_N and exchange the sums). So one walk
// forward that carries S and Y needs no G: every term is a product of non-negative powers of λ
// and the inputs, with no division by λ and no difference of large sums (the identity through
// q·dq − k·dk is exact but cancels in 16-bit arithmetic; DESIGN.md rules it out).
//
// Each CTA owns a D × TILE_V slice of S and of Y in fp32 registers (a thread holds RD rows × 4
// columns of both) and sums its share of the two terms; q, k, v and dO are staged BLOCK tokens at
// a time in shared memory as fp32. The shares meet in the workspace (common/ds_share.cuh: the last
// CTA adds them in a fixed order; no floating-point atomics). This is a CUDA-core recurrence
// (about four FMAs per state element and token), paid only when ds is requested.
#include "common/la_params.h"
#include "common/types.cuh"
#include "common/seq.cuh"
#include "common/ds_share.cuh"

using T = float;
constexpr int D = 128;
constexpr int E = 64;
constexpr int TILE_V = 32;   // value columns per CTA
constexpr int BLOCK = 32;     // tokens staged in shared memory at a time
constexpr int NT = 8 * 32;
constexpr int RD = 4;           // state rows per thread (la_bwd/family.lua's ds_geometry)
constexpr unsigned SMEM = 40960;  // dynamic shared memory the launch provides, bytes
constexpr bool HAS_INITIAL = true;
constexpr bool HAS_DSN = true;
constexpr bool VARLEN = false;

constexpr int CG = TILE_V / 4;      // groups of 4 columns
constexpr int RG = NT / CG;         // groups of RD rows
constexpr int NSLICE = E / TILE_V;
static_assert(NT % CG == 0 && RG * RD == D && E % TILE_V == 0, "ds geometry");
static_assert(BLOCK * (2 * D + 2 * TILE_V) * sizeof(float) <= SMEM,
              "shared memory: the staged q, k, v, dO exceed the spec's SMEM");

extern "C" __global__ void __launch_bounds__(NT) la_bwd_ds(const __grid_constant__ la_params p)
{
    extern __shared__ __align__(16) float sm[];
    float *sq = sm, *sk = sq + BLOCK * D, *sv = sk + BLOCK * D, *sd = sv + BLOCK * TILE_V;

    const int tid = threadIdx.x;
    const int cx = tid % CG, ry = tid / CG;
    const int e0 = blockIdx.x * TILE_V, h = blockIdx.y, b = blockIdx.z;
    const int d0 = ry * RD, c0 = cx * 4;

    const lj_seq seq = lj_seq_of<VARLEN, false>(p.cu_seqlens, p.slots, p.N, b);
    const int n = seq.n, slot = seq.slot;
    const T *q = reinterpret_cast<const T *>(p.q.ptr) + seq.bq * p.q.s0 + h * p.q.s1 + seq.tok0 * p.q.s2;
    const T *k = reinterpret_cast<const T *>(p.k.ptr) + seq.bq * p.k.s0 + h * p.k.s1 + seq.tok0 * p.k.s2;
    const T *v = reinterpret_cast<const T *>(p.v.ptr) + seq.bq * p.v.s0 + h * p.v.s1 + seq.tok0 * p.v.s2 + e0;
    const T *g = reinterpret_cast<const T *>(p.dout.ptr) + seq.bq * p.dout.s0 + h * p.dout.s1 +
                 seq.tok0 * p.dout.s2 + e0;
    const float lambda = expf(-reinterpret_cast<const float *>(p.decay)[h]);

    float S[RD][4], Y[RD][4];
#pragma unroll
    for (int a = 0; a < RD; a++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            S[a][c] = 0.f;
            Y[a][c] = 0.f;
        }
    if constexpr (HAS_INITIAL) {
        if (slot >= 0) {
            const float *s0 = reinterpret_cast<const float *>(p.s0.ptr) + (long long)slot * p.s0.s0 + h * p.s0.s1;
#pragma unroll
            for (int a = 0; a < RD; a++)
#pragma unroll
                for (int c = 0; c < 4; c++) S[a][c] = s0[(d0 + a) * p.s0.s2 + (e0 + c0 + c) * p.s0.s3];
        }
    }

    float acc = 0.f; // Σ_t q_t Y_t dO_tᵀ over this thread's elements
    for (int t0 = 0; t0 < n; t0 += BLOCK) {
        const int L = min(BLOCK, n - t0);
        __syncthreads(); // the previous tokens are consumed
        for (int i = tid; i < L * D; i += NT) {
            const int r = i / D, c = i % D;
            sq[i] = lj_to_float(q[(t0 + r) * p.q.s2 + c]);
            sk[i] = lj_to_float(k[(t0 + r) * p.k.s2 + c]);
        }
        for (int i = tid; i < L * TILE_V; i += NT) {
            const int r = i / TILE_V, c = i % TILE_V;
            sv[i] = lj_to_float(v[(t0 + r) * p.v.s2 + c]);
            sd[i] = lj_to_float(g[(t0 + r) * p.dout.s2 + c]);
        }
        __syncthreads();
        for (int j = 0; j < L; j++) {
            const float4 vv = *reinterpret_cast<const float4 *>(sv + j * TILE_V + c0);
            const float4 dd = *reinterpret_cast<const float4 *>(sd + j * TILE_V + c0);
            const float vr[4] = {vv.x, vv.y, vv.z, vv.w}, dr[4] = {dd.x, dd.y, dd.z, dd.w};
#pragma unroll
            for (int a = 0; a < RD; a++) {
                const float qa = sq[j * D + d0 + a], ka = sk[j * D + d0 + a];
                float z = 0.f;
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    Y[a][c] = fmaf(lambda, Y[a][c], S[a][c]);          // Y_t uses S_{t−1}
                    S[a][c] = fmaf(lambda, S[a][c], ka * vr[c]);
                    z = fmaf(dr[c], Y[a][c], z);
                }
                acc = fmaf(qa, z, acc);
            }
        }
    }

    float part = p.scale * acc;
    if constexpr (HAS_DSN) { // ⟨dS_N, Y_{N−1}⟩
        // dS_N belongs to the final state's slot (a fresh sequence's too: common/seq.cuh).
        if (seq.slot_out >= 0) {
            const float *dsn = reinterpret_cast<const float *>(p.dsn.ptr) + (long long)seq.slot_out * p.dsn.s0 + h * p.dsn.s1;
            float a2 = 0.f;
#pragma unroll
            for (int a = 0; a < RD; a++)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    a2 = fmaf(dsn[(d0 + a) * p.dsn.s2 + (e0 + c0 + c) * p.dsn.s3], Y[a][c], a2);
            part += a2;
        }
    }

    lj_ds_share<NT>(part, p, b, h);
}
