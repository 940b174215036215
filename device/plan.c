/* plan.c — the plan table of the hot path (plan.h). */
#include "plan.h"

#include <string.h>

static unsigned log2_bucket(long long x)
{
    unsigned b = 0;
    while (x > 1) {
        x >>= 1;
        b++;
    }
    return b;
}

lj_plan_key lj_plan_key_make(const lj_problem *p, int family_index)
{
    lj_plan_key k;
    memset(&k, 0, sizeof k);
    k.op = (unsigned char)p->op;
    k.family = (unsigned char)family_index;
    k.dtype = (unsigned char)p->dtype;
    k.flags =
        (unsigned char)((p->decay ? LJ_PLAN_FLAG_DECAY : 0) |
                        (p->has_initial ? LJ_PLAN_FLAG_INITIAL : 0) |
                        (p->has_final ? LJ_PLAN_FLAG_FINAL : 0) |
                        (p->varlen ? LJ_PLAN_FLAG_VARLEN : 0) | (p->vk ? LJ_PLAN_FLAG_VK : 0) |
                        (p->want_ds ? LJ_PLAN_FLAG_WANT_DS : 0) |
                        (p->has_dsn ? LJ_PLAN_FLAG_DSN : 0) |
                        (p->step_states ? LJ_PLAN_FLAG_STEPS : 0));
    k.flags2 = (unsigned char)(p->state_only ? LJ_PLAN_FLAG2_STATE_ONLY : 0);
    k.log2_n = (unsigned char)log2_bucket(p->N);
    k.log2_bh = (unsigned char)log2_bucket((long long)p->B * p->H);
    k.log2_b = (unsigned char)log2_bucket(p->B);
    k.steps = (unsigned char)p->T;
    k.D = (unsigned short)p->D;
    k.E = (unsigned short)p->E;
    k.part = (unsigned short)p->part;
    /* The states' storage and o's dtype: compile-time types of the kernels. */
    k.dtypes = (unsigned short)(p->state_dtype | (lj_problem_out(p) << 8));
    if (p->op == LJ_OP_CUSTOM && p->decl) {
        k.D = 0xffff;
        k.E = k.log2_n = k.log2_bh = k.log2_b = k.steps = k.flags = 0;
        for (int i = 0; i < p->decl->n_syms; i++)
            k.sym[i] = p->decl->sym[i].dynamic ? (1LL << 62) + (long long)log2_bucket(p->sym[i])
                                               : p->sym[i];
    }
    return k;
}

static unsigned hash_key(const lj_plan_key *k)
{
    /* FNV-1a over the first 16 bytes of the key (all the attention ops use): a handful of
     * cycles; a custom key's symbols are folded in a word at a time. */
    const unsigned char *b = (const unsigned char *)k;
    unsigned h = 2166136261u;
    for (size_t i = 0; i < 16; i++)
        h = (h ^ b[i]) * 16777619u;
    if (k->op == LJ_OP_CUSTOM)
        for (int i = 0; i < LJ_MAX_SYMBOLS; i++)
            h = (h ^ (unsigned)(k->sym[i] ^ (k->sym[i] >> 32))) * 16777619u;
    return h;
}

const lj_plan *lj_plan_find(const lj_plan_table *t, const lj_plan_key *key)
{
    if (!t->cap)
        return NULL;
    unsigned mask = t->cap - 1;
    for (unsigned i = hash_key(key) & mask;; i = (i + 1) & mask) {
        const lj_plan *p = &t->slots[i];
        if (p->key.D == 0)
            return NULL;
        if (memcmp(&p->key, key, sizeof *key) == 0)
            return p;
    }
}

static void insert(lj_plan *slots, unsigned cap, const lj_plan *plan)
{
    unsigned mask = cap - 1;
    unsigned i = hash_key(&plan->key) & mask;
    while (slots[i].key.D != 0)
        i = (i + 1) & mask;
    slots[i] = *plan;
}

lajit_status lj_plan_add(lj_env *env, lj_plan_table *t, const lj_plan *plan)
{
    if ((t->count + 1) * 2 > t->cap) {
        unsigned cap = t->cap ? t->cap * 2 : 16;
        lj_plan *slots = lj_calloc(env, cap, sizeof *slots);
        if (!slots)
            return lj_oom(env);
        for (unsigned i = 0; i < t->cap; i++)
            if (t->slots[i].key.D != 0)
                insert(slots, cap, &t->slots[i]);
        lj_free(env, t->slots);
        t->slots = slots;
        t->cap = cap;
    }
    insert(t->slots, t->cap, plan);
    t->count++;
    return LAJIT_OK;
}

void lj_plan_table_free(lj_env *env, lj_plan_table *t)
{
    lj_free(env, t->slots);
    memset(t, 0, sizeof *t);
}

void lj_plan_vars(long long vars[LJ_VAR_SYM0], long long B, long long H, long long N,
                  long long nseq, long long T)
{
    vars[LJ_VAR_ONE] = 1;
    vars[LJ_VAR_B] = B;
    vars[LJ_VAR_H] = H;
    vars[LJ_VAR_N] = N;
    vars[LJ_VAR_BH] = B * H;
    vars[LJ_VAR_NSEQ] = nseq;
    vars[LJ_VAR_T] = T;
}

int lj_plan_ws_bytes(const lj_launch *l, const long long *vars, int nvars,
                     unsigned long long *bytes)
{
    const unsigned long long cap = 1ULL << 50;
    unsigned long long per = l->ws_per;
    for (int i = 0; i < l->ws_n_times && per; i++) {
        if ((int)l->ws_times[i] >= nvars)
            return 0;
        long long v = vars[l->ws_times[i]];
        if (v < 0 || (unsigned long long)v > cap || (v && per > cap / (unsigned long long)v))
            return 0;
        per *= (unsigned long long)v;
    }
    if (l->ws_fixed > cap || per > cap - l->ws_fixed)
        return 0;
    *bytes = l->ws_fixed + per;
    return 1;
}

int lj_plan_grid(const lj_launch *l, const long long *vars, int nvars, unsigned grid[3])
{
    static const long long limits[3] = {2147483647LL, 65535, 65535};
    for (int d = 0; d < 3; d++) {
        const lj_grid_dim *gd = &l->grid[d];
        if ((int)gd->var >= nvars)
            return 0;
        long long v = gd->var == LJ_VAR_ONE ? 1 : vars[gd->var];
        /* v, mul and div are at most 2^62 and 2^31: v * mul may overflow, so divide first. */
        if (v < 0 || (gd->mul > 1 && v > (1LL << 31)))
            return 0;
        long long g = (v * gd->mul + gd->div - 1) / gd->div;
        if (g < 1 || g > limits[d])
            return 0;
        grid[d] = (unsigned)g;
    }
    return 1;
}
