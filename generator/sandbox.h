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
#define LJ_LUA_MAX_INSTRUCTIONS 200000000LL /* counted in hook steps of 1000 */
#define LJ_LUA_MAX_MEMORY (256u << 20)      /* bytes held by the Lua state */

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
 * when absent. */
lajit_status lj_lua_read_template(lj_lua *L, const char *path, const char **text, size_t *len);

#endif
