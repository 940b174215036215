/* cache_helpers.h — test-only hooks of the compile and cache stage. */
#ifndef LAJIT_CACHE_HELPERS_H
#define LAJIT_CACHE_HELPERS_H

/* NVRTC programs created by lj_nvrtc_compile and not yet destroyed (generator/nvrtc.c). NVRTC
 * keeps its programs reachable, so LeakSanitizer cannot see a leaked one; tests check this. */
long lj_nvrtc_live_programs(void);

#endif
