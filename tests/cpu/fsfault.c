/* fsfault.c — file-system fault injection (LJ_FAULT_FS, core/fs.h): every open, read, write,
 * fsync, rename, mkdir and flock that a path makes is counted with injection off, then failed in
 * turn, one per run, over: (a) the kernel cache's put and get, (b) tune.db's open, record,
 * winner and lease, (c) export and import, (d) bundles written by lj_bundle_* and by
 * lj_gen_write, and bundle open, (e) the whole first call of an op through the fake driver with
 * a disk cache and tune.db. Each run must end in a clear status with a message, or succeed where
 * lajit falls back on purpose (memory, NVRTC, defaults), leave no temporary file, leave what was
 * on disk usable (the database's seed winner, a previous complete bundle or export), and leak
 * nothing (the sanitizer build checks at exit). Each sweep prints its counts. */
#include "test.h"

#include <dirent.h>
#include <ftw.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include "bundle.h"
#include "cache.h"
#include "context.h"
#include "fake_driver.h"
#include "gen.h"
#include "nvrtc.h"
#include "tunedb.h"

/* ---- Helpers ---------------------------------------------------------------------------------- */

/* A path in the test's directory. Each call takes a fresh buffer (the names stay valid). */
static char *path_in(const char *fmt, unsigned long long n)
{
    static char paths[1024][1024];
    static int next;
    if (next == 1024)
        lj_test_fail(__FILE__, __LINE__, "path_in: out of buffers");
    char *p = paths[next++];
    char name[256];
    snprintf(name, sizeof name, fmt, n);
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

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void rm_rf(const char *dir)
{
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Reads a whole file (test-sized) into a malloc'ed block; NULL when it cannot be read. */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc(1 << 20);
    *len = buf ? fread(buf, 1, 1 << 20, f) : 0;
    fclose(f);
    return buf;
}

static int warnings;

static void count_warnings(void *user, lajit_log_level level, const char *message)
{
    (void)user, (void)message;
    if (level == LAJIT_LOG_WARN)
        warnings++;
}

static void env_init(lj_env *env)
{
    warnings = 0;
    lj_env_init(env, NULL, NULL, count_warnings, NULL, LAJIT_LOG_WARN);
}

typedef struct tally {
    unsigned long long sites;
    int reported, absorbed;
} tally;

static void print_tally(const char *what, const tally *t)
{
    printf("%s: %llu file-system calls, %llu failures injected, %d reported as a status, %d "
           "absorbed, all clean\n",
           what, t->sites, t->sites, t->reported, t->absorbed);
}

/* A failing status must say what failed. */
static void check_status(const lj_env *env, unsigned long long n, lajit_status st,
                         lajit_status want1, lajit_status want2, tally *t)
{
    if (st == LAJIT_OK) {
        t->absorbed++;
        return;
    }
    t->reported++;
    if (st != want1 && st != want2)
        lj_test_fail(__FILE__, __LINE__, "fault %llu: status %s: %s", n, lajit_status_string(st),
                     env->errmsg);
    if (env->errmsg[0] == 0)
        lj_test_fail(__FILE__, __LINE__, "fault %llu: status %s with no message", n,
                     lajit_status_string(st));
    if (getenv("LAJIT_TEST_VERBOSE"))
        printf("fault %llu: %s\n", n, env->errmsg);
}

/* ---- (a) Kernel cache ------------------------------------------------------------------------- */

static const unsigned char image[300] = {0x7f, 'E', 'L', 'F', 1, 2, 3, 4};
static const lj_key cache_key = {0x1234, 0x5678};

static void expect_image(const lj_cache_entry *e, int from_disk)
{
    ASSERT_EQ(e->size, sizeof image);
    ASSERT_TRUE(memcmp(e->image, image, sizeof image) == 0);
    ASSERT_EQ(e->regs, 40);
    ASSERT_EQ(e->from_disk, from_disk);
}

/* One process compiles and puts (then gets from memory); a second one gets from disk, and on a
 * miss rebuilds (puts again), as the op path does. Returns whether the second one rebuilt. */
static int cache_session(lj_env *env, const char *dir)
{
    lj_compiled comp;
    memset(&comp, 0, sizeof comp);
    comp.image = (void *)image;
    comp.image_size = sizeof image;
    comp.regs = 40;
    lj_cache *c;
    lj_cache_entry e;
    int found = 0, rebuilt = 0;
    ASSERT_OK(lj_cache_open(env, dir, &c));
    ASSERT_OK(lj_cache_put(c, cache_key, 0, &comp));
    ASSERT_OK(lj_cache_get(c, cache_key, 0, &e, &found));
    ASSERT_EQ(found, 1);
    expect_image(&e, 0); /* served from memory whatever the disk did */
    lj_cache_close(c);
    ASSERT_OK(lj_cache_open(env, dir, &c));
    ASSERT_OK(lj_cache_get(c, cache_key, 0, &e, &found));
    if (found) {
        expect_image(&e, 1);
    } else {
        rebuilt = 1;
        ASSERT_OK(lj_cache_put(c, cache_key, 0, &comp));
    }
    lj_cache_close(c);
    return rebuilt;
}

LJ_TEST(cache_put_get_fs_fault_sweep)
{
    const char *dir = path_in("kc/sub", 0);
    lj_env env;
    env_init(&env);
    ASSERT_EQ(cache_session(&env, dir), 0);
    ASSERT_EQ(warnings, 0);
    tally t = {env.fault_count[LJ_FAULT_FS], 0, 0};
    ASSERT_TRUE(t.sites >= 8);
    int rebuilt = 0;
    for (unsigned long long n = 1; n <= t.sites; n++) {
        rm_rf(path_in("kc", 0)); /* each run starts with no cache directory at all */
        env_init(&env);
        env.fault_at[LJ_FAULT_FS] = n;
        rebuilt += cache_session(&env, dir);
        ASSERT_EQ(env.fault_count[LJ_FAULT_FS] >= n, 1);
        /* Cache failures never fail a call: each is a warning and a fallback. */
        t.absorbed++;
        if (warnings == 0)
            lj_test_fail(__FILE__, __LINE__, "fault %llu: absorbed without a word", n);
        /* Nothing partial left, and the next process finds the whole entry on disk. */
        ASSERT_EQ(count_named(dir, ".tmp."), 0);
        ASSERT_EQ(count_named(dir, ".cubin"), 1);
        lj_env clean;
        env_init(&clean);
        lj_cache *c;
        lj_cache_entry e;
        int found = 0;
        ASSERT_OK(lj_cache_open(&clean, dir, &c));
        ASSERT_OK(lj_cache_get(c, cache_key, 0, &e, &found));
        ASSERT_EQ(found, 1);
        expect_image(&e, 1);
        lj_cache_close(c);
        ASSERT_EQ(warnings, 0);
    }
    print_tally("kernel cache put+get", &t);
    printf("  %d runs found no entry on disk and rebuilt it\n", rebuilt);
    ASSERT_TRUE(rebuilt > 0);
}

/* ---- (b) tune.db ------------------------------------------------------------------------------ */

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

/* A database in dir holding the winner BLOCK=32 for bucket (and nothing else). */
static void seed_db(const char *dir, const char *bucket, const char *config)
{
    lj_env env;
    env_init(&env);
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir, &db));
    lj_tune_id id = make_id(bucket);
    lj_tune_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.config, sizeof r.config, "%s", config);
    r.ms = 3;
    ASSERT_OK(lj_tunedb_record(db, &id, &r, 1, config, 3));
    lj_tunedb_close(db);
}

/* The winner of bucket in the database in dir ("" when none); the database must open without a
 * warning. */
static void winner_of(const char *dir, const char *bucket, char *cfg, size_t cap)
{
    lj_env env;
    env_init(&env);
    lj_tunedb *db;
    if (lj_tunedb_open(&env, dir, &db) != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "after the fault: %s", env.errmsg);
    lj_tune_id id = make_id(bucket);
    int found = 0;
    ASSERT_OK(lj_tunedb_winner(db, &id, cfg, cap, NULL, &found));
    if (!found)
        cfg[0] = 0;
    lj_tunedb_close(db);
    ASSERT_EQ(warnings, 0);
}

/* Opens the seeded database and records, reads the winner, leases and releases; then opens a
 * database in a directory that does not exist yet (fresh), which creates it. */
static lajit_status tunedb_session(lj_env *env, const char *dir, const char *fresh)
{
    lj_tunedb *db;
    lajit_status st = lj_tunedb_open(env, dir, &db);
    if (st != LAJIT_OK)
        return st;
    lj_tune_id id = make_id("swept");
    lj_tune_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.config, sizeof r.config, "BLOCK=64");
    r.ms = 1.5;
    char cfg[256];
    int found, got;
    if ((st = lj_tunedb_record(db, &id, &r, 1, "BLOCK=64", 1.5)) == LAJIT_OK &&
        (st = lj_tunedb_winner(db, &id, cfg, sizeof cfg, NULL, &found)) == LAJIT_OK &&
        (st = lj_tunedb_lease(db, &id, 60, &got)) == LAJIT_OK)
        st = lj_tunedb_release(db, &id);
    lj_tunedb_close(db);
    if (st != LAJIT_OK)
        return st;
    if ((st = lj_tunedb_open(env, fresh, &db)) == LAJIT_OK)
        lj_tunedb_close(db);
    return st;
}

LJ_TEST(tunedb_fs_fault_sweep)
{
    const char *dir = path_in("db", 0);
    seed_db(dir, "seed", "BLOCK=32");
    lj_env env;
    env_init(&env);
    ASSERT_OK(tunedb_session(&env, dir, path_in("fresh0/a/b", 0)));
    tally t = {env.fault_count[LJ_FAULT_FS], 0, 0};
    ASSERT_TRUE(t.sites >= 6);
    for (unsigned long long n = 1; n <= t.sites; n++) {
        env_init(&env);
        env.fault_at[LJ_FAULT_FS] = n;
        lajit_status st = tunedb_session(&env, dir, path_in("fresh%llu/a/b", n));
        ASSERT_EQ(env.fault_count[LJ_FAULT_FS] >= n, 1);
        check_status(&env, n, st, LAJIT_ERR_DATABASE, LAJIT_ERR_DATABASE, &t);
        if (st != LAJIT_OK)
            ASSERT_CONTAINS(env.errmsg, "tuning database");
        if (getenv("LAJIT_TEST_VERBOSE"))
            printf("run %llu: %s\n", n, lajit_status_string(st));
        char cfg[256];
        winner_of(dir, "seed", cfg, sizeof cfg);
        ASSERT_STREQ(cfg, "BLOCK=32");
        ASSERT_EQ(count_named(dir, "corrupt"), 0);
    }
    print_tally("tune.db open/record/winner/lease", &t);
    ASSERT_TRUE(t.reported > 0);
    ASSERT_TRUE(t.absorbed > 0); /* the lock file: opening goes on without it */
}

/* A damaged tune.db is set aside (renamed, with its side files) and a new one started; each
 * file-system call of that recovery fails in turn. The damaged bytes are never lost: they stay
 * at tune.db or sit in one tune.db.corrupt-* file, and the next open recovers. */
LJ_TEST(damaged_tunedb_recovery_fs_fault_sweep)
{
    static const char junk[] = "this is not an SQLite database, just 4096 bytes of junk";
    tally t = {0, 0, 0};
    for (unsigned long long n = 0; n == 0 || n <= t.sites; n++) {
        const char *dir = path_in("dmg%llu", n);
        ASSERT_EQ(mkdir(dir, 0700), 0);
        char db[1100];
        snprintf(db, sizeof db, "%s/tune.db", dir);
        FILE *f = fopen(db, "wb");
        ASSERT_TRUE(f != NULL);
        for (int i = 0; i < 4096 / (int)sizeof junk; i++)
            fwrite(junk, 1, sizeof junk, f);
        fclose(f);
        lj_env env;
        env_init(&env);
        env.fault_at[LJ_FAULT_FS] = n;
        lj_tunedb *t_db = NULL;
        lajit_status st = lj_tunedb_open(&env, dir, &t_db);
        lj_tunedb_close(t_db);
        if (n == 0) {
            ASSERT_OK(st);
            t.sites = env.fault_count[LJ_FAULT_FS];
            ASSERT_TRUE(t.sites >= 4);
        } else {
            ASSERT_EQ(env.fault_count[LJ_FAULT_FS] >= n, 1);
            check_status(&env, n, st, LAJIT_ERR_DATABASE, LAJIT_ERR_DATABASE, &t);
        }
        int aside = count_named(dir, "tune.db.corrupt-");
        ASSERT_TRUE(aside <= 1);
        if (!aside) {
            /* Not set aside: the open failed, said why, and left the bytes where they were. */
            ASSERT_TRUE(st != LAJIT_OK);
            size_t len = 0;
            char *kept = slurp(db, &len);
            ASSERT_TRUE(kept && len >= sizeof junk && memcmp(kept, junk, sizeof junk) == 0);
            free(kept);
        }
        /* The next open recovers (sets it aside now if it was not) and works. */
        seed_db(dir, "seed", "BLOCK=32");
        char cfg[256];
        winner_of(dir, "seed", cfg, sizeof cfg);
        ASSERT_STREQ(cfg, "BLOCK=32");
    }
    print_tally("damaged tune.db set aside", &t);
    ASSERT_TRUE(t.reported > 0);
}

/* ---- (c) Export and import -------------------------------------------------------------------- */

static lajit_status export_import(lj_env *env, const char *dir, const char *out, const char *in)
{
    lj_tunedb *db;
    lajit_status st = lj_tunedb_open(env, dir, &db);
    if (st != LAJIT_OK)
        return st;
    int rows;
    if ((st = lj_tunedb_export(db, out, &rows)) == LAJIT_OK)
        st = lj_tunedb_import(db, in, NULL, 1, &rows);
    lj_tunedb_close(db);
    return st;
}

static void export_to(const char *dir, const char *path)
{
    lj_env env;
    env_init(&env);
    lj_tunedb *db;
    int rows;
    ASSERT_OK(lj_tunedb_open(&env, dir, &db));
    ASSERT_OK(lj_tunedb_export(db, path, &rows));
    ASSERT_EQ(rows, 2);
    lj_tunedb_close(db);
}

static int same_file(const char *a, const char *b)
{
    size_t la = 0, lb = 0;
    char *x = slurp(a, &la), *y = slurp(b, &lb);
    int same = x && y && la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return same;
}

LJ_TEST(export_import_fs_fault_sweep)
{
    const char *src = path_in("src", 0), *in = path_in("import.jsonl", 0);
    seed_db(src, "imported", "BLOCK=16");
    export_to(src, in);
    /* Per run: a fresh seeded database, its export as the reference, and a previous export of
     * it at the target path. */
    char dir[1024], ref[1100], out[1100], outdir[1024];
    tally t = {0, 0, 0};
    for (unsigned long long n = 0; n == 0 || n <= t.sites; n++) {
        snprintf(dir, sizeof dir, "%s", path_in("x%llu/db", n));
        snprintf(outdir, sizeof outdir, "%s", path_in("x%llu/out", n));
        snprintf(ref, sizeof ref, "%s/ref.jsonl", outdir);
        snprintf(out, sizeof out, "%s/out.jsonl", outdir);
        seed_db(dir, "seed", "BLOCK=32");
        ASSERT_EQ(mkdir(outdir, 0700), 0);
        export_to(dir, ref);
        export_to(dir, out);
        lj_env env;
        env_init(&env);
        env.fault_at[LJ_FAULT_FS] = n;
        lajit_status st = export_import(&env, dir, out, in);
        if (n == 0) {
            ASSERT_OK(st);
            t.sites = env.fault_count[LJ_FAULT_FS];
            ASSERT_TRUE(t.sites >= 6);
        } else {
            ASSERT_EQ(env.fault_count[LJ_FAULT_FS] >= n, 1);
            check_status(&env, n, st, LAJIT_ERR_IO, LAJIT_ERR_DATABASE, &t);
        }
        /* The export at the path is whole (old or new: the same rows), nothing temporary is
         * left, and the import happened completely or not at all. */
        ASSERT_TRUE(same_file(ref, out));
        ASSERT_EQ(count_named(outdir, ".tmp-"), 0);
        char cfg[256];
        winner_of(dir, "seed", cfg, sizeof cfg);
        ASSERT_STREQ(cfg, "BLOCK=32");
        winner_of(dir, "imported", cfg, sizeof cfg);
        ASSERT_STREQ(cfg, st == LAJIT_OK ? "BLOCK=16" : "");
        ASSERT_EQ(count_named(dir, "corrupt"), 0);
    }
    print_tally("export+import", &t);
    ASSERT_TRUE(t.reported > 0);
}

/* A real write failure, not an injected one: with the file size limit below the export's size,
 * writing fails part-way (EFBIG). The previous export at the path must stay whole; writing in
 * place used to leave it truncated. */
LJ_TEST(failed_export_keeps_the_previous_file)
{
    const char *dir = path_in("big", 0), *out = path_in("big.jsonl", 0),
               *ref = path_in("big-ref.jsonl", 0);
    lj_env env;
    env_init(&env);
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir, &db));
    for (int i = 0; i < 100; i++) {
        char bucket[32];
        snprintf(bucket, sizeof bucket, "bucket-%d", i);
        lj_tune_id id = make_id(bucket);
        lj_tune_result r;
        memset(&r, 0, sizeof r);
        snprintf(r.config, sizeof r.config, "BLOCK=64");
        r.ms = 1;
        ASSERT_OK(lj_tunedb_record(db, &id, &r, 1, "BLOCK=64", 1));
    }
    int rows;
    ASSERT_OK(lj_tunedb_export(db, ref, &rows));
    ASSERT_OK(lj_tunedb_export(db, out, &rows));
    struct stat sb;
    ASSERT_EQ(stat(out, &sb), 0);
    ASSERT_TRUE(sb.st_size > 16384);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, lim;
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 8192;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
    lajit_status st = lj_tunedb_export(db, out, &rows);
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
    ASSERT_EQ(st, LAJIT_ERR_IO);
    ASSERT_CONTAINS(env.errmsg, "big.jsonl");
    lj_tunedb_close(db);
    ASSERT_TRUE(same_file(ref, out));
    ASSERT_EQ(count_named(lj_test_tmpdir(), ".tmp-"), 0);
}

/* ---- (d) Bundles ------------------------------------------------------------------------------ */

static const unsigned char cubin[200] = {1, 2, 3, 4, 5};
static const lj_key bundle_key = {0x11, 0x22};

/* Writes a bundle of one cubin and one PTX, then opens it and reads the cubin back. */
static lajit_status bundle_session(lj_env *env, const char *path)
{
    lj_bundle *b;
    lajit_status st = lj_bundle_create(env, path, &b);
    if (st != LAJIT_OK)
        return st;
    lj_bundle_item it = {"la_fwd", "sm_90a",   "bucket", "BLOCK=64", "p",
                         "e",      bundle_key, 0,        cubin,      sizeof cubin};
    lj_bundle_item p = {"la_fwd", "sm_80",    "bucket", "BLOCK=64", "p",
                        "e",      bundle_key, 1,        "// ptx",   7};
    if ((st = lj_bundle_add(b, &it)) != LAJIT_OK || (st = lj_bundle_add(b, &p)) != LAJIT_OK) {
        lj_bundle_abort(b);
        return st;
    }
    if ((st = lj_bundle_finish(b)) != LAJIT_OK)
        return st;
    if ((st = lj_bundle_open(env, path, &b)) != LAJIT_OK)
        return st;
    const void *img;
    size_t size;
    int found = 0;
    st = lj_bundle_find(b, bundle_key, "sm_90a", 0, &img, &size, &found);
    lj_bundle_close(b);
    return st;
}

/* The bundle at path opens and holds cubins and ptxs kernels. */
static void expect_bundle(const char *path, int cubins, int ptxs)
{
    lj_env env;
    env_init(&env);
    lj_bundle *b;
    ASSERT_OK(lj_bundle_open(&env, path, &b));
    int c = -1, p = -1;
    ASSERT_OK(lj_bundle_count(b, &c, &p));
    ASSERT_EQ(c, cubins);
    ASSERT_EQ(p, ptxs);
    lj_bundle_close(b);
}

LJ_TEST(bundle_fs_fault_sweep)
{
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s", path_in("bundles", 0));
    ASSERT_EQ(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/set.lajitpack", dir);
    lj_env env;
    env_init(&env);
    ASSERT_OK(bundle_session(&env, path)); /* also the previous bundle each run must keep */
    tally t = {env.fault_count[LJ_FAULT_FS], 0, 0};
    ASSERT_TRUE(t.sites >= 4);
    for (unsigned long long n = 1; n <= t.sites; n++) {
        env_init(&env);
        env.fault_at[LJ_FAULT_FS] = n;
        lajit_status st = bundle_session(&env, path);
        ASSERT_EQ(env.fault_count[LJ_FAULT_FS] >= n, 1);
        check_status(&env, n, st, LAJIT_ERR_IO, LAJIT_ERR_DATABASE, &t);
        ASSERT_EQ(count_named(dir, ".tmp-"), 0);
        expect_bundle(path, 1, 1);
    }
    print_tally("bundle create/add/finish+open", &t);
    ASSERT_TRUE(t.reported == (int)t.sites);
}

static lajit_status load_family(void *user, const char *name, lj_family **out)
{
    return lajit__ctx_family(user, name, out);
}

/* lj_gen_write with a tune.db to read winners from, over a previous bundle at the path. */
LJ_TEST(gen_write_fs_fault_sweep)
{
    lj_env probe;
    env_init(&probe);
    int major, minor;
    if (lj_nvrtc_version(&probe, &major, &minor) != LAJIT_OK)
        lj_test_skip("NVRTC not available");
    char dir[1024], path[1100], db[1100];
    snprintf(dir, sizeof dir, "%s", path_in("gen", 0));
    seed_db(dir, "seed", "BLOCK=32");
    snprintf(db, sizeof db, "%s/tune.db", dir);
    snprintf(path, sizeof path, "%s/set.lajitpack", dir);
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DEVICE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lj_lua *L;
    ASSERT_OK(lajit__ctx_lua(ctx, &L));
    static const char *const families[] = {"la_recurrent"}, *const archs[] = {"sm_80"};
    static const char *const assign[] = {"dtype=f32", "B=2",  "H=3",    "N=5",
                                         "D=32",      "E=16", "decay=1"};
    lj_gen_opts o;
    memset(&o, 0, sizeof o);
    o.families = families;
    o.n_families = 1;
    o.archs = archs;
    o.n_archs = 1;
    o.assign = assign;
    o.n_assign = sizeof assign / sizeof assign[0];
    o.db_path = db;
    o.jobs = 1;
    lj_env *env = lajit__ctx_env(ctx);
    lj_gen_summary sum, first = {0, 0, 0};
    tally t = {0, 0, 0};
    for (unsigned long long n = 0; n == 0 || n <= t.sites; n++) {
        memset(env->fault_count, 0, sizeof env->fault_count);
        env->fault_at[LJ_FAULT_FS] = n;
        lajit_status st = lj_gen_write(env, L, load_family, ctx, &o, path, &sum);
        env->fault_at[LJ_FAULT_FS] = 0;
        if (n == 0) {
            ASSERT_OK(st);
            first = sum;
            t.sites = env->fault_count[LJ_FAULT_FS];
            ASSERT_TRUE(t.sites >= 4);
        } else {
            ASSERT_EQ(env->fault_count[LJ_FAULT_FS] >= n, 1);
            check_status(env, n, st, LAJIT_ERR_IO, LAJIT_ERR_DATABASE, &t);
        }
        lj_clear_error(env);
        ASSERT_EQ(count_named(dir, ".tmp-"), 0);
        expect_bundle(path, first.cubins, first.ptxs);
    }
    lajit_ctx_destroy(ctx);
    print_tally("lj_gen_write (tune.db + bundle)", &t);
    ASSERT_TRUE(t.reported > 0);
}

/* ---- (e) An op's first call through the fake driver ------------------------------------------- */

enum { B = 2, H = 3, N = 5, D = 32, E = 16 };

typedef struct op_setup {
    CUcontext cuctx;
    CUdeviceptr buf[4];
    int64_t qshape[4], vshape[4];
    DLTensor t[4];
    lajit_attn_fwd_args args;
} op_setup;

static void op_open(op_setup *u)
{
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    memset(u, 0, sizeof *u);
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&u->cuctx, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(u->cuctx), CUDA_SUCCESS);
    int64_t qs[4] = {B, H, N, D}, vs[4] = {B, H, N, E};
    memcpy(u->qshape, qs, sizeof qs);
    memcpy(u->vshape, vs, sizeof vs);
    for (int i = 0; i < 4; i++) {
        int64_t *shape = i < 2 ? u->qshape : u->vshape;
        ASSERT_EQ(drv->cuMemAlloc(&u->buf[i], (size_t)B * H * N * (i < 2 ? D : E) * 4),
                  CUDA_SUCCESS);
        DLTensor *t = &u->t[i];
        t->data = (void *)(uintptr_t)u->buf[i];
        t->device.device_type = kDLCUDA;
        t->ndim = 4;
        t->dtype.code = kDLFloat;
        t->dtype.bits = 32;
        t->dtype.lanes = 1;
        t->shape = shape;
    }
    u->args.struct_size = sizeof u->args;
    u->args.q = &u->t[0];
    u->args.k = &u->t[1];
    u->args.v = &u->t[2];
    u->args.o = &u->t[3];
    u->args.scale = 1.0f;
    u->args.family = "la_recurrent";
}

static void op_close(op_setup *u)
{
    const lj_driver *drv = lj_fake_driver();
    ASSERT_EQ(drv->cuCtxSetCurrent(u->cuctx), CUDA_SUCCESS);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(drv->cuMemFree(u->buf[i]), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

/* The op's first call in a fresh context with the n-th file-system call failing (0: none);
 * returns the status, and the context's file-system calls and whether it compiled. */
static lajit_status first_call(op_setup *u, const char *cache, unsigned long long n,
                               uint64_t *fs_calls, int *compiled)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.cache_dir = cache;
    desc.log = count_warnings;
    desc.log_level = LAJIT_LOG_WARN;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lajit__ctx_set_driver(ctx, lj_fake_driver());
    lj_env *env = lajit__ctx_env(ctx);
    env->fault_at[LJ_FAULT_FS] = n;
    lajit_status st = lajit_attn_fwd(ctx, &u->args);
    *fs_calls = env->fault_count[LJ_FAULT_FS];
    *compiled = env->fault_count[LJ_FAULT_NVRTC] > 2;
    if (st != LAJIT_OK && lajit_errmsg(ctx)[0] == 0)
        lj_test_fail(__FILE__, __LINE__, "fault %llu: status %s with no message", n,
                     lajit_status_string(st));
    if (st != LAJIT_OK || getenv("LAJIT_TEST_VERBOSE"))
        printf("fault %llu: %s: %s\n", n, lajit_status_string(st), lajit_errmsg(ctx));
    env->fault_at[LJ_FAULT_FS] = 0;
    lajit_ctx_destroy(ctx);
    return st;
}

/* cold: each run starts with no cache directory (the call compiles, creates the directory and
 * tune.db, writes the entry); warm: the entry and tune.db are there (the call reads them). */
static void op_sweep(int cold)
{
    lj_env probe;
    env_init(&probe);
    int major, minor;
    if (lj_nvrtc_version(&probe, &major, &minor) != LAJIT_OK)
        lj_test_skip("NVRTC not available");
    lj_fake_driver_reset();
    op_setup u;
    op_open(&u);
    const char *root = path_in("op", 0), *cache = path_in("op/cache", 0);
    uint64_t sites;
    int compiled;
    ASSERT_OK(first_call(&u, cache, 0, &sites, &compiled));
    if (!cold) {
        ASSERT_OK(first_call(&u, cache, 0, &sites, &compiled));
        ASSERT_EQ(compiled, 0);
    }
    tally t = {sites, 0, 0};
    ASSERT_TRUE(t.sites >= 6);
    int recompiled = 0, lost = 0;
    for (unsigned long long n = 1; n <= t.sites; n++) {
        if (cold)
            rm_rf(root);
        uint64_t calls;
        warnings = 0;
        lajit_status st = first_call(&u, cache, n, &calls, &compiled);
        ASSERT_EQ(calls >= n, 1);
        /* Every file lajit keeps is an optimisation: the call must still succeed. */
        ASSERT_OK(st);
        t.absorbed++;
        if (warnings == 0)
            lj_test_fail(__FILE__, __LINE__, "fault %llu: absorbed without a word", n);
        recompiled += !cold && compiled;
        ASSERT_EQ(count_named(cache, ".tmp"), 0);
        /* The next process rebuilds what the failure lost (cold: the entry may not have been
         * written) without a word, and the one after it is served from disk. */
        warnings = 0;
        ASSERT_OK(first_call(&u, cache, 0, &calls, &compiled));
        ASSERT_EQ(warnings, 0);
        if (compiled) {
            ASSERT_TRUE(cold);
            lost++;
            ASSERT_OK(first_call(&u, cache, 0, &calls, &compiled));
            ASSERT_EQ(compiled, 0);
        }
        ASSERT_EQ(count_named(cache, "corrupt"), 0);
    }
    op_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
    print_tally(cold ? "op first call, cold cache" : "op first call, warm cache", &t);
    if (cold)
        printf("  %d runs left no disk entry (the next process compiled it again)\n", lost);
    else
        printf("  %d runs missed the disk entry and compiled with NVRTC\n", recompiled);
}

LJ_TEST(op_first_call_cold_fs_fault_sweep)
{
    op_sweep(1);
}

LJ_TEST(op_first_call_warm_fs_fault_sweep)
{
    op_sweep(0);
}
