/* device.h — one CUDA device as a context uses it: its primary context, its properties in the
 * family's terms (lj_device_info), and modules loaded from cubins. */
#ifndef LAJIT_DEVICE_H
#define LAJIT_DEVICE_H

#include "driver.h"
#include "family.h"

typedef struct lj_device {
    const lj_driver *drv;
    CUdevice dev;
    CUcontext cuctx;      /* retained primary context */
    lj_device_info info;
    int driver_version;
} lj_device;

/* Retains device ordinal's primary context and reads its properties. */
lajit_status lj_device_open(lj_env *env, const lj_driver *drv, int ordinal, lj_device *out);
void lj_device_close(lj_env *env, lj_device *d);

/* Loads an image (cubin or PTX) and finds entry; raises the function's dynamic shared memory
 * limit to smem when above 48 KiB. */
lajit_status lj_module_load(lj_env *env, lj_device *d, const void *image, const char *entry,
                            unsigned smem, CUmodule *module, CUfunction *fn);

#endif
