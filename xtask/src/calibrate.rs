//! `cargo xtask calibrate`: measure a GPU (not built yet) or fit a device file to measurements.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use opsched::calibrate::{fit, Params};
use opsched::cost::calibration::{DeviceFile, Provenance};
use opsched::cost::measurements::Measurements;

#[derive(Parser, Debug)]
#[command(
    name = "cargo xtask calibrate",
    about = "Fit a device file (fixtures/devices/<preset>.json) to GPU measurements",
    after_help = "Without --fit, calibrate measures the GPU it runs on (overheads, contention \
samples, per-operator times, every model x algorithm x batch) into a measurement file; that half \
needs the GPU runtime and is being built. With --fit it reads such a file (the format is in \
crates/cost/src/measurements.rs) and writes the device file the h100 preset loads.\n\n\
Examples:\n  cargo xtask calibrate --fit fixtures/gpu/h100-2026-11-22/measurements.json\n  \
cargo xtask calibrate --fit m.json --out /tmp/h100.json --evals 500"
)]
pub struct Args {
    /// The measurement file to fit to.
    #[arg(long, value_name = "MEASUREMENTS")]
    fit: Option<PathBuf>,
    /// Where to write the device file (default: fixtures/devices/<preset>.json).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Batches whose CUDA-graph runs the fit uses (the others are left to check it).
    #[arg(long, default_value = "1", value_delimiter = ',')]
    batches: Vec<usize>,
    /// Most evaluations of the loss (each simulates every run).
    #[arg(long, default_value_t = 3000)]
    evals: usize,
}

/// Run with options `a`, given on the command line as `args` (to re-run ourselves with them).
pub fn run(a: &Args, args: &[String]) -> Result<()> {
    let Some(path) = &a.fit else {
        bail!(
            "measuring needs the GPU runtime, which is being built (issue #15); until then fit \
             committed measurements: cargo xtask calibrate --fit fixtures/gpu/h100-2026-11-22/measurements.json"
        );
    };
    // Hundreds of simulations of every zoo model: worth a release build.
    if crate::rerun_in_release("calibrate", args)? {
        return Ok(());
    }
    let m = Measurements::load(path)?;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("fixtures/devices/{}.json", m.preset)));
    let provenance = Provenance {
        measurements: vec![path.display().to_string()],
        measured_on: m.measured_on.clone(),
        device_name: m.device_name.clone(),
        kernels_revision: m.kernels_revision.clone(),
        fitted_with: format!(
            "cargo xtask calibrate --fit {} --batches {} --evals {}",
            path.display(),
            a.batches
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(","),
            a.evals
        ),
        notes: vec![
            "Fitted to the fastest process of each CUDA-graph run at the batches above, the \
             contention samples and the per-operator samples (Huber loss of log ratios); overheads in \
             closed form from the overhead samples. See crates/opsched/src/calibrate.rs."
                .into(),
        ],
    };
    eprintln!(
        "fitting {} runs, {} contention samples, {} operator samples (at most {} evaluations)...",
        m.runs.len(),
        m.contention.len(),
        m.ops.len(),
        a.evals
    );
    let fitted = fit(&m, &a.batches, Params::start(), a.evals, provenance)?;
    let text = fitted.file.to_json();
    // The file must read back as the preset's device file.
    DeviceFile::parse(&text, &out).context("the fitted file does not check")?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
    println!("loss {:.4}; parameters {:?}", fitted.loss, fitted.params);
    println!("overheads {:?}", fitted.file.overheads);
    println!("wrote {}", out.display());
    Ok(())
}
