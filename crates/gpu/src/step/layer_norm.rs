//! Layer normalisation over the last axis of `[rows, dim]` with `gamma` and `beta` (biased
//! variance, as PyTorch).
#![allow(unsafe_code)]

use cudarc::driver::{LaunchConfig, PushKernelArg};
use rayon::prelude::*;
use serde::Serialize;

use super::{Access, Step, StepKernel};
use crate::cpu::CpuIo;
use crate::cuda::cudnn::c_int;
use crate::cuda::nvrtc::layer_norm_block;
use crate::cuda::{launched, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{At, BufId, Builder, Src};
use crate::GpuError;

/// A layer-norm step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerNorm {
    pub x: BufId,
    pub gamma: BufId,
    pub beta: BufId,
    pub y: BufId,
    pub rows: usize,
    pub dim: usize,
    pub eps: f32,
}

/// Lower a `layer_norm` operator.
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    eps: f64,
    src: Src<'_>,
    out: BufId,
) -> Result<(), GpuError> {
    let (x, xs) = b.single(steps, at, src)?;
    let dim = xs.last().copied().unwrap_or(1);
    let gamma = b.param(at, "gamma", dim, 1.0, 0.1)?;
    let beta = b.param(at, "beta", dim, 0.0, 0.1)?;
    steps.push(
        LayerNorm {
            x,
            gamma,
            beta,
            y: out,
            rows: xs.iter().product::<usize>() / dim.max(1),
            dim,
            eps: eps as f32,
        }
        .into(),
    );
    Ok(())
}

impl StepKernel for LayerNorm {
    fn kind(&self) -> &'static str {
        "layer_norm"
    }

    fn access(&self) -> Access {
        let n = self.rows * self.dim;
        Access {
            reads: vec![(self.x, n), (self.gamma, self.dim), (self.beta, self.dim)],
            writes: vec![(self.y, n)],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let dim = self.dim;
        if dim == 0 || self.rows == 0 {
            return Ok(());
        }
        let x = io.read(self.x)?;
        let gamma = io.read(self.gamma)?;
        let beta = io.read(self.beta)?;
        let y = &mut io.write(self.y)?[..self.rows * dim];
        y.par_chunks_mut(dim).enumerate().for_each(|(r, yr)| {
            let xr = &x[r * dim..(r + 1) * dim];
            let mean = xr.iter().sum::<f32>() / dim as f32;
            let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / dim as f32;
            let inv = 1.0 / (var + self.eps).sqrt();
            for d in 0..dim {
                yr[d] = (xr[d] - mean) * inv * gamma[d] + beta[d];
            }
        });
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        Ok(Box::new(CudaLayerNorm {
            y: cx.ptr(self.y)?,
            x: cx.ptr(self.x)?,
            gamma: cx.ptr(self.gamma)?,
            beta: cx.ptr(self.beta)?,
            rows: self.rows as i64,
            dim: c_int(self.dim, "dim")?,
            eps: self.eps,
        }))
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some("layer_norm")
    }
}

struct CudaLayerNorm {
    y: u64,
    x: u64,
    gamma: u64,
    beta: u64,
    rows: i64,
    dim: i32,
    eps: f32,
}

impl Enqueue for CudaLayerNorm {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let mut b = sc.launch_builder(gpu.function("layer_norm")?);
        b.arg(&self.y)
            .arg(&self.x)
            .arg(&self.gamma)
            .arg(&self.beta)
            .arg(&self.rows)
            .arg(&self.dim)
            .arg(&self.eps);
        let cfg = LaunchConfig {
            grid_dim: (self.rows.clamp(1, 65_535 * 16) as u32, 1, 1),
            block_dim: (layer_norm_block(self.dim as usize), 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `layer_norm`; the block is a multiple of 32 and at most 1024 (the
        // kernel's warp reductions and shared array); buffer sizes checked at preparation.
        launched(unsafe { b.launch(cfg) }, "layer_norm")
    }
}
