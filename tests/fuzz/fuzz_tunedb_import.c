/* fuzz_tunedb_import.c — `lajit db import` (lj_tunedb_import) on hostile JSON lines: the input is
 * imported into a fresh tune.db for the local device, then forced, then forced with no local
 * device, and the database is listed (lj_tunedb_show). What an import accepts must survive a
 * round trip: its export imports into another fresh database and exports to the same bytes.
 * The same input is also loaded as the shipped tuning table of that device (tuned.h: found by its
 * slug under LAJIT_TUNED_DIR) and asked for a winner: it must load exactly when the unforced
 * import accepts it (or is refused for its size, unread) and answer without fault. Seeds: corpus/tunedb_import (a real export from make_seeds.c plus hand-written near misses). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"
#include "tunedb.h"
#include "tuned.h"

static void check_text(const char *s, size_t cap, const char *what)
{
    if (!s || !memchr(s, 0, cap))
        lj_fuzz_fail("%s not a terminated string", what);
}

static void on_row(void *user, const lj_fingerprint *fp, const char *family,
                   const char *template_hash, const char *bucket, const char *config, double ms,
                   const char *default_config, double default_ms, int measured)
{
    (void)ms;
    (void)default_ms;
    (void)measured;
    check_text(fp->name, sizeof fp->name, "device name");
    check_text(family, 4096, "family");
    check_text(template_hash, 4096, "template hash");
    check_text(bucket, 4096, "bucket");
    check_text(config, 4096, "config");
    if (default_config)
        check_text(default_config, 4096, "default config");
    ++*(int *)user;
}

static lj_tunedb *open_db(lj_env *env, const char *name)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", lj_fuzz_dir(), name);
    lj_tunedb *db;
    if (lj_tunedb_open(env, dir, &db) != LAJIT_OK)
        lj_fuzz_fail("cannot open a fresh tune.db in %s: %s", dir, env->errmsg);
    return db;
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        lj_fuzz_fail("cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (!text || fread(text, 1, (size_t)n, f) != (size_t)n)
        lj_fuzz_fail("cannot read %s", path);
    fclose(f);
    text[n] = 0;
    *len = (size_t)n;
    return text;
}

/* Export of db, import of that into a fresh database, export again: the same bytes. */
static void round_trip(lj_env *env, lj_tunedb *db)
{
    char first[1024], second[1024];
    snprintf(first, sizeof first, "%s/first.jsonl", lj_fuzz_dir());
    snprintf(second, sizeof second, "%s/second.jsonl", lj_fuzz_dir());
    int rows, again;
    if (lj_tunedb_export(db, first, &rows) != LAJIT_OK)
        lj_fuzz_fail("cannot export what was imported: %s", env->errmsg);
    size_t n1, n2;
    char *a = read_all(first, &n1);
    lj_tunedb *other = open_db(env, "other");
    if (lj_tunedb_import(other, first, NULL, 1, &again) != LAJIT_OK)
        lj_fuzz_fail("an export of imported rows does not import: %s", env->errmsg);
    if (lj_tunedb_export(other, second, &again) != LAJIT_OK)
        lj_fuzz_fail("cannot export the second database: %s", env->errmsg);
    lj_tunedb_close(other);
    char *b = read_all(second, &n2);
    if (rows != again || n1 != n2 || memcmp(a, b, n1) != 0)
        lj_fuzz_fail("the round trip changed the export (%d rows, %zu bytes -> %d rows, %zu bytes)",
                     rows, n1, again, n2);
    free(a);
    free(b);
}

/* The input as the shipped table of local: loads exactly when the unforced import took it. */
static void shipped(lj_env *env, const uint8_t *data, size_t size, const lj_fingerprint *local,
                    lajit_status plain)
{
    char slug[128], name[256], path[1024], table[1024];
    lj_tuned_slug(local->name, slug, sizeof slug);
    snprintf(name, sizeof name, "tuned/%s.json", slug);
    snprintf(path, sizeof path, "%s/tuned", lj_fuzz_dir());
    (void)mkdir(path, 0700);
    lj_fuzz_write(name, data, size, table, sizeof table);
    setenv("LAJIT_TUNED_DIR", path, 1);
    lj_tunedb *t = NULL;
    lajit_status st = lj_tuned_load(env, local, &t, table, sizeof table);
    int want = plain == LAJIT_OK && size <= LJ_TUNED_MAX_BYTES;
    if ((st == LAJIT_OK) != want || (st == LAJIT_OK && !t))
        lj_fuzz_fail("shipped table: load %d, unforced import %d, %zu bytes", st, plain, size);
    if (!t)
        return;
    lj_tune_id id;
    memset(&id, 0, sizeof id);
    id.fp = *local;
    snprintf(id.family, sizeof id.family, "la_fwd");
    snprintf(id.template_hash, sizeof id.template_hash, "0123456789abcdef");
    snprintf(id.bucket, sizeof id.bucket, "bf16 D128");
    char config[256], hash[17];
    int found, stale;
    if (lj_tunedb_shipped_winner(t, &id, config, sizeof config, &found, &stale, hash) != LAJIT_OK)
        lj_fuzz_fail("shipped table: no answer from a loaded table: %s", env->errmsg);
    if (found && (stale || !memchr(config, 0, sizeof config)))
        lj_fuzz_fail("shipped table: found and stale at once, or an unterminated config");
    lj_tunedb_close(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lj_env env;
    lj_fuzz_heap heap;
    lj_fuzz_env(&env, &heap, 64u << 20);
    char path[1024];
    lj_fuzz_write("import.jsonl", data, size, path, sizeof path);
    lj_tunedb *db = open_db(&env, "db");
    lj_fingerprint local = {"NVIDIA H200", 90, 132, 13000, 12080};
    int rows = -1, shown = 0;
    lajit_status plain = lj_tunedb_import(db, path, &local, 0, &rows);
    lajit_status forced = lj_tunedb_import(db, path, &local, 1, &rows);
    lajit_status anyone = lj_tunedb_import(db, path, NULL, 1, &rows);
    if (plain == LAJIT_OK && forced != LAJIT_OK)
        lj_fuzz_fail("accepted unforced, refused forced: %s", env.errmsg);
    if (forced != anyone)
        lj_fuzz_fail("forced import depends on the local device (%d, %d)", forced, anyone);
    if (lj_tunedb_show(db, on_row, &shown) != LAJIT_OK)
        lj_fuzz_fail("cannot list the database after an import: %s", env.errmsg);
    if (forced == LAJIT_OK)
        round_trip(&env, db);
    lj_tunedb_close(db);
    shipped(&env, data, size, &local, plain);
    if (heap.held)
        lj_fuzz_fail("%zu bytes still held after the database was closed", heap.held);
    lj_fuzz_clean();
    return 0;
}
