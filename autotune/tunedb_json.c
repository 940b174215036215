/* tunedb_json.c — export and import of the tuning database as JSON lines (tunedb.h).
 *
 * Both directions go through SQLite's own JSON functions, not a parser of our own: export
 * writes each row with json_object; import checks each line with json_valid, lists its keys
 * with json_each and reads each field with json_type and json_extract. An import file comes
 * from another machine or person, so every field is checked before anything is written: the
 * key set exactly as export writes it, each value of the right JSON type, strings without NUL
 * and short enough for their fields, times finite and not negative, integers in sane ranges
 * before any conversion. One bad line refuses the whole file with a message naming the line. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fs.h"
#include "tunedb_int.h"

/* ---- Export ---------------------------------------------------------------------------------- */

static const char export_measurements[] =
    "SELECT json_object('kind', 'measurement', 'device', d.name, 'cc', d.cc, 'sms', d.sms,"
    " 'driver', d.driver, 'nvrtc', d.nvrtc, 'family', m.family, 'template_hash',"
    " m.template_hash, 'bucket', m.bucket, 'config', m.config, 'ms', m.ms, 'failure', m.failure,"
    " 'at', m.at) FROM measurements m JOIN devices d ON d.id = m.device"
    " ORDER BY d.name, d.cc, d.sms, d.driver, d.nvrtc, m.family, m.template_hash, m.bucket,"
    " m.config";

static const char export_winners[] =
    "SELECT json_object('kind', 'winner', 'device', d.name, 'cc', d.cc, 'sms', d.sms,"
    " 'driver', d.driver, 'nvrtc', d.nvrtc, 'family', w.family, 'template_hash',"
    " w.template_hash, 'bucket', w.bucket, 'config', w.config, 'ms', w.ms, 'default_config',"
    " w.default_config, 'default_ms', w.default_ms, 'at', w.at)"
    " FROM winners w JOIN devices d ON d.id = w.device"
    " ORDER BY d.name, d.cc, d.sms, d.driver, d.nvrtc, w.family, w.template_hash, w.bucket";

/* The winners a shipped table holds (tuned.h): those of one device name (?1), the latest of each
 * (family, template hash, bucket) when several fingerprints of that name (drivers, NVRTC
 * versions) have one, in a stable order. A winner the tuner measured less than ?2 times faster
 * than the default is written as the default (its configuration and time): the bucket stays
 * covered (eager tuning leaves it alone), and a near tie is not shipped as a winner. Columns: the
 * line, the family, the template hash. */
#define KEEP_WINNER \
    "(w.default_config IS NULL OR w.default_ms IS NULL OR w.default_ms >= ?2 * w.ms)"
static const char export_shipped[] =
    "SELECT json_object('kind', 'winner', 'device', d.name, 'cc', d.cc, 'sms', d.sms,"
    " 'driver', d.driver, 'nvrtc', d.nvrtc, 'family', w.family, 'template_hash',"
    " w.template_hash, 'bucket', w.bucket,"
    " 'config', CASE WHEN " KEEP_WINNER " THEN w.config ELSE w.default_config END,"
    " 'ms', CASE WHEN " KEEP_WINNER " THEN w.ms ELSE w.default_ms END, 'default_config',"
    " w.default_config, 'default_ms', w.default_ms, 'at', w.at), w.family, w.template_hash"
    " FROM winners w JOIN devices d ON d.id = w.device WHERE d.name = ?1 AND NOT EXISTS"
    " (SELECT 1 FROM winners w2 JOIN devices d2 ON d2.id = w2.device WHERE d2.name = d.name"
    "  AND d2.cc = d.cc AND w2.family = w.family AND w2.template_hash = w.template_hash"
    "  AND w2.bucket = w.bucket AND (w2.at > w.at OR (w2.at = w.at AND w2.device > w.device)))"
    " ORDER BY d.cc, w.family, w.bucket, w.template_hash";

/* What one export writes: its queries (NULL-terminated), the device name bound to ?1 (or NULL),
 * the factor bound to ?2 (shipped: 1 + the minimum gain) and the filter of the shipped export (or
 * NULL: every row). */
typedef struct export_spec {
    const char *const *queries;
    const char *device;
    double factor;
    lj_tunedb_keep_fn keep;
    void *user;
} export_spec;

/* Writes one line per row of sql; SQLite code, *n counts the lines, *io_failed a write error. */
static int export_rows(lj_tunedb *t, const char *sql, const export_spec *spec, FILE *f, int *n,
                       int *io_failed)
{
    sqlite3_stmt *s;
    int rc = lj_sql_prepare(&t->sql, sql, &s);
    if (rc != SQLITE_OK)
        return rc;
    if (spec->device) {
        sqlite3_bind_text(s, 1, spec->device, -1, SQLITE_STATIC);
        sqlite3_bind_double(s, 2, spec->factor);
    }
    while ((rc = lj_sql_step(&t->sql, s)) == SQLITE_ROW) {
        const char *line = lj_sql_text(s, 0);
        if (line && spec->keep &&
            !spec->keep(spec->user, lj_tdb_text_or(s, 1, ""), lj_tdb_text_or(s, 2, "")))
            continue;
        if (!line || fputs(line, f) == EOF || fputc('\n', f) == EOF) {
            *io_failed = 1;
            rc = line ? SQLITE_IOERR : SQLITE_NOMEM;
            break;
        }
        (*n)++;
    }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* The export is written to a private temporary file beside path, synced and renamed over it,
 * so a failure part-way (a full disk) never leaves a truncated file under the final name that
 * an import would take for the whole database; the temporary file is removed on failure. A path
 * that names something other than a regular file (/dev/stdout, a pipe) is written in place. */
static lajit_status export_file(lj_tunedb *t, const char *path, const export_spec *spec, int *rows)
{
    struct stat sb;
    char *tmp = NULL;
    int fd, err;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        fd = lj_fs_open(t->env, path, O_WRONLY | O_CLOEXEC, 0);
        err = errno;
    } else {
        lj_buf pb;
        lj_buf_init(&pb, t->env);
        lj_buf_printf(&pb, "%s.tmp-", path);
        char *prefix = lj_buf_take(&pb);
        if (!prefix)
            return lj_oom(t->env);
        fd = lj_fs_create_tmp(t->env, AT_FDCWD, prefix, '-', O_WRONLY, &tmp);
        err = errno;
        lj_free(t->env, prefix);
    }
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        if (fd >= 0) {
            err = errno;
            close(fd);
            if (tmp)
                unlink(tmp);
        }
        lj_free(t->env, tmp);
        return err == ENOMEM
                   ? lj_oom(t->env)
                   : lj_error(t->env, LAJIT_ERR_IO, "cannot write %s: %s", path, strerror(err));
    }
    int n = 0, io_failed = 0;
    /* One read transaction, so the export is one consistent snapshot. */
    int rc = lj_sql_exec(&t->sql, "BEGIN");
    for (int i = 0; rc == SQLITE_OK && spec->queries[i]; i++)
        rc = export_rows(t, spec->queries[i], spec, f, &n, &io_failed);
    lajit_status st = LAJIT_OK;
    if (io_failed)
        st = rc == SQLITE_NOMEM
                 ? lj_oom(t->env)
                 : lj_error(t->env, LAJIT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    else if (rc != SQLITE_OK)
        st = lj_tdb_error(t, "exporting");
    /* The read transaction must end whatever happened, or the handle's next write fails. */
    if (sqlite3_get_autocommit(t->sql.db) == 0 && lj_sql_exec(&t->sql, "COMMIT") != SQLITE_OK) {
        if (st == LAJIT_OK)
            st = lj_tdb_error(t, "exporting");
        if (sqlite3_get_autocommit(t->sql.db) == 0)
            lj_sql_exec(&t->sql, "ROLLBACK");
    }
    if (st == LAJIT_OK &&
        (lj_fs_fflush(t->env, f) != 0 || (tmp && lj_fs_fsync(t->env, fileno(f)) != 0)))
        st = lj_error(t->env, LAJIT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    if (fclose(f) != 0 && st == LAJIT_OK)
        st = lj_error(t->env, LAJIT_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    if (tmp && st == LAJIT_OK && lj_fs_renameat(t->env, AT_FDCWD, tmp, AT_FDCWD, path) != 0)
        st = lj_error(t->env, LAJIT_ERR_IO, "cannot rename %s to %s: %s", tmp, path,
                      strerror(errno));
    if (tmp && st != LAJIT_OK)
        unlink(tmp);
    lj_free(t->env, tmp);
    if (st == LAJIT_OK)
        *rows = n;
    return st;
}

lajit_status lj_tunedb_export(lj_tunedb *t, const char *path, int *rows)
{
    static const char *const queries[] = {export_measurements, export_winners, NULL};
    export_spec spec = {queries, NULL, 1.0, NULL, NULL};
    return export_file(t, path, &spec, rows);
}

lajit_status lj_tunedb_export_shipped(lj_tunedb *t, const char *path, const char *device,
                                      double min_gain, lj_tunedb_keep_fn keep, void *user,
                                      int *rows)
{
    static const char *const queries[] = {export_shipped, NULL};
    if (!(min_gain >= 0 && min_gain <= 1))
        return lj_error(t->env, LAJIT_ERR_INVALID_ARGUMENT,
                        "shipped export: minimum gain %g is not between 0 and 1", min_gain);
    export_spec spec = {queries, device, 1.0 + min_gain, keep, user};
    return export_file(t, path, &spec, rows);
}

/* ---- Import ---------------------------------------------------------------------------------- */

/* The fields of a line, in the order of the query below. */
enum {
    F_KIND,
    F_DEVICE,
    F_CC,
    F_SMS,
    F_DRIVER,
    F_NVRTC,
    F_FAMILY,
    F_TEMPLATE_HASH,
    F_BUCKET,
    F_CONFIG,
    F_MS,
    F_FAILURE,
    F_DEFAULT_CONFIG,
    F_DEFAULT_MS,
    F_AT,
    N_FIELDS
};
static const char *const field_names[N_FIELDS] = {
    "kind",   "device", "cc", "sms",     "driver",         "nvrtc",      "family", "template_hash",
    "bucket", "config", "ms", "failure", "default_config", "default_ms", "at"};

/* Sane ranges of the integer fields: wider than any real value, narrow enough for an int. */
static const struct {
    int field;
    long long lo, hi;
} int_ranges[] = {
    {F_CC, 0, 10000},        {F_SMS, 0, 1000000},  {F_DRIVER, 0, 100000000},
    {F_NVRTC, 0, 100000000}, {F_AT, 0, 1LL << 40},
};

/* Column 0: the number of keys that are not ours or repeat; then per field its JSON type, its
 * value and its JSON text as written (to see escapes json_extract hides: it stops a string at
 * \u0000). Run only on a line that json_valid accepted as an object. */
#define FIELD(name) \
    ", json_type(?1, '$." name "'), json_extract(?1, '$." name "'), ?1 -> '$." name "'"
static const char line_query[] =
    "SELECT (SELECT count(*) - count(DISTINCT key) + sum(key NOT IN ('kind', 'device', 'cc',"
    "  'sms', 'driver', 'nvrtc', 'family', 'template_hash', 'bucket', 'config', 'ms', 'failure',"
    "  'default_config', 'default_ms', 'at')) FROM json_each(?1))" FIELD("kind") FIELD("device")
        FIELD("cc") FIELD("sms") FIELD("driver") FIELD("nvrtc") FIELD("family")
            FIELD("template_hash") FIELD("bucket") FIELD("config") FIELD("ms") FIELD("failure")
                FIELD("default_config") FIELD("default_ms") FIELD("at");
#undef FIELD
#define TYPE_COL(f)  (1 + 3 * (f))
#define VALUE_COL(f) (2 + 3 * (f))
#define RAW_COL(f)   (3 + 3 * (f))

/* 1 when the JSON string text raw (valid JSON, quotes included) has a \u0000 escape. */
static int has_nul_escape(const char *raw)
{
    for (const char *p = raw; *p; p++) {
        if (*p != '\\')
            continue;
        if (p[1] == 'u' && strncmp(p + 2, "0000", 4) == 0)
            return 1;
        if (p[1])
            p++; /* the escaped character is not the start of another escape */
    }
    return 0;
}

typedef struct import_row {
    int winner;
    lj_tune_id id;
    char config[256], default_config[256], failure[256];
    double ms, default_ms;
    long long at;
    int has_ms, has_default_ms, has_failure, has_default_config;
} import_row;

/* The JSON type of field f in the current row of the line query ("null" when absent). */
static const char *type_of(sqlite3_stmt *s, int f)
{
    const char *t = (const char *)sqlite3_column_text(s, TYPE_COL(f));
    return t ? t : "null";
}

/* A string field into out (cap bytes). 1 when present and fine; 0 when absent or null (only
 * when optional); -1 with why set when wrong. */
static int get_string(sqlite3_stmt *s, int f, int optional, char *out, size_t cap, char *why,
                      size_t wcap)
{
    const char *type = type_of(s, f);
    if (strcmp(type, "null") == 0) {
        if (optional)
            return 0;
        snprintf(why, wcap, "\"%s\" is missing", field_names[f]);
        return -1;
    }
    if (strcmp(type, "text") != 0) {
        snprintf(why, wcap, "\"%s\" is not a string", field_names[f]);
        return -1;
    }
    const char *v = lj_sql_text(s, VALUE_COL(f));
    const char *raw = (const char *)sqlite3_column_text(s, RAW_COL(f));
    if (!v || !raw || has_nul_escape(raw)) {
        snprintf(why, wcap, "\"%s\" contains a NUL character", field_names[f]);
        return -1;
    }
    if (strlen(v) >= cap || (!optional && !*v)) {
        snprintf(why, wcap, "\"%s\" is %s (at most %zu characters)", field_names[f],
                 *v ? "too long" : "empty", cap - 1);
        return -1;
    }
    memcpy(out, v, strlen(v) + 1);
    return 1;
}

/* A time in milliseconds: finite and not negative. Same returns as get_string. */
static int get_ms(sqlite3_stmt *s, int f, int optional, double *out, char *why, size_t wcap)
{
    const char *type = type_of(s, f);
    if (strcmp(type, "null") == 0) {
        if (optional)
            return 0;
        snprintf(why, wcap, "\"%s\" is missing", field_names[f]);
        return -1;
    }
    if (strcmp(type, "real") != 0 && strcmp(type, "integer") != 0) {
        snprintf(why, wcap, "\"%s\" is not a number", field_names[f]);
        return -1;
    }
    double v = sqlite3_column_double(s, VALUE_COL(f));
    if (!isfinite(v) || v < 0) {
        snprintf(why, wcap, "\"%s\" is %g, not a finite time >= 0", field_names[f], v);
        return -1;
    }
    *out = v;
    return 1;
}

/* An integer within its range (int_ranges), checked before any conversion. */
static int get_int(sqlite3_stmt *s, int f, int optional, long long *out, char *why, size_t wcap)
{
    const char *type = type_of(s, f);
    if (strcmp(type, "null") == 0) {
        if (optional)
            return 0;
        snprintf(why, wcap, "\"%s\" is missing", field_names[f]);
        return -1;
    }
    long long lo = 0, hi = 0;
    for (size_t i = 0; i < sizeof int_ranges / sizeof int_ranges[0]; i++)
        if (int_ranges[i].field == f)
            lo = int_ranges[i].lo, hi = int_ranges[i].hi;
    sqlite3_int64 v = sqlite3_column_int64(s, VALUE_COL(f));
    if (strcmp(type, "integer") != 0 || v < lo || v > hi) {
        const char *text = (const char *)sqlite3_column_text(s, VALUE_COL(f));
        snprintf(why, wcap, "\"%s\" is %.40s, not an integer in %lld..%lld", field_names[f],
                 text ? text : "?", lo, hi);
        return -1;
    }
    *out = v;
    return 1;
}

/* Checks one parsed line (the line query's row) into r. 1 when fine, else 0 with why set. */
static int to_row(sqlite3_stmt *s, import_row *r, char *why, size_t wcap)
{
    memset(r, 0, sizeof *r);
    if (sqlite3_column_int64(s, 0) != 0) {
        snprintf(why, wcap, "unknown or repeated keys");
        return 0;
    }
    char kind[16];
    long long cc, sms, drv, nv;
    if (get_string(s, F_KIND, 0, kind, sizeof kind, why, wcap) < 0)
        return 0;
    if (strcmp(kind, "winner") == 0) {
        r->winner = 1;
    } else if (strcmp(kind, "measurement") != 0) {
        snprintf(why, wcap, "\"kind\" is neither \"measurement\" nor \"winner\"");
        return 0;
    }
    if (get_string(s, F_DEVICE, 0, r->id.fp.name, sizeof r->id.fp.name, why, wcap) < 0 ||
        get_int(s, F_CC, 0, &cc, why, wcap) < 0 || get_int(s, F_SMS, 0, &sms, why, wcap) < 0 ||
        get_int(s, F_DRIVER, 0, &drv, why, wcap) < 0 ||
        get_int(s, F_NVRTC, 0, &nv, why, wcap) < 0 ||
        get_string(s, F_FAMILY, 0, r->id.family, sizeof r->id.family, why, wcap) < 0 ||
        get_string(s, F_TEMPLATE_HASH, 0, r->id.template_hash, sizeof r->id.template_hash, why,
                   wcap) < 0 ||
        get_string(s, F_BUCKET, 0, r->id.bucket, sizeof r->id.bucket, why, wcap) < 0 ||
        get_string(s, F_CONFIG, 0, r->config, sizeof r->config, why, wcap) < 0)
        return 0;
    r->id.fp.cc = (int)cc;
    r->id.fp.sms = (int)sms;
    r->id.fp.driver = (int)drv;
    r->id.fp.nvrtc = (int)nv;
    int at = get_int(s, F_AT, 1, &r->at, why, wcap);
    if (at < 0)
        return 0;
    if (at == 0)
        r->at = (long long)time(NULL);
    if ((r->has_ms = get_ms(s, F_MS, !r->winner, &r->ms, why, wcap)) < 0)
        return 0;
    if (r->winner) {
        if (strcmp(type_of(s, F_FAILURE), "null") != 0) {
            snprintf(why, wcap, "a winner has no \"failure\"");
            return 0;
        }
        if ((r->has_default_config = get_string(s, F_DEFAULT_CONFIG, 1, r->default_config,
                                                sizeof r->default_config, why, wcap)) < 0 ||
            (r->has_default_ms = get_ms(s, F_DEFAULT_MS, 1, &r->default_ms, why, wcap)) < 0)
            return 0;
        return 1;
    }
    if (strcmp(type_of(s, F_DEFAULT_CONFIG), "null") != 0 ||
        strcmp(type_of(s, F_DEFAULT_MS), "null") != 0) {
        snprintf(why, wcap, "a measurement has no default");
        return 0;
    }
    if ((r->has_failure = get_string(s, F_FAILURE, 1, r->failure, sizeof r->failure, why, wcap)) <
        0)
        return 0;
    /* Exactly one result, as lj_tunedb_record stores it: a time, or a failure that says what
     * failed. An empty failure with no time would be stored as neither and exported as a line
     * this importer refuses; with a time it would drop the time. */
    if (r->has_failure && !r->failure[0]) {
        snprintf(why, wcap, "\"failure\" is empty (a failed measurement says what failed)");
        return 0;
    }
    if (r->has_ms == r->has_failure) {
        snprintf(why, wcap, "a measurement needs either \"ms\" or \"failure\"%s",
                 r->has_ms ? ", not both" : "");
        return 0;
    }
    return 1;
}

/* Parses one line through SQLite's JSON functions. 1 when fine; 0 with why set when the line
 * is refused; -1 when SQLite failed (its message on the handle). */
static int parse_line(lj_tunedb *t, sqlite3_stmt *valid, sqlite3_stmt *fields, const char *line,
                      size_t len, import_row *r, char *why, size_t wcap)
{
    sqlite3_reset(valid);
    sqlite3_bind_text(valid, 1, line, (int)len, SQLITE_STATIC);
    int rc = lj_sql_step(&t->sql, valid);
    if (rc != SQLITE_ROW)
        return -1;
    int ok = sqlite3_column_int(valid, 0);
    sqlite3_reset(valid);
    if (!ok) {
        snprintf(why, wcap, "not a JSON object");
        return 0;
    }
    sqlite3_reset(fields);
    sqlite3_bind_text(fields, 1, line, (int)len, SQLITE_STATIC);
    if ((rc = lj_sql_step(&t->sql, fields)) != SQLITE_ROW)
        return -1;
    ok = to_row(fields, r, why, wcap);
    sqlite3_reset(fields);
    return ok;
}

static int import_one(lj_tunedb *t, const import_row *r)
{
    sqlite3_int64 dev;
    if (lj_tdb_device_id(t, &r->id.fp, 1, &dev) != SQLITE_OK)
        return 0;
    sqlite3_stmt *s;
    if (r->winner) {
        if (lj_sql_prepare(&t->sql,
                           "INSERT OR REPLACE INTO winners VALUES(?1,?2,?3,?4,?5,?6,?7,"
                           "?8,?9)",
                           &s) != SQLITE_OK)
            return 0;
        lj_tdb_bind_bucket(s, dev, &r->id);
        sqlite3_bind_text(s, 5, r->config, -1, SQLITE_STATIC);
        sqlite3_bind_double(s, 6, r->ms);
        if (r->has_default_config)
            sqlite3_bind_text(s, 7, r->default_config, -1, SQLITE_STATIC);
        if (r->has_default_ms)
            sqlite3_bind_double(s, 8, r->default_ms);
        sqlite3_bind_int64(s, 9, r->at);
    } else {
        if (lj_sql_prepare(&t->sql,
                           "INSERT OR REPLACE INTO measurements VALUES(?1,?2,?3,?4,?5,"
                           "?6,?7,?8)",
                           &s) != SQLITE_OK)
            return 0;
        lj_tdb_bind_bucket(s, dev, &r->id);
        sqlite3_bind_text(s, 5, r->config, -1, SQLITE_STATIC);
        if (r->has_ms)
            sqlite3_bind_double(s, 6, r->ms);
        if (r->has_failure)
            sqlite3_bind_text(s, 7, r->failure, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 8, r->at);
    }
    int rc = lj_sql_step(&t->sql, s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE;
}

#define MAX_LINE 4096

/* Reads one line (without its newline) into buf. Returns 1 for a line, 0 at the end, -1 when
 * it is longer than MAX_LINE - 1 bytes or holds a NUL byte (*why says which). */
static int read_line(FILE *f, char *buf, size_t *len, const char **why)
{
    size_t n = 0;
    int c, any = 0;
    while ((c = getc(f)) != EOF) {
        any = 1;
        if (c == '\n')
            break;
        if (c == 0) {
            *why = "a NUL byte";
            return -1;
        }
        if (n + 1 >= MAX_LINE) {
            *why = "line too long";
            return -1;
        }
        buf[n++] = (char)c;
    }
    buf[n] = 0;
    *len = n;
    return any;
}

lajit_status lj_tunedb_import(lj_tunedb *t, const char *path, const lj_fingerprint *local,
                              int force, int *rows)
{
    lajit_status st = lj_tdb_writable(t, "importing");
    if (st != LAJIT_OK)
        return st;
    FILE *f = lj_fs_fopen(t->env, path, "r");
    if (!f)
        return lj_error(t->env, LAJIT_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    /* Parse and check the whole file before writing anything, so a refused import changes
     * nothing. */
    import_row *list = NULL;
    int n = 0, cap = 0, lineno = 0;
    char *line = lj_malloc(t->env, MAX_LINE);
    sqlite3_stmt *valid = NULL, *fields = NULL;
    if (!line)
        st = lj_oom(t->env);
    else if (lj_sql_prepare(&t->sql,
                            "SELECT CASE WHEN json_valid(?1) THEN json_type(?1) = 'object'"
                            " ELSE 0 END",
                            &valid) != SQLITE_OK ||
             lj_sql_prepare(&t->sql, line_query, &fields) != SQLITE_OK)
        st = lj_tdb_error(t, "importing");
    while (st == LAJIT_OK) {
        size_t len;
        const char *bad = NULL;
        int got = read_line(f, line, &len, &bad);
        if (got == 0)
            break;
        lineno++;
        if (got < 0) {
            st = lj_error(t->env, LAJIT_ERR_INVALID_ARGUMENT, "%s:%d: %s", path, lineno, bad);
            break;
        }
        if (strspn(line, " \t\r") == len)
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
        char why[256];
        int ok = parse_line(t, valid, fields, line, len, &list[n], why, sizeof why);
        if (ok < 0) {
            st = lj_tdb_error(t, "importing");
            break;
        }
        if (!ok) {
            st = lj_error(t->env, LAJIT_ERR_INVALID_ARGUMENT,
                          "%s:%d: not a tuning database row: %s; nothing imported", path, lineno,
                          why);
            break;
        }
        const lj_fingerprint *fp = &list[n].id.fp;
        if (!force && (!local || strcmp(fp->name, local->name) != 0 || fp->cc != local->cc)) {
            st = local ? lj_error(t->env, LAJIT_ERR_INVALID_ARGUMENT,
                                  "%s:%d: results for %s (cc %d), this device is %s (cc %d); "
                                  "force to import anyway",
                                  path, lineno, fp->name, fp->cc, local->name, local->cc)
                       : lj_error(t->env, LAJIT_ERR_INVALID_ARGUMENT,
                                  "%s:%d: results for %s (cc %d) and no device to compare "
                                  "with; force to import anyway",
                                  path, lineno, fp->name, fp->cc);
            break;
        }
        n++;
    }
    sqlite3_finalize(valid);
    sqlite3_finalize(fields);
    if (st == LAJIT_OK && lj_fs_ferror(t->env, f))
        st = lj_error(t->env, LAJIT_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    fclose(f);
    lj_free(t->env, line);
    if (st == LAJIT_OK) {
        if (lj_sql_exec(&t->sql, "BEGIN IMMEDIATE") != SQLITE_OK) {
            st = lj_tdb_error(t, "importing");
        } else {
            int ok = 1;
            for (int i = 0; i < n && ok; i++)
                ok = import_one(t, &list[i]);
            if (ok && lj_sql_exec(&t->sql, "COMMIT") == SQLITE_OK) {
                *rows = n;
            } else {
                st = lj_tdb_error(t, "importing");
                lj_sql_exec(&t->sql, "ROLLBACK");
            }
        }
    }
    lj_free(t->env, list);
    return st;
}
