/* args.c — packing a custom family's kernel arguments and checking a kernel against its
 * declaration (args.h). The layout is the one templates/common/args.cuh declares: a tensor is
 * { void *ptr; long long size[R]; long long stride[R]; }, eight-byte fields with no padding, so
 * host and device agree by construction; each parameter starts on an eight-byte boundary of the
 * buffer, which is what cuLaunchKernel copies from (one pointer per parameter). */
#include "args.h"

#include <string.h>

size_t lj_arg_param_bytes(const lj_arg_decl *a)
{
    switch (a->kind) {
        case LJ_ARG_TENSOR:
        case LJ_ARG_WORKSPACE: return 8 + 16 * (size_t)a->rank;
        case LJ_ARG_F32:
        case LJ_ARG_I32: return 4;
        case LJ_ARG_I64: return 8;
    }
    return 0;
}

void lj_args_pack(const lj_args_decl *d, const lj_arg_value *v, lj_packed_args *out)
{
    size_t off = 0;
    for (int i = 0; i < d->n_args; i++) {
        const lj_arg_decl *a = &d->arg[i];
        unsigned char *p = out->buf + off;
        out->params[i] = p;
        switch (a->kind) {
            case LJ_ARG_TENSOR:
            case LJ_ARG_WORKSPACE: {
                size_t r = (size_t)a->rank;
                memcpy(p, &v[i].ptr, 8);
                memcpy(p + 8, v[i].size, 8 * r);
                memcpy(p + 8 + 8 * r, v[i].stride, 8 * r);
                break;
            }
            case LJ_ARG_F32: {
                float f = (float)v[i].f;
                memcpy(p, &f, 4);
                break;
            }
            case LJ_ARG_I32: {
                int x = (int)v[i].i;
                memcpy(p, &x, 4);
                break;
            }
            case LJ_ARG_I64: memcpy(p, &v[i].i, 8); break;
        }
        off += (lj_arg_param_bytes(a) + 7) & ~(size_t)7;
    }
    out->params[d->n_args] = NULL;
}

lajit_status lj_args_check_kernel(lj_env *env, const lj_driver *drv, CUfunction fn,
                                  const lj_args_decl *d, const char *family, const char *entry)
{
    if (!drv->cuFuncGetParamInfo) {
        lj_log(env, LAJIT_LOG_INFO,
               "%s: the driver cannot list kernel parameters (CUDA < 12.4): %s's are not checked "
               "against the declared args",
               family, entry);
        return LAJIT_OK;
    }
    for (int i = 0; i <= d->n_args; i++) {
        size_t off = 0, bytes = 0;
        CUresult r = drv->cuFuncGetParamInfo(fn, (size_t)i, &off, &bytes);
        if (i == d->n_args) {
            if (r == CUDA_SUCCESS)
                return lj_error(env, LAJIT_ERR_TEMPLATE,
                                "%s: kernel %s takes more than the %d parameters its args "
                                "declare",
                                family, entry, d->n_args);
            return LAJIT_OK;
        }
        const lj_arg_decl *a = &d->arg[i];
        size_t want = lj_arg_param_bytes(a);
        if (r != CUDA_SUCCESS)
            return lj_error(env, LAJIT_ERR_TEMPLATE,
                            "%s: kernel %s takes %d parameters; its args declare %d (the last "
                            "missing is %s)",
                            family, entry, i, d->n_args, a->name);
        if (bytes != want)
            return lj_error(env, LAJIT_ERR_TEMPLATE,
                            "%s: kernel %s's parameter %d is %zu bytes; args declares %s, %zu "
                            "bytes (%s)",
                            family, entry, i + 1, bytes, a->name, want,
                            a->kind == LJ_ARG_TENSOR      ? "lj_arg<rank>"
                            : a->kind == LJ_ARG_WORKSPACE ? "a workspace, lj_arg<1>"
                                                          : "a scalar");
    }
    return LAJIT_OK;
}
