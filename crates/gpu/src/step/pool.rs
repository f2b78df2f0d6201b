//! Max and average pooling (NCHW), PyTorch's and onnxruntime's rules: windows start at
//! `i * stride - begin` and end at most at `input + end`; max ignores padding; an average
//! divides by the window counted up to that end (padding included) or, without
//! `count_include_pad`, by the input elements it covers (`ceil_mode` windows are exact).
//! Pooling is an NVRTC kernel rather than cuDNN so that these windows are exact. On the CPU,
//! sliding windows over each padded plane (`crate::cpu::window`): the reference's sums in the
//! reference's order, so the same bits.
#![allow(unsafe_code)]

use cudarc::driver::{CudaSlice, PushKernelArg};
use opsched_graph::{Activation, Op, Pool2d, PoolKind};
use serde::Serialize;

use super::elementwise::{combine_into, ChannelBias};
use super::{Access, Step, StepKernel};
use crate::cpu::depthwise;
use crate::cpu::math::{for_planes, max_of, sum, try_plane_groups, with_avx512, with_scratch};
use crate::cpu::window::Windows;
use crate::cpu::CpuIo;
use crate::cuda::cudnn::{as_i64, c_int, runs_args};
use crate::cuda::nvrtc::act_params;
use crate::cuda::{grid, launched, vector_width, Enqueue, Gpu, PrepareCx, StreamCtx};
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
    /// The bias the convolution that computes `x` left to this pooling, one per channel:
    /// pooling `x + bias` adds `bias` times each window's share of input elements (1 for a max).
    pub bias: Option<BufId>,
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
    let mut pool = Pool::of(b, at, p, x, &xs, out, out_shape)?;
    // The bias a convolution left to this pooling (`opsched_graph::fusion::deferred_bias`).
    if let Src::Terms([term]) = src {
        if let [v] = term.as_slice() {
            pool.bias = b.deferred_bias(at, &[v.node], out_shape)?.map(|b| b.buf);
        }
    }
    steps.push(pool.into());
    Ok(())
}

/// Lower the add kernel of a sum of whole values (a term read by the operator at `at`) that
/// pools those that are poolings `opsched_graph::fusion::pool_into_sum` gives to it
/// (`pooled`) and adds the others (`added`, held in `adds`) into `y` (of `shape`, 4-D), with
/// the biases left to it and activation `act`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn lower_sum(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    pooled: &[opsched_graph::Value],
    added: &[opsched_graph::Value],
    adds: Vec<BufId>,
    y: BufId,
    shape: &[usize],
    act: Activation,
) -> Result<(), GpuError> {
    // The kernel pools in the reader's layout, reading the inputs in it; a value of one
    // pixel per channel is stored alike in both layouts, so there it pools in the first
    // pooling's own layout, as that pooling would have (no input to convert).
    let one_pixel = matches!(shape, [_, _, h, w] if h * w == 1);
    let read_at = match (one_pixel, pooled.first()) {
        (true, Some(first)) => At {
            node: first.node,
            ..at
        },
        _ => at,
    };
    let mut windows: Option<Pool> = None;
    let mut more = Vec::new();
    let mut biases = Vec::new();
    for v in pooled {
        // The pooling's own input, as the reader sees it (its value is never written).
        let node = b.graph().node(v.node);
        let (Op::Pool2d(p), [term]) = (&node.op, node.inputs.as_slice()) else {
            return Err(b.unsupported(at, format!("'{}' is no pooling to add", node.name)));
        };
        let [input] = term.as_slice() else {
            return Err(b.unsupported(at, format!("'{}' pools a sum", node.name)));
        };
        let (p, input) = (p.clone(), *input);
        // The bias the pooling's input left to it (its reader: the pooling).
        let read = [(input.node, v.node)];
        biases.push(b.biases_read_by(at, &read, shape)?.map(|b| b.buf));
        let xs = b.value_shape(&input);
        let x = b.source(steps, read_at, input.node)?;
        let x = b.view_or_copy(steps, read_at, x, &xs);
        match &windows {
            None => windows = Some(Pool::of(b, read_at, &p, x, &xs, y, shape)?),
            Some(_) => more.push(x),
        }
    }
    let pool = windows.ok_or_else(|| b.unsupported(at, "a pooled sum without a pooling"))?;
    let bias = b.term_bias(at, added, shape)?;
    steps.push(
        PoolSum {
            pool,
            more,
            adds,
            bias,
            pooled_biases: biases,
            act,
        }
        .into(),
    );
    Ok(())
}

impl Pool {
    /// The step that pools `x` (of shape `xs`, 4-D) into `out` with `p`'s windows (a global
    /// pool: one window over the whole input), in the layout of the operator at `at`.
    fn of(
        b: &Builder<'_>,
        at: At,
        p: &Pool2d,
        x: BufId,
        xs: &[usize],
        out: BufId,
        out_shape: &[usize],
    ) -> Result<Pool, GpuError> {
        let [n, ch, h, w] = b.four(at, xs)?;
        let [_, _, oh, ow] = b.four(at, out_shape)?;
        let global = p.kind.is_global();
        Ok(Pool {
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
            bias: None,
        })
    }
}

/// The add kernel of a sum that pools the poolings it adds
/// (`opsched_graph::fusion::pool_into_sum`): `y = act(pool(x) + pool(more[0]) + ... +
/// adds[0] + ... [+ bias])`, every input pooled with `pool`'s windows (its `x` the first, its
/// `y` the output; `pool.bias` unused), each pooling adding the bias left to it as a [`Pool`]
/// step would; `adds` hold values of `y`'s shape and layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolSum {
    pub pool: Pool,
    pub more: Vec<BufId>,
    pub adds: Vec<BufId>,
    /// The biases left to the sum by convolutions among the values added, summed.
    pub bias: Option<ChannelBias>,
    /// Per input pooled (`x`, then `more`), the bias left to its pooling ([`Pool::bias`]).
    pub pooled_biases: Vec<Option<BufId>>,
    pub act: Activation,
}

impl StepKernel for PoolSum {
    fn kind(&self) -> &'static str {
        "pool_sum"
    }

    fn access(&self) -> Access {
        let [n, c, h, w] = self.pool.input;
        let out = self.pool.out_len();
        let inputs = std::iter::once(self.pool.x).chain(self.more.iter().copied());
        let mut reads: Vec<(BufId, usize)> = inputs.map(|x| (x, n * c * h * w)).collect();
        reads.extend(self.adds.iter().map(|&a| (a, out)));
        reads.extend(self.bias.map(|b| (b.buf, b.channels)));
        reads.extend(self.pooled_biases.iter().flatten().map(|&b| (b, c)));
        reads.sort_unstable();
        reads.dedup();
        Access {
            reads,
            writes: vec![(self.pool.y, out)],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let out = self.pool.out_len();
        let x = io.read(self.pool.x)?;
        let more = self
            .more
            .iter()
            .map(|&m| io.read(m))
            .collect::<Result<Vec<_>, _>>()?;
        let adds = self
            .adds
            .iter()
            .map(|&a| io.read(a).map(|v| &v[..out]))
            .collect::<Result<Vec<_>, _>>()?;
        let bias = match self.bias {
            Some(b) => Some((b, &io.read(b.buf)?[..b.channels])),
            None => None,
        };
        let pooled_biases = (self.pooled_biases.iter())
            .map(|b| b.map(|b| io.read(b)).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let bias_of = |k: usize| pooled_biases.get(k).copied().flatten();
        let y = &mut io.write(self.pool.y)?[..out];
        self.pool.pool_biased(x, bias_of(0), y)?;
        // Each further input pooled into this thread's scratch (no allocation per run), then
        // added: as a sum of the poolings' own values would.
        for (k, m) in more.into_iter().enumerate() {
            with_scratch(out, |pooled| {
                self.pool.pool_biased(m, bias_of(k + 1), pooled)?;
                y.iter_mut().zip(&*pooled).for_each(|(a, v)| *a += v);
                Ok::<(), GpuError>(())
            })?;
        }
        combine_into(y, None, &adds, false, bias, self.act);
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        let p = &self.pool;
        let [n, c, h, w] = p.input;
        let out = p.out_len();
        let (y, y_runs) = cx.strided(p.y)?;
        // Every index the kernel computes, for its 32-bit variant: each buffer's extent.
        let extent = |runs: Option<crate::program::Runs>, len: usize| match runs {
            Some(r) => (len / r.run.max(1) + 1).saturating_mul(r.stride),
            None => len,
        };
        let mut reach = extent(y_runs, out).max(out);
        let (mut ptrs, mut meta) = (Vec::new(), Vec::new());
        for &x in std::iter::once(&p.x).chain(&self.more) {
            let (ptr, runs) = cx.strided(x)?;
            let (ximage, xpix) = super::view_strides(p.nhwc, runs, c, h * w, "pooling input")?;
            let stride = if p.nhwc { xpix } else { ximage };
            reach = reach.max(n.saturating_mul(ximage));
            ptrs.push(ptr);
            meta.push(as_i64(stride, "pooling input stride")?);
        }
        for &a in &self.adds {
            let (ptr, runs) = cx.strided(a)?;
            reach = reach.max(extent(runs, out));
            let (run, stride) = runs_args(runs)?.unwrap_or((0, 0));
            ptrs.push(ptr);
            meta.extend([run, stride]);
        }
        // Each input's pooled bias (null where it has none).
        for k in 0..=self.more.len() {
            let bias = self.pooled_biases.get(k).copied().flatten();
            ptrs.push(bias.map(|b| cx.ptr(b)).transpose()?.unwrap_or(0));
        }
        let y_view = runs_args(y_runs)?.unwrap_or((0, 0));
        // Channels last, several channels of a pixel a thread where every access allows it
        // (the biases are read one by one).
        let accessed = 1 + self.more.len() + self.adds.len();
        let vec = match p.nhwc {
            true => vector_width(
                [c].into_iter().chain(
                    meta.iter()
                        .chain([&y_view.0, &y_view.1])
                        .map(|&v| v as usize),
                ),
                std::iter::once(y).chain(ptrs[..accessed].iter().copied()),
            ),
            false => 1,
        };
        let (ptrs_ptr, ptrs_dev) = cx.gpu.upload_array(&ptrs)?;
        let (meta_ptr, meta_dev) = cx.gpu.upload_array(&meta)?;
        let bias = ChannelBias::kernel_args(self.bias, cx)?;
        Ok(Box::new(CudaPoolSum {
            y,
            y_view,
            ptrs: (ptrs_ptr, ptrs_dev),
            meta: (meta_ptr, meta_dev),
            npool: c_int(1 + self.more.len(), "poolings")?,
            nadd: c_int(self.adds.len(), "values added")?,
            n: as_i64(n, "batch")?,
            c: c_int(c, "channels")?,
            nhwc: i32::from(p.nhwc),
            p: p.geometry()?,
            is_max: i32::from(p.max),
            act: act_params(self.act),
            bias,
            narrow: i32::from(reach <= i32::MAX as usize),
            vec: vec as i32,
            total: out,
        }))
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some("pool2d_sum")
    }
}

/// `pool2d_sum`'s arguments.
struct CudaPoolSum {
    y: u64,
    /// `y`'s run and stride (0, 0 where dense).
    y_view: (i64, i64),
    /// The pointers of the inputs pooled, of the values added, then of each input's pooled
    /// bias or null (the device array kept alive with the operator).
    ptrs: (u64, CudaSlice<u64>),
    /// Each input's image (NCHW) or pixel (channels last) stride, then each added value's run
    /// and stride.
    meta: (u64, CudaSlice<i64>),
    npool: i32,
    nadd: i32,
    n: i64,
    c: i32,
    nhwc: i32,
    p: [i32; 13],
    is_max: i32,
    act: (i32, f32, f32),
    /// The bias per channel (a null pointer where there is none), its channels and the
    /// elements per channel run.
    bias: (u64, i64, i64),
    /// Every index fits 32 bits.
    narrow: i32,
    /// Channels of a pixel a thread (4, 2 or 1: `vector_width`).
    vec: i32,
    total: usize,
}

impl Enqueue for CudaPoolSum {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let mut b = sc.launch_builder(gpu.function("pool2d_sum")?);
        b.arg(&self.y).arg(&self.y_view.0).arg(&self.y_view.1);
        b.arg(&self.ptrs.0).arg(&self.meta.0);
        b.arg(&self.npool).arg(&self.nadd).arg(&self.n).arg(&self.c);
        b.arg(&self.nhwc);
        for v in &self.p {
            b.arg(v);
        }
        b.arg(&self.is_max);
        let (code, p0, p1) = &self.act;
        b.arg(code).arg(p0).arg(p1);
        b.arg(&self.bias.0).arg(&self.bias.1).arg(&self.bias.2);
        b.arg(&self.narrow).arg(&self.vec);
        // SAFETY: matches `pool2d_sum` (y and its view, the pointer and meta arrays, npool,
        // nadd, n, c, nhwc, 13 ints, is_max, the activation, the bias, narrow, vec); both
        // arrays live in this operator, 2 * npool + nadd pointers and npool + 2 * nadd meta
        // values; each input holds n images at its stride, each value added and y `total`
        // elements in their runs (the layout checked that views fit their parents); the bias,
        // where not null, holds `channels` values, each pooled bias `c`; `narrow` only where
        // every extent fits 32 bits; `vec` divides c (the kernel checks every access's
        // alignment again), and the grid strides over total / vec.
        let threads = self.total / self.vec as usize;
        launched(unsafe { b.launch(grid(threads)) }, "pool2d_sum")
    }
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

    /// The kernels' 13 ints of geometry: h, w, oh, ow, the window, its stride, the padding
    /// before and after, whether an average counts the padding.
    fn geometry(&self) -> Result<[i32; 13], GpuError> {
        let [_, _, h, w] = self.input;
        Ok([
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
        ])
    }

    /// Elements of the output.
    fn out_len(&self) -> usize {
        let [n, c, _, _] = self.input;
        n * c * self.out_hw[0] * self.out_hw[1]
    }

    /// Pool `x` (the whole input, dense, in the step's layout) into `y` (the whole output),
    /// the planes in parallel: straight from the input where `depthwise::pooled` takes the
    /// window (2x2 at stride two, 3x3 and 5x5 at stride one or two: blocks of rows in
    /// registers, as the depthwise convolutions run); otherwise each plane padded once with
    /// the reduction's identity, then reduced by sliding windows (`crate::cpu::window`).
    /// Both fold each window's taps as the reference does (an average's in row-major order):
    /// the same bits.
    fn pool_into(&self, x: &[f32], y: &mut [f32]) -> Result<(), GpuError> {
        let [n, c, h, w] = self.input;
        let (inp, outp) = (h * w, self.out_hw[0] * self.out_hw[1]);
        if n * c * outp == 0 {
            return Ok(());
        }
        let win = Windows {
            input: [h, w],
            kernel: self.kernel,
            stride: self.stride,
            padding: self.padding,
            dilation: [1, 1],
            out: self.out_hw,
        };
        // An average's divisor per output row and column (a window's size is their product).
        let [rows, cols] = [0, 1].map(|a| {
            (0..self.out_hw[a])
                .map(|i| self.divides(a, i))
                .collect::<Vec<_>>()
        });
        let divisor = |i: usize, j: usize| (rows[i] * cols[j]).max(1) as f32;
        let fill = if self.max { f32::NEG_INFINITY } else { 0.0 };
        let work = win.scratch_len() + outp * self.kernel[0] * self.kernel[1];
        let taps = win.taps();
        // One window over the whole unpadded plane (a global pool): a fold over the plane as
        // it lies (the reference's max; its sum, but in sixteen vectorised partial sums).
        let global = self.kernel == [h, w] && self.padding == [0, 0] && self.out_hw == [1, 1];
        let direct = !global && depthwise::pooled_suits(&win);
        // An average's divisor per output pixel, for the direct sums.
        let divisors: Vec<f32> = match direct && !self.max {
            true => (0..outp)
                .map(|p| divisor(p / self.out_hw[1], p % self.out_hw[1]))
                .collect(),
            false => Vec::new(),
        };
        let planes = |x: &[f32], y: &mut [f32]| {
            if direct {
                let taps = self.kernel[0] * self.kernel[1];
                let taken = try_plane_groups(y, outp, inp + outp * taps, |first, ys| {
                    let xs = &x[first * inp..first * inp + ys.len() / outp * inp];
                    let taken = depthwise::pooled(&win, xs, self.max, ys);
                    if taken && !self.max {
                        // (Vectorised: SSE's divisions took as long as the sums.)
                        with_avx512(|| {
                            for plane in ys.chunks_mut(outp) {
                                plane.iter_mut().zip(&divisors).for_each(|(v, d)| *v /= d);
                            }
                        })
                    }
                    taken
                });
                // (Not reached: `pooled_suits` held and the slices fit their shapes.)
                return match taken {
                    true => Ok(()),
                    false => Err(GpuError::Plan(format!(
                        "the pooling kernel refused {win:?} of input {:?}",
                        self.input
                    ))),
                };
            }
            if global {
                let size = divisor(0, 0);
                for_planes(y, 1, inp, |bc, v| {
                    let plane = &x[bc * inp..(bc + 1) * inp];
                    v[0] = match self.max {
                        true => max_of(plane),
                        false => sum(plane) / size,
                    };
                });
                return Ok(());
            }
            for_planes(y, outp, work, |bc, plane| {
                with_scratch(win.scratch_len(), |buf| {
                    win.pad(&x[bc * inp..(bc + 1) * inp], |v| v, fill, buf);
                    win.pool(&taps, buf, self.max, divisor, plane);
                })
            });
            Ok(())
        };
        if self.nhwc {
            let out = [n, c, self.out_hw[0], self.out_hw[1]];
            return crate::program::through_nchw(x, self.input, y, out, planes);
        }
        planes(x, y)
    }

    /// The input rows (`axis` 0) or columns (1) that output row or column `i`'s windows
    /// cover (empty where they cover padding only), and how many they span counting the
    /// padding (up to the padding's end).
    fn extent(&self, axis: usize, i: usize) -> (std::ops::Range<usize>, usize) {
        let n = self.input[2 + axis] as isize;
        let start = i as isize * self.stride[axis] as isize - self.padding[axis] as isize;
        let end = (start + self.kernel[axis] as isize).min(n + self.padding_end[axis] as isize);
        let padded = (end - start).max(0) as usize;
        let first = start.max(0);
        let last = end.min(n).max(first);
        (first as usize..last as usize, padded)
    }

    /// What an average's windows at output row (`axis` 0) or column (1) `i` count along that
    /// axis ([`Pool::extent`]: padding included or not); a window divides by the product of
    /// its row's and its column's.
    fn divides(&self, axis: usize, i: usize) -> usize {
        let (inside, padded) = self.extent(axis, i);
        match self.count_include_pad {
            true => padded,
            false => inside.len(),
        }
    }

    /// What pooling `x + b` adds to pooling `x` per unit of a bias `b` per channel, at output
    /// pixel `(i, j)`: 1 for a max, the input elements' share of the divisor for an average
    /// (less than 1 where the average counts padding).
    fn share(&self, i: usize, j: usize) -> f32 {
        if self.max {
            return 1.0;
        }
        let inside = self.extent(0, i).0.len() * self.extent(1, j).0.len();
        let size = self.divides(0, i) * self.divides(1, j);
        inside as f32 / size.max(1) as f32
    }

    /// [`Pool::pool_into`], then `bias` (one per channel, where a convolution left one to the
    /// pooling) times each output pixel's [`Pool::share`] added.
    fn pool_biased(&self, x: &[f32], bias: Option<&[f32]>, y: &mut [f32]) -> Result<(), GpuError> {
        self.pool_into(x, y)?;
        if let Some(b) = bias {
            self.add_bias(b, y);
        }
        Ok(())
    }

    /// Add `bias` (one per channel) times each output pixel's [`Pool::share`] to `y`, the
    /// whole output in the step's layout.
    fn add_bias(&self, bias: &[f32], y: &mut [f32]) {
        let [_, c, _, _] = self.input;
        let [oh, ow] = self.out_hw;
        let share: Vec<f32> = (0..oh * ow).map(|p| self.share(p / ow, p % ow)).collect();
        if c == 0 || share.is_empty() {
            return;
        }
        if self.nhwc {
            for (p, pixel) in y.chunks_mut(c).enumerate() {
                let s = share[p % share.len()];
                pixel.iter_mut().zip(bias).for_each(|(v, b)| *v += b * s);
            }
        } else {
            for (bc, plane) in y.chunks_mut(share.len()).enumerate() {
                let b = bias[bc % c];
                plane.iter_mut().zip(&share).for_each(|(v, s)| *v += b * s);
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
        let mut reads = vec![(self.x, n * c * h * w)];
        reads.extend(self.bias.map(|b| (b, c)));
        Access {
            reads,
            writes: vec![(self.y, n * c * self.out_hw[0] * self.out_hw[1])],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let x = io.read(self.x)?;
        let bias = self.bias.map(|b| io.read(b)).transpose()?;
        let y = &mut io.write(self.y)?[..self.out_len()];
        self.pool_biased(x, bias, y)
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        let [n, c, _, _] = self.input;
        let (y, runs) = cx.strided(self.y)?;
        let (x, x_runs) = cx.strided(self.x)?;
        let (ximage, xpix, ypix) = self
            .strides(x_runs, runs)?
            .ok_or_else(|| cx.no_kernel("a channels-last pooling into runs other than pixels"))?;
        // Channels last, several channels of a pixel a thread where every access allows it.
        let vec = vector_width([c, ypix, xpix], [y, x]) as i32;
        Ok(Box::new(CudaPool {
            nhwc: self
                .nhwc
                .then_some((n as i64, ypix as i64, xpix as i64, vec)),
            y,
            runs: runs_args(runs)?,
            x,
            nc: (n * c) as i64,
            c: c_int(c, "channels")?,
            ximage: as_i64(ximage, "image stride")?,
            p: self.geometry()?,
            is_max: i32::from(self.max),
            bias: self.bias.map(|b| cx.ptr(b)).transpose()?.unwrap_or(0),
            total: self.out_len(),
        }))
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some(if self.nhwc { "pool2d_nhwc" } else { "pool2d" })
    }
}

/// `pool2d`, or `pool2d_runs` where `y` is a strided view (a pooling branch's slice of a
/// concatenation at batch > 1).
struct CudaPool {
    /// Channels last: `pool2d_nhwc` with the batch, `y`'s and `x`'s pixel strides and the
    /// channels a thread (4, 2 or 1: `vector_width`).
    nhwc: Option<(i64, i64, i64, i32)>,
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
    /// The bias left to the pooling (a null pointer where there is none).
    bias: u64,
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
            Some((n, ..)) => b.arg(n).arg(&self.c),
            None => b.arg(&self.nc).arg(&self.c).arg(&self.ximage),
        };
        for v in &self.p {
            b.arg(v);
        }
        b.arg(&self.is_max).arg(&self.bias);
        match (&self.nhwc, &self.runs) {
            (Some((_, ypix, xpix, vec)), _) => {
                b.arg(ypix).arg(xpix).arg(vec);
            }
            (None, Some((run, stride))) => {
                b.arg(run).arg(stride);
            }
            (None, None) => {}
        }
        // SAFETY: matches `pool2d` (nc, c and x's image stride, 13 ints, then is_max and the
        // bias; `pool2d_runs`: then y's run and stride; `pool2d_nhwc`: n and c, 13 ints,
        // is_max, the bias, then y's and x's pixel strides and `vec`, which divides c: the
        // kernel checks every access's alignment again, the grid strides over total / vec);
        // buffer sizes checked at preparation (the bias, where not null, holds c values), a
        // strided view's runs by the layout.
        let threads = self.total / self.nhwc.map_or(1, |v| v.3 as usize);
        launched(unsafe { b.launch(grid(threads)) }, name)
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
                bias: None,
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
            bias: None,
        };
        assert!(s
            .strides(None, Some(Runs { run: 2, stride: 8 }))
            .unwrap()
            .is_none());
    }

    proptest::proptest! {
        /// The CPU step (straight from the input in blocks of rows where the window suits,
        /// else sliding windows over padded planes; in both layouts) gives exactly the
        /// reference's poolings: uneven padding, windows past the end (ceil mode), max and
        /// both averages, planes narrower and wider than a vector. The same sums in the same
        /// order, the same maxima (NaN never taken, a -0 kept), so the same bits.
        #[test]
        fn cpu_poolings_are_the_reference_bit_for_bit(
            n in 1usize..3, c in 1usize..4, h in 1usize..24, w in 1usize..40,
            kh in 1usize..6, kw in 1usize..6, sh in 1usize..4, sw in 1usize..3,
            bh in 0usize..3, bw in 0usize..3, eh in 0usize..3, ew in 0usize..3,
            ceil in proptest::bool::ANY, kind in 0usize..3, nhwc in proptest::bool::ANY,
        ) {
            let (kernel, stride, begin, end) = ([kh, kw], [sh, sw], [bh, bw], [eh, ew]);
            // A padding at least the window is not a pooling (PyTorch's and ONNX's rule).
            proptest::prop_assume!(bh < kh && bw < kw && eh < kh && ew < kw);
            let out = [0, 1].map(|a| {
                let span = [h, w][a] + begin[a] + end[a];
                let floor = span.checked_sub(kernel[a]).map(|v| v / stride[a] + 1);
                // Ceil mode: one more window where it starts inside the input or its padding before.
                floor.map(|o| o + usize::from(ceil && o * stride[a] < [h, w][a] + begin[a]))
            });
            let [Some(oh), Some(ow)] = out else {
                return Ok(());
            };
            let (max, count_include_pad) = [(true, false), (false, true), (false, false)][kind];
            let s = Pool {
                x: 0,
                y: 1,
                input: [n, c, h, w],
                out_hw: [oh, ow],
                max,
                kernel,
                stride,
                padding: begin,
                padding_end: end,
                count_include_pad,
                nhwc,
                bias: None,
            };
            let mut x = crate::program::uniform(5, n * c * h * w, -1.0, 1.0);
            if max {
                // A max ignores NaN (the reference's `f32::max`); a -0 may be the max of the
                // negatives around it.
                x.iter_mut().step_by(3).for_each(|v| *v = f32::NAN);
                x.iter_mut().skip(1).step_by(3).for_each(|v| *v = -v.abs());
                x.iter_mut().skip(2).step_by(6).for_each(|v| *v = -0.0);
            }
            let window = crate::reference::PoolWindow { kernel, stride, begin, end, count_include_pad };
            let want = crate::reference::pool2d_padded(&x, s.input, s.out_hw, max, &window);
            let stored = match nhwc {
                false => x.clone(),
                true => {
                    let mut v = vec![0.0; x.len()];
                    crate::program::nchw_to_nhwc(&x, s.input, &mut v);
                    v
                }
            };
            let mut y = vec![f32::NAN; s.out_len()];
            s.run_cpu(&mut CpuIo::of(vec![(0, &stored[..])], vec![(1, &mut y[..])])).unwrap();
            let got = match nhwc {
                false => y,
                true => crate::program::nhwc_to_nchw(&y, [n, c, oh, ow]),
            };
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            proptest::prop_assert_eq!(bits(&got), bits(&want));
        }
    }

    /// A global pool (one window over each whole plane, which the CPU folds in place) is the
    /// reference's in both layouts: its max bit for bit, its average within 1e-6 (the CPU adds
    /// in sixteen partial sums, the reference in order).
    #[test]
    fn global_poolings_are_the_reference() {
        let input = [2, 3, 9, 7];
        let x = crate::program::uniform(9, 2 * 3 * 9 * 7, -1.0, 1.0);
        for (max, nhwc) in [(true, false), (false, false), (true, true), (false, true)] {
            let s = Pool {
                x: 0,
                y: 1,
                input,
                out_hw: [1, 1],
                max,
                kernel: [9, 7],
                stride: [1, 1],
                padding: [0, 0],
                padding_end: [0, 0],
                count_include_pad: true,
                nhwc,
                bias: None,
            };
            let want = crate::reference::pool2d(&x, input, [1, 1], max, [9, 7], [1, 1], [0, 0]);
            let stored = match nhwc {
                false => x.clone(),
                true => {
                    let mut v = vec![0.0; x.len()];
                    crate::program::nchw_to_nhwc(&x, input, &mut v);
                    v
                }
            };
            let mut y = vec![f32::NAN; 6];
            s.run_cpu(&mut CpuIo::of(
                vec![(0, &stored[..])],
                vec![(1, &mut y[..])],
            ))
            .unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            if max {
                assert_eq!(bits(&y), bits(&want), "max, channels last {nhwc}");
            }
            for (g, w) in y.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-6, "channels last {nhwc}: {g} vs {w}");
            }
        }
    }
}
