//! Nimble's stream assignment (Kwon et al., NeurIPS 2020), as a stream plan on one GPU.
//!
//! # Algorithm
//! 1. **Minimum equivalent graph.** The transitive reduction of the operator DAG, from the
//!    reachability bitsets of [`opsched_graph::analysis::reachability`]: an edge `u -> v` is
//!    kept iff `v` is not reachable from another direct successor of `u` (for a DAG this is the
//!    unique minimum equivalent graph). Edges from graph inputs are not operator edges.
//! 2. **Maximum matching** (Hopcroft-Karp) in the bipartite graph with a left and a right copy
//!    of every operator and an edge `u_left - v_right` per reduced edge `u -> v`. A matched edge
//!    `u -> v` puts `v` right after `u` on `u`'s stream, so the operators split into
//!    `ops - matching` vertex-disjoint paths of the reduced graph, the **chains**; every matched
//!    edge is a dependency that needs no cross-stream event, and Nimble proves this gives the
//!    fewest synchronisations.
//! 3. **Chain merging**, as Nimble's implementation does (`map_streams` in its `autostream`
//!    pass): chain `a` may precede chain `b` on one stream when the last operator of `a`
//!    reaches the first of `b`; a second maximum matching on that (transitive) order merges
//!    chains. Operators on one merged stream are totally ordered, so every two independent
//!    operators are on different streams (Nimble's "maximum logical concurrency"). The paths
//!    of step 2 alone are not a minimum cover of the operator order (an Inception concat with
//!    four inputs and four consumers ends three paths and starts three); merging closes most
//!    of the gap, but not all of it: which maximum matching step 2 picks decides what merging
//!    can reach, and some picks leave more streams than the width (RandWire-WS: 10 for width
//!    9; the 7-operator DAG in the tests: 4 for width 3).
//! 4. **Completion** (ours): the matching of steps 2 and 3 (the reduction's matched edges and
//!    `last(a) -> first(b)` for merged chains) is a matching in the bipartite graph of the
//!    transitive closure; Hopcroft-Karp grows it to a maximum one there. Its paths are a
//!    minimum chain cover of the operator order, the **logical streams**, exactly the graph's
//!    width (Dilworth; Fulkerson's construction). Where Nimble's merging already reached the
//!    width nothing changes.
//! 5. **Folding** (ours; Nimble has no stream limit). If there are more logical streams than
//!    `platform.streams`, each logical stream is bound, when its first operator comes up in a
//!    topological list schedule (operators in [`Graph::ops`] order, each alone for
//!    `cost.op_time`, starting when its stream is free and its predecessors have finished), to
//!    the physical stream whose last operator finishes earliest (lowest index on ties). With
//!    enough streams, logical stream `i` is physical stream `i` and the cost model is not asked.
//!
//! Statistics (`extra`): `original_edges`, `reduced_edges`, `matching` (step 2), `chains`
//! (step 2's paths, `ops - matching`), `nimble_streams` (after step 3), `logical_streams`
//! (after step 4, the width), `streams` (used after folding).
//!
//! Memory: the reachability bitsets, `n^2 / 8` bytes for `n` operators (1.25 GB for 100,000);
//! the matchings read the closure and the chain order from them in place, in ascending order, so
//! nothing else grows faster than the edges. A graph whose bitsets would exceed
//! [`MAX_CLOSURE_BYTES`] is refused with an error instead of exhausting memory.
//!
//! Each stream lists its operators in the global topological order [`Graph::ops`], so no
//! operator precedes one of its ancestors on its stream; the launch order is [`Graph::ops`].
//! Logical streams are numbered by their first operator's topological position.

use std::collections::VecDeque;
use std::time::Instant;

use opsched_cost::CostModel;
use opsched_graph::analysis::reachability;
use opsched_graph::{Graph, NodeId};
use opsched_schedule::{
    GpuStreams, Platform, Schedule, ScheduleError, Scheduler, SchedulerStats, StreamPlan,
};

/// Nimble: minimum-equivalent-graph matching, chain merging (completed to a minimum chain
/// cover), folding onto the platform's streams. See the module docs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Nimble;

/// The transitive reduction of a graph's operators.
#[derive(Clone, Debug, PartialEq)]
pub struct Reduction {
    /// The operators, in [`Graph::ops`] (topological) order; indices below refer to it.
    pub ops: Vec<NodeId>,
    /// Kept successors of each operator, ascending.
    pub succs: Vec<Vec<usize>>,
    /// Operator-to-operator edges of the graph.
    pub original_edges: usize,
}

impl Reduction {
    /// Edges kept.
    pub fn edge_count(&self) -> usize {
        self.succs.iter().map(Vec::len).sum()
    }
}

/// What Nimble derives before folding, in indices of [`Reduction::ops`].
#[derive(Clone, Debug, PartialEq)]
pub struct NimbleAnalysis {
    pub reduction: Reduction,
    /// Size of the maximum matching on the reduced graph.
    pub matching: usize,
    /// Paths of the reduced graph from the matching (`ops - matching`), each in order.
    pub chains: Vec<Vec<usize>>,
    /// Chains merged by Nimble's own chain matching (step 3), each in topological order.
    pub nimble_streams: Vec<Vec<usize>>,
    /// The logical streams after completion (step 4): a minimum chain cover, as many as the
    /// graph's width; each in topological order, sorted by first operator.
    pub streams: Vec<Vec<usize>>,
}

fn bit(bits: &[u64], j: usize) -> bool {
    bits.get(j / 64).is_some_and(|w| w >> (j % 64) & 1 == 1)
}

/// The transitive reduction (minimum equivalent graph) of `g`'s operators: `u -> v` is kept iff
/// no other direct successor of `u` reaches `v`.
pub fn transitive_reduction(g: &Graph) -> Reduction {
    let ops: Vec<NodeId> = g.ops().collect();
    let reach = reachability(g, &ops);
    reduce_with(g, ops, &reach)
}

fn positions(g: &Graph, ops: &[NodeId]) -> Vec<usize> {
    let mut pos = vec![usize::MAX; g.len()];
    for (i, op) in ops.iter().enumerate() {
        if let Some(p) = pos.get_mut(op.index()) {
            *p = i;
        }
    }
    pos
}

fn reduce_with(g: &Graph, ops: Vec<NodeId>, reach: &[Vec<u64>]) -> Reduction {
    let pos = positions(g, &ops);
    let words = ops.len().div_ceil(64);
    let mut original_edges = 0;
    let succs = ops
        .iter()
        .map(|&u| {
            let direct: Vec<usize> = g
                .succs(u)
                .filter_map(|n| pos.get(n.index()).copied())
                .filter(|&p| p != usize::MAX)
                .collect();
            original_edges += direct.len();
            // Everything reachable from a direct successor; a successor is not in its own set.
            let mut via = vec![0u64; words];
            for &w in &direct {
                if let Some(r) = reach.get(w) {
                    for (a, b) in via.iter_mut().zip(r) {
                        *a |= b;
                    }
                }
            }
            let mut kept: Vec<usize> = direct.into_iter().filter(|&v| !bit(&via, v)).collect();
            kept.sort_unstable();
            kept
        })
        .collect();
    Reduction {
        ops,
        succs,
        original_edges,
    }
}

const FREE: usize = usize::MAX;

/// Most bytes the reachability bitsets of [`Nimble::analyze`] may take (`n^2 / 8` for `n`
/// operators: 2 GiB is about 131,000 operators). Beyond it Nimble refuses the graph instead of
/// running out of memory.
pub const MAX_CLOSURE_BYTES: u64 = 2 << 30;

/// The bipartite graph a matching runs on, read in place: left vertex `u`'s neighbours in
/// ascending order, without materializing lists (the transitive closure's would take
/// quadratic memory).
trait Adjacency {
    fn left(&self) -> usize;
    /// The smallest neighbour of `u` that is at least `from`.
    fn next_from(&self, u: usize, from: usize) -> Option<usize>;
    fn has(&self, u: usize, v: usize) -> bool {
        self.next_from(u, v) == Some(v)
    }
}

/// Sorted, duplicate-free neighbour lists.
impl Adjacency for [Vec<usize>] {
    fn left(&self) -> usize {
        self.len()
    }
    fn next_from(&self, u: usize, from: usize) -> Option<usize> {
        let list = &self[u];
        list.get(list.partition_point(|&v| v < from)).copied()
    }
}

/// The transitive closure: `u`'s neighbours are the set bits of its reachability row.
struct Closure<'a>(&'a [Vec<u64>]);

impl Adjacency for Closure<'_> {
    fn left(&self) -> usize {
        self.0.len()
    }
    fn next_from(&self, u: usize, from: usize) -> Option<usize> {
        let row = &self.0[u];
        let mut w = from / 64;
        let mut bits = row.get(w)? & (u64::MAX << (from % 64));
        loop {
            if bits != 0 {
                return Some(w * 64 + bits.trailing_zeros() as usize);
            }
            w += 1;
            bits = *row.get(w)?;
        }
    }
}

/// Nimble's chain order: chain `a` before chain `b` when `a`'s last operator reaches `b`'s
/// first; `ends` holds each chain's (first, last).
struct ChainOrder<'a> {
    reach: &'a [Vec<u64>],
    ends: &'a [(usize, usize)],
}

impl Adjacency for ChainOrder<'_> {
    fn left(&self) -> usize {
        self.ends.len()
    }
    fn next_from(&self, a: usize, from: usize) -> Option<usize> {
        let (_, last) = *self.ends.get(a)?;
        let r = self.reach.get(last).map(Vec::as_slice).unwrap_or(&[]);
        (from..self.ends.len()).find(|&b| bit(r, self.ends[b].0))
    }
}

/// Maximum bipartite matching (Hopcroft-Karp) of left vertices `0..adj.left()` with right
/// vertices `0..n_right`, grown from the matching `init` (partner of each left vertex or
/// [`FREE`]; pairs that are not edges of `adj` or clash are dropped). Returns the partner of
/// each left vertex and the matching size.
fn max_matching_from<A: Adjacency + ?Sized>(
    adj: &A,
    n_right: usize,
    init: &[usize],
) -> (Vec<usize>, usize) {
    let n_left = adj.left();
    let mut match_l = vec![FREE; n_left];
    let mut match_r = vec![FREE; n_right];
    let mut size = 0;
    for (u, &v) in init.iter().enumerate().take(n_left) {
        if v != FREE && match_r.get(v) == Some(&FREE) && adj.has(u, v) {
            match_l[u] = v;
            match_r[v] = u;
            size += 1;
        }
    }
    let mut dist = vec![usize::MAX; n_left];
    let mut next = vec![0usize; n_left];
    loop {
        // BFS from the free left vertices, layering by alternating paths.
        let mut q = VecDeque::new();
        for u in 0..n_left {
            if match_l[u] == FREE {
                dist[u] = 0;
                q.push_back(u);
            } else {
                dist[u] = usize::MAX;
            }
        }
        let mut found = false;
        while let Some(u) = q.pop_front() {
            let mut from = 0;
            while let Some(v) = adj.next_from(u, from) {
                from = v + 1;
                match match_r.get(v).copied() {
                    Some(FREE) => found = true,
                    Some(w) if dist[w] == usize::MAX => {
                        dist[w] = dist[u] + 1;
                        q.push_back(w);
                    }
                    _ => {}
                }
            }
        }
        if !found {
            break;
        }
        // DFS along the layers from each free left vertex (iteratively).
        next.iter_mut().for_each(|n| *n = 0);
        for root in 0..n_left {
            if match_l[root] != FREE {
                continue;
            }
            let mut stack = vec![root];
            let mut via: Vec<usize> = Vec::new();
            while let Some(&u) = stack.last() {
                let Some(v) = adj.next_from(u, next[u]) else {
                    dist[u] = usize::MAX;
                    stack.pop();
                    via.pop();
                    continue;
                };
                next[u] = v + 1;
                match match_r.get(v).copied() {
                    Some(FREE) => {
                        // Augment along the stack: stack[k] takes via[k], the top takes v.
                        via.push(v);
                        for (&l, &r) in stack.iter().zip(&via) {
                            match_l[l] = r;
                            match_r[r] = l;
                        }
                        size += 1;
                        break;
                    }
                    Some(w) if dist[w] == dist[u].saturating_add(1) => {
                        via.push(v);
                        stack.push(w);
                    }
                    _ => {}
                }
            }
        }
    }
    (match_l, size)
}

/// Maximum bipartite matching from scratch (see [`max_matching_from`]).
fn max_matching<A: Adjacency + ?Sized>(adj: &A, n_right: usize) -> (Vec<usize>, usize) {
    max_matching_from(adj, n_right, &[])
}

/// Paths from a matching, sorted by their first vertex (each path is in topological order
/// when every matched pair is ordered).
fn sorted_paths(succ: &[usize]) -> Vec<Vec<usize>> {
    let mut ps = paths(succ);
    ps.sort_by_key(|p| p.first().copied());
    ps
}

/// Paths from a matching: `succ[u]` is `u`'s matched successor (or [`FREE`]). Paths are listed
/// by their first vertex, ascending.
fn paths(succ: &[usize]) -> Vec<Vec<usize>> {
    let n = succ.len();
    let mut has_pred = vec![false; n];
    for &v in succ {
        if let Some(h) = has_pred.get_mut(v) {
            *h = true;
        }
    }
    (0..n)
        .filter(|&u| !has_pred[u])
        .map(|head| {
            let mut path = vec![head];
            let mut u = head;
            while let Some(&v) = succ.get(u) {
                if v == FREE || path.len() > n {
                    break;
                }
                path.push(v);
                u = v;
            }
            path
        })
        .collect()
}

impl Nimble {
    /// Steps 1 to 4 of the module docs: reduction, matching, chains, Nimble's merged streams,
    /// logical streams.
    pub fn analyze(g: &Graph) -> NimbleAnalysis {
        let ops: Vec<NodeId> = g.ops().collect();
        let reach = reachability(g, &ops);
        let reduction = reduce_with(g, ops, &reach);
        let n = reduction.ops.len();

        let (succ, matching) = max_matching(reduction.succs.as_slice(), n);
        let chains = paths(&succ);

        // Chain order: a before b when a's last op reaches b's first op (transitive).
        let ends: Vec<(usize, usize)> = chains
            .iter()
            .map(|c| {
                let first = c.first().copied().unwrap_or(0);
                let last = c.last().copied().unwrap_or(first);
                (first, last)
            })
            .collect();
        let chain_order = ChainOrder {
            reach: &reach,
            ends: &ends,
        };
        let (chain_succ, _) = max_matching(&chain_order, chains.len());
        // The operator-level matching this amounts to: the reduction's matched edges, plus
        // last(a) -> first(b) for chain b merged after chain a.
        let mut merged = succ;
        for (a, &b) in chain_succ.iter().enumerate() {
            if let (Some(&(_, last)), Some(&(first, _))) = (ends.get(a), ends.get(b)) {
                if let Some(x) = merged.get_mut(last) {
                    *x = first;
                }
            }
        }
        let nimble_streams = sorted_paths(&merged);

        // Completion: grow that matching to a maximum one in the transitive closure.
        let (full, _) = max_matching_from(&Closure(&reach), n, &merged);
        let streams = sorted_paths(&full);
        NimbleAnalysis {
            reduction,
            matching,
            chains,
            nimble_streams,
            streams,
        }
    }

    /// Fold `logical` streams (indices into `ops`) onto at most `k` streams (step 4).
    /// Returns the physical stream of each logical stream and the cost queries made.
    fn fold(
        g: &Graph,
        ops: &[NodeId],
        logical: &[Vec<usize>],
        k: usize,
        cost: &dyn CostModel,
    ) -> (Vec<usize>, u64) {
        if logical.len() <= k {
            return ((0..logical.len()).collect(), 0);
        }
        let mut stream_of = vec![FREE; ops.len()];
        for (s, l) in logical.iter().enumerate() {
            for &i in l {
                if let Some(x) = stream_of.get_mut(i) {
                    *x = s;
                }
            }
        }
        let pos = positions(g, ops);
        let mut phys = vec![FREE; logical.len()];
        let mut free = vec![0.0f64; k];
        let mut finish = vec![0.0f64; ops.len()];
        let mut queries = 0;
        for (i, &op) in ops.iter().enumerate() {
            let Some(&s) = stream_of.get(i) else { continue };
            let Some(p) = phys.get_mut(s) else { continue };
            if *p == FREE {
                *p = (0..k)
                    .min_by(|&a, &b| free[a].total_cmp(&free[b]).then(a.cmp(&b)))
                    .unwrap_or(0);
            }
            let p = *p;
            let ready = g
                .preds(op)
                .filter_map(|n| pos.get(n.index()).copied())
                .filter_map(|j| finish.get(j).copied())
                .fold(0.0f64, f64::max);
            let start = ready.max(free.get(p).copied().unwrap_or(0.0));
            let t = cost.op_time(g, op);
            queries += 1;
            finish[i] = start + t;
            if let Some(f) = free.get_mut(p) {
                *f = start + t;
            }
        }
        (phys, queries)
    }
}

impl Scheduler for Nimble {
    fn name(&self) -> &str {
        "nimble"
    }

    fn schedule(
        &self,
        g: &Graph,
        platform: &Platform,
        cost: &dyn CostModel,
    ) -> Result<(Schedule, SchedulerStats), ScheduleError> {
        platform.check("nimble")?;
        let n = opsched_graph::limits::count(g.op_count());
        let closure_bytes = n.saturating_mul(n.div_ceil(64)).saturating_mul(8);
        if closure_bytes > MAX_CLOSURE_BYTES {
            return Err(ScheduleError::Config(format!(
                "nimble: {n} operators need {} MB for the transitive closure, more than the \
                 {} MB allowed; schedule this graph with lios, opara or greedy",
                closure_bytes >> 20,
                MAX_CLOSURE_BYTES >> 20
            )));
        }
        let start = Instant::now();
        let a = Self::analyze(g);
        let ops = &a.reduction.ops;
        let (phys, queries) = Self::fold(g, ops, &a.streams, platform.streams, cost);
        let used = phys
            .iter()
            .filter(|&&p| p != FREE)
            .max()
            .map_or(0, |&p| p + 1);
        let mut on = vec![FREE; ops.len()];
        for (s, l) in a.streams.iter().enumerate() {
            let p = phys.get(s).copied().unwrap_or(0);
            for &i in l {
                if let Some(x) = on.get_mut(i) {
                    *x = p;
                }
            }
        }
        let mut streams: Vec<Vec<NodeId>> = vec![Vec::new(); used];
        for (i, &op) in ops.iter().enumerate() {
            let p = on.get(i).copied().unwrap_or(FREE);
            match streams.get_mut(p) {
                Some(st) => st.push(op),
                None => {
                    return Err(ScheduleError::Invalid(format!(
                        "nimble left operator '{}' without a stream",
                        g.node(op).name
                    )))
                }
            }
        }
        streams.retain(|s| !s.is_empty());
        let n_streams = streams.len();
        let plan = Schedule::Streams(StreamPlan {
            gpus: vec![GpuStreams {
                streams,
                launch_order: Some(ops.clone()),
            }],
        });
        let mut stats = SchedulerStats {
            states: ops.len() as u64,
            transitions: a.reduction.edge_count() as u64,
            cost_queries: queries,
            ..SchedulerStats::default()
        };
        let extra = [
            ("chains", a.chains.len()),
            ("matching", a.matching),
            ("reduced_edges", a.reduction.edge_count()),
            ("original_edges", a.reduction.original_edges),
            ("nimble_streams", a.nimble_streams.len()),
            ("logical_streams", a.streams.len()),
            ("streams", n_streams),
        ];
        for (k, v) in extra {
            stats.extra.insert(k.into(), v.into());
        }
        stats.wall_ms = start.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(
            model = %g.name,
            ops = ops.len(),
            chains = a.chains.len(),
            logical_streams = a.streams.len(),
            streams = n_streams,
            "nimble schedule"
        );
        Ok((plan, stats))
    }
}
