/* overlap.c — element-level disjointness of two strided views (see overlap.h).
 *
 * Each view is reduced to rows: its trailing dimensions that are contiguous in memory merge
 * into one run of `row` bytes, and the remaining dimensions place those rows at addresses
 * base + sum(i_k * stride_k). Every such address is congruent to base modulo g, the gcd of
 * those strides in bytes. Two views can share a byte only where a row of one meets a row of
 * the other, so only when, for G = gcd(g_a, g_b), some x ≡ base_b - base_a (mod G) lies in
 * (-row_b, row_a). Assuming every address of the congruence class holds a row is the
 * relaxation that makes the test conservative; for slices of one packed buffer (same outer
 * strides, column offsets within a row) it is exact. The address ranges are compared first. */
#include "overlap.h"

#include <stdint.h>

typedef struct rows {
    uint64_t lo, hi; /* [lo, hi): the bytes from the first element to the end of the last */
    uint64_t row;    /* bytes of one contiguous run */
    uint64_t g;      /* gcd of the other strides in bytes; 0: a single run */
    int negative;    /* a negative stride: only the range test is used */
} rows;

static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static void rows_of(const DLTensor *t, rows *r)
{
    uint64_t el = ((uint64_t)t->dtype.bits * t->dtype.lanes + 7) / 8;
    if (el == 0)
        el = 1;
    int64_t compact = 1, span = 0; /* span: elements from the first to the last */
    int merging = 1;
    r->row = el;
    r->g = 0;
    r->negative = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d], s = t->strides ? t->strides[d] : compact;
        compact *= n;
        if (n == 1)
            continue; /* its stride never moves an address */
        if (s < 0) {
            r->negative = 1;
            s = -s;
        }
        span += (n - 1) * s;
        if (merging && (uint64_t)s * el == r->row) {
            r->row *= (uint64_t)n; /* contiguous with what follows: one longer run */
            continue;
        }
        merging = 0;
        r->g = gcd_u64(r->g, (uint64_t)s * el);
    }
    r->lo = (uint64_t)(uintptr_t)t->data + t->byte_offset;
    r->hi = r->lo + (uint64_t)span * el + el;
}

int lj_tensors_may_share(const DLTensor *a, const DLTensor *b)
{
    if (!a || !b || a->device.device_type != b->device.device_type ||
        a->device.device_id != b->device.device_id)
        return 0;
    rows ra, rb;
    rows_of(a, &ra);
    rows_of(b, &rb);
    if (ra.negative || rb.negative) {
        /* The range from lo was computed with |stride|: widen it to both sides. */
        uint64_t wa = ra.hi - ra.lo, wb = rb.hi - rb.lo;
        uint64_t alo = ra.negative ? ra.lo - (wa < ra.lo ? wa : ra.lo) : ra.lo;
        uint64_t blo = rb.negative ? rb.lo - (wb < rb.lo ? wb : rb.lo) : rb.lo;
        return !(ra.hi <= blo || rb.hi <= alo);
    }
    if (ra.hi <= rb.lo || rb.hi <= ra.lo)
        return 0;
    uint64_t G = gcd_u64(ra.g, rb.g);
    if (G == 0)
        return 1; /* two single runs whose ranges meet */
    /* d = (base_b - base_a) mod G in [0, G); the candidates base_b - base_a are d + kG. The
     * smallest candidate above -row_b is v; a row of a meets a row of b iff v < row_a. */
    uint64_t d = (rb.lo % G + G - ra.lo % G) % G;
    int64_t v = (int64_t)d - (int64_t)(G * ((d + rb.row - 1) / G));
    return v < (int64_t)ra.row;
}
