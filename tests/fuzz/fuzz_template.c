/* fuzz_template.c — the template engine (generator/template.h) in its sandbox on hostile
 * template text: the input is translated and expanded with a few constants, as a family's
 * source() would have it, in a fresh sandbox per input whose allocations are capped at 32 MiB
 * (the sandbox's own limits, instructions and time, are the library's: a loop that runs until
 * the instruction limit costs about a second). Any status is fine; a crash, an abort from a Lua
 * panic, a leak or a Lua stack left unbalanced is not. Seeds: corpus/template. */
#include <string.h>

#include <lua.h>

#include "fuzz.h"
#include "template.h"

#define MAX_TEMPLATE (64u << 10)

static void set_int(lua_State *S, const char *name, lua_Integer v)
{
    lua_pushinteger(S, v);
    lua_setfield(S, -2, name);
}

static void set_str(lua_State *S, const char *name, const char *v)
{
    lua_pushstring(S, v);
    lua_setfield(S, -2, name);
}

static void set_bool(lua_State *S, const char *name, int v)
{
    lua_pushboolean(S, v);
    lua_setfield(S, -2, name);
}

/* What a family gives its templates (family.c): configuration parameters and constants as
 * globals, the problem and the device as tables; enough for la_recurrent/recurrent.cu (a seed)
 * to expand whole. */
static void push_consts(lua_State *S)
{
    lua_newtable(S);
    set_int(S, "BLOCK", 64);
    set_int(S, "TILE_V", 16);
    set_int(S, "WARPS", 4);
    set_int(S, "STAGES", 2);
    set_str(S, "ELEM", "float");
    lua_pushnumber(S, 0.5);
    lua_setfield(S, -2, "SCALE");
    lua_newtable(S);
    set_str(S, "op", "fwd");
    set_str(S, "dtype", "f32");
    set_int(S, "B", 2);
    set_int(S, "H", 3);
    set_int(S, "N", 5);
    set_int(S, "D", 32);
    set_int(S, "E", 16);
    set_bool(S, "decay", 1);
    set_bool(S, "has_initial", 1);
    set_bool(S, "has_final", 1);
    set_bool(S, "varlen", 0);
    set_bool(S, "vk", 0);
    lua_setfield(S, -2, "problem");
    lua_newtable(S);
    set_str(S, "arch", "sm_90a");
    set_int(S, "cc", 90);
    set_int(S, "sms", 132);
    set_int(S, "smem_optin", 232448);
    lua_setfield(S, -2, "device");
    lua_createtable(S, 3, 0);
    for (int i = 1; i <= 3; i++) {
        lua_pushinteger(S, 16 * i);
        lua_rawseti(S, -2, i);
    }
    lua_setfield(S, -2, "tiles");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > MAX_TEMPLATE)
        return 0;
    lj_env env;
    lj_fuzz_heap heap;
    lj_fuzz_env(&env, &heap, 32u << 20);
    lj_lua *L;
    if (lj_lua_open(&env, NULL, &L) != LAJIT_OK)
        lj_fuzz_fail("cannot open a sandbox: %s", env.errmsg);
    lua_State *S = lj_lua_state(L);
    int top = lua_gettop(S);
    push_consts(S);
    char *out = NULL;
    lajit_status st = lj_template_expand(L, "fuzz/input.cu", (const char *)data, size, -1, &out);
    if (st == LAJIT_OK) {
        if (!out)
            lj_fuzz_fail("expansion succeeded with no text");
        (void)strlen(out);
        lj_free(&env, out);
    } else if (!env.errmsg[0]) {
        lj_fuzz_fail("status %d with no message", st);
    }
    lua_pop(S, 1);
    if (lua_gettop(S) != top)
        lj_fuzz_fail("expansion left the Lua stack at %d, not %d", lua_gettop(S), top);
    lj_lua_close(L);
    if (heap.held)
        lj_fuzz_fail("%zu bytes still held after the sandbox was closed", heap.held);
    return 0;
}
