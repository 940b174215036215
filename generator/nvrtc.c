/* nvrtc.c — compiles expanded CUDA text to a cubin or PTX with NVRTC (see nvrtc.h).
 *
 * NVRTC is never linked: it is loaded with dlopen the first time a compile (or its version) is
 * needed, so the library loads and serves cached kernels on a machine without the toolkit. The
 * symbol table is filled once per process under pthread_once and never changes afterwards, so
 * concurrent compiles on different threads only read it. Which library is loaded is decided at
 * that first use: $LAJIT_NVRTC_PATH when set (and only that), else the usual sonames.
 *
 * Every NVRTC call goes through lj_fault_hit(env, LJ_FAULT_NVRTC) first, so tests can fail each
 * call in turn; a hit behaves as if NVRTC returned NVRTC_ERROR_INTERNAL_ERROR. A program that was
 * created is always destroyed, whatever failed after it. */
#include "nvrtc.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* NVRTC's types and the results lajit looks at, declared here rather than taken from the
 * toolkit's nvrtc.h: its name clashes with this directory's nvrtc.h, and the values are a
 * stable ABI (the same since CUDA 7). */
typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;
enum {
    NVRTC_SUCCESS = 0,
    NVRTC_ERROR_OUT_OF_MEMORY = 1,
    NVRTC_ERROR_PROGRAM_CREATION_FAILURE = 2,
    NVRTC_ERROR_INVALID_INPUT = 3,
    NVRTC_ERROR_INVALID_PROGRAM = 4,
    NVRTC_ERROR_INVALID_OPTION = 5,
    NVRTC_ERROR_COMPILATION = 6,
    NVRTC_ERROR_BUILTIN_OPERATION_FAILURE = 7,
    NVRTC_ERROR_INTERNAL_ERROR = 11
};

typedef nvrtcResult (*pfn_version)(int *, int *);
typedef nvrtcResult (*pfn_create)(nvrtcProgram *, const char *, const char *, int,
                                  const char *const *, const char *const *);
typedef nvrtcResult (*pfn_destroy)(nvrtcProgram *);
typedef nvrtcResult (*pfn_compile)(nvrtcProgram, int, const char *const *);
typedef nvrtcResult (*pfn_size)(nvrtcProgram, size_t *);
typedef nvrtcResult (*pfn_get)(nvrtcProgram, char *);

/* The process-wide symbol table: written once inside pthread_once, read-only afterwards. */
static struct {
    int loaded;
    char failure[1024]; /* why loading failed: every path tried with dlerror's text */
    pfn_version version;
    pfn_create create;
    pfn_destroy destroy;
    pfn_compile compile;
    pfn_size log_size;
    pfn_get log;
    pfn_size cubin_size;
    pfn_get cubin;
    pfn_size ptx_size;
    pfn_get ptx;
} g_nvrtc;

static pthread_once_t g_nvrtc_once = PTHREAD_ONCE_INIT;

/* Programs created and not yet destroyed, process-wide. NVRTC keeps its programs reachable, so
 * a leaked one is invisible to LeakSanitizer; the fault-injection tests read this instead
 * (declared for them in tests/support/cache_helpers.h, not part of the stage interface). */
static _Atomic long g_live_programs;
long lj_nvrtc_live_programs(void);
long lj_nvrtc_live_programs(void)
{
    return g_live_programs;
}

/* dlsym returns a void pointer; ISO C has no conversion from it to a function pointer, so the
 * bits are copied instead (POSIX guarantees they have the same representation). */
static int load_symbol(void *lib, const char *name, void *fn_slot, size_t slot_size)
{
    void *sym = dlsym(lib, name);
    if (!sym)
        return 0;
    memcpy(fn_slot, &sym, slot_size);
    return 1;
}

static void append_failure(const char *path, const char *why)
{
    size_t used = strlen(g_nvrtc.failure);
    snprintf(g_nvrtc.failure + used, sizeof g_nvrtc.failure - used, "%s%s (%s)", used ? "; " : "",
             path, why ? why : "not found");
}

static int try_library(const char *path)
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        append_failure(path, dlerror());
        return 0;
    }
#define LJ_SYM(field, name)                                              \
    if (!load_symbol(lib, name, &g_nvrtc.field, sizeof g_nvrtc.field)) { \
        append_failure(path, "missing " name);                           \
        dlclose(lib);                                                    \
        return 0;                                                        \
    }
    LJ_SYM(version, "nvrtcVersion")
    LJ_SYM(create, "nvrtcCreateProgram")
    LJ_SYM(destroy, "nvrtcDestroyProgram")
    LJ_SYM(compile, "nvrtcCompileProgram")
    LJ_SYM(log_size, "nvrtcGetProgramLogSize")
    LJ_SYM(log, "nvrtcGetProgramLog")
    LJ_SYM(cubin_size, "nvrtcGetCUBINSize")
    LJ_SYM(cubin, "nvrtcGetCUBIN")
    LJ_SYM(ptx_size, "nvrtcGetPTXSize")
    LJ_SYM(ptx, "nvrtcGetPTX")
#undef LJ_SYM
    /* The library stays open for the life of the process: the table points into it. */
    return 1;
}

static void load_once(void)
{
    const char *override = getenv("LAJIT_NVRTC_PATH");
    if (override && *override) {
        /* An explicit path is the user's choice: falling back to another NVRTC would hide the
         * mistake and could compile with a different version than the one asked for. */
        g_nvrtc.loaded = try_library(override);
        return;
    }
    static const char *const candidates[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
                                             "/usr/local/cuda/lib64/libnvrtc.so"};
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
        if (try_library(candidates[i])) {
            g_nvrtc.loaded = 1;
            return;
        }
    }
}

static lajit_status ensure_loaded(lj_env *env)
{
    pthread_once(&g_nvrtc_once, load_once);
    if (!g_nvrtc.loaded)
        return lj_error(env, LAJIT_ERR_NO_COMPILER, "NVRTC could not be loaded: tried %s",
                        g_nvrtc.failure);
    return LAJIT_OK;
}

/* Names of NVRTC's results, kept here so that reporting an error needs no further NVRTC call
 * (which fault injection would count); each spelled once, by the enum's own name. */
#define RESULT_NAME(r) [r] = #r
static const char *const result_names[] = {
    RESULT_NAME(NVRTC_SUCCESS),
    RESULT_NAME(NVRTC_ERROR_OUT_OF_MEMORY),
    RESULT_NAME(NVRTC_ERROR_PROGRAM_CREATION_FAILURE),
    RESULT_NAME(NVRTC_ERROR_INVALID_INPUT),
    RESULT_NAME(NVRTC_ERROR_INVALID_PROGRAM),
    RESULT_NAME(NVRTC_ERROR_INVALID_OPTION),
    RESULT_NAME(NVRTC_ERROR_COMPILATION),
    RESULT_NAME(NVRTC_ERROR_BUILTIN_OPERATION_FAILURE),
    RESULT_NAME(NVRTC_ERROR_INTERNAL_ERROR),
};
#undef RESULT_NAME

static const char *result_name(nvrtcResult r)
{
    if (r >= 0 && (size_t)r < sizeof result_names / sizeof result_names[0] && result_names[r])
        return result_names[r];
    return "NVRTC error";
}

/* A failed NVRTC call other than a compile error: out of memory maps to its own status, every
 * other failure to LAJIT_ERR_COMPILE (the kernel could not be built). */
static lajit_status call_failed(lj_env *env, const char *name, const char *call, nvrtcResult r)
{
    lajit_status s = r == NVRTC_ERROR_OUT_OF_MEMORY ? LAJIT_ERR_OUT_OF_MEMORY : LAJIT_ERR_COMPILE;
    return lj_error(env, s, "%s: %s failed: %s (%d)", name, call, result_name(r), (int)r);
}

#define LJ_NVRTC_CALL(env, expr) \
    (lj_fault_hit((env), LJ_FAULT_NVRTC) ? NVRTC_ERROR_INTERNAL_ERROR : (expr))

lajit_status lj_nvrtc_version(lj_env *env, int *major, int *minor)
{
    lajit_status s = ensure_loaded(env);
    if (s != LAJIT_OK)
        return s;
    int ma = 0, mi = 0;
    nvrtcResult r = LJ_NVRTC_CALL(env, g_nvrtc.version(&ma, &mi));
    if (r != NVRTC_SUCCESS)
        return lj_error(env, LAJIT_ERR_NO_COMPILER, "nvrtcVersion failed: %s (%d)", result_name(r),
                        (int)r);
    *major = ma;
    *minor = mi;
    return LAJIT_OK;
}

/* The architectures lajit knows, each with its option strings. The strings are static because
 * they enter cache keys and are handed out without ownership; an arch not listed here is
 * rejected before NVRTC is asked. */
typedef struct arch_opt {
    const char *arch;
    const char *sass; /* --gpu-architecture=sm_XX: cubin */
    const char *virt; /* --gpu-architecture=compute_XX: PTX */
} arch_opt;

#define LJ_ARCH(n)                                                              \
    {                                                                           \
        "sm_" #n, "--gpu-architecture=sm_" #n, "--gpu-architecture=compute_" #n \
    }
static const arch_opt k_archs[] = {
    LJ_ARCH(75),   LJ_ARCH(80),   LJ_ARCH(86),  LJ_ARCH(87),   LJ_ARCH(88),   LJ_ARCH(89),
    LJ_ARCH(90),   LJ_ARCH(90a),  LJ_ARCH(100), LJ_ARCH(100a), LJ_ARCH(100f), LJ_ARCH(103),
    LJ_ARCH(103a), LJ_ARCH(103f), LJ_ARCH(110), LJ_ARCH(110a), LJ_ARCH(110f), LJ_ARCH(120),
    LJ_ARCH(120a), LJ_ARCH(120f), LJ_ARCH(121), LJ_ARCH(121a), LJ_ARCH(121f),
};
#undef LJ_ARCH

int lj_nvrtc_options(const char *arch, int ptx, const char **opts, int cap)
{
    const arch_opt *a = NULL;
    for (size_t i = 0; arch && i < sizeof k_archs / sizeof k_archs[0]; i++)
        if (strcmp(k_archs[i].arch, arch) == 0)
            a = &k_archs[i];
    if (!a)
        return 0;
    /* -lineinfo costs nothing at run time and lets profilers map SASS to template lines;
     * --fmad=true is NVRTC's default, spelled out so a change of default cannot alter results
     * behind the cache key. ptxas's -v report only exists when ptxas runs (cubin). */
    const char *all[6];
    int n = 0;
    all[n++] = ptx ? a->virt : a->sass;
    all[n++] = "-std=c++17";
    all[n++] = "-default-device";
    if (!ptx)
        all[n++] = "--ptxas-options=-v";
    all[n++] = "-lineinfo";
    all[n++] = "--fmad=true";
    for (int i = 0; i < n && i < cap; i++)
        opts[i] = all[i];
    return n;
}

/* ---- Log parsing ---------------------------------------------------------------------------- */

static int max_int(int a, int b)
{
    return a > b ? a : b;
}

/* Reads the number that ends right before the text at `end` (e.g. "24" in "24 bytes smem").
 * Returns -1 when there is none. */
static long number_before(const char *line, const char *end)
{
    const char *p = end;
    while (p > line && p[-1] == ' ')
        p--;
    const char *digits_end = p;
    while (p > line && p[-1] >= '0' && p[-1] <= '9')
        p--;
    if (p == digits_end)
        return -1;
    return strtol(p, NULL, 10);
}

/* Takes ptxas's -v report out of the log. With several kernels in one program each figure is
 * the largest over them: the caller wants to know the worst case of the module. */
static void parse_resources(const char *log, lj_compiled *out)
{
    out->regs = -1;
    out->spill_stores = out->spill_loads = out->stack_bytes = out->smem_static = 0;
    const char *line = log;
    while (line && *line) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        char buf[512];
        if (len >= sizeof buf)
            len = sizeof buf - 1;
        memcpy(buf, line, len);
        buf[len] = 0;
        const char *m;
        if ((m = strstr(buf, "Used ")) != NULL) {
            long v = strtol(m + 5, NULL, 10);
            if (strstr(m, " registers"))
                out->regs = max_int(out->regs, (int)v);
        }
        if ((m = strstr(buf, " bytes smem")) != NULL) {
            long v = number_before(buf, m);
            if (v >= 0)
                out->smem_static = max_int(out->smem_static, (int)v);
        }
        if ((m = strstr(buf, " bytes stack frame")) != NULL) {
            long v = number_before(buf, m);
            if (v >= 0)
                out->stack_bytes = max_int(out->stack_bytes, (int)v);
        }
        if ((m = strstr(buf, " bytes spill stores")) != NULL) {
            long v = number_before(buf, m);
            if (v >= 0)
                out->spill_stores = max_int(out->spill_stores, (int)v);
        }
        if ((m = strstr(buf, " bytes spill loads")) != NULL) {
            long v = number_before(buf, m);
            if (v >= 0)
                out->spill_loads = max_int(out->spill_loads, (int)v);
        }
        line = nl ? nl + 1 : NULL;
    }
}

/* errmsg for a rejected kernel: the name, then the first lines of the log that mention an error
 * (the rest of a long log is usually consequences of the first). */
static lajit_status compile_error(lj_env *env, const char *name, const char *log)
{
    char excerpt[sizeof env->errmsg];
    size_t used = 0;
    int lines = 0;
    excerpt[0] = 0;
    for (int pass = 0; pass < 2 && lines == 0; pass++) {
        /* Pass 0 keeps lines with "error"; pass 1 (none found) keeps the log's first lines. */
        const char *line = log;
        while (line && *line && lines < 20) {
            const char *nl = strchr(line, '\n');
            size_t len = nl ? (size_t)(nl - line) : strlen(line);
            int keep = len > 0;
            if (keep && pass == 0) {
                char probe[512];
                size_t n = len < sizeof probe ? len : sizeof probe - 1;
                memcpy(probe, line, n);
                probe[n] = 0;
                keep = strstr(probe, "error") != NULL;
            }
            if (keep && used + len + 2 < sizeof excerpt) {
                if (used)
                    excerpt[used++] = '\n';
                memcpy(excerpt + used, line, len);
                used += len;
                excerpt[used] = 0;
                lines++;
            }
            line = nl ? nl + 1 : NULL;
        }
    }
    return lj_error(env, LAJIT_ERR_COMPILE, "%s: %s", name,
                    lines ? excerpt : "compilation failed (no log)");
}

/* ---- Compile -------------------------------------------------------------------------------- */

/* Fetches the program's log into *log (owned, "" when empty; NULL only when out of memory).
 * Returns the first failed NVRTC result, with *log then "" so that a compile error can still be
 * reported without its text. */
static nvrtcResult fetch_log(lj_env *env, nvrtcProgram prog, char **log)
{
    size_t size = 0;
    nvrtcResult r = LJ_NVRTC_CALL(env, g_nvrtc.log_size(prog, &size));
    if (r != NVRTC_SUCCESS)
        size = 0;
    *log = lj_malloc(env, size + 1);
    if (!*log)
        return r;
    (*log)[0] = 0;
    if (size > 0) {
        r = LJ_NVRTC_CALL(env, g_nvrtc.log(prog, *log));
        if (r != NVRTC_SUCCESS)
            (*log)[0] = 0;
    }
    (*log)[size] = 0;
    return r;
}

lajit_status lj_nvrtc_compile(lj_env *env, const char *name, const char *source,
                              const lj_header *headers, int n_headers, const char *arch, int ptx,
                              lj_compiled *out)
{
    if (!name || !source || !arch || !out || n_headers < 0 || (n_headers > 0 && !headers))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "lj_nvrtc_compile: bad argument");
    for (int i = 0; i < n_headers; i++)
        if (!headers[i].name || (!headers[i].text && headers[i].len))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: header %d has no name or text",
                            name, i);
    const char *opts[8];
    int n_opts = lj_nvrtc_options(arch, ptx, opts, 8);
    if (n_opts == 0)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: unknown architecture \"%s\"", name,
                        arch);
    lajit_status s = ensure_loaded(env);
    if (s != LAJIT_OK)
        return s;

    /* NVRTC wants NUL-terminated header texts; lj_header carries a length, so copy. */
    const char **names = NULL;
    char **texts = NULL;
    char *log = NULL;
    void *image = NULL;
    nvrtcProgram prog = NULL;
    int have_prog = 0;
    size_t image_size = 0;
    if (n_headers > 0) {
        names = lj_calloc(env, (size_t)n_headers, sizeof *names);
        texts = lj_calloc(env, (size_t)n_headers, sizeof *texts);
        if (!names || !texts) {
            s = lj_oom(env);
            goto done;
        }
        for (int i = 0; i < n_headers; i++) {
            names[i] = headers[i].name;
            texts[i] = lj_strndup(env, headers[i].text ? headers[i].text : "", headers[i].len);
            if (!texts[i]) {
                s = lj_oom(env);
                goto done;
            }
        }
    }

    nvrtcResult r = LJ_NVRTC_CALL(
        env, g_nvrtc.create(&prog, source, name, n_headers, (const char *const *)texts, names));
    if (r != NVRTC_SUCCESS) {
        s = call_failed(env, name, "nvrtcCreateProgram", r);
        goto done;
    }
    have_prog = 1;
    g_live_programs++;

    r = LJ_NVRTC_CALL(env, g_nvrtc.compile(prog, n_opts, opts));
    nvrtcResult lr = fetch_log(env, prog, &log);
    if (!log) {
        s = lj_oom(env);
        goto done;
    }
    if (r == NVRTC_ERROR_COMPILATION) {
        s = compile_error(env, name, log);
        goto done;
    }
    if (r != NVRTC_SUCCESS) {
        s = call_failed(env, name, "nvrtcCompileProgram", r);
        goto done;
    }
    /* Without the log the resource report is unknown; treat it like any failed call rather
     * than cache a kernel whose registers and spills nobody can check. */
    if (lr != NVRTC_SUCCESS) {
        s = call_failed(env, name, "nvrtcGetProgramLog", lr);
        goto done;
    }

    r = ptx ? LJ_NVRTC_CALL(env, g_nvrtc.ptx_size(prog, &image_size))
            : LJ_NVRTC_CALL(env, g_nvrtc.cubin_size(prog, &image_size));
    if (r != NVRTC_SUCCESS) {
        s = call_failed(env, name, ptx ? "nvrtcGetPTXSize" : "nvrtcGetCUBINSize", r);
        goto done;
    }
    /* One spare byte keeps PTX NUL-terminated even if NVRTC's size ever excluded the NUL. */
    image = lj_malloc(env, image_size + 1);
    if (!image) {
        s = lj_oom(env);
        goto done;
    }
    ((char *)image)[image_size] = 0;
    r = ptx ? LJ_NVRTC_CALL(env, g_nvrtc.ptx(prog, image))
            : LJ_NVRTC_CALL(env, g_nvrtc.cubin(prog, image));
    if (r != NVRTC_SUCCESS) {
        s = call_failed(env, name, ptx ? "nvrtcGetPTX" : "nvrtcGetCUBIN", r);
        goto done;
    }
    s = LAJIT_OK;

done:
    if (have_prog) {
        /* Destroyed even when fault injection "fails" this call: a test's fault must not turn
         * into a real leak. */
        int hit = lj_fault_hit(env, LJ_FAULT_NVRTC);
        nvrtcResult dr = g_nvrtc.destroy(&prog);
        g_live_programs--;
        if (hit || dr != NVRTC_SUCCESS)
            lj_log(env, LAJIT_LOG_WARN, "%s: nvrtcDestroyProgram failed: %s", name,
                   result_name(hit ? NVRTC_ERROR_INTERNAL_ERROR : dr));
    }
    for (int i = 0; texts && i < n_headers; i++)
        lj_free(env, texts[i]);
    lj_free(env, texts);
    lj_free(env, (void *)names);
    if (s != LAJIT_OK) {
        lj_free(env, log);
        lj_free(env, image);
        return s;
    }
    memset(out, 0, sizeof *out);
    parse_resources(log, out);
    out->image = image;
    out->image_size = image_size;
    out->log = log;
    return LAJIT_OK;
}

void lj_compiled_free(lj_env *env, lj_compiled *c)
{
    if (!c)
        return;
    lj_free(env, c->image);
    lj_free(env, c->log);
    memset(c, 0, sizeof *c);
    c->regs = -1;
}
