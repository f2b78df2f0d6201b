//! `opsched models` and `opsched inspect`: what the zoo holds and what a model contains.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use opsched::graph::{analysis::Summary, summarize};
use serde::Serialize;

use crate::args::ModelArgs;
use crate::common::{human, load, print_json, write_file};
use crate::error::user;

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
    after_help = "MODEL is a zoo name (see `opsched models`) or a graph file: our graph JSON, \
IOS graph JSON or a cost-annotated DAG JSON; the format is detected.\n\nExamples:\n  \
opsched inspect inception_v3\n  opsched inspect resnet50 --batch 16 --input-size 512 --json\n  \
opsched inspect ios_graph.json --export graph.json --dot graph.dot"
)]
pub struct InspectArgs {
    /// Zoo model name or graph file.
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
    if let Some(path) = &a.dot {
        write_file(path, opsched::formats::dot::to_dot(&g).as_bytes())?;
    }
    if let Some(path) = &a.export {
        write_file(path, opsched::formats::json::to_string(&g).as_bytes())?;
    }
    let s = summarize(&g);
    if a.json {
        return print_json(&s);
    }
    print_summary(&mut std::io::stdout().lock(), &s)
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
    let types: Vec<String> = s.op_types.iter().map(|(t, n)| format!("{t} {n}")).collect();
    writeln!(out, "op types     {}", types.join(", "))?;
    Ok(())
}
