/* tuned.c — shipped tuning tables (autotune/tuned.h) through the op path, with the fake driver
 * (device "lajit fake sm_90", so its table is lajit-fake-sm-90.json) and the test family "toy":
 * a table found by device name serves a first call with no user database; the user database's
 * winner wins over it; eager tuning skips a bucket the table covers; LAJIT_TUNED_DIR empty or
 * "off" switches tables off; a stale entry (other template hash) and hostile files (truncated
 * JSON, huge numbers, wrong types, another device, a too-long family name, a config the family
 * refuses, a folder or an oversized file under the table's name) are ignored with a log line,
 * the default runs and nothing crashes; the slug rule; `lajit db export --shipped`. */
#include "test.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include "context.h"
#include "fake_driver.h"
#include "search.h"
#include "toy_call.h"
#include "tuned.h"

static void require_nvrtc(void)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    int major, minor;
    if (lj_nvrtc_version(&env, &major, &minor) != LAJIT_OK)
        lj_test_skip("NVRTC not available");
}

/* Every log line of the context, and how many were warnings (the WARN line a refusal writes; the
 * error it reports is also logged, at ERROR, by lj_error itself, as for the tuning database). */
static char logbuf[16384];
static int warnings;
static void keep_log(void *user, lajit_log_level level, const char *message)
{
    (void)user;
    if (level == LAJIT_LOG_WARN)
        warnings++;
    size_t used = strlen(logbuf);
    snprintf(logbuf + used, sizeof logbuf - used, "%s\n", message);
}

static lajit_ctx *fake_ctx(uint32_t autotune)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.autotune = autotune;
    desc.log = keep_log;
    desc.log_level = LAJIT_LOG_INFO;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lajit__ctx_set_driver(ctx, lj_fake_driver());
    logbuf[0] = 0;
    warnings = 0;
    return ctx;
}

/* ---- Tables --------------------------------------------------------------------------------- */

static char tables[1024], table[1300];

/* A fresh tables folder with LAJIT_TUNED_DIR pointing at it; table = the fake device's file. */
static void use_tables(void)
{
    char tdir[1024];
    snprintf(tdir, sizeof tdir, "%s/tests/data/templates", lj_test_source_dir());
    setenv("LAJIT_TEMPLATE_DIR", tdir, 1);
    snprintf(tables, sizeof tables, "%s/tuned", lj_test_tmpdir());
    ASSERT_EQ(mkdir(tables, 0700), 0);
    setenv("LAJIT_TUNED_DIR", tables, 1);
    char slug[128];
    lj_tuned_slug("lajit fake sm_90", slug, sizeof slug);
    ASSERT_STREQ(slug, "lajit-fake-sm-90");
    snprintf(table, sizeof table, "%s/%s.json", tables, slug);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    ASSERT_EQ(fputs(text, f) >= 0, 1);
    ASSERT_EQ(fclose(f), 0);
}

/* One winner line of the table format for id, with the fields a test may spoil. */
static void winner_line(char *out, size_t cap, const lj_tune_id *id, const char *device,
                        const char *family, const char *hash, const char *config, const char *cc)
{
    snprintf(out, cap,
             "{\"kind\":\"winner\",\"device\":\"%s\",\"cc\":%s,\"sms\":%d,\"driver\":%d,"
             "\"nvrtc\":%d,\"family\":\"%s\",\"template_hash\":\"%s\",\"bucket\":\"%s\","
             "\"config\":\"%s\",\"ms\":0.5,\"default_config\":\"UNROLL=4 WARPS=2\","
             "\"default_ms\":1.0,\"at\":1700000000}\n",
             device, cc, id->fp.sms, id->fp.driver, id->fp.nvrtc, family, hash, id->bucket, config);
}

/* The table made the way the coordinator makes one: a winner recorded in a tuning database (a
 * database of its own, not the case's), then `db export --shipped` (lj_tunedb_export_shipped). */
static void make_table(const lj_tune_id *id, const char *config)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/tuning-run", lj_test_tmpdir());
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir, &db));
    lj_tune_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.config, sizeof r.config, "%s", config);
    r.ms = 0.5;
    ASSERT_OK(lj_tunedb_record(db, id, &r, 1, "UNROLL=4 WARPS=2", 1.0));
    /* A winner of another device in the same database stays out of this device's table. */
    lj_tune_id other = *id;
    snprintf(other.fp.name, sizeof other.fp.name, "NVIDIA H200");
    ASSERT_OK(lj_tunedb_record(db, &other, &r, 1, "UNROLL=4 WARPS=2", 1.0));
    int rows = 0;
    ASSERT_OK(lj_tunedb_export_shipped(db, table, id->fp.name, 0.03, NULL, NULL, &rows));
    ASSERT_EQ(rows, 1);
    lj_tunedb_close(db);
}

/* The plan the toy call gets in a fresh context: its block and shared memory. */
static void run_toy(toy_call *u, uint32_t autotune, unsigned *block, unsigned *smem)
{
    lajit_ctx *ctx = fake_ctx(autotune);
    ASSERT_OK(lajit_attn_fwd(ctx, &u->args));
    toy_last_launch(block, smem);
    lajit_ctx_destroy(ctx);
}

/* The toy's tuning identity, from a context of its own (before any table exists). */
static lj_tune_id fresh_id(void)
{
    lajit_ctx *ctx = fake_ctx(LAJIT_AUTOTUNE_OFF);
    lj_tune_id id = toy_id(ctx);
    lajit_ctx_destroy(ctx);
    return id;
}

LJ_TEST(slug_rule)
{
    char s[128];
    lj_tuned_slug("NVIDIA H200", s, sizeof s);
    ASSERT_STREQ(s, "nvidia-h200");
    lj_tuned_slug("NVIDIA H100 80GB HBM3", s, sizeof s);
    ASSERT_STREQ(s, "nvidia-h100-80gb-hbm3");
    lj_tuned_slug("  NVIDIA  GeForce RTX 4090 (rev. 2)!", s, sizeof s);
    ASSERT_STREQ(s, "nvidia-geforce-rtx-4090-rev-2");
    lj_tuned_slug("../../etc/passwd", s, sizeof s);
    ASSERT_STREQ(s, "etc-passwd"); /* no separator survives: the name cannot leave the folder */
    lj_tuned_slug("", s, sizeof s);
    ASSERT_STREQ(s, "");
    lj_tuned_slug("--- ***", s, sizeof s);
    ASSERT_STREQ(s, "");
    lj_tuned_slug("NVIDIA H200", s, 7); /* truncated, never a trailing '-' */
    ASSERT_STREQ(s, "nvidia");
    lj_tuned_slug(NULL, s, sizeof s);
    ASSERT_STREQ(s, "");
}

LJ_TEST(shipped_table_serves_a_first_call)
{
    require_nvrtc();
    use_tables();
    lj_fake_driver_reset();
    toy_call u;
    toy_open(&u);
    unsigned block, smem;
    lj_tune_id id = fresh_id();
    /* No table yet: the default (UNROLL=4 WARPS=2: block 64, 4 KiB). */
    run_toy(&u, LAJIT_AUTOTUNE_OFF, &block, &smem);
    ASSERT_EQ(block, 64);
    ASSERT_EQ(smem, 4096);
    /* The table's winner UNROLL=2 WARPS=1 (block 32, 2 KiB), no user database winner. */
    make_table(&id, "UNROLL=2 WARPS=1");
    run_toy(&u, LAJIT_AUTOTUNE_OFF, &block, &smem);
    ASSERT_EQ(block, 32);
    ASSERT_EQ(smem, 2048);
    ASSERT_CONTAINS(logbuf, "plan toy [UNROLL=2 WARPS=1]");
    ASSERT_CONTAINS(logbuf, "lajit-fake-sm-90.json: 1 rows");
    ASSERT_EQ(warnings, 0);
    /* Eager: a bucket the table covers is not tuned (no private context made). */
    run_toy(&u, LAJIT_AUTOTUNE_EAGER, &block, &smem);
    ASSERT_EQ(block, 32);
    ASSERT_EQ(lj_fake_driver_counts()->contexts_created, 0);
    /* Switched off: empty or "off". */
    setenv("LAJIT_TUNED_DIR", "off", 1);
    run_toy(&u, LAJIT_AUTOTUNE_OFF, &block, &smem);
    ASSERT_EQ(block, 64);
    setenv("LAJIT_TUNED_DIR", "", 1);
    run_toy(&u, LAJIT_AUTOTUNE_OFF, &block, &smem);
    ASSERT_EQ(block, 64);
    ASSERT_EQ(warnings, 0);
    /* A folder without this device's file: the default, quietly. */
    char other[1100];
    snprintf(other, sizeof other, "%s/empty", lj_test_tmpdir());
    ASSERT_EQ(mkdir(other, 0700), 0);
    setenv("LAJIT_TUNED_DIR", other, 1);
    run_toy(&u, LAJIT_AUTOTUNE_OFF, &block, &smem);
    ASSERT_EQ(block, 64);
    ASSERT_EQ(warnings, 0);
    toy_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(user_database_wins_over_the_table)
{
    require_nvrtc();
    use_tables();
    lj_fake_driver_reset();
    toy_call u;
    toy_open(&u);
    lj_tune_id id = fresh_id();
    make_table(&id, "UNROLL=2 WARPS=1");
    /* The user's own winner UNROLL=4 WARPS=1 (block 32, 4 KiB) in the case's cache directory. */
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, getenv("LAJIT_CACHE_DIR"), &db));
    lj_tune_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.config, sizeof r.config, "UNROLL=4 WARPS=1");
    r.ms = 0.25;
    ASSERT_OK(lj_tunedb_record(db, &id, &r, 1, "UNROLL=4 WARPS=2", 1.0));
    unsigned block, smem;
    run_toy(&u, LAJIT_AUTOTUNE_OFF, &block, &smem);
    ASSERT_EQ(block, 32);
    ASSERT_EQ(smem, 4096);
    /* The user's winner no longer parses: the shipped one serves, after a warning. */
    snprintf(r.config, sizeof r.config, "UNROLL=4 WARPS=1 GONE=1");
    ASSERT_OK(lj_tunedb_record(db, &id, &r, 1, "UNROLL=4 WARPS=2", 1.0));
    run_toy(&u, LAJIT_AUTOTUNE_OFF, &block, &smem);
    ASSERT_EQ(block, 32);
    ASSERT_EQ(smem, 2048);
    ASSERT_EQ(warnings, 1);
    lj_tunedb_close(db);
    toy_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* Writes text (unless NULL) as the device's table, runs the toy call: the default must run, with
 * exactly one warning that contains want, and no crash. */
static void expect_ignored(toy_call *u, const char *text, const char *want)
{
    if (text)
        write_text(table, text);
    unsigned block, smem;
    run_toy(u, LAJIT_AUTOTUNE_OFF, &block, &smem);
    if (block != 64 || smem != 4096 || warnings != 1 || !strstr(logbuf, want))
        lj_test_fail(__FILE__, __LINE__,
                     "table\n%s\nran block %u smem %u with %d warnings (want the default and one "
                     "naming \"%s\"); log:\n%s",
                     text ? text : "(not written)", block, smem, warnings, want, logbuf);
}

LJ_TEST(stale_or_hostile_tables_are_ignored)
{
    require_nvrtc();
    use_tables();
    lj_fake_driver_reset();
    toy_call u;
    toy_open(&u);
    lj_tune_id id = fresh_id();
    const char *dev = id.fp.name, *hash = id.template_hash;
    char good[1024], bad[1024], text[8192];

    /* Stale: tuned on other templates. */
    winner_line(bad, sizeof bad, &id, dev, "toy", "0123456789abcdef", "UNROLL=2 WARPS=1", "90");
    expect_ignored(&u, bad, "was tuned on templates 0123456789abcdef");
    /* A configuration the family refuses (3 is no UNROLL candidate). */
    winner_line(bad, sizeof bad, &id, dev, "toy", hash, "UNROLL=3 WARPS=1", "90");
    expect_ignored(&u, bad, "is unusable");
    winner_line(bad, sizeof bad, &id, dev, "toy", hash, "BLOCK=64 TILE_V=32", "90");
    expect_ignored(&u, bad, "is unusable");
    /* The whole table is refused for one bad line, even beside a good one. */
    winner_line(good, sizeof good, &id, dev, "toy", hash, "UNROLL=2 WARPS=1", "90");
    winner_line(bad, sizeof bad, &id, dev, "toy", hash, "UNROLL=2 WARPS=1", "1e300");
    snprintf(text, sizeof text, "%s%s", good, bad);
    expect_ignored(&u, text, "\"cc\" is 1.0e+300, not an integer");
    winner_line(bad, sizeof bad, &id, dev, "toy", hash, "UNROLL=2 WARPS=1", "\"90\"");
    snprintf(text, sizeof text, "%s%s", good, bad);
    expect_ignored(&u, text, "\"cc\" is 90, not an integer");
    winner_line(bad, sizeof bad, &id, dev, "toy", hash, "UNROLL=2 WARPS=1", "99999999999999999999");
    expect_ignored(&u, bad, "not an integer in");
    /* Another GPU's row. */
    winner_line(bad, sizeof bad, &id, "NVIDIA H200", "toy", hash, "UNROLL=2 WARPS=1", "90");
    snprintf(text, sizeof text, "%s%s", good, bad);
    expect_ignored(&u, text, "results for NVIDIA H200");
    /* Another compute capability. */
    winner_line(bad, sizeof bad, &id, dev, "toy", hash, "UNROLL=2 WARPS=1", "80");
    expect_ignored(&u, bad, "(cc 80)");
    /* A family name longer than any family's. */
    winner_line(bad, sizeof bad, &id, dev,
                "toytoytoytoytoytoytoytoytoytoytoytoytoytoytoytoytoytoytoytoytoytoytoy", hash,
                "UNROLL=2 WARPS=1", "90");
    expect_ignored(&u, bad, "\"family\" is too long");
    /* Truncated JSON (the good line cut short), and text that is no JSON at all. */
    snprintf(text, sizeof text, "%.*s\n", (int)(strlen(good) / 2), good);
    expect_ignored(&u, text, "not a JSON object");
    expect_ignored(&u, "\x01\x02 not json\n", "not a JSON object");
    /* A negative and an infinite time (1e999 parses as infinity). */
    snprintf(text, sizeof text, "%s", good);
    char *ms = strstr(text, "\"ms\":0.5");
    ASSERT_TRUE(ms != NULL);
    memcpy(ms, "\"ms\":-99", 8);
    expect_ignored(&u, text, "not a finite time");
    /* A line longer than 4 KiB. */
    memset(text, ' ', 5000);
    text[5000] = 0;
    expect_ignored(&u, text, "line too long");
    /* A folder under the table's name. */
    ASSERT_EQ(remove(table), 0);
    ASSERT_EQ(mkdir(table, 0700), 0);
    expect_ignored(&u, NULL, "not a regular file");
    toy_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(oversized_table_is_refused_unread)
{
    require_nvrtc();
    use_tables();
    lj_fake_driver_reset();
    toy_call u;
    toy_open(&u);
    lj_tune_id id = fresh_id();
    char good[1024];
    winner_line(good, sizeof good, &id, id.fp.name, "toy", id.template_hash, "UNROLL=2 WARPS=1",
                "90");
    /* Valid lines, but more of them than a table may hold. */
    FILE *f = fopen(table, "w");
    ASSERT_TRUE(f != NULL);
    for (size_t n = 0; n <= LJ_TUNED_MAX_BYTES; n += strlen(good))
        ASSERT_TRUE(fputs(good, f) >= 0);
    ASSERT_EQ(fclose(f), 0);
    unsigned block, smem;
    run_toy(&u, LAJIT_AUTOTUNE_OFF, &block, &smem);
    ASSERT_EQ(block, 64);
    ASSERT_EQ(warnings, 1);
    ASSERT_CONTAINS(logbuf, "more than the 1048576 a table may have");
    /* The same line once: used. */
    write_text(table, good);
    run_toy(&u, LAJIT_AUTOTUNE_OFF, &block, &smem);
    ASSERT_EQ(block, 32);
    ASSERT_EQ(smem, 2048);
    ASSERT_EQ(warnings, 0);
    toy_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* `lajit db export --shipped DIR --device NAME`: the named device's winners only, for templates
 * this build has (a stale one is left out and counted), written to DIR/<slug>.json in the table
 * format the runtime loads. */
LJ_TEST(cli_export_shipped)
{
    require_nvrtc();
    use_tables();
    lj_fake_driver_reset();
    lj_tune_id id = fresh_id();
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, getenv("LAJIT_CACHE_DIR"), &db));
    lj_tune_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.config, sizeof r.config, "UNROLL=2 WARPS=1");
    r.ms = 0.5;
    ASSERT_OK(lj_tunedb_record(db, &id, &r, 1, "UNROLL=4 WARPS=2", 1.0));
    lj_tune_id stale = id;
    snprintf(stale.template_hash, sizeof stale.template_hash, "0123456789abcdef");
    snprintf(stale.bucket, sizeof stale.bucket, "bf16_D64");
    ASSERT_OK(lj_tunedb_record(db, &stale, &r, 1, "UNROLL=4 WARPS=2", 1.0));
    lj_tune_id other = id;
    snprintf(other.fp.name, sizeof other.fp.name, "NVIDIA H200");
    ASSERT_OK(lj_tunedb_record(db, &other, &r, 1, "UNROLL=4 WARPS=2", 1.0));
    lj_tunedb_close(db);

    const char *bin = getenv("LAJIT_TEST_BINARY_DIR");
    ASSERT_TRUE(bin != NULL);
    char cmd[4096], log[1100], out[8192];
    snprintf(log, sizeof log, "%s/cli.log", lj_test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s/tools/lajit' db export '%s' --shipped --device '%s' > '%s' 2>&1",
             bin, tables, id.fp.name, log);
    int st = system(cmd);
    FILE *f = fopen(log, "r");
    ASSERT_TRUE(f != NULL);
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = 0;
    fclose(f);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ASSERT_CONTAINS(out, "1 winners of lajit fake sm_90");
    ASSERT_CONTAINS(out, "1 left out");
    ASSERT_CONTAINS(out, "tuned/lajit-fake-sm-90.json");
    /* --device without --shipped is a usage error. */
    snprintf(cmd, sizeof cmd, "'%s/tools/lajit' db export '%s/x.json' --device X > /dev/null 2>&1",
             bin, lj_test_tmpdir());
    st = system(cmd);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2);

    /* What it wrote serves the toy call, with no user winner (a fresh cache directory). */
    char fresh[1100];
    snprintf(fresh, sizeof fresh, "%s/fresh-cache", lj_test_tmpdir());
    setenv("LAJIT_CACHE_DIR", fresh, 1);
    toy_call u;
    toy_open(&u);
    unsigned block, smem;
    run_toy(&u, LAJIT_AUTOTUNE_OFF, &block, &smem);
    ASSERT_EQ(block, 32);
    ASSERT_EQ(smem, 2048);
    ASSERT_EQ(warnings, 0);
    toy_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* A shipped table says "the default" where the tuner's winner beat the default by less than the
 * minimum gain (a near tie: its ranking is noise), and keeps clear winners; the bucket stays in
 * the table either way. The CLI's --min-gain sets it (default 3 %) and refuses what is not a
 * percentage. */
static void export_gain_case(const lj_tune_id *id, double ms, double min_gain,
                             const char *want_config, const char *want_ms)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    char dir[1100], path[1200], line[4096];
    snprintf(dir, sizeof dir, "%s/gain-%g-%g", lj_test_tmpdir(), ms, min_gain);
    snprintf(path, sizeof path, "%s/table.json", dir);
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, dir, &db));
    lj_tune_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.config, sizeof r.config, "UNROLL=2 WARPS=1");
    r.ms = ms;
    ASSERT_OK(lj_tunedb_record(db, id, &r, 1, "UNROLL=4 WARPS=2", 1.0));
    int rows = 0;
    ASSERT_OK(lj_tunedb_export_shipped(db, path, id->fp.name, min_gain, NULL, NULL, &rows));
    ASSERT_EQ(rows, 1);
    lj_tunedb_close(db);
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    ASSERT_TRUE(fgets(line, sizeof line, f) != NULL);
    fclose(f);
    char want[256];
    snprintf(want, sizeof want, "\"config\":\"%s\",\"ms\":%s,", want_config, want_ms);
    ASSERT_CONTAINS(line, want);
    ASSERT_CONTAINS(line, "\"default_config\":\"UNROLL=4 WARPS=2\",\"default_ms\":1.0,");
}

LJ_TEST(shipped_export_writes_near_ties_as_the_default)
{
    require_nvrtc();
    use_tables();
    lj_fake_driver_reset();
    lj_tune_id id = fresh_id();
    export_gain_case(&id, 0.99, 0.03, "UNROLL=4 WARPS=2", "1.0");  /* 1.0 % ahead: the default */
    export_gain_case(&id, 0.96, 0.03, "UNROLL=2 WARPS=1", "0.96"); /* 4.2 % ahead: kept */
    export_gain_case(&id, 0.99, 0.0, "UNROLL=2 WARPS=1", "0.99");  /* no minimum: kept */
    export_gain_case(&id, 0.6, 1.0, "UNROLL=4 WARPS=2", "1.0");    /* 1.67x: under 100 % */
    export_gain_case(&id, 0.5, 1.0, "UNROLL=2 WARPS=1", "0.5");    /* 2x: exactly 100 %, kept */

    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    lj_tunedb *db;
    char dir[1100], path[1200];
    snprintf(dir, sizeof dir, "%s/gain-bad", lj_test_tmpdir());
    snprintf(path, sizeof path, "%s/table.json", dir);
    ASSERT_OK(lj_tunedb_open(&env, dir, &db));
    int rows = 0;
    ASSERT_EQ(lj_tunedb_export_shipped(db, path, id.fp.name, -0.01, NULL, NULL, &rows),
              LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_EQ(lj_tunedb_export_shipped(db, path, id.fp.name, 1.5, NULL, NULL, &rows),
              LAJIT_ERR_INVALID_ARGUMENT);
    lj_tunedb_close(db);

    const char *bin = getenv("LAJIT_TEST_BINARY_DIR");
    ASSERT_TRUE(bin != NULL);
    const char *bad[] = {"--shipped --min-gain x", "--shipped --min-gain -1",
                         "--shipped --min-gain 101", "--shipped --min-gain 3x", "--min-gain 3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "'%s/tools/lajit' db export '%s/y.json' %s > /dev/null 2>&1", bin,
                 lj_test_tmpdir(), bad[i]);
        int st = system(cmd);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 2)
            lj_test_fail(__FILE__, __LINE__, "db export %s: exit %d, want 2", bad[i],
                         WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
}

/* The tables the tree ships (tuned/<slug>.json) were made for this tree's templates: every entry's
 * template hash is its family's here. A template change (any file of the family's folder or of
 * templates/common) retires them; then this fails until the tables are made again on their GPUs
 * (scripts/make_tuned_table.sh) or removed, instead of shipping tables that serve nothing (or,
 * where their kernels' machine code provably did not change, carried over by
 * scripts/rekey_tuned_rows.sh, which reads this test's message for the tree's hash). */
LJ_TEST(shipped_tables_match_this_trees_templates)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DISK_CACHE | LAJIT_CTX_NO_DEVICE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    const char *names[] = {"nvidia-h200.json", "nvidia-h100-80gb-hbm3.json"};
    int entries = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/tuned/%s", lj_test_source_dir(), names[i]);
        FILE *fp = fopen(path, "r");
        ASSERT_TRUE(fp != NULL);
        char line[4096];
        while (fgets(line, sizeof line, fp)) {
            char family[64] = "", hash[17] = "";
            const char *f = strstr(line, "\"family\":\""),
                       *h = strstr(line, "\"template_hash\":\"");
            ASSERT_TRUE(f && h);
            ASSERT_EQ(sscanf(f + 10, "%63[^\"]", family), 1);
            ASSERT_EQ(sscanf(h + 17, "%16[^\"]", hash), 1);
            lj_family *fam;
            ASSERT_OK(lajit__ctx_family(ctx, family, &fam));
            char want[17];
            ASSERT_OK(lj_tune_template_hash(lajit__ctx_env(ctx), fam, want));
            if (strcmp(hash, want) != 0)
                lj_test_fail(__FILE__, __LINE__,
                             "%s: %s entries have template hash %s, this tree's is %s: make the "
                             "table again (scripts/make_tuned_table.sh on that GPU) or remove it",
                             names[i], family, hash, want);
            entries++;
        }
        fclose(fp);
    }
    ASSERT_TRUE(entries > 0);
    lajit_ctx_destroy(ctx);
}
