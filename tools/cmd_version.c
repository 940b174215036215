/* cmd_version.c — `lajit version`: the library's version string. */
#include <stdio.h>

#include "cli.h"

int cmd_version(int argc, char **argv)
{
    int rc = cli_no_arguments("version", "Prints lajit's version.\n", argc, argv);
    if (rc >= 0)
        return rc;
    printf("lajit %s\n", lajit_version_string());
    return 0;
}
