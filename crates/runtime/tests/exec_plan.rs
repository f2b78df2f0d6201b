//! The runtime on the CPU device, in CI: every zoo model under every registered scheduler
//! executed with several streams (and several logical GPUs for the multi-GPU schedulers),
//! eagerly and as a captured graph, equals the sequential run; the host order the runtime
//! follows; a dropped wait caught by the plan checker and, when the checker is bypassed, by the
//! CPU device's race detector; malformed plans as typed errors. The GPU tests at the end are
//! `#[ignore]`d (run them with `cargo xtask gpu-test` on a machine with a GPU).
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use opsched::cost::{AnalyticalModel, DevicePreset, HiosSimLaw, LinkPreset};
use opsched::graph::fusion::Fusions;
use opsched::graph::random::{layered_dag, LayeredDagParams};
use opsched::graph::{DType, GraphBuilder, NodeId};
use opsched::schedule::{
    lower, Cmd, EventId, GpuLaunch, HostCmd, HostProgram, LaunchPlan, Platform, Schedule,
    ScheduleError,
};
use opsched::zoo::ZooConfig;
use opsched::{Graph, SchedulerOptions};
use opsched_gpu::program::Layout;
use opsched_runtime::{
    map_gpus, run_schedule, CheckMode, CpuDevice, RunOptions, RuntimeError, Session,
};

fn platform(gpus: usize, streams: usize) -> Platform {
    Platform {
        gpus,
        streams,
        device: DevicePreset::by_name("h100").unwrap(),
        link: LinkPreset::by_name("nvlink4").unwrap(),
    }
}

fn h100() -> AnalyticalModel {
    AnalyticalModel::new(
        DevicePreset::by_name("h100").unwrap(),
        LinkPreset::by_name("nvlink4").unwrap(),
    )
}

fn gpus_for(algo: &str) -> usize {
    if algo.starts_with("hios") {
        2
    } else {
        1
    }
}

fn schedule(g: &Graph, algo: &str, gpus: usize, cost: &dyn opsched::cost::CostModel) -> Schedule {
    let opts = SchedulerOptions {
        ios_part: 8,
        ..Default::default()
    };
    let s = opsched::scheduler_with(algo, &opts).unwrap();
    s.schedule(g, &platform(gpus, 4), cost).unwrap().0
}

/// Host-order invariants: every record before its waits, every send before its receive, each
/// stream's commands in plan order, every operator launched once.
fn check_host_order(g: &Graph, plan: &LaunchPlan, p: &HostProgram) {
    let mut recorded = vec![false; plan.events as usize];
    let mut sent = vec![false; plan.transfers as usize];
    let mut launched: HashMap<NodeId, usize> = HashMap::new();
    let mut per_stream: HashMap<(usize, usize), Vec<&HostCmd>> = HashMap::new();
    for c in &p.cmds {
        match c {
            HostCmd::Record { event, .. } => recorded[*event as usize] = true,
            HostCmd::Wait { event, .. } => assert!(recorded[*event as usize], "wait before record"),
            HostCmd::Send { xfer, .. } => sent[*xfer as usize] = true,
            HostCmd::Recv { xfer, .. } => assert!(sent[*xfer as usize], "recv before send"),
            HostCmd::Launch { ops, .. } => {
                for o in ops {
                    *launched.entry(*o).or_default() += 1;
                }
            }
        }
        let key = match c {
            HostCmd::Launch { gpu, stream, .. }
            | HostCmd::Record { gpu, stream, .. }
            | HostCmd::Wait { gpu, stream, .. }
            | HostCmd::Send { gpu, stream, .. }
            | HostCmd::Recv { gpu, stream, .. } => (*gpu, *stream),
        };
        per_stream.entry(key).or_default().push(c);
    }
    for (gi, gl) in plan.gpus.iter().enumerate() {
        for (si, cmds) in gl.streams.iter().enumerate() {
            let want: Vec<Vec<NodeId>> = cmds
                .iter()
                .filter_map(|c| match c {
                    Cmd::Launch { op, .. } => Some(vec![*op]),
                    Cmd::LaunchMerged { ops, .. } => Some(ops.clone()),
                    _ => None,
                })
                .collect();
            let got: Vec<Vec<NodeId>> = per_stream
                .get(&(gi, si))
                .map(|v| {
                    v.iter()
                        .filter_map(|c| match c {
                            HostCmd::Launch { ops, .. } => Some(ops.clone()),
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default();
            assert_eq!(got, want, "GPU {gi} stream {si}");
        }
    }
    for o in g.ops() {
        if p.placement[o.index()].is_some() {
            assert_eq!(launched.get(&o), Some(&1), "{}", g.node(o).name);
        }
    }
    assert_eq!(p.counts().waits, p.waits_in_plan - p.waits_dropped);
}

/// The values of `plan` run once on the CPU device (eagerly, or captured once and replayed):
/// every operator's with `reuse: false`, else what survives buffer reuse (at least the
/// graph's outputs); and how many merged stages ran as one convolution.
fn outputs(
    g: &Graph,
    plan: &LaunchPlan,
    capture: bool,
    reuse: bool,
) -> (Vec<Option<Vec<f32>>>, usize) {
    let dev = CpuDevice::new();
    let opts = RunOptions {
        reuse_memory: reuse,
        ..RunOptions::default()
    };
    let s = Session::new(&dev, g, plan, &opts).unwrap();
    s.time(0, 1, capture).unwrap();
    (s.outputs().unwrap(), s.program().merged.len())
}

/// How far a run with merged convolutions may be from the sequential run: a merged
/// convolution sums the same products in another order (its zero-padded taps add exact
/// zeros, but the product's blocking differs).
const MERGED_TOLERANCE: f64 = 1e-5;

/// Every value both have is the same (bit for bit, or within [`MERGED_TOLERANCE`] when
/// `merged` convolutions ran), `got` has every graph output, and a value only one of them has
/// is one that a fusion leaves unwritten in the other (a plan on several GPUs undoes fusions
/// across them).
fn assert_same(
    g: &Graph,
    (got, merged): (&[Option<Vec<f32>>], usize),
    want: &[Option<Vec<f32>>],
    what: &str,
) {
    for o in g.outputs() {
        assert!(
            got[o.value.node.index()].is_some(),
            "{what}: output '{}' lost",
            o.name
        );
    }
    for id in g.ops() {
        match (&got[id.index()], &want[id.index()]) {
            (Some(a), Some(b)) => assert!(
                a == b
                    || merged > 0
                        && opsched::gpu::reference::scaled_error(a, b) <= MERGED_TOLERANCE,
                "{what}: '{}' differs from the sequential run",
                g.node(id).name
            ),
            (Some(_), None) => assert!(
                unkept(g, id),
                "{what}: the sequential run lost '{}'",
                g.node(id).name
            ),
            _ => {}
        }
    }
}

/// Whether a fusion leaves `id`'s own value unwritten on one GPU: a sum whose kernel wrote
/// its activation's instead, a convolution's that wrote the sum it feeds, a product's that
/// wrote the head transpose after it, a head transpose's that products read through and a
/// pooling's that its reader's add kernel computes; or unkept: a convolution's that its
/// readers complete with its bias, a concatenation's that passes its terms' biases on, a value
/// its producer activates for its readers and one that may be written in place into such a
/// value.
fn unkept(g: &Graph, id: NodeId) -> bool {
    use opsched::graph::fusion;
    fusion::fused_sources(g).contains(&Some(id))
        || fusion::residual_of(g, id).is_some()
        || fusion::deferred_bias(g, id).is_some()
        || fusion::passed_bias(g, id)
        || activated_in_place(g, id)
        || fusion::transposed_output(g, id).is_some()
        || fusion::transposed_operand(g, id).is_some()
        || fusion::pool_into_sum(g, id).is_some()
}

/// Whether `id`'s value is activated in place by its producer, or may be written in place into
/// a concatenation that is (directly or through another).
fn activated_in_place(g: &Graph, id: NodeId) -> bool {
    use opsched::graph::{fusion, Op};
    fusion::producer_activation(g, id).is_some()
        || g.succs(id).any(|c| {
            matches!(g.node(c).op, Op::Identity | Op::Concat { .. }) && activated_in_place(g, c)
        })
}

/// Options of a checked run: `repeats` timed runs after `warmup`, captured or not, the outputs
/// compared with a sequential run and the reference.
fn checked(graph_capture: bool, warmup: u32, repeats: u32) -> RunOptions {
    RunOptions {
        graph_capture,
        warmup,
        repeats,
        check: CheckMode::Full,
        ..Default::default()
    }
}

/// [`checked`] with activations in `layout`.
fn checked_in(layout: Layout, graph_capture: bool, warmup: u32, repeats: u32) -> RunOptions {
    RunOptions {
        layout: Some(layout),
        ..checked(graph_capture, warmup, repeats)
    }
}

/// Small inputs so the CPU kernels stay fast in debug builds.
fn small(model: &str) -> Graph {
    small_batch(model, 1)
}

/// [`small`] at batch `batch`.
fn small_batch(model: &str, batch: usize) -> Graph {
    let size = match model {
        "inception_v3" => 75,
        "transformer" => 16,
        _ => 32,
    };
    opsched::load_model(
        model,
        &ZooConfig {
            batch,
            input_size: Some(size),
            dtype: DType::F32,
        },
    )
    .unwrap()
}

/// Every registered scheduler's plan of `model`, executed on the CPU device with its streams
/// (and logical GPUs), gives exactly the sequential run's outputs: the same kernels in another
/// order on other threads. Alternate schedulers run as a captured graph.
fn every_scheduler_equals_sequential(model: &str) {
    let g = small(model);
    let cost = h100();
    let seq = lower(&g, &Schedule::sequential(&g)).unwrap();
    let (want, _) = outputs(&g, &seq, false, false);
    let mut merged = 0;
    for (i, algo) in opsched::scheduler_names().iter().enumerate() {
        let s = schedule(&g, algo, gpus_for(algo), &cost);
        let plan = lower(&g, &s).unwrap();
        let host = HostProgram::new(&g, &plan).unwrap_or_else(|e| panic!("{algo}: {e}"));
        check_host_order(&g, &plan, &host);
        // Buffers shared under this schedule's order (the race detector watches the shared
        // storage), and every sixth scheduler also with every value kept.
        let (got, m) = outputs(&g, &plan, i % 2 == 1, true);
        merged += m;
        assert_same(&g, (&got, m), &want, &format!("{algo} on {model}"));
        if i % 6 == 0 || m > 0 {
            let (all, m) = outputs(&g, &plan, i % 2 == 0, false);
            // Every value but those a fusion leaves unwritten.
            let lost: Vec<&str> = g
                .ops()
                .filter(|&id| all[id.index()].is_none() && !unkept(&g, id))
                .map(|id| g.node(id).name.as_str())
                .collect();
            assert!(lost.is_empty(), "{algo} on {model} lost {lost:?}");
            assert_same(
                &g,
                (&all, m),
                &want,
                &format!("{algo} on {model}, no reuse"),
            );
        }
    }
    // IOS merges convolutions of these models, and their merged stages run as one.
    if ["squeezenet", "googlenet", "inception_v3"].contains(&model) {
        assert!(
            merged > 0,
            "{model}: no merged stage ran as one convolution"
        );
    }
}

#[test]
fn squeezenet_every_scheduler_on_the_cpu_device() {
    every_scheduler_equals_sequential("squeezenet");
}

#[test]
fn googlenet_every_scheduler_on_the_cpu_device() {
    every_scheduler_equals_sequential("googlenet");
}

#[test]
fn inception_v3_every_scheduler_on_the_cpu_device() {
    every_scheduler_equals_sequential("inception_v3");
}

#[test]
fn resnet50_every_scheduler_on_the_cpu_device() {
    every_scheduler_equals_sequential("resnet50");
}

#[test]
fn randwire_every_scheduler_on_the_cpu_device() {
    every_scheduler_equals_sequential("randwire");
}

#[test]
fn nasnet_every_scheduler_on_the_cpu_device() {
    every_scheduler_equals_sequential("nasnet");
}

#[test]
fn transformer_every_scheduler_on_the_cpu_device() {
    every_scheduler_equals_sequential("transformer");
}

#[test]
fn every_zoo_model_has_a_test_above() {
    let tested = [
        "squeezenet",
        "googlenet",
        "inception_v3",
        "resnet50",
        "randwire",
        "nasnet",
        "transformer",
    ];
    for m in opsched::zoo::models() {
        assert!(
            tested.contains(&m.name),
            "no CPU-device test for zoo model {}",
            m.name
        );
    }
}

#[test]
fn run_schedule_checks_against_sequential_and_reference() {
    let g = small("googlenet");
    let cost = h100();
    for (algo, capture) in [("lios", false), ("opara", true), ("hios-lp", true)] {
        let s = schedule(&g, algo, gpus_for(algo), &cost);
        let opts = checked(capture, 1, 3);
        let r = run_schedule(&CpuDevice::new(), &g, &s, &opts).unwrap();
        let c = r.check.unwrap();
        assert!(c.passed, "{algo}: {c:?}");
        assert_eq!(c.vs_sequential, 0.0, "{algo}");
        assert!(c.vs_reference.unwrap() <= c.tolerance_reference, "{algo}");
        assert_eq!(r.device.backend, "cpu");
        assert_eq!(r.latency.samples, 3);
        assert!(r.latency.median_ms > 0.0);
        assert_eq!(r.logical_gpus, gpus_for(algo));
        if algo == "hios-lp" {
            assert!(r.transfers > 0);
            assert_eq!(r.transfer_mode, "copy");
        }
    }
}

/// At batch 2 the convolutions and pools that end Inception's and GoogLeNet's branches write
/// their slices of the concatenations through strided views (one run per image): concurrent
/// branches interleave their runs of one buffer, and the outputs still match the sequential
/// run and the CPU reference.
#[test]
fn strided_concatenation_slices_match_the_reference() {
    let cost = h100();
    // Every branch, a convolution or a max pool: GoogLeNet's 9 modules of 4; Inception-v3's
    // 3 A of 4, 2 B and D of 3, 4 C of 4 and 2 E of 6.
    // NASNet's cell outputs concatenate sums of two branches, each one add kernel into its
    // strided slice: 5 in each of the 18 normal cells, 14 in the stem and reduction cells;
    // the two halves of the factorized reductions of 4 cells, each a chain of operators
    // ending in a convolution; and the 1x1 convolution of the previous cell's output in 15
    // normal cells, which the cell's branches read in place too (separable convolutions,
    // pools, adds); and in 19 cell outputs (3 of them read by one cell only) the slice of the
    // one term that the sums' add kernels do not activate as they write, activated in place
    // after them.
    for (model, branches) in [("googlenet", 36), ("inception_v3", 46), ("nasnet", 146)] {
        let g = small_batch(model, 2);
        let p = opsched_gpu::program::GraphProgram::single_gpu(&g).unwrap();
        let strided = p.buffers.iter().filter(|b| b.runs.is_some()).count();
        assert_eq!(strided, branches, "{model}");
        // (NASNet, the slowest on the CPU, with one schedule.)
        let algos = [("opara", false), ("lios", true), ("sequential", false)];
        let algos = if model == "nasnet" {
            &algos[..1]
        } else {
            &algos[..]
        };
        for &(algo, capture) in algos {
            let s = schedule(&g, algo, 1, &cost);
            let opts = checked(capture, 0, 1);
            let r = run_schedule(&CpuDevice::new(), &g, &s, &opts).unwrap();
            assert_eq!(
                r.strided_views, branches,
                "{model}/{algo}: the run reports them"
            );
            let c = r.check.unwrap();
            assert!(c.passed, "{model}/{algo}: {c:?}");
            assert_eq!(c.vs_sequential, 0.0, "{model}/{algo}");
            assert!(
                c.vs_reference.unwrap() <= c.tolerance_reference,
                "{model}/{algo}"
            );
        }
    }
    // The GPU test's cell: its sums write strided slices.
    let g = summed_cell(2);
    let p = opsched_gpu::program::GraphProgram::single_gpu(&g).unwrap();
    assert_eq!(p.buffers.iter().filter(|b| b.runs.is_some()).count(), 2);
    let opts = checked(false, 0, 1);
    let s = schedule(&g, "greedy", 1, &cost);
    let r = run_schedule(&CpuDevice::new(), &g, &s, &opts).unwrap();
    assert!(r.check.unwrap().passed);
}

/// At batch 2 IOS's merged stages run as one convolution too, every one of them in these
/// models: the members are strided views of the merged output (or, where they are
/// consecutive terms of a concatenation, of the concatenation itself), read in place by the
/// convolutions after them, by the copies into concatenations and by the add kernels
/// (SqueezeNet's bypass, merged with its fire module's squeeze, is summed with the module's
/// output); the outputs equal the sequential run's.
#[test]
fn merged_stages_run_as_one_convolution_at_batch_2() {
    let cost = h100();
    for model in ["squeezenet", "googlenet", "inception_v3"] {
        // IOS's merge-only ablation: every stage it can merge, merged.
        let g = small_batch(model, 2);
        let s = schedule(&g, "ios-merge", 1, &cost);
        let plan = lower(&g, &s).unwrap();
        let stages = HostProgram::new(&g, &plan).unwrap().merged_launches().len();
        let (got, merged) = outputs(&g, &plan, true, true);
        assert!(stages > 0, "{model}: IOS merged nothing");
        assert_eq!(merged, stages, "{model}: merged stages run one at a time");
        let seq = lower(&g, &Schedule::sequential(&g)).unwrap();
        let (want, _) = outputs(&g, &seq, false, true);
        assert_same(
            &g,
            (&got, merged),
            &want,
            &format!("ios on {model} at batch 2"),
        );
        let r = run_schedule(&CpuDevice::new(), &g, &s, &checked(false, 0, 1)).unwrap();
        assert_eq!(r.merged_convolutions, merged, "{model}");
        let c = r.check.unwrap();
        assert!(c.passed, "{model}: {c:?}");
        assert!(c.vs_reference.unwrap() <= c.tolerance_reference, "{model}");
    }
}

/// A schedule of `g` that merges each Transformer layer's query, key and value projections
/// (in one stage, the order a stage runs them) and runs every other operator alone.
fn qkv_schedule(g: &Graph) -> Schedule {
    use opsched::schedule::{Stage, StagePlan, StageStrategy};
    let mut stages = Vec::new();
    let mut merged = Vec::new();
    for &id in g.topo_order() {
        let name = &g.node(id).name;
        if g.node(id).op.is_input() || merged.contains(&id) {
            continue;
        }
        let layer = name.strip_suffix("_q").or(name.strip_suffix("_k"));
        match layer.or(name.strip_suffix("_v")) {
            Some(layer) => {
                let group: Vec<NodeId> = ["v", "k", "q"]
                    .map(|p| g.find(&format!("{layer}_{p}")).unwrap())
                    .into();
                merged.extend(&group);
                stages.push(Stage {
                    strategy: StageStrategy::Merge,
                    groups: vec![group],
                });
            }
            None => stages.push(Stage::single(id)),
        }
    }
    Schedule::Stages(StagePlan { gpus: vec![stages] })
}

/// A Transformer layer's query, key and value projections, merged, run as one product: each
/// is a run per row of the merged output (`[rows, 3 * 768]`), read in place through its head
/// reshape and transpose by the batched products; two products fewer per layer than the
/// sequential plan, every value the sequential run's (to the merged tolerance), eagerly and
/// captured, at batch 1 and 2. (Not the reference's: through twelve layers of random weights
/// the sequential run itself is 5e-4 from it at a softmax, beyond the CPU's 1e-4.)
#[test]
fn merged_linear_layers_run_as_one_product() {
    for batch in [1, 2] {
        let g = small_batch("transformer", batch);
        let s = qkv_schedule(&g);
        let plan = lower(&g, &s).unwrap();
        let layers = HostProgram::new(&g, &plan).unwrap().merged_launches().len();
        assert_eq!(layers, 12);
        let what = format!("transformer at batch {batch}");
        let (got, merged) = outputs(&g, &plan, true, true);
        assert_eq!(merged, layers, "{what}");
        let seq = lower(&g, &Schedule::sequential(&g)).unwrap();
        let (want, _) = outputs(&g, &seq, false, true);
        assert_same(&g, (&got, merged), &want, &what);
        let dev = CpuDevice::new();
        let opts = RunOptions {
            check: CheckMode::Auto,
            reference_max_flops: 0,
            ..checked(batch == 2, 0, 1)
        };
        let r = run_schedule(&dev, &g, &s, &opts).unwrap();
        let sequential = run_schedule(&dev, &g, &Schedule::sequential(&g), &opts).unwrap();
        assert_eq!(r.merged_convolutions, layers, "{what}");
        assert_eq!(r.kernels + 2 * layers, sequential.kernels, "{what}");
        // Each layer: three members, their reshapes and their transposes.
        assert_eq!(r.strided_views, 9 * layers, "{what}");
        let c = r.check.unwrap();
        assert!(c.passed && c.vs_reference.is_none(), "{what}: {c:?}");
    }
}

/// On a GPU, a Transformer's merged query, key and value projections run as one cuBLAS
/// product and the batched products read its rows in place (the merged row's stride as their
/// leading dimension), at batch 1 and 2, eagerly and captured, against the sequential run
/// (TF32) and the reference.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn gpu_merged_linear_layers_run_as_one_product() {
    let dev = opsched_runtime::CudaDevice::open(Some(1)).unwrap();
    let mut failed = Vec::new();
    for (batch, capture) in [(1, false), (2, true)] {
        let g = small_batch("transformer", batch);
        let r = run_schedule(&dev, &g, &qkv_schedule(&g), &checked(capture, 1, 3)).unwrap();
        assert_eq!(r.merged_convolutions, 12, "batch {batch}");
        let c = r.check.clone().unwrap();
        if !c.passed {
            failed.push(format!("batch {batch}, capture {capture}: {c:?}"));
        }
    }
    all_passed(failed);
}

/// Channels last, IOS's merged stages run as one convolution too, at batch 1 and 2: the
/// members are views of the merged output (or of their concatenation) a run of channels per
/// pixel, which the convolutions (cuDNN's input pixel stride), copies and adds after them
/// read in place. Every merged stage runs as one, the kernels are the NCHW run's and the
/// transposes, and every value equals the NCHW run's bit for bit.
#[test]
fn merged_stages_run_as_one_convolution_channels_last() {
    let cost = h100();
    for model in ["squeezenet", "googlenet", "inception_v3"] {
        for batch in [1, 2] {
            let g = small_batch(model, batch);
            let s = schedule(&g, "ios-merge", 1, &cost);
            let plan = lower(&g, &s).unwrap();
            let stages = HostProgram::new(&g, &plan).unwrap().merged_launches().len();
            let what = format!("{model} at batch {batch}");
            let (want, ..) = outputs_in(&g, &plan, Layout::Nchw);
            let (got, nhwc, _) = outputs_in(&g, &plan, Layout::Nhwc);
            assert!(nhwc > 0, "{what}");
            assert_eq!(got, want, "{what}: channels last differs");
            let run = |layout| {
                let opts = checked_in(layout, false, 0, 1);
                run_schedule(&CpuDevice::new(), &g, &s, &opts).unwrap()
            };
            let (last, first) = (run(Layout::Nhwc), run(Layout::Nchw));
            assert_eq!(last.merged_convolutions, stages, "{what}");
            assert_eq!(first.merged_convolutions, stages, "{what}");
            assert_eq!(
                last.kernels,
                first.kernels + last.layout_conversions,
                "{what}"
            );
            assert!(last.check.unwrap().passed, "{what}");
        }
    }
}

/// Every value of a run with channels-last activations, as the session reports it (in NCHW
/// order), and the program's transposes between the layouts.
fn outputs_in(
    g: &Graph,
    plan: &LaunchPlan,
    layout: Layout,
) -> (Vec<Option<Vec<f32>>>, usize, usize) {
    let dev = CpuDevice::new();
    let opts = RunOptions {
        reuse_memory: false,
        layout: Some(layout),
        ..RunOptions::default()
    };
    let s = Session::new(&dev, g, plan, &opts).unwrap();
    s.time(0, 1, false).unwrap();
    let p = s.program();
    let nhwc = p.channels_last.iter().filter(|&&c| c).count();
    (s.outputs().unwrap(), nhwc, p.layout_conversions)
}

/// With channels-last activations every operator's value equals the NCHW run's, bit for bit
/// (the CPU computes a channels-last convolution between two transposes), under several
/// schedules; the check against the reference passes. ResNet-50, SqueezeNet and GoogLeNet
/// cross layouts once, their input into the first convolution (pools, concatenations and
/// sums follow the layout; their global pools' values are one pixel, alike in both), and run
/// the NCHW run's kernels and that one transpose: their branches write their slices of the
/// concatenations in place, one run of channels per pixel. So do RandWire and NASNet (but
/// for one copy), whose relu + separable convolutions run our depthwise kernel channels last
/// and whose cells' sums each write their slice of the cell's output, a run of channels per
/// pixel.
#[test]
fn channels_last_runs_equal_the_nchw_run() {
    let cost = h100();
    // (model, transposes, copies channels last only). NASNet's second half of cell_stem_1's
    // factorized reduction starts at channel 42 of its concatenation, not a multiple of
    // VIEW_ALIGN: it writes its slice in place in NCHW (at element 42 x 8 x 8), is copied
    // into it channels last.
    for (model, conversions, copies) in [
        ("resnet50", 1, 0),
        ("squeezenet", 1, 0),
        ("googlenet", 1, 0),
        ("randwire", 1, 0),
        ("nasnet", 1, 1),
    ] {
        let g = small_batch(model, 2);
        let seq = lower(&g, &Schedule::sequential(&g)).unwrap();
        let (want, none, zero) = outputs_in(&g, &seq, Layout::Nchw);
        assert_eq!((none, zero), (0, 0), "{model}");
        // NASNet's 374 operators under one schedule (the CPU's transposes are slow).
        let algos: &[&str] = match model {
            "nasnet" => &["opara"],
            _ => &["sequential", "lios", "opara"],
        };
        for &algo in algos {
            let plan = lower(&g, &schedule(&g, algo, 1, &cost)).unwrap();
            let (got, nhwc, n) = outputs_in(&g, &plan, Layout::Nhwc);
            assert!(nhwc > 0, "{model}/{algo}: no value channels last");
            assert_eq!(n, conversions, "{model}/{algo}");
            assert_same(
                &g,
                (&got, 0),
                &want,
                &format!("{algo} on {model}, channels last"),
            );
            let opts = checked_in(Layout::Nhwc, algo == "lios", 0, 1);
            let s = schedule(&g, algo, 1, &cost);
            let r = run_schedule(&CpuDevice::new(), &g, &s, &opts).unwrap();
            assert_eq!(r.layout, Layout::Nhwc);
            let nchw = RunOptions {
                layout: Some(Layout::Nchw),
                ..opts.clone()
            };
            let base = run_schedule(&CpuDevice::new(), &g, &s, &nchw).unwrap();
            let more = conversions + copies;
            assert_eq!(r.kernels, base.kernels + more, "{model}/{algo}");
            let c = r.check.unwrap();
            assert!(c.passed, "{model}/{algo}: {c:?}");
            assert!(
                c.vs_reference.unwrap() <= c.tolerance_reference,
                "{model}/{algo}"
            );
        }
    }
}

/// Channels last across GPUs (the default on CUDA, so what a multi-GPU user runs): values
/// sent to another GPU in NHWC and read there in either layout; HIOS-LP's plans on two logical
/// GPUs pass the check, as in NCHW, with the same kernels plus the transposes.
#[test]
fn channels_last_across_gpus_passes_the_check() {
    let cost = h100();
    for model in ["googlenet", "randwire"] {
        let g = small_batch(model, 2);
        let s = schedule(&g, "hios-lp", 2, &cost);
        let run = |layout| {
            let opts = checked_in(layout, true, 0, 1);
            run_schedule(&CpuDevice::new(), &g, &s, &opts).unwrap()
        };
        let (last, first) = (run(Layout::Nhwc), run(Layout::Nchw));
        assert!(last.transfers > 0, "{model}: HIOS-LP sends nothing");
        assert_eq!(last.transfers, first.transfers, "{model}");
        assert!(last.layout_conversions > 0, "{model}");
        for r in [&last, &first] {
            let c = r.check.clone().unwrap();
            assert!(c.passed, "{model}, {:?}: {c:?}", r.layout);
        }
    }
}

#[test]
fn outputs_do_not_depend_on_the_number_of_streams() {
    let g = small("googlenet");
    let cost = h100();
    let (want, _) = outputs(
        &g,
        &lower(&g, &Schedule::sequential(&g)).unwrap(),
        false,
        false,
    );
    for streams in [1, 2, 3, 8] {
        for algo in ["opara", "greedy"] {
            let s = opsched::scheduler(algo).unwrap();
            let (s, _) = s.schedule(&g, &platform(1, streams), &cost).unwrap();
            let plan = lower(&g, &s).unwrap();
            assert!(plan.gpus[0].streams.len() <= streams);
            let (got, m) = outputs(&g, &plan, streams % 2 == 0, streams % 3 != 0);
            assert_same(
                &g,
                (&got, m),
                &want,
                &format!("{algo} on {streams} streams"),
            );
        }
    }
}

#[test]
fn the_run_report_counts_what_the_host_program_holds() {
    let g = small("squeezenet");
    let s = schedule(&g, "hios-mr", 2, &h100());
    let plan = lower(&g, &s).unwrap();
    let host = HostProgram::new(&g, &plan).unwrap();
    let c = host.counts();
    let opts = RunOptions {
        warmup: 0,
        repeats: 2,
        op_times: true,
        ..Default::default()
    };
    let r = run_schedule(&CpuDevice::new(), &g, &s, &opts).unwrap();
    assert!(r.check.is_none());
    assert_eq!(
        r.op_times.len(),
        c.launches,
        "a time per launch, across GPUs too"
    );
    assert_eq!(r.launches, c.launches);
    assert_eq!(r.launches, g.op_count());
    assert_eq!(r.waits, c.waits);
    assert_eq!(r.waits_dropped, host.waits_dropped);
    assert_eq!(r.transfers, host.transfers.len());
    assert_eq!(r.streams, host.streams);
    assert_eq!(r.latency.samples, 2);
    assert!(r.transfers > 0, "hios-mr on two GPUs moves tensors");
    assert!(r.buffer_bytes > 0);
}

/// `op_times`: one entry per launch in the host program's order, on the launch's GPU and
/// stream, every operator named once; and the time lands on the operator that takes it (a
/// 3x3 convolution of 32 channels on 32x32 against activations of four values, in another
/// branch on another stream).
#[test]
fn op_times_follow_the_launches_and_time_each_one() {
    let mut b = GraphBuilder::new("times", DType::F32);
    let x = b.input("x", vec![1, 32, 32, 32]);
    b.conv("big", x, opsched::graph::Conv2d::new(64, 3));
    let t = b.input("t", vec![1, 4]);
    let tiny = b.act("tiny", t, opsched::graph::Activation::Relu);
    b.act("tinier", tiny, opsched::graph::Activation::Relu);
    let g = b.finish().unwrap();
    let s = schedule(&g, "greedy", 1, &h100());
    let plan = lower(&g, &s).unwrap();
    let host = HostProgram::new(&g, &plan).unwrap();
    let launches: Vec<_> = host.launches().collect();
    let opts = RunOptions {
        warmup: 2,
        repeats: 9,
        op_times: true,
        ..Default::default()
    };
    let r = run_schedule(&CpuDevice::new(), &g, &s, &opts).unwrap();
    assert_eq!(r.op_times.len(), launches.len());
    for (t, (gpu, stream, ops)) in r.op_times.iter().zip(&launches) {
        let names: Vec<&str> = ops.iter().map(|&o| g.node(o).name.as_str()).collect();
        assert_eq!(t.nodes, names);
        assert_eq!((t.gpu, t.stream), (*gpu, *stream));
        assert_eq!(t.op, g.node(ops[0]).op.type_name());
        assert_eq!(t.time.samples, 9);
        assert!(t.time.min_ms >= 0.0);
    }
    let streams: std::collections::HashSet<_> = launches.iter().map(|l| l.1).collect();
    assert!(streams.len() > 1, "greedy puts the branches on two streams");
    let time = |name: &str| {
        let t = r.op_times.iter().find(|t| t.nodes == [name]).unwrap();
        t.time.median_ms
    };
    let (conv, relus) = (time("big"), time("tiny").max(time("tinier")));
    assert!(
        conv > 5.0 * relus,
        "the convolution took {conv} ms, an activation of four values {relus} ms"
    );
    let plain = run_schedule(&CpuDevice::new(), &g, &s, &RunOptions::default()).unwrap();
    assert!(plain.op_times.is_empty(), "times only when asked");
}

#[test]
fn multi_gpu_random_dags() {
    for seed in 0..5 {
        let g = layered_dag(&LayeredDagParams {
            ops: 40,
            layers: 6,
            edges: 80,
            seed,
            ..Default::default()
        })
        .unwrap();
        let law = HiosSimLaw::new(h100());
        for algo in ["hios-lp", "hios-mr", "lios", "opara", "greedy"] {
            let gpus = if algo.starts_with("hios") { 3 } else { 1 };
            let s = schedule(&g, algo, gpus, &law);
            let plan = lower(&g, &s).unwrap();
            let p = HostProgram::new(&g, &plan).unwrap();
            check_host_order(&g, &plan, &p);
            assert_eq!(p.transfers.len(), plan.transfers as usize);
            for t in &p.transfers {
                assert_ne!(t.src_gpu, t.dst_gpu);
                assert_eq!(p.placement[t.src.index()].unwrap().0, t.src_gpu);
                assert_eq!(p.placement[t.dst.index()].unwrap().0, t.dst_gpu);
            }
            // Abstract operators spin on the CPU device; the plan runs to the end.
            let (want, _) = outputs(
                &g,
                &lower(&g, &Schedule::sequential(&g)).unwrap(),
                false,
                false,
            );
            let (got, m) = outputs(&g, &plan, seed % 2 == 0, true);
            assert_same(&g, (&got, m), &want, &format!("{algo} seed {seed}"));
        }
    }
}

#[test]
fn opara_launch_order_is_the_host_order() {
    let g = opsched::load_model("googlenet", &ZooConfig::default()).unwrap();
    let s = schedule(&g, "opara", 1, &h100());
    let Schedule::Streams(sp) = &s else {
        panic!("opara gives a stream plan")
    };
    let order = sp.gpus[0].launch_order.clone().unwrap();
    let plan = lower(&g, &s).unwrap();
    assert_eq!(plan.launch_order, order);
    let p = HostProgram::new(&g, &plan).unwrap();
    let host: Vec<NodeId> = p
        .cmds
        .iter()
        .filter_map(|c| match c {
            HostCmd::Launch { ops, .. } => Some(ops[0]),
            _ => None,
        })
        .collect();
    assert_eq!(host, order);
}

/// a -> c, b -> c; a and b on stream 0, c on stream 1.
fn diamond() -> Graph {
    let mut b = GraphBuilder::new("d", DType::F32);
    let x = b.input("x", vec![1, 4, 4, 4]);
    let a = b.act("a", x, opsched::graph::Activation::Relu);
    let bb = b.act("b", a, opsched::graph::Activation::Relu);
    b.add("c", &[a, bb]);
    b.finish().unwrap()
}

fn ids(g: &Graph) -> (NodeId, NodeId, NodeId) {
    (
        g.find("a").unwrap(),
        g.find("b").unwrap(),
        g.find("c").unwrap(),
    )
}

fn launch(op: NodeId) -> Cmd {
    Cmd::Launch { op, stage: None }
}

#[test]
fn implied_waits_are_dropped() {
    let g = diamond();
    let (a, b, c) = ids(&g);
    // Stream 1 waits for b's event first: it already orders a, so the wait for a's is implied.
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![
                vec![
                    launch(a),
                    Cmd::Record(EventId(0)),
                    launch(b),
                    Cmd::Record(EventId(1)),
                ],
                vec![Cmd::Wait(EventId(1)), Cmd::Wait(EventId(0)), launch(c)],
            ],
        }],
        events: 2,
        transfers: 0,
        launch_order: vec![],
    };
    let p = HostProgram::new(&g, &plan).unwrap();
    assert_eq!((p.waits_in_plan, p.waits_dropped), (2, 1));
    // The record of event 0 is gone too.
    assert!(!p.cmds.iter().any(|c| matches!(
        c,
        HostCmd::Record { event: 0, .. } | HostCmd::Wait { event: 0, .. }
    )));
    check_host_order(&g, &plan, &p);
}

#[test]
fn a_missing_wait_is_reported() {
    let g = diamond();
    let (a, b, c) = ids(&g);
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![
                vec![launch(a), Cmd::Record(EventId(0)), launch(b)],
                vec![Cmd::Wait(EventId(0)), launch(c)],
            ],
        }],
        events: 1,
        transfers: 0,
        launch_order: vec![],
    };
    let e = HostProgram::new(&g, &plan).unwrap_err();
    let m = e.to_string();
    assert!(m.contains("'c'") && m.contains("'b'"), "{m}");
}

#[test]
fn malformed_plans_are_typed_errors() {
    let g = diamond();
    let (a, b, c) = ids(&g);
    // A deadlock: each stream waits for an event the other records later.
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![
                vec![Cmd::Wait(EventId(1)), launch(a), Cmd::Record(EventId(0))],
                vec![
                    Cmd::Wait(EventId(0)),
                    launch(b),
                    Cmd::Record(EventId(1)),
                    launch(c),
                ],
            ],
        }],
        events: 2,
        transfers: 0,
        launch_order: vec![],
    };
    let e = HostProgram::new(&g, &plan).unwrap_err();
    assert!(matches!(e, ScheduleError::Deadlock(_)), "{e}");
    // An event recorded twice.
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![vec![
                launch(a),
                Cmd::Record(EventId(0)),
                launch(b),
                Cmd::Record(EventId(0)),
                launch(c),
            ]],
        }],
        events: 1,
        transfers: 0,
        launch_order: vec![],
    };
    assert!(matches!(
        HostProgram::new(&g, &plan),
        Err(ScheduleError::Invalid(_))
    ));
    // An operator launched twice, an event out of range, a transfer never received.
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![vec![launch(a), launch(a)]],
        }],
        events: 0,
        transfers: 0,
        launch_order: vec![],
    };
    assert!(HostProgram::new(&g, &plan)
        .unwrap_err()
        .to_string()
        .contains("more than once"));
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![vec![Cmd::Wait(EventId(5)), launch(a)]],
        }],
        events: 1,
        transfers: 0,
        launch_order: vec![],
    };
    assert!(HostProgram::new(&g, &plan).is_err());
    let plan = LaunchPlan {
        gpus: vec![
            GpuLaunch {
                streams: vec![vec![
                    launch(a),
                    Cmd::Send {
                        xfer: opsched::schedule::TransferId(0),
                        src: a,
                        dst: b,
                        dst_gpu: 1,
                    },
                ]],
            },
            GpuLaunch {
                streams: vec![vec![launch(b), launch(c)]],
            },
        ],
        events: 0,
        transfers: 1,
        launch_order: vec![],
    };
    let e = HostProgram::new(&g, &plan).unwrap_err();
    assert!(e.to_string().contains("never received"), "{e}");
    // A graph input is not an operator.
    let x = g.find("x").unwrap();
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![vec![launch(x)]],
        }],
        events: 0,
        transfers: 0,
        launch_order: vec![],
    };
    assert!(HostProgram::new(&g, &plan).is_err());
}

#[test]
fn a_dropped_wait_is_caught_by_the_race_detector_when_the_checker_is_bypassed() {
    let g = diamond();
    let (a, b, c) = ids(&g);
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![
                vec![launch(a), launch(b), Cmd::Record(EventId(0))],
                vec![Cmd::Wait(EventId(0)), launch(c)],
            ],
        }],
        events: 1,
        transfers: 0,
        launch_order: vec![],
    };
    let mut host = HostProgram::new(&g, &plan).unwrap();
    let before = host.cmds.len();
    host.cmds.retain(|cmd| !matches!(cmd, HostCmd::Wait { .. }));
    assert_eq!(host.cmds.len(), before - 1);
    let dev = CpuDevice::new();
    let s = Session::with_host(&dev, &g, host, &RunOptions::default()).unwrap();
    let e = s.time(0, 1, false).unwrap_err().to_string();
    assert!(e.contains("race on buffer") && e.contains("'c'"), "{e}");
    // The same plan through the checked path runs clean, eagerly and captured.
    let dev = CpuDevice::new();
    let s = Session::new(&dev, &g, &plan, &RunOptions::default()).unwrap();
    s.time(1, 3, true).unwrap();
}

#[test]
fn logical_gpus_map_round_robin() {
    assert_eq!(map_gpus(3, 1).unwrap(), vec![0, 0, 0]);
    assert_eq!(map_gpus(4, 2).unwrap(), vec![0, 1, 0, 1]);
    assert_eq!(map_gpus(2, 8).unwrap(), vec![0, 1]);
    assert!(matches!(map_gpus(2, 0), Err(RuntimeError::Plan(_))));
}

#[test]
fn the_sequential_schedule_covers_every_operator_in_order() {
    let g = opsched::load_model("squeezenet", &ZooConfig::default()).unwrap();
    let plan = lower(&g, &Schedule::sequential(&g)).unwrap();
    let p = HostProgram::new(&g, &plan).unwrap();
    assert_eq!(p.counts().launches, g.op_count());
    assert_eq!(p.counts().waits, 0);
    assert_eq!(
        plan.launch_order,
        g.topo_order()
            .iter()
            .copied()
            .filter(|n| !g.node(*n).op.is_input())
            .collect::<Vec<_>>()
    );
    check_host_order(&g, &plan, &p);
}

/// Without a GPU (CI), opening the CUDA device fails with a typed error naming what is missing.
#[test]
fn the_cuda_device_without_a_gpu_is_a_clear_error() {
    match opsched_runtime::CudaDevice::open(Some(1)) {
        Ok(_) => {} // a GPU machine: the ignored tests below cover it
        Err(e) => {
            let m = e.to_string();
            assert!(e.is_user_error(), "{m}");
            assert!(
                m.contains("could not be loaded") || m.contains("no CUDA device"),
                "{m}"
            );
        }
    }
}

// --- GPU tests ---------------------------------------------------------------------------------

/// A checked run on the GPU, its activations in the device's layout (channels last).
fn gpu_run(model: &str, algo: &str, logical: usize, capture: bool) -> opsched_runtime::RunReport {
    gpu_run_at(model, algo, logical, capture, 1, None)
}

/// [`gpu_run`] at batch `batch`, in `layout` (`None`: the device's).
fn gpu_run_at(
    model: &str,
    algo: &str,
    logical: usize,
    capture: bool,
    batch: usize,
    layout: Option<Layout>,
) -> opsched_runtime::RunReport {
    let g = opsched::load_model(
        model,
        &ZooConfig {
            batch,
            // Inception-v3's reductions need at least 75 pixels.
            input_size: Some(if model == "inception_v3" { 75 } else { 64 }),
            dtype: DType::F32,
        },
    )
    .unwrap();
    let s = schedule(&g, algo, logical, &h100());
    let opts = RunOptions {
        layout,
        ..checked(capture, 2, 5)
    };
    let dev = opsched_runtime::CudaDevice::open(Some(1)).unwrap();
    let r = run_schedule(&dev, &g, &s, &opts).unwrap();
    let c = r.check.clone().unwrap();
    assert!(c.passed, "{model}/{algo}: {c:?}");
    assert!(r.latency.median_ms > 0.0);
    r
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn gpu_squeezenet_sequential_and_ios_match_the_reference() {
    for capture in [false, true] {
        gpu_run("squeezenet", "sequential", 1, capture);
        let ios = gpu_run("squeezenet", "ios", 1, capture);
        assert!(
            ios.merged_convolutions > 0,
            "IOS merges SqueezeNet's expand convolutions"
        );
        gpu_run("googlenet", "opara", 1, capture);
        gpu_run("googlenet", "lios", 1, capture);
    }
}

/// In NCHW, cuDNN writes the branches' strided slices of the concatenations (images a
/// concatenated image apart), in its fused call and with the bias kernel after it, as do
/// Inception's max pools, eagerly and captured; the sums of a NASNet-like cell each write
/// theirs in one add. (Channels last, the default on a GPU, has a test of its own.)
/// (Small: every new shape is timed once, within the first call's limit per test binary.)
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn gpu_strided_concatenation_slices_match_the_reference() {
    let nchw = Some(Layout::Nchw);
    for capture in [false, true] {
        gpu_run_at("googlenet", "lios", 1, capture, 2, nchw);
    }
    gpu_run_at("inception_v3", "opara", 1, true, 2, nchw);
    let g = summed_cell(2);
    let opts = RunOptions {
        layout: nchw,
        ..checked(true, 1, 3)
    };
    let dev = opsched_runtime::CudaDevice::open(Some(1)).unwrap();
    let r = run_schedule(&dev, &g, &schedule(&g, "greedy", 1, &h100()), &opts).unwrap();
    let c = r.check.clone().unwrap();
    assert!(c.passed, "summed cell: {c:?}");
}

/// On a GPU, channels-last activations (cuDNN's NHWC descriptors, the filter permuted to
/// KRSC, the bias kernel over consecutive channels, our channels-last depthwise kernel):
/// ResNet-50, GoogLeNet, NASNet and RandWire at batch 2 pass the check against the sequential
/// run and the reference, eager and captured.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn gpu_channels_last_matches_the_reference() {
    let dev = opsched_runtime::CudaDevice::open(Some(1)).unwrap();
    let models = [
        ("resnet50", false),
        ("resnet50", true),
        ("googlenet", true),
        // `depthwise_conv_nhwc`, the cells' sums writing their slices a run per pixel.
        ("nasnet", true),
        ("randwire", false),
    ];
    let mut failed = Vec::new();
    for (model, capture) in models {
        let g = small_batch(model, 2);
        let opts = checked_in(Layout::Nhwc, capture, 1, 3);
        let r = run_schedule(&dev, &g, &schedule(&g, "lios", 1, &h100()), &opts).unwrap();
        let c = r.check.clone().unwrap();
        if !c.passed {
            failed.push(format!("{model}, capture {capture}: {c:?}"));
        }
        assert!(r.layout_conversions > 0, "{model}");
    }
    all_passed(failed);
}

/// Convolutions that leave their bias to their readers (`fusion::deferred_bias`), in both
/// layouts: the add kernels that take them (NASNet's cell sums writing their slices one run
/// per image or pixel at batch 2, ResNet-50's downsampling adds with their relu) and our
/// depthwise kernel that adds one to what it reads (NASNet's and RandWire's second separable
/// convolutions) pass the check against the sequential run and the reference; so do they
/// with each fusion left out.
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn gpu_deferred_biases_match_the_reference() {
    let dev = opsched_runtime::CudaDevice::open(Some(1)).unwrap();
    let mut failed = Vec::new();
    for (model, batch, algo) in [
        ("nasnet", 2, "lios"),
        ("randwire", 1, "opara"),
        ("resnet50", 1, "sequential"),
    ] {
        let g = small_batch(model, batch);
        let deferred = g
            .ops()
            .filter(|&o| opsched::graph::fusion::deferred_bias(&g, o).is_some())
            .count();
        assert!(deferred > 0, "{model}");
        let s = schedule(&g, algo, 1, &h100());
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let opts = checked_in(layout, true, 1, 3);
            let r = run_schedule(&dev, &g, &s, &opts).unwrap();
            let c = r.check.clone().unwrap();
            if !c.passed {
                failed.push(format!("{model} at batch {batch}, {layout:?}: {c:?}"));
            }
        }
        // Each fusion left out (`opsched run --no-fusion`), channels last.
        for (name, _) in Fusions::NAMES {
            let fewer = g.clone().with_fusions(Fusions::ALL.without(name).unwrap());
            let opts = checked_in(Layout::Nhwc, true, 1, 3);
            let c = run_schedule(&dev, &fewer, &s, &opts)
                .unwrap()
                .check
                .unwrap();
            if !c.passed {
                failed.push(format!("{model} at batch {batch} without {name}: {c:?}"));
            }
        }
    }
    all_passed(failed);
}

/// Every case of a GPU test runs (one device call tells them all), then it fails on those
/// that did not pass.
fn all_passed(failed: Vec<String>) {
    assert!(failed.is_empty(), "failed:\n{}", failed.join("\n"));
}

/// IOS's input model of a cell at batch `n`: its output concatenates sums of branches
/// (`[l + r, x, r + x]`), then a convolution reads it.
fn summed_cell(n: usize) -> Graph {
    use opsched::graph::{Conv2d, Op, Value};
    let mut b = GraphBuilder::new("cell", DType::F32);
    let x = b.input("x", vec![n, 8, 6, 6]);
    let l = b.conv("l", x, Conv2d::new(8, 3).padding(1, 1));
    let r = b.conv("r", x, Conv2d::new(8, 1));
    let sum = |a: NodeId, c: NodeId| vec![Value::whole(a), Value::whole(c)];
    let cell = b.node(
        "cell",
        Op::Identity,
        vec![sum(l, r), vec![Value::whole(x)], sum(r, x)],
    );
    b.conv("out", cell, Conv2d::new(4, 1));
    b.finish().unwrap()
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn gpu_two_logical_gpus_on_one_physical() {
    for capture in [false, true] {
        let r = gpu_run("googlenet", "hios-lp", 2, capture);
        assert_eq!(r.device.units, 1);
        assert_eq!(r.transfer_mode, "copy");
    }
}

/// Three convolutions of one input (1x1, 3x3, 5x5, "same" padding, bias and relu) concatenated
/// in that order, the 3x3 one also read by `reader`: "pool" (a 3x3 max pool), "conv" (a 3x3
/// convolution) or "softmax" (over channels: a kernel that reads no strided view in place);
/// at batch `n`.
fn three_branches(n: usize, reader: &str) -> Graph {
    use opsched::graph::{Conv2d, Op, Pool2d, PoolKind};
    let mut b = GraphBuilder::new("branches", DType::F32);
    let x = b.input("x", vec![n, 8, 9, 9]);
    let convs: Vec<NodeId> = [(4, 1), (8, 3), (12, 5)]
        .iter()
        .map(|&(oc, k)| b.conv(&format!("c{k}"), x, Conv2d::new(oc, k).bias(true).relu()))
        .collect();
    b.concat("cat", &convs);
    let op = match reader {
        "conv" => Op::Conv2d(Conv2d::new(4, 3).bias(true)),
        "pool" => Op::Pool2d(Pool2d::new(PoolKind::Max, 3, 1, 1)),
        _ => Op::Softmax { axis: 1 },
    };
    b.op("reader", op, &[convs[1]]);
    b.finish().unwrap()
}

/// The three convolutions as one merged stage, then the rest one by one.
fn merged_schedule(g: &Graph) -> Schedule {
    use opsched::schedule::{Stage, StagePlan, StageStrategy};
    let merged: Vec<NodeId> = ["c1", "c3", "c5"].map(|n| g.find(n).unwrap()).into();
    let mut stages = vec![Stage {
        strategy: StageStrategy::Merge,
        groups: vec![merged.clone()],
    }];
    stages.extend(
        g.topo_order()
            .iter()
            .filter(|&&id| !g.node(id).op.is_input() && !merged.contains(&id))
            .map(|&id| Stage::single(id)),
    );
    Schedule::Stages(StagePlan { gpus: vec![stages] })
}

#[test]
fn a_merged_stage_runs_as_one_convolution_and_matches_the_reference() {
    // (batch, the 3x3 branch's other reader, merged, strided views, kernels fewer than the
    // sequential plan's).
    // Each member's output is a slice of the merged output, which is itself the
    // concatenation's (no copy): contiguous at batch 1. At batch 2 it is one run per image,
    // the members' too, which a convolution or a pool reads in place but a softmax could
    // not: with the softmax the stage runs its three convolutions (the sequential plan's
    // strided slices and the copy of the branch the softmax reads), else one convolution,
    // where the sequential plan runs three (each writing its strided slice).
    let cases = [
        (1, "pool", 1, 0, 2),
        (2, "softmax", 0, 2, 0),
        (2, "pool", 1, 4, 2),
        (1, "conv", 1, 0, 2),
        (2, "conv", 1, 4, 2),
    ];
    for (n, reader, merges, strided, fewer) in cases {
        let what = format!("batch {n}, read by a {reader}");
        let g = three_branches(n, reader);
        let s = merged_schedule(&g);
        let opts = checked(false, 0, 1);
        let r = run_schedule(&CpuDevice::new(), &g, &s, &opts).unwrap();
        let c = r.check.clone().unwrap();
        assert!(c.passed, "{what}: {c:?}");
        assert!(c.vs_reference.unwrap() <= 1e-5, "{what}: {c:?}");
        assert_eq!(r.merged_convolutions, merges, "{what}");
        assert_eq!(r.strided_views, strided, "{what}");
        let seq = run_schedule(&CpuDevice::new(), &g, &Schedule::sequential(&g), &opts).unwrap();
        assert_eq!(r.kernels + fewer, seq.kernels, "{what}");
        // The reader still reads the 3x3 branch's own value.
        let plan = lower(&g, &s).unwrap();
        let (got, m) = outputs(&g, &plan, n == 1, false);
        let (want, _) = outputs(
            &g,
            &lower(&g, &Schedule::sequential(&g)).unwrap(),
            false,
            false,
        );
        assert_eq!(m, merges);
        assert_same(&g, (&got, m), &want, &what);
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn gpu_a_merged_stage_runs_as_one_convolution() {
    let dev = opsched_runtime::CudaDevice::open(Some(1)).unwrap();
    // At batch 2 a pool reads its member in place (`pool2d` with the image stride), as does
    // a convolution (cuDNN's input descriptor); a softmax reads a copy.
    let cases = [
        (1, "pool", 1),
        (2, "softmax", 0),
        (2, "pool", 1),
        (2, "conv", 1),
    ];
    let mut failed = Vec::new();
    for (n, reader, merges) in cases {
        let g = three_branches(n, reader);
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let opts = checked_in(layout, n == 1, 1, 3);
            let r = run_schedule(&dev, &g, &merged_schedule(&g), &opts).unwrap();
            let c = r.check.clone().unwrap();
            if !c.passed {
                failed.push(format!("batch {n}, read by a {reader}, {layout:?}: {c:?}"));
            }
            if layout == Layout::Nchw {
                assert_eq!(r.merged_convolutions, merges, "batch {n}, {reader}");
            }
        }
    }
    // SqueezeNet at batch 2: each bypass, merged with its module's squeeze, is summed with the
    // module's output by `elementwise_views`, reading the strided member in place; channels
    // last, the convolutions after the members read them with cuDNN's pixel stride.
    let g = small_batch("squeezenet", 2);
    let s = schedule(&g, "ios-merge", 1, &h100());
    let plan = lower(&g, &s).unwrap();
    let stages = HostProgram::new(&g, &plan).unwrap().merged_launches().len();
    for layout in [Layout::Nchw, Layout::Nhwc] {
        let opts = checked_in(layout, true, 1, 3);
        let r = run_schedule(&dev, &g, &s, &opts).unwrap();
        let c = r.check.clone().unwrap();
        if !c.passed {
            failed.push(format!("squeezenet at batch 2, {layout:?}: {c:?}"));
        }
        assert_eq!(r.merged_convolutions, stages, "squeezenet, {layout:?}");
    }
    all_passed(failed);
}
