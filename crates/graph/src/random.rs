//! Seeded layered random DAGs with the HIOS simulation parameters.
//!
//! HIOS (Sec. V-A) evaluates its schedulers on random "DL model structures": 200 operators in
//! 14 layers, 2 x 200 = 400 dependencies, operator time uniform in [0.1, 4] ms, a utilization
//! per operator uniform in [0.6, 1.0] (the reference simulation), and an inter-GPU transfer
//! time for the *output data of an operator* of max(0.1 ms, p x the operator's time), p = 0.8.
//! So the transfer time of an edge is taken from its **source** operator. (The reference
//! simulation code uses the destination's time; we follow the paper.)
//!
//! The generator, [`layered_dag`]:
//! 1. spreads the ops over the layers: one op per layer, then each remaining op to a uniformly
//!    random layer (every layer is non-empty);
//! 2. gives every op of layer `l > 0` one predecessor drawn uniformly from layer `l - 1`, so
//!    the longest path has exactly `layers` ops;
//! 3. adds further distinct edges, drawn uniformly from all pairs (op in a lower layer, op in
//!    a higher layer) not yet used, until there are exactly `edges`;
//! 4. draws op times and utilizations, sets transfer times;
//! 5. assigns ids: the ops, listed layer by layer, get a random permutation of `0..ops`, so ids
//!    are **not** a topological order. Node `NodeId(k)` is the op with id `k`, named `"k"`.
//!
//! Feasibility: step 2 needs `ops - |layer 0|` edges and step 3 has at most
//! `sum_{a<b} |layer a| |layer b|` pairs. Both depend on the drawn layer sizes; any
//! `ops - 1 <= edges <= (ops^2 - (layers - 1) - (ops - layers + 1)^2) / 2` is feasible for every
//! seed (the paper's 200 / 14 / 400 is). Outside that range the result depends on the seed, and
//! an infeasible draw is an error naming the numbers. Everything is deterministic per seed.

use crate::error::{GraphError, Result};
use crate::graph::{Graph, NodeDef, NodeId, Value};
use crate::op::{DType, Op};
use crate::rng::SplitMix64;

/// Parameters of [`layered_dag`]. [`Default`] is the paper's default simulation setup.
#[derive(Clone, Debug, PartialEq)]
pub struct LayeredDagParams {
    /// Number of operators (200).
    pub ops: usize,
    /// Number of layers (14, HIOS Sec. V-A; Fig. 10 sweeps 6 to 22).
    pub layers: usize,
    /// Number of distinct edges (400, twice the operators).
    pub edges: usize,
    /// Operator time range in ms, uniform in `[lo, hi)` (0.1 to 4.0).
    pub time_ms: (f64, f64),
    /// Utilization range, uniform in `[lo, hi)`, within (0, 1] (0.6 to 1.0).
    pub util: (f64, f64),
    /// Ratio p of an edge's transfer time to its source op's time (0.8).
    pub transfer_ratio: f64,
    /// Lower bound of every transfer time in ms (0.1).
    pub min_transfer_ms: f64,
    pub seed: u64,
}

impl Default for LayeredDagParams {
    fn default() -> Self {
        LayeredDagParams {
            ops: 200,
            layers: 14,
            edges: 400,
            time_ms: (0.1, 4.0),
            util: (0.6, 1.0),
            transfer_ratio: 0.8,
            min_transfer_ms: 0.1,
            seed: 0,
        }
    }
}

fn bad(message: impl Into<String>) -> GraphError {
    GraphError::invalid("layered_dag", message)
}

fn check_params(p: &LayeredDagParams) -> Result<()> {
    if p.ops == 0 {
        return Err(bad("needs at least one op"));
    }
    if p.ops > u32::MAX as usize {
        return Err(bad(format!("{} ops are too many", p.ops)));
    }
    if p.layers == 0 || p.layers > p.ops {
        return Err(bad(format!(
            "layers must lie in 1..={} (one op per layer at least), got {}",
            p.ops, p.layers
        )));
    }
    let (tlo, thi) = p.time_ms;
    if !(tlo.is_finite() && thi.is_finite() && 0.0 <= tlo && tlo <= thi) {
        return Err(bad(format!(
            "time_ms range ({tlo}, {thi}) must be finite with 0 <= lo <= hi"
        )));
    }
    let (ulo, uhi) = p.util;
    if !(ulo.is_finite() && uhi.is_finite() && 0.0 < ulo && ulo <= uhi && uhi <= 1.0) {
        return Err(bad(format!(
            "util range ({ulo}, {uhi}) must satisfy 0 < lo <= hi <= 1"
        )));
    }
    if !(p.transfer_ratio.is_finite() && p.transfer_ratio >= 0.0) {
        return Err(bad(format!(
            "transfer_ratio {} must be finite and non-negative",
            p.transfer_ratio
        )));
    }
    if !(p.min_transfer_ms.is_finite() && p.min_transfer_ms >= 0.0) {
        return Err(bad(format!(
            "min_transfer_ms {} must be finite and non-negative",
            p.min_transfer_ms
        )));
    }
    Ok(())
}

/// Number of pairs (op in layer a, op in layer b), a < b.
fn cross_pairs(sizes: &[usize]) -> u128 {
    let n: u128 = sizes.iter().map(|&s| s as u128).sum();
    let sq: u128 = sizes.iter().map(|&s| (s as u128) * (s as u128)).sum();
    (n * n - sq) / 2
}

/// Generate a layered random DAG (see the module docs). Deterministic per `p.seed`.
pub fn layered_dag(p: &LayeredDagParams) -> Result<Graph> {
    check_params(p)?;
    let n = p.ops;
    let nl = p.layers;
    let mut rng = SplitMix64::new(p.seed);

    // 1. Layer sizes.
    let mut sizes = vec![1usize; nl];
    for _ in nl..n {
        sizes[rng.below(nl)] += 1;
    }
    let mut start = Vec::with_capacity(nl + 1);
    start.push(0usize);
    for &s in &sizes {
        start.push(start[start.len() - 1] + s);
    }
    // layer_of[i]: layer of the op at (layer-ordered) position i.
    let layer_of: Vec<usize> = (0..nl)
        .flat_map(|l| std::iter::repeat_n(l, sizes[l]))
        .collect();

    let needed = n - sizes[0];
    let possible = cross_pairs(&sizes);
    if p.edges < needed {
        return Err(bad(format!(
            "{} edges cannot give each of the {needed} ops outside the first layer a \
             predecessor (layer sizes {sizes:?}; use at least {} edges)",
            p.edges,
            n - 1
        )));
    }
    if p.edges as u128 > possible {
        return Err(bad(format!(
            "{} edges exceed the {possible} possible edges between layers (layer sizes {sizes:?})",
            p.edges
        )));
    }

    // 2. One predecessor in the previous layer for every op of layer > 0.
    let mut edge_set: std::collections::HashSet<(usize, usize)> =
        std::collections::HashSet::with_capacity(p.edges);
    let mut edges: Vec<(usize, usize)> = Vec::with_capacity(p.edges);
    for (v, &l) in layer_of.iter().enumerate().skip(sizes[0]) {
        let u = start[l - 1] + rng.below(sizes[l - 1]);
        edge_set.insert((u, v));
        edges.push((u, v));
    }

    // 3. Extra edges, uniform over the unused cross-layer pairs.
    let extra = p.edges - edges.len();
    let free = possible - edges.len() as u128;
    if (extra as u128) * 2 <= free {
        // Rejection sampling over all cross-layer pairs, drawn uniformly: pair index r counts
        // the pairs of layer 0 (with every later op) first, then layer 1, ... At least half of
        // the pairs stay free, so each try succeeds with probability >= 1/2.
        let later: Vec<u128> = (0..nl).map(|l| (n - start[l + 1]) as u128).collect();
        let mut cum = Vec::with_capacity(nl + 1);
        cum.push(0u128);
        for l in 0..nl {
            cum.push(cum[l] + sizes[l] as u128 * later[l]);
        }
        while edges.len() < p.edges {
            let r = ((rng.next_u64() as u128) * possible) >> 64;
            // The layer a with cum[a] <= r < cum[a + 1] (empty ranges are skipped).
            let a = cum.partition_point(|&c| c <= r) - 1;
            let off = r - cum[a];
            let u = start[a] + (off / later[a]) as usize;
            let v = start[a + 1] + (off % later[a]) as usize;
            if edge_set.insert((u, v)) {
                edges.push((u, v));
            }
        }
    } else {
        // Dense request: fewer than 2 * extra free pairs (so at most 3 * edges in all);
        // list them and take a random subset.
        let mut pool: Vec<(usize, usize)> = Vec::new();
        for u in 0..n {
            for v in start[layer_of[u] + 1]..n {
                if !edge_set.contains(&(u, v)) {
                    pool.push((u, v));
                }
            }
        }
        for i in 0..extra {
            let j = i + rng.below(pool.len() - i);
            pool.swap(i, j);
        }
        edges.extend_from_slice(&pool[..extra]);
    }

    // 4. Costs.
    let times: Vec<f64> = (0..n)
        .map(|_| rng.uniform(p.time_ms.0, p.time_ms.1))
        .collect();
    let utils: Vec<f64> = (0..n).map(|_| rng.uniform(p.util.0, p.util.1)).collect();

    // 5. Ids: a random permutation, so ids are not a topological order.
    let mut id_of: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut id_of);

    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(u, v) in &edges {
        preds[id_of[v]].push(id_of[u]);
    }
    let mut defs: Vec<Option<NodeDef>> = vec![None; n];
    for pos in 0..n {
        let id = id_of[pos];
        let mut ps = std::mem::take(&mut preds[id]);
        ps.sort_unstable();
        defs[id] = Some(NodeDef {
            name: id.to_string(),
            op: Op::Abstract {
                time_ms: times[pos],
                util: utils[pos],
            },
            inputs: ps
                .into_iter()
                .map(|q| vec![Value::whole(NodeId(q as u32))])
                .collect(),
            declared_shape: None,
        });
    }
    let defs: Vec<NodeDef> = defs.into_iter().flatten().collect();
    let name = format!(
        "layered_n{}_l{}_e{}_seed{}",
        p.ops, p.layers, p.edges, p.seed
    );
    let mut g = Graph::from_nodes(name, DType::F32, defs)?;
    for &(u, v) in &edges {
        let ms = p.min_transfer_ms.max(p.transfer_ratio * times[u]);
        g.set_transfer_ms(NodeId(id_of[u] as u32), NodeId(id_of[v] as u32), ms);
    }
    Ok(g)
}
