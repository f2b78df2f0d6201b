//! Softmax and log-softmax over the middle axis of `[outer, dim, inner]`. On CUDA, cuDNN's
//! channel mode in its accurate or log algorithm; where the rows are contiguous (`inner` 1:
//! attention scores, a classifier's logits) also our `softmax_rows` kernel, a warp per row,
//! and the faster of the two as measured on the device and kept in the cost cache
//! ([`crate::tuning::SOFTMAX_KEY`]), so every process runs the same kernel.
#![allow(unsafe_code)]

use std::ffi::c_void;

use cudarc::cudnn::{result as dnn, sys as dnn_sys};
use cudarc::driver::PushKernelArg;
use rayon::prelude::*;
use serde::Serialize;

use super::{Access, Step, StepKernel};
use crate::cpu::CpuIo;
use crate::cuda::cudnn::{as_i64, tensor4, TensorDesc};
use crate::cuda::{grid, launched, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{At, BufId, Builder, Src};
use crate::GpuError;

/// A softmax step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Softmax {
    pub x: BufId,
    pub y: BufId,
    pub outer: usize,
    pub dim: usize,
    pub inner: usize,
    /// `log(softmax(x))`, computed as `x - max - log(sum(exp(x - max)))`.
    pub log: bool,
}

/// Lower a `softmax` operator (a negative axis counts from the end).
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    axis: i64,
    log: bool,
    src: Src<'_>,
    out: BufId,
) -> Result<(), GpuError> {
    let (x, xs) = b.single(steps, at, src)?;
    let r = xs.len() as i64;
    let ax = if axis < 0 { r + axis } else { axis };
    if ax < 0 || ax >= r {
        return Err(b.unsupported(at, "softmax axis out of range"));
    }
    let ax = ax as usize;
    steps.push(
        Softmax {
            x,
            y: out,
            outer: xs[..ax].iter().product(),
            dim: xs[ax],
            inner: xs[ax + 1..].iter().product(),
            log,
        }
        .into(),
    );
    Ok(())
}

impl StepKernel for Softmax {
    fn kind(&self) -> &'static str {
        "softmax"
    }

    fn access(&self) -> Access {
        let n = self.outer * self.dim * self.inner;
        Access {
            reads: vec![(self.x, n)],
            writes: vec![(self.y, n)],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let (dim, inner) = (self.dim, self.inner);
        let block = dim * inner;
        if block == 0 || self.outer == 0 {
            return Ok(());
        }
        let x = io.read(self.x)?;
        let y = &mut io.write(self.y)?[..self.outer * block];
        y.par_chunks_mut(block).enumerate().for_each(|(o, yb)| {
            let xb = &x[o * block..(o + 1) * block];
            for i in 0..inner {
                let m = (0..dim)
                    .map(|d| xb[d * inner + i])
                    .fold(f32::NEG_INFINITY, f32::max);
                let mut s = 0.0f32;
                for d in 0..dim {
                    let e = (xb[d * inner + i] - m).exp();
                    yb[d * inner + i] = e;
                    s += e;
                }
                if self.log {
                    let ls = s.ln();
                    for d in 0..dim {
                        yb[d * inner + i] = xb[d * inner + i] - m - ls;
                    }
                } else {
                    for d in 0..dim {
                        yb[d * inner + i] /= s;
                    }
                }
            }
        });
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        use crate::tuning::{choose, SOFTMAX_CUDNN, SOFTMAX_KEY, SOFTMAX_ROWS};
        let (x, y) = (cx.ptr(self.x)?, cx.ptr(self.y)?);
        let cudnn = CudaSoftmax {
            x,
            y,
            desc: tensor4([self.outer, self.dim, self.inner, 1])?,
            algo: if self.log {
                dnn_sys::cudnnSoftmaxAlgorithm_t::CUDNN_SOFTMAX_LOG
            } else {
                dnn_sys::cudnnSoftmaxAlgorithm_t::CUDNN_SOFTMAX_ACCURATE
            },
        };
        if self.inner != 1 || self.outer == 0 || self.dim == 0 {
            return Ok(Box::new(cudnn));
        }
        let rows = SoftmaxRows {
            x,
            y,
            rows: as_i64(self.outer, "softmax rows")?,
            dim: crate::cuda::cudnn::c_int(self.dim, "softmax row length")?,
            log: i32::from(self.log),
        };
        let key = format!(
            "{SOFTMAX_KEY}rows={}|dim={}|{}",
            self.outer,
            self.dim,
            if self.log { "log" } else { "accurate" }
        );
        let (gpu, sc): (&Gpu, &StreamCtx) = (cx.gpu, cx.sc);
        let candidates = cx.timed(
            &key,
            TIMING_REPS,
            &[
                (SOFTMAX_CUDNN, &|| cudnn.enqueue(gpu, sc)),
                (SOFTMAX_ROWS, &|| rows.enqueue(gpu, sc)),
            ],
        )?;
        Ok(match choose(&candidates, usize::MAX).map(|c| c.algo) {
            Some(SOFTMAX_ROWS) => Box::new(rows),
            _ => Box::new(cudnn),
        })
    }
}

/// GPU runs per captured graph when timing a softmax kernel.
const TIMING_REPS: usize = 10;

/// `softmax_rows`: a warp per contiguous row.
struct SoftmaxRows {
    x: u64,
    y: u64,
    rows: i64,
    dim: i32,
    log: i32,
}

impl Enqueue for SoftmaxRows {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let mut b = sc.launch_builder(gpu.function("softmax_rows")?);
        b.arg(&self.y)
            .arg(&self.x)
            .arg(&self.rows)
            .arg(&self.dim)
            .arg(&self.log);
        // SAFETY: matches `softmax_rows`; x and y hold `rows * dim` values (the step's access,
        // checked at preparation). A warp per row: 32 threads each.
        launched(
            unsafe { b.launch(grid((self.rows as usize).saturating_mul(32))) },
            "softmax_rows",
        )
    }
}

struct CudaSoftmax {
    x: u64,
    y: u64,
    desc: TensorDesc,
    /// Accurate (max-subtracted) softmax, or log-softmax.
    algo: dnn_sys::cudnnSoftmaxAlgorithm_t,
}

impl Enqueue for CudaSoftmax {
    fn enqueue(&self, _gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let (one, zero) = (1.0f32, 0.0f32);
        // SAFETY: one descriptor for x and y of equal size (checked at preparation).
        unsafe {
            dnn::softmax_forward(
                sc.cudnn(),
                self.algo,
                dnn_sys::cudnnSoftmaxMode_t::CUDNN_SOFTMAX_MODE_CHANNEL,
                (&one) as *const f32 as *const c_void,
                self.desc.0,
                self.x as *const c_void,
                (&zero) as *const f32 as *const c_void,
                self.desc.0,
                self.y as *mut c_void,
            )
        }
        .map_err(|e| GpuError::cudnn("running softmax", e))
    }
}
