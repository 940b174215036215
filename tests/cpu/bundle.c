/* bundle.c — offline kernel sets (generator/bundle.h): the file round trip, checksums that keep a
 * damaged kernel from being launched, damaged or foreign files refused when a context opens
 * them, and the point of it all — a context with a bundle builds its plan and launches (through
 * the fake driver) with NVRTC made unloadable, while the same call without the bundle fails for
 * want of a compiler. Bundles are written by the `lajit gen` command in a child process, so this
 * process never loads NVRTC where the test needs it absent. */
#include "test.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bundle.h"
#include "context.h"
#include "fake_driver.h"

enum { B = 2, H = 3, N = 5, D = 32, E = 16 };

/* Writes a bundle of la_recurrent's kernel for the forward below, for `archs`, with `lajit gen`.
 * Skips the test when NVRTC cannot compile on this machine. */
static void gen_bundle(const char *path, const char *archs, int n_value)
{
    const char *bin = getenv("LAJIT_TEST_BINARY_DIR");
    ASSERT_TRUE(bin != NULL);
    char cmd[2048];
    snprintf(
        cmd, sizeof cmd,
        "LAJIT_CACHE_DIR=%s.cache %s/tools/lajit gen --arch %s --family la_recurrent -p dtype=f32 "
        "-p B=%d -p H=%d -p N=%d -p D=%d -p E=%d -p decay=1 -p has_initial=1 -p has_final=1 "
        "-o %s > %s.log 2>&1",
        path, bin, archs, B, H, n_value, D, E, path, path);
    int rc = system(cmd);
    if (rc != 0) {
        char info[1024];
        snprintf(info, sizeof info, "%s/tools/lajit info 2>&1 | grep -qi 'nvrtc.*not'", bin);
        if (system(info) == 0)
            lj_test_skip("NVRTC not available to write the bundle");
        lj_test_fail(__FILE__, __LINE__, "lajit gen failed (%d): see %s.log", rc, path);
    }
}

typedef struct fwd_setup {
    CUcontext cuctx;
    CUdeviceptr q, k, v, o, s, s0;
    int64_t qshape[4], vshape[4], sshape[1], stshape[4];
    DLTensor tq, tk, tv, to, ts, ts0;
    lajit_attn_fwd_args args;
} fwd_setup;

static DLTensor make(CUdeviceptr p, int ndim, int64_t *shape, uint8_t code, uint8_t bits)
{
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = (void *)(uintptr_t)p;
    t.device.device_type = kDLCUDA;
    t.ndim = ndim;
    t.dtype.code = code;
    t.dtype.bits = bits;
    t.dtype.lanes = 1;
    t.shape = shape;
    return t;
}

/* The fp32 forward with decay and an in-place state that gen_bundle's kernel serves. */
static void setup_open(fwd_setup *u, int n_value)
{
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    memset(u, 0, sizeof *u);
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&u->cuctx, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(u->cuctx), CUDA_SUCCESS);
    size_t nq = (size_t)B * H * n_value * D * 4, nv = (size_t)B * H * n_value * E * 4;
    ASSERT_EQ(drv->cuMemAlloc(&u->q, nq), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->k, nq), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->v, nv), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->o, nv), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->s, H * 4), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuMemAlloc(&u->s0, (size_t)B * H * D * E * 4), CUDA_SUCCESS);
    int64_t qs[4] = {B, H, n_value, D}, vs[4] = {B, H, n_value, E}, st[4] = {B, H, D, E};
    memcpy(u->qshape, qs, sizeof qs);
    memcpy(u->vshape, vs, sizeof vs);
    memcpy(u->stshape, st, sizeof st);
    u->sshape[0] = H;
    u->tq = make(u->q, 4, u->qshape, kDLFloat, 32);
    u->tk = make(u->k, 4, u->qshape, kDLFloat, 32);
    u->tv = make(u->v, 4, u->vshape, kDLFloat, 32);
    u->to = make(u->o, 4, u->vshape, kDLFloat, 32);
    u->ts = make(u->s, 1, u->sshape, kDLFloat, 32);
    u->ts0 = make(u->s0, 4, u->stshape, kDLFloat, 32);
    u->args.struct_size = sizeof u->args;
    u->args.q = &u->tq;
    u->args.k = &u->tk;
    u->args.v = &u->tv;
    u->args.o = &u->to;
    u->args.s = &u->ts;
    u->args.scale = 0.5f;
    u->args.initial_state = &u->ts0;
    u->args.final_state = &u->ts0;
    u->args.family = "la_recurrent";
}

static void setup_close(fwd_setup *u)
{
    const lj_driver *drv = lj_fake_driver();
    ASSERT_EQ(drv->cuCtxSetCurrent(u->cuctx), CUDA_SUCCESS);
    CUdeviceptr all[] = {u->q, u->k, u->v, u->o, u->s, u->s0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ASSERT_EQ(drv->cuMemFree(all[i]), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

static char log_seen[8192];

static void capture_log(void *user, lajit_log_level level, const char *message)
{
    (void)user, (void)level;
    size_t used = strlen(log_seen);
    snprintf(log_seen + used, sizeof log_seen - used, "%s\n", message);
}

static lajit_status bundle_ctx(const char *bundle, lajit_ctx **out)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.bundle = bundle;
    desc.flags = LAJIT_CTX_NO_DISK_CACHE;
    desc.log = capture_log;
    desc.log_level = LAJIT_LOG_INFO;
    lajit_status st = lajit_ctx_create(&desc, out);
    if (st == LAJIT_OK)
        lajit__ctx_set_driver(*out, lj_fake_driver());
    return st;
}

/* A file in a folder private to this test process. */
static void tmp_path(char *out, size_t cap, const char *name)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/lajit-bundle-test-%ld",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (long)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    ASSERT_EQ(system(cmd), 0);
    snprintf(out, cap, "%s/%s", dir, name);
}

LJ_TEST(round_trip_and_ptx_choice)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    char path[1024];
    tmp_path(path, sizeof path, "rt.lajitpack");
    lj_bundle *b;
    ASSERT_OK(lj_bundle_create(&env, path, &b));
    unsigned char cubin[300];
    for (size_t i = 0; i < sizeof cubin; i++)
        cubin[i] = (unsigned char)(i * 7 + 1);
    lj_key key = {0x1234, 0x5678};
    lj_bundle_item it = {"la_fwd", "sm_90a", "bucket", "BLOCK=64", "problem",
                         "la_fwd", key,      0,        cubin,      sizeof cubin};
    ASSERT_OK(lj_bundle_add(b, &it));
    const char *archs[] = {"sm_80", "sm_86", "sm_90a"};
    for (int i = 0; i < 3; i++) {
        char ptx[64];
        int n = snprintf(ptx, sizeof ptx, "// ptx for %s", archs[i]);
        lj_bundle_item p = {"la_fwd", archs[i], "bucket", "BLOCK=64", "problem",
                            "la_fwd", key,      1,        ptx,        (size_t)n + 1};
        ASSERT_OK(lj_bundle_add(b, &p));
    }
    ASSERT_OK(lj_bundle_finish(b));

    ASSERT_OK(lj_bundle_open(&env, path, &b));
    const void *img;
    size_t size;
    int found;
    ASSERT_OK(lj_bundle_find(b, key, "sm_90a", 0, &img, &size, &found));
    ASSERT_EQ(found, 1);
    ASSERT_EQ(size, sizeof cubin);
    ASSERT_TRUE(memcmp(img, cubin, sizeof cubin) == 0);
    ASSERT_OK(lj_bundle_find(b, key, "sm_100a", 0, &img, &size, &found));
    ASSERT_EQ(found, 0);
    lj_key other = {0x1234, 0x5679};
    ASSERT_OK(lj_bundle_find(b, other, "sm_90a", 0, &img, &size, &found));
    ASSERT_EQ(found, 0);
    char config[64];
    ASSERT_OK(lj_bundle_config(b, "la_fwd", "bucket", "sm_90a", config, sizeof config, &found));
    ASSERT_EQ(found, 1);
    ASSERT_STREQ(config, "BLOCK=64");
    /* PTX: the newest plain arch not newer than the device; sm_90a PTX is never a fallback. */
    char arch[16];
    ASSERT_OK(
        lj_bundle_find_ptx(b, "la_fwd", "bucket", "BLOCK=64", 120, &img, &size, arch, &found));
    ASSERT_EQ(found, 1);
    ASSERT_STREQ(arch, "sm_86");
    ASSERT_TRUE(strstr((const char *)img, "sm_86") != NULL);
    ASSERT_OK(lj_bundle_find_ptx(b, "la_fwd", "bucket", "BLOCK=64", 80, &img, &size, arch, &found));
    ASSERT_STREQ(arch, "sm_80");
    ASSERT_OK(lj_bundle_find_ptx(b, "la_fwd", "bucket", "BLOCK=64", 75, &img, &size, arch, &found));
    ASSERT_EQ(found, 0);
    int cubins, ptxs;
    ASSERT_OK(lj_bundle_count(b, &cubins, &ptxs));
    ASSERT_EQ(cubins, 1);
    ASSERT_EQ(ptxs, 3);
    lj_bundle_close(b);
}

LJ_TEST(checksum_mismatch_is_never_used)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, capture_log, NULL, LAJIT_LOG_WARN);
    char path[1024];
    tmp_path(path, sizeof path, "sum.lajitpack");
    lj_bundle *b;
    ASSERT_OK(lj_bundle_create(&env, path, &b));
    unsigned char cubin[64] = {1, 2, 3};
    lj_key key = {1, 2};
    lj_bundle_item it = {"la_fwd", "sm_90a", "bucket", "BLOCK=64", "p",
                         "la_fwd", key,      0,        cubin,      sizeof cubin};
    ASSERT_OK(lj_bundle_add(b, &it));
    ASSERT_OK(lj_bundle_finish(b));
    /* Flip one byte of the stored kernel. */
    sqlite3 *db;
    ASSERT_EQ(sqlite3_open(path, &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "UPDATE kernels SET image = X'010203FF' || substr(image, 5)", NULL,
                           NULL, NULL),
              SQLITE_OK);
    sqlite3_close(db);
    ASSERT_OK(lj_bundle_open(&env, path, &b));
    const void *img = NULL;
    size_t size;
    int found = 1;
    ASSERT_OK(lj_bundle_find(b, key, "sm_90a", 0, &img, &size, &found));
    ASSERT_EQ(found, 0);
    ASSERT_TRUE(strstr(log_seen, "checksum") != NULL);
    lj_bundle_close(b);
}

LJ_TEST(damaged_or_foreign_files_refused_at_creation)
{
    char path[1024], cmd[3072];
    tmp_path(path, sizeof path, "good.lajitpack");
    gen_bundle(path, "sm_90a", N);
    lajit_ctx *ctx = NULL;
    ASSERT_OK(bundle_ctx(path, &ctx));
    lajit_ctx_destroy(ctx);

    const char *cases[][2] = {
        {"missing", "rm -f %s.x"},
        {"garbage", "head -c 20000 /dev/urandom > %s.x"},
        {"truncated", "head -c 8192 %s > %s.x"},
        {"text", "echo hello > %s.x"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cmd, sizeof cmd, cases[i][1], path, path);
        ASSERT_EQ(system(cmd), 0);
        char bad[1100];
        snprintf(bad, sizeof bad, "%s.x", path);
        lajit_status st = bundle_ctx(bad, &ctx);
        if (st != LAJIT_ERR_DATABASE)
            lj_test_fail(__FILE__, __LINE__, "%s bundle: status %s", cases[i][0],
                         lajit_status_string(st));
    }
    /* A later format version. */
    snprintf(cmd, sizeof cmd, "cp %s %s.v", path, path);
    ASSERT_EQ(system(cmd), 0);
    char future[1100];
    snprintf(future, sizeof future, "%s.v", path);
    sqlite3 *db;
    ASSERT_EQ(sqlite3_open(future, &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 99", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    ASSERT_STATUS(bundle_ctx(future, &ctx), LAJIT_ERR_DATABASE);
}

LJ_TEST(nvrtc_absent_with_a_bundle)
{
    char path[1024];
    tmp_path(path, sizeof path, "set.lajitpack");
    gen_bundle(path, "sm_80,sm_90a", N);
    /* From here on NVRTC cannot be loaded in this process. */
    setenv("LAJIT_NVRTC_PATH", "/nonexistent/libnvrtc.so", 1);
    lj_fake_driver_reset();
    fwd_setup u;
    setup_open(&u, N);

    lajit_ctx *ctx;
    ASSERT_OK(bundle_ctx(path, &ctx));
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    ASSERT_EQ(lj_fake_launch_count(), 1);
    ASSERT_STREQ(lj_fake_launch_get(0)->entry, "la_recurrent_fwd");
    ASSERT_EQ(lj_fake_driver_counts()->loads, 1);
    ASSERT_TRUE(strstr(log_seen, "(bundle)") != NULL);
    lajit_ctx_destroy(ctx);

    /* The same call without the bundle has no compiler. */
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DISK_CACHE;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lajit__ctx_set_driver(ctx, lj_fake_driver());
    ASSERT_STATUS(lajit_attn_fwd(ctx, &u.args), LAJIT_ERR_NO_COMPILER);
    lajit_ctx_destroy(ctx);

    setup_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

LJ_TEST(missing_arch_falls_back_to_ptx_or_says_why)
{
    char path[1024], other[1024];
    tmp_path(path, sizeof path, "sm80.lajitpack");
    gen_bundle(path, "sm_80", N);
    tmp_path(other, sizeof other, "sm90a.lajitpack");
    gen_bundle(other, "sm_90a", N);
    setenv("LAJIT_NVRTC_PATH", "/nonexistent/libnvrtc.so", 1);
    lj_fake_driver_reset();
    fwd_setup u;
    setup_open(&u, N);

    /* The device is sm_90a; the bundle has sm_80 only: its PTX, with a log line. */
    lajit_ctx *ctx;
    log_seen[0] = 0;
    ASSERT_OK(bundle_ctx(path, &ctx));
    ASSERT_OK(lajit_attn_fwd(ctx, &u.args));
    ASSERT_EQ(lj_fake_launch_count(), 1);
    ASSERT_TRUE(strstr(log_seen, "sm_80 PTX") != NULL);
    lajit_ctx_destroy(ctx);

    /* A kernel the bundle does not hold (no states: another specialisation), no NVRTC: a clear
     * error. */
    fwd_setup w;
    setup_close(&u);
    ASSERT_TRUE(lj_fake_driver_balanced());
    lj_fake_driver_reset();
    setup_open(&w, N);
    w.args.initial_state = w.args.final_state = NULL;
    ASSERT_OK(bundle_ctx(other, &ctx));
    ASSERT_STATUS(lajit_attn_fwd(ctx, &w.args), LAJIT_ERR_NO_COMPILER);
    ASSERT_TRUE(strstr(lajit_errmsg(ctx), "bundle") != NULL);
    lajit_ctx_destroy(ctx);
    setup_close(&w);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* ---- Bundles as untrusted input -------------------------------------------------------------- */

/* Writes a file with the bundle's format version and the given SQL (made by hand, as an attacker
 * would). */
static void hand_bundle(const char *path, const char *sql)
{
    unlink(path);
    sqlite3 *db;
    ASSERT_EQ(sqlite3_open(path, &db), SQLITE_OK);
    char pragma[64];
    snprintf(pragma, sizeof pragma, "PRAGMA user_version = %d", LJ_BUNDLE_FORMAT);
    ASSERT_EQ(sqlite3_exec(db, pragma, NULL, NULL, NULL), SQLITE_OK);
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK)
        lj_test_fail(__FILE__, __LINE__, "%s", err);
    sqlite3_close(db);
}

/* The kernels table without its NOT NULL constraints, so NULLs and other types can be stored. */
#define LOOSE_KERNELS                                                                         \
    "CREATE TABLE kernels(source_key TEXT, arch TEXT, ptx INTEGER, family TEXT, bucket TEXT," \
    " config TEXT, problem TEXT, entry TEXT, image BLOB, checksum TEXT);"

/* NULL and wrong-typed values in every column are refused row by row, never dereferenced. */
LJ_TEST(null_and_wrong_typed_columns)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, capture_log, NULL, LAJIT_LOG_WARN);
    char path[1024];
    tmp_path(path, sizeof path, "null.lajitpack");
    hand_bundle(
        path, LOOSE_KERNELS
        "INSERT INTO kernels VALUES(NULL, NULL, 1, 'la_fwd', 'b', 'c', NULL, NULL, NULL, NULL);"
        "INSERT INTO kernels VALUES('k', 'sm_80', 1, 'la_fwd', 'b', 'c', 'p', 'e', X'00', NULL);"
        "INSERT INTO kernels VALUES('k', 'sm_80', 'x', NULL, 'b', 'c', 'p', 'e', 3.5, 'zz');"
        "INSERT INTO kernels VALUES(NULL, 'sm_90a', 0, 'la_fwd', 'b', NULL, 'p', 'e', X'01', 'x');"
        "INSERT INTO kernels VALUES(NULL, 'sm_90a', 0, 'la_fwd', 'b', 7, 'p', 'e', X'01', 'x');");
    lj_bundle *b;
    ASSERT_OK(lj_bundle_open(&env, path, &b));
    const void *img = NULL;
    size_t size;
    int found = 1;
    char arch[16], config[64];
    ASSERT_OK(lj_bundle_find_ptx(b, "la_fwd", "b", "c", 90, &img, &size, arch, &found));
    ASSERT_EQ(found, 0);
    found = 1;
    ASSERT_OK(lj_bundle_config(b, "la_fwd", "b", "sm_90a", config, sizeof config, &found));
    ASSERT_EQ(found, 0);
    lj_key key = {0, 0};
    found = 1;
    ASSERT_OK(lj_bundle_find(b, key, "sm_80", 1, &img, &size, &found));
    ASSERT_EQ(found, 0);
    int cubins, ptxs;
    ASSERT_OK(lj_bundle_count(b, &cubins, &ptxs));
    lj_bundle_close(b);
}

/* `kernels` as a view over an endless recursive query: refused at open, no op ever hangs (the
 * alarm fails the test if one does). */
LJ_TEST(kernels_view_refused_at_open)
{
    alarm(60);
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    char path[1024];
    tmp_path(path, sizeof path, "view.lajitpack");
    hand_bundle(
        path,
        "CREATE VIEW kernels AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n)"
        " SELECT 'k' AS source_key, 'sm_90a' AS arch, 0 AS ptx, 'la_fwd' AS family,"
        " 'b' AS bucket, 'c' AS config, 'p' AS problem, 'e' AS entry, X'00' AS image,"
        " 'x' AS checksum FROM n WHERE i < 0;");
    lj_bundle *b = NULL;
    lajit_status st = lj_bundle_open(&env, path, &b);
    if (st == LAJIT_OK) {
        char config[64];
        int found;
        lj_bundle_config(b, "la_fwd", "b", "sm_90a", config, sizeof config, &found);
        lj_bundle_close(b);
        lj_test_fail(__FILE__, __LINE__, "a view named kernels was accepted");
    }
    ASSERT_EQ(st, LAJIT_ERR_DATABASE);
    ASSERT_CONTAINS(env.errmsg, "plain table");
    /* A table with other columns is refused too. */
    hand_bundle(path, "CREATE TABLE kernels(source_key, arch, ptx, image);");
    ASSERT_STATUS(lj_bundle_open(&env, path, &b), LAJIT_ERR_DATABASE);
    ASSERT_CONTAINS(env.errmsg, "other columns");
}

/* A row copied under another arch (or key, family, bucket, config) keeps its image and its old
 * checksum: the checksum covers what selects the row, so the copy is never served. */
LJ_TEST(row_moved_to_another_key_is_refused)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, capture_log, NULL, LAJIT_LOG_WARN);
    char path[1024];
    tmp_path(path, sizeof path, "moved.lajitpack");
    const char *edits[] = {
        "UPDATE kernels SET arch = 'sm_90a'",
        "UPDATE kernels SET source_key = 'f0000000000000000000000000000009'",
        "UPDATE kernels SET config = 'BLOCK=128'",
        "UPDATE kernels SET entry = 'other_entry'",
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        lj_bundle *b;
        ASSERT_OK(lj_bundle_create(&env, path, &b));
        unsigned char cubin[64] = {9, 8, 7};
        lj_key key = {0, 9};
        lj_bundle_item it = {"la_fwd", "sm_80", "bucket", "BLOCK=64", "p",
                             "la_fwd", key,     0,        cubin,      sizeof cubin};
        ASSERT_OK(lj_bundle_add(b, &it));
        ASSERT_OK(lj_bundle_finish(b));
        sqlite3 *db;
        ASSERT_EQ(sqlite3_open(path, &db), SQLITE_OK);
        ASSERT_EQ(sqlite3_exec(db, edits[i], NULL, NULL, NULL), SQLITE_OK);
        sqlite3_close(db);
        ASSERT_OK(lj_bundle_open(&env, path, &b));
        const void *img = NULL;
        size_t size;
        int found = 0;
        log_seen[0] = 0;
        const char *arch = i == 0 ? "sm_90a" : "sm_80";
        ASSERT_OK(lj_bundle_find(b, i == 1 ? (lj_key){0, 9} : key, arch, 0, &img, &size, &found));
        if (i == 1) {
            lj_key moved;
            ASSERT_TRUE(lj_key_parse("f0000000000000000000000000000009", &moved));
            ASSERT_OK(lj_bundle_find(b, moved, arch, 0, &img, &size, &found));
        }
        if (found)
            lj_test_fail(__FILE__, __LINE__, "served after: %s", edits[i]);
        char config[64];
        ASSERT_OK(lj_bundle_config(b, "la_fwd", "bucket", arch, config, sizeof config, &found));
        if (found)
            lj_test_fail(__FILE__, __LINE__, "config served after: %s", edits[i]);
        lj_bundle_close(b);
    }
}

/* A bundle of the previous format (whose checksums covered only the image) is refused with a
 * message that says what to do. */
LJ_TEST(old_format_refused_with_advice)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    char path[1024];
    tmp_path(path, sizeof path, "old.lajitpack");
    lj_bundle *b;
    ASSERT_OK(lj_bundle_create(&env, path, &b));
    ASSERT_OK(lj_bundle_finish(b));
    sqlite3 *db;
    ASSERT_EQ(sqlite3_open(path, &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 1", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    ASSERT_STATUS(lj_bundle_open(&env, path, &b), LAJIT_ERR_DATABASE);
    ASSERT_CONTAINS(env.errmsg, "older lajit");
    ASSERT_CONTAINS(env.errmsg, "lajit gen");
}

/* Links and special files are refused before SQLite sees them (a FIFO would block the open). */
LJ_TEST(links_and_special_files_refused)
{
    alarm(60);
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    char path[1024], link[1100], fifo[1100];
    tmp_path(path, sizeof path, "real.lajitpack");
    lj_bundle *b;
    ASSERT_OK(lj_bundle_create(&env, path, &b));
    ASSERT_OK(lj_bundle_finish(b));
    ASSERT_OK(lj_bundle_open(&env, path, &b));
    lj_bundle_close(b);
    snprintf(link, sizeof link, "%s.link", path);
    unlink(link);
    ASSERT_EQ(symlink(path, link), 0);
    ASSERT_STATUS(lj_bundle_open(&env, link, &b), LAJIT_ERR_DATABASE);
    ASSERT_CONTAINS(env.errmsg, "symbolic link");
    snprintf(fifo, sizeof fifo, "%s.fifo", path);
    unlink(fifo);
    ASSERT_EQ(mkfifo(fifo, 0600), 0);
    ASSERT_STATUS(lj_bundle_open(&env, fifo, &b), LAJIT_ERR_DATABASE);
    ASSERT_CONTAINS(env.errmsg, "not a regular file");
}

/* The bundle is written through a private temporary file: mode 0600, nothing left beside it. */
LJ_TEST(written_through_a_private_temporary)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    char path[1024];
    tmp_path(path, sizeof path, "w/out.lajitpack");
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\" && rm -f \"$(dirname '%s')\"/*", path,
             path);
    ASSERT_EQ(system(cmd), 0);
    lj_bundle *b;
    ASSERT_OK(lj_bundle_create(&env, path, &b));
    ASSERT_OK(lj_bundle_finish(b));
    struct stat st;
    ASSERT_EQ(lstat(path, &st), 0);
    ASSERT_TRUE(S_ISREG(st.st_mode));
    ASSERT_EQ(st.st_mode & 0777, 0600);
    snprintf(cmd, sizeof cmd, "test $(ls -1 \"$(dirname '%s')\" | wc -l) -eq 1", path);
    ASSERT_EQ(system(cmd), 0);
    /* An abort leaves nothing. */
    ASSERT_OK(lj_bundle_create(&env, path, &b));
    lj_bundle_abort(b);
    ASSERT_EQ(system(cmd), 0);
}

/* A context whose bundle cannot be opened says why through lajit_errmsg(NULL). */
LJ_TEST(failed_bundle_open_keeps_its_message)
{
    char path[1024];
    tmp_path(path, sizeof path, "nothing-here.lajitpack");
    unlink(path);
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DISK_CACHE;
    desc.bundle = path;
    lajit_ctx *ctx = NULL;
    ASSERT_STATUS(lajit_ctx_create(&desc, &ctx), LAJIT_ERR_DATABASE);
    ASSERT_CONTAINS(lajit_errmsg(NULL), "nothing-here.lajitpack");
    /* A later successful creation clears it. */
    desc.bundle = NULL;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    ASSERT_TRUE(strstr(lajit_errmsg(NULL), "nothing-here") == NULL);
    lajit_ctx_destroy(ctx);
}
