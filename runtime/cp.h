/* cp.h — context parallelism's internals, shared by the op's steps (cp_op.c) and the exchanges
 * (cp_exchange.c): one rank's call and buffers, the transports (NCCL, or copies between simulated
 * ranks) and the two exchanges that turn every rank's carry into the carry entering each rank.
 *
 * An exchange runs in rounds; each round is a transfer (a collective or point-to-point step of
 * the transport) followed by this rank's compute. The NCCL path runs one rank's rounds in order;
 * the simulated ranks run each round's transfers for every rank before any rank's compute, as
 * real ranks would see them. */
#ifndef LAJIT_CP_H
#define LAJIT_CP_H

#include "context.h"

/* One rank's call, forward or backward, in common terms (the other direction's fields NULL). */
typedef struct cp_call {
    const char *fn;
    int bwd;
    const DLTensor *q, *k, *v;
    DLTensor *o;                 /* forward */
    const DLTensor *dout;        /* backward */
    DLTensor *dq, *dk, *dv, *ds; /* backward */
    const DLTensor *s;
    float scale;
    const DLTensor *initial_state;  /* rank 0's S_0 */
    DLTensor *final_state;          /* forward: S_N */
    DLTensor *d_initial_state;      /* backward: rank 0's dS_0 */
    const DLTensor *d_final_state;  /* backward: the last rank's dS_N */
    DLTensor *save_incoming;        /* forward: S_{a_r} written here for the backward */
    const DLTensor *saved_incoming; /* backward: the forward's S_{a_r}; the forward's local
                                       state and exchange are then skipped */
    const DLTensor *cu_seqlens;     /* varlen: this rank's pieces of the packed batch */
    const DLTensor *state_slots;    /* varlen: the pools' slot of each piece */
    int cont_in, cont_out;          /* varlen: the first piece continues the previous rank's last,
                                      the last continues on the next rank */
    uint32_t flags;                 /* LAJIT_STATE_VK only: what the ops are given */
    int logstep;                    /* the exchange: 0 all-gather, 1 log2(P)-step scan */
    void *stream;
} cp_call;

/* One rank's call: its arguments, its place, the sizes every rank must share and its buffer.
 *
 * All-gather: [P][slot] exchange slots (slot: the float32 state padded to 16 bytes, then the span
 * length as an int64 and 8 bytes of padding), the scan's [P] incoming states per direction.
 * Log-step: four slots R_A, A, R_T, T (the running carry in A or T, what arrives just below it),
 * two states of scratch for the combine's unused per-span outputs, one incoming state per
 * direction.
 * Backward with ds: [P][ds_slot] parts of ds, the scan's [P][ds_slot] and their sum. */
typedef struct cp_rank {
    cp_call c;
    int rank, P, vk;
    int64_t B, H, N, D, E;  /* N: this rank's n_r */
    size_t state_bytes;     /* B·H·D·E·4 */
    size_t slot;            /* bytes of one exchange slot (state and length) */
    size_t len_off;         /* the length's offset inside a slot */
    size_t ds_slot;         /* bytes per rank of ds's exchange: H floats, padded to 16 bytes */
    CUdeviceptr base;       /* the rank's buffer */
    CUdeviceptr carry;      /* the slot cp_local writes: all-gather, slot `rank`; log-step, A */
    CUdeviceptr gather;     /* all-gather: [P][slot]; log-step: the slots R_A, A, R_T, T */
    CUdeviceptr scratch;    /* log-step: 2 states (the combine's per-span outputs) */
    CUdeviceptr incoming;   /* forward direction's incoming states: [P] or [1] */
    CUdeviceptr incoming_g; /* backward: the gradient direction's, [P] or [1] */
    CUdeviceptr ds_gather;  /* backward with ds */
    CUdeviceptr own;        /* log-step: the slot holding this rank's running carry (A or T) */
    /* Varlen (cp_varlen.c): the rank's pieces (sequences or parts of them), the state of one,
     * and its regions: slot arrays (identity; the caller's with the continued pieces' entries
     * set to −1, for reading and for writing) and pools of one state per piece (initial and
     * final states, the gradient direction's dS_N, local dS_0 and dS_0). */
    int64_t pieces;
    size_t piece_state;
    CUdeviceptr v_ids, v_slots_in, v_slots_out, v_in, v_fin, v_dsn, v_gc, v_ds0;
    /* The forward by segments (cp_segments.c): seg_n segments of seg_len tokens as one batched
     * call and a tail of seg_tail tokens (0: none), their local states W and incoming states IN
     * (one state each) and their lengths (int32). seg_n = 0: the span in one piece. */
    int64_t seg_n, seg_len, seg_tail;
    CUdeviceptr s_w, s_in, s_lens;
} cp_rank;

/* The transport of the exchanges. In the simulated one, a transfer is the receiving rank's
 * copies from the sending ranks' buffers; the sender does nothing. */
typedef struct cp_transport {
    /* Every rank's `bytes` at base + rank·bytes (this rank's: base + r->rank·bytes) into every
     * rank's base (an in-place all-gather). */
    lajit_status (*gather)(lajit_ctx *ctx, const cp_rank *r, CUdeviceptr base, size_t bytes,
                           void *user);
    /* One point-to-point round: this rank's own slot (r->own, r->slot bytes) to rank `to` and
     * a slot from rank `from` (that rank's own) into dst; −1: no send, no receive. */
    lajit_status (*sendrecv)(lajit_ctx *ctx, const cp_rank *r, int to, CUdeviceptr dst, int from,
                             void *user);
    /* Rank root's own slot into every rank's dst (r->slot bytes). */
    lajit_status (*broadcast)(lajit_ctx *ctx, const cp_rank *r, CUdeviceptr dst, int root,
                              void *user);
    void *user;
} cp_transport;

/* ---- cp_exchange.c ---------------------------------------------------------------------------- */

/* The exchange's choice when the call does not force one: the all-gather up to this many ranks
 * (a node's GPUs on NVLink, where P states cost less than log2(P) dependent steps), the log-step
 * scan beyond (docs/notes/context_parallel.md has the model and the crossover). */
#define LJ_CP_ALLGATHER_MAX_P 8

/* The rank's buffer in bytes (0 on overflow) and its regions placed from base; sets r->carry. */
size_t lj_cp_rank_bytes(const cp_rank *r);
void lj_cp_place(cp_rank *r, CUdeviceptr base);

/* The rounds of one exchange of direction grad (0: the forward's states, S_{a_r}; 1: the
 * gradient states, H_r, walked from the last rank), given every rank's carry in r->carry.
 * want_final: the forward's S_N into r->c.final_state (on every rank, or — log-step — on none). */
int lj_cp_exchange_rounds(const cp_rank *r, int want_final);
/* Round i: the transfer, then this rank's compute. After the last round the state entering
 * the span is at lj_cp_incoming(r, grad) (unless the rank is first in walk order: S_0 or dS_N,
 * which it holds itself). */
lajit_status lj_cp_exchange_transfer(lajit_ctx *ctx, cp_rank *r, int grad, int want_final, int i,
                                     const cp_transport *t);
lajit_status lj_cp_exchange_compute(lajit_ctx *ctx, cp_rank *r, int grad, int want_final, int i);
CUdeviceptr lj_cp_incoming(const cp_rank *r, int grad);
/* Whether a forward-direction state enters r's span from another rank (every rank but 0; varlen:
 * a first piece that continues), and where it is: the backward's saved copy of the forward's,
 * when given, else what this call's exchange computed. */
int lj_cp_receives(const cp_rank *r);
CUdeviceptr lj_cp_entering(const cp_rank *r);

/* ds's parts (one ds_slot per rank at r->ds_gather + rank·ds_slot) all-gathered, then summed in
 * rank order into r->c.ds. */
lajit_status lj_cp_ds_transfer(lajit_ctx *ctx, cp_rank *r, const cp_transport *t);
lajit_status lj_cp_ds_sum(lajit_ctx *ctx, const cp_rank *r);

/* The transports: NCCL (user: cp_nccl_user) and simulated ranks (user: the cp_rank array). */
typedef struct cp_nccl_user {
    const lj_nccl *nccl;
    lj_nccl_comm comm;
} cp_nccl_user;
extern const cp_transport lj_cp_nccl_transport; /* .user to be set */
extern const cp_transport lj_cp_sim_transport;  /* .user to be set */

/* ---- cp_varlen.c ------------------------------------------------------------------------------ */

/* Varlen calls: the checks of the pieces, the bytes of the varlen regions (0 on overflow) and
 * their placement from base, the local steps (the carry of the last piece, or in the gradient
 * direction of the first, into r->carry with the length or −1 for a chain that starts here), and
 * the span's outputs or gradients from the incoming states. */
lajit_status lj_cp_varlen_check(lj_env *env, cp_rank *r);
size_t lj_cp_varlen_bytes(const cp_rank *r);
void lj_cp_varlen_place(cp_rank *r, CUdeviceptr base);
lajit_status lj_cp_varlen_local(lajit_ctx *ctx, cp_rank *r, int grad);
lajit_status lj_cp_varlen_fwd_outputs(lajit_ctx *ctx, cp_rank *r);
lajit_status lj_cp_varlen_bwd_grads(lajit_ctx *ctx, cp_rank *r);

/* ---- cp_segments.c ----------------------------------------------------------------------------- */

/* The forward over a dense span (each batch row in turn) cut into segments walked side by side,
 * as the one-GPU forward splits a long sequence, but with the split's two phases on either side
 * of the exchange: the segments' local states (k and v read once) give the span's carry, and
 * after the exchange the outputs pass starts each segment from its own incoming state — so k and
 * v are read twice in all, not three times (a state-only pass, then a forward that splits
 * again). lj_cp_segments_plan sets r's seg_* (LAJIT_CP_SEGMENTS; none for the backward, varlen
 * or empty spans); the buffer's regions follow from them. */
void lj_cp_segments_plan(lajit_ctx *ctx, cp_rank *r);
int64_t lj_cp_segments_spans(const cp_rank *r); /* segments and tail: the states W and IN hold */
lajit_status lj_cp_segments_local(lajit_ctx *ctx, const cp_rank *r);
lajit_status lj_cp_segments_outputs(lajit_ctx *ctx, const cp_rank *r);

/* Compact float32 states of r's shape at p: [n, B, H, R, C] (all spans), or with n = 0 one
 * [B, H, R, C] state (R, C = D, E, or E, D with VK). shape: the caller's, outliving t. */
DLTensor *lj_cp_states(DLTensor *t, int64_t shape[5], const cp_rank *r, CUdeviceptr p, int64_t n,
                       int ordinal);

/* A failed driver call of r's call: "fn: what". */
lajit_status lj_cp_driver_fail(lajit_ctx *ctx, const cp_call *c, CUresult cr, const char *what);

/* The op arguments a rank's local call starts from: the call's sequence tensors, s, scale, flags
 * and stream; states, slots, cu_seqlens and ds are the caller's to set (a local-state call clears
 * the outputs it does not want: lajit_attn_fwd with o NULL, lajit_attn_bwd with dq, dk, dv NULL). */
void lj_cp_fwd_args(const cp_call *c, lajit_attn_fwd_args *f);
void lj_cp_bwd_args(const cp_call *c, lajit_attn_bwd_args *b);

#endif
