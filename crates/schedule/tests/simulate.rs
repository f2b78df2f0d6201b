//! Lowering, simulation, validation and lower bounds on cost-annotated DAGs.
#![allow(clippy::unwrap_used)]

use opsched_cost::{AnalyticalModel, CostModel, DevicePreset, HiosSimLaw, IdealModel, LinkPreset};
use opsched_graph::formats::dag;
use opsched_graph::random::{layered_dag, LayeredDagParams};
use opsched_graph::{Graph, NodeId};
use opsched_schedule::validate::validate_launch;
use opsched_schedule::{
    lower, lower_bound, simulate, simulate_with, validate, Cmd, EventId, ExecMode, GpuLaunch,
    GpuStreams, LaunchPlan, Platform, Schedule, ScheduleError, SimOptions, Stage, StagePlan,
    StageStrategy, StreamPlan, Timeline, TransferId,
};
use proptest::prelude::*;

fn base() -> AnalyticalModel {
    AnalyticalModel::new(
        DevicePreset::by_name("h100").unwrap(),
        LinkPreset::by_name("nvlink4").unwrap(),
    )
}

fn models() -> Vec<Box<dyn CostModel>> {
    vec![
        Box::new(IdealModel::new(base())),
        Box::new(HiosSimLaw::new(base())),
    ]
}

fn platform(gpus: usize, streams: usize) -> Platform {
    Platform {
        gpus,
        streams,
        device: DevicePreset::by_name("h100").unwrap(),
        link: LinkPreset::by_name("nvlink4").unwrap(),
    }
}

fn id(g: &Graph, name: &str) -> NodeId {
    g.find(name).unwrap()
}

/// A random layered DAG with `ops` operators (feasible edge count from `pick`).
fn random_dag(seed: u64, ops: usize, layers: usize, pick: u64) -> Graph {
    let layers = layers.clamp(2.min(ops), ops);
    let lo = ops - 1;
    let hi = (ops * ops - (layers - 1) - (ops - layers + 1) * (ops - layers + 1)) / 2;
    let edges = if hi > lo {
        lo + (pick as usize % (hi - lo + 1))
    } else {
        lo.min(hi)
    };
    layered_dag(&LayeredDagParams {
        ops,
        layers,
        edges,
        seed,
        ..LayeredDagParams::default()
    })
    .unwrap()
}

/// One operator per stage, in topological order, on GPU 0.
fn sequential(g: &Graph) -> Schedule {
    Schedule::Stages(StagePlan {
        gpus: vec![g.ops().map(Stage::single).collect()],
    })
}

/// Greedy stages on one GPU: each stage takes every ready operator, spread round-robin over
/// at most `streams` groups; each group is then extended by successors whose predecessors
/// are all done or earlier in the group (at most three operators per group).
fn greedy(g: &Graph, streams: usize) -> Vec<Stage> {
    let n = g.len();
    let mut done = vec![false; n];
    for i in g.inputs() {
        done[i.index()] = true;
    }
    let mut left: Vec<NodeId> = g.ops().collect();
    let mut stages = Vec::new();
    while !left.is_empty() {
        let ready: Vec<NodeId> = left
            .iter()
            .copied()
            .filter(|&v| g.preds(v).all(|u| done[u.index()]))
            .collect();
        let k = ready.len().min(streams);
        let mut groups: Vec<Vec<NodeId>> = vec![Vec::new(); k];
        for (i, &v) in ready.iter().enumerate() {
            groups[i % k].push(v);
        }
        let mut in_stage = vec![false; n];
        for &v in &ready {
            in_stage[v.index()] = true;
        }
        for grp in &mut groups {
            while grp.len() < 3 {
                let last = *grp.last().unwrap();
                let mut next: Vec<NodeId> = g.succs(last).collect();
                next.sort();
                let cand = next.into_iter().find(|&v| {
                    !done[v.index()]
                        && !in_stage[v.index()]
                        && g.preds(v).all(|u| done[u.index()] || grp.contains(&u))
                });
                match cand {
                    Some(v) => {
                        grp.push(v);
                        in_stage[v.index()] = true;
                    }
                    None => break,
                }
            }
        }
        for grp in &groups {
            for &v in grp {
                done[v.index()] = true;
            }
        }
        left.retain(|v| !done[v.index()]);
        stages.push(Stage {
            strategy: StageStrategy::Concurrent,
            groups,
        });
    }
    stages
}

/// Depth of every node (inputs 0, an operator one more than its deepest predecessor).
fn levels(g: &Graph) -> Vec<usize> {
    let mut lvl = vec![0usize; g.len()];
    for &v in g.topo_order() {
        if !g.node(v).op.is_input() {
            lvl[v.index()] = g.preds(v).map(|u| lvl[u.index()] + 1).max().unwrap_or(1);
        }
    }
    lvl
}

/// Operators round-robin over GPUs; per GPU one stage per level, its operators round-robin
/// over at most `streams` groups.
fn round_robin(g: &Graph, gpus: usize, streams: usize) -> Schedule {
    let lvl = levels(g);
    let depth = lvl.iter().copied().max().unwrap_or(0);
    let mut plan = vec![Vec::new(); gpus];
    let mut by_gpu_level: Vec<Vec<Vec<NodeId>>> = vec![vec![Vec::new(); depth + 1]; gpus];
    for (rank, v) in g.ops().enumerate() {
        by_gpu_level[rank % gpus][lvl[v.index()]].push(v);
    }
    for (gi, per_level) in by_gpu_level.into_iter().enumerate() {
        for ops in per_level.into_iter().filter(|o| !o.is_empty()) {
            let k = ops.len().min(streams);
            let mut groups = vec![Vec::new(); k];
            for (i, v) in ops.into_iter().enumerate() {
                groups[i % k].push(v);
            }
            plan[gi].push(Stage {
                strategy: StageStrategy::Concurrent,
                groups,
            });
        }
    }
    Schedule::Stages(StagePlan { gpus: plan })
}

/// Operators round-robin over `gpus * streams` streams, each stream in topological order.
fn stream_plan(g: &Graph, gpus: usize, streams: usize) -> Schedule {
    let mut plan: Vec<GpuStreams> = (0..gpus)
        .map(|_| GpuStreams {
            streams: vec![Vec::new(); streams],
            launch_order: None,
        })
        .collect();
    for (rank, v) in g.ops().enumerate() {
        let s = rank % (gpus * streams);
        plan[s / streams].streams[s % streams].push(v);
    }
    Schedule::Streams(StreamPlan { gpus: plan })
}

/// Operators follow their first predecessor's stream when they are its first successor
/// there, with a topological launch order.
fn chain_stream_plan(g: &Graph, streams: usize) -> Schedule {
    let mut stream_of = vec![usize::MAX; g.len()];
    let mut tail = vec![None::<NodeId>; streams];
    let mut out = vec![Vec::new(); streams];
    let mut next = 0usize;
    for v in g.ops() {
        let follow = g
            .preds(v)
            .filter(|u| stream_of[u.index()] != usize::MAX)
            .map(|u| stream_of[u.index()])
            .find(|&s| tail[s].is_some_and(|t| g.preds(v).any(|u| u == t)));
        let s = follow.unwrap_or_else(|| {
            next = (next + 1) % streams;
            next
        });
        stream_of[v.index()] = s;
        tail[s] = Some(v);
        out[s].push(v);
    }
    Schedule::Streams(StreamPlan {
        gpus: vec![GpuStreams {
            streams: out,
            launch_order: Some(g.ops().collect()),
        }],
    })
}

fn rel_eq(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// Spans respect the graph: one per operator, each at least its time alone, each starting
/// after its predecessors end (plus the transfer across GPUs).
fn check_timeline(g: &Graph, cost: &dyn CostModel, tl: &Timeline) {
    let mut span = vec![None; g.len()];
    for s in &tl.ops {
        assert!(span[s.op.index()].is_none(), "op {:?} twice", s.op);
        span[s.op.index()] = Some(s.clone());
    }
    for v in g.ops() {
        let sv = span[v.index()].clone().unwrap();
        let t = cost.op_time(g, v);
        assert!(
            sv.end_ms - sv.start_ms >= t - 1e-9 * t.max(1.0),
            "{v:?} too short"
        );
        for u in g.preds(v) {
            if let Some(su) = span[u.index()].clone() {
                let lag = if su.gpu != sv.gpu {
                    cost.transfer_time(g, u, v)
                } else {
                    0.0
                };
                assert!(
                    sv.start_ms >= su.end_ms + lag - 1e-9 * sv.start_ms.max(1.0),
                    "{v:?} starts at {} before {u:?} ends at {} (+{lag})",
                    sv.start_ms,
                    su.end_ms
                );
            }
        }
    }
    let latest = tl.ops.iter().map(|s| s.end_ms).fold(0.0, f64::max);
    assert!(tl.makespan_ms >= latest);
}

fn run(g: &Graph, s: &Schedule, cost: &dyn CostModel) -> Timeline {
    let plan = lower(g, s).unwrap();
    validate_launch(g, &plan).unwrap();
    let tl = simulate(g, &plan, cost).unwrap();
    check_timeline(g, cost, &tl);
    tl
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn schedules_validate_simulate_and_respect_the_bound(
        seed in any::<u64>(),
        ops in 1usize..50,
        layers in 2usize..12,
        pick in any::<u64>(),
    ) {
        let g = random_dag(seed, ops, layers, pick);
        let seq = sequential(&g);
        let greedy1 = Schedule::Stages(StagePlan { gpus: vec![greedy(&g, 3)] });
        let schedules = [
            (seq.clone(), platform(1, 1), 1),
            (greedy1.clone(), platform(1, 3), 1),
            (round_robin(&g, 3, 2), platform(3, 2), 3),
            (stream_plan(&g, 1, 4), platform(1, 4), 1),
            (stream_plan(&g, 2, 2), platform(2, 2), 2),
            (chain_stream_plan(&g, 3), platform(1, 3), 1),
        ];
        for (s, p, gpus) in &schedules {
            validate(&g, s, p).unwrap();
            for cost in models() {
                let tl = run(&g, s, cost.as_ref());
                let lb = lower_bound(&g, cost.as_ref(), *gpus).value();
                prop_assert!(
                    tl.makespan_ms >= lb - 1e-9,
                    "{}: makespan {} below the bound {lb}", cost.name(), tl.makespan_ms
                );
            }
        }
        for cost in models() {
            // Sequential: the sum of the operator times.
            let sum: f64 = g.ops().map(|o| cost.op_time(&g, o)).sum();
            let tl = run(&g, &seq, cost.as_ref());
            prop_assert!(rel_eq(tl.makespan_ms, sum), "{}: {} vs {sum}", cost.name(), tl.makespan_ms);
            // A one-GPU stage plan: the sum of its stage times.
            let Schedule::Stages(sp) = &greedy1 else { unreachable!() };
            let closed: f64 = sp.gpus[0].iter().map(|st| cost.stage_time(&g, &st.groups)).sum();
            let tl = run(&g, &greedy1, cost.as_ref());
            prop_assert!(
                rel_eq(tl.makespan_ms, closed),
                "{}: {} vs closed form {closed}", cost.name(), tl.makespan_ms
            );
        }
    }

    #[test]
    fn stream_plans_under_the_ideal_model_match_list_scheduling(
        seed in any::<u64>(),
        ops in 1usize..40,
        layers in 2usize..10,
        pick in any::<u64>(),
    ) {
        // With rates all 1, an operator starts at max(stream free, preds end (+ transfer)).
        let g = random_dag(seed, ops, layers, pick);
        let cost = IdealModel::new(base());
        let s = stream_plan(&g, 2, 2);
        let Schedule::Streams(sp) = &s else { unreachable!() };
        let mut end = vec![0.0f64; g.len()];
        let mut gpu_of = vec![0usize; g.len()];
        let mut free = [0.0f64; 4];
        for v in g.ops() {
            let (gi, j) = sp.gpus.iter().enumerate().find_map(|(gi, gs)| {
                gs.streams.iter().position(|st| st.contains(&v)).map(|j| (gi, j))
            }).unwrap();
            gpu_of[v.index()] = gi;
            let ready = g.preds(v).filter(|u| !g.node(*u).op.is_input()).map(|u| {
                end[u.index()] + if gpu_of[u.index()] != gi { cost.transfer_time(&g, u, v) } else { 0.0 }
            }).fold(0.0, f64::max);
            let start = ready.max(free[gi * 2 + j]);
            end[v.index()] = start + cost.op_time(&g, v);
            free[gi * 2 + j] = end[v.index()];
        }
        let want = end.iter().copied().fold(0.0, f64::max);
        let tl = run(&g, &s, &cost);
        let last_ops = tl.ops.iter().map(|s| s.end_ms).fold(0.0, f64::max);
        prop_assert!(rel_eq(last_ops, want), "{last_ops} vs {want}");
    }
}

const DIAMOND: &str = r#"{
  "format": "opsched-dag", "name": "diamond",
  "ops": [{"id": 1, "time_ms": 1.0}, {"id": 2, "time_ms": 2.0, "util": 0.5},
          {"id": 3, "time_ms": 3.0, "util": 0.5}, {"id": 4, "time_ms": 0.5}],
  "edges": [{"src": 1, "dst": 2, "transfer_ms": 0.25}, {"src": 1, "dst": 3, "transfer_ms": 0.25},
            {"src": 2, "dst": 4, "transfer_ms": 0.5}, {"src": 3, "dst": 4, "transfer_ms": 0.5}]
}"#;

fn diamond() -> Graph {
    dag::from_str(DIAMOND).unwrap()
}

fn stages(gpus: Vec<Vec<Vec<Vec<&str>>>>, g: &Graph) -> Schedule {
    Schedule::Stages(StagePlan {
        gpus: gpus
            .into_iter()
            .map(|st| {
                st.into_iter()
                    .map(|groups| Stage {
                        strategy: StageStrategy::Concurrent,
                        groups: groups
                            .into_iter()
                            .map(|grp| grp.into_iter().map(|n| id(g, n)).collect())
                            .collect(),
                    })
                    .collect()
            })
            .collect(),
    })
}

fn streams(gpus: Vec<Vec<Vec<&str>>>, g: &Graph) -> Schedule {
    Schedule::Streams(StreamPlan {
        gpus: gpus
            .into_iter()
            .map(|st| GpuStreams {
                streams: st
                    .into_iter()
                    .map(|s| s.into_iter().map(|n| id(g, n)).collect())
                    .collect(),
                launch_order: None,
            })
            .collect(),
    })
}

fn invalid_msg(r: Result<(), ScheduleError>) -> String {
    match r {
        Err(ScheduleError::Invalid(m)) => m,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn validator_accepts_good_schedules() {
    let g = diamond();
    let p = platform(2, 2);
    validate(
        &g,
        &stages(
            vec![vec![
                vec![vec!["1"]],
                vec![vec!["2"], vec!["3"]],
                vec![vec!["4"]],
            ]],
            &g,
        ),
        &p,
    )
    .unwrap();
    validate(
        &g,
        &stages(
            vec![vec![vec![vec!["1", "2"], vec!["3"]], vec![vec!["4"]]]],
            &g,
        ),
        &p,
    )
    .unwrap_err();
    validate(
        &g,
        &stages(
            vec![vec![vec![vec!["1"]], vec![vec!["2", "4"], vec!["3"]]]],
            &g,
        ),
        &p,
    )
    .unwrap_err();
    validate(
        &g,
        &streams(vec![vec![vec!["1", "2", "4"], vec!["3"]]], &g),
        &p,
    )
    .unwrap();
    validate(
        &g,
        &streams(vec![vec![vec!["1", "2"]], vec![vec!["3", "4"]]], &g),
        &p,
    )
    .unwrap();
}

#[test]
fn validator_rejects_broken_schedules_naming_the_op() {
    let g = diamond();
    let p = platform(2, 2);
    let m = invalid_msg(validate(
        &g,
        &stages(vec![vec![vec![vec!["1"]], vec![vec!["2"], vec!["3"]]]], &g),
        &p,
    ));
    assert!(m.contains("'4'") && m.contains("missing"), "{m}");
    let m = invalid_msg(validate(
        &g,
        &stages(
            vec![vec![
                vec![vec!["1"]],
                vec![vec!["2"], vec!["3"]],
                vec![vec!["4"]],
                vec![vec!["2"]],
            ]],
            &g,
        ),
        &p,
    ));
    assert!(m.contains("'2'") && m.contains("more than once"), "{m}");
    let m = invalid_msg(validate(
        &g,
        &stages(
            vec![vec![
                vec![vec!["2"], vec!["3"]],
                vec![vec!["1"]],
                vec![vec!["4"]],
            ]],
            &g,
        ),
        &p,
    ));
    assert!(m.contains("'1' -> '2'") || m.contains("'1' -> '3'"), "{m}");
    let m = invalid_msg(validate(
        &g,
        &stages(
            vec![vec![vec![vec!["1"]], vec![vec!["2"], vec!["3"], vec!["4"]]]],
            &g,
        ),
        &p,
    ));
    assert!(m.contains("'4'") && m.contains("stream"), "{m}");
    let m = invalid_msg(validate(
        &g,
        &stages(
            vec![
                vec![vec![vec!["1"]]],
                vec![vec![vec!["2", "3"]]],
                vec![vec![vec!["4"]]],
            ],
            &g,
        ),
        &p,
    ));
    assert!(m.contains("'4'") && m.contains("GPU 2"), "{m}");
    // Same group, wrong order.
    let m = invalid_msg(validate(
        &g,
        &stages(
            vec![vec![vec![vec!["1"]], vec![vec!["3"]], vec![vec!["4", "2"]]]],
            &g,
        ),
        &p,
    ));
    assert!(m.contains("'2' -> '4'"), "{m}");
    let m = invalid_msg(validate(
        &g,
        &stages(
            vec![vec![
                vec![vec!["1"]],
                vec![vec!["2"], vec![]],
                vec![vec!["3"]],
                vec![vec!["4"]],
            ]],
            &g,
        ),
        &p,
    ));
    assert!(m.contains("empty"), "{m}");
    // Stream plans.
    let m = invalid_msg(validate(
        &g,
        &streams(vec![vec![vec!["1", "4", "2"], vec!["3"]]], &g),
        &p,
    ));
    assert!(
        m.contains("'4'") && m.contains("'2'") && m.contains("ancestor"),
        "{m}"
    );
    let m = invalid_msg(validate(
        &g,
        &streams(vec![vec![vec!["4", "3"], vec!["2", "1"]]], &g),
        &p,
    ));
    assert!(m.contains("ancestor"), "{m}");
    // An ancestor through another stream.
    let m = invalid_msg(validate(
        &g,
        &streams(vec![vec![vec!["4", "1"], vec!["2", "3"]]], &g),
        &p,
    ));
    assert!(m.contains("'4' comes before its ancestor '1'"), "{m}");
    let m = invalid_msg(validate(
        &g,
        &streams(vec![vec![vec!["1"], vec!["2"], vec!["3", "4"]]], &g),
        &p,
    ));
    assert!(m.contains("'3'") && m.contains("stream 2"), "{m}");
    let m = invalid_msg(validate(
        &g,
        &streams(vec![vec![vec!["1", "2", "4"]]], &g),
        &p,
    ));
    assert!(m.contains("'3'") && m.contains("missing"), "{m}");
    // A launch order against a dependency.
    let mut s = streams(vec![vec![vec!["1", "2", "4"], vec!["3"]]], &g);
    if let Schedule::Streams(sp) = &mut s {
        sp.gpus[0].launch_order = Some(["1", "2", "4", "3"].iter().map(|n| id(&g, n)).collect());
    }
    let m = invalid_msg(validate(&g, &s, &p));
    assert!(m.contains("'4'") && m.contains("'3'"), "{m}");
    // Abstract operators cannot be merged.
    let s = Schedule::Stages(StagePlan {
        gpus: vec![vec![
            Stage::single(id(&g, "1")),
            Stage {
                strategy: StageStrategy::Merge,
                groups: vec![vec![id(&g, "2"), id(&g, "3")]],
            },
            Stage::single(id(&g, "4")),
        ]],
    });
    let m = invalid_msg(validate(&g, &s, &p));
    assert!(m.contains("'2'") && m.contains("merged"), "{m}");
    // And the simulator refuses to run a merge the cost model cannot price.
    let plan = lower(&g, &s).unwrap();
    let err = simulate(&g, &plan, &IdealModel::new(base())).unwrap_err();
    assert!(
        matches!(&err, ScheduleError::Invalid(m) if m.contains("'2'") && m.contains("'3'")),
        "{err}"
    );
}

#[test]
fn stage_plans_waiting_on_each_other_across_gpus_are_rejected() {
    // a -> d and c -> b; GPU 0 runs [a? no: b then a], GPU 1 runs [d then c]: b waits for c,
    // which waits for d, which waits for a, which waits for b.
    let g = dag::from_str(
        r#"{"format": "opsched-dag", "ops": [{"id": 1, "time_ms": 1}, {"id": 2, "time_ms": 1},
        {"id": 3, "time_ms": 1}, {"id": 4, "time_ms": 1}],
        "edges": [{"src": 1, "dst": 4}, {"src": 3, "dst": 2}]}"#,
    )
    .unwrap();
    let s = stages(
        vec![
            vec![vec![vec!["2"]], vec![vec!["1"]]],
            vec![vec![vec!["4"]], vec![vec!["3"]]],
        ],
        &g,
    );
    let err = validate(&g, &s, &platform(2, 1)).unwrap_err();
    assert!(
        matches!(&err, ScheduleError::Deadlock(m) if m.contains("cycle")),
        "{err}"
    );
    let plan = lower(&g, &s).unwrap();
    let err = simulate(&g, &plan, &IdealModel::new(base())).unwrap_err();
    assert!(matches!(err, ScheduleError::Deadlock(_)), "{err}");
}

#[test]
fn two_op_chain_on_two_gpus() {
    let g = dag::from_str(
        r#"{"format": "opsched-dag", "ops": [{"id": 0, "time_ms": 1.5}, {"id": 1, "time_ms": 2.0}],
        "edges": [{"src": 0, "dst": 1, "transfer_ms": 0.75}]}"#,
    )
    .unwrap();
    for s in [
        stages(vec![vec![vec![vec!["0"]]], vec![vec![vec!["1"]]]], &g),
        streams(vec![vec![vec!["0"]], vec![vec!["1"]]], &g),
    ] {
        validate(&g, &s, &platform(2, 1)).unwrap();
        let plan = lower(&g, &s).unwrap();
        assert_eq!(plan.transfers, 1);
        assert_eq!(
            plan.gpus[0].streams[0],
            vec![
                Cmd::Launch {
                    op: id(&g, "0"),
                    stage: plan.gpus[0].streams[0][0].clone().stage()
                },
                Cmd::Send {
                    xfer: TransferId(0),
                    src: id(&g, "0"),
                    dst: id(&g, "1"),
                    dst_gpu: 1
                },
            ]
        );
        assert_eq!(plan.gpus[1].streams[0][0], Cmd::Recv(TransferId(0)));
        for cost in models() {
            let tl = simulate(&g, &plan, cost.as_ref()).unwrap();
            assert!(
                rel_eq(tl.makespan_ms, 1.5 + 0.75 + 2.0),
                "{}",
                tl.makespan_ms
            );
            assert_eq!(tl.transfers.len(), 1);
            let t = &tl.transfers[0];
            assert_eq!((t.src_gpu, t.dst_gpu), (0, 1));
            assert!(rel_eq(t.start_ms, 1.5) && rel_eq(t.end_ms, 2.25));
            let b = tl.ops.iter().find(|s| s.op == id(&g, "1")).unwrap();
            assert_eq!(b.gpu, 1);
            assert!(rel_eq(b.start_ms, 2.25) && rel_eq(b.end_ms, 4.25));
        }
    }
}

trait StageOf {
    fn stage(self) -> Option<u32>;
}
impl StageOf for Cmd {
    fn stage(self) -> Option<u32> {
        match self {
            Cmd::Launch { stage, .. } | Cmd::LaunchMerged { stage, .. } => stage,
            _ => None,
        }
    }
}

#[test]
fn fluid_law_two_independent_ops_on_two_streams() {
    let g = dag::from_str(
        r#"{"format": "opsched-dag", "ops": [{"id": 0, "time_ms": 1.0}, {"id": 1, "time_ms": 3.0},
        {"id": 2, "time_ms": 1.0, "util": 0.5}, {"id": 3, "time_ms": 3.0, "util": 0.5}]}"#,
    )
    .unwrap();
    let hios = HiosSimLaw::new(base());
    // util 1: slowdown 0.5 * 2 + 0.5 * max(2, 1) = 2, so both run at 1/2. Op 0 ends at 2; op 1
    // has done 1 ms of work and finishes the other 2 alone: it ends at 4.
    let s = streams(vec![vec![vec!["0"], vec!["1"]]], &g);
    let s = match s {
        Schedule::Streams(mut sp) => {
            // Ops 2 and 3 go on a second GPU so they do not share with 0 and 1.
            sp.gpus.push(GpuStreams {
                streams: vec![vec![id(&g, "2")], vec![id(&g, "3")]],
                launch_order: None,
            });
            Schedule::Streams(sp)
        }
        other => other,
    };
    validate(&g, &s, &platform(2, 2)).unwrap();
    let tl = run(&g, &s, &hios);
    let end = |n: &str| tl.ops.iter().find(|sp| sp.op == id(&g, n)).unwrap().end_ms;
    assert!(rel_eq(end("0"), 2.0), "{}", end("0"));
    assert!(rel_eq(end("1"), 4.0), "{}", end("1"));
    // util 0.5: slowdown 0.5 * 2 + 0.5 * max(1, 1) = 1.5, rate 2/3. Op 2 ends at 1.5; op 3 has
    // done 1 ms and runs the other 2 alone: it ends at 3.5.
    assert!(rel_eq(end("2"), 1.5), "{}", end("2"));
    assert!(rel_eq(end("3"), 3.5), "{}", end("3"));
    assert!(rel_eq(tl.makespan_ms, 4.0));
    // The same pairs as one stage each: the law's closed form, 0.5 * 4 + 0.5 * max(4, 3) = 4
    // and 0.5 * 4 + 0.5 * max(2, 3) = 3.5, with the shorter group scaled by T / 3.
    let s = stages(
        vec![
            vec![vec![vec!["0"], vec!["1"]]],
            vec![vec![vec!["2"], vec!["3"]]],
        ],
        &g,
    );
    let tl = run(&g, &s, &hios);
    let span = |n: &str| tl.ops.iter().find(|sp| sp.op == id(&g, n)).unwrap().clone();
    assert!(rel_eq(span("1").end_ms, 4.0) && rel_eq(span("0").end_ms, 4.0 / 3.0));
    assert!(rel_eq(span("3").end_ms, 3.5) && rel_eq(span("2").end_ms, 3.5 / 3.0));
    // Under the ideal model both pairs take 3.
    let tl = run(&g, &s, &IdealModel::new(base()));
    assert!(rel_eq(tl.makespan_ms, 3.0));
}

#[test]
fn fluid_rates_change_when_an_op_joins() {
    // Op 0 (4 ms) starts alone; op 1 (1 ms) on another stream waits for op 2 (1 ms, stream 1).
    // 0..1: ops 0 and 2 share at 1/2 each (util 1); op 2 has done 0.5: ends at 2, op 0 has
    // done 1 of 4. 2..4: ops 0 and 1 share at 1/2: op 1 ends at 4, op 0 has done 2. Then op 0
    // runs alone: 2 ms more, ends at 6.
    let g = dag::from_str(
        r#"{"format": "opsched-dag", "ops": [{"id": 0, "time_ms": 4.0}, {"id": 1, "time_ms": 1.0},
        {"id": 2, "time_ms": 1.0}], "edges": [{"src": 2, "dst": 1}]}"#,
    )
    .unwrap();
    let s = streams(vec![vec![vec!["0"], vec!["2", "1"]]], &g);
    let tl = run(&g, &s, &HiosSimLaw::new(base()));
    let end = |n: &str| tl.ops.iter().find(|sp| sp.op == id(&g, n)).unwrap().end_ms;
    assert!(rel_eq(end("2"), 2.0) && rel_eq(end("1"), 4.0) && rel_eq(end("0"), 6.0));
}

#[test]
fn stage_lowering_has_barriers() {
    let g = diamond();
    let s = stages(
        vec![vec![
            vec![vec!["1"]],
            vec![vec!["2"], vec!["3"]],
            vec![vec!["4"]],
        ]],
        &g,
    );
    let plan = lower(&g, &s).unwrap();
    let l = |n: &str, s: u32| Cmd::Launch {
        op: id(&g, n),
        stage: Some(s),
    };
    assert_eq!(plan.events, 2);
    assert_eq!(plan.transfers, 0);
    assert_eq!(
        plan.gpus[0].streams,
        vec![
            vec![
                l("1", 0),
                Cmd::Record(EventId(0)),
                l("2", 1),
                Cmd::Wait(EventId(1)),
                l("4", 2)
            ],
            vec![Cmd::Wait(EventId(0)), l("3", 1), Cmd::Record(EventId(1))],
        ]
    );
    for cost in models() {
        let tl = simulate(&g, &plan, cost.as_ref()).unwrap();
        let want = 1.0 + cost.stage_time(&g, &[vec![id(&g, "2")], vec![id(&g, "3")]]) + 0.5;
        assert!(rel_eq(tl.makespan_ms, want), "{} vs {want}", tl.makespan_ms);
    }
}

#[test]
fn stream_lowering_records_one_event_per_producer() {
    let g = diamond();
    let s = streams(vec![vec![vec!["1", "2", "4"], vec!["3"]]], &g);
    let plan = lower(&g, &s).unwrap();
    let l = |n: &str| Cmd::Launch {
        op: id(&g, n),
        stage: None,
    };
    assert_eq!(plan.events, 2);
    assert_eq!(
        plan.gpus[0].streams,
        vec![
            vec![
                l("1"),
                Cmd::Record(EventId(0)),
                l("2"),
                Cmd::Wait(EventId(1)),
                l("4")
            ],
            vec![Cmd::Wait(EventId(0)), l("3"), Cmd::Record(EventId(1))],
        ]
    );
    let tl = simulate(&g, &plan, &IdealModel::new(base())).unwrap();
    assert!(rel_eq(tl.makespan_ms, 1.0 + 3.0 + 0.5));
}

#[test]
fn deadlock_is_reported() {
    let g = diamond();
    let l = |n: &str| Cmd::Launch {
        op: id(&g, n),
        stage: None,
    };
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![vec![
                l("1"),
                Cmd::Wait(EventId(0)),
                l("2"),
                Cmd::Record(EventId(0)),
                l("3"),
                l("4"),
            ]],
        }],
        events: 1,
        transfers: 0,
        launch_order: vec![],
    };
    let err = simulate(&g, &plan, &IdealModel::new(base())).unwrap_err();
    match &err {
        ScheduleError::Deadlock(m) => {
            assert!(
                m.contains("stream 0") && m.contains("event 0") && m.contains("'2'"),
                "{m}"
            )
        }
        other => panic!("expected a deadlock, got {other:?}"),
    }
    let err = validate_launch(&g, &plan).unwrap_err();
    assert!(
        matches!(&err, ScheduleError::Deadlock(m) if m.contains("cycle")),
        "{err}"
    );
    // A receive with no send.
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![vec![
                l("1"),
                Cmd::Recv(TransferId(0)),
                l("2"),
                l("3"),
                l("4"),
            ]],
        }],
        events: 0,
        transfers: 1,
        launch_order: vec![],
    };
    assert!(matches!(
        simulate(&g, &plan, &IdealModel::new(base())),
        Err(ScheduleError::Deadlock(_))
    ));
    assert!(
        matches!(validate_launch(&g, &plan), Err(ScheduleError::Invalid(m)) if m.contains("never sent"))
    );
}

#[test]
fn validate_launch_finds_unordered_dependencies() {
    let g = diamond();
    let l = |n: &str| Cmd::Launch {
        op: id(&g, n),
        stage: None,
    };
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![vec![l("1"), l("2"), l("4")], vec![l("3")]],
        }],
        events: 0,
        transfers: 0,
        launch_order: vec![],
    };
    let m = invalid_msg(validate_launch(&g, &plan));
    assert!(m.contains("'3'") && m.contains("not ordered"), "{m}");
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![vec![l("1"), l("2"), l("4")]],
        }],
        events: 0,
        transfers: 0,
        launch_order: vec![],
    };
    let m = invalid_msg(validate_launch(&g, &plan));
    assert!(m.contains("'3'") && m.contains("never launched"), "{m}");
}

/// Past the 4,096 operators of one happens-before block: a chain of 9,000 operators split over
/// two streams without a wait is caught where the break is (third block), and the same chain
/// on one stream passes.
#[test]
fn validate_launch_checks_dependencies_in_every_block() {
    let n = 9000;
    let ops: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"id": {i}, "time_ms": 0.01}}"#))
        .collect();
    let edges: Vec<String> = (1..n)
        .map(|i| format!(r#"{{"src": {}, "dst": {i}}}"#, i - 1))
        .collect();
    let g = dag::from_str(&format!(
        r#"{{"format": "opsched-dag", "ops": [{}], "edges": [{}]}}"#,
        ops.join(","),
        edges.join(",")
    ))
    .unwrap();
    let l = |i: usize| Cmd::Launch {
        op: id(&g, &i.to_string()),
        stage: None,
    };
    let one = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![(0..n).map(l).collect()],
        }],
        events: 0,
        transfers: 0,
        launch_order: vec![],
    };
    validate_launch(&g, &one).unwrap();
    let cut = 8500;
    let two = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![(0..cut).map(l).collect(), (cut..n).map(l).collect()],
        }],
        events: 0,
        transfers: 0,
        launch_order: vec![],
    };
    let m = invalid_msg(validate_launch(&g, &two));
    assert!(
        m.contains("dependency '8499' -> '8500' is not ordered"),
        "{m}"
    );
}

#[test]
fn large_graphs_simulate_quickly() {
    let cfg = opsched_graph::zoo::ZooConfig::default();
    let nasnet = opsched_graph::zoo::build("nasnet", &cfg).unwrap();
    let cost = opsched_cost::AnalyticalModel::new(
        DevicePreset::by_name("h100").unwrap(),
        LinkPreset::by_name("nvlink4").unwrap(),
    );
    let g400 = random_dag(7, 400, 20, 123);
    let t0 = std::time::Instant::now();
    for g in [&nasnet, &g400] {
        for s in [sequential(g), stream_plan(g, 1, 8), round_robin(g, 4, 4)] {
            let p = platform(4, 8);
            validate(g, &s, &p).unwrap();
            let plan = lower(g, &s).unwrap();
            for _ in 0..20 {
                let tl = simulate(g, &plan, &cost).unwrap();
                assert_eq!(tl.ops.len(), g.op_count());
            }
        }
    }
    eprintln!("240 simulations: {:?}", t0.elapsed());
    // Generous: 240 simulations of 374-400 operators in a debug build.
    assert!(t0.elapsed().as_secs_f64() < 60.0, "{:?}", t0.elapsed());
}

#[test]
fn merge_stages_validate_and_simulate() {
    let g = opsched_graph::zoo::build("inception_v3", &opsched_graph::zoo::ZooConfig::default())
        .unwrap();
    let cost = base();
    let ops: Vec<NodeId> = g.ops().collect();
    // The first pair of operators that can merge.
    let (u, v) = ops
        .iter()
        .enumerate()
        .find_map(|(i, &u)| {
            ops[i + 1..]
                .iter()
                .find(|&&v| opsched_graph::merge::mergeable(&g, &[u, v]))
                .map(|&v| (u, v))
        })
        .unwrap();
    // Sequential, with the pair merged where the first of them was.
    let mut stages = Vec::new();
    for &o in &ops {
        if o == u {
            stages.push(Stage {
                strategy: StageStrategy::Merge,
                groups: vec![vec![u, v]],
            });
        } else if o != v {
            stages.push(Stage::single(o));
        }
    }
    let s = Schedule::Stages(StagePlan { gpus: vec![stages] });
    validate(&g, &s, &platform(1, 1)).unwrap();
    let plan = lower(&g, &s).unwrap();
    assert!(plan.gpus[0].streams[0].contains(&Cmd::LaunchMerged {
        ops: vec![u, v],
        stage: Some(ops.iter().position(|&o| o == u).unwrap() as u32),
    }));
    let tl = simulate(&g, &plan, &cost).unwrap();
    let su = tl.ops.iter().find(|s| s.op == u).unwrap();
    let sv = tl.ops.iter().find(|s| s.op == v).unwrap();
    assert_eq!((su.start_ms, su.end_ms), (sv.start_ms, sv.end_ms));
    let merged = cost.merged_time(&g, &[u, v]).unwrap();
    assert!(rel_eq(su.end_ms - su.start_ms, merged));
    let others: f64 = ops
        .iter()
        .filter(|&&o| o != u && o != v)
        .map(|&o| cost.op_time(&g, o))
        .sum();
    assert!(rel_eq(tl.makespan_ms, others + merged));
    assert!(tl.makespan_ms >= lower_bound(&g, &cost, 1).value() - 1e-9);
}

/// The calibrated H100 model with the given overheads (us).
fn with_overheads(record_us: f64, wait_us: f64, eager_launch_us: f64) -> AnalyticalModel {
    let mut file = opsched_cost::DeviceFile::embedded("h100").unwrap();
    file.overheads.event_record_us = record_us;
    file.overheads.event_wait_us = wait_us;
    file.overheads.eager_launch_us = eager_launch_us;
    file.overheads.eager_sync_us = eager_launch_us / 4.0;
    AnalyticalModel::calibrated(
        DevicePreset::by_name("h100").unwrap(),
        LinkPreset::by_name("nvlink4").unwrap(),
        file,
    )
}

fn sim_in(g: &Graph, s: &Schedule, cost: &dyn CostModel, mode: ExecMode) -> Timeline {
    let plan = lower(g, s).unwrap();
    let opts = SimOptions { mode };
    let tl = simulate_with(g, &plan, cost, &opts).unwrap();
    check_timeline(g, cost, &tl);
    tl
}

/// A fork/join stage of two streams costs two event latencies and two waits on the critical
/// path: a (1 ms) -> {b, c} (1 ms each, side by side) -> d (1 ms) takes 3 ms + 2 r + 2 w.
#[test]
fn a_fork_join_stage_costs_two_records_and_one_wait_per_stream() {
    let g = dag::from_str(
        r#"{"format": "opsched-dag", "name": "fj",
        "ops": [{"id": 0, "time_ms": 1, "util": 0.1}, {"id": 1, "time_ms": 1, "util": 0.1},
                {"id": 2, "time_ms": 1, "util": 0.1}, {"id": 3, "time_ms": 1, "util": 0.1}],
        "edges": [{"src": 0, "dst": 1}, {"src": 0, "dst": 2}, {"src": 1, "dst": 3},
                  {"src": 2, "dst": 3}]}"#,
    )
    .unwrap();
    let s = stages(
        vec![vec![
            vec![vec!["0"]],
            vec![vec!["1"], vec!["2"]],
            vec![vec!["3"]],
        ]],
        &g,
    );
    let (r, w) = (2.0, 0.3);
    let cost = with_overheads(r, w, 0.0);
    let tl = sim_in(&g, &s, &cost, ExecMode::Graph);
    let want = 3.0 + (2.0 * r + 2.0 * w) / 1e3;
    assert!(rel_eq(tl.makespan_ms, want), "{} vs {want}", tl.makespan_ms);
    // Without overheads the barrier is free.
    let tl = sim_in(&g, &s, &with_overheads(0.0, 0.0, 0.0), ExecMode::Graph);
    assert!(rel_eq(tl.makespan_ms, 3.0), "{}", tl.makespan_ms);
}

/// Eager: a chain of short operators is host-bound, one launch every `eager_launch_us`.
#[test]
fn eager_chains_are_host_bound() {
    let g = dag::from_str(
        r#"{"format": "opsched-dag", "name": "chain",
        "ops": [{"id": 0, "time_ms": 0.001}, {"id": 1, "time_ms": 0.001},
                {"id": 2, "time_ms": 0.001}],
        "edges": [{"src": 0, "dst": 1}, {"src": 1, "dst": 2}]}"#,
    )
    .unwrap();
    let s = sequential(&g);
    let cost = with_overheads(0.0, 0.0, 10.0);
    let graph = sim_in(&g, &s, &cost, ExecMode::Graph).makespan_ms;
    assert!(rel_eq(graph, 0.003), "{graph}");
    let eager = sim_in(&g, &s, &cost, ExecMode::Eager).makespan_ms;
    // Issued at 10, 20, 30 us; the last runs 1 us.
    assert!(rel_eq(eager, 0.031), "{eager}");
}

/// Overheads only delay: in both modes every span still lasts its operator time, starts
/// after its inputs (`sim_in` checks both), and no makespan beats the lower bound.
fn overheads_keep_the_bounds_on(g: &Graph, record: f64, wait: f64, launch: f64) {
    let cost = with_overheads(record, wait, launch);
    let schedules = [
        (sequential(g), 1),
        (
            Schedule::Stages(StagePlan {
                gpus: vec![greedy(g, 3)],
            }),
            1,
        ),
        (round_robin(g, 2, 2), 2),
        (stream_plan(g, 1, 4), 1),
        (chain_stream_plan(g, 3), 1),
    ];
    for (s, gpus) in &schedules {
        let lb = lower_bound(g, &cost, *gpus).value();
        for mode in ExecMode::ALL {
            let tl = sim_in(g, s, &cost, mode);
            assert!(
                tl.makespan_ms >= lb - 1e-9,
                "{mode}: makespan {} below the bound {lb}",
                tl.makespan_ms
            );
        }
    }
}

/// A case the property found: in eager mode, a stage's launch the host issued after its place
/// in the stage ran shorter than its operator (it kept the stage's end instead of its length).
#[test]
fn a_late_launch_in_a_stage_still_takes_its_time() {
    let g = random_dag(18081855380233586973, 31, 3, 6075614512023208435);
    overheads_keep_the_bounds_on(&g, 0.0, 0.0, 20.972748149253842);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]

    #[test]
    fn overheads_keep_the_bounds(
        seed in any::<u64>(),
        ops in 1usize..40,
        layers in 2usize..10,
        pick in any::<u64>(),
        record in 0.0f64..20.0,
        wait in 0.0f64..5.0,
        launch in 0.0f64..30.0,
    ) {
        overheads_keep_the_bounds_on(&random_dag(seed, ops, layers, pick), record, wait, launch);
    }
}
