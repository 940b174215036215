// seq.cuh — the prologue the chunk kernels share (la_fwd, la_fwd_sm90, la_bwd's ds): which
// sequence a CTA walks (its length, first token and state slot, from cu_seqlens and slots when
// varlen). The kernels form their row pointers from it themselves: a helper taking the tensor
// view changed la_fwd's register allocation.
#ifndef LAJIT_SEQ_CUH
#define LAJIT_SEQ_CUH

#include "la_params.h"

// Sequence b of a launch: n tokens from token tok0 (the last token when walked in REVERSE), batch
// index bq of the tensors (0 for varlen: one packed batch), and its state slots: `slot` is read as
// the initial state (−1: none, start from zero) and `slot_out` receives the final state (−1: not
// written). A varlen slot index x (include/lajit.h) is decoded here, once for every family:
//     x >= 0   read slot x, write slot x
//     x == −1  read nothing, write nothing                       (LAJIT_SLOT_SKIP)
//     x <= −2  read nothing (zero state), write slot −2 − x      (LAJIT_SLOT_FRESH(s))
// Kernels that read a state use `slot` and kernels that write one use `slot_out`, so a kernel that
// knows only `slot` (it existed first) treats a fresh slot as −1: never reads or writes garbage.
struct lj_seq {
    int n, slot, slot_out;
    long long tok0, bq;
};

// The slot decoding of lj_seq_of, for kernels that do not walk sequences (la_decode's rows).
__device__ __forceinline__ void lj_slot_decode(int x, int &slot, int &slot_out)
{
    slot = x >= 0 ? x : -1;
    slot_out = x >= -1 ? x : -2 - x;
}

// Sequence b's slots again (lj_seq_of's decoding): for a kernel that needs the written slot only
// at its end, where reading it again costs less than a register held over the whole walk.
template <bool VARLEN>
__device__ __forceinline__ void lj_seq_slots(unsigned long long slots, int b, int &slot, int &slot_out)
{
    if constexpr (VARLEN) {
        lj_slot_decode(slots ? reinterpret_cast<const int *>(slots)[b] : b, slot, slot_out);
    } else {
        slot = slot_out = b;
    }
}

// The fields are taken by value rather than through a reference to the kernel's argument.
template <bool VARLEN, bool REVERSE>
__device__ __forceinline__ lj_seq lj_seq_of(unsigned long long cu_seqlens, unsigned long long slots, int N, int b)
{
    lj_seq s;
    s.tok0 = 0;
    if constexpr (VARLEN) {
        const int *cu = reinterpret_cast<const int *>(cu_seqlens);
        s.tok0 = cu[b];
        s.n = cu[b + 1] - cu[b];
    } else {
        s.n = N;
    }
    lj_seq_slots<VARLEN>(slots, b, s.slot, s.slot_out);
    s.bq = VARLEN ? 0 : (long long)b;
    // Walking backwards is walking forwards over a view that starts at the last token with
    // negated token strides.
    if constexpr (REVERSE) s.tok0 += s.n > 0 ? s.n - 1 : 0;
    return s;
}

#endif
