/* ops.c — the op entry points: check the arguments (op_args.h: the forward and the backward
 * share one path), describe the problem, fill la_params and launch through the plan of its bucket
 * (plan_build.h). The backward runs as passes whose tensor roles its family spec declares.
 *
 * The hot path — a call whose bucket already has a plan — does tensor checks, a plan-table
 * probe and one cuLaunchKernel per kernel: no allocation, no Lua, no lock, no synchronisation,
 * so it can be captured in a CUDA graph. */
#include <stdint.h>
#include <string.h>

#include "op_args.h"
#include "params.h"
#include "plan_build.h"

/* ---- Forward -------------------------------------------------------------------------------- */

LAJIT_API lajit_status lajit_attn_fwd(lajit_ctx *ctx, const lajit_attn_fwd_args *a)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lj_env *env = &ctx->env;
    lajit_status st = lj_check_args(env, "lajit_attn_fwd", a ? &a->struct_size : NULL, sizeof *a,
                                    a ? a->flags : 0, a ? a->scale : 0);
    if (st != LAJIT_OK)
        return st;
    la_params lp;
    lj_problem p;
    lj_seq_shape sh;
    long long P;
    /* o may mix (fp32 inputs with a 16-bit o, or the reverse) and the states may be 16-bit
     * storage (one dtype for both): the problem's out_dtype and state_dtype. */
    /* Without o, the final state only (a span's local state): q may be absent too (not read). */
    const int state_only = a->o == NULL;
    if (state_only && !a->final_state)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "lajit_attn_fwd: o is NULL and so is final_state (nothing to compute)");
    const lj_seq_tensor seqs[] = {
        {"q", a->q, 0, &lp.q}, {"k", a->k, 0, &lp.k}, {"v", a->v, 1, &lp.v}, {"o", a->o, 1, &lp.o}};
    const lj_state_arg states[] = {{"initial_state", a->initial_state, &lp.s0, &p.has_initial},
                                   {"final_state", a->final_state, &lp.sn, &p.has_final}};
    lj_seq_call call = LJ_SEQ_CALL("lajit_attn_fwd", "q, k, v and o", LJ_OP_FWD, a, seqs, states);
    call.states16 = 1;
    call.mixed = "o";
    if (state_only) { /* k, v (and q when given) */
        call.seqs = a->q ? seqs : seqs + 1;
        call.n_seqs = a->q ? 3 : 2;
        call.required = "k and v";
    }
    if ((st = lj_seq_begin(env, &call, &p, &lp, &sh, &P)) != LAJIT_OK)
        return st;
    p.state_only = state_only;
    const lj_io_tensor io[] = {
        {"q", a->q, 0},
        {"k", a->k, 0},
        {"v", a->v, 0},
        {"s", a->s, 0},
        {"initial_state", a->initial_state, 0},
        {"cu_seqlens", a->cu_seqlens, 0},
        {"state_slots", a->state_slots, 0},
        {"o", a->o, 1},
        {"final_state", a->final_state, 1},
    };
    if ((st = lj_seq_finish(ctx, io, (int)(sizeof io / sizeof io[0]), "final_state",
                            "initial_state", &sh, P, a->scale, a->stream, &p, &lp)) != LAJIT_OK)
        return st;
    return lj_op_launch(ctx, a->family, &p, &lp, a->stream, NULL);
}

/* ---- Backward ------------------------------------------------------------------------------- */

/* device/params.c has the rule (the tuner sizes its workspace by it too). SIZE_MAX when that
 * does not fit in size_t (no such call can be served: lajit_attn_bwd refuses it). */
LAJIT_API size_t lajit_attn_bwd_workspace_size(int64_t nseq, int64_t H, int64_t E)
{
    return lj_ds_workspace_bytes(nseq, H, E);
}

/* The ds workspace: the caller's (float32 or int32 [n], 4n >= bytes) or the context's own,
 * grown when too small. */
static lajit_status bwd_workspace(lajit_ctx *ctx, const DLTensor *given, size_t bytes,
                                  unsigned long long *ptr)
{
    lj_env *env = &ctx->env;
    lajit_status st;
    if (given) {
        int64_t shape[1] = {-1};
        la_tensor4 w;
        if ((st = lj_tensor_view(env, "workspace", given, 1, shape, LJ_TENSOR_F32 | LJ_TENSOR_INT32,
                                 &w, NULL)) != LAJIT_OK)
            return st;
        if ((size_t)shape[0] * 4 < bytes)
            return lj_error(
                env, LAJIT_ERR_INVALID_ARGUMENT,
                "workspace has %lld bytes, ds needs %zu (lajit_attn_bwd_workspace_size)",
                (long long)shape[0] * 4, bytes);
        if (w.s3 != 1 && shape[0] > 1)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "workspace must be contiguous");
        *ptr = w.ptr;
        return LAJIT_OK;
    }
    if ((st = lj_ctx_buffer(ctx, &ctx->scratch, bytes, 0, NULL, "the backward's ds workspace")) !=
        LAJIT_OK)
        return st;
    *ptr = (unsigned long long)ctx->scratch.ptr;
    return LAJIT_OK;
}

LAJIT_API lajit_status lajit_attn_bwd(lajit_ctx *ctx, const lajit_attn_bwd_args *a)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lj_env *env = &ctx->env;
    lajit_status st = lj_check_args(env, "lajit_attn_bwd", a ? &a->struct_size : NULL, sizeof *a,
                                    a ? a->flags : 0, a ? a->scale : 0);
    if (st != LAJIT_OK)
        return st;
    if (a->ds && !a->s)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "lajit_attn_bwd: ds (the gradient of s) needs s");
    /* dq, dk and dv all NULL: dS_0 alone (the span's local gradient state, the building block
     * of context parallelism's backward): the passes that write a state run without outputs. */
    const int state_only = !a->dq && !a->dk && !a->dv;
    if (state_only && (!a->d_initial_state || a->ds))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "lajit_attn_bwd: dq, dk and dv are NULL, so only d_initial_state can be "
                        "computed: it must be given, and ds must be NULL");

    la_params lp;
    lj_problem p;
    lj_seq_shape sh;
    long long P;
    const lj_seq_tensor seqs[] = {{"q", a->q, 0, &lp.q},    {"k", a->k, 0, &lp.k},
                                  {"v", a->v, 1, &lp.v},    {"dout", a->dout, 1, &lp.dout},
                                  {"dq", a->dq, 0, &lp.dq}, {"dk", a->dk, 0, &lp.dk},
                                  {"dv", a->dv, 1, &lp.dv}};
    const lj_state_arg states[] = {{"initial_state", a->initial_state, &lp.s0, &p.has_initial},
                                   {"d_final_state", a->d_final_state, &lp.dsn, &p.has_dsn},
                                   {"d_initial_state", a->d_initial_state, &lp.ds0, &p.has_final}};
    lj_seq_call call =
        LJ_SEQ_CALL("lajit_attn_bwd", "q, k, v, dout, dq, dk and dv", LJ_OP_BWD, a, seqs, states);
    /* State only: q and dout (and k, v when given, checked alike though not read). */
    lj_seq_tensor only[4];
    if (state_only) {
        int n = 0;
        for (int i = 0; i < 4; i++)
            if (seqs[i].t || i == 0 || i == 3)
                only[n++] = seqs[i];
        call.seqs = only;
        call.n_seqs = n;
        call.required = "q and dout";
    }
    if ((st = lj_seq_begin(env, &call, &p, &lp, &sh, &P)) != LAJIT_OK)
        return st;
    p.state_only = state_only;
    if (a->ds) {
        int64_t shape[1] = {sh.H};
        la_tensor4 t;
        if ((st = lj_tensor_view(env, "ds", a->ds, 1, shape, LJ_TENSOR_F32, &t, NULL)) != LAJIT_OK)
            return st;
        lp.dsdecay = t.ptr;
        p.want_ds = 1;
    }
    const lj_io_tensor io[] = {
        {"q", a->q, 0},
        {"k", a->k, 0},
        {"v", a->v, 0},
        {"dout", a->dout, 0},
        {"s", a->s, 0},
        {"initial_state", a->initial_state, 0},
        {"d_final_state", a->d_final_state, 0},
        {"cu_seqlens", a->cu_seqlens, 0},
        {"state_slots", a->state_slots, 0},
        {"dq", a->dq, 1},
        {"dk", a->dk, 1},
        {"dv", a->dv, 1},
        {"ds", a->ds, 1},
        {"d_initial_state", a->d_initial_state, 1},
        {"workspace", a->ds ? a->workspace : NULL, 1},
    };
    if ((st = lj_seq_finish(ctx, io, (int)(sizeof io / sizeof io[0]), NULL, NULL, &sh, P, a->scale,
                            a->stream, &p, &lp)) != LAJIT_OK)
        return st;
    /* Long sequences with few heads and ds: by segments (bwd_segments.c). */
    const int segments = lj_bwd_segments(ctx, a, sh.H, sh.N, sh.E);
    if (segments)
        return lj_bwd_ds_by_segments(ctx, a, segments, sh.B, sh.H, sh.N, sh.D, sh.E);
    if (a->ds) {
        size_t bytes = lajit_attn_bwd_workspace_size(sh.B, sh.H, sh.E);
        if (bytes == SIZE_MAX)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "lajit_attn_bwd: the ds workspace for nseq=%lld H=%lld E=%lld does not "
                            "fit in size_t",
                            sh.B, sh.H, sh.E);
        if ((st = bwd_workspace(ctx, a->workspace, bytes, &lp.workspace)) != LAJIT_OK)
            return st;
    }

    /* The passes as the family spec declares them (its `roles`: templates/la_bwd/family.lua):
     * each pass's problem keeps only the flags its kernel uses, so identical kernels share one
     * plan and one tuning bucket, and its kernel receives the op's tensors in the roles named. A
     * kernel may compute a later pass's part too (la_bwd_sm90's dq pass computes ds: its launch
     * `covers` it); that pass is then skipped. */
    const lj_roles *roles;
    if ((st = lj_op_roles(ctx, a->family, LJ_OP_BWD, &roles)) != LAJIT_OK)
        return st;
    unsigned done = 0;
    for (int i = 0; i < roles->n; i++) {
        const lj_pass_role *r = &roles->pass[i];
        lj_problem pp;
        if (!lj_roles_problem(r, &p, &pp) || (r->part < 32 && (done >> r->part) & 1u))
            continue;
        if (state_only && (r->all || r->slot[LJ_SLOT_SN] < 0 || !pp.has_final))
            continue; /* no state written: nothing to run without outputs */
        la_params sp;
        lj_roles_params(r, &lp, &sp);
        if (r->ticket && pp.want_ds) {
            if (!lp.workspace)
                return lj_error(env, LAJIT_ERR_TEMPLATE,
                                "a pass with a ticket needs the workspace");
            CUresult cr = LJ_CU(env, ctx->device.drv, cuMemsetD32Async, (CUdeviceptr)lp.workspace,
                                0u, 4, (CUstream)a->stream);
            if (cr != CUDA_SUCCESS)
                return lj_driver_error(env, ctx->device.drv, cr, "cuMemsetD32Async (ds ticket)");
        }
        unsigned covers = 0;
        if ((st = lj_op_launch(ctx, a->family, &pp, &sp, a->stream, &covers)) != LAJIT_OK)
            return st;
        done |= covers;
    }
    return LAJIT_OK;
}

/* ---- Decode --------------------------------------------------------------------------------- */

LAJIT_API lajit_status lajit_attn_decode(lajit_ctx *ctx, const lajit_attn_decode_args *a)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lj_env *env = &ctx->env;
    lajit_status st = lj_check_args(env, "lajit_attn_decode", a ? &a->struct_size : NULL, sizeof *a,
                                    a ? a->flags : 0, a ? a->scale : 0);
    if (st != LAJIT_OK)
        return st;
    if (!a->q || !a->k || !a->v || !a->o || !a->state)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "lajit_attn_decode: q, k, v, o and state are required");

    la_params lp;
    memset(&lp, 0, sizeof lp);
    lj_problem p;
    memset(&p, 0, sizeof p);
    p.op = LJ_OP_DECODE;
    p.vk = (a->flags & LAJIT_STATE_VK) != 0;
    int nd = a->q->ndim == 4 ? 4 : 3; /* [B,T,H,D] or [B,H,D] */
    int64_t qs[4] = {-1, -1, -1, -1};
    lj_dtype dt, dt2;
    la_tensor4 q, k, v, o;
    if ((st = lj_tensor_view(env, "q", a->q, nd, qs, LJ_TENSOR_FLOATS, &q, &dt)) != LAJIT_OK)
        return st;
    if ((st = lj_tensor_view(env, "k", a->k, nd, qs, 1u << dt, &k, &dt2)) != LAJIT_OK)
        return st;
    int64_t vs[4] = {qs[0], qs[1], qs[2], -1};
    if (nd == 3)
        vs[2] = -1;
    if ((st = lj_tensor_view(env, "v", a->v, nd, vs, 1u << dt, &v, &dt2)) != LAJIT_OK)
        return st;
    lj_dtype odt;
    if ((st = lj_tensor_view(env, "o", a->o, nd, vs, LJ_TENSOR_FLOATS, &o, &odt)) != LAJIT_OK ||
        (st = lj_check_out_dtype(env, "o", dt, odt)) != LAJIT_OK)
        return st;
    p.dtype = dt;
    p.out_dtype = odt != dt ? (int)odt + 1 : 0;
    long long B = qs[0], T = nd == 4 ? qs[1] : 1, H = qs[nd - 2], D = qs[nd - 1], E = vs[nd - 1];
    if (T > 8)
        return lj_error(env, LAJIT_ERR_UNSUPPORTED, "decode: T = %lld steps, at most 8", T);
    if ((st = lj_check_head_dims(env, D, E)) != LAJIT_OK)
        return st;
    /* Kernels see logical [B, H, T, D]: (row, head, step, d). tensor views right-align a 3-D
     * tensor into s1..s3, so map explicitly. */
    la_tensor4 *dst[4] = {&lp.q, &lp.k, &lp.v, &lp.o};
    const la_tensor4 *src[4] = {&q, &k, &v, &o};
    for (int i = 0; i < 4; i++) {
        dst[i]->ptr = src[i]->ptr;
        dst[i]->s3 = 1;
        if (nd == 4) {
            dst[i]->s0 = src[i]->s0;
            dst[i]->s1 = src[i]->s2;
            dst[i]->s2 = src[i]->s1;
        } else {
            dst[i]->s0 = src[i]->s1;
            dst[i]->s1 = src[i]->s2;
            dst[i]->s2 = 0;
        }
        /* la_decode reads a row's T steps at 32-bit offsets from its 64-bit (row, head) base. */
        static const char *const names[4] = {"q", "k", "v", "o"};
        if ((st = lj_tensor_tile_span(env, names[i], "one row's T steps", T, dst[i]->s2,
                                      i < 2 ? D : E, 1)) != LAJIT_OK)
            return st;
    }
    if ((st = lj_view_decay(env, a->s, H, &lp.decay)) != LAJIT_OK)
        return st;
    p.decay = a->s != NULL;
    long long P = -1;
    /* The pool: float32, or 16-bit storage accumulated in fp32 (the problem's state_dtype). */
    if ((st = lj_view_state(env, "state", a->state, &P, H, D, E, p.vk, LJ_TENSOR_FLOATS,
                            &p.state_dtype, &lp.s0)) != LAJIT_OK)
        return st;
    /* la_decode reads one state (its D x E values) at 32-bit offsets from a 64-bit (slot, head)
     * base, and so its step states (compact: far inside). */
    if ((st = lj_tensor_tile_span(env, "state", "one state's D x E values", D, lp.s0.s2, E,
                                  lp.s0.s3)) != LAJIT_OK)
        return st;
    lp.sn = lp.s0;
    if (a->state_slots) {
        int64_t ss[1] = {B};
        la_tensor4 sl;
        if ((st = lj_tensor_view(env, "state_slots", a->state_slots, 1, ss, LJ_TENSOR_INT32, &sl,
                                 NULL)) != LAJIT_OK)
            return st;
        lp.slots = sl.ptr;
    } else if (P < B) {
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "state has %lld slots for %lld rows and no state_slots", P, B);
    }
    if (a->step_states) {
        long long rows = B * T;
        la_tensor4 ss;
        /* Compact [B,T,H,D,E] is the same memory as [B*T,H,D,E]; require compactness by
         * viewing it as 5-D and checking strides. */
        if (a->step_states->ndim != 5)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "step_states must be [B,T,H,%s]",
                            p.vk ? "E,D" : "D,E");
        DLTensor flat = *a->step_states;
        int64_t fshape[4];
        if (flat.shape[0] != B || flat.shape[1] != T)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "step_states is [%lld,%lld,...], expected [%lld,%lld,...]",
                            (long long)flat.shape[0], (long long)flat.shape[1], B, T);
        if (flat.strides) {
            long long expect = 1;
            for (int d = 4; d >= 0; d--) {
                if (flat.strides[d] != expect)
                    return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "step_states must be compact");
                expect *= flat.shape[d];
            }
        }
        fshape[0] = rows;
        for (int d = 1; d < 4; d++)
            fshape[d] = flat.shape[d + 1];
        flat.ndim = 4;
        flat.shape = fshape;
        flat.strides = NULL;
        long long rowsP = rows;
        /* The kernel writes the step states as it writes the pool: the pool's dtype. */
        if ((st = lj_view_state(env, "step_states", &flat, &rowsP, H, D, E, p.vk,
                                1u << p.state_dtype, NULL, &ss)) != LAJIT_OK)
            return st;
        lp.step_states = ss;
        p.step_states = 1;
    }
    const lj_io_tensor io[] = {
        {"q", a->q, 0},
        {"k", a->k, 0},
        {"v", a->v, 0},
        {"s", a->s, 0},
        {"state_slots", a->state_slots, 0},
        {"o", a->o, 1},
        {"state", a->state, 1},
        {"step_states", a->step_states, 1},
    };
    if ((st = lj_check_io(ctx, io, (int)(sizeof io / sizeof io[0]), NULL, NULL)) != LAJIT_OK)
        return st;
    p.B = (int)B;
    p.H = (int)H;
    p.N = (int)T;
    p.D = (int)D;
    p.E = (int)E;
    p.T = (int)T;
    p.has_initial = p.has_final = 1;
    lp.B = (int)B;
    lp.H = (int)H;
    lp.N = (int)T;
    lp.D = (int)D;
    lp.E = (int)E;
    lp.T = (int)T;
    lp.nseq = (int)B;
    lp.P = (int)P;
    lp.scale = a->scale;
    if (ctx->flags & LAJIT_CTX_CHECKED) {
        st = lj_check_device_values(ctx, &lp, lp.slots ? (int)B : 0, 0, a->stream);
        if (st != LAJIT_OK)
            return st;
    }
    return lj_op_launch(ctx, a->family, &p, &lp, a->stream, NULL);
}
