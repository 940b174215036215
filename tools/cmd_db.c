/* cmd_db.c — `lajit db show | export FILE [--shipped [--device NAME]] | import FILE [--force]`:
 * the tuning database (tune.db in the cache directory). show and export only read: when there is
 * no database they say so and create nothing (no directory, no empty database); import writes, so
 * it creates the database when absent. export --shipped writes a shipped tuning table
 * (autotune/tuned.h): one device's winners, for this build's templates only. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "nvrtc.h"
#include "tuned.h"

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

/* Whether dir/tune.db exists: 1 yes, 0 no (said on stdout when quiet_when_absent, else on
 * stderr), -1 when that cannot be told (out of memory, stat failing for another reason than a
 * missing file), said on stderr: an error, never taken for "no database". */
static int database_exists(const char *dir, int quiet_when_absent)
{
    size_t cap = strlen(dir) + sizeof "/tune.db";
    char *path = malloc(cap);
    if (!path) {
        fprintf(stderr, "%s: out of memory\n", cli_prog);
        return -1;
    }
    snprintf(path, cap, "%s/tune.db", dir);
    struct stat sb;
    int rc = 1;
    if (stat(path, &sb) != 0) {
        rc = errno == ENOENT ? 0 : -1;
        if (rc == 0 && quiet_when_absent)
            printf("%s: no tuning database, 0 winners\n", path);
        else
            fprintf(stderr, "%s: %s: %s\n", cli_prog, path, strerror(errno));
    }
    free(path);
    return rc;
}

/* The filter of a shipped export: a winner is kept only when its family is one this build (or
 * LAJIT_FAMILY_PATH) has and its template hash is that family's now; the runtime would ignore
 * the others as stale. Hashes are computed once per family. */
typedef struct shipped_filter {
    lajit_ctx *ctx;
    struct {
        char family[64];
        char hash[17];
    } known[64];
    int n_known, dropped;
} shipped_filter;

static int keep_current(void *user, const char *family, const char *template_hash)
{
    shipped_filter *sf = user;
    for (int i = 0; i < sf->n_known; i++)
        if (strcmp(sf->known[i].family, family) == 0) {
            int keep = strcmp(sf->known[i].hash, template_hash) == 0;
            sf->dropped += !keep;
            return keep;
        }
    lj_env *env = lajit__ctx_env(sf->ctx);
    lj_family *f;
    char hash[17] = "";
    if (lajit__ctx_family(sf->ctx, family, &f) != LAJIT_OK ||
        lj_tune_template_hash(env, f, hash) != LAJIT_OK)
        hash[0] = 0; /* a family this build does not have: nothing of it is current */
    lj_clear_error(env);
    if (sf->n_known < (int)(sizeof sf->known / sizeof sf->known[0])) {
        snprintf(sf->known[sf->n_known].family, sizeof sf->known[0].family, "%s", family);
        snprintf(sf->known[sf->n_known].hash, sizeof sf->known[0].hash, "%s", hash);
        sf->n_known++;
    }
    int keep = *hash && strcmp(hash, template_hash) == 0;
    sf->dropped += !keep;
    return keep;
}

/* A shipped winner must have beaten the default by this much (percent) in the tuner's own
 * measurement, or the table says "the default" for its bucket: an H200's tables held winners
 * 0.1-1.3 % ahead of the default that ran 3-5 % behind it in lajit_bench (docs/notes/autotune.md,
 * session 15): below a few percent the ranking is the tuner's noise. */
#define SHIPPED_MIN_GAIN_PCT 3.0

/* `db export FILE --shipped`: the winners of device (this machine's GPU when NULL). */
static int export_shipped(lajit_ctx *ctx, lj_tunedb *db, const char *file, const char *device,
                          double min_gain)
{
    lj_env *env = lajit__ctx_env(ctx);
    lj_device *dev;
    if (!device) {
        lajit_status st = lajit__ctx_device(ctx, &dev);
        if (st != LAJIT_OK) {
            fprintf(stderr,
                    "%s: db export --shipped: no GPU here (%s); name the device with "
                    "--device\n",
                    cli_prog, lajit_errmsg(ctx));
            return 1;
        }
        device = dev->info.name;
    }
    lj_clear_error(env);
    /* FILE may be the tables folder: the device's file is then <FILE>/<slug>.json. */
    char slug[128], joined[4096];
    lj_tuned_slug(device, slug, sizeof slug);
    struct stat sb;
    size_t len = strlen(file);
    if ((len && file[len - 1] == '/') || (stat(file, &sb) == 0 && S_ISDIR(sb.st_mode))) {
        if (!*slug) {
            fprintf(stderr, "%s: db export --shipped: device name '%s' gives no file name\n",
                    cli_prog, device);
            return 1;
        }
        snprintf(joined, sizeof joined, "%s%s%s.json", file, len && file[len - 1] == '/' ? "" : "/",
                 slug);
        file = joined;
    }
    static shipped_filter sf; /* large: not on the stack */
    memset(&sf, 0, sizeof sf);
    sf.ctx = ctx;
    int rows = 0;
    lajit_status st =
        lj_tunedb_export_shipped(db, file, device, min_gain, keep_current, &sf, &rows);
    if (st != LAJIT_OK)
        return cli_fail(ctx, st);
    printf("%s: %d winners of %s written to %s", lj_tunedb_path(db), rows, device, file);
    if (sf.dropped)
        printf(" (%d left out: tuned on templates this build no longer has)", sf.dropped);
    printf("\nthe runtime reads it as tuned/%s.json (installed: <datadir>/lajit/tuned/%s.json)\n",
           slug, slug);
    return 0;
}

int cmd_db(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},           {"force", no_argument, NULL, 'f'},
        {"shipped", no_argument, NULL, 's'},        {"device", required_argument, NULL, 'd'},
        {"min-gain", required_argument, NULL, 'g'}, {0}};
    int c, help = 0, force = 0, shipped = 0, exists = 1;
    const char *device = NULL, *gain_text = NULL;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        if (c == 'h')
            help = 1;
        else if (c == 'f')
            force = 1;
        else if (c == 's')
            shipped = 1;
        else if (c == 'd')
            device = optarg;
        else if (c == 'g')
            gain_text = optarg;
        else
            return cli_option_error("db", c, argv);
    }
    if (help || optind >= argc) {
        printf("usage: %s db show | export FILE [--shipped [--device NAME] [--min-gain PCT]] | "
               "import FILE [--force]\n\n"
               "The tuning database (tune.db in the cache directory).\n"
               "show: every winner with its device, bucket, time and the default's time.\n"
               "export: every measurement and winner as JSON lines into FILE, to share with\n"
               "machines of the same GPU. export --shipped: a shipped tuning table, the winners\n"
               "of one GPU (this machine's, or --device NAME as the driver names it) for this\n"
               "build's templates, to commit as tuned/<slug>.json (README: shipped tables);\n"
               "FILE may be that folder (tuned/): the file is then named after the device.\n"
               "A winner measured less than PCT %% faster than the default (--min-gain, 0 to\n"
               "100, default %g) is written as the default: a near tie is not shipped.\n"
               "import: adds FILE's rows (replacing equal ones);\n"
               "rows for another device name or compute capability than this machine's GPU are\n"
               "refused unless --force (also needed when this machine has no GPU).\n"
               "show and export never create the database or its directory.\n",
               cli_prog, SHIPPED_MIN_GAIN_PCT);
        return help ? 0 : 2;
    }
    const char *action = argv[optind], *file = optind + 1 < argc ? argv[optind + 1] : NULL;
    if (optind + 2 < argc)
        return cli_usage_error("db: unexpected argument %s", argv[optind + 2]);
    int is_show = strcmp(action, "show") == 0, is_export = strcmp(action, "export") == 0,
        is_import = strcmp(action, "import") == 0;
    if (!is_show && !is_export && !is_import)
        return cli_usage_error("db: unknown action %s", action);
    if (is_show && file)
        return cli_usage_error("db: unexpected argument %s", file);
    if (!is_show && !file)
        return cli_usage_error("db %s: FILE is required", action);
    if ((shipped || device) && !is_export)
        return cli_usage_error("db %s: --shipped and --device are for export", action);
    if (device && !shipped)
        return cli_usage_error("db export: --device %s needs --shipped", device);
    if (gain_text && !shipped)
        return cli_usage_error("db export: --min-gain %s needs --shipped", gain_text);
    double gain_pct = SHIPPED_MIN_GAIN_PCT;
    if (gain_text) {
        char *end;
        errno = 0;
        gain_pct = strtod(gain_text, &end);
        if (errno || end == gain_text || *end || !(gain_pct >= 0 && gain_pct <= 100))
            return cli_usage_error("db export: --min-gain %s: a percentage from 0 to 100",
                                   gain_text);
    }
    lajit_ctx *ctx = cli_open_ctx(0, 0);
    if (!ctx)
        return 1;
    lj_env *env = lajit__ctx_env(ctx);
    lj_tunedb *db = NULL;
    int rc = 0, rows = 0;
    lajit_status st;
    if (!ctx->cache_dir) {
        fprintf(stderr, "%s: no cache directory\n", cli_prog);
        rc = 1;
    } else if (!is_import && (exists = database_exists(ctx->cache_dir, is_show)) <= 0) {
        rc = exists == 0 && is_show ? 0 : 1;
    } else if ((st = lj_tunedb_open(env, ctx->cache_dir, &db)) != LAJIT_OK) {
        rc = cli_fail(ctx, st);
    } else if (is_show) {
        if ((st = lj_tunedb_show(db, show_row, &rows)) != LAJIT_OK)
            rc = cli_fail(ctx, st);
        else
            printf("%s: %d winners\n", lj_tunedb_path(db), rows);
    } else if (is_export && shipped) {
        rc = export_shipped(ctx, db, file, device, gain_pct / 100.0);
    } else if (is_export) {
        if ((st = lj_tunedb_export(db, file, &rows)) != LAJIT_OK)
            rc = cli_fail(ctx, st);
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
            rc = cli_fail(ctx, st);
        else
            printf("%s: %d rows imported from %s\n", lj_tunedb_path(db), rows, file);
    }
    lj_tunedb_close(db);
    lajit_ctx_destroy(ctx);
    return rc;
}
