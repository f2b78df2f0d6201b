//! The measuring half of calibration: what `cargo xtask calibrate` measures on a device into a
//! measurement file ([`opsched_cost::measurements`]), which [`crate::calibrate::fit`] then
//! fits a device file to.
//!
//! Everything is timed on the device by replaying captured graphs between events
//! ([`opsched_runtime::bench::Bench`], the profiler's timer), except the eager overhead, which
//! is host time by definition:
//! - overheads: a chain of tiny kernels on one stream (`graph_kernel`, per kernel), stages of
//!   2, 4 and 8 tiny kernels forked from one stream and joined back (`fork_join`, per stage),
//!   as many independent chains (`chains`, per step), and one tiny kernel issued eagerly
//!   (`eager_launch`). A tiny kernel is an abstract operator of zero time (one `spin`);
//! - contention: four copies of each of the 2026-11-22 run's convolutions, alone and all at
//!   once on four streams;
//! - ops: one operator of each distinct signature of every model and batch, alone;
//! - runs: every model under every algorithm at every batch, replayed as one captured graph
//!   (the median of one process; run the command in several processes and concatenate the
//!   `ms` lists to see how processes differ).

use opsched_cost::measurements::{
    ContentionSample, ConvSpec, Measurements, OpSample, OverheadKind, OverheadSample, RunMode,
    RunSample,
};
use opsched_cost::{AnalyticalModel, DevicePreset};
use opsched_graph::{DType, Graph, GraphBuilder, NodeId, Op};
use opsched_runtime::bench::Bench;
use opsched_runtime::{Device, KernelOptions, RunOptions};
use opsched_schedule::Platform;

use crate::{zoo, Error, Result};

/// What to measure, and how long.
#[derive(Clone, Debug)]
pub struct MeasureOptions {
    /// The preset the device is (its analytical model searches the schedules).
    pub preset: String,
    pub models: Vec<String>,
    pub batches: Vec<usize>,
    /// The models' input size (`None`: each model's own).
    pub input_size: Option<usize>,
    pub algorithms: Vec<String>,
    /// Streams per GPU of the schedules.
    pub streams: usize,
    pub warmup: u32,
    pub repeats: u32,
    /// Copies of a piece in one timed graph (see [`Bench::time`]).
    pub copies: u32,
    pub kernels: KernelOptions,
    /// `YYYY-MM-DD` and the kernels' git revision, for the file's header.
    pub measured_on: String,
    pub revision: String,
}

/// The convolutions of the contention samples: (in channels, size, out channels, kernel), the
/// ones the 2026-11-22 run measured.
pub const CONTENTION_CONVS: [(usize, usize, usize, usize); 4] = [
    (768, 17, 192, 1),
    (288, 35, 64, 1),
    (64, 35, 96, 3),
    (2048, 8, 384, 1),
];

/// Streams of the fork/join and chain overhead samples.
const OVERHEAD_STREAMS: [u32; 3] = [2, 4, 8];

/// Kernels per chain of the overhead samples.
const CHAIN: usize = 32;

/// Measure `dev` (see the module docs); `progress` hears what is being measured.
pub fn measure<D: Device>(
    dev: &D,
    o: &MeasureOptions,
    mut progress: impl FnMut(&str),
) -> Result<Measurements> {
    let device = dev.report();
    let mut m = Measurements::new(&o.preset, &device.name, &o.measured_on, &o.revision);
    m.notes.push(format!(
        "measured by opsched::measure on {} ({}), {} warm-up and {} timed replays of {} copies",
        device.name, device.backend, o.warmup, o.repeats, o.copies
    ));
    progress("overheads");
    m.overheads = overheads(dev, o)?;
    for &(c, size, oc, k) in &CONTENTION_CONVS {
        progress(&format!(
            "contention: conv {c}->{oc} {k}x{k} at {size}x{size}"
        ));
        m.contention.push(contention(dev, o, c, size, oc, k)?);
    }
    let preset = DevicePreset::by_name(&o.preset)?;
    let link = preset.default_link.clone();
    let cost = AnalyticalModel::new(preset.clone(), link.clone());
    let platform = Platform {
        gpus: 1,
        streams: o.streams,
        device: preset,
        link,
    };
    for model in &o.models {
        for &batch in &o.batches {
            let cfg = zoo::ZooConfig {
                batch,
                input_size: o.input_size,
                dtype: DType::F32,
            };
            let g = crate::load_model(model, &cfg)?;
            progress(&format!("{model} b{batch}: {} operators", g.op_count()));
            let bench = Bench::new(dev, 0, &g, 1, o.kernels)?;
            // One operator per distinct signature: the others are the same kernels.
            for (op, signature) in opsched_profiler::distinct_ops(&g) {
                let t = bench.time(&[vec![op]], o.copies, o.warmup, o.repeats)?;
                m.ops.push(OpSample {
                    model: model.clone(),
                    batch,
                    node: g.node(op).name.clone(),
                    signature,
                    ms: t.median_ms,
                });
            }
            drop(bench);
            for algo in &o.algorithms {
                progress(&format!("{model} b{batch}: {algo}"));
                let s = crate::scheduler(algo)?.schedule(&g, &platform, &cost)?.0;
                let opts = RunOptions {
                    graph_capture: true,
                    warmup: o.warmup,
                    repeats: o.repeats,
                    kernels: o.kernels,
                    ..RunOptions::default()
                };
                let r = opsched_runtime::run_schedule(dev, &g, &s, &opts)?;
                m.runs.push(RunSample {
                    model: model.clone(),
                    algorithm: algo.clone(),
                    batch,
                    mode: RunMode::Graph,
                    streams: o.streams,
                    ms: vec![r.latency.median_ms],
                    schedule: Some(opsched_schedule::io::to_json(&g, &s)),
                });
            }
        }
    }
    Ok(m)
}

/// `n` independent chains of [`CHAIN`] tiny kernels.
fn tiny_chains(n: usize) -> Result<(Graph, Vec<Vec<NodeId>>)> {
    let mut b = GraphBuilder::new("overheads", DType::F32);
    let x = b.input("x", vec![1]);
    let tiny = Op::Abstract {
        time_ms: 0.0,
        util: 1.0,
    };
    let chains = (0..n)
        .map(|c| {
            let mut prev = x;
            (0..CHAIN)
                .map(|i| {
                    prev = b.op(&format!("t{c}_{i}"), tiny.clone(), &[prev]);
                    prev
                })
                .collect()
        })
        .collect();
    Ok((b.finish()?, chains))
}

fn overheads<D: Device>(dev: &D, o: &MeasureOptions) -> Result<Vec<OverheadSample>> {
    let us = |ms: f64| ms * 1e3;
    let widest = OVERHEAD_STREAMS.iter().copied().max().unwrap_or(1) as usize;
    let (g, chains) = tiny_chains(widest)?;
    let bench = Bench::new(dev, 0, &g, widest, o.kernels)?;
    let time = |groups: &[Vec<NodeId>]| {
        bench
            .time(groups, o.copies, o.warmup, o.repeats)
            .map(|s| s.median_ms)
            .map_err(Error::from)
    };
    let mut v = vec![OverheadSample {
        what: OverheadKind::GraphKernel,
        streams: None,
        us: us(time(&chains[..1])? / CHAIN as f64),
    }];
    for s in OVERHEAD_STREAMS {
        let n = s as usize;
        // One stage: the first kernel of each chain, forked and joined.
        let stage: Vec<Vec<NodeId>> = chains[..n].iter().map(|c| vec![c[0]]).collect();
        v.push(OverheadSample {
            what: OverheadKind::ForkJoin,
            streams: Some(s),
            us: us(time(&stage)?),
        });
        v.push(OverheadSample {
            what: OverheadKind::Chains,
            streams: Some(s),
            us: us(time(&chains[..n])? / CHAIN as f64),
        });
    }
    let eager = bench.time_eager(&[vec![chains[0][0]]], o.warmup, o.repeats)?;
    v.push(OverheadSample {
        what: OverheadKind::EagerLaunch,
        streams: None,
        us: us(eager.median_ms),
    });
    Ok(v)
}

fn contention<D: Device>(
    dev: &D,
    o: &MeasureOptions,
    c: usize,
    size: usize,
    oc: usize,
    k: usize,
) -> Result<ContentionSample> {
    const COPIES: usize = 4;
    let conv = ConvSpec {
        in_channels: c,
        size,
        out_channels: oc,
        kernel: [k, k],
        batch: 1,
    };
    let g = crate::calibrate::contention_graph(&conv, COPIES as u32)?;
    let ids: Vec<NodeId> = g.ops().collect();
    let bench = Bench::new(dev, 0, &g, COPIES, o.kernels)?;
    let time = |groups: &[Vec<NodeId>]| {
        bench
            .time(groups, o.copies, o.warmup, o.repeats)
            .map(|s| s.median_ms * 1e3)
            .map_err(Error::from)
    };
    let alone = time(&[vec![ids[0]]])?;
    let together = time(&ids.iter().map(|&i| vec![i]).collect::<Vec<_>>())?;
    Ok(ContentionSample {
        conv,
        copies: COPIES as u32,
        alone_us: alone,
        together_us: together,
    })
}
