//! IOS's merge rule.
#![allow(clippy::unwrap_used)]

use opsched_graph::formats::ios;
use opsched_graph::merge::{mergeable, merged_conv};
use opsched_graph::zoo::{self, ZooConfig};
use opsched_graph::{Activation, Conv2d, DType, Graph, GraphBuilder, NodeId, Op, Value};

const V100: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/ios/v100.json");

fn id(g: &Graph, name: &str) -> NodeId {
    g.find(name).unwrap_or_else(|| panic!("no node '{name}'"))
}

#[test]
fn inception_a1_three_1x1_convs_merge_like_ios_node_8() {
    let g = zoo::build("inception_v3", &ZooConfig::default()).unwrap();
    let ops = [
        id(&g, "a1.branch1x1"),
        id(&g, "a1.branch5x5_1"),
        id(&g, "a1.branch3x3dbl_1"),
    ];
    assert!(mergeable(&g, &ops));
    let (conv, input) = merged_conv(&g, &ops).unwrap();
    assert_eq!(conv.out_channels, 64 + 48 + 64);
    assert_eq!(conv.kernel, [1, 1]);
    assert_eq!(conv.padding, [0, 0]);
    assert_eq!(conv.stride, [1, 1]);
    assert_eq!(conv.act, Activation::Relu);
    assert!(conv.bias);
    assert_eq!(input, vec![1, 192, 35, 35]);

    // IOS's V100 schedule merged the same three convs into node "8" (hint "8 9 11").
    let path = std::path::Path::new(V100);
    if !path.exists() {
        eprintln!("skipping the fixture comparison: {V100} is missing");
        return;
    }
    let ios_g = ios::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let Op::Conv2d(ios_conv) = &ios_g.node(id(&ios_g, "8")).op else {
        panic!("IOS node 8 is not a conv");
    };
    assert_eq!(ios_conv.out_channels, conv.out_channels);
    assert_eq!(ios_conv.kernel, conv.kernel);
    assert_eq!(ios_conv.padding, conv.padding);
    assert_eq!(ios_g.input_shapes(id(&ios_g, "8")), vec![input]);
}

fn pair(a: Conv2d, b: Conv2d) -> (Graph, NodeId, NodeId) {
    pair_on(20, a, b)
}

fn pair_on(side: usize, a: Conv2d, b: Conv2d) -> (Graph, NodeId, NodeId) {
    let mut gb = GraphBuilder::new("pair", DType::F32);
    let x = gb.input("x", vec![1, 32, side, side]);
    let p = gb.conv("p", x, a);
    let q = gb.conv("q", x, b);
    (gb.finish().unwrap(), p, q)
}

#[test]
fn a_1x1_and_a_3x3_on_the_same_input_merge_into_a_3x3() {
    let (g, p, q) = pair(Conv2d::new(16, 1).relu(), Conv2d::new(24, 3).relu());
    let (conv, input) = merged_conv(&g, &[p, q]).unwrap();
    assert_eq!(conv.kernel, [3, 3]);
    assert_eq!(conv.padding, [1, 1]);
    assert_eq!(conv.out_channels, 40);
    assert_eq!(input, vec![1, 32, 20, 20]);
    // Order does not matter.
    assert_eq!(merged_conv(&g, &[q, p]).unwrap().0, conv);

    // 1x7 and 7x1 merge into a 7x7.
    let (g, p, q) = pair(Conv2d::rect(8, 1, 7), Conv2d::rect(8, 7, 1));
    let (conv, _) = merged_conv(&g, &[p, q]).unwrap();
    assert_eq!(conv.kernel, [7, 7]);
    assert_eq!(conv.padding, [3, 3]);
}

#[test]
fn mismatches_do_not_merge() {
    let base = || Conv2d::new(16, 3);
    // Strides differ.
    let (g, p, q) = pair(base(), base().stride(2));
    assert!(!mergeable(&g, &[p, q]));
    // Groups.
    let (g, p, q) = pair(base().groups(2), base().groups(2));
    assert!(!mergeable(&g, &[p, q]));
    // Activation, bias, dilation.
    let (g, p, q) = pair(base(), base().relu());
    assert!(!mergeable(&g, &[p, q]));
    let (g, p, q) = pair(base(), base().bias(true));
    assert!(!mergeable(&g, &[p, q]));
    let (g, p, q) = pair(base(), base().dilation(2).padding(2, 2));
    assert!(!mergeable(&g, &[p, q]));
    // Output sizes differ (no padding on the 3x3).
    let (g, p, q) = pair(Conv2d::new(16, 1), base().padding(0, 0));
    assert!(!mergeable(&g, &[p, q]));
    // Kernel sizes of different parity cannot be centred (same output size at stride 2).
    let (g, p, q) = pair(Conv2d::new(16, 2).padding(0, 0).stride(2), base().stride(2));
    assert_eq!(g.node(p).shape, g.node(q).shape);
    assert!(!mergeable(&g, &[p, q]));
    // Same output size, but the windows are not aligned: a 1x1 without padding and a 3x3
    // without padding at stride 3 on 21x21 (the 1x1 would need padding 1 once widened).
    let (g, p, q) = pair_on(
        21,
        Conv2d::new(16, 1).stride(3),
        base().padding(0, 0).stride(3),
    );
    assert_eq!(g.node(p).shape, g.node(q).shape);
    assert!(!mergeable(&g, &[p, q]));
    // Centred kernels of the same parity at stride 2 do merge.
    let (g, p, q) = pair(Conv2d::new(16, 1).stride(2), base().stride(2));
    assert_eq!(merged_conv(&g, &[p, q]).unwrap().0.padding, [1, 1]);
    // A single op, the same op twice, an empty list.
    let (g, p, _) = pair(base(), base());
    assert!(!mergeable(&g, &[p]));
    assert!(!mergeable(&g, &[p, p]));
    assert!(!mergeable(&g, &[]));
}

#[test]
fn different_inputs_and_non_convs_do_not_merge() {
    let mut gb = GraphBuilder::new("t", DType::F32);
    let x = gb.input("x", vec![1, 32, 20, 20]);
    let a = gb.conv("a", x, Conv2d::new(16, 1));
    let b = gb.conv("b", a, Conv2d::new(16, 1));
    let c = gb.conv("c", a, Conv2d::new(16, 1));
    let slice = gb.node(
        "d",
        Op::Conv2d(Conv2d::new(16, 1)),
        vec![vec![Value::slice(a, 0, 16)]],
    );
    let s = gb.sequential("s", a, vec![Op::Conv2d(Conv2d::new(16, 1))]);
    let r = gb.act("r", a, Activation::Relu);
    let g = gb.finish().unwrap();
    assert!(mergeable(&g, &[b, c]));
    assert!(!mergeable(&g, &[a, b]));
    assert!(!mergeable(&g, &[b, slice]));
    assert!(!mergeable(&g, &[b, s]));
    assert!(!mergeable(&g, &[b, r]));
    assert!(!mergeable(&g, &[b, NodeId(999)]));
}

#[test]
fn every_zoo_merge_candidate_keeps_the_output_size() {
    // Every group of convs sharing an input that the rule accepts produces their spatial size.
    for spec in zoo::models() {
        let g = spec.build(&ZooConfig::default()).unwrap();
        for p in g.topo_order() {
            let convs: Vec<NodeId> = g
                .succs(*p)
                .filter(|&s| matches!(g.node(s).op, Op::Conv2d(_)))
                .collect();
            if convs.len() < 2 {
                continue;
            }
            if let Some((conv, input)) = merged_conv(&g, &convs) {
                let out = Op::Conv2d(conv.clone()).infer_shape(&[input]).unwrap();
                assert_eq!(out[2..], g.node(convs[0]).shape[2..], "{}", spec.name);
                let total: usize = convs.iter().map(|&c| g.node(c).shape[1]).sum();
                assert_eq!(conv.out_channels, total);
            }
        }
    }
}

/// Two convolutions of one input at batch 2, concatenated, the second also read by `reader`
/// (built on the second's output).
fn merged_pair_read_by(reader: impl Fn(&mut GraphBuilder, NodeId) -> NodeId) -> Graph {
    let mut b = GraphBuilder::new("pair", DType::F32);
    let x = b.input("x", vec![2, 8, 8, 8]);
    let a = b.conv("a", x, Conv2d::new(8, 1));
    let c = b.conv("c", x, Conv2d::new(8, 3));
    b.concat("cat", &[a, c]);
    reader(&mut b, c);
    b.finish().unwrap()
}

#[test]
fn at_batch_above_1_a_member_must_be_read_in_place_by_every_reader() {
    use opsched_graph::inplace::{merged_slot, slice_of};
    use opsched_graph::merge::{read_in_place, runs_as_one};
    use opsched_graph::{Pool2d, PoolKind};
    type Reader = fn(&mut GraphBuilder, NodeId) -> NodeId;
    let cases: [(&str, Reader, bool); 10] = [
        (
            "a 3x3 convolution",
            |b, c| b.conv("r", c, Conv2d::new(4, 3)),
            true,
        ),
        ("another concatenation", |b, c| b.concat("r", &[c, c]), true),
        // Our pooling and depthwise kernels take an input's image or pixel stride.
        (
            "a pool",
            |b, c| b.pool("r", c, Pool2d::new(PoolKind::Max, 3, 1, 1)),
            true,
        ),
        (
            "a depthwise convolution",
            |b, c| b.conv("r", c, Conv2d::new(8, 3).groups(8)),
            true,
        ),
        (
            "a convolution padded differently after",
            |b, c| {
                let mut conv = Conv2d::new(4, 2);
                conv.padding_end = Some([0, 0]);
                b.conv("r", c, conv)
            },
            false,
        ),
        // The add kernel reads strided views, whoever reads the sum.
        ("an add", |b, c| b.add("r", &[c, c]), true),
        (
            "a pool of a sum",
            |b, c| {
                let sum = vec![Value::whole(c), Value::whole(c)];
                let pool = Op::Pool2d(Pool2d::new(PoolKind::Max, 3, 1, 1));
                b.node("r", pool, vec![sum])
            },
            true,
        ),
        (
            "a sum with a channel slice",
            |b, c| {
                let sum = vec![Value::whole(c), Value::slice(c, 0, 8)];
                b.node("r", Op::Identity, vec![sum])
            },
            false,
        ),
        // Run by the element-wise kernel, which reads any runs.
        (
            "an activation",
            |b, c| b.act("r", c, Activation::Relu),
            true,
        ),
        (
            "a softmax",
            |b, c| b.op("r", Op::Softmax { axis: 1 }, &[c]),
            false,
        ),
    ];
    for (what, reader, in_place) in cases {
        let g = merged_pair_read_by(reader);
        let (a, c) = (id(&g, "a"), id(&g, "c"));
        assert!(mergeable(&g, &[a, c]), "{what}");
        // The concatenation alone reads `a`; `c` as its reader has it.
        assert!(read_in_place(&g, a), "{what}");
        assert_eq!(read_in_place(&g, c), in_place, "{what}");
        // At batch 2 the runtime runs the pair as one convolution only then.
        assert_eq!(runs_as_one(&g, &[a, c]), in_place, "{what}");
        // Both keep their slices of the concatenation for a merged convolution to write;
        // alone, `a` may write its own at batch 2 (a strided slice that the concatenation
        // alone reads), and so may `c` where its other reader reads it in place.
        let cat = id(&g, "cat");
        assert_eq!(
            merged_slot(&g, a).map(|s| (s.into, s.at)),
            Some((cat, 0)),
            "{what}"
        );
        assert_eq!(
            merged_slot(&g, c).map(|s| (s.into, s.at)),
            Some((cat, 8 * 64)),
            "{what}"
        );
        assert!(slice_of(&g, a).is_some(), "{what}");
        assert_eq!(slice_of(&g, c).is_some(), in_place, "{what}");
    }
}

/// The Transformer's query, key and value projections merge into one linear layer of their
/// features side by side; each is read through a head reshape and transpose by batched
/// products, which read a run per row in place, so the runtime runs the three as one product.
#[test]
fn query_key_and_value_merge_into_one_linear_layer() {
    use opsched_graph::merge::{merged_linear, rows_read_in_place, runs_as_one};
    for batch in [1, 2] {
        let g = zoo::build(
            "transformer",
            &ZooConfig {
                batch,
                input_size: Some(16),
                ..ZooConfig::default()
            },
        )
        .unwrap();
        let qkv = ["layer0_q", "layer0_k", "layer0_v"].map(|n| id(&g, n));
        let (op, input) = merged_linear(&g, &qkv).unwrap();
        assert_eq!(
            op,
            Op::Linear {
                out_features: 3 * 768,
                bias: true,
                act: Activation::None,
            }
        );
        assert_eq!(input, vec![batch, 16, 768]);
        for &p in &qkv {
            assert!(rows_read_in_place(&g, p), "batch {batch}");
        }
        assert!(runs_as_one(&g, &qkv));
        assert!(mergeable(&g, &qkv[..2]));
        // Not with the output projection (another input), nor twice the same layer.
        let out = id(&g, "layer0_attn_out");
        assert!(!mergeable(&g, &[qkv[0], out]));
        assert!(!mergeable(&g, &[qkv[0], qkv[0]]));
        // The FFN's first layer is read by the second, not through head transposes.
        assert!(!rows_read_in_place(&g, id(&g, "layer0_ffn1")));
    }
}
