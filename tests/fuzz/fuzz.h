/* fuzz.h — what the fuzz harnesses share (tests/fuzz/README.md says how they are built and run).
 *
 * Each harness is one file defining LLVMFuzzerTestOneInput, linked either with libFuzzer
 * (clang, -fsanitize=fuzzer) or with driver.c, a plain main() that replays a corpus, so the
 * same harness runs under CTest in every build. A harness keeps its work per input small and
 * deterministic and leaves nothing behind: every input starts from a fresh env, and what the
 * library allocated through that env is counted, so a leak is caught even without LSan. */
#ifndef LAJIT_FUZZ_H
#define LAJIT_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Stops the run on a broken invariant: a message on stderr, then abort(), which libFuzzer and
 * the driver both report as a crash with the input that caused it. */
void lj_fuzz_fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* An allocator with a byte budget: every host allocation of the library (Lua's included) goes
 * through it, a request beyond the budget fails (the library must turn that into a status), and
 * the bytes still held tell whether a path leaked. */
typedef struct lj_fuzz_heap {
    size_t held;  /* bytes allocated and not yet freed */
    size_t limit; /* refuse an allocation that would take held beyond this */
} lj_fuzz_heap;

/* An env whose allocations go through heap (limit bytes, held reset to 0) with no log. */
void lj_fuzz_env(lj_env *env, lj_fuzz_heap *heap, size_t limit);

/* A private directory for this process's files, created on first use and removed (with its
 * contents) at exit. Under $TMPDIR, else /tmp. */
const char *lj_fuzz_dir(void);
/* lj_fuzz_dir()/name written with data; aborts when the file cannot be written (the harness,
 * not the library, failed). out receives the path. */
void lj_fuzz_write(const char *name, const void *data, size_t size, char *out, size_t cap);
/* Removes everything inside lj_fuzz_dir() (the directory itself stays). */
void lj_fuzz_clean(void);

#endif
