//! The execution program on the CPU: host order, dependency coverage, redundant waits,
//! logical-to-physical mapping and error paths, for every registered scheduler. The GPU tests
//! at the end are `#[ignore]`d (run them with `cargo xtask gpu-test` on a machine with a GPU).
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use opsched::cost::{AnalyticalModel, DevicePreset, HiosSimLaw, LinkPreset};
use opsched::graph::random::{layered_dag, LayeredDagParams};
use opsched::graph::{DType, GraphBuilder, NodeId, Op};
use opsched::schedule::{lower, Cmd, EventId, GpuLaunch, LaunchPlan, Platform, Schedule};
use opsched::zoo::ZooConfig;
use opsched::{Graph, SchedulerOptions};
use opsched_runtime::{exec, ExecProgram, HostCmd, RuntimeError};

fn platform(gpus: usize, streams: usize) -> Platform {
    Platform {
        gpus,
        streams,
        device: DevicePreset::by_name("h100").unwrap(),
        link: LinkPreset::by_name("nvlink4").unwrap(),
    }
}

fn schedule(g: &Graph, algo: &str, gpus: usize, cost: &dyn opsched::cost::CostModel) -> Schedule {
    let opts = SchedulerOptions {
        ios_part: 12,
        ..Default::default()
    };
    let s = opsched::scheduler_with(algo, &opts).unwrap();
    s.schedule(g, &platform(gpus, 4), cost).unwrap().0
}

/// Host-order invariants: every record before its waits, every send before its receive, each
/// stream's commands in plan order, every operator launched once.
fn check_host_order(g: &Graph, plan: &LaunchPlan, p: &ExecProgram) {
    let mut recorded = vec![false; plan.events as usize];
    let mut sent = vec![false; plan.transfers as usize];
    let mut launched: HashMap<NodeId, usize> = HashMap::new();
    let mut per_stream: HashMap<(usize, usize), Vec<&HostCmd>> = HashMap::new();
    for c in &p.cmds {
        match c {
            HostCmd::Record { event, .. } => recorded[*event as usize] = true,
            HostCmd::Wait { event, .. } => assert!(recorded[*event as usize], "wait before record"),
            HostCmd::Send { xfer, .. } => sent[*xfer as usize] = true,
            HostCmd::Recv { xfer, .. } => assert!(sent[*xfer as usize], "recv before send"),
            HostCmd::Launch { ops, .. } => {
                for o in ops {
                    *launched.entry(*o).or_default() += 1;
                }
            }
        }
        let key = match c {
            HostCmd::Launch { gpu, stream, .. }
            | HostCmd::Record { gpu, stream, .. }
            | HostCmd::Wait { gpu, stream, .. }
            | HostCmd::Send { gpu, stream, .. }
            | HostCmd::Recv { gpu, stream, .. } => (*gpu, *stream),
        };
        per_stream.entry(key).or_default().push(c);
    }
    // Launch sequence per stream equals the plan's.
    for (gi, gl) in plan.gpus.iter().enumerate() {
        for (si, cmds) in gl.streams.iter().enumerate() {
            let want: Vec<Vec<NodeId>> = cmds
                .iter()
                .filter_map(|c| match c {
                    Cmd::Launch { op, .. } => Some(vec![*op]),
                    Cmd::LaunchMerged { ops, .. } => Some(ops.clone()),
                    _ => None,
                })
                .collect();
            let got: Vec<Vec<NodeId>> = per_stream
                .get(&(gi, si))
                .map(|v| {
                    v.iter()
                        .filter_map(|c| match c {
                            HostCmd::Launch { ops, .. } => Some(ops.clone()),
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default();
            assert_eq!(got, want, "GPU {gi} stream {si}");
        }
    }
    for o in g.ops() {
        if p.placement[o.index()].is_some() {
            assert_eq!(launched.get(&o), Some(&1), "{}", g.node(o).name);
        }
    }
    let (_, _, waits, _, _) = p.counts();
    assert_eq!(waits, p.waits_in_plan - p.waits_dropped);
}

#[test]
fn every_scheduler_on_zoo_models_gives_a_complete_host_order() {
    let cfg = ZooConfig::default();
    for model in ["squeezenet", "googlenet", "inception_v3"] {
        let g = opsched::load_model(model, &cfg).unwrap();
        let cost = AnalyticalModel::new(
            DevicePreset::by_name("h100").unwrap(),
            LinkPreset::by_name("nvlink4").unwrap(),
        );
        for algo in opsched::scheduler_names() {
            if algo.starts_with("ios") && model == "inception_v3" {
                continue; // slow in debug builds; covered on the smaller models
            }
            let gpus = if algo.starts_with("hios") { 2 } else { 1 };
            let s = schedule(&g, algo, gpus, &cost);
            let plan = lower(&g, &s).unwrap();
            let pri = exec::priorities(&g, &s);
            let p = ExecProgram::new(&g, &plan, &pri)
                .unwrap_or_else(|e| panic!("{algo} on {model}: {e}"));
            check_host_order(&g, &plan, &p);
        }
    }
}

#[test]
fn multi_gpu_random_dags() {
    for seed in 0..5 {
        let g = layered_dag(&LayeredDagParams {
            ops: 40,
            layers: 6,
            edges: 80,
            seed,
            ..Default::default()
        })
        .unwrap();
        let law = HiosSimLaw::new(AnalyticalModel::new(
            DevicePreset::by_name("h100").unwrap(),
            LinkPreset::by_name("nvlink4").unwrap(),
        ));
        for algo in ["hios-lp", "hios-mr", "lios", "opara", "greedy"] {
            let gpus = if algo.starts_with("hios") { 3 } else { 1 };
            let s = schedule(&g, algo, gpus, &law);
            let plan = lower(&g, &s).unwrap();
            let p = ExecProgram::new(&g, &plan, &exec::priorities(&g, &s)).unwrap();
            check_host_order(&g, &plan, &p);
            assert_eq!(p.transfers.len(), plan.transfers as usize);
            for t in &p.transfers {
                assert_ne!(t.src_gpu, t.dst_gpu);
                assert_eq!(p.placement[t.src.index()].unwrap().0, t.src_gpu);
                assert_eq!(p.placement[t.dst.index()].unwrap().0, t.dst_gpu);
            }
        }
    }
}

#[test]
fn opara_launch_order_is_the_host_order() {
    let g = opsched::load_model("googlenet", &ZooConfig::default()).unwrap();
    let cost = AnalyticalModel::new(
        DevicePreset::by_name("h100").unwrap(),
        LinkPreset::by_name("nvlink4").unwrap(),
    );
    let s = schedule(&g, "opara", 1, &cost);
    let Schedule::Streams(sp) = &s else {
        panic!("opara gives a stream plan")
    };
    let order = sp.gpus[0].launch_order.clone().unwrap();
    let plan = lower(&g, &s).unwrap();
    let p = ExecProgram::new(&g, &plan, &exec::priorities(&g, &s)).unwrap();
    let host: Vec<NodeId> = p
        .cmds
        .iter()
        .filter_map(|c| match c {
            HostCmd::Launch { ops, .. } => Some(ops[0]),
            _ => None,
        })
        .collect();
    assert_eq!(host, order);
}

/// a -> c, b -> c; a and b on stream 0, c on stream 1.
fn diamond() -> Graph {
    let mut b = GraphBuilder::new("d", DType::F32);
    let x = b.input("x", vec![1, 4, 4, 4]);
    let a = b.act("a", x, opsched::graph::Activation::Relu);
    let bb = b.act("b", a, opsched::graph::Activation::Relu);
    b.add("c", &[a, bb]);
    b.finish().unwrap()
}

fn ids(g: &Graph) -> (NodeId, NodeId, NodeId) {
    (
        g.find("a").unwrap(),
        g.find("b").unwrap(),
        g.find("c").unwrap(),
    )
}

fn launch(op: NodeId) -> Cmd {
    Cmd::Launch { op, stage: None }
}

#[test]
fn implied_waits_are_dropped() {
    let g = diamond();
    let (a, b, c) = ids(&g);
    // Stream 1 waits for b's event first: it already orders a, so the wait for a's is implied.
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![
                vec![
                    launch(a),
                    Cmd::Record(EventId(0)),
                    launch(b),
                    Cmd::Record(EventId(1)),
                ],
                vec![Cmd::Wait(EventId(1)), Cmd::Wait(EventId(0)), launch(c)],
            ],
        }],
        events: 2,
        transfers: 0,
    };
    let p = ExecProgram::new(&g, &plan, &[]).unwrap();
    assert_eq!((p.waits_in_plan, p.waits_dropped), (2, 1));
    // The record of event 0 is gone too.
    assert!(!p.cmds.iter().any(|c| matches!(
        c,
        HostCmd::Record { event: 0, .. } | HostCmd::Wait { event: 0, .. }
    )));
    check_host_order(&g, &plan, &p);
}

#[test]
fn a_missing_wait_is_reported() {
    let g = diamond();
    let (a, b, c) = ids(&g);
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![
                vec![launch(a), Cmd::Record(EventId(0)), launch(b)],
                vec![Cmd::Wait(EventId(0)), launch(c)],
            ],
        }],
        events: 1,
        transfers: 0,
    };
    let e = ExecProgram::new(&g, &plan, &[]).unwrap_err();
    let m = e.to_string();
    assert!(m.contains("'c'") && m.contains("'b'"), "{m}");
}

#[test]
fn malformed_plans_are_typed_errors() {
    let g = diamond();
    let (a, b, c) = ids(&g);
    // A deadlock: each stream waits for an event the other records later.
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![
                vec![Cmd::Wait(EventId(1)), launch(a), Cmd::Record(EventId(0))],
                vec![
                    Cmd::Wait(EventId(0)),
                    launch(b),
                    Cmd::Record(EventId(1)),
                    launch(c),
                ],
            ],
        }],
        events: 2,
        transfers: 0,
    };
    let e = ExecProgram::new(&g, &plan, &[]).unwrap_err();
    assert!(e.to_string().contains("deadlocks"), "{e}");
    // An event recorded twice.
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![vec![
                launch(a),
                Cmd::Record(EventId(0)),
                launch(b),
                Cmd::Record(EventId(0)),
                launch(c),
            ]],
        }],
        events: 1,
        transfers: 0,
    };
    assert!(matches!(
        ExecProgram::new(&g, &plan, &[]),
        Err(RuntimeError::Plan(_))
    ));
    // An operator launched twice, an event out of range, a transfer never received.
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![vec![launch(a), launch(a)]],
        }],
        events: 0,
        transfers: 0,
    };
    assert!(ExecProgram::new(&g, &plan, &[])
        .unwrap_err()
        .to_string()
        .contains("twice"));
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![vec![Cmd::Wait(EventId(5)), launch(a)]],
        }],
        events: 1,
        transfers: 0,
    };
    assert!(ExecProgram::new(&g, &plan, &[]).is_err());
    let plan = LaunchPlan {
        gpus: vec![
            GpuLaunch {
                streams: vec![vec![
                    launch(a),
                    Cmd::Send {
                        xfer: opsched::schedule::TransferId(0),
                        src: a,
                        dst: b,
                        dst_gpu: 1,
                    },
                ]],
            },
            GpuLaunch {
                streams: vec![vec![launch(b), launch(c)]],
            },
        ],
        events: 0,
        transfers: 1,
    };
    let e = ExecProgram::new(&g, &plan, &[]).unwrap_err();
    assert!(e.to_string().contains("never received"), "{e}");
    // A graph input is not an operator.
    let x = g.find("x").unwrap();
    let plan = LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![vec![launch(x)]],
        }],
        events: 0,
        transfers: 0,
    };
    assert!(ExecProgram::new(&g, &plan, &[]).is_err());
    let _ = Op::Identity;
}

#[test]
fn logical_gpus_map_round_robin() {
    assert_eq!(exec::map_gpus(3, 1).unwrap(), vec![0, 0, 0]);
    assert_eq!(exec::map_gpus(4, 2).unwrap(), vec![0, 1, 0, 1]);
    assert_eq!(exec::map_gpus(2, 8).unwrap(), vec![0, 1]);
    assert!(exec::map_gpus(2, 0).is_err());
}

#[test]
fn sequential_plan_covers_every_operator_in_order() {
    let g = opsched::load_model("squeezenet", &ZooConfig::default()).unwrap();
    let plan = opsched_runtime::sequential_plan(&g);
    let p = ExecProgram::new(&g, &plan, &[]).unwrap();
    assert_eq!(p.counts().0, g.op_count());
    check_host_order(&g, &plan, &p);
}

/// Without a GPU (CI), running fails with a typed error naming the missing library.
#[test]
fn running_without_a_gpu_is_a_clear_error() {
    if opsched_gpu_present() {
        return;
    }
    let g = diamond();
    let plan = opsched_runtime::sequential_plan(&g);
    let e = opsched_runtime::run_plan(&g, &plan, None, &Default::default()).unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("could not be loaded") || m.contains("no CUDA device"),
        "{m}"
    );
}

fn opsched_gpu_present() -> bool {
    opsched_runtime::open_gpus(Some(1)).is_ok()
}

// --- GPU tests ---------------------------------------------------------------------------------

fn gpu_run(model: &str, algo: &str, logical: usize, capture: bool) -> opsched_runtime::RunReport {
    let g = opsched::load_model(
        model,
        &ZooConfig {
            batch: 1,
            input_size: Some(64),
            dtype: DType::F32,
        },
    )
    .unwrap();
    let cost = AnalyticalModel::new(
        DevicePreset::by_name("h100").unwrap(),
        LinkPreset::by_name("nvlink4").unwrap(),
    );
    let s = schedule(&g, algo, logical, &cost);
    let opts = opsched_runtime::RunOptions {
        graph_capture: capture,
        gpus: Some(1),
        warmup: 2,
        repeats: 5,
        check: opsched_runtime::CheckMode::Full,
        ..Default::default()
    };
    let r = opsched_runtime::run_schedule(&g, &s, &opts).unwrap();
    let c = r.check.clone().unwrap();
    assert!(c.passed, "{model}/{algo}: {c:?}");
    assert!(r.latency.median_ms > 0.0);
    r
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn gpu_squeezenet_sequential_and_ios_match_the_reference() {
    for capture in [false, true] {
        gpu_run("squeezenet", "sequential", 1, capture);
        gpu_run("squeezenet", "ios", 1, capture);
        gpu_run("googlenet", "opara", 1, capture);
        gpu_run("googlenet", "lios", 1, capture);
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn gpu_two_logical_gpus_on_one_physical() {
    for capture in [false, true] {
        let r = gpu_run("googlenet", "hios-lp", 2, capture);
        assert_eq!(r.physical_gpus, 1);
        assert_eq!(r.transfer_mode, "copy");
    }
}
