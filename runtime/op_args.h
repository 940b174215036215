/* op_args.h — the argument path the ops share: the checks every op makes first, the views of
 * sequence tensors, decay rates and states into la_params, the device/aliasing checks of every
 * tensor of a call (element-level: see overlap.h), and checked mode's read-back of device values.
 * The forward and the backward run one path (lj_seq_begin, then lj_seq_finish) that differs only
 * by the tables of tensors each passes; decode uses the same pieces around its own layouts.
 * Internal to the ops; everything here runs on every call (the hot path): no allocation outside
 * checked mode, no Lua. */
#ifndef LAJIT_OP_ARGS_H
#define LAJIT_OP_ARGS_H

#include "context.h"
#include "la_params.h"
#include "lajit.h"
#include "tensor.h"

/* One sequence tensor of an op: q-like (width D) or v-like (width E), and where its view goes. */
typedef struct lj_seq_tensor {
    const char *name;
    const DLTensor *t;
    int v_like;
    la_tensor4 *out;
} lj_seq_tensor;

/* One optional state of an op ([P,H,D,E] or VK), where its view goes, and the problem flag that
 * says it is given. */
typedef struct lj_state_arg {
    const char *name;
    const DLTensor *t;
    la_tensor4 *out;
    int *flag;
} lj_state_arg;

/* Every tensor of a call (NULL for absent ones), with whether the op writes it. */
typedef struct lj_io_tensor {
    const char *name;
    const DLTensor *t;
    int output;
} lj_io_tensor;

typedef struct lj_seq_shape {
    lj_dtype dtype;
    lj_dtype out_dtype;      /* the dtype of the call's `mixed` tensor (dtype when there is none) */
    long long B, H, N, D, E; /* varlen: B = sequences, N = total tokens */
} lj_seq_shape;

/* A forward or backward call: its name for messages, the tensors it reads or writes. */
typedef struct lj_seq_call {
    const char *fn;       /* "lajit_attn_fwd" */
    const char *required; /* "q, k, v and o": every seqs[] tensor is required */
    lj_op op;
    uint32_t flags;
    const DLTensor *cu_seqlens, *s, *state_slots;
    const lj_seq_tensor *seqs; /* the first fixes shape and dtype, the first v-like one E */
    int n_seqs;
    const lj_state_arg *states; /* all of one pool size P, and of one dtype */
    int n_states;
    /* What LJ_SEQ_CALL leaves at 0 / NULL, for the forward to set: */
    int states16;      /* 16-bit states accepted (the forward); 0 (the backward): float32 only */
    const char *mixed; /* the seqs[] tensor that may pair a float32 side with a 16-bit one (the
                          forward's "o": fp32 q, k, v with a 16-bit o, or the reverse); every
                          other tensor has the first one's dtype */
} lj_seq_call;

/* The lj_seq_call of an entry point's arguments a (lajit_attn_fwd_args or lajit_attn_bwd_args:
 * flags, cu_seqlens, s and state_slots are fields of both), with the counts of the seqs and
 * states arrays taken from the arrays themselves rather than written out beside them. */
#define LJ_SEQ_CALL(fn, required, op, a, seqs, states)                                         \
    {                                                                                          \
        (fn), (required), (op), (a)->flags, (a)->cu_seqlens, (a)->s, (a)->state_slots, (seqs), \
            (int)(sizeof(seqs) / sizeof((seqs)[0])), (states),                                 \
            (int)(sizeof(states) / sizeof((states)[0])), 0, NULL                               \
    }

/* What every op checks first: arguments given, a struct_size this build knows, known flags, a
 * finite nonzero scale. struct_size is NULL when the arguments are. */
lajit_status lj_check_args(lj_env *env, const char *fn, const size_t *struct_size, size_t expected,
                           uint32_t flags, float scale);
/* Head dimensions the kernels support: multiples of 16 up to 256. */
lajit_status lj_check_head_dims(lj_env *env, long long D, long long E);
/* The decay rates s: float32 [H], or absent (*ptr = 0). */
lajit_status lj_view_decay(lj_env *env, const DLTensor *s, long long H, unsigned long long *ptr);
/* A state or pool: [P,H,D,E] (KV) or [P,H,E,D] (VK) as logical (slot, h, d, e) strides, of a
 * dtype of dtype_mask (LJ_TENSOR_F32 where only float32 is stored, LJ_TENSOR_FLOATS where a
 * 16-bit storage is served); its dtype into *dtype (may be NULL). *P < 0 accepts any pool size
 * and returns it. */
lajit_status lj_view_state(lj_env *env, const char *name, const DLTensor *t, long long *P,
                           long long H, long long D, long long E, int vk, unsigned dtype_mask,
                           lj_dtype *dtype, la_tensor4 *out);
/* Whether o's dtype may go with the inputs' (the same, or one float32 side); else an error naming
 * the tensor. */
lajit_status lj_check_out_dtype(lj_env *env, const char *name, lj_dtype in, lj_dtype out);

/* Every tensor on the context's device; outputs with distinct elements, sharing no element with
 * any other tensor of the call, except the pair (same_a, same_b) which may be the same view (an
 * in-place state). Tensors that merely interleave in one buffer pass. A refusal names both
 * tensors and says why. */
lajit_status lj_check_io(lajit_ctx *ctx, const lj_io_tensor *io, int n, const char *same_a,
                         const char *same_b);

/* Checked mode: s (finite, >= 0), cu_seqlens (0, non-decreasing, ending at total_tokens) and the
 * first n_slots slots (-1, or a slot in [0, P) given as itself or as LAJIT_SLOT_FRESH(slot); no
 * slot named twice), read back from the device. */
lajit_status lj_check_device_values(lajit_ctx *ctx, const la_params *lp, int n_slots,
                                    long long total_tokens, void *stream);

/* The forward's and backward's shared path, in two halves around the op's own extras.
 * lj_seq_begin zeroes *p and *lp (the tables' out/flag pointers point into them), then views the
 * sequence tensors, head dims, decay, states (one pool size, returned in *P) and state_slots.
 * lj_seq_finish checks every tensor of io, fills the sizes of p and lp and, in checked mode,
 * validates the device values. */
lajit_status lj_seq_begin(lj_env *env, const lj_seq_call *c, lj_problem *p, la_params *lp,
                          lj_seq_shape *sh, long long *P);
lajit_status lj_seq_finish(lajit_ctx *ctx, const lj_io_tensor *io, int n_io, const char *same_a,
                           const char *same_b, const lj_seq_shape *sh, long long P, float scale,
                           void *stream, lj_problem *p, la_params *lp);

/* lajit_attn_state_scan (scan_op.c) with one more output for the runtime's own use: when
 * total_lengths is given (int64 [1] for [P] lengths, [B] for [P, B] ones), each lengths row's
 * sum Σ_j n_j — what the log2(P)-step exchange of context parallelism carries beside a combined
 * state (cp_exchange.c). */
lajit_status lj_state_scan(lajit_ctx *ctx, const lajit_attn_state_scan_args *a,
                           DLTensor *total_lengths);
/* n rows of w floats (w a multiple of 4), compact at `rows`, summed in row order into `sum` (w
 * floats): the state scan with no decay over [n, 1, 1, 1, w] states and zero lengths, so the bits
 * repeat — the sum of per-rank or per-row parts of ds. scratch holds n rows (the scan's incoming
 * states, not read) and zeros n int64 lengths (written here). Asynchronous on stream. */
lajit_status lj_sum_rows(lajit_ctx *ctx, CUdeviceptr rows, int64_t n, int64_t w,
                         CUdeviceptr scratch, CUdeviceptr zeros, CUdeviceptr sum, void *stream);

/* Copies between a pool of states and a batch of them by slot (pool_op.c, the custom family
 * la_state_pool), for context parallelism over varlen batches. pool float32 [P, H, R, C] and the
 * batch float32 [n, H, R, C] (unit last stride, 16-byte aligned rows: the rules of the scan's
 * states; R, C = D, E or E, D), slots int32 [n] on the device in the LAJIT_SLOT_* encoding.
 * Gather: dst[i] = pool[s] when slots[i] = s >= 0, zero when slots[i] is -1 or FRESH(s) (a fresh
 * slot is not read; with fresh_reads it is: the backward's dS_N of a fresh sequence). Scatter:
 * pool[s] = src[i] when slots[i] = s >= 0 or FRESH(s) (with fresh_writes; without it a fresh
 * slot is not written: the backward's dS_0), nothing for -1. Slots within [0, P) (and distinct
 * in a scatter) are the caller's duty, refused otherwise in checked mode. Asynchronous, no
 * allocation, graph-capturable; n = 0 launches nothing. */
lajit_status lj_state_pool_gather(lajit_ctx *ctx, const DLTensor *pool, const DLTensor *slots,
                                  DLTensor *dst, int fresh_reads, void *stream);
lajit_status lj_state_pool_scatter(lajit_ctx *ctx, const DLTensor *src, const DLTensor *slots,
                                   DLTensor *pool, int fresh_writes, void *stream);

/* The backward's decay gradient by segments of one long sequence (bwd_segments.c): the number of
 * segments lajit_attn_bwd should use for a, already checked, with H heads, N tokens and value
 * width E (0: the plain passes), and the call that runs them. */
int lj_bwd_segments(lajit_ctx *ctx, const lajit_attn_bwd_args *a, long long H, long long N,
                    long long E);
/* The segments of each of `rows` sequences of N tokens with H heads of value width E, the rows
 * walked one after another, by a setting (0: the automatic choice — about the SMs' worth of
 * 64-column CTAs in a row's calls, segments of at least 4,096 tokens, none where the plain
 * passes' rows · H · E/64 CTAs already fill half the SMs or where that leaves fewer than two
 * segments a row; 1: none; n >= 2: n), at most N; 0 for
 * none. Shared by the backward's ds (LAJIT_DS_SEGMENTS) and context parallelism
 * (LAJIT_CP_SEGMENTS). */
int lj_segments_for(lajit_ctx *ctx, int setting, long long rows, long long H, long long N,
                    long long E);
lajit_status lj_bwd_ds_by_segments(lajit_ctx *ctx, const lajit_attn_bwd_args *a, int P, long long B,
                                   long long H, long long N, long long D, long long E);

#endif
