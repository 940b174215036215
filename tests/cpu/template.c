/* template.c — the template engine and family specs on a test template tree
 * (tests/data/templates): golden expansion, #line placement, error positions, the spec
 * contract (params, configs, default, valid with a reason, key, launch parsing) and bad specs.
 * LAJIT_UPDATE_GOLDEN=1 rewrites tests/golden/toy_*.cu. */
#include "test.h"

#include <unistd.h>

#include <lua.h>

#include "family.h"
#include "template.h"

static lj_env env;

static lj_lua *open_tree(void)
{
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/data/templates", lj_test_source_dir());
    lj_lua *L;
    ASSERT_OK(lj_lua_open(&env, dir, &L));
    return L;
}

static char *expand_toy(lj_lua *L, int problem, const char *arch)
{
    lj_family *f;
    ASSERT_OK(lj_family_load(&env, L, "toy", &f));
    lj_problem *p;
    int n;
    ASSERT_OK(lj_family_problems(f, &p, &n));
    lj_device_info dev;
    ASSERT_TRUE(lj_device_info_for_arch(arch, &dev));
    lj_config cfg;
    ASSERT_OK(lj_family_default(f, &p[problem], &dev, &cfg));
    char *src;
    ASSERT_OK(lj_family_source(f, &cfg, &p[problem], &dev, &src));
    lj_free(&env, p);
    lj_family_free(f);
    return src;
}

static void golden(const char *name, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/golden/%s", lj_test_source_dir(), name);
    const char *up = getenv("LAJIT_UPDATE_GOLDEN");
    if (up && strcmp(up, "1") == 0) {
        FILE *f = fopen(path, "wb");
        ASSERT_TRUE(f != NULL);
        fputs(text, f);
        fclose(f);
        return;
    }
    FILE *f = fopen(path, "rb");
    if (!f)
        lj_test_fail(__FILE__, __LINE__, "no golden file %s", path);
    char want[8192];
    size_t n = fread(want, 1, sizeof want - 1, f);
    want[n] = 0;
    fclose(f);
    if (strcmp(want, text) != 0)
        lj_test_fail(__FILE__, __LINE__, "expansion differs from %s:\n%s", path, text);
}

LJ_TEST(toy_expansions_match_golden)
{
    lj_lua *L = open_tree();
    char *a = expand_toy(L, 0, "sm_90a"), *b = expand_toy(L, 1, "sm_80");
    golden("toy_0_sm_90a.cu", a);
    golden("toy_1_sm_80.cu", b);
    /* Spot checks that do not depend on the golden files. */
    ASSERT_CONTAINS(a, "constexpr int D = 32;");
    ASSERT_CONTAINS(a, "constexpr float SCALE = 0.5;");
    ASSERT_CONTAINS(a, "x[3] = 3 * SCALE;   // unrolled 4 of 4");
    ASSERT_CONTAINS(a, "x[0] *= 2.0f; // decay");
    ASSERT_CONTAINS(a, "x[1] = 6; // literal ${ stays");
    ASSERT_CONTAINS(b, "x[0] *= 3.0f; // no decay");
    ASSERT_TRUE(strstr(b, "x[2]") == NULL); /* UNROLL = 2 for D = 16 */
    lj_free(&env, a);
    lj_free(&env, b);
    lj_lua_close(L);
}

LJ_TEST(line_directives_follow_the_template)
{
    lj_lua *L = open_tree();
    char *a = expand_toy(L, 0, "sm_90a");
    ASSERT_TRUE(strncmp(a, "#line 1 \"toy/toy.cu\"\n", 21) == 0);
    /* The loop body (template line 10) is preceded by its #line at every iteration. */
    int count = 0;
    for (const char *p = a; (p = strstr(p, "#line 10 \"toy/toy.cu\"\n")) != NULL; p++)
        count++;
    ASSERT_EQ(count, 4);
    ASSERT_CONTAINS(a, "#line 14 \"toy/toy.cu\"\n    x[0] *= 2.0f;");
    ASSERT_CONTAINS(a, "#line 18 \"toy/toy.cu\"\n    x[1] = 6;");
    lj_free(&env, a);
    lj_lua_close(L);
}

LJ_TEST(translation_keeps_one_lua_line_per_template_line)
{
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    const char text[] = "a ${x}\n//% if y then\nb \"q\\\\\" ${'z'}\n//% end\nc\n";
    char *code;
    ASSERT_OK(lj_template_translate(&env, "t.cu", text, sizeof text - 1, &code));
    int lines = 0;
    for (const char *p = code; *p; p++)
        lines += *p == '\n';
    /* 5 template lines + the closing return line and its blank line. */
    ASSERT_EQ(lines, 5 + 2);
    lj_free(&env, code);
}

LJ_TEST(nil_substitution_names_file_line_and_expression)
{
    lj_lua *L = open_tree();
    const char *text;
    size_t len;
    ASSERT_OK(lj_lua_read_template(L, "toy/bad.cu", &text, &len));
    lua_State *S = lj_lua_state(L);
    lua_newtable(S);
    char *out = NULL;
    ASSERT_STATUS(lj_template_expand(L, "toy/bad.cu", text, len, -1, &out), LAJIT_ERR_TEMPLATE);
    lua_pop(S, 1);
    ASSERT_CONTAINS(env.errmsg, "toy/bad.cu:3");
    ASSERT_CONTAINS(env.errmsg, "undefined_value");
    ASSERT_CONTAINS(env.errmsg, "nil");
    ASSERT_TRUE(out == NULL);
    lj_lua_close(L);
}

/* A template's Lua lines share the chunk with its output list: returning early with a huge count
 * made the reader loop 2^63 times, and a number appended as a piece was converted outside a
 * protected call. Both are errors now. */
LJ_TEST(a_template_cannot_forge_its_output)
{
    lj_lua *L = open_tree();
    lua_State *S = lj_lua_state(L);
    alarm(60); /* the old reader never ended: fail instead of hanging */
    static const char *const texts[] = {
        "a\n//% do return {}, math.maxinteger end\nb\n",
        "a\n//% do return 5, 1 end\n",
        "a\n//% __lajit_o(5)\nb\n",
        "a\n//% __lajit_o({})\n",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int top = lua_gettop(S);
        lua_newtable(S);
        char *out = NULL;
        lajit_status st = lj_template_expand(L, "forge.cu", texts[i], strlen(texts[i]), -1, &out);
        lua_pop(S, 1);
        if (st != LAJIT_ERR_TEMPLATE)
            lj_test_fail(__FILE__, __LINE__, "%s: got %s", texts[i], lajit_status_string(st));
        ASSERT_CONTAINS(env.errmsg, "forge.cu");
        ASSERT_TRUE(out == NULL);
        ASSERT_EQ(lua_gettop(S), top);
    }
    alarm(0);
    lj_lua_close(L);
}

LJ_TEST(unterminated_substitution_is_an_error)
{
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    const char text[] = "ok\nint x = ${1 + \n";
    char *code = NULL;
    ASSERT_STATUS(lj_template_translate(&env, "u.cu", text, sizeof text - 1, &code),
                  LAJIT_ERR_TEMPLATE);
    ASSERT_CONTAINS(env.errmsg, "u.cu:2");
}

LJ_TEST(family_contract)
{
    lj_lua *L = open_tree();
    lj_family *f;
    ASSERT_OK(lj_family_load(&env, L, "toy", &f));
    ASSERT_STREQ(lj_family_name(f), "toy");
    ASSERT_EQ(lj_family_op(f), LJ_OP_FWD);
    ASSERT_EQ(lj_family_param_count(f), 2);
    ASSERT_STREQ(lj_family_param_name(f, 0), "UNROLL"); /* sorted */
    ASSERT_STREQ(lj_family_param_name(f, 1), "WARPS");
    lj_config *all;
    int n;
    ASSERT_OK(lj_family_all_configs(f, &all, &n));
    ASSERT_EQ(n, 6);
    ASSERT_EQ(lj_config_get(&all[0], "UNROLL", -1), 1);
    ASSERT_EQ(lj_config_get(&all[5], "UNROLL", -1), 4);
    ASSERT_EQ(lj_config_get(&all[5], "WARPS", -1), 2);
    lj_problem *p;
    int np;
    ASSERT_OK(lj_family_problems(f, &p, &np));
    ASSERT_EQ(np, 2);
    ASSERT_EQ(p[0].dtype, LJ_BF16);
    ASSERT_EQ(p[0].decay, 1);
    ASSERT_EQ(p[1].E, 16); /* E defaults to D */
    lj_device_info dev;
    ASSERT_TRUE(lj_device_info_for_arch("sm_80", &dev));
    lj_config cfg;
    ASSERT_OK(lj_family_default(f, &p[1], &dev, &cfg));
    ASSERT_EQ(lj_config_get(&cfg, "UNROLL", -1), 2);
    ASSERT_EQ(lj_config_get(&cfg, "WARPS", -1), 1);
    int ok;
    char reason[128];
    ASSERT_OK(lj_family_valid(f, &all[5], &p[1], &dev, &ok, reason, sizeof reason));
    ASSERT_EQ(ok, 0);
    ASSERT_CONTAINS(reason, "UNROLL=4 exceeds D/8=2");
    char key[64];
    ASSERT_OK(lj_family_key(f, &p[0], key, sizeof key));
    ASSERT_STREQ(key, "bf16_D32");
    lj_launch l;
    ASSERT_OK(lj_family_launch(f, &all[5], &p[0], &dev, &l));
    ASSERT_EQ(l.grid[0].var, LJ_VAR_N);
    ASSERT_EQ(l.grid[0].div, 64);
    ASSERT_EQ(l.grid[1].var, LJ_VAR_H);
    ASSERT_EQ(l.grid[2].var, LJ_VAR_B);
    ASSERT_EQ(l.block[0], 64);
    ASSERT_EQ(l.smem, 4096);
    ASSERT_STREQ(l.entry, "toy_kernel");
    char text[128];
    lj_config_format(&cfg, text, sizeof text);
    ASSERT_STREQ(text, "UNROLL=2 WARPS=1");
    lj_free(&env, all);
    lj_free(&env, p);
    lj_family_free(f);
    lj_lua_close(L);
}

LJ_TEST(bad_specs_and_unknown_families)
{
    lj_lua *L = open_tree();
    lj_family *f;
    ASSERT_STATUS(lj_family_load(&env, L, "badspec", &f), LAJIT_ERR_TEMPLATE);
    ASSERT_CONTAINS(env.errmsg, "launch must be a function");
    ASSERT_STATUS(lj_family_load(&env, L, "badarchs", &f), LAJIT_ERR_TEMPLATE);
    ASSERT_CONTAINS(env.errmsg, "archs[2] is not a known arch");
    ASSERT_STATUS(lj_family_load(&env, L, "baduses", &f), LAJIT_ERR_TEMPLATE);
    ASSERT_CONTAINS(env.errmsg, "uses[2] must name another family's template folder");
    ASSERT_STATUS(lj_family_load(&env, L, "manyuses", &f), LAJIT_ERR_TEMPLATE);
    ASSERT_CONTAINS(env.errmsg, "uses names at most 6 folders");
    ASSERT_STATUS(lj_family_load(&env, L, "nosuch", &f), LAJIT_ERR_NOT_FOUND);
    ASSERT_STATUS(lj_family_load(&env, L, "../toy", &f), LAJIT_ERR_NOT_FOUND);
    lj_lua_close(L);
}

/* The template text a family is tuned under (its tuning hash) holds common/, its own folder and
 * the folders it names in `uses`, and no others. */
LJ_TEST(template_text_covers_uses)
{
    lj_lua *L = open_tree();
    lj_family *f;
    ASSERT_OK(lj_family_load(&env, L, "usestoy", &f));
    char *text;
    size_t len;
    ASSERT_OK(lj_family_template_text(f, &text, &len));
    ASSERT_CONTAINS(text, "== common/loop.lua ");
    ASSERT_CONTAINS(text, "== usestoy/family.lua ");
    ASSERT_CONTAINS(text, "== toy/toy.cu ");
    ASSERT_TRUE(strstr(text, "== badarchs/") == NULL);
    lj_free(&env, text);
    lj_family_free(f);
    ASSERT_OK(lj_family_load(&env, L, "toy", &f));
    ASSERT_OK(lj_family_template_text(f, &text, &len));
    ASSERT_TRUE(strstr(text, "== usestoy/") == NULL);
    lj_free(&env, text);
    lj_family_free(f);
    lj_lua_close(L);
}

LJ_TEST(names_and_arch_table)
{
    lj_dtype dt;
    ASSERT_TRUE(lj_dtype_parse("bfloat16", &dt) && dt == LJ_BF16);
    ASSERT_TRUE(lj_dtype_parse("fp16", &dt) && dt == LJ_F16);
    ASSERT_TRUE(!lj_dtype_parse("int8", &dt));
    char arch[16];
    lj_arch_for_cc(90, arch);
    ASSERT_STREQ(arch, "sm_90a");
    lj_arch_for_cc(86, arch);
    ASSERT_STREQ(arch, "sm_86");
    lj_arch_for_cc(120, arch);
    ASSERT_STREQ(arch, "sm_120");
    lj_device_info d;
    ASSERT_TRUE(lj_device_info_for_arch("sm_120", &d));
    ASSERT_EQ(d.smem_optin, 101376);
    ASSERT_TRUE(lj_device_info_for_arch("sm_90a", &d));
    ASSERT_EQ(d.smem_optin, 232448);
    ASSERT_TRUE(!lj_device_info_for_arch("sm_91", &d));
}
