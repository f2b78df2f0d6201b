//! N-input element-wise add or multiply of same-sized buffers, with an activation fused in
//! and, for an add, the biases of the convolutions that left theirs to it
//! (`opsched_graph::fusion`).
#![allow(unsafe_code)]

use cudarc::driver::{CudaSlice, PushKernelArg};
use opsched_graph::{Activation, ElementwiseKind, NodeId};
use rayon::prelude::*;
use serde::Serialize;

use super::{Access, Step, StepKernel};
use crate::cpu::math::{bias_act_row, with_avx512};
use crate::cpu::CpuIo;
use crate::cuda::cudnn::{as_i64, c_int, runs_args};
use crate::cuda::nvrtc::act_params;
use crate::cuda::{grid, launched, vector_width, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{At, BufId, Builder, Src};
use crate::GpuError;

/// `y = act(srcs[0] op srcs[1] op ... [+ bias])` element by element over `len` elements.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Elementwise {
    pub srcs: Vec<BufId>,
    pub y: BufId,
    pub len: usize,
    pub kind: ElementwiseKind,
    pub act: Activation,
    /// Added to an add's result before the activation: the biases that the convolutions
    /// among its sources left to it (`opsched_graph::fusion::deferred_bias`), summed.
    pub bias: Option<ChannelBias>,
}

/// A bias per channel of a 4-D value: element `t` (in storage order) adds
/// `buf[(t / inner) % channels]` (NCHW: `inner = h * w`; channels last: 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ChannelBias {
    pub buf: BufId,
    pub channels: usize,
    pub inner: usize,
}

impl ChannelBias {
    /// What the kernels take of a bias: its pointer (null where there is none), its channels
    /// and the elements per channel run.
    pub(crate) fn kernel_args(
        bias: Option<ChannelBias>,
        cx: &PrepareCx<'_>,
    ) -> Result<(u64, i64, i64), GpuError> {
        Ok(match bias {
            Some(b) => (
                cx.ptr(b.buf)?,
                as_i64(b.channels.max(1), "bias channels")?,
                as_i64(b.inner.max(1), "elements per channel")?,
            ),
            None => (0, 1, 1),
        })
    }

    /// Add its bias to every element of `y`, which holds the value's elements from element
    /// `first` on: a run of one channel at a time, or channels last a run of consecutive
    /// channels (no division per element).
    pub(crate) fn add_to(&self, bias: &[f32], first: usize, y: &mut [f32]) {
        let inner = self.inner.max(1);
        let channels = self.channels.max(1);
        let mut t = first;
        let mut rest = y;
        while !rest.is_empty() {
            let len = match inner {
                1 => {
                    let c = t % channels;
                    let len = (channels - c).min(rest.len());
                    let bias = &bias[c..c + len];
                    rest[..len].iter_mut().zip(bias).for_each(|(v, b)| *v += b);
                    len
                }
                _ => {
                    let len = (inner - t % inner).min(rest.len());
                    let b = bias[(t / inner) % channels];
                    rest[..len].iter_mut().for_each(|v| *v += b);
                    len
                }
            };
            t += len;
            rest = &mut rest[len..];
        }
    }
}

/// `y = act(y op srcs[0] op srcs[1] ... [+ bias])` element by element (`op` a product where
/// `mul`, else a sum; the bias added to a sum), in parallel chunks, `y` first filled with
/// `fill` where given: an element-wise kernel on the CPU.
pub(crate) fn combine_into(
    y: &mut [f32],
    fill: Option<f32>,
    srcs: &[&[f32]],
    mul: bool,
    bias: Option<(ChannelBias, &[f32])>,
    act: Activation,
) {
    const CHUNK: usize = 1 << 14;
    y.par_chunks_mut(CHUNK).enumerate().for_each(|(c, yc)| {
        with_avx512(
            #[inline(always)]
            || {
                if let Some(v) = fill {
                    yc.fill(v);
                }
                for s in srcs {
                    let sc = &s[c * CHUNK..c * CHUNK + yc.len()];
                    if mul {
                        yc.iter_mut().zip(sc).for_each(|(a, v)| *a *= v);
                    } else {
                        yc.iter_mut().zip(sc).for_each(|(a, v)| *a += v);
                    }
                }
                if let Some((b, values)) = bias {
                    b.add_to(values, c * CHUNK, yc);
                }
            },
        );
        if act != Activation::None {
            bias_act_row(yc, None, act);
        }
    });
}

impl Elementwise {
    /// `y = act(srcs[0] + srcs[1] + ... + bias)`: the one kernel of a summed term.
    pub(crate) fn sum(
        srcs: Vec<BufId>,
        y: BufId,
        len: usize,
        act: Activation,
        bias: Option<ChannelBias>,
    ) -> Elementwise {
        Elementwise {
            srcs,
            y,
            len,
            kind: ElementwiseKind::Add,
            act,
            bias,
        }
    }
}

/// Lower an `elementwise` operator (its terms are its operands), applying `act` to the result.
#[allow(clippy::too_many_arguments)]
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    kind: ElementwiseKind,
    act: Activation,
    src: Src<'_>,
    out: BufId,
    out_shape: &[usize],
) -> Result<(), GpuError> {
    // An add of whole values, some of them poolings it computes: the pooling kernel.
    if let (ElementwiseKind::Add, Src::Terms(terms)) = (kind, src) {
        let values: Vec<opsched_graph::Value> = terms
            .iter()
            .filter_map(|t| match t.as_slice() {
                [v] => Some(*v),
                _ => None,
            })
            .collect();
        let pools = values.iter().any(|v| b.pooled_by_reader(v.node));
        if pools
            && values.len() == terms.len()
            && b.sum_into(steps, at, &values, out, out_shape, act)?
        {
            return Ok(());
        }
    }
    let ts = b.terms_strided(steps, at, src)?;
    // The terms that are one value each are sources of this kernel (a sum of several is
    // summed before, with the biases left to it).
    let bias = match (kind, src) {
        (ElementwiseKind::Add, Src::Terms(terms)) => {
            let alone: Vec<NodeId> = terms
                .iter()
                .filter_map(|t| match t.as_slice() {
                    [v] => Some(v.node),
                    _ => None,
                })
                .collect();
            b.deferred_bias(at, &alone, out_shape)?
        }
        _ => None,
    };
    steps.push(
        Elementwise {
            srcs: ts.iter().map(|t| t.0).collect(),
            y: out,
            len: out_shape.iter().product(),
            kind,
            act,
            bias,
        }
        .into(),
    );
    Ok(())
}

impl StepKernel for Elementwise {
    fn kind(&self) -> &'static str {
        "elementwise"
    }

    fn access(&self) -> Access {
        let mut reads: Vec<(BufId, usize)> = self.srcs.iter().map(|&s| (s, self.len)).collect();
        reads.extend(self.bias.map(|b| (b.buf, b.channels)));
        reads.sort_unstable();
        reads.dedup();
        Access {
            reads,
            writes: vec![(self.y, self.len)],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let srcs = self
            .srcs
            .iter()
            .map(|&s| io.read(s).map(|v| &v[..self.len]))
            .collect::<Result<Vec<_>, _>>()?;
        let bias = match self.bias {
            Some(b) => Some((b, &io.read(b.buf)?[..b.channels])),
            None => None,
        };
        let y = &mut io.write(self.y)?[..self.len];
        let mul = self.kind == ElementwiseKind::Mul;
        let first = if mul { 1.0 } else { 0.0 };
        combine_into(y, Some(first), &srcs, mul, bias, self.act);
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        let srcs = self
            .srcs
            .iter()
            .map(|&b| cx.strided(b))
            .collect::<Result<Vec<_>, _>>()?;
        let ptrs: Vec<u64> = srcs.iter().map(|s| s.0).collect();
        let (srcs_ptr, dev) = cx.gpu.upload_array(&ptrs)?;
        // Strided sources: each one's run and stride (0, 0 where dense), for
        // `elementwise_views`.
        let views = match srcs.iter().any(|s| s.1.is_some()) {
            false => None,
            true => {
                let mut pairs = Vec::with_capacity(2 * srcs.len());
                for s in &srcs {
                    let (run, stride) = runs_args(s.1)?.unwrap_or((0, 0));
                    pairs.extend([run, stride]);
                }
                Some(cx.gpu.upload_array(&pairs)?)
            }
        };
        let (y, runs) = cx.strided(self.y)?;
        let bias = ChannelBias::kernel_args(self.bias, cx)?;
        let runs = runs_args(runs)?;
        // Several elements a thread where every access allows it (the bias is read element
        // by element; strided sources take `elementwise_views`, one at a time).
        let (run, stride) = runs.unwrap_or((0, 0));
        let vec = match views {
            Some(_) => 1,
            None => vector_width(
                [self.len, run as usize, stride as usize],
                std::iter::once(y).chain(ptrs.iter().copied()),
            ),
        };
        Ok(Box::new(CudaElementwise {
            y,
            _srcs: dev,
            srcs_ptr,
            views,
            nsrc: c_int(ptrs.len(), "inputs")?,
            n: as_i64(self.len, "elements of a sum")?,
            runs,
            vec: vec as i32,
            is_mul: i32::from(self.kind == ElementwiseKind::Mul),
            act: act_params(self.act),
            bias,
        }))
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some("elementwise")
    }
}

struct CudaElementwise {
    y: u64,
    /// The device array of source pointers (kept alive with the operator).
    _srcs: CudaSlice<u64>,
    srcs_ptr: u64,
    /// The device array of the sources' runs and strides where one is a strided view (kept
    /// alive with the operator), and its pointer.
    views: Option<(u64, CudaSlice<i64>)>,
    nsrc: i32,
    n: i64,
    /// `y`'s runs and their stride, for a strided `y` (`elementwise_runs`).
    runs: Option<(i64, i64)>,
    /// Elements a thread (4, 2 or 1: `vector_width`; 1 for `elementwise_views`).
    vec: i32,
    is_mul: i32,
    act: (i32, f32, f32),
    /// The bias per channel (a null pointer where there is none), its channels and the
    /// elements per channel run.
    bias: (u64, i64, i64),
}

impl Enqueue for CudaElementwise {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let (code, p0, p1) = &self.act;
        if let Some((views, _)) = &self.views {
            let (y_run, y_stride) = self.runs.unwrap_or((0, 0));
            let mut b = sc.launch_builder(gpu.function("elementwise_views")?);
            b.arg(&self.y)
                .arg(&self.srcs_ptr)
                .arg(views)
                .arg(&self.nsrc)
                .arg(&self.n);
            b.arg(&y_run).arg(&y_stride);
            b.arg(&self.is_mul).arg(code).arg(p0).arg(p1);
            b.arg(&self.bias.0).arg(&self.bias.1).arg(&self.bias.2);
            // SAFETY: matches `elementwise_views`; the pointer array and the views array (two
            // i64 per source) live in this operator; each source and y hold n elements in
            // their runs (the layout checked that the runs fit their parents); the bias, where
            // not null, holds `channels` values.
            return launched(
                unsafe { b.launch(grid(self.n as usize)) },
                "elementwise_views",
            );
        }
        let name = match self.runs {
            Some(_) => "elementwise_runs",
            None => "elementwise",
        };
        let mut b = sc.launch_builder(gpu.function(name)?);
        b.arg(&self.y)
            .arg(&self.srcs_ptr)
            .arg(&self.nsrc)
            .arg(&self.n);
        if let Some((run, stride)) = &self.runs {
            b.arg(run).arg(stride);
        }
        b.arg(&self.is_mul).arg(code).arg(p0).arg(p1);
        b.arg(&self.bias.0).arg(&self.bias.1).arg(&self.bias.2);
        b.arg(&self.vec);
        // SAFETY: matches `elementwise` (`elementwise_runs`: with the run and stride after
        // `n`); the pointer array (nsrc entries, each a buffer of at least n elements, checked
        // at preparation) lives in this operator, and y holds n (in runs of its view: the
        // layout checked that they fit its parent); the bias, where not null, holds `channels`
        // values; `vec` divides n (the kernel checks every access's alignment again), and the
        // grid strides over n / vec.
        let threads = self.n as usize / self.vec as usize;
        launched(unsafe { b.launch(grid(threads)) }, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Element `t` of a value gets `bias[(t / inner) % channels]` from any first element on,
    /// in both layouts' runs.
    #[test]
    fn a_channel_bias_adds_each_elements_channels_value() {
        let bias = [1.0, 10.0, 100.0];
        for inner in [1, 4, 5] {
            let cb = ChannelBias {
                buf: 0,
                channels: 3,
                inner,
            };
            let len = 2 * 3 * inner;
            for first in [0, 1, inner + 2, len - 1] {
                let mut y = vec![0.5; len - first];
                cb.add_to(&bias, first, &mut y);
                for (i, v) in y.iter().enumerate() {
                    let t = first + i;
                    assert_eq!(*v, 0.5 + bias[(t / inner) % 3], "inner {inner}, t {t}");
                }
            }
        }
    }
}
