/* cmd_tune.c — `lajit tune --family NAME ...`: tunes a family on this machine's GPU (device 0)
 * for the buckets the options describe (B, H and N take lists: every combination) and stores
 * each bucket's measurements and winner in the tuning database, with a lease per bucket so two
 * processes do not tune the same one. Optionally writes a JSON summary of default-vs-tuned. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "problem.h"
#include "search.h"

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

typedef struct tune_opts {
    const char *family, *json;
    cli_assigns assign; /* -p and the problem flags, in the order given */
    int Bs[MAX_LIST], Hs[MAX_LIST], Ns[MAX_LIST], nB, nH, nN;
    lj_search_opts search;
} tune_opts;

static int tune_usage(int rc)
{
    printf("usage: %s tune --family NAME [--dtype T] [--B LIST] [--H LIST] [--N LIST] [--D n]\n"
           "       [--E n] [--T n] [--decay] [--initial] [--final] [--vk] [--step-states]\n"
           "       [-p KEY=VALUE ...] [--runs N] [--warmup N] [-j N] [--json FILE]\n\n"
           "Tunes a family on this machine's GPU (device 0) and stores the winners in the\n"
           "tuning database (tune.db in the cache directory). The problem starts from the\n"
           "family's first representative problem; the flags (or -p with problem fields) set\n"
           "its fields (--D alone sets E = D too). B, H and N take comma-separated lists:\n"
           "every combination is tuned.\n"
           "Each valid configuration is compiled (-j threads, 1 to %d), then timed in a private\n"
           "CUDA context: --warmup launches (1 to 100000, default 3), then the median of --runs\n"
           "(5 to 100000, default 5), inputs rotated beyond the L2 size; a kernel under 50 us\n"
           "is timed again as CUDA graphs of back-to-back launches (about 250 us each), per\n"
           "launch. A faulting candidate is recorded as failed.\n"
           "A progress bar goes to stderr on a terminal. --json writes a summary: per bucket\n"
           "the default and the tuned configuration with their times.\n",
           cli_prog, CLI_MAX_JOBS);
    return rc;
}

/* Appends "key=value" (whole: lj_assign checks the value) to the assignments. */
static int add_field(cli_assigns *a, const char *key, const char *value)
{
    size_t cap = strlen(key) + strlen(value) + 2;
    char *text = malloc(cap);
    if (!text) {
        fprintf(stderr, "%s: out of memory\n", cli_prog);
        return 0;
    }
    snprintf(text, cap, "%s=%s", key, value);
    int ok = cli_assigns_add(a, text);
    free(text);
    return ok;
}

/* Fills o from the arguments; returns -1 to go on, else the exit status. */
static int tune_parse(int argc, char **argv, tune_opts *o)
{
    enum {
        O_FAMILY = 256,
        O_JSON,
        O_RUNS,
        O_WARMUP,
        O_B,
        O_H,
        O_N,
        O_D,
        O_E,
        O_T,
        O_DTYPE,
        O_DECAY,
        O_INITIAL,
        O_FINAL,
        O_VK,
        O_STEP_STATES
    };
    static const struct option longopts[] = {{"help", no_argument, NULL, 'h'},
                                             {"family", required_argument, NULL, O_FAMILY},
                                             {"json", required_argument, NULL, O_JSON},
                                             {"runs", required_argument, NULL, O_RUNS},
                                             {"warmup", required_argument, NULL, O_WARMUP},
                                             {"B", required_argument, NULL, O_B},
                                             {"H", required_argument, NULL, O_H},
                                             {"N", required_argument, NULL, O_N},
                                             {"D", required_argument, NULL, O_D},
                                             {"E", required_argument, NULL, O_E},
                                             {"T", required_argument, NULL, O_T},
                                             {"dtype", required_argument, NULL, O_DTYPE},
                                             {"decay", no_argument, NULL, O_DECAY},
                                             {"initial", no_argument, NULL, O_INITIAL},
                                             {"final", no_argument, NULL, O_FINAL},
                                             {"vk", no_argument, NULL, O_VK},
                                             {"step-states", no_argument, NULL, O_STEP_STATES},
                                             {0}};
    /* --D alone means D = E, as in the benchmarks (the representative problem may have another
     * E): whether --E is given anywhere decides, whatever the order. */
    int e_given = 0;
    for (int i = 1; i < argc; i++)
        e_given |= strcmp(argv[i], "--E") == 0 || strncmp(argv[i], "--E=", 4) == 0;
    int c, help = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hp:j:", longopts, NULL)) != -1) {
        const char *flag = NULL; /* a problem flag standing for an assignment */
        switch (c) {
            case 'h': help = 1; break;
            case O_FAMILY: o->family = optarg; break;
            case O_JSON: o->json = optarg; break;
            case 'p':
                if (!cli_assigns_add(&o->assign, optarg))
                    return 1;
                break;
            case O_RUNS:
                if (!cli_parse_int("tune", "--runs", optarg, 5, 100000, &o->search.runs))
                    return 2;
                break;
            case O_WARMUP:
                if (!cli_parse_int("tune", "--warmup", optarg, 1, 100000, &o->search.warmup))
                    return 2;
                break;
            case 'j':
                if (!cli_parse_int("tune", "-j", optarg, 1, CLI_MAX_JOBS, &o->search.threads))
                    return 2;
                break;
            case O_B:
                if (!(o->nB = int_list(optarg, o->Bs)))
                    return cli_usage_error("tune: bad --B list %s", optarg);
                break;
            case O_H:
                if (!(o->nH = int_list(optarg, o->Hs)))
                    return cli_usage_error("tune: bad --H list %s", optarg);
                break;
            case O_N:
                if (!(o->nN = int_list(optarg, o->Ns)))
                    return cli_usage_error("tune: bad --N list %s", optarg);
                break;
            case O_D:
            case O_E:
            case O_T:
            case O_DTYPE: {
                const char *key = c == O_D ? "D" : c == O_E ? "E" : c == O_T ? "T" : "dtype";
                if (!add_field(&o->assign, key, optarg) ||
                    (c == O_D && !e_given && !add_field(&o->assign, "E", optarg)))
                    return 1;
                break;
            }
            case O_DECAY: flag = "decay=1"; break;
            case O_INITIAL: flag = "has_initial=1"; break;
            case O_FINAL: flag = "has_final=1"; break;
            case O_VK: flag = "vk=1"; break;
            case O_STEP_STATES: flag = "step_states=1"; break;
            default: return cli_option_error("tune", c, argv);
        }
        if (flag && !cli_assigns_add(&o->assign, flag))
            return 1;
    }
    if (help || argc < 2)
        return tune_usage(help ? 0 : 2);
    if (optind < argc)
        return cli_usage_error("tune: unexpected argument %s", argv[optind]);
    if (!o->family)
        return cli_usage_error("tune: %s", "--family is required");
    return -1;
}

static int tune_run(tune_opts *o)
{
    const char *family = o->family, *json = o->json;
    int *Bs = o->Bs, *Hs = o->Hs, *Ns = o->Ns, nB = o->nB, nH = o->nH, nN = o->nN;
    lj_search_opts opts = o->search;
    lajit_ctx *ctx = cli_open_ctx(0, 0);
    if (!ctx)
        return 1;
    lj_env *env = lajit__ctx_env(ctx);
    lj_family *f;
    lj_lua *L;
    lj_cache *cache;
    lj_device *dev;
    lajit_status st;
    if ((st = lajit__ctx_family(ctx, family, &f)) != LAJIT_OK ||
        (st = lajit__ctx_lua(ctx, &L)) != LAJIT_OK ||
        (st = lajit__ctx_cache(ctx, &cache)) != LAJIT_OK ||
        (st = lajit__ctx_device(ctx, &dev)) != LAJIT_OK) {
        int rc = cli_fail(ctx, st);
        lajit_ctx_destroy(ctx);
        return rc;
    }
    lj_problem *problems;
    int n_problems;
    if ((st = lj_family_problems(f, &problems, &n_problems)) != LAJIT_OK || n_problems == 0) {
        int rc = st != LAJIT_OK ? cli_fail(ctx, st) : 1;
        if (st == LAJIT_OK) {
            fprintf(stderr, "%s: %s lists no representative problem\n", cli_prog, family);
            lj_free(env, problems);
        }
        lajit_ctx_destroy(ctx);
        return rc;
    }
    lj_problem base = problems[0];
    lj_free(env, problems);
    lj_config unused;
    memset(&unused, 0, sizeof unused);
    if ((st = lj_assign_all(env, f, (const char *const *)o->assign.v, o->assign.n, &dev->info,
                            &base, &unused)) != LAJIT_OK) {
        int rc = cli_fail(ctx, st);
        lajit_ctx_destroy(ctx);
        return rc;
    }
    lj_tunedb *db = NULL;
    if (!ctx->cache_dir || lj_tunedb_open(env, ctx->cache_dir, &db) != LAJIT_OK)
        fprintf(stderr, "%s: warning: results will not be stored: %s\n", cli_prog,
                ctx->cache_dir ? lajit_errmsg(ctx) : "no cache directory");
    /* A custom family's B, H and N are its shape symbols of those names, when it has them. */
    const lj_args_decl *decl = lj_family_args(f);
    int symB = decl ? lj_args_symbol(decl, "B") : -1, symH = decl ? lj_args_symbol(decl, "H") : -1,
        symN = decl ? lj_args_symbol(decl, "N") : -1;
    if (decl && ((nB && symB < 0) || (nH && symH < 0) || (nN && symN < 0))) {
        fprintf(stderr, "%s: %s has no symbol %s: set its problem with -p SYMBOL=VALUE\n", cli_prog,
                family,
                nB && symB < 0   ? "B"
                : nH && symH < 0 ? "H"
                                 : "N");
        lj_tunedb_close(db);
        lajit_ctx_destroy(ctx);
        return 2;
    }
    if (!nB)
        Bs[nB++] = symB >= 0 ? (int)base.sym[symB] : base.B;
    if (!nH)
        Hs[nH++] = symH >= 0 ? (int)base.sym[symH] : base.H;
    if (!nN)
        Ns[nN++] = symN >= 0 ? (int)base.sym[symN] : base.N;
    FILE *out = NULL;
    if (json && !(out = fopen(json, "w"))) {
        fprintf(stderr, "%s: cannot write %s\n", cli_prog, json);
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
    printf("%-10s %-44s %-34s %10s %-34s %10s %7s\n", "family", "problem", "default", "ms", "tuned",
           "ms", "speedup");
    for (int bi = 0; bi < nB; bi++) {
        for (int hi = 0; hi < nH; hi++) {
            for (int ni = 0; ni < nN; ni++) {
                lj_problem p = base;
                if (decl) {
                    if (symB >= 0)
                        p.sym[symB] = Bs[bi];
                    if (symH >= 0)
                        p.sym[symH] = Hs[hi];
                    if (symN >= 0)
                        p.sym[symN] = Ns[ni];
                } else {
                    p.B = Bs[bi];
                    p.H = Hs[hi];
                    p.N = Ns[ni];
                }
                if (p.op == LJ_OP_DECODE)
                    p.N = p.T > 0 ? p.T : 1;
                char what[256];
                lj_problem_format(&p, what, sizeof what);
                lj_tune_id id;
                int got = 1;
                if ((st = lj_tune_id_make(env, f, dev, &p, &id)) != LAJIT_OK) {
                    rc = cli_fail(ctx, st);
                    continue;
                }
                if (db && lj_tunedb_lease(db, &id, 1800, &got) == LAJIT_OK && !got) {
                    fprintf(stderr, "%s: %s %s is being tuned by another process; skipped\n",
                            cli_prog, family, what);
                    rc = 1;
                    continue;
                }
                double t0 = cli_now_s();
                lj_search_out res;
                st = lj_search_run(env, L, f, cache, dev, &p, &opts, &res);
                double seconds = cli_now_s() - t0;
                if (prog_state.tty)
                    fprintf(stderr, "\r%100s\r", "");
                if (st != LAJIT_OK) {
                    if (db)
                        lj_tunedb_release(db, &id);
                    rc = cli_fail(ctx, st);
                    continue;
                }
                char dtext[256], btext[256] = "-";
                lj_config_format(&res.dflt, dtext, sizeof dtext);
                if (res.have_best)
                    lj_config_format(&res.best, btext, sizeof btext);
                if (db) {
                    if (lj_tunedb_record(db, &id, res.results, res.n_results, dtext,
                                         res.default_ms) != LAJIT_OK)
                        rc = cli_fail(ctx, LAJIT_ERR_DATABASE);
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
                    fprintf(stderr, "%s: no candidate of %s ran for %s\n", cli_prog, family, what);
                    rc = 1;
                }
                if (out) {
                    fprintf(out, "%s\n{\"family\":", rows++ ? "," : "");
                    json_string(out, family);
                    fputs(",\"bucket\":", out);
                    json_string(out, id.bucket);
                    fputs(",\"problem\":", out);
                    json_string(out, what);
                    fprintf(out,
                            ",\"B\":%d,\"H\":%d,\"N\":%d,\"D\":%d,\"E\":%d,\"default_config\":",
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
            fprintf(stderr, "%s: cannot write %s\n", cli_prog, json);
            rc = 1;
        }
    }
    lj_tunedb_close(db);
    lajit_ctx_destroy(ctx);
    return rc;
}

int cmd_tune(int argc, char **argv)
{
    tune_opts o;
    memset(&o, 0, sizeof o);
    int rc = tune_parse(argc, argv, &o);
    if (rc < 0)
        rc = tune_run(&o);
    cli_assigns_free(&o.assign);
    return rc;
}
