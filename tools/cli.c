/* cli.c — helpers shared by the `lajit` commands (cli.h): context, error reporting, checked
 * integers, the assignment list. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *const cli_prog = "lajit";

static void log_to_stderr(void *user, lajit_log_level level, const char *message)
{
    static const char *names[] = {"error", "warning", "info", "debug"};
    (void)user;
    fprintf(stderr, "lajit: %s: %s\n", names[level], message);
}

int cli_usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "%s: ", cli_prog);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see %s --help)\n", cli_prog);
    return 2;
}

lajit_ctx *cli_open_ctx(int verbose, uint32_t flags)
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
        /* No context to ask: the failed create leaves its message for the calling thread. */
        fprintf(stderr, "%s: cannot create a context: %s: %s\n", cli_prog, lajit_status_string(st),
                lajit_errmsg(NULL));
        return NULL;
    }
    return ctx;
}

int cli_fail(lajit_ctx *ctx, lajit_status st)
{
    fprintf(stderr, "%s: %s: %s\n", cli_prog, lajit_status_string(st), lajit_errmsg(ctx));
    return 1;
}

double cli_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int cli_parse_int(const char *cmd, const char *option, const char *text, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr,
                "%s: %s: %s wants an integer from %ld to %ld, not '%s' (see %s %s --help)\n",
                cli_prog, cmd, option, lo, hi, text, cli_prog, cmd);
        return 0;
    }
    *out = (int)v;
    return 1;
}

int cli_assigns_add(cli_assigns *a, const char *text)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 16;
        char **v = realloc(a->v, cap * sizeof *v);
        if (!v) {
            fprintf(stderr, "%s: out of memory\n", cli_prog);
            return 0;
        }
        a->v = v;
        a->cap = cap;
    }
    char *copy = strdup(text);
    if (!copy) {
        fprintf(stderr, "%s: out of memory\n", cli_prog);
        return 0;
    }
    a->v[a->n++] = copy;
    return 1;
}

void cli_assigns_free(cli_assigns *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->v[i]);
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

int cli_split_list(char *list, char ***out)
{
    int n = 0, cap = 0;
    char **v = NULL, *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            char **grown = realloc(v, (size_t)cap * sizeof *v);
            if (!grown) {
                free(v);
                fprintf(stderr, "%s: out of memory\n", cli_prog);
                return -1;
            }
            v = grown;
        }
        v[n++] = tok;
    }
    *out = v;
    return n;
}

int cli_option_error(const char *cmd, int c, char **argv)
{
    const char *arg = argv[optind - 1];
    char what[256], shortopt[3] = {'-', (char)optopt, 0};
    /* An unknown short option may sit inside a cluster ("-vx"): name the letter itself. */
    if (c == '?' && optopt)
        arg = shortopt;
    if (c == ':')
        snprintf(what, sizeof what, "%s: %s needs a value", cmd, arg);
    else
        snprintf(what, sizeof what, "%s: unexpected argument %s", cmd, arg);
    return cli_usage_error("%s", what);
}

int cli_no_arguments(const char *cmd, const char *help, int argc, char **argv)
{
    static const struct option longopts[] = {{"help", no_argument, NULL, 'h'}, {0}};
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        if (c != 'h')
            return cli_option_error(cmd, c, argv);
        printf("usage: %s %s\n\n%s", cli_prog, cmd, help);
        return 0;
    }
    if (optind < argc) {
        char what[256];
        snprintf(what, sizeof what, "%s: unexpected argument %s", cmd, argv[optind]);
        return cli_usage_error("%s", what);
    }
    return -1;
}
