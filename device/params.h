/* params.h — la_params for a problem laid out in the canonical dense layouts, for callers that
 * own their buffers (the tuner times candidates on tensors it allocates itself).
 *
 * The result is exactly what lajit_attn_fwd / lajit_attn_decode put in la_params when called
 * with contiguous tensors of those layouts (tests/cpu/autotune.c checks this against the op
 * path): forward q, k [B,H,N,D], v, o [B,H,N,E], states [B,H,D,E] ([B,H,E,D] with vk); decode
 * q, k [B,H,D] (T = 1) or [B,T,H,D], v, o likewise with E, state pool [B,H,D,E] updated in
 * place, step_states [B,T,H,D,E]; the backward's dq, dv and dk passes (part 0..2) as the forward
 * scans they are, the dq pass that also computes ds (part 0 with want_ds: the op's q as x
 * [B,H,N,D], dS_N, the workspace and ds [H]) included, and the dv pass with the op's v as x
 * [B,H,N,E] and dk as o2 [B,H,N,D] (runtime/roles.c's part 1). Varlen and the separate ds pass (part 3)
 * are not covered. */
#ifndef LAJIT_PARAMS_H
#define LAJIT_PARAMS_H

#include "family.h"
#include "la_params.h"

/* Bytes of each buffer a problem needs (0: not used). s: the decay rates, float32 [H]; x, dsn,
 * ws and ds: the dq pass with ds (the workspace must start zeroed: its kernels leave it so); x
 * and o2: the dv pass's v and dk (a kernel that computes dk beside dv reads and writes them). */
typedef struct lj_dense_layout {
    size_t q, k, v, o, s, s0, sn, step_states, x, dsn, ws, ds, o2;
} lj_dense_layout;
#define LJ_DENSE_BUFFERS 13

/* Device addresses of those buffers (unused ones 0). */
typedef struct lj_dense_buffers {
    unsigned long long q, k, v, o, s, s0, sn, step_states, x, dsn, ws, ds, o2;
} lj_dense_buffers;

/* Bytes of the backward's ds workspace for nseq sequences of H heads with value width E: a
 * ticket counter (16 bytes), then one fp32 share per (sequence, head, slice of >= 16 columns),
 * rounded up to 16 bytes; SIZE_MAX when that overflows, 0 for an empty problem. The one copy of
 * this rule (lajit_attn_bwd_workspace_size returns it). */
size_t lj_ds_workspace_bytes(long long nseq, long long H, long long E);

/* Bytes of a split scan's buffer (templates/common/split.cuh) for nseq sequences of H heads and
 * per bytes per (sequence, head) (the launch's split_ws or split_flags): 16 (the flags buffer's
 * counters) + nseq·H·per; SIZE_MAX when that overflows. The one copy of this rule (the ops and
 * the tuner). */
size_t lj_split_ws_bytes(long long nseq, long long H, unsigned long long per);

/* The sizes for p; LAJIT_ERR_UNSUPPORTED for varlen problems and the ds pass. */
lajit_status lj_dense_layout_of(lj_env *env, const lj_problem *p, lj_dense_layout *out);

/* Fills *lp (zeroed first) for p on buffers b with scale. */
void lj_params_dense(const lj_problem *p, const lj_dense_buffers *b, float scale, la_params *lp);

#endif
