/* search.c — the tuner (search.h): enumerate, filter, compile in parallel, time in a private
 * context.
 *
 * The order of work keeps the GPU and the database apart: all compiles happen first (threads,
 * no context needed), then all timing (one thread, private context), and the caller records the
 * results afterwards in one short transaction; nothing here touches the database. */
#include "search.h"
#include "args.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel.h"
#include "params.h"
#include "plan.h"
#include "problem.h"

#define MAX_SETS 64
#define ALIGN    256

/* ---- Identity ------------------------------------------------------------------- */

lajit_status lj_tune_id_make(lj_env *env, lj_family *f, const lj_device *dev, const lj_problem *p,
                             lj_tune_id *out)
{
    lj_tune_id id;
    memset(&id, 0, sizeof id);
    int major = 0, minor = 0;
    if (lj_nvrtc_version(env, &major, &minor) != LAJIT_OK) {
        /* Without NVRTC only cached kernels run; their results are filed under NVRTC 0. */
        major = minor = 0;
        lj_clear_error(env);
    }
    lj_fingerprint_make(&dev->info, dev->driver_version, major, minor, &id.fp);
    snprintf(id.family, sizeof id.family, "%s", lj_family_name(f));
    lajit_status st = lj_tune_template_hash(env, f, id.template_hash);
    if (st == LAJIT_OK)
        st = lj_family_key(f, p, id.bucket, sizeof id.bucket);
    if (st == LAJIT_OK)
        *out = id;
    return st;
}

/* ---- Candidates ------------------------------------------------------------------------------ */

typedef struct candidate {
    lj_config config;
    lj_launch launch;
    lj_kernel_job job;
    int have_job;
    lj_cache_entry entry; /* the image, once compiled or found */
    int have_image;
    lj_tune_result result;
} candidate;

static int same_config(const lj_config *a, const lj_config *b)
{
    if (a->n != b->n)
        return 0;
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->names[i], b->names[i]) != 0 || a->values[i] != b->values[i])
            return 0;
    return 1;
}

static void set_failure(candidate *c, const char *fmt, const char *detail)
{
    c->result.ms = -1;
    snprintf(c->result.failure, sizeof c->result.failure, fmt, detail);
    if (!c->result.failure[0])
        snprintf(c->result.failure, sizeof c->result.failure, "failed");
}

/* ---- The private timing context ------------------------------------------------------------ */

/* Errors after which a context is unusable: the kernel faulted and every later call in that
 * context returns the same error. */
static int sticky_error(CUresult r)
{
    switch (r) {
        case CUDA_ERROR_ILLEGAL_ADDRESS:
        case CUDA_ERROR_LAUNCH_FAILED:
        case CUDA_ERROR_MISALIGNED_ADDRESS:
        case CUDA_ERROR_ILLEGAL_INSTRUCTION:
        case CUDA_ERROR_INVALID_ADDRESS_SPACE:
        case CUDA_ERROR_INVALID_PC:
        case CUDA_ERROR_HARDWARE_STACK_ERROR:
        case CUDA_ERROR_ASSERT:
        case CUDA_ERROR_LAUNCH_TIMEOUT:
        case CUDA_ERROR_ECC_UNCORRECTABLE:
        case CUDA_ERROR_CONTEXT_IS_DESTROYED:
        case CUDA_ERROR_UNKNOWN: return 1;
        default: return 0;
    }
}

typedef struct bench {
    lj_env *env;
    const lj_driver *drv;
    lj_device shadow; /* dev with cuctx = the private context, for lj_module_load */
    CUdevice cudev;
    CUcontext ctx;
    CUstream stream;
    CUevent start, stop;
    CUdeviceptr sets[MAX_SETS];
    int n_sets;
    size_t set_bytes;
    lj_dense_layout layout;
    la_params params[MAX_SETS];
    /* A custom family (op custom): its tensors' offsets in a set, and each set's packed
     * arguments (allocated: LJ_ARGS_BYTES each). */
    const lj_args_decl *decl;
    size_t arg_off[LJ_MAX_ARGS], arg_bytes[LJ_MAX_ARGS];
    lj_packed_args *packed;
    const lj_problem *p;
    unsigned char *host; /* one set's initial contents */
    /* A split candidate's flags (grow-only, zeroed when made; its kernels leave them zero) and
     * states, shared by the sets: every launch is on the one stream. [0] flags, [1] states.
     * A custom family's workspace argument is split[0] (zeroed before each candidate, ws_bytes
     * of it passed). */
    lj_dev_buf split[2];
    unsigned long long ws_bytes;
} bench;

static void error_text(const lj_driver *drv, CUresult r, const char *what, char *out, size_t cap)
{
    const char *name = NULL;
    if (drv->cuGetErrorName(r, &name) != CUDA_SUCCESS || !name)
        name = "unknown CUDA error";
    snprintf(out, cap, "%s: %s", what, name);
}

static size_t round_up(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

/* Random values in [-0.5, 0.5) as the problem's dtype; decay rates in (0.05, 0.55); states
 * small. xorshift: deterministic, no global state. */
static uint32_t next_random(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (uint32_t)(*s >> 11);
}

static void fill_values(unsigned char *dst, size_t bytes, lj_dtype dt, float lo, float span,
                        uint64_t *seed)
{
    size_t el = dt == LJ_F32 ? 4 : 2;
    for (size_t i = 0; i + el <= bytes; i += el) {
        float v = lo + span * (float)(next_random(seed) & 0xffffff) / 16777216.0f;
        uint32_t bits;
        memcpy(&bits, &v, 4);
        if (dt == LJ_F32) {
            memcpy(dst + i, &bits, 4);
        } else if (dt == LJ_BF16) {
            uint16_t h = (uint16_t)(bits >> 16);
            memcpy(dst + i, &h, 2);
        } else { /* f16 of a value in [-1, 1): sign, exponent rebased, 10 bits of mantissa */
            uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
            int exp = (int)((bits >> 23) & 0xff) - 127 + 15;
            uint16_t h = exp <= 0 ? sign : (uint16_t)(sign | (exp << 10) | ((bits >> 13) & 0x3ff));
            memcpy(dst + i, &h, 2);
        }
    }
}

/* Fills the host image of one set: offsets in layout order q, k, v, o, s, s0, sn, step. */
/* The buffers of a layout in lj_dense_layout's order. */
static void layout_sizes(const lj_dense_layout *l, size_t sizes[LJ_DENSE_BUFFERS])
{
    const size_t s[LJ_DENSE_BUFFERS] = {l->q,           l->k, l->v,   l->o,  l->s,  l->s0, l->sn,
                                        l->step_states, l->x, l->dsn, l->ws, l->ds, l->o2};
    memcpy(sizes, s, sizeof s);
}

static void set_offsets(const lj_dense_layout *l, size_t off[LJ_DENSE_BUFFERS], size_t *total)
{
    size_t sizes[LJ_DENSE_BUFFERS];
    layout_sizes(l, sizes);
    size_t at = 0;
    for (int i = 0; i < LJ_DENSE_BUFFERS; i++) {
        off[i] = at;
        at += round_up(sizes[i]);
    }
    *total = at;
}

/* A custom family's tensors, each from its declaration and the problem's symbols: present
 * unless an optional one whose has_ flag is off. Sets b->set_bytes. */
static lajit_status custom_layout(lj_env *env, bench *b)
{
    const lj_args_decl *d = b->decl;
    const lj_problem *p = b->p;
    size_t at = 0;
    for (int i = 0; i < d->n_args; i++) {
        const lj_arg_decl *a = &d->arg[i];
        b->arg_off[i] = at;
        b->arg_bytes[i] = 0;
        if (a->kind != LJ_ARG_TENSOR || (a->optional && !p->sym[a->flag]))
            continue;
        size_t bytes =
            (size_t)lj_elem_size(a->elem == LJ_ELEM_PROBLEM ? (lj_elem)p->dtype : a->elem);
        for (int k = 0; k < a->rank; k++) {
            long long n = p->sym[a->shape[k]];
            if (n < 1 || __builtin_mul_overflow(bytes, (size_t)n, &bytes))
                return lj_error(env, LAJIT_ERR_UNSUPPORTED, "the tuner's %s is too large", a->name);
        }
        b->arg_bytes[i] = bytes;
        if (__builtin_add_overflow(at, round_up(bytes), &at))
            return lj_error(env, LAJIT_ERR_UNSUPPORTED, "the tuner's inputs are too large");
    }
    b->set_bytes = at ? at : ALIGN;
    return LAJIT_OK;
}

/* A custom family's arguments for set i: compact tensors at their offsets, f32 scalars 1 and
 * integer scalars 0 (a spec whose kernel's speed depends on a scalar says so in its docs). */
static void make_custom_args(bench *b, int i)
{
    const lj_args_decl *d = b->decl;
    lj_arg_value v[LJ_MAX_ARGS];
    memset(v, 0, sizeof v);
    for (int k = 0; k < d->n_args; k++) {
        const lj_arg_decl *a = &d->arg[k];
        if (a->kind == LJ_ARG_F32)
            v[k].f = 1.0;
        if (a->kind == LJ_ARG_WORKSPACE && b->ws_bytes) {
            v[k].ptr = (unsigned long long)b->split[0].ptr;
            v[k].size[0] = (long long)b->ws_bytes;
            v[k].stride[0] = 1;
        }
        if (a->kind != LJ_ARG_TENSOR || !b->arg_bytes[k])
            continue;
        v[k].ptr = (unsigned long long)b->sets[i] + b->arg_off[k];
        long long stride = 1;
        for (int r = a->rank - 1; r >= 0; r--) {
            v[k].size[r] = b->p->sym[a->shape[r]];
            v[k].stride[r] = stride;
            stride *= v[k].size[r];
        }
    }
    lj_args_pack(d, v, &b->packed[i]);
}

static void make_host_image(bench *b)
{
    if (b->decl) {
        /* Inputs random in their declared fill range; outputs and integers zero. */
        uint64_t seed = 0x9e3779b97f4a7c15ull;
        memset(b->host, 0, b->set_bytes);
        for (int k = 0; k < b->decl->n_args; k++) {
            const lj_arg_decl *a = &b->decl->arg[k];
            lj_elem e = a->elem == LJ_ELEM_PROBLEM ? (lj_elem)b->p->dtype : a->elem;
            if (a->kind == LJ_ARG_TENSOR && b->arg_bytes[k] && !a->output && e <= LJ_ELEM_BF16)
                fill_values(b->host + b->arg_off[k], b->arg_bytes[k], (lj_dtype)e,
                            (float)a->fill_lo, (float)(a->fill_hi - a->fill_lo), &seed);
        }
        return;
    }
    size_t off[LJ_DENSE_BUFFERS], total;
    set_offsets(&b->layout, off, &total);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    memset(b->host, 0, total);
    lj_dtype dt = b->p->dtype;
    fill_values(b->host + off[0], b->layout.q, dt, -0.5f, 1.0f, &seed);
    fill_values(b->host + off[1], b->layout.k, dt, -0.5f, 1.0f, &seed);
    fill_values(b->host + off[2], b->layout.v, dt, -0.5f, 1.0f, &seed);
    fill_values(b->host + off[4], b->layout.s, LJ_F32, 0.05f, 0.5f, &seed);
    fill_values(b->host + off[5], b->layout.s0, LJ_F32, -0.01f, 0.02f, &seed);
    fill_values(b->host + off[8], b->layout.x, dt, -0.5f, 1.0f, &seed);
    fill_values(b->host + off[9], b->layout.dsn, LJ_F32, -0.01f, 0.02f, &seed);
}

static void make_params(bench *b, int i)
{
    if (b->decl) {
        make_custom_args(b, i);
        return;
    }
    size_t off[LJ_DENSE_BUFFERS], total, sizes[LJ_DENSE_BUFFERS];
    set_offsets(&b->layout, off, &total);
    layout_sizes(&b->layout, sizes);
    unsigned long long base = (unsigned long long)b->sets[i];
    unsigned long long ptr[LJ_DENSE_BUFFERS];
    for (int k = 0; k < LJ_DENSE_BUFFERS; k++)
        ptr[k] = sizes[k] ? base + off[k] : 0;
    lj_dense_buffers buf = {ptr[0], ptr[1], ptr[2], ptr[3],  ptr[4],  ptr[5], ptr[6],
                            ptr[7], ptr[8], ptr[9], ptr[10], ptr[11], ptr[12]};
    lj_params_dense(b->p, &buf, 1.0f, &b->params[i]);
}

/* Makes the private context current, with its stream, events and input sets. On failure
 * everything made is destroyed with the context. */
static lajit_status bench_open(bench *b)
{
    lj_env *env = b->env;
    const lj_driver *drv = b->drv;
    CUresult r = LJ_CU(env, drv, cuCtxCreate, &b->ctx, 0, b->cudev);
    if (r != CUDA_SUCCESS) {
        b->ctx = NULL;
        return lj_driver_error(env, drv, r, "cuCtxCreate (the tuner's private context)");
    }
    b->shadow.cuctx = b->ctx;
    const char *what = "cuCtxSetCurrent";
    if ((r = LJ_CU(env, drv, cuCtxSetCurrent, b->ctx)) == CUDA_SUCCESS &&
        (what = "cuStreamCreate",
         r = LJ_CU(env, drv, cuStreamCreate, &b->stream, CU_STREAM_NON_BLOCKING)) == CUDA_SUCCESS &&
        (what = "cuEventCreate", r = LJ_CU(env, drv, cuEventCreate, &b->start, 0)) == CUDA_SUCCESS)
        r = LJ_CU(env, drv, cuEventCreate, &b->stop, 0);
    if (r != CUDA_SUCCESS)
        goto fail;
    /* As many sets as make 2x the L2 size (at least 2), within half the free memory. */
    size_t free_b = 0, total_b = 0;
    what = "cuMemGetInfo";
    if ((r = LJ_CU(env, drv, cuMemGetInfo, &free_b, &total_b)) != CUDA_SUCCESS)
        goto fail;
    size_t l2 = b->shadow.info.l2_bytes > 0 ? (size_t)b->shadow.info.l2_bytes : (size_t)64 << 20;
    size_t want = (2 * l2 + b->set_bytes - 1) / b->set_bytes + 1;
    if (want < 2)
        want = 2;
    if (want > MAX_SETS)
        want = MAX_SETS;
    size_t fit = free_b / 2 / b->set_bytes;
    if (fit < 1) {
        LJ_CU(env, drv, cuCtxDestroy, b->ctx);
        b->ctx = NULL;
        return lj_error(env, LAJIT_ERR_UNSUPPORTED,
                        "the tuner's inputs (%zu bytes) do not fit in the device's free memory",
                        b->set_bytes);
    }
    b->n_sets = (int)(want < fit ? want : fit);
    what = "cuMemAlloc";
    for (int i = 0; i < b->n_sets; i++) {
        if ((r = LJ_CU(env, drv, cuMemAlloc, &b->sets[i], b->set_bytes)) != CUDA_SUCCESS)
            goto fail;
        what = "cuMemcpyHtoD";
        if ((r = LJ_CU(env, drv, cuMemcpyHtoD, b->sets[i], b->host, b->set_bytes)) != CUDA_SUCCESS)
            goto fail;
        make_params(b, i);
    }
    /* From pageable memory the copies (on the context's default stream) may return before their
     * DMA lands, and the timing stream is non-blocking: wait for them before any candidate reads
     * the sets. */
    what = "cuStreamSynchronize (the tuner's inputs)";
    if ((r = LJ_CU(env, drv, cuStreamSynchronize, NULL)) != CUDA_SUCCESS)
        goto fail;
    return LAJIT_OK;
fail:;
    lajit_status st = lj_driver_error(env, drv, r, what);
    LJ_CU(env, drv, cuCtxDestroy, b->ctx); /* frees what was made in it */
    b->ctx = NULL;
    return st;
}

/* Everything made in the context goes with it. */
static void bench_close(bench *b)
{
    if (!b->ctx)
        return;
    const lj_driver *drv = b->drv;
    /* Explicit releases first when the context is healthy (tidy for tools that count them);
     * cuCtxDestroy frees anything left. */
    LJ_CU(b->env, drv, cuCtxSetCurrent, b->ctx);
    for (int i = 0; i < b->n_sets; i++)
        if (b->sets[i])
            LJ_CU(b->env, drv, cuMemFree, b->sets[i]);
    for (int i = 0; i < 2; i++)
        if (b->split[i].ptr)
            LJ_CU(b->env, drv, cuMemFree, b->split[i].ptr);
    memset(b->split, 0, sizeof b->split);
    if (b->start)
        LJ_CU(b->env, drv, cuEventDestroy, b->start);
    if (b->stop)
        LJ_CU(b->env, drv, cuEventDestroy, b->stop);
    if (b->stream)
        LJ_CU(b->env, drv, cuStreamDestroy, b->stream);
    LJ_CU(b->env, drv, cuCtxDestroy, b->ctx);
    b->ctx = NULL;
    b->stream = NULL;
    b->start = b->stop = NULL;
    memset(b->sets, 0, sizeof b->sets);
    b->n_sets = 0;
}

/* After a sticky error: the context is dropped whole (cuCtxDestroy releases its memory and
 * modules even when faulted) and a fresh one made. */
static lajit_status bench_reset(bench *b)
{
    LJ_CU(b->env, b->drv, cuCtxDestroy, b->ctx);
    b->ctx = NULL;
    memset(b->split, 0, sizeof b->split);
    b->stream = NULL;
    b->start = b->stop = NULL;
    memset(b->sets, 0, sizeof b->sets);
    b->n_sets = 0;
    return bench_open(b);
}

static int compare_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* Kernels faster than BATCH_BELOW_MS alone are timed as graphs of back-to-back launches lasting
 * about BATCH_TARGET_MS (at most BATCH_MAX launches): a decode step of 3 us timed alone between
 * two events measures the launch as much as the kernel, and ranked configurations of small
 * batches in the opposite order to a graph replay (docs/notes/la_decode.md). */
#define BATCH_BELOW_MS  0.05
#define BATCH_TARGET_MS 0.25
#define BATCH_MAX       256

static double median(float *times, int runs)
{
    qsort(times, (size_t)runs, sizeof times[0], compare_float);
    return runs % 2 ? times[runs / 2] : 0.5 * ((double)times[runs / 2 - 1] + times[runs / 2]);
}

/* Times `runs` replays of a graph of n launches of fn, each on the next input set (the sets
 * rotate beyond the L2 as in the single-launch timing); times[i] is per launch. On a failure
 * *what names the call. */
static CUresult time_batched(bench *b, CUfunction fn, const unsigned grid[3], const lj_launch *l,
                             int n, int runs, float *times, int *set, const char **what)
{
    lj_env *env = b->env;
    const lj_driver *drv = b->drv;
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    CUresult r;
    *what = "cuStreamBeginCapture";
    if ((r = LJ_CU(env, drv, cuStreamBeginCapture, b->stream,
                   CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)) != CUDA_SUCCESS)
        return r;
    CUresult rl = CUDA_SUCCESS;
    for (int i = 0; i < n && rl == CUDA_SUCCESS; i++, *set = (*set + 1) % b->n_sets) {
        void *args[] = {&b->params[*set]};
        rl =
            LJ_CU(env, drv, cuLaunchKernel, fn, grid[0], grid[1], grid[2], l->block[0], l->block[1],
                  l->block[2], l->smem, b->stream, b->decl ? b->packed[*set].params : args, NULL);
    }
    r = LJ_CU(env, drv, cuStreamEndCapture, b->stream, &graph); /* ends it whatever happened */
    if (rl != CUDA_SUCCESS) {
        *what = "cuLaunchKernel";
        r = rl;
    } else if (r != CUDA_SUCCESS) {
        *what = "cuStreamEndCapture";
    } else {
        *what = "cuGraphInstantiate";
        r = LJ_CU(env, drv, cuGraphInstantiate, &exec, graph, 0);
    }
    for (int i = -1; i < runs && r == CUDA_SUCCESS; i++) { /* i = -1: warm-up replay */
        float ms = 0;
        *what = "cuEventRecord";
        if ((r = LJ_CU(env, drv, cuEventRecord, b->start, b->stream)) != CUDA_SUCCESS)
            break;
        *what = "cuGraphLaunch";
        if ((r = LJ_CU(env, drv, cuGraphLaunch, exec, b->stream)) != CUDA_SUCCESS)
            break;
        *what = "cuEventRecord";
        if ((r = LJ_CU(env, drv, cuEventRecord, b->stop, b->stream)) != CUDA_SUCCESS)
            break;
        *what = "cuEventSynchronize";
        if ((r = LJ_CU(env, drv, cuEventSynchronize, b->stop)) != CUDA_SUCCESS)
            break;
        *what = "cuEventElapsedTime";
        if ((r = LJ_CU(env, drv, cuEventElapsedTime, &ms, b->start, b->stop)) == CUDA_SUCCESS &&
            i >= 0)
            times[i] = ms / (float)n;
    }
    if (exec)
        LJ_CU(env, drv, cuGraphExecDestroy, exec);
    if (graph)
        LJ_CU(env, drv, cuGraphDestroy, graph);
    return r;
}

/* Times one candidate. Returns the CUresult of the first failure (the failure text in c) or
 * CUDA_SUCCESS with c->result.ms set. */
static CUresult time_candidate(bench *b, candidate *c, int warmup, int runs)
{
    lj_env *env = b->env;
    const lj_driver *drv = b->drv;
    const lj_problem *p = b->p;
    unsigned grid[3];
    long long vars[LJ_N_GRID_VARS];
    lj_plan_vars(vars, p->B, p->H, p->N, p->B, p->T > 0 ? p->T : 1);
    for (int i = 0; i < LJ_MAX_SYMBOLS; i++)
        vars[LJ_VAR_SYM0 + i] = p->sym[i];
    if (!lj_plan_grid(&c->launch, vars, LJ_N_GRID_VARS, grid)) {
        set_failure(c, "%s", "grid exceeds the driver's limits");
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (c->launch.split_ws) {
        const unsigned long long per[2] = {c->launch.split_flags, c->launch.split_ws};
        for (int k = 0; k < 2; k++) {
            size_t bytes = lj_split_ws_bytes(p->B, p->H, per[k]);
            if (bytes == SIZE_MAX) {
                set_failure(c, "%s", "the split workspace does not fit in size_t");
                return CUDA_ERROR_INVALID_VALUE;
            }
            if (lj_dev_buf_grow(env, drv, &b->split[k], bytes, k == 0, b->stream,
                                "the split workspace") != LAJIT_OK) {
                set_failure(c, "%.200s", env->errmsg);
                CUresult ra = (CUresult)env->driver_result;
                lj_clear_error(env);
                return ra != CUDA_SUCCESS ? ra : CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
    }
    for (int i = 0; i < b->n_sets; i++) {
        b->params[i].splitws = c->launch.split_ws ? (unsigned long long)b->split[0].ptr : 0;
        b->params[i].splitst = c->launch.split_ws ? (unsigned long long)b->split[1].ptr : 0;
    }
    if (b->decl && b->decl->workspace >= 0) {
        /* The candidate's workspace, zeroed (another configuration's kernels may have left
         * anything in it), in every set's arguments. */
        unsigned long long bytes = 0;
        if (!lj_plan_ws_bytes(&c->launch, vars, LJ_N_GRID_VARS, &bytes) || bytes > SIZE_MAX / 2) {
            set_failure(c, "%s", "the workspace passes 2^50 bytes");
            return CUDA_ERROR_INVALID_VALUE;
        }
        /* (grown unzeroed: the memset that follows zeroes it for every candidate, in the whole
         * 16-byte units the buffer is allocated in) */
        const size_t words = lj_round16((size_t)bytes) / 4;
        if (bytes && (lj_dev_buf_grow(env, drv, &b->split[0], (size_t)bytes, 0, b->stream,
                                      "the family's workspace") != LAJIT_OK ||
                      LJ_CU(env, drv, cuMemsetD32Async, b->split[0].ptr, 0u, words, b->stream) !=
                          CUDA_SUCCESS)) {
            set_failure(c, "%.200s", env->errmsg[0] ? env->errmsg : "workspace memset");
            CUresult ra = (CUresult)env->driver_result;
            lj_clear_error(env);
            return ra != CUDA_SUCCESS ? ra : CUDA_ERROR_OUT_OF_MEMORY;
        }
        b->ws_bytes = bytes;
        for (int i = 0; i < b->n_sets; i++)
            make_custom_args(b, i);
    }
    CUmodule module = NULL;
    CUfunction fn = NULL;
    if (lj_module_load(env, &b->shadow, c->entry.image, c->launch.entry, c->launch.smem, &module,
                       &fn) != LAJIT_OK) {
        set_failure(c, "module load: %.200s", env->errmsg);
        lj_clear_error(env);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    CUresult r = CUDA_SUCCESS;
    const char *what = "cuLaunchKernel";
    float times[64];
    if (runs > 64)
        runs = 64;
    int set = 0;
    for (int i = 0; i < warmup && r == CUDA_SUCCESS; i++, set = (set + 1) % b->n_sets) {
        void *args[] = {&b->params[set]};
        r = LJ_CU(env, drv, cuLaunchKernel, fn, grid[0], grid[1], grid[2], c->launch.block[0],
                  c->launch.block[1], c->launch.block[2], c->launch.smem, b->stream,
                  b->decl ? b->packed[set].params : args, NULL);
    }
    if (r == CUDA_SUCCESS) {
        what = "cuStreamSynchronize";
        r = LJ_CU(env, drv, cuStreamSynchronize, b->stream);
    }
    for (int i = 0; i < runs && r == CUDA_SUCCESS; i++, set = (set + 1) % b->n_sets) {
        void *args[] = {&b->params[set]};
        what = "cuEventRecord";
        if ((r = LJ_CU(env, drv, cuEventRecord, b->start, b->stream)) != CUDA_SUCCESS)
            break;
        what = "cuLaunchKernel";
        if ((r = LJ_CU(env, drv, cuLaunchKernel, fn, grid[0], grid[1], grid[2], c->launch.block[0],
                       c->launch.block[1], c->launch.block[2], c->launch.smem, b->stream,
                       b->decl ? b->packed[set].params : args, NULL)) != CUDA_SUCCESS)
            break;
        what = "cuEventRecord";
        if ((r = LJ_CU(env, drv, cuEventRecord, b->stop, b->stream)) != CUDA_SUCCESS)
            break;
        what = "cuEventSynchronize";
        if ((r = LJ_CU(env, drv, cuEventSynchronize, b->stop)) != CUDA_SUCCESS)
            break;
        what = "cuEventElapsedTime";
        r = LJ_CU(env, drv, cuEventElapsedTime, &times[i], b->start, b->stop);
    }
    if (r == CUDA_SUCCESS) {
        c->result.ms = median(times, runs);
        c->result.failure[0] = 0;
        /* A short kernel timed alone is mostly launch latency and the events' own cost: time it
         * again as a graph of back-to-back launches, as an application replays it. */
        if (c->result.ms < BATCH_BELOW_MS) {
            int n = (int)(BATCH_TARGET_MS / (c->result.ms > 1e-4 ? c->result.ms : 1e-4)) + 1;
            r = time_batched(b, fn, grid, &c->launch, n < BATCH_MAX ? n : BATCH_MAX, runs, times,
                             &set, &what);
            if (r == CUDA_SUCCESS)
                c->result.ms = median(times, runs);
        }
    }
    if (r != CUDA_SUCCESS) {
        char text[160];
        error_text(drv, r, what, text, sizeof text);
        set_failure(c, "%s", text);
    }
    if (!sticky_error(r))
        LJ_CU(env, drv, cuModuleUnload, module); /* a faulted context takes it along */
    return r;
}

/* ---- The search ------------------------------------------------------------------------------ */

static void progress(const lj_search_opts *o, int done, int total, const char *what)
{
    if (o && o->progress)
        o->progress(o->progress_user, done, total, what);
}

void lj_search_out_free(lj_env *env, lj_search_out *out)
{
    if (!out)
        return;
    lj_free(env, out->results);
    out->results = NULL;
}

lajit_status lj_search_run(lj_env *env, lj_lua *L, lj_family *f, lj_cache *cache, lj_device *dev,
                           const lj_problem *p, const lj_search_opts *opts, lj_search_out *out)
{
    lj_search_opts o = opts ? *opts : (lj_search_opts){0};
    if (o.warmup <= 0)
        o.warmup = 3;
    if (o.runs < 5)
        o.runs = 5;
    lj_dense_layout layout;
    memset(&layout, 0, sizeof layout);
    lajit_status st = p->op == LJ_OP_CUSTOM ? LAJIT_OK : lj_dense_layout_of(env, p, &layout);
    if (st != LAJIT_OK)
        return st;
    lj_search_out res;
    memset(&res, 0, sizeof res);
    res.default_ms = -1;
    if ((st = lj_family_default(f, p, &dev->info, &res.dflt)) != LAJIT_OK)
        return st;
    lj_config *space = NULL;
    int n_space = 0;
    if ((st = lj_family_all_configs(f, &space, &n_space)) != LAJIT_OK)
        return st;
    candidate *cands = lj_calloc(env, (size_t)(n_space ? n_space : 1), sizeof *cands);
    lj_compile_task *tasks = lj_calloc(env, (size_t)(n_space ? n_space : 1), sizeof *tasks);
    bench b;
    memset(&b, 0, sizeof b);
    if (!cands || !tasks) {
        st = lj_oom(env);
        goto done;
    }
    /* Valid candidates, each with its launch geometry and compile job (one thread: Lua). */
    int n = 0;
    for (int i = 0; i < n_space; i++) {
        int ok;
        char reason[256];
        if ((st = lj_family_valid(f, &space[i], p, &dev->info, &ok, reason, sizeof reason)) !=
            LAJIT_OK)
            goto done;
        if (!ok)
            continue;
        candidate *c = &cands[n++];
        c->config = space[i];
        lj_config_format(&c->config, c->result.config, sizeof c->result.config);
        c->result.ms = -1;
        if ((st = lj_family_launch(f, &c->config, p, &dev->info, &c->launch)) != LAJIT_OK ||
            (st = lj_kernel_prepare(L, f, &c->config, p, &dev->info, 0, &c->job)) != LAJIT_OK) {
            if (st == LAJIT_ERR_OUT_OF_MEMORY)
                goto done;
            set_failure(c, "prepare: %.200s", env->errmsg);
            lj_clear_error(env);
            st = LAJIT_OK;
            continue;
        }
        c->have_job = 1;
        int found = 0;
        if ((st = lj_cache_get(cache, c->job.key, 0, &c->entry, &found)) != LAJIT_OK)
            goto done;
        c->have_image = found;
        tasks[n - 1].job = found ? NULL : &c->job;
    }
    res.n_space = n_space;
    res.n_valid = n;
    progress(&o, 0, n, "compiling");
    lj_kernel_compile_parallel(env, tasks, n, o.threads);
    for (int i = 0; i < n; i++) {
        candidate *c = &cands[i];
        if (tasks[i].job && tasks[i].status != LAJIT_OK) {
            set_failure(c, "compile: %.200s", tasks[i].error);
        } else if (tasks[i].job) {
            int found = 0;
            st = lj_cache_put(cache, c->job.key, 0, &tasks[i].compiled);
            if (st == LAJIT_OK)
                st = lj_cache_get(cache, c->job.key, 0, &c->entry, &found);
            if (st == LAJIT_OK && !found)
                st = lj_error(env, LAJIT_ERR_INTERNAL, "a kernel just stored is not in the cache");
            if (st != LAJIT_OK) {
                lj_compile_task_free(env, &tasks[i]);
                goto done;
            }
            c->have_image = 1;
        }
        lj_compile_task_free(env, &tasks[i]);
    }
    progress(&o, 0, n, "timing");

    /* Timing in the private context; the caller's current context is restored at the end. */
    CUcontext saved = NULL;
    CUresult r = LJ_CU(env, dev->drv, cuCtxGetCurrent, &saved);
    if (r != CUDA_SUCCESS) {
        st = lj_driver_error(env, dev->drv, r, "cuCtxGetCurrent");
        goto done;
    }
    b.env = env;
    b.drv = dev->drv;
    b.shadow = *dev;
    b.cudev = dev->dev;
    b.p = p;
    b.layout = layout;
    b.decl = p->op == LJ_OP_CUSTOM ? lj_family_args(f) : NULL;
    if (b.decl) {
        if ((st = custom_layout(env, &b)) != LAJIT_OK)
            goto done;
        if (!(b.packed = lj_calloc(env, MAX_SETS, sizeof *b.packed))) {
            st = lj_oom(env);
            goto done;
        }
    } else {
        size_t off[LJ_DENSE_BUFFERS];
        set_offsets(&layout, off, &b.set_bytes);
    }
    if (!(b.host = lj_malloc(env, b.set_bytes))) {
        st = lj_oom(env);
        goto done;
    }
    make_host_image(&b);
    if ((st = bench_open(&b)) == LAJIT_OK) {
        for (int i = 0; i < n && st == LAJIT_OK; i++) {
            candidate *c = &cands[i];
            if (c->have_image) {
                r = time_candidate(&b, c, o.warmup, o.runs);
                if (sticky_error(r)) {
                    lj_log(env, LAJIT_LOG_WARN,
                           "tuning %s: [%s] faulted (%s); timing goes on in "
                           "a fresh context",
                           lj_family_name(f), c->result.config, c->result.failure);
                    st = bench_reset(&b);
                }
            }
            progress(&o, i + 1, n, c->result.config);
        }
        bench_close(&b);
    }
    LJ_CU(env, dev->drv, cuCtxSetCurrent, saved);
    if (st != LAJIT_OK)
        goto done;

    if (!(res.results = lj_malloc(env, sizeof *res.results * (size_t)(n ? n : 1)))) {
        st = lj_oom(env);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        candidate *c = &cands[i];
        res.results[i] = c->result;
        int measured = !c->result.failure[0] && c->result.ms >= 0;
        if (measured && (!res.have_best || c->result.ms < res.best_ms)) {
            res.best = c->config;
            res.best_ms = c->result.ms;
            res.have_best = 1;
        }
        if (measured && same_config(&c->config, &res.dflt))
            res.default_ms = c->result.ms;
    }
    res.n_results = n;
    *out = res;
    res.results = NULL;

done:
    if (cands)
        for (int i = 0; i < n_space; i++)
            if (cands[i].have_job)
                lj_kernel_job_free(L, &cands[i].job);
    lj_free(env, b.host);
    lj_free(env, b.packed);
    lj_free(env, res.results);
    lj_free(env, tasks);
    lj_free(env, cands);
    lj_free(env, space);
    return st;
}
