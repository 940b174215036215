/* key.h — the kernel cache key: XXH3-128 over a canonical text holding the expanded source,
 * every header given to NVRTC (name and text), the exact arch string, the NVRTC version, the
 * compile options and the lajit version. Changing any one of them changes the key. */
#ifndef LAJIT_KEY_H
#define LAJIT_KEY_H

#include "nvrtc.h"

typedef struct lj_key {
    uint64_t hi, lo;
} lj_key;

typedef struct lj_key_input {
    const char *source;
    const lj_header *headers;
    int n_headers;
    const char *arch;
    int nvrtc_major, nvrtc_minor;
    const char *const *options;
    int n_options;
    int ptx;
    const char *lajit_version; /* LAJIT_VERSION_STRING normally; tests vary it */
} lj_key_input;

lj_key lj_key_compute(const lj_key_input *in);
/* 32 lowercase hex digits and a NUL. */
void lj_key_hex(lj_key key, char out[33]);
int lj_key_parse(const char *hex, lj_key *out); /* 1 on success */
int lj_key_equal(lj_key a, lj_key b);
/* XXH3-64 of bytes (checksums of cache entries, template hashes). */
uint64_t lj_hash64(const void *data, size_t len);

#endif
