/* cli.c — the `lajit` command's option handling (run as a child process) and the public
 * parameter discovery API (lajit_family_describe / lajit_family_param).
 *
 * CLI cases: numbers are checked in full and in range (-j abc, -1, 100000 are usage errors, exit
 * 2), any number of -p assignments is accepted, `gen --db` on a missing file fails and creates
 * nothing, read-only `db` actions create nothing, and `gen --db` still picks the database's
 * winner. Discovery cases: every built-in family's parameters, values and bounds equal its
 * family.lua's `params` as a plain Lua interpreter reads them, and misuse gets a clear status. */
#include <sys/stat.h>
#include <sys/wait.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "context.h"
#include "problem.h"
#include "search.h"
#include "test.h"
#include "tunedb.h"

/* Runs `lajit ARGS` with the case's cache directory, output to a file; returns its exit status
 * (-1 when it did not exit normally) and its combined stdout and stderr in out. */
static int run_cli(const char *args, char *out, size_t cap)
{
    const char *bin = getenv("LAJIT_TEST_BINARY_DIR");
    ASSERT_TRUE(bin != NULL);
    char log[1024], cmd[16384];
    snprintf(log, sizeof log, "%s/cli.log", lj_test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s/tools/lajit' %s > '%s' 2>&1", bin, args, log);
    int st = system(cmd);
    FILE *f = fopen(log, "r");
    ASSERT_TRUE(f != NULL);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Each command that takes -j refuses a value that is not a whole number in 1..1024 with a usage
 * error naming the option, before doing any work (atoi made these 0 or huge thread counts). */
static void expect_bad_jobs(const char *value)
{
    static const char *commands[] = {
        "compile la_recurrent --arch sm_80 -p D=64 -p E=64",
        "gen --family la_recurrent --arch sm_80 -o '%s/x.bundle'",
        "tune --family la_recurrent",
    };
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        char base[512], args[1024], out[8192];
        snprintf(base, sizeof base, commands[i], lj_test_tmpdir());
        snprintf(args, sizeof args, "%s -j %s", base, value);
        ASSERT_EQ(run_cli(args, out, sizeof out), 2);
        ASSERT_CONTAINS(out, "-j wants an integer from 1 to 1024");
    }
    char bundle[1024];
    snprintf(bundle, sizeof bundle, "%s/x.bundle", lj_test_tmpdir());
    ASSERT_TRUE(!exists(bundle));
}

LJ_TEST(jobs_not_a_number)
{
    expect_bad_jobs("abc");
    expect_bad_jobs("4x");
    expect_bad_jobs("''");
}

LJ_TEST(jobs_negative)
{
    expect_bad_jobs("-1");
    expect_bad_jobs("0");
}

LJ_TEST(jobs_too_large)
{
    expect_bad_jobs("100000");
    expect_bad_jobs("99999999999999999999");
}

/* The other numeric options go through the same check. */
LJ_TEST(tune_numbers_checked)
{
    char out[8192];
    ASSERT_EQ(run_cli("tune --family la_recurrent --runs 5abc", out, sizeof out), 2);
    ASSERT_CONTAINS(out, "--runs wants an integer");
    ASSERT_EQ(run_cli("tune --family la_recurrent --warmup -3", out, sizeof out), 2);
    ASSERT_CONTAINS(out, "--warmup wants an integer");
}

/* A 65th -p used to be "unexpected argument" (a fixed table of 64): 200 are fine, and the last
 * one given wins. */
LJ_TEST(many_assignments)
{
    static char args[16384], out[1 << 16];
    int len = snprintf(args, sizeof args, "expand la_recurrent --arch sm_80");
    for (int i = 0; i < 199; i++)
        len += snprintf(args + len, sizeof args - (size_t)len, " -p D=64");
    snprintf(args + len, sizeof args - (size_t)len, " -p TILE_V=16");
    ASSERT_EQ(run_cli(args, out, sizeof out), 0);
    ASSERT_CONTAINS(out, "extern \"C\"");
    /* The assignments took effect: the same expansion as the two given once. */
    static char once[1 << 16];
    ASSERT_EQ(run_cli("expand la_recurrent --arch sm_80 -p D=64 -p TILE_V=16", once, sizeof once),
              0);
    ASSERT_STREQ(out, once);
}

/* compile and gen took at most 64 and 63: 100 -p reach the library (here to fail on an unknown
 * arch, after parsing, so nothing is compiled). */
LJ_TEST(many_assignments_compile_and_gen)
{
    static const char *commands[] = {"compile la_recurrent --arch sm_999",
                                     "gen --family la_recurrent --arch sm_999 -o '%s/x.bundle'"};
    for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++) {
        static char args[16384], out[8192];
        int len = snprintf(args, sizeof args, commands[c], lj_test_tmpdir());
        for (int i = 0; i < 100; i++)
            len += snprintf(args + len, sizeof args - (size_t)len, " -p D=64");
        ASSERT_EQ(run_cli(args, out, sizeof out), 1);
        ASSERT_CONTAINS(out, "unknown arch sm_999");
        ASSERT_TRUE(strstr(out, "unexpected argument") == NULL);
    }
}

/* Malformed assignments are errors with the assignment named, never a crash. */
LJ_TEST(bad_assignments_are_errors)
{
    static const char *bad[] = {"=",
                                "D=",
                                "=64",
                                "D=64x",
                                "D=99999999999999999999",
                                "NOT_A_PARAMETER_OF_ANY_FAMILY_AT_ALL=1",
                                "TILE_V=7",
                                "dtype=f8"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[512], out[8192];
        snprintf(args, sizeof args, "expand la_recurrent -p '%s'", bad[i]);
        ASSERT_EQ(run_cli(args, out, sizeof out), 1);
        ASSERT_CONTAINS(out, "invalid argument");
    }
}

/* `gen --db` naming a file that does not exist is an error, and neither the database nor its
 * directory is created (it used to create the directory and a fresh tune.db, and exit 0). */
LJ_TEST(gen_db_missing_path)
{
    char args[4096], out[8192], dir[1024], bundle[1024];
    snprintf(dir, sizeof dir, "%s/nonexistent", lj_test_tmpdir());
    snprintf(bundle, sizeof bundle, "%s/out.bundle", lj_test_tmpdir());
    snprintf(args, sizeof args, "gen --family la_recurrent --arch sm_80 --db '%s/tune.db' -o '%s'",
             dir, bundle);
    ASSERT_EQ(run_cli(args, out, sizeof out), 1);
    ASSERT_CONTAINS(out, "tune.db");
    ASSERT_CONTAINS(out, "No such file");
    ASSERT_TRUE(!exists(dir));
    ASSERT_TRUE(!exists(bundle));
    /* An existing directory without tune.db: an error too, and no tune.db appears. */
    snprintf(args, sizeof args, "gen --family la_recurrent --arch sm_80 --db '%s/tune.db' -o '%s'",
             lj_test_tmpdir(), bundle);
    ASSERT_EQ(run_cli(args, out, sizeof out), 1);
    snprintf(dir, sizeof dir, "%s/tune.db", lj_test_tmpdir());
    ASSERT_TRUE(!exists(dir));
    ASSERT_TRUE(!exists(bundle));
}

/* `db show` and `db export` only read: with no database they create neither the cache directory
 * nor a tune.db (they used to create both). */
LJ_TEST(db_read_creates_nothing)
{
    char args[4096], out[8192], dir[1024];
    snprintf(dir, sizeof dir, "%s/fresh-cache", lj_test_tmpdir());
    setenv("LAJIT_CACHE_DIR", dir, 1);
    ASSERT_EQ(run_cli("db show", out, sizeof out), 0);
    ASSERT_CONTAINS(out, "no tuning database");
    ASSERT_TRUE(!exists(dir));
    snprintf(args, sizeof args, "db export '%s/out.jsonl'", lj_test_tmpdir());
    ASSERT_EQ(run_cli(args, out, sizeof out), 1);
    ASSERT_TRUE(!exists(dir));
}

/* The bundle policy (autotune/gen.c) takes the database's winner for the bucket on a GPU of the
 * arch's compute capability: a winner recorded for sm_80 that differs from the default is what
 * `gen --db` compiles, marked "(tuned)". */
LJ_TEST(gen_db_winner_is_used)
{
    static const char *assign[] = {"dtype=f32", "D=64", "E=64"};
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DEVICE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lj_env *env = lajit__ctx_env(ctx);
    lj_family *f;
    ASSERT_OK(lajit__ctx_family(ctx, "la_recurrent", &f));
    lj_device_info dev;
    ASSERT_TRUE(lj_device_info_for_arch("sm_80", &dev));
    lj_problem *problems;
    int n_problems;
    ASSERT_OK(lj_family_problems(f, &problems, &n_problems));
    lj_problem p = problems[0];
    lj_free(env, problems);
    lj_config dflt;
    ASSERT_OK(lj_assign_all(env, f, assign, 3, &dev, &p, &dflt));
    /* A valid configuration other than the default. */
    lj_config *configs;
    int n_configs, pick = -1;
    ASSERT_OK(lj_family_all_configs(f, &configs, &n_configs));
    for (int i = 0; i < n_configs && pick < 0; i++) {
        int ok;
        char reason[256];
        ASSERT_OK(lj_family_valid(f, &configs[i], &p, &dev, &ok, reason, sizeof reason));
        if (ok && memcmp(configs[i].values, dflt.values, sizeof dflt.values) != 0)
            pick = i;
    }
    ASSERT_TRUE(pick >= 0);
    lj_tune_id id;
    memset(&id, 0, sizeof id);
    snprintf(id.fp.name, sizeof id.fp.name, "NVIDIA A100");
    id.fp.cc = 80;
    snprintf(id.family, sizeof id.family, "la_recurrent");
    ASSERT_OK(lj_tune_template_hash(env, f, id.template_hash));
    ASSERT_OK(lj_family_key(f, &p, id.bucket, sizeof id.bucket));
    lj_tune_result r;
    memset(&r, 0, sizeof r);
    lj_config_format(&configs[pick], r.config, sizeof r.config);
    r.ms = 0.5;
    char dbdir[1024], dtext[256];
    snprintf(dbdir, sizeof dbdir, "%s/db", lj_test_tmpdir());
    lj_config_format(&dflt, dtext, sizeof dtext);
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(env, dbdir, &db));
    ASSERT_OK(lj_tunedb_record(db, &id, &r, 1, dtext, 1.0));
    lj_tunedb_close(db);
    lj_free(env, configs);
    lajit_ctx_destroy(ctx);

    char args[4096], out[8192];
    snprintf(args, sizeof args,
             "gen --family la_recurrent --arch sm_80 -p dtype=f32 -p D=64 "
             "-p E=64 --db '%s/tune.db' -o '%s/tuned.bundle'",
             dbdir, lj_test_tmpdir());
    int rc = run_cli(args, out, sizeof out);
    if (rc != 0 && strstr(out, "NVRTC"))
        lj_test_skip("NVRTC not available to write the bundle");
    ASSERT_EQ(rc, 0);
    /* The winner was compiled, marked tuned; the default was not. */
    ASSERT_CONTAINS(out, r.config);
    ASSERT_CONTAINS(out, "(tuned)");
    ASSERT_TRUE(strstr(out, dtext) == NULL);
    ASSERT_CONTAINS(out, "1 cubins (1 from the tuning database), 1 PTX");
}

/* ---- Parameter discovery ---------------------------------------------------------------- */

/* import() for a plain interpreter: what the library's sandbox provides to specs (a file of the
 * templates tree, run once, its value returned). */
static int plain_import(lua_State *L)
{
    const char *rel = luaL_checkstring(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, "imports");
    if (lua_getfield(L, -1, rel) != LUA_TNIL)
        return 1;
    lua_pop(L, 1);
    char path[2048];
    snprintf(path, sizeof path, "%s/templates/%s", lj_test_source_dir(), rel);
    if (luaL_dofile(L, path) != LUA_OK)
        return lua_error(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, rel);
    return 1;
}

/* The family's spec table, read by a plain Lua interpreter from the source tree. */
static lua_State *read_spec(const char *family)
{
    lua_State *L = luaL_newstate();
    ASSERT_TRUE(L != NULL);
    luaL_openlibs(L);
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, "imports");
    lua_pushcfunction(L, plain_import);
    lua_setglobal(L, "import");
    char rel[256];
    snprintf(rel, sizeof rel, "%s/family.lua", family);
    lua_pushcfunction(L, plain_import);
    lua_pushstring(L, rel);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", rel, lua_tostring(L, -1));
    ASSERT_TRUE(lua_istable(L, -1));
    return L;
}

LJ_TEST(discovery_matches_family_lua)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DEVICE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    int families = 0;
    for (const char *const *name = lajit_family_names(); *name; name++, families++) {
        lajit_family_info fam = {.struct_size = sizeof fam};
        ASSERT_OK(lajit_family_describe(ctx, *name, &fam));
        ASSERT_STREQ(fam.name, *name);
        lua_State *L = read_spec(*name);
        lua_getfield(L, -1, "op");
        ASSERT_STREQ(fam.op, lua_tostring(L, -1));
        lua_pop(L, 1);
        lua_getfield(L, -1, "params");
        ASSERT_TRUE(lua_istable(L, -1));
        int n_lua = 0;
        for (lua_pushnil(L); lua_next(L, -2); lua_pop(L, 1))
            n_lua++;
        ASSERT_EQ(fam.n_params, n_lua);
        ASSERT_TRUE(fam.n_params > 0);
        const char *prev = "";
        for (int i = 0; i < fam.n_params; i++) {
            lajit_param_info p = {.struct_size = sizeof p};
            ASSERT_OK(lajit_family_param(ctx, *name, i, &p));
            ASSERT_TRUE(strcmp(prev, p.name) < 0); /* name order, each once */
            prev = p.name;
            lua_getfield(L, -1, p.name);
            ASSERT_TRUE(lua_istable(L, -1));
            ASSERT_EQ(p.n_values, (long long)lua_rawlen(L, -1));
            long long lo = 0, hi = 0;
            for (int j = 0; j < p.n_values; j++) {
                lua_rawgeti(L, -1, j + 1);
                long long v = (long long)lua_tointeger(L, -1);
                lua_pop(L, 1);
                ASSERT_EQ(p.values[j], v);
                lo = j == 0 || v < lo ? v : lo;
                hi = j == 0 || v > hi ? v : hi;
            }
            ASSERT_EQ(p.min, lo);
            ASSERT_EQ(p.max, hi);
            lua_pop(L, 1);
        }
        lua_close(L);
    }
    ASSERT_TRUE(families >= 6);
    lajit_ctx_destroy(ctx);
}

/* la_fwd_sm90's bounds, spelled out, so a change of the spec is a deliberate one here too. */
LJ_TEST(discovery_known_bounds)
{
    lajit_ctx *ctx;
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DEVICE;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lajit_family_info fam = {.struct_size = sizeof fam};
    ASSERT_OK(lajit_family_describe(ctx, "la_fwd_sm90", &fam));
    ASSERT_STREQ(fam.op, "fwd");
    int seen = 0;
    for (int i = 0; i < fam.n_params; i++) {
        lajit_param_info p = {.struct_size = sizeof p};
        ASSERT_OK(lajit_family_param(ctx, "la_fwd_sm90", i, &p));
        if (strcmp(p.name, "TILE_V") == 0) {
            ASSERT_EQ(p.min, 16);
            ASSERT_EQ(p.max, 128);
            ASSERT_EQ(p.n_values, 4);
            seen++;
        }
    }
    ASSERT_EQ(seen, 1);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(discovery_misuse)
{
    lajit_ctx *ctx;
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DEVICE;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lajit_family_info fam = {.struct_size = sizeof fam};
    lajit_param_info p = {.struct_size = sizeof p};
    ASSERT_STATUS(lajit_family_describe(NULL, "la_fwd", &fam), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(lajit_family_describe(ctx, NULL, &fam), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(lajit_family_describe(ctx, "la_fwd", NULL), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(lajit_family_param(NULL, "la_fwd", 0, &p), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(lajit_family_param(ctx, NULL, 0, &p), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(lajit_family_param(ctx, "la_fwd", 0, NULL), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(lajit_family_describe(ctx, "no_such_family", &fam), LAJIT_ERR_NOT_FOUND);
    ASSERT_STATUS(lajit_family_param(ctx, "no_such_family", 0, &p), LAJIT_ERR_NOT_FOUND);
    /* Outputs are written only on success. */
    ASSERT_TRUE(fam.name == NULL && p.name == NULL);
    ASSERT_OK(lajit_family_describe(ctx, "la_fwd", &fam));
    ASSERT_STATUS(lajit_family_param(ctx, "la_fwd", -1, &p), LAJIT_ERR_NOT_FOUND);
    ASSERT_STATUS(lajit_family_param(ctx, "la_fwd", fam.n_params, &p), LAJIT_ERR_NOT_FOUND);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "out of range");
    ASSERT_TRUE(p.name == NULL);
    /* A struct from an older, smaller header is refused; a larger one is accepted. */
    lajit_param_info small = {.struct_size = sizeof small - 1};
    ASSERT_STATUS(lajit_family_param(ctx, "la_fwd", 0, &small), LAJIT_ERR_STRUCT_SIZE);
    lajit_family_info fsmall = {.struct_size = sizeof(size_t)};
    ASSERT_STATUS(lajit_family_describe(ctx, "la_fwd", &fsmall), LAJIT_ERR_STRUCT_SIZE);
    struct {
        lajit_param_info info;
        long long later_field;
    } big = {{.struct_size = sizeof big}, 42};
    ASSERT_OK(lajit_family_param(ctx, "la_fwd", 0, &big.info));
    ASSERT_EQ(big.later_field, 42);
    ASSERT_TRUE(big.info.name != NULL && big.info.n_values >= 1);
    lajit_ctx_destroy(ctx);
}

/* `lajit families` prints what the API returns (it uses the API, not a private hook). */
LJ_TEST(families_command_uses_the_api)
{
    static char out[1 << 16];
    ASSERT_EQ(run_cli("families", out, sizeof out), 0);
    ASSERT_CONTAINS(out, "la_fwd_sm90 (fwd)\n");
    ASSERT_CONTAINS(out, "  TILE_V     16 32 64 128\n");
}

/* The commands that take no argument but --help (version, info, families) share one option
 * parser: --help and -h print "usage: lajit <cmd>" and exit 0; an argument, an unknown option or
 * an unknown letter is a usage error (2) naming it. */
LJ_TEST(no_argument_commands)
{
    static char out[1 << 16];
    static const char *const cmds[] = {"version", "info", "families"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char args[64], want[64];
        snprintf(want, sizeof want, "usage: lajit %s\n\n", cmds[i]);
        snprintf(args, sizeof args, "%s --help", cmds[i]);
        ASSERT_EQ(run_cli(args, out, sizeof out), 0);
        ASSERT_TRUE(strncmp(out, want, strlen(want)) == 0);
        ASSERT_TRUE(out[strlen(out) - 1] == '\n' && out[strlen(want)] != '\n');
        snprintf(args, sizeof args, "%s -h", cmds[i]);
        ASSERT_EQ(run_cli(args, out, sizeof out), 0);
        ASSERT_TRUE(strncmp(out, want, strlen(want)) == 0);
        snprintf(args, sizeof args, "%s extra", cmds[i]);
        ASSERT_EQ(run_cli(args, out, sizeof out), 2);
        snprintf(want, sizeof want, "lajit: %s: unexpected argument extra (see lajit --help)\n",
                 cmds[i]);
        ASSERT_TRUE(strcmp(out, want) == 0);
        snprintf(args, sizeof args, "%s --bogus", cmds[i]);
        ASSERT_EQ(run_cli(args, out, sizeof out), 2);
        ASSERT_CONTAINS(out, "unexpected argument --bogus");
        snprintf(args, sizeof args, "%s -x", cmds[i]);
        ASSERT_EQ(run_cli(args, out, sizeof out), 2);
        ASSERT_CONTAINS(out, "unexpected argument -x");
    }
}
