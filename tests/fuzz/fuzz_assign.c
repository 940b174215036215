/* fuzz_assign.c — the `-p KEY=VALUE` parser (lj_assign, lj_assign_all in generator/problem.h)
 * on hostile text: each line of the input is one assignment, applied alone to a fresh problem
 * and configuration of two built-in families (loaded once per process), then all lines through
 * lj_assign_all for an sm_90a target, and the result formatted as the CLI prints it. Any status
 * is fine; a crash, a message-less failure or an unterminated string is not. Seeds:
 * corpus/assign. */
#include <stdlib.h>
#include <string.h>

#include "family.h"
#include "fuzz.h"
#include "problem.h"

#define MAX_LINES 64
#define MAX_LINE  512

static const char *const family_names[] = {"la_fwd", "la_decode"};
#define N_FAMILIES (sizeof family_names / sizeof family_names[0])

/* The families outlive the inputs (loading a spec is the slow part); their env's allocations
 * are not counted per input. */
static lj_env fam_env;
static lj_lua *fam_lua;
static lj_family *families[N_FAMILIES];
static lj_problem base_problem[N_FAMILIES];
static lj_config base_config[N_FAMILIES];
static lj_device_info dev;

/* A problem of the family's own list and its default configuration: what assignments start
 * from in the CLI. */
static void base(lj_family *f, lj_problem *p, lj_config *cfg)
{
    lj_problem *list;
    int n;
    if (lj_family_problems(f, &list, &n) != LAJIT_OK || n < 1)
        lj_fuzz_fail("%s has no problems: %s", lj_family_name(f), fam_env.errmsg);
    *p = list[0];
    lj_free(&fam_env, list);
    if (lj_family_default(f, p, &dev, cfg) != LAJIT_OK)
        lj_fuzz_fail("%s has no default: %s", lj_family_name(f), fam_env.errmsg);
}

static void load_families(void)
{
    if (fam_lua)
        return;
    lj_env_init(&fam_env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    if (lj_lua_open(&fam_env, NULL, &fam_lua) != LAJIT_OK)
        lj_fuzz_fail("cannot open a sandbox: %s", fam_env.errmsg);
    if (!lj_device_info_for_arch("sm_90a", &dev))
        lj_fuzz_fail("no sm_90a in the arch table");
    for (size_t i = 0; i < N_FAMILIES; i++) {
        if (lj_family_load(&fam_env, fam_lua, family_names[i], &families[i]) != LAJIT_OK)
            lj_fuzz_fail("cannot load %s: %s", family_names[i], fam_env.errmsg);
        base(families[i], &base_problem[i], &base_config[i]);
    }
}

static void check(lajit_status st, const lj_problem *p, const lj_config *cfg)
{
    if (st != LAJIT_OK && !fam_env.errmsg[0])
        lj_fuzz_fail("status %d with no message", st);
    char text[512], config[512];
    lj_problem_format(p, text, sizeof text);
    lj_config_format(cfg, config, sizeof config);
    if (!memchr(text, 0, sizeof text) || !memchr(config, 0, sizeof config))
        lj_fuzz_fail("formatted problem or config not terminated");
    if (cfg->n < 0 || cfg->n > LJ_MAX_PARAMS)
        lj_fuzz_fail("config holds %d parameters", cfg->n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    load_families();
    /* Lines as separately allocated strings (exact size), so ASan sees a read past one. */
    char *lines[MAX_LINES];
    size_t n = 0, start = 0;
    for (size_t i = 0; i <= size && n < MAX_LINES; i++) {
        if (i < size && data[i] != '\n')
            continue;
        size_t len = i - start < MAX_LINE ? i - start : MAX_LINE;
        lines[n] = malloc(len + 1);
        if (!lines[n])
            lj_fuzz_fail("out of memory");
        memcpy(lines[n], data + start, len);
        lines[n][len] = 0;
        n++;
        start = i + 1;
    }
    for (size_t k = 0; k < N_FAMILIES; k++) {
        lj_problem p;
        lj_config cfg;
        for (size_t i = 0; i < n; i++) {
            p = base_problem[k];
            cfg = base_config[k];
            lj_clear_error(&fam_env);
            check(lj_assign(&fam_env, families[k], lines[i], &p, &cfg), &p, &cfg);
        }
        p = base_problem[k];
        cfg = base_config[k];
        lj_clear_error(&fam_env);
        check(lj_assign_all(&fam_env, families[k], (const char *const *)lines, n, &dev, &p, &cfg),
              &p, &cfg);
    }
    for (size_t i = 0; i < n; i++)
        free(lines[i]);
    return 0;
}
