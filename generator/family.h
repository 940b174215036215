/* family.h — a kernel family as the C side sees it: the problem it is asked to solve, the
 * device it targets, a configuration of its tunable parameters, and the launch geometry. The
 * family itself is Lua (templates/<name>/family.lua); this module loads the spec into a
 * sandboxed Lua state and calls its functions, converting tables to these structs (family.c
 * loads and checks the spec, family_call.c calls it, family_text.c gathers its tuning text).
 *
 * A spec is untrusted: whatever it returns, a bad shape is LAJIT_ERR_TEMPLATE with a message
 * "<family>.<function>: <field> ...", never a crash. Its declarations (params, problems,
 * archs, uses) are read once at load. Every call into it, its load and its template
 * expansions draw from the family's Lua budget (sandbox.h): a spec that burns its limits call
 * after call gets LAJIT_ERR_LIMIT within seconds.
 *
 * Spec contract (family.lua returns a table):
 *   name      string, equal to the folder name
 *   op        "fwd" | "bwd" | "decode" | "custom"
 *   args      op custom only: the kernel's arguments in order (family_args.c has the form),
 *                    with optional `dtypes` (the problem dtypes taken) and `dynamic` (the
 *                    symbols a kernel reads at run time: not baked, log2-bucketed in the plan)
 *   params    { NAME = {v1, v2, ...}, ... }  the tunable space: at most LJ_MAX_PARAMS names of
 *                    capitals, digits and _, each 1 to 64 distinct integers, the product of the
 *                    counts at most LJ_MAX_CONFIGS
 *   problems  { {problem fields...}, ... }   1 to 16 representative problems (CPU sweeps,
 *                    expand/compile); integer fields from 0 to INT_MAX
 *   valid(cfg, problem, device)    -> true | false, "reason"
 *   default(problem, device)       -> cfg table (every param given)
 *   key(problem)                   -> string, the tuning bucket (printable, never cut short)
 *   launch(cfg, problem, device)   -> { grid = {gx, gy, gz}, block = {bx, by, bz}, smem = bytes,
 *                                       entry = "kernel_name" }
 *                    each grid entry is an integer, a problem variable name ("B", "H", "N", "BH",
 *                    "nseq", "T"; for op custom its symbols), or {var, div} meaning ceil(var / div) (integers and divs from
 *                    1 to 2^31 - 1); block entries 1 to 1024 with at most 1024 threads; smem 0 to
 *                    2^30; entry an identifier. Optional: covers, split_ws and split_flags
 *                    (templates/README.md), pdl (a boolean, lj_launch.pdl).
 *   source(cfg, problem, device)   -> { template = "<family>/<file>.cu", consts = {...} }
 *                    consts become globals of the template's Lua environment (besides cfg
 *                    params, the problem and device fields, which are always visible).
 * Problem and device tables passed to Lua have the field names of the structs below
 * (dtype as "f32"/"f16"/"bf16", op as its string, booleans as booleans, arch as a string). */
#ifndef LAJIT_FAMILY_H
#define LAJIT_FAMILY_H

#include "core.h"
#include "sandbox.h"

/* LJ_OP_CUSTOM: a family that declares its own arguments (`args`, below) and is reached through
 * lajit_launch (runtime/launch.c), not through one of the attention ops. */
typedef enum lj_op { LJ_OP_FWD = 0, LJ_OP_BWD = 1, LJ_OP_DECODE = 2, LJ_OP_CUSTOM = 3 } lj_op;
typedef enum lj_dtype { LJ_F32 = 0, LJ_F16 = 1, LJ_BF16 = 2 } lj_dtype;

const char *lj_op_name(lj_op op);
const char *lj_dtype_name(lj_dtype dt);
int lj_dtype_parse(const char *s, lj_dtype *out); /* "f32|fp32|float32", "f16|fp16|float16",
                                                     "bf16|bfloat16"; returns 0 if unknown */

/* ---- Declared arguments (op "custom") ----------------------------------------------------------
 * A custom family's spec lists its kernel arguments in order (`args`): tensors with a dtype and
 * a shape of named symbols, and scalars. The symbols (every name a shape uses, in order of first
 * use, then has_<name> for each optional tensor) are the family's problem: named integers that
 * lajit_launch binds from the caller's tensors and checks across them. Read once at load
 * (family_args.c) and owned by the family. */
#define LJ_MAX_ARGS    24
#define LJ_MAX_SYMBOLS 16
#define LJ_MAX_RANK    8
#define LJ_NAME_LEN    32

/* LJ_ARG_WORKSPACE: device scratch the runtime provides (never the caller), sized per launch by
 * the spec's launch() (lj_launch.ws_*): a kernel parameter lj_arg<1> of bytes. */
typedef enum lj_arg_kind {
    LJ_ARG_TENSOR = 0,
    LJ_ARG_F32,
    LJ_ARG_I32,
    LJ_ARG_I64,
    LJ_ARG_WORKSPACE
} lj_arg_kind;
/* Element types a declared tensor may have: the three float dtypes (lj_dtype's values), two
 * integer ones, or "the problem's dtype". */
typedef enum lj_elem {
    LJ_ELEM_PROBLEM = -1,
    LJ_ELEM_F32 = 0,
    LJ_ELEM_F16 = 1,
    LJ_ELEM_BF16 = 2,
    LJ_ELEM_I32 = 3,
    LJ_ELEM_I64 = 4
} lj_elem;
const char *lj_elem_name(lj_elem e); /* "f32", ..., "dtype" */
int lj_elem_size(lj_elem e);         /* bytes (0 for LJ_ELEM_PROBLEM) */

typedef struct lj_arg_decl {
    char name[LJ_NAME_LEN];
    lj_arg_kind kind;
    lj_elem elem;                   /* tensors */
    int rank;                       /* tensors: 1 .. LJ_MAX_RANK */
    signed char shape[LJ_MAX_RANK]; /* tensors: the symbol of each dimension */
    int optional;                   /* tensors: the caller may leave it out */
    int output;                     /* tensors: the kernel writes it */
    int flag;                       /* optional tensors: the index of their has_<name> symbol */
    int align;                      /* tensors: bytes the address and every stride of a dimension
                                       past the last must be a multiple of (default: the
                                       element's size; the kernel's vector width, e.g. 16) */
    int unit_stride;                /* tensors: the last dimension's stride must be 1 */
    double fill_lo, fill_hi;        /* tensors: the tuner's random range (default -1, 1) */
} lj_arg_decl;

typedef struct lj_symbol {
    char name[LJ_NAME_LEN];
    int dynamic; /* varies within one plan (a run-time size such as B or N): not baked */
    int flag;    /* a has_<name> flag (0 or 1), pushed to Lua as a boolean */
} lj_symbol;

typedef struct lj_args_decl {
    int n_args;
    lj_arg_decl arg[LJ_MAX_ARGS];
    int n_syms;
    lj_symbol sym[LJ_MAX_SYMBOLS];
    unsigned dtypes; /* bit (1 << lj_dtype) per problem dtype the family takes */
    int workspace;   /* the index of its workspace argument, -1 when it declares none */
} lj_args_decl;

/* The index of a symbol by name, or -1. */
int lj_args_symbol(const lj_args_decl *d, const char *name);

/* What a kernel is asked to compute. Shape fields are the actual sizes of a call (B, N vary
 * within a bucket); the flags are compile-time specialisations. A custom family's problem is
 * its dtype and its symbols' values (decl, sym); the attention fields stay zero. */
typedef struct lj_problem {
    lj_op op;
    lj_dtype dtype;
    int B, H, N, D, E; /* varlen: B = number of sequences, N = longest sequence (0 unknown) */
    int T;             /* decode: steps per row (1..8) */
    int decay;         /* s given: decay path */
    int has_initial;   /* S_0 given */
    int has_final;     /* S_N wanted */
    int varlen;        /* cu_seqlens given */
    int vk;            /* states stored [E, D] */
    int want_ds;       /* backward: decay gradient requested */
    int has_dsn;       /* backward: dS_N given */
    int step_states;   /* decode: per-step states written */
    int state_only;    /* the final state only: a forward's S_N (o neither read nor written; q
                          unread), or the backward's dv pass's dS_0 (dv neither, k unread) */
    int part;          /* an op of several kernels (la_bwd): which one (0 for single-kernel ops) */
    lj_dtype state_dtype; /* storage of the states and pools (S_0, S_N, decode's pool and step
                             states); LJ_F32 (0) by default. Accumulation is fp32 whatever it is */
    int out_dtype;        /* o's dtype + 1 when it differs from dtype (mixed: fp32 q, k, v with a
                             16-bit o, or the reverse); 0: o has dtype. lj_problem_out() reads it */
    const lj_args_decl *decl;      /* op custom: the family's declaration (its symbols' names) */
    long long sym[LJ_MAX_SYMBOLS]; /* op custom: each symbol's value, in decl's order */
} lj_problem;

/* The dtype of o: dtype unless out_dtype says otherwise. */
static inline lj_dtype lj_problem_out(const lj_problem *p)
{
    return p->out_dtype ? (lj_dtype)(p->out_dtype - 1) : p->dtype;
}

/* The target: from the device when there is one, else from the arch table (offline compile). */
typedef struct lj_device_info {
    char arch[16];   /* "sm_80", "sm_86", "sm_90a", "sm_100a", "sm_120" */
    int cc;          /* 80, 86, 90, 100, 120 */
    int sms;         /* multiprocessors */
    int smem_optin;  /* max dynamic shared memory per block after opt-in, bytes */
    int smem_per_sm; /* shared memory per multiprocessor, bytes */
    int regs_per_sm; /* 32-bit registers per multiprocessor */
    int l2_bytes;
    char name[128]; /* device name, or "offline sm_90a" */
} lj_device_info;

/* Arch table for offline compiles: fills info for a known arch string; returns 0 if unknown. */
int lj_device_info_for_arch(const char *arch, lj_device_info *info);
/* The exact arch string for a compute capability (90 -> "sm_90a", 100 -> "sm_100a", 86 ->
 * "sm_86"). */
void lj_arch_for_cc(int cc, char arch[16]);

#define LJ_MAX_PARAMS 16
#define LJ_PARAM_NAME 24
/* The largest parameter space a spec may declare (the product of its params' value counts):
 * every configuration is validated, and the tuner compiles each valid one. The built-in
 * families have at most 240. */
#define LJ_MAX_CONFIGS 4096

/* One point of a family's parameter space. Names are sorted, so two equal configs compare
 * equal field by field. */
typedef struct lj_config {
    int n;
    char names[LJ_MAX_PARAMS][LJ_PARAM_NAME];
    long long values[LJ_MAX_PARAMS];
} lj_config;

/* Value of a named parameter, or fallback when absent. */
long long lj_config_get(const lj_config *cfg, const char *name, long long fallback);
/* "BLOCK=64 TILE_V=32 WARPS=4" into out (always NUL-terminated). */
void lj_config_format(const lj_config *cfg, char *out, size_t cap);

typedef enum lj_grid_var {
    LJ_VAR_ONE = 0,
    LJ_VAR_B,
    LJ_VAR_H,
    LJ_VAR_N,
    LJ_VAR_BH,
    LJ_VAR_NSEQ,
    LJ_VAR_T,
    LJ_VAR_SYM0 /* op custom: LJ_VAR_SYM0 + i is symbol i of the family's declaration */
} lj_grid_var;

/* The grid variables' values for one launch, indexed by lj_grid_var. */
#define LJ_N_GRID_VARS (LJ_VAR_SYM0 + LJ_MAX_SYMBOLS)

/* One grid dimension: ceil(value_of(var) * mul / div). A constant c is {LJ_VAR_ONE, c, 1}. */
typedef struct lj_grid_dim {
    lj_grid_var var;
    long long mul, div;
} lj_grid_dim;

typedef struct lj_launch {
    lj_grid_dim grid[3];
    unsigned block[3];
    unsigned smem;   /* dynamic shared memory bytes */
    char entry[64];  /* extern "C" kernel name */
    unsigned covers; /* bit per part of a multi-pass op that this kernel also computes */
    /* A split scan's chain (templates/common/split.cuh), per (sequence, head): split_ws bytes of
     * states and split_flags bytes of flags; 0 when the kernel walks whole sequences. The flags
     * buffer (16 more bytes of counters) is zeroed once: the kernels leave it zero. Sizes by
     * lj_split_ws_bytes. */
    unsigned long long split_ws, split_flags;
    /* op custom, a family with a workspace argument: its bytes for one launch, ws_fixed + ws_per
     * times the value of each of ws_times[0 .. ws_n_times - 1] (grid variables: the family's
     * symbols); 0 when this configuration needs none (the argument then arrives NULL). */
    unsigned long long ws_fixed, ws_per;
    lj_grid_var ws_times[2];
    int ws_n_times;
    /* 1: the kernel executes griddepcontrol.wait (templates/common/pdl.cuh) before it reads or
     * writes any global memory, so it may be launched with programmatic stream serialization:
     * its CTAs may become resident while the previous kernel on the stream finishes. The
     * runtime does so when the context's LAJIT_PDL switch is on, the device is cc 9.0 or newer
     * and the driver has cuLaunchKernelEx (lj_plan_launch). */
    unsigned pdl;
} lj_launch;

typedef struct lj_family lj_family;

/* Loads a family spec into L (from the embedded copy, or LAJIT_TEMPLATE_DIR when set in the
 * env's template dir). LAJIT_ERR_NOT_FOUND for an unknown name. The family borrows L. */
lajit_status lj_family_load(lj_env *env, lj_lua *L, const char *name, lj_family **out);
void lj_family_free(lj_family *f);
const char *lj_family_name(const lj_family *f);
/* Whether the family serves arch: its spec's optional `archs` list names it, or it has none. */
int lj_family_serves(const lj_family *f, const char *arch);
lj_op lj_family_op(const lj_family *f);
/* A custom family's declared arguments; NULL for the attention families. */
const lj_args_decl *lj_family_args(const lj_family *f);

/* The parameter space: number of params, each name and its candidate values (borrowed). */
int lj_family_param_count(const lj_family *f);
const char *lj_family_param_name(const lj_family *f, int i);
int lj_family_param_values(const lj_family *f, int i, const long long **values);
/* Every point of the product space, in a fixed order; *configs freed with lj_free. */
lajit_status lj_family_all_configs(lj_family *f, lj_config **configs, int *count);
/* The representative problems; *problems freed with lj_free. */
lajit_status lj_family_problems(lj_family *f, lj_problem **problems, int *count);

lajit_status lj_family_default(lj_family *f, const lj_problem *p, const lj_device_info *d,
                               lj_config *out);
/* *ok = 1 when valid; else reason holds the spec's reason. */
lajit_status lj_family_valid(lj_family *f, const lj_config *c, const lj_problem *p,
                             const lj_device_info *d, int *ok, char *reason, size_t cap);
lajit_status lj_family_key(lj_family *f, const lj_problem *p, char *out, size_t cap);
lajit_status lj_family_launch(lj_family *f, const lj_config *c, const lj_problem *p,
                              const lj_device_info *d, lj_launch *out);
/* Expands the family's template for (c, p, d). *source freed with lj_free. *name receives the
 * template path ("la_recurrent/recurrent.cu") for diagnostics (static for the family's life). */
lajit_status lj_family_source(lj_family *f, const lj_config *c, const lj_problem *p,
                              const lj_device_info *d, char **source);

/* Pushes the spec table (what family.lua returned) on the stack of the family's Lua state, for
 * readers of optional fields this module does not model (runtime/roles.c: the backward's tensor
 * roles). The caller pops it; read it with raw accesses inside a protected call. */
void lj_family_push_spec(const lj_family *f);

/* What a compile of (c, p, d) may use, as the spec claims it: at most `regs` registers per thread
 * and `smem` bytes of shared memory (static + dynamic). From the spec's optional
 * resources(cfg, problem, device) -> { regs = n, smem = bytes }; a field (or the function) left
 * out claims the hardware's limit (255, d->smem_optin). generator/resources.h checks a compile's
 * resource report against it. */
typedef struct lj_resources {
    long long regs, smem;
} lj_resources;
lajit_status lj_family_resources(lj_family *f, const lj_config *c, const lj_problem *p,
                                 const lj_device_info *d, lj_resources *out);

/* The text of the family file's template hash input: every file of the family folder and of
 * templates/common, concatenated in a fixed order (for the tuning database's template hash). */
lajit_status lj_family_template_text(lj_family *f, char **text, size_t *len);

#endif
