/* search.h — the tuner: for one family, problem and device, every configuration of the family's
 * space that its valid() accepts is compiled (in parallel threads, through the kernel cache) and
 * timed on the GPU; the fastest wins.
 *
 * Timing: in a PRIVATE CUDA context made for the search (cuCtxCreate), never the application's,
 * so a candidate that faults (illegal address, launch failure: errors that poison a context)
 * is recorded as a failure, the private context is destroyed and made again, and the search goes
 * on; the application's context and whatever context was current on the calling thread are
 * untouched. Each candidate is launched `warmup` times, then `runs` times between two events;
 * its time is the median. Launches rotate over several sets of input buffers (random data) whose
 * total exceeds twice the L2 size, so small problems do not read warm inputs from L2.
 *
 * Not covered: varlen and backward problems (LAJIT_ERR_UNSUPPORTED); a kernel that never ends
 * hangs the search (no watchdog). */
#ifndef LAJIT_SEARCH_H
#define LAJIT_SEARCH_H

#include "cache.h"
#include "config.h" /* lj_config_parse, which lived here */
#include "device.h"
#include "tunedb.h"

typedef struct lj_search_opts {
    int threads; /* compile threads (0: 4) */
    int warmup;  /* untimed launches per candidate (0: 3) */
    int runs;    /* timed launches per candidate, the median is kept (below 5: 5) */
    /* Progress (may be NULL): called after each compile batch and each timed candidate. */
    void (*progress)(void *user, int done, int total, const char *what);
    void *progress_user;
} lj_search_opts;

typedef struct lj_search_out {
    int n_space, n_valid;    /* configurations in the family's space, and valid ones */
    lj_tune_result *results; /* one per valid candidate, in space order (lj_free) */
    int n_results;
    lj_config best; /* fastest measured candidate (when have_best) */
    double best_ms;
    int have_best;
    lj_config dflt;    /* the family's default for the problem */
    double default_ms; /* its time; < 0 when it was not measured (failed) */
} lj_search_out;

/* Runs the search. L: the Lua state f was loaded into; cache: where compiled candidates go;
 * dev: an open device (its primary context is not used for timing). The whole search fails
 * only when nothing could be tried (unsupported problem, no memory for the inputs, the private
 * context cannot be made); candidates' failures are results. *out is written on success and
 * released with lj_search_out_free. */
lajit_status lj_search_run(lj_env *env, lj_lua *L, lj_family *f, lj_cache *cache, lj_device *dev,
                           const lj_problem *p, const lj_search_opts *opts, lj_search_out *out);
void lj_search_out_free(lj_env *env, lj_search_out *out);

/* The identity of (f, p) on dev for the tuning database: fingerprint (with the NVRTC version,
 * 0 when NVRTC cannot be loaded), family name, template hash and bucket. */
lajit_status lj_tune_id_make(lj_env *env, lj_family *f, const lj_device *dev, const lj_problem *p,
                             lj_tune_id *out);

#endif
