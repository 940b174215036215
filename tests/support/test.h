/* test.h — the test harness: one LJ_TEST(name) per case; the program runs the case named by
 * its first argument (CTest runs each in its own process, so a crash fails one case). Each
 * case gets a fresh, private cache directory in LAJIT_CACHE_DIR. Assertions print file, line,
 * the expression and both values, then exit 1. lj_test_skip() exits 77 (CTest: skipped). */
#ifndef LAJIT_TEST_H
#define LAJIT_TEST_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lajit.h"

typedef void (*lj_test_fn)(void);
void lj_test_register(const char *name, lj_test_fn fn);

#define LJ_TEST(name)                                              \
    static void test_##name(void);                                 \
    __attribute__((constructor)) static void register_##name(void) \
    {                                                              \
        lj_test_register(#name, test_##name);                      \
    }                                                              \
    static void test_##name(void)

/* The case's private temporary directory (created before the case runs, removed after a
 * passing run) and the source tree's root. */
const char *lj_test_tmpdir(void);
const char *lj_test_source_dir(void);
void lj_test_skip(const char *why) __attribute__((noreturn));
void lj_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));

#define ASSERT_TRUE(x)                                                      \
    do {                                                                    \
        if (!(x))                                                           \
            lj_test_fail(__FILE__, __LINE__, "ASSERT_TRUE(%s) failed", #x); \
    } while (0)
#define ASSERT_EQ(a, b)                                                                          \
    do {                                                                                         \
        long long a_ = (long long)(a), b_ = (long long)(b);                                      \
        if (a_ != b_)                                                                            \
            lj_test_fail(__FILE__, __LINE__, "ASSERT_EQ(%s, %s): %lld != %lld", #a, #b, a_, b_); \
    } while (0)
#define ASSERT_NE(a, b)                                                                   \
    do {                                                                                  \
        long long a_ = (long long)(a), b_ = (long long)(b);                               \
        if (a_ == b_)                                                                     \
            lj_test_fail(__FILE__, __LINE__, "ASSERT_NE(%s, %s): both %lld", #a, #b, a_); \
    } while (0)
#define ASSERT_STREQ(a, b)                                                                     \
    do {                                                                                       \
        const char *a_ = (a), *b_ = (b);                                                       \
        if (!a_ || !b_ || strcmp(a_, b_) != 0)                                                 \
            lj_test_fail(__FILE__, __LINE__, "ASSERT_STREQ(%s, %s): \"%s\" != \"%s\"", #a, #b, \
                         a_ ? a_ : "(null)", b_ ? b_ : "(null)");                              \
    } while (0)
#define ASSERT_CONTAINS(hay, needle)                                                              \
    do {                                                                                          \
        const char *h_ = (hay), *n_ = (needle);                                                   \
        if (!h_ || !strstr(h_, n_))                                                               \
            lj_test_fail(__FILE__, __LINE__, "ASSERT_CONTAINS(%s, \"%s\"): got \"%s\"", #hay, n_, \
                         h_ ? h_ : "(null)");                                                     \
    } while (0)
/* A call returning lajit_status must return the expected one. */
#define ASSERT_STATUS(expr, want)                                                          \
    do {                                                                                   \
        lajit_status got_ = (expr), want_ = (want);                                        \
        if (got_ != want_)                                                                 \
            lj_test_fail(__FILE__, __LINE__, "%s: got %d (%s), want %d (%s)", #expr, got_, \
                         lajit_status_string(got_), want_, lajit_status_string(want_));    \
    } while (0)
#define ASSERT_OK(expr) ASSERT_STATUS(expr, LAJIT_OK)
#define ASSERT_LE_F(a, b)                                                                         \
    do {                                                                                          \
        double a_ = (double)(a), b_ = (double)(b);                                                \
        if (!(a_ <= b_))                                                                          \
            lj_test_fail(__FILE__, __LINE__, "ASSERT_LE_F(%s, %s): %.6g > %.6g", #a, #b, a_, b_); \
    } while (0)

#endif
