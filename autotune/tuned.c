/* tuned.c — shipped tuning tables (tuned.h): the slug of a device name, the folders a table is
 * looked for in, and loading one through the tuning database's own import, so that a table gets
 * exactly the checks of `lajit db import` and no second parser exists. */
#include "tuned.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Set by the build (CMakeLists.txt): the install prefix's table folder and the source tree's. */
#ifndef LAJIT_TUNED_INSTALL_DIR
#define LAJIT_TUNED_INSTALL_DIR ""
#endif
#ifndef LAJIT_TUNED_SOURCE_DIR
#define LAJIT_TUNED_SOURCE_DIR ""
#endif

void lj_tuned_slug(const char *name, char *out, size_t cap)
{
    size_t n = 0;
    int dash = 0; /* a separator is pending: written only before the next letter or digit */
    if (!cap)
        return;
    for (const char *p = name ? name : ""; *p; p++) {
        char c = *p;
        int alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z');
        if (!alnum) {
            dash = n > 0;
            continue;
        }
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (n + dash + 1 >= cap)
            break;
        if (dash)
            out[n++] = '-';
        out[n++] = c;
        dash = 0;
    }
    out[n] = 0;
}

/* An object of the library whose address dladdr maps back to the library's file (ISO C has no
 * conversion of a function's address to void *). */
static const char where_am_i = 0;

/* The folder holding the library (or the program it is linked into), found from the address of
 * one of its objects, into out; "" when unknown. */
static void library_dir(char *out, size_t cap)
{
    Dl_info info;
    out[0] = 0;
    if (!dladdr(&where_am_i, &info) || !info.dli_fname || !*info.dli_fname)
        return;
    snprintf(out, cap, "%s", info.dli_fname);
    char *slash = strrchr(out, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(out, cap, ".");
}

/* 1 when dir/<slug>.json exists (any kind of file: a folder or device under that name is found
 * and then refused, never skipped silently), with its path in path. */
static int table_in(const char *dir, const char *slug, char *path, size_t cap)
{
    struct stat sb;
    if (!*dir)
        return 0;
    int len = snprintf(path, cap, "%s/%s.json", dir, slug);
    return len > 0 && (size_t)len < cap && stat(path, &sb) == 0;
}

lajit_status lj_tuned_load(lj_env *env, const lj_fingerprint *fp, lj_tunedb **out, char *path,
                           size_t cap)
{
    *out = NULL;
    path[0] = 0;
    char slug[128];
    lj_tuned_slug(fp->name, slug, sizeof slug);
    if (!*slug)
        return LAJIT_OK;
    const char *env_dir = getenv("LAJIT_TUNED_DIR");
    int found = 0;
    if (env_dir) {
        if (!*env_dir || strcmp(env_dir, "off") == 0)
            return LAJIT_OK;
        found = table_in(env_dir, slug, path, cap);
    } else {
        char lib[1024], installed[1100];
        library_dir(lib, sizeof lib);
        if (*lib)
            snprintf(installed, sizeof installed, "%s/../share/lajit/tuned", lib);
        else
            installed[0] = 0;
        const char *dirs[] = {installed, LAJIT_TUNED_INSTALL_DIR, LAJIT_TUNED_SOURCE_DIR};
        for (size_t i = 0; i < sizeof dirs / sizeof dirs[0] && !found; i++)
            found = table_in(dirs[i], slug, path, cap);
    }
    if (!found) {
        path[0] = 0;
        return LAJIT_OK;
    }
    /* The import keeps every row in memory before writing: bound what a hostile file costs. */
    struct stat sb;
    if (stat(path, &sb) != 0)
        return lj_error(env, LAJIT_ERR_IO, "shipped tuning table %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "shipped tuning table %s: not a regular file", path);
    if (sb.st_size > LJ_TUNED_MAX_BYTES)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "shipped tuning table %s: %lld bytes, more than the %d a table may have",
                        path, (long long)sb.st_size, LJ_TUNED_MAX_BYTES);
    lj_tunedb *db;
    lajit_status st = lj_tunedb_open_memory(env, path, &db);
    if (st != LAJIT_OK)
        return st;
    /* Unforced, for this device: a row naming another GPU refuses the whole table. */
    int rows = 0;
    if ((st = lj_tunedb_import(db, path, fp, 0, &rows)) != LAJIT_OK) {
        lj_tunedb_close(db);
        return st;
    }
    lj_log(env, LAJIT_LOG_INFO, "shipped tuning table %s: %d rows for %s", path, rows, fp->name);
    *out = db;
    return LAJIT_OK;
}
