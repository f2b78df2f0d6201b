//! The analytical GPU model: roofline operator times, thread-block SM shares and a fluid
//! contention law. It needs no GPU: every answer comes from the graph's shapes and a device
//! preset's published figures ([`crate::device`]).
//!
//! # One operator alone
//! An operator runs as one kernel (a `sequential` operator as one kernel per inner operator).
//! A kernel costs
//!
//! ```text
//! t = launch + max(flops / (peak * e_compute * sm_share), bytes / (bandwidth * e_memory))
//! ```
//!
//! - `peak` is the FP32 (CUDA core) peak for f32 graphs and the FP16 (tensor core) peak for
//!   f16 GEMM-like kernels. We do not model cuDNN's TF32 default: the published latencies we
//!   compare with (IOS on V100 and K80, HIOS) are FP32 runs on GPUs without TF32 or with it
//!   off, FP32 keeps the f32 numbers comparable across GPU generations, and it is the
//!   conservative choice (TF32 changes numerics, and PyTorch turns it off for matmuls).
//! - `e_compute` ([`Knobs`]): 0.7 of FP32 peak for convolutions and matrix products (what
//!   cuDNN/cuBLAS SGEMM-class kernels reach on large problems), 0.5 of the tensor-core peak for
//!   f16 (tensor-core kernels sit further from their peak), 0.3 for depthwise convolutions
//!   (little reuse, no tensor cores), 0.5 for the arithmetic of element-wise, pooling and
//!   normalization kernels (which are memory-bound anyway). `e_memory` = 0.8 of the datasheet
//!   bandwidth (what a streaming copy reaches).
//! - `sm_share` is the share of the GPU an operator's thread blocks can fill (below). A kernel
//!   that cannot fill the GPU computes at only `sm_share` of peak: this is what makes small
//!   operators benefit from running side by side.
//!
//! Graph inputs cost 0. Views cost no kernel: a reshape, and an identity with one whole input,
//! cost [`Knobs::view_us`] (0.5 us of bookkeeping, so every operator has a positive time).
//! Other data movement (concat, identity with several terms or a channel slice, transpose) is a
//! copy kernel: launch plus bytes. Abstract operators (cost-annotated DAGs) cost their
//! `time_ms` and fill `util` of the SMs.
//!
//! # Thread blocks and SM share
//! - Convolutions, linear layers and batched matmuls run as implicit GEMMs (cuDNN / CUTLASS
//!   style): `M = N*Ho*Wo` output pixels (rows), `N = C_out` (columns), one 256-thread block
//!   (8 warps, 128 registers per thread) per 128 x 64 output tile, so
//!   `blocks = ceil(M / 128) * ceil(C_out / 64)` (times the groups of a grouped convolution).
//!   Shared memory per block: a double-buffered A and B tile, `2 * (128 + 64) * BK * elem`
//!   with `BK = 8` for f32 (12 KiB) and 32 for f16 (24 KiB).
//! - Depthwise convolutions, element-wise, activation, pooling, softmax, layer norm and copies:
//!   256 threads of 32 registers, each thread handling 4 elements:
//!   `blocks = ceil(elements / 1024)`.
//! - Occupancy: the blocks of a kernel that fit on one SM at once, the minimum over the
//!   device's thread, block, register and shared-memory limits.
//! - Blocks per SM needed to fill it: a register-tiled GEMM block keeps 32 independent FMAs in
//!   flight per thread, so 8 warps (2 per scheduler) keep an SM's FMA pipes busy: one GEMM
//!   block fills an SM (further resident blocks add latency tolerance, not throughput). Memory
//!   and element-wise kernels have little instruction-level parallelism and hide memory latency
//!   only with many warps (Little's law), so they need the full occupancy.
//! - `sm_share = min(1, blocks / (sms * blocks_to_fill))`.
//!
//! `bw_share = (bytes / t) / bandwidth`, at most `e_memory` < 1 for an operator alone.
//!
//! # Contention law
//! For operators running together on one GPU with shares `s_i` and `b_i`, let
//! `S = sum s_i`, `B = sum b_i`. If `S <= 1` and `B <= 1` they fit side by side and every rate
//! is 1. Otherwise the oversubscribed resource is shared fairly: every rate is
//! `1 / (O * (1 + alpha * min(O - 1, 2)))` with `O = max(S, B) > 1` and `alpha` = 0.1 (context
//! switches, cache and scheduler interference between kernels that both want the whole GPU;
//! capped at +20%). Rates lie in (0, 1]. Stage times come from the default fluid simulation
//! ([`crate::fluid`]).
//!
//! # Calibrated presets
//! With a device file ([`AnalyticalModel::calibrated`], [`crate::calibration`]) the same laws
//! take measured parameters instead of the guesses above: `e_compute` comes from the file's
//! efficiency curve of the kernel's family (conv, matmul, depthwise, element-wise) at the
//! kernel's FLOPs, each kernel takes its family's fixed `latency_us` on top of its roofline
//! time, `e_memory` comes from the file's `memory`; a kernel whose tiles fill `sm_share` of the GPU computes alone at
//! `sm_share^fill_exponent` of the peak (libraries split small GEMMs along K) and holds
//! `sm_share^share_exponent` of the GPU against other kernels (four copies of a small
//! convolution, each filling a few percent of the SMs by its tiles, took 1.4x-1.8x one copy's
//! time on an H100), in the contention law whose `alpha` and cap are the file's, in the demand
//! and in the capacity bound (so its proof holds as it is); and
//! instead of the preset's `launch_us` per kernel, an operator pays the file's
//! `kernel_launch_us` once per kernel it launches ([`crate::launches`], views and copies
//! included). Everything else, and the capacity bound's proof, is unchanged. f16 GEMMs keep the
//! formulas (the files are fitted to f32 runs).
//!
//! HIOS's Fig. 1 (two identical 5x5, 48 -> 48 convolutions on an A40): at 16..64 pixels a side
//! each fills at most 32 of 84 SMs, so the two fit side by side and run in half the
//! sequential time; from 128 each has at least 128 blocks for 84 SMs, both want the whole GPU
//! and the pair takes `1 + alpha` = 1.1 times the sequential time (see the test).

use opsched_graph::merge::merged_op;
use opsched_graph::{DType, Graph, NodeId, Op, OpStats, Shape};

use crate::calibration::{self, DeviceFile, Overheads};
use crate::ideal::annotated_transfer;
use crate::launches::launches;
use crate::{CostModel, DevicePreset, LinkPreset, ResourceDemand};

/// The smallest share an operator is given (shares lie in (0, 1]).
const MIN_SHARE: f64 = 1e-6;
/// GEMM tile: output pixels x output channels per thread block.
const TILE_M: u64 = 128;
const TILE_N: u64 = 64;
const GEMM_THREADS: u32 = 256;
const GEMM_REGS: u32 = 128;
/// Warps that keep one SM's FMA pipes busy with a register-tiled GEMM (2 per scheduler).
const GEMM_FILL_WARPS: u32 = 8;
/// Element-wise kernels: threads per block, registers per thread, elements per thread.
const EW_THREADS: u32 = 256;
const EW_REGS: u32 = 32;
const EW_PER_THREAD: u64 = 4;

/// Efficiency factors and the interference constant of the model (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Knobs {
    /// Share of FP32 peak reached by convolutions and matrix products (f32).
    pub gemm: f64,
    /// Share of the FP16 tensor-core peak reached by f16 convolutions and matrix products.
    pub gemm_f16: f64,
    /// Share of FP32 peak reached by depthwise convolutions.
    pub depthwise: f64,
    /// Share of FP32 peak reached by the arithmetic of element-wise kernels.
    pub elementwise: f64,
    /// Share of the datasheet memory bandwidth reached.
    pub memory: f64,
    /// Interference: extra slowdown per unit of oversubscription.
    pub alpha: f64,
    /// Cap on the oversubscription the interference term counts.
    pub alpha_cap: f64,
    /// Cost of a view (no kernel), microseconds.
    pub view_us: f64,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            gemm: 0.7,
            gemm_f16: 0.5,
            depthwise: 0.3,
            elementwise: 0.5,
            memory: 0.8,
            alpha: 0.1,
            alpha_cap: 2.0,
            view_us: 0.5,
        }
    }
}

/// Roofline times, thread-block SM shares and a contention law.
#[derive(Clone, Debug)]
pub struct AnalyticalModel {
    device: DevicePreset,
    link: LinkPreset,
    knobs: Knobs,
    /// Parameters fitted to measurements (see [`AnalyticalModel::calibrated`]); `None`: the
    /// published figures and [`Knobs`] alone.
    calibration: Option<DeviceFile>,
    /// Each operator's cost in the last graph asked about.
    memo: Memo,
}

/// The operators' costs of one graph ([`Graph::id`]), each computed when first asked for: a
/// search asks for the same operators' costs in every stage it tries (IOS on RandWire at batch
/// 16: 54 712 queries), and an operator's cost infers shapes, counts its kernels and applies
/// the fusion rules. The model's parameters are fixed once it is built (its `with_*` methods
/// return a model with an empty memo), so the graph alone keys it. A clone starts empty.
#[derive(Debug, Default)]
struct Memo(std::sync::RwLock<Option<std::sync::Arc<GraphCosts>>>);

#[derive(Debug)]
struct GraphCosts {
    graph: u64,
    costs: Vec<std::sync::OnceLock<Cost>>,
}

impl Clone for Memo {
    fn clone(&self) -> Self {
        Memo::default()
    }
}

impl Memo {
    /// The table of `g`, a new one where the last was another graph's.
    fn of(&self, g: &Graph) -> std::sync::Arc<GraphCosts> {
        let id = g.id();
        // A poisoned lock held a table or nothing, both valid: go on with what it holds.
        let current =
            |m: &Option<std::sync::Arc<GraphCosts>>| m.as_ref().filter(|t| t.graph == id).cloned();
        if let Some(t) = current(&self.0.read().unwrap_or_else(|e| e.into_inner())) {
            return t;
        }
        let mut slot = self.0.write().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = current(&slot) {
            return t;
        }
        let t = std::sync::Arc::new(GraphCosts {
            graph: id,
            costs: (0..g.len()).map(|_| std::sync::OnceLock::new()).collect(),
        });
        *slot = Some(t.clone());
        t
    }
}

impl Default for AnalyticalModel {
    /// An H100 SXM5 with NVLink 4.
    fn default() -> Self {
        AnalyticalModel::new(crate::device::H100, crate::device::NVLINK4)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Implicit GEMM (convolution, linear, batched matmul).
    Gemm,
    /// Depthwise convolution (a stencil kernel).
    Depthwise,
    /// Element-wise, pooling, normalization, copies.
    Memory,
    /// No kernel at all.
    View,
}

/// Which efficiency curve of a device file a kernel follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Conv,
    Matmul,
    Depthwise,
    Elementwise,
}

/// One kernel of an operator.
#[derive(Clone, Copy, Debug)]
struct Kernel {
    class: Class,
    family: Family,
    flops: f64,
    bytes: f64,
    blocks: u64,
    threads: u32,
    regs: u32,
    smem: u32,
}

/// One kernel's cost.
#[derive(Clone, Copy, Debug)]
struct KernelCost {
    time_ms: f64,
    sm_share: f64,
    kernel: Kernel,
}

/// An operator's cost: time, shares and its main kernel.
#[derive(Clone, Copy, Debug)]
struct Cost {
    time_ms: f64,
    sm_share: f64,
    bw_share: f64,
    main: Option<Kernel>,
    flops: f64,
    bytes: f64,
}

fn numel(s: &[usize]) -> u64 {
    s.iter().map(|&d| d as u64).product()
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b.max(1))
}

fn finite_or(x: f64, fallback: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        fallback
    }
}

impl AnalyticalModel {
    pub fn new(device: DevicePreset, link: LinkPreset) -> Self {
        AnalyticalModel {
            device,
            link,
            knobs: Knobs::default(),
            calibration: None,
            memo: Memo::default(),
        }
    }

    /// The model of `device` with the parameters of a device file fitted to measurements
    /// (overheads, contention law, efficiency curves; see [`crate::calibration`]). The file's
    /// preset should be `device`'s; the caller checks.
    pub fn calibrated(device: DevicePreset, link: LinkPreset, file: DeviceFile) -> Self {
        AnalyticalModel {
            calibration: Some(file),
            ..Self::new(device, link)
        }
    }

    /// The device file the model uses, if it is calibrated.
    pub fn calibration(&self) -> Option<&DeviceFile> {
        self.calibration.as_ref()
    }

    /// The calibrated efficiency curve and latency of a kernel family.
    fn family(&self, family: Family) -> Option<&calibration::Family> {
        let e = &self.calibration.as_ref()?.efficiency;
        Some(match family {
            Family::Conv => &e.conv,
            Family::Matmul => &e.matmul,
            Family::Depthwise => &e.depthwise,
            Family::Elementwise => &e.elementwise,
        })
    }

    /// Per-kernel launch floor charged inside an operator's time, ms (0 uncalibrated: the
    /// formulas charge the preset's `launch_us` in each kernel instead).
    fn launch_floor_ms(&self) -> f64 {
        self.calibration
            .as_ref()
            .map_or(0.0, |c| c.overheads.kernel_launch_us.max(0.0) / 1e3)
    }

    /// The device it models.
    pub fn device(&self) -> &DevicePreset {
        &self.device
    }

    /// The link between its GPUs.
    pub fn link(&self) -> &LinkPreset {
        &self.link
    }

    /// Its efficiency factors and contention law (where it is not calibrated).
    pub fn knobs(&self) -> &Knobs {
        &self.knobs
    }

    /// The same model with other efficiency factors.
    pub fn with_knobs(mut self, knobs: Knobs) -> Self {
        self.knobs = knobs;
        self.memo = Memo::default();
        self
    }

    /// The same model with other compute (f32 GEMM) and memory efficiencies.
    pub fn with_efficiency(mut self, gemm: f64, memory: f64) -> Self {
        self.knobs.gemm = gemm;
        self.knobs.memory = memory;
        self.memo = Memo::default();
        self
    }

    fn gemm_kernel(
        &self,
        family: Family,
        dtype: DType,
        flops: f64,
        bytes: f64,
        blocks: u64,
    ) -> Kernel {
        let (bk, elem) = match dtype {
            DType::F32 => (8u64, 4u64),
            DType::F16 => (32, 2),
        };
        Kernel {
            class: Class::Gemm,
            family,
            flops,
            bytes,
            blocks: blocks.max(1),
            threads: GEMM_THREADS,
            regs: GEMM_REGS,
            smem: (2 * (TILE_M + TILE_N) * bk * elem) as u32,
        }
    }

    fn ew_kernel(class: Class, flops: f64, bytes: f64, elements: u64) -> Kernel {
        Kernel {
            class,
            family: if class == Class::Depthwise {
                Family::Depthwise
            } else {
                Family::Elementwise
            },
            flops,
            bytes,
            blocks: ceil_div(elements, u64::from(EW_THREADS) * EW_PER_THREAD).max(1),
            threads: EW_THREADS,
            regs: EW_REGS,
            smem: 0,
        }
    }

    /// The kernel of one primitive operator reading `terms` and writing `out`, with the
    /// given FLOPs and bytes.
    fn kernel(&self, op: &Op, terms: &[Shape], out: &[usize], s: OpStats, dtype: DType) -> Kernel {
        let flops = s.flops as f64;
        let bytes = (s.bytes_read + s.bytes_written) as f64;
        let out_elems = numel(out);
        let in_elems: u64 = terms.iter().map(|t| numel(t)).sum();
        match op {
            Op::Conv2d(c) => {
                let cin: usize = terms.iter().map(|t| t.get(1).copied().unwrap_or(0)).sum();
                let groups = c.groups.max(1);
                let cout = out.get(1).copied().unwrap_or(c.out_channels).max(1);
                let pixels = out_elems / cout as u64;
                if groups > 1 && cin / groups <= 1 {
                    Self::ew_kernel(Class::Depthwise, flops, bytes, out_elems)
                } else {
                    let per_group = (cout / groups).max(1) as u64;
                    let blocks =
                        groups as u64 * ceil_div(pixels, TILE_M) * ceil_div(per_group, TILE_N);
                    self.gemm_kernel(Family::Conv, dtype, flops, bytes, blocks)
                }
            }
            Op::Linear { out_features, .. } => {
                let n = (*out_features).max(1) as u64;
                let m = out_elems / n;
                let blocks = ceil_div(m, TILE_M) * ceil_div(n, TILE_N);
                self.gemm_kernel(Family::Matmul, dtype, flops, bytes, blocks)
            }
            Op::BatchMatmul { .. } => {
                let r = out.len();
                let (m, n) = if r >= 2 {
                    (out[r - 2] as u64, out[r - 1] as u64)
                } else {
                    (1, out_elems)
                };
                let batch = out_elems / (m * n).max(1);
                let blocks = batch * ceil_div(m, TILE_M) * ceil_div(n, TILE_N);
                self.gemm_kernel(Family::Matmul, dtype, flops, bytes, blocks)
            }
            Op::Reshape { .. } => Self::ew_kernel(Class::View, 0.0, 0.0, out_elems),
            Op::Pool2d(p) if p.kind.is_global() => {
                Self::ew_kernel(Class::Memory, flops, bytes, in_elems)
            }
            Op::Input { .. } | Op::Abstract { .. } => {
                Self::ew_kernel(Class::View, 0.0, 0.0, out_elems)
            }
            _ => Self::ew_kernel(Class::Memory, flops, bytes, out_elems.max(in_elems)),
        }
    }

    /// Resident blocks per SM (occupancy), at least 1.
    fn occupancy(&self, k: &Kernel) -> u64 {
        let d = &self.device;
        let threads = u64::from(k.threads.max(1));
        let by_threads = u64::from(d.max_threads_per_sm) / threads;
        let by_regs = u64::from(d.registers_per_sm) / (threads * u64::from(k.regs.max(1)));
        let by_smem = if k.smem == 0 {
            u64::MAX
        } else {
            u64::from(d.shared_mem_per_sm_kib) * 1024 / u64::from(k.smem)
        };
        by_threads
            .min(by_regs)
            .min(by_smem)
            .min(u64::from(d.max_blocks_per_sm))
            .max(1)
    }

    /// Share of the GPU a kernel fills alone.
    fn kernel_share(&self, k: &Kernel) -> f64 {
        let resident = self.occupancy(k);
        let to_fill = match k.class {
            Class::Gemm => {
                let warps = k.threads.div_ceil(32).max(1);
                resident.min(u64::from(GEMM_FILL_WARPS.div_ceil(warps)))
            }
            _ => resident,
        }
        .max(1);
        let capacity = u64::from(self.device.sms.max(1)) * to_fill;
        (k.blocks as f64 / capacity as f64).clamp(MIN_SHARE, 1.0)
    }

    /// The share of the GPU a kernel computes at alone and the share it holds against others,
    /// from the share its tiles fill: the same uncalibrated, raised to the device file's
    /// `fill_exponent` and `share_exponent` calibrated.
    fn alone_and_held(&self, fill: f64) -> (f64, f64) {
        match &self.calibration {
            Some(c) => (
                fill.powf(c.efficiency.fill_exponent).clamp(MIN_SHARE, 1.0),
                fill.powf(c.contention.share_exponent).clamp(MIN_SHARE, 1.0),
            ),
            None => (fill, fill),
        }
    }

    fn eval(&self, k: Kernel, dtype: DType) -> KernelCost {
        let d = &self.device;
        let kn = &self.knobs;
        let cal = self.calibration.as_ref();
        if k.class == Class::View {
            // Calibrated, a view is charged its launch (the backend copies) and nothing else.
            let view_us = if cal.is_some() { 0.0 } else { kn.view_us };
            return KernelCost {
                time_ms: view_us.max(0.0) / 1e3,
                sm_share: MIN_SHARE,
                kernel: k,
            };
        }
        let (share, held) = self.alone_and_held(self.kernel_share(&k));
        // Device files are fitted to f32 runs; f16 tensor-core GEMMs keep the formulas.
        let f16_gemm =
            k.class == Class::Gemm && dtype == DType::F16 && d.fp16_tflops > d.fp32_tflops;
        let fam = self.family(k.family);
        let (peak_tflops, eff) = match (fam, k.class) {
            _ if f16_gemm => (d.fp16_tflops, kn.gemm_f16),
            (Some(f), _) => (d.fp32_tflops, f.curve.at(k.flops)),
            (None, Class::Gemm) => (d.fp32_tflops, kn.gemm),
            (None, Class::Depthwise) => (d.fp32_tflops, kn.depthwise),
            (None, _) => (d.fp32_tflops, kn.elementwise),
        };
        let memory = cal.map_or(kn.memory, |c| c.efficiency.memory);
        // Uncalibrated, each kernel pays the preset's launch; calibrated, its family's latency
        // (the launch floor is charged per operator, see `combine`).
        let launch_us = match fam {
            Some(f) => f.latency_us,
            None if cal.is_some() => 0.0,
            None => d.launch_us,
        };
        let compute_rate = (peak_tflops * 1e12 * eff * share).max(f64::MIN_POSITIVE);
        let memory_rate = (d.mem_bw_gbs * 1e9 * memory).max(f64::MIN_POSITIVE);
        let t_s = (k.flops / compute_rate).max(k.bytes / memory_rate);
        let time_ms = finite_or(launch_us.max(0.0) / 1e3 + t_s * 1e3, 0.0);
        KernelCost {
            time_ms,
            sm_share: held,
            kernel: k,
        }
    }

    /// Combine kernels run one after another into an operator's cost, with `launches` launch
    /// floors (idle SMs) on top.
    fn combine(&self, kernels: &[KernelCost], launches: u32) -> Cost {
        let floors = f64::from(launches) * self.launch_floor_ms();
        let time_ms: f64 = kernels.iter().map(|k| k.time_ms).sum::<f64>() + floors;
        let busy: f64 = kernels.iter().map(|k| k.time_ms * k.sm_share).sum();
        let flops: f64 = kernels.iter().map(|k| k.kernel.flops).sum();
        let bytes: f64 = kernels.iter().map(|k| k.kernel.bytes).sum();
        let main = kernels
            .iter()
            .filter(|k| k.kernel.class != Class::View)
            .max_by(|a, b| a.time_ms.total_cmp(&b.time_ms))
            .or_else(|| kernels.first())
            .map(|k| k.kernel);
        let (sm_share, bw_share) = if time_ms > 0.0 {
            let bw = self.device.mem_bw_gbs * 1e9;
            (
                (busy / time_ms).clamp(MIN_SHARE, 1.0),
                finite_or(bytes / (time_ms * 1e-3) / bw, 0.0).clamp(0.0, 1.0),
            )
        } else {
            (MIN_SHARE, 0.0)
        };
        Cost {
            time_ms,
            sm_share,
            bw_share,
            main,
            flops,
            bytes,
        }
    }

    /// The cost of a node alone, computed once per graph ([`Memo`]).
    fn cost(&self, g: &Graph, op: NodeId) -> Cost {
        match self.memo.of(g).costs.get(op.index()) {
            Some(cell) => *cell.get_or_init(|| self.cost_of(g, op)),
            None => self.cost_of(g, op),
        }
    }

    /// [`AnalyticalModel::cost`], computed.
    fn cost_of(&self, g: &Graph, op: NodeId) -> Cost {
        let zero = Cost {
            time_ms: 0.0,
            sm_share: MIN_SHARE,
            bw_share: 0.0,
            main: None,
            flops: 0.0,
            bytes: 0.0,
        };
        let Some(node) = g.nodes().get(op.index()) else {
            return zero;
        };
        match &node.op {
            Op::Input { .. } => zero,
            Op::Abstract { time_ms, util } => Cost {
                time_ms: finite_or(time_ms.max(0.0), 0.0),
                sm_share: finite_or(*util, 1.0).clamp(MIN_SHARE, 1.0),
                ..zero
            },
            Op::Sequential { ops } => {
                let dtype = g.dtype;
                let mut shapes = g.input_shapes(op);
                // The sums inside the node's input terms are done by the first kernel.
                let total = g.stats(op);
                // Parts of `total`, which the graph counted (checked) when it was built.
                let inner = node.op.stats(&shapes, &node.shape, dtype).unwrap_or(total);
                let mut kernels = Vec::with_capacity(ops.len());
                for (i, inner_op) in ops.iter().enumerate() {
                    let Ok(out) = inner_op.infer_shape(&shapes) else {
                        break;
                    };
                    let mut s = inner_op.stats(&shapes, &out, dtype).unwrap_or_default();
                    if i == 0 {
                        s.flops += total.flops.saturating_sub(inner.flops);
                        s.bytes_read += total.bytes_read.saturating_sub(inner.bytes_read);
                    }
                    let k = if is_view(inner_op, &[]) {
                        Self::ew_kernel(Class::View, 0.0, 0.0, 0)
                    } else {
                        self.kernel(inner_op, &shapes, &out, s, dtype)
                    };
                    kernels.push(self.eval(k, dtype));
                    shapes = vec![out];
                }
                self.combine(&kernels, launches(g, op))
            }
            other => {
                let terms = g.input_shapes(op);
                let n = launches(g, op);
                // Nothing launched: a concat whose producers all write in place, an activation
                // fused into its producer's kernel.
                let k = if is_view(other, &node.inputs) || n == 0 {
                    Self::ew_kernel(Class::View, 0.0, 0.0, 0)
                } else {
                    // A concatenation moves only the terms not written in place.
                    let mut stats = g.stats(op);
                    let copied = 1.0 - opsched_graph::inplace::in_place_share(g, op);
                    if copied < 1.0 {
                        let part = |b: u64| (b as f64 * copied).round() as u64;
                        stats.bytes_read = part(stats.bytes_read);
                        stats.bytes_written = part(stats.bytes_written);
                    }
                    self.kernel(other, &terms, &node.shape, stats, g.dtype)
                };
                self.combine(&[self.eval(k, g.dtype)], n)
            }
        }
    }

    fn demand_of(&self, c: &Cost, dtype: DType) -> ResourceDemand {
        let d = &self.device;
        // Opara's memory-intensive class: arithmetic intensity below the ridge point of the
        // roofline the main kernel runs on.
        let memory_bound = match c.main {
            Some(k) if k.class != Class::View => {
                let peak = match (k.class, dtype) {
                    (Class::Gemm, DType::F16) => d.fp16_tflops.max(d.fp32_tflops),
                    _ => d.fp32_tflops,
                };
                let ridge = peak * 1e12 / (d.mem_bw_gbs * 1e9).max(f64::MIN_POSITIVE);
                c.bytes > 0.0 && c.flops / c.bytes < ridge
            }
            _ => false,
        };
        ResourceDemand {
            sm_share: c.sm_share,
            bw_share: c.bw_share,
            blocks: c.main.map_or(0, |k| k.blocks),
            threads_per_block: c.main.map_or(0, |k| k.threads),
            registers_per_thread: c.main.map_or(0, |k| k.regs),
            shared_mem_per_block: c.main.map_or(0, |k| k.smem),
            memory_bound,
        }
    }

    /// Rate-weighted SM and bandwidth work of an operator: `(t * s, t * b)`.
    fn work(&self, g: &Graph, op: NodeId) -> (f64, f64) {
        let c = self.cost(g, op);
        (c.time_ms * c.sm_share, c.time_ms * c.bw_share)
    }
}

/// Whether an operator only re-labels its input: a reshape, or an identity of one term with
/// one whole value.
fn is_view(op: &Op, inputs: &[opsched_graph::Term]) -> bool {
    match op {
        Op::Reshape { .. } => true,
        Op::Identity => match inputs {
            [] => true,
            [term] => matches!(term.as_slice(), [v] if v.channels.is_none()),
            _ => false,
        },
        _ => false,
    }
}

impl CostModel for AnalyticalModel {
    fn name(&self) -> String {
        match &self.calibration {
            // The date and the kernels measured tell two fits of one day apart (a schedule
            // records the name of the model it was searched under).
            Some(c) => match c.provenance.kernels_revision.as_str() {
                "" => format!(
                    "analytical({}, calibrated {})",
                    self.device.name, c.provenance.measured_on
                ),
                kernels => format!(
                    "analytical({}, calibrated {}, kernels {kernels})",
                    self.device.name, c.provenance.measured_on
                ),
            },
            None => format!("analytical({})", self.device.name),
        }
    }

    fn op_time(&self, g: &Graph, op: NodeId) -> f64 {
        self.cost(g, op).time_ms
    }

    fn demand(&self, g: &Graph, op: NodeId) -> ResourceDemand {
        self.demand_of(&self.cost(g, op), g.dtype)
    }

    fn rates(&self, g: &Graph, running: &[NodeId], out: &mut Vec<f64>) {
        out.clear();
        let (mut s, mut b) = (0.0, 0.0);
        for &op in running {
            let c = self.cost(g, op);
            s += c.sm_share;
            b += c.bw_share;
        }
        let over = s.max(b);
        let (alpha, alpha_cap) = match &self.calibration {
            Some(c) => (c.contention.alpha, c.contention.alpha_cap),
            None => (self.knobs.alpha, self.knobs.alpha_cap),
        };
        let rate = if over <= 1.0 || !over.is_finite() {
            1.0
        } else {
            let extra = (over - 1.0).min(alpha_cap.max(0.0));
            let penalty = 1.0 + alpha.max(0.0) * extra;
            (1.0 / (over * penalty)).clamp(f64::MIN_POSITIVE, 1.0)
        };
        out.resize(running.len(), rate);
    }

    /// The merged operator's own cost (a convolution's summed output channels and largest
    /// kernel, a linear layer's summed output features, on the shared input), but never less than the largest component, nor less than the components' total
    /// SM work `sum(t_i * s_i)` or bandwidth work `sum(t_i * b_i)` (so that merging cannot beat
    /// [`AnalyticalModel::capacity_bound`]'s accounting either).
    fn merged_time(&self, g: &Graph, ops: &[NodeId]) -> Option<f64> {
        let (op, input) = merged_op(g, ops)?;
        let terms = vec![input];
        let out = op.infer_shape(&terms).ok()?;
        let stats = op.stats(&terms, &out, g.dtype).ok()?;
        let k = self.kernel(&op, &terms, &out, stats, g.dtype);
        let mut t = self.combine(&[self.eval(k, g.dtype)], 1).time_ms;
        let (mut sw, mut bw) = (0.0, 0.0);
        for &o in ops {
            let c = self.cost(g, o);
            t = t.max(c.time_ms);
            sw += c.time_ms * c.sm_share;
            bw += c.time_ms * c.bw_share;
        }
        Some(t.max(sw).max(bw))
    }

    /// The edge's annotated transfer time, else link latency plus bytes over link bandwidth
    /// (0 when there is no such edge).
    fn transfer_time(&self, g: &Graph, src: NodeId, dst: NodeId) -> f64 {
        if let Some(t) = annotated_transfer(g, src, dst) {
            return t;
        }
        match g.edge(src, dst) {
            Some(e) => {
                let bw = (self.link.bandwidth_gbs * 1e9).max(f64::MIN_POSITIVE);
                finite_or(
                    self.link.latency_us.max(0.0) / 1e3 + e.bytes as f64 / bw * 1e3,
                    0.0,
                )
            }
            None => 0.0,
        }
    }

    /// `max(sum(t_i * s_i), sum(t_i * b_i)) / gpus`.
    ///
    /// Proof. Under the contention law every operator running on a GPU at time `τ` progresses
    /// at the common rate `r(τ)`, and operator `i` is done when `∫ r_i(τ) dτ = t_i` over its run.
    /// At any instant the running operators of one GPU satisfy `sum(s_i * r_i) <= 1`: if they
    /// fit (`S <= 1` and `B <= 1`) the rates are 1 and the sum is `S <= 1`; otherwise it is
    /// `S / (max(S, B) * penalty) <= 1` since `max(S, B) >= S` and `penalty >= 1`. Hence
    /// `sum_i t_i * s_i = sum_i ∫ s_i r_i(τ) dτ = ∫ sum_{running} s_i r_i(τ) dτ`, and the
    /// integrand is at most the number of GPUs busy at `τ`, at most `gpus`; integrating over
    /// `[0, makespan]` gives `sum(t_i s_i) <= gpus * makespan`. The same argument with `b_i`
    /// (`sum(b_i * r_i) <= B / max(S, B) <= 1`) gives the bandwidth term. A merged stage
    /// runs alone for `merged_time >= sum(t_i s_i)` and `>= sum(t_i b_i)` of its components,
    /// so merges do not break the bound, and transfers only add time.
    fn capacity_bound(&self, g: &Graph, ops: &[NodeId], gpus: usize) -> f64 {
        let (mut sw, mut bw) = (0.0, 0.0);
        for &o in ops {
            let (s, b) = self.work(g, o);
            sw += s;
            bw += b;
        }
        sw.max(bw) / gpus.max(1) as f64
    }

    fn overheads(&self) -> Overheads {
        self.calibration
            .as_ref()
            .map_or_else(Overheads::default, |c| c.overheads)
    }
}
