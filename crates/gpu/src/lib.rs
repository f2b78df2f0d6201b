//! # opsched-gpu
//!
//! The device layer of opsched: one [`Device`] seam with a CUDA and a CPU implementation, and
//! the programs both run.
//!
//! - [`program`]: the lowering of every operator of the IR to primitive steps, with all
//!   buffers planned and sized up front ([`GraphProgram`]); device-independent.
//! - [`step`]: one module per step kind (copy, conv, activation, pool, gemm, softmax, layer
//!   norm, element-wise, broadcast, pad, transpose, spin), each with its parameters, the
//!   lowering of the IR operators that produce it, its CPU kernel and its CUDA preparation and
//!   launch (or a clear refusal where the CUDA device has no kernel yet).
//! - [`device`]: the [`Device`] trait (memory, streams, events, prepared operators, graph
//!   capture, transfers) that the runtime, the profiler and the numerical check use.
//! - [`cuda`]: [`CudaDevice`], NVIDIA GPUs through cudarc with dynamic loading: it builds on
//!   any machine (no CUDA toolkit needed) and finds the libraries at run time; the only code
//!   that touches raw device pointers (with the CUDA halves of the step modules).
//! - [`cpu`]: [`CpuDevice`], the host: streams as worker threads, real events, a race detector
//!   and checked graph capture, so multi-stream plans run (and are tested) without a GPU.
//! - [`reference`](mod@reference): a reference executor from the operator semantics, for numerical checks.
//! - [`discovery`]: which CUDA libraries load ([`check_libraries`], a typed
//!   [`GpuError::LibraryMissing`] with an `LD_LIBRARY_PATH` hint, never a panic) and which
//!   GPUs exist ([`devices`], with the cost-cache fingerprint).
//! - [`stats`]: median / p10 / p90 of repeated timings.
//!
//! Buffers start with the graph's weights (ONNX models) or pseudo-random values seeded by node
//! names. Only `f32` graphs run for now ([`GpuError::UnsupportedDType`] otherwise).

pub mod cpu;
pub mod cuda;
pub mod device;
pub mod discovery;
mod error;
pub mod memory;
pub mod program;
pub mod reference;
pub mod stats;
pub mod step;
pub mod tuning;

pub use cpu::CpuDevice;
pub use cuda::CudaDevice;
pub use device::{
    ConvApi, ConvGemm, Device, DeviceReport, GemmKernel, KernelOptions, TransferMode,
};
pub use discovery::{check_libraries, devices, DeviceInfo, Lib, REQUIRED};
pub use error::GpuError;
pub use program::{BufId, GraphProgram, OpProgram, TransferSpec};
pub use stats::Summary;
pub use step::Step;
