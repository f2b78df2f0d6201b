//! Scheduling time and quality of IOPS on every zoo model (analytical V100 model with NVLink 2,
//! batch 1): `cargo run --release -p opsched-iops --example iops_time`.
//!
//! Prints, per model: operators, blocks, template hits, merge and concurrent stages, the wall
//! time of one `Scheduler::schedule` call (median of a few runs), IOPS's objective (the sum of
//! its stage times), the sequential sum of operator times and the speedup over it.

use std::time::Instant;

use opsched_cost::{AnalyticalModel, CostModel, DevicePreset, LinkPreset};
use opsched_graph::zoo::{self, ZooConfig};
use opsched_iops::Iops;
use opsched_schedule::Platform;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = DevicePreset::by_name("v100")?;
    let link = LinkPreset::by_name("nvlink2")?;
    let cost = AnalyticalModel::new(device.clone(), link.clone());
    let platform = Platform {
        gpus: 1,
        streams: 8,
        device,
        link,
    };
    let iops = Iops::default();
    println!(
        "{:<13} {:>4} {:>6} {:>5} {:>6} {:>6} {:>10} {:>11} {:>10} {:>8}",
        "model",
        "ops",
        "blocks",
        "hits",
        "merge",
        "conc",
        "time ms",
        "iops ms",
        "seq ms",
        "speedup"
    );
    for m in zoo::models() {
        let g = m.build(&ZooConfig::default())?;
        let seq: f64 = g.ops().map(|v| cost.op_time(&g, v)).sum();
        let reps = 5;
        let mut times = Vec::with_capacity(reps);
        let mut last = None;
        for _ in 0..reps {
            let t = Instant::now();
            let r = iops.run(&g, &platform, &cost)?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
            last = Some(r);
        }
        let Some(r) = last else { continue };
        times.sort_by(f64::total_cmp);
        let get = |k: &str| r.stats.extra.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
        println!(
            "{:<13} {:>4} {:>6} {:>5} {:>6} {:>6} {:>10.2} {:>11.4} {:>10.4} {:>7.3}x",
            m.name,
            g.op_count(),
            get("blocks"),
            get("template_hits"),
            get("merge_stages"),
            get("concurrent_stages"),
            times[reps / 2],
            r.objective_ms,
            seq,
            seq / r.objective_ms
        );
    }
    Ok(())
}
