/* test_main.c — the harness's main (see test.h). */
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ftw.h>

#include "test.h"

#define MAX_TESTS 256

static struct {
    const char *name;
    lj_test_fn fn;
} tests[MAX_TESTS];
static int n_tests;
static char tmpdir[512];

void lj_test_register(const char *name, lj_test_fn fn)
{
    if (n_tests == MAX_TESTS) {
        fprintf(stderr, "too many tests in one program\n");
        exit(2);
    }
    tests[n_tests].name = name;
    tests[n_tests].fn = fn;
    n_tests++;
}

const char *lj_test_tmpdir(void)
{
    return tmpdir;
}

const char *lj_test_source_dir(void)
{
    const char *s = getenv("LAJIT_TEST_SOURCE_DIR");
    return s ? s : ".";
}

void lj_test_skip(const char *why)
{
    printf("SKIP: %s\n", why);
    exit(77);
}

void lj_test_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(1);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        printf("usage: %s CASE\ncases:\n", argv[0]);
        for (int i = 0; i < n_tests; i++)
            printf("  %s\n", tests[i].name);
        return 2;
    }
    for (int i = 0; i < n_tests; i++) {
        if (strcmp(tests[i].name, argv[1]) != 0)
            continue;
        const char *base = getenv("TMPDIR");
        snprintf(tmpdir, sizeof tmpdir, "%s/lajit-test-XXXXXX", base ? base : "/tmp");
        if (!mkdtemp(tmpdir)) {
            perror("mkdtemp");
            return 2;
        }
        char cache[600];
        snprintf(cache, sizeof cache, "%s/cache", tmpdir);
        setenv("LAJIT_CACHE_DIR", cache, 1);
        tests[i].fn();
        nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        printf("PASS: %s\n", argv[1]);
        return 0;
    }
    fprintf(stderr, "no test case named %s\n", argv[1]);
    return 2;
}
