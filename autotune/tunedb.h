/* tunedb.h — the tuning database: `tune.db`, an SQLite file in the cache directory, holding for
 * each device fingerprint, family (and hash of its templates) and problem bucket every
 * configuration that was measured, with its time or its failure, and the winner.
 *
 * Several processes may use one database at once (each its own connection): the file is in WAL
 * mode with a busy timeout, every read-then-write runs in one BEGIN IMMEDIATE transaction, and no
 * transaction is held while anything is compiled or timed (the tuner measures first, then
 * records everything in one short transaction). A lease row per bucket keeps two processes from
 * tuning the same bucket at the same time.
 *
 * A winner chooses which kernel runs, so the database is trusted only as far as the kernel
 * cache's directory is (core/fs.h): the directory, tune.db, its -wal/-shm/-journal files and the
 * lock file tune.db.lock must be ours and writable by nobody else, and none may be a symbolic
 * link (the lock is opened O_NOFOLLOW): anything else makes lj_tunedb_open fail with
 * LAJIT_ERR_DATABASE and a message naming the file and the reason, before anything is created
 * or read.
 *
 * A database that is not SQLite, is corrupt or truncated, or belongs to another program is
 * renamed aside ("tune.db.corrupt-<time>-<pid>"), a warning is logged, and a fresh one is
 * created. A database with a schema from a later lajit (PRAGMA user_version above this
 * build's) is never moved: it is opened read-only (with a WARN line). So is a database this
 * process cannot write (the file or the directory not writable). A read-only handle serves
 * winners, results, show and export; record, lease, release and import fail with
 * LAJIT_ERR_DATABASE saying it is read-only and why. A directory that cannot be created, or a
 * read-only one without a database, makes the database unavailable (LAJIT_ERR_DATABASE;
 * callers fall back to the families' defaults), never a crash.
 *
 * Every SQLite call goes through core/sql.h, so a test can fail any of them
 * (LJ_FAULT_SQLITE); each failure becomes LAJIT_ERR_DATABASE with a message, and the file
 * stays usable.
 *
 * A handle is used by one thread at a time (it belongs to one context or one CLI command). */
#ifndef LAJIT_TUNEDB_H
#define LAJIT_TUNEDB_H

#include "family.h"

/* The schema version this build writes (PRAGMA user_version). */
#define LJ_TUNEDB_SCHEMA 1

/* What a tuning result is valid for: the device and the software that compiled its kernels.
 * Two machines with equal fingerprints get equal kernels for equal configurations. */
typedef struct lj_fingerprint {
    char name[128]; /* device name as the driver reports it */
    int cc;         /* 90 */
    int sms;
    int driver; /* cuDriverGetVersion, e.g. 13000 */
    int nvrtc;  /* major * 1000 + minor * 10, like the driver's; 0 when unknown */
} lj_fingerprint;

/* From a device's properties and the versions. */
void lj_fingerprint_make(const lj_device_info *info, int driver, int nvrtc_major, int nvrtc_minor,
                         lj_fingerprint *out);

/* One bucket of one family on one device: the unit that is tuned, leased and has a winner. */
typedef struct lj_tune_id {
    lj_fingerprint fp;
    char family[64];
    char template_hash[17]; /* 16 hex digits: lj_hash64 of lj_family_template_text */
    char bucket[256];       /* the family's key(problem) */
} lj_tune_id;

/* The template hash of family f (16 hex digits of lj_hash64 over lj_family_template_text).
 * env: the env f was loaded with. */
lajit_status lj_tune_template_hash(lj_env *env, lj_family *f, char out[17]);

/* One measured configuration: its text (lj_config_format) and either a time or a failure. */
typedef struct lj_tune_result {
    char config[256];
    double ms;         /* median time; < 0 when failed */
    char failure[256]; /* "" when measured */
} lj_tune_result;

typedef struct lj_tunedb lj_tunedb;

/* Opens (creating when absent) dir/tune.db. dir is created (0700, with parents) when missing.
 * A corrupt or foreign file is set aside and replaced, with a WARN log line; a future-version
 * or unwritable one is opened read-only (see above). LAJIT_ERR_DATABASE when the database
 * cannot be used (untrusted directory or file, link, I/O error): the message says why. *out is
 * written only on success. */
lajit_status lj_tunedb_open(lj_env *env, const char *dir, lj_tunedb **out);
void lj_tunedb_close(lj_tunedb *db); /* accepts NULL */
/* A private database in memory with the same schema (a shipped table is imported into one to
 * be read: tuned.h); label names it in messages (lj_tunedb_path). Nothing touches the disk. */
lajit_status lj_tunedb_open_memory(lj_env *env, const char *label, lj_tunedb **out);
const char *lj_tunedb_path(const lj_tunedb *db);

/* The winner of a bucket: *found = 1 and config (and *ms, may be NULL) written when there is
 * one. */
lajit_status lj_tunedb_winner(lj_tunedb *db, const lj_tune_id *id, char *config, size_t cap,
                              double *ms, int *found);

/* The winner of a bucket in a shipped table (a database made by lj_tunedb_open_memory and
 * lj_tunedb_import): matched on id's device name, compute capability, family and bucket only
 * (the driver, NVRTC and SM count of the machine that tuned it are not compared: a table serves
 * other installs of the same GPU), the most recent driver's when several. *found = 1 and config
 * written when its template hash is id's; *stale = 1 when the bucket has a winner only for other
 * template hashes (the family's templates changed since the table was made: not to be trusted),
 * its hash then in stale_hash. */
lajit_status lj_tunedb_shipped_winner(lj_tunedb *db, const lj_tune_id *id, char *config, size_t cap,
                                      int *found, int *stale, char stale_hash[17]);

/* Records a tuning run in one transaction: every result (replacing earlier measurements of the
 * same configs) and the winner (the fastest measured result; none when all failed), together
 * with the default configuration and its time (default_ms < 0: not measured). */
lajit_status lj_tunedb_record(lj_tunedb *db, const lj_tune_id *id, const lj_tune_result *results,
                              int n, const char *default_config, double default_ms);

/* Measurements of a bucket, fastest first then failures; *out freed with lj_free. */
lajit_status lj_tunedb_results(lj_tunedb *db, const lj_tune_id *id, lj_tune_result **out,
                               int *count);

/* The lease on a bucket: *got = 1 when this process now holds it (it was free, expired, held by
 * a process of this host that no longer exists, or already ours), 0 when another live holder
 * has it. seconds: how long the lease lasts without renewal. */
lajit_status lj_tunedb_lease(lj_tunedb *db, const lj_tune_id *id, int seconds, int *got);
/* Gives the lease back (only when this process holds it). */
lajit_status lj_tunedb_release(lj_tunedb *db, const lj_tune_id *id);

/* A line per winner for `lajit db show`: called with the fingerprint, family, template hash,
 * bucket, winner config and time, default config and time (< 0 unknown), and the number of
 * measurements of the bucket. */
typedef void (*lj_tunedb_show_fn)(void *user, const lj_fingerprint *fp, const char *family,
                                  const char *template_hash, const char *bucket, const char *config,
                                  double ms, const char *default_config, double default_ms,
                                  int measured);
lajit_status lj_tunedb_show(lj_tunedb *db, lj_tunedb_show_fn fn, void *user);

/* Export: every measurement and winner as JSON lines (one flat object a line written by
 * SQLite's json_object, "kind" being "measurement" or "winner", the fingerprint spelled out in
 * each), to path. *rows: lines written. */
lajit_status lj_tunedb_export(lj_tunedb *db, const char *path, int *rows);
/* Export of a shipped table (tuned.h): the winners of device name `device` only, as export
 * writes them, the most recent one per (family, template hash, bucket) when several fingerprints
 * of that name have one; a winner the tuner measured less than (1 + min_gain) times faster than
 * the default (0 <= min_gain <= 1, e.g. 0.03) is written as the default, so a near tie is not
 * shipped (on an H200 two such winners ran 3-5 % slower than the default in lajit_bench,
 * docs/notes/autotune.md) while the bucket stays covered. keep (may be NULL) is asked per row with its family and template hash
 * and drops the row when it returns 0 (the CLI drops winners of templates this build no longer
 * has, which a runtime would only ignore). Written like lj_tunedb_export (temporary file,
 * rename). *rows: lines written. */
typedef int (*lj_tunedb_keep_fn)(void *user, const char *family, const char *template_hash);
lajit_status lj_tunedb_export_shipped(lj_tunedb *db, const char *path, const char *device,
                                      double min_gain, lj_tunedb_keep_fn keep, void *user,
                                      int *rows);
/* Import of an export, read through SQLite's JSON functions. Every line is checked before
 * anything is written: a JSON object with exactly export's keys, strings without NUL (no
 * \u0000) that fit their fields, times finite and >= 0, integers (cc, sms, driver, nvrtc, at)
 * of JSON integer type within sane ranges, lines under 4 KiB. One bad line fails the whole
 * import with LAJIT_ERR_INVALID_ARGUMENT and a message "<path>:<line>: ..." and nothing is
 * imported. Rows whose device name or compute capability differ from local's are refused the
 * same way unless force; local NULL accepts any device only with force. Rows keep their own
 * fingerprint. All rows in one transaction. */
lajit_status lj_tunedb_import(lj_tunedb *db, const char *path, const lj_fingerprint *local,
                              int force, int *rows);

#endif
