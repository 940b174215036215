/* key.c — cache keys: stable across calls and pinned by a golden value (so a change of the
 * canonical text is noticed), changed by every single input, unambiguous at field boundaries,
 * and round-tripped through hex. */
#include "key.h"
#include "test.h"

static const char *const k_opts[] = {"--gpu-architecture=sm_90a", "-std=c++17", "-default-device"};

typedef struct fixture {
    char source[64];
    char hname[2][32];
    char htext[2][32];
    lj_header headers[2];
    char arch[16];
    const char *opts[3];
    char opt0[64];
    lj_key_input in;
} fixture;

static void fixture_init(fixture *f)
{
    memset(f, 0, sizeof *f);
    strcpy(f->source, "extern \"C\" __global__ void k() {}\n");
    strcpy(f->hname[0], "common/a.cuh");
    strcpy(f->hname[1], "common/b.cuh");
    strcpy(f->htext[0], "#define A 1\n");
    strcpy(f->htext[1], "#define B 2\n");
    for (int i = 0; i < 2; i++) {
        f->headers[i].name = f->hname[i];
        f->headers[i].text = f->htext[i];
        f->headers[i].len = strlen(f->htext[i]);
    }
    strcpy(f->arch, "sm_90a");
    strcpy(f->opt0, k_opts[0]);
    f->opts[0] = f->opt0;
    f->opts[1] = k_opts[1];
    f->opts[2] = k_opts[2];
    f->in.source = f->source;
    f->in.headers = f->headers;
    f->in.n_headers = 2;
    f->in.arch = f->arch;
    f->in.nvrtc_major = 13;
    f->in.nvrtc_minor = 0;
    f->in.options = f->opts;
    f->in.n_options = 3;
    f->in.ptx = 0;
    f->in.lajit_version = "0.1.0";
}

static lj_key key_of(const fixture *f)
{
    return lj_key_compute(&f->in);
}

LJ_TEST(stable_and_golden)
{
    fixture f;
    fixture_init(&f);
    lj_key a = key_of(&f), b = key_of(&f);
    ASSERT_TRUE(lj_key_equal(a, b));
    char hex[33];
    lj_key_hex(a, hex);
    /* Golden: if this changes, every existing cache entry becomes unreachable. That is only
     * acceptable on purpose (a new canonical text); update the value then. */
    ASSERT_STREQ(hex, "a8d924d11e06a78090f1dc5b38a679fb");
}

/* Each mutation of one input must change the key. */
LJ_TEST(sensitive_to_every_input)
{
    fixture f;
    fixture_init(&f);
    const lj_key base = key_of(&f);
    lj_key seen[16];
    int n = 0;
#define MUTATE(stmt)                                                        \
    do {                                                                    \
        fixture_init(&f);                                                   \
        stmt;                                                               \
        lj_key k_ = key_of(&f);                                             \
        if (lj_key_equal(k_, base))                                         \
            lj_test_fail(__FILE__, __LINE__, "key unchanged by %s", #stmt); \
        for (int i_ = 0; i_ < n; i_++)                                      \
            ASSERT_TRUE(!lj_key_equal(k_, seen[i_]));                       \
        seen[n++] = k_;                                                     \
    } while (0)
    MUTATE(f.source[0] = 'E');
    MUTATE(f.source[strlen(f.source) - 1] = ' ');
    MUTATE(f.hname[1][7] = 'c');
    MUTATE(f.htext[0][10] = '2');
    MUTATE(f.headers[0].len--);
    MUTATE(strcpy(f.arch, "sm_90"));
    MUTATE(f.in.nvrtc_minor = 1);
    MUTATE(f.in.nvrtc_major = 12);
    MUTATE(strcpy(f.opt0, "--gpu-architecture=sm_90"));
    MUTATE(f.in.n_options = 2);
    MUTATE(f.in.ptx = 1);
    MUTATE(f.in.lajit_version = "0.1.1");
    MUTATE(f.in.n_headers = 1);
    /* Header order matters: NVRTC resolves names, but the text is what the key covers. */
    MUTATE((f.headers[0] = f.headers[1], f.headers[1].name = f.hname[0],
            f.headers[1].text = f.htext[0]));
#undef MUTATE
    ASSERT_EQ(n, 14);
}

/* Field boundaries are part of the text: moving bytes from one field to the next changes the
 * key, and a header cannot pass for an option. */
LJ_TEST(unambiguous_fields)
{
    lj_header h1 = {"ab", "c", 1}, h2 = {"a", "bc", 2};
    lj_key_input in = {0};
    in.source = "";
    in.arch = "sm_80";
    in.headers = &h1;
    in.n_headers = 1;
    lj_key a = lj_key_compute(&in);
    in.headers = &h2;
    lj_key b = lj_key_compute(&in);
    ASSERT_TRUE(!lj_key_equal(a, b));

    const char *o1[] = {"ab", "c"};
    const char *o2[] = {"a", "bc"};
    in.n_headers = 0;
    in.options = o1;
    in.n_options = 2;
    a = lj_key_compute(&in);
    in.options = o2;
    b = lj_key_compute(&in);
    ASSERT_TRUE(!lj_key_equal(a, b));

    /* Source "x" with no header vs. an empty source with a header whose text is "x". */
    lj_header hx = {"", "x", 1};
    in.n_options = 0;
    in.source = "x";
    a = lj_key_compute(&in);
    in.source = "";
    in.headers = &hx;
    in.n_headers = 1;
    b = lj_key_compute(&in);
    ASSERT_TRUE(!lj_key_equal(a, b));

    /* The NULL lajit version means this build's version. */
    in.lajit_version = NULL;
    a = lj_key_compute(&in);
    in.lajit_version = LAJIT_VERSION_STRING;
    b = lj_key_compute(&in);
    ASSERT_TRUE(lj_key_equal(a, b));
}

LJ_TEST(hex_round_trip)
{
    lj_key k = {0x0123456789abcdefull, 0xfedcba9876543210ull}, back;
    char hex[33];
    lj_key_hex(k, hex);
    ASSERT_STREQ(hex, "0123456789abcdeffedcba9876543210");
    ASSERT_TRUE(lj_key_parse(hex, &back));
    ASSERT_TRUE(lj_key_equal(k, back));
    ASSERT_TRUE(lj_key_parse("0123456789ABCDEFFEDCBA9876543210", &back));
    ASSERT_TRUE(lj_key_equal(k, back));
    fixture f;
    fixture_init(&f);
    k = key_of(&f);
    lj_key_hex(k, hex);
    ASSERT_EQ(strlen(hex), 32);
    ASSERT_TRUE(lj_key_parse(hex, &back) && lj_key_equal(k, back));
    /* Rejected: short, long, non-hex, NULL. */
    ASSERT_TRUE(!lj_key_parse("0123", &back));
    ASSERT_TRUE(!lj_key_parse("0123456789abcdeffedcba98765432100", &back));
    ASSERT_TRUE(!lj_key_parse("0123456789abcdeffedcba987654321g", &back));
    ASSERT_TRUE(!lj_key_parse(NULL, &back));
}

LJ_TEST(hash64)
{
    ASSERT_EQ(lj_hash64("abc", 3), lj_hash64("abc", 3));
    ASSERT_NE(lj_hash64("abc", 3), lj_hash64("abd", 3));
    ASSERT_NE(lj_hash64("abc", 3), lj_hash64("abc", 2));
    /* XXH3-64 of the empty input, a published constant of xxHash 0.8. */
    ASSERT_TRUE(lj_hash64("", 0) == 0x2D06800538D394C2ull);
}
