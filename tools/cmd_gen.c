/* cmd_gen.c — `lajit gen`: writes an offline kernel set (a bundle) for a list of archs. Which
 * kernels go in (tuned winners else defaults, per arch, problem and backward pass) is the
 * library's policy (autotune/gen.h); this file parses the options and prints what it reports. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gen.h"

static int gen_usage(int rc)
{
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
           "LAJIT_BUNDLE=FILE) launches its kernels without NVRTC. --db must name an existing\n"
           "tune.db file (it is only read). -j: compile threads, 1 to %d.\n",
           cli_prog, CLI_MAX_JOBS);
    return rc;
}

static void print_event(void *user, const lj_gen_event *ev)
{
    (void)user;
    if (ev->skipped)
        printf("%-12s %-8s %-48s skipped: %s\n", ev->family, ev->arch, ev->problem, ev->skipped);
    else
        printf("%-12s %-8s %-48s %-36s %s %8zu%s\n", ev->family, ev->arch, ev->problem, ev->config,
               ev->ptx ? "ptx  " : "cubin", ev->size, ev->tuned ? " (tuned)" : "");
}

static lajit_status load_family(void *user, const char *name, lj_family **out)
{
    return lajit__ctx_family(user, name, out);
}

int cmd_gen(int argc, char **argv)
{
    static const struct option longopts[] = {{"help", no_argument, NULL, 'h'},
                                             {"arch", required_argument, NULL, 'a'},
                                             {"family", required_argument, NULL, 'F'},
                                             {"db", required_argument, NULL, 'd'},
                                             {0}};
    const char *archlist = "sm_80,sm_90a,sm_100a,sm_120", *famlist = NULL;
    char *archbuf = NULL, *fambuf = NULL; /* copies, split in place */
    char **archs = NULL, **families = NULL;
    cli_assigns assign = {0};
    lj_gen_opts o;
    memset(&o, 0, sizeof o);
    const char *out_path = NULL;
    int c, rc = -1;
    opterr = 0;
    while (rc < 0 && (c = getopt_long(argc, argv, ":hp:j:o:", longopts, NULL)) != -1) {
        switch (c) {
            case 'h': rc = gen_usage(0); break;
            case 'a': archlist = optarg; break;
            case 'F': famlist = optarg; break;
            case 'd': o.db_path = optarg; break;
            case 'o': out_path = optarg; break;
            case 'p':
                if (!cli_assigns_add(&assign, optarg))
                    rc = 1;
                break;
            case 'j':
                if (!cli_parse_int("gen", "-j", optarg, 1, CLI_MAX_JOBS, &o.jobs))
                    rc = 2;
                break;
            default: rc = cli_option_error("gen", c, argv);
        }
    }
    if (rc < 0 && optind < argc)
        rc = cli_usage_error("gen: unexpected argument %s", argv[optind]);
    if (rc < 0 && !out_path)
        rc = cli_usage_error("gen: %s", "-o FILE is required");
    /* --db names a tune.db file (the database module opens tune.db in a directory). */
    if (rc < 0 && o.db_path) {
        const char *slash = strrchr(o.db_path, '/');
        if (strcmp(slash ? slash + 1 : o.db_path, "tune.db") != 0) {
            fprintf(stderr, "%s: gen: --db must name a tune.db file\n", cli_prog);
            rc = 2;
        }
    }
    if (rc < 0 && (!(archbuf = strdup(archlist)) || (famlist && !(fambuf = strdup(famlist))))) {
        fprintf(stderr, "%s: out of memory\n", cli_prog);
        rc = 1;
    }
    if (rc < 0 && (o.n_archs = cli_split_list(archbuf, &archs)) < 0)
        rc = 1;
    if (rc < 0 && o.n_archs == 0)
        rc = cli_usage_error("gen: %s", "--arch names no arch");
    if (rc < 0 && fambuf && (o.n_families = cli_split_list(fambuf, &families)) < 0)
        rc = 1;
    if (rc < 0 && !fambuf) {
        const char *const *names = lajit_family_names();
        while (names[o.n_families])
            o.n_families++;
        o.families = names;
    } else {
        o.families = (const char *const *)families;
    }
    if (rc < 0 && o.n_families == 0)
        rc = cli_usage_error("gen: %s", "--family names no family");
    lajit_ctx *ctx = NULL;
    if (rc < 0 && !(ctx = cli_open_ctx(0, LAJIT_CTX_NO_DEVICE)))
        rc = 1;
    if (rc < 0) {
        o.archs = (const char *const *)archs;
        o.assign = (const char *const *)assign.v;
        o.n_assign = assign.n;
        o.report = print_event;
        lj_lua *L;
        lj_gen_summary sum;
        lajit_status st = lajit__ctx_lua(ctx, &L);
        if (st == LAJIT_OK)
            st = lj_gen_write(lajit__ctx_env(ctx), L, load_family, ctx, &o, out_path, &sum);
        if (st != LAJIT_OK) {
            rc = cli_fail(ctx, st);
        } else {
            printf("wrote %s: %d cubins (%d from the tuning database), %d PTX\n", out_path,
                   sum.cubins, sum.tuned, sum.ptxs);
            rc = 0;
        }
    }
    lajit_ctx_destroy(ctx);
    free(archs);
    free(families);
    free(archbuf);
    free(fambuf);
    cli_assigns_free(&assign);
    return rc;
}
