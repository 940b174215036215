/* fs.c — file-trust helpers shared by the kernel cache, the tuning database and bundles (see
 * fs.h). */
#include "fs.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* ---- Fault-injectable system calls -------------------------------------------------------- */

/* 1 (errno set to err) when this file-system call is the one to fail. */
static int injected(lj_env *env, int err)
{
    if (!env || !lj_fault_hit(env, LJ_FAULT_FS))
        return 0;
    errno = err;
    return 1;
}

int lj_fs_open(lj_env *env, const char *path, int flags, unsigned mode)
{
    return injected(env, EACCES) ? -1 : open(path, flags, (mode_t)mode);
}

int lj_fs_openat(lj_env *env, int dir_fd, const char *name, int flags, unsigned mode)
{
    return injected(env, EACCES) ? -1 : openat(dir_fd, name, flags, (mode_t)mode);
}

ssize_t lj_fs_read(lj_env *env, int fd, void *buf, size_t n)
{
    return injected(env, EIO) ? -1 : read(fd, buf, n);
}

ssize_t lj_fs_write(lj_env *env, int fd, const void *buf, size_t n)
{
    return injected(env, ENOSPC) ? -1 : write(fd, buf, n);
}

int lj_fs_fsync(lj_env *env, int fd)
{
    return injected(env, EIO) ? -1 : fsync(fd);
}

int lj_fs_renameat(lj_env *env, int old_dir, const char *old_name, int new_dir,
                   const char *new_name)
{
    return injected(env, EIO) ? -1 : renameat(old_dir, old_name, new_dir, new_name);
}

int lj_fs_mkdir(lj_env *env, const char *path, unsigned mode)
{
    return injected(env, EACCES) ? -1 : mkdir(path, (mode_t)mode);
}

int lj_fs_flock(lj_env *env, int fd, int op)
{
    return injected(env, ENOLCK) ? -1 : flock(fd, op);
}

FILE *lj_fs_fopen(lj_env *env, const char *path, const char *mode)
{
    return injected(env, EACCES) ? NULL : fopen(path, mode);
}

int lj_fs_fflush(lj_env *env, FILE *f)
{
    return injected(env, ENOSPC) ? EOF : fflush(f);
}

int lj_fs_ferror(lj_env *env, FILE *f)
{
    return injected(env, EIO) ? 1 : ferror(f);
}

int lj_fs_read_all(lj_env *env, int fd, void *buf, size_t n)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = lj_fs_read(env, fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0)
            errno = 0;
        if (r <= 0)
            return 0;
        p += r;
        n -= (size_t)r;
    }
    return 1;
}

int lj_fs_write_all(lj_env *env, int fd, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = lj_fs_write(env, fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0)
            errno = ENOSPC;
        if (r <= 0)
            return 0;
        p += r;
        n -= (size_t)r;
    }
    return 1;
}

int lj_fs_create_tmp(lj_env *env, int dir_fd, const char *prefix, char sep, int flags, char **name)
{
    *name = NULL;
    for (int attempt = 0; attempt < 8; attempt++) {
        uint32_t rnd = 0;
        if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            rnd = (uint32_t)ts.tv_nsec ^ (uint32_t)attempt * 2654435761u;
        }
        lj_buf b;
        lj_buf_init(&b, env);
        lj_buf_printf(&b, "%s%ld%c%08x", prefix, (long)getpid(), sep, rnd);
        lj_free(env, *name);
        if (!(*name = lj_buf_take(&b))) {
            errno = ENOMEM;
            return -1;
        }
        int fd = lj_fs_openat(env, dir_fd, *name, flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                              0600);
        if (fd >= 0)
            return fd;
        if (errno != EEXIST)
            break;
    }
    int err = errno;
    lj_free(env, *name);
    *name = NULL;
    errno = err;
    return -1;
}

/* ---- Trust ---------------------------------------------------------------------------------- */

const char *lj_fs_ownership_problem(const struct stat *st, int want_dir)
{
    if (want_dir ? !S_ISDIR(st->st_mode) : !S_ISREG(st->st_mode))
        return want_dir ? "not a directory" : "not a regular file";
    if (st->st_uid != geteuid())
        return "owned by another user";
    if (st->st_mode & (S_IWGRP | S_IWOTH))
        return "writable by group or others";
    return NULL;
}

int lj_fs_mkdir_p(lj_env *env, const char *path)
{
    char *p = lj_strdup(env, path);
    if (!p) {
        errno = ENOMEM;
        return 0;
    }
    int ok = 1;
    for (char *s = p + 1; ok; s++) {
        if (*s != '/' && *s != 0)
            continue;
        char saved = *s;
        *s = 0;
        if (lj_fs_mkdir(env, p, 0700) != 0 && errno != EEXIST)
            ok = 0;
        *s = saved;
        if (saved == 0)
            break;
    }
    int err = errno;
    lj_free(env, p);
    errno = err;
    return ok;
}

int lj_fs_open_trusted_dir(lj_env *env, const char *dir, const char **problem, unsigned *mode)
{
    *problem = NULL;
    int fd = lj_fs_open(env, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0) {
        *problem = strerror(errno);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        *problem = strerror(errno);
        close(fd);
        return -1;
    }
    if (mode)
        *mode = (unsigned)(st.st_mode & 0777);
    if ((*problem = lj_fs_ownership_problem(&st, 1)) != NULL) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    return fd;
}

int lj_fs_open_trusted_at(lj_env *env, int dir_fd, const char *name, int flags, unsigned mode,
                          const char **problem)
{
    *problem = NULL;
    /* O_NONBLOCK: a FIFO planted under the name must not block the open. */
    int fd = lj_fs_openat(env, dir_fd, name, flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, mode);
    if (fd < 0) {
        int err = errno;
        *problem = err == ELOOP ? "a symbolic link" : strerror(err);
        errno = err;
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        *problem = strerror(errno);
        close(fd);
        return -1;
    }
    if ((*problem = lj_fs_ownership_problem(&st, 0)) != NULL) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    /* Back to blocking I/O for the regular file it turned out to be. */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

int lj_fs_check_trusted_at(int dir_fd, const char *name, const char **problem)
{
    *problem = NULL;
    struct stat st;
    if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT)
            return 1;
        *problem = strerror(errno);
        return -1;
    }
    if (S_ISLNK(st.st_mode)) {
        *problem = "a symbolic link";
        return -1;
    }
    if ((*problem = lj_fs_ownership_problem(&st, 0)) != NULL)
        return -1;
    return 0;
}
