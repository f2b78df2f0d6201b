//! `cargo xtask bench-gpu`: the GPU scoreboard (issue #14). For every model and batch it
//! searches the schedules once (sequential and `--algos`, under the cost model of this GPU),
//! saves each as a schedule file, and runs every file in `--processes` separate `opsched run
//! --schedule FILE --graph-capture --json` processes: the user's own command, so the scoreboard
//! measures what users run, and every process runs the identical plan. Schedules are ranked by
//! the median of the per-process CUDA-graph medians; the spread (max/min - 1) says how far the
//! processes disagree. On the same GPU in the same run, `xtask/gpu/torch_bench.py` measures
//! PyTorch eager, CUDA graph and torch.compile in as many processes ([`torch`]).
//!
//! The table is written after each model (a run cut short keeps the models it finished), as
//! `<out>/<device>.json` for scripts and `<out>/<device>.md` for people ([`board`]);
//! `--merge` keeps the rows of an earlier run of the same setup that this one did not measure
//! again, so a long scoreboard can be measured a few models at a time.
//!
//! `--backend cpu` runs the whole pipeline on the CPU device (PyTorch skipped): a rehearsal for
//! machines without a GPU. Options: `cargo xtask bench-gpu --help`.

mod board;
mod torch;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use opsched::cost::{DevicePreset, Layout};
use opsched::graph::DType;
use opsched::schedule::Platform;
use opsched::zoo::ZooConfig;
use opsched::{CostKind, SchedulerOptions};
use opsched_runtime::Device;
use serde::Deserialize;

use board::{Header, Row, ScheduleResult, Scoreboard};
use torch::TorchRun;

/// Streams per GPU the schedules are searched for (and run with).
const STREAMS: usize = 8;

/// Zoo models PyTorch has no counterpart of (`torch_bench.py` skips them too): no PyTorch
/// process is started for them.
const OURS_ONLY: &[&str] = &["randwire"];

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Writes <out>/<device>.json and <out>/<device>.md, <device> being the \
GPU's name as a file name (nvidia-h100-80gb-hbm3). The default --out is the committed \
fixtures/gpu: a run replaces that device's committed table (that is what it is for); --merge \
keeps the rows this run does not measure again. The table is rewritten after every model.\n\n\
Runs `opsched` (built next to this xtask; `cargo xtask` builds it), whose processes share \
the cuDNN choices kept in the cost cache ($OPSCHED_CACHE, else the user's cache directory; the \
first process times what is missing), and, unless --no-torch, python3 with torch, torchvision \
and, for NASNet, timm.\n\nExamples:\n  \
cargo xtask bench-gpu\n  cargo xtask bench-gpu --models inception_v3,googlenet\n  \
cargo xtask bench-gpu --models nasnet --merge\n  \
cargo xtask bench-gpu --backend cpu --models squeezenet --batches 1 --repeats 3 --warmup 1 \
--out /tmp/board"
)]
pub struct Args {
    /// Zoo models, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = board::MODELS
    )]
    models: Vec<String>,
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16",
          value_parser = clap::value_parser!(u32).range(1..))]
    batches: Vec<u32>,
    /// Separate processes every configuration runs in (ours and PyTorch's).
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..))]
    processes: u32,
    /// Timed CUDA-graph replays per process (its median is the process's result).
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..))]
    repeats: u32,
    /// Untimed replays before them.
    #[arg(long, value_name = "N", default_value_t = 20)]
    warmup: u32,
    /// Candidates for "best" besides sequential, comma-separated.
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
    /// Device preset the schedules are searched for [default: the one matching the GPU's
    /// name, else h100].
    #[arg(long, value_name = "NAME")]
    preset: Option<String>,
    /// Where our runs execute: cuda, or cpu to rehearse the pipeline without a GPU (PyTorch
    /// is then skipped).
    #[arg(long, value_enum, default_value_t = BackendArg::Cuda)]
    backend: BackendArg,
    /// The cuDNN kernels our convolutions choose among (`opsched run --conv-api`).
    #[arg(long, value_enum, default_value_t = ConvApiArg::Both)]
    conv_api: ConvApiArg,
    /// Whether 1x1 convolutions may run as cuBLAS's product (`opsched run --conv-gemm`).
    #[arg(long, value_enum, default_value_t = ConvGemmArg::Off)]
    conv_gemm: ConvGemmArg,
    /// How matrix products choose their kernel (`opsched run --gemm`).
    #[arg(long, value_enum, default_value_t = GemmArg::Measured)]
    gemm: GemmArg,
    /// How our activations are stored (`opsched run --layout`; `auto`: channels last on
    /// CUDA, NCHW on the CPU, as `opsched run` chooses; the header records which).
    #[arg(long, value_enum, default_value_t = LayoutArg::Auto)]
    layout: LayoutArg,
    /// Fusions our runs leave out (`opsched run --no-fusion`, repeat; the header records
    /// them).
    #[arg(long, value_name = "NAME", value_parser = fusion_names())]
    no_fusion: Vec<String>,
    /// Skip the PyTorch columns.
    #[arg(long = "no-torch", action = clap::ArgAction::SetFalse)]
    torch: bool,
    /// The Python that has torch.
    #[arg(long, value_name = "PATH", default_value = "python3")]
    python: PathBuf,
    /// The opsched binary [default: the one next to this xtask].
    #[arg(long, value_name = "PATH")]
    opsched: Option<PathBuf>,
    /// Keep the rows of the existing table that this run does not measure (same device,
    /// driver, cuDNN, PyTorch and method, else an error).
    #[arg(long)]
    merge: bool,
    /// Output folder.
    #[arg(long, value_name = "DIR", default_value = "fixtures/gpu")]
    out: PathBuf,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum BackendArg {
    Cuda,
    Cpu,
}

impl BackendArg {
    fn name(self) -> &'static str {
        match self {
            BackendArg::Cuda => "cuda",
            BackendArg::Cpu => "cpu",
        }
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ConvApiArg {
    Both,
    Legacy,
    Backend,
}

impl ConvApiArg {
    fn name(self) -> &'static str {
        match self {
            ConvApiArg::Both => "both",
            ConvApiArg::Legacy => "legacy",
            ConvApiArg::Backend => "backend",
        }
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ConvGemmArg {
    Off,
    Timed,
    Always,
}

impl ConvGemmArg {
    fn name(self) -> &'static str {
        match self {
            ConvGemmArg::Off => "off",
            ConvGemmArg::Timed => "timed",
            ConvGemmArg::Always => "always",
        }
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum GemmArg {
    Measured,
    Heuristic,
}

impl GemmArg {
    fn name(self) -> &'static str {
        match self {
            GemmArg::Measured => "measured",
            GemmArg::Heuristic => "heuristic",
        }
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LayoutArg {
    Auto,
    Nchw,
    Nhwc,
}

/// The names `--no-fusion` takes (`opsched_graph::fusion::Fusions::NAMES`).
fn fusion_names() -> clap::builder::PossibleValuesParser {
    opsched::graph::fusion::Fusions::NAMES
        .iter()
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .into()
}

impl Args {
    /// The fusions left out, each once, in `Fusions::NAMES`' order (the header's field).
    fn fusions_left_out(&self) -> Vec<String> {
        opsched::graph::fusion::Fusions::NAMES
            .iter()
            .filter(|(name, _)| self.no_fusion.iter().any(|f| f == name))
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// The layout our runs store activations in: `--layout`, where `auto` is the backend's
    /// own (`opsched_gpu::Device::preferred_layout`).
    fn layout(&self) -> Layout {
        match (self.layout, self.backend) {
            (LayoutArg::Nchw, _) | (LayoutArg::Auto, BackendArg::Cpu) => Layout::Nchw,
            (LayoutArg::Nhwc, _) | (LayoutArg::Auto, BackendArg::Cuda) => Layout::Nhwc,
        }
    }
}

/// The machine our runs execute on and how schedules are searched, as known before any run.
struct Setup {
    name: String,
    driver: String,
    cudnn: String,
    /// The search's device preset, and a note when it was a guess.
    preset: DevicePreset,
    preset_note: Option<String>,
    /// The candidates for "best" after sequential (`--algos` without it).
    algos: Vec<String>,
}

fn setup(args: &Args) -> Result<Setup> {
    let (name, driver, cudnn) = match args.backend {
        BackendArg::Cuda => {
            let d = opsched_gpu::devices()
                .map_err(|e| anyhow::anyhow!("bench-gpu needs a CUDA GPU (or --backend cpu): {e}"))?
                .into_iter()
                .next()
                .context("bench-gpu: the driver lists no GPU")?;
            (d.name, d.driver, d.cudnn)
        }
        BackendArg::Cpu => {
            let r = opsched_runtime::CpuDevice::with_race_check(false).report();
            (r.name, r.driver, String::new())
        }
    };
    let presets = DevicePreset::all();
    let (preset, preset_note) = match &args.preset {
        Some(p) => (
            presets
                .iter()
                .find(|d| d.name == p.as_str())
                .cloned()
                .with_context(|| {
                    let names: Vec<&str> = presets.iter().map(|d| d.name).collect();
                    format!("--preset {p}: no such preset ({})", names.join(", "))
                })?,
            None,
        ),
        None => match DevicePreset::for_device_name(&name) {
            Some(d) => (d, None),
            None => (
                presets
                    .iter()
                    .find(|d| d.name == "h100")
                    .cloned()
                    .context("the h100 preset is missing")?,
                Some(format!("no preset matches '{name}'")),
            ),
        },
    };
    Ok(Setup {
        name,
        driver,
        cudnn,
        preset,
        preset_note,
        algos: args
            .algos
            .iter()
            .filter(|a| *a != "sequential")
            .cloned()
            .collect(),
    })
}

/// The `opsched` binary the processes run: `--opsched`, else the one next to this xtask,
/// built first when cargo runs us (a no-op when it is up to date).
fn opsched_binary(args: &Args) -> Result<PathBuf> {
    if let Some(p) = &args.opsched {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe().context("locating the xtask binary")?;
    let dir = exe.parent().context("the xtask binary has no folder")?;
    if let Ok(cargo) = std::env::var("CARGO") {
        let mut build = Command::new(&cargo);
        build.args(["build", "--quiet", "-p", "opsched-cli", "--bin", "opsched"]);
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        let status = build
            .status()
            .with_context(|| format!("running {cargo} build -p opsched-cli"))?;
        if !status.success() {
            bail!("building opsched failed");
        }
    }
    let bin = dir.join(format!("opsched{}", std::env::consts::EXE_SUFFIX));
    if !bin.is_file() {
        bail!(
            "{}: no opsched binary next to xtask (build it with `cargo build --release -p \
             opsched-cli`, or give --opsched PATH)",
            bin.display()
        );
    }
    Ok(bin)
}

/// The command that ran, for the header.
fn command_line(flags: &[String]) -> String {
    let quoted = flags.iter().map(|f| {
        if !f.is_empty()
            && f.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_=,./:+@".contains(c))
        {
            f.clone()
        } else {
            format!("'{}'", f.replace('\'', r"'\''"))
        }
    });
    std::iter::once("cargo xtask bench-gpu".to_string())
        .chain(quoted)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A folder of this run's files (schedules, PyTorch outputs, the inductor cache), removed when
/// the run ends.
struct WorkDir(PathBuf);

impl WorkDir {
    fn new() -> Result<WorkDir> {
        let dir = std::env::temp_dir().join(format!("opsched-bench-gpu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(WorkDir(dir))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One schedule of one model at one batch, while its processes run.
struct Candidate {
    algo: String,
    /// The saved schedule (None when the search failed).
    file: Option<PathBuf>,
    simulated_ms: Option<f64>,
    per_process_ms: Vec<f64>,
    memory_mb: Option<f64>,
    error: Option<String>,
}

impl Candidate {
    fn result(self) -> ScheduleResult {
        let graph = match self.error {
            None => board::Aggregate::of(&self.per_process_ms),
            Some(_) => None,
        };
        ScheduleResult {
            algo: self.algo,
            simulated_ms: self.simulated_ms.map(board::round6),
            graph,
            memory_mb: self.memory_mb.map(board::round6),
            error: self.error,
        }
    }
}

/// Search sequential and every `--algos` entry for `g` under the machine's preset, save each
/// schedule into `dir`. A scheduler that fails is a candidate with its error. Also the name of
/// the cost model they were searched under.
fn search(
    g: &opsched::Graph,
    m: &Setup,
    args: &Args,
    dir: &Path,
) -> Result<(Vec<Candidate>, String)> {
    let link = m.preset.default_link.clone();
    // Measured costs (`--cost cache`) answer in the layout our runs store activations in.
    let spec = opsched::CostSpec {
        cache: args.cache.clone(),
        layout: Some(args.layout()),
        ..opsched::CostSpec::default()
    };
    let cost = opsched::cost_model_with(args.cost, &m.preset, &link, g, &spec)?.model;
    let cost_name = cost.name();
    let platform = Platform {
        gpus: 1,
        streams: STREAMS,
        device: m.preset.clone(),
        link,
    };
    let mut out = Vec::with_capacity(1 + m.algos.len());
    for algo in std::iter::once("sequential".to_string()).chain(m.algos.iter().cloned()) {
        let file = dir.join(format!("{}-{algo}.json", g.name));
        let found = opsched::scheduler_with(&algo, &SchedulerOptions::default())
            .and_then(|s| Ok(s.schedule(g, &platform, cost.as_ref())?.0))
            .and_then(|s| {
                let sim = opsched::evaluate(g, &s, cost.as_ref(), 1)?.makespan_ms;
                opsched::schedule::io::save(g, &s, &file)?;
                Ok(sim)
            });
        out.push(match found {
            Ok(sim) => Candidate {
                algo,
                file: Some(file),
                simulated_ms: Some(sim),
                per_process_ms: Vec::new(),
                memory_mb: None,
                error: None,
            },
            Err(e) => Candidate {
                algo,
                file: None,
                simulated_ms: None,
                per_process_ms: Vec::new(),
                memory_mb: None,
                error: Some(format!("search failed: {}", one_line(&format!("{e:#}")))),
            },
        });
    }
    Ok((out, cost_name))
}

/// What we read of `opsched run --json`.
#[derive(Deserialize)]
struct RunJson {
    device: RunDevice,
    graph_capture: bool,
    latency: RunLatency,
    /// Device memory of the plan's buffers after the memory plan (in-place concatenation,
    /// storage shared under the schedule's order); cuDNN workspaces not included.
    peak_memory_bytes: u64,
    /// The numerical check, where the process ran with `--check`.
    #[serde(default)]
    check: Option<RunCheck>,
}

#[derive(Deserialize)]
struct RunCheck {
    passed: bool,
}

#[derive(Deserialize)]
struct RunDevice {
    name: String,
    libraries: String,
}

#[derive(Deserialize)]
struct RunLatency {
    median_ms: f64,
    samples: u64,
}

/// One process's result.
#[derive(Debug)]
struct Measured {
    median_ms: f64,
    /// Peak device memory, MB (10^6 bytes).
    memory_mb: f64,
    device: String,
    libraries: String,
}

/// Parse one process's `--json` output of `runs` schedules (one report, or an array of them
/// for several), checking it is what was asked for.
fn parse_runs(stdout: &[u8], runs: usize, repeats: u32) -> Result<Vec<Measured>> {
    let reports: Vec<RunJson> = match runs {
        1 => vec![serde_json::from_slice(stdout).context("its output is not a run report")?],
        _ => serde_json::from_slice(stdout).context("its output is not an array of reports")?,
    };
    if reports.len() != runs {
        bail!("it reported {} runs, expected {runs}", reports.len());
    }
    reports.into_iter().map(|r| measured(r, repeats)).collect()
}

/// One report's figures, checked.
fn measured(r: RunJson, repeats: u32) -> Result<Measured> {
    if !r.graph_capture || r.latency.samples != u64::from(repeats) {
        bail!(
            "it reported graph_capture {} and {} samples, expected true and {repeats}",
            r.graph_capture,
            r.latency.samples
        );
    }
    if r.check.as_ref().is_some_and(|c| !c.passed) {
        bail!("its outputs failed the check");
    }
    Ok(Measured {
        median_ms: r.latency.median_ms,
        memory_mb: r.peak_memory_bytes as f64 / 1e6,
        device: r.device.name,
        libraries: r.device.libraries,
    })
}

/// The first line of an error text, shortened: table cells and notes are one line.
fn one_line(text: &str) -> String {
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    line.chars().take(300).collect()
}

/// The last line a failed process wrote on stderr: its error (both programs end with one).
fn last_line(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    one_line(
        text.lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message"),
    )
}

/// One `opsched run` process of saved schedules, run one after another in it; with `check`,
/// each one's outputs checked after its timing (a failed check fails the process).
fn run_process(
    bin: &Path,
    model: &str,
    batch: u32,
    files: &[&Path],
    check: bool,
    args: &Args,
) -> Result<Vec<Measured>> {
    let mut cmd = Command::new(bin);
    cmd.args(["run", model, "--batch", &batch.to_string()]);
    for f in files {
        cmd.arg("--schedule").arg(f);
    }
    if check {
        cmd.arg("--check");
    }
    let out = cmd
        .args(["--backend", args.backend.name(), "--graph-capture"])
        .args(["--conv-api", args.conv_api.name()])
        .args(["--conv-gemm", args.conv_gemm.name()])
        .args(["--gemm", args.gemm.name()])
        .args(["--layout", &args.layout().to_string()])
        .args(
            args.no_fusion
                .iter()
                .flat_map(|f| ["--no-fusion", f.as_str()]),
        )
        .args(["--streams", &STREAMS.to_string()])
        .args(["--warmup", &args.warmup.to_string()])
        .args(["--repeats", &args.repeats.to_string(), "--json"])
        .output()
        .with_context(|| format!("starting {}", bin.display()))?;
    if !out.status.success() {
        bail!("{} ({})", last_line(&out.stderr), out.status);
    }
    parse_runs(&out.stdout, files.len(), args.repeats)
}

/// What the PyTorch script gave for one model.
enum TorchOutcome {
    /// One run per process, in order.
    Runs(Vec<TorchRun>),
    /// PyTorch cannot run here at all (no torch, no GPU, no python: the reason).
    Unavailable(String),
    /// Not asked for (`--no-torch`, the CPU backend), or unavailable since an earlier model.
    NotAsked,
    /// It failed for this model (the reason).
    Failed(String),
}

/// The PyTorch side of `model`: one run of the script per process.
fn torch_runs(args: &Args, model: &str, dir: &Path, bar: &indicatif::ProgressBar) -> TorchOutcome {
    let batches: Vec<String> = args.batches.iter().map(u32::to_string).collect();
    let mut runs = Vec::with_capacity(args.processes as usize);
    for p in 1..=args.processes {
        bar.set_message(format!("{model} PyTorch (process {p}/{})", args.processes));
        let out = dir.join(format!("torch-{model}-{p}.json"));
        let done = Command::new(&args.python)
            .arg("xtask/gpu/torch_bench.py")
            .args(["--models", model, "--batches", &batches.join(",")])
            .args(["--warmup", &args.warmup.to_string()])
            .args(["--repeats", &args.repeats.to_string()])
            .arg("--out")
            .arg(&out)
            // One cache per bench run: the first process compiles cold, the later reuse it.
            .env("TORCHINDUCTOR_CACHE_DIR", dir.join("inductor"))
            .output();
        bar.inc(1);
        let done = match done {
            Ok(d) => d,
            Err(e) => {
                let why = format!("cannot start {}: {e}", args.python.display());
                return TorchOutcome::Unavailable(why);
            }
        };
        if !done.status.success() {
            let why = last_line(&done.stderr);
            // Exit 3: torch, torchvision or a CUDA device is missing (the script's contract).
            return match done.status.code() {
                Some(3) => TorchOutcome::Unavailable(why),
                _ => TorchOutcome::Failed(format!(
                    "torch_bench.py failed in process {p} ({}): {why}",
                    done.status
                )),
            };
        }
        let parsed = std::fs::read_to_string(&out)
            .with_context(|| out.display().to_string())
            .and_then(|text| TorchRun::parse(&text, &out.display().to_string()));
        match parsed {
            Ok(run) => runs.push(run),
            Err(e) => return TorchOutcome::Failed(format!("{e:#}")),
        }
    }
    TorchOutcome::Runs(runs)
}

/// Every saved schedule of `model` (per batch) in `--processes` processes each, in rounds:
/// process p of every configuration before process p + 1 of any, so a drift of the machine
/// over time spreads over all of them alike. The first round checks each schedule's outputs
/// (after its timing, so the figures are alike): a schedule that computes something else
/// gets no figure. One process runs all of a batch's schedules of a
/// round one after another (a process's start, the model's weights and the cuDNN handles cost
/// more than a schedule's replays); if it fails, each runs in a process of its own, and a
/// failed process ends its configuration (the error is kept). The header learns the device's
/// libraries from the first report.
fn run_rounds(
    bin: &Path,
    model: &str,
    per_batch: &mut [(u32, Vec<Candidate>)],
    args: &Args,
    m: &Setup,
    header: &mut Header,
    bar: &indicatif::ProgressBar,
) -> Result<()> {
    for p in 1..=args.processes {
        for (batch, cands) in per_batch.iter_mut() {
            let live: Vec<usize> = (0..cands.len())
                .filter(|&i| cands[i].file.is_some() && cands[i].error.is_none())
                .collect();
            bar.set_message(format!(
                "{model} b{batch}: {} schedules (process {p}/{})",
                live.len(),
                args.processes
            ));
            let files: Vec<&Path> = live
                .iter()
                .filter_map(|&i| cands[i].file.as_deref())
                .collect();
            let together = match files.len() {
                0 | 1 => None,
                _ => run_process(bin, model, *batch, &files, p == 1, args)
                    .map_err(|e| say(bar, format!("{model} b{batch}: {e:#}; one process each")))
                    .ok(),
            };
            let results: Vec<Result<Measured>> = match together {
                Some(all) => all.into_iter().map(Ok).collect(),
                None => files
                    .iter()
                    .map(|&f| {
                        run_process(bin, model, *batch, &[f], p == 1, args).map(|mut v| v.remove(0))
                    })
                    .collect(),
            };
            bar.inc(cands.len() as u64);
            for (&i, r) in live.iter().zip(results) {
                let c = &mut cands[i];
                match r {
                    Ok(r) => {
                        if r.device != m.name {
                            bail!("opsched ran on '{}', not on '{}'", r.device, m.name);
                        }
                        if header.libraries.is_empty() {
                            header.libraries = r.libraries;
                        }
                        c.per_process_ms.push(r.median_ms);
                        c.memory_mb = c.memory_mb.or(Some(r.memory_mb));
                    }
                    Err(e) => c.error = Some(format!("process {p} failed: {e:#}")),
                }
            }
        }
    }
    Ok(())
}

/// Write the table as JSON and Markdown, each replaced atomically.
fn write(board: &Scoreboard, json: &Path, md: &Path) -> Result<()> {
    opsched::io::write(json, board.to_json()?.as_bytes())?;
    opsched::io::write(md, board.markdown().as_bytes())?;
    Ok(())
}

pub fn bench_gpu(args: &Args, flags: &[String]) -> Result<()> {
    if crate::rerun_in_release("bench-gpu", flags)? {
        return Ok(());
    }
    for model in &args.models {
        opsched::zoo::find(model)?;
    }
    let m = setup(args)?;
    let bin = opsched_binary(args)?;
    let slug = opsched_gpu::discovery::slug(&m.name);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let json_path = args.out.join(format!("{slug}.json"));
    let md_path = args.out.join(format!("{slug}.md"));
    // Refused now, not after minutes of measuring.
    opsched::io::check_writable(&json_path)?;
    opsched::io::check_writable(&md_path)?;
    let older = match args.merge && json_path.exists() {
        true => {
            let what = json_path.display().to_string();
            let text = std::fs::read_to_string(&json_path).with_context(|| what.clone())?;
            Some(Scoreboard::from_json(&text, &what)?)
        }
        false => None,
    };
    let date = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let mut header = Header {
        format: board::FORMAT.into(),
        version: board::VERSION,
        device: m.name.clone(),
        backend: args.backend.name().into(),
        driver: m.driver.clone(),
        cudnn: m.cudnn.clone(),
        libraries: String::new(),
        torch: None,
        torch_note: None,
        date: date.clone(),
        command: command_line(flags),
        processes: args.processes,
        repeats: args.repeats,
        warmup: args.warmup,
        algos: m.algos.clone(),
        search: format!(
            "{} cost model of the {} preset{}, 1 GPU, {STREAMS} streams",
            args.cost,
            m.preset.name,
            m.preset_note
                .as_ref()
                .map_or(String::new(), |n| format!(" ({n})"))
        ),
        conv_api: args.conv_api.name().into(),
        conv_gemm: args.conv_gemm.name().into(),
        gemm: args.gemm.name().into(),
        layout: args.layout().to_string(),
        fusions_left_out: args.fusions_left_out(),
        opsched_version: env!("CARGO_PKG_VERSION").into(),
        earlier: Vec::new(),
    };
    // Checked before measuring, so a mismatch costs nothing.
    if let Some(o) = &older {
        let probe = Scoreboard {
            header: header.clone(),
            rows: Vec::new(),
        };
        probe.merge(o.clone(), &json_path.display().to_string())?;
    }
    let use_torch = args.torch && args.backend == BackendArg::Cuda;
    if !use_torch {
        header.torch_note = Some(match args.torch {
            false => "--no-torch".into(),
            true => "the CPU backend rehearses the pipeline only".into(),
        });
    }
    let candidates = 1 + m.algos.len();
    let torch_models = args
        .models
        .iter()
        .filter(|m| !OURS_ONLY.contains(&m.as_str()))
        .count();
    let total = args.models.len() * args.batches.len() * candidates * args.processes as usize
        + if use_torch {
            torch_models * args.processes as usize
        } else {
            0
        };
    let bar = crate::progress::bar(total as u64);
    eprintln!(
        "bench-gpu on {} ({} backend); schedules searched under the {}; {} processes per \
         configuration",
        m.name,
        args.backend.name(),
        header.search,
        args.processes
    );
    let work = WorkDir::new()?;
    let mut rows: Vec<Row> = Vec::new();
    let mut torch_off = false;
    for model in &args.models {
        let mut per_batch = Vec::with_capacity(args.batches.len());
        let mut searched: Vec<(u32, String)> = Vec::with_capacity(args.batches.len());
        for &batch in &args.batches {
            bar.set_message(format!("{model} b{batch}: searching"));
            let cfg = ZooConfig {
                batch: batch as usize,
                input_size: None,
                dtype: DType::F32,
            };
            let g = opsched::load_model(model, &cfg)?;
            let dir = work.0.join(format!("b{batch}"));
            std::fs::create_dir_all(&dir)?;
            let (cands, cost_name) = search(&g, &m, args, &dir)?;
            per_batch.push((batch, cands));
            searched.push((batch, cost_name));
        }
        run_rounds(&bin, model, &mut per_batch, args, &m, &mut header, &bar)?;
        let outcome = if OURS_ONLY.contains(&model.as_str()) {
            TorchOutcome::Failed("skipped: ours only, no PyTorch counterpart".into())
        } else if !use_torch || torch_off {
            TorchOutcome::NotAsked
        } else {
            torch_runs(args, model, &work.0, &bar)
        };
        match &outcome {
            TorchOutcome::Runs(runs) if header.torch.is_none() => {
                header.torch = runs.first().map(|r| r.versions.clone());
            }
            TorchOutcome::Unavailable(e) => {
                // Torch or a GPU missing holds for every later model too.
                say(
                    &bar,
                    format!("bench-gpu: PyTorch skipped from {model} on: {e}"),
                );
                header.torch_note = Some(e.clone());
                torch_off = true;
            }
            TorchOutcome::Failed(e) if use_torch => {
                say(&bar, format!("bench-gpu: PyTorch for {model}: {e}"));
            }
            _ => {}
        }
        for (batch, cands) in per_batch {
            let (t, compared) = match &outcome {
                TorchOutcome::Runs(runs) => (
                    torch::result(runs, model, batch as usize),
                    runs.first().and_then(|r| r.compared(model)),
                ),
                TorchOutcome::Failed(e) => (
                    board::TorchResult {
                        notes: vec![e.clone()],
                        ..Default::default()
                    },
                    None,
                ),
                TorchOutcome::Unavailable(_) | TorchOutcome::NotAsked => {
                    (board::TorchResult::default(), None)
                }
            };
            let schedules = cands.into_iter().map(Candidate::result).collect();
            let row = Row::new(
                model,
                batch as usize,
                args.processes,
                schedules,
                t,
                compared,
                &date,
            );
            let row = Row {
                cost_model: searched
                    .iter()
                    .find(|(b, _)| *b == batch)
                    .map(|(_, name)| name.clone())
                    .unwrap_or_default(),
                ..row
            };
            say(&bar, summary(&row));
            rows.push(row);
        }
        let mut board = Scoreboard {
            header: header.clone(),
            rows: rows.clone(),
        };
        if let Some(o) = &older {
            board = board.merge(o.clone(), &json_path.display().to_string())?;
        }
        write(&board, &json_path, &md_path)?;
    }
    bar.finish_and_clear();
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    if rows.iter().all(|r| r.ours_best_graph_ms.is_none()) {
        let first = rows
            .iter()
            .flat_map(|r| &r.schedules)
            .find_map(|s| s.error.clone())
            .unwrap_or_else(|| "no schedule".into());
        bail!("no configuration ran in every process; the first error: {first}");
    }
    Ok(())
}

/// A line on stderr above the progress bar (which is hidden when stderr is not a terminal:
/// the line is not).
fn say(bar: &indicatif::ProgressBar, line: String) {
    bar.suspend(|| eprintln!("{line}"));
}

/// One line per row while the run goes on.
fn summary(r: &Row) -> String {
    let ms = |v: Option<f64>| v.map_or_else(|| "n/a".into(), |x| format!("{x:.3} ms"));
    format!(
        "{} b{}: sequential {}, best {} ({}, spread {}), torch.compile {}",
        r.model,
        r.batch,
        ms(r.ours_sequential_graph_ms),
        ms(r.ours_best_graph_ms),
        r.best_algo.as_deref().unwrap_or("none"),
        r.ours_spread
            .map_or_else(|| "n/a".into(), |s| format!("{:.1}%", s * 100.0)),
        ms(r.torch_compile_ms)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `opsched run --graph-capture --json` prints, trimmed to what matters here.
    fn report() -> String {
        r#"{"device": {"backend": "cuda", "name": "NVIDIA H100 80GB HBM3", "driver": "13.0",
             "libraries": "cuDNN 9.14.0", "units": 1},
            "graph_capture": true, "latency": {"median_ms": 1.25, "p10_ms": 1.2,
            "p90_ms": 1.3, "samples": 100}, "peak_memory_bytes": 2000000,
            "buffer_bytes": 56409440}"#
            .to_string()
    }

    /// One report of one schedule.
    fn parse_run(stdout: &[u8], repeats: u32) -> Result<Measured> {
        Ok(parse_runs(stdout, 1, repeats)?.remove(0))
    }

    #[test]
    fn a_process_report_is_checked_before_it_counts() {
        let m = parse_run(report().as_bytes(), 100).expect("valid");
        assert_eq!(m.median_ms, 1.25);
        assert_eq!(m.device, "NVIDIA H100 80GB HBM3");
        assert_eq!(
            m.memory_mb, 2.0,
            "the memory plan's peak, not the buffers' sum"
        );
        let old = report().replace("\"peak_memory_bytes\": 2000000,", "");
        assert!(
            parse_run(old.as_bytes(), 100).is_err(),
            "a report without the peak"
        );
        let err = parse_run(report().as_bytes(), 20).expect_err("samples");
        assert!(
            err.to_string()
                .contains("100 samples, expected true and 20"),
            "{err}"
        );
        let eager = report().replace("\"graph_capture\": true", "\"graph_capture\": false");
        assert!(parse_run(eager.as_bytes(), 100).is_err());
        assert!(parse_run(b"error: no GPU", 100).is_err());
        let checked = |passed: bool| {
            report().replace(
                "\"graph_capture\"",
                &format!("\"check\": {{\"passed\": {passed}, \"vs_sequential\": 0.5}}, \"graph_capture\""),
            )
        };
        assert!(parse_run(checked(true).as_bytes(), 100).is_ok());
        let err = parse_run(checked(false).as_bytes(), 100).expect_err("wrong outputs");
        assert!(err.to_string().contains("failed the check"), "{err}");
    }

    #[test]
    fn a_process_of_several_schedules_reports_each_in_order() {
        let two = format!("[{}, {}]", report(), report().replace("1.25", "0.5"));
        let m = parse_runs(two.as_bytes(), 2, 100).expect("valid");
        assert_eq!(
            m.iter().map(|m| m.median_ms).collect::<Vec<_>>(),
            [1.25, 0.5]
        );
        let err = parse_runs(two.as_bytes(), 3, 100).expect_err("count");
        assert!(err.to_string().contains("2 runs, expected 3"), "{err}");
        assert!(
            parse_runs(report().as_bytes(), 2, 100).is_err(),
            "one object for two"
        );
        let eager = two.replacen("\"graph_capture\": true", "\"graph_capture\": false", 1);
        assert!(parse_runs(eager.as_bytes(), 2, 100).is_err());
    }

    #[test]
    fn the_command_line_is_quoted_for_a_shell() {
        let flags = ["--models", "a,b", "--out", "/tmp/my board", "it's"].map(String::from);
        assert_eq!(
            command_line(&flags),
            r#"cargo xtask bench-gpu --models a,b --out '/tmp/my board' 'it'\''s'"#
        );
        assert_eq!(one_line("\n  \nfirst\nsecond"), "first");
        assert_eq!(last_line(b"warning: x\nerror: no GPU\n\n"), "error: no GPU");
        assert_eq!(last_line(b""), "no message");
    }
}
