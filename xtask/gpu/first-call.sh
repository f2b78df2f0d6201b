#!/usr/bin/env bash
# The first device call of a GPU session whose kernels changed (docs/gpu-session.md, step 1),
# about four minutes on an H100 (give it 360 s; on 2026-11-27d the tests alone took 4 min 20 s
# one binary after another, now in two lanes at once):
# every GPU test, the kernel A/B, which fusions cost RandWire and NASNet channels last (three
# processes each, alternating with the default), the Transformer's IOS plan checked and timed,
# and compute-sanitizer on it. Run on the device in the repository root, gpu-carry/
# carried:
#   bash xtask/gpu/first-call.sh
# Each step has its own time limit and the next runs whatever happened, so one failure costs
# one step. What comes back ($OUT, at most 8 files): log.txt (everything), results.txt (one
# line per step or process, then the whole-model lines' verdict table) and cost-cache.bin (the
# measured cuDNN choices, to carry in later calls: copied out after every process, so a call
# stopped by its limit keeps what it timed). Caches are kept outside $OUT while running: their
# lock files would take places among the 8.
set -u
source xtask/gpu/env.sh
L=$OUT/log.txt R=$OUT/results.txt C=/tmp/opsched-caches
mkdir -p $C
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
check = "" if c is None else " check %s (vs sequential %.1e at %s%s)" % (
    "passed" if c["passed"] else "FAILED", c["vs_sequential"], c["vs_sequential_node"],
    "" if c.get("vs_reference") is None else
    ", vs reference %.1e at %s" % (c["vs_reference"], c["vs_reference_node"]))
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
    # What it timed comes back even if the call's limit stops a later step (on 2026-11-27d
    # the limit came before a section's end, and a later call timed its choices again).
    save_cache
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$L"

# The committed cache of the last session that brought one back: its kernels again, and only
# new shapes are timed (by the first process that meets them; the later ones run the same).
cp fixtures/gpu/h100-2026-11-27d/cost-cache.bin $C/both.bin
export OPSCHED_CACHE=$C/both.bin
# Every GPU test (all passed on 2026-11-27d, at fcc141e): the kernels against the CPU
# reference, plans against the sequential run, the ONNX parity models against onnxruntime.
# Two lanes at once (one binary after another they took 4 min 20 s on 2026-11-27d): exec_plan
# (138 s) beside the others (120 s), on a cache of their own: what they time under each
# other's load must not become the choices the whole-model lines below run.
cp $C/both.bin $C/tests.bin
gpu_test() {
    OPSCHED_CACHE=$C/tests.bin timeout 240 "$1" --ignored --test-threads 1 \
        --skip kernels_side_by_side --skip convolutions_in_nchw_and_in_nhwc \
        >"$C/${1##*/}.log" 2>&1
    echo $? >"$C/${1##*/}.rc"
}
step "tests (two lanes)"
for t in gpu-carry/tests/exec_plan-*; do gpu_test "$t"; done &
for t in gpu-carry/tests/*; do
    case "${t##*/}" in exec_plan-*) ;; *) gpu_test "$t" ;; esac
done
wait
for t in gpu-carry/tests/*; do
    step "$t"
    cat "$C/${t##*/}.log" >>"$L"
    result "test ${t##*/}: rc=$(cat "$C/${t##*/}.rc")"
done
# The NVRTC kernels side by side with their earlier versions (crates/gpu/src/cuda/nvrtc_ab.rs):
# the depthwise kernel against ea18c6e's, with and without an input bias, in both layouts,
# unrolled, tiled and (channels last) tiled by fours and twos, and NCHW against channels last;
# then NASNet's pooling sums, sums and biases into a concatenation one channel a thread against
# four or two (58 s on 2026-11-27d). 90 s: NVRTC compiles the whole source again for it.
step "kernel A/B"
timeout 90 gpu-carry/tests/opsched_gpu-* --ignored --nocapture kernels_side_by_side 2>&1 |
    tee -a "$L" | grep "kernel A/B" | tee -a "$R"

# Which fusion costs what channels last (2026-11-27d, three processes each: RandWire without
# sum-into-depthwise 0.910x, since left out by default; without bias-into-depthwise RandWire
# 1.051x, NASNet 0.968x). Each variant puts one fusion in (`with-sum`: `--fusion`) or leaves
# one out (`no-dw`); three processes each, alternating with the default, so a verdict of
# "faster" is one that held in every process (xtask/gpu/verdict.py).
# The plans of 2026-11-27c, so its lines compare kernels, not schedules: LIOS searched under the
# device file of then (the committed one is fitted to the channels-last kernels since), the
# Transformer's IOS plan as it ran (IOS prices a stage's fork and join since).
THEN="--device-file fixtures/gpu/h100-2026-11-22/device-h100.json"
IOS_THEN=fixtures/gpu/h100-2026-11-27c/schedules/transformer-ios.json
for i in 1 2 3; do
    run "after nhwc lios randwire process $i" 60 randwire --algo lios $THEN --repeats 100
    run "after nhwc with-sum lios randwire process $i" 60 randwire --algo lios $THEN \
        --repeats 100 --fusion sum-into-depthwise
    run "after nhwc no-dw lios randwire process $i" 60 randwire --algo lios $THEN \
        --repeats 100 --no-fusion bias-into-depthwise
    run "after nhwc lios nasnet process $i" 60 nasnet --algo lios $THEN --repeats 100
    run "after nhwc no-dw lios nasnet process $i" 60 nasnet --algo lios $THEN --repeats 100 \
        --no-fusion bias-into-depthwise
done
timeout 10 python3 xtask/gpu/verdict.py "$R" 2>>"$L" | sed 's/^/verdict /' | tee -a "$R" >/dev/null

# The Transformer's IOS plan (merged projections read in place, scores scaled by 1/8):
# checked, then timed in three processes (0.702 to 0.708 ms on 2026-11-27d).
run "check ios transformer" 60 transformer --schedule $IOS_THEN --check --repeats 20
for i in 1 2 3; do
    run "ios transformer process $i" 60 transformer --schedule $IOS_THEN --repeats 100
done
# compute-sanitizer on the Transformer's IOS plan at 32 tokens: scaled products read in place.
step "memcheck transformer"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 1 opsched run transformer \
    --input-size 32 --backend cuda --algo ios --warmup 1 --repeats 2 >>"$L" 2>&1
result "memcheck transformer: rc=$?"
save_cache
step done
