//! Reductions over consecutive axes (`reduce`: a mean over tokens, over the last axis or over
//! channels), as the middle axis of `[outer, red, inner]`; on CUDA the `reduce_mid` NVRTC
//! kernel. The executors combine the elements in order ([`ReduceKind::step`]), but for the CPU
//! device's rows of 16 or more consecutive elements (`inner == 1`), which it sums in sixteen
//! lanes (within about 1e-7 of the in-order sum; a maximum or minimum is exact either way); an
//! index kind (`ArgMax`) keeps the row of the best element so far ([`ReduceKind::replaces`]).
#![allow(unsafe_code)]

use cudarc::driver::PushKernelArg;
use opsched_graph::ReduceKind;
use serde::Serialize;

use super::{product, Access, Step, StepKernel};
use crate::cpu::math::{for_planes, max_of, min_of, sum_of, with_scratch};
use crate::cpu::CpuIo;
use crate::cuda::cudnn::as_i64;
use crate::cuda::{grid, launched, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{At, BufId, Builder, Src};
use crate::GpuError;

/// `y[o, i] = kind over r of x[o, r, i]` for `x` viewed as `[outer, red, inner]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reduce {
    pub x: BufId,
    pub y: BufId,
    pub outer: usize,
    pub red: usize,
    pub inner: usize,
    pub kind: ReduceKind,
}

/// Lower a `reduce` of axes `begin..end`.
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    kind: ReduceKind,
    [begin, end]: [usize; 2],
    src: Src<'_>,
    out: BufId,
) -> Result<(), GpuError> {
    let (x, shape) = b.single(steps, at, src)?;
    if begin >= end || end > shape.len() {
        return Err(b.unsupported(at, format!("a reduction of axes {begin}..{end}")));
    }
    steps.push(
        Reduce {
            x,
            y: out,
            outer: product(&shape[..begin], "a reduction's outer axes")?,
            red: product(&shape[begin..end], "a reduction's axes")?,
            inner: product(&shape[end..], "a reduction's inner axes")?,
            kind,
        }
        .into(),
    );
    Ok(())
}

/// `kind` over `xs` before [`ReduceKind::finish`], in sixteen lanes ([`sum_of`]: sums within
/// about 1e-7 of the reference's in-order ones; a maximum or minimum exact), or `None` for the
/// kinds kept in order (a product, the index kinds) and a row too short for lanes.
fn in_lanes(kind: ReduceKind, xs: &[f32]) -> Option<f32> {
    if xs.len() < 16 {
        return None;
    }
    Some(match kind {
        ReduceKind::Mean | ReduceKind::Sum | ReduceKind::LogSum => sum_of(xs, |v| v),
        ReduceKind::L1 => sum_of(xs, f32::abs),
        ReduceKind::L2 | ReduceKind::SumSquare => sum_of(xs, |v| v * v),
        ReduceKind::Max => max_of(xs),
        ReduceKind::Min => min_of(xs),
        ReduceKind::LogSumExp => {
            let m = max_of(xs);
            ReduceKind::log_sum_exp(m, sum_of(xs, |v| (v - m).exp()))
        }
        _ => return None,
    })
}

impl StepKernel for Reduce {
    fn kind(&self) -> &'static str {
        "reduce"
    }

    fn access(&self) -> Access {
        Access {
            reads: vec![(self.x, self.outer * self.red * self.inner)],
            writes: vec![(self.y, self.outer * self.inner)],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let (red, inner, kind) = (self.red, self.inner, self.kind);
        let x = &io.read(self.x)?[..self.outer * red * inner];
        let y = &mut io.write(self.y)?[..self.outer * inner];
        if y.is_empty() {
            return Ok(());
        }
        // Each outer index's rows of `inner` elements accumulated in order (an index kind
        // keeps its best values in scratch and their rows in y), outer indices grouped into
        // tasks by the elements they read.
        let block = red * inner;
        for_planes(y, inner, block, |o, yo| {
            let xo = &x[o * block..(o + 1) * block];
            // One output of consecutive elements (a mean over the last axis: a norm's): the
            // elements in sixteen lanes, where an element at a time waited on the last.
            if let (1, Some(v)) = (inner, in_lanes(kind, xo)) {
                yo[0] = kind.finish(v, red);
                return;
            }
            if kind.is_index() {
                return with_scratch(inner, |best| {
                    best.fill(kind.start());
                    yo.fill(0.0);
                    for (r, row) in xo.chunks(inner).enumerate() {
                        for ((b, at), &v) in best.iter_mut().zip(yo.iter_mut()).zip(row) {
                            if kind.replaces(v, *b) {
                                (*b, *at) = (v, r as f32);
                            }
                        }
                    }
                });
            }
            yo.fill(kind.start());
            for row in xo.chunks(inner) {
                for (a, &v) in yo.iter_mut().zip(row) {
                    *a = kind.step(*a, v);
                }
            }
            if kind == ReduceKind::LogSumExp {
                // The second pass: the exponentials shifted by each output's maximum.
                return with_scratch(inner, |sums| {
                    sums.fill(0.0);
                    for row in xo.chunks(inner) {
                        for ((s, &m), &v) in sums.iter_mut().zip(yo.iter()).zip(row) {
                            *s += (v - m).exp();
                        }
                    }
                    for (a, &s) in yo.iter_mut().zip(sums.iter()) {
                        *a = ReduceKind::log_sum_exp(*a, s);
                    }
                });
            }
            for a in yo.iter_mut() {
                *a = kind.finish(*a, red);
            }
        });
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        Ok(Box::new(CudaReduce {
            y: cx.ptr(self.y)?,
            x: cx.ptr(self.x)?,
            dims: [
                as_i64(self.outer, "a reduction's outer elements")?,
                as_i64(self.red, "a reduction's elements")?,
                as_i64(self.inner, "a reduction's inner elements")?,
            ],
            total: product(&[self.outer, self.inner], "a reduction's output")?,
            kind: self.kind.code(),
        }))
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some("reduce_mid")
    }
}

struct CudaReduce {
    y: u64,
    x: u64,
    /// outer, red, inner.
    dims: [i64; 3],
    total: usize,
    kind: i32,
}

impl Enqueue for CudaReduce {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let [outer, red, inner] = &self.dims;
        let mut b = sc.launch_builder(gpu.function("reduce_mid")?);
        b.arg(&self.y)
            .arg(&self.x)
            .arg(outer)
            .arg(red)
            .arg(inner)
            .arg(&self.kind);
        // SAFETY: matches `reduce_mid`; x holds outer * red * inner elements and y outer *
        // inner (the buffers' sizes, checked at preparation).
        launched(unsafe { b.launch(grid(self.total)) }, "reduce_mid")
    }
}
