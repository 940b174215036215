/* bwd_case.c — the gpu test case of the backward op (attn_cases.h): fresh random q, k, v, dO,
 * states and decay; NaN-poisoned gradients; every gradient against the float64 reference of
 * DESIGN.md (relative L2 and the per-token check), dS_0 on its own, ds by its normwise bound and,
 * when asked, against a float64 finite difference of the forward; pool slots no sequence
 * writes compared byte for byte; and a second run that must give the same bits. */
#include <math.h>

#include "attn_cases.h"
#include "gpu.h"
#include "la_ref.h"

/* A sequence tensor: logical (b, h, t, x) on the host, memory order on the device. */
typedef struct seq_layout {
    int B, H, N, X;
    long long st[4]; /* memory strides of (b, h, t, x) */
    size_t mem;      /* elements the memory spans */
} seq_layout;

static seq_layout layout(int B, int H, int N, int X, int bnhd)
{
    seq_layout l = {B, H, N, X, {0, 0, 0, 1}, (size_t)B * H * N * X};
    if (bnhd) {
        l.st[0] = (long long)N * H * X, l.st[1] = X, l.st[2] = (long long)H * X;
    } else {
        l.st[0] = (long long)H * N * X, l.st[1] = (long long)N * X, l.st[2] = X;
    }
    return l;
}

static size_t lidx(const seq_layout *l, int b, int h, int t)
{
    return (((size_t)b * l->H + h) * l->N + t) * l->X;
}

static size_t midx(const seq_layout *l, int b, int h, int t)
{
    return (size_t)(b * l->st[0] + h * l->st[1] + t * l->st[2]);
}

static CUdeviceptr upload_seq(const seq_layout *l, const float *x, lj_dtype dt)
{
    float *m = malloc(l->mem * 4);
    for (int b = 0; b < l->B; b++)
        for (int h = 0; h < l->H; h++)
            for (int t = 0; t < l->N; t++)
                memcpy(m + midx(l, b, h, t), x + lidx(l, b, h, t), (size_t)l->X * 4);
    CUdeviceptr d = lj_gpu_alloc(l->mem * lj_test_dtype_size(dt));
    lj_gpu_upload_as(d, m, l->mem, dt);
    free(m);
    return d;
}

static DLTensor *seq_tensor(lj_test_tensor *t, CUdeviceptr d, const seq_layout *l, int varlen,
                            lj_dtype dt)
{
    if (varlen) {
        int64_t shape[3] = {l->N, l->H, l->X};
        return lj_gpu_tensor(t, d, 0, 3, shape, NULL, lj_test_dl_dtype(dt));
    }
    int64_t shape[4] = {l->B, l->H, l->N, l->X}, str[4] = {l->st[0], l->st[1], l->st[2], 1};
    return lj_gpu_tensor(t, d, 0, 4, shape, str, lj_test_dl_dtype(dt));
}

/* State element (slot, h, d, e) in memory, KV or VK. */
static size_t sidx(int H, int D, int E, int vk, int slot, int h, int d, int e)
{
    return ((size_t)slot * H + h) * D * E + (vk ? (size_t)e * D + d : (size_t)d * E + e);
}

/* The loss the backward differentiates, in float64: Σ ⟨o, dO⟩ + ⟨S_N, dS_N⟩ for one sequence. */
static double ref_loss(int n, int D, int E, const double *q, const double *k, const double *v,
                       const double *dO, double lam, double sigma, const double *S0,
                       const double *dSN, double *o, double *SN)
{
    la_ref_forward(n, D, E, q, k, v, lam, sigma, S0, o, SN);
    double L = 0;
    for (size_t i = 0; i < (size_t)n * E; i++)
        L += o[i] * dO[i];
    if (dSN)
        for (size_t i = 0; i < (size_t)D * E; i++)
            L += SN[i] * dSN[i];
    return L;
}

void run_bwd_case(const bwd_case *c)
{
    lj_gpu_init();
    case_seed(c->seed);
    const lj_dtype dt = c->dtype;
    const int H = c->H, D = c->D, E = c->E, varlen = c->nseq > 0;
    const int nseq = varlen ? c->nseq : c->B;
    int cu[17] = {0};
    for (int i = 0; varlen && i < nseq; i++)
        cu[i + 1] = cu[i] + c->lens[i];
    const int B = varlen ? 1 : c->B, N = varlen ? cu[nseq] : c->N;
    const seq_layout lq = layout(B, H, N, D, c->bnhd || varlen),
                     lv = layout(B, H, N, E, c->bnhd || varlen);
    const size_t nq = (size_t)B * H * N * D, nv = (size_t)B * H * N * E;
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), *g = malloc(nv * 4);
    case_random_fill(q, nq, 0.5f, dt);
    case_random_fill(k, nq, 0.5f, dt);
    case_random_fill(v, nv, 0.5f, dt);
    case_random_fill(g, nv, 0.5f, dt);
    CUdeviceptr d_q = upload_seq(&lq, q, dt), d_k = upload_seq(&lq, k, dt);
    CUdeviceptr d_v = upload_seq(&lv, v, dt), d_g = upload_seq(&lv, g, dt);
    const size_t esz = lj_test_dtype_size(dt);
    CUdeviceptr d_dq = lj_gpu_alloc(lq.mem * esz), d_dk = lj_gpu_alloc(lq.mem * esz);
    CUdeviceptr d_dv = lj_gpu_alloc(lv.mem * esz);

    float *s = malloc((size_t)H * 4);
    for (int h = 0; h < H; h++)
        s[h] = c->decay == 2 ? (const float[4]){0.0f, 0.01f, 1.0f, 4.0f}[h % 4]
               : h == 0      ? 0.0f
                             : powf(2.0f, -8.0f * (float)h / (float)H);
    CUdeviceptr d_s = lj_gpu_alloc((size_t)H * 4), d_ds = lj_gpu_alloc((size_t)H * 4);
    lj_gpu_upload(d_s, s, (size_t)H * 4);

    /* States: [P, H, D, E] (or VK) pools; spare slots must stay untouched. */
    const int P = varlen ? nseq + 2 : B;
    int slots[16];
    for (int i = 0; i < nseq; i++)
        slots[i] = varlen ? P - 1 - i : i;
    if (varlen && c->slot_minus_one)
        slots[nseq / 2] = -1;
    const size_t nst = (size_t)P * H * D * E;
    float *s0 = malloc(nst * 4), *dsn = malloc(nst * 4), *s0_mem = malloc(nst * 4),
          *dsn_mem = malloc(nst * 4);
    case_random_fill(s0, nst, 1.0f, LJ_F32);
    case_random_fill(dsn, nst, 1.0f, LJ_F32);
    for (int sl = 0; sl < P; sl++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++)
                for (int e = 0; e < E; e++) {
                    size_t lo = (((size_t)sl * H + h) * D + d) * E + e;
                    s0_mem[sidx(H, D, E, c->vk, sl, h, d, e)] = s0[lo];
                    dsn_mem[sidx(H, D, E, c->vk, sl, h, d, e)] = dsn[lo];
                }
    CUdeviceptr d_s0 = 0, d_dsn = 0, d_ds0 = 0, d_cu = 0, d_slots = 0;
    if (c->initial) {
        d_s0 = lj_gpu_alloc(nst * 4);
        lj_gpu_upload(d_s0, s0_mem, nst * 4);
    }
    if (c->dsn) {
        d_dsn = lj_gpu_alloc(nst * 4);
        lj_gpu_upload(d_dsn, dsn_mem, nst * 4);
    }
    if (c->ds0)
        d_ds0 = lj_gpu_alloc(nst * 4);
    if (varlen) {
        d_cu = lj_gpu_alloc((size_t)(nseq + 1) * 4);
        lj_gpu_upload(d_cu, cu, (size_t)(nseq + 1) * 4);
        d_slots = lj_gpu_alloc((size_t)nseq * 4);
        lj_gpu_upload(d_slots, slots, (size_t)nseq * 4);
    }

    lj_test_tensor tq, tk, tv, tg, tdq, tdk, tdv, ts, tds, ts0, tdsn, tds0, tcu, tsl;
    lajit_attn_bwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = seq_tensor(&tq, d_q, &lq, varlen, dt);
    a.k = seq_tensor(&tk, d_k, &lq, varlen, dt);
    a.v = seq_tensor(&tv, d_v, &lv, varlen, dt);
    a.dout = seq_tensor(&tg, d_g, &lv, varlen, dt);
    a.dq = seq_tensor(&tdq, d_dq, &lq, varlen, dt);
    a.dk = seq_tensor(&tdk, d_dk, &lq, varlen, dt);
    a.dv = seq_tensor(&tdv, d_dv, &lv, varlen, dt);
    int64_t hshape[1] = {H}, stshape[4] = {P, H, c->vk ? E : D, c->vk ? D : E};
    int64_t cushape[1] = {nseq + 1}, slshape[1] = {nseq};
    if (c->decay)
        a.s = lj_gpu_tensor(&ts, d_s, 0, 1, hshape, NULL, lj_test_dl_dtype(LJ_F32));
    if (c->want_ds)
        a.ds = lj_gpu_tensor(&tds, d_ds, 0, 1, hshape, NULL, lj_test_dl_dtype(LJ_F32));
    if (c->initial)
        a.initial_state = lj_gpu_tensor(&ts0, d_s0, 0, 4, stshape, NULL, lj_test_dl_dtype(LJ_F32));
    if (c->dsn)
        a.d_final_state =
            lj_gpu_tensor(&tdsn, d_dsn, 0, 4, stshape, NULL, lj_test_dl_dtype(LJ_F32));
    if (c->ds0)
        a.d_initial_state =
            lj_gpu_tensor(&tds0, d_ds0, 0, 4, stshape, NULL, lj_test_dl_dtype(LJ_F32));
    if (varlen) {
        a.cu_seqlens = lj_gpu_tensor(&tcu, d_cu, 0, 1, cushape, NULL, lj_test_dl_int32());
        if (c->initial || c->dsn || c->ds0)
            a.state_slots = lj_gpu_tensor(&tsl, d_slots, 0, 1, slshape, NULL, lj_test_dl_int32());
    }
    a.scale = c->scale != 0 ? c->scale : 1.0f;
    a.flags = c->vk ? LAJIT_STATE_VK : 0;
    a.family = c->family;

    /* Two runs on poisoned outputs; the second must reproduce the first bit for bit. */
    lajit_ctx *ctx = case_open_ctx();
    const size_t bytes_q = lq.mem * esz, bytes_v = lv.mem * esz;
    unsigned char *run1 = malloc(2 * bytes_q + bytes_v + (size_t)H * 4 + nst * 4);
    float *m_dq = malloc(lq.mem * 4), *m_dk = malloc(lq.mem * 4), *m_dv = malloc(lv.mem * 4);
    float *got_ds = malloc((size_t)H * 4), *m_ds0 = malloc(nst * 4);
    for (int run = 0; run < 2; run++) {
        lj_gpu_poison(d_dq, bytes_q);
        lj_gpu_poison(d_dk, bytes_q);
        lj_gpu_poison(d_dv, bytes_v);
        lj_gpu_poison(d_ds, (size_t)H * 4);
        if (d_ds0)
            lj_gpu_poison(d_ds0, nst * 4);
        lajit_status st = lajit_attn_bwd(ctx, &a);
        if (st != LAJIT_OK)
            lj_test_fail(__FILE__, __LINE__, "lajit_attn_bwd: %s: %s", lajit_status_string(st),
                         lajit_errmsg(ctx));
        lj_gpu_sync();
        unsigned char *now = malloc(2 * bytes_q + bytes_v + (size_t)H * 4 + nst * 4), *w = now;
        lj_gpu_download(w, d_dq, bytes_q), w += bytes_q;
        lj_gpu_download(w, d_dk, bytes_q), w += bytes_q;
        lj_gpu_download(w, d_dv, bytes_v), w += bytes_v;
        lj_gpu_download(w, d_ds, (size_t)H * 4), w += (size_t)H * 4;
        if (d_ds0)
            lj_gpu_download(w, d_ds0, nst * 4);
        else
            memset(w, 0, nst * 4);
        if (run == 0)
            memcpy(run1, now, 2 * bytes_q + bytes_v + (size_t)H * 4 + nst * 4);
        else if (memcmp(run1, now, 2 * bytes_q + bytes_v + (size_t)(c->want_ds ? H * 4 : 0)) != 0 ||
                 (d_ds0 && memcmp(run1 + 2 * bytes_q + bytes_v + (size_t)H * 4,
                                  now + 2 * bytes_q + bytes_v + (size_t)H * 4, nst * 4) != 0))
            lj_test_fail(__FILE__, __LINE__,
                         "a second run gave different bits (not deterministic)");
        free(now);
    }
    if (c->graph) {
        /* The plans exist (and the ds workspace): a captured call must replay to the same bits. */
        const lj_driver *drv = lj_gpu_driver();
        CUstream stream;
        CUgraph graph;
        CUgraphExec exec;
        ASSERT_EQ(drv->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
        a.stream = stream;
        lj_gpu_poison(d_dq, bytes_q);
        lj_gpu_poison(d_dk, bytes_q);
        lj_gpu_poison(d_dv, bytes_v);
        lj_gpu_poison(d_ds, (size_t)H * 4);
        if (d_ds0)
            lj_gpu_poison(d_ds0, nst * 4);
        lj_gpu_sync();
        ASSERT_EQ(drv->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                  CUDA_SUCCESS);
        lajit_status st = lajit_attn_bwd(ctx, &a);
        ASSERT_EQ(drv->cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
        ASSERT_OK(st);
        ASSERT_EQ(drv->cuGraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
        for (int replay = 0; replay < 2; replay++)
            ASSERT_EQ(drv->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
        ASSERT_EQ(drv->cuStreamSynchronize(stream), CUDA_SUCCESS);
        unsigned char *now = malloc(2 * bytes_q + bytes_v + (size_t)H * 4), *w = now;
        lj_gpu_download(w, d_dq, bytes_q), w += bytes_q;
        lj_gpu_download(w, d_dk, bytes_q), w += bytes_q;
        lj_gpu_download(w, d_dv, bytes_v), w += bytes_v;
        lj_gpu_download(w, d_ds, (size_t)H * 4);
        if (memcmp(run1, now, 2 * bytes_q + bytes_v + (size_t)(c->want_ds ? H * 4 : 0)) != 0)
            lj_test_fail(__FILE__, __LINE__, "the graph replay gave other bits than a direct call");
        free(now);
        ASSERT_EQ(drv->cuGraphExecDestroy(exec), CUDA_SUCCESS);
        ASSERT_EQ(drv->cuGraphDestroy(graph), CUDA_SUCCESS);
        ASSERT_EQ(drv->cuStreamDestroy(stream), CUDA_SUCCESS);
    }
    lj_gpu_download_as(m_dq, d_dq, lq.mem, dt);
    lj_gpu_download_as(m_dk, d_dk, lq.mem, dt);
    lj_gpu_download_as(m_dv, d_dv, lv.mem, dt);
    lj_gpu_download(got_ds, d_ds, (size_t)H * 4);
    if (d_ds0)
        lj_gpu_download(m_ds0, d_ds0, nst * 4);

    /* The float64 reference, one (sequence, head) at a time. */
    const size_t rows_max = (size_t)B * H * N;
    double *rq = calloc(rows_max * D, 8), *gq = calloc(rows_max * D, 8);
    double *rk = calloc(rows_max * D, 8), *gk = calloc(rows_max * D, 8);
    double *rv = calloc(rows_max * E, 8), *gv = calloc(rows_max * E, 8);
    double *rs0 = calloc(nst, 8), *gs0 = calloc(nst, 8);
    double *ref_ds = calloc((size_t)H, 8), *bound = calloc((size_t)H, 8),
           *fd = calloc((size_t)H, 8);
    const size_t nmax = (size_t)(N > 0 ? N : 1);
    double *bq = malloc(8 * nmax * D), *bk = malloc(8 * nmax * D), *bv = malloc(8 * nmax * E);
    double *bg = malloc(8 * nmax * E), *bdq = malloc(8 * nmax * D), *bdk = malloc(8 * nmax * D);
    double *bdv = malloc(8 * nmax * E), *bo = malloc(8 * nmax * E);
    double *bs0 = malloc(8 * (size_t)D * E), *bdsn = malloc(8 * (size_t)D * E);
    double *bds0 = malloc(8 * (size_t)D * E), *bsn = malloc(8 * (size_t)D * E);
    size_t row = 0, srow = 0;
    for (int seq = 0; seq < nseq; seq++) {
        const int b = varlen ? 0 : seq, t0 = varlen ? cu[seq] : 0, len = varlen ? c->lens[seq] : N;
        const int slot = slots[seq];
        for (int h = 0; h < H; h++) {
            for (int t = 0; t < len; t++) {
                for (int d = 0; d < D; d++) {
                    bq[(size_t)t * D + d] = q[lidx(&lq, b, h, t0 + t) + d];
                    bk[(size_t)t * D + d] = k[lidx(&lq, b, h, t0 + t) + d];
                }
                for (int e = 0; e < E; e++) {
                    bv[(size_t)t * E + e] = v[lidx(&lv, b, h, t0 + t) + e];
                    bg[(size_t)t * E + e] = g[lidx(&lv, b, h, t0 + t) + e];
                }
            }
            const int has_s0 = c->initial && slot >= 0, has_dsn = c->dsn && slot >= 0;
            for (int i = 0; i < D * E; i++) {
                bs0[i] = has_s0 ? s0[((size_t)slot * H + h) * D * E + i] : 0.0;
                bdsn[i] = has_dsn ? dsn[((size_t)slot * H + h) * D * E + i] : 0.0;
            }
            const double lam = c->decay ? exp(-(double)s[h]) : 1.0;
            double dsv = 0, dsb = 0;
            la_ref_backward(len, D, E, bq, bk, bv, bg, lam, a.scale, has_s0 ? bs0 : NULL,
                            has_dsn ? bdsn : NULL, bdq, bdk, bdv, bds0, &dsv, &dsb);
            ref_ds[h] += dsv;
            bound[h] += dsb;
            if (c->finite_diff && c->decay) {
                /* d/ds of the loss by central differences of the float64 forward. */
                const double eps = 1e-5;
                double sp = (double)s[h] + eps, sm = (double)s[h] - eps;
                double Lp = ref_loss(len, D, E, bq, bk, bv, bg, exp(-sp), a.scale,
                                     has_s0 ? bs0 : NULL, has_dsn ? bdsn : NULL, bo, bsn);
                double Lm = ref_loss(len, D, E, bq, bk, bv, bg, exp(-sm), a.scale,
                                     has_s0 ? bs0 : NULL, has_dsn ? bdsn : NULL, bo, bsn);
                fd[h] += (Lp - Lm) / (2 * eps);
            }
            for (int t = 0; t < len; t++, row++) {
                for (int d = 0; d < D; d++) {
                    rq[row * D + d] = bdq[(size_t)t * D + d];
                    gq[row * D + d] = m_dq[midx(&lq, b, h, t0 + t) + d];
                    rk[row * D + d] = bdk[(size_t)t * D + d];
                    gk[row * D + d] = m_dk[midx(&lq, b, h, t0 + t) + d];
                }
                for (int e = 0; e < E; e++) {
                    rv[row * E + e] = bdv[(size_t)t * E + e];
                    gv[row * E + e] = m_dv[midx(&lv, b, h, t0 + t) + e];
                }
            }
            if (c->ds0 && slot >= 0) {
                for (int d = 0; d < D; d++, srow++)
                    for (int e = 0; e < E; e++) {
                        rs0[srow * E + e] = bds0[(size_t)d * E + e];
                        gs0[srow * E + e] = m_ds0[sidx(H, D, E, c->vk, slot, h, d, e)];
                    }
            }
        }
    }
    const double tol = case_tolerance(dt);
    double e_q = 0, e_k = 0, e_v = 0, e_s0 = 0, worst_ds = 0;
    if (row > 0) {
        case_check("dq", gq, rq, row, (size_t)D, tol, &e_q);
        case_check("dk", gk, rk, row, (size_t)D, tol, &e_k);
        case_check("dv", gv, rv, row, (size_t)E, tol, &e_v);
    }
    if (srow > 0)
        case_check("dS0", gs0, rs0, srow, (size_t)E, tol, &e_s0);
    if (c->want_ds) {
        for (int h = 0; h < H; h++) {
            double err = fabs((double)got_ds[h] - ref_ds[h]);
            if (!isfinite(got_ds[h]) || !(err <= tol * bound[h]))
                lj_test_fail(__FILE__, __LINE__, "ds[%d] = %.9g, reference %.9g (bound %.3g)", h,
                             (double)got_ds[h], ref_ds[h], tol * bound[h]);
            if (bound[h] > 0 && err / bound[h] > worst_ds)
                worst_ds = err / bound[h];
            if (c->finite_diff) {
                /* The reference against the finite difference: a check of the mathematics. */
                double scale_fd = fabs(fd[h]) + bound[h] * 1e-6 + 1e-12;
                if (fabs(fd[h] - ref_ds[h]) > 1e-4 * scale_fd)
                    lj_test_fail(__FILE__, __LINE__,
                                 "ds[%d]: reference %.12g, finite difference %.12g", h, ref_ds[h],
                                 fd[h]);
                if (!(fabs((double)got_ds[h] - fd[h]) <= tol * bound[h] + 1e-4 * scale_fd))
                    lj_test_fail(__FILE__, __LINE__, "ds[%d] = %.9g, finite difference %.9g", h,
                                 (double)got_ds[h], fd[h]);
            }
        }
    }
    /* Pool slots no sequence writes keep their poison (dS_0 of −1 rows and spare slots). */
    if (c->ds0 && varlen) {
        for (int p = 0; p < P; p++) {
            int used = 0;
            for (int i = 0; i < nseq; i++)
                used |= slots[i] == p;
            for (size_t i = 0; !used && i < (size_t)H * D * E; i++) {
                uint32_t bits;
                memcpy(&bits, &m_ds0[(size_t)p * H * D * E + i], 4);
                if (bits != 0xFFFFFFFFu)
                    lj_test_fail(__FILE__, __LINE__, "dS0 pool slot %d (no sequence) was written",
                                 p);
            }
        }
    }
    printf("bwd %s %s B=%d H=%d N=%d D=%d E=%d%s%s%s%s%s%s%s: rel L2 dq %.2e dk %.2e dv %.2e dS0 "
           "%.2e, "
           "ds err/bound %.2e; deterministic\n",
           c->family ? c->family : "default", lj_dtype_name(dt), c->B, H, N, D, E,
           c->decay ? " decay" : "", c->want_ds ? " ds" : "", c->initial ? " S0" : "",
           c->dsn ? " dSN" : "", c->ds0 ? " dS0" : "", c->vk ? " vk" : "",
           varlen ? " varlen" : (c->bnhd ? " bnhd" : ""), e_q, e_k, e_v, e_s0, worst_ds);

    lajit_ctx_destroy(ctx);
    CUdeviceptr frees[] = {d_q, d_k,  d_v,  d_g,   d_dq,  d_dk, d_dv,
                           d_s, d_ds, d_s0, d_dsn, d_ds0, d_cu, d_slots};
    for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++)
        lj_gpu_free(frees[i]);
    void *hf[] = {q,      k,     v,  g,  s,   s0,  dsn, s0_mem, dsn_mem, run1, m_dq,   m_dk,  m_dv,
                  got_ds, m_ds0, rq, gq, rk,  gk,  rv,  gv,     rs0,     gs0,  ref_ds, bound, fd,
                  bq,     bk,    bv, bg, bdq, bdk, bdv, bo,     bs0,     bdsn, bds0,   bsn};
    for (size_t i = 0; i < sizeof hf / sizeof hf[0]; i++)
        free(hf[i]);
}
