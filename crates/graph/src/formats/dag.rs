//! Cost-annotated DAG JSON (`"format": "opsched-dag"`): operators known only by a measured time
//! and utilization, edges with a transfer time.
//!
//! ```json
//! {
//!   "format": "opsched-dag", "name": "example",
//!   "ops": [{"id": 7, "time_ms": 1.2, "util": 0.8}, {"id": 3, "time_ms": 0.4}],
//!   "edges": [{"src": 7, "dst": 3, "transfer_ms": 0.5}]
//! }
//! ```
//! Ids are arbitrary non-negative integers, unique, in any order (not necessarily topological).
//! `util` defaults to 1.0 and must lie in (0, 1]; `time_ms` must be finite, non-negative and at
//! most [`MAX_TIME_MS`](crate::limits::MAX_TIME_MS); `transfer_ms` defaults to 0 and obeys the
//! same bounds. Unknown fields are errors.
//!
//! Each op becomes a node named by its id (in decimal) with [`Op::Abstract`]; its inputs are one
//! whole-output term per predecessor, in the order the edges are listed. Every edge of a graph
//! read from this format carries `Some(transfer_ms)` (see [`crate::Edge::transfer_ms`]).

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::error::{GraphError, Result};
use crate::graph::{Graph, NodeDef, NodeId, Value};
use crate::limits;
use crate::op::{DType, Op};

/// The value of the `format` field.
pub const FORMAT: &str = "opsched-dag";

fn default_util() -> f64 {
    1.0
}
fn default_name() -> String {
    "dag".into()
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DagJson {
    format: String,
    #[serde(default = "default_name")]
    name: String,
    ops: Vec<serde_json::Value>,
    #[serde(default)]
    edges: Vec<serde_json::Value>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpJson {
    id: u64,
    time_ms: f64,
    #[serde(default = "default_util")]
    util: f64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EdgeJson {
    src: u64,
    dst: u64,
    #[serde(default)]
    transfer_ms: f64,
}

/// Parse a cost-annotated DAG document.
pub fn from_value(doc: serde_json::Value) -> Result<Graph> {
    let dag: DagJson = serde_json::from_value(doc)?;
    if dag.format != FORMAT {
        return Err(GraphError::invalid(
            "format",
            format!("expected \"{FORMAT}\", got \"{}\"", dag.format),
        ));
    }
    let mut ops = Vec::with_capacity(dag.ops.len());
    let mut index_of: HashMap<u64, usize> = HashMap::with_capacity(dag.ops.len());
    for (i, v) in dag.ops.into_iter().enumerate() {
        let op: OpJson = serde_json::from_value(v)
            .map_err(|e| GraphError::invalid(format!("op #{i} of the ops list"), e.to_string()))?;
        let at = format!("op {}", op.id);
        limits::check_time_ms("time_ms", op.time_ms)
            .and_then(|_| limits::check_util("util", op.util))
            .map_err(|m| GraphError::invalid(&at, m))?;
        if index_of.insert(op.id, ops.len()).is_some() {
            return Err(GraphError::invalid(at, "duplicate op id"));
        }
        ops.push(op);
    }
    let mut edges = Vec::with_capacity(dag.edges.len());
    let mut seen: HashSet<(u64, u64)> = HashSet::with_capacity(dag.edges.len());
    let mut defs: Vec<NodeDef> = ops
        .iter()
        .map(|op| NodeDef {
            name: op.id.to_string(),
            op: Op::Abstract {
                time_ms: op.time_ms,
                util: op.util,
            },
            inputs: Vec::new(),
            declared_shape: None,
        })
        .collect();
    for (i, v) in dag.edges.into_iter().enumerate() {
        let e: EdgeJson = serde_json::from_value(v).map_err(|e| {
            GraphError::invalid(format!("edge #{i} of the edges list"), e.to_string())
        })?;
        let at = format!("edge {} -> {}", e.src, e.dst);
        let src = *index_of
            .get(&e.src)
            .ok_or_else(|| GraphError::invalid(&at, format!("unknown op {}", e.src)))?;
        let dst = *index_of
            .get(&e.dst)
            .ok_or_else(|| GraphError::invalid(&at, format!("unknown op {}", e.dst)))?;
        if src == dst {
            return Err(GraphError::invalid(at, "self loop"));
        }
        if !seen.insert((e.src, e.dst)) {
            return Err(GraphError::invalid(at, "duplicate edge"));
        }
        limits::check_time_ms("transfer_ms", e.transfer_ms)
            .map_err(|m| GraphError::invalid(&at, m))?;
        defs[dst]
            .inputs
            .push(vec![Value::whole(NodeId(src as u32))]);
        edges.push((src, dst, e.transfer_ms));
    }
    let mut g = Graph::from_nodes(dag.name, DType::F32, defs)?;
    for (src, dst, ms) in edges {
        // The edge exists: from_nodes made one per (producer, consumer) pair of the inputs.
        g.set_transfer_ms(NodeId(src as u32), NodeId(dst as u32), ms);
    }
    Ok(g)
}

/// Parse a cost-annotated DAG from JSON text.
pub fn from_str(text: &str) -> Result<Graph> {
    from_value(serde_json::from_str(text)?)
}

/// Serialize a graph of abstract ops to a DAG document. Every node must be an
/// [`Op::Abstract`] named by its id in canonical decimal form (as [`from_value`] names them);
/// an edge without a transfer time is written with `transfer_ms: 0`.
pub fn to_value(g: &Graph) -> Result<serde_json::Value> {
    let mut ids = Vec::with_capacity(g.len());
    let mut ops = Vec::with_capacity(g.len());
    let mut seen = HashSet::with_capacity(g.len());
    for n in g.nodes() {
        let at = || format!("node '{}'", n.name);
        let Op::Abstract { time_ms, util } = n.op else {
            return Err(GraphError::invalid(
                at(),
                format!(
                    "only abstract ops can be written as a DAG, this one is {}",
                    n.op.type_name()
                ),
            ));
        };
        let id: u64 = n
            .name
            .parse()
            .ok()
            .filter(|id: &u64| id.to_string() == n.name)
            .ok_or_else(|| {
                GraphError::invalid(at(), "a DAG op must be named by a non-negative integer id")
            })?;
        if !seen.insert(id) {
            return Err(GraphError::invalid(at(), "duplicate op id"));
        }
        ids.push(id);
        ops.push(OpJson { id, time_ms, util });
    }
    let edges = g
        .edges()
        .map(|(s, d, e)| EdgeJson {
            src: ids[s.index()],
            dst: ids[d.index()],
            transfer_ms: e.transfer_ms.unwrap_or(0.0),
        })
        .collect::<Vec<_>>();
    let doc = DagJson {
        format: FORMAT.into(),
        name: g.name.clone(),
        ops: ops
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()?,
        edges: edges
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()?,
    };
    Ok(serde_json::to_value(doc)?)
}

/// Serialize a graph of abstract ops to pretty DAG JSON text.
pub fn to_string(g: &Graph) -> Result<String> {
    Ok(serde_json::to_string_pretty(&to_value(g)?)?)
}
