//! `cargo xtask calibrate`: measure a device into a measurement file, or fit a device file to one.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use opsched::calibrate::{fit, Params};
use opsched::cost::calibration::{DeviceFile, Provenance};
use opsched::cost::measurements::{Measurements, RunMode};
use opsched::runtime::Device;

#[derive(Parser, Debug)]
#[command(
    name = "cargo xtask calibrate",
    about = "Measure a GPU into a measurement file, or fit a device file to one",
    after_help = "Without --fit, calibrate measures the device it runs on (overheads, contention \
samples, per-operator times, every model x algorithm x batch as a CUDA graph; \
crates/opsched/src/measure.rs) into a measurement file. With --fit it reads such a file (the \
format is in crates/cost/src/measurements.rs) and writes the device file the preset loads. \
Run the measuring half in several processes and concatenate the runs' `ms` lists to see how \
processes differ.\n\n\
Examples:\n  cargo xtask calibrate --out fixtures/gpu/h100-DATE/measurements.json\n  \
cargo xtask calibrate --backend cpu --preset h100 --models squeezenet --algos sequential,lios \
--repeats 5 --out /tmp/m.json\n  \
cargo xtask calibrate --fit fixtures/gpu/h100-2026-11-22/measurements.json\n  \
cargo xtask calibrate --fit m.json --out /tmp/h100.json --evals 500\n  \
cargo xtask calibrate --fit m.json --batches 1,16 --start last-h100.json (also descends from the last fit)\n  \
cargo xtask calibrate --fit m.json --out /tmp/held.json --models googlenet,nasnet (then \
cargo xtask fidelity --measurements m.json --device-file /tmp/held.json --models squeezenet)"
)]
pub struct Args {
    /// The measurement file to fit to (without it: measure).
    #[arg(long, value_name = "MEASUREMENTS")]
    fit: Option<PathBuf>,
    /// Where to write the device file (--fit; default `fixtures/devices/<preset>.json`) or the
    /// measurement file (measuring; required).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Batches measured, or whose CUDA-graph runs the fit uses (the others are left to check
    /// it).
    #[arg(long, default_value = "1", value_delimiter = ',')]
    batches: Vec<usize>,
    /// Most evaluations of the loss (each simulates every run), per start.
    #[arg(long, default_value_t = 3000)]
    evals: usize,
    /// Fitting: start a descent from this device file's parameters too (repeat for several),
    /// besides the formulas'; the lowest loss wins. The search is local: the last fit is
    /// often a better start than the formulas.
    #[arg(long, value_name = "DEVICE_FILE")]
    start: Vec<PathBuf>,
    /// Measuring: the device (cpu only to try the pipeline: its times describe no GPU).
    #[arg(long, value_name = "cuda|cpu", default_value = "cuda")]
    backend: String,
    /// Measuring: the preset the device is [default: matched from the GPU's name].
    #[arg(long)]
    preset: Option<String>,
    /// Measuring: zoo models, comma-separated [default: every zoo model]. Fitting: fit only
    /// these models' runs (to check the fit on the others: `cargo xtask fidelity --models`).
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// Measuring: algorithms whose schedules run, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "sequential,greedy,ios,lios,opara,nimble,iops,hios-lp"
    )]
    algos: Vec<String>,
    /// Measuring: timed replays per measurement (after a tenth as many warm-up replays).
    #[arg(long, default_value_t = 100)]
    repeats: u32,
}

/// Run with options `a`, given on the command line as `args` (to re-run ourselves with them).
pub fn run(a: &Args, args: &[String]) -> Result<()> {
    let Some(path) = &a.fit else {
        return measure(a, args);
    };
    // Hundreds of simulations of every zoo model: worth a release build.
    if crate::rerun_in_release("calibrate", args)? {
        return Ok(());
    }
    let m = load_models(path, &a.models)?;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("fixtures/devices/{}.json", m.preset)));
    opsched::io::check_writable(&out)?;
    let provenance = Provenance {
        measurements: vec![path.display().to_string()],
        measured_on: m.measured_on.clone(),
        device_name: m.device_name.clone(),
        kernels_revision: m.kernels_revision.clone(),
        fitted_with: format!(
            "cargo xtask calibrate --fit {} --batches {} --evals {}{}{}",
            path.display(),
            a.batches
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(","),
            a.evals,
            match a.models.is_empty() {
                true => String::new(),
                false => format!(" --models {}", a.models.join(",")),
            },
            a.start
                .iter()
                .map(|f| format!(" --start {}", f.display()))
                .collect::<String>()
        ),
        notes: vec![format!(
            "Fitted to the fastest process of each of {} CUDA-graph runs at the batches above, {} \
             contention samples and {} per-operator samples (Huber loss of log ratios); overheads \
             in closed form from {} overhead samples. See crates/opsched/src/calibrate.rs.",
            m.runs
                .iter()
                .filter(|r| r.mode == RunMode::Graph && a.batches.contains(&r.batch))
                .count(),
            m.contention.len(),
            m.ops.len(),
            m.overheads.len()
        )],
    };
    eprintln!(
        "fitting {} runs, {} contention samples, {} operator samples (at most {} evaluations)...",
        m.runs.len(),
        m.contention.len(),
        m.ops.len(),
        a.evals
    );
    // The formulas' start, then each --start file's parameters.
    let mut starts = vec![Params::start()];
    for f in &a.start {
        let file = DeviceFile::load(f)?;
        starts.push(Params::of_file(&file).with_context(|| {
            format!(
                "--start {}: not a file `calibrate --fit` writes (constant curves, element-wise \
                 efficiency 0.5, interference cap 2)",
                f.display()
            )
        })?);
    }
    let fitted = fit(&m, &a.batches, &starts, a.evals, provenance)?;
    let text = fitted.file.to_json();
    // The file must read back as the preset's device file.
    DeviceFile::parse(&text, &out).context("the fitted file does not check")?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    opsched::io::write(&out, text.as_bytes())?;
    println!("loss {:.4}; parameters {:?}", fitted.loss, fitted.params);
    println!("overheads {:?}", fitted.file.overheads);
    println!("wrote {}", out.display());
    Ok(())
}

/// The measurement file at `path` with only `models`' runs and operator samples (all of them
/// where `models` is empty): `--models` of `calibrate --fit` and `fidelity`.
pub(crate) fn load_models(path: &std::path::Path, models: &[String]) -> Result<Measurements> {
    let mut m = Measurements::load(path)?;
    if !models.is_empty() {
        m.runs.retain(|r| models.contains(&r.model));
        m.ops.retain(|o| models.contains(&o.model));
        if m.runs.is_empty() {
            bail!("{}: no runs of {}", path.display(), models.join(", "));
        }
    }
    Ok(m)
}

/// The measuring half: `opsched::measure` on the chosen device into `--out`.
fn measure(a: &Args, args: &[String]) -> Result<()> {
    let Some(out) = &a.out else {
        bail!("measuring writes a measurement file: give --out FILE");
    };
    // Refused now, not after minutes of measuring.
    opsched::io::check_writable(out)?;
    if crate::rerun_in_release("calibrate", args)? {
        return Ok(());
    }
    let models = crate::models_or_zoo(&a.models);
    let revision = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let today = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let mut o = opsched::measure::MeasureOptions {
        preset: a.preset.clone().unwrap_or_default(),
        models,
        batches: a.batches.clone(),
        input_size: None,
        algorithms: a.algos.clone(),
        streams: 8,
        warmup: (a.repeats / 10).max(1),
        repeats: a.repeats,
        copies: 20,
        kernels: opsched::runtime::KernelOptions::default(),
        measured_on: today.get(..10).unwrap_or(&today).to_string(),
        revision,
    };
    let progress = |what: &str| eprintln!("==> {what}");
    let m = match a.backend.as_str() {
        "cuda" => {
            let dev = opsched::runtime::CudaDevice::open(Some(1))?;
            if o.preset.is_empty() {
                let gpu = dev.report().name;
                o.preset = opsched::cost::DevicePreset::for_device_name(&gpu)
                    .with_context(|| format!("no preset matches '{gpu}': give --preset"))?
                    .name
                    .to_string();
            }
            opsched::measure::measure(&dev, &o, progress)?
        }
        "cpu" => {
            if o.preset.is_empty() {
                bail!("--backend cpu measures no GPU: name the preset to file it under (--preset)");
            }
            opsched::measure::measure(&opsched::runtime::CpuDevice::new(), &o, progress)?
        }
        other => bail!("--backend {other}: cuda or cpu"),
    };
    let text = serde_json::to_string_pretty(&m)?;
    // It must read back as a measurement file.
    Measurements::parse(&text, out).context("the measurements do not check")?;
    opsched::io::write(out, text.as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    println!(
        "{} overheads, {} contention samples, {} operators, {} runs -> {}",
        m.overheads.len(),
        m.contention.len(),
        m.ops.len(),
        m.runs.len(),
        out.display()
    );
    Ok(())
}
