//! Cutting a graph into the parts the DP solves one by one.
//!
//! Units are the graph's blocks ([`Graph::blocks`], e.g. an Inception module or a NASNet cell)
//! and the operators that lie in no block (one unit each). The units are put in a topological
//! order of the *quotient* graph (unit `A` before unit `B` when an edge leads from an operator
//! of `A` to one of `B`; ties go to the unit whose first operator comes first in
//! [`Graph::topo_order`]). A block's operators, in the graph's topological order, are cut into
//! consecutive chunks of at most `max_part` operators; consecutive unblocked operators are
//! gathered into chunks the same way.
//!
//! **Why concatenating the parts' schedules is valid.** Listing the units in quotient order and
//! each unit's operators in topological order gives one sequence `L` of all operators. `L` is a
//! topological order of the graph: an edge `u -> v` inside one unit is respected by the unit's
//! own order, and an edge between units goes from an earlier unit to a later one. Every part is
//! a contiguous slice of `L`, so every edge either stays inside a part (the part's DP respects
//! it: its stages are built from endings, closed under successors) or goes from an earlier part
//! to a later one, whose stages all come after the earlier part's stages in the concatenated
//! plan.
//!
//! If the blocks are not convex (a path leaves a block and re-enters it), the quotient graph
//! has a cycle and no such order exists; the blocks are then ignored and the whole topological
//! order is cut into chunks (reported as `blocks_ignored`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use opsched_graph::{Graph, NodeId};

/// The parts of a graph, in execution order, each in a topological order.
pub(crate) struct Parts {
    pub parts: Vec<Vec<NodeId>>,
    /// The blocks were given but had to be ignored (a cycle among units).
    pub blocks_ignored: bool,
}

/// Cut `g` into parts of at most `max_part >= 1` operators (see the module docs).
pub(crate) fn split(g: &Graph, max_part: usize) -> Parts {
    let max_part = max_part.max(1);
    let ops: Vec<NodeId> = g.ops().collect();
    let mut pos = vec![usize::MAX; g.len()];
    for (i, &o) in ops.iter().enumerate() {
        pos[o.index()] = i;
    }
    let nblocks = g.blocks().len();
    // unit[op index] = block index, or nblocks + position for unblocked operators.
    let mut unit = vec![usize::MAX; g.len()];
    for (bi, b) in g.blocks().iter().enumerate() {
        for &n in &b.nodes {
            if let Some(u) = unit.get_mut(n.index()) {
                if pos[n.index()] != usize::MAX {
                    *u = bi;
                }
            }
        }
    }
    for (i, &o) in ops.iter().enumerate() {
        if unit[o.index()] == usize::MAX {
            unit[o.index()] = nblocks + i;
        }
    }
    if nblocks > 0 {
        if let Some(order) = unit_order(g, &ops, &pos, &unit, nblocks) {
            return Parts {
                parts: chunk_units(&ops, &unit, &order, nblocks, max_part),
                blocks_ignored: false,
            };
        }
        tracing::warn!(model = %g.name, "blocks are not convex; ignoring them for IOS parts");
    }
    Parts {
        parts: ops.chunks(max_part).map(<[NodeId]>::to_vec).collect(),
        blocks_ignored: nblocks > 0,
    }
}

/// Topological order of the units (Kahn, earliest first operator first); `None` on a cycle.
fn unit_order(
    g: &Graph,
    ops: &[NodeId],
    pos: &[usize],
    unit: &[usize],
    nblocks: usize,
) -> Option<Vec<usize>> {
    let nunits = nblocks + ops.len();
    let mut first = vec![usize::MAX; nunits];
    let mut present = vec![false; nunits];
    let mut adj: Vec<Vec<usize>> = vec![Vec::new(); nunits];
    let mut indeg = vec![0usize; nunits];
    for (i, &o) in ops.iter().enumerate() {
        let u = unit[o.index()];
        present[u] = true;
        first[u] = first[u].min(i);
        for s in g.succs(o) {
            if pos[s.index()] == usize::MAX {
                continue;
            }
            let v = unit[s.index()];
            if v != u && !adj[u].contains(&v) {
                adj[u].push(v);
                indeg[v] += 1;
            }
        }
    }
    let mut heap: BinaryHeap<Reverse<(usize, usize)>> = (0..nunits)
        .filter(|&u| present[u] && indeg[u] == 0)
        .map(|u| Reverse((first[u], u)))
        .collect();
    let total = present.iter().filter(|&&p| p).count();
    let mut order = Vec::with_capacity(total);
    while let Some(Reverse((_, u))) = heap.pop() {
        order.push(u);
        for &v in &adj[u] {
            indeg[v] -= 1;
            if indeg[v] == 0 {
                heap.push(Reverse((first[v], v)));
            }
        }
    }
    (order.len() == total).then_some(order)
}

fn chunk_units(
    ops: &[NodeId],
    unit: &[usize],
    order: &[usize],
    nblocks: usize,
    max_part: usize,
) -> Vec<Vec<NodeId>> {
    // Operators of each block in topological order.
    let mut members: Vec<Vec<NodeId>> = vec![Vec::new(); nblocks];
    for &o in ops {
        let u = unit[o.index()];
        if u < nblocks {
            members[u].push(o);
        }
    }
    let mut parts = Vec::new();
    let mut run: Vec<NodeId> = Vec::new();
    for &u in order {
        if u < nblocks {
            for c in run.chunks(max_part) {
                parts.push(c.to_vec());
            }
            run.clear();
            for c in members[u].chunks(max_part) {
                parts.push(c.to_vec());
            }
        } else if let Some(&o) = ops.get(u - nblocks) {
            run.push(o);
        }
    }
    for c in run.chunks(max_part) {
        parts.push(c.to_vec());
    }
    parts
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use opsched_graph::{Activation, Block, Conv2d, DType, GraphBuilder};

    use super::*;

    /// Every edge goes inside a part or from an earlier part to a later one.
    fn check_order(g: &Graph, parts: &[Vec<NodeId>]) {
        let mut part_of = vec![usize::MAX; g.len()];
        let mut pos = vec![usize::MAX; g.len()];
        for (pi, p) in parts.iter().enumerate() {
            for (k, &o) in p.iter().enumerate() {
                assert_eq!(part_of[o.index()], usize::MAX, "op twice");
                part_of[o.index()] = pi;
                pos[o.index()] = k;
            }
        }
        assert_eq!(parts.iter().map(Vec::len).sum::<usize>(), g.op_count());
        for (u, v, _) in g.edges() {
            if g.node(u).op.is_input() {
                continue;
            }
            let (pu, pv) = (part_of[u.index()], part_of[v.index()]);
            assert!(pu < pv || (pu == pv && pos[u.index()] < pos[v.index()]));
        }
    }

    #[test]
    fn zoo_parts_respect_edges_and_size() {
        for m in opsched_graph::zoo::models() {
            let g = m.build(&Default::default()).unwrap();
            for max in [1, 7, 50] {
                let p = split(&g, max);
                assert!(!p.blocks_ignored, "{}", m.name);
                assert!(p.parts.iter().all(|q| !q.is_empty() && q.len() <= max));
                check_order(&g, &p.parts);
            }
        }
    }

    #[test]
    fn blocks_listed_out_of_order_and_unblocked_ops() {
        // x -> a -> b -> c -> d; blocks {c, d} listed before {a}; b in no block.
        let mut bld = GraphBuilder::new("m", DType::F32);
        let x = bld.input("x", vec![1, 4, 8, 8]);
        let a = bld.act("a", x, Activation::Relu);
        let b = bld.act("b", a, Activation::Relu);
        let c = bld.conv("c", b, Conv2d::new(4, 1));
        let d = bld.act("d", c, Activation::Relu);
        let g = bld.finish().unwrap();
        let block = |name: &str, nodes: Vec<NodeId>| Block {
            name: name.into(),
            nodes,
            stages: None,
        };
        let g = g
            .with_blocks(vec![block("cd", vec![c, d]), block("a", vec![a])])
            .unwrap();
        let p = split(&g, 50);
        assert_eq!(p.parts, vec![vec![a], vec![b], vec![c, d]]);
        check_order(&g, &p.parts);
        // A non-convex block {a, c}: the path a -> b -> c leaves it.
        let g = g.with_blocks(vec![block("ac", vec![a, c])]).unwrap();
        let p = split(&g, 50);
        assert!(p.blocks_ignored);
        assert_eq!(p.parts, vec![vec![a, b, c, d]]);
    }
}
