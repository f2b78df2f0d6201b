//! Calibration: fit a device file to GPU measurements, and tell how close the simulator comes to
//! them (the fidelity report).
//!
//! Both start from a measurement file ([`Measurements`]) and rebuild what ran: the zoo model at
//! the run's batch, and the schedule (the recorded one, else the one the algorithm searches
//! under the preset's uncalibrated formulas, which is how the runs of 2026-11-22 were made).
//!
//! **The fit** ([`fit`]) has two parts.
//! 1. Overheads, in closed form from the overhead samples: the launch floor is the time per
//!    kernel of a serial chain in a CUDA graph; a fork/join stage of `n` tiny kernels costs one
//!    kernel, two event records and `n` waits (`n - 1` joins on the origin stream, one fork wait
//!    on each forked stream is in parallel), so `stage - kernel = 2 r + n w` is a least-squares
//!    line over the stage samples; eager launch and sync are read as they are.
//! 2. The model's eleven other parameters ([`Params`]: efficiency and fixed latency of conv,
//!    matmul and depthwise kernels, the latency of element-wise kernels, the memory efficiency,
//!    the fill exponent, the share exponent and the interference constant of the contention
//!    law), by a
//!    Hooke-Jeeves pattern search on their logarithms, minimising a Huber
//!    loss of log(predicted / measured) over the batch-1 CUDA-graph runs (the fastest process
//!    of each: the processes disagree, by up to 50% on 2026-11-22, because cuDNN picked other
//!    convolution algorithms in each), the contention samples (the convolution alone and the
//!    slowdown of its copies together) and the per-operator samples. Deterministic: fixed
//!    start, fixed steps, a fixed budget of evaluations.
//!
//! **Fidelity** ([`fidelity`]): per run, predicted against measured (fastest process) and the
//! error; per model and batch (CUDA graph), Spearman's rank correlation over the algorithms and
//! whether the algorithm predicted fastest is within 3% of the measured fastest.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use opsched_cost::calibration::{Curve, DeviceFile, Efficiency, Family, Overheads, Provenance};
use opsched_cost::measurements::{Measurements, OverheadKind, RunMode, RunSample};
use opsched_cost::{AnalyticalModel, CostModel, DevicePreset, LinkPreset};
use opsched_graph::{Conv2d, DType, Graph, GraphBuilder};
use opsched_schedule::{ExecMode, LaunchPlan, Platform, SimOptions};
use serde::Serialize;

use crate::{zoo, Error, Result, SchedulerOptions};

/// The bounds within which an error counts as close: batch 1 (fitted) and other batches.
pub const FITTED_TOLERANCE: f64 = 0.10;
pub const UNFITTED_TOLERANCE: f64 = 0.15;
/// The predicted-best algorithm is good enough when its measured time is within this of the
/// measured best.
pub const BEST_TOLERANCE: f64 = 0.03;

/// One kernel family's fitted efficiency (a constant curve) and latency (us).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct FamilyParams {
    pub efficiency: f64,
    pub latency_us: f64,
}

/// The parameters the fit moves (everything of a device file but the overheads).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Params {
    pub conv: FamilyParams,
    pub matmul: FamilyParams,
    pub depthwise: FamilyParams,
    /// Latency of element-wise, pooling and copy kernels (their efficiency stays 0.5: they
    /// are bound by memory).
    pub elementwise_latency_us: f64,
    pub memory: f64,
    pub fill_exponent: f64,
    pub share_exponent: f64,
    pub alpha: f64,
}

/// Bounds of the search, in the order of `Params::to_vec`. Efficiencies are shares of the FP32
/// peak: cuDNN's convolutions and cuBLAS's products both run on TF32 tensor cores by default
/// (up to 7.4x the FP32 peak on an H100; the products were bounded by 1, FP32's peak, until
/// they did, and the 2026-11-22 fit sat on that bound), and memory efficiency is at most the
/// datasheet bandwidth.
const LOWER: [f64; 11] = [
    1e-3, 1e-2, 1e-3, 1e-2, 1e-4, 1e-2, 1e-2, 0.05, 0.05, 0.05, 0.0,
];
const UPPER: [f64; 11] = [5.0, 1e3, 5.0, 1e3, 5.0, 1e3, 1e3, 1.0, 1.0, 1.0, 10.0];
/// Which parameters the search moves on a log scale (scales and rates, positive, where a step
/// should be a ratio); `alpha` moves linearly, since zero (no interference) is a value it may
/// take and on a log scale the loss is flat near it, where the search would get stranded.
const LOG_SCALE: [bool; 11] = [
    true, true, true, true, true, true, true, true, true, true, false,
];
const ELEMENTWISE_EFFICIENCY: f64 = 0.5;
/// The cap on the interference penalty the fit writes (it fits `alpha` under it).
const ALPHA_CAP: f64 = 2.0;

impl Params {
    /// Where the fit starts: the formulas' efficiencies and a microsecond of latency.
    pub fn start() -> Self {
        let fam = |efficiency| FamilyParams {
            efficiency,
            latency_us: 1.0,
        };
        Params {
            conv: fam(0.7),
            matmul: fam(0.7),
            depthwise: fam(0.3),
            elementwise_latency_us: 1.0,
            memory: 0.8,
            fill_exponent: 0.9,
            share_exponent: 0.9,
            alpha: 0.1,
        }
    }

    fn to_vec(self) -> [f64; 11] {
        [
            self.conv.efficiency,
            self.conv.latency_us,
            self.matmul.efficiency,
            self.matmul.latency_us,
            self.depthwise.efficiency,
            self.depthwise.latency_us,
            self.elementwise_latency_us,
            self.memory,
            self.fill_exponent,
            self.share_exponent,
            self.alpha,
        ]
    }

    /// The point of the search at these parameters.
    fn to_search(self) -> Vec<f64> {
        let v = self.to_vec();
        (0..v.len())
            .map(|i| if LOG_SCALE[i] { v[i].ln() } else { v[i] })
            .collect()
    }

    /// From a point of the search (clamped into the bounds).
    fn from_search(v: &[f64]) -> Self {
        let c = |i: usize| {
            let x = if LOG_SCALE[i] { v[i].exp() } else { v[i] };
            x.clamp(LOWER[i], UPPER[i])
        };
        let fam = |i: usize| FamilyParams {
            efficiency: c(i),
            latency_us: c(i + 1),
        };
        Params {
            conv: fam(0),
            matmul: fam(2),
            depthwise: fam(4),
            elementwise_latency_us: c(6),
            memory: c(7),
            fill_exponent: c(8),
            share_exponent: c(9),
            alpha: c(10),
        }
    }

    /// The parameters of a device file this fit could have written (constant curves, the
    /// element-wise efficiency and interference cap the fit keeps); `None` for one it could not
    /// (a curve of several points, another element-wise efficiency or cap), so a search never
    /// starts from a file it would misread.
    pub fn of_file(f: &DeviceFile) -> Option<Params> {
        let constant = |c: &Curve| match c.0.as_slice() {
            [[_, e]] => Some(*e),
            _ => None,
        };
        let fam = |f: &Family| {
            Some(FamilyParams {
                efficiency: constant(&f.curve)?,
                latency_us: f.latency_us,
            })
        };
        let e = &f.efficiency;
        let kept = constant(&e.elementwise.curve)? == ELEMENTWISE_EFFICIENCY
            && f.contention.alpha_cap == ALPHA_CAP;
        kept.then_some(())?;
        Some(Params {
            conv: fam(&e.conv)?,
            matmul: fam(&e.matmul)?,
            depthwise: fam(&e.depthwise)?,
            elementwise_latency_us: e.elementwise.latency_us,
            memory: e.memory,
            fill_exponent: e.fill_exponent,
            share_exponent: f.contention.share_exponent,
            alpha: f.contention.alpha,
        })
    }

    /// A device file with these parameters, the given overheads and provenance.
    pub fn device_file(
        &self,
        preset: &str,
        overheads: Overheads,
        provenance: Provenance,
    ) -> DeviceFile {
        let fam = |f: FamilyParams| Family {
            curve: Curve::constant(f.efficiency),
            latency_us: f.latency_us,
        };
        DeviceFile {
            format: opsched_cost::calibration::FORMAT.into(),
            version: opsched_cost::calibration::VERSION,
            preset: preset.into(),
            provenance,
            overheads,
            contention: opsched_cost::calibration::Contention {
                share_exponent: self.share_exponent,
                alpha: self.alpha,
                alpha_cap: ALPHA_CAP,
            },
            efficiency: Efficiency {
                conv: fam(self.conv),
                matmul: fam(self.matmul),
                depthwise: fam(self.depthwise),
                elementwise: Family {
                    curve: Curve::constant(ELEMENTWISE_EFFICIENCY),
                    latency_us: self.elementwise_latency_us,
                },
                memory: self.memory,
                fill_exponent: self.fill_exponent,
            },
        }
    }
}

/// The overheads of the overhead samples (see the module docs); `None` for a quantity nothing
/// measured.
pub fn fit_overheads(m: &Measurements) -> Overheads {
    let mean = |what: OverheadKind| {
        let v: Vec<f64> = m
            .overheads
            .iter()
            .filter(|o| o.what == what)
            .map(|o| o.us)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let kernel = mean(OverheadKind::GraphKernel).unwrap_or(0.0);
    // stage - kernel = 2 r + n w, least squares over the fork/join samples.
    let pts: Vec<(f64, f64)> = m
        .overheads
        .iter()
        .filter(|o| o.what == OverheadKind::ForkJoin)
        .filter_map(|o| Some((f64::from(o.streams?), o.us - kernel)))
        .collect();
    let (record, wait) = match pts.len() {
        0 => (0.0, 0.0),
        1 => (pts[0].1 / 2.0, 0.0),
        n => {
            let n = n as f64;
            let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
            let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
            let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
            let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
            let w = if sxx > 0.0 { (sxy / sxx).max(0.0) } else { 0.0 };
            (((my - w * mx) / 2.0).max(0.0), w)
        }
    };
    Overheads {
        kernel_launch_us: kernel,
        event_record_us: record,
        event_wait_us: wait,
        eager_launch_us: mean(OverheadKind::EagerLaunch).unwrap_or(0.0),
        eager_sync_us: mean(OverheadKind::EagerSync).unwrap_or(0.0),
    }
}

/// A measured run made ready to simulate: its graph, lowered schedule and target.
struct PreparedRun {
    sample: RunSample,
    graph: Arc<Graph>,
    plan: LaunchPlan,
    sim: SimOptions,
}

/// The graph of a contention sample: one input, `copies` identical convolutions of it (what
/// [`crate::measure`] times and the fit simulates).
pub fn contention_graph(k: &opsched_cost::measurements::ConvSpec, copies: u32) -> Result<Graph> {
    let mut b = GraphBuilder::new("contention", DType::F32);
    let x = b.input("x", vec![k.batch, k.in_channels, k.size, k.size]);
    for i in 0..copies {
        let conv = Conv2d {
            kernel: k.kernel,
            ..Conv2d::new(k.out_channels, 1)
        }
        .padding(k.kernel[0] / 2, k.kernel[1] / 2);
        b.conv(&format!("conv{i}"), x, conv);
    }
    Ok(b.finish()?)
}

/// A contention sample as a graph: one input, `copies` identical convolutions.
struct PreparedContention {
    graph: Graph,
    alone_ms: f64,
    slowdown: f64,
}

/// What the fit and the fidelity report simulate, built once.
pub struct Workload {
    preset: DevicePreset,
    link: LinkPreset,
    runs: Vec<PreparedRun>,
    contention: Vec<PreparedContention>,
    /// (graph, node, measured ms).
    ops: Vec<(Arc<Graph>, opsched_graph::NodeId, f64)>,
}

fn invalid(what: String) -> Error {
    Error::Unavailable(what)
}

impl Workload {
    /// Rebuild every run's model and schedule (see the module docs).
    pub fn prepare(m: &Measurements) -> Result<Self> {
        let preset = DevicePreset::by_name(&m.preset)?;
        let link = LinkPreset::by_name("nvlink4")?;
        let formulas = AnalyticalModel::new(preset.clone(), link.clone());
        let mut graphs: HashMap<(String, usize), Arc<Graph>> = HashMap::new();
        let mut graph = |model: &str, batch: usize| -> Result<Arc<Graph>> {
            if let Some(g) = graphs.get(&(model.to_string(), batch)) {
                return Ok(g.clone());
            }
            let cfg = zoo::ZooConfig {
                batch,
                input_size: None,
                dtype: DType::F32,
            };
            let g = Arc::new(crate::load_model(model, &cfg)?);
            graphs.insert((model.to_string(), batch), g.clone());
            Ok(g)
        };
        let mut runs = Vec::with_capacity(m.runs.len());
        for r in &m.runs {
            let g = graph(&r.model, r.batch)?;
            let schedule = match &r.schedule {
                Some(doc) => opsched_schedule::io::from_json(&g, doc)?,
                None => {
                    let platform = Platform {
                        gpus: 1,
                        streams: r.streams,
                        device: preset.clone(),
                        link: link.clone(),
                    };
                    let s = crate::scheduler_with(&r.algorithm, &SchedulerOptions::default())?;
                    s.schedule(&g, &platform, &formulas)?.0
                }
            };
            let mode = match r.mode {
                RunMode::Graph => ExecMode::Graph,
                RunMode::Eager => ExecMode::Eager,
            };
            runs.push(PreparedRun {
                plan: opsched_schedule::lower(&g, &schedule)?,
                sim: opsched_schedule::SimOptions { mode },
                sample: r.clone(),
                graph: g,
            });
        }
        let mut contention = Vec::with_capacity(m.contention.len());
        for c in &m.contention {
            contention.push(PreparedContention {
                graph: contention_graph(&c.conv, c.copies)?,
                alone_ms: c.alone_us / 1e3,
                slowdown: c.together_us / c.alone_us,
            });
        }
        let mut ops = Vec::with_capacity(m.ops.len());
        for o in &m.ops {
            let g = graph(&o.model, o.batch)?;
            let id = g.find(&o.node).ok_or_else(|| {
                invalid(format!(
                    "measurements: ops: {} at batch {} has no node '{}'",
                    o.model, o.batch, o.node
                ))
            })?;
            let sig = opsched_cost::signature::op_signature(&g, id);
            if !o.signature.is_empty() && o.signature != sig {
                return Err(invalid(format!(
                    "measurements: ops: {} node '{}' is {sig}, not the {} measured",
                    o.model, o.node, o.signature
                )));
            }
            // An operator that launches nothing (a concatenation written in place) takes no
            // time in the model whatever the parameters: nothing to fit.
            if opsched_cost::launches::launches(&g, id) > 0 {
                ops.push((g, id, o.ms));
            }
        }
        Ok(Workload {
            preset,
            link,
            runs,
            contention,
            ops,
        })
    }

    fn model(&self, file: &DeviceFile) -> AnalyticalModel {
        AnalyticalModel::calibrated(self.preset.clone(), self.link.clone(), file.clone())
    }

    /// The simulated latency of every run under `cost`.
    fn predict(&self, cost: &dyn CostModel) -> Result<Vec<f64>> {
        self.runs
            .iter()
            .map(|r| {
                Ok(opsched_schedule::simulate_with(&r.graph, &r.plan, cost, &r.sim)?.makespan_ms)
            })
            .collect()
    }

    /// The fit's loss of a model: Huber of log ratios over the CUDA-graph runs at `batches`,
    /// the contention and the operator samples (see the module docs).
    fn loss(&self, cost: &AnalyticalModel, batches: &[usize]) -> f64 {
        let mut total = 0.0;
        let fitted = |r: &RunSample| r.mode == RunMode::Graph && batches.contains(&r.batch);
        for r in self.runs.iter().filter(|r| fitted(&r.sample)) {
            match opsched_schedule::simulate_with(&r.graph, &r.plan, cost, &r.sim) {
                Ok(t) => total += huber((t.makespan_ms / r.sample.best_ms()).ln()),
                Err(_) => return f64::INFINITY,
            }
        }
        for c in &self.contention {
            let ops: Vec<_> = c.graph.ops().collect();
            let alone = cost.op_time(&c.graph, ops[0]);
            let groups: Vec<Vec<_>> = ops.iter().map(|&o| vec![o]).collect();
            let together = cost.stage_time(&c.graph, &groups);
            total += huber((alone / c.alone_ms).ln());
            total += huber((together / alone / c.slowdown).ln());
        }
        for (g, op, ms) in &self.ops {
            total += huber((cost.op_time(g, *op) / ms).ln());
        }
        total
    }
}

/// Huber loss with a 10% knee (log ratios beyond it count linearly, so one noisy run cannot
/// dominate).
fn huber(x: f64) -> f64 {
    const D: f64 = 0.1;
    if !x.is_finite() {
        return 1e6;
    }
    let a = x.abs();
    if a <= D {
        0.5 * a * a
    } else {
        D * (a - 0.5 * D)
    }
}

/// Hooke-Jeeves pattern search for the minimum of `f` from `x0`: explore each coordinate
/// `+-step` from the base point, keeping what improves; after a successful exploration jump
/// along the direction it moved (the pattern move) and explore there, as long as that keeps
/// improving; halve the step when an exploration finds nothing. Below `min_step` it starts
/// again with the first step, and stops when a descent gains nothing or after `max_evals`
/// evaluations. Deterministic and derivative-free, so the kinks a discrete-event
/// simulation puts into the loss do not trip it (Nelder-Mead's simplex collapses on them), and
/// the pattern moves follow the valleys that correlated parameters (a family's efficiency and
/// latency) make, where plain coordinate steps zigzag.
fn pattern_search(
    f: impl Fn(&[f64]) -> f64,
    x0: &[f64],
    mut step: f64,
    min_step: f64,
    max_evals: usize,
) -> (Vec<f64>, usize) {
    let evals = std::cell::Cell::new(0usize);
    let eval = |x: &[f64]| {
        evals.set(evals.get() + 1);
        f(x)
    };
    // Try each coordinate in turn from `x` (value `fx`); the best point found.
    let explore = |x: &[f64], fx: f64, step: f64| {
        let (mut x, mut fx) = (x.to_vec(), fx);
        for i in 0..x.len() {
            for dir in [1.0, -1.0] {
                let mut y = x.clone();
                y[i] += dir * step;
                let fy = eval(&y);
                if fy < fx {
                    (x, fx) = (y, fy);
                    break;
                }
            }
        }
        (x, fx)
    };
    let mut base = x0.to_vec();
    let mut fbase = eval(&base);
    let first_step = step;
    let mut restart_from = fbase;
    while evals.get() < max_evals {
        if step < min_step {
            // Converged: start again from here with the first step, which climbs out of the
            // shallow local minima that a kink of the roofline's max() makes; stop when a whole
            // descent gains nothing.
            if fbase >= restart_from * (1.0 - 1e-9) {
                break;
            }
            (restart_from, step) = (fbase, first_step);
        }
        let (mut x, mut fx) = explore(&base, fbase, step);
        if fx >= fbase {
            step /= 2.0;
            continue;
        }
        while evals.get() < max_evals {
            let pattern: Vec<f64> = x.iter().zip(&base).map(|(a, b)| 2.0 * a - b).collect();
            (base, fbase) = (x.clone(), fx);
            let fp = eval(&pattern);
            let (y, fy) = explore(&pattern, fp, step);
            if fy < fbase {
                (x, fx) = (y, fy);
            } else {
                break;
            }
        }
        (base, fbase) = (x, fx);
    }
    (base, evals.get())
}

/// A fitted device file and how well it fits.
#[derive(Clone, Debug)]
pub struct Fitted {
    pub file: DeviceFile,
    pub params: Params,
    pub loss: f64,
    /// Evaluations of the loss the search used (every start's).
    pub evals: usize,
}

/// Fit a device file to the CUDA-graph runs of `m` at `batches` and its other samples (see the
/// module docs): a descent from each of `starts` (none: [`Params::start`]), evaluating the
/// loss at most `max_evals` times each, the lowest loss kept; `provenance` is written into the
/// file.
pub fn fit(
    m: &Measurements,
    batches: &[usize],
    starts: &[Params],
    max_evals: usize,
    provenance: Provenance,
) -> Result<Fitted> {
    let work = Workload::prepare(m)?;
    let overheads = fit_overheads(m);
    let file_of = |p: &Params| p.device_file(&m.preset, overheads, provenance.clone());
    let objective = |v: &[f64]| work.loss(&work.model(&file_of(&Params::from_search(v))), batches);
    // The search is local: each start descends on its own (at most `max_evals` each), and the
    // lowest loss wins, the earlier start on a tie.
    let descend = |start: Params| {
        let (x, evals) = pattern_search(objective, &start.to_search(), 0.5, 0.002, max_evals);
        let params = Params::from_search(&x);
        let file = file_of(&params);
        let loss = work.loss(&work.model(&file), batches);
        tracing::info!(evals, loss, ?start, "calibration descent done");
        Fitted {
            file,
            params,
            loss,
            evals,
        }
    };
    let mut fitted = descend(starts.first().copied().unwrap_or_else(Params::start));
    for &start in starts.iter().skip(1) {
        let other = descend(start);
        let evals = fitted.evals + other.evals;
        if other.loss < fitted.loss {
            fitted = other;
        }
        fitted.evals = evals;
    }
    Ok(fitted)
}

/// One run, predicted against measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FidelityRow {
    pub model: String,
    pub algorithm: String,
    pub batch: usize,
    pub mode: RunMode,
    pub predicted_ms: f64,
    /// The fastest process.
    pub measured_ms: f64,
    /// Every process.
    pub processes: Vec<f64>,
    /// predicted / measured - 1.
    pub error: f64,
}

/// One model at one batch (CUDA graph): ranks and the predicted best.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelFidelity {
    pub model: String,
    pub batch: usize,
    pub algorithms: usize,
    /// Spearman's rank correlation of predicted and measured latency over the algorithms.
    pub spearman: f64,
    pub predicted_best: String,
    pub measured_best: String,
    /// Measured time of the predicted best over the measured best, minus 1.
    pub best_gap: f64,
    pub best_within: bool,
}

/// The fidelity report (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fidelity {
    pub cost_model: String,
    pub measurements: String,
    pub rows: Vec<FidelityRow>,
    pub models: Vec<ModelFidelity>,
    /// CUDA-graph runs at batch 1 within 10%, and how many there are.
    pub fitted_within: (usize, usize),
    /// CUDA-graph runs at other batches within 15%, and how many there are.
    pub unfitted_within: (usize, usize),
    /// Models (at a batch with several algorithms) whose predicted best is within 3%.
    pub best_within: (usize, usize),
    /// The profiler's check: per model and batch with per-operator samples and a sequential
    /// CUDA-graph run, the operators' times summed against that run.
    pub op_sums: Vec<OpSum>,
}

/// Per-operator times summed over a model (each operator by its signature's sample) against
/// its measured sequential CUDA-graph latency: a profiler that times the GPU, not the host,
/// makes them agree (within 10% is the goal).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpSum {
    pub model: String,
    pub batch: usize,
    pub sum_ms: f64,
    pub sequential_ms: f64,
    /// sum / sequential - 1.
    pub error: f64,
    /// Operators whose signature has no sample (left out of the sum).
    pub missing: usize,
}

/// [`OpSum`] of every sequential CUDA-graph run of `work` whose model and batch have samples.
fn op_sums(m: &Measurements, work: &Workload) -> Vec<OpSum> {
    let mut by_sig: HashMap<(&str, usize, &str), f64> = HashMap::new();
    for o in &m.ops {
        by_sig.insert((o.model.as_str(), o.batch, o.signature.as_str()), o.ms);
    }
    work.runs
        .iter()
        .filter(|r| r.sample.algorithm == "sequential" && r.sample.mode == RunMode::Graph)
        .filter(|r| {
            m.ops
                .iter()
                .any(|o| o.model == r.sample.model && o.batch == r.sample.batch)
        })
        .map(|r| {
            let g = &r.graph;
            let (mut sum, mut missing) = (0.0, 0);
            for op in g.ops() {
                let sig = opsched_cost::signature::op_signature(g, op);
                match by_sig.get(&(r.sample.model.as_str(), r.sample.batch, sig.as_str())) {
                    Some(ms) => sum += ms,
                    None => missing += 1,
                }
            }
            let seq = r.sample.best_ms();
            OpSum {
                model: r.sample.model.clone(),
                batch: r.sample.batch,
                sum_ms: sum,
                sequential_ms: seq,
                error: sum / seq - 1.0,
                missing,
            }
        })
        .collect()
}

/// Ranks with ties averaged (1-based).
fn ranks(xs: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..xs.len()).collect();
    idx.sort_by(|&a, &b| xs[a].total_cmp(&xs[b]));
    let mut r = vec![0.0; xs.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && xs[idx[j + 1]] == xs[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            r[k] = avg;
        }
        i = j + 1;
    }
    r
}

/// Spearman's rank correlation (Pearson's on ranks, so ties are handled); 0 when either side is
/// constant.
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    let (ra, rb) = (ranks(a), ranks(b));
    let n = ra.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (ma, mb) = (ra.iter().sum::<f64>() / n, rb.iter().sum::<f64>() / n);
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = ra.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = rb.iter().map(|y| (y - mb).powi(2)).sum();
    if va > 0.0 && vb > 0.0 {
        cov / (va * vb).sqrt()
    } else {
        0.0
    }
}

/// Compare `cost` with the measurements of `m` (named `name` in the report).
pub fn fidelity(m: &Measurements, name: &str, cost: &dyn CostModel) -> Result<Fidelity> {
    let work = Workload::prepare(m)?;
    let predicted = work.predict(cost)?;
    let rows: Vec<FidelityRow> = work
        .runs
        .iter()
        .zip(predicted)
        .map(|(r, p)| {
            let measured = r.sample.best_ms();
            FidelityRow {
                model: r.sample.model.clone(),
                algorithm: r.sample.algorithm.clone(),
                batch: r.sample.batch,
                mode: r.sample.mode,
                predicted_ms: p,
                measured_ms: measured,
                processes: r.sample.ms.clone(),
                error: p / measured - 1.0,
            }
        })
        .collect();
    let mut groups: BTreeMap<(String, usize), Vec<&FidelityRow>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.mode == RunMode::Graph) {
        groups
            .entry((r.model.clone(), r.batch))
            .or_default()
            .push(r);
    }
    let mut models = Vec::new();
    for ((model, batch), rs) in groups {
        if rs.len() < 2 {
            continue;
        }
        let p: Vec<f64> = rs.iter().map(|r| r.predicted_ms).collect();
        let mm: Vec<f64> = rs.iter().map(|r| r.measured_ms).collect();
        let argmin = |v: &[f64]| {
            (0..v.len())
                .min_by(|&a, &b| v[a].total_cmp(&v[b]))
                .unwrap_or(0)
        };
        let (pb, mb) = (argmin(&p), argmin(&mm));
        let best_gap = mm[pb] / mm[mb] - 1.0;
        models.push(ModelFidelity {
            model,
            batch,
            algorithms: rs.len(),
            spearman: spearman(&p, &mm),
            predicted_best: rs[pb].algorithm.clone(),
            measured_best: rs[mb].algorithm.clone(),
            best_gap,
            best_within: best_gap <= BEST_TOLERANCE,
        });
    }
    let count = |pick: &dyn Fn(&FidelityRow) -> bool, tol: f64| {
        let sel: Vec<_> = rows
            .iter()
            .filter(|r| r.mode == RunMode::Graph && pick(r))
            .collect();
        (
            sel.iter().filter(|r| r.error.abs() <= tol).count(),
            sel.len(),
        )
    };
    Ok(Fidelity {
        op_sums: op_sums(m, &work),
        cost_model: cost.name(),
        measurements: name.to_string(),
        fitted_within: count(&|r| r.batch == 1, FITTED_TOLERANCE),
        unfitted_within: count(&|r| r.batch != 1, UNFITTED_TOLERANCE),
        best_within: (
            models.iter().filter(|m| m.best_within).count(),
            models.len(),
        ),
        rows,
        models,
    })
}

/// Load measurements and name them by their path.
pub fn load_measurements(path: &Path) -> Result<Measurements> {
    Ok(Measurements::load(path)?)
}
