/* sandbox.c — the Lua host (sandbox.h): one sandboxed lua_State with the context's allocator,
 * a memory limit, an instruction limit per protected call, and only the harmless libraries. */
#include "sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "embedded.h"
#include "fs.h"

/* Files read from a template dir stay alive until close (borrowed by callers). */
typedef struct read_file {
    struct read_file *next;
    char *path;
    char *text;
    size_t len;
} read_file;

struct lj_lua {
    lua_State *L;
    lj_env *env;
    char *template_dir;
    size_t used;          /* bytes held by the Lua state */
    int over_memory;      /* the last refusal was our memory limit */
    int over_budget;      /* the instruction hook stopped the call */
    long long steps;      /* hook steps (of 1000 instructions) in the current call */
    long long step_limit; /* the current call's limit: the per-call one or what its budget has */
    int budget_steps;     /* the budget, not the per-call limit, sets step_limit */
    int budget_time;      /* the budget, not the per-call limit, sets the deadline */
    struct timespec deadline; /* wall-clock end of the current call (C library loops) */
    lj_lua_budget *budget;    /* shared by the calls that follow (lj_lua_set_budget), or NULL */
    long long budget_cpu0;    /* thread CPU time when it was set */
    read_file *files;
    size_t files_bytes; /* text held in files, against LJ_LUA_MAX_FILE_TOTAL */
    /* Outside families (lj_lua_add_family_root): paths "<name>/..." are read from <dir>/<name>. */
    int n_roots;
    struct {
        char name[64];
        char *dir;
    } roots[LJ_LUA_MAX_ROOTS];
};

static void *lua_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    lj_lua *h = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        lj_raw_alloc(h->env, ptr, old, 0);
        h->used -= old;
        return NULL;
    }
    if (nsize > old && h->used - old + nsize > LJ_LUA_MAX_MEMORY) {
        h->over_memory = 1;
        return NULL;
    }
    void *p = lj_raw_alloc(h->env, ptr, old, nsize);
    if (p)
        h->used = h->used - old + nsize;
    return p;
}

static int panic(lua_State *L)
{
    /* Never reached: every call into Lua is protected. Returning aborts, so say why first in
     * the only channel left. */
    (void)L;
    return 0;
}

/* Wall-clock budget of one protected call: the instruction count does not see work done inside
 * C library functions (table.sort, table.concat on large tables), so time is checked too. */
#define LJ_LUA_MAX_SECONDS 20

static void count_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    lj_lua *h = *(lj_lua **)lua_getextraspace(L);
    if (h->over_budget)
        luaL_error(L, "instruction limit exceeded");
    if (++h->steps > h->step_limit) {
        h->over_budget = 1;
        if (h->budget_steps)
            luaL_error(
                L, "Lua budget spent (%d million instructions, %d s of CPU, refilled over %d s)",
                (int)(LJ_LUA_BUDGET_INSTRUCTIONS / 1000000), LJ_LUA_BUDGET_CPU_S,
                LJ_LUA_BUDGET_REFILL_S);
        luaL_error(L, "instruction limit exceeded (%d million)",
                   (int)(LJ_LUA_MAX_INSTRUCTIONS / 1000000));
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec > h->deadline.tv_sec ||
        (now.tv_sec == h->deadline.tv_sec && now.tv_nsec > h->deadline.tv_nsec)) {
        h->over_budget = 1;
        if (h->budget_time)
            luaL_error(L, "Lua budget spent (%d s of CPU, refilled over %d s)", LJ_LUA_BUDGET_CPU_S,
                       LJ_LUA_BUDGET_REFILL_S);
        luaL_error(L, "time limit exceeded (%d s)", LJ_LUA_MAX_SECONDS);
    }
}

/* pcall that cannot swallow a limit: once the instruction, time or memory limit has been hit,
 * the error goes on up. (xpcall is absent: a message handler runs with hooks off when the error
 * came from the hook, so it could loop forever.) */
static int safe_pcall(lua_State *L)
{
    lj_lua *h = *(lj_lua **)lua_getextraspace(L);
    luaL_checkany(L, 1);
    int status = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
    if (status != LUA_OK && (h->over_budget || h->over_memory))
        return lua_error(L);
    lua_pushboolean(L, status == LUA_OK);
    lua_insert(L, 1);
    return lua_gettop(L);
}

/* setmetatable without __gc and __close: finalizers and to-be-closed handlers can run with
 * hooks off (during collection, or while an error from the hook unwinds), beyond any limit. */
static int safe_setmetatable(lua_State *L)
{
    if (lua_istable(L, 2)) {
        static const char *const banned[] = {"__gc", "__close", "__mode", NULL};
        for (const char *const *k = banned; *k; k++) {
            if (lua_getfield(L, 2, *k) != LUA_TNIL)
                return luaL_error(L, "metatables with %s are not allowed in templates", *k);
            lua_pop(L, 1);
        }
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

/* string.rep with its size checked first: the C loop of string.rep('', huge) allocates nothing
 * and would run for ever; a result over the memory limit is a limit error at once. */
static int safe_rep(lua_State *L)
{
    lj_lua *h = *(lj_lua **)lua_getextraspace(L);
    size_t len, lsep = 0;
    luaL_checklstring(L, 1, &len);
    lua_Integer n = luaL_checkinteger(L, 2);
    luaL_optlstring(L, 3, "", &lsep);
    if (n <= 0 || (len == 0 && lsep == 0)) {
        lua_pushliteral(L, "");
        return 1;
    }
    if ((lua_Unsigned)n > LJ_LUA_MAX_MEMORY / (len + lsep)) {
        h->over_memory = 1;
        return luaL_error(L, "string.rep of %I copies exceeds the template memory limit",
                          (LUAI_UACINT)n);
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

static int log_print(lua_State *L)
{
    lj_lua *h = *(lj_lua **)lua_getextraspace(L);
    luaL_Buffer b;
    int n = lua_gettop(L);
    luaL_buffinit(L, &b);
    for (int i = 1; i <= n; i++) {
        if (i > 1)
            luaL_addchar(&b, '\t');
        luaL_tolstring(L, i, NULL);
        luaL_addvalue(&b);
    }
    luaL_pushresult(&b);
    lj_log(h->env, LAJIT_LOG_DEBUG, "lua: %s", lua_tostring(L, -1));
    return 0;
}

/* import("common/scan.lua"): runs another Lua file of the template folder (text only, under
 * the same limits as the caller) and returns its value, cached per state, so families share
 * helpers without a module system. */
static int import_lua(lua_State *L)
{
    lj_lua *h = *(lj_lua **)lua_getextraspace(L);
    size_t n;
    const char *path = luaL_checklstring(L, 1, &n);
    if (n < 5 || n > 120 || strcmp(path + n - 4, ".lua") != 0)
        return luaL_error(L, "import: %s is not a .lua file of the template folder", path);
    lua_getfield(L, LUA_REGISTRYINDEX, "lajit.imports");
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setfield(L, LUA_REGISTRYINDEX, "lajit.imports");
    }
    if (lua_getfield(L, -1, path) != LUA_TNIL)
        return 1;
    lua_pop(L, 1);
    const char *text;
    size_t len;
    if (lj_lua_read_template(h, path, &text, &len) != LAJIT_OK)
        return luaL_error(L, "import: no file %s in the template folder", path);
    char chunk[128];
    snprintf(chunk, sizeof chunk, "@%s", path);
    if (luaL_loadbufferx(L, text, len, chunk, "t") != LUA_OK)
        return lua_error(L);
    lua_call(L, 0, 1);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, path);
    return 1;
}

/* Opens the allowed libraries and removes what a template must not reach. Runs protected. */
static int open_sandbox(lua_State *L)
{
    static const luaL_Reg libs[] = {
        {LUA_GNAME, luaopen_base},       {LUA_STRLIBNAME, luaopen_string},
        {LUA_TABLIBNAME, luaopen_table}, {LUA_MATHLIBNAME, luaopen_math},
        {LUA_UTF8LIBNAME, luaopen_utf8},
    };
    for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
        luaL_requiref(L, libs[i].name, libs[i].func, 1);
        lua_pop(L, 1);
    }
    static const char *const base_removed[] = {"dofile", "loadfile",       "load",   "require",
                                               "xpcall", "collectgarbage", "rawlen", NULL};
    for (const char *const *n = base_removed; *n; n++) {
        lua_pushnil(L);
        lua_setglobal(L, *n);
    }
    lua_pushcfunction(L, log_print);
    lua_setglobal(L, "print");
    lua_pushcfunction(L, safe_pcall);
    lua_setglobal(L, "pcall");
    lua_pushcfunction(L, import_lua);
    lua_setglobal(L, "import");
    lua_getglobal(L, "setmetatable");
    lua_pushcclosure(L, safe_setmetatable, 1);
    lua_setglobal(L, "setmetatable");
    lua_getglobal(L, LUA_STRLIBNAME);
    lua_getfield(L, -1, "rep");
    lua_pushcclosure(L, safe_rep, 1);
    lua_setfield(L, -2, "rep");
    lua_pop(L, 1);
    /* table.move's C loop runs up to 2^63 times without allocating. */
    lua_getglobal(L, LUA_TABLIBNAME);
    lua_pushnil(L);
    lua_setfield(L, -2, "move");
    lua_pop(L, 1);
    /* Hide the string metatable (getmetatable("") gives false): a template could otherwise give
     * every string a __close or __index of its own. */
    lua_pushliteral(L, "");
    if (lua_getmetatable(L, -1)) {
        lua_pushboolean(L, 0);
        lua_setfield(L, -2, "__metatable");
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    /* Pattern functions run loops in C that the instruction hook cannot interrupt; dump makes
     * bytecode, which is never loaded anyway. */
    lua_getglobal(L, LUA_STRLIBNAME);
    static const char *const string_removed[] = {"dump", "find", "match", "gmatch", "gsub", NULL};
    for (const char *const *n = string_removed; *n; n++) {
        lua_pushnil(L);
        lua_setfield(L, -2, *n);
    }
    lua_pop(L, 1);
    /* math.random is seeded from the clock in 5.4: fix it so expansions are reproducible. */
    lua_getglobal(L, LUA_MATHLIBNAME);
    lua_pushnil(L);
    lua_setfield(L, -2, "randomseed");
    lua_pushnil(L);
    lua_setfield(L, -2, "random");
    lua_pop(L, 1);
    return 0;
}

lajit_status lj_lua_open(lj_env *env, const char *template_dir, lj_lua **out)
{
    lj_lua *h = lj_calloc(env, 1, sizeof *h);
    if (!h)
        return lj_oom(env);
    h->env = env;
    if (template_dir && !(h->template_dir = lj_strdup(env, template_dir))) {
        lj_free(env, h);
        return lj_oom(env);
    }
    h->L = lua_newstate(lua_alloc, h);
    if (!h->L) {
        lajit_status st = h->over_memory ? LAJIT_ERR_LIMIT : lj_oom(env);
        lj_free(env, h->template_dir);
        lj_free(env, h);
        return st;
    }
    *(lj_lua **)lua_getextraspace(h->L) = h;
    lua_atpanic(h->L, panic);
    lua_pushcfunction(h->L, open_sandbox);
    lajit_status st = lj_lua_pcall(h, 0, 0);
    if (st != LAJIT_OK) {
        if (st == LAJIT_ERR_TEMPLATE) /* only an allocation can fail while opening */
            st = lj_oom(env);
        lj_lua_close(h);
        return st;
    }
    *out = h;
    return LAJIT_OK;
}

void lj_lua_close(lj_lua *h)
{
    if (!h)
        return;
    lj_env *env = h->env;
    if (h->L)
        lua_close(h->L);
    for (read_file *f = h->files, *next; f; f = next) {
        next = f->next;
        lj_free(env, f->path);
        lj_free(env, f->text);
        lj_free(env, f);
    }
    lj_free(env, h->template_dir);
    for (int i = 0; i < h->n_roots; i++)
        lj_free(env, h->roots[i].dir);
    lj_free(env, h);
}

lua_State *lj_lua_state(lj_lua *h)
{
    return h->L;
}

lj_env *lj_lua_env(lj_lua *h)
{
    return h->env;
}

const char *lj_lua_template_dir(lj_lua *h)
{
    return h->template_dir;
}

static long long clock_ns(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

void lj_lua_budget_init(lj_lua_budget *b)
{
    b->steps = LJ_LUA_BUDGET_INSTRUCTIONS / 1000;
    b->cpu_ns = LJ_LUA_BUDGET_CPU_S * 1000000000LL;
    b->last_ns = clock_ns(CLOCK_MONOTONIC);
}

lj_lua_budget *lj_lua_set_budget(lj_lua *h, lj_lua_budget *b)
{
    lj_lua_budget *prev = h->budget;
    long long now = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    if (prev)
        prev->cpu_ns -= now - h->budget_cpu0;
    h->budget = b;
    h->budget_cpu0 = now;
    return prev;
}

/* Adds what the wall-clock time since the last refill earns, up to a full budget. */
static void budget_refill(lj_lua_budget *b)
{
    long long now = clock_ns(CLOCK_MONOTONIC);
    long long dt = now - b->last_ns;
    if (dt <= 0)
        return;
    b->last_ns = now;
    const long long full_steps = LJ_LUA_BUDGET_INSTRUCTIONS / 1000;
    const long long full_ns = LJ_LUA_BUDGET_CPU_S * 1000000000LL;
    /* Per second of wall time, 1/REFILL of each; in doubles, so a long idle cannot overflow. */
    double frac = (double)dt / (1e9 * LJ_LUA_BUDGET_REFILL_S);
    double steps = (double)b->steps + frac * (double)full_steps;
    double ns = (double)b->cpu_ns + frac * (double)full_ns;
    b->steps = steps >= (double)full_steps ? full_steps : (long long)steps;
    b->cpu_ns = ns >= (double)full_ns ? full_ns : (long long)ns;
}

/* Refills the current budget and returns the CPU nanoseconds it has left, counting what was
 * spent since it was set; sets *empty when nothing is left. */
static long long budget_left(lj_lua *h, int *empty)
{
    lj_lua_budget *b = h->budget;
    budget_refill(b);
    long long left = b->cpu_ns - (clock_ns(CLOCK_THREAD_CPUTIME_ID) - h->budget_cpu0);
    *empty = b->steps <= 0 || left <= 0;
    return left;
}

static lajit_status budget_spent(lj_lua *h)
{
    return lj_error(h->env, LAJIT_ERR_LIMIT,
                    "Lua budget spent (%d million instructions, %d s of CPU, refilled over %d s)",
                    (int)(LJ_LUA_BUDGET_INSTRUCTIONS / 1000000), LJ_LUA_BUDGET_CPU_S,
                    LJ_LUA_BUDGET_REFILL_S);
}

lajit_status lj_lua_load(lj_lua *h, const char *text, size_t len, const char *chunkname)
{
    h->over_memory = 0;
    int empty = 0;
    if (h->budget)
        budget_left(h, &empty);
    if (empty)
        return budget_spent(h);
    int r = luaL_loadbufferx(h->L, text, len, chunkname, "t");
    if (r == LUA_OK)
        return LAJIT_OK;
    const char *msg = lua_tostring(h->L, -1);
    lajit_status st = r == LUA_ERRMEM ? (h->over_memory ? LAJIT_ERR_LIMIT : LAJIT_ERR_OUT_OF_MEMORY)
                                      : LAJIT_ERR_TEMPLATE;
    st = lj_error(h->env, st, "%s", msg ? msg : "cannot load chunk (out of memory)");
    lua_pop(h->L, 1);
    return st;
}

static int traceback(lua_State *L)
{
    const char *msg = lua_tostring(L, 1);
    if (!msg)
        msg = "(error object is not a string)";
    luaL_traceback(L, L, msg, 1);
    return 1;
}

lajit_status lj_lua_pcall(lj_lua *h, int nargs, int nresults)
{
    lua_State *L = h->L;
    int base = lua_gettop(L) - nargs;
    h->steps = 0;
    h->over_budget = 0;
    h->over_memory = 0;
    h->step_limit = LJ_LUA_MAX_INSTRUCTIONS / 1000;
    h->budget_steps = 0;
    h->budget_time = 0;
    long long seconds_ns = LJ_LUA_MAX_SECONDS * 1000000000LL;
    lj_lua_budget *b = h->budget;
    if (b) {
        int empty;
        long long left = budget_left(h, &empty);
        if (empty) {
            lua_pop(L, nargs + 1);
            return budget_spent(h);
        }
        if (b->steps < h->step_limit) {
            h->step_limit = b->steps;
            h->budget_steps = 1;
        }
        if (left < seconds_ns) {
            seconds_ns = left; /* wall time is at least CPU time: a sound bound */
            h->budget_time = 1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &h->deadline);
    h->deadline.tv_sec += (time_t)(seconds_ns / 1000000000LL);
    h->deadline.tv_nsec += (long)(seconds_ns % 1000000000LL);
    if (h->deadline.tv_nsec >= 1000000000L) {
        h->deadline.tv_sec++;
        h->deadline.tv_nsec -= 1000000000L;
    }
    if (!lua_checkstack(L, 2)) {
        lua_pop(L, nargs + 1);
        return lj_oom(h->env);
    }
    lua_pushcfunction(L, traceback);
    lua_insert(L, base);
    lua_sethook(L, count_hook, LUA_MASKCOUNT, 1000);
    int r = lua_pcall(L, nargs, nresults, base);
    lua_sethook(L, NULL, 0, 0);
    lua_remove(L, base);
    if (b)
        b->steps -= h->steps; /* its CPU time is charged when the budget is unset */
    if (r == LUA_OK)
        return LAJIT_OK;
    lajit_status st;
    if (r == LUA_ERRMEM)
        st = h->over_memory ? LAJIT_ERR_LIMIT : LAJIT_ERR_OUT_OF_MEMORY;
    else
        st = h->over_memory || h->over_budget ? LAJIT_ERR_LIMIT : LAJIT_ERR_TEMPLATE;
    const char *msg = lua_tostring(L, -1);
    if (st == LAJIT_ERR_LIMIT && h->over_memory)
        lj_error(h->env, st, "template memory limit exceeded (%u MiB)", LJ_LUA_MAX_MEMORY >> 20);
    else if (st == LAJIT_ERR_OUT_OF_MEMORY)
        lj_oom(h->env);
    else
        lj_error(h->env, st, "%s", msg ? msg : "Lua error");
    lua_pop(L, 1);
    return st;
}

/* Whether path is a plain relative path inside the template folder: components of letters,
 * digits, '_', '-' and '.', none empty, "." or "..". */
static int safe_template_path(const char *path)
{
    size_t n = strlen(path);
    if (n == 0 || n > 255 || path[0] == '/')
        return 0;
    const char *c = path;
    while (*c) {
        size_t len = strcspn(c, "/");
        if (len == 0 || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
            return 0;
        for (size_t i = 0; i < len; i++) {
            char ch = c[i];
            if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                  (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' || ch == '.'))
                return 0;
        }
        c += len;
        if (*c == '/' && *++c == 0)
            return 0; /* a trailing slash */
    }
    return 1;
}

/* Opens path under the template dir without following a symbolic link anywhere below the dir
 * (O_NOFOLLOW on every component) and without blocking on a FIFO or device (O_NONBLOCK; the
 * caller then insists on a regular file). Returns the descriptor, or -1 with errno set. */
static int open_below(lj_lua *h, const char *base, const char *path)
{
    int dir = lj_fs_open(h->env, base, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (dir < 0)
        return -1;
    const char *c = path;
    for (;;) {
        size_t len = strcspn(c, "/");
        char comp[256];
        memcpy(comp, c, len);
        comp[len] = 0;
        int last = c[len] == 0;
        int flags =
            O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | (last ? O_NONBLOCK : O_DIRECTORY);
        int fd = lj_fs_openat(h->env, dir, comp, flags, 0);
        int saved = errno;
        close(dir);
        errno = saved;
        if (fd < 0 || last)
            return fd;
        dir = fd;
        c += len + 1;
    }
}

lajit_status lj_lua_add_family_root(lj_lua *h, const char *name, const char *dir)
{
    if (h->n_roots == LJ_LUA_MAX_ROOTS)
        return lj_error(h->env, LAJIT_ERR_INVALID_ARGUMENT, "more than %d outside families",
                        LJ_LUA_MAX_ROOTS);
    if (strlen(name) >= sizeof h->roots[0].name || !safe_template_path(name) || strchr(name, '/'))
        return lj_error(h->env, LAJIT_ERR_INVALID_ARGUMENT, "outside family name \"%s\" refused",
                        name);
    char *d = lj_strdup(h->env, dir);
    if (!d)
        return lj_oom(h->env);
    snprintf(h->roots[h->n_roots].name, sizeof h->roots[0].name, "%s", name);
    h->roots[h->n_roots++].dir = d;
    return LAJIT_OK;
}

const char *lj_lua_family_root(const lj_lua *h, const char *name)
{
    for (int i = 0; i < h->n_roots; i++)
        if (strcmp(h->roots[i].name, name) == 0)
            return h->roots[i].dir;
    return NULL;
}

/* The folder an outside family's path is read under, or NULL when path is not one's. */
static const char *root_of(const lj_lua *h, const char *path)
{
    for (int i = 0; i < h->n_roots; i++) {
        size_t n = strlen(h->roots[i].name);
        if (strncmp(path, h->roots[i].name, n) == 0 && path[n] == '/')
            return h->roots[i].dir;
    }
    return NULL;
}

lajit_status lj_lua_read_template(lj_lua *h, const char *path, const char **text, size_t *len)
{
    lj_env *env = h->env;
    const char *base = root_of(h, path);
    if (!base)
        base = h->template_dir;
    if (!base) {
        const lj_embedded_file *f = lj_embedded_find(path);
        if (!f)
            return lj_error(env, LAJIT_ERR_NOT_FOUND, "no template file %s", path);
        *text = f->data;
        *len = f->size;
        return LAJIT_OK;
    }
    if (!safe_template_path(path))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                        "template path %s leaves the template folder "
                        "or is not a plain relative path",
                        path);
    for (read_file *f = h->files; f; f = f->next) {
        if (strcmp(f->path, path) == 0) {
            *text = f->text;
            *len = f->len;
            return LAJIT_OK;
        }
    }
    int fd = open_below(h, base, path);
    if (fd < 0) {
        if (errno == ENOENT)
            return lj_error(env, LAJIT_ERR_NOT_FOUND, "no template file %s/%s", base, path);
        if (errno == ELOOP || errno == ENOTDIR)
            return lj_error(env, LAJIT_ERR_IO,
                            "template file %s/%s: a symbolic link (or a non-folder) "
                            "on its path is refused",
                            base, path);
        return lj_error(env, LAJIT_ERR_IO, "template file %s/%s: %s", base, path, strerror(errno));
    }
    struct stat st;
    const char *refused = NULL;
    if (fstat(fd, &st) != 0)
        refused = "cannot be examined";
    else if (!S_ISREG(st.st_mode))
        refused = "is not a regular file";
    else if (st.st_size < 0 || (unsigned long long)st.st_size > LJ_LUA_MAX_FILE)
        refused = "is larger than a template may be (1 MiB)";
    else if (h->files_bytes + (size_t)st.st_size > LJ_LUA_MAX_FILE_TOTAL)
        refused = "would take the template files read over 16 MiB in all";
    if (refused) {
        close(fd);
        return lj_error(env, LAJIT_ERR_IO, "template file %s/%s %s: refused", base, path, refused);
    }
    read_file *f = lj_calloc(env, 1, sizeof *f);
    size_t cap = (size_t)st.st_size; /* the file may grow after fstat: never read past this */
    char *data = f ? lj_malloc(env, cap + 1) : NULL;
    char *p = data ? lj_strdup(env, path) : NULL;
    if (!p) {
        close(fd);
        lj_free(env, data);
        lj_free(env, f);
        return lj_oom(env);
    }
    size_t got = 0;
    int failed = 0;
    while (got < cap) {
        ssize_t n = lj_fs_read(env, fd, data + got, cap - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            failed = errno;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    if (failed) {
        lj_free(env, p);
        lj_free(env, data);
        lj_free(env, f);
        return lj_error(env, LAJIT_ERR_IO, "template file %s/%s: %s", base, path, strerror(failed));
    }
    data[got] = 0;
    f->path = p;
    f->text = data;
    f->len = got;
    f->next = h->files;
    h->files = f;
    h->files_bytes += got;
    *text = data;
    *len = got;
    return LAJIT_OK;
}
