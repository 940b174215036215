#line 1 "la_fwd_sm90/fwd.cu"
// fwd.cu (la_fwd_sm90) — chunked Lightning Attention forward on Hopper's warpgroup tensor cores
// (wgmma), sm_90a, f16/bf16.
//
// The same algorithm and mathematics as la_fwd/fwd.cu (DESIGN.md, "The same in chunks"): one CTA
// per (E slice of TILE_V columns, head, sequence) walks the sequence in chunks of 64 tokens with
// the fp32 state slice S (D x TILE_V) in registers for the whole sequence:
//     o_i = σ [ λ^{i+1} q_i S + Σ_{j≤i} λ^{i−j} (q_i·k_j) v_j ]
//     S  ← λ^L S + Σ_j k_jᵀ (λ^{L−1−j} v_j)
// What differs is how the products run. The CTA is one warpgroup (4 warps); per chunk it issues
// four asynchronous wgmma products whose operands the tensor cores read straight from shared
// memory, so no warp spends instructions on operand fragments (the cost that bounds la_fwd's
// mma.sync path, docs/notes/la_fwd.md):
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
// Loads are cp.async, STAGES chunks in flight, issued by all 128 threads (the address arithmetic
// is per thread and constant across chunks). V_w (the values weighted by λ^{L−1−j}, rounded once
// to the 16-bit type as la_fwd does) is a second copy made from V in shared memory each chunk.
// Ragged chunks are zero-filled by cp.async, so padding rows add nothing.
//
// REVERSE and GRAD_STATE mean what they mean in la_fwd/fwd.cu (la_bwd's reversed scans). la_bwd
// does not run this kernel yet: both are false in every expansion today, and the paths they
// select have not run on a GPU.
#include "common/la_params.h"
#include "common/types.cuh"
#include "common/mma.cuh"

using T = lj_bf16;
constexpr int D = 128;             // key width: 64, 128 or 192 (one wgmma M block per 64 rows of S)
constexpr int E = 128;             // value width
constexpr int BLOCK = 64;     // tokens per chunk = wgmma M of the output (64)
constexpr int TILE_V = 64;   // value columns per CTA
constexpr int STAGES = 2;   // chunks in flight in the cp.async ring
constexpr bool PREFETCH = 0 != 0; // Q Kᵀ of chunk c + 1 issued during chunk c's tail
constexpr bool DECAY = true;
constexpr bool HAS_INITIAL = false;
constexpr bool HAS_FINAL = false;
constexpr bool VARLEN = false;
constexpr bool REVERSE = false;
constexpr bool GRAD_STATE = false;

constexpr int NT = 128;                 // one warpgroup
constexpr int MB = D / 64;              // m64 blocks of the state
constexpr int NACC = TILE_V / 2;        // fp32 accumulators per thread of an m64 x TILE_V product
constexpr int NSC = BLOCK / 2;          // ... of the 64 x 64 scores

static_assert(BLOCK == 64, "one warpgroup: 64 output rows per chunk");
static_assert(D % 64 == 0 && D <= 192, "D");
static_assert(TILE_V % 16 == 0 && TILE_V <= 256 && E % TILE_V == 0, "TILE_V");
static_assert(STAGES >= 2, "ring");

// Swizzled tile geometry: column blocks of BW elements, rows SW bytes apart.
constexpr int bw_of(int w) { return w % 64 == 0 ? 64 : w % 32 == 0 ? 32 : 16; }
constexpr int BWQ = 64, SWQ = 128;                         // Q and K (D % 64 == 0)
constexpr int BWV = bw_of(TILE_V), SWV = 2 * BWV;          // V, V_w and the state copy
constexpr unsigned Q_BYTES = BLOCK * D * 2;                // one chunk of Q (or K)
constexpr unsigned V_BYTES = BLOCK * TILE_V * 2;           // one chunk of V
constexpr unsigned S_BYTES = D * TILE_V * 2;               // the state copy

// Byte offset of 16-bit element (r, col) in a tile of R rows stored as blocks of BW columns with
// the SW-byte swizzle (SW = 2 BW): 16-byte chunk index XOR the row's bits above the chunk. Block
// bases are multiples of the swizzle period (8 rows), so the XOR may use the whole offset.
template <int SW> __device__ __forceinline__ unsigned swz(unsigned off)
{
    return off ^ (((off >> 7) & (SW / 16 - 1)) << 4);
}
template <int BW, int R> __device__ __forceinline__ unsigned tile_off(int r, int col)
{
    return swz<2 * BW>((unsigned)((col / BW) * (R * 2 * BW) + r * 2 * BW + (col % BW) * 2));
}

// wgmma shared-memory matrix descriptor: start address, leading- and stride-dimension byte
// offsets (LBO: between column blocks of an MN-major operand, unused for K-major; SBO: between
// groups of 8 rows), swizzle mode (1: 128 B, 2: 64 B, 3: 32 B).
template <int SW> __device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo)
{
    constexpr unsigned long long mode = SW == 128 ? 1 : SW == 64 ? 2 : 3;
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16) |
           ((unsigned long long)((8 * SW) >> 4) << 32) | (mode << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory written by ordinary stores (or cp.async) and read next by the tensor cores.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving accesses of accumulator registers across an asynchronous
// product's issue or wait (the registers change behind its back).
template <int N> __device__ __forceinline__ void fence_regs(float (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

#line 110 "la_fwd_sm90/fwd.cu"
// m64n64k16, A and B from shared memory: d (+)= A·B. TA/TB: 1 = MN-major (transposed).
template <int TA, int TB>
__device__ __forceinline__ void wg_ss64(float (&d)[32], unsigned long long da, unsigned long long db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, %35, %36;\n}\n"
#line 119 "la_fwd_sm90/fwd.cu"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
}
// The same with the accumulator overwritten (d = A·B): write-only operands, so the compiler never
// has to give d a value before the product (a value it may take from other registers in flight).
#line 126 "la_fwd_sm90/fwd.cu"
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
#line 146 "la_fwd_sm90/fwd.cu"

// Issues the cp.async copies of one chunk of a sequence tensor (BLOCK rows of W elements from
// src, row stride rs) into a swizzled tile at shared address dst; rows at or past `valid` are
// zero-filled.
template <int W, int BW>
__device__ __forceinline__ void load_tile(unsigned dst, const T *src, long long rs, int valid, int tid)
{
    constexpr int PV = W / 8; // 16-byte vectors per row
    constexpr int TOTAL = BLOCK * PV;
#pragma unroll
    for (int i = 0; i < (TOTAL + NT - 1) / NT; i++) {
        const int idx = tid + i * NT;
        if (TOTAL % NT == 0 || idx < TOTAL) {
            const int r = idx / PV, x = (idx % PV) * 8;
            const bool ok = r < valid;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst + tile_off<BW, BLOCK>(r, x)),
                         "l"(ok ? src + (long long)r * rs + x : src), "r"(ok ? 16 : 0)
                         : "memory");
        }
    }
}

// Stores two adjacent values in one 32-bit access.
__device__ __forceinline__ void store2(T *dst, float x0, float x1)
{
    *reinterpret_cast<unsigned *>(dst) = lj_pack2<T>(x0, x1);
}
__device__ __forceinline__ void sts32(unsigned addr, unsigned v)
{
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
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
    const unsigned sS = sVw + (DECAY ? V_BYTES : 0);
    float *sPow = reinterpret_cast<float *>(smem_raw + (sS + S_BYTES - lj_smem_addr(smem_raw))); // λ^k, k = 0..BLOCK

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int e0 = blockIdx.x * TILE_V, h = blockIdx.y, b = blockIdx.z;

    int n, slot;
    long long tok0 = 0;
    if constexpr (VARLEN) {
        const int *cu = reinterpret_cast<const int *>(p.cu_seqlens);
        tok0 = cu[b];
        n = cu[b + 1] - cu[b];
        slot = p.slots ? reinterpret_cast<const int *>(p.slots)[b] : b;
    } else {
        n = p.N;
        slot = b;
    }
    const long long bq = VARLEN ? 0 : (long long)b;
    if constexpr (REVERSE) tok0 += n > 0 ? n - 1 : 0;
    const long long dir = REVERSE ? -1 : 1;
    const T *q = reinterpret_cast<const T *>(p.q.ptr) + bq * p.q.s0 + h * p.q.s1 + tok0 * p.q.s2;
    const T *k = reinterpret_cast<const T *>(p.k.ptr) + bq * p.k.s0 + h * p.k.s1 + tok0 * p.k.s2;
    const T *v = reinterpret_cast<const T *>(p.v.ptr) + bq * p.v.s0 + h * p.v.s1 + tok0 * p.v.s2 + e0;
    T *o = reinterpret_cast<T *>(p.o.ptr) + bq * p.o.s0 + h * p.o.s1 + tok0 * p.o.s2 + e0;
    const long long qs = dir * p.q.s2, ks = dir * p.k.s2, vs = dir * p.v.s2, os = dir * p.o.s2;
    const int nchunks = (n + BLOCK - 1) / BLOCK;

    auto load_chunk = [&](int c) {
        const int st = c % STAGES;
        const long long t0 = (long long)c * BLOCK;
        const int valid = n - c * BLOCK;
        load_tile<D, BWQ>(sQ + st * Q_BYTES, q + t0 * qs, qs, valid, tid);
        load_tile<D, BWQ>(sK + st * Q_BYTES, k + t0 * ks, ks, valid, tid);
        load_tile<TILE_V, BWV>(sV + st * V_BYTES, v + t0 * vs, vs, valid, tid);
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nchunks) load_chunk(s);
        lj_cp_async_commit();
    }

    // λ^k for k = 0..BLOCK, and this thread's fixed factors: the causal decay mask of its score
    // entries (rows i = 16·warp + g (+8), columns j = 8·nt + 2·t4 (+1)) and λ^{i+1} of its rows.
    if constexpr (DECAY) {
        const float sh = reinterpret_cast<const float *>(p.decay)[h];
        for (int i = tid; i <= BLOCK; i += NT) sPow[i] = expf(-sh * (float)i);
    }
    __syncthreads();
    const int i0 = 16 * warp + g, i1 = i0 + 8;
    float mask[NSC];
#pragma unroll
    for (int nt = 0; nt < BLOCK / 8; nt++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int i = (r & 2) ? i1 : i0, j = nt * 8 + 2 * t4 + (r & 1);
            mask[nt * 4 + r] = j <= i ? (DECAY ? sPow[i - j] : 1.f) : 0.f;
        }
    const float rf0 = DECAY ? sPow[i0 + 1] : 1.f, rf1 = DECAY ? sPow[i1 + 1] : 1.f;

    // The state slice: st[mb][j*4 + r] is row d = 64 mb + 16 warp + g + 8 (r >> 1), column
    // e = 8 j + 2 t4 + (r & 1) of the D x TILE_V slice (the m64 accumulator layout).
    float st[MB][NACC];
#pragma unroll
    for (int mb = 0; mb < MB; mb++)
#pragma unroll
        for (int x = 0; x < NACC; x++) st[mb][x] = 0.f;
    if constexpr (HAS_INITIAL) {
        if (slot >= 0) {
            const float *s0 = reinterpret_cast<const float *>(p.s0.ptr) + (long long)slot * p.s0.s0 + h * p.s0.s1;
            const float in = GRAD_STATE ? 1.f / p.scale : 1.f;
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
#pragma unroll
                for (int x = 0; x < NACC; x++) {
                    const int d = 64 * mb + 16 * warp + g + 8 * ((x & 3) >> 1);
                    const int e = e0 + 8 * (x >> 2) + 2 * t4 + (x & 1);
                    st[mb][x] = in * s0[d * p.s0.s2 + e * p.s0.s3];
                }
        }
    }
    // The 16-bit state copy: rows d, columns e, MN-major B of Q S.
    auto state_to_smem = [&]() {
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
#pragma unroll
            for (int j = 0; j < TILE_V / 8; j++) {
                const int d = 64 * mb + 16 * warp + g, e = 8 * j + 2 * t4;
                sts32(sS + tile_off<BWV, D>(d, e), lj_pack2<T>(st[mb][4 * j], st[mb][4 * j + 1]));
                sts32(sS + tile_off<BWV, D>(d + 8, e), lj_pack2<T>(st[mb][4 * j + 2], st[mb][4 * j + 3]));
            }
        fence_async_smem();
    };
    // Before chunk c's products the register state is decayed by λ^L (λ^{L−1} for GRAD_STATE's
    // first chunk), right after its 16-bit copy is written: the state update then only adds, and
    // no register of an accumulator in flight is touched.
    auto decay_state = [&](int c) {
        if constexpr (DECAY) {
            if (c < nchunks) {
                const float dl = sPow[min(BLOCK, n - c * BLOCK) - (GRAD_STATE && c == 0 ? 1 : 0)];
#pragma unroll
                for (int mb = 0; mb < MB; mb++)
#pragma unroll
                    for (int x = 0; x < NACC; x++) st[mb][x] *= dl;
            }
        }
    };
    state_to_smem();
    decay_state(0);

    // Q Kᵀ of a chunk: issued first thing in the chunk, or with PREFETCH during the previous
    // chunk's tail (its outputs and state copy), so the tensor cores have it in flight there.
    float sc[NSC];
    auto issue_scores = [&](int c) {
        const int slotc = c % STAGES;
        const unsigned cQ = sQ + slotc * Q_BYTES, cK = sK + slotc * Q_BYTES;
        wg_fence();
        wg_ss64_z<0, 0>(sc, wg_desc<SWQ>(cQ, 16), wg_desc<SWQ>(cK, 16));
#pragma unroll
        for (int kk = 1; kk < D / 16; kk++) {
            const unsigned off = (kk * 16 / BWQ) * (BLOCK * SWQ) + (kk * 16 % BWQ) * 2;
            wg_ss64<0, 0>(sc, wg_desc<SWQ>(cQ + off, 16), wg_desc<SWQ>(cK + off, 16), 1);
        }
        wg_commit();
    };
    // With PREFETCH the products are issued unconditionally (for an empty sequence, and for the
    // chunk after the last), so none sits in a branch: a branch around wgmma makes ptxas
    // serialise them all. Those extra products read stale shared memory; their results are unused.
    if constexpr (PREFETCH) {
        lj_cp_async_wait<STAGES - 2>();
        fence_async_smem();
        __syncthreads(); // chunk 0 landed
        issue_scores(0);
        wg_wait<0>();
    }

    const float sigma = p.scale;
    for (int c = 0; c < nchunks; c++) {
        const int slotc = c % STAGES;
        const unsigned cQ = sQ + slotc * Q_BYTES, cK = sK + slotc * Q_BYTES, cV = sV + slotc * V_BYTES;
        const int L = min(BLOCK, n - c * BLOCK);
        const int u = GRAD_STATE && c == 0 ? 1 : 0;
        auto load_next = [&]() {
            const int nc = c + STAGES - 1;
            if (nc < nchunks) load_chunk(nc);
            lj_cp_async_commit();
        };
        if constexpr (!PREFETCH) {
            lj_cp_async_wait<STAGES - 2>();
            fence_async_smem();
            __syncthreads(); // chunk c landed; chunk c − 1's products and state copy are done
            load_next();
            issue_scores(c);
        }

        // The values weighted for the state update, λ^{L−1−j} on row j (rows past L are zero).
        unsigned sVs = cV;
        if constexpr (DECAY) {
            constexpr int VEC = V_BYTES / 16;
#pragma unroll
            for (int i = 0; i < (VEC + NT - 1) / NT; i++) {
                const int x = tid + i * NT;
                if (VEC % NT == 0 || x < VEC) {
                    const int row = (x * 16 % (BLOCK * SWV)) / SWV; // the swizzle stays in a row
                    const float w = sPow[max(L - 1 - row, 0)];
                    unsigned a0, a1, a2, a3;
                    asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(cV + x * 16));
                    unsigned wv[4] = {a0, a1, a2, a3};
#pragma unroll
                    for (int y = 0; y < 4; y++) {
                        T lo, hi;
                        lo.bits = (unsigned short)(wv[y] & 0xffff);
                        hi.bits = (unsigned short)(wv[y] >> 16);
                        wv[y] = lj_pack2<T>(lj_to_float(lo) * w, lj_to_float(hi) * w);
                    }
                    asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"r"(sVw + x * 16), "r"(wv[0]),
                                 "r"(wv[1]), "r"(wv[2]), "r"(wv[3])
                                 : "memory");
                }
            }
            fence_async_smem();
            sVs = sVw;
        }
        // V_w (and with PREFETCH the state copy) of every warp are written; with PREFETCH every
        // warp is also done with chunk c − 1's products, so its ring slot takes chunk c + STAGES − 1.
        if constexpr (DECAY || PREFETCH) __syncthreads();
        if constexpr (PREFETCH) load_next();

        // O = Q S₁₆ and S ← λ^L S + Kᵀ V_w (the state was decayed by λ^L when its copy was
        // written, so the update only adds).
        float oa[NACC];
#pragma unroll
        for (int mb = 0; mb < MB; mb++) fence_regs(st[mb]);
        wg_fence();
        wg_ss64_z<0, 1>(oa, wg_desc<SWQ>(cQ, 16), wg_desc<SWV>(sS, D * SWV));
#pragma unroll
        for (int kk = 1; kk < D / 16; kk++) {
            const unsigned off = (kk * 16 / BWQ) * (BLOCK * SWQ) + (kk * 16 % BWQ) * 2;
            wg_ss64<0, 1>(oa, wg_desc<SWQ>(cQ + off, 16), wg_desc<SWV>(sS + kk * 16 * SWV, D * SWV), 1);
        }
        wg_commit();
#pragma unroll
        for (int mb = 0; mb < MB; mb++)
#pragma unroll
            for (int kk = 0; kk < BLOCK / 16; kk++)
                wg_ss64<1, 1>(st[mb], wg_desc<SWQ>(cK + mb * (BLOCK * SWQ) + kk * 16 * SWQ, BLOCK * SWQ),
                                     wg_desc<SWV>(sVs + kk * 16 * SWV, BLOCK * SWV), 1);
        wg_commit();

        // The scores (with PREFETCH retired at the end of the previous iteration): mask and decay
        // them, round to the A operand of P V.
        if constexpr (!PREFETCH) wg_wait<2>();
        fence_regs(sc);
        unsigned pa[BLOCK / 16][4];
#pragma unroll
        for (int kk = 0; kk < BLOCK / 16; kk++) {
            pa[kk][0] = lj_pack2<T>(sc[8 * kk + 0] * mask[8 * kk + 0], sc[8 * kk + 1] * mask[8 * kk + 1]);
            pa[kk][1] = lj_pack2<T>(sc[8 * kk + 2] * mask[8 * kk + 2], sc[8 * kk + 3] * mask[8 * kk + 3]);
            pa[kk][2] = lj_pack2<T>(sc[8 * kk + 4] * mask[8 * kk + 4], sc[8 * kk + 5] * mask[8 * kk + 5]);
            pa[kk][3] = lj_pack2<T>(sc[8 * kk + 6] * mask[8 * kk + 6], sc[8 * kk + 7] * mask[8 * kk + 7]);
        }
        // Q S done: the inter-chunk term decays by λ^{i+1} (λ^i for GRAD_STATE's first chunk).
        wg_wait<1>();
        fence_regs(oa);
        if constexpr (DECAY) {
            const float f0 = u ? sPow[i0] : rf0, f1 = u ? sPow[i1] : rf1;
#pragma unroll
            for (int j = 0; j < TILE_V / 8; j++) {
                oa[4 * j] *= f0;
                oa[4 * j + 1] *= f0;
                oa[4 * j + 2] *= f1;
                oa[4 * j + 3] *= f1;
            }
        }
        fence_regs(oa);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BLOCK / 16; kk++)
            wg_rs64<1>(oa, pa[kk], wg_desc<SWV>(cV + kk * 16 * SWV, BLOCK * SWV), 1);
        wg_commit();

        // With PREFETCH the next chunk's scores go in while this chunk's tail runs.
        if constexpr (PREFETCH) {
            lj_cp_async_wait<STAGES - 2>();
            fence_async_smem();
            __syncthreads(); // chunk c + 1 landed
            issue_scores(c + 1);
            wg_wait<1>();
        } else {
            wg_wait<0>();
        }
        fence_regs(oa);
#pragma unroll
        for (int mb = 0; mb < MB; mb++) fence_regs(st[mb]);

        // Store σ·o for the rows inside the sequence.
        {
            T *o0 = o + (long long)(c * BLOCK + i0) * os + 2 * t4;
            T *o1 = o0 + 8 * os;
            const bool w0 = i0 < L, w1 = i1 < L;
#pragma unroll
            for (int j = 0; j < TILE_V / 8; j++) {
                if (w0) store2(o0 + j * 8, sigma * oa[4 * j], sigma * oa[4 * j + 1]);
                if (w1) store2(o1 + j * 8, sigma * oa[4 * j + 2], sigma * oa[4 * j + 3]);
            }
        }
        state_to_smem();
        decay_state(c + 1);
        // Nothing stays in flight across the loop's back edge: ptxas cannot follow a product
        // through it and would serialise every wgmma of the loop. The next chunk's scores have
        // had this chunk's tail to finish.
        if constexpr (PREFETCH) wg_wait<0>();
    }
    lj_cp_async_wait<0>();

    if constexpr (HAS_FINAL) {
        if (slot >= 0) {
            float *sn = reinterpret_cast<float *>(p.sn.ptr) + (long long)slot * p.sn.s0 + h * p.sn.s1;
            const float out = GRAD_STATE ? p.scale * (DECAY && n > 0 ? sPow[1] : 1.f) : 1.f;
#pragma unroll
            for (int mb = 0; mb < MB; mb++)
#pragma unroll
                for (int x = 0; x < NACC; x++) {
                    const int d = 64 * mb + 16 * warp + g + 8 * ((x & 3) >> 1);
                    const int e = e0 + 8 * (x >> 2) + 2 * t4 + (x & 1);
                    sn[d * p.sn.s2 + e * p.sn.s3] = out * st[mb][x];
                }
        }
    }
}
