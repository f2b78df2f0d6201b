//! What several commands share: loading a model, the platform and cost model, the simulator,
//! writing files and printing.

use std::io::Write;

use anyhow::{Context, Result};
use opsched::cost::{CostModel, DevicePreset, Layout, LinkPreset};
use opsched::schedule::{export, ExecMode, Platform, Schedule};
use opsched::{ratio, Calibration, CostKind, CostSpec, Evaluation, Graph};
use serde::Serialize;

use crate::args::{ExportArgs, ModelArgs, PlatformArgs};
use crate::error::{facade, user};
use crate::output::Outputs;

/// Load a zoo model or a graph file; a failure is the user's.
pub fn load(spec: &str, args: &ModelArgs) -> Result<Graph> {
    let g =
        opsched::load_model_with(spec, &args.zoo_config(), &args.load_options()).map_err(user)?;
    tracing::debug!(model = %g.name, nodes = g.len(), "loaded");
    Ok(g)
}

/// Print `value` as pretty JSON on stdout.
pub fn print_json(value: &impl Serialize) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string_pretty(value)?)?;
    Ok(())
}

/// The platform and cost model of a `schedule` or `simulate` run.
pub struct Setup {
    pub device: DevicePreset,
    pub link: LinkPreset,
    pub kind: CostKind,
    pub cost: Box<dyn CostModel>,
    /// How the simulated runtime executes schedules.
    pub exec: ExecMode,
}

/// `layout`: the layout whose measurements `--cost cache` and `--cost measured` answer with
/// first (`None`: the one a GPU run uses by default).
pub fn setup(g: &Graph, args: &PlatformArgs, layout: Option<Layout>) -> Result<Setup> {
    let device = DevicePreset::by_name(&args.device).map_err(user)?;
    let link = match &args.link {
        Some(name) => LinkPreset::by_name(name).map_err(user)?,
        None => device.default_link.clone(),
    };
    let mut spec = CostSpec {
        cache: args.cache.clone(),
        calibration: match &args.device_file {
            Some(path) => Calibration::File(path.clone()),
            None if args.formulas => Calibration::Formulas,
            None => Calibration::Committed,
        },
        costs_dir: args.costs.clone(),
        measured_device: None,
        layout,
    };
    let kind = match &args.cost {
        Some(name) => spec.parse_kind(name).map_err(facade)?,
        None => opsched::default_cost_kind(g),
    };
    if args.cache.is_some() && kind != CostKind::Cache {
        tracing::warn!(cost = %kind, "--cache is only read by --cost cache");
    }
    let built = opsched::cost_model_with(kind, &device, &link, g, &spec)
        .map_err(facade)
        .with_context(|| format!("cost model {kind}"))?;
    for note in &built.notes {
        eprintln!("note: {note}");
    }
    tracing::debug!(cost = %built.model.name(), "cost model");
    Ok(Setup {
        device,
        link,
        kind,
        cost: built.model,
        exec: args.exec.mode(),
    })
}

pub fn evaluate(g: &Graph, s: &Schedule, su: &Setup, gpus: usize) -> Result<Evaluation> {
    opsched::evaluate_in(g, s, su.cost.as_ref(), gpus, su.exec)
        .map_err(anyhow::Error::new)
        .context("simulating the schedule")
}

/// The makespan of the sequential schedule on one GPU of `platform`: what speedups are over.
pub fn sequential_ms(g: &Graph, platform: &Platform, su: &Setup) -> Result<f64> {
    let seq = opsched::scheduler("sequential").map_err(facade)?;
    let (s, _) = seq.schedule(g, platform, su.cost.as_ref())?;
    Ok(evaluate(g, &s, su, 1)?.makespan_ms)
}

/// The timeline files asked for (`--trace`, `--svg`).
pub fn add_exports(
    outputs: &mut Outputs,
    g: &Graph,
    ev: &Evaluation,
    exports: &ExportArgs,
    title: &str,
) -> Result<()> {
    if let Some(path) = &exports.trace {
        let trace = export::chrome_trace(g, &ev.timeline);
        outputs.add(path, serde_json::to_vec(&trace)?);
    }
    if let Some(path) = &exports.svg {
        outputs.add(path, export::svg_gantt(g, &ev.timeline, title));
    }
    Ok(())
}

impl Setup {
    /// The platform of `gpus` GPUs with `streams` streams each.
    pub fn platform(&self, gpus: usize, streams: usize) -> Platform {
        Platform {
            gpus,
            streams,
            device: self.device.clone(),
            link: self.link.clone(),
        }
    }
}

/// "1 stream", "8 streams": a count and its noun, plural-aware.
pub fn count(n: usize, noun: &str) -> String {
    let plural = if n == 1 { "" } else { "s" };
    format!("{n} {noun}{plural}")
}

/// "1 GPU, 119 stages" / "2 GPUs, 8 streams".
pub fn describe(s: &Schedule) -> String {
    let gpus = count(opsched::schedule_gpus(s), "GPU");
    match s {
        Schedule::Stages(p) => format!(
            "{gpus}, {}",
            count(p.gpus.iter().map(Vec::len).sum(), "stage")
        ),
        Schedule::Streams(p) => format!(
            "{gpus}, {}",
            count(p.gpus.iter().map(|g| g.streams.len()).sum(), "stream")
        ),
    }
}

/// "2 x h100, 8 streams per GPU, nvlink4".
pub fn platform_line(gpus: usize, device: &str, streams: usize, link: &str) -> String {
    format!(
        "{gpus} x {device}, {} per GPU, {link}",
        count(streams, "stream")
    )
}

/// "1.6737 ms (critical path 1.6737 ms, capacity 0.4 ms; makespan is 1.000x)".
pub fn bound_line(bound_ms: f64, critical_path_ms: f64, capacity_ms: f64, gap: f64) -> String {
    format!(
        "{bound_ms:.4} ms (critical path {critical_path_ms:.4} ms, capacity {capacity_ms:.4} ms; makespan is {gap:.3}x)"
    )
}

pub fn human(x: f64, unit: &str) -> String {
    let (v, p) = match x {
        x if x >= 1e12 => (x / 1e12, "T"),
        x if x >= 1e9 => (x / 1e9, "G"),
        x if x >= 1e6 => (x / 1e6, "M"),
        x if x >= 1e3 => (x / 1e3, "k"),
        x => (x, ""),
    };
    format!("{v:.2} {p}{unit}").trim_end().to_string()
}

#[derive(Serialize)]
pub struct GpuUse {
    pub gpu: usize,
    pub ops: usize,
    /// Time at least one operator runs on this GPU.
    pub busy_ms: f64,
    /// busy_ms / makespan.
    pub utilization: f64,
}

/// Per GPU: operators and the length of the union of their spans.
pub fn gpu_use(ev: &Evaluation, gpus: usize) -> Vec<GpuUse> {
    let mut spans: Vec<Vec<(f64, f64)>> = vec![Vec::new(); gpus];
    for s in &ev.timeline.ops {
        if s.gpu >= spans.len() {
            spans.resize(s.gpu + 1, Vec::new());
        }
        spans[s.gpu].push((s.start_ms, s.end_ms));
    }
    spans
        .into_iter()
        .enumerate()
        .map(|(gpu, mut v)| {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (mut busy, mut cur): (f64, Option<(f64, f64)>) = (0.0, None);
            for (a, b) in v.iter().copied() {
                cur = match cur {
                    Some((s, e)) if a <= e => Some((s, e.max(b))),
                    Some((s, e)) => {
                        busy += e - s;
                        Some((a, b))
                    }
                    None => Some((a, b)),
                };
            }
            if let Some((s, e)) = cur {
                busy += e - s;
            }
            GpuUse {
                gpu,
                ops: v.len(),
                busy_ms: busy,
                utilization: ratio(busy, ev.makespan_ms).min(1.0),
            }
        })
        .collect()
}
