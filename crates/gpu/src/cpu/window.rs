//! Sliding windows over one plane: the CPU's depthwise convolutions and poolings without
//! im2col, and the padded planes the other convolutions read: im2col copies its rows from
//! them (`crate::step::conv`), the direct convolution its tiles' runs (`super::direct`).
//! The plane is copied once into scratch, padded (zeros for a convolution, the
//! reduction's identity for a pooling) and its columns split by phase (column mod the
//! stride), so that a window's tap reads one contiguous run of the padded plane for a whole
//! output row. The inner loops are element-wise over such runs, compiled for AVX2 where the
//! CPU has it (`pulp`, chosen at run time: `with_avx2`); a depthwise convolution at stride one
//! runs in blocks of rows in registers instead (`super::depthwise`).
//!
//! Every output element adds its taps in the window's row-major order, as the reference does;
//! taps on padding add the identity.

use opsched_graph::Activation;

use super::math::{with_act, with_avx2};

/// The windows of one plane: `out` rows and columns of windows of `kernel` taps `dilation`
/// apart, window `(i, j)` starting at row `i * stride[0] - padding[0]` and column
/// `j * stride[1] - padding[1]` of the `input` plane (rows, columns). Every field is at least 1
/// but the padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    pub input: [usize; 2],
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub out: [usize; 2],
}

impl Windows {
    /// Rows and columns of the padded plane: the padding before, the input, and as much after
    /// as the last window reaches.
    pub(crate) fn padded(&self) -> [usize; 2] {
        [0, 1].map(|a| {
            let reach =
                (self.out[a] - 1) * self.stride[a] + (self.kernel[a] - 1) * self.dilation[a];
            (self.padding[a] + self.input[a]).max(reach + 1)
        })
    }

    /// Elements of one phase's run of a padded row.
    fn run_len(&self) -> usize {
        self.padded()[1].div_ceil(self.stride[1])
    }

    /// Elements of the scratch [`Windows::pad`] fills: the phases' runs of every padded row,
    /// and one padded row.
    pub fn scratch_len(&self) -> usize {
        let [rows, cols] = self.padded();
        rows * self.stride[1] * self.run_len() + cols
    }

    /// Fill `buf` (at least [`Windows::scratch_len`] elements) with the padded plane of `x`
    /// (the `input` plane, row-major), each input element through `f`, `fill` elsewhere: row
    /// `r`'s columns of phase `s` (`col % stride[1]`) form run `r * stride[1] + s`.
    pub fn pad(&self, x: &[f32], f: impl Fn(f32) -> f32, fill: f32, buf: &mut [f32]) {
        let avx2 = has_avx2();
        with_avx2(
            #[inline(always)]
            || self.pad_here(x, f, fill, buf, avx2),
        )
    }

    /// [`Windows::pad`] compiled for the vectors the caller's are (`avx2`: [`deinterleave`]
    /// may use AVX2).
    #[inline(always)]
    fn pad_here(&self, x: &[f32], f: impl Fn(f32) -> f32, fill: f32, buf: &mut [f32], avx2: bool) {
        let [h, w] = self.input;
        let [rows, cols] = self.padded();
        let (pw, sw, len) = (self.padding[1], self.stride[1], self.run_len());
        let (runs, row) = buf.split_at_mut(rows * sw * len);
        // Fill, the row through `f`, fill (`pw + w <= cols`): one pass that vectorises.
        let padded_row = |out: &mut [f32], line: &[f32]| {
            out[..pw].fill(fill);
            out[pw..pw + w]
                .iter_mut()
                .zip(line)
                .for_each(|(v, &x)| *v = f(x));
            out[pw + w..].fill(fill);
        };
        for (r, runs) in runs.chunks_mut(sw * len).enumerate() {
            let line = r.checked_sub(self.padding[0]).filter(|&i| i < h);
            let Some(line) = line.map(|i| &x[i * w..(i + 1) * w]) else {
                runs.fill(fill);
                continue;
            };
            if sw == 1 {
                padded_row(runs, line);
                continue;
            }
            if sw == 2 {
                // Even and odd columns straight from the input row (one pass over it): its
                // even elements go to the run of `pw`'s parity, its odd ones to the other.
                let (even, odd) = runs.split_at_mut(len);
                let (a, b) = if pw % 2 == 0 {
                    (even, odd)
                } else {
                    (odd, even)
                };
                let (a_at, b_at) = (pw / 2, pw.div_ceil(2));
                deinterleave(&line[..w / 2 * 2], &mut a[a_at..], &mut b[b_at..], &f, avx2);
                if w % 2 == 1 {
                    a[a_at + w / 2] = f(line[w - 1]);
                }
                for (run, at, n) in [(a, a_at, w.div_ceil(2)), (b, b_at, w / 2)] {
                    run[..at].fill(fill);
                    run[at + n..].fill(fill);
                }
                continue;
            }
            // The padded row once, then each phase's columns gathered from it.
            let row = &mut row[..cols];
            padded_row(row, line);
            for (s, run) in runs.chunks_mut(len).enumerate() {
                let copied = cols.saturating_sub(s).div_ceil(sw).min(len);
                let phase = row[s.min(cols)..].iter().step_by(sw);
                run.iter_mut().zip(phase).for_each(|(v, &x)| *v = x);
                run[copied..].fill(fill);
            }
        }
    }

    /// Where each tap of the windows reads the padded plane ([`Taps`]): the same for every
    /// plane of these windows, so a step computes them once.
    pub fn taps(&self) -> Taps {
        let [kh, kw] = self.kernel;
        let (sw, len) = (self.stride[1], self.run_len());
        let starts = (0..kh * kw)
            .map(|t| {
                let (r, col) = ((t / kw) * self.dilation[0], (t % kw) * self.dilation[1]);
                (r * sw + col % sw) * len + col / sw
            })
            .collect();
        Taps {
            starts,
            step: self.stride[0] * sw * len,
        }
    }

    /// The depthwise convolution of one padded plane (`buf`, [`Windows::pad`] with zeros) into
    /// output planes `y` (`[out]` each, row-major), one per filter of `weights` (`kernel`
    /// taps each, row-major), then `act(. + bias)`; `taps` are these windows' own.
    pub fn convolve(
        &self,
        taps: &Taps,
        buf: &[f32],
        weights: &[f32],
        bias: Option<&[f32]>,
        a: Activation,
        y: &mut [f32],
    ) {
        let [oh, ow] = self.out;
        let planes = y.chunks_mut(oh * ow).zip(weights.chunks(taps.starts.len()));
        // Stride one: blocks of rows in registers (`super::depthwise`), where it suits.
        let rows = super::depthwise::suits(self);
        with_avx2(
            #[inline(always)]
            || {
                for (o, (plane, wt)) in planes.enumerate() {
                    let b = bias.map_or(0.0, |b| b[o]);
                    if rows && super::depthwise::convolve(self, buf, wt, b, a, plane) {
                        continue;
                    }
                    let fold = |acc: f32, x: f32, t: usize| acc + wt[t] * x;
                    self.slide_plane(taps, buf, plane, 0.0, fold);
                    with_act!(a, |f| plane.iter_mut().for_each(|v| *v = f(*v + b)));
                }
            },
        )
    }

    /// The pooling of one padded plane (`buf`, [`Windows::pad`] with `-inf` for a max, zeros
    /// for a sum) into `y` (`[out]`, row-major): each window's max, or its sum divided by
    /// `divisor(i, j)`; `taps` are these windows' own.
    pub fn pool(
        &self,
        taps: &Taps,
        buf: &[f32],
        max: bool,
        divisor: impl Fn(usize, usize) -> f32,
        y: &mut [f32],
    ) {
        with_avx2(
            #[inline(always)]
            || {
                let y = &mut y[..self.out[0] * self.out[1]];
                if max {
                    // `f32::max` as the reference folds it: NaN is never the running max
                    // (it starts at -inf and takes only values above it), so a NaN tap
                    // leaves it as `max` would; a comparison that vectorises to one
                    // instruction.
                    let fold = |m: f32, x: f32, _| if x > m { x } else { m };
                    self.slide_plane(taps, buf, y, f32::NEG_INFINITY, fold);
                    return;
                }
                self.slide_plane(taps, buf, y, 0.0, |s, x, _| s + x);
                for (i, row) in y.chunks_mut(self.out[1]).enumerate() {
                    row.iter_mut()
                        .enumerate()
                        .for_each(|(j, v)| *v /= divisor(i, j));
                }
            },
        )
    }
}

/// Whether [`deinterleave`] may use AVX2 on this CPU.
fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `out[k] = f(row[2k])` for every element of `out` (`row` reaching its last: `2 * out.len()
/// - 1` elements or more): a row's even elements, eight pairs at a time through
/// [`deinterleave`]'s shuffles where the CPU has AVX2, its odd ones dropped.
pub(crate) fn evens(row: &[f32], out: &mut [f32], f: impl Fn(f32) -> f32) {
    let pairs = (row.len() / 2).min(out.len());
    let mut odd = [0.0f32; 64];
    let avx2 = has_avx2();
    for start in (0..pairs).step_by(odd.len()) {
        let n = (pairs - start).min(odd.len());
        let (src, dst) = (&row[2 * start..2 * (start + n)], &mut out[start..start + n]);
        deinterleave(src, dst, &mut odd[..n], &f, avx2);
    }
    for (k, v) in out.iter_mut().enumerate().skip(pairs) {
        *v = f(row[2 * k]);
    }
}

/// `even[k] = f(pairs[2k])` and `odd[k] = f(pairs[2k + 1])` for every pair of `pairs` (an
/// even length); `avx2` ([`has_avx2`]): eight pairs at a time with AVX2's shuffles (the loop
/// of pairs does not vectorise: a padded row copied, then split by it, took 60% of a
/// stride-2 pooling).
#[allow(unsafe_code)]
fn deinterleave(
    pairs: &[f32],
    even: &mut [f32],
    odd: &mut [f32],
    f: impl Fn(f32) -> f32,
    avx2: bool,
) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if avx2 && pairs.len() >= 16 {
        // SAFETY: `avx2` says this CPU has AVX2.
        done = unsafe { deinterleave_avx2(pairs, even, odd, &f) };
    }
    let rest = even[done..].iter_mut().zip(&mut odd[done..]);
    for ((e, o), pair) in rest.zip(pairs[2 * done..].chunks_exact(2)) {
        (*e, *o) = (f(pair[0]), f(pair[1]));
    }
}

/// [`deinterleave`]'s blocks of eight pairs: per 128-bit lane, two shuffles take the even and
/// the odd elements of both halves (`[a0 a2 b0 b2 | a4 a6 b4 b6]`), a permutation puts the
/// lanes' halves in order, `f` runs on them in registers. Returns the pairs done (a multiple
/// of 8).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn deinterleave_avx2(
    pairs: &[f32],
    even: &mut [f32],
    odd: &mut [f32],
    f: impl Fn(f32) -> f32,
) -> usize {
    use std::arch::x86_64::{
        __m256, _mm256_castpd_ps, _mm256_castps_pd, _mm256_permute4x64_pd, _mm256_shuffle_ps,
    };
    let in_order = |v: __m256| -> [f32; 8] {
        let v = _mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(v));
        pulp::cast::<__m256, [f32; 8]>(_mm256_castpd_ps(v)).map(&f)
    };
    let blocks = pairs.chunks_exact(16).zip(even.chunks_exact_mut(8));
    let mut done = 0;
    for ((src, e), o) in blocks.zip(odd.chunks_exact_mut(8)) {
        let a: __m256 = pulp::cast::<[f32; 8], _>(src[..8].try_into().expect("8"));
        let b: __m256 = pulp::cast::<[f32; 8], _>(src[8..].try_into().expect("8"));
        e.copy_from_slice(&in_order(_mm256_shuffle_ps::<0b10_00_10_00>(a, b)));
        o.copy_from_slice(&in_order(_mm256_shuffle_ps::<0b11_01_11_01>(a, b)));
        done += 8;
    }
    done
}

/// Where the taps of some [`Windows`] read their padded plane ([`Windows::taps`]): tap `t`
/// (row-major) of output row `i` starts at `i * step + starts[t]`, and its run holds, at
/// element `j`, the tap of window `(i, j)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taps {
    pub starts: Vec<usize>,
    pub step: usize,
}

/// Windows a stitched run ([`Windows::slide_plane`]) may cover: 4 KiB on the stack.
const STITCHED: usize = 1024;

impl Windows {
    /// [`slide`] over every output row of one output `plane`. Rows shorter than 16 whose windows lie close together
    /// in the padded plane (stride 1: one row apart but for the padding) run as one stitched
    /// run over all rows at once, `step` windows a row, those between rows computed and
    /// dropped: NASNet's and GoogLeNet's 7x7 planes fill the blocks of [`slide`] then.
    #[inline(always)]
    fn slide_plane(
        &self,
        taps: &Taps,
        buf: &[f32],
        plane: &mut [f32],
        init: f32,
        fold: impl Fn(f32, f32, usize) -> f32,
    ) {
        let Taps { starts: taps, step } = taps;
        let (taps, step) = (taps.as_slice(), *step);
        let [oh, ow] = self.out;
        let span = (oh - 1) * step + ow;
        if ow < 16 && oh > 1 && span <= STITCHED.min(2 * oh * ow) {
            let mut run = [0.0f32; STITCHED];
            slide(&mut run[..span], buf, 0, taps, init, &fold);
            for (i, row) in plane.chunks_mut(ow).enumerate() {
                row.copy_from_slice(&run[i * step..i * step + ow]);
            }
            return;
        }
        for (i, row) in plane.chunks_mut(ow).enumerate() {
            slide(row, buf, i * step, taps, init, &fold);
        }
    }
}

/// `row[j] = fold(init, tap 0, tap 1, ...)` over the taps of each window of one output row,
/// tap `t` of window `j` at `buf[base + taps[t] + j]`, each window folding its taps in order:
/// 32, 16 or 8 windows at a time ([`slide_by`]), one at a time in rows shorter than 8.
#[inline(always)]
fn slide(
    row: &mut [f32],
    buf: &[f32],
    base: usize,
    taps: &[usize],
    init: f32,
    fold: impl Fn(f32, f32, usize) -> f32,
) {
    match row.len() {
        32.. => slide_by::<32>(row, buf, base, taps, init, fold),
        16.. => slide_by::<16>(row, buf, base, taps, init, fold),
        8.. => slide_by::<8>(row, buf, base, taps, init, fold),
        _ => {
            for (j, out) in row.iter_mut().enumerate() {
                let taps = taps.iter().enumerate();
                *out = taps.fold(init, |a, (t, &start)| fold(a, buf[base + start + j], t));
            }
        }
    }
}

/// [`slide`] by blocks of `N` windows (`N <= row.len()`), their accumulators in registers
/// across all taps (one load per tap and window, no store until the end); a last partial
/// block is the last `N` windows again (the same values written twice).
#[inline(always)]
fn slide_by<const N: usize>(
    row: &mut [f32],
    buf: &[f32],
    base: usize,
    taps: &[usize],
    init: f32,
    fold: impl Fn(f32, f32, usize) -> f32,
) {
    for j in block_starts(row.len(), N) {
        let mut acc = [init; N];
        for (t, &start) in taps.iter().enumerate() {
            let at = base + start + j;
            let src: &[f32; N] = buf[at..at + N].try_into().expect("N taps");
            for (a, &x) in acc.iter_mut().zip(src) {
                *a = fold(*a, x, t);
            }
        }
        row[j..j + N].copy_from_slice(&acc);
    }
}

/// `0, len, 2 len, ...` below `n`, the last moved back to end at `n` (one block where `n` is
/// below `len`): the first elements of whole blocks of `len` covering `n`, the last overlapping
/// the one before rather than running past the end.
pub(crate) fn block_starts(n: usize, len: usize) -> impl Iterator<Item = usize> {
    (0..n.div_ceil(len)).map(move |b| (b * len).min(n.saturating_sub(len)))
}

/// [`Windows::pad`] for a depthwise convolution: each input element plus its channel's bias
/// left to it, then the input activation (what `im2col` does to the elements it copies).
pub fn pad_input(
    win: &Windows,
    x: &[f32],
    in_bias: Option<f32>,
    pre_act: Activation,
    buf: &mut [f32],
) {
    with_act!(pre_act, |f| match in_bias {
        Some(b) => win.pad(x, |v| f(v + b), 0.0, buf),
        None => win.pad(x, f, 0.0, buf),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `len` values in [-1, 1], a different run for each seed.
    pub(crate) fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    impl Windows {
        /// The windows of an input `[h, w]` with a kernel, stride, dilation, padding before
        /// and padding after (each `[rows, columns]`), where at least one fits.
        pub(crate) fn fitting(
            [input, kernel, stride, dilation, padding, end]: [[usize; 2]; 6],
        ) -> Option<Windows> {
            let span = |a: usize| {
                let reach = dilation[a] * (kernel[a] - 1) + 1;
                let room = input[a] + padding[a] + end[a];
                room.checked_sub(reach).map(|v| v / stride[a] + 1)
            };
            Some(Windows {
                input,
                kernel,
                stride,
                padding,
                dilation,
                out: [span(0)?, span(1)?],
            })
        }
    }

    proptest! {
        /// The padded, phase-split plane gives every tap the element the window reads (the
        /// input element where the window covers one, the fill on padding), and the
        /// convolution (each tap fused where it runs at stride one in blocks of rows) and the
        /// poolings fold exactly those, in the window's order, in rows
        /// of every length the blocks of [`slide`] treat apart (under 8, 8 to 31, 32 and more
        /// with a partial block).
        #[test]
        fn every_window_folds_the_elements_it_covers(
            h in 1usize..7, w in 1usize..45, kh in 1usize..5, kw in 1usize..5,
            sh in 1usize..4, sw in 1usize..4, dh in 1usize..3, dw in 1usize..3,
            ph in 0usize..4, pw in 0usize..4, eh in 0usize..4, ew in 0usize..4,
        ) {
            let geometry = [[h, w], [kh, kw], [sh, sw], [dh, dw], [ph, pw], [eh, ew]];
            let Some(win) = Windows::fitting(geometry) else {
                return Ok(());
            };
            let [oh, ow] = win.out;
            let x = values(h * w, 1);
            let element = |i: usize, j: usize, p: usize, q: usize| {
                let r = (i * sh + p * dh).checked_sub(ph).filter(|&r| r < h);
                let c = (j * sw + q * dw).checked_sub(pw).filter(|&c| c < w);
                r.zip(c).map(|(r, c)| x[r * w + c])
            };
            let mut buf = vec![f32::NAN; win.scratch_len()];
            win.pad(&x, |v| 2.0 * v, 7.0, &mut buf);
            // Taps read the plane's runs, never the row after them.
            let runs = win.scratch_len() - win.padded()[1];
            let taps = win.taps();
            let (starts, step) = (&taps.starts, taps.step);
            for (i, j, t) in (0..oh).flat_map(|i| (0..ow).flat_map(move |j| (0..kh * kw).map(move |t| (i, j, t)))) {
                let at = i * step + starts[t] + j;
                prop_assert!(at < runs);
                let want = element(i, j, t / kw, t % kw).map_or(7.0, |v| 2.0 * v);
                prop_assert_eq!(buf[at], want, "tap {} of window ({}, {})", t, i, j);
            }
            // What each window folds, tap by tap in row-major order (padding: `pad`).
            let folded = |init: f32, pad: f32, fold: &dyn Fn(f32, f32, usize) -> f32| {
                (0..oh * ow)
                    .map(|o| (0..kh * kw).fold(init, |a, t| {
                        fold(a, element(o / ow, o % ow, t / kw, t % kw).unwrap_or(pad), t)
                    }))
                    .collect::<Vec<f32>>()
            };
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let wt = values(2 * kh * kw, 2);
            win.pad(&x, |v| v, 0.0, &mut buf);
            let mut y = vec![f32::NAN; 2 * oh * ow];
            win.convolve(&taps, &buf, &wt, Some(&[0.25, -0.5]), Activation::None, &mut y);
            // Stride one runs in `super::depthwise`'s blocks, each tap one fused multiply-add.
            let fused = crate::cpu::depthwise::suits(&win);
            for (o, plane) in y.chunks(oh * ow).enumerate() {
                let filter = &wt[o * kh * kw..(o + 1) * kh * kw];
                let tap = |a: f32, v: f32, t: usize| match fused {
                    true => filter[t].mul_add(v, a),
                    false => a + filter[t] * v,
                };
                let want: Vec<f32> = folded(0.0, 0.0, &tap)
                    .into_iter()
                    .map(|v| v + [0.25, -0.5][o])
                    .collect();
                prop_assert_eq!(bits(plane), bits(&want));
            }
            let mut y = vec![f32::NAN; oh * ow];
            win.pool(&taps, &buf, false, |i, j| (i + j + 1) as f32, &mut y);
            let sums = folded(0.0, 0.0, &|a, v, _| a + v);
            let want: Vec<f32> = (sums.iter().enumerate())
                .map(|(o, s)| s / (o / ow + o % ow + 1) as f32)
                .collect();
            prop_assert_eq!(bits(&y), bits(&want));
            win.pad(&x, |v| v, f32::NEG_INFINITY, &mut buf);
            win.pool(&taps, &buf, true, |_, _| 1.0, &mut y);
            let want = folded(f32::NEG_INFINITY, f32::NEG_INFINITY, &|a, v, _| a.max(v));
            prop_assert_eq!(bits(&y), bits(&want));
        }
    }
}
