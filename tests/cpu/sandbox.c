/* sandbox.c — the Lua sandbox: every escape a template might try ends in an error status (never
 * a crash or a hang), the limits hold, the state stays usable after an error, and a failing
 * allocation anywhere on the open/load/expand path is reported and leaks nothing (ASan). */
#include "test.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <lua.h>

#include "family.h"
#include "sandbox.h"

static lj_env env;

static lj_lua *open_lua(void)
{
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    lj_lua *L;
    ASSERT_OK(lj_lua_open(&env, NULL, &L));
    return L;
}

static lajit_status run(lj_lua *L, const char *code)
{
    lajit_status st = lj_lua_load(L, code, strlen(code), "=test");
    if (st != LAJIT_OK)
        return st;
    st = lj_lua_pcall(L, 0, 0);
    return st;
}

LJ_TEST(io_os_require_load_are_absent)
{
    lj_lua *L = open_lua();
    const char *escapes[] = {
        "io.open('/etc/passwd')",   "os.execute('true')",      "require('os')",
        "load('return 1')()",       "dofile('/etc/passwd')",   "loadfile('/etc/passwd')",
        "package.loadlib('x','y')", "debug.getinfo(1)",        "coroutine.create(print)",
        "string.dump(print)",       "string.find('a', 'a')",   "string.gsub('a', 'a', 'b')",
        "string.match('a', '.')",   "string.gmatch('a', '.')", "collectgarbage('count')",
        "xpcall(print, print)",     "table.move({}, 1, 1, 1)",
    };
    for (size_t i = 0; i < sizeof escapes / sizeof escapes[0]; i++) {
        lajit_status st = run(L, escapes[i]);
        if (st != LAJIT_ERR_TEMPLATE)
            lj_test_fail(__FILE__, __LINE__, "%s: got %s", escapes[i], lajit_status_string(st));
    }
    /* The state is still good. */
    ASSERT_OK(run(L, "local t = {} for i = 1, 10 do t[i] = i * i end assert(t[10] == 100)"));
    lj_lua_close(L);
}

LJ_TEST(string_metatable_is_hidden)
{
    lj_lua *L = open_lua();
    ASSERT_OK(run(L, "assert(getmetatable('') == false)"));
    ASSERT_STATUS(run(L, "getmetatable('').__index = nil"), LAJIT_ERR_TEMPLATE);
    ASSERT_OK(run(L, "assert(('a'):upper() == 'A')"));
    lj_lua_close(L);
}

LJ_TEST(loops_that_hooks_cannot_see_are_closed)
{
    /* Each of these ran for ever in a plain Lua sandbox: a message handler or finalizer runs
     * with hooks off, and string.rep('', huge) or table.move loop in C without allocating. */
    lj_lua *L = open_lua();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ASSERT_STATUS(run(L, "xpcall(error, function() while true do end end)"), LAJIT_ERR_TEMPLATE);
    ASSERT_STATUS(run(L, "setmetatable({}, {__gc = function() while true do end end})"),
                  LAJIT_ERR_TEMPLATE);
    ASSERT_CONTAINS(env.errmsg, "__gc");
    ASSERT_STATUS(
        run(L, "local x <close> = setmetatable({}, {__close = function() while true do end end})"),
        LAJIT_ERR_TEMPLATE);
    ASSERT_OK(run(L, "assert(string.rep('', math.maxinteger) == '')"));
    ASSERT_STATUS(run(L, "local s = string.rep('x', math.maxinteger)"), LAJIT_ERR_LIMIT);
    ASSERT_STATUS(run(L, "table.move({1}, 1, math.maxinteger, 2)"), LAJIT_ERR_TEMPLATE);
    /* pcall cannot swallow the instruction limit. */
    ASSERT_STATUS(run(L, "while true do pcall(function() while true do end end) end"),
                  LAJIT_ERR_LIMIT);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    ASSERT_LE_F(secs, 120.0);
    /* Ordinary pcall still works. */
    ASSERT_OK(run(L, "local ok, e = pcall(error, 'x') assert(not ok)"));
    lj_lua_close(L);
}

LJ_TEST(string_rep_memory_bomb_hits_the_limit)
{
    lj_lua *L = open_lua();
    ASSERT_STATUS(run(L, "local s = string.rep('x', 1 << 30)"), LAJIT_ERR_LIMIT);
    ASSERT_CONTAINS(env.errmsg, "memory limit");
    ASSERT_STATUS(run(L, "local t = {} for i = 1, 1 << 30 do t[i] = i end"), LAJIT_ERR_LIMIT);
    ASSERT_OK(run(L, "local s = string.rep('x', 1000)"));
    lj_lua_close(L);
}

LJ_TEST(endless_loop_hits_the_instruction_limit_quickly)
{
    lj_lua *L = open_lua();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ASSERT_STATUS(run(L, "while true do end"), LAJIT_ERR_LIMIT);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    ASSERT_LE_F(s, 120.0); /* "never hangs": generous, since CI machines are slow and shared */
    ASSERT_CONTAINS(env.errmsg, "instruction limit");
    /* A later call gets a fresh budget. */
    ASSERT_OK(run(L, "local n = 0 for i = 1, 1000000 do n = n + i end"));
    lj_lua_close(L);
}

LJ_TEST(deep_recursion_is_an_error)
{
    lj_lua *L = open_lua();
    ASSERT_STATUS(run(L, "local function f(n) return 1 + f(n + 1) end f(1)"), LAJIT_ERR_TEMPLATE);
    ASSERT_CONTAINS(env.errmsg, "stack overflow");
    lj_lua_close(L);
}

LJ_TEST(bytecode_is_refused)
{
    lj_lua *L = open_lua();
    const char chunk[] = "\x1bLua\x54\x00 fake bytecode";
    ASSERT_STATUS(lj_lua_load(L, chunk, sizeof chunk - 1, "=bytes"), LAJIT_ERR_TEMPLATE);
    lj_lua_close(L);
}

LJ_TEST(errors_carry_position_and_traceback)
{
    lj_lua *L = open_lua();
    const char code[] = "local x = 1\nlocal function g() error('boom') end\ng()\n";
    ASSERT_OK(lj_lua_load(L, code, sizeof code - 1, "@where.lua"));
    ASSERT_STATUS(lj_lua_pcall(L, 0, 0), LAJIT_ERR_TEMPLATE);
    ASSERT_CONTAINS(env.errmsg, "where.lua:2: boom");
    ASSERT_CONTAINS(env.errmsg, "stack traceback");
    lj_lua_close(L);
}

LJ_TEST(template_dir_cannot_escape)
{
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/data/templates", lj_test_source_dir());
    lj_lua *L;
    ASSERT_OK(lj_lua_open(&env, dir, &L));
    const char *text;
    size_t len;
    ASSERT_OK(lj_lua_read_template(L, "toy/toy.cu", &text, &len));
    ASSERT_TRUE(len > 0);
    ASSERT_STATUS(lj_lua_read_template(L, "../../../etc/passwd", &text, &len),
                  LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(lj_lua_read_template(L, "/etc/passwd", &text, &len), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(lj_lua_read_template(L, "toy/missing.cu", &text, &len), LAJIT_ERR_NOT_FOUND);
    lj_lua_close(L);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    ASSERT_TRUE(f != NULL);
    fputs(text, f);
    fclose(f);
}

/* A template dir is untrusted: `toy.cu -> /etc/passwd` was printed by `lajit expand`, a FIFO
 * hung the expansion, and a 1 GiB sparse template was read into memory whole. */
LJ_TEST(template_dir_refuses_links_fifos_and_huge_files)
{
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    alarm(60); /* a FIFO that is waited on fails the test instead of hanging it */
    char dir[600], path[800], target[800];
    snprintf(dir, sizeof dir, "%s/tpl", lj_test_tmpdir());
    ASSERT_EQ(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/toy", dir);
    ASSERT_EQ(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/toy/ok.cu", dir);
    write_text(path, "// fine\n");
    snprintf(path, sizeof path, "%s/toy/passwd.cu", dir);
    ASSERT_EQ(symlink("/etc/passwd", path), 0);
    snprintf(target, sizeof target, "%s/toy", dir);
    snprintf(path, sizeof path, "%s/linked", dir);
    ASSERT_EQ(symlink(target, path), 0); /* a linked folder on the way */
    snprintf(path, sizeof path, "%s/toy/fifo.cu", dir);
    ASSERT_EQ(mkfifo(path, 0600), 0);
    snprintf(path, sizeof path, "%s/toy/sub", dir);
    ASSERT_EQ(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/toy/huge.cu", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_TRUE(fd >= 0);
    ASSERT_EQ(ftruncate(fd, 1LL << 30), 0); /* sparse: 1 GiB that takes no disk */
    close(fd);
    lj_lua *L;
    ASSERT_OK(lj_lua_open(&env, dir, &L));
    const char *text;
    size_t len;
    ASSERT_OK(lj_lua_read_template(L, "toy/ok.cu", &text, &len));
    ASSERT_STATUS(lj_lua_read_template(L, "toy/passwd.cu", &text, &len), LAJIT_ERR_IO);
    ASSERT_CONTAINS(env.errmsg, "symbolic link");
    ASSERT_STATUS(lj_lua_read_template(L, "linked/ok.cu", &text, &len), LAJIT_ERR_IO);
    ASSERT_STATUS(lj_lua_read_template(L, "toy/fifo.cu", &text, &len), LAJIT_ERR_IO);
    ASSERT_CONTAINS(env.errmsg, "not a regular file");
    ASSERT_STATUS(lj_lua_read_template(L, "toy/sub", &text, &len), LAJIT_ERR_IO);
    ASSERT_STATUS(lj_lua_read_template(L, "toy/huge.cu", &text, &len), LAJIT_ERR_IO);
    ASSERT_CONTAINS(env.errmsg, "larger than");
    /* Paths that are not plain relative paths never reach the file system. */
    static const char *const odd[] = {"toy/./ok.cu",      "toy//ok.cu",  "toy/", "./toy/ok.cu",
                                      "toy/../toy/ok.cu", "toy/ok.cu\n", "",     "toy/o k.cu"};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++)
        ASSERT_STATUS(lj_lua_read_template(L, odd[i], &text, &len), LAJIT_ERR_INVALID_ARGUMENT);
    /* All the files one state reads together are capped too: 17 of 1 MiB each go over 16 MiB. */
    lajit_status st = LAJIT_OK;
    for (int i = 0; i < 17 && st == LAJIT_OK; i++) {
        snprintf(path, sizeof path, "%s/toy/mib%d.cu", dir, i);
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        ASSERT_TRUE(fd >= 0);
        ASSERT_EQ(ftruncate(fd, 1 << 20), 0);
        close(fd);
        char rel[64];
        snprintf(rel, sizeof rel, "toy/mib%d.cu", i);
        st = lj_lua_read_template(L, rel, &text, &len);
    }
    ASSERT_STATUS(st, LAJIT_ERR_IO);
    ASSERT_CONTAINS(env.errmsg, "16 MiB in all");
    lj_lua_close(L);
    alarm(0);
}

/* The same rules for a family's own files: a linked family.lua is refused, not run. */
LJ_TEST(a_linked_family_spec_is_refused)
{
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    char dir[600], path[800], target[800];
    snprintf(dir, sizeof dir, "%s/tpl", lj_test_tmpdir());
    ASSERT_EQ(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/toy", dir);
    ASSERT_EQ(mkdir(path, 0700), 0);
    snprintf(target, sizeof target, "%s/tests/data/templates/toy/family.lua", lj_test_source_dir());
    snprintf(path, sizeof path, "%s/toy/family.lua", dir);
    ASSERT_EQ(symlink(target, path), 0);
    lj_lua *L;
    ASSERT_OK(lj_lua_open(&env, dir, &L));
    lj_family *f;
    ASSERT_STATUS(lj_family_load(&env, L, "toy", &f), LAJIT_ERR_IO);
    ASSERT_CONTAINS(env.errmsg, "symbolic link");
    lj_lua_close(L);
}

/* import(): another .lua file of the template folder, run once and cached; nothing else. */
LJ_TEST(import_runs_template_lua_only)
{
    lj_lua *L = open_lua(); /* the embedded templates */
    ASSERT_OK(run(L, "local s = import('common/scan.lua') assert(type(s.valid) == 'function')"
                     " assert(import('common/scan.lua') == s)"));
    const char *refused[] = {
        "import('common/la_params.h')",
        "import('/etc/passwd.lua')",
        "import('../x.lua')",
        "import('common/missing.lua')",
        "import(42)",
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        lajit_status st = run(L, refused[i]);
        if (st != LAJIT_ERR_TEMPLATE)
            lj_test_fail(__FILE__, __LINE__, "%s: got %s", refused[i], lajit_status_string(st));
    }
    /* An imported file runs under the caller's limits: an endless loop in it stops. */
    char dir[1024];
    lj_lua_close(L);
    snprintf(dir, sizeof dir, "%s/tests/data/templates", lj_test_source_dir());
    ASSERT_OK(lj_lua_open(&env, dir, &L));
    ASSERT_STATUS(run(L, "import('common/loop.lua')"), LAJIT_ERR_LIMIT);
    lj_lua_close(L);
}

/* Open the sandbox, load a family and expand it, with the n-th allocation failing. */
static lajit_status open_load_expand(uint64_t n, int *reached)
{
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    env.fault_at[LJ_FAULT_ALLOC] = n;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/data/templates", lj_test_source_dir());
    lj_lua *L = NULL;
    lj_family *f = NULL;
    char *src = NULL;
    lajit_status st = lj_lua_open(&env, dir, &L);
    if (st == LAJIT_OK)
        st = lj_family_load(&env, L, "toy", &f);
    lj_device_info dev;
    lj_device_info_for_arch("sm_90a", &dev);
    lj_problem *problems = NULL;
    int np;
    if (st == LAJIT_OK)
        st = lj_family_problems(f, &problems, &np);
    lj_config cfg;
    if (st == LAJIT_OK)
        st = lj_family_default(f, &problems[0], &dev, &cfg);
    if (st == LAJIT_OK)
        st = lj_family_source(f, &cfg, &problems[0], &dev, &src);
    *reached = env.fault_count[LJ_FAULT_ALLOC] >= n;
    env.fault_at[LJ_FAULT_ALLOC] = 0;
    lj_free(&env, src);
    lj_free(&env, problems);
    lj_family_free(f);
    lj_lua_close(L);
    return st;
}

LJ_TEST(fault_every_allocation_open_load_expand)
{
    int failures = 0;
    uint64_t n;
    for (n = 1; n < 100000; n++) {
        int reached;
        lajit_status st = open_load_expand(n, &reached);
        if (!reached) {
            ASSERT_OK(st);
            break;
        }
        if (st != LAJIT_OK) {
            failures++;
            if (!(st == LAJIT_ERR_OUT_OF_MEMORY || st == LAJIT_ERR_TEMPLATE ||
                  st == LAJIT_ERR_LIMIT))
                lj_test_fail(__FILE__, __LINE__, "allocation %llu: %s: %s", (unsigned long long)n,
                             lajit_status_string(st), env.errmsg);
            ASSERT_TRUE(env.errmsg[0] != 0);
        }
    }
    printf("%llu allocations on the path, %d failures reported\n", (unsigned long long)n - 1,
           failures);
    ASSERT_TRUE(failures > 0);
}

/* Every file-system call on the way from a template dir to an expansion (each folder opened on
 * a file's path, each read) fails in turn: each failure is LAJIT_ERR_IO with a message. */
LJ_TEST(fault_every_file_system_call_load_expand)
{
    int failures = 0;
    uint64_t n;
    for (n = 1; n < 10000; n++) {
        lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
        env.fault_at[LJ_FAULT_FS] = n;
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/tests/data/templates", lj_test_source_dir());
        lj_lua *L = NULL;
        lj_family *f = NULL;
        char *src = NULL;
        lj_problem *problems = NULL;
        int np;
        lj_config cfg;
        lj_device_info dev;
        lj_device_info_for_arch("sm_90a", &dev);
        lajit_status st = lj_lua_open(&env, dir, &L);
        if (st == LAJIT_OK)
            st = lj_family_load(&env, L, "toy", &f);
        if (st == LAJIT_OK)
            st = lj_family_problems(f, &problems, &np);
        if (st == LAJIT_OK)
            st = lj_family_default(f, &problems[0], &dev, &cfg);
        if (st == LAJIT_OK)
            st = lj_family_source(f, &cfg, &problems[0], &dev, &src);
        int reached = env.fault_count[LJ_FAULT_FS] >= n;
        lj_free(&env, src);
        lj_free(&env, problems);
        lj_family_free(f);
        lj_lua_close(L);
        if (!reached) {
            ASSERT_OK(st);
            break;
        }
        failures++;
        if (st != LAJIT_ERR_IO)
            lj_test_fail(__FILE__, __LINE__, "file-system call %llu failing: %s: %s",
                         (unsigned long long)n, lajit_status_string(st), env.errmsg);
        ASSERT_TRUE(env.errmsg[0] != 0);
    }
    printf("%llu file-system calls on the path, %d failures reported\n", (unsigned long long)n - 1,
           failures);
    ASSERT_TRUE(failures > 0);
}
