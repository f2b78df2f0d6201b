//! `opsched simulate`: a schedule file (or an IOS file's own stages) on the simulator.

use std::io::Write;
use std::path::Path;

use anyhow::Result;
use clap::Args;
use opsched::cost::CostStats;
use opsched::ratio;
use opsched::schedule::{io as schedule_io, Schedule};
use opsched::CostKind;
use serde::Serialize;

use crate::args::{gpus_in_range, streams_in_range, ExportArgs, ModelArgs, PlatformArgs};
use crate::common::{
    add_exports, bound_line, describe, evaluate, gpu_use, load, platform_line, print_json, setup,
    GpuUse,
};
use crate::error::user;
use crate::output::Outputs;

#[derive(Args, Debug)]
#[command(after_help = "SCHEDULE is a schedule file (as written by \
`opsched schedule --out`), or `ios` for the stages an IOS graph file carries. The schedule is \
validated first (every operator once, dependencies, stream and GPU limits).\n\nExamples:\n  \
opsched simulate inception_v3 s.json\n  \
opsched simulate fixtures/ios/v100.json ios --device v100 --json\n  \
opsched simulate nasnet s.json --gpus 2 --trace trace.json --svg gantt.svg")]
pub struct SimulateArgs {
    /// Zoo model name or model file (--help lists both).
    #[arg(long_help = crate::help::model())]
    graph: String,
    /// Schedule file, or `ios` for the IOS stages embedded in an IOS graph file.
    schedule: String,
    #[command(flatten)]
    platform: PlatformArgs,
    /// Number of GPUs (default: the schedule's; at most 256).
    #[arg(long, value_parser = gpus_in_range())]
    gpus: Option<u32>,
    /// CUDA streams per GPU (default: what the schedule needs; at most 128).
    #[arg(long, value_parser = streams_in_range())]
    streams: Option<u32>,
    #[command(flatten)]
    model_args: ModelArgs,
    #[command(flatten)]
    exports: ExportArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct SimulateReport {
    model: String,
    ops: usize,
    schedule: String,
    shape: &'static str,
    device: &'static str,
    link: &'static str,
    gpus: usize,
    streams: usize,
    cost: CostKind,
    cost_model: String,
    makespan_ms: f64,
    lower_bound_ms: f64,
    critical_path_ms: f64,
    capacity_ms: f64,
    gap: f64,
    transfers: usize,
    transfer_ms: f64,
    per_gpu: Vec<GpuUse>,
    cost_stats: CostStats,
}

pub fn simulate(a: &SimulateArgs) -> Result<()> {
    let g = load(&a.graph, &a.model_args)?;
    let embedded = a.schedule == "ios" && !Path::new(&a.schedule).is_file();
    // Where the schedule comes from, for errors: the graph file for its embedded IOS stages.
    let source = if embedded { &a.graph } else { &a.schedule };
    let s = if embedded {
        schedule_io::from_ios_stages(&g).ok_or_else(|| {
            user(anyhow::anyhow!(
                "{}: the graph carries no IOS stages (an IOS graph file with \"stages\" on every block is needed for `ios`)",
                a.graph
            ))
        })?
    } else {
        schedule_io::load(&g, &a.schedule).map_err(user)?
    };
    let needed = opsched::schedule_gpus(&s).max(1);
    let gpus = a.gpus.map_or(needed, |g| g as usize);
    if gpus < needed {
        return Err(user(anyhow::anyhow!(
            "{source}: the schedule uses {needed} GPUs but --gpus is {gpus}"
        )));
    }
    let streams = a
        .streams
        .map_or_else(|| opsched::schedule_streams(&s), |s| s as usize);
    let su = setup(&g, &a.platform, None)?;
    let platform = su.platform(gpus, streams);
    // A schedule file may ask for more GPUs or streams than a platform holds.
    platform
        .check("simulate")
        .map_err(|e| user(anyhow::anyhow!("{source}: {e}")))?;
    opsched::schedule::validate(&g, &s, &platform)
        .map_err(|e| user(anyhow::anyhow!("{source}: {e}")))?;
    let ev = evaluate(&g, &s, &su, gpus)?;
    let mut outputs = Outputs::default();
    add_exports(
        &mut outputs,
        &g,
        &ev,
        &a.exports,
        &format!(
            "{}: {} on {} x {} ({})",
            g.name,
            a.schedule,
            gpus,
            su.device.name,
            su.cost.name()
        ),
    )?;
    let r = SimulateReport {
        model: g.name.clone(),
        ops: g.op_count(),
        schedule: a.schedule.clone(),
        shape: match s {
            Schedule::Stages(_) => "stages",
            Schedule::Streams(_) => "streams",
        },
        device: su.device.name,
        link: su.link.name,
        gpus,
        streams,
        cost: su.kind,
        cost_model: su.cost.name(),
        makespan_ms: ev.makespan_ms,
        lower_bound_ms: ev.lower_bound.value(),
        critical_path_ms: ev.lower_bound.critical_path_ms,
        capacity_ms: ev.lower_bound.capacity_ms,
        gap: ratio(ev.makespan_ms, ev.lower_bound.value()),
        transfers: ev.timeline.transfers.len(),
        transfer_ms: ev
            .timeline
            .transfers
            .iter()
            .map(|x| x.end_ms - x.start_ms)
            .sum(),
        per_gpu: gpu_use(&ev, gpus),
        cost_stats: su.cost.stats(),
    };
    if a.json {
        print_json(&r)?;
    } else {
        print_report(&r, &s)?;
    }
    outputs.write()
}

fn print_report(r: &SimulateReport, s: &Schedule) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "model          {} ({} operators)", r.model, r.ops)?;
    writeln!(out, "schedule       {} ({})", r.schedule, describe(s))?;
    writeln!(
        out,
        "platform       {}",
        platform_line(r.gpus, r.device, r.streams, r.link)
    )?;
    writeln!(out, "cost model     {}", r.cost_model)?;
    writeln!(out, "makespan       {:.4} ms", r.makespan_ms)?;
    writeln!(
        out,
        "lower bound    {}",
        bound_line(r.lower_bound_ms, r.critical_path_ms, r.capacity_ms, r.gap)
    )?;
    if r.transfers > 0 {
        writeln!(
            out,
            "transfers      {} ({:.4} ms in all)",
            r.transfers, r.transfer_ms
        )?;
    }
    for u in &r.per_gpu {
        writeln!(
            out,
            "GPU {:<10} busy {:.4} ms ({:.1}%), {} operators",
            u.gpu,
            u.busy_ms,
            u.utilization * 100.0,
            u.ops
        )?;
    }
    Ok(())
}
