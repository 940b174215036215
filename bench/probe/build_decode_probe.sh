#!/bin/sh
# Expands the decode template for every probe variant and builds the probe for sm_90a.
# Usage: [LAJIT=build/tools/lajit] bench/probe/build_decode_probe.sh OUTDIR   (from the repository root)
set -e
out=${1:-.devwork/decode}
mkdir -p "$out"
python3 bench/probe/expand_decode.py "${LAJIT:-build/tools/lajit}" "$out/decode_variants.cuh"
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -I templates -I "$out" \
    bench/probe/decode_probe.cu -o "$out/decode_probe" 2> "$out/ptxas.log"
