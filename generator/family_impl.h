/* family_impl.h — what the three files of a kernel family share, and nothing else includes:
 * the family's C-side state and the helpers that move values between C structs and Lua tables.
 *
 *   family.c       loading a spec and checking its shape: what it declares (params, problems,
 *                  archs, uses) is copied into C at load, so a spec cannot change it later
 *   family_args.c  a custom family's declared arguments (args, dtypes, dynamic)
 *   family_call.c  calling the spec's functions and reading their results
 *   family_text.c  the text a family is tuned under (the files of its template folders)
 *
 * Rule for every read of a value a spec gave back: inside a protected call, by raw access (no
 * metamethod runs), with its type and range checked before any conversion, and with the stack
 * put back to where it was whatever happens. */
#ifndef LAJIT_FAMILY_IMPL_H
#define LAJIT_FAMILY_IMPL_H

#include "family.h"

#include <lua.h>

/* How many other template folders a spec's `uses` may name. */
#define LJ_MAX_USES 6
/* Representative problems a spec may list (each is swept over every configuration; the
 * built-in families list at most 5). */
#define LJ_MAX_PROBLEMS 16
/* Values one parameter may list. */
#define LJ_MAX_PARAM_VALUES 64

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
    int n_problems;
    lj_problem problems[LJ_MAX_PROBLEMS];
    char archs[128];      /* the archs the family serves, comma-separated; empty: every arch */
    char uses[128];       /* up to LJ_MAX_USES other template folders its kernels come from,
                        comma-separated (la_bwd expands la_fwd/fwd.cu): part of its template
                        text, so of its tuning hash */
    lj_lua_budget budget; /* every call into the spec draws from it (sandbox.h) */
    lj_args_decl args;    /* op custom: its declared arguments (family_args.c) */
};

/* Pushers: they allocate, so they run inside protected calls. */
void lj_push_problem(lua_State *L, const lj_problem *p);
void lj_push_device(lua_State *L, const lj_device_info *d);
void lj_push_config(lua_State *L, const lj_config *c);

/* Pushes t[key] without metamethods (allocates the key: protected calls only); returns its
 * type. */
int lj_rawgetfield(lua_State *L, int t, const char *key);

/* Reads the problem table at idx (raw, checked); missing fields take neutral values. Returns
 * NULL, or an error text (err holds it when it names a field). Protected calls only. */
const char *lj_read_problem(lua_State *L, int idx, lj_op family_op, lj_problem *p, char *err,
                            size_t cap);

/* A custom family's `args`, `dtypes` and `dynamic` from the spec table at spec (family_args.c);
 * NULL or an error text in err. Protected calls only. */
const char *lj_read_args(lua_State *L, int spec, lj_args_decl *d, char *err, size_t cap);
/* A custom family's problem table at idx (dtype and symbols). */
const char *lj_read_custom_problem(lua_State *L, int idx, const lj_args_decl *d, lj_problem *p,
                                   char *err, size_t cap);

#endif
