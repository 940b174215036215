/* attn_cases.c — gpu test cases of the attention ops against the float64 reference
 * (attn_cases.h). */
#include "attn_cases.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "context.h"
#include "gpu.h"
#include "la_ref.h"
#include "search.h"
#include "tunedb.h"

double case_tolerance(lj_dtype dt)
{
    return dt == LJ_BF16 ? 6e-3 : 1e-3;
}

static unsigned rng_state;

void case_seed(unsigned seed)
{
    rng_state = seed ? seed : 12345;
}

static float uniform(float amp)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return amp * ((float)(rng_state >> 8) / 8388608.0f - 1.0f);
}

void case_random_fill(float *x, size_t n, float amp, lj_dtype dt)
{
    for (size_t i = 0; i < n; i++)
        x[i] = lj_round_to(uniform(amp), dt);
}

lajit_ctx *case_open_ctx(void)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    return ctx;
}

void case_check(const char *what, const double *got, const double *ref, size_t rows, size_t cols,
                double tol, double *rel_out)
{
    char why[256];
    double rel;
    if (!la_ref_check(got, ref, rows, cols, tol, &rel, why, sizeof why))
        lj_test_fail(__FILE__, __LINE__, "%s: %s", what, why);
    if (rel_out)
        *rel_out = rel;
}

/* ---- Forward --------------------------------------------------------------------------------- */

/* A configuration other than the default runs only as a tuned winner, so a pinned case records
 * it as the winner of its bucket in a tuning database of its own (the case's temporary directory:
 * nothing shared with other tests) and keeps the op's log to prove the plan used it. */
typedef struct plan_log {
    char plans[2048];
} plan_log;

static void keep_plan_lines(void *user, lajit_log_level level, const char *message)
{
    (void)level;
    plan_log *log = user;
    if (strncmp(message, "plan ", 5) == 0) {
        size_t used = strlen(log->plans);
        snprintf(log->plans + used, sizeof log->plans - used, "%s\n", message);
    }
}

static void pin_config(lajit_ctx *ctx, const fwd_case *c, int nseq, int longest, char *cfgtext,
                       size_t cap)
{
    lj_env *env = lajit__ctx_env(ctx);
    lj_family *f;
    lj_device *dev;
    ASSERT_OK(lajit__ctx_family(ctx, c->family, &f));
    ASSERT_OK(lajit__ctx_device(ctx, &dev));
    lj_problem p;
    memset(&p, 0, sizeof p);
    p.op = LJ_OP_FWD;
    p.dtype = c->dtype;
    p.B = nseq;
    p.H = c->H;
    p.N = longest;
    p.D = c->D;
    p.E = c->E;
    p.decay = c->decay;
    p.has_initial = c->initial;
    p.has_final = c->final;
    p.varlen = c->nseq > 0;
    p.vk = c->vk;
    lj_config base, cfg;
    ASSERT_OK(lj_family_default(f, &p, &dev->info, &base));
    ASSERT_OK(lj_config_parse(env, f, &base, c->config, &cfg));
    int ok;
    char why[256];
    ASSERT_OK(lj_family_valid(f, &cfg, &p, &dev->info, &ok, why, sizeof why));
    if (!ok)
        lj_test_fail(__FILE__, __LINE__, "pinned [%s] is not valid: %s", c->config, why);
    lj_tune_id id;
    ASSERT_OK(lj_tune_id_make(env, f, dev, &p, &id));
    lj_tune_result r;
    memset(&r, 0, sizeof r);
    lj_config_format(&cfg, r.config, sizeof r.config);
    r.ms = 1.0;
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(env, lj_test_tmpdir(), &db));
    ASSERT_OK(lj_tunedb_record(db, &id, &r, 1, r.config, 1.0));
    lj_tunedb_close(db);
    snprintf(cfgtext, cap, "[%s]", r.config);
}

void run_fwd_case(const fwd_case *c)
{
    lj_gpu_init();
    case_seed(c->seed);
    lj_dtype dt = c->dtype;
    const int H = c->H, D = c->D, E = c->E;
    const int varlen = c->nseq > 0;
    int nseq = varlen ? c->nseq : c->B;
    int cu[17] = {0};
    long long T = 0;
    if (varlen) {
        for (int i = 0; i < nseq; i++)
            cu[i + 1] = cu[i] + c->lens[i];
        T = cu[nseq];
    }
    const int B = varlen ? 1 : c->B, N = varlen ? (int)T : c->N;
    size_t tokens = (size_t)B * N; /* rows of q per head */
    size_t nq = tokens * H * D, nv = tokens * H * E, esz = lj_test_dtype_size(dt);

    /* Host inputs in the logical order (b, h, t, .) and their device copies in memory order. */
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4);
    case_random_fill(q, nq, 0.5f, dt);
    case_random_fill(k, nq, 0.5f, dt);
    case_random_fill(v, nv, 0.5f, dt);
    /* Memory strides (elements) of the logical [B, H, N, X] view. */
    long long sq[4], sv[4];
    int bnhd = c->bnhd || varlen; /* varlen is packed [T, H, X] */
    if (bnhd) {
        long long qs[4] = {(long long)N * H * D, D, (long long)H * D, 1};
        long long vs[4] = {(long long)N * H * E, E, (long long)H * E, 1};
        memcpy(sq, qs, sizeof qs);
        memcpy(sv, vs, sizeof vs);
    } else {
        long long qs[4] = {(long long)H * N * D, (long long)N * D, D, 1};
        long long vs[4] = {(long long)H * N * E, (long long)N * E, E, 1};
        memcpy(sq, qs, sizeof qs);
        memcpy(sv, vs, sizeof vs);
    }
    float *mq = malloc(nq * 4), *mk = malloc(nq * 4), *mv = malloc(nv * 4);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < N; t++) {
                size_t lq = (((size_t)b * H + h) * N + t) * D,
                       lv = (((size_t)b * H + h) * N + t) * E;
                size_t oq = (size_t)(b * sq[0] + h * sq[1] + t * sq[2]);
                size_t ov = (size_t)(b * sv[0] + h * sv[1] + t * sv[2]);
                memcpy(mq + oq, q + lq, (size_t)D * 4);
                memcpy(mk + oq, k + lq, (size_t)D * 4);
                memcpy(mv + ov, v + lv, (size_t)E * 4);
            }
    CUdeviceptr dq = lj_gpu_alloc(nq * esz), dk = lj_gpu_alloc(nq * esz);
    CUdeviceptr dv = lj_gpu_alloc(nv * esz), dout = lj_gpu_alloc(nv * esz);
    lj_gpu_upload_as(dq, mq, nq, dt);
    lj_gpu_upload_as(dk, mk, nq, dt);
    lj_gpu_upload_as(dv, mv, nv, dt);
    lj_gpu_poison(dout, nv * esz);

    /* Decay rates: head 0 exactly 0 (the decay path at s = 0), others ALiBi-like. */
    float *s = malloc((size_t)H * 4);
    for (int h = 0; h < H; h++)
        s[h] = h == 0 ? 0.0f : powf(2.0f, -8.0f * (float)h / (float)H);
    CUdeviceptr ds = lj_gpu_alloc((size_t)H * 4);
    lj_gpu_upload(ds, s, (size_t)H * 4);

    /* States: [P, H, D, E] (or VK). Varlen pools have spare slots that must stay untouched. */
    int P = varlen ? nseq + 2 : B;
    int slots[16];
    for (int i = 0; i < nseq; i++)
        slots[i] = varlen ? P - 1 - i : i; /* distinct slots, not in sequence order */
    if (varlen && c->slot_minus_one)
        slots[nseq / 2] = -1;
    size_t nst = (size_t)P * H * D * E;
    float *s0 = malloc(nst * 4), *s0_mem = malloc(nst * 4);
    case_random_fill(s0, nst, 1.0f, LJ_F32);
    /* memory order: (slot, h, d, e) KV or (slot, h, e, d) VK */
    for (size_t sh = 0; sh < (size_t)P * H; sh++)
        for (int d = 0; d < D; d++)
            for (int e = 0; e < E; e++)
                s0_mem[sh * D * E + (c->vk ? (size_t)e * D + d : (size_t)d * E + e)] =
                    s0[sh * D * E + (size_t)d * E + e];
    CUdeviceptr dS0 = 0, dSN = 0;
    if (c->initial || c->alias) {
        dS0 = lj_gpu_alloc(nst * 4);
        lj_gpu_upload(dS0, s0_mem, nst * 4);
    }
    if (c->final) {
        dSN = c->alias ? dS0 : lj_gpu_alloc(nst * 4);
        if (!c->alias)
            lj_gpu_poison(dSN, nst * 4);
    }
    CUdeviceptr dcu = 0, dslots = 0;
    if (varlen) {
        dcu = lj_gpu_alloc((size_t)(nseq + 1) * 4);
        lj_gpu_upload(dcu, cu, (size_t)(nseq + 1) * 4);
        dslots = lj_gpu_alloc((size_t)nseq * 4);
        lj_gpu_upload(dslots, slots, (size_t)nseq * 4);
    }

    /* DLTensor views. */
    lj_test_tensor tq, tk, tv, to, tsd, ts0, tsn, tcu, tsl;
    DLDataType dl = lj_test_dl_dtype(dt);
    if (varlen) {
        int64_t qshape[3] = {T, H, D}, vshape[3] = {T, H, E};
        lj_gpu_tensor(&tq, dq, 0, 3, qshape, NULL, dl);
        lj_gpu_tensor(&tk, dk, 0, 3, qshape, NULL, dl);
        lj_gpu_tensor(&tv, dv, 0, 3, vshape, NULL, dl);
        lj_gpu_tensor(&to, dout, 0, 3, vshape, NULL, dl);
    } else {
        int64_t qshape[4] = {B, H, N, D}, vshape[4] = {B, H, N, E};
        int64_t qstr[4] = {sq[0], sq[1], sq[2], 1}, vstr[4] = {sv[0], sv[1], sv[2], 1};
        lj_gpu_tensor(&tq, dq, 0, 4, qshape, qstr, dl);
        lj_gpu_tensor(&tk, dk, 0, 4, qshape, qstr, dl);
        lj_gpu_tensor(&tv, dv, 0, 4, vshape, vstr, dl);
        lj_gpu_tensor(&to, dout, 0, 4, vshape, vstr, dl);
    }
    int64_t hshape[1] = {H}, stshape[4] = {P, H, c->vk ? E : D, c->vk ? D : E};
    int64_t cushape[1] = {nseq + 1}, slshape[1] = {nseq};
    lj_gpu_tensor(&tsd, ds, 0, 1, hshape, NULL, lj_test_dl_dtype(LJ_F32));
    lajit_attn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &tq.t;
    a.k = &tk.t;
    a.v = &tv.t;
    a.o = &to.t;
    a.s = c->decay ? &tsd.t : NULL;
    a.scale = c->scale != 0 ? c->scale : 1.0f;
    a.flags = c->vk ? LAJIT_STATE_VK : 0;
    a.family = c->family;
    if (c->initial)
        a.initial_state = lj_gpu_tensor(&ts0, dS0, 0, 4, stshape, NULL, lj_test_dl_dtype(LJ_F32));
    if (c->final)
        a.final_state = lj_gpu_tensor(&tsn, dSN, 0, 4, stshape, NULL, lj_test_dl_dtype(LJ_F32));
    if (varlen) {
        a.cu_seqlens = lj_gpu_tensor(&tcu, dcu, 0, 1, cushape, NULL, lj_test_dl_int32());
        if (c->initial || c->final)
            a.state_slots = lj_gpu_tensor(&tsl, dslots, 0, 1, slshape, NULL, lj_test_dl_int32());
    }

    lajit_ctx *ctx;
    plan_log log = {""};
    char pinned[300] = "";
    if (c->config) {
        lajit_ctx_desc desc;
        lajit_ctx_desc_init(&desc);
        desc.cache_dir = lj_test_tmpdir();
        desc.log = keep_plan_lines;
        desc.log_user = &log;
        desc.log_level = LAJIT_LOG_INFO;
        ASSERT_OK(lajit_ctx_create(&desc, &ctx));
        int longest = 0;
        for (int i = 0; i < c->nseq; i++)
            longest = c->lens[i] > longest ? c->lens[i] : longest;
        pin_config(ctx, c, nseq, varlen ? longest : c->N, pinned, sizeof pinned);
    } else {
        ctx = case_open_ctx();
    }
    lajit_status st = lajit_attn_fwd(ctx, &a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "lajit_attn_fwd: %s: %s", lajit_status_string(st),
                     lajit_errmsg(ctx));
    lj_gpu_sync();
    if (c->config && !strstr(log.plans, pinned))
        lj_test_fail(__FILE__, __LINE__, "the op did not run the pinned %s: %s", pinned, log.plans);

    /* Results in memory order, then back to logical order. */
    float *mo = malloc(nv * 4), *sn_mem = malloc(nst * 4);
    lj_gpu_download_as(mo, dout, nv, dt);
    if (c->final)
        lj_gpu_download(sn_mem, dSN, nst * 4);

    double *ref_o = calloc(nv, sizeof(double)), *got_o = calloc(nv, sizeof(double));
    double *ref_sn = calloc(nst, sizeof(double)), *got_sn = calloc(nst, sizeof(double));
    size_t sn_rows = 0;
    double *bq = malloc(sizeof(double) * (size_t)N * D),
           *bk = malloc(sizeof(double) * (size_t)N * D);
    double *bv = malloc(sizeof(double) * (size_t)N * E),
           *bo = malloc(sizeof(double) * (size_t)N * E);
    double *bs0 = malloc(sizeof(double) * (size_t)D * E),
           *bsn = malloc(sizeof(double) * (size_t)D * E);
    size_t row = 0;
    for (int seq = 0; seq < nseq; seq++) {
        int b = varlen ? 0 : seq;
        int t0 = varlen ? cu[seq] : 0, len = varlen ? c->lens[seq] : N;
        int slot = slots[seq];
        for (int h = 0; h < H; h++) {
            for (int t = 0; t < len; t++) {
                for (int d = 0; d < D; d++) {
                    bq[(size_t)t * D + d] = q[(((size_t)b * H + h) * N + t0 + t) * D + d];
                    bk[(size_t)t * D + d] = k[(((size_t)b * H + h) * N + t0 + t) * D + d];
                }
                for (int e = 0; e < E; e++)
                    bv[(size_t)t * E + e] = v[(((size_t)b * H + h) * N + t0 + t) * E + e];
            }
            int has_s0 = c->initial && slot >= 0;
            for (int i = 0; i < D * E; i++)
                bs0[i] = has_s0 ? s0[((size_t)slot * H + h) * D * E + i] : 0.0;
            double lam = c->decay ? exp(-(double)s[h]) : 1.0;
            la_ref_forward(len, D, E, bq, bk, bv, lam, a.scale, has_s0 ? bs0 : NULL, bo, bsn);
            for (int t = 0; t < len; t++) {
                size_t ov = (size_t)(b * sv[0] + h * sv[1] + (t0 + t) * sv[2]);
                for (int e = 0; e < E; e++) {
                    ref_o[row * E + e] = bo[(size_t)t * E + e];
                    got_o[row * E + e] = mo[ov + e];
                }
                row++;
            }
            if (c->final && slot >= 0) {
                for (int d = 0; d < D; d++)
                    for (int e = 0; e < E; e++) {
                        size_t m = ((size_t)slot * H + h) * D * E +
                                   (c->vk ? (size_t)e * D + d : (size_t)d * E + e);
                        ref_sn[sn_rows * E + e] = bsn[(size_t)d * E + e];
                        got_sn[sn_rows * E + e] = sn_mem[m];
                        if (e == E - 1)
                            sn_rows++;
                    }
            }
        }
    }
    double tol = case_tolerance(dt), rel_o = 0, rel_s = 0;
    if (row > 0)
        case_check("o", got_o, ref_o, row, (size_t)E, tol, &rel_o);
    /* DESIGN.md checks S_N on its own with the dtype's tolerance: chunked kernels multiply
     * 16-bit operands (the decay-weighted keys are rounded), so the state carries 16-bit
     * rounding too. */
    if (sn_rows > 0)
        case_check("final state", got_sn, ref_sn, sn_rows, (size_t)E, tol, &rel_s);
    /* Slots no sequence writes keep their bytes (pool entries of −1 rows and spare slots). */
    if (c->final && varlen) {
        for (int p = 0; p < P; p++) {
            int used = 0;
            for (int i = 0; i < nseq; i++)
                used |= slots[i] == p;
            if (used)
                continue;
            const float *before = c->alias ? s0_mem : NULL;
            for (size_t i = 0; i < (size_t)H * D * E; i++) {
                float x = sn_mem[(size_t)p * H * D * E + i];
                uint32_t bits, want;
                memcpy(&bits, &x, 4);
                if (before)
                    memcpy(&want, &before[(size_t)p * H * D * E + i], 4);
                else
                    want = 0xFFFFFFFFu;
                if (bits != want)
                    lj_test_fail(__FILE__, __LINE__, "pool slot %d (no sequence) was written", p);
            }
        }
    }
    printf("%s %s B=%d H=%d N=%d D=%d E=%d%s%s%s%s%s%s: o rel L2 %.2e, S_N rel L2 %.2e\n",
           c->family ? c->family : "default", lj_dtype_name(dt), c->B, H, N, D, E,
           c->decay ? " decay" : "", c->initial ? " S0" : "", c->final ? " SN" : "",
           c->alias ? " in-place" : "", c->vk ? " vk" : "",
           varlen ? " varlen" : (c->bnhd ? " bnhd" : ""), rel_o, rel_s);
    lajit_ctx_destroy(ctx);
    lj_gpu_free(dq);
    lj_gpu_free(dk);
    lj_gpu_free(dv);
    lj_gpu_free(dout);
    lj_gpu_free(ds);
    if (dSN && dSN != dS0)
        lj_gpu_free(dSN);
    lj_gpu_free(dS0);
    lj_gpu_free(dcu);
    lj_gpu_free(dslots);
    free(q), free(k), free(v), free(mq), free(mk), free(mv), free(s), free(s0), free(s0_mem);
    free(mo), free(sn_mem), free(ref_o), free(got_o), free(ref_sn), free(got_sn);
    free(bq), free(bk), free(bv), free(bo), free(bs0), free(bsn);
}

/* ---- Decode ---------------------------------------------------------------------------------- */

/* One call of the float64 reference on the pool S (slot, h, d, e): every row with a slot, T steps
 * each. Writes the outputs of those rows in (b, h, t) order to ref_o and each step's state to
 * ref_steps (both optional); returns the number of output rows. */
static size_t decode_reference(const decode_case *c, const float *q, const float *k, const float *v,
                               const float *s, float scale, const int *slots, double *S,
                               double *ref_o, double *ref_steps)
{
    const int B = c->B, H = c->H, D = c->D, E = c->E, T = c->T;
    const size_t DE = (size_t)D * E;
    size_t rows = 0;
    for (int b = 0; b < B; b++) {
        if (slots[b] < 0)
            continue;
        for (int h = 0; h < H; h++) {
            double *Sb = S + ((size_t)slots[b] * H + h) * DE;
            for (int t = 0; t < T; t++) {
                double qd[256], kd[256], vd[256], od[256];
                for (int d = 0; d < D; d++) {
                    qd[d] = q[(((size_t)b * T + t) * H + h) * D + d];
                    kd[d] = k[(((size_t)b * T + t) * H + h) * D + d];
                }
                for (int e = 0; e < E; e++)
                    vd[e] = v[(((size_t)b * T + t) * H + h) * E + e];
                la_ref_decode_step(D, E, Sb, qd, kd, vd, c->decay ? exp(-(double)s[h]) : 1.0, scale,
                                   od);
                if (ref_o)
                    memcpy(ref_o + rows * E, od, sizeof(double) * (size_t)E);
                if (ref_steps)
                    memcpy(ref_steps + (((size_t)b * T + t) * H + h) * DE, Sb, DE * sizeof(double));
                rows++;
            }
        }
    }
    return rows;
}

void run_decode_case(const decode_case *c)
{
    lj_gpu_init();
    rng_state = c->seed ? c->seed : 777;
    lj_dtype dt = c->dtype;
    const int B = c->B, H = c->H, D = c->D, E = c->E, T = c->T;
    const int calls = c->calls > 0 ? c->calls : 1;
    const int P = c->slots ? B + 3 : B;
    size_t esz = lj_test_dtype_size(dt), DE = (size_t)D * E;
    /* A shuffled permutation of the pool's slots (Fisher-Yates), the first B used. */
    int slots[128];
    for (int i = 0; i < P; i++)
        slots[i] = i;
    for (int i = P - 1; c->slots && i > 0; i--) {
        rng_state = rng_state * 1664525u + 1013904223u;
        int j = (int)((rng_state >> 8) % (unsigned)(i + 1)), x = slots[i];
        slots[i] = slots[j];
        slots[j] = x;
    }
    if (c->slots && B > 1)
        slots[1] = -1;
    /* Pool: random states; the reference keeps float64 copies in (slot, h, d, e). */
    size_t nst = (size_t)P * H * DE;
    float *pool = malloc(nst * 4), *pool_mem = malloc(nst * 4), *after = malloc(nst * 4);
    case_random_fill(pool, nst, 1.0f, LJ_F32);
    double *S = malloc(nst * sizeof(double));
    for (size_t i = 0; i < nst; i++)
        S[i] = pool[i];
    for (size_t sh = 0; sh < (size_t)P * H; sh++)
        for (int d = 0; d < D; d++)
            for (int e = 0; e < E; e++)
                pool_mem[sh * DE + (c->vk ? (size_t)e * D + d : (size_t)d * E + e)] =
                    pool[sh * DE + (size_t)d * E + e];
    CUdeviceptr dpool = lj_gpu_alloc(nst * 4);
    lj_gpu_upload(dpool, pool_mem, nst * 4);
    float *s = malloc((size_t)H * 4);
    for (int h = 0; h < H; h++)
        s[h] = h == 0 ? 0.0f : powf(2.0f, -8.0f * (float)h / (float)H);
    CUdeviceptr ds = lj_gpu_alloc((size_t)H * 4);
    lj_gpu_upload(ds, s, (size_t)H * 4);
    CUdeviceptr dslots = lj_gpu_alloc((size_t)B * 4);
    lj_gpu_upload(dslots, slots, (size_t)B * 4);
    /* q, k, v, o: [B, T, H, X] compact (T = 1: [B, H, X]). */
    size_t nq = (size_t)B * T * H * D, nv = (size_t)B * T * H * E;
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), *o = malloc(nv * 4);
    CUdeviceptr dq = lj_gpu_alloc(nq * esz), dk = lj_gpu_alloc(nq * esz),
                dv = lj_gpu_alloc(nv * esz);
    CUdeviceptr dout = lj_gpu_alloc(nv * esz);
    size_t nsteps = (size_t)B * T * H * DE;
    CUdeviceptr dsteps = c->step_states ? lj_gpu_alloc(nsteps * 4) : 0;
    float *steps = c->step_states ? malloc(nsteps * 4) : NULL;
    double *ref_steps = c->step_states ? malloc(nsteps * sizeof(double)) : NULL;

    lj_test_tensor tq, tk, tv, to, tsd, tpool, tsl, tsteps;
    DLDataType dl = lj_test_dl_dtype(dt);
    int nd = T > 1 ? 4 : 3;
    int64_t qs4[4] = {B, T, H, D}, vs4[4] = {B, T, H, E}, qs3[3] = {B, H, D}, vs3[3] = {B, H, E};
    lj_gpu_tensor(&tq, dq, 0, nd, nd == 4 ? qs4 : qs3, NULL, dl);
    lj_gpu_tensor(&tk, dk, 0, nd, nd == 4 ? qs4 : qs3, NULL, dl);
    lj_gpu_tensor(&tv, dv, 0, nd, nd == 4 ? vs4 : vs3, NULL, dl);
    lj_gpu_tensor(&to, dout, 0, nd, nd == 4 ? vs4 : vs3, NULL, dl);
    int64_t hshape[1] = {H}, pshape[4] = {P, H, c->vk ? E : D, c->vk ? D : E}, bshape[1] = {B};
    int64_t sshape[5] = {B, T, H, c->vk ? E : D, c->vk ? D : E};
    lajit_attn_decode_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &tq.t;
    a.k = &tk.t;
    a.v = &tv.t;
    a.o = &to.t;
    a.s = c->decay ? lj_gpu_tensor(&tsd, ds, 0, 1, hshape, NULL, lj_test_dl_dtype(LJ_F32)) : NULL;
    a.scale = 0.75f;
    a.state = lj_gpu_tensor(&tpool, dpool, 0, 4, pshape, NULL, lj_test_dl_dtype(LJ_F32));
    a.state_slots =
        c->slots ? lj_gpu_tensor(&tsl, dslots, 0, 1, bshape, NULL, lj_test_dl_int32()) : NULL;
    a.step_states = c->step_states ? lj_gpu_tensor(&tsteps, dsteps, 0, 5, sshape, NULL,
                                                   lj_test_dl_dtype(LJ_F32))
                                   : NULL;
    a.flags = c->vk ? LAJIT_STATE_VK : 0;
    a.family = c->family;

    lajit_ctx *ctx = case_open_ctx();
    const lj_driver *drv = lj_gpu_driver();
    CUstream stream = NULL;
    CUgraphExec exec = NULL;
    double *ref_o = malloc(nv * sizeof(double)), *got_o = malloc(nv * sizeof(double));
    double worst_o = 0;
    size_t check_rows = 0;
    for (int call = 0; call < calls; call++) {
        int fresh = !c->graph || call == 0;
        if (fresh) {
            case_random_fill(q, nq, 0.5f, dt);
            case_random_fill(k, nq, 0.5f, dt);
            case_random_fill(v, nv, 0.5f, dt);
            lj_gpu_upload_as(dq, q, nq, dt);
            lj_gpu_upload_as(dk, k, nq, dt);
            lj_gpu_upload_as(dv, v, nv, dt);
        }
        lj_gpu_poison(dout, nv * esz);
        if (c->step_states)
            lj_gpu_poison(dsteps, nsteps * 4);
        /* The poison (legacy stream) must land before a launch on a non-blocking stream. */
        lj_gpu_sync();
        lajit_status st;
        if (c->graph) {
            if (call == 0) {
                ASSERT_EQ(drv->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
                a.stream = stream;
                ASSERT_OK(lajit_attn_decode(ctx, &a)); /* builds the plan outside the capture */
                ASSERT_EQ(drv->cuStreamSynchronize(stream), CUDA_SUCCESS);
                /* That call advanced the state once: the reference does the same. */
                decode_reference(c, q, k, v, s, a.scale, slots, S, NULL, NULL);
                lj_gpu_poison(dout, nv * esz);
                lj_gpu_sync();
                CUgraph g;
                ASSERT_EQ(drv->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                          CUDA_SUCCESS);
                st = lajit_attn_decode(ctx, &a);
                ASSERT_EQ(drv->cuStreamEndCapture(stream, &g), CUDA_SUCCESS);
                ASSERT_OK(st);
                ASSERT_EQ(drv->cuGraphInstantiate(&exec, g, 0), CUDA_SUCCESS);
                ASSERT_EQ(drv->cuGraphDestroy(g), CUDA_SUCCESS);
            }
            ASSERT_EQ(drv->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
            ASSERT_EQ(drv->cuStreamSynchronize(stream), CUDA_SUCCESS);
        } else {
            st = lajit_attn_decode(ctx, &a);
            if (st != LAJIT_OK)
                lj_test_fail(__FILE__, __LINE__, "lajit_attn_decode: %s: %s",
                             lajit_status_string(st), lajit_errmsg(ctx));
            lj_gpu_sync();
        }
        /* Reference for this call. */
        check_rows = decode_reference(c, q, k, v, s, a.scale, slots, S, ref_o, ref_steps);
        lj_gpu_download_as(o, dout, nv, dt);
        size_t r = 0;
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++)
                    for (int e = 0; e < E; e++) {
                        float x = o[(((size_t)b * T + t) * H + h) * E + e];
                        /* A skipped row's output keeps the NaN poison. */
                        if (slots[b] < 0 && !isnan(x))
                            lj_test_fail(__FILE__, __LINE__, "row %d (slot -1) output was written",
                                         b);
                    }
            if (slots[b] < 0)
                continue;
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++) {
                    for (int e = 0; e < E; e++)
                        got_o[r * E + e] = o[(((size_t)b * T + t) * H + h) * E + e];
                    r++;
                }
        }
        double rel;
        if (check_rows)
            case_check("o", got_o, ref_o, check_rows, (size_t)E, case_tolerance(dt), &rel);
        else
            rel = 0;
        worst_o = fmax(worst_o, rel);
        if (c->step_states) {
            lj_gpu_download(steps, dsteps, nsteps * 4);
            double *got = malloc(nsteps * sizeof(double)), *want = malloc(nsteps * sizeof(double));
            size_t n = 0;
            for (int b = 0; b < B; b++) {
                for (int t = 0; t < T; t++)
                    for (int h = 0; h < H; h++) {
                        size_t base = (((size_t)b * T + t) * H + h) * DE;
                        for (int d = 0; d < D; d++)
                            for (int e = 0; e < E; e++) {
                                float x =
                                    steps[base + (c->vk ? (size_t)e * D + d : (size_t)d * E + e)];
                                if (slots[b] < 0) {
                                    if (!isnan(x))
                                        lj_test_fail(__FILE__, __LINE__,
                                                     "row %d (slot -1) step state was written", b);
                                    continue;
                                }
                                got[n] = x;
                                want[n] = ref_steps[base + (size_t)d * E + e];
                                n++;
                            }
                    }
            }
            if (n)
                case_check("step states", got, want, n / (size_t)E, (size_t)E, 1e-5, NULL);
            free(got);
            free(want);
        }
    }
    /* The pool after all calls: used slots match the float64 states (no drift beyond fp32
     * rounding); unused slots are byte-identical. */
    lj_gpu_download(after, dpool, nst * 4);
    double *got = malloc(nst * sizeof(double)), *want = malloc(nst * sizeof(double));
    size_t n = 0;
    for (int p = 0; p < P; p++) {
        int used = 0;
        for (int b = 0; b < B; b++)
            used |= slots[b] == p;
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++)
                for (int e = 0; e < E; e++) {
                    size_t m =
                        ((size_t)p * H + h) * DE + (c->vk ? (size_t)e * D + d : (size_t)d * E + e);
                    if (!used) {
                        if (memcmp(&after[m], &pool_mem[m], 4) != 0)
                            lj_test_fail(__FILE__, __LINE__, "pool slot %d (no row) changed", p);
                        continue;
                    }
                    got[n] = after[m];
                    want[n] = S[((size_t)p * H + h) * DE + (size_t)d * E + e];
                    n++;
                }
    }
    double rel_state = 0;
    case_check("final pool states", got, want, n / (size_t)E, (size_t)E, 1e-5 * sqrt((double)calls),
               &rel_state);
    printf("decode %s B=%d H=%d D=%d E=%d T=%d%s%s%s%s calls=%d%s: worst o rel L2 %.2e, state rel "
           "L2 %.2e\n",
           lj_dtype_name(dt), B, H, D, E, T, c->decay ? " decay" : "", c->vk ? " vk" : "",
           c->slots ? " slots" : "", c->step_states ? " step_states" : "", calls,
           c->graph ? " graph" : "", worst_o, rel_state);
    if (exec)
        drv->cuGraphExecDestroy(exec);
    if (stream)
        drv->cuStreamDestroy(stream);
    lajit_ctx_destroy(ctx);
    free(got), free(want), free(pool), free(pool_mem), free(after), free(S), free(s), free(q),
        free(k), free(v), free(o);
    free(ref_o), free(got_o), free(steps), free(ref_steps);
    lj_gpu_free(dpool), lj_gpu_free(ds), lj_gpu_free(dslots), lj_gpu_free(dq), lj_gpu_free(dk);
    lj_gpu_free(dv), lj_gpu_free(dout), lj_gpu_free(dsteps);
}
