#!/usr/bin/env bash
# The first device call of a GPU session (docs/gpu-session.md, step 1), about six minutes on
# an H100 (give it 450 s): every GPU test, the kernel A/B (the depthwise kernel against its
# ea18c6e version and unrolled), the depthwise kernel and deferred biases in whole models
# against the revision staged as gpu-carry/opsched-before, the Transformer's merged
# projections read in place, compute-sanitizer on RandWire and NASNet, and where NASNet's
# kernel time goes. Run on the device in the repository root, gpu-carry/ carried:
#   bash xtask/gpu/first-call.sh
# Each step has its own time limit and the next runs whatever happened, so one failure costs
# one step. What comes back ($OUT, at most 8 files): log.txt (everything), results.txt (one
# line per step or process, then the whole-model lines' verdict table), kernels.txt (the kernel table), kernels.tar.gz (the same as
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
# strided views, peak memory, cuDNN kernels, our depthwise kernels (which of the three each
# distinct depthwise convolution runs), layout and its conversions, and the check.
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
print("%.4f ms (p10 %.4f p90 %.4f) launches %s kernels %s merged %s strided %s peak %s conv %s depthwise %s layout %s/%s%s" % (
      l["median_ms"], l["p10_ms"], l["p90_ms"], r.get("launches"), r.get("kernels"),
      r.get("merged_convolutions"), r.get("strided_views"), r.get("peak_memory_bytes"),
      r.get("conv_kernels"), r.get("depthwise_kernels"), r.get("layout"),
      r.get("layout_conversions"), check))'
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
cp fixtures/gpu/h100-2026-11-27b/cost-cache.bin $C/both.bin
export OPSCHED_CACHE=$C/both.bin
# (The kernel A/B runs in its own step below; the layout A/B answered on 2026-11-27.)
for t in gpu-carry/tests/*; do
    step "$t"
    timeout 150 "$t" --ignored --test-threads 1 --skip kernels_side_by_side \
        --skip convolutions_in_nchw_and_in_nhwc >>"$L" 2>&1
    result "test ${t##*/}: rc=$?"
done
save_cache
# The NVRTC kernels changed since a GPU last checked them, side by side with those versions
# (crates/gpu/src/cuda/nvrtc_ab.rs): the depthwise kernel against ea18c6e's, with and without
# an input bias, in both layouts, and with its width unrolled.
step "kernel A/B"
timeout 60 gpu-carry/tests/opsched_gpu-* --ignored --nocapture kernels_side_by_side 2>&1 |
    tee -a "$L" | grep "kernel A/B" | tee -a "$R"

# NASNet and RandWire ran 1.26x and 1.10x slower at b5cad61 than at ea18c6e (same schedules;
# deferred biases, the depthwise kernel's extra inputs): this revision's depthwise kernels
# (since then: the relu a template case, the tiled kernel where it measures faster) against
# ea18c6e's in whole models, NCHW (ea18c6e's layout), processes alternating, two each; then
# this revision in its default layout (channels last), one process each.
# The same binary with fusions left out (`--no-fusion`, the report's fusions_left_out) says
# which fusion does it: "no-dw" leaves biases to add kernels only (not to the depthwise
# kernel), "no-act" lets every reader apply its relu again (NASNet's cell outputs), "no-pool"
# runs NASNet's pools beside their sums again (695 kernels against 627), "no-writers" lets its
# cell outputs be activated whole after their sums (649), "no-bpool" lets its cells' 1x1
# convolutions add their biases again (669), "no-bcat" its factorized reductions' (635),
# "none" leaves out all eight (ea18c6e's kernel count, this revision's kernels).
NONE="--no-fusion bias-into-adds --no-fusion bias-into-depthwise --no-fusion sum-into-depthwise"
NONE="$NONE --no-fusion act-into-producer --no-fusion pool-into-sum --no-fusion act-into-writers"
NONE="$NONE --no-fusion bias-into-pools --no-fusion bias-through-concat"
NODW="--no-fusion bias-into-depthwise"
NOACT="--no-fusion act-into-producer"
NOPOOL="--no-fusion pool-into-sum"
NOWRITERS="--no-fusion act-into-writers"
NOBPOOL="--no-fusion bias-into-pools"
NOBCAT="--no-fusion bias-through-concat"
for case in "nasnet lios" "randwire lios" "resnet50 sequential"; do
    set -- $case
    for i in 1 2; do
        if [ -x gpu-carry/opsched-before ]; then
            BIN=gpu-carry/opsched-before run "before $(cat gpu-carry/BEFORE) nchw $2 $1 process $i" \
                60 $1 --algo $2 --layout nchw --repeats 100
        fi
        run "after nchw $2 $1 process $i" 60 $1 --algo $2 --layout nchw --repeats 100
        if [ $1 != resnet50 ]; then
            run "after nchw no-dw $2 $1 process $i" 60 $1 --algo $2 --layout nchw --repeats 100 $NODW
            run "after nchw none $2 $1 process $i" 60 $1 --algo $2 --layout nchw --repeats 100 $NONE
        fi
    done
    run "after nhwc $2 $1" 60 $1 --algo $2 --repeats 100
    if [ $1 != resnet50 ]; then
        run "after nhwc no-dw $2 $1" 60 $1 --algo $2 --repeats 100 $NODW
        run "after nhwc none $2 $1" 60 $1 --algo $2 --repeats 100 $NONE
    fi
    if [ $1 = nasnet ]; then
        run "after nhwc no-act $2 $1" 60 $1 --algo $2 --repeats 100 $NOACT
        run "after nhwc no-pool $2 $1" 60 $1 --algo $2 --repeats 100 $NOPOOL
        run "after nhwc no-writers $2 $1" 60 $1 --algo $2 --repeats 100 $NOWRITERS
        run "after nhwc no-bpool $2 $1" 60 $1 --algo $2 --repeats 100 $NOBPOOL
        run "after nhwc no-bcat $2 $1" 60 $1 --algo $2 --repeats 100 $NOBCAT
    fi
done
# NASNet at batch 16 took 46.7 ms channels last at b5cad61 against 37.6 NCHW the day before
# (806bafb, before deferred biases): this revision in both layouts, one process each, and
# channels last without the fusions.
for layout in nchw nhwc; do
    run "b16 $layout sequential nasnet" 90 nasnet --batch 16 --algo sequential \
        --layout $layout --repeats 20
done
run "b16 nhwc none sequential nasnet" 90 nasnet --batch 16 --algo sequential --repeats 20 $NONE
save_cache
# The lines above as one table (xtask/gpu/verdict.py): each variant's median against the
# default's, "faster" where leaving a fusion out (or the older binary) wins in every process.
timeout 10 python3 xtask/gpu/verdict.py "$R" 2>>"$L" | sed 's/^/verdict /' | tee -a "$R" >/dev/null

# The Transformer's query, key and value projections merged into one product per layer that
# the attention reads in place (failed on 2026-11-27: the product refused the strided view;
# fixed in 8972a52): checked, then three processes at batch 1 (the scoreboard's ios column:
# 0.828 ms on 2026-11-26), and ios-merge beside the sequential plan at batch 16 (2.209 ms).
run "check ios transformer" 60 transformer --algo ios --check --repeats 20
for i in 1 2 3; do
    run "ios transformer process $i" 60 transformer --algo ios --repeats 100
done
run "b16 ios-merge transformer" 60 transformer --batch 16 --algo ios-merge --repeats 50
save_cache

# compute-sanitizer on RandWire at batch 1 in the default layout: its depthwise kernels read
# the sums before them and add the biases left to them.
step "memcheck randwire"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 opsched run randwire \
    --backend cuda --algo lios --warmup 1 --repeats 2 >>"$L" 2>&1
result "memcheck randwire: rc=$?"
# And on NASNet at input 64, batch 2, channels last: its pooled sums (`pool2d_sum`), its cell
# outputs' slices activated in place (`bias_act_runs`), strided views everywhere.
step "memcheck nasnet"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 1 opsched run nasnet \
    --input-size 64 --batch 2 --backend cuda --algo lios --warmup 1 --repeats 2 >>"$L" 2>&1
result "memcheck nasnet: rc=$?"

# Where NASNet's kernel time goes channels last at batch 1, kernel by kernel (ncu, one eager
# run; the cache holds its kernel choices, so nothing is tuned; the weights' permutations to
# KRSC are the plan's preparation, not the run).
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
step "kernels nhwc nasnet b1"
timeout 100 "${NCU:-ncu}" --clock-control none --csv --page raw --print-units base \
    --metrics gpu__time_duration.sum --log-file $C/kernels/ours-nhwc-nasnet-b1.csv \
    opsched run nasnet --backend cuda --algo sequential --warmup 0 --repeats 1 >>"$L" 2>&1
timeout 30 python3 xtask/gpu/kernels.py ncu $C/kernels/ours-nhwc-nasnet-b1.csv \
    --json $C/kernels/ours-nhwc-nasnet-b1.json >>"$K" 2>>"$L"
result "kernels ours nhwc nasnet b1: rc=$?"
tar -C $C -czf "$OUT/kernels.tar.gz" kernels 2>>"$L"
save_cache
step done
