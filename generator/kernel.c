/* kernel.c — the generator data path for one kernel: expand → key → cache → NVRTC (kernel.h). */
#include "kernel.h"

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "embedded.h"

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A growing list of owned path strings. */
typedef struct name_list {
    char **items;
    int n, cap;
} name_list;

static lajit_status name_list_add(lj_env *env, name_list *l, const char *prefix, const char *name)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        char **grown = lj_realloc(env, l->items, sizeof *grown * (size_t)cap);
        if (!grown)
            return lj_oom(env);
        l->items = grown;
        l->cap = cap;
    }
    lj_buf b;
    lj_buf_init(&b, env);
    lj_buf_printf(&b, "%s%s", prefix, name);
    if (!(l->items[l->n] = lj_buf_take(&b)))
        return lj_oom(env);
    l->n++;
    return LAJIT_OK;
}

/* NVRTC sees the headers of common/ (.h, .cuh), not the Lua helpers that specs import. */
static int is_header(const char *name)
{
    size_t n = strlen(name);
    return (n > 2 && strcmp(name + n - 2, ".h") == 0) ||
           (n > 4 && strcmp(name + n - 4, ".cuh") == 0);
}

/* Paths of the headers under common/: embedded, or listed from the template dir. */
static lajit_status list_common(lj_lua *L, char ***names, int *count)
{
    lj_env *env = lj_lua_env(L);
    const char *dir = lj_lua_template_dir(L);
    name_list l = {NULL, 0, 0};
    lajit_status st = LAJIT_OK;
    if (!dir) {
        for (size_t i = 0; i < lj_embedded_count && st == LAJIT_OK; i++)
            if (strncmp(lj_embedded_files[i].path, "common/", 7) == 0 &&
                is_header(lj_embedded_files[i].path))
                st = name_list_add(env, &l, "", lj_embedded_files[i].path);
    } else {
        lj_buf path;
        lj_buf_init(&path, env);
        lj_buf_printf(&path, "%s/common", dir);
        char *p = lj_buf_take(&path);
        DIR *d = p ? opendir(p) : NULL;
        if (!p)
            st = lj_oom(env);
        else if (!d)
            st = lj_error(env, LAJIT_ERR_IO, "cannot open template folder %s", p);
        struct dirent *e;
        while (st == LAJIT_OK && d && (e = readdir(d)) != NULL)
            if (e->d_name[0] != '.' && is_header(e->d_name))
                st = name_list_add(env, &l, "common/", e->d_name);
        if (d)
            closedir(d);
        lj_free(env, p);
    }
    if (st != LAJIT_OK) {
        for (int i = 0; i < l.n; i++)
            lj_free(env, l.items[i]);
        lj_free(env, l.items);
        return st;
    }
    if (l.n > 1)
        qsort(l.items, (size_t)l.n, sizeof *l.items, compare_names);
    *names = l.items;
    *count = l.n;
    return LAJIT_OK;
}

lajit_status lj_kernel_headers(lj_lua *L, lj_header **headers, int *count)
{
    lj_env *env = lj_lua_env(L);
    char **names = NULL;
    int n = 0;
    lajit_status st = list_common(L, &names, &n);
    if (st != LAJIT_OK)
        return st;
    lj_header *h = lj_calloc(env, (size_t)(n ? n : 1), sizeof *h);
    if (!h)
        st = lj_oom(env);
    /* The name NVRTC sees is the path under templates/, which is how kernels include it
     * ("common/types.cuh"). The header list takes over the name strings; texts stay owned by
     * the Lua host. */
    for (int i = 0; st == LAJIT_OK && i < n; i++) {
        st = lj_lua_read_template(L, names[i], &h[i].text, &h[i].len);
        h[i].name = names[i];
        names[i] = NULL;
    }
    for (int i = 0; i < n; i++)
        lj_free(env, names[i]);
    lj_free(env, names);
    if (st != LAJIT_OK) {
        lj_kernel_headers_free(L, h, n);
        return st;
    }
    *headers = h;
    *count = n;
    return LAJIT_OK;
}

void lj_kernel_headers_free(lj_lua *L, lj_header *h, int n)
{
    lj_env *env = lj_lua_env(L);
    if (!h)
        return;
    for (int i = 0; i < n; i++)
        lj_free(env, (void *)h[i].name);
    lj_free(env, h);
}

lajit_status lj_kernel_prepare(lj_lua *L, lj_family *f, const lj_config *cfg, const lj_problem *p,
                               const lj_device_info *device, int ptx, lj_kernel_job *job)
{
    return lj_kernel_prepare_ex(L, f, cfg, p, device, ptx, 1, job);
}

lajit_status lj_kernel_prepare_ex(lj_lua *L, lj_family *f, const lj_config *cfg,
                                  const lj_problem *p, const lj_device_info *device, int ptx,
                                  int require_nvrtc, lj_kernel_job *job)
{
    lj_env *env = lj_lua_env(L);
    memset(job, 0, sizeof *job);
    lajit_status st = lj_nvrtc_version(env, &job->nvrtc_major, &job->nvrtc_minor);
    if (st != LAJIT_OK) {
        if (require_nvrtc)
            return st;
        lj_clear_error(env);
        job->nvrtc_major = job->nvrtc_minor = -1;
    }
    st = lj_family_source(f, cfg, p, device, &job->source);
    if (st != LAJIT_OK)
        return st;
    st = lj_kernel_headers(L, &job->headers, &job->n_headers);
    if (st != LAJIT_OK) {
        lj_free(env, job->source);
        job->source = NULL;
        return st;
    }
    snprintf(job->arch, sizeof job->arch, "%s", device->arch);
    snprintf(job->name, sizeof job->name, "%s.cu", lj_family_name(f));
    job->ptx = ptx;
    job->n_options = lj_nvrtc_options(job->arch, ptx, job->options, 16);
    lj_key_input in = {
        .source = job->source,
        .headers = job->headers,
        .n_headers = job->n_headers,
        .arch = job->arch,
        .nvrtc_major = job->nvrtc_major,
        .nvrtc_minor = job->nvrtc_minor,
        .options = job->options,
        .n_options = job->n_options,
        .ptx = ptx,
        .lajit_version = LAJIT_VERSION_STRING,
    };
    if (job->nvrtc_major >= 0)
        job->key = lj_key_compute(&in);
    in.nvrtc_major = in.nvrtc_minor = 0;
    job->source_key = lj_key_compute(&in);
    return LAJIT_OK;
}

lajit_status lj_kernel_compile(lj_env *env, const lj_kernel_job *job, lj_compiled *out)
{
    return lj_nvrtc_compile(env, job->name, job->source, job->headers, job->n_headers, job->arch,
                            job->ptx, out);
}

void lj_kernel_job_free(lj_lua *L, lj_kernel_job *job)
{
    lj_free(lj_lua_env(L), job->source);
    lj_kernel_headers_free(L, job->headers, job->n_headers);
    memset(job, 0, sizeof *job);
}

lajit_status lj_kernel_key(lj_lua *L, lj_family *f, const lj_config *cfg, const lj_problem *p,
                           const lj_device_info *device, int ptx, lj_key *out)
{
    lj_kernel_job job;
    lajit_status st = lj_kernel_prepare(L, f, cfg, p, device, ptx, &job);
    if (st == LAJIT_OK) {
        *out = job.key;
        lj_kernel_job_free(L, &job);
    }
    return st;
}

/* ---- Parallel compiles ------------------------------------------------------------------------ */

/* Every host allocation of a compile goes through the caller's env, yet the user's allocator is
 * only ever called on the thread that called into lajit, never concurrently: a worker posts
 * each allocation (and free) as a request, and the calling thread, which would otherwise just
 * wait for the workers, serves it through lj_raw_alloc (so fault injection counts it too) and
 * hands the result back. An embedder's allocator therefore needs no locking and may keep
 * per-thread state, as lajit.h promises. The requests are few per compile (the log, the image,
 * the header copies); NVRTC's own allocations are NVRTC's business. */

typedef struct alloc_request {
    void *ptr;
    size_t old_size, new_size;
    void *result;
    int done;
    struct alloc_request *next;
} alloc_request;

typedef struct compile_pool {
    lj_env *caller; /* the env whose allocator serves every allocation */
    lj_compile_task *tasks;
    int n, next;
    int running;          /* worker threads not yet finished */
    int inline_mode;      /* no thread could start: the calling thread compiles itself */
    alloc_request *queue; /* pending requests, served in any order */
    pthread_mutex_t lock;
    pthread_cond_t wake_caller; /* a request was posted or a worker finished */
    pthread_cond_t served;      /* some request was served */
} compile_pool;

static double wall_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A worker env's allocator (lajit_alloc_fn): asks the calling thread and waits for its answer. */
static void *proxy_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    compile_pool *pool = user;
    if (pool->inline_mode)
        return lj_raw_alloc(pool->caller, ptr, old_size, new_size);
    alloc_request rq = {ptr, old_size, new_size, NULL, 0, NULL};
    pthread_mutex_lock(&pool->lock);
    rq.next = pool->queue;
    pool->queue = &rq;
    pthread_cond_signal(&pool->wake_caller);
    while (!rq.done)
        pthread_cond_wait(&pool->served, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
    return rq.result;
}

/* Compiles tasks until none is left, allocating through the pool. */
static void compile_tasks(compile_pool *pool)
{
    lj_env env;
    lj_env_init(&env, proxy_alloc, pool, NULL, NULL, LAJIT_LOG_ERROR);
    for (;;) {
        pthread_mutex_lock(&pool->lock);
        int i = pool->next++;
        pthread_mutex_unlock(&pool->lock);
        if (i >= pool->n)
            return;
        lj_compile_task *t = &pool->tasks[i];
        if (!t->job)
            continue;
        double t0 = wall_s();
        t->status = lj_kernel_compile(&env, t->job, &t->compiled);
        t->seconds = wall_s() - t0;
        if (t->status != LAJIT_OK)
            snprintf(t->error, sizeof t->error, "%.1000s", env.errmsg);
        lj_clear_error(&env);
    }
}

static void *compile_worker(void *arg)
{
    compile_pool *pool = arg;
    compile_tasks(pool);
    pthread_mutex_lock(&pool->lock);
    pool->running--;
    pthread_cond_signal(&pool->wake_caller);
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

/* The calling thread's side: serve allocation requests until every worker has finished. */
static void serve_allocations(compile_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (pool->queue) {
            alloc_request *rq = pool->queue;
            pool->queue = rq->next;
            pthread_mutex_unlock(&pool->lock);
            void *result = lj_raw_alloc(pool->caller, rq->ptr, rq->old_size, rq->new_size);
            pthread_mutex_lock(&pool->lock);
            rq->result = result;
            rq->done = 1;
            pthread_cond_broadcast(&pool->served);
        }
        if (pool->running == 0)
            break;
        pthread_cond_wait(&pool->wake_caller, &pool->lock);
    }
    pthread_mutex_unlock(&pool->lock);
}

void lj_kernel_compile_parallel(lj_env *env, lj_compile_task *tasks, int n, int threads)
{
    compile_pool pool;
    memset(&pool, 0, sizeof pool);
    pool.caller = env;
    pool.tasks = tasks;
    pool.n = n;
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake_caller, NULL);
    pthread_cond_init(&pool.served, NULL);
    if (threads <= 0)
        threads = 4;
    if (threads > 16)
        threads = 16;
    pthread_t tid[16];
    int started = 0;
    for (int t = 0; t < threads; t++) {
        pthread_mutex_lock(&pool.lock);
        pool.running++;
        pthread_mutex_unlock(&pool.lock);
        if (pthread_create(&tid[started], NULL, compile_worker, &pool) == 0) {
            started++;
        } else {
            pthread_mutex_lock(&pool.lock);
            pool.running--;
            pthread_mutex_unlock(&pool.lock);
        }
    }
    if (started == 0) {
        pool.inline_mode = 1; /* no thread could start: compile here */
        compile_tasks(&pool);
    } else {
        serve_allocations(&pool);
    }
    for (int t = 0; t < started; t++)
        pthread_join(tid[t], NULL);
    pthread_cond_destroy(&pool.served);
    pthread_cond_destroy(&pool.wake_caller);
    pthread_mutex_destroy(&pool.lock);
}

void lj_compile_task_free(lj_env *env, lj_compile_task *task)
{
    lj_compiled_free(env, &task->compiled);
}
