//! Structural summaries of a graph: counts, FLOPs, critical-path depth and maximum width.

use serde::Serialize;

use crate::graph::{Graph, NodeId};
use crate::op::Op;

/// What `opsched inspect` shows about a graph. A cost-annotated DAG has no tensors: its
/// `flops`, `params`, bytes, `dtype` and `input_shapes` mean nothing, and `times` holds what
/// it has instead.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub name: String,
    pub dtype: String,
    /// Operators (graph inputs excluded).
    pub ops: usize,
    /// Producer -> consumer edges between operators.
    pub edges: usize,
    /// Shapes of the graph inputs.
    pub input_shapes: Vec<Vec<usize>>,
    pub flops: u64,
    pub params: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Operators on the longest dependency chain.
    pub depth: usize,
    /// Largest set of mutually independent operators (maximum antichain).
    pub width: usize,
    pub blocks: usize,
    /// Operator count per type name.
    pub op_types: std::collections::BTreeMap<String, usize>,
    /// The given times of a cost-annotated DAG ([`is_cost_annotated`]); `None` for models.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub times: Option<DagTimes>,
}

/// The given times of a cost-annotated DAG.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DagTimes {
    /// Sum of the operators' `time_ms`.
    pub op_time_ms: f64,
    /// Sum of the edges' `transfer_ms`.
    pub transfer_ms: f64,
    /// Mean of the operators' `util`.
    pub mean_util: f64,
}

/// Whether `g` is a cost-annotated DAG: it has operators and every one is known only by a
/// time ([`Op::Abstract`]).
pub fn is_cost_annotated(g: &Graph) -> bool {
    let mut ops = g.ops().peekable();
    ops.peek().is_some() && ops.all(|o| matches!(g.node(o).op, Op::Abstract { .. }))
}

fn dag_times(g: &Graph) -> Option<DagTimes> {
    if !is_cost_annotated(g) {
        return None;
    }
    let (mut op_time_ms, mut util) = (0.0, 0.0);
    for o in g.ops() {
        if let Op::Abstract { time_ms, util: u } = g.node(o).op {
            op_time_ms += time_ms;
            util += u;
        }
    }
    Some(DagTimes {
        op_time_ms,
        transfer_ms: g.edges().filter_map(|(_, _, e)| e.transfer_ms).sum(),
        mean_util: util / g.op_count().max(1) as f64,
    })
}

/// Summarize a graph.
pub fn summarize(g: &Graph) -> Summary {
    let mut s = Summary {
        name: g.name.clone(),
        dtype: g.dtype.to_string(),
        ops: g.op_count(),
        edges: g.edge_count(),
        input_shapes: g.inputs().map(|n| g.node(n).shape.clone()).collect(),
        flops: 0,
        params: 0,
        bytes_read: 0,
        bytes_written: 0,
        depth: depth(g),
        width: width(g),
        blocks: g.blocks().len(),
        op_types: Default::default(),
        times: dag_times(g),
    };
    for id in g.ops() {
        let st = g.stats(id);
        s.flops += st.flops;
        s.params += st.params;
        s.bytes_read += st.bytes_read;
        s.bytes_written += st.bytes_written;
        *s.op_types
            .entry(g.node(id).op.type_name().to_string())
            .or_default() += 1;
    }
    s
}

/// Number of operators on the longest path (graph inputs do not count).
pub fn depth(g: &Graph) -> usize {
    let mut level = vec![0usize; g.len()];
    let mut best = 0;
    for &n in g.topo_order() {
        let own = usize::from(!g.node(n).op.is_input());
        let l = g.preds(n).map(|p| level[p.index()]).max().unwrap_or(0) + own;
        level[n.index()] = l;
        best = best.max(l);
    }
    best
}

/// Reachability among operators as bitsets: `reach[i]` has bit `j` when op `j` is a strict
/// descendant of op `i`. Indices are positions in `ops`.
pub fn reachability(g: &Graph, ops: &[NodeId]) -> Vec<Vec<u64>> {
    let mut pos = vec![usize::MAX; g.len()];
    for (i, &n) in ops.iter().enumerate() {
        pos[n.index()] = i;
    }
    let words = ops.len().div_ceil(64);
    let mut reach = vec![vec![0u64; words]; g.len()];
    for &n in g.topo_order().iter().rev() {
        let mut acc = vec![0u64; words];
        for s in g.succs(n) {
            let p = pos[s.index()];
            if p != usize::MAX {
                acc[p / 64] |= 1 << (p % 64);
            }
            for (a, b) in acc.iter_mut().zip(&reach[s.index()]) {
                *a |= b;
            }
        }
        reach[n.index()] = acc;
    }
    ops.iter()
        .map(|n| std::mem::take(&mut reach[n.index()]))
        .collect()
}

/// Size of the largest antichain of operators (Dilworth: ops minus a maximum matching in the
/// bipartite graph of the transitive closure). This is the most operators that could ever run
/// at the same time.
pub fn width(g: &Graph) -> usize {
    let ops: Vec<NodeId> = g.ops().collect();
    let n = ops.len();
    if n == 0 {
        return 0;
    }
    let reach = reachability(g, &ops);
    let adj: Vec<Vec<usize>> = reach
        .iter()
        .map(|bits| {
            (0..n)
                .filter(|&j| bits[j / 64] >> (j % 64) & 1 == 1)
                .collect()
        })
        .collect();
    let mut match_right = vec![usize::MAX; n];
    let mut matched = 0;
    for u in 0..n {
        let mut seen = vec![false; n];
        if augment(u, &adj, &mut match_right, &mut seen) {
            matched += 1;
        }
    }
    n - matched
}

fn augment(u: usize, adj: &[Vec<usize>], match_right: &mut [usize], seen: &mut [bool]) -> bool {
    for &v in &adj[u] {
        if !seen[v] {
            seen[v] = true;
            if match_right[v] == usize::MAX || augment(match_right[v], adj, match_right, seen) {
                match_right[v] = u;
                return true;
            }
        }
    }
    false
}
