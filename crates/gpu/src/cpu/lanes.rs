//! Depthwise convolutions of small strided planes, [`LANES`] channels at once: their planes
//! interleaved (channel fastest, NCHWc's layout) and padded into scratch, so that one vector
//! holds a pixel of every channel and each tap of each output pixel is one vector product,
//! compiled for AVX2 where the CPU has it. The window loops (`super::window`) vectorise along
//! an output row and split each padded row by the stride's phase first: on a 14x14 plane at
//! stride 2 (MobileNet's and EfficientNet's last stages: hundreds of them), rows of 7 outputs,
//! the split costs more than the arithmetic. criterion `cpu_small_depthwise`, eight planes,
//! one thread (2026-11-28): 5x5/2 on 14x14 6.9 us by the window loops, 2.5 us here; 3x3/2 on
//! 14x14 3.3 and 1.9 us; but 3x3/2 on 28x28 4.9 and 6.0 us, 5x5/1 on 14x14 3.4 and 7.1 us,
//! hence [`suits`].
//!
//! The planes go in and out eight pixels at a time through 8 x 8 transposes (AVX's unpacks and
//! shuffles), and a row's outputs are summed eight at a time, each in its own vector (one at a
//! time, each tap waited on the last one's addition): on 7x7 outputs, one thread, in a run of
//! each model (`run --op-times`), EfficientNet-B0's 5x5/2 0.31 -> 0.27 ms, MobileNetV2's 3x3/2
//! 0.16 -> 0.13 ms. At stride one the window loops stay faster (they reuse each input vector
//! for three output rows): this kernel took MobileNetV2's 14x14 layers 0.68 -> 1.27 ms and
//! EfficientNet-B0's 7x7 ones 0.89 -> 1.38.
//!
//! Every output element adds its taps in the window's row-major order by fused multiply-adds,
//! as the window loops do at stride one, then its bias; the activation last.
//!
//! A convolution whose input is taken as it is runs `super::depthwise::unpadded` instead
//! (straight from the planes, no transposes): a model of that one layer on one thread, the
//! median over six processes of each one's fastest of 300 runs, MobileNetV2's 576 planes of
//! 14x14 by 3x3/2 0.139 -> 0.070 ms, EfficientNet-B0's 672 by 5x5/2 0.175 -> 0.154 ms. This
//! kernel keeps those whose input takes a bias or an activation first.
#![allow(unsafe_code)]

use opsched_graph::Activation;

use super::math::{transpose8, with_act, with_avx2};
use super::window::Windows;

/// Channels a vector holds.
pub const LANES: usize = 8;
/// Output pixels of a row summed at once.
const PIXELS: usize = 8;

/// One group of up to [`LANES`] channels' planes of a depthwise convolution (one filter per
/// channel): `x[l]` is channel `l`'s input plane (`win.input`), `filters[l]` its taps
/// (row-major), `bias[l]` its bias (0 where `None`), `in_bias[l]` added to every input element
/// it reads before `pre_act` (the padding stays zero); `y` holds the group's output planes one
/// after another (`win.out` each). `scratch` is [`scratch_len`] long.
#[allow(clippy::too_many_arguments)]
pub fn depthwise(
    win: &Windows,
    x: &[&[f32]],
    filters: &[&[f32]],
    bias: &[f32],
    in_bias: &[f32],
    pre_act: Activation,
    act: Activation,
    scratch: &mut [f32],
    y: &mut [f32],
) {
    let lanes = x.len().min(LANES);
    let [h, w] = win.input;
    let [oh, ow] = win.out;
    let [rows, cols] = win.padded();
    let taps = win.kernel[0] * win.kernel[1];
    let (buf, rest) = scratch.split_at_mut(rows * cols * LANES);
    let (wt, out) = rest.split_at_mut(taps * LANES);
    let out = &mut out[..oh * ow * LANES];
    // The taps interleaved (tap t of lane l at t * LANES + l), lanes beyond the group's zero.
    wt.fill(0.0);
    for (l, f) in filters.iter().enumerate().take(lanes) {
        for (t, &v) in f.iter().take(taps).enumerate() {
            wt[t * LANES + l] = v;
        }
    }
    // Up to eight values as a lane vector, the missing ones zero.
    let lane = |v: &[f32]| match v.get(..LANES) {
        Some(whole) => <[f32; LANES]>::try_from(whole).expect("eight values"),
        None => std::array::from_fn(|l| v.get(l).copied().unwrap_or(0.0)),
    };
    let (bias, in_bias) = (lane(bias), lane(in_bias));
    let [sr, sc] = win.stride;
    let [dr, dc] = win.dilation;
    // (In AVX2 and FMA where the CPU has them, as every activation's polynomial expects.)
    with_avx2(
        #[inline(always)]
        || {
            // The padded planes, interleaved (pixel (r, c) of lane l at (r * cols + c) *
            // LANES + l): eight pixels of every plane at a time, transposed; the padding zero.
            buf.fill(0.0);
            with_act!(pre_act, |f| {
                let (mut r, mut c) = (0, 0);
                for p0 in (0..h * w).step_by(LANES) {
                    let end = (p0 + LANES).min(h * w);
                    let mut rows_in = [[0.0f32; LANES]; LANES];
                    for (row, plane) in rows_in.iter_mut().zip(x) {
                        *row = lane(&plane[p0..end]);
                    }
                    for px in transpose8(rows_in).iter().take(end - p0) {
                        let at = ((r + win.padding[0]) * cols + c + win.padding[1]) * LANES;
                        let dst: &mut [f32; LANES] =
                            (&mut buf[at..at + LANES]).try_into().expect("a pixel");
                        for ((d, &v), &b) in dst.iter_mut().zip(px).zip(&in_bias) {
                            *d = f(v + b);
                        }
                        (r, c) = if c + 1 == w { (r + 1, 0) } else { (r, c + 1) };
                    }
                }
            });
            let (buf, wt) = (&*buf, &*wt);
            // [`PIXELS`] outputs of a row at once, each its own vector of sums (one sum at a
            // time waited on its last addition at every tap); a last partial block repeats
            // its last pixel (computed, not stored). Then the bias and the activation.
            with_act!(act, |f| for i in 0..oh {
                let row0 = i * sr * cols * LANES;
                for j0 in (0..ow).step_by(PIXELS) {
                    let at: [usize; PIXELS] =
                        std::array::from_fn(|p| (j0 + p).min(ow - 1) * sc * LANES);
                    let mut acc = [[0.0f32; LANES]; PIXELS];
                    // Every pixel this block reads lies inside the buffer: checked once.
                    let last = row0
                        + ((win.kernel[0] - 1) * dr * cols + (win.kernel[1] - 1) * dc) * LANES
                        + at[PIXELS - 1];
                    assert!(last + LANES <= buf.len(), "a block reads past its planes");
                    for a in 0..win.kernel[0] {
                        for b in 0..win.kernel[1] {
                            let t = (a * win.kernel[1] + b) * LANES;
                            let tw: &[f32; LANES] = wt[t..t + LANES].try_into().expect("a tap");
                            let base = buf
                                .as_ptr()
                                .wrapping_add(row0 + (a * dr * cols + b * dc) * LANES);
                            for (sums, &o) in acc.iter_mut().zip(&at) {
                                // SAFETY: base + o + LANES <= the checked `last` + LANES.
                                let px = unsafe { &*base.add(o).cast::<[f32; LANES]>() };
                                for ((s, &v), &t) in sums.iter_mut().zip(px).zip(tw) {
                                    *s = t.mul_add(v, *s);
                                }
                            }
                        }
                    }
                    for (p, sums) in acc.iter().enumerate().take(ow - j0) {
                        let at = (i * ow + j0 + p) * LANES;
                        let dst: &mut [f32; LANES] =
                            (&mut out[at..at + LANES]).try_into().expect("a pixel");
                        for ((d, &s), &b) in dst.iter_mut().zip(sums).zip(&bias) {
                            *d = f(s + b);
                        }
                    }
                }
            });
            // Back to the group's planes, eight pixels of each at a time.
            let n = oh * ow;
            for (k, px) in out.chunks(LANES * LANES).enumerate() {
                let mut rows_in = [[0.0f32; LANES]; LANES];
                for (row, v) in rows_in.iter_mut().zip(px.chunks(LANES)) {
                    *row = lane(v);
                }
                let p0 = k * LANES;
                for (plane, v) in y.chunks_mut(n).zip(&transpose8(rows_in)).take(lanes) {
                    match plane.get_mut(p0..p0 + LANES) {
                        Some(dst) => dst.copy_from_slice(v),
                        None => plane[p0..].copy_from_slice(&v[..n - p0]),
                    }
                }
            }
        },
    );
}

/// Elements of the scratch [`depthwise`] needs for `win`.
pub fn scratch_len(win: &Windows) -> usize {
    let [rows, cols] = win.padded();
    (rows * cols + win.kernel[0] * win.kernel[1] + win.out[0] * win.out[1]) * LANES
}

/// Whether [`depthwise`] is the faster way to convolve `win`'s planes (measured: see the
/// module's docs): strided, with output rows shorter than a vector.
pub fn suits(win: &Windows) -> bool {
    win.stride[1] > 1 && win.out[1] < LANES
}
