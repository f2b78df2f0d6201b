//! Opara's scheduling time, stream count and simulated speedup per zoo model.
//!
//! `cargo run --release -p opsched-opara --example opara_time [device] [streams]`
//! (defaults: h100, 8 streams; 0 streams means no cap). Times are the best of 50 runs: `total`
//! is the whole `Scheduler::schedule` call (cost-model questions included), `alg` the launch
//! order plus the stream allocation on precomputed demands (what the paper's Table I times).
//! The speedup is the sequential sum of operator times over the simulated makespan under the
//! analytical model of the device.

use std::time::Instant;

use opsched_cost::{AnalyticalModel, CostModel, DevicePreset, LinkPreset};
use opsched_graph::zoo::{models, ZooConfig};
use opsched_opara::{allocate_streams, demand_scalar, launch_order, OpClass, Opara};
use opsched_schedule::{lower, lower_bound, simulate, Platform, Schedule, Scheduler};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let device = DevicePreset::by_name(args.get(1).map_or("h100", String::as_str))?;
    let cap: usize = args.get(2).map_or(Ok(8), |s| s.parse())?;
    let link = LinkPreset::by_name("nvlink4")?;
    let cost = AnalyticalModel::new(device.clone(), link.clone());
    let platform = Platform {
        gpus: 1,
        streams: if cap == 0 { usize::MAX } else { cap },
        device: device.clone(),
        link,
    };
    println!(
        "device {}, {} streams, cost {}",
        device.name,
        if cap == 0 {
            "unlimited".to_string()
        } else {
            cap.to_string()
        },
        cost.name()
    );
    println!(
        "{:<13} {:>4} {:>9} {:>9} {:>7} {:>6} {:>5} {:>10} {:>10} {:>8} {:>8}",
        "model",
        "ops",
        "total_ms",
        "alg_ms",
        "streams",
        "events",
        "mem",
        "seq_ms",
        "opara_ms",
        "speedup",
        "vs_lb"
    );
    for spec in models() {
        let g = spec.build(&ZooConfig::default())?;
        let mut best_total = f64::INFINITY;
        let mut result = None;
        for _ in 0..50 {
            let t = Instant::now();
            let r = Opara.schedule(&g, &platform, &cost)?;
            best_total = best_total.min(t.elapsed().as_secs_f64() * 1e3);
            result = Some(r);
        }
        let Some((schedule, stats)) = result else {
            continue;
        };
        // The algorithm alone, on precomputed demands and times.
        let n = g.len();
        let mut class = vec![OpClass::Compute; n];
        let mut demand = vec![0.0; n];
        let mut time = vec![0.0; n];
        for v in g.ops() {
            let d = cost.demand(&g, v);
            class[v.index()] = OpClass::of(&d);
            demand[v.index()] = demand_scalar(&d, &device);
            time[v.index()] = cost.op_time(&g, v);
        }
        let mut best_alg = f64::INFINITY;
        for _ in 0..50 {
            let t = Instant::now();
            let order = launch_order(&g, &class, &demand);
            let a = allocate_streams(&g, &order, platform.streams, &time);
            std::hint::black_box(&a);
            best_alg = best_alg.min(t.elapsed().as_secs_f64() * 1e3);
        }
        let streams = match &schedule {
            Schedule::Streams(p) => p.gpus.first().map_or(0, |gs| gs.streams.len()),
            Schedule::Stages(_) => 0,
        };
        let plan = lower(&g, &schedule)?;
        let tl = simulate(&g, &plan, &cost)?;
        let seq: f64 = g.ops().map(|v| cost.op_time(&g, v)).sum();
        let lb = lower_bound(&g, &cost, 1).value();
        println!(
            "{:<13} {:>4} {:>9.3} {:>9.3} {:>7} {:>6} {:>5} {:>10.4} {:>10.4} {:>7.3}x {:>7.3}x",
            spec.name,
            g.op_count(),
            best_total,
            best_alg,
            streams,
            plan.events,
            stats
                .extra
                .get("memory_ops")
                .and_then(|v| v.as_u64())
                .unwrap_or(0),
            seq,
            tl.makespan_ms,
            seq / tl.makespan_ms,
            tl.makespan_ms / lb
        );
    }
    Ok(())
}
