//! Scheduling time and makespans of the HIOS variants on the paper's default instance
//! (200 ops, 14 layers, 400 edges, p = 0.8, seed 0) on 4 GPUs under the hios-sim law.
//!
//! `cargo run --release -p opsched-hios --example hios_time`

use std::time::Instant;

use opsched_cost::{AnalyticalModel, CostModel, DevicePreset, HiosSimLaw, LinkPreset};
use opsched_graph::random::{layered_dag, LayeredDagParams};
use opsched_hios::{HiosLp, HiosMr, HiosOptions};
use opsched_schedule::{lower, simulate, Platform, Scheduler};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let g = layered_dag(&LayeredDagParams::default())?;
    let cost = HiosSimLaw::new(AnalyticalModel::default());
    let (Some(device), Some(link)) = (DevicePreset::all().first(), LinkPreset::all().first())
    else {
        return Err("no device or link presets".into());
    };
    let platform = Platform {
        gpus: 4,
        streams: 8,
        device: device.clone(),
        link: link.clone(),
    };
    let sequential: f64 = g.ops().map(|o| cost.op_time(&g, o)).sum();
    println!(
        "instance   {} ({} ops, {} edges)",
        g.name,
        g.op_count(),
        g.edge_count()
    );
    let lb = opsched_schedule::lower_bound(&g, &cost, platform.gpus);
    println!("sequential {sequential:.3} ms");
    println!(
        "lower bound {:.3} ms (critical path {:.3} ms, capacity {:.3} ms)",
        lb.value(),
        lb.critical_path_ms,
        lb.capacity_ms
    );
    let algos: Vec<Box<dyn Scheduler>> = vec![
        Box::new(HiosLp::new(HiosOptions::default())),
        Box::new(HiosLp::new(HiosOptions::inter_only())),
        Box::new(HiosLp::always_longest_path(HiosOptions::default())),
        Box::new(HiosMr::new(HiosOptions::default())),
        Box::new(HiosMr::new(HiosOptions::inter_only())),
    ];
    for (i, algo) in algos.iter().enumerate() {
        // Warm up once, then take the best of 5 runs.
        let mut best = f64::INFINITY;
        let mut last = None;
        for _ in 0..6 {
            let t = Instant::now();
            let out = algo.schedule(&g, &platform, &cost)?;
            best = best.min(t.elapsed().as_secs_f64() * 1e3);
            last = Some(out);
        }
        let Some((s, stats)) = last else { continue };
        let sim = simulate(&g, &lower(&g, &s)?, &cost)?.makespan_ms;
        let label = if i == 2 {
            format!("{} (always longest path)", algo.name())
        } else {
            algo.name().to_string()
        };
        println!(
            "{label:<34} time {best:8.3} ms  makespan {sim:8.3} ms  speedup {:.3}x  \
             (internal {:.3} ms, {} evaluations)",
            sequential / sim,
            stats
                .extra
                .get("makespan_ms")
                .and_then(|v| v.as_f64())
                .unwrap_or(f64::NAN),
            stats
                .extra
                .get("evaluations")
                .and_then(|v| v.as_u64())
                .unwrap_or(0),
        );
    }
    Ok(())
}
