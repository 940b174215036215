#!/usr/bin/env bash
# make_tuned_table.sh — makes the shipped tuning table of this machine's GPU (tuned/README.md):
# tunes the forward's buckets below in a fresh tuning database (never the user's own), then writes
# its winners with `lajit db export --shipped` as tuned/<slug>.json, named after the device
# (a winner less than MIN_GAIN percent ahead of the default, default 3, is written as the
# default: a near tie is the tuner's noise, not a better kernel).
#
#   scripts/make_tuned_table.sh [BUILD_DIR]        (default: build)
#
# What is tuned (each a space-separated list; override in the environment):
#   DS      head widths, D = E                     (default "64 128"; set but empty: no forward)
#   DTYPES  input types                            (default "f32 f16 bf16")
#   DECAYS  1 with decay, 0 without                (default "1")
#   BS, H   batch sizes (comma list) and heads: one bucket per log2(B*H)  (default 1,4,16 and 64)
#   NS      sequence lengths (comma list): one bucket per log2(N)        (default 1024,8192,65536)
#   DECODE_STATES, DECODE_BS, DECODE_H, DECODE_D: decode's pool types, batch sizes, heads and
#           head width (default "f32 bf16", 1,4,16,64,256, 64, 128; DECODE_STATES="" skips)
# f32 runs on la_fwd (tf32), f16/bf16 on la_fwd_sm90 where the GPU is sm_90a (the default
# forward there) and on la_fwd elsewhere. Varlen buckets are not tuned (the tuner does not cover
# them yet): they keep the default. Each bucket takes seconds to a minute; the defaults are about
# 54 buckets.
set -euo pipefail
build=${1:-build}
lajit="$build/tools/lajit"
out=${OUT_DIR:-tuned}
DS=${DS-"64 128"}
DTYPES=${DTYPES-"f32 f16 bf16"}
DECAYS=${DECAYS:-"1"}
BS=${BS:-1,4,16}
H=${H:-64}
NS=${NS:-1024,8192,65536}
DECODE_STATES=${DECODE_STATES:-"f32 bf16"}
DECODE_BS=${DECODE_BS:-1,4,16,64,256}
DECODE_H=${DECODE_H:-64}
DECODE_D=${DECODE_D:-128}
LAJIT_CACHE_DIR=$(mktemp -d)
export LAJIT_CACHE_DIR
trap 'rm -rf "$LAJIT_CACHE_DIR"' EXIT
unset LAJIT_TUNED_DIR

sm90=0
if "$lajit" info | grep -q 'sm_90a'; then
    sm90=1
fi
for d in $DS; do
    for dtype in $DTYPES; do
        family=la_fwd
        if [ "$dtype" != f32 ] && [ "$sm90" = 1 ]; then
            family=la_fwd_sm90
        fi
        for decay in $DECAYS; do
            echo "== $family $dtype D=E=$d decay=$decay B=$BS H=$H N=$NS"
            "$lajit" tune --family "$family" --dtype "$dtype" --D "$d" --B "$BS" --H "$H" \
                --N "$NS" -p decay="$decay"
        done
    done
done
# Decode (la_decode, T = 1, bf16 inputs, D = E = DECODE_D): one bucket per log2(B*H) of
# DECODE_BS x DECODE_H, for each pool type of DECODE_STATES (f32, bf16 or f16).
for st in $DECODE_STATES; do
    echo "== la_decode bf16 state=$st D=E=$DECODE_D B=$DECODE_BS H=$DECODE_H T=1"
    "$lajit" tune --family la_decode --dtype bf16 --D "$DECODE_D" --B "$DECODE_BS" \
        --H "$DECODE_H" --T 1 -p decay=1 -p state_dtype="$st"
done
mkdir -p "$out"
"$lajit" db export --shipped "$out/" --min-gain "${MIN_GAIN:-3}"
