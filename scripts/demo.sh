#!/usr/bin/env bash
# demo.sh — lajit's main job on this machine: compile every built-in family for sm_80, sm_90a,
# sm_100a and sm_120 with NVRTC (no GPU needed) and print the resource table; then the same
# again, now served from the disk cache; then, where a GPU is present, run each op against the
# float64 reference and print its error and time.
set -euo pipefail
build=${1:-build}
lajit="$build/tools/lajit"
export LAJIT_CACHE_DIR=${LAJIT_CACHE_DIR:-$build/demo-cache}
"$lajit" cache clear >/dev/null 2>&1 || true
echo "== lajit $("$lajit" version | cut -d' ' -f2): every family, four archs, empty cache ($LAJIT_CACHE_DIR)"
start=$(date +%s%N)
"$lajit" compile all --arch sm_80,sm_90a,sm_100a,sm_120
echo "   $(( ($(date +%s%N) - start) / 1000000 )) ms"
echo
echo "== the same again: every kernel from the disk cache"
start=$(date +%s%N)
"$lajit" compile all --arch sm_80,sm_90a,sm_100a,sm_120
echo "   $(( ($(date +%s%N) - start) / 1000000 )) ms"
echo
"$lajit" cache verify
echo
echo "== a family from outside the library (examples/families: op custom, lajit_launch)"
root=$(cd "$(dirname "$0")/.." && pwd)
LAJIT_FAMILY_PATH="$root/examples/families" "$lajit" compile simple_gla_fwd --arch sm_90a
echo
if "$lajit" info | grep -q '^device 0'; then
    echo "== GPU present: each op on random data against the float64 reference (error, time)"
    ctest --test-dir "$build" -L gpu -V 2>&1 | grep -E "rel L2|Passed|Failed|\.c:[0-9]+:"
else
    echo "== no GPU here ($("$lajit" info | grep '^driver' | cut -c11-)): ops not run"
fi
