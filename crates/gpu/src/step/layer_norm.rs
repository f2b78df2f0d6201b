//! Layer normalisation over the last axis of `[rows, dim]` with `gamma` and `beta` (biased
//! variance, as PyTorch).
#![allow(unsafe_code)]

use cudarc::driver::{LaunchConfig, PushKernelArg};
use serde::Serialize;

use super::{Access, Step, StepKernel};
use crate::cpu::math::{for_planes, sum, sum_of, with_avx512};
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
        let (x, gamma, beta) = (&x[..self.rows * dim], &gamma[..dim], &beta[..dim]);
        // A row's sums in vectorised partial sums, its normalisation one vectorised pass.
        for_planes(y, dim, dim, |r, yr| {
            let xr = &x[r * dim..(r + 1) * dim];
            let mean = sum(xr) / dim as f32;
            let var = sum_of(xr, |v| (v - mean) * (v - mean)) / dim as f32;
            let inv = 1.0 / (var + self.eps).sqrt();
            with_avx512(
                #[inline(always)]
                || {
                    let scale = gamma.iter().zip(beta);
                    for ((o, &v), (&g, &b)) in yr.iter_mut().zip(xr).zip(scale) {
                        *o = (v - mean) * inv * g + b;
                    }
                },
            );
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The CPU kernel against the reference's in-order sums, within 2e-6 of the largest
        /// output (the CPU adds in sixteen partial sums), on rows of any length; offset far
        /// from zero, a mean that dwarfs the spread, both round it by as much as the offset's
        /// last bit, so the bound grows with it.
        #[test]
        fn layer_norms_match_the_reference(
            rows in 1usize..6, dim in 1usize..100, offset in prop_oneof![Just(0.0f32), Just(50.0)],
        ) {
            let values = |len: usize, seed: usize| -> Vec<f32> {
                (0..len).map(|i| ((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0 - 1.0).collect()
            };
            let x: Vec<f32> = values(rows * dim, 1).iter().map(|v| v + offset).collect();
            let (gamma, beta) = (values(dim, 2), values(dim, 3));
            let s = LayerNorm { x: 0, gamma: 1, beta: 2, y: 3, rows, dim, eps: 1e-5 };
            let mut y = vec![f32::NAN; rows * dim];
            s.run_cpu(&mut CpuIo::of(
                vec![(0, &x[..]), (1, &gamma[..]), (2, &beta[..])],
                vec![(3, &mut y[..])],
            ))
            .unwrap();
            let want = crate::reference::layer_norm(&x, &gamma, &beta, rows, dim, 1e-5);
            let top = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            for (g, w) in y.iter().zip(&want) {
                prop_assert!((g - w).abs() <= 2e-6 * top * (1.0 + offset), "{} vs {}", g, w);
            }
        }
    }
}
