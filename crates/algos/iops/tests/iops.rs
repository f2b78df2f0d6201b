//! IOPS on every zoo model and on random layered DAGs: every operator exactly once,
//! dependencies respected, the limits kept (block size, groups per stage, merge rule), the
//! objective no worse than sequential, template hits on NASNet's repeated cells, and the
//! simulator agreeing with the objective and with the lower bound.

#![allow(clippy::unwrap_used)]

use opsched_cost::{device, AnalyticalModel, CostModel, HiosSimLaw};
use opsched_graph::merge::mergeable;
use opsched_graph::random::{layered_dag, LayeredDagParams};
use opsched_graph::zoo::{self, ZooConfig};
use opsched_graph::Graph;
use opsched_iops::{Iops, IopsResult};
use opsched_schedule::{
    lower, lower_bound, simulate, validate, Platform, Schedule, Scheduler, StageStrategy,
};
use proptest::prelude::*;

fn platform(streams: usize) -> Platform {
    Platform {
        gpus: 1,
        streams,
        device: device::H100,
        link: device::NVLINK4,
    }
}

/// The checks every IOPS schedule must pass.
fn check(g: &Graph, iops: &Iops, r: &IopsResult, cost: &dyn CostModel, p: &Platform) {
    let Schedule::Stages(plan) = &r.schedule else {
        panic!("iops returns a stage plan")
    };
    assert_eq!(plan.gpus.len(), 1, "one GPU");
    let stages = &plan.gpus[0];
    // Every operator exactly once; position of each.
    let mut stage_of = vec![usize::MAX; g.len()];
    let mut group_pos = vec![(usize::MAX, usize::MAX); g.len()];
    for (si, s) in stages.iter().enumerate() {
        assert!(!s.groups.is_empty());
        match s.strategy {
            StageStrategy::Concurrent => {
                assert!(s.groups.len() <= iops.max_parallel.min(p.streams));
                let n: usize = s.groups.iter().map(Vec::len).sum();
                assert!(n <= iops.max_processes, "{n} ops in one process");
            }
            StageStrategy::Merge => {
                assert_eq!(s.groups.len(), 1);
                let ops: Vec<_> = s.ops().collect();
                assert!(ops.len() >= 2 && ops.len() <= iops.max_parallel);
                assert!(mergeable(g, &ops), "merge stage {si} is not mergeable");
            }
        }
        for (gi, grp) in s.groups.iter().enumerate() {
            assert!(!grp.is_empty());
            for (k, &op) in grp.iter().enumerate() {
                assert!(!g.node(op).op.is_input());
                assert_eq!(
                    stage_of[op.index()],
                    usize::MAX,
                    "{} twice",
                    g.node(op).name
                );
                stage_of[op.index()] = si;
                group_pos[op.index()] = (gi, k);
            }
        }
    }
    for op in g.ops() {
        assert_ne!(
            stage_of[op.index()],
            usize::MAX,
            "{} missing",
            g.node(op).name
        );
    }
    // Dependencies: earlier stage, or earlier in the same group of a concurrent stage.
    for op in g.ops() {
        for pr in g.preds(op).filter(|p| !g.node(*p).op.is_input()) {
            let (sp, sv) = (stage_of[pr.index()], stage_of[op.index()]);
            if sp == sv {
                let (gp, kp) = group_pos[pr.index()];
                let (gv, kv) = group_pos[op.index()];
                assert_eq!(stages[sv].strategy, StageStrategy::Concurrent);
                assert!(
                    gp == gv && kp < kv,
                    "{} -> {}",
                    g.node(pr).name,
                    g.node(op).name
                );
            } else {
                assert!(sp < sv, "{} -> {}", g.node(pr).name, g.node(op).name);
            }
        }
    }
    // Blocks: at most max_block operators, and they cover the graph.
    let blocks = r.stats.extra["per_block"].as_array().unwrap();
    assert_eq!(
        blocks.len() as u64,
        r.stats.extra["blocks"].as_u64().unwrap()
    );
    let mut total = 0;
    for b in blocks {
        let n = b["ops"].as_u64().unwrap() as usize;
        assert!(n >= 1 && n <= iops.max_block);
        total += n;
    }
    assert_eq!(total, g.op_count());
    let merges = r.stats.extra["merge_stages"].as_u64().unwrap() as usize;
    let concurrent = r.stats.extra["concurrent_stages"].as_u64().unwrap() as usize;
    assert_eq!(merges + concurrent, stages.len());
    // The objective is no worse than running the operators one by one.
    let seq: f64 = g.ops().map(|v| cost.op_time(g, v)).sum();
    assert!(
        r.objective_ms <= seq * (1.0 + 1e-9) + 1e-12,
        "objective {} > sequential {seq}",
        r.objective_ms
    );
    // The validator, the simulator and the lower bound agree.
    validate(g, &r.schedule, p).unwrap();
    let t = simulate(g, &lower(g, &r.schedule).unwrap(), cost).unwrap();
    let tol = 1e-9 * r.objective_ms.max(1e-9);
    assert!(
        (t.makespan_ms - r.objective_ms).abs() <= tol.max(1e-9),
        "simulated {} vs objective {}",
        t.makespan_ms,
        r.objective_ms
    );
    let lb = lower_bound(g, cost, 1).value();
    assert!(
        t.makespan_ms >= lb * (1.0 - 1e-9),
        "{} < bound {lb}",
        t.makespan_ms
    );
}

#[test]
fn every_zoo_model() {
    let cost = AnalyticalModel::default();
    let p = platform(8);
    let iops = Iops::default();
    for m in zoo::models() {
        let g = m.build(&ZooConfig::default()).unwrap();
        let r = iops.run(&g, &p, &cost).unwrap();
        check(&g, &iops, &r, &cost, &p);
        // The trait gives the same schedule.
        let (s, stats) = iops.schedule(&g, &p, &cost).unwrap();
        assert_eq!(s, r.schedule, "{}", m.name);
        assert_eq!(stats.extra["blocks"], r.stats.extra["blocks"]);
    }
}

/// NASNet's identical cells reuse each other's schedules. Fewer are identical where the
/// producers of cell outputs activate them for their readers (`then=relu` in the signature):
/// the last normal cell of a stack, whose output one cell reads, does not (3 hits instead of
/// 7 on 2026-11-27).
#[test]
fn nasnet_cells_are_templates() {
    let cost = AnalyticalModel::default();
    let p = platform(8);
    let all = opsched_graph::fusion::Fusions::ALL;
    for (fusions, at_least) in [(all, 3), (all.without("act-into-producer").unwrap(), 5)] {
        let g = zoo::build("nasnet", &ZooConfig::default())
            .unwrap()
            .with_fusions(fusions);
        nasnet_templates(&g, &cost, &p, at_least);
    }
}

fn nasnet_templates(g: &Graph, cost: &AnalyticalModel, p: &Platform, at_least: u64) {
    let r = Iops::default().run(g, p, cost).unwrap();
    let hits = r.stats.extra["template_hits"].as_u64().unwrap();
    assert!(hits >= at_least, "only {hits} template hits");
    let per_block = r.stats.extra["per_block"].as_array().unwrap();
    for b in per_block.iter().filter(|b| b["template_hit"] == true) {
        let from = b["template_of"].as_u64().unwrap() as usize;
        let src = &per_block[from];
        assert_eq!(b["ops"], src["ops"]);
        assert_eq!(b["stages"], src["stages"]);
        assert_eq!(b["states"], 0);
        let (x, y) = (
            b["cost_ms"].as_f64().unwrap(),
            src["cost_ms"].as_f64().unwrap(),
        );
        assert!((x - y).abs() <= 1e-12 * x.max(1.0));
    }
}

#[test]
fn other_limits_and_few_streams() {
    let cost = AnalyticalModel::default();
    let g = zoo::build("inception_v3", &ZooConfig::default()).unwrap();
    for (iops, streams) in [
        (
            Iops {
                max_block: 12,
                max_parallel: 2,
                max_processes: 3,
            },
            8,
        ),
        (Iops::default(), 2),
        (
            Iops {
                max_block: 1,
                max_parallel: 1,
                max_processes: 1,
            },
            1,
        ),
    ] {
        let p = platform(streams);
        let r = iops.run(&g, &p, &cost).unwrap();
        check(&g, &iops, &r, &cost, &p);
    }
}

#[test]
fn bad_configuration_is_an_error() {
    let cost = AnalyticalModel::default();
    let g = zoo::build("squeezenet", &ZooConfig::default()).unwrap();
    let p = platform(8);
    for bad in [
        Iops {
            max_block: 0,
            ..Iops::default()
        },
        Iops {
            max_block: 65,
            ..Iops::default()
        },
        Iops {
            max_parallel: 0,
            ..Iops::default()
        },
    ] {
        assert!(bad.schedule(&g, &p, &cost).is_err());
    }
    assert!(Iops::default().schedule(&g, &platform(0), &cost).is_err());
    assert_eq!(Iops::default().name(), "iops");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn random_dags(seed in 0u64..1000, ops in 2usize..40, layers in 1usize..8, extra in 0usize..30,
                   block in 1usize..20, par in 1usize..5, procs in 1usize..9) {
        let layers = layers.min(ops);
        let params = LayeredDagParams {
            ops,
            layers,
            edges: ops - 1 + extra.min(ops),
            seed,
            ..LayeredDagParams::default()
        };
        let Ok(g) = layered_dag(&params) else { return Ok(()) };
        let cost = HiosSimLaw::new(AnalyticalModel::default());
        let iops = Iops { max_block: block, max_parallel: par, max_processes: procs };
        let p = platform(4);
        let r = iops.run(&g, &p, &cost).unwrap();
        check(&g, &iops, &r, &cost, &p);
    }
}
