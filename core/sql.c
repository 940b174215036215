/* sql.c — SQLite wrappers with fault injection and defensive settings (see sql.h). */
#include "sql.h"

#include <string.h>

static int inject(lj_sql *s)
{
    if (lj_fault_hit(s->env, LJ_FAULT_SQLITE)) {
        s->injected = SQLITE_IOERR;
        return 1;
    }
    s->injected = 0;
    s->work = 0;
    return 0;
}

/* Interrupts a call that has run more than its share of instructions. */
static int progress(void *user)
{
    lj_sql *s = user;
    return s->work_limit > 0 && ++s->work > s->work_limit;
}

int lj_sql_open(lj_sql *s, lj_env *env, const char *filename, int flags, long work_limit)
{
    memset(s, 0, sizeof *s);
    s->env = env;
    s->work_limit = work_limit;
    if (inject(s))
        return s->injected;
    int rc =
        sqlite3_open_v2(filename, &s->db, flags | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW, NULL);
    if (rc != SQLITE_OK) {
        /* The handle of a failed open is useless: keep its code for the message, close it. */
        s->open_rc = rc;
        sqlite3_close(s->db);
        s->db = NULL;
        return rc;
    }
    sqlite3 *db = s->db;
    sqlite3_extended_result_codes(db, 0);
    sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, 1, (int *)NULL);
    sqlite3_db_config(db, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, (int *)NULL);
    sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION, 0, (int *)NULL);
    sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_TRIGGER, 0, (int *)NULL);
    sqlite3_db_config(db, SQLITE_DBCONFIG_ENABLE_VIEW, 0, (int *)NULL);
    sqlite3_limit(db, SQLITE_LIMIT_LENGTH, LJ_SQL_MAX_LENGTH);
    sqlite3_limit(db, SQLITE_LIMIT_SQL_LENGTH, 100000);
    sqlite3_limit(db, SQLITE_LIMIT_COLUMN, 100);
    sqlite3_limit(db, SQLITE_LIMIT_EXPR_DEPTH, 100);
    sqlite3_limit(db, SQLITE_LIMIT_COMPOUND_SELECT, 10);
    sqlite3_limit(db, SQLITE_LIMIT_VDBE_OP, 25000);
    sqlite3_limit(db, SQLITE_LIMIT_FUNCTION_ARG, 32);
    sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, 0);
    sqlite3_limit(db, SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 100);
    sqlite3_limit(db, SQLITE_LIMIT_TRIGGER_DEPTH, 1);
    if (work_limit > 0)
        sqlite3_progress_handler(db, 1000, progress, s);
    return SQLITE_OK;
}

int lj_sql_close(lj_sql *s)
{
    int rc = sqlite3_close(s->db);
    s->db = NULL;
    return rc;
}

int lj_sql_exec(lj_sql *s, const char *sql)
{
    if (inject(s))
        return s->injected;
    return sqlite3_exec(s->db, sql, NULL, NULL, NULL);
}

int lj_sql_prepare(lj_sql *s, const char *sql, sqlite3_stmt **stmt)
{
    *stmt = NULL;
    if (inject(s))
        return s->injected;
    return sqlite3_prepare_v2(s->db, sql, -1, stmt, NULL);
}

int lj_sql_step(lj_sql *s, sqlite3_stmt *stmt)
{
    if (inject(s))
        return s->injected;
    return sqlite3_step(stmt);
}

const char *lj_sql_errmsg(const lj_sql *s)
{
    if (s->injected)
        return "disk I/O error (injected fault)";
    if (!s->db)
        return s->open_rc ? sqlite3_errstr(s->open_rc) : "no database";
    if (sqlite3_errcode(s->db) == SQLITE_INTERRUPT && s->work_limit > 0 && s->work > s->work_limit)
        return "query ran past its work limit (a hostile or damaged file?)";
    return sqlite3_errmsg(s->db);
}

const char *lj_sql_text(sqlite3_stmt *stmt, int col)
{
    if (sqlite3_column_type(stmt, col) != SQLITE_TEXT)
        return NULL;
    const char *v = (const char *)sqlite3_column_text(stmt, col);
    if (!v || strlen(v) != (size_t)sqlite3_column_bytes(stmt, col))
        return NULL;
    return v;
}

char *lj_sql_immutable_uri(lj_env *env, const char *path)
{
    lj_buf u;
    lj_buf_init(&u, env);
    lj_buf_puts(&u, "file:");
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("/-._~", *p))
            lj_buf_add(&u, (const char *)p, 1);
        else
            lj_buf_printf(&u, "%%%02X", *p);
    }
    lj_buf_puts(&u, "?immutable=1");
    return lj_buf_take(&u);
}
