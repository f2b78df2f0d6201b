//! A convenient way to write models in Rust (the zoo uses it).
//!
//! Shapes are inferred as nodes are added, so a model can ask for the channels of a tensor while
//! it is being built. The first error is remembered and returned by [`GraphBuilder::finish`], so
//! model code reads straight through without `?` after every layer.

use crate::error::{GraphError, Result};
use crate::graph::{Block, Graph, NodeDef, NodeId, Term, Value};
use crate::op::{Activation, Conv2d, DType, ElementwiseKind, Op, Pool2d, Shape};

/// Builds a [`Graph`] node by node.
#[derive(Debug)]
pub struct GraphBuilder {
    name: String,
    dtype: DType,
    defs: Vec<NodeDef>,
    shapes: Vec<Shape>,
    blocks: Vec<Block>,
    open_block: Option<usize>,
    error: Option<GraphError>,
    counter: usize,
}

impl GraphBuilder {
    pub fn new(name: impl Into<String>, dtype: DType) -> Self {
        GraphBuilder {
            name: name.into(),
            dtype,
            defs: Vec::new(),
            shapes: Vec::new(),
            blocks: Vec::new(),
            open_block: None,
            error: None,
            counter: 0,
        }
    }

    /// Start a new block; the nodes added until the next call belong to it.
    pub fn block(&mut self, name: impl Into<String>) {
        self.blocks.push(Block {
            name: name.into(),
            ..Block::default()
        });
        self.open_block = Some(self.blocks.len() - 1);
    }

    /// Stop assigning nodes to a block.
    pub fn end_block(&mut self) {
        self.open_block = None;
    }

    /// Output shape of a node added earlier (empty if it failed).
    pub fn shape(&self, id: NodeId) -> &[usize] {
        self.shapes
            .get(id.index())
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Channels (axis 1) of a node added earlier.
    pub fn channels(&self, id: NodeId) -> usize {
        self.shape(id).get(1).copied().unwrap_or(0)
    }

    /// Add a node with explicit terms. `name` may be empty for an automatic one.
    pub fn node(&mut self, name: &str, op: Op, inputs: Vec<Term>) -> NodeId {
        let id = NodeId(self.defs.len() as u32);
        let name = if name.is_empty() {
            self.counter += 1;
            format!("{}_{}", op.type_name(), self.counter)
        } else {
            name.to_string()
        };
        let shape = self.infer(&name, &op, &inputs);
        self.defs.push(NodeDef {
            name,
            op,
            inputs,
            declared_shape: None,
        });
        self.shapes.push(shape);
        if let Some(b) = self.open_block {
            self.blocks[b].nodes.push(id);
        }
        id
    }

    fn infer(&mut self, name: &str, op: &Op, inputs: &[Term]) -> Shape {
        let shapes: std::result::Result<Vec<Shape>, String> = inputs
            .iter()
            .map(|t| {
                let v = t.first().ok_or("empty input term")?;
                let mut s = self
                    .shapes
                    .get(v.node.index())
                    .cloned()
                    .ok_or("unknown input")?;
                if let (Some((b, e)), Some(c)) = (v.channels, s.get_mut(1)) {
                    *c = e.saturating_sub(b);
                }
                Ok(s)
            })
            .collect();
        match shapes.and_then(|s| op.infer_shape(&s)) {
            Ok(s) => s,
            Err(message) => {
                self.error.get_or_insert(GraphError::Shape {
                    node: name.to_string(),
                    message,
                });
                Vec::new()
            }
        }
    }

    /// Add a node whose terms are whole outputs of `inputs`, one term each.
    pub fn op(&mut self, name: &str, op: Op, inputs: &[NodeId]) -> NodeId {
        let terms = inputs.iter().map(|&n| vec![Value::whole(n)]).collect();
        self.node(name, op, terms)
    }

    pub fn input(&mut self, name: &str, shape: Shape) -> NodeId {
        self.node(name, Op::Input { shape }, Vec::new())
    }
    pub fn conv(&mut self, name: &str, x: NodeId, conv: Conv2d) -> NodeId {
        self.op(name, Op::Conv2d(conv), &[x])
    }
    pub fn pool(&mut self, name: &str, x: NodeId, pool: Pool2d) -> NodeId {
        self.op(name, Op::Pool2d(pool), &[x])
    }
    pub fn act(&mut self, name: &str, x: NodeId, act: Activation) -> NodeId {
        self.op(name, Op::Activation { act }, &[x])
    }
    pub fn add(&mut self, name: &str, xs: &[NodeId]) -> NodeId {
        self.op(
            name,
            Op::Elementwise {
                kind: ElementwiseKind::Add,
            },
            xs,
        )
    }
    pub fn mul(&mut self, name: &str, xs: &[NodeId]) -> NodeId {
        self.op(
            name,
            Op::Elementwise {
                kind: ElementwiseKind::Mul,
            },
            xs,
        )
    }
    /// Concatenate along channels (axis 1).
    pub fn concat(&mut self, name: &str, xs: &[NodeId]) -> NodeId {
        self.op(name, Op::Concat { axis: 1 }, xs)
    }
    pub fn linear(
        &mut self,
        name: &str,
        x: NodeId,
        out_features: usize,
        act: Activation,
    ) -> NodeId {
        self.op(
            name,
            Op::Linear {
                out_features,
                bias: true,
                act,
            },
            &[x],
        )
    }
    pub fn sequential(&mut self, name: &str, x: NodeId, ops: Vec<Op>) -> NodeId {
        self.op(name, Op::Sequential { ops }, &[x])
    }

    /// Validate and return the graph, or the first error met while building.
    pub fn finish(self) -> Result<Graph> {
        if let Some(e) = self.error {
            return Err(e);
        }
        Graph::from_nodes(self.name, self.dtype, self.defs)?.with_blocks(self.blocks)
    }
}
