/* device.h — one CUDA device as a context uses it: its primary context, its properties in the
 * family's terms (lj_device_info), and modules loaded from cubins. */
#ifndef LAJIT_DEVICE_H
#define LAJIT_DEVICE_H

#include "driver.h"
#include "family.h"

typedef struct lj_device {
    const lj_driver *drv;
    CUdevice dev;
    CUcontext cuctx; /* retained primary context */
    lj_device_info info;
    int driver_version;
} lj_device;

/* Retains device ordinal's primary context and reads its properties into *out (written only
 * on success). LAJIT_ERR_NO_DEVICE when the driver has no device of that ordinal; a driver
 * failure leaves nothing retained. Does not make the context current. */
lajit_status lj_device_open(lj_env *env, const lj_driver *drv, int ordinal, lj_device *out);
/* Releases the primary context retained by lj_device_open and clears *d. Accepts a device
 * that was never opened (zeroed). Modules loaded on it must be unloaded first. */
void lj_device_close(lj_env *env, lj_device *d);

/* Makes d's primary context current on the calling thread: cuCtxGetCurrent, and
 * cuCtxSetCurrent only when another context (or none) is current, so the hot path pays one
 * cheap query. Every driver call about d's memory, modules or launches needs this first. */
lajit_status lj_device_make_current(lj_env *env, lj_device *d);

/* Loads an image (cubin or PTX, as cuModuleLoadData takes it) and finds the extern "C"
 * function entry; raises the function's dynamic shared memory limit to smem when above the
 * 48 KiB default (LAJIT_ERR_UNSUPPORTED when smem exceeds the device's opt-in limit). The
 * caller has made d current (lj_device_make_current). On success *module (unloaded by the
 * caller with cuModuleUnload) and *fn are written; on failure nothing stays loaded. An entry
 * missing from the image is LAJIT_ERR_INTERNAL: the family's launch() and its template
 * disagree. */
lajit_status lj_module_load(lj_env *env, lj_device *d, const void *image, const char *entry,
                            unsigned smem, CUmodule *module, CUfunction *fn);

/* A device buffer that only grows: its address and size (0 and 0 when none). */
typedef struct lj_dev_buf {
    CUdeviceptr ptr;
    size_t bytes;
} lj_dev_buf;

/* Makes *buf at least bytes in the current context (what names it in errors): a new allocation
 * when it is smaller (the old one freed first, which waits for the work using it), of whole
 * 16-byte units (lj_round16: buf->bytes says so), so that zeroing in 32-bit words reaches every
 * byte asked for; zeroed on stream when zero is set; unchanged otherwise. On failure *buf is
 * empty, and a driver failure's CUresult is in env->driver_result. The call that grows it
 * allocates: the runtime's ops make it before a graph can capture them (the first call of a
 * shape). */
lajit_status lj_dev_buf_grow(lj_env *env, const lj_driver *drv, lj_dev_buf *buf, size_t bytes,
                             int zero, CUstream stream, const char *what);

#endif
