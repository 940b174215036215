/* bundle.c — the offline kernel set file (bundle.h): an SQLite database with one table of
 * kernels and a format version, written once by `lajit gen`, read-only afterwards. */
#include "bundle.h"

#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "lajit.h"

static const char schema[] =
    "CREATE TABLE meta(name TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE kernels("
    "  source_key TEXT NOT NULL, arch TEXT NOT NULL, ptx INTEGER NOT NULL,"
    "  family TEXT NOT NULL, bucket TEXT NOT NULL, config TEXT NOT NULL, problem TEXT NOT NULL,"
    "  entry TEXT NOT NULL, image BLOB NOT NULL, checksum TEXT NOT NULL,"
    "  PRIMARY KEY(source_key, arch, ptx, family, bucket));"
    "CREATE INDEX kernels_by_config ON kernels(family, bucket, config, ptx);";

/* Images handed out by the reader, kept until close. */
typedef struct held_image {
    struct held_image *next;
    size_t size;
    unsigned char data[];
} held_image;

struct lj_bundle {
    lj_env *env;
    sqlite3 *db;
    char *path;     /* the final path */
    char *tmp_path; /* writing: the file being written */
    held_image *held;
};

static lajit_status db_error(lj_bundle *b, const char *what)
{
    return lj_error(b->env, LAJIT_ERR_DATABASE, "bundle %s: %s: %s", b->path, what,
                    b->db ? sqlite3_errmsg(b->db) : "cannot open");
}

static void checksum_hex(const void *data, size_t len, char out[17])
{
    snprintf(out, 17, "%016llx", (unsigned long long)lj_hash64(data, len));
}

static lj_bundle *alloc_bundle(lj_env *env, const char *path)
{
    lj_bundle *b = lj_calloc(env, 1, sizeof *b);
    if (!b)
        return NULL;
    b->env = env;
    if (!(b->path = lj_strdup(env, path))) {
        lj_free(env, b);
        return NULL;
    }
    return b;
}

static void free_bundle(lj_bundle *b)
{
    if (b->db)
        sqlite3_close(b->db);
    for (held_image *h = b->held, *next; h; h = next) {
        next = h->next;
        lj_free(b->env, h);
    }
    lj_free(b->env, b->tmp_path);
    lj_free(b->env, b->path);
    lj_free(b->env, b);
}

/* ---- Writing ---------------------------------------------------------------------------------- */

lajit_status lj_bundle_create(lj_env *env, const char *path, lj_bundle **out)
{
    lj_bundle *b = alloc_bundle(env, path);
    if (!b)
        return lj_oom(env);
    lj_buf t;
    lj_buf_init(&t, env);
    lj_buf_printf(&t, "%s.tmp-%ld", path, (long)getpid());
    if (!(b->tmp_path = lj_buf_take(&t))) {
        free_bundle(b);
        return lj_oom(env);
    }
    unlink(b->tmp_path);
    lajit_status st = LAJIT_OK;
    char sql[160];
    snprintf(sql, sizeof sql,
             "PRAGMA user_version=%d; PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; BEGIN;",
             LJ_BUNDLE_FORMAT);
    if (sqlite3_open_v2(b->tmp_path, &b->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK)
        st = db_error(b, "cannot create");
    else if (sqlite3_exec(b->db, schema, NULL, NULL, NULL) != SQLITE_OK ||
             sqlite3_exec(b->db, sql, NULL, NULL, NULL) != SQLITE_OK)
        st = db_error(b, "cannot write the schema");
    if (st == LAJIT_OK) {
        sqlite3_stmt *s = NULL;
        if (sqlite3_prepare_v2(b->db, "INSERT INTO meta VALUES('lajit', ?1), ('created', datetime('now'))",
                               -1, &s, NULL) != SQLITE_OK ||
            sqlite3_bind_text(s, 1, LAJIT_VERSION_STRING, -1, SQLITE_STATIC) != SQLITE_OK ||
            sqlite3_step(s) != SQLITE_DONE)
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
    char key[33], sum[17];
    lj_key_hex(it->source_key, key);
    checksum_hex(it->image, it->size, sum);
    sqlite3_stmt *s = NULL;
    lajit_status st = LAJIT_OK;
    if (sqlite3_prepare_v2(b->db,
                           "INSERT OR REPLACE INTO kernels VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                           -1, &s, NULL) != SQLITE_OK)
        return db_error(b, "cannot prepare an insert");
    sqlite3_bind_text(s, 1, key, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, it->arch, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(s, 3, it->ptx ? 1 : 0);
    sqlite3_bind_text(s, 4, it->family, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 5, it->bucket, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 6, it->config, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 7, it->problem ? it->problem : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 8, it->entry ? it->entry : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_blob64(s, 9, it->image, (sqlite3_uint64)it->size, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 10, sum, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(s) != SQLITE_DONE)
        st = db_error(b, "cannot add a kernel");
    sqlite3_finalize(s);
    return st;
}

lajit_status lj_bundle_finish(lj_bundle *b)
{
    lajit_status st = LAJIT_OK;
    if (sqlite3_exec(b->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        st = db_error(b, "cannot commit");
    if (sqlite3_close(b->db) != SQLITE_OK && st == LAJIT_OK)
        st = lj_error(b->env, LAJIT_ERR_DATABASE, "bundle %s: cannot close", b->path);
    b->db = NULL;
    if (st == LAJIT_OK && rename(b->tmp_path, b->path) != 0)
        st = lj_error(b->env, LAJIT_ERR_IO, "cannot rename %s to %s", b->tmp_path, b->path);
    if (st != LAJIT_OK)
        unlink(b->tmp_path);
    free_bundle(b);
    return st;
}

void lj_bundle_abort(lj_bundle *b)
{
    if (!b)
        return;
    if (b->db)
        sqlite3_close(b->db);
    b->db = NULL;
    unlink(b->tmp_path);
    free_bundle(b);
}

/* ---- Reading ---------------------------------------------------------------------------------- */

lajit_status lj_bundle_open(lj_env *env, const char *path, lj_bundle **out)
{
    lj_bundle *b = alloc_bundle(env, path);
    if (!b)
        return lj_oom(env);
    lajit_status st = LAJIT_OK;
    sqlite3_stmt *s = NULL;
    if (access(path, R_OK) != 0)
        st = lj_error(env, LAJIT_ERR_DATABASE, "bundle %s: cannot be read", path);
    else if (sqlite3_open_v2(path, &b->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK)
        st = db_error(b, "cannot open");
    else if (sqlite3_prepare_v2(b->db, "PRAGMA user_version", -1, &s, NULL) != SQLITE_OK ||
             sqlite3_step(s) != SQLITE_ROW)
        st = db_error(b, "not a bundle (not an SQLite database, or damaged)");
    else if (sqlite3_column_int(s, 0) != LJ_BUNDLE_FORMAT)
        st = lj_error(env, LAJIT_ERR_DATABASE, "bundle %s: format %d, this build reads format %d",
                      path, sqlite3_column_int(s, 0), LJ_BUNDLE_FORMAT);
    sqlite3_finalize(s);
    s = NULL;
    /* The whole file must be sound: a truncated bundle fails here, not at a later lookup. */
    if (st == LAJIT_OK &&
        (sqlite3_prepare_v2(b->db, "PRAGMA quick_check", -1, &s, NULL) != SQLITE_OK ||
         sqlite3_step(s) != SQLITE_ROW || strcmp((const char *)sqlite3_column_text(s, 0), "ok") != 0))
        st = db_error(b, "damaged (integrity check failed)");
    sqlite3_finalize(s);
    s = NULL;
    if (st == LAJIT_OK &&
        sqlite3_prepare_v2(b->db, "SELECT count(*) FROM kernels", -1, &s, NULL) != SQLITE_OK)
        st = db_error(b, "not a bundle (no kernels table)");
    sqlite3_finalize(s);
    if (st != LAJIT_OK) {
        free_bundle(b);
        return st;
    }
    *out = b;
    return LAJIT_OK;
}

/* Copies the image of the current row (column 0: image, column 1: checksum, column 2: what
 * for messages) into a held buffer when its checksum matches. */
static lajit_status take_image(lj_bundle *b, sqlite3_stmt *s, const void **image, size_t *size,
                               int *found)
{
    const void *data = sqlite3_column_blob(s, 0);
    size_t n = (size_t)sqlite3_column_bytes(s, 0);
    const char *want = (const char *)sqlite3_column_text(s, 1);
    char sum[17];
    checksum_hex(data, n, sum);
    if (!data || !want || strcmp(sum, want) != 0) {
        lj_log(b->env, LAJIT_LOG_WARN, "bundle %s: the kernel %s fails its checksum: not used",
               b->path, (const char *)sqlite3_column_text(s, 2));
        return LAJIT_OK;
    }
    held_image *h = lj_malloc(b->env, sizeof *h + n + 1);
    if (!h)
        return lj_oom(b->env);
    memcpy(h->data, data, n);
    h->data[n] = 0;
    h->size = n;
    h->next = b->held;
    b->held = h;
    *image = h->data;
    *size = n;
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
    if (sqlite3_prepare_v2(b->db,
                           "SELECT image, checksum, family || ' ' || config || ' ' || arch FROM kernels "
                           "WHERE source_key = ?1 AND arch = ?2 AND ptx = ?3 LIMIT 1",
                           -1, &s, NULL) != SQLITE_OK)
        return db_error(b, "cannot query");
    sqlite3_bind_text(s, 1, key, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, arch, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(s, 3, ptx ? 1 : 0);
    lajit_status st = LAJIT_OK;
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        st = take_image(b, s, image, size, found);
    else if (rc != SQLITE_DONE)
        st = db_error(b, "cannot read");
    sqlite3_finalize(s);
    return st;
}

/* "sm_80" -> 80, "sm_90a" -> 90 with *specific = 1. */
static int arch_cc(const char *arch, int *specific)
{
    int cc = 0;
    const char *p = arch + 3;
    while (*p >= '0' && *p <= '9')
        cc = cc * 10 + (*p++ - '0');
    *specific = *p == 'a' || *p == 'f';
    return cc;
}

lajit_status lj_bundle_find_ptx(lj_bundle *b, const char *family, const char *bucket,
                                const char *config, int cc, const void **image, size_t *size,
                                char arch_out[16], int *found)
{
    *found = 0;
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(b->db,
                           "SELECT image, checksum, family || ' ' || config || ' ' || arch, arch FROM kernels "
                           "WHERE family = ?1 AND bucket = ?2 AND config = ?3 AND ptx = 1",
                           -1, &s, NULL) != SQLITE_OK)
        return db_error(b, "cannot query");
    sqlite3_bind_text(s, 1, family, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, bucket, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 3, config, -1, SQLITE_TRANSIENT);
    /* The newest plain arch not newer than the device: remember its row number, then reread. */
    int best_cc = -1, rc;
    char best[16] = "";
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        const char *arch = (const char *)sqlite3_column_text(s, 3);
        int specific, c = arch ? arch_cc(arch, &specific) : 0;
        if (arch && strncmp(arch, "sm_", 3) == 0 && !specific && c <= cc && c > best_cc) {
            best_cc = c;
            snprintf(best, sizeof best, "%s", arch);
        }
    }
    lajit_status st = rc == SQLITE_DONE ? LAJIT_OK : db_error(b, "cannot read");
    sqlite3_reset(s);
    while (st == LAJIT_OK && best_cc >= 0 && !*found && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (strcmp((const char *)sqlite3_column_text(s, 3), best) == 0) {
            st = take_image(b, s, image, size, found);
            if (*found)
                snprintf(arch_out, 16, "%s", best);
            break;
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
    if (sqlite3_prepare_v2(b->db,
                           "SELECT config FROM kernels WHERE family = ?1 AND bucket = ?2 AND arch = ?3 "
                           "AND ptx = 0 LIMIT 1",
                           -1, &s, NULL) != SQLITE_OK)
        return db_error(b, "cannot query");
    sqlite3_bind_text(s, 1, family, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, bucket, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 3, arch, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(s) == SQLITE_ROW) {
        snprintf(config, cap, "%s", (const char *)sqlite3_column_text(s, 0));
        *found = 1;
    }
    sqlite3_finalize(s);
    return LAJIT_OK;
}

lajit_status lj_bundle_count(lj_bundle *b, int *cubins, int *ptxs)
{
    sqlite3_stmt *s = NULL;
    *cubins = *ptxs = 0;
    if (sqlite3_prepare_v2(b->db, "SELECT ptx, count(*) FROM kernels GROUP BY ptx", -1, &s, NULL) != SQLITE_OK)
        return db_error(b, "cannot query");
    while (sqlite3_step(s) == SQLITE_ROW)
        *(sqlite3_column_int(s, 0) ? ptxs : cubins) = sqlite3_column_int(s, 1);
    sqlite3_finalize(s);
    return LAJIT_OK;
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
