/* resources.h — the compile sweep's gate: a compiled kernel against what its spec claimed.
 *
 * A configuration that valid() accepts must compile without spilling (no spill stores or loads
 * and no stack frame, as ptxas reports them) and within the registers and shared memory the
 * spec's resources() claims (lj_family_resources). `lajit compile --all-configs` fails on any
 * configuration that does not, so the register model and smem() in a spec cannot drift from the
 * kernels unnoticed. */
#ifndef LAJIT_RESOURCES_H
#define LAJIT_RESOURCES_H

#include "cache.h"
#include "family.h"

/* 1 when the report e (and the launch's dynamic shared memory) keeps within claim; else 0 and
 * why (always NUL-terminated) says every way it does not. */
int lj_resources_check(const lj_resources *claim, const lj_cache_entry *e, unsigned smem_dynamic,
                       char *why, size_t cap);

/* The same for (c, p, d) of family f: reads the claim from the spec first. *ok as above. */
lajit_status lj_resources_check_config(lj_family *f, const lj_config *c, const lj_problem *p,
                                       const lj_device_info *d, const lj_cache_entry *e,
                                       unsigned smem_dynamic, int *ok, char *why, size_t cap);

#endif
