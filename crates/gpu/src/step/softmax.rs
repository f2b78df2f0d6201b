//! Softmax and log-softmax over the middle axis of `[outer, dim, inner]`. On CUDA, cuDNN's
//! channel mode in its accurate or log algorithm; where the rows are contiguous (`inner` 1:
//! attention scores, a classifier's logits) also our `softmax_rows` kernel, a warp per row,
//! and the faster of the two as measured on the device and kept in the cost cache
//! ([`crate::tuning::SOFTMAX_KEY`]), so every process runs the same kernel.
#![allow(unsafe_code)]

use std::ffi::c_void;

use cudarc::cudnn::{result as dnn, sys as dnn_sys};
use cudarc::driver::PushKernelArg;
use serde::Serialize;

use super::{Access, Step, StepKernel};
use crate::cpu::math::{exp_nonpositive, for_planes, max_of, sum, with_avx512, with_scratch};
use crate::cpu::CpuIo;
use crate::cuda::cudnn::{as_i64, tensor4, TensorDesc};
use crate::cuda::{grid, launched, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{At, BufId, Builder, Src};
use crate::GpuError;

/// A softmax step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Softmax {
    pub x: BufId,
    pub y: BufId,
    pub outer: usize,
    pub dim: usize,
    pub inner: usize,
    /// `log(softmax(x))`, computed as `x - max - log(sum(exp(x - max)))`.
    pub log: bool,
}

/// Lower a `softmax` operator (a negative axis counts from the end).
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    axis: i64,
    log: bool,
    src: Src<'_>,
    out: BufId,
) -> Result<(), GpuError> {
    let (x, xs) = b.single(steps, at, src)?;
    let r = xs.len() as i64;
    let ax = if axis < 0 { r + axis } else { axis };
    if ax < 0 || ax >= r {
        return Err(b.unsupported(at, "softmax axis out of range"));
    }
    let ax = ax as usize;
    steps.push(
        Softmax {
            x,
            y: out,
            outer: xs[..ax].iter().product(),
            dim: xs[ax],
            inner: xs[ax + 1..].iter().product(),
            log,
        }
        .into(),
    );
    Ok(())
}

/// Softmax (or log-softmax) of one contiguous row `x` into `y`: the maximum, `exp(x - max)`,
/// their sum in sixteen partial sums, then the quotients (or `x - max - ln(sum)`), each a
/// vectorised pass compiled for AVX-512 or AVX2 where the CPU has it (`with_avx512`).
fn softmax_row(x: &[f32], y: &mut [f32], log: bool) {
    let m = max_of(x);
    with_avx512(
        #[inline(always)]
        || {
            y.iter_mut()
                .zip(x)
                .for_each(|(e, &v)| *e = exp_nonpositive(v - m))
        },
    );
    let s = sum(y);
    with_avx512(
        #[inline(always)]
        || match log {
            true => {
                let ls = s.ln();
                y.iter_mut().zip(x).for_each(|(o, &v)| *o = v - m - ls)
            }
            false => y.iter_mut().for_each(|o| *o /= s),
        },
    )
}

/// Softmax over the rows of `x` (`dim` rows of `inner` values: the axis is the rows) into `y`,
/// with `m` and `s` (`inner` each) for the lines' maxima and sums: a row at a time, so each
/// pass runs along contiguous values; every line's sum adds its rows in order.
fn softmax_lines(x: &[f32], y: &mut [f32], m: &mut [f32], s: &mut [f32], log: bool) {
    let inner = m.len();
    with_avx512(
        #[inline(always)]
        || {
            m.fill(f32::NEG_INFINITY);
            s.fill(0.0);
            for row in x.chunks(inner) {
                m.iter_mut().zip(row).for_each(|(m, &v)| *m = m.max(v));
            }
            for (yr, xr) in y.chunks_mut(inner).zip(x.chunks(inner)) {
                for ((e, &v), (&m, s)) in yr.iter_mut().zip(xr).zip(m.iter().zip(s.iter_mut())) {
                    *e = exp_nonpositive(v - m);
                    *s += *e;
                }
            }
            if log {
                s.iter_mut().for_each(|s| *s = s.ln());
            }
            for (yr, xr) in y.chunks_mut(inner).zip(x.chunks(inner)) {
                match log {
                    true => yr
                        .iter_mut()
                        .zip(xr)
                        .zip(m.iter().zip(s.iter()))
                        .for_each(|((o, &v), (&m, &ls))| *o = v - m - ls),
                    false => yr.iter_mut().zip(s.iter()).for_each(|(o, &s)| *o /= s),
                }
            }
        },
    )
}

impl StepKernel for Softmax {
    fn kind(&self) -> &'static str {
        "softmax"
    }

    fn access(&self) -> Access {
        let n = self.outer * self.dim * self.inner;
        Access {
            reads: vec![(self.x, n)],
            writes: vec![(self.y, n)],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let (dim, inner) = (self.dim, self.inner);
        let block = dim * inner;
        if block == 0 || self.outer == 0 {
            return Ok(());
        }
        let x = &io.read(self.x)?[..self.outer * block];
        let y = &mut io.write(self.y)?[..self.outer * block];
        if inner == 1 {
            // Contiguous rows (attention scores, logits): each row in vectorised passes.
            for_planes(y, dim, dim, |r, yr| {
                softmax_row(&x[r * dim..(r + 1) * dim], yr, self.log)
            });
            return Ok(());
        }
        // Rows `inner` apart (channels): the maxima, sums and results of a block's `inner`
        // lines computed a row of them at a time.
        for_planes(y, block, block, |o, yb| {
            with_scratch(2 * inner, |scratch| {
                let (m, s) = scratch.split_at_mut(inner);
                softmax_lines(&x[o * block..(o + 1) * block], yb, m, s, self.log)
            })
        });
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        use crate::tuning::{choose, SOFTMAX_CUDNN, SOFTMAX_KEY, SOFTMAX_ROWS};
        let (x, y) = (cx.ptr(self.x)?, cx.ptr(self.y)?);
        let cudnn = CudaSoftmax {
            x,
            y,
            desc: tensor4([self.outer, self.dim, self.inner, 1])?,
            algo: if self.log {
                dnn_sys::cudnnSoftmaxAlgorithm_t::CUDNN_SOFTMAX_LOG
            } else {
                dnn_sys::cudnnSoftmaxAlgorithm_t::CUDNN_SOFTMAX_ACCURATE
            },
        };
        if self.inner != 1 || self.outer == 0 || self.dim == 0 {
            return Ok(Box::new(cudnn));
        }
        let rows = SoftmaxRows {
            x,
            y,
            rows: as_i64(self.outer, "softmax rows")?,
            dim: crate::cuda::cudnn::c_int(self.dim, "softmax row length")?,
            log: i32::from(self.log),
        };
        let key = format!(
            "{SOFTMAX_KEY}rows={}|dim={}|{}",
            self.outer,
            self.dim,
            if self.log { "log" } else { "accurate" }
        );
        let (gpu, sc): (&Gpu, &StreamCtx) = (cx.gpu, cx.sc);
        let candidates = cx.timed(
            &key,
            TIMING_REPS,
            &[
                (SOFTMAX_CUDNN, &|| cudnn.enqueue(gpu, sc)),
                (SOFTMAX_ROWS, &|| rows.enqueue(gpu, sc)),
            ],
        )?;
        Ok(match choose(&candidates, usize::MAX).map(|c| c.algo) {
            Some(SOFTMAX_ROWS) => Box::new(rows),
            _ => Box::new(cudnn),
        })
    }
}

/// GPU runs per captured graph when timing a softmax kernel.
const TIMING_REPS: usize = 10;

/// `softmax_rows`: a warp per contiguous row.
struct SoftmaxRows {
    x: u64,
    y: u64,
    rows: i64,
    dim: i32,
    log: i32,
}

impl Enqueue for SoftmaxRows {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let mut b = sc.launch_builder(gpu.function("softmax_rows")?);
        b.arg(&self.y)
            .arg(&self.x)
            .arg(&self.rows)
            .arg(&self.dim)
            .arg(&self.log);
        // SAFETY: matches `softmax_rows`; x and y hold `rows * dim` values (the step's access,
        // checked at preparation). A warp per row: 32 threads each.
        launched(
            unsafe { b.launch(grid((self.rows as usize).saturating_mul(32))) },
            "softmax_rows",
        )
    }
}

struct CudaSoftmax {
    x: u64,
    y: u64,
    desc: TensorDesc,
    /// Accurate (max-subtracted) softmax, or log-softmax.
    algo: dnn_sys::cudnnSoftmaxAlgorithm_t,
}

impl Enqueue for CudaSoftmax {
    fn enqueue(&self, _gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let (one, zero) = (1.0f32, 0.0f32);
        // SAFETY: one descriptor for x and y of equal size (checked at preparation).
        unsafe {
            dnn::softmax_forward(
                sc.cudnn(),
                self.algo,
                dnn_sys::cudnnSoftmaxMode_t::CUDNN_SOFTMAX_MODE_CHANNEL,
                (&one) as *const f32 as *const c_void,
                self.desc.0,
                self.x as *const c_void,
                (&zero) as *const f32 as *const c_void,
                self.desc.0,
                self.y as *mut c_void,
            )
        }
        .map_err(|e| GpuError::cudnn("running softmax", e))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::reference;
    use proptest::prelude::*;

    fn run(x: &[f32], outer: usize, dim: usize, inner: usize, log: bool) -> Vec<f32> {
        let s = Softmax {
            x: 0,
            y: 1,
            outer,
            dim,
            inner,
            log,
        };
        let mut y = vec![f32::NAN; x.len()];
        s.run_cpu(&mut CpuIo::of(vec![(0, x)], vec![(1, &mut y[..])]))
            .unwrap();
        y
    }

    /// Within 1e-6 of the reference: relative for probabilities (their exponentials' error
    /// is), relative to max(|y|, 1) for log-probabilities (`x - max - ln(sum)` cancels).
    fn close(got: &[f32], want: &[f32], log: bool) -> Result<(), TestCaseError> {
        let floor = if log { 1.0 } else { 1e-30 };
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let same = g == w || g.is_nan() && w.is_nan();
            let err = (g - w).abs() / w.abs().max(floor);
            prop_assert!(same || err <= 1e-6, "element {}: {} vs {}", i, g, w);
        }
        Ok(())
    }

    proptest! {
        /// Softmax and log-softmax over contiguous rows and over rows apart (any axis), on
        /// values spread far apart (exponentials that underflow), against the reference
        /// within 1e-6 (`close`: the CPU's exp and partial sums are its own).
        #[test]
        fn softmaxes_match_the_reference(
            outer in 1usize..4, dim in 1usize..40, inner in 1usize..5, log: bool,
            spread in prop_oneof![Just(1.0f32), Just(30.0), Just(300.0)], seed in 0usize..50,
        ) {
            let len = outer * dim * inner;
            let x: Vec<f32> = (0..len)
                .map(|i| (((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0 - 1.0) * spread)
                .collect();
            let want = match log {
                true => reference::log_softmax(&x, outer, dim, inner),
                false => reference::softmax(&x, outer, dim, inner),
            };
            close(&run(&x, outer, dim, inner, log), &want, log)?;
        }
    }

    /// Infinities and NaN as the reference has them: -inf elements weigh nothing, a row of
    /// -inf is NaN, a NaN element makes its row NaN; in both layouts.
    #[test]
    fn infinities_and_nan_follow_the_reference() {
        let (inf, nan) = (f32::INFINITY, f32::NAN);
        let rows = [
            [0.5, -inf, 2.0, -inf],
            [-inf, -inf, -inf, -inf],
            [1.0, nan, 0.0, 3.0],
            [inf, 1.0, -inf, 0.0],
        ];
        for log in [false, true] {
            for row in rows {
                let want = match log {
                    true => reference::log_softmax(&row, 1, 4, 1),
                    false => reference::softmax(&row, 1, 4, 1),
                };
                close(&run(&row, 1, 4, 1, log), &want, log).unwrap();
                // The same row as a column (inner 2: a second line of zeros beside it).
                let col: Vec<f32> = row.iter().flat_map(|&v| [v, 0.0]).collect();
                let want = match log {
                    true => reference::log_softmax(&col, 1, 4, 2),
                    false => reference::softmax(&col, 1, 4, 2),
                };
                close(&run(&col, 1, 4, 2, log), &want, log).unwrap();
            }
        }
    }
}
