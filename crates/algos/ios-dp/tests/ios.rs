//! IOS on the zoo and on small random DAGs: every operator once, dependencies respected, the
//! DP objective equal to the simulated makespan and never above the sequential sum, and the
//! DP's optimum equal to a brute force over all stage sequences.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use opsched_cost::{AnalyticalModel, CostModel, DevicePreset, HiosSimLaw, IdealModel, LinkPreset};
use opsched_graph::random::{layered_dag, LayeredDagParams};
use opsched_graph::zoo::{self, ZooConfig};
use opsched_graph::{DType, Graph, NodeDef, NodeId, Op, Value};
use opsched_ios_dp::{Ios, IosBudget, IosOptions, IosSolution, IosVariant};
use opsched_schedule::{
    lower, simulate, validate, Platform, Schedule, Scheduler, Stage, StageStrategy,
};
use proptest::prelude::*;

fn v100() -> (AnalyticalModel, Platform) {
    let device = DevicePreset::by_name("v100").unwrap();
    let link = LinkPreset::by_name("nvlink2").unwrap();
    (
        AnalyticalModel::new(device.clone(), link.clone()),
        Platform {
            gpus: 1,
            streams: 8,
            device,
            link,
        },
    )
}

fn ios(r: usize, s: usize, variant: IosVariant) -> Ios {
    Ios::new(IosOptions {
        r,
        s,
        variant,
        ..IosOptions::default()
    })
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// Our own checks: every operator exactly once, no input, dependencies go to strictly later
/// stages (or earlier in the same group), group and stage limits, merge stages mergeable.
fn check_stages(g: &Graph, stages: &[Stage], r: usize, s: usize) {
    let mut at: HashMap<NodeId, (usize, usize, usize)> = HashMap::new();
    for (si, st) in stages.iter().enumerate() {
        assert!(!st.groups.is_empty(), "{}: empty stage {si}", g.name);
        match st.strategy {
            StageStrategy::Concurrent => {
                assert!(st.groups.len() <= s, "{}: stage {si} too wide", g.name);
                for grp in &st.groups {
                    assert!(!grp.is_empty() && grp.len() <= r, "{}: group size", g.name);
                }
            }
            StageStrategy::Merge => {
                let ops: Vec<NodeId> = st.ops().collect();
                assert!(
                    opsched_graph::merge::mergeable(g, &ops),
                    "{}: unmergeable merge stage {si}",
                    g.name
                );
            }
        }
        for (gi, grp) in st.groups.iter().enumerate() {
            for (k, &o) in grp.iter().enumerate() {
                assert!(!g.node(o).op.is_input(), "{}: input scheduled", g.name);
                assert!(
                    at.insert(o, (si, gi, k)).is_none(),
                    "{}: '{}' twice",
                    g.name,
                    g.node(o).name
                );
            }
        }
    }
    assert_eq!(at.len(), g.op_count(), "{}: every op once", g.name);
    for (u, v, _) in g.edges() {
        let (Some(&(su, gu, ku)), Some(&(sv, gv, kv))) = (at.get(&u), at.get(&v)) else {
            continue;
        };
        let merge_v = stages[sv].strategy == StageStrategy::Merge;
        let ok = su < sv || (su == sv && gu == gv && ku < kv && !merge_v);
        assert!(
            ok,
            "{}: '{}' -> '{}' not respected",
            g.name,
            g.node(u).name,
            g.node(v).name
        );
    }
}

fn sequential_sum(g: &Graph, cost: &dyn CostModel) -> f64 {
    g.ops().map(|o| cost.stage_time(g, &[vec![o]])).sum()
}

fn simulated(g: &Graph, stages: &[Stage], cost: &dyn CostModel) -> f64 {
    let s = Schedule::Stages(opsched_schedule::StagePlan {
        gpus: vec![stages.to_vec()],
    });
    simulate(g, &lower(g, &s).unwrap(), cost)
        .unwrap()
        .makespan_ms
}

fn solve(ios: &Ios, g: &Graph, p: &Platform, cost: &dyn CostModel) -> IosSolution {
    let sol = ios.solve(g, p, cost).unwrap();
    check_stages(g, &sol.stages, ios.opts.r, ios.opts.s.min(p.streams));
    let s = Schedule::Stages(opsched_schedule::StagePlan {
        gpus: vec![sol.stages.clone()],
    });
    validate(g, &s, p).unwrap();
    sol
}

#[test]
fn zoo_models_valid_exact_and_not_worse_than_sequential() {
    let (cost, p) = v100();
    for m in zoo::models() {
        let g = m.build(&ZooConfig::default()).unwrap();
        // The widest models get smaller limits in debug builds to keep the suite quick.
        let (r, s) = if cfg!(debug_assertions) && matches!(m.name, "randwire" | "nasnet") {
            (2, 4)
        } else {
            (3, 8)
        };
        let sol = solve(&ios(r, s, IosVariant::Both), &g, &p, &cost);
        let seq = sequential_sum(&g, &cost);
        let sim = simulated(&g, &sol.stages, &cost);
        assert!(
            sol.objective_ms <= seq * (1.0 + 1e-12),
            "{}: {} > sequential {seq}",
            m.name,
            sol.objective_ms
        );
        assert!(
            close(sim, sol.objective_ms),
            "{}: simulated {sim} != objective {}",
            m.name,
            sol.objective_ms
        );
        assert!(sol.stats.states > 0 && sol.stats.cost_queries > 0);
        assert_eq!(sol.stats.extra["variant"], "ios");
    }
}

#[test]
fn r1_s1_is_the_sequential_sum() {
    let (cost, p) = v100();
    for m in zoo::models() {
        let g = m.build(&ZooConfig::default()).unwrap();
        let sol = solve(&ios(1, 1, IosVariant::Parallel), &g, &p, &cost);
        assert_eq!(sol.stages.len(), g.op_count(), "{}", m.name);
        let seq = sequential_sum(&g, &cost);
        assert!(close(sol.objective_ms, seq), "{}", m.name);
        // Merging may only help.
        let both = solve(&ios(1, 1, IosVariant::Both), &g, &p, &cost);
        assert!(both.objective_ms <= seq * (1.0 + 1e-12), "{}", m.name);
    }
}

#[test]
fn scheduler_names_and_trait_path() {
    let (cost, p) = v100();
    let g = zoo::build("squeezenet", &ZooConfig::default()).unwrap();
    for (v, name) in [
        (IosVariant::Both, "ios"),
        (IosVariant::Parallel, "ios-parallel"),
        (IosVariant::Merge, "ios-merge"),
    ] {
        let sched = Ios::with_variant(v);
        assert_eq!(sched.name(), name);
        assert_eq!(IosVariant::from_name(name), Some(v));
        assert_eq!(IosVariant::from_name(&name.to_uppercase()), None);
        let (s, stats) = sched.schedule(&g, &p, &cost).unwrap();
        validate(&g, &s, &p).unwrap();
        assert!(stats.wall_ms >= 0.0);
        let Schedule::Stages(plan) = s else {
            panic!("IOS gives a stage plan")
        };
        assert_eq!(plan.gpus.len(), 1);
    }
}

#[test]
fn inception_merge_variant_merges_a1_one_by_one_convs() {
    let (cost, p) = v100();
    let g = zoo::build("inception_v3", &ZooConfig::default()).unwrap();
    let seq = sequential_sum(&g, &cost);
    let merge = solve(&Ios::with_variant(IosVariant::Merge), &g, &p, &cost);
    let merges: Vec<&Stage> = merge
        .stages
        .iter()
        .filter(|st| st.strategy == StageStrategy::Merge)
        .collect();
    assert!(!merges.is_empty());
    let a1 = ["a1.branch1x1", "a1.branch5x5_1", "a1.branch3x3dbl_1"].map(|n| g.find(n).unwrap());
    assert!(
        merges
            .iter()
            .any(|st| st.ops().filter(|o| a1.contains(o)).count() >= 2),
        "no merge of a1's 1x1 convolutions"
    );
    assert!(merge.objective_ms <= seq * (1.0 + 1e-12));
    assert!(close(
        simulated(&g, &merge.stages, &cost),
        merge.objective_ms
    ));
    // Every stage of ios-merge is a merge or a single operator.
    for st in &merge.stages {
        assert!(st.strategy == StageStrategy::Merge || st.ops().count() == 1);
    }
    // The full search space contains both restricted ones.
    let par = solve(&Ios::with_variant(IosVariant::Parallel), &g, &p, &cost);
    let both = solve(&Ios::with_variant(IosVariant::Both), &g, &p, &cost);
    assert!(both.objective_ms <= par.objective_ms * (1.0 + 1e-12));
    assert!(both.objective_ms <= merge.objective_ms * (1.0 + 1e-12));
}

#[test]
fn streams_cap_the_groups_per_stage() {
    let (cost, mut p) = v100();
    p.streams = 2;
    let g = zoo::build("inception_v3", &ZooConfig::default()).unwrap();
    let sol = solve(&Ios::default(), &g, &p, &cost);
    assert!(sol
        .stages
        .iter()
        .all(|st| st.strategy == StageStrategy::Merge || st.groups.len() <= 2));
    assert_eq!(sol.stats.extra["s"], 2);
}

#[test]
fn bad_options_and_platforms_are_refused() {
    let (cost, mut p) = v100();
    let g = zoo::build("squeezenet", &ZooConfig::default()).unwrap();
    assert!(ios(0, 8, IosVariant::Both).solve(&g, &p, &cost).is_err());
    assert!(ios(3, 0, IosVariant::Both).solve(&g, &p, &cost).is_err());
    let big = Ios::new(IosOptions {
        part: 129,
        ..IosOptions::default()
    });
    assert!(big.solve(&g, &p, &cost).is_err());
    p.gpus = 0;
    assert!(Ios::default().solve(&g, &p, &cost).is_err());
}

/// `n` mutually independent abstract operators (the DP's worst case: every subset is a state).
fn independent(n: usize) -> Graph {
    let defs = (0..n)
        .map(|i| NodeDef {
            name: format!("op{i}"),
            op: Op::Abstract {
                time_ms: 0.5 + (i % 7) as f64 * 0.1,
                util: 0.2 + (i % 5) as f64 * 0.1,
            },
            inputs: vec![],
            declared_shape: None,
        })
        .collect();
    Graph::from_nodes("independent", DType::F32, defs).unwrap()
}

fn with_budget(budget: IosBudget) -> Ios {
    Ios::new(IosOptions {
        budget,
        ..IosOptions::default()
    })
}

#[test]
fn a_budget_of_exactly_the_search_changes_nothing_and_one_less_falls_back() {
    let (cost, p) = v100();
    let g = zoo::build("inception_v3", &ZooConfig::default()).unwrap();
    let full = solve(&Ios::default(), &g, &p, &cost);
    assert_eq!(full.stats.extra["budget_exhausted"], false);
    // The budget counts every ending enumerated (`budget_spent`), `transitions` the valid ones.
    let t = full.stats.extra["budget_spent"].as_u64().unwrap();
    assert!(t >= full.stats.transitions);
    let exact = solve(&with_budget(IosBudget::Transitions(t)), &g, &p, &cost);
    assert_eq!(exact.stages, full.stages);
    assert_eq!(exact.stats.extra["budget_exhausted"], false);
    let short = solve(&with_budget(IosBudget::Transitions(t - 1)), &g, &p, &cost);
    assert_eq!(short.stats.extra["budget_exhausted"], true);
    // Only the last part ran out: the parts before keep the DP's stages.
    assert_eq!(short.stats.extra["fallback_parts"], 1);
    assert!(short.objective_ms >= full.objective_ms);
    assert!(close(
        simulated(&g, &short.stages, &cost),
        short.objective_ms
    ));
}

#[test]
fn wide_parts_stop_at_the_budget_with_a_valid_schedule() {
    let (_, p) = v100();
    let cost = HiosSimLaw::new(AnalyticalModel::default());
    // 50 independent operators: 2^50 states; without the budget this never ends.
    let g = independent(50);
    let start = std::time::Instant::now();
    let sol = solve(&with_budget(IosBudget::Transitions(200_000)), &g, &p, &cost);
    assert!(start.elapsed().as_secs() < 20);
    assert_eq!(sol.stats.extra["budget_exhausted"], true);
    assert_eq!(sol.stats.extra["fallback_ops"], 50);
    // Waves of at most s = 8 ready operators.
    assert_eq!(sol.stages.len(), 7);
    assert!(sol.objective_ms <= sequential_sum(&g, &cost) * (1.0 + 1e-12));
    // A time budget ends too.
    let start = std::time::Instant::now();
    let timed = solve(
        &with_budget(IosBudget::Time(std::time::Duration::from_millis(200))),
        &g,
        &p,
        &cost,
    );
    assert!(start.elapsed().as_secs() < 20);
    assert_eq!(timed.stats.extra["budget_exhausted"], true);
}

#[test]
fn budgets_parse_from_counts_and_times() {
    use std::time::Duration;
    assert_eq!("2000".parse(), Ok(IosBudget::Transitions(2000)));
    assert_eq!("1_000_000".parse(), Ok(IosBudget::Transitions(1_000_000)));
    assert_eq!("30s".parse(), Ok(IosBudget::Time(Duration::from_secs(30))));
    assert_eq!(
        "250ms".parse(),
        Ok(IosBudget::Time(Duration::from_millis(250)))
    );
    for bad in ["0", "-5", "s", "0s", "inf s", "NaNs", "1e9s", "ten", ""] {
        let e = bad.parse::<IosBudget>().unwrap_err();
        assert!(e.contains(&format!("'{bad}'")), "{e}");
    }
    // Display round-trips (the CLI shows the default that way).
    for b in [
        IosBudget::default(),
        IosBudget::Time(Duration::from_millis(1500)),
    ] {
        assert_eq!(b.to_string().parse(), Ok(b));
    }
    assert_eq!(IosBudget::default().to_string(), "10000000 transitions");
}

#[test]
fn parts_of_more_than_64_operators_use_wide_bitsets() {
    let (_, p) = v100();
    let cost = IdealModel::new(AnalyticalModel::default());
    // A ladder of two chains of 50 abstract operators, cross-linked: 100 operators, width 2.
    let mut defs = Vec::new();
    for i in 0..100usize {
        let inputs = if i < 2 {
            vec![]
        } else {
            let base = (i / 2 - 1) * 2;
            vec![
                vec![Value::whole(NodeId(base as u32))],
                vec![Value::whole(NodeId(base as u32 + 1))],
            ]
        };
        defs.push(NodeDef {
            name: format!("op{i}"),
            op: Op::Abstract {
                time_ms: 0.1 + (i % 7) as f64 * 0.3,
                util: 0.5 + (i % 5) as f64 * 0.1,
            },
            inputs,
            declared_shape: None,
        });
    }
    let g = Graph::from_nodes("ladder", DType::F32, defs).unwrap();
    let wide = Ios::new(IosOptions {
        part: 100,
        ..IosOptions::default()
    });
    let sol = solve(&wide, &g, &p, &cost);
    assert_eq!(sol.stats.extra["parts"], 1);
    assert_eq!(sol.stats.extra["largest_part"], 100);
    assert!(sol.objective_ms <= sequential_sum(&g, &cost) * (1.0 + 1e-12));
    assert!(close(simulated(&g, &sol.stages, &cost), sol.objective_ms));
    // Splitting into parts can only restrict the search.
    let split = solve(&Ios::default(), &g, &p, &cost);
    assert_eq!(split.stats.extra["parts"], 2);
    assert!(sol.objective_ms <= split.objective_ms * (1.0 + 1e-12));
}

#[test]
fn nasnet_parts_follow_cells_and_repeated_stages_are_costed_once() {
    let (cost, p) = v100();
    let g = zoo::build("nasnet", &ZooConfig::default()).unwrap();
    let sol = solve(&ios(2, 3, IosVariant::Both), &g, &p, &cost);
    assert!(sol.stats.extra["parts"].as_u64().unwrap() >= g.blocks().len() as u64);
    assert!(sol.stats.extra["stage_cache_hits"].as_u64().unwrap() > 0);
}

// ---------------------------------------------------------------------------------------------
// Brute force over all stage sequences.

/// The optimum over every sequence of stages (forward: from the set `done` of scheduled ops,
/// any non-empty set E of ready ops whose groups — one per minimal element h of E, holding h
/// and its descendants in E — are pairwise disjoint, at most `s`, each of at most `r` ops).
fn brute_force(g: &Graph, cost: &dyn CostModel, r: usize, s: usize) -> f64 {
    let ops: Vec<NodeId> = g.ops().collect();
    let n = ops.len();
    assert!(n <= 16);
    let idx: HashMap<NodeId, usize> = ops.iter().enumerate().map(|(i, &o)| (o, i)).collect();
    let mut preds = vec![0u32; n];
    for (u, v, _) in g.edges() {
        if let (Some(&a), Some(&b)) = (idx.get(&u), idx.get(&v)) {
            preds[b] |= 1 << a;
        }
    }
    // Descendants (ops are in topological order).
    let mut desc = vec![0u32; n];
    for i in (0..n).rev() {
        for j in i + 1..n {
            if preds[j] & (1 << i) != 0 {
                desc[i] |= desc[j] | (1 << j);
            }
        }
    }
    let all = (1u32 << n) - 1;
    let mut memo: HashMap<u32, f64> = HashMap::new();
    fn go(
        done: u32,
        all: u32,
        ctx: &(Vec<u32>, Vec<u32>, Vec<NodeId>, usize, usize),
        g: &Graph,
        cost: &dyn CostModel,
        memo: &mut HashMap<u32, f64>,
    ) -> f64 {
        if done == all {
            return 0.0;
        }
        if let Some(&c) = memo.get(&done) {
            return c;
        }
        let (preds, desc, ops, r, s) = ctx;
        let rest = all & !done;
        let mut best = f64::INFINITY;
        let mut e = rest;
        while e != 0 {
            let ready = (0..ops.len())
                .filter(|&i| e & (1 << i) != 0)
                .all(|i| preds[i] & !(done | e) == 0);
            if ready {
                let heads: Vec<usize> = (0..ops.len())
                    .filter(|&i| e & (1 << i) != 0 && preds[i] & e == 0)
                    .collect();
                let groups: Vec<u32> = heads.iter().map(|&h| (desc[h] & e) | (1 << h)).collect();
                let disjoint = groups
                    .iter()
                    .enumerate()
                    .all(|(a, &ga)| groups[a + 1..].iter().all(|&gb| ga & gb == 0));
                let sizes_ok = groups.iter().all(|gr| gr.count_ones() as usize <= *r);
                if disjoint && sizes_ok && groups.len() <= *s {
                    let stage: Vec<Vec<NodeId>> = groups
                        .iter()
                        .map(|&gr| {
                            (0..ops.len())
                                .filter(|&i| gr & (1 << i) != 0)
                                .map(|i| ops[i])
                                .collect()
                        })
                        .collect();
                    let c = cost.stage_time(g, &stage)
                        + cost.overheads().fork_join_ms(stage.len())
                        + go(done | e, all, ctx, g, cost, memo);
                    best = best.min(c);
                }
            }
            e = (e - 1) & rest;
        }
        memo.insert(done, best);
        best
    }
    let ctx = (preds, desc, ops, r, s);
    go(0, all, &ctx, g, cost, &mut memo)
}

/// A random layered DAG with `ops - 1 + extra` edges, or fewer extra edges when the layer
/// sizes the seed draws cannot hold that many (`ops - 1` always fit).
fn small_dag(seed: u64, ops: usize, layers: usize, extra: usize) -> Graph {
    (0..=extra)
        .rev()
        .find_map(|x| {
            layered_dag(&LayeredDagParams {
                ops,
                layers,
                edges: ops - 1 + x,
                seed,
                ..LayeredDagParams::default()
            })
            .ok()
        })
        .expect("ops - 1 edges always fit")
}

fn compare_with_brute_force(g: &Graph, cost: &dyn CostModel, r: usize, s: usize) {
    let (_, p) = v100();
    for variant in [IosVariant::Both, IosVariant::Parallel] {
        let sol = solve(&ios(r, s, variant), g, &p, cost);
        let bf = brute_force(g, cost, r, s);
        assert!(
            close(sol.objective_ms, bf),
            "seed graph {}: r={r} s={s} {variant:?}: DP {} vs brute force {bf}",
            g.name,
            sol.objective_ms
        );
        assert!(close(simulated(g, &sol.stages, cost), sol.objective_ms));
    }
}

#[test]
fn brute_force_agrees_on_a_fixed_dag() {
    let g = small_dag(1, 12, 4, 4);
    let hios = HiosSimLaw::new(AnalyticalModel::default());
    for (r, s) in [(1, 1), (2, 2), (3, 8), (3, 3)] {
        compare_with_brute_force(&g, &hios, r, s);
    }
}

/// Under a calibrated model a concurrent stage also pays its fork and join: the DP's
/// objective is still the brute force's optimum of the same stage prices, and a stage of
/// several groups costs more than its groups' times by exactly that.
#[test]
fn brute_force_agrees_with_fork_and_join_priced() {
    let (_, p) = v100();
    let file = opsched_cost::DeviceFile::embedded("h100").unwrap();
    let cost = AnalyticalModel::calibrated(
        DevicePreset::by_name("h100").unwrap(),
        LinkPreset::by_name("nvlink4").unwrap(),
        file,
    );
    assert!(cost.overheads().fork_join_ms(2) > 0.0);
    // Kernels of a few microseconds that fill little of the GPU: running side by side pays
    // for some of them, and the stage's events are not negligible against them.
    let g = layered_dag(&LayeredDagParams {
        ops: 12,
        layers: 4,
        edges: 14,
        time_ms: (0.002, 0.02),
        util: (0.05, 0.3),
        seed: 3,
        ..LayeredDagParams::default()
    })
    .unwrap();
    let mut concurrent = 0;
    for (r, s) in [(1, 1), (2, 2), (3, 8), (3, 3)] {
        for variant in [IosVariant::Both, IosVariant::Parallel] {
            let sol = solve(&ios(r, s, variant), &g, &p, &cost);
            let bf = brute_force(&g, &cost, r, s);
            assert!(
                close(sol.objective_ms, bf),
                "r={r} s={s}: DP {} vs {bf}",
                sol.objective_ms
            );
            let priced: f64 = sol
                .stages
                .iter()
                .map(|st| {
                    cost.stage_time(&g, &st.groups) + cost.overheads().fork_join_ms(st.groups.len())
                })
                .sum();
            assert!(close(priced, sol.objective_ms), "r={r} s={s}");
            concurrent += sol.stages.iter().filter(|st| st.groups.len() > 1).count();
        }
    }
    assert!(
        concurrent > 0,
        "no stage ran groups side by side: nothing was priced"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn dp_equals_brute_force_on_random_dags(
        seed in 0u64..1_000_000,
        ops in 10usize..=13,
        layers in 2usize..=5,
        extra in 0usize..=6,
        r in 1usize..=3,
        s in 1usize..=4,
        ideal in any::<bool>(),
    ) {
        let g = small_dag(seed, ops, layers, extra);
        let base = AnalyticalModel::default();
        if ideal {
            compare_with_brute_force(&g, &IdealModel::new(base), r, s);
        } else {
            compare_with_brute_force(&g, &HiosSimLaw::new(base), r, s);
        }
    }
}
