/* cmd_compile.c — `lajit compile FAMILY|all`: compiles a family's kernels for a list of archs
 * without a GPU, for each representative problem (or the one the -p assignments describe), with
 * the default configuration or every configuration of the space (--all-configs), and prints the
 * compiler's resource report (cubin size, registers, spills, shared memory) and where each cubin
 * came from (nvrtc or the kernel cache). Misses are compiled on worker threads (-j) and stored
 * in the cache from the main thread.
 *
 * Layout: compile_opts holds what the options asked; compile_parse fills it; compile_family does
 * one family (plan, compile, store, print). A new option is a field, a case in compile_parse and
 * its use in compile_family. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kernel.h"
#include "problem.h"
#include "resources.h"

typedef struct compile_opts {
    char **families; /* the FAMILY argument, or every built-in family for "all" */
    int n_families;
    char *archtext; /* a copy of --arch LIST, split in place into archs */
    char **archs;
    int n_archs;
    int all_configs;    /* --all-configs */
    int jobs;           /* -j: compile threads (0: the compiler's default) */
    cli_assigns assign; /* -p KEY=VALUE */
} compile_opts;

typedef struct compile_item {
    char arch[16];
    lj_problem problem;
    lj_config config;
    int valid;
    char reason[256];
    unsigned smem_dynamic;
    lj_kernel_job job;
    int have_job;
    int cached;           /* served by the cache */
    lj_cache_entry entry; /* report (from the cache or the compile) */
    lajit_status status;
    char error[1024];
} compile_item;

static void compile_opts_free(compile_opts *o)
{
    free(o->families);
    free(o->archs);
    free(o->archtext);
    cli_assigns_free(&o->assign);
}

static int compile_usage(int rc)
{
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
           "-j: compile threads, 1 to %d (default: the compiler's, at most 16 run).\n",
           cli_prog, CLI_MAX_JOBS);
    return rc;
}

/* Fills o from the arguments; returns -1 to go on, else the exit status. */
static int compile_parse(int argc, char **argv, compile_opts *o)
{
    static const struct option longopts[] = {{"help", no_argument, NULL, 'h'},
                                             {"arch", required_argument, NULL, 'a'},
                                             {"all-configs", no_argument, NULL, 'A'},
                                             {0}};
    const char *archlist = "sm_80,sm_90a,sm_100a,sm_120";
    int c, help = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hp:j:", longopts, NULL)) != -1) {
        switch (c) {
            case 'h': help = 1; break;
            case 'a': archlist = optarg; break;
            case 'A': o->all_configs = 1; break;
            case 'p':
                if (!cli_assigns_add(&o->assign, optarg))
                    return 1;
                break;
            case 'j':
                if (!cli_parse_int("compile", "-j", optarg, 1, CLI_MAX_JOBS, &o->jobs))
                    return 2;
                break;
            default: return cli_option_error("compile", c, argv);
        }
    }
    if (help || optind >= argc)
        return compile_usage(help ? 0 : 2);
    if (optind + 1 < argc)
        return cli_usage_error("compile: unexpected argument %s", argv[optind + 1]);
    if (!(o->archtext = strdup(archlist))) {
        fprintf(stderr, "%s: out of memory\n", cli_prog);
        return 1;
    }
    if ((o->n_archs = cli_split_list(o->archtext, &o->archs)) < 0)
        return 1;
    if (o->n_archs == 0)
        return cli_usage_error("compile: %s", "--arch names no arch");
    const char *const *names = lajit_family_names();
    int n = 0;
    if (strcmp(argv[optind], "all") == 0)
        while (names[n])
            n++;
    else
        n = 1;
    if (!(o->families = calloc((size_t)n, sizeof *o->families))) {
        fprintf(stderr, "%s: out of memory\n", cli_prog);
        return 1;
    }
    for (int i = 0; i < n; i++)
        o->families[i] = strcmp(argv[optind], "all") == 0 ? (char *)names[i] : argv[optind];
    o->n_families = n;
    return -1;
}

/* Whether cfg has the value every parameter assignment among assign ("TILE_V=32") gave `asked`,
 * the configuration lj_assign_all built from them. */
static int config_matches(const char *const *assign, size_t n, const lj_config *cfg,
                          const lj_config *asked)
{
    for (size_t i = 0; i < n; i++) {
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

/* Plans, compiles, stores and prints one family; returns 0 or 1. */
static int compile_family(lajit_ctx *ctx, lj_lua *L, lj_cache *cache, const compile_opts *o,
                          const char *family)
{
    lj_env *env = lajit__ctx_env(ctx);
    const char *const *assign = (const char *const *)o->assign.v;
    size_t n_assign = o->assign.n;
    lajit_status st;
    lj_family *f;
    if ((st = lajit__ctx_family(ctx, family, &f)) != LAJIT_OK)
        return cli_fail(ctx, st);
    lj_problem *problems = NULL;
    int n_problems = 0;
    if ((st = lj_family_problems(f, &problems, &n_problems)) != LAJIT_OK)
        return cli_fail(ctx, st);
    if (n_assign > 0 && n_problems > 1)
        n_problems = 1; /* -p describes one problem, starting from the first */
    lj_config *configs = NULL;
    int n_configs = 0;
    if (o->all_configs && (st = lj_family_all_configs(f, &configs, &n_configs)) != LAJIT_OK) {
        lj_free(env, problems);
        return cli_fail(ctx, st);
    }
    int per = o->all_configs ? n_configs : 1;
    int total = o->n_archs * n_problems * per;
    compile_item *items = lj_calloc(env, (size_t)(total ? total : 1), sizeof *items);
    if (!items) {
        lj_free(env, problems);
        lj_free(env, configs);
        return cli_fail(ctx, lj_oom(env));
    }
    int rc = 0, n = 0;
    for (int a = 0; a < o->n_archs; a++) {
        lj_device_info dev;
        if (!lj_device_info_for_arch(o->archs[a], &dev)) {
            fprintf(stderr, "%s: unknown arch %s\n", cli_prog, o->archs[a]);
            rc = 1;
            continue;
        }
        for (int pi = 0; pi < n_problems; pi++) {
            for (int c = 0; c < per; c++) {
                compile_item *it = &items[n++];
                snprintf(it->arch, sizeof it->arch, "%s", o->archs[a]);
                it->problem = problems[pi];
                st = LAJIT_OK;
                if (o->all_configs) {
                    /* The -p problem, and only the configurations with its parameters. */
                    lj_config asked;
                    st = lj_assign_all(env, f, assign, n_assign, &dev, &it->problem, &asked);
                    if (st == LAJIT_OK && !config_matches(assign, n_assign, &configs[c], &asked)) {
                        memset(it, 0, sizeof *it);
                        n--;
                        continue;
                    }
                    it->config = configs[c];
                } else {
                    st = lj_assign_all(env, f, assign, n_assign, &dev, &it->problem, &it->config);
                }
                if (st == LAJIT_OK)
                    st = lj_family_valid(f, &it->config, &it->problem, &dev, &it->valid, it->reason,
                                         sizeof it->reason);
                lj_launch launch;
                if (st == LAJIT_OK && it->valid &&
                    (st = lj_family_launch(f, &it->config, &it->problem, &dev, &launch)) ==
                        LAJIT_OK)
                    it->smem_dynamic = launch.smem;
                if (st == LAJIT_OK && it->valid &&
                    (st = lj_kernel_prepare(L, f, &it->config, &it->problem, &dev, 0, &it->job)) ==
                        LAJIT_OK) {
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
        rc = cli_fail(ctx, lj_oom(env));
        for (int i = 0; i < n; i++)
            if (items[i].have_job)
                lj_kernel_job_free(L, &items[i].job);
        n = 0;
    }
    for (int i = 0; i < n; i++)
        tasks[i].job = items[i].have_job && !items[i].cached && items[i].status == LAJIT_OK
                           ? &items[i].job
                           : NULL;
    lj_kernel_compile_parallel(env, tasks, n, o->jobs);
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
        lj_compile_task_free(env, &tasks[i]);
        if (it->status != LAJIT_OK) {
            printf("%-13s %-8s %-44s %-36s FAILED: %s\n", family, it->arch, what, cfg, it->error);
            rc = 1;
        } else if (!it->valid) {
            printf("%-13s %-8s %-44s %-36s rejected: %s\n", family, it->arch, what, cfg,
                   it->reason);
        } else {
            char spills[32];
            snprintf(spills, sizeof spills, "%d/%d", it->entry.spill_stores, it->entry.spill_loads);
            printf("%-13s %-8s %-44s %-36s %-7s %8zu %5d %7s %8u %.2f\n", family, it->arch, what,
                   cfg, it->cached ? "cache" : "nvrtc", it->entry.size, it->entry.regs, spills,
                   (unsigned)it->entry.smem_static + it->smem_dynamic, tasks[i].seconds);
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
                printf("%-13s %-8s %-44s %-36s OVER CLAIM: %s\n", family, it->arch, what, cfg, why);
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
    return rc;
}

int cmd_compile(int argc, char **argv)
{
    compile_opts o;
    memset(&o, 0, sizeof o);
    int rc = compile_parse(argc, argv, &o);
    if (rc >= 0) {
        compile_opts_free(&o);
        return rc;
    }
    lajit_ctx *ctx = cli_open_ctx(0, LAJIT_CTX_NO_DEVICE);
    if (!ctx) {
        compile_opts_free(&o);
        return 1;
    }
    lj_lua *L;
    lj_cache *cache;
    lajit_status st;
    rc = 0;
    if ((st = lajit__ctx_lua(ctx, &L)) != LAJIT_OK ||
        (st = lajit__ctx_cache(ctx, &cache)) != LAJIT_OK) {
        rc = cli_fail(ctx, st);
    } else {
        printf("%-13s %-8s %-44s %-36s %-7s %8s %5s %7s %8s %s\n", "family", "arch", "problem",
               "config", "source", "bytes", "regs", "spills", "smem", "seconds");
        for (int fi = 0; fi < o.n_families; fi++)
            rc |= compile_family(ctx, L, cache, &o, o.families[fi]);
    }
    lajit_ctx_destroy(ctx);
    compile_opts_free(&o);
    return rc;
}
