/* la_params.h — the one kernel argument of every Lightning Attention kernel, shared verbatim by
 * the host (C, runtime/ops.c) and the device (CUDA, given to NVRTC as an in-memory header).
 *
 * Every kernel takes `const la_params p` by value (one __grid_constant__-able argument), so the
 * host fills one struct and passes one pointer to cuLaunchKernel: no per-family argument lists.
 * Only builtin C types are used so this compiles with no toolkit or libc header. Pointers are
 * device addresses; strides count elements. The host guarantees every size is at most
 * 2^31 − 2^16 (an int, and n + BLOCK − 1 cannot overflow) and every element offset fits a signed
 * 64-bit integer without wrapping the address space, so a tensor may span 2^31 elements or more:
 * kernels form per-(b, h), per-sequence, per-token and per-chunk offsets in long long. Int offsets
 * are allowed only inside a tile the host bounds: decode's T steps of one row and one state's
 * D x E values span fewer than 2^31 elements (runtime/tensor.h: lj_tensor_tile_span). Unused
 * fields are zero. */
#ifndef LA_PARAMS_H
#define LA_PARAMS_H

typedef struct la_tensor4 {
    unsigned long long ptr; /* device address, 0 when absent */
    long long s0, s1, s2, s3; /* strides of the four logical dimensions, in elements */
} la_tensor4;

typedef struct la_params {
    /* Sequence tensors, logical shape [B, H, N, D|E] (b, h, t, d). Varlen: B = 1 and t indexes
     * the packed token. Decode: [B, H, T, D|E] with t the step. */
    la_tensor4 q, k, v, o;
    la_tensor4 dout, dq, dk, dv; /* backward */
    /* States, logical shape [B or P, H, D, E] (slot, h, d, e); the VK layout is expressed by
     * strides (s2 = 1, s3 = D) and also baked into the kernel as a constant. */
    la_tensor4 s0;  /* initial state (read) */
    la_tensor4 sn;  /* final state (written; may alias s0) */
    la_tensor4 ds0; /* backward: gradient of the initial state (written) */
    la_tensor4 dsn; /* backward: gradient of the final state (read) */
    /* Decode: optional per-step states [B, T, H, D, E] flattened as (b*T + step, h, d, e). */
    la_tensor4 step_states;
    /* A pass's extra sequence operand, [B, H, N, D]: the backward's dq pass that also computes
     * ds reads the op's q here (templates/la_bwd/family.lua's roles). */
    la_tensor4 x;
    unsigned long long decay;      /* float [H]: s_h >= 0, 0 when no decay */
    unsigned long long dsdecay;    /* float [H]: gradient of s (written), 0 when not wanted */
    unsigned long long cu_seqlens; /* int [nseq + 1], 0 when not varlen */
    unsigned long long slots;      /* int [nseq or B]: state slot per sequence/row, -1 skips */
    unsigned long long workspace;  /* caller-provided scratch, 0 when none */
    unsigned long long splitws;    /* a split scan's counters and flags (common/split.cuh) */
    unsigned long long splitst;    /* ... and its chained states; both 0 when not split */
    int B, H, N, D, E, T;          /* T: decode steps per row */
    int nseq;                      /* varlen: number of sequences; else B */
    int P;                         /* pool slots (states' first dimension) */
    float scale;                   /* sigma */
    int pad_;
} la_params;

#endif
