/* family.c — kernel families: load a family.lua spec into the sandbox, check its shape, and call
 * its functions with problems, devices and configurations converted to and from Lua tables
 * (family.h has the contract). Also the small name tables and the offline arch table. */
#include "family.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "embedded.h"
#include "template.h"

/* How many other template folders a spec's `uses` may name. */
#define LJ_MAX_USES 6

struct lj_family {
    lj_lua *h;
    lj_env *env;
    int ref; /* the spec table in the registry */
    char name[64];
    lj_op op;
    int n_params;
    char param_names[LJ_MAX_PARAMS][LJ_PARAM_NAME];
    long long *param_values[LJ_MAX_PARAMS];
    int param_counts[LJ_MAX_PARAMS];
    char archs[128]; /* the archs the family serves, comma-separated; empty: every arch */
    char uses[128];  /* up to LJ_MAX_USES other template folders its kernels come from,
                        comma-separated (la_bwd expands la_fwd/fwd.cu): part of its template
                        text, so of its tuning hash */
};

/* ---- Names and the arch table ------------------------------------------------------------- */

const char *lj_op_name(lj_op op)
{
    switch (op) {
    case LJ_OP_FWD: return "fwd";
    case LJ_OP_BWD: return "bwd";
    case LJ_OP_DECODE: return "decode";
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
    } names[] = {{"f32", LJ_F32},  {"fp32", LJ_F32},   {"float32", LJ_F32},
                 {"f16", LJ_F16},  {"fp16", LJ_F16},   {"float16", LJ_F16},
                 {"bf16", LJ_BF16}, {"bfloat16", LJ_BF16}};
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
    for (int op = LJ_OP_FWD; op <= LJ_OP_DECODE; op++) {
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

/* ---- Conversions ---------------------------------------------------------------------------- */

static void set_int(lua_State *L, const char *k, long long v)
{
    lua_pushinteger(L, (lua_Integer)v);
    lua_setfield(L, -2, k);
}

static void set_bool(lua_State *L, const char *k, int v)
{
    lua_pushboolean(L, v);
    lua_setfield(L, -2, k);
}

static void set_str(lua_State *L, const char *k, const char *v)
{
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}

/* Pushers run inside protected calls (they allocate). */
static void push_problem(lua_State *L, const lj_problem *p)
{
    lua_createtable(L, 0, 20);
    set_str(L, "op", lj_op_name(p->op));
    set_str(L, "dtype", lj_dtype_name(p->dtype));
    set_int(L, "B", p->B);
    set_int(L, "H", p->H);
    set_int(L, "N", p->N);
    set_int(L, "D", p->D);
    set_int(L, "E", p->E);
    set_int(L, "T", p->T);
    set_bool(L, "decay", p->decay);
    set_bool(L, "has_initial", p->has_initial);
    set_bool(L, "has_final", p->has_final);
    set_bool(L, "varlen", p->varlen);
    set_bool(L, "vk", p->vk);
    set_bool(L, "want_ds", p->want_ds);
    set_bool(L, "has_dsn", p->has_dsn);
    set_bool(L, "step_states", p->step_states);
    set_int(L, "part", p->part);
}

static void push_device(lua_State *L, const lj_device_info *d)
{
    lua_createtable(L, 0, 8);
    set_str(L, "arch", d->arch);
    set_int(L, "cc", d->cc);
    set_int(L, "sms", d->sms);
    set_int(L, "smem_optin", d->smem_optin);
    set_int(L, "smem_per_sm", d->smem_per_sm);
    set_int(L, "regs_per_sm", d->regs_per_sm);
    set_int(L, "l2_bytes", d->l2_bytes);
    set_str(L, "name", d->name);
}

static void push_config(lua_State *L, const lj_config *c)
{
    lua_createtable(L, 0, c->n);
    for (int i = 0; i < c->n; i++)
        set_int(L, c->names[i], c->values[i]);
}

/* Reads the problem table at idx; missing fields take neutral values. Returns an error text or
 * NULL. */
static const char *read_problem(lua_State *L, int idx, lj_op family_op, lj_problem *p)
{
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx))
        return "a problem is not a table";
    memset(p, 0, sizeof *p);
    p->op = family_op;
    p->dtype = LJ_BF16;
    p->T = 1;
    if (lua_getfield(L, idx, "op") == LUA_TSTRING && !op_parse(lua_tostring(L, -1), &p->op)) {
        lua_pop(L, 1);
        return "problem.op must be fwd, bwd or decode";
    }
    lua_pop(L, 1);
    if (lua_getfield(L, idx, "dtype") == LUA_TSTRING && !lj_dtype_parse(lua_tostring(L, -1), &p->dtype)) {
        lua_pop(L, 1);
        return "problem.dtype must be f32, f16 or bf16";
    }
    lua_pop(L, 1);
    static const struct {
        const char *name;
        size_t off;
        int boolean;
    } fields[] = {
        {"B", offsetof(lj_problem, B), 0},           {"H", offsetof(lj_problem, H), 0},
        {"N", offsetof(lj_problem, N), 0},           {"D", offsetof(lj_problem, D), 0},
        {"E", offsetof(lj_problem, E), 0},           {"T", offsetof(lj_problem, T), 0},
        {"decay", offsetof(lj_problem, decay), 1},   {"has_initial", offsetof(lj_problem, has_initial), 1},
        {"has_final", offsetof(lj_problem, has_final), 1}, {"varlen", offsetof(lj_problem, varlen), 1},
        {"vk", offsetof(lj_problem, vk), 1},         {"want_ds", offsetof(lj_problem, want_ds), 1},
        {"has_dsn", offsetof(lj_problem, has_dsn), 1}, {"step_states", offsetof(lj_problem, step_states), 1},
        {"part", offsetof(lj_problem, part), 0},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        int t = lua_getfield(L, idx, fields[i].name);
        int *dst = (int *)((char *)p + fields[i].off);
        if (t == LUA_TBOOLEAN)
            *dst = lua_toboolean(L, -1);
        else if (t == LUA_TNUMBER && lua_isinteger(L, -1))
            *dst = (int)lua_tointeger(L, -1);
        else if (t != LUA_TNIL) {
            lua_pop(L, 1);
            return "a problem field has the wrong type";
        }
        lua_pop(L, 1);
    }
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

/* Reads a cfg table: every parameter of the family must be present with an integer value. */
static const char *read_config(lua_State *L, int idx, const lj_family *f, lj_config *c)
{
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx))
        return "a configuration is not a table";
    memset(c, 0, sizeof *c);
    c->n = f->n_params;
    for (int i = 0; i < f->n_params; i++) {
        memcpy(c->names[i], f->param_names[i], LJ_PARAM_NAME);
        lua_getfield(L, idx, f->param_names[i]);
        if (!lua_isinteger(L, -1)) {
            lua_pop(L, 1);
            return "a configuration lacks a parameter or gives a non-integer value";
        }
        c->values[i] = (long long)lua_tointeger(L, -1);
        lua_pop(L, 1);
    }
    return NULL;
}

/* ---- Calling the spec ----------------------------------------------------------------------- */

/* Pushes spec[fn]; error if it is not a function. */
static lajit_status push_fn(lj_family *f, const char *fn)
{
    lua_State *L = lj_lua_state(f->h);
    if (!lua_checkstack(L, 8))
        return lj_oom(f->env);
    lua_rawgeti(L, LUA_REGISTRYINDEX, f->ref);
    lua_getfield(L, -1, fn);
    lua_remove(L, -2);
    if (!lua_isfunction(L, -1)) {
        lua_pop(L, 1);
        return lj_error(f->env, LAJIT_ERR_TEMPLATE, "%s: spec has no function %s", f->name, fn);
    }
    return LAJIT_OK;
}

typedef struct call_args {
    const lj_config *c;
    const lj_problem *p;
    const lj_device_info *d;
} call_args;

/* A protected trampoline: spec function and its arguments are built inside the pcall so that
 * allocation failures while building tables are caught. Stack in: fn (the spec's), lightuserdata
 * call_args, integer mask (1 cfg, 2 problem, 4 device). */
static int trampoline(lua_State *L)
{
    const call_args *a = lua_touserdata(L, 2);
    int mask = (int)lua_tointeger(L, 3);
    lua_pushvalue(L, 1);
    int n = 0;
    if (mask & 1) {
        push_config(L, a->c);
        n++;
    }
    if (mask & 2) {
        push_problem(L, a->p);
        n++;
    }
    if (mask & 4) {
        push_device(L, a->d);
        n++;
    }
    lua_call(L, n, 2);
    return 2;
}

/* Calls spec[fn] with the arguments named by mask; leaves 2 results on the stack. */
static lajit_status call(lj_family *f, const char *fn, int mask, const lj_config *c,
                         const lj_problem *p, const lj_device_info *d)
{
    lua_State *L = lj_lua_state(f->h);
    call_args a = {c, p, d};
    lajit_status st = push_fn(f, fn);
    if (st != LAJIT_OK)
        return st;
    lua_pushcfunction(L, trampoline);
    lua_insert(L, -2);
    lua_pushlightuserdata(L, &a);
    lua_pushinteger(L, mask);
    st = lj_lua_pcall(f->h, 3, 2);
    if (st != LAJIT_OK)
        lj_error_prefix(f->env, "%s.%s", f->name, fn);
    return st;
}

/* ---- Loading -------------------------------------------------------------------------------- */

static lajit_status check_spec(lj_family *f, const char *name)
{
    lua_State *L = lj_lua_state(f->h);
    lj_env *env = f->env;
    int spec = lua_gettop(L);
    if (!lua_istable(L, spec))
        return lj_error(env, LAJIT_ERR_TEMPLATE, "%s/family.lua must return a table", name);
    if (lua_getfield(L, spec, "name") != LUA_TSTRING || strcmp(lua_tostring(L, -1), name) != 0) {
        lua_pop(L, 1);
        return lj_error(env, LAJIT_ERR_TEMPLATE, "%s/family.lua: name must be \"%s\"", name, name);
    }
    lua_pop(L, 1);
    if (lua_getfield(L, spec, "op") != LUA_TSTRING || !op_parse(lua_tostring(L, -1), &f->op)) {
        lua_pop(L, 1);
        return lj_error(env, LAJIT_ERR_TEMPLATE, "%s/family.lua: op must be fwd, bwd or decode", name);
    }
    lua_pop(L, 1);
    static const char *const fns[] = {"valid", "default", "key", "launch", "source"};
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        if (lua_getfield(L, spec, fns[i]) != LUA_TFUNCTION) {
            lua_pop(L, 1);
            return lj_error(env, LAJIT_ERR_TEMPLATE, "%s/family.lua: %s must be a function", name, fns[i]);
        }
        lua_pop(L, 1);
    }
    /* Optional: the archs the family serves (an arch-specific family such as la_fwd_sm90). */
    int t = lua_getfield(L, spec, "archs");
    if (t == LUA_TTABLE) {
        lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
        for (lua_Integer j = 1; j <= n; j++) {
            lj_device_info info;
            if (lua_rawgeti(L, -1, j) != LUA_TSTRING || !lj_device_info_for_arch(lua_tostring(L, -1), &info) ||
                strlen(f->archs) + lua_rawlen(L, -1) + 2 > sizeof f->archs) {
                lua_pop(L, 2);
                return lj_error(env, LAJIT_ERR_TEMPLATE, "%s/family.lua: archs[%d] is not a known arch", name, (int)j);
            }
            if (f->archs[0])
                strcat(f->archs, ",");
            strcat(f->archs, lua_tostring(L, -1));
            lua_pop(L, 1);
        }
    } else if (t != LUA_TNIL) {
        lua_pop(L, 1);
        return lj_error(env, LAJIT_ERR_TEMPLATE, "%s/family.lua: archs must be a list of arch names", name);
    }
    lua_pop(L, 1);
    /* Optional: template folders besides its own whose files its kernels are built from. */
    t = lua_getfield(L, spec, "uses");
    if (t == LUA_TTABLE) {
        lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
        if (n > LJ_MAX_USES) {
            lua_pop(L, 1);
            return lj_error(env, LAJIT_ERR_TEMPLATE, "%s/family.lua: uses names at most %d folders", name,
                            LJ_MAX_USES);
        }
        for (lua_Integer j = 1; j <= n; j++) {
            const char *u = lua_rawgeti(L, -1, j) == LUA_TSTRING ? lua_tostring(L, -1) : "";
            int simple = u[0] != 0;
            for (const char *c = u; *c; c++)
                simple &= (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_';
            if (!simple || strcmp(u, name) == 0 || strcmp(u, "common") == 0 ||
                strlen(f->uses) + strlen(u) + 2 > sizeof f->uses) {
                lua_pop(L, 2);
                return lj_error(env, LAJIT_ERR_TEMPLATE,
                                "%s/family.lua: uses[%d] must name another family's template folder", name, (int)j);
            }
            if (f->uses[0])
                strcat(f->uses, ",");
            strcat(f->uses, u);
            lua_pop(L, 1);
        }
    } else if (t != LUA_TNIL) {
        lua_pop(L, 1);
        return lj_error(env, LAJIT_ERR_TEMPLATE, "%s/family.lua: uses must be a list of folder names", name);
    }
    lua_pop(L, 1);
    if (lua_getfield(L, spec, "problems") != LUA_TTABLE || lua_rawlen(L, -1) == 0) {
        lua_pop(L, 1);
        return lj_error(env, LAJIT_ERR_TEMPLATE, "%s/family.lua: problems must be a non-empty list", name);
    }
    lua_pop(L, 1);
    if (lua_getfield(L, spec, "params") != LUA_TTABLE) {
        lua_pop(L, 1);
        return lj_error(env, LAJIT_ERR_TEMPLATE, "%s/family.lua: params must be a table", name);
    }
    /* Collect names, sort, then read each list (sorted order is the config order). */
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING || lua_rawlen(L, -1) >= LJ_PARAM_NAME || f->n_params == LJ_MAX_PARAMS) {
            lua_pop(L, 2);
            return lj_error(env, LAJIT_ERR_TEMPLATE, "%s/family.lua: parameter names must be strings "
                            "of fewer than %d characters, at most %d of them", name, LJ_PARAM_NAME, LJ_MAX_PARAMS);
        }
        snprintf(f->param_names[f->n_params++], LJ_PARAM_NAME, "%s", lua_tostring(L, -1));
    }
    qsort(f->param_names, (size_t)f->n_params, LJ_PARAM_NAME, compare_param);
    for (int i = 0; i < f->n_params; i++) {
        lua_getfield(L, -1, f->param_names[i]);
        lua_Integer n = lua_istable(L, -1) ? (lua_Integer)lua_rawlen(L, -1) : 0;
        if (n <= 0 || n > 64) {
            lua_pop(L, 2);
            return lj_error(env, LAJIT_ERR_TEMPLATE, "%s/family.lua: params.%s must be a list of 1 to 64 integers",
                            name, f->param_names[i]);
        }
        f->param_values[i] = lj_malloc(env, sizeof(long long) * (size_t)n);
        if (!f->param_values[i]) {
            lua_pop(L, 2);
            return lj_oom(env);
        }
        for (lua_Integer j = 1; j <= n; j++) {
            lua_rawgeti(L, -1, j);
            if (!lua_isinteger(L, -1)) {
                lua_pop(L, 3);
                return lj_error(env, LAJIT_ERR_TEMPLATE, "%s/family.lua: params.%s[%d] is not an integer",
                                name, f->param_names[i], (int)j);
            }
            f->param_values[i][j - 1] = (long long)lua_tointeger(L, -1);
            lua_pop(L, 1);
        }
        f->param_counts[i] = (int)n;
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return LAJIT_OK;
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
    char chunk[160];
    snprintf(chunk, sizeof chunk, "@%s", path);
    lua_State *L = lj_lua_state(h);
    int top = lua_gettop(L);
    if ((st = lj_lua_load(h, text, len, chunk)) != LAJIT_OK)
        return st;
    if ((st = lj_lua_pcall(h, 0, 1)) != LAJIT_OK)
        return st;
    lj_family *f = lj_calloc(env, 1, sizeof *f);
    if (!f) {
        lua_settop(L, top);
        return lj_oom(env);
    }
    f->h = h;
    f->env = env;
    f->ref = LUA_NOREF;
    snprintf(f->name, sizeof f->name, "%s", name);
    st = check_spec(f, name);
    if (st == LAJIT_OK && !lua_checkstack(L, 4))
        st = lj_oom(env);
    if (st == LAJIT_OK) {
        /* luaL_ref allocates, so it runs protected. */
        lua_pushcfunction(L, ref_spec);
        lua_insert(L, -2);
        st = lj_lua_pcall(h, 1, 1);
        if (st == LAJIT_OK) {
            f->ref = (int)lua_tointeger(L, -1);
            if (f->ref == LUA_REFNIL || f->ref == LUA_NOREF)
                st = lj_error(env, LAJIT_ERR_INTERNAL, "cannot keep the spec of %s", name);
        }
    }
    lua_settop(L, top);
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
    for (int i = 0; i < f->n_params; i++)
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

lj_op lj_family_op(const lj_family *f)
{
    return f->op;
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
    long long total = 1;
    for (int i = 0; i < f->n_params; i++) {
        total *= f->param_counts[i];
        if (total > 100000)
            return lj_error(f->env, LAJIT_ERR_TEMPLATE, "%s: parameter space over 100000 points", f->name);
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
    lua_State *L = lj_lua_state(f->h);
    if (!lua_checkstack(L, 4))
        return lj_oom(f->env);
    lua_rawgeti(L, LUA_REGISTRYINDEX, f->ref);
    lua_getfield(L, -1, "problems");
    int n = (int)lua_rawlen(L, -1);
    lj_problem *p = lj_calloc(f->env, (size_t)(n ? n : 1), sizeof *p);
    if (!p) {
        lua_pop(L, 2);
        return lj_oom(f->env);
    }
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, -1, i + 1);
        const char *err = read_problem(L, -1, f->op, &p[i]);
        lua_pop(L, 1);
        if (err) {
            lua_pop(L, 2);
            lj_free(f->env, p);
            return lj_error(f->env, LAJIT_ERR_TEMPLATE, "%s: problems[%d]: %s", f->name, i + 1, err);
        }
    }
    lua_pop(L, 2);
    *problems = p;
    *count = n;
    return LAJIT_OK;
}

lajit_status lj_family_default(lj_family *f, const lj_problem *p, const lj_device_info *d,
                               lj_config *out)
{
    lua_State *L = lj_lua_state(f->h);
    lajit_status st = call(f, "default", 2 | 4, NULL, p, d);
    if (st != LAJIT_OK)
        return st;
    lj_config c;
    const char *err = read_config(L, -2, f, &c);
    lua_pop(L, 2);
    if (err)
        return lj_error(f->env, LAJIT_ERR_TEMPLATE, "%s.default: %s", f->name, err);
    *out = c;
    return LAJIT_OK;
}

lajit_status lj_family_valid(lj_family *f, const lj_config *c, const lj_problem *p,
                             const lj_device_info *d, int *ok, char *reason, size_t cap)
{
    lua_State *L = lj_lua_state(f->h);
    lajit_status st = call(f, "valid", 1 | 2 | 4, c, p, d);
    if (st != LAJIT_OK)
        return st;
    *ok = lua_toboolean(L, -2);
    if (reason && cap) {
        const char *r = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
        if (!*ok && !*r)
            r = "rejected by valid() without a reason";
        snprintf(reason, cap, "%s", *ok ? "" : r);
    }
    lua_pop(L, 2);
    return LAJIT_OK;
}

lajit_status lj_family_key(lj_family *f, const lj_problem *p, char *out, size_t cap)
{
    lua_State *L = lj_lua_state(f->h);
    lajit_status st = call(f, "key", 2, NULL, p, NULL);
    if (st != LAJIT_OK)
        return st;
    if (lua_type(L, -2) != LUA_TSTRING) {
        lua_pop(L, 2);
        return lj_error(f->env, LAJIT_ERR_TEMPLATE, "%s.key must return a string", f->name);
    }
    snprintf(out, cap, "%s", lua_tostring(L, -2));
    lua_pop(L, 2);
    return LAJIT_OK;
}

static const char *read_grid(lua_State *L, int idx, lj_grid_dim *g)
{
    static const struct {
        const char *name;
        lj_grid_var var;
    } vars[] = {{"B", LJ_VAR_B}, {"H", LJ_VAR_H}, {"N", LJ_VAR_N}, {"BH", LJ_VAR_BH},
                {"nseq", LJ_VAR_NSEQ}, {"T", LJ_VAR_T}};
    idx = lua_absindex(L, idx);
    g->mul = 1;
    g->div = 1;
    if (lua_isinteger(L, idx)) {
        g->var = LJ_VAR_ONE;
        g->mul = (long long)lua_tointeger(L, idx);
        return g->mul >= 1 ? NULL : "a grid dimension is below 1";
    }
    const char *name = NULL;
    if (lua_type(L, idx) == LUA_TSTRING) {
        name = lua_tostring(L, idx);
    } else if (lua_istable(L, idx)) {
        lua_rawgeti(L, idx, 1);
        lua_rawgeti(L, idx, 2);
        name = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
        g->div = lua_isinteger(L, -1) ? (long long)lua_tointeger(L, -1) : 0;
        lua_pop(L, 2); /* the name string stays alive: it is interned in the table */
        if (g->div < 1)
            return "a grid entry {var, div} needs an integer div >= 1";
    } else {
        return "a grid entry must be an integer, a variable name or {var, div}";
    }
    for (size_t i = 0; name && i < sizeof vars / sizeof vars[0]; i++) {
        if (strcmp(name, vars[i].name) == 0) {
            g->var = vars[i].var;
            return NULL;
        }
    }
    return "unknown grid variable (B, H, N, BH, nseq, T)";
}

lajit_status lj_family_launch(lj_family *f, const lj_config *c, const lj_problem *p,
                              const lj_device_info *d, lj_launch *out)
{
    lua_State *L = lj_lua_state(f->h);
    lajit_status st = call(f, "launch", 1 | 2 | 4, c, p, d);
    if (st != LAJIT_OK)
        return st;
    lj_launch l;
    memset(&l, 0, sizeof l);
    const char *err = NULL;
    int t = lua_absindex(L, -2);
    if (!lua_istable(L, t))
        err = "must return a table";
    if (!err && (lua_getfield(L, t, "grid") != LUA_TTABLE || lua_rawlen(L, -1) != 3))
        err = "grid must be a list of 3 entries";
    for (int i = 0; !err && i < 3; i++) {
        lua_rawgeti(L, -1, i + 1);
        err = read_grid(L, -1, &l.grid[i]);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    if (!err && (lua_getfield(L, t, "block") != LUA_TTABLE || lua_rawlen(L, -1) != 3))
        err = "block must be a list of 3 integers";
    long long threads = 1;
    for (int i = 0; !err && i < 3; i++) {
        lua_rawgeti(L, -1, i + 1);
        lua_Integer v = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : 0;
        if (v < 1 || v > 1024)
            err = "block entries must be integers from 1 to 1024";
        l.block[i] = (unsigned)v;
        threads *= v;
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    if (!err && threads > 1024)
        err = "a block of more than 1024 threads";
    if (!err) {
        lua_getfield(L, t, "smem");
        lua_Integer v = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : (lua_isnil(L, -1) ? 0 : -1);
        if (v < 0 || v > (1 << 30))
            err = "smem must be a byte count";
        l.smem = (unsigned)v;
        lua_pop(L, 1);
    }
    if (!err) {
        if (lua_getfield(L, t, "entry") != LUA_TSTRING || lua_rawlen(L, -1) == 0 ||
            lua_rawlen(L, -1) >= sizeof l.entry)
            err = "entry must be the kernel's name";
        else
            snprintf(l.entry, sizeof l.entry, "%s", lua_tostring(L, -1));
        lua_pop(L, 1);
    }
    lua_pop(L, 2);
    if (err)
        return lj_error(f->env, LAJIT_ERR_TEMPLATE, "%s.launch: %s", f->name, err);
    *out = l;
    return LAJIT_OK;
}

/* Builds the constants table of a template: cfg params, problem, device, and source().consts.
 * Stack in: source result table at 1, lightuserdata call_args at 2. Returns the table. */
static int build_consts(lua_State *L)
{
    const call_args *a = lua_touserdata(L, 2);
    lua_newtable(L);
    for (int i = 0; i < a->c->n; i++)
        set_int(L, a->c->names[i], a->c->values[i]);
    push_problem(L, a->p);
    lua_setfield(L, -2, "problem");
    push_device(L, a->d);
    lua_setfield(L, -2, "device");
    if (lua_getfield(L, 1, "consts") == LUA_TTABLE) {
        lua_pushnil(L);
        while (lua_next(L, -2)) {
            lua_pushvalue(L, -2);
            lua_insert(L, -2);
            lua_settable(L, -5);
        }
    }
    lua_pop(L, 1);
    return 1;
}

lajit_status lj_family_source(lj_family *f, const lj_config *c, const lj_problem *p,
                              const lj_device_info *d, char **source)
{
    lua_State *L = lj_lua_state(f->h);
    int top = lua_gettop(L);
    lajit_status st = call(f, "source", 1 | 2 | 4, c, p, d);
    if (st != LAJIT_OK)
        return st;
    lua_pop(L, 1); /* keep the first result */
    if (!lua_istable(L, -1) || lua_getfield(L, -1, "template") != LUA_TSTRING) {
        lua_settop(L, top);
        return lj_error(f->env, LAJIT_ERR_TEMPLATE, "%s.source must return {template = \"...\", consts = {...}}",
                        f->name);
    }
    char tpath[256];
    snprintf(tpath, sizeof tpath, "%s", lua_tostring(L, -1));
    lua_pop(L, 1);
    const char *text;
    size_t len;
    st = lj_lua_read_template(f->h, tpath, &text, &len);
    if (st != LAJIT_OK) {
        lua_settop(L, top);
        return st;
    }
    call_args a = {c, p, d};
    lua_pushcfunction(L, build_consts);
    lua_insert(L, -2);
    lua_pushlightuserdata(L, &a);
    st = lj_lua_pcall(f->h, 2, 1);
    if (st != LAJIT_OK) {
        lua_settop(L, top);
        return st;
    }
    st = lj_template_expand(f->h, tpath, text, len, -1, source);
    lua_settop(L, top);
    return st;
}

static int compare_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Adds dir/sub's regular file names as "sub/name" to paths (grown as needed). A missing folder
 * adds nothing: a development template dir need not have every folder. */
static lajit_status list_folder(lj_env *env, const char *dir, const char *sub, char ***paths,
                                size_t *n, size_t *cap)
{
    char folder[4096];
    snprintf(folder, sizeof folder, "%s/%s", dir, sub);
    DIR *d = opendir(folder);
    if (!d)
        return LAJIT_OK;
    struct dirent *e;
    lajit_status st = LAJIT_OK;
    while (st == LAJIT_OK && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (*n == *cap) {
            size_t grown = *cap ? 2 * *cap : 16;
            char **p = lj_realloc(env, *paths, grown * sizeof *p);
            if (!p) {
                st = lj_oom(env);
                break;
            }
            *paths = p;
            *cap = grown;
        }
        size_t len = strlen(sub) + strlen(e->d_name) + 2;
        char *path = lj_malloc(env, len);
        if (!path) {
            st = lj_oom(env);
            break;
        }
        snprintf(path, len, "%s/%s", sub, e->d_name);
        (*paths)[(*n)++] = path;
    }
    closedir(d);
    return st;
}

lajit_status lj_family_template_text(lj_family *f, char **text, size_t *len)
{
    /* The files of common/, <family>/ and the folders of `uses`: the embedded ones, or with a
     * template dir the files those folders hold (a development family need not be embedded). */
    char folders[2 + LJ_MAX_USES][64];
    size_t nf = 0;
    snprintf(folders[nf++], sizeof folders[0], "common");
    snprintf(folders[nf++], sizeof folders[0], "%s", f->name);
    for (const char *u = f->uses; *u;) { /* at most LJ_MAX_USES names (check_spec) */
        size_t ul = strcspn(u, ",");
        snprintf(folders[nf++], sizeof folders[0], "%.*s", (int)(ul < 63 ? ul : 63), u);
        u += ul + (u[ul] == ',');
    }
    lj_buf b;
    lj_buf_init(&b, f->env);
    const char *dir = lj_lua_template_dir(f->h);
    char **owned = NULL; /* template dir: the listed names, freed below */
    size_t n_owned = 0, cap_owned = 0;
    const char **paths = NULL;
    size_t m = 0;
    lajit_status st = LAJIT_OK;
    if (dir) {
        for (size_t k = 0; k < nf && st == LAJIT_OK; k++)
            st = list_folder(f->env, dir, folders[k], &owned, &n_owned, &cap_owned);
        paths = (const char **)owned;
        m = n_owned;
    } else {
        size_t n = lj_embedded_count;
        paths = lj_malloc(f->env, sizeof *paths * (n ? n : 1));
        if (!paths)
            return lj_oom(f->env);
        for (size_t i = 0; i < n; i++) {
            const char *p = lj_embedded_files[i].path;
            for (size_t k = 0; k < nf; k++) {
                size_t fl = strlen(folders[k]);
                if (strncmp(p, folders[k], fl) == 0 && p[fl] == '/') {
                    paths[m++] = p;
                    break;
                }
            }
        }
    }
    if (st == LAJIT_OK && m > 1)
        qsort(paths, m, sizeof *paths, compare_str);
    for (size_t i = 0; i < m && st == LAJIT_OK; i++) {
        const char *t;
        size_t l;
        st = lj_lua_read_template(f->h, paths[i], &t, &l);
        if (st == LAJIT_OK) {
            lj_buf_printf(&b, "== %s %zu\n", paths[i], l);
            lj_buf_add(&b, t, l);
        }
    }
    for (size_t i = 0; i < n_owned; i++)
        lj_free(f->env, owned[i]);
    if (dir)
        lj_free(f->env, owned);
    else
        lj_free(f->env, (void *)paths);
    if (st != LAJIT_OK) {
        lj_buf_free(&b);
        return st;
    }
    size_t total = b.len;
    char *out = lj_buf_take(&b);
    if (!out)
        return lj_oom(f->env);
    *text = out;
    *len = total;
    return LAJIT_OK;
}

/* ---- Resource claims (the compile sweep's check, generator/resources.c) --------------------- */

/* Reads one optional non-negative integer field of the table at t; NULL or the error. */
static const char *read_claim(lua_State *L, int t, const char *field, long long *out)
{
    int type = lua_getfield(L, t, field);
    const char *err = NULL;
    if (type == LUA_TNUMBER && lua_isinteger(L, -1) && lua_tointeger(L, -1) >= 0)
        *out = (long long)lua_tointeger(L, -1);
    else if (type != LUA_TNIL)
        err = "fields regs and smem must be non-negative integers";
    lua_pop(L, 1);
    return err;
}

lajit_status lj_family_resources(lj_family *f, const lj_config *c, const lj_problem *p,
                                 const lj_device_info *d, lj_resources *out)
{
    lua_State *L = lj_lua_state(f->h);
    lj_resources r = {255, d->smem_optin};
    /* Optional: a spec without resources() claims what the hardware allows. */
    lua_rawgeti(L, LUA_REGISTRYINDEX, f->ref);
    int has = lua_getfield(L, -1, "resources") == LUA_TFUNCTION;
    lua_pop(L, 2);
    if (has) {
        lajit_status st = call(f, "resources", 1 | 2 | 4, c, p, d);
        if (st != LAJIT_OK)
            return st;
        int t = lua_absindex(L, -2);
        const char *err = lua_istable(L, t) ? NULL : "must return a table";
        if (!err)
            err = read_claim(L, t, "regs", &r.regs);
        if (!err)
            err = read_claim(L, t, "smem", &r.smem);
        lua_pop(L, 2);
        if (err)
            return lj_error(f->env, LAJIT_ERR_TEMPLATE, "%s.resources: %s", f->name, err);
    }
    *out = r;
    return LAJIT_OK;
}
