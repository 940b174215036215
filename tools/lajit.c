/* lajit.c — the `lajit` command: version, info, families, expand, compile, cache.
 *
 * It is a thin shell over the library: everything it prints comes from the same functions the
 * C API uses (the internal ones where the CLI reports more than the API returns, e.g. the
 * compiler's resource report). Each command has --help. Exit status: 0 success, 1 failure,
 * 2 usage error. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "context.h"
#include "kernel.h"
#include "problem.h"

static const char *prog = "lajit";

static void log_to_stderr(void *user, lajit_log_level level, const char *message)
{
    static const char *names[] = {"error", "warning", "info", "debug"};
    (void)user;
    fprintf(stderr, "lajit: %s: %s\n", names[level], message);
}

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "%s: ", prog);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see %s --help)\n", prog);
    return 2;
}

static int wants_help(int argc, char **argv)
{
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return 1;
    return 0;
}

static lajit_ctx *open_ctx(int verbose, uint32_t flags)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    /* verbose < 0: no log at all (the command prints what it needs itself). */
    desc.log = verbose >= 0 ? log_to_stderr : NULL;
    desc.log_level = verbose ? LAJIT_LOG_INFO : LAJIT_LOG_WARN;
    desc.flags = flags;
    lajit_ctx *ctx = NULL;
    lajit_status st = lajit_ctx_create(&desc, &ctx);
    if (st != LAJIT_OK) {
        fprintf(stderr, "%s: cannot create a context: %s\n", prog, lajit_status_string(st));
        return NULL;
    }
    return ctx;
}

static int fail(lajit_ctx *ctx, lajit_status st)
{
    fprintf(stderr, "%s: %s: %s\n", prog, lajit_status_string(st), lajit_errmsg(ctx));
    return 1;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- version, info, families ---------------------------------------------------------------- */

static int cmd_version(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        printf("usage: %s version\n\nPrints lajit's version.\n", prog);
        return 0;
    }
    printf("lajit %s\n", lajit_version_string());
    return 0;
}

static int cmd_info(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        printf("usage: %s info\n\nPrints the CUDA driver, NVRTC, the devices (or \"no GPU\"), the "
               "cache directory and the built-in families.\n", prog);
        return 0;
    }
    lajit_ctx *ctx = open_ctx(-1, 0);
    if (!ctx)
        return 1;
    lj_env *env = lajit__ctx_env(ctx);
    printf("lajit     %s\n", lajit_version_string());
    int major, minor;
    lajit_status st = lj_nvrtc_version(env, &major, &minor);
    if (st == LAJIT_OK)
        printf("NVRTC     %d.%d\n", major, minor);
    else
        printf("NVRTC     not available (%s)\n", lajit_errmsg(ctx));
    printf("cache     %s\n", ctx->cache_dir ? ctx->cache_dir : "(memory only)");
    if (ctx->template_dir)
        printf("templates %s (LAJIT_TEMPLATE_DIR)\n", ctx->template_dir);
    const lj_driver *drv;
    st = lj_driver_load(env, &drv);
    if (st != LAJIT_OK) {
        printf("driver    none: %s\n", lajit_errmsg(ctx));
        printf("devices   no GPU\n");
    } else {
        int version = 0, count = 0;
        LJ_CU(env, drv, cuDriverGetVersion, &version);
        LJ_CU(env, drv, cuDeviceGetCount, &count);
        printf("driver    CUDA %d.%d\n", version / 1000, (version % 1000) / 10);
        if (count == 0)
            printf("devices   no GPU\n");
        for (int i = 0; i < count; i++) {
            lj_device d;
            if (lj_device_open(env, drv, i, &d) == LAJIT_OK) {
                printf("device %d  %s, %s, %d SMs, %d KiB shared memory per block, %d MiB L2\n", i,
                       d.info.name, d.info.arch, d.info.sms, d.info.smem_optin / 1024,
                       d.info.l2_bytes >> 20);
                lj_device_close(env, &d);
            } else {
                printf("device %d  unusable: %s\n", i, lajit_errmsg(ctx));
            }
        }
    }
    printf("families ");
    for (const char *const *f = lajit_family_names(); *f; f++)
        printf(" %s", *f);
    printf("\n");
    lajit_ctx_destroy(ctx);
    return 0;
}

static int cmd_families(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        printf("usage: %s families\n\nLists the built-in families, their op and their tunable "
               "parameters with candidate values.\n", prog);
        return 0;
    }
    lajit_ctx *ctx = open_ctx(0, LAJIT_CTX_NO_DEVICE);
    if (!ctx)
        return 1;
    int rc = 0;
    for (const char *const *name = lajit_family_names(); *name; name++) {
        lj_family *f;
        lajit_status st = lajit__ctx_family(ctx, *name, &f);
        if (st != LAJIT_OK) {
            rc = fail(ctx, st);
            continue;
        }
        printf("%s (%s)\n", *name, lj_op_name(lj_family_op(f)));
        for (int i = 0; i < lj_family_param_count(f); i++) {
            const long long *v;
            int n = lj_family_param_values(f, i, &v);
            printf("  %-10s", lj_family_param_name(f, i));
            for (int j = 0; j < n; j++)
                printf(" %lld", v[j]);
            printf("\n");
        }
    }
    lajit_ctx_destroy(ctx);
    return rc;
}

/* ---- expand ---------------------------------------------------------------------------------- */

static int cmd_expand(int argc, char **argv)
{
    if (wants_help(argc, argv) || argc < 1) {
        printf("usage: %s expand FAMILY [-p KEY=VALUE ...] [--arch ARCH]\n\n"
               "Prints the CUDA source the family's template expands to. KEY is a problem field\n"
               "(dtype=bf16, D=128, E=64, decay=1, has_initial=1, vk=1, varlen=1, T=4, ...) or a\n"
               "parameter in capitals (TILE_V=32). Unset fields come from the family's first\n"
               "representative problem and its default configuration. ARCH: sm_80, sm_86, sm_89,\n"
               "sm_90a (default), sm_100a, sm_120.\n", prog);
        return argc < 1 ? 2 : 0;
    }
    const char *family = argv[0], *arch = "sm_90a";
    const char *assign[64];
    size_t n = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-p") == 0 && i + 1 < argc && n < 64)
            assign[n++] = argv[++i];
        else if (strcmp(argv[i], "--arch") == 0 && i + 1 < argc)
            arch = argv[++i];
        else
            return usage_error("expand: unexpected argument %s", argv[i]);
    }
    lajit_ctx *ctx = open_ctx(0, LAJIT_CTX_NO_DEVICE);
    if (!ctx)
        return 1;
    char *source;
    lajit_status st = lajit_expand(ctx, family, arch, assign, n, &source);
    int rc = 0;
    if (st == LAJIT_OK) {
        fputs(source, stdout);
        lajit_free(ctx, source);
    } else {
        rc = fail(ctx, st);
    }
    lajit_ctx_destroy(ctx);
    return rc;
}

/* ---- compile --------------------------------------------------------------------------------- */

typedef struct compile_item {
    char arch[16];
    lj_problem problem;
    lj_config config;
    int valid;
    char reason[256];
    unsigned smem_dynamic;
    lj_kernel_job job;
    int have_job;
    int cached;            /* served by the cache */
    lj_cache_entry entry;  /* report (from the cache or the compile) */
    lj_compiled compiled;
    lajit_status status;
    char error[1024];
    double seconds;
} compile_item;

typedef struct compile_pool {
    compile_item *items;
    int n, next;
    pthread_mutex_t lock;
} compile_pool;

static void *compile_worker(void *arg)
{
    compile_pool *pool = arg;
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    for (;;) {
        pthread_mutex_lock(&pool->lock);
        int i = pool->next++;
        pthread_mutex_unlock(&pool->lock);
        if (i >= pool->n)
            return NULL;
        compile_item *it = &pool->items[i];
        if (!it->have_job || it->cached)
            continue;
        double t0 = now_s();
        it->status = lj_kernel_compile(&env, &it->job, &it->compiled);
        it->seconds = now_s() - t0;
        if (it->status != LAJIT_OK)
            snprintf(it->error, sizeof it->error, "%.1000s", env.errmsg);
    }
}

static int split_list(char *list, char **out, int cap)
{
    int n = 0;
    for (char *tok = strtok(list, ","); tok && n < cap; tok = strtok(NULL, ","))
        out[n++] = tok;
    return n;
}

static int cmd_compile(int argc, char **argv)
{
    if (wants_help(argc, argv) || argc < 1) {
        printf("usage: %s compile FAMILY|all --arch LIST [--all-configs] [-p KEY=VALUE ...] [-j N]\n\n"
               "Compiles the family's kernels for each arch of LIST (comma-separated, e.g.\n"
               "sm_80,sm_90a,sm_100a,sm_120) without a GPU, for each representative problem of\n"
               "the family (or the one problem the -p assignments describe), with the default\n"
               "configuration or, with --all-configs, every configuration of the family's space\n"
               "(invalid ones are listed with the reason). Prints cubin size, registers, spills,\n"
               "static + dynamic shared memory and where the cubin came from (nvrtc or cache).\n"
               "Exits non-zero when any compile fails. -j: compile threads (default: CPUs).\n", prog);
        return argc < 1 ? 2 : 0;
    }
    char *families[32];
    int n_families = 0;
    char *archs[16];
    int n_archs = 0, all_configs = 0, jobs = 0;
    const char *assign[64];
    int n_assign = 0;
    char archbuf[256] = "sm_80,sm_90a,sm_100a,sm_120";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--arch") == 0 && i + 1 < argc)
            snprintf(archbuf, sizeof archbuf, "%s", argv[++i]);
        else if (strcmp(argv[i], "--all-configs") == 0)
            all_configs = 1;
        else if (strcmp(argv[i], "-p") == 0 && i + 1 < argc && n_assign < 64)
            assign[n_assign++] = argv[++i];
        else if (strcmp(argv[i], "-j") == 0 && i + 1 < argc)
            jobs = atoi(argv[++i]);
        else
            return usage_error("compile: unexpected argument %s", argv[i]);
    }
    n_archs = split_list(archbuf, archs, 16);
    if (strcmp(argv[0], "all") == 0) {
        for (const char *const *f = lajit_family_names(); *f && n_families < 32; f++)
            families[n_families++] = (char *)*f;
    } else {
        families[n_families++] = argv[0];
    }
    lajit_ctx *ctx = open_ctx(0, LAJIT_CTX_NO_DEVICE);
    if (!ctx)
        return 1;
    lj_env *env = lajit__ctx_env(ctx);
    lj_lua *L;
    lj_cache *cache;
    lajit_status st;
    if ((st = lajit__ctx_lua(ctx, &L)) != LAJIT_OK || (st = lajit__ctx_cache(ctx, &cache)) != LAJIT_OK) {
        int rc = fail(ctx, st);
        lajit_ctx_destroy(ctx);
        return rc;
    }
    int rc = 0;
    printf("%-13s %-8s %-44s %-36s %-7s %8s %5s %7s %8s %s\n", "family", "arch", "problem",
           "config", "source", "bytes", "regs", "spills", "smem", "seconds");
    for (int fi = 0; fi < n_families; fi++) {
        lj_family *f;
        if ((st = lajit__ctx_family(ctx, families[fi], &f)) != LAJIT_OK) {
            rc = fail(ctx, st);
            continue;
        }
        lj_problem *problems = NULL;
        int n_problems = 0;
        if ((st = lj_family_problems(f, &problems, &n_problems)) != LAJIT_OK) {
            rc = fail(ctx, st);
            continue;
        }
        if (n_assign > 0 && n_problems > 1)
            n_problems = 1; /* -p describes one problem, starting from the first */
        lj_config *configs = NULL;
        int n_configs = 0;
        if (all_configs && (st = lj_family_all_configs(f, &configs, &n_configs)) != LAJIT_OK) {
            rc = fail(ctx, st);
            lj_free(env, problems);
            continue;
        }
        int per = all_configs ? n_configs : 1;
        int total = n_archs * n_problems * per;
        compile_item *items = lj_calloc(env, (size_t)(total ? total : 1), sizeof *items);
        if (!items) {
            rc = fail(ctx, lj_oom(env));
            lj_free(env, problems);
            lj_free(env, configs);
            continue;
        }
        int n = 0;
        for (int a = 0; a < n_archs; a++) {
            lj_device_info dev;
            if (!lj_device_info_for_arch(archs[a], &dev)) {
                fprintf(stderr, "%s: unknown arch %s\n", prog, archs[a]);
                rc = 1;
                continue;
            }
            for (int pi = 0; pi < n_problems; pi++) {
                for (int c = 0; c < per; c++) {
                    compile_item *it = &items[n++];
                    snprintf(it->arch, sizeof it->arch, "%s", archs[a]);
                    it->problem = problems[pi];
                    st = LAJIT_OK;
                    if (all_configs) {
                        it->config = configs[c];
                    } else {
                        st = lj_assign_all(env, f, assign, (size_t)n_assign, &dev, &it->problem,
                                           &it->config);
                    }
                    if (st == LAJIT_OK)
                        st = lj_family_valid(f, &it->config, &it->problem, &dev, &it->valid,
                                             it->reason, sizeof it->reason);
                    lj_launch launch;
                    if (st == LAJIT_OK && it->valid &&
                        (st = lj_family_launch(f, &it->config, &it->problem, &dev, &launch)) == LAJIT_OK)
                        it->smem_dynamic = launch.smem;
                    if (st == LAJIT_OK && it->valid &&
                        (st = lj_kernel_prepare(L, f, &it->config, &it->problem, &dev, 0, &it->job)) == LAJIT_OK) {
                        it->have_job = 1;
                        int found = 0;
                        st = lj_cache_get(cache, it->job.key, 0, &it->entry, &found);
                        it->cached = found;
                    }
                    it->status = st;
                    if (st != LAJIT_OK)
                        snprintf(it->error, sizeof it->error, "%s", lajit_errmsg(ctx));
                }
            }
        }
        /* Compile the misses on worker threads, then store them from this thread. */
        compile_pool pool = {items, n, 0, PTHREAD_MUTEX_INITIALIZER};
        int threads = jobs > 0 ? jobs : 4;
        if (threads > 16)
            threads = 16;
        pthread_t tid[16];
        int started = 0;
        for (int t = 0; t < threads; t++)
            if (pthread_create(&tid[t], NULL, compile_worker, &pool) == 0)
                started++;
        if (started == 0)
            compile_worker(&pool);
        for (int t = 0; t < started; t++)
            pthread_join(tid[t], NULL);
        for (int i = 0; i < n; i++) {
            compile_item *it = &items[i];
            char what[256], cfg[256];
            lj_problem_format(&it->problem, what, sizeof what);
            lj_config_format(&it->config, cfg, sizeof cfg);
            if (it->have_job && !it->cached && it->status == LAJIT_OK) {
                int found = 0;
                st = lj_cache_put(cache, it->job.key, 0, &it->compiled);
                if (st == LAJIT_OK)
                    st = lj_cache_get(cache, it->job.key, 0, &it->entry, &found);
                lj_compiled_free(env, &it->compiled);
                if (st != LAJIT_OK) {
                    it->status = st;
                    snprintf(it->error, sizeof it->error, "%s", lajit_errmsg(ctx));
                }
            }
            if (it->status != LAJIT_OK) {
                printf("%-13s %-8s %-44s %-36s FAILED: %s\n", families[fi], it->arch, what, cfg,
                       it->error);
                rc = 1;
            } else if (!it->valid) {
                printf("%-13s %-8s %-44s %-36s rejected: %s\n", families[fi], it->arch, what, cfg,
                       it->reason);
            } else {
                char spills[32];
                snprintf(spills, sizeof spills, "%d/%d", it->entry.spill_stores, it->entry.spill_loads);
                printf("%-13s %-8s %-44s %-36s %-7s %8zu %5d %7s %8u %.2f\n", families[fi],
                       it->arch, what, cfg, it->cached ? "cache" : "nvrtc", it->entry.size,
                       it->entry.regs, spills, (unsigned)it->entry.smem_static + it->smem_dynamic,
                       it->seconds);
            }
            if (it->have_job)
                lj_kernel_job_free(L, &it->job);
        }
        lj_free(env, items);
        lj_free(env, problems);
        lj_free(env, configs);
    }
    lajit_ctx_destroy(ctx);
    return rc;
}

/* ---- cache ----------------------------------------------------------------------------------- */

typedef struct scan_state {
    int entries, bad;
    size_t bytes;
    int print;
} scan_state;

static void scan_visit(void *user, const char *path, size_t size, int ok, const char *reason)
{
    scan_state *s = user;
    s->entries++;
    s->bytes += size;
    if (!ok)
        s->bad++;
    if (s->print || !ok)
        printf("%s  %zu bytes%s%s\n", path, size, ok ? "" : "  BAD: ", ok ? "" : reason);
}

static int cmd_cache(int argc, char **argv)
{
    if (wants_help(argc, argv) || argc < 1) {
        printf("usage: %s cache list|verify|clear\n\n"
               "list: the entries of the kernel cache directory; verify: check every entry's\n"
               "header and checksum (exit 1 if any is bad); clear: remove every entry.\n"
               "The directory is $LAJIT_CACHE_DIR, else $XDG_CACHE_HOME/lajit, else ~/.cache/lajit.\n",
               prog);
        return argc < 1 ? 2 : 0;
    }
    lajit_ctx *ctx = open_ctx(0, LAJIT_CTX_NO_DEVICE);
    if (!ctx)
        return 1;
    lj_env *env = lajit__ctx_env(ctx);
    int rc = 0;
    if (!ctx->cache_dir) {
        fprintf(stderr, "%s: no cache directory\n", prog);
        rc = 1;
    } else if (strcmp(argv[0], "list") == 0 || strcmp(argv[0], "verify") == 0) {
        int verify = strcmp(argv[0], "verify") == 0;
        scan_state s = {0, 0, 0, !verify};
        lajit_status st = lj_cache_scan(env, ctx->cache_dir, verify, scan_visit, &s);
        if (st != LAJIT_OK)
            rc = fail(ctx, st);
        else
            printf("%s: %d entries, %zu bytes%s\n", ctx->cache_dir, s.entries, s.bytes,
                   verify ? (s.bad ? ", some BAD" : ", all good") : "");
        if (s.bad)
            rc = 1;
    } else if (strcmp(argv[0], "clear") == 0) {
        int removed = 0;
        lajit_status st = lj_cache_clear(env, ctx->cache_dir, &removed);
        if (st != LAJIT_OK)
            rc = fail(ctx, st);
        else
            printf("%s: removed %d entries\n", ctx->cache_dir, removed);
    } else {
        rc = usage_error("cache: unknown action %s", argv[0]);
    }
    lajit_ctx_destroy(ctx);
    return rc;
}

/* ---- main ------------------------------------------------------------------------------------ */

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"version", cmd_version, "print the version"},
    {"info", cmd_info, "driver, NVRTC, devices, cache directory, families"},
    {"families", cmd_families, "the built-in families and their parameter spaces"},
    {"expand", cmd_expand, "print a family's expanded CUDA source"},
    {"compile", cmd_compile, "compile families for a list of archs, with a resource report"},
    {"cache", cmd_cache, "list, verify or clear the kernel cache"},
};

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        printf("usage: %s COMMAND [ARGS]   (%s COMMAND --help for each)\n\ncommands:\n", prog, prog);
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            printf("  %-9s %s\n", commands[i].name, commands[i].help);
        printf("\nenvironment: LAJIT_CACHE_DIR, LAJIT_TEMPLATE_DIR, LAJIT_CHECK=1\n");
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0)
        return cmd_version(0, NULL);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].fn(argc - 2, argv + 2);
    return usage_error("unknown command %s", argv[1]);
}
