//! Absurd sizes from a file are errors naming the node, never a wrapped count, a panic or a
//! huge allocation; counts that fit are exact (compared with 128-bit arithmetic).

#![allow(clippy::unwrap_used)]

use opsched_graph::formats::json;
use opsched_graph::limits::{MAX_ELEMENTS, MAX_PARAM};
use opsched_graph::{Conv2d, DType, Graph, GraphError, NodeDef, NodeId, Op, Value};
use proptest::prelude::*;

/// A graph `x -> a` of one operator on an input of `shape`.
fn one_op(shape: Vec<usize>, op: Op) -> Result<Graph, GraphError> {
    Graph::from_nodes(
        "t",
        DType::F32,
        vec![
            NodeDef {
                name: "x".into(),
                op: Op::Input { shape },
                inputs: vec![],
                declared_shape: None,
            },
            NodeDef {
                name: "a".into(),
                op,
                inputs: vec![vec![Value::whole(NodeId(0))]],
                declared_shape: None,
            },
        ],
    )
}

fn node_error(r: Result<Graph, GraphError>, node: &str) -> String {
    let Err(e) = r else {
        panic!("expected an error naming node '{node}'")
    };
    let text = e.to_string();
    assert!(text.starts_with(&format!("node '{node}': ")), "{text}");
    text
}

#[test]
fn huge_parameters_are_refused_by_name() {
    let x = vec![1, 3, 8, 8];
    let pads = Conv2d::new(4, 3).padding(1 << 40, 1 << 40);
    let e = node_error(one_op(x.clone(), Op::Conv2d(pads)), "a");
    assert!(e.contains("padding"), "{e}");
    let e = node_error(
        one_op(x.clone(), Op::Conv2d(Conv2d::new(MAX_PARAM + 1, 1))),
        "a",
    );
    assert!(e.contains("out_channels"), "{e}");
    let pool = opsched_graph::Pool2d::max(3, usize::MAX, 1);
    let e = node_error(one_op(x.clone(), Op::Pool2d(pool)), "a");
    assert!(e.contains("stride"), "{e}");
    let lin = Op::Linear {
        out_features: usize::MAX,
        bias: true,
        act: Default::default(),
    };
    let e = node_error(one_op(vec![1, 16], lin), "a");
    assert!(e.contains("out_features"), "{e}");
}

#[test]
fn shapes_past_the_element_limit_are_refused_before_counting() {
    let e = node_error(
        Graph::from_nodes(
            "t",
            DType::F32,
            vec![NodeDef {
                name: "x".into(),
                op: Op::Input {
                    shape: vec![1 << 30, 1 << 30, 1 << 30],
                },
                inputs: vec![],
                declared_shape: None,
            }],
        ),
        "x",
    );
    assert!(e.contains("2^40"), "{e}");
    // A reshape to 2^62 elements, a concat whose axis overflows.
    let e = node_error(
        one_op(
            vec![1, 4],
            Op::Reshape {
                shape: vec![1 << 31, 1 << 31, -1],
            },
        ),
        "a",
    );
    assert!(e.contains("reshape"), "{e}");
    let e = node_error(
        one_op(
            vec![1, 4],
            Op::Reshape {
                shape: vec![i64::MAX, i64::MAX],
            },
        ),
        "a",
    );
    assert!(e.contains("reshape"), "{e}");
}

#[test]
fn a_file_with_absurd_sizes_names_the_node() {
    let text = format!(
        r#"{{"format": "opsched-graph", "version": 1, "name": "t", "nodes": [
            {{"name": "x", "op": {{"type": "input", "shape": [1, 8, 16, 16]}}}},
            {{"name": "big", "op": {{"type": "conv2d", "out_channels": 8,
              "kernel": [{k}, {k}], "padding": [{p}, {p}]}}, "inputs": ["x"]}}]}}"#,
        k = 1u64 << 20,
        p = 1u64 << 20
    );
    let e = json::from_str(&text).unwrap_err().to_string();
    assert!(e.starts_with("node 'big': "), "{e}");
}

#[test]
fn dag_times_that_could_sum_to_infinity_are_refused() {
    use opsched_graph::formats::dag;
    // Finite, but two of them add up to infinity in f64.
    let text = r#"{"format": "opsched-dag", "ops": [{"id": 1, "time_ms": 1e308},
        {"id": 2, "time_ms": 1e308}], "edges": [{"src": 1, "dst": 2}]}"#;
    let e = dag::from_str(text).unwrap_err().to_string();
    assert!(e.starts_with("op 1: time_ms 1e308 exceeds"), "{e}");
    let text = r#"{"format": "opsched-dag", "ops": [{"id": 1, "time_ms": 1},
        {"id": 2, "time_ms": 1}], "edges": [{"src": 1, "dst": 2, "transfer_ms": 1e12}]}"#;
    let e = dag::from_str(text).unwrap_err().to_string();
    assert!(e.starts_with("edge 1 -> 2: transfer_ms"), "{e}");
    // The same bound holds for abstract operators in our graph JSON.
    let text = r#"{"format": "opsched-graph", "version": 1, "name": "t", "nodes": [
        {"name": "a", "op": {"type": "abstract", "time_ms": 1e300}}]}"#;
    let e = json::from_str(text).unwrap_err().to_string();
    assert!(e.starts_with("node 'a': time_ms"), "{e}");
}

/// The exact FLOPs of a convolution as the module docs define them, in 128 bits.
#[allow(clippy::too_many_arguments)] // the formula's own variables, named as in the docs
fn conv_flops(
    n: u128,
    cin: u128,
    oc: u128,
    k: u128,
    groups: u128,
    oh: u128,
    ow: u128,
    bias: bool,
) -> u128 {
    let out = n * oc * oh * ow;
    2 * out * (cin / groups * k * k) + if bias { out } else { 0 }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Random, often absurd, convolutions: the graph either refuses them naming the node or
    /// counts exactly what 128-bit arithmetic counts (no wrapped number with success).
    #[test]
    fn conv_counts_are_exact_or_refused(
        n in 1usize..1 << 7,
        cin_per_group in 1usize..1 << 13,
        groups in 1usize..8,
        oc_per_group in 1usize..1 << 13,
        k in 1usize..1 << 7,
        pad in 0usize..1 << 7,
        side in 1usize..1 << 10,
        bias: bool,
    ) {
        let cin = cin_per_group * groups;
        let oc = oc_per_group * groups;
        let conv = Conv2d::new(oc, k).padding(pad, pad).groups(groups).bias(bias);
        match one_op(vec![n, cin, side, side], Op::Conv2d(conv)) {
            Ok(g) => {
                let a = g.find("a").unwrap();
                let shape = &g.node(a).shape;
                let elems: u128 = shape.iter().map(|&d| d as u128).product();
                prop_assert!(elems <= u128::from(MAX_ELEMENTS));
                let want = conv_flops(
                    n as u128, cin as u128, oc as u128, k as u128, groups as u128,
                    shape[2] as u128, shape[3] as u128, bias,
                );
                prop_assert_eq!(u128::from(g.stats(a).flops), want);
            }
            Err(e) => {
                let text = e.to_string();
                prop_assert!(text.starts_with("node '"), "{}", text);
                // Only an overflowing count, a too-large output or a window larger than the
                // padded input is refused.
                prop_assert!(
                    text.contains("overflows") || text.contains("2^40") || text.contains("window"),
                    "{}", text
                );
            }
        }
    }
}
