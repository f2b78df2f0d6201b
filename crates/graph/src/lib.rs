//! # opsched-graph
//!
//! The operator graph IR of opsched: operators with full parameters ([`Op`]), shape inference,
//! FLOPs, bytes and parameter counts, the validated DAG ([`Graph`], on petgraph), graph file
//! formats ([`formats`]), the model zoo ([`zoo`]), seeded random layered DAGs ([`random`]) and
//! the exact name lookup every registry uses ([`names`]).
//!
//! ## Inputs: terms and values
//! A node's inputs are a list of *terms*; a term is a list of *values*; a value is another node's
//! output, optionally restricted to channels `[begin, end)`. The values of a term are summed
//! element-wise; most operators then take the terms concatenated along channels as their one
//! input. This is IOS's input model; it lets a merged convolution feed its consumers channel
//! slices and lets a concat be an `identity` with several terms.
//!
//! ## Counting
//! Graph inputs are not operators. [`Graph::op_count`] and [`Graph::edge_count`] count
//! operators and distinct producer-consumer edges between operators, as the IOS paper does.
//!
//! ## Our graph JSON (`"format": "opsched-graph"`)
//! ```json
//! {
//!   "format": "opsched-graph", "version": 1, "name": "tiny", "dtype": "f32",
//!   "nodes": [
//!     {"name": "x", "op": {"type": "input", "shape": [1, 3, 32, 32]}},
//!     {"name": "a", "op": {"type": "conv2d", "out_channels": 8, "kernel": [3, 3],
//!                          "padding": [1, 1], "act": "relu"}, "inputs": ["x"]},
//!     {"name": "b", "op": {"type": "pool2d", "kind": "max", "kernel": [3, 3],
//!                          "padding": [1, 1]}, "inputs": ["x"]},
//!     {"name": "c", "op": {"type": "concat"}, "inputs": ["a", "b"]},
//!     {"name": "d", "op": {"type": "conv2d", "out_channels": 4, "kernel": [1, 1]},
//!      "inputs": [[["c", 0, 8], ["c", 3, 11]]]}
//!   ],
//!   "blocks": [{"name": "cell0", "nodes": ["a", "b", "c"]}]
//! }
//! ```
//! `inputs` lists terms. A term is a node name (its whole output), or a list of values to sum;
//! a value is a node name or `[name, begin, end]` (a channel slice). Nodes may appear in any
//! order. `shape` (optional on every node) is checked against inference. Unknown fields are
//! errors. Operator fields are those of [`Op`] (see its variants; defaults: stride 1, padding 0,
//! dilation 1, groups 1, no bias, no activation).

pub mod analysis;
pub mod builder;
pub mod error;
pub mod formats;
pub mod fusion;
pub mod graph;
pub mod inplace;
pub mod limits;
pub mod merge;
pub mod names;
pub mod op;
pub mod random;
pub mod resize;
pub mod rng;
pub mod weights;
pub mod zoo;

pub use analysis::{summarize, Summary};
pub use builder::GraphBuilder;
pub use error::{GraphError, Result};
pub use graph::{Block, Edge, Graph, GraphOutput, Node, NodeDef, NodeId, Term, Value};
pub use op::{
    Activation, BinaryKind, Conv2d, DType, ElementwiseKind, Op, OpStats, Pool2d, PoolKind,
    ReduceKind, Shape,
};
pub use resize::{NearestMode, Resize, ResizeCoord, ResizeMode};
pub use weights::{Tensor, Weights};
