/* nccl.h — NCCL (the collective library every training stack runs on) reached through
 * dlopen("libnccl.so.2"), never linked, exactly as the CUDA driver is (driver.h): a machine
 * without NCCL loads lajit and runs every other op; only the context-parallel ops need it, and
 * they learn here why it is missing (LAJIT_ERR_NO_NCCL, the message naming the path tried).
 *
 * Only what lajit calls is resolved, with the few NCCL types it needs declared here from NCCL's
 * public documentation (nccl.h): a communicator is an opaque pointer, results and data types
 * are C enums (int in the ABI), a stream is a CUstream (the runtime's cudaStream_t is the same
 * handle). LAJIT_NCCL_PATH overrides the library's name or path (tests point it at a missing
 * file, or at the copy a Python wheel installs). The table is loaded once per process; tests
 * substitute one per context (lajit__ctx_set_nccl). */
#ifndef LAJIT_NCCL_H
#define LAJIT_NCCL_H

#include <cuda.h>

#include "core.h"

/* ncclComm_t: NCCL's communicator, opaque. */
typedef struct lj_nccl_comm_opaque *lj_nccl_comm;

/* ncclUniqueId: NCCL_UNIQUE_ID_BYTES (128) opaque bytes that one rank's ncclGetUniqueId makes
 * and every rank hands to ncclCommInitRank, by value as NCCL's prototype takes it. */
#define LJ_NCCL_UNIQUE_ID_BYTES 128
typedef struct lj_nccl_unique_id {
    char internal[LJ_NCCL_UNIQUE_ID_BYTES];
} lj_nccl_unique_id;

/* ncclResult_t values lajit tells apart (NCCL's numbering). */
typedef int lj_nccl_result;
#define LJ_NCCL_SUCCESS     0
#define LJ_NCCL_IN_PROGRESS 7 /* a non-blocking communicator's call still running */

/* ncclDataType_t values used (NCCL's numbering: ncclInt8 0, ncclInt32 2, ncclInt64 4,
 * ncclFloat32 7). */
#define LJ_NCCL_INT8    0
#define LJ_NCCL_INT32   2
#define LJ_NCCL_INT64   4
#define LJ_NCCL_FLOAT32 7

typedef struct lj_nccl {
    lj_nccl_result (*ncclGetVersion)(int *);
    const char *(*ncclGetErrorString)(lj_nccl_result);
    lj_nccl_result (*ncclCommCount)(lj_nccl_comm, int *);
    lj_nccl_result (*ncclCommUserRank)(lj_nccl_comm, int *);
    lj_nccl_result (*ncclCommCuDevice)(lj_nccl_comm, int *);
    /* sendcount elements of datatype from every rank, rank-ordered into recvbuff; in place when
     * sendbuff is recvbuff + rank * sendcount elements. */
    lj_nccl_result (*ncclAllGather)(const void *sendbuff, void *recvbuff, size_t sendcount,
                                    int datatype, lj_nccl_comm, CUstream);
    /* Point-to-point (the log-step exchange): count elements to / from rank peer; a send and a
     * receive issued between ncclGroupStart and ncclGroupEnd proceed together. */
    lj_nccl_result (*ncclSend)(const void *sendbuff, size_t count, int datatype, int peer,
                               lj_nccl_comm, CUstream);
    lj_nccl_result (*ncclRecv)(void *recvbuff, size_t count, int datatype, int peer, lj_nccl_comm,
                               CUstream);
    lj_nccl_result (*ncclGroupStart)(void);
    lj_nccl_result (*ncclGroupEnd)(void);
    /* count elements of root's sendbuff into every rank's recvbuff. */
    lj_nccl_result (*ncclBroadcast)(const void *sendbuff, void *recvbuff, size_t count,
                                    int datatype, int root, lj_nccl_comm, CUstream);
    /* For tests that make their own communicator (one rank per listed device). */
    lj_nccl_result (*ncclCommInitAll)(lj_nccl_comm *, int ndev, const int *devlist);
    lj_nccl_result (*ncclCommDestroy)(lj_nccl_comm);
    /* For the programs that start one process per GPU (lajit_bench --mode cp, the gpu test
     * cp_multi): one rank makes the id, every rank joins with it on its current device. Like
     * ncclCommInitAll, lajit's ops never call them; they are required all the same, since every
     * NCCL 2.x exports them and a library without them is not one lajit can use. */
    lj_nccl_result (*ncclGetUniqueId)(lj_nccl_unique_id *);
    lj_nccl_result (*ncclCommInitRank)(lj_nccl_comm *, int nranks, lj_nccl_unique_id, int rank);
    int version; /* ncclGetVersion's code (e.g. 22703 for 2.27.3), filled by the loader */
} lj_nccl;

/* Loads the process's NCCL table once (thread-safe). LAJIT_ERR_NO_NCCL when the library cannot
 * be opened or lacks an entry point; the message names the path (and LAJIT_NCCL_PATH when it was
 * the override) and dlopen's reason. */
lajit_status lj_nccl_load(lj_env *env, const lj_nccl **out);

/* A failed NCCL call as LAJIT_ERR_NCCL: "what: ncclInvalidArgument (text)". */
lajit_status lj_nccl_error(lj_env *env, const lj_nccl *nccl, lj_nccl_result r, const char *what);

#endif
