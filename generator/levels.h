/* levels.h — where a plan's kernel comes from: the levels of the kernel cache in DESIGN.md's
 * order, in one call, so the bundle is a level of the same cache and not a separate path. The
 * runtime's plan builder calls it once per plan; the configuration it passes (the bundle's, the
 * tuning database's winner or the default) is chosen before. */
#ifndef LAJIT_LEVELS_H
#define LAJIT_LEVELS_H

#include "bundle.h"
#include "kernel.h"

/* The image of (f, cfg, p) for dev from the first level that has it: the memory cache, the disk
 * cache (one lj_cache_get), the bundle (when not NULL), NVRTC (whose image is then stored in the
 * cache). The template is expanded once, here. Without NVRTC there is no cache key (it includes
 * the compiler's version), so the bundle is the only level: its cubin for dev's arch, else the
 * PTX of an older plain arch for the driver to compile. *image is borrowed from the cache or
 * the bundle; *source names the level for the plan's log line. L: the Lua state f was loaded
 * into; env: the one the cache and bundle were made with. */
lajit_status lj_kernel_fetch(lj_env *env, lj_lua *L, lj_family *f, lj_cache *cache,
                             lj_bundle *bundle, const lj_device_info *dev, const lj_problem *p,
                             const lj_config *cfg, const void **image, const char **source);

#endif
