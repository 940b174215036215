/* problem.c — text assignments to problems and configurations (problem.h). */
#include "problem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_int(const char *s, long long *out)
{
    if (strcmp(s, "true") == 0) {
        *out = 1;
        return 1;
    }
    if (strcmp(s, "false") == 0) {
        *out = 0;
        return 1;
    }
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return 0;
    *out = v;
    return 1;
}

/* The integer fields of lj_problem by name, in the struct's order: a spec's problem table
 * (lj_read_problem) and a text assignment (lj_assign) name them alike. */
static const struct {
    const char *name;
    size_t offset;
} fields[] = {
    {"B", offsetof(lj_problem, B)},
    {"H", offsetof(lj_problem, H)},
    {"N", offsetof(lj_problem, N)},
    {"D", offsetof(lj_problem, D)},
    {"E", offsetof(lj_problem, E)},
    {"T", offsetof(lj_problem, T)},
    {"decay", offsetof(lj_problem, decay)},
    {"has_initial", offsetof(lj_problem, has_initial)},
    {"has_final", offsetof(lj_problem, has_final)},
    {"varlen", offsetof(lj_problem, varlen)},
    {"vk", offsetof(lj_problem, vk)},
    {"want_ds", offsetof(lj_problem, want_ds)},
    {"has_dsn", offsetof(lj_problem, has_dsn)},
    {"step_states", offsetof(lj_problem, step_states)},
    {"state_only", offsetof(lj_problem, state_only)},
    {"part", offsetof(lj_problem, part)},
};

const char *lj_problem_field_name(size_t i)
{
    return i < sizeof fields / sizeof fields[0] ? fields[i].name : NULL;
}

int *lj_problem_field(lj_problem *p, size_t i)
{
    return (int *)((char *)p + fields[i].offset);
}

static int *problem_field(lj_problem *p, const char *key)
{
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (strcmp(fields[i].name, key) == 0)
            return lj_problem_field(p, i);
    return NULL;
}

lajit_status lj_assign(lj_env *env, lj_family *f, const char *assignment, lj_problem *p,
                       lj_config *cfg)
{
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment || eq - assignment >= LJ_PARAM_NAME)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "\"%s\": expected KEY=VALUE", assignment);
    char key[LJ_PARAM_NAME];
    memcpy(key, assignment, (size_t)(eq - assignment));
    key[eq - assignment] = 0;
    const char *value = eq + 1;
    const lj_args_decl *decl = p->op == LJ_OP_CUSTOM ? p->decl : NULL;
    if (strcmp(key, "dtype") == 0) {
        lj_dtype dt;
        if (!lj_dtype_parse(value, &dt))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "dtype=%s: expected f32, f16 or bf16",
                            value);
        if (decl && !(decl->dtypes & (1u << dt)))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "dtype=%s: %s does not take it", value,
                            lj_family_name(f));
        p->dtype = dt;
        return LAJIT_OK;
    }
    /* The states' storage (f32 by default) and o's dtype (the problem's by default): attention
     * ops only, named like dtype. */
    int is_state = strcmp(key, "state_dtype") == 0, is_out = strcmp(key, "out_dtype") == 0;
    if (!decl && (is_state || is_out)) {
        lj_dtype dt;
        if (!lj_dtype_parse(value, &dt))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s=%s: expected f32, f16 or bf16",
                            key, value);
        if (is_state)
            p->state_dtype = dt;
        else
            p->out_dtype = (int)dt + 1; /* kept as given: lj_problem_out compares with dtype */
        return LAJIT_OK;
    }
    long long v;
    if (!parse_int(value, &v))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s=%s: expected an integer", key, value);
    /* A custom family's problem is its symbols: shape sizes from 1, has_ flags 0 or 1. */
    int sym = decl ? lj_args_symbol(decl, key) : -1;
    if (sym >= 0) {
        int flag = decl->sym[sym].flag;
        if (flag ? (v != 0 && v != 1) : (v < 1 || v > (1LL << 62)))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s=%lld: out of range (%s)", key, v,
                            flag ? "0 or 1" : "1 to 2^62");
        p->sym[sym] = v;
        return LAJIT_OK;
    }
    /* D, E, B, H, N, T are problem sizes even though they are capitals. */
    int *field = decl ? NULL : problem_field(p, key);
    if (field) {
        if (v < 0 || v > 1 << 30)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s=%lld: out of range", key, v);
        *field = (int)v;
        return LAJIT_OK;
    }
    for (int i = 0; i < lj_family_param_count(f); i++) {
        if (strcmp(lj_family_param_name(f, i), key) != 0)
            continue;
        const long long *values;
        int n = lj_family_param_values(f, i, &values);
        int known = 0;
        for (int j = 0; j < n; j++)
            known |= values[j] == v;
        if (!known)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "%s=%lld is not a candidate value of %s", key, v, lj_family_name(f));
        for (int j = 0; j < cfg->n; j++) {
            if (strcmp(cfg->names[j], key) == 0) {
                cfg->values[j] = v;
                return LAJIT_OK;
            }
        }
        return lj_error(env, LAJIT_ERR_INTERNAL, "configuration lacks parameter %s", key);
    }
    return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                    "%s is neither a problem field nor a parameter of %s", key, lj_family_name(f));
}

/* Parameters are capitalised names longer than one letter (TILE_V); B, H, N, D, E, T are
 * problem sizes. */
int lj_assignment_is_parameter(const char *a)
{
    return a[0] >= 'A' && a[0] <= 'Z' && a[1] != '=' && a[1] != 0;
}

/* Whether an assignment sets a parameter of f rather than its problem: a custom family's symbols
 * may be capitals too (BT=64), so its symbol names are asked first. */
static int sets_parameter(const lj_family *f, const char *a)
{
    const lj_args_decl *decl = lj_family_args(f);
    if (decl) {
        size_t n = strcspn(a, "=");
        for (int i = 0; i < decl->n_syms; i++)
            if (strlen(decl->sym[i].name) == n && strncmp(decl->sym[i].name, a, n) == 0)
                return 0;
    }
    return lj_assignment_is_parameter(a);
}

lajit_status lj_assign_all(lj_env *env, lj_family *f, const char *const *assignments, size_t n,
                           const lj_device_info *dev, lj_problem *p, lj_config *cfg)
{
    lajit_status st = LAJIT_OK;
    for (size_t i = 0; i < n && st == LAJIT_OK; i++) {
        if (!assignments[i])
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "assignment %zu is NULL", i);
        if (!sets_parameter(f, assignments[i]))
            st = lj_assign(env, f, assignments[i], p, cfg);
    }
    if (st == LAJIT_OK)
        st = lj_family_default(f, p, dev, cfg);
    for (size_t i = 0; i < n && st == LAJIT_OK; i++)
        if (sets_parameter(f, assignments[i]))
            st = lj_assign(env, f, assignments[i], p, cfg);
    return st;
}

void lj_problem_format(const lj_problem *p, char *out, size_t cap)
{
    if (p->op == LJ_OP_CUSTOM && p->decl) {
        /* "custom bf16 B=4 H=32 N=8192 D=128 E=128 has_h0" */
        size_t used = (size_t)snprintf(out, cap, "custom %s", lj_dtype_name(p->dtype));
        for (int i = 0; i < p->decl->n_syms && used < cap; i++) {
            const lj_symbol *s = &p->decl->sym[i];
            int n = s->flag ? (p->sym[i] ? snprintf(out + used, cap - used, " %s", s->name) : 0)
                            : snprintf(out + used, cap - used, " %s=%lld", s->name, p->sym[i]);
            if (n < 0)
                break;
            used += (size_t)n;
        }
        return;
    }
    /* Storage and output dtypes only when they differ from the defaults, so the summaries of
     * every existing problem read as before. */
    char extra[32] = "";
    lj_dtype od = lj_problem_out(p);
    snprintf(extra, sizeof extra, "%s%s%s%s", p->state_dtype != LJ_F32 ? " state=" : "",
             p->state_dtype != LJ_F32 ? lj_dtype_name(p->state_dtype) : "",
             od != p->dtype ? " out=" : "", od != p->dtype ? lj_dtype_name(od) : "");
    char steps[16] = "";
    if (p->op == LJ_OP_DECODE)
        snprintf(steps, sizeof steps, " T=%d", p->T);
    else if (p->op == LJ_OP_BWD)
        snprintf(steps, sizeof steps, " part=%d", p->part);
    snprintf(out, cap, "%s %s B=%d H=%d N=%d D=%d E=%d%s%s%s%s%s%s%s%s%s%s%s", lj_op_name(p->op),
             lj_dtype_name(p->dtype), p->B, p->H, p->N, p->D, p->E, steps, p->decay ? " decay" : "",
             p->has_initial ? " initial" : "", p->has_final ? " final" : "",
             p->varlen ? " varlen" : "", p->vk ? " vk" : "", p->want_ds ? " ds" : "",
             p->has_dsn ? " dsn" : "", p->step_states ? " step_states" : "",
             p->state_only ? " state_only" : "", extra);
}
