//! `cargo xtask <command>`: project automation (rust-analyzer's convention).
//!
//! The commands are the variants of [`Cmd`] (clap derive): `ci` (what `.ci/run` runs),
//! `hios-sim`, `bench-models`, `calibrate` (fit a device file to GPU measurements), `fidelity`
//! (the simulator against committed measurements), `bench-cpu` (the CPU backend against
//! onnxruntime), and the GPU-only `gpu-test`, `profile` and `bench-gpu`.
//! `cargo xtask --help` lists them and `cargo xtask <command> --help` gives each one's options;
//! `--help` only prints.

mod bench_cpu;
mod bench_gpu;
mod bench_models;
mod calibrate;
mod fidelity;
mod gpu_test;
mod hios_sim;
mod plot;
mod progress;

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Project automation: CI, benchmarks, the HIOS study and the GPU-only parts",
    after_help = "`cargo xtask <COMMAND> --help` says more about one command."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Cmd,
}

/// Every xtask command: one variant each, so a new command is one variant and one match arm.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// What `.ci/run` runs: fmt check, clippy with warnings denied, the tests and
    /// `bench-models --quick --check`, each under a `==> step` header, with a timing summary.
    Ci,
    /// The HIOS paper's simulation study (Figs. 7-11): CSV, SVG plots and a table.
    HiosSim(hios_sim::Args),
    /// Every scheduler on every zoo model: tables, charts and a regression check.
    BenchModels(bench_models::Args),
    /// Run the ignored GPU tests of the GPU crates (needs a CUDA GPU).
    GpuTest(gpu_test::GpuTestArgs),
    /// Measure models' operators and stages on this GPU into the cost cache (needs a CUDA GPU).
    Profile(gpu_test::ProfileArgs),
    /// The GPU scoreboard: our schedules as CUDA graphs in separate processes against PyTorch
    /// eager, CUDA graph and torch.compile on this GPU (needs a CUDA GPU, or --backend cpu).
    BenchGpu(bench_gpu::Args),
    /// Our CPU backend against onnxruntime on this machine with the same threads, per model.
    BenchCpu(bench_cpu::Args),
    /// Fit a device file (`fixtures/devices/<preset>.json`) to GPU measurements.
    Calibrate(calibrate::Args),
    /// The simulator's predictions against committed GPU measurements.
    Fidelity(fidelity::Args),
}

/// The current command's flags as given, for commands that re-run themselves in release.
fn flags() -> Vec<String> {
    std::env::args().skip(2).collect()
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Ci => ci(),
        Cmd::HiosSim(a) => hios_sim::run(&a),
        // Its flags as given, for re-running itself in release.
        Cmd::BenchModels(a) => bench_models::run(&a, &flags()),
        Cmd::GpuTest(a) => gpu_test::gpu_test(&a),
        Cmd::Profile(a) => gpu_test::profile(&a),
        Cmd::BenchGpu(a) => bench_gpu::bench_gpu(&a, &flags()),
        Cmd::BenchCpu(a) => bench_cpu::run(&a, &flags()),
        Cmd::Calibrate(a) => calibrate::run(&a, &flags()),
        Cmd::Fidelity(a) => fidelity::run(&a, &flags()),
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

/// The models a command was given, or every zoo model when none.
pub fn models_or_zoo(given: &[String]) -> Vec<String> {
    if given.is_empty() {
        opsched::zoo::models()
            .iter()
            .map(|m| m.name.to_string())
            .collect()
    } else {
        given.to_vec()
    }
}

fn cargo(args: &[&str]) -> Result<()> {
    cargo_with(args, &[])
}

/// [`cargo`] with these environment variables set.
fn cargo_with(args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(args)
        // These builds are one-shot (CI, the GPU tests): incremental caches would only take disk.
        .env("CARGO_INCREMENTAL", "0")
        .envs(env.iter().copied())
        .status()
        .with_context(|| format!("running {cargo} {}", args.join(" ")))?;
    if !status.success() {
        bail!("`cargo {}` failed", args.join(" "));
    }
    Ok(())
}

fn ci() -> Result<()> {
    let bench_flags = ["--quick".to_string(), "--check".to_string()];
    let steps: [(&str, &dyn Fn() -> Result<()>); 5] = [
        ("fmt", &|| cargo(&["fmt", "--all", "--check"])),
        ("clippy", &|| {
            cargo(&[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ])
        }),
        ("test", &|| cargo(&["test", "--workspace"])),
        // The crate docs build without a broken or ambiguous link.
        ("doc", &|| {
            cargo_with(
                &["doc", "--workspace", "--no-deps"],
                &[("RUSTDOCFLAGS", "-D warnings")],
            )
        }),
        // Schedule quality and scheduling time of the CI subset against the committed baseline.
        ("bench-models --quick --check", &|| {
            let args = bench_models::Args::from_flags(&bench_flags)?;
            bench_models::run(&args, &bench_flags)
        }),
    ];
    let mut done: Vec<(&str, Duration)> = Vec::new();
    for (name, step) in steps {
        eprintln!("==> {name}");
        let start = Instant::now();
        let result = step();
        done.push((name, start.elapsed()));
        if let Err(e) = result {
            print_timings(&done, "failed");
            return Err(e.context(format!("CI step '{name}' failed")));
        }
    }
    print_timings(&done, "passed");
    Ok(())
}

/// The summary at the end of CI: each step's wall time and the total.
fn print_timings(done: &[(&str, Duration)], outcome: &str) {
    eprintln!("==> CI {outcome}");
    let width = done.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    for (name, t) in done {
        eprintln!("    {name:<width$}  {}", minutes(*t));
    }
    let total: Duration = done.iter().map(|(_, t)| *t).sum();
    eprintln!("    {:<width$}  {}", "total", minutes(total));
}

/// "1m05s", "42.3s".
fn minutes(t: Duration) -> String {
    let s = t.as_secs_f64();
    if s < 60.0 {
        format!("{s:.1}s")
    } else {
        format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// `--help` on every command is clap's help, which prints and exits: it never reaches the
    /// command (CI, a GPU check, a release build).
    #[test]
    fn every_command_answers_help_and_does_nothing_else() {
        let names: Vec<String> = Cli::command()
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect();
        assert!(names.len() >= 6, "{names:?}");
        for name in [
            "ci",
            "hios-sim",
            "bench-models",
            "gpu-test",
            "profile",
            "bench-gpu",
        ] {
            assert!(
                names.iter().any(|n| n == name),
                "{name} missing from {names:?}"
            );
        }
        for name in names.iter().map(String::as_str).chain([""]) {
            let argv = ["xtask", name, "--help"]
                .into_iter()
                .filter(|a| !a.is_empty());
            let err = Cli::try_parse_from(argv).expect_err(name);
            assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp, "{name}");
            assert_eq!(err.exit_code(), 0, "{name}");
        }
    }

    #[test]
    fn ci_runs_the_checked_bench_subset() {
        let a = bench_models::Args::from_flags(&["--quick".into(), "--check".into()])
            .expect("CI's bench flags parse");
        assert!(a.quick && a.check && !a.write_baseline);
        assert!(
            bench_models::Args::from_flags(&["--check".into(), "--write-baseline".into()]).is_err()
        );
    }
}
