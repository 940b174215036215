/* family_text.c — the text a family is tuned under: every file of its template folders
 * (common/, its own, and those its spec `uses`) in a fixed order, from the embedded copy, a
 * template dir or, for an outside family, its own folder. A template dir is untrusted: its folders are listed with a cap on their
 * entries, and each file is read through the sandbox, which refuses links, non-regular files
 * and oversized files (sandbox.h). */
#include "family_impl.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embedded.h"

/* Entries one template folder may hold (the built-in folders hold at most a dozen). */
#define LJ_MAX_FOLDER_ENTRIES 256

static int compare_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Adds dir/sub's regular file names as "sub/name" to paths (grown as needed). A missing folder
 * adds nothing: a development template dir need not have every folder. */
static lajit_status list_folder(lj_env *env, const char *dir, const char *sub, char ***paths,
                                size_t *n, size_t *cap)
{
    char folder[4096];
    snprintf(folder, sizeof folder, "%s/%s", dir, sub);
    DIR *d = opendir(folder);
    if (!d)
        return LAJIT_OK;
    struct dirent *e;
    lajit_status st = LAJIT_OK;
    size_t listed = 0;
    while (st == LAJIT_OK && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (++listed > LJ_MAX_FOLDER_ENTRIES) {
            st = lj_error(env, LAJIT_ERR_IO,
                          "template folder %s holds more than %d entries: refused", folder,
                          LJ_MAX_FOLDER_ENTRIES);
            break;
        }
        if (*n == *cap) {
            size_t grown = *cap ? 2 * *cap : 16;
            char **p = lj_realloc(env, *paths, grown * sizeof *p);
            if (!p) {
                st = lj_oom(env);
                break;
            }
            *paths = p;
            *cap = grown;
        }
        size_t len = strlen(sub) + strlen(e->d_name) + 2;
        char *path = lj_malloc(env, len);
        if (!path) {
            st = lj_oom(env);
            break;
        }
        snprintf(path, len, "%s/%s", sub, e->d_name);
        (*paths)[(*n)++] = path;
    }
    closedir(d);
    return st;
}

lajit_status lj_family_template_text(lj_family *f, char **text, size_t *len)
{
    /* The files of common/, <family>/ and the folders of `uses`: the embedded ones, or with a
     * template dir the files those folders hold (a development family need not be embedded). */
    char folders[2 + LJ_MAX_USES][64];
    size_t nf = 0;
    snprintf(folders[nf++], sizeof folders[0], "common");
    snprintf(folders[nf++], sizeof folders[0], "%s", f->name);
    for (const char *u = f->uses; *u;) { /* at most LJ_MAX_USES names (check_spec) */
        size_t ul = strcspn(u, ",");
        snprintf(folders[nf++], sizeof folders[0], "%.*s", (int)(ul < 63 ? ul : 63), u);
        u += ul + (u[ul] == ',');
    }
    lj_buf b;
    lj_buf_init(&b, f->env);
    /* Each folder from where the sandbox reads it: an outside family's from its root, the rest
     * from the template dir when there is one, else the embedded copy. The names are copied
     * either way, so one list owns them all. */
    const char *dir = lj_lua_template_dir(f->h);
    char **owned = NULL;
    size_t m = 0, cap_owned = 0;
    lajit_status st = LAJIT_OK;
    for (size_t k = 0; k < nf && st == LAJIT_OK; k++) {
        const char *root = lj_lua_family_root(f->h, folders[k]);
        if (root || dir) {
            st = list_folder(f->env, root ? root : dir, folders[k], &owned, &m, &cap_owned);
            continue;
        }
        size_t fl = strlen(folders[k]);
        for (size_t i = 0; i < lj_embedded_count && st == LAJIT_OK; i++) {
            const char *p = lj_embedded_files[i].path;
            if (strncmp(p, folders[k], fl) != 0 || p[fl] != '/')
                continue;
            if (m == cap_owned) {
                size_t grown = cap_owned ? 2 * cap_owned : 16;
                char **g = lj_realloc(f->env, owned, grown * sizeof *g);
                if (!g) {
                    st = lj_oom(f->env);
                    break;
                }
                owned = g;
                cap_owned = grown;
            }
            if (!(owned[m] = lj_strdup(f->env, p)))
                st = lj_oom(f->env);
            else
                m++;
        }
    }
    const char **paths = (const char **)owned;
    if (st == LAJIT_OK && m > 1)
        qsort(paths, m, sizeof *paths, compare_str);
    for (size_t i = 0; i < m && st == LAJIT_OK; i++) {
        const char *t;
        size_t l;
        st = lj_lua_read_template(f->h, paths[i], &t, &l);
        if (st == LAJIT_OK) {
            lj_buf_printf(&b, "== %s %zu\n", paths[i], l);
            lj_buf_add(&b, t, l);
        }
    }
    for (size_t i = 0; i < m; i++)
        lj_free(f->env, owned[i]);
    lj_free(f->env, owned);
    if (st != LAJIT_OK) {
        lj_buf_free(&b);
        return st;
    }
    size_t total = b.len;
    char *out = lj_buf_take(&b);
    if (!out)
        return lj_oom(f->env);
    *text = out;
    *len = total;
    return LAJIT_OK;
}
