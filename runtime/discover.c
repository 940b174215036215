/* discover.c — public parameter discovery (lajit.h: lajit_family_describe, lajit_family_param):
 * a family's op and its tunable parameters with their candidate values and bounds, read from
 * the family spec the context loads (generator/family.h), so tools and applications can list or
 * sweep a family's space without reaching into the library's internals — as zstd's
 * ZSTD_cParam_getBounds does for its parameters. */
#include <stddef.h>

#include "context.h"

/* A caller's struct must hold at least every field this build writes; a larger one (from a newer
 * header) is fine: only the fields known here are written. */
static lajit_status check_struct(lj_env *env, const char *fn, size_t given, size_t known)
{
    if (given < known)
        return lj_error(env, LAJIT_ERR_STRUCT_SIZE, "%s: struct_size %zu, this build needs %zu", fn,
                        given, known);
    return LAJIT_OK;
}

static lajit_status family_for(lajit_ctx *ctx, const char *fn, const char *family, const void *out,
                               lj_family **f)
{
    if (!family || !out)
        return lj_error(&ctx->env, LAJIT_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
    return lajit__ctx_family(ctx, family, f);
}

LAJIT_API lajit_status lajit_family_describe(lajit_ctx *ctx, const char *family,
                                             lajit_family_info *out)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lj_env *env = &ctx->env;
    lj_clear_error(env);
    lj_family *f;
    lajit_status st = family_for(ctx, "lajit_family_describe", family, out, &f);
    if (st == LAJIT_OK)
        st = check_struct(env, "lajit_family_describe", out->struct_size, sizeof *out);
    if (st != LAJIT_OK)
        return st;
    out->name = lj_family_name(f);
    out->op = lj_op_name(lj_family_op(f));
    out->n_params = lj_family_param_count(f);
    return LAJIT_OK;
}

LAJIT_API lajit_status lajit_family_param(lajit_ctx *ctx, const char *family, int index,
                                          lajit_param_info *out)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lj_env *env = &ctx->env;
    lj_clear_error(env);
    lj_family *f;
    lajit_status st = family_for(ctx, "lajit_family_param", family, out, &f);
    if (st == LAJIT_OK)
        st = check_struct(env, "lajit_family_param", out->struct_size, sizeof *out);
    if (st != LAJIT_OK)
        return st;
    int n = lj_family_param_count(f);
    if (index < 0 || index >= n)
        return lj_error(env, LAJIT_ERR_NOT_FOUND, "%s has %d parameters: index %d is out of range",
                        family, n, index);
    const long long *values;
    int count = lj_family_param_values(f, index, &values);
    /* The spec loader guarantees 1 to 64 values; the bounds are computed, not assumed sorted. */
    long long lo = values[0], hi = values[0];
    for (int i = 1; i < count; i++) {
        lo = values[i] < lo ? values[i] : lo;
        hi = values[i] > hi ? values[i] : hi;
    }
    out->name = lj_family_param_name(f, index);
    out->min = lo;
    out->max = hi;
    out->n_values = count;
    out->values = values;
    return LAJIT_OK;
}
