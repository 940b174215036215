/* lajit.c — the `lajit` command: version, info, families, expand, compile, cache, tune, db.
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
#include <unistd.h>

#include "context.h"
#include "kernel.h"
#include "resources.h"
#include "problem.h"
#include "bundle.h"
#include "search.h"
#include "tunedb.h"

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
    lajit_status status;
    char error[1024];
} compile_item;

static int split_list(char *list, char **out, int cap)
{
    int n = 0;
    for (char *tok = strtok(list, ","); tok && n < cap; tok = strtok(NULL, ","))
        out[n++] = tok;
    return n;
}

/* Whether cfg has the value every parameter assignment among assign ("TILE_V=32") gave `asked`,
 * the configuration lj_assign_all built from them. */
static int config_matches(const char *const *assign, int n, const lj_config *cfg, const lj_config *asked)
{
    for (int i = 0; i < n; i++) {
        if (!lj_assignment_is_parameter(assign[i]))
            continue;
        char key[64];
        size_t len = strcspn(assign[i], "=");
        snprintf(key, sizeof key, "%.*s", (int)(len < 63 ? len : 63), assign[i]);
        if (lj_config_get(cfg, key, -1) != lj_config_get(asked, key, -2))
            return 0;
    }
    return 1;
}

static int cmd_compile(int argc, char **argv)
{
    if (wants_help(argc, argv) || argc < 1) {
        printf("usage: %s compile FAMILY|all --arch LIST [--all-configs] [-p KEY=VALUE ...] [-j N]\n\n"
               "Compiles the family's kernels for each arch of LIST (comma-separated, e.g.\n"
               "sm_80,sm_90a,sm_100a,sm_120) without a GPU, for each representative problem of\n"
               "the family (or the one problem the -p assignments describe), with the default\n"
               "configuration or, with --all-configs, every configuration of the family's space\n"
               "(invalid ones are listed with the reason; parameters given with -p keep the ones\n"
               "that match). Prints cubin size, registers, spills,\n"
               "static + dynamic shared memory and where the cubin came from (nvrtc or cache).\n"
               "Exits non-zero when any compile fails, or when a valid configuration spills or\n"
               "uses more registers or shared memory than its spec claims (OVER CLAIM lines).\n"
               "-j: compile threads (default: CPUs).\n", prog);
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
                        /* The -p problem, and only the configurations with its parameters. */
                        lj_config asked;
                        st = lj_assign_all(env, f, assign, (size_t)n_assign, &dev, &it->problem, &asked);
                        if (st == LAJIT_OK && !config_matches(assign, n_assign, &configs[c], &asked)) {
                            memset(it, 0, sizeof *it);
                            n--;
                            continue;
                        }
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
        lj_compile_task *tasks = lj_calloc(env, (size_t)(n ? n : 1), sizeof *tasks);
        if (!tasks) {
            rc = fail(ctx, lj_oom(env));
            n = 0;
        }
        for (int i = 0; i < n; i++)
            tasks[i].job = items[i].have_job && !items[i].cached && items[i].status == LAJIT_OK
                               ? &items[i].job : NULL;
        lj_kernel_compile_parallel(tasks, n, jobs);
        for (int i = 0; i < n; i++) {
            compile_item *it = &items[i];
            char what[256], cfg[256];
            lj_problem_format(&it->problem, what, sizeof what);
            lj_config_format(&it->config, cfg, sizeof cfg);
            if (tasks[i].job && tasks[i].status != LAJIT_OK) {
                it->status = tasks[i].status;
                snprintf(it->error, sizeof it->error, "%s", tasks[i].error);
            } else if (tasks[i].job) {
                int found = 0;
                st = lj_cache_put(cache, it->job.key, 0, &tasks[i].compiled);
                if (st == LAJIT_OK)
                    st = lj_cache_get(cache, it->job.key, 0, &it->entry, &found);
                if (st != LAJIT_OK) {
                    it->status = st;
                    snprintf(it->error, sizeof it->error, "%s", lajit_errmsg(ctx));
                }
            }
            lj_compile_task_free(&tasks[i]);
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
                       tasks[i].seconds);
                /* A valid config must not spill nor exceed its spec's claim (resources.h). */
                int fits = 1;
                char why[512];
                lj_device_info dev;
                if (lj_device_info_for_arch(it->arch, &dev) &&
                    lj_resources_check_config(f, &it->config, &it->problem, &dev, &it->entry,
                                              it->smem_dynamic, &fits, why, sizeof why) != LAJIT_OK) {
                    snprintf(why, sizeof why, "%s", lajit_errmsg(ctx));
                    fits = 0;
                }
                if (!fits) {
                    printf("%-13s %-8s %-44s %-36s OVER CLAIM: %s\n", families[fi], it->arch, what, cfg, why);
                    rc = 1;
                }
            }
            if (it->have_job)
                lj_kernel_job_free(L, &it->job);
        }
        lj_free(env, tasks);
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

/* ---- tune ------------------------------------------------------------------------------------ */

typedef struct tune_progress {
    int tty;
    const char *label;
} tune_progress;

/* A one-line bar on a terminal (stderr); nothing otherwise, so logs and pipes stay clean. */
static void tune_progress_fn(void *user, int done, int total, const char *what)
{
    tune_progress *t = user;
    if (!t->tty)
        return;
    int width = 30, filled = total > 0 ? done * width / total : 0;
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[width] = 0;
    fprintf(stderr, "\r%-28.28s [%s] %3d/%-3d %-40.40s", t->label, bar, done, total, what);
    fflush(stderr);
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", (unsigned char)*s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

static void json_ms(FILE *f, double ms)
{
    if (ms >= 0)
        fprintf(f, "%.6g", ms);
    else
        fputs("null", f);
}

#define MAX_LIST 16

/* "1,4,16" into values; returns the count (0 on a bad list). */
static int int_list(const char *text, int *values)
{
    int n = 0;
    const char *p = text;
    while (*p && n < MAX_LIST) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v <= 0 || v > 1 << 30)
            return 0;
        values[n++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return 0;
    }
    return *p ? 0 : n;
}

static int cmd_tune(int argc, char **argv)
{
    if (wants_help(argc, argv) || argc < 1) {
        printf("usage: %s tune --family NAME [--dtype T] [--B LIST] [--H LIST] [--N LIST] [--D n]\n"
               "       [--E n] [--T n] [--decay] [--initial] [--final] [--vk] [--step-states]\n"
               "       [-p KEY=VALUE ...] [--runs N] [--warmup N] [-j N] [--json FILE]\n\n"
               "Tunes a family on this machine's GPU (device 0) and stores the winners in the\n"
               "tuning database (tune.db in the cache directory). The problem starts from the\n"
               "family's first representative problem; the flags (or -p with problem fields) set\n"
               "its fields (--D alone sets E = D too). B, H and N take comma-separated lists:\n"
               "every combination is tuned.\n"
               "Each valid configuration is compiled (-j threads), then timed in a private CUDA\n"
               "context: --warmup launches, then the median of --runs (default 3 and 5), inputs\n"
               "rotated beyond the L2 size. A faulting candidate is recorded as failed.\n"
               "A progress bar goes to stderr on a terminal. --json writes a summary: per bucket\n"
               "the default and the tuned configuration with their times.\n", prog);
        return argc < 1 ? 2 : 0;
    }
    const char *family = NULL, *json = NULL;
    const char *assign[64];
    int n_assign = 0;
    char flagbuf[8][32];
    int n_flags = 0;
    int Bs[MAX_LIST], Hs[MAX_LIST], Ns[MAX_LIST], nB = 0, nH = 0, nN = 0;
    lj_search_opts opts;
    memset(&opts, 0, sizeof opts);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (strcmp(a, "--family") == 0 && more)
            family = argv[++i];
        else if (strcmp(a, "--json") == 0 && more)
            json = argv[++i];
        else if (strcmp(a, "-p") == 0 && more && n_assign < 48)
            assign[n_assign++] = argv[++i];
        else if (strcmp(a, "--runs") == 0 && more)
            opts.runs = atoi(argv[++i]);
        else if (strcmp(a, "--warmup") == 0 && more)
            opts.warmup = atoi(argv[++i]);
        else if (strcmp(a, "-j") == 0 && more)
            opts.threads = atoi(argv[++i]);
        else if (strcmp(a, "--B") == 0 && more) {
            if (!(nB = int_list(argv[++i], Bs)))
                return usage_error("tune: bad --B list %s", argv[i]);
        } else if (strcmp(a, "--H") == 0 && more) {
            if (!(nH = int_list(argv[++i], Hs)))
                return usage_error("tune: bad --H list %s", argv[i]);
        } else if (strcmp(a, "--N") == 0 && more) {
            if (!(nN = int_list(argv[++i], Ns)))
                return usage_error("tune: bad --N list %s", argv[i]);
        } else if ((strcmp(a, "--D") == 0 || strcmp(a, "--E") == 0 || strcmp(a, "--T") == 0 ||
                    strcmp(a, "--dtype") == 0) && more && n_flags < 7) {
            snprintf(flagbuf[n_flags], sizeof flagbuf[n_flags], "%s=%s", a + 2, argv[++i]);
            assign[n_assign++] = flagbuf[n_flags++];
            /* --D alone means D = E, as in the benchmarks (the representative problem may have
             * another E). */
            int e_given = 0;
            for (int j = 1; j < argc; j++)
                e_given |= strcmp(argv[j], "--E") == 0;
            if (strcmp(a, "--D") == 0 && !e_given) {
                snprintf(flagbuf[n_flags], sizeof flagbuf[n_flags], "E=%s", argv[i]);
                assign[n_assign++] = flagbuf[n_flags++];
            }
        } else if (strcmp(a, "--decay") == 0 && n_assign < 48)
            assign[n_assign++] = "decay=1";
        else if (strcmp(a, "--initial") == 0 && n_assign < 48)
            assign[n_assign++] = "has_initial=1";
        else if (strcmp(a, "--final") == 0 && n_assign < 48)
            assign[n_assign++] = "has_final=1";
        else if (strcmp(a, "--vk") == 0 && n_assign < 48)
            assign[n_assign++] = "vk=1";
        else if (strcmp(a, "--step-states") == 0 && n_assign < 48)
            assign[n_assign++] = "step_states=1";
        else
            return usage_error("tune: unexpected argument %s", a);
    }
    if (!family)
        return usage_error("tune: %s", "--family is required");
    lajit_ctx *ctx = open_ctx(0, 0);
    if (!ctx)
        return 1;
    lj_env *env = lajit__ctx_env(ctx);
    lj_family *f;
    lj_lua *L;
    lj_cache *cache;
    lj_device *dev;
    lajit_status st;
    if ((st = lajit__ctx_family(ctx, family, &f)) != LAJIT_OK ||
        (st = lajit__ctx_lua(ctx, &L)) != LAJIT_OK || (st = lajit__ctx_cache(ctx, &cache)) != LAJIT_OK ||
        (st = lajit__ctx_device(ctx, &dev)) != LAJIT_OK) {
        int rc = fail(ctx, st);
        lajit_ctx_destroy(ctx);
        return rc;
    }
    lj_problem *problems;
    int n_problems;
    if ((st = lj_family_problems(f, &problems, &n_problems)) != LAJIT_OK || n_problems == 0) {
        int rc = st != LAJIT_OK ? fail(ctx, st) : 1;
        if (st == LAJIT_OK) {
            fprintf(stderr, "%s: %s lists no representative problem\n", prog, family);
            lj_free(env, problems);
        }
        lajit_ctx_destroy(ctx);
        return rc;
    }
    lj_problem base = problems[0];
    lj_free(env, problems);
    lj_config unused;
    memset(&unused, 0, sizeof unused);
    if ((st = lj_assign_all(env, f, assign, (size_t)n_assign, &dev->info, &base, &unused)) != LAJIT_OK) {
        int rc = fail(ctx, st);
        lajit_ctx_destroy(ctx);
        return rc;
    }
    lj_tunedb *db = NULL;
    if (!ctx->cache_dir || lj_tunedb_open(env, ctx->cache_dir, &db) != LAJIT_OK)
        fprintf(stderr, "%s: warning: results will not be stored: %s\n", prog,
                ctx->cache_dir ? lajit_errmsg(ctx) : "no cache directory");
    if (!nB)
        Bs[nB++] = base.B;
    if (!nH)
        Hs[nH++] = base.H;
    if (!nN)
        Ns[nN++] = base.N;
    FILE *out = NULL;
    if (json && !(out = fopen(json, "w"))) {
        fprintf(stderr, "%s: cannot write %s\n", prog, json);
        lj_tunedb_close(db);
        lajit_ctx_destroy(ctx);
        return 1;
    }
    if (out) {
        fputs("{\"device\":", out);
        json_string(out, dev->info.name);
        fprintf(out, ",\"cc\":%d,\"driver\":%d,\"lajit\":", dev->info.cc, dev->driver_version);
        json_string(out, lajit_version_string());
        fputs(",\"rows\":[", out);
    }
    int rc = 0, rows = 0;
    tune_progress prog_state = {isatty(2), family};
    opts.progress = tune_progress_fn;
    opts.progress_user = &prog_state;
    printf("%-10s %-44s %-34s %10s %-34s %10s %7s\n", "family", "problem", "default", "ms",
           "tuned", "ms", "speedup");
    for (int bi = 0; bi < nB; bi++) {
        for (int hi = 0; hi < nH; hi++) {
            for (int ni = 0; ni < nN; ni++) {
                lj_problem p = base;
                p.B = Bs[bi];
                p.H = Hs[hi];
                p.N = Ns[ni];
                if (p.op == LJ_OP_DECODE)
                    p.N = p.T > 0 ? p.T : 1;
                char what[256];
                lj_problem_format(&p, what, sizeof what);
                lj_tune_id id;
                int got = 1;
                if ((st = lj_tune_id_make(env, f, dev, &p, &id)) != LAJIT_OK) {
                    rc = fail(ctx, st);
                    continue;
                }
                if (db && lj_tunedb_lease(db, &id, 1800, &got) == LAJIT_OK && !got) {
                    fprintf(stderr, "%s: %s %s is being tuned by another process; skipped\n", prog,
                            family, what);
                    rc = 1;
                    continue;
                }
                double t0 = now_s();
                lj_search_out res;
                st = lj_search_run(env, L, f, cache, dev, &p, &opts, &res);
                double seconds = now_s() - t0;
                if (prog_state.tty)
                    fprintf(stderr, "\r%100s\r", "");
                if (st != LAJIT_OK) {
                    if (db)
                        lj_tunedb_release(db, &id);
                    rc = fail(ctx, st);
                    continue;
                }
                char dtext[256], btext[256] = "-";
                lj_config_format(&res.dflt, dtext, sizeof dtext);
                if (res.have_best)
                    lj_config_format(&res.best, btext, sizeof btext);
                if (db) {
                    if (lj_tunedb_record(db, &id, res.results, res.n_results, dtext, res.default_ms) != LAJIT_OK)
                        rc = fail(ctx, LAJIT_ERR_DATABASE);
                    lj_tunedb_release(db, &id);
                }
                int failed = 0;
                for (int i = 0; i < res.n_results; i++)
                    failed += res.results[i].failure[0] != 0;
                char speed[32] = "-";
                if (res.have_best && res.default_ms > 0)
                    snprintf(speed, sizeof speed, "%.2fx", res.default_ms / res.best_ms);
                printf("%-10s %-44s %-34s %10.4f %-34s %10.4f %7s\n", family, what, dtext,
                       res.default_ms, btext, res.have_best ? res.best_ms : -1.0, speed);
                if (!res.have_best) {
                    fprintf(stderr, "%s: no candidate of %s ran for %s\n", prog, family, what);
                    rc = 1;
                }
                if (out) {
                    fprintf(out, "%s\n{\"family\":", rows++ ? "," : "");
                    json_string(out, family);
                    fputs(",\"bucket\":", out);
                    json_string(out, id.bucket);
                    fputs(",\"problem\":", out);
                    json_string(out, what);
                    fprintf(out, ",\"B\":%d,\"H\":%d,\"N\":%d,\"D\":%d,\"E\":%d,\"default_config\":",
                            p.B, p.H, p.N, p.D, p.E);
                    json_string(out, dtext);
                    fputs(",\"default_ms\":", out);
                    json_ms(out, res.default_ms);
                    fputs(",\"tuned_config\":", out);
                    json_string(out, btext);
                    fputs(",\"tuned_ms\":", out);
                    json_ms(out, res.have_best ? res.best_ms : -1);
                    fprintf(out, ",\"candidates\":%d,\"failed\":%d,\"space\":%d,\"s\":%.3f}",
                            res.n_results, failed, res.n_space, seconds);
                }
                lj_search_out_free(env, &res);
            }
        }
    }
    if (out) {
        fputs("\n]}\n", out);
        if (fclose(out) != 0) {
            fprintf(stderr, "%s: cannot write %s\n", prog, json);
            rc = 1;
        }
    }
    lj_tunedb_close(db);
    lajit_ctx_destroy(ctx);
    return rc;
}

/* ---- db -------------------------------------------------------------------------------------- */

static void show_row(void *user, const lj_fingerprint *fp, const char *family,
                     const char *template_hash, const char *bucket, const char *config, double ms,
                     const char *default_config, double default_ms, int measured)
{
    int *rows = user;
    if ((*rows)++ == 0)
        printf("%-28s %-5s %-8s %-12s %-36s %-34s %10s %-34s %10s %5s\n", "device", "cc", "driver",
               "family", "bucket", "tuned", "ms", "default", "ms", "tried");
    char dms[32] = "-";
    if (default_ms >= 0)
        snprintf(dms, sizeof dms, "%.4f", default_ms);
    printf("%-28s %-5d %-8d %-12s %-36s %-34s %10.4f %-34s %10s %5d\n", fp->name, fp->cc,
           fp->driver, family, bucket, config, ms, default_config[0] ? default_config : "-", dms,
           measured);
    (void)template_hash;
}

static int cmd_db(int argc, char **argv)
{
    if (wants_help(argc, argv) || argc < 1) {
        printf("usage: %s db show | export FILE | import FILE [--force]\n\n"
               "The tuning database (tune.db in the cache directory).\n"
               "show: every winner with its device, bucket, time and the default's time.\n"
               "export: every measurement and winner as JSON lines into FILE, to share with\n"
               "machines of the same GPU. import: adds FILE's rows (replacing equal ones);\n"
               "rows for another device name or compute capability than this machine's GPU are\n"
               "refused unless --force (also needed when this machine has no GPU).\n", prog);
        return argc < 1 ? 2 : 0;
    }
    const char *action = argv[0], *file = NULL;
    int force = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--force") == 0)
            force = 1;
        else if (!file && argv[i][0] != '-')
            file = argv[i];
        else
            return usage_error("db: unexpected argument %s", argv[i]);
    }
    int is_show = strcmp(action, "show") == 0, is_export = strcmp(action, "export") == 0,
        is_import = strcmp(action, "import") == 0;
    if (!is_show && !is_export && !is_import)
        return usage_error("db: unknown action %s", action);
    if (!is_show && !file)
        return usage_error("db %s: FILE is required", action);
    lajit_ctx *ctx = open_ctx(0, 0);
    if (!ctx)
        return 1;
    lj_env *env = lajit__ctx_env(ctx);
    lj_tunedb *db = NULL;
    int rc = 0, rows = 0;
    lajit_status st;
    if (!ctx->cache_dir) {
        fprintf(stderr, "%s: no cache directory\n", prog);
        rc = 1;
    } else if ((st = lj_tunedb_open(env, ctx->cache_dir, &db)) != LAJIT_OK) {
        rc = fail(ctx, st);
    } else if (is_show) {
        if ((st = lj_tunedb_show(db, show_row, &rows)) != LAJIT_OK)
            rc = fail(ctx, st);
        else
            printf("%s: %d winners\n", lj_tunedb_path(db), rows);
    } else if (is_export) {
        if ((st = lj_tunedb_export(db, file, &rows)) != LAJIT_OK)
            rc = fail(ctx, st);
        else
            printf("%s: %d rows written to %s\n", lj_tunedb_path(db), rows, file);
    } else {
        /* This machine's GPU, to check the rows against (none: only --force imports). */
        lj_fingerprint local, *have = NULL;
        lj_device *dev;
        if (lajit__ctx_device(ctx, &dev) == LAJIT_OK) {
            int major = 0, minor = 0;
            if (lj_nvrtc_version(env, &major, &minor) != LAJIT_OK)
                major = minor = 0;
            lj_fingerprint_make(&dev->info, dev->driver_version, major, minor, &local);
            have = &local;
        }
        lj_clear_error(env);
        if ((st = lj_tunedb_import(db, file, have, force, &rows)) != LAJIT_OK)
            rc = fail(ctx, st);
        else
            printf("%s: %d rows imported from %s\n", lj_tunedb_path(db), rows, file);
    }
    lj_tunedb_close(db);
    lajit_ctx_destroy(ctx);
    return rc;
}

/* ---- gen: offline kernel sets ------------------------------------------------------------- */

/* Winners of a tuning database, kept to pick the bundle's configurations. */
typedef struct winner {
    int cc;
    char family[64], hash[17], bucket[256], config[256];
} winner;

typedef struct winners {
    winner *w;
    int n, cap;
} winners;

static void collect_winner(void *user, const lj_fingerprint *fp, const char *family,
                           const char *template_hash, const char *bucket, const char *config,
                           double ms, const char *default_config, double default_ms, int measured)
{
    winners *ws = user;
    (void)ms, (void)default_config, (void)default_ms, (void)measured;
    if (ws->n == ws->cap) {
        int cap = ws->cap ? 2 * ws->cap : 16;
        winner *w = realloc(ws->w, sizeof *w * (size_t)cap);
        if (!w)
            return;
        ws->w = w;
        ws->cap = cap;
    }
    winner *w = &ws->w[ws->n++];
    w->cc = fp->cc;
    snprintf(w->family, sizeof w->family, "%s", family);
    snprintf(w->hash, sizeof w->hash, "%s", template_hash);
    snprintf(w->bucket, sizeof w->bucket, "%s", bucket);
    snprintf(w->config, sizeof w->config, "%s", config);
}

typedef struct gen_item {
    char arch[16], bucket[256], config[256], what[256], entry[64];
    lj_problem problem;
    lj_config cfg;
    lj_kernel_job job;
    int have_job, ptx, tuned;
} gen_item;

static int cmd_gen(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        printf("usage: %s gen --arch LIST [--family NAMES] [--db tune.db] [-p KEY=VALUE ...] [-j N]\n"
               "       -o FILE\n\n"
               "Writes an offline kernel set (a bundle: one SQLite file) for the archs of LIST\n"
               "(default sm_80,sm_90a,sm_100a,sm_120): for each family of NAMES (comma-separated,\n"
               "default all) and each of its representative problems (or the one problem the -p\n"
               "assignments describe; a backward problem without part= gets all its passes), the\n"
               "configuration the tuning database --db holds for that bucket on a GPU of the\n"
               "arch's compute capability, else the family's default; its cubin, and PTX for the\n"
               "plain (not arch-specific) archs so newer GPUs can fall back on it. Every kernel is\n"
               "checksummed. A context opened with the bundle (lajit_ctx_desc.bundle or\n"
               "LAJIT_BUNDLE=FILE) launches its kernels without NVRTC. -j: compile threads.\n", prog);
        return 0;
    }
    char archbuf[256] = "sm_80,sm_90a,sm_100a,sm_120", fambuf[512] = "";
    const char *db_path = NULL, *out_path = NULL, *assign[64];
    int n_assign = 0, jobs = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--arch") == 0 && i + 1 < argc)
            snprintf(archbuf, sizeof archbuf, "%s", argv[++i]);
        else if (strcmp(argv[i], "--family") == 0 && i + 1 < argc)
            snprintf(fambuf, sizeof fambuf, "%s", argv[++i]);
        else if (strcmp(argv[i], "--db") == 0 && i + 1 < argc)
            db_path = argv[++i];
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc)
            out_path = argv[++i];
        else if (strcmp(argv[i], "-p") == 0 && i + 1 < argc && n_assign < 63)
            assign[n_assign++] = argv[++i];
        else if (strcmp(argv[i], "-j") == 0 && i + 1 < argc)
            jobs = atoi(argv[++i]);
        else
            return usage_error("gen: unexpected argument %s", argv[i]);
    }
    if (!out_path)
        return usage_error("gen: %s", "-o FILE is required");
    char *archs[16], *families[32];
    int n_archs = split_list(archbuf, archs, 16), n_families = 0;
    if (fambuf[0])
        n_families = split_list(fambuf, families, 32);
    else
        for (const char *const *f = lajit_family_names(); *f && n_families < 32; f++)
            families[n_families++] = (char *)*f;
    lajit_ctx *ctx = open_ctx(0, LAJIT_CTX_NO_DEVICE);
    if (!ctx)
        return 1;
    lj_env *env = lajit__ctx_env(ctx);
    lj_lua *L;
    lajit_status st = lajit__ctx_lua(ctx, &L);
    winners ws = {0};
    if (st == LAJIT_OK && db_path) {
        /* --db names a file; the database module opens tune.db in a directory. */
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", db_path);
        char *slash = strrchr(dir, '/');
        const char *base = slash ? slash + 1 : dir;
        if (strcmp(base, "tune.db") != 0) {
            fprintf(stderr, "%s: gen: --db must name a tune.db file\n", prog);
            lajit_ctx_destroy(ctx);
            return 2;
        }
        if (slash)
            *slash = 0;
        else
            snprintf(dir, sizeof dir, ".");
        lj_tunedb *db;
        if ((st = lj_tunedb_open(env, dir, &db)) == LAJIT_OK) {
            st = lj_tunedb_show(db, collect_winner, &ws);
            lj_tunedb_close(db);
        }
    }
    lj_bundle *bundle = NULL;
    if (st == LAJIT_OK)
        st = lj_bundle_create(env, out_path, &bundle);
    if (st != LAJIT_OK) {
        int rc = fail(ctx, st);
        free(ws.w);
        lajit_ctx_destroy(ctx);
        return rc;
    }
    int rc = 0, cubins = 0, ptxs = 0, tuned = 0;
    for (int fi = 0; fi < n_families && rc == 0; fi++) {
        lj_family *f;
        lj_problem *problems = NULL;
        int n_problems = 0;
        char hash[17];
        if ((st = lajit__ctx_family(ctx, families[fi], &f)) != LAJIT_OK ||
            (st = lj_family_problems(f, &problems, &n_problems)) != LAJIT_OK ||
            (st = lj_tune_template_hash(env, f, hash)) != LAJIT_OK) {
            rc = fail(ctx, st);
            lj_free(env, problems);
            break;
        }
        if (n_assign > 0 && n_problems > 1)
            n_problems = 1;
        /* Problems × archs × (cubin, PTX); a backward problem given with -p and no part gets its
         * passes 0..2 (and 3 with want_ds). */
        int cap = n_problems * n_archs * 2 * 4;
        gen_item *items = lj_calloc(env, (size_t)(cap ? cap : 1), sizeof *items);
        lj_compile_task *tasks = items ? lj_calloc(env, (size_t)(cap ? cap : 1), sizeof *tasks) : NULL;
        if (!tasks) {
            rc = fail(ctx, lj_oom(env));
            lj_free(env, items);
            lj_free(env, problems);
            break;
        }
        int part_given = 0;
        for (int i = 0; i < n_assign; i++)
            part_given |= strncmp(assign[i], "part=", 5) == 0;
        int n = 0;
        for (int a = 0; a < n_archs && rc == 0; a++) {
            lj_device_info dev;
            if (!lj_device_info_for_arch(archs[a], &dev)) {
                fprintf(stderr, "%s: unknown arch %s\n", prog, archs[a]);
                rc = 1;
                break;
            }
            int plain = archs[a][strlen(archs[a]) - 1] >= '0' && archs[a][strlen(archs[a]) - 1] <= '9';
            for (int pi = 0; pi < n_problems && rc == 0; pi++) {
                lj_problem base = problems[pi];
                lj_config cfg;
                if ((st = lj_assign_all(env, f, assign, (size_t)n_assign, &dev, &base, &cfg)) != LAJIT_OK) {
                    rc = fail(ctx, st);
                    break;
                }
                int parts = base.op == LJ_OP_BWD && n_assign > 0 && !part_given ? (base.want_ds ? 4 : 3) : 1;
                for (int part = 0; part < parts && rc == 0; part++) {
                    lj_problem p = base;
                    if (parts > 1)
                        p.part = part;
                    if (parts > 1 && (st = lj_family_default(f, &p, &dev, &cfg)) != LAJIT_OK) {
                        rc = fail(ctx, st);
                        break;
                    }
                    char bucket[256];
                    if ((st = lj_family_key(f, &p, bucket, sizeof bucket)) != LAJIT_OK) {
                        rc = fail(ctx, st);
                        break;
                    }
                    int from_db = 0;
                    for (int w = 0; w < ws.n && !from_db; w++) {
                        lj_config parsed;
                        if (ws.w[w].cc == dev.cc && strcmp(ws.w[w].family, families[fi]) == 0 &&
                            strcmp(ws.w[w].hash, hash) == 0 && strcmp(ws.w[w].bucket, bucket) == 0 &&
                            lj_config_parse(env, f, &cfg, ws.w[w].config, &parsed) == LAJIT_OK) {
                            cfg = parsed;
                            from_db = 1;
                        }
                    }
                    lj_clear_error(env);
                    int ok;
                    char reason[256];
                    if ((st = lj_family_valid(f, &cfg, &p, &dev, &ok, reason, sizeof reason)) != LAJIT_OK) {
                        rc = fail(ctx, st);
                        break;
                    }
                    char what[256];
                    lj_problem_format(&p, what, sizeof what);
                    if (!ok) {
                        printf("%-12s %-8s %-48s skipped: %s\n", families[fi], archs[a], what, reason);
                        continue;
                    }
                    lj_launch launch;
                    if ((st = lj_family_launch(f, &cfg, &p, &dev, &launch)) != LAJIT_OK) {
                        rc = fail(ctx, st);
                        break;
                    }
                    for (int ptx = 0; ptx <= plain; ptx++) {
                        gen_item *it = &items[n];
                        snprintf(it->arch, sizeof it->arch, "%s", archs[a]);
                        snprintf(it->bucket, sizeof it->bucket, "%s", bucket);
                        lj_config_format(&cfg, it->config, sizeof it->config);
                        snprintf(it->what, sizeof it->what, "%s", what);
                        snprintf(it->entry, sizeof it->entry, "%s", launch.entry);
                        it->problem = p;
                        it->cfg = cfg;
                        it->ptx = ptx;
                        it->tuned = from_db;
                        if ((st = lj_kernel_prepare(L, f, &cfg, &p, &dev, ptx, &it->job)) != LAJIT_OK) {
                            rc = fail(ctx, st);
                            break;
                        }
                        it->have_job = 1;
                        tasks[n].job = &it->job;
                        n++;
                    }
                }
            }
        }
        lj_kernel_compile_parallel(tasks, n, jobs);
        for (int i = 0; i < n; i++) {
            gen_item *it = &items[i];
            if (rc == 0 && tasks[i].status != LAJIT_OK) {
                fprintf(stderr, "%s: gen: %s %s [%s]: %s\n", prog, families[fi], it->arch, it->config,
                        tasks[i].error);
                rc = 1;
            } else if (rc == 0) {
                lj_bundle_item bi = {families[fi], it->arch, it->bucket, it->config, it->what,
                                     it->entry, it->job.source_key, it->ptx, tasks[i].compiled.image,
                                     tasks[i].compiled.image_size + (it->ptx ? 1 : 0)};
                if ((st = lj_bundle_add(bundle, &bi)) != LAJIT_OK)
                    rc = fail(ctx, st);
                else {
                    printf("%-12s %-8s %-48s %-36s %s %8zu%s\n", families[fi], it->arch, it->what,
                           it->config, it->ptx ? "ptx  " : "cubin", tasks[i].compiled.image_size,
                           it->tuned ? " (tuned)" : "");
                    *(it->ptx ? &ptxs : &cubins) += 1;
                    tuned += it->tuned && !it->ptx;
                }
            }
            lj_compile_task_free(&tasks[i]);
            if (it->have_job)
                lj_kernel_job_free(L, &it->job);
        }
        lj_free(env, tasks);
        lj_free(env, items);
        lj_free(env, problems);
    }
    free(ws.w);
    if (rc == 0) {
        if ((st = lj_bundle_finish(bundle)) != LAJIT_OK)
            rc = fail(ctx, st);
        else
            printf("wrote %s: %d cubins (%d from the tuning database), %d PTX\n", out_path, cubins,
                   tuned, ptxs);
    } else {
        lj_bundle_abort(bundle);
    }
    lajit_ctx_destroy(ctx);
    return rc;
}

/* ---- bench ---------------------------------------------------------------------------------- */

/* The benchmark is its own program (bench/lajit_bench.c: it times with the driver directly and
 * measures ceilings beside lajit); `lajit bench` finds it next to this binary (installed) or in
 * the build tree and runs it, its JSON rows going to stdout or to -o FILE. */
static int cmd_bench(int argc, char **argv)
{
    const char *out = NULL;
    char *args[64];
    int n = 0;
    args[n++] = "lajit_bench";
    for (int i = 0; i < argc && n < 62; i++) {
        if (strcmp(argv[i], "-o") == 0 && i + 1 < argc)
            out = argv[++i];
        else
            args[n++] = argv[i];
    }
    args[n] = NULL;
    char self[4096], path[4200];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    const char *found = NULL;
    if (len > 0) {
        self[len] = 0;
        char *slash = strrchr(self, '/');
        if (slash)
            *slash = 0;
        const char *rel[] = {"%s/lajit_bench", "%s/../bench/lajit_bench"};
        for (int i = 0; i < 2 && !found; i++) {
            snprintf(path, sizeof path, rel[i], self);
            if (access(path, X_OK) == 0)
                found = path;
        }
    }
    if (wants_help(argc, argv)) {
        printf("usage: %s bench [-o FILE] [--mode prefill|fwdbwd|decode|dispatch|jit|all] [ARGS]\n\n"
               "Runs the benchmark (lajit_bench, %s): one JSON row per measurement in the\n"
               "report format of DESIGN.md (fwd, fwdbwd with extra memory, decode with its\n"
               "in-place ceiling, dispatch, jit), to stdout or FILE. bench/report.py merges the\n"
               "rows with the peers' into docs/bench/<gpu>.json. The benchmark's own options:\n\n",
               prog, found ? found : "not found next to this program");
        fflush(stdout);
        if (!found)
            return 0;
        char *help[] = {"lajit_bench", "--help", NULL};
        execv(found, help);
        return 0;
    }
    if (!found) {
        fprintf(stderr, "%s: bench: lajit_bench is not installed next to %s\n", prog, self);
        return 1;
    }
    if (out && !freopen(out, "w", stdout)) {
        fprintf(stderr, "%s: bench: cannot write %s\n", prog, out);
        return 1;
    }
    execv(found, args);
    fprintf(stderr, "%s: bench: cannot run %s\n", prog, found);
    return 1;
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
    {"tune", cmd_tune, "tune families on this GPU and store the winners"},
    {"db", cmd_db, "show, export or import the tuning database"},
    {"gen", cmd_gen, "write an offline kernel set (bundle) for a list of archs"},
    {"bench", cmd_bench, "run the benchmark, writing the report's JSON rows"},
};

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        printf("usage: %s COMMAND [ARGS]   (%s COMMAND --help for each)\n\ncommands:\n", prog, prog);
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            printf("  %-9s %s\n", commands[i].name, commands[i].help);
        printf("\nenvironment: LAJIT_CACHE_DIR, LAJIT_TEMPLATE_DIR, LAJIT_CHECK=1, "
               "LAJIT_AUTOTUNE=off|eager, LAJIT_BUNDLE\n");
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0)
        return cmd_version(0, NULL);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].fn(argc - 2, argv + 2);
    return usage_error("unknown command %s", argv[1]);
}
