// fwd.cu (simple_gla_fwd) — the chunked linear-attention forward with a data-dependent scalar
// decay per token and head (log-gates g ≤ 0, "simple GLA"), on Hopper's wgmma, sm_90a, f16/bf16.
//
//     S_t = exp(g_t) S_{t−1} + k_tᵀ v_t,   o_t = scale · q_t S_t,   S_0 = h0 (or 0), ht = S_N
//
// It is lajit's constant-decay forward (templates/la_fwd_sm90/fwd.cu) with λ^k replaced by
// factors of the gates, and is built the same way: one CTA of WGS warpgroups (side by side in E,
// sharing the chunk's Q and K tiles) per (E slice of WGS·TILE_V columns, head, sequence) walks the
// sequence in chunks of 64 tokens with the fp32 state slice in registers; per chunk four
// asynchronous wgmma products read their operands from swizzled shared tiles:
//     Sc = Q Kᵀ,   O = Q S₁₆,   S ← exp(b_{L−1}) S + Kᵀ V_w,   O = diag(scale·exp(b_i)) O + P V
// where b_i = Σ_{t ≤ i} g_t is the gates' prefix sum inside the chunk (L its valid tokens),
// P_ij = scale · exp(b_i − b_j) · Sc_ij for j ≤ i (0 above the diagonal) and V_w row j is v_j ·
// exp(b_{L−1} − b_j). Every factor is the exponential of a difference b_later − b_earlier ≤ 0, so
// none exceeds 1 whatever the gates (no exp(b_i)·exp(−b_j) split, which overflows on strong
// decay). Exponentials are ex2 of log2-scaled sums: the gates are multiplied by log2(e) as they
// enter the scan.
//
// The gates travel in the same cp.async ring as Q, K and V (BLOCK floats per chunk, 4 bytes per
// copy, so g may have any stride: FLA's [B, N, H] layout is a strided view). Once a chunk has
// landed, every warp scans its gates itself (two per lane, five shuffles) into its own 64 floats
// of shared memory: no CTA barrier is added, and the warps read the prefix sums they need (the
// score rows and columns of their fragments, the rows of the V pieces they weight) from there.
// Rows past the end of the sequence arrive as zero gates, so b stays at b_{L−1} there and the
// last, ragged chunk needs no special case beyond the zero-filled K and V rows.
//
// HELPER: a third warpgroup (the CTA's last 128 threads) does per-chunk work that is not the
// state's or the outputs' a chunk ahead of the products' warpgroups: it issues every copy of the
// ring and scans the gates (its first warp into the chunk's shared prefix sums, two buffers by
// chunk parity), and with HELPER 1 writes V_w (two tiles by chunk parity), with HELPER 2 computes
// the chunk's scores Q Kᵀ itself (one m64n64 product), masks them and writes P into a shared
// tile (the products' warpgroups then weight their own V columns). It tells the products'
// warpgroups that a chunk is ready (named barrier READY); they tell it when they are done with a
// chunk's slot, V_w tile and sums (FREE), and it refills the slot. Why: every warp of the
// products runs a serial chain per chunk whose products finish before the warps wait for them
// (clock marks, docs/notes/families.md, session 19), so work taken off that chain is time saved:
// the copies, the scan and V_w were a third of it, the mask and the scores' issue a fifth. Which
// to move depends on how many warpgroups share the helper (family.lua's default: 1 with one, 2
// with two; the helper's own chain must stay the shorter). Without a helper every warp scans for
// itself into its own 64 floats, each warpgroup weights its own V columns and masks its scores.
//
// Arguments (family.lua's `args`, templates/common/args.cuh): q, k [B, H, N, D] and v, o
// [B, H, N, E] with any strides whose last is 1 and rows 16-byte aligned; g [B, H, N] float, any
// strides; h0, ht [B, H, D, E] float, optional (HAS_H0 / HAS_HT are baked). B and N are read from
// q at run time; H, D and E are baked.
//
// SPLIT_QK (two warpgroups) works as in la_fwd_sm90: each warpgroup computes half of Q Kᵀ (score
// columns jb .. jb + 31, jb = 32 wg) and the gate mask of those columns only (half the
// exponentials), writes its masked, 16-bit half into the chunk's P tile in shared memory, and
// after a CTA barrier both read the whole of P from there as the A operand of P V. The masking
// runs after the barrier that publishes V_w, once the state update is issued, so the tensor cores
// have Q S₁₆ and the update in flight while the warps form P; a second barrier publishes it.
// (la_fwd_sm90 writes P of chunk c + 1 at the end of chunk c's tail: its mask is fixed, here it
// needs chunk c + 1's gates.) Every warp has passed the V_w barrier when P is written, so both
// warpgroups' P V of the previous chunk is done: one P tile serves.
//
// SPLIT > 1 (few heads, long sequences): each sequence is cut into up to SPLIT segments walked by
// different CTAs at once, chained as la_fwd_sm90 chains them (common/split.cuh's protocol, in the
// family's workspace argument): a CTA first walks its segment without outputs (K, V and the gates
// only: the state update) to form the segment's local state M_j from zero and its total gate
// Γ_j = Σ g (log2 units), publishes both, then forms the state entering its segment by Horner's
// rule over S_0 and the earlier segments' (M_i, Γ_i): S_in,j = 2^Γ_{j−1} S_in,j−1 + M_{j−1}, and
// walks the segment again from it with outputs. With HELPER the helper serves both walks (the
// first without Q, scores or P), and the roles part around the walks only: every thread runs the
// split's steps, whose CTA barriers must be reached at one place. The CTA's counters are released
// (lj_split_done) once the waits are over, before the walk with outputs, so that the helper can
// leave after its last walk and keep the registers setmaxnreg moved (REBALANCE).
// The workspace (family.lua sizes it per launch):
//     bytes 0..15      ticket, finished-CTA count, epoch (common/split.cuh)
//     from byte 16     per (b, h), FLAGS_PER bytes: a flag per segment and 16 columns
//     then             per (b, h), WS_PER bytes: M[SPLIT − 1] (D·E floats each, the column slices
//                      one after another, each in the products' register order: m_slice),
//                      Γ[SPLIT − 1][E / VW]
// Zeroed when lajit allocates it; every launch leaves the counters as it found them.
//
// Left out beside la_fwd_sm90: REVERSE / GRAD_STATE (the backward's scans) and varlen. PREFETCH is
// kept (Q Kᵀ of chunk c + 1 in flight during chunk c's tail).
#include "common/args.cuh"
#include "common/types.cuh"
#include "common/mma.cuh"
#include "common/wgmma.cuh"
#include "common/la_params.h" // (split.cuh includes it by its bare name)
#include "common/split.cuh"

using T = ${ELEM};
constexpr int H = ${H};             // heads: the grid's y (h = blockIdx.y < H)
constexpr int D = ${D};             // key width: 64, 128, 192 or 256 (one wgmma M block per 64 rows of S)
constexpr int E = ${E};             // value width
constexpr int BLOCK = ${BLOCK};     // tokens per chunk = wgmma M of the output (64)
constexpr int TILE_V = ${TILE_V};   // value columns per warpgroup
constexpr int WGS = ${WGS};         // warpgroups per CTA, side by side in E, sharing the Q/K tiles
constexpr int STAGES = ${STAGES};   // chunks in flight in the cp.async ring
constexpr bool PREFETCH = ${PREFETCH} != 0; // Q Kᵀ of chunk c + 1 issued during chunk c's tail
constexpr bool SPLIT_QK = ${SPLIT_QK} != 0; // the two warpgroups each compute half of Q Kᵀ
constexpr int HELPER = ${HELPER};   // 0: none; 1: a third warpgroup loads, scans, makes V_w; 2: ... and P
constexpr bool HELPS = HELPER != 0;     // a helper warpgroup (the CTA's last 128 threads)
constexpr bool HELPER_VW = HELPER == 1; // the helper makes V_w, the products their scores and P
constexpr bool HELPER_P = HELPER == 2;  // the helper makes P, the products weight their own V
constexpr bool HAS_H0 = ${HAS_H0};
constexpr bool HAS_HT = ${HAS_HT};
// The scores masked by column factors made per warp (mask_scores; family.lua says where that pays)
// or entry by entry.
constexpr bool MASK_BY_FACTORS = ${MASK_BY_FACTORS};
constexpr int SPLIT = ${SPLIT};     // segments per sequence, each walked by its own CTAs (1: whole)
constexpr int SEG_MIN = ${SEG_MIN}; // SPLIT: no segment shorter than this
constexpr unsigned long long WS_PER = ${WS_PER}ull;       // SPLIT: state bytes per (b, h)
constexpr unsigned long long FLAGS_PER = ${FLAGS_PER}ull; // SPLIT: flag bytes per (b, h)
constexpr unsigned SMEM = ${SMEM};  // dynamic shared memory the launch provides (family.lua's smem())

constexpr int NTC = 128 * WGS;          // the threads of the warpgroups that run the products
constexpr int NT = NTC + (HELPS ? 128 : 0); // threads of the CTA (HELPS: the last 128)
constexpr int NLOAD = HELPS ? 128 : NT;    // threads that issue a chunk's copies
constexpr int VW_BUFS = HELPER_VW ? 2 : 1; // V_w tiles (HELPER_VW: chunk c + 1's is made during chunk c)
// HELPER 1 with two warpgroups of products (their scores, P and the state; with SPLIT the
// segment's bounds too): registers move from the helper to them (setmaxnreg) for the walk with
// outputs, out of the LAUNCH_REGS each thread gets at launch (the SM's 64 Ki registers over NT,
// a multiple of 8: 168 for 384 threads): HELPER_REGS for the helper, the rest shared by the
// others. Only from where the roles part for good (ptxas keeps the regions only when they do not
// meet again). With SPLIT, 168 spill 100–200 bytes otherwise; with 64 or 96 the helper spills
// (NVRTC 13.0).
constexpr bool REBALANCE = HELPER_VW && WGS == 2;
constexpr int LAUNCH_REGS = 65536 / NT / 8 * 8, HELPER_REGS = 112;
constexpr int PRODUCT_REGS = (LAUNCH_REGS * NT - HELPER_REGS * 128) / NTC / 8 * 8;
constexpr int NWARPS = NT / 32;
constexpr int VW = WGS * TILE_V;        // value columns per CTA
constexpr int MB = D / 64;              // m64 blocks of the state
constexpr int NACC = TILE_V / 2;        // fp32 accumulators per thread of an m64 x TILE_V product
constexpr bool P_TILE = SPLIT_QK || HELPER_P; // P goes through a shared tile (else registers)
constexpr int SCN = SPLIT_QK ? BLOCK / 2 : BLOCK; // score columns a warpgroup computes
constexpr int NSC = SCN / 2;            // ... and its fp32 accumulators per thread
constexpr float LOG2E = 1.4426950408889634f;

static_assert(BLOCK == 64, "one warpgroup: 64 output rows per chunk; one warp scans a chunk's gates");
static_assert(D % 64 == 0 && D <= 256, "D");
static_assert(TILE_V % 16 == 0 && TILE_V <= 256 && E % TILE_V == 0, "TILE_V"); // x4 stmatrix: 16 columns
static_assert(E % VW == 0, "WGS * TILE_V divides E");
static_assert(STAGES >= 2, "ring");
static_assert(WGS == 1 || WGS == 2, "WGS");
static_assert(!SPLIT_QK || WGS == 2, "SPLIT_QK shares the scores between two warpgroups");
static_assert(HELPER >= 0 && HELPER <= 2 && (!HELPS || (PREFETCH && STAGES >= 3)) && !(HELPER_P && SPLIT_QK),
              "HELPER: PREFETCH, and 2 without SPLIT_QK");
static_assert(SPLIT >= 1 && SPLIT <= 128 && SEG_MIN % BLOCK == 0, "SPLIT");
static_assert(WS_PER >= (unsigned long long)(SPLIT - 1) * (D * E + E / VW) * 4 && FLAGS_PER % 16 == 0,
              "SPLIT: the workspace's layout exceeds the spec's sizes");

// Swizzled tile geometry: column blocks of BW elements, rows SW bytes apart.
constexpr int BWQ = 64, SWQ = 128;                         // Q and K (D % 64 == 0)
constexpr int BWV = lj_swz_block(TILE_V), SWV = 2 * BWV; // V, V_w and the state copy
constexpr unsigned Q_BYTES = BLOCK * D * 2;                // one chunk of Q (or K)
constexpr unsigned V_BYTES = BLOCK * VW * 2;               // one chunk of V (all the CTA's columns)
constexpr unsigned S_BYTES = D * TILE_V * 2;               // one warpgroup's state copy
constexpr unsigned G_BYTES = BLOCK * 4;                    // one chunk of gates
constexpr unsigned B_BYTES = BLOCK * 4;                    // one warp's prefix sums
constexpr unsigned C_BYTES = MASK_BY_FACTORS ? BLOCK * 4 : 0; // one warp's column factors
constexpr unsigned P_BYTES = BLOCK * BLOCK * 2;            // one chunk's masked scores P (P_TILE)
// A warpgroup's columns of a V tile start this many bytes into it (whole column blocks).
constexpr unsigned V_SLICE = (TILE_V / BWV) * (BLOCK * SWV);
// The kernel's layout (below): 1 KiB of slack to align the tiles, the Q, K, V, g ring, V_w, the
// state copies, the P tile (P_TILE), each warp's prefix sums and column factors; it must fit what
// the launch provides.
static_assert(1024 + STAGES * (2 * Q_BYTES + V_BYTES + G_BYTES) + VW_BUFS * V_BYTES + WGS * S_BYTES +
                      (P_TILE ? P_BYTES : 0) + NWARPS * (B_BYTES + C_BYTES) <= SMEM,
              "shared memory: the layout exceeds the spec's SMEM");

// 2^x (ex2.approx: relative error ~2^-22; x ≤ 0 here, so the result is in [0, 1]).
__device__ __forceinline__ float gla_ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// HELPER's named barriers (0 is __syncthreads, 1 + wg each warpgroup's own, lj_wg_bar): a wait for
// n threads, and an arrival that does not wait; both make the thread's earlier shared-memory
// accesses visible to the participants when the barrier completes. READY + (c & 1): the helper
// has chunk c ready (landed, the prefix sums made, and V_w with HELPER 1, P with HELPER 2);
// FREE + (c & 1): the products' warpgroups are done with chunk c (its ring slot, V_w tile and
// sums). HELPER 1 with SPLIT_QK: P_SET, both halves of P are written; P_FREE + wg, warpgroup wg
// is done reading the previous chunk's P. HELPER 2: P_READ, the products have read chunk c's P
// (their P V is done; the helper makes chunk c + 1's after it, the products read that after
// READY of chunk c + 1). Each is arrived at by one side and waited on by the other, once per
// chunk, and neither side gets a generation ahead of the other, so no warp arrives twice before
// a barrier completes.
constexpr int BAR_READY = 4, BAR_FREE = 6, BAR_P_SET = 8, BAR_P_FREE = 9, BAR_P_READ = 11;
// setmaxnreg: this warpgroup's registers per thread from here on (N a multiple of 8).
template <int N> __device__ __forceinline__ void gla_regs_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void gla_regs_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
__device__ __forceinline__ void gla_bar_sync(int id, int n)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void gla_bar_arrive(int id, int n)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

//% local ty, scn = problem.dtype == "bf16" and "bf16" or "f16", SPLIT_QK ~= 0 and BLOCK // 2 or BLOCK -- scn: SCN
//% local wgmma = import("common/wgmma_products.lua")
${wgmma.products({ BLOCK, TILE_V, scn }, ty)}

// One chunk of a sequence tensor into its swizzled tile (common/wgmma.cuh's lj_load_tile, with
// this kernel's element type, chunk and thread count).
template <int W, int BW>
__device__ __forceinline__ void load_tile(unsigned dst, const T *src, long long rs, int valid, int tid)
{
    lj_load_tile<T, BLOCK, NLOAD, W, BW>(dst, src, rs, valid, tid);
}

// The gates of one chunk (rows t0 .. t0 + BLOCK of g, element stride gs) into the ring: 4-byte
// copies by the first BLOCK threads, zero past the sequence's end (a zero gate keeps b constant).
__device__ __forceinline__ void load_gates(unsigned dst, const float *src, long long gs, int valid, int tid)
{
    if (tid < BLOCK) {
        const bool ok = tid < valid;
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst + tid * 4),
                     "l"(ok ? src + tid * gs : src), "r"(ok ? 4 : 0)
                     : "memory");
    }
}

extern "C" __global__ void __launch_bounds__(NT, 1)
    simple_gla_fwd(const __grid_constant__ lj_arg<4> q_, const __grid_constant__ lj_arg<4> k_,
                   const __grid_constant__ lj_arg<4> v_, const __grid_constant__ lj_arg<3> g_,
                   const __grid_constant__ lj_arg<4> h0_, const __grid_constant__ lj_arg<4> o_,
                   const __grid_constant__ lj_arg<4> ht_, float scale, const __grid_constant__ lj_arg<1> ws_)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // Tiles start on 1024-byte boundaries (the 128-byte swizzle's period); the launch asks for
    // 1 KiB of slack.
    const unsigned base = (lj_smem_addr(smem_raw) + 1023u) & ~1023u;
    const unsigned sQ = base;
    const unsigned sK = sQ + STAGES * Q_BYTES;
    const unsigned sV = sK + STAGES * Q_BYTES;
    const unsigned sVw = sV + STAGES * V_BYTES;
    const unsigned sS0 = sVw + VW_BUFS * V_BYTES;
    const unsigned sP = sS0 + WGS * S_BYTES;  // P_TILE: the tile of P (64 x 64, K-major A of P V)
    const unsigned sG = sP + (P_TILE ? P_BYTES : 0); // STAGES chunks of gates
    const unsigned sB0 = sG + STAGES * G_BYTES; // each warp's prefix sums (log2 units)
    const unsigned sC0 = sB0 + NWARPS * B_BYTES; // each warp's column factors (mask_scores)

    // tid spans the CTA (loads); wg, warp, g and t4 place a thread in its warpgroup's products,
    // which cover columns e0 .. e0 + TILE_V of this CTA's VW.
    const int tid = threadIdx.x, lane = tid & 31, wg = WGS == 1 ? 0 : tid >> 7, warp = (tid >> 5) & 3;
    const int wtid = tid & 127; // the thread within its warpgroup
    const int ltid = tid - (NT - NLOAD); // the thread among those that issue the copies
    const int g = lane >> 2, t4 = lane & 3;
    // This CTA's column slice, head and row (and with SPLIT its segment j, by arrival).
    int sl = blockIdx.x, h = blockIdx.y, b = blockIdx.z, j = 0;
    unsigned epoch = 0;
    const unsigned long long ws = reinterpret_cast<unsigned long long>(ws_.ptr);
    if constexpr (SPLIT > 1) lj_split_claim<SPLIT>(ws, j, sl, h, b, epoch);
    const int ec = sl * VW, e0 = ec + wg * TILE_V;
    static_assert(H >= 1, "H");
    const unsigned sS = sS0 + wg * S_BYTES; // this warpgroup's state copy
    // This warp's prefix sums, as a generic pointer (read and written by the warp alone).
    const unsigned sB = sB0 + (tid >> 5) * B_BYTES;
    float *const pB = reinterpret_cast<float *>(smem_raw + (sB - lj_smem_addr(smem_raw)));
    // ... and its column factors (MASK_BY_FACTORS; the warp's own as well).
    float *const pC = reinterpret_cast<float *>(smem_raw + (sC0 + (tid >> 5) * C_BYTES - lj_smem_addr(smem_raw)));
    // HELPER: the prefix sums of chunks of parity 0 and 1, shared (the first two warps' slots: the
    // warpgroups that run the products keep none of their own).
    auto pBs = [&](int par) { return reinterpret_cast<float *>(smem_raw + (sB0 + par * B_BYTES - lj_smem_addr(smem_raw))); };

    // Offsets are 64-bit (sizes and strides are long long), so a tensor may span 2^31 elements
    // or more; N itself stays far below 2^31 − BLOCK (q alone would be 256 GiB there, D >= 64),
    // so n and the chunk arithmetic fit an int.
    // The segment: n tokens from tok0; the last writes ht (every segment starts from h0: Horner).
    const int n_all = (int)q_.size[2];
    int seg_len = n_all, nseg = 1;
    if constexpr (SPLIT > 1) {
        lj_split_segments<SPLIT, SEG_MIN, BLOCK>(n_all, seg_len, nseg);
        if (j >= nseg) { // the sequence has fewer segments
            lj_split_done(ws);
            return;
        }
    }
    const bool last = j == nseg - 1;
    const int n = SPLIT > 1 ? min(seg_len, n_all - j * seg_len) : n_all;
    const long long tok0 = (long long)j * seg_len;
    const T *q = reinterpret_cast<const T *>(q_.ptr) + b * q_.stride[0] + h * q_.stride[1] + tok0 * q_.stride[2];
    const T *k = reinterpret_cast<const T *>(k_.ptr) + b * k_.stride[0] + h * k_.stride[1] + tok0 * k_.stride[2];
    const T *v = reinterpret_cast<const T *>(v_.ptr) + b * v_.stride[0] + h * v_.stride[1] + tok0 * v_.stride[2] + ec;
    const float *gp = reinterpret_cast<const float *>(g_.ptr) + b * g_.stride[0] + h * g_.stride[1] + tok0 * g_.stride[2];
    T *o = reinterpret_cast<T *>(o_.ptr) + b * o_.stride[0] + h * o_.stride[1] + tok0 * o_.stride[2] + e0;
    const long long qs = q_.stride[2], ks = k_.stride[2], vs = v_.stride[2], gs = g_.stride[2], os = o_.stride[2];
    const int nchunks = (n + BLOCK - 1) / BLOCK;
    // The output pieces this thread stores: row o_r0 (+ O_RSTEP per pass), columns o_cx .. + 7.
    constexpr int O_PV = TILE_V / 8, O_RSTEP = 128 / O_PV;
    static_assert(O_RSTEP % 8 == 0 && BLOCK % O_RSTEP == 0, "output pieces");
    const int o_r0 = wtid / O_PV, o_cx = (wtid % O_PV) * 8;
    T *const o_thr = o + o_r0 * os + o_cx;
    const long long o_step = O_RSTEP * os;
    const unsigned o_soff = lj_tile_off<BWV, BLOCK>(o_r0, o_cx);

    // A walk without outputs (SPLIT's first walk, OUT = false) loads K, V and the gates only.
    auto load_chunk = [&](int c, auto out_tag) {
        constexpr bool OUT = decltype(out_tag)::value;
        const int st = c % STAGES;
        const long long t0 = (long long)c * BLOCK;
        const int valid = n - c * BLOCK;
        if constexpr (OUT) load_tile<D, BWQ>(sQ + st * Q_BYTES, q + t0 * qs, qs, valid, ltid);
        load_tile<D, BWQ>(sK + st * Q_BYTES, k + t0 * ks, ks, valid, ltid);
        load_tile<VW, BWV>(sV + st * V_BYTES, v + t0 * vs, vs, valid, ltid);
        load_gates(sG + st * G_BYTES, gp + t0 * gs, gs, valid, ltid);
    };
    // The ring's first STAGES − 1 chunks of a walk.
    auto prologue = [&](auto out_tag) {
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) {
            if (s < nchunks) load_chunk(s, out_tag);
            lj_cp_async_commit();
        }
    };
    if constexpr (SPLIT == 1 && !HELPS) prologue(lj_bool<true>{});

    // The state slice: st[mb][j*4 + r] is row d = 64 mb + 16 warp + g + 8 (r >> 1), column
    // e = 8 j + 2 t4 + (r & 1) of the D x TILE_V slice (the m64 accumulator layout).
    float st[MB][NACC];
    auto st_row = [&](int mb, int x) { return 64 * mb + 16 * warp + g + 8 * ((x & 3) >> 1); };
    auto st_col = [&](int x) { return e0 + 8 * (x >> 2) + 2 * t4 + (x & 1); };
    auto zero_state = [&]() {
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
#pragma unroll
            for (int x = 0; x < NACC; x++) st[mb][x] = 0.f;
    };
    // The initial state h0 (zero when left out), into st.
    auto load_h0 = [&]() {
        zero_state();
        if constexpr (HAS_H0) {
            if (h0_.ptr != nullptr) {
                const float *s0 = reinterpret_cast<const float *>(h0_.ptr) + b * h0_.stride[0] + h * h0_.stride[1];
#pragma unroll
                for (int mb = 0; mb < MB; mb++)
#pragma unroll
                    for (int x = 0; x < NACC; x++)
                        st[mb][x] = s0[st_row(mb, x) * h0_.stride[2] + st_col(x) * h0_.stride[3]];
            }
        }
    };
    if constexpr (SPLIT == 1) load_h0();
    else zero_state();
    // The 16-bit state copy: rows d, columns e, MN-major B of Q S. Written from the state that
    // enters the chunk; the registers are decayed afterwards, once the chunk's gates are known.
    auto state_to_smem = [&]() {
#pragma unroll
        for (int mb = 0; mb < MB; mb++) lj_stmatrix_acc<T, BWV, D, TILE_V>(sS, st[mb], 64 * mb + 16 * warp, 1.f, lane);
        lj_fence_async_smem();
    };
    // S ← d S (d = exp(b_{L−1}) of the chunk the state enters).
    auto decay_state = [&](float d) {
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
#pragma unroll
            for (int x = 0; x < NACC; x++) st[mb][x] *= d;
    };
    // The gates' prefix sums b_i of chunk cc (log2 units; the chunk has landed in the ring),
    // every warp for itself, into its pB: lane l holds tokens 2l and 2l + 1; an inclusive scan of
    // the pair sums over the lanes. Returns b_{L−1} (= b_63: the gates past L are zero). The
    // caller makes sure the warp no longer reads the previous chunk's sums.
    auto scan_gates = [&](int cc, float *dst) -> float {
        const float *gc = reinterpret_cast<const float *>(smem_raw + (sG + (cc % STAGES) * G_BYTES - lj_smem_addr(smem_raw)));
        const float2 gv = reinterpret_cast<const float2 *>(gc)[lane];
        const float a0 = gv.x * LOG2E, a01 = fmaf(gv.y, LOG2E, a0);
        float s = a01;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const float u = __shfl_up_sync(0xffffffffu, s, off);
            if (lane >= off) s += u;
        }
        const float bl = __shfl_sync(0xffffffffu, s, 31);
        __syncwarp(); // the warp's reads of the previous chunk's sums are done
        reinterpret_cast<float2 *>(dst)[lane] = make_float2(s - a01 + a0, s);
        __syncwarp();
        return bl;
    };

    // V_w: the values of the ring tile at src weighted by exp(b_{L−1} − b_j) on row j (rows past L
    // are zero), into dst (the same layout), 16-byte vectors first .. first + count of the tile,
    // thread t of 128 taking every 128th.
    auto weight_v = [&](unsigned src, unsigned dst, int first, int count, int t, float bl, const float *pb) {
#pragma unroll
        for (int i = 0; i < (count + 127) / 128; i++) {
            const int x = first + t + i * 128;
            if (count % 128 == 0 || x < first + count) {
                const int row = (x * 16 % (BLOCK * SWV)) / SWV; // the swizzle stays in a row
                const float w = gla_ex2(bl - pb[row]);
                unsigned a0, a1, a2, a3;
                asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                             : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(src + x * 16));
                unsigned wv[4] = {a0, a1, a2, a3};
#pragma unroll
                for (int y = 0; y < 4; y++) {
                    T lo, hi;
                    lo.bits = (unsigned short)(wv[y] & 0xffff);
                    hi.bits = (unsigned short)(wv[y] >> 16);
                    wv[y] = lj_pack2<T>(lj_to_float(lo) * w, lj_to_float(hi) * w);
                }
                asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(dst + x * 16), "r"(wv[0]),
                             "r"(wv[1]), "r"(wv[2]), "r"(wv[3])
                             : "memory");
            }
        }
        lj_fence_async_smem();
    };

    // Q Kᵀ of a chunk: issued first thing in the chunk, or with PREFETCH during the previous
    // chunk's tail (its outputs and state copy), so the tensor cores have it in flight there.
    // With SPLIT_QK a warpgroup computes score columns jb .. jb + 31 only (keys jb .. of K, rows
    // a multiple of 8 into the tile, so the swizzle is unchanged).
    const int i0 = 16 * warp + g, i1 = i0 + 8; // this thread's score and output rows
    const int jb = SPLIT_QK ? wg * SCN : 0;    // the first of the warpgroup's score columns
    float sc[NSC];
    auto issue_scores = [&](int c) {
        const int slotc = c % STAGES;
        const unsigned cQ = sQ + slotc * Q_BYTES, cK = sK + slotc * Q_BYTES;
        const unsigned long long dQ = lj_wg_desc<SWQ>(cQ, 16), dK = lj_wg_desc<SWQ>(cK + jb * SWQ, 16);
        lj_wg_fence();
        wg_ss${scn}_z<0, 0>(sc, dQ, dK);
#pragma unroll
        for (int kk = 1; kk < D / 16; kk++) {
            const unsigned off = (kk * 16 / BWQ) * (BLOCK * SWQ) + (kk * 16 % BWQ) * 2;
            wg_ss${scn}<0, 0>(sc, lj_wg_desc_at(dQ, off), lj_wg_desc_at(dK, off), 1);
        }
        lj_wg_commit();
    };
    // The scores of a chunk (its prefix sums in pb, bi0 and bi1 those of the thread's rows):
    // masked, weighted by scale · exp(b_i − b_j), rounded to the A operand of P V: into pa
    // (registers), or with P_TILE in place in sc, for store_p (SPLIT_QK: the warpgroup's half;
    // HELPER: the helper's whole tile). The thread's rows are i0 = 16 warp + g and i1 = i0 + 8, its
    // columns j = 8 jt + 2 t4 (+1), jt = jb / 8 + nt the column block in the chunk.
    // Most entries are products of factors, each the exponential of a difference b_later −
    // b_earlier ≤ 0, so none exceeds 1 and no range is lost: left of the warp's 16 rows
    // (jt < 2 warp) row i1's factor is row i0's times exp(b_i1 − b_i0), which saves half the
    // exponentials. MASK_BY_FACTORS also splits row i0's there, exp(b_i0 − b_p) · exp(b_p − b_j)
    // with the pivot p = 16 warp, and in the warp's first 8 columns row i1's (wholly below them),
    // exp(b_i1 − b_p') · exp(b_p' − b_j) with p' = 16 warp + 8. Its column factors are made once
    // per warp (lane l those of tokens 2l, 2l + 1) into its own 64 floats at pC by col_factors, as
    // soon as the chunk's sums are known (the scan's tail, or its READY), off the mask's chain; a
    // thread's exponentials there no longer grow with its row: 7 a chunk instead of 4 warp + 7.
    // Either way the two 8 x 8 triangles on the diagonal are exponentiated entry by entry (j ≤ i
    // tested; no pivot lies between j and i there). Past them everything is zero. jt against warp
    // is warp-uniform (jb is the warpgroup's): with SPLIT_QK warps 0 and 1 of warpgroup 1 have no
    // entry on or below the diagonal, warps 2 and 3 of warpgroup 0 no diagonal block.
    unsigned pa[P_TILE ? 1 : BLOCK / 16][4];
    // The column factors 2^(b_p − b_j) (j < p = 16 warp) and 2^(b_p' − b_j) (p' = 16 warp + 8,
    // 16 warp ≤ j < p') of a chunk whose sums are in pb, into pC. The caller makes sure the warp
    // is done with the previous chunk's mask. Nothing without MASK_BY_FACTORS.
    auto col_factors = [&](const float *pb) {
        if constexpr (!MASK_BY_FACTORS) return;
        const float2 bt = reinterpret_cast<const float2 *>(pb)[lane];
        const float piv = pb[2 * lane < 16 * warp ? 16 * warp : 16 * warp + 8];
        __syncwarp(); // every lane's reads of the previous chunk's factors are done
        if (2 * lane < 16 * warp + 8)
            reinterpret_cast<float2 *>(pC)[lane] = make_float2(gla_ex2(piv - bt.x), gla_ex2(piv - bt.y));
        __syncwarp();
    };
    // The thread's row factors: 2^(b_i1 − b_i0), and with MASK_BY_FACTORS scale · 2^(b_i0 − b_p)
    // and scale · 2^(b_i1 − b_p').
    struct RowFactors { float r10, r0, r1; };
    auto row_factors = [&](const float *pb, float bi0, float bi1) {
        RowFactors f{gla_ex2(bi1 - bi0), 0.f, 0.f};
        if constexpr (MASK_BY_FACTORS) {
            f.r0 = scale * gla_ex2(bi0 - pb[16 * warp]);
            f.r1 = scale * gla_ex2(bi1 - pb[16 * warp + 8]);
        }
        return f;
    };
    auto mask_scores = [&](const float *pb, float bi0, float bi1, RowFactors rf) {
        const float r10 = rf.r10, r0 = rf.r0, r1 = rf.r1;
        if constexpr (!PREFETCH) lj_wg_wait<2>();
        lj_fence_regs(sc);
#pragma unroll
        for (int nt = 0; nt < SCN / 8; nt++) {
            const int jt = jb / 8 + nt, j = 8 * jt + 2 * t4;
            float m[4] = {0.f, 0.f, 0.f, 0.f};
            if (jt < 2 * warp) {
                if constexpr (MASK_BY_FACTORS) {
                    const float2 cj = reinterpret_cast<const float2 *>(pC)[j / 2];
                    m[0] = r0 * cj.x;
                    m[1] = r0 * cj.y;
                } else {
                    const float2 bj = reinterpret_cast<const float2 *>(pb)[j / 2];
                    m[0] = scale * gla_ex2(bi0 - bj.x);
                    m[1] = scale * gla_ex2(bi0 - bj.y);
                }
                m[2] = r10 * m[0];
                m[3] = r10 * m[1];
            } else if (jt == 2 * warp) {
                const float2 bj = reinterpret_cast<const float2 *>(pb)[j / 2];
                m[0] = j <= i0 ? scale * gla_ex2(bi0 - bj.x) : 0.f;
                m[1] = j + 1 <= i0 ? scale * gla_ex2(bi0 - bj.y) : 0.f;
                if constexpr (MASK_BY_FACTORS) {
                    const float2 cj = reinterpret_cast<const float2 *>(pC)[j / 2];
                    m[2] = r1 * cj.x;
                    m[3] = r1 * cj.y;
                } else {
                    m[2] = scale * gla_ex2(bi1 - bj.x);
                    m[3] = scale * gla_ex2(bi1 - bj.y);
                }
            } else if (jt == 2 * warp + 1) {
                const float2 bj = reinterpret_cast<const float2 *>(pb)[j / 2];
                m[2] = j <= i1 ? scale * gla_ex2(bi1 - bj.x) : 0.f;
                m[3] = j + 1 <= i1 ? scale * gla_ex2(bi1 - bj.y) : 0.f;
            }
            if constexpr (P_TILE) {
#pragma unroll
                for (int r = 0; r < 4; r++) sc[4 * nt + r] *= m[r];
            } else {
                pa[nt / 2][2 * (nt & 1)] = lj_pack2<T>(sc[4 * nt] * m[0], sc[4 * nt + 1] * m[1]);
                pa[nt / 2][2 * (nt & 1) + 1] = lj_pack2<T>(sc[4 * nt + 2] * m[2], sc[4 * nt + 3] * m[3]);
            }
        }
    };
    // P_TILE: the masked scores (columns jb .. jb + SCN) into the P tile, for the async proxy.
    auto store_p = [&]() {
        lj_stmatrix_acc<T, BWQ, BLOCK, SCN>(sP, sc, 16 * warp, 1.f, lane, jb);
        lj_fence_async_smem();
    };
    // With PREFETCH the products are issued unconditionally (for an empty sequence, and for the
    // chunk after the last), so none sits in a branch: a branch around wgmma makes ptxas
    // serialise them all. Those extra products read stale shared memory; their results are unused.
    // One walk over the segment: with outputs (OUT), or (SPLIT's first walk) the state update
    // alone, from a zero state: K, V and the gates loaded, the scan, V_w, S += Kᵀ V_w; no scores,
    // no Q S, no P V, no stores. Returns the walk's total gate Σ b_{L−1} (log2 units). The ring's
    // prologue is issued before it.
    auto walk = [&](auto out_tag) -> float {
    constexpr bool OUT = decltype(out_tag)::value;
    float gam = 0.f;
    float bl_next = 0.f; // with PREFETCH: b_{L−1} of the next chunk, scanned in this one's tail
    if constexpr (OUT) state_to_smem();
    if constexpr (PREFETCH && OUT) {
        if constexpr (HELPS) {
            if (nchunks > 0) gla_bar_sync(BAR_READY, NT); // chunk 0 ready
            if constexpr (HELPER_VW) issue_scores(0);
            bl_next = pBs(0)[BLOCK - 1];
            if constexpr (!HELPER_P) col_factors(pBs(0));
            lj_wg_wait<0>();
        } else {
            lj_cp_async_wait<STAGES - 2>();
            lj_fence_async_smem();
            __syncthreads(); // chunk 0 landed
            issue_scores(0);
            bl_next = scan_gates(0, pB);
            col_factors(pB);
            lj_wg_wait<0>();
        }
        decay_state(nchunks > 0 ? gla_ex2(bl_next) : 1.f);
    }

    for (int c = 0; c < nchunks; c++) {
        const int slotc = c % STAGES;
        const unsigned cQ = sQ + slotc * Q_BYTES, cK = sK + slotc * Q_BYTES, cV = sV + slotc * V_BYTES;
        const int L = min(BLOCK, n - c * BLOCK);
        auto load_next = [&]() {
            const int nc = c + STAGES - 1;
            if (nc < nchunks) load_chunk(nc, out_tag);
            lj_cp_async_commit();
        };
        if constexpr (HELPS && !OUT) {
            gla_bar_sync(BAR_READY + (c & 1), NT); // chunk c ready
        } else if constexpr (!PREFETCH || !OUT) {
            lj_cp_async_wait<STAGES - 2>();
            lj_fence_async_smem();
            __syncthreads(); // chunk c landed; chunk c − 1's products and state copy are done
            load_next();
        }
        // O = Q S₁₆ needs neither the chunk's gates nor V_w: with PREFETCH it is issued first, so
        // the tensor cores run it while the gates are scanned and applied (chunk c landed at the
        // previous chunk's mid-point barrier; this warpgroup's state copy is written once its
        // warps pass the barrier below).
        float oa[NACC];
        const unsigned long long dQ = lj_wg_desc<SWQ>(cQ, 16), dS = lj_wg_desc<SWV>(sS, D * SWV);
        auto issue_qs = [&]() {
            wg_ss${TILE_V}_z<0, 1>(oa, dQ, dS);
#pragma unroll
            for (int kk = 1; kk < D / 16; kk++) {
                const unsigned off = (kk * 16 / BWQ) * (BLOCK * SWQ) + (kk * 16 % BWQ) * 2;
                wg_ss${TILE_V}<0, 1>(oa, lj_wg_desc_at(dQ, off), lj_wg_desc_at(dS, kk * 16 * SWV), 1);
            }
            lj_wg_commit();
        };
        if constexpr (PREFETCH && OUT) {
            lj_wg_bar(wg);
            lj_wg_fence();
            issue_qs();
        }

        // The chunk's prefix sums in pB: with PREFETCH scanned in the previous chunk's tail (or
        // before the loop), while its P V ran; else now (chunk c landed at the barrier above).
        float bl; // b_{L−1}
        const float *const pb = HELPS ? pBs(c & 1) : pB; // the chunk's prefix sums
        if constexpr (PREFETCH && OUT) bl = bl_next;
        else if constexpr (HELPS) bl = pb[BLOCK - 1];
        else {
            bl = scan_gates(c, pB);
            if constexpr (OUT) col_factors(pB);
        }
        gam += bl;
        // S ← exp(b_{L−1}) S, so that the state update only adds (with PREFETCH done in the
        // previous chunk's tail). No product is in flight (the last retired at the end of the
        // previous chunk); without PREFETCH this comes before the scores are issued, as ptxas
        // otherwise waits for them before touching the state.
        if constexpr (!(PREFETCH && OUT)) decay_state(gla_ex2(bl));
        if constexpr (!PREFETCH && OUT) issue_scores(c);

        // The values weighted for the state update: each warpgroup weights its own columns (so
        // the buffer's hazards stay inside it); HELPER 1: the helper made them (in this chunk's
        // V_w tile).
        const unsigned sVwc = sVw + (HELPER_VW ? (c & 1) * V_BYTES : 0);
        if constexpr (!HELPER_VW) weight_v(cV, sVw, wg * (V_SLICE / 16), V_SLICE / 16, wtid, bl, pb);
        const unsigned sVs = sVwc + wg * V_SLICE; // this warpgroup's columns of V_w
        // V_w (and with PREFETCH the state copy) of every warp are written; with PREFETCH every
        // warp is also done with chunk c − 1's products, so its ring slot takes chunk
        // c + STAGES − 1. HELPER: the ring is the helper's, and V_w and the state copy are the
        // warpgroup's own (HELPER 2) or the helper's (HELPER 1).
        if constexpr (HELPER_P) {
            lj_wg_bar(wg);
        } else if constexpr (!HELPS) {
            __syncthreads();
            if constexpr (PREFETCH && OUT) load_next();
        }

        // O = Q S₁₆ (unless issued above) and S += Kᵀ V_w (the state was decayed above).
#pragma unroll
        for (int mb = 0; mb < MB; mb++) lj_fence_regs(st[mb]);
        const unsigned long long dKt = lj_wg_desc<SWQ>(cK, BLOCK * SWQ), dVs = lj_wg_desc<SWV>(sVs, BLOCK * SWV);
        lj_wg_fence();
        if constexpr (OUT && !PREFETCH) issue_qs();
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
#pragma unroll
            for (int kk = 0; kk < BLOCK / 16; kk++)
                wg_ss${TILE_V}<1, 1>(st[mb], lj_wg_desc_at(dKt, mb * (BLOCK * SWQ) + kk * 16 * SWQ),
                                     lj_wg_desc_at(dVs, kk * 16 * SWV), 1);
        lj_wg_commit();
        if constexpr (!OUT) { // the state update is all a walk without outputs does
            lj_wg_wait<0>();
#pragma unroll
            for (int mb = 0; mb < MB; mb++) lj_fence_regs(st[mb]);
            if constexpr (HELPS) gla_bar_arrive(BAR_FREE + (c & 1), NT); // chunk c's tiles are free
            continue;
        }

        // The scores (with PREFETCH retired at the end of the previous iteration) masked while
        // the products run: here the mask's exponentials overlap Q S₁₆ and the state update on
        // the tensor cores (before the barrier above they delayed both products' start by ~7 %
        // of the kernel at B·H = 128). SPLIT_QK: P goes through shared memory, both halves
        // written before P V reads it, so a barrier follows (HELPER 1: nothing else keeps the
        // other warpgroup's P V of the previous chunk from still reading the tile, so a second
        // one comes before). HELPER 2: P is the helper's, in its tile since READY.
        const float bi0 = pb[i0], bi1 = pb[i1];
        if constexpr (!HELPER_P) {
            mask_scores(pb, bi0, bi1, row_factors(pb, bi0, bi1));
            if constexpr (SPLIT_QK) {
                if constexpr (HELPER_VW)
                    if (c >= 1) gla_bar_sync(BAR_P_FREE + 1 - wg, NTC);
                store_p();
                if constexpr (HELPER_VW) gla_bar_sync(BAR_P_SET, NTC);
                else __syncthreads(); // both halves of P written
            }
        }
        // Q S done: the inter-chunk term decays by exp(b_i), times scale.
        const float f0 = scale * gla_ex2(bi0), f1 = scale * gla_ex2(bi1);
        lj_wg_wait<1>();
        lj_fence_regs(oa);
#pragma unroll
        for (int j = 0; j < TILE_V / 8; j++) {
            oa[4 * j] *= f0;
            oa[4 * j + 1] *= f0;
            oa[4 * j + 2] *= f1;
            oa[4 * j + 3] *= f1;
        }
        lj_fence_regs(oa);
        const unsigned long long dV = lj_wg_desc<SWV>(cV + wg * V_SLICE, BLOCK * SWV);
        lj_wg_fence();
        if constexpr (P_TILE) {
            const unsigned long long dP = lj_wg_desc<SWQ>(sP, 16);
#pragma unroll
            for (int kk = 0; kk < BLOCK / 16; kk++)
                wg_ss${TILE_V}<0, 1>(oa, lj_wg_desc_at(dP, kk * 16 * 2), lj_wg_desc_at(dV, kk * 16 * SWV), 1);
        } else {
#pragma unroll
            for (int kk = 0; kk < BLOCK / 16; kk++) wg_rs${TILE_V}<1>(oa, pa[kk], lj_wg_desc_at(dV, kk * 16 * SWV), 1);
        }
        lj_wg_commit();

        // With PREFETCH the next chunk's scores go in while this chunk's tail runs (HELPER 2: the
        // helper makes the next chunk's P once P V has read this one's).
        if constexpr (HELPER_VW) {
            if (c + 1 < nchunks) gla_bar_sync(BAR_READY + ((c + 1) & 1), NT); // chunk c + 1 ready
            issue_scores(c + 1);
            bl_next = pBs((c + 1) & 1)[BLOCK - 1];
            col_factors(pBs((c + 1) & 1));
            lj_wg_wait<1>();
            if constexpr (SPLIT_QK)
                if (c + 1 < nchunks) gla_bar_arrive(BAR_P_FREE + wg, NTC); // P V has read P
        } else if constexpr (HELPER_P) {
            lj_wg_wait<0>();
            if (c + 1 < nchunks) gla_bar_arrive(BAR_P_READ, NT); // P V has read P
        } else if constexpr (PREFETCH) {
            lj_cp_async_wait<STAGES - 2>();
            lj_fence_async_smem();
            __syncthreads(); // chunk c + 1 landed
            issue_scores(c + 1);
            // Chunk c + 1's gates scanned while P V and its scores run (this chunk's sums were
            // last read before P V was issued). Past the last chunk the slot holds stale gates:
            // the result is not used.
            bl_next = scan_gates(c + 1, pB);
            col_factors(pB);
            lj_wg_wait<1>();
        } else {
            lj_wg_wait<0>();
        }
        lj_fence_regs(oa);
#pragma unroll
        for (int mb = 0; mb < MB; mb++) lj_fence_regs(st[mb]);

        // Store o for the rows inside the sequence: through this warpgroup's part of the V_w
        // buffer (free now: its products are done), so each thread writes whole 16-byte pieces of
        // rows. A thread keeps one piece column and steps down O_RSTEP rows per pass (a multiple
        // of 8: the swizzle repeats).
        {
            const unsigned sO = sVs;
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
        state_to_smem();
        // HELPER 2: chunk c + 1's prefix sums (and the rest of it) are ready.
        if constexpr (HELPER_P) {
            if (c + 1 < nchunks) {
                gla_bar_sync(BAR_READY + ((c + 1) & 1), NT);
                bl_next = pBs((c + 1) & 1)[BLOCK - 1];
            }
        }
        // The state entering chunk c + 1 is in its copy; decayed by that chunk's gates here, off
        // the next chunk's start (a select, not a branch, with the scores in flight).
        if constexpr (PREFETCH) decay_state(c + 1 < nchunks ? gla_ex2(bl_next) : 1.f);
        // Nothing stays in flight across the loop's back edge: ptxas cannot follow a product
        // through it and would serialise every wgmma of the loop. The next chunk's scores have
        // had this chunk's tail to finish.
        if constexpr (PREFETCH) lj_wg_wait<0>();
        if constexpr (HELPS) gla_bar_arrive(BAR_FREE + (c & 1), NT); // chunk c's tiles are free
    }
    if constexpr (!HELPS) {
        lj_cp_async_wait<0>();
        __syncthreads(); // the ring and the tiles are free for another walk
    }
    return gam;
    };

    // HELPER: the helper warpgroup's side of a walk (the ring, the gate scan, V_w and with OUT P,
    // a chunk ahead of the products' warpgroups), its prologue included.
    auto helper_walk = [&](auto out_tag) {
        constexpr bool OUT = decltype(out_tag)::value;
        const int hw = ltid >> 5;
        prologue(out_tag);
        for (int c = 0; c < nchunks; c++) {
            lj_cp_async_wait<STAGES - 2>();
            lj_fence_async_smem();
            lj_wg_bar(WGS); // every helper thread's copies of chunk c have landed
            // HELPER 2: the scores on the tensor cores while the gates are scanned.
            if constexpr (OUT && HELPER_P) issue_scores(c);
            // Each helper warp scans the gates for itself (its warp 0 into the chunk's shared
            // sums): no barrier between the scan, the weighting and the mask.
            float *const pbs = hw == 0 ? pBs(c & 1) : pB;
            const float bl = scan_gates(c, pbs);
            if constexpr (HELPER_VW)
                weight_v(sV + (c % STAGES) * V_BYTES, sVw + (c & 1) * V_BYTES, 0, V_BYTES / 16, ltid, bl, pbs);
            if constexpr (OUT && HELPER_P) {
                // The factors while Q Kᵀ is on the tensor cores.
                col_factors(pbs);
                const float bi0 = pbs[i0], bi1 = pbs[i1];
                const RowFactors rf = row_factors(pbs, bi0, bi1);
                lj_wg_wait<0>();
                mask_scores(pbs, bi0, bi1, rf);
                if (c >= 1) gla_bar_sync(BAR_P_READ, NT); // the products have read chunk c − 1's P
                store_p();
            }
            gla_bar_arrive(BAR_READY + (c & 1), NT);
            // The ring slot of chunk c − 1 takes chunk c + STAGES − 1 once both warpgroups are
            // done with it (which also frees the V_w tile and sums of chunk c + 1).
            if (c >= 1) gla_bar_sync(BAR_FREE + ((c - 1) & 1), NT);
            const int nc = c + STAGES - 1;
            if (nc < nchunks) load_chunk(nc, out_tag);
            lj_cp_async_commit();
        }
        if (nchunks > 0) gla_bar_sync(BAR_FREE + ((nchunks - 1) & 1), NT);
        lj_cp_async_wait<0>();
    };
    // The two roles part around the walks only: every thread runs the split's steps (their CTA
    // barriers) at the same place. The helper's threads hold no state: it is redefined after
    // their walks and read after the products' walks only, so that ptxas does not keep it live
    // beside the helper's scores (the products' state and the helper's scores do not both fit
    // the 168 registers a 384-thread CTA allows).
    const bool helper = HELPS && tid >= NTC;

    if constexpr (SPLIT > 1) {
        // The segment's local state M_j and total gate Γ_j (not needed from the last segment),
        // published for the segments after it; then S_in,j by Horner's rule over h0 and M_0 ..
        // M_{j−1}. The thread's pairs of adjacent columns (x, x + 1) move as float2.
        const unsigned long long st_base = ws + 16 + (unsigned long long)q_.size[0] * H * FLAGS_PER;
        constexpr int NSL = E / VW;
        auto gam_at = [&](int i) {
            const unsigned long long base = st_base + ((unsigned long long)b * H + h) * WS_PER;
            return reinterpret_cast<float *>(base) + (long long)(SPLIT - 1) * D * E + i * NSL + sl;
        };
        // This CTA's slice of M_i (D x VW floats) in the products' register order: float4 q of
        // thread p at q·NTC + p, so that each thread stores and loads its state as 16-byte pieces
        // and a warp's access is 512 contiguous bytes (the row-major D x E form, 8-byte pieces of
        // the accumulator layout, folded at ~16 GB/s a CTA; docs/notes/families.md, session 21).
        // Only this kernel reads the local states, so their form is its own.
        static_assert(NACC % 4 == 0 && (long long)MB * NACC * NTC == (long long)D * VW, "state pieces");
        auto m_slice = [&](int i) {
            return reinterpret_cast<float4 *>(lj_split_state<SPLIT, D, E>(st_base, WS_PER, b, H, h, i)) +
                   (long long)sl * D * VW / 4;
        };
        if (!last) {
            if (helper) {
                helper_walk(lj_bool<false>{});
                zero_state();
            } else {
                if constexpr (!HELPS) prologue(lj_bool<false>{});
                const float gam = walk(lj_bool<false>{});
                float4 *m = m_slice(j) + tid;
#pragma unroll
                for (int mb = 0; mb < MB; mb++)
#pragma unroll
                    for (int x = 0; x < NACC; x += 4)
                        __stcg(m + (mb * (NACC / 4) + x / 4) * NTC,
                               make_float4(st[mb][x], st[mb][x + 1], st[mb][x + 2], st[mb][x + 3]));
                if (tid == 0) __stcg(gam_at(j), gam);
            }
            lj_split_publish(lj_split_flag<SPLIT, D, E>(ws, FLAGS_PER, b, H, h, j, ec), epoch);
        }
        if (!helper) load_h0();
        // The flags of segments 0 .. j − 1 polled at once, each by its own thread (the segments'
        // first walks run at the same time, so the flags are set at about the same time; waited
        // for one by one with lj_split_wait, a few round trips each, the fold took ~6 µs a
        // segment), then one CTA barrier, as lj_split_wait ends; then S_in,j, each segment's Γ
        // and state loaded together. The poll is lj_split_wait's, by another thread: a form of
        // it for many flags belongs in common/split.cuh (la_fwd_sm90's fold waits the same way),
        // but any change there retires every built-in family's shipped rows.
        // The poller of segment i also turns its Γ_i into the factor 2^Γ_i, into shared memory
        // (the gate ring's, idle between the walks: SPLIT ≤ 128 floats fit STAGES·BLOCK), so that
        // the fold's chain holds the states' loads only.
        float *const fold_f = reinterpret_cast<float *>(smem_raw + (sG - lj_smem_addr(smem_raw)));
        static_assert(SPLIT <= STAGES * BLOCK, "the fold's factors fit the gate ring");
        if (tid < j) {
            const volatile unsigned *fl = lj_split_flag<SPLIT, D, E>(ws, FLAGS_PER, b, H, h, tid, ec);
            while (*fl != epoch + 1u) __nanosleep(32);
            __threadfence();
            fold_f[tid] = gla_ex2(__ldcg(gam_at(tid)));
        }
        __syncthreads();
        // One m64 block of the state at a time (its NACC / 4 pieces of a segment in flight at
        // once): the whole slice's pieces beside the state spill at the 168 registers a
        // 384-thread CTA has (16 bytes, HELPER 2 with two warpgroups, NVRTC 13.0).
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
            for (int i = 0; i < (helper ? 0 : j); i++) {
                const float4 *m = m_slice(i) + mb * (NACC / 4) * NTC + tid;
                const float f = fold_f[i];
                float4 mv[NACC / 4];
#pragma unroll
                for (int q = 0; q < NACC / 4; q++) mv[q] = __ldcg(m + q * NTC);
#pragma unroll
                for (int x = 0; x < NACC; x += 4) {
                    const float4 w = mv[x / 4];
                    st[mb][x] = fmaf(f, st[mb][x], w.x);
                    st[mb][x + 1] = fmaf(f, st[mb][x + 1], w.y);
                    st[mb][x + 2] = fmaf(f, st[mb][x + 2], w.z);
                    st[mb][x + 3] = fmaf(f, st[mb][x + 3], w.w);
                }
            }
        // Every CTA has claimed its ticket by now: the counters can be reset for the next launch
        // (the epoch this launch's flags carry is held in registers).
        lj_split_done(ws);
        if constexpr (!HELPS) prologue(lj_bool<true>{});
    }
    if (helper) {
        if constexpr (REBALANCE) gla_regs_dec<HELPER_REGS>();
        helper_walk(lj_bool<true>{});
        return;
    } else {
        if constexpr (REBALANCE) gla_regs_inc<PRODUCT_REGS>();
        walk(lj_bool<true>{});
        if constexpr (HAS_HT) {
            if (ht_.ptr != nullptr && last) {
                float *sn = reinterpret_cast<float *>(ht_.ptr) + b * ht_.stride[0] + h * ht_.stride[1];
#pragma unroll
                for (int mb = 0; mb < MB; mb++)
#pragma unroll
                    for (int x = 0; x < NACC; x++)
                        sn[st_row(mb, x) * ht_.stride[2] + st_col(x) * ht_.stride[3]] = st[mb][x];
            }
        }
    }
}
