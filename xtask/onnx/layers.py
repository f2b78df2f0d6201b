#!/usr/bin/env python3
"""Where a model's time goes against onnxruntime's, operator by operator, on the CPU: runs the
model with `opsched run --backend cpu --algo sequential --op-times` and with onnxruntime's
profiler (as many intra-op threads, one operator at a time), matches each of our steps to
onnxruntime's nodes (convolutions by their input and weight shapes, as onnxruntime renames
the ones it fuses; the others by node name), and prints the totals per kind of step, or with
FILTER every matched step of that kind: ours, onnxruntime's, the ratio and the shapes.

Needs onnx, onnxruntime and numpy; the input is an .npy file (survey.py's DIR/NAME.x.npy):
    cargo build --release
    /tmp/venv/bin/python xtask/onnx/layers.py MODEL.onnx X.npy THREADS [FILTER] [--json OUT]

Both sides' per-operator times include their profilers' overheads, and onnxruntime's fused
activations (a swish as `QuickGelu`) and layout reorders show as nodes of their own ("not
matched"): compare kinds of layers, not the totals, and alternate builds for what a change
buys.
"""

import collections
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import shape_inference

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BIN = os.environ.get("OPSCHED", os.path.join(ROOT, "target", "release", "opsched"))
REPEATS = int(os.environ.get("REPEATS", "30"))


def ort_times(model, x, threads):
    """Median milliseconds per onnxruntime node, each node's input shapes, its operator and
    the nodes in the order they ran."""
    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    o.inter_op_num_threads = 1
    o.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    o.enable_profiling = True
    o.profile_file_prefix = os.path.join(tempfile.gettempdir(), "opsched-layers")
    feeds = None
    for warm in (True, False):
        s = ort.InferenceSession(model, o, providers=["CPUExecutionProvider"])
        feeds = {s.get_inputs()[0].name: x}
        for _ in range(5 if warm else REPEATS):
            s.run(None, feeds)
        profile = s.end_profiling()
    events = json.load(open(profile))
    os.remove(profile)
    times, shapes, kinds, order = collections.defaultdict(list), {}, {}, []
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        n = e["name"][: -len("_kernel_time")]
        times[n].append(e["dur"] / 1000)
        args = e.get("args", {})
        kinds[n] = args.get("op_name", "?")
        shapes[n] = [list(v.values())[0] for v in args.get("input_type_shape", [])]
        if n not in order:
            order.append(n)
    return {n: float(np.median(v)) for n, v in times.items()}, shapes, kinds, order


def main():
    args = sys.argv[1:]
    out = None
    if "--json" in args:
        at = args.index("--json")
        out = args[at + 1]
        del args[at : at + 2]
    if len(args) < 3:
        sys.exit(__doc__)
    model, xin, threads = args[0], args[1], int(args[2])
    only = args[3] if len(args) > 3 else None
    x = np.load(xin)
    if x.dtype == np.float64:
        x = x.astype(np.float32)
    ort_ms, ort_shapes, kinds, order = ort_times(model, x, threads)

    # Our convolutions' input and weight shapes, by node name (from the model).
    graph = shape_inference.infer_shapes(onnx.load(model)).graph
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(graph.value_info) + list(graph.input)}
    dims.update({t.name: list(t.dims) for t in graph.initializer})
    nodes = {n.name: n for n in graph.node}

    # A convolution's key: its input's shape and its weights', channels counted in sixteens
    # (onnxruntime pads them to its blocks of 16: 8 outputs to 16, 104 channels to 112).
    def key(x_shape, w_shape):
        if len(x_shape) < 2 or len(w_shape) < 2:
            return None
        blocks = lambda c: -(-c // 16)
        return (x_shape[0], blocks(x_shape[1]), tuple(x_shape[2:]), blocks(w_shape[0]),
                blocks(w_shape[1]), tuple(w_shape[2:]))

    def key_of(name):
        n = nodes.get(name)
        if n is None or len(n.input) < 2:
            return None
        return key(dims.get(n.input[0], []), dims.get(n.input[1], []))

    convs = collections.defaultdict(list)
    for n in order:
        if kinds[n] in ("Conv", "FusedConv") and len(ort_shapes[n]) >= 2:
            convs[key(ort_shapes[n][0], ort_shapes[n][1])].append(n)

    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    run = subprocess.run(
        [BIN, "run", model, "--backend", "cpu", "--algo", "sequential", "--input", xin,
         "--op-times", "--json", "--warmup", "5", "--repeats", str(REPEATS)],
        capture_output=True, text=True, env=env, check=True)
    report = json.loads(run.stdout)

    used, rows = set(), []
    for step in report["op_times"]:
        ours = step["time"]["median_ms"]
        first = step["nodes"][0]
        queue = convs.get(key_of(first)) if step["op"] == "conv2d" else None
        matched = [queue.pop(0)] if queue else [n for n in step["nodes"] if n in ort_ms]
        used.update(matched)
        theirs = sum(ort_ms[n] for n in matched)
        shape = ort_shapes[matched[0]] if matched else []
        rows.append({"op": step["op"], "node": first, "ours_ms": ours, "ort_ms": theirs,
                     "shapes": shape})

    totals = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        if only and only not in r["op"]:
            continue
        t = totals[r["op"]]
        t[0] += r["ours_ms"]
        t[1] += r["ort_ms"]
        t[2] += 1
        if only:
            ratio = r["ours_ms"] / r["ort_ms"] if r["ort_ms"] else float("nan")
            print(f"{r['op']:11} {r['ours_ms']:7.3f} {r['ort_ms']:7.3f} {ratio:5.2f}  "
                  f"{r['node'][-40:]:40} {r['shapes']}")
    print(f"{'step':11} {'n':>3} {'ours ms':>8} {'ort ms':>8}")
    for op, (a, b, c) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
        print(f"{op:11} {c:3} {a:8.3f} {b:8.3f}")
    missed = collections.defaultdict(float)
    for n, v in ort_ms.items():
        if n not in used:
            missed[kinds[n]] += v
    print("onnxruntime's nodes not matched (ms):",
          {k: round(v, 3) for k, v in sorted(missed.items(), key=lambda kv: -kv[1])})
    print(f"latency: ours {report['latency']['median_ms']:.3f} ms (with --op-times)")
    if out:
        with open(out, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
