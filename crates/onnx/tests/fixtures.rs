//! The fixtures the project generates (xtask/onnx/make_fixtures.py) and models built here
//! message by message: mapping, folding, blocks, batch sizes, opsets and error cases.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use opsched::graph::{Activation, BinaryKind, DType, Op, PoolKind};
use opsched::zoo::ZooConfig;
use opsched::Graph;
use opsched_onnx::proto::{
    data_type, AttributeProto, Dimension, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    StringStringEntryProto, TensorProto, TensorShapeProto, TensorTypeProto, TypeProto,
    ValueInfoProto,
};
use opsched_onnx::{import_bytes, import_file, Imported, OnnxError, OnnxOptions};
use prost::Message;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/onnx")
        .join(name)
}

fn load(name: &str, opts: &OnnxOptions) -> Imported {
    import_file(fixture(name), opts).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn types(g: &Graph) -> BTreeMap<&'static str, usize> {
    let mut m = BTreeMap::new();
    for o in g.ops() {
        *m.entry(g.node(o).op.type_name()).or_insert(0) += 1;
    }
    m
}

fn op<'g>(g: &'g Graph, name: &str) -> &'g Op {
    &g.node(g.find(name).unwrap_or_else(|| panic!("no node '{name}'")))
        .op
}

fn flops(g: &Graph) -> u64 {
    opsched::graph::summarize(g).flops
}

/// A scratch directory of this test process.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("opsched-onnx-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn every_fixture_imports_weight_free() {
    let mut n = 0;
    for e in std::fs::read_dir(fixture("")).unwrap() {
        let path = e.unwrap().path();
        if !opsched_onnx::is_onnx_path(&path) {
            continue;
        }
        let opts = OnnxOptions {
            allow_unknown: path.ends_with("unsupported.onnx"),
            ..OnnxOptions::default()
        };
        let i = import_file(&path, &opts).unwrap_or_else(|e| panic!("{e}"));
        assert!(i.graph.op_count() > 0, "{}", path.display());
        assert!(std::fs::metadata(&path).unwrap().len() < 100_000);
        n += 1;
    }
    assert_eq!(n, 6);
    // The weights of the fixtures point to a file that is not there.
    assert!(!fixture("weights.bin").exists());
}

#[test]
fn multi_branch_cnn_folds_batch_norm_and_activations_at_opset_13() {
    let i = load("multi_branch_cnn.onnx", &OnnxOptions::default());
    let (g, r) = (&i.graph, &i.report);
    assert_eq!(r.opset, 13);
    assert_eq!((g.op_count(), g.edge_count()), (16, 19));
    assert_eq!(
        types(g),
        BTreeMap::from([
            ("concat", 2),
            ("conv2d", 9),
            ("linear", 1),
            ("pool2d", 2),
            ("reshape", 1),
            ("softmax", 1),
        ])
    );
    assert_eq!(r.folded_batch_norms, 7);
    assert_eq!(r.fused_activations, 9);
    // conv-BN-ReLU is one conv with a bias and a fused relu; Clip (ReLU6) fuses as a clip.
    let Op::Conv2d(c) = op(g, "/stem/conv/Conv") else {
        panic!()
    };
    assert!(c.bias && c.act == Activation::Relu && c.stride == [2, 2] && c.padding == [1, 1]);
    let Op::Conv2d(c) = op(g, "/mixed/branch2_2/conv/Conv") else {
        panic!()
    };
    assert_eq!(
        c.act,
        Activation::Clip {
            min: Some(0.0),
            max: Some(6.0)
        }
    );
    // auto_pad SAME_UPPER on a 5x5 is padding 2.
    let Op::Conv2d(c) = op(g, "/mixed/branch3_2/conv/Conv") else {
        panic!()
    };
    assert_eq!((c.kernel, c.padding), ([5, 5], [2, 2]));
    // The channel split is no operator: the two convs read channel slices of the concat.
    let left = g.find("/split/left/conv/Conv").unwrap();
    let mixed = g.find("/mixed/Concat").unwrap();
    assert_eq!(g.node(left).inputs[0][0].node, mixed);
    assert_eq!(g.node(left).inputs[0][0].channels, Some((0, 18)));
    let right = g.find("/split/right/conv/Conv").unwrap();
    assert_eq!(g.node(right).inputs[0][0].channels, Some((18, 36)));
    let Op::Conv2d(c) = &g.node(right).op else {
        panic!()
    };
    assert_eq!(c.act, Activation::Sigmoid);
    // Squeeze (axes as an input, opset 13) is a reshape; Gemm with transB a linear layer.
    assert_eq!(g.node(g.find("/head/Squeeze").unwrap()).shape, vec![1, 36]);
    assert!(matches!(
        op(g, "/fc/Gemm"),
        Op::Linear {
            out_features: 10,
            bias: true,
            ..
        }
    ));
    assert_eq!(op(g, "/head/Softmax"), &Op::Softmax { axis: -1 });
    // Blocks from the module scopes.
    let blocks: Vec<&str> = g.blocks().iter().map(|b| b.name.as_str()).collect();
    assert_eq!(blocks, ["mixed", "split", "head"]);
}

#[test]
fn residual_net_keeps_adds_and_standalone_relus() {
    let i = load("residual.onnx", &OnnxOptions::default());
    let g = &i.graph;
    assert_eq!((g.op_count(), g.edge_count()), (17, 19));
    assert_eq!(i.report.folded_batch_norms, 8);
    assert_eq!(
        types(g),
        BTreeMap::from([
            ("activation", 3),
            ("conv2d", 8),
            ("elementwise", 3),
            ("linear", 1),
            ("pool2d", 1),
            ("reshape", 1),
        ])
    );
    // conv2 + BN has no activation: the relu after the add stays an operator.
    let Op::Conv2d(c) = op(g, "/layer2/layer2.0/conv2/conv/Conv") else {
        panic!()
    };
    assert!(c.bias && c.act == Activation::None);
    let blocks: Vec<&str> = g.blocks().iter().map(|b| b.name.as_str()).collect();
    assert_eq!(blocks, ["layer1.0", "layer2.0", "layer2.1"]);
    // The downsample conv runs beside the main branch.
    assert_eq!(opsched::graph::analysis::width(g), 2);
}

/// The operator types of one encoder layer of the zoo's Transformer.
fn zoo_layer_types() -> BTreeMap<&'static str, usize> {
    let z = opsched::zoo::build("transformer", &ZooConfig::default()).unwrap();
    let mut m = BTreeMap::new();
    let b = z.blocks().first().unwrap();
    for &n in &b.nodes {
        *m.entry(z.node(n).op.type_name()).or_insert(0) += 1;
    }
    m
}

#[test]
fn transformer_block_maps_like_a_zoo_encoder_layer_at_opsets_17_and_13() {
    let a = load("transformer_block.onnx", &OnnxOptions::default());
    let b = load("transformer_block_opset13.onnx", &OnnxOptions::default());
    assert_eq!((a.report.opset, b.report.opset), (17, 13));
    // opset 13: layer norm decomposed twice, GELU decomposed once, all rewritten.
    assert_eq!(
        (a.report.rewritten_patterns, b.report.rewritten_patterns),
        (1, 3)
    );
    for g in [&a.graph, &b.graph] {
        assert_eq!((g.op_count(), g.edge_count()), (21, 21), "{}", g.name);
        assert_eq!(types(g), zoo_layer_types(), "{}", g.name);
        // Biases fold into the linear layers, GELU into the first FFN layer, the 1/sqrt(d)
        // scale (a division by 4) into the score matmul's alpha, and the key's transpose
        // becomes transpose_b.
        assert!(matches!(
            op(g, "/layer0/ffn/fc1/MatMul"),
            Op::Linear {
                out_features: 256,
                bias: true,
                act: Activation::Gelu
            }
        ));
        assert_eq!(
            op(g, "/layer0/attention/MatMul"),
            &Op::BatchMatmul {
                transpose_b: true,
                alpha: 0.25
            }
        );
        assert_eq!(
            g.node(g.find("/layer0/attention/MatMul").unwrap()).shape,
            vec![1, 4, 16, 16]
        );
    }
    assert_eq!(flops(&a.graph), flops(&b.graph));
    assert!(matches!(
        op(&b.graph, "/layer0/attention/norm/ReduceMean"),
        Op::LayerNorm { .. }
    ));
}

#[test]
fn dynamic_batch_scales_flops_with_the_batch() {
    for name in ["dynamic_batch.onnx", "transformer_block_opset13.onnx"] {
        let one = load(name, &OnnxOptions::default());
        let four = load(
            name,
            &OnnxOptions {
                batch: 4,
                ..OnnxOptions::default()
            },
        );
        assert!(one.report.dynamic_batch && four.report.dynamic_batch);
        assert_eq!(flops(&four.graph), 4 * flops(&one.graph), "{name}");
        let input = four.graph.inputs().next().unwrap();
        assert_eq!(four.graph.node(input).shape[0], 4);
    }
    // x.view(x.size(0), -1): Shape -> Gather -> Unsqueeze -> Concat is evaluated at import.
    let g = load(
        "dynamic_batch.onnx",
        &OnnxOptions {
            batch: 4,
            ..OnnxOptions::default()
        },
    )
    .graph;
    assert_eq!(
        op(&g, "/Reshape"),
        &Op::Reshape {
            shape: vec![4, 32 * 16 * 16]
        }
    );
    assert_eq!(g.op_count(), 5);
    // The facade passes the batch size of the zoo configuration.
    let cfg = ZooConfig {
        batch: 4,
        ..ZooConfig::default()
    };
    let f = opsched::load_model(fixture("dynamic_batch.onnx").to_str().unwrap(), &cfg).unwrap();
    assert_eq!(flops(&f), flops(&g));
}

#[test]
fn unsupported_operators_are_listed_with_counts_or_imported_as_opaque() {
    let path = fixture("unsupported.onnx");
    let e = import_file(&path, &OnnxOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with(&path.display().to_string()), "{msg}");
    assert!(
        msg.contains("unsupported ONNX operators: DepthToSpace x2, LRN x1, com.example.Custom x1"),
        "{msg}"
    );
    assert!(msg.contains("--allow-unknown"), "{msg}");
    let OnnxError::Unsupported { ops } = e.located() else {
        panic!("{e:?}")
    };
    assert_eq!(ops.len(), 3);

    let i = load(
        "unsupported.onnx",
        &OnnxOptions {
            allow_unknown: true,
            ..OnnxOptions::default()
        },
    );
    let g = &i.graph;
    assert_eq!(types(g), BTreeMap::from([("conv2d", 2), ("opaque", 4)]));
    assert_eq!(i.report.unknown.values().sum::<usize>(), 4);
    // Output shapes come from the model's value info.
    let up = g.find("/up2/DepthToSpace").unwrap();
    assert_eq!(g.node(up).shape, vec![1, 8, 64, 64]);
    assert!(matches!(&g.node(up).op, Op::Opaque { op_type, .. } if op_type == "DepthToSpace"));
    // Costed by tensor sizes: reads 32x32x32, writes 8x64x64.
    let s = g.stats(up);
    assert_eq!(
        (s.bytes_read, s.bytes_written),
        (32 * 32 * 32 * 4, 8 * 64 * 64 * 4)
    );

    // Through the facade: the same choice, and a user error.
    let spec = path.to_str().unwrap();
    let e = opsched::load_model(spec, &ZooConfig::default()).unwrap_err();
    assert!(e.is_user_error() && e.to_string().contains("LRN x1"), "{e}");
    let opts = opsched::LoadOptions {
        allow_unknown: true,
        ..Default::default()
    };
    let g = opsched::load_model_with(spec, &ZooConfig::default(), &opts).unwrap();
    assert_eq!(g.op_count(), 6);
    // And it schedules and simulates.
    let p = opsched::schedule::Platform {
        gpus: 1,
        streams: 4,
        device: opsched::cost::DevicePreset::by_name("h100").unwrap(),
        link: opsched::cost::LinkPreset::by_name("nvlink4").unwrap(),
    };
    let cost = opsched::cost::AnalyticalModel::new(p.device.clone(), p.link.clone());
    let (s, _) = opsched::scheduler("ios")
        .unwrap()
        .schedule(&g, &p, &cost)
        .unwrap();
    assert!(opsched::evaluate(&g, &s, &cost, 1).unwrap().makespan_ms > 0.0);
}

#[test]
fn garbage_truncated_and_missing_files_give_clear_errors() {
    let dir = scratch("bad");
    let garbage = dir.join("garbage.onnx");
    std::fs::write(&garbage, b"this is not a protobuf \xff\xff\xff").unwrap();
    let msg = import_file(&garbage, &OnnxOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("garbage.onnx") && msg.contains("not an ONNX model"),
        "{msg}"
    );

    let bytes = std::fs::read(fixture("residual.onnx")).unwrap();
    let truncated = dir.join("truncated.onnx");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let msg = import_file(&truncated, &OnnxOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("truncated.onnx") && msg.contains("truncated"),
        "{msg}"
    );

    let empty = dir.join("empty.onnx");
    std::fs::write(&empty, b"").unwrap();
    let msg = import_file(&empty, &OnnxOptions::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("empty.onnx") && msg.contains("empty"), "{msg}");

    let msg = import_file(dir.join("absent.onnx"), &OnnxOptions::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("absent.onnx"), "{msg}");

    // The facade detects ONNX by content too, and JSON stays JSON.
    let renamed = dir.join("model.bin");
    std::fs::copy(fixture("residual.onnx"), &renamed).unwrap();
    let g = opsched::load_model(renamed.to_str().unwrap(), &ZooConfig::default()).unwrap();
    assert_eq!(g.op_count(), 17);
    let e = opsched::load_model(garbage.to_str().unwrap(), &ZooConfig::default()).unwrap_err();
    assert!(e.is_user_error());
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Models built message by message.

fn value(name: &str, dims: &[Dimension]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorTypeProto {
                elem_type: data_type::FLOAT,
                shape: Some(TensorShapeProto { dim: dims.to_vec() }),
            }),
        }),
    }
}

fn dim(v: i64) -> Dimension {
    Dimension {
        dim_value: Some(v),
        dim_param: None,
    }
}

fn sym(p: &str) -> Dimension {
    Dimension {
        dim_value: None,
        dim_param: Some(p.into()),
    }
}

fn node(op_type: &str, name: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![format!("{name}_out")],
        name: name.into(),
        op_type: op_type.into(),
        attribute: attrs,
        ..NodeProto::default()
    }
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        ints: v.to_vec(),
        r#type: 7,
        ..AttributeProto::default()
    }
}

fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        i: v,
        r#type: 2,
        ..AttributeProto::default()
    }
}

fn text(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        s: v.as_bytes().to_vec(),
        r#type: 3,
        ..AttributeProto::default()
    }
}

/// A float initializer of shape `dims` holding `v`.
fn floats(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: data_type::FLOAT,
        float_data: v.to_vec(),
        ..TensorProto::default()
    }
}

/// An int64 initializer of shape `dims` holding `v`.
fn int64s(name: &str, dims: &[i64], v: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: data_type::INT64,
        int64_data: v.to_vec(),
        ..TensorProto::default()
    }
}

/// A float initializer of shape `dims` without values (a weight read for its shape only).
fn weight(name: &str, dims: &[i64]) -> TensorProto {
    floats(name, dims, &[])
}

fn model(
    opset: i64,
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
) -> ModelProto {
    ModelProto {
        ir_version: 7,
        producer_name: "test".into(),
        graph: Some(GraphProto {
            node: nodes,
            name: "g".into(),
            initializer: inits,
            input: inputs,
            ..GraphProto::default()
        }),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        ..ModelProto::default()
    }
}

fn import(m: &ModelProto, opts: &OnnxOptions) -> opsched_onnx::Result<Imported> {
    import_bytes(m.encode_to_vec(), "test", None, opts)
}

#[test]
fn older_opsets_take_axes_as_attributes_and_softmax_defaults_to_axis_1() {
    let m = model(
        11,
        vec![
            node("GlobalAveragePool", "gap", &["x"], vec![]),
            node(
                "Squeeze",
                "squeeze",
                &["gap_out"],
                vec![ints("axes", &[2, 3])],
            ),
            node("Softmax", "softmax", &["squeeze_out"], vec![]),
            node(
                "Unsqueeze",
                "unsqueeze",
                &["softmax_out"],
                vec![ints("axes", &[-1])],
            ),
            node(
                "MaxPool",
                "pool",
                &["x"],
                vec![
                    ints("kernel_shape", &[3, 3]),
                    ints("strides", &[2, 2]),
                    ints("pads", &[0, 0, 1, 1]),
                ],
            ),
        ],
        vec![],
        vec![value("x", &[dim(2), dim(8), dim(9), dim(9)])],
    );
    let g = import(&m, &OnnxOptions::default()).unwrap().graph;
    assert_eq!(op(&g, "softmax"), &Op::Softmax { axis: 1 });
    assert_eq!(g.node(g.find("squeeze").unwrap()).shape, vec![2, 8]);
    assert_eq!(g.node(g.find("unsqueeze").unwrap()).shape, vec![2, 8, 1]);
    // Asymmetric pads (0 before, 1 after): (9 + 1 - 3) / 2 + 1 = 4 outputs, which symmetric
    // padding 0 gives too ((9 - 3) / 2 + 1 = 4), padding 1 not (5).
    let pool = g.find("pool").unwrap();
    assert_eq!(g.node(pool).shape, vec![2, 8, 4, 4]);
    let Op::Pool2d(p) = &g.node(pool).op else {
        panic!()
    };
    assert_eq!((p.kind, p.padding), (PoolKind::Max, [0, 0]));
}

#[test]
fn node_errors_name_the_node_and_its_type() {
    // Weights for 4 input channels on an 8-channel input.
    let m = model(
        13,
        vec![node("Conv", "conv1", &["x", "w"], vec![])],
        vec![weight("w", &[16, 4, 3, 3])],
        vec![value("x", &[dim(1), dim(8), dim(8), dim(8)])],
    );
    let e = import(&m, &OnnxOptions::default()).unwrap_err().to_string();
    assert!(
        e.contains("node 'conv1' (Conv)") && e.contains("8 channels"),
        "{e}"
    );

    // An input produced by nobody.
    let m = model(
        13,
        vec![node("Relu", "relu", &["nothing"], vec![])],
        vec![],
        vec![value("x", &[dim(1), dim(8)])],
    );
    let e = import(&m, &OnnxOptions::default()).unwrap_err().to_string();
    assert!(
        e.contains("node 'relu' (Relu)") && e.contains("'nothing'"),
        "{e}"
    );

    // A reshape whose target is computed at run time from an activation.
    let m = model(
        13,
        vec![
            node("Relu", "relu", &["x"], vec![]),
            node("Reshape", "reshape", &["x", "relu_out"], vec![]),
        ],
        vec![],
        vec![value("x", &[dim(1), dim(8)])],
    );
    let e = import(&m, &OnnxOptions::default()).unwrap_err().to_string();
    assert!(
        e.contains("node 'reshape' (Reshape)") && e.contains("run time"),
        "{e}"
    );
}

#[test]
fn symbolic_dimensions_need_values_and_batch_takes_the_first() {
    let m = model(
        17,
        vec![node("Softmax", "softmax", &["x"], vec![int("axis", -1)])],
        vec![],
        vec![value("x", &[sym("batch"), sym("seq"), dim(64)])],
    );
    let e = import(&m, &OnnxOptions::default()).unwrap_err().to_string();
    assert!(
        e.contains("graph input 'x'") && e.contains("'seq'") && e.contains("dims"),
        "{e}"
    );
    let opts = OnnxOptions {
        batch: 3,
        dims: [("seq".to_string(), 128)].into(),
        ..OnnxOptions::default()
    };
    let i = import(&m, &opts).unwrap();
    assert_eq!(
        i.graph.node(i.graph.find("x").unwrap()).shape,
        vec![3, 128, 64]
    );
    assert_eq!(i.graph.dtype, DType::F32);
}

/// A reshape whose target shape lives in an external data file: read when the file is there,
/// a clear error naming the file when it is not (weights never need it).
#[test]
fn small_constants_are_read_from_external_data_when_needed() {
    let target = TensorProto {
        name: "target".into(),
        dims: vec![2],
        data_type: data_type::INT64,
        data_location: 1,
        external_data: vec![
            StringStringEntryProto {
                key: "location".into(),
                value: "shape.bin".into(),
            },
            StringStringEntryProto {
                key: "offset".into(),
                value: "8".into(),
            },
        ],
        ..TensorProto::default()
    };
    let m = model(
        13,
        vec![
            node("Conv", "conv", &["x", "w"], vec![]),
            node("Reshape", "reshape", &["conv_out", "target"], vec![]),
        ],
        vec![weight("w", &[4, 2, 1, 1]), target],
        vec![value("x", &[dim(1), dim(2), dim(3), dim(3)])],
    );
    let dir = scratch("external");
    let path = dir.join("model.onnx");
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let e = import_file(&path, &OnnxOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("node 'reshape' (Reshape)") && e.contains("'shape.bin'"),
        "{e}"
    );
    let mut data = vec![0u8; 8];
    for v in [1i64, -1] {
        data.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(dir.join("shape.bin"), data).unwrap();
    let g = import_file(&path, &OnnxOptions::default()).unwrap().graph;
    assert_eq!(g.node(g.find("reshape").unwrap()).shape, vec![1, 36]);
    std::fs::remove_dir_all(Path::new(&dir)).unwrap();
}

#[test]
fn broadcasts_standalone_batch_norms_and_nested_concats() {
    // A squeeze-and-excitation gate (Mul of [1,8,4,4] by [1,8,1,1]), a batch norm after a
    // pool, and concat(concat(a, b), c) with the inner concat read only by the outer one.
    let m = model(
        17,
        vec![
            node("GlobalAveragePool", "gap", &["x"], vec![]),
            node("Sigmoid", "gate", &["gap_out"], vec![]),
            node("Mul", "scale", &["x", "gate_out"], vec![]),
            node(
                "MaxPool",
                "pool",
                &["x"],
                vec![ints("kernel_shape", &[1, 1])],
            ),
            node(
                "BatchNormalization",
                "bn",
                &["pool_out", "s", "b", "m", "v"],
                vec![],
            ),
            node(
                "Concat",
                "inner",
                &["scale_out", "bn_out"],
                vec![int("axis", 1)],
            ),
            node(
                "Concat",
                "outer",
                &["inner_out", "x"],
                vec![int("axis", -3)],
            ),
        ],
        ["s", "b", "m", "v"]
            .iter()
            .map(|n| weight(n, &[8]))
            .collect(),
        vec![value("x", &[dim(1), dim(8), dim(4), dim(4)])],
    );
    let i = import(&m, &OnnxOptions::default()).unwrap();
    let g = &i.graph;
    assert!(i.report.unknown.is_empty() && i.report.opaque.is_empty());
    // The gate broadcasts over the spatial axes; the batch norm after a pool is a per-channel
    // scale and shift.
    assert_eq!(
        op(g, "scale"),
        &Op::Elementwise {
            kind: opsched::graph::ElementwiseKind::Mul
        }
    );
    assert_eq!(op(g, "bn"), &Op::Affine);
    assert_eq!(g.node(g.find("scale").unwrap()).shape, vec![1, 8, 4, 4]);
    assert!(g.find("inner").is_none());
    let outer = g.find("outer").unwrap();
    assert_eq!(g.node(outer).inputs.len(), 3);
    assert_eq!(g.node(outer).shape, vec![1, 24, 4, 4]);
    assert_eq!(i.report.merged_concats, 1);
}

#[test]
fn operators_without_an_ir_operator_are_opaque_passes_with_computed_shapes() {
    let f = |name: &str, v: f32| AttributeProto {
        name: name.into(),
        f: v,
        r#type: 1,
        ..AttributeProto::default()
    };
    let pads = int64s("pads", &[8], &[0, 0, 1, 2, 0, 0, 1, 2]);
    let scales = floats("scales", &[4], &[1.0, 1.0, 2.0, 2.0]);
    let index = int64s("index", &[2], &[1, 0]);
    let m = model(
        18,
        vec![
            node("HardSwish", "hswish", &["x"], vec![]),
            node("LeakyRelu", "leaky", &["hswish_out"], vec![f("alpha", 0.1)]),
            node("Pad", "pad", &["leaky_out", "pads"], vec![]),
            // Cubic: a resize we do not compute.
            node(
                "Resize",
                "resize",
                &["pad_out", "", "scales"],
                vec![text("mode", "cubic")],
            ),
            node(
                "ReduceMean",
                "mean",
                &["resize_out"],
                vec![int("keepdims", 0), ints("axes", &[2, 3])],
            ),
            // The images swapped: a list of indices, a copy we do not run.
            node(
                "Gather",
                "first",
                &["mean_out", "index"],
                vec![int("axis", 0)],
            ),
        ],
        vec![pads, scales, index],
        vec![value("x", &[dim(2), dim(8), dim(6), dim(6)])],
    );
    let i = import(&m, &OnnxOptions::default()).unwrap();
    assert!(i.report.unknown.is_empty());
    let g = &i.graph;
    let shape = |n: &str| g.node(g.find(n).unwrap()).shape.clone();
    assert_eq!(shape("leaky"), vec![2, 8, 6, 6]);
    assert_eq!(shape("pad"), vec![2, 8, 8, 10]);
    assert_eq!(shape("resize"), vec![2, 8, 16, 20]);
    assert_eq!(shape("mean"), vec![2, 8]);
    assert_eq!(shape("first"), vec![2, 8]);
    assert_eq!(
        types(g),
        BTreeMap::from([("activation", 2), ("opaque", 2), ("pad", 1), ("reduce", 1)])
    );
    // A mean over both spatial axes that drops them: a reduce (kept, a global pool).
    assert_eq!(
        op(g, "mean"),
        &Op::Reduce {
            kind: opsched::graph::ReduceKind::Mean,
            begin: 2,
            end: 4,
            keep: false
        }
    );
    assert_eq!(
        op(g, "leaky"),
        &Op::Activation {
            act: Activation::LeakyRelu { alpha: 0.1 }
        }
    );
    assert_eq!(
        op(g, "pad"),
        &Op::Pad {
            begin: vec![0, 0, 1, 2],
            end: vec![0, 0, 1, 2],
            value: 0.0
        }
    );
}

/// PyTorch's SiLU (`Sigmoid, Mul` of the same value) after a convolution becomes the
/// convolution's activation; `Mul(alpha), Sigmoid, Mul` a swish with that alpha; ONNX's own
/// `Swish` (opset 24) maps alike. A sigmoid that gates another value, or whose output is seen
/// elsewhere (a graph output), stays a sigmoid and a product.
#[test]
fn swish_written_out_or_native_is_one_activation() {
    let alpha = floats("alpha", &[], &[1.702]);
    let f = |v: f32| AttributeProto {
        name: "alpha".into(),
        f: v,
        r#type: 1,
        ..AttributeProto::default()
    };
    let nodes = |native: bool| {
        let mut v = vec![
            node(
                "Conv",
                "conv",
                &["x", "w"],
                vec![ints("kernel_shape", &[1, 1])],
            ),
            node("Sigmoid", "silu", &["conv_out"], vec![]),
            node("Mul", "silu_mul", &["silu_out", "conv_out"], vec![]),
        ];
        if native {
            v.push(node("Swish", "scaled", &["silu_mul_out"], vec![f(1.702)]));
            v.push(node("Identity", "scaled_mul", &["scaled_out"], vec![]));
        } else {
            v.push(node("Mul", "scaled", &["silu_mul_out", "alpha"], vec![]));
            v.push(node("Sigmoid", "scaled_sig", &["scaled_out"], vec![]));
            v.push(node(
                "Mul",
                "scaled_mul",
                &["silu_mul_out", "scaled_sig_out"],
                vec![],
            ));
        }
        v.extend([
            // Gates another value: no swish.
            node("Sigmoid", "gate", &["scaled_mul_out"], vec![]),
            node("Mul", "gated", &["gate_out", "x"], vec![]),
            // The sigmoid is an output of the graph: no swish.
            node("Sigmoid", "seen", &["gated_out"], vec![]),
            node("Mul", "seen_mul", &["gated_out", "seen_out"], vec![]),
        ]);
        v
    };
    for (opset, native) in [(17, false), (24, true)] {
        let mut m = model(
            opset,
            nodes(native),
            vec![weight("w", &[8, 8, 1, 1]), alpha.clone()],
            vec![value("x", &[dim(1), dim(8), dim(4), dim(4)])],
        );
        let shape = [dim(1), dim(8), dim(4), dim(4)];
        let graph = m.graph.as_mut().unwrap();
        graph.output = vec![value("seen_out", &shape), value("seen_mul_out", &shape)];
        let i = import(&m, &OnnxOptions::default()).unwrap();
        let g = &i.graph;
        assert_eq!(i.report.rewritten_patterns, if native { 1 } else { 2 });
        let Op::Conv2d(c) = op(g, "conv") else {
            panic!("conv: {:?}", op(g, "conv"))
        };
        assert_eq!(c.act, Activation::Swish { alpha: 1.0 });
        assert_eq!(
            op(g, "scaled"),
            &Op::Activation {
                act: Activation::Swish { alpha: 1.702 }
            }
        );
        assert_eq!(
            types(g),
            BTreeMap::from([("activation", 3), ("conv2d", 1), ("elementwise", 2)]),
            "opset {opset}"
        );
        assert_eq!(
            op(g, "gate"),
            &Op::Activation {
                act: Activation::Sigmoid
            }
        );
    }
}

/// `Resize` and `Upsample` become `resize` operators with ONNX's modes (before opset 11: the
/// asymmetric coordinates and truncation, or rounding up when shrinking), given scales or sizes,
/// also through `axes`; what we do not compute (channels resized, cubic, crop and resize,
/// mixed enlarging and shrinking before opset 11) stays opaque; bad scales are errors.
#[test]
fn resizes_map_their_modes_scales_and_sizes() {
    // One-axis scales and sizes.
    let scales = |v: &[f32]| floats("s", &[v.len() as i64], v);
    let one = |opset: i64, op: &str, inputs: &[&str], attrs, inits| {
        let m = model(
            opset,
            vec![node(op, "r", inputs, attrs)],
            inits,
            vec![value("x", &[dim(1), dim(8), dim(4), dim(6)])],
        );
        import(&m, &OnnxOptions::default())
            .map(|i| i.graph.node(i.graph.find("r").unwrap()).clone())
    };
    use opsched::graph::{NearestMode, Resize, ResizeCoord, ResizeMode};
    // The resize a node maps to, with its output shape.
    let mapped = |opset, op, inputs, attrs, inits| -> (Resize, Vec<usize>) {
        let n = one(opset, op, inputs, attrs, inits).unwrap();
        match n.op {
            Op::Resize(r) => (r, n.shape),
            other => panic!("{other:?}"),
        }
    };
    // Upsample (opset 9): PyTorch's old nearest.
    let s4 = scales(&[1.0, 1.0, 2.0, 2.0]);
    let (r, shape) = mapped(9, "Upsample", &["x", "s"], vec![], vec![s4]);
    assert_eq!(shape, vec![1, 8, 8, 12]);
    let want = (
        ResizeCoord::Asymmetric,
        NearestMode::Floor,
        Some([2.0, 2.0]),
    );
    assert_eq!((r.coord, r.nearest, r.scale), want);
    // Resize-10 shrinking rounds up.
    let half = scales(&[1.0, 1.0, 0.5, 0.5]);
    let (r, shape) = mapped(10, "Resize", &["x", "s"], vec![], vec![half]);
    assert_eq!((r.nearest, shape), (NearestMode::Ceil, vec![1, 8, 2, 3]));
    // Sizes, bilinear as PyTorch exports it: the scale is the sizes' ratio.
    let attrs = vec![
        text("mode", "linear"),
        text("coordinate_transformation_mode", "pytorch_half_pixel"),
    ];
    let sizes = int64s("z", &[4], &[1, 8, 3, 5]);
    let (r, _) = mapped(13, "Resize", &["x", "", "", "z"], attrs, vec![sizes]);
    let want = (
        ResizeMode::Linear,
        ResizeCoord::PytorchHalfPixel,
        None,
        [3, 5],
    );
    assert_eq!((r.mode, r.coord, r.scale, r.size), want);
    // Opset 18's axes: scales for the spatial axes only, ONNX's defaults otherwise.
    let attrs = vec![ints("axes", &[-2, -1])];
    let two = scales(&[1.5, 0.5]);
    let (r, shape) = mapped(18, "Resize", &["x", "", "s"], attrs, vec![two]);
    assert_eq!(shape, vec![1, 8, 6, 3]);
    let want = (
        ResizeCoord::HalfPixel,
        NearestMode::RoundPreferFloor,
        Some([1.5, 0.5]),
    );
    assert_eq!((r.coord, r.nearest, r.scale), want);
    // Opaque, with the shape computed.
    let s = |v: &[f32]| vec![scales(v)];
    for (opset, op, attrs, scales, shape) in [
        (
            13,
            "Resize",
            vec![],
            s(&[1.0, 2.0, 1.0, 1.0]),
            vec![1, 16, 4, 6],
        ),
        (
            13,
            "Resize",
            vec![text("mode", "cubic")],
            s(&[1.0, 1.0, 2.0, 2.0]),
            vec![1, 8, 8, 12],
        ),
        (
            13,
            "Resize",
            vec![text("coordinate_transformation_mode", "tf_crop_and_resize")],
            s(&[1.0, 1.0, 2.0, 2.0]),
            vec![1, 8, 8, 12],
        ),
        (
            9,
            "Upsample",
            vec![],
            s(&[1.0, 1.0, 2.0, 0.5]),
            vec![1, 8, 8, 3],
        ),
    ] {
        let inputs: &[&str] = if opset < 11 {
            &["x", "s"]
        } else {
            &["x", "", "s"]
        };
        let n = one(opset, op, inputs, attrs, scales).unwrap();
        assert!(matches!(n.op, Op::Opaque { .. }), "{:?}", n.op);
        assert_eq!(n.shape, shape);
    }
    // Scales that are no scales.
    for bad in [0.0, -2.0, f32::NAN, f32::INFINITY] {
        let e = one(
            13,
            "Resize",
            &["x", "", "s"],
            vec![],
            s(&[1.0, 1.0, bad, 1.0]),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("'r'") && e.to_string().contains("scale"),
            "{e}"
        );
    }
    let e = one(
        13,
        "Resize",
        &["x", "", "s"],
        vec![],
        s(&[1.0, 1.0, 1e30, 1.0]),
    )
    .unwrap_err();
    assert!(e.to_string().contains("implausibly large"), "{e}");
}

/// `Gather`: a constant table by activation ids is an `embedding` (with the table as its
/// weight); one index of an activation's axis 1 (the first token) a channel slice, of another
/// axis a `slice` operator, either reshaped for a scalar index; an index outside the axis is
/// an error.
#[test]
fn gathers_are_embeddings_or_slices() {
    let values: Vec<f32> = (0..40).map(|v| v as f32).collect();
    let table = floats("table", &[10, 4], &values);
    let lookup = || node("Gather", "words", &["table", "ids"], vec![]);
    let m = model(
        17,
        vec![
            lookup(),
            node(
                "Gather",
                "first",
                &["words_out", "zero"],
                vec![int("axis", 1)],
            ),
            node(
                "Gather",
                "last",
                &["words_out", "minus_one"],
                vec![int("axis", 1)],
            ),
            node("Relu", "act", &["last_out"], vec![]),
            node(
                "Gather",
                "column",
                &["words_out", "zero"],
                vec![int("axis", 2)],
            ),
        ],
        vec![
            table,
            int64s("zero", &[], &[0]),
            int64s("minus_one", &[1], &[-1]),
        ],
        vec![value("ids", &[dim(1), dim(3)])],
    );
    let opts = OnnxOptions {
        weights: true,
        ..OnnxOptions::default()
    };
    let i = import(&m, &opts).unwrap();
    let g = &i.graph;
    let words = g.find("words").unwrap();
    assert_eq!(op(g, "words"), &Op::Embedding { rows: 10, dim: 4 });
    assert_eq!(g.node(words).shape, vec![1, 3, 4]);
    assert_eq!(g.weights().get(words, 0, "weight").unwrap().data[4], 4.0);
    // The first token: a reshape of the slice; the last one: the slice itself.
    let first = g.node(g.find("first").unwrap());
    assert_eq!(
        (&first.op, &first.shape),
        (&Op::Reshape { shape: vec![1, 4] }, &vec![1, 4])
    );
    assert_eq!(first.inputs[0][0].channels, Some((0, 1)));
    let act = g.node(g.find("act").unwrap());
    assert_eq!(act.inputs[0][0].channels, Some((2, 3)));
    assert!(g.find("last").is_none());
    // The first column: a slice of axis 2 (the feature), then a reshape that drops it.
    let cut = g.node(g.find("column").unwrap());
    let slice = Op::Slice {
        axis: 2,
        begin: 0,
        end: 1,
    };
    assert_eq!((&cut.op, &cut.shape), (&slice, &vec![1, 3, 1]));
    let column = g.node(g.find("column#2").unwrap());
    assert_eq!(
        (&column.op, &column.shape),
        (&Op::Reshape { shape: vec![1, 3] }, &vec![1, 3])
    );
    assert_eq!(column.inputs[0][0].node, g.find("column").unwrap());
    // Index 3 of a 3-long axis.
    let m = model(
        17,
        vec![
            lookup(),
            node(
                "Gather",
                "far",
                &["words_out", "three"],
                vec![int("axis", 1)],
            ),
        ],
        vec![weight("table", &[10, 4]), int64s("three", &[], &[3])],
        vec![value("ids", &[dim(1), dim(3)])],
    );
    let e = import(&m, &OnnxOptions::default()).unwrap_err().to_string();
    assert!(e.contains("'far'") && e.contains("index 3"), "{e}");
}

/// Unit-step slices of axes other than channels are `slice` operators, one per axis cut
/// (channels stay a slice of the value), and so are the parts of a split along such an axis;
/// a reversed slice stays an opaque copy.
#[test]
fn slices_of_other_axes_are_slice_operators() {
    let ints64 = |name: &str, v: &[i64]| int64s(name, &[v.len() as i64], v);
    let m = model(
        17,
        vec![
            // Channels 2..6 and rows 1..7 at once.
            node("Slice", "corner", &["x", "s0", "e0", "a0"], vec![]),
            node("Relu", "r", &["corner_out"], vec![]),
            node("Split", "halves", &["x"], vec![int("axis", 3)]),
            node("Slice", "reversed", &["x", "s1", "e1", "a1", "st1"], vec![]),
        ],
        vec![
            ints64("s0", &[2, 1]),
            ints64("e0", &[6, -1]),
            ints64("a0", &[1, 2]),
            ints64("s1", &[-1]),
            ints64("e1", &[i64::MIN]),
            ints64("a1", &[2]),
            ints64("st1", &[-1]),
        ],
        vec![value("x", &[dim(1), dim(8), dim(8), dim(6)])],
    );
    let mut m = m;
    m.graph.as_mut().unwrap().node[2].output = vec!["top".into(), "bottom".into()];
    let outs = [
        ("r_out", [1, 4, 6, 6]),
        ("top", [1, 8, 8, 3]),
        ("bottom", [1, 8, 8, 3]),
    ];
    m.graph.as_mut().unwrap().output = outs
        .iter()
        .map(|(n, s)| value(n, &s.map(|d| dim(d as i64))))
        .chain(std::iter::once(value(
            "reversed_out",
            &[dim(1), dim(8), dim(8), dim(6)],
        )))
        .collect();
    let i = import(&m, &OnnxOptions::default()).unwrap();
    let g = &i.graph;
    let corner = g.node(g.find("corner").unwrap());
    assert_eq!(
        corner.op,
        Op::Slice {
            axis: 2,
            begin: 1,
            end: 7
        }
    );
    assert_eq!(corner.inputs[0][0].channels, Some((2, 6)));
    assert_eq!(corner.shape, vec![1, 4, 6, 6]);
    let half = |n: &str| g.node(g.find(n).unwrap()).op.clone();
    assert_eq!(
        half("halves:bottom"),
        Op::Slice {
            axis: 3,
            begin: 3,
            end: 6
        }
    );
    assert!(matches!(op(g, "reversed"), Op::Opaque { .. }));
}

#[test]
fn dynamo_exports_give_blocks_from_name_scope_metadata_and_reduce_mean_pools() {
    let scoped = |mut n: NodeProto, scopes: &str| {
        n.metadata_props = vec![StringStringEntryProto {
            key: "pkg.torch.onnx.name_scopes".into(),
            value: scopes.into(),
        }];
        n
    };
    let axes = int64s("axes", &[2], &[-1, -2]);
    let m = model(
        18,
        vec![
            scoped(
                node("Relu", "node_relu", &["x"], vec![]),
                "['', 'layer1', 'layer1.0', 'layer1.0.relu', 'relu']",
            ),
            scoped(
                node("Sigmoid", "node_sigmoid", &["node_relu_out"], vec![]),
                "['', 'layer1', 'layer1.0', 'layer1.0.act', 'sigmoid']",
            ),
            scoped(
                node(
                    "ReduceMean",
                    "node_mean",
                    &["node_sigmoid_out", "axes"],
                    vec![],
                ),
                "['', 'avgpool', 'mean']",
            ),
        ],
        vec![axes],
        vec![value("x", &[dim(1), dim(8), dim(4), dim(4)])],
    );
    let g = import(&m, &OnnxOptions::default()).unwrap().graph;
    let blocks: Vec<&str> = g.blocks().iter().map(|b| b.name.as_str()).collect();
    assert_eq!(blocks, ["layer1.0"]);
    assert!(matches!(op(&g, "node_mean"), Op::Pool2d(p) if p.kind == PoolKind::GlobalAvg));
}

/// Corrupted files never panic: every prefix of a fixture, and single-byte changes all over
/// it, import or fail with an error.
#[test]
fn corrupted_files_fail_without_panicking() {
    let bytes = std::fs::read(fixture("multi_branch_cnn.onnx")).unwrap();
    let opts = OnnxOptions {
        allow_unknown: true,
        ..OnnxOptions::default()
    };
    for len in (0..bytes.len()).step_by(7) {
        let _ = import_bytes(bytes[..len].to_vec(), "prefix", None, &opts);
    }
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..3000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut b = bytes.clone();
        let at = (state % b.len() as u64) as usize;
        b[at] = (state >> 32) as u8;
        let _ = import_bytes(b, "mutant", None, &opts);
    }
}

/// `Einsum` equations that are no batched matrix product (an element-wise product, a
/// reduction, batch axes reordered, three operands) are unsupported operators named with
/// their equation; a product whose operands' batch axes differ is an error naming the node.
#[test]
fn einsums_other_than_matrix_products_are_unsupported() {
    let einsum = |eq: &str, b: &[i64]| {
        model(
            12,
            vec![node("Einsum", "e", &["a", "b"], vec![text("equation", eq)])],
            vec![],
            vec![
                value("a", &[dim(2), dim(3), dim(4)]),
                value("b", &b.iter().map(|&d| dim(d)).collect::<Vec<_>>()),
            ],
        )
    };
    for eq in [
        "bij,bij->bij",
        "bij,bjk->bi",
        "bij,bjk->ibk",
        "bij,bjk,bkl->bil",
        "bij,bjk",
    ] {
        let e = import(&einsum(eq, &[2, 4, 5]), &OnnxOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unsupported ONNX operators: Einsum"),
            "{eq}: {e}"
        );
        assert!(e.contains(eq.split("->").next().unwrap()), "{eq}: {e}");
    }
    let m = einsum("bij,bjk->bik", &[3, 4, 5]);
    let e = import(&m, &OnnxOptions::default()).unwrap_err().to_string();
    assert!(
        e.contains("node 'e' (Einsum)") && e.contains("do not fit"),
        "{e}"
    );
    let g = import(&einsum("bij,bjk->bik", &[2, 4, 5]), &OnnxOptions::default())
        .unwrap()
        .graph;
    assert_eq!(g.node(g.find("e").unwrap()).shape, vec![2, 3, 5]);
}

/// A 1-D convolution is a 2-D one over a height of 1 between two views; a 3-D one is
/// unsupported; an instance norm needs one scale and bias per channel.
#[test]
fn one_dimensional_convolutions_and_instance_norms() {
    let conv = |w: &[i64], x: &[i64]| {
        model(
            17,
            vec![node(
                "Conv",
                "c",
                &["x", "w"],
                vec![ints("strides", &[2]), ints("pads", &[1, 0])],
            )],
            vec![weight("w", w)],
            vec![value("x", &x.iter().map(|&d| dim(d)).collect::<Vec<_>>())],
        )
    };
    let g = import(&conv(&[8, 4, 3], &[2, 4, 20]), &OnnxOptions::default())
        .unwrap()
        .graph;
    let c = g.node(g.find("c#2").unwrap());
    let Op::Conv2d(c2) = &c.op else {
        panic!("{:?}", c.op)
    };
    assert_eq!(
        (c2.kernel, c2.stride, c2.padding, c2.padding_end),
        ([1, 3], [1, 2], [0, 1], Some([0, 0]))
    );
    assert_eq!(c.shape, vec![2, 8, 1, 10]);
    assert_eq!(g.node(g.find("c#3").unwrap()).shape, vec![2, 8, 10]);
    let e = import(
        &conv(&[8, 4, 3, 3, 3], &[2, 4, 5, 5, 5]),
        &OnnxOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("Conv (not 1-D or 2-D)"), "{e}");

    let m = model(
        17,
        vec![node(
            "InstanceNormalization",
            "norm",
            &["x", "s", "b"],
            vec![],
        )],
        vec![weight("s", &[3]), weight("b", &[4])],
        vec![value("x", &[dim(1), dim(4), dim(6)])],
    );
    let e = import(&m, &OnnxOptions::default()).unwrap_err().to_string();
    assert!(
        e.contains("node 'norm' (InstanceNormalization)") && e.contains("one per channel"),
        "{e}"
    );
}

/// `CumSum` and `GatherElements` of activations are operators (a negative axis counted from
/// the end, the attributes kept); a `CumSum` axis computed at run time, and indices longer
/// than the data on another axis, are errors naming the node.
#[test]
fn running_sums_and_gathered_elements_of_activations() {
    let m = |axis: Option<i64>, idx: &[i64]| {
        let mut inits = vec![int64s(
            "idx",
            idx,
            &vec![0; idx.iter().product::<i64>() as usize],
        )];
        let mut inputs = vec![value("x", &[dim(2), dim(3), dim(4)])];
        match axis {
            Some(a) => inits.push(int64s("axis", &[], &[a])),
            None => inputs.push(value("axis", &[])),
        }
        model(
            17,
            vec![
                node(
                    "CumSum",
                    "scan",
                    &["x", "axis"],
                    vec![int("exclusive", 1), int("reverse", 1)],
                ),
                node(
                    "GatherElements",
                    "pick",
                    &["scan_out", "idx"],
                    vec![int("axis", -2)],
                ),
            ],
            inits,
            inputs,
        )
    };
    let g = import(&m(Some(-1), &[2, 5, 4]), &OnnxOptions::default())
        .unwrap()
        .graph;
    let scan = g.node(g.find("scan").unwrap());
    assert_eq!(
        scan.op,
        Op::CumSum {
            axis: 2,
            exclusive: true,
            reverse: true
        }
    );
    let pick = g.node(g.find("pick").unwrap());
    assert_eq!(pick.op, Op::GatherElements { axis: 1 });
    assert_eq!(pick.shape, vec![2, 5, 4]);
    let e = import(&m(None, &[2, 5, 4]), &OnnxOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("node 'scan' (CumSum)") && e.contains("run time"),
        "{e}"
    );
    let e = import(&m(Some(0), &[2, 5, 5]), &OnnxOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("node 'pick' (GatherElements)"), "{e}");
}

/// GPT-2's tanh GELU written out (the `positions` parity model: the cube by `Pow` and by two
/// products, the 0.5 applied first and last) is rewritten into one GELU each, no `Pow` or
/// `Tanh` left; onnxruntime's outputs check the values (`crates/opsched/tests/parity.rs`).
#[test]
fn written_out_tanh_gelus_are_one_operator() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/parity/positions.onnx");
    let imported = import_file(&path, &OnnxOptions::default()).unwrap();
    assert_eq!(imported.report.rewritten_patterns, 2);
    let g = &imported.graph;
    let acts: Vec<&Op> = g.nodes().iter().map(|n| &n.op).collect();
    let gelus = acts
        .iter()
        .filter(|op| match op {
            Op::Activation { act } | Op::Linear { act, .. } => *act == Activation::GeluTanh,
            _ => false,
        })
        .count();
    assert_eq!(gelus, 2, "{acts:?}");
    assert!(!acts.iter().any(|op| matches!(
        op,
        Op::Binary {
            kind: BinaryKind::Pow
        } | Op::Activation {
            act: Activation::Tanh
        }
    )));
}
