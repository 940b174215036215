/* bundle.h — offline kernel sets: one SQLite file holding, for several archs, the kernels of
 * chosen configurations (the tuning database's winners or the families' defaults) as cubins,
 * plus PTX for forward compatibility, each with a checksum. `lajit gen` writes one; a context
 * opened with one (lajit_ctx_desc.bundle or LAJIT_BUNDLE) takes its kernels from it before the
 * compiler, so an application can ship tuned kernels and run where NVRTC is not installed.
 *
 * Entries are found by their source key: the kernel cache key (generator/key.h) computed with
 * the NVRTC version left out, since a bundle must be usable without NVRTC (and its cubins do not
 * depend on the NVRTC of the machine that reads them). For an arch the bundle lacks, PTX of the
 * same family, bucket and configuration for an older, non-arch-specific target (sm_80) can be
 * loaded instead; the driver compiles it.
 *
 * A bundle is untrusted input (it comes with an application or from another machine): the
 * reader refuses links, special files and files over 4 GiB, opens SQLite read-only and
 * immutable (no locks, no side files) with defensive settings and a bound on each query's
 * work, requires `kernels` to be a plain table with exactly the expected columns, type-checks
 * every value it reads, and serves a row only when its checksum matches: the checksum covers
 * the source key, arch, PTX flag, family, bucket, configuration, problem, entry and the image,
 * so a row copied under another key or arch is refused like a damaged one.
 *
 * A bundle is read-only once written. A handle is used by one thread at a time. Every SQLite
 * call goes through core/sql.h (fault injection: LJ_FAULT_SQLITE). */
#ifndef LAJIT_BUNDLE_H
#define LAJIT_BUNDLE_H

#include "key.h"

/* Format version (PRAGMA user_version). 2: the row checksum covers what selects the row (format
 * 1's covered only the image, and is refused with a message asking for `lajit gen`). */
#define LJ_BUNDLE_FORMAT 2

typedef struct lj_bundle lj_bundle;

/* One kernel of a bundle. */
typedef struct lj_bundle_item {
    const char *family, *arch, *bucket, *config, *problem, *entry;
    lj_key source_key;
    int ptx; /* 1: image is PTX text (NUL included); 0: a cubin */
    const void *image;
    size_t size;
} lj_bundle_item;

/* Writing: creates path anew (an existing file is replaced only when the new one is complete:
 * it is written to a fresh path.tmp-<pid>-<random> created O_EXCL | O_NOFOLLOW with mode 0600
 * beside it, checked to be still ours before the rename, and renamed). The bundle is 0600. */
lajit_status lj_bundle_create(lj_env *env, const char *path, lj_bundle **out);
lajit_status lj_bundle_add(lj_bundle *b, const lj_bundle_item *item);
/* Commits and renames into place; frees b whatever the outcome. */
lajit_status lj_bundle_finish(lj_bundle *b);
/* Gives up: the partial file is removed, an existing file at the path stays. Frees b. */
void lj_bundle_abort(lj_bundle *b);

/* Reading: LAJIT_ERR_DATABASE for a file that is missing, a link or not a regular file, too
 * large, not SQLite, damaged, of another format version or with another schema (the message
 * says which). */
lajit_status lj_bundle_open(lj_env *env, const char *path, lj_bundle **out);
/* The image for (source key, arch, ptx): *image stays valid until lj_bundle_close. An entry
 * whose values have the wrong types or whose checksum does not match is not returned (a WARN
 * log line says so); lj_bundle_find_ptx and lj_bundle_config skip such entries too. */
lajit_status lj_bundle_find(lj_bundle *b, lj_key source_key, const char *arch, int ptx,
                            const void **image, size_t *size, int *found);
/* PTX of (family, bucket, config) for the newest plain arch (no "a" suffix) not newer than cc:
 * the forward-compatible fallback. arch_out receives its arch. */
lajit_status lj_bundle_find_ptx(lj_bundle *b, const char *family, const char *bucket,
                                const char *config, int cc, const void **image, size_t *size,
                                char arch_out[16], int *found);
/* The configuration the bundle holds for (family, bucket, arch): the one its writer chose (a
 * tuning winner or the default), so a context takes the same kernel. */
lajit_status lj_bundle_config(lj_bundle *b, const char *family, const char *bucket,
                              const char *arch, char *config, size_t cap, int *found);
/* Counts of entries (for `lajit info`, tests). */
lajit_status lj_bundle_count(lj_bundle *b, int *cubins, int *ptxs);
const char *lj_bundle_path(const lj_bundle *b);
void lj_bundle_close(lj_bundle *b); /* accepts NULL */

#endif
