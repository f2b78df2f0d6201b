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
    /// What the kernels take of `x` and `y` where they are strided views (their runs): `x`'s
    /// image stride (NCHW) and pixel stride (channels last), and channels last `y`'s pixel
    /// stride (a slice of a concatenation: its pixels the run stride apart, each pixel's
    /// channels one run; 0 in NCHW, where `pool2d_runs` takes the runs). `None` for a
    /// channels-last `y` in other runs.
    fn strides(
        &self,
        x: Option<crate::program::Runs>,
        y: Option<crate::program::Runs>,
    ) -> Result<Option<(usize, usize, usize)>, GpuError> {
        let [_, c, h, w] = self.input;
        let ypix = match y {
            None => c,
            Some(r) if self.nhwc && r.run == c => r.stride,
            Some(_) if self.nhwc => return Ok(None),
            Some(_) => 0,
        };
        let (ximage, xpix) = super::view_strides(self.nhwc, x, c, h * w, "pooling input")?;
        Ok(Some((ximage, xpix, ypix)))
    }

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
        let (x, x_runs) = cx.strided(self.x)?;
        let (ximage, xpix, ypix) = self
            .strides(x_runs, runs)?
            .ok_or_else(|| cx.no_kernel("a channels-last pooling into runs other than pixels"))?;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::program::Runs;

    /// The `pool2d_nhwc` kernel's loop, line by line on the host: `x` channels last with its
    /// pixels `xpix` apart, `y` with its pixels `ypix` apart (the kernel's `pool_window`).
    fn pool2d_nhwc_like_the_kernel(s: &Pool, x: &[f32], xpix: usize, y: &mut [f32], ypix: usize) {
        let [n, c, h, w] = s.input.map(|v| v as isize);
        let [oh, ow] = s.out_hw.map(|v| v as isize);
        let [kh, kw] = s.kernel.map(|v| v as isize);
        let [sh, sw] = s.stride.map(|v| v as isize);
        let [ph, pw] = s.padding.map(|v| v as isize);
        let [eh, ew] = s.padding_end.map(|v| v as isize);
        for t in 0..n * oh * ow * c {
            let ch = t % c;
            let pix = t / c;
            let (j, i, b) = (pix % ow, (pix / ow) % oh, pix / (oh * ow));
            let (hs, ws) = (i * sh - ph, j * sw - pw);
            let (he, we) = ((hs + kh).min(h + eh), (ws + kw).min(w + ew));
            let padded = (he - hs) * (we - ws);
            let (hs, ws, he, we) = (hs.max(0), ws.max(0), he.min(h), we.min(w));
            let size = match s.count_include_pad {
                true => padded,
                false => (he - hs).max(0) * (we - ws).max(0),
            }
            .max(1);
            let x0 = (b * h * w) as usize * xpix + ch as usize;
            let (mut m, mut sum) = (f32::NEG_INFINITY, 0.0f32);
            for p in hs..he {
                for q in ws..we {
                    let v = x[x0 + (p * w + q) as usize * xpix];
                    m = m.max(v);
                    sum += v;
                }
            }
            y[pix as usize * ypix + ch as usize] = if s.max { m } else { sum / size as f32 };
        }
    }

    /// Channels last, with a strided input (a merged member: pixels 3 channels apart beyond
    /// its own) and output (a concatenation's slice: 5 beyond), the strides the step gives the
    /// kernel and the kernel's loop compute the NCHW pool, for max and average pools padded
    /// unevenly; runs that are not pixels are refused.
    #[test]
    fn the_channels_last_kernel_reads_and_writes_views_through_the_strides_given() {
        let (n, c, h, w) = (2, 6, 7, 5);
        for (max, count_include_pad) in [(true, false), (false, true), (false, false)] {
            let s = Pool {
                x: 0,
                y: 1,
                input: [n, c, h, w],
                out_hw: [4, 3],
                max,
                kernel: [3, 2],
                stride: [2, 2],
                padding: [1, 0],
                padding_end: [1, 1],
                count_include_pad,
                nhwc: true,
            };
            let x = crate::program::uniform(3, n * c * h * w, 0.0, 1.0);
            let out = [n, c, 4, 3];
            let mut want = vec![f32::NAN; n * c * 12];
            let nchw = Pool {
                nhwc: false,
                ..s.clone()
            };
            nchw.run_cpu(&mut crate::cpu::CpuIo::of(
                vec![(0, &x[..])],
                vec![(1, &mut want[..])],
            ))
            .unwrap();
            let (xr, yr) = (
                Runs {
                    run: c,
                    stride: c + 3,
                },
                Runs {
                    run: c,
                    stride: c + 5,
                },
            );
            let (_, xpix, ypix) = s.strides(Some(xr), Some(yr)).unwrap().unwrap();
            // The views as the layout lays them out (each pixel a run), NaN between runs.
            let mut dense = vec![0.0; x.len()];
            crate::program::nchw_to_nhwc(&x, s.input, &mut dense);
            let mut xv = vec![f32::NAN; n * h * w * xr.stride];
            for (p, px) in dense.chunks(c).enumerate() {
                xv[p * xr.stride..p * xr.stride + c].copy_from_slice(px);
            }
            let mut yv = vec![f32::NAN; n * 12 * yr.stride];
            pool2d_nhwc_like_the_kernel(&s, &xv, xpix, &mut yv, ypix);
            let got: Vec<f32> = yv.chunks(yr.stride).flat_map(|p| p[..c].to_vec()).collect();
            assert_eq!(crate::program::nhwc_to_nchw(&got, out), want, "max {max}");
        }
        let s = Pool {
            x: 0,
            y: 1,
            input: [1, 4, 3, 3],
            out_hw: [1, 1],
            max: true,
            kernel: [3, 3],
            stride: [1, 1],
            padding: [0, 0],
            padding_end: [0, 0],
            count_include_pad: true,
            nhwc: true,
        };
        assert!(s
            .strides(None, Some(Runs { run: 2, stride: 8 }))
            .unwrap()
            .is_none());
    }
}
