//! Depthwise convolutions of one padded plane at stride one (MobileNet's, EfficientNet's and
//! MNASNet's 3x3 and 5x5 layers, ConvNeXt's 7x7) in AVX2 registers: blocks of four output rows
//! by eight columns, each row's eight sums in one vector across all the taps, by fused
//! multiply-adds; the bias and activation then in one pass over the plane, still in cache. A
//! 3x3 window keeps its nine weights in registers and loads each input vector once for the up
//! to three output rows whose windows cover it: 18 loads for a block's 36 products, where the
//! window loops (`super::window`) load one per product and keep a separate multiply and add.
//! Other windows load per product, their weights broadcast per tap. The last block of a
//! plane's rows or columns overlaps the one before (the same sums, written twice), so that
//! every block is whole; rows narrower than a vector (7x7 planes) compute theirs with the
//! columns after them, which read into the padded plane's next row and are not stored.
//!
//! Measured on one thread (2026-11-28): the kernel alone, a standalone copy of both loops on one
//! plane in cache, cycles per product at 3.6 GHz: 3x3 on 56x56 0.174 by the window loops,
//! 0.076 here; 3x3 on 14x14 0.54 and 0.12; 5x5 on 28x28 0.24 and 0.16; 7x7 on 56x56 0.17 and
//! 0.14. A layer's planes through `Windows::convolve` (with the bias pass; their outputs out of
//! cache, the least of 300 runs, in us): MobileNetV2's 144 planes of 56x56 by 3x3 209 -> 159,
//! EfficientNet's 480 of 14x14 by 3x3 87 -> 78, 240 of 28x28 by 5x5 274 -> 217, 1152 of 7x7
//! by 5x5 199 -> 156, ConvNeXt's 96 of 56x56 by 7x7 582 -> 523. A layer's planes come in
//! groups ([`sums`]: padded side by side, one call for their sums, bias and activation over the
//! group), where a call per plane cost as much as a 7x7 plane's sums: whole layers on one
//! thread, two builds alternated six times, the medians of the least of 300 runs (ms):
//! MobileNetV3's 960 planes of 7x7 by 5x5 0.288 -> 0.225, EfficientNet's 1152 0.273 -> 0.237,
//! 672 of 14x14 by 3x3 0.226 -> 0.211, 144 of 56x56 0.353 -> 0.318. Each output adds its taps
//! in the window's row-major order, as the reference does, rounding once per tap (fused) where
//! the window loops round twice.

#![allow(unsafe_code)]

use opsched_graph::Activation;

use super::math::bias_act_row;
use super::window::{block_starts, Windows};

/// Output rows of a block.
const ROWS: usize = 4;
/// Output columns of a block: one AVX2 vector.
const COLS: usize = 8;

/// Whether [`convolve`] runs `win`'s windows: stride and dilation 1, output planes of at least
/// four rows of at least half a vector, on a CPU with AVX2 and FMA. Rows shorter than a
/// vector (7x7 planes) fill theirs with sums of the columns after them, which read the padded
/// plane's next row and are not stored.
pub fn suits(win: &Windows) -> bool {
    let [oh, ow] = win.out;
    let shape = win.stride == [1, 1] && win.dilation == [1, 1] && oh >= ROWS && 2 * ow >= COLS;
    shape && available()
}

/// Whether this CPU runs the kernels (AVX2 and FMA).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return pulp::x86::V3::try_new().is_some();
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// `y = act(w * buf + bias)` for one filter `w` (`kernel` taps, row-major) over the padded
/// plane `buf` ([`Windows::pad`] with zeros; rows `win.padded()[1]` apart, and where they are
/// narrower than a vector what its last one reads after the last row: [`Windows::scratch_len`]
/// holds a row more, enough for rows of half a vector), `y` the output plane (`out`,
/// row-major). Returns `false`, touching nothing, where [`suits`] does not hold or a slice is
/// shorter than its shape.
pub fn convolve(
    win: &Windows,
    buf: &[f32],
    w: &[f32],
    bias: f32,
    a: Activation,
    y: &mut [f32],
) -> bool {
    let [oh, ow] = win.out;
    let done = y.len() >= oh * ow && sums(win, buf, buf.len(), w, &mut y[..oh * ow]);
    if done {
        // Bias and activation over the plane just written (in cache), once for the rows
        // two blocks overlap.
        bias_act_row(&mut y[..oh * ow], Some(bias), a);
    }
    done
}

/// The sums alone (no bias, no activation) of [`convolve`] for every plane of `y` (`out` each,
/// one after another): plane `p` of `bufs` padded at `p * stride` (each as [`convolve`]'s
/// `buf`), its filter `kernel` taps of `w` from `p * taps` on. One call for a layer's many
/// small planes (hundreds of 7x7 ones), where a call per plane cost as much as its sums.
/// Returns `false`, touching nothing, where [`suits`] does not hold or a slice is shorter than
/// its shape.
pub fn sums(win: &Windows, bufs: &[f32], stride: usize, w: &[f32], y: &mut [f32]) -> bool {
    let [oh, ow] = win.out;
    let (taps, len) = (win.kernel[0] * win.kernel[1], oh * ow);
    let planes = y.len().checked_div(len).unwrap_or(0);
    let reach = reach_of(win);
    let last = planes
        .saturating_sub(1)
        .checked_mul(stride)
        .and_then(|at| at.checked_add(reach));
    let fits = planes > 0
        && y.len() == planes * len
        && last.is_some_and(|end| end <= bufs.len())
        && w.len() >= planes * taps;
    if !suits(win) || !fits {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V3::try_new() {
        simd.vectorize(
            #[inline(always)]
            || {
                for (p, plane) in y.chunks_mut(len).enumerate() {
                    let buf = &bufs[p * stride..];
                    let w = &w[p * taps..(p + 1) * taps];
                    for i in block_starts(oh, ROWS) {
                        band(simd, win, buf, w, i, plane);
                    }
                }
            },
        );
        return true;
    }
    false
}

/// Elements of a padded plane the blocks read: up to the last row's last vector's furthest
/// tap.
fn reach_of(win: &Windows) -> usize {
    let [rows, pitch] = win.padded();
    (rows - 1) * pitch + COLS.max(win.out[1]) + win.kernel[1] - 1
}

/// The sums of output rows `i .. i + ROWS` of [`convolve`]'s plane (whose checks passed) into
/// `y`: block after block along the rows, a whole vector stored where the rows are as wide,
/// the row's columns of it elsewhere.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn band(simd: pulp::x86::V3, win: &Windows, buf: &[f32], w: &[f32], i: usize, y: &mut [f32]) {
    let pitch = win.padded()[1];
    let ow = win.out[1];
    let [kh, kw] = win.kernel;
    let three = kh == 3 && kw == 3;
    let nine: [pulp::f32x8; 9] = match three {
        true => std::array::from_fn(|t| simd.splat_f32x8(w[t])),
        false => [simd.splat_f32x8(0.0); 9],
    };
    for j in block_starts(ow, COLS) {
        // The block reads rows i .. i + ROWS + kh - 1 and columns j .. j + COLS + kw - 1 of
        // the padded plane: inside it (`padded` holds every window's reach), but for the
        // columns of a row narrower than a vector, which run into the next row and, on the
        // last, into the vector after the plane.
        let corner = &buf[i * pitch + j..];
        let furthest = (ROWS + kh - 2) * pitch + COLS + kw - 2;
        assert!(furthest < corner.len(), "a block reads past its plane");
        let sums = if three {
            block3x3(simd, corner, pitch, &nine)
        } else {
            block(simd, corner, pitch, [kh, kw], w)
        };
        for (r, s) in sums.into_iter().enumerate() {
            let row = &mut y[(i + r) * ow + j..];
            if ow >= COLS {
                // SAFETY: the row holds COLS elements from j on (j + COLS <= ow).
                unsafe { row.as_mut_ptr().cast::<pulp::f32x8>().write_unaligned(s) };
            } else {
                let s: [f32; COLS] = pulp::cast(s);
                row[..ow].copy_from_slice(&s[..ow]);
            }
        }
    }
}

/// The sums of a block of 3x3 windows whose top-left tap is `corner[0]` (input rows `pitch`
/// apart; the caller checked the reach): input row `r` of the block serves output rows `r - a`
/// for the window rows `a` that fall in the block.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn block3x3(
    simd: pulp::x86::V3,
    corner: &[f32],
    pitch: usize,
    w: &[pulp::f32x8; 9],
) -> [pulp::f32x8; ROWS] {
    let mut acc = [simd.splat_f32x8(0.0); ROWS];
    let at = corner.as_ptr();
    for r in 0..ROWS + 2 {
        for b in 0..3 {
            // SAFETY: r * pitch + b + 7 is at most the furthest element the caller checked.
            let x: pulp::f32x8 =
                unsafe { at.add(r * pitch + b).cast::<pulp::f32x8>().read_unaligned() };
            // Window rows in order: the output row of the lowest `a` first, each output row's
            // taps then in row-major order across the loop over `r`.
            for a in 0..3 {
                if r >= a && r - a < ROWS {
                    acc[r - a] = simd.mul_add_f32x8(w[a * 3 + b], x, acc[r - a]);
                }
            }
        }
    }
    acc
}

/// The sums of a block of `kernel` windows (any size; `w` row-major) whose top-left tap is
/// `corner[0]`, each output row's taps in row-major order (the caller checked the reach).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn block(
    simd: pulp::x86::V3,
    corner: &[f32],
    pitch: usize,
    [kh, kw]: [usize; 2],
    w: &[f32],
) -> [pulp::f32x8; ROWS] {
    let mut acc = [simd.splat_f32x8(0.0); ROWS];
    let at = corner.as_ptr();
    for a in 0..kh {
        for b in 0..kw {
            let wt = simd.splat_f32x8(w[a * kw + b]);
            for (r, s) in acc.iter_mut().enumerate() {
                // SAFETY: (r + a) * pitch + b + 7 is at most the furthest element the caller
                // checked (r < ROWS, a < kh, b < kw).
                let x: pulp::f32x8 = unsafe {
                    at.add((r + a) * pitch + b)
                        .cast::<pulp::f32x8>()
                        .read_unaligned()
                };
                *s = simd.mul_add_f32x8(wt, x, *s);
            }
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::cpu::window::pad_input;
    use crate::cpu::window::tests::values;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any window size (3x3 and the others), padding before and after, planes in and out
        /// of whole blocks, and a fused activation: the reference's depthwise convolution of
        /// the plane, within rounding.
        #[test]
        fn stride_one_planes_match_the_reference(
            h in 1usize..30, w in 1usize..40, kh in 1usize..8, kw in 1usize..8,
            ph in 0usize..4, pw in 0usize..4, eh in 0usize..4, ew in 0usize..4,
            swish in proptest::bool::ANY,
        ) {
            let geometry = [[h, w], [kh, kw], [1, 1], [1, 1], [ph, pw], [eh, ew]];
            let Some(win) = Windows::fitting(geometry) else {
                return Ok(());
            };
            prop_assume!(suits(&win));
            let [oh, ow] = win.out;
            let (x, wt) = (values(h * w, 1), values(kh * kw, 2));
            let mut buf = vec![f32::NAN; win.scratch_len()];
            pad_input(&win, &x, None, Activation::None, &mut buf);
            let a = if swish { Activation::Swish { alpha: 1.0 } } else { Activation::Relu };
            let mut y = vec![f32::NAN; oh * ow];
            prop_assert!(convolve(&win, &buf, &wt, 0.25, a, &mut y));
            let want = crate::reference::conv2d(
                &x, &wt, Some(&[0.25]), [1, 1, h, w], 1, [kh, kw], [1, 1], [ph, pw],
                [1, 1], 1, [oh, ow], a,
            );
            for (i, (&got, &want)) in y.iter().zip(&want).enumerate() {
                let tol = 1e-5 * (kh * kw) as f32 * want.abs().max(1.0);
                prop_assert!((got - want).abs() <= tol, "element {}: {} vs {}", i, got, want);
            }
        }
    }

    /// Planes it does not suit (a stride, a dilation, fewer rows than a block) and slices
    /// shorter than their shape are left to the caller, untouched.
    #[test]
    fn what_it_does_not_suit_is_refused() {
        let base = Windows {
            input: [10, 10],
            kernel: [3, 3],
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            out: [10, 10],
        };
        if !suits(&base) {
            // No AVX2 here: nothing runs at all.
            return;
        }
        let mut buf = vec![f32::NAN; base.scratch_len()];
        pad_input(&base, &[0.5; 100], None, Activation::None, &mut buf);
        let mut y = vec![f32::NAN; 100];
        let refused = [
            Windows {
                stride: [2, 1],
                out: [5, 10],
                ..base
            },
            Windows {
                dilation: [1, 2],
                padding: [1, 2],
                ..base
            },
            Windows {
                input: [3, 10],
                out: [3, 10],
                ..base
            },
        ];
        let none = Activation::None;
        for win in refused {
            assert!(!suits(&win), "{win:?}");
            assert!(!convolve(&win, &buf, &[1.0; 9], 0.0, none, &mut y));
        }
        let short = &buf[..reach_of(&base) - 1];
        assert!(!convolve(&base, short, &[1.0; 9], 0.0, none, &mut y));
        assert!(!convolve(&base, &buf, &[1.0; 8], 0.0, none, &mut y));
        assert!(!convolve(&base, &buf, &[1.0; 9], 0.0, none, &mut y[1..]));
        // Many planes: a partial plane, too few filters, planes padded short are refused.
        let pl = base.scratch_len();
        let bufs = [&buf[..], &buf[..]].concat();
        let mut two = vec![f32::NAN; 200];
        assert!(!sums(&base, &bufs, pl, &[1.0; 18], &mut two[..199]));
        assert!(!sums(&base, &bufs, pl, &[1.0; 17], &mut two));
        let end = pl + reach_of(&base);
        assert!(!sums(&base, &bufs[..end - 1], pl, &[1.0; 18], &mut two));
        assert!(y.iter().chain(&two).all(|v| v.is_nan()));
        assert!(convolve(&base, &buf, &[1.0; 9], 0.0, none, &mut y));
        // The padded plane's zeros count: a corner reads 4 of 0.5, the middle 9.
        assert_eq!((y[0], y[55]), (2.0, 4.5));
        // Each plane's sums, no bias: the second plane's alike.
        assert!(sums(&base, &bufs[..end], pl, &[1.0; 18], &mut two));
        assert_eq!((two[100], two[155]), (2.0, 4.5));
    }
}
