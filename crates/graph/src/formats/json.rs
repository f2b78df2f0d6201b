//! Our own graph JSON (`"format": "opsched-graph"`); the schema is documented in the crate docs.

use serde::{Deserialize, Serialize};

use crate::error::{GraphError, Result};
use crate::graph::{Block, Graph, GraphOutput, NodeDef, NodeId, Term, Value};
use crate::op::{DType, Op, Shape};

/// The value of the `format` field.
pub const FORMAT: &str = "opsched-graph";
/// The current version of the format.
pub const VERSION: u32 = 1;

/// A value in JSON: `"name"` or `["name", begin, end]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ValueJson {
    Whole(String),
    Slice(String, usize, usize),
}

/// A term in JSON: one value, or a list of values that are summed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TermJson {
    One(ValueJson),
    Sum(Vec<ValueJson>),
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeJson {
    name: String,
    op: Op,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    inputs: Vec<TermJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shape: Option<Shape>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BlockJson {
    name: String,
    nodes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stages: Option<Vec<Vec<Vec<String>>>>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputJson {
    name: String,
    value: ValueJson,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GraphJson {
    format: String,
    version: u32,
    name: String,
    #[serde(default)]
    dtype: DType,
    nodes: Vec<NodeJson>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    blocks: Vec<BlockJson>,
    /// Named outputs; absent: every operator no other node reads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    outputs: Vec<OutputJson>,
}

/// Resolve a node name against the graph's name table (built from a list of names).
pub(crate) struct Names<'a>(std::collections::HashMap<&'a str, NodeId>);

impl<'a> Names<'a> {
    pub(crate) fn new(names: impl Iterator<Item = &'a str>) -> Self {
        Names(
            names
                .enumerate()
                .map(|(i, n)| (n, NodeId(i as u32)))
                .collect(),
        )
    }
    pub(crate) fn get(&self, node: &str, input: &str) -> Result<NodeId> {
        self.0
            .get(input)
            .copied()
            .ok_or_else(|| GraphError::UnknownInput {
                node: node.to_string(),
                input: input.to_string(),
            })
    }
}

fn value_from_json(names: &Names, node: &str, v: &ValueJson) -> Result<Value> {
    Ok(match v {
        ValueJson::Whole(n) => Value::whole(names.get(node, n)?),
        ValueJson::Slice(n, b, e) => Value::slice(names.get(node, n)?, *b, *e),
    })
}

fn term_from_json(names: &Names, node: &str, t: &TermJson) -> Result<Term> {
    match t {
        TermJson::One(v) => Ok(vec![value_from_json(names, node, v)?]),
        TermJson::Sum(vs) if vs.is_empty() => Err(GraphError::invalid(
            format!("node '{node}'"),
            "empty input term",
        )),
        TermJson::Sum(vs) => vs.iter().map(|v| value_from_json(names, node, v)).collect(),
    }
}

fn value_to_json(g: &Graph, v: &Value) -> ValueJson {
    let name = g.node(v.node).name.clone();
    match v.channels {
        None => ValueJson::Whole(name),
        Some((b, e)) => ValueJson::Slice(name, b, e),
    }
}

/// Parse our graph JSON from a JSON document.
pub fn from_value(doc: serde_json::Value) -> Result<Graph> {
    let g: GraphJson = serde_json::from_value(doc)?;
    if g.format != FORMAT {
        return Err(GraphError::invalid(
            "format",
            format!("expected \"{FORMAT}\", got \"{}\"", g.format),
        ));
    }
    if g.version > VERSION {
        return Err(GraphError::invalid(
            "version",
            format!(
                "version {} is newer than this opsched understands ({VERSION})",
                g.version
            ),
        ));
    }
    let names = Names::new(g.nodes.iter().map(|n| n.name.as_str()));
    let defs = g
        .nodes
        .iter()
        .map(|n| {
            Ok(NodeDef {
                name: n.name.clone(),
                op: n.op.clone(),
                inputs: n
                    .inputs
                    .iter()
                    .map(|t| term_from_json(&names, &n.name, t))
                    .collect::<Result<_>>()?,
                declared_shape: n.shape.clone(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let blocks = g
        .blocks
        .iter()
        .map(|b| {
            let at = |n: &String| names.get(&format!("block {}", b.name), n);
            Ok(Block {
                name: b.name.clone(),
                nodes: b.nodes.iter().map(at).collect::<Result<_>>()?,
                stages: match &b.stages {
                    None => None,
                    Some(st) => Some(
                        st.iter()
                            .map(|s| s.iter().map(|grp| grp.iter().map(at).collect()).collect())
                            .collect::<Result<_>>()?,
                    ),
                },
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let outputs = g
        .outputs
        .iter()
        .map(|o| {
            Ok(GraphOutput {
                name: o.name.clone(),
                value: value_from_json(&names, &format!("output {}", o.name), &o.value)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let graph = Graph::from_nodes(g.name, g.dtype, defs)?.with_blocks(blocks)?;
    if outputs.is_empty() {
        Ok(graph)
    } else {
        graph.with_outputs(outputs)
    }
}

/// Parse our graph JSON from text.
pub fn from_str(text: &str) -> Result<Graph> {
    from_value(serde_json::from_str(text)?)
}

/// Serialize a graph to our JSON document (shapes included, for readers' convenience).
pub fn to_value(g: &Graph) -> serde_json::Value {
    let name_of = |id: &NodeId| g.node(*id).name.clone();
    let doc = GraphJson {
        format: FORMAT.into(),
        version: VERSION,
        name: g.name.clone(),
        dtype: g.dtype,
        nodes: g
            .nodes()
            .iter()
            .map(|n| NodeJson {
                name: n.name.clone(),
                op: n.op.clone(),
                inputs: n
                    .inputs
                    .iter()
                    .map(|t| match t.as_slice() {
                        [v] => TermJson::One(value_to_json(g, v)),
                        vs => TermJson::Sum(vs.iter().map(|v| value_to_json(g, v)).collect()),
                    })
                    .collect(),
                shape: (!n.shape.is_empty()).then(|| n.shape.clone()),
            })
            .collect(),
        blocks: g
            .blocks()
            .iter()
            .map(|b| BlockJson {
                name: b.name.clone(),
                nodes: b.nodes.iter().map(name_of).collect(),
                stages: b.stages.as_ref().map(|st| {
                    st.iter()
                        .map(|s| {
                            s.iter()
                                .map(|grp| grp.iter().map(name_of).collect())
                                .collect()
                        })
                        .collect()
                }),
            })
            .collect(),
        outputs: if g.outputs() == g.default_outputs().as_slice() {
            Vec::new()
        } else {
            g.outputs()
                .iter()
                .map(|o| OutputJson {
                    name: o.name.clone(),
                    value: value_to_json(g, &o.value),
                })
                .collect()
        },
    };
    serde_json::to_value(doc).unwrap_or(serde_json::Value::Null)
}

/// Serialize a graph to pretty JSON text.
pub fn to_string(g: &Graph) -> String {
    serde_json::to_string_pretty(&to_value(g)).unwrap_or_default()
}
