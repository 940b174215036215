#!/usr/bin/env bash
# cpu_package.sh — CTest case python.package: build lajit's wheel from the source tree with pip
# (scikit-build-core driving the project's CMake), check its contents (check_wheel.py), install it
# into a throwaway virtual environment and run test_cpu_package.py there.
#
# Usage: cpu_package.sh SOURCE_DIR WORK_DIR [PYTHON]
#
# torch: PyPI's Linux torch is the CUDA build (several GB with its nvidia-* wheels), too slow to
# install afresh on every run. So the fresh venv holds only lajit, and sees torch through a .pth
# file pointing at a torch venv kept in a cache ($LAJIT_TEST_TORCH_VENV, default
# ~/.cache/lajit/test-torch-venv), made once from PyPI. A Python that already has torch is used
# directly instead. Exit 77 (skipped) only when there is no torch and no network to get it.
set -euo pipefail
src=$1
work=$2
py=${3:-python3}
rm -rf "$work/venv" "$work/dist" "$work/home"
mkdir -p "$work"

torch_site=""
if "$py" -c "import torch" 2>/dev/null; then
  torch_site=$("$py" -c "import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))")
else
  tv=${LAJIT_TEST_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/lajit/test-torch-venv}
  if ! "$tv/bin/python" -c "import torch" 2>/dev/null; then
    echo "python.package: installing torch from PyPI into $tv (once; reused by later runs)"
    rm -rf "$tv"
    "$py" -m venv "$tv"
    if ! "$tv/bin/pip" install -q --no-cache-dir torch; then
      rm -rf "$tv"
      echo "SKIPPED: no torch importable and it could not be installed from PyPI (no network?)"
      exit 77
    fi
  fi
  torch_site=$("$tv/bin/python" -c "import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))")
fi
echo "python.package: torch from $torch_site"

"$py" -m venv "$work/venv"
vpy="$work/venv/bin/python"
echo "$torch_site" > "$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_test_torch.pth"

# The wheel, as a user or the coordinator builds it.
"$vpy" -m pip wheel -q --no-deps "$src" -w "$work/dist"
wheel=$(ls "$work"/dist/lajit-*.whl)
"$vpy" "$src/python/tests/check_wheel.py" "$wheel"

# Installed without its NVRTC dependency (not needed without a GPU; the wheel is 90 MB).
"$vpy" -m pip install -q --no-deps "$wheel"
# Run from a directory outside the source tree, with a private cache: the package under test is
# the installed one.
mkdir -p "$work/home"
cd "$work/home"
# The family path holds the CPU tests' custom family (lajit.launch's argument checks).
LAJIT_FAMILY_PATH="$src/tests/data/families" \
LAJIT_CACHE_DIR="$work/home/cache" "$vpy" "$src/python/tests/run.py" \
  "$src/python/tests/test_cpu_package.py" "$src/python/tests/test_cpu_mock.py"
