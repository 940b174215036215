/* main.c — the `lajit` command: dispatch to one command per file (tools/cmd_<name>.c).
 *
 * It is a thin shell over the library: everything it prints comes from the same functions the
 * C API uses (the internal ones where the CLI reports more than the API returns, e.g. the
 * compiler's resource report). Each command has --help. Exit status: 0 success, 1 failure,
 * 2 usage error. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"version", cmd_version, "print the version"},
    {"info", cmd_info, "driver, NVRTC, devices, cache directory, families"},
    {"families", cmd_families, "the built-in families and their parameter spaces"},
    {"expand", cmd_expand, "print a family's expanded CUDA source"},
    {"compile", cmd_compile, "compile families for a list of archs, with a resource report"},
    {"cache", cmd_cache, "list, verify or clear the kernel cache"},
    {"tune", cmd_tune, "tune families on this GPU and store the winners"},
    {"db", cmd_db, "show, export or import the tuning database"},
    {"gen", cmd_gen, "write an offline kernel set (bundle) for a list of archs"},
    {"bench", cmd_bench, "run the benchmark, writing the report's JSON rows"},
};

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        printf("usage: %s COMMAND [ARGS]   (%s COMMAND --help for each)\n\ncommands:\n", cli_prog,
               cli_prog);
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            printf("  %-9s %s\n", commands[i].name, commands[i].help);
        printf("\nenvironment: LAJIT_CACHE_DIR, LAJIT_TEMPLATE_DIR, LAJIT_CHECK=1, "
               "LAJIT_AUTOTUNE=off|eager, LAJIT_BUNDLE\n");
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        char *args[] = {"version", NULL};
        return cmd_version(1, args);
    }
    /* The command sees its own name as argv[0], as getopt_long expects a program's. */
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].fn(argc - 1, argv + 1);
    return cli_usage_error("unknown command %s", argv[1]);
}
