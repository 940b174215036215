/* nccl.c — the process's NCCL table: libnccl.so.2 opened with dlopen and its entry points found
 * with dlsym, once; the outcome (the table, or a status with its message) is remembered for the
 * life of the process, like the driver's (driver.c).
 *
 * NCCL exports its API under plain C names; ncclGetVersion is called once so that a library too broken to answer is refused here rather than inside an op. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"

#define LJ_NCCL_ENTRY(fn)          \
    {                              \
#fn, offsetof(lj_nccl, fn) \
    }
static const struct {
    const char *name;
    size_t offset;
} entries[] = {
    LJ_NCCL_ENTRY(ncclGetVersion),   LJ_NCCL_ENTRY(ncclGetErrorString),
    LJ_NCCL_ENTRY(ncclCommCount),    LJ_NCCL_ENTRY(ncclCommUserRank),
    LJ_NCCL_ENTRY(ncclCommCuDevice), LJ_NCCL_ENTRY(ncclAllGather),
    LJ_NCCL_ENTRY(ncclSend),         LJ_NCCL_ENTRY(ncclRecv),
    LJ_NCCL_ENTRY(ncclGroupStart),   LJ_NCCL_ENTRY(ncclGroupEnd),
    LJ_NCCL_ENTRY(ncclBroadcast),    LJ_NCCL_ENTRY(ncclCommInitAll),
    LJ_NCCL_ENTRY(ncclCommDestroy),  LJ_NCCL_ENTRY(ncclGetUniqueId),
    LJ_NCCL_ENTRY(ncclCommInitRank),
};
#undef LJ_NCCL_ENTRY

_Static_assert(sizeof entries / sizeof entries[0] * sizeof(void *) == offsetof(lj_nccl, version),
               "every function member of lj_nccl has an entry");

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static lj_nccl table;
static lajit_status load_status;
static char load_message[1024];

static void load(void)
{
    const char *override = getenv("LAJIT_NCCL_PATH");
    const char *path = override && *override ? override : "libnccl.so.2";
    const char *from = override && *override ? " (LAJIT_NCCL_PATH)" : "";
    dlerror();
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        load_status = LAJIT_ERR_NO_NCCL;
        snprintf(load_message, sizeof load_message, "no NCCL: cannot load %s%s: %s", path, from,
                 why ? why : "unknown reason");
        return;
    }
    lj_nccl t;
    memset(&t, 0, sizeof t);
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        void *fn = dlsym(lib, entries[i].name);
        if (!fn) {
            load_status = LAJIT_ERR_NO_NCCL;
            snprintf(load_message, sizeof load_message,
                     "no usable NCCL: %s%s has no %s (NCCL 2.x expected)", path, from,
                     entries[i].name);
            dlclose(lib);
            return;
        }
        memcpy((char *)&t + entries[i].offset, &fn, sizeof fn);
    }
    int version = 0;
    lj_nccl_result r = t.ncclGetVersion(&version);
    if (r != LJ_NCCL_SUCCESS) {
        load_status = LAJIT_ERR_NO_NCCL;
        snprintf(load_message, sizeof load_message, "no usable NCCL: %s%s: ncclGetVersion: %d",
                 path, from, r);
        dlclose(lib);
        return;
    }
    t.version = version;
    /* The library stays open for the life of the process: the table points into it. */
    table = t;
    load_status = LAJIT_OK;
}

lajit_status lj_nccl_load(lj_env *env, const lj_nccl **out)
{
    pthread_once(&load_once, load);
    if (load_status != LAJIT_OK)
        return lj_error(env, load_status, "%s", load_message);
    *out = &table;
    return LAJIT_OK;
}

/* ncclResult_t's names (NCCL's numbering). */
static const char *result_name(lj_nccl_result r)
{
    static const char *const names[] = {
        "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
        "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};
    return r >= 0 && r < (int)(sizeof names / sizeof names[0]) ? names[r] : "ncclResult";
}

lajit_status lj_nccl_error(lj_env *env, const lj_nccl *nccl, lj_nccl_result r, const char *what)
{
    const char *text = nccl && nccl->ncclGetErrorString ? nccl->ncclGetErrorString(r) : NULL;
    return lj_error(env, LAJIT_ERR_NCCL, "%s: %s (%d)%s%s", what, result_name(r), (int)r,
                    text ? ": " : "", text ? text : "");
}
