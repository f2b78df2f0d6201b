//! # opsched-runtime
//!
//! Executes launch plans on any [`Device`] (a CUDA GPU, several, or the CPU): exactly the
//! per-GPU, per-stream command lists the simulator evaluates, in the host order that
//! [`opsched_schedule::HostProgram`] computes from the plan (this crate never looks at a
//! `Schedule`).
//!
//! - [`run`]: a [`Session`] prepares a plan on a device: buffers laid out for the plan (in-place
//!   concatenation, storage shared where the plan orders uses apart: [`opsched_gpu::memory`]),
//!   allocated and initialised before timing, every operator prepared, one stream pool
//!   per logical GPU, one event per plan event, a copy stream per logical GPU for transfers,
//!   fork/join through an origin stream. It runs iterations eagerly or as a captured graph,
//!   times them, reads outputs back, and checks them ([`CheckMode`]: against a sequential run
//!   of the same kernels and against the reference executor).
//! - [`bench`](mod@bench): timing pieces of a graph (one operator, a concurrent stage, a transfer) as the
//!   profiler needs them, by replaying captured graphs and timing them with device events.
//!
//! Logical GPUs map onto the device's units round-robin ([`map_gpus`]): several logical GPUs
//! may share one (each keeps its own streams; transfers become device-to-device copies), so a
//! multi-GPU schedule runs on one GPU, or on the CPU.
//!
//! A merged stage (`LaunchMerged`) runs as one convolution where
//! [`opsched_gpu::GraphProgram::build_merged`] can merge it, else its operators one after
//! another on its stream.

pub mod bench;
pub mod run;

use std::collections::HashMap;
use std::sync::Arc;

use opsched_graph::{NodeId, Tensor};

pub use opsched_gpu::{
    ConvApi, ConvGemm, CpuDevice, CudaDevice, Device, DeviceReport, GemmKernel, GpuError,
    KernelOptions, Summary, TransferMode,
};
pub use run::{map_gpus, run_plan, run_schedule, CheckReport, OpTime, RunReport, Session};

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The device (a missing library, no device, a CUDA error, an unsupported operator).
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// Lowering the schedule, or a launch plan that does not check.
    #[error(transparent)]
    Schedule(#[from] opsched_schedule::ScheduleError),
    /// A launch plan the runtime cannot execute as given (names the operator or event).
    #[error("launch plan: {0}")]
    Plan(String),
}

/// What the numerical check compares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum CheckMode {
    /// No check.
    #[default]
    None,
    /// Against a sequential run of the same kernels (NCHW: a channels-last run's check is
    /// against the other layout), and against the reference executor when
    /// the graph has at most [`RunOptions::reference_max_flops`] FLOPs.
    Auto,
    /// Both, whatever the size (the reference executor can take minutes on large inputs).
    Full,
}

/// Which device runs a plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum Backend {
    /// CUDA when a driver is present, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

impl Backend {
    /// `Auto` resolved on this machine: CUDA when the driver loads and reports a GPU.
    pub fn resolve(self) -> Backend {
        match self {
            Backend::Auto => {
                if opsched_gpu::Lib::Driver.present()
                    && opsched_gpu::devices().is_ok_and(|d| !d.is_empty())
                {
                    Backend::Cuda
                } else {
                    Backend::Cpu
                }
            }
            other => other,
        }
    }
}

/// Options of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunOptions {
    /// Values of graph inputs (the others are pseudo-random from their names); each has the
    /// input's shape (see `opsched::npy::bind_inputs`).
    pub inputs: Arc<HashMap<NodeId, Tensor>>,
    /// Read the graph's outputs back into [`RunReport::outputs`].
    pub keep_outputs: bool,
    /// Capture one whole iteration as a graph and time its replays.
    pub graph_capture: bool,
    pub warmup: u32,
    pub repeats: u32,
    pub check: CheckMode,
    pub reference_max_flops: u64,
    pub transfers: TransferMode,
    pub kernels: KernelOptions,
    /// Let buffers share storage where the schedule orders their uses apart
    /// ([`opsched_gpu::memory::layout_reusing`]); the values of operators other than the graph's
    /// outputs are then gone after a run. `false` keeps every value readable.
    pub reuse_memory: bool,
    /// How 4-D activations are stored ([`opsched_gpu::program::Layout`]); `None`: as the
    /// device prefers ([`opsched_gpu::Device::preferred_layout`]: channels last on CUDA, NCHW
    /// on the CPU).
    pub layout: Option<opsched_gpu::program::Layout>,
    /// After timing, run `warmup + repeats` more iterations eagerly with an event on each
    /// side of every launch, into [`crate::RunReport::op_times`].
    pub op_times: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            inputs: Arc::default(),
            keep_outputs: false,
            graph_capture: false,
            warmup: 10,
            repeats: 100,
            check: CheckMode::None,
            reference_max_flops: 2_000_000_000,
            transfers: TransferMode::Auto,
            kernels: KernelOptions::default(),
            reuse_memory: true,
            layout: None,
            op_times: false,
        }
    }
}
