/* tunedb.c — the SQLite tuning database (tunedb.h).
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
 * fresh replacement. */
#include "tunedb.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "key.h"

#define APPLICATION_ID 0x6c616a74 /* 'lajt' */
#define BUSY_TIMEOUT_MS 30000

struct lj_tunedb {
    lj_env *env;
    sqlite3 *db;
    char *path;
    char host[64];
};

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

static lajit_status db_error(lj_tunedb *t, const char *what)
{
    return lj_error(t->env, LAJIT_ERR_DATABASE, "%s: %s: %s", t->path, what,
                    t->db ? sqlite3_errmsg(t->db) : "no database");
}

/* Runs SQL with no result rows. */
static int exec(lj_tunedb *t, const char *sql)
{
    return sqlite3_exec(t->db, sql, NULL, NULL, NULL);
}

/* One integer from a query (PRAGMA user_version). */
static int query_int(lj_tunedb *t, const char *sql, int *out)
{
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(t->db, sql, -1, &s, NULL);
    if (rc != SQLITE_OK)
        return rc;
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        *out = sqlite3_column_int(s, 0);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(s);
    return rc;
}

static int prepare(lj_tunedb *t, const char *sql, sqlite3_stmt **s)
{
    return sqlite3_prepare_v2(t->db, sql, -1, s, NULL);
}

/* ---- Schema and migrations --------------------------------------------------------------------- */

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

typedef enum open_result { OPEN_OK, OPEN_DAMAGED, OPEN_UNAVAILABLE } open_result;

/* SQLite result codes that mean the file is not a usable lajit database (as opposed to "cannot
 * reach it now"). */
static int damaged_code(int rc)
{
    rc &= 0xff;
    return rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB || rc == SQLITE_FORMAT ||
           rc == SQLITE_SCHEMA;
}

/* Brings the schema to LJ_TUNEDB_SCHEMA. why receives a reason when the file is damaged or
 * foreign. */
static open_result migrate(lj_tunedb *t, char *why, size_t cap)
{
    int rc = exec(t, "BEGIN IMMEDIATE");
    if (rc != SQLITE_OK) {
        snprintf(why, cap, "BEGIN: %s", sqlite3_errmsg(t->db));
        return damaged_code(rc) ? OPEN_DAMAGED : OPEN_UNAVAILABLE;
    }
    int version = 0, app = 0, tables = 0;
    open_result res = OPEN_OK;
    rc = query_int(t, "PRAGMA user_version", &version);
    if (rc == SQLITE_OK)
        rc = query_int(t, "PRAGMA application_id", &app);
    if (rc == SQLITE_OK)
        rc = query_int(t, "SELECT count(*) FROM sqlite_master", &tables);
    if (rc != SQLITE_OK) {
        snprintf(why, cap, "%s", sqlite3_errmsg(t->db));
        res = damaged_code(rc) ? OPEN_DAMAGED : OPEN_UNAVAILABLE;
    } else if (version > LJ_TUNEDB_SCHEMA) {
        snprintf(why, cap, "schema version %d is from a later lajit (this one knows %d)",
                 version, LJ_TUNEDB_SCHEMA);
        res = OPEN_DAMAGED;
    } else if (app != APPLICATION_ID && (app != 0 || tables != 0)) {
        snprintf(why, cap, "not a lajit tuning database (application_id 0x%x, %d tables)", app,
                 tables);
        res = OPEN_DAMAGED;
    } else {
        for (int v = version; v < N_MIGRATIONS && res == OPEN_OK; v++) {
            rc = exec(t, migrations[v]);
            if (rc != SQLITE_OK) {
                snprintf(why, cap, "migration %d -> %d: %s", v, v + 1, sqlite3_errmsg(t->db));
                res = damaged_code(rc) ? OPEN_DAMAGED : OPEN_UNAVAILABLE;
            }
        }
        if (res == OPEN_OK && version < N_MIGRATIONS) {
            char sql[96];
            snprintf(sql, sizeof sql, "PRAGMA user_version = %d; PRAGMA application_id = %d",
                     N_MIGRATIONS, APPLICATION_ID);
            if ((rc = exec(t, sql)) != SQLITE_OK) {
                snprintf(why, cap, "%s", sqlite3_errmsg(t->db));
                res = OPEN_UNAVAILABLE;
            }
        }
    }
    if (res == OPEN_OK) {
        if ((rc = exec(t, "COMMIT")) != SQLITE_OK) {
            snprintf(why, cap, "COMMIT: %s", sqlite3_errmsg(t->db));
            res = damaged_code(rc) ? OPEN_DAMAGED : OPEN_UNAVAILABLE;
        }
    }
    if (res != OPEN_OK)
        exec(t, "ROLLBACK");
    return res;
}

/* Opens the connection and checks the file: WAL, busy timeout, quick_check, schema. */
static open_result try_open(lj_tunedb *t, char *why, size_t cap)
{
    int rc = sqlite3_open_v2(t->path, &t->db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                             NULL);
    if (rc != SQLITE_OK) {
        snprintf(why, cap, "%s", t->db ? sqlite3_errmsg(t->db) : sqlite3_errstr(rc));
        return damaged_code(rc) ? OPEN_DAMAGED : OPEN_UNAVAILABLE;
    }
    sqlite3_busy_timeout(t->db, BUSY_TIMEOUT_MS);
    sqlite3_extended_result_codes(t->db, 0);
    /* journal_mode answers a row ("wal"); a file that is not a database fails here. */
    sqlite3_stmt *s;
    rc = prepare(t, "PRAGMA journal_mode = WAL", &s);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            const char *mode = (const char *)sqlite3_column_text(s, 0);
            rc = mode && strcmp(mode, "wal") == 0 ? SQLITE_OK : SQLITE_CANTOPEN;
        }
        sqlite3_finalize(s);
    }
    if (rc == SQLITE_OK)
        rc = exec(t, "PRAGMA synchronous = NORMAL");
    if (rc != SQLITE_OK) {
        snprintf(why, cap, "%s", rc == SQLITE_CANTOPEN && !damaged_code(sqlite3_errcode(t->db))
                                     ? "cannot use WAL mode here"
                                     : sqlite3_errmsg(t->db));
        return damaged_code(rc) ? OPEN_DAMAGED : OPEN_UNAVAILABLE;
    }
    /* A truncated or damaged file often opens fine and fails only when a page is read: read
     * them all now (the file is small), so damage is found here and not in the middle of an
     * op. */
    rc = prepare(t, "PRAGMA quick_check", &s);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            const char *r = (const char *)sqlite3_column_text(s, 0);
            if (!r || strcmp(r, "ok") != 0) {
                snprintf(why, cap, "integrity: %.200s", r ? r : "?");
                rc = SQLITE_CORRUPT;
            } else {
                rc = SQLITE_OK;
            }
        }
        sqlite3_finalize(s);
    }
    if (rc != SQLITE_OK) {
        if (!why[0])
            snprintf(why, cap, "%s", sqlite3_errmsg(t->db));
        return damaged_code(rc) ? OPEN_DAMAGED : OPEN_UNAVAILABLE;
    }
    return migrate(t, why, cap);
}

static int make_dirs(const char *dir)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp)
        return -1;
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

/* Sets the damaged file aside, unless another process already replaced it since we looked
 * (inode changed). The caller holds the exclusive lock on tune.db.lock (open_lock), so two
 * processes recovering at once do not both move files. Returns 0 when the path is ready for a
 * fresh open. */
static int set_aside(lj_tunedb *t, const struct stat *seen, const char *why)
{
    char aside[4200];
    struct stat now;
    int rc = 0;
    if (stat(t->path, &now) == 0 && now.st_ino == seen->st_ino && now.st_dev == seen->st_dev) {
        snprintf(aside, sizeof aside, "%s.corrupt-%lld-%d", t->path, (long long)time(NULL),
                 (int)getpid());
        if (rename(t->path, aside) != 0) {
            rc = -1;
        } else {
            /* The journal files belong to the old file: a fresh database must not replay them. */
            static const char *const suffixes[] = {"-wal", "-shm", "-journal"};
            for (int i = 0; i < 3; i++) {
                char side[4200], side_aside[4300];
                snprintf(side, sizeof side, "%s%s", t->path, suffixes[i]);
                snprintf(side_aside, sizeof side_aside, "%s%s", aside, suffixes[i]);
                rename(side, side_aside);
            }
            lj_log(t->env, LAJIT_LOG_WARN, "tuning database %s is unusable (%s): moved to %s, "
                   "starting a new one", t->path, why, aside);
        }
    }
    return rc;
}

/* Opening (creating the file, switching it to WAL, migrating the schema, setting a damaged file
 * aside) runs under an exclusive flock on tune.db.lock. SQLite's busy timeout does not cover
 * every lock taken while several connections create and convert a new file at the same moment
 * (8 processes saw "database is locked" at open); opens are rare, so serialising them is free.
 * Returns the lock's descriptor, or -1 when no lock could be had (then opening goes on without
 * it). */
static int open_lock(const char *path)
{
    char lock[4200];
    snprintf(lock, sizeof lock, "%s.lock", path);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0 && flock(fd, LOCK_EX) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

lajit_status lj_tunedb_open(lj_env *env, const char *dir, lj_tunedb **out)
{
    if (!dir || !*dir)
        return lj_error(env, LAJIT_ERR_DATABASE, "no cache directory for the tuning database");
    lj_tunedb *t = lj_calloc(env, 1, sizeof *t);
    if (!t)
        return lj_oom(env);
    t->env = env;
    size_t len = strlen(dir) + sizeof "/tune.db";
    if (!(t->path = lj_malloc(env, len))) {
        lj_free(env, t);
        return lj_oom(env);
    }
    snprintf(t->path, len, "%s/tune.db", dir);
    if (gethostname(t->host, sizeof t->host - 1) != 0)
        snprintf(t->host, sizeof t->host, "unknown");
    if (make_dirs(dir) != 0) {
        lajit_status st = lj_error(env, LAJIT_ERR_DATABASE, "cannot create %s: %s", dir,
                                   strerror(errno));
        lj_tunedb_close(t);
        return st;
    }
    char why[512];
    int lock = open_lock(t->path);
    for (int attempt = 0;; attempt++) {
        why[0] = 0;
        struct stat seen;
        int existed = stat(t->path, &seen) == 0;
        open_result r = try_open(t, why, sizeof why);
        if (r == OPEN_OK)
            break;
        sqlite3_close(t->db);
        t->db = NULL;
        if (r == OPEN_UNAVAILABLE || attempt == 2 || !existed || set_aside(t, &seen, why) != 0) {
            lajit_status st = lj_error(env, LAJIT_ERR_DATABASE, "tuning database %s unavailable: %s",
                                       t->path, why);
            lj_tunedb_close(t);
            if (lock >= 0)
                close(lock);
            return st;
        }
    }
    if (lock >= 0)
        close(lock); /* releases the flock */
    *out = t;
    return LAJIT_OK;
}

void lj_tunedb_close(lj_tunedb *t)
{
    if (!t)
        return;
    sqlite3_close(t->db);
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
static int device_id(lj_tunedb *t, const lj_fingerprint *fp, int create, sqlite3_int64 *id)
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
    rc = sqlite3_step(s);
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
    rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return rc;
    *id = sqlite3_last_insert_rowid(t->db);
    return SQLITE_OK;
}

static void bind_bucket(sqlite3_stmt *s, sqlite3_int64 dev, const lj_tune_id *id)
{
    sqlite3_bind_int64(s, 1, dev);
    sqlite3_bind_text(s, 2, id->family, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, id->template_hash, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, id->bucket, -1, SQLITE_STATIC);
}

/* ---- Winners and measurements ------------------------------------------------------------------ */

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
        return db_error(t, "reading a winner");
    sqlite3_bind_text(s, 1, id->fp.name, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, id->fp.cc);
    sqlite3_bind_int(s, 3, id->fp.sms);
    sqlite3_bind_int(s, 4, id->fp.driver);
    sqlite3_bind_int(s, 5, id->fp.nvrtc);
    sqlite3_bind_text(s, 6, id->family, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 7, id->template_hash, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 8, id->bucket, -1, SQLITE_STATIC);
    rc = sqlite3_step(s);
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
        return db_error(t, "reading a winner");
    }
    return LAJIT_OK;
}

/* Runs body inside BEGIN IMMEDIATE ... COMMIT, rolling back on failure. */
#define IN_TRANSACTION(t, what, body)                                  \
    do {                                                               \
        if (exec((t), "BEGIN IMMEDIATE") != SQLITE_OK)                 \
            return db_error((t), what);                                \
        int ok_ = (body);                                              \
        if (ok_ && exec((t), "COMMIT") == SQLITE_OK)                   \
            return LAJIT_OK;                                           \
        lajit_status st_ = db_error((t), what);                        \
        exec((t), "ROLLBACK");                                         \
        return st_;                                                    \
    } while (0)

static int record_body(lj_tunedb *t, const lj_tune_id *id, const lj_tune_result *r, int n,
                       const char *default_config, double default_ms)
{
    sqlite3_int64 dev;
    if (device_id(t, &id->fp, 1, &dev) != SQLITE_OK)
        return 0;
    sqlite3_int64 now = (sqlite3_int64)time(NULL);
    sqlite3_stmt *s;
    if (prepare(t, "INSERT OR REPLACE INTO measurements VALUES(?1,?2,?3,?4,?5,?6,?7,?8)", &s) != SQLITE_OK)
        return 0;
    int best = -1;
    for (int i = 0; i < n; i++) {
        sqlite3_reset(s);
        bind_bucket(s, dev, id);
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
        if (sqlite3_step(s) != SQLITE_DONE) {
            sqlite3_finalize(s);
            return 0;
        }
    }
    sqlite3_finalize(s);
    if (best < 0)
        return 1;
    if (prepare(t, "INSERT OR REPLACE INTO winners VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9)", &s) != SQLITE_OK)
        return 0;
    bind_bucket(s, dev, id);
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
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE;
}

lajit_status lj_tunedb_record(lj_tunedb *t, const lj_tune_id *id, const lj_tune_result *results,
                              int n, const char *default_config, double default_ms)
{
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
    if (device_id(t, &id->fp, 0, &dev) != SQLITE_OK)
        return db_error(t, "reading measurements");
    sqlite3_stmt *s;
    if (prepare(t, "SELECT config, ms, failure FROM measurements WHERE device=?1 AND family=?2"
                   " AND template_hash=?3 AND bucket=?4", &s) != SQLITE_OK)
        return db_error(t, "reading measurements");
    bind_bucket(s, dev, id);
    lj_tune_result *r = NULL;
    int n = 0, cap = 0, rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
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
        return db_error(t, "reading measurements");
    }
    if (n)
        qsort(r, (size_t)n, sizeof *r, compare_results);
    else if (!(r = lj_malloc(t->env, sizeof *r)))
        return lj_oom(t->env);
    *out = r;
    *count = n;
    return LAJIT_OK;
}

/* ---- Leases -------------------------------------------------------------------------------------- */

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
    int rc = sqlite3_step(s);
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
    rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE;
}

lajit_status lj_tunedb_lease(lj_tunedb *t, const lj_tune_id *id, int seconds, int *got)
{
    char key[1024];
    lease_key(id, key, sizeof key);
    *got = 0;
    IN_TRANSACTION(t, "taking a lease", lease_body(t, key, seconds, got));
}

lajit_status lj_tunedb_release(lj_tunedb *t, const lj_tune_id *id)
{
    char key[1024];
    lease_key(id, key, sizeof key);
    sqlite3_stmt *s;
    if (prepare(t, "DELETE FROM leases WHERE lease_key=?1 AND host=?2 AND pid=?3", &s) != SQLITE_OK)
        return db_error(t, "releasing a lease");
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, t->host, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 3, (int)getpid());
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? LAJIT_OK : db_error(t, "releasing a lease");
}

/* ---- Show, export, import ------------------------------------------------------------------------ */

static void read_fp(sqlite3_stmt *s, int col, lj_fingerprint *fp)
{
    memset(fp, 0, sizeof *fp);
    const char *n = (const char *)sqlite3_column_text(s, col);
    snprintf(fp->name, sizeof fp->name, "%s", n ? n : "");
    fp->cc = sqlite3_column_int(s, col + 1);
    fp->sms = sqlite3_column_int(s, col + 2);
    fp->driver = sqlite3_column_int(s, col + 3);
    fp->nvrtc = sqlite3_column_int(s, col + 4);
}

static const char *text_or(sqlite3_stmt *s, int col, const char *fallback)
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
        return db_error(t, "listing winners");
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        lj_fingerprint fp;
        read_fp(s, 0, &fp);
        double dms = sqlite3_column_type(s, 11) == SQLITE_NULL ? -1 : sqlite3_column_double(s, 11);
        fn(user, &fp, text_or(s, 5, ""), text_or(s, 6, ""), text_or(s, 7, ""), text_or(s, 8, ""),
           sqlite3_column_double(s, 9), text_or(s, 10, ""), dms, sqlite3_column_int(s, 12));
    }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? LAJIT_OK : db_error(t, "listing winners");
}

/* JSON string body with the escapes JSON requires. */
static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static void json_num_or_null(FILE *f, sqlite3_stmt *s, int col)
{
    if (sqlite3_column_type(s, col) == SQLITE_NULL)
        fputs("null", f);
    else
        fprintf(f, "%.17g", sqlite3_column_double(s, col));
}

static void json_text_or_null(FILE *f, sqlite3_stmt *s, int col)
{
    const char *v = (const char *)sqlite3_column_text(s, col);
    if (v)
        json_str(f, v);
    else
        fputs("null", f);
}

static void json_fp(FILE *f, sqlite3_stmt *s)
{
    lj_fingerprint fp;
    read_fp(s, 0, &fp);
    fputs("\"device\":", f);
    json_str(f, fp.name);
    fprintf(f, ",\"cc\":%d,\"sms\":%d,\"driver\":%d,\"nvrtc\":%d,\"family\":", fp.cc, fp.sms,
            fp.driver, fp.nvrtc);
    json_text_or_null(f, s, 5);
    fputs(",\"template_hash\":", f);
    json_text_or_null(f, s, 6);
    fputs(",\"bucket\":", f);
    json_text_or_null(f, s, 7);
    fputs(",\"config\":", f);
    json_text_or_null(f, s, 8);
}

lajit_status lj_tunedb_export(lj_tunedb *t, const char *path, int *rows)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return lj_error(t->env, LAJIT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    int n = 0, rc = SQLITE_OK;
    /* One read transaction, so the export is one consistent snapshot. */
    if (exec(t, "BEGIN") != SQLITE_OK) {
        fclose(f);
        return db_error(t, "exporting");
    }
    sqlite3_stmt *s;
    rc = prepare(t, "SELECT d.name, d.cc, d.sms, d.driver, d.nvrtc, m.family, m.template_hash,"
                    " m.bucket, m.config, m.ms, m.failure, m.at FROM measurements m"
                    " JOIN devices d ON d.id = m.device ORDER BY 1,2,3,4,5,6,7,8,9", &s);
    if (rc == SQLITE_OK) {
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
            fputs("{\"kind\":\"measurement\",", f);
            json_fp(f, s);
            fputs(",\"ms\":", f);
            json_num_or_null(f, s, 9);
            fputs(",\"failure\":", f);
            json_text_or_null(f, s, 10);
            fprintf(f, ",\"at\":%lld}\n", (long long)sqlite3_column_int64(s, 11));
            n++;
        }
        sqlite3_finalize(s);
        rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    if (rc == SQLITE_OK)
        rc = prepare(t, "SELECT d.name, d.cc, d.sms, d.driver, d.nvrtc, w.family, w.template_hash,"
                        " w.bucket, w.config, w.ms, w.default_config, w.default_ms, w.at"
                        " FROM winners w JOIN devices d ON d.id = w.device"
                        " ORDER BY 1,2,3,4,5,6,7,8", &s);
    if (rc == SQLITE_OK) {
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
            fputs("{\"kind\":\"winner\",", f);
            json_fp(f, s);
            fputs(",\"ms\":", f);
            json_num_or_null(f, s, 9);
            fputs(",\"default_config\":", f);
            json_text_or_null(f, s, 10);
            fputs(",\"default_ms\":", f);
            json_num_or_null(f, s, 11);
            fprintf(f, ",\"at\":%lld}\n", (long long)sqlite3_column_int64(s, 12));
            n++;
        }
        sqlite3_finalize(s);
        rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    lajit_status st = rc == SQLITE_OK ? LAJIT_OK : db_error(t, "exporting");
    exec(t, "COMMIT");
    if (fclose(f) != 0 && st == LAJIT_OK)
        st = lj_error(t->env, LAJIT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    if (st == LAJIT_OK)
        *rows = n;
    return st;
}

/* ---- A reader for the flat JSON objects export writes --------------------------------------- */

#define MAX_FIELDS 16

typedef struct json_row {
    int n;
    char keys[MAX_FIELDS][32];
    char vals[MAX_FIELDS][512]; /* string values unescaped; numbers as written */
    int is_str[MAX_FIELDS], is_null[MAX_FIELDS];
} json_row;

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
        p++;
    return p;
}

/* Parses a JSON string at p (after the quote is checked) into out; NULL on error. */
static const char *parse_str(const char *p, char *out, size_t cap)
{
    if (*p++ != '"')
        return NULL;
    size_t n = 0;
    while (*p && *p != '"') {
        char c = *p++;
        if (c == '\\') {
            c = *p++;
            if (c == 'u') {
                unsigned v = 0;
                for (int i = 0; i < 4; i++) {
                    char h = *p++;
                    v = v * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0'
                                            : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                            : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 99);
                    if (v > 0xffff)
                        return NULL;
                }
                if (v > 0x7f)
                    return NULL; /* export writes only control characters this way */
                c = (char)v;
            } else if (c == 'n') {
                c = '\n';
            } else if (c == 't') {
                c = '\t';
            } else if (c != '"' && c != '\\' && c != '/') {
                return NULL;
            }
        }
        if (n + 1 >= cap)
            return NULL;
        out[n++] = c;
    }
    if (*p != '"')
        return NULL;
    out[n] = 0;
    return p + 1;
}

static int parse_row(const char *line, json_row *r)
{
    memset(r, 0, sizeof *r);
    const char *p = skip_ws(line);
    if (*p++ != '{')
        return 0;
    p = skip_ws(p);
    if (*p == '}')
        return 1;
    for (;;) {
        if (r->n == MAX_FIELDS)
            return 0;
        int i = r->n++;
        if (!(p = parse_str(skip_ws(p), r->keys[i], sizeof r->keys[i])))
            return 0;
        p = skip_ws(p);
        if (*p++ != ':')
            return 0;
        p = skip_ws(p);
        if (*p == '"') {
            if (!(p = parse_str(p, r->vals[i], sizeof r->vals[i])))
                return 0;
            r->is_str[i] = 1;
        } else if (strncmp(p, "null", 4) == 0) {
            r->is_null[i] = 1;
            p += 4;
        } else {
            size_t n = strspn(p, "0123456789+-.eE");
            if (n == 0 || n >= sizeof r->vals[i])
                return 0;
            memcpy(r->vals[i], p, n);
            r->vals[i][n] = 0;
            p += n;
        }
        p = skip_ws(p);
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p != '}')
            return 0;
        return *skip_ws(p + 1) == 0;
    }
}

/* A field: its index, or -1. */
static int field(const json_row *r, const char *key)
{
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->keys[i], key) == 0)
            return i;
    return -1;
}

static const char *get_str(const json_row *r, const char *key)
{
    int i = field(r, key);
    return i >= 0 && r->is_str[i] ? r->vals[i] : NULL;
}

/* A number field: 1 when present and a number, 0 when null or absent (value untouched). */
static int get_num(const json_row *r, const char *key, double *out)
{
    int i = field(r, key);
    if (i < 0 || r->is_str[i] || r->is_null[i])
        return 0;
    char *end;
    double v = strtod(r->vals[i], &end);
    if (*end)
        return 0;
    *out = v;
    return 1;
}

typedef struct import_row {
    int winner;
    lj_tune_id id;
    char config[256], default_config[256], failure[256];
    double ms, default_ms, at;
    int has_ms, has_default_ms;
} import_row;

static int to_row(const json_row *j, import_row *r)
{
    memset(r, 0, sizeof *r);
    const char *kind = get_str(j, "kind"), *dev = get_str(j, "device"), *fam = get_str(j, "family"),
               *th = get_str(j, "template_hash"), *bucket = get_str(j, "bucket"),
               *cfg = get_str(j, "config");
    double cc, sms, drv, nv;
    if (!kind || !dev || !fam || !th || !bucket || !cfg || !get_num(j, "cc", &cc) ||
        !get_num(j, "sms", &sms) || !get_num(j, "driver", &drv) || !get_num(j, "nvrtc", &nv))
        return 0;
    if (strcmp(kind, "winner") == 0)
        r->winner = 1;
    else if (strcmp(kind, "measurement") != 0)
        return 0;
    if (strlen(dev) >= sizeof r->id.fp.name || strlen(fam) >= sizeof r->id.family ||
        strlen(th) >= sizeof r->id.template_hash || strlen(bucket) >= sizeof r->id.bucket ||
        strlen(cfg) >= sizeof r->config)
        return 0;
    snprintf(r->id.fp.name, sizeof r->id.fp.name, "%s", dev);
    r->id.fp.cc = (int)cc;
    r->id.fp.sms = (int)sms;
    r->id.fp.driver = (int)drv;
    r->id.fp.nvrtc = (int)nv;
    snprintf(r->id.family, sizeof r->id.family, "%s", fam);
    snprintf(r->id.template_hash, sizeof r->id.template_hash, "%s", th);
    snprintf(r->id.bucket, sizeof r->id.bucket, "%s", bucket);
    snprintf(r->config, sizeof r->config, "%s", cfg);
    r->has_ms = get_num(j, "ms", &r->ms);
    r->at = (double)time(NULL);
    get_num(j, "at", &r->at);
    if (r->winner) {
        if (!r->has_ms)
            return 0;
        const char *dc = get_str(j, "default_config");
        snprintf(r->default_config, sizeof r->default_config, "%s", dc ? dc : "");
        r->has_default_ms = get_num(j, "default_ms", &r->default_ms);
    } else {
        const char *fl = get_str(j, "failure");
        snprintf(r->failure, sizeof r->failure, "%s", fl ? fl : "");
        if (!r->has_ms && !fl)
            return 0;
    }
    return 1;
}

static int import_one(lj_tunedb *t, const import_row *r)
{
    sqlite3_int64 dev;
    if (device_id(t, &r->id.fp, 1, &dev) != SQLITE_OK)
        return 0;
    sqlite3_stmt *s;
    if (r->winner) {
        if (prepare(t, "INSERT OR REPLACE INTO winners VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9)", &s) != SQLITE_OK)
            return 0;
        bind_bucket(s, dev, &r->id);
        sqlite3_bind_text(s, 5, r->config, -1, SQLITE_STATIC);
        sqlite3_bind_double(s, 6, r->ms);
        if (r->default_config[0])
            sqlite3_bind_text(s, 7, r->default_config, -1, SQLITE_STATIC);
        if (r->has_default_ms)
            sqlite3_bind_double(s, 8, r->default_ms);
        sqlite3_bind_int64(s, 9, (sqlite3_int64)r->at);
    } else {
        if (prepare(t, "INSERT OR REPLACE INTO measurements VALUES(?1,?2,?3,?4,?5,?6,?7,?8)", &s) != SQLITE_OK)
            return 0;
        bind_bucket(s, dev, &r->id);
        sqlite3_bind_text(s, 5, r->config, -1, SQLITE_STATIC);
        if (r->has_ms && !r->failure[0])
            sqlite3_bind_double(s, 6, r->ms);
        if (r->failure[0])
            sqlite3_bind_text(s, 7, r->failure, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 8, (sqlite3_int64)r->at);
    }
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE;
}

lajit_status lj_tunedb_import(lj_tunedb *t, const char *path, const lj_fingerprint *local,
                              int force, int *rows)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return lj_error(t->env, LAJIT_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    /* Parse and check the whole file before writing anything, so a refused import changes
     * nothing. */
    import_row *list = NULL;
    int n = 0, cap = 0, lineno = 0;
    lajit_status st = LAJIT_OK;
    char line[4096];
    json_row *j = lj_malloc(t->env, sizeof *j);
    if (!j)
        st = lj_oom(t->env);
    while (st == LAJIT_OK && fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            st = lj_error(t->env, LAJIT_ERR_INVALID_ARGUMENT, "%s:%d: line too long", path, lineno);
            break;
        }
        if (*skip_ws(line) == 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            import_row *grown = lj_realloc(t->env, list, (size_t)cap * sizeof *list);
            if (!grown) {
                st = lj_oom(t->env);
                break;
            }
            list = grown;
        }
        if (!parse_row(line, j) || !to_row(j, &list[n])) {
            st = lj_error(t->env, LAJIT_ERR_INVALID_ARGUMENT,
                          "%s:%d: not a tuning database row", path, lineno);
            break;
        }
        const lj_fingerprint *fp = &list[n].id.fp;
        if (!force && (!local || strcmp(fp->name, local->name) != 0 || fp->cc != local->cc)) {
            st = local ? lj_error(t->env, LAJIT_ERR_INVALID_ARGUMENT,
                                  "%s:%d: results for %s (cc %d), this device is %s (cc %d); "
                                  "force to import anyway", path, lineno, fp->name, fp->cc,
                                  local->name, local->cc)
                       : lj_error(t->env, LAJIT_ERR_INVALID_ARGUMENT,
                                  "%s:%d: results for %s (cc %d) and no device to compare "
                                  "with; force to import anyway", path, lineno, fp->name, fp->cc);
            break;
        }
        n++;
    }
    if (st == LAJIT_OK && ferror(f))
        st = lj_error(t->env, LAJIT_ERR_IO, "cannot read %s", path);
    fclose(f);
    lj_free(t->env, j);
    if (st == LAJIT_OK) {
        if (exec(t, "BEGIN IMMEDIATE") != SQLITE_OK) {
            st = db_error(t, "importing");
        } else {
            int ok = 1;
            for (int i = 0; i < n && ok; i++)
                ok = import_one(t, &list[i]);
            if (ok && exec(t, "COMMIT") == SQLITE_OK) {
                *rows = n;
            } else {
                st = db_error(t, "importing");
                exec(t, "ROLLBACK");
            }
        }
    }
    lj_free(t->env, list);
    return st;
}
