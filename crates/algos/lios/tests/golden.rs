//! The running example of the LIOS paper (Fig. 3, Table III): ten operators, three streams,
//! the ideal model. LIOS's own trace, its stream plan and the simulator must all give
//! Table III (with the v6 typo fixed: p2 from 8 to 23), makespan 38; sequential is 73.

#![allow(clippy::unwrap_used)]

use opsched_cost::{AnalyticalModel, CostModel, DevicePreset, IdealModel, LinkPreset};
use opsched_graph::formats::dag;
use opsched_graph::{Graph, NodeId};
use opsched_lios::{Lios, LiosVariant};
use opsched_schedule::{lower, simulate, validate, Platform, Schedule, Scheduler};

const WEIGHTS: [f64; 10] = [3.0, 5.0, 5.0, 5.0, 8.0, 15.0, 10.0, 7.0, 13.0, 2.0];
const EDGES: [(u32, u32); 12] = [
    (1, 2),
    (1, 3),
    (1, 4),
    (1, 5),
    (2, 6),
    (3, 6),
    (4, 7),
    (5, 8),
    (6, 9),
    (7, 9),
    (8, 9),
    (9, 10),
];

/// Table III: (step, op, stream p1..p3, start, finish).
const TABLE_III: [(u32, usize, f64, f64); 10] = [
    (1, 1, 0.0, 3.0),
    (5, 1, 3.0, 11.0),
    (8, 1, 11.0, 18.0),
    (2, 2, 3.0, 8.0),
    (3, 3, 3.0, 8.0),
    (6, 2, 8.0, 23.0),
    (4, 3, 8.0, 13.0),
    (7, 3, 13.0, 23.0),
    (9, 1, 23.0, 36.0),
    (10, 1, 36.0, 38.0),
];

fn example() -> Graph {
    let ops: Vec<String> = WEIGHTS
        .iter()
        .enumerate()
        .map(|(i, w)| format!(r#"{{"id": {}, "time_ms": {w}}}"#, i + 1))
        .collect();
    let edges: Vec<String> = EDGES
        .iter()
        .map(|(s, d)| format!(r#"{{"src": {s}, "dst": {d}}}"#))
        .collect();
    let text = format!(
        r#"{{"format": "opsched-dag", "name": "lios-table3", "ops": [{}], "edges": [{}]}}"#,
        ops.join(", "),
        edges.join(", ")
    );
    dag::from_str(&text).unwrap()
}

fn id(g: &Graph, v: u32) -> NodeId {
    g.find(&v.to_string()).unwrap()
}

fn ideal() -> IdealModel {
    IdealModel::new(AnalyticalModel::default())
}

fn platform(streams: usize) -> Platform {
    Platform {
        gpus: 1,
        streams,
        device: DevicePreset::all().first().unwrap().clone(),
        link: LinkPreset::all().first().unwrap().clone(),
    }
}

#[test]
fn lios_reproduces_table_iii() {
    let g = example();
    let cost = ideal();
    let sequential: f64 = g.ops().map(|v| cost.op_time(&g, v)).sum();
    assert_eq!(sequential, 73.0);

    let run = Lios::heuristic().run(&g, 3, &cost).unwrap();
    assert_eq!(run.makespan_ms, 38.0);
    assert_eq!(run.steps.len(), 10);
    for (k, (step, &(v, p, st, ft))) in run.steps.iter().zip(TABLE_III.iter()).enumerate() {
        assert_eq!(
            (step.op, step.stream, step.start_ms, step.finish_ms),
            (id(&g, v), p - 1, st, ft),
            "step {} of Table III",
            k + 1
        );
    }
}

#[test]
fn the_stream_plan_validates_and_simulates_to_table_iii() {
    let g = example();
    let cost = ideal();
    let p = platform(3);
    let (schedule, stats) = Lios::heuristic().schedule(&g, &p, &cost).unwrap();
    assert_eq!(stats.extra["lios_makespan_ms"], serde_json::json!(38.0));
    let Schedule::Streams(plan) = &schedule else {
        panic!("LIOS gives a stream plan");
    };
    assert_eq!(plan.gpus.len(), 1);
    let names =
        |ops: &[NodeId]| -> Vec<String> { ops.iter().map(|&o| g.node(o).name.clone()).collect() };
    let streams: Vec<Vec<String>> = plan.gpus[0].streams.iter().map(|s| names(s)).collect();
    assert_eq!(
        streams,
        vec![
            vec!["1", "5", "8", "9", "10"],
            vec!["2", "6"],
            vec!["3", "4", "7"]
        ]
    );
    assert_eq!(
        names(plan.gpus[0].launch_order.as_deref().unwrap()),
        vec!["1", "5", "8", "2", "3", "6", "4", "7", "9", "10"]
    );
    validate(&g, &schedule, &p).unwrap();

    let timeline = simulate(&g, &lower(&g, &schedule).unwrap(), &cost).unwrap();
    assert!(
        (timeline.makespan_ms - 38.0).abs() < 1e-9,
        "{}",
        timeline.makespan_ms
    );
    assert_eq!(timeline.ops.len(), 10);
    for &(v, p, st, ft) in &TABLE_III {
        let span = timeline.ops.iter().find(|s| s.op == id(&g, v)).unwrap();
        assert_eq!(span.gpu, 0);
        assert_eq!(span.stream, p - 1, "v{v}'s stream");
        assert!(
            (span.start_ms - st).abs() < 1e-9,
            "v{v} starts at {}",
            span.start_ms
        );
        assert!(
            (span.end_ms - ft).abs() < 1e-9,
            "v{v} ends at {}",
            span.end_ms
        );
    }
}

#[test]
fn one_stream_is_sequential_and_variants_are_named() {
    let g = example();
    let cost = ideal();
    let run = Lios::heuristic().run(&g, 1, &cost).unwrap();
    assert_eq!(run.makespan_ms, 73.0);
    for v in LiosVariant::ALL {
        let s = Lios::new(v, 7);
        assert_eq!(s.name(), v.name());
        assert_eq!(Lios::from_name(v.name(), 7), Some(s));
        let run = s.run(&g, 3, &cost).unwrap();
        // Critical path v1 v2 v6 v9 v10 = 38 bounds every variant from below.
        assert!(run.makespan_ms >= 38.0 && run.makespan_ms <= 73.0, "{v:?}");
    }
    assert_eq!(
        ["lios", "lios-rand1", "lios-rand2", "lios-rand"].map(|n| Lios::from_name(n, 0).is_some()),
        [true; 4]
    );
    for near in ["lios-rand3", "LIOS", "lios_rand1"] {
        assert!(Lios::from_name(near, 0).is_none(), "{near}");
    }
}

#[test]
fn random_variants_are_seeded() {
    let g = example();
    let cost = ideal();
    for v in [LiosVariant::Rand1, LiosVariant::Rand2, LiosVariant::Rand] {
        let a = Lios::new(v, 11).run(&g, 3, &cost).unwrap();
        let b = Lios::new(v, 11).run(&g, 3, &cost).unwrap();
        assert_eq!(a, b, "{v:?}: same seed, same schedule");
        let differs =
            (0..32u64).any(|s| Lios::new(v, s).run(&g, 3, &cost).unwrap().steps != a.steps);
        assert!(differs, "{v:?}: the seed matters");
    }
}

#[test]
fn a_platform_without_streams_is_refused() {
    let g = example();
    let cost = ideal();
    assert!(Lios::heuristic().schedule(&g, &platform(0), &cost).is_err());
    let mut p = platform(3);
    p.gpus = 0;
    assert!(Lios::heuristic().schedule(&g, &p, &cost).is_err());
}
