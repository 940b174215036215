/* tunedb_open.c — opening the tuning database (tunedb.h): the trust checks of its directory and
 * files, the read-write or read-only connection, schema migrations, and setting a damaged file
 * aside.
 *
 * Opening runs the migrations from the file's user_version up to LJ_TUNEDB_SCHEMA inside one
 * BEGIN IMMEDIATE transaction, so two processes creating the file at once agree. Every query
 * that can meet a damaged file checks its result; a damaged file found at open is set aside
 * under a lock file so that two processes finding it at once do not set aside each other's
 * fresh replacement.
 *
 * Trust: a winner chooses which kernel runs, so the directory, the database, its WAL and
 * shared-memory files and the lock file must pass the kernel cache's trust rules (core/fs.h:
 * ours, writable by nobody else, no links). A database this process cannot write (file or
 * directory read-only, or a schema from a later lajit) is opened read-only: winners are served,
 * writes are refused with a message, and nothing is ever set aside. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fs.h"
#include "tunedb_int.h"

#define APPLICATION_ID  0x6c616a74 /* 'lajt' */
#define BUSY_TIMEOUT_MS 30000

/* One integer from a query (PRAGMA user_version). */
static int query_int(lj_tunedb *t, const char *sql, int *out)
{
    sqlite3_stmt *s;
    int rc = prepare(t, sql, &s);
    if (rc != SQLITE_OK)
        return rc;
    rc = step(t, s);
    if (rc == SQLITE_ROW) {
        *out = sqlite3_column_int(s, 0);
        rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
        rc = SQLITE_CORRUPT; /* a pragma that answers no row: not SQLite as we know it */
    }
    sqlite3_finalize(s);
    return rc;
}

/* ---- Schema and migrations ------------------------------------------------------------------- */

/* Each step moves a database from version i to i + 1. Steps are never edited once released: a
 * new schema is a new step, so every older file reaches the current version. */
static const char *const migrations[] = {
    /* 0 -> 1 */
    "CREATE TABLE devices(id INTEGER PRIMARY KEY, name TEXT NOT NULL, cc INTEGER NOT NULL,"
    "  sms INTEGER NOT NULL, driver INTEGER NOT NULL, nvrtc INTEGER NOT NULL,"
    "  UNIQUE(name, cc, sms, driver, nvrtc));"
    "CREATE TABLE measurements(device INTEGER NOT NULL REFERENCES devices(id),"
    "  family TEXT NOT NULL, template_hash TEXT NOT NULL, bucket TEXT NOT NULL,"
    "  config TEXT NOT NULL, ms REAL, failure TEXT, at INTEGER NOT NULL,"
    "  PRIMARY KEY(device, family, template_hash, bucket, config));"
    "CREATE TABLE winners(device INTEGER NOT NULL REFERENCES devices(id),"
    "  family TEXT NOT NULL, template_hash TEXT NOT NULL, bucket TEXT NOT NULL,"
    "  config TEXT NOT NULL, ms REAL NOT NULL, default_config TEXT, default_ms REAL,"
    "  at INTEGER NOT NULL, PRIMARY KEY(device, family, template_hash, bucket));"
    "CREATE TABLE leases(lease_key TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL,"
    "  expires INTEGER NOT NULL);",
};
#define N_MIGRATIONS ((int)(sizeof migrations / sizeof migrations[0]))

typedef enum open_result {
    OPEN_OK,
    OPEN_DAMAGED,     /* not a usable lajit database: may be set aside */
    OPEN_UNAVAILABLE, /* cannot be used now (I/O error, locked, read-only and not migrated) */
    OPEN_FUTURE       /* a schema from a later lajit: to be opened read-only, never set aside */
} open_result;

/* SQLite result codes that mean the file is not a usable lajit database (as opposed to "cannot
 * reach it now"). */
static int damaged_code(int rc)
{
    rc &= 0xff;
    return rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB || rc == SQLITE_FORMAT ||
           rc == SQLITE_SCHEMA;
}

static open_result failed(lj_tunedb *t, int rc, const char *what, char *why, size_t cap)
{
    snprintf(why, cap, "%s%s%s", what, *what ? ": " : "", lj_sql_errmsg(&t->sql));
    return damaged_code(rc) ? OPEN_DAMAGED : OPEN_UNAVAILABLE;
}

/* Reads the schema version, application id and table count. */
static int read_identity(lj_tunedb *t, int *version, int *app, int *tables)
{
    int rc = query_int(t, "PRAGMA user_version", version);
    if (rc == SQLITE_OK)
        rc = query_int(t, "PRAGMA application_id", app);
    if (rc == SQLITE_OK)
        rc = query_int(t, "SELECT count(*) FROM sqlite_schema", tables);
    return rc;
}

/* What the identity says, apart from migrations: OPEN_OK when the file is ours (or empty). */
static open_result judge_identity(int version, int app, int tables, char *why, size_t cap)
{
    if (version > LJ_TUNEDB_SCHEMA) {
        snprintf(why, cap, "schema version %d is from a later lajit (this one knows %d)", version,
                 LJ_TUNEDB_SCHEMA);
        return OPEN_FUTURE;
    }
    if (app != APPLICATION_ID && (app != 0 || tables != 0)) {
        snprintf(why, cap, "not a lajit tuning database (application_id 0x%x, %d tables)", app,
                 tables);
        return OPEN_DAMAGED;
    }
    return OPEN_OK;
}

/* Brings the schema to LJ_TUNEDB_SCHEMA. why receives a reason when the file is damaged or
 * foreign. */
static open_result migrate(lj_tunedb *t, char *why, size_t cap)
{
    int rc = exec(t, "BEGIN IMMEDIATE");
    if (rc != SQLITE_OK)
        return failed(t, rc, "BEGIN", why, cap);
    int version = 0, app = 0, tables = 0;
    open_result res = OPEN_OK;
    rc = read_identity(t, &version, &app, &tables);
    if (rc != SQLITE_OK)
        res = failed(t, rc, "", why, cap);
    else
        res = judge_identity(version, app, tables, why, cap);
    for (int v = version; v < N_MIGRATIONS && res == OPEN_OK; v++) {
        if ((rc = exec(t, migrations[v])) != SQLITE_OK) {
            char what[64];
            snprintf(what, sizeof what, "migration %d -> %d", v, v + 1);
            res = failed(t, rc, what, why, cap);
        }
    }
    if (res == OPEN_OK && version < N_MIGRATIONS) {
        char sql[96];
        snprintf(sql, sizeof sql, "PRAGMA user_version = %d; PRAGMA application_id = %d",
                 N_MIGRATIONS, APPLICATION_ID);
        if ((rc = exec(t, sql)) != SQLITE_OK) {
            failed(t, rc, "", why, cap);
            res = OPEN_UNAVAILABLE;
        }
    }
    if (res == OPEN_OK && (rc = exec(t, "COMMIT")) != SQLITE_OK)
        res = failed(t, rc, "COMMIT", why, cap);
    if (res != OPEN_OK)
        exec(t, "ROLLBACK");
    return res;
}

/* The checks of a read-only open: the identity read without writing anything. */
static open_result check_readonly(lj_tunedb *t, char *why, size_t cap)
{
    int version = 0, app = 0, tables = 0;
    int rc = read_identity(t, &version, &app, &tables);
    if (rc != SQLITE_OK)
        return failed(t, rc, "", why, cap);
    open_result r = judge_identity(version, app, tables, why, cap);
    if (r == OPEN_FUTURE)
        return OPEN_OK; /* already read-only: its tables are read as they are */
    if (r != OPEN_OK)
        return OPEN_UNAVAILABLE; /* never set aside what we cannot write */
    if (version < N_MIGRATIONS) {
        snprintf(why, cap,
                 "schema version %d needs migrating to %d, and the database is "
                 "read-only (%.200s)",
                 version, N_MIGRATIONS, t->readonly_why);
        return OPEN_UNAVAILABLE;
    }
    return OPEN_OK;
}

/* Reads every page (the file is small), so damage is found here and not in the middle of an
 * op. */
static open_result quick_check(lj_tunedb *t, char *why, size_t cap)
{
    sqlite3_stmt *s;
    int rc = prepare(t, "PRAGMA quick_check", &s);
    if (rc == SQLITE_OK) {
        rc = step(t, s);
        if (rc == SQLITE_ROW) {
            const char *r = (const char *)sqlite3_column_text(s, 0);
            if (!r || strcmp(r, "ok") != 0) {
                snprintf(why, cap, "integrity: %.200s", r ? r : "?");
                sqlite3_finalize(s);
                return OPEN_DAMAGED;
            }
            rc = SQLITE_OK;
        }
    }
    sqlite3_finalize(s);
    return rc == SQLITE_OK ? OPEN_OK : failed(t, rc, "", why, cap);
}

/* Opens the connection read-write and checks the file: WAL, busy timeout, quick_check, schema. */
static open_result try_open(lj_tunedb *t, char *why, size_t cap)
{
    int rc = lj_sql_open(&t->sql, t->env, t->path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, 0);
    if (rc != SQLITE_OK)
        return failed(t, rc, "", why, cap);
    sqlite3_busy_timeout(t->sql.db, BUSY_TIMEOUT_MS);
    /* journal_mode answers a row ("wal"); a file that is not a database fails here. */
    sqlite3_stmt *s;
    rc = prepare(t, "PRAGMA journal_mode = WAL", &s);
    if (rc == SQLITE_OK) {
        rc = step(t, s);
        if (rc == SQLITE_ROW) {
            const char *mode = (const char *)sqlite3_column_text(s, 0);
            rc = mode && strcmp(mode, "wal") == 0 ? SQLITE_OK : SQLITE_CANTOPEN;
        }
        sqlite3_finalize(s);
    }
    if (rc == SQLITE_OK)
        rc = exec(t, "PRAGMA synchronous = NORMAL");
    if (rc != SQLITE_OK) {
        if (rc == SQLITE_CANTOPEN && !damaged_code(sqlite3_errcode(t->sql.db))) {
            snprintf(why, cap, "cannot use WAL mode here");
            return OPEN_UNAVAILABLE;
        }
        return failed(t, rc, "", why, cap);
    }
    open_result r = quick_check(t, why, cap);
    return r == OPEN_OK ? migrate(t, why, cap) : r;
}

/* Opens the connection read-only. A WAL database read where its shared-memory file cannot be
 * created needs SQLite's immutable mode (no locks: a concurrent writer's latest commits may not
 * be seen, which a read-only reader can live with). */
static open_result try_open_readonly(lj_tunedb *t, char *why, size_t cap)
{
    for (int immutable = 0; immutable < 2; immutable++) {
        char *uri = lj_sql_immutable_uri(t->env, t->path);
        if (!uri) {
            snprintf(why, cap, "out of host memory");
            return OPEN_UNAVAILABLE;
        }
        int rc = lj_sql_open(&t->sql, t->env, immutable ? uri : t->path,
                             SQLITE_OPEN_READONLY | (immutable ? SQLITE_OPEN_URI : 0), 0);
        lj_free(t->env, uri);
        open_result r = rc == SQLITE_OK ? OPEN_OK : failed(t, rc, "", why, cap);
        if (r == OPEN_OK) {
            sqlite3_busy_timeout(t->sql.db, BUSY_TIMEOUT_MS);
            r = quick_check(t, why, cap);
        }
        if (r == OPEN_OK)
            return check_readonly(t, why, cap);
        lj_sql_close(&t->sql);
        if (r == OPEN_DAMAGED || t->sql.injected)
            return OPEN_UNAVAILABLE; /* read-only: never set aside */
    }
    return OPEN_UNAVAILABLE;
}

/* Sets the damaged file aside, unless another process already replaced it since we looked
 * (inode changed). The caller holds the exclusive lock on tune.db.lock (open_lock), so two
 * processes recovering at once do not both move files. Returns 0 when the path is ready for a
 * fresh open. */
static int set_aside(lj_tunedb *t, int dir_fd, const struct stat *seen, const char *why)
{
    char aside[96];
    struct stat now;
    if (fstatat(dir_fd, "tune.db", &now, AT_SYMLINK_NOFOLLOW) != 0 || now.st_ino != seen->st_ino ||
        now.st_dev != seen->st_dev)
        return 0;
    snprintf(aside, sizeof aside, "tune.db.corrupt-%lld-%d", (long long)time(NULL), (int)getpid());
    if (lj_fs_renameat(t->env, dir_fd, "tune.db", dir_fd, aside) != 0)
        return -1;
    /* The journal files belong to the old file: a fresh database must not replay them. */
    static const char *const suffixes[] = {"-wal", "-shm", "-journal"};
    for (int i = 0; i < 3; i++) {
        char side[32], side_aside[128];
        snprintf(side, sizeof side, "tune.db%s", suffixes[i]);
        snprintf(side_aside, sizeof side_aside, "%s%s", aside, suffixes[i]);
        lj_fs_renameat(t->env, dir_fd, side, dir_fd, side_aside);
    }
    lj_log(t->env, LAJIT_LOG_WARN,
           "tuning database %s is unusable (%s): moved to %s beside it, "
           "starting a new one",
           t->path, why, aside);
    return 0;
}

/* Opening (creating the file, switching it to WAL, migrating the schema, setting a damaged file
 * aside) runs under an exclusive flock on tune.db.lock. SQLite's busy timeout does not cover
 * every lock taken while several connections create and convert a new file at the same moment
 * (8 processes saw "database is locked" at open); opens are rare, so serialising them is free.
 * The lock file is opened without following a link and must pass the trust checks, so a link
 * planted under its name never makes us create or write a file elsewhere. Returns the lock's
 * descriptor; -1 with *problem NULL when no lock could be had for an ordinary reason (opening
 * goes on without it), -1 with *problem set when the name is refused. */
static int open_lock(lj_env *env, int dir_fd, const char **problem)
{
    int fd = lj_fs_open_trusted_at(env, dir_fd, "tune.db.lock", O_RDWR | O_CREAT, 0600, problem);
    if (fd < 0) {
        if (errno == EACCES || errno == EROFS) {
            lj_log(env, LAJIT_LOG_WARN,
                   "tuning database: cannot open its lock file "
                   "tune.db.lock (%s); opening without it",
                   *problem);
            *problem = NULL;
        }
        return -1;
    }
    if (lj_fs_flock(env, fd, LOCK_EX) != 0) {
        lj_log(env, LAJIT_LOG_WARN,
               "tuning database: cannot lock tune.db.lock (%s); opening "
               "without it",
               strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* The directory, created when missing and checked like the kernel cache's. Returns its
 * descriptor or -1 with a message recorded. */
static int open_dir(lj_tunedb *t, const char *dir)
{
    const char *problem;
    unsigned mode = 0;
    int fd = lj_fs_open_trusted_dir(t->env, dir, &problem, &mode);
    if (fd < 0 && errno == ENOENT) {
        if (!lj_fs_mkdir_p(t->env, dir)) {
            lj_error(t->env, LAJIT_ERR_DATABASE,
                     "tuning database %s unavailable: cannot create "
                     "%s: %s",
                     t->path, dir, strerror(errno));
            return -1;
        }
        fd = lj_fs_open_trusted_dir(t->env, dir, &problem, &mode);
    }
    if (fd < 0 && errno == EPERM)
        lj_error(t->env, LAJIT_ERR_DATABASE,
                 "tuning database %s unavailable: directory %s "
                 "refused (%s, mode %03o)",
                 t->path, dir, problem, mode);
    else if (fd < 0)
        lj_error(t->env, LAJIT_ERR_DATABASE,
                 "tuning database %s unavailable: cannot open "
                 "directory %s: %s",
                 t->path, dir, problem);
    return fd;
}

/* Checks the database and its side files by name without following links. Returns 1 when
 * tune.db exists, 0 when not, -1 (message recorded) when one of them is refused. */
static int check_files(lj_tunedb *t, int dir_fd)
{
    static const char *const names[] = {"tune.db", "tune.db-wal", "tune.db-shm", "tune.db-journal"};
    int exists = 0;
    for (int i = 0; i < 4; i++) {
        const char *problem;
        int r = lj_fs_check_trusted_at(dir_fd, names[i], &problem);
        if (r < 0) {
            lj_error(t->env, LAJIT_ERR_DATABASE, "tuning database %s refused: %s is %s", t->path,
                     names[i], problem);
            return -1;
        }
        if (i == 0)
            exists = r == 0;
    }
    return exists;
}

lajit_status lj_tunedb_open(lj_env *env, const char *dir, lj_tunedb **out)
{
    if (!dir || !*dir)
        return lj_error(env, LAJIT_ERR_DATABASE, "no cache directory for the tuning database");
    lj_tunedb *t = lj_calloc(env, 1, sizeof *t);
    if (!t)
        return lj_oom(env);
    t->env = env;
    t->sql.env = env;
    size_t len = strlen(dir) + sizeof "/tune.db";
    if (!(t->path = lj_malloc(env, len))) {
        lj_free(env, t);
        return lj_oom(env);
    }
    snprintf(t->path, len, "%s/tune.db", dir);
    if (gethostname(t->host, sizeof t->host - 1) != 0)
        snprintf(t->host, sizeof t->host, "unknown");
    int dir_fd = open_dir(t, dir), lock = -1;
    int exists = dir_fd >= 0 ? check_files(t, dir_fd) : -1;
    if (exists < 0) {
        lj_tunedb_close(t);
        if (dir_fd >= 0)
            close(dir_fd);
        return LAJIT_ERR_DATABASE;
    }
    /* Read-only when this process cannot write the directory or the file. */
    if (faccessat(dir_fd, ".", W_OK, AT_EACCESS) != 0) {
        t->readonly = 1;
        snprintf(t->readonly_why, sizeof t->readonly_why, "directory %s is not writable", dir);
    } else if (exists && faccessat(dir_fd, "tune.db", W_OK, AT_EACCESS) != 0) {
        t->readonly = 1;
        snprintf(t->readonly_why, sizeof t->readonly_why, "%s is not writable", t->path);
    }
    lajit_status st = LAJIT_OK;
    char why[512] = "";
    if (t->readonly && !exists) {
        st = lj_error(env, LAJIT_ERR_DATABASE,
                      "tuning database %s unavailable: it does not "
                      "exist and cannot be created (%s)",
                      t->path, t->readonly_why);
    } else if (!t->readonly) {
        const char *problem = NULL;
        lock = open_lock(env, dir_fd, &problem);
        if (problem)
            st = lj_error(env, LAJIT_ERR_DATABASE,
                          "tuning database %s refused: its lock file "
                          "tune.db.lock is %s",
                          t->path, problem);
    }
    for (int attempt = 0; st == LAJIT_OK; attempt++) {
        why[0] = 0;
        struct stat seen;
        exists = fstatat(dir_fd, "tune.db", &seen, AT_SYMLINK_NOFOLLOW) == 0;
        open_result r =
            t->readonly ? try_open_readonly(t, why, sizeof why) : try_open(t, why, sizeof why);
        if (r == OPEN_OK)
            break;
        lj_sql_close(&t->sql);
        if (r == OPEN_FUTURE) {
            /* Never moved aside: a later lajit on this machine still needs it. */
            t->readonly = 1;
            snprintf(t->readonly_why, sizeof t->readonly_why, "%s", why);
            lj_log(env, LAJIT_LOG_WARN, "tuning database %s: %s; reading it, recording nothing",
                   t->path, why);
            continue;
        }
        if (r == OPEN_UNAVAILABLE || t->readonly || attempt == 2 || !exists)
            st = lj_error(env, LAJIT_ERR_DATABASE, "tuning database %s unavailable: %s", t->path,
                          why);
        else if (set_aside(t, dir_fd, &seen, why) != 0)
            st = lj_error(env, LAJIT_ERR_DATABASE,
                          "tuning database %s unavailable: %s; it "
                          "could not be set aside: %s",
                          t->path, why, strerror(errno));
    }
    if (lock >= 0)
        close(lock); /* releases the flock */
    if (dir_fd >= 0)
        close(dir_fd);
    if (st != LAJIT_OK) {
        lj_tunedb_close(t);
        return st;
    }
    *out = t;
    return LAJIT_OK;
}

lajit_status lj_tunedb_open_memory(lj_env *env, const char *label, lj_tunedb **out)
{
    lj_tunedb *t = lj_calloc(env, 1, sizeof *t);
    if (!t)
        return lj_oom(env);
    t->env = env;
    t->sql.env = env;
    if (!(t->path = lj_strdup(env, label && *label ? label : ":memory:"))) {
        lj_free(env, t);
        return lj_oom(env);
    }
    snprintf(t->host, sizeof t->host, "memory");
    char why[512] = "";
    int rc = lj_sql_open(&t->sql, env, ":memory:", SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, 0);
    open_result r =
        rc == SQLITE_OK ? migrate(t, why, sizeof why) : failed(t, rc, "", why, sizeof why);
    if (r != OPEN_OK) {
        lajit_status st =
            lj_error(env, LAJIT_ERR_DATABASE, "%s: no in-memory database: %s", t->path, why);
        lj_tunedb_close(t);
        return st;
    }
    *out = t;
    return LAJIT_OK;
}

void lj_tunedb_close(lj_tunedb *t)
{
    if (!t)
        return;
    lj_sql_close(&t->sql);
    lj_free(t->env, t->path);
    lj_free(t->env, t);
}

const char *lj_tunedb_path(const lj_tunedb *t)
{
    return t->path;
}
