/* params.c — la_params over dense buffers (params.h). The stride conventions are those of
 * runtime/ops.c: logical (b, h, t, d) for sequences, (slot, h, d, e) for states with the VK
 * layout expressed by swapping the last two strides. */
#include "params.h"

#include <stdint.h>
#include <string.h>

static size_t elem_size(lj_dtype dt)
{
    return dt == LJ_F32 ? 4 : 2;
}

/* The backward's dq, dv and dk passes are forward scans of their own shape (la_bwd/family.lua):
 * (dO, v, k) for dq and (v, dO, q) for dk have rows E wide and outputs D wide; the scan's initial
 * state is S_0 (dq) or dS_N (dv, dk) and only dv writes one (dS_0). */
static lj_problem scan_of(const lj_problem *p)
{
    lj_problem sp = *p;
    sp.op = LJ_OP_FWD;
    if (p->part != 1) {
        sp.D = p->E;
        sp.E = p->D;
    }
    sp.has_initial = p->part == 0 ? p->has_initial : p->has_dsn;
    sp.has_final = p->part == 1 && p->has_final;
    sp.has_dsn = sp.want_ds = sp.part = 0;
    return sp;
}

size_t lj_ds_workspace_bytes(long long nseq, long long H, long long E)
{
    if (nseq <= 0 || H <= 0 || E <= 0)
        return 0;
    size_t n, bytes;
    if (__builtin_mul_overflow((uint64_t)nseq, (uint64_t)H, &n) ||
        __builtin_mul_overflow(n, (uint64_t)(E / 16 + (E % 16 != 0)), &n) ||
        __builtin_mul_overflow(n, (size_t)4, &bytes) ||
        __builtin_add_overflow(bytes, (size_t)15 + 16, &bytes))
        return SIZE_MAX;
    return 16 + ((bytes - 16) & ~(size_t)15);
}

size_t lj_split_ws_bytes(long long nseq, long long H, unsigned long long per)
{
    size_t n, bytes;
    if (nseq < 0 || H < 0 || __builtin_mul_overflow((uint64_t)nseq, (uint64_t)H, &n) ||
        __builtin_mul_overflow(n, (uint64_t)per, &bytes) ||
        __builtin_add_overflow(bytes, (size_t)16, &bytes))
        return SIZE_MAX;
    return bytes;
}

/* The dq pass that also computes ds (la_bwd_sm90's part 0 with want_ds). */
static int dq_with_ds(const lj_problem *p)
{
    return p->op == LJ_OP_BWD && p->part == 0 && p->want_ds;
}

/* The dv pass with outputs: it is handed v and dk too (la_bwd_sm90/dkdv.cu computes dk beside). */
static int dv_with_dk(const lj_problem *p)
{
    return p->op == LJ_OP_BWD && p->part == 1 && !p->state_only;
}

lajit_status lj_dense_layout_of(lj_env *env, const lj_problem *p, lj_dense_layout *out)
{
    memset(out, 0, sizeof *out);
    if (p->op == LJ_OP_BWD && !p->varlen && p->part >= 0 && p->part <= 2) {
        lj_problem sp = scan_of(p);
        lajit_status st = lj_dense_layout_of(env, &sp, out);
        if (st == LAJIT_OK && dq_with_ds(p)) {
            size_t el = elem_size(p->dtype), B = (size_t)p->B, H = (size_t)p->H;
            out->x = B * H * (size_t)p->N * (size_t)p->D * el;
            out->dsn = p->has_dsn ? B * H * (size_t)p->D * (size_t)p->E * 4 : 0;
            out->ws = lj_ds_workspace_bytes(p->B, p->H, p->E);
            out->ds = H * 4;
        }
        if (st == LAJIT_OK && dv_with_dk(p)) {
            size_t el = elem_size(p->dtype), BHN = (size_t)p->B * (size_t)p->H * (size_t)p->N;
            out->x = BHN * (size_t)p->E * el;
            out->o2 = BHN * (size_t)p->D * el;
        }
        return st;
    }
    if (p->varlen || p->op == LJ_OP_BWD)
        return lj_error(env, LAJIT_ERR_UNSUPPORTED,
                        "dense buffers for %s%s problems are not supported%s", lj_op_name(p->op),
                        p->varlen ? " varlen" : "",
                        p->op == LJ_OP_BWD ? " (the ds pass is not tuned)" : "");
    size_t el = elem_size(p->dtype), B = (size_t)p->B, H = (size_t)p->H, D = (size_t)p->D,
           E = (size_t)p->E;
    size_t steps = p->op == LJ_OP_DECODE ? (size_t)(p->T > 0 ? p->T : 1) : (size_t)p->N;
    /* States in their storage dtype, o in its own (a mixed problem's differs from q's). */
    size_t state = B * H * D * E * elem_size(p->state_dtype);
    out->q = out->k = B * H * steps * D * el;
    out->v = B * H * steps * E * el;
    out->o = B * H * steps * E * elem_size(lj_problem_out(p));
    out->s = p->decay ? H * 4 : 0;
    if (p->op == LJ_OP_DECODE) {
        out->s0 = state; /* the pool, updated in place: sn is the same buffer */
        out->step_states = p->step_states ? state * steps : 0;
    } else {
        out->s0 = p->has_initial ? state : 0;
        out->sn = p->has_final ? state : 0;
    }
    return LAJIT_OK;
}

static la_tensor4 dense4(unsigned long long ptr, long long s0, long long s1, long long s2,
                         long long s3)
{
    la_tensor4 t = {ptr, s0, s1, s2, s3};
    return t;
}

/* A state [slots, H, D, E] (or [.., E, D] with vk) as logical (slot, h, d, e) strides. */
static la_tensor4 state4(unsigned long long ptr, const lj_problem *p)
{
    long long D = p->D, E = p->E, H = p->H;
    if (p->vk)
        return dense4(ptr, H * D * E, D * E, 1, D);
    return dense4(ptr, H * D * E, D * E, E, 1);
}

void lj_params_dense(const lj_problem *p, const lj_dense_buffers *b, float scale, la_params *lp)
{
    if (p->op == LJ_OP_BWD) {
        lj_problem sp = scan_of(p);
        lj_params_dense(&sp, b, scale, lp);
        if (dq_with_ds(p)) { /* as runtime/roles.c hands them: q as x, dS_N transposed */
            long long H = p->H, N = p->N, D = p->D;
            lp->x = dense4(b->x, H * N * D, N * D, D, 1);
            if (p->has_dsn) {
                la_tensor4 t = state4(b->dsn, p);
                long long s2 = t.s2;
                t.s2 = t.s3;
                t.s3 = s2;
                lp->dsn = t;
            }
            lp->workspace = b->ws;
            lp->dsdecay = b->ds;
        }
        if (dv_with_dk(p)) { /* as runtime/roles.c hands them: v as x, dk as o2 (la_params.dk) */
            long long H = p->H, N = p->N, D = p->D, E = p->E;
            lp->x = dense4(b->x, H * N * E, N * E, E, 1);
            lp->dk = dense4(b->o2, H * N * D, N * D, D, 1);
        }
        return;
    }
    memset(lp, 0, sizeof *lp);
    long long H = p->H, D = p->D, E = p->E;
    lp->decay = p->decay ? b->s : 0;
    if (p->op == LJ_OP_DECODE) {
        long long T = p->T > 0 ? p->T : 1;
        /* [B,H,D] when T = 1 (no step stride), [B,T,H,D] otherwise: (row, head, step, d). */
        long long step_q = T > 1 ? H * D : 0, step_v = T > 1 ? H * E : 0;
        lp->q = dense4(b->q, T * H * D, D, step_q, 1);
        lp->k = dense4(b->k, T * H * D, D, step_q, 1);
        lp->v = dense4(b->v, T * H * E, E, step_v, 1);
        lp->o = dense4(b->o, T * H * E, E, step_v, 1);
        lp->s0 = state4(b->s0, p);
        lp->sn = lp->s0;
        if (p->step_states)
            lp->step_states = state4(b->step_states, p);
        lp->N = (int)T;
        lp->T = (int)T;
    } else {
        long long N = p->N;
        lp->q = dense4(b->q, H * N * D, N * D, D, 1);
        lp->k = dense4(b->k, H * N * D, N * D, D, 1);
        lp->v = dense4(b->v, H * N * E, N * E, E, 1);
        lp->o = dense4(b->o, H * N * E, N * E, E, 1);
        if (p->has_initial)
            lp->s0 = state4(b->s0, p);
        if (p->has_final)
            lp->sn = state4(b->sn, p);
        lp->N = (int)N;
        lp->T = 1;
    }
    lp->B = p->B;
    lp->H = p->H;
    lp->D = p->D;
    lp->E = p->E;
    lp->nseq = p->B;
    lp->P = p->B;
    lp->scale = scale;
}
