/* lajit.h — the whole public C API of lajit, a JIT kernel generator for Lightning Attention
 * (linear attention with an optional per-head scalar decay).
 *
 * An application includes this one header (and DLPack's dlpack.h, which it includes), links
 * liblajit, creates a context and calls the op entry points on device pointers and a stream.
 * Kernels are generated from templates, compiled with NVRTC on first use, cached in memory and
 * on disk, and launched through the CUDA driver API. libcuda and NVRTC are loaded at run time:
 * the library loads, expands and compiles kernels on a machine with no GPU and no driver.
 *
 * Conventions (as in SQLite and zstd):
 * - Every fallible call returns lajit_status. Values are pinned and never reused.
 * - lajit_errmsg(ctx) gives the detail of the last failure on that context; the text is owned by
 *   the context and valid until the next call on it.
 * - Outputs are written only on success. Destroy functions accept NULL.
 * - The library never prints, exits or aborts; diagnostics go to the optional log callback.
 * - Thread safety: a context is used by one thread at a time (use one context per thread);
 *   distinct contexts are independent and may be used concurrently, and share the disk cache
 *   safely. Functions without a context (version, status strings, decay helpers) are
 *   thread-safe. lajit may run work on threads of its own during a call (parallel NVRTC
 *   compiles while tuning), but never calls the context's allocator or log from them: callbacks
 *   run on the calling thread, before the call returns.
 *
 * The mathematics every op computes is the reference of DESIGN.md: per batch b and head h,
 *   S_t = λ S_{t−1} + k_tᵀ v_t,   o_t = σ q_t S_t,   λ = exp(−s_h) (λ = 1 with no decay),
 * with S accumulated in fp32 and an optional initial state S_0. States are stored in float32 by
 * default; the forward's and decode's also in bfloat16 or float16 (a storage format: kernels
 * read them into fp32, accumulate in fp32 and round to nearest on the final write). */
#ifndef LAJIT_H
#define LAJIT_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(LAJIT_BUILDING) && defined(__GNUC__)
#define LAJIT_API __attribute__((visibility("default")))
#else
#define LAJIT_API
#endif

/* ---- Version ------------------------------------------------------------------------------ */

#define LAJIT_VERSION_MAJOR 0
#define LAJIT_VERSION_MINOR 1
#define LAJIT_VERSION_PATCH 0
#define LAJIT_VERSION_NUMBER \
    (LAJIT_VERSION_MAJOR * 10000 + LAJIT_VERSION_MINOR * 100 + LAJIT_VERSION_PATCH)
#define LAJIT_VERSION_STRING "0.1.0"

/* The library's version number (LAJIT_VERSION_NUMBER of the build that made it) and string. */
LAJIT_API unsigned lajit_version(void);
LAJIT_API const char *lajit_version_string(void);

/* ---- Status ------------------------------------------------------------------------------- */

/* Pinned values: a value's meaning never changes and a retired value is never reused. */
typedef enum lajit_status {
    LAJIT_OK = 0,
    LAJIT_ERR_INVALID_ARGUMENT = 1,      /* NULL, bad tensor, bad shape/dtype/stride, bad option */
    LAJIT_ERR_OUT_OF_MEMORY = 2,         /* a host allocation failed */
    LAJIT_ERR_NO_DRIVER = 3,             /* libcuda is absent or is the toolkit's stub */
    LAJIT_ERR_NO_DEVICE = 4,             /* the driver is there but the device is not */
    LAJIT_ERR_DRIVER = 5,                /* a driver call failed (name in lajit_errmsg, the
                                       CUresult from lajit_last_driver_error) */
    LAJIT_ERR_NO_COMPILER = 6,           /* NVRTC could not be loaded and no cached kernel exists */
    LAJIT_ERR_COMPILE = 7,               /* NVRTC rejected a kernel (log excerpt in lajit_errmsg) */
    LAJIT_ERR_TEMPLATE = 8,              /* a template or family spec failed (Lua traceback) */
    LAJIT_ERR_LIMIT = 9,                 /* a template exceeded its instruction or memory limit */
    LAJIT_ERR_UNSUPPORTED = 10,          /* a valid request no kernel of the family supports */
    LAJIT_ERR_IO = 11,                   /* a file could not be read or written */
    LAJIT_ERR_CACHE = 12,                /* a cache directory or entry was refused */
    LAJIT_ERR_DATABASE = 13,             /* a tuning database or bundle error (SQLite message) */
    LAJIT_ERR_STRUCT_SIZE = 14,          /* struct_size of a descriptor is unknown to this build */
    LAJIT_ERR_CHECK_FAILED = 15,         /* checked mode found bad device-side values */
    LAJIT_ERR_NOT_FOUND = 16,            /* no such family, parameter or entry */
    LAJIT_ERR_INTERNAL = 17,             /* a bug in lajit; please report the message */
    LAJIT_ERR_DEVICE_OUT_OF_MEMORY = 18, /* device memory ran out (CUDA_ERROR_OUT_OF_MEMORY in
                                            an allocation, module load or launch): free device
                                            memory and retry; the context stays usable */
    LAJIT_ERR_DEVICE_FAULT = 19,         /* a kernel faulted (illegal address, launch failure,
                                       misaligned address, assert, timeout, ...): the CUDA
                                       context is broken for good, every later call in it fails
                                       the same way. In the primary context (the one lajit and
                                       the CUDA runtime share) only a device reset or a new
                                       process recovers; destroy the lajit contexts first */
    LAJIT_ERR_NO_NCCL = 20, /* libnccl.so.2 (or $LAJIT_NCCL_PATH) could not be loaded or lacks an
                               entry point: only the context-parallel ops need it */
    LAJIT_ERR_NCCL = 21     /* an NCCL call failed (its name, ncclResult_t and text in
                               lajit_errmsg) */
} lajit_status;

/* A short constant description of a status ("invalid argument"); never NULL. */
LAJIT_API const char *lajit_status_string(lajit_status status);

/* ---- Context ------------------------------------------------------------------------------ */

typedef struct lajit_ctx lajit_ctx;

/* Allocator in Lua's style: new_size 0 frees ptr (and returns NULL); otherwise behaves like
 * realloc(ptr, new_size), ptr NULL allocates. old_size is the size ptr was allocated with (0
 * when ptr is NULL). Returning NULL for new_size > 0 is an allocation failure (the call then
 * fails with LAJIT_ERR_OUT_OF_MEMORY, or a tuning candidate is dropped, and nothing leaks).
 * Every host allocation lajit itself makes for a context goes through it: Lua states, kernel
 * texts and images, and the NVRTC compiles of the eager tuner, which run on worker threads but
 * have their allocations made for them by the thread that called lajit. So the allocator is
 * called only on the thread using the context, during a call on it, never concurrently for one
 * context: it needs no lock and may keep per-thread state. (An allocator shared by contexts
 * that different threads use must be thread-safe.) Not through it: what NVRTC, the CUDA driver,
 * SQLite (tuning database, bundles) and the C library's stdio and directory streams allocate
 * internally. */
typedef void *(*lajit_alloc_fn)(void *user, void *ptr, size_t old_size, size_t new_size);

typedef enum lajit_log_level {
    LAJIT_LOG_ERROR = 0,
    LAJIT_LOG_WARN = 1,
    LAJIT_LOG_INFO = 2,
    LAJIT_LOG_DEBUG = 3
} lajit_log_level;

/* Receives one message (no trailing newline), valid only during the call. */
typedef void (*lajit_log_fn)(void *user, lajit_log_level level, const char *message);

/* Context flags. */
#define LAJIT_CTX_NO_DISK_CACHE 0x1u /* keep compiled kernels in memory only */
#define LAJIT_CTX_CHECKED       0x2u /* validate device-side values (costs a synchronisation) */
#define LAJIT_CTX_NO_DEVICE     0x4u /* never touch the driver: generation and compile only */
#define LAJIT_CTX_FAMILY_OVERRIDE \
    0x8u /* a family from outside (lajit_ctx_add_families, LAJIT_FAMILY_PATH) may replace a
            built-in family of the same name; without it such a name is an error */

/* Autotune policies (lajit_ctx_desc.autotune). The tuning database is tune.db in the cache
 * directory (none with LAJIT_CTX_NO_DISK_CACHE); an unusable database means defaults. */
#define LAJIT_AUTOTUNE_ENV 0u /* from the environment: LAJIT_AUTOTUNE=off (default) | eager */
#define LAJIT_AUTOTUNE_OFF 1u /* a bucket uses the database's winner if any, else the default */
#define LAJIT_AUTOTUNE_EAGER \
    2u /* a bucket with no winner is tuned on its first call (once per
                                   bucket and device, by one process at a time; others use the
                                   default meanwhile) */

typedef struct lajit_ctx_desc {
    size_t struct_size;   /* sizeof(lajit_ctx_desc): lets later versions grow the struct */
    int device;           /* CUDA device ordinal */
    lajit_alloc_fn alloc; /* NULL: the C library's realloc/free */
    void *alloc_user;
    lajit_log_fn log; /* NULL: diagnostics are dropped */
    void *log_user;
    lajit_log_level log_level; /* messages above this level are not produced */
    const char *cache_dir;     /* NULL: $LAJIT_CACHE_DIR, else $XDG_CACHE_HOME/lajit, else
                                 ~/.cache/lajit. Copied at creation. */
    uint32_t flags;            /* LAJIT_CTX_* */
    uint32_t autotune;         /* LAJIT_AUTOTUNE_*; 0 (LAJIT_AUTOTUNE_ENV): the environment
                                 decides. Added in 0.1: a struct_size ending before it is
                                 accepted and means 0. */
    const char *bundle;        /* an offline kernel set written by `lajit gen` (NULL:
                                 $LAJIT_BUNDLE, else none): kernels are taken from it before
                                 any compile, so NVRTC need not be installed. Opened (and
                                 checked) at creation: LAJIT_ERR_DATABASE for a missing or
                                 damaged file. Added in 0.1, like autotune. */
} lajit_ctx_desc;

/* Fills *desc with the defaults (device 0, system allocator, no log, default cache). */
LAJIT_API void lajit_ctx_desc_init(lajit_ctx_desc *desc);

/* Creates a context. desc may be NULL for the defaults. The driver is not touched here: a
 * context can be created on a machine with no GPU; ops that need one then fail with
 * LAJIT_ERR_NO_DRIVER or LAJIT_ERR_NO_DEVICE. On failure *out is untouched. The environment
 * variable LAJIT_CHECK=1 adds LAJIT_CTX_CHECKED. LAJIT_PDL=0 turns programmatic dependent launch
 * off for the context's kernels, 1 (or unset) leaves it on: a kernel that supports it (decode)
 * is launched so that its CTAs may start while the previous kernel on the stream finishes, on
 * devices of compute capability 9.0 and later with a driver that has cuLaunchKernelEx; any
 * other value fails with LAJIT_ERR_INVALID_ARGUMENT. */
LAJIT_API lajit_status lajit_ctx_create(const lajit_ctx_desc *desc, lajit_ctx **out);

/* Adds the families of folders outside the library (path: one folder, or several separated by
 * ':'): each subfolder holding a family.lua is a family of that subfolder's name, reached with
 * lajit_launch (op "custom") or, for an attention op, by name in its args. The folders are
 * listed now; their files are read, under the same rules as every template file, when a family
 * is first used. LAJIT_FAMILY_PATH, when set at creation, is added the same way by
 * lajit_ctx_create. Refused with nothing added: a folder that is missing or not a folder
 * (LAJIT_ERR_IO), a family name that is not letters, digits, '_' and '-', one already defined by
 * an added folder, or a built-in family's name without LAJIT_CTX_FAMILY_OVERRIDE (with it, the
 * built-in must not have been used in ctx yet) (LAJIT_ERR_INVALID_ARGUMENT). */
LAJIT_API lajit_status lajit_ctx_add_families(lajit_ctx *ctx, const char *path);
/* Destroys a context and everything it owns (Lua state, loaded modules). Accepts NULL. The
 * caller must have synchronised the streams of the context's launches. */
LAJIT_API void lajit_ctx_destroy(lajit_ctx *ctx);

/* The detailed message of the last failed call on ctx ("" when none). Owned by ctx, valid until
 * the next call on ctx. With ctx NULL: why the last lajit_ctx_create of the calling thread
 * failed (e.g. which check a bundle failed), else a constant text saying there is no context. */
LAJIT_API const char *lajit_errmsg(const lajit_ctx *ctx);

/* The CUDA driver's own result (a CUresult) behind the last failed call on ctx, when that
 * failure was a driver call's: e.g. 2 (CUDA_ERROR_OUT_OF_MEMORY) with
 * LAJIT_ERR_DEVICE_OUT_OF_MEMORY, 700 (CUDA_ERROR_ILLEGAL_ADDRESS) with LAJIT_ERR_DEVICE_FAULT,
 * any result with LAJIT_ERR_DRIVER. Returns 0 (CUDA_SUCCESS) when the last failure was not a
 * driver call's, or no call has failed. When name is not NULL, *name receives the result's name
 * as the driver gives it ("CUDA_ERROR_OUT_OF_MEMORY"; "CUDA error N" when the driver cannot
 * name it; "" with 0), owned by ctx with lajit_errmsg's lifetime. With ctx NULL, returns 0 and
 * "". Thread safety: like lajit_errmsg, read it on the thread that uses ctx. */
LAJIT_API int lajit_last_driver_error(const lajit_ctx *ctx, const char **name);

/* ---- Kernel generation (no GPU needed) --------------------------------------------------- */

/* Names of the built-in families, NULL-terminated, static. */
LAJIT_API const char *const *lajit_family_names(void);
/* Every family ctx can use: the built-in ones (less those an outside family replaces), then
 * those of its family path. *names is NULL-terminated, owned by ctx until lajit_ctx_destroy;
 * *n is its length. */
LAJIT_API lajit_status lajit_family_list(lajit_ctx *ctx, const char *const **names, size_t *n);

/* Expands a family's template for one configuration and problem, given as "KEY=VALUE" strings
 * (configuration parameters in capitals, problem fields such as dtype=bf16, D=128 in lower
 * case; anything not given takes the family's representative problem and its default
 * configuration), for arch ("sm_80", "sm_90a", "sm_100a", "sm_120"; NULL for sm_90a). On
 * success *source is a NUL-terminated text the caller frees with lajit_free(ctx, ...). */
LAJIT_API lajit_status lajit_expand(lajit_ctx *ctx, const char *family, const char *arch,
                                    const char *const *assignments, size_t n_assignments,
                                    char **source);

/* Releases memory the library returned (lajit_expand's text). Accepts NULL. */
LAJIT_API void lajit_free(lajit_ctx *ctx, void *ptr);

/* ---- Parameter discovery (no GPU needed) ------------------------------------------------- */

/* What a family is, for tools that list or sweep its space (runtime/discover.c). The strings
 * are owned by ctx and stay valid until lajit_ctx_destroy. */
typedef struct lajit_family_info {
    size_t struct_size; /* set by the caller: sizeof(lajit_family_info) */
    const char *name;   /* "la_fwd" */
    const char *op;     /* "fwd", "bwd" or "decode": the op whose calls it serves */
    int n_params;       /* tunable parameters: indices 0 .. n_params-1 of lajit_family_param */
} lajit_family_info;

/* One tunable parameter of a family: its name and the candidate values its spec
 * (templates/<family>/family.lua, `params`) allows, in the spec's order, with their bounds.
 * Every value of a valid configuration is one of values[0 .. n_values-1]; min and max are the
 * smallest and largest of them. name and values are owned by ctx and stay valid until
 * lajit_ctx_destroy. */
typedef struct lajit_param_info {
    size_t struct_size;      /* set by the caller: sizeof(lajit_param_info) */
    const char *name;        /* in capitals: "TILE_V" */
    long long min, max;      /* bounds of the candidate values */
    int n_values;            /* at least 1 */
    const long long *values; /* the candidate values */
} lajit_param_info;

/* Describes family (a name of lajit_family_names(), or one from LAJIT_TEMPLATE_DIR), loading its
 * spec into ctx if needed. out->struct_size must be set (LAJIT_ERR_STRUCT_SIZE when it is
 * smaller than this build's struct; a larger one from a newer header is accepted and only the
 * fields known here are written). LAJIT_ERR_NOT_FOUND for an unknown family. *out is written
 * only on success. Same thread rule as every call on ctx. */
LAJIT_API lajit_status lajit_family_describe(lajit_ctx *ctx, const char *family,
                                             lajit_family_info *out);

/* Parameter index (0 .. n_params-1, in name order) of family into *out; struct_size rules as
 * for lajit_family_describe. LAJIT_ERR_NOT_FOUND for an unknown family or an index out of
 * range. *out is written only on success. */
LAJIT_API lajit_status lajit_family_param(lajit_ctx *ctx, const char *family, int index,
                                          lajit_param_info *out);

/* ---- Attention ops ------------------------------------------------------------------------ */

/* Flags of the op arguments. */
#define LAJIT_STATE_VK 0x1u /* states and pools are [.., E, D] instead of [.., D, E] ("KV") */

/* Slot indices (state_slots of varlen lajit_attn_fwd and of lajit_attn_decode), int32, one per
 * sequence or row:
 *   s >= 0                 read the initial state from slot s, write the final state to slot s;
 *   LAJIT_SLOT_SKIP (−1)   read nothing (start from zero) and write nothing (decode: the row is
 *                          skipped entirely);
 *   LAJIT_SLOT_FRESH(s)    start from zero without reading slot s, then write the final state
 *                          to slot s: a server's new sequence needs no memset of its slot.
 * FRESH(s) is −2 − s (every s in [0, 2^31 − 2] has one); LAJIT_SLOT_IS_FRESH(x) tells it apart
 * and LAJIT_SLOT_FRESH_SLOT(x) gives s back. Checked mode validates the slot s of a fresh index
 * like any other (in [0, P), no slot named twice). lajit_attn_bwd reads the same encoding: a
 * fresh sequence's S_0 is zero, its dS_N is read from slot s, and its dS_0 is not written (the
 * gradient of a constant). */
#define LAJIT_SLOT_SKIP          (-1)
#define LAJIT_SLOT_FRESH(s)      (-2 - (s))
#define LAJIT_SLOT_IS_FRESH(x)   ((x) <= -2)
#define LAJIT_SLOT_FRESH_SLOT(x) (-2 - (x))

/* Forward (prefill / training). Tensors are DLPack views of device memory (kDLCUDA):
 * - q, k [B,H,N,D] or any strided view of that shape with a unit last stride (so [B,N,H,D]
 *   memory passes as a permuted view); v, o [B,H,N,E]. dtype float32, float16 or bfloat16, the
 *   same for q, k and v. o has their dtype, or mixes one float32 side with one 16-bit side:
 *   float32 q, k, v with a float16 or bfloat16 o (a layer computed in fp32 feeding a 16-bit
 *   model; tf32 tensor cores, la_fwd), or 16-bit q, k, v with a float32 o. float16 with
 *   bfloat16 is refused. (la_fwd_sm90, the sm_90a default for 16-bit inputs, takes only one
 *   dtype: a mixed call goes to la_fwd.)
 * - varlen (cu_seqlens given): q, k [T,H,D], v, o [T,H,E] packed; cu_seqlens int32 [nseq+1]
 *   from 0, non-decreasing, ending at T.
 * - s: float32 [H], finite and >= 0; NULL selects the no-decay kernels.
 * - initial_state (read) and final_state (written): [B,H,D,E] ([B,H,E,D] with
 *   LAJIT_STATE_VK), strided allowed, either may be NULL, final_state may alias initial_state.
 *   dtype float32 (the default), bfloat16 or float16, whatever q's is; when both are given they
 *   share one dtype (one pool). A 16-bit state is read into fp32, carried in fp32 through the
 *   whole sequence and rounded to nearest once when written.
 *   With varlen they are a pool [P,H,D,E] addressed by state_slots (int32 [nseq]; −1: no
 *   initial state and no final state written for that sequence; LAJIT_SLOT_FRESH(s): start
 *   from zero, write slot s).
 * - scale: σ, finite and nonzero (1 for the lightning convention).
 * - o NULL (and q NULL or not: it is not read): the final state only, S_N = λ^N S_0 +
 *   Σ_t λ^{N−1−t} k_tᵀ v_t — with no initial_state, the local state M of the span of tokens
 *   given, which lajit_attn_state_scan turns into each span's incoming state (the building
 *   blocks of splitting a sequence between GPUs). final_state is then required. Served by
 *   la_fwd_sm90 (sm_90a, f16/bf16, D a multiple of 64) and la_fwd (every arch and dtype);
 *   la_recurrent refuses it.
 * family: NULL for the default forward family, or a family name ("la_recurrent").
 * stream: a CUstream (NULL: the legacy default stream). The call is asynchronous; a cached
 * kernel launches without allocation, Lua or host synchronisation (graph-capturable). With few
 * sequences and heads the default family splits each sequence across the GPU (SPLIT segments:
 * templates/common/split.cuh); it then uses two buffers of the context, allocated on the first
 * call of a larger shape (make that call before capturing a graph; calls that share a context
 * must share a stream, as for the backward's workspace). */
typedef struct lajit_attn_fwd_args {
    size_t struct_size; /* sizeof(lajit_attn_fwd_args) */
    const DLTensor *q, *k, *v;
    DLTensor *o;
    const DLTensor *s;
    float scale;
    const DLTensor *initial_state;
    DLTensor *final_state;
    const DLTensor *cu_seqlens;
    const DLTensor *state_slots;
    uint32_t flags; /* LAJIT_STATE_VK */
    const char *family;
    void *stream;
} lajit_attn_fwd_args;

LAJIT_API lajit_status lajit_attn_fwd(lajit_ctx *ctx, const lajit_attn_fwd_args *args);

/* Backward (training): given dO (and optionally dS_N), the gradients of lajit_attn_fwd's inputs.
 * Nothing from the forward is needed but its inputs: the backward recomputes the states.
 * - q, k, v, dout (dO, shaped like o), dq, dk, dv: as in lajit_attn_fwd (dq, dk like q, dv like
 *   v), one dtype for all; [B,H,N,D] or strided views, or packed [T,H,D] with cu_seqlens.
 * - s: float32 [H] or NULL (no decay), as in the forward.
 * - ds: float32 [H], the gradient of s, overwritten (summed over the batch and the sequences);
 *   NULL when not wanted (then nothing is paid for it). Needs s.
 * - initial_state: S_0 as in the forward (NULL: zero). d_initial_state: dS_0 (written; NULL
 *   when not wanted). d_final_state: dS_N, the gradient arriving at the final state (read; NULL:
 *   zero). All float32, [B,H,D,E] (or [B,H,E,D] with LAJIT_STATE_VK), strided allowed (a 16-bit
 *   state is refused: gradients of states are kept in fp32); with varlen they are pools
 *   addressed by state_slots (−1: no S_0, dS_N = 0, dS_0 not written; LAJIT_SLOT_FRESH(s):
 *   S_0 = 0, dS_N from slot s, dS_0 not written).
 * - workspace: device scratch for ds, at least lajit_attn_bwd_workspace_size() bytes, 16-byte
 *   aligned (uint8 [bytes]); NULL: the context keeps one, allocated on the first call that needs
 *   it (make that call before capturing a graph; calls that share it must share a stream).
 * - dq, dk and dv all NULL: d_initial_state alone (required; ds must be NULL), the reversed walk
 *   over q and dout without outputs (k and v may be NULL: they are not read): with no
 *   d_final_state, the span's local gradient state Mg = σ Σ_t λ^t q_tᵀ dO_t (t = 1..N) that
 *   lajit_attn_state_scan's reverse walk exchanges (context parallelism's backward); with one,
 *   λ^N dS_N + Mg. One of the three kernels' work, or less.
 * - scale, flags, family (NULL: "la_bwd"), stream: as in the forward. Every output is
 *   deterministic (no floating-point atomics). No output may share an element with an input or
 *   another output; views that only interleave in one buffer (dq, dk, dv as the column slices of
 *   a packed [B,N,H,2D+E] gradient) share none and are accepted, in every op. */
typedef struct lajit_attn_bwd_args {
    size_t struct_size; /* sizeof(lajit_attn_bwd_args) */
    const DLTensor *q, *k, *v, *dout;
    DLTensor *dq, *dk, *dv;
    const DLTensor *s;
    DLTensor *ds;
    float scale;
    const DLTensor *initial_state;
    DLTensor *d_initial_state;
    const DLTensor *d_final_state;
    const DLTensor *cu_seqlens;
    const DLTensor *state_slots;
    DLTensor *workspace;
    uint32_t flags; /* LAJIT_STATE_VK */
    const char *family;
    void *stream;
} lajit_attn_bwd_args;

LAJIT_API lajit_status lajit_attn_bwd(lajit_ctx *ctx, const lajit_attn_bwd_args *args);

/* The workspace bytes lajit_attn_bwd needs for ds with nseq sequences (B, or the varlen count),
 * H heads and value width E (0 when ds is not requested needs none). 0 when an argument is not
 * positive; SIZE_MAX when the size does not fit in size_t (lajit_attn_bwd refuses such a call). */
LAJIT_API size_t lajit_attn_bwd_workspace_size(int64_t nseq, int64_t H, int64_t E);

/* Decode (inference serving): T (1..8, the same for every row) steps of the recurrence per row,
 * updating the state in place (accumulated in fp32 whatever its storage).
 * - q, k [B,H,D] (T = 1) or [B,T,H,D]; v, o [B,H,E] or [B,T,H,E]; strided views with a unit
 *   last stride (e.g. slices of one packed qkv buffer). dtype float32, float16 or bfloat16, the
 *   same for q, k and v; o as in lajit_attn_fwd (their dtype, or float32 inputs with a 16-bit o,
 *   or 16-bit inputs with a float32 o).
 * - state: pool [P,H,D,E] ([P,H,E,D] with LAJIT_STATE_VK), updated in place; float32 (the
 *   default), bfloat16 or float16 (half the bytes: each call reads it into fp32, runs its T
 *   steps in fp32 and rounds to nearest once when writing it back).
 * - state_slots: int32 [B], the pool slot of each row; −1 skips the row (its output, its state
 *   and its step_states untouched); LAJIT_SLOT_FRESH(s) starts the row from a zero state and
 *   writes slot s (a new sequence's first tokens). NULL: row b uses slot b (P >= B). Two rows
 *   must not name the same slot (checked in checked mode, undefined otherwise); slots >= P are
 *   caught in checked mode and are undefined behaviour otherwise.
 * - step_states: optional compact [B,T,H,D,E] (or [.., E, D] with LAJIT_STATE_VK) of the
 *   state's dtype, receiving the state after each step (verify/commit of drafted tokens).
 * - s, scale, family, stream: as for lajit_attn_fwd. */
typedef struct lajit_attn_decode_args {
    size_t struct_size; /* sizeof(lajit_attn_decode_args) */
    const DLTensor *q, *k, *v;
    DLTensor *o;
    const DLTensor *s;
    float scale;
    DLTensor *state;
    const DLTensor *state_slots;
    DLTensor *step_states;
    uint32_t flags; /* LAJIT_STATE_VK */
    const char *family;
    void *stream;
} lajit_attn_decode_args;

LAJIT_API lajit_status lajit_attn_decode(lajit_ctx *ctx, const lajit_attn_decode_args *args);

/* State scan: the exchange of context parallelism (one sequence split into P spans processed
 * apart: on the GPUs of a group over NCCL, or in pieces of one GPU), in DESIGN.md's terms. Span j
 * holds the tokens t = a_j + 1 .. a_j + n_j (a_0 = 0, a_{j+1} = a_j + n_j, N = a_P); per batch row
 * b and head h, λ = exp(−s_h) (1 without s).
 *
 * Forward. Span j's local state is its final state from a zero start,
 *     M_j = Σ_{t in span j} λ^{a_j + n_j − t} k_tᵀ v_t,
 * and the state entering it is S_{a_j} = λ^{n_{j−1}} S_{a_{j−1}} + M_{j−1}, from S_{a_0} = S_0 (or
 * 0). The scan writes incoming_states[j] = S_{a_j} for every span and, when asked, final_state =
 * S_N = λ^{n_{P−1}} S_{a_{P−1}} + M_{P−1}. With initial_state = S_{a_j}, lajit_attn_fwd over span
 * j alone gives that span's exact outputs.
 *
 * Reverse (LAJIT_SCAN_REVERSE), for the backward. What is exchanged is, for span j, the gradient
 * reaching its final state S_{a_j + n_j} from everything after the span (later tokens and dS_N):
 *     H_j = λ G_{a_j + n_j + 1}  when a token follows the span,   H_j = dS_N (or 0) otherwise,
 * with G_t DESIGN's gradient of S_t (dS_N entering G_N undecayed), so that H_j is exactly the
 * d_final_state of span j's own lajit_attn_bwd. Span j's local gradient state is the d_initial_state its lajit_attn_bwd returns
 * without a d_final_state,
 *     Mg_j = σ Σ_{t in span j} λ^{t − a_j} q_tᵀ dO_t,
 * and DESIGN's G_t = λ G_{t+1} + σ q_tᵀ dO_t walked through span j gives H_{j−1} = λ^{n_j} H_j +
 * Mg_j. The scan walks from the last span: incoming_states[j] = H_j and, when asked, final_state
 * = λ^{n_0} H_0 + Mg_0 = dS_0 (DESIGN's λ G_1).
 *
 * Both are one walk: X = initial_state (or 0); for j = 0 .. P−1 (reverse: P−1 .. 0)
 * incoming_states[j] = X, X = λ^{n_j} X + local_states[j]; then final_state = X. X is carried in
 * fp32 and λ^{n} is exp(−s_h·n) evaluated in fp32 (n up to 2^63).
 *
 * Segments (varlen batches whose sequences cross spans): n_j = −1: span j starts a new sequence;
 * X after it is M_j (λ^{n_j} taken as 0, with decay or without: nothing of the carry passes
 * through, even an infinite one). incoming_states[j] is still the carry entering span j (what a
 * sequence continuing into span j starts from; unused when none does). Reverse applies the same
 * rule in its walk order: the carry after a span marked −1 is its Mg_j alone, so nothing of the
 * spans after it reaches the spans before it. The runtime's total of a lengths row
 * (lj_state_scan's total_lengths) is −1 when any n_j of the row is −1.
 * - local_states: M_j (reverse: Mg_j), float32 [P,B,H,D,E] ([P,B,H,E,D] with LAJIT_STATE_VK),
 *   span first as an all-gather of every rank's [B,H,D,E] lays it out; a strided view with a
 *   unit last stride, address and other strides multiples of 16 bytes ([B,P,H,D,E] memory passes
 *   as a permuted view).
 * - lengths: n_j, int32 or int64, [P] (one length per span) or [P,B] (per batch row), any
 *   non-negative strides (a [B,P] buffer passes as its transposed view); device memory, read on
 *   the device (no host synchronisation); every n_j >= 0 or −1 (a span starting a new sequence;
 *   below −1 is refused in checked mode). A span may be empty (n_j = 0: its M_j is then zero and
 *   X passes through). Read with or without s (the −1 marks).
 * - s: float32 [H] (contiguous), finite and >= 0, or NULL (no decay, λ = 1).
 * - initial_state: the carry entering the walk, S_0 (reverse: dS_N); [B,H,D,E] (or VK) like the
 *   states above; NULL: zero.
 * - incoming_states: written, shaped like local_states.
 * - final_state: written, [B,H,D,E] (or VK): S_N (reverse: dS_0); NULL when not wanted.
 * - flags: LAJIT_STATE_VK (every state of the call is [.., E, D]; the scan is elementwise, so the
 *   layout changes nothing but the shapes expected), LAJIT_SCAN_REVERSE.
 * - family: NULL for "la_state_scan" (a custom family, also reachable through lajit_launch), or
 *   a family declaring the same arguments. stream: as for lajit_attn_fwd.
 * No output may share an element with another tensor of the call (incoming_states does not
 * overwrite local_states in place; final_state does not alias initial_state). Deterministic:
 * every element is walked by one thread in a fixed order. Asynchronous; a cached kernel launches
 * with no allocation, Lua or synchronisation (graph-capturable). Bad arguments are
 * LAJIT_ERR_INVALID_ARGUMENT with a message naming the tensor; checked mode adds
 * LAJIT_ERR_CHECK_FAILED for a length below −1 or a bad s. */
/* lajit_attn_state_scan's flag: walk the spans from the last (gradient states). */
#define LAJIT_SCAN_REVERSE 0x2u

typedef struct lajit_attn_state_scan_args {
    size_t struct_size; /* sizeof(lajit_attn_state_scan_args) */
    const DLTensor *local_states;
    const DLTensor *lengths;
    const DLTensor *s;
    const DLTensor *initial_state;
    DLTensor *incoming_states;
    DLTensor *final_state;
    uint32_t flags; /* LAJIT_STATE_VK, LAJIT_SCAN_REVERSE */
    const char *family;
    void *stream;
} lajit_attn_state_scan_args;

LAJIT_API lajit_status lajit_attn_state_scan(lajit_ctx *ctx,
                                             const lajit_attn_state_scan_args *args);

/* ---- Context parallelism (one sequence over the GPUs of an NCCL communicator) ---------------
 *
 * Forward. The application owns an NCCL communicator of P ranks (ncclComm_t, passed as void *;
 * NCCL is loaded at run time, like the driver: libnccl.so.2, or $LAJIT_NCCL_PATH). Rank r holds
 * the contiguous span of tokens t = a_r + 1 .. a_r + n_r of every sequence of the batch (rank
 * order is NCCL's; a_0 = 0, a_{r+1} = a_r + n_r, N = a_P; n_r may differ per rank, even be 0),
 * and every rank makes the same call on its own span. In the terms of lajit_attn_state_scan:
 *   (a) the span's local state M_r = Σ_{t in span r} λ^{a_r + n_r − t} k_tᵀ v_t (rank 0 with an
 *       initial state exchanges λ^{n_0} S_0 + M_0 instead, its final state from S_0), computed by
 *       lajit_attn_fwd with o NULL into the context's workspace, and n_r written beside it;
 *   (b, c) one exchange of every rank's [M_r, n_r] (B·H·D·E floats and an int64, padded to 16
 *       bytes) that gives S_{a_r}, the state entering span r, in one of two ways (flags):
 *       LAJIT_CP_ALLGATHER — an in-place ncclAllGather (LASP-2's exchange: each rank receives
 *       P·B·H·D·E·4 bytes), then lajit_attn_state_scan over the P gathered spans (rank 0 skips
 *       it unless final_state is wanted, its incoming state being S_0);
 *       LAJIT_CP_LOGSTEP — ⌈log2 P⌉ steps of ncclSend/ncclRecv in which rank r sends its running
 *       (carry, length) to r + 2^i and combines what r − 2^i sent (X ← λ^L X_received + X, by
 *       the state scan over two spans), one shift to r + 1, and with final_state an
 *       ncclBroadcast of S_N from the last rank: one state per step whatever P. Neither flag:
 *       the all-gather up to 8 ranks, the log-step scan beyond (docs/notes/context_parallel.md:
 *       the model, the crossover);
 *   (d) lajit_attn_fwd over the span from S_{a_r}: the span's exact outputs o_t = σ q_t S_t.
 * With few heads and a long dense span (LAJIT_CP_SEGMENTS, automatic by default) steps (a) and
 * (d) walk the span as segments side by side, their local states scanned into M_r, and after the
 * exchange into each segment's incoming state: k and v read twice in all instead of three times;
 * the outputs differ from the walk of the whole span by rounding only.
 * All on the caller's stream, with no host synchronisation; after the first call of a shape
 * (which sizes the workspace and compiles the kernels) nothing is allocated: make that call
 * before capturing a graph. Calls that share a context must share a stream (the workspace).
 * - comm: a blocking communicator (ncclComm_t; a non-blocking one is refused when NCCL answers
 *   ncclInProgress); its device (ncclCommCuDevice) must be the context's.
 * - q, k [B,H,n_r,D], v, o [B,H,n_r,E]: this rank's span, as in lajit_attn_fwd (strided views,
 *   one dtype; o written). n_r = 0 is allowed (the rank then contributes an empty span and
 *   writes nothing to o). The kernels of steps (a) and (d) are those of lajit_attn_fwd (the
 *   state-only step: la_fwd_sm90 on sm_90a for f16/bf16 with D a multiple of 64, la_fwd
 *   elsewhere).
 * - s, scale, flags (LAJIT_STATE_VK): as in lajit_attn_fwd, the same on every rank.
 * - initial_state: S_0, float32 [B,H,D,E] (VK: [B,H,E,D]), read by rank 0 only (other ranks
 *   ignore the argument, so every rank may pass the same list); NULL: zero. With n_0 = 0 it must
 *   be contiguous (it is copied into the exchange).
 * - final_state: S_N, float32 [B,H,D,E] (VK), written on every rank that gives it (each computes
 *   it from the gathered spans; the values agree); NULL when not wanted. With the log-step
 *   exchange it is a broadcast, a collective: every rank gives it, or none.
 * - cu_seqlens (varlen): a packed batch whose sequences may cross ranks. Rank r holds a
 *   contiguous slice of the packed tokens, q, k [T_r,H,D], v, o [T_r,H,E], cut into pieces by its
 *   own cu_seqlens (int32 [pieces + 1], from 0 to T_r; a piece may be empty): whole sequences,
 *   and at its ends parts of sequences that cross into it. flags LAJIT_CP_CONTINUES_IN: its
 *   first piece continues the sequence of the previous rank's last piece; LAJIT_CP_CONTINUES_OUT:
 *   its last piece continues on the next rank (rank r's _OUT must match rank r + 1's _IN: not
 *   detectable, wrong answers otherwise). initial_state / final_state are then pools [P,H,D,E]
 *   (VK: [P,H,E,D]) of float32 with state_slots (int32 [pieces], the slot encoding of
 *   lajit_attn_fwd): a piece that continues in does not read its slot's initial state (it
 *   starts from the state the exchange brings), one that continues out does not write its
 *   final state (the rank where the sequence ends does); the rest as lajit_attn_fwd's varlen.
 *   Each rank exchanges one state (its last piece's) whatever its number of pieces. Between
 *   ranks the exchange restarts wherever a sequence starts (lengths −1 in the state scan).
 * Checked here (LAJIT_ERR_INVALID_ARGUMENT unless said): NULL comm; a communicator whose size,
 * rank or device cannot be queried (LAJIT_ERR_NCCL, NCCL's text in lajit_errmsg) or whose device
 * is not the context's; q, k, v, o that disagree in B, H, n_r, D or E; states of another shape
 * or dtype; NCCL missing (LAJIT_ERR_NO_NCCL). Not detectable without a host synchronisation,
 * and so not checked: ranks that disagree about B, H, D, E, s, scale or flags (the all-gather's
 * sizes then differ between ranks: NCCL's behaviour, possibly a hang), a rank that does not make
 * the call (a hang, as with any collective), and a comm pointer that is not a live communicator
 * (undefined behaviour). A rank's failure before the exchange returns before calling NCCL, so
 * the other ranks wait in the all-gather: treat any failure as fatal to the group.
 * - incoming_state (optional): S_{a_r}, the state entering this rank's span as the exchange
 *   gave it, float32 [B,H,D,E] (VK: [B,H,E,D]; varlen: [1,H,D,E], the state entering the first
 *   piece), contiguous CUDA memory of the context's device; written where a state comes from
 *   another rank — every rank but rank 0 (dense), a rank with LAJIT_CP_CONTINUES_IN (varlen) —
 *   and elsewhere left as it is. Keep it for lajit_cp_attn_bwd: a training step that does saves
 *   the backward a pass over k and v and an exchange, for one state per rank (B·H·D·E·4 bytes)
 *   of memory. */
/* The exchange of lajit_cp_attn_fwd and _bwd (flags; neither: the all-gather up to 8 ranks, the
 * log-step scan beyond — docs/notes/context_parallel.md has the crossover). */
#define LAJIT_CP_ALLGATHER 0x10u /* one all-gather of every rank's state: P states per rank */
#define LAJIT_CP_LOGSTEP   0x20u /* ⌈log2 P⌉ + 1 point-to-point steps of one state each */
/* Varlen (cu_seqlens given): this rank's first piece continues the sequence the previous rank's
 * last piece began (or carried on); its last piece continues on the next rank. */
#define LAJIT_CP_CONTINUES_IN  0x40u
#define LAJIT_CP_CONTINUES_OUT 0x80u

typedef struct lajit_cp_attn_fwd_args {
    size_t struct_size; /* sizeof(lajit_cp_attn_fwd_args) */
    void *comm;         /* ncclComm_t */
    const DLTensor *q, *k, *v;
    DLTensor *o;
    const DLTensor *s;
    float scale;
    const DLTensor *initial_state; /* rank 0 only */
    DLTensor *final_state;         /* every rank that gives it */
    const DLTensor *cu_seqlens;    /* NULL, or this rank's pieces (varlen) */
    const DLTensor *state_slots;   /* varlen: the pools' slot of each piece */
    uint32_t flags;                /* LAJIT_STATE_VK, LAJIT_CP_ALLGATHER or LAJIT_CP_LOGSTEP */
    void *stream;
    DLTensor *incoming_state; /* S_{a_r}, for the backward (NULL: not wanted). Added in 0.1: a
                                 struct_size ending before it is accepted and means NULL. */
} lajit_cp_attn_fwd_args;

LAJIT_API lajit_status lajit_cp_attn_fwd(lajit_ctx *ctx, const lajit_cp_attn_fwd_args *args);

/* Backward of lajit_cp_attn_fwd: every rank makes the same call on its own span, with dO of its
 * span (nothing saved from the forward, or the forward's incoming_state: below). In the terms
 * of lajit_attn_state_scan:
 *   (a) the forward's exchange again (each rank's local state and length; the same exchange,
 *       chosen by the same flags): S_{a_r}, the state entering span r — skipped when the
 *       forward's incoming_state is given;
 *   (b) the span's local gradient state Mg_r (lajit_attn_bwd with dq, dk, dv NULL: the reversed
 *       walk over q and dO without outputs; the last rank with a d_final_state exchanges
 *       λ^{n_{P−1}} dS_N + Mg_{P−1}, its dS_0), one exchange of [Mg_r, n_r] and the reverse scan:
 *       H_r, the gradient reaching the span's last state from every later token and dS_N;
 *   (c) lajit_attn_bwd over the span with initial_state S_{a_r} and d_final_state H_r: the
 *       span's exact dq, dk, dv, and its part of ds (the decay's uses inside the span);
 *   (d) ds: the ranks' parts exchanged (an all-gather of P·H floats) and summed in rank order,
 *       so every rank holds the same bits.
 * - q, k, v, dout (like o), dq, dk, dv: this rank's span, [B,H,n_r,D] / [B,H,n_r,E] as in
 *   lajit_cp_attn_fwd; dq, dk, dv written (n_r = 0: nothing written).
 * - s, scale, flags: as in the forward, the same on every rank. ds: float32 [H], the gradient of
 *   s over the whole sequence and batch, written on every rank that gives it (NULL: not wanted;
 *   when any rank wants it every rank must give it, since its exchange is a collective). Needs s.
 * - initial_state: S_0 as in the forward (rank 0 only). d_initial_state: dS_0, float32, written
 *   by rank 0 only (other ranks ignore it). d_final_state: dS_N, float32, read by the last rank
 *   only; NULL: zero.
 * - cu_seqlens, state_slots, LAJIT_CP_CONTINUES_IN / _OUT (varlen): as in the forward; the pools
 *   initial_state, d_final_state (read) and d_initial_state (written) by state_slots with
 *   lajit_attn_bwd's slot encoding, every rank its own pieces' (a piece continuing out reads no
 *   dS_N from its slot: the gradient comes from the next rank; one continuing in writes no dS_0).
 * - incoming_state (optional): what lajit_cp_attn_fwd wrote to its incoming_state for this
 *   rank's span, given by every rank or by none (step (a) is an exchange, a collective: ranks
 *   that disagree hang, undetected). Step (a) is then skipped — no pass over k and v, no
 *   exchange. The gradients are those of the recomputing backward: bit for bit when the
 *   forward did not run by segments (LAJIT_CP_SEGMENTS=off, or spans too short or too many
 *   heads for the automatic choice), else within the rounding of the state's other summation
 *   order. Rank 0 (dense) and a varlen rank without
 *   LAJIT_CP_CONTINUES_IN do not read it (their incoming state is S_0, or the pools'). Shape and
 *   layout as in the forward; contiguous CUDA memory of the context's device. Stale values (a
 *   forward with other inputs) give wrong gradients, undetected.
 * Memory: the context's exchange buffer (as the forward's) and, for ds, lajit_attn_bwd's
 * workspace; nothing is allocated after the first call of a shape (capture after it). Checks,
 * what cannot be checked and the failure rule: as for lajit_cp_attn_fwd. */
typedef struct lajit_cp_attn_bwd_args {
    size_t struct_size; /* sizeof(lajit_cp_attn_bwd_args) */
    void *comm;         /* ncclComm_t */
    const DLTensor *q, *k, *v, *dout;
    DLTensor *dq, *dk, *dv;
    const DLTensor *s;
    DLTensor *ds; /* every rank's, or none */
    float scale;
    const DLTensor *initial_state; /* rank 0 only */
    DLTensor *d_initial_state;     /* rank 0 only */
    const DLTensor *d_final_state; /* the last rank only */
    const DLTensor *cu_seqlens;    /* NULL, or this rank's pieces (varlen) */
    const DLTensor *state_slots;   /* varlen: the pools' slot of each piece */
    uint32_t flags;                /* LAJIT_STATE_VK, LAJIT_CP_ALLGATHER or LAJIT_CP_LOGSTEP */
    void *stream;
    const DLTensor *incoming_state; /* the forward's S_{a_r}: step (a) skipped (NULL: computed).
                                       Added in 0.1, like the forward's. */
} lajit_cp_attn_bwd_args;

LAJIT_API lajit_status lajit_cp_attn_bwd(lajit_ctx *ctx, const lajit_cp_attn_bwd_args *args);

/* ---- Families that declare their own arguments ------------------------------------------ */
/* A family with op "custom" in its spec (one of the family path's, or a built-in) declares its
 * kernel's arguments (`args`: tensors with a dtype and a shape of named symbols, scalars) and is
 * launched by name through lajit_launch, with the same plan table, tuning database, bundles and
 * CLI (lajit tune/gen/compile) as the attention families. templates/README.md is the authoring
 * guide. */
typedef struct lajit_tensor_arg {
    const char *name;       /* as the family's args declare it */
    const DLTensor *tensor; /* NULL: left out (an optional tensor) */
} lajit_tensor_arg;
typedef struct lajit_scalar_arg {
    const char *name;
    double value; /* converted to the declared type: f32 must be finite (and within float's
                     range), i32 and i64 integral and within range */
} lajit_scalar_arg;
typedef struct lajit_int_arg {
    const char *name; /* a shape symbol of the family ("N") */
    int64_t value;
} lajit_int_arg;
/* One launch of a custom family.
 * - tensors: every tensor the family declares, by name, in any order; optional ones may be
 *   left out (or given NULL). Each must be CUDA memory on the context's device, of the declared
 *   dtype ("dtype": the problem's) and rank, with sizes that agree wherever the declaration
 *   uses the same symbol, no zero size, non-negative strides, the address and strides aligned
 *   as the spec asks (align, unit_stride), and element offsets within 63 bits. Outputs may not
 *   share an element with any other argument (disjoint slices of one buffer are fine).
 * - scalars: every declared scalar, by name.
 * - problem: optional values of shape symbols; a symbol not given takes its value from the
 *   first tensor that uses it, and every tensor must agree. The problem's flags has_<name>
 *   follow from which optional tensors are given.
 * - dtype: "f32", "f16" or "bf16" (also "float32", "bfloat16", ...): the problem's element
 *   type, one of the family's `dtypes`; NULL: that of the first given tensor declared "dtype".
 * An unknown or repeated name, a missing tensor or scalar, a wrong dtype or rank, or sizes that
 * disagree are LAJIT_ERR_INVALID_ARGUMENT with a message naming the argument; a family that is
 * not custom, LAJIT_ERR_INVALID_ARGUMENT; an unknown family, LAJIT_ERR_NOT_FOUND. The kernel's
 * parameters are checked against the declaration when its module is loaded (CUDA 12.4+
 * drivers): LAJIT_ERR_TEMPLATE on a mismatch. Asynchronous on stream; a cached kernel launches
 * with no allocation, Lua or synchronisation (graph-capturable), like the attention ops.
 * A family may declare a workspace argument (`workspace = true`): scratch that lajit provides,
 * never the caller (naming it is LAJIT_ERR_INVALID_ARGUMENT). The context keeps one buffer per
 * family, zeroed when it is allocated or grown to the size the family's spec asks for this launch
 * (possibly a function of B or N), and otherwise left as the family's kernels left it; calls
 * that share a context must share a stream (the buffer), and a launch whose size grows the
 * buffer allocates: make such a call once before capturing a graph. */
typedef struct lajit_launch_args {
    size_t struct_size; /* sizeof(lajit_launch_args) */
    const char *family;
    const lajit_tensor_arg *tensors;
    size_t n_tensors;
    const lajit_scalar_arg *scalars;
    size_t n_scalars;
    const lajit_int_arg *problem;
    size_t n_problem;
    const char *dtype;
    void *stream;
} lajit_launch_args;
LAJIT_API lajit_status lajit_launch(lajit_ctx *ctx, const lajit_launch_args *args);

/* ---- Decay conventions --------------------------------------------------------------------
 * Tensor parallelism: the rates depend on the model's total head count, so a GPU holding heads
 * h0 .. h0 + n − 1 of a layer calls the adapter with the total and passes its slice s + h0 to the
 * ops. Called with its own n instead, the slopes differ (ALiBi's depend on n: 64 heads over 8
 * GPUs, the first GPU's head 0 is 2^(−1/8) with the total, 2^(−1) with 8 — tests/cpu/api.c). E.g.
 * MiniMax-Text-01 (64 heads, 80 layers, lightning layers included): layer l's rates are
 * lajit_decay_alibi(64, l, 80, s), and with 8-way tensor parallelism GPU r takes s + 8 r. */

/* The ALiBi-style slopes of the released MiniMax and TransNormerLLM code for layer `layer` of
 * `n_layers` (0-based): for n_heads a power of two 2^(−8(h+1)/H), otherwise ALiBi's
 * interleaved extension; times (1 − layer/(n_layers−1) + 1e−5), or 1 + 1e−5 when n_layers = 1.
 * Writes n_heads values to s. Returns LAJIT_ERR_INVALID_ARGUMENT on bad sizes. */
LAJIT_API lajit_status lajit_decay_alibi(int n_heads, int layer, int n_layers, float *s);

/* The TransNormerLLM paper's rate (8h/H)(1 − layer/n_layers), h 0-based (FLA's
 * chunk_lightning_attn). */
LAJIT_API lajit_status lajit_decay_tnl(int n_heads, int layer, int n_layers, float *s);

/* From a raw log-decay log λ (<= 0): s = −log λ. n values. */
LAJIT_API lajit_status lajit_decay_from_log(const float *log_lambda, int n, float *s);

#ifdef __cplusplus
}
#endif

#endif /* LAJIT_H */
