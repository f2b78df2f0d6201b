#!/usr/bin/env bash
# Build, on this machine, everything a GPU session runs, into gpu-carry/ (ignored by git):
# the release `opsched` and `xtask` binaries and the GPU test binaries (the ignored tests that
# `cargo xtask gpu-test` runs). The GPU machine has no Rust toolchain: carry gpu-carry/ with
# the device tool (`carry: ["gpu-carry"]`) and source xtask/gpu/env.sh there first.
# With BEFORE=<revision>, that revision's release `opsched` too, as gpu-carry/opsched-before
# (built in a worktree under /tmp with a target directory of its own: a few minutes), which
# first-call.sh times beside this one's, processes alternating.
# See docs/gpu-session.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=gpu-carry
rm -rf "$out" && mkdir -p "$out/tests"
cargo build --release -p opsched-cli -p xtask
cp target/release/opsched target/release/xtask "$out/"
cargo test --release --no-run -p opsched-gpu -p opsched-runtime -p opsched-profiler -p opsched \
    --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])
' | while read -r bin; do
        # Only the binaries that hold ignored (GPU) tests travel.
        list=$("$bin" --ignored --list 2>/dev/null || true)
        if grep -q ': test$' <<<"$list"; then
            cp "$bin" "$out/tests/"
        fi
    done
# The test binaries find fixtures through this path, compiled in: env.sh links it on the device.
pwd > "$out/BUILD_ROOT"
if [ -n "${BEFORE:-}" ]; then
    wt=/tmp/opsched-before
    git worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
    git worktree prune
    git worktree add --detach "$wt" "$BEFORE"
    cargo build --release -p opsched-cli --manifest-path "$wt/Cargo.toml" \
        --target-dir /tmp/opsched-before-target
    cp /tmp/opsched-before-target/release/opsched "$out/opsched-before"
    git -C "$wt" rev-parse --short HEAD > "$out/BEFORE"
    git worktree remove --force "$wt"
fi
du -sh "$out"
