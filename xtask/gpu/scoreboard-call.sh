#!/usr/bin/env bash
# A scoreboard call of a GPU session (docs/gpu-session.md, step 2): bench-gpu for some models
# at some batches, merged into the committed table, which comes back in $OUT. Run on the device
# in the repository root, gpu-carry/ carried (with the cost cache of the first call copied to
# gpu-carry/cost-cache.bin; without it, the last committed cache):
#   bash xtask/gpu/scoreboard-call.sh MODELS BATCHES SECONDS
# e.g. `bash xtask/gpu/scoreboard-call.sh nasnet 1 330`. SECONDS bounds bench-gpu (give the
# call 20 more); the table is rewritten after every model, so what finished comes back.
set -u
models=${1:?models, comma-separated} batches=${2:?batches, comma-separated} limit=${3:-330}
source xtask/gpu/env.sh
# The first call's cache where it was copied into gpu-carry/, else the last committed one;
# kept outside $OUT while running (its lock file), copied out at the end.
mkdir -p /tmp/opsched-caches
cache=gpu-carry/cost-cache.bin
[ -e "$cache" ] || cache=fixtures/gpu/h100-2026-11-27b/cost-cache.bin
cp "$cache" /tmp/opsched-caches/board.bin
export OPSCHED_CACHE=/tmp/opsched-caches/board.bin
# How the products choose their kernel (bench-gpu --gemm) and how activations are stored
# (--layout): the committed table's products measured nothing and its activations were
# channels last, so only `heuristic` with `nhwc` merges into it; GEMM=measured or LAYOUT=nchw
# starts a table of its own.
gemm=${GEMM:-heuristic} layout=${LAYOUT:-nhwc} merge=
if [ "$gemm" = heuristic ] && [ "$layout" = nhwc ]; then
    cp fixtures/gpu/nvidia-h100-80gb-hbm3.* "$OUT/" && chmod u+w "$OUT"/*
    merge=--merge
fi
start=$(date +%s)
timeout "$limit" xtask bench-gpu --models "$models" --batches "$batches" --gemm "$gemm" \
    --layout "$layout" $merge --out "$OUT" 2>&1 | tail -n 40
echo "bench-gpu: $(($(date +%s) - start)) s"
cp "$OPSCHED_CACHE" "$OUT/cost-cache.bin"
