//! Two-operand element-wise arithmetic with NumPy broadcasting (ONNX's `Sub`, `Div`, `Pow`,
//! `Max`, `Min`, the comparisons, and `Add`/`Mul` of differently shaped operands, e.g.
//! squeeze-and-excitation's `x * gate[n, c, 1, 1]` or a position embedding added to a batch),
//! and `Where`'s selection by a third, broadcast condition; on CUDA the `broadcast` NVRTC
//! kernel, up to six axes.
#![allow(unsafe_code)]

use cudarc::driver::PushKernelArg;
use opsched_graph::{BinaryKind, ElementwiseKind};
use rayon::prelude::*;
use serde::Serialize;

use super::{product, Access, Step, StepKernel};
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

/// Lower an `affine` operator (`y = x * scale[c] + shift[c]` along axis 1, an unfoldable
/// batch norm) as two broadcasts against `[1, c, 1, ...]` parameters.
pub(crate) fn lower_affine(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    src: Src<'_>,
    out: BufId,
    out_shape: &[usize],
) -> Result<(), GpuError> {
    let (x, xs) = b.single(steps, at, src)?;
    let Some(&c) = xs.get(1) else {
        return Err(b.unsupported(at, "affine needs a channel axis (axis 1)"));
    };
    let mut ps = vec![1; xs.len()];
    ps[1] = c;
    let scale = b.param(at, "scale", c, 1.0, 0.1)?;
    let shift = b.param(at, "shift", c, 0.0, 0.1)?;
    let scaled = b.scratch(at, product(&xs, "affine")?);
    for (a, p, y, op) in [
        (x, scale, scaled, BinOp::Mul),
        (scaled, shift, out, BinOp::Add),
    ] {
        steps.push(
            Broadcast {
                a,
                b: p,
                y,
                a_shape: xs.clone(),
                b_shape: ps.clone(),
                out: out_shape.to_vec(),
                op,
                cond: None,
            }
            .into(),
        );
    }
    Ok(())
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
        let (sa, sb, sc) = (
            strides(&self.a_shape, &self.out),
            strides(&self.b_shape, &self.out),
            strides(cond_shape, &self.out),
        );
        let a = io.read(self.a)?;
        let b = io.read(self.b)?;
        let c = match &self.cond {
            Some((c, _)) => Some(io.read(*c)?),
            None => None,
        };
        let n = numel(&self.out);
        let y = &mut io.write(self.y)?[..n];
        // One row per index of the leading axes; the last axis is the inner loop.
        let last = self.out.last().copied().unwrap_or(1).max(1);
        let (la, lb, lc) = (
            sa.last().copied().unwrap_or(0),
            sb.last().copied().unwrap_or(0),
            sc.last().copied().unwrap_or(0),
        );
        y.par_chunks_mut(last).enumerate().for_each(|(row, yr)| {
            let (mut oa, mut ob, mut oc, mut r) = (0, 0, 0, row);
            for ax in (0..rank.saturating_sub(1)).rev() {
                let d = self.out[ax].max(1);
                let i = r % d;
                r /= d;
                oa += i * sa[ax];
                ob += i * sb[ax];
                oc += i * sc[ax];
            }
            match c {
                Some(c) => {
                    for (j, v) in yr.iter_mut().enumerate() {
                        let (x, y) = (a[oa + j * la], b[ob + j * lb]);
                        *v = opsched_graph::op::select(c[oc + j * lc], x, y);
                    }
                }
                None => {
                    for (j, v) in yr.iter_mut().enumerate() {
                        *v = self.op.apply(a[oa + j * la], b[ob + j * lb]);
                    }
                }
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
