/* tuned.h — shipped tuning tables: the winners of a tuning run on one GPU model, kept in the tree
 * (tuned/<slug>.json), installed with the library (<datadir>/lajit/tuned) and read by the plan
 * builder when the user's own tuning database has no winner for a bucket, so that a first call
 * on a GPU lajit was tuned on runs a tuned configuration without tuning.
 *
 * Format: the JSON lines of `lajit db export` (tunedb.h), winners only, written by
 * `lajit db export --shipped FILE` (lj_tunedb_export_shipped). A table is read by importing it
 * into a private in-memory database with lj_tunedb_import, so it gets every check an import
 * makes (exact keys and types, string lengths, integer ranges, finite times, 4 KiB lines: one bad
 * line refuses the whole table) and, unforced, every row must name this device (name and compute
 * capability). A table larger than LJ_TUNED_MAX_BYTES is refused before it is read. Its entries
 * are then matched on family, template hash and bucket (lj_tunedb_shipped_winner), and the plan
 * builder still parses each configuration and asks the family's valid() before using it.
 *
 * The file of a device: its name as the driver reports it, lowercased, every run of characters
 * other than ASCII letters and digits made one '-', with no '-' at either end (lj_tuned_slug):
 * "NVIDIA H200" -> nvidia-h200.json, "NVIDIA H100 80GB HBM3" -> nvidia-h100-80gb-hbm3.json.
 *
 * Where tables are looked for: LAJIT_TUNED_DIR when set (empty or "off": no shipped table at
 * all); else the first of these folders that holds the device's file: <the library's folder>/
 * ../share/lajit/tuned (an installed or relocated library, the Python package), the install
 * prefix's <datadir>/lajit/tuned, and the source tree's tuned/ (a build tree). A table's content
 * is checked like any import; its ownership is not (installed files belong to root). */
#ifndef LAJIT_TUNED_H
#define LAJIT_TUNED_H

#include "tunedb.h"

/* Largest table read (a table of every bucket of every family is tens of KiB). */
#define LJ_TUNED_MAX_BYTES (1 << 20)

/* The slug of a device name (see above) into out (cap bytes, truncated to fit; "" for a name
 * with no letter or digit). */
void lj_tuned_slug(const char *device_name, char *out, size_t cap);

/* The table of device fp: LAJIT_OK with *out the loaded table (close with lj_tunedb_close) and
 * path (cap bytes) naming its file; LAJIT_OK with *out NULL when there is none (switched off, or
 * no folder holds this device's file). A table found but refused (too big, not a regular file,
 * unreadable, a bad line, a row for another device) fails with its status and a message naming
 * the file and the reason: the caller logs it and goes on without. */
lajit_status lj_tuned_load(lj_env *env, const lj_fingerprint *fp, lj_tunedb **out, char *path,
                           size_t cap);

#endif
