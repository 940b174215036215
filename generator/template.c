/* template.c — the template engine (template.h).
 *
 * A template is translated into a Lua chunk with exactly one Lua line per template line, so
 * Lua's own error positions ("la_fwd/fwd.cu:42:") are template positions. Text lines become
 * calls appending string pieces; `//%` lines are copied as Lua; `${expr}` becomes a call that
 * formats the value (and names the expression and line when it cannot). The chunk runs in the
 * sandbox with a fresh environment whose reads fall back to the constants, then to the
 * sandbox's globals, and whose writes stay in the environment. */
#include "template.h"

#include <stdio.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#define OUT "__lajit_o"
#define FMT "__lajit_s"

/* Appends s (and a newline when nl) as a Lua string literal, escaping quotes, backslashes and
 * control characters. */
static void add_quoted_nl(lj_buf *b, const char *s, size_t n, int nl)
{
    lj_buf_add(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            lj_buf_add(b, e, 2);
        } else if (c < 32 || c == 127) {
            char e[8];
            snprintf(e, sizeof e, "\\%03u", c);
            lj_buf_add(b, e, 4);
        } else {
            lj_buf_add(b, (const char *)&c, 1);
        }
    }
    lj_buf_puts(b, nl ? "\\n\"" : "\"");
}

static void add_quoted(lj_buf *b, const char *s, size_t n)
{
    add_quoted_nl(b, s, n, 0);
}

/* Where a Lua line's code starts (just past its "//%", after optional blanks), or 0 for a line
 * of text. Works on the line's n bytes alone: the template need not end in a NUL. */
static size_t lua_code_start(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t'))
        i++;
    return n - i >= 3 && s[i] == '/' && s[i + 1] == '/' && s[i + 2] == '%' ? i + 3 : 0;
}

lajit_status lj_template_translate(lj_env *env, const char *name, const char *text, size_t len,
                                   char **lua_code)
{
    lj_buf b;
    lj_buf_init(&b, env);
    /* Prologue on line 1 (no newline) keeps the line numbering. */
    lj_buf_puts(&b, "local __lajit_t, __lajit_n = {}, 0; local function " OUT
                    "(s) __lajit_n = __lajit_n + 1; __lajit_t[__lajit_n] = s end; ");
    int need_line = 1;
    size_t pos = 0;
    int lineno = 0;
    while (pos < len) {
        lineno++;
        const char *line = text + pos;
        const char *nl = memchr(line, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - line) : len - pos;
        pos += n + (nl ? 1 : 0);
        size_t code = lua_code_start(line, n);
        if (code) {
            lj_buf_add(&b, line + code, n - code);
            lj_buf_add(&b, "\n", 1);
            need_line = 1;
            continue;
        }
        if (need_line) {
            char directive[600];
            snprintf(directive, sizeof directive, "#line %d \"%s\"\n", lineno, name);
            lj_buf_puts(&b, OUT "(");
            add_quoted(&b, directive, strlen(directive));
            lj_buf_puts(&b, ") ");
            need_line = 0;
        }
        size_t i = 0, start = 0;
        while (i < n) {
            if (line[i] == '$' && i + 2 < n && line[i + 1] == '$' && line[i + 2] == '{') {
                /* $${ is a literal ${ */
                if (i > start) {
                    lj_buf_puts(&b, OUT "(");
                    add_quoted(&b, line + start, i - start);
                    lj_buf_puts(&b, ") ");
                }
                lj_buf_puts(&b, OUT "(\"${\") ");
                i += 3;
                start = i;
            } else if (line[i] == '$' && i + 1 < n && line[i + 1] == '{') {
                size_t j = i + 2;
                int depth = 1;
                while (j < n && depth > 0) {
                    if (line[j] == '{')
                        depth++;
                    else if (line[j] == '}')
                        depth--;
                    if (depth > 0)
                        j++;
                }
                if (j >= n) {
                    lj_buf_free(&b);
                    return lj_error(env, LAJIT_ERR_TEMPLATE, "%s:%d: unterminated ${", name,
                                    lineno);
                }
                if (i > start) {
                    lj_buf_puts(&b, OUT "(");
                    add_quoted(&b, line + start, i - start);
                    lj_buf_puts(&b, ") ");
                }
                lj_buf_puts(&b, OUT "(" FMT "((");
                lj_buf_add(&b, line + i + 2, j - i - 2);
                lj_buf_printf(&b, "), %d, ", lineno);
                add_quoted(&b, line + i + 2, j - i - 2);
                lj_buf_puts(&b, ")) ");
                i = j + 1;
                start = i;
            } else {
                i++;
            }
        }
        lj_buf_puts(&b, OUT "(");
        add_quoted_nl(&b, line + start, n - start, 1);
        lj_buf_puts(&b, ")\n");
    }
    lj_buf_puts(&b, "\nreturn __lajit_t, __lajit_n\n");
    char *code = lj_buf_take(&b);
    if (!code)
        return lj_oom(env);
    *lua_code = code;
    return LAJIT_OK;
}

/* __lajit_s(value, line, expr): the text of a substituted value. */
static int format_value(lua_State *L)
{
    int line = (int)luaL_checkinteger(L, 2);
    const char *expr = luaL_checkstring(L, 3);
    switch (lua_type(L, 1)) {
        case LUA_TNUMBER:
            if (lua_isinteger(L, 1)) {
                lua_pushfstring(L, "%I", (LUAI_UACINT)lua_tointeger(L, 1));
            } else {
                char buf[64];
                snprintf(buf, sizeof buf, "%.17g", (double)lua_tonumber(L, 1));
                lua_pushstring(L, buf);
            }
            return 1;
        case LUA_TSTRING: lua_pushvalue(L, 1); return 1;
        case LUA_TBOOLEAN: lua_pushstring(L, lua_toboolean(L, 1) ? "true" : "false"); return 1;
        default:
            return luaL_error(L, "line %d: ${%s} is %s, not a number, string or boolean", line,
                              expr, luaL_typename(L, 1));
    }
}

/* __index of the template environment: constants first, then the sandbox's globals. */
static int env_index(lua_State *L)
{
    /* upvalue 1: consts table, upvalue 2: globals table; args: env, key */
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL)
        return 1;
    lua_pop(L, 1);
    lua_pushvalue(L, 2);
    lua_rawget(L, lua_upvalueindex(2));
    return 1;
}

/* build_env(consts) -> a fresh table whose reads fall back to consts, then the globals. */
static int build_env(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_newtable(L); /* env */
    lua_pushcfunction(L, format_value);
    lua_setfield(L, -2, FMT);
    lua_newtable(L); /* metatable */
    lua_pushvalue(L, 1);
    lua_pushglobaltable(L);
    lua_pushcclosure(L, env_index, 2);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, -2);
    return 1;
}

lajit_status lj_template_expand(lj_lua *h, const char *name, const char *text, size_t len,
                                int consts_index, char **out)
{
    lj_env *env = lj_lua_env(h);
    lua_State *L = lj_lua_state(h);
    consts_index = lua_absindex(L, consts_index);
    char *code;
    lajit_status st = lj_template_translate(env, name, text, len, &code);
    if (st != LAJIT_OK)
        return st;
    char chunkname[300];
    snprintf(chunkname, sizeof chunkname, "@%s", name);
    st = lj_lua_load(h, code, strlen(code), chunkname);
    lj_free(env, code);
    if (st != LAJIT_OK)
        return st;
    /* The environment allocates: build it in a protected call. */
    lua_pushcfunction(L, build_env);
    lua_pushvalue(L, consts_index);
    st = lj_lua_pcall(h, 1, 1);
    if (st != LAJIT_OK) {
        lua_pop(L, 1);
        return st;
    }
    /* stack: chunk, env */
    if (!lua_setupvalue(L, -2, 1)) {
        lua_pop(L, 2);
        return lj_error(env, LAJIT_ERR_INTERNAL, "template chunk has no _ENV");
    }
    st = lj_lua_pcall(h, 0, 2);
    if (st != LAJIT_OK)
        return st;
    /* The chunk's own return gives the pieces, but template Lua can return early or call the
     * appender with anything: the count must be an integer within the list, and every piece a
     * string (converting a number would allocate outside a protected call). */
    int isnum = 0;
    lua_Integer n = lua_tointegerx(L, -1, &isnum);
    if (!lua_istable(L, -2) || !isnum || n < 0 || (lua_Unsigned)n > lua_rawlen(L, -2)) {
        lua_pop(L, 2);
        return lj_error(env, LAJIT_ERR_TEMPLATE,
                        "%s: the template returned early or replaced its output", name);
    }
    lj_buf b;
    lj_buf_init(&b, env);
    for (lua_Integer i = 1; i <= n; i++) {
        if (lua_rawgeti(L, -2, i) != LUA_TSTRING) {
            lua_pop(L, 3);
            lj_buf_free(&b);
            return lj_error(env, LAJIT_ERR_TEMPLATE, "%s: output piece %lld is not a string", name,
                            (long long)i);
        }
        size_t plen;
        const char *piece = lua_tolstring(L, -1, &plen);
        lj_buf_add(&b, piece, plen);
        lua_pop(L, 1);
    }
    lua_pop(L, 2);
    char *result = lj_buf_take(&b);
    if (!result)
        return lj_oom(env);
    *out = result;
    return LAJIT_OK;
}
