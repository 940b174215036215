/* family.c — kernel families: loading a family.lua spec into the sandbox and checking its
 * shape (family.h has the contract), the configuration space it declares, and the small name
 * tables and offline arch table. What the spec declares (params, problems, archs, uses) is read
 * once, in a protected call, by raw access, and copied into C: a spec's functions cannot change
 * it afterwards, and no metamethod of a hostile table runs outside the sandbox's limits.
 * Calling the spec's functions is family_call.c; the text it is tuned under, family_text.c. */
#include "family_impl.h"
#include "problem.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>

static int op_parse(const char *s, lj_op *out);

/* ---- Names and the arch table ------------------------------------------------------------- */

const char *lj_op_name(lj_op op)
{
    switch (op) {
        case LJ_OP_FWD: return "fwd";
        case LJ_OP_BWD: return "bwd";
        case LJ_OP_DECODE: return "decode";
        case LJ_OP_CUSTOM: return "custom";
    }
    return "?";
}

const char *lj_dtype_name(lj_dtype dt)
{
    switch (dt) {
        case LJ_F32: return "f32";
        case LJ_F16: return "f16";
        case LJ_BF16: return "bf16";
    }
    return "?";
}

int lj_dtype_parse(const char *s, lj_dtype *out)
{
    static const struct {
        const char *name;
        lj_dtype dt;
    } names[] = {{"f32", LJ_F32},  {"fp32", LJ_F32},    {"float32", LJ_F32}, {"f16", LJ_F16},
                 {"fp16", LJ_F16}, {"float16", LJ_F16}, {"bf16", LJ_BF16},   {"bfloat16", LJ_BF16}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].dt;
            return 1;
        }
    }
    return 0;
}

static int op_parse(const char *s, lj_op *out)
{
    for (int op = LJ_OP_FWD; op <= LJ_OP_CUSTOM; op++) {
        if (strcmp(s, lj_op_name((lj_op)op)) == 0) {
            *out = (lj_op)op;
            return 1;
        }
    }
    return 0;
}

/* Offline targets: what `valid` and `default` see when compiling without a device. The figures
 * are the products these archs name (A100, RTX 30, RTX 40/L4, H100 SXM, B200, RTX 50). */
int lj_device_info_for_arch(const char *arch, lj_device_info *info)
{
    static const lj_device_info table[] = {
        {"sm_80", 80, 108, 166912, 167936, 65536, 40 << 20, "offline sm_80"},
        {"sm_86", 86, 84, 101376, 102400, 65536, 6 << 20, "offline sm_86"},
        {"sm_89", 89, 58, 101376, 102400, 65536, 48 << 20, "offline sm_89"},
        {"sm_90a", 90, 132, 232448, 233472, 65536, 50 << 20, "offline sm_90a"},
        {"sm_100a", 100, 148, 232448, 233472, 65536, 126 << 20, "offline sm_100a"},
        {"sm_120", 120, 84, 101376, 102400, 65536, 64 << 20, "offline sm_120"},
    };
    if (!arch)
        return 0;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(arch, table[i].arch) == 0) {
            *info = table[i];
            return 1;
        }
    }
    return 0;
}

void lj_arch_for_cc(int cc, char arch[16])
{
    /* The arch-specific ("a") targets unlock wgmma, setmaxnreg and tcgen05 where they exist. */
    if (cc == 90 || cc == 100 || cc == 101 || cc == 103)
        snprintf(arch, 16, "sm_%da", cc);
    else
        snprintf(arch, 16, "sm_%d", cc);
}

/* ---- Configurations ------------------------------------------------------------------------- */

long long lj_config_get(const lj_config *cfg, const char *name, long long fallback)
{
    for (int i = 0; i < cfg->n; i++)
        if (strcmp(cfg->names[i], name) == 0)
            return cfg->values[i];
    return fallback;
}

void lj_config_format(const lj_config *cfg, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < cfg->n && used < cap; i++) {
        int n = snprintf(out + used, cap - used, "%s%s=%lld", i ? " " : "", cfg->names[i],
                         cfg->values[i]);
        if (n < 0)
            break;
        used += (size_t)n;
    }
}

/* ---- Loading and the spec's shape ----------------------------------------------------------- */

int lj_rawgetfield(lua_State *L, int t, const char *key)
{
    t = lua_absindex(L, t);
    lua_pushstring(L, key);
    return lua_rawget(L, t);
}

/* Reads the problem table at idx. Integers must fit an int (no shape is negative), booleans are
 * booleans or integers. */
const char *lj_read_problem(lua_State *L, int idx, lj_op family_op, lj_problem *p, char *err,
                            size_t cap)
{
    int top = lua_gettop(L);
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx))
        return "a problem is not a table";
    memset(p, 0, sizeof *p);
    p->op = family_op;
    p->dtype = LJ_BF16;
    p->T = 1;
    const char *msg = NULL;
    int t = lj_rawgetfield(L, idx, "op");
    if ((t == LUA_TSTRING && (!op_parse(lua_tostring(L, -1), &p->op) || p->op == LJ_OP_CUSTOM)) ||
        (t != LUA_TSTRING && t != LUA_TNIL))
        msg = "problem.op must be fwd, bwd or decode";
    lua_settop(L, top);
    t = msg ? LUA_TNIL : lj_rawgetfield(L, idx, "dtype");
    if (!msg && ((t == LUA_TSTRING && !lj_dtype_parse(lua_tostring(L, -1), &p->dtype)) ||
                 (t != LUA_TSTRING && t != LUA_TNIL)))
        msg = "problem.dtype must be f32, f16 or bf16";
    lua_settop(L, top);
    /* Storage of the states and the dtype of o (absent: f32 states, o of dtype). */
    lj_dtype sdt = LJ_F32, odt = p->dtype;
    t = msg ? LUA_TNIL : lj_rawgetfield(L, idx, "state_dtype");
    if (!msg && ((t == LUA_TSTRING && !lj_dtype_parse(lua_tostring(L, -1), &sdt)) ||
                 (t != LUA_TSTRING && t != LUA_TNIL)))
        msg = "problem.state_dtype must be f32, f16 or bf16";
    lua_settop(L, top);
    t = msg ? LUA_TNIL : lj_rawgetfield(L, idx, "out_dtype");
    if (!msg && ((t == LUA_TSTRING && !lj_dtype_parse(lua_tostring(L, -1), &odt)) ||
                 (t != LUA_TSTRING && t != LUA_TNIL)))
        msg = "problem.out_dtype must be f32, f16 or bf16";
    lua_settop(L, top);
    p->state_dtype = sdt;
    p->out_dtype = odt != p->dtype ? (int)odt + 1 : 0;
    const char *name;
    for (size_t i = 0; !msg && (name = lj_problem_field_name(i)) != NULL; i++) {
        t = lj_rawgetfield(L, idx, name);
        int *dst = lj_problem_field(p, i);
        int isnum = 0;
        lua_Integer v = t == LUA_TNUMBER ? lua_tointegerx(L, -1, &isnum) : 0;
        if (t == LUA_TBOOLEAN) {
            *dst = lua_toboolean(L, -1);
        } else if (t == LUA_TNUMBER && isnum && v >= 0 && v <= INT_MAX) {
            *dst = (int)v;
        } else if (t != LUA_TNIL) {
            snprintf(err, cap, "problem.%s must be an integer from 0 to %d or a boolean", name,
                     INT_MAX);
            msg = err;
        }
        lua_settop(L, top);
    }
    if (msg)
        return msg;
    if (p->E == 0)
        p->E = p->D;
    if (p->B == 0)
        p->B = 1;
    if (p->H == 0)
        p->H = 1;
    return NULL;
}

static int compare_param(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* A parameter name: capitals, digits and '_', starting with a capital (it becomes a global of
 * the template and a -p KEY of the CLI). */
static int param_name_ok(const char *s, size_t n)
{
    if (n < 1 || n >= LJ_PARAM_NAME || !(s[0] >= 'A' && s[0] <= 'Z'))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return 0;
    return 1;
}

typedef struct check_args {
    lj_family *f;
    char err[512];
} check_args;

/* Appends a list of names (the spec's archs or uses, at t) to out, comma-separated. */
static const char *read_names(lua_State *L, int t, check_args *a, const char *field, char *out,
                              size_t cap, int max)
{
    int top = lua_gettop(L);
    lj_family *f = a->f;
    lua_Unsigned n = lua_rawlen(L, t);
    if (n > (lua_Unsigned)max) {
        snprintf(a->err, sizeof a->err, "%s/family.lua: %s names at most %d %s", f->name, field,
                 max, strcmp(field, "uses") == 0 ? "folders" : "archs");
        return a->err;
    }
    for (lua_Integer j = 1; j <= (lua_Integer)n; j++) {
        lj_device_info info;
        const char *s = lua_rawgeti(L, t, j) == LUA_TSTRING ? lua_tostring(L, -1) : "";
        size_t len = strlen(s);
        int ok = len > 0 && len == lua_rawlen(L, -1) && strlen(out) + len + 2 <= cap;
        if (strcmp(field, "archs") == 0) {
            ok = ok && lj_device_info_for_arch(s, &info);
        } else {
            for (const char *c = s; *c; c++)
                ok &= (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_';
            ok = ok && strcmp(s, f->name) != 0 && strcmp(s, "common") != 0;
        }
        if (!ok) {
            if (strcmp(field, "archs") == 0)
                snprintf(a->err, sizeof a->err, "%s/family.lua: archs[%d] is not a known arch",
                         f->name, (int)j);
            else
                snprintf(a->err, sizeof a->err,
                         "%s/family.lua: uses[%d] must name another family's template folder",
                         f->name, (int)j);
            lua_settop(L, top);
            return a->err;
        }
        if (out[0])
            strcat(out, ",");
        strcat(out, s);
        lua_settop(L, top);
    }
    return NULL;
}

/* The params table at t: names sorted (the config order), each a list of distinct integers;
 * the product of the list lengths at most LJ_MAX_CONFIGS. */
static const char *read_params(lua_State *L, int t, check_args *a)
{
    lj_family *f = a->f;
    int top = lua_gettop(L);
    lua_pushnil(L);
    while (lua_next(L, t)) {
        lua_pop(L, 1);
        size_t n = 0;
        const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &n) : "";
        if (!param_name_ok(k, n) || f->n_params == LJ_MAX_PARAMS) {
            snprintf(a->err, sizeof a->err,
                     "%s/family.lua: parameter names must be capitals, digits and _ "
                     "(1 to %d characters, e.g. TILE_V), at most %d of them",
                     f->name, LJ_PARAM_NAME - 1, LJ_MAX_PARAMS);
            lua_settop(L, top);
            return a->err;
        }
        snprintf(f->param_names[f->n_params++], LJ_PARAM_NAME, "%s", k);
    }
    qsort(f->param_names, (size_t)f->n_params, LJ_PARAM_NAME, compare_param);
    long long space = 1;
    for (int i = 0; i < f->n_params; i++) {
        const char *pn = f->param_names[i];
        lua_Unsigned n = lj_rawgetfield(L, t, pn) == LUA_TTABLE ? lua_rawlen(L, -1) : 0;
        if (n == 0 || n > LJ_MAX_PARAM_VALUES) {
            snprintf(a->err, sizeof a->err,
                     "%s/family.lua: params.%s must be a list of 1 to %d integers", f->name, pn,
                     LJ_MAX_PARAM_VALUES);
            lua_settop(L, top);
            return a->err;
        }
        space *= (long long)n;
        if (space > LJ_MAX_CONFIGS) {
            snprintf(a->err, sizeof a->err,
                     "%s/family.lua: the parameter space has over %d configurations "
                     "(the product of the params' value counts)",
                     f->name, LJ_MAX_CONFIGS);
            lua_settop(L, top);
            return a->err;
        }
        f->param_values[i] = lj_malloc(f->env, sizeof(long long) * (size_t)n);
        if (!f->param_values[i]) {
            lua_settop(L, top);
            return "";
        }
        for (lua_Integer j = 1; j <= (lua_Integer)n; j++) {
            int isnum = 0;
            lua_Integer v =
                lua_rawgeti(L, -1, j) == LUA_TNUMBER ? lua_tointegerx(L, -1, &isnum) : 0;
            lua_pop(L, 1);
            for (lua_Integer k = 1; isnum && k < j; k++)
                isnum = f->param_values[i][k - 1] != (long long)v;
            if (!isnum) {
                snprintf(a->err, sizeof a->err,
                         "%s/family.lua: params.%s[%d] is not an integer or repeats "
                         "one before it",
                         f->name, pn, (int)j);
                lua_settop(L, top);
                return a->err;
            }
            f->param_values[i][j - 1] = (long long)v;
        }
        f->param_counts[i] = (int)n;
        lua_settop(L, top);
    }
    return NULL;
}

/* Checks the spec table (argument 1) and copies what it declares into the family (argument 2,
 * a check_args). Protected: raises only for memory; shape errors go to check_args.err. */
static int check_spec(lua_State *L)
{
    check_args *a = lua_touserdata(L, 2);
    lj_family *f = a->f;
    const char *name = f->name;
    const char *err = NULL;
    lua_settop(L, 1);
    if (!lua_istable(L, 1)) {
        snprintf(a->err, sizeof a->err, "%s/family.lua must return a table", name);
        return 0;
    }
    if (lj_rawgetfield(L, 1, "name") != LUA_TSTRING || strcmp(lua_tostring(L, -1), name) != 0)
        snprintf(a->err, sizeof a->err, "%s/family.lua: name must be \"%s\"", name, name);
    else if (lj_rawgetfield(L, 1, "op") != LUA_TSTRING || !op_parse(lua_tostring(L, -1), &f->op))
        snprintf(a->err, sizeof a->err, "%s/family.lua: op must be fwd, bwd, decode or custom",
                 name);
    lua_settop(L, 1);
    if (a->err[0])
        return 0;
    static const char *const fns[] = {"valid", "default", "key", "launch", "source"};
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        if (lj_rawgetfield(L, 1, fns[i]) != LUA_TFUNCTION) {
            snprintf(a->err, sizeof a->err, "%s/family.lua: %s must be a function", name, fns[i]);
            return 0;
        }
        lua_settop(L, 1);
    }
    /* Optional: the archs the family serves (an arch-specific family such as la_fwd_sm90). */
    int t = lj_rawgetfield(L, 1, "archs");
    if (t == LUA_TTABLE)
        read_names(L, 2, a, "archs", f->archs, sizeof f->archs, 16);
    else if (t != LUA_TNIL)
        snprintf(a->err, sizeof a->err, "%s/family.lua: archs must be a list of arch names", name);
    lua_settop(L, 1);
    if (a->err[0])
        return 0;
    /* Optional: template folders besides its own whose files its kernels are built from. */
    t = lj_rawgetfield(L, 1, "uses");
    if (t == LUA_TTABLE)
        read_names(L, 2, a, "uses", f->uses, sizeof f->uses, LJ_MAX_USES);
    else if (t != LUA_TNIL)
        snprintf(a->err, sizeof a->err, "%s/family.lua: uses must be a list of folder names", name);
    lua_settop(L, 1);
    if (a->err[0])
        return 0;
    /* A custom family's arguments, before its problems (which are made of their symbols). */
    if (f->op == LJ_OP_CUSTOM) {
        char aerr[400];
        const char *e = lj_read_args(L, 1, &f->args, aerr, sizeof aerr);
        lua_settop(L, 1);
        if (e) {
            snprintf(a->err, sizeof a->err, "%s/family.lua: %s", name, e);
            return 0;
        }
    } else if (lj_rawgetfield(L, 1, "args") != LUA_TNIL) {
        snprintf(a->err, sizeof a->err, "%s/family.lua: args is for op \"custom\" only", name);
        return 0;
    }
    lua_settop(L, 1);
    lua_Unsigned np = lj_rawgetfield(L, 1, "problems") == LUA_TTABLE ? lua_rawlen(L, 2) : 0;
    if (np == 0 || np > LJ_MAX_PROBLEMS) {
        snprintf(a->err, sizeof a->err,
                 "%s/family.lua: problems must be a list of 1 to %d problems", name,
                 LJ_MAX_PROBLEMS);
        return 0;
    }
    for (lua_Integer i = 1; i <= (lua_Integer)np; i++) {
        char perr[160];
        lua_rawgeti(L, 2, i);
        const char *e =
            f->op == LJ_OP_CUSTOM
                ? lj_read_custom_problem(L, 3, &f->args, &f->problems[i - 1], perr, sizeof perr)
                : lj_read_problem(L, 3, f->op, &f->problems[i - 1], perr, sizeof perr);
        lua_settop(L, 2);
        if (e) {
            snprintf(a->err, sizeof a->err, "%s/family.lua: problems[%d]: %s", name, (int)i, e);
            return 0;
        }
    }
    f->n_problems = (int)np;
    lua_settop(L, 1);
    if (lj_rawgetfield(L, 1, "params") != LUA_TTABLE) {
        snprintf(a->err, sizeof a->err, "%s/family.lua: params must be a table", name);
        return 0;
    }
    err = read_params(L, 2, a);
    if (err && !err[0])
        return luaL_error(L, "not enough memory"); /* reported as out of memory below */
    return 0;
}

static int ref_spec(lua_State *L)
{
    lua_pushinteger(L, luaL_ref(L, LUA_REGISTRYINDEX));
    return 1;
}

lajit_status lj_family_load(lj_env *env, lj_lua *h, const char *name, lj_family **out)
{
    if (!name || !*name || strlen(name) >= 64 || strchr(name, '/') || strchr(name, '.'))
        return lj_error(env, LAJIT_ERR_NOT_FOUND, "no family named \"%s\"", name ? name : "(null)");
    char path[128];
    snprintf(path, sizeof path, "%s/family.lua", name);
    const char *text;
    size_t len;
    lajit_status st = lj_lua_read_template(h, path, &text, &len);
    if (st != LAJIT_OK) {
        if (st == LAJIT_ERR_NOT_FOUND)
            return lj_error(env, LAJIT_ERR_NOT_FOUND, "no family named \"%s\"", name);
        return st;
    }
    lj_family *f = lj_calloc(env, 1, sizeof *f);
    if (!f)
        return lj_oom(env);
    f->h = h;
    f->env = env;
    f->ref = LUA_NOREF;
    snprintf(f->name, sizeof f->name, "%s", name);
    /* The load and the shape check draw from the family's budget too. */
    lj_lua_budget_init(&f->budget);
    lj_lua_budget *prev = lj_lua_set_budget(h, &f->budget);
    char chunk[160];
    snprintf(chunk, sizeof chunk, "@%s", path);
    lua_State *L = lj_lua_state(h);
    int top = lua_gettop(L);
    check_args a;
    a.f = f;
    a.err[0] = 0;
    st = lj_lua_load(h, text, len, chunk);
    if (st == LAJIT_OK)
        st = lj_lua_pcall(h, 0, 1); /* the spec table (or whatever the chunk returned) */
    if (st == LAJIT_OK && !lua_checkstack(L, 4))
        st = lj_oom(env);
    if (st == LAJIT_OK) {
        lua_pushcfunction(L, check_spec);
        lua_pushvalue(L, -2);
        lua_pushlightuserdata(L, &a);
        st = lj_lua_pcall(h, 2, 0);
        if (st == LAJIT_ERR_TEMPLATE) /* check_spec raises only for memory */
            st = lj_oom(env);
        else if (st == LAJIT_OK && a.err[0])
            st = lj_error(env, LAJIT_ERR_TEMPLATE, "%s", a.err);
    }
    if (st == LAJIT_OK) {
        /* luaL_ref allocates, so it runs protected. */
        lua_pushcfunction(L, ref_spec);
        lua_insert(L, -2);
        st = lj_lua_pcall(h, 1, 1);
        if (st == LAJIT_OK) {
            int isnum = 0;
            lua_Integer ref = lua_tointegerx(L, -1, &isnum);
            if (!isnum || ref == LUA_REFNIL || ref == LUA_NOREF || ref < INT_MIN || ref > INT_MAX)
                st = lj_error(env, LAJIT_ERR_INTERNAL, "cannot keep the spec of %s", name);
            else
                f->ref = (int)ref;
        }
    }
    lua_settop(L, top);
    lj_lua_set_budget(h, prev);
    if (st != LAJIT_OK) {
        lj_family_free(f);
        return st;
    }
    *out = f;
    return LAJIT_OK;
}

void lj_family_free(lj_family *f)
{
    if (!f)
        return;
    if (f->ref != LUA_NOREF && f->ref != LUA_REFNIL)
        luaL_unref(lj_lua_state(f->h), LUA_REGISTRYINDEX, f->ref);
    for (int i = 0; i < LJ_MAX_PARAMS; i++)
        lj_free(f->env, f->param_values[i]);
    lj_free(f->env, f);
}

int lj_family_serves(const lj_family *f, const char *arch)
{
    if (!f->archs[0])
        return 1;
    size_t n = strlen(arch);
    for (const char *p = f->archs; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (strncmp(p, arch, n) == 0 && (p[n] == ',' || p[n] == 0))
            return 1;
    return 0;
}

const char *lj_family_name(const lj_family *f)
{
    return f->name;
}

void lj_family_push_spec(const lj_family *f)
{
    lua_rawgeti(lj_lua_state(f->h), LUA_REGISTRYINDEX, f->ref);
}

lj_op lj_family_op(const lj_family *f)
{
    return f->op;
}

const lj_args_decl *lj_family_args(const lj_family *f)
{
    return f->op == LJ_OP_CUSTOM ? &f->args : NULL;
}

int lj_family_param_count(const lj_family *f)
{
    return f->n_params;
}

const char *lj_family_param_name(const lj_family *f, int i)
{
    return f->param_names[i];
}

int lj_family_param_values(const lj_family *f, int i, const long long **values)
{
    *values = f->param_values[i];
    return f->param_counts[i];
}

lajit_status lj_family_all_configs(lj_family *f, lj_config **configs, int *count)
{
    /* The load capped the product at LJ_MAX_CONFIGS; checked again, as it sizes an array. */
    long long total = 1;
    for (int i = 0; i < f->n_params; i++) {
        total *= f->param_counts[i];
        if (total > LJ_MAX_CONFIGS)
            return lj_error(f->env, LAJIT_ERR_TEMPLATE,
                            "%s: parameter space over %d configurations", f->name, LJ_MAX_CONFIGS);
    }
    lj_config *c = lj_calloc(f->env, (size_t)total, sizeof *c);
    if (!c)
        return lj_oom(f->env);
    for (long long k = 0; k < total; k++) {
        long long r = k;
        c[k].n = f->n_params;
        /* The last parameter varies fastest. */
        for (int i = f->n_params - 1; i >= 0; i--) {
            memcpy(c[k].names[i], f->param_names[i], LJ_PARAM_NAME);
            c[k].values[i] = f->param_values[i][r % f->param_counts[i]];
            r /= f->param_counts[i];
        }
    }
    *configs = c;
    *count = (int)total;
    return LAJIT_OK;
}

lajit_status lj_family_problems(lj_family *f, lj_problem **problems, int *count)
{
    lj_problem *p = lj_malloc(f->env, sizeof *p * (size_t)f->n_problems);
    if (!p)
        return lj_oom(f->env);
    memcpy(p, f->problems, sizeof *p * (size_t)f->n_problems);
    *problems = p;
    *count = f->n_problems;
    return LAJIT_OK;
}
