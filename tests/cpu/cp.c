/* cp.c — lajit_cp_attn_fwd without a GPU: NCCL absent (the loader's status and message), the
 * argument checks (a fake NCCL table answers the communicator's queries), and the orchestration
 * on the fake driver — the NCCL path's in-place all-gather, and the simulated ranks' sequence of
 * launches and device-to-device copies, with the exchange buffer's layout read back from fake
 * device memory (host memory: the copies really move bytes). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "cp_op.h"
#include "cp_varlen_case.h"
#include "fake_driver.h"
#include "gpu.h"
#include "nvrtc.h"
#include "test.h"

/* ---- A fake NCCL ----------------------------------------------------------------------------- */

static struct {
    int P, rank, device;
    lj_nccl_result count_result, rank_result, gather_result;
    int gathers;
    const void *send;
    void *recv;
    size_t count;
    int dtype;
    CUstream stream;
    /* Point-to-point and broadcast calls, in order: peers (−1 for none), groups, roots. */
    int sends[16], recvs[16], n_sends, n_recvs, groups_open, groups, roots[4], n_bcast;
    size_t p2p_count;
} fn;

static lj_nccl_result f_version(int *v)
{
    *v = 22703;
    return LJ_NCCL_SUCCESS;
}
static const char *f_error_string(lj_nccl_result r)
{
    (void)r;
    return "fake NCCL failure";
}
static lj_nccl_result f_count(lj_nccl_comm c, int *n)
{
    (void)c;
    *n = fn.P;
    return fn.count_result;
}
static lj_nccl_result f_rank(lj_nccl_comm c, int *r)
{
    (void)c;
    *r = fn.rank;
    return fn.rank_result;
}
static lj_nccl_result f_device(lj_nccl_comm c, int *d)
{
    (void)c;
    *d = fn.device;
    return LJ_NCCL_SUCCESS;
}
static lj_nccl_result f_all_gather(const void *send, void *recv, size_t count, int dtype,
                                   lj_nccl_comm c, CUstream s)
{
    (void)c;
    fn.gathers++;
    fn.send = send;
    fn.recv = recv;
    fn.count = count;
    fn.dtype = dtype;
    fn.stream = s;
    return fn.gather_result;
}

static lj_nccl_result f_send(const void *b, size_t count, int dtype, int peer, lj_nccl_comm c,
                             CUstream s)
{
    (void)b, (void)dtype, (void)c, (void)s;
    if (!fn.groups_open || fn.n_sends == 16)
        return 5; /* ncclInvalidUsage: a send outside a group */
    fn.sends[fn.n_sends++] = peer;
    fn.p2p_count = count;
    return LJ_NCCL_SUCCESS;
}
static lj_nccl_result f_recv(void *b, size_t count, int dtype, int peer, lj_nccl_comm c, CUstream s)
{
    (void)b, (void)dtype, (void)c, (void)s;
    if (!fn.groups_open || fn.n_recvs == 16)
        return 5;
    fn.recvs[fn.n_recvs++] = peer;
    fn.p2p_count = count;
    return LJ_NCCL_SUCCESS;
}
static lj_nccl_result f_group_start(void)
{
    fn.groups_open++;
    return LJ_NCCL_SUCCESS;
}
static lj_nccl_result f_group_end(void)
{
    fn.groups_open--;
    fn.groups++;
    return LJ_NCCL_SUCCESS;
}
static lj_nccl_result f_broadcast(const void *send, void *recv, size_t count, int dtype, int root,
                                  lj_nccl_comm c, CUstream s)
{
    (void)send, (void)recv, (void)count, (void)dtype, (void)c, (void)s;
    if (fn.n_bcast < 4)
        fn.roots[fn.n_bcast] = root;
    fn.n_bcast++;
    return LJ_NCCL_SUCCESS;
}

static const lj_nccl fake_nccl = {
    .ncclGetVersion = f_version,
    .ncclGetErrorString = f_error_string,
    .ncclCommCount = f_count,
    .ncclCommUserRank = f_rank,
    .ncclCommCuDevice = f_device,
    .ncclAllGather = f_all_gather,
    .ncclSend = f_send,
    .ncclRecv = f_recv,
    .ncclGroupStart = f_group_start,
    .ncclGroupEnd = f_group_end,
    .ncclBroadcast = f_broadcast,
    .version = 22703,
};

static void fake_nccl_reset(int P, int rank)
{
    memset(&fn, 0, sizeof fn);
    fn.P = P;
    fn.rank = rank;
}

/* ---- Calls ------------------------------------------------------------------------------------ */

enum { B = 1, H = 2, D = 64, E = 64, MAXP = 4 };

static lajit_ctx *fake_ctx(void)
{
    lajit_ctx_desc desc;
    lajit_ctx_desc_init(&desc);
    desc.flags = LAJIT_CTX_NO_DISK_CACHE;
    desc.autotune = LAJIT_AUTOTUNE_OFF;
    lajit_ctx *ctx;
    ASSERT_OK(lajit_ctx_create(&desc, &ctx));
    lajit__ctx_set_driver(ctx, lj_fake_driver());
    lajit__ctx_set_nccl(ctx, &fake_nccl);
    return ctx;
}

/* One rank's tensors in fake device memory: bf16 q, k, v, o of n tokens, s, both states. */
typedef struct rank_views {
    CUdeviceptr q, k, v, o, s, s0, sn;
    lj_test_tensor tq, tk, tv, to, ts, ts0, tsn;
    lajit_cp_attn_fwd_args a;
} rank_views;

static CUcontext cuctx;

static void fake_device(void)
{
    const lj_driver *drv = lj_fake_driver();
    CUdevice dev;
    ASSERT_EQ(drv->cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuDevicePrimaryCtxRetain(&cuctx, dev), CUDA_SUCCESS);
    ASSERT_EQ(drv->cuCtxSetCurrent(cuctx), CUDA_SUCCESS);
}

static CUdeviceptr alloc(size_t bytes)
{
    CUdeviceptr p;
    ASSERT_EQ(lj_fake_driver()->cuMemAlloc(&p, bytes ? bytes : 16), CUDA_SUCCESS);
    memset((void *)(uintptr_t)p, 0, bytes ? bytes : 16);
    return p;
}

static void rank_open(rank_views *u, int n)
{
    memset(u, 0, sizeof *u);
    const DLDataType bf16 = lj_test_dl_dtype(LJ_BF16), f32 = lj_test_dl_dtype(LJ_F32);
    const int64_t qs[4] = {B, H, n, D}, vs[4] = {B, H, n, E}, ss[4] = {B, H, D, E}, hs[1] = {H};
    u->q = alloc((size_t)B * H * n * D * 2);
    u->k = alloc((size_t)B * H * n * D * 2);
    u->v = alloc((size_t)B * H * n * E * 2);
    u->o = alloc((size_t)B * H * n * E * 2);
    u->s = alloc(H * 4);
    u->s0 = alloc((size_t)B * H * D * E * 4);
    u->sn = alloc((size_t)B * H * D * E * 4);
    float *s = (float *)(uintptr_t)u->s;
    for (int h = 0; h < H; h++)
        s[h] = 0.5f * (float)(h + 1);
    u->a.struct_size = sizeof u->a;
    u->a.comm = (void *)&fn; /* any non-NULL pointer: the fake NCCL does not read it */
    u->a.q = lj_gpu_tensor(&u->tq, u->q, 0, 4, qs, NULL, bf16);
    u->a.k = lj_gpu_tensor(&u->tk, u->k, 0, 4, qs, NULL, bf16);
    u->a.v = lj_gpu_tensor(&u->tv, u->v, 0, 4, vs, NULL, bf16);
    u->a.o = lj_gpu_tensor(&u->to, u->o, 0, 4, vs, NULL, bf16);
    u->a.s = lj_gpu_tensor(&u->ts, u->s, 0, 1, hs, NULL, f32);
    u->a.initial_state = lj_gpu_tensor(&u->ts0, u->s0, 0, 4, ss, NULL, f32);
    u->a.final_state = lj_gpu_tensor(&u->tsn, u->sn, 0, 4, ss, NULL, f32);
    u->a.scale = 1.0f;
}

/* Ranks 0..P-1 with n[r] tokens each, and their call arguments with these flags. */
static void ranks_open(rank_views *u, lajit_cp_attn_fwd_args *a, int P, const int *n,
                       uint32_t flags)
{
    for (int r = 0; r < P; r++) {
        rank_open(&u[r], n[r]);
        a[r] = u[r].a;
        a[r].flags = flags;
    }
}

static void rank_close(rank_views *u)
{
    const lj_driver *drv = lj_fake_driver();
    CUdeviceptr p[7] = {u->q, u->k, u->v, u->o, u->s, u->s0, u->sn};
    for (int i = 0; i < 7; i++)
        drv->cuMemFree(p[i]);
}

static void need_nvrtc(void)
{
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    int major, minor;
    if (lj_nvrtc_version(&env, &major, &minor) != LAJIT_OK)
        lj_test_skip("NVRTC not available");
}

#define SLOT      ((size_t)B * H * D * E * 4 + 16) /* the exchange buffer's bytes per rank */
#define STATE_F32 ((size_t)B * H * D * E)

/* ---- Tests ------------------------------------------------------------------------------------ */

/* No NCCL: LAJIT_ERR_NO_NCCL naming the path tried and the variable; the next call says the same,
 * and nothing else in the context is affected (a state scan's argument error is its own). */
LJ_TEST(nccl_missing)
{
    const char *path = "/nonexistent/lajit-test/libnccl.so.2";
    setenv("LAJIT_NCCL_PATH", path, 1);
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    const lj_nccl *nccl = NULL;
    ASSERT_STATUS(lj_nccl_load(&env, &nccl), LAJIT_ERR_NO_NCCL);
    ASSERT_TRUE(nccl == NULL);
    ASSERT_CONTAINS(env.errmsg, path);
    ASSERT_CONTAINS(env.errmsg, "LAJIT_NCCL_PATH");

    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx();
    lajit__ctx_set_nccl(ctx, NULL); /* the process's loader */
    rank_views u;
    rank_open(&u, 4);
    for (int i = 0; i < 2; i++) {
        ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &u.a), LAJIT_ERR_NO_NCCL);
        ASSERT_CONTAINS(lajit_errmsg(ctx), "no NCCL: cannot load /nonexistent/lajit-test");
    }
    ASSERT_STREQ(lajit_status_string(LAJIT_ERR_NO_NCCL), "NCCL not available");
    ASSERT_EQ(lj_fake_launch_count(), 0);
    lajit_attn_state_scan_args sc;
    memset(&sc, 0, sizeof sc);
    sc.struct_size = sizeof sc;
    ASSERT_STATUS(lajit_attn_state_scan(ctx, &sc), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "local_states");
    rank_close(&u);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* Each bad argument is its own status and message, before anything is launched or allocated. */
LJ_TEST(argument_errors)
{
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx();
    rank_views u;
    rank_open(&u, 4);
    lajit_cp_attn_fwd_args a;
    fake_nccl_reset(2, 0);

    ASSERT_STATUS(lajit_cp_attn_fwd(NULL, &u.a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, NULL), LAJIT_ERR_INVALID_ARGUMENT);
    a = u.a;
    a.struct_size--;
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_STRUCT_SIZE);
    a = u.a;
    a.flags = 0x4;
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    a = u.a;
    a.scale = 0;
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    a = u.a;
    a.comm = NULL;
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "comm is NULL");

    /* The communicator's queries. */
    fn.count_result = 4; /* ncclInvalidArgument */
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &u.a), LAJIT_ERR_NCCL);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "ncclCommCount");
    ASSERT_CONTAINS(lajit_errmsg(ctx), "ncclInvalidArgument (4): fake NCCL failure");
    ASSERT_STREQ(lajit_status_string(LAJIT_ERR_NCCL), "NCCL error");
    fake_nccl_reset(2, 0);
    fn.rank_result = 5;
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &u.a), LAJIT_ERR_NCCL);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "ncclCommUserRank: ncclInvalidUsage");
    fake_nccl_reset(2, 2);
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &u.a), LAJIT_ERR_NCCL);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "rank 2 of 2");
    fake_nccl_reset(2, 0);
    fn.device = 1;
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &u.a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "on CUDA device 1, the context on 0");
    fake_nccl_reset(2, 0);

    /* Tensors. */
    a = u.a;
    a.cu_seqlens = u.a.s;
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "q must be [T, H, D] (this rank's packed tokens, varlen)");
    a = u.a;
    a.q = NULL;
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "q, k, v and o are required");
    lj_test_tensor t;
    const DLDataType bf16 = lj_test_dl_dtype(LJ_BF16), f32 = lj_test_dl_dtype(LJ_F32);
    a = u.a;
    a.q = lj_gpu_tensor(&t, u.q, 0, 4, (const int64_t[]){B, H, 3, D}, NULL, bf16);
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "q is [1, 2, 3, 64]; k and v make it [1, 2, 4, 64]");
    a = u.a;
    a.o = lj_gpu_tensor(&t, u.o, 0, 4, (const int64_t[]){B, H, 4, 32}, NULL, bf16);
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "o is [1, 2, 4, 32]");
    a = u.a;
    a.v = lj_gpu_tensor(&t, u.v, 0, 3, (const int64_t[]){B, H, 4}, NULL, bf16);
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "v must be [B, H, N, E]");
    a = u.a;
    a.final_state = lj_gpu_tensor(&t, u.sn, 0, 4, (const int64_t[]){B, H, D, 32}, NULL, f32);
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "final_state must be [B, H, D, E] = [1, 2, 64, 64]");
    a = u.a;
    a.flags = LAJIT_STATE_VK;
    a.final_state = lj_gpu_tensor(&t, u.sn, 0, 4, (const int64_t[]){B, H, D, 32}, NULL, f32);
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "final_state must be [B, H, E, D]");
    a = u.a;
    a.final_state = lj_gpu_tensor(&t, u.sn, 0, 4, (const int64_t[]){B, H, D, E}, NULL, bf16);
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "final_state is bfloat16; context parallelism keeps states "
                                       "in float32");
    /* initial_state is rank 0's: checked there, not read elsewhere. */
    a = u.a;
    a.initial_state = lj_gpu_tensor(&t, u.s0, 0, 4, (const int64_t[]){B, 3, D, E}, NULL, f32);
    lj_test_tensor t2;
    a.final_state = lj_gpu_tensor(&t2, u.sn, 0, 4, (const int64_t[]){B, H, D, 7}, NULL, f32);
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "initial_state must be");
    fake_nccl_reset(2, 1);
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "final_state must be");

    /* The simulated ranks' own checks. */
    lajit_cp_attn_fwd_args two[2] = {u.a, u.a};
    ASSERT_STATUS(lajit__cp_attn_fwd_sim(ctx, 0, two), LAJIT_ERR_INVALID_ARGUMENT);
    two[1].stream = (void *)&t;
    ASSERT_STATUS(lajit__cp_attn_fwd_sim(ctx, 2, two), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "one stream");
    two[1] = u.a;
    two[1].v = lj_gpu_tensor(&t, u.v, 0, 4, (const int64_t[]){B, H, 4, 128}, NULL, bf16);
    lj_test_tensor t3;
    two[1].o = lj_gpu_tensor(&t3, u.o, 0, 4, (const int64_t[]){B, H, 4, 128}, NULL, bf16);
    two[1].initial_state = two[1].final_state = NULL;
    ASSERT_STATUS(lajit__cp_attn_fwd_sim(ctx, 2, two), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "rank 1's B, H, D, E or flags differ");

    ASSERT_EQ(lj_fake_launch_count(), 0);
    ASSERT_EQ(lj_fake_driver_counts()->allocs, 7);
    ASSERT_EQ(fn.gathers, 0);
    rank_close(&u);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* The NCCL path of a rank with no tokens needs no kernel: its length and zero state go into its
 * slot, and the all-gather is in place (send = recv + rank · slot), slot/4 floats, on the
 * caller's stream. The buffer is allocated once; a non-blocking communicator is refused. */
LJ_TEST(nccl_path_in_place_gather)
{
    need_nvrtc();
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx();
    rank_views u;
    rank_open(&u, 0);
    u.a.final_state = NULL;
    CUstream stream;
    ASSERT_EQ(lj_fake_driver()->cuStreamCreate(&stream, 0), CUDA_SUCCESS);
    u.a.stream = stream;
    fake_nccl_reset(3, 1);
    ASSERT_OK(lajit_cp_attn_fwd(ctx, &u.a));
    /* Rank 1 of 3 scans the gathered slots (a launch), then writes no outputs (no tokens). */
    ASSERT_EQ(fn.gathers, 1);
    ASSERT_EQ(lj_fake_launch_count(), 1);
    ASSERT_STREQ(lj_fake_launch_get(0)->entry, "la_state_scan");
    ASSERT_EQ(fn.count, SLOT / 4);
    ASSERT_EQ(fn.dtype, LJ_NCCL_FLOAT32);
    ASSERT_TRUE(fn.stream == stream);
    ASSERT_TRUE((const char *)fn.send == (char *)fn.recv + SLOT);
    ASSERT_TRUE((CUdeviceptr)(uintptr_t)fn.recv == ctx->cp_ws.ptr);
    const char *slot1 = (const char *)fn.send;
    int64_t n = -1;
    memcpy(&n, slot1 + SLOT - 16, 8);
    ASSERT_EQ(n, 0);
    for (size_t i = 0; i < STATE_F32; i++)
        ASSERT_TRUE(((const float *)slot1)[i] == 0.0f);
    int allocs = lj_fake_driver_counts()->allocs;
    fake_nccl_reset(3, 0); /* rank 0 without final_state: no scan, no launch */
    ASSERT_OK(lajit_cp_attn_fwd(ctx, &u.a));
    ASSERT_EQ(fn.gathers, 1);
    ASSERT_TRUE(fn.send == fn.recv);
    ASSERT_EQ(lj_fake_launch_count(), 1);
    ASSERT_EQ(lj_fake_driver_counts()->allocs, allocs);
    fn.gather_result = LJ_NCCL_IN_PROGRESS;
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &u.a), LAJIT_ERR_NCCL);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "non-blocking");
    fn.gather_result = 2;
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &u.a), LAJIT_ERR_NCCL);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "ncclAllGather of the span states: ncclSystemError");
    ASSERT_EQ(lj_fake_driver()->cuStreamDestroy(stream), CUDA_SUCCESS);
    rank_close(&u);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* Simulated ranks on the fake driver (kernels compiled by NVRTC for the fake sm_90): spans of
 * 3, 0 and 2 tokens, S_0 and S_N. Every rank's local state first (rank 1's empty span: no
 * launch), then per rank the P − 1 copies, the scan and (tokens permitting) the outputs; after
 * it every rank's buffer holds every rank's length. */
LJ_TEST(simulated_ranks_sequence)
{
    need_nvrtc();
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx();
    enum { P = 3 };
    const int n[P] = {3, 0, 2};
    rank_views u[P];
    lajit_cp_attn_fwd_args a[P];
    for (int r = 0; r < P; r++) {
        rank_open(&u[r], n[r]);
        a[r] = u[r].a;
        if (r > 0)
            a[r].initial_state = NULL;
    }
    lajit_status st = lajit__cp_attn_fwd_sim(ctx, P, a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(st), lajit_errmsg(ctx));

    /* Local states: ranks 0 and 2 launch (state only), rank 1 does not. Then the exchange's
     * round: every rank's two copies before any rank's scan (as real ranks see it), the three
     * scans (rank 0's too: S_N is wanted), and the outputs where there are tokens (ranks 0, 2). */
    static const char *const want[] = {"la_fwd_sm90",   "la_fwd_sm90",   "la_state_scan",
                                       "la_state_scan", "la_state_scan", "la_fwd_sm90",
                                       "la_fwd_sm90"};
    static const int copies_after[6] = {2, 2, 2, 2, 2, 2};
    ASSERT_EQ(lj_fake_launch_count(), 7);
    for (int i = 0; i < 7; i++)
        ASSERT_STREQ(lj_fake_launch_get(i)->entry, want[i]);
    ASSERT_EQ(lj_fake_driver_counts()->dtod_copies, 6);
    for (int i = 0; i < 6; i++)
        ASSERT_EQ(lj_fake_copy_get(i)->after_launches, copies_after[i]);
    const size_t each = ((SLOT * P + 15) / 16 * 16) + STATE_F32 * 4 * P;
    /* Rank r's copies: slots j != r from rank j's buffer into its own. */
    for (int i = 0, r = 0; r < P; r++) {
        for (int j = 0; j < P; j++) {
            if (j == r)
                continue;
            const lj_fake_copy *c = lj_fake_copy_get(i++);
            ASSERT_EQ(c->bytes, SLOT);
            ASSERT_EQ(c->dst, ctx->cp_ws.ptr + (CUdeviceptr)(r * each + j * SLOT));
            ASSERT_EQ(c->src, ctx->cp_ws.ptr + (CUdeviceptr)(j * each + j * SLOT));
        }
    }
    /* Each scan reads its rank's gathered states: a [P, B, H, D, E] view of stride SLOT/4. */
    static const int scan_of[P] = {2, 3, 4};
    for (int r = 0; r < P; r++) {
        long long first[11];
        memcpy(first, &lj_fake_launch_get(scan_of[r])->params, sizeof first);
        ASSERT_EQ((unsigned long long)first[0], (unsigned long long)(ctx->cp_ws.ptr + r * each));
        ASSERT_EQ(first[1], P);
        ASSERT_EQ(first[6], (long long)(SLOT / 4));
    }
    /* Every simulated rank's buffer: P slots with the lengths 3, 0, 2. */
    for (int r = 0; r < P; r++) {
        const char *buf = (const char *)(uintptr_t)(ctx->cp_ws.ptr + (CUdeviceptr)r * each);
        for (int j = 0; j < P; j++) {
            int64_t len = -1;
            memcpy(&len, buf + (size_t)j * SLOT + SLOT - 16, 8);
            ASSERT_EQ(len, n[j]);
        }
        const float *m1 = (const float *)(buf + SLOT);
        for (size_t i = 0; i < STATE_F32; i++)
            ASSERT_TRUE(m1[i] == 0.0f);
    }
    for (int r = 0; r < P; r++)
        rank_close(&u[r]);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* Every driver call of one forward call over the simulated ranks made to fail in turn (ctx warm:
 * compiled, the workspace sized): each failure a status naming the op, and the next call served.
 * Returns how many driver calls the call makes. */
static uint64_t fwd_fails_each_driver_call(lajit_ctx *ctx, int P, lajit_cp_attn_fwd_args *a)
{
    lj_env *env = lajit__ctx_env(ctx);
    const uint64_t c0 = env->fault_count[LJ_FAULT_DRIVER];
    ASSERT_OK(lajit__cp_attn_fwd_sim(ctx, P, a));
    const uint64_t calls = env->fault_count[LJ_FAULT_DRIVER] - c0;
    for (uint64_t k = 1; k <= calls; k++) {
        env->fault_at[LJ_FAULT_DRIVER] = env->fault_count[LJ_FAULT_DRIVER] + k;
        lajit_status st = lajit__cp_attn_fwd_sim(ctx, P, a);
        env->fault_at[LJ_FAULT_DRIVER] = 0;
        if (st == LAJIT_OK)
            lj_test_fail(__FILE__, __LINE__, "driver call %llu of %llu failed, the call passed",
                         (unsigned long long)k, (unsigned long long)calls);
        ASSERT_CONTAINS(lajit_errmsg(ctx), "lajit_cp_attn_fwd");
        ASSERT_OK(lajit__cp_attn_fwd_sim(ctx, P, a));
    }
    printf("%llu driver calls failed in turn\n", (unsigned long long)calls);
    return calls;
}

/* Every driver call of a warm simulated call failed in turn (fault injection): each failure is a
 * status with a message naming the step, never a crash, and the context serves the next call. */
LJ_TEST(driver_failures_each_a_status)
{
    need_nvrtc();
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx();
    enum { P = 3 };
    const int n[P] = {3, 0, 2};
    rank_views u[P];
    lajit_cp_attn_fwd_args a[P];
    ranks_open(u, a, P, n, 0);
    ASSERT_OK(lajit__cp_attn_fwd_sim(ctx, P, a)); /* compiles, sizes the workspace */
    const uint64_t calls = fwd_fails_each_driver_call(ctx, P, a);
    /* At least: 2 length memsets per rank, rank 1's zero state, 6 copies, 7 launches. */
    ASSERT_TRUE(calls >= 2 * P + 1 + 6 + 7);
    for (int r = 0; r < P; r++)
        rank_close(&u[r]);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* ---- The backward ------------------------------------------------------------------------------ */

/* A rank's backward arguments over rank_views u (its o as dout, q/k/v's twins as dq/dk/dv). */
typedef struct bwd_views {
    CUdeviceptr dq, dk, dv, ds, ds0;
    lj_test_tensor tdo, tdq, tdk, tdv, tds, tds0;
    lajit_cp_attn_bwd_args a;
} bwd_views;

static void bwd_open(bwd_views *w, rank_views *u, int n)
{
    memset(w, 0, sizeof *w);
    const DLDataType bf16 = lj_test_dl_dtype(LJ_BF16), f32 = lj_test_dl_dtype(LJ_F32);
    const int64_t qs[4] = {B, H, n, D}, vs[4] = {B, H, n, E}, ss[4] = {B, H, D, E}, hs[1] = {H};
    w->dq = alloc((size_t)B * H * n * D * 2);
    w->dk = alloc((size_t)B * H * n * D * 2);
    w->dv = alloc((size_t)B * H * n * E * 2);
    w->ds = alloc(H * 4);
    w->ds0 = alloc((size_t)B * H * D * E * 4);
    lajit_cp_attn_bwd_args *a = &w->a;
    a->struct_size = sizeof *a;
    a->comm = u->a.comm;
    a->q = u->a.q;
    a->k = u->a.k;
    a->v = u->a.v;
    a->dout = lj_gpu_tensor(&w->tdo, u->o, 0, 4, vs, NULL, bf16);
    a->dq = lj_gpu_tensor(&w->tdq, w->dq, 0, 4, qs, NULL, bf16);
    a->dk = lj_gpu_tensor(&w->tdk, w->dk, 0, 4, qs, NULL, bf16);
    a->dv = lj_gpu_tensor(&w->tdv, w->dv, 0, 4, vs, NULL, bf16);
    a->s = u->a.s;
    a->ds = lj_gpu_tensor(&w->tds, w->ds, 0, 1, hs, NULL, f32);
    a->scale = 1.0f;
    a->initial_state = u->a.initial_state;
    a->d_initial_state = lj_gpu_tensor(&w->tds0, w->ds0, 0, 4, ss, NULL, f32);
    a->d_final_state = u->a.final_state;
}

static void bwd_close(bwd_views *w)
{
    const lj_driver *drv = lj_fake_driver();
    CUdeviceptr p[5] = {w->dq, w->dk, w->dv, w->ds, w->ds0};
    for (int i = 0; i < 5; i++)
        drv->cuMemFree(p[i]);
}

/* The number of launches of `entry` among the fake driver's, from the from-th on. */
static int launches_since(const char *entry, int from)
{
    int n = 0;
    for (int i = from; i < lj_fake_launch_count(); i++)
        n += strcmp(lj_fake_launch_get(i)->entry, entry) == 0;
    return n;
}

static int launches_of(const char *entry)
{
    return launches_since(entry, 0);
}

/* lajit_attn_bwd with dq, dk and dv NULL runs the one pass that writes a state (dv's, for dS_0)
 * without outputs: one launch, of a state-only kernel; it needs d_initial_state and refuses ds. */
LJ_TEST(bwd_state_only_is_one_pass)
{
    need_nvrtc();
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx();
    rank_views u;
    bwd_views w;
    rank_open(&u, 5);
    bwd_open(&w, &u, 5);
    lajit_attn_bwd_args b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.q = w.a.q;
    b.dout = w.a.dout;
    b.s = w.a.s;
    b.scale = 1.0f;
    b.d_final_state = w.a.d_final_state;
    ASSERT_STATUS(lajit_attn_bwd(ctx, &b), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "only d_initial_state can be computed");
    b.d_initial_state = w.a.d_initial_state;
    b.ds = w.a.ds;
    ASSERT_STATUS(lajit_attn_bwd(ctx, &b), LAJIT_ERR_INVALID_ARGUMENT);
    b.ds = NULL;
    b.q = NULL;
    ASSERT_STATUS(lajit_attn_bwd(ctx, &b), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "q and dout are required");
    ASSERT_EQ(lj_fake_launch_count(), 0);
    b.q = w.a.q;
    ASSERT_OK(lajit_attn_bwd(ctx, &b));
    ASSERT_EQ(lj_fake_launch_count(), 1);
    /* Its plan: the dv pass (part 1), state only, writing a state. */
    const lj_plan *plan = NULL;
    for (unsigned i = 0; i < ctx->plans.cap && !plan; i++)
        if (ctx->plans.slots[i].key.D && ctx->plans.slots[i].key.op == LJ_OP_BWD)
            plan = &ctx->plans.slots[i];
    ASSERT_TRUE(plan != NULL);
    ASSERT_EQ(ctx->plans.count, 1);
    ASSERT_EQ(plan->key.part, 1);
    ASSERT_EQ(plan->key.flags2, LJ_PLAN_FLAG2_STATE_ONLY);
    ASSERT_TRUE(plan->key.flags & LJ_PLAN_FLAG_FINAL);
    bwd_close(&w);
    rank_close(&u);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* Simulated ranks' backward on the fake driver, spans of 3, 0 and 2 tokens, S_0, dS_N and ds:
 * the forward's local states (ranks 0 and 2) and scans (ranks 1 and 2); the local gradient
 * states (ranks 0 and 2, one kernel each); the reverse scans (ranks 0 and 1: the last rank's H is
 * dS_N); the spans' backward (ranks 0 and 2); ds's parts summed by one scan per rank and copied
 * out. Every rank's ds slot ends holding every rank's part. */
LJ_TEST(bwd_simulated_ranks_sequence)
{
    need_nvrtc();
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx();
    enum { P = 3 };
    const int n[P] = {3, 0, 2};
    rank_views u[P];
    bwd_views w[P];
    lajit_cp_attn_bwd_args a[P];
    for (int r = 0; r < P; r++) {
        rank_open(&u[r], n[r]);
        bwd_open(&w[r], &u[r], n[r]);
        a[r] = w[r].a;
    }
    lajit_status st = lajit__cp_attn_bwd_sim(ctx, P, a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(st), lajit_errmsg(ctx));
    /* la_bwd_sm90's passes are la_fwd_sm90's kernel. In order: the local states (ranks 0, 2),
     * the forward scans (ranks 1, 2: rank 0's incoming state is S_0), the local gradient states
     * (ranks 0, 2: one kernel each), the reverse scans (ranks 0, 1: the last rank's H is dS_N),
     * rank 0's three passes (dq with ds, dv, dk) and rank 2's (rank 1 has no tokens), the three
     * sums of ds. */
    static const char *const want[] = {
        "la_fwd_sm90",   "la_fwd_sm90",   "la_state_scan", "la_state_scan", "la_fwd_sm90",
        "la_fwd_sm90",   "la_state_scan", "la_state_scan", "la_fwd_sm90",   "la_fwd_sm90",
        "la_fwd_sm90",   "la_fwd_sm90",   "la_fwd_sm90",   "la_fwd_sm90",   "la_state_scan",
        "la_state_scan", "la_state_scan"};
    ASSERT_EQ(lj_fake_launch_count(), (int)(sizeof want / sizeof want[0]));
    for (int i = 0; i < lj_fake_launch_count(); i++)
        ASSERT_STREQ(lj_fake_launch_get(i)->entry, want[i]);
    ASSERT_EQ(launches_of("la_state_scan"), 7);
    /* Copies: two exchanges of states and one of ds's parts (P − 1 = 2 per rank each), and each
     * rank's ds out of its sum. */
    ASSERT_EQ(lj_fake_driver_counts()->dtod_copies, 3 * 2 * 3 + 3);
    ASSERT_EQ(fn.gathers, 0);
    for (int r = 0; r < P; r++) {
        bwd_close(&w[r]);
        rank_close(&u[r]);
    }
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* The backward's own checks, each its status and message before anything runs. */
LJ_TEST(bwd_argument_errors)
{
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx();
    rank_views u;
    bwd_views w;
    rank_open(&u, 4);
    bwd_open(&w, &u, 4);
    fake_nccl_reset(2, 0);
    lajit_cp_attn_bwd_args a;
    ASSERT_STATUS(lajit_cp_attn_bwd(NULL, &w.a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_STATUS(lajit_cp_attn_bwd(ctx, NULL), LAJIT_ERR_INVALID_ARGUMENT);
    a = w.a;
    a.struct_size--;
    ASSERT_STATUS(lajit_cp_attn_bwd(ctx, &a), LAJIT_ERR_STRUCT_SIZE);
    a = w.a;
    a.comm = NULL;
    ASSERT_STATUS(lajit_cp_attn_bwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "lajit_cp_attn_bwd: comm is NULL");
    a = w.a;
    a.dk = NULL;
    ASSERT_STATUS(lajit_cp_attn_bwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "q, k, v, dout, dq, dk and dv are required");
    lj_test_tensor t;
    const DLDataType bf16 = lj_test_dl_dtype(LJ_BF16), f32 = lj_test_dl_dtype(LJ_F32);
    a = w.a;
    a.dv = lj_gpu_tensor(&t, w.dv, 0, 4, (const int64_t[]){B, H, 4, 32}, NULL, bf16);
    ASSERT_STATUS(lajit_cp_attn_bwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "dv is [1, 2, 4, 32]");
    a = w.a;
    a.s = NULL;
    ASSERT_STATUS(lajit_cp_attn_bwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "ds (the gradient of s) needs s");
    a = w.a;
    a.ds = lj_gpu_tensor(&t, w.ds, 0, 1, (const int64_t[]){H + 1}, NULL, f32);
    ASSERT_STATUS(lajit_cp_attn_bwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "ds must be float32 [H] = [2], contiguous");
    a = w.a;
    a.d_initial_state = lj_gpu_tensor(&t, w.ds0, 0, 4, (const int64_t[]){B, H, D, 3}, NULL, f32);
    ASSERT_STATUS(lajit_cp_attn_bwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "d_initial_state must be");
    fake_nccl_reset(2, 1); /* rank 1 of 2, the last: it reads dS_N (and ignores dS_0) */
    a = w.a;
    a.d_final_state = lj_gpu_tensor(&t, w.ds0, 0, 4, (const int64_t[]){B, H, D, 3}, NULL, f32);
    ASSERT_STATUS(lajit_cp_attn_bwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "d_final_state must be");
    lajit_cp_attn_bwd_args two[2] = {w.a, w.a};
    two[1].ds = NULL;
    ASSERT_STATUS(lajit__cp_attn_bwd_sim(ctx, 2, two), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "ds is given by some ranks and not others");
    bwd_close(&w);
    rank_close(&u);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* ---- The forward's incoming state, kept for the backward -------------------------------------- */

/* incoming_state: float32 of the state's shape, contiguous, in the forward and the backward; the
 * simulated ranks refuse a backward where some ranks give it and others not (the exchange it
 * skips is a collective); a struct_size ending before the field is accepted and reads no field. */
LJ_TEST(incoming_state_argument_errors)
{
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx();
    rank_views u;
    bwd_views w;
    rank_open(&u, 4);
    bwd_open(&w, &u, 4);
    CUdeviceptr in = alloc((size_t)B * H * D * E * 4);
    lj_test_tensor t;
    const DLDataType bf16 = lj_test_dl_dtype(LJ_BF16), f32 = lj_test_dl_dtype(LJ_F32);
    const int64_t ss[4] = {B, H, D, E}, strided[4] = {1, D * E, 1, D};
    fake_nccl_reset(2, 1);
    lajit_cp_attn_fwd_args f = u.a;
    f.incoming_state = lj_gpu_tensor(&t, in, 0, 4, (const int64_t[]){B, H, D, 32}, NULL, f32);
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &f), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "lajit_cp_attn_fwd: incoming_state must be [B, H, D, E]");
    f.incoming_state = lj_gpu_tensor(&t, in, 0, 4, ss, NULL, bf16);
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &f), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "incoming_state is bfloat16; context parallelism keeps");
    f.incoming_state = lj_gpu_tensor(&t, in, 0, 4, ss, strided, f32);
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &f), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "lajit_cp_attn_fwd: incoming_state must be contiguous");
    f.incoming_state = lj_gpu_tensor(&t, in, 0, 4, ss, NULL, f32);
    t.t.device.device_type = kDLCPU; /* used by address: host memory is refused */
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &f), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "incoming_state must be CUDA device memory");
    t.t.device.device_type = kDLCUDA;
    t.t.device.device_id = 1;
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &f), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "incoming_state is on CUDA device 1");
    lajit_cp_attn_bwd_args b = w.a;
    b.incoming_state = lj_gpu_tensor(&t, in, 0, 4, (const int64_t[]){B, H + 1, D, E}, NULL, f32);
    ASSERT_STATUS(lajit_cp_attn_bwd(ctx, &b), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "lajit_cp_attn_bwd: incoming_state must be [B, H, D, E]");
    b.incoming_state = lj_gpu_tensor(&t, in, 0, 4, ss, strided, f32);
    ASSERT_STATUS(lajit_cp_attn_bwd(ctx, &b), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "lajit_cp_attn_bwd: incoming_state must be contiguous");
    lj_test_tensor t2;
    lajit_cp_attn_bwd_args two[2] = {w.a, w.a};
    two[1].incoming_state = lj_gpu_tensor(&t2, in, 0, 4, ss, NULL, f32);
    ASSERT_STATUS(lajit__cp_attn_bwd_sim(ctx, 2, two), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "incoming_state is given by some ranks and not others");
    /* The struct as it was before incoming_state: accepted, the field not read (a bad one would
     * be refused above); the next check (comm) answers. A size in between is refused. */
    f = u.a;
    f.incoming_state = lj_gpu_tensor(&t, in, 0, 4, ss, NULL, bf16);
    f.comm = NULL;
    f.struct_size = offsetof(lajit_cp_attn_fwd_args, incoming_state);
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &f), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "lajit_cp_attn_fwd: comm is NULL");
    f.struct_size = offsetof(lajit_cp_attn_fwd_args, incoming_state) + 4;
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &f), LAJIT_ERR_STRUCT_SIZE);
    b = w.a;
    b.incoming_state = f.incoming_state;
    b.comm = NULL;
    b.struct_size = offsetof(lajit_cp_attn_bwd_args, incoming_state);
    ASSERT_STATUS(lajit_cp_attn_bwd(ctx, &b), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "lajit_cp_attn_bwd: comm is NULL");
    ASSERT_EQ(lj_fake_launch_count(), 0);
    lj_fake_driver()->cuMemFree(in);
    bwd_close(&w);
    rank_close(&u);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* Simulated ranks, spans of 3, 0 and 2 tokens, S_0, dS_N, ds. The forward copies the state the
 * exchange brought to ranks 1 and 2 into their incoming_state (rank 0's is not written: its
 * state is S_0). The backward given those states runs no local state and no forward scan: only
 * bwd_simulated_ranks_sequence's launches from the gradient states on, two exchanges' copies
 * instead of three, and rank 2's passes read its incoming_state as their initial state. */
LJ_TEST(bwd_with_the_forwards_incoming_state)
{
    need_nvrtc();
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx();
    enum { P = 3 };
    const int n[P] = {3, 0, 2};
    rank_views u[P];
    bwd_views w[P];
    lajit_cp_attn_fwd_args f[P];
    lajit_cp_attn_bwd_args a[P];
    CUdeviceptr in[P];
    lj_test_tensor tin[P];
    const int64_t ss[4] = {B, H, D, E};
    for (int r = 0; r < P; r++) {
        rank_open(&u[r], n[r]);
        bwd_open(&w[r], &u[r], n[r]);
        in[r] = alloc(STATE_F32 * 4);
        for (size_t i = 0; i < STATE_F32; i++)
            ((float *)(uintptr_t)in[r])[i] = 7.0f;
        f[r] = u[r].a;
        f[r].incoming_state =
            lj_gpu_tensor(&tin[r], in[r], 0, 4, ss, NULL, lj_test_dl_dtype(LJ_F32));
        a[r] = w[r].a;
        a[r].incoming_state = f[r].incoming_state;
    }
    lajit_status st = lajit__cp_attn_fwd_sim(ctx, P, f);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "forward: %s: %s", lajit_status_string(st),
                     lajit_errmsg(ctx));
    /* simulated_ranks_sequence's six exchange copies, then ranks 1 and 2 save theirs. */
    ASSERT_EQ(lj_fake_driver_counts()->dtod_copies, 8);
    const size_t each = ((SLOT * P + 15) / 16 * 16) + STATE_F32 * 4 * P;
    for (int r = 1; r < P; r++) {
        const lj_fake_copy *c = lj_fake_copy_get(6 + r - 1);
        ASSERT_EQ(c->dst, in[r]);
        ASSERT_EQ(c->bytes, STATE_F32 * 4);
        /* From rank r's incoming states (after its P slots), its own entry. */
        ASSERT_EQ(c->src, ctx->cp_ws.ptr + (CUdeviceptr)(r * each + (SLOT * P + 15) / 16 * 16 +
                                                         (size_t)r * STATE_F32 * 4));
    }
    for (size_t i = 0; i < STATE_F32; i++)
        ASSERT_TRUE(((const float *)(uintptr_t)in[0])[i] == 7.0f);

    const int copies0 = lj_fake_driver_counts()->dtod_copies, l0 = lj_fake_launch_count();
    st = lajit__cp_attn_bwd_sim(ctx, P, a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "backward: %s: %s", lajit_status_string(st),
                     lajit_errmsg(ctx));
    static const char *const want[] = {
        "la_fwd_sm90",   "la_fwd_sm90",   "la_state_scan", "la_state_scan", "la_fwd_sm90",
        "la_fwd_sm90",   "la_fwd_sm90",   "la_fwd_sm90",   "la_fwd_sm90",   "la_fwd_sm90",
        "la_state_scan", "la_state_scan", "la_state_scan"};
    ASSERT_EQ(lj_fake_launch_count() - l0, (int)(sizeof want / sizeof want[0]));
    for (int i = 0; i < lj_fake_launch_count() - l0; i++)
        ASSERT_STREQ(lj_fake_launch_get(l0 + i)->entry, want[i]);
    ASSERT_EQ(lj_fake_driver_counts()->dtod_copies - copies0, 2 * 2 * 3 + 3);
    /* The spans' passes, each rank's dq pass first (launch 4 rank 0's, 7 rank 2's): the walk in
     * the forward direction starts from S_0 on rank 0 and from the kept state on rank 2. (The
     * reversed passes' initial state is the gradient reaching the span.) */
    ASSERT_EQ((CUdeviceptr)lj_fake_launch_get(l0 + 4)->params.s0.ptr, u[0].s0);
    ASSERT_EQ((CUdeviceptr)lj_fake_launch_get(l0 + 7)->params.s0.ptr, in[2]);
    for (int r = 0; r < P; r++) {
        lj_fake_driver()->cuMemFree(in[r]);
        bwd_close(&w[r]);
        rank_close(&u[r]);
    }
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* The NCCL path, rank 1 of 3 with four tokens, ds wanted: the backward all-gathers three times
 * (the states again, the gradient states, ds's parts); given the forward's incoming_state,
 * twice, with one la_fwd_sm90 launch and one scan fewer (its local state, the forward scan). */
LJ_TEST(bwd_with_the_forwards_incoming_state_nccl)
{
    need_nvrtc();
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx();
    rank_views u;
    bwd_views w;
    rank_open(&u, 4);
    bwd_open(&w, &u, 4);
    CUdeviceptr in = alloc(STATE_F32 * 4);
    lj_test_tensor tin;
    u.a.incoming_state = lj_gpu_tensor(&tin, in, 0, 4, (const int64_t[]){B, H, D, E}, NULL,
                                       lj_test_dl_dtype(LJ_F32));
    fake_nccl_reset(3, 1);
    ASSERT_OK(lajit_cp_attn_fwd(ctx, &u.a));
    ASSERT_EQ(fn.gathers, 1);
    fake_nccl_reset(3, 1);
    int l0 = lj_fake_launch_count();
    lajit_status st = lajit_cp_attn_bwd(ctx, &w.a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(st), lajit_errmsg(ctx));
    ASSERT_EQ(fn.gathers, 3);
    const int fwd_kernels = launches_since("la_fwd_sm90", l0);
    const int scans = launches_since("la_state_scan", l0);
    fake_nccl_reset(3, 1);
    l0 = lj_fake_launch_count();
    w.a.incoming_state = u.a.incoming_state;
    st = lajit_cp_attn_bwd(ctx, &w.a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(st), lajit_errmsg(ctx));
    ASSERT_EQ(fn.gathers, 2);
    ASSERT_EQ(launches_since("la_fwd_sm90", l0), fwd_kernels - 1);
    ASSERT_EQ(launches_since("la_state_scan", l0), scans - 1);
    lj_fake_driver()->cuMemFree(in);
    bwd_close(&w);
    rank_close(&u);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* ---- The forward by segments (LAJIT_CP_SEGMENTS) ---------------------------------------------- */

/* A fake context that walks the forward by `count` segments (the variable is read at creation). */
static lajit_ctx *fake_ctx_segments(const char *count)
{
    setenv("LAJIT_CP_SEGMENTS", count, 1);
    lajit_ctx *ctx = fake_ctx();
    unsetenv("LAJIT_CP_SEGMENTS");
    return ctx;
}

/* Simulated ranks with spans of 300, 0 and 200 tokens cut into 3 segments (LAJIT_CP_SEGMENTS=3):
 * 64-token segments and tails of 108 and 8. Each rank with tokens: its segments' local states
 * (one batched la_fwd_sm90 over [3, H, 64, D] views of its k and v, one over the tail, into W),
 * the scan of W into its exchange slot; the exchange; then the scan of W from the incoming state
 * and the outputs of the segments from IN, again batched and tail, on views of q, k, v and o. The
 * segments' lengths in the buffer are 64, 64, 64 and the tail's. */
LJ_TEST(segments_forward_sequence)
{
    need_nvrtc();
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx_segments("3");
    enum { P = 3 };
    const int n[P] = {300, 0, 200}, tail[P] = {108, 0, 8};
    rank_views u[P];
    lajit_cp_attn_fwd_args a[P];
    ranks_open(u, a, P, n, 0);
    lajit_status st = lajit__cp_attn_fwd_sim(ctx, P, a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(st), lajit_errmsg(ctx));
    static const char *const want[] = {
        "la_fwd_sm90",   "la_fwd_sm90",   "la_state_scan", "la_fwd_sm90",   "la_fwd_sm90",
        "la_state_scan", "la_state_scan", "la_state_scan", "la_state_scan", "la_state_scan",
        "la_fwd_sm90",   "la_fwd_sm90",   "la_state_scan", "la_fwd_sm90",   "la_fwd_sm90"};
    ASSERT_EQ(lj_fake_launch_count(), (int)(sizeof want / sizeof want[0]));
    for (int i = 0; i < lj_fake_launch_count(); i++)
        ASSERT_STREQ(lj_fake_launch_get(i)->entry, want[i]);
    const size_t st4 = (size_t)B * H * D * E * 4;
    static const int local_at[P] = {0, -1, 3}, out_at[P] = {9, -1, 12};
    for (int r = 0; r < P; r += 2) {
        const la_params *lb = &lj_fake_launch_get(local_at[r])->params;
        const la_params *lt = &lj_fake_launch_get(local_at[r] + 1)->params;
        const la_params *ob = &lj_fake_launch_get(out_at[r] + 1)->params;
        const la_params *ot = &lj_fake_launch_get(out_at[r] + 2)->params;
        /* Batched: 3 segments of 64 tokens, a segment apart in the span. */
        ASSERT_EQ(lb->B, 3);
        ASSERT_EQ(lb->N, 64);
        ASSERT_EQ((CUdeviceptr)lb->k.ptr, u[r].k);
        ASSERT_EQ(lb->k.s0, 64 * D);
        ASSERT_EQ(lb->k.s1, (long long)n[r] * D);
        ASSERT_EQ(lb->o.ptr, 0ull);
        /* The tail: the tokens after them, its state after the three in W. */
        ASSERT_EQ(lt->B, 1);
        ASSERT_EQ(lt->N, tail[r]);
        ASSERT_EQ((CUdeviceptr)lt->v.ptr, u[r].v + 192 * E * 2);
        const CUdeviceptr W = (CUdeviceptr)lb->sn.ptr, IN = W + 4 * st4;
        ASSERT_EQ((CUdeviceptr)lt->sn.ptr, W + 3 * st4);
        /* The scans (la_state_scan's packed arguments, in longs: local_states at 0, initial_state
         * at 24, incoming_states at 33, final_state at 44). Before the exchange: W, four spans,
         * from S_0 on rank 0 (from zero elsewhere) into the rank's exchange slot; after it: W
         * again from the state entering the span (S_0 on rank 0, the exchange's incoming state
         * on rank 2) into IN, no final state. The rank's buffer: its P slots, then its P
         * incoming states (the all-gather's), then W. */
        const CUdeviceptr base = W - P * SLOT - P * st4;
        long long scan[2][45];
        memcpy(scan[0], &lj_fake_launch_get(local_at[r] + 2)->params, sizeof scan[0]);
        memcpy(scan[1], &lj_fake_launch_get(out_at[r])->params, sizeof scan[1]);
        ASSERT_EQ((CUdeviceptr)scan[0][0], W);
        ASSERT_EQ(scan[0][1], 4);
        ASSERT_EQ((CUdeviceptr)scan[0][24], r == 0 ? u[0].s0 : 0);
        ASSERT_EQ((CUdeviceptr)scan[0][44], base + r * SLOT);
        ASSERT_EQ((CUdeviceptr)scan[1][0], W);
        ASSERT_EQ((CUdeviceptr)scan[1][24], r == 0 ? u[0].s0 : base + P * SLOT + r * st4);
        ASSERT_EQ((CUdeviceptr)scan[1][33], IN);
        ASSERT_EQ(scan[1][44], 0);
        const int32_t *lens = (const int32_t *)(uintptr_t)(IN + 4 * st4);
        for (int j = 0; j < 4; j++)
            ASSERT_EQ(lens[j], j < 3 ? 64 : tail[r]);
        /* The outputs: each segment from its incoming state, on views of q and o. */
        ASSERT_EQ(ob->B, 3);
        ASSERT_EQ((CUdeviceptr)ob->q.ptr, u[r].q);
        ASSERT_EQ((CUdeviceptr)ob->o.ptr, u[r].o);
        ASSERT_EQ(ob->o.s0, 64 * E);
        ASSERT_EQ((CUdeviceptr)ob->s0.ptr, IN);
        ASSERT_EQ(ob->sn.ptr, 0ull);
        ASSERT_EQ((CUdeviceptr)ot->o.ptr, u[r].o + 192 * E * 2);
        ASSERT_EQ((CUdeviceptr)ot->s0.ptr, IN + 3 * st4);
        ASSERT_EQ(ot->N, tail[r]);
    }
    /* A second call allocates nothing and synchronises nothing: it can be captured. */
    const int allocs = lj_fake_driver_counts()->allocs;
    ASSERT_OK(lajit__cp_attn_fwd_sim(ctx, P, a));
    ASSERT_EQ(lj_fake_driver_counts()->allocs, allocs);
    for (int r = 0; r < P; r++)
        rank_close(&u[r]);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* The forward by segments with the log-step exchange (simulated ranks, 300, 0 and 200 tokens, 3
 * segments, S_0 and S_N): each rank with tokens scans its W twice — first into its running carry
 * (slot A of its four), then from the state entering its span (rank 0: S_0; rank 2: the log-step's
 * one incoming state, after the four slots and two scratch states). */
LJ_TEST(segments_forward_logstep)
{
    need_nvrtc();
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx_segments("3");
    enum { P = 3 };
    const int n[P] = {300, 0, 200};
    rank_views u[P];
    lajit_cp_attn_fwd_args a[P];
    ranks_open(u, a, P, n, LAJIT_CP_LOGSTEP);
    lajit_status st = lajit__cp_attn_fwd_sim(ctx, P, a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(st), lajit_errmsg(ctx));
    const size_t st4 = (size_t)B * H * D * E * 4;
    for (int r = 0; r < P; r += 2) {
        CUdeviceptr W = 0;
        for (int i = 0; i < lj_fake_launch_count() && !W; i++) { /* the rank's batched walk */
            const la_params *p = &lj_fake_launch_get(i)->params;
            if (strcmp(lj_fake_launch_get(i)->entry, "la_fwd_sm90") == 0 && p->B == 3 &&
                (CUdeviceptr)p->k.ptr == u[r].k)
                W = (CUdeviceptr)p->sn.ptr;
        }
        ASSERT_TRUE(W != 0);
        const CUdeviceptr base = W - 4 * SLOT - 2 * st4 - st4;
        long long scans[2][45];
        int found = 0;
        for (int i = 0; i < lj_fake_launch_count(); i++) {
            long long p[45];
            memcpy(p, &lj_fake_launch_get(i)->params, sizeof p);
            if (strcmp(lj_fake_launch_get(i)->entry, "la_state_scan") == 0 &&
                (CUdeviceptr)p[0] == W && found < 2)
                memcpy(scans[found++], p, sizeof p);
        }
        ASSERT_EQ(found, 2);
        ASSERT_EQ((CUdeviceptr)scans[0][24], r == 0 ? u[0].s0 : 0);
        ASSERT_EQ((CUdeviceptr)scans[0][44], base + SLOT); /* slot A */
        ASSERT_EQ((CUdeviceptr)scans[1][24], r == 0 ? u[0].s0 : base + 4 * SLOT + 2 * st4);
    }
    for (int r = 0; r < P; r++)
        rank_close(&u[r]);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* Two batch rows (B = 2), one rank (rank 1 of 2 on the fake NCCL), 200 tokens in 3 segments of
 * 64 and a tail of 8, VK states: per row a batched call and the tail's, on views of that row's
 * tokens, its states W[j][b] a span's state apart and each row's [H, E, D] at its place in it. */
LJ_TEST(segments_two_rows_vk)
{
    need_nvrtc();
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx_segments("3");
    enum { B2 = 2, N = 200 };
    const DLDataType bf16 = lj_test_dl_dtype(LJ_BF16), f32 = lj_test_dl_dtype(LJ_F32);
    const int64_t qs[4] = {B2, H, N, D}, vs[4] = {B2, H, N, E}, hs[1] = {H};
    CUdeviceptr q = alloc((size_t)B2 * H * N * D * 2), k = alloc((size_t)B2 * H * N * D * 2),
                v = alloc((size_t)B2 * H * N * E * 2), o = alloc((size_t)B2 * H * N * E * 2),
                s = alloc(H * 4);
    lj_test_tensor tq, tk, tv, to, ts;
    lajit_cp_attn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.comm = (void *)&fn;
    a.q = lj_gpu_tensor(&tq, q, 0, 4, qs, NULL, bf16);
    a.k = lj_gpu_tensor(&tk, k, 0, 4, qs, NULL, bf16);
    a.v = lj_gpu_tensor(&tv, v, 0, 4, vs, NULL, bf16);
    a.o = lj_gpu_tensor(&to, o, 0, 4, vs, NULL, bf16);
    a.s = lj_gpu_tensor(&ts, s, 0, 1, hs, NULL, f32);
    a.scale = 1.0f;
    a.flags = LAJIT_STATE_VK;
    fake_nccl_reset(2, 1);
    lajit_status st = lajit_cp_attn_fwd(ctx, &a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(st), lajit_errmsg(ctx));
    /* Local: row 0 batched, tail; row 1 batched, tail; the scan. Exchange: the scan. Outputs:
     * the scan; row 0 batched, tail; row 1 batched, tail. */
    static const char *const want[] = {"la_fwd_sm90",   "la_fwd_sm90",   "la_fwd_sm90",
                                       "la_fwd_sm90",   "la_state_scan", "la_state_scan",
                                       "la_state_scan", "la_fwd_sm90",   "la_fwd_sm90",
                                       "la_fwd_sm90",   "la_fwd_sm90"};
    ASSERT_EQ(lj_fake_launch_count(), (int)(sizeof want / sizeof want[0]));
    for (int i = 0; i < lj_fake_launch_count(); i++)
        ASSERT_STREQ(lj_fake_launch_get(i)->entry, want[i]);
    const size_t st4 = (size_t)B2 * H * D * E * 4, row = (size_t)H * D * E * 4;
    const CUdeviceptr W = (CUdeviceptr)lj_fake_launch_get(0)->params.sn.ptr, IN = W + 4 * st4;
    for (int b = 0; b < B2; b++) {
        const la_params *lb = &lj_fake_launch_get(2 * b)->params;
        const la_params *lt = &lj_fake_launch_get(2 * b + 1)->params;
        const la_params *ob = &lj_fake_launch_get(7 + 2 * b)->params;
        const la_params *ot = &lj_fake_launch_get(8 + 2 * b)->params;
        const CUdeviceptr krow = k + (CUdeviceptr)b * H * N * D * 2;
        ASSERT_EQ(lb->B, 3);
        ASSERT_EQ(lb->N, 64);
        ASSERT_EQ((CUdeviceptr)lb->k.ptr, krow);
        ASSERT_EQ(lb->k.s0, 64 * D);
        ASSERT_EQ((CUdeviceptr)lb->sn.ptr, W + b * row);
        ASSERT_EQ(lb->sn.s0, (long long)(st4 / 4)); /* span to span */
        ASSERT_EQ(lb->sn.s2, 1);                    /* VK: [E, D], d fastest */
        ASSERT_EQ(lt->N, 8);
        ASSERT_EQ((CUdeviceptr)lt->k.ptr, krow + 192 * D * 2);
        ASSERT_EQ((CUdeviceptr)lt->sn.ptr, W + 3 * st4 + b * row);
        ASSERT_EQ((CUdeviceptr)ob->o.ptr, o + (CUdeviceptr)b * H * N * E * 2);
        ASSERT_EQ((CUdeviceptr)ob->s0.ptr, IN + b * row);
        ASSERT_EQ((CUdeviceptr)ot->s0.ptr, IN + 3 * st4 + b * row);
        ASSERT_EQ((CUdeviceptr)ot->q.ptr, q + (CUdeviceptr)b * H * N * D * 2 + 192 * D * 2);
    }
    CUdeviceptr all[] = {q, k, v, o, s};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        lj_fake_driver()->cuMemFree(all[i]);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* The new steps under fault injection: a forward by segments that hands out its incoming states,
 * then the backward from them (simulated ranks, spans of 300, 0 and 200, S_0, dS_N, ds). Every
 * driver call of the warm calls failed in turn is a status naming the op, and the context serves
 * the next call. */
LJ_TEST(segments_and_kept_state_driver_failures)
{
    need_nvrtc();
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx_segments("3");
    enum { P = 3 };
    const int n[P] = {300, 0, 200};
    rank_views u[P];
    bwd_views w[P];
    lajit_cp_attn_fwd_args f[P];
    lajit_cp_attn_bwd_args b[P];
    CUdeviceptr in[P];
    lj_test_tensor tin[P];
    const int64_t ss[4] = {B, H, D, E};
    for (int r = 0; r < P; r++) {
        rank_open(&u[r], n[r]);
        bwd_open(&w[r], &u[r], n[r]);
        in[r] = alloc(STATE_F32 * 4);
        f[r] = u[r].a;
        f[r].incoming_state =
            lj_gpu_tensor(&tin[r], in[r], 0, 4, ss, NULL, lj_test_dl_dtype(LJ_F32));
        b[r] = w[r].a;
        b[r].incoming_state = f[r].incoming_state;
    }
    ASSERT_OK(lajit__cp_attn_fwd_sim(ctx, P, f)); /* compiles, sizes the workspace */
    ASSERT_OK(lajit__cp_attn_bwd_sim(ctx, P, b));
    lj_env *env = lajit__ctx_env(ctx);
    for (int bwd = 0; bwd < 2; bwd++) {
        const uint64_t c0 = env->fault_count[LJ_FAULT_DRIVER];
        ASSERT_OK(bwd ? lajit__cp_attn_bwd_sim(ctx, P, b) : lajit__cp_attn_fwd_sim(ctx, P, f));
        const uint64_t calls = env->fault_count[LJ_FAULT_DRIVER] - c0;
        ASSERT_TRUE(calls > 10);
        for (uint64_t k = 1; k <= calls; k++) {
            env->fault_at[LJ_FAULT_DRIVER] = env->fault_count[LJ_FAULT_DRIVER] + k;
            lajit_status st =
                bwd ? lajit__cp_attn_bwd_sim(ctx, P, b) : lajit__cp_attn_fwd_sim(ctx, P, f);
            env->fault_at[LJ_FAULT_DRIVER] = 0;
            if (st == LAJIT_OK)
                lj_test_fail(
                    __FILE__, __LINE__, "%s: driver call %llu of %llu failed, the call passed",
                    bwd ? "backward" : "forward", (unsigned long long)k, (unsigned long long)calls);
            ASSERT_CONTAINS(lajit_errmsg(ctx), bwd ? "lajit_cp_attn_bwd" : "lajit_cp_attn_fwd");
            ASSERT_OK(bwd ? lajit__cp_attn_bwd_sim(ctx, P, b) : lajit__cp_attn_fwd_sim(ctx, P, f));
        }
        printf("%s: %llu driver calls failed in turn\n", bwd ? "backward" : "forward",
               (unsigned long long)calls);
    }
    for (int r = 0; r < P; r++) {
        lj_fake_driver()->cuMemFree(in[r]);
        bwd_close(&w[r]);
        rank_close(&u[r]);
    }
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* Segments are only for the forward of a dense span with enough tokens: a 200-token span in 4
 * segments (under a chunk each) takes the plain path; a 300-token span is walked by segments in
 * the forward (a batched launch of 4 segments), while its backward (whose local state is the
 * plain state-only pass) launches nothing batched. */
LJ_TEST(segments_only_where_they_fit)
{
    need_nvrtc();
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx_segments("4");
    rank_views u, u3;
    bwd_views w;
    rank_open(&u, 200); /* 200 / 4 = 50 tokens: under a chunk */
    rank_open(&u3, 300);
    bwd_open(&w, &u3, 300);
    fake_nccl_reset(2, 1);
    ASSERT_OK(lajit_cp_attn_fwd(ctx, &u.a));
    ASSERT_EQ(launches_of("la_fwd_sm90"), 2); /* the span's state, its outputs */
    int l0 = lj_fake_launch_count(), batched = 0;
    ASSERT_OK(lajit_cp_attn_fwd(ctx, &u3.a));
    for (int i = l0; i < lj_fake_launch_count(); i++)
        if (strcmp(lj_fake_launch_get(i)->entry, "la_fwd_sm90") == 0)
            batched += lj_fake_launch_get(i)->params.B == 4;
    ASSERT_EQ(batched, 2); /* the local states and the outputs of 4 segments of 64 */
    l0 = lj_fake_launch_count();
    w.a.ds = NULL;
    ASSERT_OK(lajit_cp_attn_bwd(ctx, &w.a));
    for (int i = l0; i < lj_fake_launch_count(); i++)
        if (strcmp(lj_fake_launch_get(i)->entry, "la_fwd_sm90") == 0)
            ASSERT_EQ(lj_fake_launch_get(i)->params.B, 1);
    bwd_close(&w);
    rank_close(&u3);
    rank_close(&u);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* ---- The log-step exchange --------------------------------------------------------------------- */

/* The NCCL path of rank 1 of 4 with LAJIT_CP_LOGSTEP, on a span with no tokens (no attention
 * kernels: only the exchange's). Forward with S_N: in walk order v = 1, steps d = 1 (send to 2,
 * receive from 0) and d = 2 (send to 3, nothing to receive), the shift (send to 2, receive from
 * 0), each a group; then S_N broadcast from rank 3. The one combine (step 1) and the final copy
 * are state scans; the shift's incoming state is a device copy. Backward without ds: the same
 * forward exchange without the broadcast, then the gradient exchange walked from rank 3, where
 * rank 1 is v = 2: d = 1 (send to real 0, receive from real 2), d = 2 (receive from real 3),
 * shift (send to 0, receive from 2). Every group is closed; slot/4 floats move per step. */
LJ_TEST(logstep_nccl_path_peers)
{
    need_nvrtc();
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx();
    rank_views u;
    rank_open(&u, 0);
    u.a.flags = LAJIT_CP_LOGSTEP;
    fake_nccl_reset(4, 1);
    lajit_status st = lajit_cp_attn_fwd(ctx, &u.a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(st), lajit_errmsg(ctx));
    ASSERT_EQ(fn.gathers, 0);
    ASSERT_EQ(fn.groups, 3);
    ASSERT_EQ(fn.groups_open, 0);
    static const int fwd_sends[3] = {2, 3, 2}, fwd_recvs[2] = {0, 0};
    ASSERT_EQ(fn.n_sends, 3);
    ASSERT_EQ(fn.n_recvs, 2);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(fn.sends[i], fwd_sends[i]);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(fn.recvs[i], fwd_recvs[i]);
    ASSERT_EQ(fn.p2p_count, SLOT / 4);
    ASSERT_EQ(fn.n_bcast, 1);
    ASSERT_EQ(fn.roots[0], 3);
    ASSERT_EQ(launches_of("la_state_scan"), 2);
    ASSERT_EQ(lj_fake_launch_count(), 2);

    bwd_views w;
    bwd_open(&w, &u, 0);
    w.a.flags = LAJIT_CP_LOGSTEP;
    w.a.ds = NULL;
    fake_nccl_reset(4, 1);
    st = lajit_cp_attn_bwd(ctx, &w.a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(st), lajit_errmsg(ctx));
    static const int bwd_sends[5] = {2, 3, 2, 0, 0}, bwd_recvs[5] = {0, 0, 2, 3, 2};
    ASSERT_EQ(fn.n_sends, 5);
    ASSERT_EQ(fn.n_recvs, 5);
    for (int i = 0; i < 5; i++) {
        ASSERT_EQ(fn.sends[i], bwd_sends[i]);
        ASSERT_EQ(fn.recvs[i], bwd_recvs[i]);
    }
    ASSERT_EQ(fn.n_bcast, 0);
    ASSERT_EQ(fn.groups, 6);
    ASSERT_EQ(fn.groups_open, 0);

    /* Both exchanges forced at once: refused. */
    u.a.flags = LAJIT_CP_LOGSTEP | LAJIT_CP_ALLGATHER;
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &u.a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "exclusive");
    bwd_close(&w);
    rank_close(&u);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* Simulated ranks with the log-step exchange (P = 3, spans 3, 0, 2, S_0 and S_N): after the
 * local states, step d = 1 combines on ranks 1 and 2, step d = 2 on rank 2, the shift copies
 * the incoming states of ranks 1 and 2, and S_N reaches every rank (a copy from rank 2's carry
 * and a one-span scan each). Every rank's final combined length, read back from its slots, is
 * what its walk covered. */
LJ_TEST(logstep_simulated_sequence)
{
    need_nvrtc();
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx();
    enum { P = 3 };
    const int n[P] = {3, 0, 2};
    rank_views u[P];
    lajit_cp_attn_fwd_args a[P];
    ranks_open(u, a, P, n, LAJIT_CP_LOGSTEP);
    lajit_status st = lajit__cp_attn_fwd_sim(ctx, P, a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(st), lajit_errmsg(ctx));
    static const char *const want[] = {
        "la_fwd_sm90",   "la_fwd_sm90",   "la_state_scan", "la_state_scan", "la_state_scan",
        "la_state_scan", "la_state_scan", "la_state_scan", "la_fwd_sm90",   "la_fwd_sm90"};
    ASSERT_EQ(lj_fake_launch_count(), (int)(sizeof want / sizeof want[0]));
    for (int i = 0; i < lj_fake_launch_count(); i++)
        ASSERT_STREQ(lj_fake_launch_get(i)->entry, want[i]);
    /* Copies: step 1 (ranks 1, 2 receive), step 2 (rank 2), the shift (ranks 1, 2 receive and
     * copy their incoming state out), the broadcast (all three). */
    ASSERT_EQ(lj_fake_driver_counts()->dtod_copies, 2 + 1 + 2 + 2 + 3);
    for (int r = 0; r < P; r++)
        rank_close(&u[r]);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* ---- Varlen across ranks ----------------------------------------------------------------------- */

/* One rank's packed tokens: q, k, v, o [T, H, D|E] over rank_views' buffers (T = n), its pieces
 * (cu_seqlens int32), their slots and pools [4, H, D, E]. */
typedef struct varlen_views {
    CUdeviceptr cu, slots, pool_in, pool_out;
    lj_test_tensor tq, tk, tv, to, tcu, tsl, tin, tout;
    lajit_cp_attn_fwd_args a;
} varlen_views;

static void varlen_open(varlen_views *w, rank_views *u, int T, const int32_t *cu, int pieces,
                        uint32_t flags)
{
    memset(w, 0, sizeof *w);
    const DLDataType bf16 = lj_test_dl_dtype(LJ_BF16), f32 = lj_test_dl_dtype(LJ_F32);
    const int64_t qs[3] = {T, H, D}, vs[3] = {T, H, E}, cs[1] = {pieces + 1}, ss[1] = {pieces};
    const int64_t ps[4] = {4, H, D, E};
    w->cu = alloc((size_t)(pieces + 1) * 4);
    memcpy((void *)(uintptr_t)w->cu, cu, (size_t)(pieces + 1) * 4);
    w->slots = alloc((size_t)pieces * 4);
    int32_t *sl = (int32_t *)(uintptr_t)w->slots;
    for (int i = 0; i < pieces; i++)
        sl[i] = i % 4;
    w->pool_in = alloc((size_t)4 * H * D * E * 4);
    w->pool_out = alloc((size_t)4 * H * D * E * 4);
    lajit_cp_attn_fwd_args *a = &w->a;
    *a = u->a;
    a->q = lj_gpu_tensor(&w->tq, u->q, 0, 3, qs, NULL, bf16);
    a->k = lj_gpu_tensor(&w->tk, u->k, 0, 3, qs, NULL, bf16);
    a->v = lj_gpu_tensor(&w->tv, u->v, 0, 3, vs, NULL, bf16);
    a->o = lj_gpu_tensor(&w->to, u->o, 0, 3, vs, NULL, bf16);
    a->cu_seqlens = lj_gpu_tensor(&w->tcu, w->cu, 0, 1, cs, NULL, lj_test_dl_int32());
    a->state_slots = lj_gpu_tensor(&w->tsl, w->slots, 0, 1, ss, NULL, lj_test_dl_int32());
    a->initial_state = lj_gpu_tensor(&w->tin, w->pool_in, 0, 4, ps, NULL, f32);
    a->final_state = lj_gpu_tensor(&w->tout, w->pool_out, 0, 4, ps, NULL, f32);
    a->flags = flags;
}

static void varlen_close(varlen_views *w)
{
    const lj_driver *drv = lj_fake_driver();
    CUdeviceptr p[4] = {w->cu, w->slots, w->pool_in, w->pool_out};
    for (int i = 0; i < 4; i++)
        drv->cuMemFree(p[i]);
}

/* The varlen checks: pieces as [T, H, D] tensors, int32 cu_seqlens, state_slots [pieces] when
 * pools are given and only with cu_seqlens, pools [P, H, D, E] of float32, no continuation into
 * rank 0 or out of the last rank. */
LJ_TEST(varlen_argument_errors)
{
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx();
    rank_views u;
    rank_open(&u, 6);
    varlen_views w;
    const int32_t cu[3] = {0, 2, 6};
    varlen_open(&w, &u, 6, cu, 2, LAJIT_CP_CONTINUES_IN);
    lajit_cp_attn_fwd_args a;
    lj_test_tensor t;
    fake_nccl_reset(2, 0);
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &w.a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "rank 0's first piece cannot continue");
    fake_nccl_reset(2, 1);
    a = w.a;
    a.flags = LAJIT_CP_CONTINUES_OUT;
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "the last rank's last piece cannot continue");
    a = w.a;
    a.state_slots = NULL;
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "varlen with states needs state_slots");
    a = w.a;
    a.state_slots =
        lj_gpu_tensor(&t, w.slots, 0, 1, (const int64_t[]){3}, NULL, lj_test_dl_int32());
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "state_slots must be int32 [pieces] = [2]");
    a = w.a;
    a.final_state = lj_gpu_tensor(&t, w.pool_out, 0, 4, (const int64_t[]){4, H, D, 32}, NULL,
                                  lj_test_dl_dtype(LJ_F32));
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "final_state must be a pool [P, H, D, E]");
    a = w.a;
    a.cu_seqlens =
        lj_gpu_tensor(&t, w.cu, 0, 1, (const int64_t[]){3}, NULL, lj_test_dl_dtype(LJ_F32));
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "cu_seqlens must be int32 [pieces + 1]");
    a = u.a; /* dense */
    a.state_slots = w.a.state_slots;
    ASSERT_STATUS(lajit_cp_attn_fwd(ctx, &a), LAJIT_ERR_INVALID_ARGUMENT);
    ASSERT_CONTAINS(lajit_errmsg(ctx), "are for varlen calls");
    ASSERT_EQ(lj_fake_launch_count(), 0);
    varlen_close(&w);
    rank_close(&u);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* Two simulated ranks of a varlen forward: rank 0 holds a whole sequence and the start of the
 * next (continues out), rank 1 its end, an empty sequence and another (continues in): the ranks'
 * buffers differ (rank 1's pieces take more), each as large as the largest. Per rank: the pool gather,
 * the state-only varlen forward; the exchange (copies, then rank 1's scan); the outputs and the
 * scatter of final states. Rank 0 offers its last piece's state with length −1 (a chain starts
 * there), rank 1 likewise (two pieces); the slot arrays patched: rank 0's last piece writes no
 * final state, rank 1's first reads no initial state. */
LJ_TEST(varlen_simulated_sequence)
{
    need_nvrtc();
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx();
    rank_views u[2];
    varlen_views w[2];
    const int32_t cu0[3] = {0, 3, 5}, cu1[4] = {0, 2, 2, 4};
    rank_open(&u[0], 5);
    rank_open(&u[1], 4);
    varlen_open(&w[0], &u[0], 5, cu0, 2, LAJIT_CP_CONTINUES_OUT);
    varlen_open(&w[1], &u[1], 4, cu1, 3, LAJIT_CP_CONTINUES_IN);
    lajit_cp_attn_fwd_args a[2] = {w[0].a, w[1].a};
    lajit_status st = lajit__cp_attn_fwd_sim(ctx, 2, a);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "%s: %s", lajit_status_string(st), lajit_errmsg(ctx));
    static const char *const want[] = {"la_state_pool", "la_fwd_sm90",   "la_state_pool",
                                       "la_fwd_sm90",   "la_state_scan", "la_fwd_sm90",
                                       "la_state_pool", "la_fwd_sm90",   "la_state_pool"};
    ASSERT_EQ(lj_fake_launch_count(), (int)(sizeof want / sizeof want[0]));
    for (int i = 0; i < lj_fake_launch_count(); i++)
        ASSERT_STREQ(lj_fake_launch_get(i)->entry, want[i]);
    /* The exchanged lengths: −1 from both ranks (each holds more than one piece). */
    const size_t each_slot = SLOT;
    for (int r = 0; r < 2; r++) {
        int64_t len = 0;
        memcpy(&len, (const char *)(uintptr_t)ctx->cp_ws.ptr + (size_t)r * each_slot + SLOT - 16,
               8);
        ASSERT_EQ(len, -1);
    }
    ASSERT_EQ(ctx->cp_ids_n, 3);
    const int32_t *ids = (const int32_t *)(uintptr_t)ctx->cp_ids.ptr;
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(ids[i], i);
    for (int r = 0; r < 2; r++) {
        varlen_close(&w[r]);
        rank_close(&u[r]);
    }
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}

/* ---- The gpu test's varlen cases on the fake driver ---------------------------------------- */

static void fake_free(CUdeviceptr p)
{
    lj_fake_driver()->cuMemFree(p);
}

/* An lj_arg<rank> packed at byte offset off of a custom family's launch: ptr, sizes, strides. */
static void packed_arg(const lj_fake_launch *l, size_t off, int rank, long long *out)
{
    memcpy(out, (const unsigned char *)&l->params + off, (size_t)(1 + 2 * rank) * 8);
}

/* Bytes from an lj_arg's address to the end of its last element (4-byte elements). */
static size_t arg_reach(const long long *a, int rank)
{
    long long last = 0;
    for (int i = 0; i < rank; i++)
        last += (a[1 + i] - 1) * a[1 + rank + i];
    return (size_t)(last + 1) * 4;
}

/* Rank r's slots as the pool copies must read them: the caller's, with the first piece's −1 when
 * it continues in (reading: no initial state, no dS_0 written) or the last piece's when it
 * continues out (writing: no final state, no dS_N read). */
static int32_t expected_slot(const lj_cpv_rank *u, int piece, int reading)
{
    if (reading ? (piece == 0 && u->cont_in) : (piece == u->pieces - 1 && u->cont_out))
        return -1;
    return u->slots[piece];
}

/* The launches [from, to) of one simulated call over ranks rv[0 .. P): every la_state_pool copy
 * moves between one of a rank's pools and a batch of its pieces inside the context's exchange
 * buffer, each argument inside its allocation, with the rank's patched slots and the direction
 * and fresh-slot rule of its role; every attention kernel over a rank's pieces reads and writes
 * the rank's own pools (one state per piece, inside the exchange buffer) through the identity
 * slots. counts[r][role]: the copies seen (roles s0, sn, dsn, ds0). Returns the attention
 * launches seen. */
static int check_varlen_launches(const lajit_ctx *ctx, const lj_cpv_case *c, const lj_cpv_rank *rv,
                                 int from, int to, int counts[][4])
{
    int attention = 0;
    const size_t state = (size_t)LJ_CPV_H * LJ_CPV_D * LJ_CPV_E * 4;
    const CUdeviceptr ws = ctx->cp_ws.ptr, ws_end = ws + ctx->cp_ws.bytes;
    ASSERT_TRUE(to <= LJ_FAKE_MAX_LAUNCHES);
    for (int i = from; i < to; i++) {
        const lj_fake_launch *l = lj_fake_launch_get(i);
        if (strcmp(l->entry, "la_state_pool") == 0) {
            long long pool[9], slots[3], states[9];
            int32_t scatter, fresh;
            packed_arg(l, 0, 4, pool);
            packed_arg(l, 72, 1, slots);
            packed_arg(l, 96, 4, states);
            memcpy(&scatter, (const unsigned char *)&l->params + 168, 4);
            memcpy(&fresh, (const unsigned char *)&l->params + 176, 4); /* 8-byte slots */
            int r = -1, role = -1;
            for (int j = 0; j < c->P && r < 0; j++) {
                const CUdeviceptr mine[4] = {rv[j].s0, rv[j].sn, rv[j].dsn, rv[j].ds0};
                for (int k = 0; k < 4; k++)
                    if ((CUdeviceptr)pool[0] == mine[k])
                        r = j, role = k;
            }
            if (r < 0)
                lj_test_fail(__FILE__, __LINE__, "launch %d: la_state_pool on a pool no rank gave",
                             i);
            static const char *const names[4] = {"initial_state", "final_state", "d_final_state",
                                                 "d_initial_state"};
            if (!lj_fake_memory_holds((CUdeviceptr)pool[0], arg_reach(pool, 4)))
                lj_test_fail(__FILE__, __LINE__,
                             "launch %d: rank %d's %s pool [%lld, %lld, %lld, %lld] reaches %zu "
                             "bytes past its address, beyond its allocation",
                             i, r, names[role], pool[1], pool[2], pool[3], pool[4],
                             arg_reach(pool, 4));
            ASSERT_TRUE(lj_fake_memory_holds((CUdeviceptr)slots[0], arg_reach(slots, 1)));
            ASSERT_EQ(states[1], rv[r].pieces);
            ASSERT_EQ(slots[1], rv[r].pieces);
            ASSERT_TRUE((CUdeviceptr)states[0] >= ws &&
                        (CUdeviceptr)states[0] + arg_reach(states, 4) <= ws_end);
            static const int want_scatter[4] = {0, 1, 0, 1}, want_fresh[4] = {-1, -1, 1, 0};
            ASSERT_EQ(scatter, want_scatter[role]);
            ASSERT_EQ(fresh, want_fresh[role]);
            const int32_t *got = (const int32_t *)(uintptr_t)slots[0];
            const int reading = role == 0 || role == 3; /* the initial state's slot */
            for (int p = 0; p < rv[r].pieces; p++)
                if (got[p * slots[2]] != expected_slot(&rv[r], p, reading))
                    lj_test_fail(__FILE__, __LINE__,
                                 "launch %d: rank %d's %s copy reads slot %d for piece %d, "
                                 "expected %d",
                                 i, r, names[role], got[p * slots[2]], p,
                                 expected_slot(&rv[r], p, reading));
            counts[r][role]++;
        } else if (strncmp(l->entry, "la_fwd", 6) == 0 || strncmp(l->entry, "la_bwd", 6) == 0) {
            const la_params *p = &l->params;
            int r = -1;
            for (int j = 0; j < c->P; j++)
                if (p->cu_seqlens == rv[j].cu_d)
                    r = j;
            ASSERT_TRUE(r >= 0); /* every attention launch is a rank's varlen call */
            ASSERT_EQ(p->nseq, rv[r].pieces);
            ASSERT_EQ(p->slots, (unsigned long long)ctx->cp_ids.ptr);
            const int32_t *ids = (const int32_t *)(uintptr_t)p->slots;
            for (int j = 0; j < rv[r].pieces; j++)
                ASSERT_EQ(ids[j], j);
            const la_tensor4 *st[4] = {&p->s0, &p->sn, &p->ds0, &p->dsn};
            for (int k = 0; k < 4; k++) {
                const CUdeviceptr a = (CUdeviceptr)st[k]->ptr;
                if (a && (a < ws || a + (size_t)rv[r].pieces * state > ws_end))
                    lj_test_fail(__FILE__, __LINE__,
                                 "launch %d (%s): rank %d's state %d at %#llx is not a pool of its "
                                 "pieces inside the exchange buffer",
                                 i, l->entry, r, k, (unsigned long long)a);
            }
            attention++;
        }
    }
    return attention;
}

/* The device-to-device copies from the from-th on whose destination (dst = 1) or source is p. */
static int copies_touching(CUdeviceptr p, int dst, int from)
{
    int n = 0;
    for (int i = from; i < lj_fake_driver_counts()->dtod_copies; i++) {
        const lj_fake_copy *c = lj_fake_copy_get(i);
        ASSERT_TRUE(c != NULL);
        n += (dst ? c->dst : c->src) == p;
    }
    return n;
}

/* One case of tests/gpu/cp_varlen.c, forward then backward, with its own buffers; keep: the
 * forward hands each rank's incoming state to the backward (lj_cpv_rank_keep_incoming). Returns
 * the backward's attention launches. */
static int replay_varlen_case(const lj_cpv_case *c, int keep)
{
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx();
    lj_test_tensor ts;
    CUdeviceptr d_s = alloc(LJ_CPV_H * 4);
    const DLTensor *s =
        lj_gpu_tensor(&ts, d_s, 0, 1, (const int64_t[]){LJ_CPV_H}, NULL, lj_test_dl_dtype(LJ_F32));
    lj_cpv_rank rv[LJ_CPV_MAXP];
    lajit_cp_attn_fwd_args fa[LJ_CPV_MAXP];
    lajit_cp_attn_bwd_args ba[LJ_CPV_MAXP];
    for (int r = 0; r < c->P; r++) {
        lj_cpv_rank_open(&rv[r], c, r, alloc, s);
        memcpy((void *)(uintptr_t)rv[r].cu_d, rv[r].cu, (size_t)(rv[r].pieces + 1) * 4);
        memcpy((void *)(uintptr_t)rv[r].slots_d, rv[r].slots, (size_t)rv[r].pieces * 4);
        if (keep)
            lj_cpv_rank_keep_incoming(&rv[r]);
        fa[r] = rv[r].fa;
        ba[r] = rv[r].ba;
    }
    int counts[LJ_CPV_MAXP][4];
    memset(counts, 0, sizeof counts);
    lajit_status st = lajit__cp_attn_fwd_sim(ctx, c->P, fa);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "forward: %s: %s", lajit_status_string(st),
                     lajit_errmsg(ctx));
    const int fwd_end = lj_fake_launch_count(), fwd_copies = lj_fake_driver_counts()->dtod_copies;
    for (int r = 0; r < c->P; r++) /* the incoming state kept where one enters the first piece */
        ASSERT_EQ(copies_touching(rv[r].in, 1, 0), keep && rv[r].cont_in);
    /* Per rank: the state-only forward and the outputs. */
    ASSERT_EQ(check_varlen_launches(ctx, c, rv, 0, fwd_end, counts), 2 * c->P);
    for (int r = 0; r < c->P; r++) { /* one gather of S_0, one scatter of S_N per rank */
        ASSERT_EQ(counts[r][0], 1);
        ASSERT_EQ(counts[r][1], 1);
    }
    memset(counts, 0, sizeof counts);
    st = lajit__cp_attn_bwd_sim(ctx, c->P, ba);
    if (st != LAJIT_OK)
        lj_test_fail(__FILE__, __LINE__, "backward: %s: %s", lajit_status_string(st),
                     lajit_errmsg(ctx));
    /* The forward's two (one when kept), the state-only backward and its passes. */
    const int attention =
        check_varlen_launches(ctx, c, rv, fwd_end, lj_fake_launch_count(), counts);
    ASSERT_TRUE(attention > (keep ? 3 : 4) * c->P);
    for (int r = 0; r < c->P; r++) { /* S_0 and dS_N gathered, dS_0 scattered, once each */
        ASSERT_EQ(counts[r][0], 1);
        ASSERT_EQ(counts[r][1], 0);
        ASSERT_EQ(counts[r][2], 1);
        ASSERT_EQ(counts[r][3], 1);
        /* A continued first piece starts from the kept state: one copy from it. */
        ASSERT_EQ(copies_touching(rv[r].in, 0, fwd_copies), keep && rv[r].cont_in);
    }
    for (int r = 0; r < c->P; r++)
        lj_cpv_rank_close(&rv[r], fake_free);
    fake_free(d_s);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
    return attention;
}

/* tests/gpu/cp_varlen.c's cases (the same pieces and buffers: tests/support/cp_varlen_case.c)
 * through the fake driver: what each launch of the forward and the backward is handed. With the
 * forward's incoming states kept, each rank's backward runs its state-only forward no more (one
 * attention launch fewer per rank with tokens) and starts a continued piece from the kept state. */
LJ_TEST(varlen_gpu_cases_on_the_fake_driver)
{
    need_nvrtc();
    for (int x = 0; x < 2; x++) {
        const lj_cpv_case cases[2] = {lj_cpv_three_ranks(2, x), lj_cpv_five_ranks(x)};
        for (int i = 0; i < 2; i++) {
            int with_tokens = 0;
            for (int r = 0; r < cases[i].P; r++)
                with_tokens += cases[i].cut[r + 1] > cases[i].cut[r];
            const int recomputed = replay_varlen_case(&cases[i], 0);
            ASSERT_EQ(replay_varlen_case(&cases[i], 1), recomputed - with_tokens);
        }
    }
}

/* The forward by segments (now the default where spans are long): every driver call of a call
 * failing in turn gives a status naming the op, never a crash, and the context serves the next
 * call; nothing leaks. Spans of 300, 0 and 200 tokens cut into 3 segments, as above. */
LJ_TEST(segments_forward_driver_failures)
{
    need_nvrtc();
    lj_fake_driver_reset();
    fake_device();
    lajit_ctx *ctx = fake_ctx_segments("3");
    enum { P = 3 };
    const int n[P] = {300, 0, 200};
    rank_views u[P];
    lajit_cp_attn_fwd_args a[P];
    ranks_open(u, a, P, n, 0);
    ASSERT_OK(lajit__cp_attn_fwd_sim(ctx, P, a)); /* compiles, sizes the workspace */
    const int l0 = lj_fake_launch_count();
    ASSERT_OK(lajit__cp_attn_fwd_sim(ctx, P, a));
    ASSERT_EQ(lj_fake_launch_count() - l0, 15); /* by segments: segments_forward_sequence's 15 */
    fwd_fails_each_driver_call(ctx, P, a);
    for (int r = 0; r < P; r++)
        rank_close(&u[r]);
    lajit_ctx_destroy(ctx);
    lj_fake_driver()->cuDevicePrimaryCtxRelease(0);
    ASSERT_TRUE(lj_fake_driver_balanced());
}
