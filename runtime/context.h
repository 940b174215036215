/* context.h — the context: everything one thread's use of lajit owns (see lajit.h for the
 * threading rule). It owns the env (allocator, error, log), the Lua host with its loaded
 * families, the kernel cache, the device and the plan table of the hot path. Internal: tests
 * and the CLI reach inside through the lajit__ functions below. */
#ifndef LAJIT_CONTEXT_H
#define LAJIT_CONTEXT_H

#include "bundle.h"
#include "cache.h"
#include "device.h"
#include "family.h"
#include "nccl.h"
#include "plan.h"
#include "roles.h"
#include "sandbox.h"
#include "tunedb.h"

#define LJ_MAX_FAMILIES 32

struct lajit_ctx {
    lj_env env;
    uint32_t flags;
    int ordinal;
    char *cache_dir;    /* NULL: memory-only cache */
    char *template_dir; /* LAJIT_TEMPLATE_DIR, NULL: embedded templates */
    lj_lua *lua;        /* created on first need */
    lj_cache *cache;    /* created on first need */
    lj_family *families[LJ_MAX_FAMILIES];
    int n_families;
    const lj_driver *driver_override; /* tests: a fake driver table */
    lj_device device;
    int device_open;
    lj_plan_table plans;
    lj_bundle *bundle; /* the offline kernel set, NULL when none */
    /* Device buffers the ops keep for the calls that need them, grown on the first call of a
     * larger shape (lj_ctx_buffer) and freed with the context: the backward's ds workspace when
     * the caller gives none; a split scan's flags (zeroed when allocated; the kernels leave them
     * zero) and states (plan_build.c); context parallelism's gathered local states, lengths and
     * incoming states (cp_op.c; the simulated ranks of the tests hold P of them). */
    lj_dev_buf scratch, split_flags, split_states, cp_ws;
    /* A custom family's workspace argument (lajit_launch), by family index: zeroed when
     * allocated or grown, then left as the family's kernels leave it (they may keep counters in
     * it from launch to launch; no other family's kernels touch it). */
    lj_dev_buf family_ws[LJ_MAX_FAMILIES];
    /* The backward's segments for ds (bwd_segments.c): boundaries, slots, lengths and six pools
     * of states; the boundaries were written for seg_N tokens in seg_P segments at seg_at. */
    lj_dev_buf seg_ws;
    CUdeviceptr seg_at;
    long long seg_N;
    int seg_P;
    int ds_segments; /* LAJIT_DS_SEGMENTS: 0 automatic, 1 never, n >= 2 always n (tests) */
    int cp_segments; /* LAJIT_CP_SEGMENTS: the same for context parallelism's forward */
    int pdl;         /* LAJIT_PDL: 1 (default) launch kernels whose spec says pdl with
                        programmatic stream serialization where possible (lj_plan_launch), 0 never */
    /* Context parallelism's varlen calls: the slots 0 .. cp_ids_n − 1 (cp_varlen.c). */
    lj_dev_buf cp_ids;
    int64_t cp_ids_n;
    const lj_nccl *nccl_override; /* tests: a fake NCCL table */
    uint32_t autotune;            /* LAJIT_AUTOTUNE_OFF or _EAGER (resolved at creation) */
    lj_tunedb *tunedb; /* opened on the first plan built; NULL until then or if unusable */
    int tunedb_failed; /* 1: opening failed once; not retried for this context */
    /* The shipped tuning table of the device (autotune/tuned.h), loaded on the first plan built
     * with no user winner; NULL when none or refused (said once in the log). */
    lj_tunedb *shipped;
    int shipped_tried;       /* 1: looked for once; not again for this context */
    char shipped_path[1024]; /* its file, for log lines */
    /* The passes of a multi-kernel op (the backward) as the named family's spec declares them,
     * by family index; [LJ_MAX_FAMILIES]: the op's defaults. Read on first use (plan_build.c). */
    lj_roles roles[LJ_MAX_FAMILIES + 1];
    unsigned char roles_loaded[LJ_MAX_FAMILIES + 1];
    /* Families from outside (family_path.c): name and the folder holding <name>/family.lua. */
    int n_outside;
    struct {
        char name[64];
        char *dir;
    } outside[LJ_LUA_MAX_ROOTS];
    const char **family_names; /* lajit_family_list's answer, made on first call */
};

/* Internal entry points shared by the ops, the CLI and the tests. */
lj_env *lajit__ctx_env(lajit_ctx *ctx);
/* Use drv instead of the process's libcuda for this context (tests; before any op). */
void lajit__ctx_set_driver(lajit_ctx *ctx, const lj_driver *drv);
/* Use nccl instead of the process's libnccl for this context (tests; before any op). */
void lajit__ctx_set_nccl(lajit_ctx *ctx, const lj_nccl *nccl);
lajit_status lajit__ctx_lua(lajit_ctx *ctx, lj_lua **out);
lajit_status lajit__ctx_cache(lajit_ctx *ctx, lj_cache **out);
lajit_status lajit__ctx_family(lajit_ctx *ctx, const char *name, lj_family **out);
/* lj_dev_buf_grow on one of the context's buffers, its device made current first. */
lajit_status lj_ctx_buffer(lajit_ctx *ctx, lj_dev_buf *buf, size_t bytes, int zero, void *stream,
                           const char *what);
lajit_status lajit__ctx_device(lajit_ctx *ctx, lj_device **out);

/* A segments setting (LAJIT_DS_SEGMENTS, LAJIT_CP_SEGMENTS) from its text: "off" or 1 never,
 * "auto" or 0 the automatic choice, 2..64 that many; NULL or empty: dflt; anything else: dflt
 * with *bad set. */
int lj_segments_parse(const char *v, int dflt, int *bad);

#endif
