//! The greedy baseline: valid and above the lower bound on every zoo model and on random DAGs;
//! exact stages on a hand-built DAG; one operator per stage with one stream.

#![allow(clippy::unwrap_used)]

mod common;

use common::{check_valid_and_bounded, hand_dag, platform, small_dag};
use opsched_baselines::{Greedy, Sequential};
use opsched_cost::{AnalyticalModel, HiosSimLaw};
use opsched_graph::zoo::{self, ZooConfig};
use opsched_graph::Graph;
use opsched_schedule::{Schedule, Scheduler};
use proptest::prelude::*;

fn stage_names(g: &Graph, s: &Schedule) -> Vec<Vec<String>> {
    let Schedule::Stages(plan) = s else {
        panic!("greedy gives a stage plan");
    };
    assert_eq!(plan.gpus.len(), 1);
    plan.gpus[0]
        .iter()
        .map(|st| {
            assert!(
                st.groups.iter().all(|grp| grp.len() == 1),
                "one op per group"
            );
            st.ops().map(|o| g.node(o).name.clone()).collect()
        })
        .collect()
}

/// a, b, c are roots; d <- a; e <- b; f <- c; g <- d, e; h <- f, g.
fn hand() -> Graph {
    hand_dag(
        &["a", "b", "c", "d", "e", "f", "g", "h"],
        &[
            ("a", "d"),
            ("b", "e"),
            ("c", "f"),
            ("d", "g"),
            ("e", "g"),
            ("f", "h"),
            ("g", "h"),
        ],
    )
}

#[test]
fn hand_built_dag_gives_the_stages_derived_by_hand() {
    let g = hand();
    // Ready operators queue up in definition order (a, b, c, ...), as in IOS.
    let names = |k| stage_names(&g, &Greedy::plan(&g, k));
    let v = |xs: &[&[&str]]| -> Vec<Vec<String>> {
        xs.iter()
            .map(|s| s.iter().map(|x| x.to_string()).collect())
            .collect()
    };
    // K = 2: {a, b}; c is left over and goes first, before d and e that became ready:
    // {c, d}; then {e, f} (g still waits for e); {g}; {h}.
    assert_eq!(
        names(2),
        v(&[&["a", "b"], &["c", "d"], &["e", "f"], &["g"], &["h"]])
    );
    // K = 3: every wave fits.
    assert_eq!(
        names(3),
        v(&[&["a", "b", "c"], &["d", "e", "f"], &["g"], &["h"]])
    );
    // K = 1: FIFO order of the queue.
    assert_eq!(
        names(1),
        v(&[
            &["a"],
            &["b"],
            &["c"],
            &["d"],
            &["e"],
            &["f"],
            &["g"],
            &["h"]
        ])
    );
    let cost = AnalyticalModel::default();
    for k in 1..=4 {
        let p = platform(k);
        let (s, stats) = Greedy.schedule(&g, &p, &cost).unwrap();
        assert_eq!(s, Greedy::plan(&g, k));
        assert!(stats.wall_ms >= 0.0);
        check_valid_and_bounded(&g, &s, &p, &cost);
    }
    assert_eq!(Greedy.name(), "greedy");
}

#[test]
fn one_stream_gives_one_op_per_stage() {
    for m in zoo::models() {
        let g = m.build(&ZooConfig::default()).unwrap();
        let st = stage_names(&g, &Greedy::plan(&g, 1));
        assert_eq!(st.len(), g.op_count(), "{}", g.name);
        assert!(st.iter().all(|s| s.len() == 1), "{}", g.name);
    }
}

#[test]
fn valid_and_above_the_lower_bound_on_every_zoo_model() {
    let cost = AnalyticalModel::default();
    for m in zoo::models() {
        let g = m.build(&ZooConfig::default()).unwrap();
        for k in [1, 2, 4, 8, 64] {
            let p = platform(k);
            let (s, _) = Greedy.schedule(&g, &p, &cost).unwrap();
            check_valid_and_bounded(&g, &s, &p, &cost);
        }
    }
}

#[test]
fn a_platform_without_streams_is_refused() {
    let g = hand();
    let cost = AnalyticalModel::default();
    assert!(Greedy.schedule(&g, &platform(0), &cost).is_err());
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
        let (s, _) = Greedy.schedule(&g, &p, &cost).unwrap();
        let t = check_valid_and_bounded(&g, &s, &p, &cost);
        eprintln!(
            "greedy {:<14} sequential {seq:.4} ms  greedy {t:.4} ms  speedup {:.3}x",
            g.name,
            seq / t
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn valid_and_above_the_lower_bound_on_random_dags(
        ops in 2usize..40,
        layers in 2usize..10,
        density in 0.0f64..1.0,
        seed in any::<u64>(),
        streams in 1usize..6,
    ) {
        let g = small_dag(ops, layers, density, seed);
        let cost = HiosSimLaw::new(AnalyticalModel::default());
        let p = platform(streams);
        let (s, _) = Greedy.schedule(&g, &p, &cost).unwrap();
        check_valid_and_bounded(&g, &s, &p, &cost);
        // Stage sizes: every stage is full except when nothing more is ready.
        let Schedule::Stages(plan) = &s else { panic!("stage plan") };
        prop_assert!(plan.gpus[0].iter().all(|st| st.groups.len() <= streams));
        let one = stage_names(&g, &Greedy::plan(&g, 1));
        prop_assert_eq!(one.len(), g.op_count());
    }
}
