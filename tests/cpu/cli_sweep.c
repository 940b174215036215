/* cli_sweep.c — the `lajit` command run with one heap allocation failing, site after site.
 *
 * The library has no way to inject faults into a process from outside (its fault injection is
 * a field of a context's lj_env), so the command runs under tests/support/failmalloc, an
 * LD_PRELOAD shim that fails the N-th malloc, calloc or realloc of the process. A first run
 * counts the allocations (those made inside NVRTC are left alone: its out-of-memory handling is
 * NVIDIA's, whether NVRTC calls malloc itself or through the C library); then allocations are
 * failed one per run, every one or an even sample of them (the count printed says which;
 * LAJIT_SWEEP_ALL=1 injects every site, LAJIT_SWEEP_SAMPLE=N an even sample of N). Each run must end by itself (60 s) with an exit status, never a
 * signal; a status other than 0 must be 1 with a "lajit: ..." message; a sanitizer report
 * (ASan build: leaks included) fails the case; and what the command leaves must be whole:
 * expand and db show print the reference text or fail, gen writes the whole bundle or nothing,
 * db export the whole file or fails, and a failed db import leaves the database empty (it
 * imports in one transaction). */
#include "test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "context.h"
#include "problem.h"
#include "search.h"
#include "tunedb.h"

#define RUN_LIMIT_S    60
#define SANITIZER_EXIT 86

/* The sanitizer build runs the command 5-10 times slower: there each sweep injects at most this
 * many sites, evenly sampled (LAJIT_SWEEP_ALL=1 still injects all). */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZER_CAP 80
#else
#define SANITIZER_CAP 0
#endif

typedef struct run_out {
    int exited, code, signal, hung;
    int fired;                /* the shim injected its failure */
    unsigned long long calls; /* allocations the shim counted */
    char out[65536], err[16384];
} run_out;

static char *read_file(const char *path, char *buf, size_t cap)
{
    buf[0] = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Runs `lajit ARGS` (split at spaces; no argument holds one) with allocation `at` failing (0:
 * none; -1: no shim at all). */
static void run_lajit(const char *args, long long at, run_out *r)
{
    const char *bin = getenv("LAJIT_TEST_BINARY_DIR");
    ASSERT_TRUE(bin != NULL);
    char exe[1024], shim[1024], outp[1024], errp[1024], rep[1024], atbuf[32];
    snprintf(exe, sizeof exe, "%s/tools/lajit", bin);
    snprintf(shim, sizeof shim, "%s/tests/liblj_failmalloc.so", bin);
    ASSERT_TRUE(exists(shim));
    snprintf(outp, sizeof outp, "%s/run.out", lj_test_tmpdir());
    snprintf(errp, sizeof errp, "%s/run.err", lj_test_tmpdir());
    snprintf(rep, sizeof rep, "%s/run.report", lj_test_tmpdir());
    snprintf(atbuf, sizeof atbuf, "%lld", at > 0 ? at : 0);
    unlink(rep);
    /* The shim's first backtrace, before it counts anything, loads the unwinder with dlopen;
     * what the dynamic loader keeps of that is not lajit's and is not a leak to report. */
    char supp[1024], lsan[1200];
    snprintf(supp, sizeof supp, "%s/lsan.supp", lj_test_tmpdir());
    FILE *sf = fopen(supp, "w");
    ASSERT_TRUE(sf != NULL);
    fputs("leak:_dl_map_object_deps\n", sf);
    fclose(sf);
    snprintf(lsan, sizeof lsan, "suppressions=%s:print_suppressions=0", supp);
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", args);
    char *argv[64];
    int argc = 0;
    argv[argc++] = exe;
    for (char *tok = strtok(copy, " "); tok && argc < 63; tok = strtok(NULL, " "))
        argv[argc++] = tok;
    argv[argc] = NULL;

    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        int o = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
            _exit(127);
        if (at >= 0) {
            setenv("LD_PRELOAD", shim, 1);
            setenv("LJ_FAILMALLOC_AT", atbuf, 1);
            setenv("LJ_FAILMALLOC_SKIP", "nvrtc", 1);
            setenv("LJ_FAILMALLOC_REPORT", rep, 1);
        }
        /* In the sanitizer build: the shim goes ahead of ASan's runtime, and any report makes
         * an exit status of its own. */
        setenv("ASAN_OPTIONS", "verify_asan_link_order=0:exitcode=86:detect_leaks=1", 1);
        setenv("UBSAN_OPTIONS", "exitcode=86:print_stacktrace=1", 1);
        setenv("LSAN_OPTIONS", lsan, 1);
        execv(exe, argv);
        _exit(127);
    }
    memset(r, 0, sizeof *r);
    struct timespec t0, now, nap = {0, 2000000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int status = 0;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        ASSERT_TRUE(w >= 0);
        if (w == pid)
            break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > RUN_LIMIT_S) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            r->hung = 1;
            break;
        }
        nanosleep(&nap, NULL);
    }
    r->exited = WIFEXITED(status);
    r->code = r->exited ? WEXITSTATUS(status) : -1;
    r->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    read_file(outp, r->out, sizeof r->out);
    read_file(errp, r->err, sizeof r->err);
    char line[128];
    if (at >= 0 && read_file(rep, line, sizeof line))
        sscanf(line, "%llu %d", &r->calls, &r->fired);
}

/* What a command must leave: a check run after each injected failure (rc: its exit status). */
typedef void (*after_fn)(const run_out *r, long long site, void *user);

typedef struct cli_case {
    const char *name;
    const char *args;
    int compare_stdout; /* a successful run prints exactly the reference output */
    /* A known bug, pending its fix, that the sweep counts instead of failing on (NULL: none);
     * its own case below reproduces it and skips until it is fixed. */
    int (*pending)(const struct run_out *r);
    after_fn after;
    void *user;
    int max_injections; /* 0: every site; else at most this many, evenly sampled */
} cli_case;

/* In the sanitizer build, a thread's start runs ASan's own code, which calls
 * pthread_getattr_np (it allocates) and aborts with "CHECK failed" when that fails: the shim
 * failed an allocation of the sanitizer's runtime, not one of lajit's. Such a site cannot be
 * checked there (the plain build checks it). */
static int asan_runtime_site(const run_out *r)
{
    return strstr(r->err, "AddressSanitizer: CHECK failed") != NULL &&
           strstr(r->err, "pthread_getattr_np") != NULL;
}

static void fail_run(const cli_case *c, long long site, const run_out *r, const char *why)
{
    lj_test_fail(__FILE__, __LINE__,
                 "lajit %s, allocation %lld failing: %s (exit %d, signal %d)\n--- stderr:\n%.4000s"
                 "\n--- stdout (end):\n%.2000s",
                 c->args, site, why, r->code, r->signal, r->err,
                 r->out + (strlen(r->out) > 2000 ? strlen(r->out) - 2000 : 0));
}

static void sweep_cli(const cli_case *c)
{
    static run_out ref, r;
    run_lajit(c->args, -1, &ref); /* warms the cache (compiles) and must succeed */
    if (ref.code != 0)
        fail_run(c, -1, &ref, "the command fails without injection");
    if (c->after)
        c->after(&ref, 0, c->user);
    run_lajit(c->args, 0, &ref); /* counts */
    if (!ref.exited || ref.code != 0 || ref.calls == 0)
        fail_run(c, 0, &ref, "the command fails under the shim without injection");
    if (c->after)
        c->after(&ref, 0, c->user);
    unsigned long long sites = ref.calls, count = sites;
    const char *all = getenv("LAJIT_SWEEP_ALL");
    int cap = c->max_injections;
    if (SANITIZER_CAP && (cap == 0 || cap > SANITIZER_CAP))
        cap = SANITIZER_CAP;
    const char *sample = getenv("LAJIT_SWEEP_SAMPLE"); /* by hand: a larger (or smaller) sample */
    if (sample && atoi(sample) > 1)
        cap = atoi(sample);
    int sampled = !(all && *all == '1') && cap > 1 && sites > (unsigned long long)cap;
    if (sampled)
        count = (unsigned long long)cap;
    int errors = 0, recovered = 0, pending = 0, runtime = 0;
    for (unsigned long long j = 0; j < count; j++) {
        long long n = (long long)(sampled ? 1 + j * (sites - 1) / (count - 1) : j + 1);
        run_lajit(c->args, n, &r);
        if (c->pending && c->pending(&r)) {
            pending++;
            continue;
        }
        if (asan_runtime_site(&r)) {
            runtime++;
            continue;
        }
        if (r.hung)
            fail_run(c, n, &r, "no exit within the time limit (a hang)");
        if (!r.exited)
            fail_run(c, n, &r, "killed by a signal (a crash)");
        if (r.code == SANITIZER_EXIT || strstr(r.err, "Sanitizer"))
            fail_run(c, n, &r, "a sanitizer report");
        if (!r.fired)
            fail_run(c, n, &r, "the site was not reached (allocation counts vary between runs)");
        if (r.code == 0) {
            recovered++;
            if (c->compare_stdout && strcmp(r.out, ref.out) != 0)
                fail_run(c, n, &r, "success with an output that differs from the reference");
        } else {
            errors++;
            if (r.code != 1)
                fail_run(c, n, &r, "an exit status other than 1");
            if (!strstr(r.err, "lajit: "))
                fail_run(c, n, &r, "no \"lajit: ...\" message on stderr");
        }
        if (c->after)
            c->after(&r, n, c->user);
    }
    printf("lajit %s: %llu allocation sites, %llu failures injected%s: %d exited 1 with a message, "
           "%d succeeded unharmed, %d showed the known bug pending its fix, %d hit ASan's own "
           "thread start (not checked); no crash, hang or sanitizer report\n",
           c->args, sites, count, sampled ? " (evenly sampled)" : "", errors, recovered, pending,
           runtime);
    ASSERT_TRUE(errors > 0);
}

LJ_TEST(expand)
{
    cli_case c = {"expand", "expand la_recurrent --arch sm_80 -p D=64 -p E=64", 1, NULL, NULL, NULL,
                  0};
    sweep_cli(&c);
}

/* The kernel cache is warm after the first run: the sweep runs the cache path. */
LJ_TEST(compile)
{
    cli_case c = {
        "compile", "compile la_recurrent --arch sm_80 -p D=64 -p E=64 -j 1", 0, NULL, NULL, NULL,
        150};
    sweep_cli(&c);
}

/* gen writes the whole bundle or nothing at all (no temporary file either). */
typedef struct gen_paths {
    char dir[1024], bundle[1100];
} gen_paths;

static void gen_after(const run_out *r, long long site, void *user)
{
    gen_paths *g = user;
    if (r->code == 0) {
        if (!exists(g->bundle))
            lj_test_fail(__FILE__, __LINE__, "gen, allocation %lld failing: exit 0, no bundle",
                         site);
        ASSERT_EQ(unlink(g->bundle), 0);
    }
    DIR *d = opendir(g->dir);
    ASSERT_TRUE(d != NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            lj_test_fail(__FILE__, __LINE__,
                         "gen, allocation %lld failing (exit %d): %s left behind", site, r->code,
                         e->d_name);
    closedir(d);
}

LJ_TEST(gen)
{
    static gen_paths g;
    snprintf(g.dir, sizeof g.dir, "%s/out", lj_test_tmpdir());
    ASSERT_EQ(mkdir(g.dir, 0700), 0);
    snprintf(g.bundle, sizeof g.bundle, "%s/x.bundle", g.dir);
    char args[2048];
    snprintf(args, sizeof args,
             "gen --family la_recurrent --arch sm_80 -p dtype=f32 -p D=64 -p E=64 -j 1 -o %s",
             g.bundle);
    /* Each run compiles a cubin and a PTX (about half a second): a small sample. */
    cli_case c = {"gen", args, 0, NULL, gen_after, &g, 12};
    sweep_cli(&c);
}

/* ---- The tuning database -------------------------------------------------------------------- */

/* A tuning database in dir with two winners (la_recurrent, two buckets, an A100 fingerprint). */
static void make_tunedb(const char *dir)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DEVICE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lj_env *env = lajit__ctx_env(ctx);
    lj_family *f;
    ASSERT_OK(lajit__ctx_family(ctx, "la_recurrent", &f));
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(env, dir, &db));
    for (int i = 0; i < 2; i++) {
        lj_tune_id id;
        memset(&id, 0, sizeof id);
        snprintf(id.fp.name, sizeof id.fp.name, "NVIDIA A100-SXM4-80GB");
        id.fp.cc = 80;
        id.fp.sms = 108;
        id.fp.driver = 12040;
        snprintf(id.family, sizeof id.family, "la_recurrent");
        ASSERT_OK(lj_tune_template_hash(env, f, id.template_hash));
        snprintf(id.bucket, sizeof id.bucket, "bucket_%d", i);
        lj_tune_result r[2];
        memset(r, 0, sizeof r);
        snprintf(r[0].config, sizeof r[0].config, "TILE_V=32 WARPS=2");
        r[0].ms = 0.25 + i;
        snprintf(r[1].config, sizeof r[1].config, "TILE_V=16 WARPS=4");
        r[1].ms = -1;
        snprintf(r[1].failure, sizeof r[1].failure, "CUDA_ERROR_ILLEGAL_ADDRESS");
        ASSERT_OK(lj_tunedb_record(db, &id, r, 2, "TILE_V=16 WARPS=4", -1));
    }
    lj_tunedb_close(db);
    lajit_ctx_destroy(ctx);
}

/* The bug this sweep found (tools/cmd_db.c, database_exists): when the malloc of the database's
 * path failed, `lajit db show` printed "lajit: out of memory", took the database for absent and
 * exited 0 with no winner listed — a failure that claimed success. */
static int show_oom_exit_0(const run_out *r)
{
    return r->code == 0 && strstr(r->err, "out of memory") != NULL && r->out[0] == 0;
}

LJ_TEST(db_show)
{
    make_tunedb(getenv("LAJIT_CACHE_DIR"));
    cli_case c = {"db show", "db show", 1, NULL, NULL, NULL, 300};
    sweep_cli(&c);
}

/* That bug on its own: the first allocations of `db show` failing one by one, each must either
 * fail with status 1 or print the whole reference. */
LJ_TEST(db_show_oom_is_not_success)
{
    make_tunedb(getenv("LAJIT_CACHE_DIR"));
    static run_out ref, r;
    run_lajit("db show", 0, &ref);
    ASSERT_EQ(ref.code, 0);
    for (long long n = 1; n <= 40 && n <= (long long)ref.calls; n++) {
        run_lajit("db show", n, &r);
        ASSERT_TRUE(r.exited);
        ASSERT_TRUE(!show_oom_exit_0(&r));
        if (r.code == 0)
            ASSERT_STREQ(r.out, ref.out);
        else
            ASSERT_EQ(r.code, 1);
    }
}

/* export writes the whole file or fails. */
typedef struct export_paths {
    char file[1024];
    char ref[65536], got[65536];
    int have_ref;
} export_paths;

static void export_after(const run_out *r, long long site, void *user)
{
    export_paths *x = user;
    if (!x->have_ref) {
        ASSERT_TRUE(read_file(x->file, x->ref, sizeof x->ref) != NULL);
        ASSERT_TRUE(strstr(x->ref, "bucket_1") != NULL);
        x->have_ref = 1;
    } else if (r->code == 0) {
        ASSERT_TRUE(read_file(x->file, x->got, sizeof x->got) != NULL);
        if (strcmp(x->got, x->ref) != 0)
            lj_test_fail(__FILE__, __LINE__,
                         "db export, allocation %lld failing: exit 0 with a "
                         "different file:\n%s",
                         site, x->got);
    }
    unlink(x->file);
}

LJ_TEST(db_export)
{
    make_tunedb(getenv("LAJIT_CACHE_DIR"));
    static export_paths x;
    snprintf(x.file, sizeof x.file, "%s/export.jsonl", lj_test_tmpdir());
    char args[2048];
    snprintf(args, sizeof args, "db export %s", x.file);
    cli_case c = {"db export", args, 0, NULL, export_after, &x, 300};
    sweep_cli(&c);
}

/* import imports everything or nothing: each run starts from an empty cache directory, and
 * after a failure `db show` (no injection) lists no winner. */
typedef struct import_paths {
    char cache[1024];
} import_paths;

static void import_after(const run_out *r, long long site, void *user)
{
    import_paths *x = user;
    static run_out show;
    run_lajit("db show", -1, &show);
    ASSERT_EQ(show.code, 0);
    int rows = strstr(show.out, "bucket_0") != NULL && strstr(show.out, "bucket_1") != NULL;
    int none = strstr(show.out, "bucket_") == NULL;
    if (r->code == 0 && !rows)
        lj_test_fail(__FILE__, __LINE__,
                     "db import, allocation %lld failing: exit 0 but the "
                     "database holds:\n%s",
                     site, show.out);
    if (r->code != 0 && !none)
        lj_test_fail(__FILE__, __LINE__,
                     "db import, allocation %lld failing: exit %d but part "
                     "was imported:\n%s",
                     site, r->code, show.out);
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", x->cache);
    ASSERT_EQ(system(cmd), 0);
}

LJ_TEST(db_import)
{
    /* The file to import: an export of a database made elsewhere. */
    char src[1024], file[1100], args[2048];
    snprintf(src, sizeof src, "%s/src", lj_test_tmpdir());
    make_tunedb(src);
    snprintf(file, sizeof file, "%s/rows.jsonl", lj_test_tmpdir());
    setenv("LAJIT_CACHE_DIR", src, 1);
    run_out *r = malloc(sizeof *r);
    ASSERT_TRUE(r != NULL);
    snprintf(args, sizeof args, "db export %s", file);
    run_lajit(args, -1, r);
    ASSERT_EQ(r->code, 0);
    free(r);
    static import_paths x;
    snprintf(x.cache, sizeof x.cache, "%s/dst", lj_test_tmpdir());
    setenv("LAJIT_CACHE_DIR", x.cache, 1);
    snprintf(args, sizeof args, "db import %s --force", file);
    cli_case c = {"db import", args, 0, NULL, import_after, &x, 100};
    sweep_cli(&c);
}
