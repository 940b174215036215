/* fs.h — the file-trust rules shared by everything lajit keeps on disk (the kernel cache, the
 * tuning database and its lock, bundles).
 *
 * A file lajit reads may run code on the GPU (a cubin) or choose which code runs (a tuning
 * winner), so a file or directory that another user could have written is never trusted: it
 * must be ours (owned by the effective user) and writable by nobody else. Links are refused
 * where lajit opens a name it chose itself (O_NOFOLLOW), so a link planted in a shared directory
 * cannot send a write elsewhere. */
#ifndef LAJIT_FS_H
#define LAJIT_FS_H

#include <sys/stat.h>

#include "core.h"

/* Why the file or directory st describes may not be trusted, or NULL when it may: it must be a
 * directory (want_dir) or a regular file, owned by the effective user and not writable by group
 * or others. */
const char *lj_fs_ownership_problem(const struct stat *st, int want_dir);

/* Creates path and its missing parents, each 0700. Returns 1 on success, 0 on failure (errno
 * says why; 0 with errno ENOMEM when env could not allocate). */
int lj_fs_mkdir_p(lj_env *env, const char *path);

/* Opens the directory dir and checks it with lj_fs_ownership_problem. Returns the descriptor
 * (O_CLOEXEC), or -1 with *problem set: a strerror text (errno kept) or the trust problem
 * (static text, errno EPERM).
 * *mode receives the directory's permission bits when it could be examined. */
int lj_fs_open_trusted_dir(const char *dir, const char **problem, unsigned *mode);

/* Opens name in the directory dir_fd without following a link (O_NOFOLLOW is added to flags)
 * and checks the result is a regular file we may trust. Returns the descriptor, or -1 with
 * *problem set ("a symbolic link", a trust problem or a strerror text); errno is ENOENT when
 * the file does not exist (and O_CREAT was not given). */
int lj_fs_open_trusted_at(int dir_fd, const char *name, int flags, unsigned mode,
                          const char **problem);

/* Checks name in dir_fd without opening it (nor following a link): 1 when it is absent, 0 when
 * it is present and trusted, -1 with *problem set when it is present and refused. */
int lj_fs_check_trusted_at(int dir_fd, const char *name, const char **problem);

#endif
