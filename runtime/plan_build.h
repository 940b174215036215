/* plan_build.h — from a described problem to a launch: the plan of its bucket (built on the first
 * call: family, configuration policy, kernel from the first cache level that has it, module) and
 * the launch itself. Internal to the ops. */
#ifndef LAJIT_PLAN_BUILD_H
#define LAJIT_PLAN_BUILD_H

#include "family.h"
#include "la_params.h"
#include "lajit.h"
#include "plan.h"
#include "roles.h"

/* Finds (hot path: a table probe, no allocation, no Lua) or builds (first call of a bucket) the
 * plan of p with the named family (NULL: the op's defaults) and launches it with lp on stream.
 * *covers (when not NULL) receives the parts of a multi-pass op the kernel also computed (its
 * spec's launch `covers`). Errors name the family and the problem. */
lajit_status lj_op_launch(lajit_ctx *ctx, const char *family, const lj_problem *p,
                          const la_params *lp, void *stream, unsigned *covers);

/* Launches plan's kernel on stream with grid and the kernel parameters params (cuLaunchKernel's
 * form): with programmatic stream serialization (cuLaunchKernelEx) when the spec's launch says
 * pdl, the context's LAJIT_PDL switch is on, the device is cc 9.0 or newer and the driver has
 * cuLaunchKernelEx; with cuLaunchKernel otherwise. The caller has made the device current. No
 * allocation, no Lua. The one launch of lj_op_launch and lajit_launch. */
lajit_status lj_plan_launch(lajit_ctx *ctx, const lj_plan *plan, const unsigned grid[3],
                            void *stream, void **params);

/* The plan of p's bucket with the named family (NULL: the op's defaults): found (a table probe)
 * or built. *out is owned by ctx. */
lajit_status lj_plan_get(lajit_ctx *ctx, const char *family, const lj_problem *p,
                         const lj_plan **out);

/* The passes of op (the backward) as the named family's spec declares them (NULL: the first of
 * the op's default families this build has; they declare the same). Read from the spec on the
 * first call for that family, then a lookup (no Lua, no allocation). *out is owned by ctx. */
lajit_status lj_op_roles(lajit_ctx *ctx, const char *family, lj_op op, const lj_roles **out);

#endif
