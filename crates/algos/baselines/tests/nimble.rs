//! Nimble: valid and above the lower bound on every zoo model and on random DAGs; the
//! transitive reduction keeps reachability and has no redundant edge (brute force); the
//! matching is maximum; the logical streams number the graph's width (Dilworth).

#![allow(clippy::unwrap_used)]

mod common;

use common::{brute_reach, check_valid_and_bounded, hand_dag, platform, small_dag};
use opsched_baselines::{transitive_reduction, Nimble, NimbleAnalysis, Sequential};
use opsched_cost::{AnalyticalModel, HiosSimLaw};
use opsched_graph::analysis::width;
use opsched_graph::zoo::{self, ZooConfig};
use opsched_graph::Graph;
use opsched_schedule::{Schedule, Scheduler};
use proptest::prelude::*;

/// Maximum matching size by plain augmenting paths (Kuhn), independent of the library's.
fn kuhn(adj: &[Vec<usize>], n_right: usize) -> usize {
    fn aug(u: usize, adj: &[Vec<usize>], mr: &mut [Option<usize>], seen: &mut [bool]) -> bool {
        for &v in &adj[u] {
            if !seen[v] {
                seen[v] = true;
                if mr[v].is_none() || aug(mr[v].unwrap(), adj, mr, seen) {
                    mr[v] = Some(u);
                    return true;
                }
            }
        }
        false
    }
    let mut mr = vec![None; n_right];
    (0..adj.len())
        .filter(|&u| aug(u, adj, &mut mr, &mut vec![false; n_right]))
        .count()
}

/// Everything the analysis promises, checked from scratch.
fn check_analysis(g: &Graph, a: &NimbleAnalysis) {
    let r = &a.reduction;
    let n = r.ops.len();
    assert_eq!(n, g.op_count());
    let pos = |id: opsched_graph::NodeId| r.ops.iter().position(|&o| o == id).unwrap();
    let orig = |u: usize| -> Vec<usize> {
        g.succs(r.ops[u])
            .filter(|&s| !g.node(s).op.is_input())
            .map(pos)
            .collect()
    };
    // Kept edges are graph edges.
    for u in 0..n {
        let o = orig(u);
        assert!(r.succs[u].iter().all(|v| o.contains(v)), "{}", g.name);
    }
    // The matching is maximum and the chains are disjoint paths of the reduction covering all.
    assert_eq!(
        a.matching,
        kuhn(&r.succs, n),
        "{}: matching not maximum",
        g.name
    );
    assert_eq!(a.chains.len(), n - a.matching, "{}", g.name);
    let mut seen = vec![0usize; n];
    for c in &a.chains {
        for w in c.windows(2) {
            assert!(
                r.succs[w[0]].contains(&w[1]),
                "{}: chain step not an edge",
                g.name
            );
        }
        for &x in c {
            seen[x] += 1;
        }
    }
    assert!(
        seen.iter().all(|&k| k == 1),
        "{}: chains do not partition",
        g.name
    );
    // Nimble's merged streams and the logical streams: partitions into totally ordered sets;
    // the logical streams are as many as the width.
    let reach = brute_reach(n, &orig);
    for (what, streams) in [("nimble", &a.nimble_streams), ("logical", &a.streams)] {
        let mut seen = vec![0usize; n];
        for s in streams {
            for w in s.windows(2) {
                assert!(reach[w[0]][w[1]], "{}: {what} stream not a chain", g.name);
            }
            for &x in s {
                seen[x] += 1;
            }
        }
        assert!(
            seen.iter().all(|&k| k == 1),
            "{}: {what} streams do not partition",
            g.name
        );
    }
    assert!(a.chains.len() >= a.nimble_streams.len());
    assert!(a.nimble_streams.len() >= a.streams.len());
    assert_eq!(
        a.streams.len(),
        width(g),
        "{}: logical streams != width",
        g.name
    );
}

/// Brute force: same reachability, and no kept edge implied by the other kept edges.
fn check_reduction(g: &Graph) {
    let r = transitive_reduction(g);
    let n = r.ops.len();
    let pos = |id: opsched_graph::NodeId| r.ops.iter().position(|&o| o == id).unwrap();
    let orig = |u: usize| -> Vec<usize> {
        g.succs(r.ops[u])
            .filter(|&s| !g.node(s).op.is_input())
            .map(pos)
            .collect()
    };
    let full = brute_reach(n, &orig);
    let kept = brute_reach(n, &|u| r.succs[u].clone());
    assert_eq!(full, kept, "{}: reachability changed", g.name);
    for u in 0..n {
        for &v in &r.succs[u] {
            let without = brute_reach(n, &|x| {
                r.succs[x]
                    .iter()
                    .copied()
                    .filter(|&y| !(x == u && y == v))
                    .collect()
            });
            assert!(!without[u][v], "{}: edge {u} -> {v} is redundant", g.name);
        }
    }
    assert_eq!(r.original_edges, g.edge_count());
    assert!(r.edge_count() <= r.original_edges);
}

fn streams_of(s: &Schedule) -> usize {
    let Schedule::Streams(p) = s else {
        panic!("nimble gives a stream plan");
    };
    assert_eq!(p.gpus.len(), 1);
    p.gpus[0].streams.len()
}

#[test]
fn hand_built_dag() {
    // a -> b -> c, a -> c (redundant); a -> d; c -> e, d -> e; concat-like fan.
    let g = hand_dag(
        &["a", "b", "c", "d", "e"],
        &[
            ("a", "b"),
            ("b", "c"),
            ("a", "c"),
            ("a", "d"),
            ("c", "e"),
            ("d", "e"),
        ],
    );
    let r = transitive_reduction(&g);
    assert_eq!(r.original_edges, 6);
    assert_eq!(r.edge_count(), 5);
    let a = Nimble::analyze(&g);
    assert_eq!(a.matching, 3);
    assert_eq!(a.chains.len(), 2);
    assert_eq!(a.streams.len(), 2);
    check_analysis(&g, &a);
    check_reduction(&g);
    let cost = AnalyticalModel::default();
    for k in 1..=3 {
        let p = platform(k);
        let (s, stats) = Nimble.schedule(&g, &p, &cost).unwrap();
        assert_eq!(streams_of(&s), k.min(2));
        assert_eq!(stats.extra["chains"], 2);
        assert_eq!(stats.extra["reduced_edges"], 5);
        check_valid_and_bounded(&g, &s, &p, &cost);
    }
    assert_eq!(Nimble.name(), "nimble");
    assert!(Nimble.schedule(&g, &platform(0), &cost).is_err());
}

#[test]
fn paths_of_the_reduction_can_outnumber_the_width() {
    // An Inception-like join: x, y -> c -> p, q. Width 2, but the reduction's paths are 3
    // (x c p, y, q); Nimble's chain merging brings it back to 2 (y before q).
    let g = hand_dag(
        &["x", "y", "c", "p", "q"],
        &[("x", "c"), ("y", "c"), ("c", "p"), ("c", "q")],
    );
    let a = Nimble::analyze(&g);
    assert_eq!(a.chains.len(), 3);
    assert_eq!(a.nimble_streams.len(), 2);
    assert_eq!(a.streams.len(), 2);
    assert_eq!(width(&g), 2);
    check_analysis(&g, &a);
}

#[test]
fn completion_reaches_the_width_where_nimble_merging_does_not() {
    // 0, 5 -> 3 -> 2, 4 and 1, 5 -> 6 (found by search over random DAGs). Width 3 ({2, 4, 6}),
    // e.g. {5 3 2}, {0 4}, {1 6}. Matching 0-3, 3-2, 5-6 gives the paths 0 3 2, 5 6, 1, 4,
    // which no merging joins (1 reaches only 6, the middle of a path; 4 reaches nothing): 4.
    let g = hand_dag(
        &["0", "1", "2", "3", "4", "5", "6"],
        &[
            ("3", "2"),
            ("0", "3"),
            ("5", "3"),
            ("3", "4"),
            ("1", "6"),
            ("5", "6"),
        ],
    );
    let a = Nimble::analyze(&g);
    assert_eq!(width(&g), 3);
    assert_eq!(a.matching, 3);
    assert_eq!(a.streams.len(), 3);
    // Our Hopcroft-Karp picks such a matching; Nimble's merging stays at 4.
    assert_eq!(a.nimble_streams.len(), 4);
    eprintln!(
        "chains {}, nimble streams {}, logical streams {}",
        a.chains.len(),
        a.nimble_streams.len(),
        a.streams.len()
    );
    check_analysis(&g, &a);
}

#[test]
fn zoo_models() {
    let cost = AnalyticalModel::default();
    for m in zoo::models() {
        let g = m.build(&ZooConfig::default()).unwrap();
        let a = Nimble::analyze(&g);
        check_analysis(&g, &a);
        for k in [1, 2, 4, 8, 64] {
            let p = platform(k);
            let (s, stats) = Nimble.schedule(&g, &p, &cost).unwrap();
            assert!(streams_of(&s) <= k.min(a.streams.len()));
            assert_eq!(stats.extra["logical_streams"], a.streams.len());
            check_valid_and_bounded(&g, &s, &p, &cost);
        }
    }
}

/// Speedups over sequential under the default analytical model (H100), 8 streams; run with
/// `--nocapture` to see them.
#[test]
fn speedups_over_sequential_on_the_zoo() {
    let cost = AnalyticalModel::default();
    let p = platform(8);
    for m in zoo::models() {
        let g = m.build(&ZooConfig::default()).unwrap();
        let seq = check_valid_and_bounded(&g, &Sequential::plan(&g), &p, &cost);
        let (s, stats) = Nimble.schedule(&g, &p, &cost).unwrap();
        let t = check_valid_and_bounded(&g, &s, &p, &cost);
        eprintln!(
            "nimble {:<14} sequential {seq:.4} ms  nimble {t:.4} ms  speedup {:.3}x  \
             (ops {}, edges {} -> {}, matching {}, chains {}, nimble {}, logical {}, used {})",
            g.name,
            seq / t,
            g.op_count(),
            stats.extra["original_edges"],
            stats.extra["reduced_edges"],
            stats.extra["matching"],
            stats.extra["chains"],
            stats.extra["nimble_streams"],
            stats.extra["logical_streams"],
            stats.extra["streams"],
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_dags(
        ops in 2usize..40,
        layers in 2usize..10,
        density in 0.0f64..1.0,
        seed in any::<u64>(),
        streams in 1usize..6,
    ) {
        let g = small_dag(ops, layers, density, seed);
        let a = Nimble::analyze(&g);
        check_analysis(&g, &a);
        let cost = HiosSimLaw::new(AnalyticalModel::default());
        let p = platform(streams);
        let (s, _) = Nimble.schedule(&g, &p, &cost).unwrap();
        prop_assert!(streams_of(&s) <= streams);
        check_valid_and_bounded(&g, &s, &p, &cost);
    }

    #[test]
    fn reduction_by_brute_force(
        ops in 2usize..16,
        layers in 2usize..6,
        density in 0.0f64..1.0,
        seed in any::<u64>(),
    ) {
        check_reduction(&small_dag(ops, layers, density, seed));
    }
}
