//! The opaque operator: a foreign operator known by its type name and output shape.

#![allow(clippy::unwrap_used)]

use opsched_graph::formats::json;
use opsched_graph::{DType, GraphBuilder, Op};

#[test]
fn opaque_ops_keep_their_shape_cost_their_tensors_and_round_trip() {
    let mut b = GraphBuilder::new("nms", DType::F32);
    let boxes = b.input("boxes", vec![1, 100, 4]);
    let scores = b.input("scores", vec![1, 1, 100]);
    let nms = b.op(
        "nms",
        Op::Opaque {
            op_type: "NonMaxSuppression".into(),
            shape: vec![10, 3],
        },
        &[boxes, scores],
    );
    let g = b.finish().unwrap();
    assert_eq!(g.node(nms).shape, vec![10, 3]);
    assert_eq!(g.node(nms).op.type_name(), "opaque");
    let s = g.stats(nms);
    assert_eq!(s.flops, 30);
    assert_eq!(s.bytes_read, (400 + 100) * 4);
    assert_eq!(s.bytes_written, 30 * 4);
    let text = json::to_string(&g);
    assert!(
        text.contains("\"op_type\": \"NonMaxSuppression\""),
        "{text}"
    );
    let back = json::from_str(&text).unwrap();
    assert_eq!(back.node(nms).op, g.node(nms).op);

    let zero = Op::Opaque {
        op_type: "Foo".into(),
        shape: vec![1, 0],
    };
    assert!(zero.infer_shape(&[]).unwrap_err().contains("'Foo'"));
}
