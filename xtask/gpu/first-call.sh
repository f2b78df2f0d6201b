#!/usr/bin/env bash
# The first device call of a GPU session (docs/gpu-session.md, step 1), about eight minutes on an
# H100: every GPU test, the changed NVRTC kernels against their last checked versions, cuDNN's
# convolutions in NCHW against NHWC, --check runs, compute-sanitizer on Inception-v3 at batch
# 2, the same plan in three processes, where the kernel time goes (ours under ncu, PyTorch's
# under its profiler, on the rows where torch.compile wins), and what the scoreboard lacks in
# one process each (NASNet, batch 16). Run on the device in the repository root, gpu-carry/
# carried:
#   bash xtask/gpu/first-call.sh
# Each step has its own time limit and the next runs whatever happened, so one failure costs
# one step. What comes back ($OUT, at most 8 files): log.txt (everything), results.txt (one
# line per step or process), kernels.txt (the kernel tables), kernels.tar.gz (the same as
# JSON) and cost-cache.bin (the measured cuDNN choices, to carry in later calls). Caches are
# kept outside $OUT while running: their lock files would take places among the 8.
set -u
source xtask/gpu/env.sh
L=$OUT/log.txt R=$OUT/results.txt K=$OUT/kernels.txt C=/tmp/opsched-caches
mkdir -p $C/kernels
step() { echo "=== $(date +%T) $*" >>"$L"; }
result() { echo "$*" | tee -a "$R"; }
# One process's JSON report as one line: median latency, launches, merged convolutions,
# strided concatenation slices, peak memory, cuDNN kernels.
lat() {
    python3 -c 'import json,sys
try:
    r = json.load(sys.stdin)
except ValueError:
    print("failed (log.txt)"); sys.exit()
l = r["latency"]
print("%.4f ms (p10 %.4f p90 %.4f) launches %s kernels %s merged %s strided %s peak %s conv %s gemm %s layout %s/%s" % (
      l["median_ms"], l["p10_ms"], l["p90_ms"], r.get("launches"), r.get("kernels"),
      r.get("merged_convolutions"), r.get("strided_views"), r.get("peak_memory_bytes"),
      r.get("conv_kernels"), r.get("gemm_kernels"), r.get("layout"), r.get("layout_conversions")))'
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$L"

# The committed cache of the last session: its kernels again, and only new shapes are timed
# (by the first process that meets them; the later ones must run the same kernels).
cp fixtures/gpu/h100-2026-11-26/cost-cache.bin $C/both.bin
export OPSCHED_CACHE=$C/both.bin
# (The two A/B tests run in their own steps below.)
for t in gpu-carry/tests/*; do
    step "$t"
    timeout 150 "$t" --ignored --test-threads 1 --skip kernels_side_by_side \
        --skip convolutions_in_nchw_and_in_nhwc >>"$L" 2>&1
    result "test ${t##*/}: rc=$?"
done
# The NVRTC kernels changed since the last GPU checked them, side by side with those versions
# (outputs compared, GPU times and ratios: crates/gpu/src/cuda/nvrtc_ab.rs).
step "kernel A/B"
timeout 60 gpu-carry/tests/opsched_gpu-* --ignored --nocapture kernels_side_by_side 2>&1 |
    tee -a "$L" | grep "kernel A/B" | tee -a "$R"
# cuDNN's convolutions of ResNet-50 and Inception-v3 in NCHW against NHWC, b1 and b16: what
# channels-last activations would buy (crates/gpu/src/cuda/layout_ab.rs).
step "layout A/B"
timeout 120 gpu-carry/tests/opsched_gpu-* --ignored --nocapture convolutions_in_nchw_and_in_nhwc \
    2>&1 | tee -a "$L" | grep "layout A/B" | tee -a "$R"
for m in transformer inception_v3; do
    step "check $m"
    timeout 90 opsched run $m --backend cuda --algo lios --graph-capture --check >>"$L" 2>&1
    result "check $m: rc=$?"
done
# At batch 2: the strided concatenation slices (new since the last GPU) are written there.
for m in inception_v3; do
    step "memcheck $m b2"
    timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 opsched run $m --batch 2 \
        --backend cuda --algo lios --warmup 1 --repeats 2 >>"$L" 2>&1
    result "memcheck $m b2: rc=$?"
done
for m in inception_v3 resnet50 nasnet; do
    for a in sequential lios; do
        for i in 1 2 3; do
            step "$a $m $i"
            result "$a $m process $i: $(timeout 90 opsched run $m --backend cuda --algo $a \
                --graph-capture --repeats 100 --json 2>>"$L" | lat)"
        done
    done
done
# IOS with its merged stages run as one convolution each (since 2026-11-26; the scoreboard's
# ios column ran them one after another): squeezenet 0.308, googlenet 0.459, inception_v3
# 0.975 ms then.
for m in squeezenet googlenet inception_v3; do
    for i in 1 2 3; do
        step "ios $m $i"
        result "ios $m process $i: $(timeout 90 opsched run $m --backend cuda --algo ios \
            --graph-capture --repeats 100 --json 2>>"$L" | lat)"
    done
done
# Batch 16, one process each: the rows the scoreboard lacks (and googlenet: its strided
# concatenation slices against the scoreboard's row).
for m in inception_v3 googlenet squeezenet resnet50 nasnet transformer; do
    for a in sequential lios; do
        step "b16 $a $m"
        result "b16 $a $m: $(timeout 90 opsched run $m --batch 16 --backend cuda --algo $a \
            --graph-capture --repeats 50 --json 2>>"$L" | lat)"
    done
done

# IOS at batch 16, its merged stages run as one convolution since the fourth session of
# 2026-11-26 (before: one convolution after another at a batch above 1), one process each.
for m in squeezenet googlenet inception_v3; do
    step "b16 ios $m"
    result "b16 ios $m: $(timeout 90 opsched run $m --batch 16 --backend cuda --algo ios \
        --graph-capture --repeats 50 --json 2>>"$L" | lat)"
done

# Channels-last activations (--layout nhwc, new in the fourth session of 2026-11-26) against
# NCHW (the lines above): ResNet-50 in three processes at batch 1; ResNet-50, Inception-v3 and
# GoogLeNet at batch 16, one process each.
for i in 1 2 3; do
    step "nhwc resnet50 $i"
    result "nhwc sequential resnet50 process $i: $(timeout 90 opsched run resnet50 --backend cuda \
        --algo sequential --layout nhwc --graph-capture --repeats 100 --json 2>>"$L" | lat)"
done
# NASNet channels last (since the fifth session: its separable convolutions run
# depthwise_conv_nhwc, its cells' sums write their slices a run per pixel) against the lios
# lines above, one process.
step "nhwc lios nasnet"
result "nhwc lios nasnet: $(timeout 60 opsched run nasnet --backend cuda --algo lios \
    --layout nhwc --graph-capture --repeats 100 --json 2>>"$L" | lat)"
# IOS channels last (since the fifth session its merged stages run as one convolution in
# this layout too) against the three `ios inception_v3` lines above, one process.
step "nhwc ios inception_v3"
result "nhwc ios inception_v3: $(timeout 60 opsched run inception_v3 --backend cuda --algo ios \
    --layout nhwc --graph-capture --repeats 100 --json 2>>"$L" | lat)"
for m in resnet50 inception_v3 googlenet; do
    for a in sequential lios; do
        step "b16 nhwc $a $m"
        result "b16 nhwc $a $m: $(timeout 90 opsched run $m --batch 16 --backend cuda \
            --algo $a --layout nhwc --graph-capture --repeats 50 --json 2>>"$L" | lat)"
    done
done

# The matrix products' measured choice against the unmeasured one (cuBLAS's own choice,
# cuBLASLt's first configuration with an epilogue), one process each, side by side.
for b in 1 16; do
    for gemm in measured heuristic; do
        step "gemm $gemm transformer b$b"
        result "b$b sequential transformer --gemm $gemm: $(timeout 90 opsched run transformer \
            --batch $b --backend cuda --algo sequential --gemm $gemm --graph-capture \
            --repeats 50 --json 2>>"$L" | lat)"
    done
done

# Where the time goes, kernel by kernel, on the rows torch.compile wins: our sequential plan
# under ncu (one eager run; the cache already holds its kernel choices, so nothing is tuned),
# PyTorch eager and compiled under its profiler.
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
for mb in resnet50:1 transformer:16; do
    m=${mb%:*} b=${mb#*:}
    step "kernels $m b$b"
    timeout 60 opsched run $m --batch $b --backend cuda --algo sequential --warmup 1 \
        --repeats 1 >>"$L" 2>&1
    timeout 90 "${NCU:-ncu}" --clock-control none --csv --page raw --print-units base \
        --metrics gpu__time_duration.sum --log-file $C/kernels/ours-$m-b$b.csv \
        opsched run $m --batch $b --backend cuda --algo sequential --warmup 0 --repeats 1 \
        >>"$L" 2>&1
    timeout 30 python3 xtask/gpu/kernels.py ncu $C/kernels/ours-$m-b$b.csv \
        --json $C/kernels/ours-$m-b$b.json >>"$K" 2>>"$L"
    result "kernels ours $m b$b: rc=$?"
    # The same by operator (our profiler: each distinct operator alone, graph replays).
    echo "# opsched profile $m --batch $b (ms per operator, distinct operators)" >>"$K"
    timeout 60 opsched profile $m --batch $b --backend cuda --stages-from none --repeats 20 \
        --cache $C/profile.bin >>"$K" 2>>"$L"
    result "profile ours $m b$b: rc=$?"
    for mode in eager compile; do
        timeout 120 python3 xtask/gpu/kernels.py torch $m --batch $b --mode $mode \
            --json $C/kernels/torch-$mode-$m-b$b.json >>"$K" 2>>"$L"
        result "kernels torch $mode $m b$b: rc=$?"
    done
done
# PyTorch's CNN in NHWC, eager: what channels-last activations would change in cuDNN's kernels.
timeout 60 python3 xtask/gpu/kernels.py torch resnet50 --channels-last \
    --json $C/kernels/torch-eager-nhwc-resnet50-b1.json >>"$K" 2>>"$L"
result "kernels torch eager channels-last resnet50 b1: rc=$?"
tar -C $C -czf "$OUT/kernels.tar.gz" kernels 2>>"$L"

step torch
timeout 150 python3 xtask/gpu/torch_bench.py --models nasnet,squeezenet --batches 1,16 \
    --modes eager,cuda_graph --out $C/torch.json >>"$L" 2>&1
python3 -c 'import json,sys
for r in json.load(open(sys.argv[1]))["results"]:
    print("torch", r["model"], "b%d" % r["batch"], r["mode"], r["median_ms"], r["error"] or "")' \
    $C/torch.json 2>>"$L" | tee -a "$R"
cp $C/both.bin "$OUT/cost-cache.bin" 2>>"$L"
step done
