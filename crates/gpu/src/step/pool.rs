//! Max and average pooling (NCHW), PyTorch's and onnxruntime's rules: windows start at
//! `i * stride - begin` and end at most at `input + end`; max ignores padding; an average
//! divides by the window counted up to that end (padding included) or, without
//! `count_include_pad`, by the input elements it covers (`ceil_mode` windows are exact).
//! Pooling is an NVRTC kernel rather than cuDNN so that these windows are exact.
#![allow(unsafe_code)]

use cudarc::driver::PushKernelArg;
use opsched_graph::{Pool2d, PoolKind};
use rayon::prelude::*;
use serde::Serialize;

use super::{Access, Step, StepKernel};
use crate::cpu::CpuIo;
use crate::cuda::cudnn::{as_i64, c_int, runs_args};
use crate::cuda::{grid, launched, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{At, BufId, Builder, Src};
use crate::GpuError;

/// A pooling step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pool {
    pub x: BufId,
    pub y: BufId,
    /// Input `[n, c, h, w]`.
    pub input: [usize; 4],
    /// Output `[oh, ow]`.
    pub out_hw: [usize; 2],
    pub max: bool,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    /// Padding before (top, left) and after (bottom, right) each spatial axis.
    pub padding: [usize; 2],
    pub padding_end: [usize; 2],
    /// An average divides by the padded window (else by the input elements in it).
    pub count_include_pad: bool,
    /// `x` and `y` are stored channels last ([`crate::program::Layout::Nhwc`]).
    pub nhwc: bool,
}

/// Lower a `pool2d` operator (a global pool is a window over the whole input).
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    p: &Pool2d,
    src: Src<'_>,
    out: BufId,
    out_shape: &[usize],
) -> Result<(), GpuError> {
    // A strided input (a merged convolution's member, a slice of a concatenation) is read in
    // place: the kernels take its image or pixel stride.
    let (x, xs) = b.single_strided(steps, at, src)?;
    let x = b.view_or_copy(steps, at, x, &xs);
    let [n, ch, h, w] = b.four(at, &xs)?;
    let [_, _, oh, ow] = b.four(at, out_shape)?;
    let global = p.kind.is_global();
    steps.push(
        Pool {
            x,
            y: out,
            input: [n, ch, h, w],
            out_hw: [oh, ow],
            max: matches!(p.kind, PoolKind::Max | PoolKind::GlobalMax),
            kernel: if global { [h, w] } else { p.kernel },
            stride: if global { [1, 1] } else { p.stride },
            padding: if global { [0, 0] } else { p.pads().0 },
            padding_end: if global { [0, 0] } else { p.pads().1 },
            count_include_pad: global || p.count_include_pad,
            nhwc: b.channels_last_at(at.node),
        }
        .into(),
    );
    Ok(())
}

impl Pool {
    /// One output plane from one input plane.
    fn plane(&self, x: &[f32], y: &mut [f32]) {
        let [_, _, h, w] = self.input;
        let [oh, ow] = self.out_hw;
        let (h, w) = (h as isize, w as isize);
        let [sh, sw] = self.stride.map(|v| v as isize);
        let [ph, pw] = self.padding.map(|v| v as isize);
        let [eh, ew] = self.padding_end.map(|v| v as isize);
        let [kh, kw] = self.kernel.map(|v| v as isize);
        for i in 0..oh {
            for j in 0..ow {
                let hs = i as isize * sh - ph;
                let ws = j as isize * sw - pw;
                let he = (hs + kh).min(h + eh);
                let we = (ws + kw).min(w + ew);
                let padded = (he - hs) * (we - ws);
                let (hs, ws, he, we) = (hs.max(0), ws.max(0), he.min(h), we.min(w));
                let inside = (he - hs).max(0) * (we - ws).max(0);
                let size = if self.count_include_pad {
                    padded
                } else {
                    inside
                }
                .max(1) as f32;
                let mut m = f32::NEG_INFINITY;
                let mut s = 0.0f32;
                for p in hs..he {
                    for v in &x[(p * w + ws) as usize..(p * w + we).max(p * w + ws) as usize] {
                        m = m.max(*v);
                        s += v;
                    }
                }
                y[i * ow + j] = if self.max { m } else { s / size };
            }
        }
    }
}

impl StepKernel for Pool {
    fn kind(&self) -> &'static str {
        "pool"
    }

    fn access(&self) -> Access {
        let [n, c, h, w] = self.input;
        Access {
            reads: vec![(self.x, n * c * h * w)],
            writes: vec![(self.y, n * c * self.out_hw[0] * self.out_hw[1])],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let [n, c, h, w] = self.input;
        let (inp, outp) = (h * w, self.out_hw[0] * self.out_hw[1]);
        if n * c * outp == 0 {
            return Ok(());
        }
        let x = io.read(self.x)?;
        let y = &mut io.write(self.y)?[..n * c * outp];
        let planes = |x: &[f32], y: &mut [f32]| {
            y.par_chunks_mut(outp)
                .enumerate()
                .for_each(|(bc, plane)| self.plane(&x[bc * inp..(bc + 1) * inp], plane))
        };
        if self.nhwc {
            let out = [n, c, self.out_hw[0], self.out_hw[1]];
            return crate::program::through_nchw(x, self.input, y, out, |x, y| {
                planes(x, y);
                Ok(())
            });
        }
        planes(x, y);
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        let [n, c, h, w] = self.input;
        let (y, runs) = cx.strided(self.y)?;
        // Channels last, a strided output (a slice of a concatenation) has its pixels the
        // run stride apart, each pixel's channels one run.
        let ypix = match runs {
            None => c,
            Some(r) if self.nhwc && r.run == c => r.stride,
            Some(_) if self.nhwc => {
                return Err(cx.no_kernel("a channels-last pooling into runs other than pixels"))
            }
            Some(_) => 0,
        };
        let (x, x_runs) = cx.strided(self.x)?;
        let (ximage, xpix) = super::view_strides(self.nhwc, x_runs, c, h * w, "pooling input")?;
        Ok(Box::new(CudaPool {
            nhwc: self.nhwc.then_some((n as i64, ypix as i64, xpix as i64)),
            y,
            runs: runs_args(runs)?,
            x,
            nc: (n * c) as i64,
            c: c_int(c, "channels")?,
            ximage: as_i64(ximage, "image stride")?,
            p: [
                c_int(h, "h")?,
                c_int(w, "w")?,
                c_int(self.out_hw[0], "oh")?,
                c_int(self.out_hw[1], "ow")?,
                c_int(self.kernel[0], "kh")?,
                c_int(self.kernel[1], "kw")?,
                c_int(self.stride[0], "sh")?,
                c_int(self.stride[1], "sw")?,
                c_int(self.padding[0], "ph")?,
                c_int(self.padding[1], "pw")?,
                c_int(self.padding_end[0], "eh")?,
                c_int(self.padding_end[1], "ew")?,
                i32::from(self.count_include_pad),
            ],
            is_max: i32::from(self.max),
            total: n * c * self.out_hw[0] * self.out_hw[1],
        }))
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some(if self.nhwc { "pool2d_nhwc" } else { "pool2d" })
    }
}

/// `pool2d`, or `pool2d_runs` where `y` is a strided view (a pooling branch's slice of a
/// concatenation at batch > 1).
struct CudaPool {
    /// Channels last: `pool2d_nhwc` with the batch, `y`'s and `x`'s pixel strides.
    nhwc: Option<(i64, i64, i64)>,
    y: u64,
    /// `y`'s runs and their stride, for a strided `y`.
    runs: Option<(i64, i64)>,
    x: u64,
    nc: i64,
    c: i32,
    /// Elements between `x`'s images (NCHW).
    ximage: i64,
    p: [i32; 13],
    is_max: i32,
    total: usize,
}

impl Enqueue for CudaPool {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let name = match (self.nhwc, self.runs) {
            (Some(_), _) => "pool2d_nhwc",
            (None, Some(_)) => "pool2d_runs",
            (None, None) => "pool2d",
        };
        let mut b = sc.launch_builder(gpu.function(name)?);
        b.arg(&self.y).arg(&self.x);
        match &self.nhwc {
            Some((n, _, _)) => b.arg(n).arg(&self.c),
            None => b.arg(&self.nc).arg(&self.c).arg(&self.ximage),
        };
        for v in &self.p {
            b.arg(v);
        }
        b.arg(&self.is_max);
        match (&self.nhwc, &self.runs) {
            (Some((_, ypix, xpix)), _) => {
                b.arg(ypix).arg(xpix);
            }
            (None, Some((run, stride))) => {
                b.arg(run).arg(stride);
            }
            (None, None) => {}
        }
        // SAFETY: matches `pool2d` (nc, c and x's image stride, 13 ints, then is_max;
        // `pool2d_runs`: then y's run and stride; `pool2d_nhwc`: n and c, 13 ints, is_max,
        // then y's and x's pixel strides); buffer sizes checked at preparation, a strided
        // view's runs by the layout.
        launched(unsafe { b.launch(grid(self.total)) }, name)
    }
}
