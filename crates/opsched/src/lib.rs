//! # opsched
//!
//! The facade of the opsched workspace: the CLI, the xtask and the benches import this crate
//! only. It re-exports the graph IR, the cost models and the schedule layer, and holds
//!
//! - the registry of schedulers by name ([`schedulers`], [`scheduler_with`]) and [`compare`];
//! - the choice of cost model by name ([`CostKind`], [`cost_model`], [`default_cost_kind`]);
//! - the one evaluator every comparison goes through ([`evaluate`]: lower, simulate, bound);
//! - model loading ([`load_model`], [`load_model_with`]): zoo names, graph files and, with the
//!   `onnx` feature (on by default), ONNX files, with their weights on request
//!   ([`LoadOptions::weights`]);
//! - a model's inputs and outputs as NumPy arrays ([`npy`]).

pub use opsched_cost as cost;
/// The GPU backend: device discovery, kernels, the runtime and the profiler.
pub use opsched_gpu as gpu;
pub use opsched_graph as graph;
pub use opsched_graph::{formats, zoo, Graph, GraphError};
/// Output files: every file opsched writes goes through [`io::write`].
pub use opsched_io as io;
pub use opsched_ios_dp::IosBudget;
#[cfg(feature = "onnx")]
pub use opsched_onnx as onnx;
pub use opsched_profiler as profiler;
pub use opsched_runtime as runtime;
pub use opsched_schedule as schedule;

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub mod calibrate;
pub mod measure;

use opsched_cost::cache::CostCache;
use opsched_cost::measured::MeasuredTable;
use opsched_cost::Layout;
use opsched_cost::{
    AnalyticalModel, CostError, CostModel, DeviceFile, DevicePreset, HiosSimLaw, IdealModel,
    LinkPreset,
};
use opsched_graph::names::{self, Known, UnknownName};
use opsched_schedule::{
    ExecMode, LowerBound, Progress, Schedule, ScheduleError, Scheduler, SimOptions, Timeline,
};
use serde::Serialize;

pub mod npy;

/// Errors of the facade: those of the crates below, plus unknown names.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error(transparent)]
    Cost(#[from] CostError),
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// An ONNX file that does not import.
    #[cfg(feature = "onnx")]
    #[error(transparent)]
    Onnx(#[from] opsched_onnx::OnnxError),
    /// A scheduler name that is not in the registry.
    #[error(transparent)]
    UnknownScheduler(UnknownName),
    /// A cost model name that does not exist.
    #[error(transparent)]
    UnknownCost(UnknownName),
    /// Something this build cannot do yet.
    #[error("{0}")]
    Unavailable(String),
    /// Input or output arrays that do not fit the model, or files that do not read.
    #[error(transparent)]
    Array(#[from] npy::ArrayError),
    /// Running on a device failed (see [`measure`]).
    #[error(transparent)]
    Runtime(#[from] opsched_runtime::RuntimeError),
}

impl Error {
    /// Whether the error comes from the user's input (names, files, options) rather than from a
    /// fault of opsched; the CLI exits with code 2 for these.
    pub fn is_user_error(&self) -> bool {
        match self {
            Error::Graph(_)
            | Error::Cost(_)
            | Error::UnknownScheduler(_)
            | Error::UnknownCost(_)
            | Error::Unavailable(_)
            | Error::Array(_) => true,
            Error::Schedule(e) => !matches!(e, ScheduleError::Deadlock(_)),
            Error::Runtime(opsched_runtime::RuntimeError::Gpu(g)) => g.is_user_error(),
            Error::Runtime(e) => matches!(e, opsched_runtime::RuntimeError::Plan(_)),
            #[cfg(feature = "onnx")]
            Error::Onnx(_) => true,
        }
    }
}

/// Result of the facade.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How to load a model, beyond the zoo configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// ONNX files: import unsupported operators as opaque operators (costed by their tensor
    /// sizes) instead of failing with the list of unsupported operator types.
    pub allow_unknown: bool,
    /// ONNX files: load the weights too ([`Graph::weights`]); scheduling does not need them.
    pub weights: bool,
}

/// Load a model given as a zoo name or a graph file path (a file wins when both exist), with
/// default [`LoadOptions`].
pub fn load_model(spec: &str, cfg: &zoo::ZooConfig) -> Result<Graph> {
    load_model_with(spec, cfg, &LoadOptions::default())
}

/// Load a model given as a zoo name or a graph file path (a file wins when both exist).
///
/// ONNX files (a `.onnx` extension, or protobuf content) are imported with
/// [`opsched_onnx`]: a symbolic batch dimension takes `cfg.batch`; the element type is the
/// model's unless `cfg.dtype` is `f16`; `cfg.input_size` does not apply.
pub fn load_model_with(spec: &str, cfg: &zoo::ZooConfig, opts: &LoadOptions) -> Result<Graph> {
    let path = Path::new(spec);
    if path.is_file() {
        if is_onnx_file(path) {
            return load_onnx(path, cfg, opts);
        }
        return Ok(formats::load_file(path)?);
    }
    match zoo::find(spec) {
        Ok(m) => Ok(m.build(cfg)?),
        Err(_) if has_onnx_extension(path) => load_onnx(path, cfg, opts),
        Err(_) if spec.ends_with(".json") || spec.contains('/') => Ok(formats::load_file(path)?),
        Err(unknown) => Err(unknown.into()),
    }
}

/// A kind of model [`load_model`] accepts: a name and one line, for help texts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct InputKind {
    pub name: &'static str,
    pub about: &'static str,
}

/// The file formats [`load_model`] reads (zoo names aside): the graph formats of
/// [`formats::Format`] and, with the `onnx` feature, ONNX.
pub fn input_formats() -> Vec<InputKind> {
    let onnx = InputKind {
        name: "ONNX",
        about: "a .onnx file (or protobuf content), weights not needed",
    };
    let graphs = formats::Format::ALL.map(|f| InputKind {
        name: f.name(),
        about: f.about(),
    });
    cfg!(feature = "onnx")
        .then_some(onnx)
        .into_iter()
        .chain(graphs)
        .collect()
}

fn has_onnx_extension(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// An ONNX file by its extension, or by its first byte: the protobuf tag of `ir_version`
/// (field 1, varint), which no JSON text starts with.
fn is_onnx_file(path: &Path) -> bool {
    if has_onnx_extension(path) {
        return true;
    }
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
    {
        return false;
    }
    use std::io::Read;
    let mut first = [0u8; 1];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut first))
        .is_ok_and(|()| first[0] == 0x08)
}

#[cfg(feature = "onnx")]
fn load_onnx(path: &Path, cfg: &zoo::ZooConfig, opts: &LoadOptions) -> Result<Graph> {
    let onnx_opts = opsched_onnx::OnnxOptions {
        allow_unknown: opts.allow_unknown,
        batch: cfg.batch,
        dtype: (cfg.dtype == opsched_graph::DType::F16).then_some(opsched_graph::DType::F16),
        weights: opts.weights,
        ..Default::default()
    };
    if cfg.input_size.is_some() {
        tracing::warn!(
            "{}: an input size applies to zoo models only; ONNX models keep theirs",
            path.display()
        );
    }
    Ok(opsched_onnx::load_file(path, &onnx_opts)?)
}

#[cfg(not(feature = "onnx"))]
fn load_onnx(path: &Path, _cfg: &zoo::ZooConfig, _opts: &LoadOptions) -> Result<Graph> {
    Err(Error::Unavailable(format!(
        "{}: ONNX import is not compiled in (build opsched with the `onnx` feature)",
        path.display()
    )))
}

// ---------------------------------------------------------------------------------------------
// Schedulers

/// Options of the schedulers that take any; the defaults are the papers'.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SchedulerOptions {
    /// IOS: most operators per group (r).
    pub ios_r: usize,
    /// IOS: most groups per stage (s).
    pub ios_s: usize,
    /// IOS: most operators per part solved by one dynamic program.
    pub ios_part: usize,
    /// IOS: search allowed before the unsolved parts fall back to waves of ready operators.
    pub ios_budget: IosBudget,
    /// HIOS: window of the intra-GPU parallelization (w).
    pub window: usize,
    /// Seed of randomized schedulers (the LIOS ablations).
    pub seed: u64,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            ios_r: 3,
            ios_s: 8,
            ios_part: 50,
            ios_budget: IosBudget::default(),
            window: 2,
            seed: 0,
        }
    }
}

/// A registered scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SchedulerInfo {
    pub name: &'static str,
    /// One line: the algorithm and its paper.
    pub about: &'static str,
    /// Whether it places operators on several GPUs (the others use GPU 0 only).
    pub multi_gpu: bool,
}

const fn info(name: &'static str, about: &'static str, multi_gpu: bool) -> SchedulerInfo {
    SchedulerInfo {
        name,
        about,
        multi_gpu,
    }
}

const SCHEDULERS: &[SchedulerInfo] = &[
    info(
        "sequential",
        "one operator at a time, in topological order",
        false,
    ),
    info(
        "greedy",
        "every ready operator in the current stage, at most K streams",
        false,
    ),
    info(
        "nimble",
        "Nimble: streams from a maximum matching on the transitive reduction",
        false,
    ),
    info(
        "ios",
        "IOS dynamic programming over stages (concurrent and merge)",
        false,
    ),
    info("ios-parallel", "IOS with concurrent stages only", false),
    info("ios-merge", "IOS with operator merge only", false),
    info("lios", "LIOS list scheduling on streams", false),
    info("lios-rand1", "LIOS ablation: random operator order", false),
    info("lios-rand2", "LIOS ablation: random stream choice", false),
    info("lios-rand", "LIOS ablation: both random", false),
    info("opara", "Opara stream allocation and launch order", false),
    info(
        "iops",
        "IOPS: block split, merge versus parallel per stage, templated DP",
        false,
    ),
    info(
        "hios-lp",
        "HIOS longest valid paths + intra-GPU window",
        true,
    ),
    info("hios-lp-inter", "HIOS-LP without the intra-GPU step", true),
    info("hios-mr", "HIOS mapping-recording + intra-GPU window", true),
    info("hios-mr-inter", "HIOS-MR without the intra-GPU step", true),
];

/// The registered schedulers, in the order tables list them.
pub fn schedulers() -> &'static [SchedulerInfo] {
    SCHEDULERS
}

/// Names of the registered schedulers.
pub fn scheduler_names() -> Vec<&'static str> {
    SCHEDULERS.iter().map(|s| s.name).collect()
}

/// The registry entry named exactly `name`; a near miss is an error suggesting the closest.
pub fn scheduler_info(name: &str) -> Result<&'static SchedulerInfo> {
    names::lookup("scheduler", name, SCHEDULERS, |s| Known::plain(s.name))
        .map_err(Error::UnknownScheduler)
}

/// The scheduler registered under exactly `name`, with default options.
pub fn scheduler(name: &str) -> Result<Box<dyn Scheduler>> {
    scheduler_with(name, &SchedulerOptions::default())
}

/// The scheduler registered under exactly `name`, with `opts`.
pub fn scheduler_with(name: &str, opts: &SchedulerOptions) -> Result<Box<dyn Scheduler>> {
    use opsched_hios::{HiosLp, HiosMr, HiosOptions};
    let name = scheduler_info(name)?.name;
    let hios = |inter_only| HiosOptions {
        window: opts.window,
        inter_only,
    };
    let ios = |variant| opsched_ios_dp::IosOptions {
        r: opts.ios_r,
        s: opts.ios_s,
        part: opts.ios_part,
        variant,
        budget: opts.ios_budget,
    };
    let s: Box<dyn Scheduler> = match name {
        "sequential" => Box::new(opsched_baselines::Sequential),
        "greedy" => Box::new(opsched_baselines::Greedy),
        "nimble" => Box::new(opsched_baselines::Nimble),
        "opara" => Box::new(opsched_opara::Opara),
        "iops" => Box::new(opsched_iops::Iops::default()),
        "hios-lp" => Box::new(HiosLp::new(hios(false))),
        "hios-lp-inter" => Box::new(HiosLp::new(hios(true))),
        "hios-mr" => Box::new(HiosMr::new(hios(false))),
        "hios-mr-inter" => Box::new(HiosMr::new(hios(true))),
        other => match (
            opsched_ios_dp::IosVariant::from_name(other),
            opsched_lios::Lios::from_name(other, opts.seed),
        ) {
            (Some(variant), _) => Box::new(opsched_ios_dp::Ios::new(ios(variant))),
            (None, Some(lios)) => Box::new(lios),
            // A registry entry without a constructor: the registry test catches this.
            (None, None) => {
                return Err(Error::Unavailable(format!(
                    "scheduler '{other}' is registered but not built"
                )))
            }
        },
    };
    Ok(s)
}

/// One algorithm's row of a comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    pub algo: String,
    pub makespan_ms: f64,
    /// Sequential makespan / this makespan.
    pub speedup: f64,
    /// This makespan / the lower bound (1 = provably optimal).
    pub gap: f64,
    pub schedule_time_ms: f64,
    pub stats: opsched_schedule::SchedulerStats,
}

/// Every algorithm of a comparison, evaluated under one cost model on one platform.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ComparisonTable {
    pub model: String,
    pub ops: usize,
    pub gpus: usize,
    pub streams: usize,
    pub device: &'static str,
    pub link: &'static str,
    pub cost_model: String,
    /// How the simulated runtime executes the schedules.
    pub exec: ExecMode,
    pub sequential_ms: f64,
    pub lower_bound: LowerBound,
    pub rows: Vec<Comparison>,
}

/// The algorithms [`best_schedule`] tries besides sequential: the single-GPU ones without their
/// ablations and partial variants (IOS's two halves, LIOS's random orders).
pub const BEST_CANDIDATES: &[&str] = &["greedy", "nimble", "ios", "lios", "opara", "iops"];
/// What [`best_schedule`] adds on a platform of several GPUs.
pub const BEST_MULTI_GPU: &[&str] = &["hios-lp", "hios-mr"];

/// The schedule [`best_schedule`] picked.
#[derive(Clone, Debug)]
pub struct Best {
    /// The algorithm that found it.
    pub algo: &'static str,
    pub schedule: Schedule,
    /// Its simulated makespan, and the sequential schedule's, ms.
    pub makespan_ms: f64,
    pub sequential_ms: f64,
}

/// The schedule of `g` that simulates fastest under `cost` in execution mode `mode`: the
/// sequential one or one of [`BEST_CANDIDATES`] (and [`BEST_MULTI_GPU`] where `platform` has
/// several GPUs), what `opsched run --algo best` runs. A tie goes to the earlier (sequential
/// first); an algorithm that fails (a search budget, a platform it does not fit) is skipped
/// with a warning.
pub fn best_schedule(
    g: &Graph,
    platform: &opsched_schedule::Platform,
    cost: &dyn CostModel,
    opts: &SchedulerOptions,
    mode: ExecMode,
) -> Result<Best> {
    let gpus = platform.gpus.max(1);
    let (schedule, _) = opsched_baselines::Sequential.schedule(g, platform, cost)?;
    let sequential_ms = evaluate_in(g, &schedule, cost, gpus, mode)?.makespan_ms;
    let mut best = Best {
        algo: "sequential",
        schedule,
        makespan_ms: sequential_ms,
        sequential_ms,
    };
    let multi = BEST_MULTI_GPU.iter().filter(|_| platform.gpus > 1);
    for &algo in BEST_CANDIDATES.iter().chain(multi) {
        let found = scheduler_with(algo, opts).and_then(|sched| {
            searched(
                g,
                sched.as_ref(),
                platform,
                cost,
                mode,
                &opsched_schedule::NoProgress,
            )
        });
        match found {
            Ok(run) if run.makespan_ms < best.makespan_ms => {
                (best.algo, best.schedule, best.makespan_ms) =
                    (algo, run.schedule, run.makespan_ms);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("best: {algo} on {} skipped: {e}", g.name),
        }
    }
    Ok(best)
}

/// Run each named scheduler on `g`, validate its schedule and simulate it under `cost` in
/// execution mode `mode`: the one code path behind `opsched compare` and `cargo xtask
/// bench-models`. `progress` hears each algorithm's name as a step, then the progress of its
/// search.
pub fn compare(
    g: &Graph,
    names: &[&str],
    platform: &opsched_schedule::Platform,
    cost: &dyn CostModel,
    opts: &SchedulerOptions,
    mode: ExecMode,
    progress: &dyn Progress,
) -> Result<ComparisonTable> {
    let seq = opsched_baselines::Sequential;
    let (seq_schedule, _) = seq.schedule(g, platform, cost)?;
    let sequential_ms = evaluate_in(g, &seq_schedule, cost, 1, mode)?.makespan_ms;
    let lower_bound = opsched_schedule::lower_bound(g, cost, platform.gpus.max(1));
    let mut rows = Vec::with_capacity(names.len());
    for name in names {
        progress.step(name);
        let sched = scheduler_with(name, opts)?;
        let run = searched(g, sched.as_ref(), platform, cost, mode, progress)?;
        rows.push(Comparison {
            algo: sched.name().to_string(),
            makespan_ms: run.makespan_ms,
            speedup: ratio(sequential_ms, run.makespan_ms),
            gap: ratio(run.makespan_ms, lower_bound.value()),
            schedule_time_ms: run.schedule_time_ms,
            stats: run.stats,
        });
    }
    Ok(ComparisonTable {
        model: g.name.clone(),
        ops: g.op_count(),
        gpus: platform.gpus,
        streams: platform.streams,
        device: platform.device.name,
        link: platform.link.name,
        cost_model: cost.name(),
        exec: mode,
        sequential_ms,
        lower_bound,
        rows,
    })
}

/// One scheduler's schedule of a graph, validated and simulated ([`searched`]).
struct Searched {
    schedule: Schedule,
    stats: opsched_schedule::SchedulerStats,
    /// How long the search took (not the validation or the simulation).
    schedule_time_ms: f64,
    makespan_ms: f64,
}

/// `sched`'s schedule of `g`, validated for `platform` and simulated under `cost` in `mode`:
/// what [`compare`] tabulates and [`best_schedule`] picks from.
fn searched(
    g: &Graph,
    sched: &dyn opsched_schedule::Scheduler,
    platform: &opsched_schedule::Platform,
    cost: &dyn CostModel,
    mode: ExecMode,
    progress: &dyn Progress,
) -> Result<Searched> {
    let start = std::time::Instant::now();
    let (schedule, stats) = sched.schedule_with_progress(g, platform, cost, progress)?;
    let schedule_time_ms = start.elapsed().as_secs_f64() * 1e3;
    opsched_schedule::validate(g, &schedule, platform)?;
    let makespan_ms = evaluate_in(g, &schedule, cost, platform.gpus, mode)?.makespan_ms;
    Ok(Searched {
        schedule,
        stats,
        schedule_time_ms,
        makespan_ms,
    })
}

/// A ratio of makespans that stays finite when both are zero.
pub fn ratio(num: f64, den: f64) -> f64 {
    if den > 0.0 {
        num / den
    } else if num > 0.0 {
        f64::INFINITY
    } else {
        1.0
    }
}

// ---------------------------------------------------------------------------------------------
// Cost models

/// Which cost model to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CostKind {
    /// The analytical GPU model (roofline, SM shares, contention).
    Analytical,
    /// HIOS's stage law, for cost-annotated DAGs.
    HiosSim,
    /// Operators never slow each other down.
    Ideal,
    /// Measured times from the persistent cost cache, falling back to the analytical model.
    Cache,
    /// Measured times from the committed profiles (`fixtures/costs/<device>/*/ops.json`),
    /// falling back to the analytical model; `measured:NAME` picks the profiles' device.
    Measured,
}

impl CostKind {
    /// Every kind, as named on the command line.
    pub const ALL: [CostKind; 5] = [
        CostKind::Analytical,
        CostKind::HiosSim,
        CostKind::Ideal,
        CostKind::Cache,
        CostKind::Measured,
    ];

    /// The name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            CostKind::Analytical => "analytical",
            CostKind::HiosSim => "hios-sim",
            CostKind::Ideal => "ideal",
            CostKind::Cache => "cache",
            CostKind::Measured => "measured",
        }
    }

    /// One line for help texts.
    pub fn about(self) -> &'static str {
        match self {
            CostKind::Analytical => {
                "roofline times and a contention law from the device preset's published figures"
            }
            CostKind::HiosSim => "HIOS's stage law, for cost-annotated DAGs (their default)",
            CostKind::Ideal => "operators never slow each other down",
            CostKind::Cache => {
                "times measured on a GPU, from the persistent cost cache (--cache, \
                 $OPSCHED_CACHE or the user cache directory)"
            }
            CostKind::Measured => {
                "measured[:DEVICE]: committed GPU profiles (fixtures/costs/<device>, or --costs \
                 DIR), the analytical model for operators they lack (a note names them)"
            }
        }
    }
}

impl fmt::Display for CostKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CostKind {
    type Err = Error;
    /// The kind named exactly `s` (`measured:NAME` is the measured kind, see [`CostSpec`] for
    /// the name); a near miss is an error suggesting the closest.
    fn from_str(s: &str) -> Result<Self> {
        let kind = match s.split_once(':') {
            Some((k, _)) if k == CostKind::Measured.as_str() => k,
            _ => s,
        };
        names::lookup("cost model", kind, &CostKind::ALL, |k| {
            Known::plain(k.as_str())
        })
        .copied()
        .map_err(Error::UnknownCost)
    }
}

/// The cost model to use when none is asked for: the hios-sim law for a cost-annotated DAG
/// (every operator abstract), the analytical model otherwise.
pub fn default_cost_kind(g: &Graph) -> CostKind {
    if opsched_graph::analysis::is_cost_annotated(g) {
        CostKind::HiosSim
    } else {
        CostKind::Analytical
    }
}

/// Where the analytical model's parameters come from.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Calibration {
    /// The committed device file of the preset (`fixtures/devices/<preset>.json`, compiled in)
    /// where there is one, else the published figures.
    #[default]
    Committed,
    /// The published figures and the formulas alone, even for a calibrated preset.
    Formulas,
    /// This device file (`--device-file`); it must calibrate the preset asked for.
    File(PathBuf),
}

/// The analytical model of `device` with the parameters `calibration` says.
pub fn analytical_model(
    device: &DevicePreset,
    link: &LinkPreset,
    calibration: &Calibration,
) -> Result<AnalyticalModel> {
    let file = match calibration {
        Calibration::Formulas => None,
        Calibration::Committed => DeviceFile::embedded(device.name),
        Calibration::File(path) => {
            let f = DeviceFile::load(path)?;
            if f.preset != device.name {
                return Err(Error::Cost(CostError::Calibration {
                    path: path.clone(),
                    message: format!(
                        "preset: the file calibrates '{}', not the device asked for ('{}'); pass \
                         --device {}",
                        f.preset, device.name, f.preset
                    ),
                }));
            }
            Some(f)
        }
    };
    Ok(match file {
        Some(f) => AnalyticalModel::calibrated(device.clone(), link.clone(), f),
        None => AnalyticalModel::new(device.clone(), link.clone()),
    })
}

/// Everything that picks a cost model besides its kind and the platform.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CostSpec {
    /// The cost cache for [`CostKind::Cache`] (default: the user's cache directory).
    pub cache: Option<PathBuf>,
    /// The analytical model's parameters (also the fallback of measured tables).
    pub calibration: Calibration,
    /// [`CostKind::Measured`]: the directory of committed profiles (default: the repository's
    /// `fixtures/costs`).
    pub costs_dir: Option<PathBuf>,
    /// [`CostKind::Measured`]: the profiles' device (`measured:NAME`; default: the preset's
    /// name), matched like a driver's device name ([`DevicePreset::for_device_name`]).
    pub measured_device: Option<String>,
    /// [`CostKind::Cache`] and [`CostKind::Measured`]: the layout of the measurements that
    /// answer first (the other layout's stand in where it has none; a note counts those).
    /// Default: the one `opsched run` stores activations in on a GPU
    /// ([`gpu::program::CUDA_LAYOUT`]).
    pub layout: Option<Layout>,
}

impl CostSpec {
    /// Parse a `--cost` value: the kind, and for `measured:NAME` the device name.
    pub fn parse_kind(&mut self, text: &str) -> Result<CostKind> {
        let kind = text.parse::<CostKind>()?;
        if kind == CostKind::Measured {
            self.measured_device = text
                .split_once(':')
                .map(|(_, name)| name.trim().to_string())
                .filter(|n| !n.is_empty());
        }
        Ok(kind)
    }
}

/// A cost model, with what the user should know about how it answers.
pub struct CostSetup {
    pub model: Box<dyn CostModel>,
    /// One line each, e.g. the operators a measured table lacks (estimated instead).
    pub notes: Vec<String>,
}

/// Build the cost model `kind` for graph `g` on `device` GPUs linked by `link`. `cache_path`
/// is the cost cache file for [`CostKind::Cache`] (default: the user's cache directory).
///
/// The hios-sim law is refused (naming the first such node) for graphs with operators that
/// carry no measured time.
pub fn cost_model(
    kind: CostKind,
    device: &DevicePreset,
    link: &LinkPreset,
    g: &Graph,
    cache_path: Option<&Path>,
) -> Result<Box<dyn CostModel>> {
    let spec = CostSpec {
        cache: cache_path.map(Path::to_path_buf),
        ..CostSpec::default()
    };
    Ok(cost_model_with(kind, device, link, g, &spec)?.model)
}

/// [`cost_model`] with every choice spelled out in `spec`, and notes for the user.
pub fn cost_model_with(
    kind: CostKind,
    device: &DevicePreset,
    link: &LinkPreset,
    g: &Graph,
    spec: &CostSpec,
) -> Result<CostSetup> {
    let base = analytical_model(device, link, &spec.calibration)?;
    let layout = spec.layout.unwrap_or(gpu::program::CUDA_LAYOUT);
    let plain = |model: Box<dyn CostModel>| CostSetup {
        model,
        notes: Vec::new(),
    };
    match kind {
        CostKind::Analytical => Ok(plain(Box::new(base))),
        CostKind::HiosSim => {
            HiosSimLaw::check(g)?;
            Ok(plain(Box::new(HiosSimLaw::new(base))))
        }
        CostKind::Ideal => Ok(plain(Box::new(IdealModel::new(base)))),
        CostKind::Cache => {
            let table = measured_from_cache(device, base, spec.cache.as_deref())?;
            Ok(with_coverage(g, table.with_layout(layout), "cache"))
        }
        CostKind::Measured => {
            let name = spec.measured_device.as_deref().unwrap_or(device.name);
            let dir = spec.costs_dir.clone().unwrap_or_else(committed_costs_dir);
            let table = measured_from_profiles(&dir, name, base)?;
            Ok(with_coverage(
                g,
                table.with_layout(layout),
                &format!("measured:{name}"),
            ))
        }
    }
}

/// The repository's committed profiles, `fixtures/costs`.
pub fn committed_costs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/costs")
}

/// A measured table with a note naming the operators of `g` it does not have, and one naming
/// those it has only in the other layout than the one it answers in.
fn with_coverage(g: &Graph, table: MeasuredTable<AnalyticalModel>, what: &str) -> CostSetup {
    let answers: Vec<_> = g.ops().map(|o| (o, table.measured_op_in(g, o))).collect();
    let named = |pick: &dyn Fn(Option<Layout>) -> bool| -> Vec<&str> {
        answers
            .iter()
            .filter(|(_, a)| pick(a.map(|(_, l)| l)))
            .map(|(o, _)| g.node(*o).name.as_str())
            .collect()
    };
    let missing = named(&|a| a.is_none());
    let other = table.layout().other();
    let elsewhere = named(&|a| a == Some(other));
    let mut notes = Vec::new();
    if !missing.is_empty() {
        notes.push(format!(
            "{what}: {} of {} operators are not measured and use the estimate of {}: {}",
            missing.len(),
            g.op_count(),
            table.fallback().name(),
            first_names(&missing)
        ));
    }
    if !elsewhere.is_empty() {
        notes.push(format!(
            "{what}: {} of {} operators were measured in {other} only, not in the {} asked \
             for, and use that time: {}",
            elsewhere.len(),
            g.op_count(),
            table.layout(),
            first_names(&elsewhere)
        ));
    }
    CostSetup {
        model: Box::new(table),
        notes,
    }
}

/// The first few of `names`, then how many more.
fn first_names(names: &[&str]) -> String {
    const SHOWN: usize = 8;
    let more = names.len().saturating_sub(SHOWN);
    let mut s = names[..names.len().min(SHOWN)].join(", ");
    if more > 0 {
        s.push_str(&format!(" and {more} more"));
    }
    s
}

/// The committed profiles of one device: every `DIR/<device>/*/ops.json` (the profiler's
/// export, one directory per model and batch) in one table, keyed by operator signature, so a
/// profile serves every model with the same operators. `device` is a directory name or, like a
/// driver's device name, matched by the directory whose letters and digits contain it.
pub fn measured_from_profiles(
    dir: &Path,
    device: &str,
    base: AnalyticalModel,
) -> Result<MeasuredTable<AnalyticalModel>> {
    let err = |message: String| {
        Error::Cost(CostError::Cache {
            path: dir.to_path_buf(),
            message,
        })
    };
    let norm = |s: &str| -> String {
        s.chars()
            .filter(char::is_ascii_alphanumeric)
            .map(|c| c.to_ascii_lowercase())
            .collect()
    };
    let mut devices: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().is_dir())
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    devices.sort();
    let want = norm(device);
    let chosen = devices
        .iter()
        .find(|d| d.as_str() == device)
        .or_else(|| {
            devices
                .iter()
                .find(|d| !want.is_empty() && norm(d).contains(&want))
        })
        .ok_or_else(|| {
            err(format!(
                "no committed profiles for '{device}' ({}); profile on that GPU first (`cargo \
                 xtask profile`)",
                if devices.is_empty() {
                    "there are none".to_string()
                } else {
                    format!("there are: {}", devices.join(", "))
                }
            ))
        })?;
    let device_dir = dir.join(chosen);
    let mut tables: Vec<PathBuf> = std::fs::read_dir(&device_dir)
        .map_err(|e| err(format!("{}: {e}", device_dir.display())))?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("ops.json"))
        .filter(|p| p.is_file())
        .collect();
    tables.sort();
    let mut table = MeasuredTable::new(base).with_source(chosen.clone());
    for path in &tables {
        let text = std::fs::read_to_string(path).map_err(|source| CostError::Io {
            path: path.clone(),
            source,
        })?;
        let rows: Vec<opsched_cost::measured::TableRow> =
            serde_json::from_str(&text).map_err(|e| err(format!("{}: {e}", path.display())))?;
        for (i, row) in rows.into_iter().enumerate() {
            table
                .insert(row)
                .map_err(|why| err(format!("{}: row {i}: {why}", path.display())))?;
        }
    }
    if table.is_empty() {
        return Err(err(format!(
            "{}: no ops.json with measurements under it",
            device_dir.display()
        )));
    }
    Ok(table)
}

/// The measurements of the cost cache (`cache_path`, else the default location) taken on the
/// GPU model `device`, falling back to `base` for anything not measured.
///
/// The cache keys measurements by the driver's device name (e.g. "NVIDIA H100 80GB HBM3"); the
/// preset matches a name equal to its full name, else one whose letters and digits contain the
/// preset's name ("h100"). A cache with no measurements for the device is an error: asking for
/// measured costs and silently getting estimates would mislead.
fn measured_from_cache(
    device: &DevicePreset,
    base: AnalyticalModel,
    cache_path: Option<&Path>,
) -> Result<MeasuredTable<AnalyticalModel>> {
    let cache = match cache_path {
        Some(p) => CostCache::open(p)?,
        None => CostCache::open_default()?,
    };
    // A damaged file was moved aside (the cache warned); a missing one is named here, since
    // "no measurements" would hide a mistyped path.
    if !cache.exists() && cache.recovered().is_none() {
        return Err(Error::Cost(CostError::Cache {
            path: cache.path().to_path_buf(),
            message: "no such file; `opsched profile MODEL` measures costs into the cache \
                      (--cache PATH or $OPSCHED_CACHE choose the file)"
                .into(),
        }));
    }
    let names: BTreeSet<&str> = cache
        .entries()
        .map(|(k, _)| k.device.name.as_str())
        .collect();
    let norm = |s: &str| -> String {
        s.chars()
            .filter(char::is_ascii_alphanumeric)
            .map(|c| c.to_ascii_lowercase())
            .collect()
    };
    let want = norm(device.name);
    let matching: Vec<&str> = match names.iter().find(|n| **n == device.full_name) {
        Some(n) => vec![*n],
        None => names
            .iter()
            .copied()
            .filter(|n| norm(n).contains(&want))
            .collect(),
    };
    let Some(&chosen) = matching.first() else {
        let held = if names.is_empty() {
            "it holds no measurements".to_string()
        } else {
            format!(
                "it holds measurements of {}",
                names.iter().copied().collect::<Vec<_>>().join(", ")
            )
        };
        return Err(Error::Cost(CostError::Cache {
            path: cache.path().to_path_buf(),
            message: format!(
                "no measurements for device '{}' ({held}); measure on that GPU first or pick \
                 another --device",
                device.name
            ),
        }));
    };
    if matching.len() > 1 {
        tracing::warn!(
            "cost cache {}: several devices match '{}' ({}); using '{chosen}'",
            cache.path().display(),
            device.name,
            matching.join(", ")
        );
    }
    Ok(MeasuredTable::from_cache(&cache, chosen, base))
}

// ---------------------------------------------------------------------------------------------
// Evaluation

/// A schedule evaluated by the simulator.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Evaluation {
    pub timeline: Timeline,
    pub makespan_ms: f64,
    pub lower_bound: LowerBound,
}

/// Lower `s`, simulate it under `cost` (replayed as a CUDA graph), and compute the lower bound
/// for `gpus` GPUs: the one evaluator behind every number opsched reports. (Validate first with
/// [`schedule::validate()`]: this function trusts the schedule.)
pub fn evaluate(g: &Graph, s: &Schedule, cost: &dyn CostModel, gpus: usize) -> Result<Evaluation> {
    evaluate_in(g, s, cost, gpus, ExecMode::Graph)
}

/// [`evaluate`] in execution mode `mode` (eager: the host issues in the runtime's host order,
/// [`schedule::HostProgram`], which follows the plan's launch order).
pub fn evaluate_in(
    g: &Graph,
    s: &Schedule,
    cost: &dyn CostModel,
    gpus: usize,
    mode: ExecMode,
) -> Result<Evaluation> {
    let plan = opsched_schedule::lower(g, s)?;
    let timeline = opsched_schedule::simulate_with(g, &plan, cost, &SimOptions { mode })?;
    // Inputs are validated at the door; this keeps a cost model's overflow from ever being
    // reported as a result.
    if !timeline.makespan_ms.is_finite() {
        return Err(Error::Schedule(ScheduleError::Invalid(format!(
            "the simulated makespan is {} ms under {}: an operator or transfer time is too large",
            timeline.makespan_ms,
            cost.name()
        ))));
    }
    let lower_bound = opsched_schedule::lower_bound(g, cost, gpus.max(1));
    Ok(Evaluation {
        makespan_ms: timeline.makespan_ms,
        timeline,
        lower_bound,
    })
}

/// Number of GPUs a schedule uses (its GPU lists, empty ones included).
pub fn schedule_gpus(s: &Schedule) -> usize {
    match s {
        Schedule::Stages(p) => p.gpus.len(),
        Schedule::Streams(p) => p.gpus.len(),
    }
}

/// Number of streams per GPU a schedule needs: the most groups of any stage, or the most
/// streams of any GPU.
pub fn schedule_streams(s: &Schedule) -> usize {
    match s {
        Schedule::Stages(p) => p
            .gpus
            .iter()
            .flatten()
            .map(|st| st.groups.len())
            .max()
            .unwrap_or(1),
        Schedule::Streams(p) => p.gpus.iter().map(|g| g.streams.len()).max().unwrap_or(1),
    }
    .max(1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use opsched_cost::cache::{CacheKey, DeviceFingerprint, Measurement};
    use opsched_cost::signature::op_signature;

    #[test]
    fn cache_cost_reads_the_measurements_of_the_preset_device() {
        let dir = std::env::temp_dir().join(format!("opsched-facade-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("costs.bin");
        let g = zoo::build("squeezenet", &zoo::ZooConfig::default()).unwrap();
        let op = g.ops().next().unwrap();
        let mut cache = CostCache::open(&path).unwrap();
        cache.insert(
            CacheKey {
                device: DeviceFingerprint {
                    name: "NVIDIA H100 80GB HBM3".into(),
                    sms: 132,
                    driver: "550.54".into(),
                    cudnn: "9.1".into(),
                },
                signature: op_signature(&g, op),
                batch: 1,
                dtype: "f32".into(),
            },
            Measurement::exact(0.125),
        );
        cache.save().unwrap();
        let (h100, v100) = (
            DevicePreset::by_name("h100").unwrap(),
            DevicePreset::by_name("v100").unwrap(),
        );
        let link = LinkPreset::by_name("nvlink4").unwrap();
        let m = cost_model(CostKind::Cache, &h100, &link, &g, Some(&path)).unwrap();
        assert_eq!(m.op_time(&g, op), 0.125);
        let e = cost_model(CostKind::Cache, &v100, &link, &g, Some(&path))
            .err()
            .unwrap();
        assert!(e.is_user_error());
        let e = e.to_string();
        assert!(
            e.contains("'v100'") && e.contains("NVIDIA H100 80GB HBM3") && e.contains("costs.bin"),
            "{e}"
        );
        let e = cost_model(
            CostKind::Cache,
            &h100,
            &link,
            &g,
            Some(&dir.join("none.bin")),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("none.bin") && e.contains("no such file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn measured_costs_answer_in_the_layout_asked_for_and_say_where_they_cannot() {
        let dir =
            std::env::temp_dir().join(format!("opsched-facade-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("costs.bin");
        let g = zoo::build("squeezenet", &zoo::ZooConfig::default()).unwrap();
        let ops: Vec<opsched_graph::NodeId> = g.ops().collect();
        let key = |op, layout| CacheKey {
            device: DeviceFingerprint {
                name: "NVIDIA H100 80GB HBM3".into(),
                sms: 132,
                driver: "550.54".into(),
                cudnn: "9.1".into(),
            },
            signature: opsched_cost::signature::measured_in(&op_signature(&g, op), layout),
            batch: 1,
            dtype: "f32".into(),
        };
        let mut cache = CostCache::open(&path).unwrap();
        // The first operator in both layouts, the second in NCHW only.
        cache.insert(key(ops[0], Layout::Nchw), Measurement::exact(0.5));
        cache.insert(key(ops[0], Layout::Nhwc), Measurement::exact(0.25));
        cache.insert(key(ops[1], Layout::Nchw), Measurement::exact(0.75));
        cache.save().unwrap();
        let (h100, link) = (
            DevicePreset::by_name("h100").unwrap(),
            LinkPreset::by_name("nvlink4").unwrap(),
        );
        let setup = |layout| {
            let spec = CostSpec {
                cache: Some(path.clone()),
                layout,
                ..CostSpec::default()
            };
            cost_model_with(CostKind::Cache, &h100, &link, &g, &spec).unwrap()
        };
        let name = |op: opsched_graph::NodeId| g.node(op).name.clone();
        // By default in the layout a GPU run uses: channels last.
        for layout in [None, Some(Layout::Nhwc)] {
            let s = setup(layout);
            assert_eq!(s.model.op_time(&g, ops[0]), 0.25);
            assert_eq!(s.model.op_time(&g, ops[1]), 0.75);
            let note = s.notes.iter().find(|n| n.contains("only")).unwrap();
            assert!(
                note.contains("1 of")
                    && note.contains("in nchw only")
                    && note.contains(&name(ops[1])),
                "{note}"
            );
        }
        let s = setup(Some(Layout::Nchw));
        assert_eq!(s.model.op_time(&g, ops[0]), 0.5);
        assert_eq!(s.model.op_time(&g, ops[1]), 0.75);
        assert!(s.notes.iter().all(|n| !n.contains("only")), "{:?}", s.notes);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cost_kinds_parse_and_print() {
        for k in CostKind::ALL {
            assert_eq!(k.to_string().parse::<CostKind>().ok(), Some(k));
        }
        let e = "HIOS_SIM".parse::<CostKind>().err().map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("did you mean 'hios-sim'?")),
            "{e:?}"
        );
        let e = "fast".parse::<CostKind>().err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("'fast'") && e.contains("hios-sim")));
    }

    #[test]
    fn registry_knows_sequential_and_lists_names_on_error() {
        assert!(scheduler_names().contains(&"sequential"));
        assert_eq!(
            scheduler("sequential").map(|s| s.name().to_string()).ok(),
            Some("sequential".into())
        );
        let e = scheduler("magic")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("'magic'") && e.contains("sequential"), "{e}");
        // Every registered name builds its own scheduler; near misses build nothing.
        for info in schedulers() {
            assert_eq!(
                scheduler(info.name).map(|s| s.name().to_string()).ok(),
                Some(info.name.to_string())
            );
        }
        for (near, meant) in [
            ("IOS", "ios"),
            ("ios_parallel", "ios-parallel"),
            ("hios-lp-inter ", "hios-lp-inter"),
            ("LIOS-rand1", "lios-rand1"),
        ] {
            match scheduler(near) {
                Err(Error::UnknownScheduler(e)) => {
                    assert_eq!(e.suggestions.first(), Some(&meant), "{e}")
                }
                other => panic!("{near}: {:?}", other.map(|s| s.name().to_string())),
            }
        }
    }
}
