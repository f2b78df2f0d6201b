#!/usr/bin/env python3
"""onnxruntime's side of `cargo xtask bench-cpu`: run one model on the CPU with a given number
of threads, time it, and keep its outputs for the accuracy check.

    python3 xtask/cpu/ort_bench.py --model M.onnx --inputs IN.npz --threads N \
        --warmup W --repeats R --out OUT.npz

Reads the inputs by graph input name from IN.npz, runs W untimed and R timed inferences with
`intra_op_num_threads = N` and sequential execution (one operator at a time, each using N
threads: the same thread budget as ours), writes the outputs by name to OUT.npz and prints one
JSON line: {"onnxruntime": version, "median_ms": ..., "p10_ms": ..., "p90_ms": ...}.
Exit status 3 when onnxruntime or numpy is not installed (the caller leaves its columns empty).
"""

import argparse
import json
import sys
import time

try:
    import numpy as np
    import onnxruntime as ort
except ImportError as e:
    print(f"ort_bench: {e}", file=sys.stderr)
    sys.exit(3)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = a.threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(a.model, opts, providers=["CPUExecutionProvider"])
    with np.load(a.inputs) as z:
        feeds = {i.name: z[i.name].astype(np.float32) for i in sess.get_inputs()}
    for _ in range(a.warmup):
        sess.run(None, feeds)
    times = []
    for _ in range(a.repeats):
        t = time.perf_counter()
        outs = sess.run(None, feeds)
        times.append((time.perf_counter() - t) * 1e3)
    if a.repeats == 0:
        outs = sess.run(None, feeds)
    names = [o.name for o in sess.get_outputs()]
    np.savez(a.out, **{n: np.asarray(v, dtype=np.float32) for n, v in zip(names, outs)})
    t = np.array(times if times else [float("nan")])
    print(
        json.dumps(
            {
                "onnxruntime": ort.__version__,
                "median_ms": float(np.median(t)),
                "p10_ms": float(np.percentile(t, 10)),
                "p90_ms": float(np.percentile(t, 90)),
            }
        )
    )


if __name__ == "__main__":
    main()
