//! `opsched`: the command-line tool. Thin: parse arguments, call the facade, print.
//!
//! Exit codes: 0 success, 2 user error (bad arguments, bad input file, unknown model, an output
//! file that cannot be written), 1 anything else. Progress bars go to stderr on a terminal only;
//! written files and the libraries' warnings are reported on stderr (see [`output`]); `RUST_LOG`
//! controls the `tracing` output (also on stderr).

mod args;
mod commands;
mod common;
mod error;
mod help;
mod output;
mod progress;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use commands::{compare, gpu, inspect, schedule, simulate, viz};
use error::UserError;

#[derive(Parser, Debug)]
#[command(
    name = "opsched",
    version,
    about = "Inter-operator scheduling for DNN inference on one or more GPUs",
    after_help = "Defaults: device h100, analytical cost model, 1 GPU, 8 streams, batch 1.\n\n\
Examples:\n  opsched models\n  opsched inspect inception_v3\n  opsched compare inception_v3\n  \
opsched compare nasnet --device v100 --md nasnet.md\n  \
opsched schedule inception_v3 --algo ios --out s.json\n  \
opsched simulate inception_v3 s.json --svg gantt.svg\n  \
opsched viz inception_v3 --algo ios --out inception.html\n\n\
RUST_LOG=debug shows what the tool does."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Do not report the files written (`wrote x.svg (12 kB)` on stderr).
    #[arg(long, short, global = true)]
    quiet: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the zoo models with their operator and edge counts.
    Models(inspect::ModelsArgs),
    /// Show what a model contains: operators, edges, FLOPs, parameters, depth and width.
    Inspect(inspect::InspectArgs),
    /// Find a schedule with one algorithm and evaluate it on the simulator.
    Schedule(schedule::ScheduleArgs),
    /// Run several algorithms on one model and compare them on the simulator.
    Compare(compare::CompareArgs),
    /// Simulate a schedule file: makespan, lower bound, per-GPU busy time.
    Simulate(simulate::SimulateArgs),
    /// Draw a schedule's simulated timeline: SVG Gantt chart, Chrome trace or HTML page.
    Viz(viz::VizArgs),
    /// Measure operator and stage costs on this machine's GPUs into the cost cache.
    Profile(gpu::ProfileArgs),
    /// Execute a schedule on the GPU and measure its latency.
    Run(gpu::RunArgs),
}

fn main() -> ExitCode {
    init_tracing();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Help and version print as clap renders them; a usage error is one `error:` line
        // (clap's usage and tip lines are left to --help).
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // The first paragraph (the message and, e.g., the missing arguments) on one line.
            let text = e.render().to_string();
            let para: Vec<&str> = text
                .lines()
                .map(str::trim)
                .skip_while(|l| l.is_empty())
                .take_while(|l| !l.is_empty())
                .collect();
            eprintln!("{}", para.join(" "));
            return ExitCode::from(2);
        }
    };
    output::set_quiet(cli.quiet);
    match run(&cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`opsched ... | head`) is the reader's choice, not an error.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", error::one_line(&e));
            if e.downcast_ref::<UserError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

/// `RUST_LOG` as asked; without it the libraries' warnings, one plain line each.
fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr);
    if std::env::var_os("RUST_LOG").is_some() {
        builder
            .with_env_filter(EnvFilter::from_default_env())
            .init();
    } else {
        builder
            .with_env_filter(EnvFilter::new("warn"))
            .event_format(output::Plain)
            .init();
    }
}

fn run(command: &Command) -> Result<()> {
    match command {
        Command::Models(a) => inspect::models(a),
        Command::Inspect(a) => inspect::inspect(a),
        Command::Schedule(a) => schedule::schedule(a),
        Command::Compare(a) => compare::compare(a),
        Command::Simulate(a) => simulate::simulate(a),
        Command::Viz(a) => viz::viz(a),
        Command::Profile(a) => gpu::profile(a),
        Command::Run(a) => gpu::run(a),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
