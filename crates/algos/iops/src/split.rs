//! IOPS Sec. 2.2, Algorithm 1: split the graph into blocks of at most `max_block` operators at
//! minimum cuts weighted by operator-replacement (merge) opportunities.
//!
//! # The cut we minimise
//!
//! Blocks are intervals of one topological order of the operators. An interval split has two
//! properties the rest of IOPS relies on: every prefix of a topological order is closed under
//! predecessors, so solving the blocks one after another and concatenating their stages is a
//! valid schedule; and every interval is convex (a path between two of its operators stays
//! inside it), so reachability inside a block is reachability in the graph.
//!
//! A cut between positions `k - 1` and `k` severs:
//! - every *live* tensor: an operator before the cut whose output is read after it. The set of
//!   these producers is a vertex cut of the graph (removing them disconnects the operators
//!   before the cut from those after it), which is the paper's "minimum point cut"; its size is
//!   the width of the DAG at that point, so small cuts fall where the DAG narrows (between
//!   Inception modules, between NASNet cells), where the least inter-operator parallelism is
//!   lost;
//! - every *operator-replacement opportunity* across it: a pair of convolutions that
//!   [`opsched_graph::merge::mergeable`] accepts, one on each side. The paper defines
//!   `cap(S_i)` as the number of substitutions that use an operator's edges and disables a
//!   substitution whose operators end up in different sub-graphs; we charge
//!   [`MERGE_WEIGHT`] per broken mergeable pair, so a cut that separates mergeable siblings
//!   costs more than one that only severs tensors.
//!
//! `weight(k) = live(k) + MERGE_WEIGHT * broken_pairs(k)`. Among cuts of equal weight, a cut on
//! a boundary of the model's own blocks ([`Graph::blocks`]: Inception modules, NASNet cells) is
//! preferred, which also lines repeated cells up for the templates.
//!
//! # From Algorithm 1 to a segmentation DP
//!
//! Algorithm 1 recursively splits a part larger than `max_part_size` at `MIN-SPLIT` and
//! recurses on both sides. Every leaf partition that recursion can produce is a segmentation
//! of the order into intervals of at most `max_block` operators, and its total severed weight
//! is the sum of the weights of its cut positions. Instead of fixing one greedy split per level
//! (which, without a balance rule, can cut off a single operator and recurse `n` times), we
//! compute the segmentation of minimum total cut weight exactly by dynamic programming over cut
//! positions (`best[j] = min_{j - max_block <= i < j} best[i] + weight(i)`, `O(n * max_block)`):
//! that is the best result Algorithm 1 can reach over all its choices of split points.
//!
//! The block DP's size is the number of predecessor-closed sets of the block, which grows with
//! the block's width, not only its size: a 50-operator slice of NASNet (three interleaved
//! cells) has hundreds of thousands. So Algorithm 1's test "`|G| <= max_part_size`" is applied
//! a second time with the DP's size: a block with more than [`STATE_BUDGET`] down-sets is cut
//! again, recursively, at its lightest cut (ties toward the middle). For NASNet this leaves one
//! cell per block, as IOS's own partition does.
//!
//! # The order
//!
//! Cut weights depend on the topological order. We build two orders with Kahn's algorithm,
//! one preferring the smallest node id (the order the model was written in: module by
//! module, cell by cell) and one preferring the smallest ASAP level (every prefix is then a
//! "horizontal" cut), segment both and keep the one with the smaller total weight (the id
//! order on ties).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::ops::Range;

use opsched_graph::merge::mergeable;
use opsched_graph::{Graph, NodeId, Op, Term};

/// Weight of one mergeable pair of convolutions separated by a cut (one live tensor weighs 1).
pub const MERGE_WEIGHT: u64 = 4;

/// Most predecessor-closed operator sets (DP states) a block may have; a block with more is
/// split again at its lightest cut (see the module docs).
pub const STATE_BUDGET: usize = 8192;

/// The result of the split.
#[derive(Clone, Debug)]
pub(crate) struct Split {
    /// The operators in the topological order the blocks are intervals of.
    pub order: Vec<NodeId>,
    /// The blocks, as ranges of `order`.
    pub blocks: Vec<Range<usize>>,
    /// The weight of each cut made (between consecutive blocks).
    pub cut_weights: Vec<u64>,
    /// Which order was used: "id" or "level".
    pub order_kind: &'static str,
}

impl Split {
    pub fn total_weight(&self) -> u64 {
        self.cut_weights.iter().sum()
    }
}

/// Families of convolutions reading identical inputs, with at least two members, in node id
/// order. Only members of one family can ever be merged.
pub(crate) fn merge_families(g: &Graph) -> Vec<Vec<NodeId>> {
    let mut by_input: HashMap<&Vec<Term>, Vec<NodeId>> = HashMap::new();
    let mut keys: Vec<&Vec<Term>> = Vec::new();
    for op in g.ops() {
        let node = g.node(op);
        if !matches!(node.op, Op::Conv2d(_)) {
            continue;
        }
        let entry = by_input.entry(&node.inputs).or_default();
        if entry.is_empty() {
            keys.push(&node.inputs);
        }
        entry.push(op);
    }
    keys.into_iter()
        .filter_map(|k| by_input.remove(k))
        .filter(|f| f.len() >= 2)
        .map(|mut f| {
            f.sort();
            f
        })
        .collect()
}

/// Pairs of operators that can be merged (see [`mergeable`]).
pub(crate) fn mergeable_pairs(g: &Graph, families: &[Vec<NodeId>]) -> Vec<(NodeId, NodeId)> {
    let mut pairs = Vec::new();
    for f in families {
        for (i, &a) in f.iter().enumerate() {
            for &b in &f[i + 1..] {
                if mergeable(g, &[a, b]) {
                    pairs.push((a, b));
                }
            }
        }
    }
    pairs
}

/// A topological order of the operators (graph inputs left out) by Kahn's algorithm, taking
/// among the ready operators the one with the smallest `key`.
fn kahn(g: &Graph, key: impl Fn(NodeId) -> (u64, u32)) -> Vec<NodeId> {
    let is_op = |n: NodeId| !g.node(n).op.is_input();
    let mut indeg = vec![0usize; g.len()];
    for op in g.ops() {
        indeg[op.index()] = g.preds(op).filter(|&p| is_op(p)).count();
    }
    let mut heap = BinaryHeap::new();
    for op in g.ops() {
        if indeg[op.index()] == 0 {
            heap.push(Reverse((key(op), op)));
        }
    }
    let mut order = Vec::with_capacity(g.op_count());
    while let Some(Reverse((_, op))) = heap.pop() {
        order.push(op);
        for s in g.succs(op) {
            if let Some(d) = indeg.get_mut(s.index()) {
                *d = d.saturating_sub(1);
                if *d == 0 {
                    heap.push(Reverse((key(s), s)));
                }
            }
        }
    }
    order
}

/// ASAP level of every node (graph inputs at level 0, an operator one above its highest
/// producer).
fn levels(g: &Graph) -> Vec<u64> {
    let mut level = vec![0u64; g.len()];
    for &n in g.topo_order() {
        if g.node(n).op.is_input() {
            continue;
        }
        level[n.index()] = g.preds(n).map(|p| level[p.index()] + 1).max().unwrap_or(1);
    }
    level
}

/// `2 * weight[k] + tie` for cut positions `k` in `1..n` (index 0 is unused), where `tie` is 1
/// unless the cut falls on a boundary of the model's own blocks.
fn cut_weights(g: &Graph, order: &[NodeId], pairs: &[(NodeId, NodeId)]) -> Vec<u64> {
    let n = order.len();
    let mut pos = vec![usize::MAX; g.len()];
    for (i, &op) in order.iter().enumerate() {
        pos[op.index()] = i;
    }
    // Difference array over cut positions 0..=n.
    let mut diff = vec![0i64; n + 2];
    let mut add = |from: usize, to: usize, w: i64| {
        // Cuts k with from < k <= to.
        if from < to {
            diff[from + 1] += w;
            diff[to + 1] -= w;
        }
    };
    for &u in order {
        let pu = pos[u.index()];
        let last = g
            .succs(u)
            .map(|s| pos[s.index()])
            .filter(|&p| p != usize::MAX)
            .max();
        if let Some(last) = last {
            add(pu, last, 1);
        }
    }
    for &(a, b) in pairs {
        let (pa, pb) = (pos[a.index()], pos[b.index()]);
        if pa == usize::MAX || pb == usize::MAX {
            continue;
        }
        add(pa.min(pb), pa.max(pb), MERGE_WEIGHT as i64);
    }
    // Ties go to the model's own block boundaries (Inception modules, NASNet cells): the
    // segmentation minimises `2 * weight + (not a boundary)`.
    let mut block_of = vec![usize::MAX; g.len()];
    for (bi, b) in g.blocks().iter().enumerate() {
        for &v in &b.nodes {
            if let Some(slot) = block_of.get_mut(v.index()) {
                *slot = bi;
            }
        }
    }
    let mut w = vec![0u64; n + 1];
    let mut acc = 0i64;
    for (k, slot) in w.iter_mut().enumerate() {
        acc += diff[k];
        let boundary =
            k > 0 && k < n && block_of[order[k - 1].index()] != block_of[order[k].index()];
        *slot = 2 * acc.max(0) as u64 + u64::from(!boundary);
    }
    w
}

/// The segmentation of minimum total cut weight into intervals of at most `max_block`.
fn segment(weight: &[u64], n: usize, max_block: usize) -> (Vec<Range<usize>>, Vec<u64>) {
    // (Cut weights of the final blocks are recomputed by the caller after refinement.)
    let max_block = max_block.max(1);
    let mut best = vec![u64::MAX; n + 1];
    let mut from = vec![0usize; n + 1];
    best[0] = 0;
    for j in 1..=n {
        for i in j.saturating_sub(max_block)..j {
            if best[i] == u64::MAX {
                continue;
            }
            let c = best[i].saturating_add(if i == 0 { 0 } else { weight[i] });
            if c < best[j] {
                best[j] = c;
                from[j] = i;
            }
        }
    }
    let mut blocks = Vec::new();
    let mut j = n;
    while j > 0 {
        let i = from[j];
        blocks.push(i..j);
        j = i;
    }
    blocks.reverse();
    let cuts = blocks.iter().skip(1).map(|b| weight[b.start]).collect();
    (blocks, cuts)
}

/// Number of predecessor-closed subsets of `ops` (an interval of a topological order), counted
/// up to `limit` (the result is `limit + 1` when there are more).
pub(crate) fn count_down_sets(g: &Graph, ops: &[NodeId], limit: usize) -> usize {
    let n = ops.len().min(64);
    let mut local = HashMap::with_capacity(n);
    for (i, &v) in ops.iter().take(n).enumerate() {
        local.insert(v, i);
    }
    let mut preds = vec![0u64; n];
    for (i, &v) in ops.iter().take(n).enumerate() {
        for p in g.preds(v) {
            if let Some(&j) = local.get(&p) {
                preds[i] |= 1 << j;
            }
        }
    }
    // Depth-first over the operators in order: include an operator only when all its
    // predecessors in the block are included. Every branch ends in a distinct down-set.
    let mut count = 0usize;
    let mut stack: Vec<(usize, u64)> = vec![(0, 0)];
    while let Some((i, inc)) = stack.pop() {
        if i == n {
            count += 1;
            if count > limit {
                return count;
            }
            continue;
        }
        stack.push((i + 1, inc));
        if preds[i] & !inc == 0 {
            stack.push((i + 1, inc | 1 << i));
        }
    }
    count
}

/// Cut `range` recursively (Algorithm 1) at its lightest cut, ties toward the middle, until
/// every part has at most [`STATE_BUDGET`] down-sets.
fn refine(
    g: &Graph,
    order: &[NodeId],
    w: &[u64],
    range: Range<usize>,
    out: &mut Vec<Range<usize>>,
) {
    let ops = order.get(range.clone()).unwrap_or(&[]);
    let budget = STATE_BUDGET;
    if ops.len() <= 1 || count_down_sets(g, ops, budget) <= budget {
        out.push(range);
        return;
    }
    let mid2 = range.start + range.end;
    let best = (range.start + 1..range.end).min_by_key(|&k| (w[k], (2 * k).abs_diff(mid2)));
    match best {
        Some(k) => {
            refine(g, order, w, range.start..k, out);
            refine(g, order, w, k..range.end, out);
        }
        None => out.push(range),
    }
}

/// Split `g` into blocks of at most `max_block` operators (see the module docs).
pub(crate) fn split(g: &Graph, max_block: usize, pairs: &[(NodeId, NodeId)]) -> Split {
    let by_id = kahn(g, |n| (0, n.0));
    let lv = levels(g);
    let by_level = kahn(g, |n| (lv[n.index()], n.0));
    let mut best: Option<Split> = None;
    for (kind, order) in [("id", by_id), ("level", by_level)] {
        let w = cut_weights(g, &order, pairs);
        let (coarse, _) = segment(&w, order.len(), max_block);
        let mut blocks = Vec::with_capacity(coarse.len());
        for b in coarse {
            refine(g, &order, &w, b, &mut blocks);
        }
        let cut_weights = blocks.iter().skip(1).map(|b| w[b.start] / 2).collect();
        let cand = Split {
            order,
            blocks,
            cut_weights,
            order_kind: kind,
        };
        let better = match &best {
            None => true,
            Some(b) => cand.total_weight() < b.total_weight(),
        };
        if better {
            best = Some(cand);
        }
    }
    best.unwrap_or(Split {
        order: Vec::new(),
        blocks: Vec::new(),
        cut_weights: Vec::new(),
        order_kind: "id",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segmentation_respects_max_and_prefers_light_cuts() {
        // n = 6, cut weights: position 3 is the only cheap one.
        let w = vec![0, 5, 5, 1, 5, 5, 0];
        let (blocks, cuts) = segment(&w, 6, 4);
        assert_eq!(blocks, vec![0..3, 3..6]);
        assert_eq!(cuts, vec![1]);
        let (blocks, _) = segment(&w, 6, 6);
        assert_eq!(blocks, vec![0..6]);
        let (blocks, _) = segment(&w, 6, 1);
        assert_eq!(blocks.len(), 6);
    }
}
