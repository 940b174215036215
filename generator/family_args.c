/* family_args.c — what a custom family (op "custom") declares about its kernel's arguments, read
 * once at load from its spec (family.h has the C form, templates/README.md the Lua one):
 *
 *   args = {
 *       { name = "q", dtype = "dtype", shape = { "B", "H", "N", "D" } },
 *       { name = "g", dtype = "f32", shape = { "B", "H", "N" }, fill = { -0.1, 0 } },
 *       { name = "h0", dtype = "f32", shape = { "B", "H", "D", "E" }, optional = true },
 *       { name = "o", dtype = "dtype", shape = { "B", "H", "N", "E" }, output = true },
 *       { name = "scale", scalar = "f32" },
 *       { name = "ws", workspace = true },   -- scratch lajit provides, sized by launch()
 *   },
 *   dtypes = { "f16", "bf16" },   -- the problem dtypes taken (default: f32, f16, bf16)
 *   dynamic = { "B", "N" },       -- symbols read at run time, not baked into the kernel
 *
 * Like the rest of the spec it is untrusted: every field is read raw, checked for type and range,
 * and a bad one is a message naming it ("args[3].shape[2] ..."), never a crash. The symbols'
 * order (first use in the shapes, then the has_<name> flags) is the order of lj_problem.sym,
 * of the grid variables and of the plan key, so it is fixed here once. */
#include "family_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const char *lj_elem_name(lj_elem e)
{
    switch (e) {
        case LJ_ELEM_PROBLEM: return "dtype";
        case LJ_ELEM_F32: return "f32";
        case LJ_ELEM_F16: return "f16";
        case LJ_ELEM_BF16: return "bf16";
        case LJ_ELEM_I32: return "i32";
        case LJ_ELEM_I64: return "i64";
    }
    return "?";
}

int lj_elem_size(lj_elem e)
{
    switch (e) {
        case LJ_ELEM_F16:
        case LJ_ELEM_BF16: return 2;
        case LJ_ELEM_F32:
        case LJ_ELEM_I32: return 4;
        case LJ_ELEM_I64: return 8;
        case LJ_ELEM_PROBLEM: return 0;
    }
    return 0;
}

int lj_args_symbol(const lj_args_decl *d, const char *name)
{
    for (int i = 0; i < d->n_syms; i++)
        if (strcmp(d->sym[i].name, name) == 0)
            return i;
    return -1;
}

/* A name of the declaration: an identifier of 1 to LJ_NAME_LEN - 1 characters (it becomes a
 * kernel parameter, a problem field and a -p key of the CLI). */
static int name_ok(const char *s, size_t n)
{
    return n < LJ_NAME_LEN && lj_identifier(s, n);
}

/* Words the problem table already uses: a symbol may not shadow them. */
static int reserved(const char *s)
{
    return strcmp(s, "op") == 0 || strcmp(s, "dtype") == 0 || strcmp(s, "part") == 0;
}

static int parse_elem(const char *s, lj_elem *out)
{
    static const lj_elem all[] = {LJ_ELEM_PROBLEM, LJ_ELEM_F32, LJ_ELEM_F16,
                                  LJ_ELEM_BF16,    LJ_ELEM_I32, LJ_ELEM_I64};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(s, lj_elem_name(all[i])) == 0) {
            *out = all[i];
            return 1;
        }
    }
    return 0;
}

/* A string field of the table at t: its text, or NULL when absent or not a string. */
static const char *string_field(lua_State *L, int t, const char *key, int *type)
{
    *type = lj_rawgetfield(L, t, key);
    return *type == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
}

/* Adds a symbol (or finds it); -1 when the table is full. */
static int add_symbol(lj_args_decl *d, const char *name, int flag)
{
    int i = lj_args_symbol(d, name);
    if (i >= 0)
        return i;
    if (d->n_syms == LJ_MAX_SYMBOLS)
        return -1;
    lj_symbol *s = &d->sym[d->n_syms];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->flag = flag;
    return d->n_syms++;
}

/* One entry of args at idx (a table), the k-th (1-based). */
static const char *read_arg(lua_State *L, int idx, int k, lj_args_decl *d, char *err, size_t cap)
{
    int top = lua_gettop(L);
    lj_arg_decl *a = &d->arg[d->n_args];
    memset(a, 0, sizeof *a);
    a->fill_lo = -1;
    a->fill_hi = 1;
    a->flag = -1;
    int t;
    size_t n = 0;
    const char *name = string_field(L, idx, "name", &t);
    if (name)
        n = lua_rawlen(L, -1);
    if (!name || !name_ok(name, n) || reserved(name)) {
        snprintf(err, cap,
                 "args[%d].name must be an identifier of 1 to %d characters (not op, dtype "
                 "or part)",
                 k, LJ_NAME_LEN - 1);
        lua_settop(L, top);
        return err;
    }
    snprintf(a->name, sizeof a->name, "%s", name);
    lua_settop(L, top);
    for (int i = 0; i < d->n_args; i++) {
        if (strcmp(d->arg[i].name, a->name) == 0) {
            snprintf(err, cap, "args[%d]: a second argument named %s", k, a->name);
            return err;
        }
    }
    /* A workspace: the runtime's scratch, nothing else said about it (launch() sizes it). */
    t = lj_rawgetfield(L, idx, "workspace");
    lua_settop(L, top);
    if (t != LUA_TNIL) {
        static const char *const other[] = {"scalar", "dtype", "shape", "optional",
                                            "output", "align", "fill",  "unit_stride"};
        int clean = t == LUA_TBOOLEAN;
        if (clean) {
            lj_rawgetfield(L, idx, "workspace");
            clean = lua_toboolean(L, -1);
            lua_settop(L, top);
        }
        for (size_t i = 0; clean && i < sizeof other / sizeof other[0]; i++) {
            clean = lj_rawgetfield(L, idx, other[i]) == LUA_TNIL;
            lua_settop(L, top);
        }
        if (!clean) {
            snprintf(err, cap,
                     "args[%d] (%s): a workspace is { name = ..., workspace = true } and nothing "
                     "else (lajit provides it; launch() says its size)",
                     k, a->name);
            return err;
        }
        if (d->workspace >= 0) {
            snprintf(err, cap, "args[%d] (%s): a second workspace (%s is one)", k, a->name,
                     d->arg[d->workspace].name);
            return err;
        }
        a->kind = LJ_ARG_WORKSPACE;
        a->rank = 1;
        a->elem = LJ_ELEM_I32; /* never checked: the runtime fills it */
        a->align = 16;
        d->workspace = d->n_args++;
        return NULL;
    }
    const char *scalar = string_field(L, idx, "scalar", &t);
    if (t != LUA_TNIL) {
        if (!scalar || !(strcmp(scalar, "f32") == 0 || strcmp(scalar, "i32") == 0 ||
                         strcmp(scalar, "i64") == 0)) {
            snprintf(err, cap, "args[%d].scalar must be f32, i32 or i64", k);
            lua_settop(L, top);
            return err;
        }
        a->kind = scalar[0] == 'f' ? LJ_ARG_F32 : scalar[1] == '3' ? LJ_ARG_I32 : LJ_ARG_I64;
        lua_settop(L, top);
        d->n_args++;
        return NULL;
    }
    lua_settop(L, top);
    a->kind = LJ_ARG_TENSOR;
    const char *dt = string_field(L, idx, "dtype", &t);
    if (!dt || !parse_elem(dt, &a->elem)) {
        snprintf(err, cap,
                 "args[%d] (%s): a tensor's dtype must be f32, f16, bf16, i32, i64 or dtype "
                 "(the problem's), a scalar's `scalar` f32, i32 or i64",
                 k, a->name);
        lua_settop(L, top);
        return err;
    }
    lua_settop(L, top);
    lua_Unsigned rank = lj_rawgetfield(L, idx, "shape") == LUA_TTABLE ? lua_rawlen(L, -1) : 0;
    if (rank < 1 || rank > LJ_MAX_RANK) {
        snprintf(err, cap, "args[%d] (%s): shape must be a list of 1 to %d symbol names", k,
                 a->name, LJ_MAX_RANK);
        lua_settop(L, top);
        return err;
    }
    a->rank = (int)rank;
    for (int i = 0; i < a->rank; i++) {
        lua_rawgeti(L, top + 1, i + 1);
        const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        int sym = s && name_ok(s, lua_rawlen(L, -1)) && !reserved(s) ? add_symbol(d, s, 0) : -2;
        if (sym >= 0 && d->sym[sym].flag)
            sym = -2;
        lua_pop(L, 1);
        if (sym < 0) {
            snprintf(err, cap,
                     sym == -1 ? "args[%d] (%s): shape[%d]: more than %d symbols in all"
                               : "args[%d] (%s): shape[%d] must be a symbol name (an identifier, "
                                 "not op, dtype, part or a has_ flag)",
                     k, a->name, i + 1, LJ_MAX_SYMBOLS);
            lua_settop(L, top);
            return err;
        }
        a->shape[i] = (signed char)sym;
    }
    lua_settop(L, top);
    static const char *const flags[] = {"optional", "output", "unit_stride"};
    int *dst[] = {&a->optional, &a->output, &a->unit_stride};
    for (int i = 0; i < 3; i++) {
        t = lj_rawgetfield(L, idx, flags[i]);
        if (t != LUA_TNIL && t != LUA_TBOOLEAN) {
            snprintf(err, cap, "args[%d] (%s): %s must be a boolean", k, a->name, flags[i]);
            lua_settop(L, top);
            return err;
        }
        *dst[i] = lua_toboolean(L, -1);
        lua_settop(L, top);
    }
    a->align = a->elem == LJ_ELEM_PROBLEM ? 2 : lj_elem_size(a->elem);
    t = lj_rawgetfield(L, idx, "align");
    if (t != LUA_TNIL) {
        int isnum = 0;
        lua_Integer v = t == LUA_TNUMBER ? lua_tointegerx(L, -1, &isnum) : 0;
        if (!isnum || v < 1 || v > 256 || (v & (v - 1)) || v < a->align) {
            snprintf(err, cap,
                     "args[%d] (%s): align must be a power of two from the element size to 256", k,
                     a->name);
            lua_settop(L, top);
            return err;
        }
        a->align = (int)v;
    }
    lua_settop(L, top);
    t = lj_rawgetfield(L, idx, "fill");
    if (t == LUA_TTABLE) {
        lua_rawgeti(L, top + 1, 1);
        lua_rawgeti(L, top + 1, 2);
        int ok = lua_rawlen(L, top + 1) == 2 && lua_type(L, -2) == LUA_TNUMBER &&
                 lua_type(L, -1) == LUA_TNUMBER;
        double lo = ok ? (double)lua_tonumber(L, -2) : 0, hi = ok ? (double)lua_tonumber(L, -1) : 0;
        if (!ok || !isfinite(lo) || !isfinite(hi) || lo > hi || fabs(lo) > 1e30 ||
            fabs(hi) > 1e30) {
            snprintf(err, cap, "args[%d] (%s): fill must be {lo, hi}, finite, lo <= hi", k,
                     a->name);
            lua_settop(L, top);
            return err;
        }
        a->fill_lo = lo;
        a->fill_hi = hi;
    } else if (t != LUA_TNIL) {
        snprintf(err, cap, "args[%d] (%s): fill must be {lo, hi}", k, a->name);
        lua_settop(L, top);
        return err;
    }
    lua_settop(L, top);
    d->n_args++;
    return NULL;
}

/* The dtypes list at idx into d->dtypes. */
static const char *read_dtypes(lua_State *L, int idx, lj_args_decl *d, char *err, size_t cap)
{
    lua_Unsigned n = lua_rawlen(L, idx);
    d->dtypes = 0;
    for (lua_Integer i = 1; i <= (lua_Integer)n && i <= 3; i++) {
        lua_rawgeti(L, idx, i);
        lj_dtype dt;
        int ok = lua_type(L, -1) == LUA_TSTRING && lj_dtype_parse(lua_tostring(L, -1), &dt);
        lua_pop(L, 1);
        if (!ok) {
            snprintf(err, cap, "dtypes[%d] must be f32, f16 or bf16", (int)i);
            return err;
        }
        d->dtypes |= 1u << dt;
    }
    if (n < 1 || n > 3) {
        snprintf(err, cap, "dtypes must list 1 to 3 of f32, f16, bf16");
        return err;
    }
    return NULL;
}

const char *lj_read_args(lua_State *L, int spec, lj_args_decl *d, char *err, size_t cap)
{
    int top = lua_gettop(L);
    spec = lua_absindex(L, spec);
    memset(d, 0, sizeof *d);
    d->workspace = -1;
    const char *e = NULL;
    lua_Unsigned n = lj_rawgetfield(L, spec, "args") == LUA_TTABLE ? lua_rawlen(L, -1) : 0;
    if (n < 1 || n > LJ_MAX_ARGS) {
        snprintf(err, cap, "args must be a list of 1 to %d arguments", LJ_MAX_ARGS);
        e = err;
    }
    int tensors = 0;
    for (lua_Integer i = 1; !e && i <= (lua_Integer)n; i++) {
        if (lua_rawgeti(L, top + 1, i) != LUA_TTABLE) {
            snprintf(err, cap, "args[%d] must be a table", (int)i);
            e = err;
        } else {
            e = read_arg(L, top + 2, (int)i, d, err, cap);
            tensors += !e && d->arg[d->n_args - 1].kind == LJ_ARG_TENSOR;
        }
        lua_settop(L, top + 1);
    }
    if (!e && tensors == 0) {
        snprintf(err, cap, "args must declare at least one tensor");
        e = err;
    }
    /* The has_<name> flags of the optional tensors, after every shape symbol. */
    for (int i = 0; !e && i < d->n_args; i++) {
        lj_arg_decl *a = &d->arg[i];
        if (a->kind != LJ_ARG_TENSOR || !a->optional)
            continue;
        char flag[LJ_NAME_LEN + 8];
        snprintf(flag, sizeof flag, "has_%s", a->name);
        if (strlen(flag) >= LJ_NAME_LEN || lj_args_symbol(d, flag) >= 0 ||
            (a->flag = add_symbol(d, flag, 1)) < 0) {
            snprintf(err, cap,
                     "args (%s): its flag %s is too long, clashes with a shape symbol or "
                     "makes more than %d symbols",
                     a->name, flag, LJ_MAX_SYMBOLS);
            e = err;
        }
    }
    lua_settop(L, top);
    d->dtypes = (1u << LJ_F32) | (1u << LJ_F16) | (1u << LJ_BF16);
    int t = e ? LUA_TNIL : lj_rawgetfield(L, spec, "dtypes");
    if (t == LUA_TTABLE)
        e = read_dtypes(L, top + 1, d, err, cap);
    else if (t != LUA_TNIL) {
        snprintf(err, cap, "dtypes must be a list of dtype names");
        e = err;
    }
    lua_settop(L, top);
    t = e ? LUA_TNIL : lj_rawgetfield(L, spec, "dynamic");
    if (t == LUA_TTABLE) {
        lua_Unsigned m = lua_rawlen(L, top + 1);
        for (lua_Integer i = 1; !e && i <= (lua_Integer)m; i++) {
            lua_rawgeti(L, top + 1, i);
            int s = lua_type(L, -1) == LUA_TSTRING ? lj_args_symbol(d, lua_tostring(L, -1)) : -1;
            lua_pop(L, 1);
            if (s < 0 || d->sym[s].flag) {
                snprintf(err, cap, "dynamic[%d] must name a shape symbol of args", (int)i);
                e = err;
            } else {
                d->sym[s].dynamic = 1;
            }
        }
    } else if (t != LUA_TNIL) {
        snprintf(err, cap, "dynamic must be a list of shape symbols");
        e = err;
    }
    lua_settop(L, top);
    return e;
}

/* A custom problem from its table at idx: the dtype (one the family takes; default its first)
 * and every symbol (shape symbols: integers from 1 to 2^62; flags: booleans or 0/1, default
 * false). */
const char *lj_read_custom_problem(lua_State *L, int idx, const lj_args_decl *d, lj_problem *p,
                                   char *err, size_t cap)
{
    int top = lua_gettop(L);
    idx = lua_absindex(L, idx);
    memset(p, 0, sizeof *p);
    if (!lua_istable(L, idx)) {
        snprintf(err, cap, "a problem is not a table");
        return err;
    }
    p->op = LJ_OP_CUSTOM;
    p->decl = d;
    p->T = 1;
    p->dtype = (d->dtypes & (1u << LJ_BF16))  ? LJ_BF16
               : (d->dtypes & (1u << LJ_F16)) ? LJ_F16
                                              : LJ_F32;
    int t = lj_rawgetfield(L, idx, "dtype");
    lj_dtype dt = p->dtype;
    if ((t == LUA_TSTRING &&
         (!lj_dtype_parse(lua_tostring(L, -1), &dt) || !(d->dtypes & (1u << dt)))) ||
        (t != LUA_TSTRING && t != LUA_TNIL)) {
        snprintf(err, cap, "problem.dtype must be one of the family's dtypes");
        lua_settop(L, top);
        return err;
    }
    p->dtype = dt;
    lua_settop(L, top);
    for (int i = 0; i < d->n_syms; i++) {
        const lj_symbol *s = &d->sym[i];
        t = lj_rawgetfield(L, idx, s->name);
        int isnum = 0;
        lua_Integer v = t == LUA_TNUMBER ? lua_tointegerx(L, -1, &isnum) : 0;
        if (s->flag && (t == LUA_TBOOLEAN || t == LUA_TNIL || (isnum && (v == 0 || v == 1)))) {
            p->sym[i] = t == LUA_TBOOLEAN ? lua_toboolean(L, -1) : (long long)v;
        } else if (!s->flag && isnum && v >= 1 && v <= ((lua_Integer)1 << 62)) {
            p->sym[i] = (long long)v;
        } else {
            snprintf(err, cap,
                     s->flag ? "problem.%s must be a boolean"
                             : "problem.%s must be an integer from 1 to 2^62",
                     s->name);
            lua_settop(L, top);
            return err;
        }
        lua_settop(L, top);
    }
    return NULL;
}
