//! The DAG: nodes with their inputs, validated and shape-inferred, on petgraph.

use std::collections::HashMap;

use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use serde::{Deserialize, Serialize};

use crate::error::{GraphError, Result};
use crate::limits::{self, MAX_ELEMENTS};
use crate::op::{DType, Op, OpStats, Shape};
use crate::weights::{ParamSpec, Weights};

/// Index of a node in a [`Graph`] (dense, `0..graph.len()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A reference to another node's output, optionally restricted to channels `[begin, end)`
/// of axis 1 (IOS's "value").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Value {
    pub node: NodeId,
    pub channels: Option<(usize, usize)>,
}

impl Value {
    /// The whole output of `node`.
    pub fn whole(node: NodeId) -> Self {
        Value {
            node,
            channels: None,
        }
    }
    /// Channels `[begin, end)` of `node`'s output.
    pub fn slice(node: NodeId, begin: usize, end: usize) -> Self {
        Value {
            node,
            channels: Some((begin, end)),
        }
    }
}

/// One input tensor of an operator: the element-wise sum of its values (usually just one).
pub type Term = Vec<Value>;

/// A node: a named operator applied to its input terms.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<Term>,
    /// Output shape, batch included (empty for abstract ops).
    pub shape: Shape,
}

/// A group of nodes the model was built from (an Inception block, a NASNet cell, an IOS block).
/// Schedulers may solve blocks separately; `stages` keeps a schedule that came with the file
/// (IOS graph JSON): stages, each a list of groups, each a list of nodes run in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Block {
    pub name: String,
    pub nodes: Vec<NodeId>,
    pub stages: Option<Vec<Vec<Vec<NodeId>>>>,
}

/// An edge of the DAG: one producer feeding one consumer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Edge {
    /// Bytes the consumer reads from the producer (all referenced slices).
    pub bytes: u64,
    /// A transfer time given by the file (cost-annotated DAGs), in milliseconds.
    pub transfer_ms: Option<f64>,
}

/// A named output of the graph: what a caller of the model gets back.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphOutput {
    pub name: String,
    pub value: Value,
}

/// A node as given to [`Graph::from_nodes`]: inputs refer to node indices in the same list,
/// in any order; `declared_shape` is checked against inference when present.
#[derive(Clone, Debug)]
pub struct NodeDef {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<Term>,
    pub declared_shape: Option<Shape>,
}

/// A validated, shape-inferred DAG of operators.
///
/// Invariants: names are unique; every input refers to an existing node; the graph is acyclic;
/// every node's shape is inferred from its inputs; `topo` lists all nodes in a topological order;
/// every output names an existing value; every weight fits its operator.
#[derive(Clone, Debug)]
pub struct Graph {
    pub name: String,
    pub dtype: DType,
    nodes: Vec<Node>,
    dag: DiGraph<(), Edge, u32>,
    topo: Vec<NodeId>,
    /// Each node's position in `topo`.
    topo_pos: Vec<u32>,
    blocks: Vec<Block>,
    by_name: HashMap<String, NodeId>,
    outputs: Vec<GraphOutput>,
    weights: Weights,
    /// FLOPs, bytes and parameters per node, computed (checked) once when the graph is built.
    stats: Vec<OpStats>,
    /// Which of the optional fusions its lowering applies ([`Graph::with_fusions`]).
    fusions: crate::fusion::Fusions,
    /// This graph's identity ([`Graph::id`]).
    id: u64,
}

/// The next [`Graph::id`].
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn fresh_id() -> u64 {
    NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn nid(i: NodeIndex) -> NodeId {
    NodeId(i.index() as u32)
}
fn nix(n: NodeId) -> NodeIndex {
    NodeIndex::new(n.index())
}

impl Graph {
    /// Build and validate a graph: names unique, inputs existing, no cycle, shapes consistent.
    pub fn from_nodes(name: impl Into<String>, dtype: DType, defs: Vec<NodeDef>) -> Result<Graph> {
        let name = name.into();
        let mut by_name = HashMap::with_capacity(defs.len());
        for (i, d) in defs.iter().enumerate() {
            if by_name.insert(d.name.clone(), NodeId(i as u32)).is_some() {
                return Err(GraphError::DuplicateName {
                    node: d.name.clone(),
                });
            }
        }
        let mut dag: DiGraph<(), Edge, u32> = DiGraph::with_capacity(defs.len(), defs.len() * 2);
        for _ in &defs {
            dag.add_node(());
        }
        let mut edge_of: HashMap<(NodeId, NodeId), petgraph::graph::EdgeIndex> = HashMap::new();
        for (i, d) in defs.iter().enumerate() {
            let dst = NodeId(i as u32);
            if d.op.is_input() && !d.inputs.is_empty() {
                return Err(GraphError::Shape {
                    node: d.name.clone(),
                    message: "an input takes no inputs".into(),
                });
            }
            for v in d.inputs.iter().flatten() {
                if v.node.index() >= defs.len() {
                    return Err(GraphError::UnknownInput {
                        node: d.name.clone(),
                        input: format!("#{}", v.node.0),
                    });
                }
                if v.node == dst {
                    return Err(GraphError::Cycle {
                        node: d.name.clone(),
                    });
                }
                edge_of
                    .entry((v.node, dst))
                    .or_insert_with(|| dag.add_edge(nix(v.node), nix(dst), Edge::default()));
            }
        }
        let topo = match petgraph::algo::toposort(&dag, None) {
            Ok(order) => order.into_iter().map(nid).collect::<Vec<_>>(),
            Err(cycle) => {
                return Err(GraphError::Cycle {
                    node: defs[cycle.node_id().index()].name.clone(),
                })
            }
        };
        let mut nodes: Vec<Node> = defs
            .into_iter()
            .map(|d| Node {
                name: d.name,
                op: d.op,
                inputs: d.inputs,
                shape: d.declared_shape.unwrap_or_default(),
            })
            .collect();
        let mut declared: Vec<bool> = nodes.iter().map(|n| !n.shape.is_empty()).collect();
        for &id in &topo {
            let terms = term_shapes(&nodes, &nodes[id.index()].inputs, dtype)
                .and_then(|t| nodes[id.index()].op.infer_shape(&t));
            let node = &nodes[id.index()];
            let inferred = terms.map_err(|message| GraphError::Shape {
                node: node.name.clone(),
                message,
            })?;
            // Keep every count (elements, bytes, FLOPs) far from u64 overflow.
            if limits::numel(&inferred)
                .ok()
                .is_none_or(|n| n > MAX_ELEMENTS)
            {
                return Err(GraphError::Shape {
                    node: node.name.clone(),
                    message: format!(
                        "output shape {inferred:?} has more than 2^40 elements; no GPU holds that"
                    ),
                });
            }
            if declared[id.index()] && node.shape != inferred && !node.op.is_input() {
                return Err(GraphError::DeclaredShape {
                    node: node.name.clone(),
                    declared: node.shape.clone(),
                    inferred,
                });
            }
            declared[id.index()] = false;
            nodes[id.index()].shape = inferred;
        }
        // Edge payloads: bytes of every referenced slice.
        for (i, n) in nodes.iter().enumerate() {
            let at = |message| GraphError::Shape {
                node: n.name.clone(),
                message,
            };
            for v in n.inputs.iter().flatten() {
                let bytes = match value_shape(&nodes, v) {
                    Ok(s) => {
                        limits::mul("edge bytes", limits::numel(&s).map_err(at)?, dtype.size())
                            .map_err(at)?
                    }
                    Err(_) => 0,
                };
                if let Some(&e) = edge_of.get(&(v.node, NodeId(i as u32))) {
                    dag[e].bytes = limits::add("edge bytes", dag[e].bytes, bytes).map_err(at)?;
                }
            }
        }
        let stats = (0..nodes.len())
            .map(|i| {
                node_stats(&nodes, i, dtype).map_err(|message| GraphError::Shape {
                    node: nodes[i].name.clone(),
                    message,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut topo_pos = vec![0u32; nodes.len()];
        for (i, n) in topo.iter().enumerate() {
            topo_pos[n.index()] = i as u32;
        }
        let mut g = Graph {
            name,
            dtype,
            nodes,
            dag,
            topo,
            topo_pos,
            blocks: Vec::new(),
            by_name,
            outputs: Vec::new(),
            weights: Weights::default(),
            stats,
            fusions: crate::fusion::Fusions::default(),
            id: fresh_id(),
        };
        g.outputs = g.default_outputs();
        Ok(g)
    }

    /// An identity for per-graph caches (the analytical cost model keeps each operator's cost
    /// under it): unique to each graph built in this process, new whenever a method changes the
    /// graph, shared by clones (which are equal).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Which of the optional fusions the lowering, the launch count and the signatures apply
    /// to this graph ([`crate::fusion::Fusions::DEFAULT`] unless told otherwise).
    pub fn fusions(&self) -> crate::fusion::Fusions {
        self.fusions
    }

    /// The graph with only `fusions` of the optional fusions (they change which kernels run,
    /// never a value): one place that every rule reads, so a lowering, its launch count and
    /// its cost keys always agree.
    pub fn with_fusions(mut self, fusions: crate::fusion::Fusions) -> Graph {
        self.fusions = fusions;
        self.id = fresh_id();
        self
    }

    /// The outputs a graph has unless told otherwise: every operator no other node reads, in
    /// node order, named after the node.
    pub fn default_outputs(&self) -> Vec<GraphOutput> {
        (0..self.nodes.len() as u32)
            .map(NodeId)
            .filter(|&n| !self.nodes[n.index()].op.is_input() && self.succs(n).next().is_none())
            .map(|n| GraphOutput {
                name: self.nodes[n.index()].name.clone(),
                value: Value::whole(n),
            })
            .collect()
    }

    /// Set the graph's outputs (e.g. an ONNX model's, by their names there); each must name an
    /// existing node's output or a channel slice of it, and names must be unique.
    pub fn with_outputs(mut self, outputs: Vec<GraphOutput>) -> Result<Graph> {
        let mut seen = std::collections::HashSet::new();
        for o in &outputs {
            let at = || format!("output '{}'", o.name);
            if !seen.insert(o.name.as_str()) {
                return Err(GraphError::invalid(at(), "duplicate output name"));
            }
            if o.value.node.index() >= self.nodes.len() {
                return Err(GraphError::invalid(
                    at(),
                    format!("unknown node #{}", o.value.node.0),
                ));
            }
            value_shape(&self.nodes, &o.value).map_err(|m| GraphError::invalid(at(), m))?;
        }
        self.outputs = outputs;
        self.id = fresh_id();
        Ok(self)
    }

    /// Attach weights, checking every tensor against its operator's parameters (see
    /// [`crate::weights`]); errors name the node and the parameter.
    pub fn with_weights(mut self, weights: Weights) -> Result<Graph> {
        for p in weights.iter() {
            let node = self.nodes.get(p.node.index()).ok_or_else(|| {
                GraphError::invalid(
                    format!("weight '{}'", p.what),
                    format!("unknown node #{}", p.node.0),
                )
            })?;
            let at = || format!("node '{}': parameter '{}'", node.name, p.what);
            let specs = self.params(p.node);
            let Some(spec) = specs
                .iter()
                .find(|s| s.inner == p.inner && s.what == p.what)
            else {
                let known: Vec<String> = specs
                    .iter()
                    .map(|s| format!("{}#{}", s.what, s.inner))
                    .collect();
                return Err(GraphError::invalid(
                    at(),
                    format!(
                        "the {} operator (#{}) has no such parameter (it has: {})",
                        node.op.type_name(),
                        p.inner,
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            };
            if p.tensor.shape != spec.shape {
                return Err(GraphError::invalid(
                    at(),
                    format!(
                        "has shape {:?}, the operator needs {:?}",
                        p.tensor.shape, spec.shape
                    ),
                ));
            }
        }
        self.weights = weights;
        self.id = fresh_id();
        Ok(self)
    }

    /// The graph's weights (empty unless attached, e.g. by an ONNX import that loads them).
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// The graph's outputs.
    pub fn outputs(&self) -> &[GraphOutput] {
        &self.outputs
    }

    /// The shape of a value (a node's output or a channel slice of it).
    pub fn value_shape(&self, v: &Value) -> Result<Shape> {
        value_shape(&self.nodes, v)
            .map_err(|m| GraphError::invalid(format!("value of node #{}", v.node.0), m))
    }

    /// The parameters a node's operator(s) expect, for its input shapes (see [`crate::weights`]).
    pub fn params(&self, id: NodeId) -> Vec<ParamSpec> {
        let node = &self.nodes[id.index()];
        let terms = self.input_shapes(id);
        match &node.op {
            Op::Sequential { ops } => {
                let mut shapes = terms;
                let mut out = Vec::new();
                for (inner, op) in ops.iter().enumerate() {
                    out.extend(
                        op.params(&shapes)
                            .into_iter()
                            .map(|(what, shape)| ParamSpec { inner, what, shape }),
                    );
                    match op.infer_shape(&shapes) {
                        Ok(next) => shapes = vec![next],
                        Err(_) => break,
                    }
                }
                out
            }
            op => op
                .params(&terms)
                .into_iter()
                .map(|(what, shape)| ParamSpec {
                    inner: 0,
                    what,
                    shape,
                })
                .collect(),
        }
    }

    /// Attach blocks; every node may appear in at most one block.
    pub fn with_blocks(mut self, blocks: Vec<Block>) -> Result<Graph> {
        let mut owner = vec![None::<usize>; self.nodes.len()];
        for (bi, b) in blocks.iter().enumerate() {
            for &n in &b.nodes {
                let slot = owner.get_mut(n.index()).ok_or_else(|| {
                    GraphError::invalid(
                        format!("block '{}'", b.name),
                        format!("unknown node #{}", n.0),
                    )
                })?;
                if slot.replace(bi).is_some() {
                    return Err(GraphError::invalid(
                        format!("block '{}'", b.name),
                        format!(
                            "node '{}' already belongs to another block",
                            self.nodes[n.index()].name
                        ),
                    ));
                }
            }
        }
        self.blocks = blocks;
        self.id = fresh_id();
        Ok(self)
    }

    /// Set the transfer time of the edge `src -> dst` (cost-annotated DAGs).
    pub fn set_transfer_ms(&mut self, src: NodeId, dst: NodeId, ms: f64) -> bool {
        match self.dag.find_edge(nix(src), nix(dst)) {
            Some(e) => {
                self.dag[e].transfer_ms = Some(ms);
                self.id = fresh_id();
                true
            }
            None => false,
        }
    }

    /// All nodes, inputs included, indexed by [`NodeId`].
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
    pub fn find(&self, name: &str) -> Option<NodeId> {
        self.by_name.get(name).copied()
    }
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }
    /// The underlying petgraph DAG; node indices equal [`NodeId`]s.
    pub fn dag(&self) -> &DiGraph<(), Edge, u32> {
        &self.dag
    }
    /// All nodes in a topological order.
    pub fn topo_order(&self) -> &[NodeId] {
        &self.topo
    }
    /// `n`'s position in [`Graph::topo_order`]: every ancestor of `n` comes before it.
    pub fn topo_position(&self, n: NodeId) -> usize {
        self.topo_pos[n.index()] as usize
    }
    /// Ids of all operators (inputs excluded), in topological order.
    pub fn ops(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.topo
            .iter()
            .copied()
            .filter(|&n| !self.nodes[n.index()].op.is_input())
    }
    /// Number of operators; graph inputs are not operators (IOS's count).
    pub fn op_count(&self) -> usize {
        self.nodes.iter().filter(|n| !n.op.is_input()).count()
    }
    /// Number of distinct producer -> consumer edges between operators (edges leaving a graph
    /// input are not counted, as in IOS).
    pub fn edge_count(&self) -> usize {
        self.dag
            .edge_references()
            .filter(|e| !self.nodes[e.source().index()].op.is_input())
            .count()
    }
    /// Graph inputs (the values a caller gives; constants are not among them).
    pub fn inputs(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.nodes.len() as u32)
            .map(NodeId)
            .filter(|n| self.nodes[n.index()].op.is_graph_input())
    }
    /// Constant nodes.
    pub fn constants(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.nodes.len() as u32)
            .map(NodeId)
            .filter(|n| matches!(self.nodes[n.index()].op, Op::Constant { .. }))
    }
    /// Distinct producers of a node.
    pub fn preds(&self, id: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        self.dag
            .neighbors_directed(nix(id), Direction::Incoming)
            .map(nid)
    }
    /// Distinct consumers of a node.
    pub fn succs(&self, id: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        self.dag
            .neighbors_directed(nix(id), Direction::Outgoing)
            .map(nid)
    }
    /// Edges as (src, dst, payload), graph inputs' edges included.
    pub fn edges(&self) -> impl Iterator<Item = (NodeId, NodeId, &Edge)> + '_ {
        self.dag
            .edge_references()
            .map(|e| (nid(e.source()), nid(e.target()), e.weight()))
    }
    /// The edge `src -> dst`, if any.
    pub fn edge(&self, src: NodeId, dst: NodeId) -> Option<&Edge> {
        self.dag.find_edge(nix(src), nix(dst)).map(|e| &self.dag[e])
    }

    /// Shapes of a node's input terms.
    pub fn input_shapes(&self, id: NodeId) -> Vec<Shape> {
        term_shapes(&self.nodes, &self.nodes[id.index()].inputs, self.dtype).unwrap_or_default()
    }

    /// FLOPs, bytes and parameters of one node, including the sums inside its input terms.
    pub fn stats(&self, id: NodeId) -> OpStats {
        self.stats[id.index()]
    }
}

/// A node's counts: its operator's, plus one addition per element of every value summed
/// inside a term; an error when a count overflows.
fn node_stats(nodes: &[Node], i: usize, dtype: DType) -> Result<OpStats, String> {
    let node = &nodes[i];
    let terms = term_shapes(nodes, &node.inputs, dtype)?;
    let mut s = node.op.stats(&terms, &node.shape, dtype)?;
    for (term, shape) in node.inputs.iter().zip(&terms) {
        let values = limits::count(term.len()).saturating_sub(1);
        let extra = limits::mul("FLOPs", values, limits::numel(shape)?)?;
        s.flops = limits::add("FLOPs", s.flops, extra)?;
        let extra_bytes = limits::mul("bytes read", extra, dtype.size())?;
        s.bytes_read = limits::add("bytes read", s.bytes_read, extra_bytes)?;
    }
    Ok(s)
}

fn value_shape(nodes: &[Node], v: &Value) -> Result<Shape, String> {
    let src = &nodes[v.node.index()];
    let mut shape = src.shape.clone();
    if let Some((b, e)) = v.channels {
        let c = shape.get_mut(1).ok_or_else(|| {
            format!(
                "cannot slice channels of '{}' with shape {:?}",
                src.name, src.shape
            )
        })?;
        if b >= e || e > *c {
            return Err(format!(
                "channel slice [{b}, {e}) out of range for '{}' with {} channels",
                src.name, c
            ));
        }
        *c = e - b;
    }
    Ok(shape)
}

fn term_shapes(nodes: &[Node], inputs: &[Term], _dtype: DType) -> Result<Vec<Shape>, String> {
    inputs
        .iter()
        .map(|term| {
            let mut values = term.iter().map(|v| value_shape(nodes, v));
            let first = values.next().ok_or("empty input term")??;
            for s in values {
                let s = s?;
                if s != first {
                    return Err(format!("summed inputs differ in shape: {first:?} vs {s:?}"));
                }
            }
            Ok(first)
        })
        .collect()
}
