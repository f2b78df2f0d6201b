//! `opsched viz`: the simulated timeline of a schedule as a picture: an SVG Gantt chart, a
//! Chrome trace (Perfetto, chrome://tracing) or a self-contained HTML page with both.

use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::{Args, ValueEnum};
use opsched::ratio;
use opsched::schedule::export::{self, xml_escape as esc};
use opsched::schedule::io as schedule_io;
use opsched::Graph;
use serde::Serialize;

use crate::args::{ModelArgs, PlatformArgs, SchedArgs, TargetArgs};
use crate::commands::schedule::scheduled;
use crate::common::{
    describe, evaluate, gpu_use, load, platform_line, print_json, sequential_ms, setup, GpuUse,
};
use crate::error::user;
use crate::output::Outputs;

#[derive(Args, Debug)]
#[command(
    after_help = "The format follows the extension of --out (.svg, .json, .html) unless --format \
says otherwise. The HTML page needs no network: chart, summary and the Chrome trace are inside \
it. A Chrome trace opens in https://ui.perfetto.dev or chrome://tracing.\n\nExamples:\n  \
opsched viz inception_v3 --algo ios --out inception.svg\n  \
opsched viz nasnet --algo opara --device v100 --out nasnet.html\n  \
opsched viz study.json --algo hios-lp --gpus 4 --out study.trace.json\n  \
opsched viz inception_v3 --schedule s.json --out s.html"
)]
pub struct VizArgs {
    /// Zoo model name or model file (--help lists both).
    #[arg(long_help = crate::help::model())]
    model: String,
    /// Scheduling algorithm whose schedule to draw (--help lists them).
    #[arg(
        long,
        value_name = "NAME",
        required_unless_present = "schedule",
        long_help = crate::help::algo()
    )]
    algo: Option<String>,
    /// Draw this schedule file (as written by `opsched schedule --out`) instead of searching.
    #[arg(long, value_name = "FILE", conflicts_with = "algo")]
    schedule: Option<PathBuf>,
    /// Output file: .svg (Gantt chart), .json (Chrome trace) or .html (page with both).
    #[arg(long, short, value_name = "FILE")]
    out: PathBuf,
    /// Output format (default: from the extension of --out).
    #[arg(long, value_enum)]
    format: Option<VizFormat>,
    #[command(flatten)]
    platform: PlatformArgs,
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    model_args: ModelArgs,
    #[command(flatten)]
    sched: SchedArgs,
    /// Print a JSON summary of what was drawn instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VizFormat {
    Svg,
    /// Chrome trace JSON.
    Json,
    Html,
}

impl VizFormat {
    fn from_path(path: &Path) -> Option<Self> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "svg" => Some(VizFormat::Svg),
            "json" => Some(VizFormat::Json),
            "html" | "htm" => Some(VizFormat::Html),
            _ => None,
        }
    }
}

/// What the picture shows; printed with `--json` and written into the HTML page.
#[derive(Serialize)]
struct VizSummary {
    model: String,
    ops: usize,
    schedule: String,
    shape: String,
    device: &'static str,
    link: &'static str,
    gpus: usize,
    streams: usize,
    cost_model: String,
    makespan_ms: f64,
    /// Sequential makespan under the same cost model.
    sequential_ms: f64,
    speedup: f64,
    lower_bound_ms: f64,
    gap: f64,
    transfers: usize,
    per_gpu: Vec<GpuUse>,
    out: PathBuf,
    format: VizFormat,
}

pub fn viz(a: &VizArgs) -> Result<()> {
    let format = match a.format.or_else(|| VizFormat::from_path(&a.out)) {
        Some(f) => f,
        None => {
            return Err(user(anyhow::anyhow!(
            "{}: cannot tell the format from the extension; use .svg, .json or .html, or --format",
            a.out.display()
        )))
        }
    };
    let g = load(&a.model, &a.model_args)?;
    let su = setup(&g, &a.platform, None)?;
    let (label, schedule, evaluation, sequential_ms, platform) = match (&a.algo, &a.schedule) {
        (_, Some(path)) => {
            let s = schedule_io::load(&g, path).map_err(user)?;
            let gpus = (a.target.gpus as usize).max(opsched::schedule_gpus(&s));
            let streams = (a.target.streams as usize).max(opsched::schedule_streams(&s));
            let platform = su.platform(gpus, streams);
            opsched::schedule::validate(&g, &s, &platform)
                .map_err(|e| user(anyhow::anyhow!("{}: {e}", path.display())))?;
            let ev = evaluate(&g, &s, &su, gpus)?;
            let seq_ms = sequential_ms(&g, &platform, &su)?;
            (path.display().to_string(), s, ev, seq_ms, platform)
        }
        (Some(algo), None) => {
            let platform = su.platform(a.target.gpus as usize, a.target.streams as usize);
            let run = scheduled(&g, algo, &a.sched, &su, &platform)?;
            (
                run.algo,
                run.schedule,
                run.evaluation,
                run.sequential_ms,
                platform,
            )
        }
        (None, None) => return Err(user(anyhow::anyhow!("give --algo NAME or --schedule FILE"))),
    };
    let title = format!(
        "{}: {} on {} x {} ({})",
        g.name,
        label,
        platform.gpus,
        su.device.name,
        su.cost.name()
    );
    let summary = VizSummary {
        model: g.name.clone(),
        ops: g.op_count(),
        schedule: label,
        shape: describe(&schedule),
        device: su.device.name,
        link: su.link.name,
        gpus: platform.gpus,
        streams: platform.streams,
        cost_model: su.cost.name(),
        makespan_ms: evaluation.makespan_ms,
        sequential_ms,
        speedup: ratio(sequential_ms, evaluation.makespan_ms),
        lower_bound_ms: evaluation.lower_bound.value(),
        gap: ratio(evaluation.makespan_ms, evaluation.lower_bound.value()),
        transfers: evaluation.timeline.transfers.len(),
        per_gpu: gpu_use(&evaluation, platform.gpus),
        out: a.out.clone(),
        format,
    };
    let bytes = match format {
        VizFormat::Svg => export::svg_gantt(&g, &evaluation.timeline, &title).into_bytes(),
        VizFormat::Json => serde_json::to_vec(&export::chrome_trace(&g, &evaluation.timeline))?,
        VizFormat::Html => html_page(&g, &evaluation.timeline, &title, &summary)?.into_bytes(),
    };
    let mut outputs = Outputs::default();
    outputs.add(&a.out, bytes);
    if a.json {
        print_json(&summary)?;
    } else {
        writeln!(
            std::io::stdout().lock(),
            "{}: makespan {:.4} ms ({:.3}x over sequential, {:.3}x the lower bound)",
            title,
            summary.makespan_ms,
            summary.speedup,
            summary.gap,
        )?;
    }
    outputs.write()
}

/// A page that needs nothing but a browser: the summary, the Gantt chart inline, and the Chrome
/// trace embedded as a download for Perfetto.
fn html_page(
    g: &Graph,
    t: &opsched::schedule::Timeline,
    title: &str,
    s: &VizSummary,
) -> Result<String> {
    let svg = export::svg_gantt(g, t, title);
    let trace = export::script_json(&serde_json::to_string(&export::chrome_trace(g, t))?);
    let mut rows = String::new();
    let mut row = |k: &str, v: String| {
        let _ = writeln!(rows, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(&v));
    };
    row("model", format!("{} ({} operators)", s.model, s.ops));
    row("schedule", format!("{} ({})", s.schedule, s.shape));
    row(
        "platform",
        platform_line(s.gpus, s.device, s.streams, s.link),
    );
    row("cost model", s.cost_model.clone());
    row("makespan", format!("{:.4} ms", s.makespan_ms));
    row(
        "sequential",
        format!("{:.4} ms (speedup {:.3}x)", s.sequential_ms, s.speedup),
    );
    row(
        "lower bound",
        format!("{:.4} ms (makespan is {:.3}x)", s.lower_bound_ms, s.gap),
    );
    if s.transfers > 0 {
        row("transfers", s.transfers.to_string());
    }
    for u in &s.per_gpu {
        row(
            &format!("GPU {}", u.gpu),
            format!(
                "busy {:.4} ms ({:.1}%), {} operators",
                u.busy_ms,
                u.utilization * 100.0,
                u.ops
            ),
        );
    }
    let file_stem = s
        .out
        .file_stem()
        .and_then(|x| x.to_str())
        .unwrap_or("opsched");
    Ok(format!(
        r##"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title_esc}</title>
<style>
body {{ font-family: DejaVu Sans, Helvetica, Arial, sans-serif; margin: 24px; color: #222; }}
h1 {{ font-size: 20px; }}
table {{ border-collapse: collapse; margin-bottom: 16px; }}
th {{ text-align: left; padding: 3px 16px 3px 0; font-weight: 600; color: #555; }}
td {{ padding: 3px 0; font-variant-numeric: tabular-nums; }}
.chart {{ overflow-x: auto; border: 1px solid #ddd; }}
.chart svg {{ display: block; max-width: 100%; height: auto; }}
a.button {{ display: inline-block; margin: 8px 0 16px; padding: 6px 12px; border: 1px solid #888; border-radius: 4px; text-decoration: none; color: #222; }}
.note {{ color: #666; font-size: 13px; }}
</style>
</head>
<body>
<h1>{title_esc}</h1>
<table>
{rows}</table>
<a class="button" id="trace" href="#" download="{stem_esc}.trace.json">Download the Chrome trace</a>
<span class="note">open it in <a href="https://ui.perfetto.dev">ui.perfetto.dev</a> or chrome://tracing; hover a bar below for its operator.</span>
<div class="chart">
{svg}
</div>
<p class="note">Made by opsched {version}: simulated timeline under the cost model above.</p>
<script type="application/json" id="trace-data">{trace}</script>
<script>
(function () {{
  var data = document.getElementById("trace-data").textContent;
  var url = URL.createObjectURL(new Blob([data], {{ type: "application/json" }}));
  document.getElementById("trace").href = url;
}})();
</script>
</body>
</html>
"##,
        title_esc = esc(title),
        stem_esc = esc(file_stem),
        version = env!("CARGO_PKG_VERSION"),
    ))
}
