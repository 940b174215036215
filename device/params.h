/* params.h — la_params for a problem laid out in the canonical dense layouts, for callers that
 * own their buffers (the tuner times candidates on tensors it allocates itself).
 *
 * The result is exactly what lajit_attn_fwd / lajit_attn_decode put in la_params when called
 * with contiguous tensors of those layouts (tests/cpu/autotune.c checks this against the op
 * path): forward q, k [B,H,N,D], v, o [B,H,N,E], states [B,H,D,E] ([B,H,E,D] with vk); decode
 * q, k [B,H,D] (T = 1) or [B,T,H,D], v, o likewise with E, state pool [B,H,D,E] updated in
 * place, step_states [B,T,H,D,E]; the backward's dq, dv and dk passes (part 0..2) as the forward
 * scans they are. Varlen and the backward's ds pass are not covered. */
#ifndef LAJIT_PARAMS_H
#define LAJIT_PARAMS_H

#include "family.h"
#include "la_params.h"

/* Bytes of each buffer a problem needs (0: not used). s: the decay rates, float32 [H]. */
typedef struct lj_dense_layout {
    size_t q, k, v, o, s, s0, sn, step_states;
} lj_dense_layout;

/* Device addresses of those buffers (unused ones 0). */
typedef struct lj_dense_buffers {
    unsigned long long q, k, v, o, s, s0, sn, step_states;
} lj_dense_buffers;

/* The sizes for p; LAJIT_ERR_UNSUPPORTED for varlen problems and the ds pass. */
lajit_status lj_dense_layout_of(lj_env *env, const lj_problem *p, lj_dense_layout *out);

/* Fills *lp (zeroed first) for p on buffers b with scale. */
void lj_params_dense(const lj_problem *p, const lj_dense_buffers *b, float scale, la_params *lp);

#endif
