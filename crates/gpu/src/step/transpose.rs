//! `y = permute(x)`: `y` has shape `perm.map(|p| in_shape[p])`.
#![allow(unsafe_code)]

use cudarc::driver::PushKernelArg;
use serde::Serialize;

use super::broadcast::strides;
use super::{merged_axes, row_offset, Access, Step, StepKernel};
use crate::cpu::math::{for_planes, transpose8};
use crate::cpu::CpuIo;
use crate::cuda::nvrtc::{permute_params, MAX_RANK};
use crate::cuda::{grid, launched, Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{At, BufId, Builder, Src};
use crate::GpuError;

/// A transpose step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Transpose {
    pub x: BufId,
    pub y: BufId,
    pub in_shape: Vec<usize>,
    pub perm: Vec<usize>,
}

/// Lower a `transpose` operator.
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    perm: &[usize],
    src: Src<'_>,
    out: BufId,
) -> Result<(), GpuError> {
    let (x, xs) = b.single(steps, at, src)?;
    let mut sorted = perm.to_vec();
    sorted.sort_unstable();
    if sorted.iter().copied().ne(0..xs.len()) {
        return Err(b.unsupported(
            at,
            format!("{perm:?} is not a permutation of {xs:?}'s axes"),
        ));
    }
    steps.push(
        Transpose {
            x,
            y: out,
            in_shape: xs,
            perm: perm.to_vec(),
        }
        .into(),
    );
    Ok(())
}

/// `y = permute(x)` on the host, `x` dense in `shape`: the CPU kernel of [`Transpose`] (and of
/// the channels-last conversions, `crate::program::nchw_to_nhwc`). The axes are first merged
/// where neighbours stay neighbours ([`permuted_axes`]); then whole runs are copied where the
/// last axis stays last (Swin's windows), bands of [`TILE`] rows are transposed where the last
/// input axis comes second to last (NCHW to NHWC and back, a matrix's transpose: 8 x 8 blocks
/// in AVX registers, [`transpose_block`]; ConvNeXt-T's 46, one thread, 2.9 -> 1.1 ms against
/// the walk), and anything else is walked element by element; the output's rows grouped into
/// tasks ([`for_planes`]).
pub(crate) fn permute_into(x: &[f32], shape: &[usize], perm: &[usize], y: &mut [f32]) {
    let total: usize = shape.iter().product();
    if total == 0 {
        return;
    }
    let (dims, strides) = permuted_axes(shape, perm);
    let (x, y) = (&x[..total], &mut y[..total]);
    let r = dims.len();
    let cols = dims[r - 1];
    // The input offset of output row `row` (every output axis but the last).
    let row_start = |row: usize| row_offset(row, &dims, &strides);
    let s = strides[r - 1];
    if s == 1 {
        for_planes(y, cols, cols, |row, yr| {
            let src = row_start(row);
            yr.copy_from_slice(&x[src..src + cols]);
        });
        return;
    }
    if r >= 2 && strides[r - 2] == 1 {
        // Output rows are input columns: bands of TILE rows, TILE columns of them at a time,
        // so that both the rows written and the input rows read stay in cache.
        for_planes(y, TILE * cols, TILE * cols, |k, band| {
            let rows = band.len() / cols;
            let mut starts = [0; TILE];
            for (i, start) in starts.iter_mut().enumerate().take(rows) {
                *start = row_start(k * TILE + i);
            }
            // Groups of eight output rows that read eight neighbours of each input row (all
            // but where a band crosses an image): 8 x 8 blocks transposed in registers
            // ([`transpose_block`]), their columns past the last whole block one by one; other
            // rows element by element, TILE columns at a time.
            let whole = |i0: usize| i0 + 8 <= rows && starts[i0 + 7] == starts[i0] + 7;
            let blocks = if avx_available() { cols / 8 * 8 } else { 0 };
            for c0 in (0..blocks).step_by(8) {
                for i0 in (0..rows).step_by(8).filter(|&i0| whole(i0)) {
                    let (src, at) = (starts[i0] + c0 * s, i0 * cols + c0);
                    // Every read and write inside its slice: the block's last input row
                    // ends at src + 7 * s + 8, its last output row at at + 7 * cols + 8.
                    assert!(src + 7 * s + 8 <= x.len() && at + 7 * cols + 8 <= band.len());
                    // SAFETY: the CPU has AVX (checked); the reads and writes lie inside `x`
                    // and `band` (asserted).
                    unsafe {
                        transpose_block(x.as_ptr().add(src), s, band.as_mut_ptr().add(at), cols)
                    };
                }
            }
            for i0 in (0..rows).step_by(8) {
                let (first, end) = if whole(i0) {
                    (blocks, i0 + 8)
                } else {
                    (0, (i0 + 8).min(rows))
                };
                for c0 in (first..cols).step_by(TILE) {
                    let c1 = (c0 + TILE).min(cols);
                    for i in i0..end {
                        let (yr, src) = (&mut band[i * cols..(i + 1) * cols], starts[i]);
                        for (c, v) in yr[c0..c1].iter_mut().enumerate() {
                            *v = x[src + (c0 + c) * s];
                        }
                    }
                }
            }
        });
        return;
    }
    for_planes(y, cols, cols, |row, yr| {
        let src = row_start(row);
        for (c, v) in yr.iter_mut().enumerate() {
            *v = x[src + c * s];
        }
    });
}

/// Whether this CPU has AVX ([`transpose_block`]'s instructions).
fn avx_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx");
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// An 8 x 8 block transposed: `y[j * ys + i] = x[i * xs + j]` for `i, j < 8`, by AVX's unpacks
/// and shuffles ([`transpose8`] compiled for AVX: 8 loads and 8 stores where the walk took 64
/// of each).
///
/// # Safety
/// The CPU has AVX; eight elements from `x + i * xs` and from `y + j * ys` (each `i, j < 8`)
/// lie inside their allocations.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose_block(x: *const f32, xs: usize, y: *mut f32, ys: usize) {
    // SAFETY: the caller's promise.
    let rows: [[f32; 8]; 8] = std::array::from_fn(|i| unsafe { *x.add(i * xs).cast() });
    for (j, row) in transpose8(rows).into_iter().enumerate() {
        // SAFETY: the caller's promise.
        unsafe { *y.add(j * ys).cast() = row };
    }
}

/// (Not reached off x86-64: [`avx_available`] is false there.)
#[cfg(not(target_arch = "x86_64"))]
unsafe fn transpose_block(_: *const f32, _: usize, _: *mut f32, _: usize) {}

/// The output's axes of `permute(x)` (`x` dense in `shape`), each with its stride in `x`,
/// merged where neighbours stay neighbours in `x` too ([`merged_axes`]: a `[n, c, h, w]` to
/// `[n, h, w, c]` permutation is a transpose of `[c, h * w]` per image); at least one axis.
fn permuted_axes(shape: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let in_strides = strides(shape, shape);
    let dims: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let (dims, [strides]) = merged_axes(&dims, [perm.iter().map(|&p| in_strides[p]).collect()]);
    (dims, strides)
}

/// The side of [`permute_into`]'s blocks.
const TILE: usize = 16;

impl Transpose {
    /// `y = permute(x)` of `x` in `in_shape`.
    pub fn of(x: BufId, y: BufId, in_shape: Vec<usize>, perm: &[usize]) -> Transpose {
        Transpose {
            x,
            y,
            in_shape,
            perm: perm.to_vec(),
        }
    }
}

impl StepKernel for Transpose {
    fn kind(&self) -> &'static str {
        "transpose"
    }

    fn access(&self) -> Access {
        let n = self.in_shape.iter().product();
        Access {
            reads: vec![(self.x, n)],
            writes: vec![(self.y, n)],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let x = io.read(self.x)?;
        let y = io.write(self.y)?;
        permute_into(x, &self.in_shape, &self.perm, y);
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        permute(cx.ptr(self.x)?, cx.ptr(self.y)?, &self.in_shape, &self.perm)
    }

    fn nvrtc_kernel(&self) -> Option<&'static str> {
        Some("permute")
    }
}

/// `y = permute(x)` of device buffers (`x` in `in_shape`), as one launch.
pub(crate) fn permute(
    x: u64,
    y: u64,
    in_shape: &[usize],
    perm: &[usize],
) -> Result<Box<dyn Enqueue>, GpuError> {
    let (dims, strides) = permute_params(in_shape, perm).ok_or_else(|| {
        GpuError::Plan(format!(
            "transpose of rank {} (the GPU kernel handles at most {MAX_RANK})",
            in_shape.len()
        ))
    })?;
    Ok(Box::new(CudaPermute {
        y,
        x,
        total: in_shape.iter().product::<usize>() as i64,
        rank: in_shape.len() as i32,
        dims,
        strides,
    }))
}

struct CudaPermute {
    y: u64,
    x: u64,
    total: i64,
    rank: i32,
    dims: [i64; 6],
    strides: [i64; 6],
}

impl Enqueue for CudaPermute {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        let mut b = sc.launch_builder(gpu.function("permute")?);
        b.arg(&self.y)
            .arg(&self.x)
            .arg(&self.total)
            .arg(&self.rank)
            .arg(&self.dims)
            .arg(&self.strides);
        // SAFETY: matches `permute` (two 48-byte Dims6 structs by value); both buffers hold
        // `total` elements (checked at preparation).
        launched(unsafe { b.launch(grid(self.total as usize)) }, "permute")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn check(shape: &[usize], perm: &[usize]) {
        let len = shape.iter().product();
        let x: Vec<f32> = (0..len).map(|i| i as f32).collect();
        let mut y = vec![f32::NAN; len];
        permute_into(&x, shape, perm, &mut y);
        assert_eq!(
            y,
            crate::reference::transpose(&x, shape, perm),
            "{shape:?} {perm:?}"
        );
    }

    proptest! {
        /// Any permutation of any small shape (ones included, so that axes drop and merge) is
        /// the reference's, element for element.
        #[test]
        fn permutations_match_the_reference(
            shape in prop::collection::vec(1usize..5, 1..6), keys in prop::collection::vec(any::<u32>(), 6),
        ) {
            let mut perm: Vec<usize> = (0..shape.len()).collect();
            perm.sort_by_key(|&a| keys[a]);
            check(&shape, &perm);
        }
    }

    /// Large enough for several tasks and partial blocks: channels last and back, a batched
    /// matrix transpose, Swin's window partition (runs) and a reversal (element by element).
    #[test]
    fn large_permutations_match_the_reference() {
        check(&[2, 37, 19, 23], &[0, 2, 3, 1]);
        check(&[2, 19, 23, 37], &[0, 3, 1, 2]);
        check(&[3, 130, 70], &[0, 2, 1]);
        check(&[1, 4, 7, 4, 7, 24], &[0, 1, 3, 2, 4, 5]);
        check(&[9, 10, 11, 12], &[3, 2, 1, 0]);
        assert_eq!(
            permuted_axes(&[1, 96, 56, 56], &[0, 2, 3, 1]),
            (vec![3136, 96], vec![1, 3136])
        );
    }
}
