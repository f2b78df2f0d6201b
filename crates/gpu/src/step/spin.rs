//! Abstract operators (cost-annotated DAGs): keep `util` of the GPU's SMs busy for `time_ms`.
//! The CPU device does nothing for them (they have no data).
#![allow(unsafe_code)]

use cudarc::driver::{LaunchConfig, PushKernelArg};
use serde::Serialize;

use super::{Access, StepKernel};
use crate::cpu::CpuIo;
use crate::cuda::{launched, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::GpuError;

/// A spin step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Spin {
    pub time_ms: f64,
    pub util: f64,
}

impl StepKernel for Spin {
    fn kind(&self) -> &'static str {
        "spin"
    }

    fn access(&self) -> Access {
        Access::default()
    }

    fn run_cpu(&self, _io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        Ok(Box::new(CudaSpin {
            ns: (self.time_ms * 1e6).max(0.0) as u64,
            blocks: ((self.util * f64::from(cx.gpu.info.sms)).ceil() as u32).max(1),
        }))
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some("spin")
    }
}

struct CudaSpin {
    ns: u64,
    blocks: u32,
}

impl Enqueue for CudaSpin {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let mut b = sc.launch_builder(gpu.function("spin")?);
        b.arg(&self.ns);
        let cfg = LaunchConfig {
            grid_dim: (self.blocks, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `spin` (one u64, no memory).
        launched(unsafe { b.launch(cfg) }, "spin")
    }
}
