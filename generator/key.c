/* key.c — the kernel cache key (see key.h).
 *
 * The key is XXH3-128 of a canonical text that is never built in memory but streamed into the
 * hash. Each field is written as "<tag> <length>\n<bytes>\n" in a fixed order (lajit version,
 * NVRTC version, arch, PTX flag, each option, each header's name and text in the order given,
 * the source). Because every field carries its tag and exact length, the text can be parsed
 * back unambiguously, so two different inputs never give the same text: "ab"+"c" and "a"+"bc"
 * differ, and a header cannot pass for an option. A change of this format changes every key
 * (tests pin one golden key), which is what should happen: old entries are then never read. */
#include "key.h"

#include <stdio.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

static void put_field(XXH3_state_t *st, const char *tag, const char *data, size_t len)
{
    char head[64];
    int n = snprintf(head, sizeof head, "%s %zu\n", tag, len);
    XXH3_128bits_update(st, head, (size_t)n);
    if (len)
        XXH3_128bits_update(st, data, len);
    XXH3_128bits_update(st, "\n", 1);
}

static void put_string(XXH3_state_t *st, const char *tag, const char *s)
{
    /* NULL is written as an empty field: callers never pass it for meaningful data. */
    put_field(st, tag, s ? s : "", s ? strlen(s) : 0);
}

lj_key lj_key_compute(const lj_key_input *in)
{
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    char num[32];
    put_string(&st, "lajit", in->lajit_version ? in->lajit_version : LAJIT_VERSION_STRING);
    snprintf(num, sizeof num, "%d.%d", in->nvrtc_major, in->nvrtc_minor);
    put_string(&st, "nvrtc", num);
    put_string(&st, "arch", in->arch);
    put_string(&st, "ptx", in->ptx ? "1" : "0");
    for (int i = 0; i < in->n_options; i++)
        put_string(&st, "option", in->options[i]);
    for (int i = 0; i < in->n_headers; i++) {
        const lj_header *h = &in->headers[i];
        put_string(&st, "header-name", h->name);
        put_field(&st, "header-text", h->text ? h->text : "", h->text ? h->len : 0);
    }
    put_string(&st, "source", in->source);
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    lj_key k = {h.high64, h.low64};
    return k;
}

void lj_key_hex(lj_key key, char out[33])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[i] = digits[(key.hi >> (60 - 4 * i)) & 0xf];
        out[16 + i] = digits[(key.lo >> (60 - 4 * i)) & 0xf];
    }
    out[32] = 0;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int lj_key_parse(const char *hex, lj_key *out)
{
    if (!hex)
        return 0;
    uint64_t part[2] = {0, 0};
    for (int i = 0; i < 32; i++) {
        int v = hex_value(hex[i]);
        if (v < 0)
            return 0; /* also stops at a NUL before 32 digits */
        part[i / 16] = (part[i / 16] << 4) | (uint64_t)v;
    }
    if (hex[32] != 0)
        return 0;
    out->hi = part[0];
    out->lo = part[1];
    return 1;
}

int lj_key_equal(lj_key a, lj_key b)
{
    return a.hi == b.hi && a.lo == b.lo;
}

uint64_t lj_hash64(const void *data, size_t len)
{
    return XXH3_64bits(data, len);
}
