//! `opsched schedule`: one algorithm on one model, simulated and compared with sequential.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use opsched::cost::CostStats;
use opsched::ratio;
use opsched::schedule::{io as schedule_io, Platform, Progress, Schedule, SchedulerStats};
use opsched::{CostKind, Evaluation, Graph};
use serde::Serialize;

use crate::args::{ExportArgs, ModelArgs, PlatformArgs, SchedArgs, TargetArgs};
use crate::common::{
    add_exports, bound_line, describe, evaluate, load, platform_line, print_json, sequential_ms,
    setup, Setup,
};
use crate::error::facade;
use crate::output::Outputs;
use crate::progress::Bar;

#[derive(Args, Debug)]
#[command(after_help = "The schedule is simulated under the cost \
model (default: hios-sim for a cost-annotated DAG, analytical otherwise) and compared with the \
sequential schedule under the same model; the lower bound is the larger of the critical path and \
the cost model's capacity bound.\n\nExamples:\n  \
opsched schedule inception_v3 --algo ios\n  \
opsched schedule resnet50 --algo opara --device a100 --batch 8 --json\n  \
opsched schedule study.json --algo hios-lp --gpus 4 --cost hios-sim --out study.schedule.json\n  \
opsched schedule nasnet --algo ios --ios-part 20 --svg gantt.svg --trace trace.json")]
pub struct ScheduleArgs {
    /// Zoo model name or model file (--help lists both).
    #[arg(long_help = crate::help::model())]
    model: String,
    /// Scheduling algorithm (--help lists them).
    #[arg(long, value_name = "NAME", long_help = crate::help::algo())]
    algo: String,
    #[command(flatten)]
    platform: PlatformArgs,
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    model_args: ModelArgs,
    #[command(flatten)]
    sched: SchedArgs,
    /// Write the schedule (JSON with operator names) to this file.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    #[command(flatten)]
    exports: ExportArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct ScheduleReport {
    model: String,
    ops: usize,
    algo: String,
    device: &'static str,
    link: &'static str,
    gpus: usize,
    streams: usize,
    cost: CostKind,
    cost_model: String,
    makespan_ms: f64,
    sequential_ms: f64,
    speedup: f64,
    lower_bound_ms: f64,
    critical_path_ms: f64,
    capacity_ms: f64,
    /// makespan / lower bound (1 = provably optimal).
    gap: f64,
    schedule_time_ms: f64,
    stats: SchedulerStats,
    /// Operator times answered from measurements vs estimated (`--cost cache`).
    cost_stats: CostStats,
    schedule: serde_json::Value,
}

pub fn schedule(a: &ScheduleArgs) -> Result<()> {
    let g = load(&a.model, &a.model_args)?;
    let su = setup(&g, &a.platform, None)?;
    let platform = su.platform(a.target.gpus as usize, a.target.streams as usize);
    let run = scheduled(&g, &a.algo, &a.sched, &su, &platform)?;
    let (s, ev, sched_name) = (&run.schedule, &run.evaluation, run.algo.as_str());
    let mut outputs = Outputs::default();
    if let Some(path) = &a.out {
        outputs.add(path, schedule_io::to_string(&g, s));
    }
    add_exports(
        &mut outputs,
        &g,
        ev,
        &a.exports,
        &format!(
            "{}: {} on {} x {} ({})",
            g.name,
            sched_name,
            platform.gpus,
            su.device.name,
            su.cost.name()
        ),
    )?;
    let r = ScheduleReport {
        model: g.name.clone(),
        ops: g.op_count(),
        algo: run.algo.clone(),
        device: su.device.name,
        link: su.link.name,
        gpus: platform.gpus,
        streams: platform.streams,
        cost: su.kind,
        cost_model: su.cost.name(),
        makespan_ms: ev.makespan_ms,
        sequential_ms: run.sequential_ms,
        speedup: ratio(run.sequential_ms, ev.makespan_ms),
        lower_bound_ms: ev.lower_bound.value(),
        critical_path_ms: ev.lower_bound.critical_path_ms,
        capacity_ms: ev.lower_bound.capacity_ms,
        gap: ratio(ev.makespan_ms, ev.lower_bound.value()),
        schedule_time_ms: run.schedule_time_ms,
        stats: run.stats.clone(),
        cost_stats: su.cost.stats(),
        schedule: schedule_io::to_json(&g, s),
    };
    if a.json {
        print_json(&r)?;
    } else {
        print_report(&r, s)?;
    }
    outputs.write()
}

fn print_report(r: &ScheduleReport, s: &Schedule) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "model          {} ({} operators)", r.model, r.ops)?;
    writeln!(out, "algorithm      {}", r.algo)?;
    writeln!(
        out,
        "platform       {}",
        platform_line(r.gpus, r.device, r.streams, r.link)
    )?;
    writeln!(out, "cost model     {}", r.cost_model)?;
    writeln!(out, "makespan       {:.4} ms", r.makespan_ms)?;
    writeln!(
        out,
        "sequential     {:.4} ms (speedup {:.3}x)",
        r.sequential_ms, r.speedup
    )?;
    writeln!(
        out,
        "lower bound    {}",
        bound_line(r.lower_bound_ms, r.critical_path_ms, r.capacity_ms, r.gap)
    )?;
    writeln!(
        out,
        "search         {:.3} ms, {} states, {} cost queries",
        r.schedule_time_ms, r.stats.states, r.stats.cost_queries
    )?;
    writeln!(out, "schedule       {}", describe(s))?;
    Ok(())
}

/// One scheduler's schedule, validated and simulated, with the sequential makespan beside it.
pub struct Scheduled {
    pub algo: String,
    pub schedule: Schedule,
    pub stats: SchedulerStats,
    pub schedule_time_ms: f64,
    pub evaluation: Evaluation,
    pub sequential_ms: f64,
}

/// Run `algo` on `g` (with a progress bar on a terminal), validate and simulate its schedule.
pub fn scheduled(
    g: &Graph,
    algo: &str,
    sched: &SchedArgs,
    su: &Setup,
    platform: &Platform,
) -> Result<Scheduled> {
    let scheduler = opsched::scheduler_with(algo, &sched.options()).map_err(facade)?;
    let name = scheduler.name().to_string();
    let start = Instant::now();
    let bar = Bar::new(None);
    bar.step(&name);
    let (s, stats) = scheduler
        .schedule_with_progress(g, platform, su.cost.as_ref(), &bar)
        .map_err(|e| facade(e.into()))
        .with_context(|| format!("scheduler '{name}' on {}", g.name))?;
    bar.finish();
    let schedule_time_ms = start.elapsed().as_secs_f64() * 1e3;
    opsched::schedule::validate(g, &s, platform)
        .with_context(|| format!("scheduler '{name}' returned an invalid schedule"))?;
    let evaluation = evaluate(g, &s, su, platform.gpus)?;
    let sequential_ms = if name == "sequential" {
        evaluation.makespan_ms
    } else {
        sequential_ms(g, platform, su)?
    };
    Ok(Scheduled {
        algo: name,
        schedule: s,
        stats,
        schedule_time_ms,
        evaluation,
        sequential_ms,
    })
}
