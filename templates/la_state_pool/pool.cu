// pool.cu (la_state_pool) — copies between a pool of states and a batch of them by slot index.
//
// For each state i of the batch (slots[i] in the encoding of include/lajit.h's LAJIT_SLOT_*):
//     gather  (scatter == 0):  states[i] ← pool[s] if slots[i] = s >= 0, else 0 (−1, or
//                              LAJIT_SLOT_FRESH(s): a fresh slot is not read)
//     scatter (scatter != 0):  pool[s] ← states[i] if slots[i] = s >= 0 or LAJIT_SLOT_FRESH(s);
//                              nothing for −1
// unless `fresh` says otherwise: 1 makes LAJIT_SLOT_FRESH(s) its slot s in a gather too (the
// backward's dS_N is read from a fresh sequence's slot), 0 makes it none in a scatter too (the
// backward's dS_0 of a fresh sequence is not written).
// A slot outside [0, P) is the caller's error (checked mode refuses it, runtime/pool_op.c); the
// kernel treats one as −1 so that it never touches memory outside the pool.
//
// One thread copies VEC adjacent floats of one row of one (i, h) state: grid {N, ⌈R·C / (VEC ·
// THREADS)⌉, H}, N on x because a batch may hold more than the 65535 states of y or z. Each
// element is written by one thread; two batch states naming one slot in a scatter race (the
// caller's duty, refused in checked mode).
#include "common/args.cuh"

namespace {

constexpr int THREADS = ${THREADS}; // threads per CTA, one vector of a state each
constexpr int R = ${problem.R};     // rows of a stored state (D, or E with VK)
constexpr int C = ${problem.C};     // columns of a stored state: unit stride
constexpr int VEC = ${VEC};         // floats per access (the spec: 4 when C % 4 == 0)
constexpr int ITEMS = ${ITEMS};     // vectors of one state (the spec's count, checked below)

static_assert(C % VEC == 0 && ITEMS * VEC == R * C, "the spec's vector count covers a state");
static_assert(VEC == 1 || VEC == 2 || VEC == 4, "1, 2 or 4 floats per access");

// VEC floats, aligned so that a load or store of one is a single vector access (the declaration
// makes addresses and row strides multiples of 16 bytes, and c is a multiple of VEC).
struct alignas(4 * VEC) vecf {
    float x[VEC];
};

} // namespace

extern "C" __global__ void __launch_bounds__(THREADS)
    la_state_pool(lj_arg<4> pool, lj_arg<1> slots, lj_arg<4> states, int scatter, int fresh_mode)
{
    const long long i = blockIdx.x, h = blockIdx.z;
    const int item = blockIdx.y * THREADS + threadIdx.x;
    if (item >= ITEMS)
        return;
    const long long r = item / (C / VEC), c = (long long)(item % (C / VEC)) * VEC;
    // The slot: s >= 0 as itself, FRESH(s) = −2 − s, −1 none; out of range is none too.
    const long long x = static_cast<const int *>(slots.ptr)[i * slots.stride[0]];
    const bool fresh = x <= -2;
    const long long slot = fresh ? -2 - x : x;
    // fresh_mode: −1 the direction's rule (a gather skips a fresh slot, a scatter writes it), 0 a
    // fresh slot is none, 1 it is its slot.
    const bool fresh_counts = fresh_mode < 0 ? scatter != 0 : fresh_mode != 0;
    const bool in_pool = slot >= 0 && slot < pool.size[0] && (!fresh || fresh_counts);
    const long long s = in_pool ? slot : 0; // never an address outside the pool

    vecf *st = reinterpret_cast<vecf *>(static_cast<float *>(states.ptr) + i * states.stride[0] +
                                        h * states.stride[1] + r * states.stride[2] + c);
    vecf *pl = reinterpret_cast<vecf *>(static_cast<float *>(pool.ptr) + s * pool.stride[0] +
                                        h * pool.stride[1] + r * pool.stride[2] + c);
    if (scatter) {
        if (in_pool)
            *pl = *st;
    } else {
        vecf v;
#pragma unroll
        for (int k = 0; k < VEC; k++)
            v.x[k] = 0.f;
        if (in_pool)
            v = *pl;
        *st = v;
    }
}
