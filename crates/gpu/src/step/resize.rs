//! Resizing the spatial axes (ONNX's `Resize`, PyTorch's `interpolate`), nearest or bilinear,
//! NCHW or channels last; on CUDA the `resize2d` NVRTC kernels. Which input elements an output
//! element reads, and with which weights, is the graph's one mapping
//! ([`opsched_graph::Resize::taps`]): computed once on the host, per output row and column,
//! and uploaded as two small tables, so the kernel only gathers and blends.
#![allow(unsafe_code)]

use cudarc::driver::{CudaSlice, PushKernelArg};
use opsched_graph::resize::Tap;
use opsched_graph::{Resize as ResizeOp, ResizeMode};
use rayon::prelude::*;
use serde::Serialize;

use super::{product, Access, Step, StepKernel};
use crate::cpu::resize::Columns;
use crate::cpu::CpuIo;
use crate::cuda::cudnn::{as_i64, c_int};
use crate::cuda::{grid, launched, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{At, BufId, Builder, Src};
use crate::GpuError;

/// `y` = `x` (`[n, c, h, w]`, or `[n, h, w, c]` where `nhwc`) resized by `resize`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Resize {
    pub x: BufId,
    pub y: BufId,
    /// Input `[n, c, h, w]` (the logical shape, whatever the layout).
    pub input: [usize; 4],
    pub resize: ResizeOp,
    /// `x` and `y` are stored channels last ([`crate::program::Layout::Nhwc`]).
    pub nhwc: bool,
}

/// Lower a `resize` operator.
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    resize: &ResizeOp,
    src: Src<'_>,
    out: BufId,
) -> Result<(), GpuError> {
    let (x, shape) = b.single(steps, at, src)?;
    let input = b.four(at, &shape)?;
    steps.push(
        Resize {
            x,
            y: out,
            input,
            resize: *resize,
            nhwc: b.channels_last_at(at.node),
        }
        .into(),
    );
    Ok(())
}

impl Resize {
    fn out_len(&self) -> usize {
        let [n, c, _, _] = self.input;
        let [oh, ow] = self.resize.size;
        n * c * oh * ow
    }

    /// The taps of every output row, then of every column.
    fn taps(&self) -> (Vec<Tap>, Vec<Tap>) {
        let [_, _, h, w] = self.input;
        (self.resize.taps(0, h), self.resize.taps(1, w))
    }
}

impl StepKernel for Resize {
    fn kind(&self) -> &'static str {
        "resize"
    }

    fn access(&self) -> Access {
        Access {
            reads: vec![(self.x, self.input.iter().product())],
            writes: vec![(self.y, self.out_len())],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let [n, c, h, w] = self.input;
        let [oh, ow] = self.resize.size;
        let len = product(&[n, c, oh, ow], "resized tensor")?;
        let (rows, cols) = self.taps();
        let mode = self.resize.mode;
        let x = &io.read(self.x)?[..n * c * h * w];
        let y = &mut io.write(self.y)?[..len];
        if len == 0 {
            return Ok(());
        }
        if self.nhwc {
            // One output row of one image a task: its pixels' channels, read from the two
            // input rows of its tap.
            y.par_chunks_mut(ow * c).enumerate().for_each(|(r, yr)| {
                let (image, rt) = (r / oh, &rows[r % oh]);
                let xi = &x[image * h * w * c..][..h * w * c];
                for (ct, yp) in cols.iter().zip(yr.chunks_mut(c)) {
                    let at = |row: usize, col: usize| (row * w + col) * c;
                    let (a, b) = (at(rt.lo, ct.lo), at(rt.lo, ct.hi));
                    let (d, e) = (at(rt.hi, ct.lo), at(rt.hi, ct.hi));
                    for (ch, v) in yp.iter_mut().enumerate() {
                        let taps = [xi[a + ch], xi[b + ch], xi[d + ch], xi[e + ch]];
                        *v = Tap::blend(mode, rt, ct, taps);
                    }
                }
            });
        } else {
            // A plane a task, row by row (`cpu::resize`: sixteen columns at a time where the
            // CPU has AVX-512).
            let cols = Columns::new(cols, w);
            y.par_chunks_mut(oh * ow)
                .zip(x.par_chunks(h * w))
                .for_each(|(yp, xp)| {
                    for (rt, yr) in rows.iter().zip(yp.chunks_mut(ow)) {
                        let (lo, hi) = (&xp[rt.lo * w..][..w], &xp[rt.hi * w..][..w]);
                        cols.row(mode, rt, lo, hi, yr);
                    }
                });
        }
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        let [n, c, h, w] = self.input;
        let [oh, ow] = self.resize.size;
        let (rows, cols) = self.taps();
        // Rows' taps, then columns': (lo, hi) index pairs and (w_lo, w_hi) weight pairs.
        let mut index = Vec::with_capacity(2 * (oh + ow));
        let mut weight = Vec::with_capacity(2 * (oh + ow));
        for t in rows.iter().chain(&cols) {
            let what = "a resize's input row or column";
            index.extend([c_int(t.lo, what)?, c_int(t.hi, what)?]);
            weight.extend([t.w_lo, t.w_hi]);
        }
        let (index_ptr, index_dev) = cx.gpu.upload_array(&index)?;
        let (weight_ptr, weight_dev) = cx.gpu.upload_array(&weight)?;
        Ok(Box::new(CudaResize {
            y: cx.ptr(self.y)?,
            x: cx.ptr(self.x)?,
            total: as_i64(self.out_len(), "elements of a resize")?,
            c: c_int(c, "channels of a resize")?,
            dims: [
                c_int(h, "a resize's input height")?,
                c_int(w, "a resize's input width")?,
                c_int(oh, "a resize's output height")?,
                c_int(ow, "a resize's output width")?,
            ],
            index_ptr,
            weight_ptr,
            linear: i32::from(self.resize.mode == ResizeMode::Linear),
            _tables: (index_dev, weight_dev),
            name: if self.nhwc {
                "resize2d_nhwc"
            } else {
                "resize2d"
            },
            images: as_i64(n, "images of a resize")?,
        }))
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some(if self.nhwc {
            "resize2d_nhwc"
        } else {
            "resize2d"
        })
    }
}

struct CudaResize {
    y: u64,
    x: u64,
    total: i64,
    images: i64,
    c: i32,
    /// h, w, oh, ow.
    dims: [i32; 4],
    index_ptr: u64,
    weight_ptr: u64,
    linear: i32,
    /// The tap tables (kept alive with the operator).
    _tables: (CudaSlice<i32>, CudaSlice<f32>),
    name: &'static str,
}

impl Enqueue for CudaResize {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let [h, w, oh, ow] = &self.dims;
        let mut b = sc.launch_builder(gpu.function(self.name)?);
        b.arg(&self.y)
            .arg(&self.x)
            .arg(&self.images)
            .arg(&self.c)
            .arg(h)
            .arg(w)
            .arg(oh)
            .arg(ow)
            .arg(&self.index_ptr)
            .arg(&self.weight_ptr)
            .arg(&self.linear);
        // SAFETY: matches `resize2d` / `resize2d_nhwc`; x holds images * c * h * w elements and
        // y images * c * oh * ow (the buffers' sizes, checked at preparation); the tables hold
        // 2 * (oh + ow) entries each, every index below h (rows) or w (columns).
        launched(unsafe { b.launch(grid(self.total as usize)) }, self.name)
    }
}
