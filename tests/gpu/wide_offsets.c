/* wide_offsets.c — tensors whose element offsets pass 2^31 (issue 16: kernels index with 64-bit
 * bases) on the GPU against the float64 reference: fresh random inputs, NaN-poisoned outputs.
 *
 * Host cost stays small: each tensor lives in a "wide" buffer whose outer rows (batches, or the
 * tokens of a packed varlen tensor) lie so far apart that a later row starts past element 2^31,
 * while each row holds only a few hundred tokens of real data. Only those rows are written, read
 * and checked; the gap between them is allocated and never touched. Every op and family is run
 * with the data of at least one sequence (or decode row, or pool slot) past 2^31 elements:
 *   - lajit_attn_fwd, default family (la_fwd_sm90 on sm_90a) and la_fwd and la_recurrent forced:
 *     q, k, v, o with a batch stride past 2^31, and S_0, S_N with one too; then packed varlen
 *     with a token stride that puts the third sequence's first token past 2^31.
 *   - lajit_attn_bwd, default family and la_bwd forced (its ds kernel): q, k, v, dO, dq, dk, dv,
 *     S_0, dS_N, dS_0 with batch strides past 2^31, ds checked; and the packed varlen layout.
 *   - lajit_attn_decode, f32 and bf16 pools of enough slots that the last one starts past 2^31,
 *     a row pointing at it, q, k, v, o with a batch stride past 2^31, T = 2 steps; the slot just
 *     before the last keeps its bytes.
 * A case needs 5 to 13 GiB of device memory and skips (exit 77) on a device with less free. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_cases.h"
#include "gpu.h"
#include "la_ref.h"
#include "test.h"

/* The first element offset the old 32-bit check refused. */
#define WIDE (1LL << 31)

/* ---- Wide buffers ---------------------------------------------------------------------------- */

/* One device allocation of `rows` outer rows `outer` elements apart; parts (one per tensor) take
 * `len` elements of every row at offset `off`. The outer stride is chosen so that row `wide_row`
 * starts past element 2^31 (plus a little, so no power of two hides a truncation). */
typedef struct wide {
    lj_dtype dt;
    int rows, wide_row;
    long long outer, used;
    CUdeviceptr base;
} wide;

typedef struct part {
    wide *w;
    long long off, len;
    float *host; /* the row's logical values, [rows][len] (inputs: uploaded; outputs: read back) */
} part;

static void wide_init(wide *w, lj_dtype dt, int rows, int wide_row)
{
    memset(w, 0, sizeof *w);
    w->dt = dt;
    w->rows = rows;
    w->wide_row = wide_row;
}

static void part_add(part *p, wide *w, long long len)
{
    p->w = w;
    p->off = w->used;
    p->len = len;
    p->host = calloc((size_t)(w->rows * len), sizeof(float));
    w->used += (len + 15) / 16 * 16; /* 16-element steps keep every part 16-byte aligned */
}

/* Fixes the outer stride (call after the last part_add); returns the bytes to allocate. */
static size_t wide_plan(wide *w)
{
    long long outer = (WIDE + 4096 + w->wide_row - 1) / w->wide_row;
    outer = (outer + 15) / 16 * 16;
    w->outer = outer > w->used ? outer : w->used;
    ASSERT_TRUE(w->wide_row * w->outer > WIDE);
    return (size_t)((w->rows - 1) * w->outer + w->used) * lj_test_dtype_size(w->dt);
}

static CUdeviceptr row_at(const part *p, int r)
{
    return p->w->base +
           (CUdeviceptr)((r * p->w->outer + p->off) * (long long)lj_test_dtype_size(p->w->dt));
}

static void part_fill_upload(part *p, float amp)
{
    case_random_fill(p->host, (size_t)(p->w->rows * p->len), amp, p->w->dt);
    for (int r = 0; r < p->w->rows; r++)
        lj_gpu_upload_as(row_at(p, r), p->host + r * p->len, (size_t)p->len, p->w->dt);
}

static void part_poison(const part *p)
{
    for (int r = 0; r < p->w->rows; r++)
        lj_gpu_poison(row_at(p, r), (size_t)p->len * lj_test_dtype_size(p->w->dt));
}

static void part_download(part *p)
{
    for (int r = 0; r < p->w->rows; r++)
        lj_gpu_download_as(p->host + r * p->len, row_at(p, r), (size_t)p->len, p->w->dt);
}

/* The tensor of a part: rank 3 or 4 with the given shape; the outer stride is the buffer's,
 * the inner ones compact. */
static DLTensor *part_tensor(lj_test_tensor *t, const part *p, int ndim, const int64_t *shape)
{
    int64_t st[4];
    st[ndim - 1] = 1;
    for (int i = ndim - 2; i >= 1; i--)
        st[i] = st[i + 1] * shape[i + 1];
    st[0] = p->w->outer;
    ASSERT_EQ(st[1] * shape[1], p->len);
    return lj_gpu_tensor(t, p->w->base, (uint64_t)p->off * lj_test_dtype_size(p->w->dt), ndim,
                         shape, st, lj_test_dl_dtype(p->w->dt));
}

/* Skips the case when the device has less than `bytes` (plus a margin) free. */
static void need_memory(size_t bytes)
{
    size_t free_b = 0, total = 0;
    ASSERT_EQ(lj_gpu_driver()->cuMemGetInfo(&free_b, &total), CUDA_SUCCESS);
    if (free_b < bytes + ((size_t)1 << 30)) {
        char why[160];
        snprintf(why, sizeof why, "needs %.1f GiB of free device memory, %.1f GiB free",
                 (double)(bytes + ((size_t)1 << 30)) / 1073741824.0, (double)free_b / 1073741824.0);
        lj_test_skip(why);
    }
}

static void wide_alloc(wide *w, size_t bytes)
{
    w->base = lj_gpu_alloc(bytes);
}

/* ---- Sequences ------------------------------------------------------------------------------- */

/* The sequences of a case: batched B = 2 of N = 130 tokens (batch 1 past 2^31), or packed varlen
 * of 100, 156 and 70 tokens whose third starts at token 256 (past 2^31 by the token stride). */
typedef struct seqs {
    int varlen, nseq, N, rows, wide_row;
    int cu[4], lens[3];
} seqs;

static seqs make_seqs(int varlen)
{
    seqs s;
    memset(&s, 0, sizeof s);
    s.varlen = varlen;
    if (varlen) {
        const int lens[3] = {100, 156, 70};
        s.nseq = 3;
        for (int i = 0; i < 3; i++) {
            s.lens[i] = lens[i];
            s.cu[i + 1] = s.cu[i] + lens[i];
        }
        s.N = s.cu[3];
        s.rows = s.N;
        s.wide_row = s.cu[2];
    } else {
        s.nseq = 2;
        s.N = 130;
        s.lens[0] = s.lens[1] = s.N;
        s.rows = 2;
        s.wide_row = 1;
    }
    return s;
}

/* Elements of one outer row of a sequence tensor with H heads of width X. */
static long long seq_len(const seqs *s, int H, int X)
{
    return s->varlen ? (long long)H * X : (long long)H * s->N * X;
}

static DLTensor *seq_tensor(lj_test_tensor *t, const part *p, const seqs *s, int H, int X)
{
    if (s->varlen) {
        int64_t shape[3] = {s->N, H, X};
        return part_tensor(t, p, 3, shape);
    }
    int64_t shape[4] = {s->nseq, H, s->N, X};
    return part_tensor(t, p, 4, shape);
}

/* Token t of sequence i, head h, of a part's values (host order), as doubles. */
static void gather(const float *vals, const seqs *s, int i, int h, int H, int X, double *out)
{
    for (int t = 0; t < s->lens[i]; t++)
        for (int x = 0; x < X; x++) {
            size_t at = s->varlen ? ((size_t)(s->cu[i] + t) * H + h) * X + x
                                  : (((size_t)i * H + h) * s->N + t) * X + x;
            out[(size_t)t * X + x] = vals[at];
        }
}

static float decay_of(int h)
{
    static const float s[4] = {0.0f, 0.05f, 0.5f, 1.0f};
    return s[h % 4];
}

static CUdeviceptr upload_decay(int H, float *s)
{
    for (int h = 0; h < H; h++)
        s[h] = decay_of(h);
    CUdeviceptr d = lj_gpu_alloc((size_t)H * 4);
    lj_gpu_upload(d, s, (size_t)H * 4);
    return d;
}

/* Appends got/ref rows of one (sequence, head) piece to the arrays case_check reads. */
static void append(double *got_all, double *ref_all, size_t *rows, const double *got,
                   const double *ref, int n, int X)
{
    memcpy(got_all + *rows * X, got, sizeof(double) * (size_t)n * X);
    memcpy(ref_all + *rows * X, ref, sizeof(double) * (size_t)n * X);
    *rows += (size_t)n;
}

/* ---- States ---------------------------------------------------------------------------------- */

/* The states of a case, fp32 [slot, H, D, E] (KV): batched, a wide buffer with slot b = row b
 * (slot 1 past 2^31); varlen, a small pool of 4 slots with sequence i in slot `slot_of[i]` and
 * slot 1 used by none. */
static const int varlen_slots[3] = {3, 0, 2};

typedef struct states {
    int P;  /* slots */
    wide w; /* batched */
    long long DE, HDE;
} states;

/* Slot of sequence i. */
static int slot_of(const seqs *s, int i)
{
    return s->varlen ? varlen_slots[i] : i;
}

/* Adds one state tensor: a part of the wide buffer, or a pool of its own. */
typedef struct state_buf {
    part p;           /* batched */
    CUdeviceptr pool; /* varlen */
    float *host;      /* [P][H*D*E] */
} state_buf;

static void states_init(states *st, const seqs *s, int H, int D, int E)
{
    memset(st, 0, sizeof *st);
    st->DE = (long long)D * E;
    st->HDE = H * st->DE;
    st->P = s->varlen ? 4 : s->nseq;
    if (!s->varlen)
        wide_init(&st->w, LJ_F32, s->nseq, 1);
}

static void state_add(state_buf *x, states *st, const seqs *s)
{
    memset(x, 0, sizeof *x);
    if (!s->varlen) {
        part_add(&x->p, &st->w, st->HDE);
        x->host = x->p.host;
    } else {
        x->host = calloc((size_t)(st->P * st->HDE), sizeof(float));
    }
}

static size_t states_plan(states *st, const seqs *s, int n)
{
    return s->varlen ? (size_t)n * (size_t)(st->P * st->HDE) * 4 : wide_plan(&st->w);
}

static void states_alloc(states *st, const seqs *s, size_t bytes)
{
    if (!s->varlen)
        wide_alloc(&st->w, bytes);
}

static void state_place(state_buf *x, const states *st, const seqs *s)
{
    if (s->varlen)
        x->pool = lj_gpu_alloc((size_t)(st->P * st->HDE) * 4);
}

static void state_fill_upload(state_buf *x, const states *st, const seqs *s)
{
    if (!s->varlen) {
        part_fill_upload(&x->p, 1.0f);
        return;
    }
    case_random_fill(x->host, (size_t)(st->P * st->HDE), 1.0f, LJ_F32);
    lj_gpu_upload(x->pool, x->host, (size_t)(st->P * st->HDE) * 4);
}

static void state_poison(const state_buf *x, const states *st, const seqs *s)
{
    if (!s->varlen)
        part_poison(&x->p);
    else
        lj_gpu_poison(x->pool, (size_t)(st->P * st->HDE) * 4);
}

static void state_download(state_buf *x, const states *st, const seqs *s)
{
    if (!s->varlen)
        part_download(&x->p);
    else
        lj_gpu_download(x->host, x->pool, (size_t)(st->P * st->HDE) * 4);
}

static DLTensor *state_tensor(lj_test_tensor *t, const state_buf *x, const states *st,
                              const seqs *s, int H, int D, int E)
{
    int64_t shape[4] = {st->P, H, D, E};
    if (!s->varlen)
        return part_tensor(t, &x->p, 4, shape);
    return lj_gpu_tensor(t, x->pool, 0, 4, shape, NULL, lj_test_dl_dtype(LJ_F32));
}

/* The state of (slot, h) as doubles [D][E]. */
static void state_get(const state_buf *x, const states *st, int slot, int h, double *out)
{
    for (long long i = 0; i < st->DE; i++)
        out[i] = x->host[slot * st->HDE + h * st->DE + i];
}

/* In a varlen pool, the slot no sequence uses must keep its poison. */
static void check_unused_slot(const state_buf *x, const states *st, const seqs *s, const char *what)
{
    if (!s->varlen)
        return;
    for (long long i = 0; i < st->HDE; i++) {
        uint32_t bits;
        memcpy(&bits, &x->host[1 * st->HDE + i], 4);
        if (bits != 0xFFFFFFFFu)
            lj_test_fail(__FILE__, __LINE__, "%s: pool slot 1 (no sequence) was written", what);
    }
}

static void state_free(state_buf *x, const seqs *s)
{
    if (s->varlen) {
        lj_gpu_free(x->pool);
        free(x->host);
    } else {
        free(x->p.host);
    }
}

/* ---- Forward --------------------------------------------------------------------------------- */

static void run_fwd(const char *family, int varlen, unsigned seed)
{
    lj_gpu_init();
    case_seed(seed);
    const lj_dtype dt = LJ_BF16;
    const int H = 2, D = 128, E = 128;
    const seqs s = make_seqs(varlen);
    wide w;
    wide_init(&w, dt, s.rows, s.wide_row);
    part q, k, v, o;
    part_add(&q, &w, seq_len(&s, H, D));
    part_add(&k, &w, seq_len(&s, H, D));
    part_add(&v, &w, seq_len(&s, H, E));
    part_add(&o, &w, seq_len(&s, H, E));
    states st;
    states_init(&st, &s, H, D, E);
    state_buf s0, sn;
    state_add(&s0, &st, &s);
    state_add(&sn, &st, &s);
    const size_t bytes = wide_plan(&w), sbytes = states_plan(&st, &s, 2);
    need_memory(bytes + sbytes);
    wide_alloc(&w, bytes);
    states_alloc(&st, &s, sbytes);
    state_place(&s0, &st, &s);
    state_place(&sn, &st, &s);

    part_fill_upload(&q, 0.5f);
    part_fill_upload(&k, 0.5f);
    part_fill_upload(&v, 0.5f);
    part_poison(&o);
    state_fill_upload(&s0, &st, &s);
    state_poison(&sn, &st, &s);
    float sh[4];
    CUdeviceptr d_s = upload_decay(H, sh);
    CUdeviceptr d_cu = 0, d_slots = 0;
    if (varlen) {
        d_cu = lj_gpu_alloc(4 * 4);
        lj_gpu_upload(d_cu, s.cu, 4 * 4);
        d_slots = lj_gpu_alloc(3 * 4);
        lj_gpu_upload(d_slots, varlen_slots, 3 * 4);
    }

    lj_test_tensor tq, tk, tv, to, ts, ts0, tsn, tcu, tsl;
    lajit_attn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = seq_tensor(&tq, &q, &s, H, D);
    a.k = seq_tensor(&tk, &k, &s, H, D);
    a.v = seq_tensor(&tv, &v, &s, H, E);
    a.o = seq_tensor(&to, &o, &s, H, E);
    int64_t hshape[1] = {H}, cushape[1] = {4}, slshape[1] = {3};
    a.s = lj_gpu_tensor(&ts, d_s, 0, 1, hshape, NULL, lj_test_dl_dtype(LJ_F32));
    a.initial_state = state_tensor(&ts0, &s0, &st, &s, H, D, E);
    a.final_state = state_tensor(&tsn, &sn, &st, &s, H, D, E);
    if (varlen) {
        a.cu_seqlens = lj_gpu_tensor(&tcu, d_cu, 0, 1, cushape, NULL, lj_test_dl_int32());
        a.state_slots = lj_gpu_tensor(&tsl, d_slots, 0, 1, slshape, NULL, lj_test_dl_int32());
    }
    a.scale = 1.0f;
    a.family = family;

    lajit_ctx *ctx = case_open_ctx();
    lajit_status status = lajit_attn_fwd(ctx, &a);
    if (status != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "lajit_attn_fwd: %s: %s", lajit_status_string(status),
                     lajit_errmsg(ctx));
    lj_gpu_sync();
    part_download(&o);
    state_download(&sn, &st, &s);

    const size_t nmax = (size_t)s.N;
    double *bq = malloc(8 * nmax * D), *bk = malloc(8 * nmax * D), *bv = malloc(8 * nmax * E);
    double *bo = malloc(8 * nmax * E), *go = malloc(8 * nmax * E);
    double *bs0 = malloc(8 * (size_t)D * E), *bsn = malloc(8 * (size_t)D * E),
           *gsn = malloc(8 * (size_t)D * E);
    double *ro_all = malloc(8 * nmax * s.nseq * H * E), *go_all = malloc(8 * nmax * s.nseq * H * E);
    double *rs_all = malloc(8 * (size_t)s.nseq * H * D * E),
           *gs_all = malloc(8 * (size_t)s.nseq * H * D * E);
    size_t orows = 0, srows = 0;
    for (int i = 0; i < s.nseq; i++) {
        const int slot = slot_of(&s, i);
        for (int h = 0; h < H; h++) {
            gather(q.host, &s, i, h, H, D, bq);
            gather(k.host, &s, i, h, H, D, bk);
            gather(v.host, &s, i, h, H, E, bv);
            gather(o.host, &s, i, h, H, E, go);
            state_get(&s0, &st, slot, h, bs0);
            la_ref_forward(s.lens[i], D, E, bq, bk, bv, exp(-(double)sh[h]), a.scale, bs0, bo, bsn);
            append(go_all, ro_all, &orows, go, bo, s.lens[i], E);
            state_get(&sn, &st, slot, h, gsn);
            append(gs_all, rs_all, &srows, gsn, bsn, D, E);
        }
    }
    const double tol = case_tolerance(dt);
    double rel_o = 0, rel_s = 0;
    case_check("o", go_all, ro_all, orows, (size_t)E, tol, &rel_o);
    case_check("final state", gs_all, rs_all, srows, (size_t)E, tol, &rel_s);
    check_unused_slot(&sn, &st, &s, "final_state");
    printf("fwd %s %s: rows past element 2^31 from %lld (outer stride %lld): o rel L2 %.2e, S_N "
           "rel L2 %.2e\n",
           family ? family : "default", varlen ? "varlen" : "batched",
           (long long)s.wide_row * w.outer, w.outer, rel_o, rel_s);

    lajit_ctx_destroy(ctx);
    lj_gpu_free(w.base);
    lj_gpu_free(st.w.base);
    state_free(&s0, &s);
    state_free(&sn, &s);
    lj_gpu_free(d_s), lj_gpu_free(d_cu), lj_gpu_free(d_slots);
    free(q.host), free(k.host), free(v.host), free(o.host);
    free(bq), free(bk), free(bv), free(bo), free(go), free(bs0), free(bsn), free(gsn);
    free(ro_all), free(go_all), free(rs_all), free(gs_all);
}

LJ_TEST(fwd_default_batch_stride)
{
    run_fwd(NULL, 0, 1601);
}

LJ_TEST(fwd_la_fwd_batch_stride)
{
    run_fwd("la_fwd", 0, 1602);
}

LJ_TEST(fwd_la_recurrent_batch_stride)
{
    run_fwd("la_recurrent", 0, 1603);
}

LJ_TEST(fwd_default_varlen_tokens_past_2_31)
{
    run_fwd(NULL, 1, 1604);
}

LJ_TEST(fwd_la_fwd_varlen_tokens_past_2_31)
{
    run_fwd("la_fwd", 1, 1605);
}

/* ---- Backward -------------------------------------------------------------------------------- */

static void run_bwd(const char *family, int varlen, unsigned seed)
{
    lj_gpu_init();
    case_seed(seed);
    const lj_dtype dt = LJ_BF16;
    const int H = 2, D = 128, E = 128;
    const seqs s = make_seqs(varlen);
    wide w;
    wide_init(&w, dt, s.rows, s.wide_row);
    part q, k, v, g, dq, dk, dv;
    part_add(&q, &w, seq_len(&s, H, D));
    part_add(&k, &w, seq_len(&s, H, D));
    part_add(&v, &w, seq_len(&s, H, E));
    part_add(&g, &w, seq_len(&s, H, E));
    part_add(&dq, &w, seq_len(&s, H, D));
    part_add(&dk, &w, seq_len(&s, H, D));
    part_add(&dv, &w, seq_len(&s, H, E));
    states st;
    states_init(&st, &s, H, D, E);
    state_buf s0, dsn, ds0;
    state_add(&s0, &st, &s);
    state_add(&dsn, &st, &s);
    state_add(&ds0, &st, &s);
    const size_t bytes = wide_plan(&w), sbytes = states_plan(&st, &s, 3);
    need_memory(bytes + sbytes);
    wide_alloc(&w, bytes);
    states_alloc(&st, &s, sbytes);
    state_place(&s0, &st, &s);
    state_place(&dsn, &st, &s);
    state_place(&ds0, &st, &s);

    part_fill_upload(&q, 0.5f);
    part_fill_upload(&k, 0.5f);
    part_fill_upload(&v, 0.5f);
    part_fill_upload(&g, 0.5f);
    part_poison(&dq);
    part_poison(&dk);
    part_poison(&dv);
    state_fill_upload(&s0, &st, &s);
    state_fill_upload(&dsn, &st, &s);
    state_poison(&ds0, &st, &s);
    float sh[4];
    CUdeviceptr d_s = upload_decay(H, sh), d_ds = lj_gpu_alloc((size_t)H * 4);
    lj_gpu_poison(d_ds, (size_t)H * 4);
    CUdeviceptr d_cu = 0, d_slots = 0;
    if (varlen) {
        d_cu = lj_gpu_alloc(4 * 4);
        lj_gpu_upload(d_cu, s.cu, 4 * 4);
        d_slots = lj_gpu_alloc(3 * 4);
        lj_gpu_upload(d_slots, varlen_slots, 3 * 4);
    }

    lj_test_tensor tq, tk, tv, tg, tdq, tdk, tdv, ts, tds, ts0, tdsn, tds0, tcu, tsl;
    lajit_attn_bwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = seq_tensor(&tq, &q, &s, H, D);
    a.k = seq_tensor(&tk, &k, &s, H, D);
    a.v = seq_tensor(&tv, &v, &s, H, E);
    a.dout = seq_tensor(&tg, &g, &s, H, E);
    a.dq = seq_tensor(&tdq, &dq, &s, H, D);
    a.dk = seq_tensor(&tdk, &dk, &s, H, D);
    a.dv = seq_tensor(&tdv, &dv, &s, H, E);
    int64_t hshape[1] = {H}, cushape[1] = {4}, slshape[1] = {3};
    a.s = lj_gpu_tensor(&ts, d_s, 0, 1, hshape, NULL, lj_test_dl_dtype(LJ_F32));
    a.ds = lj_gpu_tensor(&tds, d_ds, 0, 1, hshape, NULL, lj_test_dl_dtype(LJ_F32));
    a.initial_state = state_tensor(&ts0, &s0, &st, &s, H, D, E);
    a.d_final_state = state_tensor(&tdsn, &dsn, &st, &s, H, D, E);
    a.d_initial_state = state_tensor(&tds0, &ds0, &st, &s, H, D, E);
    if (varlen) {
        a.cu_seqlens = lj_gpu_tensor(&tcu, d_cu, 0, 1, cushape, NULL, lj_test_dl_int32());
        a.state_slots = lj_gpu_tensor(&tsl, d_slots, 0, 1, slshape, NULL, lj_test_dl_int32());
    }
    a.scale = 1.0f;
    a.family = family;

    lajit_ctx *ctx = case_open_ctx();
    lajit_status status = lajit_attn_bwd(ctx, &a);
    if (status != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "lajit_attn_bwd: %s: %s", lajit_status_string(status),
                     lajit_errmsg(ctx));
    lj_gpu_sync();
    part_download(&dq);
    part_download(&dk);
    part_download(&dv);
    state_download(&ds0, &st, &s);
    float got_ds[4];
    lj_gpu_download(got_ds, d_ds, (size_t)H * 4);

    const size_t nmax = (size_t)s.N, all = nmax * s.nseq * H;
    double *bq = malloc(8 * nmax * D), *bk = malloc(8 * nmax * D), *bv = malloc(8 * nmax * E);
    double *bg = malloc(8 * nmax * E), *bdq = malloc(8 * nmax * D), *bdk = malloc(8 * nmax * D);
    double *bdv = malloc(8 * nmax * E), *got = malloc(8 * nmax * (D > E ? D : E));
    double *bs0 = malloc(8 * (size_t)D * E), *bdsn = malloc(8 * (size_t)D * E),
           *bds0 = malloc(8 * (size_t)D * E), *gds0 = malloc(8 * (size_t)D * E);
    double *rq = malloc(8 * all * D), *gq = malloc(8 * all * D), *rk = malloc(8 * all * D),
           *gk = malloc(8 * all * D), *rv = malloc(8 * all * E), *gv = malloc(8 * all * E);
    double *rs_all = malloc(8 * (size_t)s.nseq * H * D * E),
           *gs_all = malloc(8 * (size_t)s.nseq * H * D * E);
    double ref_ds[4] = {0}, bound[4] = {0};
    size_t rows_q = 0, rows_k = 0, rows_v = 0, srows = 0;
    for (int i = 0; i < s.nseq; i++) {
        const int slot = slot_of(&s, i);
        for (int h = 0; h < H; h++) {
            gather(q.host, &s, i, h, H, D, bq);
            gather(k.host, &s, i, h, H, D, bk);
            gather(v.host, &s, i, h, H, E, bv);
            gather(g.host, &s, i, h, H, E, bg);
            state_get(&s0, &st, slot, h, bs0);
            state_get(&dsn, &st, slot, h, bdsn);
            double dsv = 0, dsb = 0;
            la_ref_backward(s.lens[i], D, E, bq, bk, bv, bg, exp(-(double)sh[h]), a.scale, bs0,
                            bdsn, bdq, bdk, bdv, bds0, &dsv, &dsb);
            ref_ds[h] += dsv;
            bound[h] += dsb;
            gather(dq.host, &s, i, h, H, D, got);
            append(gq, rq, &rows_q, got, bdq, s.lens[i], D);
            gather(dk.host, &s, i, h, H, D, got);
            append(gk, rk, &rows_k, got, bdk, s.lens[i], D);
            gather(dv.host, &s, i, h, H, E, got);
            append(gv, rv, &rows_v, got, bdv, s.lens[i], E);
            state_get(&ds0, &st, slot, h, gds0);
            append(gs_all, rs_all, &srows, gds0, bds0, D, E);
        }
    }
    const double tol = case_tolerance(dt);
    double e_q = 0, e_k = 0, e_v = 0, e_s0 = 0;
    case_check("dq", gq, rq, rows_q, (size_t)D, tol, &e_q);
    case_check("dk", gk, rk, rows_k, (size_t)D, tol, &e_k);
    case_check("dv", gv, rv, rows_v, (size_t)E, tol, &e_v);
    case_check("dS0", gs_all, rs_all, srows, (size_t)E, tol, &e_s0);
    for (int h = 0; h < H; h++) {
        double err = fabs((double)got_ds[h] - ref_ds[h]);
        if (!isfinite(got_ds[h]) || !(err <= tol * bound[h]))
            lj_test_fail(__FILE__, __LINE__, "ds[%d] = %.9g, reference %.9g (bound %.3g)", h,
                         (double)got_ds[h], ref_ds[h], tol * bound[h]);
    }
    check_unused_slot(&ds0, &st, &s, "d_initial_state");
    printf("bwd %s %s: rows past element 2^31 from %lld: rel L2 dq %.2e dk %.2e dv %.2e dS0 %.2e; "
           "ds within its bound\n",
           family ? family : "default", varlen ? "varlen" : "batched",
           (long long)s.wide_row * w.outer, e_q, e_k, e_v, e_s0);

    lajit_ctx_destroy(ctx);
    lj_gpu_free(w.base);
    lj_gpu_free(st.w.base);
    state_free(&s0, &s);
    state_free(&dsn, &s);
    state_free(&ds0, &s);
    lj_gpu_free(d_s), lj_gpu_free(d_ds), lj_gpu_free(d_cu), lj_gpu_free(d_slots);
    void *hf[] = {q.host, k.host, v.host, g.host, dq.host, dk.host, dv.host, bq,     bk,
                  bv,     bg,     bdq,    bdk,    bdv,     got,     bs0,     bdsn,   bds0,
                  gds0,   rq,     gq,     rk,     gk,      rv,      gv,      rs_all, gs_all};
    for (size_t i = 0; i < sizeof hf / sizeof hf[0]; i++)
        free(hf[i]);
}

LJ_TEST(bwd_default_batch_stride)
{
    run_bwd(NULL, 0, 1611);
}

LJ_TEST(bwd_la_bwd_batch_stride)
{
    run_bwd("la_bwd", 0, 1612);
}

LJ_TEST(bwd_default_varlen_tokens_past_2_31)
{
    run_bwd(NULL, 1, 1613);
}

/* ---- Decode ---------------------------------------------------------------------------------- */

/* A pool [P, H, D, E] of pool_dt with P just large enough that slot P - 1 starts past element
 * 2^31; row 0 updates slot P - 1, row 1 slot 1; slot P - 2 (also past 2^31) is no row's and must
 * keep its bytes. q, k, v, o [B = 2, T, H, X] with a batch stride past 2^31. */
static void run_decode(lj_dtype pool_dt, unsigned seed)
{
    lj_gpu_init();
    case_seed(seed);
    const lj_dtype dt = LJ_BF16;
    const int B = 2, T = 2, H = 2, D = 128, E = 128;
    const long long DE = (long long)D * E, HDE = H * DE;
    const long long P = WIDE / HDE + 2;
    const int slots[2] = {(int)(P - 1), 1};
    const size_t pesz = lj_test_dtype_size(pool_dt);
    wide w;
    wide_init(&w, dt, B, 1);
    part q, k, v, o;
    part_add(&q, &w, (long long)T * H * D);
    part_add(&k, &w, (long long)T * H * D);
    part_add(&v, &w, (long long)T * H * E);
    part_add(&o, &w, (long long)T * H * E);
    const size_t bytes = wide_plan(&w), pbytes = (size_t)(P * HDE) * pesz;
    need_memory(bytes + pbytes);
    wide_alloc(&w, bytes);
    CUdeviceptr pool = lj_gpu_alloc(pbytes);
    ASSERT_TRUE((P - 1) * HDE > WIDE && (P - 2) * HDE >= WIDE);

    part_fill_upload(&q, 0.5f);
    part_fill_upload(&k, 0.5f);
    part_fill_upload(&v, 0.5f);
    part_poison(&o);
    /* The slots the rows use and the spare one, each with fresh values (rounded to the pool's
     * type); nothing else of the pool is touched. */
    const int touched[3] = {(int)(P - 1), 1, (int)(P - 2)};
    float *S = malloc(sizeof(float) * 3 * (size_t)HDE),
          *after = malloc(sizeof(float) * (size_t)HDE);
    unsigned char *spare = malloc((size_t)HDE * pesz), *spare_after = malloc((size_t)HDE * pesz);
    case_random_fill(S, 3 * (size_t)HDE, 1.0f, pool_dt);
    for (int i = 0; i < 3; i++)
        lj_gpu_upload_as(pool + (CUdeviceptr)(touched[i] * HDE) * pesz, S + i * HDE, (size_t)HDE,
                         pool_dt);
    lj_gpu_download(spare, pool + (CUdeviceptr)(touched[2] * HDE) * pesz, (size_t)HDE * pesz);
    float sh[4];
    CUdeviceptr d_s = upload_decay(H, sh), d_slots = lj_gpu_alloc(sizeof slots);
    lj_gpu_upload(d_slots, slots, sizeof slots);

    lj_test_tensor tq, tk, tv, to, ts, tpool, tsl;
    int64_t qshape[4] = {B, T, H, D}, vshape[4] = {B, T, H, E}, pshape[4] = {P, H, D, E};
    int64_t hshape[1] = {H}, slshape[1] = {B};
    lajit_attn_decode_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = part_tensor(&tq, &q, 4, qshape);
    a.k = part_tensor(&tk, &k, 4, qshape);
    a.v = part_tensor(&tv, &v, 4, vshape);
    a.o = part_tensor(&to, &o, 4, vshape);
    a.s = lj_gpu_tensor(&ts, d_s, 0, 1, hshape, NULL, lj_test_dl_dtype(LJ_F32));
    a.state = lj_gpu_tensor(&tpool, pool, 0, 4, pshape, NULL, lj_test_dl_dtype(pool_dt));
    a.state_slots = lj_gpu_tensor(&tsl, d_slots, 0, 1, slshape, NULL, lj_test_dl_int32());
    a.scale = 0.5f;

    lajit_ctx *ctx = case_open_ctx();
    lajit_status status = lajit_attn_decode(ctx, &a);
    if (status != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "lajit_attn_decode: %s: %s", lajit_status_string(status),
                     lajit_errmsg(ctx));
    lj_gpu_sync();
    part_download(&o);

    double *Sd = malloc(sizeof(double) * (size_t)DE), *got_s = malloc(sizeof(double) * 2 * HDE),
           *ref_s = malloc(sizeof(double) * 2 * HDE);
    double *got_o = malloc(sizeof(double) * B * T * H * E),
           *ref_o = malloc(sizeof(double) * B * T * H * E);
    double qd[128], kd[128], vd[128], od[128];
    size_t orows = 0;
    for (int b = 0; b < B; b++) {
        lj_gpu_download_as(after, pool + (CUdeviceptr)(slots[b] * HDE) * pesz, (size_t)HDE,
                           pool_dt);
        for (int h = 0; h < H; h++) {
            for (long long i = 0; i < DE; i++)
                Sd[i] = S[b * HDE + h * DE + i];
            for (int t = 0; t < T; t++) {
                const size_t at = (size_t)b * T * H + (size_t)t * H + h;
                for (int d = 0; d < D; d++) {
                    qd[d] = q.host[at * D + d];
                    kd[d] = k.host[at * D + d];
                }
                for (int e = 0; e < E; e++)
                    vd[e] = v.host[at * E + e];
                la_ref_decode_step(D, E, Sd, qd, kd, vd, exp(-(double)sh[h]), a.scale, od);
                for (int e = 0; e < E; e++) {
                    ref_o[orows * E + e] = od[e];
                    got_o[orows * E + e] = o.host[at * E + e];
                }
                orows++;
            }
            for (long long i = 0; i < DE; i++) {
                ref_s[b * HDE + h * DE + i] = Sd[i];
                got_s[b * HDE + h * DE + i] = after[h * DE + i];
            }
        }
    }
    double rel_o = 0, rel_s = 0;
    case_check("o", got_o, ref_o, orows, (size_t)E, case_tolerance(dt), &rel_o);
    /* fp32 pools carry fp32 state (DESIGN.md's decode bound); a 16-bit pool is rounded once. */
    case_check("pool states", got_s, ref_s, (size_t)(2 * HDE / E), (size_t)E,
               pool_dt == LJ_F32 ? 1e-5 : case_tolerance(pool_dt), &rel_s);
    lj_gpu_download(spare_after, pool + (CUdeviceptr)(touched[2] * HDE) * pesz, (size_t)HDE * pesz);
    if (memcmp(spare, spare_after, (size_t)HDE * pesz) != 0)
        lj_test_fail(__FILE__, __LINE__, "pool slot %lld (no row) changed", P - 2);
    printf("decode %s pool of %lld slots, row 0 in slot %lld at element %lld: o rel L2 %.2e, "
           "states rel L2 %.2e\n",
           lj_dtype_name(pool_dt), P, P - 1, (P - 1) * HDE, rel_o, rel_s);

    lajit_ctx_destroy(ctx);
    lj_gpu_free(w.base), lj_gpu_free(pool), lj_gpu_free(d_s), lj_gpu_free(d_slots);
    free(q.host), free(k.host), free(v.host), free(o.host), free(S), free(after), free(spare);
    free(spare_after), free(Sd), free(got_s), free(ref_s), free(got_o), free(ref_o);
}

LJ_TEST(decode_f32_pool_last_slot)
{
    run_decode(LJ_F32, 1621);
}

LJ_TEST(decode_bf16_pool_last_slot)
{
    run_decode(LJ_BF16, 1622);
}
