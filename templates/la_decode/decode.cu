// decode.cu — T single-token steps of the Lightning Attention recurrence, state updated in place.
//
// Per row b (its pool slot from p.slots, −1: the row is skipped) and head h, for t = 0..T−1:
//     S ← λ S + k_tᵀ v_t        o_t = σ q_t S            (S fp32 [D, E], λ = exp(−s_h) or 1)
// The state is read once and written once per call whatever T is: it stays in registers for all
// steps. Decode moves 8 bytes per state element and does ~3 flops on it, so the kernel is a
// streaming kernel: its speed is the number of state bytes each SM keeps in flight.
//
// Geometry: one CTA per (E tile, h, b). The tile is TILE_V columns of E by all D rows; in memory
// it is a [rows, CW] block whose contiguous width CW is TILE_V ("KV", [D, E] row-major) or D
// ("VK", [E, D]). LPR threads cover one row with 16-byte accesses (lane cg holds columns 4cg..
// 4cg+3), RS rows are covered per pass, and each thread holds NR passes: all NR 16-byte loads are
// issued before the first use. Output sums run over d: for KV across the threads of a column
// (shuffles, then one shared-memory slot per warp), for VK along a row (shuffles inside the row's
// lanes). The sum order is fixed, so outputs are bit-deterministic.
#include "common/la_params.h"
#include "common/types.cuh"

namespace {

using elem_t = ${ELEM};               // storage type of q, k, v, o
constexpr int D = ${D};               // key width (rows of the KV state)
constexpr int E = ${E};               // value width
constexpr int T = ${T};               // steps per call (part of the tuning key, so fully unrolled)
constexpr bool VK = ${VK};            // state stored [E, D] instead of [D, E]
constexpr bool DECAY = ${DECAY};      // s given: λ = exp(−s_h)
constexpr bool STEP_STATES = ${STEP_STATES}; // write S after every step
constexpr int TILE_V = ${TILE_V};     // E columns per CTA: smaller = more CTAs for small batches
constexpr int WARPS = ${WARPS};       // warps per CTA: with TILE_V, sets the state registers per thread
constexpr int CACHE = ${CACHE};       // state access hint: 0 none, 1 streaming (.cs), 2 L2 evict-first
                                      // policy, 3 256-byte L2 prefetch on loads

constexpr int NT = WARPS * 32;
constexpr int pow2ceil(int x) { return x <= 1 ? 1 : 2 * pow2ceil((x + 1) / 2); }
constexpr int CW = VK ? D : TILE_V;    // contiguous width of the tile, floats
constexpr int RD = VK ? TILE_V : D;    // rows of the tile
constexpr int LPR = pow2ceil(CW / 4);  // threads per row (power of two; lanes past CW/4 idle)
constexpr int RS = NT / LPR;           // rows per pass
constexpr int NR = (RD + RS - 1) / RS; // passes: 16-byte state vectors held per thread
constexpr bool FULL_COLS = LPR * 4 == CW;
constexpr bool FULL_ROWS = NR * RS == RD;
// Partial output sums per column that meet in shared memory: KV, one per warp (or per row of a
// pass when a row fills a warp); VK, one per warp a row spans.
constexpr int NSLOT = VK ? (LPR > 32 ? LPR / 32 : 1) : (LPR >= 32 ? RS : WARPS);
constexpr int LW = LPR < 32 ? LPR : 32; // threads of one row inside a warp

static_assert(D % 16 == 0 && E % 16 == 0 && D <= 256 && E <= 256, "D, E: multiples of 16 up to 256");
static_assert(E % TILE_V == 0 && TILE_V % 4 == 0, "TILE_V divides E");
static_assert(LPR <= NT && NT % LPR == 0, "a row needs at most one CTA");
static_assert(T >= 1 && T <= 8, "T in 1..8");

struct __align__(16) f4 { float v[4]; };

// 16-byte state accesses. The state is touched once per call, so caching it only evicts the
// small q, k, v; the hints say so to the L1/L2 (which one pays is measured, docs/notes).
__device__ __forceinline__ unsigned long long l2_evict_first()
{
    unsigned long long pol = 0;
    if (CACHE == 2) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
__device__ __forceinline__ f4 ld4(const float *p, unsigned long long pol)
{
    f4 r;
    if (CACHE == 1)
        asm volatile("ld.global.cs.v4.f32 {%0,%1,%2,%3}, [%4];"
                     : "=f"(r.v[0]), "=f"(r.v[1]), "=f"(r.v[2]), "=f"(r.v[3]) : "l"(p));
    else if (CACHE == 2)
        asm volatile("ld.global.L2::cache_hint.v4.f32 {%0,%1,%2,%3}, [%4], %5;"
                     : "=f"(r.v[0]), "=f"(r.v[1]), "=f"(r.v[2]), "=f"(r.v[3]) : "l"(p), "l"(pol));
    else if (CACHE == 3)
        asm volatile("ld.global.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];"
                     : "=f"(r.v[0]), "=f"(r.v[1]), "=f"(r.v[2]), "=f"(r.v[3]) : "l"(p));
    else
        r = *reinterpret_cast<const f4 *>(p);
    return r;
}
__device__ __forceinline__ void st4(float *p, const f4 &x, unsigned long long pol)
{
    if (CACHE == 1)
        asm volatile("st.global.cs.v4.f32 [%0], {%1,%2,%3,%4};"
                     :: "l"(p), "f"(x.v[0]), "f"(x.v[1]), "f"(x.v[2]), "f"(x.v[3]) : "memory");
    else if (CACHE == 2)
        asm volatile("st.global.L2::cache_hint.v4.f32 [%0], {%1,%2,%3,%4}, %5;"
                     :: "l"(p), "f"(x.v[0]), "f"(x.v[1]), "f"(x.v[2]), "f"(x.v[3]), "l"(pol) : "memory");
    else
        *reinterpret_cast<f4 *>(p) = x;
}

} // namespace

extern "C" __global__ void __launch_bounds__(NT) la_decode(const __grid_constant__ la_params p)
{
    extern __shared__ float smem[];
    float *qs = smem;              // [T][D]      q_t, fp32
    float *ks = qs + T * D;        // [T][D]      k_t
    float *vs = ks + T * D;        // [T][TILE_V] v_t of this tile
    float *red = vs + T * TILE_V;  // [T][NSLOT][TILE_V] partial output sums

    const int b = blockIdx.z, h = blockIdx.y, e0 = blockIdx.x * TILE_V;
    const int slot = p.slots ? reinterpret_cast<const int *>(p.slots)[b] : b;
    if (slot < 0) return; // skipped row: output, state and step states untouched
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int cg = tid % LPR, r0 = tid / LPR;
    const int c = 4 * cg;                      // first column (contiguous dim) of this thread
    const bool col_ok = FULL_COLS || c < CW;

    // Row stride of the state tile and its origin: KV rows are d, columns e0 + c; VK rows are
    // e0 + r, columns d. Offsets inside one (slot, h) state fit in 32 bits (host guarantee).
    const int srs = VK ? (int)p.s0.s3 : (int)p.s0.s2;
    const float *src = reinterpret_cast<const float *>(p.s0.ptr) + slot * p.s0.s0 + h * p.s0.s1
                     + (VK ? e0 * srs : e0) + c;
    const int drs = VK ? (int)p.sn.s3 : (int)p.sn.s2;
    float *dst = reinterpret_cast<float *>(p.sn.ptr) + slot * p.sn.s0 + h * p.sn.s1
               + (VK ? e0 * drs : e0) + c;

    // 1. Issue every state load of this thread before anything waits on one.
    const unsigned long long pol = l2_evict_first();
    f4 st[NR];
#pragma unroll
    for (int i = 0; i < NR; ++i) {
        const int r = r0 + i * RS;
        if (col_ok && (FULL_ROWS || r < RD)) st[i] = ld4(src + r * srs, pol);
        else st[i] = f4{{0.f, 0.f, 0.f, 0.f}};
    }

    // 2. Stage q, k (all D) and v (this tile) as fp32 in shared memory; the loads overlap the
    //    state loads in flight.
    {
        const elem_t *q = reinterpret_cast<const elem_t *>(p.q.ptr) + b * p.q.s0 + h * p.q.s1;
        const elem_t *k = reinterpret_cast<const elem_t *>(p.k.ptr) + b * p.k.s0 + h * p.k.s1;
        const elem_t *v = reinterpret_cast<const elem_t *>(p.v.ptr) + b * p.v.s0 + h * p.v.s1 + e0;
        const int qst = (int)p.q.s2, kst = (int)p.k.s2, vst = (int)p.v.s2;
        for (int i = tid; i < T * D; i += NT) {
            const int t = i / D, d = i - t * D;
            qs[i] = lj_to_float(q[t * qst + d]);
            ks[i] = lj_to_float(k[t * kst + d]);
        }
        for (int i = tid; i < T * TILE_V; i += NT) {
            const int t = i / TILE_V, e = i - t * TILE_V;
            vs[i] = lj_to_float(v[t * vst + e]);
        }
    }
    float lam = 1.f;
    if (DECAY) lam = expf(-reinterpret_cast<const float *>(p.decay)[h]);
    __syncthreads();

    // 3. T steps in registers. KV: acc[t][j] sums column c + j over this thread's rows;
    //    VK: acc[t][i] sums row i over this thread's 4 columns.
    constexpr int NACC = VK ? NR : 4;
    float acc[T][NACC];
#pragma unroll
    for (int t = 0; t < T; ++t) {
#pragma unroll
        for (int a = 0; a < NACC; ++a) acc[t][a] = 0.f;
        const float *qt = qs + t * D, *kt = ks + t * D, *vt = vs + t * TILE_V;
        if (!VK) {
            const f4 v4 = col_ok ? *reinterpret_cast<const f4 *>(vt + c) : f4{{0.f, 0.f, 0.f, 0.f}};
#pragma unroll
            for (int i = 0; i < NR; ++i) {
                const int d = r0 + i * RS;
                if (!(FULL_ROWS || d < RD)) continue;
                const float kd = kt[d], qd = qt[d];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    float s = DECAY ? lam * st[i].v[j] : st[i].v[j];
                    s = fmaf(kd, v4.v[j], s);
                    st[i].v[j] = s;
                    acc[t][j] = fmaf(qd, s, acc[t][j]);
                }
            }
        } else {
            f4 q4 = f4{{0.f, 0.f, 0.f, 0.f}}, k4 = q4;
            if (col_ok) {
                q4 = *reinterpret_cast<const f4 *>(qt + c);
                k4 = *reinterpret_cast<const f4 *>(kt + c);
            }
#pragma unroll
            for (int i = 0; i < NR; ++i) {
                const int e = r0 + i * RS;
                if (!(FULL_ROWS || e < RD)) continue;
                const float ve = vt[e];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    float s = DECAY ? lam * st[i].v[j] : st[i].v[j];
                    s = fmaf(k4.v[j], ve, s);
                    st[i].v[j] = s;
                    acc[t][i] = fmaf(q4.v[j], s, acc[t][i]);
                }
            }
        }
        if (STEP_STATES) {
            const int srs2 = VK ? (int)p.step_states.s3 : (int)p.step_states.s2;
            float *ss = reinterpret_cast<float *>(p.step_states.ptr)
                      + (long long)(b * T + t) * p.step_states.s0 + h * p.step_states.s1
                      + (VK ? e0 * srs2 : e0) + c;
#pragma unroll
            for (int i = 0; i < NR; ++i) {
                const int r = r0 + i * RS;
                if (col_ok && (FULL_ROWS || r < RD)) st4(ss + r * srs2, st[i], pol);
            }
        }
    }

    // 4. Write the state back (in place) before the output reduction, so the stores drain while
    //    the CTA reduces.
#pragma unroll
    for (int i = 0; i < NR; ++i) {
        const int r = r0 + i * RS;
        if (col_ok && (FULL_ROWS || r < RD)) st4(dst + r * drs, st[i], pol);
    }

    // 5. Output: reduce partial sums in a fixed order (shuffles, then shared memory).
#pragma unroll
    for (int t = 0; t < T; ++t) {
        if (!VK) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float x = acc[t][j];
#pragma unroll
                for (int off = LPR; off < 32; off *= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
                const int sl = LPR >= 32 ? r0 : warp;
                if ((LPR >= 32 || lane < LPR) && col_ok) red[(t * NSLOT + sl) * TILE_V + c + j] = x;
            }
        } else {
#pragma unroll
            for (int i = 0; i < NR; ++i) {
                float x = acc[t][i];
#pragma unroll
                for (int off = 1; off < LW; off *= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
                const int e = r0 + i * RS;
                if (cg % LW == 0 && (FULL_ROWS || e < RD)) red[(t * NSLOT + cg / 32) * TILE_V + e] = x;
            }
        }
    }
    __syncthreads();
    {
        elem_t *o = reinterpret_cast<elem_t *>(p.o.ptr) + b * p.o.s0 + h * p.o.s1 + e0;
        const int ost = (int)p.o.s2;
        for (int i = tid; i < T * TILE_V; i += NT) {
            const int t = i / TILE_V, e = i - t * TILE_V;
            float x = 0.f;
#pragma unroll
            for (int s = 0; s < NSLOT; ++s) x += red[(t * NSLOT + s) * TILE_V + e];
            o[t * ost + e] = lj_from_float<elem_t>(p.scale * x);
        }
    }
}
