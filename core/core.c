/* core.c — allocator, errors, log and text buffer shared by every stage (see core.h). */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Header kept in front of each lj_malloc block: its size, padded to 16 bytes so the payload
 * keeps malloc's alignment. */
typedef union lj_block {
    size_t size;
    max_align_t align;
} lj_block;

static void *system_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    (void)user;
    (void)old_size;
    if (new_size == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, new_size);
}

void lj_env_init(lj_env *env, lajit_alloc_fn alloc, void *alloc_user, lajit_log_fn log,
                 void *log_user, lajit_log_level level)
{
    memset(env, 0, sizeof *env);
    env->alloc = alloc ? alloc : system_alloc;
    env->alloc_user = alloc ? alloc_user : NULL;
    env->log = log;
    env->log_user = log_user;
    env->log_level = level;
}

int lj_fault_hit(lj_env *env, lj_fault_kind kind)
{
    uint64_t n = ++env->fault_count[kind];
    return env->fault_at[kind] != 0 && n == env->fault_at[kind];
}

void *lj_raw_alloc(lj_env *env, void *ptr, size_t old_size, size_t new_size)
{
    if (new_size == 0) {
        if (ptr)
            env->alloc(env->alloc_user, ptr, old_size, 0);
        return NULL;
    }
    if (lj_fault_hit(env, LJ_FAULT_ALLOC))
        return NULL;
    return env->alloc(env->alloc_user, ptr, old_size, new_size);
}

void *lj_malloc(lj_env *env, size_t size)
{
    if (size > SIZE_MAX - sizeof(lj_block))
        return NULL;
    lj_block *b = lj_raw_alloc(env, NULL, 0, sizeof(lj_block) + size);
    if (!b)
        return NULL;
    b->size = size;
    return b + 1;
}

void *lj_calloc(lj_env *env, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    void *p = lj_malloc(env, n * size);
    if (p)
        memset(p, 0, n * size);
    return p;
}

void *lj_realloc(lj_env *env, void *ptr, size_t size)
{
    if (!ptr)
        return lj_malloc(env, size);
    if (size > SIZE_MAX - sizeof(lj_block))
        return NULL;
    lj_block *old = (lj_block *)ptr - 1;
    lj_block *b = lj_raw_alloc(env, old, sizeof(lj_block) + old->size, sizeof(lj_block) + size);
    if (!b)
        return NULL;
    b->size = size;
    return b + 1;
}

void lj_free(lj_env *env, void *ptr)
{
    if (!ptr)
        return;
    lj_block *b = (lj_block *)ptr - 1;
    lj_raw_alloc(env, b, sizeof(lj_block) + b->size, 0);
}

char *lj_strndup(lj_env *env, const char *s, size_t n)
{
    char *p = lj_malloc(env, n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

char *lj_strdup(lj_env *env, const char *s)
{
    return lj_strndup(env, s, strlen(s));
}

lajit_status lj_error(lj_env *env, lajit_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(env->errmsg, sizeof env->errmsg, fmt, ap);
    va_end(ap);
    env->driver_result = 0; /* a new failure; lj_driver_error sets it again for its own */
    lj_log(env, LAJIT_LOG_ERROR, "%s", env->errmsg);
    return status;
}

lajit_status lj_oom(lj_env *env)
{
    return lj_error(env, LAJIT_ERR_OUT_OF_MEMORY, "out of host memory");
}

void lj_error_prefix(lj_env *env, const char *fmt, ...)
{
    char prefix[512], old[sizeof env->errmsg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, env->errmsg, sizeof old);
    /* Truncation of an over-long message is acceptable: the start carries the meaning. */
    size_t n = strlen(prefix);
    if (n > sizeof env->errmsg - 3)
        n = sizeof env->errmsg - 3;
    memcpy(env->errmsg, prefix, n);
    memcpy(env->errmsg + n, ": ", 2);
    size_t rest = sizeof env->errmsg - n - 3;
    size_t m = strlen(old);
    if (m > rest)
        m = rest;
    memcpy(env->errmsg + n + 2, old, m);
    env->errmsg[n + 2 + m] = 0;
}

void lj_clear_error(lj_env *env)
{
    env->errmsg[0] = 0;
    env->driver_result = 0;
}

void lj_log(lj_env *env, lajit_log_level level, const char *fmt, ...)
{
    if (!env->log || level > env->log_level)
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    env->log(env->log_user, level, msg);
}

void lj_buf_init(lj_buf *b, lj_env *env)
{
    memset(b, 0, sizeof *b);
    b->env = env;
}

void lj_buf_free(lj_buf *b)
{
    lj_free(b->env, b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

void lj_buf_add(lj_buf *b, const char *data, size_t len)
{
    if (b->failed)
        return;
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + len + 1)
            cap *= 2;
        char *p = lj_realloc(b->env, b->data, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = 0;
}

void lj_buf_puts(lj_buf *b, const char *s)
{
    lj_buf_add(b, s, strlen(s));
}

void lj_buf_printf(lj_buf *b, const char *fmt, ...)
{
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
        return;
    }
    if ((size_t)n < sizeof small) {
        lj_buf_add(b, small, (size_t)n);
        return;
    }
    char *big = lj_malloc(b->env, (size_t)n + 1);
    if (!big) {
        b->failed = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    lj_buf_add(b, big, (size_t)n);
    lj_free(b->env, big);
}

char *lj_buf_take(lj_buf *b)
{
    if (b->failed) {
        lj_buf_free(b);
        b->failed = 0;
        return NULL;
    }
    if (!b->data)
        lj_buf_add(b, "", 0);
    if (b->failed)
        return NULL;
    char *p = b->data;
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}
