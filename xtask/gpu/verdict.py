#!/usr/bin/env python3
"""What first-call.sh's whole-model lines say (docs/gpu-session.md, step 1): per model, batch,
layout and schedule, the median of each variant's processes and its ratio to this revision with
the default fusions (`after`), so that which fusion (or which binary) is slower reads off one table.

Usage:
  verdict.py RESULTS
      RESULTS: first-call.sh's results.txt. Its whole-model lines are
      `NAME: MEDIAN ms (p10 ..., p90 ...) ...` with NAME `[before REV|after|b16] LAYOUT
      [VARIANT] ALGO MODEL [process N]` (VARIANT: no-adds, no-dw, no-sum, no-act, no-pool,
      no-writers, no-bpool, no-bcat, none: left out; with-sum: put in);
      other lines, and failed runs, are skipped.

Prints one line per variant: the case (model, batch, layout, schedule), the variant, its
medians in each process, the median of them and its ratio to the default's (above 1: slower
than with the default fusions). A variant whose every process ran below 0.98 times the default's
fastest is marked "faster": the fusion it leaves out (puts in) costs (saves) that case time.
Exit codes: 0 ok, 2 an unreadable file.
"""
import re
import statistics
import sys

VARIANTS = {"no-adds", "no-dw", "no-sum", "no-act", "no-pool", "no-writers", "no-bpool", "no-bcat",
            "none", "with-sum"}
LINE = re.compile(r"^(?P<name>[^:]+): (?P<ms>[0-9.]+) ms ")


def parse(lines):
    """{(model, batch, layout, algo): {variant: [ms per process]}}."""
    cases = {}
    for line in lines:
        m = LINE.match(line.strip())
        if not m:
            continue
        words = m["name"].split()
        if len(words) > 2 and words[-2] == "process":
            words = words[:-2]
        batch = "1"
        if words[0] == "before" and len(words) > 1:
            variant, words = "before " + words[1], words[2:]
        elif words[0] == "after":
            variant, words = "after", words[1:]
        elif words[0] == "b16":
            variant, batch, words = "after", "16", words[1:]
        else:
            continue
        if len(words) < 3:
            continue
        layout, rest = words[0], words[1:]
        if rest[0] in VARIANTS:
            variant, rest = rest[0], rest[1:]
        if len(rest) != 2 or layout not in ("nchw", "nhwc"):
            continue
        algo, model = rest
        cases.setdefault((model, batch, layout, algo), {}).setdefault(variant, []).append(
            float(m["ms"]))
    return cases


def report(cases):
    out = []
    for (model, batch, layout, algo), variants in sorted(cases.items()):
        base = variants.get("after")
        for variant, ms in sorted(variants.items(), key=lambda kv: kv[0] != "after"):
            med = statistics.median(ms)
            line = "%s b%s %s %s %-15s %s -> %.4f ms" % (
                model, batch, layout, algo, variant, " ".join("%.4f" % v for v in ms), med)
            if base and variant != "after":
                ratio = med / statistics.median(base)
                line += ", %.3fx the default" % ratio
                if max(ms) < 0.98 * min(base):
                    line += " (faster)"
            out.append(line)
    return out


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        print("verdict.py: %s: %s" % (argv[1], e.strerror), file=sys.stderr)
        return 2
    for line in report(parse(lines)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
