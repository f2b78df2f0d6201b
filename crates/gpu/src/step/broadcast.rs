//! Two-operand element-wise arithmetic with NumPy broadcasting (ONNX's `Sub`, `Div`, `Pow`,
//! `Max`, `Min`, the comparisons, and `Add`/`Mul` of differently shaped operands, e.g.
//! squeeze-and-excitation's `x * gate[n, c, 1, 1]` or a position embedding added to a batch),
//! and `Where`'s selection by a third, broadcast condition; on CUDA the `broadcast` NVRTC
//! kernel, up to six axes. Also the affine operator's step ([`Affine`]: a per-channel scale
//! and shift, one pass on the CPU, that kernel and the bias epilogue on CUDA).
#![allow(unsafe_code)]

use cudarc::driver::PushKernelArg;
use opsched_graph::{Activation, BinaryKind, ElementwiseKind};
use serde::Serialize;

use super::act::BiasAct;
use super::{merged_axes, product, row_offset, Access, Step, StepKernel};
use crate::cpu::math::{for_planes, with_act, with_avx512};
use crate::cpu::CpuIo;
use crate::cuda::nvrtc::{broadcast_params, MAX_RANK};
use crate::cuda::{grid, launched, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{At, BufId, Builder, Src};
use crate::reference::numel;
use crate::GpuError;

/// The arithmetic of a [`Broadcast`] step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BinOp {
    Add,
    Mul,
    /// A binary operator of the graph (its arithmetic: [`BinaryKind::apply`]).
    Binary(BinaryKind),
    /// `a` where the step's condition is not 0, else `b` (`Where`).
    Select,
    /// `a` (`Expand`: the one operand broadcast to the result).
    Left,
}

impl BinOp {
    fn apply(self, x: f32, y: f32) -> f32 {
        match self {
            BinOp::Add => x + y,
            BinOp::Mul => x * y,
            BinOp::Binary(k) => k.apply(x, y),
            // Never asked: the step's condition chooses (`Broadcast::run_cpu`).
            BinOp::Select => x,
            BinOp::Left => x,
        }
    }

    /// The operation's code in `bin_f` (cuda/nvrtc.rs).
    fn code(self) -> i32 {
        match self {
            BinOp::Add => 0,
            BinOp::Mul => 1,
            BinOp::Binary(k) => match k {
                BinaryKind::Sub => 2,
                BinaryKind::Div => 3,
                BinaryKind::Pow => 4,
                BinaryKind::Max => 5,
                BinaryKind::Min => 6,
                BinaryKind::Equal => 7,
                BinaryKind::Less => 8,
                BinaryKind::Greater => 9,
                BinaryKind::LessOrEqual => 10,
                BinaryKind::GreaterOrEqual => 11,
                BinaryKind::NotEqual => 14,
            },
            BinOp::Select => 12,
            BinOp::Left => 13,
        }
    }
}

/// `y = a op b`, each operand broadcast to `out` (NumPy's rules: shapes aligned at the last
/// axis, a dimension of 1 repeats); for [`BinOp::Select`], `cond ? a : b` with the condition
/// broadcast likewise.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Broadcast {
    pub a: BufId,
    pub b: BufId,
    pub y: BufId,
    pub a_shape: Vec<usize>,
    pub b_shape: Vec<usize>,
    pub out: Vec<usize>,
    pub op: BinOp,
    /// `Where`'s condition and its shape (with [`BinOp::Select`] only).
    pub cond: Option<(BufId, Vec<usize>)>,
}

/// Lower a `binary` operator, or an `elementwise` one whose operands differ in shape (folded
/// left to right through scratch buffers).
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    op: BinOp,
    src: Src<'_>,
    out: BufId,
    out_shape: &[usize],
) -> Result<(), GpuError> {
    let ts = b.terms(steps, at, src)?;
    let Some(((first, first_shape), rest)) = ts.split_first() else {
        return Err(b.unsupported(at, "an element-wise operator without operands"));
    };
    if rest.is_empty() {
        return Err(b.unsupported(at, "a binary operator needs two operands"));
    }
    let mut acc = (*first, first_shape.clone());
    for (i, (t, shape)) in rest.iter().enumerate() {
        let joined = opsched_graph::op::broadcast_shapes(&[acc.1.clone(), shape.clone()])
            .map_err(|m| b.unsupported(at, m))?;
        let dst = if i + 1 == rest.len() {
            if joined != out_shape {
                return Err(b.unsupported(at, "operand shapes do not broadcast to the output"));
            }
            out
        } else {
            b.scratch(at, product(&joined, "broadcast result")?)
        };
        steps.push(
            Broadcast {
                a: acc.0,
                b: *t,
                y: dst,
                a_shape: acc.1.clone(),
                b_shape: shape.clone(),
                out: joined.clone(),
                op,
                cond: None,
            }
            .into(),
        );
        acc = (dst, joined);
    }
    Ok(())
}

/// Lower an `expand` operator: one [`BinOp::Left`] broadcast of its term to the result.
pub(crate) fn lower_expand(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    src: Src<'_>,
    out: BufId,
    out_shape: &[usize],
) -> Result<(), GpuError> {
    let (x, xs) = b.single(steps, at, src)?;
    steps.push(
        Broadcast {
            a: x,
            b: x,
            y: out,
            a_shape: xs.clone(),
            b_shape: xs,
            out: out_shape.to_vec(),
            op: BinOp::Left,
            cond: None,
        }
        .into(),
    );
    Ok(())
}

/// Lower a `where` operator: one [`BinOp::Select`] broadcast of its three terms (condition,
/// then, else).
pub(crate) fn lower_where(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    src: Src<'_>,
    out: BufId,
    out_shape: &[usize],
) -> Result<(), GpuError> {
    let ts = b.terms(steps, at, src)?;
    let [(c, cs), (x, xs), (y, ys)] = ts.as_slice() else {
        return Err(b.unsupported(at, "where needs three operands"));
    };
    let joined = opsched_graph::op::broadcast_shapes(&[cs.clone(), xs.clone(), ys.clone()])
        .map_err(|m| b.unsupported(at, m))?;
    if joined != out_shape {
        return Err(b.unsupported(at, "operand shapes do not broadcast to the output"));
    }
    steps.push(
        Broadcast {
            a: *x,
            b: *y,
            y: out,
            a_shape: xs.clone(),
            b_shape: ys.clone(),
            out: joined,
            op: BinOp::Select,
            cond: Some((*c, cs.clone())),
        }
        .into(),
    );
    Ok(())
}

/// Lower an `affine` operator (`y = act(x * scale[c] + shift[c])` along axis 1, an
/// unfoldable batch norm; `act` the activation fused into it,
/// `opsched_graph::fusion::fused_source`): one [`Affine`] step.
pub(crate) fn lower_affine(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    act: Activation,
    src: Src<'_>,
    out: BufId,
    out_shape: &[usize],
) -> Result<(), GpuError> {
    let (x, xs) = b.single(steps, at, src)?;
    let Some(&c) = xs.get(1) else {
        return Err(b.unsupported(at, "affine needs a channel axis (axis 1)"));
    };
    if xs != out_shape {
        return Err(b.unsupported(at, "affine output of another shape than its input"));
    }
    let scale = b.param(at, "scale", c, 1.0, 0.1)?;
    let shift = b.param(at, "shift", c, 0.0, 0.1)?;
    product(&xs, "affine")?;
    steps.push(
        Affine {
            x,
            scale,
            shift,
            y: out,
            shape: xs,
            act,
        }
        .into(),
    );
    Ok(())
}

/// `y = act(x * scale[c] + shift[c])` for every element of `x` (`shape`, `c` its index along
/// axis 1): an affine operator (`lower_affine`). On the CPU in one pass, the product and
/// the sum rounded one after the other (no fused multiply-add), as the two passes it ran
/// before (a broadcast multiply into `y`, then the bias epilogue over `y`), so the same bits.
/// DenseNet-121's 62, one thread, three processes of each build alternated (Zen 5,
/// 2026-11-29): 1.87 ms as two passes, 1.15 in one. On a GPU those two kernels, the same
/// launches as before (`Affine::parts`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Affine {
    pub x: BufId,
    pub scale: BufId,
    pub shift: BufId,
    pub y: BufId,
    pub shape: Vec<usize>,
    pub act: Activation,
}

impl Affine {
    /// Channels, and elements of each channel's run.
    fn runs(&self) -> (usize, usize) {
        let c = self.shape.get(1).copied().unwrap_or(1).max(1);
        (c, self.shape.iter().skip(2).product())
    }

    /// The broadcast multiply and the bias epilogue the GPU runs.
    fn parts(&self) -> (Broadcast, BiasAct) {
        let (c, inner) = self.runs();
        let mut ps = vec![1; self.shape.len()];
        if let Some(p) = ps.get_mut(1) {
            *p = c;
        }
        let multiply = Broadcast {
            a: self.x,
            b: self.scale,
            y: self.y,
            a_shape: self.shape.clone(),
            b_shape: ps,
            out: self.shape.clone(),
            op: BinOp::Mul,
            cond: None,
        };
        let epilogue = BiasAct {
            y: self.y,
            bias: Some(self.shift),
            total: numel(&self.shape),
            channels: c,
            inner,
            act: self.act,
            residual: None,
        };
        (multiply, epilogue)
    }
}

impl StepKernel for Affine {
    fn kind(&self) -> &'static str {
        "affine"
    }

    fn access(&self) -> Access {
        let (c, _) = self.runs();
        let n = numel(&self.shape);
        Access {
            reads: vec![(self.x, n), (self.scale, c), (self.shift, c)],
            writes: vec![(self.y, n)],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let (c, inner) = self.runs();
        let n = numel(&self.shape);
        let x = &io.read(self.x)?[..n];
        let scale = &io.read(self.scale)?[..c];
        let shift = &io.read(self.shift)?[..c];
        let y = &mut io.write(self.y)?[..n];
        if inner == 0 {
            return Ok(());
        }
        let a = self.act;
        // A plane of `inner` elements per channel; with none (`[n, c]`), a run of the
        // channels, each element its own scale and shift (as the bias epilogue takes them).
        let run = if inner == 1 { c } else { inner };
        for_planes(y, run, run, |i, yr| {
            let xr = &x[i * run..(i + 1) * run];
            with_avx512(
                #[inline(always)]
                || match inner {
                    1 => with_act!(a, |f| yr
                        .iter_mut()
                        .zip(xr)
                        .zip(scale.iter().zip(shift))
                        .for_each(|((v, &xv), (&s, &t))| *v = f(xv * s + t))),
                    _ => {
                        let (s, t) = (scale[i % c], shift[i % c]);
                        with_act!(a, |f| yr
                            .iter_mut()
                            .zip(xr)
                            .for_each(|(v, &xv)| *v = f(xv * s + t)))
                    }
                },
            )
        });
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        let (multiply, epilogue) = self.parts();
        Ok(Box::new(AffineThen {
            multiply: multiply.prepare_cuda(cx)?,
            epilogue: super::act::CudaBiasAct::new(cx, &epilogue)?,
        }))
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some("broadcast")
    }

    fn kernels(&self) -> u32 {
        2
    }
}

/// [`Affine`] on a GPU: the broadcast multiply, then the bias epilogue.
struct AffineThen {
    multiply: Box<dyn Enqueue>,
    epilogue: super::act::CudaBiasAct,
}

impl Enqueue for AffineThen {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        self.multiply.enqueue(gpu, sc)?;
        self.epilogue.enqueue(gpu, sc)
    }
}

impl From<BinaryKind> for BinOp {
    fn from(k: BinaryKind) -> BinOp {
        BinOp::Binary(k)
    }
}

impl From<ElementwiseKind> for BinOp {
    fn from(k: ElementwiseKind) -> BinOp {
        match k {
            ElementwiseKind::Add => BinOp::Add,
            ElementwiseKind::Mul => BinOp::Mul,
        }
    }
}

/// Strides of `shape` read as if it had the output's rank, 0 along broadcast axes.
pub(crate) fn strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let skip = out.len() - shape.len();
    let mut st = vec![0; out.len()];
    let mut s = 1;
    for (i, &d) in shape.iter().enumerate().rev() {
        if d != 1 {
            st[skip + i] = s;
        }
        s *= d;
    }
    st
}

impl BinOp {
    /// `y[j] = a[j * la] op b[j * lb]` over one row, the operation a concrete closure and the
    /// common strides (1, or 0: an operand broadcast along the row) loops that vectorise.
    fn row(self, y: &mut [f32], a: &[f32], la: usize, b: &[f32], lb: usize) {
        match self {
            BinOp::Add => row_of(|x, y| x + y, y, a, la, b, lb),
            BinOp::Mul => row_of(|x, y| x * y, y, a, la, b, lb),
            BinOp::Binary(BinaryKind::Sub) => row_of(|x, y| x - y, y, a, la, b, lb),
            BinOp::Binary(BinaryKind::Div) => row_of(|x, y| x / y, y, a, la, b, lb),
            BinOp::Binary(BinaryKind::Max) => row_of(f32::max, y, a, la, b, lb),
            BinOp::Binary(BinaryKind::Min) => row_of(f32::min, y, a, la, b, lb),
            BinOp::Left => row_of(|x, _| x, y, a, la, b, lb),
            // An RMS norm's square: `powf(x, 2)` is the rounded square, as `x * x` is.
            BinOp::Binary(BinaryKind::Pow) if lb == 0 && b[0] == 2.0 => {
                row_of(|x, _| x * x, y, a, la, b, lb)
            }
            op => row_of(move |x, y| op.apply(x, y), y, a, la, b, lb),
        }
    }
}

/// [`BinOp::row`] for one operation `g`, compiled for AVX-512 or AVX2 where the CPU has it
/// (`with_avx512`).
#[inline(always)]
fn row_of(g: impl Fn(f32, f32) -> f32, y: &mut [f32], a: &[f32], la: usize, b: &[f32], lb: usize) {
    let n = y.len();
    with_avx512(
        #[inline(always)]
        || match (la, lb) {
            (1, 1) => y
                .iter_mut()
                .zip(&a[..n])
                .zip(&b[..n])
                .for_each(|((v, &x), &z)| *v = g(x, z)),
            (0, 1) => {
                let x = a[0];
                y.iter_mut().zip(&b[..n]).for_each(|(v, &z)| *v = g(x, z))
            }
            (1, 0) => {
                let z = b[0];
                y.iter_mut().zip(&a[..n]).for_each(|(v, &x)| *v = g(x, z))
            }
            _ => y
                .iter_mut()
                .enumerate()
                .for_each(|(j, v)| *v = g(a[j * la], b[j * lb])),
        },
    )
}

impl StepKernel for Broadcast {
    fn kind(&self) -> &'static str {
        "broadcast"
    }

    fn access(&self) -> Access {
        let mut reads = vec![
            (self.a, numel(&self.a_shape)),
            (self.b, numel(&self.b_shape)),
        ];
        if self.a == self.b {
            reads.truncate(1);
            reads[0].1 = numel(&self.a_shape).max(numel(&self.b_shape));
        }
        if let Some((c, cs)) = &self.cond {
            match reads.iter_mut().find(|r| r.0 == *c) {
                Some(r) => r.1 = r.1.max(numel(cs)),
                None => reads.push((*c, numel(cs))),
            }
        }
        Access {
            reads,
            writes: vec![(self.y, numel(&self.out))],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let rank = self.out.len();
        let cond_shape = self.cond.as_ref().map_or(&[][..], |(_, s)| s.as_slice());
        if self.a_shape.len() > rank || self.b_shape.len() > rank || cond_shape.len() > rank {
            return Err(GpuError::Plan(
                "broadcast: an operand has more axes than the result".into(),
            ));
        }
        let (dims, [sa, sb, sc]) = merged_axes(
            &self.out,
            [
                strides(&self.a_shape, &self.out),
                strides(&self.b_shape, &self.out),
                strides(cond_shape, &self.out),
            ],
        );
        let a = io.read(self.a)?;
        let b = io.read(self.b)?;
        let c = match &self.cond {
            Some((c, _)) => Some(io.read(*c)?),
            None => None,
        };
        let n = numel(&self.out);
        let y = &mut io.write(self.y)?[..n];
        if n == 0 {
            return Ok(());
        }
        // One row per index of the leading axes; the last axis is the inner loop.
        let rank = dims.len();
        let last = dims[rank - 1];
        let (la, lb, lc) = (sa[rank - 1], sb[rank - 1], sc[rank - 1]);
        for_planes(y, last, last, |row, yr| {
            let (oa, ob) = (row_offset(row, &dims, &sa), row_offset(row, &dims, &sb));
            match c {
                Some(c) => {
                    let oc = row_offset(row, &dims, &sc);
                    for (j, v) in yr.iter_mut().enumerate() {
                        let (x, y) = (a[oa + j * la], b[ob + j * lb]);
                        *v = opsched_graph::op::select(c[oc + j * lc], x, y);
                    }
                }
                None => self.op.row(yr, &a[oa..], la, &b[ob..], lb),
            }
        });
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        let too_many = || {
            cx.no_kernel(format!(
                "broadcast of {} axes (at most {MAX_RANK})",
                self.out.len()
            ))
        };
        let [dims, sa, sb] =
            broadcast_params(&self.a_shape, &self.b_shape, &self.out).ok_or_else(too_many)?;
        let (c, sc) = match &self.cond {
            Some((c, cs)) => (
                cx.ptr(*c)?,
                broadcast_params(cs, cs, &self.out).ok_or_else(too_many)?[1],
            ),
            None => (0, [0; 6]),
        };
        Ok(Box::new(CudaBroadcast {
            y: cx.ptr(self.y)?,
            a: cx.ptr(self.a)?,
            b: cx.ptr(self.b)?,
            c,
            sc,
            total: product(&self.out, "broadcast result")?,
            rank: self.out.len() as i32,
            dims,
            sa,
            sb,
            op: self.op.code(),
        }))
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some("broadcast")
    }
}

struct CudaBroadcast {
    y: u64,
    a: u64,
    b: u64,
    /// `Where`'s condition (null otherwise) and its strides.
    c: u64,
    sc: [i64; 6],
    total: usize,
    rank: i32,
    dims: [i64; 6],
    sa: [i64; 6],
    sb: [i64; 6],
    /// `bin_f`'s operator code.
    op: i32,
}

impl Enqueue for CudaBroadcast {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let total = self.total as i64;
        let mut b = sc.launch_builder(gpu.function("broadcast")?);
        b.arg(&self.y)
            .arg(&self.a)
            .arg(&self.b)
            .arg(&self.c)
            .arg(&total)
            .arg(&self.rank)
            .arg(&self.dims)
            .arg(&self.sa)
            .arg(&self.sb)
            .arg(&self.sc)
            .arg(&self.op);
        // SAFETY: matches `broadcast` (four 48-byte Dims6 structs by value); the strides stay
        // inside each operand's shape, which the step's access checked against its buffer;
        // the condition is read only by op 12 (`Select`), the only one with one.
        launched(unsafe { b.launch(grid(self.total)) }, "broadcast")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::cpu::CpuIo;
    use crate::reference::broadcast_to;
    use proptest::prelude::*;

    const OPS: [BinOp; 8] = [
        BinOp::Add,
        BinOp::Mul,
        BinOp::Binary(BinaryKind::Sub),
        BinOp::Binary(BinaryKind::Div),
        BinOp::Binary(BinaryKind::Max),
        BinOp::Binary(BinaryKind::Pow),
        BinOp::Binary(BinaryKind::Less),
        BinOp::Left,
    ];

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// The CPU kernel against both operands (and the condition) broadcast by the reference,
    /// then combined element by element.
    fn check(a_shape: &[usize], b_shape: &[usize], c_shape: Option<&[usize]>, op: BinOp) {
        let out = opsched_graph::op::broadcast_shapes(&[
            a_shape.to_vec(),
            b_shape.to_vec(),
            c_shape.unwrap_or(&[]).to_vec(),
        ])
        .unwrap();
        let (a, b) = (values(numel(a_shape), 1), values(numel(b_shape), 2));
        let c = c_shape.map(|s| {
            values(numel(s), 3)
                .iter()
                .map(|v| f32::from(*v > 0.0))
                .collect::<Vec<_>>()
        });
        let step = Broadcast {
            a: 0,
            b: 1,
            y: 3,
            a_shape: a_shape.to_vec(),
            b_shape: b_shape.to_vec(),
            out: out.clone(),
            op: if c.is_some() { BinOp::Select } else { op },
            cond: c_shape.map(|s| (2, s.to_vec())),
        };
        let mut reads = vec![(0, &a[..]), (1, &b[..])];
        if let Some(c) = &c {
            reads.push((2, &c[..]));
        }
        let mut got = vec![f32::NAN; numel(&out)];
        step.run_cpu(&mut CpuIo::of(reads, vec![(3, &mut got[..])]))
            .unwrap();
        let (wa, wb) = (
            broadcast_to(&a, a_shape, &out),
            broadcast_to(&b, b_shape, &out),
        );
        let wc = c.as_ref().map(|c| broadcast_to(c, c_shape.unwrap(), &out));
        for (i, g) in got.iter().enumerate() {
            let want = match &wc {
                Some(wc) => opsched_graph::op::select(wc[i], wa[i], wb[i]),
                None => op.apply(wa[i], wb[i]),
            };
            assert!(
                g.to_bits() == want.to_bits() || g.is_nan() && want.is_nan(),
                "{op:?} {a_shape:?} {b_shape:?} {c_shape:?} at {i}: {g} vs {want}"
            );
        }
    }

    /// An affine operator in one pass gives the bits of the two it ran as before (and a GPU
    /// runs): the broadcast multiply, then the bias epilogue in place; images of several
    /// channels, planes large and small, rows of features (no planes: a scale and shift per
    /// element of a row), NaN, infinities and zeros of both signs among the inputs and
    /// scales, and the activations fused into it.
    #[test]
    fn affine_in_one_pass_gives_the_bits_of_its_two() {
        let acts = [
            Activation::None,
            Activation::Relu,
            Activation::Clip {
                min: Some(0.0),
                max: Some(6.0),
            },
            Activation::Sigmoid,
            Activation::Swish { alpha: 1.0 },
        ];
        for shape in [
            vec![2, 5, 7, 9],
            vec![1, 64, 56, 56],
            vec![3, 4],
            vec![700, 37],
            vec![1, 3, 1, 1],
        ] {
            let (n, c) = (numel(&shape), shape[1]);
            let mut x = values(n, 1);
            for (i, v) in x.iter_mut().enumerate().step_by(13) {
                *v = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0][i % 5];
            }
            let (mut scale, shift) = (values(c, 2), values(c, 3));
            scale[0] = -0.0;
            for act in acts {
                let step = Affine {
                    x: 0,
                    scale: 1,
                    shift: 2,
                    y: 3,
                    shape: shape.clone(),
                    act,
                };
                let reads = || vec![(0, &x[..]), (1, &scale[..]), (2, &shift[..])];
                let mut got = vec![f32::NAN; n];
                step.run_cpu(&mut CpuIo::of(reads(), vec![(3, &mut got[..])]))
                    .unwrap();
                let (multiply, epilogue) = step.parts();
                let mut want = vec![f32::NAN; n];
                multiply
                    .run_cpu(&mut CpuIo::of(reads(), vec![(3, &mut want[..])]))
                    .unwrap();
                epilogue
                    .run_cpu(&mut CpuIo::of(reads(), vec![(3, &mut want[..])]))
                    .unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{shape:?} {act:?}");
            }
        }
    }

    /// Squeeze-and-excitation's gate, a bias along the last axis, a column, a scalar and
    /// both operands broadcast, on tensors large enough to be split among tasks.
    #[test]
    fn large_broadcasts_match_the_reference() {
        for (a, b) in [
            (vec![2, 8, 56, 56], vec![2, 8, 1, 1]),
            (vec![2, 8, 1, 1], vec![2, 8, 56, 56]),
            (vec![3, 100, 64], vec![64]),
            (vec![3, 100, 64], vec![100, 1]),
            (vec![4, 1, 70, 70], vec![1]),
            (vec![1, 90, 1], vec![300, 1, 60]),
        ] {
            for op in OPS {
                check(&a, &b, None, op);
            }
        }
        check(&[2, 8, 56, 56], &[8, 1, 1], Some(&[56]), BinOp::Select);
    }

    /// A square by `Pow`'s scalar exponent 2 (multiplied, not `powf`) is `powf`'s, bit for
    /// bit, over values of every magnitude.
    #[test]
    fn squares_by_pow_two_are_powf_bit_for_bit() {
        let x: Vec<f32> = (0..20_000)
            .map(|i| {
                f32::from_bits(0x0080_0000 + i * 106_000) * if i % 2 == 0 { 1.0 } else { -1.0 }
            })
            .chain([
                0.0,
                -0.0,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::NAN,
                3e19,
                1e-20,
            ])
            .collect();
        let step = Broadcast {
            a: 0,
            b: 1,
            y: 2,
            a_shape: vec![x.len()],
            b_shape: vec![],
            out: vec![x.len()],
            op: BinOp::Binary(BinaryKind::Pow),
            cond: None,
        };
        let mut got = vec![0.0; x.len()];
        step.run_cpu(&mut CpuIo::of(
            vec![(0, &x[..]), (1, &[2.0][..])],
            vec![(2, &mut got[..])],
        ))
        .unwrap();
        for (v, g) in x.iter().zip(&got) {
            let want = v.powf(2.0);
            assert!(
                g.to_bits() == want.to_bits() || g.is_nan() && want.is_nan(),
                "{v}: {g} vs {want}"
            );
        }
    }

    proptest! {
        /// Any shapes that broadcast: the trailing axes of a result, each kept or made 1
        /// (broadcast) per operand.
        #[test]
        fn broadcasts_match_the_reference(
            out in prop::collection::vec(1usize..5, 1..5),
            keep in prop::collection::vec((any::<bool>(), any::<bool>(), any::<bool>()), 4),
            drop in (0usize..3, 0usize..3, 0usize..3),
            op in 0..OPS.len(),
            select: bool,
        ) {
            let shape = |skip: usize, pick: &dyn Fn(&(bool, bool, bool)) -> bool| -> Vec<usize> {
                let skip = skip.min(out.len() - 1);
                out[skip..].iter().zip(&keep[skip..]).map(|(&d, k)| if pick(k) { d } else { 1 }).collect()
            };
            let a = shape(drop.0, &|k| k.0);
            let b = shape(drop.1, &|k| k.1);
            let c = shape(drop.2, &|k| k.2);
            check(&a, &b, select.then_some(&c[..]), OPS[op]);
        }
    }
}
