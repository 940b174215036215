/* cp_varlen_case.c — the varlen context-parallel cases and each rank's pieces and buffers
 * (cp_varlen_case.h). */
#include "cp_varlen_case.h"

#include <string.h>

enum { H = LJ_CPV_H, D = LJ_CPV_D, E = LJ_CPV_E };

lj_cpv_case lj_cpv_three_ranks(int decay, int logstep)
{
    lj_cpv_case c = {.P = 3,
                     .nseq = 4,
                     .len = {300, 70, 500, 90},
                     .cut = {0, 200, 600, 960},
                     .decay = decay,
                     .xchg = logstep ? LAJIT_CP_LOGSTEP : LAJIT_CP_ALLGATHER,
                     .seed = 40u + (unsigned)(2 * decay + logstep)};
    return c;
}

lj_cpv_case lj_cpv_five_ranks(int logstep)
{
    lj_cpv_case c = {.P = 5,
                     .nseq = 5,
                     .len = {100, 0, 1500, 64, 200},
                     .cut = {0, 100, 500, 900, 1700, 1864},
                     .decay = 2,
                     .xchg = logstep ? LAJIT_CP_LOGSTEP : LAJIT_CP_ALLGATHER,
                     .seed = 77u + (unsigned)logstep};
    return c;
}

int lj_cpv_slot_of(int i)
{
    return i == 1 ? -1 : i;
}

void lj_cpv_starts(const lj_cpv_case *c, int start[LJ_CPV_MAXS + 1])
{
    start[0] = 0;
    for (int i = 0; i < c->nseq; i++)
        start[i + 1] = start[i] + c->len[i];
}

size_t lj_cpv_pool_floats(const lj_cpv_case *c)
{
    return (size_t)c->nseq * H * D * E;
}

size_t lj_cpv_pool_bytes(const lj_cpv_case *c)
{
    return lj_cpv_pool_floats(c) * sizeof(float);
}

/* Rank r's pieces: every sequence overlapping [a, b) (and, for an empty slice, the sequence it
 * sits in), clipped, with their slots and the continuation flags. */
static void pieces_of(lj_cpv_rank *u, const lj_cpv_case *c, int r)
{
    int start[LJ_CPV_MAXS + 1];
    lj_cpv_starts(c, start);
    const int nseq = c->nseq, a = c->cut[r], b = c->cut[r + 1];
    u->T = b - a;
    int first = 0;
    while (first < nseq - 1 && start[first + 1] <= a && !(start[first + 1] == a && a == b))
        first++;
    u->first_seq = first;
    u->cu[0] = 0;
    int n = 0;
    for (int i = first; i < nseq; i++) {
        const int lo = start[i] > a ? start[i] : a, hi = start[i + 1] < b ? start[i + 1] : b;
        if (start[i] >= b && n > 0)
            break;
        u->cu[n + 1] = (hi > lo ? hi : lo) - a;
        if (u->cu[n + 1] < u->cu[n])
            u->cu[n + 1] = u->cu[n];
        u->slots[n] = lj_cpv_slot_of(i);
        n++;
        if (start[i + 1] >= b)
            break;
    }
    u->pieces = n;
    u->cont_in = r > 0 && start[first] < a;
    u->cont_out = r < c->P - 1 && start[first + n] > b;
}

void lj_cpv_rank_open(lj_cpv_rank *u, const lj_cpv_case *c, int r, lj_cpv_alloc_fn alloc,
                      const DLTensor *s)
{
    memset(u, 0, sizeof *u);
    pieces_of(u, c, r);
    const int n = u->pieces;
    const size_t qn = (size_t)u->T * H * D, vn = (size_t)u->T * H * E;
    const size_t pool = lj_cpv_pool_bytes(c);
    CUdeviceptr *qb[] = {&u->q, &u->k, &u->dq, &u->dk};
    for (int i = 0; i < 4; i++)
        *qb[i] = alloc(qn * 2 + 16);
    CUdeviceptr *vb[] = {&u->v, &u->dout, &u->o, &u->dv};
    for (int i = 0; i < 4; i++)
        *vb[i] = alloc(vn * 2 + 16);
    u->cu_d = alloc((size_t)(n + 1) * 4);
    u->slots_d = alloc((size_t)n * 4);
    u->s0 = alloc(pool);
    u->dsn = alloc(pool);
    u->sn = alloc(pool);
    u->ds0 = alloc(pool);
    u->ds = alloc(H * 4);
    u->in = alloc((size_t)H * D * E * 4);

    const DLDataType bf16 = lj_test_dl_dtype(LJ_BF16), f32 = lj_test_dl_dtype(LJ_F32);
    const DLDataType i32 = lj_test_dl_int32();
    const int64_t qs[3] = {u->T, H, D}, vs[3] = {u->T, H, E}, cs[1] = {n + 1}, ss[1] = {n};
    const int64_t hs[1] = {H}, ps[4] = {c->nseq, H, D, E};
    const uint32_t flags = c->xchg | (u->cont_in ? LAJIT_CP_CONTINUES_IN : 0) |
                           (u->cont_out ? LAJIT_CP_CONTINUES_OUT : 0);
    lajit_cp_attn_fwd_args *f = &u->fa;
    f->struct_size = sizeof *f;
    f->q = lj_gpu_tensor(&u->tq, u->q, 0, 3, qs, NULL, bf16);
    f->k = lj_gpu_tensor(&u->tk, u->k, 0, 3, qs, NULL, bf16);
    f->v = lj_gpu_tensor(&u->tv, u->v, 0, 3, vs, NULL, bf16);
    f->o = lj_gpu_tensor(&u->to, u->o, 0, 3, vs, NULL, bf16);
    f->s = c->decay ? s : NULL;
    f->scale = LJ_CPV_SCALE;
    f->initial_state = lj_gpu_tensor(&u->ts0, u->s0, 0, 4, ps, NULL, f32);
    f->final_state = lj_gpu_tensor(&u->tsn, u->sn, 0, 4, ps, NULL, f32);
    f->cu_seqlens = lj_gpu_tensor(&u->tcu, u->cu_d, 0, 1, cs, NULL, i32);
    f->state_slots = lj_gpu_tensor(&u->tsl, u->slots_d, 0, 1, ss, NULL, i32);
    f->flags = flags;
    lajit_cp_attn_bwd_args *g = &u->ba;
    g->struct_size = sizeof *g;
    g->q = f->q;
    g->k = f->k;
    g->v = f->v;
    g->dout = lj_gpu_tensor(&u->tdo, u->dout, 0, 3, vs, NULL, bf16);
    g->dq = lj_gpu_tensor(&u->tdq, u->dq, 0, 3, qs, NULL, bf16);
    g->dk = lj_gpu_tensor(&u->tdk, u->dk, 0, 3, qs, NULL, bf16);
    g->dv = lj_gpu_tensor(&u->tdv, u->dv, 0, 3, vs, NULL, bf16);
    g->s = f->s;
    g->ds = c->decay ? lj_gpu_tensor(&u->tds, u->ds, 0, 1, hs, NULL, f32) : NULL;
    g->scale = f->scale;
    g->initial_state = f->initial_state;
    g->d_final_state = lj_gpu_tensor(&u->tdsn, u->dsn, 0, 4, ps, NULL, f32);
    g->d_initial_state = lj_gpu_tensor(&u->tds0, u->ds0, 0, 4, ps, NULL, f32);
    g->cu_seqlens = f->cu_seqlens;
    g->state_slots = f->state_slots;
    g->flags = flags;
}

void lj_cpv_rank_close(lj_cpv_rank *u, void (*free_fn)(CUdeviceptr))
{
    CUdeviceptr all[] = {u->q,    u->k,       u->v,  u->dout, u->o,   u->dq,  u->dk, u->dv,
                         u->cu_d, u->slots_d, u->s0, u->sn,   u->dsn, u->ds0, u->ds, u->in};
    for (size_t j = 0; j < sizeof all / sizeof all[0]; j++)
        free_fn(all[j]);
}

void lj_cpv_rank_keep_incoming(lj_cpv_rank *u)
{
    const int64_t shape[4] = {1, LJ_CPV_H, LJ_CPV_D, LJ_CPV_E};
    u->fa.incoming_state =
        lj_gpu_tensor(&u->tin, u->in, 0, 4, shape, NULL, lj_test_dl_dtype(LJ_F32));
    u->ba.incoming_state = u->fa.incoming_state;
}
