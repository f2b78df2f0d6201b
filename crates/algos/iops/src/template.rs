//! IOPS Sec. 2.4 and Algorithm 2, lines 6-9: the dynamic template. A block that is
//! structurally identical to one solved before reuses that block's schedule ("Template"),
//! mapped onto its own operators, instead of running the DP again.
//!
//! Two blocks are identical when their canonical signatures are equal. The signature lists,
//! for every operator in the block's (topological) order, its
//! [`opsched_cost::signature::op_signature`] (type, parameters, input shapes, element type) and
//! where each of its input values comes from: another operator of the block by local index,
//! or an outside tensor by the order in which the block first reads it (with the channel slice
//! where there is one); then the block's internal edge list in local indices. Equal
//! signatures give equal operator costs (every cost model answers per operator signature),
//! equal internal dependencies, and equal merge opportunities (merging needs identical input
//! values, which the external numbering keeps), so the solved schedule, mapped position by
//! position, is valid and optimal for the new block too.

use std::collections::HashMap;
use std::fmt::Write as _;

use opsched_cost::signature::op_signature;
use opsched_graph::{Graph, NodeId};

/// The canonical signature of the block `ops` (in topological order); `local_of` maps a node
/// index to its local index (`u32::MAX` outside the block).
pub(crate) fn block_signature(g: &Graph, ops: &[NodeId], local_of: &[u32]) -> String {
    let mut s = String::with_capacity(ops.len() * 96);
    let mut external: HashMap<NodeId, usize> = HashMap::new();
    let local = |v: NodeId| -> Option<usize> {
        local_of
            .get(v.index())
            .copied()
            .filter(|&l| ops.get(l as usize) == Some(&v))
            .map(|l| l as usize)
    };
    let mut edges: Vec<(usize, usize)> = Vec::new();
    for (i, &op) in ops.iter().enumerate() {
        let _ = write!(s, "{i}:{}<", op_signature(g, op));
        for (t, term) in g.node(op).inputs.iter().enumerate() {
            if t > 0 {
                s.push(',');
            }
            for (k, v) in term.iter().enumerate() {
                if k > 0 {
                    s.push('+');
                }
                match local(v.node) {
                    Some(j) => {
                        let _ = write!(s, "L{j}");
                    }
                    None => {
                        let next = external.len();
                        let x = *external.entry(v.node).or_insert(next);
                        let _ = write!(s, "X{x}");
                    }
                }
                if let Some((b, e)) = v.channels {
                    let _ = write!(s, "[{b}:{e}]");
                }
            }
        }
        s.push_str(">;");
        for p in g.preds(op) {
            if let Some(j) = local(p) {
                edges.push((j, i));
            }
        }
    }
    edges.sort_unstable();
    s.push_str("edges");
    for (a, b) in edges {
        let _ = write!(s, " {a}>{b}");
    }
    s
}
