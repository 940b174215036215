/* fs.c — file-trust helpers shared by the kernel cache, the tuning database and bundles (see
 * fs.h). */
#include "fs.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

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
        if (mkdir(p, 0700) != 0 && errno != EEXIST)
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

int lj_fs_open_trusted_dir(const char *dir, const char **problem, unsigned *mode)
{
    *problem = NULL;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
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

int lj_fs_open_trusted_at(int dir_fd, const char *name, int flags, unsigned mode,
                          const char **problem)
{
    *problem = NULL;
    /* O_NONBLOCK: a FIFO planted under the name must not block the open. */
    int fd = openat(dir_fd, name, flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, (mode_t)mode);
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
