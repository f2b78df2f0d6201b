//! Parameter tensors of a graph's operators (a model's weights), keyed by the node, the index
//! of the operator inside a `sequential` node (0 for every other node) and the parameter's name.
//!
//! A graph without weights (the zoo, a graph file, an ONNX model imported for scheduling only)
//! has an empty store; executors then seed every parameter pseudo-randomly from the node's
//! name. A store attached with [`crate::Graph::with_weights`] is checked against the operators:
//! every tensor must be a parameter its operator has, with exactly the shape the operator needs.
//! A store may hold only some parameters (the others are seeded).
//!
//! | operator | name | shape | meaning |
//! |---|---|---|---|
//! | `conv2d` | `weight` | `[out_channels, in_channels / groups, kh, kw]` | PyTorch's and ONNX's layout |
//! | `conv2d` with `bias` | `bias` | `[out_channels]` | |
//! | `linear` | `weight` | `[out_features, in_features]` | PyTorch's layout (ONNX `MatMul`'s is the transpose) |
//! | `linear` with `bias` | `bias` | `[out_features]` | |
//! | `layer_norm` | `gamma`, `beta` | `[dim]` | scale and shift of the last axis |
//! | `affine` | `scale`, `shift` | `[channels]` | `y = x * scale[c] + shift[c]` along axis 1 |
//! | `constant` | `value` | the node's shape | the constant's values |
//!
//! Tensors hold `f32` values in row-major order behind an [`Arc`], so a graph, its weights and
//! every clone share one copy.

use std::collections::HashMap;
use std::sync::Arc;

use crate::graph::NodeId;
use crate::op::Shape;

/// A dense `f32` tensor in row-major order.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Arc<[f32]>,
}

impl Tensor {
    /// A tensor of `shape` holding `data`; the number of values must match the shape.
    pub fn new(shape: Vec<usize>, data: impl Into<Arc<[f32]>>) -> Result<Tensor, String> {
        let data = data.into();
        let n = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| format!("shape {shape:?} overflows"))?;
        if n != data.len() {
            return Err(format!(
                "shape {shape:?} needs {n} values, the tensor has {}",
                data.len()
            ));
        }
        Ok(Tensor { shape, data })
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }
}

/// One parameter: its node, the operator inside a `sequential` node, its name and the tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Param<'a> {
    pub node: NodeId,
    pub inner: usize,
    pub what: &'a str,
    pub tensor: &'a Tensor,
}

/// The named parameters of one operator.
type Named = Vec<(String, Tensor)>;

/// The weight store: cheap to clone (one [`Arc`]).
#[derive(Clone, Debug, Default)]
pub struct Weights {
    by_op: Arc<HashMap<(NodeId, usize), Named>>,
}

impl Weights {
    /// An empty store.
    pub fn new() -> Weights {
        Weights::default()
    }

    /// The parameter `what` of operator `inner` of `node` (0 unless the node is `sequential`).
    pub fn get(&self, node: NodeId, inner: usize, what: &str) -> Option<&Tensor> {
        self.by_op
            .get(&(node, inner))?
            .iter()
            .find(|(w, _)| w == what)
            .map(|(_, t)| t)
    }

    /// Add or replace a parameter (copies the map first if another clone shares it).
    pub fn insert(&mut self, node: NodeId, inner: usize, what: impl Into<String>, t: Tensor) {
        let what = what.into();
        let list = Arc::make_mut(&mut self.by_op)
            .entry((node, inner))
            .or_default();
        match list.iter_mut().find(|(w, _)| *w == what) {
            Some(slot) => slot.1 = t,
            None => list.push((what, t)),
        }
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.by_op.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every parameter, ordered by node, inner operator and name.
    pub fn iter(&self) -> impl Iterator<Item = Param<'_>> + '_ {
        let mut all: Vec<Param<'_>> = self
            .by_op
            .iter()
            .flat_map(|(&(node, inner), list)| {
                list.iter().map(move |(what, tensor)| Param {
                    node,
                    inner,
                    what,
                    tensor,
                })
            })
            .collect();
        all.sort_by(|a, b| (a.node, a.inner, a.what).cmp(&(b.node, b.inner, b.what)));
        all.into_iter()
    }

    /// Total number of values.
    pub fn values(&self) -> usize {
        self.by_op.values().flatten().map(|(_, t)| t.numel()).sum()
    }
}

/// A parameter an operator expects: the inner operator, its name and its shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    pub inner: usize,
    pub what: &'static str,
    pub shape: Shape,
}
