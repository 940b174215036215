/* cmd_expand.c — `lajit expand FAMILY`: the CUDA source a family's template expands to for one
 * problem and configuration (lajit_expand), for reading and debugging templates. */
#include <getopt.h>
#include <stdio.h>

#include "cli.h"

int cmd_expand(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'}, {"arch", required_argument, NULL, 'a'}, {0}};
    const char *arch = "sm_90a";
    cli_assigns assign = {0};
    int c, help = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hp:", longopts, NULL)) != -1) {
        if (c == 'h') {
            help = 1;
        } else if (c == 'a') {
            arch = optarg;
        } else if (c == 'p') {
            if (!cli_assigns_add(&assign, optarg)) {
                cli_assigns_free(&assign);
                return 1;
            }
        } else {
            cli_assigns_free(&assign);
            return cli_option_error("expand", c, argv);
        }
    }
    if (help || optind >= argc) {
        cli_assigns_free(&assign);
        printf("usage: %s expand FAMILY [-p KEY=VALUE ...] [--arch ARCH]\n\n"
               "Prints the CUDA source the family's template expands to. KEY is a problem field\n"
               "(dtype=bf16, D=128, E=64, decay=1, has_initial=1, vk=1, varlen=1, T=4, ...) or a\n"
               "parameter in capitals (TILE_V=32). Unset fields come from the family's first\n"
               "representative problem and its default configuration. ARCH: sm_80, sm_86, sm_89,\n"
               "sm_90a (default), sm_100a, sm_120.\n",
               cli_prog);
        return help ? 0 : 2;
    }
    if (optind + 1 < argc) {
        cli_assigns_free(&assign);
        return cli_usage_error("expand: unexpected argument %s", argv[optind + 1]);
    }
    const char *family = argv[optind];
    lajit_ctx *ctx = cli_open_ctx(0, LAJIT_CTX_NO_DEVICE);
    if (!ctx) {
        cli_assigns_free(&assign);
        return 1;
    }
    char *source;
    lajit_status st =
        lajit_expand(ctx, family, arch, (const char *const *)assign.v, assign.n, &source);
    int rc = 0;
    if (st == LAJIT_OK) {
        fputs(source, stdout);
        lajit_free(ctx, source);
    } else {
        rc = cli_fail(ctx, st);
    }
    lajit_ctx_destroy(ctx);
    cli_assigns_free(&assign);
    return rc;
}
