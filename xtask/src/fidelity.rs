//! `cargo xtask fidelity`: the simulator's predictions against committed GPU measurements.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use opsched::calibrate::{
    fidelity, Fidelity, BEST_TOLERANCE, FITTED_TOLERANCE, UNFITTED_TOLERANCE,
};
use opsched::cost::calibration::DeviceFile;
use opsched::cost::measurements::RunMode;
use opsched::cost::{DevicePreset, LinkPreset};
use opsched::Calibration;

#[derive(Parser, Debug)]
#[command(
    name = "cargo xtask fidelity",
    about = "Predicted against measured latency per model x algorithm x batch (no GPU needed)",
    after_help = "Predictions simulate the schedule that ran under the preset's committed device \
file (or --device-file, or --formulas); measured is the fastest process. Per model: Spearman's \
rank correlation over the algorithms, and whether the algorithm predicted fastest is within 3% of \
the measured fastest.\n\nExamples:\n  cargo xtask fidelity\n  cargo xtask fidelity --json\n  \
cargo xtask fidelity --formulas"
)]
pub struct Args {
    /// The measurement file (default: the one the device file in use was fitted to, so the
    /// report follows every refit).
    #[arg(long, value_name = "FILE")]
    measurements: Option<PathBuf>,
    /// The preset whose committed device file names the default measurements.
    #[arg(long, default_value = "h100", value_name = "NAME")]
    device: String,
    /// Calibrate with this device file instead of the committed one.
    #[arg(long, value_name = "FILE", conflicts_with = "formulas")]
    device_file: Option<PathBuf>,
    /// The uncalibrated formulas (what opsched predicted before device files).
    #[arg(long)]
    formulas: bool,
    /// Only these models' runs, comma-separated [default: every run of the file].
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Run with options `a`, given on the command line as `args` (to re-run ourselves with them).
pub fn run(a: &Args, args: &[String]) -> Result<()> {
    if crate::rerun_in_release("fidelity", args)? {
        return Ok(());
    }
    let path = match &a.measurements {
        Some(p) => p.clone(),
        None => {
            let file = match &a.device_file {
                Some(p) => Some(DeviceFile::load(p)?),
                None => DeviceFile::embedded(&a.device),
            };
            file.and_then(|f| f.provenance.measurements.first().map(PathBuf::from))
                .with_context(|| {
                    format!(
                        "the device file of '{}' names no measurements; pass --measurements",
                        a.device
                    )
                })?
        }
    };
    let m = crate::calibrate::load_models(&path, &a.models)?;
    let calibration = match (&a.device_file, a.formulas) {
        (Some(p), _) => Calibration::File(p.clone()),
        (None, true) => Calibration::Formulas,
        (None, false) => Calibration::Committed,
    };
    let device = DevicePreset::by_name(&m.preset)?;
    let cost = opsched::analytical_model(&device, &LinkPreset::by_name("nvlink4")?, &calibration)?;
    let report = fidelity(&m, &path.display().to_string(), &cost)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", text(&report));
    }
    Ok(())
}

fn pct(x: f64) -> String {
    format!("{:+.1}%", x * 100.0)
}

/// The report as text: the summary, per model, then every run.
pub fn text(r: &Fidelity) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{} against {}", r.cost_model, r.measurements);
    let _ = writeln!(
        s,
        "batch 1, CUDA graph: {} of {} within {:.0}%; other batches: {} of {} within {:.0}%; \
         predicted best within {:.0}% of the measured best: {} of {} models\n",
        r.fitted_within.0,
        r.fitted_within.1,
        FITTED_TOLERANCE * 100.0,
        r.unfitted_within.0,
        r.unfitted_within.1,
        UNFITTED_TOLERANCE * 100.0,
        BEST_TOLERANCE * 100.0,
        r.best_within.0,
        r.best_within.1
    );
    let _ = writeln!(
        s,
        "| model | batch | within {:.0}% | median abs error | Spearman | predicted best | measured best | best gap |",
        FITTED_TOLERANCE * 100.0
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---|---|---:|");
    for m in &r.models {
        let mut errs: Vec<f64> = r
            .rows
            .iter()
            .filter(|x| x.model == m.model && x.batch == m.batch && x.mode == RunMode::Graph)
            .map(|x| x.error.abs())
            .collect();
        errs.sort_by(f64::total_cmp);
        let tol = if m.batch == 1 {
            FITTED_TOLERANCE
        } else {
            UNFITTED_TOLERANCE
        };
        let within = errs.iter().filter(|e| **e <= tol).count();
        let median = errs.get(errs.len() / 2).copied().unwrap_or(0.0);
        let _ = writeln!(
            s,
            "| {} | {} | {}/{} | {:.1}% | {:.2} | {} | {} | {}{} |",
            m.model,
            m.batch,
            within,
            errs.len(),
            median * 100.0,
            m.spearman,
            m.predicted_best,
            m.measured_best,
            pct(m.best_gap),
            if m.best_within { "" } else { " (over 3%)" }
        );
    }
    if !r.op_sums.is_empty() {
        let _ = writeln!(
            s,
            "\nOperators measured one by one, summed, against the sequential CUDA-graph run:\n\n\
             | model | batch | sum of operators ms | sequential ms | error | operators without a sample |\n\
             |---|---:|---:|---:|---:|---:|"
        );
        for o in &r.op_sums {
            let _ = writeln!(
                s,
                "| {} | {} | {:.3} | {:.3} | {} | {} |",
                o.model,
                o.batch,
                o.sum_ms,
                o.sequential_ms,
                pct(o.error),
                o.missing
            );
        }
    }
    let _ = writeln!(
        s,
        "\n| model | algorithm | batch | mode | predicted ms | measured ms | error | processes |"
    );
    let _ = writeln!(s, "|---|---|---:|---|---:|---:|---:|---|");
    for x in &r.rows {
        let procs: Vec<String> = x.processes.iter().map(|p| format!("{p:.3}")).collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.3} | {:.3} | {} | {} |",
            x.model,
            x.algorithm,
            x.batch,
            match x.mode {
                RunMode::Graph => "graph",
                RunMode::Eager => "eager",
            },
            x.predicted_ms,
            x.measured_ms,
            pct(x.error),
            procs.join(" ")
        );
    }
    s
}
