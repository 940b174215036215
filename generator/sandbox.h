/* sandbox.h — the Lua host: one sandboxed lua_State per context, allocating through the
 * context's allocator, with no io, os, debug, package, require, load of files or bytecode, no
 * string.dump and no pattern functions (whose C loops the instruction hook cannot interrupt),
 * and with an instruction limit and a memory limit per call, so a runaway or malicious template
 * ends with an error status (file:line and a traceback), never a hang or a crash. */
#ifndef LAJIT_SANDBOX_H
#define LAJIT_SANDBOX_H

#include "core.h"

typedef struct lua_State lua_State;
typedef struct lj_lua lj_lua;

/* Limits for one protected call. */
#define LJ_LUA_MAX_INSTRUCTIONS 200000000LL  /* counted in hook steps of 1000 */
#define LJ_LUA_MAX_MEMORY       (256u << 20) /* bytes held by the Lua state */

/* Files of a template dir are untrusted: each at most this large, and all the files one state
 * reads together at most LJ_LUA_MAX_FILE_TOTAL (the built-in tree is under 200 KB in all). */
#define LJ_LUA_MAX_FILE       (1u << 20)
#define LJ_LUA_MAX_FILE_TOTAL (16u << 20)

/* A budget shared by many protected calls (each family keeps one): the per-call limits alone
 * let a hostile spec take minutes by being called many times (every configuration's valid()).
 * While a budget is set, each protected call draws its Lua instructions from it, and the thread
 * CPU time spent until the budget is unset is drawn from it too (so loops inside C library
 * functions, and the C side's own work such as translating and parsing templates, count); a
 * call's own limits are cut to what is left, and a call or load on an empty budget fails at
 * once with LAJIT_ERR_LIMIT. The budget refills with wall-clock time, fully in
 * LJ_LUA_BUDGET_REFILL_S seconds: a spec gets at most about LJ_LUA_BUDGET_CPU_S seconds of CPU
 * at once, then about 1/LJ_LUA_BUDGET_REFILL_S of one core. The built-in families spend at most
 * 5 % of it on expanding every valid configuration of every representative problem for four
 * archs (la_decode: 1,888 expansions, 0.5 s of CPU, 1.1 million instructions). */
#define LJ_LUA_BUDGET_INSTRUCTIONS 1000000000LL
#define LJ_LUA_BUDGET_CPU_S        10
#define LJ_LUA_BUDGET_REFILL_S     100

typedef struct lj_lua_budget {
    long long steps;   /* hook steps (of 1000 instructions) left */
    long long cpu_ns;  /* thread CPU nanoseconds left */
    long long last_ns; /* monotonic time of the last refill */
} lj_lua_budget;

/* A full budget. */
void lj_lua_budget_init(lj_lua_budget *b);
/* Makes what follows draw from b (NULL: per-call limits only), charging the CPU time spent
 * since the previous budget was set to that one; returns the previous budget, which the caller
 * restores (the same call) when its operation ends. */
lj_lua_budget *lj_lua_set_budget(lj_lua *L, lj_lua_budget *b);

/* template_dir: NULL for the embedded templates, else a development folder that replaces them
 * (LAJIT_TEMPLATE_DIR). Copied. */
lajit_status lj_lua_open(lj_env *env, const char *template_dir, lj_lua **out);
void lj_lua_close(lj_lua *L);
lua_State *lj_lua_state(lj_lua *L);
lj_env *lj_lua_env(lj_lua *L);
const char *lj_lua_template_dir(lj_lua *L); /* NULL: embedded */

/* Loads a text chunk (never bytecode) and leaves the function on the stack. */
lajit_status lj_lua_load(lj_lua *L, const char *text, size_t len, const char *chunkname);
/* Calls the function below nargs arguments with fresh limits; on error pops it, fills errmsg
 * with the message and traceback, and returns LAJIT_ERR_TEMPLATE (LAJIT_ERR_LIMIT when the
 * instruction or memory limit was hit, LAJIT_ERR_OUT_OF_MEMORY when the allocator failed). */
lajit_status lj_lua_pcall(lj_lua *L, int nargs, int nresults);

/* Reads a template file ("la_fwd/family.lua", "common/types.cuh") from the template dir or the
 * embedded copy. *text is borrowed (embedded) or owned by L until close; LAJIT_ERR_NOT_FOUND
 * when absent. The path must be relative, of components made of letters, digits, '_', '-' and
 * '.' (no "." or ".." component): LAJIT_ERR_INVALID_ARGUMENT otherwise. A template dir's file is
 * refused with LAJIT_ERR_IO when it or a folder on its way is a symbolic link, when it is not a
 * regular file (a FIFO is never waited on), or when it is over LJ_LUA_MAX_FILE or would take
 * the state's files over LJ_LUA_MAX_FILE_TOTAL. */
lajit_status lj_lua_read_template(lj_lua *L, const char *path, const char **text, size_t *len);

/* An outside family: from now on paths "<name>/..." are read from <dir>/<name>/ on disk under
 * the same rules as a template dir's (whatever the template dir), while every other path
 * ("common/...", the built-in families) is read as before. The caller has checked the name
 * against the others (runtime/context.c). dir is copied. */
#define LJ_LUA_MAX_ROOTS 64
lajit_status lj_lua_add_family_root(lj_lua *L, const char *name, const char *dir);
/* The folder holding outside family name (its files are under <folder>/<name>), or NULL. */
const char *lj_lua_family_root(const lj_lua *L, const char *name);

#endif
