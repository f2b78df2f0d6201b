//! `cargo xtask bench-models`: every scheduler on every zoo model on chosen device presets and
//! batch sizes, under the analytical cost model; tables (CSV, Markdown), one bar chart per model,
//! and a regression check against `fixtures/bench-baseline.json`.
//!
//! Schedule quality (simulated makespan) is deterministic, so the check is tight: a makespan
//! more than [`MAKESPAN_TOLERANCE`] above the baseline fails. Scheduling time depends on the
//! machine, so times are compared after dividing by a calibration workload timed in the same
//! run (a fixed sort-and-hash job that does not use opsched): a normalized time more than
//! [`TIME_FACTOR`] times the baseline's fails, unless the time is under [`TIME_FLOOR_MS`], where
//! timer noise dominates.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use opsched::cost::DevicePreset;
use opsched::graph::DType;
use opsched::schedule::{ExecMode, NoProgress, Platform};
use opsched::zoo::ZooConfig;
use opsched::SchedulerOptions;
use serde::{Deserialize, Serialize};

use crate::plot;
use crate::progress;

/// A makespan more than this fraction above the baseline's is a regression of schedule quality.
pub const MAKESPAN_TOLERANCE: f64 = 0.01;
/// A (normalized) scheduling time more than this many times the baseline's is a regression.
pub const TIME_FACTOR: f64 = 2.0;
/// Scheduling times under this are not checked: timer and cache noise dominate there.
pub const TIME_FLOOR_MS: f64 = 2.0;

const BASELINE: &str = "fixtures/bench-baseline.json";

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Writes target/bench/results.csv, results.md and <model>.svg.\n\nExamples:\n  \
cargo xtask bench-models\n  cargo xtask bench-models --quick --check\n  \
cargo xtask bench-models --devices a100 --batches 1,8 --models inception_v3,nasnet\n  \
cargo xtask bench-models --write-baseline"
)]
pub struct Args {
    /// Device presets, comma-separated.
    #[arg(long, default_value = "v100,h100", value_delimiter = ',')]
    devices: Vec<String>,
    /// Batch sizes, comma-separated.
    #[arg(long, default_value = "1,16", value_delimiter = ',')]
    batches: Vec<usize>,
    /// Zoo models, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// Schedulers, comma-separated (default: all registered).
    #[arg(long, value_delimiter = ',')]
    algos: Vec<String>,
    /// CUDA streams per GPU.
    #[arg(long, default_value_t = 8)]
    streams: usize,
    /// The CI subset: h100 at batch 1 only (overrides --devices and --batches).
    #[arg(long)]
    pub quick: bool,
    /// Compare with fixtures/bench-baseline.json and fail on a regression.
    #[arg(long)]
    pub check: bool,
    /// Write the results as the new fixtures/bench-baseline.json.
    #[arg(long, conflicts_with = "check")]
    pub write_baseline: bool,
    /// Output directory.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
}

/// One scheduler on one model, device and batch.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Row {
    pub model: String,
    pub device: String,
    pub batch: usize,
    pub algo: String,
    pub ops: usize,
    pub makespan_ms: f64,
    pub sequential_ms: f64,
    pub speedup: f64,
    pub lower_bound_ms: f64,
    /// Best of a few runs, ms.
    pub schedule_ms: f64,
    /// `schedule_ms` / the run's calibration time.
    pub schedule_norm: f64,
    pub states: u64,
}

impl Row {
    fn key(&self) -> (String, String, usize, String) {
        (
            self.model.clone(),
            self.device.clone(),
            self.batch,
            self.algo.clone(),
        )
    }
}

/// What `fixtures/bench-baseline.json` holds.
#[derive(Debug, Serialize, Deserialize)]
pub struct Baseline {
    pub format: String,
    pub version: u32,
    pub makespan_tolerance: f64,
    pub time_factor: f64,
    pub time_floor_ms: f64,
    /// The calibration workload's time on the machine that wrote the baseline, ms.
    pub calibration_ms: f64,
    pub rows: Vec<Row>,
}

impl Args {
    /// The options of `cargo xtask bench-models FLAGS...`.
    pub fn from_flags(flags: &[String]) -> Result<Args> {
        use clap::Parser;
        let argv = ["xtask", "bench-models"]
            .into_iter()
            .map(String::from)
            .chain(flags.iter().cloned());
        match crate::Cli::try_parse_from(argv)?.command {
            crate::Cmd::BenchModels(a) => Ok(a),
            other => bail!("bench-models flags parsed as {other:?}"),
        }
    }
}

/// Run with options `a`, given on the command line as `flags` (to re-run ourselves with them).
pub fn run(a: &Args, flags: &[String]) -> Result<()> {
    // Scheduling times mean something only in an optimized build: re-run ourselves in release.
    if crate::rerun_in_release("bench-models", flags)? {
        return Ok(());
    }
    let (devices, batches) = if a.quick {
        (vec!["h100".to_string()], vec![1])
    } else {
        (a.devices.clone(), a.batches.clone())
    };
    let models = crate::models_or_zoo(&a.models);
    let algos: Vec<String> = if a.algos.is_empty() {
        opsched::scheduler_names()
            .iter()
            .map(|s| s.to_string())
            .collect()
    } else {
        a.algos.clone()
    };
    let opts = SchedulerOptions::default();
    for name in &algos {
        opsched::scheduler_with(name, &opts).map_err(|e| anyhow::anyhow!("{e}"))?;
    }

    let calibration_ms = calibrate();
    eprintln!("calibration workload: {calibration_ms:.2} ms");
    let configs: Vec<(String, usize)> = devices
        .iter()
        .flat_map(|d| batches.iter().map(move |&b| (d.clone(), b)))
        .collect();
    let bar = progress::bar((models.len() * configs.len()) as u64);
    let mut rows = Vec::new();
    let started = Instant::now();
    for model in &models {
        for (device, batch) in &configs {
            bar.set_message(format!("{model} on {device}, batch {batch}"));
            rows.extend(bench_one(
                model,
                device,
                *batch,
                a.streams,
                &algos,
                &opts,
                calibration_ms,
            )?);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    eprintln!(
        "{} results in {:.1} s",
        rows.len(),
        started.elapsed().as_secs_f64()
    );

    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    write(&a.out.join("results.csv"), &csv(&rows))?;
    write(&a.out.join("results.md"), &markdown(&rows, &configs))?;
    for model in &models {
        write(
            &a.out.join(format!("{model}.svg")),
            &chart(model, &rows, &configs),
        )?;
    }
    eprintln!(
        "wrote {}/results.{{csv,md}} and one SVG per model",
        a.out.display()
    );

    if a.write_baseline {
        let b = Baseline {
            format: "opsched-bench-baseline".into(),
            version: 1,
            makespan_tolerance: MAKESPAN_TOLERANCE,
            time_factor: TIME_FACTOR,
            time_floor_ms: TIME_FLOOR_MS,
            calibration_ms,
            rows,
        };
        let text = serde_json::to_string_pretty(&b)? + "\n";
        eprintln!("{}", opsched::io::write(BASELINE, text.as_bytes())?);
        return Ok(());
    }
    if a.check {
        let text = std::fs::read_to_string(BASELINE)
            .with_context(|| format!("reading {BASELINE} (make one with --write-baseline)"))?;
        let base: Baseline =
            serde_json::from_str(&text).with_context(|| format!("parsing {BASELINE}"))?;
        let report = check(&base, &rows);
        for line in &report.notes {
            eprintln!("note: {line}");
        }
        for line in &report.regressions {
            eprintln!("REGRESSION: {line}");
        }
        if !report.regressions.is_empty() {
            bail!(
                "{} regression(s) against {BASELINE}; if intended, refresh it with `cargo xtask bench-models --write-baseline`",
                report.regressions.len()
            );
        }
        eprintln!(
            "check passed: {} results compared with {BASELINE} (makespan within {:.1}%, scheduling time within {}x)",
            report.compared,
            base.makespan_tolerance * 100.0,
            base.time_factor
        );
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<()> {
    opsched::io::write(path, text.as_bytes())?;
    Ok(())
}

fn bench_one(
    model: &str,
    device: &str,
    batch: usize,
    streams: usize,
    algos: &[String],
    opts: &SchedulerOptions,
    calibration_ms: f64,
) -> Result<Vec<Row>> {
    let cfg = ZooConfig {
        batch,
        input_size: None,
        dtype: DType::F32,
    };
    let g = opsched::zoo::build(model, &cfg).with_context(|| format!("building {model}"))?;
    let preset = DevicePreset::by_name(device)?;
    // One GPU: the link carries nothing; the preset's own keeps the platform line true.
    let link = preset.default_link.clone();
    // The preset as users get it: calibrated where a device file is committed.
    let cost = opsched::analytical_model(&preset, &link, &opsched::Calibration::Committed)?;
    let platform = Platform {
        gpus: 1,
        streams,
        device: preset,
        link,
    };
    let names: Vec<&str> = algos.iter().map(String::as_str).collect();
    let table = opsched::compare(
        &g,
        &names,
        &platform,
        &cost,
        opts,
        ExecMode::Graph,
        &NoProgress,
    )
    .with_context(|| format!("{model} on {device}, batch {batch}"))?;
    let mut rows = Vec::with_capacity(table.rows.len());
    for r in &table.rows {
        let schedule_ms = best_time(r.schedule_time_ms, || {
            if let Ok(s) = opsched::scheduler_with(&r.algo, opts) {
                let _ = s.schedule(&g, &platform, &cost);
            }
        });
        rows.push(Row {
            model: model.to_string(),
            device: device.to_string(),
            batch,
            algo: r.algo.clone(),
            ops: table.ops,
            makespan_ms: r.makespan_ms,
            sequential_ms: table.sequential_ms,
            speedup: r.speedup,
            lower_bound_ms: table.lower_bound.value(),
            schedule_ms,
            schedule_norm: schedule_ms / calibration_ms,
            states: r.stats.states,
        });
    }
    Ok(rows)
}

/// The best of the first run and a few more within a small time budget: the minimum is the
/// least noisy estimate of what the code costs.
fn best_time(first_ms: f64, mut f: impl FnMut()) -> f64 {
    let mut best = first_ms;
    let (mut spent, mut reps) = (first_ms, 0);
    while spent < 200.0 && reps < 10 {
        let t = Instant::now();
        f();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        best = best.min(ms);
        spent += ms;
        reps += 1;
    }
    best
}

/// A fixed job that does not use opsched (sorting, hashing, pointer-chasing over a few MB), so
/// scheduling times can be compared across machines as multiples of it. The best of runs
/// over at least half a second (at least five), ms: a run of five took 4.9 to 14.3 ms on one
/// shared 2-core machine within minutes, and one slow calibration in a baseline makes every
/// later check look twice as slow.
pub fn calibrate() -> f64 {
    let mut best = f64::INFINITY;
    let started = Instant::now();
    let mut runs = 0;
    while runs < 5 || started.elapsed().as_secs_f64() < 0.5 {
        runs += 1;
        let t = Instant::now();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut v: Vec<u64> = (0..200_000)
            .map(|_| {
                x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = x;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z ^ (z >> 27)
            })
            .collect();
        v.sort_unstable();
        let mut m: HashMap<u64, u64> = HashMap::with_capacity(100_000);
        for (i, &k) in v.iter().enumerate().take(100_000) {
            *m.entry(k % 65_536).or_default() += i as u64;
        }
        let sum: u64 = m.values().fold(0u64, |a, &b| a.wrapping_add(b));
        std::hint::black_box(sum);
        best = best.min(t.elapsed().as_secs_f64() * 1e3);
    }
    best
}

/// The outcome of comparing a run with the baseline.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub compared: usize,
    pub regressions: Vec<String>,
    pub notes: Vec<String>,
}

pub fn check(base: &Baseline, rows: &[Row]) -> CheckReport {
    let by_key: BTreeMap<_, _> = base.rows.iter().map(|r| (r.key(), r)).collect();
    let mut rep = CheckReport::default();
    for r in rows {
        let what = format!("{} on {} batch {} / {}", r.model, r.device, r.batch, r.algo);
        let Some(b) = by_key.get(&r.key()) else {
            rep.notes.push(format!("{what}: not in the baseline"));
            continue;
        };
        rep.compared += 1;
        if r.makespan_ms > b.makespan_ms * (1.0 + base.makespan_tolerance) {
            rep.regressions.push(format!(
                "{what}: makespan {:.4} ms, baseline {:.4} ms (+{:.2}%)",
                r.makespan_ms,
                b.makespan_ms,
                (r.makespan_ms / b.makespan_ms - 1.0) * 100.0
            ));
        } else if r.makespan_ms < b.makespan_ms * (1.0 - base.makespan_tolerance) {
            rep.notes.push(format!(
                "{what}: makespan improved to {:.4} ms from {:.4} ms",
                r.makespan_ms, b.makespan_ms
            ));
        }
        if r.schedule_ms > base.time_floor_ms
            && r.schedule_norm > b.schedule_norm * base.time_factor
        {
            rep.regressions.push(format!(
                "{what}: scheduling time {:.2} ms is {:.2}x the baseline's after calibration ({:.2} ms there)",
                r.schedule_ms,
                r.schedule_norm / b.schedule_norm,
                b.schedule_ms
            ));
        }
    }
    rep
}

fn csv(rows: &[Row]) -> String {
    let mut s = String::from(
        "model,device,batch,algorithm,ops,makespan_ms,sequential_ms,speedup,lower_bound_ms,gap,schedule_ms,states\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{:.6},{:.6},{:.4},{:.6},{:.4},{:.4},{}",
            r.model,
            r.device,
            r.batch,
            r.algo,
            r.ops,
            r.makespan_ms,
            r.sequential_ms,
            r.speedup,
            r.lower_bound_ms,
            opsched::ratio(r.makespan_ms, r.lower_bound_ms),
            r.schedule_ms,
            r.states
        );
    }
    s
}

fn config_label((device, batch): &(String, usize)) -> String {
    format!("{device} b{batch}")
}

fn markdown(rows: &[Row], configs: &[(String, usize)]) -> String {
    let mut s = String::from(
        "# Scheduler benchmark on the zoo (analytical cost model, 1 GPU)\n\n\
         Each cell: simulated makespan in ms (speedup over sequential). Scheduling time is the \
         best of a few runs on the first configuration.\n",
    );
    let mut models: Vec<&str> = Vec::new();
    for r in rows {
        if !models.contains(&r.model.as_str()) {
            models.push(&r.model);
        }
    }
    for model in models {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.model == model).collect();
        let ops = mine.first().map_or(0, |r| r.ops);
        let _ = write!(s, "\n## {model} ({ops} operators)\n\n| algorithm |");
        for c in configs {
            let _ = write!(s, " {} |", config_label(c));
        }
        let first = configs.first().map(config_label).unwrap_or_default();
        let _ = writeln!(s, " scheduling time ({first}) | states |");
        s.push_str("|---|");
        for _ in configs {
            s.push_str("---:|");
        }
        s.push_str("---:|---:|\n");
        let mut algos: Vec<&str> = Vec::new();
        for r in &mine {
            if !algos.contains(&r.algo.as_str()) {
                algos.push(&r.algo);
            }
        }
        for algo in algos {
            let _ = write!(s, "| {algo} |");
            for (d, b) in configs {
                match mine
                    .iter()
                    .find(|r| r.algo == algo && &r.device == d && r.batch == *b)
                {
                    Some(r) => {
                        let _ = write!(s, " {:.3} ({:.2}x) |", r.makespan_ms, r.speedup);
                    }
                    None => s.push_str(" - |"),
                }
            }
            match configs.first().and_then(|(d, b)| {
                mine.iter()
                    .find(|r| r.algo == algo && &r.device == d && r.batch == *b)
            }) {
                Some(r) => {
                    let _ = writeln!(s, " {} | {} |", fmt_ms(r.schedule_ms), r.states);
                }
                None => s.push_str(" - | - |\n"),
            }
        }
    }
    s
}

fn fmt_ms(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms >= 1.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{:.1} µs", ms * 1000.0)
    }
}

fn chart(model: &str, rows: &[Row], configs: &[(String, usize)]) -> String {
    let mut algos: Vec<String> = Vec::new();
    for r in rows.iter().filter(|r| r.model == model) {
        if !algos.contains(&r.algo) {
            algos.push(r.algo.clone());
        }
    }
    let series: Vec<(String, Vec<f64>)> = configs
        .iter()
        .map(|c| {
            let ys = algos
                .iter()
                .map(|a| {
                    rows.iter()
                        .find(|r| {
                            r.model == model && &r.algo == a && r.device == c.0 && r.batch == c.1
                        })
                        .map_or(f64::NAN, |r| r.speedup)
                })
                .collect();
            (config_label(c), ys)
        })
        .collect();
    plot::bar_chart(
        &format!("{model}: simulated speedup over sequential (analytical model, 1 GPU)"),
        "speedup over sequential",
        &algos,
        &series,
        Some(1.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(algo: &str, makespan_ms: f64, schedule_ms: f64, norm: f64) -> Row {
        Row {
            model: "m".into(),
            device: "h100".into(),
            batch: 1,
            algo: algo.into(),
            ops: 3,
            makespan_ms,
            sequential_ms: 2.0,
            speedup: 2.0 / makespan_ms,
            lower_bound_ms: 0.5,
            schedule_ms,
            schedule_norm: norm,
            states: 1,
        }
    }

    fn baseline(rows: Vec<Row>) -> Baseline {
        Baseline {
            format: "opsched-bench-baseline".into(),
            version: 1,
            makespan_tolerance: MAKESPAN_TOLERANCE,
            time_factor: TIME_FACTOR,
            time_floor_ms: TIME_FLOOR_MS,
            calibration_ms: 10.0,
            rows,
        }
    }

    #[test]
    fn check_flags_worse_makespans_and_slower_searches_only() {
        let base = baseline(vec![
            row("a", 1.0, 5.0, 0.5),
            row("b", 1.0, 5.0, 0.5),
            row("c", 1.0, 0.01, 0.001),
            row("d", 1.0, 5.0, 0.5),
        ]);
        let now = vec![
            row("a", 1.005, 9.0, 0.9), // within tolerance, within 2x
            row("b", 1.02, 5.0, 0.5),  // 2% worse schedule
            row("c", 1.0, 1.5, 0.15),  // 150x slower but under the floor
            row("d", 0.9, 12.0, 1.2),  // better schedule, 2.4x slower
            row("new", 1.0, 1.0, 0.1), // not in the baseline
        ];
        let rep = check(&base, &now);
        assert_eq!(rep.compared, 4);
        assert_eq!(rep.regressions.len(), 2, "{:?}", rep.regressions);
        assert!(rep.regressions[0].contains("/ b: makespan"));
        assert!(rep.regressions[1].contains("/ d: scheduling time"));
        assert!(rep
            .notes
            .iter()
            .any(|n| n.contains("/ d: makespan improved")));
        assert!(rep
            .notes
            .iter()
            .any(|n| n.contains("/ new: not in the baseline")));
    }

    #[test]
    fn calibration_takes_measurable_time() {
        let ms = calibrate();
        assert!(ms > 0.0 && ms.is_finite());
    }

    #[test]
    fn markdown_and_csv_have_a_line_per_result() {
        let rows = vec![row("a", 1.0, 5.0, 0.5), row("b", 0.8, 0.5, 0.05)];
        let configs = vec![("h100".to_string(), 1)];
        assert_eq!(csv(&rows).lines().count(), 3);
        let md = markdown(&rows, &configs);
        assert!(md.contains("| a | 1.000 (2.00x) | 5.00 ms | 1 |"), "{md}");
        assert!(md.contains("| b | 0.800 (2.50x) | 500.0 µs | 1 |"), "{md}");
        let svg = chart("m", &rows, &configs);
        assert_eq!(svg.matches("class=\"bar\"").count(), 2);
    }
}
