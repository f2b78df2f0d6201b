//! Helpers shared by the baseline tests.

#![allow(dead_code)]

use opsched_cost::device::{H100, NVLINK4};
use opsched_cost::CostModel;
use opsched_graph::random::{layered_dag, LayeredDagParams};
use opsched_graph::{Graph, NodeDef, NodeId, Op, Value};
use opsched_schedule::{lower, lower_bound, simulate, validate, Platform, Schedule};

/// One H100 with `streams` streams.
pub fn platform(streams: usize) -> Platform {
    Platform {
        gpus: 1,
        streams,
        device: H100,
        link: NVLINK4,
    }
}

/// Validate `s` and check its simulated makespan against the lower bound; returns the makespan.
pub fn check_valid_and_bounded(g: &Graph, s: &Schedule, p: &Platform, cost: &dyn CostModel) -> f64 {
    if let Err(e) = validate(g, s, p) {
        panic!("{}: invalid schedule: {e}", g.name);
    }
    let plan = lower(g, s).unwrap();
    let makespan = simulate(g, &plan, cost).unwrap().makespan_ms;
    let lb = lower_bound(g, cost, 1).value();
    assert!(
        makespan >= lb - 1e-9,
        "{}: makespan {makespan} below the lower bound {lb}",
        g.name
    );
    makespan
}

/// A small layered random DAG whose parameters are always feasible.
pub fn small_dag(ops: usize, layers: usize, density: f64, seed: u64) -> Graph {
    let layers = layers.clamp(2, ops.max(2));
    let ops = ops.max(layers);
    let lo = ops - 1;
    let hi = (ops * ops - (layers - 1) - (ops - layers + 1) * (ops - layers + 1)) / 2;
    let edges = lo + ((hi.saturating_sub(lo)) as f64 * density.clamp(0.0, 1.0)) as usize;
    layered_dag(&LayeredDagParams {
        ops,
        layers,
        edges,
        seed,
        ..LayeredDagParams::default()
    })
    .unwrap()
}

/// A DAG of abstract 1 ms ops named by `names`, with edges given by name.
pub fn hand_dag(names: &[&str], edges: &[(&str, &str)]) -> Graph {
    let idx = |n: &str| names.iter().position(|&m| m == n).unwrap();
    let defs = names
        .iter()
        .map(|&name| NodeDef {
            name: name.to_string(),
            op: Op::Abstract {
                time_ms: 1.0,
                util: 1.0,
            },
            inputs: edges
                .iter()
                .filter(|&&(_, d)| d == name)
                .map(|&(s, _)| vec![Value::whole(NodeId(idx(s) as u32))])
                .collect(),
            declared_shape: None,
        })
        .collect();
    Graph::from_nodes("hand", opsched_graph::DType::F32, defs).unwrap()
}

/// Brute-force reachability among all nodes: `r[u][v]` iff a non-empty path u -> v.
pub fn brute_reach(n: usize, succs: &dyn Fn(usize) -> Vec<usize>) -> Vec<Vec<bool>> {
    (0..n)
        .map(|u| {
            let mut seen = vec![false; n];
            let mut stack = succs(u);
            while let Some(v) = stack.pop() {
                if !seen[v] {
                    seen[v] = true;
                    stack.extend(succs(v));
                }
            }
            seen
        })
        .collect()
}
