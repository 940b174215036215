/* cp_varlen.c — context parallelism over a packed varlen batch whose sequences may cross ranks
 * (include/lajit.h, lajit_cp_attn_fwd: cu_seqlens). Rank r holds a contiguous slice of the
 * packed tokens, cut by its cu_seqlens into pieces: whole sequences, and at its ends parts of
 * sequences that began on an earlier rank (LAJIT_CP_CONTINUES_IN: the first piece) or go on to a
 * later one (LAJIT_CP_CONTINUES_OUT: the last piece).
 *
 * Only a continued sequence needs anything from another rank, and it needs one state: the carry
 * out of the previous rank's last piece (forward), or out of the next rank's first piece
 * (gradient). The exchange of cp_exchange.c carries exactly that when each rank offers
 *   its last piece's final state (gradient: its first piece's dS_0) with the span length T_r
 *   when the rank is one piece of a sequence passing through, else length −1,
 * and the state scan treats −1 as "a chain starts in this span": the carry does not pass it
 * (la_state_scan's segmented walk). Everything else is the single-GPU varlen call over the
 * rank's pieces, with the pools of the caller's slots gathered into the rank's own pools (one
 * state per piece) and scattered back, so a continued piece reads the exchanged state and a
 * piece that goes on writes no final state:
 *   forward:  IN ← the caller's initial states (piece 0: none when it continues); FIN ← the
 *             state-only forward over the pieces; carry ← FIN[last]; exchange; IN[0] ← the
 *             incoming state when piece 0 continues; o and FIN from IN; FIN scattered to the
 *             caller's final states (the last piece: not when it continues);
 *   backward: the same IN (with the forward's saved incoming state: IN alone, from the caller's
 *             pools and that state; no local states, no exchange); DSN ← the caller's dS_N (the last piece: none when it continues); GC ←
 *             the state-only backward over the pieces; carry ← GC[0]; reverse exchange; DSN[last]
 *             ← the gradient reaching it when the last piece continues; the backward over the
 *             pieces from IN and DSN: dq, dk, dv, ds's part, DS0; DS0 scattered to the caller's
 *             dS_0 (piece 0: not when it continues). */
#include <string.h>

#include "cp.h"
#include "op_args.h"

/* ---- Checks and the buffer ------------------------------------------------------------------- */

/* A pool argument: float32 [P, H, R, C] (R, C = D, E, or E, D with VK). */
static lajit_status check_pool(lj_env *env, const cp_rank *r, const char *name, const DLTensor *t)
{
    lj_elem e;
    const int64_t R = r->vk ? r->E : r->D, C = r->vk ? r->D : r->E;
    if (!t->shape || t->ndim != 4 || t->shape[0] < 1 || t->shape[1] != r->H || t->shape[2] != R ||
        t->shape[3] != C)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: %s must be a pool [P, H, %s] = [P, %lld, %lld, %lld] (varlen)",
                        r->c.fn, name, r->vk ? "E, D" : "D, E", (long long)r->H, (long long)R,
                        (long long)C);
    if (!lj_tensor_elem(t->dtype, &e) || e != LJ_ELEM_F32)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: %s is %s; context parallelism keeps states in float32", r->c.fn, name,
                        lj_tensor_dtype_name(t->dtype));
    return LAJIT_OK;
}

lajit_status lj_cp_varlen_check(lj_env *env, cp_rank *r)
{
    const cp_call *c = &r->c;
    const DLTensor *t[7] = {c->q, c->k, c->v, c->bwd ? c->dout : c->o, c->dq, c->dk, c->dv};
    static const char *const names[7] = {"q", "k", "v", "o/dout", "dq", "dk", "dv"};
    static const int e_like[7] = {0, 0, 1, 1, 0, 0, 1};
    const int n = c->bwd ? 7 : 4;
    for (int i = 0; i < n; i++) {
        if (!t[i])
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: %s are required", c->fn,
                            c->bwd ? "q, k, v, dout, dq, dk and dv" : "q, k, v and o");
        if (!t[i]->shape || t[i]->ndim != 3)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: %s must be [T, H, %c] (this rank's packed tokens, varlen); it "
                            "has %d dimensions",
                            c->fn, names[i], e_like[i] ? 'E' : 'D', t[i]->shape ? t[i]->ndim : 0);
    }
    r->B = 1;
    r->N = c->k->shape[0];
    r->H = c->k->shape[1];
    r->D = c->k->shape[2];
    r->E = c->v->shape[2];
    for (int i = 0; i < n; i++) {
        const int64_t *s = t[i]->shape, w = e_like[i] ? r->E : r->D;
        if (s[0] != r->N || s[1] != r->H || s[2] != w || r->H < 1 || w < 1 || r->N < 0)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s: %s is [%lld, %lld, %lld]; k and v make it [%lld, %lld, %lld]",
                            c->fn, names[i], (long long)s[0], (long long)s[1], (long long)s[2],
                            (long long)r->N, (long long)r->H, (long long)w);
    }
    lj_elem e;
    const DLTensor *cu = c->cu_seqlens;
    if (!cu->shape || cu->ndim != 1 || cu->shape[0] < 2 || !lj_tensor_elem(cu->dtype, &e) ||
        e != LJ_ELEM_I32)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: cu_seqlens must be int32 [pieces + 1] with at least one piece", c->fn);
    r->pieces = cu->shape[0] - 1;
    if (c->cont_in && r->rank == 0)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: rank 0's first piece cannot continue a sequence "
                        "(LAJIT_CP_CONTINUES_IN)",
                        c->fn);
    if (c->cont_out && r->rank == r->P - 1)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: the last rank's last piece cannot continue (LAJIT_CP_CONTINUES_OUT)",
                        c->fn);
    const DLTensor *pools[4] = {c->initial_state, c->final_state, c->d_initial_state,
                                c->d_final_state};
    static const char *const pool_names[4] = {"initial_state", "final_state", "d_initial_state",
                                              "d_final_state"};
    int any = 0;
    lajit_status st;
    for (int i = 0; i < 4; i++)
        if (pools[i]) {
            any = 1;
            if ((st = check_pool(env, r, pool_names[i], pools[i])) != LAJIT_OK)
                return st;
        }
    if (any && !c->state_slots)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: varlen with states needs state_slots (int32 [pieces])", c->fn);
    if (c->state_slots &&
        (!c->state_slots->shape || c->state_slots->ndim != 1 ||
         c->state_slots->shape[0] != r->pieces || !lj_tensor_elem(c->state_slots->dtype, &e) ||
         e != LJ_ELEM_I32 ||
         (c->state_slots->strides && r->pieces > 1 && c->state_slots->strides[0] != 1)))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "%s: state_slots must be int32 [pieces] = [%lld], contiguous", c->fn,
                        (long long)r->pieces);
    return LAJIT_OK;
}

/* The regions' sizes in lj_cp_varlen_place's order. */
static int varlen_sizes(const cp_rank *r, size_t *slots, size_t *pool)
{
    size_t n = (size_t)r->pieces, p;
    if (__builtin_mul_overflow(n, (size_t)4, slots) ||
        __builtin_mul_overflow(n, r->piece_state, &p))
        return 0;
    *slots = lj_round16(*slots);
    *pool = lj_round16(p);
    return 1;
}

size_t lj_cp_varlen_bytes(const cp_rank *r)
{
    size_t slots, pool, a, b, total;
    const size_t pools = r->c.bwd ? 5 : 2;
    if (!varlen_sizes(r, &slots, &pool) || __builtin_mul_overflow(slots, (size_t)2, &a) ||
        __builtin_mul_overflow(pool, pools, &b) || __builtin_add_overflow(a, b, &total))
        return 0;
    return total;
}

void lj_cp_varlen_place(cp_rank *r, CUdeviceptr base)
{
    size_t slots = 0, pool = 0;
    varlen_sizes(r, &slots, &pool);
    r->v_slots_in = base;
    r->v_slots_out = base + slots;
    r->v_in = base + 2 * slots;
    r->v_fin = r->v_in + pool;
    r->v_dsn = r->c.bwd ? r->v_fin + pool : 0;
    r->v_gc = r->c.bwd ? r->v_dsn + pool : 0;
    r->v_ds0 = r->c.bwd ? r->v_gc + pool : 0;
}

/* ---- Views ------------------------------------------------------------------------------------ */

/* A pool of the rank's pieces [pieces, H, R, C] at base. */
static DLTensor *pool_view(DLTensor *t, int64_t shape[4], const cp_rank *r, CUdeviceptr base,
                           int ordinal)
{
    shape[0] = r->pieces;
    shape[1] = r->H;
    shape[2] = r->vk ? r->E : r->D;
    shape[3] = r->vk ? r->D : r->E;
    return lj_device_view(t, base, ordinal, 4, shape, NULL, (DLDataType){kDLFloat, 32, 1});
}

static DLTensor *slots_view(DLTensor *t, int64_t shape[1], const cp_rank *r, CUdeviceptr base,
                            int ordinal)
{
    shape[0] = r->pieces;
    return lj_device_view(t, base, ordinal, 1, shape, NULL, (DLDataType){kDLInt, 32, 1});
}

/* ---- Steps ------------------------------------------------------------------------------------ */

static lajit_status fail_at(lajit_ctx *ctx, const cp_rank *r, lajit_status st, const char *what)
{
    if (st != LAJIT_OK)
        lj_error_prefix(&ctx->env, "%s (rank %d, %s): ", r->c.fn, r->rank, what);
    return st;
}

static lajit_status copy(lajit_ctx *ctx, const cp_rank *r, CUdeviceptr dst, CUdeviceptr src,
                         size_t bytes, const char *what)
{
    CUresult cr = LJ_CU(&ctx->env, ctx->device.drv, cuMemcpyDtoDAsync, dst, src, bytes,
                        (CUstream)r->c.stream);
    return cr == CUDA_SUCCESS ? LAJIT_OK : lj_cp_driver_fail(ctx, &r->c, cr, what);
}

static lajit_status fill(lajit_ctx *ctx, const cp_rank *r, CUdeviceptr dst, unsigned value,
                         size_t words, const char *what)
{
    CUresult cr = LJ_CU(&ctx->env, ctx->device.drv, cuMemsetD32Async, dst, value, words,
                        (CUstream)r->c.stream);
    return cr == CUDA_SUCCESS ? LAJIT_OK : lj_cp_driver_fail(ctx, &r->c, cr, what);
}

/* The identity slots 0 .. pieces − 1, one array of the context shared by every call (written
 * when a call has more pieces than any before: that first call synchronises, as an allocation
 * would). */
static lajit_status identity_slots(lajit_ctx *ctx, const cp_rank *r)
{
    if (ctx->cp_ids_n >= r->pieces && ctx->cp_ids.ptr)
        return LAJIT_OK;
    const size_t n = (size_t)r->pieces;
    lajit_status st = lj_ctx_buffer(ctx, &ctx->cp_ids, lj_round16(n * 4), 0, NULL,
                                    "context parallelism's piece slots");
    if (st != LAJIT_OK)
        return st;
    int32_t *ids = lj_malloc(&ctx->env, n * 4);
    if (!ids)
        return lj_oom(&ctx->env);
    for (size_t i = 0; i < n; i++)
        ids[i] = (int32_t)i;
    /* On the caller's stream (bwd_segments.c says why), after its earlier calls. */
    CUresult cr = LJ_CU(&ctx->env, ctx->device.drv, cuStreamSynchronize, (CUstream)r->c.stream);
    if (cr == CUDA_SUCCESS)
        cr = LJ_CU(&ctx->env, ctx->device.drv, cuMemcpyHtoDAsync, ctx->cp_ids.ptr, ids, n * 4,
                   (CUstream)r->c.stream);
    lj_free(&ctx->env, ids);
    if (cr != CUDA_SUCCESS)
        return lj_cp_driver_fail(ctx, &r->c, cr, "the piece slots");
    ctx->cp_ids_n = r->pieces;
    return LAJIT_OK;
}

/* The caller's slots into the two patched copies: reading (piece 0 −1 when it continues in)
 * and writing (the last piece −1 when it continues out). */
static lajit_status patched_slots(lajit_ctx *ctx, const cp_rank *r)
{
    const cp_call *c = &r->c;
    if (!c->state_slots)
        return LAJIT_OK;
    const size_t bytes = (size_t)r->pieces * 4;
    lajit_status st =
        copy(ctx, r, r->v_slots_in, lj_tensor_address(c->state_slots), bytes, "the slots");
    if (st == LAJIT_OK)
        st = copy(ctx, r, r->v_slots_out, lj_tensor_address(c->state_slots), bytes, "the slots");
    if (st == LAJIT_OK && c->cont_in)
        st = fill(ctx, r, r->v_slots_in, 0xffffffffu, 1, "the continued piece's slot");
    if (st == LAJIT_OK && c->cont_out)
        st = fill(ctx, r, r->v_slots_out + (CUdeviceptr)(r->pieces - 1) * 4, 0xffffffffu, 1,
                  "the continued piece's slot");
    return st;
}

/* The exchange slot's length: the span when the rank is one piece of a sequence passing
 * through in this direction, else −1 (a chain starts here). */
static lajit_status write_length(lajit_ctx *ctx, const cp_rank *r, int through)
{
    const uint64_t n = through ? (uint64_t)r->N : ~(uint64_t)0;
    lajit_status st =
        fill(ctx, r, r->carry + r->len_off, (unsigned)(n & 0xffffffffu), 1, "the span's length");
    return st == LAJIT_OK ? fill(ctx, r, r->carry + r->len_off + 4, (unsigned)(n >> 32), 1,
                                 "the span's length")
                          : st;
}

lajit_status lj_cp_varlen_local(lajit_ctx *ctx, cp_rank *r, int grad)
{
    const cp_call *c = &r->c;
    const int o = ctx->ordinal;
    const size_t all = (size_t)r->pieces * r->piece_state;
    int64_t s1[4], s2[4], s3[1], s4[1];
    DLTensor p1, p2, ids, sl;
    lajit_status st;
    if (!grad &&
        ((st = identity_slots(ctx, r)) != LAJIT_OK || (st = patched_slots(ctx, r)) != LAJIT_OK))
        return st;
    slots_view(&ids, s3, r, ctx->cp_ids.ptr, o);
    if (!grad) {
        /* IN: the caller's initial states (piece 0 none when it continues). */
        if (c->initial_state)
            st = fail_at(ctx, r,
                         lj_state_pool_gather(ctx, c->initial_state,
                                              slots_view(&sl, s4, r, r->v_slots_in, o),
                                              pool_view(&p1, s1, r, r->v_in, o), 0, c->stream),
                         "its pieces' initial states");
        else
            st = fill(ctx, r, r->v_in, 0u, all / 4, "zero initial states");
        /* A backward given the forward's incoming state needs IN only: no local states, no
         * carry (its forward exchange is skipped). */
        if (st != LAJIT_OK || c->saved_incoming)
            return st;
        if (r->N == 0) {
            st = copy(ctx, r, r->v_fin, r->v_in, all, "an empty span's states");
        } else {
            lajit_attn_fwd_args f;
            lj_cp_fwd_args(c, &f);
            f.q = NULL; /* the pieces' local states alone: k and v */
            f.o = NULL;
            f.initial_state = pool_view(&p1, s1, r, r->v_in, o);
            f.final_state = pool_view(&p2, s2, r, r->v_fin, o);
            f.cu_seqlens = c->cu_seqlens;
            f.state_slots = &ids;
            st = fail_at(ctx, r, lajit_attn_fwd(ctx, &f), "its pieces' local states");
        }
        if (st == LAJIT_OK)
            st = copy(ctx, r, r->carry, r->v_fin + (CUdeviceptr)(r->pieces - 1) * r->piece_state,
                      r->piece_state, "the last piece's state");
        return st == LAJIT_OK ? write_length(ctx, r, r->pieces == 1 && c->cont_in) : st;
    }
    /* DSN: the caller's dS_N (the last piece none when it continues; a fresh slot is read). */
    if (c->d_final_state)
        st = fail_at(ctx, r,
                     lj_state_pool_gather(ctx, c->d_final_state,
                                          slots_view(&sl, s4, r, r->v_slots_out, o),
                                          pool_view(&p1, s1, r, r->v_dsn, o), 1, c->stream),
                     "its pieces' dS_N");
    else
        st = fill(ctx, r, r->v_dsn, 0u, all / 4, "zero dS_N");
    if (st != LAJIT_OK)
        return st;
    if (r->N == 0) {
        st = copy(ctx, r, r->v_gc, r->v_dsn, all, "an empty span's gradient states");
    } else {
        lajit_attn_bwd_args b;
        lj_cp_bwd_args(c, &b);
        b.k = b.v = NULL; /* the pieces' local gradient states alone: q and dout */
        b.dq = b.dk = b.dv = NULL;
        b.d_final_state = pool_view(&p1, s1, r, r->v_dsn, o);
        b.d_initial_state = pool_view(&p2, s2, r, r->v_gc, o);
        b.cu_seqlens = c->cu_seqlens;
        b.state_slots = &ids;
        st = fail_at(ctx, r, lajit_attn_bwd(ctx, &b), "its pieces' local gradient states");
    }
    if (st == LAJIT_OK)
        st = copy(ctx, r, r->carry, r->v_gc, r->piece_state, "the first piece's gradient state");
    return st == LAJIT_OK ? write_length(ctx, r, r->pieces == 1 && c->cont_out) : st;
}

/* IN[0] ← the state entering the span (the exchange's, or the backward's saved copy of it), when
 * piece 0 continues. */
static lajit_status take_incoming(lajit_ctx *ctx, const cp_rank *r)
{
    return lj_cp_receives(r)
               ? copy(ctx, r, r->v_in, lj_cp_entering(r), r->piece_state, "the incoming state")
               : LAJIT_OK;
}

lajit_status lj_cp_varlen_fwd_outputs(lajit_ctx *ctx, cp_rank *r)
{
    const cp_call *c = &r->c;
    const int o = ctx->ordinal;
    int64_t s1[4], s2[4], s3[1], s4[1];
    DLTensor p1, p2, ids, sl;
    lajit_status st = take_incoming(ctx, r);
    if (st != LAJIT_OK)
        return st;
    if (r->N == 0) {
        if (c->final_state)
            st = copy(ctx, r, r->v_fin, r->v_in, (size_t)r->pieces * r->piece_state,
                      "an empty span's states");
    } else {
        lajit_attn_fwd_args f;
        lj_cp_fwd_args(c, &f);
        f.initial_state = pool_view(&p1, s1, r, r->v_in, o);
        f.final_state = c->final_state ? pool_view(&p2, s2, r, r->v_fin, o) : NULL;
        f.cu_seqlens = c->cu_seqlens;
        f.state_slots = slots_view(&ids, s3, r, ctx->cp_ids.ptr, o);
        st = fail_at(ctx, r, lajit_attn_fwd(ctx, &f), "its pieces' outputs");
    }
    if (st == LAJIT_OK && c->final_state)
        st = fail_at(ctx, r,
                     lj_state_pool_scatter(ctx, pool_view(&p2, s2, r, r->v_fin, o),
                                           slots_view(&sl, s4, r, r->v_slots_out, o),
                                           c->final_state, 1, c->stream),
                     "its pieces' final states");
    return st;
}

lajit_status lj_cp_varlen_bwd_grads(lajit_ctx *ctx, cp_rank *r)
{
    const cp_call *c = &r->c;
    const int o = ctx->ordinal;
    int64_t s1[4], s2[4], s5[4], s3[1], s4[1], sd[1] = {r->H};
    DLTensor p1, p2, p5, ids, sl, ds_part;
    lajit_status st = take_incoming(ctx, r);
    if (st == LAJIT_OK && c->cont_out)
        st = copy(ctx, r, r->v_dsn + (CUdeviceptr)(r->pieces - 1) * r->piece_state,
                  lj_cp_incoming(r, 1), r->piece_state, "the gradient reaching the last piece");
    if (st != LAJIT_OK)
        return st;
    const CUdeviceptr part = r->ds_gather + (CUdeviceptr)r->rank * r->ds_slot;
    if (r->N == 0) {
        if (c->ds &&
            (st = fill(ctx, r, part, 0u, r->ds_slot / 4, "an empty span's ds")) != LAJIT_OK)
            return st;
        if (c->d_initial_state)
            st = copy(ctx, r, r->v_ds0, r->v_dsn, (size_t)r->pieces * r->piece_state,
                      "an empty span's dS_0");
    } else {
        lajit_attn_bwd_args b;
        lj_cp_bwd_args(c, &b);
        b.initial_state = pool_view(&p1, s1, r, r->v_in, o);
        b.d_final_state = pool_view(&p2, s2, r, r->v_dsn, o);
        b.d_initial_state = c->d_initial_state ? pool_view(&p5, s5, r, r->v_ds0, o) : NULL;
        b.cu_seqlens = c->cu_seqlens;
        b.state_slots = slots_view(&ids, s3, r, ctx->cp_ids.ptr, o);
        if (c->ds) {
            b.ds = lj_device_view(&ds_part, part, o, 1, sd, NULL, (DLDataType){kDLFloat, 32, 1});
        }
        st = fail_at(ctx, r, lajit_attn_bwd(ctx, &b), "its pieces' gradients");
    }
    if (st == LAJIT_OK && c->d_initial_state)
        st = fail_at(ctx, r,
                     lj_state_pool_scatter(ctx, pool_view(&p5, s5, r, r->v_ds0, o),
                                           slots_view(&sl, s4, r, r->v_slots_in, o),
                                           c->d_initial_state, 0, c->stream),
                     "its pieces' dS_0");
    return st;
}
