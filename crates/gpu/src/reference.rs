//! The reference executor: a graph run on the CPU straight from the operator semantics
//! (terms, values, channel slices, every operator written with plain row-major loops).
//!
//! It shares nothing with the lowering of [`crate::program`] nor with the devices' kernels, so
//! comparing a device's results with it catches lowering and kernel mistakes (layouts, gather
//! offsets, the row/column-major gemm trick). It is slow (naive loops): use it on small inputs.

use opsched_graph::{Activation, ElementwiseKind, Graph, NodeId, Op, PoolKind, Shape, Value};

use crate::program::{input_seed, param_seed, uniform, weight_half_width};
use crate::GpuError;

/// The activation of one value. GELU is the exact (erf) form, as PyTorch's default.
pub fn act(x: f32, a: Activation) -> f32 {
    match a {
        Activation::None => x,
        Activation::Relu => x.max(0.0),
        Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Activation::Tanh => x.tanh(),
        Activation::Gelu => 0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2)),
    }
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
    [n, c, h, w]: [usize; 4],
    [oh, ow]: [usize; 2],
    max: bool,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> Vec<f32> {
    let mut y = vec![0.0f32; n * c * oh * ow];
    for bc in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let hs = (i * stride[0]) as isize - padding[0] as isize;
                let ws = (j * stride[1]) as isize - padding[1] as isize;
                let he = (hs + kernel[0] as isize).min((h + padding[0]) as isize);
                let we = (ws + kernel[1] as isize).min((w + padding[1]) as isize);
                let size = ((he - hs) * (we - ws)).max(1) as f32;
                let (hs, ws) = (hs.max(0), ws.max(0));
                let (he, we) = (he.min(h as isize), we.min(w as isize));
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
    let mut y = vec![0.0f32; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |d: usize| (o * dim + d) * inner + i;
            let m = (0..dim).map(|d| x[at(d)]).fold(f32::NEG_INFINITY, f32::max);
            let s: f32 = (0..dim).map(|d| (x[at(d)] - m).exp()).sum();
            for d in 0..dim {
                y[at(d)] = (x[at(d)] - m).exp() / s;
            }
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

fn param(
    g: &Graph,
    node: NodeId,
    inner: usize,
    what: &str,
    len: usize,
    c: f32,
    hw: f32,
) -> Vec<f32> {
    uniform(param_seed(g, node, inner, what), len, c, hw)
}

fn eval(
    g: &Graph,
    node: NodeId,
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
        Op::Input { .. } => return Err(unsup("an input is not evaluated")),
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
            );
            let b = c
                .bias
                .then(|| param(g, node, inner, "bias", c.out_channels, 0.0, 0.1));
            conv2d(
                &x,
                &w,
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
            let global = p.kind.is_global();
            pool2d(
                &x,
                [s[0], s[1], s[2], s[3]],
                [out_shape[2], out_shape[3]],
                matches!(p.kind, PoolKind::Max | PoolKind::GlobalMax),
                if global { [s[2], s[3]] } else { p.kernel },
                if global { [1, 1] } else { p.stride },
                if global { [0, 0] } else { p.padding },
            )
        }
        Op::Activation { act: a } => single().0.into_iter().map(|v| act(v, *a)).collect(),
        Op::Elementwise { kind } => {
            let mut it = inputs.into_iter();
            let (mut acc, _) = it.next().ok_or_else(|| unsup("no inputs"))?;
            for (d, _) in it {
                for (x, y) in acc.iter_mut().zip(&d) {
                    match kind {
                        ElementwiseKind::Add => *x += y,
                        ElementwiseKind::Mul => *x *= y,
                    }
                }
            }
            acc
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
            let w = param(g, node, inner, "weight", nf * k, 0.0, weight_half_width(k));
            let b = bias.then(|| param(g, node, inner, "bias", nf, 0.0, 0.1));
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
        Op::BatchMatmul { transpose_b } => {
            let [(a, sa), (b, _)] = inputs.as_slice() else {
                return Err(unsup("batch_matmul needs two inputs"));
            };
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
                        y[bi * m * n + i * n + j] = acc;
                    }
                }
            }
            y
        }
        Op::Softmax { axis } => {
            let (x, s) = single();
            let r = s.len() as i64;
            let ax = if *axis < 0 { r + axis } else { *axis } as usize;
            softmax(&x, numel(&s[..ax]), s[ax], numel(&s[ax + 1..]))
        }
        Op::LayerNorm { eps } => {
            let (x, s) = single();
            let d = *s.last().unwrap_or(&1);
            let gamma = param(g, node, inner, "gamma", d, 1.0, 0.1);
            let beta = param(g, node, inner, "beta", d, 0.0, 0.1);
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
                let y = eval(g, node, o, i, cur, &shape)?;
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
/// indexed by `NodeId`. Inputs and parameters are the same pseudo-random data the GPU program
/// uses (see [`crate::program`]). Only `f32` graphs.
pub fn reference(g: &Graph) -> Result<Vec<Option<Vec<f32>>>, GpuError> {
    if g.dtype != opsched_graph::DType::F32 {
        return Err(GpuError::UnsupportedDType(g.dtype.to_string()));
    }
    let mut outs: Vec<Option<Vec<f32>>> = vec![None; g.len()];
    for &id in g.topo_order() {
        let node = g.node(id);
        let y = if node.op.is_input() {
            uniform(input_seed(g, id), numel(&node.shape), 0.0, 1.0)
        } else {
            let inputs = node
                .inputs
                .iter()
                .map(|t| term(g, &outs, t))
                .collect::<Result<Vec<_>, _>>()?;
            eval(g, id, &node.op, 0, inputs, &node.shape)?
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
