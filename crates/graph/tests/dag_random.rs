//! Cost-annotated DAG JSON and the seeded layered random DAGs.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use opsched_graph::analysis::depth;
use opsched_graph::formats::{self, dag};
use opsched_graph::random::{layered_dag, LayeredDagParams};
use opsched_graph::{Graph, GraphError, NodeId, Op};
use proptest::prelude::*;
use serde_json::json;

fn abstract_of(g: &Graph, id: NodeId) -> (f64, f64) {
    match g.node(id).op {
        Op::Abstract { time_ms, util } => (time_ms, util),
        ref other => panic!("not abstract: {other:?}"),
    }
}

fn err_of(doc: serde_json::Value) -> String {
    dag::from_value(doc).expect_err("must fail").to_string()
}

/// A diamond with ids in reverse topological order: 9 -> {5, 4} -> 0.
fn reverse_diamond() -> serde_json::Value {
    json!({
        "format": "opsched-dag", "name": "diamond",
        "ops": [
            {"id": 0, "time_ms": 0.5},
            {"id": 4, "time_ms": 2.0, "util": 0.6},
            {"id": 5, "time_ms": 1.5, "util": 0.9},
            {"id": 9, "time_ms": 1.0, "util": 0.8}
        ],
        "edges": [
            {"src": 9, "dst": 5, "transfer_ms": 0.3},
            {"src": 9, "dst": 4},
            {"src": 5, "dst": 0, "transfer_ms": 1.25},
            {"src": 4, "dst": 0, "transfer_ms": 0.1}
        ]
    })
}

#[test]
fn dag_reads_ids_in_reverse_topological_order() {
    let g = dag::from_value(reverse_diamond()).unwrap();
    assert_eq!(g.name, "diamond");
    assert_eq!(g.op_count(), 4);
    assert_eq!(g.edge_count(), 4);
    let id = |name: &str| g.find(name).unwrap();
    // Nodes are named by id; the topological order starts at 9 and ends at 0.
    let topo: Vec<&str> = g
        .topo_order()
        .iter()
        .map(|&n| g.node(n).name.as_str())
        .collect();
    assert_eq!(topo.first(), Some(&"9"));
    assert_eq!(topo.last(), Some(&"0"));
    assert_eq!(abstract_of(&g, id("0")), (0.5, 1.0)); // util defaults to 1
    assert_eq!(abstract_of(&g, id("4")), (2.0, 0.6));
    let mut preds: Vec<&str> = g.preds(id("0")).map(|p| g.node(p).name.as_str()).collect();
    preds.sort();
    assert_eq!(preds, ["4", "5"]);
    assert_eq!(g.node(id("0")).inputs.len(), 2);
    // Every edge has a transfer time; a missing one reads as 0.
    assert!(g.edges().all(|(_, _, e)| e.transfer_ms.is_some()));
    assert_eq!(g.edge(id("9"), id("4")).unwrap().transfer_ms, Some(0.0));
    assert_eq!(g.edge(id("5"), id("0")).unwrap().transfer_ms, Some(1.25));
}

#[test]
fn dag_round_trips() {
    let g = dag::from_value(reverse_diamond()).unwrap();
    let text = dag::to_string(&g).unwrap();
    let h = dag::from_str(&text).unwrap();
    assert_eq!(dag::to_value(&h).unwrap(), dag::to_value(&g).unwrap());
    assert_eq!(h.name, g.name);
    for n in g.nodes() {
        let m = h.find(&n.name).unwrap();
        assert_eq!(h.node(m).op, n.op);
    }
    let edges = |g: &Graph| {
        let mut v: Vec<(String, String, Option<f64>)> = g
            .edges()
            .map(|(s, d, e)| {
                (
                    g.node(s).name.clone(),
                    g.node(d).name.clone(),
                    e.transfer_ms,
                )
            })
            .collect();
        v.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        v
    };
    assert_eq!(edges(&g), edges(&h));
    // The written document has exactly the documented shape.
    let doc = dag::to_value(&g).unwrap();
    assert_eq!(doc["format"], "opsched-dag");
    assert_eq!(doc["ops"].as_array().unwrap().len(), 4);
    assert_eq!(doc["edges"][0].as_object().unwrap().len(), 3);
}

#[test]
fn dag_is_detected_by_load_file() {
    let path = std::env::temp_dir().join(format!(
        "opsched-dag-test-{}-{:?}.json",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&path, reverse_diamond().to_string()).unwrap();
    let g = formats::load_file(&path);
    let bad = {
        let mut doc = reverse_diamond();
        doc["edges"][0]["dst"] = json!(99);
        std::fs::write(&path, doc.to_string()).unwrap();
        formats::load_file(&path)
    };
    std::fs::remove_file(&path).unwrap();
    let g = g.unwrap();
    assert_eq!(g.op_count(), 4);
    assert_eq!(
        formats::detect(&reverse_diamond()).unwrap(),
        formats::Format::Dag
    );
    let e = bad.unwrap_err().to_string();
    assert!(e.contains(path.to_str().unwrap()), "{e}");
    assert!(e.contains("edge 9 -> 99: unknown op 99"), "{e}");
}

#[test]
fn dag_errors_name_the_op_or_edge() {
    let with = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut d = reverse_diamond();
        f(&mut d);
        err_of(d)
    };
    let e = with(&|d| d["ops"][1]["id"] = json!(0));
    assert!(e.contains("op 0") && e.contains("duplicate"), "{e}");
    let e = with(&|d| d["edges"][1]["src"] = json!(7));
    assert_eq!(e, "edge 7 -> 4: unknown op 7");
    let e = with(&|d| d["edges"][0]["dst"] = json!(99));
    assert_eq!(e, "edge 9 -> 99: unknown op 99");
    let e = with(&|d| d["edges"][0]["dst"] = json!(9));
    assert!(e.contains("edge 9 -> 9") && e.contains("self loop"), "{e}");
    let e = with(&|d| d["edges"][1]["dst"] = json!(5));
    assert!(
        e.contains("edge 9 -> 5") && e.contains("duplicate edge"),
        "{e}"
    );
    let e = with(&|d| {
        d["edges"]
            .as_array_mut()
            .unwrap()
            .push(json!({"src": 0, "dst": 9}))
    });
    assert!(e.contains("cycle"), "{e}");
    let e = with(&|d| d["ops"][2]["time_ms"] = json!(-1.0));
    assert!(e.contains("op 5") && e.contains("time_ms"), "{e}");
    for u in [0.0, -0.5, 1.5] {
        let e = with(&|d| d["ops"][3]["util"] = json!(u));
        assert!(e.contains("op 9") && e.contains("util"), "{e}");
    }
    let e = with(&|d| d["edges"][2]["transfer_ms"] = json!(-0.1));
    assert!(
        e.contains("edge 5 -> 0") && e.contains("transfer_ms"),
        "{e}"
    );
    let e = with(&|d| d["ops"][0]["cost"] = json!(1));
    assert!(e.contains("op #0") && e.contains("cost"), "{e}");
    let e = with(&|d| d["edges"][3]["weight"] = json!(1));
    assert!(e.contains("edge #3") && e.contains("weight"), "{e}");
    let e = with(&|d| d["ops"][0]["id"] = json!(-3));
    assert!(e.contains("op #0"), "{e}");
    let e = with(&|d| d["extra"] = json!(1));
    assert!(e.contains("extra"), "{e}");
    // None of these is single-line only by accident.
    assert!(!e.contains('\n'));
}

#[test]
fn dag_writer_rejects_non_abstract_graphs() {
    let g = opsched_graph::zoo::build("transformer", &Default::default()).unwrap();
    let e = dag::to_value(&g).unwrap_err().to_string();
    assert!(e.contains("abstract"), "{e}");
    // Abstract ops with a non-integer name.
    let defs = vec![opsched_graph::NodeDef {
        name: "a".into(),
        op: Op::Abstract {
            time_ms: 1.0,
            util: 1.0,
        },
        inputs: vec![],
        declared_shape: None,
    }];
    let g = Graph::from_nodes("x", Default::default(), defs).unwrap();
    let e = dag::to_value(&g).unwrap_err().to_string();
    assert!(e.contains("node 'a'"), "{e}");
}

/// Layer of every op recovered from the generator's guarantee: the longest path (in ops)
/// ending at an op, minus one.
fn levels(g: &Graph) -> Vec<usize> {
    let mut level = vec![0usize; g.len()];
    for &n in g.topo_order() {
        level[n.index()] = g.preds(n).map(|p| level[p.index()] + 1).max().unwrap_or(0);
    }
    level
}

fn check_layered(g: &Graph, p: &LayeredDagParams) {
    assert_eq!(g.op_count(), p.ops);
    assert_eq!(g.len(), p.ops);
    assert_eq!(g.edge_count(), p.edges);
    // Exactly `layers` levels, each non-empty; every op outside level 0 has a predecessor one
    // level below (so edges go upwards and the layering is the generator's).
    assert_eq!(depth(g), p.layers);
    let level = levels(g);
    let mut per_level = vec![0usize; p.layers];
    for &l in &level {
        per_level[l] += 1;
    }
    assert!(per_level.iter().all(|&c| c > 0), "{per_level:?}");
    for (s, d, e) in g.edges() {
        assert!(level[s.index()] < level[d.index()]);
        let (t, _) = abstract_of(g, s);
        let want = p.min_transfer_ms.max(p.transfer_ratio * t);
        assert_eq!(e.transfer_ms, Some(want));
    }
    // Ids: node k is named "k", covering 0..n.
    for (k, n) in g.nodes().iter().enumerate() {
        assert_eq!(n.name, k.to_string());
        let (t, u) = abstract_of(g, NodeId(k as u32));
        assert!(
            t >= p.time_ms.0 && (t < p.time_ms.1 || t == p.time_ms.0),
            "{t}"
        );
        assert!(
            u >= p.util.0 && (u < p.util.1 || u == p.util.0) && u <= 1.0,
            "{u}"
        );
    }
}

#[test]
fn default_layered_dag_matches_the_paper_setup() {
    let p = LayeredDagParams::default();
    assert_eq!((p.ops, p.layers, p.edges), (200, 14, 400));
    assert_eq!((p.time_ms, p.util), ((0.1, 4.0), (0.6, 1.0)));
    assert_eq!((p.transfer_ratio, p.min_transfer_ms), (0.8, 0.1));
    for seed in 0..5 {
        let p = LayeredDagParams {
            seed,
            ..Default::default()
        };
        let g = layered_dag(&p).unwrap();
        check_layered(&g, &p);
        // Ids are not a topological order: some edge goes from a larger id to a smaller one.
        assert!(g.edges().any(|(s, d, _)| s.index() > d.index()));
        // Times spread over the range.
        let times: Vec<f64> = (0..200).map(|k| abstract_of(&g, NodeId(k)).0).collect();
        let mean = times.iter().sum::<f64>() / 200.0;
        assert!((1.6..2.5).contains(&mean), "{mean}");
        // And the result is a valid DAG document.
        let h = dag::from_value(dag::to_value(&g).unwrap()).unwrap();
        assert_eq!(dag::to_value(&h).unwrap(), dag::to_value(&g).unwrap());
    }
}

#[test]
fn layered_dag_is_deterministic_per_seed() {
    let p = LayeredDagParams::default();
    let a = dag::to_value(&layered_dag(&p).unwrap()).unwrap();
    let b = dag::to_value(&layered_dag(&p).unwrap()).unwrap();
    assert_eq!(a, b);
    let c = dag::to_value(&layered_dag(&LayeredDagParams { seed: 1, ..p }).unwrap()).unwrap();
    assert_ne!(a["ops"], c["ops"]);
    assert_ne!(a["edges"], c["edges"]);
}

#[test]
fn layered_dag_dense_and_sparse_extremes() {
    // Every op of layer > 0 has exactly one predecessor: ops - |layer 0| edges. With one op
    // per layer that is a chain.
    let p = LayeredDagParams {
        ops: 6,
        layers: 6,
        edges: 5,
        ..Default::default()
    };
    let g = layered_dag(&p).unwrap();
    check_layered(&g, &p);
    // All 15 pairs of a 6-op chain of layers: the full transitive tournament.
    let p = LayeredDagParams { edges: 15, ..p };
    check_layered(&layered_dag(&p).unwrap(), &p);
    // A single layer has no edges.
    let p = LayeredDagParams {
        ops: 5,
        layers: 1,
        edges: 0,
        ..Default::default()
    };
    let g = layered_dag(&p).unwrap();
    check_layered(&g, &p);
    // Fixed ranges give fixed values.
    let p = LayeredDagParams {
        ops: 20,
        layers: 4,
        edges: 30,
        time_ms: (2.0, 2.0),
        util: (1.0, 1.0),
        seed: 3,
        ..Default::default()
    };
    let g = layered_dag(&p).unwrap();
    check_layered(&g, &p);
    assert!(g.edges().all(|(_, _, e)| e.transfer_ms == Some(1.6)));
}

#[test]
fn infeasible_layered_params_are_errors() {
    let base = LayeredDagParams::default();
    let cases = [
        LayeredDagParams {
            edges: 100,
            ..base.clone()
        },
        LayeredDagParams {
            edges: 20_000,
            ..base.clone()
        },
        LayeredDagParams {
            ops: 0,
            ..base.clone()
        },
        LayeredDagParams {
            layers: 0,
            ..base.clone()
        },
        LayeredDagParams {
            layers: 201,
            ..base.clone()
        },
        LayeredDagParams {
            ops: 5,
            layers: 1,
            edges: 1,
            ..base.clone()
        },
        LayeredDagParams {
            time_ms: (4.0, 0.1),
            ..base.clone()
        },
        LayeredDagParams {
            time_ms: (-1.0, 0.1),
            ..base.clone()
        },
        LayeredDagParams {
            util: (0.0, 1.0),
            ..base.clone()
        },
        LayeredDagParams {
            util: (0.6, 1.5),
            ..base.clone()
        },
        LayeredDagParams {
            transfer_ratio: f64::NAN,
            ..base.clone()
        },
        LayeredDagParams {
            min_transfer_ms: -0.1,
            ..base.clone()
        },
    ];
    for p in cases {
        match layered_dag(&p) {
            Err(e @ GraphError::Invalid { .. }) => {
                let s = e.to_string();
                assert!(s.starts_with("layered_dag: "), "{s}");
                assert!(!s.contains('\n'), "{s}");
            }
            other => panic!("{p:?} gave {other:?}"),
        }
    }
    let e = layered_dag(&LayeredDagParams {
        edges: 100,
        ..base.clone()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("predecessor"), "{e}");
    let e = layered_dag(&LayeredDagParams {
        edges: 20_000,
        ..base
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("possible"), "{e}");
}

fn max_edges_any_seed(n: usize, l: usize) -> usize {
    // The fewest cross-layer pairs: one layer of n - l + 1 ops, the others of one.
    (n * n - (l - 1) - (n - l + 1) * (n - l + 1)) / 2
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn layered_dag_properties(
        seed in any::<u64>(),
        n in 1usize..40,
        l_frac in 0.0f64..1.0,
        e_frac in 0.0f64..1.0,
    ) {
        let layers = 1 + ((n - 1) as f64 * l_frac) as usize;
        let lo = n - 1;
        let hi = max_edges_any_seed(n, layers);
        prop_assume!(layers == 1 || lo <= hi);
        let edges = if layers == 1 { 0 } else { lo + ((hi - lo) as f64 * e_frac) as usize };
        let p = LayeredDagParams { ops: n, layers, edges, seed, ..Default::default() };
        let g = layered_dag(&p).unwrap();
        check_layered(&g, &p);
        let again = layered_dag(&p).unwrap();
        prop_assert_eq!(dag::to_value(&g).unwrap(), dag::to_value(&again).unwrap());
        // Names are ids: a map from name to node is the identity.
        let by_name: HashMap<String, usize> =
            g.nodes().iter().enumerate().map(|(i, n)| (n.name.clone(), i)).collect();
        prop_assert!(by_name.iter().all(|(k, &i)| k == &i.to_string()));
    }

    #[test]
    fn layered_dag_never_panics(
        seed in any::<u64>(),
        n in 0usize..30,
        layers in 0usize..32,
        edges in 0usize..500,
    ) {
        let p = LayeredDagParams { ops: n, layers, edges, seed, ..Default::default() };
        if let Ok(g) = layered_dag(&p) {
            check_layered(&g, &p);
        }
    }
}

#[test]
fn layered_dag_scales() {
    // Sparse and dense requests on larger graphs (both edge-sampling paths; 4500 of at most
    // 4800 pairs between three layers).
    for (ops, layers, edges) in [(3000, 60, 12_000), (120, 3, 4500)] {
        let p = LayeredDagParams {
            ops,
            layers,
            edges,
            seed: 11,
            ..Default::default()
        };
        check_layered(&layered_dag(&p).unwrap(), &p);
    }
}
