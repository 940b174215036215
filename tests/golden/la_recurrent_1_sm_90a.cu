#line 1 "la_recurrent/recurrent.cu"
// recurrent.cu — the exact recurrence, one token at a time: the simple, obviously right forward
// that proves the data path and serves as the GPU oracle of the fast families.
//
// Per (b, h) and a tile of TILE_V columns of E, for t = 1..N:
//     S ← λ S + k_tᵀ v_t        o_t = σ q_t S          (S fp32 [D, TILE_V], λ = exp(−s_h) or 1)
// One CTA per (E tile, h, b). Thread (r, c) owns column c of the tile and rows d = r, r + R, ...
// (R = threads / TILE_V row groups), so its SPT = D / R state values stay in registers for the
// whole sequence. Each step stages q_t, k_t and the tile of v_t in shared memory as fp32; each
// thread updates its state values and forms a partial q·S over its rows; the R partials of a
// column are summed in a fixed order, so results are bit-deterministic. Nothing here is fast:
// accuracy (fp32 FMA throughout) and clarity are the point.
#include "common/la_params.h"
#include "common/types.cuh"
#include "common/seq.cuh"

namespace {

using elem_t = float;                 // storage type of q, k, v
using out_t = float;              // storage type of o (elem_t, or a mixed fp32/16-bit pair)
using state_t = float;             // storage type of S_0 and S_N (accumulated in fp32)
constexpr int D = 64;         // key width
constexpr int E = 32;         // value width
constexpr int TILE_V = 32;       // E columns per CTA: more CTAs for small B*H
constexpr int THREADS = 2 * 32;  // with TILE_V, the state values per thread
constexpr int R = 2;                 // row groups (la_recurrent/family.lua's split())
constexpr unsigned SMEM = 896;      // static shared memory the spec counts, bytes
constexpr int SPT = D / R;              // state values per thread
constexpr bool DECAY = false;
constexpr bool HAS_INITIAL = false;
constexpr bool HAS_FINAL = false;
constexpr bool VARLEN = false;

static_assert(THREADS % TILE_V == 0 && R * TILE_V == THREADS && D % R == 0,
              "family.lua's valid() admits only even splits");
static_assert((2 * D + TILE_V + R * TILE_V) * sizeof(float) <= SMEM,
              "shared memory: q_s, k_s, v_s and partial exceed the spec's SMEM");

__device__ __forceinline__ state_t *state_at(const la_tensor4 &s, long long slot, int h, int d, int e)
{
    return reinterpret_cast<state_t *>(s.ptr) + slot * s.s0 + h * s.s1 + d * s.s2 + e * s.s3;
}

} // namespace

// MIN_CTAS (family.lua): on sm_120 ptxas held some CTAs to 72 registers and spilled.
extern "C" __global__ void __launch_bounds__(THREADS) la_recurrent_fwd(const __grid_constant__ la_params p)
{
    __shared__ float q_s[D], k_s[D], v_s[TILE_V];
    __shared__ float partial[R][TILE_V];

    const int tid = threadIdx.x;
    const int c = tid % TILE_V;            // this thread's column in the tile
    const int r = tid / TILE_V;            // this thread's row group
    const int e0 = blockIdx.x * TILE_V;
    const int h = blockIdx.y;
    const int b = blockIdx.z;

    // The sequence: its token range and its state slots (common/seq.cuh's decoding: slot is read,
    // slot_out written; -1 for none).
    long long begin = 0, end = p.N, base_q = (long long)b * p.q.s0 + (long long)h * p.q.s1;
    long long base_k = (long long)b * p.k.s0 + (long long)h * p.k.s1;
    long long base_v = (long long)b * p.v.s0 + (long long)h * p.v.s1;
    long long base_o = (long long)b * p.o.s0 + (long long)h * p.o.s1;
    int slot = b, slot_out = b;
    if (VARLEN) {
        const int *cu = reinterpret_cast<const int *>(p.cu_seqlens);
        begin = cu[b];
        end = cu[b + 1];
        base_q = (long long)h * p.q.s1;
        base_k = (long long)h * p.k.s1;
        base_v = (long long)h * p.v.s1;
        base_o = (long long)h * p.o.s1;
        lj_slot_decode(p.slots ? reinterpret_cast<const int *>(p.slots)[b] : -1, slot, slot_out);
    }

    float S[SPT];
#pragma unroll
    for (int i = 0; i < SPT; i++)
        S[i] = 0.0f;
    if (HAS_INITIAL && slot >= 0) {
#pragma unroll
        for (int i = 0; i < SPT; i++)
            S[i] = lj_state_load(state_at(p.s0, slot, h, r + R * i, e0 + c));
    }
    float lambda = 1.0f;
    if (DECAY)
        lambda = expf(-reinterpret_cast<const float *>(p.decay)[h]);

    const elem_t *q = reinterpret_cast<const elem_t *>(p.q.ptr);
    const elem_t *k = reinterpret_cast<const elem_t *>(p.k.ptr);
    const elem_t *v = reinterpret_cast<const elem_t *>(p.v.ptr);
    out_t *o = reinterpret_cast<out_t *>(p.o.ptr);

    for (long long t = begin; t < end; t++) {
        for (int d = tid; d < D; d += THREADS) {
            q_s[d] = lj_to_float(q[base_q + t * p.q.s2 + d]);
            k_s[d] = lj_to_float(k[base_k + t * p.k.s2 + d]);
        }
        if (tid < TILE_V)
            v_s[tid] = lj_to_float(v[base_v + t * p.v.s2 + e0 + tid]);
        __syncthreads();
        const float vc = v_s[c];
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < SPT; i++) {
            const int d = r + R * i;
            S[i] = DECAY ? fmaf(lambda, S[i], k_s[d] * vc) : S[i] + k_s[d] * vc;
            acc = fmaf(q_s[d], S[i], acc);
        }
        partial[r][c] = acc;
        __syncthreads();
        if (r == 0) {
            float sum = 0.0f;
            for (int j = 0; j < R; j++)
                sum += partial[j][c];
            o[base_o + t * p.o.s2 + e0 + c] = lj_from_float<out_t>(p.scale * sum);
        }
        // The next step overwrites q_s, k_s, v_s and partial: everyone must be done reading.
        __syncthreads();
    }

    if (HAS_FINAL && slot_out >= 0) {
#pragma unroll
        for (int i = 0; i < SPT; i++)
            lj_state_store(state_at(p.sn, slot_out, h, r + R * i, e0 + c), S[i]);
    }
}
