/* specs.c — hostile family specs, written into a fresh template dir per test: every bad shape a
 * spec's functions can return (a bad grid, a missing field, a wrong type, a non-table, huge or
 * negative values, too many entries, metamethods) is an error status naming the family, the
 * function and the field, with the Lua stack where it was — never a Lua panic; a spec that
 * burns its calls' instruction limits over and over meets its family's budget within seconds;
 * a huge parameter space or problem list is refused at load. */
#include "test.h"

#include <sys/stat.h>
#include <time.h>

#include <lua.h>

#include "family.h"
#include "plan.h"

static lj_env env;
static char dir[600];

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    fputs(text, f);
    fclose(f);
}

/* A template dir with common/ and the family "bad", whose spec is the base below with
 * `override` (Lua statements on the table s) applied before it is returned. */
static lj_lua *open_spec(const char *override)
{
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    snprintf(dir, sizeof dir, "%s/tpl", lj_test_tmpdir());
    char path[800];
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/common", dir);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/bad", dir);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/bad/k.cu", dir);
    write_text(path, "// ${NAME} ${UNROLL}\n");
    char spec[8192];
    snprintf(
        spec, sizeof spec,
        "local s = {\n"
        "  name = 'bad', op = 'fwd', params = { UNROLL = { 1, 2 } },\n"
        "  problems = { { D = 16 } },\n"
        "  valid = function() return true end,\n"
        "  default = function() return { UNROLL = 1 } end,\n"
        "  key = function() return 'k' end,\n"
        "  launch = function() return { grid = { 1, 'H', 'B' }, block = { 32, 1, 1 }, smem = 0,\n"
        "                               entry = 'k' } end,\n"
        "  source = function() return { template = 'bad/k.cu', consts = { NAME = 'k' } } end,\n"
        "}\n%s\nreturn s\n",
        override);
    snprintf(path, sizeof path, "%s/bad/family.lua", dir);
    write_text(path, spec);
    lj_lua *L;
    ASSERT_OK(lj_lua_open(&env, dir, &L));
    return L;
}

typedef struct bad_case {
    const char *override; /* Lua on s */
    const char *fn;       /* which function to call */
    const char *says;     /* what the message must contain besides "bad.<fn>" */
} bad_case;

/* Calls fn of the loaded family; returns its status. */
static lajit_status call_fn(lj_family *f, const char *fn)
{
    lj_problem p = {
        .op = LJ_OP_FWD, .dtype = LJ_BF16, .B = 1, .H = 1, .N = 64, .D = 16, .E = 16, .T = 1};
    lj_device_info d;
    ASSERT_TRUE(lj_device_info_for_arch("sm_90a", &d));
    lj_config c = {.n = 1, .names = {"UNROLL"}, .values = {1}};
    if (strcmp(fn, "launch") == 0) {
        lj_launch l;
        return lj_family_launch(f, &c, &p, &d, &l);
    }
    if (strcmp(fn, "default") == 0) {
        lj_config out;
        return lj_family_default(f, &p, &d, &out);
    }
    if (strcmp(fn, "valid") == 0) {
        int ok;
        char reason[64];
        return lj_family_valid(f, &c, &p, &d, &ok, reason, sizeof reason);
    }
    if (strcmp(fn, "key") == 0) {
        char key[128];
        return lj_family_key(f, &p, key, sizeof key);
    }
    char *src = NULL;
    lajit_status st = lj_family_source(f, &c, &p, &d, &src);
    lj_free(&env, src);
    return st;
}

static void expect_errors(const bad_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        lj_lua *L = open_spec(cases[i].override);
        lj_family *f;
        ASSERT_OK(lj_family_load(&env, L, "bad", &f));
        int top = lua_gettop(lj_lua_state(L));
        lajit_status st = call_fn(f, cases[i].fn);
        if (st != LAJIT_ERR_TEMPLATE)
            lj_test_fail(__FILE__, __LINE__, "%s: %s got %s: %s", cases[i].override, cases[i].fn,
                         lajit_status_string(st), env.errmsg);
        char want[64];
        snprintf(want, sizeof want, "bad.%s", cases[i].fn);
        if (!strstr(env.errmsg, want) || !strstr(env.errmsg, cases[i].says))
            lj_test_fail(__FILE__, __LINE__, "%s: message \"%s\" lacks \"%s\" or \"%s\"",
                         cases[i].override, env.errmsg, want, cases[i].says);
        ASSERT_EQ(lua_gettop(lj_lua_state(L)), top);
        /* The state is still good: a well-formed call goes through. */
        ASSERT_OK(call_fn(f, strcmp(cases[i].fn, "key") == 0 ? "valid" : "key"));
        lj_family_free(f);
        lj_lua_close(L);
    }
}

#define LAUNCH(x) "s.launch = function() return " x " end"

/* The reported abort: grid = {0, "H", "B"} underflowed the stack and Lua panicked (exit 134). */
LJ_TEST(bad_launch_results_are_errors)
{
    static const bad_case cases[] = {
        {LAUNCH("{ grid = { 0, 'H', 'B' }, block = { 32, 1, 1 }, entry = 'k' }"), "launch",
         "grid[1]"},
        {LAUNCH("{ block = { 32, 1, 1 }, entry = 'k' }"), "launch", "grid"},
        {LAUNCH("{ grid = { 1, 1, 1, 1 }, block = { 32, 1, 1 }, entry = 'k' }"), "launch", "grid"},
        {LAUNCH("{ grid = { 1, 'Q', 1 }, block = { 32, 1, 1 }, entry = 'k' }"), "launch",
         "grid[2]"},
        {LAUNCH("{ grid = { 1, 1, 1 << 40 }, block = { 32, 1, 1 }, entry = 'k' }"), "launch",
         "grid[3]"},
        {LAUNCH("{ grid = { 1.5, 1, 1 }, block = { 32, 1, 1 }, entry = 'k' }"), "launch",
         "grid[1]"},
        {LAUNCH("{ grid = { -3, 1, 1 }, block = { 32, 1, 1 }, entry = 'k' }"), "launch", "grid[1]"},
        {LAUNCH("{ grid = { { 'N' }, 1, 1 }, block = { 32, 1, 1 }, entry = 'k' }"), "launch",
         "grid[1]"},
        {LAUNCH("{ grid = { { 'N', 0 }, 1, 1 }, block = { 32, 1, 1 }, entry = 'k' }"), "launch",
         "grid[1]"},
        {LAUNCH("{ grid = { { 'N', 64, 9 }, 1, 1 }, block = { 32, 1, 1 }, entry = 'k' }"), "launch",
         "grid[1]"},
        {LAUNCH("{ grid = { {}, 1, 1 }, block = { 32, 1, 1 }, entry = 'k' }"), "launch", "grid[1]"},
        {LAUNCH("{ grid = 'N', block = { 32, 1, 1 }, entry = 'k' }"), "launch", "grid"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { 32, 'x', 1 }, entry = 'k' }"), "launch",
         "block[2]"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { -1, 1, 1 }, entry = 'k' }"), "launch", "block[1]"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { 1 << 62, 1 << 62, 1 << 62 }, entry = 'k' }"),
         "launch", "block[1]"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { 1024, 1024, 1 }, entry = 'k' }"), "launch",
         "threads"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { 32, 1 }, entry = 'k' }"), "launch", "block"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { 32, 1, 1 }, smem = -5, entry = 'k' }"), "launch",
         "smem"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { 32, 1, 1 }, smem = 'big', entry = 'k' }"),
         "launch", "smem"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { 32, 1, 1 }, smem = 1 << 40, entry = 'k' }"),
         "launch", "smem"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { 32, 1, 1 } }"), "launch", "entry"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { 32, 1, 1 }, entry = 5 }"), "launch", "entry"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { 32, 1, 1 }, entry = 'a b' }"), "launch", "entry"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { 32, 1, 1 }, entry = string.rep('k', 100) }"),
         "launch", "entry"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { 32, 1, 1 }, entry = 'k', split_ws = 4096 }"),
         "launch", "go together"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { 32, 1, 1 }, entry = 'k', split_ws = 4100, "
                "split_flags = 16 }"),
         "launch", "split_ws"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { 32, 1, 1 }, entry = 'k', split_ws = 16, "
                "split_flags = -16 }"),
         "launch", "split_flags"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { 32, 1, 1 }, entry = 'k', pdl = 1 }"), "launch",
         "pdl must be a boolean"},
        {LAUNCH("{ grid = { 1, 1, 1 }, block = { 32, 1, 1 }, entry = 'k', pdl = 'yes' }"), "launch",
         "pdl must be a boolean"},
        {LAUNCH("42"), "launch", "table"},
        {LAUNCH("nil"), "launch", "table"},
        /* Metamethods never run while results are read: an __index that loops, or a __len that
         * lies, is not consulted. */
        {LAUNCH("setmetatable({}, { __index = function() while true do end end })"), "launch",
         "grid"},
        {LAUNCH("{ grid = setmetatable({}, { __len = function() return 3 end }), block = { 32, 1, "
                "1 }, entry = 'k' }"),
         "launch", "grid"},
    };
    expect_errors(cases, sizeof cases / sizeof cases[0]);
}

LJ_TEST(bad_results_of_the_other_functions_are_errors)
{
    static const bad_case cases[] = {
        {"s.default = function() return 5 end", "default", "configuration table"},
        {"s.default = function() return {} end", "default", "UNROLL"},
        {"s.default = function() return { UNROLL = 'x' } end", "default", "UNROLL"},
        {"s.default = function() return { UNROLL = 2^70 } end", "default", "UNROLL"},
        {"s.default = function() return setmetatable({}, { __index = function() return 1 end }) "
         "end",
         "default", "UNROLL"},
        {"s.valid = function() return 'yes' end", "valid", "true, or false"},
        {"s.valid = function() return {} end", "valid", "true, or false"},
        {"s.key = function() return 5 end", "key", "string"},
        {"s.key = function() return string.rep('k', 10000) end", "key", "printable"},
        {"s.key = function() return 'a\\0b' end", "key", "printable"},
        {"s.key = function() return '' end", "key", "printable"},
        {"s.source = function() return 5 end", "source", "template"},
        {"s.source = function() return { template = 5 } end", "source", "template"},
        {"s.source = function() return { template = string.rep('a', 300) } end", "source",
         "template"},
        {"s.source = function() return { template = 'bad/k.cu', consts = 5 } end", "source",
         "consts"},
        {"s.source = function() error('boom') end", "source", "boom"},
    };
    expect_errors(cases, sizeof cases / sizeof cases[0]);
}

/* The spec's declarations are read once at load, under the same rules. */
LJ_TEST(bad_declarations_are_refused_at_load)
{
    static const struct {
        const char *override, *says;
    } cases[] = {
        {"s.problems = { { D = 1 << 40 } }", "problems[1]: problem.D"},
        {"s.problems = { { B = -1 } }", "problems[1]: problem.B"},
        {"s.problems = { { D = 16 }, { dtype = 5 } }", "problems[2]: problem.dtype"},
        {"s.problems = { { D = 16 }, 7 }", "problems[2]"},
        {"s.problems = {} for i = 1, 1000 do s.problems[i] = { D = 16 } end",
         "problems must be a list of 1 to 16"},
        {"s.params = { UNROLL = { 1, 'x' } }", "params.UNROLL[2]"},
        {"s.params = { UNROLL = { 1, 1 } }", "params.UNROLL[2]"},
        {"s.params = { unroll = { 1 } }", "parameter names"},
        {"s.params = { UNROLL = 5 }", "params.UNROLL must be a list"},
        /* 4^7 = 16384 configurations: over the cap, refused at once instead of swept for days. */
        {"s.params = {} for i = 1, 7 do s.params['P' .. i] = { 1, 2, 3, 4 } end",
         "over 4096 configurations"},
        {"s.params = {} for i = 1, 5 do s.params['P' .. i] = {} for j = 1, 64 do s.params['P' .. "
         "i][j] = j end end",
         "over 4096 configurations"},
        {"s.archs = 'sm_90a'", "archs must be a list"},
        {"s = setmetatable({}, { __index = s })", "name must be"},
        {"s = 5", "must return a table"},
        {"s.launch = 7", "launch must be a function"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lj_lua *L = open_spec(cases[i].override);
        int top = lua_gettop(lj_lua_state(L));
        lj_family *f = NULL;
        lajit_status st = lj_family_load(&env, L, "bad", &f);
        if (st != LAJIT_ERR_TEMPLATE || !strstr(env.errmsg, cases[i].says))
            lj_test_fail(__FILE__, __LINE__, "%s: got %s: \"%s\", want \"%s\"", cases[i].override,
                         lajit_status_string(st), env.errmsg, cases[i].says);
        ASSERT_EQ(lua_gettop(lj_lua_state(L)), top);
        lj_family_free(f);
        lj_lua_close(L);
    }
    /* What the load read cannot be changed by the spec's functions later. */
    lj_lua *L = open_spec("s.valid = function() s.problems = 5 s.params = nil return true end");
    lj_family *f;
    ASSERT_OK(lj_family_load(&env, L, "bad", &f));
    ASSERT_OK(call_fn(f, "valid"));
    lj_problem *p;
    int np;
    ASSERT_OK(lj_family_problems(f, &p, &np));
    ASSERT_EQ(np, 1);
    ASSERT_EQ(p[0].D, 16);
    lj_free(&env, p);
    ASSERT_EQ(lj_family_param_count(f), 1);
    lj_family_free(f);
    lj_lua_close(L);
}

/* A custom family's declared arguments (op "custom", generator/family_args.c): every malformed
 * declaration is refused at load with a message naming the entry; a good one loads, and its
 * grid may name its symbols but not the attention ops' variables. */
#define CUSTOM                                                                               \
    "s.op = 'custom' s.args = { { name = 'x', dtype = 'dtype', shape = { 'B', 'N' } },\n"    \
    "  { name = 'w', dtype = 'f32', shape = { 'N' }, optional = true },\n"                   \
    "  { name = 'y', dtype = 'dtype', shape = { 'B', 'N' }, output = true },\n"              \
    "  { name = 'alpha', scalar = 'f32' } }\n"                                               \
    "s.problems = { { B = 2, N = 64 } } s.dynamic = { 'B' }\n"                               \
    "s.launch = function() return { grid = { { 'N', 64 }, 'B', 1 }, block = { 64, 1, 1 },\n" \
    "  smem = 0, entry = 'k' } end\n"

LJ_TEST(bad_custom_declarations_are_refused_at_load)
{
    static const struct {
        const char *override, *says;
    } cases[] = {
        {CUSTOM "s.args = nil", "args must be a list of 1 to 24"},
        {CUSTOM "s.args = { 5 }", "args[1] must be a table"},
        {CUSTOM "s.args[1].name = 'op'", "args[1].name must be an identifier"},
        {CUSTOM "s.args[1].name = '1x'", "args[1].name must be an identifier"},
        {CUSTOM "s.args[2].name = 'x'", "args[2]: a second argument named x"},
        {CUSTOM "s.args[1].dtype = 'f64'", "args[1] (x): a tensor's dtype must be"},
        {CUSTOM "s.args[1].shape = {}", "args[1] (x): shape must be a list of 1 to 8"},
        {CUSTOM "s.args[1].shape = { 'B', 3 }", "args[1] (x): shape[2] must be a symbol name"},
        {CUSTOM "s.args[1].shape = { 'B', 'dtype' }", "args[1] (x): shape[2] must be a symbol"},
        {CUSTOM "s.args[3].shape = { 'B', 'has_w' }", "its flag has_w"},
        {CUSTOM "s.args[2].optional = 'yes'", "args[2] (w): optional must be a boolean"},
        {CUSTOM "s.args[2].fill = { 1, 0 }", "args[2] (w): fill must be {lo, hi}"},
        {CUSTOM "s.args[2].fill = { 0, 1 / 0 }", "args[2] (w): fill must be {lo, hi}"},
        {CUSTOM "s.args[2].align = 3", "args[2] (w): align must be a power of two"},
        {CUSTOM "s.args[2].align = 2", "args[2] (w): align must be a power of two"},
        {CUSTOM "s.args[4].scalar = 'f64'", "args[4].scalar must be f32, i32 or i64"},
        {CUSTOM "s.args = { { name = 'a', scalar = 'f32' } }", "at least one tensor"},
        {CUSTOM "s.args[5] = { name = 'ws', workspace = 1 }",
         "args[5] (ws): a workspace is { name = ..., workspace = true } and nothing else"},
        {CUSTOM "s.args[5] = { name = 'ws', workspace = true, dtype = 'f32' }",
         "args[5] (ws): a workspace is"},
        {CUSTOM "s.args[5] = { name = 'ws', workspace = false }", "args[5] (ws): a workspace is"},
        {CUSTOM "s.args[5] = { name = 'ws', workspace = true } "
                "s.args[6] = { name = 'ws2', workspace = true }",
         "args[6] (ws2): a second workspace (ws is one)"},
        {CUSTOM "s.args[5] = { name = 'x', workspace = true }", "a second argument named x"},
        {CUSTOM "s.args = { { name = 'ws', workspace = true } }", "at least one tensor"},
        {CUSTOM "s.args = {} for i = 1, 25 do s.args[i] = { name = 'a' .. i, scalar = 'i32' } end",
         "args must be a list of 1 to 24"},
        {CUSTOM "s.args[1].shape = {} for i = 1, 8 do s.args[1].shape[i] = 'S' .. i end "
                "s.args[3].shape = {} for i = 1, 8 do s.args[3].shape[i] = 'T' .. i end "
                "s.args[2].shape = { 'U' }",
         "more than 16 symbols"},
        {CUSTOM "s.dynamic = { 'M' }", "dynamic[1] must name a shape symbol"},
        {CUSTOM "s.dynamic = { 'has_w' }", "dynamic[1] must name a shape symbol"},
        {CUSTOM "s.dtypes = { 'f64' }", "dtypes[1] must be f32, f16 or bf16"},
        {CUSTOM "s.dtypes = {}", "dtypes must list 1 to 3"},
        {CUSTOM "s.problems = { { B = 0, N = 64 } }", "problems[1]: problem.B must be an integer"},
        {CUSTOM "s.problems = { { B = 2 } }", "problems[1]: problem.N must be an integer"},
        {CUSTOM "s.problems = { { B = 2, N = 64 }, 7 }", "problems[2]: a problem is not a table"},
        {CUSTOM "s.problems = { { B = 2, N = 64, has_w = 3 } }", "problem.has_w must be a boolean"},
        {CUSTOM "s.dtypes = { 'f16' } s.problems = { { dtype = 'bf16', B = 2, N = 64 } }",
         "problem.dtype must be one of the family's dtypes"},
        {"s.args = { { name = 'x', dtype = 'f32', shape = { 'N' } } }",
         "args is for op \"custom\" only"},
        {"s.op = 'sideways'", "op must be fwd, bwd, decode or custom"},
        {"s.problems = { { op = 'custom', D = 16 } }", "problems[1]: problem.op"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lj_lua *L = open_spec(cases[i].override);
        int top = lua_gettop(lj_lua_state(L));
        lj_family *f = NULL;
        lajit_status st = lj_family_load(&env, L, "bad", &f);
        if (st != LAJIT_ERR_TEMPLATE || !strstr(env.errmsg, cases[i].says))
            lj_test_fail(__FILE__, __LINE__, "%s: got %s: \"%s\", want \"%s\"", cases[i].override,
                         lajit_status_string(st), env.errmsg, cases[i].says);
        ASSERT_EQ(lua_gettop(lj_lua_state(L)), top);
        lj_family_free(f);
        lj_lua_close(L);
    }
    /* The good declaration: symbols in order of first use, then the flag. */
    lj_lua *L = open_spec(CUSTOM);
    lj_family *f;
    ASSERT_OK(lj_family_load(&env, L, "bad", &f));
    const lj_args_decl *d = lj_family_args(f);
    ASSERT_TRUE(d != NULL);
    ASSERT_EQ(d->n_args, 4);
    ASSERT_EQ(d->n_syms, 3);
    ASSERT_STREQ(d->sym[0].name, "B");
    ASSERT_EQ(d->sym[0].dynamic, 1);
    ASSERT_STREQ(d->sym[1].name, "N");
    ASSERT_STREQ(d->sym[2].name, "has_w");
    ASSERT_EQ(d->sym[2].flag, 1);
    ASSERT_EQ(d->arg[1].flag, 2);
    lj_problem *p;
    int np;
    ASSERT_OK(lj_family_problems(f, &p, &np));
    ASSERT_EQ(p[0].op, LJ_OP_CUSTOM);
    ASSERT_EQ(p[0].sym[1], 64);
    lj_device_info dev;
    ASSERT_TRUE(lj_device_info_for_arch("sm_90a", &dev));
    lj_config c = {.n = 1, .names = {"UNROLL"}, .values = {1}};
    lj_launch l;
    ASSERT_OK(lj_family_launch(f, &c, &p[0], &dev, &l));
    ASSERT_EQ(l.grid[0].var, LJ_VAR_SYM0 + 1);
    ASSERT_EQ(l.grid[0].div, 64);
    ASSERT_EQ(l.grid[1].var, LJ_VAR_SYM0);
    lj_free(&env, p);
    lj_family_free(f);
    lj_lua_close(L);
    /* A custom family's grid names its symbols, not H (which it does not declare). */
    L = open_spec(CUSTOM "s.launch = function() return { grid = { 'H', 1, 1 }, block = { 64, 1, 1 "
                         "}, smem = 0, entry = 'k' } end");
    ASSERT_OK(lj_family_load(&env, L, "bad", &f));
    ASSERT_OK(lj_family_problems(f, &p, &np));
    ASSERT_STATUS(lj_family_launch(f, &c, &p[0], &dev, &l), LAJIT_ERR_TEMPLATE);
    ASSERT_CONTAINS(env.errmsg, "names no shape symbol");
    lj_free(&env, p);
    lj_family_free(f);
    lj_lua_close(L);
}

/* A custom family's workspace (a `workspace = true` argument, sized by launch()): the sizes
 * launch() may say and what it may not; only a family that declares a workspace may size one. */
#define WS_LAUNCH(x)                                                                               \
    CUSTOM "s.args[5] = { name = 'ws', workspace = true }\n"                                       \
           "s.launch = function() return { grid = { 1, 'B', 1 }, block = { 64, 1, 1 }, smem = 0, " \
           "entry = 'k', workspace = " x " } end"

LJ_TEST(custom_workspace_sizes_are_checked)
{
    static const struct {
        const char *override, *says;
    } bad[] = {
        {WS_LAUNCH("-1"), "workspace must be a byte count"},
        {WS_LAUNCH("2^41"), "workspace must be a byte count"},
        {WS_LAUNCH("'big'"), "workspace must be a byte count"},
        {WS_LAUNCH("{ bytes = -16 }"), "workspace.bytes and workspace.per"},
        {WS_LAUNCH("{ per = 1.5, times = { 'B' } }"), "workspace.bytes and workspace.per"},
        {WS_LAUNCH("{ per = 64 }"), "workspace.per needs times"},
        {WS_LAUNCH("{ per = 64, times = { 'H' } }"), "workspace.times must list shape symbols"},
        {WS_LAUNCH("{ per = 64, times = { 'has_w' } }"), "workspace.times must list shape"},
        {WS_LAUNCH("{ per = 64, times = { 'B', 'N', 'B' } }"), "at most two shape symbols"},
        {WS_LAUNCH("{ per = 64, times = 'B' }"), "workspace.times must be a list"},
        {CUSTOM "s.launch = function() return { grid = { 1, 1, 1 }, block = { 64, 1, 1 }, "
                "entry = 'k', workspace = 64 } end",
         "workspace needs a workspace argument"},
    };
    lj_device_info dev;
    ASSERT_TRUE(lj_device_info_for_arch("sm_90a", &dev));
    lj_config c = {.n = 1, .names = {"UNROLL"}, .values = {1}};
    lj_problem *p;
    int np;
    lj_launch l;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lj_lua *L = open_spec(bad[i].override);
        lj_family *f;
        ASSERT_OK(lj_family_load(&env, L, "bad", &f));
        ASSERT_OK(lj_family_problems(f, &p, &np));
        lajit_status st = lj_family_launch(f, &c, &p[0], &dev, &l);
        if (st != LAJIT_ERR_TEMPLATE || !strstr(env.errmsg, bad[i].says))
            lj_test_fail(__FILE__, __LINE__, "%s: got %s: \"%s\", want \"%s\"", bad[i].override,
                         lajit_status_string(st), env.errmsg, bad[i].says);
        lj_free(&env, p);
        lj_family_free(f);
        lj_lua_close(L);
    }
    /* Good ones: 16 + 48 per row of B (B = 2 in the problem, 5 at a launch), a plain count, 0. */
    const struct {
        const char *size;
        long long b;
        unsigned long long bytes;
    } good[] = {{"{ bytes = 16, per = 48, times = { 'B' } }", 5, 16 + 48 * 5},
                {"{ per = 8, times = { 'B', 'N' } }", 3, 8 * 3 * 64},
                {"4096", 7, 4096},
                {"0", 7, 0},
                {"{ bytes = 32 }", 1, 32}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char spec[1024];
        snprintf(spec, sizeof spec, WS_LAUNCH("%s"), good[i].size);
        lj_lua *L = open_spec(spec);
        lj_family *f;
        ASSERT_OK(lj_family_load(&env, L, "bad", &f));
        ASSERT_EQ(lj_family_args(f)->workspace, 4);
        ASSERT_OK(lj_family_problems(f, &p, &np));
        ASSERT_OK(lj_family_launch(f, &c, &p[0], &dev, &l));
        long long vars[LJ_N_GRID_VARS] = {0};
        vars[LJ_VAR_SYM0] = good[i].b;
        vars[LJ_VAR_SYM0 + 1] = 64;
        unsigned long long bytes = 1;
        ASSERT_TRUE(lj_plan_ws_bytes(&l, vars, LJ_N_GRID_VARS, &bytes));
        ASSERT_EQ(bytes, good[i].bytes);
        /* A product past 2^50 bytes is refused, not wrapped. */
        vars[LJ_VAR_SYM0] = 1LL << 50;
        vars[LJ_VAR_SYM0 + 1] = 1LL << 40;
        ASSERT_EQ(lj_plan_ws_bytes(&l, vars, LJ_N_GRID_VARS, &bytes), l.ws_per ? 0 : 1);
        lj_free(&env, p);
        lj_family_free(f);
        lj_lua_close(L);
    }
}

/* 120 calls each just under the per-call instruction limit took 41 s: the family's budget stops
 * them after a few, and each later call fails at once. (Each call runs about 150 million
 * instructions: an ADD and a FORLOOP per iteration.) */
LJ_TEST(a_family_budget_bounds_repeated_calls)
{
    lj_lua *L = open_spec(
        "s.valid = function() local n = 0 for i = 1, 75000000 do n = n + 1 end return true end");
    lj_family *f;
    ASSERT_OK(lj_family_load(&env, L, "bad", &f));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int ok_calls = 0, limited = 0;
    for (int i = 0; i < 120 && !limited; i++) {
        lajit_status st = call_fn(f, "valid");
        if (st == LAJIT_OK)
            ok_calls++;
        else if (st == LAJIT_ERR_LIMIT)
            limited = 1;
        else
            lj_test_fail(__FILE__, __LINE__, "call %d: %s", i, env.errmsg);
    }
    ASSERT_TRUE(limited);
    ASSERT_CONTAINS(env.errmsg, "budget");
    ASSERT_CONTAINS(env.errmsg, "bad.valid");
    /* 1000 M instructions, plus what the refill adds while the calls run (1 % a second): on an
     * idle machine the seventh call of 150 M meets the end of the budget. */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double spent_s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    double allowed = (double)LJ_LUA_BUDGET_INSTRUCTIONS * (1.0 + spent_s / LJ_LUA_BUDGET_REFILL_S);
    ASSERT_TRUE(ok_calls <= (int)(allowed / 150e6));
    /* Once spent, the budget refills slowly (1 % a second): the next heavy call stops at once. */
    struct timespec t2;
    clock_gettime(CLOCK_MONOTONIC, &t2);
    ASSERT_STATUS(call_fn(f, "valid"), LAJIT_ERR_LIMIT);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ASSERT_LE_F((double)(t1.tv_sec - t2.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t2.tv_nsec), 5.0);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("%d calls of 150 M instructions before the budget stopped them, %.1f s\n", ok_calls,
           secs);
    lj_family_free(f);
    lj_lua_close(L);
}

/* The budget also counts CPU time spent in C library loops the instruction hook cannot see
 * (table.sort without a comparator runs a few hundred Lua instructions for 200,000 strings). */
LJ_TEST(a_budget_counts_cpu_time_in_c_loops)
{
    lj_lua *L = open_spec("");
    static const char code[] = "local t = {} for i = 1, 200000 do t[i] = tostring(i) end\n"
                               "for r = 1, 20 do table.sort(t) end";
    /* A small budget, so the test is quick: the mechanism is the same as for a family's. */
    lj_lua_budget small;
    lj_lua_budget_init(&small);
    small.cpu_ns = 300000000; /* 0.3 s */
    lj_lua_budget *prev = lj_lua_set_budget(L, &small);
    lajit_status st = LAJIT_OK;
    int calls = 0;
    for (; calls < 1000 && st == LAJIT_OK; calls++) {
        st = lj_lua_load(L, code, sizeof code - 1, "=sort"); /* refused too once it is spent */
        if (st == LAJIT_OK)
            st = lj_lua_pcall(L, 0, 0);
    }
    lj_lua_set_budget(L, prev);
    ASSERT_STATUS(st, LAJIT_ERR_LIMIT);
    ASSERT_CONTAINS(env.errmsg, "budget");
    ASSERT_TRUE(calls < 1000);
    ASSERT_TRUE(small.steps > 0); /* the instructions alone would have gone on */
    printf("the 0.3 s budget stopped the sorts after %d calls\n", calls);
    lj_lua_close(L);
}
