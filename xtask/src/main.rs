//! `cargo xtask <command>`: project automation (rust-analyzer's convention).
//!
//! Commands:
//! - `ci`: what `.ci/run` runs: fmt check, clippy with warnings denied, the test suite, and
//!   `bench-models --quick --check`.
//! - `hios-sim [--quick] [--instances N] [--ios-part N] [--out DIR]`: the HIOS paper's simulation study.
//! - `bench-models [--quick] [--check | --write-baseline] ...`: every scheduler on every zoo
//!   model, tables and charts under `target/bench`, regression check against
//!   `fixtures/bench-baseline.json` (`--help` for the options).
//! - `gpu-test`, `profile [MODEL ...]`, `bench-gpu`: the GPU-only parts (need a CUDA GPU; see
//!   `gpu_test.rs` and `bench_gpu.rs`).
//! - `calibrate --fit MEASUREMENTS [--out FILE]`: fit a device file to GPU measurements
//!   (measuring, without `--fit`, needs the GPU runtime and is not built yet).
//! - `fidelity [--measurements FILE] [--json]`: the simulator's predictions against committed
//!   GPU measurements.

mod bench_gpu;
mod bench_models;
mod calibrate;
mod fidelity;
mod gpu_test;
mod hios_sim;
mod plot;
mod progress;

use std::process::Command;

use anyhow::{bail, Context, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("hios-sim") => hios_sim::run(&args[1..]),
        Some("bench-models") => bench_models::run(&args[1..]),
        Some("gpu-test") => gpu_test::gpu_test(&args[1..]),
        Some("profile") => gpu_test::profile(&args[1..]),
        Some("bench-gpu") => bench_gpu::bench_gpu(&args[1..]),
        Some("calibrate") => calibrate::run(&args[1..]),
        Some("fidelity") => fidelity::run(&args[1..]),
        Some(other) => bail!(
            "unknown xtask command '{other}'; known: ci, hios-sim, bench-models, gpu-test, profile, bench-gpu, calibrate, fidelity"
        ),
        None => {
            eprintln!("usage: cargo xtask <ci | hios-sim [--quick] [--instances N] [--out DIR] | bench-models [--quick] [--check] [--help] | gpu-test | profile [MODEL ...] | bench-gpu | calibrate --fit FILE | fidelity [--json]>");
            Ok(())
        }
    }
}

/// In a debug build, run `cargo xtask <command> <args>` again as a release build and say so
/// (true: the caller is done); false in the release run itself. For commands whose work (the
/// simulator, the schedulers) is slow or timed in a debug build.
pub fn rerun_in_release(command: &str, args: &[String]) -> Result<bool> {
    if !cfg!(debug_assertions) || std::env::var_os("OPSCHED_XTASK_RELEASE").is_some() {
        return Ok(false);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(["run", "--release", "--quiet", "--package", "xtask", "--"])
        .arg(command)
        .args(args)
        .env("OPSCHED_XTASK_RELEASE", "1")
        .status()
        .with_context(|| format!("running {cargo} run --release -p xtask"))?;
    if !status.success() {
        bail!("{command} failed");
    }
    Ok(true)
}

fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(args)
        .status()
        .with_context(|| format!("running {cargo} {}", args.join(" ")))?;
    if !status.success() {
        bail!("`cargo {}` failed", args.join(" "));
    }
    Ok(())
}

fn ci() -> Result<()> {
    cargo(&["fmt", "--all", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    cargo(&["test", "--workspace"])?;
    // Schedule quality and scheduling time of the CI subset against the committed baseline.
    bench_models::run(&["--quick".to_string(), "--check".to_string()])
}
