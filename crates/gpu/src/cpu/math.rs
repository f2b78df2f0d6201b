//! Numerical building blocks of the CPU kernels: a bounds-checked matrix product over
//! `gemm` (faer's: packed, AVX-512, AVX2 or NEON chosen at run time, any strides), the same
//! split into column tiles run in parallel, reusable per-thread scratch, and the bias + activation epilogue.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ops::Range;

use opsched_graph::Activation;
use rayon::prelude::*;

use super::short_k;
use crate::GpuError;

/// A read-only matrix view: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct Mat<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> Mat<'a> {
    /// A dense row-major `rows x cols` matrix at the start of `data`.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self::strided(data, rows, cols, cols, 1)
    }

    /// Any strides (a transpose swaps them).
    pub fn strided(data: &'a [f32], rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        Mat {
            data,
            rows,
            cols,
            rs,
            cs,
        }
    }

    /// Rows `rows` of this view (a block of them, read where they lie).
    pub fn row_block(&self, rows: Range<usize>) -> Mat<'a> {
        let start = (rows.start * self.rs).min(self.data.len());
        Mat::strided(&self.data[start..], rows.len(), self.cols, self.rs, self.cs)
    }

    /// Write this view's transpose into `dst`, row-major (`cols x rows`, its rows `ld >= rows`
    /// apart; the elements between them untouched). Where the view's rows are contiguous
    /// (`cs == 1`), eight elements of eight rows at a time through `transpose8` (element by
    /// element, each a load and a store of its own, the panel product's gather of a few
    /// tokens took 6% of LLaMA's time); the rest element by element, in tiles that keep both
    /// sides in cache.
    pub fn transpose_into(&self, dst: &mut [f32], ld: usize) {
        let (rows, cols) = (self.rows, self.cols);
        let (whole_rows, whole_cols) = match self.cs == 1 {
            true => (rows - rows % 8, cols - cols % 8),
            false => (0, 0),
        };
        let one_by_one = |dst: &mut [f32], rows: Range<usize>, cols: Range<usize>| {
            const TILE: usize = 16;
            for i0 in rows.clone().step_by(TILE) {
                for j0 in cols.clone().step_by(4 * TILE) {
                    for i in i0..(i0 + TILE).min(rows.end) {
                        for j in j0..(j0 + 4 * TILE).min(cols.end) {
                            dst[j * ld + i] = self.data[i * self.rs + j * self.cs];
                        }
                    }
                }
            }
        };
        // (In AVX2 code, so that the transpose's intrinsics inline.)
        with_avx2(
            #[inline(always)]
            || {
                for i0 in (0..whole_rows).step_by(8) {
                    for j0 in (0..whole_cols).step_by(8) {
                        let block: [[f32; 8]; 8] = std::array::from_fn(|i| {
                            let at = (i0 + i) * self.rs + j0;
                            self.data[at..at + 8].try_into().expect("eight elements")
                        });
                        for (j, row) in transpose8(block).iter().enumerate() {
                            dst[(j0 + j) * ld + i0..][..8].copy_from_slice(row);
                        }
                    }
                }
            },
        );
        one_by_one(dst, 0..whole_rows, whole_cols..cols);
        one_by_one(dst, whole_rows..rows, 0..cols);
    }

    /// Index one past the last element the view reaches (0 for an empty view).
    fn reach(&self) -> usize {
        reach(self.rows, self.cols, self.rs, self.cs)
    }
}

fn reach(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs + (cols - 1) * cs + 1
    }
}

/// `c = a * b` with `c` dense row-major (`a.rows x b.cols`, at the start of `c`).
///
/// Errors when the shapes disagree or a view reaches past its slice (the callers size every
/// buffer from the same program, so that is a bug of ours, never of the input).
pub fn sgemm(a: Mat<'_>, b: Mat<'_>, c: &mut [f32]) -> Result<(), GpuError> {
    sgemm_strided(a, b, c, b.cols, 1)
}

/// [`sgemm`], by `short_k`'s blocks where they take the shape (a short inner dimension, rows
/// of A and B dense, a vector of columns or more): for convolutions' products, where they
/// were measured (EfficientNet-B0's 112 -> 672 on 14x14 7% faster, MNASNet's alike).
pub fn sgemm_short(a: Mat<'_>, b: Mat<'_>, c: &mut [f32]) -> Result<(), GpuError> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let inside = k == b.rows
        && a.reach() <= a.data.len()
        && b.reach() <= b.data.len()
        && m.checked_mul(n).is_some_and(|len| len <= c.len());
    // SAFETY: A's m rows of k and B's k rows of n lie inside their slices (their reach
    // checked), C's m rows of n inside `c`, borrowed mutably.
    if inside && m > 0 && n >= 16 && unsafe { short_product(a, b, c.as_mut_ptr(), n) } {
        return Ok(());
    }
    sgemm(a, b, c)
}

/// `c = a * b` by `short_k`'s blocks, C's rows `ldc` apart, where they take the shape (a
/// short inner dimension, rows of A and B dense); `false`, touching nothing, elsewhere.
///
/// # Safety
/// A's and B's rows lie inside their slices; C is valid for writes at `a.rows` rows of
/// `b.cols`, `ldc` apart, and nothing else reads or writes them during the call.
unsafe fn short_product(a: Mat<'_>, b: Mat<'_>, c: *mut f32, ldc: usize) -> bool {
    let dense = a.cs == 1 && b.cs == 1;
    let ops = short_k::Operands {
        a: a.data.as_ptr(),
        lda: a.rs,
        b: b.data.as_ptr(),
        ldb: b.rs,
        c,
        ldc,
    };
    // SAFETY: the caller's promise.
    dense && unsafe { short_k::product(ops, [a.rows, a.cols, b.cols]) }
}

/// `c = a * b` with `c`'s element `(i, j)` at `c[i * rsc + j * csc]`; errors as [`sgemm`],
/// and when `c`'s strides make two elements alias.
pub fn sgemm_strided(
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    rsc: usize,
    csc: usize,
) -> Result<(), GpuError> {
    sgemm_scaled(a, b, c, [rsc, csc], 1.0)
}

/// `c = alpha * a * b`, `c` as in [`sgemm_strided`] (strides `[rsc, csc]`).
pub fn sgemm_scaled(
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    [rsc, csc]: [usize; 2],
    alpha: f32,
) -> Result<(), GpuError> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let fail = |what: &str| Err(GpuError::Plan(format!("sgemm {m}x{k}x{n}: {what}")));
    if k != b.rows {
        return fail("inner dimensions disagree");
    }
    if a.reach() > a.data.len() || b.reach() > b.data.len() || reach(m, n, rsc, csc) > c.len() {
        return fail("a matrix reaches past its buffer");
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        for i in 0..m {
            for j in 0..n {
                c[i * rsc + j * csc] = 0.0;
            }
        }
        return Ok(());
    }
    // Distinct elements of C at distinct places: one stride steps over a whole run of the
    // other (row- or column-major with any padding); anything else is refused.
    let rows_apart = m == 1 || (n - 1).checked_mul(csc).is_some_and(|w| w < rsc);
    let cols_apart = n == 1 || (m - 1).checked_mul(rsc).is_some_and(|h| h < csc);
    if !(rows_apart && (n == 1 || csc > 0) || cols_apart && (m == 1 || rsc > 0)) {
        return fail("C's strides alias");
    }
    if n == 1 && a.cs == 1 && (k == 1 || b.rs == 1) {
        matrix_vector(a, &b.data[..k], |i, v| c[i * rsc] = alpha * v);
        return Ok(());
    }
    // SAFETY: every element the call touches lies inside its slice (the reach checks above:
    // the largest index of each view is below its length), C's strides do not alias (checked),
    // C is borrowed mutably and A, B immutably for the whole call.
    unsafe { raw_product(a, b, c.as_mut_ptr(), [rsc, csc], alpha) };
    Ok(())
}

/// `c = alpha * a * b` through `gemm` on one thread (callers split the work themselves; the inner
/// dimension is never split, so an element's bits depend only on the shapes and the vector
/// instructions `gemm` chose for this CPU), C's element
/// `(i, j)` at `c + i * rsc + j * csc`; C's old content is never read.
///
/// # Safety
/// `a` and `b` reach only inside their slices, `c` is valid for writes at every element
/// `(i, j)` of `a.rows x b.cols`, these do not alias each other, and nothing else reads or
/// writes them during the call.
unsafe fn raw_product(a: Mat<'_>, b: Mat<'_>, c: *mut f32, [rsc, csc]: [usize; 2], alpha: f32) {
    let s = |v: usize| v as isize;
    // SAFETY: the caller's contract; read_dst = false, so C is only written.
    unsafe {
        gemm::gemm(
            a.rows,
            b.cols,
            a.cols,
            c,
            s(csc),
            s(rsc),
            false,
            a.data.as_ptr(),
            s(a.cs),
            s(a.rs),
            b.data.as_ptr(),
            s(b.cs),
            s(b.rs),
            0.0f32,
            alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// Row lengths up to which [`matrix_vector`] takes eight rows at a time, four beyond. One
/// thread, `run --op-times`, two processes of each alternated (2026-11-28, Zen 5):
/// EfficientNet-B0's classifier (1280 -> 1000) 239-264 us four at a time, 213-229 eight,
/// 325-333 sixteen (whose sums spill); VGG-11's 4096 -> 4096 2.72-2.73 ms four, 2.78-2.84
/// eight, its 4096 -> 1000 0.61-0.67 and 0.68-0.69, its 25088 -> 4096 13.3-13.8 and
/// 14.3-14.5.
const EIGHT_ROWS_UP_TO: usize = 2048;

/// `out(i, row i of a . x)` for every row of `a`, whose rows are contiguous (`a.cs == 1`),
/// a few rows at a time ([`rows_at_once`]) in sixteen partial sums each (as [`sum`]
/// adds): a matrix-vector product streams the matrix once, so its speed is the memory's,
/// where `gemm` packs it. In AVX-512 where the CPU has it ([`with_avx512`]: a row's sixteen
/// sums one register, where AVX2's eight rows took all sixteen of its own).
fn matrix_vector(a: Mat<'_>, x: &[f32], mut out: impl FnMut(usize, f32)) {
    let k = x.len();
    let row = |i: usize| &a.data[i * a.rs..i * a.rs + k];
    with_avx512(
        #[inline(always)]
        || match rows_at_once(k) {
            8 => rows_at_a_time::<8>(a.rows, &row, x, &mut out),
            _ => rows_at_a_time::<4>(a.rows, &row, x, &mut out),
        },
    )
}

/// Rows [`matrix_vector`] sums at a time for rows of `k`: eight up to [`EIGHT_ROWS_UP_TO`],
/// four beyond.
pub(crate) fn rows_at_once(k: usize) -> usize {
    match k <= EIGHT_ROWS_UP_TO {
        true => 8,
        false => 4,
    }
}

/// [`matrix_vector`]'s rows `R` at a time, the last ones one by one.
#[inline(always)]
fn rows_at_a_time<'a, const R: usize>(
    rows: usize,
    row: &impl Fn(usize) -> &'a [f32],
    x: &[f32],
    out: &mut impl FnMut(usize, f32),
) {
    let whole = rows - rows % R;
    for i in (0..whole).step_by(R) {
        let rows: [&[f32]; R] = std::array::from_fn(|d| row(i + d));
        let dots = dot_rows(|d, j| &rows[d][j..j + LANES], rows, x);
        for (d, v) in dots.into_iter().enumerate() {
            out(i + d, v);
        }
    }
    for i in whole..rows {
        let r = row(i);
        out(i, dot_rows(|_, j| &r[j..j + LANES], [r], x)[0]);
    }
}

/// `m` rows of `k` (`a`) laid out for [`matrix_vector_interleaved`]: blocks of
/// [`rows_at_once`] rows, each block's rows side by side sixteen elements at a time (then
/// each row's last `k % 16`), the rows after the last whole block as they are. Row `i`'s
/// block takes the same place as its rows in `a` dense (from its first row times `k`), so
/// whole blocks from row `i` on are the layout of those rows. A classifier's weights (1000
/// rows of 1024-1280) then stream from memory in one run where its eight rows were eight.
pub(crate) fn interleave_rows(a: Mat<'_>) -> Vec<f32> {
    let (m, k) = (a.rows, a.cols);
    let r = rows_at_once(k);
    let whole = k - k % LANES;
    let mut out = vec![0.0; m * k];
    if k == 0 {
        return out;
    }
    for (b, block) in out.chunks_mut(r * k).enumerate() {
        let rows = block.len() / k;
        let at = |i: usize, j: usize| a.data[(b * r + i) * a.rs + j * a.cs];
        if rows < r {
            for (i, row) in block.chunks_mut(k).enumerate() {
                row.iter_mut().enumerate().for_each(|(j, v)| *v = at(i, j));
            }
            continue;
        }
        let (body, tails) = block.split_at_mut(r * whole);
        for (c, chunk) in body.chunks_mut(r * LANES).enumerate() {
            for (i, part) in chunk.chunks_mut(LANES).enumerate() {
                part.iter_mut()
                    .enumerate()
                    .for_each(|(t, v)| *v = at(i, c * LANES + t));
            }
        }
        for (i, tail) in tails.chunks_mut((k - whole).max(1)).enumerate() {
            tail.iter_mut()
                .enumerate()
                .for_each(|(t, v)| *v = at(i, whole + t));
        }
    }
    out
}

/// [`matrix_vector`] of the `m` rows of `x.len()` that [`interleave_rows`] laid out in
/// `packed`: the same sums in the same order, so the same bits.
pub(crate) fn matrix_vector_interleaved(
    packed: &[f32],
    m: usize,
    x: &[f32],
    out: impl FnMut(usize, f32),
) {
    with_avx512(
        #[inline(always)]
        || match rows_at_once(x.len()) {
            8 => blocks_interleaved::<8>(packed, m, x, out),
            _ => blocks_interleaved::<4>(packed, m, x, out),
        },
    )
}

/// [`matrix_vector_interleaved`]'s blocks of `R` rows, the last rows one by one.
#[inline(always)]
fn blocks_interleaved<const R: usize>(
    packed: &[f32],
    m: usize,
    x: &[f32],
    mut out: impl FnMut(usize, f32),
) {
    let k = x.len();
    let whole = k - k % LANES;
    let full = m - m % R;
    for (b, block) in packed[..full * k].chunks_exact(R * k).enumerate() {
        let (body, tails) = block.split_at(R * whole);
        let tail = |d: usize| {
            let t = &tails[d * (k - whole)..][..k - whole];
            // Indexed from `whole` on, as a row is.
            (t, whole)
        };
        let dots = dot_rows_split::<R>(
            |d, j| &body[j * R + d * LANES..][..LANES],
            std::array::from_fn(tail),
            x,
        );
        for (d, v) in dots.into_iter().enumerate() {
            out(b * R + d, v);
        }
    }
    for (i, r) in packed[full * k..m * k].chunks_exact(k.max(1)).enumerate() {
        out(full + i, dot_rows(|_, j| &r[j..j + LANES], [r], x)[0]);
    }
}

/// Each of `R` rows (as long as `x`) times `x`, in sixteen partial sums (element `j` into sum
/// `j % 16`, the rest in order after) added pairwise: the same bits for a row in a block of
/// any size. `chunk(d, j)` is row `d`'s sixteen elements from `j` (a multiple of 16).
#[inline(always)]
fn dot_rows<'a, const R: usize>(
    chunk: impl Fn(usize, usize) -> &'a [f32],
    rows: [&[f32]; R],
    x: &[f32],
) -> [f32; R] {
    dot_rows_split(chunk, rows.map(|r| (r, 0)), x)
}

/// [`dot_rows`] with each row's last `x.len() % 16` elements from `tails[d].0`, whose
/// element `j - tails[d].1` is the row's `j`.
#[inline(always)]
fn dot_rows_split<'a, const R: usize>(
    chunk: impl Fn(usize, usize) -> &'a [f32],
    tails: [(&[f32], usize); R],
    x: &[f32],
) -> [f32; R] {
    let k = x.len();
    let whole = k - k % LANES;
    let mut lanes = [[0.0f32; LANES]; R];
    for j in (0..whole).step_by(LANES) {
        let xs = &x[j..j + LANES];
        for (d, l) in lanes.iter_mut().enumerate() {
            let rs = &chunk(d, j)[..LANES];
            for t in 0..LANES {
                l[t] += rs[t] * xs[t];
            }
        }
    }
    let mut dots = [0.0; R];
    for ((d, l), (tail, from)) in dots.iter_mut().zip(lanes).zip(tails) {
        *d = fold_lanes(l) + (whole..k).fold(0.0, |s, j| s + tail[j - from] * x[j]);
    }
    dots
}

/// Partial sums of [`sum`] and its kin.
const LANES: usize = 16;

/// The sum of `lanes`, added pairwise (halves, then quarters...).
#[inline(always)]
fn fold_lanes(mut lanes: [f32; LANES]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        let (lo, hi) = lanes.split_at_mut(width);
        lo.iter_mut().zip(&hi[..width]).for_each(|(l, &h)| *l += h);
    }
    lanes[0]
}

/// `act(., a)` as a concrete closure bound to `$f` in `$body`, straight-line code the
/// compiler vectorises for the activations models use in their hot loops: ReLU, the identity,
/// the clipping family, square roots, reciprocals, negations and absolute values with the
/// same expressions (and bits) as [`crate::reference::act`]; GELU, sigmoid, SiLU/swish, tanh
/// and tanh-GELU through this module's branch-free `exp` and `tanh` (within 5e-7 of it,
/// infinities and NaN kept). The others keep the per-value match of `act`.
macro_rules! with_act {
    ($a:expr, |$f:ident| $body:expr) => {
        match $a {
            Activation::None => {
                let $f = |v: f32| v;
                $body
            }
            Activation::Relu => {
                let $f = |v: f32| v.max(0.0);
                $body
            }
            Activation::Clip {
                min: Some(lo),
                max: Some(hi),
            } => {
                let $f = move |v: f32| v.max(lo).min(hi);
                $body
            }
            Activation::Clip {
                min: Some(lo),
                max: None,
            } => {
                let $f = move |v: f32| v.max(lo);
                $body
            }
            Activation::Clip {
                min: None,
                max: Some(hi),
            } => {
                let $f = move |v: f32| v.min(hi);
                $body
            }
            Activation::LeakyRelu { alpha } => {
                let $f = move |v: f32| if v >= 0.0 { v } else { alpha * v };
                $body
            }
            Activation::Sqrt => {
                let $f = |v: f32| v.sqrt();
                $body
            }
            Activation::Reciprocal => {
                let $f = |v: f32| 1.0 / v;
                $body
            }
            Activation::Neg => {
                let $f = |v: f32| -v;
                $body
            }
            Activation::Abs => {
                let $f = |v: f32| v.abs();
                $body
            }
            Activation::HardSigmoid { alpha, beta } => {
                let $f = move |v: f32| (alpha * v + beta).clamp(0.0, 1.0);
                $body
            }
            Activation::HardSwish => {
                let $f = |v: f32| v * (v / 6.0 + 0.5).clamp(0.0, 1.0);
                $body
            }
            Activation::Gelu => {
                let $f = $crate::cpu::math::gelu;
                $body
            }
            Activation::GeluTanh => {
                let $f = $crate::cpu::math::gelu_tanh;
                $body
            }
            Activation::Sigmoid => {
                let $f = $crate::cpu::math::sigmoid;
                $body
            }
            Activation::Swish { alpha } => {
                let $f = move |v: f32| $crate::cpu::math::times_sigmoid(v, alpha * v);
                $body
            }
            Activation::Tanh => {
                let $f = $crate::cpu::math::tanh;
                $body
            }
            other => {
                let $f = move |v: f32| $crate::reference::act(v, other);
                $body
            }
        }
    };
}
pub(crate) use with_act;

/// GELU (erf form) in `f32` without a branch or a library call, so that a loop over a slice
/// vectorises: the reference's formula (Abramowitz and Stegun 7.1.26 for erf, absolute error
/// below 1.5e-7) with `exp` by `exp_neg`. Within 3e-7 of the reference over the whole line.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    let z = (x * std::f32::consts::FRAC_1_SQRT_2).abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly = ((((1.061_405_4 * t - 1.453_152_1) * t + 1.421_413_7) * t - 0.284_496_74) * t
        + 0.254_829_6)
        * t;
    let erf_abs = 1.0 - poly * exp_neg(z * z);
    // erf is odd: its sign is x's.
    let erf = f32::from_bits(erf_abs.to_bits() | (x.to_bits() & 0x8000_0000));
    0.5 * x * (1.0 + erf)
}

/// `1 / (1 + exp(-x))`, branch-free (vectorises): [`times_sigmoid`] of 1.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    times_sigmoid(1.0, x)
}

/// `x sigmoid(z)` as one division, `x / (1 + exp(-z))` (as the reference computes SiLU):
/// `exp(-z)` by `exp_in_range` on `-z` clamped to [-87, 89] (past -87 the sum rounds to 1;
/// past 88.7 `exp` is infinite, and so is it there, giving 0, or NaN for an infinite `x`, as
/// the reference's; NaN passes both clamps). No select on the sign (a third fewer
/// instructions than `exp(-|z|)` and its two cases), no multiply by `x`.
#[inline(always)]
pub fn times_sigmoid(x: f32, z: f32) -> f32 {
    let z = -z;
    // NaN fails both comparisons and stays NaN.
    let z = if z > 89.0 { 89.0 } else { z };
    let z = if z < -87.0 { -87.0 } else { z };
    x / (1.0 + exp_in_range(z))
}

/// GELU's tanh approximation, `x (1 + tanh(u)) / 2` with `u = sqrt(2 / pi) (x + 0.044715 x^3)`,
/// as `x sigmoid(2u)` (the same function; no cancellation where `tanh(u)` nears -1).
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const TWO_C: f32 = 2.0 * 0.797_884_6;
    times_sigmoid(x, TWO_C * (x + 0.044_715 * x * x * x))
}

/// `tanh(x)`, branch-free (vectorises): Eigen's rational approximation (odd degree-13
/// numerator over even degree-6 denominator) on `x` clamped to +-7.905 (where tanh rounds to
/// +-1), `x` itself below 4e-4. Within 5e-7 relative of the exact value over the whole line.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let c = x.clamp(-7.905_311, 7.905_311);
    let c2 = c * c;
    let p = ((((((-2.760_768_5e-16 * c2 + 2.000_188e-13) * c2 - 8.604_672e-11) * c2
        + 5.122_297e-8)
        * c2
        + 1.485_722_4e-5)
        * c2
        + 6.372_619_3e-4)
        * c2
        + 4.893_524_6e-3)
        * c;
    let q = ((1.198_258_4e-6 * c2 + 1.185_347_1e-4) * c2 + 2.268_434_6e-3) * c2 + 4.893_525e-3;
    if x.abs() < 4e-4 {
        x
    } else {
        p / q
    }
}

/// `exp(x)` for `x <= 0` (softmax's values less their maximum), branch-free: `exp_neg(-x)`,
/// but 0 below -87 (where `exp_neg` stops: f32's normal range ends) and NaN kept.
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    let y = -x;
    let e = exp_neg(y);
    if y <= 87.0 {
        e
    } else if y > 87.0 {
        0.0
    } else {
        x
    }
}

/// `exp(-y)` for `y >= 0` (its value at 87 beyond), branch-free: [`exp_in_range`].
#[inline(always)]
fn exp_neg(y: f32) -> f32 {
    exp_in_range(-y.min(87.0))
}

/// `exp(x)` for `x` in [-87, 89] (infinite from 88.73 on), branch-free: `2^n * p(r)` with `n`
/// the nearest integer to `x / ln 2`, `r` the rest (Cody and Waite's two-part `ln 2`), and
/// `p(r) = 1 + r + r^2 q(r)`, `q` a cubic fitted to `exp` on `|r| <= ln 2 / 2` by iteratively
/// reweighted least squares (near-minimax: relative error at most 1.8e-7 over the whole range
/// in `f32`, against 8e-8 for Cephes' degree-7 form, two multiply-adds more). In fused
/// multiply-adds: one instruction each inside [`with_avx2`], where every caller that runs
/// many runs it; a library call, with the same bits, elsewhere. criterion `cpu_activations`
/// (3136 values, one thread, 2026-11-28), against Cephes' form and `exp(-|x|)` with its two
/// cases in the sigmoid: sigmoid 2.26 -> 1.51 us, swish 2.44 -> 1.77, GELU 3.36 -> 2.45,
/// tanh-GELU 3.96 -> 2.11.
#[inline(always)]
fn exp_in_range(x: f32) -> f32 {
    // Round to nearest by adding and removing 1.5 * 2^23 (no library call).
    const ROUND: f32 = 12_582_912.0;
    let shifted = x.mul_add(std::f32::consts::LOG2_E, ROUND);
    let n = shifted - ROUND;
    let r = n.mul_add(2.121_944_4e-4, n.mul_add(-0.693_359_4, x));
    let p = 8.333_819e-3f32
        .mul_add(r, 4.189_856_7e-2)
        .mul_add(r, 1.666_688_6e-1)
        .mul_add(r, 0.499_991_42)
        .mul_add(r * r, r)
        + 1.0;
    // 2^n through the exponent bits (-126 <= n <= 128; 128 makes the bits of infinity): n is
    // in the low bits of `shifted`, read without a float-to-int conversion (which would not
    // vectorise).
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    p * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

/// `y[i] = act(y[i] + bias[(i / inner) % channels])` over all of `y`, in parallel for large
/// tensors: in chunks of about `BIAS_CHUNK` elements, whole rows of `inner` elements that
/// share a bias (or, where every element has its own, `inner == 1`, whole runs of `channels`),
/// so that a pointwise pass over a channels-last tensor or a bias-free activation is not split
/// into a task per element.
pub fn apply_bias_act(
    y: &mut [f32],
    bias: Option<&[f32]>,
    channels: usize,
    inner: usize,
    a: Activation,
) {
    if bias.is_none() && a == Activation::None {
        return;
    }
    let (inner, channels) = (inner.max(1), channels.max(1));
    match bias {
        // The activation alone: one pass per chunk.
        None => for_chunks(y, BIAS_CHUNK, |_, part| bias_act_row(part, None, a)),
        // One bias per element of a run of `channels` (a product's features, channels last).
        Some(b) if inner == 1 => {
            for_chunks(y, BIAS_CHUNK.div_ceil(channels) * channels, |_, part| {
                part.chunks_mut(channels).for_each(|run| act_add(run, b, a))
            })
        }
        // One bias per row of `inner` elements.
        Some(b) => {
            let rows = BIAS_CHUNK.div_ceil(inner);
            for_chunks(y, rows * inner, |k, part| {
                for (r, row) in part.chunks_mut(inner).enumerate() {
                    bias_act_row(row, Some(b[(k * rows + r) % channels]), a);
                }
            })
        }
    }
}

/// `f(k, chunk k)` over `y` cut in chunks of `len` elements, on rayon's pool where `y` is large
/// (from 64K elements: below, a task's hand-off costs more than it saves).
fn for_chunks(y: &mut [f32], len: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if y.len() >= 1 << 16 {
        y.par_chunks_mut(len).enumerate().for_each(|(k, c)| f(k, c));
    } else {
        y.chunks_mut(len).enumerate().for_each(|(k, c)| f(k, c));
    }
}

/// `f(i, plane i)` over `y` cut in planes of `len` elements, each plane about `work`
/// elements read or written: the planes in groups of at least 16K elements of work
/// (a task's hand-off costs about a microsecond: NASNet's and GoogLeNet's 7x7 and 11x11
/// planes come by the hundred), the groups on rayon's pool where there are several.
pub fn for_planes(
    y: &mut [f32],
    len: usize,
    work: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    for_plane_groups(y, len, work, |first, planes| {
        for (i, plane) in planes.chunks_mut(len).enumerate() {
            f(first + i, plane)
        }
    })
}

/// [`for_planes`]'s groups whole: `f(first plane, its group's planes)`, for a kernel that
/// does better with many planes at once than plane by plane.
pub fn for_plane_groups(
    y: &mut [f32],
    len: usize,
    work: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    for_groups_of(y, len, BIAS_CHUNK.div_ceil(work.max(1)), f)
}

/// [`for_plane_groups`] in groups of `per` planes.
fn for_groups_of(
    y: &mut [f32],
    len: usize,
    per: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    if len == 0 {
        return;
    }
    let per = per.max(1);
    if y.len() > per * len {
        y.par_chunks_mut(per * len)
            .enumerate()
            .for_each(|(k, planes)| f(k * per, planes));
    } else {
        f(0, y);
    }
}

/// [`for_plane_groups`] for a kernel that may refuse its planes (`f` returns `false` for a
/// group it left untouched): whether it took every group. In fewer, larger groups: at most
/// four a thread (and [`for_plane_groups`]' work or more each), as the depthwise and pooling
/// kernels' every call sets up tables of its own (offsets, masks) besides rayon's task:
/// EfficientNet-B0's 1152 planes of 7x7 by 5x5 had taken 89 calls of 13 planes. Three runs of
/// each alternated (`run --op-times`, 2026-11-29), the convolutions' sum on one thread:
/// EfficientNet-B0 6.61 -> 6.47 ms, MobileNetV3-Large 3.30 -> 3.14, DeepLabV3 11.33 -> 11.24,
/// ConvNeXt-T 4.46 -> 4.26; on two 4.26 -> 4.20, 2.38 -> 2.41, 6.69 -> 6.50, 3.28 -> 2.42;
/// the poolings' on one thread GoogLeNet 0.53 -> 0.48, DenseNet-121 0.265 -> 0.249, on two
/// 0.46 -> 0.43 and 0.194 -> 0.182 (Inception-v3's 1-2% either way).
pub fn try_plane_groups(
    y: &mut [f32],
    len: usize,
    work: usize,
    f: impl Fn(usize, &mut [f32]) -> bool + Sync + Send,
) -> bool {
    let planes = y.len().checked_div(len).unwrap_or(0);
    let tasks = KERNEL_TASKS * rayon::current_num_threads();
    let per = BIAS_CHUNK
        .div_ceil(work.max(1))
        .max(planes.div_ceil(tasks.max(1)));
    let refused = std::sync::atomic::AtomicBool::new(false);
    for_groups_of(y, len, per, |first, planes| {
        if !f(first, planes) {
            refused.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    !refused.into_inner()
}

/// Tasks a thread [`try_plane_groups`] makes at most: enough that two threads end
/// together within a task or so.
const KERNEL_TASKS: usize = 4;

/// Elements [`apply_bias_act`] gives one task.
const BIAS_CHUNK: usize = 1 << 14;

/// The sum of `xs` in sixteen interleaved partial sums (element `i` into sum `i % 16`, the
/// rest in order after), added pairwise at the end: a loop that vectorises, where one running
/// sum waits on each addition; and no less accurate.
pub fn sum(xs: &[f32]) -> f32 {
    sum_of(xs, |x| x)
}

/// The sum of `f(x)` over `xs`, added as [`sum`] adds (a variance's squared deviations).
#[inline(always)]
pub fn sum_of(xs: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    with_avx512(
        #[inline(always)]
        || {
            let mut lanes = [0.0f32; LANES];
            let chunks = xs.chunks_exact(LANES);
            let rest = chunks.remainder().iter().fold(0.0, |s, &x| s + f(x));
            for c in chunks {
                lanes.iter_mut().zip(c).for_each(|(l, &x)| *l += f(x));
            }
            fold_lanes(lanes) + rest
        },
    )
}

/// The largest of `xs` as `f32::max` folds it from -inf (which skips NaN), sixteen lanes at a
/// time: `max` is exact, so the order does not change the result.
pub fn max_of(xs: &[f32]) -> f32 {
    extreme_of(xs, f32::NEG_INFINITY, f32::max)
}

/// The smallest of `xs`, as [`max_of`] finds the largest.
pub fn min_of(xs: &[f32]) -> f32 {
    extreme_of(xs, f32::INFINITY, f32::min)
}

/// `pick` (`f32::max` or `f32::min`) folded over `xs` from `start` in sixteen lanes.
#[inline(always)]
fn extreme_of(xs: &[f32], start: f32, pick: impl Fn(f32, f32) -> f32) -> f32 {
    with_avx512(
        #[inline(always)]
        || {
            let mut lanes = [start; LANES];
            let chunks = xs.chunks_exact(LANES);
            let rest = chunks.remainder().iter().fold(start, |m, &x| pick(m, x));
            for c in chunks {
                lanes.iter_mut().zip(c).for_each(|(l, &x)| *l = pick(*l, x));
            }
            lanes.iter().fold(rest, |m, &x| pick(m, x))
        },
    )
}

/// ReLU and the clipping family (both bounds) as the range `(lo, hi)` they clip to:
/// `v.max(lo).min(hi)` gives `with_act!`'s bits for them (ReLU's `v.max(0.0)` is the range
/// `(0, inf)`); `None` for every other activation.
pub fn clip_range(a: Activation) -> Option<(f32, f32)> {
    match a {
        Activation::Relu => Some((0.0, f32::INFINITY)),
        Activation::Clip {
            min: Some(lo),
            max: Some(hi),
        } => Some((lo, hi)),
        _ => None,
    }
}

/// `v = act(v + bias)` over one row that shares its bias. Like [`act_of`] and [`act_add`],
/// compiled for AVX-512 or AVX2 where the CPU has them (`with_avx512`): the activations'
/// polynomials ran twice as fast in AVX2 as in the baseline's SSE2.
pub fn bias_act_row(row: &mut [f32], bias: Option<f32>, a: Activation) {
    with_avx512(
        #[inline(always)]
        || {
            with_act!(a, |f| match bias {
                Some(b) => row.iter_mut().for_each(|v| *v = f(*v + b)),
                None => row.iter_mut().for_each(|v| *v = f(*v)),
            })
        },
    )
}

/// `y[i] = act(x[i] + bias)` (where `y` and `x` have elements).
pub fn act_of(y: &mut [f32], x: &[f32], bias: Option<f32>, a: Activation) {
    with_avx512(
        #[inline(always)]
        || {
            let pairs = y.iter_mut().zip(x);
            with_act!(a, |f| match bias {
                Some(b) => pairs.for_each(|(v, &x)| *v = f(x + b)),
                None => pairs.for_each(|(v, &x)| *v = f(x)),
            })
        },
    )
}

/// `y[i] = act(y[i] + bias[i])`, or `act(y[i])` without a bias, in one pass: a column of
/// outputs of one pixel each (squeeze-and-excitation's layers), each its own channel's bias,
/// where a call per element cost as much as its sums.
pub fn bias_act_each(y: &mut [f32], bias: Option<&[f32]>, a: Activation) {
    match bias {
        Some(b) => act_add(y, b, a),
        None => bias_act_row(y, None, a),
    }
}

/// `y[i] = act(y[i] + z[i])` (where `y` and `z` have elements): a residual sum, or a bias per
/// element of a run.
pub fn act_add(y: &mut [f32], z: &[f32], a: Activation) {
    with_avx512(
        #[inline(always)]
        || {
            with_act!(a, |f| y
                .iter_mut()
                .zip(z)
                .for_each(|(v, &r)| *v = f(*v + r)))
        },
    )
}

/// `f` compiled for AVX2 and FMA where the CPU has them (`pulp`'s V3; `f` inlines into it), else
/// as it is. Not AVX-512 where there is more: on the Zen 4 cores measured (2026-11-28), whose
/// 512-bit operations take two passes, the window loops ran 8% slower in it (gemm's kernels,
/// whose larger tiles it serves, gained), on Zen 5 up to 25% (element-wise passes take
/// [`with_avx512`]).
#[inline(always)]
pub(crate) fn with_avx2<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V3::try_new() {
        return simd.vectorize(f);
    }
    f()
}

/// `f` compiled for AVX-512 where the CPU has it (`pulp`'s V4; `f` inlines into it), else as
/// [`with_avx2`]: for element-wise passes, whose activations (an `exp`, a division) ran
/// 1.5-1.8x faster sixteen lanes at a time on the Zen 5 cores of 2026-11-29 (criterion
/// `cpu_activations`, 3136 values, one thread: swish 1.09 -> 0.68 us, sigmoid 0.99 -> 0.63,
/// GELU 1.83 -> 1.03, tanh 1.25 -> 0.76, clip 0.36 -> 0.28, ReLU alike), where the window
/// loops ran up to 25% slower (they stay in AVX2). The same operations on every element: the
/// same bits either way.
#[inline(always)]
pub(crate) fn with_avx512<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V4::try_new() {
        return simd.vectorize(f);
    }
    with_avx2(f)
}

thread_local! {
    /// This thread's scratch buffers, free ones on top: a call takes one and gives it back.
    static SCRATCH: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// Run `f` with `len` floats of this thread's scratch (kept between calls, so a kernel that
/// runs every inference does not allocate and fault in fresh pages each time); the content is
/// whatever the last user left. A nested call gets another buffer of the thread's, kept as
/// well (a pooled sum pools into scratch while the pooling pads its planes into more).
pub fn with_scratch<T>(len: usize, f: impl FnOnce(&mut [f32]) -> T) -> T {
    let mut buf = SCRATCH.with(|s| s.borrow_mut().pop()).unwrap_or_default();
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    let out = f(&mut buf[..len]);
    SCRATCH.with(|s| s.borrow_mut().push(buf));
    out
}

/// An 8 x 8 block transposed (`out[i][j] = m[j][i]`): rows of eight pixels of eight planes
/// in, rows of a pixel of every plane out, and back. Unpacks and shuffles in AVX where the
/// CPU has it.
#[inline(always)]
pub(crate) fn transpose8(m: [[f32; 8]; 8]) -> [[f32; 8]; 8] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        use std::arch::x86_64::*;
        // SAFETY: AVX is present (checked); the loads and stores are of whole [f32; 8] rows.
        return unsafe {
            let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(m[i].as_ptr()));
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let o = [
                _mm256_permute2f128_ps::<0x20>(s0, s4),
                _mm256_permute2f128_ps::<0x20>(s1, s5),
                _mm256_permute2f128_ps::<0x20>(s2, s6),
                _mm256_permute2f128_ps::<0x20>(s3, s7),
                _mm256_permute2f128_ps::<0x31>(s0, s4),
                _mm256_permute2f128_ps::<0x31>(s1, s5),
                _mm256_permute2f128_ps::<0x31>(s2, s6),
                _mm256_permute2f128_ps::<0x31>(s3, s7),
            ];
            let mut out = [[0.0f32; 8]; 8];
            for (row, v) in out.iter_mut().zip(o) {
                _mm256_storeu_ps(row.as_mut_ptr(), v);
            }
            out
        };
    }
    std::array::from_fn(|i| std::array::from_fn(|j| m[j][i]))
}

/// A raw pointer to an output that crosses into rayon's tasks, each task writing elements of
/// its own (`sgemm_column_tiles`' columns, `super::direct`'s pixels).
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(pub(crate) *mut f32);
// SAFETY: its users' tasks write disjoint elements, and nothing reads them meanwhile.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    pub(crate) fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// Where [`sgemm_column_tiles`] gets each tile's block of B (`k x cols.len()`).
pub enum TilesOfB<'a, F> {
    /// B itself (`k x n`), read in place.
    View(Mat<'a>),
    /// `F(cols, buffer)` writes the block of the columns `cols` into `buffer` (row-major,
    /// `k x cols.len()`; a buffer of the task's thread, as long as the largest block).
    Fill(F),
}

/// Part `i` of `len` split into `parts` as evenly as whole steps of `align` allow: the parts
/// end at the multiples of `align` nearest an even split (the last at `len`), so they differ
/// by at most `align` and only the last may end inside a step; where `len` holds fewer steps
/// than `parts`, some are empty. Split so, two threads get equal work from a 28x28 plane in
/// tiles of 16 columns (784 in 8 parts, where tiles of 112 made 7).
pub fn aligned_part(len: usize, parts: usize, align: usize, i: usize) -> Range<usize> {
    let (parts, align) = (parts.max(1), align.max(1));
    let end = |i: usize| {
        if i >= parts {
            len
        } else {
            ((i * len / parts + align / 2) / align * align).min(len)
        }
    };
    end(i)..end(i + 1)
}

/// Columns a tile of [`sgemm_column_tiles`] covers in whole: two vectors of AVX-512.
const TILE_COLUMNS: usize = 16;

/// `c = a * b` with `c` dense row-major `a.rows x n`, computed in `tiles` parallel tiles of
/// columns ([`aligned_part`]s of whole sixteens), B's blocks from `b` (`k = a.cols`), and
/// `epilogue(row, part)` run on each row's part of a tile while it is in cache. Every task
/// packs only its own block of B, where splitting the rows of C would pack all of B once per
/// task. Each element of C is the same
/// product whatever the tiling (the product never splits the inner dimension), so the result
/// does not depend on the thread count.
pub fn sgemm_column_tiles<F, E>(
    a: Mat<'_>,
    n: usize,
    c: &mut [f32],
    tiles: usize,
    b: TilesOfB<'_, F>,
    epilogue: E,
) -> Result<(), GpuError>
where
    F: Fn(Range<usize>, &mut [f32]) + Sync,
    E: Fn(usize, &mut [f32]) + Sync,
{
    let (m, k) = (a.rows, a.cols);
    let fail = |what: &str| Err(GpuError::Plan(format!("sgemm tiles {m}x{k}x{n}: {what}")));
    if m.checked_mul(n).is_none_or(|len| len > c.len()) {
        return fail("C is shorter than its shape");
    }
    if a.reach() > a.data.len() {
        return fail("A reaches past its buffer");
    }
    let tiles = tiles.clamp(1, n.max(1));
    let part = |t: usize| aligned_part(n, tiles, TILE_COLUMNS, t);
    let widest = (0..tiles).map(|t| part(t).len()).max().unwrap_or(0);
    let scratch = match &b {
        TilesOfB::View(v) if v.rows != k || v.cols != n || v.reach() > v.data.len() => {
            return fail("B does not match its shape or reaches past its buffer")
        }
        TilesOfB::View(_) => 0,
        TilesOfB::Fill(_) => k
            .checked_mul(widest)
            .ok_or(GpuError::Plan("sgemm tiles: overflow".into()))?,
    };
    if k == 0 {
        // An empty sum: zeros (what the product library would do is its own business).
        for (r, row) in c[..m * n].chunks_mut(n.max(1)).enumerate() {
            row.fill(0.0);
            epilogue(r, row);
        }
        return Ok(());
    }
    let out = SharedOut(c.as_mut_ptr());
    (0..tiles).into_par_iter().try_for_each(|t| {
        let cols = part(t);
        let w = cols.len();
        if w == 0 {
            return Ok(());
        }
        with_scratch(scratch, |buf| {
            let bt = match &b {
                TilesOfB::View(v) => Mat::strided(&v.data[cols.start * v.cs..], k, w, v.rs, v.cs),
                TilesOfB::Fill(fill) => {
                    let block = &mut buf[..k * w];
                    fill(cols.clone(), block);
                    Mat::row_major(block, k, w)
                }
            };
            // A short inner dimension by our own blocks (`short_k`); else the library's
            // product.
            // SAFETY (both): C holds m x n elements (checked above) and this task writes only
            // the columns `cols` of each row: elements `r * n + cols`, inside C and disjoint
            // from every other task's; no task reads C. A and the tile of B are read-only
            // views inside their slices (A's reach checked above; a view's tile ends where
            // B's columns end, a filled block is k x w), their rows `rs` apart.
            if !unsafe { short_product(a, bt, out.at(cols.start), n) } {
                unsafe { raw_product(a, bt, out.at(cols.start), [n, 1], 1.0) };
            }
            for r in 0..m {
                // SAFETY: row r's part of this task's columns, inside C (r < m, cols.end <= n)
                // and written by this task only; the product above has returned, so no other
                // reference to these elements is live.
                let part = unsafe { std::slice::from_raw_parts_mut(out.at(r * n + cols.start), w) };
                epilogue(r, part);
            }
            Ok(())
        })
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::reference::act;

    /// The short product agrees with the library's within rounding on the shapes it takes
    /// and on those it leaves to it (a single column, a long inner dimension), and refuses
    /// what `sgemm` refuses.
    #[test]
    fn short_products_match_the_library() {
        let value = |i: usize| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0;
        for (m, k, n) in [(576, 96, 196), (40, 27, 100), (8, 5, 1), (300, 300, 20)] {
            let a: Vec<f32> = (0..m * k).map(value).collect();
            let b: Vec<f32> = (0..k * n).map(|i| value(i + 7)).collect();
            let (mut short, mut lib) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
            let (am, bm) = (Mat::row_major(&a, m, k), Mat::row_major(&b, k, n));
            sgemm_short(am, bm, &mut short).unwrap();
            sgemm(am, bm, &mut lib).unwrap();
            for (i, (s, l)) in short.iter().zip(&lib).enumerate() {
                assert!(
                    (s - l).abs() <= 1e-5 * k as f32,
                    "{m}x{k}x{n} element {i}: {s} vs {l}"
                );
            }
        }
        let (a, b) = ([1.0; 64], [1.0; 64]);
        let mut c = [0.0; 15];
        let short = sgemm_short(Mat::row_major(&a, 4, 4), Mat::row_major(&b, 4, 16), &mut c);
        assert!(short.is_err(), "C shorter than its shape");
    }

    /// The vectorisable GELU agrees with the reference's formula over the whole line (and
    /// keeps infinities and NaN as it does).
    #[test]
    fn fast_gelu_matches_the_reference() {
        let mut worst = 0.0f32;
        for i in -200_000..=200_000 {
            let x = i as f32 * 5e-5;
            for x in [x, x * 40.0] {
                let want = act(x, Activation::Gelu);
                let err = (gelu(x) - want).abs() / want.abs().max(1.0);
                worst = worst.max(err);
            }
        }
        assert!(worst <= 3e-7, "off by {worst:e}");
        assert_eq!(gelu(f32::INFINITY), f32::INFINITY);
        assert_eq!(gelu(-1e30), 0.0);
        assert!(gelu(f32::NAN).is_nan());
        assert_eq!(gelu(0.0), 0.0);
    }

    /// Aligned parts cover the whole length in order, each but the last starting and ending
    /// on a step, none longer than an even share and a step.
    #[test]
    fn aligned_parts_cover_the_length_evenly() {
        for len in [0usize, 1, 5, 16, 49, 196, 784, 3025] {
            for parts in 1..=20usize {
                for align in [1usize, 6, 16] {
                    let what = format!("{len} in {parts} parts of {align}");
                    let all: Vec<_> = (0..parts)
                        .map(|i| aligned_part(len, parts, align, i))
                        .collect();
                    assert_eq!(all[0].start, 0, "{what}");
                    assert_eq!(all[parts - 1].end, len, "{what}");
                    for (i, p) in all.iter().enumerate() {
                        assert!(p.start <= p.end, "{what}");
                        assert!(p.len() <= len.div_ceil(parts) + align, "{what}");
                        if i + 1 < parts {
                            assert_eq!(p.end, all[i + 1].start, "{what}");
                            assert!(p.end.is_multiple_of(align) || p.end == len, "{what}");
                        }
                    }
                }
            }
        }
        assert_eq!(aligned_part(784, 8, 16, 0), 0..96);
        assert_eq!(aligned_part(784, 8, 16, 7), 688..784);
    }

    /// The vectorised sum is the f64 sum within f32 rounding at every length (the lanes, the
    /// rest and both), and the lane-wise max is the in-order fold's, NaN and -inf included.
    #[test]
    fn sums_and_maxima_of_slices() {
        for len in [0, 1, 5, 15, 16, 17, 31, 32, 33, 100, 12544] {
            let xs: Vec<f32> = (0..len)
                .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            let exact: f64 = xs.iter().map(|&x| f64::from(x)).sum();
            let scale: f64 = xs.iter().map(|&x| f64::from(x.abs())).sum();
            assert!(
                (f64::from(sum(&xs)) - exact).abs() <= 1e-6 * scale.max(1.0),
                "{len}"
            );
            let folded = xs.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            assert_eq!(max_of(&xs).to_bits(), folded.to_bits(), "{len}");
        }
        // NaN is never the running max: an all-NaN slice folds to -inf, as in order.
        assert_eq!(max_of(&[f32::NAN; 40]), f32::NEG_INFINITY);
        let mut some_nan = vec![f32::NAN; 40];
        some_nan[33] = -3.0;
        assert_eq!(max_of(&some_nan), -3.0);
        assert_eq!(sum(&[1.0; 40]), 40.0);
    }

    fn through_with_act(a: Activation, x: f32) -> f32 {
        with_act!(a, |f| f(x))
    }

    /// The activations `with_act!` writes out with the reference's expressions (and bits).
    const EXACT: [Activation; 12] = [
        Activation::None,
        Activation::Relu,
        Activation::Clip {
            min: Some(0.0),
            max: Some(6.0),
        },
        Activation::Clip {
            min: Some(-1.0),
            max: None,
        },
        Activation::Clip {
            min: None,
            max: Some(2.5),
        },
        Activation::LeakyRelu { alpha: 0.01 },
        Activation::HardSigmoid {
            alpha: 0.2,
            beta: 0.5,
        },
        Activation::HardSwish,
        Activation::Sqrt,
        Activation::Reciprocal,
        Activation::Neg,
        Activation::Abs,
    ];

    /// The activations `with_act!` computes through `exp` or the rational `tanh`, each with
    /// the magnitude below which its error is measured as absolute.
    const CLOSE: [(Activation, f32); 5] = [
        (Activation::Sigmoid, 1e-20),
        (Activation::Tanh, 1e-20),
        (Activation::Swish { alpha: 1.0 }, 1e-20),
        (Activation::Swish { alpha: 1.702 }, 1e-20),
        (Activation::GeluTanh, 1.0),
    ];

    /// Every activation `with_act!` writes out agrees with the reference: the clipping family,
    /// roots, reciprocals, negations and absolute values to the bit, the ones computed through
    /// `exp_neg` or the rational tanh within 5e-7 of it (relative, below 1e-20 absolute;
    /// tanh-GELU's reference cancels where tanh nears -1, so it is measured against max(|y|,
    /// 1)), and all of them on infinities, NaN and zeros.
    #[test]
    fn vectorised_activations_match_the_reference() {
        let special = [
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            0.0,
            -0.0,
            1e-30,
            -1e30,
        ];
        let line = (-400_000..=400_000).map(|i| i as f32 * 5e-5);
        let wide = (-200_000..=200_000).map(|i| i as f32 * 1e-3);
        for x in line.chain(wide).chain(special) {
            for a in EXACT {
                let (got, want) = (through_with_act(a, x), act(x, a));
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "{a:?} at {x}: {got} vs {want}"
                );
            }
            for (a, floor) in CLOSE {
                let (got, want) = (through_with_act(a, x), act(x, a));
                if want.is_nan() || want.is_infinite() {
                    assert!(got == want || got.is_nan() && want.is_nan(), "{a:?} at {x}");
                    continue;
                }
                let err = (got - want).abs() / want.abs().max(floor);
                assert!(err <= 5e-7, "{a:?} at {x}: {got} vs {want} ({err:e})");
            }
        }
    }

    /// The activation passes give one element's bits whatever the vectors: compiled for
    /// AVX-512 (`bias_act_row`, where the CPU has it), for AVX2, and as scalar code (`fma`
    /// through the library), on a line of values, infinities, NaN and zeros: every activation
    /// `with_act!` writes out, and GELU.
    #[test]
    fn activations_give_the_same_bits_in_every_width() {
        let close = CLOSE.map(|(a, _)| a);
        let all = EXACT.into_iter().chain(close).chain([Activation::Gelu]);
        let special = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.0, -0.0, 1e-30];
        let x: Vec<f32> = (-20_000..=20_000)
            .map(|i| i as f32 * 7.3e-3)
            .chain(special)
            .collect();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for a in all {
            let mut wide = x.clone();
            bias_act_row(&mut wide, Some(0.25), a);
            let mut narrow = x.clone();
            with_avx2(|| with_act!(a, |f| narrow.iter_mut().for_each(|v| *v = f(*v + 0.25))));
            let scalar: Vec<f32> = x.iter().map(|&v| through_with_act(a, v + 0.25)).collect();
            assert_eq!(bits(&wide), bits(&scalar), "{a:?}: AVX-512 against scalar");
            assert_eq!(bits(&narrow), bits(&scalar), "{a:?}: AVX2 against scalar");
        }
    }

    /// A view's transpose, rows contiguous (eight by eight through the 8 x 8 transpose, the
    /// rest one by one) or not, in and out of whole blocks, into rows further apart than the
    /// view has rows: every element where it belongs, the elements between rows untouched.
    #[test]
    fn transposes_put_every_element_in_place() {
        for (rows, cols) in [(8usize, 8usize), (19, 27), (5, 40), (33, 3), (1, 1)] {
            let ld = rows + 3;
            let data: Vec<f32> = (0..rows * cols * 2).map(|v| v as f32).collect();
            for (rs, cs) in [(cols, 1), (1, rows), (2 * cols, 2)] {
                let mut dst = vec![f32::NAN; cols * ld];
                Mat::strided(&data, rows, cols, rs, cs).transpose_into(&mut dst, ld);
                for j in 0..cols {
                    for i in 0..ld {
                        let got = dst[j * ld + i];
                        match i < rows {
                            true => assert_eq!(got, data[i * rs + j * cs], "{rows}x{cols}"),
                            false => assert!(got.is_nan(), "{rows}x{cols}: gap written"),
                        }
                    }
                }
            }
        }
    }

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn sgemm_matches_the_naive_product_with_any_strides() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|v| (v % 5) as f32 - 2.0).collect();
        let b: Vec<f32> = (0..k * n).map(|v| (v % 3) as f32 * 0.5).collect();
        let want = naive(&a, &b, m, k, n);
        let mut c = vec![f32::NAN; m * n];
        sgemm(Mat::row_major(&a, m, k), Mat::row_major(&b, k, n), &mut c).unwrap();
        assert_eq!(c, want);
        // A given as its transpose (k x m row-major, read column-wise).
        let at: Vec<f32> = (0..k * m).map(|t| a[(t % m) * k + t / m]).collect();
        let mut c2 = vec![0.0; m * n];
        sgemm(
            Mat::strided(&at, m, k, 1, m),
            Mat::row_major(&b, k, n),
            &mut c2,
        )
        .unwrap();
        assert_eq!(c2, want);
        // C written column-major.
        let mut c3 = vec![0.0; m * n];
        sgemm_strided(
            Mat::row_major(&a, m, k),
            Mat::row_major(&b, k, n),
            &mut c3,
            1,
            m,
        )
        .unwrap();
        for i in 0..m {
            for j in 0..n {
                assert_eq!(c3[i + j * m], want[i * n + j]);
            }
        }
    }

    #[test]
    fn a_matrix_times_a_vector_matches_the_product_in_f64() {
        // Every remainder of the four-row and sixteen-lane blocks, rows apart by more than
        // their length, C strided and scaled.
        for (m, k) in [(1, 1), (3, 15), (4, 16), (5, 17), (9, 100), (13, 33)] {
            let lda = k + 3;
            let a: Vec<f32> = (0..m * lda).map(|v| ((v * 7) % 11) as f32 - 5.0).collect();
            let x: Vec<f32> = (0..k).map(|v| ((v * 5) % 9) as f32 * 0.25 - 1.0).collect();
            let mut c = vec![f32::NAN; 2 * m];
            let av = Mat::strided(&a, m, k, lda, 1);
            sgemm_scaled(av, Mat::row_major(&x, k, 1), &mut c, [2, 1], 0.5).unwrap();
            for i in 0..m {
                let want: f64 = (0..k).map(|p| a[i * lda + p] as f64 * x[p] as f64).sum();
                let got = c[2 * i] as f64;
                assert!(
                    (got - 0.5 * want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{m}x{k} row {i}"
                );
                assert!(c[2 * i + 1].is_nan(), "wrote between rows");
            }
            // A row's value does not depend on the rows beside it (blocks of four or one).
            let mut one = [f32::NAN];
            let last = Mat::strided(&a[(m - 1) * lda..], 1, k, lda, 1);
            sgemm(last, Mat::row_major(&x, k, 1), &mut one).unwrap();
            assert_eq!(0.5 * one[0], c[2 * (m - 1)], "{m}x{k}");
        }
    }

    #[test]
    fn sgemm_refuses_a_short_slice_or_aliasing_output() {
        let a = vec![0.0; 5];
        let mut c = vec![0.0; 4];
        let e = sgemm(Mat::row_major(&a, 2, 3), Mat::row_major(&a, 3, 2), &mut c);
        assert!(e.unwrap_err().to_string().contains("reaches past"));
        let b = vec![0.0; 6];
        let e = sgemm_strided(
            Mat::row_major(&b, 2, 3),
            Mat::row_major(&b, 3, 2),
            &mut c,
            1,
            1,
        );
        assert!(e.unwrap_err().to_string().contains("alias"));
        // Rows of 3 elements 2 apart overlap (element (0, 2) is element (1, 0)).
        let a = vec![0.0; 6];
        let b = vec![0.0; 9];
        let mut c = vec![0.0; 8];
        let e = sgemm_strided(
            Mat::row_major(&a, 2, 3),
            Mat::row_major(&b, 3, 3),
            &mut c,
            2,
            1,
        );
        assert!(e.unwrap_err().to_string().contains("alias"));
        // Padded rows (stride 4 for 3 columns) and column-major output are fine.
        for (rsc, csc) in [(4, 1), (1, 2)] {
            sgemm_strided(
                Mat::row_major(&a, 2, 3),
                Mat::row_major(&b, 3, 3),
                &mut c,
                rsc,
                csc,
            )
            .unwrap();
        }
    }

    #[test]
    fn column_tiles_give_the_product_for_any_tile_width() {
        let (m, k, n) = (6, 9, 23);
        let a: Vec<f32> = (0..m * k).map(|v| (v % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..k * n).map(|v| (v % 5) as f32 * 0.25).collect();
        // Integers and quarters: exact in f32 whatever the order of the sums.
        let want: Vec<f32> = naive(&a, &b, m, k, n)
            .chunks(n)
            .enumerate()
            .flat_map(|(r, row)| row.iter().map(move |v| (v + r as f32).max(0.0)))
            .collect();
        let epilogue =
            |r: usize, part: &mut [f32]| bias_act_row(part, Some(r as f32), Activation::Relu);
        for tiles in [1, 2, 3, 5, 23, 100] {
            let mut c = vec![f32::NAN; m * n];
            let view = TilesOfB::<fn(Range<usize>, &mut [f32])>::View(Mat::row_major(&b, k, n));
            sgemm_column_tiles(Mat::row_major(&a, m, k), n, &mut c, tiles, view, epilogue).unwrap();
            assert_eq!(c, want, "view, {tiles} tiles");
            let mut c = vec![f32::NAN; m * n];
            let fill = |cols: Range<usize>, block: &mut [f32]| {
                for (p, row) in block.chunks_mut(cols.len()).enumerate() {
                    row.copy_from_slice(&b[p * n + cols.start..p * n + cols.end]);
                }
            };
            sgemm_column_tiles(
                Mat::row_major(&a, m, k),
                n,
                &mut c,
                tiles,
                TilesOfB::Fill(fill),
                epilogue,
            )
            .unwrap();
            assert_eq!(c, want, "fill, {tiles} tiles");
        }
        let mut short = vec![0.0; m * n - 1];
        let view = TilesOfB::<fn(Range<usize>, &mut [f32])>::View(Mat::row_major(&b, k, n));
        let e = sgemm_column_tiles(Mat::row_major(&a, m, k), n, &mut short, 4, view, epilogue);
        assert!(e.unwrap_err().to_string().contains("shorter"));
    }

    #[test]
    fn scratch_is_reused_and_a_nested_user_gets_its_own() {
        with_scratch(4, |outer| {
            outer.fill(1.0);
            with_scratch(3, |inner| {
                inner.fill(2.0);
                assert_eq!(inner.len(), 3);
            });
            assert_eq!(outer, &[1.0; 4]);
        });
        // The same thread's buffer, longer now, keeps what was written.
        with_scratch(2, |again| assert_eq!(again, &[1.0, 1.0]));
    }

    #[test]
    fn bias_act_per_channel() {
        let mut y = vec![-1.0, 1.0, -1.0, 1.0];
        apply_bias_act(&mut y, Some(&[0.5, 2.0]), 2, 2, Activation::Relu);
        assert_eq!(y, vec![0.0, 1.5, 1.0, 3.0]);
    }

    /// Every shape of bias (none, per row of `inner`, per element of a run) and size (one
    /// chunk, several, in parallel) against the formula element by element.
    #[test]
    fn bias_act_in_chunks_equals_the_formula() {
        for (len, channels, inner) in [
            (12, 3, 2),
            (70_000, 7, 1),
            (70_000, 5, 3),
            (1 << 17, 64, 49),
            (40_000, 1, 1),
        ] {
            let x: Vec<f32> = (0..len).map(|i| ((i * 37 % 101) as f32) - 50.0).collect();
            let b: Vec<f32> = (0..channels).map(|c| c as f32 * 0.25 - 1.0).collect();
            for bias in [None, Some(b.as_slice())] {
                let mut y = x.clone();
                apply_bias_act(&mut y, bias, channels, inner, Activation::Relu);
                for (i, (&got, &v)) in y.iter().zip(&x).enumerate() {
                    let want = (v + bias.map_or(0.0, |b| b[(i / inner) % channels])).max(0.0);
                    assert_eq!(got, want, "{len} {channels} {inner} at {i}");
                }
            }
        }
    }
}
