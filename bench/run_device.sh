#!/usr/bin/env bash
# run_device.sh — one call on the GPU machine: the gpu tests, lajit's benchmark and the peers on
# the same shapes, then the report (docs/bench/<gpu>.{json,md,png}) from that one run.
#
# Run from the repository root on the GPU machine, with the build tree carried as `build` (or
# $BUILD) and, for the peer steps, the peers' wheels (../shared/peers/fetch-wheels.sh) as
# `.peers-whl` (or $PEERS_WHL) and peer_bench.py (../shared/peers/, not part of the checkout) at
# .devwork/peers/peer_bench.py, .devout/peer_bench.py or $PEER_BENCH. Logs and the report go to
# $OUT. Usage:
#   bash bench/run_device.sh GPU_NAME [what...]
# what (default: tests prefill decode peers report), run in this order whatever the order given:
#   tests         ctest -L gpu
#   decode        lajit_bench dispatch, and decode at B 1..256, T 1 and 4, fp32 and bf16 pools
#                 (and --pdl 0,1 where this lajit_bench has it)
#   prefill       lajit_bench fwdbwd, the B = 4, H = 32 grid: fwd rows, and fwdbwd rows with and
#                 without ds (the training-step table); PREFILL_ARGS narrows it
#   long          lajit_bench fwdbwd at the long-sequence shapes of issue 16 (fwd, fwdbwd rows)
#   cp            context parallelism over the host's GPUs (only when named): CP_ARGS, then the
#                 same with LAJIT_CP_SEGMENTS=$CP_SEGMENTS (default off; empty: once only)
#   peers         peer_bench.py --mode all on the grid (about 7 minutes; PEERS_MODES for others)
#   peers-decode  bench/peers_decode.py: FLA's decode step in a CUDA graph at T 1 and 4
#   peers-long    peer_bench.py: the copy ceiling, then FLA alone at the long shapes, one call
#                 per (B, H, D) with its own time limit (FLA autotunes on its first calls)
#   report        bench/report.py over whatever rows the steps above left in $OUT
#   all           every step but cp
# $OUT/lajit.jsonl is started afresh: the report's lajit rows are this call's steps' own.
# Each step writes its log under $OUT and runs under a time limit; a step that fails or runs out
# of time leaves its rows so far and the next step runs. DEADLINE (seconds from the start, default
# 570) bounds the whole call: each step's limit is cut to what is left before it, keeping
# REPORT_RESERVE (default 20) seconds for the report. Per-step limits (seconds): TESTS_TIMEOUT 300,
# DECODE_TIMEOUT 240, PREFILL_TIMEOUT 240, LONG_TIMEOUT 150 (each shape), CP_TIMEOUT 300,
# PEERS_TIMEOUT 420, PEERS_DECODE_TIMEOUT 150, PEERS_LONG_TIMEOUT 150 (each (B, H, D); 240 at
# D = 64: PEERS_LONG_TIMEOUT_D64). LONG_SHAPES: "B H D N,N;..." REPORT_RUN, REPORT_JOIN and
# REPORT_COMMIT pass --run, --join and --commit to report.py (e.g. REPORT_JOIN=docs/bench/h200.json
# REPORT_RUN=long-call).
set -uo pipefail
gpu=${1:-h200}
shift || true
what=" ${*:-tests prefill decode peers report} "
case "$what" in *" all "*) what=" tests decode prefill long peers peers-decode peers-long report " ;; esac
OUT=${OUT:-/tmp/lajit-out}
mkdir -p "$OUT"
root=$(pwd)
build=${BUILD:-build}
bench="$build/bench/lajit_bench"
t_start=$(date +%s)
deadline=${DEADLINE:-570}
reserve=${REPORT_RESERVE:-20}
has() { case "$what" in *" $1 "*) return 0 ;; esac; return 1; }
# Seconds a step may take: its own limit, cut to what is left before the deadline (0: skip it).
limit() {
    local left=$((deadline - reserve - ($(date +%s) - t_start)))
    [ "$left" -lt "$1" ] && echo $((left > 0 ? left : 0)) || echo "$1"
}
note() { echo "[$(($(date +%s) - t_start)) s] $*" | tee -a "$OUT/steps.log"; }

# The build tree records the absolute path it was configured in; recreate that path.
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null)
if [ -n "$src" ] && [ "$src" != "$root" ] && [ ! -e "$src" ]; then
    mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"
fi
[ -n "$src" ] || src=$root
export LAJIT_CACHE_DIR=${LAJIT_CACHE_DIR:-/tmp/lajit-cache}
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$OUT/gpu.txt"
python3 - "$OUT/meta.json" <<'PY'
import json, subprocess, sys
q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
                   capture_output=True, text=True).stdout.strip().split("\n")[0].split(", ")
q += [None] * (3 - len(q))
json.dump({"device": q[0], "driver": q[1], "cc": q[2]}, open(sys.argv[1], "w"))
PY

# lajit_bench ARGS...: rows to lajit.jsonl, stderr to bench.err, under the step's limit $t.
lajit_rows() {
    [ "$t" -gt 0 ] || { note "skipped (deadline): lajit_bench $*"; return; }
    timeout "$t" "$bench" "$@" >>"$OUT/lajit.jsonl" 2>>"$OUT/bench.err"
    local rc=$?
    [ $rc -eq 0 ] || note "lajit_bench $* exited $rc"
}

# The peers' Python: the wheels into /tmp/site once (lajit's own wheel, where the folder holds
# one, is left out: the peers need none of it).
peers_ready=
peers_setup() {
    [ -n "$peers_ready" ] && return
    peers_ready=1
    whl=${PEERS_WHL:-}
    for d in .peers-whl .devout/whl; do [ -z "$whl" ] && ls $d/*.whl >/dev/null 2>&1 && whl=$d; done
    peer_bench=${PEER_BENCH:-}
    for f in .devwork/peers/peer_bench.py .devout/peer_bench.py ../shared/peers/peer_bench.py; do
        [ -z "$peer_bench" ] && [ -f "$f" ] && peer_bench=$f
    done
    if [ -n "$whl" ]; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/site \
            $(ls "$whl"/*.whl | grep -v '/lajit-') >"$OUT/pip.log" 2>&1 || note "pip install failed (pip.log)"
    else
        note "no peers' wheels (.peers-whl): the peer steps will find no FLA"
    fi
    [ -n "$peer_bench" ] || note "no peer_bench.py (.devwork/peers/ or .devout/): peers and peers-long skipped"
}
# peer_rows FILE LOG LIMIT CMD...: runs a peer script; its JSON rows (printed as measured) are
# appended to FILE whatever its exit, so a run cut by its limit keeps what it measured.
peer_rows() {
    local file=$1 log=$2 lim=$3
    shift 3
    [ "$lim" -gt 0 ] || { note "skipped (deadline): $*"; return 124; }
    PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} timeout "$lim" python3 "$@" >"$log" 2>&1
    local rc=$?
    grep '^{' "$log" >>"$file"
    [ $rc -eq 0 ] || note "$* exited $rc after at most $lim s (log: $log)"
    return $rc
}

: >"$OUT/lajit.jsonl"
if has tests; then
    t=$(limit "${TESTS_TIMEOUT:-300}")
    note "tests (limit $t s)"
    (cd "$src/$build" && timeout "$t" ctest -L gpu --output-on-failure -j 4 --timeout 600) >"$OUT/gpu-tests.log" 2>&1
    echo "gpu tests: $(grep -E 'tests passed|tests failed' "$OUT/gpu-tests.log")"
    grep -E "^\s+[0-9]+ - .*\((Failed|SEGFAULT|Timeout|Subprocess)" "$OUT/gpu-tests.log" | head -20
fi
if has decode; then
    t=$(limit "${DECODE_TIMEOUT:-240}")
    note "decode (limit $t s)"
    lajit_rows --mode dispatch
    pdl=()
    "$bench" --help 2>/dev/null | grep -q -- '--pdl' && pdl=(--pdl 0,1)
    t=$(limit "$t")
    lajit_rows --mode decode --decode-B 1,2,4,8,16,32,64,128,256 --decode-H 64 --decode-D 128 \
        --T 1,4 --state 32,16 "${pdl[@]}"
fi
if has prefill; then
    t=$(limit "${PREFILL_TIMEOUT:-240}")
    note "prefill (limit $t s)"
    # PREFILL_ARGS: lajit_bench options that narrow the grid (e.g. "--D 128 --N 8192,16384").
    lajit_rows --mode fwdbwd ${PREFILL_ARGS:-}
fi
# The long-sequence shapes (issue 16): B H D N lists, one lajit_bench (and one FLA call) each.
# D = 64 last: FLA autotunes longest there, and the deadline cuts what comes last.
long_shapes=${LONG_SHAPES:-"1 8 128 65536,262144,1048576;1 64 128 65536;1 1 128 1048576;2 16 64 131072"}
if has long; then
    note "long"
    IFS=';' read -ra specs <<<"$long_shapes"
    for spec in "${specs[@]}"; do
        set -- $spec
        t=$(limit "${LONG_TIMEOUT:-150}")
        lajit_rows --mode fwdbwd --B "$1" --H "$2" --D "$3" --N "$4"
    done
fi
if has cp; then
    t=$(limit "${CP_TIMEOUT:-300}")
    note "cp (limit $t s)"
    # Context parallelism over every GPU of the host (one process each); NCCL from the wheel.
    [ -n "${LAJIT_NCCL_PATH:-}" ] || export LAJIT_NCCL_PATH=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
    # CP_ARGS: lajit_bench's cp options (default: its own). The rows as the library stands (the
    # forward by segments automatic), then again with LAJIT_CP_SEGMENTS=$CP_SEGMENTS (default off:
    # the whole-span walk, for comparison; empty: not run): each row says which in "segments".
    NCCL_NVLS_ENABLE=0 lajit_rows --mode cp ${CP_ARGS:-}
    if [ -n "${CP_SEGMENTS-off}" ]; then
        t=$(limit "${CP_TIMEOUT:-300}")
        note "cp with LAJIT_CP_SEGMENTS=${CP_SEGMENTS-off} (limit $t s)"
        LAJIT_CP_SEGMENTS=${CP_SEGMENTS-off} NCCL_NVLS_ENABLE=0 lajit_rows --mode cp ${CP_ARGS:-}
    fi
fi
tail -5 "$OUT/bench.err" 2>/dev/null
if has peers; then
    peers_setup
    if [ -n "$peer_bench" ]; then
        note "peers"
        : >"$OUT/peers.jsonl"
        # PEERS_MODES: peer_bench.py's modes, one run each (default all; "ceil prefill" leaves
        # FLA's decode to a decode call, whose report rows it would otherwise duplicate).
        # PEERS_ARGS: options after the grid's, which they override (e.g. "--D 128 --N 8192").
        for mode in ${PEERS_MODES:-all}; do
            # shellcheck disable=SC2086
            peer_rows "$OUT/peers.jsonl" "$OUT/peers-$mode.log" "$(limit "${PEERS_TIMEOUT:-420}")" \
                "$peer_bench" --mode "$mode" --N 1024,2048,4096,8192,16384,32768 ${PEERS_ARGS:-}
            tail -2 "$OUT/peers-$mode.log"
        done
    fi
fi
if has peers-decode; then
    peers_setup
    note "peers-decode"
    : >"$OUT/peers-decode.jsonl"
    peer_rows "$OUT/peers-decode.jsonl" "$OUT/peers-decode.log" "$(limit "${PEERS_DECODE_TIMEOUT:-150}")" \
        bench/peers_decode.py --B 1,2,4,8,16,32,64,128,256 --T 1,4 --H 64 --D 128
fi
if has peers-long; then
    peers_setup
    if [ -n "$peer_bench" ]; then
        note "peers-long"
        : >"$OUT/peers-long.jsonl"
        # The copy rate of this call, for the floors (a ceil row from `peers` serves as well).
        peer_rows "$OUT/peers-long.jsonl" "$OUT/peers-long-ceil.log" "$(limit 60)" "$peer_bench" --mode ceil
        IFS=';' read -ra specs <<<"$long_shapes"
        for spec in "${specs[@]}"; do
            set -- $spec
            # FLA's first calls compile and autotune: minutes at D = 64 (PEERS_LONG_TIMEOUT).
            lim=$(limit "${PEERS_LONG_TIMEOUT:-150}")
            [ "$3" = 64 ] && lim=$(limit "${PEERS_LONG_TIMEOUT_D64:-240}")
            peer_rows "$OUT/peers-long.jsonl" "$OUT/peers-long-$1-$2-$3.log" "$lim" "$peer_bench" \
                --mode prefill --peers fla --B "$1" --H "$2" --D "$3" --N "$4"
            rc=$?
            # What was not measured is marked, for the report's tables.
            if [ $rc -ne 0 ]; then
                why="exit $rc"
                [ $rc -eq 124 ] && why="timeout after $lim s"
                for N in ${4//,/ }; do
                    grep -q "\"name\": \"fla_simple_gla\".*\"B\": $1, \"H\": $2, \"D\": $3, \"N\": $N," \
                        "$OUT/peers-long.jsonl" ||
                        echo "{\"kind\": \"prefill\", \"name\": \"fla_simple_gla\", \"B\": $1, \"H\": $2, \"D\": $3, \"N\": $N, \"error\": \"$why\"}" >>"$OUT/peers-long.jsonl"
                done
            fi
        done
    fi
fi
if has report; then
    note "report"
    peers_args=()
    for f in peers.jsonl peers-decode.jsonl peers-long.jsonl; do
        # The rows each peer run printed as it measured them (a run cut by its limit keeps them).
        [ -s "$OUT/$f" ] && peers_args+=(--peers "$OUT/$f")
    done
    extra=()
    [ -n "${REPORT_RUN:-}" ] && extra+=(--run "$REPORT_RUN")
    [ -n "${REPORT_JOIN:-}" ] && extra+=(--join "$REPORT_JOIN")
    python3 bench/report.py --lajit "$OUT/lajit.jsonl" "${peers_args[@]}" --gpu "$gpu" \
        --commit "${REPORT_COMMIT:-$(cat .devwork/commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)}" \
        --meta "$OUT/meta.json" --out "$OUT/report" "${extra[@]}" >"$OUT/report.log" 2>&1 ||
        note "report.py failed (report.log)"
    tail -3 "$OUT/report.log"
fi
note "done"
cat "$OUT/lajit.jsonl"
