/* cp_op.h — the test hook of context parallelism (cp_op.c): P ranks simulated in one process on
 * one device, the exchange replaced by device-to-device copies. Internal (lajit__ prefix, like
 * the context's test hooks); the public entry points are lajit_cp_attn_fwd and lajit_cp_attn_bwd in lajit.h. */
#ifndef LAJIT_CP_OP_H
#define LAJIT_CP_OP_H

#include "context.h"

/* Runs lajit_cp_attn_fwd's steps for P ranks whose arguments are ranks[0 .. P-1] (their comm is
 * not read; every rank's stream must be the same): (a) every rank's local state into its own
 * copy of the exchange buffer, then for each rank (b) the all-gather as P − 1 cuMemcpyDtoDAsync
 * copies of the other ranks' slots into its buffer, (c) the scan and (d) its outputs — the same
 * functions the NCCL path runs, with only the exchange differing. The context's workspace holds
 * P ranks' buffers. Unlike the real path it can and does check that the ranks agree on B, H, D,
 * E, dtype and flags. */
lajit_status lajit__cp_attn_fwd_sim(lajit_ctx *ctx, int P, const lajit_cp_attn_fwd_args *ranks);

/* The same for lajit_cp_attn_bwd: every rank's steps phase by phase (local state, exchange, scan;
 * local gradient state, exchange, reverse scan and the span's gradients; ds's parts exchanged
 * and summed), each exchange replaced by copies. */
lajit_status lajit__cp_attn_bwd_sim(lajit_ctx *ctx, int P, const lajit_cp_attn_bwd_args *ranks);

#endif
