//! `cargo xtask bench-gpu`: in one run on one GPU, for Inception-v3, GoogLeNet, SqueezeNet and
//! ResNet-50 at batch 1 and 16, measure our sequential schedule and the best of our
//! schedulers, each eager and replayed as a CUDA graph, and PyTorch eager and CUDA-graph
//! replay of the torchvision architecture (`xtask/gpu/torch_bench.py` with the machine's
//! python3). Writes `fixtures/gpu/<device>.md`.
//!
//! Options: `--models a,b` `--batches 1,16` `--repeats N` (default 100) `--warmup N` (20)
//! `--algos a,b` (candidates for "best", default ios,greedy,lios,opara,nimble,iops)
//! `--no-torch` `--quick` (repeats 20, warmup 5) `--out DIR` (default fixtures/gpu).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};
use opsched::cost::{AnalyticalModel, DevicePreset, LinkPreset};
use opsched::graph::DType;
use opsched::schedule::Platform;
use opsched::zoo::ZooConfig;
use opsched::SchedulerOptions;
use opsched_runtime::{RunOptions, RunReport};

struct Args {
    models: Vec<String>,
    batches: Vec<usize>,
    repeats: u32,
    warmup: u32,
    algos: Vec<String>,
    torch: bool,
    out: PathBuf,
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn parse(args: &[String]) -> Result<Args> {
    let mut a = Args {
        models: list("inception_v3,googlenet,squeezenet,resnet50"),
        batches: vec![1, 16],
        repeats: 100,
        warmup: 20,
        algos: list("ios,greedy,lios,opara,nimble,iops"),
        torch: true,
        out: PathBuf::from("fixtures/gpu"),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut val = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--models" => a.models = list(val()?),
            "--batches" => {
                a.batches = list(val()?)
                    .iter()
                    .map(|b| b.parse().with_context(|| format!("bad batch '{b}'")))
                    .collect::<Result<_>>()?
            }
            "--repeats" => a.repeats = val()?.parse().context("--repeats")?,
            "--warmup" => a.warmup = val()?.parse().context("--warmup")?,
            "--algos" => a.algos = list(val()?),
            "--out" => a.out = PathBuf::from(val()?),
            "--no-torch" => a.torch = false,
            "--quick" => {
                a.repeats = 20;
                a.warmup = 5;
            }
            other => bail!("bench-gpu: unknown option '{other}'"),
        }
    }
    Ok(a)
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
    torch_eager: Option<f64>,
    torch_graph: Option<f64>,
}

fn run_once(
    g: &opsched::Graph,
    algo: &str,
    capture: bool,
    args: &Args,
    repeats: u32,
) -> Result<RunReport> {
    let cost = AnalyticalModel::new(
        DevicePreset::by_name("h100")?,
        LinkPreset::by_name("nvlink4")?,
    );
    let platform = Platform {
        gpus: 1,
        streams: 8,
        device: DevicePreset::by_name("h100")?,
        link: LinkPreset::by_name("nvlink4")?,
    };
    let s = opsched::scheduler_with(algo, &SchedulerOptions::default())?;
    let (schedule, _) = s
        .schedule(g, &platform, &cost)
        .with_context(|| format!("{algo} on {}", g.name))?;
    let opts = RunOptions {
        graph_capture: capture,
        gpus: Some(1),
        warmup: args.warmup,
        repeats,
        ..Default::default()
    };
    opsched_runtime::run_schedule(g, &schedule, &opts)
        .with_context(|| format!("running {algo} on {} (graph capture {capture})", g.name))
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

pub fn bench_gpu(args: &[String]) -> Result<()> {
    let args = parse(args)?;
    let gpus = opsched_runtime::open_gpus(Some(1))
        .map_err(|e| anyhow::anyhow!("bench-gpu needs a CUDA GPU: {e}"))?;
    let info = gpus[0].info.clone();
    drop(gpus);
    eprintln!(
        "bench-gpu on {} (driver {}, cuDNN {})",
        info.name, info.driver, info.cudnn
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
            let seq = run_once(&g, "sequential", false, &args, args.repeats)?;
            let seq_graph = run_once(&g, "sequential", true, &args, args.repeats)?;
            // Pick the best scheduler by a short measured run, then measure it fully.
            let mut best: Option<(String, f64)> = None;
            for algo in &args.algos {
                match run_once(&g, algo, false, &args, args.repeats.min(20)) {
                    Ok(r) => {
                        eprintln!("  {algo}: {:.3} ms", r.latency.median_ms);
                        if best.as_ref().is_none_or(|b| r.latency.median_ms < b.1) {
                            best = Some((algo.clone(), r.latency.median_ms));
                        }
                    }
                    Err(e) => eprintln!("  {algo}: skipped ({e:#})"),
                }
            }
            let (best_algo, _) = best.context("no scheduler ran")?;
            let best = run_once(&g, &best_algo, false, &args, args.repeats)?;
            let best_graph = run_once(&g, &best_algo, true, &args, args.repeats)?;
            rows.push(Row {
                model: model.clone(),
                batch,
                seq,
                seq_graph,
                best_algo,
                best,
                best_graph,
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
        "Driver API {}, cuDNN {}, {} SMs; opsched {} (cudarc 0.19, cuDNN conv TF32 allowed, cuBLAS f32); ",
        info.driver,
        info.cudnn,
        info.sms,
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
         are searched under the analytical H100 model with 8 streams.\n\n",
        args.repeats,
        args.warmup,
        args.algos.join(", ")
    ));
    md.push_str("| model | batch | ours sequential | ours sequential + graph | best | ours best | ours best + graph | PyTorch eager | PyTorch graph |\n");
    md.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for r in &rows {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.model,
            r.batch,
            ms(&r.seq),
            ms(&r.seq_graph),
            r.best_algo,
            ms(&r.best),
            ms(&r.best_graph),
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
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
