//! Constant padding of every axis (ONNX's `Pad` in constant mode). CPU only for now: the CUDA
//! device refuses it with a clear error.

use rayon::prelude::*;
use serde::Serialize;

use super::{product, Access, Step, StepKernel};
use crate::cpu::CpuIo;
use crate::cuda::{Enqueue, PrepareCx};
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
    fn out_shape(&self) -> Vec<usize> {
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
        Err(cx.no_kernel("pad"))
    }
}
