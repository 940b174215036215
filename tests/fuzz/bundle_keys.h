/* bundle_keys.h — the kernels the bundle seeds hold (make_seeds.c) and the bundle harness asks
 * for (fuzz_bundle.c): the same names on both sides, so a seed's lookups find real rows and the
 * fuzzer starts from the paths that read images, not only from misses. */
#ifndef LAJIT_FUZZ_BUNDLE_KEYS_H
#define LAJIT_FUZZ_BUNDLE_KEYS_H

#define SEED_FAMILY  "la_recurrent"
#define SEED_BUCKET  "f32 D32 E16 decay"
#define SEED_CONFIG  "BLOCK=16 WARPS=4"
#define SEED_PROBLEM "fwd f32 B=2 H=3 N=5 D=32 E=16 decay"
#define SEED_ENTRY   "la_recurrent_fwd"
#define SEED_KEY_HI  0x0123456789abcdefULL
#define SEED_KEY_LO  0xfedcba9876543210ULL

#endif
