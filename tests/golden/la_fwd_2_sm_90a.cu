#line 1 "la_fwd/fwd.cu"
// fwd.cu — the chunked Lightning Attention forward with tensor cores (mma.sync, sm_80+).
//
// One CTA of 4 warps per (E tile of TILE_V columns, head h, sequence b) walks its sequence in
// chunks of BLOCK = 64 tokens, keeping its slice of the fp32 state S [D, TILE_V] in registers as
// mma accumulators. Per chunk (actual length L, S the state before it), DESIGN.md's chunk form:
//     O = σ [ (Q Kᵀ ⊙ M) V + diag(λ^{i+1}) Q S ]     M_ij = λ^{i−j} (i ≥ j), 0 above
//     S ← λ^L S + (diag(λ^{L−1−j}) K)ᵀ V
// Warp w computes output rows 16w..16w+15; the state's 16×8 tiles are dealt round-robin to the
// warps. Operands are staged in shared memory in the layouts the fragments want (V, the weighted
// K and the 16-bit copy of S transposed), each row padded by 8 values so the 32-bit fragment
// loads of a warp hit 32 different banks. P = QKᵀ ⊙ M and the copy of S are rounded to the input's
// 16-bit type before their products, as DESIGN.md's accuracy budget assumes.
#include "common/la_params.h"
#include "common/mma.cuh"
#include "common/types.cuh"

namespace {

using elem_t = lj_f16;                  // lj_bf16 or lj_f16 (fp32 inputs use la_recurrent for now)
constexpr int D = 96;          // key width
constexpr int E = 64;          // value width
constexpr int TILE_V = 16;        // E columns per CTA: more CTAs, and fewer state registers
constexpr int BLOCK = 64;          // chunk length: one warp per 16 rows
constexpr int WARPS = BLOCK / 16;
constexpr int THREADS = WARPS * 32;
constexpr bool DECAY = false;
constexpr bool HAS_INITIAL = true;
constexpr bool HAS_FINAL = true;
constexpr bool VARLEN = false;

// Shared-memory row strides (16-bit elements), each padded by 8.
constexpr int QS = D + 8;        // Q [BLOCK][D] and K [BLOCK][D]
constexpr int KTS = BLOCK + 8;   // Kt [D][BLOCK]: K transposed, row j weighted by λ^{L−1−j}
constexpr int VTS = BLOCK + 8;   // Vt [TILE_V][BLOCK]: V transposed
constexpr int STS = D + 8;       // St [TILE_V][D]: the state, transposed, 16-bit
constexpr int S_TILES = (D / 16) * (TILE_V / 8);            // 16×8 tiles of the state slice
constexpr int S_PER_WARP = (S_TILES + WARPS - 1) / WARPS;   // register tiles per thread

static_assert(D % 16 == 0 && TILE_V % 16 == 0 && BLOCK % 16 == 0, "family.lua's valid() guarantees this");

struct Smem {
    unsigned short q[BLOCK * QS], k[BLOCK * QS], kt[D * KTS], vt[TILE_V * VTS], st[TILE_V * STS];
    float pw[BLOCK + 1]; // λ^n, n = 0..BLOCK
};

__device__ __forceinline__ unsigned short bits_of(float x)
{
    elem_t e = lj_from_float<elem_t>(x);
    return e.bits;
}

} // namespace

extern "C" __global__ void __launch_bounds__(THREADS) la_fwd(const __grid_constant__ la_params p)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem &sm = *reinterpret_cast<Smem *>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int e0 = blockIdx.x * TILE_V, h = blockIdx.y, b = blockIdx.z;

    long long begin = 0, end = p.N;
    long long bq = (long long)b * p.q.s0 + (long long)h * p.q.s1;
    long long bk = (long long)b * p.k.s0 + (long long)h * p.k.s1;
    long long bv = (long long)b * p.v.s0 + (long long)h * p.v.s1;
    long long bo = (long long)b * p.o.s0 + (long long)h * p.o.s1;
    int slot = b;
    if (VARLEN) {
        const int *cu = reinterpret_cast<const int *>(p.cu_seqlens);
        begin = cu[b];
        end = cu[b + 1];
        bq = (long long)h * p.q.s1;
        bk = (long long)h * p.k.s1;
        bv = (long long)h * p.v.s1;
        bo = (long long)h * p.o.s1;
        slot = p.slots ? reinterpret_cast<const int *>(p.slots)[b] : -1;
    }
    const elem_t *q = reinterpret_cast<const elem_t *>(p.q.ptr) + bq;
    const elem_t *k = reinterpret_cast<const elem_t *>(p.k.ptr) + bk;
    const elem_t *v = reinterpret_cast<const elem_t *>(p.v.ptr) + bv + e0;
    elem_t *o = reinterpret_cast<elem_t *>(p.o.ptr) + bo + e0;

    if (tid <= BLOCK)
        sm.pw[tid] = DECAY ? expf(-reinterpret_cast<const float *>(p.decay)[h] * (float)tid) : 1.0f;

    // The state slice: this thread's part of its warp's 16×8 tiles.
    float S[S_PER_WARP][4];
#pragma unroll
    for (int i = 0; i < S_PER_WARP; i++) {
        const int tile = warp + WARPS * i;
        const int mt = tile / (TILE_V / 8), nt = tile % (TILE_V / 8);
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int d = mt * 16 + g + (c >= 2 ? 8 : 0), e = nt * 8 + 2 * t4 + (c & 1);
            float x = 0.0f;
            if (HAS_INITIAL && slot >= 0 && tile < S_TILES)
                x = reinterpret_cast<const float *>(p.s0.ptr)[slot * p.s0.s0 + h * p.s0.s1 + d * p.s0.s2 + (e0 + e) * p.s0.s3];
            S[i][c] = x;
        }
    }

    for (long long c0 = begin; c0 < end; c0 += BLOCK) {
        const int L = (int)min((long long)BLOCK, end - c0);
        // The previous chunk's readers of the staging buffers are done; write the 16-bit state.
        __syncthreads();
#pragma unroll
        for (int i = 0; i < S_PER_WARP; i++) {
            const int tile = warp + WARPS * i;
            if (tile >= S_TILES)
                continue;
            const int mt = tile / (TILE_V / 8), nt = tile % (TILE_V / 8);
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int d = mt * 16 + g + (c >= 2 ? 8 : 0), e = nt * 8 + 2 * t4 + (c & 1);
                sm.st[e * STS + d] = bits_of(S[i][c]);
            }
        }
        // Stage Q, K (and K transposed, weighted) and V transposed; rows past L are zero.
        for (int idx = tid; idx < BLOCK * (D / 8); idx += THREADS) {
            const int j = idx / (D / 8), c8 = (idx % (D / 8)) * 8;
            lj_vec16 qv = {0, 0, 0, 0}, kv = {0, 0, 0, 0};
            if (j < L) {
                qv = lj_load16(q + (c0 + j) * p.q.s2 + c8);
                kv = lj_load16(k + (c0 + j) * p.k.s2 + c8);
            }
            lj_store16(&sm.q[j * QS + c8], qv);
            lj_store16(&sm.k[j * QS + c8], kv);
            const float w = j < L ? sm.pw[L - 1 - j] : 0.0f;
            const unsigned kw[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
            for (int x = 0; x < 8; x++) {
                elem_t ke;
                ke.bits = (unsigned short)(kw[x >> 1] >> ((x & 1) * 16));
                sm.kt[(c8 + x) * KTS + j] = DECAY ? bits_of(lj_to_float(ke) * w) : ke.bits;
            }
        }
        for (int idx = tid; idx < BLOCK * (TILE_V / 8); idx += THREADS) {
            const int j = idx / (TILE_V / 8), c8 = (idx % (TILE_V / 8)) * 8;
            lj_vec16 vv = {0, 0, 0, 0};
            if (j < L)
                vv = lj_load16(v + (c0 + j) * p.v.s2 + c8);
            const unsigned vw[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
            for (int x = 0; x < 8; x++)
                sm.vt[(c8 + x) * VTS + j] = (unsigned short)(vw[x >> 1] >> ((x & 1) * 16));
        }
        __syncthreads();

        // O = diag(λ^{i+1}) Q S first (the 16-bit state copy as B operand), so the intra-chunk
        // product can accumulate into the same registers.
        const int r0 = warp * 16;
        float O[TILE_V / 8][4];
#pragma unroll
        for (int nt = 0; nt < TILE_V / 8; nt++)
            O[nt][0] = O[nt][1] = O[nt][2] = O[nt][3] = 0.0f;
#pragma unroll 2
        for (int kk = 0; kk < D; kk += 16) {
            unsigned a[4];
            a[0] = lj_ld2(&sm.q[(r0 + g) * QS + kk + 2 * t4]);
            a[1] = lj_ld2(&sm.q[(r0 + g + 8) * QS + kk + 2 * t4]);
            a[2] = lj_ld2(&sm.q[(r0 + g) * QS + kk + 8 + 2 * t4]);
            a[3] = lj_ld2(&sm.q[(r0 + g + 8) * QS + kk + 8 + 2 * t4]);
#pragma unroll
            for (int nt = 0; nt < TILE_V / 8; nt++) {
                const unsigned b0 = lj_ld2(&sm.st[(nt * 8 + g) * STS + kk + 2 * t4]);
                const unsigned b1 = lj_ld2(&sm.st[(nt * 8 + g) * STS + kk + 8 + 2 * t4]);
                lj_mma<elem_t>::run(O[nt], a, b0, b1);
            }
        }
        if (DECAY) {
            const float w0 = sm.pw[r0 + g + 1], w1 = sm.pw[r0 + g + 9];
#pragma unroll
            for (int nt = 0; nt < TILE_V / 8; nt++) {
                O[nt][0] *= w0;
                O[nt][1] *= w0;
                O[nt][2] *= w1;
                O[nt][3] *= w1;
            }
        }

        // A = Q Kᵀ for rows 16w.., all BLOCK columns, then the decay mask.
        float A[BLOCK / 8][4];
#pragma unroll
        for (int nt = 0; nt < BLOCK / 8; nt++)
            A[nt][0] = A[nt][1] = A[nt][2] = A[nt][3] = 0.0f;
#pragma unroll 2
        for (int kk = 0; kk < D; kk += 16) {
            unsigned a[4];
            a[0] = lj_ld2(&sm.q[(r0 + g) * QS + kk + 2 * t4]);
            a[1] = lj_ld2(&sm.q[(r0 + g + 8) * QS + kk + 2 * t4]);
            a[2] = lj_ld2(&sm.q[(r0 + g) * QS + kk + 8 + 2 * t4]);
            a[3] = lj_ld2(&sm.q[(r0 + g + 8) * QS + kk + 8 + 2 * t4]);
#pragma unroll
            for (int nt = 0; nt < BLOCK / 8; nt++) {
                const unsigned b0 = lj_ld2(&sm.k[(nt * 8 + g) * QS + kk + 2 * t4]);
                const unsigned b1 = lj_ld2(&sm.k[(nt * 8 + g) * QS + kk + 8 + 2 * t4]);
                lj_mma<elem_t>::run(A[nt], a, b0, b1);
            }
        }
#pragma unroll
        for (int nt = 0; nt < BLOCK / 8; nt++) {
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int i = r0 + g + (c >= 2 ? 8 : 0), j = nt * 8 + 2 * t4 + (c & 1);
                A[nt][c] = j > i ? 0.0f : (DECAY ? A[nt][c] * sm.pw[i - j] : A[nt][c]);
            }
        }

        // O += A V, A (rounded to 16 bits) as the register operand.
#pragma unroll
        for (int kk = 0; kk < BLOCK; kk += 16) {
            unsigned a[4];
            a[0] = lj_pack2<elem_t>(A[kk / 8][0], A[kk / 8][1]);
            a[1] = lj_pack2<elem_t>(A[kk / 8][2], A[kk / 8][3]);
            a[2] = lj_pack2<elem_t>(A[kk / 8 + 1][0], A[kk / 8 + 1][1]);
            a[3] = lj_pack2<elem_t>(A[kk / 8 + 1][2], A[kk / 8 + 1][3]);
#pragma unroll
            for (int nt = 0; nt < TILE_V / 8; nt++) {
                const unsigned b0 = lj_ld2(&sm.vt[(nt * 8 + g) * VTS + kk + 2 * t4]);
                const unsigned b1 = lj_ld2(&sm.vt[(nt * 8 + g) * VTS + kk + 8 + 2 * t4]);
                lj_mma<elem_t>::run(O[nt], a, b0, b1);
            }
        }
        // o_i = σ O_i for the rows of this chunk.
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int i = r0 + g + 8 * half;
            if (i >= L)
                continue;
            elem_t *orow = o + (c0 + i) * p.o.s2;
#pragma unroll
            for (int nt = 0; nt < TILE_V / 8; nt++) {
                const float x0 = p.scale * O[nt][2 * half], x1 = p.scale * O[nt][2 * half + 1];
                const unsigned packed = (unsigned)bits_of(x0) | ((unsigned)bits_of(x1) << 16);
                *reinterpret_cast<unsigned *>(orow + nt * 8 + 2 * t4) = packed;
            }
        }

        // S ← λ^L S + Ktᵀ-weighted V: tiles (mt, nt), A from Kt rows d, B from Vt rows e.
        const float decay_L = DECAY ? sm.pw[L] : 1.0f;
#pragma unroll
        for (int i = 0; i < S_PER_WARP; i++) {
            const int tile = warp + WARPS * i;
            if (tile >= S_TILES)
                continue;
            const int mt = tile / (TILE_V / 8), nt = tile % (TILE_V / 8);
            if (DECAY)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    S[i][c] *= decay_L;
#pragma unroll
            for (int kk = 0; kk < BLOCK; kk += 16) {
                unsigned a[4];
                a[0] = lj_ld2(&sm.kt[(mt * 16 + g) * KTS + kk + 2 * t4]);
                a[1] = lj_ld2(&sm.kt[(mt * 16 + g + 8) * KTS + kk + 2 * t4]);
                a[2] = lj_ld2(&sm.kt[(mt * 16 + g) * KTS + kk + 8 + 2 * t4]);
                a[3] = lj_ld2(&sm.kt[(mt * 16 + g + 8) * KTS + kk + 8 + 2 * t4]);
                const unsigned b0 = lj_ld2(&sm.vt[(nt * 8 + g) * VTS + kk + 2 * t4]);
                const unsigned b1 = lj_ld2(&sm.vt[(nt * 8 + g) * VTS + kk + 8 + 2 * t4]);
                lj_mma<elem_t>::run(S[i], a, b0, b1);
            }
        }
    }

    if (HAS_FINAL && slot >= 0) {
        // Every CTA has read its S_0 slice at the start: writing S_N over it (in place) is safe.
#pragma unroll
        for (int i = 0; i < S_PER_WARP; i++) {
            const int tile = warp + WARPS * i;
            if (tile >= S_TILES)
                continue;
            const int mt = tile / (TILE_V / 8), nt = tile % (TILE_V / 8);
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int d = mt * 16 + g + (c >= 2 ? 8 : 0), e = nt * 8 + 2 * t4 + (c & 1);
                reinterpret_cast<float *>(p.sn.ptr)[slot * p.sn.s0 + h * p.sn.s1 + d * p.sn.s2 + (e0 + e) * p.sn.s3] = S[i][c];
            }
        }
    }
}
