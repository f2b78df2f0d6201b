//! Constant padding of every axis (ONNX's `Pad` in constant mode); on CUDA the `pad` NVRTC
//! kernel, up to six axes.
#![allow(unsafe_code)]

use cudarc::driver::PushKernelArg;
use rayon::prelude::*;
use serde::Serialize;

use super::{product, Access, Step, StepKernel};
use crate::cpu::CpuIo;
use crate::cuda::nvrtc::{dims6, MAX_RANK};
use crate::cuda::{grid, launched, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{At, BufId, Builder, Src};
use crate::GpuError;

/// `y` = `x` of shape `shape` with `begin[i]` and `end[i]` elements of `value` around axis `i`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Pad {
    pub x: BufId,
    pub y: BufId,
    pub shape: Vec<usize>,
    pub begin: Vec<usize>,
    pub end: Vec<usize>,
    pub value: f32,
}

impl Eq for Pad {}

/// Lower a `pad` operator.
#[allow(clippy::too_many_arguments)]
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    begin: &[usize],
    end: &[usize],
    value: f32,
    src: Src<'_>,
    out: BufId,
) -> Result<(), GpuError> {
    let (x, shape) = b.single(steps, at, src)?;
    if begin.len() != shape.len() || end.len() != shape.len() {
        return Err(b.unsupported(at, "pads do not match the input's rank"));
    }
    steps.push(
        Pad {
            x,
            y: out,
            shape,
            begin: begin.to_vec(),
            end: end.to_vec(),
            value,
        }
        .into(),
    );
    Ok(())
}

impl Pad {
    pub(crate) fn out_shape(&self) -> Vec<usize> {
        self.shape
            .iter()
            .zip(self.begin.iter().zip(&self.end))
            .map(|(d, (b, e))| d + b + e)
            .collect()
    }
}

impl StepKernel for Pad {
    fn kind(&self) -> &'static str {
        "pad"
    }

    fn access(&self) -> Access {
        Access {
            reads: vec![(self.x, self.shape.iter().product())],
            writes: vec![(self.y, self.out_shape().iter().product())],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let out = self.out_shape();
        let n = product(&out, "padded tensor")?;
        let x = io.read(self.x)?;
        let y = &mut io.write(self.y)?[..n];
        let rank = out.len();
        if rank == 0 {
            y.copy_from_slice(&x[..n]);
            return Ok(());
        }
        let (w_in, w_out) = (self.shape[rank - 1], out[rank - 1]);
        let (lead, tail) = (self.begin[rank - 1], self.end[rank - 1]);
        // One output row per index of the leading axes: padding, or a row of `x` between pads.
        y.par_chunks_mut(w_out.max(1))
            .enumerate()
            .for_each(|(row, yr)| {
                let (mut src, mut inside, mut r, mut stride) = (0usize, true, row, w_in);
                for ax in (0..rank - 1).rev() {
                    let i = r % out[ax];
                    r /= out[ax];
                    match i
                        .checked_sub(self.begin[ax])
                        .filter(|&v| v < self.shape[ax])
                    {
                        Some(v) => src += v * stride,
                        None => inside = false,
                    }
                    stride *= self.shape[ax];
                }
                if inside {
                    yr[..lead].fill(self.value);
                    yr[lead..lead + w_in].copy_from_slice(&x[src..src + w_in]);
                    yr[w_out - tail..].fill(self.value);
                } else {
                    yr.fill(self.value);
                }
            });
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        let (y, x) = (cx.ptr(self.y)?, cx.ptr(self.x)?);
        CudaPad::new(
            y,
            x,
            &self.shape,
            &self.out_shape(),
            &self.begin,
            self.value,
        )
        .map(|p| Box::new(p) as Box<dyn Enqueue>)
        .map_err(|e| match e {
            None => cx.no_kernel(format!(
                "pad of {} axes (at most {MAX_RANK})",
                self.shape.len()
            )),
            Some(e) => e,
        })
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some("pad")
    }
}

/// The `pad` kernel with its parameters (also a convolution's explicit padding on CUDA).
pub(crate) struct CudaPad {
    y: u64,
    x: u64,
    total: usize,
    rank: i32,
    out: [i64; 6],
    shape: [i64; 6],
    begin: [i64; 6],
    value: f32,
}

impl CudaPad {
    /// Pad `x` (of `shape`) into `y` (of `out`), `begin` elements of `value` before each axis;
    /// `Err(None)` beyond the kernel's [`MAX_RANK`] axes.
    pub(crate) fn new(
        y: u64,
        x: u64,
        shape: &[usize],
        out: &[usize],
        begin: &[usize],
        value: f32,
    ) -> Result<CudaPad, Option<GpuError>> {
        let rank = out.len();
        if rank > MAX_RANK || shape.len() != rank || begin.len() != rank {
            return Err(None);
        }
        let dims = |v: &[usize]| {
            dims6(v, 0)
                .ok_or_else(|| GpuError::Plan(format!("pad: an extent of {v:?} exceeds i64")))
        };
        Ok(CudaPad {
            y,
            x,
            total: product(out, "padded tensor")?,
            rank: rank as i32,
            out: dims(out)?,
            shape: dims(shape)?,
            begin: dims(begin)?,
            value,
        })
    }
}

impl Enqueue for CudaPad {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let total = self.total as i64;
        let mut b = sc.launch_builder(gpu.function("pad")?);
        b.arg(&self.y)
            .arg(&self.x)
            .arg(&total)
            .arg(&self.rank)
            .arg(&self.out)
            .arg(&self.shape)
            .arg(&self.begin)
            .arg(&self.value);
        // SAFETY: matches `pad` (three 48-byte Dims6 structs by value); x holds the product of
        // `shape`, y of `out` (checked at preparation), rank <= 6.
        launched(unsafe { b.launch(grid(self.total)) }, "pad")
    }
}
