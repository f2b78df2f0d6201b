#!/usr/bin/env python3
"""PyTorch baselines for `cargo xtask bench-gpu`: eager and CUDA-graph replay latency of the
torchvision architectures of our zoo models, random weights, eval mode, no grad, float32.

Usage: torch_bench.py [--models inception_v3,googlenet,squeezenet,resnet50] [--batches 1,16]
                      [--warmup 20] [--repeats 100] [--out results.json]

Prints (or writes) one JSON object: {"torch": ..., "cuda": ..., "cudnn": ..., "device": ...,
"allow_tf32": {...}, "results": [{"model", "batch", "mode": "eager"|"cuda_graph",
"median_ms", "p10_ms", "p90_ms", "samples"}]}. Exit codes: 0 ok, 3 torch/torchvision or a
CUDA device is missing (the message says which).

Model mapping (torchvision; our zoo differs where noted in fixtures/gpu/README.md):
  inception_v3 -> inception_v3(aux_logits=False, init_weights=False), 299x299
  googlenet    -> googlenet(aux_logits=False, init_weights=False), 224x224
  squeezenet   -> squeezenet1_0(), 224x224 (our zoo follows IOS's fire modules with bypasses)
  resnet50     -> resnet50(), 224x224
"""
import argparse
import json
import statistics
import sys


def percentile(sorted_values, q):
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(times):
    s = sorted(times)
    return {
        "median_ms": statistics.median(s),
        "p10_ms": percentile(s, 0.1),
        "p90_ms": percentile(s, 0.9),
        "samples": len(s),
    }


def build(torchvision, name):
    m = torchvision.models
    if name == "inception_v3":
        return m.inception_v3(weights=None, aux_logits=False, init_weights=False), 299
    if name == "googlenet":
        return m.googlenet(weights=None, aux_logits=False, init_weights=False), 224
    if name == "squeezenet":
        return m.squeezenet1_0(weights=None), 224
    if name == "resnet50":
        return m.resnet50(weights=None), 224
    raise SystemExit(f"unknown model {name}")


def time_it(torch, fn, warmup, repeats):
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return summarize(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="inception_v3,googlenet,squeezenet,resnet50")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--out")
    args = ap.parse_args()
    try:
        import torch
        import torchvision
    except ImportError as e:
        print(f"torch_bench: PyTorch or torchvision is not installed: {e}", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("torch_bench: torch.cuda.is_available() is False (no GPU or a CPU-only torch)",
              file=sys.stderr)
        return 3
    dev = torch.device("cuda")
    results = []
    with torch.no_grad():
        for name in args.models.split(","):
            model, size = build(torchvision, name)
            model = model.to(dev).eval()
            for batch in [int(b) for b in args.batches.split(",")]:
                x = torch.randn(batch, 3, size, size, device=dev)
                eager = time_it(torch, lambda: model(x), args.warmup, args.repeats)
                results.append({"model": name, "batch": batch, "mode": "eager", **eager})
                # CUDA graph: warm up on a side stream, capture once, replay.
                static_x = x.clone()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        model(static_x)
                torch.cuda.current_stream().wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    model(static_x)
                replay = time_it(torch, graph.replay, args.warmup, args.repeats)
                results.append({"model": name, "batch": batch, "mode": "cuda_graph", **replay})
                print(f"torch_bench: {name} b{batch}: eager {eager['median_ms']:.3f} ms, "
                      f"graph {replay['median_ms']:.3f} ms", file=sys.stderr)
                del graph
    out = {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "device": torch.cuda.get_device_name(0),
        "allow_tf32": {
            "cudnn": torch.backends.cudnn.allow_tf32,
            "matmul": torch.backends.cuda.matmul.allow_tf32,
        },
        "results": results,
    }
    text = json.dumps(out, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
