//! Depthwise convolutions in AVX2 registers (MobileNet's, EfficientNet's and MNASNet's 3x3 and
//! 5x5 layers, ConvNeXt's 7x7): blocks of four output rows by eight columns, each row's eight
//! sums in one vector across all the taps, by fused multiply-adds (straight from the input,
//! on planes of 14 columns or more, sixteen columns in AVX-512 where the CPU has it). A 3x3
//! window keeps its nine weights in registers and loads each input vector once for every
//! output row whose windows cover it: 18 loads for a block's 36 products at stride one, where
//! the window loops (`super::window`) load one per product and keep a separate multiply and
//! add. A 5x5 window at stride two does the same, its weights splat as they are used (each
//! input vector's two loads and shuffle once for up to three rows: EfficientNet-B0's 240
//! planes of 28x28 75 -> 61 us, its 144 of 56x56 0.18 -> 0.16 ms in a run of the model);
//! other windows load per product, their weights splat per tap. The last block of a plane's
//! rows or columns overlaps the one before (the same sums, written twice), so that every block
//! is whole; rows narrower than a vector (7x7 planes) compute theirs with the columns after
//! them.
//!
//! Two ways in. [`unpadded`] (3x3 and 5x5; stride one or two) reads the input planes as
//! they are: a block's loads that reach into the padding are masked (`vmaskmovps`: the lanes
//! outside the row read nothing and are zero), the padding's rows read a row of zeros, at
//! stride two window columns `c` and `c + 1` are the even and odd elements of the same two
//! vectors (a shuffle each: loads per window column took 1.2-1.6x as long, MobileNetV2's 96
//! planes of 112x112 by 3x3 153 -> 123 us, MNASNet's 48 of 56x56 by 5x5 43 -> 28, in runs of
//! the models on one thread), and the bias and ReLU or clip
//! apply to the sums in registers before their one store (other activations in a pass over
//! the planes after, in cache). [`convolve`] and [`sums`] (stride one, any window) read planes
//! padded first ([`Windows::pad`]), as a convolution whose input takes a bias or activation
//! needs. Whole layers on one thread (`cargo bench -p opsched-benches --bench cpu_windows --
//! cpu_depthwise_layers`, 2026-11-28, Zen 4, AVX2, in us): straight from the input against
//! padded in groups of planes, MobileNetV2's 144 planes of 56x56 by 3x3 152 against 262, 384
//! of 14x14 43 against 94, 960 of 7x7 36 against 131; EfficientNet's 240 of 28x28 by 5x5 194
//! against 275, 1152 of 7x7 85 against 208; at stride two against the window loops, 96 of
//! 112x112 by 3x3 233 against 373, 240 of 28x28 by 5x5 126 against 256. A block's column
//! masks are found once per call and read in place: copied per block, each block's first load
//! waited on the copy's stores (384 planes of 14x14 took 76 us). A 5x5 window's weights are
//! splat as they are used (an array of them splat per plane cost more). Each output adds its
//! taps in the window's row-major order, as the reference does, rounding once per tap (fused)
//! where the window loops round twice; at stride one both ways give the same bits.
//!
//! [`unpadded`]'s blocks are written once for either width (`Lanes`): in AVX-512 a load's
//! mask is a bit mask and a stride-two vector one permutation of two. On the Zen 5 cores of
//! 2026-11-28 (whose AVX-512 runs at full width), whole layers on one thread in blocks of
//! sixteen against AVX2's of eight (criterion, two rounds alternated, us): 144 planes of 56x56
//! by 3x3 135 -> 89, 384 of 14x14 32 -> 21, 240 of 28x28 by 5x5 164 -> 76; at stride two 96
//! of 112x112 by 3x3 172 -> 149, 144 of 56x56 77 -> 61, 240 of 28x28 by 5x5 100 -> 74. The
//! same sums in the same order: the same bits. Planes of 64 outputs or fewer (7x7) are
//! summed sixteen at a time, a plane a lane (`unpadded_lanes`: the inputs transposed
//! pixel-major into a padded grid, every window's taps whole vectors, the sums transposed
//! back): against the blocks, 960 of 7x7 by 3x3 26 -> 16.5, 1152 by 5x5 68 -> 33; from 14x14
//! at stride two, 576 by 3x3 29 -> 20.5, 672 by 5x5 77 -> 31. So are dilated windows at
//! stride one on planes of up to 14x14 (DeepLab's and LR-ASPP's 5x5 dilated 2), which no
//! other kernel here takes.
//!
//! ConvNeXt's 7x7 windows at stride one run in AVX-512 only (`unpadded_stream`, planes of 14
//! columns or more; smaller ones in lanes): a column of sixteen outputs streamed down the plane,
//! each input row loaded once per column and its seven window columns shifted out of two
//! loads, the sums of the seven rows it serves in a ring of registers. Whole layers on one
//! thread against padded first (criterion, Zen 5, us): 96 planes of 56x56 473 -> 172, 192 of
//! 28x28 294 -> 90, 384 of 14x14 192 -> 51, 768 of 7x7 (in lanes) 137 -> 33. The same stream takes
//! 3x3 and 5x5 windows at stride one on planes one column wide (14x14, where the blocks of
//! four rows compute sixteen): against the blocks, two rounds alternated, 384 planes by 3x3
//! 22.6 -> 18.7 us, 672 by 5x5 70.8 -> 61.6, GoogLeNet's 3x3 max pooling of 480 27.9 -> 20.1
//! (on 28x28 planes the two ran alike, on 56x56 the stream 10% slower: the blocks keep those).
//!
//! Poolings run in the same kernels ([`pooled`]: 2x2 windows at stride two, 3x3 and 5x5 at
//! stride one or two), which are generic over what a tap does (`Fold`): a max pooling's
//! maximum (the padding `-inf`, no bias) or an average's sum (weights of one; the caller
//! divides). Against each plane padded, then pooled by the window loops (criterion
//! `cpu_pooling_layers`, one thread, 2026-11-29, in us): GoogLeNet's max poolings, 64 planes of
//! 112x112 by 3x3/2 136 -> 91, 192 of 56x56 162 -> 73, 480 of 28x28 210 -> 58, 3x3/1 on 192 of
//! 28x28 83 -> 33, 480 of 14x14 88 -> 26, 832 of 7x7 81 -> 14, 2x2/2 on 832 of 14x14 181 -> 24;
//! averages, 128 of 56x56 by 2x2/2 86 -> 35, 192 of 35x35 by 3x3/1 139 -> 49.
//!
#![allow(unsafe_code)]

use opsched_graph::Activation;

use super::math::{bias_act_row, clip_range};
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

/// `y = act(w * x + bias)` for every plane of `y` (`out` each, one after another) straight
/// from its input plane (`input` each, one after another in `x`, unpadded): the padding's
/// zeros are the lanes a masked load leaves out and a row of zeros the padding's rows read, so
/// there is no padded copy to write and read back, and the bias and activation apply to a
/// block's sums in registers, before their one store. Plane `p`'s filter is `kernel` taps of
/// `w` from `p * taps` on, its bias `bias[p]` (or none). Each output adds its taps in
/// [`convolve`]'s order, the padding's (zero) products included. Returns `false`, touching
/// nothing, where [`unpadded_suits`] does not hold or a slice is shorter than its shape.
pub fn unpadded(
    win: &Windows,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    a: Activation,
    y: &mut [f32],
) -> bool {
    unpadded_with(win, x, w, bias, a, y, true)
}

/// [`unpadded`], in AVX-512 only where `wide` allows it (the tests run both).
fn unpadded_with(
    win: &Windows,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    a: Activation,
    y: &mut [f32],
    wide: bool,
) -> bool {
    let planes = planes_of(win, y);
    let fits =
        w.len() >= planes * win.kernel[0] * win.kernel[1] && bias.is_none_or(|b| b.len() >= planes);
    if !unpadded_suits(win) || !fits {
        return false;
    }
    let filters = Filters { w, per_plane: true };
    #[cfg(target_arch = "x86_64")]
    return run::<Sums>(win, x, filters, bias, None, a, y, wide);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, filters, a, y, wide);
        false
    }
}

/// [`unpadded`] for an input that takes a bias per plane first (`in_bias[p]` added to every
/// element of plane `p` it reads, the padding still zero: ConvNeXt's downsampling convolution
/// leaves its bias to the depthwise one after it), where [`streams`] holds: the loads' lanes
/// inside the plane take the bias as they arrive, so the sums are those of the plane padded
/// after its bias, the same bits. Returns `false`, touching nothing, elsewhere or where a
/// slice is shorter than its shape.
pub fn unpadded_biased(
    win: &Windows,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    in_bias: &[f32],
    a: Activation,
    y: &mut [f32],
) -> bool {
    let planes = planes_of(win, y);
    let [h, wd] = win.input;
    let fits = w.len() >= planes * win.kernel[0] * win.kernel[1]
        && bias.is_none_or(|b| b.len() >= planes)
        && in_bias.len() >= planes
        && planes.checked_mul(h * wd).is_some_and(|n| n <= x.len());
    if planes == 0 || !streams(win) || !fits {
        return false;
    }
    let filters = Filters { w, per_plane: true };
    #[cfg(target_arch = "x86_64")]
    return run::<Sums>(win, x, filters, bias, Some(in_bias), a, y, true);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, filters, a, y);
        false
    }
}

/// Whether [`unpadded`] (and [`pooled`]) streams `win`'s windows (`unpadded_stream`, which
/// [`unpadded_biased`] runs too): 7x7 at stride one on planes of 14 columns or more, and 3x3
/// and 5x5 at stride one on planes 14 to 16 columns wide (14x14: the blocks of four rows
/// computed sixteen rows for fourteen), where the CPU has AVX-512.
pub fn streams(win: &Windows) -> bool {
    let [_, ow] = win.out;
    let sized = win.kernel == [7, 7] || matches!(win.kernel, [3, 3] | [5, 5]) && ow <= WIDE_COLS;
    let wide = ow >= WIDE_FROM && !lanes_suit(win) && wide_available();
    sized && wide && win.stride == [1, 1] && unpadded_suits(win)
}

/// A pooling's windows of every plane of `y` (`out` each, one after another) straight from
/// its input plane (`input` each, one after another in `x`), as [`unpadded`] convolves them:
/// each window's maximum where `max` (the padding `-inf`, a NaN never taken: the reference's
/// fold), else the sum of its taps in the window's row-major order (the padding's zeros
/// included; an average's numerator, which the caller divides), the bits of the window loops'
/// `Windows::pool`. Returns `false`, touching nothing, where [`pooled_suits`] does not hold
/// or a slice is shorter than its shape.
pub fn pooled(win: &Windows, x: &[f32], max: bool, y: &mut [f32]) -> bool {
    pooled_with(win, x, max, y, true)
}

/// [`pooled`], in AVX-512 only where `wide` allows it (the tests run both).
fn pooled_with(win: &Windows, x: &[f32], max: bool, y: &mut [f32], wide: bool) -> bool {
    if !pooled_suits(win) {
        return false;
    }
    // One filter for every plane: the sums' weights of one; the maxima take none.
    let filters = Filters {
        w: &[1.0; 25],
        per_plane: false,
    };
    let none = Activation::None;
    #[cfg(target_arch = "x86_64")]
    return match max {
        true => run::<Maxima>(win, x, filters, None, None, none, y, wide),
        false => run::<Sums>(win, x, filters, None, None, none, y, wide),
    };
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, max, filters, none, y, wide);
        false
    }
}

/// Whole planes of `y` (`out` each; 0 where `y` holds none or a part of one).
fn planes_of(win: &Windows, y: &[f32]) -> usize {
    let len = win.out[0] * win.out[1];
    match y.len().checked_div(len) {
        Some(n) if n * len == y.len() => n,
        _ => 0,
    }
}

/// One filter per plane or one for all: [`unpadded`]'s weights.
#[derive(Clone, Copy)]
struct Filters<'a> {
    w: &'a [f32],
    per_plane: bool,
}

impl<'a> Filters<'a> {
    /// Plane `p`'s `taps` weights.
    fn of(self, p: usize, taps: usize) -> &'a [f32] {
        let at = if self.per_plane { p * taps } else { 0 };
        &self.w[at..at + taps]
    }
}

/// [`unpadded`]'s and [`pooled`]'s kernels with fold `F` over `y`'s planes (their windows
/// suit, their filters and biases checked), in AVX-512 only where `wide` allows it.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn run<F: Fold>(
    win: &Windows,
    x: &[f32],
    w: Filters<'_>,
    bias: Option<&[f32]>,
    in_bias: Option<&[f32]>,
    a: Activation,
    y: &mut [f32],
    wide: bool,
) -> bool {
    let [h, wd] = win.input;
    let ow = win.out[1];
    let planes = planes_of(win, y);
    if planes == 0 || planes.checked_mul(h * wd).is_none_or(|n| n > x.len()) {
        return false;
    }
    let Some(simd) = pulp::x86::V3::try_new() else {
        return false;
    };
    // An input bias is the stream's alone.
    let stream = wide && streams(win);
    if in_bias.is_some() && !stream {
        return false;
    }
    // ReLU and the clipping family on the sums in registers; any other activation in a
    // pass over the planes after (in cache), as its polynomials run best over rows.
    let clip = clip_range(a);
    let v4 = pulp::x86::V4::try_new().filter(|_| wide);
    let lanes = v4.filter(|_| lanes_suit(win));
    if lanes.is_none() && win.dilation != [1, 1] {
        // (Only the lanes dilate their windows.)
        return false;
    }
    let v4 = v4.filter(|_| ow >= WIDE_FROM);
    // One of the kernels `$kernel::<F, K, S>` for this window and stride (one of those
    // `shape_suits` takes).
    macro_rules! by_window {
        ($kernel:ident, $simd:expr) => {
            // SAFETY (each): the CPU has the instructions of `$simd`.
            match (win.kernel[0], win.stride[0]) {
                (2, _) => unsafe { $kernel::<F, 2, 2>($simd, win, x, w, bias, clip, y) },
                (3, 1) => unsafe { $kernel::<F, 3, 1>($simd, win, x, w, bias, clip, y) },
                (3, _) => unsafe { $kernel::<F, 3, 2>($simd, win, x, w, bias, clip, y) },
                (5, 1) => unsafe { $kernel::<F, 5, 1>($simd, win, x, w, bias, clip, y) },
                _ => unsafe { $kernel::<F, 5, 2>($simd, win, x, w, bias, clip, y) },
            }
        };
    }
    let seven = win.kernel[0] == 7;
    match (lanes, v4) {
        // SAFETY (each): the CPU has AVX-512.
        (Some(v4), _) if seven => unsafe {
            unpadded_lanes::<F, 7, 1>(v4, win, x, w, bias, clip, y)
        },
        (Some(v4), _) => by_window!(unpadded_lanes, v4),
        (_, Some(v4)) if stream => match win.kernel[0] {
            3 => unsafe { unpadded_stream::<F, 3>(v4, win, x, w, bias, in_bias, clip, y) },
            5 => unsafe { unpadded_stream::<F, 5>(v4, win, x, w, bias, in_bias, clip, y) },
            _ => unsafe { unpadded_stream::<F, 7>(v4, win, x, w, bias, in_bias, clip, y) },
        },
        (_, Some(v4)) => by_window!(unpadded_wide, v4),
        // (7x7 windows run in AVX-512 only: `unpadded_suits`.)
        _ if seven => return false,
        _ => by_window!(unpadded_narrow, simd),
    }
    if clip.is_none() && a != Activation::None {
        bias_act_row(y, None, a);
    }
    true
}

/// Whether [`unpadded`] runs `win`'s windows: 3x3 or 5x5, stride one or two, dilation one,
/// output planes of at least four rows of at least half a vector, on a CPU with AVX2 and FMA;
/// and 7x7 at stride one on a CPU with AVX-512, rows of 14 outputs or more or planes of 64 or
/// fewer (summed in lanes); and dilated 3x3, 5x5 and 7x7 windows at stride one on planes of
/// up to 14x14, in lanes on a CPU with AVX-512. (In AVX2's blocks of four rows, a load per
/// tap, ConvNeXt's 7x7 windows ran 0.69 ms for 96 planes of 56x56 against 0.60 padded first
/// (Zen 4): they stay with [`sums`] there.)
pub fn unpadded_suits(win: &Windows) -> bool {
    if win.dilation != [1, 1] {
        // Dilated windows in lanes alone.
        let sized = matches!(win.kernel, [3, 3] | [5, 5] | [7, 7]);
        return sized && lanes_suit(win) && available() && wide_available();
    }
    match win.kernel {
        [3, 3] | [5, 5] => shape_suits(win),
        [7, 7] => {
            let rows = win.out[1] >= WIDE_FROM || lanes_suit(win);
            win.stride == [1, 1] && rows && shape_suits(win) && wide_available()
        }
        _ => false,
    }
}

/// Whether this CPU runs AVX-512 (x86-64-v4, as `pulp` has it).
fn wide_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return pulp::x86::V4::try_new().is_some();
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// Whether [`pooled`] runs `win`'s windows: 2x2 at stride two, 3x3 or 5x5 at stride one or
/// two, and as [`unpadded_suits`] asks of the rest.
pub fn pooled_suits(win: &Windows) -> bool {
    let sized =
        matches!(win.kernel, [3, 3] | [5, 5]) || win.kernel == [2, 2] && win.stride == [2, 2];
    sized && shape_suits(win)
}

/// [`unpadded_suits`] but for the window's size.
fn shape_suits(win: &Windows) -> bool {
    let [oh, ow] = win.out;
    let strided = matches!(win.stride, [1, 1] | [2, 2]);
    strided && win.dilation == [1, 1] && oh >= ROWS && 2 * ow >= COLS && available()
}

/// Columns a block's loads span, at most: two vectors (at stride two; AVX-512's, of sixteen)
/// and a 5x5 window's four columns more.
const SPAN: usize = 2 * WIDE_COLS + 4;

/// Output columns of a block in AVX-512: one vector of sixteen.
const WIDE_COLS: usize = 16;

/// Output columns from which [`unpadded`] takes AVX-512's blocks of sixteen where the CPU has
/// it (14x14 planes and wider: a block of sixteen computes 16 columns for a row of 14 where
/// two blocks of eight computed as many with twice the instructions).
const WIDE_FROM: usize = 14;

/// The rows every padding row reads (rows up to this wide; a wider input allocates its own):
/// [`Sums`]' and [`Maxima`]'s.
static ZEROS: [f32; 1024] = [0.0; 1024];
static NEG_INFINITIES: [f32; 1024] = [f32::NEG_INFINITY; 1024];

/// One vector width of [`unpadded`]'s blocks: AVX2's eight lanes or AVX-512's sixteen (on the
/// Zen 5 cores of 2026-11-28 AVX-512 runs at full width, twice AVX2's sums an instruction).
#[cfg(target_arch = "x86_64")]
trait Lanes: Copy {
    /// A vector of `N` lanes.
    type V: Copy;
    /// Output columns a block covers: one vector.
    const N: usize;
    /// Which of the columns a block's loads span (from its first load's column on) lie
    /// inside the row: found once per block column.
    type Masks;
    fn masks(start: isize, wd: usize) -> Self::Masks;
    fn splat(self, v: f32) -> Self::V;
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    /// `v.max(lo).min(hi)` (a NaN gives `lo`).
    fn clip(self, v: Self::V, lo: Self::V, hi: Self::V) -> Self::V;
    /// `x` where it is above `m`, else `m` (a NaN `x` gives `m`: `x > m` is false).
    fn max(self, x: Self::V, m: Self::V) -> Self::V;
    /// The even elements of `lo` then `hi`, or where `odd` the odd ones.
    fn every_other(self, lo: Self::V, hi: Self::V, odd: bool) -> Self::V;
    /// The vector at `at`; where `masked`, only the lanes inside the row (`masks` from lane
    /// `from` on) are read, the others `fill` (a constant where it is inlined: zero costs
    /// nothing more).
    ///
    /// # Safety
    /// The lanes read lie inside one allocation.
    unsafe fn load(
        self,
        at: *const f32,
        masked: Option<(&Self::Masks, usize)>,
        fill: f32,
    ) -> Self::V;
    /// The first `n` lanes of `v` to `at` on.
    ///
    /// # Safety
    /// `n` elements from `at` on lie inside one allocation.
    unsafe fn store(self, at: *mut f32, v: Self::V, n: usize);
}

#[cfg(target_arch = "x86_64")]
impl Lanes for pulp::x86::V3 {
    type V = pulp::f32x8;
    const N: usize = COLS;
    /// A lane of all ones where the column is inside the row, zero in the padding.
    type Masks = [i32; SPAN];

    fn masks(start: isize, wd: usize) -> [i32; SPAN] {
        std::array::from_fn(|l| {
            let c = start + l as isize;
            -i32::from(c >= 0 && (c as usize) < wd)
        })
    }
    #[inline(always)]
    fn splat(self, v: f32) -> pulp::f32x8 {
        self.splat_f32x8(v)
    }
    #[inline(always)]
    fn mul_add(self, a: pulp::f32x8, b: pulp::f32x8, c: pulp::f32x8) -> pulp::f32x8 {
        self.mul_add_f32x8(a, b, c)
    }
    #[inline(always)]
    fn add(self, a: pulp::f32x8, b: pulp::f32x8) -> pulp::f32x8 {
        self.add_f32x8(a, b)
    }
    #[inline(always)]
    fn clip(self, v: pulp::f32x8, lo: pulp::f32x8, hi: pulp::f32x8) -> pulp::f32x8 {
        self.min_f32x8(self.max_f32x8(v, lo), hi)
    }
    #[inline(always)]
    fn max(self, x: pulp::f32x8, m: pulp::f32x8) -> pulp::f32x8 {
        // `vmaxps` gives its second operand where either is a NaN.
        pulp::cast(self.avx._mm256_max_ps(pulp::cast(x), pulp::cast(m)))
    }
    #[inline(always)]
    fn every_other(self, lo: pulp::f32x8, hi: pulp::f32x8, odd: bool) -> pulp::f32x8 {
        // [lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6] (odd: lanes 1 and 3 of each half), then its
        // 64-bit pairs in order.
        let (lo, hi) = (pulp::cast(lo), pulp::cast(hi));
        let picked = match odd {
            false => self.avx._mm256_shuffle_ps::<0b10_00_10_00>(lo, hi),
            true => self.avx._mm256_shuffle_ps::<0b11_01_11_01>(lo, hi),
        };
        pulp::cast(
            self.avx2
                ._mm256_permute4x64_pd::<0b11_01_10_00>(pulp::cast(picked)),
        )
    }
    #[inline(always)]
    unsafe fn load(
        self,
        at: *const f32,
        masked: Option<(&[i32; SPAN], usize)>,
        fill: f32,
    ) -> pulp::f32x8 {
        match masked {
            Some((masks, from)) => {
                let mask: [i32; COLS] = masks[from..from + COLS]
                    .try_into()
                    .expect("a vector's mask");
                let mask = pulp::cast(mask);
                // SAFETY: the mask's lanes lie inside the allocation (the caller's promise);
                // the others are not read.
                let v = unsafe { self.avx._mm256_maskload_ps(at, mask) };
                if fill == 0.0 {
                    return pulp::cast(v);
                }
                let fill = self.avx._mm256_set1_ps(fill);
                pulp::cast(self.avx._mm256_blendv_ps(fill, v, pulp::cast(mask)))
            }
            // SAFETY: the caller's promise.
            None => unsafe { at.cast::<pulp::f32x8>().read_unaligned() },
        }
    }
    #[inline(always)]
    unsafe fn store(self, at: *mut f32, v: pulp::f32x8, n: usize) {
        if n >= COLS {
            // SAFETY: the caller's promise.
            unsafe { at.cast::<pulp::f32x8>().write_unaligned(v) };
        } else {
            let v: [f32; COLS] = pulp::cast(v);
            // SAFETY: the caller's promise.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), at, n) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl Lanes for pulp::x86::V4 {
    type V = pulp::f32x16;
    const N: usize = WIDE_COLS;
    /// Bit `l` set where column `l` of the span is inside the row.
    type Masks = u64;

    fn masks(start: isize, wd: usize) -> u64 {
        (0..SPAN).fold(0, |bits, l| {
            let c = start + l as isize;
            bits | (u64::from(c >= 0 && (c as usize) < wd) << l)
        })
    }
    #[inline(always)]
    fn splat(self, v: f32) -> pulp::f32x16 {
        self.splat_f32x16(v)
    }
    #[inline(always)]
    fn mul_add(self, a: pulp::f32x16, b: pulp::f32x16, c: pulp::f32x16) -> pulp::f32x16 {
        self.mul_add_f32x16(a, b, c)
    }
    #[inline(always)]
    fn add(self, a: pulp::f32x16, b: pulp::f32x16) -> pulp::f32x16 {
        self.add_f32x16(a, b)
    }
    #[inline(always)]
    fn clip(self, v: pulp::f32x16, lo: pulp::f32x16, hi: pulp::f32x16) -> pulp::f32x16 {
        self.min_f32x16(self.max_f32x16(v, lo), hi)
    }
    #[inline(always)]
    fn max(self, x: pulp::f32x16, m: pulp::f32x16) -> pulp::f32x16 {
        // `vmaxps` gives its second operand where either is a NaN.
        pulp::cast(self.avx512f._mm512_max_ps(pulp::cast(x), pulp::cast(m)))
    }
    #[inline(always)]
    fn every_other(self, lo: pulp::f32x16, hi: pulp::f32x16, odd: bool) -> pulp::f32x16 {
        let idx: [i32; WIDE_COLS] = std::array::from_fn(|l| 2 * l as i32 + i32::from(odd));
        pulp::cast(self.avx512f._mm512_permutex2var_ps(
            pulp::cast(lo),
            pulp::cast(idx),
            pulp::cast(hi),
        ))
    }
    #[inline(always)]
    unsafe fn load(self, at: *const f32, masked: Option<(&u64, usize)>, fill: f32) -> pulp::f32x16 {
        match masked {
            // SAFETY: the mask's lanes lie inside the allocation (the caller's promise);
            // the others are not read.
            Some((&bits, from)) => pulp::cast(unsafe { masked_load(self, bits >> from, at, fill) }),
            // SAFETY: the caller's promise.
            None => unsafe { at.cast::<pulp::f32x16>().read_unaligned() },
        }
    }
    #[inline(always)]
    unsafe fn store(self, at: *mut f32, v: pulp::f32x16, n: usize) {
        if n >= WIDE_COLS {
            // SAFETY: the caller's promise.
            unsafe { at.cast::<pulp::f32x16>().write_unaligned(v) };
        } else {
            let mask = ((1u32 << n) - 1) as u16;
            // SAFETY: the caller's promise (the lanes past `n` are not written).
            unsafe { self.avx512f._mm512_mask_storeu_ps(at, mask, pulp::cast(v)) };
        }
    }
}

/// The lanes of `mask` (its low sixteen bits) from `at`, `fill` in the others.
///
/// # Safety
/// The mask's lanes lie inside one allocation.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn masked_load(
    simd: pulp::x86::V4,
    mask: u64,
    at: *const f32,
    fill: f32,
) -> std::arch::x86_64::__m512 {
    let mask = mask as u16;
    if fill == 0.0 {
        // SAFETY: the caller's promise.
        return unsafe { simd.avx512f._mm512_maskz_loadu_ps(mask, at) };
    }
    let fill = pulp::cast(simd.splat_f32x16(fill));
    // SAFETY: the caller's promise.
    unsafe { simd.avx512f._mm512_mask_loadu_ps(fill, mask, at) }
}

/// What [`unpadded`]'s kernels do with each tap and its window's result: a convolution's
/// multiply-adds ([`Sums`], also an average pooling's with weights of one) or a max
/// pooling's maxima ([`Maxima`]).
#[cfg(target_arch = "x86_64")]
trait Fold: Copy {
    /// What the padding reads: the fold's identity.
    const FILL: f32;
    /// `acc` with the tap `x` of weight `w` folded in.
    fn tap<L: Lanes>(simd: L, w: L::V, x: L::V, acc: L::V) -> L::V;
    /// A window's result from its fold and its plane's `bias`.
    fn finish<L: Lanes>(simd: L, acc: L::V, bias: L::V) -> L::V;
}

/// Weighted sums by fused multiply-adds, then the bias.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Sums;

#[cfg(target_arch = "x86_64")]
impl Fold for Sums {
    const FILL: f32 = 0.0;
    #[inline(always)]
    fn tap<L: Lanes>(simd: L, w: L::V, x: L::V, acc: L::V) -> L::V {
        simd.mul_add(w, x, acc)
    }
    #[inline(always)]
    fn finish<L: Lanes>(simd: L, acc: L::V, bias: L::V) -> L::V {
        simd.add(acc, bias)
    }
}

/// Maxima, as the reference folds them (from `-inf`, a tap taken where it is above: NaN
/// never is); weights and bias unused.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Maxima;

#[cfg(target_arch = "x86_64")]
impl Fold for Maxima {
    const FILL: f32 = f32::NEG_INFINITY;
    #[inline(always)]
    fn tap<L: Lanes>(simd: L, _: L::V, x: L::V, acc: L::V) -> L::V {
        simd.max(x, acc)
    }
    #[inline(always)]
    fn finish<L: Lanes>(_: L, acc: L::V, _: L::V) -> L::V {
        acc
    }
}

/// Output elements of a plane up to which [`unpadded`] sums planes in lanes
/// ([`unpadded_lanes`]): a 7x7 plane's 49, an 8x8 one's 64.
const LANES_MOST: usize = 64;

/// Whether [`unpadded`] sums `win`'s planes in lanes where the CPU has AVX-512: planes of
/// [`LANES_MOST`] outputs or fewer, rows narrower than [`WIDE_FROM`] (blocks of rows would
/// leave most lanes idle), at stride one or two. (On 14x14 planes the stream measured
/// faster: 384 planes by 3x3 18.2 against 22.5 us, 672 by 5x5 57.8 against 60.8, 384 by 7x7
/// 50.5 against 56.0.)
fn lanes_suit(win: &Windows) -> bool {
    let [oh, ow] = win.out;
    let s = win.stride[0];
    let strided = win.stride == [s, s] && (s == 1 || s == 2);
    let small = win.dilation == [1, 1] && ow < WIDE_FROM && oh * ow <= LANES_MOST;
    let d = win.dilation[0];
    let dilated = win.dilation == [d, d] && d > 1 && s == 1 && ow <= 2 * LANE_COLS;
    strided && (small || dilated && oh * ow <= DILATED_MOST)
}

/// Output elements of a plane up to which [`unpadded`] sums dilated windows in lanes, rows
/// in two halves: MobileNetV3's last stages in DeepLabV3 and LR-ASPP, 5x5 dilated 2 on
/// 14x14 planes. Against their phases split, summed in lanes and woven back
/// (`Conv::dilated_phases`), in DeepLabV3 on one thread (three processes of each build
/// alternated): 960 planes 0.25 -> 0.13 and 0.26 -> 0.14 ms, 672 0.19 -> 0.10 (onnxruntime's
/// 0.16, 0.16 and 0.11).
const DILATED_MOST: usize = 196;

/// Output columns [`unpadded_lanes`] keeps in registers: a row of a plane it sums
/// ([`lanes_suit`]: narrower than [`WIDE_FROM`]).
const LANE_COLS: usize = WIDE_FROM - 1;

/// [`unpadded`]'s small planes (whose checks passed, and [`lanes_suit`]) sixteen at a time,
/// a plane a lane: each group's inputs turned pixel-major (a vector of its sixteen planes
/// per pixel, 16 x 16 transposes) into a grid padded with the fold's identity, then every
/// output pixel's window folded as `K * K` fused multiply-adds (or maxima) of whole vectors
/// (a row of outputs at once, their sums in registers, the filter's tap a vector of the
/// group's weights), then turned back. Against summing each plane flat (its outputs in four
/// vectors, a masked load per tap and vector, a quarter of the lanes idle on 7x7 planes),
/// criterion, one thread, us: 960 planes of 7x7 by 3x3 18.9 -> 16.5, 1152 by 5x5 57 -> 33,
/// ConvNeXt's 768 by 7x7 67 -> 33, from 14x14 at stride two 576 by 3x3 22.6 -> 20.5, 672 by
/// 5x5 48 -> 31; GoogLeNet's 3x3 max pooling of 832 7x7 planes 13.4 -> 10.5, its 2x2 one at
/// stride two 23.4 -> 26.3 (four taps do not pay for the transposes). Each output folds its
/// taps in the window's row-major order from the identity, the padding's included, as the
/// blocks do: the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512cd,avx512dq,avx512vl")]
fn unpadded_lanes<F: Fold, const K: usize, const S: usize>(
    simd: pulp::x86::V4,
    win: &Windows,
    x: &[f32],
    w: Filters<'_>,
    bias: Option<&[f32]>,
    clip: Option<(f32, f32)>,
    y: &mut [f32],
) {
    use std::arch::x86_64::*;
    const G: usize = WIDE_COLS;
    let [h, wd] = win.input;
    let [oh, ow] = win.out;
    let [ph, pw] = win.padding;
    let (hw, len) = (h * wd, oh * ow);
    // The grid every window reads, `gh x gw` pixels of G lanes: the input at `(ph, pw)`, the
    // identity around it (written once: each group overwrites only the input's pixels).
    // (Vectors of lanes, so that every load and store is aligned to its cache line: on
    // an address malloc gave, 1152 planes by 5x5 took 35 or 45 us from run to run.)
    let d = win.dilation[0];
    let (gh, gw) = (
        S * (oh - 1) + d * (K - 1) + 1,
        S * (ow - 1) + d * (K - 1) + 1,
    );
    let mut grid_v = vec![_mm512_set1_ps(F::FILL); gh * gw];
    let mut outs_v = vec![_mm512_setzero_ps(); len.next_multiple_of(G)];
    // SAFETY (both): a vector is G f32s, and the slices borrow their vectors for their
    // lifetime.
    let grid =
        unsafe { std::slice::from_raw_parts_mut(grid_v.as_mut_ptr().cast::<f32>(), gh * gw * G) };
    let outs = unsafe {
        std::slice::from_raw_parts_mut(outs_v.as_mut_ptr().cast::<f32>(), outs_v.len() * G)
    };
    let planes = planes_of(win, y);
    let (lo, hi) = clip.map_or((0.0, 0.0), |r| r);
    let (lo, hi) = (simd.splat_f32x16(lo), simd.splat_f32x16(hi));
    for g in (0..planes).step_by(G) {
        let n = (planes - g).min(G);
        // The group's inputs, pixel-major into the grid.
        for q0 in (0..hw).step_by(G) {
            let m = (hw - q0).min(G);
            let lanes = (u32::MAX >> (32 - m)) as u16;
            let rows: [__m512; G] = std::array::from_fn(|c| match c < n {
                // SAFETY: plane g + c holds `m` elements from `q0` on (`planes` checked
                // against `x` by the caller).
                true => unsafe { _mm512_maskz_loadu_ps(lanes, x.as_ptr().add((g + c) * hw + q0)) },
                false => _mm512_setzero_ps(),
            });
            // Pixel q0's row and column in the grid, then the next pixel's, and so on.
            let (mut r, mut c) = (q0 / wd + ph, q0 % wd + pw);
            for v in transpose16(rows).into_iter().take(m) {
                if r < gh && c < gw {
                    // SAFETY: pixel (r, c) of the grid, inside it.
                    unsafe { _mm512_storeu_ps(grid.as_mut_ptr().add((r * gw + c) * G), v) };
                }
                c += 1;
                if c == wd + pw {
                    (r, c) = (r + 1, pw);
                }
            }
        }
        // The group's filters, a vector of the planes' weights per tap (transposed as the
        // inputs), and its biases.
        let mut taps = [_mm512_setzero_ps(); 64];
        for t0 in (0..K * K).step_by(G) {
            let m = (K * K - t0).min(G);
            let lanes = (u32::MAX >> (32 - m)) as u16;
            let rows: [__m512; G] = std::array::from_fn(|c| match c < n {
                // SAFETY: the plane's filter holds `m` taps from `t0` on.
                true => unsafe { _mm512_maskz_loadu_ps(lanes, w.of(g + c, K * K)[t0..].as_ptr()) },
                false => _mm512_setzero_ps(),
            });
            taps[t0..t0 + G].copy_from_slice(&transpose16(rows));
        }
        let b: [f32; G] = std::array::from_fn(|c| match (c < n, bias) {
            (true, Some(b)) => b[g + c],
            _ => 0.0,
        });
        let b = pulp::cast(b);
        // A row's outputs in registers at once: whole, or (rows wider than LANE_COLS) in
        // two halves.
        let seg = if ow <= LANE_COLS { ow } else { ow.div_ceil(2) };
        for i in 0..oh {
            for j0 in (0..ow).step_by(seg) {
                let cols = seg.min(ow - j0);
                let at = [i, j0, d, gw];
                // SAFETY (both): the grid holds every window of output row i.
                let acc = match cols {
                    // (Rows of seven, the common case, without a test per column.)
                    7 => unsafe { lanes_row::<F, K, S, 7>(simd, grid, at, &taps, 7) },
                    _ => unsafe { lanes_row::<F, K, S, LANE_COLS>(simd, grid, at, &taps, cols) },
                };
                for (j, &s) in acc.iter().enumerate().take(cols) {
                    let mut out = F::finish(simd, s, b);
                    if clip.is_some() {
                        out = simd.clip(out, lo, hi);
                    }
                    let at = (i * ow + j0 + j) * G;
                    // SAFETY: output pixel i * ow + j0 + j of `outs`.
                    unsafe { _mm512_storeu_ps(outs.as_mut_ptr().add(at), pulp::cast(out)) };
                }
            }
        }
        // Back plane-major: sixteen pixels of every plane at a time.
        for q0 in (0..len).step_by(G) {
            let m = (len - q0).min(G);
            let lanes = (u32::MAX >> (32 - m)) as u16;
            // SAFETY: `outs` holds whole vectors of G pixels (zero past `len`).
            let px: [__m512; G] = std::array::from_fn(|i| unsafe {
                _mm512_loadu_ps(outs.as_ptr().add((q0 + i) * G))
            });
            for (c, v) in transpose16(px).into_iter().enumerate().take(n) {
                // SAFETY: plane g + c of `y` holds `m` elements from `q0` on.
                unsafe { _mm512_mask_storeu_ps(y.as_mut_ptr().add((g + c) * len + q0), lanes, v) };
            }
        }
    }
}

/// [`unpadded_lanes`]' sums of output row `i`'s columns `j0 .. j0 + cols` (`cols` at most
/// `OW`): the windows' taps, dilated `d`, over the `grid` (`gw` pixels a row of sixteen
/// lanes) by `taps`.
///
/// # Safety
/// The grid holds rows `S * i .. S * i + d * (K - 1) + 1` of `S * (j0 + cols - 1) + d * (K -
/// 1) + 1` pixels or more.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::erasing_op, clippy::identity_op)] // (`seq!` writes `S * 0 * G` for column 0.)
unsafe fn lanes_row<F: Fold, const K: usize, const S: usize, const OW: usize>(
    simd: pulp::x86::V4,
    grid: &[f32],
    [i, j0, d, gw]: [usize; 4],
    taps: &[std::arch::x86_64::__m512; 64],
    cols: usize,
) -> [pulp::f32x16; LANE_COLS] {
    use std::arch::x86_64::*;
    const G: usize = WIDE_COLS;
    let mut acc = [simd.splat_f32x16(F::FILL); LANE_COLS];
    for (t, &tap) in taps.iter().enumerate().take(K * K) {
        let (a, b) = (t / K * d, t % K * d);
        let row = grid
            .as_ptr()
            .wrapping_add(((S * i + a) * gw + S * j0 + b) * G);
        seq_macro::seq!(J in 0..13 {
            if J < OW && J < cols {
                // SAFETY: pixel (S * i + a, S * J + b) of the grid (the caller's promise).
                let v = unsafe { _mm512_loadu_ps(row.add(S * J * G)) };
                acc[J] = F::tap(simd, pulp::cast(tap), pulp::cast(v), acc[J]);
            }
        });
    }
    acc
}

/// The transpose of a 16 x 16 block (row `i` of the result is lane `i` of every input
/// vector): pairs of lanes, then of pairs, within 128-bit lanes, then the 128-bit lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn transpose16(r: [std::arch::x86_64::__m512; 16]) -> [std::arch::x86_64::__m512; 16] {
    use std::arch::x86_64::*;
    let t: [__m512; 16] = std::array::from_fn(|i| match i % 2 {
        0 => _mm512_unpacklo_ps(r[i], r[i + 1]),
        _ => _mm512_unpackhi_ps(r[i - 1], r[i]),
    });
    // u[4k + c]: in 128-bit lane L, rows 4k .. 4k + 3 of column 4L + c.
    let u: [__m512; 16] = std::array::from_fn(|i| {
        let (k, c) = (i / 4 * 4, i % 4);
        let (a, b) = (
            _mm512_castps_pd(t[k + c / 2]),
            _mm512_castps_pd(t[k + 2 + c / 2]),
        );
        _mm512_castpd_ps(match c % 2 {
            0 => _mm512_unpacklo_pd(a, b),
            _ => _mm512_unpackhi_pd(a, b),
        })
    });
    let mut out = [_mm512_setzero_ps(); 16];
    for c in 0..4 {
        let (a, b, cc, d) = (u[c], u[4 + c], u[8 + c], u[12 + c]);
        let x0 = _mm512_shuffle_f32x4::<0x44>(a, b);
        let x1 = _mm512_shuffle_f32x4::<0xEE>(a, b);
        let y0 = _mm512_shuffle_f32x4::<0x44>(cc, d);
        let y1 = _mm512_shuffle_f32x4::<0xEE>(cc, d);
        out[c] = _mm512_shuffle_f32x4::<0x88>(x0, y0);
        out[4 + c] = _mm512_shuffle_f32x4::<0xDD>(x0, y0);
        out[8 + c] = _mm512_shuffle_f32x4::<0x88>(x1, y1);
        out[12 + c] = _mm512_shuffle_f32x4::<0xDD>(x1, y1);
    }
    out
}

/// [`unpadded`]'s planes for a `K x K` window at stride one (7x7: ConvNeXt's; 3x3 and 5x5 on
/// planes one column wide) in AVX-512,
/// whose checks passed: a column of sixteen outputs at a time, streamed down the plane. Each
/// input row is read once per column (two loads, masked where they reach past the row), its
/// `K` window columns shifted out of those two (`valignd`), and each shifted vector taken into
/// the `K` output rows it serves, whose sums ride a ring of `K` registers: after input row
/// `u` the output row `u - K + 1` is whole, stored (bias and ReLU or clip applied), and its
/// register starts row `u + 1`. So each input vector is loaded once, not once per tap, and a
/// step's `K * K` taps run as `K` chains of sums at once. Against [`sums`] over planes padded
/// first, whole layers on one thread (criterion `cpu_depthwise_layers`, the two builds
/// alternated, Zen 5, us): ConvNeXt-T's 96 planes of 56x56 453 -> 190, 192 of 28x28 284 ->
/// 100, 384 of 14x14 192 -> 55. Each output adds its taps in the window's row-major order
/// (input row by input row, window column by window column), the padding's included, as
/// [`unpadded_planes`] does: the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512cd,avx512dq,avx512vl")]
#[allow(clippy::too_many_arguments)]
fn unpadded_stream<F: Fold, const K: usize>(
    simd: pulp::x86::V4,
    win: &Windows,
    x: &[f32],
    w: Filters<'_>,
    bias: Option<&[f32]>,
    in_bias: Option<&[f32]>,
    clip: Option<(f32, f32)>,
    y: &mut [f32],
) {
    let [h, wd] = win.input;
    let [oh, ow] = win.out;
    let len = oh * ow;
    // Each block column's first output column, its loads' first input column, and the lanes
    // of its two loads inside a row.
    let columns: Vec<(usize, isize, u64)> = block_starts(ow, WIDE_COLS)
        .map(|j| {
            let start = j as isize - win.padding[1] as isize;
            (j, start, <pulp::x86::V4 as Lanes>::masks(start, wd))
        })
        .collect();
    let clip = clip.map(|(lo, hi)| (simd.splat_f32x16(lo), simd.splat_f32x16(hi)));
    for (p, plane) in y.chunks_mut(len).enumerate() {
        let mut taps = [0.0; STREAM_TAPS];
        taps[..K * K].copy_from_slice(w.of(p, K * K));
        let bias = simd.splat_f32x16(bias.map_or(0.0, |b| b[p]));
        let in_bias = in_bias.map(|b| simd.splat_f32x16(b[p]));
        for &(j, start, masks) in &columns {
            let mut column = Column {
                simd,
                win,
                x: &x[p * h * wd..(p + 1) * h * wd],
                taps: &taps,
                bias,
                in_bias,
                clip,
                y: &mut *plane,
                j,
                start,
                masks,
            };
            column.run::<F, K>();
        }
    }
}

/// Taps of the largest window [`unpadded_stream`] takes (7x7).
const STREAM_TAPS: usize = 49;

/// One column of sixteen outputs of a plane, as [`unpadded_stream`] streams it.
#[cfg(target_arch = "x86_64")]
struct Column<'a> {
    simd: pulp::x86::V4,
    win: &'a Windows,
    /// The input plane.
    x: &'a [f32],
    /// The filter, row-major, zeros after its taps.
    taps: &'a [f32; STREAM_TAPS],
    bias: pulp::f32x16,
    /// Added to every element of the plane as it is loaded (the padding stays zero).
    in_bias: Option<pulp::f32x16>,
    clip: Option<(pulp::f32x16, pulp::f32x16)>,
    /// The output plane.
    y: &'a mut [f32],
    /// The first output column.
    j: usize,
    /// The first column of the loads, and which of the columns they span lie inside a row.
    start: isize,
    masks: u64,
}

#[cfg(target_arch = "x86_64")]
impl Column<'_> {
    /// Every step of the column, `K` at a time (each ring slot a register: step `u`'s slots
    /// are known from `u mod K`); the first and last `K - 1` steps, some of whose window rows
    /// serve no output row, skip those.
    #[inline(always)]
    #[allow(clippy::identity_op)] // (`seq!` writes `u + 0` for the first phase.)
    fn run<F: Fold, const K: usize>(&mut self) {
        let oh = self.win.out[0];
        let mut ring = [self.simd.splat_f32x16(F::FILL); K];
        let mut u = 0;
        while u < oh + K - 1 {
            let whole = u + 1 >= K && u + K <= oh;
            seq_macro::seq!(P in 0..7 {
                if P < K {
                    match whole {
                        true => self.step::<F, K, P, false>(u + P, &mut ring),
                        false => self.step::<F, K, P, true>(u + P, &mut ring),
                    }
                }
            });
            u += K;
        }
    }

    /// Step `u` (`u mod K == P`): input row `u - ph` into the ring, output row `u - K + 1`
    /// stored where it is one, its slot cleared for row `u + 1`. Steps past the last do
    /// nothing; where `CHECKED`, the window rows that serve no output row are skipped.
    #[inline(always)]
    fn step<F: Fold, const K: usize, const P: usize, const CHECKED: bool>(
        &mut self,
        u: usize,
        ring: &mut [pulp::f32x16; K],
    ) {
        use std::arch::x86_64::__m512i;
        let simd = self.simd;
        let [oh, ow] = self.win.out;
        let [h, wd] = self.win.input;
        if u >= oh + K - 1 {
            return;
        }
        let fill = simd.splat_f32x16(F::FILL);
        let (v0, v1): (__m512i, __m512i) = match u.checked_sub(self.win.padding[0]) {
            Some(r) if r < h => {
                let at = self.x[r * wd..].as_ptr().wrapping_offset(self.start);
                let (m0, m1) = (self.masks, self.masks >> WIDE_COLS);
                // SAFETY: the masks' lanes are the columns of this row inside it (the others
                // are not read).
                let (mut v0, mut v1) = unsafe {
                    (
                        masked_load(simd, m0, at, F::FILL),
                        masked_load(simd, m1, at.add(WIDE_COLS), F::FILL),
                    )
                };
                if let Some(b) = self.in_bias {
                    // The bias on the lanes inside the row only: the padding stays zero.
                    let f = simd.avx512f;
                    v0 = f._mm512_mask_add_ps(v0, m0 as u16, v0, pulp::cast(b));
                    v1 = f._mm512_mask_add_ps(v1, m1 as u16, v1, pulp::cast(b));
                }
                (pulp::cast(v0), pulp::cast(v1))
            }
            _ => (pulp::cast(fill), pulp::cast(fill)),
        };
        // Window column c's vector: columns c .. c + 16 of the two loads'.
        let mut shifted = [fill; K];
        seq_macro::seq!(C in 0..7 {
            if C < K {
                shifted[C] = pulp::cast(simd.avx512f._mm512_alignr_epi32::<C>(v1, v0));
            }
        });
        // The taps through an opaque reference each step: else their splats are hoisted out
        // of the column's loop, spilled (49 of them) and read back as whole vectors (a
        // third slower).
        let taps = std::hint::black_box(self.taps);
        let mut tap = |a: usize, c: usize| {
            // Output row u - a, in slot (u - a) mod K.
            let slot = (P + K - a) % K;
            let t = simd.splat_f32x16(taps[a * K + c]);
            ring[slot] = F::tap(simd, t, shifted[c], ring[slot]);
        };
        if CHECKED {
            seq_macro::seq!(A in 0..7 {
                if A < K && serves(u, A, oh) {
                    seq_macro::seq!(C in 0..7 {
                        if C < K {
                            tap(A, C);
                        }
                    });
                }
            });
        } else {
            // Window column by window column, the K rows' sums at once.
            seq_macro::seq!(C in 0..7 {
                if C < K {
                    seq_macro::seq!(A in 0..7 {
                        if A < K {
                            tap(A, C);
                        }
                    });
                }
            });
        }
        if let Some(q) = (u + 1).checked_sub(K) {
            let slot = (P + 1) % K;
            let mut out = F::finish(simd, ring[slot], self.bias);
            if let Some((lo, hi)) = self.clip {
                out = simd.clip(out, lo, hi);
            }
            // A row narrower than a vector runs into the next, which its own step writes
            // later (the last row stores its own columns).
            let at = q * ow + self.j;
            let n = (self.y.len() - at).min(WIDE_COLS);
            // SAFETY: the plane holds n elements from `at` on.
            unsafe { simd.store(self.y.as_mut_ptr().add(at), out, n) };
        }
        ring[(P + 1) % K] = fill;
    }
}

/// Whether window row `a` of step `u` serves an output row (`u - a` in `0..oh`).
#[inline(always)]
fn serves(u: usize, a: usize, oh: usize) -> bool {
    u >= a && u < oh + a
}

/// [`unpadded_planes`] in AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn unpadded_narrow<F: Fold, const K: usize, const S: usize>(
    simd: pulp::x86::V3,
    win: &Windows,
    x: &[f32],
    w: Filters<'_>,
    bias: Option<&[f32]>,
    clip: Option<(f32, f32)>,
    y: &mut [f32],
) {
    unpadded_planes::<_, F, K, S>(simd, win, x, w, bias, clip, y);
}

/// [`unpadded_planes`] in AVX-512 (and the rest of x86-64-v4, as `pulp::x86::V4` has it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512cd,avx512dq,avx512vl")]
fn unpadded_wide<F: Fold, const K: usize, const S: usize>(
    simd: pulp::x86::V4,
    win: &Windows,
    x: &[f32],
    w: Filters<'_>,
    bias: Option<&[f32]>,
    clip: Option<(f32, f32)>,
    y: &mut [f32],
) {
    unpadded_planes::<_, F, K, S>(simd, win, x, w, bias, clip, y);
}

/// [`unpadded`]'s planes for a `K x K` window at stride `S` (whose checks passed), in blocks
/// of `L::N` columns. Inlined into a function compiled for its instructions (above), where a
/// closure inlined into `pulp`'s vectorised call was left out of line (and its intrinsics
/// with it) once its activations and windows made it large.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn unpadded_planes<L: Lanes, F: Fold, const K: usize, const S: usize>(
    simd: L,
    win: &Windows,
    x: &[f32],
    w: Filters<'_>,
    bias: Option<&[f32]>,
    clip: Option<(f32, f32)>,
    y: &mut [f32],
) {
    let cols = L::N;
    let [h, wd] = win.input;
    let [oh, ow] = win.out;
    let [ph, pw] = win.padding;
    let len = oh * ow;
    // Each block column's first load column, and the lanes inside the row of its loads
    // (where they reach into the padding the loads are masked): found once, and read in
    // place, where a copy per block stalled each block's first load on the copy's stores.
    let starts = || block_starts(ow, cols).map(|j| (S * j) as isize - pw as isize);
    let masks: Vec<L::Masks> = starts().map(|s| L::masks(s, wd)).collect();
    let (lo, hi) = clip.map_or((0.0, 0.0), |r| r);
    let (lo, hi) = (simd.splat(lo), simd.splat(hi));
    let wide;
    let fills: &[f32] = match (wd <= ZEROS.len(), F::FILL == 0.0) {
        (true, true) => &ZEROS,
        (true, false) => &NEG_INFINITIES,
        (false, _) => {
            wide = vec![F::FILL; wd];
            &wide
        }
    };
    for (p, plane) in y.chunks_mut(len).enumerate() {
        let xp = &x[p * h * wd..(p + 1) * h * wd];
        // The filter: a 3x3 one splat into registers, a larger one splat as it is used.
        let taps = w.of(p, K * K);
        let mut wt = [[simd.splat(0.0); 3]; 3];
        if K == 3 {
            for (a, row) in wt.iter_mut().enumerate() {
                for (b, v) in row.iter_mut().enumerate() {
                    *v = simd.splat(taps[a * K + b]);
                }
            }
        }
        let b = simd.splat(bias.map_or(0.0, |b| b[p]));
        for i in block_starts(oh, ROWS) {
            // The input rows the band of output rows i .. i + ROWS reads: rows of the
            // padding read the fold's identity (zero products, as in a padded plane).
            let mut rows = [fills.as_ptr(); READ_ROWS];
            for (t, row) in rows.iter_mut().enumerate().take(S * (ROWS - 1) + K) {
                if let Some(r) = (S * i + t).checked_sub(ph).filter(|&r| r < h) {
                    *row = xp[r * wd..].as_ptr();
                }
            }
            for (n, (j, start)) in block_starts(ow, cols).zip(starts()).enumerate() {
                // (At stride two a load takes twice the columns, even and odd.)
                let inside = start >= 0 && start as usize + K - 1 + S * cols <= wd;
                let acc = if inside {
                    unpadded_block::<L, F, K, S, false>(simd, &rows, start, &masks[n], taps, &wt)
                } else {
                    unpadded_block::<L, F, K, S, true>(simd, &rows, start, &masks[n], taps, &wt)
                };
                for (q, s) in acc.into_iter().enumerate() {
                    let mut out = F::finish(simd, s, b);
                    if clip.is_some() {
                        out = simd.clip(out, lo, hi);
                    }
                    // A row narrower than a vector runs into the next, which a later store
                    // writes whole (the last row stores its own columns).
                    let at = (i + q) * ow + j;
                    let n = (plane.len() - at).min(cols);
                    // SAFETY: the plane holds n elements from `at` on.
                    unsafe { simd.store(plane.as_mut_ptr().add(at), out, n) };
                }
            }
        }
    }
}

/// Input rows a block of [`unpadded`] reads, at most: `2 * (ROWS - 1) + 5`.
const READ_ROWS: usize = 2 * ROWS + 3;
// `unpadded_block` unrolls its rows and outputs by these counts.
const _: () = assert!(READ_ROWS == 11 && ROWS == 4);

/// The sums of a block of [`unpadded`]'s `K x K` windows at stride `S` (weights `taps`, row
/// major; a 3x3 window's splat in `wt`) whose input rows start at `rows` (each `wd` or more
/// elements: a row of the plane, or the zero row), its first window column's vectors at
/// column `start` of each: every load masked by its window column's `masks` where `MASKED`,
/// else every load whole vectors inside its row. At stride two a window column's vector is
/// the even elements of two vectors.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn unpadded_block<L: Lanes, F: Fold, const K: usize, const S: usize, const MASKED: bool>(
    simd: L,
    rows: &[*const f32; READ_ROWS],
    start: isize,
    masks: &L::Masks,
    taps: &[f32],
    wt: &[[L::V; 3]; 3],
) -> [L::V; ROWS] {
    let mut acc = [simd.splat(F::FILL); ROWS];
    // The vector of `N` columns from `at`, lanes `half` of window column `b`'s mask.
    let vector = |at: *const f32, b: usize, half: usize| -> L::V {
        let masked = MASKED.then_some((masks, b + half * L::N));
        // SAFETY: masked, the mask's lanes are the columns inside the row (the others are
        // not read); whole, the columns lie inside the row (the caller checked the block's
        // reach).
        unsafe { simd.load(at, masked, F::FILL) }
    };
    // Window column `b`'s vector of input row `row`.
    let load = |row: *const f32, b: usize| -> L::V {
        let at = row.wrapping_offset(start + b as isize);
        if S == 1 {
            return vector(at, b, 0);
        }
        simd.every_other(vector(at, b, 0), vector(at.wrapping_add(L::N), b, 1), false)
    };
    if K == 3 || S == 2 {
        // Input row `t` serves output rows `q` of the block for window rows `t - S * q`:
        // each input vector loaded once for every row it serves, a 3x3 window's weights in
        // registers, a larger one's splat as they are used.
        // Unrolled over the rows (READ_ROWS) and the block's outputs (ROWS), so that which
        // output rows an input row serves, and where their weights are, are known when
        // compiled (a loop tested them on every load). Criterion, one thread, against the
        // loop: 240 planes of 28x28 by 5x5 at stride two 64.6 -> 57.4 us, 192 of 28x28 by 3x3
        // at stride one 36.3 -> 31.0; the others within 5%.
        seq_macro::seq!(T in 0..11 {
            if T < S * (ROWS - 1) + K {
                let row = rows[T];
                // At stride two window columns `c` and `c + 1` are the even and odd elements
                // of the same two loads.
                let mut pair = (simd.splat(0.0), simd.splat(0.0));
                for b in 0..K {
                    let v = match (S, b % 2) {
                        (1, _) => load(row, b),
                        (_, 0) => {
                            let at = row.wrapping_offset(start + b as isize);
                            pair = (vector(at, b, 0), vector(at.wrapping_add(L::N), b, 1));
                            simd.every_other(pair.0, pair.1, false)
                        }
                        _ => simd.every_other(pair.0, pair.1, true),
                    };
                    seq_macro::seq!(Q in 0..4 {
                        if let Some(a) = window_row::<K, S>(T, Q) {
                            let w = match K {
                                3 => wt[a][b],
                                _ => simd.splat(taps[a * K + b]),
                            };
                            acc[Q] = F::tap(simd, w, v, acc[Q]);
                        }
                    });
                }
            }
        });
    } else if MASKED && S == 1 {
        // Larger windows at the edges: each masked load once, kept (in cache) for the taps
        // of every row it serves (a load per product took 20-30% longer per layer; at
        // stride two, with its shuffles, 35% less).
        let mut loaded = [[simd.splat(0.0); K]; READ_ROWS];
        for (vectors, &row) in loaded.iter_mut().zip(rows).take(S * (ROWS - 1) + K) {
            for (b, v) in vectors.iter_mut().enumerate() {
                *v = load(row, b);
            }
        }
        for (a, row) in taps.chunks_exact(K).enumerate() {
            for (b, &tap) in row.iter().enumerate() {
                let tap = simd.splat(tap);
                for (q, s) in acc.iter_mut().enumerate() {
                    *s = F::tap(simd, tap, loaded[S * q + a][b], *s);
                }
            }
        }
    } else {
        // Larger windows tap by tap (their weights outnumber the registers): the sums stay
        // in registers.
        for (a, row) in taps.chunks_exact(K).enumerate() {
            let row: &[f32; K] = row.try_into().expect("a window row");
            for (b, &tap) in row.iter().enumerate() {
                let tap = simd.splat(tap);
                for (q, s) in acc.iter_mut().enumerate() {
                    *s = F::tap(simd, tap, load(rows[S * q + a], b), *s);
                }
            }
        }
    }
    acc
}

/// The window row by which a block's input row `t` serves its output row `q` (`K` rows at
/// stride `S`), where it does.
#[inline(always)]
const fn window_row<const K: usize, const S: usize>(t: usize, q: usize) -> Option<usize> {
    match t.checked_sub(S * q) {
        Some(a) if a < K => Some(a),
        _ => None,
    }
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Planes straight from the input (3x3 and 5x5 windows, stride one and two, 7x7 at
        /// stride one, padding before and after up to beyond the window, planes narrower than
        /// a vector and several vectors wide, a few planes in one call, each its own filter
        /// and bias, the activation clipped in registers or applied after): the reference's
        /// within rounding, at stride one the bits of each plane padded and convolved (the
        /// same products in the same order, the padding's zero), and in AVX-512's blocks the
        /// bits of AVX2's (which leave 7x7 windows alone).
        #[test]
        fn planes_straight_from_the_input_match_the_reference(
            h in 1usize..24, w in 1usize..40, k in 1usize..4, s in 1usize..3,
            planes in 1usize..4,
            ph in 0usize..5, pw in 0usize..5, eh in 0usize..5, ew in 0usize..5,
            act in 0usize..4,
        ) {
            let k = 2 * k + 1;
            let geometry = [[h, w], [k, k], [s, s], [1, 1], [ph, pw], [eh, ew]];
            let Some(win) = Windows::fitting(geometry) else {
                return Ok(());
            };
            prop_assume!(unpadded_suits(&win));
            let a = [
                Activation::None,
                Activation::Relu,
                Activation::Clip { min: Some(-0.5), max: Some(0.5) },
                Activation::Swish { alpha: 1.0 },
            ][act];
            let [oh, ow] = win.out;
            let (x, wt) = (values(planes * h * w, 1), values(planes * k * k, 2));
            let bias = values(planes, 3);
            let mut y = vec![f32::NAN; planes * oh * ow];
            prop_assert!(unpadded(&win, &x, &wt, Some(&bias), a, &mut y));
            // AVX2's blocks of eight where `unpadded` took AVX-512's of sixteen (on a CPU with
            // it and rows of 14 or more; else the same loops again): the same sums in the
            // same order, the same bits. A 7x7 window they refuse, untouched.
            let mut narrow = vec![f32::NAN; y.len()];
            let took = unpadded_with(&win, &x, &wt, Some(&bias), a, &mut narrow, false);
            prop_assert_eq!(took, k != 7);
            for (i, (g, n)) in y.iter().zip(&narrow).enumerate() {
                let want = if took { g.to_bits() } else { f32::NAN.to_bits() };
                prop_assert_eq!(n.to_bits(), want, "element {}", i);
            }
            let mut buf = vec![f32::NAN; win.scratch_len()];
            let mut padded = vec![f32::NAN; oh * ow];
            for p in 0..planes {
                let plane = &x[p * h * w..(p + 1) * h * w];
                let filter = &wt[p * k * k..(p + 1) * k * k];
                let got = &y[p * oh * ow..(p + 1) * oh * ow];
                let want = crate::reference::conv2d(
                    plane, filter, Some(&bias[p..=p]), [1, 1, h, w], 1, [k, k], [s, s],
                    [ph, pw], [1, 1], 1, [oh, ow], a,
                );
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    let tol = 1e-5 * (k * k) as f32 * w.abs().max(1.0);
                    prop_assert!((g - w).abs() <= tol, "plane {} element {}: {} vs {}", p, i, g, w);
                }
                if s == 1 {
                    pad_input(&win, plane, None, Activation::None, &mut buf);
                    prop_assert!(convolve(&win, &buf, filter, bias[p], a, &mut padded));
                    for (i, (g, w)) in got.iter().zip(&padded).enumerate() {
                        prop_assert_eq!(g.to_bits(), w.to_bits(), "plane {} element {}", p, i);
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Poolings straight from the input (2x2 at stride two, 3x3 and 5x5 at stride one or
        /// two, padding before and after, planes narrower and wider than a vector, a few in
        /// one call; maxima of values with NaN and -0 among them, and sums): the bits of the
        /// window loops over each plane padded with the fold's identity, in AVX-512's blocks
        /// and lanes as in AVX2's.
        #[test]
        fn poolings_straight_from_the_input_match_the_window_loops(
            h in 1usize..24, w in 1usize..40, window in 0usize..5, planes in 1usize..4,
            ph in 0usize..5, pw in 0usize..5, eh in 0usize..5, ew in 0usize..5,
            max in proptest::bool::ANY,
        ) {
            let (k, s) = [(2, 2), (3, 1), (3, 2), (5, 1), (5, 2)][window];
            prop_assume!(ph < k && pw < k && eh < k && ew < k);
            let geometry = [[h, w], [k, k], [s, s], [1, 1], [ph, pw], [eh, ew]];
            let Some(win) = Windows::fitting(geometry) else {
                return Ok(());
            };
            prop_assume!(pooled_suits(&win));
            let [oh, ow] = win.out;
            let mut x = values(planes * h * w, 7);
            if max {
                x.iter_mut().step_by(5).for_each(|v| *v = f32::NAN);
                x.iter_mut().skip(1).step_by(2).for_each(|v| *v = -v.abs());
                x.iter_mut().skip(3).step_by(7).for_each(|v| *v = -0.0);
            }
            let mut y = vec![f32::NAN; planes * oh * ow];
            prop_assert!(pooled(&win, &x, max, &mut y));
            let mut narrow = vec![f32::NAN; y.len()];
            prop_assert!(pooled_with(&win, &x, max, &mut narrow, false));
            let fill = if max { f32::NEG_INFINITY } else { 0.0 };
            let (taps, mut buf) = (win.taps(), vec![f32::NAN; win.scratch_len()]);
            let mut want = vec![f32::NAN; oh * ow];
            for p in 0..planes {
                win.pad(&x[p * h * w..(p + 1) * h * w], |v| v, fill, &mut buf);
                win.pool(&taps, &buf, max, |_, _| 1.0, &mut want);
                let got = &y[p * oh * ow..(p + 1) * oh * ow];
                let narrow = &narrow[p * oh * ow..(p + 1) * oh * ow];
                for (i, ((g, n), w)) in got.iter().zip(narrow).zip(&want).enumerate() {
                    prop_assert_eq!(g.to_bits(), w.to_bits(), "plane {} element {}", p, i);
                    prop_assert_eq!(n.to_bits(), w.to_bits(), "plane {} element {}", p, i);
                }
            }
        }
    }

    /// An input bias taken as the streamed kernel loads (ConvNeXt's 7x7 windows, 3x3 and 5x5
    /// on planes one column wide, padding before and after): the bits of each plane padded
    /// after its bias and convolved; windows it does not stream are refused, untouched.
    #[test]
    fn an_input_bias_taken_as_it_loads_gives_the_padded_sums() {
        let mut streamed = 0;
        for (h, w, k) in [
            (20, 20, 7),
            (14, 14, 7),
            (17, 30, 7),
            (14, 14, 3),
            (15, 16, 5),
            (7, 7, 7),
        ] {
            let p = k / 2;
            let geometry = [[h, w], [k, k], [1, 1], [1, 1], [p, p], [p, p]];
            let win = Windows::fitting(geometry).unwrap();
            let [oh, ow] = win.out;
            let planes = 3;
            let (x, wt) = (values(planes * h * w, 8), values(planes * k * k, 9));
            let (bias, in_bias) = (values(planes, 10), values(planes, 11));
            let a = Activation::Clip {
                min: Some(-0.5),
                max: Some(0.5),
            };
            let mut y = vec![f32::NAN; planes * oh * ow];
            let took = unpadded_biased(&win, &x, &wt, Some(&bias), &in_bias, a, &mut y);
            assert_eq!(took, streams(&win), "{win:?}");
            if !took {
                assert!(y.iter().all(|v| v.is_nan()), "{win:?} touched");
                continue;
            }
            streamed += 1;
            let mut buf = vec![f32::NAN; win.scratch_len()];
            let mut want = vec![f32::NAN; oh * ow];
            for p in 0..planes {
                let plane = &x[p * h * w..(p + 1) * h * w];
                pad_input(&win, plane, Some(in_bias[p]), Activation::None, &mut buf);
                let filter = &wt[p * k * k..(p + 1) * k * k];
                assert!(convolve(&win, &buf, filter, bias[p], a, &mut want));
                let got = &y[p * oh * ow..(p + 1) * oh * ow];
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{win:?} plane {p} element {i}");
                }
            }
        }
        assert!(streamed == 5 || !wide_available(), "{streamed} streamed");
    }

    /// Small planes summed in lanes in AVX-512 (7x7 and others of 64 outputs or fewer,
    /// padding above and below of any depth, odd and even sides, a group of sixteen planes
    /// and part of another): the bits of AVX2's blocks, and the reference's within rounding;
    /// planes the lanes do not suit are left to the blocks.
    #[test]
    fn small_planes_summed_in_lanes_match_the_blocks() {
        let mut in_lanes = 0;
        let one = [(7, 7), (4, 4), (8, 8), (9, 7), (4, 13), (10, 6)].map(|hw| (hw, 1));
        let two = [(14, 14), (13, 13), (8, 8), (15, 9), (9, 16), (20, 7)].map(|hw| (hw, 2));
        for ((h, w), s) in one.into_iter().chain(two) {
            for k in [3, 5, 7] {
                for (ph, eh) in [(k / 2, k / 2), (0, k - 1), (k - 1, 0), (1, 4)] {
                    let pw = k / 2;
                    let geometry = [[h, w], [k, k], [s, s], [1, 1], [ph, pw], [eh, k - 1 - pw]];
                    let Some(win) = Windows::fitting(geometry) else {
                        continue;
                    };
                    if !unpadded_suits(&win) {
                        continue;
                    }
                    in_lanes += usize::from(lanes_suit(&win));
                    let [oh, ow] = win.out;
                    // A group of sixteen planes and part of another.
                    let planes = 19;
                    let (x, wt) = (values(planes * h * w, 4), values(planes * k * k, 5));
                    let bias = values(planes, 6);
                    let a = Activation::Clip {
                        min: Some(-0.5),
                        max: Some(0.5),
                    };
                    let mut y = vec![f32::NAN; planes * oh * ow];
                    assert!(unpadded(&win, &x, &wt, Some(&bias), a, &mut y));
                    // The bits of AVX2's blocks, or (7x7, which they leave alone) of the
                    // first plane padded and convolved.
                    let mut narrow = vec![f32::NAN; y.len()];
                    if k == 7 {
                        let mut buf = vec![f32::NAN; win.scratch_len()];
                        pad_input(&win, &x[..h * w], None, Activation::None, &mut buf);
                        assert!(convolve(&win, &buf, &wt[..k * k], bias[0], a, &mut narrow));
                        narrow.truncate(oh * ow);
                    } else {
                        assert!(unpadded_with(
                            &win,
                            &x,
                            &wt,
                            Some(&bias),
                            a,
                            &mut narrow,
                            false
                        ));
                    }
                    for (i, (g, n)) in y.iter().zip(&narrow).enumerate() {
                        assert_eq!(g.to_bits(), n.to_bits(), "{win:?} element {i}");
                    }
                    let want = crate::reference::conv2d(
                        &x[..h * w],
                        &wt[..k * k],
                        Some(&bias[..1]),
                        [1, 1, h, w],
                        1,
                        [k, k],
                        [s, s],
                        [ph, pw],
                        [1, 1],
                        1,
                        [oh, ow],
                        a,
                    );
                    for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
                        let tol = 1e-5 * (k * k) as f32 * w.abs().max(1.0);
                        assert!((g - w).abs() <= tol, "{win:?} element {i}: {g} vs {w}");
                    }
                }
            }
        }
        assert!(in_lanes >= 40, "{in_lanes} planes summed in lanes");
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
        // Straight from the input: a window of another size, an input, filters or biases
        // short of two planes, a partial plane are refused.
        let x = [0.5; 200];
        let (w18, b2) = ([1.0; 18], Some(&[0.0; 2][..]));
        let three_by_five = Windows {
            kernel: [3, 5],
            padding: [1, 2],
            ..base
        };
        assert!(!unpadded(
            &three_by_five,
            &x,
            &[1.0; 30],
            b2,
            none,
            &mut two
        ));
        let stride_three = Windows {
            stride: [3, 3],
            out: [4, 4],
            ..base
        };
        assert!(!unpadded(&stride_three, &x, &w18, b2, none, &mut two[..32]));
        assert!(!unpadded(&base, &x[..199], &w18, b2, none, &mut two));
        assert!(!unpadded(&base, &x, &w18[..17], b2, none, &mut two));
        assert!(!unpadded(&base, &x, &w18, Some(&[0.0][..]), none, &mut two));
        assert!(!unpadded(&base, &x, &w18, b2, none, &mut two[..199]));
        assert!(y.iter().chain(&two).all(|v| v.is_nan()));
        assert!(unpadded(&base, &x, &w18, b2, none, &mut two));
        // The padding's zeros count: a corner reads 4 of 0.5, the middle 9; both planes.
        assert_eq!((two[0], two[55], two[100], two[155]), (2.0, 4.5, 2.0, 4.5));
        assert!(convolve(&base, &buf, &[1.0; 9], 0.0, none, &mut y));
        // The padded plane's zeros count: a corner reads 4 of 0.5, the middle 9.
        assert_eq!((y[0], y[55]), (2.0, 4.5));
        // Each plane's sums, no bias: the second plane's alike.
        assert!(sums(&base, &bufs[..end], pl, &[1.0; 18], &mut two));
        assert_eq!((two[100], two[155]), (2.0, 4.5));
    }
}
