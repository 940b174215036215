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

#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "core.h"

/* ---- Fault-injectable system calls ----------------------------------------------------------
 * Every open, read, write, fsync, rename, mkdir and flock that lajit makes on its files goes
 * through these, so a test can fail any one of them (env->fault_at[LJ_FAULT_FS], counting every
 * call of this group in order) and check that the failure becomes a clear status. Each checks
 * the fault first and then behaves exactly like the system call, failing with a realistic errno
 * when injected: EACCES for opens and mkdir, EIO for reads, fsync and rename, ENOSPC for writes,
 * ENOLCK for flock. env may be NULL (no injection). Removing files (unlink) is cleanup after a
 * failure and is not injected. */
int lj_fs_open(lj_env *env, const char *path, int flags, unsigned mode);
int lj_fs_openat(lj_env *env, int dir_fd, const char *name, int flags, unsigned mode);
ssize_t lj_fs_read(lj_env *env, int fd, void *buf, size_t n);
ssize_t lj_fs_write(lj_env *env, int fd, const void *buf, size_t n);
int lj_fs_fsync(lj_env *env, int fd);
int lj_fs_renameat(lj_env *env, int old_dir, const char *old_name, int new_dir,
                   const char *new_name);
int lj_fs_mkdir(lj_env *env, const char *path, unsigned mode);
int lj_fs_flock(lj_env *env, int fd, int op);
/* A stdio stream: fopen's fault is the open; fflush stands for the writes buffered before it
 * and ferror for the reads (stdio reports a read error there). */
FILE *lj_fs_fopen(lj_env *env, const char *path, const char *mode);
int lj_fs_fflush(lj_env *env, FILE *f);
int lj_fs_ferror(lj_env *env, FILE *f);

/* Reads exactly n bytes (retrying short reads and EINTR). 1 on success; 0 on an error (errno)
 * or an early end of file (errno 0). */
int lj_fs_read_all(lj_env *env, int fd, void *buf, size_t n);
/* Writes exactly n bytes (retrying short writes and EINTR). 1 on success, 0 with errno. */
int lj_fs_write_all(lj_env *env, int fd, const void *buf, size_t n);

/* Creates a fresh private file (O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600, flags added) named
 * "<prefix><pid><sep><8 random hex>" in dir_fd (AT_FDCWD for a path prefix), so a file or link
 * planted in a shared directory is never written through. Returns the descriptor and *name
 * (lj_malloc), or -1 with errno (ENOMEM when the name could not be allocated). */
int lj_fs_create_tmp(lj_env *env, int dir_fd, const char *prefix, char sep, int flags, char **name);

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
int lj_fs_open_trusted_dir(lj_env *env, const char *dir, const char **problem, unsigned *mode);

/* Opens name in the directory dir_fd without following a link (O_NOFOLLOW is added to flags)
 * and checks the result is a regular file we may trust. Returns the descriptor, or -1 with
 * *problem set ("a symbolic link", a trust problem or a strerror text); errno is ENOENT when
 * the file does not exist (and O_CREAT was not given). */
int lj_fs_open_trusted_at(lj_env *env, int dir_fd, const char *name, int flags, unsigned mode,
                          const char **problem);

/* Checks name in dir_fd without opening it (nor following a link): 1 when it is absent, 0 when
 * it is present and trusted, -1 with *problem set when it is present and refused. */
int lj_fs_check_trusted_at(int dir_fd, const char *name, const char **problem);

#endif
