/* plan_build.c — the slow path of every op and the plan table's one door: which family serves
 * a problem (the named one, or the op's defaults in order), which configuration it runs (a
 * bundle's, else the user's tuning database's winner, else the shipped table's (autotune/tuned.h),
 * else the family's default; each checked by the family's valid()), its
 * kernel from the first cache level that has it (memory, disk cache, bundle, NVRTC, in that
 * order: lj_kernel_fetch, generator/levels.h), and the module load that makes a plan.
 * lj_op_launch is the hot path's entry: a plan-table probe and one launch once the bucket has
 * its plan (see ops.c for the argument checks before it); lj_plan_launch is that launch, for
 * lajit_launch too. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "config.h"
#include "context.h"
#include "levels.h"
#include "params.h"
#include "plan_build.h"
#include "problem.h"
#include "search.h"
#include "tuned.h"

/* ---- Plans --------------------------------------------------------------------------------- */

static int family_index(const lajit_ctx *ctx, const char *name)
{
    for (int i = 0; i < ctx->n_families; i++)
        if (strcmp(lj_family_name(ctx->families[i]), name) == 0)
            return i;
    return -1;
}

/* The families an op tries, in order, when the caller names none: the fast family first, then
 * the ones that cover what it does not (la_fwd_sm90: sm_90a, 16-bit, D a multiple of 64; la_fwd:
 * every arch and dtype; la_recurrent: what no chunked config fits; la_bwd_sm90: the backward's
 * scans there, la_bwd the rest and the decay gradient). */
static const char *const fwd_defaults[] = {"la_fwd_sm90", "la_fwd", "la_recurrent", NULL};
static const char *const bwd_defaults[] = {"la_bwd_sm90", "la_bwd", NULL};
static const char *const decode_defaults[] = {"la_decode", NULL};
static const char *const no_defaults[] = {NULL}; /* custom families are always named */

static const char *const *default_families(lj_op op)
{
    switch (op) {
        case LJ_OP_FWD: return fwd_defaults;
        case LJ_OP_BWD: return bwd_defaults;
        case LJ_OP_DECODE: return decode_defaults;
        case LJ_OP_CUSTOM: return no_defaults;
    }
    return decode_defaults;
}

/* Plans built for "no family named" are keyed by this index, whichever family served them. */
#define DEFAULT_FAMILY_INDEX 255

/* ---- Autotune policy (the slow path only) ------------------------------------------------- */

/* How long a tuning lease lasts: longer than any one bucket's search. */
#define TUNE_LEASE_S 1800

/* The tuning database of the context, opened on first need; NULL when there is none (memory
 * cache only, or unusable: said once in the log, then defaults for the context's life). */
static lj_tunedb *context_tunedb(lajit_ctx *ctx)
{
    if (ctx->tunedb || ctx->tunedb_failed)
        return ctx->tunedb;
    if (!ctx->cache_dir || lj_tunedb_open(&ctx->env, ctx->cache_dir, &ctx->tunedb) != LAJIT_OK) {
        ctx->tunedb_failed = 1;
        if (ctx->cache_dir)
            lj_log(&ctx->env, LAJIT_LOG_WARN, "no tuning database, using defaults: %s",
                   ctx->env.errmsg);
        lj_clear_error(&ctx->env);
    }
    return ctx->tunedb;
}

/* Takes `text` (a configuration some file named: the user's tuning database, the shipped table,
 * a bundle) for f's problem p into *cfg when it parses and passes the family's valid() here;
 * else says why in one log line naming `from` and keeps *cfg. Returns 1 when taken. */
static int take_config(lajit_ctx *ctx, lj_family *f, const lj_device *dev, const lj_problem *p,
                       const char *text, const char *from, const char *bucket, lj_config *cfg)
{
    lj_env *env = &ctx->env;
    char reason[256];
    int ok = 0;
    lj_config parsed;
    if (lj_config_parse(env, f, cfg, text, &parsed) != LAJIT_OK ||
        lj_family_valid(f, &parsed, p, &dev->info, &ok, reason, sizeof reason) != LAJIT_OK) {
        lj_log(env, LAJIT_LOG_WARN, "%s: [%s] for %s %s is unusable (%s): default", from, text,
               lj_family_name(f), bucket, env->errmsg);
        lj_clear_error(env);
        return 0;
    }
    if (!ok) {
        lj_log(env, LAJIT_LOG_WARN, "%s: [%s] for %s %s is not valid here (%s): default", from,
               text, lj_family_name(f), bucket, reason);
        return 0;
    }
    *cfg = parsed;
    /* Said once per plan (a plan is built once per bucket), so a user can see which bucket ran
     * a tuned configuration and where it came from. */
    lj_log(env, LAJIT_LOG_INFO, "%s %s: [%s] from the %s", lj_family_name(f), bucket, text, from);
    return 1;
}

/* The shipped tuning table of the context's device (autotune/tuned.h), loaded on first need;
 * NULL when there is none (LAJIT_TUNED_DIR off, no table for this GPU) or it was refused, which
 * is said once in the log: a refused table is never partly trusted. */
static lj_tunedb *context_shipped(lajit_ctx *ctx, const lj_fingerprint *fp)
{
    if (ctx->shipped || ctx->shipped_tried)
        return ctx->shipped;
    ctx->shipped_tried = 1;
    if (lj_tuned_load(&ctx->env, fp, &ctx->shipped, ctx->shipped_path, sizeof ctx->shipped_path) !=
        LAJIT_OK) {
        ctx->shipped = NULL;
        lj_log(&ctx->env, LAJIT_LOG_WARN, "shipped tuning table ignored: %s", ctx->env.errmsg);
        lj_clear_error(&ctx->env);
    }
    return ctx->shipped;
}

/* Replaces *cfg by the shipped table's winner for id's bucket when the table has one for this
 * family's current templates that parses and is valid for this problem; returns 1 when taken.
 * An entry tuned on other templates (stale) or unusable here is ignored with one log line. */
static int shipped_config(lajit_ctx *ctx, lj_family *f, const lj_device *dev, const lj_problem *p,
                          const lj_tune_id *id, lj_config *cfg)
{
    lj_env *env = &ctx->env;
    lj_tunedb *t = context_shipped(ctx, &id->fp);
    if (!t)
        return 0;
    char text[256], hash[17], from[1100];
    int found = 0, stale = 0;
    if (lj_tunedb_shipped_winner(t, id, text, sizeof text, &found, &stale, hash) != LAJIT_OK) {
        lj_log(env, LAJIT_LOG_WARN, "shipped tuning table: %s; default", env->errmsg);
        lj_clear_error(env);
        return 0;
    }
    if (stale) {
        lj_log(env, LAJIT_LOG_WARN,
               "shipped tuning table %s: %s %s was tuned on templates %s, these are %s: ignored, "
               "default",
               ctx->shipped_path, id->family, id->bucket, hash, id->template_hash);
        return 0;
    }
    if (!found)
        return 0;
    snprintf(from, sizeof from, "shipped tuning table %s", ctx->shipped_path);
    return take_config(ctx, f, dev, p, text, from, id->bucket, cfg);
}

/* Replaces *cfg (f's default for p, valid) by a tuned configuration. In order: the user's tuning
 * database's winner, the shipped table's (tuned.h), and with the eager policy a search now (a
 * bucket the shipped table covers counts as tuned: no search). Tuning never fails an op: any
 * problem is logged and the default stays. A winner is used only when it still parses and is
 * valid for this problem. */
static void apply_tuning(lajit_ctx *ctx, lj_family *f, lj_lua *L, lj_cache *cache, lj_device *dev,
                         const lj_problem *p, lj_config *cfg)
{
    lj_env *env = &ctx->env;
    lj_tunedb *db = context_tunedb(ctx);
    lj_tune_id id;
    char text[256];
    int found = 0;
    if (lj_tune_id_make(env, f, dev, p, &id) != LAJIT_OK)
        goto failed;
    if (db && lj_tunedb_winner(db, &id, text, sizeof text, NULL, &found) != LAJIT_OK) {
        /* The shipped table may still serve; no search without a database to record it. */
        lj_log(env, LAJIT_LOG_WARN, "autotune: %s", env->errmsg);
        lj_clear_error(env);
        db = NULL;
    }
    if (found && take_config(ctx, f, dev, p, text, "tuning database", id.bucket, cfg))
        return;
    if (shipped_config(ctx, f, dev, p, &id, cfg))
        return;
    if (!db || ctx->autotune != LAJIT_AUTOTUNE_EAGER || found)
        return;
    int got = 0;
    if (lj_tunedb_lease(db, &id, TUNE_LEASE_S, &got) != LAJIT_OK)
        goto failed;
    if (!got) {
        lj_log(env, LAJIT_LOG_INFO, "%s %s is being tuned by another process: default for now",
               id.family, id.bucket);
        return;
    }
    lj_log(env, LAJIT_LOG_INFO, "tuning %s %s", id.family, id.bucket);
    lj_search_out res;
    lajit_status st = lj_search_run(env, L, f, cache, dev, p, NULL, &res);
    if (st == LAJIT_OK) {
        char dtext[256];
        lj_config_format(&res.dflt, dtext, sizeof dtext);
        st = lj_tunedb_record(db, &id, res.results, res.n_results, dtext, res.default_ms);
        if (res.have_best)
            *cfg = res.best;
        lj_search_out_free(env, &res);
    }
    lj_tunedb_release(db, &id);
    if (st == LAJIT_OK)
        return;
failed:
    lj_log(env, LAJIT_LOG_WARN, "autotune: %s; using the default", env->errmsg);
    lj_clear_error(env);
}

/* ---- Bundles: the configuration an offline set chose ----------------------------------------- */

/* Replaces *cfg (f's default for p, valid) by the bundle's configuration for this bucket on this
 * arch, when it has one that parses and passes the family's valid() for this problem, as a tuned
 * one must: a bundle is a file someone else wrote. Anything else is logged and the default
 * stays. *from_bundle says whether the bundle's configuration was taken. */
static void bundle_config(lajit_ctx *ctx, lj_family *f, const lj_device *dev, const lj_problem *p,
                          lj_config *cfg, int *from_bundle)
{
    lj_env *env = &ctx->env;
    char bucket[256], text[256], from[1100];
    int found = 0;
    if (lj_family_key(f, p, bucket, sizeof bucket) != LAJIT_OK ||
        lj_bundle_config(ctx->bundle, lj_family_name(f), bucket, dev->info.arch, text, sizeof text,
                         &found) != LAJIT_OK ||
        !found) {
        lj_clear_error(env);
        return;
    }
    snprintf(from, sizeof from, "bundle %s", lj_bundle_path(ctx->bundle));
    *from_bundle = take_config(ctx, f, dev, p, text, from, bucket, cfg);
}

static lajit_status build_plan(lajit_ctx *ctx, const char *requested, const lj_problem *p,
                               const lj_plan **out)
{
    lj_env *env = &ctx->env;
    lj_device *dev;
    lajit_status st = lajit__ctx_device(ctx, &dev);
    if (st != LAJIT_OK)
        return st;
    lj_lua *L;
    lj_cache *cache;
    if ((st = lajit__ctx_lua(ctx, &L)) != LAJIT_OK ||
        (st = lajit__ctx_cache(ctx, &cache)) != LAJIT_OK)
        return st;

    /* The named family, or the op's defaults in order: the first whose default configuration
     * is valid for this problem on this device. */
    const char *single[2] = {requested, NULL};
    const char *const *names = requested ? single : default_families(p->op);
    lj_family *f = NULL;
    const char *name = NULL;
    lj_plan plan;
    memset(&plan, 0, sizeof plan);
    char reasons[768] = "";
    for (int i = 0; names[i] && !f; i++) {
        lj_family *cand;
        if ((st = lajit__ctx_family(ctx, names[i], &cand)) != LAJIT_OK) {
            if (st == LAJIT_ERR_NOT_FOUND && !requested)
                continue; /* a default family this build does not have */
            return st;
        }
        if (lj_family_op(cand) != p->op)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "family %s does not implement %s",
                            names[i], lj_op_name(p->op));
        if (!requested && !lj_family_serves(cand, dev->info.arch))
            continue; /* an arch-specific default family (la_fwd_sm90) on another arch */
        if ((st = lj_family_default(cand, p, &dev->info, &plan.config)) != LAJIT_OK)
            return st;
        int ok;
        char reason[256];
        if ((st = lj_family_valid(cand, &plan.config, p, &dev->info, &ok, reason, sizeof reason)) !=
            LAJIT_OK)
            return st;
        if (ok) {
            f = cand;
            name = names[i];
        } else {
            size_t used = strlen(reasons);
            snprintf(reasons + used, sizeof reasons - used, "%s%s: %s", used ? "; " : "", names[i],
                     reason);
        }
    }
    if (!f) {
        char what[256];
        lj_problem_format(p, what, sizeof what);
        return lj_error(env, LAJIT_ERR_UNSUPPORTED, "no family supports %s on %s (%s)", what,
                        dev->info.arch, reasons);
    }
    int from_bundle = 0;
    if (ctx->bundle)
        bundle_config(ctx, f, dev, p, &plan.config, &from_bundle);
    if (!from_bundle)
        apply_tuning(ctx, f, L, cache, dev, p, &plan.config);
    plan.key = lj_plan_key_make(p, requested ? family_index(ctx, requested) : DEFAULT_FAMILY_INDEX);
    st = lj_family_launch(f, &plan.config, p, &dev->info, &plan.launch);
    if (st != LAJIT_OK)
        return st;
    const void *image = NULL;
    const char *source = NULL;
    st = lj_kernel_fetch(env, L, f, cache, ctx->bundle, &dev->info, p, &plan.config, &image,
                         &source);
    if (st != LAJIT_OK)
        return st;
    if ((st = lj_device_make_current(env, dev)) != LAJIT_OK)
        return st;
    st = lj_module_load(env, dev, image, plan.launch.entry, plan.launch.smem, &plan.module,
                        &plan.fn);
    if (st != LAJIT_OK)
        return st;
    /* A custom family's kernel must take what its spec declares: lajit_launch packs the
     * arguments from the declaration alone, so a mismatch would be a silent wrong launch. */
    if (p->op == LJ_OP_CUSTOM &&
        (st = lj_args_check_kernel(env, dev->drv, plan.fn, lj_family_args(f), name,
                                   plan.launch.entry)) != LAJIT_OK) {
        LJ_CU(env, dev->drv, cuModuleUnload, plan.module);
        return st;
    }
    st = lj_plan_add(env, &ctx->plans, &plan);
    if (st != LAJIT_OK) {
        LJ_CU(env, dev->drv, cuModuleUnload, plan.module);
        return st;
    }
    char cfgtext[256], what[256];
    lj_config_format(&plan.config, cfgtext, sizeof cfgtext);
    lj_problem_format(p, what, sizeof what);
    lj_log(env, LAJIT_LOG_INFO, "plan %s [%s] for %s on %s (%s)", name, cfgtext, what,
           dev->info.arch, source);
    *out = lj_plan_find(&ctx->plans, &plan.key);
    return LAJIT_OK;
}

lajit_status lj_plan_get(lajit_ctx *ctx, const char *family, const lj_problem *p,
                         const lj_plan **out)
{
    int index = family ? family_index(ctx, family) : DEFAULT_FAMILY_INDEX;
    const lj_plan *plan = NULL;
    if (index >= 0) {
        lj_plan_key key = lj_plan_key_make(p, index);
        plan = lj_plan_find(&ctx->plans, &key);
    }
    if (plan) {
        *out = plan;
        return LAJIT_OK;
    }
    return build_plan(ctx, family, p, out);
}

/* Programmatic dependent launch (PDL): a kernel whose spec says pdl waits (griddepcontrol.wait)
 * before touching global memory, so the driver may make its CTAs resident while the previous
 * kernel on the stream drains, hiding most of the launch gap of a small decode step. It needs
 * the attribute on the launch, which only cuLaunchKernelEx takes; sm_90 and later honour it.
 * Stream capture needs nothing here: the driver records the attribute with the captured kernel
 * (a programmatic edge of the graph), so a captured decode loop may overlap when replayed too;
 * whether and by how much is measured on a GPU (lajit_bench --mode decode --pdl 0,1). One
 * driver call either way, so fault injection counts the same whichever entry is taken. */
lajit_status lj_plan_launch(lajit_ctx *ctx, const lj_plan *plan, const unsigned grid[3],
                            void *stream, void **params)
{
    lj_env *env = &ctx->env;
    const lj_driver *drv = ctx->device.drv;
    const lj_launch *l = &plan->launch;
    CUresult r;
    if (l->pdl && ctx->pdl && ctx->device.info.cc >= 90 && drv->cuLaunchKernelEx) {
        CUlaunchAttribute attr;
        memset(&attr, 0, sizeof attr);
        attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        CUlaunchConfig cfg = {.gridDimX = grid[0],
                              .gridDimY = grid[1],
                              .gridDimZ = grid[2],
                              .blockDimX = l->block[0],
                              .blockDimY = l->block[1],
                              .blockDimZ = l->block[2],
                              .sharedMemBytes = l->smem,
                              .hStream = (CUstream)stream,
                              .attrs = &attr,
                              .numAttrs = 1};
        r = LJ_CU(env, drv, cuLaunchKernelEx, &cfg, plan->fn, params, NULL);
        if (r != CUDA_SUCCESS)
            return lj_driver_error(env, drv, r, "cuLaunchKernelEx");
        return LAJIT_OK;
    }
    r = LJ_CU(env, drv, cuLaunchKernel, plan->fn, grid[0], grid[1], grid[2], l->block[0],
              l->block[1], l->block[2], l->smem, (CUstream)stream, params, NULL);
    if (r != CUDA_SUCCESS)
        return lj_driver_error(env, drv, r, "cuLaunchKernel");
    return LAJIT_OK;
}

lajit_status lj_op_launch(lajit_ctx *ctx, const char *family, const lj_problem *p,
                          const la_params *lp, void *stream, unsigned *covers)
{
    lj_env *env = &ctx->env;
    const lj_plan *plan = NULL;
    lajit_status st;
    if ((st = lj_plan_get(ctx, family, p, &plan)) != LAJIT_OK)
        return st;
    const char *name = family ? family : "the default family";
    unsigned grid[3];
    long long vars[LJ_VAR_SYM0];
    lj_plan_vars(vars, lp->B, lp->H, lp->N, lp->nseq, lp->T);
    if (!lj_plan_grid(&plan->launch, vars, LJ_VAR_SYM0, grid))
        return lj_error(env, LAJIT_ERR_UNSUPPORTED,
                        "%s: the grid for B=%d H=%d exceeds the driver's limits", name, lp->B,
                        lp->H);
    if ((st = lj_device_make_current(env, &ctx->device)) != LAJIT_OK)
        return st;
    la_params split_lp;
    if (plan->launch.split_ws) {
        split_lp = *lp;
        size_t flags = lj_split_ws_bytes(lp->nseq, lp->H, plan->launch.split_flags),
               states = lj_split_ws_bytes(lp->nseq, lp->H, plan->launch.split_ws);
        if (flags == SIZE_MAX || states == SIZE_MAX)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "the split workspace of this call does not fit in size_t");
        if ((st = lj_ctx_buffer(ctx, &ctx->split_flags, flags, 1, stream,
                                "the split scan's flags")) != LAJIT_OK ||
            (st = lj_ctx_buffer(ctx, &ctx->split_states, states, 0, stream,
                                "the split scan's states")) != LAJIT_OK)
            return st;
        split_lp.splitws = (unsigned long long)ctx->split_flags.ptr;
        split_lp.splitst = (unsigned long long)ctx->split_states.ptr;
        lp = &split_lp;
    }
    void *kernel_args[] = {(void *)lp};
    if ((st = lj_plan_launch(ctx, plan, grid, stream, kernel_args)) != LAJIT_OK)
        return st;
    if (covers)
        *covers = plan->launch.covers;
    return LAJIT_OK;
}

/* ---- Roles: a multi-kernel op's passes, from its spec --------------------------------------- */

lajit_status lj_op_roles(lajit_ctx *ctx, const char *family, lj_op op, const lj_roles **out)
{
    int slot = family ? family_index(ctx, family) : LJ_MAX_FAMILIES;
    if (slot >= 0 && ctx->roles_loaded[slot]) {
        *out = &ctx->roles[slot];
        return LAJIT_OK;
    }
    lj_env *env = &ctx->env;
    lj_lua *L;
    lajit_status st = lajit__ctx_lua(ctx, &L);
    if (st != LAJIT_OK)
        return st;
    const char *single[2] = {family, NULL};
    const char *const *names = family ? single : default_families(op);
    lj_family *f = NULL;
    for (int i = 0; names[i] && !f; i++) {
        st = lajit__ctx_family(ctx, names[i], &f);
        if (st == LAJIT_ERR_NOT_FOUND && !family) {
            lj_clear_error(env);
            continue; /* a default family this build does not have */
        }
        if (st != LAJIT_OK)
            return st;
    }
    if (!f)
        return lj_error(env, LAJIT_ERR_UNSUPPORTED, "no family implements %s", lj_op_name(op));
    if (lj_family_op(f) != op)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "family %s does not implement %s",
                        lj_family_name(f), lj_op_name(op));
    if (family)
        slot = family_index(ctx, family);
    if (slot < 0)
        return lj_error(env, LAJIT_ERR_INTERNAL, "family %s loaded but not listed", family);
    if ((st = lj_roles_load(L, f, &ctx->roles[slot])) != LAJIT_OK)
        return st;
    ctx->roles_loaded[slot] = 1;
    *out = &ctx->roles[slot];
    return LAJIT_OK;
}
