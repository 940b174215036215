/* nccl_test.h — NCCL for gpu tests: the process's table (device/nccl.h), loaded from where this
 * machine has the library, or the case skipped (exit 77) saying how to point lajit at it. */
#ifndef LAJIT_NCCL_TEST_H
#define LAJIT_NCCL_TEST_H

#include "nccl.h"

/* LAJIT_NCCL_PATH when set; else libnccl.so.2 when the loader finds it; else the nvidia-nccl
 * wheel's copy (site-packages/nvidia/nccl/lib/libnccl.so.2) when python3 can say where it is,
 * put in LAJIT_NCCL_PATH for the rest of the process (and its children). Touches no GPU, so a
 * test may call it before forking ranks. Skips the case when none loads. */
const lj_nccl *lj_test_nccl_or_skip(void);

#endif
