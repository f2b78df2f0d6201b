//! Matrix products: column-major, strided-batched `C = op(A) op(B)` with cuBLAS semantics
//! (alpha 1, beta 0), and the lowering of `linear` and `batch_matmul` to it.
//!
//! A row-major `[r, c]` buffer is the column-major `c x r` matrix (its transpose), so
//! `Y = X W^T` (row-major, PyTorch's linear layer with `W: [out, in]`) is `Y^T = W X^T`,
//! computed as `gemm(T, N, m = out, n = rows, k = in)`; a row-major batched `C = A B` is the
//! column-major `C^T = B^T A^T`.
#![allow(unsafe_code)]

use cudarc::cublas::{result as blas, sys as blas_sys};
use opsched_graph::Activation;
use rayon::prelude::*;
use serde::Serialize;

use super::act::BiasAct;
use super::{Access, Step, StepKernel};
use crate::cpu::math::{sgemm_strided, Mat};
use crate::cpu::CpuIo;
use crate::cuda::cudnn::c_int;
use crate::cuda::{Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{weight_half_width, At, BufId, Builder, Src};
use crate::GpuError;

/// A (batched) matrix product.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Gemm {
    pub a: BufId,
    pub b: BufId,
    pub c: BufId,
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
    pub batch: usize,
}

/// A `linear` operator: out features, bias, activation, and the residual sum it computes
/// (`opsched_graph::fusion::residual_source`: the node it adds, and the activation it then
/// applies instead of its own, which is none).
pub(crate) type Linear = (
    usize,
    bool,
    Activation,
    Option<(opsched_graph::NodeId, Activation)>,
);

/// Lower a `linear` operator: a product with the weight, then bias, residual and activation.
pub(crate) fn lower_linear(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    (out_features, bias, act, residual): Linear,
    src: Src<'_>,
    out: BufId,
) -> Result<(), GpuError> {
    let (residual, act) = match residual {
        Some((z, act)) => (Some(b.source(z, at.node, at.gpu)?), act),
        None => (None, act),
    };
    let (x, xs) = b.single(steps, at, src)?;
    let k = xs.last().copied().unwrap_or(1);
    let rows = xs.iter().product::<usize>() / k.max(1);
    let nf = out_features;
    let w = b.param(at, "weight", nf * k, 0.0, weight_half_width(k))?;
    let bias = bias
        .then(|| b.param(at, "bias", nf, 0.0, 0.1))
        .transpose()?;
    steps.push(
        Gemm {
            a: w,
            b: x,
            c: out,
            trans_a: true,
            trans_b: false,
            m: nf,
            n: rows,
            k,
            lda: k,
            ldb: k,
            ldc: nf,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
            batch: 1,
        }
        .into(),
    );
    if bias.is_some() || act != Activation::None || residual.is_some() {
        steps.push(
            BiasAct {
                y: out,
                bias,
                total: rows * nf,
                channels: nf,
                inner: 1,
                act,
                residual,
            }
            .into(),
        );
    }
    Ok(())
}

/// Lower a `batch_matmul` operator: `[.., M, K] x [.., K, N]` (`[.., N, K]` transposed).
pub(crate) fn lower_batch_matmul(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    transpose_b: bool,
    src: Src<'_>,
    out: BufId,
    out_shape: &[usize],
) -> Result<(), GpuError> {
    let ts = b.terms(steps, at, src)?;
    let [(a, sa), (bb, _)] = ts.as_slice() else {
        return Err(b.unsupported(at, "batch_matmul needs two inputs"));
    };
    let r = sa.len();
    if r < 2 {
        return Err(b.unsupported(at, "batch_matmul needs rank >= 2"));
    }
    let (m, k) = (sa[r - 2], sa[r - 1]);
    let n = out_shape.last().copied().unwrap_or(1);
    let batch = sa[..r - 2].iter().product();
    // Row-major C[M,N] = A[M,K] B[K,N]  <=>  column-major C^T = B^T A^T.
    steps.push(
        Gemm {
            a: *bb,
            b: *a,
            c: out,
            trans_a: transpose_b,
            trans_b: false,
            m: n,
            n: m,
            k,
            lda: if transpose_b { k } else { n },
            ldb: k,
            ldc: n,
            stride_a: k * n,
            stride_b: m * k,
            stride_c: m * n,
            batch,
        }
        .into(),
    );
    Ok(())
}

impl Gemm {
    /// Elements of a column-major `rows x cols` operand with leading dimension `ld`, over the
    /// batch.
    fn reach(&self, rows: usize, cols: usize, ld: usize, stride: usize) -> usize {
        if rows == 0 || cols == 0 || self.batch == 0 {
            return 0;
        }
        (self.batch - 1) * stride + (cols - 1) * ld + rows
    }

    /// Stored shapes (rows, cols) of A and B.
    fn stored(&self) -> ((usize, usize), (usize, usize)) {
        let a = if self.trans_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        let b = if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        (a, b)
    }

    /// Views of op(A) and op(B) of one batch: element `(i, p)` of a column-major `ld` matrix
    /// is at `i + p * ld`; a transpose swaps the strides.
    fn views<'a>(&self, a: &'a [f32], b: &'a [f32]) -> (Mat<'a>, Mat<'a>) {
        let (m, n, k) = (self.m, self.n, self.k);
        let va = if self.trans_a {
            Mat::strided(a, m, k, self.lda, 1)
        } else {
            Mat::strided(a, m, k, 1, self.lda)
        };
        let vb = if self.trans_b {
            Mat::strided(b, k, n, self.ldb, 1)
        } else {
            Mat::strided(b, k, n, 1, self.ldb)
        };
        (va, vb)
    }
}

impl StepKernel for Gemm {
    fn kind(&self) -> &'static str {
        "gemm"
    }

    fn access(&self) -> Access {
        let ((ar, ac), (br, bc)) = self.stored();
        Access {
            reads: vec![
                (self.a, self.reach(ar, ac, self.lda, self.stride_a)),
                (self.b, self.reach(br, bc, self.ldb, self.stride_b)),
            ],
            writes: vec![(self.c, self.reach(self.m, self.n, self.ldc, self.stride_c))],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let a = io.read(self.a)?;
        let b = io.read(self.b)?;
        let c = io.write(self.c)?;
        if self.batch == 0 || self.m == 0 || self.n == 0 {
            return Ok(());
        }
        let one = |bi: usize, c: &mut [f32]| {
            let (va, vb) = self.views(&a[bi * self.stride_a..], &b[bi * self.stride_b..]);
            sgemm_strided(va, vb, c, 1, self.ldc)
        };
        if self.batch > 1 && self.stride_c >= self.ldc * self.n {
            c[..self.batch * self.stride_c]
                .par_chunks_mut(self.stride_c)
                .enumerate()
                .try_for_each(|(bi, cb)| one(bi, cb))
        } else if self.batch == 1 && self.n > 1 && self.m * self.n * self.k >= 1 << 20 {
            // Columns of C (contiguous) in blocks, with the matching columns of op(B).
            let cols = self.n.div_ceil(2 * rayon::current_num_threads()).max(1);
            let (bstride_col, va) = (if self.trans_b { 1 } else { self.ldb }, self.views(a, b).0);
            c[..self.ldc * self.n]
                .par_chunks_mut(self.ldc * cols)
                .enumerate()
                .try_for_each(|(t, cc)| {
                    let j0 = t * cols;
                    let nj = cc.len().div_ceil(self.ldc).min(self.n - j0);
                    let vb = if self.trans_b {
                        Mat::strided(&b[j0 * bstride_col..], self.k, nj, self.ldb, 1)
                    } else {
                        Mat::strided(&b[j0 * bstride_col..], self.k, nj, 1, self.ldb)
                    };
                    sgemm_strided(va, vb, cc, 1, self.ldc)
                })
        } else {
            (0..self.batch).try_for_each(|bi| one(bi, &mut c[bi * self.stride_c..]))
        }
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        Ok(Box::new(CudaGemm {
            a: cx.ptr(self.a)?,
            b: cx.ptr(self.b)?,
            c: cx.ptr(self.c)?,
            ta: self.trans_a,
            tb: self.trans_b,
            mnk: [
                c_int(self.m, "m")?,
                c_int(self.n, "n")?,
                c_int(self.k, "k")?,
            ],
            ld: [
                c_int(self.lda, "lda")?,
                c_int(self.ldb, "ldb")?,
                c_int(self.ldc, "ldc")?,
            ],
            strides: [
                self.stride_a as i64,
                self.stride_b as i64,
                self.stride_c as i64,
            ],
            batch: c_int(self.batch, "batch")?,
            tf32: cx.opts.tf32,
        }))
    }
}

struct CudaGemm {
    a: u64,
    b: u64,
    c: u64,
    ta: bool,
    tb: bool,
    mnk: [i32; 3],
    ld: [i32; 3],
    strides: [i64; 3],
    batch: i32,
    tf32: bool,
}

impl Enqueue for CudaGemm {
    fn enqueue(&self, _gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (one, zero) = (1.0f32, 0.0f32);
        let h = sc.cublas();
        let math = if self.tf32 {
            blas_sys::cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
        } else {
            blas_sys::cublasMath_t::CUBLAS_DEFAULT_MATH
        };
        // SAFETY: a live handle bound to this stream; the math mode is a host-side setting.
        unsafe { blas_sys::cublasSetMathMode(h, math) }
            .result()
            .map_err(|e| GpuError::cublas("setting the math mode", e))?;
        let [m, n, k] = self.mnk;
        // SAFETY: dimensions, leading dimensions and strides describe the buffers (their reach
        // was checked at preparation); the handle is bound to this stream.
        unsafe {
            if self.batch == 1 {
                blas::sgemm(
                    h,
                    op(self.ta),
                    op(self.tb),
                    m,
                    n,
                    k,
                    &one,
                    self.a as *const f32,
                    self.ld[0],
                    self.b as *const f32,
                    self.ld[1],
                    &zero,
                    self.c as *mut f32,
                    self.ld[2],
                )
            } else {
                blas::sgemm_strided_batched(
                    h,
                    op(self.ta),
                    op(self.tb),
                    m,
                    n,
                    k,
                    &one,
                    self.a as *const f32,
                    self.ld[0],
                    self.strides[0],
                    self.b as *const f32,
                    self.ld[1],
                    self.strides[1],
                    &zero,
                    self.c as *mut f32,
                    self.ld[2],
                    self.strides[2],
                    self.batch,
                )
            }
        }
        .map_err(|e| GpuError::cublas("running a gemm", e))
    }
}
