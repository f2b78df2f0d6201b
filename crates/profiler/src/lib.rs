//! # opsched-profiler
//!
//! Measures on a device what the cost models estimate, and stores it where every later run
//! (or a machine without a GPU, through `--cost cache`) finds it:
//! - the time of each operator alone (one measurement per distinct
//!   [`op_signature`]: identical operators are timed
//!   once);
//! - the time of each concurrent stage asked for ([`stages_of`] takes them from stage plans,
//!   e.g. the schedules IOS finds under the analytical model);
//! - the time of the one convolution each merged group asked for runs as ([`merges_of`]: the
//!   merged stages of stage plans), under
//!   [`merged_signature`](opsched_cost::signature::merged_signature): the signature of that
//!   convolution alone, which is how the runtime runs it and where measured tables look for
//!   a merged group's time;
//! - transfer time between GPUs by size (a device-to-device copy when there is one GPU);
//! - per-kernel resource demand: registers, static shared memory and threads of the NVRTC
//!   kernels, read from the compiled functions. cuDNN and cuBLAS kernels are opaque without
//!   CUPTI, which this build does not use: their rows say `"source": "unmeasured"`.
//!
//! Every time is the device's own: the operator (or stage) is captured [`ProfileOptions::copies`]
//! times back to back into one graph, the graph is replayed `repeats` times after `warmup`
//! between two device events, and the time per copy is summarised (median, p10, p90). Host
//! enqueue cost never enters (see [`opsched_runtime::bench`]). The profiler runs on any
//! [`Device`]; on the CPU device it measures the CPU backend.
//!
//! ## Where results go
//! - The persistent [`CostCache`] ([`ProfileOptions::cache`]), keyed by the device
//!   fingerprint ([`opsched_gpu::DeviceReport::fingerprint`]: driver's device name, SMs,
//!   driver and cuDNN versions), the signature, the batch ([`batch_of`]) and the dtype:
//!   operators under their operator signature, stages under their [`stage_signature`], each
//!   followed by `@nhwc` where measured channels last ([`measured_in`]: the layout is
//!   [`ProfileOptions::layout`], by default the one `opsched run` uses on the device), transfers
//!   under [`transfer_signature`] (`transfer(bytes=N,src=A,dst=B)`).
//! - Optionally a directory of human-readable tables ([`export`], normally
//!   `fixtures/costs/<device-slug>/`): `ops.json` (operators and stages, the
//!   [`MeasuredTable`](opsched_cost::measured::MeasuredTable) JSON format, so
//!   `MeasuredTable::from_json_table` reads it back), `transfers.json`, `demand.json` and
//!   `device.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use opsched_cost::cache::{CacheKey, CostCache, DeviceFingerprint, Measurement};
use opsched_cost::measured::TableRow;
use opsched_cost::signature::{batch_of, measured_in, op_signature, stage_signature};
use opsched_cost::Layout;
use opsched_gpu::{Device, Step, Summary};
use opsched_graph::{Graph, NodeId};
use opsched_runtime::bench::{time_transfer, Bench};
use opsched_schedule::{Schedule, StageStrategy};
use serde::{Deserialize, Serialize};

/// Errors of the profiler.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(transparent)]
    Runtime(#[from] opsched_runtime::RuntimeError),
    #[error(transparent)]
    Gpu(#[from] opsched_gpu::GpuError),
    #[error(transparent)]
    Cost(#[from] opsched_cost::CostError),
    #[error("{path}: {message}")]
    Export { path: PathBuf, message: String },
}

/// What to measure and where to put it.
#[derive(Clone, Debug)]
pub struct ProfileOptions {
    /// Unit (physical GPU) of the device to profile on.
    pub unit: usize,
    pub warmup: u32,
    pub repeats: u32,
    /// Back-to-back copies of an operator or stage in the graph one measurement replays
    /// (the time per copy is reported).
    pub copies: u32,
    /// Concurrent stages to time (groups of operators), e.g. from [`stages_of`].
    pub stages: Vec<Vec<Vec<NodeId>>>,
    /// Merged groups whose one convolution to time, e.g. from [`merges_of`].
    pub merges: Vec<Vec<NodeId>>,
    /// Transfer sizes in bytes (empty: none).
    pub transfer_sizes: Vec<usize>,
    /// The cost cache to fill (`None`: do not write one).
    pub cache: Option<PathBuf>,
    /// A directory for the exported tables (`None`: no export).
    pub export_dir: Option<PathBuf>,
    pub kernels: opsched_runtime::KernelOptions,
    /// How activations are stored while measuring (`None`: as the device prefers and
    /// `opsched run` stores them, [`Device::preferred_layout`]). Every key records it
    /// ([`measured_in`]).
    pub layout: Option<Layout>,
}

impl Default for ProfileOptions {
    fn default() -> Self {
        ProfileOptions {
            unit: 0,
            warmup: 10,
            repeats: 50,
            copies: 20,
            stages: Vec::new(),
            merges: Vec::new(),
            transfer_sizes: default_transfer_sizes(),
            cache: None,
            export_dir: None,
            kernels: Default::default(),
            layout: None,
        }
    }
}

/// 4 KiB to 64 MiB in factors of 4.
pub fn default_transfer_sizes() -> Vec<usize> {
    (0..8).map(|i| 4096usize << (2 * i)).collect()
}

/// One measured operator or stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Node names (one for an operator; all operators of a stage or of a merged group).
    pub nodes: Vec<String>,
    pub signature: String,
    pub batch: u32,
    pub dtype: String,
    pub summary: Summary,
}

/// One measured transfer size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransferTiming {
    pub bytes: usize,
    pub src: usize,
    pub dst: usize,
    pub signature: String,
    pub summary: Summary,
    /// Effective bandwidth at the median, GB/s.
    pub gbps: f64,
}

/// The resources of one kernel of one operator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DemandRow {
    pub signature: String,
    pub kernel: String,
    /// "nvrtc" (read from the compiled kernel) or "unmeasured" (cuDNN/cuBLAS without CUPTI).
    pub source: String,
    pub registers_per_thread: u32,
    pub shared_mem_per_block: u32,
    pub max_threads_per_block: u32,
}

/// Everything a profile measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProfileReport {
    pub device: String,
    /// `cuda` or `cpu`: what measured (CPU timings key their own device in the cache).
    #[serde(default)]
    pub backend: String,
    pub fingerprint: DeviceFingerprint,
    /// How activations were stored (every signature of the report records it too).
    #[serde(default)]
    pub layout: Layout,
    pub ops: Vec<Timing>,
    pub stages: Vec<Timing>,
    pub transfers: Vec<TransferTiming>,
    pub demand: Vec<DemandRow>,
    pub cache_entries_written: usize,
    pub exported: Vec<PathBuf>,
}

/// The cache key of an operator of `g` measured on `device` with activations in `layout`.
pub fn op_key(device: &DeviceFingerprint, g: &Graph, op: NodeId, layout: Layout) -> CacheKey {
    CacheKey {
        device: device.clone(),
        signature: measured_in(&op_signature(g, op), layout),
        batch: batch_of(g, op) as u32,
        dtype: g.dtype.to_string(),
    }
}

/// The cache key of a concurrent stage (batch of its first operator) measured with
/// activations in `layout`.
pub fn stage_key(
    device: &DeviceFingerprint,
    g: &Graph,
    groups: &[Vec<NodeId>],
    layout: Layout,
) -> CacheKey {
    let first = groups.iter().flatten().next().copied();
    CacheKey {
        device: device.clone(),
        signature: measured_in(&stage_signature(g, groups), layout),
        batch: first.map_or(1, |o| batch_of(g, o) as u32),
        dtype: g.dtype.to_string(),
    }
}

/// The signature of a transfer measurement.
pub fn transfer_signature(bytes: usize, src: usize, dst: usize) -> String {
    format!("transfer(bytes={bytes},src={src},dst={dst})")
}

/// The concurrent stages (more than one non-empty group) of a stage plan, in order; stream
/// plans have none.
pub fn stages_of(s: &Schedule) -> Vec<Vec<Vec<NodeId>>> {
    let mut out = Vec::new();
    if let Schedule::Stages(p) = s {
        for stages in &p.gpus {
            for st in stages {
                let groups: Vec<Vec<NodeId>> = st
                    .groups
                    .iter()
                    .filter(|g| !g.is_empty())
                    .cloned()
                    .collect();
                if st.strategy == StageStrategy::Concurrent && groups.len() > 1 {
                    out.push(groups);
                }
            }
        }
    }
    out
}

/// The merged stages of a stage plan (their operators), in order; stream plans have none.
/// [`profile`] times those that can run as one convolution ([`merged_graph`]) and skips the
/// rest.
pub fn merges_of(s: &Schedule) -> Vec<Vec<NodeId>> {
    let Schedule::Stages(p) = s else {
        return Vec::new();
    };
    p.gpus
        .iter()
        .flatten()
        .filter(|st| st.strategy == StageStrategy::Merge)
        .map(|st| st.ops().collect::<Vec<_>>())
        .filter(|ops| ops.len() > 1)
        .collect()
}

/// The one convolution or linear layer a mergeable group runs as, alone on an input of the
/// group's input shape: the graph the profiler times for it (its operator's signature is the group's
/// [`merged_signature`](opsched_cost::signature::merged_signature)). `None` where the runtime
/// runs the group one operator after another
/// ([`opsched_graph::merge::runs_as_one`]: its members' own times are what it costs).
pub fn merged_graph(g: &Graph, ops: &[NodeId]) -> Option<(Graph, NodeId)> {
    if !opsched_graph::merge::runs_as_one(g, ops) {
        return None;
    }
    let (op, input) = opsched_graph::merge::merged_op(g, ops)?;
    let mut b = opsched_graph::GraphBuilder::new("merged", g.dtype);
    let x = b.input("x", input);
    let c = b.op("merged", op, &[x]);
    Some((b.finish().ok()?, c))
}

/// One operator per distinct signature (the first in topological order).
pub fn distinct_ops(g: &Graph) -> Vec<(NodeId, String)> {
    let mut seen = BTreeMap::new();
    let mut out = Vec::new();
    for op in g.ops() {
        let sig = op_signature(g, op);
        if seen.insert(sig.clone(), op).is_none() {
            out.push((op, sig));
        }
    }
    out
}

/// Put a report's measurements into `cache` (in memory; the caller saves). Returns how many.
pub fn fill_cache(report: &ProfileReport, cache: &mut CostCache) -> usize {
    let mut n = 0;
    for t in report.ops.iter().chain(&report.stages) {
        cache.insert(
            CacheKey {
                device: report.fingerprint.clone(),
                signature: t.signature.clone(),
                batch: t.batch,
                dtype: t.dtype.clone(),
            },
            t.summary.measurement(),
        );
        n += 1;
    }
    for t in &report.transfers {
        cache.insert(
            CacheKey {
                device: report.fingerprint.clone(),
                signature: t.signature.clone(),
                batch: 1,
                dtype: "f32".into(),
            },
            t.summary.measurement(),
        );
        n += 1;
    }
    n
}

fn row(t: &Timing) -> TableRow {
    TableRow::new(
        t.signature.clone(),
        Some(t.batch),
        Some(t.dtype.clone()),
        Measurement {
            median_ms: t.summary.median_ms,
            p10_ms: t.summary.p10_ms,
            p90_ms: t.summary.p90_ms,
            repeats: t.summary.samples,
        },
    )
}

fn write_json<T: Serialize>(path: &Path, v: &T) -> Result<(), ProfileError> {
    let text = serde_json::to_string_pretty(v).map_err(|e| ProfileError::Export {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    opsched_io::write(path, (text + "\n").as_bytes()).map_err(|e| ProfileError::Export {
        path: path.to_path_buf(),
        message: format!("cannot write: {}", e.message),
    })?;
    Ok(())
}

/// Write the report's tables into `dir` (created if needed): `ops.json` (operators and stages
/// as measured-table rows, sorted by signature), `transfers.json`, `demand.json`,
/// `device.json`. Returns the files written.
pub fn export(report: &ProfileReport, dir: &Path) -> Result<Vec<PathBuf>, ProfileError> {
    std::fs::create_dir_all(dir).map_err(|e| ProfileError::Export {
        path: dir.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut rows: Vec<TableRow> = report.ops.iter().chain(&report.stages).map(row).collect();
    rows.sort_by(|a, b| a.signature.cmp(&b.signature));
    let files = [
        dir.join("ops.json"),
        dir.join("transfers.json"),
        dir.join("demand.json"),
        dir.join("device.json"),
    ];
    write_json(&files[0], &rows)?;
    write_json(&files[1], &report.transfers)?;
    write_json(&files[2], &report.demand)?;
    write_json(&files[3], &report.fingerprint)?;
    Ok(files.to_vec())
}

/// Profile `g` on unit [`ProfileOptions::unit`] of `dev` (see the crate docs). Fills the
/// cache and exports when asked.
pub fn profile<D: Device>(
    dev: &D,
    g: &Graph,
    opts: &ProfileOptions,
) -> Result<ProfileReport, ProfileError> {
    if opts.unit >= dev.units() {
        return Err(opsched_gpu::GpuError::DeviceIndex {
            requested: opts.unit,
            available: dev.units(),
        }
        .into());
    }
    let info = dev.report();
    let fp = info.fingerprint.clone();
    let width = opts.stages.iter().map(Vec::len).max().unwrap_or(1).max(1);
    let layout = opts.layout.unwrap_or_else(|| dev.preferred_layout());
    let bench = Bench::new_in(dev, opts.unit, g, width, opts.kernels, layout)?;
    let time = |groups: &[Vec<NodeId>]| bench.time(groups, opts.copies, opts.warmup, opts.repeats);
    let dtype = g.dtype.to_string();
    let mut ops = Vec::new();
    let mut demand = Vec::new();
    for (op, sig) in distinct_ops(g) {
        let sig = measured_in(&sig, layout);
        let summary = time(&[vec![op]])?;
        tracing::debug!("{sig}: {:.4} ms", summary.median_ms);
        ops.push(Timing {
            nodes: vec![g.node(op).name.clone()],
            signature: sig.clone(),
            batch: batch_of(g, op) as u32,
            dtype: dtype.clone(),
            summary,
        });
        if let Some(Some(p)) = bench.program().ops.get(op.index()) {
            for step in &p.steps {
                demand.push(demand_row(dev, opts.unit, &sig, step));
            }
        }
    }
    let mut seen: Vec<String> = ops.iter().map(|t| t.signature.clone()).collect();
    for group in &opts.merges {
        let Some((mg, conv)) = merged_graph(g, group) else {
            continue;
        };
        let sig = measured_in(&op_signature(&mg, conv), layout);
        if seen.contains(&sig) {
            continue;
        }
        let one = Bench::new_in(dev, opts.unit, &mg, 1, opts.kernels, layout)?;
        let summary = one.time(&[vec![conv]], opts.copies, opts.warmup, opts.repeats)?;
        tracing::debug!("{sig} (merged): {:.4} ms", summary.median_ms);
        ops.push(Timing {
            nodes: group.iter().map(|&o| g.node(o).name.clone()).collect(),
            signature: sig.clone(),
            batch: batch_of(&mg, conv) as u32,
            dtype: dtype.clone(),
            summary,
        });
        seen.push(sig);
    }
    let mut stages = Vec::new();
    for groups in &opts.stages {
        let summary = time(groups)?;
        let key = stage_key(&fp, g, groups, layout);
        stages.push(Timing {
            nodes: groups
                .iter()
                .flatten()
                .map(|&o| g.node(o).name.clone())
                .collect(),
            signature: key.signature,
            batch: key.batch,
            dtype: dtype.clone(),
            summary,
        });
    }
    let mut transfers = Vec::new();
    let dst = if dev.units() > 1 {
        usize::from(opts.unit == 0)
    } else {
        opts.unit
    };
    for &bytes in &opts.transfer_sizes {
        let s = time_transfer(dev, (opts.unit, dst), bytes, opts.warmup, opts.repeats)?;
        transfers.push(TransferTiming {
            bytes,
            src: opts.unit,
            dst,
            signature: transfer_signature(bytes, opts.unit, dst),
            gbps: if s.median_ms > 0.0 {
                bytes as f64 / (s.median_ms * 1e6)
            } else {
                0.0
            },
            summary: s,
        });
    }
    let mut report = ProfileReport {
        device: info.name.clone(),
        backend: info.backend.to_string(),
        fingerprint: fp,
        layout,
        ops,
        stages,
        transfers,
        demand,
        cache_entries_written: 0,
        exported: Vec::new(),
    };
    if let Some(path) = &opts.cache {
        let mut cache = CostCache::open(path)?;
        report.cache_entries_written = fill_cache(&report, &mut cache);
        cache.save()?;
    }
    if let Some(dir) = &opts.export_dir {
        report.exported = export(&report, dir)?;
    }
    Ok(report)
}

fn demand_row<D: Device>(dev: &D, unit: usize, sig: &str, step: &Step) -> DemandRow {
    let measured = step
        .nvrtc_kernel()
        .and_then(|k| dev.kernel_resources(unit, k).map(|r| (k, r)));
    match measured {
        Some((k, (regs, smem, threads))) => DemandRow {
            signature: sig.to_string(),
            kernel: k.to_string(),
            source: "nvrtc".into(),
            registers_per_thread: regs,
            shared_mem_per_block: smem,
            max_threads_per_block: threads,
        },
        None => DemandRow {
            signature: sig.to_string(),
            kernel: step.kind().to_string(),
            source: "unmeasured".into(),
            registers_per_thread: 0,
            shared_mem_per_block: 0,
            max_threads_per_block: 0,
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use opsched_cost::measured::MeasuredTable;
    use opsched_cost::{AnalyticalModel, DevicePreset, LinkPreset};
    use opsched_graph::zoo::{self, ZooConfig};

    fn fp() -> DeviceFingerprint {
        DeviceFingerprint {
            name: "NVIDIA H100 80GB HBM3".into(),
            sms: 132,
            driver: "13.0".into(),
            cudnn: "9.10.2".into(),
        }
    }

    fn summary(ms: f64) -> Summary {
        Summary::of(&[ms * 0.9, ms, ms * 1.1]).unwrap()
    }

    /// A report as `profile` writes it, every operator measured `scale` times 0.01 ms times
    /// its rank, with activations in `layout`.
    fn report_in(g: &Graph, layout: Layout, scale: f64) -> ProfileReport {
        let ops = distinct_ops(g)
            .into_iter()
            .enumerate()
            .map(|(i, (op, sig))| Timing {
                nodes: vec![g.node(op).name.clone()],
                signature: measured_in(&sig, layout),
                batch: batch_of(g, op) as u32,
                dtype: "f32".into(),
                summary: summary(scale * 0.01 * (i + 1) as f64),
            })
            .collect();
        let ops_list: Vec<NodeId> = g.ops().collect();
        let groups = vec![vec![ops_list[1]], vec![ops_list[2]]];
        let key = stage_key(&fp(), g, &groups, layout);
        ProfileReport {
            device: fp().name,
            backend: "cuda".into(),
            fingerprint: fp(),
            layout,
            ops,
            stages: vec![Timing {
                nodes: vec![],
                signature: key.signature,
                batch: key.batch,
                dtype: "f32".into(),
                summary: summary(scale * 0.5),
            }],
            transfers: vec![TransferTiming {
                bytes: 4096,
                src: 0,
                dst: 0,
                signature: transfer_signature(4096, 0, 0),
                summary: summary(0.003),
                gbps: 1.0,
            }],
            demand: vec![],
            cache_entries_written: 0,
            exported: vec![],
        }
    }

    fn report(g: &Graph) -> ProfileReport {
        report_in(g, Layout::Nchw, 1.0)
    }

    fn model() -> Graph {
        zoo::build("googlenet", &ZooConfig::default()).unwrap()
    }

    #[test]
    fn keys_reuse_the_cost_crate_signatures() {
        let g = model();
        let op = g.ops().next().unwrap();
        let k = op_key(&fp(), &g, op, Layout::Nchw);
        assert_eq!(k.signature, op_signature(&g, op));
        assert_eq!((k.batch, k.dtype.as_str()), (1, "f32"));
        assert_eq!(k.device, fp());
        // Channels last marks the key, and only the key.
        let nhwc = op_key(&fp(), &g, op, Layout::Nhwc);
        assert_eq!(nhwc.signature, format!("{}@nhwc", k.signature));
        assert_eq!(
            (nhwc.batch, &nhwc.dtype, &nhwc.device),
            (k.batch, &k.dtype, &k.device)
        );
        assert!(transfer_signature(4096, 0, 1).starts_with("transfer(bytes=4096"));
    }

    #[test]
    fn identical_operators_are_measured_once() {
        let g = model();
        let d = distinct_ops(&g);
        assert!(d.len() < g.op_count(), "googlenet repeats operators");
        let mut sigs: Vec<&String> = d.iter().map(|x| &x.1).collect();
        sigs.sort();
        sigs.dedup();
        assert_eq!(sigs.len(), d.len());
    }

    #[test]
    fn stages_come_from_stage_plans() {
        let g = model();
        let cost = AnalyticalModel::new(
            DevicePreset::by_name("h100").unwrap(),
            LinkPreset::by_name("nvlink4").unwrap(),
        );
        let s = opsched_schedule::Scheduler::schedule(
            &opsched_baselines_greedy(),
            &g,
            &opsched_schedule::Platform {
                gpus: 1,
                streams: 4,
                device: DevicePreset::by_name("h100").unwrap(),
                link: LinkPreset::by_name("nvlink4").unwrap(),
            },
            &cost,
        );
        if let Ok((s, _)) = s {
            let st = stages_of(&s);
            assert!(!st.is_empty());
            assert!(st
                .iter()
                .all(|groups| groups.len() > 1 && groups.len() <= 4));
        }
    }

    fn opsched_baselines_greedy() -> impl opsched_schedule::Scheduler {
        struct Wide;
        impl opsched_schedule::Scheduler for Wide {
            fn name(&self) -> &str {
                "wide"
            }
            fn schedule(
                &self,
                g: &Graph,
                _p: &opsched_schedule::Platform,
                _c: &dyn opsched_cost::CostModel,
            ) -> Result<(Schedule, opsched_schedule::SchedulerStats), opsched_schedule::ScheduleError>
            {
                // Every topological level is a stage of single-operator groups (at most 4).
                let mut level = vec![0usize; g.len()];
                let mut levels: Vec<Vec<NodeId>> = Vec::new();
                for op in g.ops() {
                    let l = g
                        .preds(op)
                        .filter(|p| !g.node(*p).op.is_input())
                        .map(|p| level[p.index()] + 1)
                        .max()
                        .unwrap_or(0);
                    level[op.index()] = l;
                    if levels.len() <= l {
                        levels.resize(l + 1, Vec::new());
                    }
                    levels[l].push(op);
                }
                let mut stages = Vec::new();
                for level in levels {
                    for chunk in level.chunks(4) {
                        stages.push(opsched_schedule::Stage {
                            strategy: StageStrategy::Concurrent,
                            groups: chunk.iter().map(|&o| vec![o]).collect(),
                        });
                    }
                }
                Ok((
                    Schedule::Stages(opsched_schedule::StagePlan { gpus: vec![stages] }),
                    Default::default(),
                ))
            }
        }
        Wide
    }

    #[test]
    fn export_round_trips_through_the_measured_table() {
        let g = model();
        let r = report(&g);
        let dir = std::env::temp_dir().join(format!("opsched-profiler-{}", std::process::id()));
        let files = export(&r, &dir).unwrap();
        assert_eq!(files.len(), 4);
        let text = std::fs::read_to_string(&files[0]).unwrap();
        let base = AnalyticalModel::new(
            DevicePreset::by_name("h100").unwrap(),
            LinkPreset::by_name("nvlink4").unwrap(),
        );
        let table = MeasuredTable::from_json_table(&text, base).unwrap();
        for op in g.ops() {
            let want = r
                .ops
                .iter()
                .find(|t| t.signature == op_signature(&g, op))
                .unwrap()
                .summary
                .median_ms;
            // JSON floats round-trip to within an ulp (serde_json without float_roundtrip).
            let got = table.measured_op(&g, op).unwrap();
            assert!(
                (got - want).abs() <= 1e-12 * want.abs().max(1.0),
                "{got} vs {want}"
            );
        }
        let ops_list: Vec<NodeId> = g.ops().collect();
        let groups = vec![vec![ops_list[2]], vec![ops_list[1]]];
        let st = table.measured_stage(&g, &groups).unwrap();
        assert!((st - r.stages[0].summary.median_ms).abs() < 1e-12);
        let tr: Vec<TransferTiming> =
            serde_json::from_str(&std::fs::read_to_string(&files[1]).unwrap()).unwrap();
        assert_eq!(tr.len(), r.transfers.len());
        assert_eq!(tr[0].signature, r.transfers[0].signature);
        let dev: DeviceFingerprint =
            serde_json::from_str(&std::fs::read_to_string(&files[3]).unwrap()).unwrap();
        assert_eq!(dev, fp());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_cache_answers_for_the_device() {
        let g = model();
        let r = report(&g);
        let dir =
            std::env::temp_dir().join(format!("opsched-profiler-cache-{}", std::process::id()));
        let path = dir.join("costs.bin");
        let mut cache = CostCache::open(&path).unwrap();
        let n = fill_cache(&r, &mut cache);
        assert_eq!(n, r.ops.len() + r.stages.len() + r.transfers.len());
        cache.save().unwrap();
        let cache = CostCache::open(&path).unwrap();
        let op = g.ops().next().unwrap();
        let m = cache.get(&op_key(&fp(), &g, op, Layout::Nchw)).unwrap();
        assert_eq!(m.median_ms, r.ops[0].summary.median_ms);
        let base = AnalyticalModel::new(
            DevicePreset::by_name("h100").unwrap(),
            LinkPreset::by_name("nvlink4").unwrap(),
        );
        let t = MeasuredTable::from_cache(&cache, &fp().name, base);
        assert_eq!(t.measured_op(&g, op), Some(m.median_ms));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_cache_answers_in_the_layout_asked_for() {
        let g = model();
        let (nchw, nhwc) = (
            report_in(&g, Layout::Nchw, 1.0),
            report_in(&g, Layout::Nhwc, 3.0),
        );
        let dir =
            std::env::temp_dir().join(format!("opsched-profiler-layout-{}", std::process::id()));
        let path = dir.join("costs.bin");
        let mut cache = CostCache::open(&path).unwrap();
        fill_cache(&nchw, &mut cache);
        cache.save().unwrap();
        let base = || {
            AnalyticalModel::new(
                DevicePreset::by_name("h100").unwrap(),
                LinkPreset::by_name("nvlink4").unwrap(),
            )
        };
        let ops_list: Vec<NodeId> = g.ops().collect();
        let stage = vec![vec![ops_list[2]], vec![ops_list[1]]];
        // Only NCHW measured: a channels-last table answers with those, and says so.
        let t = MeasuredTable::from_cache(&CostCache::open(&path).unwrap(), &fp().name, base())
            .with_layout(Layout::Nhwc);
        for (op, sig) in distinct_ops(&g) {
            let want = nchw.ops.iter().find(|r| r.signature == sig).unwrap();
            let want = Some((want.summary.median_ms, Layout::Nchw));
            assert_eq!(t.measured_op_in(&g, op), want, "{sig}");
        }
        assert_eq!(
            t.measured_stage(&g, &stage),
            Some(nchw.stages[0].summary.median_ms)
        );
        // Both measured: each layout answers with its own, which kept the other's.
        let mut cache = CostCache::open(&path).unwrap();
        fill_cache(&nhwc, &mut cache);
        cache.save().unwrap();
        let cache = CostCache::open(&path).unwrap();
        for (layout, report) in [(Layout::Nchw, &nchw), (Layout::Nhwc, &nhwc)] {
            let t = MeasuredTable::from_cache(&cache, &fp().name, base()).with_layout(layout);
            assert_eq!(t.layout(), layout);
            for (op, sig) in distinct_ops(&g) {
                let want = report
                    .ops
                    .iter()
                    .find(|r| r.signature == measured_in(&sig, layout))
                    .unwrap()
                    .summary
                    .median_ms;
                assert_eq!(t.measured_op_in(&g, op), Some((want, layout)), "{sig}");
            }
            assert_eq!(
                t.measured_stage(&g, &stage),
                Some(report.stages[0].summary.median_ms)
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// SqueezeNet at batch 1 on `size` x `size` images.
    fn squeezenet(size: usize) -> Graph {
        let cfg = ZooConfig {
            batch: 1,
            input_size: Some(size),
            dtype: opsched_graph::DType::F32,
        };
        zoo::build("squeezenet", &cfg).unwrap()
    }

    #[test]
    fn profiling_on_the_cpu_device_measures_every_operator_and_stage() {
        let g = squeezenet(32);
        let ops: Vec<NodeId> = g.ops().collect();
        let opts = ProfileOptions {
            warmup: 1,
            repeats: 3,
            copies: 2,
            stages: vec![vec![vec![ops[2]], vec![ops[3]]]],
            transfer_sizes: vec![4096],
            ..Default::default()
        };
        let dev = opsched_gpu::CpuDevice::new();
        let r = profile(&dev, &g, &opts).unwrap();
        assert_eq!(r.ops.len(), distinct_ops(&g).len());
        assert!(r
            .ops
            .iter()
            .all(|t| t.summary.median_ms >= 0.0 && t.summary.samples == 3));
        assert_eq!(r.stages.len(), 1);
        assert_eq!(r.transfers.len(), 1);
        assert!(r.demand.iter().all(|d| d.source == "unmeasured"));
        let bad = ProfileOptions {
            unit: 3,
            ..ProfileOptions::default()
        };
        let e = profile(&dev, &g, &bad).unwrap_err();
        assert!(e.to_string().contains("GPU 3"), "{e}");
    }

    /// A merged group's convolution is timed once, as an operator row under the group's
    /// merged signature, which a measured table then reads; a group that cannot merge is
    /// skipped.
    #[test]
    fn merged_groups_are_timed_as_their_one_convolution() {
        let g = squeezenet(32);
        let id = |n: &str| g.find(n).unwrap();
        let pair = vec![id("fire2.expand1x1"), id("fire2.expand3x3")];
        let opts = ProfileOptions {
            warmup: 1,
            repeats: 3,
            copies: 2,
            merges: vec![
                pair.clone(),
                pair.iter().rev().copied().collect(),
                vec![id("fire2.squeeze"), id("fire2.concat")],
            ],
            transfer_sizes: vec![],
            ..Default::default()
        };
        let r = profile(&opsched_gpu::CpuDevice::new(), &g, &opts).unwrap();
        let merged: Vec<&Timing> = r.ops.iter().filter(|t| t.nodes.len() > 1).collect();
        assert_eq!(merged.len(), 1, "measured once, in either order");
        let sig = opsched_cost::signature::merged_signature(&g, &pair).unwrap();
        assert_eq!(merged[0].signature, sig);
        assert_eq!(r.ops.len(), distinct_ops(&g).len() + 1);
        let rows: Vec<TableRow> = r.ops.iter().map(row).collect();
        let json = serde_json::to_string(&rows).unwrap();
        let fallback = AnalyticalModel::new(
            DevicePreset::by_name("h100").unwrap(),
            LinkPreset::by_name("nvlink4").unwrap(),
        );
        let table = MeasuredTable::from_json_table(&json, fallback).unwrap();
        let got = table.measured_merged(&g, &pair).unwrap();
        let want = merged[0].summary.median_ms;
        assert!((got - want).abs() <= 1e-9 * want, "{got} {want}");
    }

    #[test]
    #[ignore = "needs a GPU: cargo xtask gpu-test"]
    fn gpu_profile_squeezenet() {
        let g = squeezenet(64);
        let ops: Vec<NodeId> = g.ops().collect();
        let dir = std::env::temp_dir().join(format!("opsched-profile-gpu-{}", std::process::id()));
        let opts = ProfileOptions {
            warmup: 2,
            repeats: 5,
            stages: vec![vec![vec![ops[2]], vec![ops[3]]]],
            merges: vec![vec![
                g.find("fire2.expand1x1").unwrap(),
                g.find("fire2.expand3x3").unwrap(),
            ]],
            transfer_sizes: vec![4096, 1 << 20],
            cache: Some(dir.join("costs.bin")),
            export_dir: Some(dir.join("export")),
            ..Default::default()
        };
        let dev = opsched_gpu::CudaDevice::open(Some(1)).unwrap();
        let r = profile(&dev, &g, &opts).unwrap();
        assert_eq!(
            r.ops.len(),
            distinct_ops(&g).len() + 1,
            "and the merged convolution"
        );
        assert!(r.ops.iter().all(|t| t.summary.median_ms > 0.0));
        assert_eq!(r.stages.len(), 1);
        assert_eq!(r.cache_entries_written, r.ops.len() + 1 + 2);
        assert!(r
            .demand
            .iter()
            .any(|d| d.source == "nvrtc" && d.registers_per_thread > 0));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
