#!/usr/bin/env python3
"""PyTorch side of `cargo xtask bench-gpu`: in ONE process, for each model and batch, the latency
of PyTorch eager, of a captured CUDA graph replayed, and of torch.compile(mode="reduce-overhead")
with its compile time; random weights, eval mode, no grad, float32 inputs with TF32 math on (as
opsched runs by default). xtask runs this script in several processes and aggregates them.

Usage: torch_bench.py [--models inception_v3,googlenet,squeezenet,resnet50,nasnet,transformer]
                      [--batches 1,16] [--warmup 20] [--repeats 100] [--modes eager,cuda_graph,compile]
                      [--out results.json]

Writes (or prints) one JSON object, format "opsched-torch-bench" version 2:
  {"format", "version", "torch", "torchvision", "timm" (null when timm does not import), "cuda",
   "cudnn", "device", "allow_tf32": {"cudnn", "matmul"}, "compile": "<the settings>",
   "models": [{"model", "compared" (what PyTorch ran, null when skipped), "skipped" (why, or null)}],
   "results": [{"model", "batch", "mode": "eager"|"cuda_graph"|"compile", "median_ms", "p10_ms",
                "p90_ms", "samples", "compile_s" (compile mode only), "error" (null, or one line;
                the latency fields are then null)}]}
`xtask/gpu/torch_bench.sample.json` is a sample. Exit codes: 0 ok (failures of one model or mode
are in "error"), 2 bad arguments, 3 torch/torchvision or a CUDA device is missing (the message
says which). torch.compile's caches go where TORCHINDUCTOR_CACHE_DIR points (xtask gives every
run a fresh one, so the first process compiles cold and the later ones reuse it).

What PyTorch runs for each of our zoo models ("compared" in the output says it again):
  inception_v3 -> torchvision inception_v3(aux_logits=False, init_weights=False), 299x299
  googlenet    -> torchvision googlenet(aux_logits=False, init_weights=False), 224x224
  squeezenet   -> torchvision squeezenet1_0(), 224x224 (our zoo follows IOS's fire modules with bypasses)
  resnet50     -> torchvision resnet50(), 224x224
  nasnet       -> timm nasnetalarge, 331x331 (skipped when timm does not import)
  transformer  -> the BERT-base encoder below in plain PyTorch, the zoo's configuration
  randwire     -> none (ours only)
"""
import argparse
import json
import statistics
import sys
import time

MODES = ("eager", "cuda_graph", "compile")

# crates/graph/src/zoo/transformer.rs: 12 layers, hidden 768, 12 heads of 64, FFN 3072 with
# exact GELU, post-layer-norm (eps 1e-12), sequence 128, input [batch, 128, 768] (no embeddings).
BERT = {"layers": 12, "hidden": 768, "heads": 12, "ffn": 3072, "seq": 128, "eps": 1e-12}

COMPARED = {
    "inception_v3": "torchvision inception_v3 (no aux head), 299x299",
    "googlenet": "torchvision googlenet (no aux heads), 224x224",
    "squeezenet": "torchvision squeezenet1_0 (ours: IOS's fire modules with bypasses), 224x224",
    "resnet50": "torchvision resnet50, 224x224",
    "nasnet": "timm nasnetalarge, 331x331",
    "transformer": "BERT-base encoder in plain PyTorch: {layers} layers, hidden {hidden}, {heads} "
                   "heads, FFN {ffn}, GELU, post-LN, sequence {seq}, no embeddings".format(**BERT),
}


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


def bert_encoder(torch):
    nn, F = torch.nn, torch.nn.functional
    h, heads, ffn, eps = BERT["hidden"], BERT["heads"], BERT["ffn"], BERT["eps"]

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
            self.out = nn.Linear(h, h)
            self.norm1 = nn.LayerNorm(h, eps=eps)
            self.ffn1, self.ffn2 = nn.Linear(h, ffn), nn.Linear(ffn, h)
            self.norm2 = nn.LayerNorm(h, eps=eps)

        def forward(self, x):
            b, s, _ = x.shape

            def split(t):
                return t.view(b, s, heads, h // heads).transpose(1, 2)

            # The 1/sqrt(head size) scale is folded into q's weights, as in the zoo.
            q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
            probs = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
            ctx = (probs @ v).transpose(1, 2).reshape(b, s, h)
            x = self.norm1(self.out(ctx) + x)
            return self.norm2(self.ffn2(F.gelu(self.ffn1(x))) + x)

    return nn.Sequential(*[Layer() for _ in range(BERT["layers"])])


def build(name, torch, torchvision, timm):
    """(module, input shape without the batch) of our zoo model `name`."""
    m = torchvision.models
    if name == "inception_v3":
        return m.inception_v3(weights=None, aux_logits=False, init_weights=False), (3, 299, 299)
    if name == "googlenet":
        return m.googlenet(weights=None, aux_logits=False, init_weights=False), (3, 224, 224)
    if name == "squeezenet":
        return m.squeezenet1_0(weights=None), (3, 224, 224)
    if name == "resnet50":
        return m.resnet50(weights=None), (3, 224, 224)
    if name == "nasnet":
        return timm.create_model("nasnetalarge", pretrained=False), (3, 331, 331)
    if name == "transformer":
        return bert_encoder(torch), (BERT["seq"], BERT["hidden"])
    raise ValueError(name)


def skip_reason(name, timm, timm_error):
    if name == "randwire":
        return "ours only: no PyTorch counterpart"
    if name not in COMPARED:
        return "not a zoo model this script knows"
    if name == "nasnet" and timm is None:
        return f"timm does not import ({timm_error})"
    return None


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


def graph_replay(torch, model, x):
    """A captured CUDA graph of model(x), warmed up on a side stream as PyTorch's docs do."""
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
    return graph


def compiled_fn(torch, model, x):
    """torch.compile(mode="reduce-overhead") of model, called until its CUDA graphs are recorded;
    returns (the call, seconds that took: compile + recording)."""
    compiled = torch.compile(model, mode="reduce-overhead")

    def call():
        torch.compiler.cudagraph_mark_step_begin()
        compiled(x)

    t0 = time.perf_counter()
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    return call, time.perf_counter() - t0


def one_line(e):
    text = f"{type(e).__name__}: {e}".splitlines()
    return text[0][:300] if text else type(e).__name__


def measure(torch, name, model, shape, batch, mode, args):
    x = torch.randn(batch, *shape, device="cuda")
    if mode == "eager":
        return time_it(torch, lambda: model(x), args.warmup, args.repeats)
    if mode == "cuda_graph":
        graph = graph_replay(torch, model, x)
        try:
            return time_it(torch, graph.replay, args.warmup, args.repeats)
        finally:
            del graph
    call, compile_s = compiled_fn(torch, model, x)
    try:
        return {**time_it(torch, call, args.warmup, args.repeats), "compile_s": compile_s}
    finally:
        torch._dynamo.reset()


def parse_args(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="inception_v3,googlenet,squeezenet,resnet50,nasnet,transformer")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    try:
        args.batches = [int(b) for b in args.batches.split(",") if b]
    except ValueError:
        ap.error(f"--batches {args.batches!r}: expected comma-separated integers")
    args.modes = [m for m in args.modes.split(",") if m]
    for m in args.modes:
        if m not in MODES:
            ap.error(f"--modes: unknown mode {m!r} (expected {', '.join(MODES)})")
    if args.repeats < 1 or args.warmup < 0 or any(b < 1 for b in args.batches):
        ap.error("--repeats and every batch must be at least 1, --warmup at least 0")
    return args


def main(argv):
    args = parse_args(argv)
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
    try:
        import timm
        timm_error = None
    except Exception as e:  # timm's import can fail on version skew, not only ImportError
        timm, timm_error = None, one_line(e)
    # TF32 tensor cores in convolutions and matrix products, as opsched without --precise.
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    import torch._inductor.config as inductor_config
    inductor_config.freezing = True

    models, results = [], []
    with torch.no_grad():
        for name in args.models:
            reason = skip_reason(name, timm, timm_error)
            models.append({"model": name, "compared": None if reason else COMPARED[name],
                           "skipped": reason})
            if reason:
                continue
            try:
                model, shape = build(name, torch, torchvision, timm)
                model = model.to("cuda").eval()
            except Exception as e:
                models[-1]["skipped"] = f"building it failed: {one_line(e)}"
                continue
            for batch in args.batches:
                for mode in args.modes:
                    row = {"model": name, "batch": batch, "mode": mode}
                    try:
                        row.update(measure(torch, name, model, shape, batch, mode, args))
                        row["error"] = None
                        print(f"torch_bench: {name} b{batch} {mode}: {row['median_ms']:.3f} ms",
                              file=sys.stderr)
                    except Exception as e:
                        row.update({"median_ms": None, "p10_ms": None, "p90_ms": None,
                                    "samples": 0, "error": one_line(e)})
                        print(f"torch_bench: {name} b{batch} {mode} failed: {row['error']}",
                              file=sys.stderr)
                    results.append(row)
                    torch.cuda.empty_cache()
            del model
            torch.cuda.empty_cache()
    out = {
        "format": "opsched-torch-bench",
        "version": 2,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "timm": getattr(timm, "__version__", None),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "device": torch.cuda.get_device_name(0),
        "allow_tf32": {
            "cudnn": torch.backends.cudnn.allow_tf32,
            "matmul": torch.backends.cuda.matmul.allow_tf32,
        },
        "compile": "mode=reduce-overhead, inductor freezing on, cudnn.benchmark on",
        "models": models,
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
    sys.exit(main(sys.argv[1:]))
