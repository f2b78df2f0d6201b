//! HIOS-LP and HIOS-MR on random layered DAGs (the paper's simulation setup), on small special
//! graphs and on a zoo model: valid schedules, agreement with the simulator, the lower bound,
//! the effect of Alg. 2, and the paper's headline speedup.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use opsched_cost::{AnalyticalModel, CostModel, DevicePreset, HiosSimLaw, LinkPreset};
use opsched_graph::random::{layered_dag, LayeredDagParams};
use opsched_graph::{Graph, NodeId};
use opsched_hios::{HiosLp, HiosMr, HiosOptions};
use opsched_schedule::bounds::critical_path;
use opsched_schedule::{
    lower, simulate, validate, Platform, Schedule, Scheduler, SchedulerStats, StagePlan,
};
use proptest::prelude::*;

fn cost() -> HiosSimLaw {
    HiosSimLaw::new(AnalyticalModel::default())
}

fn platform(gpus: usize, streams: usize) -> Platform {
    Platform {
        gpus,
        streams,
        device: DevicePreset::all().first().unwrap().clone(),
        link: LinkPreset::all().first().unwrap().clone(),
    }
}

fn dag(ops: usize, layers: usize, edges: usize, seed: u64) -> Graph {
    layered_dag(&LayeredDagParams {
        ops,
        layers,
        edges,
        seed,
        ..LayeredDagParams::default()
    })
    .unwrap()
}

/// The four variants, full ones first: (full, inter-only) pairs.
fn variants(window: usize) -> Vec<(Box<dyn Scheduler>, Box<dyn Scheduler>)> {
    let full = HiosOptions {
        window,
        inter_only: false,
    };
    let inter = HiosOptions {
        window,
        inter_only: true,
    };
    vec![
        (Box::new(HiosLp::new(full)), Box::new(HiosLp::new(inter))),
        (Box::new(HiosMr::new(full)), Box::new(HiosMr::new(inter))),
        (
            Box::new(HiosLp::always_longest_path(full)),
            Box::new(HiosLp::always_longest_path(inter)),
        ),
    ]
}

fn stage_plan(s: &Schedule) -> &StagePlan {
    match s {
        Schedule::Stages(p) => p,
        Schedule::Streams(_) => panic!("HIOS gives stage plans"),
    }
}

/// Every op once, on `p.gpus` GPUs, at most `p.streams` groups per stage, same-GPU
/// dependencies in stage order, and an acyclic stage graph across GPUs.
fn check_plan(g: &Graph, s: &Schedule, p: &Platform) {
    let plan = stage_plan(s);
    assert_eq!(plan.gpus.len(), p.gpus, "{}: one list per GPU", g.name);
    let mut at: HashMap<NodeId, (usize, usize)> = HashMap::new();
    let mut stage_ids: Vec<(usize, usize)> = Vec::new();
    for (gi, stages) in plan.gpus.iter().enumerate() {
        for (k, st) in stages.iter().enumerate() {
            assert!(!st.groups.is_empty(), "{}: empty stage", g.name);
            assert!(st.groups.len() <= p.streams, "{}: too many groups", g.name);
            for op in st.ops() {
                assert!(!g.node(op).op.is_input(), "{}: input scheduled", g.name);
                assert!(
                    at.insert(op, (gi, stage_ids.len())).is_none(),
                    "{}: op {} twice",
                    g.name,
                    g.node(op).name
                );
            }
            stage_ids.push((gi, k));
        }
    }
    assert_eq!(at.len(), g.op_count(), "{}: every op once", g.name);
    // Stage graph: GPU order plus dependencies.
    let ns = stage_ids.len();
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); ns];
    for s in 0..ns.saturating_sub(1) {
        if stage_ids[s].0 == stage_ids[s + 1].0 {
            succ[s].push(s + 1);
        }
    }
    for (u, v, _) in g.edges() {
        let (Some(&(gu, su)), Some(&(gv, sv))) = (at.get(&u), at.get(&v)) else {
            continue;
        };
        assert_ne!(su, sv, "{}: dependent ops share a stage", g.name);
        if gu == gv {
            assert!(
                stage_ids[su].1 < stage_ids[sv].1,
                "{}: '{}' runs before its producer '{}' on GPU {gu}",
                g.name,
                g.node(v).name,
                g.node(u).name
            );
        }
        succ[su].push(sv);
    }
    let mut indeg = vec![0usize; ns];
    for s in &succ {
        for &t in s {
            indeg[t] += 1;
        }
    }
    let mut queue: Vec<usize> = (0..ns).filter(|&s| indeg[s] == 0).collect();
    let mut head = 0;
    while head < queue.len() {
        let s = queue[head];
        head += 1;
        for &t in &succ[s] {
            indeg[t] -= 1;
            if indeg[t] == 0 {
                queue.push(t);
            }
        }
    }
    assert_eq!(head, ns, "{}: a cycle among stages", g.name);
    validate(g, s, p).unwrap();
}

/// Schedule, check, simulate; the simulated makespan (which must equal the internal one).
fn run(
    algo: &dyn Scheduler,
    g: &Graph,
    p: &Platform,
    cost: &dyn CostModel,
) -> (f64, SchedulerStats) {
    let (s, stats) = algo.schedule(g, p, cost).unwrap();
    check_plan(g, &s, p);
    let sim = simulate(g, &lower(g, &s).unwrap(), cost)
        .unwrap()
        .makespan_ms;
    let internal = stats.extra["makespan_ms"].as_f64().unwrap();
    assert!(
        (sim - internal).abs() <= 1e-9 * sim.abs().max(1e-300),
        "{} on {}: internal makespan {internal} but simulated {sim}",
        algo.name(),
        g.name
    );
    (sim, stats)
}

/// All variants on one graph: valid, above the critical path, full never worse than
/// inter-only.
fn check_all(g: &Graph, p: &Platform, window: usize) {
    let c = cost();
    let cp = critical_path(g, &c);
    for (full, inter) in variants(window) {
        let (mf, sf) = run(full.as_ref(), g, p, &c);
        let (mi, _) = run(inter.as_ref(), g, p, &c);
        for (name, m) in [(full.name(), mf), (inter.name(), mi)] {
            assert!(
                m >= cp * (1.0 - 1e-12),
                "{name} on {}: makespan {m} below the critical path {cp}",
                g.name
            );
        }
        assert!(
            mf <= mi * (1.0 + 1e-12),
            "{} on {}: {mf} is worse than its inter-only version {mi}",
            full.name(),
            g.name
        );
        assert_eq!(
            sf.extra["inter_makespan_ms"].as_f64().unwrap(),
            mi,
            "{}: Alg. 2 starts from the inter-only schedule",
            full.name()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn valid_schedules_on_random_layered_dags(
        ops in 1usize..=24,
        layers_raw in 0usize..6,
        edge_frac in 0.0f64..=1.0,
        seed in any::<u64>(),
        gpus in 1usize..=6,
        streams in 1usize..=4,
        window in 1usize..=4,
    ) {
        let layers = 1 + layers_raw % ops.min(6);
        let edges = if layers == 1 {
            0
        } else {
            let lo = ops - 1;
            let hi = (ops * ops - (layers - 1) - (ops - layers + 1) * (ops - layers + 1)) / 2;
            lo + ((hi - lo) as f64 * edge_frac) as usize
        };
        let g = dag(ops, layers, edges, seed);
        check_all(&g, &platform(gpus, streams), window);
    }
}

#[test]
fn names() {
    let o = HiosOptions::default();
    assert_eq!(o.window, 2);
    assert!(!o.inter_only);
    assert_eq!(HiosLp::new(o).name(), "hios-lp");
    assert_eq!(
        HiosLp::new(HiosOptions::inter_only()).name(),
        "hios-lp-inter"
    );
    assert_eq!(HiosMr::new(o).name(), "hios-mr");
    assert_eq!(
        HiosMr::new(HiosOptions::inter_only()).name(),
        "hios-mr-inter"
    );
    assert!(HiosLp::default().valid_path_rule());
    assert!(!HiosLp::always_longest_path(o).valid_path_rule());
}

#[test]
fn a_single_op() {
    let g = dag(1, 1, 0, 3);
    for gpus in 1..=4 {
        let p = platform(gpus, 4);
        check_all(&g, &p, 2);
        let c = cost();
        let t = c.op_time(&g, NodeId(0));
        let (m, _) = run(&HiosLp::default(), &g, &p, &c);
        assert_eq!(m, t);
    }
}

#[test]
fn a_chain() {
    // As many layers as ops and ops - 1 edges: a single chain, nothing to parallelize.
    let g = dag(12, 12, 11, 5);
    let c = cost();
    let total: f64 = g.ops().map(|o| c.op_time(&g, o)).sum();
    for gpus in 1..=4 {
        let p = platform(gpus, 4);
        check_all(&g, &p, 2);
        for (full, _) in variants(2) {
            let (m, _) = run(full.as_ref(), &g, &p, &c);
            // Alg. 1 and Alg. 3 keep a chain on one GPU: no transfer, no idle time.
            assert!(
                (m - total).abs() <= 1e-9 * total,
                "{}: {m} vs {total}",
                full.name()
            );
        }
    }
}

#[test]
fn independent_ops() {
    // One layer, no edges.
    let g = dag(10, 1, 0, 11);
    assert_eq!(g.edge_count(), 0);
    for gpus in 1..=6 {
        check_all(&g, &platform(gpus, 4), 2);
        check_all(&g, &platform(gpus, 1), 3);
    }
    // On one GPU, Alg. 2 groups some of them: the hios-sim law makes pairs cheaper.
    let c = cost();
    let p = platform(1, 4);
    let (mf, s) = run(&HiosLp::default(), &g, &p, &c);
    let (mi, _) = run(&HiosLp::new(HiosOptions::inter_only()), &g, &p, &c);
    assert!(mf < mi, "grouping independent ops helps: {mf} vs {mi}");
    assert!(s.extra["groupings_accepted"].as_u64().unwrap() > 0);
}

#[test]
fn ids_are_not_a_topological_order_and_that_is_fine() {
    let g = layered_dag(&LayeredDagParams::default()).unwrap();
    assert!(
        g.edges().any(|(u, v, _)| u.0 > v.0),
        "the generator numbers ops out of topological order"
    );
    check_all(&g, &platform(4, 4), 2);
    check_all(&g, &platform(3, 2), 3);
}

#[test]
fn no_gpu_or_no_stream_is_refused() {
    let g = dag(5, 2, 4, 1);
    let c = cost();
    for p in [platform(0, 4), platform(2, 0)] {
        assert!(HiosLp::default().schedule(&g, &p, &c).is_err());
        assert!(HiosMr::default().schedule(&g, &p, &c).is_err());
    }
}

#[test]
fn a_zoo_model_with_graph_inputs_under_the_analytical_model() {
    use opsched_graph::zoo::{self, ZooConfig};
    let m = zoo::models()
        .iter()
        .find(|m| m.name == "squeezenet")
        .unwrap();
    let g = m.build(&ZooConfig::default()).unwrap();
    let p = platform(2, 4);
    let c = AnalyticalModel::new(p.device.clone(), p.link.clone());
    let cp = critical_path(&g, &c);
    for (full, inter) in variants(2) {
        let (mf, _) = run(full.as_ref(), &g, &p, &c);
        let (mi, _) = run(inter.as_ref(), &g, &p, &c);
        assert!(mf <= mi * (1.0 + 1e-12));
        assert!(mf >= cp * (1.0 - 1e-12));
    }
}

fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// The paper's default setup (200 ops, 14 layers, 400 edges, p = 0.8, 4 GPUs, w = 2), 10 seeds:
/// HIOS-LP is at least 2x faster than sequential on average (the paper: 2.01 to 2.12) and
/// ahead of HIOS-MR.
#[test]
fn acceptance_speedup_over_sequential_on_the_default_setup() {
    let c = cost();
    let p = platform(4, 8);
    let names = [
        "hios-lp",
        "hios-lp-inter",
        "hios-mr",
        "hios-mr-inter",
        "hios-lp (always longest)",
        "hios-lp-inter (always longest)",
    ];
    let mut speedups: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for seed in 0..10 {
        let g = layered_dag(&LayeredDagParams {
            seed,
            ..LayeredDagParams::default()
        })
        .unwrap();
        let sequential: f64 = g.ops().map(|o| c.op_time(&g, o)).sum();
        let mut i = 0;
        for (full, inter) in variants(2) {
            for algo in [full, inter] {
                let (m, _) = run(algo.as_ref(), &g, &p, &c);
                speedups[i].push(sequential / m);
                i += 1;
            }
        }
    }
    // variants() order: lp, lp-inter, mr, mr-inter, lp-always, lp-inter-always.
    for (name, s) in names.iter().zip(&speedups) {
        let (mean, std) = mean_std(s);
        eprintln!("{name:<32} speedup over sequential {mean:.3} +- {std:.3}");
    }
    let lp = mean_std(&speedups[0]).0;
    let mr = mean_std(&speedups[2]).0;
    assert!(lp >= 2.0, "HIOS-LP mean speedup {lp} below 2.0");
    assert!(lp > mr, "HIOS-LP ({lp}) should beat HIOS-MR ({mr})");
}

/// HIOS-LP schedules the default instance quickly even in a debug build (release: about
/// 2 ms; see `examples/hios_time.rs`).
#[test]
fn scheduling_is_fast() {
    let g = layered_dag(&LayeredDagParams::default()).unwrap();
    let c = cost();
    let p = platform(4, 8);
    let (_, stats) = HiosLp::default().schedule(&g, &p, &c).unwrap();
    assert!(stats.wall_ms < 2000.0, "took {} ms", stats.wall_ms);
}
