//! Scheduling time of LIOS on every zoo model (analytical H100 model, 8 streams, batch 1, as
//! in the paper's setup): `cargo run --release -p opsched-lios --example lios_time`.
//!
//! Prints, per model, the median and minimum wall time of one `Scheduler::schedule` call
//! (cost queries included) over repeated runs; LIOS's own makespan (its list-scheduling
//! estimate: streams never slow each other down), the makespan the simulator gives the plan
//! under the analytical model (with contention), the critical path and the sequential sum.

use std::time::Instant;

use opsched_cost::{device, AnalyticalModel, CostModel};
use opsched_graph::zoo::{self, ZooConfig};
use opsched_lios::{Lios, LiosVariant};
use opsched_schedule::bounds::critical_path;
use opsched_schedule::{lower, simulate, Platform, Scheduler};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cost = AnalyticalModel::default();
    let platform = Platform {
        gpus: 1,
        streams: 8,
        device: device::H100,
        link: device::NVLINK4,
    };
    println!(
        "{:<14} {:>5} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "model", "ops", "variant", "median ms", "min ms", "lios ms", "sim ms", "crit ms", "seq ms"
    );
    for m in zoo::models() {
        let g = m.build(&ZooConfig::default())?;
        let seq: f64 = g.ops().map(|v| cost.op_time(&g, v)).sum();
        let cp = critical_path(&g, &cost);
        for v in LiosVariant::ALL {
            let lios = Lios::new(v, 1);
            let reps = 200;
            let mut times = Vec::with_capacity(reps);
            for _ in 0..reps {
                let t = Instant::now();
                let (s, _) = lios.schedule(&g, &platform, &cost)?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
                std::hint::black_box(s);
            }
            let (s, _) = lios.schedule(&g, &platform, &cost)?;
            let own = lios.run(&g, platform.streams, &cost)?.makespan_ms;
            let sim = simulate(&g, &lower(&g, &s)?, &cost)?.makespan_ms;
            times.sort_by(f64::total_cmp);
            println!(
                "{:<14} {:>5} {:>11} {:>10.4} {:>10.4} {:>10.4} {:>10.4} {:>10.4} {:>10.4}",
                m.name,
                g.op_count(),
                v.name(),
                times[reps / 2],
                times[0],
                own,
                sim,
                cp,
                seq
            );
        }
    }
    Ok(())
}
