//! `opsched`: the command-line tool. Thin: parse arguments, call the facade, print.
//!
//! Exit codes: 0 success, 2 user error (bad arguments, bad input file, unknown model),
//! 1 anything else.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use opsched::graph::{analysis::Summary, summarize, DType};
use opsched::zoo::ZooConfig;
use opsched::GraphError;
use serde::Serialize;

#[derive(Parser, Debug)]
#[command(
    name = "opsched",
    version,
    about = "Inter-operator scheduling for DNN inference on one or more GPUs",
    after_help = "Examples:\n  opsched models\n  opsched inspect inception_v3\n  opsched inspect nasnet --batch 16 --json\n  opsched inspect my_graph.json --dot graph.dot\n\nRUST_LOG=debug shows what the tool does."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the zoo models with their operator and edge counts.
    #[command(after_help = "Examples:\n  opsched models\n  opsched models --json | jq '.[].name'")]
    Models {
        #[command(flatten)]
        model: ModelArgs,
        /// Print one JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show what a model contains: operators, edges, FLOPs, parameters, depth and width.
    #[command(
        after_help = "MODEL is a zoo name (see `opsched models`) or a graph file: our graph JSON, \
IOS graph JSON or a cost-annotated DAG JSON; the format is detected.\n\nExamples:\n  \
opsched inspect inception_v3\n  opsched inspect resnet50 --batch 16 --input-size 512 --json\n  \
opsched inspect ios_graph.json --export graph.json --dot graph.dot"
    )]
    Inspect {
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
    },
}

#[derive(Args, Debug, Clone)]
struct ModelArgs {
    /// Batch size of zoo models (and of IOS graph files).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// Image side or sequence length of zoo models (default: the model's own).
    #[arg(long, value_name = "N")]
    input_size: Option<usize>,
    /// Element type of zoo models.
    #[arg(long, value_enum, default_value_t = DTypeArg::F32)]
    dtype: DTypeArg,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum DTypeArg {
    F32,
    F16,
}

impl ModelArgs {
    fn zoo_config(&self) -> ZooConfig {
        ZooConfig {
            batch: self.batch as usize,
            input_size: self.input_size,
            dtype: match self.dtype {
                DTypeArg::F32 => DType::F32,
                DTypeArg::F16 => DType::F16,
            },
        }
    }
}

/// An error caused by the user's input (bad arguments, file or model name): exit code 2.
#[derive(Debug)]
struct UserError(String);

impl std::fmt::Display for UserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for UserError {}

/// Mark an error as the user's fault, keeping its whole message on one line.
fn user<E: Into<anyhow::Error>>(e: E) -> anyhow::Error {
    anyhow::Error::new(UserError(format!("{:#}", e.into())))
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<UserError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Models { model, json } => models(&model, json),
        Command::Inspect {
            model,
            model_args,
            json,
            dot,
            export,
        } => inspect(&model, &model_args, json, dot, export),
    }
}

#[derive(Serialize)]
struct ModelRow {
    name: &'static str,
    aliases: &'static [&'static str],
    description: &'static str,
    ops: usize,
    edges: usize,
    input_shape: Vec<usize>,
}

fn models(args: &ModelArgs, json: bool) -> Result<()> {
    let cfg = args.zoo_config();
    let mut rows = Vec::new();
    for m in opsched::zoo::models() {
        let g = m.build(&cfg).map_err(user)?;
        rows.push(ModelRow {
            name: m.name,
            aliases: m.aliases,
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
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
        return Ok(());
    }
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

fn inspect(
    spec: &str,
    args: &ModelArgs,
    json: bool,
    dot: Option<PathBuf>,
    export: Option<PathBuf>,
) -> Result<()> {
    let g = opsched::load_model(spec, &args.zoo_config()).map_err(user)?;
    tracing::debug!(model = %g.name, nodes = g.len(), "loaded");
    if let Some(path) = dot {
        write_file(&path, opsched::formats::dot::to_dot(&g).as_bytes())?;
    }
    if let Some(path) = export {
        write_file(&path, opsched::formats::json::to_string(&g).as_bytes())?;
    }
    let s = summarize(&g);
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&s)?)?;
    } else {
        print_summary(&mut out, &s)?;
    }
    Ok(())
}

fn write_file(path: &PathBuf, bytes: &[u8]) -> Result<()> {
    opsched::formats::write_atomic(path, bytes)
        .map_err(|e: GraphError| anyhow::Error::new(e))
        .with_context(|| format!("writing {}", path.display()))
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

fn human(x: f64, unit: &str) -> String {
    let (v, p) = match x {
        x if x >= 1e12 => (x / 1e12, "T"),
        x if x >= 1e9 => (x / 1e9, "G"),
        x if x >= 1e6 => (x / 1e6, "M"),
        x if x >= 1e3 => (x / 1e3, "k"),
        x => (x, ""),
    };
    format!("{v:.2} {p}{unit}").trim_end().to_string()
}
