//! Matrix products: column-major, strided-batched `C = alpha op(A) op(B)` with cuBLAS
//! semantics (beta 0), and the lowering of `linear` and `batch_matmul` to it. A linear layer's
//! bias, residual and relu are the product's epilogue ([`GemmEpilogue`]): on the GPU inside
//! cuBLASLt's kernel, on the CPU the bias kernel's code right after the product (so both
//! orders of evaluation match the separate kernels'); another activation keeps the bias
//! kernel after the product ([`opsched_graph::fusion::gemm_epilogue`]).
//!
//! On CUDA a product runs the faster, as measured once per shape and kept in the cost cache
//! ([`crate::tuning::GEMM_KEY`]), of cuBLAS's own choice (with the bias kernel after it where
//! there is an epilogue) and the top configurations of cuBLASLt's heuristic
//! ([`crate::GemmKernel`]); products over an array of addresses (several sequences through
//! head transposes) run cuBLAS's batched call, and a batch whose results interleave in C
//! (one sequence written through a head transpose) cuBLAS's strided batch.
//!
//! A row-major `[r, c]` buffer is the column-major `c x r` matrix (its transpose), so
//! `Y = X W^T` (row-major, PyTorch's linear layer with `W: [out, in]`) is `Y^T = W X^T`,
//! computed as `gemm(T, N, m = out, n = rows, k = in)`; a row-major batched `C = A B` is the
//! column-major `C^T = B^T A^T`.
#![allow(unsafe_code)]

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::cublaslt::{result as lt, sys as lt_sys};
use cudarc::driver::{CudaSlice, DevicePtr};
use opsched_graph::Activation;
use rayon::prelude::*;
use serde::Serialize;

use super::act::BiasAct;
use super::{Access, Step, StepKernel};
use crate::cpu::direct;
use crate::cpu::math::{self, sgemm_scaled, Mat};
use crate::cpu::CpuIo;
use crate::cuda::cudnn::c_int;
use crate::cuda::{Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{weight_half_width, At, BufId, Builder, Init, MergedLinear, Operand, Src};
use crate::{GemmKernel, GpuError};

/// Columns of C (tokens) up to which the CPU device multiplies a constant op(A) in panels
/// ([`Gemm::packed_cpu`]; measured at 16).
const PANEL_COLUMNS: usize = 64;

/// Rows of op(A) a task of a product with fewer columns than rows takes
/// ([`Gemm::row_blocks_cpu`]): whole tiles of `gemm`'s microkernel and whole blocks of
/// `math::interleave_rows`.
const ROW_BLOCK: usize = 128;

/// A (batched) matrix product.
#[derive(Clone, Debug, PartialEq, Serialize)]
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
    /// Groups of `batch` products, `outer_stride` elements apart in A, B and C: products read
    /// or written through head transposes, with heads inside sequences (1 otherwise).
    pub outer: usize,
    pub outer_stride: [usize; 3],
    /// The product's scale (cuBLAS's alpha): attention's `1 / sqrt(head size)`, else 1.
    pub alpha: f32,
    /// What the same kernel does to `C` after the product (a single, dense product only).
    pub epilogue: Option<GemmEpilogue>,
    /// How the CPU device's copy of this product reads op(A) from what `Gemm::packed_cpu`
    /// repacked (given to `Gemm::run_cpu_packed`); never set in a program.
    #[serde(skip)]
    pub packed_a: PackedA,
}

/// How the CPU device holds op(A) of a product whose A is a constant (`Gemm::packed_cpu`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PackedA {
    /// As the program stores it.
    #[default]
    No,
    /// Column-major, `m` apart, for `gemm`.
    ColumnMajor,
    /// In panels of 16 rows for [`crate::cpu::direct::product_columns`].
    Panels,
    /// Rows interleaved in blocks for `cpu::math::matrix_vector_interleaved` (one
    /// column of B).
    RowBlocks,
}

/// `C := act((C + bias) + residual)`, with `bias` per row of the column-major `C` (per output
/// feature of a linear layer) and `residual` of `C`'s shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GemmEpilogue {
    pub bias: Option<BufId>,
    pub residual: Option<BufId>,
    pub act: Activation,
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
        Some((z, act)) => {
            let z = b.source(steps, at, z)?;
            (Some(b.readable(steps, at, z)), act)
        }
        None => (None, act),
    };
    let (x, xs) = b.single(steps, at, src)?;
    let k = xs.last().copied().unwrap_or(1);
    let nf = out_features;
    let w = b.param(at, "weight", nf * k, 0.0, weight_half_width(k))?;
    let bias = bias.then(|| b.bias_param(at, nf)).transpose()?;
    push_linear(steps, (x, &xs), w, bias, nf, act, residual, out);
    Ok(())
}

/// Lower the linear layers of a merged stage ([`MergedLinear`]) as one: the members' weights
/// stacked (each `[features, k]`, row-major) and their biases side by side, into the merged
/// output, whose row holds every member's features in the members' order.
pub(crate) fn lower_merged_linear(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    m: &MergedLinear,
    src: Src<'_>,
) -> Result<(), GpuError> {
    let (x, xs) = b.single(steps, at, src)?;
    let k = xs.last().copied().unwrap_or(1);
    let nf = m.out_features;
    let wlen = super::product(&[nf, k], "merged linear weights")?;
    let mut weight = Vec::with_capacity(wlen);
    let mut bias = Vec::with_capacity(if m.bias { nf } else { 0 });
    for &(node, features) in &m.members {
        let len = super::product(&[features, k], "linear weights")?;
        let part_bias = m.bias.then_some(features);
        let (w, part_bias) = b.member_params(At { node, ..at }, len, k, part_bias)?;
        weight.extend(w);
        bias.extend(part_bias);
    }
    if weight.len() != wlen || bias.len() != if m.bias { nf } else { 0 } {
        return Err(b.unsupported(at, "the merged linear layers do not add up"));
    }
    let w = b.param_buffer(at, "merged weight", wlen, Init::Data(weight.into()));
    let bias = m
        .bias
        .then(|| b.param_buffer(at, "merged bias", nf, Init::Data(bias.into())));
    push_linear(steps, (x, &xs), w, bias, nf, m.act, None, m.out);
    Ok(())
}

/// The steps of a linear layer `Y = X W^T (+ bias, residual, activation)` over `x` (of shape
/// `xs`, rows of its last axis) into `out`: the product with its epilogue where cuBLASLt's
/// kernel applies it, else the bias kernel after the product.
#[allow(clippy::too_many_arguments)]
fn push_linear(
    steps: &mut Vec<Step>,
    (x, xs): (BufId, &[usize]),
    w: BufId,
    bias: Option<BufId>,
    nf: usize,
    act: Activation,
    residual: Option<BufId>,
    out: BufId,
) {
    let k = xs.last().copied().unwrap_or(1);
    let rows = xs.iter().product::<usize>() / k.max(1);
    let after = bias.is_some() || act != Activation::None || residual.is_some();
    let in_product = after && opsched_graph::fusion::gemm_epilogue(act);
    steps.push(
        Gemm {
            epilogue: in_product.then_some(GemmEpilogue {
                bias,
                residual,
                act,
            }),
            ..Gemm::linear(w, x, out, [nf, rows, k])
        }
        .into(),
    );
    if after && !in_product {
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
}

/// Lower a `batch_matmul` operator: `[.., M, K] x [.., K, N]` (`[.., N, K]` transposed). An
/// operand read through a head transpose, and a result written into the head transpose after
/// it ([`Builder::operand`], [`Builder::transposed_out`]), take their row, head and sequence
/// strides; the batch `[sequences, heads]` is then `outer` groups of `batch` products.
pub(crate) fn lower_batch_matmul(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    (transpose_b, alpha): (bool, f32),
    src: Src<'_>,
    out: BufId,
    out_shape: &[usize],
) -> Result<(), GpuError> {
    let ops = match src {
        Src::Terms(terms) => terms
            .iter()
            .map(|t| b.operand(steps, at, t))
            .collect::<Result<Vec<_>, _>>()?,
        Src::Buf(..) => b
            .terms(steps, at, src)?
            .into_iter()
            .map(|(buf, shape)| Operand {
                buf,
                shape,
                strides: None,
            })
            .collect(),
    };
    let [lhs, rhs] = ops.as_slice() else {
        return Err(b.unsupported(at, "batch_matmul needs two inputs"));
    };
    let (a, sa, a_strides) = (&lhs.buf, &lhs.shape, lhs.strides);
    let (bb, b_strides) = (&rhs.buf, rhs.strides);
    let r = sa.len();
    if r < 2 {
        return Err(b.unsupported(at, "batch_matmul needs rank >= 2"));
    }
    let (m, k) = (sa[r - 2], sa[r - 1]);
    let n = out_shape.last().copied().unwrap_or(1);
    let (c, c_strides) = match b.transposed_out(at) {
        Some((buf, strides)) => (buf, Some(strides)),
        None => (out, None),
    };
    // Through a head transpose the batch is [sequences, heads]: sequences are the outer
    // groups. Otherwise one flat batch.
    let through = a_strides.is_some() || b_strides.is_some() || c_strides.is_some();
    let (outer, batch) = match &sa[..r - 2] {
        [seqs, heads] if through => (*seqs, *heads),
        dims => (1, dims.iter().product()),
    };
    // Row-major C[M,N] = A[M,K] B[K,N]  <=>  column-major C^T = B^T A^T; a row-major matrix's
    // row stride is the column-major one's leading dimension. Dense matrices follow one
    // another, `batch` of them per outer group.
    let dense = |ld: usize, len: usize| (ld, len, batch * len);
    let (lda, stride_a, outer_a) =
        b_strides.unwrap_or(dense(if transpose_b { k } else { n }, k * n));
    let (ldb, stride_b, outer_b) = a_strides.unwrap_or(dense(k, m * k));
    let (ldc, stride_c, outer_c) = c_strides.unwrap_or(dense(n, m * n));
    steps.push(
        Gemm {
            a: *bb,
            b: *a,
            c,
            trans_a: transpose_b,
            trans_b: false,
            m: n,
            n: m,
            k,
            lda,
            ldb,
            ldc,
            stride_a,
            stride_b,
            stride_c,
            batch,
            outer,
            outer_stride: [outer_a, outer_b, outer_c],
            alpha,
            epilogue: None,
            packed_a: PackedA::No,
        }
        .into(),
    );
    Ok(())
}

impl Gemm {
    /// A linear layer's product without its epilogue: column-major C (`nf x rows`, in `c`)
    /// = W (`[nf, k]` row-major, in `w`) times the `rows x k` input `x` transposed.
    fn linear(w: BufId, x: BufId, c: BufId, [nf, rows, k]: [usize; 3]) -> Gemm {
        Gemm {
            a: w,
            b: x,
            c,
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
            outer: 1,
            outer_stride: [0; 3],
            alpha: 1.0,
            epilogue: None,
            packed_a: PackedA::No,
        }
    }

    /// The separate bias kernel that does what epilogue `e` does.
    fn bias_act(&self, e: &GemmEpilogue) -> BiasAct {
        BiasAct {
            y: self.c,
            bias: e.bias,
            total: self.m * self.n,
            channels: self.m,
            inner: 1,
            act: e.act,
            residual: e.residual,
        }
    }

    /// Elements of a column-major `rows x cols` operand with leading dimension `ld`, over the
    /// batch (matrices `stride` apart) and the outer groups (`outer_stride` apart).
    fn reach(&self, rows: usize, cols: usize, ld: usize, stride: usize, outer: usize) -> usize {
        if rows == 0 || cols == 0 || self.batch == 0 || self.outer == 0 {
            return 0;
        }
        (self.outer - 1) * outer + (self.batch - 1) * stride + (cols - 1) * ld + rows
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
        let va = if self.packed_a == PackedA::ColumnMajor {
            Mat::strided(a, m, k, 1, m)
        } else if self.trans_a {
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
        let [oa, ob, oc] = self.outer_stride;
        let mut reads = vec![
            (self.a, self.reach(ar, ac, self.lda, self.stride_a, oa)),
            (self.b, self.reach(br, bc, self.ldb, self.stride_b, ob)),
        ];
        if let Some(e) = &self.epilogue {
            reads.extend(e.bias.map(|b| (b, self.m)));
            reads.extend(e.residual.map(|r| (r, self.m * self.n)));
        }
        Access {
            reads,
            writes: vec![(
                self.c,
                self.reach(self.m, self.n, self.ldc, self.stride_c, oc),
            )],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        self.run_cpu_packed(io, None)
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        let (a, b) = (cx.strided(self.a)?.1, cx.strided(self.b)?.1);
        if a.is_none() && b.is_none() {
            return self.prepare_where_dense(cx);
        }
        match self.over_runs(a, b) {
            Some(g) => g.prepare_where_dense(cx),
            None => Err(cx.no_kernel("a product of a strided view whose runs are not its rows")),
        }
    }
}

/// The leading dimension and outer stride that read an operand through `runs` (a strided
/// view: runs of `run` elements, `stride` apart) where each of its columns is one run: the
/// column-major operand's columns are `ld` apart and each column's `rows` elements of every
/// matrix of the batch (`stride` apart) lie within one run; outer groups (`outer` apart, a
/// whole number of runs) scale alike. `None` where the operand does not lie so.
fn through_runs(
    r: crate::program::Runs,
    (ld, stride, outer): (usize, usize, usize),
    rows: usize,
    batch: usize,
) -> Option<(usize, usize)> {
    let within = batch
        .saturating_sub(1)
        .checked_mul(stride)?
        .checked_add(rows)?;
    (ld == r.run && within <= r.run && outer.is_multiple_of(r.run))
        .then(|| (r.stride, outer / r.run * r.stride))
}

impl Gemm {
    /// This product reading A and B where they lie when they are strided views (`a`, `b`:
    /// their runs), each column one run (a merged product's member, read through a head
    /// transpose: [`through_runs`]); `None` where an operand does not lie so.
    fn over_runs(
        &self,
        a: Option<crate::program::Runs>,
        b: Option<crate::program::Runs>,
    ) -> Option<Gemm> {
        let ((ar, _), (br, _)) = self.stored();
        let mut g = self.clone();
        if let Some(r) = a {
            let outer = self.outer_stride[0];
            (g.lda, g.outer_stride[0]) =
                through_runs(r, (self.lda, self.stride_a, outer), ar, self.batch)?;
        }
        if let Some(r) = b {
            let outer = self.outer_stride[1];
            (g.ldb, g.outer_stride[1]) =
                through_runs(r, (self.ldb, self.stride_b, outer), br, self.batch)?;
        }
        Some(g)
    }

    /// [`StepKernel::prepare_cuda`] of a product whose operands lie as its strides say.
    fn prepare_where_dense(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        use crate::tuning::{choose, Candidate, GEMM_CUBLAS, GEMM_CUBLAS_SPLIT, GEMM_LT};
        let gemm = CudaGemm::new(self, cx)?;
        if self.epilogue.is_some() && (self.batch != 1 || self.outer != 1 || self.ldc != self.m) {
            return Err(cx.no_kernel("an epilogue of a batched or strided product"));
        }
        // Groups through an array of addresses: cuBLAS's batched call is the one kernel.
        if self.outer > 1 {
            return Ok(Box::new(gemm));
        }
        let (separate, cublas): (Box<dyn Enqueue>, u32) = match &self.epilogue {
            None => (Box::new(gemm), GEMM_CUBLAS),
            Some(e) => {
                let after = super::act::CudaBiasAct::new(cx, &self.bias_act(e))?;
                (Box::new(GemmThen { gemm, after }), GEMM_CUBLAS_SPLIT)
            }
        };
        // Results interleaved in C (a product writing through a head transpose at batch 1)
        // stay with cuBLAS's strided batch, which a GPU has checked; cuBLASLt's batch
        // layout is not known to allow them.
        if self.batch > 1 && self.stride_c < self.ldc * self.n {
            return Ok(separate);
        }
        let mut lt = match CudaLtGemm::new(self, cx) {
            Ok(lt) => lt,
            Err(err) => {
                tracing::debug!("cuBLASLt cannot run this product ({err}): cuBLAS");
                return Ok(separate);
            }
        };
        let configs = lt.heuristic(LT_TOP).unwrap_or_else(|err| {
            tracing::debug!("cuBLASLt's heuristic has no configuration ({err}): cuBLAS");
            Vec::new()
        });
        let last = u32::try_from(configs.len()).unwrap_or(u32::MAX);
        let code = match cx.opts.gemm {
            GemmKernel::Heuristic if self.epilogue.is_some() && last > 0 => GEMM_LT,
            GemmKernel::Heuristic => cublas,
            GemmKernel::LtRank(r) if last > 0 => GEMM_LT + r.min(last - 1),
            GemmKernel::LtRank(_) => cublas,
            GemmKernel::Measured => {
                let key = self.tuning_key(cx.opts.tf32, lt.align, lt_version());
                let (gpu, sc): (&Gpu, &StreamCtx) = (cx.gpu, cx.sc);
                let measured = cx.tuning.get_or_measure(&key, || {
                    let time =
                        |run: &dyn Fn() -> Result<(), GpuError>| sc.time_ms(gpu, TIMING_REPS, run);
                    let mut c = Vec::with_capacity(configs.len() + 1);
                    let mut add = |algo: u32, math: u32, ms: Result<f64, GpuError>| match ms {
                        // Every candidate uses the stream's cuBLAS workspace: none of its own.
                        Ok(ms) => c.push(Candidate {
                            algo,
                            math,
                            ms,
                            workspace: 0,
                        }),
                        Err(e) => tracing::debug!("product kernel {algo} left out: {e}"),
                    };
                    add(cublas, 0, time(&|| separate.enqueue(gpu, sc)));
                    for (rank, cfg) in (0u32..).zip(&configs) {
                        add(
                            GEMM_LT + rank,
                            cfg.identity,
                            time(&|| lt.run(&cfg.algo, sc)),
                        );
                    }
                    Ok::<_, GpuError>(c)
                })?;
                // A configuration counts only where this cuBLASLt still lists it at its rank.
                let listed = |c: &Candidate| {
                    c.algo == cublas
                        || c.algo.checked_sub(GEMM_LT).is_some_and(|r| {
                            configs
                                .get(r as usize)
                                .is_some_and(|cfg| cfg.identity == c.math)
                        })
                };
                let valid: Vec<Candidate> = measured.iter().copied().filter(listed).collect();
                if valid.len() < measured.len() {
                    tracing::warn!(
                        "cuBLASLt's heuristic no longer lists every configuration measured for \
                         {key}: choosing among the others (--retune measures again)"
                    );
                }
                let code = choose(&valid, usize::MAX).map_or(cublas, |c| c.algo);
                let family = match code == cublas {
                    true => crate::tuning::KernelFamily::Cublas,
                    false => crate::tuning::KernelFamily::CublasLt,
                };
                cx.tuning.chose(&key, family);
                code
            }
        };
        match code
            .checked_sub(GEMM_LT)
            .and_then(|r| configs.get(r as usize))
        {
            Some(cfg) if code != cublas => {
                lt.algo = cfg.algo;
                Ok(Box::new(lt))
            }
            _ => Ok(separate),
        }
    }
}

/// cuBLASLt's configurations measured per product, from the top of its heuristic's list.
const LT_TOP: usize = 8;

/// GPU runs per captured graph when timing a product's kernel.
const TIMING_REPS: usize = 10;

/// The version of the cuBLASLt library loaded (e.g. 130100).
fn lt_version() -> usize {
    // SAFETY: no arguments; loads the library like every other cuBLASLt call.
    unsafe { lt_sys::cublasLtGetVersion() }
}

impl Gemm {
    /// The tuning key of this product ([`crate::tuning::GEMM_KEY`]): everything cuBLASLt's
    /// heuristic sees (shape, operations, leading dimensions, batch and strides, epilogue,
    /// the operands' alignment in bytes, math) and the library's version.
    fn tuning_key(&self, tf32: bool, align: [u32; 4], version: usize) -> String {
        let op = |t: bool| if t { 'T' } else { 'N' };
        let epilogue = match &self.epilogue {
            None => "none".to_string(),
            Some(e) => format!(
                "{}{}{}",
                if e.bias.is_some() { "bias" } else { "" },
                if e.residual.is_some() {
                    "+residual"
                } else {
                    ""
                },
                if e.act == Activation::Relu {
                    "+relu"
                } else {
                    ""
                }
            ),
        };
        format!(
            "{}m={}|n={}|k={}|op={}{}|ld={}.{}.{}|batch={}|stride={}.{}.{}|ep={epilogue}\
             |align={}.{}.{}.{}|{}|cublaslt={version}",
            crate::tuning::GEMM_KEY,
            self.m,
            self.n,
            self.k,
            op(self.trans_a),
            op(self.trans_b),
            self.lda,
            self.ldb,
            self.ldc,
            self.batch,
            self.stride_a,
            self.stride_b,
            self.stride_c,
            align[0],
            align[1],
            align[2],
            align[3],
            if tf32 { "tf32" } else { "fp32" },
        )
    }
}

/// The alignment cuBLASLt may assume of an operand at device address `ptr` whose batch
/// members are `stride` elements apart (`batch` of them): the largest power of two up to 256
/// bytes that divides every member's address.
fn operand_alignment(ptr: u64, stride: usize, batch: usize) -> u32 {
    let mut bits = ptr.trailing_zeros().min(8);
    if batch > 1 {
        // 4 bytes an element: two more trailing zeros than the stride in elements.
        bits = bits.min(stride.trailing_zeros().saturating_add(2));
    }
    1 << bits
}

impl Gemm {
    /// The product alone, on the CPU: the outer groups in parallel where their parts of C
    /// do not interleave.
    /// [`StepKernel::run_cpu`], op(A) read from `packed` where given ([`Gemm::packed_cpu`]).
    pub(crate) fn run_cpu_packed(
        &self,
        io: &mut CpuIo<'_>,
        packed: Option<&[f32]>,
    ) -> Result<(), GpuError> {
        self.product_cpu(io, packed)?;
        match &self.epilogue {
            Some(e) => self.bias_act(e).run_cpu(io),
            None => Ok(()),
        }
    }

    fn product_cpu(&self, io: &mut CpuIo<'_>, packed: Option<&[f32]>) -> Result<(), GpuError> {
        let a = match packed {
            Some(p) => p,
            None => io.read(self.a)?,
        };
        let b = io.read(self.b)?;
        let c = io.write(self.c)?;
        if self.outer == 0 || self.batch == 0 || self.m == 0 || self.n == 0 {
            return Ok(());
        }
        if self.packed_a == PackedA::RowBlocks {
            return self.row_blocks_packed(a, b, c);
        }
        if self.packed_a == PackedA::Panels {
            let strides = if self.trans_b {
                [self.ldb, 1]
            } else {
                [1, self.ldb]
            };
            let mkn = [self.m, self.k, self.n];
            return direct::product_columns(a, mkn, b, strides, c, self.ldc, self.alpha);
        }
        let [oa, ob, oc] = self.outer_stride;
        if self.outer == 1 {
            return self.group_cpu(a, b, c);
        }
        let group_c = self.reach(self.m, self.n, self.ldc, self.stride_c, 0);
        let group = |o: usize, c: &mut [f32]| self.group_cpu(&a[o * oa..], &b[o * ob..], c);
        if oc >= group_c {
            c[..(self.outer - 1) * oc + group_c]
                .par_chunks_mut(oc)
                .enumerate()
                .try_for_each(|(o, cg)| group(o, cg))
        } else {
            (0..self.outer).try_for_each(|o| group(o, &mut c[o * oc..]))
        }
    }

    /// One outer group of `batch` products, from the start of `a`, `b` and `c`.
    fn group_cpu(&self, a: &[f32], b: &[f32], c: &mut [f32]) -> Result<(), GpuError> {
        let threads = rayon::current_num_threads();
        let one = |bi: usize, c: &mut [f32]| {
            let (va, vb) = self.views(&a[bi * self.stride_a..], &b[bi * self.stride_b..]);
            sgemm_scaled(va, vb, c, [1, self.ldc], self.alpha)
        };
        if self.batch > 1 && self.stride_c >= self.ldc * self.n {
            c[..self.batch * self.stride_c]
                .par_chunks_mut(self.stride_c)
                .enumerate()
                .try_for_each(|(bi, cb)| one(bi, cb))
        } else if self.batch == 1 && self.n < self.m && self.m * self.n * self.k >= 1 << 20
            || self.batch == 1 && self.n == 1 && self.m * self.k >= 1 << 16 && threads > 1
        {
            // (One column: a matrix-vector product streams its matrix from memory, which
            // two cores read faster than one, from 256 KiB on: on 2 cores GoogLeNet's and
            // DenseNet-121's classifiers 0.20-0.22 -> 0.12-0.13 ms. On one thread the
            // blocks' copies cost 4%.)
            self.row_blocks_cpu(a, b, c)
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
                    sgemm_scaled(va, vb, cc, [1, self.ldc], self.alpha)
                })
        } else {
            (0..self.batch).try_for_each(|bi| one(bi, &mut c[bi * self.stride_c..]))
        }
    }
}

impl Gemm {
    /// For the CPU device: this product reading op(A) from `packed` (its `values` repacked)
    /// where op(A) is a constant stored row-major (a linear layer's `[out, in]` weights).
    /// Over a few tokens ([`PANEL_COLUMNS`]), in panels of 16 rows that stream through once
    /// ([`direct::product_columns`]): measured with the weights out of cache, as a model runs
    /// them, 10-20% faster than `gemm` on BERT, DistilBERT and GPT-2 (16 tokens), though
    /// slower on one layer run again and again in cache. Over more, column-major (`m` apart),
    /// so that `gemm` packs it with vector copies instead of gathering it element by element
    /// on every run (2/3 of BERT's time once). For one column (one token: a classifier), its
    /// rows interleaved in blocks ([`math::interleave_rows`]), so that the matrix-vector
    /// product streams them from memory in one run instead of eight. `None` for other
    /// products.
    pub(crate) fn packed_cpu(&self, values: &[f32]) -> Option<(Gemm, Vec<f32>)> {
        // Small weights are multiplied unpacked (`gemm` takes another path for them, which
        // would give other bits).
        let big = self.m * self.k >= 1 << 12;
        let rows_apart = self.lda >= self.k;
        if !big || !rows_apart || !self.trans_a || self.batch != 1 || self.outer != 1 {
            return None;
        }
        let (m, k) = (self.m, self.k);
        let rows = values.get(..(m - 1) * self.lda + k)?;
        // op(B)'s column dense (a token's features): the product reads it as the vector
        // `math::matrix_vector` reads in place, so the bits stay those of the rows unpacked.
        let column = !self.trans_b || self.ldb == 1;
        let (packed_a, t) = if self.n == 1 && column {
            let a = Mat::strided(rows, m, k, self.lda, 1);
            (PackedA::RowBlocks, math::interleave_rows(a))
        } else if self.n <= PANEL_COLUMNS {
            (PackedA::Panels, direct::pack(rows, m, k, self.lda))
        } else {
            let mut t = vec![0.0; m * k];
            Mat::strided(rows, m, k, self.lda, 1).transpose_into(&mut t, m);
            (PackedA::ColumnMajor, t)
        };
        let g = Gemm {
            packed_a,
            ..self.clone()
        };
        Some((g, t))
    }

    /// The product of one column ([`PackedA::RowBlocks`]: op(A) from `a` as
    /// [`math::interleave_rows`] laid it out): as the rows where they lie give it
    /// ([`Gemm::row_blocks_cpu`] where it is split), the same bits.
    fn row_blocks_packed(&self, a: &[f32], b: &[f32], c: &mut [f32]) -> Result<(), GpuError> {
        let (m, k) = (self.m, self.k);
        // (`packed_cpu` interleaves the rows only where op(B)'s column is dense.)
        let dense = !self.trans_b || self.ldb == 1;
        let fits = k > 0 && a.len() >= m * k && c.len() >= m && b.len() >= k;
        if !dense || !fits {
            return Err(GpuError::Plan(format!(
                "matrix-vector product {m}x{k}: a buffer is not of its shape"
            )));
        }
        let x = &b[..k];
        let alpha = self.alpha;
        let rows = |a: &[f32], c: &mut [f32]| {
            let n = c.len();
            math::matrix_vector_interleaved(a, n, x, |i, v| c[i] = alpha * v)
        };
        // As `group_cpu` splits one column: blocks of whole layout blocks in parallel.
        if m * k >= 1 << 16 && rayon::current_num_threads() > 1 {
            c[..m]
                .par_chunks_mut(ROW_BLOCK)
                .enumerate()
                .for_each(|(t, cs)| rows(&a[t * ROW_BLOCK * k..], cs));
        } else {
            rows(a, &mut c[..m]);
        }
        Ok(())
    }

    /// One product with fewer columns of C than rows (a linear layer over a few tokens: op(A)
    /// its weights) in blocks of rows: each task multiplies only its rows of op(A), so the
    /// weights are read once in all (column blocks read all of them per task: 5-13x slower
    /// on BERT's layers), into scratch that is then copied into C's rows. Every element is
    /// the same product as unsplit (the inner dimension is never split).
    fn row_blocks_cpu(&self, a: &[f32], b: &[f32], c: &mut [f32]) -> Result<(), GpuError> {
        let (m, n) = (self.m, self.n);
        let (va, vb) = self.views(a, b);
        // Blocks of whole microkernel tiles (64 rows on AVX-512, 16 on AVX2), of a size that
        // does not depend on the threads, so neither do the bits.
        let rows = ROW_BLOCK;
        let blocks: Vec<std::ops::Range<usize>> =
            (0..m).step_by(rows).map(|i| i..(i + rows).min(m)).collect();
        let parts = blocks
            .par_iter()
            .map(|r| {
                let mut part = vec![0.0; r.len() * n];
                let block = va.row_block(r.clone());
                sgemm_scaled(block, vb, &mut part, [1, r.len()], self.alpha).map(|()| part)
            })
            .collect::<Result<Vec<_>, _>>()?;
        for (r, part) in blocks.iter().zip(&parts) {
            for (j, col) in part.chunks(r.len()).enumerate() {
                c[j * self.ldc + r.start..][..r.len()].copy_from_slice(col);
            }
        }
        Ok(())
    }
}

impl CudaGemm {
    /// The product `s` describes (its epilogue aside), on the buffers of `cx`: A and B read
    /// from their first elements through `s`'s strides, which reach a strided view's runs
    /// where one is ([`Gemm::over_runs`]).
    pub(crate) fn new(s: &Gemm, cx: &PrepareCx<'_>) -> Result<CudaGemm, GpuError> {
        // A and B may be strided views whose runs `s`'s leading dimensions already read
        // (`Gemm::prepare_cuda`); C is dense or written through its own strides.
        let (a, b, c) = (cx.first(s.a)?, cx.first(s.b)?, cx.ptr(s.c)?);
        // Groups of products: one batched call over every matrix's address (on the device,
        // where cuBLAS reads them), since no single stride reaches them all.
        let pointers = match s.outer {
            0 | 1 => None,
            outer => {
                let mut p = [Vec::new(), Vec::new(), Vec::new()];
                for o in 0..outer {
                    for i in 0..s.batch {
                        let at =
                            |base: u64, os: usize, st: usize| base + 4 * (o * os + i * st) as u64;
                        p[0].push(at(a, s.outer_stride[0], s.stride_a));
                        p[1].push(at(b, s.outer_stride[1], s.stride_b));
                        p[2].push(at(c, s.outer_stride[2], s.stride_c));
                    }
                }
                let [pa, pb, pc] = p;
                let held = [
                    cx.gpu.upload(&pa)?,
                    cx.gpu.upload(&pb)?,
                    cx.gpu.upload(&pc)?,
                ];
                let at = held
                    .each_ref()
                    .map(|h| h.device_ptr(&cx.gpu.alloc_stream).0);
                Some((held, at))
            }
        };
        Ok(CudaGemm {
            a,
            b,
            c,
            pointers,
            groups: c_int(s.outer * s.batch, "products")?,
            ta: s.trans_a,
            tb: s.trans_b,
            mnk: [c_int(s.m, "m")?, c_int(s.n, "n")?, c_int(s.k, "k")?],
            ld: [
                c_int(s.lda, "lda")?,
                c_int(s.ldb, "ldb")?,
                c_int(s.ldc, "ldc")?,
            ],
            strides: [s.stride_a as i64, s.stride_b as i64, s.stride_c as i64],
            batch: c_int(s.batch, "batch")?,
            tf32: cx.opts.tf32,
            alpha: s.alpha,
        })
    }
}

/// cuBLAS's operation on an operand: transposed or not.
fn blas_op(transposed: bool) -> blas_sys::cublasOperation_t {
    if transposed {
        blas_sys::cublasOperation_t::CUBLAS_OP_T
    } else {
        blas_sys::cublasOperation_t::CUBLAS_OP_N
    }
}

pub(crate) struct CudaGemm {
    a: u64,
    b: u64,
    c: u64,
    /// The addresses of every matrix of A, B and C, for products in outer groups: the device
    /// arrays holding them, and where those are.
    pointers: Option<([CudaSlice<u64>; 3], [u64; 3])>,
    /// How many products that is.
    groups: i32,
    ta: bool,
    tb: bool,
    mnk: [i32; 3],
    ld: [i32; 3],
    strides: [i64; 3],
    batch: i32,
    tf32: bool,
    alpha: f32,
}

impl Enqueue for CudaGemm {
    fn enqueue(&self, _gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        self.run(sc)
    }
}

impl CudaGemm {
    /// Enqueue the product on `sc`'s stream.
    pub(crate) fn run(&self, sc: &StreamCtx) -> Result<(), GpuError> {
        let zero = 0.0f32;
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
        if self.groups == 0 {
            return Ok(());
        }
        if let Some((_, [pa, pb, pc])) = self.pointers {
            // SAFETY: the arrays hold `groups` addresses each, of matrices inside A, B and C
            // with the leading dimensions given (their reach was checked at preparation), and
            // live as long as this operator; the handle is bound to this stream.
            return unsafe {
                blas_sys::cublasSgemmBatched(
                    h,
                    blas_op(self.ta),
                    blas_op(self.tb),
                    m,
                    n,
                    k,
                    &self.alpha,
                    pa as *const *const f32,
                    self.ld[0],
                    pb as *const *const f32,
                    self.ld[1],
                    &zero,
                    pc as *const *mut f32,
                    self.ld[2],
                    self.groups,
                )
            }
            .result()
            .map_err(|e| GpuError::cublas("running a batched gemm", e));
        }
        // SAFETY: dimensions, leading dimensions and strides describe the buffers (their reach
        // was checked at preparation); the handle is bound to this stream.
        unsafe {
            if self.batch == 1 {
                blas::sgemm(
                    h,
                    blas_op(self.ta),
                    blas_op(self.tb),
                    m,
                    n,
                    k,
                    &self.alpha,
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
                    blas_op(self.ta),
                    blas_op(self.tb),
                    m,
                    n,
                    k,
                    &self.alpha,
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

/// A product with the bias kernel after it (where cuBLASLt has no kernel for the epilogue).
struct GemmThen {
    gemm: CudaGemm,
    after: super::act::CudaBiasAct,
}

impl Enqueue for GemmThen {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        self.gemm.enqueue(gpu, sc)?;
        self.after.enqueue(gpu, sc)
    }
}

/// An owned cuBLASLt object: `$raw` made by the matching create call, destroyed once by
/// `$destroy` when dropped.
macro_rules! lt_owned {
    ($($name:ident($raw:ty) by $destroy:path;)*) => {$(
        struct $name($raw);
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: created once (the only constructor wraps a fresh object), destroyed
                // once here.
                let _ = unsafe { $destroy(self.0) };
            }
        }
    )*};
}

lt_owned! {
    LtHandle(lt_sys::cublasLtHandle_t) by lt::destroy_handle;
    LtDesc(lt_sys::cublasLtMatmulDesc_t) by lt::destroy_matmul_desc;
    LtLayout(lt_sys::cublasLtMatrixLayout_t) by lt::destroy_matrix_layout;
    LtPref(lt_sys::cublasLtMatmulPreference_t) by lt::destroy_matmul_pref;
}

/// A product in one cuBLASLt kernel, with its epilogue if it has one: `C = act(op(A) op(B) +
/// bias + beta Z)`, where `Z` is the residual (beta 1) or none (beta 0); a strided batch of
/// products when it has none.
struct CudaLtGemm {
    handle: LtHandle,
    desc: LtDesc,
    /// Layouts of A, B, and of C and D (the residual and the output share one).
    layouts: [LtLayout; 3],
    /// What the heuristic must respect: the workspace limit and the operands' alignment.
    pref: LtPref,
    /// The alignment of A, B, Z and C in bytes ([`operand_alignment`]).
    align: [u32; 4],
    /// The configuration [`Enqueue::enqueue`] runs.
    algo: lt_sys::cublasLtMatmulAlgo_t,
    a: u64,
    b: u64,
    c: u64,
    z: u64,
    alpha: f32,
    beta: f32,
}

/// One configuration of cuBLASLt's heuristic's list and its identity
/// ([`crate::tuning::lt_identity`]).
struct LtConfig {
    algo: lt_sys::cublasLtMatmulAlgo_t,
    identity: u32,
}

impl CudaLtGemm {
    fn new(s: &Gemm, cx: &PrepareCx<'_>) -> Result<CudaLtGemm, GpuError> {
        use lt_sys::cublasLtEpilogue_t as Ep;
        use lt_sys::cublasLtMatmulDescAttributes_t as DescAttr;
        use lt_sys::cublasLtMatmulPreferenceAttributes_t as PrefAttr;
        let err = |what: &'static str| move |e| GpuError::cublas(what, e);
        let handle = LtHandle(lt::create_handle().map_err(err("creating a cuBLASLt handle"))?);
        let compute = if cx.opts.tf32 {
            lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let f32_type = lt_sys::cudaDataType_t::CUDA_R_32F;
        let desc = LtDesc(
            lt::create_matmul_desc(compute, f32_type)
                .map_err(err("creating a cuBLASLt matmul descriptor"))?,
        );
        let set = |attr: DescAttr, value: *const std::ffi::c_void, size: usize| {
            // SAFETY: a live descriptor; `value` points to `size` bytes of the attribute's
            // type (each call below passes a local of that type).
            unsafe { lt::set_matmul_desc_attribute(desc.0, attr, value, size) }
                .map_err(err("setting a cuBLASLt matmul attribute"))
        };
        let (ta, tb) = (blas_op(s.trans_a), blas_op(s.trans_b));
        set(
            DescAttr::CUBLASLT_MATMUL_DESC_TRANSA,
            (&ta as *const blas_sys::cublasOperation_t).cast(),
            std::mem::size_of_val(&ta),
        )?;
        set(
            DescAttr::CUBLASLT_MATMUL_DESC_TRANSB,
            (&tb as *const blas_sys::cublasOperation_t).cast(),
            std::mem::size_of_val(&tb),
        )?;
        let none = GemmEpilogue {
            bias: None,
            residual: None,
            act: Activation::None,
        };
        let e = s.epilogue.as_ref().unwrap_or(&none);
        let relu = match e.act {
            Activation::None => false,
            Activation::Relu => true,
            other => {
                return Err(GpuError::Plan(format!(
                    "cuBLASLt's epilogue has no {other:?}"
                )))
            }
        };
        let epilogue = match (e.bias, relu) {
            (Some(_), false) => Ep::CUBLASLT_EPILOGUE_BIAS,
            (Some(_), true) => Ep::CUBLASLT_EPILOGUE_RELU_BIAS,
            (None, false) => Ep::CUBLASLT_EPILOGUE_DEFAULT,
            (None, true) => Ep::CUBLASLT_EPILOGUE_RELU,
        };
        set(
            DescAttr::CUBLASLT_MATMUL_DESC_EPILOGUE,
            (&epilogue as *const Ep).cast(),
            std::mem::size_of_val(&epilogue),
        )?;
        if let Some(bias) = e.bias {
            let p = cx.ptr(bias)?;
            set(
                DescAttr::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                (&p as *const u64).cast(),
                std::mem::size_of_val(&p),
            )?;
        }
        let batch = c_int(s.batch, "batch")?;
        let layout = |rows: usize, cols: usize, ld: usize, stride: usize| {
            let l = LtLayout(
                lt::create_matrix_layout(f32_type, rows as u64, cols as u64, ld as i64)
                    .map_err(err("creating a cuBLASLt matrix layout"))?,
            );
            if batch > 1 {
                use lt_sys::cublasLtMatrixLayoutAttribute_t as L;
                let stride = stride as i64;
                // SAFETY: a live layout; the attributes are an int32 and an int64.
                unsafe {
                    lt::set_matrix_layout_attribute(
                        l.0,
                        L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        (&batch as *const i32).cast(),
                        std::mem::size_of_val(&batch),
                    )
                    .and_then(|()| {
                        lt::set_matrix_layout_attribute(
                            l.0,
                            L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                            (&stride as *const i64).cast(),
                            std::mem::size_of_val(&stride),
                        )
                    })
                }
                .map_err(err("setting a cuBLASLt batch"))?;
            }
            Ok::<_, GpuError>(l)
        };
        let ((ar, ac), (br, bc)) = s.stored();
        let layouts = [
            layout(ar, ac, s.lda, s.stride_a)?,
            layout(br, bc, s.ldb, s.stride_b)?,
            layout(s.m, s.n, s.ldc, s.stride_c)?,
        ];
        // A and B may be strided views whose runs `s`'s leading dimensions already read
        // (`Gemm::prepare_cuda`); C is dense or written through its own strides.
        let (a, b, c) = (cx.first(s.a)?, cx.first(s.b)?, cx.ptr(s.c)?);
        let (z, beta) = match e.residual {
            Some(r) => (cx.ptr(r)?, 1.0),
            None => (c, 0.0),
        };
        let align = [
            operand_alignment(a, s.stride_a, s.batch),
            operand_alignment(b, s.stride_b, s.batch),
            operand_alignment(z, s.stride_c, s.batch),
            operand_alignment(c, s.stride_c, s.batch),
        ];
        let pref = LtPref(lt::create_matmul_pref().map_err(err("creating a cuBLASLt preference"))?);
        let ws = crate::cuda::CUBLAS_WORKSPACE;
        let set_pref = |attr: PrefAttr, value: *const std::ffi::c_void, size: usize| {
            // SAFETY: a live preference; `value` points to `size` bytes of the attribute's
            // type (a size_t for the workspace, a uint32 for an alignment).
            unsafe { lt::set_matmul_pref_attribute(pref.0, attr, value, size) }
                .map_err(err("setting a cuBLASLt preference"))
        };
        set_pref(
            PrefAttr::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            (&ws as *const usize).cast(),
            std::mem::size_of_val(&ws),
        )?;
        for (attr, bytes) in [
            PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
            PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            PrefAttr::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
        ]
        .into_iter()
        .zip(&align)
        {
            set_pref(
                attr,
                (bytes as *const u32).cast(),
                std::mem::size_of::<u32>(),
            )?;
        }
        Ok(CudaLtGemm {
            handle,
            desc,
            layouts,
            pref,
            align,
            // SAFETY: an all-zero algorithm is a valid value of this plain-data struct; it is
            // replaced by a configuration of the heuristic before anything runs it.
            algo: unsafe { std::mem::zeroed() },
            a,
            b,
            c,
            z,
            alpha: s.alpha,
            beta,
        })
    }

    /// The first `top` configurations of cuBLASLt's heuristic for this product, best first,
    /// within the stream's cuBLAS workspace.
    fn heuristic(&self, top: usize) -> Result<Vec<LtConfig>, GpuError> {
        use lt_sys::cublasLtMatmulAlgoConfigAttributes_t as Cfg;
        let err = |what: &'static str| move |e| GpuError::cublas(what, e);
        // SAFETY: the result struct is plain data; an all-zero one is valid and is overwritten.
        let mut results = vec![unsafe { std::mem::zeroed() }; top];
        let mut returned = 0;
        // SAFETY: live descriptors of this product; `results` holds `top` entries.
        unsafe {
            lt_sys::cublasLtMatmulAlgoGetHeuristic(
                self.handle.0,
                self.desc.0,
                self.layouts[0].0,
                self.layouts[1].0,
                self.layouts[2].0,
                self.layouts[2].0,
                self.pref.0,
                c_int(top, "configurations")?,
                results.as_mut_ptr(),
                &mut returned,
            )
        }
        .result()
        .map_err(err("asking cuBLASLt's heuristic"))?;
        results.truncate(usize::try_from(returned).unwrap_or(0));
        let attr = |algo: &lt_sys::cublasLtMatmulAlgo_t, which: Cfg| {
            let (mut value, mut written) = (0u32, 0usize);
            // SAFETY: a configuration the heuristic returned; the attribute is 4 bytes.
            unsafe {
                lt_sys::cublasLtMatmulAlgoConfigGetAttribute(
                    algo,
                    which,
                    (&mut value as *mut u32).cast(),
                    std::mem::size_of::<u32>(),
                    &mut written,
                )
            }
            .result()
            .map(|()| value)
            .map_err(err("reading a cuBLASLt configuration"))
        };
        results
            .iter()
            .filter(|r| {
                r.state == lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                    && r.workspaceSize <= crate::cuda::CUBLAS_WORKSPACE
            })
            .map(|r| {
                Ok(LtConfig {
                    algo: r.algo,
                    identity: crate::tuning::lt_identity(
                        attr(&r.algo, Cfg::CUBLASLT_ALGO_CONFIG_ID)?,
                        attr(&r.algo, Cfg::CUBLASLT_ALGO_CONFIG_TILE_ID)?,
                    ),
                })
            })
            .collect()
    }

    /// Enqueue the product with configuration `algo` on `sc`'s stream.
    fn run(&self, algo: &lt_sys::cublasLtMatmulAlgo_t, sc: &StreamCtx) -> Result<(), GpuError> {
        // SAFETY: descriptors and layouts describe the buffers (their reach was checked at
        // preparation, the bias pointer is set on the descriptor); `algo` came from the
        // heuristic for these descriptors with at most the stream's cuBLAS workspace, which
        // stream order keeps from overlapping cuBLAS's own use. Z is the residual (beta 1) or
        // aliases the output with beta 0, where it is not read.
        unsafe {
            lt::matmul(
                self.handle.0,
                self.desc.0,
                (&self.alpha as *const f32).cast(),
                (&self.beta as *const f32).cast(),
                self.a as *const std::ffi::c_void,
                self.layouts[0].0,
                self.b as *const std::ffi::c_void,
                self.layouts[1].0,
                self.z as *const std::ffi::c_void,
                self.layouts[2].0,
                self.c as *mut std::ffi::c_void,
                self.layouts[2].0,
                algo,
                sc.cublas_workspace() as *mut std::ffi::c_void,
                crate::cuda::CUBLAS_WORKSPACE,
                sc.cu_stream() as _,
            )
        }
        .map_err(|e| GpuError::cublas("running a cuBLASLt product", e))
    }
}

impl Enqueue for CudaLtGemm {
    fn enqueue(&self, _gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        self.run(&self.algo, sc)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn product() -> Gemm {
        Gemm::linear(0, 1, 2, [768, 2048, 768])
    }

    #[test]
    fn a_products_key_names_everything_the_heuristic_sees() {
        let g = product();
        let key = |g: &Gemm, tf32: bool, align: [u32; 4], version: usize| {
            g.tuning_key(tf32, align, version)
        };
        let base = key(&g, true, [256; 4], 130100);
        assert!(base.starts_with(crate::tuning::GEMM_KEY), "{base}");
        assert!(!base.contains(' '), "one cache field: {base}");
        let mut variants = vec![
            key(&g, false, [256; 4], 130100),
            key(&g, true, [256, 256, 256, 16], 130100),
            key(&g, true, [256; 4], 130200),
        ];
        let edits: [fn(&mut Gemm); 8] = [
            |g| g.trans_b = true,
            |g| g.k = 3072,
            |g| g.ldc = 2304,
            |g| g.batch = 12,
            |g| g.stride_b = 64,
            |g| {
                g.epilogue = Some(GemmEpilogue {
                    bias: Some(3),
                    residual: None,
                    act: Activation::None,
                })
            },
            |g| {
                g.epilogue = Some(GemmEpilogue {
                    bias: Some(3),
                    residual: Some(4),
                    act: Activation::None,
                })
            },
            |g| {
                g.epilogue = Some(GemmEpilogue {
                    bias: Some(3),
                    residual: None,
                    act: Activation::Relu,
                })
            },
        ];
        for edit in edits {
            let mut h = product();
            edit(&mut h);
            variants.push(key(&h, true, [256; 4], 130100));
        }
        variants.push(base.clone());
        let distinct: std::collections::BTreeSet<_> = variants.iter().collect();
        assert_eq!(distinct.len(), variants.len(), "{variants:#?}");
        // The same product gives the same key; the buffers it runs on do not count.
        let mut same = product();
        same.c = 9;
        assert_eq!(key(&same, true, [256; 4], 130100), base);
        // It goes through the cost cache whole.
        let dev = opsched_cost::cache::DeviceFingerprint {
            name: "NVIDIA H100 80GB HBM3".into(),
            sms: 132,
            driver: "13.0".into(),
            cudnn: "91400".into(),
        };
        let c = crate::tuning::Candidate {
            algo: crate::tuning::GEMM_LT + 3,
            math: crate::tuning::lt_identity(21, 18),
            ms: 0.01,
            workspace: 0,
        };
        let (k, m) = crate::tuning::to_cache(&dev, &base, &c);
        assert_eq!(crate::tuning::from_cache(&k, &m), Some((base, c)));
    }

    #[test]
    fn an_operands_alignment_holds_for_every_member_of_its_batch() {
        assert_eq!(operand_alignment(0x7f00_0000_0000, 0, 1), 256);
        assert_eq!(operand_alignment(0x7f00_0000_0010, 0, 1), 16);
        assert_eq!(operand_alignment(0x7f00_0000_0004, 0, 1), 4);
        // Batch members 64 floats (256 bytes) apart keep the base's; 3 floats apart, 4 bytes.
        assert_eq!(operand_alignment(0x7f00_0000_0000, 64, 12), 256);
        assert_eq!(operand_alignment(0x7f00_0000_0000, 8, 12), 32);
        assert_eq!(operand_alignment(0x7f00_0000_0000, 3, 12), 4);
        // A single product's stride is never used.
        assert_eq!(operand_alignment(0x7f00_0000_0000, 3, 1), 256);
    }
}

#[cfg(test)]
mod over_runs_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::program::Runs;

    /// The scores of attention (`q k^T` per sequence and head) read through head transposes
    /// from query and key projections that are runs of a merged `[rows, 3 * h * d]` output:
    /// the product over the merged buffer with [`Gemm::over_runs`]'s strides equals the one
    /// over dense gathered copies, element for element; runs shorter than a row do not map.
    #[test]
    fn a_product_reads_a_merged_member_through_its_row_runs() {
        let (n, s, h, d) = (2usize, 5usize, 3usize, 4usize);
        let hd = h * d;
        let row = 3 * hd;
        let merged = crate::program::uniform(7, n * s * row, 0.0, 1.0);
        let gather = |at: usize| -> Vec<f32> {
            merged
                .chunks(row)
                .flat_map(|r| r[at..at + hd].iter().copied())
                .collect()
        };
        let (q, k) = (gather(0), gather(hd));
        // As `lower_batch_matmul` has it: column-major C^T = K Q^T per (sequence, head).
        let scores = Gemm {
            a: 1,
            b: 0,
            c: 2,
            trans_a: true,
            trans_b: false,
            m: s,
            n: s,
            k: d,
            lda: hd,
            ldb: hd,
            ldc: s,
            stride_a: d,
            stride_b: d,
            stride_c: s * s,
            batch: h,
            outer: n,
            outer_stride: [s * hd, s * hd, h * s * s],
            alpha: 1.0,
            epilogue: None,
            packed_a: PackedA::No,
        };
        let run = |g: &Gemm, q: &[f32], k: &[f32]| {
            let mut c = vec![f32::NAN; n * h * s * s];
            let reads = vec![(0, q), (1, k)];
            g.product_cpu(&mut CpuIo::of(reads, vec![(2, &mut c[..])]), None)
                .unwrap();
            c
        };
        let want = run(&scores, &q, &k);
        let runs = Runs {
            run: hd,
            stride: row,
        };
        let through = scores.over_runs(Some(runs), Some(runs)).unwrap();
        assert_eq!((through.lda, through.ldb), (row, row));
        assert_eq!(run(&through, &merged, &merged[hd..]), want);
        let short = Runs {
            run: d,
            stride: row,
        };
        assert!(scores.over_runs(None, Some(short)).is_none());
        assert_eq!(scores.over_runs(None, None), Some(scores.clone()));
    }

    /// A linear layer's product as the CPU device runs it, its `[out, in]` weights repacked
    /// once ([`Gemm::packed_cpu`]), over a few tokens (panels), many (column-major, column
    /// blocks) and two: within rounding of the product in `f64` (as the weights read where
    /// they lie), the same bits on one thread as on three; small weights or batched products
    /// are not repacked.
    #[test]
    fn repacked_weights_give_the_same_products() {
        for (tokens, inp, out) in [(16usize, 192usize, 576usize), (300, 64, 96), (2, 64, 64)] {
            let w = crate::program::uniform(3, out * inp, 0.0, 1.0);
            let x = crate::program::uniform(4, tokens * inp, 0.0, 1.0);
            let g = Gemm {
                alpha: 0.5,
                ..Gemm::linear(1, 0, 2, [out, tokens, inp])
            };
            let run = |g: &Gemm, packed: Option<&[f32]>| {
                let mut c = vec![f32::NAN; out * tokens];
                let reads = vec![(0, &x[..]), (1, &w[..])];
                g.product_cpu(&mut CpuIo::of(reads, vec![(2, &mut c[..])]), packed)
                    .unwrap();
                c
            };
            let (packed, t) = g.packed_cpu(&w).unwrap();
            let how = match tokens <= PANEL_COLUMNS {
                true => PackedA::Panels,
                false => PackedA::ColumnMajor,
            };
            assert_eq!(packed.packed_a, how);
            let want: Vec<f32> = (0..tokens * out)
                .map(|e| {
                    let (j, i) = (e / out, e % out);
                    let dot: f64 = (0..inp)
                        .map(|q| f64::from(w[i * inp + q]) * f64::from(x[j * inp + q]))
                        .sum();
                    0.5 * dot as f32
                })
                .collect();
            let on = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
                pool.unwrap().install(|| run(&packed, Some(&t)))
            };
            let repacked = on(3);
            assert_eq!(repacked, on(1), "{tokens}x{inp}x{out}");
            for (c, r) in [(run(&g, None), "unpacked"), (repacked, "repacked")] {
                for (got, want) in c.iter().zip(&want) {
                    assert!((got - want).abs() <= 1e-5 * inp as f32, "{r}: {got} {want}");
                }
            }
            let batched = Gemm {
                batch: 2,
                ..g.clone()
            };
            assert!(batched.packed_cpu(&w).is_none());
            let small = Gemm { m: 7, k: 5, ..g };
            assert!(small.packed_cpu(&w).is_none());
        }
    }

    /// One token through linear layers large enough to be split into blocks of rows on more
    /// than one thread and one not, rows longer and shorter than `math::matrix_vector` takes
    /// eight at a time, of whole vectors and not: each output a dot product within rounding
    /// of the one in `f64`, the same bits with the weights where they lie as interleaved
    /// ([`PackedA::RowBlocks`]), on one thread (unsplit) as on three.
    #[test]
    fn one_token_gives_the_same_bits_with_its_rows_interleaved() {
        for (inp, out) in [(2051usize, 517usize), (1283, 261), (1280, 203), (250, 200)] {
            let w = crate::program::uniform(5, out * inp, -1.0, 1.0);
            let x = crate::program::uniform(6, inp, -1.0, 1.0);
            let g = Gemm::linear(1, 0, 2, [out, 1, inp]);
            let (packed, t) = g.packed_cpu(&w).unwrap();
            assert_eq!(packed.packed_a, PackedA::RowBlocks);
            let on = |g: &Gemm, a: Option<&[f32]>, threads: usize| {
                let mut c = vec![f32::NAN; out];
                let reads = vec![(0, &x[..]), (1, &w[..])];
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
                pool.unwrap()
                    .install(|| g.product_cpu(&mut CpuIo::of(reads, vec![(2, &mut c[..])]), a))
                    .unwrap();
                c.into_iter().map(f32::to_bits).collect::<Vec<_>>()
            };
            let c = on(&g, None, 3);
            assert_eq!(c, on(&g, None, 1), "{inp} -> {out}");
            assert_eq!(c, on(&packed, Some(&t), 1), "{inp} -> {out}");
            assert_eq!(c, on(&packed, Some(&t), 3), "{inp} -> {out}");
            for (i, &got) in c.iter().enumerate() {
                let dot: f64 = (0..inp)
                    .map(|q| f64::from(w[i * inp + q]) * f64::from(x[q]))
                    .sum();
                assert!(
                    (f64::from(f32::from_bits(got)) - dot).abs() <= 1e-5 * inp as f64,
                    "{inp} -> {out}: row {i}"
                );
            }
        }
    }
}
