//! `y = permute(x)`: `y` has shape `perm.map(|p| in_shape[p])`.
#![allow(unsafe_code)]

use cudarc::driver::PushKernelArg;
use serde::Serialize;

use super::{Access, Step, StepKernel};
use crate::cpu::CpuIo;
use crate::cuda::nvrtc::{permute_params, MAX_RANK};
use crate::cuda::{grid, launched, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{At, BufId, Builder, Src};
use crate::GpuError;

/// A transpose step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Transpose {
    pub x: BufId,
    pub y: BufId,
    pub in_shape: Vec<usize>,
    pub perm: Vec<usize>,
}

/// Lower a `transpose` operator.
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    perm: &[usize],
    src: Src<'_>,
    out: BufId,
) -> Result<(), GpuError> {
    let (x, xs) = b.single(steps, at, src)?;
    let mut sorted = perm.to_vec();
    sorted.sort_unstable();
    if sorted.iter().copied().ne(0..xs.len()) {
        return Err(b.unsupported(
            at,
            format!("{perm:?} is not a permutation of {xs:?}'s axes"),
        ));
    }
    steps.push(
        Transpose {
            x,
            y: out,
            in_shape: xs,
            perm: perm.to_vec(),
        }
        .into(),
    );
    Ok(())
}

/// `y = permute(x)` on the host, `x` dense in `shape`: the CPU kernel of [`Transpose`] (and of
/// the channels-last conversions, `crate::program::nchw_to_nhwc`).
pub(crate) fn permute_into(x: &[f32], shape: &[usize], perm: &[usize], y: &mut [f32]) {
    let r = shape.len();
    let mut in_strides = vec![1usize; r];
    for i in (0..r.saturating_sub(1)).rev() {
        in_strides[i] = in_strides[i + 1] * shape[i + 1];
    }
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let strides: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let total: usize = shape.iter().product();
    // Walk the output in order with an odometer over its index.
    let mut idx = vec![0usize; r];
    let mut src = 0usize;
    for slot in y.iter_mut().take(total) {
        *slot = x[src];
        for d in (0..r).rev() {
            idx[d] += 1;
            src += strides[d];
            if idx[d] < out_shape[d] {
                break;
            }
            src -= strides[d] * out_shape[d];
            idx[d] = 0;
        }
    }
}

impl Transpose {
    /// `y = permute(x)` of `x` in `in_shape`.
    pub fn of(x: BufId, y: BufId, in_shape: Vec<usize>, perm: &[usize]) -> Transpose {
        Transpose {
            x,
            y,
            in_shape,
            perm: perm.to_vec(),
        }
    }
}

impl StepKernel for Transpose {
    fn kind(&self) -> &'static str {
        "transpose"
    }

    fn access(&self) -> Access {
        let n = self.in_shape.iter().product();
        Access {
            reads: vec![(self.x, n)],
            writes: vec![(self.y, n)],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let x = io.read(self.x)?;
        let y = io.write(self.y)?;
        permute_into(x, &self.in_shape, &self.perm, y);
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        permute(cx.ptr(self.x)?, cx.ptr(self.y)?, &self.in_shape, &self.perm)
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some("permute")
    }
}

/// `y = permute(x)` of device buffers (`x` in `in_shape`), as one launch.
pub(crate) fn permute(
    x: u64,
    y: u64,
    in_shape: &[usize],
    perm: &[usize],
) -> Result<Box<dyn Enqueue>, GpuError> {
    let (dims, strides) = permute_params(in_shape, perm).ok_or_else(|| {
        GpuError::Plan(format!(
            "transpose of rank {} (the GPU kernel handles at most {MAX_RANK})",
            in_shape.len()
        ))
    })?;
    Ok(Box::new(CudaPermute {
        y,
        x,
        total: in_shape.iter().product::<usize>() as i64,
        rank: in_shape.len() as i32,
        dims,
        strides,
    }))
}

struct CudaPermute {
    y: u64,
    x: u64,
    total: i64,
    rank: i32,
    dims: [i64; 6],
    strides: [i64; 6],
}

impl Enqueue for CudaPermute {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let mut b = sc.launch_builder(gpu.function("permute")?);
        b.arg(&self.y)
            .arg(&self.x)
            .arg(&self.total)
            .arg(&self.rank)
            .arg(&self.dims)
            .arg(&self.strides);
        // SAFETY: matches `permute` (two 48-byte Dims6 structs by value); both buffers hold
        // `total` elements (checked at preparation).
        launched(unsafe { b.launch(grid(self.total as usize)) }, "permute")
    }
}
