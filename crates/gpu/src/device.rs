//! The device seam: what a runtime needs from a machine that runs [`GraphProgram`]s.
//!
//! A [`Device`] owns memory for a program's buffers, streams (ordered queues of work that run
//! concurrently with each other), events (recorded on one stream, waited for on another) and
//! prepared operators (an operator's steps with everything resolved, ready to enqueue without
//! allocating). The runtime, the profiler and the numerical check are written once against
//! this trait; two implementations exist:
//! - [`crate::cuda::CudaDevice`]: NVIDIA GPUs through cudarc (cuDNN, cuBLAS, NVRTC, NCCL);
//! - [`crate::cpu::CpuDevice`]: the host, each stream a worker thread, events real
//!   synchronisation, with a race detector and a checked graph capture, so that the logic most
//!   likely to deadlock or race runs in CI.
//!
//! Semantics every implementation keeps (CUDA's):
//! - work on one stream runs in the order it was enqueued; different streams run concurrently;
//! - [`Device::record`] marks a point of a stream; [`Device::wait`] makes a stream wait until
//!   the most recent point recorded on the event *at the time the wait is enqueued* has been
//!   reached; waiting on an event never recorded does nothing;
//! - [`Device::begin_capture`] on a stream starts recording instead of running: a stream takes
//!   part in the capture once it waits for an event recorded during the capture; every such
//!   stream must be joined back (the capturing stream waits for an event recorded on it after
//!   its last work) before [`Device::end_capture`]; [`Device::replay`] runs the captured work
//!   again, as one unit, ordered on the stream it is replayed on.
//!
//! Ownership: a device's memory is handed out as an owned value; prepared operators keep the
//! memory they point into alive (they hold it), so no prepared operator can run on memory that
//! was freed, and each buffer lives on the unit (GPU) its program placed it on.

use opsched_cost::cache::DeviceFingerprint;
use serde::Serialize;

use crate::program::{BufId, GraphProgram, OpProgram};
use crate::GpuError;

/// Options of the kernels, the same for every device (a device ignores what it has no use
/// for).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct KernelOptions {
    /// Let convolutions and matrix products use TF32 tensor cores for f32 data (PyTorch's
    /// default for convolutions); `false` keeps strict f32 arithmetic (`--precise`).
    pub tf32: bool,
    /// The most workspace one convolution algorithm may use, bytes.
    pub conv_workspace_limit: usize,
    /// Which cuDNN kernels a convolution may run.
    pub conv_api: ConvApi,
    /// Whether 1x1 convolutions (stride 1, unpadded, one group) may run as cuBLAS's matrix
    /// product.
    pub conv_gemm: ConvGemm,
    /// Which library kernel a matrix product runs.
    pub gemm: GemmKernel,
}

/// The library kernel a matrix product (a linear layer, an attention product) runs on CUDA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GemmKernel {
    /// The fastest as measured on the device (`crate::tuning::GEMM_KEY`, kept in the cost
    /// cache) of cuBLAS's own choice and the top configurations of cuBLASLt's heuristic.
    /// Products read through head transposes in groups (an array of addresses) run cuBLAS's
    /// batched call, and a strided batch whose results interleave (written through a head
    /// transpose) cuBLAS's strided batch, whatever the option.
    #[default]
    Measured,
    /// Nothing measured: cuBLAS's own choice, and cuBLASLt's first configuration for a
    /// product with an epilogue (what ran before the measured choice).
    Heuristic,
    /// cuBLASLt's configuration at this rank of its heuristic's list (the list's last where
    /// it is shorter): to check every configuration against the reference.
    LtRank(u32),
}

/// Whether a 1x1 convolution may run as cuBLAS's matrix product. Off by default until a GPU
/// run has checked it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvGemm {
    /// cuDNN's kernels only: the default, since the product made no model faster on an H100
    /// (2026-11-26, `fixtures/gpu/h100-2026-11-26/README.md`).
    #[default]
    Off,
    /// The product is one more candidate, chosen where it measures fastest (with
    /// `ConvApi::Both`).
    Timed,
    /// Every 1x1 convolution runs as the product (to check it, or to compare).
    Always,
}

/// The cuDNN kernels a convolution chooses among (by measurement, `crate::tuning`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvApi {
    /// The legacy API's algorithms and the backend API's engines.
    #[default]
    Both,
    /// The legacy API's algorithms only (`cudnnConvolutionForward`).
    Legacy,
    /// The backend API's engines only (heuristic mode A's top configurations).
    Backend,
}

impl Default for KernelOptions {
    fn default() -> Self {
        KernelOptions {
            tf32: true,
            conv_workspace_limit: 256 << 20,
            conv_api: ConvApi::default(),
            conv_gemm: ConvGemm::Off,
            gemm: GemmKernel::Measured,
        }
    }
}

/// How tensors move between logical GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum TransferMode {
    /// NCCL when every logical GPU has its own physical GPU and libnccl loads, else copies.
    #[default]
    Auto,
    /// Always NCCL send/recv (an error when impossible).
    Nccl,
    /// Peer copies between physical GPUs, device-to-device copies within one.
    Copy,
}

/// What a device is, for reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceReport {
    /// `"cuda"` or `"cpu"`.
    pub backend: &'static str,
    /// The first unit's name (e.g. `NVIDIA H100 80GB HBM3`, or the CPU model).
    pub name: String,
    /// Driver version (CUDA), empty on the CPU.
    pub driver: String,
    /// Kernel library versions (cuDNN on CUDA; the GEMM crate on the CPU).
    pub libraries: String,
    /// Physical units the device drives (GPUs; 1 on the CPU).
    pub units: usize,
    /// What keys this device's measurements in the cost cache.
    pub fingerprint: DeviceFingerprint,
}

/// A machine that runs [`GraphProgram`]s (see the module docs).
pub trait Device {
    /// An ordered queue of work.
    type Stream;
    /// A synchronisation point between streams, and a timer.
    type Event;
    /// The buffers of one program, on the units its logical GPUs map to.
    type Memory;
    /// One operator's steps, ready to enqueue.
    type Op;
    /// A captured iteration, replayable as one unit.
    type Graph;

    /// What this device is.
    fn report(&self) -> DeviceReport;

    /// Physical units (GPUs) the device drives.
    fn units(&self) -> usize;

    /// Registers per thread, static shared memory per block and the largest block of one of
    /// our compiled kernels on `unit` (`None` where the device has no such notion).
    fn kernel_resources(&self, _unit: usize, _kernel: &str) -> Option<(u32, u32, u32)> {
        None
    }

    /// The measured kernel choices this device keeps (cuDNN convolution algorithms on CUDA;
    /// `None` where nothing is chosen by measurement): a caller loads them from the cost cache
    /// before preparing and saves [`crate::tuning::Tuning::fresh`] after.
    fn tuning(&self) -> Option<&crate::tuning::Tuning> {
        None
    }

    /// How this device stores 4-D activations unless told otherwise: NCHW, the IR's order
    /// (the CPU's im2col convolutions run ResNet-50 2.3x slower channels last); CUDA
    /// overrides it with channels last, where cuDNN's tensor-core convolutions need no layout
    /// conversions.
    fn preferred_layout(&self) -> crate::program::Layout {
        crate::program::Layout::Nchw
    }

    /// Allocate and initialise every buffer of `p`; logical GPU `l` lives on unit `map[l]`.
    /// Buffers that start with data ([`crate::program::Init`]) hold it when this returns.
    fn alloc(&self, p: &GraphProgram, map: &[usize]) -> Result<Self::Memory, GpuError>;

    /// Copy buffer `id` to the host (waits for the device).
    fn read(&self, m: &Self::Memory, id: BufId) -> Result<Vec<f32>, GpuError>;

    /// Overwrite buffer `id` with `data` (exactly its length; waits for the device). Inputs
    /// may be written at any time; weights before [`Device::prepare`] (the CPU device repacks
    /// a linear layer's weights when it prepares the operator).
    fn write(&self, m: &Self::Memory, id: BufId, data: &[f32]) -> Result<(), GpuError>;

    /// A new stream on `unit`.
    fn stream(&self, unit: usize) -> Result<Self::Stream, GpuError>;

    /// A new event on `unit`; `timing`: it can measure elapsed time.
    fn event(&self, unit: usize, timing: bool) -> Result<Self::Event, GpuError>;

    /// Record `e` at the current end of `s`.
    fn record(&self, s: &Self::Stream, e: &Self::Event) -> Result<(), GpuError>;

    /// Make `s` wait for the point most recently recorded on `e`.
    fn wait(&self, s: &Self::Stream, e: &Self::Event) -> Result<(), GpuError>;

    /// Milliseconds between two timing events (waits until `end` is reached).
    fn elapsed_ms(&self, start: &Self::Event, end: &Self::Event) -> Result<f64, GpuError>;

    /// Prepare one operator of `p` on the memory `m` (choosing kernels, resolving buffers).
    fn prepare(
        &self,
        p: &GraphProgram,
        m: &Self::Memory,
        op: &OpProgram,
        opts: &KernelOptions,
    ) -> Result<Self::Op, GpuError>;

    /// Make `s` able to run `ops` (CUDA: a workspace large enough for each); allocates, so
    /// call it before timing or capturing.
    fn fit_stream(&self, s: &mut Self::Stream, ops: &[&Self::Op]) -> Result<(), GpuError>;

    /// Enqueue a prepared operator on `s` (a stream of its unit). Allocates nothing.
    fn launch(&self, op: &Self::Op, s: &Self::Stream) -> Result<(), GpuError>;

    /// Set up transfers between the logical GPUs of `m`, one copy stream per logical GPU in
    /// `copy`; returns the mechanism chosen (`"nccl"` or `"copy"`).
    fn connect(
        &self,
        m: &mut Self::Memory,
        copy: &[Self::Stream],
        mode: TransferMode,
    ) -> Result<&'static str, GpuError>;

    /// Move buffer `src` (on logical GPU `gpus.0`) into `dst` (on `gpus.1`): the transfer
    /// starts after everything enqueued so far on `copy[gpus.0]` and `copy[gpus.1]`, and
    /// `copy[gpus.1]` holds its completion.
    fn transfer(
        &self,
        m: &Self::Memory,
        src: BufId,
        dst: BufId,
        gpus: (usize, usize),
        copy: &[Self::Stream],
    ) -> Result<(), GpuError>;

    /// Wait for all work on every unit.
    fn synchronize(&self) -> Result<(), GpuError>;

    /// Start capturing the work enqueued on `s` (and on the streams that join it).
    fn begin_capture(&self, s: &Self::Stream) -> Result<(), GpuError>;

    /// Stop capturing on `s`; the captured work, ready to replay.
    fn end_capture(&self, s: &Self::Stream) -> Result<Self::Graph, GpuError>;

    /// Run a captured graph once, ordered on `s`.
    fn replay(&self, g: &Self::Graph, s: &Self::Stream) -> Result<(), GpuError>;
}
