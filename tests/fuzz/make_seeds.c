/* make_seeds.c — writes the binary seeds of the fuzz corpora with the library itself (not run by
 * CI; the output is committed): small valid bundles and damaged variants for corpus/bundle, and
 * a real export for corpus/tunedb_import. Rerun it after a change of either file format:
 *
 *     build/tests/fuzz/fuzz_make_seeds tests/fuzz
 *
 * Bundles are rewritten with 512-byte pages (VACUUM), which keeps each seed a few KB while the
 * file stays what the library wrote. Variants that crashed or hung the reader when they were
 * made go to crashes/ (see README.md) until the fix lands, not to the corpus CI replays. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bundle.h"
#include "bundle_keys.h"
#include "tunedb.h"

static lj_env env;

static void die(const char *what)
{
    fprintf(stderr, "make_seeds: %s: %s\n", what, env.errmsg);
    exit(1);
}

static void sql(const char *path, const char *text)
{
    sqlite3 *db;
    char *err = NULL;
    if (sqlite3_open(path, &db) != SQLITE_OK ||
        sqlite3_exec(db, text, NULL, NULL, &err) != SQLITE_OK) {
        fprintf(stderr, "make_seeds: %s: %s: %s\n", path, text, err ? err : sqlite3_errmsg(db));
        exit(1);
    }
    sqlite3_close(db);
}

static void add(lj_bundle *b, const char *arch, int ptx, const char *image, size_t size)
{
    lj_bundle_item it = {SEED_FAMILY,
                         arch,
                         SEED_BUCKET,
                         SEED_CONFIG,
                         SEED_PROBLEM,
                         SEED_ENTRY,
                         {SEED_KEY_HI, SEED_KEY_LO},
                         ptx,
                         image,
                         size};
    if (lj_bundle_add(b, &it) != LAJIT_OK)
        die("adding a kernel");
}

/* A bundle as `lajit gen` writes one (n kernels of the seed family), compacted. */
static void bundle(const char *path, int n)
{
    static const char cubin[] = "\177ELF fake cubin";
    static const char ptx[] =
        ".version 8.0\n.target sm_80\n.visible .entry la_recurrent_fwd()\n{ ret; }\n";
    lj_bundle *b;
    if (lj_bundle_create(&env, path, &b) != LAJIT_OK)
        die("creating a bundle");
    if (n > 0)
        add(b, "sm_90a", 0, cubin, sizeof cubin - 1);
    if (n > 1)
        add(b, "sm_80", 1, ptx, sizeof ptx); /* PTX keeps its NUL */
    if (n > 2)
        add(b, "sm_80", 0, cubin, sizeof cubin - 1);
    if (lj_bundle_finish(b) != LAJIT_OK)
        die("finishing a bundle");
    sql(path, "UPDATE meta SET value = '2026-01-01 00:00:00' WHERE name = 'created';"
              "PRAGMA journal_mode = DELETE; PRAGMA page_size = 512; VACUUM;");
}

static void copy_bytes(const char *from, const char *to, long keep, long zero_at, long zero_len)
{
    FILE *f = fopen(from, "rb");
    static unsigned char buf[1 << 20];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f)
        fclose(f);
    if (keep >= 0 && (size_t)keep < n)
        n = (size_t)keep;
    for (long i = zero_at; i >= 0 && i < zero_at + zero_len && (size_t)i < n; i++)
        buf[i] = 0;
    FILE *g = fopen(to, "wb");
    if (!g || fwrite(buf, 1, n, g) != n || fclose(g) != 0) {
        fprintf(stderr, "make_seeds: cannot write %s\n", to);
        exit(1);
    }
}

static void bundles(const char *root)
{
    char p[1024], q[1024];
#define AT(var, dir, name) snprintf(var, sizeof var, "%s/%s/%s", root, dir, name)
    AT(p, "corpus/bundle", "valid_three_kernels");
    bundle(p, 3);
    AT(q, "corpus/bundle", "valid_empty");
    bundle(q, 0);
    AT(q, "corpus/bundle", "valid_one_cubin");
    bundle(q, 1);
    /* Damaged by SQL: what a file from elsewhere might hold. */
    AT(q, "corpus/bundle", "checksum_mismatch");
    bundle(q, 3);
    sql(q, "UPDATE kernels SET image = X'00112233' WHERE arch = 'sm_90a'; VACUUM;");
    AT(q, "corpus/bundle", "future_version");
    bundle(q, 2);
    sql(q, "PRAGMA user_version = 99;");
    AT(q, "corpus/bundle", "no_kernels_table");
    bundle(q, 1);
    sql(q, "DROP TABLE kernels; VACUUM;");
    AT(q, "corpus/bundle", "image_as_text");
    bundle(q, 3);
    sql(q, "UPDATE kernels SET image = CAST(image AS TEXT); VACUUM;");
    AT(q, "corpus/bundle", "wrong_arch_row");
    bundle(q, 3);
    sql(q, "UPDATE kernels SET arch = 'sm_100a' WHERE arch = 'sm_90a'; VACUUM;");
    AT(q, "corpus/bundle", "integer_columns");
    bundle(q, 3);
    sql(q, "UPDATE kernels SET ptx = ptx + 7, config = 42; VACUUM;");
    /* Damaged bytes: truncation, a zeroed header, a zeroed page. */
    AT(q, "corpus/bundle", "truncated_1k");
    copy_bytes(p, q, 1024, -1, 0);
    AT(q, "corpus/bundle", "header_zeroed");
    copy_bytes(p, q, -1, 0, 16);
    AT(q, "corpus/bundle", "page2_zeroed");
    copy_bytes(p, q, -1, 512, 512);
    AT(q, "corpus/bundle", "empty_file");
    copy_bytes("/dev/null", q, -1, -1, 0);
    /* Crashed or hung the reader of b4a0d7d (issue 22, item 2; fixed by bundle format 2): a
     * NULL in a text column ordered before the real row, a view that never ends. */
    AT(q, "corpus/bundle", "null_text_column");
    bundle(q, 3);
    sql(q, "PRAGMA writable_schema = ON;"
           "UPDATE sqlite_schema SET sql = replace(sql, 'TEXT NOT NULL', 'TEXT')"
           " WHERE name = 'kernels';");
    sql(q, "INSERT INTO kernels SELECT source_key, NULL, ptx, family, bucket, config, problem, "
           "entry, image, checksum FROM kernels WHERE ptx = 1; UPDATE kernels SET rowid = 1000 "
           "WHERE ptx = 1 AND arch IS NOT NULL; UPDATE kernels SET config = NULL, checksum = NULL "
           "WHERE arch = 'sm_90a'; VACUUM;");
    AT(q, "corpus/bundle", "recursive_view");
    bundle(q, 1);
    sql(q, "DROP TABLE kernels; CREATE VIEW kernels(source_key, arch, ptx, family, bucket, config,"
           " problem, entry, image, checksum) AS WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL"
           " SELECT i + 1 FROM r) SELECT 'k', 'sm_90a', 0, 'f', 'b', 'c', 'p', 'e', x'00', '0'"
           " FROM r; VACUUM;");
#undef AT
}

static void exports(const char *root)
{
    char dir[1024], path[1024];
    snprintf(dir, sizeof dir, "%s/seed-db", root);
    lj_tunedb *db;
    if (lj_tunedb_open(&env, dir, &db) != LAJIT_OK)
        die("opening a tune.db");
    lj_tune_id id;
    memset(&id, 0, sizeof id);
    snprintf(id.fp.name, sizeof id.fp.name, "NVIDIA H200");
    id.fp.cc = 90;
    id.fp.sms = 132;
    id.fp.driver = 13000;
    id.fp.nvrtc = 12080;
    snprintf(id.family, sizeof id.family, "la_fwd");
    snprintf(id.template_hash, sizeof id.template_hash, "0123456789abcdef");
    snprintf(id.bucket, sizeof id.bucket, "bf16 D128 E128 decay \"q\\ \t");
    lj_tune_result r[2];
    memset(r, 0, sizeof r);
    snprintf(r[0].config, sizeof r[0].config, "BLOCK=64 WARPS=8");
    r[0].ms = 0.125;
    snprintf(r[1].config, sizeof r[1].config, "BLOCK=128 WARPS=4");
    r[1].ms = -1;
    snprintf(r[1].failure, sizeof r[1].failure, "CUDA_ERROR_ILLEGAL_ADDRESS");
    if (lj_tunedb_record(db, &id, r, 2, "BLOCK=64 WARPS=4", 0.25) != LAJIT_OK)
        die("recording");
    snprintf(path, sizeof path, "%s/corpus/tunedb_import/export_h200", root);
    int rows;
    if (lj_tunedb_export(db, path, &rows) != LAJIT_OK)
        die("exporting");
    lj_tunedb_close(db);
    char cmd[2100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        exit(1);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s TESTS_FUZZ_DIR\n", argv[0]);
        return 2;
    }
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    bundles(argv[1]);
    exports(argv[1]);
    return 0;
}
