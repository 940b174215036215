/* family_path.c — families from outside the library: the folders an application names
 * (lajit_ctx_add_families, and $LAJIT_FAMILY_PATH at creation; ':'-separated) are listed when
 * named; each subfolder holding a regular file family.lua is a family of that name.
 * The sandbox then reads "<name>/..." from that folder (lj_lua_add_family_root), so the family's
 * spec and templates are found as the built-in ones are, and `common/` stays the library's.
 *
 * Names are checked here, before anything runs: a name must be a plain identifier (letters,
 * digits, '_', '-'), two folders of the path may not both define it, and it may not be a
 * built-in family's (or "common") unless the application set LAJIT_CTX_FAMILY_OVERRIDE, which
 * lets an outside family replace a built-in one (said in the log). A folder of the path that is
 * missing or not a folder is an error, not silently skipped: a typo would otherwise surface as
 * "no family named ..." far from its cause. Symbolic links are not followed below a path entry,
 * as for template dirs (the entry itself may be one). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "context.h"
#include "embedded.h"
#include "fs.h"

/* Entries one folder of the path may hold. */
#define MAX_ENTRIES 1024

static int plain_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= sizeof(((lajit_ctx *)0)->outside[0].name))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

static int builtin(const char *name)
{
    if (strcmp(name, "common") == 0)
        return 1;
    for (const char *const *f = lj_embedded_families; *f; f++)
        if (strcmp(*f, name) == 0)
            return 1;
    return 0;
}

/* Whether dir_fd/name is a folder (not a link) holding a regular family.lua (not a link). */
static int holds_family(int dir_fd, const char *name)
{
    struct stat st;
    if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode))
        return 0;
    int fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int ok = fstatat(fd, "family.lua", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
    close(fd);
    return ok;
}

static lajit_status add_folder(lajit_ctx *ctx, const char *dir, int override)
{
    lj_env *env = &ctx->env;
    int fd = lj_fs_open(env, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0)
        return lj_error(env, LAJIT_ERR_IO, "family path: %s: %s", dir,
                        errno == ENOTDIR ? "not a folder" : strerror(errno));
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        return lj_error(env, LAJIT_ERR_IO, "family path: %s: %s", dir, strerror(e));
    }
    lajit_status st = LAJIT_OK;
    struct dirent *e;
    int listed = 0;
    while (st == LAJIT_OK && (e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        if (name[0] == '.')
            continue;
        if (++listed > MAX_ENTRIES) {
            st = lj_error(env, LAJIT_ERR_IO, "family path: %s holds more than %d entries: refused",
                          dir, MAX_ENTRIES);
            break;
        }
        if (!holds_family(dirfd(d), name))
            continue;
        if (!plain_name(name)) {
            st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                          "family path: %s/%s: a family's name must be letters, digits, _ and - "
                          "(at most %zu)",
                          dir, name, sizeof ctx->outside[0].name - 1);
            break;
        }
        for (int i = 0; i < ctx->n_outside && st == LAJIT_OK; i++)
            if (strcmp(ctx->outside[i].name, name) == 0)
                st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                              "family path: %s is defined twice, in %s and in %s", name,
                              ctx->outside[i].dir, dir);
        if (st != LAJIT_OK)
            break;
        if (builtin(name)) {
            if (!override || strcmp(name, "common") == 0) {
                st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                              "family path: %s/%s has the name of a built-in %s (rename it%s)", dir,
                              name, strcmp(name, "common") == 0 ? "folder" : "family",
                              strcmp(name, "common") == 0
                                  ? ""
                                  : ", or set LAJIT_CTX_FAMILY_OVERRIDE to replace the built-in");
                break;
            }
            lj_log(env, LAJIT_LOG_WARN, "family %s from %s replaces the built-in one", name, dir);
        }
        if (ctx->n_outside == LJ_LUA_MAX_ROOTS) {
            st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "family path: more than %d families",
                          LJ_LUA_MAX_ROOTS);
            break;
        }
        char *copy = lj_strdup(env, dir);
        if (!copy) {
            st = lj_oom(env);
            break;
        }
        memcpy(ctx->outside[ctx->n_outside].name, name, strlen(name) + 1); /* < 64: plain_name */
        ctx->outside[ctx->n_outside++].dir = copy;
    }
    closedir(d);
    return st;
}

/* Lists the folders of path into ctx->outside (the caller takes back what was added when this
 * fails). */
static lajit_status scan(lajit_ctx *ctx, const char *path, int override)
{
    lajit_status st = LAJIT_OK;
    for (const char *c = path; *c && st == LAJIT_OK;) {
        size_t n = strcspn(c, ":");
        if (n > 0) {
            char *dir = lj_malloc(&ctx->env, n + 1);
            if (!dir) {
                st = lj_oom(&ctx->env);
                break;
            }
            memcpy(dir, c, n);
            dir[n] = 0;
            st = add_folder(ctx, dir, override);
            lj_free(&ctx->env, dir);
        }
        c += n + (c[n] == ':');
    }
    return st;
}

LAJIT_API lajit_status lajit_ctx_add_families(lajit_ctx *ctx, const char *path)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lj_env *env = &ctx->env;
    if (!path || !*path)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "lajit_ctx_add_families: no path");
    int before = ctx->n_outside;
    lajit_status st = scan(ctx, path, (ctx->flags & LAJIT_CTX_FAMILY_OVERRIDE) != 0);
    /* A built-in the context has loaded already cannot be replaced any more: its plans and
     * spec are in use. */
    for (int i = before; i < ctx->n_outside && st == LAJIT_OK; i++)
        for (int j = 0; j < ctx->n_families; j++)
            if (strcmp(lj_family_name(ctx->families[j]), ctx->outside[i].name) == 0)
                st = lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                              "family path: %s/%s would replace the built-in %s, which this "
                              "context has used already: add the folder before using it",
                              ctx->outside[i].dir, ctx->outside[i].name, ctx->outside[i].name);
    /* A Lua state made already reads the new families from now on. On any failure above or
     * here, what this call added is taken back. */
    for (int i = before; i < ctx->n_outside && st == LAJIT_OK && ctx->lua; i++)
        st = lj_lua_add_family_root(ctx->lua, ctx->outside[i].name, ctx->outside[i].dir);
    if (st != LAJIT_OK) {
        while (ctx->n_outside > before)
            lj_free(env, ctx->outside[--ctx->n_outside].dir);
        return st;
    }
    lj_free(env, (void *)ctx->family_names); /* lajit_family_list is made again */
    ctx->family_names = NULL;
    lj_clear_error(env);
    return LAJIT_OK;
}
