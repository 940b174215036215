/* plan.h — the launch plans of the hot path. A plan is everything a launch needs once its
 * bucket has been through the slow path (family spec, template, cache, module load): the
 * function handle, the grid recipe, block and shared memory. The table is keyed by a small
 * fixed-size struct and probed with no allocation, no Lua and no hashing of source, so a call
 * on a cached kernel costs a few hundred nanoseconds of host time. */
#ifndef LAJIT_PLAN_H
#define LAJIT_PLAN_H

#include <cuda.h>

#include "family.h"

/* The bucket: every compile-time specialisation, the exact head dims, and log2 buckets of the
 * sizes that only steer the choice of configuration. Families' key() must not distinguish
 * finer than this (they may be coarser). Zero-filled before use so memcmp compares it. */
typedef struct lj_plan_key {
    unsigned char op, family, dtype, flags;
    unsigned char flags2; /* LJ_PLAN_FLAG2_* */
    unsigned char log2_n, log2_bh, log2_b, steps;
    unsigned short D, E; /* op custom: D is 0xffff (a key with D == 0 marks an empty slot) */
    unsigned short part;
    unsigned short dtypes; /* the states' storage dtype | o's dtype << 8 */
    /* op custom: each symbol's value, or for a dynamic one its log2 bucket (plus 2^62 so the
     * two never meet); zero for the attention ops. Hashed only for op custom. */
    long long sym[LJ_MAX_SYMBOLS];
} lj_plan_key;

#define LJ_PLAN_FLAG_DECAY       0x01u
#define LJ_PLAN_FLAG_INITIAL     0x02u
#define LJ_PLAN_FLAG_FINAL       0x04u
#define LJ_PLAN_FLAG_VARLEN      0x08u
#define LJ_PLAN_FLAG_VK          0x10u
#define LJ_PLAN_FLAG_WANT_DS     0x20u
#define LJ_PLAN_FLAG_DSN         0x40u
#define LJ_PLAN_FLAG_STEPS       0x80u
#define LJ_PLAN_FLAG2_STATE_ONLY 0x01u

typedef struct lj_plan {
    lj_plan_key key;
    CUmodule module;
    CUfunction fn;
    lj_launch launch;
    lj_config config;
} lj_plan;

typedef struct lj_plan_table {
    lj_plan *slots; /* open addressing, capacity a power of two; key.D == 0 marks empty */
    unsigned cap, count;
} lj_plan_table;

lj_plan_key lj_plan_key_make(const lj_problem *p, int family_index);
/* The plan for key, or NULL. */
const lj_plan *lj_plan_find(const lj_plan_table *t, const lj_plan_key *key);
/* Adds a plan (grows the table; the slow path only). */
lajit_status lj_plan_add(lj_env *env, lj_plan_table *t, const lj_plan *plan);
void lj_plan_table_free(lj_env *env, lj_plan_table *t);

/* Grid size for one call: evaluates the recipe with vars (indexed by lj_grid_var: the attention
 * ops fill LJ_VAR_ONE .. LJ_VAR_T, a custom family LJ_VAR_SYM0 + i with its symbols); 0 on a
 * variable past nvars or overflow of the driver's limits. */
int lj_plan_grid(const lj_launch *l, const long long *vars, int nvars, unsigned grid[3]);
/* The bytes of a custom family's workspace for one launch (lj_launch.ws_*), the variables as
 * for the grid; 0 into *bytes when the launch needs none. Returns 0 when a variable is past
 * nvars or the product passes 2^50 bytes. */
int lj_plan_ws_bytes(const lj_launch *l, const long long *vars, int nvars,
                     unsigned long long *bytes);
/* The attention ops' grid variables. */
void lj_plan_vars(long long vars[LJ_VAR_SYM0], long long B, long long H, long long N,
                  long long nseq, long long T);

#endif
