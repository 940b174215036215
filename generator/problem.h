/* problem.h — problems and configurations from text ("D=128", "dtype=bf16", "TILE_V=32"), for
 * lajit_expand, the CLI and the tests. */
#ifndef LAJIT_PROBLEM_H
#define LAJIT_PROBLEM_H

#include "family.h"

/* The integer fields of lj_problem (B, H, N, D, E, T, then the flags and part), by index in the
 * struct's order: the i-th one's name (NULL past the last) and where it lives in p. */
const char *lj_problem_field_name(size_t i);
int *lj_problem_field(lj_problem *p, size_t i);

/* Applies one "key=value" to a problem (lower-case keys: the lj_problem fields, dtype,
 * state_dtype and out_dtype as f32/f16/bf16; booleans as 0/1/true/false) or to a configuration (upper-case keys: must be a parameter of the family
 * and one of its candidate values). LAJIT_ERR_INVALID_ARGUMENT with a message naming the key. */
lajit_status lj_assign(lj_env *env, lj_family *f, const char *assignment, lj_problem *p,
                       lj_config *cfg);

/* Whether an assignment sets a configuration parameter (TILE_V=32: upper case, longer than one
 * letter) rather than a problem field (D=128, dtype=bf16). */
int lj_assignment_is_parameter(const char *assignment);

/* Applies assignments in two passes: problem fields first, then the family's default
 * configuration for that problem on dev, then the parameter assignments on top of it. */
lajit_status lj_assign_all(lj_env *env, lj_family *f, const char *const *assignments, size_t n,
                           const lj_device_info *dev, lj_problem *p, lj_config *cfg);

/* "bf16 B=4 H=32 N=8192 D=128 E=128 decay initial final" — a short readable summary; a 16-bit
 * state storage and a mixed output dtype follow as " state=bf16" and " out=bf16". */
void lj_problem_format(const lj_problem *p, char *out, size_t cap);

#endif
