//! The reference executor: a graph run on the CPU straight from the operator semantics
//! (terms, values, channel slices, every operator written with plain row-major loops).
//!
//! It shares nothing with the lowering of [`crate::program`] nor with the devices' kernels, so
//! comparing a device's results with it catches lowering and kernel mistakes (layouts, gather
//! offsets, the row/column-major gemm trick). It is slow (naive loops): use it on small inputs.
//!
//! It is also the semantic ground truth of the IR for real models: [`reference_with`] takes
//! the graph's weights ([`Graph::weights`]) and the caller's input arrays; the ONNX parity tests
//! (`crates/opsched/tests/parity.rs`) check it against onnxruntime within 1e-4.

use std::collections::HashMap;

use opsched_graph::{
    Activation, ElementwiseKind, Graph, NodeId, Op, PoolKind, ReduceKind, Shape, Tensor, Value,
};

use crate::program::{input_init, param_seed, uniform, weight_half_width};
use crate::GpuError;

/// The activation of one value. GELU is the exact (erf) form, as PyTorch's default.
pub fn act(x: f32, a: Activation) -> f32 {
    match a {
        Activation::None => x,
        Activation::Relu => x.max(0.0),
        Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Activation::Tanh => x.tanh(),
        Activation::Gelu => 0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2)),
        Activation::GeluTanh => {
            let c = (2.0 / std::f32::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044_715 * x * x * x)).tanh())
        }
        Activation::Clip { min, max } => {
            let lo = min.map_or(x, |m| x.max(m));
            max.map_or(lo, |m| lo.min(m))
        }
        Activation::LeakyRelu { alpha } => {
            if x >= 0.0 {
                x
            } else {
                alpha * x
            }
        }
        Activation::HardSigmoid { alpha, beta } => (alpha * x + beta).clamp(0.0, 1.0),
        Activation::HardSwish => x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
        // x * sigmoid(alpha x) as one division: no 0 * inf where exp overflows.
        Activation::Swish { alpha } => x / (1.0 + (-alpha * x).exp()),
        Activation::Softplus => softplus(x),
        Activation::Mish => x * softplus(x).tanh(),
        Activation::Sqrt => x.sqrt(),
        Activation::Reciprocal => 1.0 / x,
        Activation::Exp => x.exp(),
        Activation::Log => x.ln(),
        Activation::Neg => -x,
        Activation::Abs => x.abs(),
        Activation::Erf => erf(x),
        Activation::Sin => x.sin(),
        Activation::Cos => x.cos(),
        Activation::Elu { alpha } => {
            if x >= 0.0 {
                x
            } else {
                alpha * x.exp_m1()
            }
        }
        Activation::Selu { alpha, gamma } => {
            if x > 0.0 {
                gamma * x
            } else {
                gamma * (alpha * x.exp_m1())
            }
        }
        Activation::Celu { alpha } => x.max(0.0) + (alpha * (x / alpha).exp_m1()).min(0.0),
        Activation::ThresholdedRelu { alpha } => {
            if x > alpha {
                x
            } else {
                0.0
            }
        }
        Activation::Softsign => x / (1.0 + x.abs()),
        // signum is 1 at +0 and -1 at -0: ONNX's sign of zero is 0.
        Activation::Sign => {
            if x == 0.0 {
                0.0
            } else {
                x.signum()
            }
        }
        Activation::Floor => x.floor(),
        Activation::Ceil => x.ceil(),
        Activation::Round => x.round_ties_even(),
        Activation::IsNan => f32::from(u8::from(x.is_nan())),
        Activation::IsInf { negative, positive } => {
            let hit = x.is_infinite() && if x > 0.0 { positive } else { negative };
            f32::from(u8::from(hit))
        }
    }
}

/// `log(1 + exp(x))` without overflow: `max(x, 0) + log1p(exp(-|x|))` (onnxruntime's form).
pub fn softplus(x: f32) -> f32 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// The error function (Abramowitz and Stegun 7.1.26 in f64; absolute error below 1.5e-7).
pub fn erf(x: f32) -> f32 {
    let x = f64::from(x);
    let s = if x < 0.0 { -1.0 } else { 1.0 };
    let x = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let y = 1.0
        - (((((1.061_405_429 * t - 1.453_152_027) * t) + 1.421_413_741) * t - 0.284_496_736) * t
            + 0.254_829_592)
            * t
            * (-x * x).exp();
    (s * y) as f32
}

pub(crate) fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

/// Naive 2-D convolution, NCHW, weights `[oc, c/groups, kh, kw]`, optional bias, activation.
#[allow(clippy::too_many_arguments)]
pub fn conv2d(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    [n, c, h, wd]: [usize; 4],
    oc: usize,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    [oh, ow]: [usize; 2],
    a: Activation,
) -> Vec<f32> {
    let g = groups.max(1);
    let cg = c / g;
    let og = oc / g;
    let mut y = vec![0.0f32; n * oc * oh * ow];
    for b in 0..n {
        for o in 0..oc {
            let grp = o / og.max(1);
            for i in 0..oh {
                for j in 0..ow {
                    let mut acc = bias.map_or(0.0, |bb| bb[o]);
                    for ci in 0..cg {
                        let ch = grp * cg + ci;
                        for p in 0..kernel[0] {
                            let hi =
                                (i * stride[0] + p * dilation[0]) as isize - padding[0] as isize;
                            if hi < 0 || hi >= h as isize {
                                continue;
                            }
                            for q in 0..kernel[1] {
                                let wi = (j * stride[1] + q * dilation[1]) as isize
                                    - padding[1] as isize;
                                if wi < 0 || wi >= wd as isize {
                                    continue;
                                }
                                let xv = x[((b * c + ch) * h + hi as usize) * wd + wi as usize];
                                let wv = w[((o * cg + ci) * kernel[0] + p) * kernel[1] + q];
                                acc += xv * wv;
                            }
                        }
                    }
                    y[((b * oc + o) * oh + i) * ow + j] = act(acc, a);
                }
            }
        }
    }
    y
}

/// Pooling as PyTorch does it: windows start at `i * stride - pad`, end at most at
/// `input + pad`; max ignores padding, average divides by the window size counted up to that
/// end (padding included), before clipping to the input.
#[allow(clippy::too_many_arguments)]
pub fn pool2d(
    x: &[f32],
    dims: [usize; 4],
    out_hw: [usize; 2],
    max: bool,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> Vec<f32> {
    let window = PoolWindow {
        kernel,
        stride,
        begin: padding,
        end: padding,
        count_include_pad: true,
    };
    pool2d_padded(x, dims, out_hw, max, &window)
}

/// A pooling window: kernel, stride, padding before and after each spatial axis, and what an
/// average divides by.
#[derive(Clone, Copy, Debug)]
pub struct PoolWindow {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub begin: [usize; 2],
    pub end: [usize; 2],
    /// Divide by the window counted up to the end of the padding (else by the input elements
    /// it covers).
    pub count_include_pad: bool,
}

/// Pooling with padding that may differ before and after an axis (onnxruntime's and PyTorch's
/// semantics): windows start at `i * stride - begin` and end at most at `input + end`; max
/// ignores padding; an average divides by the window counted up to that end when
/// `count_include_pad`, else by the input elements in it.
pub fn pool2d_padded(
    x: &[f32],
    [n, c, h, w]: [usize; 4],
    [oh, ow]: [usize; 2],
    max: bool,
    win: &PoolWindow,
) -> Vec<f32> {
    let PoolWindow {
        kernel,
        stride,
        begin,
        end,
        count_include_pad,
    } = *win;
    let mut y = vec![0.0f32; n * c * oh * ow];
    for bc in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let hs = (i * stride[0]) as isize - begin[0] as isize;
                let ws = (j * stride[1]) as isize - begin[1] as isize;
                let he = (hs + kernel[0] as isize).min((h + end[0]) as isize);
                let we = (ws + kernel[1] as isize).min((w + end[1]) as isize);
                let padded = (he - hs) * (we - ws);
                let (hs, ws) = (hs.max(0), ws.max(0));
                let (he, we) = (he.min(h as isize), we.min(w as isize));
                let inside = (he - hs).max(0) * (we - ws).max(0);
                let size = if count_include_pad { padded } else { inside }.max(1) as f32;
                let mut m = f32::NEG_INFINITY;
                let mut s = 0.0f32;
                for p in hs..he {
                    for q in ws..we {
                        let v = x[(bc * h + p as usize) * w + q as usize];
                        m = m.max(v);
                        s += v;
                    }
                }
                y[(bc * oh + i) * ow + j] = if max { m } else { s / size };
            }
        }
    }
    y
}

/// Softmax over the middle axis of `[outer, dim, inner]`.
pub fn softmax(x: &[f32], outer: usize, dim: usize, inner: usize) -> Vec<f32> {
    over_middle_axis(x, outer, dim, inner, |v, sum| v.exp() / sum)
}

/// Log-softmax over the middle axis of `[outer, dim, inner]`: `x - max - ln(sum(exp(x - max)))`.
pub fn log_softmax(x: &[f32], outer: usize, dim: usize, inner: usize) -> Vec<f32> {
    over_middle_axis(x, outer, dim, inner, |v, sum| v - sum.ln())
}

/// `f(x - max, sum(exp(x - max)))` along the middle axis of `[outer, dim, inner]` (the
/// maximum is subtracted first so that `exp` cannot overflow).
fn over_middle_axis(
    x: &[f32],
    outer: usize,
    dim: usize,
    inner: usize,
    f: impl Fn(f32, f32) -> f32,
) -> Vec<f32> {
    let mut y = vec![0.0f32; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |d: usize| (o * dim + d) * inner + i;
            let m = (0..dim).map(|d| x[at(d)]).fold(f32::NEG_INFINITY, f32::max);
            let s: f32 = (0..dim).map(|d| (x[at(d)] - m).exp()).sum();
            for d in 0..dim {
                y[at(d)] = f(x[at(d)] - m, s);
            }
        }
    }
    y
}

/// `x` (of `shape`) repeated along the axes where it has size 1 (or fewer axes) to `to`, as
/// numpy broadcasts. `shape` must broadcast to `to`.
pub fn broadcast_to(x: &[f32], shape: &[usize], to: &[usize]) -> Vec<f32> {
    if shape == to {
        return x.to_vec();
    }
    let r = to.len();
    let skip = r - shape.len();
    // Strides of `x` over the axes of `to`, 0 where it repeats.
    let mut strides = vec![0usize; r];
    let mut acc = 1usize;
    for a in (0..shape.len()).rev() {
        if shape[a] != 1 {
            strides[skip + a] = acc;
        }
        acc *= shape[a];
    }
    let total = numel(to);
    let mut y = Vec::with_capacity(total);
    let mut idx = vec![0usize; r];
    for _ in 0..total {
        y.push(x[idx.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>()]);
        for a in (0..r).rev() {
            idx[a] += 1;
            if idx[a] < to[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    y
}

/// Constant padding of every axis: `begin[a]` and `end[a]` elements of `value` around axis `a`.
pub fn pad(x: &[f32], shape: &[usize], begin: &[usize], end: &[usize], value: f32) -> Vec<f32> {
    let out: Vec<usize> = shape
        .iter()
        .zip(begin.iter().zip(end))
        .map(|(&d, (&b, &e))| d + b + e)
        .collect();
    let mut y = vec![value; numel(&out)];
    let r = shape.len();
    let mut out_strides = vec![1usize; r];
    for a in (0..r.saturating_sub(1)).rev() {
        out_strides[a] = out_strides[a + 1] * out[a + 1];
    }
    let mut idx = vec![0usize; r];
    for &v in x {
        let at: usize = (0..r).map(|a| (idx[a] + begin[a]) * out_strides[a]).sum();
        y[at] = v;
        for a in (0..r).rev() {
            idx[a] += 1;
            if idx[a] < shape[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    y
}

/// Resize of `[n, c, h, w]` by `r`: per output element, its row's and column's taps
/// ([`opsched_graph::Resize::taps`]) blended ([`opsched_graph::resize::Tap::blend`]).
pub fn resize(x: &[f32], shape: &[usize], r: &opsched_graph::Resize) -> Vec<f32> {
    let [n, c, h, w] = shape else {
        return Vec::new();
    };
    let (rows, cols) = (r.taps(0, *h), r.taps(1, *w));
    let mut y = Vec::with_capacity(n * c * rows.len() * cols.len());
    for plane in x.chunks(h * w).take(n * c) {
        for rt in &rows {
            let (lo, hi) = (&plane[rt.lo * w..][..*w], &plane[rt.hi * w..][..*w]);
            for ct in &cols {
                let v = [lo[ct.lo], lo[ct.hi], hi[ct.lo], hi[ct.hi]];
                y.push(opsched_graph::resize::Tap::blend(r.mode, rt, ct, v));
            }
        }
    }
    y
}

/// `x` viewed as `[outer, red, inner]` reduced over its middle axis by `kind`, the elements
/// in order.
pub fn reduce(x: &[f32], red: usize, inner: usize, kind: ReduceKind) -> Vec<f32> {
    let outer = x.len() / (red * inner).max(1);
    let mut y = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let (mut acc, mut at) = (kind.start(), 0);
            for r in 0..red {
                let v = x[(o * red + r) * inner + i];
                if kind.replaces(v, acc) {
                    at = r;
                }
                acc = kind.step(acc, v);
            }
            y.push(match kind {
                _ if kind.is_index() => at as f32,
                ReduceKind::LogSumExp => {
                    let sum = (0..red).map(|r| (x[(o * red + r) * inner + i] - acc).exp());
                    ReduceKind::log_sum_exp(acc, sum.fold(0.0, |s, e| s + e))
                }
                _ => kind.finish(acc, red),
            });
        }
    }
    y
}

/// Layer norm over the last axis of `[rows, dim]` (biased variance, as PyTorch).
pub fn layer_norm(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    rows: usize,
    dim: usize,
    eps: f32,
) -> Vec<f32> {
    let mut y = vec![0.0f32; x.len()];
    for r in 0..rows {
        let row = &x[r * dim..(r + 1) * dim];
        let mean = row.iter().sum::<f32>() / dim as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / dim as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for d in 0..dim {
            y[r * dim + d] = (row[d] - mean) * inv * gamma[d] + beta[d];
        }
    }
    y
}

/// Permute axes: the output has shape `perm.map(|p| shape[p])`.
pub fn transpose(x: &[f32], shape: &[usize], perm: &[usize]) -> Vec<f32> {
    let r = shape.len();
    let mut in_strides = vec![1usize; r];
    for i in (0..r.saturating_sub(1)).rev() {
        in_strides[i] = in_strides[i + 1] * shape[i + 1];
    }
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let total = numel(shape);
    let mut y = vec![0.0f32; total];
    let mut idx = vec![0usize; r];
    for (o, slot) in y.iter_mut().enumerate() {
        // Decompose o in the output shape.
        let mut rem = o;
        for d in (0..r).rev() {
            idx[d] = rem % out_shape[d];
            rem /= out_shape[d];
        }
        let src: usize = (0..r).map(|d| idx[d] * in_strides[perm[d]]).sum();
        *slot = x[src];
    }
    y
}

/// Column-major strided-batched gemm, cuBLAS semantics: `C = op(A) op(B)`.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    ldb: usize,
    ldc: usize,
    strides: [usize; 3],
    batch: usize,
) {
    for bi in 0..batch {
        let (oa, ob, oc) = (bi * strides[0], bi * strides[1], bi * strides[2]);
        for j in 0..n {
            for i in 0..m {
                let mut acc = 0.0f32;
                for p in 0..k {
                    let av = if trans_a {
                        a[oa + p + i * lda]
                    } else {
                        a[oa + i + p * lda]
                    };
                    let bv = if trans_b {
                        b[ob + j + p * ldb]
                    } else {
                        b[ob + p + j * ldb]
                    };
                    acc += av * bv;
                }
                c[oc + i + j * ldc] = acc;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reference executor: straight from the operator semantics.

fn value(g: &Graph, outs: &[Option<Vec<f32>>], v: &Value) -> Result<(Vec<f32>, Shape), GpuError> {
    let node = g.node(v.node);
    let data = outs[v.node.index()]
        .as_ref()
        .ok_or_else(|| GpuError::Plan(format!("reference: '{}' has no value yet", node.name)))?;
    match v.channels {
        None => Ok((data.clone(), node.shape.clone())),
        Some((b, e)) => {
            let s = &node.shape;
            let (n, c, inner) = (s[0], s[1], numel(&s[2..]));
            let mut out = Vec::with_capacity(n * (e - b) * inner);
            for i in 0..n {
                out.extend_from_slice(&data[(i * c + b) * inner..(i * c + e) * inner]);
            }
            let mut shape = s.clone();
            shape[1] = e - b;
            Ok((out, shape))
        }
    }
}

fn term(g: &Graph, outs: &[Option<Vec<f32>>], t: &[Value]) -> Result<(Vec<f32>, Shape), GpuError> {
    let mut acc: Option<(Vec<f32>, Shape)> = None;
    for v in t {
        let (d, s) = value(g, outs, v)?;
        match &mut acc {
            None => acc = Some((d, s)),
            Some((a, _)) => a.iter_mut().zip(&d).for_each(|(x, y)| *x += y),
        }
    }
    acc.ok_or_else(|| GpuError::Plan("reference: empty term".into()))
}

fn concat(parts: &[(Vec<f32>, Shape)], axis: usize) -> (Vec<f32>, Shape) {
    if parts.len() == 1 {
        return parts[0].clone();
    }
    let first = &parts[0].1;
    let outer = numel(&first[..axis]);
    let mut shape = first.clone();
    shape[axis] = parts.iter().map(|p| p.1[axis]).sum();
    let mut out = Vec::with_capacity(numel(&shape));
    for o in 0..outer {
        for (d, s) in parts {
            let chunk = numel(&s[axis..]);
            out.extend_from_slice(&d[o * chunk..(o + 1) * chunk]);
        }
    }
    (out, shape)
}

/// A parameter: the graph's weight when it has one, else seeded uniform values around `c`.
#[allow(clippy::too_many_arguments)]
fn param(
    g: &Graph,
    node: NodeId,
    inner: usize,
    what: &str,
    len: usize,
    c: f32,
    hw: f32,
) -> Result<Vec<f32>, GpuError> {
    match g.weights().get(node, inner, what) {
        Some(t) if t.numel() == len => Ok(t.data.to_vec()),
        Some(t) => Err(GpuError::Unsupported {
            node: g.node(node).name.clone(),
            message: format!(
                "weight '{what}' has {} values, the operator needs {len}",
                t.numel()
            ),
        }),
        None => Ok(uniform(param_seed(g, node, inner, what), len, c, hw)),
    }
}

fn normalize_axis(axis: i64, rank: usize) -> usize {
    if axis < 0 {
        (rank as i64 + axis) as usize
    } else {
        axis as usize
    }
}

/// The arithmetic of the products (convolutions, linear layers, batch matmuls): strict `f32`,
/// or their operands rounded to TF32 first (10-bit mantissas, to nearest with ties away from
/// zero, as the tensor cores' conversion does; the sums stay `f32`), which tells how far the
/// GPU's default math may take a model's values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Math {
    #[default]
    F32,
    Tf32,
}

impl Math {
    /// `v` as the products read it.
    fn operand(self, v: &[f32]) -> std::borrow::Cow<'_, [f32]> {
        match self {
            Math::F32 => v.into(),
            Math::Tf32 => v.iter().map(|&x| tf32(x)).collect::<Vec<_>>().into(),
        }
    }
}

/// `x` rounded to TF32's 10-bit mantissa, to nearest with ties away from zero; infinities and
/// NaNs unchanged.
pub fn tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    f32::from_bits(x.to_bits().wrapping_add(0x1000) & !0x1fff)
}

fn eval(
    g: &Graph,
    (node, math): (NodeId, Math),
    op: &Op,
    inner: usize,
    inputs: Vec<(Vec<f32>, Shape)>,
    out_shape: &[usize],
) -> Result<Vec<f32>, GpuError> {
    let name = || g.node(node).name.clone();
    let unsup = |m: &str| GpuError::Unsupported {
        node: name(),
        message: m.to_string(),
    };
    let single = || concat(&inputs, 1);
    let y = match op {
        Op::Input { .. } | Op::Constant { .. } => {
            return Err(unsup("an input or constant is not evaluated"))
        }
        Op::Abstract { .. } => vec![0.0; numel(out_shape).max(1)],
        Op::Opaque { op_type, .. } => {
            return Err(unsup(&format!(
                "'{op_type}' is an opaque operator without semantics"
            )))
        }
        Op::Conv2d(c) => {
            let (x, s) = single();
            let fan_in = s[1] / c.groups.max(1) * c.kernel[0] * c.kernel[1];
            let w = param(
                g,
                node,
                inner,
                "weight",
                c.out_channels * fan_in,
                0.0,
                weight_half_width(fan_in),
            )?;
            let b = match c.bias {
                true => Some(param(g, node, inner, "bias", c.out_channels, 0.0, 0.1)?),
                false => None,
            };
            conv2d(
                &math.operand(&x),
                &math.operand(&w),
                b.as_deref(),
                [s[0], s[1], s[2], s[3]],
                c.out_channels,
                c.kernel,
                c.stride,
                c.padding,
                c.dilation,
                c.groups,
                [out_shape[2], out_shape[3]],
                c.act,
            )
        }
        Op::Pool2d(p) => {
            let (x, s) = single();
            let (begin, end) = p.pads();
            let win = if p.kind.is_global() {
                PoolWindow {
                    kernel: [s[2], s[3]],
                    stride: [1, 1],
                    begin: [0, 0],
                    end: [0, 0],
                    count_include_pad: true,
                }
            } else {
                PoolWindow {
                    kernel: p.kernel,
                    stride: p.stride,
                    begin,
                    end,
                    count_include_pad: p.count_include_pad,
                }
            };
            pool2d_padded(
                &x,
                [s[0], s[1], s[2], s[3]],
                [out_shape[2], out_shape[3]],
                matches!(p.kind, PoolKind::Max | PoolKind::GlobalMax),
                &win,
            )
        }
        Op::Activation { act: a } => single().0.into_iter().map(|v| act(v, *a)).collect(),
        Op::Elementwise { kind } => {
            let mut it = inputs.iter();
            let (first, fs) = it.next().ok_or_else(|| unsup("no inputs"))?;
            let mut acc = broadcast_to(first, fs, out_shape);
            for (d, s) in it {
                let d = broadcast_to(d, s, out_shape);
                for (x, y) in acc.iter_mut().zip(&d) {
                    match kind {
                        ElementwiseKind::Add => *x += y,
                        ElementwiseKind::Mul => *x *= y,
                    }
                }
            }
            acc
        }
        Op::Binary { kind } => {
            let [(a, sa), (b, sb)] = inputs.as_slice() else {
                return Err(unsup("a binary operator needs two inputs"));
            };
            let a = broadcast_to(a, sa, out_shape);
            let b = broadcast_to(b, sb, out_shape);
            a.iter().zip(&b).map(|(&x, &y)| kind.apply(x, y)).collect()
        }
        Op::Expand { .. } => {
            let (x, s) = single();
            broadcast_to(&x, &s, out_shape)
        }
        Op::Where => {
            let [(c, sc), (a, sa), (b, sb)] = inputs.as_slice() else {
                return Err(unsup("where needs three inputs"));
            };
            let c = broadcast_to(c, sc, out_shape);
            let a = broadcast_to(a, sa, out_shape);
            let b = broadcast_to(b, sb, out_shape);
            c.iter()
                .zip(a.iter().zip(&b))
                .map(|(&c, (&x, &y))| opsched_graph::op::select(c, x, y))
                .collect()
        }
        Op::Affine => {
            let (x, s) = single();
            let c = s[1];
            let inner_len = numel(&s[2..]);
            let scale = param(g, node, inner, "scale", c, 1.0, 0.1)?;
            let shift = param(g, node, inner, "shift", c, 0.0, 0.1)?;
            x.iter()
                .enumerate()
                .map(|(i, &v)| {
                    let ch = (i / inner_len.max(1)) % c.max(1);
                    v * scale[ch] + shift[ch]
                })
                .collect()
        }
        Op::Pad { begin, end, value } => {
            let (x, s) = single();
            pad(&x, &s, begin, end, *value)
        }
        Op::Resize(r) => {
            let (x, s) = single();
            resize(&x, &s, r)
        }
        Op::Reduce {
            kind, begin, end, ..
        } => {
            let (x, s) = single();
            let (red, inner): (usize, usize) =
                (s[*begin..*end].iter().product(), s[*end..].iter().product());
            reduce(&x, red, inner, *kind)
        }
        Op::CumSum {
            axis,
            exclusive,
            reverse,
        } => {
            let (x, s) = single();
            let (n, inner): (usize, usize) = (s[*axis], s[axis + 1..].iter().product());
            let mut y = vec![0.0f32; x.len()];
            for (xo, yo) in x.chunks(n * inner).zip(y.chunks_mut(n * inner)) {
                for i in 0..inner {
                    let mut sum = 0.0f32;
                    for step in 0..n {
                        let r = if *reverse { n - 1 - step } else { step };
                        let v = xo[r * inner + i];
                        if !exclusive {
                            sum += v;
                        }
                        yo[r * inner + i] = sum;
                        if *exclusive {
                            sum += v;
                        }
                    }
                }
            }
            y
        }
        Op::GatherElements { axis } => {
            let [(x, sx), (idx, si)] = inputs.as_slice() else {
                return Err(unsup("gather_elements needs two inputs (data, indices)"));
            };
            let rank = si.len();
            let mut y = Vec::with_capacity(idx.len());
            let mut at = vec![0usize; rank];
            for &v in idx {
                let d = sx[*axis];
                let r = opsched_graph::op::table_row(v, d)
                    .ok_or_else(|| unsup(&format!("index {v} is outside an axis of {d}")))?;
                // The data's element at the output's coordinates, but `r` along the axis.
                let mut off = 0;
                for a in 0..rank {
                    let c = if a == *axis { r } else { at[a] };
                    off = off * sx[a] + c;
                }
                y.push(x[off]);
                // The next output coordinates, the last axis fastest.
                for a in (0..rank).rev() {
                    at[a] += 1;
                    if at[a] < si[a] {
                        break;
                    }
                    at[a] = 0;
                }
            }
            y
        }
        Op::Slice { axis, begin, end } => {
            let (x, s) = single();
            let inner: usize = s[axis + 1..].iter().product();
            let (dim, len) = (s[*axis], end - begin);
            x.chunks(dim * inner)
                .flat_map(|row| &row[begin * inner..(begin + len) * inner])
                .copied()
                .collect()
        }
        Op::Embedding { rows, dim } => {
            let (x, _) = single();
            let w = param(g, node, inner, "weight", rows * dim, 0.0, 1.0)?;
            let mut y = Vec::with_capacity(x.len() * dim);
            for &v in &x {
                let r = opsched_graph::op::table_row(v, *rows).ok_or_else(|| {
                    unsup(&format!("index {v} is no row of its {rows}-row table"))
                })?;
                y.extend_from_slice(&w[r * dim..][..*dim]);
            }
            y
        }
        Op::Concat { axis } => concat(&inputs, *axis).0,
        Op::Identity | Op::Reshape { .. } => single().0,
        Op::Linear {
            out_features,
            bias,
            act: a,
        } => {
            let (x, s) = single();
            let k = *s.last().unwrap_or(&1);
            let rows = x.len() / k.max(1);
            let nf = *out_features;
            let w = param(g, node, inner, "weight", nf * k, 0.0, weight_half_width(k))?;
            let (x, w) = (math.operand(&x), math.operand(&w));
            let b = match bias {
                true => Some(param(g, node, inner, "bias", nf, 0.0, 0.1)?),
                false => None,
            };
            let mut y = vec![0.0f32; rows * nf];
            for r in 0..rows {
                for o in 0..nf {
                    let mut acc = b.as_ref().map_or(0.0, |b| b[o]);
                    for p in 0..k {
                        acc += x[r * k + p] * w[o * k + p];
                    }
                    y[r * nf + o] = act(acc, *a);
                }
            }
            y
        }
        Op::BatchMatmul { transpose_b, alpha } => {
            let [(a, sa), (b, _)] = inputs.as_slice() else {
                return Err(unsup("batch_matmul needs two inputs"));
            };
            let (a, b) = (math.operand(a), math.operand(b));
            let r = sa.len();
            let (m, k) = (sa[r - 2], sa[r - 1]);
            let n = *out_shape.last().unwrap_or(&1);
            let batch = numel(&sa[..r - 2]);
            let mut y = vec![0.0f32; batch * m * n];
            for bi in 0..batch {
                for i in 0..m {
                    for j in 0..n {
                        let mut acc = 0.0;
                        for p in 0..k {
                            let bv = if *transpose_b {
                                b[bi * n * k + j * k + p]
                            } else {
                                b[bi * k * n + p * n + j]
                            };
                            acc += a[bi * m * k + i * k + p] * bv;
                        }
                        y[bi * m * n + i * n + j] = alpha * acc;
                    }
                }
            }
            y
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            let (x, s) = single();
            let ax = normalize_axis(*axis, s.len());
            let (outer, dim, rest) = (numel(&s[..ax]), s[ax], numel(&s[ax + 1..]));
            if matches!(op, Op::LogSoftmax { .. }) {
                log_softmax(&x, outer, dim, rest)
            } else {
                softmax(&x, outer, dim, rest)
            }
        }
        Op::LayerNorm { eps } => {
            let (x, s) = single();
            let d = *s.last().unwrap_or(&1);
            let gamma = param(g, node, inner, "gamma", d, 1.0, 0.1)?;
            let beta = param(g, node, inner, "beta", d, 0.0, 0.1)?;
            layer_norm(&x, &gamma, &beta, x.len() / d.max(1), d, *eps as f32)
        }
        Op::Transpose { perm } => {
            let (x, s) = single();
            transpose(&x, &s, perm)
        }
        Op::Sequential { ops } => {
            let mut cur = inputs;
            let mut shapes: Vec<Shape> = cur.iter().map(|c| c.1.clone()).collect();
            for (i, o) in ops.iter().enumerate() {
                let shape = o.infer_shape(&shapes).map_err(|m| unsup(&m))?;
                let y = eval(g, (node, math), o, i, cur, &shape)?;
                shapes = vec![shape.clone()];
                cur = vec![(y, shape)];
            }
            cur.pop()
                .map(|c| c.0)
                .ok_or_else(|| unsup("empty sequential"))?
        }
    };
    Ok(y)
}

/// Run `g` on the CPU from its semantics; returns every node's output (graph inputs included),
/// indexed by `NodeId`. Inputs, constants and parameters are the same pseudo-random data the
/// GPU program uses (see [`crate::program`]) unless the graph has weights for them. Only `f32`
/// graphs.
pub fn reference(g: &Graph) -> Result<Vec<Option<Vec<f32>>>, GpuError> {
    reference_with(g, &HashMap::new())
}

/// [`reference`](fn@reference) with the caller's values for some (or all) graph inputs; each must have the
/// input's shape. Parameters and constants come from the graph's weights where it has them.
pub fn reference_with(
    g: &Graph,
    inputs: &HashMap<NodeId, Tensor>,
) -> Result<Vec<Option<Vec<f32>>>, GpuError> {
    reference_in(g, inputs, Math::F32)
}

/// [`reference_with`] with the products' arithmetic `math`.
pub fn reference_in(
    g: &Graph,
    inputs: &HashMap<NodeId, Tensor>,
    math: Math,
) -> Result<Vec<Option<Vec<f32>>>, GpuError> {
    if g.dtype != opsched_graph::DType::F32 {
        return Err(GpuError::UnsupportedDType(g.dtype.to_string()));
    }
    for (&id, t) in inputs {
        let node = g
            .nodes()
            .get(id.index())
            .filter(|n| n.op.is_graph_input())
            .ok_or_else(|| {
                GpuError::Plan(format!("reference: node #{} is no graph input", id.0))
            })?;
        if t.shape != node.shape {
            return Err(GpuError::Unsupported {
                node: node.name.clone(),
                message: format!(
                    "input has shape {:?}, the graph needs {:?}",
                    t.shape, node.shape
                ),
            });
        }
    }
    let mut outs: Vec<Option<Vec<f32>>> = vec![None; g.len()];
    for &id in g.topo_order() {
        let node = g.node(id);
        let y = match &node.op {
            Op::Input { .. } => match inputs.get(&id) {
                Some(t) => t.data.to_vec(),
                None => input_init(g, id)
                    .values(numel(&node.shape))
                    .unwrap_or_default(),
            },
            Op::Constant { shape } => match g.weights().get(id, 0, "value") {
                Some(t) => t.data.to_vec(),
                None => input_init(g, id).values(numel(shape)).unwrap_or_default(),
            },
            op => {
                let inputs = node
                    .inputs
                    .iter()
                    .map(|t| term(g, &outs, t))
                    .collect::<Result<Vec<_>, _>>()?;
                eval(g, (id, math), op, 0, inputs, &node.shape)?
            }
        };
        outs[id.index()] = Some(y);
    }
    Ok(outs)
}

/// How far `got` is from `want`: the largest absolute difference divided by the largest
/// absolute reference value (at least 1), so the measure is scale-free for large activations
/// and absolute for small ones.
pub fn scaled_error(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let scale = want.iter().fold(1.0f64, |m, v| m.max(f64::from(v.abs())));
    let mut worst = 0.0f64;
    for (a, b) in got.iter().zip(want) {
        let d = f64::from(*a) - f64::from(*b);
        if !d.is_finite() {
            return f64::INFINITY;
        }
        worst = worst.max(d.abs());
    }
    worst / scale
}

/// The graph's outputs ([`Graph::outputs`]) from a run's node values, by output name.
pub fn outputs(g: &Graph, values: &[Option<Vec<f32>>]) -> Result<Vec<(String, Tensor)>, GpuError> {
    g.outputs()
        .iter()
        .map(|o| {
            let (data, shape) = value(g, values, &o.value)?;
            let t = Tensor::new(shape, data).map_err(GpuError::Plan)?;
            Ok((o.name.clone(), t))
        })
        .collect()
}
