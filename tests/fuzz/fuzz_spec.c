/* fuzz_spec.c — a family spec from outside the library (family.lua of a folder added with
 * lajit_ctx_add_families, op "custom" or not) on hostile text: the input is written as
 * fz/family.lua in the harness's private directory, that folder is made the family root of a
 * fresh sandbox, and the spec is loaded (family.c, family_args.c: name, op, args, dtypes,
 * dynamic, archs, uses, problems, params); when it loads, each of its representative problems
 * (with its symbols, for a custom family) goes through default, valid (the first 8
 * configurations), key, launch, resources and source, and is formatted as the CLI prints it. Any
 * status is fine; a crash, an abort from a Lua panic, a failure with no message, a leak or a Lua
 * stack left unbalanced is not. A spec runs under the family's time budget: a hostile one costs
 * seconds, not hangs. Seeds: corpus/spec. LAJIT_FUZZ_VERBOSE=1 prints each load's status. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <lua.h>

#include "family.h"
#include "fuzz.h"
#include "problem.h"

#define MAX_SPEC    (64u << 10)
#define MAX_CONFIGS 8

static void expect_message(lajit_status st, const lj_env *env, const char *what)
{
    if (st != LAJIT_OK && !env->errmsg[0])
        lj_fuzz_fail("%s: status %d with no message", what, st);
}

static void exercise(lj_env *env, lj_family *f, lua_State *S)
{
    lj_device_info dev;
    if (!lj_device_info_for_arch("sm_90a", &dev))
        lj_fuzz_fail("no sm_90a in the arch table");
    lj_problem *problems = NULL;
    lj_config *configs = NULL;
    int np = 0, nc = 0;
    lajit_status st = lj_family_problems(f, &problems, &np);
    expect_message(st, env, "problems");
    if (st != LAJIT_OK)
        return;
    st = lj_family_all_configs(f, &configs, &nc);
    expect_message(st, env, "all_configs");
    for (int i = 0; i < np && st == LAJIT_OK; i++) {
        const lj_problem *p = &problems[i];
        int top = lua_gettop(S);
        char text[512], reason[256], key[256];
        lj_problem_format(p, text, sizeof text);
        if (!memchr(text, 0, sizeof text))
            lj_fuzz_fail("problem text unterminated");
        lj_config dflt;
        lajit_status s = lj_family_default(f, p, &dev, &dflt);
        expect_message(s, env, "default");
        s = lj_family_key(f, p, key, sizeof key);
        expect_message(s, env, "key");
        for (int c = 0; c < nc && c < MAX_CONFIGS; c++) {
            int ok = 0;
            s = lj_family_valid(f, &configs[c], p, &dev, &ok, reason, sizeof reason);
            expect_message(s, env, "valid");
            if (s != LAJIT_OK || !ok)
                continue;
            lj_launch l;
            expect_message(lj_family_launch(f, &configs[c], p, &dev, &l), env, "launch");
            lj_resources r;
            expect_message(lj_family_resources(f, &configs[c], p, &dev, &r), env, "resources");
            char *src = NULL;
            s = lj_family_source(f, &configs[c], p, &dev, &src);
            expect_message(s, env, "source");
            if (s == LAJIT_OK && (!src || !memchr(src, 0, strlen(src) + 1)))
                lj_fuzz_fail("source succeeded with no text");
            lj_free(env, src);
        }
        if (lua_gettop(S) != top)
            lj_fuzz_fail("the spec's calls left the Lua stack at %d, not %d", lua_gettop(S), top);
        lj_clear_error(env);
    }
    lj_free(env, configs);
    lj_free(env, problems);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > MAX_SPEC)
        return 0;
    char folder[1024], path[1100];
    snprintf(folder, sizeof folder, "%s/fz", lj_fuzz_dir());
    mkdir(folder, 0700);
    lj_fuzz_write("fz/family.lua", data, size, path, sizeof path);
    lj_env env;
    lj_fuzz_heap heap;
    lj_fuzz_env(&env, &heap, 64u << 20);
    lj_lua *L;
    if (lj_lua_open(&env, NULL, &L) != LAJIT_OK)
        lj_fuzz_fail("cannot open a sandbox: %s", env.errmsg);
    if (lj_lua_add_family_root(L, "fz", lj_fuzz_dir()) != LAJIT_OK)
        lj_fuzz_fail("cannot add the family root: %s", env.errmsg);
    lua_State *S = lj_lua_state(L);
    int top = lua_gettop(S);
    lj_family *f = NULL;
    lajit_status st = lj_family_load(&env, L, "fz", &f);
    expect_message(st, &env, "load");
    if (getenv("LAJIT_FUZZ_VERBOSE"))
        fprintf(stderr, "load: %d %s\n", st, env.errmsg);
    if (lua_gettop(S) != top)
        lj_fuzz_fail("loading left the Lua stack at %d, not %d", lua_gettop(S), top);
    if (st == LAJIT_OK) {
        exercise(&env, f, S);
        lj_family_free(f);
    }
    lj_lua_close(L);
    if (heap.held)
        lj_fuzz_fail("%zu bytes still held after the sandbox was closed", heap.held);
    return 0;
}
