//! The memory plan on the CPU device: concatenation inputs written in place, activations
//! fused into the sums they read, buffers shared
//! only where the schedule orders their uses apart (checked independently of the planner, and
//! by the CPU device's race detector on the shared storage), and outputs unchanged.
#![allow(clippy::unwrap_used)]

use opsched::cost::{AnalyticalModel, DevicePreset, LinkPreset};
use opsched::graph::rng::SplitMix64;
use opsched::graph::{Activation, Conv2d, DType, GraphBuilder, NodeId, Op, Value};
use opsched::schedule::{lower, HostProgram, Platform, Schedule};
use opsched::Graph;
use opsched_gpu::memory::{check_layout, footprint, layout_reusing, root_of};
use opsched_gpu::program::{BufRole, GraphProgram, TransferSpec};
use opsched_gpu::reference::scaled_error;
use opsched_gpu::step::Step;
use opsched_runtime::{CpuDevice, RunOptions, Session};

fn h100() -> AnalyticalModel {
    AnalyticalModel::new(
        DevicePreset::by_name("h100").unwrap(),
        LinkPreset::by_name("nvlink4").unwrap(),
    )
}

fn schedule(g: &Graph, algo: &str, streams: usize) -> Schedule {
    let platform = Platform {
        gpus: 1,
        streams,
        device: DevicePreset::by_name("h100").unwrap(),
        link: LinkPreset::by_name("nvlink4").unwrap(),
    };
    let s = opsched::scheduler(algo).unwrap();
    s.schedule(g, &platform, &h100()).unwrap().0
}

/// Every value that survives one run of `s` (all of them with `reuse: false`), and the
/// session's program.
fn run(g: &Graph, s: &Schedule, reuse: bool) -> (Vec<Option<Vec<f32>>>, GraphProgram) {
    let dev = CpuDevice::new();
    let opts = RunOptions {
        reuse_memory: reuse,
        ..RunOptions::default()
    };
    let plan = lower(g, s).unwrap();
    let session = Session::new(&dev, g, &plan, &opts).unwrap();
    session.time(0, 2, reuse).unwrap();
    (session.outputs().unwrap(), session.program().clone())
}

fn branches(batch: usize) -> Graph {
    let mut b = GraphBuilder::new("branches", DType::F32);
    let x = b.input("x", vec![batch, 8, 8, 8]);
    let l = b.conv("l", x, Conv2d::new(8, 3).bias(true).relu());
    let r = b.conv("r", x, Conv2d::new(4, 1));
    let r2 = b.act("r2", r, Activation::Sigmoid);
    let m = b.conv("m", x, Conv2d::new(4, 1).bias(true));
    let cat = b.concat("cat", &[l, r2, m, x]);
    b.conv("out", cat, Conv2d::new(4, 1));
    b.finish().unwrap()
}

#[test]
fn concatenated_operators_write_their_slices_in_place() {
    for batch in [1, 2] {
        let g = branches(batch);
        let p = GraphProgram::single_gpu(&g).unwrap();
        let id = |n: &str| g.find(n).unwrap();
        let out = |n: &str| p.ops[id(n).index()].as_ref().unwrap().output;
        let cat_steps = p.ops[id("cat").index()].as_ref().unwrap().steps.len();
        let image = 24 * 64;
        if batch == 1 {
            // l, r2 and m write channels 0..8, 8..12 and 12..16 of cat; only the graph input
            // is copied.
            assert_eq!(p.buffers[out("l")].within, Some((out("cat"), 0)));
            assert_eq!(p.buffers[out("r2")].within, Some((out("cat"), 8 * 64)));
            assert_eq!(p.buffers[out("m")].within, Some((out("cat"), 12 * 64)));
            assert!(p.buffers.iter().all(|b| b.runs.is_none()));
            assert_eq!(cat_steps, 1);
        } else {
            // At batch 2 a branch's channels are one run per image in cat: the convolutions
            // write them through strided views, the activation's output and the input are
            // copied.
            let runs = |c: usize| {
                Some(opsched_gpu::program::Runs {
                    run: c * 64,
                    stride: image,
                })
            };
            assert_eq!(p.buffers[out("l")].within, Some((out("cat"), 0)));
            assert_eq!(p.buffers[out("l")].runs, runs(8));
            assert_eq!(p.buffers[out("m")].within, Some((out("cat"), 12 * 64)));
            assert_eq!(p.buffers[out("m")].runs, runs(4));
            assert_eq!(p.buffers[out("r2")].within, None);
            assert_eq!(cat_steps, 2);
        }
        assert_eq!(p.buffers[out("r")].within, None);
        check_layout(&p).unwrap();
        // The branches run at once on three streams: the race detector checks that their
        // interleaved runs of cat are told apart.
        let s = schedule(&g, "opara", 3);
        let want = opsched_gpu::reference::reference_with(&g, &Default::default()).unwrap();
        for reuse in [false, true] {
            let (got, _) = run(&g, &s, reuse);
            for n in ["l", "m", "cat", "out"] {
                if let Some(v) = &got[id(n).index()] {
                    let e = opsched_gpu::reference::scaled_error(
                        v,
                        want[id(n).index()].as_ref().unwrap(),
                    );
                    assert!(e < 1e-5, "batch {batch} '{n}': {e}");
                }
            }
            assert!(got[id("out").index()].is_some());
        }
    }
}

/// A residual sum and its relu (ResNet's), then a sum of two branches beside each other and
/// its relu, written into a concatenation at batch 1.
fn residual() -> Graph {
    let mut b = GraphBuilder::new("residual", DType::F32);
    let x = b.input("x", vec![1, 8, 8, 8]);
    let c = b.conv("c", x, Conv2d::new(8, 3).bias(true));
    let add = b.add("add", &[c, x]);
    let relu = b.act("relu", add, Activation::Relu);
    let l = b.conv("l", relu, Conv2d::new(8, 1));
    let r = b.conv("r", relu, Conv2d::new(8, 3));
    let both = b.add("both", &[l, r]);
    let brelu = b.act("brelu", both, Activation::Relu);
    let side = b.conv("side", x, Conv2d::new(4, 1).relu());
    let cat = b.concat("cat", &[brelu, side]);
    b.conv("out", cat, Conv2d::new(4, 1));
    b.finish().unwrap()
}

#[test]
fn sums_and_activations_run_in_the_kernels_that_feed_them() {
    let g = residual();
    let id = |n: &str| g.find(n).unwrap();
    let p = GraphProgram::single_gpu(&g).unwrap();
    let op = |n: &str| p.ops[id(n).index()].as_ref().unwrap();
    let within = |n: &str| p.buffers[op(n).output].within;
    // The convolution adds the identity and applies the relu, writing the relu's output
    // through the sum's: neither has anything left to do.
    let [Step::Conv(c)] = op("c").steps.as_slice() else {
        panic!("c: {:?}", op("c").steps);
    };
    assert_eq!((c.act, c.residual.is_some()), (Activation::Relu, true));
    assert!(op("add").steps.is_empty() && op("relu").steps.is_empty());
    assert_eq!(within("c"), Some((op("add").output, 0)));
    assert_eq!(within("add"), Some((op("relu").output, 0)));
    // A sum of two branches (neither runs before the other) applies its relu and writes the
    // relu's output, itself the first slice of the concatenation.
    let [Step::Elementwise(e)] = op("both").steps.as_slice() else {
        panic!("both: {:?}", op("both").steps);
    };
    assert_eq!(e.act, Activation::Relu);
    assert!(op("brelu").steps.is_empty());
    assert_eq!(within("both"), Some((op("brelu").output, 0)));
    assert_eq!(
        root_of(&p, op("both").output),
        root_of(&p, op("cat").output)
    );
    for n in ["c", "add", "both"] {
        assert_eq!(p.outputs[id(n).index()], None, "{n}");
    }
    check_layout(&p).unwrap();
    let want = opsched_gpu::reference::reference_with(&g, &Default::default()).unwrap();
    for (algo, streams) in [("sequential", 1), ("opara", 2), ("greedy", 3)] {
        let s = schedule(&g, algo, streams);
        for reuse in [false, true] {
            let (got, _) = run(&g, &s, reuse);
            assert!(got[id("both").index()].is_none());
            for n in ["relu", "brelu", "cat", "out"] {
                if let Some(v) = &got[id(n).index()] {
                    let e = opsched_gpu::reference::scaled_error(
                        v,
                        want[id(n).index()].as_ref().unwrap(),
                    );
                    assert!(e < 1e-5, "{algo}, reuse {reuse}: '{n}' off by {e}");
                }
            }
        }
    }
    // On two GPUs brelu reads a transferred copy of the sum: both keep their kernels.
    let placement: Vec<Option<usize>> = g
        .nodes()
        .iter()
        .enumerate()
        .map(|(i, n)| (!n.op.is_input()).then_some(usize::from(i == id("brelu").index())))
        .collect();
    let transfers = [
        TransferSpec {
            src: id("both"),
            dst: id("brelu"),
            dst_gpu: 1,
        },
        TransferSpec {
            src: id("brelu"),
            dst: id("cat"),
            dst_gpu: 0,
        },
    ];
    let p = GraphProgram::build(&g, &placement, &transfers).unwrap();
    let op = |n: &str| p.ops[id(n).index()].as_ref().unwrap();
    assert!(matches!(op("brelu").steps.as_slice(), [Step::Act(_)]));
    assert!(
        matches!(op("both").steps.as_slice(), [Step::Elementwise(e)] if e.act == Activation::None)
    );
    assert!(p.outputs[id("both").index()].is_some());
}

#[test]
fn a_summed_term_of_a_concatenation_is_one_add_into_its_slice() {
    for batch in [1, 2] {
        let mut b = GraphBuilder::new("cell", DType::F32);
        let x = b.input("x", vec![batch, 8, 6, 6]);
        let l = b.conv("l", x, Conv2d::new(8, 3));
        let r = b.conv("r", x, Conv2d::new(8, 1));
        // IOS's input model: a cell output concatenates sums of branches.
        let sum = |a: NodeId, c: NodeId| vec![Value::whole(a), Value::whole(c)];
        let terms = vec![sum(l, r), vec![Value::whole(x)], sum(r, x)];
        let cell = b.node("cell", Op::Identity, terms);
        b.conv("out", cell, Conv2d::new(4, 1));
        let g = b.finish().unwrap();
        let p = GraphProgram::single_gpu(&g).unwrap();
        let op = p.ops[cell.index()].as_ref().unwrap();
        let adds: Vec<_> = op
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Elementwise(e) => Some(e),
                _ => None,
            })
            .collect();
        // Each sum writes its slice (channels 0..8 and 16..24) through a view, strided at
        // batch 2 (one run of 8 channels per image of 24); the input is copied.
        let at: Vec<_> = adds.iter().map(|e| p.buffers[e.y].within).collect();
        assert_eq!(at, [Some((op.output, 0)), Some((op.output, 16 * 36))]);
        let runs = (batch > 1).then_some(opsched_gpu::program::Runs {
            run: 8 * 36,
            stride: 24 * 36,
        });
        assert!(adds.iter().all(|e| p.buffers[e.y].runs == runs));
        assert_eq!(op.steps.len(), 3);
        let launches = opsched::cost::launches::launches(&g, cell);
        assert_eq!(launches as usize, op.steps.len());
        check_layout(&p).unwrap();
        let want = opsched_gpu::reference::reference_with(&g, &Default::default()).unwrap();
        for reuse in [false, true] {
            let (got, _) = run(&g, &schedule(&g, "greedy", 2), reuse);
            for n in [cell, g.find("out").unwrap()] {
                if let Some(v) = &got[n.index()] {
                    let e =
                        opsched_gpu::reference::scaled_error(v, want[n.index()].as_ref().unwrap());
                    assert!(e < 1e-5, "batch {batch}: '{}' off by {e}", g.node(n).name);
                }
            }
        }
    }
}

#[test]
fn a_chain_runs_in_two_shared_buffers() {
    let mut b = GraphBuilder::new("chain", DType::F32);
    let mut x = b.input("x", vec![1, 16, 16, 16]);
    for i in 0..8 {
        x = b.act(&format!("a{i}"), x, Activation::Relu);
    }
    let g = b.finish().unwrap();
    let (got, p) = run(&g, &Schedule::sequential(&g), true);
    // The input and the output keep their own storage; a0..a6 alternate between two buffers.
    let act = 16 * 16 * 16 * 4;
    assert_eq!(footprint(&p).storage_bytes, 4 * act);
    assert_eq!(footprint(&p).distinct_bytes, 9 * act);
    assert!(got[g.find("a7").unwrap().index()].is_some());
    assert!(got[g.find("a3").unwrap().index()].is_none());
}

/// A random DAG of small real operators: activations, sums, 1x1 and 3x3 convolutions and
/// concatenations (whose inputs are written in place, through strided views at batch > 1),
/// all of shape `[batch, 4, 6, 6]`.
fn random_graph(seed: u64, ops: usize, batch: usize) -> Graph {
    let mut rng = SplitMix64::new(seed);
    let mut pick = |n: usize| (rng.next_f64() * n as f64) as usize % n;
    let mut b = GraphBuilder::new("random", DType::F32);
    let mut nodes = vec![b.input("x", vec![batch, 4, 6, 6])];
    for i in 0..ops {
        let (a, c) = (nodes[pick(nodes.len())], nodes[pick(nodes.len())]);
        let name = format!("n{i}");
        let whole = |v: &[NodeId]| v.iter().map(|&n| Value::whole(n)).collect::<Vec<_>>();
        let v = match pick(8) {
            0 => b.act(&name, a, Activation::Tanh),
            1 if a != c => b.add(&name, &[a, c]),
            2 => b.conv(&name, a, Conv2d::new(4, 3).bias(true)),
            3 if a != c => {
                let cat = b.concat(&format!("{name}.cat"), &[a, c]);
                b.conv(&name, cat, Conv2d::new(4, 1))
            }
            // Two branches of one input that IOS may merge, concatenated: at batch 2 too,
            // since the concatenation alone reads them.
            4 => {
                let l = b.conv(&format!("{name}.l"), a, Conv2d::new(4, 1).bias(true));
                let r = b.conv(&format!("{name}.r"), a, Conv2d::new(4, 3).bias(true));
                let cat = b.concat(&format!("{name}.cat"), &[l, r]);
                b.conv(&name, cat, Conv2d::new(4, 1))
            }
            // RandWire's node: relu + separable convolution of a sum.
            5 if a != c => {
                let ops = vec![
                    Op::Activation {
                        act: Activation::Relu,
                    },
                    Op::Conv2d(Conv2d::new(4, 3).groups(4).bias(true)),
                    Op::Conv2d(Conv2d::new(4, 1)),
                ];
                b.node(&name, Op::Sequential { ops }, vec![whole(&[a, c])])
            }
            // A NASNet cell's output: sums and a value concatenated.
            6 if a != c => {
                let terms = vec![whole(&[a, c]), whole(&[c]), whole(&[c, a])];
                let cell = b.node(&format!("{name}.cell"), Op::Identity, terms);
                b.conv(&name, cell, Conv2d::new(4, 1))
            }
            _ => b.act(&name, a, Activation::Sigmoid),
        };
        nodes.push(v);
    }
    b.finish().unwrap()
}

/// The plan's invariant, checked from the program alone: two buffers whose storage overlaps
/// are one inside the other, or both shared and touched by operators that `before` orders
/// entirely one way.
fn assert_overlaps_are_ordered(p: &GraphProgram, host: &HostProgram, nodes: usize) {
    let order = host.op_order(nodes);
    let mut users: Vec<Vec<NodeId>> = vec![Vec::new(); p.buffers.len()];
    for (i, op) in p.ops.iter().enumerate() {
        for s in op.iter().flat_map(|o| &o.steps) {
            for (b, _) in s.access().all() {
                users[root_of(p, b).0].push(NodeId(i as u32));
            }
        }
    }
    let roots: Vec<usize> = (0..p.buffers.len())
        .filter(|&i| p.buffers[i].within.is_none())
        .collect();
    for (k, &x) in roots.iter().enumerate() {
        for &y in &roots[k + 1..] {
            let (a, b) = (&p.buffers[x], &p.buffers[y]);
            if a.gpu != b.gpu || a.offset + a.len <= b.offset || b.offset + b.len <= a.offset {
                continue;
            }
            assert!(
                a.reused && b.reused,
                "buffers {x} and {y} overlap: {a:?} {b:?}"
            );
            let ordered = |u: &[NodeId], v: &[NodeId]| {
                u.iter().all(|&m| v.iter().all(|&n| order.before(m, n)))
            };
            assert!(
                ordered(&users[x], &users[y]) || ordered(&users[y], &users[x]),
                "buffers {x} ({:?}) and {y} ({:?}) share storage but their users overlap in time",
                a.role,
                b.role
            );
        }
    }
    for b in &p.buffers {
        if matches!(b.role, BufRole::Param { .. } | BufRole::Input(_)) {
            assert!(!b.reused);
        }
    }
}

#[test]
fn random_graphs_share_storage_only_between_ordered_uses() {
    let (mut merged, mut strided, mut merged_batch_2) = (0, 0, 0);
    // Graphs of 30 operators, and of 16, where IOS's search merges (it does not in much
    // larger ones).
    for (seed, ops) in (0..6).map(|s| (s, 30)).chain((0..6).map(|s| (s, 16))) {
        let g = random_graph(seed, ops, 1 + seed as usize % 2);
        let (want, _) = run(&g, &Schedule::sequential(&g), false);
        let algos = [
            ("opara", 4),
            ("greedy", 3),
            ("lios", 2),
            ("ios-merge", 1),
            ("sequential", 1),
        ];
        for (algo, streams) in algos {
            let s = schedule(&g, algo, streams);
            let plan = lower(&g, &s).unwrap();
            let host = HostProgram::new(&g, &plan).unwrap();
            let merges = host.merged_launches();
            let mut p = GraphProgram::build_merged(&g, &host.gpu_of(), &[], &merges).unwrap();
            merged += p.merged.len();
            if g.node(NodeId(0)).shape[0] == 2 {
                merged_batch_2 += p.merged.len();
            }
            strided += p.buffers.iter().filter(|b| b.runs.is_some()).count();
            let keep: Vec<NodeId> = g.outputs().iter().map(|o| o.value.node).collect();
            let order = host.op_order(g.len());
            layout_reusing(&mut p, &keep, |a, b| order.before(a, b));
            check_layout(&p).unwrap();
            assert_overlaps_are_ordered(&p, &host, g.len());
            let fp = footprint(&p);
            assert!(
                fp.storage_bytes < fp.distinct_bytes,
                "{algo} seed {seed}: {fp:?}"
            );
            // Run it: the race detector watches the shared storage; the outputs are the
            // sequential run's, bit for bit (within rounding where convolutions merged).
            let (got, _) = run(&g, &s, true);
            for o in g.outputs() {
                let n = o.value.node.index();
                let (a, b) = (got[n].as_deref().unwrap(), want[n].as_deref().unwrap());
                assert!(
                    a == b || !p.merged.is_empty() && scaled_error(a, b) <= 1e-5,
                    "{algo} seed {seed}: output '{}'",
                    o.name
                );
            }
        }
    }
    assert!(merged > 0, "no merged stage of IOS ran as one convolution");
    assert!(
        merged_batch_2 > 0,
        "no merged stage ran as one convolution at batch 2"
    );
    assert!(strided > 0, "no convolution wrote a strided slice");
}

/// Random graphs with channels-last activations, buffers shared under the schedule's order
/// (the race detector watches them), concatenation slices written in place a run of channels
/// per pixel (by convolutions, and by the adds of summed terms), separable convolutions of
/// sums and IOS's merged stages channels last: every graph output equals the NCHW run's of
/// the same schedule, bit for bit.
#[test]
fn random_graphs_in_channels_last_equal_the_nchw_run() {
    use opsched_gpu::program::Layout;
    let (mut crossings, mut pixel_slices, mut separable, mut summed_cells) = (0, 0, 0, 0);
    let mut merged = 0;
    for seed in 0..6 {
        let g = random_graph(seed, 24, 1 + seed as usize % 2);
        let algos = [
            ("opara", 4),
            ("lios", 2),
            ("sequential", 1),
            ("ios-merge", 1),
        ];
        for (algo, streams) in algos {
            let s = schedule(&g, algo, streams);
            let (want, _) = run(&g, &s, false);
            let dev = CpuDevice::new();
            let opts = RunOptions {
                layout: Some(Layout::Nhwc),
                ..RunOptions::default()
            };
            let plan = lower(&g, &s).unwrap();
            let session = Session::new(&dev, &g, &plan, &opts).unwrap();
            session.time(0, 2, true).unwrap();
            let p = session.program();
            check_layout(p).unwrap();
            crossings += p.layout_conversions;
            merged += p.merged.len();
            pixel_slices += p.buffers.iter().filter(|b| b.runs.is_some()).count();
            let nhwc = |(i, n): (usize, &opsched::graph::Node), op: fn(&Op) -> bool| {
                op(&n.op) && p.channels_last[i]
            };
            for n in g.nodes().iter().enumerate() {
                separable += usize::from(nhwc(n, |o| matches!(o, Op::Sequential { .. })));
                let sums = n.1.inputs.iter().any(|t| t.len() > 1) && n.1.inputs.len() > 1;
                summed_cells += usize::from(sums && nhwc(n, |o| matches!(o, Op::Identity)));
            }
            let got = session.outputs().unwrap();
            for o in g.outputs() {
                let n = o.value.node.index();
                assert_eq!(got[n], want[n], "{algo} seed {seed}: output '{}'", o.name);
            }
        }
    }
    assert!(crossings > 0, "no value crossed between the layouts");
    assert!(
        pixel_slices > 0,
        "no convolution wrote its slice of a concatenation in place"
    );
    assert!(separable > 0, "no separable convolution ran channels last");
    assert!(
        merged > 0,
        "no merged stage ran as one convolution channels last"
    );
    assert!(
        summed_cells > 0,
        "no concatenation of sums ran channels last"
    );
}
