/* cmd_version.c — `lajit version`: the library's version string. */
#include <getopt.h>
#include <stdio.h>

#include "cli.h"

int cmd_version(int argc, char **argv)
{
    static const struct option longopts[] = {{"help", no_argument, NULL, 'h'}, {0}};
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        if (c != 'h')
            return cli_option_error("version", c, argv);
        printf("usage: %s version\n\nPrints lajit's version.\n", cli_prog);
        return 0;
    }
    if (optind < argc)
        return cli_usage_error("version: unexpected argument %s", argv[optind]);
    printf("lajit %s\n", lajit_version_string());
    return 0;
}
