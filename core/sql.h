/* sql.h — the one door through which the tuning database and bundles reach SQLite.
 *
 * Every SQLite call that can fail (open, exec, prepare, step) goes through these wrappers, so a
 * test can make any one of them fail (lj_fault_hit with LJ_FAULT_SQLITE: the call is not made
 * and SQLITE_IOERR is returned, with a message saying it was injected) and prove each failure
 * becomes a clear status. The open applies the settings every file lajit reads gets, since
 * either kind of file may come from someone else: defensive mode, untrusted schema (no SQL
 * functions with side effects from views or triggers), no extension loading, no triggers or
 * views, and limits on the length of a value, of SQL text and of expressions. A work limit (a
 * progress handler) bounds the virtual-machine instructions of any one call, so a hostile file
 * cannot make a query run for ever. */
#ifndef LAJIT_SQL_H
#define LAJIT_SQL_H

#include <sqlite3.h>

#include "core.h"

typedef struct lj_sql {
    lj_env *env;
    sqlite3 *db;
    int injected;    /* the code of the failure just injected, 0 when the last call was real */
    long work_limit; /* progress-handler ticks (of 1000 instructions) per call; 0: no limit */
    long work;       /* ticks of the current call */
    int open_rc;     /* the code of a failed open */
} lj_sql;

/* Largest value (string or blob) a connection accepts: bigger than any kernel image. */
#define LJ_SQL_MAX_LENGTH (256 * 1024 * 1024)

/* Opens filename with sqlite3_open_v2 flags (SQLITE_OPEN_NOMUTEX and SQLITE_OPEN_NOFOLLOW are
 * added) and applies the settings above. On failure s->db is NULL and the return code says why
 * (lj_sql_errmsg has the text). */
int lj_sql_open(lj_sql *s, lj_env *env, const char *filename, int flags, long work_limit);
/* Closes (s->db NULL afterwards). Returns sqlite3_close's code. */
int lj_sql_close(lj_sql *s);
int lj_sql_exec(lj_sql *s, const char *sql);
int lj_sql_prepare(lj_sql *s, const char *sql, sqlite3_stmt **stmt);
int lj_sql_step(lj_sql *s, sqlite3_stmt *stmt);
/* The message of the last failure: the injected one, else SQLite's. Valid until the next call. */
const char *lj_sql_errmsg(const lj_sql *s);

/* A text column's value as a C string, NULL when the column is not text or holds a NUL byte
 * (a value that would be truncated silently if used as a string). */
const char *lj_sql_text(sqlite3_stmt *stmt, int col);

/* "file:" URI of path (escaped) with immutable=1, for SQLITE_OPEN_URI: a file opened so takes no
 * locks and gets no journal, WAL or shared-memory file beside it. Caller frees with lj_free;
 * NULL when out of memory. */
char *lj_sql_immutable_uri(lj_env *env, const char *path);

#endif
