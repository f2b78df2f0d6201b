//! `opsched`: the command-line tool. Thin: parse arguments, call the facade, print.
//!
//! Exit codes: 0 success, 2 user error (bad arguments, bad input file, unknown model),
//! 1 anything else.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use opsched::cost::{CostModel, CostStats, DevicePreset, LinkPreset};
use opsched::graph::{analysis::Summary, summarize, DType};
use opsched::ratio;
use opsched::schedule::{export, io as schedule_io, Platform, Schedule, SchedulerStats};
use opsched::zoo::ZooConfig;
use opsched::{CostKind, Evaluation, Graph, GraphError};
use serde::Serialize;

#[derive(Parser, Debug)]
#[command(
    name = "opsched",
    version,
    about = "Inter-operator scheduling for DNN inference on one or more GPUs",
    after_help = "Examples:\n  opsched models\n  opsched inspect inception_v3\n  opsched inspect nasnet --batch 16 --json\n  opsched inspect my_graph.json --dot graph.dot\n  opsched schedule inception_v3 --algo sequential --out s.json\n  opsched simulate inception_v3 s.json --svg gantt.svg\n\nRUST_LOG=debug shows what the tool does."
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
    /// Find a schedule with one algorithm and evaluate it on the simulator.
    #[command(
        after_help = "MODEL is a zoo name or a graph file. The schedule is simulated under the cost \
model (default: hios-sim for a cost-annotated DAG, analytical otherwise) and compared with the \
sequential schedule under the same model; the lower bound is the larger of the critical path and \
the cost model's capacity bound.\n\nExamples:\n  \
opsched schedule inception_v3 --algo sequential\n  \
opsched schedule resnet50 --algo sequential --device a100 --batch 8 --json\n  \
opsched schedule study.json --algo sequential --cost hios-sim --out study.schedule.json\n  \
opsched schedule nasnet --algo sequential --gpus 2 --streams 4 --svg gantt.svg --trace trace.json"
    )]
    Schedule {
        /// Zoo model name or graph file.
        model: String,
        /// Scheduling algorithm (see the examples; an unknown name lists the known ones).
        #[arg(long, value_name = "NAME")]
        algo: String,
        #[command(flatten)]
        platform: PlatformArgs,
        /// Number of GPUs.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        gpus: u32,
        /// CUDA streams per GPU (the most operators a GPU runs at once).
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
        streams: u32,
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
    },
    /// Run several algorithms on one model and compare them on the simulator.
    #[command(
        after_help = "Every algorithm's schedule is validated and simulated under the same cost model \
on the same platform; speedup is over the sequential schedule, gap is makespan / lower bound \
(1 = provably optimal).\n\nExamples:\n  \
opsched compare inception_v3\n  \
opsched compare nasnet --algos lios,opara,sequential --device v100 --json\n  \
opsched compare study.json --gpus 4 --algos hios-lp,hios-mr --csv out.csv --md out.md"
    )]
    Compare {
        /// Zoo model name or graph file.
        model: String,
        /// Comma-separated algorithm names, or `all`.
        #[arg(long, default_value = "all", value_name = "NAMES")]
        algos: String,
        #[command(flatten)]
        platform: PlatformArgs,
        /// Number of GPUs.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        gpus: u32,
        /// CUDA streams per GPU (the most operators a GPU runs at once).
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
        streams: u32,
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
    },
    /// Simulate a schedule file: makespan, lower bound, per-GPU busy time.
    #[command(
        after_help = "GRAPH is a zoo name or a graph file; SCHEDULE is a schedule file (as written by \
`opsched schedule --out`), or `ios` for the stages an IOS graph file carries. The schedule is \
validated first (every operator once, dependencies, stream and GPU limits).\n\nExamples:\n  \
opsched simulate inception_v3 s.json\n  \
opsched simulate ../shared/fixtures/ios/v100.json ios --device v100 --json\n  \
opsched simulate nasnet s.json --gpus 2 --trace trace.json --svg gantt.svg"
    )]
    Simulate {
        /// Zoo model name or graph file.
        graph: String,
        /// Schedule file, or `ios` for the IOS stages embedded in an IOS graph file.
        schedule: String,
        #[command(flatten)]
        platform: PlatformArgs,
        /// Number of GPUs (default: the schedule's).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        gpus: Option<u32>,
        /// CUDA streams per GPU (default: what the schedule needs).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        streams: Option<u32>,
        #[command(flatten)]
        model_args: ModelArgs,
        #[command(flatten)]
        exports: ExportArgs,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Options of the algorithms that take any (defaults are the papers').
#[derive(Args, Debug, Clone)]
struct SchedArgs {
    /// IOS: most operators per group (r).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    ios_r: u32,
    /// IOS: most groups per stage (s).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    ios_s: u32,
    /// IOS: most operators per part solved by one dynamic program.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    ios_part: u32,
    /// HIOS: window of the intra-GPU parallelization (w).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    window: u32,
    /// Seed of randomized algorithms (the LIOS ablations).
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl SchedArgs {
    fn options(&self) -> opsched::SchedulerOptions {
        opsched::SchedulerOptions {
            ios_r: self.ios_r as usize,
            ios_s: self.ios_s as usize,
            ios_part: self.ios_part as usize,
            window: self.window as usize,
            seed: self.seed,
        }
    }
}

#[derive(Args, Debug, Clone)]
struct PlatformArgs {
    /// GPU model preset (e.g. h100, a100, v100).
    #[arg(long, default_value = "h100", value_name = "NAME")]
    device: String,
    /// Interconnect preset between GPUs (e.g. nvlink4, pcie4).
    #[arg(long, default_value = "nvlink4", value_name = "NAME")]
    link: String,
    /// Cost model: analytical, hios-sim, ideal or cache (default: hios-sim for a cost-annotated
    /// DAG, analytical otherwise).
    #[arg(long, value_name = "KIND")]
    cost: Option<String>,
    /// Cost cache file for `--cost cache` (default: the user's cache directory).
    #[arg(long, value_name = "PATH")]
    cache: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
struct ExportArgs {
    /// Write the simulated timeline as a Chrome trace (chrome://tracing, Perfetto).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Write the simulated timeline as an SVG Gantt chart.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
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

/// A facade error: the user's fault or not, as the facade says.
fn facade(e: opsched::Error) -> anyhow::Error {
    if e.is_user_error() {
        user(e)
    } else {
        anyhow::Error::new(e)
    }
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
        // A closed pipe (`opsched ... | head`) is the reader's choice, not an error.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
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
        Command::Schedule {
            model,
            algo,
            platform,
            gpus,
            streams,
            model_args,
            sched,
            out,
            exports,
            json,
        } => schedule(ScheduleCmd {
            spec: &model,
            algo: &algo,
            platform: &platform,
            gpus: gpus as usize,
            streams: streams as usize,
            model_args: &model_args,
            options: sched.options(),
            out: out.as_deref(),
            exports: &exports,
            json,
        }),
        Command::Compare {
            model,
            algos,
            platform,
            gpus,
            streams,
            model_args,
            sched,
            csv,
            md,
            json,
        } => compare(CompareCmd {
            spec: &model,
            algos: &algos,
            platform: &platform,
            gpus: gpus as usize,
            streams: streams as usize,
            model_args: &model_args,
            options: sched.options(),
            csv: csv.as_deref(),
            md: md.as_deref(),
            json,
        }),
        Command::Simulate {
            graph,
            schedule,
            platform,
            gpus,
            streams,
            model_args,
            exports,
            json,
        } => simulate(SimulateCmd {
            spec: &graph,
            schedule: &schedule,
            platform: &platform,
            gpus: gpus.map(|g| g as usize),
            streams: streams.map(|s| s as usize),
            model_args: &model_args,
            exports: &exports,
            json,
        }),
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

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    opsched::formats::write_atomic(path, bytes)
        .map_err(|e: GraphError| anyhow::Error::new(e))
        .with_context(|| format!("writing {}", path.display()))
}

/// The platform and cost model of a `schedule` or `simulate` run.
struct Setup {
    device: DevicePreset,
    link: LinkPreset,
    kind: CostKind,
    cost: Box<dyn CostModel>,
}

fn setup(g: &Graph, args: &PlatformArgs) -> Result<Setup> {
    let device = DevicePreset::by_name(&args.device).map_err(user)?;
    let link = LinkPreset::by_name(&args.link).map_err(user)?;
    let kind = match &args.cost {
        Some(name) => name.parse::<CostKind>().map_err(facade)?,
        None => opsched::default_cost_kind(g),
    };
    if args.cache.is_some() && kind != CostKind::Cache {
        tracing::warn!(cost = %kind, "--cache is only read by --cost cache");
    }
    let cost = opsched::cost_model(kind, &device, &link, g, args.cache.as_deref())
        .map_err(facade)
        .with_context(|| format!("cost model {kind}"))?;
    tracing::debug!(cost = %cost.name(), "cost model");
    Ok(Setup {
        device,
        link,
        kind,
        cost,
    })
}

fn evaluate(g: &Graph, s: &Schedule, cost: &dyn CostModel, gpus: usize) -> Result<Evaluation> {
    opsched::evaluate(g, s, cost, gpus)
        .map_err(anyhow::Error::new)
        .context("simulating the schedule")
}

fn write_exports(g: &Graph, ev: &Evaluation, exports: &ExportArgs, title: &str) -> Result<()> {
    if let Some(path) = &exports.trace {
        let trace = export::chrome_trace(g, &ev.timeline);
        write_file(path, serde_json::to_string(&trace)?.as_bytes())?;
    }
    if let Some(path) = &exports.svg {
        write_file(path, export::svg_gantt(g, &ev.timeline, title).as_bytes())?;
    }
    Ok(())
}

struct ScheduleCmd<'a> {
    spec: &'a str,
    algo: &'a str,
    platform: &'a PlatformArgs,
    gpus: usize,
    streams: usize,
    model_args: &'a ModelArgs,
    options: opsched::SchedulerOptions,
    out: Option<&'a Path>,
    exports: &'a ExportArgs,
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

fn schedule(cmd: ScheduleCmd<'_>) -> Result<()> {
    let g = opsched::load_model(cmd.spec, &cmd.model_args.zoo_config()).map_err(user)?;
    let sched = opsched::scheduler_with(cmd.algo, &cmd.options).map_err(facade)?;
    let su = setup(&g, cmd.platform)?;
    let platform = Platform {
        gpus: cmd.gpus,
        streams: cmd.streams,
        device: su.device.clone(),
        link: su.link.clone(),
    };
    let start = Instant::now();
    let (s, stats) = sched
        .schedule(&g, &platform, su.cost.as_ref())
        .with_context(|| format!("scheduler '{}' on {}", sched.name(), g.name))?;
    let schedule_time_ms = start.elapsed().as_secs_f64() * 1e3;
    opsched::schedule::validate(&g, &s, &platform)
        .with_context(|| format!("scheduler '{}' returned an invalid schedule", sched.name()))?;
    if let Some(path) = cmd.out {
        schedule_io::save(&g, &s, path).map_err(anyhow::Error::new)?;
    }
    let ev = evaluate(&g, &s, su.cost.as_ref(), cmd.gpus)?;
    let sequential_ms = if sched.name() == "sequential" {
        ev.makespan_ms
    } else {
        let seq = opsched::scheduler("sequential").map_err(facade)?;
        let (ss, _) = seq.schedule(&g, &platform, su.cost.as_ref())?;
        evaluate(&g, &ss, su.cost.as_ref(), 1)?.makespan_ms
    };
    write_exports(
        &g,
        &ev,
        cmd.exports,
        &format!(
            "{}: {} on {} x {} ({})",
            g.name,
            sched.name(),
            cmd.gpus,
            su.device.name,
            su.cost.name()
        ),
    )?;
    let r = ScheduleReport {
        model: g.name.clone(),
        ops: g.op_count(),
        algo: sched.name().to_string(),
        device: su.device.name,
        link: su.link.name,
        gpus: cmd.gpus,
        streams: cmd.streams,
        cost: su.kind,
        cost_model: su.cost.name(),
        makespan_ms: ev.makespan_ms,
        sequential_ms,
        speedup: ratio(sequential_ms, ev.makespan_ms),
        lower_bound_ms: ev.lower_bound.value(),
        critical_path_ms: ev.lower_bound.critical_path_ms,
        capacity_ms: ev.lower_bound.capacity_ms,
        gap: ratio(ev.makespan_ms, ev.lower_bound.value()),
        schedule_time_ms,
        stats,
        cost_stats: su.cost.stats(),
        schedule: schedule_io::to_json(&g, &s),
    };
    let mut out = std::io::stdout().lock();
    if cmd.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?;
        return Ok(());
    }
    writeln!(out, "model          {} ({} operators)", r.model, r.ops)?;
    writeln!(out, "algorithm      {}", r.algo)?;
    writeln!(
        out,
        "platform       {} x {}, {} stream{} per GPU, {}",
        r.gpus,
        r.device,
        r.streams,
        if r.streams == 1 { "" } else { "s" },
        r.link
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
        "lower bound    {:.4} ms (critical path {:.4} ms, capacity {:.4} ms; makespan is {:.3}x)",
        r.lower_bound_ms, r.critical_path_ms, r.capacity_ms, r.gap
    )?;
    writeln!(
        out,
        "search         {:.3} ms, {} states, {} cost queries",
        r.schedule_time_ms, r.stats.states, r.stats.cost_queries
    )?;
    writeln!(out, "schedule       {}", describe(&s))?;
    if let Some(path) = cmd.out {
        writeln!(out, "written to     {}", path.display())?;
    }
    Ok(())
}

struct CompareCmd<'a> {
    spec: &'a str,
    algos: &'a str,
    platform: &'a PlatformArgs,
    gpus: usize,
    streams: usize,
    model_args: &'a ModelArgs,
    options: opsched::SchedulerOptions,
    csv: Option<&'a Path>,
    md: Option<&'a Path>,
    json: bool,
}

fn compare(cmd: CompareCmd<'_>) -> Result<()> {
    let g = opsched::load_model(cmd.spec, &cmd.model_args.zoo_config()).map_err(user)?;
    let names: Vec<&str> = if cmd.algos.trim() == "all" {
        opsched::scheduler_names()
    } else {
        cmd.algos
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect()
    };
    // Unknown names are the user's mistake: report them before any work.
    for name in &names {
        opsched::scheduler_with(name, &cmd.options).map_err(facade)?;
    }
    let su = setup(&g, cmd.platform)?;
    let platform = Platform {
        gpus: cmd.gpus,
        streams: cmd.streams,
        device: su.device.clone(),
        link: su.link.clone(),
    };
    let table = opsched::compare(
        &g,
        &names,
        &platform,
        su.cost.as_ref(),
        &cmd.options,
        |name| {
            tracing::info!(algo = name, "scheduling");
        },
    )
    .map_err(anyhow::Error::new)
    .with_context(|| format!("comparing schedulers on {}", g.name))?;
    if let Some(path) = cmd.csv {
        write_file(path, comparison_csv(&table).as_bytes())?;
    }
    if let Some(path) = cmd.md {
        write_file(path, comparison_markdown(&table).as_bytes())?;
    }
    let mut out = std::io::stdout().lock();
    if cmd.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&table)?)?;
        return Ok(());
    }
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

fn comparison_csv(t: &opsched::ComparisonTable) -> String {
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

fn comparison_markdown(t: &opsched::ComparisonTable) -> String {
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

/// "1 GPU, 119 stages" / "2 GPUs, 8 streams".
fn describe(s: &Schedule) -> String {
    let gpus = opsched::schedule_gpus(s);
    let plural = if gpus == 1 { "" } else { "s" };
    match s {
        Schedule::Stages(p) => format!(
            "{gpus} GPU{plural}, {} stages",
            p.gpus.iter().map(Vec::len).sum::<usize>()
        ),
        Schedule::Streams(p) => format!(
            "{gpus} GPU{plural}, {} streams",
            p.gpus.iter().map(|g| g.streams.len()).sum::<usize>()
        ),
    }
}

struct SimulateCmd<'a> {
    spec: &'a str,
    schedule: &'a str,
    platform: &'a PlatformArgs,
    gpus: Option<usize>,
    streams: Option<usize>,
    model_args: &'a ModelArgs,
    exports: &'a ExportArgs,
    json: bool,
}

#[derive(Serialize)]
struct GpuUse {
    gpu: usize,
    ops: usize,
    /// Time at least one operator runs on this GPU.
    busy_ms: f64,
    /// busy_ms / makespan.
    utilization: f64,
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

/// Per GPU: operators and the length of the union of their spans.
fn gpu_use(ev: &Evaluation, gpus: usize) -> Vec<GpuUse> {
    let mut spans: Vec<Vec<(f64, f64)>> = vec![Vec::new(); gpus];
    for s in &ev.timeline.ops {
        if s.gpu >= spans.len() {
            spans.resize(s.gpu + 1, Vec::new());
        }
        spans[s.gpu].push((s.start_ms, s.end_ms));
    }
    spans
        .into_iter()
        .enumerate()
        .map(|(gpu, mut v)| {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (mut busy, mut cur): (f64, Option<(f64, f64)>) = (0.0, None);
            for (a, b) in v.iter().copied() {
                cur = match cur {
                    Some((s, e)) if a <= e => Some((s, e.max(b))),
                    Some((s, e)) => {
                        busy += e - s;
                        Some((a, b))
                    }
                    None => Some((a, b)),
                };
            }
            if let Some((s, e)) = cur {
                busy += e - s;
            }
            GpuUse {
                gpu,
                ops: v.len(),
                busy_ms: busy,
                utilization: ratio(busy, ev.makespan_ms).min(1.0),
            }
        })
        .collect()
}

fn simulate(cmd: SimulateCmd<'_>) -> Result<()> {
    let g = opsched::load_model(cmd.spec, &cmd.model_args.zoo_config()).map_err(user)?;
    let s = if cmd.schedule == "ios" && !Path::new(cmd.schedule).is_file() {
        schedule_io::from_ios_stages(&g).ok_or_else(|| {
            user(anyhow::anyhow!(
                "{}: the graph carries no IOS stages (an IOS graph file with \"stages\" on every block is needed for `ios`)",
                cmd.spec
            ))
        })?
    } else {
        schedule_io::load(&g, cmd.schedule).map_err(user)?
    };
    let needed = opsched::schedule_gpus(&s).max(1);
    let gpus = cmd.gpus.unwrap_or(needed);
    if gpus < needed {
        return Err(user(anyhow::anyhow!(
            "{}: the schedule uses {needed} GPUs but --gpus is {gpus}",
            cmd.schedule
        )));
    }
    let streams = cmd.streams.unwrap_or_else(|| opsched::schedule_streams(&s));
    let su = setup(&g, cmd.platform)?;
    let platform = Platform {
        gpus,
        streams,
        device: su.device.clone(),
        link: su.link.clone(),
    };
    opsched::schedule::validate(&g, &s, &platform)
        .map_err(|e| user(anyhow::anyhow!("{}: {e}", cmd.schedule)))?;
    let ev = evaluate(&g, &s, su.cost.as_ref(), gpus)?;
    write_exports(
        &g,
        &ev,
        cmd.exports,
        &format!(
            "{}: {} on {} x {} ({})",
            g.name,
            cmd.schedule,
            gpus,
            su.device.name,
            su.cost.name()
        ),
    )?;
    let r = SimulateReport {
        model: g.name.clone(),
        ops: g.op_count(),
        schedule: cmd.schedule.to_string(),
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
    let mut out = std::io::stdout().lock();
    if cmd.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?;
        return Ok(());
    }
    writeln!(out, "model          {} ({} operators)", r.model, r.ops)?;
    writeln!(out, "schedule       {} ({})", r.schedule, describe(&s))?;
    writeln!(
        out,
        "platform       {} x {}, {} stream{} per GPU, {}",
        r.gpus,
        r.device,
        r.streams,
        if r.streams == 1 { "" } else { "s" },
        r.link
    )?;
    writeln!(out, "cost model     {}", r.cost_model)?;
    writeln!(out, "makespan       {:.4} ms", r.makespan_ms)?;
    writeln!(
        out,
        "lower bound    {:.4} ms (critical path {:.4} ms, capacity {:.4} ms; makespan is {:.3}x)",
        r.lower_bound_ms, r.critical_path_ms, r.capacity_ms, r.gap
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
