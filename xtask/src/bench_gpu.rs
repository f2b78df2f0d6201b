//! `cargo xtask bench-gpu`: in one run on one GPU, for Inception-v3, GoogLeNet, SqueezeNet and
//! ResNet-50 at batch 1 and 16, measure our sequential schedule and the best of our
//! schedulers, each eager and replayed as a CUDA graph, and PyTorch eager and CUDA-graph
//! replay of the torchvision architecture (`xtask/gpu/torch_bench.py` with the machine's
//! python3). Writes `fixtures/gpu/<device>.md`.
//!
//! Schedules are searched under the cost model of this GPU: the analytical preset matching its
//! name (`--cost analytical`, the default) or the measurements of the cost cache (`--cost
//! cache`, after `cargo xtask profile`). Each row also gives the speedup of the best schedule
//! over sequential that the cost model predicted (simulated) next to the measured one.
//!
//! Options: `cargo xtask bench-gpu --help`.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result};
use opsched::cost::{CostModel, DevicePreset};
use opsched::graph::DType;
use opsched::schedule::{Platform, Schedule};
use opsched::zoo::ZooConfig;
use opsched::{CostKind, SchedulerOptions};
use opsched_runtime::{CudaDevice, Device, RunOptions, RunReport};

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Writes fixtures/gpu/<device>.md (or under --out).\n\nExamples:\n  \
cargo xtask bench-gpu\n  cargo xtask bench-gpu --quick --models resnet50 --batches 1\n  \
cargo xtask bench-gpu --cost cache --no-torch"
)]
pub struct Args {
    /// Zoo models, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "inception_v3,googlenet,squeezenet,resnet50"
    )]
    models: Vec<String>,
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    batches: Vec<usize>,
    /// Timed runs per measurement.
    #[arg(long, value_name = "N", default_value_t = 100)]
    repeats: u32,
    /// Untimed runs before them.
    #[arg(long, value_name = "N", default_value_t = 20)]
    warmup: u32,
    /// Candidates for "best", comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ios,greedy,lios,opara,nimble,iops"
    )]
    algos: Vec<String>,
    /// Cost model schedules are searched under: analytical or cache.
    #[arg(long, value_name = "KIND", default_value = "analytical")]
    cost: CostKind,
    /// Cost cache file for `--cost cache` [default: the user's cache directory].
    #[arg(long, value_name = "PATH")]
    cache: Option<PathBuf>,
    /// Skip the PyTorch columns.
    #[arg(long = "no-torch", action = clap::ArgAction::SetFalse)]
    torch: bool,
    /// Repeats 20 and warmup 5 (overrides --repeats and --warmup).
    #[arg(long)]
    quick: bool,
    /// Output folder.
    #[arg(long, value_name = "DIR", default_value = "fixtures/gpu")]
    out: PathBuf,
}

/// One row of the table: a model at a batch size.
struct Row {
    model: String,
    batch: usize,
    seq: RunReport,
    seq_graph: RunReport,
    best_algo: String,
    best: RunReport,
    best_graph: RunReport,
    /// Sequential / best makespan simulated under the search's cost model.
    predicted_speedup: f64,
    torch_eager: Option<f64>,
    torch_graph: Option<f64>,
}

/// The platform and cost model schedules are searched under.
struct Search {
    platform: Platform,
    cost: Box<dyn CostModel>,
}

fn search(g: &opsched::Graph, preset: &DevicePreset, args: &Args) -> Result<Search> {
    let link = preset.default_link.clone();
    let cost = opsched::cost_model(args.cost, preset, &link, g, args.cache.as_deref())?;
    Ok(Search {
        platform: Platform {
            gpus: 1,
            streams: 8,
            device: preset.clone(),
            link,
        },
        cost,
    })
}

/// `algo`'s schedule of `g` and its simulated makespan under the search's cost model.
fn schedule_of(g: &opsched::Graph, algo: &str, s: &Search) -> Result<(Schedule, f64)> {
    let sched = opsched::scheduler_with(algo, &SchedulerOptions::default())?;
    let (schedule, _) = sched
        .schedule(g, &s.platform, s.cost.as_ref())
        .with_context(|| format!("{algo} on {}", g.name))?;
    let simulated = opsched::evaluate(g, &schedule, s.cost.as_ref(), 1)?.makespan_ms;
    Ok((schedule, simulated))
}

fn run_once(
    dev: &CudaDevice,
    g: &opsched::Graph,
    schedule: &Schedule,
    capture: bool,
    args: &Args,
    repeats: u32,
) -> Result<RunReport> {
    let opts = RunOptions {
        graph_capture: capture,
        warmup: args.warmup,
        repeats,
        ..Default::default()
    };
    opsched_runtime::run_schedule(dev, g, schedule, &opts)
        .with_context(|| format!("running {} (graph capture {capture})", g.name))
}

fn torch(args: &Args) -> Result<Option<serde_json::Value>> {
    if !args.torch {
        return Ok(None);
    }
    let out = std::env::temp_dir().join(format!("opsched-torch-{}.json", std::process::id()));
    let status = Command::new("python3")
        .arg("xtask/gpu/torch_bench.py")
        .args(["--models", &args.models.join(",")])
        .args([
            "--batches",
            &args
                .batches
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ])
        .args(["--warmup", &args.warmup.to_string()])
        .args(["--repeats", &args.repeats.to_string()])
        .arg("--out")
        .arg(&out)
        .status()
        .context("running python3 xtask/gpu/torch_bench.py")?;
    if !status.success() {
        eprintln!("bench-gpu: the PyTorch baseline failed ({status}); its columns are left empty");
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
    let _ = std::fs::remove_file(&out);
    Ok(Some(
        serde_json::from_str(&text).context("parsing the PyTorch results")?,
    ))
}

fn torch_ms(t: &Option<serde_json::Value>, model: &str, batch: usize, mode: &str) -> Option<f64> {
    t.as_ref()?["results"].as_array()?.iter().find_map(|r| {
        (r["model"] == model && r["batch"] == batch && r["mode"] == mode)
            .then(|| r["median_ms"].as_f64())
            .flatten()
    })
}

fn ms(r: &RunReport) -> String {
    format!(
        "{:.3} ({:.3}-{:.3})",
        r.latency.median_ms, r.latency.p10_ms, r.latency.p90_ms
    )
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |x| format!("{x:.3}"))
}

pub fn bench_gpu(mut args: Args) -> Result<()> {
    if args.quick {
        args.repeats = 20;
        args.warmup = 5;
    }
    let dev = CudaDevice::open(Some(1))
        .map_err(|e| anyhow::anyhow!("bench-gpu needs a CUDA GPU: {e}"))?;
    let info = dev.report();
    let sms = opsched_gpu::devices()?.first().map_or(0, |d| d.sms);
    let preset = DevicePreset::for_device_name(&info.name).unwrap_or_else(|| {
        eprintln!(
            "bench-gpu: no preset matches '{}'; searching under h100",
            info.name
        );
        opsched::cost::DevicePreset::all()
            .iter()
            .find(|d| d.name == "h100")
            .cloned()
            .unwrap_or_else(|| opsched::cost::DevicePreset::all()[0].clone())
    });
    eprintln!(
        "bench-gpu on {} (driver {}, {}); schedules searched under {} ({})",
        info.name, info.driver, info.libraries, preset.name, args.cost
    );
    let mut rows = Vec::new();
    for model in &args.models {
        for &batch in &args.batches {
            let cfg = ZooConfig {
                batch,
                input_size: None,
                dtype: DType::F32,
            };
            let g = opsched::load_model(model, &cfg)?;
            eprintln!("{model} batch {batch}: {} operators", g.op_count());
            let sr = search(&g, &preset, &args)?;
            let (seq_schedule, seq_sim) = schedule_of(&g, "sequential", &sr)?;
            let seq = run_once(&dev, &g, &seq_schedule, false, &args, args.repeats)?;
            let seq_graph = run_once(&dev, &g, &seq_schedule, true, &args, args.repeats)?;
            // Pick the best scheduler by a short measured run, then measure it fully.
            let mut best: Option<(String, Schedule, f64, f64)> = None;
            for algo in &args.algos {
                let tried = schedule_of(&g, algo, &sr).and_then(|(s, sim)| {
                    run_once(&dev, &g, &s, false, &args, args.repeats.min(20)).map(|r| (s, sim, r))
                });
                match tried {
                    Ok((s, sim, r)) => {
                        eprintln!(
                            "  {algo}: {:.3} ms measured, {sim:.3} ms simulated",
                            r.latency.median_ms
                        );
                        if best.as_ref().is_none_or(|b| r.latency.median_ms < b.3) {
                            best = Some((algo.clone(), s, sim, r.latency.median_ms));
                        }
                    }
                    Err(e) => eprintln!("  {algo}: skipped ({e:#})"),
                }
            }
            let (best_algo, best_schedule, best_sim, _) = best.context("no scheduler ran")?;
            let best = run_once(&dev, &g, &best_schedule, false, &args, args.repeats)?;
            let best_graph = run_once(&dev, &g, &best_schedule, true, &args, args.repeats)?;
            rows.push(Row {
                model: model.clone(),
                batch,
                seq,
                seq_graph,
                best_algo,
                best,
                best_graph,
                predicted_speedup: opsched::ratio(seq_sim, best_sim),
                torch_eager: None,
                torch_graph: None,
            });
        }
    }
    let t = torch(&args)?;
    for r in &mut rows {
        r.torch_eager = torch_ms(&t, &r.model, r.batch, "eager");
        r.torch_graph = torch_ms(&t, &r.model, r.batch, "cuda_graph");
    }
    let mut md = String::new();
    md.push_str(&format!("# GPU latency on {}\n\n", info.name));
    md.push_str(&format!(
        "Driver API {}, {}, {} SMs; opsched {} (cudarc 0.19, TF32 in convolutions and matrix products); ",
        info.driver,
        info.libraries,
        sms,
        env!("CARGO_PKG_VERSION")
    ));
    match &t {
        Some(v) => md.push_str(&format!(
            "PyTorch {} (torchvision {}, CUDA {}, cuDNN {}, allow_tf32 {}).\n\n",
            v["torch"], v["torchvision"], v["cuda"], v["cudnn"], v["allow_tf32"]
        )),
        None => md.push_str("PyTorch: not measured.\n\n"),
    }
    md.push_str(&format!(
        "Median latency in ms (p10-p90 for ours) over {} runs after {} warm-up runs, one GPU, \
         random weights, f32. \"best\" is the fastest of {} measured on this GPU; schedules \
         are searched under the {} cost model of the {} preset with 8 streams. \"predicted\" is \
         the best schedule's simulated speedup over sequential under that model, \"measured\" \
         the ratio of the eager medians.\n\n",
        args.repeats,
        args.warmup,
        args.algos.join(", "),
        args.cost,
        preset.name
    ));
    md.push_str("| model | batch | ours sequential | ours sequential + graph | best | ours best | ours best + graph | speedup predicted | speedup measured | PyTorch eager | PyTorch graph |\n");
    md.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in &rows {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.2}x | {:.2}x | {} | {} |\n",
            r.model,
            r.batch,
            ms(&r.seq),
            ms(&r.seq_graph),
            r.best_algo,
            ms(&r.best),
            ms(&r.best_graph),
            r.predicted_speedup,
            opsched::ratio(r.seq.latency.median_ms, r.best.latency.median_ms),
            opt(r.torch_eager),
            opt(r.torch_graph)
        ));
    }
    md.push_str(
        "\nOur SqueezeNet is IOS's variant (fire modules with bypass sums); PyTorch runs \
         torchvision's squeezenet1_0. Inception-v3 and GoogLeNet run without auxiliary heads.\n",
    );
    std::fs::create_dir_all(&args.out)?;
    let path = args
        .out
        .join(format!("{}.md", opsched_gpu::discovery::slug(&info.name)));
    eprintln!("{}", opsched::io::write(&path, md.as_bytes())?);
    Ok(())
}
