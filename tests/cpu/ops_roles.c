/* ops_roles.c — the backward's passes as the la_bwd spec's `roles` table declares them, through
 * the fake driver: every pass's kernel parameter block (la_params, byte for byte) equals what the
 * hand-wired C of lajit 0.1 built (reference_pass below, kept here as the reference), for states
 * given or not, KV and VK, ds requested or not; and the roles table read from both backward
 * families is the same. */
#include "test.h"

#include "context.h"
#include "fake_driver.h"
#include "params.h"
#include "roles.h"
#include "config.h"

enum { B = 2, H = 3, N = 5, D = 32, E = 16 };

static DLTensor make(CUdeviceptr p, int ndim, int64_t *shape)
{
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = (void *)(uintptr_t)p;
    t.device.device_type = kDLCUDA;
    t.ndim = ndim;
    t.dtype.code = kDLFloat;
    t.dtype.bits = 32;
    t.dtype.lanes = 1;
    t.shape = shape;
    return t;
}

static la_tensor4 transposed(la_tensor4 t)
{
    long long s2 = t.s2;
    t.s2 = t.s3;
    t.s3 = s2;
    return t;
}

/* The parameters of scan part 0..2 from the op's la_params, as runtime/ops.c wired them in C,
 * and since the dq pass may compute ds (la_bwd_sm90), that pass also given q as x, dS_N
 * transposed, and ds's output and workspace when ds is wanted; since the dv pass may compute dk
 * (la_bwd_sm90/dkdv.cu), that pass also given v as x and dk as its second output. */
static la_params reference_pass(const la_params *lp, int part, int has_initial, int has_dsn,
                                int with_ds)
{
    la_params sp = *lp;
    memset(&sp.dout, 0, 4 * sizeof sp.dout);
    sp.s0 = sp.sn = sp.ds0 = sp.dsn = (la_tensor4){0};
    sp.dsdecay = sp.workspace = 0;
    switch (part) {
        case 0:
            sp.q = lp->dout, sp.k = lp->v, sp.v = lp->k, sp.o = lp->dq;
            if (has_initial)
                sp.s0 = transposed(lp->s0);
            sp.x = lp->q;
            if (has_dsn)
                sp.dsn = transposed(lp->dsn);
            if (with_ds)
                sp.dsdecay = lp->dsdecay, sp.workspace = lp->workspace;
            sp.D = lp->E, sp.E = lp->D;
            break;
        case 1:
            sp.q = lp->k, sp.k = lp->q, sp.v = lp->dout, sp.o = lp->dv;
            sp.s0 = lp->dsn;
            sp.sn = lp->ds0;
            sp.x = lp->v, sp.dk = lp->dk;
            break;
        default:
            sp.q = lp->v, sp.k = lp->dout, sp.v = lp->q, sp.o = lp->dk;
            if (has_dsn)
                sp.s0 = transposed(lp->dsn);
            sp.D = lp->E, sp.E = lp->D;
            break;
    }
    return sp;
}

static lajit_ctx *fake_ctx(void)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DISK_CACHE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lajit__ctx_set_driver(ctx, lj_fake_driver());
    return ctx;
}

static void require_nvrtc(void)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    int major, minor;
    if (lj_nvrtc_version(&env, &major, &minor) != LAJIT_OK)
        lj_test_skip("NVRTC not available");
}

/* One backward call with ds (so part 3 reports the op's own la_params), then the same without:
 * parts 0..2 must match the reference both times. */
static void check_variant(lajit_ctx *ctx, int with_initial, int with_dsn, int with_ds0, int vk)
{
    const lj_driver *drv = lj_fake_driver();
    size_t nq = (size_t)B * H * N * D * 4, ns = (size_t)B * H * D * E * 4;
    CUdeviceptr m[13];
    for (int i = 0; i < 13; i++)
        ASSERT_EQ(drv->cuMemAlloc(&m[i], nq > ns ? nq : ns), CUDA_SUCCESS);
    int64_t qs[4] = {B, H, N, D}, vs[4] = {B, H, N, E}, hs[1] = {H};
    int64_t st[4] = {B, H, vk ? E : D, vk ? D : E};
    DLTensor tq = make(m[0], 4, qs), tk = make(m[1], 4, qs), tv = make(m[2], 4, vs);
    DLTensor tg = make(m[3], 4, vs), tdq = make(m[4], 4, qs), tdk = make(m[5], 4, qs);
    DLTensor tdv = make(m[6], 4, vs), ts = make(m[7], 1, hs), tds = make(m[8], 1, hs);
    DLTensor ts0 = make(m[9], 4, st), tdsn = make(m[10], 4, st), tds0 = make(m[11], 4, st);
    lajit_attn_bwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &tq, a.k = &tk, a.v = &tv, a.dout = &tg, a.dq = &tdq, a.dk = &tdk, a.dv = &tdv;
    a.s = &ts, a.ds = &tds, a.scale = 0.25f;
    a.flags = vk ? LAJIT_STATE_VK : 0;
    a.initial_state = with_initial ? &ts0 : NULL;
    a.d_final_state = with_dsn ? &tdsn : NULL;
    a.d_initial_state = with_ds0 ? &tds0 : NULL;
    a.family = "la_bwd";
    int first = lj_fake_launch_count();
    ASSERT_OK(lajit_attn_bwd(ctx, &a));
    ASSERT_EQ(lj_fake_launch_count(), first + 4);
    la_params lp = lj_fake_launch_get(first + 3)->params;
    ASSERT_EQ(lp.q.ptr, m[0]);
    ASSERT_EQ(lp.dq.ptr, m[4]);
    ASSERT_EQ(lp.dsdecay, m[8]);
    ASSERT_EQ(lp.s0.ptr, with_initial ? m[9] : 0);
    ASSERT_EQ(lp.dsn.ptr, with_dsn ? m[10] : 0);
    for (int part = 0; part < 3; part++) {
        la_params want = reference_pass(&lp, part, with_initial, with_dsn, 1);
        const lj_fake_launch *l = lj_fake_launch_get(first + part);
        ASSERT_STREQ(l->entry, "la_fwd");
        ASSERT_EQ(memcmp(&l->params, &want, sizeof want), 0);
    }
    a.ds = NULL;
    first = lj_fake_launch_count();
    ASSERT_OK(lajit_attn_bwd(ctx, &a));
    ASSERT_EQ(lj_fake_launch_count(), first + 3);
    for (int part = 0; part < 3; part++) {
        la_params want = reference_pass(&lp, part, with_initial, with_dsn, 0);
        ASSERT_EQ(memcmp(&lj_fake_launch_get(first + part)->params, &want, sizeof want), 0);
    }
    for (int i = 0; i < 13; i++)
        ASSERT_EQ(drv->cuMemFree(m[i]), CUDA_SUCCESS);
}

LJ_TEST(bwd_pass_params_match_the_reference)
{
    require_nvrtc();
    lj_fake_driver_reset();
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    CUcontext cu;
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&cu, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(cu), CUDA_SUCCESS);
    lajit_ctx *ctx = fake_ctx();
    check_variant(ctx, 1, 1, 1, 0);
    check_variant(ctx, 0, 0, 0, 0);
    check_variant(ctx, 1, 1, 0, 1);
    check_variant(ctx, 0, 1, 1, 1);
    lajit_ctx_destroy(ctx);
}

/* la_bwd_sm90 runs the same passes as la_bwd: its spec's roles are la_bwd's, read the same. */
LJ_TEST(both_backward_families_declare_the_same_roles)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DISK_CACHE | LAJIT_CTX_NO_DEVICE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lj_lua *L;
    lj_family *f0, *f1;
    ASSERT_OK(lajit__ctx_lua(ctx, &L));
    ASSERT_OK(lajit__ctx_family(ctx, "la_bwd", &f0));
    ASSERT_OK(lajit__ctx_family(ctx, "la_bwd_sm90", &f1));
    lj_roles r0, r1;
    ASSERT_OK(lj_roles_load(L, f0, &r0));
    ASSERT_OK(lj_roles_load(L, f1, &r1));
    ASSERT_EQ(r0.n, 4);
    ASSERT_EQ(memcmp(&r0, &r1, sizeof r0), 0);
    /* Part 0: dq = scan of (dout, v, k) from S0 transposed, D and E swapped. */
    ASSERT_EQ(r0.pass[0].part, 0);
    ASSERT_EQ(r0.pass[0].swap_de, 1);
    ASSERT_EQ(r0.pass[0].transpose, (1u << LJ_SLOT_S0) | (1u << LJ_SLOT_DSN));
    ASSERT_EQ(r0.pass[0].keep, LJ_ROLE_HAS_INITIAL | LJ_ROLE_HAS_DSN | LJ_ROLE_WANT_DS);
    ASSERT_EQ(r0.pass[0].ds, 1);
    ASSERT_EQ(r0.pass[0].ticket, 1);
    ASSERT_EQ(r0.pass[0].slot[LJ_SLOT_X], 0); /* the op's q (the first of roles.c's tensors) */
    /* Part 1: dv, and v and dk handed on for a kernel that computes dk too. */
    ASSERT_EQ(r0.pass[1].slot[LJ_SLOT_X], 2);  /* the op's v */
    ASSERT_EQ(r0.pass[1].slot[LJ_SLOT_O2], 6); /* the op's dk */
    ASSERT_EQ(r0.pass[3].when, LJ_ROLE_WANT_DS);
    ASSERT_EQ(r0.pass[3].all, 1);
    /* A forward family has no roles: a clear error, no panic. */
    lj_family *fwd;
    ASSERT_OK(lajit__ctx_family(ctx, "la_fwd", &fwd));
    ASSERT_STATUS(lj_roles_load(L, fwd, &r0), LAJIT_ERR_TEMPLATE);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "no roles table");
    lajit_ctx_destroy(ctx);
}

/* The default backward on an sm_90a device (the fake driver's), bf16, N = 5: the kernels it
 * launches, in order, and the dv pass's parameters. */
static int sm90_bwd(lajit_ctx *ctx, int b, int h, int d, int e, int state_only, const char **entry,
                    la_params *dv)
{
    const lj_driver *drv = lj_fake_driver();
    const int n = 5;
    size_t nq = (size_t)b * h * n * (d > e ? d : e) * 2, ns = (size_t)b * h * d * e * 4;
    CUdeviceptr m[9];
    for (int i = 0; i < 9; i++)
        ASSERT_EQ(drv->cuMemAlloc(&m[i], nq > ns ? nq : ns), CUDA_SUCCESS);
    int64_t qs[4] = {b, h, n, d}, vs[4] = {b, h, n, e}, hs[1] = {h}, st[4] = {b, h, d, e};
    DLTensor t[9] = {make(m[0], 4, qs), make(m[1], 4, qs), make(m[2], 4, vs),
                     make(m[3], 4, vs), make(m[4], 4, qs), make(m[5], 4, qs),
                     make(m[6], 4, vs), make(m[7], 1, hs), make(m[8], 4, st)};
    for (int i = 0; i < 7; i++)
        t[i].dtype.code = kDLBfloat, t[i].dtype.bits = 16;
    lajit_attn_bwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = &t[0], a.k = &t[1], a.v = &t[2], a.dout = &t[3];
    if (!state_only)
        a.dq = &t[4], a.dk = &t[5], a.dv = &t[6];
    a.s = &t[7], a.d_initial_state = &t[8], a.scale = 0.25f;
    int first = lj_fake_launch_count();
    lajit_status s = lajit_attn_bwd(ctx, &a);
    if (s != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(s), lajit_errmsg(ctx));
    int count = lj_fake_launch_count() - first;
    for (int i = 0; i < count && i < 3; i++) {
        const lj_fake_launch *l = lj_fake_launch_get(first + i);
        entry[i] = l->entry;
        if (l->params.o.ptr == (state_only ? 0 : m[6]) && l->params.sn.ptr == m[8])
            *dv = l->params; /* the pass that writes dv and dS_0 */
    }
    if (!state_only) {
        ASSERT_EQ(dv->v.ptr, m[3]); /* dO as the scan's v */
        ASSERT_EQ(dv->x.ptr, m[2]); /* v, and dk as the second output */
        ASSERT_EQ(dv->dk.ptr, m[5]);
        ASSERT_EQ(dv->dk.s2, (long long)d);
        /* The tuner lays the pass out the same way (device/params.c): its dense buffers in the
         * op's roles give the parameters the op gave. */
        lj_problem p;
        memset(&p, 0, sizeof p);
        p.op = LJ_OP_BWD, p.part = 1, p.dtype = LJ_BF16, p.decay = 1, p.has_final = 1;
        p.B = b, p.H = h, p.N = n, p.D = d, p.E = e;
        lj_dense_layout lay;
        lj_env env;
        lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
        ASSERT_OK(lj_dense_layout_of(&env, &p, &lay));
        ASSERT_EQ(lay.x, (size_t)b * h * n * e * 2);
        ASSERT_EQ(lay.o2, (size_t)b * h * n * d * 2);
        lj_dense_buffers buf;
        memset(&buf, 0, sizeof buf);
        buf.q = m[1], buf.k = m[0], buf.v = m[3], buf.o = m[6], buf.s = m[7], buf.sn = m[8];
        buf.x = m[2], buf.o2 = m[5];
        la_params dense;
        lj_params_dense(&p, &buf, 0.25f, &dense);
        const la_tensor4 *got[] = {&dv->q, &dv->k, &dv->v, &dv->o, &dv->x, &dv->dk, &dv->sn};
        const la_tensor4 *want[] = {&dense.q, &dense.k,  &dense.v, &dense.o,
                                    &dense.x, &dense.dk, &dense.sn};
        for (int i = 0; i < 7; i++) {
            la_tensor4 g = *got[i], w = *want[i];
            if (b == 1) /* a unit batch's stride is not read (the op gives 0) */
                g.s0 = w.s0 = 0;
            ASSERT_EQ(memcmp(&g, &w, sizeof g), 0);
        }
    }
    for (int i = 0; i < 9; i++)
        ASSERT_EQ(drv->cuMemFree(m[i]), CUDA_SUCCESS);
    return count;
}

/* Where the dv pass can compute dk too (la_bwd_sm90/dkdv.cu: D = E = 64 or 128, 16-bit, at least
 * 128 sequences x heads) it does, and the dk pass is skipped: two kernels instead of three. With
 * fewer heads, D != E, or dS_0 alone (no outputs) the passes stay apart. */
LJ_TEST(sm90_dv_pass_computes_dk_where_it_can)
{
    require_nvrtc();
    lj_fake_driver_reset();
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    CUcontext cu;
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&cu, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(cu), CUDA_SUCCESS);
    lajit_ctx *ctx = fake_ctx();
    const char *e[3] = {0};
    la_params dv;
    ASSERT_EQ(sm90_bwd(ctx, 4, 32, 128, 128, 0, e, &dv), 2);
    ASSERT_STREQ(e[0], "la_fwd_sm90");
    ASSERT_STREQ(e[1], "la_bwd_sm90_dkdv");
    ASSERT_EQ(sm90_bwd(ctx, 1, 128, 64, 64, 0, e, &dv), 2);
    ASSERT_STREQ(e[1], "la_bwd_sm90_dkdv");
    ASSERT_EQ(sm90_bwd(ctx, 2, 32, 128, 128, 0, e, &dv), 3); /* 64 heads: three passes */
    ASSERT_STREQ(e[1], "la_fwd_sm90");
    ASSERT_STREQ(e[2], "la_fwd_sm90");
    ASSERT_EQ(sm90_bwd(ctx, 4, 32, 64, 128, 0, e, &dv), 3);  /* D != E */
    ASSERT_EQ(sm90_bwd(ctx, 4, 32, 128, 128, 1, e, &dv), 1); /* dS_0 alone */
    ASSERT_STREQ(e[0], "la_fwd_sm90");
    lajit_ctx_destroy(ctx);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* The dq pass with ds at D = E = 64 runs two CTAs of one warpgroup per head (la_bwd_sm90's
 * default, measured faster than la_fwd_sm90's two warpgroups splitting Q Kᵀ); other widths keep
 * la_fwd_sm90's ds default. */
static void ds_default_of(lajit_ctx *ctx, int d, int e, char *text, size_t cap)
{
    lj_family *f;
    ASSERT_OK(lajit__ctx_family(ctx, "la_bwd_sm90", &f));
    lj_device_info dev;
    ASSERT_TRUE(lj_device_info_for_arch("sm_90a", &dev));
    lj_problem p;
    memset(&p, 0, sizeof p);
    p.op = LJ_OP_BWD, p.part = 0, p.dtype = LJ_BF16, p.decay = 1, p.want_ds = 1, p.has_dsn = 1;
    p.B = 4, p.H = 32, p.N = 8192, p.D = d, p.E = e;
    lj_config cfg;
    ASSERT_OK(lj_family_default(f, &p, &dev, &cfg));
    lj_config_format(&cfg, text, cap);
}

LJ_TEST(sm90_ds_pass_at_d64_takes_one_warpgroup_ctas)
{
    lajit_ctx *ctx = fake_ctx();
    char text[256];
    ds_default_of(ctx, 64, 64, text, sizeof text);
    ASSERT_CONTAINS(text, "WGS=1");
    ASSERT_CONTAINS(text, "TILE_V=32");
    ASSERT_CONTAINS(text, "SPLIT_QK=0");
    ds_default_of(ctx, 128, 128, text, sizeof text);
    ASSERT_CONTAINS(text, "WGS=2");
    ASSERT_CONTAINS(text, "SPLIT_QK=1");
    lajit_ctx_destroy(ctx);
}
