/* cache.h — compiled kernels by key: an in-memory map in front of a disk directory.
 *
 * Disk entries are files "<32 hex>.cubin" (or ".ptx") holding a header (magic, format version,
 * lajit version, key, payload size, XXH3-64 checksum, resource report) and the payload. Writes
 * go to a unique temporary file in the same directory, then rename(2), so readers see a whole
 * entry or none and concurrent writers of one key are harmless. A truncated, corrupt or
 * foreign-version entry is logged, removed and rebuilt, never loaded. The directory is created
 * 0700; a directory or entry not owned by the user or writable by others is refused (loading it
 * would run someone else's code on the GPU). */
#ifndef LAJIT_CACHE_H
#define LAJIT_CACHE_H

#include "key.h"

typedef struct lj_cache lj_cache;

/* A cache entry: the image and the resource report it was compiled with. */
typedef struct lj_cache_entry {
    const void *image; /* borrowed from the in-memory map: valid until lj_cache_close */
    size_t size;
    int regs, spill_stores, spill_loads, stack_bytes, smem_static;
    int from_disk; /* 1 when this lookup read it from disk (0: memory) */
} lj_cache_entry;

/* dir: NULL for memory only. The directory is created (0700, parents too) on first write, not
 * here, so a read-only or absent cache never stops generation. */
lajit_status lj_cache_open(lj_env *env, const char *dir, lj_cache **out);
void lj_cache_close(lj_cache *c);
const char *lj_cache_dir(const lj_cache *c); /* NULL: memory only */

/* The default directory: $LAJIT_CACHE_DIR, else $XDG_CACHE_HOME/lajit, else $HOME/.cache/lajit.
 * *dir freed with lj_free. */
lajit_status lj_cache_default_dir(lj_env *env, char **dir);

/* Looks key up in memory, then on disk (a good disk entry is copied into memory). *found = 0
 * when neither has it (a bad disk entry counts as absent, with a WARN log line). */
lajit_status lj_cache_get(lj_cache *c, lj_key key, int ptx, lj_cache_entry *out, int *found);
/* Stores a compiled image in memory and (when a dir is set) on disk. A disk failure is logged
 * as a warning and not returned: the kernel still works from memory. */
lajit_status lj_cache_put(lj_cache *c, lj_key key, int ptx, const lj_compiled *compiled);

/* Maintenance for `lajit cache`: visit every entry file of dir (path, size, ok flag and reason
 * when bad); verify checks each checksum; clear removes every entry (and stale temp files). */
typedef void (*lj_cache_visit_fn)(void *user, const char *path, size_t size, int ok,
                                  const char *reason);
lajit_status lj_cache_scan(lj_env *env, const char *dir, int verify, lj_cache_visit_fn fn,
                           void *user);
lajit_status lj_cache_clear(lj_env *env, const char *dir, int *removed);

#endif
