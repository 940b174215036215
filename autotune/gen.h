/* gen.h — the policy of an offline kernel set (`lajit gen`): which kernels a bundle holds and
 * writing them. For each family and arch, each representative problem of the family (or the
 * one problem that "KEY=VALUE" assignments describe; a backward problem given that way without
 * part= gets every pass), the configuration the tuning database holds for that bucket on a GPU
 * of the arch's compute capability (same family and template hash), else the family's default;
 * a configuration valid() refuses is skipped with its reason. Each kernel goes in as a cubin,
 * and as PTX too for the plain (not arch-specific) archs so newer GPUs can fall back on it.
 *
 * The CLI only parses options and prints the events; everything it decides lives here. */
#ifndef LAJIT_GEN_H
#define LAJIT_GEN_H

#include "family.h"

/* What lj_gen_write reports, once per kernel added or problem skipped. */
typedef struct lj_gen_event {
    const char *family, *arch;
    const char *problem; /* lj_problem_format of the problem */
    const char *config;  /* lj_config_format of the configuration */
    const char *skipped; /* non-NULL: valid() refused the configuration, this is why */
    int ptx;             /* added as PTX (else a cubin) */
    int tuned;           /* the configuration is the tuning database's winner */
    size_t size;         /* bytes of the image */
} lj_gen_event;
typedef void (*lj_gen_report_fn)(void *user, const lj_gen_event *event);

typedef struct lj_gen_opts {
    const char *const *families; /* names of the families, at least one */
    int n_families;
    const char *const *archs; /* "sm_80", "sm_90a", ...; at least one */
    int n_archs;
    const char *const *assign; /* "KEY=VALUE" problem fields and parameters (lj_assign_all) */
    size_t n_assign;
    const char *db_path; /* a tune.db file whose winners are used; NULL: defaults only. It must
                            exist: a missing file is LAJIT_ERR_NOT_FOUND, and nothing is ever
                            created for it. */
    int jobs;            /* compile threads (0: lj_kernel_compile_parallel's default) */
    lj_gen_report_fn report;
    void *report_user;
} lj_gen_opts;

/* Counts of what was written. */
typedef struct lj_gen_summary {
    int cubins, ptxs, tuned;
} lj_gen_summary;

/* Writes the bundle at out_path (replaced only when complete: lj_bundle_create's rule) with the
 * kernels the policy above chooses, getting each family through load() (the caller's context
 * loads it; L is the Lua state it was loaded into). On any failure nothing is written (an
 * existing file at out_path stays) and the message is in env. */
typedef lajit_status (*lj_gen_family_fn)(void *user, const char *name, lj_family **out);
lajit_status lj_gen_write(lj_env *env, lj_lua *L, lj_gen_family_fn load, void *load_user,
                          const lj_gen_opts *opts, const char *out_path, lj_gen_summary *out);

#endif
