//! Flag groups shared by several subcommands, so every command spells them the same way.

use clap::{Args, ValueEnum};
use opsched::graph::DType;
use opsched::zoo::ZooConfig;
use std::path::PathBuf;

use crate::help;

/// Options of the algorithms that take any (defaults are the papers').
#[derive(Args, Debug, Clone)]
pub struct SchedArgs {
    /// IOS: most operators per group (r).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub ios_r: u32,
    /// IOS: most groups per stage (s).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub ios_s: u32,
    /// IOS: most operators per part solved by one dynamic program.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub ios_part: u32,
    /// IOS: search allowed over the whole run, in transitions (10000000) or time (30s, 500ms);
    /// parts left when it runs out are scheduled as waves of ready operators, with a warning.
    #[arg(long, default_value_t = opsched::IosBudget::default(), value_name = "N|TIME", value_parser = parse_budget)]
    pub ios_budget: opsched::IosBudget,
    /// HIOS: window of the intra-GPU parallelization (w).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub window: u32,
    /// Seed of randomized algorithms (the LIOS ablations).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SchedArgs {
    pub fn options(&self) -> opsched::SchedulerOptions {
        opsched::SchedulerOptions {
            ios_r: self.ios_r as usize,
            ios_s: self.ios_s as usize,
            ios_part: self.ios_part as usize,
            ios_budget: self.ios_budget,
            window: self.window as usize,
            seed: self.seed,
        }
    }
}

/// `--gpus`: what a platform can hold ([`opsched::schedule::MAX_GPUS`]).
pub fn gpus_in_range() -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(1..=opsched::schedule::MAX_GPUS as i64)
}

/// `--streams`: what a GPU can run at once ([`opsched::schedule::MAX_STREAMS`]).
pub fn streams_in_range() -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(1..=opsched::schedule::MAX_STREAMS as i64)
}

fn parse_budget(text: &str) -> Result<opsched::IosBudget, String> {
    text.parse()
}

#[derive(Args, Debug, Clone)]
pub struct PlatformArgs {
    /// GPU model preset (h100, h200, a100, v100, ...; --help lists them).
    #[arg(long, default_value = "h100", value_name = "NAME", long_help = help::device())]
    pub device: String,
    /// Interconnect preset between GPUs (default: the device's; --help lists them).
    #[arg(long, value_name = "NAME", long_help = help::link())]
    pub link: Option<String>,
    /// Cost model: analytical, hios-sim, ideal or cache (--help says more).
    #[arg(long, value_name = "KIND", long_help = help::cost())]
    pub cost: Option<String>,
    /// Cost cache file for `--cost cache` (default: the user's cache directory).
    #[arg(long, value_name = "PATH")]
    pub cache: Option<PathBuf>,
    /// Committed profiles for `--cost measured` (default: the repository's fixtures/costs).
    #[arg(long, value_name = "DIR")]
    pub costs: Option<PathBuf>,
    /// Calibrate the analytical model with this device file instead of the committed one
    /// (`fixtures/devices/<device>.json`, written by `cargo xtask calibrate --fit`).
    #[arg(long, value_name = "PATH", conflicts_with = "formulas")]
    pub device_file: Option<PathBuf>,
    /// Use the preset's published figures alone, even where a device file calibrates it.
    #[arg(long)]
    pub formulas: bool,
    /// How the simulated runtime executes a schedule: graph (replayed as one CUDA graph) or
    /// eager (the host issues every launch, at a measured cost per launch).
    #[arg(long, value_enum, default_value_t = ExecArg::Graph)]
    pub exec: ExecArg,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum ExecArg {
    Graph,
    Eager,
}

impl ExecArg {
    pub fn mode(self) -> opsched::schedule::ExecMode {
        match self {
            ExecArg::Graph => opsched::schedule::ExecMode::Graph,
            ExecArg::Eager => opsched::schedule::ExecMode::Eager,
        }
    }
}

/// GPUs and streams of the platform a schedule is searched for.
#[derive(Args, Debug, Clone)]
pub struct TargetArgs {
    /// Number of GPUs (at most 256).
    #[arg(long, default_value_t = 1, value_parser = gpus_in_range())]
    pub gpus: u32,
    /// CUDA streams per GPU (the most operators a GPU runs at once; at most 128).
    #[arg(long, default_value_t = 8, value_parser = streams_in_range())]
    pub streams: u32,
}

#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// Write the simulated timeline as a Chrome trace (chrome://tracing, Perfetto).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Write the simulated timeline as an SVG Gantt chart.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Batch size of zoo models, IOS graph files and ONNX files with a dynamic batch.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,
    /// Image side or sequence length of zoo models (default: the model's own).
    #[arg(long, value_name = "N")]
    pub input_size: Option<usize>,
    /// Element type of zoo models.
    #[arg(long, value_enum, default_value_t = DTypeArg::F32)]
    pub dtype: DTypeArg,
    /// ONNX files: import unsupported operators as opaque operators costed by their tensor
    /// sizes, instead of failing with the list of unsupported operator types.
    #[arg(long)]
    pub allow_unknown: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum DTypeArg {
    F32,
    F16,
}

impl ModelArgs {
    pub fn load_options(&self) -> opsched::LoadOptions {
        opsched::LoadOptions {
            allow_unknown: self.allow_unknown,
            ..Default::default()
        }
    }

    pub fn zoo_config(&self) -> ZooConfig {
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
