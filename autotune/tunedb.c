/* tunedb.c — the SQLite tuning database (tunedb.h): fingerprints, winners, measurements, leases
 * and the listing. Opening (trust checks, migrations, read-only mode, recovery) lives in
 * tunedb_open.c, export and import in tunedb_json.c.
 *
 * Schema (user_version 1, application_id 'lajt'):
 *   devices(id, name, cc, sms, driver, nvrtc)            one row per fingerprint
 *   measurements(device, family, template_hash, bucket, config, ms, failure, at)
 *   winners(device, family, template_hash, bucket, config, ms, default_config, default_ms, at)
 *   leases(lease_key, host, pid, expires) */
#include "tunedb_int.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "key.h"

void lj_fingerprint_make(const lj_device_info *info, int driver, int nvrtc_major, int nvrtc_minor,
                         lj_fingerprint *out)
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

/* ---- Devices --------------------------------------------------------------------------------- */

/* The id of fp's row; create = 1 adds it when missing (inside the caller's transaction).
 * *id = 0 when absent and not created. */
int lj_tdb_device_id(lj_tunedb *t, const lj_fingerprint *fp, int create, sqlite3_int64 *id)
{
    sqlite3_stmt *s;
    *id = 0;
    int rc = prepare(t,
                     "SELECT id FROM devices WHERE name=?1 AND cc=?2 AND sms=?3 AND driver=?4"
                     " AND nvrtc=?5",
                     &s);
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
    int rc = prepare(t,
                     "SELECT w.config, w.ms FROM winners w JOIN devices d ON d.id = w.device"
                     " WHERE d.name=?1 AND d.cc=?2 AND d.sms=?3 AND d.driver=?4 AND d.nvrtc=?5"
                     " AND w.family=?6 AND w.template_hash=?7 AND w.bucket=?8",
                     &s);
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

lajit_status lj_tunedb_shipped_winner(lj_tunedb *t, const lj_tune_id *id, char *config, size_t cap,
                                      int *found, int *stale, char stale_hash[17])
{
    *found = *stale = 0;
    stale_hash[0] = 0;
    sqlite3_stmt *s;
    /* The row of id's template hash first, when there is one; else the newest other one. */
    int rc = prepare(t,
                     "SELECT w.config, w.template_hash FROM winners w JOIN devices d"
                     " ON d.id = w.device WHERE d.name=?1 AND d.cc=?2 AND w.family=?3"
                     " AND w.bucket=?4 ORDER BY w.template_hash = ?5 DESC, d.driver DESC,"
                     " d.nvrtc DESC, w.at DESC LIMIT 1",
                     &s);
    if (rc != SQLITE_OK)
        return lj_tdb_error(t, "reading a shipped winner");
    sqlite3_bind_text(s, 1, id->fp.name, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, id->fp.cc);
    sqlite3_bind_text(s, 3, id->family, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, id->bucket, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 5, id->template_hash, -1, SQLITE_STATIC);
    rc = step(t, s);
    if (rc == SQLITE_ROW) {
        const char *hash = lj_tdb_text_or(s, 1, "");
        if (strcmp(hash, id->template_hash) == 0) {
            snprintf(config, cap, "%s", lj_tdb_text_or(s, 0, ""));
            *found = 1;
        } else {
            snprintf(stale_hash, 17, "%s", hash);
            *stale = 1;
        }
        rc = SQLITE_DONE;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) {
        *found = *stale = 0;
        return lj_tdb_error(t, "reading a shipped winner");
    }
    return LAJIT_OK;
}

/* Runs body inside BEGIN IMMEDIATE ... COMMIT, rolling back on failure. */
#define IN_TRANSACTION(t, what, body)                  \
    do {                                               \
        if (exec((t), "BEGIN IMMEDIATE") != SQLITE_OK) \
            return lj_tdb_error((t), what);            \
        int ok_ = (body);                              \
        if (ok_ && exec((t), "COMMIT") == SQLITE_OK)   \
            return LAJIT_OK;                           \
        lajit_status st_ = lj_tdb_error((t), what);    \
        exec((t), "ROLLBACK");                         \
        return st_;                                    \
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

lajit_status lj_tunedb_results(lj_tunedb *t, const lj_tune_id *id, lj_tune_result **out, int *count)
{
    sqlite3_int64 dev;
    if (lj_tdb_device_id(t, &id->fp, 0, &dev) != SQLITE_OK)
        return lj_tdb_error(t, "reading measurements");
    sqlite3_stmt *s;
    if (prepare(t,
                "SELECT config, ms, failure FROM measurements WHERE device=?1 AND family=?2"
                " AND template_hash=?3 AND bucket=?4",
                &s) != SQLITE_OK)
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
    snprintf(out, cap, "%s|%d|%d|%d|%d|%s|%s|%s", id->fp.name, id->fp.cc, id->fp.sms, id->fp.driver,
             id->fp.nvrtc, id->family, id->template_hash, id->bucket);
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
    if (prepare(t,
                "SELECT d.name, d.cc, d.sms, d.driver, d.nvrtc, w.family, w.template_hash,"
                " w.bucket, w.config, w.ms, w.default_config, w.default_ms,"
                " (SELECT count(*) FROM measurements m WHERE m.device=w.device AND"
                "  m.family=w.family AND m.template_hash=w.template_hash AND m.bucket=w.bucket)"
                " FROM winners w JOIN devices d ON d.id = w.device"
                " ORDER BY d.name, w.family, w.bucket",
                &s) != SQLITE_OK)
        return lj_tdb_error(t, "listing winners");
    int rc;
    while ((rc = step(t, s)) == SQLITE_ROW) {
        lj_fingerprint fp;
        lj_tdb_read_fp(s, 0, &fp);
        double dms = sqlite3_column_type(s, 11) == SQLITE_NULL ? -1 : sqlite3_column_double(s, 11);
        fn(user, &fp, lj_tdb_text_or(s, 5, ""), lj_tdb_text_or(s, 6, ""), lj_tdb_text_or(s, 7, ""),
           lj_tdb_text_or(s, 8, ""), sqlite3_column_double(s, 9), lj_tdb_text_or(s, 10, ""), dms,
           sqlite3_column_int(s, 12));
    }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? LAJIT_OK : lj_tdb_error(t, "listing winners");
}
