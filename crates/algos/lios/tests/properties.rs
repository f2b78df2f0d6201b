//! Properties of every LIOS variant on random cost-annotated DAGs and on every zoo model:
//! every operator exactly once, stream order respecting dependencies, at most `streams`
//! streams, a launch order that is a topological order, LIOS's own times consistent with its
//! plan, its makespan between the critical path and the sequential sum under the ideal model,
//! and the simulator reproducing its times.

#![allow(clippy::unwrap_used)]

use opsched_cost::{device, AnalyticalModel, CostModel, IdealModel};
use opsched_graph::random::{layered_dag, LayeredDagParams};
use opsched_graph::zoo::{self, ZooConfig};
use opsched_graph::{Graph, NodeId};
use opsched_lios::{Lios, LiosRun, LiosVariant};
use opsched_schedule::bounds::critical_path;
use opsched_schedule::{lower, simulate, validate, Platform, Schedule, Scheduler};
use proptest::prelude::*;

fn platform(streams: usize) -> Platform {
    Platform {
        gpus: 1,
        streams,
        device: device::H100,
        link: device::NVLINK4,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

/// Everything we promise about one schedule of `g`.
fn check(g: &Graph, lios: Lios, streams: usize, cost: &dyn CostModel) -> LiosRun {
    let tag = format!(
        "{} / {} seed {} / {streams} streams",
        g.name,
        lios.variant().name(),
        lios.seed()
    );
    let p = platform(streams);
    let (schedule, stats) = lios.schedule(g, &p, cost).unwrap();
    let Schedule::Streams(plan) = &schedule else {
        panic!("{tag}: LIOS gives a stream plan");
    };
    assert_eq!(plan.gpus.len(), 1, "{tag}: one GPU");
    let gs = &plan.gpus[0];
    assert!(
        gs.streams.len() <= streams,
        "{tag}: at most {streams} streams"
    );
    assert!(
        gs.streams.iter().all(|s| !s.is_empty()),
        "{tag}: no empty stream"
    );

    // Every operator exactly once; no graph input.
    let mut at: Vec<Option<(usize, usize)>> = vec![None; g.len()];
    for (j, ops) in gs.streams.iter().enumerate() {
        for (k, &op) in ops.iter().enumerate() {
            assert!(!g.node(op).op.is_input(), "{tag}: input scheduled");
            assert!(
                at[op.index()].replace((j, k)).is_none(),
                "{tag}: '{}' twice",
                g.node(op).name
            );
        }
    }
    assert_eq!(
        at.iter().flatten().count(),
        g.op_count(),
        "{tag}: every op once"
    );

    // No operator before one of its ancestors on the same stream: walk ancestors.
    let ops: Vec<NodeId> = g.ops().collect();
    let mut anc: Vec<Vec<bool>> = vec![Vec::new(); g.len()];
    for &v in g.topo_order() {
        let mut a = vec![false; g.len()];
        for u in g.preds(v) {
            a[u.index()] = true;
            for (x, &b) in anc[u.index()].iter().enumerate() {
                a[x] |= b;
            }
        }
        anc[v.index()] = a;
    }
    for &v in &ops {
        let (sv, kv) = at[v.index()].unwrap();
        for &u in &ops {
            if anc[v.index()][u.index()] {
                let (su, ku) = at[u.index()].unwrap();
                assert!(
                    su != sv || ku < kv,
                    "{tag}: '{}' before its ancestor '{}'",
                    g.node(v).name,
                    g.node(u).name
                );
            }
        }
    }

    // The launch order is a topological order of all operators.
    let order = gs.launch_order.as_ref().unwrap();
    assert_eq!(order.len(), ops.len(), "{tag}: launch order lists every op");
    let mut pos = vec![usize::MAX; g.len()];
    for (i, &op) in order.iter().enumerate() {
        pos[op.index()] = i;
    }
    for (s, d, _) in g.edges() {
        if !g.node(s).op.is_input() {
            assert!(
                pos[s.index()] < pos[d.index()],
                "{tag}: launch order breaks an edge"
            );
        }
    }
    validate(g, &schedule, &p).unwrap();

    // LIOS's trace: starts after predecessors and after the previous op of the stream.
    let run = lios.run(g, streams, cost).unwrap();
    assert_eq!(
        stats.extra["lios_makespan_ms"],
        serde_json::json!(run.makespan_ms)
    );
    let mut finish = vec![0.0f64; g.len()];
    let mut free = vec![0.0f64; streams];
    for st in &run.steps {
        let w = cost.op_time(g, st.op);
        assert!(
            close(st.finish_ms - st.start_ms, w),
            "{tag}: span = op time"
        );
        assert!(st.start_ms >= free[st.stream], "{tag}: stream overlap");
        for u in g.preds(st.op) {
            assert!(
                st.start_ms >= finish[u.index()],
                "{tag}: starts before a predecessor ends"
            );
        }
        finish[st.op.index()] = st.finish_ms;
        free[st.stream] = st.finish_ms;
    }
    run
}

/// Under the ideal model: bounds, and the simulator agrees with LIOS's own times.
fn check_ideal(g: &Graph, lios: Lios, streams: usize, cost: &IdealModel) {
    let run = check(g, lios, streams, cost);
    let tag = format!("{} / {} / {streams} streams", g.name, lios.variant().name());
    let cp = critical_path(g, cost);
    let seq: f64 = g.ops().map(|v| cost.op_time(g, v)).sum();
    assert!(
        run.makespan_ms >= cp * (1.0 - 1e-12),
        "{tag}: {} < critical path {cp}",
        run.makespan_ms
    );
    assert!(
        run.makespan_ms <= seq * (1.0 + 1e-12),
        "{tag}: {} > sequential {seq}",
        run.makespan_ms
    );
    if lios.variant() == LiosVariant::Lios && streams == 1 {
        assert!(
            close(run.makespan_ms, seq),
            "{tag}: one stream is sequential"
        );
    }

    let schedule = Schedule::Streams(run.plan());
    let t = simulate(g, &lower(g, &schedule).unwrap(), cost).unwrap();
    assert!(
        close(t.makespan_ms, run.makespan_ms),
        "{tag}: simulated {} vs {}",
        t.makespan_ms,
        run.makespan_ms
    );
    for span in &t.ops {
        let st = run.step_of(span.op).unwrap();
        assert!(
            close(span.start_ms, st.start_ms) && close(span.end_ms, st.finish_ms),
            "{tag}: '{}' simulated {}..{} vs {}..{}",
            g.node(span.op).name,
            span.start_ms,
            span.end_ms,
            st.start_ms,
            st.finish_ms
        );
    }
}

fn dag_params() -> impl Strategy<Value = LayeredDagParams> {
    (1usize..=30, any::<u64>(), any::<u64>()).prop_flat_map(|(ops, pick, seed)| {
        (1usize..=ops).prop_map(move |layers| {
            let (lo, hi) = if layers == 1 {
                (0, 0)
            } else {
                let n = ops as i64;
                let l = layers as i64;
                let hi = (n * n - (l - 1) - (n - l + 1) * (n - l + 1)) / 2;
                (ops - 1, hi.max(ops as i64 - 1) as usize)
            };
            LayeredDagParams {
                ops,
                layers,
                edges: lo + (pick as usize) % (hi - lo + 1),
                seed,
                ..LayeredDagParams::default()
            }
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn every_variant_on_random_dags(p in dag_params(), streams in 1usize..=8, seed in any::<u64>()) {
        let g = layered_dag(&p).unwrap();
        let ideal = IdealModel::new(AnalyticalModel::default());
        for v in LiosVariant::ALL {
            check_ideal(&g, Lios::new(v, seed), streams, &ideal);
        }
    }
}

#[test]
fn every_variant_on_every_zoo_model() {
    let analytical = AnalyticalModel::default();
    let ideal = IdealModel::new(AnalyticalModel::default());
    for m in zoo::models() {
        let g = m.build(&ZooConfig::default()).unwrap();
        for v in LiosVariant::ALL {
            for streams in [1, 3, 8] {
                check(&g, Lios::new(v, 5), streams, &analytical);
                check_ideal(&g, Lios::new(v, 5), streams, &ideal);
            }
        }
    }
}

#[test]
fn lios_beats_sequential_on_branchy_models_under_the_ideal_model() {
    let ideal = IdealModel::new(AnalyticalModel::default());
    for name in ["inception_v3", "nasnet", "randwire", "googlenet"] {
        let g = zoo::build(name, &ZooConfig::default()).unwrap();
        let seq: f64 = g.ops().map(|v| ideal.op_time(&g, v)).sum();
        let run = Lios::heuristic().run(&g, 8, &ideal).unwrap();
        assert!(
            run.makespan_ms < seq,
            "{name}: {} vs sequential {seq}",
            run.makespan_ms
        );
    }
}
