#!/usr/bin/env bash
# The first device call of a GPU session (docs/gpu-session.md, step 1), about four minutes on an
# H100: what the backend engines offer, every GPU test, --check runs, the convolution kernel
# sets compared in three processes each, LIOS in three processes, batch 16 in one, PyTorch eager
# and CUDA graph at batch 1 and 16, and compute-sanitizer on one model. Run on the device in the
# repository root, gpu-carry/ carried:
#   bash xtask/gpu/first-call.sh
# Each step has its own time limit and the next runs whatever happened, so one failure costs
# one step. What comes back ($OUT, at most 8 files): log.txt (everything), results.txt (one
# line per step or process), engines.txt (the engine debug log) and cost-cache.bin (the
# measured cuDNN choices of `--conv-api both`, to carry in later calls). Caches are kept
# outside $OUT while running: their lock files would take places among the 8.
set -u
source xtask/gpu/env.sh
L=$OUT/log.txt R=$OUT/results.txt C=/tmp/opsched-caches
mkdir -p $C
step() { echo "=== $(date +%T) $*" >>"$L"; }
result() { echo "$*" | tee -a "$R"; }
# One process's JSON report as one line: median latency, launches, peak memory, cuDNN kernels.
lat() {
    python3 -c 'import json,sys
try:
    r = json.load(sys.stdin)
except ValueError:
    print("failed (log.txt)"); sys.exit()
l = r["latency"]
print("%.4f ms (p10 %.4f p90 %.4f) launches %s peak %s conv %s" % (l["median_ms"], l["p10_ms"],
      l["p90_ms"], r.get("launches"), r.get("peak_memory_bytes"), r.get("conv_kernels")))'
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$L"

step engines
OPSCHED_CACHE=$C/engines.bin RUST_LOG=opsched_gpu=debug timeout 60 opsched run squeezenet \
    --backend cuda --algo sequential --conv-api backend --repeats 3 2>&1 |
    sed 's/\x1b\[[0-9;]*m//g' | grep -E 'engine|heuristics|kernels measured|error' |
    head -c 2000000 >"$OUT/engines.txt"
result "engines: $(grep -c 'a candidate' "$OUT/engines.txt") candidate configurations," \
    "$(grep -c 'not admissible' "$OUT/engines.txt") not admissible (engines.txt)"

export OPSCHED_CACHE=$C/both.bin
for t in gpu-carry/tests/*; do
    step "$t"
    timeout 150 "$t" --ignored --test-threads 1 >>"$L" 2>&1
    rc=$?
    result "test ${t##*/}: rc=$rc"
done
for m in transformer inception_v3; do
    step "check $m"
    timeout 90 opsched run $m --backend cuda --algo lios --graph-capture --check >>"$L" 2>&1
    result "check $m: rc=$?"
done

# Step 1b: the same sequential plan with each set of convolution kernels, a fresh cache per
# set: cuDNN's legacy algorithms and engines together and alone, and with cuBLAS's product
# as a candidate for 1x1 convolutions.
for set in "both:--conv-api both" "legacy:--conv-api legacy" "backend:--conv-api backend" \
    "gemm:--conv-api both --conv-gemm timed"; do
    name=${set%%:*} flags=${set#*:}
    for m in inception_v3 resnet50; do
        for i in 1 2 3; do
            step "1b $name $m $i"
            # shellcheck disable=SC2086 # the flags are words
            result "1b $name $m sequential process $i: $(OPSCHED_CACHE=$C/$name.bin timeout 90 \
                opsched run $m --backend cuda --algo sequential --graph-capture $flags \
                --repeats 100 --json 2>>"$L" | lat)"
        done
    done
done
for m in inception_v3 googlenet transformer resnet50; do
    for i in 1 2 3; do
        step "lios $m $i"
        result "lios $m process $i: $(timeout 90 opsched run $m --backend cuda --algo lios \
            --graph-capture --repeats 100 --json 2>>"$L" | lat)"
    done
done
# Batch 16, one process each: where the kernels, not the launches, decide.
for m in inception_v3 resnet50 transformer; do
    for a in sequential lios; do
        step "b16 $a $m"
        result "b16 $a $m: $(timeout 90 opsched run $m --batch 16 --backend cuda --algo $a \
            --graph-capture --repeats 50 --json 2>>"$L" | lat)"
    done
done

step torch
timeout 180 python3 xtask/gpu/torch_bench.py --models inception_v3,resnet50,googlenet,transformer \
    --batches 1,16 --modes eager,cuda_graph --out $C/torch.json >>"$L" 2>&1
python3 -c 'import json,sys
for r in json.load(open(sys.argv[1]))["results"]:
    print("torch", r["model"], "b%d" % r["batch"], r["mode"], r["median_ms"], r["error"] or "")' \
    $C/torch.json 2>>"$L" | tee -a "$R"

step memcheck
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 1 opsched run googlenet \
    --backend cuda --algo lios --warmup 1 --repeats 2 >>"$L" 2>&1
result "memcheck googlenet: rc=$?"
cp $C/both.bin "$OUT/cost-cache.bin" 2>>"$L"
step done
