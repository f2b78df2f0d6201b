#!/usr/bin/env bash
# A scoreboard call of a GPU session (docs/gpu-session.md, step 2): bench-gpu for some models
# at some batches, merged into the committed table, which comes back in $OUT. Run on the device
# in the repository root, gpu-carry/ carried (with the cost cache of the first call copied to
# gpu-carry/cost-cache.bin; without it, the last committed cache):
#   bash xtask/gpu/scoreboard-call.sh MODELS BATCHES SECONDS
# e.g. `bash xtask/gpu/scoreboard-call.sh nasnet 1 330`. SECONDS bounds bench-gpu (give the
# call 20 more); the table is rewritten after every model, so what finished comes back. Runs
# may follow one another in one call (`A; B`): each merges onto the table and cache the one
# before left in $OUT.
set -u
models=${1:?models, comma-separated} batches=${2:?batches, comma-separated} limit=${3:-330}
source xtask/gpu/env.sh
# The cache an earlier run of this script left in $OUT in this call, else the first call's
# where it was copied into gpu-carry/, else the last committed one; kept outside $OUT while
# running (its lock file), copied out at the end.
mkdir -p /tmp/opsched-caches
cache=$OUT/cost-cache.bin
[ -e "$cache" ] || cache=gpu-carry/cost-cache.bin
[ -e "$cache" ] || cache=fixtures/gpu/h100-2026-11-27d/cost-cache.bin
cp "$cache" /tmp/opsched-caches/board.bin
export OPSCHED_CACHE=/tmp/opsched-caches/board.bin
# How the products choose their kernel (bench-gpu --gemm), how activations are stored
# (--layout) and which fusions our runs leave out (NOFUSION, names separated by spaces:
# `opsched run --no-fusion`): the committed table's products measured nothing, its activations
# were channels last and it left no fusion out, so only `heuristic` with `nhwc` and no
# NOFUSION merges into it; GEMM=measured, LAYOUT=nchw or a NOFUSION starts a table of its own.
gemm=${GEMM:-heuristic} layout=${LAYOUT:-nhwc} merge= nofusion=
for f in ${NOFUSION:-}; do nofusion="$nofusion --no-fusion $f"; done
if [ "$gemm" = heuristic ] && [ "$layout" = nhwc ] && [ -z "$nofusion" ]; then
    # A table an earlier run of this script wrote in this call (`...; bash
    # xtask/gpu/scoreboard-call.sh ...`) has the committed rows and its own: merge onto it.
    [ -e "$OUT/nvidia-h100-80gb-hbm3.json" ] ||
        cp fixtures/gpu/nvidia-h100-80gb-hbm3.* "$OUT/"
    chmod u+w "$OUT"/*
    merge=--merge
fi
start=$(date +%s)
timeout "$limit" xtask bench-gpu --models "$models" --batches "$batches" --gemm "$gemm" \
    --layout "$layout" $nofusion $merge --out "$OUT" 2>&1 | tail -n 40
echo "bench-gpu: $(($(date +%s) - start)) s"
cp "$OPSCHED_CACHE" "$OUT/cost-cache.bin"
