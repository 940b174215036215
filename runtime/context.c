/* context.c — context creation and destruction, the lazily created parts (Lua host, cache,
 * families, device), lajit_expand and the error message (context.h, lajit.h). */
#include "context.h"

#include <stddef.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "embedded.h"
#include "problem.h"

LAJIT_API void lajit_ctx_desc_init(lajit_ctx_desc *desc)
{
    if (!desc)
        return;
    memset(desc, 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    desc->log_level = LAJIT_LOG_WARN;
}

/* Why the last lajit_ctx_create of this thread failed (lajit_errmsg(NULL)): the context that
 * held the message is gone, and a bundle that cannot be opened deserves more than a status.
 * Thread-local like errno, so two threads creating contexts do not see each other's. */
static _Thread_local char create_errmsg[sizeof(((lj_env *)0)->errmsg)];

/* Keeps ctx's message for lajit_errmsg(NULL), then destroys ctx. */
static lajit_status create_failed(lajit_ctx *ctx, lajit_status st)
{
    memcpy(create_errmsg, ctx->env.errmsg, sizeof create_errmsg);
    lajit_ctx_destroy(ctx);
    return st;
}

int lj_segments_parse(const char *v, int dflt, int *bad)
{
    *bad = 0;
    if (!v || !*v)
        return dflt;
    char *end;
    long n = strtol(v, &end, 10);
    if (strcmp(v, "off") == 0)
        return 1;
    if (strcmp(v, "auto") == 0)
        return 0;
    if (*end == 0 && n >= 0 && n <= 64)
        return (int)n;
    *bad = 1;
    return dflt;
}

/* A segments variable read at creation; unset, or a bad value (logged): the automatic choice. */
static int segments_setting(lajit_ctx *ctx, const char *name)
{
    int bad;
    const char *v = getenv(name);
    const int n = lj_segments_parse(v, 0, &bad);
    if (bad)
        lj_log(&ctx->env, LAJIT_LOG_WARN, "%s=%s is not off, auto or 0..64: the automatic choice",
               name, v);
    return n;
}

LAJIT_API lajit_status lajit_ctx_create(const lajit_ctx_desc *desc, lajit_ctx **out)
{
    create_errmsg[0] = 0;
    lajit_ctx_desc defaults;
    if (!out)
        return LAJIT_ERR_INVALID_ARGUMENT;
    if (!desc) {
        lajit_ctx_desc_init(&defaults);
        desc = &defaults;
    }
    /* The size before `autotune` was added is accepted too (on LP64 it is the same number:
     * the field took what was padding, which lajit_ctx_desc_init zeroes). */
    size_t before_autotune = offsetof(lajit_ctx_desc, autotune);
    size_t before_bundle = offsetof(lajit_ctx_desc, bundle);
    if (desc->struct_size != sizeof(lajit_ctx_desc) && desc->struct_size != before_autotune &&
        desc->struct_size != before_bundle)
        return LAJIT_ERR_STRUCT_SIZE;
    const char *bundle = desc->struct_size > before_bundle ? desc->bundle : NULL;
    if (!bundle && getenv("LAJIT_BUNDLE") && *getenv("LAJIT_BUNDLE"))
        bundle = getenv("LAJIT_BUNDLE");
    uint32_t autotune = desc->struct_size > before_autotune ? desc->autotune : LAJIT_AUTOTUNE_ENV;
    if (desc->device < 0 || (unsigned)desc->log_level > LAJIT_LOG_DEBUG ||
        autotune > LAJIT_AUTOTUNE_EAGER)
        return LAJIT_ERR_INVALID_ARGUMENT;

    /* The context itself comes from the caller's allocator too: a temporary env does the
     * allocation, then the context's own env takes over (same allocator, same counters). */
    lj_env env;
    lj_env_init(&env, desc->alloc, desc->alloc_user, desc->log, desc->log_user, desc->log_level);
    lajit_ctx *ctx = lj_raw_alloc(&env, NULL, 0, sizeof *ctx);
    if (!ctx)
        return LAJIT_ERR_OUT_OF_MEMORY;
    memset(ctx, 0, sizeof *ctx);
    ctx->env = env;
    ctx->flags = desc->flags;
    ctx->ordinal = desc->device;
    const char *check = getenv("LAJIT_CHECK");
    if (check && strcmp(check, "1") == 0)
        ctx->flags |= LAJIT_CTX_CHECKED;
    ctx->autotune = autotune;
    if (autotune == LAJIT_AUTOTUNE_ENV) {
        const char *policy = getenv("LAJIT_AUTOTUNE");
        ctx->autotune = LAJIT_AUTOTUNE_OFF;
        if (policy && strcmp(policy, "eager") == 0)
            ctx->autotune = LAJIT_AUTOTUNE_EAGER;
        else if (policy && *policy && strcmp(policy, "off") != 0)
            lj_log(&ctx->env, LAJIT_LOG_WARN, "LAJIT_AUTOTUNE=%s is not off or eager: off", policy);
    }

    lajit_status st = LAJIT_OK;
    if (bundle && (st = lj_bundle_open(&ctx->env, bundle, &ctx->bundle)) != LAJIT_OK)
        return create_failed(ctx, st);
    /* Both automatic unless set (bwd_segments.c's rule; docs/notes/split.md and
     * context_parallel.md have the rows that chose them). */
    ctx->ds_segments = segments_setting(ctx, "LAJIT_DS_SEGMENTS");
    ctx->cp_segments = segments_setting(ctx, "LAJIT_CP_SEGMENTS");
    /* Unlike LAJIT_DS_SEGMENTS, whose bad value falls back to the automatic choice, a bad
     * LAJIT_PDL fails: whoever sets it is measuring both ways, and a typo that silently ran the
     * default would make the two measurements one. */
    const char *pdl = getenv("LAJIT_PDL");
    ctx->pdl = 1;
    if (pdl && *pdl) {
        if (strcmp(pdl, "0") == 0)
            ctx->pdl = 0;
        else if (strcmp(pdl, "1") != 0)
            return create_failed(ctx, lj_error(&ctx->env, LAJIT_ERR_INVALID_ARGUMENT,
                                               "LAJIT_PDL=%s is not 0 (off) or 1 (on)", pdl));
    }
    const char *tdir = getenv("LAJIT_TEMPLATE_DIR");
    if (tdir && *tdir && !(ctx->template_dir = lj_strdup(&ctx->env, tdir)))
        st = LAJIT_ERR_OUT_OF_MEMORY;
    if (st == LAJIT_OK && !(ctx->flags & LAJIT_CTX_NO_DISK_CACHE)) {
        if (desc->cache_dir) {
            if (!(ctx->cache_dir = lj_strdup(&ctx->env, desc->cache_dir)))
                st = LAJIT_ERR_OUT_OF_MEMORY;
        } else {
            st = lj_cache_default_dir(&ctx->env, &ctx->cache_dir);
            if (st != LAJIT_OK && st != LAJIT_ERR_OUT_OF_MEMORY) {
                /* No home directory and no override: run with the memory cache only. */
                lj_log(&ctx->env, LAJIT_LOG_WARN, "no disk cache: %s", ctx->env.errmsg);
                ctx->cache_dir = NULL;
                st = LAJIT_OK;
            }
        }
    }
    const char *family_path = getenv("LAJIT_FAMILY_PATH");
    if (st == LAJIT_OK && family_path && *family_path)
        st = lajit_ctx_add_families(ctx, family_path);
    if (st != LAJIT_OK)
        return create_failed(ctx, st);
    lj_clear_error(&ctx->env);
    *out = ctx;
    return LAJIT_OK;
}

LAJIT_API void lajit_ctx_destroy(lajit_ctx *ctx)
{
    if (!ctx)
        return;
    lj_env *env = &ctx->env;
    if (ctx->device_open) {
        const lj_driver *drv = ctx->device.drv;
        lj_dev_buf *bufs[] = {&ctx->scratch, &ctx->split_flags, &ctx->split_states,
                              &ctx->cp_ws,   &ctx->seg_ws,      &ctx->cp_ids};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]->ptr && lj_device_make_current(env, &ctx->device) == LAJIT_OK)
                LJ_CU(env, drv, cuMemFree, bufs[i]->ptr);
        for (int i = 0; i < LJ_MAX_FAMILIES; i++)
            if (ctx->family_ws[i].ptr && lj_device_make_current(env, &ctx->device) == LAJIT_OK)
                LJ_CU(env, drv, cuMemFree, ctx->family_ws[i].ptr);
        for (unsigned i = 0; i < ctx->plans.cap; i++)
            if (ctx->plans.slots[i].key.D != 0 && ctx->plans.slots[i].module)
                LJ_CU(env, drv, cuModuleUnload, ctx->plans.slots[i].module);
        lj_device_close(env, &ctx->device);
    }
    lj_plan_table_free(env, &ctx->plans);
    for (int i = 0; i < ctx->n_families; i++)
        lj_family_free(ctx->families[i]);
    lj_tunedb_close(ctx->tunedb);
    lj_tunedb_close(ctx->shipped);
    lj_bundle_close(ctx->bundle);
    lj_lua_close(ctx->lua);
    lj_cache_close(ctx->cache);
    lj_free(env, ctx->cache_dir);
    lj_free(env, ctx->template_dir);
    for (int i = 0; i < ctx->n_outside; i++)
        lj_free(env, ctx->outside[i].dir);
    lj_free(env, (void *)ctx->family_names);
    lj_env copy = *env;
    lj_raw_alloc(&copy, ctx, sizeof *ctx, 0);
}

LAJIT_API const char *lajit_errmsg(const lajit_ctx *ctx)
{
    if (!ctx)
        return create_errmsg[0] ? create_errmsg : "no context (NULL)";
    return ctx->env.errmsg;
}

LAJIT_API void lajit_free(lajit_ctx *ctx, void *ptr)
{
    if (ctx)
        lj_free(&ctx->env, ptr);
}

LAJIT_API const char *const *lajit_family_names(void)
{
    return lj_embedded_families;
}

LAJIT_API lajit_status lajit_family_list(lajit_ctx *ctx, const char *const **names, size_t *n)
{
    if (!ctx || !names || !n)
        return LAJIT_ERR_INVALID_ARGUMENT;
    if (!ctx->family_names) {
        size_t nb = 0;
        while (lj_embedded_families[nb])
            nb++;
        const char **list = lj_calloc(&ctx->env, nb + (size_t)ctx->n_outside + 1, sizeof *list);
        if (!list)
            return lj_oom(&ctx->env);
        size_t m = 0;
        for (size_t i = 0; i < nb; i++) {
            int replaced = 0;
            for (int j = 0; j < ctx->n_outside; j++)
                replaced |= strcmp(ctx->outside[j].name, lj_embedded_families[i]) == 0;
            if (!replaced)
                list[m++] = lj_embedded_families[i];
        }
        for (int j = 0; j < ctx->n_outside; j++)
            list[m++] = ctx->outside[j].name;
        ctx->family_names = list;
    }
    size_t m = 0;
    while (ctx->family_names[m])
        m++;
    *names = ctx->family_names;
    *n = m;
    return LAJIT_OK;
}

lj_env *lajit__ctx_env(lajit_ctx *ctx)
{
    return &ctx->env;
}

void lajit__ctx_set_driver(lajit_ctx *ctx, const lj_driver *drv)
{
    ctx->driver_override = drv;
}

void lajit__ctx_set_nccl(lajit_ctx *ctx, const lj_nccl *nccl)
{
    ctx->nccl_override = nccl;
}

lajit_status lajit__ctx_lua(lajit_ctx *ctx, lj_lua **out)
{
    if (!ctx->lua) {
        lajit_status st = lj_lua_open(&ctx->env, ctx->template_dir, &ctx->lua);
        for (int i = 0; i < ctx->n_outside && st == LAJIT_OK; i++)
            st = lj_lua_add_family_root(ctx->lua, ctx->outside[i].name, ctx->outside[i].dir);
        if (st != LAJIT_OK) {
            lj_lua_close(ctx->lua);
            ctx->lua = NULL;
            return st;
        }
    }
    *out = ctx->lua;
    return LAJIT_OK;
}

lajit_status lajit__ctx_cache(lajit_ctx *ctx, lj_cache **out)
{
    if (!ctx->cache) {
        lajit_status st = lj_cache_open(&ctx->env, ctx->cache_dir, &ctx->cache);
        if (st != LAJIT_OK)
            return st;
    }
    *out = ctx->cache;
    return LAJIT_OK;
}

lajit_status lajit__ctx_family(lajit_ctx *ctx, const char *name, lj_family **out)
{
    for (int i = 0; i < ctx->n_families; i++) {
        if (strcmp(lj_family_name(ctx->families[i]), name) == 0) {
            *out = ctx->families[i];
            return LAJIT_OK;
        }
    }
    if (ctx->n_families == LJ_MAX_FAMILIES)
        return lj_error(&ctx->env, LAJIT_ERR_INTERNAL, "too many families in one context");
    lj_lua *L;
    lajit_status st = lajit__ctx_lua(ctx, &L);
    if (st != LAJIT_OK)
        return st;
    lj_family *f;
    st = lj_family_load(&ctx->env, L, name, &f);
    if (st != LAJIT_OK)
        return st;
    ctx->families[ctx->n_families++] = f;
    *out = f;
    return LAJIT_OK;
}

lajit_status lj_ctx_buffer(lajit_ctx *ctx, lj_dev_buf *buf, size_t bytes, int zero, void *stream,
                           const char *what)
{
    if (buf->bytes >= bytes)
        return LAJIT_OK;
    lj_device *dev = NULL;
    lajit_status st;
    if ((st = lajit__ctx_device(ctx, &dev)) != LAJIT_OK ||
        (st = lj_device_make_current(&ctx->env, dev)) != LAJIT_OK)
        return st;
    return lj_dev_buf_grow(&ctx->env, dev->drv, buf, bytes, zero, (CUstream)stream, what);
}

lajit_status lajit__ctx_device(lajit_ctx *ctx, lj_device **out)
{
    if (!ctx->device_open) {
        if (ctx->flags & LAJIT_CTX_NO_DEVICE)
            return lj_error(&ctx->env, LAJIT_ERR_NO_DEVICE,
                            "the context was created with LAJIT_CTX_NO_DEVICE");
        const lj_driver *drv = ctx->driver_override;
        lajit_status st = LAJIT_OK;
        if (!drv)
            st = lj_driver_load(&ctx->env, &drv);
        if (st == LAJIT_OK)
            st = lj_device_open(&ctx->env, drv, ctx->ordinal, &ctx->device);
        if (st != LAJIT_OK)
            return st;
        ctx->device_open = 1;
    }
    *out = &ctx->device;
    return LAJIT_OK;
}

LAJIT_API lajit_status lajit_expand(lajit_ctx *ctx, const char *family, const char *arch,
                                    const char *const *assignments, size_t n_assignments,
                                    char **source)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lj_env *env = &ctx->env;
    lj_clear_error(env);
    if (!family || !source || (n_assignments && !assignments))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "lajit_expand: NULL argument");
    lj_device_info dev;
    if (!lj_device_info_for_arch(arch ? arch : "sm_90a", &dev))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "unknown arch %s (known: sm_80, sm_86, sm_89, sm_90a, sm_100a, sm_120)",
                        arch);
    lj_family *f;
    lajit_status st = lajit__ctx_family(ctx, family, &f);
    if (st != LAJIT_OK)
        return st;
    lj_problem *problems;
    int n_problems;
    st = lj_family_problems(f, &problems, &n_problems);
    if (st != LAJIT_OK)
        return st;
    if (n_problems == 0) {
        lj_free(env, problems);
        return lj_error(env, LAJIT_ERR_TEMPLATE, "%s lists no representative problem", family);
    }
    lj_problem p = problems[0];
    lj_free(env, problems);

    lj_config cfg;
    memset(&cfg, 0, sizeof cfg);
    st = lj_assign_all(env, f, assignments, n_assignments, &dev, &p, &cfg);
    if (st != LAJIT_OK)
        return st;
    int ok;
    char reason[256];
    st = lj_family_valid(f, &cfg, &p, &dev, &ok, reason, sizeof reason);
    if (st != LAJIT_OK)
        return st;
    if (!ok) {
        char text[256];
        lj_config_format(&cfg, text, sizeof text);
        return lj_error(env, LAJIT_ERR_UNSUPPORTED, "%s [%s] is not valid here: %s", family, text,
                        reason);
    }
    return lj_family_source(f, &cfg, &p, &dev, source);
}
