//! Device files: a preset's parameters fitted to measurements on a real GPU.
//!
//! The analytical model computes times from published figures ([`crate::device`]). A device
//! file replaces its guesses by what a GPU was measured to do: the execution overheads
//! (per-kernel launch floor, event record and wait latency, eager host cost per launch), the
//! contention law (how much of the GPU a kernel really fills, the interference penalty) and the
//! efficiency of each operator class as a curve over the operator's work. `cargo xtask
//! calibrate --fit` writes it; [`DeviceFile::embedded`] holds the committed ones (compiled in, so
//! users need no files), and [`DeviceFile::load`] reads another (`--device-file PATH`).
//!
//! ```json
//! {
//!   "format": "opsched-device", "version": 1, "preset": "h100",
//!   "provenance": {"measurements": ["fixtures/gpu/h100-2026-11-27c/measurements.json"],
//!                  "measured_on": "2026-11-27", "device_name": "NVIDIA H100 80GB HBM3",
//!                  "kernels_revision": "9d7608d", "fitted_with": "cargo xtask calibrate --fit ...",
//!                  "notes": ["..."]},
//!   "overheads": {"kernel_launch_us": 1.18, "event_record_us": 1.93, "event_wait_us": 0.3,
//!                 "eager_launch_us": 11.75, "eager_sync_us": 2.0},
//!   "contention": {"share_exponent": 0.5, "alpha": 0.1, "alpha_cap": 2.0},
//!   "efficiency": {"conv": {"curve": [[1e6, 0.05], [1e9, 0.3]], "latency_us": 4.0},
//!                  "matmul": {"curve": [[1e8, 0.4]], "latency_us": 2.0},
//!                  "depthwise": {"curve": [[1e6, 0.02]], "latency_us": 3.0},
//!                  "elementwise": {"curve": [[1e6, 0.5]], "latency_us": 1.0},
//!                  "memory": 0.6, "fill_exponent": 0.5}
//! }
//! ```
//!
//! Each kernel family has an efficiency curve and a fixed latency. The curve is a list of
//! `[flops, efficiency]` points, sorted by FLOPs: the share of the FP32 peak a kernel of that
//! family reaches, interpolated linearly in `log(flops)` and constant beyond the end points (one
//! point: a constant). `latency_us` is what every kernel of the family takes on top of its
//! roofline time whatever its size (prologue, a last partial wave, the library's helper
//! kernels): it is what makes small kernels at batch 1 slow without making large ones slow.
//! `memory` is the share of the datasheet bandwidth a streaming kernel reaches; `fill_exponent`
//! how much faster than its tiles say a small kernel runs alone, `contention.share_exponent` how
//! much of the GPU it holds against others. Every field is required; unknown fields are
//! refused, so a typo cannot silently keep a default.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::CostError;

/// The `format` of a device file.
pub const FORMAT: &str = "opsched-device";
/// The newest device file version this build reads.
pub const VERSION: u32 = 1;

/// The committed device files, compiled in: (preset, JSON text).
const EMBEDDED: &[(&str, &str)] = &[("h100", include_str!("../../../fixtures/devices/h100.json"))];

/// Execution overheads measured on a GPU, in microseconds. All zero for an uncalibrated preset
/// (the formulas then charge the preset's `launch_us` inside each kernel instead).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overheads {
    /// GPU time between two dependent kernels of one stream in a CUDA graph: charged once per
    /// kernel launch ([`crate::launches::launches`]) inside the operator's time.
    pub kernel_launch_us: f64,
    /// From an event's record until a stream waiting for it may go on (a cross-stream
    /// dependency of a CUDA graph).
    pub event_record_us: f64,
    /// What one wait costs the waiting stream (a stage's join waits once per joined stream).
    pub event_wait_us: f64,
    /// Host time to issue one kernel launch in eager mode.
    pub eager_launch_us: f64,
    /// Host time to issue one event record or wait in eager mode.
    pub eager_sync_us: f64,
}

impl Overheads {
    /// What a concurrent stage of `streams` groups pays for its fork and join in a CUDA graph
    /// beside its operators' time, ms: two event records (the fork's and the join's, each
    /// visible `event_record_us` after) and a wait per stream (each forked stream waits once,
    /// the origin stream once for every other), `2 r + n w`: the simulator's events for such a
    /// stage, and what the fit reads from the fork/join samples. Nothing for one stream. The
    /// stage-pricing schedulers (IOS's and IOPS's dynamic programs) add it to a stage's time.
    pub fn fork_join_ms(&self, streams: usize) -> f64 {
        if streams < 2 {
            return 0.0;
        }
        let us = 2.0 * self.event_record_us + streams as f64 * self.event_wait_us;
        us.max(0.0) / 1e3
    }
}

/// The contention law's parameters (see [`crate::analytical`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contention {
    /// Against other kernels, a kernel whose tiles fill a share `s` of the SMs holds
    /// `s^share_exponent` of the GPU (in (0, 1]): concurrent kernels slow each other down more
    /// than their tiles say (caches, memory, the block scheduler).
    pub share_exponent: f64,
    /// Interference: extra slowdown per unit of oversubscription.
    pub alpha: f64,
    /// Cap on the oversubscription the interference term counts.
    pub alpha_cap: f64,
}

/// Efficiency as a function of an operator's FLOPs: `[flops, efficiency]` points.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Curve(pub Vec<[f64; 2]>);

impl Curve {
    /// A constant efficiency.
    pub fn constant(e: f64) -> Self {
        Curve(vec![[1.0, e]])
    }

    /// The efficiency at `flops` (interpolated in `log(flops)`, constant beyond the ends).
    pub fn at(&self, flops: f64) -> f64 {
        let pts = &self.0;
        let (Some(first), Some(last)) = (pts.first(), pts.last()) else {
            return 1.0;
        };
        if flops <= first[0] {
            return first[1];
        }
        if flops >= last[0] {
            return last[1];
        }
        let x = flops.ln();
        for w in pts.windows(2) {
            let ([x0, y0], [x1, y1]) = (w[0], w[1]);
            if flops <= x1 {
                let (l0, l1) = (x0.ln(), x1.ln());
                let f = if l1 > l0 { (x - l0) / (l1 - l0) } else { 1.0 };
                return y0 + f * (y1 - y0);
            }
        }
        last[1]
    }

    /// Every efficiency multiplied by `k`.
    pub fn scaled(&self, k: f64) -> Self {
        Curve(self.0.iter().map(|&[f, e]| [f, e * k]).collect())
    }

    fn check(&self, field: &str) -> Result<(), String> {
        if self.0.is_empty() {
            return Err(format!(
                "{field}: needs at least one [flops, efficiency] point"
            ));
        }
        let mut prev = 0.0;
        for (i, &[f, e]) in self.0.iter().enumerate() {
            if !(f.is_finite() && f > prev) {
                return Err(format!(
                    "{field}[{i}]: flops {f} must be finite, positive and increasing"
                ));
            }
            check_range(&format!("{field}[{i}] efficiency"), e, 1e-6, 100.0)?;
            prev = f;
        }
        Ok(())
    }
}

/// One kernel family's efficiency curve and fixed latency.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Family {
    pub curve: Curve,
    pub latency_us: f64,
}

impl Family {
    fn check(&self, field: &str) -> Result<(), String> {
        self.curve.check(&format!("{field}.curve"))?;
        check_range(&format!("{field}.latency_us"), self.latency_us, 0.0, 1e6)
    }
}

/// Each kernel family's efficiency (the share of the FP32 peak it reaches) and latency, and the
/// share of the datasheet bandwidth streaming kernels reach.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Efficiency {
    /// Convolutions as implicit GEMMs (cuDNN).
    pub conv: Family,
    /// Linear layers and batched matrix products (cuBLAS).
    pub matmul: Family,
    /// Depthwise convolutions.
    pub depthwise: Family,
    /// Element-wise, pooling, normalization and copy kernels.
    pub elementwise: Family,
    /// Share of the datasheet memory bandwidth a streaming kernel reaches.
    pub memory: f64,
    /// A kernel whose tiles fill a share `s` of the SMs computes alone at `s^fill_exponent` of
    /// the peak (in (0, 1]): libraries split small GEMMs along K and pick smaller tiles, so
    /// small kernels run faster than one tile per block says.
    pub fill_exponent: f64,
}

/// Where a device file's numbers come from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// The measurement files the fit read (paths relative to the repository).
    pub measurements: Vec<String>,
    /// Date of the measurements (YYYY-MM-DD).
    pub measured_on: String,
    /// The driver's name of the GPU measured.
    pub device_name: String,
    /// The git revision of the kernels that ran (times belong to those kernels).
    pub kernels_revision: String,
    /// The command that wrote the file.
    pub fitted_with: String,
    /// Anything a reader must know (what the fit could and could not do).
    #[serde(default)]
    pub notes: Vec<String>,
}

/// A preset's calibrated parameters (see the module docs for the format).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceFile {
    pub format: String,
    pub version: u32,
    /// The preset it calibrates (e.g. "h100").
    pub preset: String,
    pub provenance: Provenance,
    pub overheads: Overheads,
    pub contention: Contention,
    pub efficiency: Efficiency,
}

fn check_range(field: &str, x: f64, lo: f64, hi: f64) -> Result<(), String> {
    if x.is_finite() && x >= lo && x <= hi {
        Ok(())
    } else {
        Err(format!("{field}: {x} is outside [{lo}, {hi}]"))
    }
}

/// Parse a JSON file of `format` (versions 1 to `version`) and check it; errors name `origin`
/// and the field. The format and version are read first, so a file of another kind or a newer
/// version says so instead of failing on its first unknown field.
pub(crate) fn parse_versioned<T: serde::de::DeserializeOwned>(
    text: &str,
    origin: &Path,
    format: &str,
    version: u32,
    check: impl Fn(&T) -> Result<(), String>,
) -> Result<T, CostError> {
    let err = |message: String| CostError::Calibration {
        path: origin.to_path_buf(),
        message,
    };
    let head: serde_json::Value = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
    match head.get("format").and_then(|f| f.as_str()) {
        Some(f) if f == format => {}
        other => {
            return Err(err(format!(
                "format: expected \"{format}\", found {}",
                other.map_or("nothing".into(), |f| format!("\"{f}\""))
            )))
        }
    }
    match head.get("version").and_then(serde_json::Value::as_u64) {
        Some(v) if v >= 1 && v <= u64::from(version) => {}
        Some(v) => {
            return Err(err(format!(
                "version {v} is not supported (this build reads 1 to {version})"
            )))
        }
        None => return Err(err("version: missing or not a number".into())),
    }
    let value: T = serde_json::from_value(head).map_err(|e| err(e.to_string()))?;
    check(&value).map_err(err)?;
    Ok(value)
}

/// A file's text, or an error naming it.
pub(crate) fn read_text(path: &Path) -> Result<String, CostError> {
    std::fs::read_to_string(path).map_err(|source| CostError::Io {
        path: path.to_path_buf(),
        source,
    })
}

impl DeviceFile {
    /// Parse and check a device file's text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<Self, CostError> {
        parse_versioned(text, origin, FORMAT, VERSION, DeviceFile::check)
    }

    /// Read and check a device file.
    pub fn load(path: &Path) -> Result<Self, CostError> {
        Self::parse(&read_text(path)?, path)
    }

    /// The committed device file of `preset`, if there is one.
    pub fn embedded(preset: &str) -> Option<Self> {
        let (_, text) = EMBEDDED.iter().find(|(p, _)| *p == preset)?;
        let origin = Path::new("fixtures/devices").join(format!("{preset}.json"));
        match Self::parse(text, &origin) {
            Ok(f) => Some(f),
            Err(e) => {
                // A test parses every embedded file, so this is a build that skipped the tests.
                tracing::error!("embedded device file: {e}");
                None
            }
        }
    }

    /// Presets that have an embedded device file.
    pub fn embedded_presets() -> impl Iterator<Item = &'static str> {
        EMBEDDED.iter().map(|(p, _)| *p)
    }

    /// The file as pretty JSON (what [`DeviceFile::parse`] reads).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| {
            // Plain data; serialization cannot fail short of a serde_json bug.
            tracing::error!("device file: cannot serialize: {e}");
            String::new()
        }) + "\n"
    }

    /// Why the parameters cannot be used, naming the field.
    pub fn check(&self) -> Result<(), String> {
        if crate::DevicePreset::by_name(&self.preset).is_err() {
            return Err(format!("preset: unknown preset '{}'", self.preset));
        }
        let o = &self.overheads;
        for (field, x) in [
            ("overheads.kernel_launch_us", o.kernel_launch_us),
            ("overheads.event_record_us", o.event_record_us),
            ("overheads.event_wait_us", o.event_wait_us),
            ("overheads.eager_launch_us", o.eager_launch_us),
            ("overheads.eager_sync_us", o.eager_sync_us),
        ] {
            check_range(field, x, 0.0, 1e6)?;
        }
        let c = &self.contention;
        check_range("contention.share_exponent", c.share_exponent, 1e-3, 1.0)?;
        check_range(
            "efficiency.fill_exponent",
            self.efficiency.fill_exponent,
            1e-3,
            1.0,
        )?;
        check_range("contention.alpha", c.alpha, 0.0, 100.0)?;
        check_range("contention.alpha_cap", c.alpha_cap, 0.0, 1e6)?;
        let e = &self.efficiency;
        e.conv.check("efficiency.conv")?;
        e.matmul.check("efficiency.matmul")?;
        e.depthwise.check("efficiency.depthwise")?;
        e.elementwise.check("efficiency.elementwise")?;
        check_range("efficiency.memory", e.memory, 1e-6, 1.0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_embedded_file_parses_and_names_its_preset() {
        for p in DeviceFile::embedded_presets() {
            let f = DeviceFile::embedded(p).unwrap();
            assert_eq!(f.preset, p);
            let again = DeviceFile::parse(&f.to_json(), Path::new("x")).unwrap();
            assert_eq!(again, f);
        }
    }

    #[test]
    fn curves_interpolate_in_log_flops_and_clamp() {
        let c = Curve(vec![[1e6, 0.1], [1e8, 0.5]]);
        assert_eq!(c.at(1.0), 0.1);
        assert_eq!(c.at(1e12), 0.5);
        assert!((c.at(1e7) - 0.3).abs() < 1e-12);
        assert_eq!(Curve::constant(0.4).at(123.0), 0.4);
    }

    #[test]
    fn bad_files_name_the_file_and_the_field() {
        let f = DeviceFile::embedded("h100").unwrap();
        let path = Path::new("dev.json");
        let mut v: serde_json::Value = serde_json::from_str(&f.to_json()).unwrap();
        v["contention"]["share_exponent"] = serde_json::json!(0.0);
        let e = DeviceFile::parse(&v.to_string(), path)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("dev.json: contention.share_exponent"), "{e}");
        v["contention"]["share_exponent"] = serde_json::json!(0.5);
        v["efficiency"]["conv"]["curve"] = serde_json::json!([[1e6, 0.1], [1e5, 0.2]]);
        let e = DeviceFile::parse(&v.to_string(), path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("efficiency.conv.curve[1]"), "{e}");
        v["version"] = serde_json::json!(9);
        let e = DeviceFile::parse(&v.to_string(), path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("version 9"), "{e}");
        let e = DeviceFile::parse("{\"format\": \"x\"}", path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("format"), "{e}");
        let mut v: serde_json::Value = serde_json::from_str(&f.to_json()).unwrap();
        v["overheads"]["launch_us"] = serde_json::json!(1.0);
        let e = DeviceFile::parse(&v.to_string(), path)
            .unwrap_err()
            .to_string();
        assert!(e.contains("launch_us"), "{e}");
    }
}
