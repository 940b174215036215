#!/usr/bin/env bash
# run_gpu_checks.sh — the Python package's checks on the GPU machine, from an installed wheel.
#
# Usage (from the project root): bash python/run_gpu_checks.sh WHEEL_DIR [OUT_DIR]
#   WHEEL_DIR holds lajit-*.whl, and optionally the peers' wheels (fla_core-*.whl, ...) and
#   nvidia_cuda_nvrtc-*.whl; OUT_DIR (default $OUT, else /tmp/lajit-gpu-checks) receives
#   overhead.json and the logs.
# It installs every wheel of WHEEL_DIR offline (--no-index --no-deps) into a private folder on
# PYTHONPATH beside the machine's PyTorch, and from a directory outside
# the source tree runs: the GPU tests (pytest when installed, else python/tests/run.py), the
# context-parallel check (python/tests/cp_check.py: spawned ranks), the README's example as
# written, and bench_overhead.py. Exit status: 0 when all passed.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
whl=$(cd "$1" && pwd)
out=${2:-${OUT:-/tmp/lajit-gpu-checks}}
mkdir -p "$out"
work=$(mktemp -d)
status=0

# Installed into a private target folder rather than a venv: the machine's python3 may itself be
# a virtual environment (the GPU image's is), whose packages a --system-site-packages venv would
# not see.
py=python3
"$py" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "$whl"/*.whl || exit 1
export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$work/site/bin:$PATH"
cd "$work"
"$py" - <<'PY'
import lajit, torch
print("lajit", lajit.version(), "from", lajit.__file__)
print("torch", torch.__version__, "device", torch.cuda.get_device_name())
print("NVRTC from the wheels:", lajit.find_wheel_nvrtc())
PY
lajit info || status=1

echo "== GPU tests"
if "$py" -c "import pytest" 2>/dev/null; then
  "$py" -m pytest -v -rs "$src"/python/tests/test_gpu_*.py 2>&1 | tee "$out/gpu_tests.log"
else
  "$py" "$src/python/tests/run.py" "$src"/python/tests/test_gpu_*.py 2>&1 | tee "$out/gpu_tests.log"
fi
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== Context parallelism: P = 2, 3 ranks on this GPU (gloo), P = 1 (NCCL)"
# The script's own folder (python/tests, first on sys.path) holds no package, so the installed
# lajit is the one imported, in the spawned ranks too (they inherit PYTHONPATH).
"$py" "$src/python/tests/cp_check.py" 2>&1 | tee "$out/cp_check.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== CPU package tests against this install"
"$py" "$src/python/tests/run.py" "$src/python/tests/test_cpu_package.py" 2>&1 | tee "$out/cpu_tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== README example"
"$py" - "$src/README.md" > "$work/readme_example.py" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
section = text.split("## Python package", 1)[1]
print(re.search(r"```python\n(.*?)```", section, re.S).group(1))
PY
"$py" "$work/readme_example.py" 2>&1 | tee "$out/readme_example.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== Python overhead per decode call"
# Run from a copy: a script's own folder comes first on sys.path, and python/ holds the package's
# source (without its shared library), which would shadow the installed package.
cp "$src/python/bench_overhead.py" "$work/bench_overhead.py"
"$py" "$work/bench_overhead.py" --out "$out/overhead.json" || status=1
"$py" "$work/bench_overhead.py" --B 1 --H 1 --D 64 --out "$out/overhead_small.json" || status=1

echo "run_gpu_checks: $([ $status -eq 0 ] && echo PASSED || echo FAILED)"
exit $status
