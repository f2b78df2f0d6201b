//! Strided slab copies: terms, channel slices, concatenations, sums of values, whole-tensor
//! copies (identity, reshape).
#![allow(unsafe_code)]

use cudarc::driver::{result as drv, PushKernelArg};
use serde::Serialize;

use super::{Access, Step, StepKernel};
use crate::cpu::CpuIo;
use crate::cuda::{grid, launched, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{At, BufId, Builder, Src};
use crate::GpuError;

/// For `o < outer, a < len, i < inner`:
/// `dst[(o * dst_axis + dst_off + a) * inner + i] (+)= src[(o * src_axis + src_off + a) * inner + i]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Copy {
    pub src: BufId,
    pub dst: BufId,
    pub outer: usize,
    pub src_axis: usize,
    pub src_off: usize,
    pub dst_axis: usize,
    pub dst_off: usize,
    pub len: usize,
    pub inner: usize,
    pub accumulate: bool,
}

/// Lower a `concat` along `axis` (and `identity`/`reshape`, which join their terms along
/// channels: a reshape is a view of the same data).
pub(crate) fn lower_concat(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    axis: usize,
    src: Src<'_>,
    out: BufId,
) -> Result<(), GpuError> {
    match src {
        Src::Terms(terms) => {
            b.concat_into(steps, at, terms, axis, out)?;
        }
        Src::Buf(x, shape) => steps.push(Copy::whole(x, out, shape.iter().product()).into()),
    }
    Ok(())
}

/// Lower a `slice` (`[axis, begin, end]`): one slab copy, a row of `end - begin` elements of
/// the axis per index of the axes before it.
pub(crate) fn lower_slice(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    [axis, begin, end]: [usize; 3],
    src: Src<'_>,
    out: BufId,
) -> Result<(), GpuError> {
    let (x, shape) = b.single(steps, at, src)?;
    let (Some(&dim), true) = (shape.get(axis), begin < end) else {
        return Err(b.unsupported(at, format!("a slice of axis {axis} of {shape:?}")));
    };
    steps.push(
        Copy {
            src: x,
            dst: out,
            outer: shape[..axis].iter().product(),
            src_axis: dim,
            src_off: begin,
            dst_axis: end - begin,
            dst_off: 0,
            len: end - begin,
            inner: shape[axis + 1..].iter().product(),
            accumulate: false,
        }
        .into(),
    );
    Ok(())
}

impl Copy {
    /// All of `n` elements of `src` into `dst`.
    pub fn whole(src: BufId, dst: BufId, n: usize) -> Copy {
        Copy {
            src,
            dst,
            outer: 1,
            src_axis: n,
            src_off: 0,
            dst_axis: n,
            dst_off: 0,
            len: n,
            inner: 1,
            accumulate: false,
        }
    }

    /// A dense copy of `len` elements of a strided view `src` (runs of `run` elements): one
    /// row per run, which a GPU reads in place ([`Copy::parent_axis`]).
    pub fn gather(src: BufId, dst: BufId, len: usize, run: usize) -> Copy {
        let run = run.max(1);
        Copy {
            src,
            dst,
            outer: len / run,
            src_axis: run,
            src_off: 0,
            dst_axis: run,
            dst_off: 0,
            len: run,
            inner: 1,
            accumulate: false,
        }
    }

    /// Where its source is a strided view with `runs`: the `src_axis` that reads the same
    /// elements from the view's parent (from the view's first element), when each of its rows
    /// is one run (`src_axis * inner` elements) and the run stride is whole rows of `inner`.
    pub fn parent_axis(&self, runs: crate::program::Runs) -> Option<usize> {
        let row = self.src_axis.checked_mul(self.inner)?;
        (self.inner > 0 && row == runs.run && runs.stride.is_multiple_of(self.inner))
            .then(|| runs.stride / self.inner)
    }

    fn total(&self) -> usize {
        self.outer * self.len * self.inner
    }

    /// Elements of `src` and `dst` the copy reaches (0 when it copies nothing).
    fn extents(&self) -> (usize, usize) {
        if self.total() == 0 {
            return (0, 0);
        }
        let reach =
            |axis: usize, off: usize| ((self.outer - 1) * axis + off + self.len) * self.inner;
        (
            reach(self.src_axis, self.src_off),
            reach(self.dst_axis, self.dst_off),
        )
    }

    /// One contiguous run: a plain memory copy.
    fn contiguous(&self) -> bool {
        !self.accumulate
            && self.src_off == 0
            && self.dst_off == 0
            && (self.outer == 1 || (self.src_axis == self.len && self.dst_axis == self.len))
    }
}

impl StepKernel for Copy {
    fn kind(&self) -> &'static str {
        "copy"
    }

    fn access(&self) -> Access {
        let (s, d) = self.extents();
        Access {
            reads: vec![(self.src, s)],
            writes: vec![(self.dst, d)],
        }
    }

    /// Its runs of the destination: one per row (image, or pixel channels last), so that the
    /// race detector sees a copy into one slice of a concatenation apart from readers of the
    /// other slices (a producer's strided slice, which other kernels read in place).
    fn written(&self) -> Option<Vec<std::ops::Range<usize>>> {
        let (run, row) = (self.len * self.inner, self.dst_axis * self.inner);
        let first = self.dst_off * self.inner;
        if run == row {
            // Rows that follow one another: one range.
            return Some(std::iter::once(first..first + self.outer * run).collect());
        }
        Some(
            (0..self.outer)
                .map(|o| o * row + first..o * row + first + run)
                .collect(),
        )
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let src = io.read(self.src)?;
        let dst = io.write(self.dst)?;
        let run = self.len * self.inner;
        for o in 0..self.outer {
            let s = (o * self.src_axis + self.src_off) * self.inner;
            let d = (o * self.dst_axis + self.dst_off) * self.inner;
            let (from, to) = (&src[s..s + run], &mut dst[d..d + run]);
            if self.accumulate {
                to.iter_mut().zip(from).for_each(|(a, b)| *a += b);
            } else {
                to.copy_from_slice(from);
            }
        }
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        let ((src, runs), dst) = (cx.strided(self.src)?, cx.ptr(self.dst)?);
        // A strided source is read in its parent, one row per run.
        let src_axis = match runs {
            None => self.src_axis,
            Some(r) => self.parent_axis(r).ok_or_else(|| {
                cx.no_kernel(format!(
                    "a copy in rows of {} x {} elements from a strided view in runs of {}",
                    self.src_axis, self.inner, r.run
                ))
            })?,
        };
        let i = |v: usize| v as i64;
        Ok(if self.contiguous() && runs.is_none() {
            Box::new(Memcpy {
                src,
                dst,
                bytes: self.total() * 4,
            })
        } else {
            Box::new(Slab {
                src,
                dst,
                a: [
                    i(self.outer),
                    i(src_axis),
                    i(self.src_off),
                    i(self.dst_axis),
                    i(self.dst_off),
                    i(self.len),
                    i(self.inner),
                ],
                acc: i32::from(self.accumulate),
                total: self.total(),
            })
        })
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        (!self.contiguous()).then_some("slab_copy")
    }
}

/// A copy of `len` dense elements at `src` into the runs of a strided view at `dst`.
pub(crate) fn into_runs(
    src: u64,
    dst: u64,
    len: usize,
    runs: crate::program::Runs,
) -> Box<dyn Enqueue> {
    rows(src, dst, len, runs.run, [runs.run, runs.stride])
}

/// A copy of the runs of a strided view at `src` into `len` dense elements at `dst`.
pub(crate) fn from_runs(
    src: u64,
    dst: u64,
    len: usize,
    runs: crate::program::Runs,
) -> Box<dyn Enqueue> {
    rows(src, dst, len, runs.run, [runs.stride, runs.run])
}

/// `len` elements in rows of `run`, rows `axes[0]` elements apart at `src` and `axes[1]` at
/// `dst`.
fn rows(src: u64, dst: u64, len: usize, run: usize, axes: [usize; 2]) -> Box<dyn Enqueue> {
    let run = run.max(1);
    let i = |v: usize| v as i64;
    Box::new(Slab {
        src,
        dst,
        a: [i(len / run), i(axes[0]), 0, i(axes[1]), 0, i(run), 1],
        acc: 0,
        total: len,
    })
}

struct Memcpy {
    src: u64,
    dst: u64,
    bytes: usize,
}

impl Enqueue for Memcpy {
    fn enqueue(&self, _gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        // SAFETY: both buffers hold at least `bytes` (checked against the program's sizes at
        // preparation) and stay alive as long as the prepared operator.
        unsafe { drv::memcpy_dtod_async(self.dst, self.src, self.bytes, sc.cu_stream()) }
            .map_err(|e| GpuError::driver("copying", e))
    }
}

struct Slab {
    src: u64,
    dst: u64,
    a: [i64; 7],
    acc: i32,
    total: usize,
}

impl Enqueue for Slab {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let mut b = sc.launch_builder(gpu.function("slab_copy")?);
        b.arg(&self.dst).arg(&self.src);
        for v in &self.a {
            b.arg(v);
        }
        b.arg(&self.acc);
        // SAFETY: the argument list matches `slab_copy`'s signature; every index stays inside
        // the buffers (their reach was checked at preparation).
        launched(unsafe { b.launch(grid(self.total)) }, "slab_copy")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::program::Runs;
    use proptest::prelude::*;

    /// The parent elements (from the view's first) a copy reads, by the view's formula
    /// (element `i` at `(i / run) * stride + i % run`).
    fn through_view(c: &Copy, runs: Runs) -> Vec<usize> {
        let mut out = Vec::new();
        for o in 0..c.outer {
            for a in 0..c.len {
                for i in 0..c.inner {
                    let e = (o * c.src_axis + c.src_off + a) * c.inner + i;
                    out.push((e / runs.run) * runs.stride + e % runs.run);
                }
            }
        }
        out
    }

    /// The same, read as the GPU does: in the parent with `parent_axis`.
    fn in_parent(c: &Copy, axis: usize) -> Vec<usize> {
        let mut out = Vec::new();
        for o in 0..c.outer {
            for a in 0..c.len {
                for i in 0..c.inner {
                    out.push((o * axis + c.src_off + a) * c.inner + i);
                }
            }
        }
        out
    }

    proptest! {
        /// A copy of channels of a merged convolution's member (one run per image) reads in
        /// the parent exactly the elements the view maps them to; a gather of any view does.
        #[test]
        fn a_copy_reads_a_strided_view_in_its_parent(
            images in 1usize..4,
            channels in 1usize..6,
            inner in 1usize..5,
            extra in 0usize..7,
            first in 0usize..6,
            take in 1usize..6,
        ) {
            let (first, take) = (first % channels, take.min(channels - first % channels));
            let runs = Runs { run: channels * inner, stride: channels * inner + extra * inner };
            let c = Copy {
                src: 0,
                dst: 1,
                outer: images,
                src_axis: channels,
                src_off: first,
                dst_axis: take,
                dst_off: 0,
                len: take,
                inner,
                accumulate: false,
            };
            let axis = c.parent_axis(runs).unwrap();
            prop_assert_eq!(in_parent(&c, axis), through_view(&c, runs));
            let len = images * channels * inner;
            let g = Copy::gather(0, 1, len, runs.run);
            let axis = g.parent_axis(runs).unwrap();
            prop_assert_eq!(in_parent(&g, axis), through_view(&g, runs));
            prop_assert_eq!(
                through_view(&g, runs),
                runs.ranges(0..len).flatten().collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn a_copy_whose_rows_are_not_the_runs_cannot_read_them_in_place() {
        let runs = Runs {
            run: 12,
            stride: 20,
        };
        // Rows of 8 elements: runs of 12 are not whole rows.
        assert_eq!(Copy::whole(0, 1, 24).parent_axis(runs), None);
        let rows = Copy {
            src_axis: 2,
            inner: 4,
            ..Copy::whole(0, 1, 24)
        };
        assert_eq!(rows.parent_axis(runs), None);
        // Rows of 12: the stride of 20 is 5 rows of 4.
        let rows = Copy {
            outer: 2,
            src_axis: 3,
            len: 3,
            inner: 4,
            ..Copy::whole(0, 1, 24)
        };
        assert_eq!(rows.parent_axis(runs), Some(5));
    }
}
