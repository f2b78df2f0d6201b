//! Opara: the stream allocation worked by hand on a graph with every case of the paper's
//! appendix, the launch order's alternation and least-demand picks, and invariants on every
//! zoo model and on random layered DAGs (validity, topological launch order, stream cap,
//! simulated makespan against the lower bound and the sequential sum).

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;

use opsched_cost::{AnalyticalModel, CostModel, DevicePreset, LinkPreset};
use opsched_graph::formats::dag;
use opsched_graph::random::{layered_dag, LayeredDagParams};
use opsched_graph::zoo::{models, ZooConfig};
use opsched_graph::{Graph, NodeId};
use opsched_opara::{allocate_streams, demand_scalar, launch_order, OpClass, Opara};
use opsched_schedule::{
    lower, lower_bound, simulate, validate, GpuStreams, Platform, Schedule, Scheduler,
};
use proptest::prelude::*;

fn platform(streams: usize) -> Platform {
    Platform {
        gpus: 1,
        streams,
        device: DevicePreset::by_name("h100").unwrap(),
        link: LinkPreset::all().first().unwrap().clone(),
    }
}

/// A cost-annotated DAG: `ops` are (id, time_ms, util), `edges` (src, dst).
fn dag_graph(ops: &[(u32, f64, f64)], edges: &[(u32, u32)]) -> Graph {
    let ops: Vec<String> = ops
        .iter()
        .map(|(i, t, u)| format!(r#"{{"id": {i}, "time_ms": {t}, "util": {u}}}"#))
        .collect();
    let edges: Vec<String> = edges
        .iter()
        .map(|(s, d)| format!(r#"{{"src": {s}, "dst": {d}}}"#))
        .collect();
    let text = format!(
        r#"{{"format": "opsched-dag", "name": "hand", "ops": [{}], "edges": [{}]}}"#,
        ops.join(", "),
        edges.join(", ")
    );
    dag::from_str(&text).unwrap()
}

fn id(g: &Graph, v: u32) -> NodeId {
    g.find(&v.to_string()).unwrap()
}

fn names(g: &Graph, ops: &[NodeId]) -> Vec<u32> {
    ops.iter()
        .map(|&o| g.node(o).name.parse().unwrap())
        .collect()
}

/// The paper's appendix cases on one graph: 1 is a root; 5, 6, 7 are single successors of
/// single-successor operators; 2, 9, 11 are first successors of forks; 3, 4, 10, 12 are later
/// successors of forks; 8 and 13 are joins.
const EDGES: [(u32, u32); 16] = [
    (1, 2),
    (1, 3),
    (1, 4),
    (2, 5),
    (3, 6),
    (4, 7),
    (5, 8),
    (6, 8),
    (7, 8),
    (8, 9),
    (8, 10),
    (9, 11),
    (9, 12),
    (10, 13),
    (11, 13),
    (12, 13),
];

/// Every op takes 1 ms; the utilization (the demand scalar of an abstract operator) grows with
/// the id, so the launch order takes the smallest ready id: 1, 2, ..., 13.
fn appendix_graph() -> Graph {
    let ops: Vec<(u32, f64, f64)> = (1..=13).map(|i| (i, 1.0, 0.01 * f64::from(i))).collect();
    dag_graph(&ops, &EDGES)
}

fn streams_of(s: &Schedule) -> &GpuStreams {
    match s {
        Schedule::Streams(p) => &p.gpus[0],
        Schedule::Stages(_) => panic!("Opara returns a stream plan"),
    }
}

#[test]
fn stream_allocation_by_hand() {
    let g = appendix_graph();
    let cost = AnalyticalModel::default();
    let (s, stats) = Opara.schedule(&g, &platform(8), &cost).unwrap();
    let gs = streams_of(&s);
    assert_eq!(
        names(&g, gs.launch_order.as_ref().unwrap()),
        (1..=13).collect::<Vec<_>>()
    );
    // 1 opens s0; 2 continues 1 (flag of 1 set); 3 and 4 open s1, s2; 5, 6, 7 follow 2, 3, 4;
    // 8 joins 5 (the first predecessor in launch order with a free flag); 9 continues 8, 10
    // opens s3; 11 continues 9, 12 opens s4; 13 joins 10 (launched before 11 and 12).
    let streams: Vec<Vec<u32>> = gs.streams.iter().map(|st| names(&g, st)).collect();
    assert_eq!(
        streams,
        vec![
            vec![1, 2, 5, 8, 9, 11],
            vec![3, 6],
            vec![4, 7],
            vec![10, 13],
            vec![12],
        ]
    );
    assert_eq!(stats.extra["streams"], 5);
    // Producers with a consumer on another stream: 1 (3, 4), 6, 7 (8), 8 (10), 9 (12), 11, 12
    // (13): 7 events, 8 waits.
    assert_eq!(stats.extra["events"], 7);
    assert_eq!(stats.extra["cross_stream_edges"], 8);
    assert_eq!(stats.extra["memory_ops"], 0);
    assert_eq!(stats.extra["compute_ops"], 13);
    assert_eq!(stats.extra["capped_ops"], 0);
    validate(&g, &s, &platform(8)).unwrap();
    let plan = lower(&g, &s).unwrap();
    assert_eq!(plan.events, 7);
}

#[test]
fn stream_cap_reuses_the_stream_free_earliest() {
    let g = appendix_graph();
    let cost = AnalyticalModel::default();
    let (s, stats) = Opara.schedule(&g, &platform(3), &cost).unwrap();
    let streams: Vec<Vec<u32>> = streams_of(&s)
        .streams
        .iter()
        .map(|st| names(&g, st))
        .collect();
    // Estimated finishes (1 ms each, no contention): s0 runs 1, 2, 5, 8, 9 until 5; s1 runs
    // 3, 6 until 3; s2 runs 4, 7 until 3. 10 (ready at 4) would open a 4th stream: s1 and s2
    // are free at 3, the lower index wins: s1, until 5. 11 continues 9 on s0 (until 6). 12
    // would open a stream: s2 is free earliest (3). 13 joins 10, whose flag is free, on s1.
    assert_eq!(
        streams,
        vec![vec![1, 2, 5, 8, 9, 11], vec![3, 6, 10, 13], vec![4, 7, 12]]
    );
    assert_eq!(stats.extra["capped_ops"], 2);
    validate(&g, &s, &platform(3)).unwrap();

    // One stream: everything in launch order.
    let (s, _) = Opara.schedule(&g, &platform(1), &cost).unwrap();
    let gs = streams_of(&s);
    assert_eq!(gs.streams.len(), 1);
    assert_eq!(&gs.streams[0], gs.launch_order.as_ref().unwrap());
}

#[test]
fn allocation_follows_the_given_order() {
    // The same graph launched as 1, 4, 3, 2, ...: 4 continues 1, 3 and 2 open streams.
    let g = appendix_graph();
    let order: Vec<NodeId> = [1, 4, 3, 2, 7, 6, 5, 8, 10, 9, 12, 11, 13]
        .iter()
        .map(|&v| id(&g, v))
        .collect();
    let a = allocate_streams(&g, &order, 0, &[]);
    let streams: Vec<Vec<u32>> = a.streams.iter().map(|st| names(&g, st)).collect();
    // 8's predecessors in launch order: 7, 6, 5 -> joins 7 on s0. 10 continues 8; 9 opens s3;
    // 12 continues 9; 11 opens s4; 13's predecessors in launch order 10, 12, 11 -> 10's flag
    // is free: s0.
    assert_eq!(
        streams,
        vec![
            vec![1, 4, 7, 8, 10, 13],
            vec![3, 6],
            vec![2, 5],
            vec![9, 12],
            vec![11],
        ]
    );
}

#[test]
fn launch_order_alternates_and_takes_least_demand() {
    // Five independent roots and a join: m1, m2 memory-intensive; c1, c2, c3 compute-intensive.
    let g = dag_graph(
        &[
            (1, 1.0, 1.0),
            (2, 1.0, 1.0),
            (3, 1.0, 1.0),
            (4, 1.0, 1.0),
            (5, 1.0, 1.0),
            (6, 1.0, 1.0),
            (7, 1.0, 1.0),
        ],
        &[(1, 6), (2, 6), (3, 6), (4, 6), (5, 6), (1, 7)],
    );
    let n = g.len();
    let mut class = vec![OpClass::Compute; n];
    let mut demand = vec![0.0; n];
    // (op, class, demand)
    let spec = [
        (1, OpClass::Memory, 0.3),
        (2, OpClass::Memory, 0.1),
        (3, OpClass::Compute, 0.5),
        (4, OpClass::Compute, 0.2),
        (5, OpClass::Compute, 0.4),
        (6, OpClass::Memory, 0.0),
        (7, OpClass::Memory, 0.05),
    ];
    for (v, c, d) in spec {
        class[id(&g, v).index()] = c;
        demand[id(&g, v).index()] = d;
    }
    let order = names(&g, &launch_order(&g, &class, &demand));
    // Compute first: 4 (0.2 < 0.4 < 0.5); memory: 2 (0.1); compute: 5 (0.4); memory: 1 (0.3,
    // which readies 7); compute: 3 (which readies 6); then only memory is left: 6 (0.0)
    // before 7 (0.05).
    assert_eq!(order, vec![4, 2, 5, 1, 3, 6, 7]);

    // Ties on demand go to the smaller id (node ids follow the ops list: op k is node k - 1):
    // 1..5 are roots; 1 readies 7 and 5 readies 6, which precedes 7.
    let demand = vec![0.5; n];
    let class = vec![OpClass::Compute; n];
    let order = names(&g, &launch_order(&g, &class, &demand));
    assert_eq!(order, vec![1, 2, 3, 4, 5, 6, 7]);
}

#[test]
fn demand_scalar_is_the_dominant_share() {
    let dev = DevicePreset::by_name("h100").unwrap();
    let sms = f64::from(dev.sms);
    let d = opsched_cost::ResourceDemand {
        sm_share: 0.5,
        bw_share: 0.0,
        blocks: 2 * u64::from(dev.sms),
        threads_per_block: 256,
        registers_per_thread: 128,
        shared_mem_per_block: 12 * 1024,
        memory_bound: false,
    };
    let blocks = 2.0 * sms;
    let t = blocks * 256.0 / (f64::from(dev.max_threads_per_sm) * sms);
    let r = blocks * 256.0 * 128.0 / (f64::from(dev.registers_per_sm) * sms);
    let s = blocks * 12.0 * 1024.0 / (f64::from(dev.shared_mem_per_sm_kib) * 1024.0 * sms);
    let want = t.max(r).max(s);
    assert!((demand_scalar(&d, &dev) - want).abs() < 1e-12);
    // 256 threads x 128 registers x 2 blocks per SM = all 64K registers of an H100 SM.
    assert!((want - 1.0).abs() < 1e-12);
    // No kernel: the SM share.
    let none = opsched_cost::ResourceDemand {
        sm_share: 0.25,
        ..opsched_cost::ResourceDemand::default()
    };
    assert_eq!(demand_scalar(&none, &dev), 0.25);
}

/// Checks every invariant of an Opara schedule of `g` on `p`; returns (makespan, streams).
fn check(g: &Graph, p: &Platform, cost: &dyn CostModel) -> (f64, usize) {
    let (s, stats) = Opara.schedule(g, p, cost).unwrap();
    let gs = streams_of(&s);
    let order = gs.launch_order.as_ref().unwrap();
    // Every op exactly once, in the launch order and in the streams.
    let ops: HashSet<NodeId> = g.ops().collect();
    assert_eq!(order.len(), ops.len());
    assert_eq!(order.iter().copied().collect::<HashSet<_>>(), ops);
    let placed: Vec<NodeId> = gs.streams.iter().flatten().copied().collect();
    assert_eq!(placed.len(), ops.len());
    assert_eq!(placed.into_iter().collect::<HashSet<_>>(), ops);
    // The launch order is topological.
    let mut pos = vec![usize::MAX; g.len()];
    for (i, &v) in order.iter().enumerate() {
        pos[v.index()] = i;
    }
    for (u, v, _) in g.edges() {
        if g.node(u).op.is_input() {
            continue;
        }
        assert!(
            pos[u.index()] < pos[v.index()],
            "{} before {}",
            g.node(v).name,
            g.node(u).name
        );
    }
    // Streams follow the launch order, so no op precedes an ancestor on its stream; and the
    // ancestors of an op never come after it on its stream (checked directly on predecessors).
    let mut stream_of = vec![usize::MAX; g.len()];
    let mut at = vec![0usize; g.len()];
    for (si, st) in gs.streams.iter().enumerate() {
        assert!(!st.is_empty());
        for w in st.windows(2) {
            assert!(pos[w[0].index()] < pos[w[1].index()]);
        }
        for (k, &v) in st.iter().enumerate() {
            stream_of[v.index()] = si;
            at[v.index()] = k;
        }
    }
    for (u, v, _) in g.edges() {
        if !g.node(u).op.is_input() && stream_of[u.index()] == stream_of[v.index()] {
            assert!(at[u.index()] < at[v.index()]);
        }
    }
    assert!(gs.streams.len() <= p.streams);
    assert_eq!(stats.extra["streams"], gs.streams.len());
    validate(g, &s, p).unwrap();
    let plan = lower(g, &s).unwrap();
    assert_eq!(
        u64::from(plan.events),
        stats.extra["events"].as_u64().unwrap()
    );
    let tl = simulate(g, &plan, cost).unwrap();
    let lb = lower_bound(g, cost, 1).value();
    assert!(
        tl.makespan_ms >= lb * (1.0 - 1e-9),
        "{}: makespan {} below the lower bound {}",
        g.name,
        tl.makespan_ms,
        lb
    );
    (tl.makespan_ms, gs.streams.len())
}

/// Replays the launch order: each pick is from the other class than the last launched op when
/// both classes are ready (compute first), and the least (demand, id) of its class.
fn check_launch_rule(g: &Graph, p: &Platform, cost: &dyn CostModel) {
    let (s, _) = Opara.schedule(g, p, cost).unwrap();
    let order = streams_of(&s).launch_order.clone().unwrap();
    let class: Vec<Option<OpClass>> = (0..g.len())
        .map(|i| {
            let v = NodeId(i as u32);
            (!g.node(v).op.is_input()).then(|| OpClass::of(&cost.demand(g, v)))
        })
        .collect();
    let demand: Vec<f64> = (0..g.len())
        .map(|i| demand_scalar(&cost.demand(g, NodeId(i as u32)), &p.device))
        .collect();
    let mut left: Vec<usize> = (0..g.len())
        .map(|i| {
            g.preds(NodeId(i as u32))
                .filter(|&u| !g.node(u).op.is_input())
                .count()
        })
        .collect();
    let mut ready: HashSet<NodeId> = g.ops().filter(|v| left[v.index()] == 0).collect();
    let mut last: Option<OpClass> = None;
    for &v in &order {
        assert!(ready.contains(&v));
        let has = |c: OpClass| ready.iter().any(|r| class[r.index()] == Some(c));
        let want = match (has(OpClass::Memory), has(OpClass::Compute)) {
            (true, true) => {
                if last == Some(OpClass::Compute) {
                    OpClass::Memory
                } else {
                    OpClass::Compute
                }
            }
            (true, false) => OpClass::Memory,
            _ => OpClass::Compute,
        };
        let cv = class[v.index()].unwrap();
        assert_eq!(cv, want, "{}: class", g.node(v).name);
        for r in &ready {
            if class[r.index()] == Some(cv) && *r != v {
                let (dr, dv) = (demand[r.index()], demand[v.index()]);
                assert!(
                    dv < dr || (dv == dr && v.0 < r.0),
                    "{}: least demand",
                    g.name
                );
            }
        }
        ready.remove(&v);
        last = Some(cv);
        for s in g.succs(v) {
            left[s.index()] -= 1;
            if left[s.index()] == 0 {
                ready.insert(s);
            }
        }
    }
}

#[test]
fn zoo_models() {
    let cost = AnalyticalModel::default();
    for spec in models() {
        let g = spec.build(&ZooConfig::default()).unwrap();
        let seq: f64 = g.ops().map(|v| cost.op_time(&g, v)).sum();
        for cap in [1, 4, 8, opsched_schedule::MAX_STREAMS] {
            let (ms, _) = check(&g, &platform(cap), &cost);
            if g.name.starts_with("inception") && cap == 8 {
                assert!(
                    ms < seq,
                    "Inception-v3: {ms} ms not below sequential {seq} ms"
                );
                eprintln!(
                    "inception_v3 on h100, 8 streams: {ms:.4} ms vs sequential {seq:.4} ms, \
                     speedup {:.3}x",
                    seq / ms
                );
            }
        }
        check_launch_rule(&g, &platform(8), &cost);
        // Mixed classes on the real models.
        let memory = g.ops().filter(|&v| cost.demand(&g, v).memory_bound).count();
        assert!(memory > 0 && memory < g.op_count(), "{}", g.name);
    }
}

#[test]
fn rejects_an_empty_platform() {
    let g = appendix_graph();
    let cost = AnalyticalModel::default();
    assert!(Opara.schedule(&g, &platform(0), &cost).is_err());
    let mut p = platform(4);
    p.gpus = 0;
    assert!(Opara.schedule(&g, &p, &cost).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn random_dags(ops in 2usize..40, layers in 2usize..8, extra in 0usize..30,
                   cap in 1usize..7, seed in 0u64..1000) {
        let layers = layers.min(ops);
        // Feasible for every seed: ops - 1 <= edges <= (ops^2 - (layers - 1) - (ops - layers
        // + 1)^2) / 2 (see opsched_graph::random).
        let most = (ops * ops - (layers - 1) - (ops - layers + 1).pow(2)) / 2;
        let params = LayeredDagParams {
            ops,
            layers,
            edges: (ops - 1 + extra).min(most).max(ops - 1),
            seed,
            ..LayeredDagParams::default()
        };
        let g = layered_dag(&params);
        let g = g.unwrap();
        let cost = AnalyticalModel::default();
        check(&g, &platform(cap), &cost);
        check_launch_rule(&g, &platform(cap), &cost);
    }
}
