//! Elements picked along one axis by an index tensor (`gather_elements`, ONNX's
//! `GatherElements`: RoBERTa's token types, looked up at its position ids); on CUDA the
//! `gather_elements` NVRTC kernel. An index names an element by
//! [`opsched_graph::op::table_row`] (an integer in `[-n, n)`, a negative one from the end): the
//! CPU refuses any other value with an error, the CUDA kernel (which cannot report one) writes
//! zero for it, as the embedding's do.
#![allow(unsafe_code)]

use cudarc::driver::PushKernelArg;
use opsched_graph::op::table_row;
use rayon::prelude::*;
use serde::Serialize;

use super::broadcast::strides;
use super::{product, Access, Step, StepKernel};
use crate::cpu::CpuIo;
use crate::cuda::cudnn::as_i64;
use crate::cuda::nvrtc::{dims6, MAX_RANK};
use crate::cuda::{grid, launched, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{At, BufId, Builder, Src};
use crate::GpuError;

/// `y[c] = x[c with idx[c] along axis]` for every coordinate `c` of the indices' shape `out`
/// (the data's shape `data`: as many axes, none shorter but along `axis`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GatherElements {
    pub x: BufId,
    pub idx: BufId,
    pub y: BufId,
    pub data: Vec<usize>,
    pub out: Vec<usize>,
    pub axis: usize,
}

/// Lower a `gather_elements` along `axis`: its terms are the data and the indices.
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    axis: usize,
    src: Src<'_>,
    out: BufId,
) -> Result<(), GpuError> {
    let ts = b.terms(steps, at, src)?;
    let [(x, data), (idx, shape)] = ts.as_slice() else {
        return Err(b.unsupported(at, "gather_elements needs two inputs (data, indices)"));
    };
    let fits = axis < data.len()
        && shape.len() == data.len()
        && (0..data.len()).all(|a| a == axis || shape[a] <= data[a]);
    if !fits {
        return Err(b.unsupported(
            at,
            format!("gather_elements along axis {axis} of {data:?} by indices {shape:?}"),
        ));
    }
    steps.push(
        GatherElements {
            x: *x,
            idx: *idx,
            y: out,
            data: data.clone(),
            out: shape.clone(),
            axis,
        }
        .into(),
    );
    Ok(())
}

/// Output elements a CPU task takes.
const CHUNK: usize = 1 << 14;

impl StepKernel for GatherElements {
    fn kind(&self) -> &'static str {
        "gather_elements"
    }

    fn access(&self) -> Access {
        let (data, out) = (self.data.iter().product(), self.out.iter().product());
        Access {
            reads: vec![(self.x, data), (self.idx, out)],
            writes: vec![(self.y, out)],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let total: usize = self.out.iter().product();
        let x = &io.read(self.x)?[..self.data.iter().product()];
        let idx = &io.read(self.idx)?[..total];
        let y = &mut io.write(self.y)?[..total];
        let (strides, n, axis) = (
            strides(&self.data, &self.data),
            self.data[self.axis],
            self.axis,
        );
        y.par_chunks_mut(CHUNK).enumerate().try_for_each(|(c, ys)| {
            for (k, v) in ys.iter_mut().enumerate() {
                let t = c * CHUNK + k;
                let i = idx[t];
                let r = table_row(i, n).ok_or_else(|| {
                    GpuError::Plan(format!(
                        "gather_elements: index {i} is outside an axis of {n}"
                    ))
                })?;
                // The output's coordinates, but `r` along the axis, in the data.
                let (mut rem, mut src) = (t, 0);
                for a in (0..self.out.len()).rev() {
                    let coord = rem % self.out[a];
                    rem /= self.out[a];
                    src += if a == axis { r } else { coord } * strides[a];
                }
                *v = x[src];
            }
            Ok(())
        })
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        let too_many = || {
            cx.no_kernel(format!(
                "gather_elements of {} axes (at most {MAX_RANK})",
                self.out.len()
            ))
        };
        Ok(Box::new(CudaGather {
            y: cx.ptr(self.y)?,
            x: cx.ptr(self.x)?,
            idx: cx.ptr(self.idx)?,
            total: product(&self.out, "gathered elements")?,
            rank: self.out.len() as i32,
            axis: self.axis as i32,
            n: as_i64(self.data[self.axis], "a gathered axis")?,
            dims: dims6(&self.out, 1).ok_or_else(too_many)?,
            strides: dims6(&strides(&self.data, &self.data), 0).ok_or_else(too_many)?,
        }))
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some("gather_elements")
    }
}

struct CudaGather {
    y: u64,
    x: u64,
    idx: u64,
    total: usize,
    rank: i32,
    axis: i32,
    /// The data's length along the axis.
    n: i64,
    dims: [i64; 6],
    strides: [i64; 6],
}

impl Enqueue for CudaGather {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let total = self.total as i64;
        let mut b = sc.launch_builder(gpu.function("gather_elements")?);
        b.arg(&self.y)
            .arg(&self.x)
            .arg(&self.idx)
            .arg(&total)
            .arg(&self.rank)
            .arg(&self.axis)
            .arg(&self.n)
            .arg(&self.dims)
            .arg(&self.strides);
        // SAFETY: matches `gather_elements` (two 48-byte Dims6 structs by value); y and idx
        // hold `total` elements, x the data's (the buffers' sizes, checked at preparation);
        // the kernel reads x only at an index inside the axis, the other coordinates inside
        // the indices' shape, which is no longer than the data's.
        launched(unsafe { b.launch(grid(self.total)) }, "gather_elements")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The CPU kernel against the definition: for indices of any shape inside the data's
        /// (negative ones counting from the end), each element is the data's at the same
        /// coordinates but the index along the axis.
        #[test]
        fn gathered_elements_match_their_definition(
            data in prop::collection::vec(1usize..5, 1..4),
            cut in prop::collection::vec(0usize..3, 3),
            axis in 0usize..3, longer in 1usize..4, seed in 0usize..100,
        ) {
            let axis = axis % data.len();
            let out: Vec<usize> = (0..data.len())
                .map(|a| if a == axis { longer } else { data[a].saturating_sub(cut[a]).max(1) })
                .collect();
            let (dlen, olen) = (data.iter().product::<usize>(), out.iter().product::<usize>());
            let x: Vec<f32> = (0..dlen).map(|i| i as f32 + 0.5).collect();
            let n = data[axis] as i64;
            let idx: Vec<f32> = (0..olen)
                .map(|t| (((t * 7 + seed) as i64 % (2 * n)) - n) as f32)
                .collect();
            let s = GatherElements { x: 0, idx: 1, y: 2, data: data.clone(), out: out.clone(), axis };
            let mut y = vec![f32::NAN; olen];
            s.run_cpu(&mut CpuIo::of(vec![(0, &x[..]), (1, &idx[..])], vec![(2, &mut y[..])]))
                .unwrap();
            for (t, &got) in y.iter().enumerate() {
                let mut coords = vec![0; out.len()];
                let mut rem = t;
                for a in (0..out.len()).rev() {
                    coords[a] = rem % out[a];
                    rem /= out[a];
                }
                let i = idx[t] as i64;
                coords[axis] = if i < 0 { i + n } else { i } as usize;
                let at = coords.iter().zip(&data).fold(0, |off, (&c, &d)| off * d + c);
                prop_assert_eq!(got, x[at]);
            }
        }
    }

    /// An index outside the axis, or not an integer, is an error naming it.
    #[test]
    fn an_index_outside_the_axis_is_an_error() {
        let x = [1.0, 2.0, 3.0];
        for bad in [3.0, -4.0, 0.5] {
            let s = GatherElements {
                x: 0,
                idx: 1,
                y: 2,
                data: vec![3],
                out: vec![1],
                axis: 0,
            };
            let mut y = [0.0];
            let e = s
                .run_cpu(&mut CpuIo::of(
                    vec![(0, &x[..]), (1, &[bad][..])],
                    vec![(2, &mut y[..])],
                ))
                .unwrap_err();
            assert!(e.to_string().contains(&format!("index {bad}")), "{e}");
        }
    }
}
