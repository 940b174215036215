#!/usr/bin/env bash
# run_device.sh — one call on the GPU machine: the gpu tests, lajit's benchmark and the peers on
# the same shapes, then the report (docs/bench/<gpu>.{json,md,png}) from that one run.
#
# Run from the repository root on the GPU machine, with the build tree carried as `build` and
# the peers' wheels as `.peers-whl` (../shared/peers/fetch-wheels.sh) and peer_bench.py copied to
# .devwork/peers/. Logs and the report go to $OUT. Usage:
#   bash bench/run_device.sh GPU_NAME [what...]    what: tests prefill decode cp peers report
# (cp, context parallelism over the host's GPUs, runs only when named)
set -uo pipefail
gpu=${1:-h200}
shift || true
what=${*:-tests prefill decode peers report}
OUT=${OUT:-/tmp/lajit-out}
mkdir -p "$OUT"
root=$(pwd)
# The build tree records the absolute path it was configured in; recreate that path.
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' build/CMakeCache.txt)
if [ -n "$src" ] && [ "$src" != "$root" ] && [ ! -e "$src" ]; then
    mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"
fi
export LAJIT_CACHE_DIR=/tmp/lajit-cache
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$OUT/gpu.txt"
python3 - "$OUT/meta.json" <<'PY'
import json, subprocess, sys
q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
                   capture_output=True, text=True).stdout.strip().split(", ")
json.dump({"device": q[0], "driver": q[1], "cc": q[2]}, open(sys.argv[1], "w"))
PY
case " $what " in *" tests "*)
    (cd "$src/build" && ctest -L gpu --output-on-failure -j 4 --timeout 600) >"$OUT/gpu-tests.log" 2>&1
    echo "gpu tests: $(grep -E 'tests passed|tests failed' "$OUT/gpu-tests.log")"
    grep -E "^\s+[0-9]+ - .*\((Failed|SEGFAULT|Timeout|Subprocess)" "$OUT/gpu-tests.log" | head -20
esac
: >"$OUT/lajit.jsonl"
case " $what " in *" decode "*)
    build/bench/lajit_bench --mode dispatch >>"$OUT/lajit.jsonl" 2>>"$OUT/bench.err"
    build/bench/lajit_bench --mode decode >>"$OUT/lajit.jsonl" 2>>"$OUT/bench.err"
esac
case " $what " in *" prefill "*)
    build/bench/lajit_bench --mode prefill >>"$OUT/lajit.jsonl" 2>>"$OUT/bench.err"
esac
case " $what " in *" cp "*)
    # Context parallelism over every GPU of the host (one process each); NCCL from the wheel.
    [ -n "${LAJIT_NCCL_PATH:-}" ] || export LAJIT_NCCL_PATH=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
    NCCL_NVLS_ENABLE=0 build/bench/lajit_bench --mode cp >>"$OUT/lajit.jsonl" 2>>"$OUT/bench.err"
esac
tail -5 "$OUT/bench.err" 2>/dev/null
case " $what " in *" peers "*)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .peers-whl/*.whl >/dev/null 2>&1
    PYTHONPATH=/tmp/site timeout 420 python3 .devwork/peers/peer_bench.py --mode all \
        --N 1024,2048,4096,8192,16384,32768 --out "$OUT/peers.json" >"$OUT/peers.log" 2>&1
    tail -2 "$OUT/peers.log"
esac
case " $what " in *" report "*)
    if [ -f "$OUT/peers.json" ]; then
        python3 bench/report.py --lajit "$OUT/lajit.jsonl" --peers "$OUT/peers.json" --gpu "$gpu" \
            --commit "$(cat .devwork/commit 2>/dev/null || echo unknown)" --meta "$OUT/meta.json" \
            --out "$OUT/report"
    fi
esac
cat "$OUT/lajit.jsonl"
