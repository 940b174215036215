/* fuzz_bundle.c — the bundle reader (autotune/bundle.h) on hostile files: the input is written
 * as a bundle file, opened, and asked every question a context asks (counts, the configuration
 * of a bucket, images by key, the PTX fallback). Any status is fine; a crash, a hang, a leak or
 * an image handed out whose bytes cannot be read is not. Seeds: corpus/bundle (make_seeds.c).
 *
 * With LAJIT_FUZZ_EXPECT_KERNELS=n in the environment (CTest's fuzz.bundle.valid_* cases) the
 * input must also open, count n kernels and serve each of them by key with the configuration of
 * its bucket: so a format change cannot quietly turn the valid seeds into files the reader
 * refuses, which would pass the plain replay as well. */
#include <stdlib.h>
#include <string.h>

#include "bundle.h"
#include "bundle_keys.h"
#include "fuzz.h"

/* Reads every byte of what the reader handed out, so ASan sees a short buffer. */
static void touch(const void *image, size_t size)
{
    if (!image && size)
        lj_fuzz_fail("NULL image of %zu bytes", size);
    (void)lj_hash64(image, size);
}

/* Asks everything; returns the kernels counted, the images served by the seed key and the
 * bucket configurations found. */
static void ask(lj_bundle *b, int *counted, int *served, int *configs)
{
    int cubins = 0, ptxs = 0, found;
    *served = *configs = 0;
    lj_bundle_count(b, &cubins, &ptxs);
    *counted = cubins + ptxs;
    lj_key key = {SEED_KEY_HI, SEED_KEY_LO}, other = {1, 2};
    static const struct {
        const char *arch;
        int ptx;
    } finds[] = {{"sm_90a", 0}, {"sm_80", 0}, {"sm_80", 1}, {"sm_120", 0}};
    for (size_t i = 0; i < sizeof finds / sizeof finds[0]; i++) {
        const void *image = NULL;
        size_t size = 0;
        if (lj_bundle_find(b, key, finds[i].arch, finds[i].ptx, &image, &size, &found) ==
                LAJIT_OK &&
            found) {
            touch(image, size);
            ++*served;
        }
    }
    const void *image;
    size_t size;
    lj_bundle_find(b, other, "sm_90a", 0, &image, &size, &found);
    static const char *const archs[] = {"sm_90a", "sm_80", "sm_100a"};
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        char config[256];
        if (lj_bundle_config(b, SEED_FAMILY, SEED_BUCKET, archs[i], config, sizeof config,
                             &found) == LAJIT_OK &&
            found) {
            if (!memchr(config, 0, sizeof config))
                lj_fuzz_fail("configuration not terminated");
            *configs += strcmp(config, SEED_CONFIG) == 0;
        }
    }
    static const int ccs[] = {70, 86, 90, 120};
    for (size_t i = 0; i < sizeof ccs / sizeof ccs[0]; i++) {
        char arch[16];
        if (lj_bundle_find_ptx(b, SEED_FAMILY, SEED_BUCKET, SEED_CONFIG, ccs[i], &image, &size,
                               arch, &found) == LAJIT_OK &&
            found) {
            touch(image, size);
            if (!memchr(arch, 0, sizeof arch))
                lj_fuzz_fail("PTX arch not terminated");
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[1024];
    lj_fuzz_write("fuzz.bundle", data, size, path, sizeof path);
    lj_env env;
    lj_fuzz_heap heap;
    lj_fuzz_env(&env, &heap, 64u << 20);
    const char *expect = getenv("LAJIT_FUZZ_EXPECT_KERNELS");
    lj_bundle *b = NULL;
    if (lj_bundle_open(&env, path, &b) == LAJIT_OK) {
        int counted, served, configs;
        ask(b, &counted, &served, &configs);
        lj_bundle_close(b);
        int n = expect ? atoi(expect) : -1;
        if (expect && (counted != n || served != n || (n > 0 && configs == 0)))
            lj_fuzz_fail("a valid seed holds %d kernels, serves %d by key and %d bucket "
                         "configurations; expected %d (rerun make_seeds?)",
                         counted, served, configs, n);
    } else if (expect) {
        lj_fuzz_fail("a valid seed does not open (rerun make_seeds?): %s", env.errmsg);
    }
    if (heap.held)
        lj_fuzz_fail("%zu bytes still held after the bundle was closed", heap.held);
    lj_fuzz_clean();
    return 0;
}
