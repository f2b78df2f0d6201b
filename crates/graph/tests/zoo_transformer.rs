//! The BERT-base style Transformer encoder of the zoo.
#![allow(clippy::unwrap_used)]

use opsched_graph::zoo::{self, ZooConfig};
use opsched_graph::{summarize, Activation, DType, GraphError, Op};

fn build(batch: usize, seq: Option<usize>) -> opsched_graph::Graph {
    zoo::build(
        "transformer",
        &ZooConfig {
            batch,
            input_size: seq,
            dtype: DType::F32,
        },
    )
    .unwrap()
}

// Per layer, by hand:
// ops (21): q, k, v linear (3); their reshapes (3) and transposes (3); scores matmul (1);
//   softmax (1); context matmul (1); context transpose (1) and reshape (1); output linear (1);
//   residual add (1); layer norm (1); FFN linear + GELU (1); FFN linear (1); residual add (1);
//   layer norm (1).
// edges (25): x -> q, k, v (3); linear -> reshape (3); reshape -> transpose (3);
//   q, k -> scores (2); scores -> softmax (1); softmax, v -> context (2);
//   context -> transpose -> reshape -> output linear (3); output, x -> add (2); add -> norm (1);
//   norm -> ffn1 -> ffn2 (2); ffn2, norm -> add (2); add -> norm (1).
// Of these, 4 leave the layer input x; in layer 0 x is the graph input, whose edges IOS does
// not count: 12 * 25 - 4 = 296 operator edges, 300 edges in all.
const OPS_PER_LAYER: usize = 21;
const EDGES_PER_LAYER: usize = 25;

#[test]
fn counts_match_the_hand_derivation() {
    let g = build(1, None);
    assert_eq!(g.op_count(), 12 * OPS_PER_LAYER);
    assert_eq!(g.op_count(), 252);
    assert_eq!(g.edge_count(), 12 * EDGES_PER_LAYER - 4);
    assert_eq!(g.edge_count(), 296);
    assert_eq!(g.edges().count(), 300);
    assert_eq!(g.inputs().count(), 1);
    assert_eq!(g.blocks().len(), 12);
    for (i, b) in g.blocks().iter().enumerate() {
        assert_eq!(b.name, format!("layer{i}"));
        assert_eq!(b.nodes.len(), OPS_PER_LAYER);
    }
    let s = summarize(&g);
    let types = |t: &str| s.op_types.get(t).copied().unwrap_or(0);
    assert_eq!(types("linear"), 12 * 6);
    assert_eq!(types("reshape"), 12 * 4);
    assert_eq!(types("transpose"), 12 * 4);
    assert_eq!(types("batch_matmul"), 12 * 2);
    assert_eq!(types("softmax"), 12);
    assert_eq!(types("layer_norm"), 12 * 2);
    assert_eq!(types("elementwise"), 12 * 2);
    // q, k, v run in parallel: width is at least 3.
    assert!(s.width >= 3, "{}", s.width);
}

#[test]
fn shapes_follow_bert_base() {
    let g = build(1, None);
    let shape = |name: &str| g.node(g.find(name).unwrap()).shape.clone();
    assert_eq!(shape("input"), [1, 128, 768]);
    assert_eq!(shape("layer0_q"), [1, 128, 768]);
    assert_eq!(shape("layer0_k_reshape"), [1, 128, 12, 64]);
    assert_eq!(shape("layer0_k_transpose"), [1, 12, 128, 64]);
    assert_eq!(shape("layer0_scores"), [1, 12, 128, 128]);
    assert_eq!(shape("layer0_softmax"), [1, 12, 128, 128]);
    assert_eq!(shape("layer0_context"), [1, 12, 128, 64]);
    assert_eq!(shape("layer0_context_transpose"), [1, 128, 12, 64]);
    assert_eq!(shape("layer0_context_reshape"), [1, 128, 768]);
    assert_eq!(shape("layer5_ffn1"), [1, 128, 3072]);
    assert_eq!(shape("layer11_ffn_norm"), [1, 128, 768]);
    let scores = g.node(g.find("layer3_scores").unwrap());
    assert_eq!(
        scores.op,
        Op::BatchMatmul {
            transpose_b: true,
            alpha: 0.125
        }
    );
    let ffn1 = g.node(g.find("layer3_ffn1").unwrap());
    assert!(matches!(
        ffn1.op,
        Op::Linear {
            out_features: 3072,
            act: Activation::Gelu,
            ..
        }
    ));
    // The residual reads the layer input.
    let add = g.find("layer1_attn_residual").unwrap();
    let x = g.find("layer0_ffn_norm").unwrap();
    assert!(g.preds(add).any(|p| p == x));
}

#[test]
fn params_and_flops_are_bert_base() {
    let g = build(1, None);
    let s = summarize(&g);
    // 12 x (4 x (768^2 + 768) + 2 x 768 x 3072 + 3072 + 768 + 2 x 2 x 768) = 85,054,464.
    assert!((84_000_000..86_000_000).contains(&s.params), "{}", s.params);
    assert_eq!(s.params, 85_054_464);
    // FLOPs: 2 x params x tokens for the weights, plus q k^T and probs v: 2 x 2 x s^2 x 768
    // per layer; softmax, norms, GELU and biases add well under 1%.
    let tokens = 128u64;
    let attention = 12 * 4 * 128 * 128 * 768;
    let expect = 2 * s.params * tokens + attention;
    let ratio = s.flops as f64 / expect as f64;
    assert!((1.0..1.01).contains(&ratio), "{} vs {expect}", s.flops);
}

#[test]
fn sequence_length_and_batch_change_shapes() {
    let g = build(4, Some(32));
    let shape = |name: &str| g.node(g.find(name).unwrap()).shape.clone();
    assert_eq!(shape("input"), [4, 32, 768]);
    assert_eq!(shape("layer0_scores"), [4, 12, 32, 32]);
    assert_eq!(shape("layer0_v_transpose"), [4, 12, 32, 64]);
    assert_eq!(shape("layer11_ffn_norm"), [4, 32, 768]);
    assert_eq!(g.op_count(), 252);
    assert_eq!(g.edge_count(), 296);
    // Parameters do not depend on the input; FLOPs are linear in the batch.
    let small = summarize(&g);
    let base = summarize(&build(1, None));
    assert_eq!(small.params, base.params);
    assert_eq!(summarize(&build(2, None)).flops, 2 * base.flops);
    // Same token count (4 x 32 = 128), shorter sequences: less attention work, by exactly the
    // matmuls' 12 x 4 x (128^2 - 4 x 32^2) x 768 plus a little softmax.
    assert!(small.flops < base.flops);
    assert!(base.flops - small.flops > 12 * 4 * (128 * 128 - 4 * 32 * 32) * 768);
    // A one-token sequence still builds.
    assert_eq!(build(1, Some(1)).op_count(), 252);
    // Names are exact: `bert-base` builds nothing and points at the transformer.
    match zoo::build("bert-base", &ZooConfig::default()) {
        Err(opsched_graph::GraphError::UnknownModel(e)) => {
            assert_eq!(e.suggestions, ["transformer"], "{e}")
        }
        other => panic!("{:?}", other.map(|g| g.name)),
    }
}

#[test]
fn zero_sizes_are_errors() {
    for cfg in [
        ZooConfig {
            input_size: Some(0),
            ..ZooConfig::default()
        },
        ZooConfig {
            batch: 0,
            ..ZooConfig::default()
        },
    ] {
        let e = zoo::build("transformer", &cfg).unwrap_err();
        assert!(matches!(e, GraphError::Invalid { .. }), "{e}");
        assert!(e.to_string().contains("transformer"), "{e}");
    }
}

#[test]
fn the_scores_scale_survives_json_and_an_absent_one_is_one() {
    let g = build(1, Some(8));
    let text = opsched_graph::formats::json::to_string(&g);
    let back = opsched_graph::formats::from_str(&text).unwrap();
    assert_eq!(back.nodes(), g.nodes());
    // Graph files written before the scale existed read as unscaled products.
    let old = text.replace("\"alpha\": 0.125,", "");
    assert_ne!(old, text);
    let unscaled = opsched_graph::formats::from_str(&old).unwrap();
    let scores = unscaled.node(unscaled.find("layer0_scores").unwrap());
    assert_eq!(scores.op, Op::batch_matmul(true));
}
