/* tunedb_int.h — what tunedb.c, tunedb_open.c and tunedb_json.c (export and import) share: the
 * handle and the helpers they all need. Not for use outside autotune/tunedb*.c. */
#ifndef LAJIT_TUNEDB_INT_H
#define LAJIT_TUNEDB_INT_H

#include "sql.h"
#include "tunedb.h"

struct lj_tunedb {
    lj_env *env;
    lj_sql sql;
    char *path;
    char host[64];
    int readonly; /* 1: every write is refused (readonly_why says why) */
    char readonly_why[512];
};

/* Short names for the wrappers of sql.h on this handle's connection. */
static inline int prepare(lj_tunedb *t, const char *sql, sqlite3_stmt **s)
{
    return lj_sql_prepare(&t->sql, sql, s);
}

static inline int step(lj_tunedb *t, sqlite3_stmt *s)
{
    return lj_sql_step(&t->sql, s);
}

static inline int exec(lj_tunedb *t, const char *sql)
{
    return lj_sql_exec(&t->sql, sql);
}

/* Records "<path>: <what>: <SQLite's message>" (with the read-only reason when the handle is
 * read-only) and returns LAJIT_ERR_DATABASE. */
lajit_status lj_tdb_error(lj_tunedb *t, const char *what);
/* LAJIT_OK when the handle may write; else LAJIT_ERR_DATABASE with a message naming what was
 * refused and why. */
lajit_status lj_tdb_writable(lj_tunedb *t, const char *what);
/* The id of fp's row; create = 1 adds it when missing (inside the caller's transaction).
 * *id = 0 when absent and not created. Returns an SQLite code. */
int lj_tdb_device_id(lj_tunedb *t, const lj_fingerprint *fp, int create, sqlite3_int64 *id);
/* Binds ?1..?4 to (device, family, template hash, bucket). */
void lj_tdb_bind_bucket(sqlite3_stmt *s, sqlite3_int64 dev, const lj_tune_id *id);

/* The fingerprint in columns col..col+4 (name, cc, sms, driver, nvrtc) of the current row. */
void lj_tdb_read_fp(sqlite3_stmt *s, int col, lj_fingerprint *fp);
/* A text column, or fallback when NULL. */
const char *lj_tdb_text_or(sqlite3_stmt *s, int col, const char *fallback);

#endif
