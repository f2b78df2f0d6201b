//! `cargo xtask gpu-test` and `cargo xtask profile`: the GPU-only parts.

use std::path::PathBuf;

use anyhow::{Context, Result};
use opsched::graph::DType;
use opsched::zoo::ZooConfig;

/// Fail early, with the backend's message, when no GPU is usable.
fn require_gpu(what: &str) -> Result<()> {
    opsched_gpu::check_libraries(opsched_gpu::REQUIRED)
        .and_then(|()| opsched_gpu::devices().map(|_| ()))
        .map_err(|e| anyhow::anyhow!("{what} needs a CUDA GPU: {e}"))
}

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Runs `cargo test -p opsched-gpu -p opsched-runtime -p opsched-profiler \
-- --ignored [TEST_ARGS]`.\n\nExamples:\n  cargo xtask gpu-test\n  cargo xtask gpu-test -- --nocapture"
)]
pub struct GpuTestArgs {
    /// Passed on to the test binaries (after `--ignored`).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "TEST_ARGS"
    )]
    test_args: Vec<String>,
}

/// Run the ignored GPU tests of the GPU crates (extra arguments go to the test binaries).
pub fn gpu_test(args: &GpuTestArgs) -> Result<()> {
    require_gpu("gpu-test")?;
    let mut a: Vec<&str> = vec![
        "test",
        "-p",
        "opsched-gpu",
        "-p",
        "opsched-runtime",
        "-p",
        "opsched-profiler",
        "-p",
        "opsched",
        "--",
        "--ignored",
    ];
    a.extend(args.test_args.iter().map(String::as_str));
    crate::cargo(&a)
}

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Measures each model's operators and the concurrent stages of ALGO's \
schedule (under the analytical model of this GPU's preset, h100 when none matches), fills the \
cost cache and exports the tables to DIR/<device>/<model>-b<batch>/.\n\nExamples:\n  \
cargo xtask profile\n  cargo xtask profile inception_v3 resnet50 --batch 16\n  \
cargo xtask profile nasnet --stages-from none --out target/costs"
)]
pub struct ProfileArgs {
    /// Zoo model names or model files [default: every zoo model].
    #[arg(value_name = "MODEL")]
    models: Vec<String>,
    /// Batch size.
    #[arg(long, value_name = "N", default_value_t = 1)]
    batch: usize,
    /// Scheduler whose concurrent stages to measure, or `none`.
    #[arg(long, value_name = "ALGO", default_value = "ios")]
    stages_from: String,
    /// Cost cache file [default: the user's cache directory].
    #[arg(long, value_name = "PATH")]
    cache: Option<PathBuf>,
    /// Folder of the exported tables.
    #[arg(long, value_name = "DIR", default_value = "fixtures/costs")]
    out: PathBuf,
    /// Timed runs per measurement.
    #[arg(long, value_name = "N", default_value_t = 50)]
    repeats: u32,
}

/// `cargo xtask profile`: see [`ProfileArgs`].
pub fn profile(a: &ProfileArgs) -> Result<()> {
    let ProfileArgs {
        models,
        batch,
        stages_from,
        cache,
        out,
        repeats,
    } = a;
    let (batch, repeats) = (*batch, *repeats);
    if stages_from != "none" {
        // A misspelt scheduler fails before any GPU work.
        opsched::scheduler_info(stages_from)?;
    }
    let models = crate::models_or_zoo(models);
    require_gpu("profile")?;
    let cache = match cache {
        Some(p) => p.clone(),
        None => opsched::cost::cache::default_path()?,
    };
    let info = opsched_gpu::devices()?
        .into_iter()
        .next()
        .context("no device")?;
    let dev = opsched_gpu::CudaDevice::open(Some(1))?;
    for model in &models {
        let g = opsched::load_model(
            model,
            &ZooConfig {
                batch,
                input_size: None,
                dtype: DType::F32,
            },
        )?;
        let (stages, merges) = if stages_from == "none" {
            (Vec::new(), Vec::new())
        } else {
            // Stages as a schedule for this GPU would have them.
            let dev = opsched::cost::DevicePreset::for_device_name(&info.name)
                .map_or_else(|| opsched::cost::DevicePreset::by_name("h100"), Ok)?;
            let link = dev.default_link.clone();
            let cost = opsched::cost::AnalyticalModel::new(dev.clone(), link.clone());
            let p = opsched::schedule::Platform {
                gpus: 1,
                streams: 8,
                device: dev,
                link,
            };
            let s = opsched::scheduler(stages_from)?;
            let (sched, _) = s.schedule(&g, &p, &cost)?;
            (
                opsched_profiler::stages_of(&sched),
                opsched_profiler::merges_of(&sched),
            )
        };
        let opts = opsched_profiler::ProfileOptions {
            repeats,
            stages,
            merges,
            cache: Some(cache.clone()),
            export_dir: Some(out.join(info.slug()).join(format!("{model}-b{batch}"))),
            ..Default::default()
        };
        let r = opsched_profiler::profile(&dev, &g, &opts)?;
        eprintln!(
            "{model}: profiled {} operators, {} stages, {} transfer sizes on {}; {} cache entries in {}",
            r.ops.len(),
            r.stages.len(),
            r.transfers.len(),
            r.device,
            r.cache_entries_written,
            cache.display()
        );
        for f in &r.exported {
            eprintln!("wrote {}", f.display());
        }
    }
    Ok(())
}
