#!/usr/bin/env bash
# setup.sh — installs what lajit's build needs and is missing (Debian/Ubuntu), only when missing.
# As root it runs apt-get; otherwise it prints the command to run and fails.
set -euo pipefail
need=()
for pkg in cmake make gcc pkg-config liblua5.4-dev libsqlite3-dev libxxhash-dev libdlpack-dev clang-format python3 python3-venv python3-pip; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "lajit needs: ${need[*]}" >&2
        echo "run: sudo apt-get update && sudo apt-get install -y ${need[*]}" >&2
        exit 1
    fi
    echo "installing: ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! command -v nvcc >/dev/null && [ ! -e /usr/local/cuda/include/cuda.h ]; then
    echo "lajit needs the CUDA toolkit's headers (/usr/local/cuda) to build, and NVRTC at run time" >&2
    exit 1
fi
