//! `cargo xtask bench-cpu`: our CPU backend against onnxruntime on this machine with the same
//! number of threads, per model: our sequential plan, the best of a few schedules (streams are
//! worker threads on the CPU: what the schedule buys there), onnxruntime, the ratio of our
//! faster plan to onnxruntime and the largest relative difference of the outputs (same
//! weights, same inputs). Each column is the fastest of `--rounds` rounds run side by side.
//!
//! Models: the torchvision exports of `fixtures/onnx/torchvision` by name (their stripped
//! weights filled with seeded random values by `xtask/fixtures/fill_weights.py`, written under
//! `target/bench-cpu`, never committed; inputs seeded here) and parity fixtures as
//! `parity/NAME` (`fixtures/parity/NAME.onnx` with its committed inputs). onnxruntime runs in
//! `xtask/cpu/ort_bench.py` with the machine's python3; without python3 + onnxruntime the
//! table has our columns only and says so.
//!
//! Threads: rayon's pool and onnxruntime's intra-op pool both get `--threads` (default: the
//! machine's cores), onnxruntime runs operators one at a time. Schedules are searched under the
//! analytical model of the h100 preset with `--streams` streams: the order and grouping of
//! operators, not their GPU times, is what carries over to the CPU; "best" is the fastest of
//! `--algos` measured here.
//!
//! Options: `cargo xtask bench-cpu --help`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use opsched::graph::Tensor;
use opsched::npy::{self, InputArray};
use opsched::schedule::{Platform, Schedule};
use opsched::zoo::ZooConfig;
use opsched::{CostKind, LoadOptions, SchedulerOptions};
use opsched_runtime::{CpuDevice, RunOptions, RunReport};
use serde::Serialize;

#[derive(clap::Args, Clone, Debug)]
#[command(
    after_help = "Filled models, inputs and onnxruntime's outputs go to target/bench-cpu.\n\n\
Examples:\n  cargo xtask bench-cpu\n  cargo xtask bench-cpu --models resnet50 --threads 1\n  \
cargo xtask bench-cpu --quick --json --no-ort"
)]
pub struct Args {
    /// Models, comma-separated: torchvision exports by name, parity fixtures as parity/NAME.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "resnet50,inception_v3,googlenet,parity/inception,parity/residual,parity/conv_bn_relu,parity/attention17"
    )]
    models: Vec<String>,
    /// Threads for both (rayon's pool, onnxruntime's intra-op pool) [default: the cores].
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Streams the schedules may use (each a worker thread on the CPU).
    #[arg(long, value_name = "N", default_value_t = 4)]
    streams: usize,
    /// Candidates for "best", comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "ios,greedy,opara")]
    algos: Vec<String>,
    /// Timed runs per measurement (median reported).
    #[arg(long, value_name = "N", default_value_t = 20)]
    repeats: u32,
    /// Untimed runs before them.
    #[arg(long, value_name = "N", default_value_t = 5)]
    warmup: u32,
    /// Rounds of (sequential, best, onnxruntime) side by side; each column keeps its fastest.
    #[arg(long, value_name = "N", default_value_t = 3)]
    rounds: u32,
    /// Repeats 5, warmup 2, one round (overrides --repeats, --warmup and --rounds).
    #[arg(long)]
    quick: bool,
    /// Skip onnxruntime.
    #[arg(long = "no-ort", action = clap::ArgAction::SetFalse)]
    ort: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

const WORK: &str = "target/bench-cpu";

/// onnxruntime's result for one model (from `ort_bench.py`).
#[derive(Serialize, Clone, Debug)]
struct OrtResult {
    version: String,
    median_ms: f64,
    p10_ms: f64,
    p90_ms: f64,
    /// max |ours - ort| / max |ort| over the outputs (ours: the sequential plan's).
    max_rel_err: f64,
}

#[derive(Serialize, Debug)]
struct Row {
    model: String,
    operators: usize,
    sequential_ms: f64,
    best_algo: String,
    best_ms: f64,
    /// sequential / best.
    schedule_speedup: f64,
    ort: Option<OrtResult>,
    /// Ours (the faster of sequential and best) / onnxruntime.
    ratio: Option<f64>,
    /// Why onnxruntime has no result for this model.
    #[serde(skip_serializing_if = "Option::is_none")]
    ort_missing: Option<String>,
}

#[derive(Serialize, Debug)]
struct Report {
    machine: String,
    threads: usize,
    streams: usize,
    warmup: u32,
    repeats: u32,
    rounds: u32,
    rows: Vec<Row>,
}

/// A model to run: its file and its inputs (`.npz`, by graph input name).
struct Model {
    name: String,
    onnx: PathBuf,
    inputs: PathBuf,
}

pub fn run(args: &Args, flags: &[String]) -> Result<()> {
    if crate::rerun_in_release("bench-cpu", flags)? {
        return Ok(());
    }
    let mut args = args.clone();
    if args.quick {
        args.repeats = 5;
        args.warmup = 2;
        args.rounds = 1;
    }
    let threads = match args.threads {
        Some(n) => n.max(1),
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .context("setting rayon's thread count")?;
    std::fs::create_dir_all(WORK).with_context(|| format!("creating {WORK}"))?;
    let machine = cpu_name();
    eprintln!(
        "bench-cpu on {machine}: {threads} threads, schedules with {} streams",
        args.streams
    );
    let mut rows = Vec::new();
    for name in &args.models {
        let model = prepare(name)?;
        rows.push(bench(&model, &args, threads)?);
    }
    let report = Report {
        machine,
        threads,
        streams: args.streams,
        warmup: args.warmup,
        repeats: args.repeats,
        rounds: args.rounds,
        rows,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", table(&report));
    }
    Ok(())
}

/// The CPU's model name (Linux), else the architecture.
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Resolve `name` to a model file and inputs: fill a torchvision export's weights (once) and
/// seed its inputs, or take a parity fixture as committed.
fn prepare(name: &str) -> Result<Model> {
    if let Some(parity) = name.strip_prefix("parity/") {
        let dir = Path::new("fixtures/parity");
        let onnx = dir.join(format!("{parity}.onnx"));
        if !onnx.is_file() {
            bail!("{}: no such parity fixture", onnx.display());
        }
        return Ok(Model {
            name: name.into(),
            inputs: dir.join(format!("{parity}.inputs.npz")),
            onnx,
        });
    }
    let export = Path::new("fixtures/onnx/torchvision").join(format!("{name}.onnx"));
    if !export.is_file() {
        bail!(
            "{}: no such torchvision export (or give parity/NAME)",
            export.display()
        );
    }
    let onnx = Path::new(WORK).join(format!("{name}.onnx"));
    let weights = Path::new(WORK).join(format!("{name}.onnx.weights"));
    if !weights.is_file() {
        eprintln!("{name}: filling its weights (xtask/fixtures/fill_weights.py)");
        let status = Command::new("python3")
            .arg("xtask/fixtures/fill_weights.py")
            .arg(WORK)
            .arg(&export)
            .status()
            .context("running python3 xtask/fixtures/fill_weights.py (needs onnx and numpy)")?;
        if !status.success() {
            bail!(
                "filling the weights of {} failed ({status}); it needs python3 with onnx and numpy",
                export.display()
            );
        }
    }
    let inputs = Path::new(WORK).join(format!("{name}.inputs.npz"));
    let g = load(&onnx, 1)?;
    let arrays: Vec<(String, Tensor)> = g
        .inputs()
        .enumerate()
        .map(|(i, id)| {
            let node = g.node(id);
            let len: usize = node.shape.iter().product();
            let t = Tensor::new(node.shape.clone(), seeded(len, i as u64))
                .map_err(anyhow::Error::msg)?;
            Ok((node.name.clone(), t))
        })
        .collect::<Result<_>>()?;
    let bytes = npy::encode_outputs(&inputs, &arrays)?;
    std::fs::write(&inputs, bytes).with_context(|| format!("writing {}", inputs.display()))?;
    Ok(Model {
        name: name.into(),
        onnx,
        inputs,
    })
}

/// `len` values uniform in [-1, 1) from a splitmix64 stream (the same on every machine).
fn seeded(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x0123_4567_89AB_CDEF;
    (0..len)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn load(onnx: &Path, batch: usize) -> Result<opsched::Graph> {
    let cfg = ZooConfig {
        batch,
        ..ZooConfig::default()
    };
    let opts = LoadOptions {
        weights: true,
        ..LoadOptions::default()
    };
    let spec = onnx.to_str().context("a model path that is not UTF-8")?;
    opsched::load_model_with(spec, &cfg, &opts)
        .with_context(|| format!("loading {}", onnx.display()))
}

fn bench(m: &Model, args: &Args, threads: usize) -> Result<Row> {
    let arrays: Vec<InputArray> = npy::read_npz(&m.inputs)?
        .into_iter()
        .map(|(name, tensor)| InputArray {
            name: Some(name),
            path: m.inputs.clone(),
            tensor,
        })
        .collect();
    let g = load(&m.onnx, npy::input_batch(&arrays).unwrap_or(1))?;
    let inputs = Arc::new(npy::bind_inputs(&g, arrays)?);
    let dev = CpuDevice::with_race_check(false);
    let preset = opsched::cost::DevicePreset::by_name("h100")?;
    let link = preset.default_link.clone();
    let cost = opsched::cost_model(CostKind::Analytical, &preset, &link, &g, None)?;
    let platform = Platform {
        gpus: 1,
        streams: args.streams,
        device: preset.clone(),
        link,
    };
    let schedule = |algo: &str| -> Result<Schedule> {
        let sched = opsched::scheduler_with(algo, &SchedulerOptions::default())?;
        let (s, _) = sched
            .schedule(&g, &platform, cost.as_ref())
            .with_context(|| format!("{algo} on {}", m.name))?;
        Ok(s)
    };
    let measure = |s: &Schedule, repeats: u32| -> Result<RunReport> {
        let opts = RunOptions {
            warmup: args.warmup,
            repeats,
            inputs: inputs.clone(),
            keep_outputs: true,
            ..RunOptions::default()
        };
        opsched_runtime::run_schedule(&dev, &g, s, &opts)
            .with_context(|| format!("running {} on the CPU", m.name))
    };
    eprintln!("{}: {} operators", m.name, g.op_count());
    let seq_schedule = schedule("sequential")?;
    // Pick the best scheduler by a short run, then measure it as long as sequential.
    let mut best: Option<(String, Schedule, f64)> = None;
    for algo in &args.algos {
        match schedule(algo).and_then(|s| measure(&s, args.repeats.min(5)).map(|r| (s, r))) {
            Ok((s, r)) => {
                eprintln!("  {algo}: {:.2} ms", r.latency.median_ms);
                if best.as_ref().is_none_or(|b| r.latency.median_ms < b.2) {
                    best = Some((algo.clone(), s, r.latency.median_ms));
                }
            }
            Err(e) => eprintln!("  {algo}: skipped ({e:#})"),
        }
    }
    let (best_algo, best_schedule, _) = best.context("no scheduler ran")?;
    // Rounds of sequential, best and onnxruntime side by side; each keeps its fastest round
    // (the machine may be shared: a burst of other work then spoils one round, not a column).
    let fastest = |a: Option<RunReport>, b: RunReport| match a {
        Some(a) if a.latency.median_ms <= b.latency.median_ms => a,
        _ => b,
    };
    let (mut seq, mut best_run, mut ort) = (None, None, None);
    let mut ort_missing = None;
    for _ in 0..args.rounds.max(1) {
        let s = measure(&seq_schedule, args.repeats)?;
        let b = measure(&best_schedule, args.repeats)?;
        // Once it failed (not installed, --no-ort), onnxruntime is not tried again.
        if ort_missing.is_none() {
            match onnxruntime(m, args, threads, &s) {
                Ok(o)
                    if ort
                        .as_ref()
                        .is_some_and(|x: &OrtResult| x.median_ms <= o.median_ms) => {}
                Ok(o) => ort = Some(o),
                Err(e) => ort_missing = Some(format!("{e:#}")),
            }
        }
        eprintln!(
            "  round: sequential {:.2} ms, {best_algo} {:.2} ms, onnxruntime {}",
            s.latency.median_ms,
            b.latency.median_ms,
            ort.as_ref()
                .map_or("-".into(), |o| format!("{:.2} ms", o.median_ms))
        );
        seq = Some(fastest(seq, s));
        best_run = Some(fastest(best_run, b));
    }
    if ort_missing.is_some() {
        ort = None;
    }
    let (seq, best_run) = (
        seq.context("no round ran")?,
        best_run.context("no round ran")?,
    );
    if let Some(e) = &ort_missing {
        eprintln!("  onnxruntime: not measured ({e})");
    }
    if let Some(o) = &ort {
        eprintln!(
            "  onnxruntime {}: outputs differ by {:.1e} (relative)",
            o.version, o.max_rel_err
        );
    }
    Ok(Row {
        model: m.name.clone(),
        operators: g.op_count(),
        sequential_ms: seq.latency.median_ms,
        best_ms: best_run.latency.median_ms,
        schedule_speedup: opsched::ratio(seq.latency.median_ms, best_run.latency.median_ms),
        best_algo,
        ratio: ort.as_ref().map(|o| {
            opsched::ratio(
                seq.latency.median_ms.min(best_run.latency.median_ms),
                o.median_ms,
            )
        }),
        ort,
        ort_missing,
    })
}

/// Run onnxruntime on the same file and inputs; its outputs are compared with `ours`.
fn onnxruntime(m: &Model, args: &Args, threads: usize, ours: &RunReport) -> Result<OrtResult> {
    if !args.ort {
        bail!("--no-ort");
    }
    let stem = m.name.replace('/', "_");
    let out = Path::new(WORK).join(format!("{stem}.ort.npz"));
    let run = Command::new("python3")
        .arg("xtask/cpu/ort_bench.py")
        .arg("--model")
        .arg(&m.onnx)
        .arg("--inputs")
        .arg(&m.inputs)
        .args(["--threads", &threads.to_string()])
        .args(["--warmup", &args.warmup.to_string()])
        .args(["--repeats", &args.repeats.to_string()])
        .arg("--out")
        .arg(&out)
        .output()
        .context("running python3 xtask/cpu/ort_bench.py")?;
    if !run.status.success() {
        let err = String::from_utf8_lossy(&run.stderr);
        let last = err.lines().last().unwrap_or("").trim();
        match run.status.code() {
            Some(3) => bail!("onnxruntime is not installed ({last})"),
            _ => bail!("ort_bench.py failed ({}): {last}", run.status),
        }
    }
    let stdout = String::from_utf8_lossy(&run.stdout);
    let line = stdout.lines().last().unwrap_or("");
    let v: serde_json::Value =
        serde_json::from_str(line).with_context(|| format!("parsing ort_bench.py's '{line}'"))?;
    let num = |k: &str| {
        v[k].as_f64()
            .with_context(|| format!("ort_bench.py gave no {k}"))
    };
    let theirs = npy::read_npz(&out)?;
    Ok(OrtResult {
        version: v["onnxruntime"].as_str().unwrap_or("?").to_string(),
        median_ms: num("median_ms")?,
        p10_ms: num("p10_ms")?,
        p90_ms: num("p90_ms")?,
        max_rel_err: max_rel_err(&ours.outputs, &theirs)?,
    })
}

/// max over outputs of max |a - b| / max |b|, outputs matched by name.
fn max_rel_err(ours: &[(String, Tensor)], theirs: &[(String, Tensor)]) -> Result<f64> {
    let mut worst = 0.0f64;
    for (name, t) in theirs {
        let (_, o) = ours
            .iter()
            .find(|(n, _)| n == name)
            .with_context(|| format!("we gave no output '{name}'"))?;
        if o.shape != t.shape {
            bail!(
                "output '{name}': ours {:?}, onnxruntime's {:?}",
                o.shape,
                t.shape
            );
        }
        let scale = t
            .data
            .iter()
            .fold(0.0f64, |m, &v| m.max(f64::from(v).abs()));
        let diff = o
            .data
            .iter()
            .zip(t.data.iter())
            .fold(0.0f64, |m, (&a, &b)| {
                m.max((f64::from(a) - f64::from(b)).abs())
            });
        worst = worst.max(opsched::ratio(diff, scale));
    }
    Ok(worst)
}

fn table(r: &Report) -> String {
    let mut s = format!(
        "CPU latency on {}, {} threads (ours and onnxruntime), batch as the model's inputs; \
         median of {} runs after {} warm-up runs, the fastest of {} rounds, ms\n\n",
        r.machine, r.threads, r.repeats, r.warmup, r.rounds
    );
    s.push_str(&format!(
        "{:<20} {:>5} {:>10} {:>10} {:>10} {:>8} {:>10} {:>8} {:>9}\n",
        "model", "ops", "sequential", "best", "schedule", "speedup", "ORT", "ours/ORT", "rel err"
    ));
    for row in &r.rows {
        let (ort, ratio, err) = match &row.ort {
            Some(o) => (
                format!("{:.2}", o.median_ms),
                row.ratio.map_or("-".into(), |x| format!("{x:.2}x")),
                format!("{:.1e}", o.max_rel_err),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        s.push_str(&format!(
            "{:<20} {:>5} {:>10.2} {:>10.2} {:>10} {:>7.2}x {:>10} {:>8} {:>9}\n",
            row.model,
            row.operators,
            row.sequential_ms,
            row.best_ms,
            row.best_algo,
            row.schedule_speedup,
            ort,
            ratio,
            err
        ));
    }
    let versions: Vec<&str> = r
        .rows
        .iter()
        .filter_map(|row| row.ort.as_ref().map(|o| o.version.as_str()))
        .collect();
    match versions.first() {
        Some(v) => s.push_str(&format!(
            "\nonnxruntime {v}: intra-op threads {}, operators one at a time. \"best\" is the \
             fastest of the schedules tried, speedup = sequential / best, ours/ORT = the faster of \
             sequential and best / onnxruntime; rel err = max |ours - \
             ORT| / max |ORT| over the outputs.\n",
            r.threads
        )),
        None => s.push_str(
            "\nonnxruntime: not measured (not installed, or --no-ort): our columns only.\n",
        ),
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn t(shape: &[usize], data: &[f32]) -> Tensor {
        Tensor::new(shape.to_vec(), data.to_vec()).unwrap()
    }

    #[test]
    fn relative_error_is_the_worst_output_by_name() {
        let theirs = vec![
            ("b".to_string(), t(&[2], &[10.0, -20.0])),
            ("a".to_string(), t(&[2], &[1.0, 2.0])),
        ];
        // Ours in another order: 'a' is off by 0.1 of its largest magnitude 2, 'b' by 1 of 20.
        let ours = vec![
            ("a".to_string(), t(&[2], &[1.0, 2.1])),
            ("b".to_string(), t(&[2], &[11.0, -20.0])),
        ];
        assert!((max_rel_err(&ours, &theirs).unwrap() - 0.05).abs() < 1e-12);
        let e = max_rel_err(&ours[..1], &theirs).unwrap_err();
        assert!(e.to_string().contains("no output 'b'"), "{e}");
        let reshaped = vec![
            ("a".to_string(), t(&[1, 2], &[1.0, 2.0])),
            ("b".to_string(), t(&[2], &[10.0, -20.0])),
        ];
        let e = max_rel_err(&reshaped, &theirs).unwrap_err();
        assert!(e.to_string().contains("output 'a'"), "{e}");
    }

    #[test]
    fn seeded_inputs_are_reproducible_and_in_range() {
        let a = seeded(1000, 0);
        assert_eq!(a, seeded(1000, 0));
        assert_ne!(a, seeded(1000, 1));
        assert!(a.iter().all(|v| (-1.0..1.0).contains(v)));
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        assert!(mean.abs() < 0.1, "mean {mean}");
    }

    #[test]
    fn the_table_says_when_onnxruntime_is_missing() {
        let row = |ort: Option<OrtResult>| Row {
            model: "m".into(),
            operators: 3,
            sequential_ms: 2.0,
            best_algo: "ios".into(),
            best_ms: 1.0,
            schedule_speedup: 2.0,
            ratio: ort.as_ref().map(|o| 1.0 / o.median_ms),
            ort,
            ort_missing: None,
        };
        let report = |rows| Report {
            machine: "cpu".into(),
            threads: 2,
            streams: 4,
            warmup: 1,
            repeats: 1,
            rounds: 1,
            rows,
        };
        let without = table(&report(vec![row(None)]));
        assert!(without.contains("our columns only"), "{without}");
        let ort = OrtResult {
            version: "1.0".into(),
            median_ms: 0.5,
            p10_ms: 0.5,
            p90_ms: 0.5,
            max_rel_err: 1e-7,
        };
        let with = table(&report(vec![row(Some(ort))]));
        assert!(
            with.contains("2.00x") && with.contains("onnxruntime 1.0"),
            "{with}"
        );
    }
}
