/* autotune.c — the eager tuning policy on a real GPU: the first call of a bucket with no winner
 * tunes it (every valid configuration compiled and timed in the tuner's private CUDA context),
 * records the winner in tune.db, and the op then runs with that configuration and still agrees
 * with the float64 reference; a second context takes the recorded winner. Each case
 * has its own cache directory (test_main), so its database starts empty. */
#include <stdlib.h>

#include "attn_cases.h"
#include "test.h"
#include "tunedb.h"

static void count_winner(void *user, const lj_fingerprint *fp, const char *family,
                         const char *template_hash, const char *bucket, const char *config,
                         double ms, const char *default_config, double default_ms, int measured)
{
    (void)fp, (void)template_hash, (void)bucket, (void)default_config, (void)default_ms;
    int *n = user;
    (*n)++;
    printf("winner %s %s: %s %.4f ms (%d measured)\n", family, bucket, config, ms, measured);
}

static int winners(void)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    lj_tunedb *db;
    ASSERT_OK(lj_tunedb_open(&env, getenv("LAJIT_CACHE_DIR"), &db));
    int n = 0;
    ASSERT_OK(lj_tunedb_show(db, count_winner, &n));
    lj_tunedb_close(db);
    return n;
}

LJ_TEST(eager_fwd_tunes_then_reuses)
{
    setenv("LAJIT_AUTOTUNE", "eager", 1);
    fwd_case c = {"la_fwd", LJ_BF16, 2, 4, 700, 64, 64, 1, 1, 1, 0, 0, 0, 0, {0}, 0, 0, 51, NULL};
    run_fwd_case(&c); /* tunes the bucket, then checks the tuned kernel's output */
    ASSERT_EQ(winners(), 1);
    run_fwd_case(&c); /* a new context takes the recorded winner (and is still right) */
    ASSERT_EQ(winners(), 1);
}

LJ_TEST(eager_decode_tunes)
{
    setenv("LAJIT_AUTOTUNE", "eager", 1);
    decode_case c = {NULL, LJ_BF16, 8, 4, 128, 128, 1, 1, 0, 1, 0, 3, 0, 52};
    run_decode_case(&c);
    ASSERT_EQ(winners(), 1);
}

LJ_TEST(eager_bwd_tunes_its_scan_passes)
{
    setenv("LAJIT_AUTOTUNE", "eager", 1);
    bwd_case c = {NULL, LJ_BF16, 2, 2, 300, 64, 64, 1, 1, 0, 0, 0, 0, 0, 0, {0}, 0, 0, 0, 53, 0};
    run_bwd_case(&c); /* dq, dv, dk tuned; the ds pass keeps its default */
    ASSERT_EQ(winners(), 3);
}
