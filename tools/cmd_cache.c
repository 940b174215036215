/* cmd_cache.c — `lajit cache list|verify|clear`: the kernel cache directory's entries, a check
 * of every entry's header and checksum, or their removal. list and verify only read: they never
 * create the directory. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

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

int cmd_cache(int argc, char **argv)
{
    static const struct option longopts[] = {{"help", no_argument, NULL, 'h'}, {0}};
    int c, help = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        if (c != 'h')
            return cli_option_error("cache", c, argv);
        help = 1;
    }
    if (help || optind >= argc) {
        printf(
            "usage: %s cache list|verify|clear\n\n"
            "list: the entries of the kernel cache directory; verify: check every entry's\n"
            "header and checksum (exit 1 if any is bad); clear: remove every entry.\n"
            "The directory is $LAJIT_CACHE_DIR, else $XDG_CACHE_HOME/lajit, else ~/.cache/lajit.\n",
            cli_prog);
        return help ? 0 : 2;
    }
    const char *action = argv[optind];
    if (strcmp(action, "list") != 0 && strcmp(action, "verify") != 0 &&
        strcmp(action, "clear") != 0)
        return cli_usage_error("cache: unknown action %s", action);
    if (optind + 1 < argc)
        return cli_usage_error("cache: unexpected argument %s", argv[optind + 1]);
    lajit_ctx *ctx = cli_open_ctx(0, LAJIT_CTX_NO_DEVICE);
    if (!ctx)
        return 1;
    lj_env *env = lajit__ctx_env(ctx);
    int rc = 0;
    if (!ctx->cache_dir) {
        fprintf(stderr, "%s: no cache directory\n", cli_prog);
        rc = 1;
    } else if (strcmp(action, "clear") != 0) {
        int verify = strcmp(action, "verify") == 0;
        scan_state s = {0, 0, 0, !verify};
        lajit_status st = lj_cache_scan(env, ctx->cache_dir, verify, scan_visit, &s);
        if (st != LAJIT_OK)
            rc = cli_fail(ctx, st);
        else
            printf("%s: %d entries, %zu bytes%s\n", ctx->cache_dir, s.entries, s.bytes,
                   verify ? (s.bad ? ", some BAD" : ", all good") : "");
        if (s.bad)
            rc = 1;
    } else {
        int removed = 0;
        lajit_status st = lj_cache_clear(env, ctx->cache_dir, &removed);
        if (st != LAJIT_OK)
            rc = cli_fail(ctx, st);
        else
            printf("%s: removed %d entries\n", ctx->cache_dir, removed);
    }
    lajit_ctx_destroy(ctx);
    return rc;
}
