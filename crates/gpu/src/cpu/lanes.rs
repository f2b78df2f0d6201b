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
//! Every output element adds its taps in the window's row-major order, as the reference and
//! the window loops do, then its bias; the activation last.

use opsched_graph::Activation;

use super::math::{with_act, with_avx2};
use super::window::Windows;

/// Channels a vector holds.
pub const LANES: usize = 8;

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
    let lanes = x.len();
    let [h, w] = win.input;
    let [oh, ow] = win.out;
    let [rows, cols] = win.padded();
    let taps = win.kernel[0] * win.kernel[1];
    let (buf, wt) = scratch.split_at_mut(rows * cols * LANES);
    let wt = &mut wt[..taps * LANES];
    // The padded planes, interleaved (pixel (r, c) of lane l at (r * cols + c) * LANES + l),
    // and the taps alike; lanes beyond the group's stay zero.
    buf.fill(0.0);
    wt.fill(0.0);
    // (In AVX2 and FMA where the CPU has them, as every activation's polynomial expects.)
    with_avx2(
        #[inline(always)]
        || {
            with_act!(pre_act, |f| for (l, plane) in x.iter().enumerate() {
                for (r, row) in plane.chunks(w).take(h).enumerate() {
                    let at = (r + win.padding[0]) * cols + win.padding[1];
                    for (c, &v) in row.iter().enumerate() {
                        buf[(at + c) * LANES + l] = f(v + in_bias[l]);
                    }
                }
                for (t, &v) in filters[l].iter().take(taps).enumerate() {
                    wt[t * LANES + l] = v;
                }
            })
        },
    );
    let (buf, wt) = (&*buf, &*wt);
    with_avx2(
        #[inline(always)]
        || {
            for i in 0..oh {
                for j in 0..ow {
                    let mut acc = [0.0f32; LANES];
                    for a in 0..win.kernel[0] {
                        let r = i * win.stride[0] + a * win.dilation[0];
                        for b in 0..win.kernel[1] {
                            let c = j * win.stride[1] + b * win.dilation[1];
                            let px = &buf[(r * cols + c) * LANES..][..LANES];
                            let tw = &wt[(a * win.kernel[1] + b) * LANES..][..LANES];
                            for ((s, &v), &t) in acc.iter_mut().zip(px).zip(tw) {
                                *s += t * v;
                            }
                        }
                    }
                    for (plane, &sum) in y.chunks_mut(oh * ow).zip(&acc).take(lanes) {
                        plane[i * ow + j] = sum;
                    }
                }
            }
        },
    );
    for (plane, &b) in y.chunks_mut(oh * ow).zip(bias).take(lanes) {
        super::math::bias_act_row(plane, Some(b), act);
    }
}

/// Elements of the scratch [`depthwise`] needs for `win`.
pub fn scratch_len(win: &Windows) -> usize {
    let [rows, cols] = win.padded();
    (rows * cols + win.kernel[0] * win.kernel[1]) * LANES
}

/// Whether [`depthwise`] is the faster way to convolve `win`'s planes (measured: see the
/// module's docs): strided, with output rows shorter than a vector.
pub fn suits(win: &Windows) -> bool {
    win.stride[1] > 1 && win.out[1] < LANES
}
