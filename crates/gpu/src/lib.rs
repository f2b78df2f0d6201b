//! # opsched-gpu
//!
//! The GPU backend of opsched, on [cudarc](https://docs.rs/cudarc) with dynamic loading: it
//! builds on any machine (no CUDA toolkit needed) and finds the CUDA libraries at run time.
//!
//! - [`discovery`]: which libraries load ([`discovery::check_libraries`], a typed
//!   [`GpuError::LibraryMissing`] with an `LD_LIBRARY_PATH` hint, never a panic) and which GPUs
//!   exist ([`discovery::devices`], with the cost-cache fingerprint).
//! - [`program`]: the lowering of every operator of the IR to primitive steps, with all
//!   buffers planned and sized up front (CPU only, tested here).
//! - [`reference`]: a reference executor from the operator semantics, for numerical checks.
//! - [`cpu`]: a step executor replaying a program's steps on host buffers.
//! - [`kernels`]: the NVRTC sources (slab copies for concat/slices/term sums, bias +
//!   activation, activation, pooling, N-input add/mul, layer norm, permute, spin).
//! - [`cuda`]: the device side: [`cuda::Gpu`] (context with cudarc's event tracking off,
//!   compiled kernels), [`cuda::StreamCtx`] (one stream with its own cuDNN and cuBLAS handles
//!   and workspaces), [`cuda::DeviceMemory`], and [`cuda::PreparedOp`]s that enqueue an
//!   operator without allocating: cuDNN convolutions (algorithm chosen by measurement with
//!   `cudnnFindConvolutionForwardAlgorithmEx`, cached per device and convolution), fused
//!   conv + bias + relu where cuDNN supports it, cuDNN softmax, cuBLAS (batched) gemm.
//! - [`stats`]: median / p10 / p90 of repeated timings.
//!
//! Only `f32` graphs run for now ([`GpuError::UnsupportedDType`] otherwise). Pooling uses an
//! NVRTC kernel rather than cuDNN so that PyTorch's `ceil_mode` windows (GoogLeNet) are exact.

pub mod cpu;
pub mod cuda;
pub mod discovery;
mod error;
pub mod kernels;
pub mod program;
pub mod reference;
pub mod stats;

pub use discovery::{check_libraries, devices, DeviceInfo, Lib, REQUIRED};
pub use error::GpuError;
pub use program::{BufId, GraphProgram, OpProgram, Step, TransferSpec};
pub use stats::Summary;
