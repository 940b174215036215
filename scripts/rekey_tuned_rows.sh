#!/usr/bin/env bash
# rekey_tuned_rows.sh — carries a shipped table's rows of one family across a template change
# that leaves their kernels' machine code unchanged (tuned/README.md says when that is allowed).
#
#   scripts/rekey_tuned_rows.sh FAMILY OLD_TEMPLATE_DIR TABLE.json... [BUILD_DIR via $BUILD]
#
# For every row of FAMILY in the tables, its configuration and its default configuration are
# compiled for sm_90a from OLD_TEMPLATE_DIR (e.g. `git archive <old> templates | tar -x -C DIR`,
# then DIR/templates) and from this tree's templates, each into a fresh cache directory, and
# the SASS of the two cubins (`cuobjdump -sass`, $CUOBJDUMP or on PATH; PyPI's
# nvidia-cuda-cuobjdump has one) is compared, with the registers and shared memory `lajit
# compile` reports; and each bucket's default (what the family's default() picks now) must be
# the default configuration its rows recorded. Only when all of that holds are the rows' template
# hashes rewritten to this tree's hash (the one `tuned.shipped_tables_match_this_trees_templates`
# asks for); otherwise nothing is written and what differs is listed: remake the table on its GPU.
# The rows' problems: their buckets' dtype, D, E, decay, N = 2^n and B·H = 2^bh (B = 4, or 1
# below B·H = 4), which is what a bucket's kernels depend on. Forward buckets only (la_fwd,
# la_fwd_sm90: dtype_D_E[_decay]_n_bh); any other bucket is refused.
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,19p "$0"; exit 2; }
family=$1 old=$2
shift 2
build=${BUILD:-build}
lajit="$build/tools/lajit"
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || true)}
[ -x "$cuobjdump" ] || { echo "no cuobjdump (set CUOBJDUMP)"; exit 2; }
[ -d "$old/$family" ] || { echo "$old has no $family folder"; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The rows' (bucket, configuration) pairs as `lajit compile` arguments, one per line, and (in
# "defaults") each bucket's problem arguments with the default configuration its rows recorded.
python3 - "$family" "$work/defaults" "$@" >"$work/list" <<'PY'
import json, sys
family, defaults, seen, buckets = sys.argv[1], open(sys.argv[2], "w"), set(), set()
for path in sys.argv[3:]:
    for line in open(path):
        r = json.loads(line)
        if r.get("family") != family:
            continue
        parts = r["bucket"].split("_")
        try:
            dtype, D, E = parts[0], parts[1][1:], parts[2][1:]
            n = next(p for p in parts if p.startswith("n") and p[1:].isdigit())
            bh = next(p for p in parts if p.startswith("bh"))
        except (IndexError, StopIteration):
            sys.exit(f"bucket {r['bucket']}: not a forward bucket (dtype_D_E[_decay]_n_bh); this "
                     "script knows only those")
        decay = "1" if "decay" in parts else "0"
        BH = 1 << int(bh[2:])
        B = 4 if BH >= 4 else 1
        problem = [f"dtype={dtype}", f"D={D}", f"E={E}", f"decay={decay}", f"N={1 << int(n[1:])}",
                   f"B={B}", f"H={BH // B}"]
        if r["bucket"] not in buckets:
            buckets.add(r["bucket"])
            defaults.write(" ".join("-p " + a for a in problem) + "\t" + r["default_config"] + "\n")
        for cfg in {r["config"], r["default_config"]}:
            if (r["bucket"], cfg) in seen:
                continue
            seen.add((r["bucket"], cfg))
            print(" ".join("-p " + a for a in problem + cfg.split()))
PY
[ -s "$work/list" ] || { echo "no $family rows in $*"; exit 2; }

# sass TEMPLATE_DIR ARGS...: the SASS and resources of the configuration's cubin(s), hashed
# ("compile failed" or "no cubin" where there is nothing to compare: never equal by accident, as
# the caller also refuses an empty result).
sass() {
    local dir=$1
    shift
    rm -rf "$work/cache" && mkdir -p "$work/cache"
    if ! LAJIT_TEMPLATE_DIR=$dir LAJIT_CACHE_DIR=$work/cache "$lajit" compile "$family" --arch sm_90a \
        "$@" >"$work/compile.txt" 2>&1; then
        echo "compile failed $RANDOM"
        return 0
    fi
    awk 'NR > 1 { print $(NF-3), $(NF-2), $(NF-1) }' "$work/compile.txt" # registers, spills, shared memory
    compgen -G "$work/cache/*.cubin" >/dev/null || { echo "no cubin $RANDOM"; return 0; }
    for f in "$work"/cache/*.cubin; do
        tail -c +97 "$f" >"$work/k.cubin" # the cache entry's 96-byte header (generator/cache.c)
        "$cuobjdump" -sass "$work/k.cubin" | sha256sum || echo "cuobjdump failed $RANDOM"
    done | sort
}
differ=0 n=0
while read -r line; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    a=$(sass "$old" $line) b=$(sass "" $line)
    if [ "$a" != "$b" ] || [ -z "$a" ]; then
        echo "differs: $line"
        differ=1
    fi
done <"$work/list"
# Each bucket's default must still be the one its rows recorded (the family's default() may have
# changed where its kernels did not).
mkdir -p "$work/cache"
while IFS=$'\t' read -r problem want; do
    # shellcheck disable=SC2086
    got=$({ LAJIT_CACHE_DIR=$work/cache "$lajit" compile "$family" --arch sm_90a $problem || true; } | awk -v want="$want" '
        NR == 2 { n = split(want, w, " "); out = ""
                  for (i = 1; i <= n; i++) { split(w[i], kv, "="); v = ""
                      for (j = 1; j <= NF; j++) if (index($j, kv[1] "=") == 1) v = $j
                      out = out (i > 1 ? " " : "") v }
                  print out }')
    if [ "$got" != "$want" ]; then
        echo "default differs: $problem: $got (rows: $want)"
        differ=1
    fi
done <"$work/defaults"
if [ $differ = 1 ]; then
    echo "not re-keyed: the machine code or a default changed; remake the table on its GPU"
    exit 1
fi
old_hash=$(python3 -c 'import json,sys; print({json.loads(l)["template_hash"] for l in open(sys.argv[2]) if json.loads(l)["family"] == sys.argv[1]}.pop())' "$family" "$1")
# This tree's hash (of the templates built into $build), as the CPU test that checks the tables
# computes it: asked about a one-row table of the family with a hash no tree has.
mkdir -p "$work/src/tuned"
for t in nvidia-h200.json nvidia-h100-80gb-hbm3.json; do
    printf '{"family":"%s","template_hash":"0000000000000000"}\n' "$family" >"$work/src/tuned/$t"
done
new_hash=$(LAJIT_TEST_SOURCE_DIR=$work/src "$build/tests/test_cpu_tuned" \
    shipped_tables_match_this_trees_templates 2>&1 |
    sed -n "s/.*this tree's is \([0-9a-f]*\):.*/\1/p" | head -1 || true) # (the test fails, as asked)
[ -n "$new_hash" ] || { echo "could not read this tree's $family hash"; exit 2; }
[ "$new_hash" != "$old_hash" ] || { echo "the $family rows already have this tree's hash"; exit 0; }
for t in "$@"; do
    sed -i "s/\"family\":\"$family\",\"template_hash\":\"$old_hash\"/\"family\":\"$family\",\"template_hash\":\"$new_hash\"/" "$t"
done
echo "$n configurations: the same SASS, registers and shared memory, and the same defaults; $family rows $old_hash -> $new_hash"
