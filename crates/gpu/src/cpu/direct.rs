//! Direct convolution over padded planes: dense convolutions without an im2col matrix
//! (`crate::step::conv` runs the stride-1 ones with small output planes here, where this
//! measured faster than im2col and a packed matrix product).
//!
//! Output element `(o, i, j)` is the sum over `k` of `w[o][k]` times the element that tap `k`
//! (channel `k / taps`, tap `k % taps` of the window) reads for output pixel `(i, j)`. In a
//! padded, phase-split plane (`super::window::Windows::pad`) that element lies at
//! `offset(k) + base(i, j)` with `base(i, j + 1) = base(i, j) + 1`, so sixteen pixels read
//! sixteen consecutive elements for every `k`. A tile of 6 output channels by 16 pixels keeps
//! its 96 sums in twelve AVX2 registers across the inner dimension (per `k`: two loads, six
//! broadcast weights, twelve fused multiply-adds; `pulp` checks for AVX2 and FMA at run time,
//! a portable loop elsewhere), the shape of a packed matrix product's micro-kernel without
//! copying the input nine times over (im2col) or packing it.
//!
//! Pixels are numbered in a position space: output row `i` starts at position `i * len`, and
//! position `q` reads from `(q / len) * step + q % len`. Where output rows lie close together
//! in the padded plane (stride 1), `len` is the plane's row step: the positions between two
//! rows read the padding and are computed and dropped, so a 7x7 plane fills whole tiles; else
//! `len` is the output row rounded up to a tile. The tiles read up to a tile beyond the last
//! position's window: callers leave [`SLACK`] readable elements after the last plane.
//!
//! Each output sums its inner dimension in order, in blocks of 256 (the partial sums go to
//! scratch between blocks), whatever the number of threads: its bits depend on the shapes.

#![allow(unsafe_code)]

use opsched_graph::Activation;
use rayon::prelude::*;

use super::math::{act_of, with_scratch, SharedOut};
use super::window::Taps;
use crate::GpuError;

/// Output channels of a tile.
const ROWS: usize = 6;
/// Pixels (positions) of a tile: two vectors of eight.
const COLS: usize = 16;
/// Inner-dimension elements a tile sums before its sums go back to scratch: its weights
/// (`ROWS x KC`) stay in L1, the inputs they meet (`KC` runs of a block's positions) in L2.
const KC: usize = 256;
/// Positions a task covers at most: `KC` runs of them within 256 KiB.
const BLOCK: usize = 256;
/// Readable elements the planes need after the last one's end (a tile's width).
pub const SLACK: usize = COLS;

/// One dense convolution's geometry over padded planes.
#[derive(Clone, Debug)]
pub struct Direct {
    /// Elements from one padded plane to the next.
    pub plane: usize,
    /// Input channels (of the group).
    pub channels: usize,
    /// Where each tap of a window reads its plane (`super::window::Windows::taps`).
    pub taps: Taps,
    /// Output rows and columns.
    pub out: [usize; 2],
}

/// How output pixels are numbered (module doc): pixel `(i, j)` is position `i * len + j`,
/// read from `(q / len) * step + q % len` plus the tap's offset.
#[derive(Clone, Copy, Debug)]
struct Positions {
    len: usize,
    step: usize,
    /// Positions computed: through the last pixel, rounded up to a tile.
    total: usize,
}

impl Positions {
    fn base(&self, q: usize) -> usize {
        (q / self.len) * self.step + q % self.len
    }
}

impl Direct {
    fn positions(&self) -> Positions {
        // (An empty output, which `convolve` skips, still gets positions: one tile's.)
        let [before, ow] = [self.out[0].saturating_sub(1), self.out[1]];
        let step = self.taps.step;
        let rows = ow.max(1).next_multiple_of(COLS);
        let stitched = before * step + ow;
        let apart = before * rows + ow;
        let (len, last) = if stitched <= apart && step >= ow {
            (step, stitched)
        } else {
            (rows, apart)
        };
        Positions {
            len,
            step,
            total: last.next_multiple_of(COLS).max(COLS),
        }
    }

    /// Elements the tiles read from the start of the first plane: the planes, their slack.
    pub fn reach(&self) -> usize {
        let p = self.positions();
        let last_tap = self.taps.starts.iter().max().copied().unwrap_or(0);
        (self.channels.max(1) - 1) * self.plane + last_tap + p.base(p.total - COLS) + COLS
    }

    /// `y[o] = act(sum_k w[o][k] * tap k + bias[o])` for every output channel `o` (`y`:
    /// `[oc, oh, ow]`, `w`: `[oc, channels * taps]`), reading the padded `planes`
    /// ([`Direct::reach`] elements at least), in parallel tasks of pixels and channels.
    pub fn convolve(
        &self,
        planes: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        a: Activation,
        y: &mut [f32],
    ) -> Result<(), GpuError> {
        let [oh, ow] = self.out;
        let taps = self.taps.starts.len();
        let k = self.channels * taps;
        let pixels = oh * ow;
        if pixels == 0 || y.is_empty() {
            return Ok(());
        }
        let oc = y.len() / pixels;
        let fail = |what: &str| {
            Err(GpuError::Plan(format!(
                "direct convolution {oc}x{k} over {oh}x{ow}: {what}"
            )))
        };
        if y.len() != oc * pixels || w.len() < oc * k || bias.is_some_and(|b| b.len() < oc) {
            return fail("a buffer is shorter than its shape");
        }
        if planes.len() < self.reach() {
            return fail("the planes end before the tiles' reach");
        }
        let offsets: Vec<usize> = (0..k)
            .map(|i| (i / taps) * self.plane + self.taps.starts[i % taps])
            .collect();
        let pos = self.positions();
        // Tasks: blocks of positions, and of output channels where there are few blocks
        // (deep layers: few pixels, many channels), enough to feed every thread.
        let blocks = pos.total.div_ceil(BLOCK);
        let block = pos.total.div_ceil(blocks).next_multiple_of(COLS);
        let threads = rayon::current_num_threads();
        let work = oc * k * pixels;
        let wanted = if work >= 1 << 20 { 2 * threads } else { 1 };
        let parts = wanted.div_ceil(blocks).min(oc.div_ceil(ROWS)).max(1);
        let per = oc.div_ceil(parts).next_multiple_of(ROWS);
        let out = SharedOut(y.as_mut_ptr());
        let task = |t: usize| {
            let (b, p) = (t / parts, t % parts);
            let qs = b * block..((b + 1) * block).min(pos.total);
            let os = p * per..((p + 1) * per).min(oc);
            if qs.is_empty() || os.is_empty() {
                return;
            }
            with_scratch(os.len() * qs.len(), |sums| {
                self.block(planes, &offsets, w, k, pos, qs.clone(), os.clone(), sums);
                // The block's pixels, through bias and activation, into y.
                let rows = qs.start / pos.len..(qs.end.div_ceil(pos.len)).min(oh);
                for (o, row) in os.clone().zip(sums.chunks(qs.len())) {
                    let add = bias.map(|b| b[o]);
                    for i in rows.clone() {
                        // Output row i's pixels among the block's positions.
                        let first = qs.start.max(i * pos.len);
                        let last = qs.end.min(i * pos.len + ow);
                        if first >= last {
                            continue;
                        }
                        let j0 = first - i * pos.len;
                        // SAFETY: pixels (i, j0..j0 + last - first) of channel o lie inside y
                        // (o < oc, i < oh, j < ow: checked above and here); tasks cover
                        // disjoint positions or channels, so no other task writes them, and
                        // no other reference to y is live while the tasks run.
                        let dst = unsafe {
                            std::slice::from_raw_parts_mut(
                                out.at(o * pixels + i * ow + j0),
                                last - first,
                            )
                        };
                        act_of(dst, &row[first - qs.start..last - qs.start], add, a);
                    }
                }
            });
        };
        let tasks = blocks * parts;
        if tasks > 1 {
            (0..tasks).into_par_iter().for_each(task);
        } else {
            task(0);
        }
        Ok(())
    }

    /// The sums of output channels `os` at positions `qs` into `sums` (`os.len() x
    /// qs.len()`), block of [`KC`] after block of the inner dimension.
    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        planes: &[f32],
        offsets: &[usize],
        w: &[f32],
        k: usize,
        pos: Positions,
        qs: std::ops::Range<usize>,
        os: std::ops::Range<usize>,
        sums: &mut [f32],
    ) {
        #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
        if let Some(simd) = pulp::x86::V3::try_new() {
            return simd.vectorize(
                #[inline(always)]
                || {
                    sweep(
                        k,
                        offsets,
                        w,
                        pos,
                        qs,
                        os,
                        sums,
                        #[inline(always)]
                        |acc, at, wr| tile_v3(simd, acc, planes, at, wr),
                    )
                },
            );
        }
        sweep(k, offsets, w, pos, qs, os, sums, |acc, at, wr| {
            tile(acc, planes, at, wr)
        })
    }
}

/// [`Direct::block`]'s loops, `tile` the kernel of one tile (inlined in the caller's context:
/// its vectors).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn sweep(
    k: usize,
    offsets: &[usize],
    w: &[f32],
    pos: Positions,
    qs: std::ops::Range<usize>,
    os: std::ops::Range<usize>,
    sums: &mut [f32],
    tile: impl Fn(&mut [[f32; COLS]; ROWS], Reads<'_>, &[&[f32]; ROWS]),
) {
    let width = qs.len();
    for k0 in (0..k).step_by(KC) {
        let k1 = (k0 + KC).min(k);
        let offs = &offsets[k0..k1];
        let last = offs.iter().max().copied().unwrap_or(0);
        for o in os.clone().step_by(ROWS) {
            // A last partial tile repeats its last channel: those rows compute and store the
            // same sums.
            let rows: [usize; ROWS] = std::array::from_fn(|r| (o + r).min(os.end - 1) - os.start);
            let wr: [&[f32]; ROWS] = std::array::from_fn(|r| {
                let at = (os.start + rows[r]) * k;
                &w[at + k0..at + k1]
            });
            for q in qs.clone().step_by(COLS) {
                let at = q - qs.start;
                let mut acc = [[0.0f32; COLS]; ROWS];
                if k0 > 0 {
                    for (a, &r) in acc.iter_mut().zip(&rows) {
                        a.copy_from_slice(&sums[r * width + at..][..COLS]);
                    }
                }
                let reads = Reads {
                    base: pos.base(q),
                    offs,
                    last,
                };
                tile(&mut acc, reads, &wr);
                for (a, &r) in acc.iter().zip(&rows) {
                    sums[r * width + at..][..COLS].copy_from_slice(a);
                }
            }
        }
    }
}

/// [`tile`] in AVX2 vectors with fused multiply-adds: the sums in twelve registers.
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
#[inline(always)]
fn tile_v3(
    simd: pulp::x86::V3,
    acc: &mut [[f32; COLS]; ROWS],
    x: &[f32],
    Reads { base, offs, last }: Reads<'_>,
    w: &[&[f32]; ROWS],
) {
    use pulp::f32x8;
    let n = offs.len();
    let w: [&[f32]; ROWS] = std::array::from_fn(|r| &w[r][..n]);
    let load =
        |s: &[f32]| -> f32x8 { pulp::cast::<[f32; 8], f32x8>(s[..8].try_into().expect("8")) };
    let mut a: [[f32x8; 2]; ROWS] =
        std::array::from_fn(|r| [load(&acc[r][..8]), load(&acc[r][8..])]);
    // Checked once per tile (`Direct::convolve` checked the planes' length against the
    // furthest tile): every read below lies within x.
    assert!(
        base + last + COLS <= x.len(),
        "a tile reads past its planes"
    );
    let xp = x.as_ptr().wrapping_add(base);
    for (kk, &off) in offs.iter().enumerate() {
        // SAFETY: off <= last, so base + off + COLS <= x.len() (the assertion above): the
        // sixteen elements from xp + off lie inside x; unaligned reads of plain floats.
        let (x0, x1) = unsafe {
            let p = xp.add(off).cast::<f32x8>();
            (p.read_unaligned(), p.add(1).read_unaligned())
        };
        for (ar, wr) in a.iter_mut().zip(&w) {
            let s = simd.splat_f32x8(wr[kk]);
            ar[0] = simd.mul_add_f32x8(s, x0, ar[0]);
            ar[1] = simd.mul_add_f32x8(s, x1, ar[1]);
        }
    }
    for (out, ar) in acc.iter_mut().zip(&a) {
        out[..8].copy_from_slice(&pulp::cast::<f32x8, [f32; 8]>(ar[0]));
        out[8..].copy_from_slice(&pulp::cast::<f32x8, [f32; 8]>(ar[1]));
    }
}

/// Where one tile reads its taps: element `c` of inner index `k` at `base + offs[k] + c`;
/// `last` is the largest of `offs`.
#[derive(Clone, Copy)]
struct Reads<'a> {
    base: usize,
    offs: &'a [usize],
    last: usize,
}

/// `acc[r][c] += w[r][k] * x[base + offs[k] + c]` over `k`, in order (the portable loop:
/// a multiply and an add, where [`tile_v3`] fuses them).
#[inline(always)]
fn tile(
    acc: &mut [[f32; COLS]; ROWS],
    x: &[f32],
    Reads { base, offs, .. }: Reads<'_>,
    w: &[&[f32]; ROWS],
) {
    let n = offs.len();
    let w: [&[f32]; ROWS] = std::array::from_fn(|r| &w[r][..n]);
    let mut a = *acc;
    for (kk, &off) in offs.iter().enumerate() {
        let at = base + off;
        let v: &[f32; COLS] = x[at..at + COLS].try_into().expect("a tile");
        for (ar, wr) in a.iter_mut().zip(&w) {
            let s = wr[kk];
            for (c, &xv) in ar.iter_mut().zip(v) {
                *c += s * xv;
            }
        }
    }
    *acc = a;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::cpu::window::tests::values;
    use crate::cpu::window::{pad_input, Windows};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Any geometry (stride and dilation per axis, uneven padding; rows far apart or
        /// stitched), output channels in and out of whole tiles, inner dimensions over
        /// several blocks of `KC`, and work split across tasks by positions and by channels:
        /// the reference's convolution, and the same bits on one thread as on all.
        #[test]
        fn direct_convolutions_match_the_reference(
            c in 1usize..40, oc in 1usize..20, h in 1usize..24, w in 1usize..40,
            kh in 1usize..4, kw in 1usize..4, sh in 1usize..3, sw in 1usize..3,
            dh in 1usize..3, dw in 1usize..3, ph in 0usize..3, pw in 0usize..3,
            eh in 0usize..3, ew in 0usize..3, relu in proptest::bool::ANY,
        ) {
            let geometry = [[h, w], [kh, kw], [sh, sw], [dh, dw], [ph, pw], [eh, ew]];
            let Some(win) = Windows::fitting(geometry) else {
                return Ok(());
            };
            let [oh, ow] = win.out;
            let (x, wt, bias) = (values(c * h * w, 1), values(oc * c * kh * kw, 2), values(oc, 3));
            let plane = win.scratch_len();
            let mut planes = vec![f32::NAN; c * plane + SLACK];
            for (ci, buf) in planes.chunks_mut(plane).take(c).enumerate() {
                pad_input(&win, &x[ci * h * w..(ci + 1) * h * w], None, Activation::None, buf);
            }
            planes[c * plane..].fill(0.0);
            let d = Direct { plane, channels: c, taps: win.taps(), out: [oh, ow] };
            prop_assert!(d.reach() <= planes.len());
            let a = if relu { Activation::Relu } else { Activation::None };
            let mut y = vec![f32::NAN; oc * oh * ow];
            d.convolve(&planes, &wt, Some(&bias), a, &mut y).unwrap();
            // The reference reads zeros outside the input: the end padding is what its
            // output size implies.
            let want = crate::reference::conv2d(
                &x, &wt, Some(&bias), [1, c, h, w], oc, [kh, kw], [sh, sw], [ph, pw],
                [dh, dw], 1, [oh, ow], a,
            );
            for (i, (&got, &want)) in y.iter().zip(&want).enumerate() {
                let tol = 1e-4 * (c * kh * kw) as f32;
                prop_assert!((got - want).abs() <= tol, "element {}: {} vs {}", i, got, want);
            }
            let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
            let mut alone = vec![f32::NAN; y.len()];
            one.install(|| d.convolve(&planes, &wt, Some(&bias), a, &mut alone)).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&alone), bits(&y));
        }
    }

    /// Planes that end before the tiles' reach are refused, not read past; an empty output
    /// is no work.
    #[test]
    fn short_planes_are_an_error() {
        let win = Windows {
            input: [7, 7],
            kernel: [3, 3],
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            out: [7, 7],
        };
        let d = Direct {
            plane: win.scratch_len(),
            channels: 2,
            taps: win.taps(),
            out: [7, 7],
        };
        let planes = vec![0.0; d.reach() - 1];
        let mut y = vec![0.0; 3 * 49];
        let err = d.convolve(&planes, &[0.0; 3 * 18], None, Activation::None, &mut y);
        assert!(err.unwrap_err().to_string().contains("reach"));
        // An empty output reads and writes nothing.
        for out in [[0, 7], [7, 0]] {
            let empty = Direct { out, ..d.clone() };
            assert!(empty.reach() <= d.reach());
            assert!(empty
                .convolve(&[], &[], None, Activation::None, &mut [])
                .is_ok());
        }
    }
}
