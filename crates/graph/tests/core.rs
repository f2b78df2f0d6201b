//! Operators, validation, our JSON format and the structural analysis.

#![allow(clippy::unwrap_used)]

use opsched_graph::analysis::{depth, width};
use opsched_graph::formats::{self, json};
use opsched_graph::{
    Activation, Conv2d, DType, Graph, GraphBuilder, GraphError, NodeDef, NodeId, Op, Pool2d, Value,
};
use proptest::prelude::*;

fn infer(op: Op, inputs: &[&[usize]]) -> Result<Vec<usize>, String> {
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|s| s.to_vec()).collect();
    op.infer_shape(&shapes)
}

#[test]
fn conv_shapes_follow_the_usual_formula() {
    let x: &[usize] = &[2, 3, 299, 299];
    let c = Conv2d::new(32, 3).padding(0, 0).stride(2);
    assert_eq!(infer(Op::Conv2d(c), &[x]).unwrap(), vec![2, 32, 149, 149]);
    // Dilation 2 on a 3x3 spans 5 pixels.
    let c = Conv2d::new(8, 3).padding(0, 0).dilation(2);
    assert_eq!(
        infer(Op::Conv2d(c), &[&[1, 4, 10, 10]]).unwrap(),
        vec![1, 8, 6, 6]
    );
    // Rectangular kernels with same padding keep the size.
    let c = Conv2d::rect(8, 1, 7);
    assert_eq!(
        infer(Op::Conv2d(c), &[&[1, 4, 17, 17]]).unwrap(),
        vec![1, 8, 17, 17]
    );
    // Depthwise: groups = channels.
    let c = Conv2d::new(16, 3).groups(16);
    assert_eq!(
        infer(Op::Conv2d(c), &[&[1, 16, 8, 8]]).unwrap(),
        vec![1, 16, 8, 8]
    );
}

#[test]
fn conv_rejects_bad_groups_rank_and_tiny_inputs() {
    let e = infer(Op::Conv2d(Conv2d::new(16, 3).groups(3)), &[&[1, 16, 8, 8]]).unwrap_err();
    assert!(e.contains("groups"), "{e}");
    let e = infer(Op::Conv2d(Conv2d::new(16, 3)), &[&[1, 16, 8]]).unwrap_err();
    assert!(e.contains("rank-4"), "{e}");
    let e = infer(
        Op::Conv2d(Conv2d::new(16, 5).padding(0, 0)),
        &[&[1, 16, 3, 3]],
    )
    .unwrap_err();
    assert!(e.contains("window"), "{e}");
}

#[test]
fn pooling_floor_ceil_and_global() {
    let x: &[usize] = &[1, 64, 112, 112];
    assert_eq!(
        infer(Op::Pool2d(Pool2d::max(3, 2, 0)), &[x]).unwrap(),
        vec![1, 64, 55, 55]
    );
    // torchvision GoogLeNet: MaxPool2d(3, 2, ceil_mode=True) on 112 gives 56.
    assert_eq!(
        infer(Op::Pool2d(Pool2d::max(3, 2, 0).ceil()), &[x]).unwrap(),
        vec![1, 64, 56, 56]
    );
    // Ceil mode never starts a window in the right padding: 5 -> k2 s2 p1 gives 3, not 4.
    assert_eq!(
        infer(Op::Pool2d(Pool2d::max(2, 2, 1).ceil()), &[&[1, 1, 5, 5]]).unwrap(),
        vec![1, 1, 3, 3]
    );
    assert_eq!(
        infer(Op::Pool2d(Pool2d::global_avg()), &[x]).unwrap(),
        vec![1, 64, 1, 1]
    );
}

#[test]
fn sequence_ops_infer_shapes() {
    let x: &[usize] = &[2, 128, 768];
    let lin = Op::Linear {
        out_features: 3072,
        bias: true,
        act: Activation::Gelu,
    };
    assert_eq!(infer(lin, &[x]).unwrap(), vec![2, 128, 3072]);
    let q: &[usize] = &[2, 12, 128, 64];
    let bmm = Op::batch_matmul(true);
    assert_eq!(infer(bmm, &[q, q]).unwrap(), vec![2, 12, 128, 128]);
    let bad = infer(Op::batch_matmul(false), &[q, q]).unwrap_err();
    assert!(bad.contains("do not match"), "{bad}");
    assert!(infer(Op::batch_matmul(false), &[q]).is_err());
    assert_eq!(infer(Op::Softmax { axis: -1 }, &[q]).unwrap(), q.to_vec());
    assert!(infer(Op::Softmax { axis: 4 }, &[q]).is_err());
    assert_eq!(
        infer(Op::LayerNorm { eps: 1e-5 }, &[x]).unwrap(),
        x.to_vec()
    );
    let r = Op::Reshape {
        shape: vec![0, 0, 12, -1],
    };
    assert_eq!(infer(r, &[x]).unwrap(), vec![2, 128, 12, 64]);
    assert!(infer(
        Op::Reshape {
            shape: vec![0, 7, -1]
        },
        &[x]
    )
    .is_err());
    let t = Op::Transpose {
        perm: vec![0, 2, 1, 3],
    };
    assert_eq!(
        infer(t, &[&[2, 128, 12, 64]]).unwrap(),
        vec![2, 12, 128, 64]
    );
    assert!(infer(
        Op::Transpose {
            perm: vec![0, 0, 1, 2]
        },
        &[q]
    )
    .is_err());
}

#[test]
fn multi_input_ops() {
    let a: &[usize] = &[1, 8, 4, 4];
    let b: &[usize] = &[1, 24, 4, 4];
    assert_eq!(
        infer(Op::Concat { axis: 1 }, &[a, b]).unwrap(),
        vec![1, 32, 4, 4]
    );
    assert_eq!(infer(Op::Identity, &[a, b]).unwrap(), vec![1, 32, 4, 4]);
    let add = Op::Elementwise {
        kind: opsched_graph::ElementwiseKind::Add,
    };
    assert_eq!(infer(add.clone(), &[a, a, a]).unwrap(), a.to_vec());
    assert!(infer(add.clone(), &[a, b])
        .unwrap_err()
        .contains("do not broadcast"));
    // Shapes broadcast as in numpy: a squeeze-and-excitation gate, a bias, a scalar.
    assert_eq!(infer(add.clone(), &[a, &[1, 8, 1, 1]]).unwrap(), a.to_vec());
    assert_eq!(infer(add.clone(), &[&[4], a, &[]]).unwrap(), a.to_vec());
    assert_eq!(infer(add, &[&[3, 1, 5], &[2, 1]]).unwrap(), vec![3, 2, 5]);
    let sub = Op::Binary {
        kind: opsched_graph::BinaryKind::Sub,
    };
    assert_eq!(infer(sub.clone(), &[a, &[1, 1, 4, 1]]).unwrap(), a.to_vec());
    assert!(infer(sub, &[a, a, a]).unwrap_err().contains("exactly 2"));
    // Where: a condition, then, else, all broadcast (a causal mask over a batch of scores).
    let causal: &[usize] = &[6, 6];
    assert_eq!(
        infer(Op::Where, &[causal, &[2, 6, 6], &[]]).unwrap(),
        vec![2, 6, 6]
    );
    assert!(infer(Op::Where, &[a, a]).unwrap_err().contains("exactly 3"));
    assert!(infer(Op::Where, &[&[5], a, a]).is_err());
    // Expand: the term against the shape, numpy's way (the result may exceed both).
    let expand = |shape: &[usize]| Op::Expand {
        shape: shape.to_vec(),
    };
    assert_eq!(
        infer(expand(&[2, 6, 6]), &[&[2, 1, 6]]).unwrap(),
        vec![2, 6, 6]
    );
    assert_eq!(infer(expand(&[3, 1]), &[&[1, 4]]).unwrap(), vec![3, 4]);
    assert!(infer(expand(&[3]), &[&[4]]).is_err());
    assert!(infer(expand(&[3]), &[a, a])
        .unwrap_err()
        .contains("1 input"));
    // A conv on several terms reads them concatenated along channels.
    assert_eq!(
        infer(Op::Conv2d(Conv2d::new(4, 1)), &[a, b]).unwrap(),
        vec![1, 4, 4, 4]
    );
    assert!(infer(Op::Concat { axis: 1 }, &[a, &[1, 8, 5, 4]]).is_err());
}

#[test]
fn sequential_chains_its_ops_and_sums_their_counts() {
    let seq = Op::Sequential {
        ops: vec![
            Op::Activation {
                act: Activation::Relu,
            },
            Op::Conv2d(Conv2d::new(16, 3).groups(16)),
            Op::Conv2d(Conv2d::new(32, 1)),
        ],
    };
    let x = vec![1, 16, 8, 8];
    let out = seq.infer_shape(std::slice::from_ref(&x)).unwrap();
    assert_eq!(out, vec![1, 32, 8, 8]);
    let st = seq.stats(&[x], &out, DType::F32).unwrap();
    let dw = 2 * 16 * 64 * 9;
    let pw = 2 * 32 * 64 * 16;
    let relu = 16 * 64;
    assert_eq!(st.flops, dw + pw + relu);
    assert_eq!(st.params, 16 * 9 + 32 * 16);
}

#[test]
fn conv_flops_params_and_bytes() {
    let conv = Op::Conv2d(Conv2d::new(64, 3).bias(true));
    let x = vec![1, 64, 56, 56];
    let out = conv.infer_shape(std::slice::from_ref(&x)).unwrap();
    let st = conv.stats(&[x], &out, DType::F16).unwrap();
    let outs = 64 * 56 * 56;
    assert_eq!(st.flops, 2 * outs * 64 * 9 + outs);
    assert_eq!(st.params, 64 * 64 * 9 + 64);
    assert_eq!(st.bytes_read, (outs + st.params) * 2);
    assert_eq!(st.bytes_written, outs * 2);
}

/// x -> a, x -> b, (a, b) -> c: the smallest diamond.
fn diamond() -> Graph {
    let mut b = GraphBuilder::new("diamond", DType::F32);
    let x = b.input("x", vec![1, 8, 16, 16]);
    let a = b.conv("a", x, Conv2d::new(8, 3).relu());
    let p = b.pool("p", x, Pool2d::max(3, 1, 1));
    let c = b.concat("c", &[a, p]);
    b.block("tail");
    b.node(
        "d",
        Op::Conv2d(Conv2d::new(4, 1)),
        vec![vec![Value::slice(c, 0, 8), Value::slice(c, 4, 12)]],
    );
    b.finish().unwrap()
}

#[test]
fn counts_depth_width_and_slices() {
    let g = diamond();
    assert_eq!(g.op_count(), 4);
    assert_eq!(
        g.edge_count(),
        3,
        "a->c, p->c, c->d; edges from the input do not count"
    );
    assert_eq!(depth(&g), 3);
    assert_eq!(width(&g), 2);
    let d = g.find("d").unwrap();
    assert_eq!(g.node(d).shape, vec![1, 4, 16, 16]);
    // Two slices of c summed: one edge carrying both slices' bytes, one extra add per element.
    let c = g.find("c").unwrap();
    assert_eq!(g.edge(c, d).unwrap().bytes, 2 * 8 * 16 * 16 * 4);
    let st = g.stats(d);
    assert_eq!(st.flops, 2 * 4 * 256 * 8 + 8 * 256);
    assert_eq!(g.blocks().len(), 1);
    assert_eq!(g.blocks()[0].nodes, vec![d]);
}

#[test]
fn json_round_trip_keeps_everything() {
    let g = diamond();
    let text = json::to_string(&g);
    let back = formats::from_str(&text).unwrap();
    assert_eq!(back.name, g.name);
    assert_eq!(back.nodes(), g.nodes());
    assert_eq!(back.blocks(), g.blocks());
    assert_eq!(json::to_string(&back), text);
}

#[test]
fn documented_example_loads() {
    // The example of the crate docs, verbatim.
    let text = r#"{
      "format": "opsched-graph", "version": 1, "name": "tiny", "dtype": "f32",
      "nodes": [
        {"name": "x", "op": {"type": "input", "shape": [1, 3, 32, 32]}},
        {"name": "a", "op": {"type": "conv2d", "out_channels": 8, "kernel": [3, 3],
                             "padding": [1, 1], "act": "relu"}, "inputs": ["x"]},
        {"name": "b", "op": {"type": "pool2d", "kind": "max", "kernel": [3, 3],
                             "padding": [1, 1]}, "inputs": ["x"]},
        {"name": "c", "op": {"type": "concat"}, "inputs": ["a", "b"]},
        {"name": "d", "op": {"type": "conv2d", "out_channels": 4, "kernel": [1, 1]},
         "inputs": [[["c", 0, 8], ["c", 3, 11]]]}
      ],
      "blocks": [{"name": "cell0", "nodes": ["a", "b", "c"]}]
    }"#;
    let g = formats::from_str(text).unwrap();
    assert_eq!(g.op_count(), 4);
    assert_eq!(g.node(g.find("c").unwrap()).shape, vec![1, 11, 32, 32]);
    assert_eq!(g.node(g.find("d").unwrap()).shape, vec![1, 4, 32, 32]);
}

/// Swish is written `{"swish": {"alpha": a}}`; without alpha it is SiLU (alpha 1).
#[test]
fn swish_reads_its_alpha_and_defaults_to_silu() {
    let text = doc(&format!(
        r#"{X}, {{"name": "s", "op": {{"type": "activation", "act": {{"swish": {{}}}}}}, "inputs": ["x"]}},
            {{"name": "t", "op": {{"type": "activation", "act": {{"swish": {{"alpha": 1.5}}}}}}, "inputs": ["s"]}}"#
    ));
    let g = formats::from_str(&text).unwrap();
    let act = |n: &str| match &g.node(g.find(n).unwrap()).op {
        Op::Activation { act } => *act,
        other => panic!("{other:?}"),
    };
    assert_eq!(act("s"), Activation::Swish { alpha: 1.0 });
    assert_eq!(act("t"), Activation::Swish { alpha: 1.5 });
    assert_eq!(act("t").to_string(), "swish(alpha=1.5)");
    let back = formats::from_str(&json::to_string(&g)).unwrap();
    assert_eq!(back.nodes(), g.nodes());
}

fn err_of(text: &str) -> String {
    formats::from_str(text).unwrap_err().to_string()
}

fn doc(nodes: &str) -> String {
    format!(r#"{{"format": "opsched-graph", "version": 1, "name": "t", "nodes": [{nodes}]}}"#)
}

const X: &str = r#"{"name": "x", "op": {"type": "input", "shape": [1, 4, 8, 8]}}"#;

#[test]
fn bad_graphs_name_the_node() {
    let cycle = doc(&format!(
        r#"{X}, {{"name": "a", "op": {{"type": "identity"}}, "inputs": ["x", "b"]}},
            {{"name": "b", "op": {{"type": "identity"}}, "inputs": ["a"]}}"#
    ));
    let e = err_of(&cycle);
    assert!(
        e.contains("cycle") && (e.contains("'a'") || e.contains("'b'")),
        "{e}"
    );

    let dangling = doc(&format!(
        r#"{X}, {{"name": "a", "op": {{"type": "identity"}}, "inputs": ["nope"]}}"#
    ));
    assert_eq!(
        err_of(&dangling),
        "node 'a': input 'nope' is not produced by any node"
    );

    let dup = doc(&format!(r#"{X}, {X}"#));
    assert_eq!(err_of(&dup), "node 'x': duplicate node name");

    let mismatch = doc(&format!(
        r#"{X}, {{"name": "y", "op": {{"type": "input", "shape": [1, 4, 9, 8]}}}},
            {{"name": "s", "op": {{"type": "elementwise", "kind": "add"}}, "inputs": ["x", "y"]}}"#
    ));
    let e = err_of(&mismatch);
    assert!(
        e.starts_with("node 's': shapes [1, 4, 8, 8], [1, 4, 9, 8] do not broadcast"),
        "{e}"
    );

    let declared = doc(&format!(
        r#"{X}, {{"name": "r", "op": {{"type": "activation", "act": "relu"}}, "inputs": ["x"], "shape": [1, 4, 8, 9]}}"#
    ));
    assert!(err_of(&declared).starts_with("node 'r': declared output shape"));

    let slice = doc(&format!(
        r#"{X}, {{"name": "r", "op": {{"type": "identity"}}, "inputs": [["x", 2, 9]]}}"#
    ));
    let e = err_of(&slice);
    assert!(
        e.starts_with("node 'r': channel slice [2, 9) out of range"),
        "{e}"
    );

    // Numbers beyond f32 are infinities, which would poison every value after them.
    let scaled = doc(&format!(
        r#"{X}, {{"name": "m", "op": {{"type": "batch_matmul", "alpha": 1e39}}, "inputs": ["x", "x"]}}"#
    ));
    assert_eq!(err_of(&scaled), "node 'm': alpha must be a finite number");
    let leaky = doc(&format!(
        r#"{X}, {{"name": "l", "op": {{"type": "activation", "act": {{"leaky_relu": {{"alpha": -1e39}}}}}}, "inputs": ["x"]}}"#
    ));
    assert_eq!(err_of(&leaky), "node 'l': act must be a finite number");
    let celu = doc(&format!(
        r#"{X}, {{"name": "c", "op": {{"type": "activation", "act": {{"celu": {{"alpha": 0.0}}}}}}, "inputs": ["x"]}}"#
    ));
    assert_eq!(
        err_of(&celu),
        "node 'c': act: a celu's alpha must not be 0 (it divides by it)"
    );
}

#[test]
fn bad_json_is_reported_not_panicked() {
    assert!(err_of("{ not json").contains("key must be a string"));
    let unknown_op = doc(&format!(
        r#"{X}, {{"name": "a", "op": {{"type": "frobnicate"}}, "inputs": ["x"]}}"#
    ));
    assert!(err_of(&unknown_op).contains("unknown variant `frobnicate`"));
    let unknown_field = doc(&format!(
        r#"{X}, {{"name": "a", "op": {{"type": "conv2d", "out_channels": 4, "kernel": [1, 1], "colour": 3}}, "inputs": ["x"]}}"#
    ));
    assert!(err_of(&unknown_field).contains("unknown field `colour`"));
    let node_field = doc(&format!(
        r#"{X}, {{"name": "a", "op": {{"type": "identity"}}, "inputz": ["x"]}}"#
    ));
    assert!(err_of(&node_field).contains("unknown field `inputz`"));
    let future = r#"{"format": "opsched-graph", "version": 99, "name": "t", "nodes": []}"#;
    assert!(err_of(future).contains("newer"));
    assert!(err_of(r#"{"format": "pdf"}"#).contains("unrecognised graph format"));
    assert!(err_of("[1, 2]").contains("not a JSON object"));
}

#[test]
fn load_file_names_the_file() {
    let dir = std::env::temp_dir().join(format!("opsched-core-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("broken.json");
    std::fs::write(
        &path,
        doc(&format!(
            r#"{X}, {{"name": "a", "op": {{"type": "identity"}}, "inputs": ["zz"]}}"#
        )),
    )
    .unwrap();
    let e = formats::load_file(&path).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{}: node 'a': input 'zz' is not produced by any node",
            path.display()
        )
    );
    let missing = formats::load_file(dir.join("missing.json")).unwrap_err();
    assert!(matches!(missing, GraphError::Io { .. }));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn builder_reports_the_first_bad_node() {
    let mut b = GraphBuilder::new("bad", DType::F32);
    let x = b.input("x", vec![1, 4, 4, 4]);
    let y = b.conv("too_big", x, Conv2d::new(8, 7).padding(0, 0));
    b.conv("after", y, Conv2d::new(8, 1));
    match b.finish() {
        Err(GraphError::Shape { node, .. }) => assert_eq!(node, "too_big"),
        other => panic!("expected a shape error, got {other:?}"),
    }
}

/// A random DAG of abstract ops: node i reads a random subset of earlier nodes.
fn random_dag(n: usize, edges: &[(usize, usize)]) -> Graph {
    let defs = (0..n)
        .map(|i| NodeDef {
            name: format!("n{i}"),
            op: Op::Abstract {
                time_ms: 1.0,
                util: 1.0,
            },
            inputs: edges
                .iter()
                .filter(|&&(_, d)| d == i)
                .map(|&(s, _)| vec![Value::whole(NodeId(s as u32))])
                .collect(),
            declared_shape: None,
        })
        .collect();
    Graph::from_nodes("random", DType::F32, defs).unwrap()
}

fn brute_force_width(g: &Graph) -> usize {
    let n = g.len();
    let reach =
        opsched_graph::analysis::reachability(g, &(0..n as u32).map(NodeId).collect::<Vec<_>>());
    let related = |i: usize, j: usize| {
        reach[i][j / 64] >> (j % 64) & 1 == 1 || reach[j][i / 64] >> (i % 64) & 1 == 1
    };
    (0u32..1 << n)
        .filter(|mask| {
            let set: Vec<usize> = (0..n).filter(|i| mask >> i & 1 == 1).collect();
            set.iter()
                .all(|&i| set.iter().all(|&j| i == j || !related(i, j)))
        })
        .map(|m| m.count_ones() as usize)
        .max()
        .unwrap_or(0)
}

/// The width as n minus a maximum matching in the bipartite graph of the transitive closure
/// (Dilworth and Fulkerson): the textbook construction, quadratic in memory, as an oracle for
/// graphs too large to brute-force.
fn closure_matching_width(g: &Graph) -> usize {
    let ops: Vec<NodeId> = g.ops().collect();
    let n = ops.len();
    let reach = opsched_graph::analysis::reachability(g, &ops);
    let adj: Vec<Vec<usize>> = reach
        .iter()
        .map(|bits| {
            (0..n)
                .filter(|&j| bits[j / 64] >> (j % 64) & 1 == 1)
                .collect()
        })
        .collect();
    fn augment(u: usize, adj: &[Vec<usize>], m: &mut [usize], seen: &mut [bool]) -> bool {
        for &v in &adj[u] {
            if !seen[v] {
                seen[v] = true;
                if m[v] == usize::MAX || augment(m[v], adj, m, seen) {
                    m[v] = u;
                    return true;
                }
            }
        }
        false
    }
    let mut m = vec![usize::MAX; n];
    let matched = (0..n)
        .filter(|&u| augment(u, &adj, &mut m, &mut vec![false; n]))
        .count();
    n - matched
}

fn dag_strategy(max_n: usize) -> impl Strategy<Value = (usize, Vec<(usize, usize)>)> {
    (1..=max_n).prop_flat_map(|n| {
        let pairs: Vec<(usize, usize)> = (0..n).flat_map(|d| (0..d).map(move |s| (s, d))).collect();
        let len = pairs.len();
        (Just(n), proptest::sample::subsequence(pairs, 0..=len))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn width_is_the_maximum_antichain((n, edges) in dag_strategy(10)) {
        let g = random_dag(n, &edges);
        prop_assert_eq!(width(&g), brute_force_width(&g));
        // Mirsky: the ops split into `depth` antichains, each at most `width` large.
        prop_assert!(depth(&g) * width(&g) >= n);
        prop_assert_eq!(g.edge_count(), edges.len());
    }

    #[test]
    fn width_matches_the_closure_matching_on_larger_dags(
        (n, edges) in (2usize..90).prop_flat_map(|n| {
            let pairs = proptest::collection::vec((0..n, 0..n), 0..3 * n);
            (Just(n), pairs)
        })
    ) {
        let edges: Vec<(usize, usize)> = edges
            .into_iter()
            .filter(|(a, b)| a < b)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let g = random_dag(n, &edges);
        prop_assert_eq!(width(&g), closure_matching_width(&g));
    }

    #[test]
    fn json_round_trip_on_random_dags((n, edges) in dag_strategy(30)) {
        let g = random_dag(n, &edges);
        let back = formats::from_str(&json::to_string(&g)).unwrap();
        prop_assert_eq!(back.nodes(), g.nodes());
        prop_assert_eq!(back.edge_count(), g.edge_count());
    }

    #[test]
    fn topo_order_respects_every_edge((n, edges) in dag_strategy(30)) {
        let g = random_dag(n, &edges);
        let mut pos = vec![0; n];
        for (i, id) in g.topo_order().iter().enumerate() {
            pos[id.index()] = i;
        }
        for (s, d, _) in g.edges() {
            prop_assert!(pos[s.index()] < pos[d.index()]);
        }
    }
}

/// DOT is an export format; its round trip is structural: reading the edges back from the DOT
/// text gives exactly the graph's edges, and every node appears once.
#[test]
fn dot_round_trips_the_structure_of_every_zoo_model() {
    use opsched_graph::formats::dot;
    use opsched_graph::zoo::{models, ZooConfig};
    for m in models() {
        let g = m.build(&ZooConfig::default()).unwrap();
        let text = dot::to_dot(&g);
        let parse_id = |s: &str| s.trim().trim_start_matches('n').parse::<u32>().ok();
        let mut edges: Vec<(u32, u32)> = text
            .lines()
            .filter_map(|l| {
                let (a, rest) = l.split_once("->")?;
                let b = rest.split('[').next()?.trim().trim_end_matches(';');
                Some((parse_id(a)?, parse_id(b)?))
            })
            .collect();
        edges.sort_unstable();
        let mut want: Vec<(u32, u32)> = g.edges().map(|(s, d, _)| (s.0, d.0)).collect();
        want.sort_unstable();
        assert_eq!(edges, want, "{}", m.name);
        let declared = text
            .lines()
            .filter(|l| {
                l.trim_start().starts_with('n') && !l.contains("->") && l.contains("[label=")
            })
            .count();
        assert_eq!(declared, g.len(), "{}", m.name);
    }
}

#[test]
fn absurd_shapes_are_refused_not_overflowed() {
    // 2^62 * 4 elements overflow u64; 2^41 elements are merely absurd.
    for shape in ["[4, 4611686018427387904]", "[2, 1099511627776]"] {
        let text = doc(&format!(
            r#"{{"name": "x", "op": {{"type": "input", "shape": {shape}}}}},
               {{"name": "r", "op": {{"type": "reshape", "shape": [-1]}}, "inputs": ["x"]}}"#
        ));
        let e = err_of(&text);
        assert!(
            e.starts_with("node 'x': output shape") && e.contains("2^40"),
            "{e}"
        );
    }
}

/// A token-id lookup appends the table's width to the ids' shape and reads the rows it copies,
/// not its whole table (a BERT vocabulary: 94 MB).
#[test]
fn an_embedding_reads_the_rows_it_copies() {
    let op = Op::Embedding {
        rows: 30522,
        dim: 768,
    };
    let ids = vec![2, 128];
    let out = op.infer_shape(std::slice::from_ref(&ids)).unwrap();
    assert_eq!(out, vec![2, 128, 768]);
    let s = op.stats(&[ids], &out, DType::F32).unwrap();
    assert_eq!(s.params, 30522 * 768);
    assert_eq!(s.bytes_read, (2 * 128 + 2 * 128 * 768) * 4);
    assert_eq!(s.bytes_written, 2 * 128 * 768 * 4);
    let empty = Op::Embedding { rows: 0, dim: 4 };
    assert!(empty.infer_shape(&[vec![3]]).unwrap_err().contains("empty"));
}

/// The comparisons give 1.0 where they hold and 0.0 elsewhere (NaN compares false, as in
/// ONNX), and their names round-trip through the graph format's snake case.
#[test]
fn comparisons_are_masks_of_ones_and_zeros() {
    use opsched_graph::BinaryKind::{self, *};
    let cases: [(BinaryKind, [f32; 3], &str); 5] = [
        (Equal, [1.0, 0.0, 0.0], "\"equal\""),
        (Less, [0.0, 1.0, 0.0], "\"less\""),
        (Greater, [0.0, 0.0, 1.0], "\"greater\""),
        (LessOrEqual, [1.0, 1.0, 0.0], "\"less_or_equal\""),
        (GreaterOrEqual, [1.0, 0.0, 1.0], "\"greater_or_equal\""),
    ];
    assert_eq!(NotEqual.apply(1.0, 0.0), 1.0);
    assert_eq!(NotEqual.apply(1.0, 1.0), 0.0);
    // NaN is unequal to everything (ONNX's Xor never sees one: booleans are 0 and 1).
    assert_eq!(NotEqual.apply(f32::NAN, 2.0), 1.0);
    for (kind, want, name) in cases {
        // 2 against 2, 1 and 3.
        let got = [2.0, 1.0, 3.0].map(|a| kind.apply(a, 2.0));
        assert_eq!(got, want, "{kind:?}");
        assert_eq!(kind.apply(f32::NAN, 2.0), 0.0, "{kind:?}");
        assert_eq!(serde_json::to_string(&kind).unwrap(), name);
        assert_eq!(serde_json::from_str::<BinaryKind>(name).unwrap(), kind);
    }
    assert_eq!(Sub.apply(5.0, 2.0), 3.0);
    assert_eq!(serde_json::to_string(&Sub).unwrap(), "\"sub\"");
    // Where selects by any value other than 0, NaN included.
    use opsched_graph::op::select;
    assert_eq!(select(1.0, 2.0, 3.0), 2.0);
    assert_eq!(select(0.0, 2.0, 3.0), 3.0);
    assert_eq!(select(-0.0, 2.0, 3.0), 3.0);
    assert_eq!(select(f32::NAN, 2.0, 3.0), 2.0);
}

/// Every reduction kind: its name in the graph JSON (snake case) reads back as itself, each
/// index kind's first and last ties apart, and an index kind's fold keeps the best value.
#[test]
fn reduce_kinds_round_trip_and_index_kinds_pick_the_best() {
    let mut names = std::collections::HashSet::new();
    for kind in opsched_graph::ReduceKind::ALL {
        let name = serde_json::to_string(&kind).unwrap();
        assert!(names.insert(name.clone()), "{name} twice");
        let back: opsched_graph::ReduceKind = serde_json::from_str(&name).unwrap();
        assert_eq!(back, kind);
        assert_eq!(
            kind.code(),
            names.len() as i32 - 1,
            "{name}: codes in ALL's order"
        );
    }
    assert_eq!(
        serde_json::to_string(&opsched_graph::ReduceKind::LastArgMax).unwrap(),
        "\"last_arg_max\""
    );
    // Index kinds over [3, 1, 3, 1]: the first or last of the largest or smallest.
    let x = [3.0f32, 1.0, 3.0, 1.0];
    for (kind, want) in [
        (opsched_graph::ReduceKind::ArgMax, 0),
        (opsched_graph::ReduceKind::LastArgMax, 2),
        (opsched_graph::ReduceKind::ArgMin, 1),
        (opsched_graph::ReduceKind::LastArgMin, 3),
    ] {
        let (mut best, mut at) = (kind.start(), 0);
        for (i, &v) in x.iter().enumerate() {
            if kind.replaces(v, best) {
                at = i;
            }
            best = kind.step(best, v);
        }
        assert_eq!(at, want, "{kind:?}");
        assert!(kind.is_index() && !opsched_graph::ReduceKind::Max.is_index());
    }
}

/// Activations are equal, and hash alike, exactly when their variant and parameters are the
/// same bit for bit: a NaN parameter equals itself, a clip without a bound is not a clip
/// bounded at infinity, each detector flag counts, and variants with the same parameters
/// differ.
#[test]
fn activations_compare_by_variant_and_parameter_bits() {
    use std::collections::HashSet;
    let nan = Activation::LeakyRelu { alpha: f32::NAN };
    assert_eq!(nan, nan);
    let clip = |min| Activation::Clip {
        min,
        max: Some(6.0),
    };
    assert_ne!(clip(None), clip(Some(f32::NEG_INFINITY)));
    assert_ne!(clip(Some(0.0)), clip(Some(-0.0)));
    let inf = |negative, positive| Activation::IsInf { negative, positive };
    let distinct = [
        Activation::None,
        Activation::Relu,
        Activation::Elu { alpha: 1.0 },
        Activation::Celu { alpha: 1.0 },
        Activation::ThresholdedRelu { alpha: 1.0 },
        Activation::Swish { alpha: 1.0 },
        Activation::LeakyRelu { alpha: 1.0 },
        Activation::Selu {
            alpha: 1.0,
            gamma: 2.0,
        },
        Activation::Selu {
            alpha: 2.0,
            gamma: 1.0,
        },
        Activation::HardSigmoid {
            alpha: 1.0,
            beta: 2.0,
        },
        inf(true, true),
        inf(true, false),
        inf(false, true),
        inf(false, false),
        clip(None),
        clip(Some(0.0)),
        nan,
    ];
    let set: HashSet<Activation> = distinct.iter().copied().collect();
    assert_eq!(set.len(), distinct.len());
    assert!(distinct.iter().all(|a| set.contains(a)));
}
