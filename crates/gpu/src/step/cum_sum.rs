//! Running sums along one axis (`cum_sum`: RoBERTa's position ids, counted from its token ids),
//! as the middle axis of `[outer, n, inner]`; on CUDA the `cum_sum` NVRTC kernel. Every
//! executor adds the elements in the axis's order (from its end where `reverse`), so all agree
//! bit for bit.
#![allow(unsafe_code)]

use cudarc::driver::PushKernelArg;
use serde::Serialize;

use super::{product, Access, Step, StepKernel};
use crate::cpu::math::{for_planes, with_scratch};
use crate::cpu::CpuIo;
use crate::cuda::cudnn::as_i64;
use crate::cuda::{grid, launched, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{At, BufId, Builder, Src};
use crate::GpuError;

/// `y[o, i, :]` is the sum of `x[o, j, :]` over `j <= i` (`j < i` where `exclusive`; `j >= i`,
/// `j > i` where `reverse`) for `x` viewed as `[outer, n, inner]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CumSum {
    pub x: BufId,
    pub y: BufId,
    pub outer: usize,
    pub n: usize,
    pub inner: usize,
    pub exclusive: bool,
    pub reverse: bool,
}

/// Lower a `cum_sum` along `axis`.
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    (axis, exclusive, reverse): (usize, bool, bool),
    src: Src<'_>,
    out: BufId,
) -> Result<(), GpuError> {
    let (x, shape) = b.single(steps, at, src)?;
    if axis >= shape.len() {
        return Err(b.unsupported(at, format!("running sums along axis {axis} of {shape:?}")));
    }
    steps.push(
        CumSum {
            x,
            y: out,
            outer: product(&shape[..axis], "running sums' outer axes")?,
            n: shape[axis],
            inner: product(&shape[axis + 1..], "running sums' inner axes")?,
            exclusive,
            reverse,
        }
        .into(),
    );
    Ok(())
}

impl StepKernel for CumSum {
    fn kind(&self) -> &'static str {
        "cum_sum"
    }

    fn access(&self) -> Access {
        let len = self.outer * self.n * self.inner;
        Access {
            reads: vec![(self.x, len)],
            writes: vec![(self.y, len)],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let (n, inner) = (self.n, self.inner);
        let len = self.outer * n * inner;
        let x = &io.read(self.x)?[..len];
        let y = &mut io.write(self.y)?[..len];
        if len == 0 {
            return Ok(());
        }
        // Per outer index, a row of `inner` running sums, added row after row.
        let block = n * inner;
        for_planes(y, block, block, |o, yo| {
            let xo = &x[o * block..(o + 1) * block];
            with_scratch(inner, |sums| {
                sums.fill(0.0);
                for step in 0..n {
                    let r = if self.reverse { n - 1 - step } else { step };
                    let (xr, yr) = (&xo[r * inner..][..inner], &mut yo[r * inner..][..inner]);
                    if self.exclusive {
                        yr.copy_from_slice(sums);
                    }
                    sums.iter_mut().zip(xr).for_each(|(s, &v)| *s += v);
                    if !self.exclusive {
                        yr.copy_from_slice(sums);
                    }
                }
            })
        });
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        Ok(Box::new(CudaCumSum {
            y: cx.ptr(self.y)?,
            x: cx.ptr(self.x)?,
            dims: [
                as_i64(self.outer, "running sums' outer elements")?,
                as_i64(self.n, "running sums' elements")?,
                as_i64(self.inner, "running sums' inner elements")?,
            ],
            lines: product(&[self.outer, self.inner], "running sums")?,
            how: [i32::from(self.exclusive), i32::from(self.reverse)],
        }))
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some("cum_sum")
    }
}

struct CudaCumSum {
    y: u64,
    x: u64,
    /// outer, n, inner.
    dims: [i64; 3],
    /// outer * inner: one thread each.
    lines: usize,
    /// exclusive, reverse.
    how: [i32; 2],
}

impl Enqueue for CudaCumSum {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let [outer, n, inner] = &self.dims;
        let [exclusive, reverse] = &self.how;
        let mut b = sc.launch_builder(gpu.function("cum_sum")?);
        b.arg(&self.y)
            .arg(&self.x)
            .arg(outer)
            .arg(n)
            .arg(inner)
            .arg(exclusive)
            .arg(reverse);
        // SAFETY: matches `cum_sum`; x and y hold outer * n * inner elements (the buffers'
        // sizes, checked at preparation).
        launched(unsafe { b.launch(grid(self.lines)) }, "cum_sum")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The CPU kernel against the running sums written out, every direction, bit for bit
        /// (both add in the axis's order).
        #[test]
        fn running_sums_match_their_definition(
            outer in 1usize..4, n in 1usize..9, inner in 1usize..6,
            exclusive: bool, reverse: bool,
        ) {
            let len = outer * n * inner;
            let x: Vec<f32> = (0..len).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
            let s = CumSum { x: 0, y: 1, outer, n, inner, exclusive, reverse };
            let mut y = vec![f32::NAN; len];
            s.run_cpu(&mut CpuIo::of(vec![(0, &x[..])], vec![(1, &mut y[..])])).unwrap();
            for o in 0..outer {
                for r in 0..n {
                    for i in 0..inner {
                        let took = |j: usize| match (exclusive, reverse) {
                            (false, false) => j <= r,
                            (true, false) => j < r,
                            (false, true) => j >= r,
                            (true, true) => j > r,
                        };
                        let order: Vec<usize> = match reverse {
                            false => (0..n).collect(),
                            true => (0..n).rev().collect(),
                        };
                        let want = order.into_iter().filter(|&j| took(j))
                            .fold(0.0f32, |s, j| s + x[(o * n + j) * inner + i]);
                        prop_assert_eq!(y[(o * n + r) * inner + i].to_bits(), want.to_bits());
                    }
                }
            }
        }
    }
}
