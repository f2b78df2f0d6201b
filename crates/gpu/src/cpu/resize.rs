//! A resize's output rows (`crate::step::resize` on the CPU), sixteen columns at a time where
//! the CPU has AVX-512. An output element blends up to four input elements of two input rows
//! with weights that depend on its row and column ([`Tap::blend`]): gathered one by one, the
//! elements cost more than the arithmetic (DeepLabV3's 21 planes upsampled from 14x14 to
//! 224x224 took 1.15 ms on one thread, onnxruntime's 0.46 for 32). A block of sixteen
//! columns whose taps all lie within sixteen input columns (an upsampling's, and a
//! downsampling's by less than about two) instead loads those input columns of each of the two
//! rows once and takes each element from them by one permutation; the same products and sums
//! in the same order as [`Tap::blend`], so the same bits (a row's last, partial block stored
//! masked). Blocks whose taps spread wider blend element by element, as every block does on a
//! CPU without AVX-512.
#![allow(unsafe_code)]

use opsched_graph::resize::Tap;
use opsched_graph::ResizeMode;

/// Output columns of a block: one AVX-512 vector.
const BLOCK: usize = 16;

/// The column taps of a resize, laid out for blending whole rows ([`Columns::row`]).
#[derive(Clone, Debug)]
pub struct Columns {
    taps: Vec<Tap>,
    /// Elements of an input row.
    width: usize,
    /// Per block of [`BLOCK`] columns (the last one partial where the row has a partial one),
    /// the first input column its taps read where all of them lie within [`BLOCK`] columns
    /// of it (else `None`).
    bases: Vec<Option<usize>>,
    /// Per column, its taps' input columns relative to its block's base (0 where the block
    /// has none), and its weights; zero past the last column, to a whole block.
    lo: Vec<i32>,
    hi: Vec<i32>,
    w_lo: Vec<f32>,
    w_hi: Vec<f32>,
    /// AVX-512, where the CPU has it (found once, not per row).
    #[cfg(target_arch = "x86_64")]
    simd: Option<pulp::x86::V4>,
}

impl Columns {
    /// The taps of every output column of a row (`taps`, each input column below `width`).
    pub fn new(taps: Vec<Tap>, width: usize) -> Columns {
        let whole = taps.len().next_multiple_of(BLOCK);
        let mut bases = Vec::with_capacity(whole / BLOCK);
        let (mut lo, mut hi) = (vec![0; whole], vec![0; whole]);
        for (b, block) in taps.chunks(BLOCK).enumerate() {
            let base = block.iter().map(|t| t.lo.min(t.hi)).min().unwrap_or(0);
            let top = block.iter().map(|t| t.lo.max(t.hi)).max().unwrap_or(0);
            let fits = top - base < BLOCK && top < width;
            bases.push(fits.then_some(base));
            if fits {
                for (j, t) in block.iter().enumerate() {
                    // (Below BLOCK: they fit.)
                    lo[b * BLOCK + j] = (t.lo - base) as i32;
                    hi[b * BLOCK + j] = (t.hi - base) as i32;
                }
            }
        }
        let weights = |w: fn(&Tap) -> f32| {
            let mut v: Vec<f32> = taps.iter().map(w).collect();
            v.resize(whole, 0.0);
            v
        };
        Columns {
            w_lo: weights(|t| t.w_lo),
            w_hi: weights(|t| t.w_hi),
            taps,
            width,
            bases,
            lo,
            hi,
            #[cfg(target_arch = "x86_64")]
            simd: pulp::x86::V4::try_new(),
        }
    }

    /// `y[j] = Tap::blend(mode, row, column j, ...)` for every output column `j` of one row
    /// (`y` as long as the taps), from the input rows `lo` and `hi` of `row`'s taps (the
    /// input's width each).
    pub fn row(&self, mode: ResizeMode, row: &Tap, lo: &[f32], hi: &[f32], y: &mut [f32]) {
        let (lo, hi) = (&lo[..self.width], &hi[..self.width]);
        let y = &mut y[..self.taps.len()];
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = self.simd.filter(|_| !self.bases.is_empty()) {
            // SAFETY: the CPU has AVX-512.
            done = unsafe { self.blocks(simd, mode, row, lo, hi, y) };
        }
        self.blend(mode, row, lo, hi, y, done..self.taps.len());
    }

    /// [`Tap::blend`] of `columns`, one by one.
    fn blend(
        &self,
        mode: ResizeMode,
        row: &Tap,
        lo: &[f32],
        hi: &[f32],
        y: &mut [f32],
        columns: std::ops::Range<usize>,
    ) {
        let taps = self.taps[columns.clone()].iter();
        for (t, v) in taps.zip(&mut y[columns]) {
            *v = Tap::blend(mode, row, t, [lo[t.lo], lo[t.hi], hi[t.lo], hi[t.hi]]);
        }
    }

    /// [`Columns::row`]'s blocks: those with a base by permutations of the sixteen input
    /// columns from it (the last, partial one stored masked), the others one by one. Returns
    /// the columns done (all).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512cd,avx512dq,avx512vl")]
    fn blocks(
        &self,
        simd: pulp::x86::V4,
        mode: ResizeMode,
        row: &Tap,
        lo: &[f32],
        hi: &[f32],
        y: &mut [f32],
    ) -> usize {
        use std::arch::x86_64::{__m512, __m512i};
        let f = simd.avx512f;
        let (row_lo, row_hi) = (f._mm512_set1_ps(row.w_lo), f._mm512_set1_ps(row.w_hi));
        let columns = self.taps.len();
        for (b, base) in self.bases.iter().enumerate() {
            let at = b * BLOCK;
            let width = (columns - at).min(BLOCK);
            let Some(base) = *base else {
                self.blend(mode, row, lo, hi, y, at..at + width);
                continue;
            };
            let n = (self.width - base).min(BLOCK);
            let mask = ((1u32 << n) - 1) as u16;
            // SAFETY: the mask's lanes are input columns base .. base + n, inside the rows;
            // the columns' tables hold a block from `at` on.
            let (xs_lo, xs_hi, idx_lo, idx_hi) = unsafe {
                (
                    f._mm512_maskz_loadu_ps(mask, lo.as_ptr().add(base)),
                    f._mm512_maskz_loadu_ps(mask, hi.as_ptr().add(base)),
                    f._mm512_loadu_si512(self.lo.as_ptr().add(at).cast::<__m512i>()),
                    f._mm512_loadu_si512(self.hi.as_ptr().add(at).cast::<__m512i>()),
                )
            };
            let x0 = f._mm512_permutexvar_ps(idx_lo, xs_lo);
            let out: __m512 = match mode {
                ResizeMode::Nearest => x0,
                ResizeMode::Linear => {
                    let x1 = f._mm512_permutexvar_ps(idx_hi, xs_lo);
                    let x2 = f._mm512_permutexvar_ps(idx_lo, xs_hi);
                    let x3 = f._mm512_permutexvar_ps(idx_hi, xs_hi);
                    // SAFETY: the weights hold a block from `at` on.
                    let (col_lo, col_hi) = unsafe {
                        (
                            f._mm512_loadu_ps(self.w_lo.as_ptr().add(at)),
                            f._mm512_loadu_ps(self.w_hi.as_ptr().add(at)),
                        )
                    };
                    // As `Tap::blend`: each product of weights first, then the four
                    // products added in order (no fused multiply-adds).
                    let term =
                        |a: __m512, b: __m512, x: __m512| f._mm512_mul_ps(f._mm512_mul_ps(a, b), x);
                    let sum = f._mm512_add_ps(term(row_lo, col_lo, x0), term(row_lo, col_hi, x1));
                    let sum = f._mm512_add_ps(sum, term(row_hi, col_lo, x2));
                    f._mm512_add_ps(sum, term(row_hi, col_hi, x3))
                }
            };
            let to = y.as_mut_ptr().wrapping_add(at);
            if width == BLOCK {
                // SAFETY: `y` holds a block from `at` on.
                unsafe { f._mm512_storeu_ps(to, out) };
            } else {
                // (Only here: a masked store measured twice as slow on Zen 5.)
                let lanes = ((1u32 << width) - 1) as u16;
                // SAFETY: `y` holds `width` columns from `at` on; the others are not written.
                unsafe { f._mm512_mask_storeu_ps(to, lanes, out) };
            }
        }
        columns
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use opsched_graph::{Resize, ResizeCoord};

    /// Rows of upsamplings (where every block is permuted), downsamplings by less and more
    /// than two (blocks permuted and blended one by one), nearest and bilinear, widths in and
    /// out of whole blocks (the last partial block stored masked: the elements after the row
    /// untouched), from one input column too, with infinities and NaN among the inputs: every
    /// element the bits of `Tap::blend`.
    #[test]
    fn rows_blend_as_the_taps_do() {
        let mut permuted = 0;
        for (w, ow) in [
            (14, 224),
            (7, 40),
            (33, 64),
            (64, 40),
            (100, 17),
            (40, 16),
            (3, 5),
            (1, 14),
        ] {
            for linear in [true, false] {
                let resize = match linear {
                    true => Resize::linear([1, ow], ResizeCoord::HalfPixel),
                    false => Resize::nearest(
                        [1, ow],
                        ResizeCoord::Asymmetric,
                        opsched_graph::NearestMode::Floor,
                    ),
                };
                let mode = resize.mode;
                let cols = Columns::new(resize.taps(1, w), w);
                permuted += cols.bases.iter().flatten().count();
                let x = |seed: usize| -> Vec<f32> {
                    (0..w)
                        .map(|i| match (i * 7 + seed) % 23 {
                            0 => f32::INFINITY,
                            1 => f32::NAN,
                            v => v as f32 * 0.37 - 3.0,
                        })
                        .collect()
                };
                let (lo, hi) = (x(1), x(5));
                let row = Tap {
                    lo: 0,
                    hi: 1,
                    w_lo: 0.3,
                    w_hi: 0.7,
                };
                let mut y = vec![f32::NAN; ow + 5];
                cols.row(mode, &row, &lo, &hi, &mut y);
                assert!(
                    y[ow..].iter().all(|v| v.is_nan()),
                    "{w} -> {ow}: wrote past the row"
                );
                for (j, (t, got)) in cols.taps.iter().zip(&y).enumerate() {
                    let want = Tap::blend(mode, &row, t, [lo[t.lo], lo[t.hi], hi[t.lo], hi[t.hi]]);
                    assert_eq!(got.to_bits(), want.to_bits(), "{w} -> {ow} column {j}");
                }
            }
        }
        assert!(permuted >= 30, "{permuted} blocks permuted");
    }
}
