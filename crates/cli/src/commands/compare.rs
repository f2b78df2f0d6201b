//! `opsched compare`: several algorithms on one model, side by side on the simulator.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::args::{ModelArgs, PlatformArgs, SchedArgs, TargetArgs};
use crate::common::{count, load, platform_line, print_json, setup};
use crate::error::{facade, user};
use crate::output::Outputs;
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
    /// Zoo model name or model file (--help lists both).
    #[arg(long_help = crate::help::model())]
    model: String,
    /// Comma-separated algorithm names, or `all` (--help lists them).
    #[arg(long, default_value = "all", value_name = "NAMES", long_help = crate::help::algos())]
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
    if names.is_empty() {
        return Err(user(anyhow::anyhow!(
            "--algos names no algorithm (give NAMES separated by commas, or `all`)"
        )));
    }
    let options = a.sched.options();
    // Unknown names are the user's mistake: report them before any work.
    for name in &names {
        opsched::scheduler_with(name, &options).map_err(facade)?;
    }
    let su = setup(&g, &a.platform, None)?;
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
    .map_err(facade)
    .with_context(|| format!("comparing schedulers on {}", g.name))?;
    bar.finish();
    let mut outputs = Outputs::default();
    if let Some(path) = &a.csv {
        outputs.add(path, comparison_csv(&table));
    }
    if let Some(path) = &a.md {
        outputs.add(path, comparison_markdown(&table));
    }
    if a.json {
        print_json(&table)?;
    } else {
        print_table(&table)?;
    }
    outputs.write()
}

fn print_table(table: &opsched::ComparisonTable) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} ({}) on {}; cost model {}",
        table.model,
        count(table.ops, "operator"),
        platform_line(table.gpus, table.device, table.streams, table.link),
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
            csv_field(&t.model),
            t.device,
            t.gpus,
            t.streams,
            csv_field(&t.cost_model),
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

/// A CSV field (RFC 4180): quoted, with quotes doubled, when it holds a comma, quote or line
/// break (a model's name comes from its file).
fn csv_field(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\"")).into()
    } else {
        s.into()
    }
}

pub fn comparison_markdown(t: &opsched::ComparisonTable) -> String {
    let mut s = format!(
        "{} ({}) on {} x {}, {} per GPU; cost model {}; sequential {:.4} ms, lower bound {:.4} ms\n\n\
         | algorithm | makespan (ms) | speedup | gap to bound | scheduling time (ms) | states |\n\
         |---|---:|---:|---:|---:|---:|\n",
        t.model,
        count(t.ops, "operator"),
        t.gpus,
        t.device,
        count(t.streams, "stream"),
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

#[cfg(test)]
mod tests {
    use super::csv_field;

    #[test]
    fn csv_fields_are_quoted_only_when_needed() {
        assert_eq!(csv_field("resnet50"), "resnet50");
        assert_eq!(csv_field("a,\"b\"\nc"), "\"a,\"\"b\"\"\nc\"");
    }
}
