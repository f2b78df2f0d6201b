//! `opsched profile` and `opsched run`: the commands that execute a graph on a device (a CUDA
//! GPU, or the CPU).

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use opsched::gpu::program::Layout;
use opsched::graph::fusion::Fusions;
use opsched::graph::{NodeId, Tensor};
use opsched::profiler::{ProfileError, ProfileOptions};
use opsched::runtime::{
    Backend, CheckMode, ConvApi, ConvGemm, CpuDevice, CudaDevice, Device, GemmKernel,
    KernelOptions, RunOptions, RuntimeError, TransferMode,
};
use opsched::schedule::io as schedule_io;

use crate::args::{ModelArgs, PlatformArgs, SchedArgs, TargetArgs};
use crate::common::{load, print_json, setup};
use crate::error::{facade, user};

#[derive(Args, Debug)]
#[command(
    after_help = "Measures every distinct operator alone, the concurrent stages of a schedule \
(--stages-from, default ios) and transfers by size on one GPU of this machine, and stores them \
in the cost cache keyed by the device, so a later `--cost cache` (on any machine) schedules \
with measured costs. --export also writes the tables as JSON.\n\nExamples:\n  \
opsched profile inception_v3\n  opsched profile resnet50 --batch 16 --export fixtures/costs/h100/resnet50-b16\n  \
opsched profile nasnet --stages-from opara --json"
)]
pub struct ProfileArgs {
    /// Zoo model name or model file (--help lists both).
    #[arg(long_help = crate::help::model())]
    model: String,
    #[command(flatten)]
    model_args: ModelArgs,
    /// Time the concurrent stages and merged convolutions of this algorithm's schedule (`none`:
    /// operators only).
    #[arg(long, default_value = "ios", value_name = "ALGO")]
    stages_from: String,
    /// Which GPU of this machine (CUDA).
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    #[command(flatten)]
    device: DeviceArgs,
    /// Untimed runs before timing.
    #[arg(long, default_value_t = 10)]
    warmup: u32,
    /// Timed runs per measurement (median, p10, p90).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    repeats: u32,
    /// Also write the measured tables as JSON into this directory.
    #[arg(long, value_name = "DIR")]
    export: Option<PathBuf>,
    /// How 4-D activations are stored while measuring (`opsched run --layout`; `auto`:
    /// channels last on CUDA, NCHW on the CPU). The cache's keys record it: `--cost cache`
    /// answers in the layout a run uses and falls back to the other's measurements.
    #[arg(long, value_enum, default_value_t = LayoutArg::Auto)]
    layout: LayoutArg,
    /// Device preset and cost model used to search the stages to time; `--cache` is the cost
    /// cache the measurements go to (default: $OPSCHED_CACHE, else the user's cache directory).
    #[command(flatten)]
    platform: PlatformArgs,
    #[command(flatten)]
    sched: SchedArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Which device executes, and how its kernels compute.
#[derive(Args, Debug)]
pub struct DeviceArgs {
    /// `auto`: CUDA when a driver and a GPU are present, else the CPU (the report says which).
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    /// Strict f32 arithmetic in convolutions and matrix products (no TF32 tensor cores).
    #[arg(long)]
    precise: bool,
    /// Time every kernel choice again (cuDNN's convolution algorithms, softmax kernels, matrix
    /// products' kernels) instead of using the measurements kept in the cost cache (which make
    /// every process run the same kernels).
    #[arg(long)]
    retune: bool,
    /// Which cuDNN kernels convolutions choose among: the legacy API's algorithms, the
    /// backend API's engines (its heuristics' top configurations), or both.
    #[arg(long, value_enum, default_value_t = ConvApiArg::Both)]
    conv_api: ConvApiArg,
    /// Whether 1x1 convolutions may run as cuBLAS's matrix product: `timed` adds it to the
    /// candidates of `--conv-api both` (the fastest is chosen), `always` runs it for every one.
    /// Correct on an H100, but no model ran faster with it (2026-11-26), hence off by default.
    #[arg(long, value_enum, default_value_t = ConvGemmArg::Off)]
    conv_gemm: ConvGemmArg,
    /// Which kernel a matrix product runs: `measured`, the fastest on this GPU of cuBLAS's own
    /// choice and cuBLASLt's heuristic's top 8 configurations (kept in the cost cache), or
    /// `heuristic`, nothing measured (cuBLAS's choice; cuBLASLt's first with a bias,
    /// residual or relu in the product).
    #[arg(long, value_enum, default_value_t = GemmArg::Measured)]
    gemm: GemmArg,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum LayoutArg {
    /// The device's own: channels last on CUDA, NCHW on the CPU.
    Auto,
    Nchw,
    Nhwc,
}

impl LayoutArg {
    /// The layout asked for (`None`: the device's own).
    fn layout(self) -> Option<Layout> {
        match self {
            LayoutArg::Auto => None,
            LayoutArg::Nchw => Some(Layout::Nchw),
            LayoutArg::Nhwc => Some(Layout::Nhwc),
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum GemmArg {
    Measured,
    Heuristic,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum ConvGemmArg {
    Off,
    Timed,
    Always,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum ConvApiArg {
    Both,
    Legacy,
    Backend,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum BackendArg {
    Auto,
    Cpu,
    Cuda,
}

impl DeviceArgs {
    fn backend(&self) -> Backend {
        match self.backend {
            BackendArg::Auto => Backend::Auto,
            BackendArg::Cpu => Backend::Cpu,
            BackendArg::Cuda => Backend::Cuda,
        }
        .resolve()
    }

    fn kernels(&self) -> KernelOptions {
        KernelOptions {
            tf32: !self.precise,
            conv_api: match self.conv_api {
                ConvApiArg::Both => ConvApi::Both,
                ConvApiArg::Legacy => ConvApi::Legacy,
                ConvApiArg::Backend => ConvApi::Backend,
            },
            conv_gemm: match self.conv_gemm {
                ConvGemmArg::Off => ConvGemm::Off,
                ConvGemmArg::Timed => ConvGemm::Timed,
                ConvGemmArg::Always => ConvGemm::Always,
            },
            gemm: match self.gemm {
                GemmArg::Measured => GemmKernel::Measured,
                GemmArg::Heuristic => GemmKernel::Heuristic,
            },
            ..KernelOptions::default()
        }
    }
}

/// Something to do on whichever device the arguments pick (the device trait has associated
/// types, so the choice is a generic call per backend rather than a trait object).
trait OnDevice {
    type Out;
    fn on<D: Device>(self, dev: &D) -> Result<Self::Out>;
}

/// Open the `backend` device, with `units` GPUs at most (CUDA), and run `job` on it.
fn on_device<J: OnDevice>(backend: Backend, units: usize, retune: bool, job: J) -> Result<J::Out> {
    match backend {
        Backend::Cuda => {
            let present = opsched::gpu::devices()
                .map_err(|e| gpu_error(e.into()))?
                .len();
            let dev = CudaDevice::open(Some(units.clamp(1, present.max(1))))
                .map_err(|e| gpu_error(e.into()))?;
            with_tuning(&dev, retune, job)
        }
        Backend::Cpu | Backend::Auto => job.on(&CpuDevice::with_race_check(false)),
    }
}

/// Run `job` with the device's measured kernel choices loaded from the cost cache (measured
/// again with `retune`), and save what it measured there, so the next process runs the same
/// kernels. A cache that cannot be opened or saved costs a warning, not the run.
fn with_tuning<D: Device, J: OnDevice>(dev: &D, retune: bool, job: J) -> Result<J::Out> {
    let Some(t) = dev.tuning() else {
        return job.on(dev);
    };
    t.set_retune(retune);
    let fp = dev.report().fingerprint;
    let mut cache = opsched::cost::cache::CostCache::open_default()
        .map_err(|e| tracing::warn!("kernel measurements not loaded: {e}"))
        .ok();
    if let Some(c) = &cache {
        let n = t.load(&fp, c.entries());
        tracing::info!(
            "{n} kernel choices' timings (convolutions, softmaxes) from {}",
            c.path().display()
        );
    }
    let out = job.on(dev);
    if let Some(c) = &mut cache {
        for (k, m) in t.fresh(&fp) {
            c.insert(k, m);
        }
        if c.is_dirty() {
            if let Err(e) = c.save() {
                tracing::warn!("kernel measurements not saved: {e}");
            }
        }
    }
    out
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum TransferArg {
    Auto,
    Nccl,
    Copy,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Searches the schedule as `opsched schedule` does (under --cost, default \
analytical), then executes it: buffers allocated first, warm-up, timed repetitions (median, \
p10, p90), and with --check a numerical comparison against a sequential run of the same kernels \
and, on small graphs, the reference executor. More logical GPUs (--gpus) than the machine has \
share the physical ones. ONNX models run with their weights; --input gives their inputs and \
--output writes their outputs (zoo models have pseudo-random weights).\n\nExamples:\n  \
opsched run inception_v3 --algo ios\n  opsched run resnet50 --algo opara --graph-capture --json\n  \
opsched run nasnet --algo hios-lp --gpus 2 --check\n  opsched run googlenet --schedule s.json\n  \
opsched run googlenet --schedule a.json --schedule b.json --graph-capture --json\n  \
opsched run model.onnx --algo lios --backend cpu --input x.npy --output y.npz"
)]
pub struct RunArgs {
    /// Zoo model name or model file (--help lists both).
    #[arg(long_help = crate::help::model())]
    model: String,
    /// Scheduling algorithm (--help lists them), or `best`: the one whose schedule the cost
    /// model simulates fastest.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "best",
        long_help = crate::help::run_algo()
    )]
    algo: Option<String>,
    /// Run this schedule file (from `opsched schedule --out`) instead of searching one.
    /// Repeat it to run several, one after another on the same device in this process (one
    /// report each; with --json, an array of them).
    #[arg(long, value_name = "FILE", conflicts_with = "algo")]
    schedule: Vec<PathBuf>,
    #[command(flatten)]
    device: DeviceArgs,
    /// Capture the whole plan as one graph (a CUDA graph on a GPU) and replay it.
    #[arg(long)]
    graph_capture: bool,
    /// Give every buffer storage of its own instead of letting buffers share it where the
    /// schedule orders their uses apart (more memory; nothing else changes).
    #[arg(long)]
    no_memory_reuse: bool,
    /// How 4-D activations are stored: `nchw`, or `nhwc` (channels last) for the values of
    /// convolutions that cuDNN or our depthwise kernel runs, chains of them, and the
    /// element-wise operators after them, with a transpose where a value crosses to another
    /// operator; `auto`: channels last on CUDA (faster on every CNN measured on an H100),
    /// NCHW on the CPU. `--cost cache` searches with the measurements of this layout (`auto`:
    /// channels last's).
    #[arg(long, value_enum, default_value_t = LayoutArg::Auto)]
    layout: LayoutArg,
    /// Leave out one of the fusions being measured (repeat for several; the possible values
    /// below say what each does). Values and schedules stay the same; kernels change (the
    /// report's `fusions_left_out`).
    #[arg(long, value_name = "NAME", value_parser = fusion_names())]
    no_fusion: Vec<String>,
    /// Put in a fusion left out by default (repeat for several): `sum-into-depthwise`, which
    /// measured slower on an H100. The values `--no-fusion` takes.
    #[arg(long, value_name = "NAME", value_parser = fusion_names())]
    fusion: Vec<String>,
    /// Untimed runs before timing.
    #[arg(long, default_value_t = 10)]
    warmup: u32,
    /// Timed runs (median, p10, p90).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    repeats: u32,
    /// Compare the outputs with a sequential run (and a CPU reference on small graphs).
    #[arg(long)]
    check: bool,
    /// How tensors move between GPUs.
    #[arg(long, value_enum, default_value_t = TransferArg::Auto)]
    transfers: TransferArg,
    #[command(flatten)]
    platform: PlatformArgs,
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    model_args: ModelArgs,
    #[command(flatten)]
    sched: SchedArgs,
    /// A model input as a NumPy array (float32; int64 or int32 for token ids and masks):
    /// `FILE.npy` for a model with one input, else `NAME=FILE.npy` per input (repeat).
    /// Without, inputs are pseudo-random (token ids: rows of the table that reads them).
    #[arg(long, value_name = "[NAME=]FILE.npy")]
    input: Vec<opsched::npy::InputArg>,
    /// Write the model's outputs: a `.npy` (one output) or `.npz` (every output, by name).
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// After timing, run the plan eagerly `--warmup` + `--repeats` more times with an event on
    /// each side of every launch, and report each launch's median time (text: by operator
    /// type and the slowest ten; `--json`: `op_times`, every launch). On a GPU a launch the
    /// host issued late counts the time it waited.
    #[arg(long)]
    op_times: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// A GPU error: the machine's or the input's (exit 2) or ours (exit 1).
fn gpu_error(e: RuntimeError) -> anyhow::Error {
    let user_side = match &e {
        RuntimeError::Gpu(g) => g.is_user_error(),
        RuntimeError::Plan(_) => true,
        RuntimeError::Schedule(_) => false,
    };
    if user_side {
        user(e)
    } else {
        anyhow::Error::new(e)
    }
}

fn profile_error(e: ProfileError) -> anyhow::Error {
    match e {
        ProfileError::Runtime(r) => gpu_error(r),
        ProfileError::Gpu(g) => gpu_error(RuntimeError::Gpu(g)),
        other => anyhow::Error::new(other),
    }
}

struct Profile<'a> {
    g: &'a opsched::Graph,
    opts: ProfileOptions,
}

impl OnDevice for Profile<'_> {
    type Out = opsched::profiler::ProfileReport;
    fn on<D: Device>(self, dev: &D) -> Result<Self::Out> {
        opsched::profiler::profile(dev, self.g, &self.opts).map_err(profile_error)
    }
}

pub fn profile(a: &ProfileArgs) -> Result<()> {
    // Resolved once: `auto` probes the driver.
    let backend = a.device.backend();
    let g = load_for_profile(a, backend)?;
    if backend == Backend::Cpu && a.gpu != 0 {
        return Err(user(anyhow::anyhow!(
            "--gpu {}: the CPU backend has one unit (0)",
            a.gpu
        )));
    }
    let (stages, merges) = if a.stages_from == "none" {
        (Vec::new(), Vec::new())
    } else {
        let su = setup(&g, &a.platform, a.layout.layout())?;
        let platform = su.platform(1, 8);
        let sched = opsched::scheduler_with(&a.stages_from, &a.sched.options()).map_err(facade)?;
        let (s, _) = sched
            .schedule(&g, &platform, su.cost.as_ref())
            .with_context(|| format!("scheduler '{}' on {}", a.stages_from, g.name))?;
        (
            opsched::profiler::stages_of(&s),
            opsched::profiler::merges_of(&s),
        )
    };
    let cache = match &a.platform.cache {
        Some(p) => p.clone(),
        None => opsched::cost::cache::default_path().map_err(user)?,
    };
    let opts = ProfileOptions {
        unit: a.gpu,
        warmup: a.warmup,
        repeats: a.repeats,
        stages,
        merges,
        cache: Some(cache.clone()),
        export_dir: a.export.clone(),
        kernels: a.device.kernels(),
        layout: a.layout.layout(),
        ..ProfileOptions::default()
    };
    let units = a.gpu.saturating_add(1);
    let report = on_device(backend, units, a.device.retune, Profile { g: &g, opts })?;
    if a.json {
        return print_json(&report);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} on {} ({}, {}): {} operators ({} merged convolutions), {} stages, {} transfer sizes \
         measured",
        g.name,
        report.device,
        report.backend,
        report.layout,
        report.ops.len(),
        report.ops.iter().filter(|t| t.nodes.len() > 1).count(),
        report.stages.len(),
        report.transfers.len()
    )?;
    writeln!(
        out,
        "{:<40} {:>10} {:>10} {:>10}",
        "operator", "median ms", "p10 ms", "p90 ms"
    )?;
    for t in &report.ops {
        // A merged group's convolution lists its members.
        let name = match t.nodes.as_slice() {
            [one] => one.clone(),
            many => format!("merged {}", many.join("+")),
        };
        writeln!(
            out,
            "{:<40} {:>10.4} {:>10.4} {:>10.4}",
            name, t.summary.median_ms, t.summary.p10_ms, t.summary.p90_ms
        )?;
    }
    writeln!(
        out,
        "{} cache entries written to {}",
        report.cache_entries_written,
        cache.display()
    )?;
    for p in &report.exported {
        writeln!(out, "exported {}", p.display())?;
    }
    Ok(())
}

struct Run<'a> {
    g: &'a opsched::Graph,
    schedules: &'a [opsched::schedule::Schedule],
    opts: RunOptions,
}

impl OnDevice for Run<'_> {
    type Out = Vec<opsched::runtime::RunReport>;
    fn on<D: Device>(self, dev: &D) -> Result<Self::Out> {
        let run = |s| opsched::runtime::run_schedule(dev, self.g, s, &self.opts);
        self.schedules
            .iter()
            .map(|s| run(s).map_err(gpu_error))
            .collect()
    }
}

/// The model to profile: on the CPU with its weights where the file has them, since the CPU's
/// lookups refuse an index that is no row, and index arithmetic on constants (RoBERTa's
/// position ids from its token ids) gives rows only with the constants' real values (without
/// weights they are pseudo-random); where they cannot be read (an absent external data file),
/// the shapes alone with a warning, as on a GPU, whose lookups read no row as zeros.
fn load_for_profile(a: &ProfileArgs, backend: Backend) -> Result<opsched::Graph> {
    if backend == Backend::Cpu {
        let opts = opsched::LoadOptions {
            weights: true,
            ..a.model_args.load_options()
        };
        match opsched::load_model_with(&a.model, &a.model_args.zoo_config(), &opts) {
            Ok(g) => return Ok(g),
            Err(e) => tracing::warn!("profiling {} without its weights: {e}", a.model),
        }
    }
    load(&a.model, &a.model_args)
}

/// The model with its weights (ONNX files; zoo models and graph files have none, so their
/// parameters are pseudo-random) and the bound `--input` arrays; the batch of a model with a
/// symbolic batch comes from the arrays unless `--batch` says otherwise.
fn load_for_inference(a: &RunArgs) -> Result<(opsched::Graph, HashMap<NodeId, Tensor>)> {
    let arrays = opsched::npy::read_inputs(&a.input).map_err(user)?;
    let mut cfg = a.model_args.zoo_config();
    if a.model_args.batch == 1 {
        cfg.batch = opsched::npy::input_batch(&arrays).unwrap_or(1);
    }
    let opts = opsched::LoadOptions {
        weights: true,
        ..a.model_args.load_options()
    };
    let g = opsched::load_model_with(&a.model, &cfg, &opts).map_err(facade)?;
    let inputs = match arrays.is_empty() {
        true => HashMap::new(),
        false => opsched::npy::bind_inputs(&g, arrays).map_err(user)?,
    };
    Ok((g, inputs))
}

/// The names `--no-fusion` takes, with what each fusion does.
fn fusion_names() -> clap::builder::PossibleValuesParser {
    Fusions::NAMES
        .iter()
        .map(|(name, what)| clap::builder::PossibleValue::new(*name).help(*what))
        .collect::<Vec<_>>()
        .into()
}

pub fn run(a: &RunArgs) -> Result<()> {
    let (g, inputs) = load_for_inference(a)?;
    if let Some(name) = a.fusion.iter().find(|n| a.no_fusion.contains(n)) {
        return Err(user(anyhow::anyhow!(
            "--fusion {name} and --no-fusion {name}: name it once"
        )));
    }
    // clap has checked the names (`fusion_names`).
    let with = |f: Fusions, name: &String| f.with(name).unwrap_or(f);
    let without = |f: Fusions, name: &String| f.without(name).unwrap_or(f);
    let fusions = a.fusion.iter().fold(g.fusions(), with);
    let fusions = a.no_fusion.iter().fold(fusions, without);
    let g = g.with_fusions(fusions);
    let gpus = a.target.gpus as usize;
    let su = setup(&g, &a.platform, a.layout.layout())?;
    let platform = su.platform(gpus, a.target.streams as usize);
    let mut labels = Vec::new();
    let mut schedules = Vec::new();
    // What `--algo best` chose it by, for the text report.
    let mut best_note = None;
    match (&a.algo, a.schedule.as_slice()) {
        (_, [_, ..]) => {
            if a.schedule.len() > 1 && a.output.is_some() {
                return Err(user(anyhow::anyhow!(
                    "--output writes one run's outputs: give one --schedule"
                )));
            }
            for path in &a.schedule {
                let s = schedule_io::load(&g, path).map_err(user)?;
                opsched::schedule::validate(&g, &s, &platform)
                    .map_err(|e| user(anyhow::anyhow!("{}: {e}", path.display())))?;
                labels.push(path.display().to_string());
                schedules.push(s);
            }
        }
        (Some(algo), []) if algo == "best" => {
            let mode = match a.graph_capture {
                true => opsched::schedule::ExecMode::Graph,
                false => opsched::schedule::ExecMode::Eager,
            };
            let best =
                opsched::best_schedule(&g, &platform, su.cost.as_ref(), &a.sched.options(), mode)
                    .map_err(facade)?;
            labels.push(format!("best: {}", best.algo));
            best_note = Some(format!(
                "simulated {:.4} ms, sequential {:.4} ms, under {}",
                best.makespan_ms,
                best.sequential_ms,
                su.cost.name()
            ));
            schedules.push(best.schedule);
        }
        (Some(algo), []) => {
            let sched = opsched::scheduler_with(algo, &a.sched.options()).map_err(facade)?;
            let (s, _) = sched
                .schedule(&g, &platform, su.cost.as_ref())
                .with_context(|| format!("scheduler '{algo}' on {}", g.name))?;
            labels.push(sched.name().to_string());
            schedules.push(s);
        }
        (None, []) => return Err(user(anyhow::anyhow!("give --algo NAME or --schedule FILE"))),
    }
    let opts = RunOptions {
        graph_capture: a.graph_capture,
        warmup: a.warmup,
        repeats: a.repeats,
        check: if a.check {
            CheckMode::Auto
        } else {
            CheckMode::None
        },
        transfers: match a.transfers {
            TransferArg::Auto => TransferMode::Auto,
            TransferArg::Nccl => TransferMode::Nccl,
            TransferArg::Copy => TransferMode::Copy,
        },
        kernels: a.device.kernels(),
        inputs: Arc::new(inputs),
        keep_outputs: a.output.is_some(),
        reuse_memory: !a.no_memory_reuse,
        layout: a.layout.layout(),
        op_times: a.op_times,
        ..RunOptions::default()
    };
    let job = Run {
        g: &g,
        schedules: &schedules,
        opts,
    };
    let reports = on_device(a.device.backend(), gpus, a.device.retune, job)?;
    let failed = reports
        .iter()
        .any(|r| r.check.as_ref().is_some_and(|c| !c.passed));
    // The JSON reports name their schedule too (the algorithm, `best: NAME`, or the file).
    let named = |report: &opsched::runtime::RunReport, label: &str| -> Result<serde_json::Value> {
        let mut v = serde_json::to_value(report)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("schedule".into(), label.into());
        }
        Ok(v)
    };
    match (a.json, reports.as_slice()) {
        (true, [report]) => print_json(&named(report, &labels[0])?)?,
        (true, _) => print_json(
            &labels
                .iter()
                .zip(&reports)
                .map(|(l, r)| named(r, l))
                .collect::<Result<Vec<_>>>()?,
        )?,
        (false, _) => {
            for (i, (label, report)) in labels.iter().zip(&reports).enumerate() {
                if i > 0 {
                    println!();
                }
                match &best_note {
                    Some(note) => print_run(&g, &format!("{label} ({note})"), report)?,
                    None => print_run(&g, label, report)?,
                }
            }
        }
    }
    if let (Some(path), [report]) = (&a.output, reports.as_slice()) {
        let mut outputs = crate::output::Outputs::default();
        let bytes = opsched::npy::encode_outputs(path, &report.outputs).map_err(user)?;
        outputs.add(path, bytes);
        outputs.write()?;
    }
    if failed {
        anyhow::bail!(
            "the check failed: outputs differ from a sequential NCHW run's or the reference's"
        );
    }
    Ok(())
}

fn print_run(g: &opsched::Graph, label: &str, report: &opsched::runtime::RunReport) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let d = &report.device;
    let l = &report.latency;
    writeln!(
        out,
        "model          {} ({} operators)",
        g.name,
        g.op_count()
    )?;
    writeln!(out, "schedule       {label}")?;
    let detail = if d.backend == "cuda" {
        format!("driver {}, {}", d.driver, d.libraries)
    } else {
        d.libraries.clone()
    };
    writeln!(
        out,
        "device         {} backend: {} ({detail}); {} logical GPU(s) on {} unit(s)",
        d.backend, d.name, report.logical_gpus, d.units
    )?;
    writeln!(
        out,
        "latency        {:.4} ms median ({:.4} - {:.4} ms p10 - p90, {} runs){}",
        l.median_ms,
        l.p10_ms,
        l.p90_ms,
        l.samples,
        if report.graph_capture {
            ", captured graph"
        } else {
            ""
        }
    )?;
    writeln!(
        out,
        "launches       {} operators as {} kernels ({} waits, {} implied waits dropped, {} \
         transfers via {})",
        g.op_count(),
        report.kernels,
        report.waits,
        report.waits_dropped,
        report.transfers,
        report.transfer_mode
    )?;
    if report.merged_convolutions > 0 {
        writeln!(
            out,
            "merged         {} merged stages ran as one convolution or product each",
            report.merged_convolutions
        )?;
    }
    if report.layout == Layout::Nhwc {
        let n = report.layout_conversions;
        writeln!(
            out,
            "layout         channels last, {n} transpose{} between NCHW and NHWC",
            if n == 1 { "" } else { "s" }
        )?;
    }
    // Only where they differ from the default, which the JSON report states too.
    if report.fusions_left_out != Fusions::DEFAULT.left_out() {
        match report.fusions_left_out.as_slice() {
            [] => writeln!(out, "fusions        every one in")?,
            names => writeln!(out, "fusions        left out: {}", names.join(", "))?,
        }
    }
    if report.strided_views > 0 {
        writeln!(
            out,
            "strided        {} views written or read in place, one run per image, pixel or row: \
             slices of concatenations, merged convolutions' and products' members",
            report.strided_views
        )?;
    }
    writeln!(
        out,
        "memory         {:.1} MB of buffers: {:.1} MB weights and inputs, {:.1} MB activations \
         ({:.1} MB without sharing)",
        report.peak_memory_bytes as f64 / 1e6,
        report.weight_bytes as f64 / 1e6,
        report.peak_memory_bytes.saturating_sub(report.weight_bytes) as f64 / 1e6,
        report.buffer_bytes.saturating_sub(report.weight_bytes) as f64 / 1e6
    )?;
    if let Some(k) = &report.conv_kernels {
        write!(
            out,
            "convolutions   {} distinct: {} on cuDNN backend engines, {} on legacy algorithms",
            k.total(),
            k.engines,
            k.legacy
        )?;
        match k.gemm {
            0 => writeln!(out)?,
            g => writeln!(out, ", {g} as cuBLAS products")?,
        }
    }
    if let Some(k) = &report.gemm_kernels {
        writeln!(
            out,
            "products       {} distinct: {} on cuBLASLt configurations, {} on cuBLAS's own choice",
            k.total(),
            k.cublaslt,
            k.cublas
        )?;
    }
    if let Some(k) = &report.depthwise_kernels {
        writeln!(
            out,
            "depthwise      {} distinct: {} tiled by fours, {} tiled by twos, {} tiled, {} \
             unrolled, {} one output a thread",
            k.total(),
            k.tiled4,
            k.tiled2,
            k.tiled,
            k.unrolled,
            k.one
        )?;
    }
    if let Some(c) = &report.check {
        writeln!(
            out,
            "check          {}: vs sequential {:.2e} at '{}' (tolerance {:.0e}){}",
            if c.passed { "PASSED" } else { "FAILED" },
            c.vs_sequential,
            c.vs_sequential_node,
            c.tolerance_sequential,
            match (&c.vs_reference, &c.vs_reference_node) {
                (Some(e), Some(n)) => format!(
                    "; vs reference {e:.2e} at '{n}' (tolerance {:.0e})",
                    c.tolerance_reference
                ),
                _ => "; reference skipped (graph too large)".into(),
            }
        )?;
    }
    print_op_times(&mut out, report)
}

/// How many of the slowest launches the text report lists (`--json` has every one).
const SLOWEST_LAUNCHES: usize = 10;

/// `--op-times`: the launches' medians by operator type, then the slowest launches.
fn print_op_times(out: &mut impl Write, report: &opsched::runtime::RunReport) -> Result<()> {
    let times = &report.op_times;
    if times.is_empty() {
        return Ok(());
    }
    let median = |t: &opsched::runtime::OpTime| t.time.median_ms;
    let sum: f64 = times.iter().map(median).sum();
    let eager = times[0].time.samples;
    writeln!(
        out,
        "op times       {} launches' medians sum to {:.4} ms ({} eager run{}, an event on each \
         side of every launch); by type:",
        times.len(),
        sum,
        eager,
        if eager == 1 { "" } else { "s" }
    )?;
    let mut by_type: Vec<(&str, usize, f64)> = Vec::new();
    for t in times {
        match by_type.iter_mut().find(|(op, ..)| *op == t.op) {
            Some((_, n, ms)) => {
                *n += 1;
                *ms += median(t);
            }
            None => by_type.push((t.op, 1, median(t))),
        }
    }
    by_type.sort_by(|a, b| b.2.total_cmp(&a.2));
    for (op, n, ms) in by_type {
        let share = if sum > 0.0 { 100.0 * ms / sum } else { 0.0 };
        writeln!(out, "  {op:<24} {n:>5} x {ms:>10.4} ms {share:>5.1}%")?;
    }
    let mut slowest: Vec<_> = times.iter().collect();
    slowest.sort_by(|a, b| median(b).total_cmp(&median(a)));
    writeln!(out, "slowest        launches, median (p10 - p90) ms:")?;
    for t in slowest.into_iter().take(SLOWEST_LAUNCHES) {
        let name = match t.nodes.as_slice() {
            [one] => one.clone(),
            many => format!("merged {}", many.join("+")),
        };
        // The name last: ONNX exporters' names run to 60 characters.
        writeln!(
            out,
            "  {:>9.4} ({:.4} - {:.4}) {:<16}{} {name}",
            t.time.median_ms,
            t.time.p10_ms,
            t.time.p90_ms,
            t.op,
            match report.streams.iter().sum::<usize>() {
                0 | 1 => String::new(),
                _ => format!(" GPU {} stream {}", t.gpu, t.stream),
            }
        )?;
    }
    Ok(())
}
