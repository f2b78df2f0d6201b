//! Acceptance: ONNX exports of torchvision's Inception-v3, GoogLeNet, SqueezeNet 1.0 and
//! ResNet-50 (fixtures/onnx/torchvision, written by xtask/onnx/export_torchvision.py: batch 1,
//! opset 17, weights stripped) import with the operator and edge counts of the zoo models, and
//! every registered scheduler's simulated makespan on them is within 5% of its makespan on the
//! zoo model (analytical H100 model, 8 streams, 1 GPU).
//!
//! Differences, all explained:
//! - Inception-v3: the zoo is IOS's variant, which ends at the global pool; torchvision adds
//!   `flatten` and the classifier `fc`: +2 operators, +2 edges.
//! - SqueezeNet: the zoo is IOS's SqueezeNet 1.0 with bypasses (a sum after every fire module,
//!   through a 1x1 projection conv where channels change), a padded stem and floor-mode pools;
//!   torchvision's has no bypass, an unpadded stem, ceil-mode pools and a `flatten` at the end.
//!   Its import is compared with the same network built here with the graph builder (39
//!   operators, 46 edges) instead; against the zoo it has 50 - 8 sums - 4 projections + 1
//!   flatten = 39 operators. IOS's variant itself, written in PyTorch and exported
//!   (`squeezenet_ios.onnx`), matches the zoo.
//! - GoogLeNet and ResNet-50: identical counts.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use opsched::cost::{AnalyticalModel, DevicePreset, LinkPreset};
use opsched::graph::{Activation, Conv2d, DType, GraphBuilder, NodeId, Op, Pool2d};
use opsched::schedule::Platform;
use opsched::zoo::ZooConfig;
use opsched::Graph;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/onnx/torchvision")
        .join(name)
}

fn import(name: &str) -> Graph {
    opsched::load_model(fixture(name).to_str().unwrap(), &ZooConfig::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn zoo(name: &str) -> Graph {
    opsched::zoo::build(name, &ZooConfig::default()).unwrap()
}

fn platform() -> Platform {
    Platform {
        gpus: 1,
        streams: 8,
        device: DevicePreset::by_name("h100").unwrap(),
        link: LinkPreset::by_name("nvlink4").unwrap(),
    }
}

/// `(scheduler, makespan ms)` for every registered scheduler.
fn makespans(g: &Graph) -> Vec<(String, f64)> {
    let p = platform();
    let cost = AnalyticalModel::new(p.device.clone(), p.link.clone());
    opsched::scheduler_names()
        .into_iter()
        .map(|name| {
            let s = opsched::scheduler(name).unwrap();
            let (schedule, _) = s
                .schedule(g, &p, &cost)
                .unwrap_or_else(|e| panic!("{name} on {}: {e}", g.name));
            opsched::schedule::validate(g, &schedule, &p).unwrap();
            let m = opsched::evaluate(g, &schedule, &cost, 1)
                .unwrap()
                .makespan_ms;
            (name.to_string(), m)
        })
        .collect()
}

/// Every scheduler's makespan on `onnx` within 5% of its makespan on `reference`.
fn assert_makespans_close(onnx: &Graph, reference: &Graph) {
    let (a, b) = (makespans(onnx), makespans(reference));
    let mut report = String::new();
    let mut worst: f64 = 0.0;
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        let rel = (x - y).abs() / y;
        worst = worst.max(rel);
        report.push_str(&format!(
            "{name:14} onnx {x:.4} ms  reference {y:.4} ms  {:+.2}%\n",
            100.0 * (x - y) / y
        ));
    }
    eprintln!("{} vs {}:\n{report}", onnx.name, reference.name);
    assert!(
        worst <= 0.05,
        "{} differs by more than 5%:\n{report}",
        onnx.name
    );
}

fn op_types(g: &Graph) -> std::collections::BTreeMap<&'static str, usize> {
    let mut m = std::collections::BTreeMap::new();
    for o in g.ops() {
        *m.entry(g.node(o).op.type_name()).or_insert(0) += 1;
    }
    m
}

#[test]
fn resnet50_matches_the_zoo() {
    let (g, z) = (import("resnet50.onnx"), zoo("resnet50"));
    assert_eq!((g.op_count(), g.edge_count()), (89, 104));
    assert_eq!((z.op_count(), z.edge_count()), (89, 104));
    assert_eq!(op_types(&g), op_types(&z));
    let (sg, sz) = (opsched::graph::summarize(&g), opsched::graph::summarize(&z));
    assert_eq!((sg.flops, sg.params), (sz.flops, sz.params));
    assert_eq!(g.blocks().len(), 16, "one block per bottleneck");
    assert_makespans_close(&g, &z);
}

#[test]
fn googlenet_matches_the_zoo() {
    let (g, z) = (import("googlenet.onnx"), zoo("googlenet"));
    assert_eq!((g.op_count(), g.edge_count()), (82, 108));
    assert_eq!((z.op_count(), z.edge_count()), (82, 108));
    assert_eq!(op_types(&g), op_types(&z));
    let (sg, sz) = (opsched::graph::summarize(&g), opsched::graph::summarize(&z));
    assert_eq!((sg.flops, sg.params), (sz.flops, sz.params));
    assert_makespans_close(&g, &z);
}

#[test]
fn inception_v3_matches_the_zoo_plus_the_classifier() {
    let (g, z) = (import("inception_v3.onnx"), zoo("inception_v3"));
    assert_eq!((z.op_count(), z.edge_count()), (119, 153));
    // torchvision's flatten and fc after the global pool.
    assert_eq!((g.op_count(), g.edge_count()), (119 + 2, 153 + 2));
    let mut types = op_types(&z);
    types.insert("linear", 1);
    types.insert("reshape", 1);
    assert_eq!(op_types(&g), types);
    // Every module ends in one concat (torchvision's nested concats in Inception-E are one).
    assert_eq!(g.blocks().len(), 11);
    assert_makespans_close(&g, &z);
}

/// torchvision's SqueezeNet 1.0, built with the graph builder: no bypasses, an unpadded stem,
/// ceil-mode pools, a classifier conv with relu, a global pool and a flatten.
fn torchvision_squeezenet() -> Graph {
    let mut b = GraphBuilder::new("squeezenet1_0_torchvision", DType::F32);
    let conv = |b: &mut GraphBuilder, n: &str, x: NodeId, out: usize, k: usize| {
        b.conv(n, x, Conv2d::new(out, k).bias(true).relu())
    };
    let fire = |b: &mut GraphBuilder, n: &str, x: NodeId, s: usize, e: usize| {
        b.block(n);
        let sq = conv(b, &format!("{n}.squeeze"), x, s, 1);
        let e1 = conv(b, &format!("{n}.expand1x1"), sq, e, 1);
        let e3 = conv(b, &format!("{n}.expand3x3"), sq, e, 3);
        b.concat(&format!("{n}.concat"), &[e1, e3])
    };
    let x = b.input("input", vec![1, 3, 224, 224]);
    let x = b.conv(
        "features.0",
        x,
        Conv2d::new(96, 7).stride(2).padding(0, 0).bias(true).relu(),
    );
    let mut x = b.pool("features.2", x, Pool2d::max(3, 2, 0).ceil());
    for (i, (s, e)) in [(16, 64), (16, 64), (32, 128)].into_iter().enumerate() {
        x = fire(&mut b, &format!("fire{}", i + 2), x, s, e);
    }
    b.end_block();
    x = b.pool("features.6", x, Pool2d::max(3, 2, 0).ceil());
    for (i, (s, e)) in [(32, 128), (48, 192), (48, 192), (64, 256)]
        .into_iter()
        .enumerate()
    {
        x = fire(&mut b, &format!("fire{}", i + 5), x, s, e);
    }
    b.end_block();
    x = b.pool("features.11", x, Pool2d::max(3, 2, 0).ceil());
    x = fire(&mut b, "fire9", x, 64, 256);
    b.end_block();
    let x = b.conv(
        "classifier.1",
        x,
        Conv2d::new(1000, 1).bias(true).act(Activation::Relu),
    );
    let x = b.pool("classifier.3", x, Pool2d::global_avg());
    b.op("flatten", Op::Reshape { shape: vec![0, -1] }, &[x]);
    b.finish().unwrap()
}

#[test]
fn squeezenet_matches_torchvisions_network_and_differs_from_ios_variant_as_explained() {
    let (g, r, z) = (
        import("squeezenet1_0.onnx"),
        torchvision_squeezenet(),
        zoo("squeezenet"),
    );
    assert_eq!((g.op_count(), g.edge_count()), (39, 46));
    assert_eq!((r.op_count(), r.edge_count()), (39, 46));
    assert_eq!(op_types(&g), op_types(&r));
    let (sg, sr) = (opsched::graph::summarize(&g), opsched::graph::summarize(&r));
    assert_eq!((sg.flops, sg.params), (sr.flops, sr.params));
    // IOS's variant: 8 sums (identity with a summed term) and 4 projection convs more, no flatten.
    assert_eq!(z.op_count(), 50);
    assert_eq!(g.op_count(), z.op_count() - 8 - 4 + 1);
    assert_makespans_close(&g, &r);
}

/// IOS's SqueezeNet variant written in PyTorch (export_torchvision.py): the zoo's network.
#[test]
fn squeezenet_ios_variant_matches_the_zoo() {
    let (g, z) = (import("squeezenet_ios.onnx"), zoo("squeezenet"));
    assert_eq!((g.op_count(), g.edge_count()), (50, 65));
    assert_eq!((z.op_count(), z.edge_count()), (50, 65));
    // The zoo writes each bypass sum as IOS does (an identity summing two values), the export
    // as an Add: the same arithmetic and bytes.
    let mut types = op_types(&z);
    assert_eq!(types.remove("identity"), Some(8));
    types.insert("elementwise", 8);
    assert_eq!(op_types(&g), types);
    let (sg, sz) = (opsched::graph::summarize(&g), opsched::graph::summarize(&z));
    assert_eq!((sg.flops, sg.params), (sz.flops, sz.params));
    assert_makespans_close(&g, &z);
}
