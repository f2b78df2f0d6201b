//! The measurement format: what a GPU calibration run measures, in one versioned JSON file.
//! `cargo xtask calibrate` writes it on a GPU; `cargo xtask calibrate --fit` fits a device file
//! ([`crate::calibration`]) to it and `cargo xtask fidelity` compares the simulator with it.
//!
//! ```json
//! {
//!   "format": "opsched-measurements", "version": 1,
//!   "preset": "h100", "device_name": "NVIDIA H100 80GB HBM3", "measured_on": "2026-11-22",
//!   "kernels_revision": "9d7608d", "notes": ["..."],
//!   "overheads": [{"what": "graph_kernel", "us": 1.18},
//!                 {"what": "fork_join", "streams": 2, "us": 5.69},
//!                 {"what": "chains", "streams": 2, "us": 1.33},
//!                 {"what": "eager_launch", "us": 11.75}],
//!   "contention": [{"conv": {"in_channels": 768, "size": 17, "out_channels": 192, "kernel": [1, 1]},
//!                   "copies": 4, "alone_us": 10.6, "together_us": 18.7}],
//!   "ops": [{"model": "inception_v3", "batch": 1, "node": "mixed_6a_b3x3", "signature": "...",
//!            "ms": 0.0074}],
//!   "runs": [{"model": "inception_v3", "algorithm": "lios", "batch": 1, "mode": "graph",
//!             "streams": 8, "ms": [1.534, 2.263], "schedule": null}]
//! }
//! ```
//!
//! - `overheads`: `graph_kernel` is the time per kernel of a chain of tiny kernels on one stream
//!   in a CUDA graph; `fork_join` the time per stage of `streams` tiny kernels forked from and
//!   joined into one stream; `chains` the time per step of `streams` independent chains;
//!   `eager_launch` the host time per launch of an eagerly issued tiny kernel; `eager_sync` the
//!   host time of an event record or wait.
//! - `contention`: `copies` copies of one convolution on one `[batch, in_channels, size, size]`
//!   input, run alone and all at once (each on its own stream of one CUDA graph).
//! - `ops`: per-operator times measured on the GPU (CUDA-graph replay timed by events), the
//!   operator named by zoo model, batch and node (`signature` as [`crate::signature`] writes
//!   it, to check that the node is the one measured).
//! - `runs`: whole-model latency (median of one process) per process of `model` scheduled by
//!   `algorithm` at `batch` on `streams` streams, `mode` `graph` (CUDA-graph replay) or `eager`.
//!   `schedule` is the schedule that ran (an `opsched-schedule` file's JSON); when it is null
//!   the schedule is the one `algorithm` searches under the preset's uncalibrated formulas
//!   (what opsched did before device files existed), which is searched again to compare.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::CostError;

/// The `format` of a measurement file.
pub const FORMAT: &str = "opsched-measurements";
/// The newest measurement file version this build reads.
pub const VERSION: u32 = 1;

/// One overhead measurement (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverheadSample {
    pub what: OverheadKind,
    /// Streams of a `fork_join` or `chains` sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<u32>,
    pub us: f64,
}

/// What an overhead sample measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverheadKind {
    GraphKernel,
    ForkJoin,
    Chains,
    EagerLaunch,
    EagerSync,
}

/// A convolution on a square input (a contention sample's operator).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConvSpec {
    pub in_channels: usize,
    /// Input height and width.
    pub size: usize,
    pub out_channels: usize,
    pub kernel: [usize; 2],
    #[serde(default = "one")]
    pub batch: usize,
}

fn one() -> usize {
    1
}

/// Copies of one convolution, alone and all at once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContentionSample {
    pub conv: ConvSpec,
    pub copies: u32,
    pub alone_us: f64,
    pub together_us: f64,
}

/// One operator's GPU time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpSample {
    pub model: String,
    pub batch: usize,
    pub node: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signature: String,
    pub ms: f64,
}

/// How a run executed its schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunMode {
    Graph,
    Eager,
}

/// One model x algorithm x batch x mode: its latency in each process that measured it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSample {
    pub model: String,
    pub algorithm: String,
    pub batch: usize,
    pub mode: RunMode,
    #[serde(default = "eight")]
    pub streams: usize,
    /// Median latency of each process, ms.
    pub ms: Vec<f64>,
    /// The schedule that ran (`opsched-schedule` JSON), if recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<serde_json::Value>,
}

fn eight() -> usize {
    8
}

impl RunSample {
    /// The fastest process: the one whose kernels (cuDNN's per-process algorithm choice) did
    /// best, which is what a calibration should describe.
    pub fn best_ms(&self) -> f64 {
        self.ms.iter().copied().fold(f64::INFINITY, f64::min)
    }
}

/// A calibration run's measurements (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measurements {
    pub format: String,
    pub version: u32,
    /// The preset the measured GPU is (e.g. "h100").
    pub preset: String,
    pub device_name: String,
    /// YYYY-MM-DD.
    pub measured_on: String,
    /// The git revision of the kernels that ran.
    pub kernels_revision: String,
    #[serde(default)]
    pub notes: Vec<String>,
    #[serde(default)]
    pub overheads: Vec<OverheadSample>,
    #[serde(default)]
    pub contention: Vec<ContentionSample>,
    #[serde(default)]
    pub ops: Vec<OpSample>,
    #[serde(default)]
    pub runs: Vec<RunSample>,
}

fn positive(field: &str, x: f64) -> Result<(), String> {
    if x.is_finite() && x > 0.0 {
        Ok(())
    } else {
        Err(format!("{field}: {x} must be a positive number"))
    }
}

impl Measurements {
    /// An empty file for `preset`.
    pub fn new(preset: &str, device_name: &str, measured_on: &str, revision: &str) -> Self {
        Measurements {
            format: FORMAT.into(),
            version: VERSION,
            preset: preset.into(),
            device_name: device_name.into(),
            measured_on: measured_on.into(),
            kernels_revision: revision.into(),
            notes: Vec::new(),
            overheads: Vec::new(),
            contention: Vec::new(),
            ops: Vec::new(),
            runs: Vec::new(),
        }
    }

    /// Parse and check; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<Self, CostError> {
        crate::calibration::parse_versioned(text, origin, FORMAT, VERSION, Measurements::check)
    }

    /// Read and check a measurement file.
    pub fn load(path: &Path) -> Result<Self, CostError> {
        Self::parse(&crate::calibration::read_text(path)?, path)
    }

    /// Pretty JSON (what [`Measurements::parse`] reads).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| {
            tracing::error!("measurements: cannot serialize: {e}");
            String::new()
        }) + "\n"
    }

    /// Why the measurements cannot be used, naming the entry.
    pub fn check(&self) -> Result<(), String> {
        for (i, o) in self.overheads.iter().enumerate() {
            positive(&format!("overheads[{i}].us"), o.us)?;
            let needs = matches!(o.what, OverheadKind::ForkJoin | OverheadKind::Chains);
            if needs && o.streams.is_none_or(|s| s < 2) {
                return Err(format!("overheads[{i}]: needs streams (at least 2)"));
            }
        }
        for (i, c) in self.contention.iter().enumerate() {
            positive(&format!("contention[{i}].alone_us"), c.alone_us)?;
            positive(&format!("contention[{i}].together_us"), c.together_us)?;
            let k = &c.conv;
            if c.copies < 2
                || [
                    k.in_channels,
                    k.size,
                    k.out_channels,
                    k.kernel[0],
                    k.kernel[1],
                    k.batch,
                ]
                .iter()
                .any(|&d| d == 0 || d > 1 << 20)
            {
                return Err(format!(
                    "contention[{i}]: needs at least 2 copies and sizes in 1..2^20"
                ));
            }
        }
        for (i, o) in self.ops.iter().enumerate() {
            positive(&format!("ops[{i}].ms"), o.ms)?;
        }
        for (i, r) in self.runs.iter().enumerate() {
            if r.ms.is_empty() {
                return Err(format!("runs[{i}].ms: needs at least one process"));
            }
            for (j, &ms) in r.ms.iter().enumerate() {
                positive(&format!("runs[{i}].ms[{j}]"), ms)?;
            }
            if r.batch == 0 || r.streams == 0 {
                return Err(format!("runs[{i}]: batch and streams must be at least 1"));
            }
        }
        Ok(())
    }
}
