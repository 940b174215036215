/* cmd_bench.c — `lajit bench`: runs the benchmark program beside this one.
 *
 * The benchmark is its own program (bench/lajit_bench.c: it times with the driver directly and
 * measures ceilings beside lajit); `lajit bench` finds it next to this binary (installed) or in
 * the build tree and runs it, its JSON rows going to stdout or to -o FILE. Its options pass
 * through unparsed (lajit_bench checks them), which is why this command does not use getopt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

int cmd_bench(int argc, char **argv)
{
    const char *out = NULL;
    /* argv[0] is "bench"; the rest pass through to lajit_bench except -o FILE and --help. */
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args) {
        fprintf(stderr, "%s: out of memory\n", cli_prog);
        return 1;
    }
    int n = 0, help = 0;
    args[n++] = "lajit_bench";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-o") == 0 && i + 1 < argc)
            out = argv[++i];
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            help = 1;
        else
            args[n++] = argv[i];
    }
    args[n] = NULL;
    char self[4096], path[4200];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    const char *found = NULL;
    if (len > 0) {
        self[len] = 0;
        char *slash = strrchr(self, '/');
        if (slash)
            *slash = 0;
        const char *rel[] = {"%s/lajit_bench", "%s/../bench/lajit_bench"};
        for (int i = 0; i < 2 && !found; i++) {
            snprintf(path, sizeof path, rel[i], self);
            if (access(path, X_OK) == 0)
                found = path;
        }
    }
    if (help) {
        printf("usage: %s bench [-o FILE] [--mode prefill|fwdbwd|decode|dispatch|jit|cp|all]\n"
               "  [ARGS]\n\n"
               "Runs the benchmark (lajit_bench, %s): one JSON row per measurement in the\n"
               "report format of DESIGN.md (fwd, fwdbwd with extra memory, decode with its\n"
               "in-place ceiling, dispatch, jit, cp: context parallelism over this host's GPUs,\n"
               "one process each), to stdout or FILE. bench/report.py merges the\n"
               "rows with the peers' into docs/bench/<gpu>.json. The benchmark's own options:\n\n",
               cli_prog, found ? found : "not found next to this program");
        fflush(stdout);
        free(args);
        if (!found)
            return 0;
        char *bench_help[] = {"lajit_bench", "--help", NULL};
        execv(found, bench_help);
        return 0;
    }
    if (!found) {
        fprintf(stderr, "%s: bench: lajit_bench is not installed next to %s\n", cli_prog, self);
        free(args);
        return 1;
    }
    if (out && !freopen(out, "w", stdout)) {
        fprintf(stderr, "%s: bench: cannot write %s\n", cli_prog, out);
        free(args);
        return 1;
    }
    execv(found, args);
    fprintf(stderr, "%s: bench: cannot run %s\n", cli_prog, found);
    free(args);
    return 1;
}
