#!/usr/bin/env bash
# gpu_sanitize.sh — the GPU tests under NVIDIA compute-sanitizer, on a machine with a GPU:
#   memcheck  over every gpu test case (each case its own process, as CTest runs it);
#   racecheck and initcheck over one small case of each kernel family (they are slow: a case
#   with a few chunks exercises every barrier and every shared-memory path of its kernel).
# A case passes when the sanitizer reports no error and the case itself passes (a skipped case,
# exit 77, is counted as skipped, not passed). Prints one line per run and a summary; exits 1
# when anything failed.
#
#   scripts/gpu_sanitize.sh [BUILD_DIR] [LOG_DIR]      (JOBS=N runs N cases at once, default 4)
set -uo pipefail
build=${1:-build}
logs=${2:-$build/sanitize-logs}
jobs=${JOBS:-4}
san=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
[ -x "$san" ] || { echo "compute-sanitizer not found (set COMPUTE_SANITIZER)" >&2; exit 2; }
mkdir -p "$logs"
export LAJIT_TEST_SOURCE_DIR=${LAJIT_TEST_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
export LAJIT_TEST_BINARY_DIR=${LAJIT_TEST_BINARY_DIR:-$(cd "$build" && pwd)}

# One run: tool, test program area, case name. Writes <tool>.<area>.<case>.log and prints
# "<verdict> <tool> <area>.<case> <seconds>s".
run_one() {
    local tool=$1 area=$2 name=$3 log t0 rc errs verdict
    log="$logs/$tool.$area.$name.log"
    t0=$(date +%s)
    "$san" --tool "$tool" --error-exitcode 86 --print-limit 20 \
        "$build/tests/test_gpu_$area" "$name" >"$log" 2>&1
    rc=$?
    # memcheck and initcheck end with "ERROR SUMMARY: N errors", racecheck with
    # "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)".
    errs=$(grep -Eo '(ERROR SUMMARY: [0-9]+ error|\([0-9]+ errors)' "$log" | tail -1 | grep -Eo '[0-9]+' || echo "?")
    case $rc in
        0) verdict=ok ;;
        77) verdict=skipped ;;
        86) verdict=SANITIZER ;;
        *) verdict=FAILED ;;
    esac
    echo "$verdict $tool $area.$name $(( $(date +%s) - t0 ))s errors=$errs rc=$rc"
}
export -f run_one
export san build logs

# Every gpu case, from the test sources (the same names CTest registers).
list=$(for f in "$LAJIT_TEST_SOURCE_DIR"/tests/gpu/*.c; do
    area=$(basename "$f" .c)
    sed -n 's/^LJ_TEST(\([a-z0-9_]*\)).*/\1/p' "$f" | sed "s/^/memcheck $area /"
done)
# One small case per kernel family for the slow tools.
for tool in racecheck initcheck; do
    list+=$'\n'"$tool la_fwd n65_f16_d96_e64_vk_in_place"
    list+=$'\n'"$tool la_fwd_sm90 n65_f16_d128_e96_vk_in_place"
    list+=$'\n'"$tool la_bwd n65_f16_d96_e64_vk_states_scale"
    list+=$'\n'"$tool la_bwd_sm90 n65_f16_d64_e128_vk_states_scale"
    list+=$'\n'"$tool la_decode t4_f16_step_states_kv"
    list+=$'\n'"$tool la_recurrent n65_f16_decay_d_ne_e"
done

echo "$list" | xargs -P "$jobs" -L 1 bash -c 'run_one "$@"' _ | tee "$logs/summary.txt"
ok=$(grep -c '^ok ' "$logs/summary.txt")
skipped=$(grep -c '^skipped ' "$logs/summary.txt")
bad=$(grep -Evc '^(ok|skipped) ' "$logs/summary.txt")
echo "compute-sanitizer: $ok passed, $bad failed, $skipped skipped"
[ "$bad" -eq 0 ]
