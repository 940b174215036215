/* roles.c — the spec's `roles` table read into lj_roles, and its application to a problem and to
 * la_params (see roles.h). The table is read in a protected call with raw accesses only, so a
 * malformed spec is an error status, never a Lua panic. */
#include "roles.h"

#include <stddef.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

/* The op tensors a pass can hand on: la_params fields by name. */
static const struct {
    const char *name;
    size_t offset;
} tensors[] = {
    {"q", offsetof(la_params, q)},       {"k", offsetof(la_params, k)},
    {"v", offsetof(la_params, v)},       {"o", offsetof(la_params, o)},
    {"dout", offsetof(la_params, dout)}, {"dq", offsetof(la_params, dq)},
    {"dk", offsetof(la_params, dk)},     {"dv", offsetof(la_params, dv)},
    {"s0", offsetof(la_params, s0)},     {"sn", offsetof(la_params, sn)},
    {"ds0", offsetof(la_params, ds0)},   {"dsn", offsetof(la_params, dsn)},
};
#define N_TENSORS ((int)(sizeof tensors / sizeof tensors[0]))

static const char *const slot_names[LJ_N_SLOTS] = {"q",  "k", "v",   "o", "s0",
                                                   "sn", "x", "dsn", "o2"};
static const size_t slot_offsets[LJ_N_SLOTS] = {
    offsetof(la_params, q), offsetof(la_params, k),   offsetof(la_params, v),
    offsetof(la_params, o), offsetof(la_params, s0),  offsetof(la_params, sn),
    offsetof(la_params, x), offsetof(la_params, dsn), offsetof(la_params, dk)};

static const struct {
    const char *name;
    unsigned bit;
} flag_names[] = {{"has_initial", LJ_ROLE_HAS_INITIAL},
                  {"has_final", LJ_ROLE_HAS_FINAL},
                  {"has_dsn", LJ_ROLE_HAS_DSN},
                  {"want_ds", LJ_ROLE_WANT_DS}};

static int raw_field(lua_State *L, int t, const char *name)
{
    lua_pushstring(L, name);
    return lua_rawget(L, t);
}

static int tensor_index(const char *name)
{
    for (int i = 0; i < N_TENSORS; i++)
        if (strcmp(tensors[i].name, name) == 0)
            return i;
    return -1;
}

static unsigned flag_bit(const char *name)
{
    for (size_t i = 0; i < sizeof flag_names / sizeof flag_names[0]; i++)
        if (strcmp(flag_names[i].name, name) == 0)
            return flag_names[i].bit;
    return 0;
}

static int boolean_field(lua_State *L, int t, const char *name)
{
    int type = raw_field(L, t, name), v = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (type != LUA_TNIL && type != LUA_TBOOLEAN)
        luaL_error(L, "roles: %s must be a boolean", name);
    return v;
}

/* A list of names (flags or slots): its bits through bit_of. */
static unsigned name_list(lua_State *L, int t, const char *field, unsigned (*bit_of)(const char *))
{
    unsigned bits = 0;
    int type = raw_field(L, t, field);
    if (type == LUA_TTABLE) {
        lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
        for (lua_Integer i = 1; i <= n; i++) {
            lua_rawgeti(L, -1, i);
            const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
            unsigned b = s ? bit_of(s) : 0;
            if (!b)
                luaL_error(L, "roles: %s lists an unknown name", field);
            bits |= b;
            lua_pop(L, 1);
        }
    } else if (type != LUA_TNIL) {
        luaL_error(L, "roles: %s must be a list", field);
    }
    lua_pop(L, 1);
    return bits;
}

static unsigned slot_bit(const char *name)
{
    for (int i = 0; i < LJ_N_SLOTS; i++)
        if (strcmp(slot_names[i], name) == 0)
            return 1u << i;
    return 0;
}

/* lua_CFunction: (spec, lightuserdata lj_roles). */
static int read_roles(lua_State *L)
{
    lj_roles *out = lua_touserdata(L, 2);
    memset(out, 0, sizeof *out);
    if (!lua_istable(L, 1) || raw_field(L, 1, "roles") != LUA_TTABLE)
        return luaL_error(L, "the spec has no roles table");
    int roles = lua_gettop(L);
    lua_Integer n = (lua_Integer)lua_rawlen(L, roles);
    if (n < 1 || n > LJ_MAX_PASSES)
        return luaL_error(L, "roles: 1 to %d passes", LJ_MAX_PASSES);
    for (lua_Integer i = 1; i <= n; i++) {
        if (lua_rawgeti(L, roles, i) != LUA_TTABLE)
            return luaL_error(L, "roles[%d] must be a table", (int)i);
        int t = lua_gettop(L);
        lj_pass_role *r = &out->pass[i - 1];
        raw_field(L, t, "part");
        if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 0 || lua_tointeger(L, -1) > 255)
            return luaL_error(L, "roles[%d].part must be an integer from 0 to 255", (int)i);
        r->part = (int)lua_tointeger(L, -1);
        lua_pop(L, 1);
        r->all = boolean_field(L, t, "all");
        r->ticket = boolean_field(L, t, "ticket");
        r->swap_de = boolean_field(L, t, "swap_de");
        r->ds = boolean_field(L, t, "ds");
        r->keep = name_list(L, t, "flags", flag_bit);
        r->when = name_list(L, t, "when", flag_bit);
        r->transpose = name_list(L, t, "transpose", slot_bit);
        for (int s = 0; s < LJ_N_SLOTS; s++) {
            int type = raw_field(L, t, slot_names[s]);
            r->slot[s] = -1;
            if (type == LUA_TSTRING) {
                int x = tensor_index(lua_tostring(L, -1));
                if (x < 0)
                    return luaL_error(L, "roles[%d].%s names no tensor of the op", (int)i,
                                      slot_names[s]);
                r->slot[s] = (signed char)x;
            } else if (type != LUA_TNIL) {
                return luaL_error(L, "roles[%d].%s must be a tensor's name", (int)i, slot_names[s]);
            }
            lua_pop(L, 1);
            if (r->all && r->slot[s] >= 0)
                return luaL_error(L, "roles[%d]: a pass with all = true names no tensors", (int)i);
        }
        lua_pop(L, 1);
    }
    out->n = (int)n;
    return 0;
}

lajit_status lj_roles_load(lj_lua *h, lj_family *f, lj_roles *out)
{
    lua_State *L = lj_lua_state(h);
    if (!lua_checkstack(L, 4))
        return lj_oom(lj_lua_env(h));
    lua_pushcfunction(L, read_roles);
    lj_family_push_spec(f);
    lua_pushlightuserdata(L, out);
    lajit_status st = lj_lua_pcall(h, 2, 0);
    if (st != LAJIT_OK)
        lj_error_prefix(lj_lua_env(h), "%s", lj_family_name(f));
    return st;
}

int lj_roles_problem(const lj_pass_role *r, const lj_problem *p, lj_problem *out)
{
    unsigned have = (p->has_initial ? LJ_ROLE_HAS_INITIAL : 0) |
                    (p->has_final ? LJ_ROLE_HAS_FINAL : 0) | (p->has_dsn ? LJ_ROLE_HAS_DSN : 0) |
                    (p->want_ds ? LJ_ROLE_WANT_DS : 0);
    if ((have & r->when) != r->when)
        return 0;
    *out = *p;
    out->part = r->part;
    out->has_initial = (r->keep & LJ_ROLE_HAS_INITIAL) ? p->has_initial : 0;
    out->has_final = (r->keep & LJ_ROLE_HAS_FINAL) ? p->has_final : 0;
    out->has_dsn = (r->keep & LJ_ROLE_HAS_DSN) ? p->has_dsn : 0;
    out->want_ds = (r->keep & LJ_ROLE_WANT_DS) ? p->want_ds : 0;
    return 1;
}

void lj_roles_params(const lj_pass_role *r, const la_params *lp, la_params *out)
{
    *out = *lp;
    if (r->all)
        return;
    /* A scan sees only what its roles hand it: every op tensor cleared, then the slots filled. */
    for (int i = 0; i < N_TENSORS; i++)
        memset((char *)out + tensors[i].offset, 0, sizeof(la_tensor4));
    if (!r->ds)
        out->dsdecay = out->workspace = 0;
    for (int s = 0; s < LJ_N_SLOTS; s++) {
        if (r->slot[s] < 0)
            continue;
        la_tensor4 t;
        memcpy(&t, (const char *)lp + tensors[r->slot[s]].offset, sizeof t);
        if (r->transpose & (1u << s)) { /* a state [.., D, E] read as [.., E, D] */
            long long s2 = t.s2;
            t.s2 = t.s3;
            t.s3 = s2;
        }
        memcpy((char *)out + slot_offsets[s], &t, sizeof t);
    }
    if (r->swap_de) {
        out->D = lp->E;
        out->E = lp->D;
    }
}
