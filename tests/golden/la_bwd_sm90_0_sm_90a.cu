#line 1 "la_fwd_sm90/fwd.cu"
// fwd.cu (la_fwd_sm90) — chunked Lightning Attention forward on Hopper's warpgroup tensor cores
// (wgmma), sm_90a, f16/bf16.
//
// The same algorithm and mathematics as la_fwd/fwd.cu (DESIGN.md, "The same in chunks"): one CTA
// per (E slice of WGS·TILE_V columns, head, sequence) walks the sequence in chunks of 64 tokens
// with the fp32 state slice S (D x TILE_V per warpgroup) in registers for the whole sequence:
//     o_i = σ [ λ^{i+1} q_i S + Σ_{j≤i} λ^{i−j} (q_i·k_j) v_j ]
//     S  ← λ^L S + Σ_j k_jᵀ (λ^{L−1−j} v_j)
// What differs is how the products run. The CTA is WGS warpgroups (4 warps each) side by side in
// E: they share the chunk's Q and K tiles (loaded once) and each owns TILE_V columns of V, the
// state and the output. Per chunk a warpgroup issues four asynchronous wgmma products whose
// operands the tensor cores read straight from shared memory, so no warp spends instructions on
// operand fragments (the cost that bounds la_fwd's mma.sync path, docs/notes/la_fwd.md):
//     Sc = Q Kᵀ         (64 x 64, k = D)   A = Q, B = K, both K-major
//     O  = Q S₁₆        (64 x TILE_V)      B = the 16-bit state copy, MN-major
//     S += Kᵀ V_w       (D x TILE_V, k=64) A = K read transposed (MN-major), B = V_w
//     O  = diag(λ^{i+1}) O + P V           A = P from registers (masked, decayed Sc), B = V
// Shared tiles are stored in the layout wgmma reads: column blocks of BW elements (64, 32 or 16:
// the widest dividing the row) whose rows are the swizzle width apart, 16-byte chunks permuted
// by the row (the 128/64/32-byte swizzle), which also keeps the cp.async stores and the state
// copy's stores free of bank conflicts. One physical tile serves both majors: the swizzle is a
// function of the address alone.
//
// Loads are cp.async, STAGES chunks in flight, issued by all the CTA's threads (the address
// arithmetic is per thread and constant across chunks). V_w (the values weighted by λ^{L−1−j},
// rounded once to the 16-bit type as la_fwd does) is a second copy made from V in shared memory
// each chunk, each warpgroup weighting its own columns. Ragged chunks are zero-filled by
// cp.async, so padding rows add nothing. The state copy and the outputs leave the registers by
// stmatrix; the outputs go through the warpgroup's part of the V_w buffer (free by then) so that
// global memory sees whole 16-byte pieces of rows. Most of these choices cut instructions: v2 of
// this kernel issued ~1,600 per warp and chunk, most of them address arithmetic (ncu,
// docs/notes/la_fwd.md).
//
// REVERSE and GRAD_STATE mean what they mean in la_fwd/fwd.cu: the backward's reversed scans,
// which la_bwd_sm90 runs on this kernel (its dv and dk passes).
//
// STATE_ONLY: only S_N (from S_0 or zero: the local state of a span, issue 16's building block):
// the walk without outputs below, q and o untouched. With REVERSE and GRAD_STATE, the dv pass
// without dv: dS_0 alone (a span's local gradient state).
//
// SPLIT > 1: each sequence is cut into up to SPLIT segments walked by different CTAs at once
// (common/split.cuh): a CTA first walks its segment without outputs (K and V only, the state
// update only) to form the segment's local state, passes the state on to the next segment's CTA
// through the workspace, and walks the segment again from its incoming state with outputs. For
// B·H too small to fill the GPU with whole sequences (docs/notes/split.md).
//
// DS: the backward's dq pass (q ← dO, k ← v, v ← k, state Sᵀ) that also computes the decay
// gradient, ds_h = −λ [σ Σ_t x_t Y_t dO_tᵀ + ⟨dS_N, Y_{N−1}⟩] with Y_t = λ Y_{t−1} + S_{t−1} (Y
// transposed here like S, x the op's q; la_bwd/ds.cu derives it). In chunks, for row i of a chunk
// of L rows entered with S and Y:
//     Z_i = λ^{i+1} dO_i Yᵀ + (i+1) λ^i dO_i Sᵀ + Σ_{j<i} (i−j) λ^{i−1−j} (dO_i·v_j) k_j
//     Y  ← λ^L Y + L λ^{L−1} S + Σ_j (L−1−j) λ^{L−2−j} v_jᵀ k_j
// and the sum takes x_i·Z_i. These are the forward's four products again with other weights: a
// second state Y (registers, and a 16-bit copy for dO Yᵀ), a second weighted copy of the values
// for its update, a second register operand P' (the scores with the (i−j)λ^{i−1−j} mask) for
// the intra-chunk term, and the x tile: two more products per chunk and one more input read,
// instead of a separate walk. Each CTA sums its share over its column slice (the d of x, k)
// and writes it to the workspace; the last CTA to finish (an integer ticket) adds the shares in
// a fixed order, as la_bwd/ds.cu does: the same bits on every run.
#include "common/la_params.h"
#include "common/types.cuh"
#include "common/seq.cuh"
#include "common/mma.cuh"
#include "common/wgmma.cuh"
#include "common/ds_share.cuh"
#include "common/split.cuh"

using T = lj_bf16;
constexpr int D = 128;             // key width: 64, 128, 192 or 256 (one wgmma M block per 64 rows of S)
constexpr int E = 128;             // value width
constexpr int BLOCK = 64;     // tokens per chunk = wgmma M of the output (64)
constexpr int TILE_V = 32;   // value columns per warpgroup
constexpr int WGS = 2;         // warpgroups per CTA, side by side in E, sharing the Q/K tiles
constexpr int STAGES = 3;   // chunks in flight in the cp.async ring
constexpr bool PREFETCH = 1 != 0; // Q Kᵀ of chunk c + 1 issued during chunk c's tail
constexpr bool SPLIT_QK = 1 != 0; // the two warpgroups each compute half of Q Kᵀ
constexpr bool DECAY = true;
constexpr bool HAS_INITIAL = true;
constexpr bool HAS_FINAL = false;
constexpr bool VARLEN = false;
constexpr bool REVERSE = false;
constexpr bool GRAD_STATE = false;
constexpr bool STATE_ONLY = false; // the final state only (a span's local state): no q, no o
constexpr bool DS = true;                 // also the decay gradient (the backward's dq pass)
constexpr bool HAS_DSN = true;       // DS: dS_N given (the last term of ds)
constexpr int SPLIT = 1;     // segments per sequence, each walked by its own CTAs (1: whole)
constexpr int SEG_MIN = 1024; // SPLIT: no segment shorter than this (short sequences stay whole)
constexpr unsigned long long WS_PER = 0ull;       // SPLIT: state bytes per (sequence, head)
constexpr unsigned long long FLAGS_PER = 0ull; // SPLIT: flag bytes per (sequence, head)
constexpr unsigned SMEM = 230660;  // dynamic shared memory the launch provides (family.lua's smem())

constexpr int NT = 128 * WGS;           // threads of the CTA
constexpr int VW = WGS * TILE_V;        // value columns per CTA
constexpr int MB = D / 64;              // m64 blocks of the state
constexpr int NACC = TILE_V / 2;        // fp32 accumulators per thread of an m64 x TILE_V product
constexpr int SCN = SPLIT_QK ? BLOCK / 2 : BLOCK; // score columns a warpgroup computes
constexpr int NSC = SCN / 2;            // ... and its fp32 accumulators per thread
constexpr int P_BUFS = PREFETCH ? 2 : 1; // P tiles in shared memory (SPLIT_QK)

static_assert(BLOCK == 64, "one warpgroup: 64 output rows per chunk");
static_assert(D % 64 == 0 && D <= 256, "D");
static_assert(TILE_V % 16 == 0 && TILE_V <= 256 && E % TILE_V == 0, "TILE_V"); // x4 stmatrix: 16 columns
static_assert(STAGES >= 2, "ring");
static_assert(WGS == 1 || WGS == 2, "WGS");
static_assert(!SPLIT_QK || WGS == 2, "SPLIT_QK shares the scores between two warpgroups");
static_assert(!DS || (DECAY && !REVERSE && !GRAD_STATE), "DS: the forward dq pass with decay");
static_assert(!DS || SPLIT == 1, "DS walks whole sequences (its second state is not chained)");
static_assert(!STATE_ONLY || (HAS_FINAL && !DS && REVERSE == GRAD_STATE), "STATE_ONLY: S_N, or the dv pass's dS_0");
static_assert(SPLIT >= 1 && SPLIT <= 128 && SEG_MIN % BLOCK == 0, "SPLIT");

// Swizzled tile geometry: column blocks of BW elements, rows SW bytes apart.
constexpr int BWQ = 64, SWQ = 128;                         // Q and K (D % 64 == 0)
constexpr int BWV = lj_swz_block(TILE_V), SWV = 2 * BWV; // V, V_w and the state copy
constexpr unsigned Q_BYTES = BLOCK * D * 2;                // one chunk of Q (or K)
constexpr unsigned V_BYTES = BLOCK * VW * 2;               // one chunk of V (all the CTA's columns)
constexpr unsigned S_BYTES = D * TILE_V * 2;               // one warpgroup's state copy
constexpr unsigned P_BYTES = BLOCK * BLOCK * 2;            // one chunk's masked scores P (SPLIT_QK)
// A warpgroup's columns of a V tile start this many bytes into it (whole column blocks).
constexpr unsigned V_SLICE = (TILE_V / BWV) * (BLOCK * SWV);
// DS's tiles: the x ring (the CTA's columns, laid out like V), Y's weighted values, Y's copies
// and with SPLIT_QK the tiles of P' beside P's.
constexpr unsigned DS_BYTES = DS ? STAGES * V_BYTES + V_BYTES + WGS * S_BYTES + (SPLIT_QK ? P_BUFS * P_BYTES : 0) : 0;
// The kernel's layout (below): 1 KiB of slack to align the tiles, the Q, K, V ring, V_w, the
// state copies, SPLIT_QK's P tiles, DS's tiles and λ^k; it must fit what the launch provides.
static_assert(1024 + STAGES * (2 * Q_BYTES + V_BYTES) + V_BYTES + WGS * S_BYTES + (SPLIT_QK ? P_BUFS * P_BYTES : 0) +
                      DS_BYTES + (BLOCK + 1) * sizeof(float) <= SMEM,
              "shared memory: the layout exceeds the spec's SMEM");

#line 131 "la_fwd_sm90/fwd.cu"
// m64n64k16, A and B from shared memory: d (+)= A·B. TA/TB: 1 = MN-major (transposed).
template <int TA, int TB>
__device__ __forceinline__ void wg_ss64(float (&d)[32], unsigned long long da, unsigned long long db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, %35, %36;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
}
// The same with the accumulator overwritten (d = A·B): write-only operands, so the compiler never
// has to give d a value before the product (a value it may take from other registers in flight).
template <int TA, int TB>
__device__ __forceinline__ void wg_ss64_z(float (&d)[32], unsigned long long da, unsigned long long db)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, %34, %35;\n}\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
                 : "l"(da), "l"(db), "n"(TA), "n"(TB));
}
// m64n64k16, A from registers (four 32-bit registers per thread), B from shared memory.
template <int TB>
__device__ __forceinline__ void wg_rs64(float (&d)[32], const unsigned (&a)[4], unsigned long long db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
}
// m64n32k16, A and B from shared memory: d (+)= A·B. TA/TB: 1 = MN-major (transposed).
template <int TA, int TB>
__device__ __forceinline__ void wg_ss32(float (&d)[16], unsigned long long da, unsigned long long db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "%16, %17, p, 1, 1, %19, %20;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
}
// The same with the accumulator overwritten (d = A·B): write-only operands, so the compiler never
// has to give d a value before the product (a value it may take from other registers in flight).
template <int TA, int TB>
__device__ __forceinline__ void wg_ss32_z(float (&d)[16], unsigned long long da, unsigned long long db)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "%16, %17, p, 1, 1, %18, %19;\n}\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15])
                 : "l"(da), "l"(db), "n"(TA), "n"(TB));
}
// m64n32k16, A from registers (four 32-bit registers per thread), B from shared memory.
template <int TB>
__device__ __forceinline__ void wg_rs32(float (&d)[16], const unsigned (&a)[4], unsigned long long db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "{%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
}

// One chunk of a sequence tensor into its swizzled tile (common/wgmma.cuh's lj_load_tile, with
// this kernel's element type, chunk and thread count).
template <int W, int BW>
__device__ __forceinline__ void load_tile(unsigned dst, const T *src, long long rs, int valid, int tid)
{
    lj_load_tile<T, BLOCK, NT, W, BW>(dst, src, rs, valid, tid);
}

extern "C" __global__ void __launch_bounds__(NT, 1) la_fwd_sm90(const __grid_constant__ la_params p)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // Tiles start on 1024-byte boundaries (the 128-byte swizzle's period); the launch asks for
    // 1 KiB of slack.
    const unsigned base = (lj_smem_addr(smem_raw) + 1023u) & ~1023u;
    const unsigned sQ = base;
    const unsigned sK = sQ + STAGES * Q_BYTES;
    const unsigned sV = sK + STAGES * Q_BYTES;
    const unsigned sVw = sV + STAGES * V_BYTES;
    const unsigned sS0 = sVw + V_BYTES;
    const unsigned sP = sS0 + WGS * S_BYTES; // SPLIT_QK: P_BUFS tiles of P (64 x 64, K-major A of P V)
    const unsigned sX = sP + (SPLIT_QK ? P_BUFS * P_BYTES : 0); // DS: the x ring,
    const unsigned sVy = sX + (DS ? STAGES * V_BYTES : 0);      // Y's weighted values,
    const unsigned sY0 = sVy + (DS ? V_BYTES : 0);              // Y's 16-bit copies,
    const unsigned sPz = sY0 + (DS ? WGS * S_BYTES : 0);         // SPLIT_QK: P' tiles
    float *sPow = reinterpret_cast<float *>(smem_raw + (sP + (SPLIT_QK ? P_BUFS * P_BYTES : 0) + DS_BYTES - lj_smem_addr(smem_raw))); // λ^k, k = 0..BLOCK

    // tid spans the CTA (loads, V_w); wg, warp, g and t4 place a thread in its warpgroup's
    // products, which cover columns e0 .. e0 + TILE_V of this CTA's VW.
    const int tid = threadIdx.x, lane = tid & 31, wg = WGS == 1 ? 0 : tid >> 7, warp = (tid >> 5) & 3;
    const int wtid = tid & 127; // the thread within its warpgroup
    const int g = lane >> 2, t4 = lane & 3;
    // This CTA's column slice, head and sequence (and with SPLIT its segment j, by arrival).
    int sl = blockIdx.x, h = blockIdx.y, b = blockIdx.z, j = 0;
    unsigned epoch = 0;
    if constexpr (SPLIT > 1) lj_split_claim<SPLIT>(p.splitws, j, sl, h, b, epoch);
    const int ec = sl * VW, e0 = ec + wg * TILE_V;
    const unsigned sS = sS0 + wg * S_BYTES; // this warpgroup's state copy
    const unsigned sY = sY0 + wg * S_BYTES; // DS: ... and its copy of Y

    const lj_seq seq = lj_seq_of<VARLEN, REVERSE>(p.cu_seqlens, p.slots, p.N, b);
    const int slot = seq.slot;
    const long long dir = REVERSE ? -1 : 1;
    // The segment: n tokens from tok0 in walk order; the first reads S_0, the last writes S_N.
    int seg_len = seq.n, nseg = 1;
    if constexpr (SPLIT > 1) {
        lj_split_segments<SPLIT, SEG_MIN, BLOCK>(seq.n, seg_len, nseg);
        if (j >= nseg) { // the sequence has fewer segments
            lj_split_done(p.splitws);
            return;
        }
    }
    const bool first = j == 0, last = j == nseg - 1;
    const int n = SPLIT > 1 ? min(seg_len, seq.n - j * seg_len) : seq.n;
    const long long tok0 = seq.tok0 + dir * j * (long long)seg_len;
    const T *q = reinterpret_cast<const T *>(p.q.ptr) + seq.bq * p.q.s0 + h * p.q.s1 + tok0 * p.q.s2;
    const T *k = reinterpret_cast<const T *>(p.k.ptr) + seq.bq * p.k.s0 + h * p.k.s1 + tok0 * p.k.s2;
    const T *v = reinterpret_cast<const T *>(p.v.ptr) + seq.bq * p.v.s0 + h * p.v.s1 + tok0 * p.v.s2 + ec;
    T *o = reinterpret_cast<T *>(p.o.ptr) + seq.bq * p.o.s0 + h * p.o.s1 + tok0 * p.o.s2 + e0;
    const long long qs = dir * p.q.s2, ks = dir * p.k.s2, vs = dir * p.v.s2, os = dir * p.o.s2;
    const T *xq = DS ? reinterpret_cast<const T *>(p.x.ptr) + seq.bq * p.x.s0 + h * p.x.s1 + tok0 * p.x.s2 + ec : nullptr;
    const long long xs = p.x.s2;
    const int nchunks = (n + BLOCK - 1) / BLOCK;
    // The output pieces this thread stores: row o_r0 (+ O_RSTEP per pass), columns o_cx .. + 7.
    constexpr int O_PV = TILE_V / 8, O_RSTEP = 128 / O_PV;
    static_assert(O_RSTEP % 8 == 0 && BLOCK % O_RSTEP == 0, "output pieces");
    const int o_r0 = wtid / O_PV, o_cx = (wtid % O_PV) * 8;
    T *const o_thr = o + o_r0 * os + o_cx;
    const long long o_step = O_RSTEP * os;
    const unsigned o_soff = lj_tile_off<BWV, BLOCK>(o_r0, o_cx);

    // A walk without outputs (SPLIT's first walk, OUT = false) loads K and V only.
    auto load_chunk = [&](int c, auto out_tag) {
        constexpr bool OUT = decltype(out_tag)::value;
        const int st = c % STAGES;
        const long long t0 = (long long)c * BLOCK;
        const int valid = n - c * BLOCK;
        if constexpr (OUT) load_tile<D, BWQ>(sQ + st * Q_BYTES, q + t0 * qs, qs, valid, tid);
        load_tile<D, BWQ>(sK + st * Q_BYTES, k + t0 * ks, ks, valid, tid);
        load_tile<VW, BWV>(sV + st * V_BYTES, v + t0 * vs, vs, valid, tid);
        if constexpr (DS) load_tile<VW, BWV>(sX + st * V_BYTES, xq + t0 * xs, xs, valid, tid);
    };
    // The ring's first STAGES − 1 chunks of a walk: for a whole sequence issued here, before the
    // tables below, so the loads are in flight while they are formed.
    auto prologue = [&](auto out_tag) {
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) {
            if (s < nchunks) load_chunk(s, out_tag);
            lj_cp_async_commit();
        }
    };
    if constexpr (SPLIT == 1) prologue(lj_bool<!STATE_ONLY>{});

    // λ^k for k = 0..BLOCK, and this thread's fixed factors: the causal decay mask of its score
    // entries (rows i = 16·warp + g (+8), columns j = jb + 8·nt + 2·t4 (+1), jb the first of the
    // warpgroup's score columns) and λ^{i+1} of its rows.
    if constexpr (DECAY) {
        const float sh = reinterpret_cast<const float *>(p.decay)[h];
        for (int i = tid; i <= BLOCK; i += NT) sPow[i] = expf(-sh * (float)i);
    }
    __syncthreads();
    // σ rides on the mask (the intra-chunk term) and on λ^{i+1} (the inter-chunk term).
    const float sigma = p.scale;
    const int i0 = 16 * warp + g, i1 = i0 + 8, jb = SPLIT_QK ? wg * SCN : 0;
    // DS keeps P′'s mask in registers too (below): both are the same in every chunk.
    float mask[NSC];
#pragma unroll
    for (int nt = 0; nt < SCN / 8; nt++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int i = (r & 2) ? i1 : i0, j = jb + nt * 8 + 2 * t4 + (r & 1);
            mask[nt * 4 + r] = j <= i ? (DECAY ? sPow[i - j] : 1.f) * sigma : 0.f;
        }
    // DS: the mask of P', (i−j) λ^{i−1−j} for j < i, of score register x (formed once, as the
    // mask: forming both from λ^k's table per chunk cost ~320 instructions a warp and chunk).
    float maskz[DS ? NSC : 1];
#pragma unroll
    for (int x = 0; x < (DS ? NSC : 0); x++) {
        const int i = (x & 2) ? i1 : i0, j = jb + (x >> 2) * 8 + 2 * t4 + (x & 1);
        maskz[x] = j < i ? (float)(i - j) * sPow[max(i - 1 - j, 0)] : 0.f;
    }
    auto mask_z = [&](int x) -> float { return maskz[x]; };
    auto mask_at = [&](int x) -> float { return mask[x]; };
    const float rf0 = (DECAY ? sPow[i0 + 1] : 1.f) * sigma, rf1 = (DECAY ? sPow[i1 + 1] : 1.f) * sigma;

    // The state slice: st[mb][j*4 + r] is row d = 64 mb + 16 warp + g + 8 (r >> 1), column
    // e = 8 j + 2 t4 + (r & 1) of the D x TILE_V slice (the m64 accumulator layout).
    float st[MB][NACC];
#pragma unroll
    for (int mb = 0; mb < MB; mb++)
#pragma unroll
        for (int x = 0; x < NACC; x++) st[mb][x] = 0.f;
    // Row d and column e of state register x of block mb (the layout above).
    auto st_row = [&](int mb, int x) { return 64 * mb + 16 * warp + g + 8 * ((x & 3) >> 1); };
    auto st_col = [&](int x) { return e0 + 8 * (x >> 2) + 2 * t4 + (x & 1); };
    // Element x of block mb of S_0 (0 when none). Its storage (float, or 16-bit read into fp32)
    // and its slot: GRAD_STATE reads dS_N, which belongs to the final state's slot
    // (common/seq.cuh: slot_out), the forward S_0.
    const int rslot = GRAD_STATE ? seq.slot_out : slot;
    auto initial_at = [&](int mb, int x) -> float {
        if constexpr (HAS_INITIAL) {
            using ST0 = float;
            if (rslot >= 0) {
                const ST0 *s0 = reinterpret_cast<const ST0 *>(p.s0.ptr) + (long long)rslot * p.s0.s0 + h * p.s0.s1;
                const int d = st_row(mb, x);
                const int e = st_col(x);
                return (GRAD_STATE ? 1.f / p.scale : 1.f) * lj_state_load(s0 + d * p.s0.s2 + e * p.s0.s3);
            }
        }
        return 0.f;
    };
    if constexpr (HAS_INITIAL && SPLIT == 1) {
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
#pragma unroll
            for (int x = 0; x < NACC; x++) st[mb][x] = initial_at(mb, x);
    }
    // DS: Y (the same layout as st; zero before the first token) and this thread's share of ds.
    // (Declared whole either way: `if constexpr` discards nothing outside a template, so the code
    // that uses them must compile; unused, they cost no registers.)
    float yt[MB][NACC];
    float ds_acc = 0.f;
    if constexpr (DS) {
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
#pragma unroll
            for (int x2 = 0; x2 < NACC; x2++) yt[mb][x2] = 0.f;
    }
    // DS: Y entering chunk c is a decayed sum of the states before it, |Y| ≤ Σ_{k<t0} λ^k max|S|
    // (t0 = c·BLOCK), which in fp16 would overflow long before S does (at s = 0 it is t0 times
    // S). Its 16-bit copy is scaled by 2^−ye, ye the exponent of that sum, so it stays in S's
    // range; the power of two is exact, and Q Y₁₆ is scaled back by 2^ye.
    int ye = 0;
    const float ds_s = DS ? reinterpret_cast<const float *>(p.decay)[h] : 0.f;
    auto y_exponent = [&](int c) {
        const float t0 = (float)c * BLOCK;
        const float bound = ds_s > 0.f ? expm1f(-ds_s * t0) / expm1f(-ds_s) : t0;
        int e = 0;
        frexpf(fmaxf(bound, 1.f), &e);
        return e;
    };
    // The 16-bit state copy (before chunk c): rows d, columns e, MN-major B of Q S (and DS's copy
    // of Y).
    auto state_to_smem = [&](int c) {
#pragma unroll
        for (int mb = 0; mb < MB; mb++) lj_stmatrix_acc<T, BWV, D, TILE_V>(sS, st[mb], 64 * mb + 16 * warp, 1.f, lane);
        if constexpr (DS) {
            ye = y_exponent(c);
            const float f = ldexpf(1.f, -ye);
#pragma unroll
            for (int mb = 0; mb < MB; mb++) lj_stmatrix_acc<T, BWV, D, TILE_V>(sY, yt[mb], 64 * mb + 16 * warp, f, lane);
        }
        lj_fence_async_smem();
    };
    // Before chunk c's products the register state is decayed by λ^L (λ^{L−1} for GRAD_STATE's
    // first chunk), right after its 16-bit copy is written: the state update then only adds, and
    // no register of an accumulator in flight is touched.
    // DS: Y ← λ^L Y + L λ^{L−1} S first, from the state before its decay.
    auto decay_state = [&](int c) {
        if constexpr (DECAY) {
            if (c < nchunks) {
                if constexpr (DS) {
                    const int Lc = min(BLOCK, n - c * BLOCK);
                    const float dl = sPow[Lc], fs = (float)Lc * sPow[Lc - 1];
#pragma unroll
                    for (int mb = 0; mb < MB; mb++)
#pragma unroll
                        for (int x2 = 0; x2 < NACC; x2++) yt[mb][x2] = fmaf(dl, yt[mb][x2], fs * st[mb][x2]);
                }
                const float dl = sPow[min(BLOCK, n - c * BLOCK) - (GRAD_STATE && c == 0 && first ? 1 : 0)];
#pragma unroll
                for (int mb = 0; mb < MB; mb++)
#pragma unroll
                    for (int x = 0; x < NACC; x++) st[mb][x] *= dl;
            }
        }
    };
    // Q Kᵀ of a chunk: issued first thing in the chunk, or with PREFETCH during the previous
    // chunk's tail (its outputs and state copy), so the tensor cores have it in flight there.
    // With SPLIT_QK a warpgroup computes score columns jb .. jb + 31 only (keys jb .. of K, rows
    // a multiple of 8 into the tile, so the swizzle is unchanged).
    float sc[NSC];
    auto issue_scores = [&](int c) {
        const int slotc = c % STAGES;
        const unsigned cQ = sQ + slotc * Q_BYTES, cK = sK + slotc * Q_BYTES;
        const unsigned long long dQ = lj_wg_desc<SWQ>(cQ, 16), dK = lj_wg_desc<SWQ>(cK + jb * SWQ, 16);
        lj_wg_fence();
        wg_ss32_z<0, 0>(sc, dQ, dK);
#pragma unroll
        for (int kk = 1; kk < D / 16; kk++) {
            const unsigned off = (kk * 16 / BWQ) * (BLOCK * SWQ) + (kk * 16 % BWQ) * 2;
            wg_ss32<0, 0>(sc, lj_wg_desc_at(dQ, off), lj_wg_desc_at(dK, off), 1);
        }
        lj_wg_commit();
    };
    // SPLIT_QK: the warpgroup's half of P (masked, decayed scores, 16-bit) into chunk c's P tile,
    // where P V reads it as its A operand once both halves are there (a CTA barrier).
    auto scores_to_smem = [&](int c) {
        if constexpr (SPLIT_QK) {
            lj_fence_regs(sc);
            if constexpr (DS) {
                float z[NSC];
#pragma unroll
                for (int x = 0; x < NSC; x++) z[x] = sc[x] * mask_z(x);
                lj_stmatrix_acc<T, BWQ, BLOCK, SCN>(sPz + (c % P_BUFS) * P_BYTES, z, 16 * warp, 1.f, lane, jb);
            }
#pragma unroll
            for (int x = 0; x < NSC; x++) sc[x] *= mask_at(x);
            lj_stmatrix_acc<T, BWQ, BLOCK, SCN>(sP + (c % P_BUFS) * P_BYTES, sc, 16 * warp, 1.f, lane, jb);
            lj_fence_async_smem();
        }
    };
    // With PREFETCH the products are issued unconditionally (for an empty sequence, and for the
    // chunk after the last), so none sits in a branch: a branch around wgmma makes ptxas
    // serialise them all. Those extra products read stale shared memory; their results are unused.
    // One walk over the segment: with outputs (OUT), or (SPLIT's first walk) the state update
    // alone, from a zero state: K and V loaded, V_w formed, S += Kᵀ V_w; no scores, no Q S, no P V.
    // The ring's prologue is issued before the walk (prologue()).
    auto walk = [&](auto out_tag) {
    constexpr bool OUT = decltype(out_tag)::value;
    if constexpr (OUT) state_to_smem(0);
    decay_state(0);
    if constexpr (PREFETCH && OUT) {
        lj_cp_async_wait<STAGES - 2>();
        lj_fence_async_smem();
        __syncthreads(); // chunk 0 landed
        issue_scores(0);
        lj_wg_wait<0>();
        scores_to_smem(0);
    }

    for (int c = 0; c < nchunks; c++) {
        const int slotc = c % STAGES;
        const unsigned cQ = sQ + slotc * Q_BYTES, cK = sK + slotc * Q_BYTES, cV = sV + slotc * V_BYTES;
        const int L = min(BLOCK, n - c * BLOCK);
        const int u = GRAD_STATE && c == 0 && first ? 1 : 0;
        auto load_next = [&]() {
            const int nc = c + STAGES - 1;
            if (nc < nchunks) load_chunk(nc, out_tag);
            lj_cp_async_commit();
        };
        if constexpr (!PREFETCH || !OUT) {
            lj_cp_async_wait<STAGES - 2>();
            lj_fence_async_smem();
            __syncthreads(); // chunk c landed; chunk c − 1's products and state copy are done
            load_next();
            if constexpr (OUT) issue_scores(c);
        }

        // The values weighted for the state update, λ^{L−1−j} on row j (rows past L are zero).
        // Each warpgroup weights its own columns (so the buffer's hazards stay inside it).
        unsigned sVs = cV + wg * V_SLICE; // this warpgroup's columns of V (or V_w)
        if constexpr (DECAY) {
            constexpr int VEC = V_SLICE / 16;
#pragma unroll
            for (int i = 0; i < (VEC + 127) / 128; i++) {
                const int x = wtid + i * 128 + wg * (V_SLICE / 16);
                if (VEC % 128 == 0 || x < VEC + wg * (V_SLICE / 16)) {
                    const int row = (x * 16 % (BLOCK * SWV)) / SWV; // the swizzle stays in a row
                    const float w = sPow[max(L - 1 - row, 0)];
                    // DS: Y's weights (L−1−j) λ^{L−2−j}, zero from row L − 1 on.
                    const float wy = DS && row < L - 1 ? (float)(L - 1 - row) * sPow[max(L - 2 - row, 0)] : 0.f;
                    unsigned a0, a1, a2, a3;
                    asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(cV + x * 16));
                    unsigned wv[4] = {a0, a1, a2, a3}, yv[4];
#pragma unroll
                    for (int y = 0; y < 4; y++) {
                        T lo, hi;
                        lo.bits = (unsigned short)(wv[y] & 0xffff);
                        hi.bits = (unsigned short)(wv[y] >> 16);
                        wv[y] = lj_pack2<T>(lj_to_float(lo) * w, lj_to_float(hi) * w);
                        if constexpr (DS) yv[y] = lj_pack2<T>(lj_to_float(lo) * wy, lj_to_float(hi) * wy);
                    }
                    asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(sVw + x * 16), "r"(wv[0]),
                                 "r"(wv[1]), "r"(wv[2]), "r"(wv[3])
                                 : "memory");
                    if constexpr (DS)
                        asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(sVy + x * 16), "r"(yv[0]),
                                     "r"(yv[1]), "r"(yv[2]), "r"(yv[3])
                                     : "memory");
                }
            }
            lj_fence_async_smem();
            sVs = sVw + wg * V_SLICE;
        }
        // V_w (and with PREFETCH the state copy and SPLIT_QK's P) of every warp are written; with
        // PREFETCH every warp is also done with chunk c − 1's products, so its ring slot takes chunk
        // c + STAGES − 1.
        if constexpr (DECAY || (PREFETCH && OUT)) __syncthreads();
        if constexpr (PREFETCH && OUT) load_next();

        // O = Q S₁₆ and S ← λ^L S + Kᵀ V_w (the state was decayed by λ^L when its copy was
        // written, so the update only adds).
        // DS: Z's first term Q Y₁₆ (ya) beside Q S₁₆, and Y ← Y + Kᵀ V_y beside the state update.
        float oa[NACC], ya[NACC];
#pragma unroll
        for (int mb = 0; mb < MB; mb++) lj_fence_regs(st[mb]);
        if constexpr (DS) {
#pragma unroll
            for (int mb = 0; mb < MB; mb++) lj_fence_regs(yt[mb]);
        }
        const unsigned long long dQ = lj_wg_desc<SWQ>(cQ, 16), dS = lj_wg_desc<SWV>(sS, D * SWV);
        const unsigned long long dKt = lj_wg_desc<SWQ>(cK, BLOCK * SWQ), dVs = lj_wg_desc<SWV>(sVs, BLOCK * SWV);
        lj_wg_fence();
        if constexpr (OUT) {
        wg_ss32_z<0, 1>(oa, dQ, dS);
#pragma unroll
        for (int kk = 1; kk < D / 16; kk++) {
            const unsigned off = (kk * 16 / BWQ) * (BLOCK * SWQ) + (kk * 16 % BWQ) * 2;
            wg_ss32<0, 1>(oa, lj_wg_desc_at(dQ, off), lj_wg_desc_at(dS, kk * 16 * SWV), 1);
        }
        if constexpr (DS) {
            const unsigned long long dY = lj_wg_desc<SWV>(sY, D * SWV);
            wg_ss32_z<0, 1>(ya, dQ, dY);
#pragma unroll
            for (int kk = 1; kk < D / 16; kk++) {
                const unsigned off = (kk * 16 / BWQ) * (BLOCK * SWQ) + (kk * 16 % BWQ) * 2;
                wg_ss32<0, 1>(ya, lj_wg_desc_at(dQ, off), lj_wg_desc_at(dY, kk * 16 * SWV), 1);
            }
        }
        lj_wg_commit();
        }
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
#pragma unroll
            for (int kk = 0; kk < BLOCK / 16; kk++)
                wg_ss32<1, 1>(st[mb], lj_wg_desc_at(dKt, mb * (BLOCK * SWQ) + kk * 16 * SWQ),
                                     lj_wg_desc_at(dVs, kk * 16 * SWV), 1);
        if constexpr (DS) {
            const unsigned long long dVy = lj_wg_desc<SWV>(sVy + wg * V_SLICE, BLOCK * SWV);
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
#pragma unroll
                for (int kk = 0; kk < BLOCK / 16; kk++)
                    wg_ss32<1, 1>(yt[mb], lj_wg_desc_at(dKt, mb * (BLOCK * SWQ) + kk * 16 * SWQ),
                                         lj_wg_desc_at(dVy, kk * 16 * SWV), 1);
        }
        lj_wg_commit();
        if constexpr (!OUT) { // the state update is all a walk without outputs does
            lj_wg_wait<0>();
#pragma unroll
            for (int mb = 0; mb < MB; mb++) lj_fence_regs(st[mb]);
            decay_state(c + 1);
            continue;
        }

        // The scores (with PREFETCH retired at the end of the previous iteration): mask and decay
        // them, round to the A operand of P V. SPLIT_QK: P goes through shared memory (with
        // PREFETCH it is there already, written at the end of the previous iteration and
        // published by the barrier above).
        if constexpr (!PREFETCH) lj_wg_wait<2>();
        if constexpr (SPLIT_QK && !PREFETCH) {
            scores_to_smem(c);
            __syncthreads(); // both halves of P written
        }
        lj_fence_regs(sc);
        unsigned pa[SPLIT_QK ? 1 : BLOCK / 16][4];
#pragma unroll
        for (int kk = 0; kk < (SPLIT_QK ? 0 : BLOCK / 16); kk++) {
            pa[kk][0] = lj_pack2<T>(sc[8 * kk + 0] * mask_at(8 * kk + 0), sc[8 * kk + 1] * mask_at(8 * kk + 1));
            pa[kk][1] = lj_pack2<T>(sc[8 * kk + 2] * mask_at(8 * kk + 2), sc[8 * kk + 3] * mask_at(8 * kk + 3));
            pa[kk][2] = lj_pack2<T>(sc[8 * kk + 4] * mask_at(8 * kk + 4), sc[8 * kk + 5] * mask_at(8 * kk + 5));
            pa[kk][3] = lj_pack2<T>(sc[8 * kk + 6] * mask_at(8 * kk + 6), sc[8 * kk + 7] * mask_at(8 * kk + 7));
        }
        // DS: P' = the scores with the mask (i−j) λ^{i−1−j} (j < i), the A operand of Z's
        // intra-chunk term (its weights read from λ^k's table: no registers held across chunks).
        unsigned pz[BLOCK / 16][4];
        if constexpr (DS && !SPLIT_QK) {
#pragma unroll
            for (int kk = 0; kk < BLOCK / 16; kk++)
#pragma unroll
                for (int hh = 0; hh < 4; hh++)
                    pz[kk][hh] = lj_pack2<T>(sc[8 * kk + 2 * hh] * mask_z(8 * kk + 2 * hh),
                                             sc[8 * kk + 2 * hh + 1] * mask_z(8 * kk + 2 * hh + 1));
        }
        // Q S done: the inter-chunk term decays by λ^{i+1} (λ^i for GRAD_STATE's first chunk),
        // times σ.
        lj_wg_wait<1>();
        lj_fence_regs(oa);
        // DS: Z = λ^{i+1} Q Y₁₆ + (i+1) λ^i Q S₁₆ in ya (before o's scaling takes oa).
        if constexpr (DS) {
            lj_fence_regs(ya);
            const float y0 = ldexpf(sPow[i0 + 1], ye), y1 = ldexpf(sPow[i1 + 1], ye);
            const float z0 = (float)(i0 + 1) * sPow[i0], z1 = (float)(i1 + 1) * sPow[i1];
#pragma unroll
            for (int j = 0; j < TILE_V / 8; j++) {
                ya[4 * j] = fmaf(y0, ya[4 * j], z0 * oa[4 * j]);
                ya[4 * j + 1] = fmaf(y0, ya[4 * j + 1], z0 * oa[4 * j + 1]);
                ya[4 * j + 2] = fmaf(y1, ya[4 * j + 2], z1 * oa[4 * j + 2]);
                ya[4 * j + 3] = fmaf(y1, ya[4 * j + 3], z1 * oa[4 * j + 3]);
            }
            lj_fence_regs(ya);
        }
        {
            const float f0 = DECAY && u ? sPow[i0] * sigma : rf0, f1 = DECAY && u ? sPow[i1] * sigma : rf1;
#pragma unroll
            for (int j = 0; j < TILE_V / 8; j++) {
                oa[4 * j] *= f0;
                oa[4 * j + 1] *= f0;
                oa[4 * j + 2] *= f1;
                oa[4 * j + 3] *= f1;
            }
        }
        lj_fence_regs(oa);
        const unsigned long long dV = lj_wg_desc<SWV>(cV + wg * V_SLICE, BLOCK * SWV);
        lj_wg_fence();
        if constexpr (SPLIT_QK) {
            const unsigned long long dP = lj_wg_desc<SWQ>(sP + (c % P_BUFS) * P_BYTES, 16);
#pragma unroll
            for (int kk = 0; kk < BLOCK / 16; kk++)
                wg_ss32<0, 1>(oa, lj_wg_desc_at(dP, kk * 16 * 2), lj_wg_desc_at(dV, kk * 16 * SWV), 1);
        } else {
#pragma unroll
            for (int kk = 0; kk < BLOCK / 16; kk++)
                wg_rs32<1>(oa, pa[kk], lj_wg_desc_at(dV, kk * 16 * SWV), 1);
        }
        if constexpr (DS && SPLIT_QK) {
            const unsigned long long dPz = lj_wg_desc<SWQ>(sPz + (c % P_BUFS) * P_BYTES, 16);
#pragma unroll
            for (int kk = 0; kk < BLOCK / 16; kk++)
                wg_ss32<0, 1>(ya, lj_wg_desc_at(dPz, kk * 16 * 2), lj_wg_desc_at(dV, kk * 16 * SWV), 1);
        } else if constexpr (DS) {
#pragma unroll
            for (int kk = 0; kk < BLOCK / 16; kk++)
                wg_rs32<1>(ya, pz[kk], lj_wg_desc_at(dV, kk * 16 * SWV), 1);
        }
        lj_wg_commit();

        // With PREFETCH the next chunk's scores go in while this chunk's tail runs.
        if constexpr (PREFETCH) {
            lj_cp_async_wait<STAGES - 2>();
            lj_fence_async_smem();
            __syncthreads(); // chunk c + 1 landed
            issue_scores(c + 1);
            lj_wg_wait<1>();
        } else {
            lj_wg_wait<0>();
        }
        lj_fence_regs(oa);
#pragma unroll
        for (int mb = 0; mb < MB; mb++) lj_fence_regs(st[mb]);
        // DS: this thread's share of Σ_i x_i·Z_i, x from this chunk's tile (its ring slot is not
        // reloaded before the next chunk). Rows past L have zero dO, so zero Z.
        if constexpr (DS) {
            lj_fence_regs(ya);
#pragma unroll
            for (int mb = 0; mb < MB; mb++) lj_fence_regs(yt[mb]);
            const unsigned cX = sX + slotc * V_BYTES + wg * V_SLICE;
#pragma unroll
            for (int j = 0; j < TILE_V / 8; j++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    unsigned xv;
                    asm volatile("ld.shared.b32 %0, [%1];\n"
                                 : "=r"(xv) : "r"(cX + lj_tile_off<BWV, BLOCK>(hr ? i1 : i0, 8 * j + 2 * t4)));
                    T lo, hi;
                    lo.bits = (unsigned short)(xv & 0xffff);
                    hi.bits = (unsigned short)(xv >> 16);
                    ds_acc = fmaf(lj_to_float(lo), ya[4 * j + 2 * hr], ds_acc);
                    ds_acc = fmaf(lj_to_float(hi), ya[4 * j + 2 * hr + 1], ds_acc);
                }
        }

        // Store o (σ applied) for the rows inside the sequence: through this warpgroup's part of
        // the V_w buffer (free now: its products are done), so each thread writes whole 16-byte
        // pieces of rows instead of 4-byte pairs scattered over 16 rows. A thread keeps one piece
        // column and steps down O_RSTEP rows per pass (a multiple of 8: the swizzle repeats).
        {
            const unsigned sO = sVw + wg * V_SLICE;
            lj_stmatrix_acc<T, BWV, BLOCK, TILE_V>(sO, oa, 16 * warp, 1.f, lane);
            lj_wg_bar(wg);
            T *oc = o_thr + (long long)(c * BLOCK) * os;
#pragma unroll
            for (int i = 0; i < BLOCK / O_RSTEP; i++) {
                unsigned v0, v1, v2, v3;
                asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
                             : "r"(sO + o_soff + i * O_RSTEP * 2 * BWV));
                asm volatile("{\n.reg .pred p;\nsetp.lt.s32 p, %5, %6;\n"
                             "@p st.global.v4.b32 [%0], {%1,%2,%3,%4};\n}\n"
                             ::"l"(oc + i * o_step), "r"(v0), "r"(v1), "r"(v2), "r"(v3),
                             "r"(o_r0 + i * O_RSTEP), "r"(L)
                             : "memory");
            }
            lj_wg_bar(wg); // read before the next chunk's V_w overwrites the buffer
        }
        state_to_smem(c + 1);
        decay_state(c + 1);
        // Nothing stays in flight across the loop's back edge: ptxas cannot follow a product
        // through it and would serialise every wgmma of the loop. The next chunk's scores have
        // had this chunk's tail to finish.
        if constexpr (PREFETCH) {
            lj_wg_wait<0>();
            scores_to_smem(c + 1); // the other P tile: the other warpgroup may still read chunk c's
        }
    }
    lj_cp_async_wait<0>();
    __syncthreads(); // the ring and the tiles are free for another walk
    };

    if constexpr (SPLIT > 1) {
        // The segment's local state M_j (not needed by the last segment), published for the
        // segments after it; then S_in,j by Horner's rule over S_0 and M_0 .. M_{j−1}: λ^{len}
        // per whole segment before it (λ^{len − 1} for GRAD_STATE's first: fwd.cu's first-chunk
        // rule). The thread's pairs of adjacent columns (x, x + 1) move as float2.
        if (!last) {
            prologue(lj_bool<false>{});
            walk(lj_bool<false>{});
            float *m = lj_split_state<SPLIT, D, E>(p.splitst, WS_PER, b, p.H, h, j);
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
#pragma unroll
                for (int x = 0; x < NACC; x += 2) {
                    const int d = st_row(mb, x);
                    const int e = st_col(x);
                    __stcg(reinterpret_cast<float2 *>(m + d * E + e), make_float2(st[mb][x], st[mb][x + 1]));
                }
            lj_split_publish(lj_split_flag<SPLIT, D, E>(p.splitws, FLAGS_PER, b, p.H, h, j, ec), epoch);
            if constexpr (STATE_ONLY) { // only the last segment goes on, to S_N
                lj_split_done(p.splitws);
                return;
            }
        }
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
#pragma unroll
            for (int x = 0; x < NACC; x++) st[mb][x] = initial_at(mb, x);
        const float s_h = DECAY ? reinterpret_cast<const float *>(p.decay)[h] : 0.f;
        const float lam = DECAY ? expf(-s_h * (float)seg_len) : 1.f;
        const float lam0 = DECAY ? expf(-s_h * (float)(seg_len - (GRAD_STATE ? 1 : 0))) : 1.f;
        for (int i = 0; i < j; i++) {
            lj_split_wait(lj_split_flag<SPLIT, D, E>(p.splitws, FLAGS_PER, b, p.H, h, i, ec), epoch);
            const float *m = lj_split_state<SPLIT, D, E>(p.splitst, WS_PER, b, p.H, h, i);
            const float f = i == 0 ? lam0 : lam;
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
#pragma unroll
                for (int x = 0; x < NACC; x += 2) {
                    const int d = st_row(mb, x);
                    const int e = st_col(x);
                    const float2 mv = __ldcg(reinterpret_cast<const float2 *>(m + d * E + e));
                    st[mb][x] = fmaf(f, st[mb][x], mv.x);
                    st[mb][x + 1] = fmaf(f, st[mb][x + 1], mv.y);
                }
        }
    }
    // (STATE_ONLY: the walk without outputs, from S_in, to S_N.)
    if constexpr (SPLIT > 1) prologue(lj_bool<!STATE_ONLY>{});
    walk(lj_bool<!STATE_ONLY>{});

    // DS: the CTA's share σ Σ x·Z + ⟨dS_N, Y⟩ over its columns, added to the others' by
    // common/ds_share.cuh (fixed order, ticket, ds = −λ · sum).
    if constexpr (DS) {
        float part = sigma * ds_acc;
        if constexpr (HAS_DSN) {
            if (seq.slot_out >= 0) { // dS_N belongs to the final state's slot (common/seq.cuh)
                const float *dsn = reinterpret_cast<const float *>(p.dsn.ptr) + (long long)seq.slot_out * p.dsn.s0 + h * p.dsn.s1;
#pragma unroll
                for (int mb = 0; mb < MB; mb++)
#pragma unroll
                    for (int x2 = 0; x2 < NACC; x2++) {
                        const int d = st_row(mb, x2);
                        const int e = st_col(x2);
                        part = fmaf(dsn[d * p.dsn.s2 + e * p.dsn.s3], yt[mb][x2], part);
                    }
            }
        }
        lj_ds_share<NT>(part, p, b, h);
    }

    if constexpr (HAS_FINAL) {
        // S_N's storage and slot (a fresh sequence's: slot_out); GRAD_STATE writes dS_0, which
        // belongs to the initial state's slot (none for a fresh sequence).
        using STN = float;
        const int wslot = GRAD_STATE ? slot : seq.slot_out;
        if (wslot >= 0 && last) {
            STN *sn = reinterpret_cast<STN *>(p.sn.ptr) + (long long)wslot * p.sn.s0 + h * p.sn.s1;
            const float out = GRAD_STATE ? p.scale * (DECAY && n > 0 ? sPow[1] : 1.f) : 1.f;
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
#pragma unroll
                for (int x = 0; x < NACC; x++) {
                    const int d = st_row(mb, x);
                    const int e = st_col(x);
                    lj_state_store(sn + d * p.sn.s2 + e * p.sn.s3, out * st[mb][x]);
                }
        }
    }
    if constexpr (SPLIT > 1) lj_split_done(p.splitws);
}
