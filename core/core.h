/* core.h — what every stage of lajit's data path shares: the allocator, the error sink, the
 * log, a growable text buffer and fault injection.
 *
 * Each stage (generator/, device/, autotune/, runtime/) receives an lj_env from its caller
 * instead of a context, so the stages stay independent of one another and testable alone. A
 * context owns exactly one lj_env. Nothing here is global: two contexts never share an lj_env.
 * The stages are the build's layers (CMakeLists.txt): each includes only the ones beneath it. */
#ifndef LAJIT_CORE_H
#define LAJIT_CORE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "lajit.h"

/* Fault injection (tests): fail the N-th call of a kind, counting from 1; 0 disables. The
 * counters count every call of the kind made through this env, so a test can run a path once
 * with injection off to learn how many calls it makes, then fail each one in turn. */
typedef enum lj_fault_kind {
    LJ_FAULT_ALLOC = 0,  /* host allocations (lj_malloc and Lua's allocator) */
    LJ_FAULT_NVRTC = 1,  /* NVRTC API calls */
    LJ_FAULT_DRIVER = 2, /* CUDA driver API calls */
    LJ_FAULT_SQLITE = 3, /* SQLite API calls (tuning database, bundles) */
    LJ_FAULT_FS = 4,     /* file-system calls (open, read, write, rename, fsync, mkdir, flock) */
    LJ_FAULT_KINDS = 5
} lj_fault_kind;

typedef struct lj_env {
    lajit_alloc_fn alloc;
    void *alloc_user;
    lajit_log_fn log;
    void *log_user;
    lajit_log_level log_level;
    char errmsg[4096];                    /* detail of the last failure, "" when none */
    uint64_t fault_count[LJ_FAULT_KINDS]; /* calls seen so far */
    uint64_t fault_at[LJ_FAULT_KINDS];    /* fail the call with this count; 0: never */
    /* The CUresult behind errmsg when the last failure was a driver call's (set by
     * lj_driver_error after its lj_error), else 0; lajit_last_driver_error reads it. */
    int driver_result;
    char driver_result_name[64];
} lj_env;

/* Initialises env with the given allocator (NULL: system) and log (may be NULL). */
void lj_env_init(lj_env *env, lajit_alloc_fn alloc, void *alloc_user, lajit_log_fn log,
                 void *log_user, lajit_log_level level);

/* Returns 1 when the call of this kind just counted must fail (fault injection), else 0. */
int lj_fault_hit(lj_env *env, lj_fault_kind kind);

/* Allocation. Every block remembers its size, so lj_free needs none. lj_malloc(0) returns a
 * valid unique block. Failures return NULL without touching errmsg; callers report
 * LAJIT_ERR_OUT_OF_MEMORY (lj_oom). */
void *lj_malloc(lj_env *env, size_t size);
void *lj_calloc(lj_env *env, size_t n, size_t size);
void *lj_realloc(lj_env *env, void *ptr, size_t size);
void lj_free(lj_env *env, void *ptr);
char *lj_strdup(lj_env *env, const char *s);
char *lj_strndup(lj_env *env, const char *s, size_t n);

/* The raw allocator in lajit_alloc_fn form, counting faults (for Lua's lua_Alloc). */
void *lj_raw_alloc(lj_env *env, void *ptr, size_t old_size, size_t new_size);

/* Records a failure: formats the message into env->errmsg, logs it at ERROR level, and returns
 * status so callers can write `return lj_error(env, LAJIT_ERR_..., "...", ...);`. */
lajit_status lj_error(lj_env *env, lajit_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
lajit_status lj_oom(lj_env *env);
/* Prefixes the current message with context: "compiling la_fwd: <old message>". */
void lj_error_prefix(lj_env *env, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void lj_clear_error(lj_env *env);

void lj_log(lj_env *env, lajit_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A growable NUL-terminated text buffer. On allocation failure the buffer remembers it
 * (failed = 1) and later appends are ignored, so a sequence of appends needs one check. */
typedef struct lj_buf {
    lj_env *env;
    char *data;
    size_t len, cap;
    int failed;
} lj_buf;

void lj_buf_init(lj_buf *b, lj_env *env);
void lj_buf_free(lj_buf *b);
void lj_buf_add(lj_buf *b, const char *data, size_t len);
void lj_buf_puts(lj_buf *b, const char *s);
void lj_buf_printf(lj_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the text over (caller frees with lj_free) and resets b; NULL if the buffer failed. */
char *lj_buf_take(lj_buf *b);

/* n rounded up to a multiple of 16 (device buffers laid out in 16-byte aligned regions). */
static inline size_t lj_round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

#endif
