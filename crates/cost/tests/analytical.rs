//! The analytical GPU model: presets, operator times, shares, the contention law, merges,
//! transfers and the capacity bound.
#![allow(clippy::unwrap_used)]

use opsched_cost::device::{A40, H100, NVLINK4, PCIE3, V100};
use opsched_cost::{AnalyticalModel, CostError, CostModel, DevicePreset, LinkPreset};
use opsched_graph::formats::dag;
use opsched_graph::zoo::{self, ZooConfig};
use opsched_graph::{Conv2d, DType, Graph, GraphBuilder, NodeId};

fn model(device: DevicePreset) -> AnalyticalModel {
    AnalyticalModel::new(device, NVLINK4)
}

fn zoo_model(name: &str, batch: usize, dtype: DType) -> Graph {
    let cfg = ZooConfig {
        batch,
        input_size: None,
        dtype,
    };
    zoo::build(name, &cfg).unwrap()
}

fn sum_times(m: &AnalyticalModel, g: &Graph) -> f64 {
    g.ops().map(|o| m.op_time(g, o)).sum()
}

fn id(g: &Graph, name: &str) -> NodeId {
    g.find(name).unwrap_or_else(|| panic!("no node '{name}'"))
}

/// HIOS Fig. 1: one input [1, 48, h, h], two identical 5x5 stride-1 convs 48 -> 48.
fn fig1_graph(h: usize) -> (Graph, NodeId, NodeId) {
    let mut b = GraphBuilder::new("fig1", DType::F32);
    let x = b.input("x", vec![1, 48, h, h]);
    let a = b.conv("a", x, Conv2d::new(48, 5).padding(2, 2));
    let c = b.conv("b", x, Conv2d::new(48, 5).padding(2, 2));
    (b.finish().unwrap(), a, c)
}

/// HIOS's Fig. 1 on the A40: running the two convs concurrently beats running them one after
/// the other up to 64x64, and loses from 128x128 on.
///
/// Concurrent / sequential ratios the model gives (A40, f32):
/// - 16x16: 0.500 (2 blocks each of 84 SMs, both fit side by side)
/// - 32x32: 0.500 (8 blocks each)
/// - 64x64: 0.500 (32 blocks each, SM shares 0.38 + 0.38 <= 1)
/// - 128x128: 1.100 (128 blocks each: both want the whole GPU; fair sharing plus 10%
///   interference)
/// - 256x256: 1.100 (512 blocks each)
/// - 512x512: 1.100 (2048 blocks each)
#[test]
fn fig1_small_convs_gain_from_concurrency_large_ones_lose() {
    let m = model(A40);
    for (h, faster) in [
        (16, true),
        (32, true),
        (64, true),
        (128, false),
        (256, false),
        (512, false),
    ] {
        let (g, a, b) = fig1_graph(h);
        let sequential = m.op_time(&g, a) + m.op_time(&g, b);
        let concurrent = m.stage_time(&g, &[vec![a], vec![b]]);
        let ratio = concurrent / sequential;
        eprintln!("fig1 {h}x{h}: concurrent / sequential = {ratio:.3}");
        if faster {
            assert!(concurrent < sequential, "{h}: ratio {ratio}");
        } else {
            assert!(concurrent > sequential, "{h}: ratio {ratio}");
        }
        // The stage is never faster than its longest group alone.
        assert!(concurrent >= m.op_time(&g, a) * (1.0 - 1e-12));
    }
}

#[test]
fn every_op_time_is_positive_and_finite_on_every_zoo_model_and_device() {
    for d in DevicePreset::all() {
        let m = model(d.clone());
        for spec in zoo::models() {
            let g = spec.build(&ZooConfig::default()).unwrap();
            for o in g.ops() {
                let t = m.op_time(&g, o);
                let what = format!("{} {} {}", d.name, spec.name, g.node(o).name);
                assert!(t.is_finite() && t > 0.0, "{what}: time {t}");
                let dem = m.demand(&g, o);
                assert!(dem.sm_share > 0.0 && dem.sm_share <= 1.0, "{what}: {dem:?}");
                assert!(
                    dem.bw_share >= 0.0 && dem.bw_share <= 1.0,
                    "{what}: {dem:?}"
                );
            }
            for i in g.inputs() {
                assert_eq!(m.op_time(&g, i), 0.0);
            }
        }
    }
}

#[test]
fn f16_is_faster_than_f32_for_a_big_conv() {
    let build = |dtype| {
        let mut b = GraphBuilder::new("big", dtype);
        let x = b.input("x", vec![8, 256, 56, 56]);
        let c = b.conv("c", x, Conv2d::new(256, 3));
        (b.finish().unwrap(), c)
    };
    let (g32, c32) = build(DType::F32);
    let (g16, c16) = build(DType::F16);
    for d in DevicePreset::all() {
        let m = model(d.clone());
        let (t32, t16) = (m.op_time(&g32, c32), m.op_time(&g16, c16));
        if d.fp16_tflops > d.fp32_tflops {
            assert!(t16 < t32, "{}: f16 {t16} vs f32 {t32}", d.name);
        } else {
            // No fast FP16 (K80): the same arithmetic, fewer bytes.
            assert!(t16 <= t32, "{}: f16 {t16} vs f32 {t32}", d.name);
        }
    }
}

#[test]
fn batch_16_costs_more_than_batch_1_but_less_than_16_times() {
    for d in [V100, A40, H100] {
        let m = model(d.clone());
        for name in ["squeezenet", "googlenet", "resnet50", "inception_v3"] {
            let t1 = sum_times(&m, &zoo_model(name, 1, DType::F32));
            let t16 = sum_times(&m, &zoo_model(name, 16, DType::F32));
            assert!(
                t16 > t1 && t16 < 16.0 * t1,
                "{} {name}: {t1} vs {t16}",
                d.name
            );
        }
    }
}

#[test]
fn rates_lie_in_0_1_and_are_1_for_ops_that_fit() {
    let m = model(V100);
    let g = zoo_model("inception_v3", 1, DType::F32);
    // The three 1x1 convs of block a1 fill 10 of 80 SMs each and draw little bandwidth.
    let small: Vec<NodeId> = ["a1.branch1x1", "a1.branch5x5_1", "a1.branch3x3dbl_1"]
        .iter()
        .map(|n| id(&g, n))
        .collect();
    let s: f64 = small.iter().map(|&o| m.demand(&g, o).sm_share).sum();
    let b: f64 = small.iter().map(|&o| m.demand(&g, o).bw_share).sum();
    assert!(s <= 1.0 && b <= 1.0, "{s} {b}");
    let mut rates = Vec::new();
    m.rates(&g, &small, &mut rates);
    assert_eq!(rates, vec![1.0; 3]);
    // A stage of ops that fit lasts as long as its longest op.
    let groups: Vec<Vec<NodeId>> = small.iter().map(|&o| vec![o]).collect();
    let longest = small.iter().map(|&o| m.op_time(&g, o)).fold(0.0, f64::max);
    assert!((m.stage_time(&g, &groups) - longest).abs() < 1e-12);

    // Every op of the graph at once: oversubscribed, every rate in (0, 1).
    let all: Vec<NodeId> = g.ops().collect();
    m.rates(&g, &all, &mut rates);
    assert_eq!(rates.len(), all.len());
    assert!(rates.iter().all(|&r| r > 0.0 && r < 1.0), "{rates:?}");
    // Two big stem convs that each fill the GPU slow each other down.
    let stem = [id(&g, "stem.conv2b"), id(&g, "stem.conv4a")];
    m.rates(&g, &stem, &mut rates);
    assert!(rates.iter().all(|&r| r > 0.0 && r < 0.5), "{rates:?}");
    m.rates(&g, &[], &mut rates);
    assert!(rates.is_empty());
}

#[test]
fn capacity_bound_is_below_the_sum_and_below_any_stage() {
    for d in [V100, A40, H100] {
        let m = model(d.clone());
        for name in ["inception_v3", "squeezenet", "transformer"] {
            let g = zoo_model(name, 1, DType::F32);
            let ops: Vec<NodeId> = g.ops().collect();
            let sum = sum_times(&m, &g);
            let one = m.capacity_bound(&g, &ops, 1);
            assert!(one > 0.0 && one <= sum, "{name}: {one} vs {sum}");
            assert!((m.capacity_bound(&g, &ops, 4) - one / 4.0).abs() < 1e-12);
            // Each block's ops all started at once (ignoring dependencies) cannot beat it.
            for b in g.blocks() {
                let groups: Vec<Vec<NodeId>> = b.nodes.iter().map(|&o| vec![o]).collect();
                let bound = m.capacity_bound(&g, &b.nodes, 1);
                let stage = m.stage_time(&g, &groups);
                assert!(
                    bound <= stage * (1.0 + 1e-9),
                    "{name} {}: {bound} > {stage}",
                    b.name
                );
            }
        }
    }
}

#[test]
fn transfers_grow_with_bytes_and_nvlink_beats_pcie() {
    let g = zoo_model("inception_v3", 1, DType::F32);
    let nv = AnalyticalModel::new(H100, NVLINK4);
    let pcie = AnalyticalModel::new(H100, PCIE3);
    let mut edges: Vec<(NodeId, NodeId, u64)> = g
        .edges()
        .filter(|(s, _, _)| !g.node(*s).op.is_input())
        .map(|(s, d, e)| (s, d, e.bytes))
        .collect();
    edges.sort_by_key(|e| e.2);
    let (small, big) = (edges[0], edges[edges.len() - 1]);
    assert!(small.2 < big.2);
    for m in [&nv, &pcie] {
        assert!(m.transfer_time(&g, small.0, small.1) < m.transfer_time(&g, big.0, big.1));
    }
    for (s, d, _) in &edges {
        let (a, b) = (nv.transfer_time(&g, *s, *d), pcie.transfer_time(&g, *s, *d));
        assert!(a > 0.0 && a < b, "{a} vs {b}");
    }
    // Latency plus bytes over bandwidth (PCIe 3: 10 us, 12 GB/s).
    let (s, d, bytes) = big;
    let expect = 0.010 + bytes as f64 / 12e9 * 1e3;
    assert!((pcie.transfer_time(&g, s, d) - expect).abs() < 1e-12);
    // No edge, nothing to move.
    assert_eq!(pcie.transfer_time(&g, d, s), 0.0);
}

#[test]
fn annotated_dags_use_their_times_utils_and_transfers() {
    let g = dag::from_str(
        r#"{"format": "opsched-dag", "name": "t",
            "ops": [{"id": 1, "time_ms": 2.0, "util": 0.4}, {"id": 2, "time_ms": 1.0, "util": 0.5},
                    {"id": 3, "time_ms": 3.0, "util": 0.9}],
            "edges": [{"src": 1, "dst": 2, "transfer_ms": 0.25}, {"src": 1, "dst": 3}]}"#,
    )
    .unwrap();
    let m = AnalyticalModel::default();
    let (a, b, c) = (id(&g, "1"), id(&g, "2"), id(&g, "3"));
    assert_eq!(m.op_time(&g, a), 2.0);
    assert_eq!(m.demand(&g, a).sm_share, 0.4);
    assert_eq!(m.transfer_time(&g, a, b), 0.25);
    // 0.5 + 0.9 > 1: oversubscribed.
    let mut rates = Vec::new();
    m.rates(&g, &[b, c], &mut rates);
    assert!(rates[0] < 1.0 && rates[0] > 0.0);
    m.rates(&g, &[a, b], &mut rates);
    assert_eq!(rates, vec![1.0, 1.0]);
    assert_eq!(
        m.capacity_bound(&g, &[a, b, c], 1),
        2.0 * 0.4 + 0.5 + 3.0 * 0.9
    );
    assert!(m.merged_time(&g, &[b, c]).is_none());
}

#[test]
fn merged_convs_cost_between_the_largest_and_the_sum() {
    let g = zoo_model("inception_v3", 1, DType::F32);
    for d in DevicePreset::all() {
        let m = model(d.clone());
        let pair = [id(&g, "a1.branch1x1"), id(&g, "a1.branch5x5_1")];
        let triple = [pair[0], pair[1], id(&g, "a1.branch3x3dbl_1")];
        for ops in [&pair[..], &triple[..]] {
            let times: Vec<f64> = ops.iter().map(|&o| m.op_time(&g, o)).collect();
            let merged = m.merged_time(&g, ops).unwrap();
            let (max, sum) = (
                times.iter().cloned().fold(0.0, f64::max),
                times.iter().sum(),
            );
            assert!(
                merged >= max && merged <= sum,
                "{}: {merged} {times:?}",
                d.name
            );
        }
        // Different inputs do not merge; nor does a single op.
        assert!(m
            .merged_time(&g, &[pair[0], id(&g, "a1.branch5x5_2")])
            .is_none());
        assert!(m.merged_time(&g, &pair[..1]).is_none());
    }
}

/// A merge stage costs what the runtime runs: one merged convolution, or at a batch above 1,
/// where a softmax reads a member (which it cannot read in place as a run per image), the
/// convolutions one after another.
#[test]
fn merge_stages_cost_what_the_runtime_runs() {
    for (batch, blocked) in [(1, true), (2, false), (2, true)] {
        let mut b = GraphBuilder::new("pair", DType::F32);
        let x = b.input("x", vec![batch, 8, 8, 8]);
        let a = b.conv("a", x, Conv2d::new(8, 1));
        let c = b.conv("c", x, Conv2d::new(8, 3).padding(1, 1));
        b.concat("cat", &[a, c]);
        if blocked {
            b.op("p", opsched_graph::Op::Softmax { axis: 1 }, &[c]);
        }
        let g = b.finish().unwrap();
        let m = model(H100);
        let ops = [a, c];
        let stage = m.merged_stage_time(&g, &ops).unwrap();
        // (Merging saves time here, so the two answers differ.)
        let sum = m.op_time(&g, a) + m.op_time(&g, c);
        assert!(m.merged_time(&g, &ops).unwrap() < sum);
        let one = opsched_graph::merge::runs_as_one(&g, &ops);
        assert_eq!(
            one,
            batch == 1 || !blocked,
            "batch {batch}, blocked {blocked}"
        );
        let want = match one {
            true => m.merged_time(&g, &ops).unwrap(),
            false => sum,
        };
        assert_eq!(stage, want, "batch {batch}, blocked {blocked}");
        assert!(m.merged_stage_time(&g, &[a]).is_none());
    }
}

#[test]
fn presets_by_name_and_unknown_names_list_the_known_ones() {
    for name in [
        "k80",
        "v100",
        "a100",
        "a40",
        "rtx2080ti",
        "rtx3080",
        "h100",
        "h200",
    ] {
        let d = DevicePreset::by_name(name).unwrap();
        assert_eq!(d.name, name);
        assert!(d.sms > 0 && d.fp32_tflops > 0.0 && d.mem_bw_gbs > 0.0 && d.launch_us > 0.0);
        assert!(d.max_threads_per_sm > 0 && d.registers_per_sm > 0 && d.max_blocks_per_sm > 0);
    }
    assert_eq!(DevicePreset::by_name("h100").unwrap(), H100);
    assert_eq!(DevicePreset::by_name("a100").unwrap().sms, 108);
    for name in ["pcie3", "pcie4", "pcie5", "nvlink3", "nvlink4"] {
        let l = LinkPreset::by_name(name).unwrap();
        assert!(l.bandwidth_gbs > 0.0 && l.latency_us > 0.0);
    }
    let nv = LinkPreset::by_name("nvlink3").unwrap().bandwidth_gbs;
    assert!(nv > LinkPreset::by_name("pcie5").unwrap().bandwidth_gbs);
    match DevicePreset::by_name("tpu") {
        Err(e @ CostError::UnknownDevice(_)) => {
            let msg = e.to_string();
            assert!(
                msg.contains("tpu") && msg.contains("k80") && msg.contains("h200"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    match LinkPreset::by_name("ethernet") {
        Err(e @ CostError::UnknownLink(_)) => {
            let msg = e.to_string();
            assert!(msg.contains("pcie3") && msg.contains("nvlink4"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    // Names are exact: a near miss is refused and the error suggests the preset meant.
    for (near, meant) in [("H100", "h100"), ("V100", "v100"), ("rtx-3080", "rtx3080")] {
        match DevicePreset::by_name(near) {
            Err(CostError::UnknownDevice(e)) => {
                assert_eq!(e.suggestions.first(), Some(&meant), "{e}")
            }
            other => panic!("{near}: {other:?}"),
        }
    }
    for (near, meant) in [("NVLink4", "nvlink4"), ("pcie_4", "pcie4")] {
        match LinkPreset::by_name(near) {
            Err(CostError::UnknownLink(e)) => {
                assert_eq!(e.suggestions.first(), Some(&meant), "{e}")
            }
            other => panic!("{near}: {other:?}"),
        }
    }
}

#[test]
fn default_model_is_h100_over_nvlink4() {
    let m = AnalyticalModel::default();
    assert_eq!(*m.device(), H100);
    assert_eq!(*m.link(), NVLINK4);
    assert_eq!(m.name(), "analytical(h100)");
}

/// Inception-v3 at batch 1 on a V100, operators one after another: IOS measured 6.51 ms.
/// The model gives about 8.1 ms (same order; batch-1 convolutions fill few SMs).
#[test]
fn inception_v3_on_v100_is_a_few_milliseconds() {
    let m = model(V100);
    let g = zoo_model("inception_v3", 1, DType::F32);
    let sum = sum_times(&m, &g);
    eprintln!("inception_v3 v100 batch 1 sequential sum: {sum:.3} ms (IOS: 6.51 ms)");
    assert!((2.0..20.0).contains(&sum), "{sum}");
}

#[test]
fn demand_reports_gemm_and_elementwise_kernels() {
    let m = model(V100);
    let g = zoo_model("inception_v3", 1, DType::F32);
    let conv = m.demand(&g, id(&g, "stem.conv4a"));
    assert_eq!(conv.threads_per_block, 256);
    assert_eq!(conv.registers_per_thread, 128);
    assert!(conv.shared_mem_per_block > 0 && conv.blocks > 0);
    assert!(!conv.memory_bound);
    let pool = m.demand(&g, id(&g, "stem.pool1"));
    assert!(pool.memory_bound);
    assert_eq!(pool.shared_mem_per_block, 0);
    assert_eq!(pool.registers_per_thread, 32);
}

#[test]
fn a_concat_is_charged_for_the_terms_it_copies() {
    // At batch 16 a convolution that only the concat reads writes its slice in place; one that
    // another kernel reads too is copied where that kernel cannot read the strided slice in
    // place (a convolution padded unevenly pads it into a buffer of its own). The concat of
    // a copied and an in-place term moves half the bytes of the one that copies both, and a
    // concat of in-place terms only runs nothing.
    let m = model(H100);
    let concat_time = |shared: bool, input_term: bool| {
        let mut b = GraphBuilder::new("cat", DType::F32);
        let x = b.input("x", vec![16, 64, 56, 56]);
        let a = b.conv("a", x, Conv2d::new(64, 1));
        let c = b.conv("c", x, Conv2d::new(64, 1));
        if shared {
            let mut uneven = Conv2d::new(8, 2);
            uneven.padding_end = Some([0, 0]);
            b.conv("also", a, uneven);
        }
        let second = if input_term { x } else { c };
        let cat = b.concat("cat", &[a, second]);
        b.conv("out", cat, Conv2d::new(8, 1));
        let g = b.finish().unwrap();
        m.op_time(&g, cat)
    };
    let half = concat_time(false, true);
    let whole = concat_time(true, true);
    let none = concat_time(false, false);
    assert!(half < whole * 0.6, "{half} vs {whole}");
    assert!(none < half * 0.1, "{none} vs {half}");
}

/// The model keeps each operator's cost per graph: one model asked about graphs in turn
/// answers as a fresh model does, and a graph whose outputs change is another graph (a
/// convolution that becomes an output keeps its bias instead of leaving it to its reader, so
/// it launches one kernel more, which the calibrated model charges).
#[test]
fn costs_kept_per_graph_follow_the_graph_asked_about() {
    let times =
        |m: &AnalyticalModel, g: &Graph| -> Vec<f64> { g.ops().map(|o| m.op_time(g, o)).collect() };
    let calibrated = || {
        let file = opsched_cost::DeviceFile::embedded("h100").unwrap();
        AnalyticalModel::calibrated(H100, NVLINK4, file)
    };
    let m = calibrated();
    let (resnet, nasnet) = (
        zoo_model("resnet50", 1, DType::F32),
        zoo_model("nasnet", 1, DType::F32),
    );
    for g in [&resnet, &nasnet, &resnet] {
        assert_eq!(times(&m, g), times(&calibrated(), g), "{}", g.name);
    }
    let deferred = resnet
        .ops()
        .find(|&o| opsched_graph::fusion::deferred_bias(&resnet, o).is_some())
        .expect("ResNet-50's downsampling convolutions leave their biases to the add");
    let mut outputs = resnet.outputs().to_vec();
    outputs.push(opsched_graph::GraphOutput {
        name: "kept".into(),
        value: opsched_graph::Value::whole(deferred),
    });
    let kept = resnet.clone().with_outputs(outputs).unwrap();
    assert_ne!(kept.id(), resnet.id());
    assert!(opsched_graph::fusion::deferred_bias(&kept, deferred).is_none());
    let (before, after) = (m.op_time(&resnet, deferred), m.op_time(&kept, deferred));
    assert!(after > before, "{after} <= {before}");
    assert_eq!(times(&m, &kept), times(&calibrated(), &kept));
    // A clone is the same graph: the same costs.
    assert_eq!(resnet.clone().id(), resnet.id());
    assert_eq!(times(&m, &resnet.clone()), times(&calibrated(), &resnet));
}

/// Threads asking one model about two graphs at once (each question may replace the kept
/// costs another thread is reading) get the answers of a fresh model every time.
#[test]
fn costs_kept_per_graph_hold_under_threads() {
    let m = model(H100);
    let graphs = [
        zoo_model("googlenet", 1, DType::F32),
        zoo_model("squeezenet", 2, DType::F32),
    ];
    let want: Vec<Vec<f64>> = graphs
        .iter()
        .map(|g| {
            let fresh = model(H100);
            g.ops().map(|o| fresh.op_time(g, o)).collect()
        })
        .collect();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (m, graphs, want) = (&m, &graphs, &want);
            s.spawn(move || {
                for round in 0..20 {
                    let i = (t + round) % 2;
                    let g = &graphs[i];
                    let got: Vec<f64> = g.ops().map(|o| m.op_time(g, o)).collect();
                    assert_eq!(got, want[i], "thread {t}, round {round}, {}", g.name);
                }
            });
        }
    });
}
