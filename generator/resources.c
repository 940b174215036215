/* resources.c — a compile's resource report against its spec's claim (resources.h). */
#include "resources.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Appends one finding to why ("; " between findings); a full buffer keeps what fits. */
static void finding(char *why, size_t cap, size_t *n, const char *fmt, ...)
{
    va_list ap;
    if (*n + 2 >= cap)
        return;
    if (*n) {
        memcpy(why + *n, "; ", 3);
        *n += 2;
    }
    va_start(ap, fmt);
    int w = vsnprintf(why + *n, cap - *n, fmt, ap);
    va_end(ap);
    if (w > 0)
        *n = *n + (size_t)w < cap ? *n + (size_t)w : cap - 1;
}

int lj_resources_check(const lj_resources *claim, const lj_cache_entry *e, unsigned smem_dynamic,
                       char *why, size_t cap)
{
    size_t n = 0;
    if (cap)
        why[0] = 0;
    int ok = 1;
    if (e->spill_stores > 0 || e->spill_loads > 0) {
        finding(why, cap, &n, "spills (%d bytes stored, %d loaded)", e->spill_stores,
                e->spill_loads);
        ok = 0;
    }
    if (e->stack_bytes > 0) {
        finding(why, cap, &n, "%d bytes of stack frame", e->stack_bytes);
        ok = 0;
    }
    if (e->regs > claim->regs) {
        finding(why, cap, &n, "%d registers, the spec claims at most %lld", e->regs, claim->regs);
        ok = 0;
    }
    long long smem = (long long)e->smem_static + smem_dynamic;
    if (smem > claim->smem) {
        finding(why, cap, &n,
                "%lld bytes of shared memory (%d static), the spec claims at most %lld", smem,
                e->smem_static, claim->smem);
        ok = 0;
    }
    return ok;
}

lajit_status lj_resources_check_config(lj_family *f, const lj_config *c, const lj_problem *p,
                                       const lj_device_info *d, const lj_cache_entry *e,
                                       unsigned smem_dynamic, int *ok, char *why, size_t cap)
{
    lj_resources claim;
    lajit_status st = lj_family_resources(f, c, p, d, &claim);
    if (st != LAJIT_OK)
        return st;
    *ok = lj_resources_check(&claim, e, smem_dynamic, why, cap);
    return LAJIT_OK;
}
