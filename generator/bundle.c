/* bundle.c — the offline kernel set file (bundle.h): an SQLite database with one table of
 * kernels and a format version, written once by `lajit gen`, read-only afterwards.
 *
 * A bundle comes from outside (shipped with an application, copied between machines), so
 * reading treats it as hostile until checked: the file must be a regular file, not a link, and
 * of sane size; SQLite opens it read-only and immutable (no locks, no journal or WAL files
 * beside it) with the defensive settings of sql.h and a bound on the work of any query; the
 * `kernels` object must be a plain table with exactly the expected columns; every value is
 * type-checked when read; and each row carries a checksum over everything that selects it
 * (source key, arch, PTX flag, family, bucket, configuration, problem, entry) and its image, so
 * a row copied under another key or arch is refused like a damaged one. */
#include "bundle.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fs.h"
#include "lajit.h"
#include "sql.h"

/* A bundle bigger than this is not one lajit wrote (a few hundred kernels of < 1 MiB). */
#define MAX_BUNDLE_BYTES ((long long)4 << 30)
/* Progress-handler ticks (1000 instructions each) any one query may take. */
#define WORK_LIMIT 20000

static const char schema[] =
    "CREATE TABLE meta(name TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE kernels("
    "  source_key TEXT NOT NULL, arch TEXT NOT NULL, ptx INTEGER NOT NULL,"
    "  family TEXT NOT NULL, bucket TEXT NOT NULL, config TEXT NOT NULL, problem TEXT NOT NULL,"
    "  entry TEXT NOT NULL, image BLOB NOT NULL, checksum TEXT NOT NULL,"
    "  PRIMARY KEY(source_key, arch, ptx, family, bucket));"
    "CREATE INDEX kernels_by_config ON kernels(family, bucket, config, ptx);";

/* The columns of `kernels` as the schema declares them, in order (checked at open). */
static const char *const columns[][2] = {
    {"source_key", "TEXT"}, {"arch", "TEXT"},     {"ptx", "INTEGER"},  {"family", "TEXT"},
    {"bucket", "TEXT"},     {"config", "TEXT"},   {"problem", "TEXT"}, {"entry", "TEXT"},
    {"image", "BLOB"},      {"checksum", "TEXT"},
};
#define N_COLUMNS ((int)(sizeof columns / sizeof columns[0]))

/* Every query that reads a whole row selects the columns in this order. */
#define ROW_COLUMNS "source_key, arch, ptx, family, bucket, config, problem, entry, image, checksum"

/* Images handed out by the reader, kept until close. */
typedef struct held_image {
    struct held_image *next;
    size_t size;
    unsigned char data[];
} held_image;

struct lj_bundle {
    lj_env *env;
    lj_sql sql;
    char *path;     /* the final path */
    char *tmp_path; /* writing: the file being written */
    int tmp_fd;     /* writing: the temporary file, created O_EXCL | O_NOFOLLOW */
    held_image *held;
};

static lajit_status db_error(lj_bundle *b, const char *what)
{
    return lj_error(b->env, LAJIT_ERR_DATABASE, "bundle %s: %s: %s", b->path, what,
                    lj_sql_errmsg(&b->sql));
}

/* The row's checksum: XXH3-64 over the fields that select it, each with its length (so no two
 * field lists run together the same way), and the XXH3-64 of the image. NULL fields are not
 * allowed: a reader passes only values it type-checked. 0 when out of memory. */
static int row_checksum(lj_env *env, const char *key, const char *arch, int ptx, const char *family,
                        const char *bucket, const char *config, const char *problem,
                        const char *entry, const void *image, size_t size, char out[17])
{
    const char *fields[] = {key,     arch, ptx ? "ptx" : "cubin", family, bucket, config,
                            problem, entry};
    lj_buf t;
    lj_buf_init(&t, env);
    lj_buf_printf(&t, "lajit bundle row %d\n", LJ_BUNDLE_FORMAT);
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        lj_buf_printf(&t, "%zu:", strlen(fields[i]));
        lj_buf_puts(&t, fields[i]);
        lj_buf_puts(&t, "\n");
    }
    lj_buf_printf(&t, "image %zu %016llx\n", size,
                  (unsigned long long)lj_hash64(image ? image : "", size));
    if (t.failed) {
        lj_buf_free(&t);
        return 0;
    }
    snprintf(out, 17, "%016llx", (unsigned long long)lj_hash64(t.data, t.len));
    lj_buf_free(&t);
    return 1;
}

static lj_bundle *alloc_bundle(lj_env *env, const char *path)
{
    lj_bundle *b = lj_calloc(env, 1, sizeof *b);
    if (!b)
        return NULL;
    b->env = env;
    b->tmp_fd = -1;
    b->sql.env = env;
    if (!(b->path = lj_strdup(env, path))) {
        lj_free(env, b);
        return NULL;
    }
    return b;
}

static void free_bundle(lj_bundle *b)
{
    if (b->sql.db)
        lj_sql_close(&b->sql);
    if (b->tmp_fd >= 0)
        close(b->tmp_fd);
    for (held_image *h = b->held, *next; h; h = next) {
        next = h->next;
        lj_free(b->env, h);
    }
    lj_free(b->env, b->tmp_path);
    lj_free(b->env, b->path);
    lj_free(b->env, b);
}

/* ---- Writing --------------------------------------------------------------------------------- */

/* Creates b->tmp_path beside the final path: a fresh name, O_EXCL | O_NOFOLLOW, mode 0600, so
 * a file or link planted in a shared directory is never written through. */
static lajit_status create_tmp(lj_bundle *b)
{
    lj_buf t;
    lj_buf_init(&t, b->env);
    lj_buf_printf(&t, "%s.tmp-", b->path);
    char *prefix = lj_buf_take(&t);
    if (!prefix)
        return lj_oom(b->env);
    b->tmp_fd = lj_fs_create_tmp(b->env, AT_FDCWD, prefix, '-', O_RDWR, &b->tmp_path);
    int err = errno;
    lj_free(b->env, prefix);
    if (b->tmp_fd >= 0)
        return LAJIT_OK;
    if (err == ENOMEM)
        return lj_oom(b->env);
    return lj_error(b->env, LAJIT_ERR_IO, "bundle %s: cannot create a temporary file: %s", b->path,
                    strerror(err));
}

/* 1 when the name still refers to the file created by create_tmp (nobody swapped it between
 * our open and SQLite's). */
static int tmp_is_ours(lj_bundle *b)
{
    struct stat a, n;
    return fstat(b->tmp_fd, &a) == 0 && lstat(b->tmp_path, &n) == 0 && a.st_dev == n.st_dev &&
           a.st_ino == n.st_ino;
}

lajit_status lj_bundle_create(lj_env *env, const char *path, lj_bundle **out)
{
    lj_bundle *b = alloc_bundle(env, path);
    if (!b)
        return lj_oom(env);
    lajit_status st = create_tmp(b);
    if (st != LAJIT_OK) {
        free_bundle(b);
        return st;
    }
    char sql[160];
    /* journal_mode MEMORY: the file is new and private until renamed, so a crash loses nothing
     * worth a journal (and defensive mode refuses journal_mode OFF). */
    snprintf(sql, sizeof sql,
             "PRAGMA user_version=%d; PRAGMA journal_mode=MEMORY; PRAGMA synchronous=OFF; BEGIN;",
             LJ_BUNDLE_FORMAT);
    if (lj_sql_open(&b->sql, env, b->tmp_path, SQLITE_OPEN_READWRITE, 0) != SQLITE_OK)
        st = db_error(b, "cannot create");
    else if (!tmp_is_ours(b))
        st = lj_error(env, LAJIT_ERR_IO, "bundle %s: the temporary file %s was replaced", b->path,
                      b->tmp_path);
    else if (lj_sql_exec(&b->sql, schema) != SQLITE_OK || lj_sql_exec(&b->sql, sql) != SQLITE_OK)
        st = db_error(b, "cannot write the schema");
    if (st == LAJIT_OK) {
        sqlite3_stmt *s = NULL;
        if (lj_sql_prepare(&b->sql,
                           "INSERT INTO meta VALUES('lajit', ?1), ('created', datetime('now'))",
                           &s) != SQLITE_OK ||
            sqlite3_bind_text(s, 1, LAJIT_VERSION_STRING, -1, SQLITE_STATIC) != SQLITE_OK ||
            lj_sql_step(&b->sql, s) != SQLITE_DONE)
            st = db_error(b, "cannot write meta");
        sqlite3_finalize(s);
    }
    if (st != LAJIT_OK) {
        unlink(b->tmp_path);
        free_bundle(b);
        return st;
    }
    *out = b;
    return LAJIT_OK;
}

lajit_status lj_bundle_add(lj_bundle *b, const lj_bundle_item *it)
{
    if (!it->family || !it->arch || !it->bucket || !it->config || (!it->image && it->size))
        return lj_error(b->env, LAJIT_ERR_INVALID_ARGUMENT, "bundle %s: incomplete item", b->path);
    if (it->size > LJ_SQL_MAX_LENGTH)
        return lj_error(b->env, LAJIT_ERR_INVALID_ARGUMENT,
                        "bundle %s: a kernel image of %zu bytes is too large", b->path, it->size);
    const char *problem = it->problem ? it->problem : "", *entry = it->entry ? it->entry : "";
    char key[33], sum[17];
    lj_key_hex(it->source_key, key);
    if (!row_checksum(b->env, key, it->arch, it->ptx != 0, it->family, it->bucket, it->config,
                      problem, entry, it->image, it->size, sum))
        return lj_oom(b->env);
    sqlite3_stmt *s = NULL;
    lajit_status st = LAJIT_OK;
    if (lj_sql_prepare(&b->sql,
                       "INSERT OR REPLACE INTO kernels(" ROW_COLUMNS ")"
                       " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                       &s) != SQLITE_OK)
        return db_error(b, "cannot prepare an insert");
    sqlite3_bind_text(s, 1, key, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, it->arch, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(s, 3, it->ptx ? 1 : 0);
    sqlite3_bind_text(s, 4, it->family, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 5, it->bucket, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 6, it->config, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 7, problem, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 8, entry, -1, SQLITE_TRANSIENT);
    sqlite3_bind_blob64(s, 9, it->image ? it->image : "", (sqlite3_uint64)it->size,
                        SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 10, sum, -1, SQLITE_TRANSIENT);
    if (lj_sql_step(&b->sql, s) != SQLITE_DONE)
        st = db_error(b, "cannot add a kernel");
    sqlite3_finalize(s);
    return st;
}

lajit_status lj_bundle_finish(lj_bundle *b)
{
    lajit_status st = LAJIT_OK;
    if (lj_sql_exec(&b->sql, "COMMIT") != SQLITE_OK)
        st = db_error(b, "cannot commit");
    if (lj_sql_close(&b->sql) != SQLITE_OK && st == LAJIT_OK)
        st = lj_error(b->env, LAJIT_ERR_DATABASE, "bundle %s: cannot close", b->path);
    if (st == LAJIT_OK && lj_fs_fsync(b->env, b->tmp_fd) != 0)
        st = lj_error(b->env, LAJIT_ERR_IO, "bundle %s: cannot sync %s: %s", b->path, b->tmp_path,
                      strerror(errno));
    if (st == LAJIT_OK && !tmp_is_ours(b))
        st = lj_error(b->env, LAJIT_ERR_IO, "bundle %s: the temporary file %s was replaced",
                      b->path, b->tmp_path);
    if (st == LAJIT_OK && lj_fs_renameat(b->env, AT_FDCWD, b->tmp_path, AT_FDCWD, b->path) != 0)
        st = lj_error(b->env, LAJIT_ERR_IO, "cannot rename %s to %s: %s", b->tmp_path, b->path,
                      strerror(errno));
    if (st != LAJIT_OK)
        unlink(b->tmp_path);
    free_bundle(b);
    return st;
}

void lj_bundle_abort(lj_bundle *b)
{
    if (!b)
        return;
    if (b->sql.db)
        lj_sql_close(&b->sql);
    unlink(b->tmp_path);
    free_bundle(b);
}

/* ---- Reading --------------------------------------------------------------------------------- */

/* The file itself, before SQLite sees it: a regular file (no link, FIFO or device), of sane
 * size. NULL when fine, else why not. */
static const char *file_problem(lj_env *env, const char *path, char *why, size_t cap)
{
    int fd = lj_fs_open(env, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(why, cap, "%s", errno == ELOOP ? "a symbolic link: refused" : strerror(errno));
        return why;
    }
    struct stat st;
    const char *problem = NULL;
    if (fstat(fd, &st) != 0)
        snprintf(why, cap, "%s", strerror(errno)), problem = why;
    else if (!S_ISREG(st.st_mode))
        problem = "not a regular file: refused";
    else if ((long long)st.st_size > MAX_BUNDLE_BYTES)
        snprintf(why, cap, "%lld bytes, more than a bundle may have (%lld)", (long long)st.st_size,
                 MAX_BUNDLE_BYTES),
            problem = why;
    close(fd);
    return problem;
}

/* One integer from a single-row query; SQLITE_OK and *out, or the failing code. */
static int query_int(lj_bundle *b, const char *sql, int *out)
{
    sqlite3_stmt *s;
    int rc = lj_sql_prepare(&b->sql, sql, &s);
    if (rc == SQLITE_OK) {
        rc = lj_sql_step(&b->sql, s);
        if (rc == SQLITE_ROW && sqlite3_column_type(s, 0) == SQLITE_INTEGER) {
            *out = sqlite3_column_int(s, 0);
            rc = SQLITE_OK;
        } else if (rc == SQLITE_ROW || rc == SQLITE_DONE) {
            rc = SQLITE_MISMATCH;
        }
    }
    sqlite3_finalize(s);
    return rc;
}

/* The schema: `kernels` is an ordinary table (not a view, not virtual) with exactly the
 * expected columns and declared types. */
static lajit_status check_schema(lj_bundle *b)
{
    sqlite3_stmt *s;
    if (lj_sql_prepare(&b->sql, "SELECT type, sql FROM sqlite_schema WHERE name = 'kernels'", &s) !=
        SQLITE_OK)
        return db_error(b, "not a bundle (not an SQLite database, or damaged)");
    int rc = lj_sql_step(&b->sql, s), ok = 0;
    if (rc == SQLITE_ROW) {
        const char *type = lj_sql_text(s, 0), *sql = lj_sql_text(s, 1);
        ok = type && sql && strcmp(type, "table") == 0 &&
             strncmp(sql, "CREATE TABLE kernels(", 21) == 0;
        rc = lj_sql_step(&b->sql, s);
        if (rc == SQLITE_ROW)
            ok = 0; /* two objects of one name cannot be: damaged */
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return db_error(b, "cannot read the schema");
    if (!ok)
        return lj_error(b->env, LAJIT_ERR_DATABASE,
                        "bundle %s: not a bundle (`kernels` is missing or not a plain table)",
                        b->path);
    if (lj_sql_prepare(&b->sql, "SELECT name, type FROM pragma_table_info('kernels') ORDER BY cid",
                       &s) != SQLITE_OK)
        return db_error(b, "cannot read the schema");
    int n = 0;
    ok = 1;
    while ((rc = lj_sql_step(&b->sql, s)) == SQLITE_ROW) {
        const char *name = lj_sql_text(s, 0), *type = lj_sql_text(s, 1);
        if (n >= N_COLUMNS || !name || !type || strcmp(name, columns[n][0]) != 0 ||
            strcmp(type, columns[n][1]) != 0)
            ok = 0;
        n++;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return db_error(b, "cannot read the schema");
    if (!ok || n != N_COLUMNS)
        return lj_error(b->env, LAJIT_ERR_DATABASE,
                        "bundle %s: not a bundle (the `kernels` table has other columns)", b->path);
    return LAJIT_OK;
}

lajit_status lj_bundle_open(lj_env *env, const char *path, lj_bundle **out)
{
    char why[256];
    const char *problem = file_problem(env, path, why, sizeof why);
    if (problem)
        return lj_error(env, LAJIT_ERR_DATABASE, "bundle %s: %s", path, problem);
    lj_bundle *b = alloc_bundle(env, path);
    if (!b)
        return lj_oom(env);
    /* immutable: the bundle is read-only once written, so SQLite takes no locks and creates
     * no journal or WAL file beside it. */
    char *uri = lj_sql_immutable_uri(env, path);
    if (!uri) {
        free_bundle(b);
        return lj_oom(env);
    }
    lajit_status st = LAJIT_OK;
    int version = -1;
    if (lj_sql_open(&b->sql, env, uri, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, WORK_LIMIT) !=
        SQLITE_OK)
        st = db_error(b, "cannot open");
    else if (query_int(b, "PRAGMA user_version", &version) != SQLITE_OK)
        st = db_error(b, "not a bundle (not an SQLite database, or damaged)");
    else if (version < LJ_BUNDLE_FORMAT)
        st = lj_error(env, LAJIT_ERR_DATABASE,
                      "bundle %s: format %d was written by an older lajit, whose checksums do not "
                      "cover what selects a kernel; this build reads format %d: write it again "
                      "with `lajit gen`",
                      path, version, LJ_BUNDLE_FORMAT);
    else if (version > LJ_BUNDLE_FORMAT)
        st = lj_error(env, LAJIT_ERR_DATABASE,
                      "bundle %s: format %d is from a later lajit; this build reads format %d",
                      path, version, LJ_BUNDLE_FORMAT);
    lj_free(env, uri);
    if (st == LAJIT_OK)
        st = check_schema(b);
    /* The whole file must be sound: a truncated bundle fails here, not at a later lookup. */
    if (st == LAJIT_OK) {
        sqlite3_stmt *s = NULL;
        int rc = lj_sql_prepare(&b->sql, "PRAGMA quick_check", &s);
        if (rc == SQLITE_OK)
            rc = lj_sql_step(&b->sql, s);
        const char *r = rc == SQLITE_ROW ? lj_sql_text(s, 0) : NULL;
        if (rc != SQLITE_ROW)
            st = db_error(b, "damaged (integrity check failed)");
        else if (!r || strcmp(r, "ok") != 0)
            st = lj_error(env, LAJIT_ERR_DATABASE, "bundle %s: damaged (integrity: %.200s)", path,
                          r ? r : "?");
        sqlite3_finalize(s);
    }
    if (st != LAJIT_OK) {
        free_bundle(b);
        return st;
    }
    *out = b;
    return LAJIT_OK;
}

/* The fields of a row read with ROW_COLUMNS, type-checked: every text a string without NUL,
 * ptx an integer, image a blob. */
typedef struct row {
    const char *key, *arch, *family, *bucket, *config, *problem, *entry, *checksum;
    int ptx;
    const void *image;
    size_t size;
} row;

/* 1 when the current row of s is well-typed and its checksum matches what selects it; 0 (with a
 * WARN line) when not; -1 when out of memory. */
static int read_row(lj_bundle *b, sqlite3_stmt *s, row *r)
{
    memset(r, 0, sizeof *r);
    const char **texts[] = {&r->key,    &r->arch,    NULL,      &r->family, &r->bucket,
                            &r->config, &r->problem, &r->entry, NULL,       &r->checksum};
    int ok = 1;
    for (int i = 0; i < N_COLUMNS; i++)
        if (texts[i] && !(*texts[i] = lj_sql_text(s, i)))
            ok = 0;
    if (sqlite3_column_type(s, 2) != SQLITE_INTEGER ||
        (sqlite3_column_int64(s, 2) != 0 && sqlite3_column_int64(s, 2) != 1))
        ok = 0;
    r->ptx = sqlite3_column_int(s, 2);
    if (sqlite3_column_type(s, 8) != SQLITE_BLOB)
        ok = 0;
    r->image = sqlite3_column_blob(s, 8);
    r->size = (size_t)sqlite3_column_bytes(s, 8);
    if (ok && (!r->image || !r->size))
        ok = 0;
    /* The texts above are pointers into the row: reading the blob after them converts nothing,
     * so they stay valid. */
    char sum[17];
    if (ok && !row_checksum(b->env, r->key, r->arch, r->ptx, r->family, r->bucket, r->config,
                            r->problem, r->entry, r->image, r->size, sum))
        return -1;
    if (ok && strcmp(sum, r->checksum) == 0)
        return 1;
    lj_log(b->env, LAJIT_LOG_WARN, "bundle %s: the kernel %s [%s] for %s fails its %s: not used",
           b->path, r->family ? r->family : "?", r->config ? r->config : "?",
           r->arch ? r->arch : "?", ok ? "checksum" : "checksum (values of the wrong type)");
    return 0;
}

/* Copies the image of a checked row into a held buffer. */
static lajit_status take_image(lj_bundle *b, const row *r, const void **image, size_t *size,
                               int *found)
{
    held_image *h = lj_malloc(b->env, sizeof *h + r->size + 1);
    if (!h)
        return lj_oom(b->env);
    memcpy(h->data, r->image, r->size);
    h->data[r->size] = 0;
    h->size = r->size;
    h->next = b->held;
    b->held = h;
    *image = h->data;
    *size = r->size;
    *found = 1;
    return LAJIT_OK;
}

lajit_status lj_bundle_find(lj_bundle *b, lj_key source_key, const char *arch, int ptx,
                            const void **image, size_t *size, int *found)
{
    *found = 0;
    char key[33];
    lj_key_hex(source_key, key);
    sqlite3_stmt *s = NULL;
    if (lj_sql_prepare(&b->sql,
                       "SELECT " ROW_COLUMNS " FROM kernels"
                       " WHERE source_key = ?1 AND arch = ?2 AND ptx = ?3",
                       &s) != SQLITE_OK)
        return db_error(b, "cannot query");
    sqlite3_bind_text(s, 1, key, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, arch, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(s, 3, ptx ? 1 : 0);
    lajit_status st = LAJIT_OK;
    int rc = SQLITE_DONE;
    /* The first row that passes and is exactly what was asked for (the WHERE clause compares
     * with SQLite's type conversions; the checked values must match byte for byte). */
    while (st == LAJIT_OK && !*found && (rc = lj_sql_step(&b->sql, s)) == SQLITE_ROW) {
        row r;
        int ok = read_row(b, s, &r);
        if (ok < 0)
            st = lj_oom(b->env);
        else if (ok && strcmp(r.key, key) == 0 && strcmp(r.arch, arch) == 0 &&
                 r.ptx == (ptx ? 1 : 0))
            st = take_image(b, &r, image, size, found);
    }
    if (st == LAJIT_OK && !*found && rc != SQLITE_DONE)
        st = db_error(b, "cannot read");
    sqlite3_finalize(s);
    return st;
}

/* "sm_80" -> 80, "sm_90a" -> 90 with *specific = 1; -1 for anything else. */
static int arch_cc(const char *arch, int *specific)
{
    int cc = 0, digits = 0;
    if (strncmp(arch, "sm_", 3) != 0)
        return -1;
    const char *p = arch + 3;
    while (*p >= '0' && *p <= '9' && digits < 4) {
        cc = cc * 10 + (*p++ - '0');
        digits++;
    }
    *specific = *p == 'a' || *p == 'f';
    if (!digits || (*p && !(*specific && p[1] == 0)))
        return -1;
    return cc;
}

lajit_status lj_bundle_find_ptx(lj_bundle *b, const char *family, const char *bucket,
                                const char *config, int cc, const void **image, size_t *size,
                                char arch_out[16], int *found)
{
    *found = 0;
    sqlite3_stmt *s = NULL;
    if (lj_sql_prepare(&b->sql,
                       "SELECT " ROW_COLUMNS " FROM kernels"
                       " WHERE family = ?1 AND bucket = ?2 AND config = ?3 AND ptx = 1",
                       &s) != SQLITE_OK)
        return db_error(b, "cannot query");
    sqlite3_bind_text(s, 1, family, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, bucket, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 3, config, -1, SQLITE_TRANSIENT);
    /* The newest plain arch not newer than the device: remember it, then reread its row. */
    int best_cc = -1, rc;
    char best[16] = "";
    lajit_status st = LAJIT_OK;
    while (st == LAJIT_OK && (rc = lj_sql_step(&b->sql, s)) == SQLITE_ROW) {
        row r;
        int ok = read_row(b, s, &r), specific = 0;
        if (ok < 0) {
            st = lj_oom(b->env);
            break;
        }
        int c = ok ? arch_cc(r.arch, &specific) : -1;
        if (ok && strcmp(r.family, family) == 0 && strcmp(r.bucket, bucket) == 0 &&
            strcmp(r.config, config) == 0 && c >= 0 && !specific && c <= cc && c > best_cc &&
            strlen(r.arch) < sizeof best) {
            best_cc = c;
            snprintf(best, sizeof best, "%s", r.arch);
        }
    }
    if (st == LAJIT_OK && rc != SQLITE_DONE)
        st = db_error(b, "cannot read");
    sqlite3_reset(s);
    while (st == LAJIT_OK && best_cc >= 0 && !*found) {
        rc = lj_sql_step(&b->sql, s);
        if (rc != SQLITE_ROW) {
            if (rc != SQLITE_DONE)
                st = db_error(b, "cannot read");
            break;
        }
        row r;
        int ok = read_row(b, s, &r);
        if (ok < 0)
            st = lj_oom(b->env);
        else if (ok && strcmp(r.arch, best) == 0 && strcmp(r.family, family) == 0 &&
                 strcmp(r.bucket, bucket) == 0 && strcmp(r.config, config) == 0) {
            st = take_image(b, &r, image, size, found);
            if (*found)
                snprintf(arch_out, 16, "%s", best);
        }
    }
    sqlite3_finalize(s);
    return st;
}

lajit_status lj_bundle_config(lj_bundle *b, const char *family, const char *bucket,
                              const char *arch, char *config, size_t cap, int *found)
{
    *found = 0;
    sqlite3_stmt *s = NULL;
    if (lj_sql_prepare(&b->sql,
                       "SELECT " ROW_COLUMNS " FROM kernels"
                       " WHERE family = ?1 AND bucket = ?2 AND arch = ?3 AND ptx = 0",
                       &s) != SQLITE_OK)
        return db_error(b, "cannot query");
    sqlite3_bind_text(s, 1, family, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, bucket, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 3, arch, -1, SQLITE_TRANSIENT);
    lajit_status st = LAJIT_OK;
    int rc = SQLITE_DONE;
    /* Only a row whose checksum holds: its configuration is part of what it covers. */
    while (st == LAJIT_OK && !*found && (rc = lj_sql_step(&b->sql, s)) == SQLITE_ROW) {
        row r;
        int ok = read_row(b, s, &r);
        if (ok < 0)
            st = lj_oom(b->env);
        else if (ok && strcmp(r.family, family) == 0 && strcmp(r.bucket, bucket) == 0 &&
                 strcmp(r.arch, arch) == 0 && strlen(r.config) < cap) {
            snprintf(config, cap, "%s", r.config);
            *found = 1;
        }
    }
    if (st == LAJIT_OK && !*found && rc != SQLITE_DONE)
        st = db_error(b, "cannot read");
    sqlite3_finalize(s);
    return st;
}

lajit_status lj_bundle_count(lj_bundle *b, int *cubins, int *ptxs)
{
    sqlite3_stmt *s = NULL;
    *cubins = *ptxs = 0;
    if (lj_sql_prepare(&b->sql, "SELECT ptx, count(*) FROM kernels GROUP BY ptx", &s) != SQLITE_OK)
        return db_error(b, "cannot query");
    int rc = SQLITE_DONE;
    while ((rc = lj_sql_step(&b->sql, s)) == SQLITE_ROW) {
        if (sqlite3_column_type(s, 0) == SQLITE_INTEGER)
            *(sqlite3_column_int(s, 0) ? ptxs : cubins) += sqlite3_column_int(s, 1);
    }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? LAJIT_OK : db_error(b, "cannot count");
}

const char *lj_bundle_path(const lj_bundle *b)
{
    return b->path;
}

void lj_bundle_close(lj_bundle *b)
{
    if (b)
        free_bundle(b);
}
