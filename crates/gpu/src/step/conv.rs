//! 2-D convolution (NCHW), then `+ bias` per output channel and the activation.
//!
//! - CPU: im2col and a matrix product per image and group (`gemm`), with bias and
//!   activation applied to each block of the output while it is in cache; convolutions
//!   with small output planes (17x17 and below, any stride) run direct instead, tiles of
//!   output channels and pixels summing the padded planes' taps in registers, the weights
//!   repacked once by the device (`crate::cpu::direct`: no im2col matrix, faster there). The
//!   input planes
//!   are padded once per image (`crate::cpu::window`: the input bias and activation applied
//!   there, the columns split by stride phase), so every im2col row is copies of contiguous
//!   runs at any stride. Without groups the
//!   product is split across threads (rayon) by column tiles (each task writes and packs only
//!   its own im2col block; a 1x1 stride-1 convolution reads its input in place) or, for deep
//!   layers with more channels than pixels, by blocks of output rows; grouped convolutions
//!   run the groups in parallel instead. im2col blocks live in per-thread scratch kept between
//!   runs. A convolution whose groups read one channel each (depthwise) slides its windows
//!   over each padded input plane instead (`crate::cpu::window`; at stride one in blocks of
//!   rows in registers, `crate::cpu::depthwise`), the planes in parallel.
//! - CUDA: cuDNN. The candidates are the legacy API's algorithms that work for the shape and
//!   the engine configurations the backend API's heuristics rank highest, or list as a
//!   fallback where none of those is allowed (`crate::cuda::engine`;
//!   `KernelOptions::conv_api` picks either alone). Each is timed once per device and shape,
//!   as GPU time in a CUDA graph replay; the measurements are kept in the device's
//!   [`crate::tuning::Tuning`] (and by the CLI in the cost cache, so later processes run the
//!   same kernel), and the choice is made from them deterministically.
//!   conv + bias + relu runs as cuDNN's fused call (legacy algorithms only: the chosen one,
//!   or the fastest legacy one when an engine won) where the call works and measured no slower
//!   than the chosen kernel followed by the `bias_act` kernel (also kept in the tuning
//!   table), else as those two; conv + bias alone likewise, with the fused call's identity
//!   activation (which cuDNN runs only with the implicit precomputed GEMM algorithm). A
//!   residual the convolution adds is the fused call's `z` (or the `bias_act` kernel's
//!   residual). Depthwise convolutions run as our NVRTC kernel, with the input activation,
//!   bias and activation in it.
//! - Both: an input bias (`in_bias`: the bias the convolution before it left to it, depthwise
//!   convolutions only) and then an input activation (`pre_act`) apply to what the
//!   convolution reads, and a residual is added with the bias before the activation
//!   (`opsched_graph::fusion`). A convolution whose readers add its bias has none here.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::ops::Range;

use cudarc::cudnn::{result as dnn, sys as dnn_sys};
use cudarc::driver::{CudaSlice, DevicePtr, PushKernelArg};
use opsched_graph::{Activation, Conv2d};
use rayon::prelude::*;
use serde::Serialize;

use super::{product, Access, Step, StepKernel};
use crate::cpu::depthwise;
use crate::cpu::direct::{self, Direct};
use crate::cpu::lanes;
use crate::cpu::math::{
    act_add, apply_bias_act, bias_act_each, bias_act_row, for_plane_groups, for_planes, sgemm,
    sgemm_column_tiles, sgemm_short, try_plane_groups, with_act, with_avx2, with_scratch, Mat,
    SharedOut, TilesOfB,
};
use crate::cpu::window::{self, Taps, Windows};
use crate::cpu::CpuIo;
use crate::cuda::cudnn::{
    tensor4, tensor4_images, tensor4_nhwc_pixels, ActDesc, ConvDesc, FilterDesc, TensorDesc,
};
use crate::cuda::engine::{ConvGraph, ConvShape, EngineRef, Plan as EnginePlan};
use crate::cuda::nvrtc::act_params;
use crate::cuda::{grid, launched, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{weight_half_width, At, BufId, Builder, Init, MergedConv, Src};
use crate::{ConvApi, ConvGemm, GpuError};

/// Output pixels up to which a convolution runs direct on the CPU ([`Conv::direct`]):
/// Inception-v3's 17x17.
const DIRECT_PIXELS: usize = 289;

/// Input channels from which a convolution of whole panels of output channels runs direct
/// on the CPU at any size of plane ([`Conv::direct`]): a stem's three are too few.
const DIRECT_CHANNELS: usize = 16;

/// Output pixels up to which, and output channels from which, a pointwise convolution (of
/// whole panels) runs direct on the CPU ([`Conv::direct`]): its weights are then many times
/// its input, and the direct tiles read them repacked once where `gemm` packs its operands
/// on every run. One thread, layer by layer in whole models, the two builds alternated
/// (2026-11-28): on 7x7 planes 160 -> 960, 320 -> 1280, 960 -> 320, 1024 -> 2048 and
/// 2048 -> 1024 0.78-0.85x; with the input copied (before it was read in place) 960 -> 160
/// and 832 -> 128 1.08-1.14x, and on 14x14 0.94-1.01x with 512 output channels or more,
/// 1.1-2x with 128 or fewer.
const DIRECT_POINTWISE: [usize; 2] = [64, 256];

/// Output pixels up to which, and input channels from which, a pointwise convolution (of
/// whole panels) also runs direct on the CPU ([`Conv::direct`]): an inner dimension this
/// long keeps the AVX-512 tiles busy (their blocks of up to 1024, no prefetches), where a
/// short one leaves them to their stores. One thread, the layers that change in whole
/// models, three processes of each build alternated (Zen 5, 2026-11-29): DenseNet-121's 41
/// (256-1024 -> 128 on 14x14 and 7x7) 5.96 -> 5.37 ms, EfficientNet-V2-S's 36 3.88 -> 3.48,
/// GoogLeNet's 24 2.41 -> 2.32, EfficientNet-B0's 13 1.13 -> 1.05, MobileNetV3-Large's 7
/// 0.60 -> 0.54; but from 128 or 160 channels (EfficientNet-V2-S's 128 -> 512 and
/// 160 -> 960 on 14x14) 1.01-1.17x, and on 28x28 (DenseNet-121) 1.0x, 56x56 1.1x. On
/// Inception-v3's 17x17 planes (768 channels in; three processes of each alternated, Zen 5,
/// 2026-11-29, after the even splits of ada59ba) per layer 0.45 -> 0.38 ms on one thread,
/// 0.31 -> 0.23 on two: `gemm` packed the 768 x 192 weights again for each tile of columns.
const DIRECT_POINTWISE_LONG: [usize; 2] = [289, 256];

/// The largest share of (tap, output pixel) pairs that read the input for which a
/// convolution runs as a sum over its taps ([`Conv::live_taps`]); an ordinary 3x3 convolution
/// with padding 1 reads the input with 82% of them on a 7x7 map, 91% on 14x14.
const LIVE_TAPS: f64 = 0.5;

/// Output channels a task of [`Conv::sum_of_taps`] computes.
const TAP_BLOCK: usize = 64;

/// One tap of a convolution (`[row, column]` of the kernel) and the output pixels where it
/// reads the input: `rows x cols`.
#[derive(Clone, Debug)]
struct TapRegion {
    tap: [usize; 2],
    rows: Range<usize>,
    cols: Range<usize>,
}

impl TapRegion {
    fn pixels(&self) -> usize {
        self.rows.len() * self.cols.len()
    }
}

/// A convolution step; `w` is `[oc, c / groups, kh, kw]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Conv {
    pub x: BufId,
    pub w: BufId,
    pub bias: Option<BufId>,
    pub y: BufId,
    /// Input `[n, c, h, w]`.
    pub input: [usize; 4],
    pub out_channels: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    /// Padding before (top, left) and after (bottom, right) each spatial axis.
    pub padding: [usize; 2],
    pub padding_end: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    /// Output `[oh, ow]`.
    pub out_hw: [usize; 2],
    pub act: Activation,
    /// Applied to every input element the convolution reads (padding stays zero): the
    /// activation before a depthwise convolution in a `sequential` operator
    /// (`opsched_graph::fusion::pre_activations`).
    pub pre_act: Activation,
    /// Added per channel to every input element it reads, before `pre_act` (padding stays
    /// zero): the bias that the convolution before it left to it
    /// (`opsched_graph::fusion::deferred_bias`; our depthwise kernel only).
    pub in_bias: Option<BufId>,
    /// Further inputs, dense like `x`, added to it element by element as it is read (before
    /// `in_bias` and `pre_act`): the values of the sum it reads
    /// (`opsched_graph::fusion::depthwise_reads_sum`; our depthwise kernel only).
    pub sum_with: Vec<BufId>,
    /// Added to the output (with the bias) before `act`: the residual sum the convolution
    /// computes (`opsched_graph::fusion::residual_source`).
    pub residual: Option<BufId>,
    /// `x`, `y` and the residual are stored channels last (`[n, h, w, c]`,
    /// [`crate::program::Layout::Nhwc`]); the weights stay `[oc, c, kh, kw]`.
    pub nhwc: bool,
}

/// What a convolution's kernel does beyond its operator (`opsched_graph::fusion`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Fusion {
    /// The activation before it, applied to what it reads.
    pub pre_act: Activation,
    /// The residual it adds (a node whose output it reads) and the activation it then applies
    /// instead of its own (which is none).
    pub residual: Option<(opsched_graph::NodeId, Activation)>,
}

/// Lower a `conv2d` operator reading `src` into `out`, with what `fusion` adds.
#[allow(clippy::too_many_arguments)]
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    c: &Conv2d,
    fusion: Fusion,
    src: Src<'_>,
    out: BufId,
    out_shape: &[usize],
) -> Result<(), GpuError> {
    // A sum our depthwise kernel reads value by value (no add kernel): its first value is `x`,
    // the others `sum_with`, all dense.
    let summed = match src {
        Src::Terms([t]) if t.len() > 1 && b.depthwise_reads_sum(at.node) => Some(t.as_slice()),
        _ => None,
    };
    let (x, xs, sum_with) = match summed {
        Some(t) => {
            let mut bufs = Vec::with_capacity(t.len());
            for v in t {
                let buf = b.source(steps, at, v.node)?;
                bufs.push(b.readable(steps, at, buf));
            }
            let x = bufs.remove(0);
            (x, b.value_shape(&t[0]), bufs)
        }
        None => {
            let (x, xs) = b.single_strided(steps, at, src)?;
            (x, xs, Vec::new())
        }
    };
    let [n, ch, h, w] = b.four(at, &xs)?;
    let [_, oc, oh, ow] = b.four(at, out_shape)?;
    let groups = c.groups.max(1);
    // Our depthwise kernel takes a strided input's image or pixel stride, cuDNN (without an
    // input activation) its strides; anything else reads a dense copy.
    let x = match reads_strided(c, ch, fusion.pre_act) {
        true if opsched_graph::fusion::is_depthwise(c, ch) && fusion.residual.is_none() => {
            b.view_or_copy(steps, at, x, &xs)
        }
        true => x,
        false => b.readable(steps, at, x),
    };
    if ch % groups != 0 || oc % groups != 0 {
        return Err(b.unsupported(
            at,
            format!("{ch} input and {oc} output channels do not split into {groups} groups"),
        ));
    }
    let fan_in = product(
        &[ch / groups, c.kernel[0], c.kernel[1]],
        "convolution fan-in",
    )?;
    let wlen = product(&[oc, fan_in], "convolution weights")?;
    let wb = b.param(at, "weight", wlen, 0.0, weight_half_width(fan_in))?;
    // A bias its readers add (`opsched_graph::fusion::deferred_bias`) is not its own.
    let bias = (c.bias && !b.bias_deferred(at))
        .then(|| b.bias_param(at, oc))
        .transpose()?;
    // The bias the convolution before it left to it, which our depthwise kernel adds as it
    // reads (where another kernel reads it, the program's check reports the bias missed).
    let depthwise = opsched_graph::fusion::is_depthwise(c, ch) && fusion.residual.is_none();
    let in_bias = match src {
        Src::Terms([t])
            if depthwise
                && (t.len() == 1 || summed.is_some())
                && t.iter().all(|v| v.channels.is_none()) =>
        {
            b.term_bias(at, t, &xs)?.map(|cb| cb.buf)
        }
        _ => None,
    };
    let (residual, act) = match fusion.residual {
        Some((z, act)) => {
            let z = b.source(steps, at, z)?;
            (Some(b.readable(steps, at, z)), act)
        }
        None => (None, c.act),
    };
    steps.push(
        Conv {
            x,
            w: wb,
            bias,
            y: out,
            input: [n, ch, h, w],
            out_channels: oc,
            kernel: c.kernel,
            stride: c.stride,
            padding: c.pads().0,
            padding_end: c.pads().1,
            dilation: c.dilation,
            groups,
            out_hw: [oh, ow],
            act,
            pre_act: fusion.pre_act,
            in_bias,
            sum_with,
            residual,
            nhwc: b.channels_last_at(at.node),
        }
        .into(),
    );
    Ok(())
}

/// Lower a merged group of convolutions ([`crate::program::MergedConv`]) as one convolution
/// reading the members' common input `src` into the merged output: its weights are the
/// members' (as [`lower`] would make them) side by side, each kernel zero-padded around its
/// centre to the merged kernel, and its bias theirs likewise.
pub(crate) fn lower_merged(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    m: &MergedConv,
    src: Src<'_>,
) -> Result<(), GpuError> {
    let (x, xs) = b.single_strided(steps, at, src)?;
    let [n, ch, h, w] = b.four(at, &xs)?;
    let c = &m.conv;
    let x = match reads_strided(c, ch, Activation::None) {
        true => x,
        false => b.readable(steps, at, x),
    };
    let wlen = product(
        &[c.out_channels, ch, c.kernel[0], c.kernel[1]],
        "merged convolution weights",
    )?;
    let mut weight = Vec::with_capacity(wlen);
    let mut bias = Vec::with_capacity(if c.bias { c.out_channels } else { 0 });
    for (node, part) in &m.members {
        let at = At { node: *node, ..at };
        let fan_in = product(&[ch, part.kernel[0], part.kernel[1]], "convolution fan-in")?;
        let len = product(&[part.out_channels, fan_in], "convolution weights")?;
        let part_bias = c.bias.then_some(part.out_channels);
        let (w, part_bias) = b.member_params(at, len, fan_in, part_bias)?;
        pad_kernels(&w, part.kernel, c.kernel, &mut weight);
        bias.extend(part_bias);
    }
    if weight.len() != wlen || bias.len() != if c.bias { c.out_channels } else { 0 } {
        return Err(b.unsupported(at, "the merged convolution's members do not add up"));
    }
    let w_buf = b.param_buffer(at, "merged weight", wlen, Init::Data(weight.into()));
    let bias = c
        .bias
        .then(|| b.param_buffer(at, "merged bias", c.out_channels, Init::Data(bias.into())));
    steps.push(
        Conv {
            x,
            w: w_buf,
            bias,
            y: m.out,
            input: [n, ch, h, w],
            out_channels: c.out_channels,
            kernel: c.kernel,
            stride: c.stride,
            padding: c.pads().0,
            padding_end: c.pads().1,
            dilation: c.dilation,
            groups: 1,
            out_hw: m.out_hw,
            act: c.act,
            pre_act: Activation::None,
            in_bias: None,
            sum_with: Vec::new(),
            residual: None,
            nhwc: b.channels_last_at(at.node),
        }
        .into(),
    );
    Ok(())
}

/// Whether convolution `c` of `channels` input channels (and input activation `pre_act`)
/// reads a strided view of its input in place ([`opsched_graph::merge::conv_reads_strided`];
/// an input activation is applied by our depthwise kernel alone).
fn reads_strided(c: &Conv2d, channels: usize, pre_act: Activation) -> bool {
    let depthwise = opsched_graph::fusion::is_depthwise(c, channels);
    (pre_act == Activation::None || depthwise)
        && opsched_graph::merge::conv_reads_strided(c, channels)
}

/// Append `w` (`[.., kh, kw]` kernels, `k = [kh, kw]`) to `out` with every kernel zero-padded
/// to `to`, centred (`to - k` is even in both axes: `opsched_graph::merge`).
fn pad_kernels(w: &[f32], k: [usize; 2], to: [usize; 2], out: &mut Vec<f32>) {
    let (top, left) = ((to[0] - k[0]) / 2, (to[1] - k[1]) / 2);
    for kernel in w.chunks_exact(k[0] * k[1]) {
        let start = out.len();
        out.resize(start + to[0] * to[1], 0.0);
        for (r, row) in kernel.chunks_exact(k[1]).enumerate() {
            let at = start + (top + r) * to[1] + left;
            out[at..at + k[1]].copy_from_slice(row);
        }
    }
}

impl Conv {
    fn out_len(&self) -> usize {
        self.input[0] * self.out_channels * self.out_hw[0] * self.out_hw[1]
    }

    /// An asymmetrically padded convolution as cuDNN runs it (it pads both sides alike): the
    /// difference padded explicitly into `padded`, in storage order (channels last,
    /// `[n, h, w, c]`), then the convolution with the common part, reading `padded`.
    fn explicit_pad(&self, padded: BufId) -> (super::pad::Pad, Conv) {
        let [n, c, h, w] = self.input;
        let sym = [0, 1].map(|a| self.padding[a].min(self.padding_end[a]));
        let pre = [0, 1].map(|a| self.padding[a] - sym[a]);
        let post = [0, 1].map(|a| self.padding_end[a] - sym[a]);
        let (shape, begin, end) = match self.nhwc {
            false => (
                vec![n, c, h, w],
                vec![0, 0, pre[0], pre[1]],
                vec![0, 0, post[0], post[1]],
            ),
            true => (
                vec![n, h, w, c],
                vec![0, pre[0], pre[1], 0],
                vec![0, post[0], post[1], 0],
            ),
        };
        let pad = super::pad::Pad {
            x: self.x,
            y: padded,
            shape,
            begin,
            end,
            value: 0.0,
        };
        let inner = Conv {
            x: padded,
            input: [n, c, h + pre[0] + post[0], w + pre[1] + post[1]],
            padding: sym,
            padding_end: sym,
            ..self.clone()
        };
        (pad, inner)
    }

    /// The bias, residual and activation as the in-place step the GPU runs after a
    /// convolution that cuDNN's fused call does not run (None where there are none): over
    /// every output element, the bias of each element's channel (NCHW: a run of `h * w`
    /// elements per channel; channels last: consecutive channels).
    fn epilogue(&self) -> Option<super::act::BiasAct> {
        if self.bias.is_none() && self.act == Activation::None && self.residual.is_none() {
            return None;
        }
        Some(super::act::BiasAct {
            y: self.y,
            bias: self.bias,
            total: self.out_len(),
            channels: self.out_channels,
            inner: if self.nhwc {
                1
            } else {
                self.out_hw[0] * self.out_hw[1]
            },
            act: self.act,
            residual: self.residual,
        })
    }

    /// Rows of the im2col matrix of one group: `c / groups * kh * kw`.
    fn col_rows(&self) -> usize {
        self.input[1] / self.groups * self.kernel[0] * self.kernel[1]
    }

    /// One group per input channel, one output channel per group: on CUDA our
    /// `depthwise_conv` kernel rather than cuDNN.
    fn is_depthwise(&self) -> bool {
        opsched_graph::fusion::depthwise(self.groups, self.out_channels, self.input[1])
    }

    /// A 1x1, stride-1, unpadded convolution reads its input as the im2col matrix.
    fn is_pointwise(&self) -> bool {
        self.pre_act == Activation::None
            && self.in_bias.is_none()
            && self.kernel == [1, 1]
            && self.stride == [1, 1]
            && self.padding == [0, 0]
            && self.padding_end == [0, 0]
    }

    /// A pointwise convolution (one group, no padding) of a stride over one as the pointwise
    /// convolution of stride one of the input's pixels it reads ([`Conv::subsample`]), the
    /// input bias and activation applied as they are gathered: ResNets' shortcuts into a
    /// stage, whose planes were padded and split in four phases, all of them, for an im2col
    /// matrix of one.
    fn subsampled(&self) -> Option<Conv> {
        let [_, c, h, w] = self.input;
        let [oh, ow] = self.out_hw;
        let [sh, sw] = self.stride;
        let fits = oh > 0 && ow > 0 && (oh - 1) * sh < h && (ow - 1) * sw < w;
        let strided = self.kernel == [1, 1] && self.stride != [1, 1] && self.groups == 1;
        let unpadded = self.padding == [0, 0] && self.padding_end == [0, 0];
        // (One image: `Conv::compute` gathers and convolves image by image.)
        (strided && unpadded && fits).then(|| Conv {
            input: [1, c, oh, ow],
            stride: [1, 1],
            pre_act: Activation::None,
            in_bias: None,
            ..self.clone()
        })
    }

    /// Image `x`'s pixels that a pointwise convolution of stride over one reads
    /// ([`Conv::subsampled`]), plus `in_bias` per channel, through `pre_act`, into `xs`
    /// (`[c, oh, ow]`).
    fn subsample(&self, x: &[f32], in_bias: Option<&[f32]>, xs: &mut [f32]) {
        let [_, c, h, w] = self.input;
        let [oh, ow] = self.out_hw;
        let [sh, sw] = self.stride;
        for_planes(&mut xs[..c * oh * ow], oh * ow, oh * ow, |ci, plane| {
            let src = &x[ci * h * w..(ci + 1) * h * w];
            let add = in_bias.map_or(0.0, |b| b[ci]);
            with_act!(self.pre_act, |f| {
                for (i, row) in plane.chunks_mut(ow).enumerate() {
                    let from = &src[i * sh * w..(i * sh + 1) * w];
                    match sw {
                        // (Eight pairs at a time through shuffles: element by element, 32
                        // channels of 112x112 gathered slower than padded whole.)
                        2 => window::evens(from, row, |v| f(v + add)),
                        _ => row
                            .iter_mut()
                            .enumerate()
                            .for_each(|(j, v)| *v = f(from[j * sw] + add)),
                    }
                }
            })
        });
    }

    /// A pointwise convolution of one group as a matrix product per image: `Y = W X` with
    /// `X: [c, h*w]`, `W: [oc, c]` and `Y: [oc, h*w]` row-major, i.e. the column-major
    /// `Y^T = X^T W^T` (`m = h*w`, `n = oc`, `k = c`), the weights shared by every image
    /// (stride 0).
    fn as_gemm(&self) -> super::gemm::Gemm {
        let [n, c, h, w] = self.input;
        let hw = h * w;
        let oc = self.out_channels;
        super::gemm::Gemm {
            a: self.x,
            b: self.w,
            c: self.y,
            trans_a: false,
            trans_b: false,
            m: hw,
            n: oc,
            k: c,
            lda: hw,
            ldb: c,
            ldc: hw,
            stride_a: c * hw,
            stride_b: 0,
            stride_c: oc * hw,
            batch: n,
            outer: 1,
            outer_stride: [0; 3],
            alpha: 1.0,
            epilogue: None,
            packed_a: super::gemm::PackedA::No,
        }
    }

    /// The windows of this convolution over one input plane (`crate::cpu::window`).
    fn windows(&self) -> Windows {
        Windows {
            input: [self.input[2], self.input[3]],
            kernel: self.kernel,
            stride: self.stride,
            padding: self.padding,
            dilation: self.dilation,
            out: self.out_hw,
        }
    }

    /// The direct convolution over the padded planes (`crate::cpu::direct`) where it measured
    /// faster than im2col and a matrix product: one group (or groups of whole panels, below), and
    /// either more than one tap with output planes of at most [`DIRECT_PIXELS`] or at least
    /// [`DIRECT_CHANNELS`] input channels into whole panels of output channels, or one tap
    /// ([`DIRECT_POINTWISE`], [`DIRECT_POINTWISE_LONG`]). Both in one process on 2 Zen 4 cores
    /// (2026-11-28, `opsched profile`): 14x14, 7x7 and 8x8 planes of ResNet-18, GoogLeNet and
    /// Inception-v3 0.5-0.9x, 17x17 0.75-1.1x (their sum 0.9x). Larger planes, layer by layer
    /// in whole models (`run --op-times`, the two builds alternated): ResNet-18's 56x56 and
    /// 28x28 0.89x and 0.91x and EfficientNet-V2-S's 1.0x on one thread; on two,
    /// FCN-ResNet-50's 2048 -> 512 on 28x28 0.78x,
    /// DenseNet-121's 128 -> 32 on 56x56 0.85x, VGG-11's 0.92-0.97x, Inception-v3's 147x147 to
    /// 35x35 0.85-0.97x; but stems of 3 channels 1.04-1.3x and 24 output channels on 112x112 (a
    /// panel a third empty) 1.18x, where im2col's packed product wins.
    ///
    /// With groups, each group's input channels and whole panels of outputs as above (more
    /// than one tap), group by group (RegNet's groups of eight outputs two at a time:
    /// [`Conv::merged_groups`]): ResNeXt-50's groups of 16 and 32 channels on 14x14 and
    /// 7x7 planes, which the product ran as 32 products of 16 or 32 rows, per layer on one
    /// thread 1.7-1.9x faster (2026-11-28, `run --op-times`, the two builds alternated).
    ///
    /// A pointwise convolution at stride one without padding reads its input in place (its
    /// planes are the input's); others read them padded ([`Conv::pad_planes`]).
    fn direct(&self) -> Option<Direct> {
        let pixels = self.out_hw[0] * self.out_hw[1];
        let (groups, merged) = (self.groups.max(1), self.merged_groups());
        let (cg, og) = (
            self.input[1] / groups * merged,
            self.out_channels / groups * merged,
        );
        let whole_panels = cg >= DIRECT_CHANNELS && og.is_multiple_of(direct::LANES);
        let taps = self.kernel[0] * self.kernel[1];
        let windows = taps > 1 && (pixels <= DIRECT_PIXELS || whole_panels);
        let [most_pixels, least_out] = DIRECT_POINTWISE;
        let [long_pixels, least_in] = DIRECT_POINTWISE_LONG;
        let pointwise = taps == 1
            && whole_panels
            && (pixels <= most_pixels && self.out_channels >= least_out
                || pixels <= long_pixels && cg >= least_in);
        // Groups run one by one, each on its own panels: whole ones, none across two groups.
        let fits = groups == 1 || (taps > 1 && whole_panels);
        if !fits || !(windows || pointwise) {
            return None;
        }
        if self.is_pointwise() {
            let [h, w] = [self.input[2], self.input[3]];
            return Some(Direct {
                plane: h * w,
                channels: cg,
                taps: Taps {
                    starts: vec![0],
                    step: w,
                },
                out: self.out_hw,
            });
        }
        let win = self.windows();
        Some(Direct {
            plane: win.scratch_len(),
            channels: cg,
            taps: win.taps(),
            out: self.out_hw,
        })
    }

    /// Groups the direct convolution takes as one ([`Conv::direct`]): RegNet's groups of
    /// eight output channels two at a time on output planes of up to [`DIRECT_PIXELS`], a
    /// panel of sixteen whose halves each read only their own group's input channels (the
    /// weights block-diagonal, zero across: twice the multiply-adds, at the tiles' speed
    /// where im2col's products of eight rows ran at a fifth of it; an odd count's last group
    /// keeps im2col); one elsewhere.
    fn merged_groups(&self) -> usize {
        let og = self.out_channels / self.groups.max(1);
        let taps = self.kernel[0] * self.kernel[1];
        let small = self.out_hw[0] * self.out_hw[1] <= DIRECT_PIXELS;
        match self.groups > 1 && 2 * og == direct::LANES && taps > 1 && small {
            true => 2,
            false => 1,
        }
    }

    /// The groups the direct convolution runs ([`Conv::merged_groups`] at a time): all but
    /// an odd count's last.
    fn direct_groups(&self) -> usize {
        let merged = self.merged_groups();
        self.groups.max(1) / merged * merged
    }

    /// For the CPU device: this convolution's weights (`values`) repacked for the direct
    /// convolution ([`direct::pack`]) where it runs direct, once, before the first run (groups
    /// it takes as one, [`Conv::merged_groups`], block-diagonal; where it runs as a sum over
    /// its taps, [`Conv::live_taps`], tap after tap, each tap's panels as `pack` lays out the
    /// output channels by the input channels); `None` elsewhere.
    pub(crate) fn panels_cpu(&self, values: &[f32]) -> Option<Vec<f32>> {
        self.direct()?;
        let k = self.col_rows();
        let (oc, w) = (
            self.out_channels,
            values.get(..self.out_channels.checked_mul(k)?)?,
        );
        let merged = self.merged_groups();
        if merged == 1 {
            let panels = direct::pack(w, oc, k, k);
            if self.live_taps().is_none() {
                return Some(panels);
            }
            // Each tap's weights side by side, so that a run reads only the live taps' and
            // copies nothing (DeepLabV3's 960 -> 256 dilated 12 copied all nine taps' rows
            // out of the panels on every run, 9 MB).
            let taps = self.kernel[0] * self.kernel[1];
            let part = direct::panels_len(oc, k / taps);
            let mut by_tap = vec![0.0; taps * part];
            for (tap, out) in by_tap.chunks_exact_mut(part).enumerate() {
                direct::tap_panels(&panels, [oc, k / taps, taps], tap, out);
            }
            return Some(by_tap);
        }
        // Output channel o, of group o / og, reads the k columns of its group's place in the
        // merged group's inner dimension; the others stay zero. (The groups it runs only.)
        let og = self.out_channels / self.groups;
        let (oc, wide) = (self.direct_groups() * og, merged * k);
        let mut rows = vec![0.0; oc * wide];
        for (o, (row, w)) in rows.chunks_mut(wide).zip(w.chunks(k)).enumerate() {
            let at = (o / og) % merged * k;
            row[at..at + k].copy_from_slice(w);
        }
        Some(direct::pack(&rows, oc, wide, wide))
    }

    /// Pad every input plane of image `x` (`[c, h, w]`) into `planes` (one
    /// [`Windows::scratch_len`] each): each element plus its channel's `in_bias`, then
    /// `pre_act`, the padding zero; the planes in parallel where they are large.
    fn pad_planes(&self, x: &[f32], in_bias: Option<&[f32]>, planes: &mut [f32]) {
        let win = self.windows();
        let [_, c, h, w] = self.input;
        let plane = win.scratch_len();
        for_planes(&mut planes[..c * plane], plane, plane, |ci, buf| {
            let xc = &x[ci * h * w..(ci + 1) * h * w];
            window::pad_input(&win, xc, in_bias.map(|b| b[ci]), self.pre_act, buf)
        });
    }

    /// Fill `col` (`col_rows x cols.len()`, row-major) with the columns `cols` of the im2col
    /// matrix of group `g`, from the image's padded planes ([`Conv::pad_planes`]): row `r` is
    /// tap `r % (kh * kw)` of channel `r / (kh * kw)` of the group, column `j` output pixel
    /// `j`; each output row's part one copy of a tap's run.
    fn im2col(&self, planes: &[f32], g: usize, cols: Range<usize>, col: &mut [f32]) {
        let win = self.windows();
        let Taps { starts, step } = win.taps();
        let plane = win.scratch_len();
        let ow = self.out_hw[1];
        let cg = self.input[1] / self.groups;
        let width = cols.len();
        for (r, row) in col.chunks_mut(width).take(self.col_rows()).enumerate() {
            let ci = g * cg + r / starts.len();
            let base = ci * plane + starts[r % starts.len()];
            let mut j = cols.start;
            while j < cols.end {
                // One output row's run of columns [j0, j1).
                let (i, j0) = (j / ow, j % ow);
                let j1 = ow.min(j0 + (cols.end - j));
                let src = base + i * step + j0;
                let at = j - cols.start;
                row[at..at + (j1 - j0)].copy_from_slice(&planes[src..src + (j1 - j0)]);
                j += j1 - j0;
            }
        }
    }

    /// `y_g = w_g * col` for the output rows `rows` of group `g`, into `y` (those rows), then
    /// bias and activation on them.
    fn product(
        &self,
        w: &[f32],
        bias: Option<&[f32]>,
        g: usize,
        col: Mat<'_>,
        rows: Range<usize>,
        y: &mut [f32],
    ) -> Result<(), GpuError> {
        let k = self.col_rows();
        let cols = self.out_hw[0] * self.out_hw[1];
        let og = self.out_channels / self.groups;
        let r0 = g * og + rows.start;
        let m = rows.len();
        sgemm_short(Mat::row_major(&w[r0 * k..(r0 + m) * k], m, k), col, y)?;
        if cols == 1 {
            // A 1x1 plane (a squeeze-and-excitation's layers): one pass over the column, not a
            // call per element (EfficientNet-B0's 48 -> 1152 and its sigmoid 34 -> 20 us;
            // its 16 blocks' excitations 0.27 -> 0.16 ms on one thread).
            bias_act_each(&mut y[..m], bias.map(|b| &b[r0..r0 + m]), self.act);
            return Ok(());
        }
        for (i, row) in y.chunks_mut(cols).enumerate() {
            bias_act_row(row, bias.map(|b| b[r0 + i]), self.act);
        }
        Ok(())
    }

    /// Image `xb`'s output `yb` for a convolution without groups: the product split into
    /// column tiles (each task writes its own im2col block: nothing of B is packed twice) when
    /// the output has more pixels than channels, else into blocks of output rows over one
    /// im2col matrix (small: deep layers have few pixels).
    ///
    /// `planes` holds the image's padded planes ([`Conv::pad_planes`]; unused by a pointwise
    /// convolution, which reads `xb` in place), `col` room for the whole im2col matrix where
    /// the output has fewer pixels than channels.
    fn run_image(
        &self,
        w: &[f32],
        bias: Option<&[f32]>,
        xb: &[f32],
        planes: &[f32],
        col: &mut [f32],
        yb: &mut [f32],
    ) -> Result<(), GpuError> {
        let (m, k, n) = (
            self.out_channels,
            self.col_rows(),
            self.out_hw[0] * self.out_hw[1],
        );
        let threads = rayon::current_num_threads();
        let big = m * k * n >= 1 << 20;
        if n >= m {
            // Tiles: at least one per thread when the work is worth splitting, and B's block
            // within 256 KiB (it is packed and reused while in cache); whole rounds of tasks.
            let tasks = if big {
                let by_cache = (k * n * 4).div_ceil(256 << 10);
                by_cache.max(threads).div_ceil(threads) * threads
            } else {
                1
            };
            let a = Mat::row_major(&w[..m * k], m, k);
            let epilogue =
                |r: usize, part: &mut [f32]| bias_act_row(part, bias.map(|b| b[r]), self.act);
            return if self.is_pointwise() {
                let b = TilesOfB::<fn(Range<usize>, &mut [f32])>::View(Mat::row_major(xb, k, n));
                sgemm_column_tiles(a, n, yb, tasks, b, epilogue)
            } else {
                let fill =
                    |cols: Range<usize>, block: &mut [f32]| self.im2col(planes, 0, cols, block);
                sgemm_column_tiles(a, n, yb, tasks, TilesOfB::Fill(fill), epilogue)
            };
        }
        let tasks = if big { (2 * threads).min(m) } else { 1 };
        let rows_per = m.div_ceil(tasks.max(1));
        let mut blocks = |col: Mat<'_>| {
            yb.par_chunks_mut(rows_per * n)
                .enumerate()
                .try_for_each(|(t, chunk)| {
                    let r0 = t * rows_per;
                    self.product(w, bias, 0, col, r0..r0 + chunk.len() / n, chunk)
                })
        };
        if self.is_pointwise() {
            blocks(Mat::row_major(xb, k, n))
        } else {
            let col = &mut col[..k * n];
            self.im2col(planes, 0, 0..n, col);
            blocks(Mat::row_major(col, k, n))
        }
    }
}

impl StepKernel for Conv {
    fn kind(&self) -> &'static str {
        "conv"
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        let name = match self.nhwc {
            true => "depthwise_conv_nhwc",
            false => "depthwise_conv",
        };
        (self.is_depthwise() && self.residual.is_none()).then_some(name)
    }

    /// Our depthwise kernel does everything; cuDNN's convolution runs its bias + relu (and
    /// residual) in its fused call, any other epilogue in our kernel after it. (Where the fused
    /// call measured slower than the two, one more; where a bias alone measured faster fused,
    /// one less.)
    fn kernels(&self) -> u32 {
        if self.nvrtc_kernel().is_some() {
            return 1;
        }
        let epilogue =
            self.bias.is_some() || self.act != Activation::None || self.residual.is_some();
        1 + u32::from(epilogue && self.act != Activation::Relu)
    }

    fn access(&self) -> Access {
        let mut reads = vec![
            (self.x, self.input.iter().product()),
            (self.w, self.out_channels * self.col_rows()),
        ];
        reads.extend(self.bias.map(|b| (b, self.out_channels)));
        reads.extend(self.in_bias.map(|b| (b, self.input[1])));
        let input: usize = self.input.iter().product();
        reads.extend(self.sum_with.iter().map(|&b| (b, input)));
        reads.extend(self.residual.map(|z| (z, self.out_len())));
        Access {
            reads,
            writes: vec![(self.y, self.out_len())],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        self.run_cpu_packed(io, None)
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        if self.is_depthwise() && self.residual.is_none() {
            return Ok(Box::new(CudaDepthwise::new(self, cx)?.measured(cx)?));
        }
        if self.pre_act != Activation::None || self.in_bias.is_some() || !self.sum_with.is_empty() {
            return Err(cx.no_kernel(
                "an input activation, bias or sum of a convolution that is not depthwise",
            ));
        }
        let (x, y) = (cx.strided(self.x)?, cx.strided(self.y)?);
        if x.1.is_none() && y.1.is_none() {
            return Ok(Box::new(self.prepare_at(x, y, cx)?));
        }
        match self.prepare_at(x, y, cx) {
            Ok(plan) => Ok(Box::new(plan)),
            // cuDNN refused a strided input or output (a merged convolution's member, a slice
            // of a concatenation): the convolution reads and writes dense buffers of its own,
            // copied from and into the views (what copies did before the views).
            Err(e) => {
                tracing::warn!(
                    "a convolution with a strided input or output ({e}): it reads and writes \
                     buffers of its own, copied from and into the views"
                );
                let held = |len: usize, cx: &PrepareCx<'_>| -> Result<_, GpuError> {
                    let buf = cx.gpu.zeros(len)?;
                    let (p, _) = buf.device_ptr(&cx.gpu.alloc_stream);
                    Ok((p, buf))
                };
                let (in_len, out_len) = (self.input.iter().product(), self.out_len());
                let (mut pre, mut post) = (None, None);
                let xd = match x.1 {
                    None => x.0,
                    Some(runs) => {
                        let (p, buf) = held(in_len, cx)?;
                        pre = Some((super::copy::from_runs(x.0, p, in_len, runs), buf));
                        p
                    }
                };
                let yd = match y.1 {
                    None => y.0,
                    Some(runs) => {
                        let (p, buf) = held(out_len, cx)?;
                        post = Some((super::copy::into_runs(p, y.0, out_len, runs), buf));
                        p
                    }
                };
                let mut plan = self.prepare_at((xd, None), (yd, None), cx)?;
                plan.pre_copy = pre;
                plan.post_copy = post;
                Ok(Box::new(plan))
            }
        }
    }
}

impl Conv {
    /// [`StepKernel::run_cpu`], the weights read from `panels` where the direct convolution
    /// runs and they are given ([`Conv::panels_cpu`]).
    pub(crate) fn run_cpu_packed(
        &self,
        io: &mut CpuIo<'_>,
        panels: Option<&[f32]>,
    ) -> Result<(), GpuError> {
        if let Some(z) = self.residual {
            // The convolution and its bias, then `act(y + z)` in one more pass.
            let plain = Conv {
                act: Activation::None,
                residual: None,
                ..self.clone()
            };
            plain.run_cpu_packed(io, panels)?;
            let n = self.out_len();
            let z = &io.read(z)?[..n];
            let y = &mut io.write(self.y)?[..n];
            let a = self.act;
            y.par_chunks_mut(1 << 14)
                .zip(z.par_chunks(1 << 14))
                .for_each(|(y, z)| act_add(y, z, a));
            return Ok(());
        }
        let x = io.read(self.x)?;
        // The sum it reads, in storage order (any layout), where it reads one.
        let summed: Vec<f32>;
        let x = match self.sum_with.as_slice() {
            [] => x,
            more => {
                let len: usize = self.input.iter().product();
                let mut v = x[..len].to_vec();
                for &b in more {
                    let src = &io.read(b)?[..len];
                    v.iter_mut().zip(src).for_each(|(a, s)| *a += s);
                }
                summed = v;
                &summed[..]
            }
        };
        let w = io.read(self.w)?;
        let bias = self.bias.map(|b| io.read(b)).transpose()?;
        let in_bias = self.in_bias.map(|b| io.read(b)).transpose()?;
        let y = io.write(self.y)?;
        if self.out_len() == 0 {
            return Ok(());
        }
        if self.nhwc {
            let out = [
                self.input[0],
                self.out_channels,
                self.out_hw[0],
                self.out_hw[1],
            ];
            return crate::program::through_nchw(x, self.input, y, out, |x, y| {
                self.compute(x, w, panels, bias, in_bias, y)
            });
        }
        self.compute(x, w, panels, bias, in_bias, y)
    }

    /// The convolution of NCHW `x` (plus `in_bias` per channel, [`Conv::in_bias`]) into NCHW
    /// `y`, with its bias and activation.
    fn compute(
        &self,
        x: &[f32],
        w: &[f32],
        panels: Option<&[f32]>,
        bias: Option<&[f32]>,
        in_bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<(), GpuError> {
        let [n, c, h, wd] = self.input;
        let cols = self.out_hw[0] * self.out_hw[1];
        let og = self.out_channels / self.groups;
        let (xlen, ylen) = (c * h * wd, self.out_channels * cols);
        if c == self.groups {
            return self.depthwise(x, w, bias, in_bias, y);
        }
        if let Some(sub) = self.subsampled() {
            // A pointwise convolution of stride two or more: its input's pixels it reads
            // gathered into scratch (plus `in_bias`, through `pre_act`), then the pointwise
            // convolution of those, read in place.
            let [oh, ow] = self.out_hw;
            return with_scratch(c * oh * ow, |xs| {
                for b in 0..n {
                    let xb = &x[b * xlen..(b + 1) * xlen];
                    self.subsample(xb, in_bias, xs);
                    let yb = &mut y[b * ylen..(b + 1) * ylen];
                    sub.compute(xs, w, panels, bias, None, yb)?;
                }
                Ok(())
            });
        }
        let direct = self.direct();
        // The weights repacked for it, where the device has not done so once for all runs
        // (weights it does not know constant).
        let repacked: Vec<f32>;
        let panels = match (&direct, panels) {
            (Some(_), None) => {
                repacked = self.panels_cpu(w).ok_or_else(|| {
                    GpuError::Plan("convolution weights shorter than their shape".into())
                })?;
                Some(&repacked[..])
            }
            (_, panels) => panels,
        };
        if let Some(regions) = self.live_taps() {
            for b in 0..n {
                let (xb, yb) = (
                    &x[b * xlen..(b + 1) * xlen],
                    &mut y[b * ylen..(b + 1) * ylen],
                );
                self.sum_of_taps(&regions, xb, w, panels, bias, in_bias, yb)?;
            }
            return Ok(());
        }
        // The padded planes of an image (but where the product reads it in place) and, where
        // the output has fewer pixels than channels, its whole im2col matrix: in this
        // thread's scratch, kept between runs.
        let k = self.col_rows();
        // A pointwise convolution reads its input in place, as a product's B or as the direct
        // convolution's planes.
        let pointwise = self.groups == 1 && self.is_pointwise();
        let padded = if pointwise {
            0
        } else {
            c * self.windows().scratch_len()
        };
        let whole =
            if self.groups == 1 && !pointwise && direct.is_none() && cols < self.out_channels {
                k * cols
            } else {
                0
            };
        with_scratch(padded + whole, |scratch| {
            let (planes, col) = scratch.split_at_mut(padded);
            for b in 0..n {
                let xb = &x[b * xlen..(b + 1) * xlen];
                let yb = &mut y[b * ylen..(b + 1) * ylen];
                if !pointwise {
                    self.pad_planes(xb, in_bias, planes);
                }
                // The groups left to im2col, from `first` on (all but where the direct
                // convolution runs).
                let mut first = 0;
                if let (Some(d), Some(panels)) = (&direct, panels) {
                    let planes = if pointwise { xb } else { &*planes };
                    let groups = self.direct_groups();
                    let y_direct = &mut yb[..groups * og * cols];
                    let bias = bias.map(|b| &b[..groups * og]);
                    let runs = groups / self.merged_groups();
                    d.convolve_groups(runs, planes, panels, bias, self.act, y_direct)?;
                    first = groups;
                    if first == self.groups {
                        continue;
                    }
                }
                if self.groups == 1 {
                    self.run_image(w, bias, xb, planes, col, yb)?;
                    continue;
                }
                let planes = &*planes;
                yb[first * og * cols..]
                    .par_chunks_mut(og * cols)
                    .enumerate()
                    .map(|(g, chunk)| (first + g, chunk))
                    .try_for_each(|(g, chunk)| {
                        with_scratch(k * cols, |col| {
                            self.im2col(planes, g, 0..cols, col);
                            let col = Mat::row_major(col, k, cols);
                            self.product(w, bias, g, col, 0..og, chunk)
                        })
                    })?;
            }
            Ok(())
        })
    }

    /// [`Conv::compute`] where every group reads one input channel (depthwise, with any
    /// number of filters per channel), the planes in parallel: with one filter each, an input
    /// taken as it is and a window [`depthwise::unpadded`] runs, straight from the input;
    /// otherwise each input plane padded once (its bias and activation applied), then
    /// convolved with its group's filters by sliding windows (`crate::cpu::window`).
    fn depthwise(
        &self,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        in_bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<(), GpuError> {
        let [_, c, h, wd] = self.input;
        let win = self.windows();
        let og = self.out_channels / self.groups;
        let (taps, cols) = (
            self.kernel[0] * self.kernel[1],
            self.out_hw[0] * self.out_hw[1],
        );
        let plain_input = in_bias.is_none() && self.pre_act == Activation::None;
        if og == 1 && plain_input && depthwise::unpadded_suits(&win) {
            return self.depthwise_unpadded(&win, x, w, bias, None, y);
        }
        // An input bias alone (ConvNeXt's downsampling leaves its bias here) where the
        // streamed kernel takes it as it loads.
        let biased = og == 1 && self.pre_act == Activation::None && depthwise::streams(&win);
        if let Some(in_bias) = in_bias.filter(|_| biased) {
            return self.depthwise_unpadded(&win, x, w, bias, Some(in_bias), y);
        }
        if let Some(phase) = self.dilated_phases().filter(|_| og == 1 && plain_input) {
            return self.depthwise_phases(&phase, x, w, bias, y);
        }
        if og == 1 && lanes::suits(&win) {
            return self.depthwise_lanes(&win, x, w, bias, in_bias, y);
        }
        let work = win.scratch_len() + og * cols * taps;
        if og == 1 && depthwise::suits(&win) {
            // Stride one: a group's planes padded side by side, their sums in one call, then
            // bias and activation over the group (a call per plane cost as much as a 7x7
            // plane's sums).
            let pl = win.scratch_len();
            for_plane_groups(y, cols, work, |first, ys| {
                let n = ys.len() / cols;
                with_scratch(n * (pl + taps + 1), |scratch| {
                    let (bufs, rest) = scratch.split_at_mut(n * pl);
                    let (ws, bs) = rest.split_at_mut(n * taps);
                    for (p, buf) in bufs.chunks_mut(pl).enumerate() {
                        // Image t / c, channel t % c.
                        let (t, ch) = (first + p, (first + p) % c);
                        let plane = &x[t * h * wd..(t + 1) * h * wd];
                        window::pad_input(&win, plane, in_bias.map(|b| b[ch]), self.pre_act, buf);
                        ws[p * taps..(p + 1) * taps]
                            .copy_from_slice(&w[ch * taps..(ch + 1) * taps]);
                        bs[p] = bias.map_or(0.0, |b| b[ch]);
                    }
                    if depthwise::sums(&win, bufs, pl, ws, ys) {
                        apply_bias_act(ys, Some(&bs[..n]), n, cols, self.act);
                        return;
                    }
                    // (Not reached: the planes were padded for it.) Plane by plane.
                    let reads = win.taps();
                    let planes = ys
                        .chunks_mut(cols)
                        .zip(bufs.chunks(pl))
                        .zip(ws.chunks(taps));
                    for (p, ((yp, buf), wp)) in planes.enumerate() {
                        win.convolve(&reads, buf, wp, Some(&bs[p..=p]), self.act, yp);
                    }
                })
            });
            return Ok(());
        }
        let reads = win.taps();
        for_planes(y, og * cols, work, |t, planes| {
            // Image t / c, channel t % c: the group's input plane and filters.
            let ch = t % c;
            let plane = &x[t * h * wd..(t + 1) * h * wd];
            with_scratch(win.scratch_len(), |buf| {
                window::pad_input(&win, plane, in_bias.map(|b| b[ch]), self.pre_act, buf);
                let filters = &w[ch * og * taps..(ch + 1) * og * taps];
                let bias = bias.map(|b| &b[ch * og..(ch + 1) * og]);
                win.convolve(&reads, buf, filters, bias, self.act, planes);
            })
        });
        Ok(())
    }

    /// Where the windows read mostly padding (at most [`LIVE_TAPS`] of the (tap, output pixel)
    /// pairs read the input: DeepLab's atrous convolutions, dilated 12 to 36 on a 14x14 map),
    /// each tap's output pixels that read the input, a rectangle per tap (none for a tap that
    /// reads only padding), for [`Conv::sum_of_taps`]; `None` elsewhere.
    fn live_taps(&self) -> Option<Vec<TapRegion>> {
        if self.groups != 1 {
            return None;
        }
        // Output rows (axis 0) or columns (1) whose input row or column under tap `t` lies
        // inside the input.
        let live = |axis: usize, t: usize| {
            let (n, out, s) = (self.input[2 + axis], self.out_hw[axis], self.stride[axis]);
            let off = (t * self.dilation[axis]) as isize - self.padding[axis] as isize;
            let first = if off < 0 { (-off) as usize } else { 0 }.div_ceil(s);
            let end = (n as isize - off).max(0) as usize;
            first.min(out)..end.div_ceil(s).min(out)
        };
        let regions: Vec<TapRegion> = (0..self.kernel[0])
            .flat_map(|i| (0..self.kernel[1]).map(move |j| (i, j)))
            .map(|(i, j)| TapRegion {
                tap: [i, j],
                rows: live(0, i),
                cols: live(1, j),
            })
            .filter(|r| r.pixels() > 0)
            .collect();
        let read: usize = regions.iter().map(TapRegion::pixels).sum();
        let all = self.kernel[0] * self.kernel[1] * self.out_hw[0] * self.out_hw[1];
        (read as f64 <= LIVE_TAPS * all as f64).then_some(regions)
    }

    /// Image `x`'s convolution (one group) as the sum over its taps of one product each, over
    /// only the output pixels where the tap reads the input (`regions`, [`Conv::live_taps`]):
    /// the input under each tap gathered (plus `in_bias`, through `pre_act`), then `y +=
    /// w[:, :, i, j] * gathered` tap after tap, the bias and the activation last. Where the
    /// weights are repacked for the direct tiles (`panels`), each tap's rows of them are
    /// copied side by side and multiplied by its region in the tiles
    /// ([`direct::product_rows`]); else per block of output channels by `sgemm`, reading the
    /// tap's weights where they lie, `taps` apart. Blocks and tiles of fixed sizes, so the bits
    /// do not depend on the threads.
    ///
    /// DeepLabV3's three atrous convolutions of 960 -> 256 channels on 14x14 (dilated 12, 24
    /// and 36), one thread, in the model, three processes of each build alternated (Zen 5,
    /// 2026-11-29): 2.70, 1.06 and 1.03 ms by `sgemm` (whose packing of the weights as they
    /// lie read every line of all nine taps' for the one live tap of the last two), 2.05,
    /// 0.78 and 0.75 in the tiles; 1.26, 0.62 and 0.64 with each tap's panels side by side
    /// (2026-11-29, where a run had copied every tap's rows out of the panels; the whole
    /// model 10.95 -> 9.75 ms on one thread, 6.12 -> 5.42 on two).
    #[allow(clippy::too_many_arguments)]
    fn sum_of_taps(
        &self,
        regions: &[TapRegion],
        x: &[f32],
        w: &[f32],
        panels: Option<&[f32]>,
        bias: Option<&[f32]>,
        in_bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<(), GpuError> {
        let [_, c, h, wd] = self.input;
        let [oh, ow] = self.out_hw;
        let taps = self.kernel[0] * self.kernel[1];
        // Where each region's pixels start in a channel's row of the gathered input.
        let starts: Vec<usize> = regions
            .iter()
            .scan(0, |at, r| {
                let start = *at;
                *at += r.pixels();
                Some(start)
            })
            .collect();
        let total: usize = regions.iter().map(TapRegion::pixels).sum();
        with_scratch(c * total, |gathered| {
            // Channel after channel (in parallel): its input under every tap, region after
            // region, so that a region is a `c x pixels` matrix with rows `total` apart.
            let gather = |(ch, row): (usize, &mut [f32])| {
                let plane = &x[ch * h * wd..(ch + 1) * h * wd];
                let add = in_bias.map_or(0.0, |b| b[ch]);
                let gather_row = || {
                    with_act!(
                        self.pre_act,
                        |f| for (r, &start) in regions.iter().zip(&starts) {
                            let mut out = row[start..start + r.pixels()].iter_mut();
                            for oy in r.rows.clone() {
                                let iy = oy * self.stride[0] + r.tap[0] * self.dilation[0]
                                    - self.padding[0];
                                for ox in r.cols.clone() {
                                    let ix = ox * self.stride[1] + r.tap[1] * self.dilation[1]
                                        - self.padding[1];
                                    if let Some(v) = out.next() {
                                        *v = f(plane[iy * wd + ix] + add);
                                    }
                                }
                            }
                        }
                    )
                };
                with_avx2(gather_row)
            };
            gathered
                .par_chunks_mut(total.max(1))
                .enumerate()
                .for_each(gather);
            let gathered = &*gathered;
            let pixels = oh * ow;
            if let Some(panels) = panels {
                let parts = (regions, &starts[..], total);
                return self.sum_of_taps_direct(parts, gathered, panels, bias, y);
            }
            let (k, block) = (c * taps, TAP_BLOCK);
            y.par_chunks_mut(block * pixels)
                .enumerate()
                .try_for_each(|(bi, ys)| {
                    let o0 = bi * block;
                    let rows = ys.len() / pixels;
                    ys.fill(0.0);
                    for (r, &start) in regions.iter().zip(&starts) {
                        let n = r.pixels();
                        let tap = r.tap[0] * self.kernel[1] + r.tap[1];
                        let a = Mat::strided(&w[o0 * k + tap..], rows, c, k, taps);
                        let b = Mat::strided(&gathered[start..], c, n, total, 1);
                        with_scratch(rows * n, |prod| {
                            sgemm(a, b, prod)?;
                            for (plane, part) in ys.chunks_mut(pixels).zip(prod.chunks(n)) {
                                let width = r.cols.len();
                                for (oy, src) in r.rows.clone().zip(part.chunks(width)) {
                                    let dst = &mut plane[oy * ow + r.cols.start..][..width];
                                    dst.iter_mut().zip(src).for_each(|(v, &p)| *v += p);
                                }
                            }
                            Ok::<_, GpuError>(())
                        })?;
                    }
                    for (o, plane) in ys.chunks_mut(pixels).enumerate() {
                        bias_act_row(plane, bias.map(|b| b[o0 + o]), self.act);
                    }
                    Ok(())
                })
        })
    }

    /// [`Conv::sum_of_taps`] in the direct tiles: `gathered` holds the input under every tap
    /// (each channel's row `total` long, region `regions[r]` from `starts[r]` on), `panels`
    /// the weights [`direct::pack`]ed tap after tap ([`Conv::panels_cpu`]). Each output adds
    /// its taps' products in the regions' order, from zero, then its bias and the activation.
    fn sum_of_taps_direct(
        &self,
        (regions, starts, total): (&[TapRegion], &[usize], usize),
        gathered: &[f32],
        panels: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<(), GpuError> {
        let c = self.input[1];
        let (oc, taps) = (self.out_channels, self.kernel[0] * self.kernel[1]);
        let [oh, ow] = self.out_hw;
        let pixels = oh * ow;
        let (shaped, part) = (
            gathered.len() >= c * total && y.len() >= oc * pixels,
            direct::panels_len(oc, c),
        );
        if !shaped || panels.len() != taps * part {
            return Err(GpuError::Plan(format!(
                "a sum over taps of {oc}x{c}x{taps} over {oh}x{ow}: a buffer is not of its shape"
            )));
        }
        let y = &mut y[..oc * pixels];
        y.fill(0.0);
        let out = SharedOut(y.as_mut_ptr());
        for (r, &start) in regions.iter().zip(starts) {
            let tap = r.tap[0] * self.kernel[1] + r.tap[1];
            let tap_panels = &panels[tap * part..(tap + 1) * part];
            let width = r.cols.len();
            // Each column's sums into its output pixel of every channel of the panel.
            let add = |b: usize, qs: Range<usize>, sums: &[f32]| {
                let channels = b * direct::LANES..((b + 1) * direct::LANES).min(oc);
                for (q, s) in qs.zip(sums.chunks_exact(direct::LANES)) {
                    let at = (r.rows.start + q / width) * ow + r.cols.start + q % width;
                    for (o, &v) in channels.clone().zip(s) {
                        // SAFETY: o < oc and at < pixels (the region lies in the output),
                        // inside y (checked above); each (panel, column) is added by one
                        // task, and no other reference to y is live meanwhile.
                        unsafe { *out.at(o * pixels + at) += v };
                    }
                }
            };
            let region = &gathered[start..];
            direct::product_rows(tap_panels, [oc, c, r.pixels()], region, total, add)?;
        }
        y.par_chunks_mut(pixels)
            .enumerate()
            .for_each(|(o, plane)| bias_act_row(plane, bias.map(|b| b[o]), self.act));
        Ok(())
    }

    /// [`Conv::depthwise`] with one filter per channel, stride one or two and an input taken
    /// as it is (no bias left to it, no activation): straight from its planes
    /// ([`depthwise::unpadded`]), or with `in_bias` (only) left to it where the streamed
    /// kernel adds it as it loads ([`depthwise::unpadded_biased`]: ConvNeXt's first block of
    /// each stage); image by image, a group of channels per call
    /// ([`try_plane_groups`]; a call per plane cost as much as a 7x7 plane's sums).
    fn depthwise_unpadded(
        &self,
        win: &Windows,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        in_bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<(), GpuError> {
        let [_, _, h, wd] = self.input;
        let (taps, cols, hw) = (
            win.kernel[0] * win.kernel[1],
            win.out[0] * win.out[1],
            h * wd,
        );
        self.depthwise_groups(win, x, y, |xb, first, ys| {
            let end = first + ys.len() / cols;
            let (xs, ws) = (&xb[first * hw..end * hw], &w[first * taps..end * taps]);
            let bs = bias.map(|b| &b[first..end]);
            match in_bias {
                Some(ib) => {
                    depthwise::unpadded_biased(win, xs, ws, bs, &ib[first..end], self.act, ys)
                }
                None => depthwise::unpadded(win, xs, ws, bs, self.act, ys),
            }
        })
    }

    /// A depthwise convolution's output planes image by image, in groups of channels in
    /// parallel ([`try_plane_groups`], sized by each output plane's work; a call per plane
    /// cost as much as a 7x7 plane's sums): `f(image's input, first channel, its planes)`,
    /// which returns whether its kernel took them (an error naming the kernel's windows `win`
    /// where it did not).
    fn depthwise_groups(
        &self,
        win: &Windows,
        x: &[f32],
        y: &mut [f32],
        f: impl Fn(&[f32], usize, &mut [f32]) -> bool + Sync + Send,
    ) -> Result<(), GpuError> {
        let [_, c, h, wd] = self.input;
        let (taps, cols, hw) = (
            self.kernel[0] * self.kernel[1],
            self.out_hw[0] * self.out_hw[1],
            h * wd,
        );
        let mut taken = true;
        for (xb, yb) in x.chunks(c * hw).zip(y.chunks_mut(c * cols)) {
            taken &= try_plane_groups(yb, cols, hw + cols * taps, |first, ys| f(xb, first, ys));
        }
        match taken {
            true => Ok(()),
            // (Not reached: the kernel's `unpadded_suits` held and the slices fit their shapes.)
            false => Err(GpuError::Plan(format!(
                "the depthwise kernel refused {win:?} of input {:?}",
                self.input
            ))),
        }
    }

    /// A depthwise convolution dilated `d` at stride one whose sizes and padding `d` divides,
    /// on planes larger than [`depthwise::unpadded`] takes dilated (MobileNetV3's last stages
    /// in DeepLabV3 and LR-ASPP, 5x5 dilated 2 on 14x14, are summed dilated in lanes): the
    /// windows of one of its `d * d` phases (every `d`th row from row `a`, every `d`th column
    /// from column `b`), where [`depthwise::unpadded`] takes them; `None` elsewhere. Output
    /// pixel `(d i + a, d j + b)` reads only phase `(a, b)` of the input, at `(i, j)` plus
    /// the window undilated, so each phase is an undilated convolution of its own.
    fn dilated_phases(&self) -> Option<Windows> {
        let win = self.windows();
        let [d, e] = win.dilation;
        let divides = |v: [usize; 2]| v.iter().all(|&v| v % d == 0);
        let fits = d == e
            && d > 1
            && win.stride == [1, 1]
            && divides(win.input)
            && divides(win.padding)
            && divides(win.out);
        if !fits {
            return None;
        }
        let phase = Windows {
            input: win.input.map(|v| v / d),
            padding: win.padding.map(|v| v / d),
            out: win.out.map(|v| v / d),
            dilation: [1, 1],
            ..win
        };
        depthwise::unpadded_suits(&phase).then_some(phase)
    }

    /// [`Conv::depthwise`] dilated, phase by phase ([`Conv::dilated_phases`]): a group of
    /// channels' planes split into their phases (each phase a plane of its own, with its
    /// channel's filter and bias), convolved undilated by [`depthwise::unpadded`], and the
    /// phases' outputs woven back. LR-ASPP's three 5x5 dilated 2 on 14x14 (672 and 960
    /// channels), one thread, in the model, three processes of each build alternated (Zen 5,
    /// 2026-11-29): 0.29, 0.42 and 0.41 ms by the window loops over padded planes, 0.24, 0.34
    /// and 0.34 phase by phase (the split and the weave cost about as much as the sums of
    /// the 7x7 phases; since summed dilated in lanes, which took DeepLabV3's alike from 0.25
    /// to 0.13 ms).
    fn depthwise_phases(
        &self,
        phase: &Windows,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<(), GpuError> {
        let [_, _, h, wd] = self.input;
        let d = self.dilation[0];
        let [oh, ow] = self.out_hw;
        let (taps, phases) = (self.kernel[0] * self.kernel[1], d * d);
        let (hw, cols) = (h * wd, oh * ow);
        self.depthwise_groups(phase, x, y, |xb, first, ys| {
            let n = ys.len() / cols;
            let sizes = [n * hw, n * cols, n * phases * taps, n * phases];
            with_scratch(sizes.iter().sum(), |scratch| {
                let (xs, rest) = scratch.split_at_mut(sizes[0]);
                let (outs, rest) = rest.split_at_mut(sizes[1]);
                let (ws, bs) = rest.split_at_mut(sizes[2]);
                // Plane p's phase (a, b) is plane p * phases + a * d + b, with its channel's
                // filter and bias.
                for p in 0..n {
                    let ch = first + p;
                    let plane = &xb[ch * hw..(ch + 1) * hw];
                    split_phases(plane, [h, wd], d, &mut xs[p * hw..(p + 1) * hw]);
                    for f in p * phases..(p + 1) * phases {
                        ws[f * taps..(f + 1) * taps]
                            .copy_from_slice(&w[ch * taps..(ch + 1) * taps]);
                        bs[f] = bias.map_or(0.0, |b| b[ch]);
                    }
                }
                let bias = bias.map(|_| &*bs);
                if !depthwise::unpadded(phase, xs, ws, bias, self.act, outs) {
                    return false;
                }
                for (p, yp) in ys.chunks_mut(cols).enumerate() {
                    weave_phases(&outs[p * cols..(p + 1) * cols], [oh, ow], d, yp);
                }
                true
            })
        })
    }

    /// [`Conv::depthwise`] with one filter per channel on small planes: [`lanes::LANES`]
    /// planes at a time, interleaved ([`lanes::depthwise`]), groups of them in tasks
    /// ([`for_planes`]).
    fn depthwise_lanes(
        &self,
        win: &Windows,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        in_bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<(), GpuError> {
        use lanes::LANES;
        let [_, c, h, wd] = self.input;
        let (taps, cols) = (
            self.kernel[0] * self.kernel[1],
            self.out_hw[0] * self.out_hw[1],
        );
        let scratch = lanes::scratch_len(win);
        let work = LANES * (cols * taps + h * wd);
        for_planes(y, LANES * cols, work, |g, yg| {
            // Planes t0.. of the batch: image t / c, channel t % c.
            let (t0, n) = (g * LANES, yg.len() / cols);
            let mut xs: [&[f32]; LANES] = [&[]; LANES];
            let mut fs: [&[f32]; LANES] = [&[]; LANES];
            let (mut bs, mut ibs) = ([0.0f32; LANES], [0.0f32; LANES]);
            for l in 0..n {
                let (t, ch) = (t0 + l, (t0 + l) % c);
                xs[l] = &x[t * h * wd..(t + 1) * h * wd];
                fs[l] = &w[ch * taps..(ch + 1) * taps];
                bs[l] = bias.map_or(0.0, |b| b[ch]);
                ibs[l] = in_bias.map_or(0.0, |b| b[ch]);
            }
            with_scratch(scratch, |buf| {
                let (xs, fs) = (&xs[..n], &fs[..n]);
                lanes::depthwise(win, xs, fs, &bs, &ibs, self.pre_act, self.act, buf, yg)
            })
        });
        Ok(())
    }

    /// The convolution (not depthwise) reading `x` and writing `y` (each a pointer, and its
    /// runs where it is strided), padded as cuDNN requires.
    fn prepare_at(
        &self,
        x: (u64, Option<crate::program::Runs>),
        y: (u64, Option<crate::program::Runs>),
        cx: &mut PrepareCx<'_>,
    ) -> Result<CudaConv, GpuError> {
        if self.padding == self.padding_end {
            return prepare(self, x, y, cx);
        }
        if x.1.is_some() {
            return Err(cx.no_kernel("an explicit pad of a strided input"));
        }
        // cuDNN pads both sides alike: pad the difference explicitly into a buffer of the
        // prepared operator's own, then convolve with the common part.
        // The padded input is a buffer of the prepared operator's own, not of the program:
        // `inner` reads it through the pointer given to `prepare`, not through its `x`.
        let (pad, inner) = self.explicit_pad(usize::MAX);
        let out = pad.out_shape();
        let buf = cx.gpu.zeros(product(&out, "padded convolution input")?)?;
        let (bp, _) = buf.device_ptr(&cx.gpu.alloc_stream);
        let pad = super::pad::CudaPad::new(bp, x.0, &pad.shape, &out, &pad.begin, 0.0)
            .map_err(|e| e.unwrap_or_else(|| cx.no_kernel("a 4-D pad")))?;
        let mut plan = prepare(&inner, (bp, None), y, cx)?;
        plan.pre_pad = Some((pad, buf));
        Ok(plan)
    }
}

/// Plane `x` (`[h, w]`, both multiples of `d`) into its `d * d` phases, one after another in
/// `out`: phase `(a, b)` (every `d`th row from row `a`, every `d`th column from column `b`) is
/// the `a * d + b`th. Two columns at a time for `d` of two (a loop the compiler vectorises,
/// where a stepping iterator ran element by element).
fn split_phases(x: &[f32], [h, w]: [usize; 2], d: usize, out: &mut [f32]) {
    let (ph, pw) = (h / d, w / d);
    for (r, src) in x.chunks_exact(w).take(h).enumerate() {
        let (a, i) = (r % d, r / d);
        let at = |b: usize| ((a * d + b) * ph + i) * pw;
        if d == 2 {
            let (e, o) = (at(0), at(1));
            for (j, pair) in src.chunks_exact(2).enumerate() {
                out[e + j] = pair[0];
                out[o + j] = pair[1];
            }
            continue;
        }
        for (j, &v) in src.iter().enumerate() {
            out[at(j % d) + j / d] = v;
        }
    }
}

/// [`split_phases`]' inverse: the phases in `phases` (one after another) woven back into
/// plane `y` (`[h, w]`).
fn weave_phases(phases: &[f32], [h, w]: [usize; 2], d: usize, y: &mut [f32]) {
    let (ph, pw) = (h / d, w / d);
    for (r, dst) in y.chunks_exact_mut(w).take(h).enumerate() {
        let (a, i) = (r % d, r / d);
        let at = |b: usize| ((a * d + b) * ph + i) * pw;
        if d == 2 {
            let (e, o) = (&phases[at(0)..][..pw], &phases[at(1)..][..pw]);
            for ((pair, &ev), &od) in dst.chunks_exact_mut(2).zip(e).zip(o) {
                pair[0] = ev;
                pair[1] = od;
            }
            continue;
        }
        for (j, v) in dst.iter_mut().enumerate() {
            *v = phases[at(j % d) + j / d];
        }
    }
}

// --- CUDA --------------------------------------------------------------------------------

/// Weights `w` (dense in `dims`) permuted by `perm` once, at preparation, into a buffer the
/// prepared operator holds (the program keeps the weights as the IR has them): the filter of
/// a channels-last convolution (KRSC) or depthwise kernel (`[kh, kw, c]`). Its pointer, and
/// the buffer.
fn permuted_weights(
    w: BufId,
    dims: &[usize],
    perm: &[usize],
    cx: &PrepareCx<'_>,
) -> Result<(u64, CudaSlice<f32>), GpuError> {
    let held = cx.gpu.zeros(product(dims, "permuted weights")?)?;
    let (hp, _) = held.device_ptr(&cx.gpu.alloc_stream);
    let permute = super::transpose::permute(cx.ptr(w)?, hp, dims, perm)?;
    permute.enqueue(cx.gpu, cx.sc)?;
    cx.sc.synchronize()?;
    Ok((hp, held))
}

/// A depthwise convolution as our `depthwise_conv` kernel (`depthwise_conv_nhwc` channels
/// last): the input activation, the bias and the activation in one launch (cuDNN would take a
/// kernel before it for the first and one after it for the others; PyTorch runs depthwise
/// convolutions as such a kernel too).
struct CudaDepthwise {
    kernel: &'static str,
    y: u64,
    x: u64,
    /// `[c, kh, kw]`, or channels last `[kh, kw, c]` (permuted once into `_held_w`, so that
    /// neighbouring threads, neighbouring channels, read neighbouring weights).
    w: u64,
    _held_w: Option<CudaSlice<f32>>,
    bias: u64,
    /// Images times channels.
    nc: i64,
    c: i32,
    /// Elements between `x`'s images, and channels last between its pixels (a strided view's
    /// where it is one).
    ximage: i64,
    xpix: i32,
    /// h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw (the kernel's `Geo12`).
    geo: [i32; 12],
    pre: (i32, f32, f32),
    act: (i32, f32, f32),
    /// The bias added to what it reads (0: none).
    in_bias: u64,
    /// The device array of the further inputs it sums as it reads (kept alive with the
    /// operator), its pointer (0: none) and length.
    _more: Option<CudaSlice<u64>>,
    more: u64,
    nmore: i32,
    total: usize,
    /// Threads it launches: `total`, or one per `tiled` outputs with the tiled kernel.
    items: usize,
    /// Channels last, the channels of a pixel one aligned access wherever the kernel reads or
    /// writes them, 4 or 2 at a time (1: neither; `vector_width`): which tiled kernel by
    /// several channels may run (it checks the same itself).
    width: usize,
}

/// GPU runs per captured graph when timing a depthwise kernel.
const DEPTHWISE_TIMING_REPS: usize = 10;

impl CudaDepthwise {
    fn new(s: &Conv, cx: &PrepareCx<'_>) -> Result<CudaDepthwise, GpuError> {
        use crate::cuda::cudnn::{as_i64, c_int};
        let [n, c, h, w] = s.input;
        let (x, x_runs) = cx.strided(s.x)?;
        let (ximage, xpix) = super::view_strides(s.nhwc, x_runs, c, h * w, "input")?;
        let [oh, ow] = s.out_hw;
        let dims = [
            h,
            w,
            oh,
            ow,
            s.kernel[0],
            s.kernel[1],
            s.stride[0],
            s.stride[1],
            s.padding[0],
            s.padding[1],
            s.dilation[0],
            s.dilation[1],
        ];
        let mut geo = [0i32; 12];
        for (slot, &v) in geo.iter_mut().zip(&dims) {
            *slot = c_int(v, "depthwise convolution geometry")?;
        }
        let (w, held_w) = match s.nhwc {
            false => (cx.ptr(s.w)?, None),
            true => {
                let taps = [c, s.kernel[0] * s.kernel[1]];
                let (hp, held) = permuted_weights(s.w, &taps, &[1, 0], cx)?;
                (hp, Some(held))
            }
        };
        let sums = s
            .sum_with
            .iter()
            .map(|&b| cx.ptr(b))
            .collect::<Result<Vec<_>, _>>()?;
        let (held_more, more) = match sums.as_slice() {
            [] => (None, 0),
            ptrs => {
                if x_runs.is_some() {
                    return Err(cx.no_kernel("a strided input of a depthwise convolution's sum"));
                }
                let (p, dev) = cx.gpu.upload_array(ptrs)?;
                (Some(dev), p)
            }
        };
        let (y, bias) = (
            cx.ptr(s.y)?,
            s.bias.map(|b| cx.ptr(b)).transpose()?.unwrap_or(0),
        );
        let in_bias = s.in_bias.map(|b| cx.ptr(b)).transpose()?.unwrap_or(0);
        // The pointers the tiled kernels access several channels at (summed inputs take none
        // of them: `tiled_outputs`).
        let width = match s.nhwc {
            true => crate::cuda::vector_width([c, xpix, ximage], [y, x, w, bias, in_bias]),
            false => 1,
        };
        Ok(CudaDepthwise {
            kernel: s.nvrtc_kernel().unwrap_or("depthwise_conv"),
            y,
            x,
            w,
            _held_w: held_w,
            bias,
            nc: i64::try_from(n * c).map_err(|_| GpuError::Plan("images x channels".into()))?,
            c: c_int(c, "channels")?,
            ximage: as_i64(ximage, "image stride")?,
            xpix: c_int(xpix, "pixel stride")?,
            geo,
            pre: act_params(s.pre_act),
            act: act_params(s.act),
            in_bias,
            _more: held_more,
            more,
            nmore: c_int(s.sum_with.len(), "summed inputs")?,
            total: s.out_len(),
            items: s.out_len(),
            width,
        })
    }

    /// Whether every index fits 32 bits and a relu comes before: where the unrolled and the
    /// tiled kernels have cases (their `*_cases` fall back to the one-output kernel else).
    fn relu_on_32_bits(&self) -> bool {
        let g = &self.geo;
        let fits = |v: Option<i64>| v.is_some_and(|v| v <= i64::from(i32::MAX));
        let outputs = self.nc.checked_mul(i64::from(g[2]) * i64::from(g[3]));
        let images = (self.nc / i64::from(self.c.max(1))).checked_mul(self.ximage);
        self.pre.0 == act_params(Activation::Relu).0 && fits(outputs) && fits(images)
    }

    /// Whether the unrolled kernel has a case for this convolution: widths 3, 5 and 7.
    fn unrolls(&self) -> bool {
        self.relu_on_32_bits() && matches!(self.geo[5], 3 | 5 | 7)
    }

    /// The outputs of a row each thread of the tiled kernel computes (4 at stride 1, 2 at
    /// stride 2) where that kernel has a case for this convolution (its `tiled_cases`: also
    /// no dilation along the width, no summed inputs); `None` elsewhere.
    fn tiled_outputs(&self) -> Option<usize> {
        let (sw, dw) = (self.geo[7], self.geo[11]);
        let case = self.unrolls() && matches!(sw, 1 | 2) && dw == 1 && self.nmore == 0;
        case.then_some(if sw == 1 { 4 } else { 2 })
    }

    /// The tiled kernel by several channels (by fours or twos: `width`) where it has a case
    /// for this convolution: its candidate code, name and the outputs each thread computes
    /// (that many channels of the tiled kernel's outputs).
    fn tiled_wide(&self) -> Option<(u32, &'static str, usize)> {
        use crate::tuning::{DEPTHWISE_TILED2, DEPTHWISE_TILED4};
        let (code, kernel) = match self.width {
            4 => (DEPTHWISE_TILED4, "depthwise_conv_tiled4_nhwc"),
            2 => (DEPTHWISE_TILED2, "depthwise_conv_tiled2_nhwc"),
            _ => return None,
        };
        self.tiled_outputs().map(|v| (code, kernel, self.width * v))
    }

    /// This convolution run by the kernel measured fastest on this GPU for its key
    /// ([`crate::tuning::DEPTHWISE_KEY`], kept in the cost cache so every process runs the
    /// same): one output a thread, its width unrolled, tiled, or tiled by fours or twos,
    /// where those have a case.
    fn measured(mut self, cx: &PrepareCx<'_>) -> Result<CudaDepthwise, GpuError> {
        use crate::tuning::{
            choose, KernelFamily, DEPTHWISE_KEY, DEPTHWISE_ONE, DEPTHWISE_TILED, DEPTHWISE_TILED2,
            DEPTHWISE_TILED4, DEPTHWISE_UNROLLED,
        };
        if !self.unrolls() {
            return Ok(self);
        }
        let (unrolled, tiled) = match self.kernel == "depthwise_conv_nhwc" {
            true => ("depthwise_conv_unrolled_nhwc", "depthwise_conv_tiled_nhwc"),
            false => ("depthwise_conv_unrolled", "depthwise_conv_tiled"),
        };
        let mut kernels = vec![
            (DEPTHWISE_ONE, self.kernel, self.total),
            (DEPTHWISE_UNROLLED, unrolled, self.total),
        ];
        if let Some(per_thread) = self.tiled_outputs() {
            kernels.push((DEPTHWISE_TILED, tiled, self.total.div_ceil(per_thread)));
        }
        if let Some((code, kernel, per_thread)) = self.tiled_wide() {
            kernels.push((code, kernel, self.total.div_ceil(per_thread)));
        }
        let key = format!(
            "{DEPTHWISE_KEY}nc={}|c={}|geo={:?}|{}|ximage={}|xpix={}|pre={}|act={}|bias={}|\
             in_bias={}|sums={}|width={}",
            self.nc,
            self.c,
            self.geo,
            self.kernel,
            self.ximage,
            self.xpix,
            self.pre.0,
            self.act.0,
            self.bias != 0,
            self.in_bias != 0,
            self.nmore,
            self.width
        );
        let (gpu, sc, this): (&Gpu, &StreamCtx, &Self) = (cx.gpu, cx.sc, &self);
        let runs: Vec<_> = kernels
            .iter()
            .map(|&(_, kernel, items)| move || this.launch(gpu, sc, kernel, items))
            .collect();
        let candidates: Vec<(u32, &crate::cuda::Launch<'_>)> = kernels
            .iter()
            .zip(&runs)
            .map(|(&(code, _, _), run)| (code, run as &crate::cuda::Launch<'_>))
            .collect();
        let timed = cx.timed(&key, DEPTHWISE_TIMING_REPS, &candidates)?;
        let chosen = choose(&timed, usize::MAX).map_or(DEPTHWISE_ONE, |c| c.algo);
        if let Some(&(_, kernel, items)) = kernels.iter().find(|k| k.0 == chosen) {
            (self.kernel, self.items) = (kernel, items);
        }
        let family = match chosen {
            DEPTHWISE_TILED => KernelFamily::DepthwiseTiled,
            DEPTHWISE_TILED4 => KernelFamily::DepthwiseTiled4,
            DEPTHWISE_TILED2 => KernelFamily::DepthwiseTiled2,
            DEPTHWISE_UNROLLED => KernelFamily::DepthwiseUnrolled,
            _ => KernelFamily::DepthwiseOne,
        };
        cx.tuning.chose(&key, family);
        Ok(self)
    }

    /// Launch `kernel` (one of the depthwise entry points, which all take these arguments)
    /// over `items` threads.
    fn launch(
        &self,
        gpu: &Gpu,
        sc: &StreamCtx,
        kernel: &'static str,
        items: usize,
    ) -> Result<(), GpuError> {
        let mut b = sc.launch_builder(gpu.function(kernel)?);
        b.arg(&self.y)
            .arg(&self.x)
            .arg(&self.w)
            .arg(&self.bias)
            .arg(&self.nc)
            .arg(&self.c)
            .arg(&self.ximage)
            .arg(&self.xpix)
            .arg(&self.geo)
            .arg(&self.pre.0)
            .arg(&self.pre.1)
            .arg(&self.pre.2)
            .arg(&self.act.0)
            .arg(&self.act.1)
            .arg(&self.act.2)
            .arg(&self.in_bias)
            .arg(&self.more)
            .arg(&self.nmore);
        // SAFETY: matches the depthwise entry points (x's image and pixel strides, then
        // Geo12: twelve ints by value); the step's access (checked at preparation) covers the
        // input (a strided view's runs checked by the layout), `c * kh * kw` weights (or the
        // held permuted copy, as long), `c` biases and `c` input biases (or null pointers) and
        // the output, and every read index is clipped to the input plane; the summed inputs
        // (the held pointer array, `nmore` of them, dense) hold as many elements as x. Any
        // grid is correct (the kernels stride over their work); `items` sizes it to it.
        launched(unsafe { b.launch(grid(items)) }, kernel)
    }
}

impl Enqueue for CudaDepthwise {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        self.launch(gpu, sc, self.kernel, self.items)
    }
}

/// The kernel a convolution runs and the workspace it needs.
#[derive(Clone, Copy, Debug, PartialEq)]
struct ConvChoice {
    kernel: Kernel,
    workspace: usize,
}

/// A legacy-API algorithm with the math type it was measured with (cuDNN needs both on the
/// descriptor), a backend engine configuration, or (a 1x1 convolution) cuBLAS's product.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kernel {
    Legacy {
        algo: dnn_sys::cudnnConvolutionFwdAlgo_t,
        math: dnn_sys::cudnnMathType_t,
    },
    Engine(EngineRef),
    Gemm,
}

impl ConvChoice {
    /// cuBLAS's product: no workspace of cuDNN's.
    const GEMM: ConvChoice = ConvChoice {
        kernel: Kernel::Gemm,
        workspace: 0,
    };

    /// Its candidate numbers in the tuning table ([`crate::tuning::Candidate`]).
    fn code(&self) -> (u32, u32) {
        match self.kernel {
            Kernel::Legacy { algo, math } => (algo as u32, math as u32),
            Kernel::Engine(e) => {
                let c = crate::tuning::Candidate::of_engine(e.global, e.rank, 0.0, 0);
                (c.algo, c.math)
            }
            Kernel::Gemm => (crate::tuning::GEMM, 0),
        }
    }

    /// The kind of kernel it is (for the run report).
    fn family(&self) -> crate::tuning::KernelFamily {
        use crate::tuning::KernelFamily;
        match self.kernel {
            Kernel::Legacy { .. } => KernelFamily::Legacy,
            Kernel::Engine(_) => KernelFamily::Engine,
            Kernel::Gemm => KernelFamily::Gemm,
        }
    }
}

struct CudaConv {
    x: u64,
    w: u64,
    y: u64,
    bias: u64,
    x_desc: TensorDesc,
    y_desc: TensorDesc,
    bias_desc: TensorDesc,
    w_desc: FilterDesc,
    conv: ConvDesc,
    /// The convolution as a backend operation graph (built when an engine is first needed).
    graph: Option<ConvGraph>,
    /// The shape the graph describes.
    shape: ConvShape,
    /// The execution plan of the engine last chosen (run only while `choice` is that engine).
    engine: Option<EnginePlan>,
    /// The convolution as cuBLAS's product, where it is one and the options ask for it.
    gemm: Option<super::gemm::CudaGemm>,
    /// The fused call's activation: relu, or identity for a bias alone.
    fused_act: ActDesc,
    /// The fused call's `z` and its scale: the residual and 1, or the output and 0.
    z: u64,
    alpha2: f32,
    choice: ConvChoice,
    /// Run the fused conv + bias (+ relu) call (else conv, then the bias_act kernel).
    fused: bool,
    /// The unfused epilogue: bias and activation (None: nothing to do).
    epilogue: Option<super::act::CudaBiasAct>,
    /// A zero bias for a fused convolution without its own bias.
    _zero_bias: Option<CudaSlice<f32>>,
    /// The weights in KRSC order, for a channels-last convolution.
    _held_w: Option<CudaSlice<f32>>,
    /// Where cuDNN refused a strided input: the copy of it into the held dense buffer, run
    /// first.
    pre_copy: Option<(Box<dyn Enqueue>, CudaSlice<f32>)>,
    /// Padding cuDNN cannot do (different before and after), run next into the held buffer.
    pre_pad: Option<(super::pad::CudaPad, CudaSlice<f32>)>,
    /// Where cuDNN refused a strided output: the copy of the held dense output into it.
    post_copy: Option<(Box<dyn Enqueue>, CudaSlice<f32>)>,
}

/// GPU runs per captured graph when timing a candidate.
const TIMING_REPS: usize = 10;

/// Prepare `s` reading `x` and writing `y` (each a pointer, and its runs where it is
/// strided).
fn prepare(
    s: &Conv,
    x: (u64, Option<crate::program::Runs>),
    y: (u64, Option<crate::program::Runs>),
    cx: &mut PrepareCx<'_>,
) -> Result<CudaConv, GpuError> {
    let [n, c, h, w] = s.input;
    // A strided input (a merged convolution's member at batch > 1) has its images `x_image`
    // elements apart, each dense; so has a strided output (the convolution's slice of a
    // concatenation at batch > 1), `y_image` apart. Channels last, a strided input (a merged
    // convolution's member) or output (a slice of a concatenation) has its pixels `x_pixel`
    // or `y_pixel` elements apart, each pixel's channels dense.
    let (xp, x_runs) = x;
    let (x_image, x_pixel) = super::view_strides(s.nhwc, x_runs, c, h * w, "input")?;
    let oc = s.out_channels;
    let y_dims = [n, oc, s.out_hw[0], s.out_hw[1]];
    let w_dims = [oc, c / s.groups, s.kernel[0], s.kernel[1]];
    let conv = ConvDesc::new(s.padding, s.stride, s.dilation, s.groups)?;
    let (yp, y_runs) = y;
    let pixels = s.out_hw[0] * s.out_hw[1];
    let (y_image, y_pixel) = super::view_strides(s.nhwc, y_runs, oc, pixels, "output")?;
    // Channels last: the filter goes KRSC too, permuted once into a buffer of the prepared
    // operator's own (the program keeps the weights as the IR has them, [oc, c, kh, kw]).
    let (w_desc, wp, held_w) = if s.nhwc {
        let (hp, held) = permuted_weights(s.w, &w_dims, &[0, 2, 3, 1], cx)?;
        let format = dnn_sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC;
        (FilterDesc::new(w_dims, format)?, hp, Some(held))
    } else {
        let format = dnn_sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
        (FilterDesc::new(w_dims, format)?, cx.ptr(s.w)?, None)
    };
    // What the tuning table keys by (the device is the cache entry's fingerprint). Engines
    // are candidates of their own key, so measurements made without them are not reused;
    // ".2": the first version's measurements (on an H100 it found no engine) hold none.
    let api = cx.opts.conv_api;
    let gemm_wanted = match cx.opts.conv_gemm {
        ConvGemm::Off => false,
        ConvGemm::Timed => api == ConvApi::Both,
        ConvGemm::Always => true,
    };
    let dense = x_runs.is_none() && y_runs.is_none();
    let gemm = match gemm_wanted && s.groups == 1 && s.is_pointwise() && dense && !s.nhwc {
        true => Some(super::gemm::CudaGemm::new(&s.as_gemm(), cx)?),
        false => None,
    };
    let gemm_always = gemm.is_some() && cx.opts.conv_gemm == ConvGemm::Always;
    let tuning_key = format!(
        "{}x={:?}|oc={oc}|k={:?}|s={:?}|p={:?}|d={:?}|g={}|{}{}{}|{}{}{}",
        crate::tuning::CONV_KEY,
        s.input,
        s.kernel,
        s.stride,
        s.padding,
        s.dilation,
        s.groups,
        if s.nhwc { "nhwc" } else { "nchw" },
        match (x_runs, s.nhwc) {
            (Some(_), false) => format!("|ximage={x_image}"),
            (Some(_), true) => format!("|xpixel={x_pixel}"),
            (None, _) => String::new(),
        },
        match (y_runs, s.nhwc) {
            (Some(_), false) => format!("|yimage={y_image}"),
            (Some(_), true) => format!("|ypixel={y_pixel}"),
            (None, _) => String::new(),
        },
        if cx.opts.tf32 { "tf32" } else { "fp32" },
        if api == ConvApi::Legacy {
            ""
        } else {
            "|engines.2"
        },
        if gemm.is_some() { "|gemm" } else { "" }
    );
    // cuDNN's fused call always adds a bias: a zero one where the convolution has none.
    let want_fused = s.act == Activation::Relu;
    let identity = s.act == Activation::None && (s.bias.is_some() || s.residual.is_some());
    let (zero_bias, bias_ptr) = match s.bias {
        Some(b) => (None, cx.ptr(b)?),
        None if want_fused || identity => {
            let z = cx.gpu.zeros(oc)?;
            let (p, _) = z.device_ptr(&cx.gpu.alloc_stream);
            (Some(z), p)
        }
        None => (None, 0),
    };
    let mut plan = CudaConv {
        x: xp,
        w: wp,
        y: yp,
        bias: bias_ptr,
        x_desc: match s.nhwc {
            true => tensor4_nhwc_pixels(s.input, x_pixel)?,
            false => tensor4_images(s.input, x_image)?,
        },
        y_desc: match s.nhwc {
            true => tensor4_nhwc_pixels(y_dims, y_pixel)?,
            false => tensor4_images(y_dims, y_image)?,
        },
        bias_desc: tensor4([1, oc, 1, 1])?,
        w_desc,
        conv,
        graph: None,
        shape: ConvShape {
            x: s.input,
            w: w_dims,
            y: y_dims,
            x_image,
            y_image,
            nhwc: s.nhwc,
            padding: s.padding,
            stride: s.stride,
            dilation: s.dilation,
        },
        engine: None,
        gemm,
        fused_act: ActDesc::relu()?,
        z: s.residual.map(|r| cx.ptr(r)).transpose()?.unwrap_or(yp),
        alpha2: if s.residual.is_some() { 1.0 } else { 0.0 },
        // Replaced by the measured choice below.
        choice: ConvChoice {
            kernel: Kernel::Legacy {
                algo: dnn_sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                math: search_math(cx.opts.tf32, dnn_sys::cudnnMathType_t::CUDNN_DEFAULT_MATH),
            },
            workspace: 0,
        },
        fused: false,
        epilogue: None,
        _zero_bias: zero_bias,
        _held_w: held_w,
        pre_copy: None,
        pre_pad: None,
        post_copy: None,
    };
    let tuning = cx.tuning;
    let candidates = tuning.get_or_measure(&tuning_key, || measure_candidates(&mut plan, cx))?;
    let handle = cx.sc.cudnn();
    let mut choice = match gemm_always {
        true => ConvChoice::GEMM,
        false => choice_of(&candidates, cx.opts, api)?,
    };
    if let Err(e) = plan.set_variant(Variant::of(choice), handle) {
        if api == ConvApi::Backend {
            return Err(e);
        }
        // An engine the heuristics no longer propose as measured: a legacy algorithm instead.
        tracing::warn!("{e}; convolution {tuning_key} falls back to the legacy API");
        choice = choice_of(&candidates, cx.opts, ConvApi::Legacy)?;
        plan.set_variant(Variant::of(choice), handle)?;
    }
    cx.sc.ensure_workspace(choice.workspace)?;
    cx.tuning.chose(&tuning_key, choice.family());
    if let Some(step) = s.epilogue() {
        plan.epilogue = Some(super::act::CudaBiasAct::at(cx, &step, y)?);
    }
    // cuDNN's fused conv + bias (+ relu) call runs legacy algorithms only: with relu, the one
    // chosen (or the fastest legacy one when an engine was chosen); for a bias alone, only the
    // implicit precomputed GEMM. Backend engines alone, and the product where it must run,
    // leave the epilogue to our kernel.
    let legacy = |only_precomp: bool| {
        use dnn_sys::cudnnConvolutionFwdAlgo_t as Algo;
        let precomp = Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM as u32;
        let c: Vec<_> = candidates
            .iter()
            .filter(|c| !only_precomp || c.algo == precomp)
            .copied()
            .collect();
        choice_of(&c, cx.opts, ConvApi::Legacy).ok()
    };
    let fused_alt = match choice.kernel {
        _ if api == ConvApi::Backend || gemm_always => None,
        Kernel::Legacy { .. } if want_fused => Some(choice),
        _ if want_fused => legacy(false),
        _ if identity => legacy(true),
        _ => None,
    };
    if let Some(alt) = fused_alt {
        let (act, name) = if want_fused {
            (ActDesc::relu()?, "relu")
        } else {
            (ActDesc::identity()?, "identity")
        };
        plan.fused_act = act;
        fused_epilogue(&mut plan, &tuning_key, name, alt, cx)?;
    }
    if plan.fused {
        plan.epilogue = None;
    }
    Ok(plan)
}

/// One way to run a convolution with its bias (and relu): a kernel, and whether cuDNN's fused
/// call adds the bias (and applies the relu) or our kernel does after the convolution.
#[derive(Clone, Copy)]
struct Variant {
    choice: ConvChoice,
    fused: bool,
}

impl Variant {
    /// The convolution alone, by `choice`.
    fn of(choice: ConvChoice) -> Variant {
        Variant {
            choice,
            fused: false,
        }
    }
}

impl CudaConv {
    /// The convolution as a backend operation graph, built on first use.
    fn engine_graph(&mut self, handle: dnn_sys::cudnnHandle_t) -> Result<&mut ConvGraph, GpuError> {
        let graph = match self.graph.take() {
            Some(g) => g,
            None => ConvGraph::new(handle, &self.shape)?,
        };
        Ok(self.graph.insert(graph))
    }

    /// Run as `v` from now on: the descriptor's math type follows a legacy algorithm's; an
    /// engine gets its execution plan (built with `handle`).
    fn set_variant(&mut self, v: Variant, handle: dnn_sys::cudnnHandle_t) -> Result<(), GpuError> {
        match v.choice.kernel {
            // The engine's plan stays built: measurements switch back and forth.
            Kernel::Legacy { math, .. } => self.conv.set_math(math)?,
            Kernel::Gemm if v.fused || self.gemm.is_none() => {
                return Err(GpuError::Plan(
                    "cuBLAS's product runs a 1x1 convolution alone".into(),
                ))
            }
            Kernel::Gemm => {}
            Kernel::Engine(e) => {
                if v.fused {
                    return Err(GpuError::Plan(
                        "cuDNN's fused call runs legacy algorithms only".into(),
                    ));
                }
                if self.engine.as_ref().map(|p| p.engine) != Some(e) {
                    let p = self.engine_graph(handle)?.plan(handle, e)?;
                    if p.workspace > v.choice.workspace {
                        return Err(GpuError::Plan(format!(
                            "engine {} now needs {} bytes of workspace, measured with {}",
                            e.global, p.workspace, v.choice.workspace
                        )));
                    }
                    self.engine = Some(p);
                }
            }
        }
        self.choice = v.choice;
        self.fused = v.fused;
        Ok(())
    }
}

/// Every kernel the convolution may run, each timed on the GPU in a CUDA graph replay
/// ([`StreamCtx::time_ms`], the convolution alone): the legacy algorithms that
/// `cudnnFindConvolutionForwardAlgorithmEx` finds working within the workspace limit, and
/// (unless the options ask for the legacy API alone) the admissible engine configurations
/// among the top of the backend heuristics' lists ([`crate::cuda::engine`]), and cuBLAS's
/// product where the plan has one ([`Conv::as_gemm`]). A kernel that fails to build, run or
/// be captured is left out; the backend failing as a whole leaves the legacy algorithms.
fn measure_candidates(
    plan: &mut CudaConv,
    cx: &mut PrepareCx<'_>,
) -> Result<Vec<crate::tuning::Candidate>, GpuError> {
    let api = cx.opts.conv_api;
    let handle = cx.sc.cudnn();
    // Both and backend-only choices share the measurements (one tuning key): both measure
    // every kernel. An engine's plan is built to learn its workspace, and kept to be timed.
    let mut kernels: Vec<(ConvChoice, Option<EnginePlan>)> = Vec::new();
    for c in find_algos(cx, plan)? {
        kernels.extend(kernel_of(&c, cx.opts).ok().map(|k| (k, None)));
    }
    if api != ConvApi::Legacy {
        match engine_kernels(plan, cx.opts, handle) {
            Ok(engines) => kernels.extend(engines),
            Err(e) => tracing::warn!("cuDNN's backend API offers no engines here: {e}"),
        }
    }
    if plan.gemm.is_some() {
        kernels.push((ConvChoice::GEMM, None));
    }
    let mut out = Vec::with_capacity(kernels.len());
    for (k, built) in kernels {
        if built.is_some() {
            plan.engine = built;
        }
        let timed = cx.sc.ensure_workspace(k.workspace).and_then(|()| {
            plan.set_variant(Variant::of(k), handle)?;
            let (gpu, sc): (&Gpu, &StreamCtx) = (cx.gpu, cx.sc);
            let run: &CudaConv = plan;
            sc.time_ms(gpu, TIMING_REPS, &|| run.run_conv(sc))
        });
        match timed {
            Ok(ms) => {
                let (algo, math) = k.code();
                out.push(crate::tuning::Candidate {
                    algo,
                    math,
                    ms,
                    workspace: k.workspace,
                });
            }
            Err(e) => tracing::debug!("convolution kernel {k:?} left out: {e}"),
        }
    }
    out.sort_by_key(|c| (c.algo, c.math));
    tracing::debug!("convolution kernels measured: {out:?}");
    Ok(out)
}

/// The admissible engine configurations among the top of the backend heuristics' list that
/// build within the workspace limit, each with its plan (built to learn its workspace, kept to
/// be timed).
fn engine_kernels(
    plan: &mut CudaConv,
    opts: &crate::KernelOptions,
    handle: dnn_sys::cudnnHandle_t,
) -> Result<Vec<(ConvChoice, Option<EnginePlan>)>, GpuError> {
    let graph = plan.engine_graph(handle)?;
    let mut out = Vec::new();
    for e in graph.candidates(opts.tf32)? {
        match graph.plan(handle, e) {
            Ok(p) if p.workspace <= opts.conv_workspace_limit => {
                let k = ConvChoice {
                    kernel: Kernel::Engine(e),
                    workspace: p.workspace,
                };
                out.push((k, Some(p)));
            }
            Ok(p) => tracing::debug!(
                "engine {} needs {} bytes of workspace, over the limit",
                e.global,
                p.workspace
            ),
            Err(err) => tracing::debug!("engine {}: {err}", e.global),
        }
    }
    Ok(out)
}

/// Set `plan` to the faster of `fused` and `separate`, both timed on the GPU between events
/// (a tie goes to the fused call, which launches less). Measured once per `key` and device;
/// the timings are kept in the tuning table, so every later process decides alike
/// ([`crate::tuning::epilogue_key`]).
fn faster_variant(
    plan: &mut CudaConv,
    key: &str,
    fused: Variant,
    separate: Variant,
    cx: &mut PrepareCx<'_>,
) -> Result<(), GpuError> {
    use crate::tuning::{choose, Candidate, EPILOGUE_FUSED, EPILOGUE_SEPARATE};
    let handle = cx.sc.cudnn();
    let tuning = cx.tuning;
    let candidates = tuning.get_or_measure(key, || {
        let ws = fused.choice.workspace.max(separate.choice.workspace);
        cx.sc.ensure_workspace(ws)?;
        let (gpu, sc): (&Gpu, &StreamCtx) = (cx.gpu, cx.sc);
        let mut c = Vec::with_capacity(2);
        for (code, v) in [(EPILOGUE_FUSED, fused), (EPILOGUE_SEPARATE, separate)] {
            plan.set_variant(v, handle)?;
            let run: &CudaConv = plan;
            c.push(Candidate {
                algo: code,
                math: 0,
                ms: sc.time_ms(gpu, TIMING_REPS, &|| run.enqueue(gpu, sc))?,
                workspace: 0,
            });
        }
        Ok::<_, GpuError>(c)
    })?;
    let fused_wins = choose(&candidates, usize::MAX).is_none_or(|c| c.algo == EPILOGUE_FUSED);
    plan.set_variant(if fused_wins { fused } else { separate }, handle)
}

/// Where cuDNN's fused call (with `plan.fused_act`, named `act`) by legacy kernel `alt` works
/// for this shape and is no slower than `plan`'s chosen kernel followed by our bias kernel,
/// switch `plan` to it ([`faster_variant`]).
fn fused_epilogue(
    plan: &mut CudaConv,
    conv_key: &str,
    act: &str,
    alt: ConvChoice,
    cx: &mut PrepareCx<'_>,
) -> Result<(), GpuError> {
    let handle = cx.sc.cudnn();
    let separate = Variant::of(plan.choice);
    let fused = Variant {
        choice: alt,
        fused: true,
    };
    cx.sc.ensure_workspace(alt.workspace)?;
    plan.set_variant(fused, handle)?;
    // cuDNN does not run the fused call with every algorithm for every shape: try it once.
    if !(plan.run_conv(cx.sc).is_ok() && cx.sc.synchronize().is_ok()) {
        tracing::debug!("fused conv ({act}) not supported for {conv_key}; using conv + kernel");
        return plan.set_variant(separate, handle);
    }
    let (algo, math) = separate.choice.code();
    let key = crate::tuning::epilogue_key(conv_key, act, algo, math);
    faster_variant(plan, &key, fused, separate, cx)
}

/// The legacy algorithms that run the convolution within the workspace limit, with their
/// workspace and math type (times are `cudnnFindConvolutionForwardAlgorithmEx`'s; the caller
/// times them again as the other candidates).
fn find_algos(
    cx: &mut PrepareCx<'_>,
    plan: &CudaConv,
) -> Result<Vec<crate::tuning::Candidate>, GpuError> {
    let limit = cx.opts.conv_workspace_limit;
    let ws = cx.gpu.zeros_bytes(limit.max(1))?;
    let (wsp, _) = ws.device_ptr(&cx.gpu.alloc_stream);
    // The search runs with the descriptor's math type; cuDNN reports per algorithm the one
    // it used.
    plan.conv.set_math(search_math(
        cx.opts.tf32,
        dnn_sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
    ))?;
    // SAFETY: descriptors match the buffers (sizes from the same program, checked at
    // preparation); the workspace is `limit` bytes; the handle's stream belongs to the bound
    // context. The search writes `y` (an output nobody has read yet).
    let found = unsafe {
        crate::cuda::cudnn::find_forward(
            cx.sc.cudnn(),
            &plan.x_desc,
            plan.x,
            &plan.w_desc,
            plan.w,
            &plan.conv,
            &plan.y_desc,
            plan.y,
            wsp,
            limit,
        )
    }?;
    let mut out: Vec<_> = found
        .iter()
        .map(|p| crate::tuning::Candidate {
            algo: p.algo as u32,
            math: p.mathType as u32,
            ms: f64::from(p.time),
            workspace: p.memory,
        })
        .collect();
    out.sort_by_key(|c| (c.algo, c.math));
    out.dedup_by_key(|c| (c.algo, c.math));
    Ok(out)
}

/// The kernel to run among measured `candidates` that `api` allows
/// ([`crate::tuning::choose`]).
fn choice_of(
    candidates: &[crate::tuning::Candidate],
    opts: &crate::KernelOptions,
    api: ConvApi,
) -> Result<ConvChoice, GpuError> {
    let none = |m: &str| GpuError::Cudnn {
        during: "choosing a convolution kernel".into(),
        message: m.into(),
    };
    let allowed: Vec<_> = candidates
        .iter()
        .filter(|c| match api {
            ConvApi::Both => true,
            ConvApi::Legacy => c.engine().is_none() && c.algo != crate::tuning::GEMM,
            ConvApi::Backend => c.engine().is_some(),
        })
        .copied()
        .collect();
    let best = crate::tuning::choose(&allowed, opts.conv_workspace_limit).ok_or_else(|| {
        none(match api {
            ConvApi::Both => "no kernel ran within the workspace limit",
            ConvApi::Legacy => "no legacy algorithm ran within the workspace limit",
            ConvApi::Backend => {
                "no backend engine ran within the workspace limit \
                 (RUST_LOG=opsched_gpu=debug lists the heuristics' engines)"
            }
        })
    })?;
    kernel_of(&best, opts)
}

/// The kernel candidate `best` names, to run with `opts`.
fn kernel_of(
    best: &crate::tuning::Candidate,
    opts: &crate::KernelOptions,
) -> Result<ConvChoice, GpuError> {
    use dnn_sys::cudnnConvolutionFwdAlgo_t as A;
    use dnn_sys::cudnnMathType_t as M;
    let none = |m: &str| GpuError::Cudnn {
        during: "choosing a convolution kernel".into(),
        message: m.into(),
    };
    if let Some((global, rank)) = best.engine() {
        return Ok(ConvChoice {
            kernel: Kernel::Engine(EngineRef { global, rank }),
            workspace: best.workspace,
        });
    }
    if best.algo == crate::tuning::GEMM {
        return Ok(ConvChoice::GEMM);
    }
    let algo = [
        A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
        A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        A::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
        A::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
        A::CUDNN_CONVOLUTION_FWD_ALGO_FFT,
        A::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
        A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
        A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
    ]
    .into_iter()
    .find(|a| *a as u32 == best.algo)
    .ok_or_else(|| none("a cached algorithm number this cuDNN does not have"))?;
    let math = [
        M::CUDNN_DEFAULT_MATH,
        M::CUDNN_TENSOR_OP_MATH,
        M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
        M::CUDNN_FMA_MATH,
    ]
    .into_iter()
    .find(|m| *m as u32 == best.math)
    .ok_or_else(|| none("a cached math type this cuDNN does not have"))?;
    Ok(ConvChoice {
        kernel: Kernel::Legacy {
            algo,
            math: search_math(opts.tf32, math),
        },
        workspace: best.workspace,
    })
}

/// The math type to run a searched algorithm with: the one the search measured it with,
/// except that without TF32 the convolution stays in plain FMA math (cuDNN's default math
/// type allows TF32 on Ampere and later).
fn search_math(tf32: bool, searched: dnn_sys::cudnnMathType_t) -> dnn_sys::cudnnMathType_t {
    if tf32 {
        searched
    } else {
        dnn_sys::cudnnMathType_t::CUDNN_FMA_MATH
    }
}

impl CudaConv {
    fn run_conv(&self, sc: &StreamCtx) -> Result<(), GpuError> {
        let one = 1.0f32;
        let zero = 0.0f32;
        let (ws_ptr, ws_bytes) = if self.choice.workspace > 0 {
            (sc.workspace_ptr() as *mut c_void, self.choice.workspace)
        } else {
            (std::ptr::null_mut(), 0)
        };
        let algo = match (self.choice.kernel, &self.engine) {
            (Kernel::Legacy { algo, .. }, _) => algo,
            (Kernel::Engine(e), Some(p)) if p.engine == e => {
                return p.execute(sc.cudnn(), self.x, self.w, self.y, sc.workspace_ptr())
            }
            (Kernel::Engine(e), _) => {
                return Err(GpuError::Plan(format!("engine {} has no plan", e.global)))
            }
            (Kernel::Gemm, _) => {
                return match &self.gemm {
                    Some(g) => g.run(sc),
                    None => Err(GpuError::Plan("a convolution with no product".into())),
                }
            }
        };
        if self.fused {
            // SAFETY: descriptors match the buffers; z is the residual (of y's shape: the
            // step's access reads it whole) with alpha2 = 1, or aliases y with alpha2 = 0
            // (allowed); the stream's workspace holds at least `choice.workspace` bytes
            // (fitted before any launch).
            unsafe {
                dnn::convolution_bias_activation_forward(
                    sc.cudnn(),
                    (&one) as *const f32 as *const c_void,
                    self.x_desc.0,
                    self.x as *const c_void,
                    self.w_desc.0,
                    self.w as *const c_void,
                    self.conv.0,
                    algo,
                    ws_ptr,
                    ws_bytes,
                    (&self.alpha2) as *const f32 as *const c_void,
                    self.y_desc.0,
                    self.z as *const c_void,
                    self.bias_desc.0,
                    self.bias as *const c_void,
                    self.fused_act.0,
                    self.y_desc.0,
                    self.y as *mut c_void,
                )
            }
            .map_err(|e| GpuError::cudnn("running a fused convolution", e))
        } else {
            // SAFETY: as above.
            unsafe {
                dnn::convolution_forward(
                    sc.cudnn(),
                    (&one) as *const f32 as *const c_void,
                    self.x_desc.0,
                    self.x as *const c_void,
                    self.w_desc.0,
                    self.w as *const c_void,
                    self.conv.0,
                    algo,
                    ws_ptr,
                    ws_bytes,
                    (&zero) as *const f32 as *const c_void,
                    self.y_desc.0,
                    self.y as *mut c_void,
                )
            }
            .map_err(|e| GpuError::cudnn("running a convolution", e))
        }
    }
}

impl Enqueue for CudaConv {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        if sc.workspace_bytes() < self.choice.workspace {
            return Err(GpuError::Plan(format!(
                "a convolution needs {} bytes of workspace, its stream has {}",
                self.choice.workspace,
                sc.workspace_bytes()
            )));
        }
        if let Some((copy, _)) = &self.pre_copy {
            copy.enqueue(gpu, sc)?;
        }
        if let Some((pad, _)) = &self.pre_pad {
            pad.enqueue(gpu, sc)?;
        }
        self.run_conv(sc)?;
        if let (Some(e), false) = (&self.epilogue, self.fused) {
            e.enqueue(gpu, sc)?;
        }
        match &self.post_copy {
            Some((copy, _)) => copy.enqueue(gpu, sc),
            None => Ok(()),
        }
    }

    fn workspace(&self) -> usize {
        self.choice.workspace
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::reference::act;
    use dnn_sys::cudnnMathType_t as M;
    use proptest::prelude::*;

    proptest! {
        /// Padding keeps every kernel's taps at their place around the centre and adds
        /// zeros only.
        #[test]
        fn padded_kernels_keep_their_taps_centred(
            kernels in 1usize..4,
            k in (0usize..3, 0usize..3),
            extra in (0usize..3, 0usize..3),
        ) {
            let k = [2 * k.0 + 1, 2 * k.1 + 1];
            let to = [k[0] + 2 * extra.0, k[1] + 2 * extra.1];
            let w: Vec<f32> = (0..kernels * k[0] * k[1]).map(|i| i as f32 + 1.0).collect();
            let mut out = vec![-1.0];
            pad_kernels(&w, k, to, &mut out);
            prop_assert_eq!(out.len(), 1 + kernels * to[0] * to[1]);
            for n in 0..kernels {
                for r in 0..to[0] {
                    for c in 0..to[1] {
                        let got = out[1 + (n * to[0] + r) * to[1] + c];
                        let (rr, cc) = (r.checked_sub(extra.0), c.checked_sub(extra.1));
                        let want = match (rr, cc) {
                            (Some(rr), Some(cc)) if rr < k[0] && cc < k[1] => {
                                w[(n * k[0] + rr) * k[1] + cc]
                            }
                            _ => 0.0,
                        };
                        prop_assert_eq!(got, want);
                    }
                }
            }
        }
    }

    /// A convolution of `[1, c, h, w]` with its output size.
    #[allow(clippy::too_many_arguments)]
    fn conv(
        c: usize,
        hw: [usize; 2],
        oc: usize,
        kernel: [usize; 2],
        stride: [usize; 2],
        pad: [usize; 2],
        pad_end: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Conv {
        let out = |i: usize| {
            (hw[i] + pad[i] + pad_end[i] - dilation[i] * (kernel[i] - 1) - 1) / stride[i] + 1
        };
        Conv {
            x: 0,
            w: 1,
            bias: Some(2),
            y: 3,
            input: [1, c, hw[0], hw[1]],
            out_channels: oc,
            kernel,
            stride,
            padding: pad,
            padding_end: pad_end,
            dilation,
            groups,
            out_hw: [out(0), out(1)],
            act: Activation::Relu,
            pre_act: Activation::None,
            in_bias: None,
            sum_with: Vec::new(),
            residual: None,
            nhwc: false,
        }
    }

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// The CPU kernel of one image against the naive reference convolution.
    fn check_against_reference(s: &Conv) {
        let [_, c, h, w] = s.input;
        let x = values(c * h * w, 1);
        let wt = values(s.out_channels * s.col_rows(), 2);
        let bias = values(s.out_channels, 3);
        let mut y = vec![f32::NAN; s.out_len()];
        s.compute(&x, &wt, None, Some(&bias), None, &mut y).unwrap();
        // The input activation is the reference's input.
        let xa: Vec<f32> = x.iter().map(|&v| act(v, s.pre_act)).collect();
        let want = crate::reference::conv2d(
            &xa,
            &wt,
            Some(&bias),
            s.input,
            s.out_channels,
            s.kernel,
            s.stride,
            s.padding,
            s.dilation,
            s.groups,
            s.out_hw,
            s.act,
        );
        assert_close(s, &y, &want);
        if s.is_depthwise() {
            let out = [1, s.out_channels, s.out_hw[0], s.out_hw[1]];
            for gap in [0, 3] {
                let nchw = depthwise_like_the_kernel(s, &x, None, &wt, &bias, None, false, gap);
                assert_close(s, &nchw, &want);
                let nhwc = depthwise_like_the_kernel(s, &x, None, &wt, &bias, None, true, gap);
                assert_close(s, &crate::program::nhwc_to_nchw(&nhwc, out), &want);
            }
        }
    }

    /// Pointwise convolutions of a stride over one (ResNets' shortcuts into a stage) run on
    /// the pixels they read, gathered: the reference's on two images, planes the stride does
    /// and does not divide, through the direct tiles, `short_k`'s blocks and `gemm`, with an
    /// input bias and activation applied as the pixels are gathered.
    #[test]
    fn strided_pointwise_convolutions_read_their_pixels_gathered() {
        for (c, hw, oc, stride) in [
            (24usize, [9usize, 7usize], 40usize, [2usize, 2usize]),
            (64, [28, 28], 128, [2, 2]),
            (20, [10, 11], 32, [3, 2]),
            (256, [14, 14], 512, [2, 2]),
            (96, [15, 15], 300, [2, 2]),
        ] {
            for (pre_act, biased) in [(Activation::None, false), (Activation::Relu, true)] {
                let one = conv(c, hw, oc, [1, 1], stride, [0, 0], [0, 0], [1, 1], 1);
                let s = Conv {
                    input: [2, c, hw[0], hw[1]],
                    pre_act,
                    in_bias: biased.then_some(4),
                    ..one
                };
                assert!(s.subsampled().is_some(), "{s:?}");
                let n = 2 * c * hw[0] * hw[1];
                let (x, wt, bias, ib) =
                    (values(n, 1), values(oc * c, 2), values(oc, 3), values(c, 5));
                let mut y = vec![f32::NAN; s.out_len()];
                let in_bias = biased.then_some(&ib[..]);
                s.compute(&x, &wt, None, Some(&bias), in_bias, &mut y)
                    .unwrap();
                let plane = hw[0] * hw[1];
                let xa: Vec<f32> = x
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| act(v + in_bias.map_or(0.0, |b| b[i / plane % c]), pre_act))
                    .collect();
                let want = crate::reference::conv2d(
                    &xa,
                    &wt,
                    Some(&bias),
                    s.input,
                    oc,
                    [1, 1],
                    stride,
                    [0, 0],
                    [1, 1],
                    1,
                    s.out_hw,
                    s.act,
                );
                assert_close(&s, &y, &want);
            }
        }
    }

    /// What the GPU runs where cuDNN's fused call does not (an engine, a strided output):
    /// the convolution alone, then its epilogue step in place. On the host, with the
    /// epilogue's CPU kernel (the `bias_act` kernel's formula), that equals the convolution
    /// with its bias, residual and activation, in both layouts and over every element.
    #[test]
    fn the_epilogue_completes_the_convolution_in_both_layouts() {
        for (nhwc, residual) in [
            (false, None),
            (true, None),
            (false, Some(4)),
            (true, Some(4)),
        ] {
            let s = Conv {
                input: [2, 3, 5, 4],
                nhwc,
                residual,
                ..conv(3, [5, 4], 6, [3, 3], [1, 1], [1, 1], [1, 1], [1, 1], 1)
            };
            let (x, w) = (values(2 * 3 * 5 * 4, 1), values(6 * s.col_rows(), 2));
            let (bias, z) = (values(6, 3), values(s.out_len(), 4));
            let run = |s: &Conv, y: &mut Vec<f32>| {
                let mut reads = vec![(0, &x[..]), (1, &w[..]), (2, &bias[..])];
                reads.extend(s.residual.map(|r| (r, &z[..])));
                s.run_cpu(&mut CpuIo::of(reads, vec![(3, &mut y[..])]))
                    .unwrap();
            };
            let mut want = vec![f32::NAN; s.out_len()];
            run(&s, &mut want);
            let mut got = vec![f32::NAN; s.out_len()];
            let alone = Conv {
                bias: None,
                act: Activation::None,
                residual: None,
                ..s.clone()
            };
            run(&alone, &mut got);
            let e = s.epilogue().unwrap();
            let mut reads = vec![(2, &bias[..])];
            reads.extend(s.residual.map(|r| (r, &z[..])));
            e.run_cpu(&mut CpuIo::of(reads, vec![(3, &mut got[..])]))
                .unwrap();
            assert_close(&s, &got, &want);
        }
        let plain = Conv {
            bias: None,
            act: Activation::None,
            ..conv(3, [5, 4], 6, [3, 3], [1, 1], [1, 1], [1, 1], [1, 1], 1)
        };
        assert!(plain.epilogue().is_none());
    }

    /// An asymmetric padding as the GPU runs it: the explicit pad step, then the
    /// convolution with the common padding, equals the convolution, in both layouts.
    #[test]
    fn an_explicit_pad_then_the_common_padding_is_the_convolution() {
        for nhwc in [false, true] {
            let s = Conv {
                input: [2, 3, 5, 4],
                nhwc,
                ..conv(3, [5, 4], 6, [3, 2], [2, 1], [0, 1], [2, 0], [1, 1], 1)
            };
            let (x, w, bias) = (
                values(2 * 3 * 5 * 4, 1),
                values(6 * s.col_rows(), 2),
                values(6, 3),
            );
            let run = |s: &Conv, x: &[f32], y: &mut Vec<f32>| {
                let reads = vec![(s.x, x), (1, &w[..]), (2, &bias[..])];
                s.run_cpu(&mut CpuIo::of(reads, vec![(3, &mut y[..])]))
                    .unwrap();
            };
            let mut want = vec![f32::NAN; s.out_len()];
            run(&s, &x, &mut want);
            let (pad, inner) = s.explicit_pad(9);
            assert_eq!(inner.padding, inner.padding_end);
            let mut padded = vec![f32::NAN; inner.input.iter().product()];
            pad.run_cpu(&mut CpuIo::of(
                vec![(0, &x[..])],
                vec![(9, &mut padded[..])],
            ))
            .unwrap();
            let mut got = vec![f32::NAN; s.out_len()];
            run(&inner, &padded, &mut got);
            assert_close(&s, &got, &want);
        }
    }

    fn assert_close(s: &Conv, got: &[f32], want: &[f32]) {
        let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * scale,
                "{s:?}: element {i}: {a} vs {b}"
            );
        }
    }

    /// The NVRTC `depthwise_conv` kernel's loop (`depthwise_conv_nhwc`'s where `nhwc`), line
    /// by line on the host (with the kernels' activation formula), given NCHW `x` and the
    /// step's weights, which it lays out as the kernel gets them (channels last: `x` NHWC, the
    /// weights `[kh, kw, c]`), `x` a strided view with `gap` unread elements after each image
    /// (NCHW) or pixel (channels last), NaN; its output is in the kernel's layout. Its
    /// indexing, strides, padding and fusions against the reference.
    /// The CUDA depthwise kernel's loop on the host: `x` (NCHW) and the summed input `more`
    /// (laid out as x) laid out in the kernel's layout, runs `gap` apart.
    #[allow(clippy::too_many_arguments)]
    fn depthwise_like_the_kernel(
        s: &Conv,
        x: &[f32],
        more: Option<&[f32]>,
        wt: &[f32],
        bias: &[f32],
        in_bias: Option<&[f32]>,
        nhwc: bool,
        gap: usize,
    ) -> Vec<f32> {
        let taps = s.kernel[0] * s.kernel[1];
        let [n, c, h, w] = s.input;
        let wt: Vec<f32> = match nhwc {
            false => wt.to_vec(),
            true => (0..taps * c).map(|t| wt[(t % c) * taps + t / c]).collect(),
        };
        // The strided view: runs of an image (NCHW) or of a pixel's channels, `gap` apart.
        let run = if nhwc { c } else { c * h * w };
        let lay_out = |x: &[f32]| -> Vec<f32> {
            let dense = match nhwc {
                false => x.to_vec(),
                true => {
                    let mut xl = vec![0.0; x.len()];
                    crate::program::nchw_to_nhwc(x, s.input, &mut xl);
                    xl
                }
            };
            dense
                .chunks(run)
                .flat_map(|r| r.iter().copied().chain(std::iter::repeat_n(f32::NAN, gap)))
                .collect()
        };
        let x = lay_out(x);
        let more = more.map(lay_out);
        let (ximage, xpix) = match nhwc {
            true => ((h * w * (c + gap)) as i64, (c + gap) as i64),
            false => ((c * h * w + gap) as i64, c as i64),
        };
        let [n, c, h, w] = [n, c, h, w].map(|v| v as i64);
        let [oh, ow] = s.out_hw.map(|v| v as i64);
        let [kh, kw] = s.kernel.map(|v| v as i64);
        let ([sh, sw], [ph, pw], [dh, dw]) = (
            s.stride.map(|v| v as i64),
            s.padding.map(|v| v as i64),
            s.dilation.map(|v| v as i64),
        );
        let (pre, post) = (act_params(s.pre_act), act_params(s.act));
        let f = crate::cuda::nvrtc::act_f_host;
        let (step, wstep) = if nhwc { (xpix, c) } else { (1, 1) };
        (0..n * c * oh * ow)
            .map(|t| {
                let (ch, i, j, image) = match nhwc {
                    true => {
                        let pixel = t / c;
                        (t % c, (pixel / ow) % oh, pixel % ow, pixel / (oh * ow))
                    }
                    false => {
                        let plane = t / (oh * ow);
                        (plane % c, (t / ow) % oh, t % ow, plane / c)
                    }
                };
                let x0 = image * ximage + if nhwc { ch } else { ch * h * w };
                let w0 = if nhwc { ch } else { ch * kh * kw };
                let mut acc = 0.0f32;
                for p in 0..kh {
                    let r = i * sh - ph + p * dh;
                    if r < 0 || r >= h {
                        continue;
                    }
                    for q in 0..kw {
                        let col = j * sw - pw + q * dw;
                        if col < 0 || col >= w {
                            continue;
                        }
                        let at = (x0 + (r * w + col) * step) as usize;
                        let mut v = x[at];
                        if let Some(m) = &more {
                            v += m[at];
                        }
                        if let Some(ib) = in_bias {
                            v += ib[ch as usize];
                        }
                        acc += f(v, pre) * wt[(w0 + (p * kw + q) * wstep) as usize];
                    }
                }
                f(acc + bias[ch as usize], post)
            })
            .collect()
    }

    /// cuBLAS's column-major `C = A B` (no transposes), strided over a batch: the
    /// definition the CUDA product of a 1x1 convolution is handed.
    fn cublas_gemm(g: &super::super::gemm::Gemm, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![f32::NAN; (g.batch - 1) * g.stride_c + (g.n - 1) * g.ldc + g.m];
        for t in 0..g.batch {
            for j in 0..g.n {
                for i in 0..g.m {
                    let dot = (0..g.k)
                        .map(|p| {
                            a[t * g.stride_a + i + p * g.lda] * b[t * g.stride_b + p + j * g.ldb]
                        })
                        .sum();
                    c[t * g.stride_c + i + j * g.ldc] = dot;
                }
            }
        }
        c
    }

    /// The values of a sum a depthwise convolution reads (`x` and `sum_with`) and a bias left
    /// to it (`in_bias`) are added to every input element it reads, before its input
    /// activation, and not to the padding: the CPU step in both layouts and the CUDA kernel's
    /// formula equal the reference convolution of `pre_act(x + x2 + in_bias)` zero-padded.
    #[test]
    fn a_sum_and_a_bias_left_to_a_depthwise_convolution_are_added_to_what_it_reads() {
        let (c, hw) = (3, [5, 4]);
        for (k, stride, pad) in [(3, 1, 1), (5, 2, 2), (3, 2, 0)] {
            let base = Conv {
                input: [2, c, hw[0], hw[1]],
                pre_act: Activation::Relu,
                act: Activation::None,
                in_bias: Some(4),
                sum_with: vec![5],
                ..conv(
                    c,
                    hw,
                    c,
                    [k, k],
                    [stride, stride],
                    [pad, pad],
                    [pad, pad],
                    [1, 1],
                    c,
                )
            };
            let (x, x2) = (
                values(2 * c * hw[0] * hw[1], 1),
                values(2 * c * hw[0] * hw[1], 6),
            );
            let (wt, bias, in_bias) = (values(c * k * k, 2), values(c, 3), values(c, 5));
            let plane = hw[0] * hw[1];
            let xb: Vec<f32> = x
                .iter()
                .zip(&x2)
                .enumerate()
                .map(|(i, (v, v2))| act(v + v2 + in_bias[(i / plane) % c], Activation::Relu))
                .collect();
            let want = crate::reference::conv2d(
                &xb,
                &wt,
                Some(&bias),
                base.input,
                c,
                base.kernel,
                base.stride,
                base.padding,
                base.dilation,
                c,
                base.out_hw,
                Activation::None,
            );
            let out = [2, c, base.out_hw[0], base.out_hw[1]];
            for nhwc in [false, true] {
                let s = Conv {
                    nhwc,
                    ..base.clone()
                };
                let stored = |x: &[f32]| match nhwc {
                    false => x.to_vec(),
                    true => {
                        let mut v = vec![0.0; x.len()];
                        crate::program::nchw_to_nhwc(x, s.input, &mut v);
                        v
                    }
                };
                let (xs, x2s) = (stored(&x), stored(&x2));
                let mut y = vec![f32::NAN; s.out_len()];
                let reads = vec![
                    (0, &xs[..]),
                    (1, &wt[..]),
                    (2, &bias[..]),
                    (4, &in_bias[..]),
                    (5, &x2s[..]),
                ];
                s.run_cpu(&mut CpuIo::of(reads, vec![(3, &mut y[..])]))
                    .unwrap();
                let y = match nhwc {
                    false => y,
                    true => crate::program::nhwc_to_nchw(&y, out),
                };
                assert_close(&s, &y, &want);
            }
            // The kernel's formula, one image at a time (it takes the NCHW input).
            let one = Conv {
                input: [1, c, hw[0], hw[1]],
                ..base.clone()
            };
            let images = x.chunks(c * plane).zip(x2.chunks(c * plane));
            for ((image, image2), want) in images.zip(want.chunks(one.out_len())) {
                for nhwc in [false, true] {
                    let (ib, more) = (Some(&in_bias[..]), Some(image2));
                    let got = depthwise_like_the_kernel(&one, image, more, &wt, &bias, ib, nhwc, 2);
                    let got = match nhwc {
                        false => got,
                        true => crate::program::nhwc_to_nchw(&got, [1, out[1], out[2], out[3]]),
                    };
                    assert_close(&one, &got, want);
                }
            }
        }
    }

    proptest! {
        /// A 1x1 convolution handed to cuBLAS as a product per image computes the
        /// convolution (its bias and activation run after it).
        #[test]
        fn pointwise_convolutions_as_products_match_the_reference(
            n in 1usize..4, c in 1usize..9, oc in 1usize..9, h in 1usize..6, w in 1usize..6,
        ) {
            let mut s = conv(c, [h, w], oc, [1, 1], [1, 1], [0, 0], [0, 0], [1, 1], 1);
            s.input[0] = n;
            prop_assume!(s.is_pointwise());
            let (x, wt) = (values(n * c * h * w, 1), values(oc * c, 2));
            let g = s.as_gemm();
            prop_assert_eq!((g.a, g.b, g.c), (s.x, s.w, s.y));
            let got = cublas_gemm(&g, &x, &wt);
            let want = crate::reference::conv2d(
                &x, &wt, None, s.input, oc, [1, 1], [1, 1], [0, 0], [1, 1], 1, [h, w],
                Activation::None,
            );
            prop_assert_eq!(got.len(), want.len());
            assert_close(&s, &got, &want);
        }
    }

    /// A squeeze-and-excitation's layers, pointwise on a 1x1 plane (their bias and activation
    /// one pass over the column): the reference's, with rows split across tasks where the
    /// product is large (each block's bias from its own first row).
    #[test]
    fn pointwise_layers_on_one_pixel_match_the_reference() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for (c, oc) in [(48usize, 1152usize), (1152, 48), (1200, 1000), (5, 3)] {
            for act in [Activation::Sigmoid, Activation::Relu, Activation::None] {
                let mut cv = conv(c, [1, 1], oc, [1, 1], [1, 1], [0, 0], [0, 0], [1, 1], 1);
                cv.act = act;
                pool.install(|| check_against_reference(&cv));
            }
        }
    }

    #[test]
    fn large_convolutions_match_the_reference_on_both_parallel_paths() {
        // (channels, [h, w], out channels, kernel, stride, padding, runs direct); dilation 1.
        // The first two have more pixels than channels: column tiles (im2col per tile; a 1x1
        // read in place); the next two fewer: blocks of output rows (output channels out of
        // whole panels, or one tap); the next three run direct (`crate::cpu::direct`), their
        // inner dimension over several blocks: small output planes (stride 1 and 2), and a
        // larger one of whole panels; then a stem of three channels, column tiles; the last
        // three pointwise on small planes, direct: into many channels, one reading its input
        // in place, over two blocks of the inner dimension, the other (at stride 2) padded;
        // and from many channels into a few on 14x14.
        let cases = [
            (16, [33, 31], 24, 3, 1, 1, false),
            (64, [33, 31], 40, 1, 1, 0, false),
            (64, [37, 35], 168, 3, 2, 1, false),
            (192, [7, 7], 128, 1, 1, 0, false),
            (64, [9, 7], 160, 3, 1, 1, true),
            (64, [17, 15], 160, 3, 2, 1, true),
            (32, [37, 35], 48, 3, 1, 1, true),
            (3, [40, 38], 32, 3, 2, 1, false),
            (320, [7, 7], 256, 1, 1, 0, true),
            (64, [15, 15], 256, 1, 2, 0, true),
            (256, [14, 14], 32, 1, 1, 0, true),
        ];
        for (c, hw, oc, k, s, p, direct) in cases {
            let cv = conv(c, hw, oc, [k, k], [s, s], [p, p], [p, p], [1, 1], 1);
            assert_eq!(cv.direct().is_some(), direct, "{cv:?}");
            check_against_reference(&cv);
        }
    }

    /// Groups of 16 input channels or more into whole panels of outputs run direct, group by
    /// group (each its planes, panels, biases and rows; ResNeXt's deeper layers), and groups
    /// of eight outputs on small planes two at a time (RegNet's; an odd count's last by
    /// im2col): the reference's on small and larger planes, at stride 1 and 2, with an input
    /// activation; groups of fewer channels, of outputs out of whole panels (eight on a large
    /// plane), or of one tap keep im2col.
    #[test]
    fn grouped_convolutions_of_whole_panels_match_the_reference() {
        // (channels a group, [h, w], outputs a group, groups, kernel, stride, runs direct)
        let cases = [
            (16, [14, 14], 16, 4, 3, 1, true),
            (24, [9, 11], 32, 3, 3, 2, true),
            (16, [30, 29], 16, 2, 3, 1, true),
            (8, [14, 14], 16, 4, 3, 1, false),
            (16, [14, 14], 8, 4, 3, 1, true),
            (8, [14, 14], 8, 6, 3, 1, true),
            (8, [7, 7], 8, 5, 3, 1, true),
            (8, [13, 14], 8, 3, 3, 2, true),
            (8, [30, 29], 8, 4, 3, 1, false),
            (16, [7, 7], 32, 2, 1, 1, false),
            (8, [7, 7], 8, 4, 1, 1, false),
        ];
        for (cg, hw, og, groups, k, s, direct) in cases {
            let p = k / 2;
            let (stride, pad) = ([s, s], [p, p]);
            let mut cv = conv(
                cg * groups,
                hw,
                og * groups,
                [k, k],
                stride,
                pad,
                pad,
                [1, 1],
                groups,
            );
            assert_eq!(cv.direct().is_some(), direct, "{cv:?}");
            check_against_reference(&cv);
            cv.pre_act = Activation::Relu;
            check_against_reference(&cv);
        }
    }

    /// The weights repacked once for the direct convolution (as the CPU device does before
    /// the first run) give the bits of the weights repacked on every run, a residual and an
    /// NHWC layout included; convolutions that do not run direct have nothing to repack.
    #[test]
    fn weights_repacked_once_give_the_same_outputs() {
        let base = conv(24, [9, 11], 40, [3, 3], [2, 1], [1, 1], [1, 1], [1, 1], 1);
        let with_residual = Conv {
            residual: Some(4),
            act: Activation::Tanh,
            ..base.clone()
        };
        let nhwc = Conv {
            nhwc: true,
            ..base.clone()
        };
        for s in [base.clone(), with_residual, nhwc] {
            let [_, c, h, w] = s.input;
            let (x, wt, bias) = (
                values(c * h * w, 1),
                values(s.out_channels * s.col_rows(), 2),
                values(s.out_channels, 3),
            );
            let z = values(s.out_len(), 4);
            let panels = s.panels_cpu(&wt).unwrap();
            let run = |panels: Option<&[f32]>| {
                let mut y = vec![f32::NAN; s.out_len()];
                let reads = vec![(0, &x[..]), (1, &wt[..]), (2, &bias[..]), (4, &z[..])];
                s.run_cpu_packed(&mut CpuIo::of(reads, vec![(3, &mut y[..])]), panels)
                    .unwrap();
                y
            };
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            assert_eq!(bits(run(Some(&panels))), bits(run(None)), "{s:?}");
        }
        let pointwise = conv(24, [9, 11], 40, [1, 1], [1, 1], [0, 0], [0, 0], [1, 1], 1);
        let large = conv(8, [40, 40], 16, [3, 3], [1, 1], [1, 1], [1, 1], [1, 1], 1);
        let grouped = conv(24, [9, 11], 48, [3, 3], [1, 1], [1, 1], [1, 1], [1, 1], 2);
        for s in [pointwise, large, grouped] {
            let wt = values(s.out_channels * s.col_rows(), 2);
            assert!(s.panels_cpu(&wt).is_none(), "{s:?}");
        }
        // Weights shorter than their shape are not repacked (nor read past).
        assert!(base.panels_cpu(&values(10, 2)).is_none());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Depthwise convolutions with an input activation, on the CPU kernel and as the CUDA
        /// kernel computes them: any stride, dilation and (asymmetric) padding.
        #[test]
        fn depthwise_convolutions_with_an_input_activation_match_the_reference(
            c in 2usize..5, h in 1usize..10, w in 1usize..10, k in 1usize..6, s in 1usize..3,
            d in 1usize..3, p in 0usize..3, pe in 0usize..3, leaky in proptest::bool::ANY,
        ) {
            prop_assume!(h + p + pe > d * (k - 1) && w + p + pe > d * (k - 1));
            let mut cv = conv(c, [h, w], c, [k, k], [s, s], [p, p], [pe, pe], [d, d], c);
            cv.pre_act = if leaky { Activation::LeakyRelu { alpha: 0.1 } } else { Activation::Relu };
            cv.act = Activation::Sigmoid;
            prop_assert!(cv.is_depthwise());
            check_against_reference(&cv);
        }

        #[test]
        fn im2col_of_any_column_range_is_that_part_of_the_whole(
            c in 1usize..4, h in 1usize..12, w in 1usize..12, k in 1usize..4, s in 1usize..3,
            p0 in 0usize..3, p1 in 0usize..3, d in 1usize..3, cut in 0.0f64..1.0, len in 0.0f64..1.0,
        ) {
            prop_assume!(h + 2 * p0 > d * (k - 1) && w + 2 * p1 > d * (k - 1));
            let cv = conv(c, [h, w], 2, [k, k], [s, s], [p0, p1], [p0, p1], [d, d], 1);
            let n = cv.out_hw[0] * cv.out_hw[1];
            let x = values(c * h * w, 5);
            let mut planes = vec![f32::NAN; c * cv.windows().scratch_len()];
            cv.pad_planes(&x, None, &mut planes);
            let mut whole = vec![f32::NAN; cv.col_rows() * n];
            cv.im2col(&planes, 0, 0..n, &mut whole);
            let start = ((n as f64 * cut) as usize).min(n - 1);
            let end = start + 1 + ((n - start - 1) as f64 * len) as usize;
            let mut part = vec![f32::NAN; cv.col_rows() * (end - start)];
            cv.im2col(&planes, 0, start..end, &mut part);
            for (r, row) in part.chunks(end - start).enumerate() {
                prop_assert_eq!(row, &whole[r * n + start..r * n + end]);
            }
        }

        #[test]
        fn convolutions_match_the_reference(
            cg in 1usize..4, groups in 1usize..5, oc in 1usize..10, h in 3usize..20,
            w in 3usize..20, kh in 1usize..4, kw in 1usize..6, sh in 1usize..3, sw in 1usize..4,
            pad in proptest::array::uniform4(0usize..3), dh in 1usize..3, dw in 1usize..3,
            leaky_before in any::<bool>(),
        ) {
            // `cg` channels a group: 1 is depthwise (sliding windows), more im2col (from
            // padded planes, where the input activation applies and the padding stays zero).
            prop_assume!(h + pad[0] + pad[2] > dh * (kh - 1) && w + pad[1] + pad[3] > dw * (kw - 1));
            let mut cv = conv(cg * groups, [h, w], oc * groups, [kh, kw], [sh, sw],
                [pad[0], pad[1]], [pad[2], pad[3]], [dh, dw], groups);
            if leaky_before {
                cv.pre_act = Activation::LeakyRelu { alpha: 0.1 };
            }
            check_against_reference(&cv);
        }
    }

    proptest::proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Convolutions whose windows read mostly padding (dilated past the input, as
        /// DeepLab's), summed tap by tap over the pixels each tap reads: the reference's,
        /// with an input activation, any stride, asymmetric padding, and taps that read
        /// nothing at all; more than one block of output channels.
        #[test]
        fn convolutions_of_mostly_padding_match_the_reference(
            c in 1usize..6, many in any::<bool>(), h in 1usize..12, w in 1usize..12,
            kh in 1usize..4, kw in 1usize..4, s in 1usize..3, d in 2usize..12,
            pad in proptest::array::uniform4(0usize..12), leaky in any::<bool>(),
        ) {
            let oc = if many { TAP_BLOCK + 3 } else { 5 };
            prop_assume!(h + pad[0] + pad[2] > d * (kh - 1) && w + pad[1] + pad[3] > d * (kw - 1));
            let mut cv = conv(c, [h, w], oc, [kh, kw], [s, s], [pad[0], pad[1]],
                [pad[2], pad[3]], [d, d], 1);
            prop_assume!(cv.live_taps().is_some());
            if leaky {
                cv.pre_act = Activation::LeakyRelu { alpha: 0.1 };
            }
            check_against_reference(&cv);
        }
    }

    /// Dilated depthwise convolutions at stride one whose sizes the dilation divides run
    /// phase by phase, undilated (DeepLabV3's 5x5 dilated 2 on 14x14; 3x3 dilated 2 and 3):
    /// against the reference image by image, more channels than a group of planes; those the
    /// dilation does not divide, or with an input activation, keep the window loops.
    #[test]
    fn dilated_depthwise_planes_by_phases_match_the_reference() {
        let cases = [
            (19, 14, 5, 1, 2),
            (300, 14, 5, 1, 2),
            (10, 16, 3, 1, 2),
            (7, 24, 3, 1, 3),
            (5, 28, 5, 1, 2),
        ];
        for &(c, side, k, _, d) in &cases {
            let p = d * (k / 2);
            let cv = conv(
                c,
                [side, side],
                c,
                [k, k],
                [1, 1],
                [p, p],
                [p, p],
                [d, d],
                c,
            );
            assert!(cv.dilated_phases().is_some(), "{c} {side} {k} {d}");
        }
        depthwise_of_two_images_matches_the_reference(&cases, true, |_| true);
        let odd = conv(4, [15, 15], 4, [5, 5], [1, 1], [4, 4], [4, 4], [2, 2], 4);
        assert!(odd.dilated_phases().is_none());
        let strided = conv(4, [16, 16], 4, [3, 3], [2, 2], [2, 2], [2, 2], [2, 2], 4);
        assert!(strided.dilated_phases().is_none());
    }

    /// Depthwise convolutions of small strided planes run eight channels at a time (`lanes`):
    /// more channels than a group, a partial group, groups across images, dilation, an input
    /// bias and activation; against the reference image by image.
    #[test]
    fn small_depthwise_planes_in_lanes_match_the_reference() {
        let cases = [
            (19, 14, 5, 2, 1),
            (19, 13, 3, 2, 1),
            (8, 9, 3, 2, 2),
            (3, 5, 3, 2, 1),
            (20, 12, 3, 3, 1),
        ];
        depthwise_of_two_images_matches_the_reference(&cases, false, lanes::suits);
    }

    /// Depthwise convolutions at stride one run a group of planes at a time
    /// (`cpu::depthwise::sums`): groups that end inside an image and across two, 7x7 planes
    /// (rows narrower than a vector), 3x3, 5x5 and 7x7 windows, an input bias and activation;
    /// against the reference image by image.
    #[test]
    fn stride_one_depthwise_planes_in_groups_match_the_reference() {
        let cases = [
            (200, 7, 5, 1, 1),
            (19, 14, 3, 1, 1),
            (33, 12, 7, 1, 1),
            (3, 30, 3, 1, 1),
        ];
        depthwise_of_two_images_matches_the_reference(&cases, false, |win| {
            depthwise::suits(win) || !depthwise::available()
        });
    }

    /// Without an input bias or activation the planes run straight from the input
    /// (`cpu::depthwise::unpadded`, its zero row and masked lanes for the padding) with the
    /// clip fused: two images, planes narrower than a vector and several vectors wide, 3x3
    /// and 5x5 windows at stride one and two; against the reference image by image.
    #[test]
    fn depthwise_planes_of_plain_inputs_match_the_reference() {
        let cases = [
            (200, 7, 5, 1, 1),
            (19, 14, 3, 1, 1),
            (3, 30, 3, 1, 1),
            (5, 21, 5, 1, 1),
            (19, 14, 3, 2, 1),
            (40, 14, 5, 2, 1),
            (3, 37, 5, 2, 1),
        ];
        depthwise_of_two_images_matches_the_reference(&cases, true, |win| {
            depthwise::unpadded_suits(win) || !depthwise::available()
        });
    }

    /// Two images of each case's depthwise convolution (channels, square side, window,
    /// stride, dilation), which `runs_there` says the kernel meant runs, against the reference:
    /// with an input bias and activation and a swish after, or where `plain` with neither and
    /// a clip to [0, 6] after.
    fn depthwise_of_two_images_matches_the_reference(
        cases: &[(usize, usize, usize, usize, usize)],
        plain: bool,
        runs_there: impl Fn(&Windows) -> bool,
    ) {
        for &(c, side, k, s, d) in cases {
            let p = d * (k / 2);
            let mut cv = conv(
                c,
                [side, side],
                c,
                [k, k],
                [s, s],
                [p, p],
                [p, p],
                [d, d],
                c,
            );
            cv.input[0] = 2;
            (cv.pre_act, cv.act) = match plain {
                false => (
                    Activation::LeakyRelu { alpha: 0.1 },
                    Activation::Swish { alpha: 1.0 },
                ),
                true => (
                    Activation::None,
                    Activation::Clip {
                        min: Some(0.0),
                        max: Some(6.0),
                    },
                ),
            };
            assert!(runs_there(&cv.windows()), "{c} {side} {k} {s} {d}");
            let plane = side * side;
            let (x, wt) = (values(2 * c * plane, 1), values(c * k * k, 2));
            let bias = values(c, 3);
            let in_bias = if plain { vec![0.0; c] } else { values(c, 4) };
            let mut y = vec![f32::NAN; cv.out_len()];
            let given_in_bias = (!plain).then_some(&in_bias[..]);
            cv.compute(&x, &wt, None, Some(&bias), given_in_bias, &mut y)
                .unwrap();
            let per = y.len() / 2;
            for img in 0..2 {
                let xa: Vec<f32> = x[img * c * plane..(img + 1) * c * plane]
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| act(v + in_bias[i / plane], cv.pre_act))
                    .collect();
                let want = crate::reference::conv2d(
                    &xa,
                    &wt,
                    Some(&bias),
                    [1, c, side, side],
                    c,
                    cv.kernel,
                    cv.stride,
                    cv.padding,
                    cv.dilation,
                    c,
                    cv.out_hw,
                    cv.act,
                );
                assert_close(&cv, &y[img * per..(img + 1) * per], &want);
            }
        }
    }

    /// DeepLab's atrous convolutions on a 14x14 map: dilated 24 and 36, only the centre tap
    /// reads the input (a 1x1 convolution); dilated 12, the others read a band of two rows or
    /// columns; dilated 1, the ordinary one, is not summed tap by tap.
    #[test]
    fn atrous_convolutions_read_only_their_live_taps() {
        let aspp = |d: usize| conv(4, [14, 14], 3, [3, 3], [1, 1], [d, d], [d, d], [d, d], 1);
        for d in [24, 36] {
            let taps = aspp(d).live_taps().unwrap();
            assert_eq!(taps.len(), 1);
            assert_eq!(
                (taps[0].tap, taps[0].rows.clone(), taps[0].cols.clone()),
                ([1, 1], 0..14, 0..14)
            );
        }
        let taps = aspp(12).live_taps().unwrap();
        assert_eq!(taps.len(), 9);
        assert_eq!(
            taps.iter().map(TapRegion::pixels).sum::<usize>(),
            196 + 4 * 28 + 4 * 4
        );
        assert_eq!(
            (taps[0].rows.clone(), taps[0].cols.clone()),
            (12..14, 12..14)
        );
        assert!(aspp(1).live_taps().is_none());
        for d in [1, 12, 36] {
            check_against_reference(&aspp(d));
        }
    }

    #[test]
    fn the_kernel_is_chosen_among_those_the_api_allows() {
        use crate::tuning::Candidate;
        let precomp =
            dnn_sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
        let legacy = Candidate {
            algo: precomp as u32,
            math: M::CUDNN_TENSOR_OP_MATH as u32,
            ms: 0.020,
            workspace: 1024,
        };
        let engine = Candidate::of_engine(58, 2, 0.012, 4096);
        let opts = crate::KernelOptions::default();
        let pick = |c: &[Candidate], api| choice_of(c, &opts, api).unwrap();
        let want_engine = ConvChoice {
            kernel: Kernel::Engine(EngineRef {
                global: 58,
                rank: 2,
            }),
            workspace: 4096,
        };
        let want_legacy = ConvChoice {
            kernel: Kernel::Legacy {
                algo: precomp,
                math: M::CUDNN_TENSOR_OP_MATH,
            },
            workspace: 1024,
        };
        assert_eq!(pick(&[legacy, engine], ConvApi::Both), want_engine);
        assert_eq!(pick(&[legacy, engine], ConvApi::Backend), want_engine);
        assert_eq!(pick(&[legacy, engine], ConvApi::Legacy), want_legacy);
        // Its tuning numbers are the candidate's, so an epilogue key names it.
        assert_eq!(want_engine.code(), (engine.algo, engine.math));
        assert_eq!(want_legacy.code(), (legacy.algo, legacy.math));
        // Within the tie band the legacy algorithm (less workspace, lower number) wins.
        let close = Candidate {
            ms: 0.0199,
            ..engine
        };
        assert_eq!(pick(&[close, legacy], ConvApi::Both), want_legacy);
        // None allowed, or an engine over the workspace limit: no choice.
        assert!(choice_of(&[legacy], &opts, ConvApi::Backend).is_err());
        let tight = crate::KernelOptions {
            conv_workspace_limit: 2048,
            ..opts
        };
        assert_eq!(
            choice_of(&[legacy, engine], &tight, ConvApi::Both).unwrap(),
            want_legacy
        );
        // cuBLAS's product (no workspace) competes under Both alone.
        let gemm = Candidate {
            algo: crate::tuning::GEMM,
            math: 0,
            ms: 0.010,
            workspace: 0,
        };
        let want_gemm = ConvChoice {
            kernel: Kernel::Gemm,
            workspace: 0,
        };
        assert_eq!(pick(&[legacy, engine, gemm], ConvApi::Both), want_gemm);
        assert_eq!(want_gemm.code(), (gemm.algo, gemm.math));
        assert_eq!(pick(&[legacy, engine, gemm], ConvApi::Legacy), want_legacy);
        assert_eq!(pick(&[legacy, engine, gemm], ConvApi::Backend), want_engine);
        // Without TF32 a legacy algorithm runs in FMA math whatever it was measured with.
        let precise = crate::KernelOptions {
            tf32: false,
            ..opts
        };
        assert_eq!(
            choice_of(&[legacy], &precise, ConvApi::Both)
                .unwrap()
                .kernel,
            Kernel::Legacy {
                algo: precomp,
                math: M::CUDNN_FMA_MATH
            }
        );
    }

    #[test]
    fn searched_math_type_is_kept_unless_tf32_is_off() {
        assert_eq!(
            search_math(true, M::CUDNN_TENSOR_OP_MATH),
            M::CUDNN_TENSOR_OP_MATH
        );
        assert_eq!(search_math(true, M::CUDNN_FMA_MATH), M::CUDNN_FMA_MATH);
        assert_eq!(search_math(false, M::CUDNN_DEFAULT_MATH), M::CUDNN_FMA_MATH);
    }

    /// The unrolled and tiled depthwise kernels are candidates exactly where their `*_cases`
    /// have a case: a relu before, widths 3, 5 and 7, every index within 32 bits; the tiled
    /// one also at strides 1 and 2 only, without dilation along the width; the tiled one by
    /// fours (twos) where the tiled one has a case and every access is 16 (8) bytes.
    #[test]
    fn the_depthwise_kernels_are_timed_where_they_have_a_case() {
        let dw4 = |n: i64, k: i32, s: i32, d: i32, pre: Activation, width| CudaDepthwise {
            kernel: "depthwise_conv",
            y: 0,
            x: 0,
            w: 0,
            _held_w: None,
            bias: 0,
            nc: n * 168,
            c: 168,
            ximage: 168 * 42 * 42,
            xpix: 1,
            geo: [42, 42, 42, 42, k, k, s, s, k / 2, k / 2, d, d],
            pre: act_params(pre),
            act: act_params(Activation::None),
            in_bias: 0,
            _more: None,
            more: 0,
            nmore: 0,
            total: 0,
            items: 0,
            width,
        };
        let dw = |n, k, s, d, pre| dw4(n, k, s, d, pre, 1);
        let relu = Activation::Relu;
        let cases = |d: CudaDepthwise| (d.unrolls(), d.tiled_outputs());
        let wide = |d: CudaDepthwise| d.tiled_wide();
        let (fours, twos) = ("depthwise_conv_tiled4_nhwc", "depthwise_conv_tiled2_nhwc");
        use crate::tuning::{DEPTHWISE_TILED2, DEPTHWISE_TILED4};
        assert_eq!(
            wide(dw4(1, 5, 1, 1, relu, 4)),
            Some((DEPTHWISE_TILED4, fours, 16))
        );
        assert_eq!(
            wide(dw4(1, 7, 2, 1, relu, 4)),
            Some((DEPTHWISE_TILED4, fours, 8))
        );
        assert_eq!(
            wide(dw4(1, 5, 2, 1, relu, 2)),
            Some((DEPTHWISE_TILED2, twos, 4))
        );
        assert_eq!(wide(dw4(1, 5, 1, 1, relu, 1)), None);
        assert_eq!(wide(dw4(1, 5, 3, 1, relu, 4)), None);
        assert_eq!(wide(dw4(1, 5, 1, 1, Activation::None, 2)), None);
        // Summed inputs: unrolled, never tiled.
        let summed = CudaDepthwise {
            nmore: 2,
            ..dw4(1, 5, 1, 1, relu, 4)
        };
        assert_eq!(summed.tiled_wide(), None);
        assert_eq!(cases(summed), (true, None));
        assert_eq!(cases(dw(1, 5, 1, 1, relu)), (true, Some(4)));
        assert_eq!(cases(dw(16, 7, 1, 1, relu)), (true, Some(4)));
        assert_eq!(cases(dw(1, 3, 2, 1, relu)), (true, Some(2)));
        assert_eq!(cases(dw(1, 5, 3, 1, relu)), (true, None));
        assert_eq!(cases(dw(1, 5, 1, 2, relu)), (true, None));
        assert_eq!(cases(dw(1, 5, 1, 1, Activation::None)), (false, None));
        assert_eq!(cases(dw(1, 5, 1, 1, Activation::Sigmoid)), (false, None));
        assert_eq!(cases(dw(1, 4, 1, 1, relu)), (false, None));
        // 2^31 outputs or more: the kernels would take 64-bit indices.
        assert_eq!(cases(dw(8192, 5, 1, 1, relu)), (false, None));
    }
}
