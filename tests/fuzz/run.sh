#!/usr/bin/env bash
# tests/fuzz/run.sh — `make fuzz` (CI runs it after `make asan`): builds the libFuzzer harnesses
# with clang under ASan + UBSan in their own build directory (the project's normal builds use
# gcc), then runs each for FUZZ_SECONDS (15 by default: 75 s for the five) from its seed
# corpus. A crash, a sanitizer report, a leak or a hang fails the step and leaves the input in
# $BUILD/fuzz-run/<target>/artifacts/ (README.md: what to do with it). Without clang and
# libFuzzer it says so and does nothing: `make test` and `make asan` replay the corpora anyway.
#
#   FUZZ_SECONDS=60 tests/fuzz/run.sh            longer runs
#   FUZZ_TARGETS="bundle" tests/fuzz/run.sh      one harness
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${FUZZ_BUILD:-$root/build-fuzz}
seconds=${FUZZ_SECONDS:-15}
jobs=${JOBS:-$(nproc)}
targets=${FUZZ_TARGETS:-"bundle tunedb_import template assign spec"}
cc=${FUZZ_CC:-clang}

probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' > "$probe/p.c"
if ! command -v "$cc" > /dev/null ||
   ! "$cc" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" > /dev/null 2>&1; then
  echo "fuzz: no $cc with libFuzzer here: not fuzzing (make test and make asan replay the corpora)"
  exit 0
fi

mkdir -p "$build"
CC=$cc cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DLAJIT_SANITIZE=ON -DLAJIT_FUZZ=ON \
  -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "$jobs" --target $(for t in $targets; do printf 'fuzz_%s ' "$t"; done)

# The harnesses' scratch files (tune.db, bundles) on a memory file system where there is one:
# the tune.db harness syncs its database several times per input.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
  export TMPDIR=/dev/shm
fi
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# A string function that reads past an unterminated input fails even when it finds its match.
export ASAN_OPTIONS=${ASAN_OPTIONS:-strict_string_checks=1}

failed=""
for t in $targets; do
  case $t in
    bundle) max_len=8192 ;;
    tunedb_import) max_len=8192 ;;
    template) max_len=8192 ;;
    spec) max_len=8192 ;;
    *) max_len=1024 ;;
  esac
  work=$build/fuzz-run/$t
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  echo "fuzz: $t for ${seconds}s"
  dict=()
  [ -f "$root/tests/fuzz/dict/$t.dict" ] && dict=(-dict="$root/tests/fuzz/dict/$t.dict")
  # The first directory collects new inputs; the committed seeds are only read.
  if ! "$build/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 \
       -max_len="$max_len" -print_final_stats=1 -artifact_prefix="$work/artifacts/" "${dict[@]}" \
       "$work/corpus" "$root/tests/fuzz/corpus/$t" > "$work/log" 2>&1; then
    tail -n 60 "$work/log"
    echo "fuzz: $t FAILED; input in $work/artifacts/ (see tests/fuzz/README.md)"
    failed="$failed $t"
  else
    grep -E '^stat::number_of_executed_units|^#[0-9]+ *DONE' "$work/log" | tail -n 2 || true
  fi
done
if [ -n "$failed" ]; then
  echo "fuzz: failed:$failed"
  exit 1
fi
echo "fuzz: all harnesses ran ${seconds}s each without a finding"
