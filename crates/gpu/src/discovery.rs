//! Finding the CUDA libraries and the GPUs, without ever panicking.
//!
//! cudarc loads every library lazily and panics when a symbol's library is missing, so every
//! entry point of this crate first asks [`check_libraries`], which tries to load each library
//! (`is_culib_present`) and returns [`GpuError::LibraryMissing`] naming the library and how to
//! make it visible.

use opsched_cost::cache::DeviceFingerprint;
use serde::Serialize;

use crate::GpuError;

/// A CUDA library the backend loads at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Lib {
    /// The driver API (`libcuda.so`, installed with the NVIDIA driver).
    Driver,
    /// Run-time compilation (`libnvrtc.so.13`).
    Nvrtc,
    /// `libcublas.so.13`.
    Cublas,
    /// `libcublasLt.so.13` (matrix products with a fused epilogue; shipped with cuBLAS).
    CublasLt,
    /// `libcudnn.so.9`.
    Cudnn,
    /// `libnccl.so` (only for transfers between physical GPUs with NCCL).
    Nccl,
}

/// What the backend needs to run any graph on one GPU.
pub const REQUIRED: &[Lib] = &[
    Lib::Driver,
    Lib::Nvrtc,
    Lib::Cublas,
    Lib::CublasLt,
    Lib::Cudnn,
];

impl Lib {
    /// The library's file name as cudarc looks for it (first candidate).
    pub fn file(self) -> &'static str {
        match self {
            Lib::Driver => "libcuda.so",
            Lib::Nvrtc => "libnvrtc.so.13",
            Lib::Cublas => "libcublas.so.13",
            Lib::CublasLt => "libcublasLt.so.13",
            Lib::Cudnn => "libcudnn.so.9",
            Lib::Nccl => "libnccl.so",
        }
    }

    /// How to make the library visible to the loader.
    pub fn hint(self) -> String {
        let pip = |pkg: &str, module: &str| {
            format!(
                "install it (e.g. `pip install {pkg}`) and add its lib directory to \
                 LD_LIBRARY_PATH: pip puts it under site-packages/nvidia/{module}/lib, e.g. \
                 `export LD_LIBRARY_PATH=$(python3 -c 'import nvidia.{module}, os; \
                 print(os.path.dirname(nvidia.{module}.__file__))')/lib:$LD_LIBRARY_PATH`"
            )
        };
        match self {
            Lib::Driver => "libcuda.so (the NVIDIA driver) is not on this machine's loader path: \
                            no NVIDIA driver is installed, or LD_LIBRARY_PATH misses its \
                            directory (often /usr/lib/x86_64-linux-gnu or /usr/local/nvidia/lib64)"
                .to_string(),
            Lib::Nvrtc => format!(
                "{} not found; {}",
                self.file(),
                pip("nvidia-cuda-nvrtc", "cuda_nvrtc")
            ),
            Lib::Cublas | Lib::CublasLt => format!(
                "{} not found; {}",
                self.file(),
                pip("nvidia-cublas", "cublas")
            ),
            Lib::Cudnn => format!(
                "{} not found; {}",
                self.file(),
                pip("nvidia-cudnn-cu13", "cudnn")
            ),
            Lib::Nccl => format!(
                "{} not found; {}; pip installs only libnccl.so.2, and cudarc loads libnccl.so, \
                 so also create the link: `ln -s libnccl.so.2 libnccl.so` in that directory",
                self.file(),
                pip("nvidia-nccl-cu13", "nccl")
            ),
        }
    }

    /// Whether the library can be loaded now.
    #[allow(unsafe_code)]
    pub fn present(self) -> bool {
        // SAFETY: `is_culib_present` only tries `dlopen` on candidate names and drops the
        // handle; it runs no library code besides the loader's initialisers.
        unsafe {
            match self {
                Lib::Driver => cudarc::driver::sys::is_culib_present(),
                Lib::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                Lib::Cublas => cudarc::cublas::sys::is_culib_present(),
                Lib::CublasLt => cudarc::cublaslt::sys::is_culib_present(),
                Lib::Cudnn => cudarc::cudnn::sys::is_culib_present(),
                Lib::Nccl => cudarc::nccl::sys::is_culib_present(),
            }
        }
    }
}

impl std::fmt::Display for Lib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.file())
    }
}

/// Check that `libs` can be loaded, in order; the first missing one is the error.
pub fn check_libraries(libs: &[Lib]) -> Result<(), GpuError> {
    check_with(libs, Lib::present)
}

/// [`check_libraries`] with an injectable probe (for tests).
pub fn check_with(libs: &[Lib], present: impl Fn(Lib) -> bool) -> Result<(), GpuError> {
    for &lib in libs {
        if !present(lib) {
            tracing::debug!("{} is missing", lib.file());
            return Err(GpuError::LibraryMissing {
                lib: lib.file(),
                hint: lib.hint(),
            });
        }
    }
    Ok(())
}

/// One GPU as the driver reports it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceInfo {
    pub ordinal: usize,
    /// e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    pub sms: u32,
    pub compute_capability: (i32, i32),
    pub total_mem_bytes: u64,
    /// Driver API version, e.g. "13.0".
    pub driver: String,
    /// cuDNN version, e.g. "9.10.2" (empty when cuDNN is missing).
    pub cudnn: String,
}

impl DeviceInfo {
    /// The cost-cache fingerprint of this device.
    pub fn fingerprint(&self) -> DeviceFingerprint {
        DeviceFingerprint {
            name: self.name.clone(),
            sms: self.sms,
            driver: self.driver.clone(),
            cudnn: self.cudnn.clone(),
        }
    }

    /// A file-name-safe form of the device name ("NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3").
    pub fn slug(&self) -> String {
        slug(&self.name)
    }
}

/// Lower-case letters and digits of `name`, other runs replaced by one `-`.
pub fn slug(name: &str) -> String {
    let mut s = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.ends_with('-') && !s.is_empty() {
            s.push('-');
        }
    }
    while s.ends_with('-') {
        s.pop();
    }
    if s.is_empty() {
        "gpu".into()
    } else {
        s
    }
}

/// "13000" -> "13.0"; "12040" -> "12.4".
pub fn format_cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// cuDNN 9 encodes its version as major * 10000 + minor * 100 + patch.
pub fn format_cudnn_version(v: usize) -> String {
    if v >= 10000 {
        format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
    } else {
        format!("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100)
    }
}

/// The GPUs present (checks the driver library first; cuDNN's version when it loads).
#[allow(unsafe_code)]
pub fn devices() -> Result<Vec<DeviceInfo>, GpuError> {
    check_libraries(&[Lib::Driver])?;
    use cudarc::driver::{result, sys};
    result::init().map_err(|e| GpuError::driver("initialising the driver", e))?;
    let count = result::device::get_count().map_err(|e| GpuError::driver("counting devices", e))?;
    if count <= 0 {
        return Err(GpuError::NoDevice { count });
    }
    let mut version = 0i32;
    // SAFETY: a plain out-parameter call; the driver library is loaded (checked above).
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(|e| GpuError::driver("reading the driver version", e))?;
    let cudnn = if Lib::Cudnn.present() {
        format_cudnn_version(cudarc::cudnn::result::get_version())
    } else {
        String::new()
    };
    let mut out = Vec::with_capacity(count as usize);
    for ordinal in 0..count {
        let dev = result::device::get(ordinal)
            .map_err(|e| GpuError::driver(format!("opening device {ordinal}"), e))?;
        let name = result::device::get_name(dev)
            .map_err(|e| GpuError::driver(format!("reading the name of device {ordinal}"), e))?;
        let attr = |a: sys::CUdevice_attribute| {
            // SAFETY: `dev` is a valid device handle from `device::get`.
            unsafe { result::device::get_attribute(dev, a) }
                .map_err(|e| GpuError::driver(format!("reading attribute {a:?}"), e))
        };
        let sms = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        // SAFETY: as above.
        let mem = unsafe { result::device::total_mem(dev) }
            .map_err(|e| GpuError::driver("reading total memory", e))?;
        out.push(DeviceInfo {
            ordinal: ordinal as usize,
            name,
            sms: sms.max(0) as u32,
            compute_capability: (major, minor),
            total_mem_bytes: mem as u64,
            driver: format_cuda_version(version),
            cudnn: cudnn.clone(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn missing_library_is_a_typed_error_with_a_hint() {
        let e = check_with(REQUIRED, |l| l != Lib::Cudnn).unwrap_err();
        match &e {
            GpuError::LibraryMissing { lib, hint } => {
                assert_eq!(*lib, "libcudnn.so.9");
                assert!(hint.contains("LD_LIBRARY_PATH"), "{hint}");
                assert!(hint.contains("site-packages/nvidia/cudnn/lib"), "{hint}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(e
            .to_string()
            .starts_with("libcudnn.so.9 could not be loaded"));
        let nccl = Lib::Nccl.hint();
        assert!(nccl.contains("ln -s libnccl.so.2 libnccl.so"), "{nccl}");
        assert!(check_with(REQUIRED, |_| true).is_ok());
        // The first missing library in order is reported.
        let e = check_with(REQUIRED, |_| false).unwrap_err();
        assert!(e.to_string().starts_with("libcuda.so"));
    }

    #[test]
    fn versions_and_slugs() {
        assert_eq!(format_cuda_version(13000), "13.0");
        assert_eq!(format_cuda_version(12040), "12.4");
        assert_eq!(format_cudnn_version(91002), "9.10.2");
        assert_eq!(format_cudnn_version(8906), "8.9.6");
        assert_eq!(slug("NVIDIA H100 80GB HBM3"), "nvidia-h100-80gb-hbm3");
        assert_eq!(slug("  A/B  "), "a-b");
        assert_eq!(slug("???"), "gpu");
    }

    /// On a machine without the driver (CI), discovery must fail with the typed error, never
    /// panic. On a GPU machine it lists at least one device.
    #[test]
    fn devices_never_panics() {
        match devices() {
            Ok(list) => assert!(!list.is_empty()),
            Err(GpuError::LibraryMissing { lib, .. }) => assert_eq!(lib, "libcuda.so"),
            Err(other) => {
                // A driver without a GPU (or a broken install): still an error, not a panic.
                assert!(!other.to_string().is_empty());
            }
        }
    }
}
