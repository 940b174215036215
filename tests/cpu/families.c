/* families.c — the built-in families as data: every representative problem expands to its
 * golden text, every configuration is either valid or rejected with a reason on every arch,
 * defaults are valid, and kernel keys are stable and arch-specific. Compiling every valid
 * configuration is the CTest case families.compile_all_configs (the CLI), run outside the
 * sanitizer build. Set LAJIT_UPDATE_GOLDEN=1 to rewrite the golden files after an intended
 * template change (then read the diff). */
#include "test.h"

#include "context.h"
#include "kernel.h"

static const char *const archs[] = {"sm_80", "sm_90a", "sm_100a", "sm_120"};

static lajit_ctx *ctx_open(void)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DEVICE;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    return ctx;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n)
        n = 0;
    s[n] = 0;
    fclose(f);
    return s;
}

LJ_TEST(golden_expansions)
{
    lajit_ctx *ctx = ctx_open();
    lj_env *env = lajit__ctx_env(ctx);
    int update = getenv("LAJIT_UPDATE_GOLDEN") && strcmp(getenv("LAJIT_UPDATE_GOLDEN"), "1") == 0;
    int checked = 0;
    for (const char *const *name = lajit_family_names(); *name; name++) {
        lj_family *f;
        ASSERT_OK(lajit__ctx_family(ctx, *name, &f));
        lj_problem *problems;
        int n;
        ASSERT_OK(lj_family_problems(f, &problems, &n));
        ASSERT_TRUE(n > 0);
        lj_device_info dev;
        ASSERT_TRUE(lj_device_info_for_arch("sm_90a", &dev));
        for (int i = 0; i < n; i++) {
            lj_config cfg;
            ASSERT_OK(lj_family_default(f, &problems[i], &dev, &cfg));
            char *src;
            ASSERT_OK(lj_family_source(f, &cfg, &problems[i], &dev, &src));
            char path[1024];
            snprintf(path, sizeof path, "%s/tests/golden/%s_%d_sm_90a.cu", lj_test_source_dir(),
                     *name, i);
            if (update) {
                FILE *out = fopen(path, "wb");
                ASSERT_TRUE(out != NULL);
                fputs(src, out);
                fclose(out);
            } else {
                char *want = read_file(path);
                if (!want)
                    lj_test_fail(__FILE__, __LINE__,
                                 "no golden file %s (LAJIT_UPDATE_GOLDEN=1 "
                                 "writes it)",
                                 path);
                if (strcmp(want, src) != 0)
                    lj_test_fail(__FILE__, __LINE__,
                                 "%s differs from the expansion of %s "
                                 "problem %d: run with LAJIT_UPDATE_GOLDEN=1 and read the diff",
                                 path, *name, i);
                free(want);
            }
            lj_free(env, src);
            checked++;
        }
        lj_free(env, problems);
    }
    ASSERT_TRUE(checked > 0);
    lajit_ctx_destroy(ctx);
}

LJ_TEST(every_config_valid_or_rejected_with_reason)
{
    lajit_ctx *ctx = ctx_open();
    lj_env *env = lajit__ctx_env(ctx);
    for (const char *const *name = lajit_family_names(); *name; name++) {
        lj_family *f;
        ASSERT_OK(lajit__ctx_family(ctx, *name, &f));
        lj_problem *problems;
        lj_config *configs;
        int np, nc, valid = 0;
        ASSERT_OK(lj_family_problems(f, &problems, &np));
        ASSERT_OK(lj_family_all_configs(f, &configs, &nc));
        ASSERT_TRUE(nc > 0);
        for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
            lj_device_info dev;
            ASSERT_TRUE(lj_device_info_for_arch(archs[a], &dev));
            for (int p = 0; p < np; p++) {
                for (int c = 0; c < nc; c++) {
                    int ok = -1;
                    char reason[256] = "";
                    lajit_status vst = lj_family_valid(f, &configs[c], &problems[p], &dev, &ok,
                                                       reason, sizeof reason);
                    if (vst != LAJIT_OK)
                        lj_test_fail(__FILE__, __LINE__, "%s.valid failed: %s", *name,
                                     lajit_errmsg(ctx));
                    ASSERT_TRUE(ok == 0 || ok == 1);
                    if (ok) {
                        valid++;
                        lj_launch l;
                        ASSERT_OK(lj_family_launch(f, &configs[c], &problems[p], &dev, &l));
                        ASSERT_TRUE(l.smem <= (unsigned)dev.smem_optin);
                        ASSERT_TRUE(l.block[0] * l.block[1] * l.block[2] <= 1024);
                    } else if (reason[0] == 0) {
                        char text[256];
                        lj_config_format(&configs[c], text, sizeof text);
                        lj_test_fail(__FILE__, __LINE__, "%s [%s] rejected without a reason", *name,
                                     text);
                    }
                }
            }
        }
        ASSERT_TRUE(valid > 0);
        lj_free(env, problems);
        lj_free(env, configs);
    }
    lajit_ctx_destroy(ctx);
}

LJ_TEST(defaults_are_valid_on_every_arch)
{
    lajit_ctx *ctx = ctx_open();
    lj_env *env = lajit__ctx_env(ctx);
    for (const char *const *name = lajit_family_names(); *name; name++) {
        lj_family *f;
        ASSERT_OK(lajit__ctx_family(ctx, *name, &f));
        lj_problem *problems;
        int np;
        ASSERT_OK(lj_family_problems(f, &problems, &np));
        for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
            lj_device_info dev;
            ASSERT_TRUE(lj_device_info_for_arch(archs[a], &dev));
            if (!lj_family_serves(f, archs[a]))
                continue; /* an arch-specific family: its valid() says why it refuses (sweep) */
            for (int p = 0; p < np; p++) {
                lj_config cfg;
                int ok = 0;
                char reason[256] = "";
                ASSERT_OK(lj_family_default(f, &problems[p], &dev, &cfg));
                ASSERT_OK(lj_family_valid(f, &cfg, &problems[p], &dev, &ok, reason, sizeof reason));
                if (!ok)
                    lj_test_fail(__FILE__, __LINE__,
                                 "%s default for problem %d on %s is invalid: %s", *name, p,
                                 archs[a], reason);
            }
        }
        lj_free(env, problems);
    }
    lajit_ctx_destroy(ctx);
}

/* An arch-specific family names its archs; the others serve every arch. */
LJ_TEST(arch_specific_families)
{
    lajit_ctx *ctx = ctx_open();
    lj_family *sm90, *fwd;
    ASSERT_OK(lajit__ctx_family(ctx, "la_fwd_sm90", &sm90));
    ASSERT_OK(lajit__ctx_family(ctx, "la_fwd", &fwd));
    ASSERT_TRUE(lj_family_serves(sm90, "sm_90a"));
    ASSERT_TRUE(!lj_family_serves(sm90, "sm_90"));
    ASSERT_TRUE(!lj_family_serves(sm90, "sm_100a"));
    ASSERT_TRUE(!lj_family_serves(sm90, "sm_80"));
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++)
        ASSERT_TRUE(lj_family_serves(fwd, archs[a]));
    lj_family *bwd90;
    ASSERT_OK(lajit__ctx_family(ctx, "la_bwd_sm90", &bwd90));
    ASSERT_TRUE(lj_family_serves(bwd90, "sm_90a"));
    ASSERT_TRUE(!lj_family_serves(bwd90, "sm_80"));
    lajit_ctx_destroy(ctx);
}

/* The backward families expand the forwards' templates: those files are part of the text they
 * are tuned under, so a change to the forward's kernel retires their tuned winners too. */
LJ_TEST(backward_template_text_covers_the_forward)
{
    lajit_ctx *ctx = ctx_open();
    lj_env *env = lajit__ctx_env(ctx);
    static const char *const pairs[][2] = {{"la_bwd", "== la_fwd/fwd.cu "},
                                           {"la_bwd_sm90", "== la_fwd_sm90/fwd.cu "}};
    for (size_t i = 0; i < 2; i++) {
        lj_family *f;
        ASSERT_OK(lajit__ctx_family(ctx, pairs[i][0], &f));
        char *text;
        size_t len;
        ASSERT_OK(lj_family_template_text(f, &text, &len));
        ASSERT_CONTAINS(text, pairs[i][1]);
        lj_free(env, text);
    }
    lajit_ctx_destroy(ctx);
}

LJ_TEST(keys_stable_and_arch_specific)
{
    lajit_ctx *ctx = ctx_open();
    lj_lua *L;
    ASSERT_OK(lajit__ctx_lua(ctx, &L));
    lj_env *env = lajit__ctx_env(ctx);
    int major, minor;
    if (lj_nvrtc_version(env, &major, &minor) != LAJIT_OK)
        lj_test_skip("NVRTC not available");
    for (const char *const *name = lajit_family_names(); *name; name++) {
        lj_family *f;
        ASSERT_OK(lajit__ctx_family(ctx, *name, &f));
        lj_problem *problems;
        int np;
        ASSERT_OK(lj_family_problems(f, &problems, &np));
        lj_key prev = {0, 0};
        for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
            lj_device_info dev;
            ASSERT_TRUE(lj_device_info_for_arch(archs[a], &dev));
            lj_config cfg;
            ASSERT_OK(lj_family_default(f, &problems[0], &dev, &cfg));
            lj_key k1, k2;
            ASSERT_OK(lj_kernel_key(L, f, &cfg, &problems[0], &dev, 0, &k1));
            ASSERT_OK(lj_kernel_key(L, f, &cfg, &problems[0], &dev, 0, &k2));
            ASSERT_TRUE(lj_key_equal(k1, k2));
            ASSERT_TRUE(a == 0 || !lj_key_equal(k1, prev));
            prev = k1;
        }
        lj_free(env, problems);
    }
    lajit_ctx_destroy(ctx);
}

/* ---- Allocation failures: every allocation on the way from opening the sandbox to the
 * expansion of one representative problem fails in turn, for each built-in family. Each
 * failure must be a clear status with a message (never a panic), and nothing may leak (ASan's
 * leak check runs at exit). */

/* An allocator whose allocations fail from the n-th on (0: never): Lua's emergency collection
 * cannot absorb those, so every error path is taken at every point. */
typedef struct failing_alloc {
    uint64_t count, fail_from;
} failing_alloc;

static void *fail_from_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    failing_alloc *a = user;
    (void)old_size;
    if (new_size == 0) {
        free(ptr);
        return NULL;
    }
    if (a->fail_from && ++a->count >= a->fail_from)
        return NULL;
    return realloc(ptr, new_size);
}

/* fail_at: the one allocation that fails, or with persistent every one from it on. */
static lajit_status load_and_expand(lj_env *e, const char *name, uint64_t fail_at, int persistent,
                                    int *reached, char **expansion)
{
    static failing_alloc fa;
    fa.count = 0;
    fa.fail_from = persistent ? fail_at : 0;
    lj_env_init(e, fail_from_alloc, &fa, NULL, NULL, LAJIT_LOG_ERROR);
    e->fault_at[LJ_FAULT_ALLOC] = persistent ? 0 : fail_at;
    lj_lua *L = NULL;
    lj_family *f = NULL;
    lj_problem *problems = NULL;
    char *src = NULL;
    int np = 0, ok = 0;
    lj_device_info dev;
    lj_device_info_for_arch("sm_90a", &dev);
    lj_config cfg;
    lj_launch launch;
    char key[256], reason[256];
    lajit_status st = lj_lua_open(e, NULL, &L);
    if (st == LAJIT_OK)
        st = lj_family_load(e, L, name, &f);
    if (st == LAJIT_OK)
        st = lj_family_problems(f, &problems, &np);
    if (st == LAJIT_OK)
        st = lj_family_default(f, &problems[0], &dev, &cfg);
    if (st == LAJIT_OK)
        st = lj_family_valid(f, &cfg, &problems[0], &dev, &ok, reason, sizeof reason);
    if (st == LAJIT_OK)
        st = lj_family_key(f, &problems[0], key, sizeof key);
    if (st == LAJIT_OK)
        st = lj_family_launch(f, &cfg, &problems[0], &dev, &launch);
    if (st == LAJIT_OK)
        st = lj_family_source(f, &cfg, &problems[0], &dev, &src);
    *reached = persistent ? fa.count >= fail_at : e->fault_count[LJ_FAULT_ALLOC] >= fail_at;
    e->fault_at[LJ_FAULT_ALLOC] = 0;
    fa.fail_from = 0; /* the cleanup below allocates nothing, but must never fail */
    *expansion = src ? strdup(src) : NULL;
    lj_free(e, src);
    lj_free(e, problems);
    lj_family_free(f);
    lj_lua_close(L);
    return st;
}

static void sweep_allocations_mode(const char *name, int persistent);

static void sweep_allocations(const char *name)
{
    for (int persistent = 0; persistent <= 1; persistent++)
        sweep_allocations_mode(name, persistent);
}

static void sweep_allocations_mode(const char *name, int persistent)
{
    lj_env e;
    int reached = 0, failures = 0, absorbed = 0;
    char *want = NULL, *got = NULL;
    if (load_and_expand(&e, name, 0, 0, &reached, &want) != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s", e.errmsg);
    uint64_t n;
    for (n = 1; n < 1000000; n++) {
        lajit_status st = load_and_expand(&e, name, n, persistent, &reached, &got);
        if (!reached) {
            if (st != LAJIT_OK)
                lj_test_fail(__FILE__, __LINE__, "%s without a fault: %s", name, e.errmsg);
            free(got);
            break;
        }
        if (st == LAJIT_OK) {
            /* Lua absorbs most of its own failures (an emergency collection, then a retry): the
             * expansion must then be the same text. */
            absorbed++;
            if (!got || strcmp(got, want) != 0)
                lj_test_fail(__FILE__, __LINE__,
                             "%s, allocation %llu failing: a different expansion", name,
                             (unsigned long long)n);
            free(got);
            continue;
        }
        free(got);
        failures++;
        if (st != LAJIT_ERR_OUT_OF_MEMORY || e.errmsg[0] == 0)
            lj_test_fail(__FILE__, __LINE__, "%s, allocation %llu failing: %s: %s", name,
                         (unsigned long long)n, lajit_status_string(st), e.errmsg);
    }
    printf("%s: %llu allocations from open to expansion, %s: %d reported as out of memory, %d "
           "absorbed by Lua's retry with the same expansion\n",
           name, (unsigned long long)n - 1,
           persistent ? "failing every one from the n-th on" : "each failed once", failures,
           absorbed);
    free(want);
    ASSERT_TRUE(failures > 0);
}

LJ_TEST(fault_every_allocation_la_fwd)
{
    sweep_allocations("la_fwd");
}
LJ_TEST(fault_every_allocation_la_fwd_sm90)
{
    sweep_allocations("la_fwd_sm90");
}
LJ_TEST(fault_every_allocation_la_bwd)
{
    sweep_allocations("la_bwd");
}
LJ_TEST(fault_every_allocation_la_bwd_sm90)
{
    sweep_allocations("la_bwd_sm90");
}
LJ_TEST(fault_every_allocation_la_decode)
{
    sweep_allocations("la_decode");
}
LJ_TEST(fault_every_allocation_la_recurrent)
{
    sweep_allocations("la_recurrent");
}
LJ_TEST(fault_every_allocation_la_state_scan)
{
    sweep_allocations("la_state_scan");
}
LJ_TEST(fault_every_allocation_la_state_pool)
{
    sweep_allocations("la_state_pool");
}

/* Every built-in family must stay well within its limits. */
LJ_TEST(built_in_families_fit_their_limits)
{
    lajit_ctx *ctx = ctx_open();
    int n_families = 0;
    for (const char *const *name = lajit_family_names(); *name; name++, n_families++) {
        lj_family *f;
        ASSERT_OK(lajit__ctx_family(ctx, *name, &f));
        long long space = 1;
        for (int i = 0; i < lj_family_param_count(f); i++) {
            const long long *v;
            space *= lj_family_param_values(f, i, &v);
        }
        ASSERT_TRUE(space * 8 <= LJ_MAX_CONFIGS);
    }
    ASSERT_EQ(n_families, 8); /* the sweeps above name each one */
    lajit_ctx_destroy(ctx);
}
