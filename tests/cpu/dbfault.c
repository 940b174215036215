/* dbfault.c — fault injection over the tuning database and bundles (autotune/tunedb.h,
 * generator/bundle.h): every SQLite call (LJ_FAULT_SQLITE) and every host allocation
 * (LJ_FAULT_ALLOC) that a whole working session makes is failed in turn, one per run. Each run
 * must end in a clear status with a message (or succeed, where the failure is harmless), leak
 * nothing (the sanitizer build checks at exit), and leave the files usable: the database opens
 * without being set aside and still serves its winner; a bundle at the final path is either the
 * previous complete one or the new complete one, and no temporary file is left. Each sweep
 * prints its counts (sites, failures injected, failures reported, failures absorbed). */
#include "test.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bundle.h"
#include "tunedb.h"

static lj_tune_id make_id(const char *bucket)
{
    lj_tune_id id;
    memset(&id, 0, sizeof id);
    snprintf(id.fp.name, sizeof id.fp.name, "NVIDIA H200");
    id.fp.cc = 90;
    id.fp.sms = 132;
    id.fp.driver = 13000;
    id.fp.nvrtc = 12080;
    snprintf(id.family, sizeof id.family, "la_fwd");
    snprintf(id.template_hash, sizeof id.template_hash, "0123456789abcdef");
    snprintf(id.bucket, sizeof id.bucket, "%s", bucket);
    return id;
}

static void count_shown(void *user, const lj_fingerprint *fp, const char *family,
                        const char *template_hash, const char *bucket, const char *config,
                        double ms, const char *default_config, double default_ms, int measured)
{
    (*(int *)user)++;
}

static char *path_in(const char *name)
{
    static char paths[8][1024];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, sizeof paths[0], "%s/%s", lj_test_tmpdir(), name);
    return p;
}

/* Files in dir whose name contains part. */
static int count_named(const char *dir, const char *part)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strstr(e->d_name, part) != NULL;
    closedir(d);
    return n;
}

/* ---- tune.db --------------------------------------------------------------------------------- */

/* A whole session: open, record, winner, results, lease, release, show, export, import, close.
 * Returns the first failure's status (its message checked), LAJIT_OK when all went through. */
static lajit_status tunedb_session(lj_env *env, const char *dir, const char *import_file)
{
    lj_tunedb *db;
    lajit_status st = lj_tunedb_open(env, dir, &db);
    if (st != LAJIT_OK)
        return st;
    lj_tune_id id = make_id("swept");
    lj_tune_result r[2];
    memset(r, 0, sizeof r);
    snprintf(r[0].config, sizeof r[0].config, "BLOCK=64");
    r[0].ms = 1.5;
    snprintf(r[1].config, sizeof r[1].config, "BLOCK=128");
    r[1].ms = -1;
    snprintf(r[1].failure, sizeof r[1].failure, "too slow");
    char cfg[256];
    int found, got, n, rows, shown = 0;
    lj_tune_result *res = NULL;
    if ((st = lj_tunedb_record(db, &id, r, 2, "BLOCK=64", 1.5)) == LAJIT_OK &&
        (st = lj_tunedb_winner(db, &id, cfg, sizeof cfg, NULL, &found)) == LAJIT_OK &&
        (st = lj_tunedb_results(db, &id, &res, &n)) == LAJIT_OK &&
        (st = lj_tunedb_lease(db, &id, 60, &got)) == LAJIT_OK &&
        (st = lj_tunedb_release(db, &id)) == LAJIT_OK &&
        (st = lj_tunedb_show(db, count_shown, &shown)) == LAJIT_OK &&
        (st = lj_tunedb_export(db, path_in("swept.jsonl"), &rows)) == LAJIT_OK)
        st = lj_tunedb_import(db, import_file, NULL, 1, &rows);
    lj_free(env, res);
    lj_tunedb_close(db);
    return st;
}

/* After a run: the database opens quietly (nothing set aside) and serves the seed winner. */
static void expect_tunedb_usable(const char *dir)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    lj_tunedb *db;
    if (lj_tunedb_open(&env, dir, &db) != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "after the fault: %s", env.errmsg);
    lj_tune_id seed = make_id("seed");
    char cfg[256];
    int found = 0;
    ASSERT_OK(lj_tunedb_winner(db, &seed, cfg, sizeof cfg, NULL, &found));
    ASSERT_EQ(found, 1);
    ASSERT_STREQ(cfg, "BLOCK=32");
    lj_tunedb_close(db);
    ASSERT_EQ(count_named(dir, "corrupt"), 0);
}

static void sweep_tunedb(lj_fault_kind kind, lajit_status want, const char *want_text)
{
    /* The import file: an export of another database. */
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    char src[1024], dir[1024], import_file[1024];
    snprintf(src, sizeof src, "%s", path_in("source"));
    snprintf(dir, sizeof dir, "%s", path_in("db"));
    snprintf(import_file, sizeof import_file, "%s", path_in("import.jsonl"));
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, src, &db));
    lj_tune_id other = make_id("imported");
    lj_tune_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.config, sizeof r.config, "BLOCK=16");
    r.ms = 3;
    ASSERT_OK(lj_tunedb_record(db, &other, &r, 1, NULL, -1));
    int rows;
    ASSERT_OK(lj_tunedb_export(db, import_file, &rows));
    lj_tunedb_close(db);
    /* The database under test, with a seed winner that every run must leave intact. */
    ASSERT_OK(lj_tunedb_open(&env, dir, &db));
    lj_tune_id seed = make_id("seed");
    snprintf(r.config, sizeof r.config, "BLOCK=32");
    ASSERT_OK(lj_tunedb_record(db, &seed, &r, 1, NULL, -1));
    lj_tunedb_close(db);

    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    ASSERT_OK(tunedb_session(&env, dir, import_file));
    uint64_t sites = env.fault_count[kind];
    ASSERT_TRUE(sites > 3);
    int reported = 0, absorbed = 0;
    for (uint64_t n = 1; n <= sites; n++) {
        lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
        env.fault_at[kind] = n;
        lajit_status st = tunedb_session(&env, dir, import_file);
        if (st == LAJIT_OK) {
            absorbed++;
        } else {
            reported++;
            if (st != want && !(kind == LJ_FAULT_ALLOC && st == LAJIT_ERR_DATABASE &&
                                strstr(env.errmsg, "out of memory")))
                lj_test_fail(__FILE__, __LINE__, "fault %llu: status %s, want %s: %s",
                             (unsigned long long)n, lajit_status_string(st),
                             lajit_status_string(want), env.errmsg);
            if (!strstr(env.errmsg, want_text) && !strstr(env.errmsg, "out of memory"))
                lj_test_fail(__FILE__, __LINE__, "fault %llu: unclear message: %s",
                             (unsigned long long)n, env.errmsg);
        }
        if (getenv("LAJIT_TEST_VERBOSE"))
            printf("fault %llu: %s\n", (unsigned long long)n, env.errmsg);
        expect_tunedb_usable(dir);
    }
    printf("tune.db %s sweep: %llu sites, %llu failures injected, %d reported as a status, "
           "%d absorbed, all clean\n",
           kind == LJ_FAULT_SQLITE ? "SQLite" : "allocation", (unsigned long long)sites,
           (unsigned long long)sites, reported, absorbed);
    ASSERT_TRUE(reported > 0);
}

LJ_TEST(tunedb_sqlite_fault_sweep)
{
    sweep_tunedb(LJ_FAULT_SQLITE, LAJIT_ERR_DATABASE, "injected");
}

LJ_TEST(tunedb_alloc_fault_sweep)
{
    sweep_tunedb(LJ_FAULT_ALLOC, LAJIT_ERR_OUT_OF_MEMORY, "out of host memory");
}

/* ---- Bundles --------------------------------------------------------------------------------- */

static const unsigned char cubin[200] = {1, 2, 3, 4, 5};
static const lj_key bundle_key = {0x11, 0x22};

/* Writes a bundle of one cubin and two PTX, then reads everything back. */
static lajit_status bundle_session(lj_env *env, const char *path)
{
    lj_bundle *b;
    lajit_status st = lj_bundle_create(env, path, &b);
    if (st != LAJIT_OK)
        return st;
    const char *archs[] = {"sm_80", "sm_86"};
    lj_bundle_item it = {"la_fwd", "sm_90a",   "bucket", "BLOCK=64", "p",
                         "e",      bundle_key, 0,        cubin,      sizeof cubin};
    st = lj_bundle_add(b, &it);
    for (int i = 0; i < 2 && st == LAJIT_OK; i++) {
        lj_bundle_item p = {"la_fwd", archs[i],   "bucket", "BLOCK=64", "p",
                            "e",      bundle_key, 1,        "// ptx",   7};
        st = lj_bundle_add(b, &p);
    }
    if (st != LAJIT_OK) {
        lj_bundle_abort(b);
        return st;
    }
    if ((st = lj_bundle_finish(b)) != LAJIT_OK)
        return st;
    if ((st = lj_bundle_open(env, path, &b)) != LAJIT_OK)
        return st;
    const void *img;
    size_t size;
    int found = 0, cubins, ptxs;
    char arch[16], config[64];
    if ((st = lj_bundle_find(b, bundle_key, "sm_90a", 0, &img, &size, &found)) == LAJIT_OK &&
        (st = lj_bundle_find_ptx(b, "la_fwd", "bucket", "BLOCK=64", 90, &img, &size, arch,
                                 &found)) == LAJIT_OK &&
        (st = lj_bundle_config(b, "la_fwd", "bucket", "sm_90a", config, sizeof config, &found)) ==
            LAJIT_OK)
        st = lj_bundle_count(b, &cubins, &ptxs);
    lj_bundle_close(b);
    return st;
}

/* After a run: at most the bundle itself in its directory, and it reads completely. */
static void expect_bundle_sound(const char *dir, const char *path)
{
    ASSERT_EQ(count_named(dir, ".tmp-"), 0);
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    lj_bundle *b;
    ASSERT_OK(lj_bundle_open(&env, path, &b));
    const void *img;
    size_t size;
    int found = 0, cubins, ptxs;
    ASSERT_OK(lj_bundle_find(b, bundle_key, "sm_90a", 0, &img, &size, &found));
    ASSERT_EQ(found, 1);
    ASSERT_EQ(size, sizeof cubin);
    ASSERT_OK(lj_bundle_count(b, &cubins, &ptxs));
    ASSERT_EQ(cubins, 1);
    ASSERT_EQ(ptxs, 2);
    lj_bundle_close(b);
}

static void sweep_bundle(lj_fault_kind kind, lajit_status want, const char *want_text)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path_in("bundles"));
    ASSERT_EQ(mkdir(dir, 0700), 0);
    char path[1100];
    snprintf(path, sizeof path, "%s/set.lajitpack", dir);
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    ASSERT_OK(bundle_session(&env, path));
    uint64_t sites = env.fault_count[kind];
    ASSERT_TRUE(sites > 10);
    int reported = 0, absorbed = 0;
    for (uint64_t n = 1; n <= sites; n++) {
        lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
        env.fault_at[kind] = n;
        lajit_status st = bundle_session(&env, path);
        if (st == LAJIT_OK) {
            absorbed++;
        } else {
            reported++;
            if (st != want)
                lj_test_fail(__FILE__, __LINE__, "fault %llu: status %s, want %s: %s",
                             (unsigned long long)n, lajit_status_string(st),
                             lajit_status_string(want), env.errmsg);
            if (!strstr(env.errmsg, want_text))
                lj_test_fail(__FILE__, __LINE__, "fault %llu: unclear message: %s",
                             (unsigned long long)n, env.errmsg);
        }
        expect_bundle_sound(dir, path);
    }
    printf("bundle %s sweep: %llu sites, %llu failures injected, %d reported as a status, "
           "%d absorbed, all clean\n",
           kind == LJ_FAULT_SQLITE ? "SQLite" : "allocation", (unsigned long long)sites,
           (unsigned long long)sites, reported, absorbed);
    ASSERT_TRUE(reported > 0);
}

LJ_TEST(bundle_sqlite_fault_sweep)
{
    sweep_bundle(LJ_FAULT_SQLITE, LAJIT_ERR_DATABASE, "injected");
}

LJ_TEST(bundle_alloc_fault_sweep)
{
    sweep_bundle(LJ_FAULT_ALLOC, LAJIT_ERR_OUT_OF_MEMORY, "out of host memory");
}
