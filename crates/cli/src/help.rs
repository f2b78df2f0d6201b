//! Help texts built from the registries (zoo, input formats, schedulers, device and link
//! presets, cost models), so `--help` lists exactly what the tool accepts and cannot go stale.

use opsched::cost::{DevicePreset, LinkPreset};
use opsched::CostKind;

/// `  name   about` lines, the names padded to one column.
fn table<'a>(rows: impl IntoIterator<Item = (&'a str, String)>) -> String {
    let rows: Vec<(&str, String)> = rows.into_iter().collect();
    let width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(name, about)| format!("  {name:<width$}  {about}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The model argument: zoo names and every file format.
pub fn model() -> String {
    let zoo: Vec<&str> = opsched::zoo::models().iter().map(|m| m.name).collect();
    format!(
        "Zoo model name or model file.\n\nZoo models (`opsched models`): {}.\nFiles (an existing \
         file wins over a zoo name; the format is detected):\n{}",
        zoo.join(", "),
        table(
            opsched::input_formats()
                .into_iter()
                .map(|f| (f.name, f.about.to_string()))
        )
    )
}

fn schedulers() -> String {
    table(opsched::schedulers().iter().map(|s| {
        let gpus = if s.multi_gpu { " [several GPUs]" } else { "" };
        (s.name, format!("{}{gpus}", s.about))
    }))
}

/// `--algo`: one scheduler.
pub fn algo() -> String {
    format!("Scheduling algorithm:\n{}", schedulers())
}

/// `opsched run --algo`: one scheduler, or the best of several under the cost model.
pub fn run_algo() -> String {
    format!(
        "Scheduling algorithm:\n{}\n  {:<14} the one of sequential, {} (and {} on several \
         GPUs) whose schedule simulates fastest under the cost model (the default)",
        schedulers(),
        "best",
        opsched::BEST_CANDIDATES.join(", "),
        opsched::BEST_MULTI_GPU.join(", "),
    )
}

/// `--algos`: several schedulers.
pub fn algos() -> String {
    format!(
        "Comma-separated algorithm names, or `all` (every one, in this order):\n{}",
        schedulers()
    )
}

/// `--device`: the GPU presets.
pub fn device() -> String {
    format!(
        "GPU model preset:\n{}",
        table(DevicePreset::all().iter().map(|d| {
            (
                d.name,
                format!("{} (default link {})", d.full_name, d.default_link.name),
            )
        }))
    )
}

/// `--link`: the interconnect presets.
pub fn link() -> String {
    format!(
        "Interconnect preset between GPUs (default: the device preset's, see --device):\n{}",
        table(LinkPreset::all().iter().map(|l| {
            (
                l.name,
                format!("{} GB/s, {} us per transfer", l.bandwidth_gbs, l.latency_us),
            )
        }))
    )
}

/// `--cost`: the cost models.
pub fn cost() -> String {
    format!(
        "Cost model (default: hios-sim for a cost-annotated DAG, analytical otherwise):\n{}",
        table(
            CostKind::ALL
                .iter()
                .map(|k| (k.as_str(), k.about().to_string()))
        )
    )
}
