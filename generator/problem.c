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
    if (strcmp(key, "dtype") == 0) {
        if (!lj_dtype_parse(value, &p->dtype))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "dtype=%s: expected f32, f16 or bf16",
                            value);
        return LAJIT_OK;
    }
    long long v;
    if (!parse_int(value, &v))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s=%s: expected an integer", key, value);
    /* D, E, B, H, N, T are problem sizes even though they are capitals. */
    int *field = problem_field(p, key);
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

lajit_status lj_assign_all(lj_env *env, lj_family *f, const char *const *assignments, size_t n,
                           const lj_device_info *dev, lj_problem *p, lj_config *cfg)
{
    lajit_status st = LAJIT_OK;
    for (size_t i = 0; i < n && st == LAJIT_OK; i++) {
        if (!assignments[i])
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "assignment %zu is NULL", i);
        if (!lj_assignment_is_parameter(assignments[i]))
            st = lj_assign(env, f, assignments[i], p, cfg);
    }
    if (st == LAJIT_OK)
        st = lj_family_default(f, p, dev, cfg);
    for (size_t i = 0; i < n && st == LAJIT_OK; i++)
        if (lj_assignment_is_parameter(assignments[i]))
            st = lj_assign(env, f, assignments[i], p, cfg);
    return st;
}

void lj_problem_format(const lj_problem *p, char *out, size_t cap)
{
    char steps[16] = "";
    if (p->op == LJ_OP_DECODE)
        snprintf(steps, sizeof steps, " T=%d", p->T);
    else if (p->op == LJ_OP_BWD)
        snprintf(steps, sizeof steps, " part=%d", p->part);
    snprintf(out, cap, "%s %s B=%d H=%d N=%d D=%d E=%d%s%s%s%s%s%s%s%s%s", lj_op_name(p->op),
             lj_dtype_name(p->dtype), p->B, p->H, p->N, p->D, p->E, steps, p->decay ? " decay" : "",
             p->has_initial ? " initial" : "", p->has_final ? " final" : "",
             p->varlen ? " varlen" : "", p->vk ? " vk" : "", p->want_ds ? " ds" : "",
             p->has_dsn ? " dsn" : "", p->step_states ? " step_states" : "");
}
