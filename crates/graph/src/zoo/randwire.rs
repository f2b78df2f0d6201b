//! RandWire-WS large (Xie et al. 2019), the "randwire_large" of IOS
//! (`python/ios/models/randwire.py` of mit-han-lab/inter-operator-scheduler), with random graphs
//! from our own Watts-Strogatz generator ([`watts_strogatz`]) and a fixed seed ([`SEED`]).
//!
//! # Structure (as IOS)
//! * Stem: one 3x3 stride-2 convolution to C/2 = 77 channels (IOS's "regular" front, no
//!   activation), C = 154.
//! * Four random-wiring stages of 16, 32, 32, 32 nodes (WS graphs, k = 4, p = 0.75) with C, 2C,
//!   4C, 8C channels. Every node is one operator: relu + separable 3x3 convolution on the sum of
//!   its predecessors' outputs (one term with several values). Nodes without predecessors read
//!   the stage input with stride 2. The stage output is an identity node whose single term sums
//!   the sink nodes (IOS sums them; the paper averages, which is the same up to a scale).
//! * Head: relu, 1x1 convolution to 1280 channels, global average pool. Like IOS, no classifier.
//!
//! # Counts
//! Operators: 1 + (16 + 1) + 3 x (32 + 1) + 3 = 120 for every seed. Edges: the graph edges
//! (n k / 2 per stage: 32 + 3 x 64 = 224), plus one edge per source node (from the stage input)
//! and one per sink node (to the stage output), plus 3 in the head: 227 + sources + sinks.
//! IOS's generated graphs (`ws-16-4-0.75-2.txt`, `ws-32-4-0.75-{3,4,5}.txt`) have 33 sources
//! and sinks in all, 260 edges. [`SEED`] was picked (by the ignored test `seed_scan`, over seeds
//! 0..2000) so that ours also have 33, hence exactly 260 edges, with the stages close to IOS's:
//! sources + sinks per stage 7, 8, 8, 10 (IOS: 7, 9, 7, 10). The counts 120 / 260 come from this
//! seed; the test `randwire_counts` pins them, so a change of the generator or the seed is
//! caught.

use crate::error::{GraphError, Result};
use crate::graph::{Graph, NodeId, Value};
use crate::op::{Activation, Conv2d, Op, Pool2d};
use crate::rng::SplitMix64;
use crate::zoo::ZooConfig;
use crate::GraphBuilder;

/// Seed of the SplitMix64 stream the four stage graphs are drawn from, in order.
pub(crate) const SEED: u64 = 603;

/// Smallest input side accepted: the network downsamples by 32.
pub(crate) const MIN_INPUT_SIZE: usize = 32;

/// Channels C of the first stage (RandWire large, regular regime).
const CHANNELS: usize = 154;
/// Nodes per stage.
const STAGE_NODES: [usize; 4] = [16, 32, 32, 32];
/// Each node of the ring lattice is joined to its `K` nearest neighbours.
const K: usize = 4;
/// Rewiring probability.
const P: f64 = 0.75;
/// Channels of the head's 1x1 convolution.
const HEAD_CHANNELS: usize = 1280;

/// A Watts-Strogatz small-world graph on nodes `0..n`, oriented from the lower to the higher
/// index (a DAG), as RandWire does. Returns the sorted edges `(u, v)` with `u < v`.
///
/// The ring lattice joins every node to its `k / 2` neighbours on each side. Then, for every
/// node `i` in order and every `j` in `1..=k/2`, with probability `p` the edge `(i, i + j mod n)`
/// is replaced by an edge from `i` to a node drawn uniformly among those not yet adjacent to `i`
/// (this is the generator IOS took from RandWireNN's `ws.py`). Node `i` keeps the edges it
/// rewires, so every node keeps degree at least `k / 2`, and the graph keeps `n k / 2` edges.
///
/// Errors unless `k` is even, `0 < k < n` and `0 <= p <= 1`.
pub(crate) fn watts_strogatz(
    n: usize,
    k: usize,
    p: f64,
    rng: &mut SplitMix64,
) -> Result<Vec<(usize, usize)>> {
    if k == 0 || !k.is_multiple_of(2) || k >= n {
        return Err(GraphError::invalid(
            "watts_strogatz",
            format!("k = {k} must be even with 0 < k < n = {n}"),
        ));
    }
    if !(0.0..=1.0).contains(&p) {
        return Err(GraphError::invalid(
            "watts_strogatz",
            format!("p = {p} must lie in [0, 1]"),
        ));
    }
    // Symmetric adjacency matrix, row-major; the diagonal is set so a node never picks itself.
    let mut adj = vec![false; n * n];
    let link = |adj: &mut [bool], a: usize, b: usize, on: bool| {
        adj[a * n + b] = on;
        adj[b * n + a] = on;
    };
    for i in 0..n {
        link(&mut adj, i, i, true);
        for j in 1..=k / 2 {
            link(&mut adj, i, (i + j) % n, true);
        }
    }
    for i in 0..n {
        for j in 1..=k / 2 {
            let current = (i + j) % n;
            if rng.next_f64() >= p {
                continue;
            }
            let free: Vec<usize> = (0..n).filter(|&x| !adj[i * n + x]).collect();
            if free.is_empty() {
                continue;
            }
            let to = free[rng.below(free.len())];
            link(&mut adj, i, current, false);
            link(&mut adj, i, to, true);
        }
    }
    let mut edges = Vec::with_capacity(n * k / 2);
    for (u, row) in adj.chunks(n).enumerate() {
        for (v, &on) in row.iter().enumerate().skip(u + 1) {
            if on {
                edges.push((u, v));
            }
        }
    }
    Ok(edges)
}

pub(super) fn build(cfg: &ZooConfig, size: usize) -> Result<Graph> {
    if size < MIN_INPUT_SIZE {
        return Err(GraphError::invalid(
            "randwire",
            format!("input size {size} is too small (at least {MIN_INPUT_SIZE})"),
        ));
    }
    let mut rng = SplitMix64::new(SEED);
    let mut b = GraphBuilder::new("randwire_large", cfg.dtype);
    let x = b.input("input", vec![cfg.batch, 3, size, size]);

    b.block("stem");
    let mut v = b.conv(
        "stem_conv",
        x,
        Conv2d::new(CHANNELS / 2, 3).stride(2).bias(true),
    );
    for (s, &n) in STAGE_NODES.iter().enumerate() {
        let edges = watts_strogatz(n, K, P, &mut rng)?;
        let name = format!("stage_{}", s + 1);
        b.block(name.clone());
        v = stage(&mut b, &name, v, CHANNELS << s, n, &edges);
    }

    b.block("head");
    let r = b.act("head_relu", v, Activation::Relu);
    let c = b.conv("head_conv", r, Conv2d::new(HEAD_CHANNELS, 1).bias(true));
    b.pool("head_pool", c, Pool2d::global_avg());
    b.end_block();
    b.finish()
}

/// relu + separable 3x3 convolution (depthwise with `stride`, pointwise to `out`) on the sum of
/// `inputs`: one operator.
fn node_op(
    b: &mut GraphBuilder,
    name: &str,
    inputs: &[NodeId],
    out: usize,
    stride: usize,
) -> NodeId {
    let cin = inputs.first().map(|&i| b.channels(i)).unwrap_or(0).max(1);
    let op = Op::Sequential {
        ops: vec![
            Op::Activation {
                act: Activation::Relu,
            },
            Op::Conv2d(Conv2d::new(cin, 3).stride(stride).groups(cin).bias(true)),
            Op::Conv2d(Conv2d::new(out, 1).bias(true)),
        ],
    };
    let term = inputs.iter().map(|&i| Value::whole(i)).collect();
    b.node(name, op, vec![term])
}

/// One random-wiring stage on the DAG `edges` (`u < v`) over `n` nodes.
fn stage(
    b: &mut GraphBuilder,
    name: &str,
    input: NodeId,
    channels: usize,
    n: usize,
    edges: &[(usize, usize)],
) -> NodeId {
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut has_succ = vec![false; n];
    for &(u, v) in edges {
        if u < v && v < n {
            preds[v].push(u);
            has_succ[u] = true;
        }
    }
    // Edges go from lower to higher index, so index order is a topological order.
    let mut outs: Vec<NodeId> = Vec::with_capacity(n);
    for (i, ps) in preds.iter().enumerate() {
        let node_name = format!("{name}/node_{i}");
        let id = if ps.is_empty() {
            node_op(b, &node_name, &[input], channels, 2)
        } else {
            let ins: Vec<NodeId> = ps.iter().map(|&p| outs[p]).collect();
            node_op(b, &node_name, &ins, channels, 1)
        };
        outs.push(id);
    }
    let sinks: Vec<Value> = (0..n)
        .filter(|&i| !has_succ[i])
        .map(|i| Value::whole(outs[i]))
        .collect();
    b.node(&format!("{name}/out"), Op::Identity, vec![sinks])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ws_graph_properties() {
        for &(n, k, p, seed) in &[
            (16, 4, 0.75, 1u64),
            (32, 4, 0.75, 2),
            (32, 4, 0.0, 3),
            (32, 4, 1.0, 4),
            (40, 6, 0.5, 5),
            (8, 2, 0.3, 6),
        ] {
            let mut rng = SplitMix64::new(seed);
            let edges = watts_strogatz(n, k, p, &mut rng).expect("valid parameters");
            // n k / 2 edges, none repeated, oriented low -> high (a DAG on nodes 0..n).
            assert_eq!(edges.len(), n * k / 2, "n={n} k={k} p={p}");
            let mut sorted = edges.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted, edges, "edges must be sorted and distinct");
            assert!(edges.iter().all(|&(u, v)| u < v && v < n));
            // Every node keeps degree >= k / 2 in the undirected graph.
            let mut deg = vec![0usize; n];
            for &(u, v) in &edges {
                deg[u] += 1;
                deg[v] += 1;
            }
            assert!(deg.iter().all(|&d| d >= k / 2), "degrees {deg:?}");
            if p == 0.0 {
                // No rewiring: the ring lattice itself, every node of degree k.
                assert!(deg.iter().all(|&d| d == k));
                assert!(edges.contains(&(0, n - 1)) && edges.contains(&(0, 1)));
            }
        }
    }

    #[test]
    fn ws_is_deterministic_and_seed_dependent() {
        let a = watts_strogatz(32, 4, 0.75, &mut SplitMix64::new(9)).unwrap_or_default();
        let b = watts_strogatz(32, 4, 0.75, &mut SplitMix64::new(9)).unwrap_or_default();
        let c = watts_strogatz(32, 4, 0.75, &mut SplitMix64::new(10)).unwrap_or_default();
        assert!(!a.is_empty());
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn ws_rejects_bad_parameters() {
        let mut rng = SplitMix64::new(0);
        assert!(watts_strogatz(16, 3, 0.5, &mut rng).is_err());
        assert!(watts_strogatz(16, 0, 0.5, &mut rng).is_err());
        assert!(watts_strogatz(4, 4, 0.5, &mut rng).is_err());
        assert!(watts_strogatz(16, 4, 1.5, &mut rng).is_err());
        assert!(watts_strogatz(16, 4, f64::NAN, &mut rng).is_err());
    }

    /// Prints the edge counts of candidate seeds (run with `--ignored --nocapture`).
    #[test]
    #[ignore]
    fn seed_scan() {
        for seed in 0..2000u64 {
            let mut rng = SplitMix64::new(seed);
            let mut ends = Vec::new();
            for &n in &STAGE_NODES {
                let e = watts_strogatz(n, K, P, &mut rng).unwrap_or_default();
                let src = (0..n).filter(|&i| !e.iter().any(|&(_, v)| v == i)).count();
                let snk = (0..n).filter(|&i| !e.iter().any(|&(u, _)| u == i)).count();
                ends.push((src, snk));
            }
            let total: usize = 227 + ends.iter().map(|&(a, b)| a + b).sum::<usize>();
            println!("seed {seed}: edges {total} {ends:?}");
        }
    }
}
