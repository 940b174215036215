/* status.c — version and status strings (the parts of the API that need no context), and the
 * driver-result query beside lajit_errmsg. */
#include "context.h"
#include "lajit.h"

LAJIT_API unsigned lajit_version(void)
{
    return LAJIT_VERSION_NUMBER;
}

LAJIT_API const char *lajit_version_string(void)
{
    return LAJIT_VERSION_STRING;
}

LAJIT_API const char *lajit_status_string(lajit_status status)
{
    switch (status) {
        case LAJIT_OK: return "ok";
        case LAJIT_ERR_INVALID_ARGUMENT: return "invalid argument";
        case LAJIT_ERR_OUT_OF_MEMORY: return "out of host memory";
        case LAJIT_ERR_NO_DRIVER: return "no CUDA driver";
        case LAJIT_ERR_NO_DEVICE: return "no CUDA device";
        case LAJIT_ERR_DRIVER: return "CUDA driver error";
        case LAJIT_ERR_NO_COMPILER: return "NVRTC not available";
        case LAJIT_ERR_COMPILE: return "kernel compilation failed";
        case LAJIT_ERR_TEMPLATE: return "template or family spec error";
        case LAJIT_ERR_LIMIT: return "template exceeded its limits";
        case LAJIT_ERR_UNSUPPORTED: return "unsupported problem";
        case LAJIT_ERR_IO: return "input/output error";
        case LAJIT_ERR_CACHE: return "cache refused";
        case LAJIT_ERR_DATABASE: return "database error";
        case LAJIT_ERR_STRUCT_SIZE: return "unknown struct_size";
        case LAJIT_ERR_CHECK_FAILED: return "checked mode found bad device-side values";
        case LAJIT_ERR_NOT_FOUND: return "not found";
        case LAJIT_ERR_INTERNAL: return "internal error";
        case LAJIT_ERR_DEVICE_OUT_OF_MEMORY: return "out of device memory";
        case LAJIT_ERR_DEVICE_FAULT: return "a kernel faulted; the CUDA context is unusable";
        case LAJIT_ERR_NO_NCCL: return "NCCL not available";
        case LAJIT_ERR_NCCL: return "NCCL error";
    }
    return "unknown status";
}

LAJIT_API int lajit_last_driver_error(const lajit_ctx *ctx, const char **name)
{
    int r = ctx ? ctx->env.driver_result : 0;
    if (name)
        *name = r ? ctx->env.driver_result_name : "";
    return r;
}
