#!/usr/bin/env python3
"""The GPU kernels one inference runs, by name, for ours and for PyTorch on the same model: where
the time goes, to compare kernel by kernel what the whole-model latencies only sum up
(docs/gpu-session.md).

Usage:
  kernels.py ncu CSV [--runs N] [--top K] [--json OUT]
      Summarise `ncu --csv --page raw --print-units base --metrics gpu__time_duration.sum` of a
      program that ran the model N times (ours: `opsched run MODEL --warmup 0 --repeats 1` after
      a run that filled the cost cache, so no tuning kernel is in it: N = 1).
  kernels.py torch MODEL [--batch B] [--mode eager|compile] [--channels-last] [--runs N] [--top K]
                   [--json OUT]
      PyTorch's model of `torch_bench.py` (the same settings: TF32 on, cudnn.benchmark, inductor
      freezing; compile is mode "default", the kernels of "reduce-overhead" without its CUDA
      graphs, which hide their kernels from the profiler), warmed up, then N runs under
      torch.profiler. --channels-last runs a CNN in NHWC (model and input in
      torch.channels_last): what channels-last activations would buy our convolutions.

Prints one line per kernel name: GPU microseconds per run, launches per run, name (the longest
first, the first K), then the totals; --json writes {"format": "opsched-kernels", "version": 1,
"source", "runs", "kernels": [{"name", "us_per_run", "launches_per_run"}]} with every kernel.
Exit codes: 0 ok, 2 bad arguments or an unreadable CSV, 3 no torch or no GPU.
"""
import argparse
import csv
import json
import os
import sys

UNITS_NS = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9}


def parse_ncu(text, what):
    """{kernel name: (total ns, launches)} of ncu's raw CSV page (header row, units row, one
    row per kernel launch; ncu's own ==PROF== lines may be mixed in)."""
    rows = [r for r in csv.reader(l for l in text.splitlines() if l.startswith('"'))]
    header = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if header is None:
        raise ValueError(f"{what}: no ncu CSV header (a row with \"Kernel Name\")")
    names = rows[header]
    name_col = names.index("Kernel Name")
    try:
        time_col = names.index("gpu__time_duration.sum")
    except ValueError:
        raise ValueError(f"{what}: no gpu__time_duration.sum column (pass --metrics "
                         "gpu__time_duration.sum)") from None
    scale, out = 1.0, {}
    for line, r in enumerate(rows[header + 1:], start=header + 2):
        if len(r) <= max(name_col, time_col):
            continue
        cell = r[time_col].replace(",", "").strip()
        if not r[name_col]:  # the units row
            scale = UNITS_NS.get(cell, scale)
            continue
        try:
            ns = float(cell) * scale
        except ValueError:
            raise ValueError(f"{what}: row {line}: duration {r[time_col]!r} is not a number") \
                from None
        total, n = out.get(r[name_col], (0.0, 0))
        out[r[name_col]] = (total + ns, n + 1)
    if not out:
        raise ValueError(f"{what}: the CSV lists no kernel")
    return out


def table(kernels, runs):
    """Every kernel as a dict per run, the longest first."""
    rows = [{"name": k, "us_per_run": ns / 1e3 / runs, "launches_per_run": n / runs}
            for k, (ns, n) in kernels.items()]
    rows.sort(key=lambda r: (-r["us_per_run"], r["name"]))
    return rows


def report(rows, source, runs, top, json_out):
    total = sum(r["us_per_run"] for r in rows)
    launches = sum(r["launches_per_run"] for r in rows)
    print(f"# {source}: {runs} run(s); per run: {total:.1f} us of kernels, {launches:g} launches")
    print(f"{'us/run':>10} {'share':>6} {'launches':>8}  kernel")
    for r in rows[:top]:
        share = 100 * r["us_per_run"] / total if total else 0
        print(f"{r['us_per_run']:10.1f} {share:5.1f}% {r['launches_per_run']:8g}  "
              f"{r['name'][:160]}")
    if len(rows) > top:
        rest = rows[top:]
        print(f"{sum(r['us_per_run'] for r in rest):10.1f}        "
              f"{sum(r['launches_per_run'] for r in rest):8g}  ({len(rest)} more kernel names)")
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"format": "opsched-kernels", "version": 1, "source": source, "runs": runs,
                       "kernels": rows}, f, indent=1)
            f.write("\n")


def torch_kernels(args):
    try:
        import torch
        import torchvision
    except ImportError as e:
        print(f"kernels.py: PyTorch or torchvision is not installed: {e}", file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print("kernels.py: no CUDA device", file=sys.stderr)
        return None
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_bench
    try:
        import timm
    except Exception:
        timm = None
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    import torch._inductor.config as inductor_config
    inductor_config.freezing = True
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad():
        model, shape = torch_bench.build(args.model, torch, torchvision, timm)
        model = model.to("cuda").eval()
        x = torch.randn(args.batch, *shape, device="cuda")
        if args.channels_last:
            model = model.to(memory_format=torch.channels_last)
            x = x.to(memory_format=torch.channels_last)
        fn = torch.compile(model) if args.mode == "compile" else model
        for _ in range(5):
            fn(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.runs):
                fn(x)
            torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        # A kernel's time is its own (self) device time; the names changed across versions.
        times = [getattr(e, a, 0) or 0 for a in ("self_device_time_total", "device_time_total",
                                                 "self_cuda_time_total", "cuda_time_total")]
        us = max(times)
        if us <= 0:
            continue
        total, n = out.get(e.key, (0.0, 0))
        out[e.key] = (total + us * 1e3, n + e.count)
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("ncu")
    n.add_argument("csv")
    t = sub.add_parser("torch")
    t.add_argument("model")
    t.add_argument("--batch", type=int, default=1)
    t.add_argument("--mode", choices=("eager", "compile"), default="eager")
    t.add_argument("--channels-last", action="store_true")
    for p in (n, t):
        p.add_argument("--runs", type=int, default=None)
        p.add_argument("--top", type=int, default=25)
        p.add_argument("--json")
    args = ap.parse_args(argv)
    if args.runs is None:
        args.runs = 1 if args.cmd == "ncu" else 10
    if args.runs < 1 or args.top < 1:
        ap.error("--runs and --top must be at least 1")
    if args.cmd == "ncu":
        try:
            with open(args.csv) as f:
                kernels = parse_ncu(f.read(), args.csv)
        except (OSError, ValueError) as e:
            print(f"kernels.py: {e}", file=sys.stderr)
            return 2
        source = f"ncu {args.csv}"
    else:
        if args.batch < 1:
            ap.error("--batch must be at least 1")
        kernels = torch_kernels(args)
        if kernels is None:
            return 3
        layout = ", channels-last" if args.channels_last else ""
        source = f"PyTorch {args.model} batch {args.batch} {args.mode}{layout}"
    report(table(kernels, args.runs), source, args.runs, args.top, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
