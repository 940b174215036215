// seq.cuh — the prologue the chunk kernels share (la_fwd, la_fwd_sm90, la_bwd's ds): which
// sequence a CTA walks (its length, first token and state slot, from cu_seqlens and slots when
// varlen). The kernels form their row pointers from it themselves: a helper taking the tensor
// view changed la_fwd's register allocation.
#ifndef LAJIT_SEQ_CUH
#define LAJIT_SEQ_CUH

#include "la_params.h"

// Sequence b of a launch: n tokens from token tok0 (the last token when walked in REVERSE), state
// slot `slot` (−1: no initial state read, no final state written), batch index bq of the tensors
// (0 for varlen: one packed batch).
struct lj_seq {
    int n, slot;
    long long tok0, bq;
};

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
        s.slot = slots ? reinterpret_cast<const int *>(slots)[b] : b;
    } else {
        s.n = N;
        s.slot = b;
    }
    s.bq = VARLEN ? 0 : (long long)b;
    // Walking backwards is walking forwards over a view that starts at the last token with
    // negated token strides.
    if constexpr (REVERSE) s.tok0 += s.n > 0 ? s.n - 1 : 0;
    return s;
}

#endif
