//! Scheduling time and quality of IOS per zoo model (analytical V100 model, batch 1).
//!
//! `cargo run --release -p opsched-ios-dp --example ios_time [-- model ...] [-- --r 3 --s 8]`

use std::time::Instant;

use opsched_cost::{AnalyticalModel, CostModel, DevicePreset, LinkPreset};
use opsched_graph::zoo::{self, ZooConfig};
use opsched_ios_dp::{Ios, IosOptions, IosVariant};
use opsched_schedule::{lower, lower_bound, simulate, validate, Platform, Scheduler};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut models: Vec<String> = Vec::new();
    let mut opts = IosOptions::default();
    let mut variants = vec![IosVariant::Both];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--r" => opts.r = args.next().ok_or("--r needs a value")?.parse()?,
            "--s" => opts.s = args.next().ok_or("--s needs a value")?.parse()?,
            "--part" => opts.part = args.next().ok_or("--part needs a value")?.parse()?,
            "--all-variants" => {
                variants = vec![IosVariant::Both, IosVariant::Parallel, IosVariant::Merge]
            }
            _ => models.push(a),
        }
    }
    if models.is_empty() {
        models = ["inception_v3", "randwire", "nasnet", "squeezenet"]
            .map(String::from)
            .to_vec();
    }
    let device = DevicePreset::by_name("v100")?;
    let link = LinkPreset::by_name("nvlink2")?;
    let cost = AnalyticalModel::new(device.clone(), link.clone());
    let platform = Platform {
        gpus: 1,
        streams: 8,
        device,
        link,
    };
    println!(
        "{:<14} {:<13} {:>9} {:>9} {:>11} {:>8} {:>7} {:>10} {:>10} {:>10} {:>8} {:>8}",
        "model",
        "variant",
        "time_ms",
        "states",
        "transitions",
        "queries",
        "stages",
        "seq_ms",
        "dp_ms",
        "sim_ms",
        "speedup",
        "lb_ms"
    );
    for name in &models {
        let g = zoo::build(name, &ZooConfig::default())?;
        let seq: f64 = g.ops().map(|o| cost.op_time(&g, o)).sum();
        let lb = lower_bound(&g, &cost, 1).value();
        for &variant in &variants {
            let ios = Ios::new(IosOptions { variant, ..opts });
            let t = Instant::now();
            let (s, stats) = ios.schedule(&g, &platform, &cost)?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            validate(&g, &s, &platform)?;
            let sim = simulate(&g, &lower(&g, &s)?, &cost)?.makespan_ms;
            let dp = stats
                .extra
                .get("objective_ms")
                .and_then(|v| v.as_f64())
                .unwrap_or(f64::NAN);
            let nstages = stats
                .extra
                .get("stages")
                .and_then(|v| v.as_u64())
                .unwrap_or(0);
            println!(
                "{:<14} {:<13} {:>9.1} {:>9} {:>11} {:>8} {:>7} {:>10.4} {:>10.4} {:>10.4} {:>7.3}x {:>8.4}",
                name,
                variant.name(),
                ms,
                stats.states,
                stats.transitions,
                stats.cost_queries,
                nstages,
                seq,
                dp,
                sim,
                seq / dp,
                lb
            );
        }
    }
    Ok(())
}
