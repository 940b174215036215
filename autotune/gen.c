/* gen.c — the offline kernel set's policy and its writing (gen.h): the tuning database's
 * winners per (compute capability, family, template hash, bucket), else the family's default,
 * for each family × arch × problem (× backward pass), compiled on worker threads and added to a
 * bundle. Moved here from the CLI so that what a bundle holds is decided by the library. */
#include "gen.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "bundle.h"
#include "kernel.h"
#include "problem.h"
#include "search.h"
#include "tunedb.h"

/* Winners of a tuning database, kept to pick the bundle's configurations. */
typedef struct winner {
    int cc;
    char family[64], hash[17], bucket[256], config[256];
} winner;

typedef struct winners {
    lj_env *env;
    winner *w;
    int n, cap;
    int oom; /* an allocation failed inside the callback, which cannot return a status */
} winners;

static void collect_winner(void *user, const lj_fingerprint *fp, const char *family,
                           const char *template_hash, const char *bucket, const char *config,
                           double ms, const char *default_config, double default_ms, int measured)
{
    winners *ws = user;
    (void)ms, (void)default_config, (void)default_ms, (void)measured;
    if (ws->oom)
        return;
    if (ws->n == ws->cap) {
        int cap = ws->cap ? 2 * ws->cap : 16;
        winner *w = lj_realloc(ws->env, ws->w, sizeof *w * (size_t)cap);
        if (!w) {
            ws->oom = 1;
            return;
        }
        ws->w = w;
        ws->cap = cap;
    }
    winner *w = &ws->w[ws->n++];
    w->cc = fp->cc;
    snprintf(w->family, sizeof w->family, "%s", family);
    snprintf(w->hash, sizeof w->hash, "%s", template_hash);
    snprintf(w->bucket, sizeof w->bucket, "%s", bucket);
    snprintf(w->config, sizeof w->config, "%s", config);
}

/* Reads the winners of the tune.db file at path. The database module opens tune.db in a
 * directory and creates what is missing, so the file is checked first: a path that does not
 * name an existing regular file is an error, and nothing is created for it. */
static lajit_status load_winners(lj_env *env, const char *path, winners *ws)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return lj_error(env,
                        errno == ENOENT || errno == ENOTDIR ? LAJIT_ERR_NOT_FOUND : LAJIT_ERR_IO,
                        "tuning database %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "tuning database %s is not a regular file",
                        path);
    const char *slash = strrchr(path, '/');
    if (strcmp(slash ? slash + 1 : path, "tune.db") != 0)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "%s: a tuning database is named tune.db",
                        path);
    char dir[4096];
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else if ((size_t)(slash - path) >= sizeof dir)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "tuning database path too long");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    lj_tunedb *db;
    lajit_status st = lj_tunedb_open(env, dir, &db);
    if (st != LAJIT_OK)
        return st;
    st = lj_tunedb_show(db, collect_winner, ws);
    lj_tunedb_close(db);
    if (st == LAJIT_OK && ws->oom)
        st = lj_oom(env);
    return st;
}

/* One kernel to compile and add. */
typedef struct gen_item {
    char arch[16], bucket[256], config[256], what[256], entry[64];
    lj_kernel_job job;
    int have_job, ptx, tuned;
} gen_item;

/* The configuration for (family, bucket) on dev: the database's winner when it holds one that
 * parses against the family's space, else *cfg unchanged. Returns whether it came from there. */
static int pick_winner(lj_env *env, lj_family *f, const winners *ws, const char *hash,
                       const char *bucket, const lj_device_info *dev, lj_config *cfg)
{
    for (int w = 0; w < ws->n; w++) {
        lj_config parsed;
        if (ws->w[w].cc == dev->cc && strcmp(ws->w[w].family, lj_family_name(f)) == 0 &&
            strcmp(ws->w[w].hash, hash) == 0 && strcmp(ws->w[w].bucket, bucket) == 0 &&
            lj_config_parse(env, f, cfg, ws->w[w].config, &parsed) == LAJIT_OK) {
            *cfg = parsed;
            lj_clear_error(env);
            return 1;
        }
    }
    lj_clear_error(env);
    return 0;
}

/* Whether arch is plain (sm_80, sm_120: no "a" suffix), whose PTX newer GPUs can run. */
static int arch_is_plain(const char *arch)
{
    size_t len = strlen(arch);
    return len > 0 && arch[len - 1] >= '0' && arch[len - 1] <= '9';
}

/* Plans the kernels of family f into items (cap entries); *n receives the count. */
static lajit_status plan_family(lj_env *env, lj_lua *L, lj_family *f, const winners *ws,
                                const lj_gen_opts *o, const lj_problem *problems, int n_problems,
                                gen_item *items, int cap, int *n)
{
    char hash[17];
    lajit_status st = lj_tune_template_hash(env, f, hash);
    if (st != LAJIT_OK)
        return st;
    int part_given = 0;
    for (size_t i = 0; i < o->n_assign; i++)
        part_given |= strncmp(o->assign[i], "part=", 5) == 0;
    for (int a = 0; a < o->n_archs; a++) {
        lj_device_info dev;
        if (!lj_device_info_for_arch(o->archs[a], &dev))
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "unknown arch %s (known: sm_80, sm_86, sm_89, sm_90a, sm_100a, sm_120)",
                            o->archs[a]);
        int plain = arch_is_plain(o->archs[a]);
        for (int pi = 0; pi < n_problems; pi++) {
            lj_problem base = problems[pi];
            lj_config cfg;
            if ((st = lj_assign_all(env, f, o->assign, o->n_assign, &dev, &base, &cfg)) != LAJIT_OK)
                return st;
            /* A backward problem described with -p and no part gets its passes 0..2 (and 3 with
             * want_ds), each with its own default. */
            int parts =
                base.op == LJ_OP_BWD && o->n_assign > 0 && !part_given ? (base.want_ds ? 4 : 3) : 1;
            for (int part = 0; part < parts; part++) {
                lj_problem p = base;
                if (parts > 1) {
                    p.part = part;
                    if ((st = lj_family_default(f, &p, &dev, &cfg)) != LAJIT_OK)
                        return st;
                }
                char bucket[256];
                if ((st = lj_family_key(f, &p, bucket, sizeof bucket)) != LAJIT_OK)
                    return st;
                int tuned = pick_winner(env, f, ws, hash, bucket, &dev, &cfg);
                int ok;
                char reason[256], what[256], text[256];
                if ((st = lj_family_valid(f, &cfg, &p, &dev, &ok, reason, sizeof reason)) !=
                    LAJIT_OK)
                    return st;
                lj_problem_format(&p, what, sizeof what);
                lj_config_format(&cfg, text, sizeof text);
                if (!ok) {
                    if (o->report) {
                        lj_gen_event ev = {
                            lj_family_name(f), o->archs[a], what, text, reason, 0, tuned, 0};
                        o->report(o->report_user, &ev);
                    }
                    continue;
                }
                lj_launch launch;
                if ((st = lj_family_launch(f, &cfg, &p, &dev, &launch)) != LAJIT_OK)
                    return st;
                for (int ptx = 0; ptx <= plain; ptx++) {
                    if (*n == cap)
                        return lj_error(env, LAJIT_ERR_INTERNAL, "gen: more kernels than planned");
                    gen_item *it = &items[*n];
                    snprintf(it->arch, sizeof it->arch, "%s", o->archs[a]);
                    snprintf(it->bucket, sizeof it->bucket, "%s", bucket);
                    snprintf(it->config, sizeof it->config, "%s", text);
                    snprintf(it->what, sizeof it->what, "%s", what);
                    snprintf(it->entry, sizeof it->entry, "%s", launch.entry);
                    it->ptx = ptx;
                    it->tuned = tuned;
                    if ((st = lj_kernel_prepare(L, f, &cfg, &p, &dev, ptx, &it->job)) != LAJIT_OK)
                        return st;
                    it->have_job = 1;
                    (*n)++;
                }
            }
        }
    }
    return LAJIT_OK;
}

/* Plans, compiles and adds the kernels of one family. */
static lajit_status gen_family(lj_env *env, lj_lua *L, lj_family *f, const winners *ws,
                               const lj_gen_opts *o, lj_bundle *bundle, lj_gen_summary *sum)
{
    lj_problem *problems = NULL;
    int n_problems = 0;
    lajit_status st = lj_family_problems(f, &problems, &n_problems);
    if (st != LAJIT_OK)
        return st;
    if (o->n_assign > 0 && n_problems > 1)
        n_problems = 1; /* the assignments describe one problem, starting from the first */
    /* Problems × archs × (cubin, PTX) × at most 4 backward passes. */
    int cap = n_problems * o->n_archs * 2 * 4;
    gen_item *items = lj_calloc(env, (size_t)(cap ? cap : 1), sizeof *items);
    lj_compile_task *tasks = items ? lj_calloc(env, (size_t)(cap ? cap : 1), sizeof *tasks) : NULL;
    if (!tasks) {
        lj_free(env, items);
        lj_free(env, problems);
        return lj_oom(env);
    }
    int n = 0;
    st = plan_family(env, L, f, ws, o, problems, n_problems, items, cap, &n);
    if (st == LAJIT_OK) {
        for (int i = 0; i < n; i++)
            tasks[i].job = &items[i].job;
        lj_kernel_compile_parallel(env, tasks, n, o->jobs);
    }
    for (int i = 0; i < n; i++) {
        gen_item *it = &items[i];
        if (st == LAJIT_OK && tasks[i].status != LAJIT_OK) {
            st = lj_error(env, tasks[i].status, "%s %s [%s]: %s", lj_family_name(f), it->arch,
                          it->config, tasks[i].error);
        } else if (st == LAJIT_OK) {
            /* PTX is stored with its NUL, so a reader can hand it to the driver as text. */
            lj_bundle_item bi = {lj_family_name(f),
                                 it->arch,
                                 it->bucket,
                                 it->config,
                                 it->what,
                                 it->entry,
                                 it->job.source_key,
                                 it->ptx,
                                 tasks[i].compiled.image,
                                 tasks[i].compiled.image_size + (it->ptx ? 1 : 0)};
            st = lj_bundle_add(bundle, &bi);
            if (st == LAJIT_OK) {
                *(it->ptx ? &sum->ptxs : &sum->cubins) += 1;
                sum->tuned += it->tuned && !it->ptx;
                if (o->report) {
                    lj_gen_event ev = {lj_family_name(f),
                                       it->arch,
                                       it->what,
                                       it->config,
                                       NULL,
                                       it->ptx,
                                       it->tuned,
                                       tasks[i].compiled.image_size};
                    o->report(o->report_user, &ev);
                }
            }
        }
        lj_compile_task_free(env, &tasks[i]);
        if (it->have_job)
            lj_kernel_job_free(L, &it->job);
    }
    lj_free(env, tasks);
    lj_free(env, items);
    lj_free(env, problems);
    return st;
}

lajit_status lj_gen_write(lj_env *env, lj_lua *L, lj_gen_family_fn load, void *load_user,
                          const lj_gen_opts *opts, const char *out_path, lj_gen_summary *out)
{
    if (!opts || !out_path || !out || !load || opts->n_archs < 1 || !opts->archs ||
        (opts->n_assign && !opts->assign) || opts->n_families < 1 || !opts->families)
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "lj_gen_write: bad arguments");
    winners ws = {env, NULL, 0, 0, 0};
    lajit_status st = LAJIT_OK;
    if (opts->db_path)
        st = load_winners(env, opts->db_path, &ws);
    lj_bundle *bundle = NULL;
    if (st == LAJIT_OK)
        st = lj_bundle_create(env, out_path, &bundle);
    lj_gen_summary sum = {0, 0, 0};
    for (int i = 0; i < opts->n_families && st == LAJIT_OK; i++) {
        lj_family *f;
        st = load(load_user, opts->families[i], &f);
        if (st == LAJIT_OK)
            st = gen_family(env, L, f, &ws, opts, bundle, &sum);
    }
    lj_free(env, ws.w);
    if (!bundle)
        return st;
    if (st != LAJIT_OK) {
        lj_bundle_abort(bundle);
        return st;
    }
    if ((st = lj_bundle_finish(bundle)) != LAJIT_OK)
        return st;
    *out = sum;
    return LAJIT_OK;
}
