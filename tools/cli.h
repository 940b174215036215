/* cli.h — what the `lajit` commands share: the context they open, how they report failures and
 * usage errors, checked number parsing, the growable list of -p KEY=VALUE assignments, and the
 * getopt_long conventions. Exit status of every command: 0 success, 1 failure, 2 usage error.
 *
 * Each command lives in tools/cmd_<name>.c as `int cmd_<name>(int argc, char **argv)`, argv[0]
 * being the command's name (so getopt_long reads it like a program's arguments). */
#ifndef LAJIT_CLI_H
#define LAJIT_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "context.h"

extern const char *const cli_prog; /* "lajit", the prefix of every message */

/* Largest -j the CLI accepts (the compiler runs at most 16 threads whatever is asked). */
#define CLI_MAX_JOBS 1024

/* "lajit: <fmt with arg> (see lajit --help)" on stderr; returns 2. */
int cli_usage_error(const char *fmt, const char *arg);

/* A context with the CLI's log (verbose < 0: no log; 0: warnings; 1: info). NULL (with a
 * message on stderr) on failure. */
lajit_ctx *cli_open_ctx(int verbose, uint32_t flags);
/* "lajit: <status>: <ctx's message>" on stderr; returns 1. */
int cli_fail(lajit_ctx *ctx, lajit_status st);
double cli_now_s(void);

/* text as a whole decimal integer in [lo, hi] into *out. On anything else (empty, trailing
 * characters, out of range) prints "lajit: <cmd>: <option> wants an integer from lo to hi, not
 * 'text'" and returns 0. */
int cli_parse_int(const char *cmd, const char *option, const char *text, long lo, long hi,
                  int *out);

/* A growable list of "KEY=VALUE" assignments (-p and the flags that stand for one); the list
 * owns copies of its strings. Passed as (const char *const *)v, n to lj_assign_all, whose
 * lj_assign (generator/problem.h) parses each one. */
typedef struct cli_assigns {
    char **v;
    size_t n, cap;
} cli_assigns;
/* Appends a copy of text; 0 (with a message) when memory runs out. */
int cli_assigns_add(cli_assigns *a, const char *text);
void cli_assigns_free(cli_assigns *a);

/* Splits a comma-separated list in place into a growable array of its non-empty items
 * (*out freed with free()); returns the count, or -1 (with a message) when memory runs out. */
int cli_split_list(char *list, char ***out);

/* getopt_long's error for the option at argv[optind - 1], as a usage error of cmd (returns 2):
 * c is what getopt_long returned (':' for a missing value, '?' for an unknown option). */
int cli_option_error(const char *cmd, int c, char **argv);

/* The options of a command that takes no argument but --help (version, info, families): -1
 * when the command should go on; else its exit status, 0 after printing "usage: lajit <cmd>"
 * and help (a sentence or more, ending in a newline), 2 after a usage error. */
int cli_no_arguments(const char *cmd, const char *help, int argc, char **argv);

/* The commands. */
int cmd_version(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_families(int argc, char **argv);
int cmd_expand(int argc, char **argv);
int cmd_compile(int argc, char **argv);
int cmd_cache(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_db(int argc, char **argv);
int cmd_gen(int argc, char **argv);
int cmd_bench(int argc, char **argv);

#endif
