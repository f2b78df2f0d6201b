//! Device and link presets with published figures.

use serde::Serialize;

use crate::CostError;

/// A GPU model's published figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DevicePreset {
    /// Lower-case preset name, e.g. "h100".
    pub name: &'static str,
    /// Marketing name, e.g. "NVIDIA H100 SXM5 80GB".
    pub full_name: &'static str,
    pub sms: u32,
    /// Peak dense FP32 (non-tensor) TFLOP/s.
    pub fp32_tflops: f64,
    /// Peak dense TF32 tensor-core TFLOP/s (0 where the GPU has none).
    pub tf32_tflops: f64,
    /// Peak dense FP16 TFLOP/s (tensor cores where present).
    pub fp16_tflops: f64,
    /// Peak memory bandwidth, GB/s.
    pub mem_bw_gbs: f64,
    /// L2 cache, MiB.
    pub l2_mib: f64,
    /// Kernel launch overhead, microseconds.
    pub launch_us: f64,
    pub max_threads_per_sm: u32,
    pub max_blocks_per_sm: u32,
    pub registers_per_sm: u32,
    /// Shared memory per SM, KiB.
    pub shared_mem_per_sm_kib: u32,
}

/// An interconnect between two GPUs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LinkPreset {
    pub name: &'static str,
    /// Per-transfer latency, microseconds.
    pub latency_us: f64,
    /// Unidirectional bandwidth, GB/s.
    pub bandwidth_gbs: f64,
}

const DEVICES: &[DevicePreset] = &[];
const LINKS: &[LinkPreset] = &[];

impl DevicePreset {
    pub fn all() -> &'static [DevicePreset] {
        DEVICES
    }
    pub fn by_name(name: &str) -> Result<DevicePreset, CostError> {
        let want = name.to_ascii_lowercase();
        DEVICES.iter().find(|d| d.name == want).cloned().ok_or_else(|| CostError::UnknownDevice {
            name: name.into(),
            known: DEVICES.iter().map(|d| d.name).collect::<Vec<_>>().join(", "),
        })
    }
}

impl LinkPreset {
    pub fn all() -> &'static [LinkPreset] {
        LINKS
    }
    pub fn by_name(name: &str) -> Result<LinkPreset, CostError> {
        let want = name.to_ascii_lowercase();
        LINKS.iter().find(|d| d.name == want).cloned().ok_or_else(|| CostError::UnknownLink {
            name: name.into(),
            known: LINKS.iter().map(|d| d.name).collect::<Vec<_>>().join(", "),
        })
    }
}
