//! IOS graph JSON import/export and DOT export.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;

use opsched_graph::formats::{self, dot, ios, json};
use opsched_graph::{Activation, ElementwiseKind, Graph, NodeId, Op, PoolKind, Value};
use serde_json::json;

const V100: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/ios/v100.json");
const K80: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/ios/k80.json");

fn fixture_doc(path: &str) -> serde_json::Value {
    assert!(
        std::path::Path::new(path).exists(),
        "fixture {path} is missing"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn load(path: &str) -> Graph {
    ios::from_value(fixture_doc(path)).unwrap()
}

fn id(g: &Graph, name: &str) -> NodeId {
    g.find(name).unwrap_or_else(|| panic!("no node '{name}'"))
}

fn names(g: &Graph, ids: &[NodeId]) -> Vec<String> {
    ids.iter().map(|&n| g.node(n).name.clone()).collect()
}

/// Edges by names, with their payload bytes.
fn edge_set(g: &Graph) -> HashSet<(String, String, u64)> {
    g.edges()
        .map(|(s, d, e)| (g.node(s).name.clone(), g.node(d).name.clone(), e.bytes))
        .collect()
}

/// Terms by producer names and channel ranges.
type NamedTerms = Vec<Vec<(String, Option<(usize, usize)>)>>;

/// Blocks by names, with their stages by names.
type NamedBlock = (String, Vec<String>, Option<Vec<Vec<Vec<String>>>>);
fn block_set(g: &Graph) -> Vec<NamedBlock> {
    g.blocks()
        .iter()
        .map(|b| {
            (
                b.name.clone(),
                names(g, &b.nodes),
                b.stages.as_ref().map(|st| {
                    st.iter()
                        .map(|s| s.iter().map(|grp| names(g, grp)).collect())
                        .collect()
                }),
            )
        })
        .collect()
}

fn assert_same_graph(a: &Graph, b: &Graph) {
    assert_eq!(a.name, b.name);
    assert_eq!(a.len(), b.len());
    for n in a.nodes() {
        let m = b.node(id(b, &n.name));
        assert_eq!(n.op, m.op, "op of '{}'", n.name);
        assert_eq!(n.shape, m.shape, "shape of '{}'", n.name);
        let terms = |g: &Graph, inputs: &[Vec<Value>]| -> NamedTerms {
            inputs
                .iter()
                .map(|t| {
                    t.iter()
                        .map(|v| (g.node(v.node).name.clone(), v.channels))
                        .collect()
                })
                .collect()
        };
        assert_eq!(
            terms(a, &n.inputs),
            terms(b, &m.inputs),
            "inputs of '{}'",
            n.name
        );
    }
    assert_eq!(edge_set(a), edge_set(b));
    assert_eq!(block_set(a), block_set(b));
}

#[test]
fn fixture_path_resolves_inside_the_repository() {
    let p = std::fs::canonicalize(V100).unwrap();
    let root = std::fs::canonicalize(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).unwrap();
    assert!(p.starts_with(root.join("fixtures/ios")), "{}", p.display());
}

#[test]
fn v100_counts_blocks_and_shapes() {
    let g = load(V100);
    assert_eq!(g.name, "inception_v3_dp_parallel_merge");
    // Counted from the file with python: 102 nodes outside the placeholder; 137 distinct
    // producer->consumer pairs, 136 of them between operators (one leaves the placeholder).
    assert_eq!(g.op_count(), 102);
    assert_eq!(g.edge_count(), 136);
    assert_eq!(g.edges().count(), 137);
    assert_eq!(g.inputs().count(), 1);
    assert_eq!(g.node(id(&g, "0")).shape, vec![1, 3, 299, 299]);
    assert_eq!(g.blocks().len(), 13);
    let sizes: Vec<usize> = g.blocks().iter().map(|b| b.nodes.len()).collect();
    assert_eq!(sizes, [7, 7, 7, 7, 6, 10, 10, 10, 10, 7, 9, 11, 1]);
    let last = *g.blocks().last().unwrap().nodes.last().unwrap();
    assert_eq!(g.node(last).name, "119");
    assert_eq!(g.node(last).shape, vec![1, 2048, 1, 1]);
    match &g.node(last).op {
        Op::Pool2d(p) => assert_eq!(p.kind, PoolKind::GlobalAvg),
        other => panic!("{other:?}"),
    }
    match &g.node(id(&g, "1")).op {
        Op::Conv2d(c) => {
            assert_eq!(
                (c.out_channels, c.kernel, c.stride, c.padding),
                (32, [3, 3], [2, 2], [0, 0])
            );
            assert_eq!((c.act, c.bias, c.groups), (Activation::Relu, false, 1));
        }
        other => panic!("{other:?}"),
    }
    // Concat is an identity with four terms.
    let cat = g.node(id(&g, "16"));
    assert_eq!(cat.op, Op::Identity);
    assert_eq!(cat.inputs.len(), 4);
    assert_eq!(cat.shape, vec![1, 256, 35, 35]);
}

#[test]
fn k80_counts() {
    let g = load(K80);
    assert_eq!(g.op_count(), 113);
    assert_eq!(g.edge_count(), 147);
    assert_eq!(g.edges().count(), 148);
    assert_eq!(g.blocks().len(), 13);
    let last = *g.blocks().last().unwrap().nodes.last().unwrap();
    assert_eq!(g.node(last).shape, vec![1, 2048, 1, 1]);
}

#[test]
fn stages_are_resolved_inside_their_blocks() {
    for path in [V100, K80] {
        let g = load(path);
        for b in g.blocks() {
            let members: HashSet<NodeId> = b.nodes.iter().copied().collect();
            let stages = b.stages.as_ref().expect("IOS fixtures carry stages");
            let mut seen = HashSet::new();
            for n in stages.iter().flatten().flatten() {
                assert!(
                    members.contains(n),
                    "{path}: {} not in {}",
                    g.node(*n).name,
                    b.name
                );
                assert!(
                    seen.insert(*n),
                    "{path}: {} scheduled twice",
                    g.node(*n).name
                );
            }
            // In these files the stages cover their blocks exactly.
            assert_eq!(seen, members, "{path}: {}", b.name);
        }
    }
    let g = load(V100);
    let b1 = &g.blocks()[1];
    let st: Vec<Vec<Vec<String>>> = b1
        .stages
        .as_ref()
        .unwrap()
        .iter()
        .map(|s| s.iter().map(|grp| names(&g, grp)).collect())
        .collect();
    assert_eq!(
        st,
        vec![
            vec![vec!["8".to_string()]],
            vec![vec!["12".to_string(), "13".to_string()]],
            vec![
                vec!["10".to_string()],
                vec!["14".to_string(), "15".to_string()]
            ],
            vec![vec!["16".to_string()]],
        ]
    );
}

#[test]
fn merged_conv_feeds_channel_slices() {
    let g = load(V100);
    let n8 = id(&g, "8");
    // "8" is IOS's merge of convolutions 8, 9 and 11 (hint_name "8 9 11"): 64 + 48 + 64 channels.
    assert_eq!(g.node(n8).shape, vec![1, 176, 35, 35]);
    assert_eq!(
        g.node(id(&g, "12")).inputs,
        vec![vec![Value::slice(n8, 112, 176)]]
    );
    assert_eq!(
        g.node(id(&g, "10")).inputs,
        vec![vec![Value::slice(n8, 64, 112)]]
    );
    // A value that covers all channels of its producer is the whole output.
    assert_eq!(
        g.node(id(&g, "2")).inputs,
        vec![vec![Value::whole(id(&g, "1"))]]
    );
    let cat = g.node(id(&g, "16"));
    assert_eq!(cat.inputs[0], vec![Value::slice(n8, 0, 64)]);
    // The edge 8 -> 12 carries the 64-channel slice only (f32).
    assert_eq!(g.edge(n8, id(&g, "12")).unwrap().bytes, 64 * 35 * 35 * 4);
}

#[test]
fn batch_is_prepended_to_every_shape() {
    let g = ios::from_value_with_batch(fixture_doc(V100), 4).unwrap();
    assert!(g.nodes().iter().all(|n| n.shape[0] == 4));
    assert_eq!(g.node(id(&g, "0")).shape, vec![4, 3, 299, 299]);
    assert_eq!(g.node(id(&g, "119")).shape, vec![4, 2048, 1, 1]);
    assert_eq!(g.op_count(), 102);
    let e = ios::from_value_with_batch(fixture_doc(V100), 0).unwrap_err();
    assert!(e.to_string().contains("batch"), "{e}");
}

#[test]
fn format_detection_and_load_file_pick_ios() {
    let doc = fixture_doc(V100);
    assert_eq!(formats::detect(&doc).unwrap(), formats::Format::Ios);
    let g = formats::load_file(V100).unwrap();
    assert_eq!(g.op_count(), 102);
}

#[test]
fn fixtures_round_trip_through_export() {
    for path in [V100, K80] {
        let g = load(path);
        let doc = ios::to_value(&g).unwrap();
        let again = ios::from_value(doc.clone()).unwrap();
        assert_same_graph(&g, &again);
        // Exported again, the document is identical.
        assert_eq!(ios::to_value(&again).unwrap(), doc);
        // Slices are written as [name, begin, end], whole outputs with all channels.
        let text = ios::to_string(&g).unwrap();
        assert!(ios::from_str(&text).is_ok());
    }
    // The export agrees with the file on everything but hint names.
    let mut file = fixture_doc(V100);
    let g = load(V100);
    let mut exported = ios::to_value(&g).unwrap();
    fn drop_hints(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.remove("hint_name");
                m.values_mut().for_each(drop_hints);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(drop_hints),
            _ => {}
        }
    }
    drop_hints(&mut file);
    drop_hints(&mut exported);
    assert_eq!(file, exported);
}

fn ph(name: &str, c: usize, hw: usize) -> serde_json::Value {
    json!({"type": "placeholder", "name": name, "hint_name": name, "output_shape": [c, hw, hw]})
}

/// A small IOS graph: x -> a (conv 8) ; b (conv 8) ; m = a * b ; s = sequential(relu, dw, pw).
fn small_doc() -> serde_json::Value {
    let conv = |name: &str, input: &str, c: usize| {
        json!({"type": "conv", "name": name, "hint_name": name, "inputs": [[[input, 0, 4]]],
               "out_channels": c, "kernel": [3, 3], "stride": [1, 1], "padding": [1, 1],
               "groups": 1, "act": "identity", "output_shape": [c, 8, 8]})
    };
    json!({
        "name": "small",
        "input": ph("x", 4, 8),
        "blocks": [{
            "enter_name": "x",
            "enter_node": ph("x", 4, 8),
            "inner_nodes": [
                conv("a", "x", 8),
                conv("b", "x", 8),
                {"type": "element", "name": "m", "hint_name": "m", "op_type": "mul",
                 "inputs": [[["a", 0, 8], ["b", 0, 8]]], "output_shape": [8, 8, 8]},
            ],
            "exit_node": {
                "type": "sequential", "name": "s", "hint_name": "ReluSepConv",
                "nodes": [
                    {"type": "relu", "name": "s0", "hint_name": "s0",
                     "inputs": [[["m", 0, 4]], [["a", 4, 8]]], "output_shape": [8, 8, 8]},
                    {"type": "conv", "name": "s1", "hint_name": "s1", "inputs": [[["s0", 0, 8]]],
                     "out_channels": 8, "kernel": [3, 3], "stride": [2, 2], "padding": [1, 1],
                     "groups": 8, "act": "identity", "output_shape": [8, 4, 4]},
                    {"type": "activation", "name": "s2", "hint_name": "s2", "act_type": "sigmoid",
                     "inplace": true, "inputs": [[["s1", 0, 8]]], "output_shape": [8, 4, 4]},
                ],
                "output_shape": [8, 4, 4],
            },
            "stages": [[["a"], ["b"]], [["m", "s"]]],
        }],
    })
}

#[test]
fn element_values_become_terms_and_sequential_chains() {
    let g = ios::from_value(small_doc()).unwrap();
    let (a, b, m, s) = (id(&g, "a"), id(&g, "b"), id(&g, "m"), id(&g, "s"));
    // IOS combines the values of an element node's one term with its op: a * b.
    assert_eq!(
        g.node(m).op,
        Op::Elementwise {
            kind: ElementwiseKind::Mul
        }
    );
    assert_eq!(
        g.node(m).inputs,
        vec![vec![Value::whole(a)], vec![Value::whole(b)]]
    );
    assert_eq!(g.node(m).shape, vec![1, 8, 8, 8]);
    match &g.node(s).op {
        Op::Sequential { ops } => {
            assert_eq!(ops.len(), 3);
            assert_eq!(
                ops[0],
                Op::Activation {
                    act: Activation::Relu
                }
            );
            assert!(matches!(&ops[1], Op::Conv2d(c) if c.groups == 8 && c.act == Activation::None));
            assert_eq!(
                ops[2],
                Op::Activation {
                    act: Activation::Sigmoid
                }
            );
        }
        other => panic!("{other:?}"),
    }
    // The sequential node reads its first inner node's inputs; inner names are not nodes.
    assert_eq!(
        g.node(s).inputs,
        vec![vec![Value::slice(m, 0, 4)], vec![Value::slice(a, 4, 8)]]
    );
    assert_eq!(g.node(s).shape, vec![1, 8, 4, 4]);
    assert!(g.find("s0").is_none());
    assert_eq!(g.op_count(), 4);
    assert_eq!(g.edge_count(), 4); // a->m, b->m, m->s, a->s
                                   // Round trip: the mul goes back to one term of two values.
    let doc = ios::to_value(&g).unwrap();
    let m_cfg = &doc["blocks"][0]["inner_nodes"][2];
    assert_eq!(m_cfg["inputs"], json!([[["a", 0, 8], ["b", 0, 8]]]));
    let again = ios::from_value(doc).unwrap();
    assert_same_graph(&g, &again);
}

#[test]
fn export_without_blocks_makes_one_block_from_the_placeholder() {
    let g = json::from_value(json!({
        "format": "opsched-graph", "version": 1, "name": "tiny",
        "nodes": [
            {"name": "x", "op": {"type": "input", "shape": [1, 3, 16, 16]}},
            {"name": "a", "op": {"type": "conv2d", "out_channels": 8, "kernel": [3, 3],
                                 "padding": [1, 1], "act": "relu"}, "inputs": ["x"]},
            {"name": "p", "op": {"type": "pool2d", "kind": "max", "kernel": [3, 3],
                                 "padding": [1, 1]}, "inputs": ["x"]},
            {"name": "c", "op": {"type": "concat"}, "inputs": ["a", "p"]},
            {"name": "d", "op": {"type": "elementwise", "kind": "add"},
             "inputs": [[["c", 0, 4], ["c", 4, 8]], [["c", 7, 11]]]}
        ]
    }))
    .unwrap();
    let doc = ios::to_value(&g).unwrap();
    let blocks = doc["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0]["enter_name"], "x");
    assert_eq!(blocks[0]["exit_node"]["name"], "d");
    assert_eq!(blocks[0]["stages"], serde_json::Value::Null);
    // Concat is written as IOS's identity; add flattens into one term (the same sum).
    let inner = blocks[0]["inner_nodes"].as_array().unwrap();
    let c = inner.iter().find(|n| n["name"] == "c").unwrap();
    assert_eq!(c["type"], "identity");
    assert_eq!(
        blocks[0]["exit_node"]["inputs"],
        json!([[["c", 0, 4], ["c", 4, 8], ["c", 7, 11]]])
    );
    let again = ios::from_value(doc).unwrap();
    assert_eq!(again.op_count(), 4);
    assert_eq!(again.blocks().len(), 1);
    assert_eq!(again.blocks()[0].stages, None);
    assert_eq!(again.node(id(&again, "d")).shape, vec![1, 4, 16, 16]);
    assert_eq!(edge_set(&g), edge_set(&again));

    // Two inputs cannot be written.
    let two = json::from_value(json!({
        "format": "opsched-graph", "version": 1, "name": "two",
        "nodes": [
            {"name": "x", "op": {"type": "input", "shape": [1, 3, 4, 4]}},
            {"name": "y", "op": {"type": "input", "shape": [1, 3, 4, 4]}},
            {"name": "s", "op": {"type": "elementwise", "kind": "add"}, "inputs": ["x", "y"]}
        ]
    }))
    .unwrap();
    let e = ios::to_value(&two).unwrap_err().to_string();
    assert!(e.contains("exactly one input"), "{e}");
}

/// Apply `edit` to a copy of the v100 document and import it; return the error text.
fn v100_error(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut doc = fixture_doc(V100);
    edit(&mut doc);
    let e = ios::from_value(doc).expect_err("the edited document must be rejected");
    let text = e.to_string();
    assert_eq!(text.lines().count(), 1, "{text}");
    text
}

#[test]
fn malformed_documents_are_rejected_naming_the_node() {
    let e = v100_error(|d| d["blocks"][1]["inner_nodes"][1]["type"] = json!("softmax"));
    assert_eq!(e, "node '12': unknown IOS node type 'softmax'");

    let e = v100_error(|d| {
        d["blocks"][1]["inner_nodes"][1]
            .as_object_mut()
            .unwrap()
            .remove("kernel");
    });
    assert_eq!(e, "node '12': missing field 'kernel'");

    let e = v100_error(|d| d["blocks"][1]["inner_nodes"][1]["dilation"] = json!([2, 2]));
    assert!(e.starts_with("node '12': unknown field 'dilation'"), "{e}");

    let e = v100_error(|d| d["blocks"][1]["inner_nodes"][1]["inputs"] = json!([[["nope", 0, 64]]]));
    assert_eq!(e, "node '12': input 'nope' is not produced by any node");

    let e = v100_error(|d| d["blocks"][1]["inner_nodes"][1]["inputs"] = json!([[["8", 112, 180]]]));
    assert!(
        e.starts_with("node '12': channel slice [112, 180) out of range for '8'"),
        "{e}"
    );

    let e = v100_error(|d| d["blocks"][1]["inner_nodes"][1]["inputs"] = json!([[["8", 112]]]));
    assert!(e.starts_with("node '12': input term 0: value"), "{e}");

    let e = v100_error(|d| d["blocks"][1]["inner_nodes"][1]["output_shape"] = json!([95, 35, 35]));
    assert_eq!(
        e,
        "node '12': declared output shape [1, 95, 35, 35] but inferred [1, 96, 35, 35]"
    );

    let e = v100_error(|d| d["blocks"][1]["inner_nodes"][1]["act"] = json!("gelu"));
    assert!(e.starts_with("node '12': unknown act 'gelu'"), "{e}");

    let e = v100_error(|d| d["blocks"][1]["stages"][1][0][0] = json!("999"));
    assert_eq!(
        e,
        "block 'block1': stage 1 names node '999', which is not a node of the graph"
    );

    let e = v100_error(|d| d["blocks"][1]["stages"][1][0][0] = json!("3"));
    assert_eq!(
        e,
        "block 'block1': stage 1 names node '3', which is not in this block"
    );

    let e = v100_error(|d| d["blocks"][1]["enter_name"] = json!("16"));
    assert!(e.starts_with("block 'block1': enter node '16'"), "{e}");

    let e = v100_error(|d| {
        d["blocks"][1]["inner_nodes"][1] = json!({
            "type": "element", "name": "12", "hint_name": "12", "op_type": "add",
            "inputs": [[["8", 0, 64]], [["8", 64, 128]]], "output_shape": [64, 35, 35]});
    });
    assert!(
        e.starts_with("node '12': an IOS element node combines the values of exactly one term"),
        "{e}"
    );

    let e = v100_error(|d| {
        d["blocks"][1]["inner_nodes"][1]["pool_type"] = json!("max");
    });
    assert!(e.starts_with("node '12': unknown field 'pool_type'"), "{e}");

    let e = v100_error(|d| d["blocks"][0]["inner_nodes"][0]["name"] = json!("2"));
    assert_eq!(e, "node '2': duplicate node name");

    let e = v100_error(|d| {
        d.as_object_mut().unwrap().insert("extra".into(), json!(1));
    });
    assert!(e.starts_with("IOS graph: unknown field 'extra'"), "{e}");

    // A sequential node whose later inner node does not read the one before it.
    let mut doc = small_doc();
    doc["blocks"][0]["exit_node"]["nodes"][2]["inputs"] = json!([[["m", 0, 8]]]);
    let e = ios::from_value(doc).unwrap_err().to_string();
    assert!(
        e.starts_with("node 's': inner node #2 ('s2') must read"),
        "{e}"
    );
    // A wrong inner shape is reported on the sequential node.
    let mut doc = small_doc();
    doc["blocks"][0]["exit_node"]["nodes"][1]["output_shape"] = json!([8, 8, 8]);
    let e = ios::from_value(doc).unwrap_err().to_string();
    assert!(
        e.starts_with("node 's': inner node 's1': declared output shape"),
        "{e}"
    );
}

#[test]
fn dot_export_of_the_fixture() {
    let g = load(V100);
    let text = dot::to_dot(&g);
    assert!(text.starts_with("digraph"));
    assert!(text.trim_end().ends_with('}'));
    for n in g.nodes() {
        assert!(
            text.contains(&format!("\"{}\\n", n.name)),
            "missing node '{}'",
            n.name
        );
    }
    let arrows = text.lines().filter(|l| l.contains("->")).count();
    assert_eq!(arrows, g.edges().count());
    assert_eq!(text.matches("subgraph cluster_").count(), 13);
    // The sliced edge 8 -> 12 is labelled with its channels.
    let (n8, n12) = (id(&g, "8").0, id(&g, "12").0);
    assert!(
        text.contains(&format!("n{n8} -> n{n12} [label=\"[112:176)\"];")),
        "{text}"
    );
    // The input is drawn differently.
    let n0 = id(&g, "0").0;
    let input_line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("n{n0} [")))
        .unwrap();
    assert!(input_line.contains("style=dashed"), "{input_line}");
    assert!(text.contains("[1x3x299x299") || text.contains("1x3x299x299"));
}

#[test]
fn dot_escapes_names_and_shows_transfer_times() {
    let mut g = json::from_value(json!({
        "format": "opsched-graph", "version": 1, "name": "q\"uote",
        "nodes": [
            {"name": "in\"put", "op": {"type": "input", "shape": [1, 4, 8, 8]}},
            {"name": "back\\slash", "op": {"type": "activation", "act": "relu"}, "inputs": ["in\"put"]},
            {"name": "two\nlines", "op": {"type": "identity"}, "inputs": ["back\\slash"]}
        ],
        "blocks": [{"name": "cell \"0\"", "nodes": ["back\\slash"]}]
    }))
    .unwrap();
    let (a, b) = (id(&g, "back\\slash"), id(&g, "two\nlines"));
    assert!(g.set_transfer_ms(a, b, 0.25));
    let text = dot::to_dot(&g);
    assert!(text.starts_with("digraph \"q\\\"uote\" {"), "{text}");
    assert!(
        text.contains("label=\"in\\\"put\\ninput\\n1x4x8x8\""),
        "{text}"
    );
    assert!(
        text.contains("label=\"back\\\\slash\\nactivation relu\\n1x4x8x8\""),
        "{text}"
    );
    assert!(text.contains("two\\nlines"), "{text}");
    assert!(text.contains("label=\"cell \\\"0\\\"\";"), "{text}");
    assert!(
        text.contains(&format!("n{} -> n{} [label=\"0.25 ms\"];", a.0, b.0)),
        "{text}"
    );
    assert_eq!(text.lines().filter(|l| l.contains("->")).count(), 2);
    // Every double quote in the text is either escaped or balanced on its line.
    for line in text.lines() {
        let unescaped = line
            .char_indices()
            .filter(|&(i, c)| c == '"' && !escaped_at(line, i))
            .count();
        assert_eq!(unescaped % 2, 0, "unbalanced quotes: {line}");
    }
}

/// Whether the character at byte `i` is preceded by an odd number of backslashes.
fn escaped_at(line: &str, i: usize) -> bool {
    line[..i].chars().rev().take_while(|&c| c == '\\').count() % 2 == 1
}

#[test]
fn zoo_graphs_export_to_ios_and_back() {
    use opsched_graph::zoo::{build, ZooConfig};
    // NASNet's cells read the cell before the previous one: blocks must be ordered as units.
    for model in ["inception_v3", "squeezenet", "nasnet"] {
        let g = build(model, &ZooConfig::default()).unwrap();
        let h = ios::from_value(ios::to_value(&g).unwrap()).unwrap();
        assert_eq!(g.op_count(), h.op_count(), "{model}");
        assert_eq!(edge_set(&g), edge_set(&h), "{model}");
        for n in g.nodes() {
            assert_eq!(
                n.shape,
                h.node(id(&h, &n.name)).shape,
                "{model}: {}",
                n.name
            );
        }
        // Every block of the model survives with its nodes (names are IOS's block{i}).
        let blocks_h: HashSet<Vec<String>> =
            h.blocks().iter().map(|b| names(&h, &b.nodes)).collect();
        for b in g.blocks() {
            let mut want = names(&g, &b.nodes);
            let found = blocks_h.iter().any(|got| {
                let mut got = got.clone();
                got.sort();
                want.sort();
                got == want
            });
            assert!(found, "{model}: block {} lost", b.name);
        }
    }
}
