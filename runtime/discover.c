/* discover.c — public parameter discovery (lajit.h: lajit_family_describe, lajit_family_param):
 * a family's op and its tunable parameters with their candidate values and bounds, read from
 * the family spec the context loads (generator/family.h), so tools and applications can list or
 * sweep a family's space without reaching into the library's internals — as zstd's
 * ZSTD_cParam_getBounds does for its parameters. */
#include <stddef.h>

#include "context.h"

/* What both queries check first: the arguments given, the family loaded, then the caller's
 * struct large enough for every field this build writes (a larger one, from a newer header, is
 * fine: only the fields known here are written). struct_size is NULL when out is. */
static lajit_status begin_query(lajit_ctx *ctx, const char *fn, const char *family,
                                const size_t *struct_size, size_t known, lj_family **f)
{
    if (!ctx)
        return LAJIT_ERR_INVALID_ARGUMENT;
    lj_env *env = &ctx->env;
    lj_clear_error(env);
    if (!family || !struct_size)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
    lajit_status st = lajit__ctx_family(ctx, family, f);
    if (st == LAJIT_OK && *struct_size < known)
        st = lj_error(env, LAJIT_ERR_STRUCT_SIZE, "%s: struct_size %zu, this build needs %zu", fn,
                      *struct_size, known);
    return st;
}

LAJIT_API lajit_status lajit_family_describe(lajit_ctx *ctx, const char *family,
                                             lajit_family_info *out)
{
    lj_family *f;
    lajit_status st = begin_query(ctx, "lajit_family_describe", family,
                                  out ? &out->struct_size : NULL, sizeof *out, &f);
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
    lj_family *f;
    lajit_status st = begin_query(ctx, "lajit_family_param", family, out ? &out->struct_size : NULL,
                                  sizeof *out, &f);
    if (st != LAJIT_OK)
        return st;
    int n = lj_family_param_count(f);
    if (index < 0 || index >= n)
        return lj_error(&ctx->env, LAJIT_ERR_NOT_FOUND,
                        "%s has %d parameters: index %d is out of range", family, n, index);
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
