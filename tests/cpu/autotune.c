/* autotune.c — the tuner and the autotune policy with no GPU, through the fake driver: a search
 * over the test family "toy" (tests/data/templates) where one candidate faults with an illegal
 * address (recorded as failed, its private context replaced, the fastest valid candidate wins,
 * the caller's context untouched, every driver resource given back) and inputs rotate over
 * several buffer sets; the policies off (database winner, else default) and eager (tune on first
 * call, record, use; default while another process holds the lease); configuration texts; and
 * the dense la_params helper against what the ops themselves pass to kernels; short kernels
 * timed as graphs of back-to-back launches. */
#include "test.h"

#include <sys/wait.h>
#include <unistd.h>

#include "context.h"
#include "fake_driver.h"
#include "params.h"
#include "search.h"
#include "toy_call.h"

static void require_nvrtc(void)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    int major, minor;
    if (lj_nvrtc_version(&env, &major, &minor) != LAJIT_OK)
        lj_test_skip("NVRTC not available");
}

static void use_test_templates(void)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/data/templates", lj_test_source_dir());
    setenv("LAJIT_TEMPLATE_DIR", dir, 1);
}

static int warnings;
static void count_warnings(void *user, lajit_log_level level, const char *message)
{
    (void)user;
    (void)message;
    if (level <= LAJIT_LOG_WARN)
        warnings++;
}

static lajit_ctx *fake_ctx(uint32_t autotune)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.autotune = autotune;
    desc.log = count_warnings;
    desc.log_level = LAJIT_LOG_WARN;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lajit__ctx_set_driver(ctx, lj_fake_driver());
    return ctx;
}

/* The toy family's time model: more unrolling and more warps are faster, so UNROLL=4 WARPS=2
 * (block 64, 4 KiB of shared memory) would win — but it faults. */
static double toy_time(const lj_fake_launch *l, void *user)
{
    (void)user;
    return 1.0 / (l->smem / 1024.0) - l->block[0] / 32.0 * 0.05;
}

static int toy_faults(const lj_fake_launch *l, void *user)
{
    (void)user;
    return l->block[0] == 64 && l->smem == 4096;
}

LJ_TEST(search_survives_a_faulting_candidate)
{
    require_nvrtc();
    use_test_templates();
    lj_fake_driver_reset();
    lj_fake_driver_set_kernel_time(toy_time, NULL);
    lj_fake_driver_fault_launches(toy_faults, NULL, CUDA_ERROR_ILLEGAL_ADDRESS);
    lajit_ctx *ctx = fake_ctx(LAJIT_AUTOTUNE_OFF);
    lj_env *env = lajit__ctx_env(ctx);
    lj_family *f;
    lj_lua *L;
    lj_cache *cache;
    lj_device *dev;
    ASSERT_OK(lajit__ctx_family(ctx, "toy", &f));
    ASSERT_OK(lajit__ctx_lua(ctx, &L));
    ASSERT_OK(lajit__ctx_cache(ctx, &cache));
    ASSERT_OK(lajit__ctx_device(ctx, &dev));
    /* The application's context is current before and after. */
    ASSERT_OK(lj_device_make_current(env, dev));
    CUcontext before, after;
    ASSERT_EQ(lj_fake_driver()->cuCtxGetCurrent(&before), CUDA_SUCCESS);

    lj_problem p = toy_problem();
    lj_search_out res;
    lj_search_opts opts = {0};
    opts.runs = 7;
    ASSERT_OK(lj_search_run(env, L, f, cache, dev, &p, &opts, &res));
    ASSERT_EQ(res.n_space, 6);
    ASSERT_EQ(res.n_valid, 6);
    ASSERT_EQ(res.n_results, 6);
    int failed = 0;
    for (int i = 0; i < res.n_results; i++) {
        if (strcmp(res.results[i].config, "UNROLL=4 WARPS=2") == 0) {
            ASSERT_CONTAINS(res.results[i].failure, "CUDA_ERROR_ILLEGAL_ADDRESS");
            ASSERT_TRUE(res.results[i].ms < 0);
            failed++;
        } else {
            ASSERT_STREQ(res.results[i].failure, "");
            ASSERT_TRUE(res.results[i].ms > 0);
        }
    }
    ASSERT_EQ(failed, 1);
    ASSERT_TRUE(res.have_best);
    char best[256], dflt[256];
    lj_config_format(&res.best, best, sizeof best);
    lj_config_format(&res.dflt, dflt, sizeof dflt);
    ASSERT_STREQ(best, "UNROLL=4 WARPS=1");
    ASSERT_STREQ(dflt, "UNROLL=4 WARPS=2"); /* the default is the one that faulted */
    ASSERT_TRUE(res.default_ms < 0);
    ASSERT_TRUE(fabs(res.best_ms - 0.2) < 1e-3); /* the median of the model's time */
    lj_search_out_free(env, &res);

    const lj_fake_counts *c = lj_fake_driver_counts();
    ASSERT_EQ(c->faults, 1);
    ASSERT_EQ(c->contexts_created, 2); /* the first, and one after the fault */
    ASSERT_EQ(c->contexts_destroyed, 2);
    ASSERT_EQ(lj_fake_driver()->cuCtxGetCurrent(&after), CUDA_SUCCESS);
    ASSERT_TRUE(after == before);
    /* Warm-up and timed launches rotate over distinct input sets (>= 2x the fake's 50 MiB L2:
     * here the cap of 64 sets of this small problem). */
    unsigned long long first = 0;
    int distinct = 0;
    for (int i = 0; i < lj_fake_launch_count() && i < LJ_FAKE_MAX_LAUNCHES; i++) {
        const lj_fake_launch *l = lj_fake_launch_get(i);
        ASSERT_TRUE(l->params.q.ptr != 0 && l->params.decay != 0);
        ASSERT_EQ(l->params.B, 2);
        if (!first)
            first = l->params.q.ptr;
        else if (l->params.q.ptr != first)
            distinct++;
    }
    ASSERT_TRUE(distinct > 0);
    lajit_ctx_destroy(ctx);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* Short kernels: alone, UNROLL=1 looks fastest (its launch is cheap); in a graph of back-to-back
 * launches UNROLL=4 WARPS=2 is. The tuner must rank them by the graph. */
static double short_time(const lj_fake_launch *l, void *user)
{
    (void)user;
    const int fast_in_graphs = l->block[0] == 64 && l->smem == 4096;
    if (l->captured)
        return fast_in_graphs ? 0.002 : 0.004;
    return fast_in_graphs ? 0.010 : 0.006;
}

LJ_TEST(search_times_short_kernels_as_graphs)
{
    require_nvrtc();
    use_test_templates();
    lj_fake_driver_reset();
    lj_fake_driver_set_kernel_time(short_time, NULL);
    lajit_ctx *ctx = fake_ctx(LAJIT_AUTOTUNE_OFF);
    lj_env *env = lajit__ctx_env(ctx);
    lj_family *f;
    lj_lua *L;
    lj_cache *cache;
    lj_device *dev;
    ASSERT_OK(lajit__ctx_family(ctx, "toy", &f));
    ASSERT_OK(lajit__ctx_lua(ctx, &L));
    ASSERT_OK(lajit__ctx_cache(ctx, &cache));
    ASSERT_OK(lajit__ctx_device(ctx, &dev));
    ASSERT_OK(lj_device_make_current(env, dev));
    lj_problem p = toy_problem();
    lj_search_out res;
    lj_search_opts opts = {0};
    opts.runs = 5;
    ASSERT_OK(lj_search_run(env, L, f, cache, dev, &p, &opts, &res));
    ASSERT_EQ(res.n_results, 6);
    char best[256];
    lj_config_format(&res.best, best, sizeof best);
    ASSERT_STREQ(best, "UNROLL=4 WARPS=2");
    ASSERT_TRUE(fabs(res.best_ms - 0.002) < 1e-5); /* per launch inside the graph */
    for (int i = 0; i < res.n_results; i++)
        ASSERT_TRUE(fabs(res.results[i].ms - 0.002) < 1e-5 ||
                    fabs(res.results[i].ms - 0.004) < 1e-5);
    lj_search_out_free(env, &res);
    const lj_fake_counts *c = lj_fake_driver_counts();
    ASSERT_EQ(c->captures_begun, 6);
    ASSERT_EQ(c->captures_ended, 6);
    ASSERT_EQ(c->graph_launches, 6 * 6); /* one warm-up replay and five timed, per candidate */
    ASSERT_EQ(c->graphs_destroyed, 6);
    ASSERT_EQ(c->graph_execs_destroyed, 6);
    lj_fake_driver_set_kernel_time(NULL, NULL);
    lajit_ctx_destroy(ctx);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(search_driver_failures_are_clean)
{
    /* The private context cannot be made: the search fails with a clear status, nothing held. */
    require_nvrtc();
    use_test_templates();
    lj_fake_driver_reset();
    lajit_ctx *ctx = fake_ctx(LAJIT_AUTOTUNE_OFF);
    lj_env *env = lajit__ctx_env(ctx);
    lj_family *f;
    lj_lua *L;
    lj_cache *cache;
    lj_device *dev;
    ASSERT_OK(lajit__ctx_family(ctx, "toy", &f));
    ASSERT_OK(lajit__ctx_lua(ctx, &L));
    ASSERT_OK(lajit__ctx_cache(ctx, &cache));
    ASSERT_OK(lajit__ctx_device(ctx, &dev));
    lj_problem p = toy_problem();
    lj_search_out res;
    lj_fake_driver_fail("cuCtxCreate", CUDA_ERROR_OUT_OF_MEMORY);
    ASSERT_STATUS(lj_search_run(env, L, f, cache, dev, &p, NULL, &res),
                  LAJIT_ERR_DEVICE_OUT_OF_MEMORY);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "cuCtxCreate");
    /* Allocation of the inputs fails: same. */
    lj_fake_driver_fail("cuMemAlloc", CUDA_ERROR_OUT_OF_MEMORY);
    ASSERT_STATUS(lj_search_run(env, L, f, cache, dev, &p, NULL, &res),
                  LAJIT_ERR_DEVICE_OUT_OF_MEMORY);
    lj_fake_driver_fail(NULL, CUDA_SUCCESS);
    /* Every launch refused (not sticky): every candidate fails, the search still returns. */
    lj_fake_driver_fail("cuLaunchKernel", CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
    ASSERT_OK(lj_search_run(env, L, f, cache, dev, &p, NULL, &res));
    ASSERT_EQ(res.have_best, 0);
    for (int i = 0; i < res.n_results; i++)
        ASSERT_CONTAINS(res.results[i].failure, "LAUNCH_OUT_OF_RESOURCES");
    lj_search_out_free(env, &res);
    lj_fake_driver_fail(NULL, CUDA_SUCCESS);
    lajit_ctx_destroy(ctx);
    ASSERT_TRUE(lj_fake_driver_balanced());
    /* Unsupported problems are refused before anything is compiled or allocated. */
    ctx = fake_ctx(LAJIT_AUTOTUNE_OFF);
    env = lajit__ctx_env(ctx);
    ASSERT_OK(lajit__ctx_family(ctx, "toy", &f));
    ASSERT_OK(lajit__ctx_lua(ctx, &L));
    ASSERT_OK(lajit__ctx_cache(ctx, &cache));
    ASSERT_OK(lajit__ctx_device(ctx, &dev));
    p.varlen = 1;
    ASSERT_STATUS(lj_search_run(env, L, f, cache, dev, &p, NULL, &res), LAJIT_ERR_UNSUPPORTED);
    lajit_ctx_destroy(ctx);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(config_text_round_trip)
{
    use_test_templates();
    lajit_ctx *ctx = fake_ctx(LAJIT_AUTOTUNE_OFF);
    lj_env *env = lajit__ctx_env(ctx);
    lj_family *f;
    ASSERT_OK(lajit__ctx_family(ctx, "toy", &f));
    lj_device_info dev;
    ASSERT_TRUE(lj_device_info_for_arch("sm_90a", &dev));
    lj_problem p = toy_problem();
    lj_config base, cfg;
    ASSERT_OK(lj_family_default(f, &p, &dev, &base));
    ASSERT_OK(lj_config_parse(env, f, &base, "UNROLL=1 WARPS=1", &cfg));
    char text[256];
    lj_config_format(&cfg, text, sizeof text);
    ASSERT_STREQ(text, "UNROLL=1 WARPS=1");
    ASSERT_OK(lj_config_parse(env, f, &base, "  WARPS=2  UNROLL=2 ", &cfg));
    lj_config_format(&cfg, text, sizeof text);
    ASSERT_STREQ(text, "UNROLL=2 WARPS=2");
    const char *bad[] = {"UNROLL=1",
                         "UNROLL=1 WARPS=1 WARPS=2",
                         "UNROLL=3 WARPS=1",
                         "UNROLL=1 WARPS=1 BLOCK=64",
                         "UNROLL=1 WARPS=1 D=64",
                         "",
                         "UNROLL WARPS"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ASSERT_TRUE(lj_config_parse(env, f, &base, bad[i], &cfg) != LAJIT_OK);
    lajit_ctx_destroy(ctx);
}

/* ---- The policies through lajit_attn_fwd on family "toy" (tests/support/toy_call.h) ------- */

LJ_TEST(policy_off_uses_the_database_winner)
{
    require_nvrtc();
    use_test_templates();
    lj_fake_driver_reset();
    toy_call u;
    toy_open(&u);
    /* No winner: the default (UNROLL=4 WARPS=2: block 64, 4 KiB). */
    lajit_ctx *ctx = fake_ctx(LAJIT_AUTOTUNE_OFF);
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    unsigned block, smem;
    toy_last_launch(&block, &smem);
    ASSERT_EQ(block, 64);
    ASSERT_EQ(smem, 4096);
    lj_tune_id id = toy_id(ctx);
    ASSERT_STREQ(id.bucket, "bf16_D32");
    lajit_ctx_destroy(ctx);

    /* A winner recorded: a new context uses it (UNROLL=2 WARPS=1: block 32, 2 KiB). */
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, getenv("LAJIT_CACHE_DIR"), &db));
    lj_tune_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.config, sizeof r.config, "UNROLL=2 WARPS=1");
    r.ms = 0.5;
    ASSERT_OK(lj_tunedb_record(db, &id, &r, 1, "UNROLL=4 WARPS=2", 1.0));
    ctx = fake_ctx(LAJIT_AUTOTUNE_OFF);
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    toy_last_launch(&block, &smem);
    ASSERT_EQ(block, 32);
    ASSERT_EQ(smem, 2048);
    lajit_ctx_destroy(ctx);

    /* A winner that no longer parses (a parameter the family dropped): the default, a warning. */
    snprintf(r.config, sizeof r.config, "UNROLL=2 WARPS=1 GONE=3");
    ASSERT_OK(lj_tunedb_record(db, &id, &r, 1, "UNROLL=4 WARPS=2", 1.0));
    warnings = 0;
    ctx = fake_ctx(LAJIT_AUTOTUNE_OFF);
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    toy_last_launch(&block, &smem);
    ASSERT_EQ(block, 64);
    ASSERT_TRUE(warnings >= 1);
    lajit_ctx_destroy(ctx);
    lj_tunedb_close(db);
    ASSERT_EQ(lj_fake_driver_counts()->contexts_created, 0); /* off never tunes */
    toy_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(policy_off_with_a_corrupt_database)
{
    require_nvrtc();
    use_test_templates();
    lj_fake_driver_reset();
    toy_call u;
    toy_open(&u);
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s", getenv("LAJIT_CACHE_DIR"));
    snprintf(path, sizeof path, "%s/tune.db", dir);
    char cmd[2300];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && head -c 10000 /dev/urandom > '%s'", dir, path);
    ASSERT_EQ(system(cmd), 0);
    warnings = 0;
    lajit_ctx *ctx = fake_ctx(LAJIT_AUTOTUNE_OFF);
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    unsigned block, smem;
    toy_last_launch(&block, &smem);
    ASSERT_EQ(block, 64);       /* the default */
    ASSERT_TRUE(warnings >= 1); /* set aside, said once */
    lajit_ctx_destroy(ctx);
    /* An unusable directory: defaults, no crash. */
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && echo x > '%s'", dir, dir);
    ASSERT_EQ(system(cmd), 0);
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.autotune = LAJIT_AUTOTUNE_EAGER;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lajit__ctx_set_driver(ctx, lj_fake_driver());
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    lajit_ctx_destroy(ctx);
    toy_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(policy_eager_tunes_once_and_records)
{
    require_nvrtc();
    use_test_templates();
    lj_fake_driver_reset();
    lj_fake_driver_set_kernel_time(toy_time, NULL);
    lj_fake_driver_fault_launches(toy_faults, NULL, CUDA_ERROR_ILLEGAL_ADDRESS);
    toy_call u;
    toy_open(&u);
    setenv("LAJIT_AUTOTUNE", "eager", 1);
    lajit_ctx *ctx = fake_ctx(LAJIT_AUTOTUNE_ENV);
    ASSERT_EQ(ctx->autotune, LAJIT_AUTOTUNE_EAGER);
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    unsigned block, smem;
    toy_last_launch(&block, &smem);
    ASSERT_EQ(block, 32); /* UNROLL=4 WARPS=1: the fastest that did not fault */
    ASSERT_EQ(smem, 4096);
    /* The application's primary context was never poisoned: its calls go on. */
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    ASSERT_EQ(lj_fake_driver_counts()->contexts_created, 2);
    lj_tune_id id = toy_id(ctx);
    lajit_ctx_destroy(ctx);

    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, getenv("LAJIT_CACHE_DIR"), &db));
    char cfg[256];
    int found;
    ASSERT_OK(lj_tunedb_winner(db, &id, cfg, sizeof cfg, NULL, &found));
    ASSERT_EQ(found, 1);
    ASSERT_STREQ(cfg, "UNROLL=4 WARPS=1");
    lj_tune_result *r;
    int n;
    ASSERT_OK(lj_tunedb_results(db, &id, &r, &n));
    ASSERT_EQ(n, 6);
    ASSERT_CONTAINS(r[5].failure, "ILLEGAL_ADDRESS");
    lj_free(&env, r);
    lj_tunedb_close(db);

    /* A second eager context finds the winner: no tuning again. */
    ctx = fake_ctx(LAJIT_AUTOTUNE_ENV);
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    toy_last_launch(&block, &smem);
    ASSERT_EQ(block, 32);
    ASSERT_EQ(lj_fake_driver_counts()->contexts_created, 2);
    lajit_ctx_destroy(ctx);
    unsetenv("LAJIT_AUTOTUNE");
    toy_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(policy_eager_defers_to_the_lease_holder)
{
    require_nvrtc();
    use_test_templates();
    lj_fake_driver_reset();
    toy_call u;
    toy_open(&u);
    lajit_ctx *ctx = fake_ctx(LAJIT_AUTOTUNE_EAGER);
    lj_tune_id id = toy_id(ctx);
    /* Another process holds the bucket's lease while we run. */
    int ready[2], done[2];
    ASSERT_EQ(pipe(ready), 0);
    ASSERT_EQ(pipe(done), 0);
    pid_t pid = fork();
    if (pid == 0) {
        lj_env env;
        lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
        lj_tunedb *db;
        int got = 0;
        if (lj_tunedb_open(&env, getenv("LAJIT_CACHE_DIR"), &db) != LAJIT_OK ||
            lj_tunedb_lease(db, &id, 600, &got) != LAJIT_OK || !got)
            _exit(1);
        char c = 'x';
        if (write(ready[1], &c, 1) != 1 || read(done[0], &c, 1) < 0)
            _exit(1);
        lj_tunedb_close(db);
        _exit(0);
    }
    char c;
    ASSERT_EQ(read(ready[0], &c, 1), 1);
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    unsigned block, smem;
    toy_last_launch(&block, &smem);
    ASSERT_EQ(block, 64); /* the default, untuned */
    ASSERT_EQ(lj_fake_driver_counts()->contexts_created, 0);
    ASSERT_EQ(write(done[1], "x", 1), 1);
    int status;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    lajit_ctx_destroy(ctx);
    toy_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(ctx_desc_autotune_checked)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    ASSERT_EQ(desc.autotune, LAJIT_AUTOTUNE_ENV);
    lajit_ctx *ctx;
    desc.autotune = 3;
    ASSERT_STATUS(lajit_ctx_create(&desc, &ctx), LAJIT_ERR_INVALID_ARGUMENT);
    desc.autotune = LAJIT_AUTOTUNE_EAGER;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    ASSERT_EQ(ctx->autotune, LAJIT_AUTOTUNE_EAGER);
    lajit_ctx_destroy(ctx);
    setenv("LAJIT_AUTOTUNE", "sometimes", 1);
    desc.autotune = LAJIT_AUTOTUNE_ENV;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    ASSERT_EQ(ctx->autotune, LAJIT_AUTOTUNE_OFF);
    lajit_ctx_destroy(ctx);
    unsetenv("LAJIT_AUTOTUNE");
    ASSERT_OK(lajit_ctx_create(NULL, &ctx));
    ASSERT_EQ(ctx->autotune, LAJIT_AUTOTUNE_OFF);
    lajit_ctx_destroy(ctx);
}

/* ---- lj_params_dense matches the ops --------------------------------------------------------- */

static void expect_same_tensor(const la_tensor4 *a, const la_tensor4 *b, const char *what)
{
    if (a->ptr != b->ptr || a->s0 != b->s0 || a->s1 != b->s1 || a->s2 != b->s2 || a->s3 != b->s3)
        lj_test_fail(__FILE__, __LINE__,
                     "%s: op (%llx %lld %lld %lld %lld) vs dense (%llx %lld %lld %lld %lld)", what,
                     a->ptr, a->s0, a->s1, a->s2, a->s3, b->ptr, b->s0, b->s1, b->s2, b->s3);
}

static void expect_same_params(const la_params *op, const la_params *dense)
{
    expect_same_tensor(&op->q, &dense->q, "q");
    expect_same_tensor(&op->k, &dense->k, "k");
    expect_same_tensor(&op->v, &dense->v, "v");
    expect_same_tensor(&op->o, &dense->o, "o");
    expect_same_tensor(&op->s0, &dense->s0, "s0");
    expect_same_tensor(&op->sn, &dense->sn, "sn");
    expect_same_tensor(&op->step_states, &dense->step_states, "step_states");
    ASSERT_EQ(op->decay, dense->decay);
    ASSERT_EQ(op->B, dense->B);
    ASSERT_EQ(op->H, dense->H);
    ASSERT_EQ(op->N, dense->N);
    ASSERT_EQ(op->D, dense->D);
    ASSERT_EQ(op->E, dense->E);
    ASSERT_EQ(op->T, dense->T);
    ASSERT_EQ(op->nseq, dense->nseq);
    ASSERT_EQ(op->P, dense->P);
    ASSERT_TRUE(op->scale == dense->scale);
    ASSERT_EQ(op->slots, 0);
    ASSERT_EQ(op->cu_seqlens, 0);
}

LJ_TEST(dense_params_match_fwd)
{
    require_nvrtc();
    lj_fake_driver_reset();
    toy_call u;
    toy_open(&u); /* the primary context and the sequence buffers */
    const lj_driver *drv = lj_fake_driver();
    lj_problem p = toy_problem();
    p.dtype = LJ_BF16;
    CUdeviceptr s0, sn;
    size_t state = (size_t)p.B * p.H * p.D * p.E * 4;
    ASSERT_EQ(drv->cuMemAlloc(&s0, state), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&sn, state), CUDA_SUCCESS);
    for (int vk = 0; vk < 2; vk++) {
        int64_t sshape[4] = {p.B, p.H, vk ? p.E : p.D, vk ? p.D : p.E};
        DLTensor t0 = toy_tensor(s0, 4, sshape, kDLFloat, 32),
                 tn = toy_tensor(sn, 4, sshape, kDLFloat, 32);
        u.args.family = "la_recurrent";
        u.args.initial_state = &t0;
        u.args.final_state = &tn;
        u.args.flags = vk ? LAJIT_STATE_VK : 0;
        u.args.scale = 0.25f;
        lajit_ctx *ctx = fake_ctx(LAJIT_AUTOTUNE_OFF);
        ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
        lajit_ctx_destroy(ctx);
        lj_problem q = p;
        q.has_initial = q.has_final = 1;
        q.vk = vk;
        lj_dense_buffers b = {u.q, u.k, u.v, u.o, u.s, s0, sn, 0, 0, 0, 0, 0, 0};
        la_params dense;
        lj_params_dense(&q, &b, 0.25f, &dense);
        expect_same_params(&lj_fake_launch_get(lj_fake_launch_count() - 1)->params, &dense);
    }
    ASSERT_EQ(drv->cuCtxSetCurrent(u.cuctx), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemFree(s0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemFree(sn), CUDA_SUCCESS);
    toy_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(dense_params_match_decode)
{
    require_nvrtc();
    lj_fake_driver_reset();
    const lj_driver *drv = lj_fake_driver();
    CUcontext cuctx;
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&cuctx, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(cuctx), CUDA_SUCCESS);
    enum { B = 3, H = 2, D = 32, E = 48 };
    for (int T = 1; T <= 2; T++) {
        for (int vk = 0; vk < 2; vk++) {
            lj_problem p;
            memset(&p, 0, sizeof p);
            p.op = LJ_OP_DECODE;
            p.dtype = LJ_F16;
            p.B = B;
            p.H = H;
            p.N = T;
            p.T = T;
            p.D = D;
            p.E = E;
            p.decay = 1;
            p.vk = vk;
            p.step_states = T == 2;
            p.has_initial = p.has_final = 1;
            lj_dense_layout l;
            lj_env env;
            lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
            ASSERT_OK(lj_dense_layout_of(&env, &p, &l));
            CUdeviceptr q, k, v, o, s, st, ss = 0;
            ASSERT_EQ(drv->cuMemAlloc(&q, l.q), CUDA_SUCCESS);
            ASSERT_EQ(drv->cuMemAlloc(&k, l.k), CUDA_SUCCESS);
            ASSERT_EQ(drv->cuMemAlloc(&v, l.v), CUDA_SUCCESS);
            ASSERT_EQ(drv->cuMemAlloc(&o, l.o), CUDA_SUCCESS);
            ASSERT_EQ(drv->cuMemAlloc(&s, l.s), CUDA_SUCCESS);
            ASSERT_EQ(drv->cuMemAlloc(&st, l.s0), CUDA_SUCCESS);
            if (l.step_states)
                ASSERT_EQ(drv->cuMemAlloc(&ss, l.step_states), CUDA_SUCCESS);
            int64_t q4[4] = {B, T, H, D}, v4[4] = {B, T, H, E}, q3[3] = {B, H, D},
                    v3[3] = {B, H, E};
            int64_t sh[1] = {H}, pool[4] = {B, H, vk ? E : D, vk ? D : E};
            int64_t steps[5] = {B, T, H, vk ? E : D, vk ? D : E};
            int nd = T == 1 ? 3 : 4;
            DLTensor tq = toy_tensor(q, nd, nd == 4 ? q4 : q3, kDLFloat, 16),
                     tk = toy_tensor(k, nd, nd == 4 ? q4 : q3, kDLFloat, 16),
                     tv = toy_tensor(v, nd, nd == 4 ? v4 : v3, kDLFloat, 16),
                     to = toy_tensor(o, nd, nd == 4 ? v4 : v3, kDLFloat, 16),
                     ts = toy_tensor(s, 1, sh, kDLFloat, 32),
                     tst = toy_tensor(st, 4, pool, kDLFloat, 32),
                     tss = toy_tensor(ss, 5, steps, kDLFloat, 32);
            lajit_attn_decode_args a;
            memset(&a, 0, sizeof a);
            a.struct_size = sizeof a;
            a.q = &tq;
            a.k = &tk;
            a.v = &tv;
            a.o = &to;
            a.s = &ts;
            a.scale = 0.5f;
            a.state = &tst;
            a.step_states = ss ? &tss : NULL;
            a.flags = vk ? LAJIT_STATE_VK : 0;
            lajit_ctx *ctx = fake_ctx(LAJIT_AUTOTUNE_OFF);
            ASSERT_OK(lajit_attn_decode(ctx, &a));
            lajit_ctx_destroy(ctx);
            lj_dense_buffers b = {q, k, v, o, s, st, st, ss, 0, 0, 0, 0, 0};
            la_params dense;
            lj_params_dense(&p, &b, 0.5f, &dense);
            expect_same_params(&lj_fake_launch_get(lj_fake_launch_count() - 1)->params, &dense);
            ASSERT_EQ(drv->cuCtxSetCurrent(cuctx), CUDA_SUCCESS);
            CUdeviceptr all[] = {q, k, v, o, s, st, ss};
            for (int i = 0; i < 7; i++)
                if (all[i])
                    ASSERT_EQ(drv->cuMemFree(all[i]), CUDA_SUCCESS);
        }
    }
    ASSERT_EQ(drv->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* ---- The CLI's database commands ------------------------------------------------------------ */

LJ_TEST(cli_db_show_export_import)
{
    const char *bin = getenv("LAJIT_TEST_BINARY_DIR");
    if (!bin)
        lj_test_skip("LAJIT_TEST_BINARY_DIR not set");
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, getenv("LAJIT_CACHE_DIR"), &db));
    lj_tune_id id;
    memset(&id, 0, sizeof id);
    snprintf(id.fp.name, sizeof id.fp.name, "NVIDIA H200");
    id.fp.cc = 90;
    snprintf(id.family, sizeof id.family, "la_fwd");
    snprintf(id.template_hash, sizeof id.template_hash, "00000000deadbeef");
    snprintf(id.bucket, sizeof id.bucket, "bf16 D128");
    lj_tune_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.config, sizeof r.config, "BLOCK=64");
    r.ms = 0.75;
    ASSERT_OK(lj_tunedb_record(db, &id, &r, 1, "BLOCK=128", 1.5));
    lj_tunedb_close(db);
    char cmd[4096], file[1024];
    snprintf(file, sizeof file, "%s/shared.jsonl", lj_test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s/tools/lajit' db show | grep -q 'BLOCK=64'", bin);
    ASSERT_EQ(system(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "'%s/tools/lajit' db export '%s' >/dev/null && grep -c winner '%s' "
             "| grep -qx 1",
             bin, file, file);
    ASSERT_EQ(system(cmd), 0);
    /* Into another cache directory: no GPU here, so only --force imports. */
    snprintf(cmd, sizeof cmd,
             "LAJIT_DRIVER_PATH=/nonexistent LAJIT_CACHE_DIR='%s/other' "
             "'%s/tools/lajit' db import '%s' >/dev/null 2>&1",
             lj_test_tmpdir(), bin, file);
    ASSERT_NE(system(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "LAJIT_DRIVER_PATH=/nonexistent LAJIT_CACHE_DIR='%s/other' "
             "'%s/tools/lajit' db import '%s' --force >/dev/null && LAJIT_CACHE_DIR='%s/other' "
             "'%s/tools/lajit' db show | grep -q 'BLOCK=64'",
             lj_test_tmpdir(), bin, file, lj_test_tmpdir(), bin);
    ASSERT_EQ(system(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "'%s/tools/lajit' db --help | grep -q export && "
             "'%s/tools/lajit' tune --help | grep -q family",
             bin, bin);
    ASSERT_EQ(system(cmd), 0);
}
