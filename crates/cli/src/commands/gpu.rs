//! `opsched profile` and `opsched run`: the commands that need a GPU.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::args::{ModelArgs, SchedArgs, TargetArgs};

#[derive(Args, Debug)]
#[command(
    after_help = "Measures every operator alone and the concurrent stages the schedulers ask \
for on the GPUs of this machine, and stores them in the cost cache, keyed by the device, so a \
later `--cost cache` (on any machine) schedules with measured costs.\n\nExamples:\n  \
opsched profile inception_v3\n  opsched profile inception_v3 resnet50 --batch 16 --json"
)]
pub struct ProfileArgs {
    /// Zoo model names or graph files (default: every zoo model).
    models: Vec<String>,
    #[command(flatten)]
    model_args: ModelArgs,
    /// Cost cache file (default: the user's cache directory).
    #[arg(long, value_name = "PATH")]
    cache: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Runs the schedule on the GPU: buffers allocated first, warm-up, then timed \
repetitions (median, p10, p90), and a numerical check against a sequential run.\n\nExamples:\n  \
opsched run inception_v3 --algo ios\n  opsched run resnet50 --algo opara --graph-capture --json\n  \
opsched run nasnet --algo hios-lp --gpus 2"
)]
pub struct RunArgs {
    /// Zoo model name or graph file.
    model: String,
    /// Scheduling algorithm.
    #[arg(long, value_name = "NAME")]
    algo: String,
    /// Capture the whole plan as one CUDA graph and replay it.
    #[arg(long)]
    graph_capture: bool,
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    model_args: ModelArgs,
    #[command(flatten)]
    sched: SchedArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn needs_gpu(command: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "`opsched {command}` needs a GPU, and this build has no GPU backend yet; \
`opsched compare` and `opsched schedule` work without one on the analytical cost model"
    )
}

pub fn profile(a: &ProfileArgs) -> Result<()> {
    tracing::debug!(models = ?a.models, batch = a.model_args.batch, cache = ?a.cache, json = a.json, "profile");
    Err(needs_gpu("profile"))
}

pub fn run(a: &RunArgs) -> Result<()> {
    tracing::debug!(model = %a.model, algo = %a.algo, graph_capture = a.graph_capture, gpus = a.target.gpus, ios_part = a.sched.ios_part, json = a.json, "run");
    Err(needs_gpu("run"))
}
