/* op_sweep.c — allocation-failure sweeps of an op's first call (see op_sweep.h). */
#include "op_sweep.h"

#include "context.h"

void sweep_require_nvrtc(void)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    int major, minor;
    if (lj_nvrtc_version(&env, &major, &minor) != LAJIT_OK)
        lj_test_skip("NVRTC not available");
}

void sweep_fixture_open(sweep_fixture *x)
{
    const lj_driver *drv = lj_fake_driver();
    memset(x, 0, sizeof *x);
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&x->cuctx, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(x->cuctx), CUDA_SUCCESS);
}

void sweep_fixture_close(sweep_fixture *x)
{
    const lj_driver *drv = lj_fake_driver();
    ASSERT_EQ(drv->cuCtxSetCurrent(x->cuctx), CUDA_SUCCESS);
    for (int i = 0; i < x->n; i++)
        ASSERT_EQ(drv->cuMemFree(x->ptr[i]), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

DLTensor *sweep_buffer(sweep_fixture *x, int ndim, const int64_t *shape, DLDataType dtype)
{
    ASSERT_TRUE(x->n < SWEEP_MAX_BUFS);
    size_t bytes = (size_t)(dtype.bits / 8);
    for (int d = 0; d < ndim; d++)
        bytes *= (size_t)shape[d];
    const lj_driver *drv = lj_fake_driver();
    int i = x->n++;
    ASSERT_EQ(drv->cuMemAlloc(&x->ptr[i], bytes), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemsetD8(x->ptr[i], 0, bytes), CUDA_SUCCESS);
    x->bytes[i] = bytes;
    return lj_gpu_tensor(&x->t[i], x->ptr[i], 0, ndim, shape, NULL, dtype);
}

static unsigned long long norm_ptr(const sweep_fixture *x, unsigned long long p)
{
    if (!p)
        return 0;
    for (int i = 0; i < x->n; i++)
        if (p >= x->ptr[i] && p - x->ptr[i] <= x->bytes[i])
            return ((unsigned long long)(i + 1) << 48) | (p - x->ptr[i]);
    return 0xFFFFull << 48;
}

static void normalize(const sweep_fixture *x, const lj_fake_launch *l, sweep_launch *out)
{
    memset(out, 0, sizeof *out);
    memcpy(out->entry, l->entry, sizeof out->entry);
    for (int d = 0; d < 3; d++) {
        out->grid[d] = l->grid[d];
        out->block[d] = l->block[d];
    }
    out->smem = l->smem;
    out->p = l->params;
    la_tensor4 *t[] = {&out->p.q,   &out->p.k,   &out->p.v,           &out->p.o,  &out->p.dout,
                       &out->p.dq,  &out->p.dk,  &out->p.dv,          &out->p.s0, &out->p.sn,
                       &out->p.ds0, &out->p.dsn, &out->p.step_states, &out->p.x};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        t[i]->ptr = norm_ptr(x, t[i]->ptr);
    unsigned long long *u[] = {&out->p.decay,  &out->p.dsdecay,   &out->p.cu_seqlens,
                               &out->p.slots,  &out->p.workspace, &out->p.splitws,
                               &out->p.splitst};
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++)
        *u[i] = norm_ptr(x, *u[i]);
    /* The state scan is launched through lajit_launch: its parameters are packed arguments, not
     * la_params (the fake copies la_params' size from them, past their end), pointing into the
     * context's buffers: compared by kernel and geometry only. */
    if (strcmp(out->entry, "la_state_scan") == 0)
        memset(&out->p, 0, sizeof out->p);
}

static int same_launches(const sweep_launch *a, int na, const sweep_launch *b, int nb)
{
    if (na != nb)
        return 0;
    for (int i = 0; i < na; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0)
            return 0;
    return 1;
}

lajit_ctx *sweep_ctx(const sweep_case *c)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = c->ctx_flags;
    desc.autotune = c->autotune ? c->autotune : LAJIT_AUTOTUNE_OFF;
    desc.bundle = c->bundle;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lajit__ctx_set_driver(ctx, lj_fake_driver());
    return ctx;
}

lajit_status sweep_call(const sweep_case *c, lajit_ctx *ctx, sweep_fixture *x, sweep_launch *out,
                        int *n_out)
{
    int mark = lj_fake_launch_count();
    lajit_status st = c->call(ctx, x);
    int n = 0;
    for (int i = mark; i < lj_fake_launch_count(); i++) {
        const lj_fake_launch *l = lj_fake_launch_get(i);
        ASSERT_TRUE(l != NULL);
        if (l->stream != NULL)
            continue; /* the tuner's timing launches, on its private stream */
        ASSERT_TRUE(n < SWEEP_MAX_LAUNCHES);
        normalize(x, l, &out[n++]);
    }
    *n_out = n;
    return st;
}

/* One iteration: the call with allocation n failing (0: none). Returns the allocations the call
 * made; *status receives its status. Fails the test on anything unclean. */
static uint64_t iterate(const sweep_case *c, uint64_t n, const sweep_launch *ref, int n_ref,
                        sweep_launch *got, int *n_got, lajit_status *status, int fresh)
{
    if (fresh && c->before)
        c->before();
    lj_fake_driver_reset();
    sweep_fixture *x = malloc(sizeof *x);
    ASSERT_TRUE(x != NULL);
    sweep_fixture_open(x);
    c->build(x);
    lajit_ctx *ctx = sweep_ctx(c);
    lj_env *env = lajit__ctx_env(ctx);
    uint64_t base = env->fault_count[LJ_FAULT_ALLOC];
    env->fault_at[LJ_FAULT_ALLOC] = n ? base + n : 0;
    lajit_status st = sweep_call(c, ctx, x, got, n_got);
    uint64_t used = env->fault_count[LJ_FAULT_ALLOC] - base;
    env->fault_at[LJ_FAULT_ALLOC] = 0;
    *status = st;
    if (n && ref) {
        if (used < n)
            lj_test_fail(
                __FILE__, __LINE__,
                "%s: the call made %llu allocations, the reference %llu (not deterministic?)",
                c->name, (unsigned long long)used, (unsigned long long)n);
        if (st != LAJIT_OK) {
            if (lajit_errmsg(ctx)[0] == 0)
                lj_test_fail(__FILE__, __LINE__, "%s: allocation %llu failed: %s with no message",
                             c->name, (unsigned long long)n, lajit_status_string(st));
            if (st != LAJIT_ERR_OUT_OF_MEMORY)
                lj_test_fail(__FILE__, __LINE__,
                             "%s: allocation %llu failed: status %d (%s), not out of memory: %s",
                             c->name, (unsigned long long)n, st, lajit_status_string(st),
                             lajit_errmsg(ctx));
            /* The context stays usable: the same call succeeds, with the same launches. */
            lajit_status again = sweep_call(c, ctx, x, got, n_got);
            if (again != LAJIT_OK)
                lj_test_fail(__FILE__, __LINE__,
                             "%s: after allocation %llu failed, the same call failed: %s: %s",
                             c->name, (unsigned long long)n, lajit_status_string(again),
                             lajit_errmsg(ctx));
        }
        if (!same_launches(got, *n_got, ref, n_ref) &&
            !(c->n_alt && same_launches(got, *n_got, c->alt, c->n_alt)))
            lj_test_fail(__FILE__, __LINE__,
                         "%s: allocation %llu failed (%s): the launches differ from the reference "
                         "(%d launches, reference %d)",
                         c->name, (unsigned long long)n, lajit_status_string(st), *n_got, n_ref);
    }
    lajit_ctx_destroy(ctx);
    sweep_fixture_close(x);
    free(x);
    if (!lj_fake_driver_balanced())
        lj_test_fail(__FILE__, __LINE__,
                     "%s: allocation %llu failed: a driver resource was not "
                     "given back",
                     c->name, (unsigned long long)n);
    return used;
}

uint64_t sweep_reference(const sweep_case *c, sweep_launch *ref, int *n_ref)
{
    lajit_status st;
    uint64_t used = iterate(c, 0, NULL, 0, ref, n_ref, &st, 1);
    ASSERT_OK(st);
    ASSERT_TRUE(*n_ref > 0);
    return used;
}

void sweep_expect(const sweep_case *c, const sweep_launch *ref, int n_ref, const char *what)
{
    sweep_launch got[SWEEP_MAX_LAUNCHES];
    int n_got;
    lajit_status st;
    iterate(c, 0, NULL, 0, got, &n_got, &st, 0);
    if (st != LAJIT_OK || !same_launches(got, n_got, ref, n_ref))
        lj_test_fail(__FILE__, __LINE__, "%s: %s: status %s, %d launches (reference %d)%s", c->name,
                     what, lajit_status_string(st), n_got, n_ref,
                     st == LAJIT_OK ? ", different from the reference" : "");
}

void sweep_run(const sweep_case *c, sweep_result *out)
{
    sweep_launch ref[SWEEP_MAX_LAUNCHES], got[SWEEP_MAX_LAUNCHES];
    int n_ref, n_got;
    /* Twice: the first run may fill the disk cache; the second is the path every iteration
     * takes. */
    sweep_reference(c, ref, &n_ref);
    uint64_t sites = sweep_reference(c, ref, &n_ref);
    memset(out, 0, sizeof *out);
    out->sites = sites;
    uint64_t count = sites;
    const char *all = getenv("LAJIT_SWEEP_ALL");
    if (c->max_injections > 1 && sites > (uint64_t)c->max_injections && !(all && *all == '1')) {
        count = (uint64_t)c->max_injections;
        out->sampled = 1;
    }
    for (uint64_t j = 0; j < count; j++) {
        /* Sampled: evenly spaced sites from the first to the last. */
        uint64_t n = out->sampled ? 1 + j * (sites - 1) / (count - 1) : j + 1;
        lajit_status st;
        iterate(c, n, ref, n_ref, got, &n_got, &st, 1);
        out->injected++;
        if (st == LAJIT_OK)
            out->recovered++;
        else
            out->errors++;
        if (c->after)
            c->after(c, ref, n_ref);
    }
    printf("%s: %llu allocation sites, %d failures injected%s: %d ended in out of memory, %d "
           "recovered; every one clean\n",
           c->name, (unsigned long long)sites, out->injected,
           out->sampled ? " (evenly sampled)" : "", out->errors, out->recovered);
    ASSERT_TRUE(out->errors > 0);
}
