//! Table lookup (`embedding`: token ids to their vectors); on CUDA the `embedding` NVRTC
//! kernel. An index is a row by [`opsched_graph::op::table_row`]: the CPU refuses any other
//! value with an error, the CUDA kernel (which cannot report one) writes zeros for it.
#![allow(unsafe_code)]

use cudarc::driver::PushKernelArg;
use opsched_graph::op::table_row;
use rayon::prelude::*;
use serde::Serialize;

use super::{product, Access, Step, StepKernel};
use crate::cpu::CpuIo;
use crate::cuda::cudnn::{as_i64, c_int};
use crate::cuda::{grid, launched, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{At, BufId, Builder, Src};
use crate::GpuError;

/// `y[i, :] = table[row(idx[i]), :]` for each of the `n` indices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Embedding {
    pub idx: BufId,
    pub table: BufId,
    pub y: BufId,
    pub n: usize,
    pub rows: usize,
    pub dim: usize,
}

/// Lower an `embedding` operator (its table: the `weight` parameter, uniform in [-1, 1] where
/// the graph has none, as the reference's).
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    rows: usize,
    dim: usize,
    src: Src<'_>,
    out: BufId,
) -> Result<(), GpuError> {
    let (idx, shape) = b.single(steps, at, src)?;
    let len = product(&[rows, dim], "an embedding table")?;
    let table = b.param(at, "weight", len, 0.0, 1.0)?;
    steps.push(
        Embedding {
            idx,
            table,
            y: out,
            n: product(&shape, "indices")?,
            rows,
            dim,
        }
        .into(),
    );
    Ok(())
}

impl StepKernel for Embedding {
    fn kind(&self) -> &'static str {
        "embedding"
    }

    fn access(&self) -> Access {
        Access {
            reads: vec![(self.idx, self.n), (self.table, self.rows * self.dim)],
            writes: vec![(self.y, self.n * self.dim)],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let (n, rows, dim) = (self.n, self.rows, self.dim);
        let idx = &io.read(self.idx)?[..n];
        let table = &io.read(self.table)?[..rows * dim];
        let y = &mut io.write(self.y)?[..n * dim];
        y.par_chunks_mut(dim)
            .zip(idx)
            .try_for_each(|(yr, &v)| match table_row(v, rows) {
                Some(r) => {
                    yr.copy_from_slice(&table[r * dim..][..dim]);
                    Ok(())
                }
                None => Err(GpuError::Plan(format!(
                    "embedding: index {v} is no row of its {rows}-row table"
                ))),
            })
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        Ok(Box::new(CudaEmbedding {
            y: cx.ptr(self.y)?,
            idx: cx.ptr(self.idx)?,
            table: cx.ptr(self.table)?,
            total: as_i64(self.n * self.dim, "elements of an embedding")?,
            rows: as_i64(self.rows, "rows of an embedding table")?,
            dim: c_int(self.dim, "the width of an embedding table")?,
        }))
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some("embedding")
    }
}

struct CudaEmbedding {
    y: u64,
    idx: u64,
    table: u64,
    total: i64,
    rows: i64,
    dim: i32,
}

impl Enqueue for CudaEmbedding {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let mut b = sc.launch_builder(gpu.function("embedding")?);
        b.arg(&self.y)
            .arg(&self.idx)
            .arg(&self.table)
            .arg(&self.total)
            .arg(&self.rows)
            .arg(&self.dim);
        // SAFETY: matches `embedding`; y holds total = n * dim elements, idx n, the table
        // rows * dim (the buffers' sizes, checked at preparation); the kernel reads a row only
        // for an index inside the table.
        launched(unsafe { b.launch(grid(self.total as usize)) }, "embedding")
    }
}
