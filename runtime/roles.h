/* roles.h — an op of several kernels (the backward) as its family spec declares it: for each pass,
 * which of the op's tensors its kernel receives in which argument, which states it reads
 * transposed, whether its D and E are the op's swapped, which problem flags its kernel depends on
 * and when it runs. The spec's `roles` table (templates/la_bwd/family.lua) is read once per
 * context and family into this plain struct; applying it is C arithmetic on la_params, so the hot
 * path stays free of Lua. */
#ifndef LAJIT_ROLES_H
#define LAJIT_ROLES_H

#include "family.h"
#include "la_params.h"

#define LJ_MAX_PASSES 8

/* The kernel arguments a pass fills (la_params fields). */
enum {
    LJ_SLOT_Q,
    LJ_SLOT_K,
    LJ_SLOT_V,
    LJ_SLOT_O,
    LJ_SLOT_S0,
    LJ_SLOT_SN,
    LJ_SLOT_X,   /* an extra sequence operand (the dq pass that also computes ds: the op's q) */
    LJ_SLOT_DSN, /* the gradient of the final state, read (that pass's last term of ds) */
    LJ_SLOT_O2,  /* a second output, in la_params.dk (the fused dv/dk pass: the op's dk) */
    LJ_N_SLOTS
};

/* The problem flags a pass may keep or require (the others of these are cleared in its problem,
 * so passes whose kernels are the same share a plan and a tuning bucket). */
#define LJ_ROLE_HAS_INITIAL 0x1u
#define LJ_ROLE_HAS_FINAL   0x2u
#define LJ_ROLE_HAS_DSN     0x4u
#define LJ_ROLE_WANT_DS     0x8u

typedef struct lj_pass_role {
    int part;      /* the problem's part: which kernel of the family */
    int all;       /* the kernel takes la_params as the op filled them */
    int ticket;    /* zero the workspace's first word (a ticket counter) before it, when the
                      pass's problem wants ds */
    int ds;        /* the kernel keeps the op's ds output and workspace (it may compute ds) */
    int swap_de;   /* the kernel's D, E are the op's E, D */
    unsigned keep; /* LJ_ROLE_* flags kept from the op's problem */
    unsigned when; /* LJ_ROLE_* flags the op's problem must have for the pass to run */
    signed char slot[LJ_N_SLOTS]; /* per kernel argument: the op tensor (lj_roles_tensor_name's
                                     index), -1: none */
    unsigned transpose;           /* bit per slot: its (d, e) strides swapped */
} lj_pass_role;

typedef struct lj_roles {
    int n;
    lj_pass_role pass[LJ_MAX_PASSES];
} lj_roles;

/* Reads f's spec `roles` (see templates/la_bwd/family.lua for its form); L is the Lua state f was
 * loaded into. LAJIT_ERR_TEMPLATE with a message naming the family when it is absent or
 * malformed. */
lajit_status lj_roles_load(lj_lua *L, lj_family *f, lj_roles *out);

/* The pass's problem from the op's: its part and flags. 0 when the pass does not run. */
int lj_roles_problem(const lj_pass_role *r, const lj_problem *p, lj_problem *out);
/* The pass's kernel arguments from the op's (lp as the op filled it). */
void lj_roles_params(const lj_pass_role *r, const la_params *lp, la_params *out);

#endif
