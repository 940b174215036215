/* tunedb.c — the SQLite tuning database (tunedb.h): opening it safely, winners, measurements,
 * leases and the listing. Export and import live in tunedb_json.c.
 *
 * Schema (user_version 1, application_id 'lajt'):
 *   devices(id, name, cc, sms, driver, nvrtc)            one row per fingerprint
 *   measurements(device, family, template_hash, bucket, config, ms, failure, at)
 *   winners(device, family, template_hash, bucket, config, ms, default_config, default_ms, at)
 *   leases(lease_key, host, pid, expires)
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
#include "tunedb_int.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fs.h"
#include "key.h"

#define APPLICATION_ID 0x6c616a74 /* 'lajt' */
#define BUSY_TIMEOUT_MS 30000

void lj_fingerprint_make(const lj_device_info *info, int driver, int nvrtc_major,
                         int nvrtc_minor, lj_fingerprint *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", info->name);
    out->cc = info->cc;
    out->sms = info->sms;
    out->driver = driver;
    out->nvrtc = nvrtc_major * 1000 + nvrtc_minor * 10;
}

lajit_status lj_tune_template_hash(lj_env *env, lj_family *f, char out[17])
{
    char *text;
    size_t len;
    lajit_status st = lj_family_template_text(f, &text, &len);
    if (st != LAJIT_OK)
        return st;
    snprintf(out, 17, "%016llx", (unsigned long long)lj_hash64(text, len));
    lj_free(env, text);
    return LAJIT_OK;
}

/* ---- Errors ---------------------------------------------------------------------------------- */

lajit_status lj_tdb_error(lj_tunedb *t, const char *what)
{
    if (t->readonly)
        return lj_error(t->env, LAJIT_ERR_DATABASE, "%s: %s: %s (opened read-only: %s)", t->path,
                        what, lj_sql_errmsg(&t->sql), t->readonly_why);
    return lj_error(t->env, LAJIT_ERR_DATABASE, "%s: %s: %s", t->path, what,
                    lj_sql_errmsg(&t->sql));
}

lajit_status lj_tdb_writable(lj_tunedb *t, const char *what)
{
    if (!t->readonly)
        return LAJIT_OK;
    return lj_error(t->env, LAJIT_ERR_DATABASE, "%s: %s refused: the database is read-only (%s)",
                    t->path, what, t->readonly_why);
}

/* Short names for the wrappers of sql.h on this handle's connection. */
static int prepare(lj_tunedb *t, const char *sql, sqlite3_stmt **s)
{
    return lj_sql_prepare(&t->sql, sql, s);
}

static int step(lj_tunedb *t, sqlite3_stmt *s)
{
    return lj_sql_step(&t->sql, s);
}

static int exec(lj_tunedb *t, const char *sql)
{
    return lj_sql_exec(&t->sql, sql);
}

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
        snprintf(why, cap, "schema version %d needs migrating to %d, and the database is "
                 "read-only (%.200s)", version, N_MIGRATIONS, t->readonly_why);
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
    if (fstatat(dir_fd, "tune.db", &now, AT_SYMLINK_NOFOLLOW) != 0 ||
        now.st_ino != seen->st_ino || now.st_dev != seen->st_dev)
        return 0;
    snprintf(aside, sizeof aside, "tune.db.corrupt-%lld-%d", (long long)time(NULL),
             (int)getpid());
    if (renameat(dir_fd, "tune.db", dir_fd, aside) != 0)
        return -1;
    /* The journal files belong to the old file: a fresh database must not replay them. */
    static const char *const suffixes[] = {"-wal", "-shm", "-journal"};
    for (int i = 0; i < 3; i++) {
        char side[32], side_aside[128];
        snprintf(side, sizeof side, "tune.db%s", suffixes[i]);
        snprintf(side_aside, sizeof side_aside, "%s%s", aside, suffixes[i]);
        renameat(dir_fd, side, dir_fd, side_aside);
    }
    lj_log(t->env, LAJIT_LOG_WARN, "tuning database %s is unusable (%s): moved to %s beside it, "
           "starting a new one", t->path, why, aside);
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
static int open_lock(int dir_fd, const char **problem)
{
    int fd = lj_fs_open_trusted_at(dir_fd, "tune.db.lock", O_RDWR | O_CREAT, 0600, problem);
    if (fd < 0) {
        if (errno == EACCES || errno == EROFS)
            *problem = NULL;
        return -1;
    }
    if (flock(fd, LOCK_EX) != 0) {
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
    int fd = lj_fs_open_trusted_dir(dir, &problem, &mode);
    if (fd < 0 && errno == ENOENT) {
        if (!lj_fs_mkdir_p(t->env, dir)) {
            lj_error(t->env, LAJIT_ERR_DATABASE, "tuning database %s unavailable: cannot create "
                     "%s: %s", t->path, dir, strerror(errno));
            return -1;
        }
        fd = lj_fs_open_trusted_dir(dir, &problem, &mode);
    }
    if (fd < 0)
        lj_error(t->env, LAJIT_ERR_DATABASE, "tuning database %s unavailable: directory %s "
                 "refused (%s, mode %03o)", t->path, dir, problem, mode);
    return fd;
}

/* Checks the database and its side files by name without following links. Returns 1 when
 * tune.db exists, 0 when not, -1 (message recorded) when one of them is refused. */
static int check_files(lj_tunedb *t, int dir_fd)
{
    static const char *const names[] = {"tune.db", "tune.db-wal", "tune.db-shm",
                                        "tune.db-journal"};
    int exists = 0;
    for (int i = 0; i < 4; i++) {
        const char *problem;
        int r = lj_fs_check_trusted_at(dir_fd, names[i], &problem);
        if (r < 0) {
            lj_error(t->env, LAJIT_ERR_DATABASE, "tuning database %s refused: %s is %s",
                     t->path, names[i], problem);
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
        st = lj_error(env, LAJIT_ERR_DATABASE, "tuning database %s unavailable: it does not "
                      "exist and cannot be created (%s)", t->path, t->readonly_why);
    } else if (!t->readonly) {
        const char *problem = NULL;
        lock = open_lock(dir_fd, &problem);
        if (problem)
            st = lj_error(env, LAJIT_ERR_DATABASE, "tuning database %s refused: its lock file "
                          "tune.db.lock is %s", t->path, problem);
    }
    for (int attempt = 0; st == LAJIT_OK; attempt++) {
        why[0] = 0;
        struct stat seen;
        exists = fstatat(dir_fd, "tune.db", &seen, AT_SYMLINK_NOFOLLOW) == 0;
        open_result r = t->readonly ? try_open_readonly(t, why, sizeof why)
                                    : try_open(t, why, sizeof why);
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
        if (r == OPEN_UNAVAILABLE || t->readonly || attempt == 2 || !exists ||
            set_aside(t, dir_fd, &seen, why) != 0)
            st = lj_error(env, LAJIT_ERR_DATABASE, "tuning database %s unavailable: %s",
                          t->path, why);
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

/* ---- Devices --------------------------------------------------------------------------------- */

/* The id of fp's row; create = 1 adds it when missing (inside the caller's transaction).
 * *id = 0 when absent and not created. */
int lj_tdb_device_id(lj_tunedb *t, const lj_fingerprint *fp, int create, sqlite3_int64 *id)
{
    sqlite3_stmt *s;
    *id = 0;
    int rc = prepare(t, "SELECT id FROM devices WHERE name=?1 AND cc=?2 AND sms=?3 AND driver=?4"
                        " AND nvrtc=?5", &s);
    if (rc != SQLITE_OK)
        return rc;
    sqlite3_bind_text(s, 1, fp->name, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, fp->cc);
    sqlite3_bind_int(s, 3, fp->sms);
    sqlite3_bind_int(s, 4, fp->driver);
    sqlite3_bind_int(s, 5, fp->nvrtc);
    rc = step(t, s);
    if (rc == SQLITE_ROW) {
        *id = sqlite3_column_int64(s, 0);
        rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
        rc = SQLITE_OK;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_OK || *id || !create)
        return rc;
    rc = prepare(t, "INSERT INTO devices(name, cc, sms, driver, nvrtc) VALUES(?1,?2,?3,?4,?5)", &s);
    if (rc != SQLITE_OK)
        return rc;
    sqlite3_bind_text(s, 1, fp->name, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, fp->cc);
    sqlite3_bind_int(s, 3, fp->sms);
    sqlite3_bind_int(s, 4, fp->driver);
    sqlite3_bind_int(s, 5, fp->nvrtc);
    rc = step(t, s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return rc;
    *id = sqlite3_last_insert_rowid(t->sql.db);
    return SQLITE_OK;
}

void lj_tdb_bind_bucket(sqlite3_stmt *s, sqlite3_int64 dev, const lj_tune_id *id)
{
    sqlite3_bind_int64(s, 1, dev);
    sqlite3_bind_text(s, 2, id->family, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, id->template_hash, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, id->bucket, -1, SQLITE_STATIC);
}

/* ---- Winners and measurements ---------------------------------------------------------------- */

lajit_status lj_tunedb_winner(lj_tunedb *t, const lj_tune_id *id, char *config, size_t cap,
                              double *ms, int *found)
{
    *found = 0;
    sqlite3_stmt *s;
    /* One statement, so the read is one implicit transaction: no explicit BEGIN needed. */
    int rc = prepare(t, "SELECT w.config, w.ms FROM winners w JOIN devices d ON d.id = w.device"
                        " WHERE d.name=?1 AND d.cc=?2 AND d.sms=?3 AND d.driver=?4 AND d.nvrtc=?5"
                        " AND w.family=?6 AND w.template_hash=?7 AND w.bucket=?8", &s);
    if (rc != SQLITE_OK)
        return lj_tdb_error(t, "reading a winner");
    sqlite3_bind_text(s, 1, id->fp.name, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, id->fp.cc);
    sqlite3_bind_int(s, 3, id->fp.sms);
    sqlite3_bind_int(s, 4, id->fp.driver);
    sqlite3_bind_int(s, 5, id->fp.nvrtc);
    sqlite3_bind_text(s, 6, id->family, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 7, id->template_hash, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 8, id->bucket, -1, SQLITE_STATIC);
    rc = step(t, s);
    if (rc == SQLITE_ROW) {
        const char *c = (const char *)sqlite3_column_text(s, 0);
        snprintf(config, cap, "%s", c ? c : "");
        if (ms)
            *ms = sqlite3_column_double(s, 1);
        *found = 1;
        rc = SQLITE_DONE;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) {
        *found = 0;
        return lj_tdb_error(t, "reading a winner");
    }
    return LAJIT_OK;
}

/* Runs body inside BEGIN IMMEDIATE ... COMMIT, rolling back on failure. */
#define IN_TRANSACTION(t, what, body)                                  \
    do {                                                               \
        if (exec((t), "BEGIN IMMEDIATE") != SQLITE_OK)                 \
            return lj_tdb_error((t), what);                                \
        int ok_ = (body);                                              \
        if (ok_ && exec((t), "COMMIT") == SQLITE_OK)                   \
            return LAJIT_OK;                                           \
        lajit_status st_ = lj_tdb_error((t), what);                        \
        exec((t), "ROLLBACK");                                         \
        return st_;                                                    \
    } while (0)

static int record_body(lj_tunedb *t, const lj_tune_id *id, const lj_tune_result *r, int n,
                       const char *default_config, double default_ms)
{
    sqlite3_int64 dev;
    if (lj_tdb_device_id(t, &id->fp, 1, &dev) != SQLITE_OK)
        return 0;
    sqlite3_int64 now = (sqlite3_int64)time(NULL);
    sqlite3_stmt *s;
    if (prepare(t, "INSERT OR REPLACE INTO measurements VALUES(?1,?2,?3,?4,?5,?6,?7,?8)", &s) !=
        SQLITE_OK)
        return 0;
    int best = -1;
    for (int i = 0; i < n; i++) {
        sqlite3_reset(s);
        lj_tdb_bind_bucket(s, dev, id);
        sqlite3_bind_text(s, 5, r[i].config, -1, SQLITE_STATIC);
        int failed = r[i].failure[0] || !(r[i].ms >= 0) || !isfinite(r[i].ms);
        if (failed) {
            sqlite3_bind_null(s, 6);
            sqlite3_bind_text(s, 7, r[i].failure[0] ? r[i].failure : "no time", -1, SQLITE_STATIC);
        } else {
            sqlite3_bind_double(s, 6, r[i].ms);
            sqlite3_bind_null(s, 7);
            if (best < 0 || r[i].ms < r[best].ms)
                best = i;
        }
        sqlite3_bind_int64(s, 8, now);
        if (step(t, s) != SQLITE_DONE) {
            sqlite3_finalize(s);
            return 0;
        }
    }
    sqlite3_finalize(s);
    if (best < 0)
        return 1;
    if (prepare(t, "INSERT OR REPLACE INTO winners VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9)", &s) !=
        SQLITE_OK)
        return 0;
    lj_tdb_bind_bucket(s, dev, id);
    sqlite3_bind_text(s, 5, r[best].config, -1, SQLITE_STATIC);
    sqlite3_bind_double(s, 6, r[best].ms);
    if (default_config)
        sqlite3_bind_text(s, 7, default_config, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(s, 7);
    if (default_ms >= 0)
        sqlite3_bind_double(s, 8, default_ms);
    else
        sqlite3_bind_null(s, 8);
    sqlite3_bind_int64(s, 9, now);
    int rc = step(t, s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE;
}

lajit_status lj_tunedb_record(lj_tunedb *t, const lj_tune_id *id, const lj_tune_result *results,
                              int n, const char *default_config, double default_ms)
{
    lajit_status st = lj_tdb_writable(t, "recording measurements");
    if (st != LAJIT_OK)
        return st;
    IN_TRANSACTION(t, "recording measurements",
                   record_body(t, id, results, n, default_config, default_ms));
}

static int compare_results(const void *a, const void *b)
{
    const lj_tune_result *x = a, *y = b;
    int fx = x->failure[0] != 0, fy = y->failure[0] != 0;
    if (fx != fy)
        return fx - fy;
    if (!fx && x->ms != y->ms)
        return x->ms < y->ms ? -1 : 1;
    return strcmp(x->config, y->config);
}

lajit_status lj_tunedb_results(lj_tunedb *t, const lj_tune_id *id, lj_tune_result **out,
                               int *count)
{
    sqlite3_int64 dev;
    if (lj_tdb_device_id(t, &id->fp, 0, &dev) != SQLITE_OK)
        return lj_tdb_error(t, "reading measurements");
    sqlite3_stmt *s;
    if (prepare(t, "SELECT config, ms, failure FROM measurements WHERE device=?1 AND family=?2"
                   " AND template_hash=?3 AND bucket=?4", &s) != SQLITE_OK)
        return lj_tdb_error(t, "reading measurements");
    lj_tdb_bind_bucket(s, dev, id);
    lj_tune_result *r = NULL;
    int n = 0, cap = 0, rc;
    while ((rc = step(t, s)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            lj_tune_result *grown = lj_realloc(t->env, r, (size_t)cap * sizeof *r);
            if (!grown) {
                sqlite3_finalize(s);
                lj_free(t->env, r);
                return lj_oom(t->env);
            }
            r = grown;
        }
        lj_tune_result *x = &r[n++];
        memset(x, 0, sizeof *x);
        const char *c = (const char *)sqlite3_column_text(s, 0);
        snprintf(x->config, sizeof x->config, "%s", c ? c : "");
        x->ms = sqlite3_column_type(s, 1) == SQLITE_NULL ? -1 : sqlite3_column_double(s, 1);
        const char *f = (const char *)sqlite3_column_text(s, 2);
        snprintf(x->failure, sizeof x->failure, "%s", f ? f : "");
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) {
        lj_free(t->env, r);
        return lj_tdb_error(t, "reading measurements");
    }
    if (n)
        qsort(r, (size_t)n, sizeof *r, compare_results);
    else if (!(r = lj_malloc(t->env, sizeof *r)))
        return lj_oom(t->env);
    *out = r;
    *count = n;
    return LAJIT_OK;
}

/* ---- Leases ---------------------------------------------------------------------------------- */

static void lease_key(const lj_tune_id *id, char *out, size_t cap)
{
    snprintf(out, cap, "%s|%d|%d|%d|%d|%s|%s|%s", id->fp.name, id->fp.cc, id->fp.sms,
             id->fp.driver, id->fp.nvrtc, id->family, id->template_hash, id->bucket);
}

static int lease_body(lj_tunedb *t, const char *key, int seconds, int *got)
{
    sqlite3_stmt *s;
    if (prepare(t, "SELECT host, pid, expires FROM leases WHERE lease_key=?1", &s) != SQLITE_OK)
        return 0;
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    int rc = step(t, s);
    long long now = (long long)time(NULL);
    int free_now = 1;
    if (rc == SQLITE_ROW) {
        const char *host = (const char *)sqlite3_column_text(s, 0);
        int pid = sqlite3_column_int(s, 1);
        long long expires = sqlite3_column_int64(s, 2);
        int same_host = host && strcmp(host, t->host) == 0;
        int mine = same_host && pid == (int)getpid();
        /* A holder on this host that no longer exists crashed while tuning: its lease is stale
         * at once (other hosts' processes can only be waited out). */
        int dead = same_host && !mine && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
        free_now = mine || dead || expires <= now;
        rc = SQLITE_DONE;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return 0;
    *got = free_now;
    if (!free_now)
        return 1;
    if (prepare(t, "INSERT OR REPLACE INTO leases VALUES(?1,?2,?3,?4)", &s) != SQLITE_OK)
        return 0;
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, t->host, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 3, (int)getpid());
    sqlite3_bind_int64(s, 4, now + seconds);
    rc = step(t, s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE;
}

lajit_status lj_tunedb_lease(lj_tunedb *t, const lj_tune_id *id, int seconds, int *got)
{
    char key[1024];
    lease_key(id, key, sizeof key);
    *got = 0;
    lajit_status st = lj_tdb_writable(t, "taking a lease");
    if (st != LAJIT_OK)
        return st;
    IN_TRANSACTION(t, "taking a lease", lease_body(t, key, seconds, got));
}

lajit_status lj_tunedb_release(lj_tunedb *t, const lj_tune_id *id)
{
    char key[1024];
    lease_key(id, key, sizeof key);
    lajit_status st = lj_tdb_writable(t, "releasing a lease");
    if (st != LAJIT_OK)
        return st;
    sqlite3_stmt *s;
    if (prepare(t, "DELETE FROM leases WHERE lease_key=?1 AND host=?2 AND pid=?3", &s) != SQLITE_OK)
        return lj_tdb_error(t, "releasing a lease");
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, t->host, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 3, (int)getpid());
    int rc = step(t, s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? LAJIT_OK : lj_tdb_error(t, "releasing a lease");
}

/* ---- Show, export, import -------------------------------------------------------------------- */

void lj_tdb_read_fp(sqlite3_stmt *s, int col, lj_fingerprint *fp)
{
    memset(fp, 0, sizeof *fp);
    const char *n = (const char *)sqlite3_column_text(s, col);
    snprintf(fp->name, sizeof fp->name, "%s", n ? n : "");
    fp->cc = sqlite3_column_int(s, col + 1);
    fp->sms = sqlite3_column_int(s, col + 2);
    fp->driver = sqlite3_column_int(s, col + 3);
    fp->nvrtc = sqlite3_column_int(s, col + 4);
}

const char *lj_tdb_text_or(sqlite3_stmt *s, int col, const char *fallback)
{
    const char *v = (const char *)sqlite3_column_text(s, col);
    return v ? v : fallback;
}

lajit_status lj_tunedb_show(lj_tunedb *t, lj_tunedb_show_fn fn, void *user)
{
    sqlite3_stmt *s;
    if (prepare(t, "SELECT d.name, d.cc, d.sms, d.driver, d.nvrtc, w.family, w.template_hash,"
                   " w.bucket, w.config, w.ms, w.default_config, w.default_ms,"
                   " (SELECT count(*) FROM measurements m WHERE m.device=w.device AND"
                   "  m.family=w.family AND m.template_hash=w.template_hash AND m.bucket=w.bucket)"
                   " FROM winners w JOIN devices d ON d.id = w.device"
                   " ORDER BY d.name, w.family, w.bucket", &s) != SQLITE_OK)
        return lj_tdb_error(t, "listing winners");
    int rc;
    while ((rc = step(t, s)) == SQLITE_ROW) {
        lj_fingerprint fp;
        lj_tdb_read_fp(s, 0, &fp);
        double dms = sqlite3_column_type(s, 11) == SQLITE_NULL ? -1 : sqlite3_column_double(s, 11);
        fn(user, &fp, lj_tdb_text_or(s, 5, ""), lj_tdb_text_or(s, 6, ""),
           lj_tdb_text_or(s, 7, ""), lj_tdb_text_or(s, 8, ""), sqlite3_column_double(s, 9),
           lj_tdb_text_or(s, 10, ""), dms, sqlite3_column_int(s, 12));
    }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? LAJIT_OK : lj_tdb_error(t, "listing winners");
}
