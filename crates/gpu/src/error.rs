//! Errors of the GPU backend.

/// Everything that can go wrong between finding a GPU and reading back a result.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// A CUDA library could not be loaded.
    #[error("{lib} could not be loaded: {hint}")]
    LibraryMissing { lib: &'static str, hint: String },
    /// The driver loaded but reports no GPU.
    #[error("no CUDA device found (the driver reports {count} devices)")]
    NoDevice { count: i32 },
    /// A GPU index beyond the devices present.
    #[error("GPU {requested} requested, but only {available} present")]
    DeviceIndex { requested: usize, available: usize },
    /// A CUDA driver call failed.
    #[error("CUDA driver error while {during}: {message}")]
    Driver { during: String, message: String },
    /// A cuDNN call failed.
    #[error("cuDNN error while {during}: {message}")]
    Cudnn { during: String, message: String },
    /// A cuBLAS call failed.
    #[error("cuBLAS error while {during}: {message}")]
    Cublas { during: String, message: String },
    /// An NVRTC kernel did not compile.
    #[error("NVRTC could not compile {kernel}: {log}")]
    Nvrtc { kernel: String, log: String },
    /// An NCCL call failed.
    #[error("NCCL error while {during}: {message}")]
    Nccl { during: String, message: String },
    /// An operator this backend cannot run (names the node).
    #[error("node '{node}': {message}")]
    Unsupported { node: String, message: String },
    /// Only f32 graphs run on the GPU backend for now.
    #[error("element type {0} is not supported by the GPU backend (only f32)")]
    UnsupportedDType(String),
    /// A launch plan, placement or buffer plan that cannot be executed.
    #[error("{0}")]
    Plan(String),
}

impl GpuError {
    /// Whether the machine or the input cannot do what was asked (no driver or device, an
    /// operator or dtype the backend does not run, a malformed plan) rather than opsched
    /// failing; the CLI exits with code 2 for these.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            GpuError::LibraryMissing { .. }
                | GpuError::NoDevice { .. }
                | GpuError::DeviceIndex { .. }
                | GpuError::Unsupported { .. }
                | GpuError::UnsupportedDType(_)
                | GpuError::Plan(_)
        )
    }

    /// A driver error with what was being done.
    pub fn driver(during: impl Into<String>, e: impl std::fmt::Debug) -> Self {
        GpuError::Driver {
            during: during.into(),
            message: format!("{e:?}"),
        }
    }
    /// A cuDNN error with what was being done.
    pub fn cudnn(during: impl Into<String>, e: impl std::fmt::Debug) -> Self {
        GpuError::Cudnn {
            during: during.into(),
            message: format!("{e:?}"),
        }
    }
    /// A cuBLAS error with what was being done.
    pub fn cublas(during: impl Into<String>, e: impl std::fmt::Debug) -> Self {
        GpuError::Cublas {
            during: during.into(),
            message: format!("{e:?}"),
        }
    }
    /// An NCCL error with what was being done.
    pub fn nccl(during: impl Into<String>, e: impl std::fmt::Debug) -> Self {
        GpuError::Nccl {
            during: during.into(),
            message: format!("{e:?}"),
        }
    }
}
