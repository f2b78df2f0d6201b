//! `cargo xtask gpu-test` and `cargo xtask profile`: the GPU-only parts.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use opsched::graph::DType;
use opsched::zoo::ZooConfig;

/// Fail early, with the backend's message, when no GPU is usable.
fn require_gpu(what: &str) -> Result<()> {
    opsched_gpu::check_libraries(opsched_gpu::REQUIRED)
        .and_then(|()| opsched_gpu::devices().map(|_| ()))
        .map_err(|e| anyhow::anyhow!("{what} needs a CUDA GPU: {e}"))
}

/// Run the ignored GPU tests of the GPU crates (extra arguments go to the test binaries).
pub fn gpu_test(args: &[String]) -> Result<()> {
    require_gpu("gpu-test")?;
    let mut a: Vec<&str> = vec![
        "test",
        "-p",
        "opsched-gpu",
        "-p",
        "opsched-runtime",
        "-p",
        "opsched-profiler",
        "--",
        "--ignored",
    ];
    a.extend(args.iter().map(String::as_str));
    crate::cargo(&a)
}

/// `cargo xtask profile [MODEL ...] [--batch N] [--stages-from ALGO|none] [--cache PATH]
/// [--out DIR] [--repeats N]`: measure each model's operators (default: every zoo model) and
/// the concurrent stages of ALGO's schedule (default ios) under the analytical model of this
/// GPU's preset (h100 when none matches), fill the
/// cost cache (default location unless --cache), and export the tables to
/// DIR/<device>/<model>-b<batch>/ (default DIR: fixtures/costs).
pub fn profile(args: &[String]) -> Result<()> {
    let mut models = Vec::new();
    let mut batch = 1usize;
    let mut stages_from = String::from("ios");
    let mut cache: Option<PathBuf> = None;
    let mut out = PathBuf::from("fixtures/costs");
    let mut repeats = 50u32;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--batch" => batch = val()?.parse().context("--batch")?,
            "--stages-from" => stages_from = val()?.clone(),
            "--cache" => cache = Some(PathBuf::from(val()?)),
            "--out" => out = PathBuf::from(val()?),
            "--repeats" => repeats = val()?.parse().context("--repeats")?,
            s if !s.starts_with("--") => models.push(s.to_string()),
            other => bail!("profile: unknown argument '{other}'; usage: cargo xtask profile [MODEL ...] [--batch N] [--stages-from ALGO|none] [--cache PATH] [--out DIR] [--repeats N]"),
        }
    }
    if models.is_empty() {
        models = opsched::zoo::models()
            .iter()
            .map(|m| m.name.to_string())
            .collect();
    }
    require_gpu("profile")?;
    let cache = match cache {
        Some(p) => p,
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
        let stages = if stages_from == "none" {
            Vec::new()
        } else {
            // Stages as a schedule for this GPU would have them.
            let dev = opsched::cost::DevicePreset::for_device_name(&info.name)
                .map_or_else(|| opsched::cost::DevicePreset::by_name("h100"), Ok)?;
            let link = opsched::cost::LinkPreset::by_name("nvlink4")?;
            let cost = opsched::cost::AnalyticalModel::new(dev.clone(), link.clone());
            let p = opsched::schedule::Platform {
                gpus: 1,
                streams: 8,
                device: dev,
                link,
            };
            let s = opsched::scheduler(&stages_from)?;
            let (sched, _) = s.schedule(&g, &p, &cost)?;
            opsched_profiler::stages_of(&sched)
        };
        let opts = opsched_profiler::ProfileOptions {
            repeats,
            stages,
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
