/* tune_sweep.c — allocation-failure sweeps of the tuner and of bundle generation, on the test
 * family "toy" (tests/data/templates) so that candidates compile quickly.
 *
 * - The eager autotune policy's first call through the fake driver (tests/support/op_sweep.h):
 *   six candidates compiled and timed in the tuner's private context, one of which faults. Tuning
 *   never fails an op, so a failure inside the search leaves the default configuration in use:
 *   the op must succeed with either the tuned or the default launch, or fail with
 *   LAJIT_ERR_OUT_OF_MEMORY and succeed when called again; afterwards a fresh context must tune
 *   to the same winner (no lease left held, no half-written database).
 * - lj_gen_write (autotune/gen.h) with a tuning database holding a winner: each failure must be
 *   LAJIT_ERR_OUT_OF_MEMORY with a message, leave no bundle and no temporary file behind and no
 *   NVRTC program alive, and the same write in the same context must then produce the reference
 *   bundle (the same kernels reported).
 * - The first call served by a bundle (lajit_ctx_desc.bundle) in a process without NVRTC: the
 *   op's allocations through the env, and the context's creation, which opens and checks the
 *   bundle, through a caller's allocator (lajit_ctx_desc.alloc) that fails its n-th call. */
#include "test.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache_helpers.h"
#include "context.h"
#include "gen.h"
#include "op_sweep.h"
#include "problem.h"
#include "search.h"

static void use_test_templates(void)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/data/templates", lj_test_source_dir());
    setenv("LAJIT_TEMPLATE_DIR", dir, 1);
}

/* ---- The eager tuner ------------------------------------------------------------------------ */

/* The toy family's time model (as in autotune.c): more unrolling and more warps are faster, and
 * UNROLL=4 WARPS=2 (block 64, 4 KiB of shared memory), which would win, faults. */
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

static void build_toy(sweep_fixture *x)
{
    lj_fake_driver_set_kernel_time(toy_time, NULL);
    lj_fake_driver_fault_launches(toy_faults, NULL, CUDA_ERROR_ILLEGAL_ADDRESS);
    int64_t qs[4] = {2, 3, 100, 32}, vs[4] = {2, 3, 100, 16}, hs[1] = {3};
    DLDataType bf = lj_test_dl_dtype(LJ_BF16);
    lajit_attn_fwd_args *a = &x->fwd;
    memset(a, 0, sizeof *a);
    a->struct_size = sizeof *a;
    a->q = sweep_buffer(x, 4, qs, bf);
    a->k = sweep_buffer(x, 4, qs, bf);
    a->v = sweep_buffer(x, 4, vs, bf);
    a->o = sweep_buffer(x, 4, vs, bf);
    a->s = sweep_buffer(x, 1, hs, lj_test_dl_dtype(LJ_F32));
    a->scale = 1.0f;
    a->family = "toy";
}

static lajit_status call_fwd(lajit_ctx *ctx, sweep_fixture *x)
{
    return lajit_attn_fwd(ctx, &x->fwd);
}

/* Every iteration tunes from scratch: the database goes, the kernel cache stays. */
static void remove_tunedb(void)
{
    static const char *const names[] = {"tune.db", "tune.db-wal", "tune.db-shm", "tune.db-journal"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", getenv("LAJIT_CACHE_DIR"), names[i]);
        unlink(path);
    }
}

/* After a failure: a fresh eager context, with the database the failed call left, must end on
 * the tuned winner. */
static void retune_after(const sweep_case *c, const sweep_launch *ref, int n_ref)
{
    sweep_expect(c, ref, n_ref, "a fresh context after the failure");
}

LJ_TEST(eager_tuner)
{
    sweep_require_nvrtc();
    use_test_templates();
    sweep_launch dflt[SWEEP_MAX_LAUNCHES], tuned[SWEEP_MAX_LAUNCHES];
    int n_dflt, n_tuned;
    sweep_case off = {
        .name = "toy, autotune off", .build = build_toy, .call = call_fwd, .before = remove_tunedb};
    sweep_reference(&off, dflt, &n_dflt);
    sweep_case c = {.name = "eager tuner (toy: 6 candidates, one faults)",
                    .build = build_toy,
                    .call = call_fwd,
                    .autotune = LAJIT_AUTOTUNE_EAGER,
                    .before = remove_tunedb,
                    .alt = dflt,
                    .n_alt = n_dflt,
                    .after = retune_after,
                    .max_injections = 100};
    sweep_reference(&c, tuned, &n_tuned);
    /* The sweep means something only if tuning changes the launch. */
    ASSERT_TRUE(n_tuned == 1 && n_dflt == 1 && memcmp(&tuned[0], &dflt[0], sizeof tuned[0]) != 0);
    sweep_result r;
    sweep_run(&c, &r);
}

/* ---- Bundle generation ---------------------------------------------------------------------- */

#define MAX_EVENTS 8

typedef struct gen_log {
    int n;
    char line[MAX_EVENTS][512];
} gen_log;

static void log_event(void *user, const lj_gen_event *ev)
{
    gen_log *g = user;
    ASSERT_TRUE(g->n < MAX_EVENTS);
    snprintf(g->line[g->n++], sizeof g->line[0], "%s %s %s [%s] %s ptx=%d tuned=%d %zu", ev->family,
             ev->arch, ev->problem, ev->config, ev->skipped ? ev->skipped : "-", ev->ptx, ev->tuned,
             ev->size);
}

static lajit_status load_family(void *user, const char *name, lj_family **out)
{
    return lajit__ctx_family(user, name, out);
}

static const char *const gen_families[] = {"toy"};
static const char *const gen_archs[] = {"sm_80"};
static const char *const gen_assign[] = {"dtype=bf16", "D=32", "E=16"};

/* A tuning database in dir whose winner for the toy bucket on compute capability 8.0 is
 * UNROLL=2 WARPS=2 (the default there is UNROLL=4 WARPS=1). */
static void make_tunedb(const char *dir)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DEVICE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lj_env *env = lajit__ctx_env(ctx);
    lj_family *f;
    ASSERT_OK(lajit__ctx_family(ctx, "toy", &f));
    lj_device_info dev;
    ASSERT_TRUE(lj_device_info_for_arch("sm_80", &dev));
    lj_problem *problems;
    int n_problems;
    ASSERT_OK(lj_family_problems(f, &problems, &n_problems));
    lj_problem p = problems[0];
    lj_free(env, problems);
    lj_config dflt;
    ASSERT_OK(lj_assign_all(env, f, gen_assign, 3, &dev, &p, &dflt));
    lj_tune_id id;
    memset(&id, 0, sizeof id);
    snprintf(id.fp.name, sizeof id.fp.name, "NVIDIA A100");
    id.fp.cc = 80;
    snprintf(id.family, sizeof id.family, "toy");
    ASSERT_OK(lj_tune_template_hash(env, f, id.template_hash));
    ASSERT_OK(lj_family_key(f, &p, id.bucket, sizeof id.bucket));
    lj_tune_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.config, sizeof r.config, "UNROLL=2 WARPS=2");
    r.ms = 0.5;
    char dtext[256];
    lj_config_format(&dflt, dtext, sizeof dtext);
    ASSERT_STREQ(dtext, "UNROLL=4 WARPS=1");
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(env, dir, &db));
    ASSERT_OK(lj_tunedb_record(db, &id, &r, 1, dtext, 1.0));
    lj_tunedb_close(db);
    lajit_ctx_destroy(ctx);
}

/* Entries of dir other than "." and "..". */
static int dir_entries(const char *dir, char *first, size_t cap)
{
    DIR *d = opendir(dir);
    ASSERT_TRUE(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (n++ == 0)
            snprintf(first, cap, "%s", e->d_name);
    }
    closedir(d);
    return n;
}

typedef struct gen_setup {
    char outdir[1024], out[1100], db[1100];
    lj_gen_opts o;
} gen_setup;

/* Lua (as `lajit gen` opens it) then the write, reporting into g. */
static lajit_status gen_call(lajit_ctx *ctx, gen_setup *s, gen_log *g)
{
    memset(g, 0, sizeof *g);
    s->o.report_user = g;
    lj_lua *L;
    lj_gen_summary sum;
    lajit_status st = lajit__ctx_lua(ctx, &L);
    if (st == LAJIT_OK)
        st = lj_gen_write(lajit__ctx_env(ctx), L, load_family, ctx, &s->o, s->out, &sum);
    if (st == LAJIT_OK) {
        ASSERT_EQ(sum.cubins, 1);
        ASSERT_EQ(sum.ptxs, 1);
        ASSERT_EQ(sum.tuned, 1);
    }
    return st;
}

static int same_log(const gen_log *a, const gen_log *b)
{
    if (a->n != b->n)
        return 0;
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->line[i], b->line[i]) != 0)
            return 0;
    return 1;
}

/* One write with allocation n failing (0: none), checked against ref; returns the allocations
 * the write made. */
static uint64_t gen_iterate(gen_setup *s, uint64_t n, const gen_log *ref, gen_log *got,
                            lajit_status *status)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DEVICE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lj_env *env = lajit__ctx_env(ctx);
    uint64_t base = env->fault_count[LJ_FAULT_ALLOC];
    env->fault_at[LJ_FAULT_ALLOC] = n ? base + n : 0;
    lajit_status st = gen_call(ctx, s, got);
    uint64_t used = env->fault_count[LJ_FAULT_ALLOC] - base;
    env->fault_at[LJ_FAULT_ALLOC] = 0;
    *status = st;
    if (n) {
        if (used < n)
            lj_test_fail(__FILE__, __LINE__, "gen: %llu allocations, the reference %llu",
                         (unsigned long long)used, (unsigned long long)n);
        if (st != LAJIT_OK) {
            char first[256] = "";
            if (lajit_errmsg(ctx)[0] == 0 || st != LAJIT_ERR_OUT_OF_MEMORY)
                lj_test_fail(__FILE__, __LINE__, "gen: allocation %llu failed: %s (%s)",
                             (unsigned long long)n, lajit_status_string(st), lajit_errmsg(ctx));
            if (dir_entries(s->outdir, first, sizeof first) != 0)
                lj_test_fail(__FILE__, __LINE__, "gen: allocation %llu failed: %s left behind",
                             (unsigned long long)n, first);
            if (lj_nvrtc_live_programs() != 0)
                lj_test_fail(__FILE__, __LINE__,
                             "gen: allocation %llu failed: %ld NVRTC programs "
                             "alive",
                             (unsigned long long)n, lj_nvrtc_live_programs());
            lajit_status again = gen_call(ctx, s, got);
            if (again != LAJIT_OK)
                lj_test_fail(__FILE__, __LINE__,
                             "gen: after allocation %llu failed, the same "
                             "write failed: %s: %s",
                             (unsigned long long)n, lajit_status_string(again), lajit_errmsg(ctx));
        }
        if (!same_log(got, ref))
            lj_test_fail(__FILE__, __LINE__,
                         "gen: allocation %llu failed (%s): the bundle's "
                         "kernels differ from the reference",
                         (unsigned long long)n, lajit_status_string(st));
    }
    lajit_ctx_destroy(ctx);
    ASSERT_EQ(lj_nvrtc_live_programs(), 0);
    if (*status == LAJIT_OK || n)
        ASSERT_EQ(unlink(s->out), 0);
    return used;
}

LJ_TEST(gen_write)
{
    sweep_require_nvrtc();
    use_test_templates();
    gen_setup s;
    memset(&s, 0, sizeof s);
    char dbdir[1024];
    snprintf(dbdir, sizeof dbdir, "%s/db", lj_test_tmpdir());
    make_tunedb(dbdir);
    snprintf(s.db, sizeof s.db, "%s/tune.db", dbdir);
    snprintf(s.outdir, sizeof s.outdir, "%s/out", lj_test_tmpdir());
    ASSERT_EQ(mkdir(s.outdir, 0700), 0);
    snprintf(s.out, sizeof s.out, "%s/toy.bundle", s.outdir);
    s.o.families = gen_families;
    s.o.n_families = 1;
    s.o.archs = gen_archs;
    s.o.n_archs = 1;
    s.o.assign = gen_assign;
    s.o.n_assign = 3;
    s.o.db_path = s.db;
    s.o.jobs = 1;
    s.o.report = log_event;

    gen_log ref, got;
    lajit_status st;
    uint64_t sites = gen_iterate(&s, 0, NULL, &ref, &st);
    ASSERT_OK(st);
    ASSERT_EQ(ref.n, 2); /* the tuned winner's cubin and its PTX */
    ASSERT_CONTAINS(ref.line[0], "UNROLL=2 WARPS=2");
    ASSERT_CONTAINS(ref.line[0], "tuned=1");
    /* Each write compiles twice and a failed one is written again (0.1 s a compile), so the
     * sites are sampled evenly unless LAJIT_SWEEP_ALL=1. */
    const char *all = getenv("LAJIT_SWEEP_ALL");
    uint64_t count = all && *all == '1' ? sites : 40;
    if (count > sites)
        count = sites;
    int errors = 0, recovered = 0;
    for (uint64_t j = 0; j < count; j++) {
        uint64_t n = count == sites ? j + 1 : 1 + j * (sites - 1) / (count - 1);
        gen_iterate(&s, n, &ref, &got, &st);
        if (st == LAJIT_OK)
            recovered++;
        else
            errors++;
    }
    printf("gen (toy, sm_80, cubin + PTX, tuned): %llu allocation sites, %llu failures injected%s: "
           "%d ended in out of memory, %d recovered; every one clean\n",
           (unsigned long long)sites, (unsigned long long)count,
           count < sites ? " (evenly sampled)" : "", errors, recovered);
    ASSERT_TRUE(errors > 0);
}

/* ---- A bundle serving the first call ---------------------------------------------------------- */

/* Writes path with the toy family's kernels for sm_90a (the fake device's arch), in a child
 * process so that this one never loads NVRTC. Skips the case when the child has no NVRTC. */
static void write_toy_bundle(const char *path)
{
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        static const char *const archs[] = {"sm_90a"};
        lajit_ctx_desc desc;
        lajit_ctx_desc_init(&desc);
        desc.flags = LAJIT_CTX_NO_DEVICE;
        lajit_ctx *ctx;
        lj_lua *L;
        lj_gen_opts o;
        memset(&o, 0, sizeof o);
        o.families = gen_families;
        o.n_families = 1;
        o.archs = archs;
        o.n_archs = 1;
        o.jobs = 1;
        lj_gen_summary sum;
        lajit_status st = lajit_ctx_create(&desc, &ctx);
        if (st == LAJIT_OK && (st = lajit__ctx_lua(ctx, &L)) == LAJIT_OK)
            st = lj_gen_write(lajit__ctx_env(ctx), L, load_family, ctx, &o, path, &sum);
        if (st != LAJIT_OK)
            fprintf(stderr, "gen: %s\n", lajit_errmsg(ctx));
        _exit(st == LAJIT_OK ? 0 : st == LAJIT_ERR_NO_COMPILER ? 77 : 1);
    }
    int status;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77)
        lj_test_skip("NVRTC not available to write the bundle");
    ASSERT_EQ(WEXITSTATUS(status), 0);
}

/* The bundle and a process whose NVRTC cannot load: every kernel must come from the bundle. */
static void bundle_only(char *path, size_t cap)
{
    use_test_templates();
    snprintf(path, cap, "%s/toy.bundle", lj_test_tmpdir());
    write_toy_bundle(path);
    setenv("LAJIT_NVRTC_PATH", "/nonexistent/libnvrtc.so", 1);
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    int major, minor;
    ASSERT_STATUS(lj_nvrtc_version(&env, &major, &minor), LAJIT_ERR_NO_COMPILER);
}

static void build_toy_plain(sweep_fixture *x)
{
    build_toy(x);
    lj_fake_driver_set_kernel_time(NULL, NULL);
    lj_fake_driver_fault_launches(NULL, NULL, CUDA_SUCCESS);
}

LJ_TEST(first_call_from_a_bundle)
{
    char path[1024];
    bundle_only(path, sizeof path);
    sweep_case c = {.name = "fwd from a bundle (toy, sm_90a, no NVRTC)",
                    .build = build_toy_plain,
                    .call = call_fwd,
                    .ctx_flags = LAJIT_CTX_NO_DISK_CACHE,
                    .bundle = path};
    sweep_result r;
    sweep_run(&c, &r);
}

/* A caller's allocator that fails its n-th call (counting every call that allocates). */
typedef struct failing_alloc {
    unsigned long long calls, fail_at;
} failing_alloc;

static void *failing_realloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    failing_alloc *a = user;
    (void)old_size;
    if (new_size == 0) {
        free(ptr);
        return NULL;
    }
    if (++a->calls == a->fail_at)
        return NULL;
    return realloc(ptr, new_size);
}

LJ_TEST(ctx_create_with_a_bundle)
{
    char path[1024];
    bundle_only(path, sizeof path);
    unsigned long long sites = 0;
    int errors = 0;
    for (unsigned long long n = 0;; n++) {
        failing_alloc a = {0, n};
        lajit_ctx_desc desc;
        lajit_ctx_desc_init(&desc);
        desc.alloc = failing_realloc;
        desc.alloc_user = &a;
        desc.bundle = path;
        desc.flags = LAJIT_CTX_NO_DISK_CACHE;
        lajit_ctx *ctx = NULL;
        lajit_status st = lajit_ctx_create(&desc, &ctx);
        if (n == 0) {
            ASSERT_OK(st);
            sites = a.calls;
            ASSERT_TRUE(sites > 0);
        } else if (n > sites) {
            ASSERT_OK(st); /* no site left: the context is made */
            lajit_ctx_destroy(ctx);
            break;
        } else if (st != LAJIT_OK) {
            /* No context, no message to read: the status must say what happened. */
            if (st != LAJIT_ERR_OUT_OF_MEMORY)
                lj_test_fail(__FILE__, __LINE__, "allocation %llu of %llu failing: %s", n, sites,
                             lajit_status_string(st));
            ASSERT_TRUE(ctx == NULL);
            errors++;
        }
        lajit_ctx_destroy(ctx);
    }
    printf(
        "lajit_ctx_create with a bundle: %llu allocation sites, %llu failures injected: %d ended "
        "in out of memory, %llu recovered; every one clean\n",
        sites, sites, errors, sites - (unsigned long long)errors);
    ASSERT_TRUE(errors > 0);
}
