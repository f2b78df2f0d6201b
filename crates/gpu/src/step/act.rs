//! Activations: `y = act(x)` (the `activation` operator) and the in-place bias + activation
//! epilogue of matrix products.
#![allow(unsafe_code)]

use cudarc::driver::PushKernelArg;
use opsched_graph::Activation;
use rayon::prelude::*;
use serde::Serialize;

use super::{Access, Step, StepKernel};
use crate::cpu::math::{act_add, act_of, apply_bias_act};
use crate::cpu::CpuIo;
use crate::cuda::cudnn::{as_i64, runs_args};
use crate::cuda::nvrtc::act_params;
use crate::cuda::{grid, launched, vector_width, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{At, BufId, Builder, Src};
use crate::GpuError;

/// `y = act(x)` over `len` elements.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Act {
    pub x: BufId,
    pub y: BufId,
    pub len: usize,
    pub act: Activation,
}

/// In place: `y[i] = act(y[i] + bias[(i / inner) % channels] + residual[i])` over `total`
/// elements.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BiasAct {
    pub y: BufId,
    pub bias: Option<BufId>,
    pub total: usize,
    pub channels: usize,
    pub inner: usize,
    pub act: Activation,
    pub residual: Option<BufId>,
}

/// Lower an `activation` operator.
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    a: Activation,
    src: Src<'_>,
    out: BufId,
) -> Result<(), GpuError> {
    // A sum of whole values and its activation are one kernel.
    if let Src::Terms([term]) = src {
        let shape = term.first().map(|v| b.value_shape(v)).unwrap_or_default();
        if b.sum_into(steps, at, term, out, &shape, a)? {
            return Ok(());
        }
    }
    let (x, xs) = b.single_strided(steps, at, src)?;
    let len = xs.iter().product();
    // A strided view (a merged convolution's member, a slice of a concatenation): the
    // element-wise kernel, which reads it in place.
    if b.is_strided(x) {
        steps.push(super::elementwise::Elementwise::sum(vec![x], out, len, a, None).into());
        return Ok(());
    }
    steps.push(
        Act {
            x,
            y: out,
            len,
            act: a,
        }
        .into(),
    );
    Ok(())
}

impl StepKernel for Act {
    fn kind(&self) -> &'static str {
        "act"
    }

    fn access(&self) -> Access {
        Access {
            reads: vec![(self.x, self.len)],
            writes: vec![(self.y, self.len)],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let x = &io.read(self.x)?[..self.len];
        let y = &mut io.write(self.y)?[..self.len];
        let a = self.act;
        y.par_chunks_mut(1 << 14)
            .zip(x.par_chunks(1 << 14))
            .for_each(|(y, x)| act_of(y, x, None, a));
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        Ok(Box::new(CudaAct {
            y: cx.ptr(self.y)?,
            x: cx.ptr(self.x)?,
            n: self.len as i64,
            act: act_params(self.act),
        }))
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some("act_kernel")
    }
}

struct CudaAct {
    y: u64,
    x: u64,
    n: i64,
    act: (i32, f32, f32),
}

impl Enqueue for CudaAct {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let mut b = sc.launch_builder(gpu.function("act_kernel")?);
        let (code, p0, p1) = &self.act;
        b.arg(&self.y)
            .arg(&self.x)
            .arg(&self.n)
            .arg(code)
            .arg(p0)
            .arg(p1);
        // SAFETY: matches `act_kernel`; both buffers hold `n` elements (checked at preparation).
        launched(unsafe { b.launch(grid(self.n as usize)) }, "act_kernel")
    }
}

impl StepKernel for BiasAct {
    fn kind(&self) -> &'static str {
        "bias_act"
    }

    fn access(&self) -> Access {
        let bias = self.bias.map(|b| (b, self.channels));
        let residual = self.residual.map(|z| (z, self.total));
        Access {
            reads: bias.into_iter().chain(residual).collect(),
            writes: vec![(self.y, self.total)],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let bias = self.bias.map(|b| io.read(b)).transpose()?;
        let residual = self.residual.map(|z| io.read(z)).transpose()?;
        let y = &mut io.write(self.y)?[..self.total];
        match residual {
            // `(y + bias) + z`, then the activation: the unfused order (the bias kernel, then
            // the sum), so fused and unfused runs agree bit for bit.
            Some(z) => {
                apply_bias_act(y, bias, self.channels, self.inner, Activation::None);
                let a = self.act;
                y.par_chunks_mut(1 << 14)
                    .zip(z.par_chunks(1 << 14))
                    .for_each(|(y, z)| act_add(y, z, a));
            }
            None => apply_bias_act(y, bias, self.channels, self.inner, self.act),
        }
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        Ok(Box::new(CudaBiasAct::new(cx, self)?))
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some("bias_act")
    }
}

/// `bias_act` on the GPU (also a convolution's epilogue when cuDNN's fused call is not used);
/// `bias_act_runs` where `y` is a strided view (a convolution's slice of a concatenation at
/// batch > 1).
pub(crate) struct CudaBiasAct {
    y: u64,
    bias: u64,
    residual: u64,
    total: i64,
    channels: i64,
    inner: i64,
    /// `y`'s runs and their stride, for a strided `y`.
    runs: Option<(i64, i64)>,
    act: (i32, f32, f32),
    /// Four elements at a time (`bias_act_vec4`, see [`by_fours`]).
    vec4: bool,
    /// A strided `y`'s elements a thread (`bias_act_runs`: 4, 2 or 1, `vector_width`).
    runs_vec: i32,
}

/// Whether `bias_act_vec4` runs this epilogue: `y` dense (no `runs`), `total` a multiple of 4,
/// no bias, or four consecutive elements sharing one (`inner % 4 == 0`) or reading four
/// consecutive ones (`inner == 1`, `channels % 4 == 0`), and every pointer `[y, bias,
/// residual]` (0: none) 16-byte aligned.
fn by_fours(total: i64, channels: i64, inner: i64, runs: bool, ptrs: [u64; 3]) -> bool {
    let no_bias = ptrs[1] == 0;
    !runs
        && total % 4 == 0
        && (no_bias || inner % 4 == 0 || (inner == 1 && channels % 4 == 0))
        && ptrs.iter().all(|p| p % 16 == 0)
}

impl CudaBiasAct {
    pub(crate) fn new(cx: &PrepareCx<'_>, s: &BiasAct) -> Result<CudaBiasAct, GpuError> {
        Self::at(cx, s, cx.strided(s.y)?)
    }

    /// `s` on `y` (a pointer, and its runs where it is strided) instead of its own buffer's
    /// (a convolution's output it writes elsewhere).
    pub(crate) fn at(
        cx: &PrepareCx<'_>,
        s: &BiasAct,
        (y, runs): (u64, Option<crate::program::Runs>),
    ) -> Result<CudaBiasAct, GpuError> {
        let bias = s.bias.map(|b| cx.ptr(b)).transpose()?.unwrap_or(0);
        let residual = s.residual.map(|z| cx.ptr(z)).transpose()?.unwrap_or(0);
        let total = as_i64(s.total, "bias kernel elements")?;
        let channels = as_i64(s.channels.max(1), "bias kernel channels")?;
        let inner = as_i64(s.inner.max(1), "bias kernel inner size")?;
        let runs = runs_args(runs)?;
        // Several elements a thread of a strided y where every access allows it (the bias
        // is read element by element).
        let runs_vec = runs.map_or(1, |(run, stride)| {
            vector_width([total, run, stride].map(|v| v as usize), [y, residual])
        }) as i32;
        Ok(CudaBiasAct {
            y,
            bias,
            residual,
            total,
            channels,
            inner,
            runs,
            act: act_params(s.act),
            vec4: by_fours(total, channels, inner, runs.is_some(), [y, bias, residual]),
            runs_vec,
        })
    }
}

impl Enqueue for CudaBiasAct {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let name = match (self.runs, self.vec4) {
            (Some(_), _) => "bias_act_runs",
            (None, true) => "bias_act_vec4",
            (None, false) => "bias_act",
        };
        let mut b = sc.launch_builder(gpu.function(name)?);
        b.arg(&self.y)
            .arg(&self.bias)
            .arg(&self.residual)
            .arg(&self.total)
            .arg(&self.channels)
            .arg(&self.inner);
        if let Some((run, stride)) = &self.runs {
            b.arg(run).arg(stride);
        }
        b.arg(&self.act.0).arg(&self.act.1).arg(&self.act.2);
        if self.runs.is_some() {
            b.arg(&self.runs_vec);
        }
        // SAFETY: matches `bias_act` and `bias_act_vec4` (`bias_act_runs`: with the run and
        // stride after `inner`, and the elements a thread last); bias has `channels` elements
        // or is null, the residual `total` or is null, and y `total` (in runs of its view: the
        // layout checked that they fit its parent); `bias_act_vec4` only where `by_fours`
        // found them aligned and divisible; `bias_act_runs`' width divides the total (the
        // kernel checks every access again), its grid strides over total / width.
        let threads = match (self.runs, self.vec4) {
            (Some(_), _) => self.total as usize / self.runs_vec as usize,
            (None, true) => self.total as usize / 4,
            (None, false) => self.total as usize,
        };
        launched(unsafe { b.launch(grid(threads)) }, name)
    }
}

#[cfg(test)]
mod tests {
    use super::by_fours;

    #[test]
    fn four_at_a_time_only_where_each_four_share_a_bias_run_and_alignment() {
        let (y, b) = (0x7f00_0000_0000u64, 0x7f00_0000_1000u64);
        // A Transformer FFN's product [2048, 3072]: consecutive biases, no residual.
        assert!(by_fours(2048 * 3072, 3072, 1, false, [y, b, 0]));
        // NCHW convolutions: 28x28 pixels share a bias in runs of 784; 7x7 do not divide by 4.
        assert!(by_fours(16 * 256 * 784, 256, 784, false, [y, b, y]));
        assert!(!by_fours(16 * 256 * 49, 256, 49, false, [y, b, 0]));
        // Channels last, 42 channels: a four may straddle two pixels' biases.
        assert!(!by_fours(42 * 36, 42, 1, false, [y, b, 0]));
        assert!(
            !by_fours(2048 * 3072, 3072, 1, true, [y, b, 0]),
            "a strided y"
        );
        assert!(
            !by_fours(2048 * 3072, 3072, 1, false, [y + 4, b, 0]),
            "y misaligned"
        );
        assert!(
            !by_fours(2048 * 3072, 3072, 1, false, [y, b + 8, 0]),
            "bias misaligned"
        );
        assert!(!by_fours(6, 6, 1, false, [y, b, 0]), "a total not of fours");
        // No bias (an activation in place): any four at a time.
        assert!(by_fours(42 * 36, 1, 1, false, [y, 0, 0]));
        assert!(!by_fours(42 * 36, 42, 1, false, [y, b, 0]));
    }
}
