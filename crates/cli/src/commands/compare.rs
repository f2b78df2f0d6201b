//! `opsched compare`: several algorithms on one model, side by side on the simulator.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::args::{ModelArgs, PlatformArgs, SchedArgs, TargetArgs};
use crate::common::{load, print_json, setup, write_file};
use crate::error::facade;
use crate::progress::Bar;

#[derive(Args, Debug)]
#[command(
    after_help = "Every algorithm's schedule is validated and simulated under the same cost model \
on the same platform; speedup is over the sequential schedule, gap is makespan / lower bound \
(1 = provably optimal).\n\nExamples:\n  \
opsched compare inception_v3\n  \
opsched compare nasnet --algos lios,opara,sequential --device v100 --json\n  \
opsched compare study.json --gpus 4 --algos hios-lp,hios-mr --csv out.csv --md out.md"
)]
pub struct CompareArgs {
    /// Zoo model name or graph file.
    model: String,
    /// Comma-separated algorithm names, or `all`.
    #[arg(long, default_value = "all", value_name = "NAMES")]
    algos: String,
    #[command(flatten)]
    platform: PlatformArgs,
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    model_args: ModelArgs,
    #[command(flatten)]
    sched: SchedArgs,
    /// Also write the table as CSV to this file.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Also write the table as Markdown to this file.
    #[arg(long, value_name = "FILE")]
    md: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn compare(a: &CompareArgs) -> Result<()> {
    let g = load(&a.model, &a.model_args)?;
    let names: Vec<&str> = if a.algos.trim() == "all" {
        opsched::scheduler_names()
    } else {
        a.algos
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect()
    };
    let options = a.sched.options();
    // Unknown names are the user's mistake: report them before any work.
    for name in &names {
        opsched::scheduler_with(name, &options).map_err(facade)?;
    }
    let su = setup(&g, &a.platform)?;
    let platform = su.platform(a.target.gpus as usize, a.target.streams as usize);
    let bar = Bar::new(Some(names.len() as u64));
    let table = opsched::compare(
        &g,
        &names,
        &platform,
        su.cost.as_ref(),
        &options,
        su.exec,
        &bar,
    )
    .map_err(anyhow::Error::new)
    .with_context(|| format!("comparing schedulers on {}", g.name))?;
    bar.finish();
    if let Some(path) = &a.csv {
        write_file(path, comparison_csv(&table).as_bytes())?;
    }
    if let Some(path) = &a.md {
        write_file(path, comparison_markdown(&table).as_bytes())?;
    }
    if a.json {
        return print_json(&table);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} ({} operators) on {} x {}, {} streams per GPU, {}; cost model {}",
        table.model,
        table.ops,
        table.gpus,
        table.device,
        table.streams,
        table.link,
        table.cost_model
    )?;
    writeln!(
        out,
        "sequential {:.4} ms; lower bound {:.4} ms\n",
        table.sequential_ms,
        table.lower_bound.value()
    )?;
    writeln!(
        out,
        "{:<15} {:>13} {:>9} {:>8} {:>14} {:>10}",
        "algorithm", "makespan ms", "speedup", "gap", "schedule ms", "states"
    )?;
    for r in &table.rows {
        writeln!(
            out,
            "{:<15} {:>13.4} {:>8.3}x {:>8.3} {:>14.3} {:>10}",
            r.algo, r.makespan_ms, r.speedup, r.gap, r.schedule_time_ms, r.stats.states
        )?;
    }
    Ok(())
}

pub fn comparison_csv(t: &opsched::ComparisonTable) -> String {
    let mut s = String::from(
        "model,device,gpus,streams,cost_model,algorithm,makespan_ms,sequential_ms,speedup,lower_bound_ms,gap,schedule_time_ms,states\n",
    );
    for r in &t.rows {
        s.push_str(&format!(
            "{},{},{},{},{},{},{:.6},{:.6},{:.4},{:.6},{:.4},{:.4},{}\n",
            t.model,
            t.device,
            t.gpus,
            t.streams,
            t.cost_model,
            r.algo,
            r.makespan_ms,
            t.sequential_ms,
            r.speedup,
            t.lower_bound.value(),
            r.gap,
            r.schedule_time_ms,
            r.stats.states
        ));
    }
    s
}

pub fn comparison_markdown(t: &opsched::ComparisonTable) -> String {
    let mut s = format!(
        "{} ({} operators) on {} x {}, {} streams per GPU; cost model {}; sequential {:.4} ms, lower bound {:.4} ms\n\n\
         | algorithm | makespan (ms) | speedup | gap to bound | scheduling time (ms) | states |\n\
         |---|---:|---:|---:|---:|---:|\n",
        t.model,
        t.ops,
        t.gpus,
        t.device,
        t.streams,
        t.cost_model,
        t.sequential_ms,
        t.lower_bound.value()
    );
    for r in &t.rows {
        s.push_str(&format!(
            "| {} | {:.4} | {:.3}x | {:.3} | {:.3} | {} |\n",
            r.algo, r.makespan_ms, r.speedup, r.gap, r.schedule_time_ms, r.stats.states
        ));
    }
    s
}
