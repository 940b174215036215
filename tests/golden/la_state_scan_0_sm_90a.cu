#line 1 "la_state_scan/scan.cu"
// scan.cu (la_state_scan) — the scan of span states that context parallelism exchanges.
//
// Per batch row b and head h, with P spans of n_j tokens, local states M_j and λ = exp(−s_h):
//     X ← initial_state (or 0);  for each span j in walk order:  out_j = X;  X ← λ^{n_j} X + M_j
//     final_state ← X
// walked j = 0..P−1, or P−1..0 when `reverse` is nonzero (the backward's gradient states), and
// when total_lengths64 is given, Σ_j n_j of each lengths row into it (what the log2(P)-step
// exchange of context parallelism passes on beside a combined state: runtime/cp_exchange.c).
// A length n_j = −1 marks a span that starts a new sequence (a varlen batch whose sequences cross
// spans): the carry does not pass through it, X ← M_j (λ^{n_j} taken as 0, with decay or
// without), and a lengths row holding one has the total −1 (the combined span starts a sequence
// too). The lengths are therefore read with and without decay.
// include/lajit.h (lajit_attn_state_scan) says what X is in DESIGN.md's terms each way.
//
// The walk is elementwise over a state's R×C elements (D×E, or E×D stored VK): one thread owns
// VEC adjacent floats of one row of the (b, h) state and carries them through all P spans in
// fp32; grid {⌈R·C / (VEC·THREADS)⌉, H, B}. Each span costs a thread one 16-byte load of M_j and
// one store of out_j, so the kernel streams P·B·H·R·C·8 bytes; to keep bytes in flight a thread
// issues the loads (and λ^{n_j}) of UNROLL spans before it uses the first. Every element is read
// and written by its one thread in a fixed order: results are deterministic.
#include "common/args.cuh"

namespace {

constexpr int THREADS = 256; // threads per CTA, one vector of a state each
constexpr int UNROLL = 4;   // spans whose loads are in flight at once
constexpr int R = 128;     // rows of a stored state (D, or E with VK)
constexpr int C = 128;     // columns of a stored state (E, or D with VK): unit stride
constexpr int VEC = 4;         // floats per access (the spec: 4 when C % 4 == 0)
constexpr int ITEMS = 4096;     // vectors of one state (the spec's count, checked below)
constexpr bool HAS_S = true;    // s given: λ = exp(−s_h); else λ = 1 (lengths still mark resets)
constexpr bool LEN64 = false;    // the lengths are lengths64 (int64), else lengths (int32)
constexpr bool HAS_INITIAL = false; // the carry starts from initial_state, else 0
constexpr bool HAS_FINAL = true;     // the carry after the walk is written to final_state
constexpr bool HAS_TOTAL = false;     // Σ_j n_j of each lengths row is written to total_lengths64

static_assert(C % VEC == 0 && ITEMS * VEC == R * C, "the spec's vector count covers a state");
static_assert(VEC == 1 || VEC == 2 || VEC == 4, "1, 2 or 4 floats per access");

// VEC floats, aligned so that a load or store of one is a single vector access (the declaration
// makes addresses and row strides multiples of 16 bytes, and c is a multiple of VEC).
struct alignas(4 * VEC) vecf {
    float x[VEC];
};

__device__ __forceinline__ vecf load(const float *p)
{
    return *reinterpret_cast<const vecf *>(p);
}

__device__ __forceinline__ void store(float *p, const vecf &v)
{
    *reinterpret_cast<vecf *>(p) = v;
}

} // namespace

extern "C" __global__ void __launch_bounds__(THREADS)
    la_state_scan(lj_arg<5> local_states, lj_arg<2> lengths, lj_arg<2> lengths64, lj_arg<1> s,
                  lj_arg<4> initial_state, lj_arg<5> incoming_states, lj_arg<4> final_state,
                  lj_arg<1> total_lengths64, int reverse)
{
    const int item = blockIdx.x * THREADS + threadIdx.x;
    const long long h = blockIdx.y, b = blockIdx.z;
    // The total length of row b's spans, by one thread of the row's first head (LB rows: b < LB).
    if (HAS_TOTAL && item == 0 && h == 0) {
        const lj_arg<2> &len = LEN64 ? lengths64 : lengths;
        if (b < len.size[1]) {
            long long sum = 0;
            bool starts = false; // a span of the row starts a new sequence: the total is −1
            for (long long j = 0; j < len.size[0]; j++) {
                const long long at = b * len.stride[1] + j * len.stride[0];
                const long long n = LEN64 ? static_cast<const long long *>(len.ptr)[at]
                                          : (long long)static_cast<const int *>(len.ptr)[at];
                starts = starts || n == -1;
                sum += n;
            }
            static_cast<long long *>(total_lengths64.ptr)[b * total_lengths64.stride[0]] =
                starts ? -1 : sum;
        }
    }
    if (item >= ITEMS)
        return;
    const long long r = item / (C / VEC), c = (long long)(item % (C / VEC)) * VEC;
    const long long P = local_states.size[0];

    const float *m = static_cast<const float *>(local_states.ptr) + b * local_states.stride[1] +
                     h * local_states.stride[2] + r * local_states.stride[3] + c;
    float *out = static_cast<float *>(incoming_states.ptr) + b * incoming_states.stride[1] +
                 h * incoming_states.stride[2] + r * incoming_states.stride[3] + c;
    const long long m_step = local_states.stride[0], out_step = incoming_states.stride[0];

    // Span lengths: one per span ([P, 1]) or per span and row ([P, B]); b < LB picks the row's
    // column (LB is 1 or B: the row index stays inside the tensor whatever LB is).
    const lj_arg<2> &len = LEN64 ? lengths64 : lengths;
    const long long lb = b < len.size[1] ? b : 0;
    const long long len_base = lb * len.stride[1], len_step = len.stride[0];
    const float rate = HAS_S ? static_cast<const float *>(s.ptr)[h] : 0.f;

    vecf carry;
    if (HAS_INITIAL) {
        carry = load(static_cast<const float *>(initial_state.ptr) + b * initial_state.stride[0] +
                     h * initial_state.stride[1] + r * initial_state.stride[2] + c);
    } else {
#pragma unroll
        for (int v = 0; v < VEC; v++)
            carry.x[v] = 0.f;
    }

    for (long long k0 = 0; k0 < P; k0 += UNROLL) {
        vecf mv[UNROLL];
        float lam[UNROLL];
        bool starts[UNROLL]; // n_j = −1: the span starts a new sequence, X ← M_j
        // Loads of UNROLL spans first: none depends on the carry, so they are all in flight
        // before the first multiply waits on one.
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const long long k = k0 + u;
            lam[u] = 1.f;
            starts[u] = false;
#pragma unroll
            for (int v = 0; v < VEC; v++)
                mv[u].x[v] = 0.f;
            if (k < P) {
                const long long j = reverse ? P - 1 - k : k;
                mv[u] = load(m + j * m_step);
                const long long at = len_base + j * len_step;
                const long long n = LEN64 ? static_cast<const long long *>(len.ptr)[at]
                                          : (long long)static_cast<const int *>(len.ptr)[at];
                starts[u] = n == -1;
                // λ^{n} = exp(−s·n) in fp32: n up to 2^63 converts with a relative error of
                // 2^−24, and exp(−s·n) is 0 in fp32 long before that error matters.
                if (HAS_S)
                    lam[u] = expf(-rate * (float)n);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const long long k = k0 + u;
            if (k < P) {
                const long long j = reverse ? P - 1 - k : k;
                store(out + j * out_step, carry);
                // A reset selects M_j rather than multiplying by 0: an infinite carry (or a
                // NaN one) from the sequence before stays there.
#pragma unroll
                for (int v = 0; v < VEC; v++)
                    carry.x[v] = starts[u] ? mv[u].x[v]
                                 : HAS_S   ? fmaf(lam[u], carry.x[v], mv[u].x[v])
                                           : carry.x[v] + mv[u].x[v];
            }
        }
    }

    if (HAS_FINAL)
        store(static_cast<float *>(final_state.ptr) + b * final_state.stride[0] +
                  h * final_state.stride[1] + r * final_state.stride[2] + c,
              carry);
}
