/* cmd_families.c — `lajit families`: each built-in family, its op and its tunable parameters
 * with their candidate values, read through the public discovery API (lajit_family_describe,
 * lajit_family_param) so the CLI shows exactly what an application can query. */
#include <stdio.h>

#include "cli.h"

int cmd_families(int argc, char **argv)
{
    int rc = cli_no_arguments("families",
                              "Lists the families (the built-in ones, then those of "
                              "LAJIT_FAMILY_PATH), their op and their tunable parameters with "
                              "candidate values.\n",
                              argc, argv);
    if (rc >= 0)
        return rc;
    lajit_ctx *ctx = cli_open_ctx(0, LAJIT_CTX_NO_DEVICE);
    if (!ctx)
        return 1;
    const char *const *names;
    size_t n_names;
    lajit_status listed = lajit_family_list(ctx, &names, &n_names);
    if (listed != LAJIT_OK) {
        rc = cli_fail(ctx, listed);
        lajit_ctx_destroy(ctx);
        return rc;
    }
    rc = 0;
    for (const char *const *name = names; *name; name++) {
        lajit_family_info fam = {.struct_size = sizeof fam};
        lajit_status st = lajit_family_describe(ctx, *name, &fam);
        if (st != LAJIT_OK) {
            rc = cli_fail(ctx, st);
            continue;
        }
        printf("%s (%s)\n", fam.name, fam.op);
        for (int i = 0; i < fam.n_params; i++) {
            lajit_param_info p = {.struct_size = sizeof p};
            if ((st = lajit_family_param(ctx, *name, i, &p)) != LAJIT_OK) {
                rc = cli_fail(ctx, st);
                break;
            }
            printf("  %-10s", p.name);
            for (int j = 0; j < p.n_values; j++)
                printf(" %lld", p.values[j]);
            printf("\n");
        }
    }
    lajit_ctx_destroy(ctx);
    return rc;
}
