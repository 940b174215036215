/* family_call.c — calling a spec's functions (valid, default, key, launch, source) with the
 * problem, device and configuration as Lua tables, and reading their results back into C.
 *
 * Each call is one protected call of a trampoline that builds the arguments, calls the spec's
 * function and reads its results with a reader of this file, all under the sandbox's limits and
 * the family's budget. Readers never raise for a bad value (only the allocator can): they
 * check every type and range first, write a message naming the field into the call's record,
 * and the caller reports "<family>.<function>: <field> ..." with LAJIT_ERR_TEMPLATE. Whatever a
 * spec returns (a non-table, a table with metamethods, a missing field, a string where an
 * integer goes, 2^62, a list of 5 where 3 are wanted), the Lua stack is where it was. */
#include "family_impl.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "template.h"

/* ---- Conversions into Lua ------------------------------------------------------------------- */

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

void lj_push_problem(lua_State *L, const lj_problem *p)
{
    if (p->op == LJ_OP_CUSTOM && p->decl) {
        /* A custom family's problem: its dtype and its symbols (flags as booleans). */
        const lj_args_decl *d = p->decl;
        lua_createtable(L, 0, d->n_syms + 2);
        set_str(L, "op", lj_op_name(p->op));
        set_str(L, "dtype", lj_dtype_name(p->dtype));
        for (int i = 0; i < d->n_syms; i++) {
            if (d->sym[i].flag)
                set_bool(L, d->sym[i].name, p->sym[i] != 0);
            else
                set_int(L, d->sym[i].name, p->sym[i]);
        }
        return;
    }
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
    set_bool(L, "state_only", p->state_only);
    set_int(L, "part", p->part);
    set_str(L, "state_dtype", lj_dtype_name(p->state_dtype));
    set_str(L, "out_dtype", lj_dtype_name(lj_problem_out(p)));
}

void lj_push_device(lua_State *L, const lj_device_info *d)
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

void lj_push_config(lua_State *L, const lj_config *c)
{
    lua_createtable(L, 0, c->n);
    for (int i = 0; i < c->n; i++)
        set_int(L, c->names[i], c->values[i]);
}

/* ---- One call --------------------------------------------------------------------------------- */

typedef struct call_rec call_rec;
/* Reads the function's two results (at r and r + 1) into the record; returns the number of
 * values it leaves on the stack for the caller (source: its constants table), or 0. Sets
 * rec->err on a bad result. */
typedef int (*reader_fn)(lua_State *L, int r, call_rec *rec);

struct call_rec {
    lj_family *f;
    const char *fn;
    int mask; /* arguments: 1 cfg, 2 problem, 4 device */
    const lj_config *c;
    const lj_problem *p;
    const lj_device_info *d;
    reader_fn read;
    void *out;    /* what the reader fills */
    char *reason; /* valid: the reason, when rejected */
    size_t reason_cap;
    char err[256]; /* the reader's complaint, "" when none */
};

/* The protected trampoline: argument 1 is the call_rec. */
static int trampoline(lua_State *L)
{
    call_rec *rec = lua_touserdata(L, 1);
    lua_settop(L, 0);
    lua_rawgeti(L, LUA_REGISTRYINDEX, rec->f->ref);
    if (lj_rawgetfield(L, 1, rec->fn) != LUA_TFUNCTION) {
        snprintf(rec->err, sizeof rec->err, "the spec has no function %s", rec->fn);
        return 0;
    }
    int n = 0;
    if (rec->mask & 1) {
        lj_push_config(L, rec->c);
        n++;
    }
    if (rec->mask & 2) {
        lj_push_problem(L, rec->p);
        n++;
    }
    if (rec->mask & 4) {
        lj_push_device(L, rec->d);
        n++;
    }
    lua_call(L, n, 2);
    return rec->read(L, 2, rec); /* the spec table stays at 1, the results at 2 and 3 */
}

/* Runs spec[rec->fn] and its reader under the family's budget. Leaves nret values on the stack
 * on success (the reader's), none otherwise. */
static lajit_status call(call_rec *rec, int nret)
{
    lj_family *f = rec->f;
    lua_State *L = lj_lua_state(f->h);
    int top = lua_gettop(L);
    rec->err[0] = 0;
    if (!lua_checkstack(L, 4))
        return lj_oom(f->env);
    lj_lua_budget *prev = lj_lua_set_budget(f->h, &f->budget);
    lua_pushcfunction(L, trampoline);
    lua_pushlightuserdata(L, rec);
    lajit_status st = lj_lua_pcall(f->h, 1, nret);
    lj_lua_set_budget(f->h, prev);
    if (st != LAJIT_OK) {
        lua_settop(L, top);
        lj_error_prefix(f->env, "%s.%s", f->name, rec->fn);
        return st;
    }
    if (rec->err[0]) {
        lua_settop(L, top);
        return lj_error(f->env, LAJIT_ERR_TEMPLATE, "%s.%s: %s", f->name, rec->fn, rec->err);
    }
    return LAJIT_OK;
}

/* An integer at idx, in [lo, hi]; 0 when it is not one. */
static int get_int(lua_State *L, int idx, long long lo, long long hi, long long *out)
{
    int isnum = 0;
    lua_Integer v = lua_type(L, idx) == LUA_TNUMBER ? lua_tointegerx(L, idx, &isnum) : 0;
    if (!isnum || v < lo || v > hi)
        return 0;
    *out = (long long)v;
    return 1;
}

/* ---- default -------------------------------------------------------------------------------- */

/* A cfg table: every parameter of the family present with an integer value. */
static int read_config(lua_State *L, int r, call_rec *rec)
{
    lj_family *f = rec->f;
    lj_config *c = rec->out;
    int top = lua_gettop(L);
    if (!lua_istable(L, r)) {
        snprintf(rec->err, sizeof rec->err, "must return a configuration table, not a %s",
                 lua_typename(L, lua_type(L, r)));
        return 0;
    }
    memset(c, 0, sizeof *c);
    c->n = f->n_params;
    for (int i = 0; i < f->n_params; i++) {
        memcpy(c->names[i], f->param_names[i], LJ_PARAM_NAME);
        lj_rawgetfield(L, r, f->param_names[i]);
        int ok = get_int(L, -1, LLONG_MIN, LLONG_MAX, &c->values[i]);
        lua_settop(L, top);
        if (!ok) {
            snprintf(rec->err, sizeof rec->err,
                     "the configuration's %s is missing or not an integer", f->param_names[i]);
            return 0;
        }
    }
    return 0;
}

lajit_status lj_family_default(lj_family *f, const lj_problem *p, const lj_device_info *d,
                               lj_config *out)
{
    lj_config c;
    call_rec rec = {
        .f = f, .fn = "default", .mask = 2 | 4, .p = p, .d = d, .read = read_config, .out = &c};
    lajit_status st = call(&rec, 0);
    if (st == LAJIT_OK)
        *out = c;
    return st;
}

/* ---- valid ---------------------------------------------------------------------------------- */

/* true, or false and a reason string (nil counts as false: a spec that forgets to return). */
static int read_valid(lua_State *L, int r, call_rec *rec)
{
    int *ok = rec->out;
    int t = lua_type(L, r);
    if (t != LUA_TBOOLEAN && t != LUA_TNIL) {
        snprintf(rec->err, sizeof rec->err, "must return true, or false and a reason, not a %s",
                 lua_typename(L, t));
        return 0;
    }
    *ok = lua_toboolean(L, r);
    if (rec->reason && rec->reason_cap) {
        const char *why = lua_type(L, r + 1) == LUA_TSTRING ? lua_tostring(L, r + 1) : "";
        if (!*ok && !*why)
            why = "rejected by valid() without a reason";
        snprintf(rec->reason, rec->reason_cap, "%s", *ok ? "" : why);
    }
    return 0;
}

lajit_status lj_family_valid(lj_family *f, const lj_config *c, const lj_problem *p,
                             const lj_device_info *d, int *ok, char *reason, size_t cap)
{
    int v = 0;
    call_rec rec = {.f = f,
                    .fn = "valid",
                    .mask = 1 | 2 | 4,
                    .c = c,
                    .p = p,
                    .d = d,
                    .read = read_valid,
                    .out = &v,
                    .reason = reason,
                    .reason_cap = cap};
    lajit_status st = call(&rec, 0);
    if (st == LAJIT_OK)
        *ok = v;
    return st;
}

/* ---- key ------------------------------------------------------------------------------------ */

typedef struct key_out {
    char *text;
    size_t cap;
} key_out;

/* A bucket name is printable ASCII that fits: it keys the tuning database and its exports, so
 * it is never cut short (two buckets would become one) nor carries a NUL or a control code. */
static int read_key(lua_State *L, int r, call_rec *rec)
{
    key_out *k = rec->out;
    size_t n = 0;
    const char *s = lua_type(L, r) == LUA_TSTRING ? lua_tolstring(L, r, &n) : NULL;
    if (!s) {
        snprintf(rec->err, sizeof rec->err, "must return a string, not a %s",
                 lua_typename(L, lua_type(L, r)));
        return 0;
    }
    int ok = n > 0 && n < k->cap;
    for (size_t i = 0; ok && i < n; i++)
        ok = s[i] >= 32 && s[i] < 127;
    if (!ok) {
        snprintf(rec->err, sizeof rec->err, "the key must be 1 to %zu printable characters",
                 k->cap ? k->cap - 1 : 0);
        return 0;
    }
    memcpy(k->text, s, n + 1);
    return 0;
}

lajit_status lj_family_key(lj_family *f, const lj_problem *p, char *out, size_t cap)
{
    key_out k = {out, cap};
    call_rec rec = {.f = f, .fn = "key", .mask = 2, .p = p, .read = read_key, .out = &k};
    return call(&rec, 0);
}

/* ---- launch --------------------------------------------------------------------------------- */

/* The largest grid constant and divisor: a grid dimension is at most 2^31 - 1 blocks. */
#define LJ_GRID_MAX 2147483647LL

/* One grid entry at idx: an integer, a variable name or {var, div}. Returns an error text. A
 * custom family's variables are its shape symbols (decl); the attention families' are fixed. */
static const char *read_grid(lua_State *L, int idx, const lj_args_decl *decl, lj_grid_dim *g)
{
    static const struct {
        const char *name;
        lj_grid_var var;
    } vars[] = {{"B", LJ_VAR_B},   {"H", LJ_VAR_H},       {"N", LJ_VAR_N},
                {"BH", LJ_VAR_BH}, {"nseq", LJ_VAR_NSEQ}, {"T", LJ_VAR_T}};
    int top = lua_gettop(L);
    idx = lua_absindex(L, idx);
    g->var = LJ_VAR_ONE;
    g->mul = 1;
    g->div = 1;
    int t = lua_type(L, idx);
    if (t == LUA_TNUMBER) {
        if (!get_int(L, idx, 1, LJ_GRID_MAX, &g->mul))
            return "is a number but not an integer from 1 to 2^31 - 1";
        return NULL;
    }
    const char *name = NULL;
    if (t == LUA_TSTRING) {
        name = lua_tostring(L, idx);
    } else if (t == LUA_TTABLE) {
        if (lua_rawlen(L, idx) != 2)
            return "must be {var, div} (two entries)";
        lua_rawgeti(L, idx, 1);
        lua_rawgeti(L, idx, 2);
        /* The name string stays alive: the table at idx holds it. */
        name = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
        int ok = get_int(L, -1, 1, LJ_GRID_MAX, &g->div);
        lua_settop(L, top);
        if (!ok)
            return "is {var, div} without an integer div from 1 to 2^31 - 1";
    } else {
        return "must be an integer, a variable name or {var, div}";
    }
    if (decl) {
        int s = name ? lj_args_symbol(decl, name) : -1;
        if (s < 0 || decl->sym[s].flag)
            return "names no shape symbol of the family's args";
        g->var = (lj_grid_var)(LJ_VAR_SYM0 + s);
        return NULL;
    }
    for (size_t i = 0; name && i < sizeof vars / sizeof vars[0]; i++) {
        if (strcmp(name, vars[i].name) == 0) {
            g->var = vars[i].var;
            return NULL;
        }
    }
    return "names no grid variable (B, H, N, BH, nseq, T)";
}

int lj_identifier(const char *s, size_t n)
{
    if (n == 0 || (s[0] >= '0' && s[0] <= '9'))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return 0;
    return 1;
}

/* workspace: the bytes of a custom family's workspace argument for this launch, a byte count
 * or { bytes = fixed, per = n, times = { "B", ... } } (fixed + n times the value of each named
 * shape symbol, at most two; every figure up to 2^40). Only a family that declares a workspace
 * argument may say it; absent, the argument arrives NULL. Returns 0 (read_launch's convention),
 * with rec->err set on a bad field. */
static int read_workspace(lua_State *L, int r, call_rec *rec)
{
    lj_launch *l = rec->out;
    const lj_args_decl *decl = lj_family_args(rec->f);
    int top = lua_gettop(L);
    int t = lj_rawgetfield(L, r, "workspace");
    if (t == LUA_TNIL) {
        lua_settop(L, top);
        return 0;
    }
    if (!decl || decl->workspace < 0) {
        snprintf(rec->err, sizeof rec->err,
                 "workspace needs a workspace argument in args ({ name = ..., workspace = true })");
        lua_settop(L, top);
        return 0;
    }
    const long long cap = 1LL << 40;
    const char *bad = NULL;
    if (t == LUA_TNUMBER) {
        long long v = 0;
        if (!get_int(L, -1, 0, cap, &v))
            bad = "workspace must be a byte count from 0 to 2^40 or {bytes, per, times}";
        l->ws_fixed = (unsigned long long)v;
    } else if (t == LUA_TTABLE) {
        const char *fields[2] = {"bytes", "per"};
        unsigned long long *dst[2] = {&l->ws_fixed, &l->ws_per};
        for (int i = 0; i < 2 && !bad; i++) {
            long long v = 0;
            int ft = lj_rawgetfield(L, top + 1, fields[i]);
            if (ft != LUA_TNIL && !get_int(L, -1, 0, cap, &v))
                bad = "workspace.bytes and workspace.per must be integers from 0 to 2^40";
            *dst[i] = (unsigned long long)v;
            lua_settop(L, top + 1);
        }
        int tt = bad ? LUA_TNIL : lj_rawgetfield(L, top + 1, "times");
        if (tt == LUA_TTABLE) {
            lua_Unsigned n = lua_rawlen(L, -1);
            if (n > 2)
                bad = "workspace.times names at most two shape symbols";
            for (lua_Integer i = 1; !bad && i <= (lua_Integer)n; i++) {
                lua_rawgeti(L, top + 2, i);
                int s =
                    lua_type(L, -1) == LUA_TSTRING ? lj_args_symbol(decl, lua_tostring(L, -1)) : -1;
                lua_pop(L, 1);
                if (s < 0 || decl->sym[s].flag)
                    bad = "workspace.times must list shape symbols of the family's args";
                else
                    l->ws_times[l->ws_n_times++] = (lj_grid_var)(LJ_VAR_SYM0 + s);
            }
        } else if (tt != LUA_TNIL) {
            bad = "workspace.times must be a list of shape symbols";
        }
        if (!bad && l->ws_per && !l->ws_n_times)
            bad = "workspace.per needs times (the symbols it is multiplied by)";
    } else {
        bad = "workspace must be a byte count from 0 to 2^40 or {bytes, per, times}";
    }
    lua_settop(L, top);
    if (bad) {
        snprintf(rec->err, sizeof rec->err, "%s", bad);
        l->ws_fixed = l->ws_per = 0;
        l->ws_n_times = 0;
    }
    return 0;
}

static int read_launch(lua_State *L, int r, call_rec *rec)
{
    lj_launch *l = rec->out;
    int top = lua_gettop(L);
    memset(l, 0, sizeof *l);
    if (!lua_istable(L, r)) {
        snprintf(rec->err, sizeof rec->err, "must return a table, not a %s",
                 lua_typename(L, lua_type(L, r)));
        return 0;
    }
    if (lj_rawgetfield(L, r, "grid") != LUA_TTABLE || lua_rawlen(L, -1) != 3) {
        snprintf(rec->err, sizeof rec->err, "grid must be a list of 3 entries");
        lua_settop(L, top);
        return 0;
    }
    for (int i = 0; i < 3; i++) {
        lua_rawgeti(L, top + 1, i + 1);
        const char *e = read_grid(L, -1, lj_family_args(rec->f), &l->grid[i]);
        lua_settop(L, top + 1);
        if (e) {
            snprintf(rec->err, sizeof rec->err, "grid[%d] %s", i + 1, e);
            lua_settop(L, top);
            return 0;
        }
    }
    lua_settop(L, top);
    if (lj_rawgetfield(L, r, "block") != LUA_TTABLE || lua_rawlen(L, -1) != 3) {
        snprintf(rec->err, sizeof rec->err, "block must be a list of 3 integers");
        lua_settop(L, top);
        return 0;
    }
    long long threads = 1;
    for (int i = 0; i < 3; i++) {
        long long v = 0;
        lua_rawgeti(L, top + 1, i + 1);
        int ok = get_int(L, -1, 1, 1024, &v);
        lua_settop(L, top + 1);
        if (!ok) {
            snprintf(rec->err, sizeof rec->err, "block[%d] must be an integer from 1 to 1024",
                     i + 1);
            lua_settop(L, top);
            return 0;
        }
        l->block[i] = (unsigned)v;
        threads *= v; /* at most 1024^3: no overflow */
    }
    lua_settop(L, top);
    if (threads > 1024) {
        snprintf(rec->err, sizeof rec->err, "block has %lld threads, more than 1024", threads);
        return 0;
    }
    long long smem = 0;
    int t = lj_rawgetfield(L, r, "smem");
    int ok = t == LUA_TNIL || get_int(L, -1, 0, 1 << 30, &smem);
    lua_settop(L, top);
    if (!ok) {
        snprintf(rec->err, sizeof rec->err, "smem must be a byte count from 0 to 2^30");
        return 0;
    }
    l->smem = (unsigned)smem;
    size_t n = 0;
    const char *entry =
        lj_rawgetfield(L, r, "entry") == LUA_TSTRING ? lua_tolstring(L, -1, &n) : NULL;
    if (!entry || n >= sizeof l->entry || !lj_identifier(entry, n)) {
        snprintf(rec->err, sizeof rec->err,
                 "entry must be the kernel's name (an identifier of fewer than %zu "
                 "characters)",
                 sizeof l->entry);
        lua_settop(L, top);
        return 0;
    }
    memcpy(l->entry, entry, n + 1);
    lua_settop(L, top);
    /* covers: the parts of a multi-pass op this kernel also computes (the op skips them). */
    l->covers = 0;
    t = lj_rawgetfield(L, r, "covers");
    if (t == LUA_TTABLE) {
        lua_Integer count = (lua_Integer)lua_rawlen(L, -1);
        for (lua_Integer i = 1; i <= count && count <= 32; i++) {
            long long part = -1;
            lua_rawgeti(L, top + 1, i);
            ok = get_int(L, -1, 0, 31, &part);
            lua_settop(L, top + 1);
            if (!ok)
                break;
            l->covers |= 1u << part;
        }
        if (!ok || count > 32) {
            snprintf(rec->err, sizeof rec->err, "covers must be a list of parts from 0 to 31");
            lua_settop(L, top);
            return 0;
        }
    } else if (t != LUA_TNIL) {
        snprintf(rec->err, sizeof rec->err, "covers must be a list of parts from 0 to 31");
        lua_settop(L, top);
        return 0;
    }
    lua_settop(L, top);
    /* split_ws, split_flags: bytes per (sequence, head) of a split scan's states and flags (1 TiB
     * at most); both or neither. */
    const char *names[2] = {"split_ws", "split_flags"};
    unsigned long long *dst[2] = {&l->split_ws, &l->split_flags};
    for (int i = 0; i < 2; i++) {
        *dst[i] = 0;
        t = lj_rawgetfield(L, r, names[i]);
        if (t != LUA_TNIL) {
            long long ws = 0;
            if (!get_int(L, -1, 1, 1LL << 40, &ws) || ws % 16) {
                snprintf(rec->err, sizeof rec->err,
                         "%s must be a multiple of 16 bytes from 16 to 2^40", names[i]);
                lua_settop(L, top);
                return 0;
            }
            *dst[i] = (unsigned long long)ws;
        }
        lua_settop(L, top);
    }
    if (!l->split_ws != !l->split_flags) {
        snprintf(rec->err, sizeof rec->err, "split_ws and split_flags go together");
        return 0;
    }
    /* pdl: the kernel waits (griddepcontrol.wait) before its first global access, so it may
     * overlap the previous kernel's tail (lj_launch.pdl). A boolean, never a number: 0 is true in
     * Lua, and a spec that meant false must not get the overlap. */
    t = lj_rawgetfield(L, r, "pdl");
    l->pdl = t == LUA_TBOOLEAN && lua_toboolean(L, -1);
    lua_settop(L, top);
    if (t != LUA_TNIL && t != LUA_TBOOLEAN) {
        snprintf(rec->err, sizeof rec->err, "pdl must be a boolean, not a %s", lua_typename(L, t));
        return 0;
    }
    /* The buffers come with the attention ops' la_params; lajit_launch packs only the
     * arguments a custom family declares. */
    if (l->split_ws && lj_family_args(rec->f)) {
        snprintf(rec->err, sizeof rec->err,
                 "split_ws is for the attention ops' kernels (a custom family declares a "
                 "workspace argument and says its size in workspace)");
        return 0;
    }
    return read_workspace(L, r, rec);
}

lajit_status lj_family_launch(lj_family *f, const lj_config *c, const lj_problem *p,
                              const lj_device_info *d, lj_launch *out)
{
    lj_launch l;
    call_rec rec = {.f = f,
                    .fn = "launch",
                    .mask = 1 | 2 | 4,
                    .c = c,
                    .p = p,
                    .d = d,
                    .read = read_launch,
                    .out = &l};
    lajit_status st = call(&rec, 0);
    if (st == LAJIT_OK)
        *out = l;
    return st;
}

/* ---- source --------------------------------------------------------------------------------- */

typedef struct source_out {
    char path[256];
} source_out;

/* {template = "<family>/<file>", consts = {...}}: records the path and leaves the template's
 * constants table (cfg params, problem, device, then consts' entries) as the one result. */
static int read_source(lua_State *L, int r, call_rec *rec)
{
    source_out *o = rec->out;
    int top = lua_gettop(L);
    size_t n = 0;
    const char *path = lua_istable(L, r) && lj_rawgetfield(L, r, "template") == LUA_TSTRING
                           ? lua_tolstring(L, -1, &n)
                           : NULL;
    if (!path || n == 0 || n >= sizeof o->path || strlen(path) != n) {
        snprintf(rec->err, sizeof rec->err,
                 "must return {template = \"<family>/<file>\", consts = {...}} "
                 "with a path of fewer than %zu characters",
                 sizeof o->path);
        lua_settop(L, top);
        return 0;
    }
    memcpy(o->path, path, n + 1);
    lua_settop(L, top);
    int t = lj_rawgetfield(L, r, "consts"); /* at top + 1 */
    if (t != LUA_TTABLE && t != LUA_TNIL) {
        snprintf(rec->err, sizeof rec->err, "consts must be a table");
        lua_settop(L, top);
        return 0;
    }
    lua_newtable(L); /* the constants, at top + 2 */
    int consts = top + 2;
    for (int i = 0; i < rec->c->n; i++)
        set_int(L, rec->c->names[i], rec->c->values[i]);
    lj_push_problem(L, rec->p);
    lua_setfield(L, consts, "problem");
    lj_push_device(L, rec->d);
    lua_setfield(L, consts, "device");
    if (t == LUA_TTABLE) {
        lua_pushnil(L);
        while (lua_next(L, top + 1)) {
            lua_pushvalue(L, -2);
            lua_insert(L, -2);
            lua_rawset(L, consts);
        }
    }
    lua_replace(L, 1); /* the one result */
    lua_settop(L, 1);
    return 1;
}

lajit_status lj_family_source(lj_family *f, const lj_config *c, const lj_problem *p,
                              const lj_device_info *d, char **source)
{
    lua_State *L = lj_lua_state(f->h);
    int top = lua_gettop(L);
    /* The whole expansion draws from the family's budget: source(), reading the template, and
     * translating, parsing and running it (a large template costs the C side time too). */
    lj_lua_budget *prev = lj_lua_set_budget(f->h, &f->budget);
    source_out o;
    call_rec rec = {.f = f,
                    .fn = "source",
                    .mask = 1 | 2 | 4,
                    .c = c,
                    .p = p,
                    .d = d,
                    .read = read_source,
                    .out = &o};
    lajit_status st = call(&rec, 1);
    const char *text;
    size_t len;
    if (st == LAJIT_OK)
        st = lj_lua_read_template(f->h, o.path, &text, &len);
    if (st == LAJIT_OK)
        st = lj_template_expand(f->h, o.path, text, len, -1, source);
    lj_lua_set_budget(f->h, prev);
    lua_settop(L, top);
    return st;
}

/* ---- resources ------------------------------------------------------------------------------ */

/* { regs = n, smem = bytes }: each field optional, a non-negative integer when given. */
static int read_resources(lua_State *L, int r, call_rec *rec)
{
    lj_resources *out = rec->out;
    int top = lua_gettop(L);
    if (!lua_istable(L, r)) {
        snprintf(rec->err, sizeof rec->err, "must return a table, not a %s",
                 lua_typename(L, lua_type(L, r)));
        return 0;
    }
    static const char *const fields[2] = {"regs", "smem"};
    long long *slots[2] = {&out->regs, &out->smem};
    for (int i = 0; i < 2; i++) {
        int type = lj_rawgetfield(L, r, fields[i]);
        int ok = type == LUA_TNIL || get_int(L, -1, 0, LLONG_MAX, slots[i]);
        lua_settop(L, top);
        if (!ok) {
            snprintf(rec->err, sizeof rec->err, "%s must be a non-negative integer", fields[i]);
            return 0;
        }
    }
    return 0;
}

lajit_status lj_family_resources(lj_family *f, const lj_config *c, const lj_problem *p,
                                 const lj_device_info *d, lj_resources *out)
{
    lj_resources r = {255, d->smem_optin};
    /* Optional: a spec without resources() claims what the hardware allows. The spec table is
     * the one check_spec accepted at load; a raw read runs no code of the spec. */
    lua_State *L = lj_lua_state(f->h);
    if (!lua_checkstack(L, 2))
        return lj_oom(f->env);
    lua_rawgeti(L, LUA_REGISTRYINDEX, f->ref);
    int has = lj_rawgetfield(L, -1, "resources") == LUA_TFUNCTION;
    lua_pop(L, 2);
    if (has) {
        call_rec rec = {.f = f,
                        .fn = "resources",
                        .mask = 1 | 2 | 4,
                        .c = c,
                        .p = p,
                        .d = d,
                        .read = read_resources,
                        .out = &r};
        lajit_status st = call(&rec, 0);
        if (st != LAJIT_OK)
            return st;
    }
    *out = r;
    return LAJIT_OK;
}
