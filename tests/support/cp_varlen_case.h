/* cp_varlen_case.h — the cases of context parallelism over a packed varlen batch whose sequences
 * cross ranks (runtime/cp_varlen.c), as data and buffers shared by the gpu test that runs them
 * against float64 (tests/gpu/cp_varlen.c) and the cpu test that replays them on the fake driver
 * and checks what every launch is handed (tests/cpu/cp.c). One place says how a case's ranks are
 * cut into pieces and how large each rank's buffers are, so the replay sees the gpu test's own
 * tensors: a buffer smaller than the view the test declares over it is caught on the CPU.
 *
 * A case: nseq sequences (ragged lengths) packed one after another and cut into P contiguous rank
 * slices at given token offsets. H = 2, D = E = 64, bf16 q, k, v, dO; pools of one float32 state
 * [H, D, E] per sequence (slot i for sequence i; sequence 1 has no slot). */
#ifndef LAJIT_CP_VARLEN_CASE_H
#define LAJIT_CP_VARLEN_CASE_H

#include <stddef.h>
#include <stdint.h>

#include "gpu.h"
#include "lajit.h"

enum { LJ_CPV_H = 2, LJ_CPV_D = 64, LJ_CPV_E = 64, LJ_CPV_MAXP = 8, LJ_CPV_MAXS = 16 };
#define LJ_CPV_SCALE 0.125f /* σ of every call */

typedef struct lj_cpv_case {
    int P, nseq;
    int len[LJ_CPV_MAXS];     /* sequence lengths */
    int cut[LJ_CPV_MAXP + 1]; /* rank r holds packed tokens [cut[r], cut[r+1]) */
    int decay;                /* 0 none; 1: s = 0 through the decay path; 2: strong */
    unsigned xchg;            /* LAJIT_CP_ALLGATHER or LAJIT_CP_LOGSTEP */
    unsigned seed;
} lj_cpv_case;

/* Four sequences over three ranks: rank 1 holds the end of sequence 0, all of 1 (no slot) and the
 * start of 2 (it continues both ways with three pieces); rank 2 the rest of 2 and all of 3. */
lj_cpv_case lj_cpv_three_ranks(int decay, int logstep);
/* Five ranks: a long sequence passing through two of them whole (a rank that is one piece
 * continuing in and out), an empty sequence, a cut at a sequence boundary, and a rank that
 * continues both ways with three pieces. */
lj_cpv_case lj_cpv_five_ranks(int logstep);

/* Sequence i's pool slot: i, except sequence 1, which has none (−1). */
int lj_cpv_slot_of(int i);
/* start[i]: sequence i's first packed token; start[nseq] = T. */
void lj_cpv_starts(const lj_cpv_case *c, int start[LJ_CPV_MAXS + 1]);
/* Floats and bytes of one pool [nseq, H, D, E] (also its host copies). */
size_t lj_cpv_pool_floats(const lj_cpv_case *c);
size_t lj_cpv_pool_bytes(const lj_cpv_case *c);

/* One rank: its pieces (every sequence overlapping its slice, clipped; for an empty slice the
 * sequence it sits in), its buffers and its forward and backward calls over them. Its tensors
 * point into the struct: open it in place and do not copy it. */
typedef struct lj_cpv_rank {
    int T, pieces, first_seq, cont_in, cont_out;
    int32_t cu[LJ_CPV_MAXS + 2], slots[LJ_CPV_MAXS + 1];
    CUdeviceptr q, k, v, dout, o, dq, dk, dv, cu_d, slots_d, s0, sn, dsn, ds0, ds;
    CUdeviceptr
        in; /* the state entering the first piece [1, H, D, E] (lj_cpv_rank_keep_incoming) */
    lj_test_tensor tq, tk, tv, tdo, to, tdq, tdk, tdv, tcu, tsl, ts0, tsn, tdsn, tds0, tds, tin;
    lajit_cp_attn_fwd_args fa;
    lajit_cp_attn_bwd_args ba;
} lj_cpv_rank;

/* Rank r of case c: its pieces, every buffer from alloc (bytes; the contents are the caller's to
 * fill: cu_d and slots_d included), and fa / ba over them (s: the decay rates [H], given when
 * c->decay; ds is then asked for; σ = LJ_CPV_SCALE). */
typedef CUdeviceptr (*lj_cpv_alloc_fn)(size_t bytes);
void lj_cpv_rank_open(lj_cpv_rank *u, const lj_cpv_case *c, int r, lj_cpv_alloc_fn alloc,
                      const DLTensor *s);
void lj_cpv_rank_close(lj_cpv_rank *u, void (*free_fn)(CUdeviceptr));
/* The forward hands the state entering the rank's first piece to u->in (incoming_state) and the
 * backward takes it from there, skipping its own forward exchange, as a training step would. */
void lj_cpv_rank_keep_incoming(lj_cpv_rank *u);

#endif
