/* cache.c — the kernel cache: memory and disk round trips, concurrent writer processes, and
 * every way a disk entry or directory can be bad (truncated, corrupt, foreign magic or version,
 * writable by others, owned by someone else, a symbolic link): each is refused or rebuilt with a
 * WARN log line, never loaded. */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache.h"
#include "test.h"

/* ---- Helpers ---------------------------------------------------------------------------- */

typedef struct log_capture {
    int warns;
    char last[2048];
} log_capture;

static void capture(void *user, lajit_log_level level, const char *msg)
{
    log_capture *c = user;
    if (level <= LAJIT_LOG_WARN) {
        c->warns++;
        snprintf(c->last, sizeof c->last, "%s", msg);
    }
}

static log_capture g_log;
static lj_env g_env;

static lj_env *env_init(void)
{
    memset(&g_log, 0, sizeof g_log);
    lj_env_init(&g_env, NULL, NULL, capture, &g_log, LAJIT_LOG_DEBUG);
    return &g_env;
}

static char *cache_dir(const char *sub)
{
    static char buf[4][600];
    static int next;
    char *p = buf[next++ & 3];
    snprintf(p, 600, "%s/%s", lj_test_tmpdir(), sub);
    return p;
}

static lj_key key_n(uint64_t n)
{
    lj_key k = {0x1111222233334444ull ^ (n * 0x9e3779b97f4a7c15ull), n};
    return k;
}

/* A fake image whose bytes depend on the key (so a mix-up of entries shows). */
static lj_compiled fake(uint64_t n, size_t size)
{
    lj_compiled c;
    memset(&c, 0, sizeof c);
    unsigned char *img = malloc(size);
    for (size_t i = 0; i < size; i++)
        img[i] = (unsigned char)(n * 31 + i * 7 + (i >> 8));
    c.image = img;
    c.image_size = size;
    c.regs = (int)(n % 200) + 1;
    c.spill_stores = 4;
    c.spill_loads = 8;
    c.stack_bytes = 16;
    c.smem_static = 1024;
    return c;
}

static void fake_free(lj_compiled *c)
{
    free(c->image);
}

static void entry_path(const char *dir, lj_key k, int ptx, char *out, size_t cap)
{
    char hex[33];
    lj_key_hex(k, hex);
    snprintf(out, cap, "%s/%s%s", dir, hex, ptx ? ".ptx" : ".cubin");
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static void put_one(const char *dir, uint64_t n, size_t size)
{
    lj_cache *c;
    ASSERT_OK(lj_cache_open(&g_env, dir, &c));
    lj_compiled img = fake(n, size);
    ASSERT_OK(lj_cache_put(c, key_n(n), 0, &img));
    fake_free(&img);
    lj_cache_close(c);
}

/* Looks key n up in a fresh cache on dir; returns found and checks the bytes when found. */
static int get_fresh(const char *dir, uint64_t n, size_t size)
{
    lj_cache *c;
    ASSERT_OK(lj_cache_open(&g_env, dir, &c));
    lj_cache_entry e;
    int found = -1;
    ASSERT_OK(lj_cache_get(c, key_n(n), 0, &e, &found));
    if (found) {
        lj_compiled want = fake(n, size);
        ASSERT_EQ(e.size, size);
        ASSERT_TRUE(memcmp(e.image, want.image, size) == 0);
        ASSERT_EQ(e.regs, want.regs);
        ASSERT_EQ(e.spill_stores, 4);
        ASSERT_EQ(e.spill_loads, 8);
        ASSERT_EQ(e.stack_bytes, 16);
        ASSERT_EQ(e.smem_static, 1024);
        ASSERT_EQ(e.from_disk, 1);
        fake_free(&want);
    }
    lj_cache_close(c);
    return found;
}

/* ---- Memory and disk round trips -------------------------------------------------------- */

LJ_TEST(memory_put_get)
{
    env_init();
    lj_cache *c;
    ASSERT_OK(lj_cache_open(&g_env, NULL, &c));
    ASSERT_TRUE(lj_cache_dir(c) == NULL);
    lj_cache_entry e;
    int found = -1;
    ASSERT_OK(lj_cache_get(c, key_n(1), 0, &e, &found));
    ASSERT_EQ(found, 0);
    /* Enough keys to grow the table several times. */
    for (uint64_t n = 1; n <= 200; n++) {
        lj_compiled img = fake(n, 100 + n);
        ASSERT_OK(lj_cache_put(c, key_n(n), 0, &img));
        fake_free(&img);
    }
    for (uint64_t n = 1; n <= 200; n++) {
        ASSERT_OK(lj_cache_get(c, key_n(n), 0, &e, &found));
        ASSERT_EQ(found, 1);
        ASSERT_EQ(e.from_disk, 0);
        lj_compiled want = fake(n, 100 + n);
        ASSERT_EQ(e.size, 100 + n);
        ASSERT_TRUE(memcmp(e.image, want.image, e.size) == 0);
        ASSERT_EQ(e.regs, want.regs);
        fake_free(&want);
        /* The PTX flag is part of the key. */
        ASSERT_OK(lj_cache_get(c, key_n(n), 1, &e, &found));
        ASSERT_EQ(found, 0);
    }
    /* A second put of a key keeps the first image (pointers to it may be held). */
    ASSERT_OK(lj_cache_get(c, key_n(5), 0, &e, &found));
    const void *held = e.image;
    lj_compiled other = fake(999, 105);
    ASSERT_OK(lj_cache_put(c, key_n(5), 0, &other));
    fake_free(&other);
    ASSERT_OK(lj_cache_get(c, key_n(5), 0, &e, &found));
    ASSERT_TRUE(e.image == held);
    lj_cache_close(c);
    lj_cache_close(NULL);
    ASSERT_EQ(g_log.warns, 0);
}

LJ_TEST(disk_round_trip)
{
    env_init();
    /* Missing parents are created, each 0700. */
    const char *dir = cache_dir("a/b/cache");
    lj_cache *c;
    ASSERT_OK(lj_cache_open(&g_env, dir, &c));
    ASSERT_STREQ(lj_cache_dir(c), dir);
    lj_cache_entry e;
    int found = -1;
    ASSERT_OK(lj_cache_get(c, key_n(7), 0, &e, &found)); /* absent dir: just not found */
    ASSERT_EQ(found, 0);
    ASSERT_TRUE(!exists(dir)); /* reads never create it */
    lj_compiled img = fake(7, 5000);
    ASSERT_OK(lj_cache_put(c, key_n(7), 0, &img));
    lj_compiled ptx = fake(8, 301);
    ((char *)ptx.image)[300] = 0;
    ASSERT_OK(lj_cache_put(c, key_n(7), 1, &ptx));
    lj_cache_close(c);

    struct stat st;
    ASSERT_TRUE(stat(dir, &st) == 0);
    ASSERT_EQ(st.st_mode & 0777, 0700);
    ASSERT_TRUE(stat(cache_dir("a/b"), &st) == 0);
    ASSERT_EQ(st.st_mode & 0777, 0700);
    char path[700];
    entry_path(dir, key_n(7), 0, path, sizeof path);
    ASSERT_TRUE(stat(path, &st) == 0);
    ASSERT_EQ(st.st_mode & 0777, 0600);
    ASSERT_EQ(st.st_size, 96 + 5000);
    entry_path(dir, key_n(7), 1, path, sizeof path);
    ASSERT_TRUE(exists(path));

    /* A new cache (as in a new process) reads it from disk, then from memory. */
    ASSERT_EQ(get_fresh(dir, 7, 5000), 1);
    ASSERT_OK(lj_cache_open(&g_env, dir, &c));
    ASSERT_OK(lj_cache_get(c, key_n(7), 1, &e, &found));
    ASSERT_EQ(found, 1);
    ASSERT_EQ(e.from_disk, 1);
    ASSERT_EQ(e.size, 301);
    ASSERT_TRUE(memcmp(e.image, ptx.image, 301) == 0);
    ASSERT_OK(lj_cache_get(c, key_n(7), 1, &e, &found));
    ASSERT_EQ(e.from_disk, 0);
    lj_cache_close(c);
    fake_free(&img);
    fake_free(&ptx);
    ASSERT_EQ(g_log.warns, 0);
}

LJ_TEST(default_dir)
{
    env_init();
    char *d = NULL;
    setenv("LAJIT_CACHE_DIR", "/x/lajit-cache", 1);
    ASSERT_OK(lj_cache_default_dir(&g_env, &d));
    ASSERT_STREQ(d, "/x/lajit-cache");
    lj_free(&g_env, d);
    unsetenv("LAJIT_CACHE_DIR");
    setenv("XDG_CACHE_HOME", "/xdg", 1);
    ASSERT_OK(lj_cache_default_dir(&g_env, &d));
    ASSERT_STREQ(d, "/xdg/lajit");
    lj_free(&g_env, d);
    setenv("XDG_CACHE_HOME", "relative", 1); /* invalid per the XDG spec: ignored */
    setenv("HOME", "/home/someone", 1);
    ASSERT_OK(lj_cache_default_dir(&g_env, &d));
    ASSERT_STREQ(d, "/home/someone/.cache/lajit");
    lj_free(&g_env, d);
}

/* ---- Concurrency ------------------------------------------------------------------------ */

static void visit(void *user, const char *path, size_t size, int ok, const char *reason)
{
    int *t = user;
    t[0]++;
    if (!ok) {
        t[1]++;
        fprintf(stderr, "bad entry %s: %s\n", path, reason ? reason : "?");
    }
    if (size < 96)
        t[1]++;
}

/* 8 processes write 24 shared keys (the same bytes for one key, as real compiles give) and 8
 * keys of their own each, all at once into a directory that does not exist yet. Afterwards every
 * entry verifies, reads back identical, and no temporary file is left. */
LJ_TEST(concurrent_writers)
{
    env_init();
    const char *dir = cache_dir("shared/cache");
    enum { WRITERS = 8, SHARED = 24, OWN = 8 };
    pid_t pids[WRITERS];
    for (int w = 0; w < WRITERS; w++) {
        pids[w] = fork();
        ASSERT_TRUE(pids[w] >= 0);
        if (pids[w] == 0) {
            env_init();
            lj_cache *c;
            if (lj_cache_open(&g_env, dir, &c) != LAJIT_OK)
                _exit(3);
            for (int round = 0; round < 3; round++) {
                for (uint64_t n = 0; n < SHARED; n++) {
                    lj_compiled img = fake(n, 3000 + 101 * n);
                    if (lj_cache_put(c, key_n(n), 0, &img) != LAJIT_OK)
                        _exit(4);
                    fake_free(&img);
                }
            }
            for (uint64_t n = 0; n < OWN; n++) {
                uint64_t id = 1000 + (uint64_t)w * 100 + n;
                lj_compiled img = fake(id, 777 + n);
                if (lj_cache_put(c, key_n(id), 0, &img) != LAJIT_OK)
                    _exit(5);
                fake_free(&img);
            }
            lj_cache_close(c);
            _exit(g_log.warns == 0 ? 0 : 6);
        }
    }
    for (int w = 0; w < WRITERS; w++) {
        int status = 0;
        ASSERT_TRUE(waitpid(pids[w], &status, 0) == pids[w]);
        ASSERT_TRUE(WIFEXITED(status));
        ASSERT_EQ(WEXITSTATUS(status), 0);
    }
    for (uint64_t n = 0; n < SHARED; n++)
        ASSERT_EQ(get_fresh(dir, n, 3000 + 101 * n), 1);
    for (int w = 0; w < WRITERS; w++)
        for (uint64_t n = 0; n < OWN; n++)
            ASSERT_EQ(get_fresh(dir, 1000 + (uint64_t)w * 100 + n, 777 + n), 1);

    int tally[2] = {0, 0}; /* entries, bad ones */
    ASSERT_OK(lj_cache_scan(&g_env, dir, 1, visit, tally));
    ASSERT_EQ(tally[0], SHARED + WRITERS * OWN);
    ASSERT_EQ(tally[1], 0);
    int removed = -1;
    ASSERT_OK(lj_cache_clear(&g_env, dir, &removed));
    ASSERT_EQ(removed, SHARED + WRITERS * OWN); /* so no temp file was left behind either */
    ASSERT_EQ(g_log.warns, 0);
}

/* ---- Bad entries: rebuilt ---------------------------------------------------------------- */

/* Writes a good entry for key 3, damages it with fn, then checks that a fresh cache reports it
 * absent, removes the file and logs a WARN naming the reason. */
static void damaged(void (*fn)(const char *path), const char *reason)
{
    env_init();
    const char *dir = cache_dir("cache");
    put_one(dir, 3, 4096);
    char path[700];
    entry_path(dir, key_n(3), 0, path, sizeof path);
    ASSERT_TRUE(exists(path));
    fn(path);
    ASSERT_EQ(get_fresh(dir, 3, 4096), 0);
    ASSERT_TRUE(!exists(path));
    ASSERT_EQ(g_log.warns, 1);
    ASSERT_CONTAINS(g_log.last, reason);
    ASSERT_CONTAINS(g_log.last, "removed");
    /* Rebuilt: a new put writes a good entry again. */
    put_one(dir, 3, 4096);
    ASSERT_EQ(get_fresh(dir, 3, 4096), 1);
}

static void patch(const char *path, long offset, const void *bytes, size_t n)
{
    int fd = open(path, O_WRONLY);
    ASSERT_TRUE(fd >= 0);
    ASSERT_TRUE(pwrite(fd, bytes, n, offset) == (ssize_t)n);
    close(fd);
}

static void do_truncate_payload(const char *path)
{
    ASSERT_TRUE(truncate(path, 96 + 1000) == 0);
}

static void do_truncate_header(const char *path)
{
    ASSERT_TRUE(truncate(path, 50) == 0);
}

static void do_flip_payload(const char *path)
{
    unsigned char b;
    int fd = open(path, O_RDONLY);
    ASSERT_TRUE(pread(fd, &b, 1, 96 + 1500) == 1);
    close(fd);
    b ^= 0x10;
    patch(path, 96 + 1500, &b, 1);
}

static void do_wrong_magic(const char *path)
{
    patch(path, 0, "LAJITKC0", 8);
}

static void do_future_version(const char *path)
{
    unsigned char v[4] = {2, 0, 0, 0};
    patch(path, 8, v, 4);
}

static void do_trailing(const char *path)
{
    int fd = open(path, O_WRONLY | O_APPEND);
    ASSERT_TRUE(write(fd, "x", 1) == 1);
    close(fd);
}

static void do_wrong_key(const char *path)
{
    unsigned char z[8] = {0};
    patch(path, 40, z, 8);
}

LJ_TEST(truncated_payload_rebuilt)
{
    damaged(do_truncate_payload, "truncated");
}

LJ_TEST(truncated_header_rebuilt)
{
    damaged(do_truncate_header, "truncated");
}

LJ_TEST(flipped_byte_rebuilt)
{
    damaged(do_flip_payload, "checksum");
}

LJ_TEST(wrong_magic_rebuilt)
{
    damaged(do_wrong_magic, "magic");
}

LJ_TEST(future_version_rebuilt)
{
    damaged(do_future_version, "version");
}

LJ_TEST(trailing_bytes_rebuilt)
{
    damaged(do_trailing, "size");
}

LJ_TEST(wrong_key_rebuilt)
{
    damaged(do_wrong_key, "does not match");
}

/* ---- Untrusted files and directories: refused ------------------------------------------- */

/* A refused entry is not loaded and not removed (it is not ours to judge). */
static void refused_entry(const char *dir, const char *path, const char *reason)
{
    memset(&g_log, 0, sizeof g_log);
    ASSERT_EQ(get_fresh(dir, 3, 4096), 0);
    ASSERT_EQ(g_log.warns, 1);
    ASSERT_CONTAINS(g_log.last, "refused");
    ASSERT_CONTAINS(g_log.last, reason);
    ASSERT_TRUE(exists(path));
}

LJ_TEST(entry_writable_by_others_refused)
{
    env_init();
    const char *dir = cache_dir("cache");
    put_one(dir, 3, 4096);
    char path[700];
    entry_path(dir, key_n(3), 0, path, sizeof path);
    ASSERT_TRUE(chmod(path, 0666) == 0);
    refused_entry(dir, path, "writable");
    ASSERT_TRUE(chmod(path, 0620) == 0);
    refused_entry(dir, path, "writable");
    ASSERT_TRUE(chmod(path, 0644) == 0); /* readable by others is fine */
    memset(&g_log, 0, sizeof g_log);
    ASSERT_EQ(get_fresh(dir, 3, 4096), 1);
}

LJ_TEST(entry_owned_by_other_refused)
{
    if (geteuid() != 0)
        lj_test_skip("needs root to give a file to another user");
    env_init();
    const char *dir = cache_dir("cache");
    put_one(dir, 3, 4096);
    char path[700];
    entry_path(dir, key_n(3), 0, path, sizeof path);
    ASSERT_TRUE(chown(path, 65534, 65534) == 0);
    refused_entry(dir, path, "another user");
}

LJ_TEST(symlink_entry_refused)
{
    env_init();
    /* A perfectly valid entry elsewhere, linked into the cache under its right name. */
    const char *other = cache_dir("elsewhere");
    const char *dir = cache_dir("cache");
    put_one(other, 3, 4096);
    put_one(dir, 4, 10); /* creates dir */
    char target[700], link[700];
    entry_path(other, key_n(3), 0, target, sizeof target);
    entry_path(dir, key_n(3), 0, link, sizeof link);
    ASSERT_TRUE(symlink(target, link) == 0);
    refused_entry(dir, link, "symbolic link");
}

LJ_TEST(dir_writable_by_others_refused)
{
    env_init();
    const char *dir = cache_dir("cache");
    put_one(dir, 3, 4096);
    ASSERT_TRUE(chmod(dir, 0777) == 0);
    memset(&g_log, 0, sizeof g_log);
    lj_cache *c;
    ASSERT_OK(lj_cache_open(&g_env, dir, &c));
    lj_cache_entry e;
    int found = -1;
    ASSERT_OK(lj_cache_get(c, key_n(3), 0, &e, &found));
    ASSERT_EQ(found, 0); /* the good entry inside is not loaded */
    ASSERT_EQ(g_log.warns, 1);
    ASSERT_CONTAINS(g_log.last, "refused");
    ASSERT_CONTAINS(g_log.last, "disk cache disabled");
    /* Memory still works, and nothing more is written to or read from the directory. */
    lj_compiled img = fake(9, 64);
    ASSERT_OK(lj_cache_put(c, key_n(9), 0, &img));
    ASSERT_OK(lj_cache_get(c, key_n(9), 0, &e, &found));
    ASSERT_EQ(found, 1);
    ASSERT_EQ(e.from_disk, 0);
    ASSERT_TRUE(memcmp(e.image, img.image, 64) == 0);
    fake_free(&img);
    lj_cache_close(c);
    ASSERT_EQ(g_log.warns, 1); /* said once per cache */
    char path[700];
    entry_path(dir, key_n(9), 0, path, sizeof path);
    ASSERT_TRUE(!exists(path));
    /* The CLI's maintenance refuses it too. */
    ASSERT_STATUS(lj_cache_scan(&g_env, dir, 0, NULL, NULL), LAJIT_ERR_CACHE);
    ASSERT_STATUS(lj_cache_clear(&g_env, dir, NULL), LAJIT_ERR_CACHE);
    ASSERT_TRUE(chmod(dir, 0700) == 0);
}

LJ_TEST(unwritable_dir_keeps_memory)
{
    env_init();
    /* A regular file where the directory should be: the write fails, memory keeps working. */
    const char *dir = cache_dir("file");
    FILE *f = fopen(dir, "w");
    ASSERT_TRUE(f != NULL);
    fclose(f);
    char sub[700];
    snprintf(sub, sizeof sub, "%s/cache", dir);
    lj_cache *c;
    ASSERT_OK(lj_cache_open(&g_env, sub, &c));
    lj_compiled img = fake(2, 64);
    ASSERT_OK(lj_cache_put(c, key_n(2), 0, &img));
    fake_free(&img);
    ASSERT_TRUE(g_log.warns >= 1);
    lj_cache_entry e;
    int found = 0;
    ASSERT_OK(lj_cache_get(c, key_n(2), 0, &e, &found));
    ASSERT_EQ(found, 1);
    lj_cache_close(c);
}

/* ---- Maintenance ------------------------------------------------------------------------- */

typedef struct seen {
    int n, ok, bad;
    char reasons[1024];
} seen;

static void collect(void *user, const char *path, size_t size, int ok, const char *reason)
{
    seen *s = user;
    s->n++;
    if (ok) {
        s->ok++;
        ASSERT_TRUE(size > 96);
    } else {
        s->bad++;
        size_t len = strlen(s->reasons);
        snprintf(s->reasons + len, sizeof s->reasons - len, "%s;", reason ? reason : "?");
    }
    ASSERT_TRUE(strstr(path, "/cache/") != NULL);
}

LJ_TEST(scan_verify_clear)
{
    env_init();
    const char *dir = cache_dir("cache");
    seen s;
    memset(&s, 0, sizeof s);
    ASSERT_OK(lj_cache_scan(&g_env, dir, 1, collect, &s)); /* absent: empty */
    ASSERT_EQ(s.n, 0);
    int removed = -1;
    ASSERT_OK(lj_cache_clear(&g_env, dir, &removed));
    ASSERT_EQ(removed, 0);

    for (uint64_t n = 1; n <= 5; n++)
        put_one(dir, n, 2000);
    char path[700];
    entry_path(dir, key_n(2), 0, path, sizeof path);
    do_flip_payload(path); /* only a verify sees this */
    entry_path(dir, key_n(4), 0, path, sizeof path);
    do_wrong_magic(path); /* a list sees this */
    /* Unrelated files are not touched; a dead writer's temp file is stale. */
    char other[700], tmp[700], hex[33];
    snprintf(other, sizeof other, "%s/tune.db", dir);
    FILE *f = fopen(other, "w");
    fclose(f);
    lj_key_hex(key_n(6), hex);
    snprintf(tmp, sizeof tmp, "%s/%s.tmp.999999999.0badf00d", dir, hex);
    f = fopen(tmp, "w");
    fclose(f);

    memset(&s, 0, sizeof s);
    ASSERT_OK(lj_cache_scan(&g_env, dir, 0, collect, &s));
    ASSERT_EQ(s.n, 5);
    ASSERT_EQ(s.ok, 4);
    ASSERT_CONTAINS(s.reasons, "magic");
    memset(&s, 0, sizeof s);
    ASSERT_OK(lj_cache_scan(&g_env, dir, 1, collect, &s));
    ASSERT_EQ(s.n, 5);
    ASSERT_EQ(s.ok, 3);
    ASSERT_CONTAINS(s.reasons, "checksum");
    ASSERT_CONTAINS(s.reasons, "magic");
    /* Scanning changes nothing. */
    ASSERT_TRUE(exists(path));

    ASSERT_OK(lj_cache_clear(&g_env, dir, &removed));
    ASSERT_EQ(removed, 6); /* 5 entries and the stale temp file */
    ASSERT_TRUE(!exists(tmp));
    ASSERT_TRUE(exists(other));
    memset(&s, 0, sizeof s);
    ASSERT_OK(lj_cache_scan(&g_env, dir, 1, collect, &s));
    ASSERT_EQ(s.n, 0);
}

/* ---- Allocation failures ----------------------------------------------------------------- */

/* Failing each allocation of a put and a disk get in turn: a status, never a crash or leak. */
LJ_TEST(fault_alloc)
{
    env_init();
    const char *dir = cache_dir("cache");
    put_one(dir, 1, 512);
    for (uint64_t n = 1; n < 100; n++) {
        lj_env env;
        lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_DEBUG);
        env.fault_at[LJ_FAULT_ALLOC] = n;
        lj_cache *c = NULL;
        lajit_status s = lj_cache_open(&env, dir, &c);
        if (s == LAJIT_OK) {
            lj_cache_entry e;
            int found = 0;
            s = lj_cache_get(c, key_n(1), 0, &e, &found);
            if (s == LAJIT_OK) {
                lj_compiled img = fake(2, 300);
                s = lj_cache_put(c, key_n(2), 0, &img);
                fake_free(&img);
            }
            lj_cache_close(c);
        }
        if (s == LAJIT_OK)
            return;
        ASSERT_STATUS(s, LAJIT_ERR_OUT_OF_MEMORY);
    }
    lj_test_fail(__FILE__, __LINE__, "no success within 100 injected faults");
}
