/* failmalloc.c — an LD_PRELOAD shim for tests: makes one heap allocation of a process fail, so
 * a program that cannot be changed (the `lajit` command) can be swept through its allocation
 * failures the way the library's own fault injection (core.h, LJ_FAULT_ALLOC) sweeps an env.
 *
 * Environment:
 *   LJ_FAILMALLOC_AT=N      the N-th counted call of malloc, calloc or realloc (with a nonzero
 *                           size) returns NULL with errno ENOMEM; 0 or unset: none fails.
 *   LJ_FAILMALLOC_SKIP=S    calls made from a shared object whose path contains S (e.g. "nvrtc":
 *                           NVIDIA's compiler, whose out-of-memory handling is not ours to test),
 *                           directly or through the C library (any frame of the caller's stack,
 *                           found with backtrace), are neither counted nor failed.
 *   LJ_FAILMALLOC_REPORT=F  at exit, "<calls counted> <1 if the failure was injected, else 0>\n"
 *                           is written to file F (a run with AT unset learns the count).
 * Counting starts at the first call after the shim's constructor ran, so the count covers the
 * whole program and is the same from one run to the next (threads aside: sweep single-threaded
 * commands). Every other allocation function, and free, are the C library's.
 *
 * It lives in a folder of its own so that it is never linked into the test support library
 * (a static library member defining malloc would replace it in every test program). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr, RTLD_NEXT */
#endif
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);

static unsigned long long fail_at;
static unsigned long long calls;
static int fired;
static int armed; /* the constructor has read the environment */
static char skip[64];
static char report[1024];

/* dlsym may allocate (calloc) before the real functions are known: serve that from here. The
 * few bytes are never given back (free of them is never reached: dlsym keeps them). */
static unsigned char bootstrap[4096];
static size_t bootstrap_used;

static void *bootstrap_alloc(size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n > sizeof bootstrap - bootstrap_used)
        return NULL;
    void *p = bootstrap + bootstrap_used;
    bootstrap_used += n;
    return p;
}

static int resolving;

/* The next definition of name into *fn (a function pointer: ISO C has no cast from void *). */
static void next_symbol(const char *name, void *fn, size_t size)
{
    void *p = dlsym(RTLD_NEXT, name);
    memcpy(fn, &p, size);
}

static void resolve(void)
{
    if (real_malloc || resolving)
        return;
    resolving = 1;
    next_symbol("calloc", &real_calloc, sizeof real_calloc);
    next_symbol("realloc", &real_realloc, sizeof real_realloc);
    next_symbol("free", &real_free, sizeof real_free);
    next_symbol("malloc", &real_malloc, sizeof real_malloc);
    resolving = 0;
}

/* The main program's load address: its own calls (lajit, with SQLite and Lua linked in) need
 * no stack walk. */
static void *main_base;

/* Whether a return address lies in a shared object whose path contains skip. */
static int in_skipped(void *addr)
{
    Dl_info info;
    return dladdr(addr, &info) && info.dli_fname && strstr(info.dli_fname, skip) != NULL;
}

/* Set while this thread looks at its own stack (backtrace may allocate: that call is served
 * without counting). */
static __thread int walking;

/* 1 when the call is made, directly or not, from a skipped object: its own allocations and
 * those of the C library functions it calls (a malloc inside libc called from NVRTC). */
static int skipped(void *caller)
{
    Dl_info info;
    if (!dladdr(caller, &info))
        return 0;
    if (info.dli_fbase == main_base)
        return 0;
    if (info.dli_fname && strstr(info.dli_fname, skip))
        return 1;
    void *frames[64];
    walking = 1;
    int n = backtrace(frames, 64);
    walking = 0;
    for (int i = 1; i < n; i++)
        if (in_skipped(frames[i]))
            return 1;
    return 0;
}

/* 1 when this call (from caller) must fail. */
static int hit(void *caller)
{
    if (!armed || walking)
        return 0;
    if (skip[0] && skipped(caller))
        return 0;
    unsigned long long n = __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    if (fail_at && n == fail_at) {
        fired = 1;
        return 1;
    }
    return 0;
}

void *malloc(size_t n)
{
    resolve();
    if (!real_malloc)
        return bootstrap_alloc(n);
    if (hit(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return real_malloc(n);
}

void *calloc(size_t n, size_t size)
{
    resolve();
    if (!real_calloc) {
        if (size && n > SIZE_MAX / size)
            return NULL;
        return bootstrap_alloc(n * size); /* static storage: already zero */
    }
    if (hit(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return real_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
    resolve();
    if (!real_realloc)
        return NULL;
    if (n && hit(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return real_realloc(p, n);
}

void free(void *p)
{
    if ((unsigned char *)p >= bootstrap && (unsigned char *)p < bootstrap + sizeof bootstrap)
        return;
    resolve();
    if (!real_free)
        return; /* freed while the real functions are being looked up: kept, harmlessly */
    real_free(p);
}

__attribute__((constructor)) static void failmalloc_init(void)
{
    resolve();
    const char *at = getenv("LJ_FAILMALLOC_AT");
    const char *s = getenv("LJ_FAILMALLOC_SKIP");
    const char *r = getenv("LJ_FAILMALLOC_REPORT");
    fail_at = at ? strtoull(at, NULL, 10) : 0;
    if (s)
        snprintf(skip, sizeof skip, "%s", s);
    if (r)
        snprintf(report, sizeof report, "%s", r);
    if (skip[0]) {
        /* The first backtrace loads the unwinder (it allocates): do it before counting. */
        void *frames[4];
        backtrace(frames, 4);
        Dl_info info;
        if (dladdr((void *)getauxval(AT_PHDR), &info))
            main_base = info.dli_fbase;
    }
    armed = 1;
}

__attribute__((destructor)) static void failmalloc_report(void)
{
    armed = 0;
    if (!report[0])
        return;
    char line[64];
    int len = snprintf(line, sizeof line, "%llu %d\n", calls, fired);
    int fd = open(report, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return;
    if (write(fd, line, (size_t)len) != len) {
        /* Nothing to do: the sweep reads a short report as a broken run. */
    }
    close(fd);
}
