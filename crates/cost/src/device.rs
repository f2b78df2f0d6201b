//! Device and link presets with published figures.

use opsched_graph::names::{self, Known};
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
    /// The interconnect between two such GPUs in the usual server: the default `--link`.
    pub default_link: LinkPreset,
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

// Sources. Compute, memory and L2 figures are NVIDIA's published peaks (datasheets and
// architecture whitepapers: Tesla K80 board spec and Kepler GK110/GK210 whitepaper; Tesla V100
// datasheet and Volta whitepaper; A100 datasheet (SXM4 80GB) and Ampere GA100 whitepaper; A40
// datasheet and Ampere GA102 whitepaper; Turing TU102 whitepaper (RTX 2080 Ti reference
// clocks); GA102 whitepaper (RTX 3080 10GB); H100 datasheet (SXM5) and Hopper whitepaper; H200
// product brief). TF32/FP16 tensor figures are dense (no 2:4 sparsity). GeForce FP16 and TF32
// figures are those with FP32 accumulation (half of the FP16-accumulate rate on those boards),
// which is what cuDNN uses for FP16 convolutions in PyTorch. Per-SM limits (threads, blocks,
// 32-bit registers, shared memory) are the compute-capability tables of the CUDA C++
// Programming Guide: 3.7 (K80), 7.0 (V100), 7.5 (Turing), 8.0 (A100), 8.6 (A40, RTX 3080),
// 9.0 (H100, H200). Launch overhead is the usual measured range for a kernel launch on the
// default stream (3-5 us; older drivers and PCIe-attached Kepler boards a little more).

/// NVIDIA Tesla K80, one GK210 die (a K80 board carries two, seen as two GPUs). Boost clock
/// 875 MHz: 2496 cores x 2 x 0.875 GHz = 4.37 TFLOP/s FP32; no fast FP16 (it runs at the FP32
/// rate); 480 GB/s and 3 MiB L2 per board, half each per die.
pub const K80: DevicePreset = DevicePreset {
    name: "k80",
    full_name: "NVIDIA Tesla K80 (one GK210 die)",
    sms: 13,
    fp32_tflops: 4.37,
    tf32_tflops: 0.0,
    fp16_tflops: 4.37,
    mem_bw_gbs: 240.0,
    l2_mib: 1.5,
    launch_us: 8.0,
    max_threads_per_sm: 2048,
    max_blocks_per_sm: 16,
    registers_per_sm: 131_072,
    shared_mem_per_sm_kib: 112,
    // A PCIe 3.0 board with no NVLink.
    default_link: PCIE3,
};

/// NVIDIA Tesla V100 SXM2 (16 and 32 GB have the same figures).
pub const V100: DevicePreset = DevicePreset {
    name: "v100",
    full_name: "NVIDIA Tesla V100 SXM2 16/32GB",
    sms: 80,
    fp32_tflops: 15.7,
    tf32_tflops: 0.0,
    fp16_tflops: 125.0,
    mem_bw_gbs: 900.0,
    l2_mib: 6.0,
    launch_us: 5.0,
    max_threads_per_sm: 2048,
    max_blocks_per_sm: 32,
    registers_per_sm: 65_536,
    shared_mem_per_sm_kib: 96,
    // The SXM2 module: NVLink 2 between GPUs.
    default_link: NVLINK2,
};

/// NVIDIA A100 SXM4 80GB.
pub const A100: DevicePreset = DevicePreset {
    name: "a100",
    full_name: "NVIDIA A100 SXM4 80GB",
    sms: 108,
    fp32_tflops: 19.5,
    tf32_tflops: 156.0,
    fp16_tflops: 312.0,
    mem_bw_gbs: 2039.0,
    l2_mib: 40.0,
    launch_us: 4.0,
    max_threads_per_sm: 2048,
    max_blocks_per_sm: 32,
    registers_per_sm: 65_536,
    shared_mem_per_sm_kib: 164,
    // The SXM4 module: NVLink 3.
    default_link: NVLINK3,
};

/// NVIDIA A40 (GA102, 48 GB GDDR6), the GPU of HIOS's Fig. 1.
pub const A40: DevicePreset = DevicePreset {
    name: "a40",
    full_name: "NVIDIA A40 48GB",
    sms: 84,
    fp32_tflops: 37.4,
    tf32_tflops: 74.8,
    fp16_tflops: 149.7,
    mem_bw_gbs: 696.0,
    l2_mib: 6.0,
    launch_us: 4.0,
    max_threads_per_sm: 1536,
    max_blocks_per_sm: 16,
    registers_per_sm: 65_536,
    shared_mem_per_sm_kib: 100,
    // A PCIe 4.0 board; its optional NVLink bridge joins pairs only.
    default_link: PCIE4,
};

/// NVIDIA GeForce RTX 2080 Ti (TU102, reference boost 1545 MHz): 4352 cores -> 13.4 TFLOP/s
/// FP32; tensor FP16 107.6 TFLOP/s with FP16 accumulation, 53.8 with FP32 accumulation.
pub const RTX2080TI: DevicePreset = DevicePreset {
    name: "rtx2080ti",
    full_name: "NVIDIA GeForce RTX 2080 Ti",
    sms: 68,
    fp32_tflops: 13.4,
    tf32_tflops: 0.0,
    fp16_tflops: 53.8,
    mem_bw_gbs: 616.0,
    l2_mib: 5.5,
    launch_us: 5.0,
    max_threads_per_sm: 1024,
    max_blocks_per_sm: 16,
    registers_per_sm: 65_536,
    shared_mem_per_sm_kib: 64,
    // A PCIe 3.0 card (the NVLink bridge of consumer boards is rare in servers).
    default_link: PCIE3,
};

/// NVIDIA GeForce RTX 3080 10GB (GA102, boost 1710 MHz): 8704 cores -> 29.8 TFLOP/s FP32;
/// dense tensor TF32 29.8 and FP16 59.5 TFLOP/s with FP32 accumulation.
pub const RTX3080: DevicePreset = DevicePreset {
    name: "rtx3080",
    full_name: "NVIDIA GeForce RTX 3080 10GB",
    sms: 68,
    fp32_tflops: 29.8,
    tf32_tflops: 29.8,
    fp16_tflops: 59.5,
    mem_bw_gbs: 760.0,
    l2_mib: 5.0,
    launch_us: 4.0,
    max_threads_per_sm: 1536,
    max_blocks_per_sm: 16,
    registers_per_sm: 65_536,
    shared_mem_per_sm_kib: 100,
    // A PCIe 4.0 card with no NVLink.
    default_link: PCIE4,
};

/// NVIDIA H100 SXM5 80GB.
pub const H100: DevicePreset = DevicePreset {
    name: "h100",
    full_name: "NVIDIA H100 SXM5 80GB",
    sms: 132,
    fp32_tflops: 67.0,
    tf32_tflops: 494.7,
    fp16_tflops: 989.4,
    mem_bw_gbs: 3350.0,
    l2_mib: 50.0,
    launch_us: 3.0,
    max_threads_per_sm: 2048,
    max_blocks_per_sm: 32,
    registers_per_sm: 65_536,
    shared_mem_per_sm_kib: 228,
    // The SXM5 module: NVLink 4.
    default_link: NVLINK4,
};

/// NVIDIA H200 SXM 141GB: H100 SXM's compute with HBM3e (4.8 TB/s).
pub const H200: DevicePreset = DevicePreset {
    name: "h200",
    full_name: "NVIDIA H200 SXM 141GB",
    sms: 132,
    fp32_tflops: 67.0,
    tf32_tflops: 494.7,
    fp16_tflops: 989.4,
    mem_bw_gbs: 4800.0,
    l2_mib: 50.0,
    launch_us: 3.0,
    max_threads_per_sm: 2048,
    max_blocks_per_sm: 32,
    registers_per_sm: 65_536,
    shared_mem_per_sm_kib: 228,
    // The SXM module: NVLink 4.
    default_link: NVLINK4,
};

const DEVICES: &[DevicePreset] = &[K80, V100, A100, A40, RTX2080TI, RTX3080, H100, H200];

// Links. PCIe: effective unidirectional throughput of cudaMemcpyPeer through the host bridge,
// about 75-80% of the x16 raw rate (PCIe 3.0 x16: 15.75 GB/s raw, ~12 effective; 4.0: ~25;
// 5.0: ~50), latency ~10 us on Gen3 (copy launch plus bridge), a little less on newer ones.
// NVLink per-direction aggregate bandwidth from NVIDIA's datasheets: V100 SXM2 NVLink2
// 6 links x 25 GB/s = 150 GB/s; A100 NVLink3 600 GB/s total = 300 GB/s per direction; H100
// NVLink4 900 GB/s total = 450 GB/s per direction; latency a few microseconds (copy launch).

/// PCIe 3.0 x16.
pub const PCIE3: LinkPreset = LinkPreset {
    name: "pcie3",
    latency_us: 10.0,
    bandwidth_gbs: 12.0,
};
/// PCIe 4.0 x16.
pub const PCIE4: LinkPreset = LinkPreset {
    name: "pcie4",
    latency_us: 8.0,
    bandwidth_gbs: 25.0,
};
/// PCIe 5.0 x16.
pub const PCIE5: LinkPreset = LinkPreset {
    name: "pcie5",
    latency_us: 6.0,
    bandwidth_gbs: 50.0,
};
/// NVLink 2 (V100 SXM2).
pub const NVLINK2: LinkPreset = LinkPreset {
    name: "nvlink2",
    latency_us: 4.0,
    bandwidth_gbs: 150.0,
};
/// NVLink 3 (A100 SXM4).
pub const NVLINK3: LinkPreset = LinkPreset {
    name: "nvlink3",
    latency_us: 3.0,
    bandwidth_gbs: 300.0,
};
/// NVLink 4 (H100/H200 SXM).
pub const NVLINK4: LinkPreset = LinkPreset {
    name: "nvlink4",
    latency_us: 2.5,
    bandwidth_gbs: 450.0,
};

const LINKS: &[LinkPreset] = &[PCIE3, PCIE4, PCIE5, NVLINK2, NVLINK3, NVLINK4];

impl DevicePreset {
    pub fn all() -> &'static [DevicePreset] {
        DEVICES
    }

    /// The preset of a GPU the driver names, e.g. "NVIDIA H100 80GB HBM3" -> h100: the preset
    /// whose name, in letters and digits, the device name contains (the longest such, so a
    /// longer model name wins over a prefix of it).
    pub fn for_device_name(device_name: &str) -> Option<DevicePreset> {
        let norm: String = device_name
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .map(|c| c.to_ascii_lowercase())
            .collect();
        DEVICES
            .iter()
            .filter(|d| norm.contains(d.name))
            .max_by_key(|d| d.name.len())
            .cloned()
    }

    /// The preset named exactly `name` ("h100"); a near miss is an error suggesting the closest.
    pub fn by_name(name: &str) -> Result<DevicePreset, CostError> {
        names::lookup("device preset", name, DEVICES, |d| Known::plain(d.name))
            .cloned()
            .map_err(CostError::UnknownDevice)
    }
}

impl LinkPreset {
    pub fn all() -> &'static [LinkPreset] {
        LINKS
    }

    /// The preset named exactly `name` ("nvlink4"); a near miss is an error suggesting the
    /// closest.
    pub fn by_name(name: &str) -> Result<LinkPreset, CostError> {
        names::lookup("link preset", name, LINKS, |l| Known::plain(l.name))
            .cloned()
            .map_err(CostError::UnknownLink)
    }
}

#[cfg(test)]
mod preset_name_tests {
    use super::*;

    #[test]
    fn driver_names_map_to_presets() {
        let name = |s: &str| DevicePreset::for_device_name(s).map(|d| d.name);
        assert_eq!(name("NVIDIA H100 80GB HBM3"), Some("h100"));
        assert_eq!(name("NVIDIA H200"), Some("h200"));
        assert_eq!(name("Tesla V100-SXM2-16GB"), Some("v100"));
        assert_eq!(name("NVIDIA GeForce RTX 3080"), Some("rtx3080"));
        assert_eq!(name("NVIDIA A100-SXM4-40GB"), Some("a100"));
        assert_eq!(name("NVIDIA L4"), None);
    }

    #[test]
    fn every_preset_defaults_to_its_own_interconnect() {
        let defaults: Vec<(&str, &str)> = DevicePreset::all()
            .iter()
            .map(|d| (d.name, d.default_link.name))
            .collect();
        assert_eq!(
            defaults,
            [
                ("k80", "pcie3"),
                ("v100", "nvlink2"),
                ("a100", "nvlink3"),
                ("a40", "pcie4"),
                ("rtx2080ti", "pcie3"),
                ("rtx3080", "pcie4"),
                ("h100", "nvlink4"),
                ("h200", "nvlink4"),
            ]
        );
        for d in DevicePreset::all() {
            assert_eq!(
                LinkPreset::by_name(d.default_link.name).ok().as_ref(),
                Some(&d.default_link)
            );
        }
    }
}
