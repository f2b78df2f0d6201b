//! `opsched models` and `opsched inspect`: what the zoo holds and what a model contains.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use opsched::graph::analysis::{DagTimes, Summary};
use opsched::graph::summarize;
use serde::Serialize;

use crate::args::ModelArgs;
use crate::common::{human, load, print_json};
use crate::error::user;
use crate::output::Outputs;

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  opsched models\n  opsched models --json | jq '.[].name'")]
pub struct ModelsArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Print one JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = "A cost-annotated DAG shows its given times instead of FLOPs, dtype and shapes.\n\n\
Examples:\n  \
opsched inspect inception_v3\n  opsched inspect resnet50 --batch 16 --input-size 512 --json\n  \
opsched inspect model.onnx --batch 8\n  \
opsched inspect fixtures/ios/v100.json --export graph.json --dot graph.dot"
)]
pub struct InspectArgs {
    /// Zoo model name or model file (--help lists both).
    #[arg(long_help = crate::help::model())]
    model: String,
    #[command(flatten)]
    model_args: ModelArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Also write the graph as DOT (Graphviz) to this file.
    #[arg(long, value_name = "FILE")]
    dot: Option<PathBuf>,
    /// Also write the graph in opsched graph JSON to this file.
    #[arg(long, value_name = "FILE")]
    export: Option<PathBuf>,
}

#[derive(Serialize)]
struct ModelRow {
    name: &'static str,
    description: &'static str,
    ops: usize,
    edges: usize,
    input_shape: Vec<usize>,
}

pub fn models(a: &ModelsArgs) -> Result<()> {
    let cfg = a.model.zoo_config();
    let mut rows = Vec::new();
    for m in opsched::zoo::models() {
        let g = m.build(&cfg).map_err(user)?;
        rows.push(ModelRow {
            name: m.name,
            description: m.description,
            ops: g.op_count(),
            edges: g.edge_count(),
            input_shape: g
                .inputs()
                .next()
                .map(|n| g.node(n).shape.clone())
                .unwrap_or_default(),
        });
    }
    if a.json {
        return print_json(&rows);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<14} {:>5} {:>6}  {:<18} description",
        "model", "ops", "edges", "input"
    )?;
    for r in rows {
        writeln!(
            out,
            "{:<14} {:>5} {:>6}  {:<18} {}",
            r.name,
            r.ops,
            r.edges,
            format!("{:?}", r.input_shape),
            r.description
        )?;
    }
    Ok(())
}

pub fn inspect(a: &InspectArgs) -> Result<()> {
    let g = load(&a.model, &a.model_args)?;
    let mut outputs = Outputs::default();
    if let Some(path) = &a.dot {
        outputs.add(path, opsched::formats::dot::to_dot(&g));
    }
    if let Some(path) = &a.export {
        outputs.add(path, opsched::formats::json::to_string(&g));
    }
    let s = summarize(&g);
    match (&s.times, a.json) {
        (Some(times), true) => print_json(&DagSummary::new(&s, times)),
        (Some(times), false) => print_dag_summary(&mut std::io::stdout().lock(), &s, times),
        (None, true) => print_json(&s),
        (None, false) => print_summary(&mut std::io::stdout().lock(), &s),
    }?;
    outputs.write()
}

/// What a cost-annotated DAG has: structure and given times, no tensors (no FLOPs, dtype or
/// shapes).
#[derive(Serialize)]
struct DagSummary<'a> {
    name: &'a str,
    ops: usize,
    edges: usize,
    blocks: usize,
    depth: usize,
    width: usize,
    op_time_ms: f64,
    transfer_ms: f64,
    mean_util: f64,
}

impl<'a> DagSummary<'a> {
    fn new(s: &'a Summary, t: &DagTimes) -> Self {
        DagSummary {
            name: &s.name,
            ops: s.ops,
            edges: s.edges,
            blocks: s.blocks,
            depth: s.depth,
            width: s.width,
            op_time_ms: t.op_time_ms,
            transfer_ms: t.transfer_ms,
            mean_util: t.mean_util,
        }
    }
}

fn print_dag_summary(out: &mut impl Write, s: &Summary, t: &DagTimes) -> Result<()> {
    writeln!(out, "DAG          {} (cost-annotated)", s.name)?;
    writeln!(out, "operators    {}", s.ops)?;
    writeln!(out, "edges        {}", s.edges)?;
    writeln!(
        out,
        "op time      {:.4} ms in all (mean util {:.3})",
        t.op_time_ms, t.mean_util
    )?;
    writeln!(out, "transfers    {:.4} ms in all", t.transfer_ms)?;
    print_shape(out, s)
}

/// Depth and width, the figures every graph has.
fn print_shape(out: &mut impl Write, s: &Summary) -> Result<()> {
    writeln!(
        out,
        "depth        {} (operators on the critical path)",
        s.depth
    )?;
    writeln!(
        out,
        "width        {} (most mutually independent operators)",
        s.width
    )?;
    Ok(())
}

fn print_summary(out: &mut impl Write, s: &Summary) -> Result<()> {
    writeln!(out, "model        {}", s.name)?;
    writeln!(out, "dtype        {}", s.dtype)?;
    for shape in &s.input_shapes {
        writeln!(out, "input        {shape:?}")?;
    }
    writeln!(out, "operators    {}", s.ops)?;
    writeln!(out, "edges        {}", s.edges)?;
    writeln!(out, "blocks       {}", s.blocks)?;
    writeln!(out, "FLOPs        {}", human(s.flops as f64, "FLOP"))?;
    writeln!(out, "parameters   {}", human(s.params as f64, ""))?;
    writeln!(
        out,
        "bytes moved  {}",
        human((s.bytes_read + s.bytes_written) as f64, "B")
    )?;
    print_shape(out, s)?;
    let types: Vec<String> = s.op_types.iter().map(|(t, n)| format!("{t} {n}")).collect();
    writeln!(out, "op types     {}", types.join(", "))?;
    Ok(())
}
