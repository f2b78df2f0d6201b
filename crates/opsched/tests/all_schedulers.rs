//! Every registered scheduler, through the facade, on every zoo model and on 200 random DAGs:
//! the schedule validates, its simulated makespan is never below the proven lower bound, and
//! the exact searches (IOS) are never worse than sequential, which lies in their search space.

#![allow(clippy::unwrap_used)]

use opsched::cost::{AnalyticalModel, CostModel, DevicePreset, HiosSimLaw, LinkPreset};
use opsched::graph::random::{layered_dag, LayeredDagParams};
use opsched::schedule::Platform;
use opsched::zoo::ZooConfig;
use opsched::{Graph, SchedulerOptions};

fn platform(gpus: usize, streams: usize) -> Platform {
    Platform {
        gpus,
        streams,
        device: DevicePreset::by_name("h100").unwrap(),
        link: LinkPreset::by_name("nvlink4").unwrap(),
    }
}

/// Run every scheduler on `g` and check the contract; returns (name, makespan) pairs.
fn check_all(
    g: &Graph,
    p: &Platform,
    cost: &dyn CostModel,
    opts: &SchedulerOptions,
) -> Vec<(String, f64)> {
    let names = opsched::scheduler_names();
    let table = opsched::compare(
        g,
        &names,
        p,
        cost,
        opts,
        opsched::schedule::ExecMode::Graph,
        &opsched::schedule::NoProgress,
    )
    .unwrap_or_else(|e| panic!("{}: {e}", g.name));
    let bound = table.lower_bound.value();
    for r in &table.rows {
        assert!(
            r.makespan_ms >= bound * (1.0 - 1e-9) - 1e-12,
            "{} on {}: makespan {} below the lower bound {}",
            r.algo,
            g.name,
            r.makespan_ms,
            bound
        );
        if r.algo.starts_with("ios") && !r.algo.ends_with("merge") || r.algo == "iops" {
            assert!(
                r.makespan_ms <= table.sequential_ms * (1.0 + 1e-9),
                "{} on {} is worse than sequential: {} > {}",
                r.algo,
                g.name,
                r.makespan_ms,
                table.sequential_ms
            );
        }
    }
    table
        .rows
        .iter()
        .map(|r| (r.algo.clone(), r.makespan_ms))
        .collect()
}

#[test]
fn every_scheduler_on_every_zoo_model() {
    let p = platform(1, 8);
    let cost = AnalyticalModel::new(p.device.clone(), p.link.clone());
    // Debug builds are slow: the two largest DP searches get IOS's smaller pruning setting
    // (the paper's sweep includes r = 2, s = 3).
    let small = SchedulerOptions {
        ios_r: 2,
        ios_s: 3,
        ..SchedulerOptions::default()
    };
    for m in opsched::zoo::models() {
        let g = m.build(&ZooConfig::default()).unwrap();
        let opts = if matches!(m.name, "randwire" | "nasnet") && cfg!(debug_assertions) {
            small.clone()
        } else {
            SchedulerOptions::default()
        };
        let rows = check_all(&g, &p, &cost, &opts);
        assert_eq!(rows.len(), opsched::scheduler_names().len());
    }
}

#[test]
fn every_scheduler_on_200_random_dags_one_and_three_gpus() {
    for seed in 0..200u64 {
        // Up to 24 ops in layers of at most ~5: wide layers make the exact DPs exponential
        // (their state count grows with the graph's width), which a property test need not pay.
        let ops = 5 + (seed as usize * 7) % 20;
        let params = LayeredDagParams {
            ops,
            layers: 1 + ops / 5 + seed as usize % 3,
            edges: ops + (seed as usize % 3) * ops / 2,
            seed,
            ..LayeredDagParams::default()
        };
        let Ok(g) = layered_dag(&params) else {
            continue;
        };
        let gpus = if seed % 2 == 0 { 1 } else { 3 };
        let p = platform(gpus, 1 + seed as usize % 4);
        let cost = HiosSimLaw::new(AnalyticalModel::new(p.device.clone(), p.link.clone()));
        check_all(
            &g,
            &p,
            &cost,
            &SchedulerOptions {
                seed,
                ..SchedulerOptions::default()
            },
        );
    }
}

#[test]
fn every_scheduler_refuses_a_platform_without_gpus_or_streams() {
    let g = opsched::zoo::build("squeezenet", &ZooConfig::default()).unwrap();
    let cost = AnalyticalModel::new(
        DevicePreset::by_name("h100").unwrap(),
        LinkPreset::by_name("nvlink4").unwrap(),
    );
    for name in opsched::scheduler_names() {
        let s = opsched::scheduler(name).unwrap();
        for p in [platform(0, 8), platform(1, 0)] {
            let e = s.schedule(&g, &p, &cost).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("{name}: the platform needs at least one GPU")),
                "{name}: {e}"
            );
        }
    }
}

/// `best` is the fastest of its candidates under the cost model, in either execution mode, on
/// one GPU and on two (where HIOS's are candidates too): its makespan is the smallest the
/// comparison of the same algorithms finds, and the algorithm it names found it.
#[test]
fn best_is_the_fastest_of_its_candidates() {
    use opsched::schedule::{ExecMode, NoProgress};
    let cost = opsched::analytical_model(
        &DevicePreset::by_name("h100").unwrap(),
        &LinkPreset::by_name("nvlink4").unwrap(),
        &opsched::Calibration::Committed,
    )
    .unwrap();
    let opts = SchedulerOptions::default();
    for model in ["googlenet", "squeezenet", "inception_v3"] {
        let g = opsched::zoo::build(model, &ZooConfig::default()).unwrap();
        for (gpus, mode) in [
            (1, ExecMode::Graph),
            (1, ExecMode::Eager),
            (2, ExecMode::Graph),
        ] {
            let p = platform(gpus, 8);
            let best = opsched::best_schedule(&g, &p, &cost, &opts, mode).unwrap();
            let mut names = vec!["sequential"];
            names.extend(opsched::BEST_CANDIDATES);
            if gpus > 1 {
                names.extend(opsched::BEST_MULTI_GPU);
            }
            let table = opsched::compare(&g, &names, &p, &cost, &opts, mode, &NoProgress).unwrap();
            let fastest = table
                .rows
                .iter()
                .map(|r| r.makespan_ms)
                .fold(f64::INFINITY, f64::min);
            let what = format!("{model} on {gpus} GPU(s), {mode:?}");
            assert!(
                (best.makespan_ms - fastest).abs() <= 1e-9 * fastest,
                "{what}"
            );
            let named = table.rows.iter().find(|r| r.algo == best.algo).unwrap();
            assert!(
                (named.makespan_ms - best.makespan_ms).abs() <= 1e-9 * fastest,
                "{what}"
            );
            assert!((best.sequential_ms - table.sequential_ms).abs() <= 1e-9 * fastest);
            opsched::schedule::validate(&g, &best.schedule, &p).unwrap();
        }
    }
}
