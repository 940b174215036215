/* common.c — helpers the fuzz harnesses share (fuzz.h): the budgeted, counting allocator and a
 * private scratch directory for harnesses whose library entry point takes a path. */
#include "fuzz.h"

#include <dirent.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void lj_fuzz_fail(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "fuzz: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    abort();
}

static void *heap_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    lj_fuzz_heap *h = user;
    if (new_size == 0) {
        free(ptr);
        h->held -= ptr ? old_size : 0;
        return NULL;
    }
    size_t old = ptr ? old_size : 0;
    if (new_size > old && new_size - old > h->limit - h->held)
        return NULL;
    void *p = realloc(ptr, new_size);
    if (p)
        h->held = h->held - old + new_size;
    return p;
}

void lj_fuzz_env(lj_env *env, lj_fuzz_heap *heap, size_t limit)
{
    heap->held = 0;
    heap->limit = limit;
    lj_env_init(env, heap_alloc, heap, NULL, NULL, LAJIT_LOG_ERROR);
}

static char dir[512];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    /* Depth 0 is the directory itself: lj_fuzz_clean keeps it, remove_dir removes it after. */
    return ftw->level == 0 ? 0 : remove(path);
}

void lj_fuzz_clean(void)
{
    if (dir[0])
        nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void remove_dir(void)
{
    lj_fuzz_clean();
    rmdir(dir);
}

const char *lj_fuzz_dir(void)
{
    if (!dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/lajit-fuzz-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(dir))
            lj_fuzz_fail("cannot create a directory like %s", dir);
        atexit(remove_dir);
    }
    return dir;
}

void lj_fuzz_write(const char *name, const void *data, size_t size, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", lj_fuzz_dir(), name);
    FILE *f = fopen(out, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0)
        lj_fuzz_fail("cannot write %s", out);
}
