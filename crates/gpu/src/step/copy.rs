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

    fn written(&self) -> Option<std::ops::Range<usize>> {
        let start = self.dst_off * self.inner;
        (self.outer == 1).then(|| start..start + self.len * self.inner)
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
        let (src, dst) = (cx.ptr(self.src)?, cx.ptr(self.dst)?);
        let i = |v: usize| v as i64;
        Ok(if self.contiguous() {
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
                    i(self.src_axis),
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
    let run = runs.run.max(1);
    let i = |v: usize| v as i64;
    Box::new(Slab {
        src,
        dst,
        a: [i(len / run), i(run), 0, i(runs.stride), 0, i(run), 1],
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
