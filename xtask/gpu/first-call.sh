#!/usr/bin/env bash
# The first device call of a GPU session (docs/gpu-session.md, step 1), about six minutes on
# an H100 (give it 450 s): every GPU test, the NVRTC and layout A/Bs, then
# channels-last activations (--layout nhwc) checked against NCHW on every CNN of the zoo and
# timed beside it, deferred biases against the revision before them, compute-sanitizer on a
# channels-last run, and where the kernel time of channels-last ResNet-50 goes. Run on the
# device in the repository root, gpu-carry/ carried:
#   bash xtask/gpu/first-call.sh
# Each step has its own time limit and the next runs whatever happened, so one failure costs
# one step. What comes back ($OUT, at most 8 files): log.txt (everything), results.txt (one
# line per step or process), kernels.txt (the kernel table), kernels.tar.gz (the same as
# JSON) and cost-cache.bin (the measured cuDNN choices, to carry in later calls: copied out
# after every section, so a call stopped by its limit keeps what it timed). Caches are kept
# outside $OUT while running: their lock files would take places among the 8.
set -u
source xtask/gpu/env.sh
L=$OUT/log.txt R=$OUT/results.txt K=$OUT/kernels.txt C=/tmp/opsched-caches
mkdir -p $C/kernels
step() { echo "=== $(date +%T) $*" >>"$L"; }
result() { echo "$*" | tee -a "$R"; }
save_cache() { cp $C/both.bin "$OUT/cost-cache.bin" 2>>"$L"; }
# One process's JSON report as one line: median latency, launches, merged convolutions,
# strided views, peak memory, cuDNN kernels, layout and its conversions, and the check.
lat() {
    python3 -c 'import json,sys
try:
    r = json.load(sys.stdin)
except ValueError:
    print("failed (log.txt)"); sys.exit()
l = r["latency"]
c = r.get("check")
check = "" if c is None else " check %s (vs sequential %.1e at %s)" % (
    "passed" if c["passed"] else "FAILED", c["vs_sequential"], c["vs_sequential_node"])
print("%.4f ms (p10 %.4f p90 %.4f) launches %s kernels %s merged %s strided %s peak %s conv %s layout %s/%s%s" % (
      l["median_ms"], l["p10_ms"], l["p90_ms"], r.get("launches"), r.get("kernels"),
      r.get("merged_convolutions"), r.get("strided_views"), r.get("peak_memory_bytes"),
      r.get("conv_kernels"), r.get("layout"), r.get("layout_conversions"), check))'
}
# `run NAME LIMIT ARGS...`: one `opsched run ... --backend cuda --graph-capture --json` process
# (of $BIN, default opsched), its line in results.txt.
run() {
    local name=$1 limit=$2
    shift 2
    step "$name"
    result "$name: $(timeout "$limit" "${BIN:-opsched}" run "$@" --backend cuda --graph-capture \
        --json 2>>"$L" | lat)"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$L"

# The committed cache of the last session that brought one back: its kernels again, and only
# new shapes are timed (by the first process that meets them; the later ones run the same).
cp fixtures/gpu/h100-2026-11-26/cost-cache.bin $C/both.bin
export OPSCHED_CACHE=$C/both.bin
# (The two A/B tests run in their own steps below.)
for t in gpu-carry/tests/*; do
    step "$t"
    timeout 150 "$t" --ignored --test-threads 1 --skip kernels_side_by_side \
        --skip convolutions_in_nchw_and_in_nhwc >>"$L" 2>&1
    result "test ${t##*/}: rc=$?"
done
save_cache
# The NVRTC kernels changed since the last GPU checked them, side by side with those versions
# (crates/gpu/src/cuda/nvrtc_ab.rs), and cuDNN's convolutions of ResNet-50 and Inception-v3 in
# NCHW against NHWC (crates/gpu/src/cuda/layout_ab.rs).
step "kernel A/B"
timeout 60 gpu-carry/tests/opsched_gpu-* --ignored --nocapture kernels_side_by_side 2>&1 |
    tee -a "$L" | grep "kernel A/B" | tee -a "$R"
step "layout A/B"
timeout 120 gpu-carry/tests/opsched_gpu-* --ignored --nocapture convolutions_in_nchw_and_in_nhwc \
    2>&1 | tee -a "$L" | grep "layout A/B" | tee -a "$R"
save_cache

# Channels last, checked: each CNN's LIOS plan against a sequential NCHW run (and the CPU
# reference under 2 GFLOPs). On 2026-11-27 the layout computed wrong values (the bias kernel
# after cuDNN covered the first pixels only; fixed since): every line must say `passed`.
for m in resnet50 googlenet inception_v3 squeezenet nasnet randwire; do
    run "check nhwc lios $m" 90 $m --algo lios --layout nhwc --check --repeats 20
done
for m in resnet50 inception_v3; do
    run "check nhwc lios $m b16" 90 $m --batch 16 --algo lios --layout nhwc --check --repeats 20
done
run "check nhwc ios squeezenet b2" 60 squeezenet --batch 2 --algo ios --layout nhwc --check \
    --repeats 20
save_cache

# Deferred biases (new since 2026-11-27: a convolution leaves its bias to the add or depthwise
# kernel that reads it; NASNet 988 kernels to 766, RandWire 405 to 292, ResNet-50 68 to 60;
# and RandWire's depthwise kernels read the sums before them: 292 to 233),
# NCHW at batch 1, against the revision staged as gpu-carry/opsched-before (`BEFORE=rev
# xtask/gpu/stage.sh`), processes alternating, two each. Without it, this revision alone.
for case in "nasnet lios" "resnet50 sequential" "randwire lios"; do
    set -- $case
    for i in 1 2; do
        if [ -x gpu-carry/opsched-before ]; then
            BIN=gpu-carry/opsched-before run "before $(cat gpu-carry/BEFORE) nchw $2 $1 process $i" \
                60 $1 --algo $2 --repeats 100
        fi
        run "after nchw $2 $1 process $i" 60 $1 --algo $2 --repeats 100
    done
done
save_cache

# Channels last against NCHW at batch 1: one NCHW process beside for ResNet-50 and
# Inception-v3 (the three of 2026-11-27 are in fixtures/gpu/h100-2026-11-27; GoogLeNet's and
# SqueezeNet's NCHW rows are the scoreboard's), three channels-last processes of the
# sequential plan, one of LIOS.
for m in resnet50 inception_v3 googlenet squeezenet nasnet; do
    case $m in resnet50 | inception_v3) run "nchw sequential $m" 60 $m --algo sequential ;; esac
    for i in 1 2 3; do
        run "nhwc sequential $m process $i" 60 $m --algo sequential --layout nhwc --repeats 100
    done
    run "nhwc lios $m" 60 $m --algo lios --layout nhwc --repeats 100
done
# Batch 16, one process each (the NCHW lines of 2026-11-27 beside).
for m in resnet50 inception_v3 googlenet squeezenet nasnet; do
    for a in sequential lios; do
        run "b16 nhwc $a $m" 90 $m --batch 16 --algo $a --layout nhwc --repeats 50
    done
done
save_cache

# IOS on the Transformer, its query, key and value projections merged into one product per
# layer (new since 2026-11-27) that the attention's batched products read in place: against
# the scoreboard's ios column (0.828 ms at batch 1, 2026-11-26) and the sequential plan at
# batch 16 (2.375 ms, 2026-11-27).
run "check ios transformer" 60 transformer --algo ios --check --repeats 20
for i in 1 2 3; do
    run "ios transformer process $i" 60 transformer --algo ios --repeats 100
done
# At batch 16 IOS's cost model charges the merged product as the three (each fills the GPU),
# so it merges nothing there: ios-merge does.
run "b16 sequential transformer" 60 transformer --batch 16 --algo sequential --repeats 50
run "b16 ios-merge transformer" 60 transformer --batch 16 --algo ios-merge --repeats 50
save_cache

# compute-sanitizer on a channels-last plan at batch 2 (GoogLeNet: its branches write their
# concatenation slices a run of channels per pixel).
step "memcheck nhwc googlenet b2"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 opsched run googlenet --batch 2 \
    --backend cuda --algo lios --layout nhwc --warmup 1 --repeats 2 >>"$L" 2>&1
result "memcheck nhwc googlenet b2: rc=$?"

# Where the time of channels-last ResNet-50 at batch 1 goes, kernel by kernel (ncu, one eager
# run; the cache already holds its kernel choices, so nothing is tuned): which layout
# conversions and bias kernels are left (torch.compile's table is in kernels-call1.txt of
# 2026-11-27: 501 us in 107 launches).
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
step "kernels nhwc resnet50 b1"
timeout 90 "${NCU:-ncu}" --clock-control none --csv --page raw --print-units base \
    --metrics gpu__time_duration.sum --log-file $C/kernels/ours-nhwc-resnet50-b1.csv \
    opsched run resnet50 --backend cuda --algo sequential --layout nhwc --warmup 0 --repeats 1 \
    >>"$L" 2>&1
timeout 30 python3 xtask/gpu/kernels.py ncu $C/kernels/ours-nhwc-resnet50-b1.csv \
    --json $C/kernels/ours-nhwc-resnet50-b1.json >>"$K" 2>>"$L"
result "kernels ours nhwc resnet50 b1: rc=$?"
tar -C $C -czf "$OUT/kernels.tar.gz" kernels 2>>"$L"
save_cache
step done
