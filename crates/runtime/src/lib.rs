//! # opsched-runtime
//!
//! Executes opsched launch plans on real GPUs: exactly the per-GPU, per-stream command lists
//! the simulator evaluates.
//!
//! - [`exec`] (CPU only, tested here): the launch plan merged into one host order in which
//!   every event is recorded before it is waited for; a vector-clock pass proves every
//!   dependency is ordered (same stream, or through waits and transfers) and drops waits that
//!   earlier waits already imply; logical GPUs mapped round-robin onto physical ones.
//! - [`run`]: buffers allocated and initialised before timing ([`opsched_gpu::GraphProgram`]),
//!   one stream pool per logical GPU (each stream with its own cuDNN and cuBLAS handles), one
//!   event per plan event, a copy/communication stream per GPU for transfers (NCCL send/recv
//!   between physical GPUs with `Comm::from_devices`, else peer or device-to-device copies),
//!   fork/join through an origin stream, optional CUDA graph capture of a whole iteration,
//!   warm-up then timed runs (median, p10, p90 via CUDA events), and the numerical check
//!   (scheduled vs sequential run of the same kernels, and vs the CPU reference on small
//!   graphs).
//!
//! A merged stage (`LaunchMerged`) runs its operators one after another on its stream: the
//! GPU backend has no merged-convolution kernel yet.

pub mod bench;
pub mod exec;
pub mod run;

pub use exec::{map_gpus, priorities, ExecProgram, HostCmd, Transfer};
pub use opsched_gpu::cuda::KernelOptions;
pub use opsched_gpu::{GpuError, Summary};
pub use run::{
    open_gpus, run_plan, run_plan_on, run_schedule, sequential_plan, CheckReport, RunReport,
};

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The GPU backend (a missing library, no device, a CUDA error, an unsupported operator).
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// Lowering the schedule.
    #[error(transparent)]
    Schedule(#[from] opsched_schedule::ScheduleError),
    /// A launch plan the runtime cannot execute as given (names the operator or event).
    #[error("launch plan: {0}")]
    Plan(String),
}

/// How transfers between logical GPUs move data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum TransferMode {
    /// NCCL when every logical GPU has its own physical GPU and libnccl loads, else copies.
    #[default]
    Auto,
    /// Always NCCL send/recv (an error when impossible).
    Nccl,
    /// Peer copies between physical GPUs, device-to-device copies within one.
    Copy,
}

/// What the numerical check compares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum CheckMode {
    /// No check.
    #[default]
    None,
    /// Against a sequential run of the same kernels, and against the CPU reference when the
    /// graph has at most [`RunOptions::cpu_check_max_flops`] FLOPs.
    Auto,
    /// Both, whatever the size (the CPU reference can take minutes on large inputs).
    Full,
}

/// Options of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunOptions {
    /// Capture one whole iteration as a CUDA graph and time its replays.
    pub graph_capture: bool,
    /// Physical GPUs to use (the first M); `None`: all present. Logical GPUs of the plan map
    /// onto them round-robin.
    pub gpus: Option<usize>,
    pub warmup: u32,
    pub repeats: u32,
    pub check: CheckMode,
    pub cpu_check_max_flops: u64,
    pub transfers: TransferMode,
    pub kernels: KernelOptions,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            graph_capture: false,
            gpus: None,
            warmup: 10,
            repeats: 100,
            check: CheckMode::None,
            cpu_check_max_flops: 2_000_000_000,
            transfers: TransferMode::Auto,
            kernels: KernelOptions::default(),
        }
    }
}
