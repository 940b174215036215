/* tunedb.c — the tuning database (autotune/tunedb.h) with no GPU: round trips of measurements
 * and winners, eight processes writing and reading one file at once, lease exclusivity and
 * stale-lease takeover across processes, and the faults a file on disk can have — random bytes,
 * a valid database cut in half, a schema from a later lajit, a foreign SQLite file, a directory
 * that cannot be written — each ending in a fresh database or a clean "unavailable", never a
 * crash. Export/import round trips and refuses another device's rows unless forced. */
#include "test.h"

#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tunedb.h"

typedef struct logbuf {
    char text[4096];
    int warnings;
} logbuf;

static void capture_log(void *user, lajit_log_level level, const char *message)
{
    logbuf *b = user;
    if (level <= LAJIT_LOG_WARN)
        b->warnings++;
    size_t used = strlen(b->text);
    snprintf(b->text + used, sizeof b->text - used, "%s\n", message);
}

static lj_env env;
static logbuf logs;

static void env_setup(void)
{
    memset(&logs, 0, sizeof logs);
    lj_env_init(&env, NULL, NULL, capture_log, &logs, LAJIT_LOG_DEBUG);
}

static const char *dir(void)
{
    return getenv("LAJIT_CACHE_DIR");
}

static lj_tune_id make_id(const char *device, int cc, const char *bucket)
{
    lj_tune_id id;
    memset(&id, 0, sizeof id);
    snprintf(id.fp.name, sizeof id.fp.name, "%s", device);
    id.fp.cc = cc;
    id.fp.sms = 132;
    id.fp.driver = 13000;
    id.fp.nvrtc = 12080;
    snprintf(id.family, sizeof id.family, "la_fwd");
    snprintf(id.template_hash, sizeof id.template_hash, "0123456789abcdef");
    snprintf(id.bucket, sizeof id.bucket, "%s", bucket);
    return id;
}

static lj_tune_result ok_result(const char *cfg, double ms)
{
    lj_tune_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.config, sizeof r.config, "%s", cfg);
    r.ms = ms;
    return r;
}

static lj_tune_result failed_result(const char *cfg, const char *why)
{
    lj_tune_result r = ok_result(cfg, -1);
    snprintf(r.failure, sizeof r.failure, "%s", why);
    return r;
}

static void record_three(lj_tunedb *db, const lj_tune_id *id)
{
    lj_tune_result r[3] = {ok_result("BLOCK=64 WARPS=4", 2.5),
                           failed_result("BLOCK=128 WARPS=8", "CUDA_ERROR_ILLEGAL_ADDRESS"),
                           ok_result("BLOCK=64 WARPS=8", 1.25)};
    ASSERT_OK(lj_tunedb_record(db, id, r, 3, "BLOCK=64 WARPS=4", 2.5));
}

static void expect_winner(lj_tunedb *db, const lj_tune_id *id, const char *want)
{
    char cfg[256];
    double ms = 0;
    int found = -1;
    ASSERT_OK(lj_tunedb_winner(db, id, cfg, sizeof cfg, &ms, &found));
    ASSERT_EQ(found, 1);
    ASSERT_STREQ(cfg, want);
}

static void expect_no_winner(lj_tunedb *db, const lj_tune_id *id)
{
    char cfg[256];
    int found = -1;
    ASSERT_OK(lj_tunedb_winner(db, id, cfg, sizeof cfg, NULL, &found));
    ASSERT_EQ(found, 0);
}

static void count_shown(void *user, const lj_fingerprint *fp, const char *family,
                        const char *template_hash, const char *bucket, const char *config,
                        double ms, const char *default_config, double default_ms, int measured)
{
    (*(int *)user)++;
}

static void db_path(char *out, size_t cap)
{
    snprintf(out, cap, "%s/tune.db", dir());
}

/* Number of files in the cache directory whose name starts with prefix. */
static int count_files(const char *prefix)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "ls -1 '%s' | grep -c '^%s' 2>/dev/null", dir(), prefix);
    FILE *p = popen(cmd, "r");
    ASSERT_TRUE(p != NULL);
    int n = 0;
    if (fscanf(p, "%d", &n) != 1)
        n = 0;
    pclose(p);
    return n;
}

LJ_TEST(round_trip)
{
    env_setup();
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    lj_tune_id id = make_id("NVIDIA H200", 90, "bf16 D=128 E=128 decay n13 bh7");
    expect_no_winner(db, &id);
    record_three(db, &id);
    expect_winner(db, &id, "BLOCK=64 WARPS=8");
    lj_tune_result *r;
    int n;
    ASSERT_OK(lj_tunedb_results(db, &id, &r, &n));
    ASSERT_EQ(n, 3);
    ASSERT_STREQ(r[0].config, "BLOCK=64 WARPS=8");
    ASSERT_STREQ(r[1].config, "BLOCK=64 WARPS=4");
    ASSERT_STREQ(r[2].failure, "CUDA_ERROR_ILLEGAL_ADDRESS");
    ASSERT_TRUE(r[2].ms < 0);
    lj_free(&env, r);
    /* Any other part of the identity is another bucket. */
    lj_tune_id other = id;
    other.fp.driver = 13010;
    expect_no_winner(db, &other);
    other = id;
    snprintf(other.template_hash, sizeof other.template_hash, "fedcba9876543210");
    expect_no_winner(db, &other);
    /* All failed: measurements recorded, no winner. */
    lj_tune_id bad = make_id("NVIDIA H200", 90, "f32 D=16");
    lj_tune_result f = failed_result("BLOCK=16", "compile failed");
    ASSERT_OK(lj_tunedb_record(db, &bad, &f, 1, "BLOCK=16", -1));
    expect_no_winner(db, &bad);
    lj_tunedb_close(db);
    /* Persistent across connections; the file has the schema version and WAL mode. */
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    expect_winner(db, &id, "BLOCK=64 WARPS=8");
    lj_tunedb_close(db);
    char path[1024];
    db_path(path, sizeof path);
    sqlite3 *s;
    ASSERT_EQ(sqlite3_open(path, &s), SQLITE_OK);
    sqlite3_stmt *q;
    ASSERT_EQ(sqlite3_prepare_v2(s, "PRAGMA user_version", -1, &q, NULL), SQLITE_OK);
    ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
    ASSERT_EQ(sqlite3_column_int(q, 0), LJ_TUNEDB_SCHEMA);
    sqlite3_finalize(q);
    ASSERT_EQ(sqlite3_prepare_v2(s, "PRAGMA journal_mode", -1, &q, NULL), SQLITE_OK);
    ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
    ASSERT_STREQ((const char *)sqlite3_column_text(q, 0), "wal");
    sqlite3_finalize(q);
    sqlite3_close(s);
    ASSERT_EQ(logs.warnings, 0);
}

/* Eight processes, each opening its own connection at the same moment (creating the file
 * together), recording 25 buckets and reading every one back at once; then the parent finds all
 * 200 winners. SQLITE_BUSY never surfaces: every call must succeed. */
LJ_TEST(eight_processes)
{
    enum { PROCS = 8, BUCKETS = 25 };
    pid_t pids[PROCS];
    int go[2];
    ASSERT_EQ(pipe(go), 0);
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        ASSERT_TRUE(pids[p] >= 0);
        if (pids[p] == 0) {
            close(go[1]);
            char c;
            if (read(go[0], &c, 1) < 0)
                _exit(3);
            env_setup();
            lj_tunedb *db;
            if (lj_tunedb_open(&env, dir(), &db) != LAJIT_OK) {
                fprintf(stderr, "child %d: open: %s\n", p, env.errmsg);
                _exit(1);
            }
            for (int b = 0; b < BUCKETS; b++) {
                char bucket[64], cfg[64];
                snprintf(bucket, sizeof bucket, "p%d b%d", p, b);
                lj_tune_id id = make_id("NVIDIA H200", 90, bucket);
                int got;
                if (lj_tunedb_lease(db, &id, 60, &got) != LAJIT_OK || !got) {
                    fprintf(stderr, "child %d: lease: %s\n", p, env.errmsg);
                    _exit(1);
                }
                snprintf(cfg, sizeof cfg, "BLOCK=%d", 16 * (b + 1));
                lj_tune_result r[2] = {ok_result(cfg, 1.0), ok_result("BLOCK=8", 9.0)};
                char found_cfg[256];
                int found = 0;
                if (lj_tunedb_record(db, &id, r, 2, "BLOCK=8", 9.0) != LAJIT_OK ||
                    lj_tunedb_release(db, &id) != LAJIT_OK ||
                    lj_tunedb_winner(db, &id, found_cfg, sizeof found_cfg, NULL, &found) !=
                        LAJIT_OK ||
                    !found || strcmp(found_cfg, cfg) != 0) {
                    fprintf(stderr, "child %d bucket %d: %s\n", p, b, env.errmsg);
                    _exit(1);
                }
            }
            lj_tunedb_close(db);
            _exit(logs.warnings ? 2 : 0);
        }
    }
    close(go[0]);
    close(go[1]); /* every child's read returns at once: they start together */
    for (int p = 0; p < PROCS; p++) {
        int status;
        ASSERT_EQ(waitpid(pids[p], &status, 0), pids[p]);
        ASSERT_TRUE(WIFEXITED(status));
        ASSERT_EQ(WEXITSTATUS(status), 0);
    }
    env_setup();
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    for (int p = 0; p < PROCS; p++) {
        for (int b = 0; b < BUCKETS; b++) {
            char bucket[64], cfg[64];
            snprintf(bucket, sizeof bucket, "p%d b%d", p, b);
            snprintf(cfg, sizeof cfg, "BLOCK=%d", 16 * (b + 1));
            lj_tune_id id = make_id("NVIDIA H200", 90, bucket);
            expect_winner(db, &id, cfg);
        }
    }
    lj_tunedb_close(db);
}

/* Runs in a child: takes the lease of bucket and reports whether it got it through the exit
 * status (10 got, 11 refused, 1 error); hold_s > 0 keeps it that long before exiting without
 * releasing. */
static int lease_in_child(const char *bucket, int seconds, int hold_s, int ready_fd)
{
    env_setup();
    lj_tunedb *db;
    if (lj_tunedb_open(&env, dir(), &db) != LAJIT_OK)
        return 1;
    lj_tune_id id = make_id("NVIDIA H200", 90, bucket);
    int got = 0;
    if (lj_tunedb_lease(db, &id, seconds, &got) != LAJIT_OK)
        return 1;
    if (ready_fd >= 0) {
        if (write(ready_fd, "x", 1) != 1)
            return 1;
    }
    if (hold_s)
        sleep((unsigned)hold_s);
    lj_tunedb_close(db);
    return got ? 10 : 11;
}

static int child_status(pid_t pid)
{
    int status;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    return WEXITSTATUS(status);
}

LJ_TEST(lease_exclusive)
{
    env_setup();
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    lj_tune_id id = make_id("NVIDIA H200", 90, "leased");
    int got = 0;
    ASSERT_OK(lj_tunedb_lease(db, &id, 600, &got));
    ASSERT_EQ(got, 1);
    ASSERT_OK(lj_tunedb_lease(db, &id, 600, &got)); /* our own lease: renewed */
    ASSERT_EQ(got, 1);
    /* Another process is refused while we hold it; another bucket is free. */
    pid_t pid = fork();
    if (pid == 0)
        _exit(lease_in_child("leased", 600, 0, -1));
    ASSERT_EQ(child_status(pid), 11);
    pid = fork();
    if (pid == 0)
        _exit(lease_in_child("other", 600, 0, -1));
    ASSERT_EQ(child_status(pid), 10);
    /* Released: the next process gets it. */
    ASSERT_OK(lj_tunedb_release(db, &id));
    pid = fork();
    if (pid == 0)
        _exit(lease_in_child("leased", 600, 0, -1));
    ASSERT_EQ(child_status(pid), 10);
    /* That child exited holding it: a dead holder on this host is stale at once. */
    ASSERT_OK(lj_tunedb_lease(db, &id, 600, &got));
    ASSERT_EQ(got, 1);
    lj_tunedb_close(db);
}

LJ_TEST(lease_expiry)
{
    /* A live holder whose lease has run out loses it: the child holds a 1-second lease for 4
     * seconds; we are refused at first and get it after it expires. */
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(ready[0]);
        _exit(lease_in_child("slow", 1, 4, ready[1]));
    }
    close(ready[1]);
    char c;
    ASSERT_EQ(read(ready[0], &c, 1), 1);
    env_setup();
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    lj_tune_id id = make_id("NVIDIA H200", 90, "slow");
    int got = 1;
    ASSERT_OK(lj_tunedb_lease(db, &id, 600, &got));
    ASSERT_EQ(got, 0);
    sleep(2);
    ASSERT_OK(lj_tunedb_lease(db, &id, 600, &got));
    ASSERT_EQ(got, 1);
    ASSERT_EQ(child_status(pid), 10);
    lj_tunedb_close(db);
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    ASSERT_EQ(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* Opening the damaged file logs a warning, sets it aside and works with a fresh database. */
static void expect_recovered(void)
{
    env_setup();
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    ASSERT_TRUE(logs.warnings >= 1);
    ASSERT_CONTAINS(logs.text, "moved to");
    ASSERT_EQ(count_files("tune.db.corrupt-"), 1);
    lj_tune_id id = make_id("NVIDIA H200", 90, "after");
    expect_no_winner(db, &id);
    record_three(db, &id);
    expect_winner(db, &id, "BLOCK=64 WARPS=8");
    lj_tunedb_close(db);
    /* The fresh one opens quietly. */
    env_setup();
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    ASSERT_EQ(logs.warnings, 0);
    lj_tunedb_close(db);
}

LJ_TEST(corrupt_random_bytes)
{
    mkdir(dir(), 0700);
    char path[1024];
    db_path(path, sizeof path);
    unsigned char junk[8192];
    srand(7);
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)rand();
    write_file(path, junk, sizeof junk);
    expect_recovered();
}

LJ_TEST(corrupt_header_kept_pages_garbled)
{
    /* A real database whose pages after the header are overwritten: SQLite opens it, the damage
     * shows only when pages are read. */
    env_setup();
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    for (int b = 0; b < 50; b++) {
        char bucket[32];
        snprintf(bucket, sizeof bucket, "bucket %d", b);
        lj_tune_id id = make_id("NVIDIA H200", 90, bucket);
        record_three(db, &id);
    }
    lj_tunedb_close(db); /* the last close checkpoints the WAL into the file */
    char path[1024];
    db_path(path, sizeof path);
    FILE *f = fopen(path, "r+b");
    ASSERT_TRUE(f != NULL);
    ASSERT_EQ(fseek(f, 4096 + 100, SEEK_SET), 0);
    unsigned char junk[4096];
    memset(junk, 0xA5, sizeof junk);
    ASSERT_EQ(fwrite(junk, 1, sizeof junk, f), sizeof junk);
    fclose(f);
    expect_recovered();
}

LJ_TEST(truncated)
{
    env_setup();
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    for (int b = 0; b < 200; b++) {
        char bucket[32];
        snprintf(bucket, sizeof bucket, "bucket %d", b);
        lj_tune_id id = make_id("NVIDIA H200", 90, bucket);
        record_three(db, &id);
    }
    lj_tunedb_close(db);
    char path[1024];
    db_path(path, sizeof path);
    struct stat sb;
    ASSERT_EQ(stat(path, &sb), 0);
    ASSERT_TRUE(sb.st_size > 8 * 4096);
    ASSERT_EQ(truncate(path, sb.st_size / 2), 0);
    expect_recovered();
}

LJ_TEST(empty_file)
{
    /* A zero-length file is simply a new database (SQLite's own convention), not damage. */
    mkdir(dir(), 0700);
    char path[1024];
    db_path(path, sizeof path);
    write_file(path, "", 0);
    env_setup();
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    ASSERT_EQ(logs.warnings, 0);
    lj_tunedb_close(db);
}

/* A database from a later lajit is read, never moved aside (the later lajit still needs it):
 * winners are served, `lajit db show` lists them, writes are refused with a message. */
LJ_TEST(future_version_read_only_never_moved)
{
    env_setup();
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    lj_tune_id id = make_id("NVIDIA H200", 90, "old");
    record_three(db, &id);
    lj_tunedb_close(db);
    char path[1024];
    db_path(path, sizeof path);
    sqlite3 *s;
    ASSERT_EQ(sqlite3_open(path, &s), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(s, "PRAGMA user_version = 99", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(s);
    for (int round = 0; round < 2; round++) {
        env_setup();
        ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
        ASSERT_CONTAINS(logs.text, "later lajit");
        ASSERT_EQ(count_files("tune.db.corrupt-"), 0);
        expect_winner(db, &id, "BLOCK=64 WARPS=8");
        int shown = 0;
        ASSERT_OK(lj_tunedb_show(db, count_shown, &shown));
        ASSERT_EQ(shown, 1);
        lj_tune_result r = ok_result("BLOCK=32 WARPS=4", 0.5);
        ASSERT_STATUS(lj_tunedb_record(db, &id, &r, 1, NULL, -1), LAJIT_ERR_DATABASE);
        ASSERT_CONTAINS(env.errmsg, "read-only");
        ASSERT_CONTAINS(env.errmsg, "later lajit");
        int got = 1;
        ASSERT_STATUS(lj_tunedb_lease(db, &id, 60, &got), LAJIT_ERR_DATABASE);
        ASSERT_EQ(got, 0);
        lj_tunedb_close(db);
    }
    ASSERT_EQ(sqlite3_open(path, &s), SQLITE_OK);
    sqlite3_stmt *st;
    ASSERT_EQ(sqlite3_prepare_v2(s, "PRAGMA user_version", -1, &st, NULL), SQLITE_OK);
    ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
    ASSERT_EQ(sqlite3_column_int(st, 0), 99);
    sqlite3_finalize(st);
    sqlite3_close(s);
}

/* A tune.db this process cannot write (file and directory read-only) is still read. As root,
 * the check runs in a child that gives up root for an ordinary user owning the files (root
 * ignores permissions). */
LJ_TEST(read_only_database_is_read)
{
    env_setup();
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    lj_tune_id id = make_id("NVIDIA H200", 90, "ro");
    record_three(db, &id);
    lj_tunedb_close(db);
    char path[1024];
    db_path(path, sizeof path);
    uid_t user = geteuid() == 0 ? 65534 : geteuid();
    if (geteuid() == 0) {
        char cmd[2200];
        snprintf(cmd, sizeof cmd, "chown -R %d:%d '%s'", (int)user, (int)user, dir());
        ASSERT_EQ(system(cmd), 0);
        ASSERT_EQ(chmod(lj_test_tmpdir(), 0755), 0);
    }
    ASSERT_EQ(chmod(path, 0400), 0);
    ASSERT_EQ(chmod(dir(), 0500), 0);
    fflush(NULL);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        if (geteuid() == 0 && (setgid(user) != 0 || setuid(user) != 0))
            _exit(2);
        env_setup();
        lj_tunedb *rdb;
        if (lj_tunedb_open(&env, dir(), &rdb) != LAJIT_OK) {
            fprintf(stderr, "open: %s\n", env.errmsg);
            _exit(3);
        }
        char cfg[256];
        int found = 0;
        if (lj_tunedb_winner(rdb, &id, cfg, sizeof cfg, NULL, &found) != LAJIT_OK || !found ||
            strcmp(cfg, "BLOCK=64 WARPS=8") != 0) {
            fprintf(stderr, "winner: %s\n", env.errmsg);
            _exit(4);
        }
        lj_tune_result r = ok_result("BLOCK=32 WARPS=4", 0.5);
        if (lj_tunedb_record(rdb, &id, &r, 1, NULL, -1) != LAJIT_ERR_DATABASE ||
            !strstr(env.errmsg, "read-only"))
            _exit(5);
        lj_tunedb_close(rdb);
        _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    chmod(dir(), 0700);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0);
    ASSERT_EQ(count_files("tune.db.corrupt-"), 0);
}

LJ_TEST(foreign_sqlite_file)
{
    mkdir(dir(), 0700);
    char path[1024];
    db_path(path, sizeof path);
    sqlite3 *s;
    ASSERT_EQ(sqlite3_open(path, &s), SQLITE_OK);
    ASSERT_EQ(
        sqlite3_exec(s, "CREATE TABLE winners(x); INSERT INTO winners VALUES(1)", NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(s);
    expect_recovered();
}

LJ_TEST(migration_from_version_0)
{
    /* An empty SQLite database (version 0, no tables) is migrated in place, not set aside. */
    mkdir(dir(), 0700);
    char path[1024];
    db_path(path, sizeof path);
    sqlite3 *s;
    ASSERT_EQ(sqlite3_open(path, &s), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(s, "PRAGMA page_size = 4096; VACUUM", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(s);
    env_setup();
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    ASSERT_EQ(logs.warnings, 0);
    ASSERT_EQ(count_files("tune.db.corrupt-"), 0);
    lj_tunedb_close(db);
}

LJ_TEST(directory_unwritable)
{
    env_setup();
    lj_tunedb *db = (lj_tunedb *)(uintptr_t)1;
    /* A "directory" that is a regular file (works as root too). */
    char blocked[1024];
    snprintf(blocked, sizeof blocked, "%s/blocked", lj_test_tmpdir());
    write_file(blocked, "x", 1);
    ASSERT_STATUS(lj_tunedb_open(&env, blocked, &db), LAJIT_ERR_DATABASE);
    ASSERT_TRUE(db == (lj_tunedb *)(uintptr_t)1); /* untouched on failure */
    ASSERT_CONTAINS(env.errmsg, "tune.db");
    char sub[1100];
    snprintf(sub, sizeof sub, "%s/sub/dir", blocked);
    ASSERT_STATUS(lj_tunedb_open(&env, sub, &db), LAJIT_ERR_DATABASE);
    ASSERT_STATUS(lj_tunedb_open(&env, NULL, &db), LAJIT_ERR_DATABASE);
    ASSERT_EQ(count_files("tune.db"), 0);
    if (geteuid() == 0)
        return; /* root ignores directory permissions */
    ASSERT_EQ(mkdir(dir(), 0500), 0);
    ASSERT_STATUS(lj_tunedb_open(&env, dir(), &db), LAJIT_ERR_DATABASE);
    ASSERT_TRUE(db == (lj_tunedb *)(uintptr_t)1);
    chmod(dir(), 0700);
}

LJ_TEST(export_import)
{
    env_setup();
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    lj_tune_id a = make_id("NVIDIA H200", 90, "bucket \"quoted\"\\ a");
    lj_tune_id b = make_id("NVIDIA H200", 90, "bucket b");
    record_three(db, &a);
    record_three(db, &b);
    char file[1024];
    snprintf(file, sizeof file, "%s/export.jsonl", lj_test_tmpdir());
    int rows = 0;
    ASSERT_OK(lj_tunedb_export(db, file, &rows));
    ASSERT_EQ(rows, 8); /* 2 x (3 measurements + 1 winner) */
    lj_tunedb_close(db);

    /* Into a second database (another cache directory), for the same device. */
    char other[1024];
    snprintf(other, sizeof other, "%s/other", lj_test_tmpdir());
    ASSERT_OK(lj_tunedb_open(&env, other, &db));
    lj_fingerprint local = a.fp;
    local.driver = 12080; /* another driver on the same GPU model: accepted */
    ASSERT_OK(lj_tunedb_import(db, file, &local, 0, &rows));
    ASSERT_EQ(rows, 8);
    expect_winner(db, &a, "BLOCK=64 WARPS=8");
    expect_winner(db, &b, "BLOCK=64 WARPS=8");
    lj_tune_result *r;
    int n;
    ASSERT_OK(lj_tunedb_results(db, &a, &r, &n));
    ASSERT_EQ(n, 3);
    ASSERT_STREQ(r[2].failure, "CUDA_ERROR_ILLEGAL_ADDRESS");
    lj_free(&env, r);
    /* The re-export is identical: nothing was lost or changed. */
    char again[1024];
    snprintf(again, sizeof again, "%s/again.jsonl", lj_test_tmpdir());
    ASSERT_OK(lj_tunedb_export(db, again, &rows));
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", file, again);
    ASSERT_EQ(system(cmd), 0);
    lj_tunedb_close(db);

    /* Another GPU: refused, nothing imported; forced: imported. */
    char third[1024];
    snprintf(third, sizeof third, "%s/third", lj_test_tmpdir());
    ASSERT_OK(lj_tunedb_open(&env, third, &db));
    lj_fingerprint h100 = a.fp;
    snprintf(h100.name, sizeof h100.name, "NVIDIA H100 80GB HBM3");
    ASSERT_STATUS(lj_tunedb_import(db, file, &h100, 0, &rows), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(env.errmsg, "force");
    expect_no_winner(db, &a);
    lj_fingerprint sm80 = a.fp;
    sm80.cc = 80;
    ASSERT_STATUS(lj_tunedb_import(db, file, &sm80, 0, &rows), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(lj_tunedb_import(db, file, NULL, 0, &rows), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_OK(lj_tunedb_import(db, file, &h100, 1, &rows));
    expect_winner(db, &a, "BLOCK=64 WARPS=8");
    lj_tunedb_close(db);
}

LJ_TEST(import_rejects_malformed)
{
    env_setup();
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    char file[1024];
    snprintf(file, sizeof file, "%s/bad.jsonl", lj_test_tmpdir());
    const char *bad[] = {
        "not json\n",
        "{\"kind\":\"winner\",\"device\":\"x\"}\n",
        "{\"kind\":\"winner\",\"device\":\"NVIDIA H200\",\"cc\":90,\"sms\":132,\"driver\":1,"
        "\"nvrtc\":1,\"family\":\"f\",\"template_hash\":\"h\",\"bucket\":\"b\",\"config\":\"c\"}\n",
        "{\"kind\":\"what\",\"device\":\"NVIDIA H200\",\"cc\":90,\"sms\":132,\"driver\":1,"
        "\"nvrtc\":1,\"family\":\"f\",\"template_hash\":\"h\",\"bucket\":\"b\",\"config\":\"c\","
        "\"ms\":1}\n",
        "{\"kind\":\"measurement\",\"device\":\"NVIDIA H200\",\"cc\":90,\"sms\":132,\"driver\":1,"
        "\"nvrtc\":1,\"family\":\"f\",\"template_hash\":\"h\",\"bucket\":\"b\",\"config\":\"c\","
        "\"ms\":1} trailing\n",
    };
    lj_fingerprint local = make_id("NVIDIA H200", 90, "").fp;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(file, bad[i], strlen(bad[i]));
        int rows = -1;
        ASSERT_STATUS(lj_tunedb_import(db, file, &local, 1, &rows), LAJIT_ERR_INVALID_ARGUMENT);
        ASSERT_EQ(rows, -1);
    }
    int rows;
    ASSERT_STATUS(lj_tunedb_import(db, "/nonexistent/file", &local, 1, &rows), LAJIT_ERR_IO);
    lj_tunedb_close(db);
}

/* ---- Trust: tune.db follows the kernel cache's rules ------------------------------------------ */

/* A directory others can write: refused before anything is created in it. */
LJ_TEST(shared_directory_refused)
{
    env_setup();
    ASSERT_EQ(mkdir(dir(), 0700), 0);
    ASSERT_EQ(chmod(dir(), 0777), 0);
    lj_tunedb *db = NULL;
    ASSERT_STATUS(lj_tunedb_open(&env, dir(), &db), LAJIT_ERR_DATABASE);
    ASSERT_CONTAINS(env.errmsg, "writable by group or others");
    ASSERT_EQ(count_files("tune.db"), 0);
    chmod(dir(), 0700);
}

/* A link planted as the lock file: never followed, so no file is created where it points. */
LJ_TEST(planted_lock_link_refused)
{
    env_setup();
    ASSERT_EQ(mkdir(dir(), 0700), 0);
    char target[1024], lock[1100];
    snprintf(target, sizeof target, "%s/outside", lj_test_tmpdir());
    snprintf(lock, sizeof lock, "%s/tune.db.lock", dir());
    ASSERT_EQ(symlink(target, lock), 0);
    lj_tunedb *db = NULL;
    ASSERT_STATUS(lj_tunedb_open(&env, dir(), &db), LAJIT_ERR_DATABASE);
    ASSERT_CONTAINS(env.errmsg, "symbolic link");
    ASSERT_TRUE(access(target, F_OK) != 0);
}

/* A link planted as tune.db, to a database with a winner of the planter's choosing: refused,
 * its winner never read, the file it points at never written. */
LJ_TEST(planted_database_link_refused)
{
    env_setup();
    char elsewhere[1024];
    snprintf(elsewhere, sizeof elsewhere, "%s/planted", lj_test_tmpdir());
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, elsewhere, &db));
    lj_tune_id id = make_id("NVIDIA H200", 90, "planted");
    record_three(db, &id);
    lj_tunedb_close(db);
    char real[1100], link[1100];
    snprintf(real, sizeof real, "%s/tune.db", elsewhere);
    snprintf(link, sizeof link, "%s/tune.db", dir());
    ASSERT_EQ(mkdir(dir(), 0700), 0);
    ASSERT_EQ(symlink(real, link), 0);
    struct stat before, after;
    ASSERT_EQ(stat(real, &before), 0);
    ASSERT_STATUS(lj_tunedb_open(&env, dir(), &db), LAJIT_ERR_DATABASE);
    ASSERT_CONTAINS(env.errmsg, "symbolic link");
    ASSERT_EQ(stat(real, &after), 0);
    ASSERT_EQ(before.st_mtime, after.st_mtime);
    ASSERT_EQ(before.st_size, after.st_size);
}

/* A database file others could have written (mode 0666): refused, not read. */
LJ_TEST(group_writable_database_refused)
{
    env_setup();
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    lj_tune_id id = make_id("NVIDIA H200", 90, "b");
    record_three(db, &id);
    lj_tunedb_close(db);
    char path[1024];
    db_path(path, sizeof path);
    ASSERT_EQ(chmod(path, 0666), 0);
    ASSERT_STATUS(lj_tunedb_open(&env, dir(), &db), LAJIT_ERR_DATABASE);
    ASSERT_CONTAINS(env.errmsg, "writable by group or others");
    ASSERT_EQ(count_files("tune.db.corrupt-"), 0);
}

/* ---- Import of hostile lines ------------------------------------------------------------------ */

/* Each line after a good first one must be refused, naming line 2, with nothing imported. */
LJ_TEST(import_refuses_hostile_values)
{
    env_setup();
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    char file[1024];
    snprintf(file, sizeof file, "%s/hostile.jsonl", lj_test_tmpdir());
#define ROW(fields)                                                               \
    "{\"kind\":\"measurement\",\"device\":\"NVIDIA H200\",\"cc\":90,\"sms\":132," \
    "\"driver\":13000,\"nvrtc\":12080,\"family\":\"la_fwd\",\"template_hash\":"   \
    "\"0123456789abcdef\",\"bucket\":\"b\"," fields "}\n"
    const char *good = ROW("\"config\":\"BLOCK=64\",\"ms\":1.5,\"at\":100");
    const char *bad[] = {
        /* a \u escape at the very end of a line (the old parser read past the buffer) */
        "{\"kind\":\"measurement\",\"device\":\"\\u",
        "{\"kind\":\"measurement\",\"device\":\"\\u00",
        ROW("\"config\":\"BLOCK=64\\u0000 WARPS=8\",\"ms\":1.5"),
        ROW("\"config\":\"BLOCK=64\",\"ms\":1e999"),
        ROW("\"config\":\"BLOCK=64\",\"ms\":-5"),
        ROW("\"config\":\"BLOCK=64\",\"ms\":\"1.5\""),
        ROW("\"config\":\"BLOCK=64\",\"ms\":1.5,\"at\":1e300"),
        ROW("\"config\":\"BLOCK=64\",\"ms\":1.5,\"at\":-1"),
        ROW("\"config\":\"BLOCK=64\",\"ms\":1.5,\"extra\":1"),
        ROW("\"config\":\"BLOCK=64\",\"ms\":1.5,\"ms\":2"),
        ROW("\"config\":\"BLOCK=64\",\"ms\":1.5,\"default_config\":\"x\""),
        ROW("\"config\":\"\",\"ms\":1.5"),
        ROW("\"config\":null,\"ms\":1.5"),
        "{\"kind\":\"measurement\",\"device\":\"NVIDIA H200\",\"cc\":1e300,\"sms\":132,"
        "\"driver\":13000,\"nvrtc\":12080,\"family\":\"la_fwd\",\"template_hash\":\"h\","
        "\"bucket\":\"b\",\"config\":\"c\",\"ms\":1}\n",
        "{\"kind\":\"measurement\",\"device\":\"NVIDIA H200\",\"cc\":90.5,\"sms\":132,"
        "\"driver\":13000,\"nvrtc\":12080,\"family\":\"la_fwd\",\"template_hash\":\"h\","
        "\"bucket\":\"b\",\"config\":\"c\",\"ms\":1}\n",
        "{\"kind\":\"measurement\",\"device\":\"NVIDIA H200\",\"cc\":90,\"sms\":132,"
        "\"driver\":99999999999,\"nvrtc\":12080,\"family\":\"la_fwd\",\"template_hash\":\"h\","
        "\"bucket\":\"b\",\"config\":\"c\",\"ms\":1}\n",
        "{\"kind\":\"measurement\",\"device\":\"NVIDIA H200\",\"cc\":90,\"sms\":132,"
        "\"driver\":13000,\"nvrtc\":12080,\"family\":\"la_fwd\",\"template_hash\":"
        "\"0123456789abcdef0\",\"bucket\":\"b\",\"config\":\"c\",\"ms\":1}\n",
        "[1,2,3]\n",
    };
#undef ROW
    lj_fingerprint local = make_id("NVIDIA H200", 90, "").fp;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[4096];
        snprintf(text, sizeof text, "%s%s", good, bad[i]);
        write_file(file, text, strlen(text));
        int rows = -1;
        lajit_status st = lj_tunedb_import(db, file, &local, 1, &rows);
        if (st != LAJIT_ERR_INVALID_ARGUMENT)
            lj_test_fail(__FILE__, __LINE__, "line %zu accepted (%s): %s", i,
                         lajit_status_string(st), bad[i]);
        ASSERT_EQ(rows, -1);
        ASSERT_CONTAINS(env.errmsg, "hostile.jsonl:2:");
    }
    /* Nothing of any refused file was imported: not even the good first line. */
    int shown = 0;
    ASSERT_OK(lj_tunedb_show(db, count_shown, &shown));
    ASSERT_EQ(shown, 0);
    lj_tune_result *r;
    int n = -1;
    lj_tune_id id = make_id("NVIDIA H200", 90, "b");
    ASSERT_OK(lj_tunedb_results(db, &id, &r, &n));
    ASSERT_EQ(n, 0);
    lj_free(&env, r);
    /* The good line alone is accepted. */
    write_file(file, good, strlen(good));
    int rows = 0;
    ASSERT_OK(lj_tunedb_import(db, file, &local, 1, &rows));
    ASSERT_EQ(rows, 1);
    lj_tunedb_close(db);
}

/* A measurement holds exactly one result: a time (finite, >= 0) or a non-empty failure text.
 * The importer once took `"failure":""` with no time, stored NULL/NULL and exported it as
 * `"ms":null,"failure":null`, which it then refused: `lajit db export` wrote a file `lajit db
 * import` rejects (tests/fuzz: measurement_without_result). Both at once lost the time. */
LJ_TEST(import_measurement_needs_one_result)
{
    env_setup();
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir(), &db));
    char file[1024];
    snprintf(file, sizeof file, "%s/results.jsonl", lj_test_tmpdir());
#define ROW(fields)                                                               \
    "{\"kind\":\"measurement\",\"device\":\"NVIDIA H200\",\"cc\":90,\"sms\":132," \
    "\"driver\":13000,\"nvrtc\":12080,\"family\":\"la_fwd\",\"template_hash\":"   \
    "\"0123456789abcdef\",\"bucket\":\"b\",\"config\":\"BLOCK=64\"," fields "}\n"
    const char *bad[] = {
        ROW("\"failure\":\"\""),
        ROW("\"ms\":null,\"failure\":\"\""),
        ROW("\"ms\":1.5,\"failure\":\"\""),
        ROW("\"ms\":1.5,\"failure\":\"CUDA_ERROR_ILLEGAL_ADDRESS\""),
        ROW("\"ms\":null,\"failure\":null"),
        ROW("\"at\":100"),
    };
    const char *good[] = {
        ROW("\"ms\":1.5"),
        ROW("\"ms\":0,\"failure\":null"),
        ROW("\"failure\":\"CUDA_ERROR_ILLEGAL_ADDRESS\""),
        ROW("\"ms\":null,\"failure\":\"too many registers\""),
    };
#undef ROW
    lj_fingerprint local = make_id("NVIDIA H200", 90, "").fp;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(file, bad[i], strlen(bad[i]));
        int rows = -1;
        lajit_status st = lj_tunedb_import(db, file, &local, 1, &rows);
        if (st != LAJIT_ERR_INVALID_ARGUMENT)
            lj_test_fail(__FILE__, __LINE__, "line accepted (%s): %s", lajit_status_string(st),
                         bad[i]);
        ASSERT_CONTAINS(env.errmsg, "results.jsonl:1:");
    }
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        write_file(file, good[i], strlen(good[i]));
        int rows = -1;
        ASSERT_OK(lj_tunedb_import(db, file, &local, 1, &rows));
        ASSERT_EQ(rows, 1);
        /* What was accepted exports to a file that imports again. */
        char out[1024];
        snprintf(out, sizeof out, "%s/export.jsonl", lj_test_tmpdir());
        ASSERT_OK(lj_tunedb_export(db, out, &rows));
        ASSERT_OK(lj_tunedb_import(db, out, &local, 1, &rows));
    }
    lj_tunedb_close(db);
}
