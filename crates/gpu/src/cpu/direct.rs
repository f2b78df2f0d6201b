//! Direct convolution over padded planes: dense convolutions without an im2col matrix
//! (`crate::step::conv` runs its one-group convolutions of more than one tap with small output
//! planes here, where this measured faster than im2col and a packed matrix product); and, with
//! the same tiles, linear layers over a few tokens ([`product_columns`], for
//! `crate::step::gemm`).
//!
//! Output element `(o, i, j)` is the sum over `k` of `w[o][k]` times the element that tap `k`
//! (channel `k / taps`, tap `k % taps` of the window) reads for output pixel `(i, j)`. In a
//! padded, phase-split plane (`super::window::Windows::pad`) that element lies at
//! `offset(k) + base(i, j)`, with `base(i, j) = i * step + j` at any stride. A tile of 16
//! output channels by 6 pixels keeps its 96 sums in twelve AVX2 registers across the inner
//! dimension: per `k`, the panel's row of 16 weights in two vectors ([`pack`] lays the
//! weights out so), each pixel's input element broadcast, twelve fused multiply-adds (`pulp`
//! checks for AVX2 and FMA at run time, a portable loop elsewhere). Any six pixels make a
//! tile, so nothing is computed and dropped but the last tile's repeats; nor is the input
//! copied nine times over (im2col) or packed. Where the CPU has AVX-512 (`wide`), its 32
//! registers hold a tile of four panels by 6 pixels (each input element broadcast once for
//! 64 channels; a task's last pixels in a tile as wide as they are, not repeated), and for a
//! linear layer one panel by 16 tokens (the weights read once); the same fused multiply-adds
//! in the same order, so the same bits. (The 16 x 6 tile itself compiled for AVX-512
//! measured no faster on the Zen 4 cores of 2026-11-28, whose 512-bit operations take two
//! passes.)
//!
//! Each output sums its inner dimension in order, in blocks (of 256 in AVX2, `KC`; of equal
//! length up to 1024 in AVX-512, `WIDE_KC`; the partial sums go to scratch between blocks),
//! whatever the number of threads: its bits depend on the shapes, not on the blocks.

#![allow(unsafe_code)]

use std::ops::Range;

use opsched_graph::Activation;
use rayon::prelude::*;

use super::math::{
    aligned_part, bias_act_each, bias_act_row, transpose8, with_avx2, with_scratch, SharedOut,
};
use super::window::Taps;
use crate::GpuError;

/// Output channels of a panel ([`pack`]) and of a tile: two vectors of eight.
pub const LANES: usize = 16;
/// Output pixels of a tile: its 2 x 6 vectors of sums fill twelve of the sixteen AVX2
/// registers.
const PIXELS: usize = 6;
/// Inner-dimension elements an AVX2 tile sums before its sums go back to scratch: its panel
/// rows (`KC x LANES`, 16 KiB) stay in L1.
const KC: usize = 256;
/// The inner-dimension block of the AVX-512 tiles, at most: their four panels' rows for it
/// (256 KiB) stay in L2, which feeds them as fast as the fused multiply-adds take them, so
/// fewer, longer blocks win (each block reloads and stores the tile's sums). The blocks are
/// of equal length ([`blocks_of`]). Zen 5, one thread, 2026-11-29: ResNet-18's 3x3 layers and
/// a 1024 -> 2048 pointwise layer 5-10% faster than blocks of 256.
const WIDE_KC: usize = 1024;
/// Panel rows (64 bytes each) the weights are fetched ahead of their use: a linear layer's
/// come from memory, a model's weights being larger than the caches.
const AHEAD: usize = 32;
/// Panels a task of the AVX-512 tiles covers ([`products`]): a tile of four panels by
/// [`PIXELS`] pixels keeps its 24 vectors of sums in 32 registers.
const GROUP: usize = 4;
/// Output pixels a task covers at most.
const CHUNK: usize = 32 * PIXELS;

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

/// A convolution's weights `w` (`[oc, k]` row-major, `k` = channels x taps, rows `ld >= k`
/// apart) in panels of [`LANES`] output channels, `[oc / LANES][k][LANES]` (the last panel's
/// missing channels zero): the weights a tile multiplies by one input element are one row of
/// its panel.
pub fn pack(w: &[f32], oc: usize, k: usize, ld: usize) -> Vec<f32> {
    let mut panels = vec![0.0; panels_len(oc, k)];
    for (o, row) in w.chunks(ld.max(1)).take(oc).enumerate() {
        let panel = &mut panels[(o / LANES) * k * LANES..];
        for (kk, &v) in row.iter().take(k).enumerate() {
            panel[kk * LANES + o % LANES] = v;
        }
    }
    panels
}

/// Elements of [`pack`]'s panels for `oc` output channels.
pub fn panels_len(oc: usize, k: usize) -> usize {
    oc.div_ceil(LANES) * k * LANES
}

impl Direct {
    /// Elements the tiles read from the start of the first plane: up to the last pixel's
    /// furthest tap.
    pub fn reach(&self) -> usize {
        let [oh, ow] = self.out;
        if oh == 0 || ow == 0 {
            return 0;
        }
        let last_tap = self.taps.starts.iter().max().copied().unwrap_or(0);
        (self.channels.max(1) - 1) * self.plane + last_tap + (oh - 1) * self.taps.step + ow
    }

    /// `y[o] = act(sum_k w[o][k] * tap k + bias[o])` for every output channel `o` (`y`:
    /// `[oc, oh, ow]`; `panels`: the weights [`pack`]ed), reading the padded `planes`
    /// ([`Direct::reach`] elements at least).
    pub fn convolve(
        &self,
        planes: &[f32],
        panels: &[f32],
        bias: Option<&[f32]>,
        a: Activation,
        y: &mut [f32],
    ) -> Result<(), GpuError> {
        self.convolve_with(1, planes, panels, bias, a, y, true)
    }

    /// [`Direct::convolve`] of `groups` groups side by side, in parallel: group `g` reads the
    /// `channels` planes from plane `g * channels` on, and its weights, biases and output
    /// channels are the `g`th of `groups` equal parts of `panels`, `bias` and `y` (each
    /// group's outputs whole panels).
    pub fn convolve_groups(
        &self,
        groups: usize,
        planes: &[f32],
        panels: &[f32],
        bias: Option<&[f32]>,
        a: Activation,
        y: &mut [f32],
    ) -> Result<(), GpuError> {
        self.convolve_with(groups, planes, panels, bias, a, y, true)
    }

    /// [`Direct::convolve_groups`], in AVX-512 only where `wide` allows it (the tests run
    /// both): the taps' offsets found once for every group.
    #[allow(clippy::too_many_arguments)]
    fn convolve_with(
        &self,
        groups: usize,
        planes: &[f32],
        panels: &[f32],
        bias: Option<&[f32]>,
        a: Activation,
        y: &mut [f32],
        wide: bool,
    ) -> Result<(), GpuError> {
        let taps = self.taps.starts.len();
        let k = self.channels * taps;
        let offsets: Vec<usize> = (0..k)
            .map(|i| (i / taps) * self.plane + self.taps.starts[i % taps])
            .collect();
        let groups = groups.max(1);
        if groups == 1 {
            return self.convolve_group(&offsets, planes, panels, bias, a, y, wide);
        }
        let parts = [y.len(), panels.len(), bias.map_or(0, <[f32]>::len)];
        if parts.iter().any(|len| len % groups != 0) {
            return Err(GpuError::Plan(format!(
                "direct convolution in {groups} groups: a buffer is not of their shape"
            )));
        }
        let [ylen, wlen, blen] = parts.map(|len| len / groups);
        let group_planes = self.channels * self.plane;
        y.par_chunks_mut(ylen.max(1))
            .enumerate()
            .try_for_each(|(g, yg)| {
                let planes = planes.get(g * group_planes..).unwrap_or_default();
                let panels = &panels[g * wlen..(g + 1) * wlen];
                let bias = bias.map(|b| &b[g * blen..(g + 1) * blen]);
                self.convolve_group(&offsets, planes, panels, bias, a, yg, wide)
            })
    }

    /// One group of [`Direct::convolve_with`]: the taps of its inner dimension at `offsets`
    /// from each pixel's place in `planes`.
    #[allow(clippy::too_many_arguments)]
    fn convolve_group(
        &self,
        offsets: &[usize],
        planes: &[f32],
        panels: &[f32],
        bias: Option<&[f32]>,
        a: Activation,
        y: &mut [f32],
        wide: bool,
    ) -> Result<(), GpuError> {
        let [oh, ow] = self.out;
        let k = offsets.len();
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
        if y.len() != oc * pixels || bias.is_some_and(|b| b.len() < oc) {
            return fail("a buffer is not of its shape");
        }
        let base = |q: usize| (q / ow) * self.taps.step + q % ow;
        let out = SharedOut(y.as_mut_ptr());
        let store = |b: usize, qs: Range<usize>, sums: &[f32]| {
            // The sums, pixel-major, into each channel's row, through bias and activation.
            let used = LANES.min(oc - b * LANES);
            if pixels == 1 {
                // One pixel (a squeeze-and-excitation's layers): the panel's channels are
                // side by side in y, through bias and activation in one pass, not a call
                // per channel.
                // SAFETY: channels b * LANES .. + used lie inside y (y.len() == oc, checked
                // above); each panel is stored once, by one task, and no other reference to
                // y is live meanwhile.
                let ys = unsafe { std::slice::from_raw_parts_mut(out.at(b * LANES), used) };
                ys.copy_from_slice(&sums[..used]);
                bias_act_each(ys, bias.map(|bs| &bs[b * LANES..b * LANES + used]), a);
                return;
            }
            let mut rows: [&mut [f32]; LANES] = std::array::from_fn(|l| {
                if l >= used {
                    return &mut [][..];
                }
                // SAFETY: channel o's pixels qs lie inside y (o < oc, qs.end <= pixels,
                // y.len() == oc * pixels: checked above); each (panel, pixels) pair is
                // stored once, by one task, and no other reference to y is live meanwhile.
                unsafe {
                    let o = b * LANES + l;
                    std::slice::from_raw_parts_mut(out.at(o * pixels + qs.start), qs.len())
                }
            });
            unpack_sums(sums, &mut rows[..used]);
            for (l, row) in rows[..used].iter_mut().enumerate() {
                bias_act_row(row, bias.map(|bs| bs[b * LANES + l]), a);
            }
        };
        products(planes, offsets, base, pixels, panels, oc, store, wide)
            .map_err(|what| GpuError::Plan(format!("direct convolution {oc}x{k}: {what}")))
    }
}

/// One tap's rows of a convolution's panels (`panels`: [`pack`]ed for `oc` outputs by `c`
/// channels of `taps` taps; the tap's rows `ch * taps + tap`) into `out` as [`pack`] lays out
/// `oc` outputs by `c` inputs: whole 64-byte rows, so a tap reads only its own weights where
/// the weights in their own layout lie 4 * `taps` bytes apart (every line of them for one
/// tap).
pub fn tap_panels(panels: &[f32], [oc, c, taps]: [usize; 3], tap: usize, out: &mut [f32]) {
    let k = c * taps;
    let n = oc.div_ceil(LANES);
    panels
        .par_chunks_exact(k * LANES)
        .zip(out.par_chunks_exact_mut(c * LANES))
        .take(n)
        .for_each(|(src, dst)| {
            for (ch, row) in dst.chunks_exact_mut(LANES).enumerate() {
                let at = (ch * taps + tap) * LANES;
                row.copy_from_slice(&src[at..at + LANES]);
            }
        });
}

/// The products of `panels` ([`pack`]ed for `oc` outputs by `k` inputs) with `n` columns of
/// `x` (element `kk` of column `q` at `x[kk * rs + q]`), handed to `store(panel, columns,
/// sums)` as [`Direct::convolve`]'s tiles hand theirs (pixel-major, [`LANES`] a column): the
/// same tiles, tasks and bits.
pub fn product_rows(
    panels: &[f32],
    [oc, k, n]: [usize; 3],
    x: &[f32],
    rs: usize,
    store: impl Fn(usize, Range<usize>, &[f32]) + Sync,
) -> Result<(), GpuError> {
    let offsets: Vec<usize> = (0..k).map(|kk| kk * rs).collect();
    products(x, &offsets, |q| q, n, panels, oc, store, true)
        .map_err(|what| GpuError::Plan(format!("panel product {oc}x{k}x{n}: {what}")))
}

/// Lane `l` of each pixel's sums (`sums`: pixel-major, [`LANES`] a pixel) into `rows[l]`, one
/// element a pixel: eight pixels of eight lanes at a time through a transpose, where lane by
/// lane each element was a load of its own.
fn unpack_sums(sums: &[f32], rows: &mut [&mut [f32]]) {
    // In AVX2 code, so that the transpose's intrinsics inline (they were calls, 1.4x slower).
    with_avx2(
        #[inline(always)]
        || {
            let n = sums.len() / LANES;
            let whole = n - n % 8;
            for p0 in (0..whole).step_by(8) {
                for (half, rows) in rows.chunks_mut(8).enumerate() {
                    let block: [[f32; 8]; 8] = std::array::from_fn(|i| {
                        let at = (p0 + i) * LANES + half * 8;
                        sums[at..at + 8].try_into().expect("eight lanes")
                    });
                    for (row, lane) in rows.iter_mut().zip(&transpose8(block)) {
                        row[p0..p0 + 8].copy_from_slice(lane);
                    }
                }
            }
            for (p, px) in sums.chunks_exact(LANES).enumerate().skip(whole) {
                for (row, &v) in rows.iter_mut().zip(px) {
                    row[p] = v;
                }
            }
        },
    )
}

/// `C = alpha * W * B` for a constant `W` (`m x k`, [`pack`]ed into `panels`) and a `B` of a
/// few columns (a linear layer over a few tokens), C column-major (`ldc` apart): column `j` of
/// B is element `kk` at `b[j * cs + kk * rs]`. The weights stream through once, a panel a
/// task, where a packed product would gather and pack them on every run; in AVX-512 where the
/// CPU has it (`wide`), with the same bits.
pub fn product_columns(
    panels: &[f32],
    mkn: [usize; 3],
    b: &[f32],
    strides: [usize; 2],
    c: &mut [f32],
    ldc: usize,
    alpha: f32,
) -> Result<(), GpuError> {
    columns(panels, mkn, b, strides, c, ldc, alpha, true)
}

/// [`product_columns`], in AVX-512 only where `wide` allows it (the tests run both).
#[allow(clippy::too_many_arguments)]
fn columns(
    panels: &[f32],
    [m, k, n]: [usize; 3],
    b: &[f32],
    [rs, cs]: [usize; 2],
    c: &mut [f32],
    ldc: usize,
    alpha: f32,
    wide: bool,
) -> Result<(), GpuError> {
    let fail = |what: &str| Err(GpuError::Plan(format!("panel product {m}x{k}x{n}: {what}")));
    #[cfg(not(target_arch = "x86_64"))]
    let _ = wide;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if ldc < m || c.len() < (n - 1) * ldc + m {
        return fail("C is shorter than its shape");
    }
    let out = SharedOut(c.as_mut_ptr());
    let store = |blk: usize, js: Range<usize>, sums: &[f32]| {
        let rows = blk * LANES..((blk + 1) * LANES).min(m);
        for (j, s) in js.zip(sums.chunks(LANES)) {
            // SAFETY: rows of column j lie inside c (rows.end <= m <= ldc, j < n: checked
            // above); each (panel, columns) pair is stored once, by one task, and no other
            // reference to c is live meanwhile.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(out.at(j * ldc + rows.start), rows.len()) };
            dst.iter_mut().zip(s).for_each(|(d, &v)| *d = alpha * v);
        }
    };
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V4::try_new().filter(|_| wide) {
        let reach = (n - 1).saturating_mul(cs);
        if k > 0 && reach.saturating_add((k - 1).saturating_mul(rs)) >= b.len() {
            return fail("B ends before the tiles' reach");
        }
        if panels.len() != panels_len(m, k) {
            return fail("the weights are not of their shape");
        }
        wide::product_columns(simd, panels, [m, k, n], b, [rs, cs], store);
        return Ok(());
    }
    let offsets: Vec<usize> = (0..k).map(|kk| kk * rs).collect();
    // Never the grouped AVX-512 tiles: `wide::product_columns` ran where they would.
    products(b, &offsets, |j| j * cs, n, panels, m, store, false)
        .map_err(|what| GpuError::Plan(format!("panel product {m}x{k}x{n}: {what}")))
}

/// The length of the blocks that split an inner dimension of `k` into as few of equal length
/// (the last perhaps shorter) as keep each within `most`.
fn blocks_of(k: usize, most: usize) -> usize {
    k.div_ceil(k.div_ceil(most).max(1)).max(1)
}

/// How many chunks [`products`] splits `pixels` into, given `blocks` groups of panels: at
/// least enough that none is longer than [`CHUNK`] (their ends rounded to whole tiles by
/// [`aligned_part`]) and, where the work is split (`wanted` tasks or more), a whole number
/// of rounds of the `threads`: a 28x28 plane of two panels in 6 chunks on 2 threads, where
/// 5 left one thread 3 of them.
fn pixel_chunks(pixels: usize, blocks: usize, wanted: usize, threads: usize) -> usize {
    let mut chunks = wanted
        .div_ceil(blocks)
        .max(pixels.div_ceil(CHUNK - PIXELS))
        .max(1);
    if wanted > 1 {
        while !(blocks * chunks).is_multiple_of(threads.max(1)) {
            chunks += 1;
        }
    }
    chunks
}

/// The shared loops of [`Direct::convolve`] and [`product_columns`]: for every panel of 16
/// of the `oc` outputs and every pixel `q` below `pixels`, the sums over `k` of the panel's
/// row `k` times `x[base(q) + offsets[k]]`, handed to `store(panel, pixels, sums)`
/// (pixel-major, [`LANES`] a pixel) once per task; tasks of a panel (of up to [`GROUP`]
/// panels in AVX-512, where `wide` allows it and the CPU has it) and up to [`CHUNK`] pixels,
/// in parallel. `base` must not decrease.
#[allow(clippy::too_many_arguments)]
fn products(
    x: &[f32],
    offsets: &[usize],
    base: impl Fn(usize) -> usize + Sync,
    pixels: usize,
    panels: &[f32],
    oc: usize,
    store: impl Fn(usize, Range<usize>, &[f32]) + Sync,
    wide: bool,
) -> Result<(), &'static str> {
    let k = offsets.len();
    if pixels == 0 || oc == 0 {
        return Ok(());
    }
    if panels.len() != panels_len(oc, k) {
        return Err("the weights are not of their shape");
    }
    let furthest = base(pixels - 1) + offsets.iter().max().copied().unwrap_or(0);
    if furthest >= x.len() {
        return Err("the input ends before the tiles' reach");
    }
    // The AVX-512 tiles, where `wide` allows them and the CPU has them.
    #[cfg(target_arch = "x86_64")]
    let wide = pulp::x86::V4::try_new().filter(|_| wide);
    #[cfg(not(target_arch = "x86_64"))]
    let wide = {
        let _ = wide;
        None::<()>
    };
    // Tasks: a group of panels and a chunk of pixels each, enough to feed every thread.
    let group = if wide.is_some() { GROUP } else { 1 };
    let threads = rayon::current_num_threads();
    let wanted = if oc * k * pixels >= 1 << 20 {
        2 * threads
    } else {
        1
    };
    // Groups of panels as even as they can be; where the work is split and groups of three
    // panels or more allow it, as many as whole rounds of the threads: 20 panels in 6 groups
    // of 4 and 3 on 2 threads, where 5 groups of 4 left one thread 3 of them. (Groups of two
    // measured slower than the imbalance they mend: their tiles load a weight vector for
    // every 6 multiply-adds, not 4 for 24.)
    let all = oc.div_ceil(LANES);
    let mut blocks = all.div_ceil(group);
    let rounds = blocks.next_multiple_of(threads);
    if wanted > 1 && group > 1 && blocks >= threads && all / rounds >= group - 1 {
        blocks = rounds;
    }
    // Group b's panels.
    let group_of = |b: usize| (b * all / blocks, (b + 1) * all / blocks);
    let chunks = pixel_chunks(pixels, blocks, wanted, threads);
    let task = |t: usize| {
        let (b, c) = (t % blocks, t / blocks);
        let qs = aligned_part(pixels, chunks, PIXELS, c);
        let n = qs.len();
        if n == 0 {
            return;
        }
        // Each pixel's place in x, once per task.
        let mut at = [0usize; CHUNK];
        at.iter_mut()
            .zip(qs.clone())
            .for_each(|(a, q)| *a = base(q));
        let at = &at[..n];
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = wide {
            let (first, end) = group_of(b);
            let count = end - first;
            let group = &panels[first * k * LANES..(first + count) * k * LANES];
            return with_scratch(count * n * LANES, |sums| {
                wide::sweep(simd, x, offsets, group, at, sums);
                for (i, part) in sums.chunks(n * LANES).enumerate() {
                    store(first + i, qs.clone(), part);
                }
            });
        }
        let panel = &panels[b * k * LANES..(b + 1) * k * LANES];
        with_scratch(n * LANES, |sums| {
            #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
            if let Some(simd) = pulp::x86::V3::try_new() {
                simd.vectorize(
                    #[inline(always)]
                    || {
                        sweep(x, offsets, panel, at, sums, |acc, bases, offs, w| {
                            tile_v3(simd, acc, x, bases, offs, w)
                        })
                    },
                );
            } else {
                sweep(x, offsets, panel, at, sums, |acc, bases, offs, w| {
                    tile(acc, x, bases, offs, w)
                });
            }
            #[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
            sweep(x, offsets, panel, at, sums, |acc, bases, offs, w| {
                tile(acc, x, bases, offs, w)
            });
            store(b, qs.clone(), &sums[..n * LANES]);
        });
    };
    let tasks = blocks * chunks;
    // Work too small to split runs its tasks (chunks of at most CHUNK pixels) in turn.
    if tasks > 1 && wanted > 1 {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
    Ok(())
}

/// One task's loops: blocks of [`KC`] of the inner dimension (`offsets`, the panel's rows),
/// tiles of [`PIXELS`] of the pixels at `at` (where each starts in a plane) in each, their
/// sums pixel-major in `sums` ([`LANES`] a pixel); `tile` the kernel (inlined in the
/// caller's context: its vectors).
#[inline(always)]
fn sweep(
    planes: &[f32],
    offsets: &[usize],
    panel: &[f32],
    at: &[usize],
    sums: &mut [f32],
    tile: impl Fn(&mut [[f32; LANES]; PIXELS], [usize; PIXELS], &[usize], &[f32]),
) {
    let n = at.len();
    for k0 in (0..offsets.len()).step_by(KC) {
        let k1 = (k0 + KC).min(offsets.len());
        let offs = &offsets[k0..k1];
        let last = offs.iter().max().copied().unwrap_or(0);
        let w = &panel[k0 * LANES..k1 * LANES];
        for i in (0..n).step_by(PIXELS) {
            // A last partial tile repeats its last pixel (computed, not stored).
            let bases: [usize; PIXELS] = std::array::from_fn(|p| at[(i + p).min(n - 1)]);
            let sums = &mut sums[i * LANES..((i + PIXELS) * LANES).min(n * LANES)];
            let mut acc = [[0.0f32; LANES]; PIXELS];
            if k0 > 0 {
                for (a, s) in acc.iter_mut().zip(sums.chunks(LANES)) {
                    a.copy_from_slice(s);
                }
            }
            // Checked once per tile (`convolve` checked the planes' length against the last
            // pixel's furthest tap): every read of the kernel lies in the planes.
            let furthest = bases.iter().max().copied().unwrap_or(0) + last;
            assert!(furthest < planes.len(), "a tile reads past its planes");
            tile(&mut acc, bases, offs, w);
            for (a, s) in acc.iter().zip(sums.chunks_mut(LANES)) {
                s.copy_from_slice(a);
            }
        }
    }
}

/// `acc[p][l] += w[k][l] * x[bases[p] + offs[k]]` over `k`, in order, in AVX2 vectors with
/// fused multiply-adds: the sums in twelve registers. The caller checked that every
/// `bases[p] + offs[k]` lies inside `x`.
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
#[inline(always)]
fn tile_v3(
    simd: pulp::x86::V3,
    acc: &mut [[f32; LANES]; PIXELS],
    x: &[f32],
    bases: [usize; PIXELS],
    offs: &[usize],
    w: &[f32],
) {
    use pulp::f32x8;
    let load = |s: &[f32]| -> f32x8 { pulp::cast::<[f32; 8], f32x8>(s.try_into().expect("8")) };
    let mut a: [[f32x8; 2]; PIXELS] =
        std::array::from_fn(|p| [load(&acc[p][..8]), load(&acc[p][8..])]);
    let xs: [*const f32; PIXELS] = std::array::from_fn(|p| x.as_ptr().wrapping_add(bases[p]));
    for (&off, wk) in offs.iter().zip(w.chunks_exact(LANES)) {
        fetch_ahead(wk.as_ptr());
        let (w0, w1) = (load(&wk[..8]), load(&wk[8..]));
        for (ap, xp) in a.iter_mut().zip(&xs) {
            // SAFETY: bases[p] + off lies inside x (the caller's check).
            let s = simd.splat_f32x8(unsafe { *xp.add(off) });
            ap[0] = simd.mul_add_f32x8(s, w0, ap[0]);
            ap[1] = simd.mul_add_f32x8(s, w1, ap[1]);
        }
    }
    for (out, ap) in acc.iter_mut().zip(&a) {
        out[..8].copy_from_slice(&pulp::cast::<f32x8, [f32; 8]>(ap[0]));
        out[8..].copy_from_slice(&pulp::cast::<f32x8, [f32; 8]>(ap[1]));
    }
}

/// Fetch the panel row [`AHEAD`] rows after `row` into the cache (nothing where the CPU has
/// no such hint): a linear layer's weights come from memory.
#[inline(always)]
fn fetch_ahead(row: *const f32) {
    // SAFETY: a prefetch does not fault, wherever it points.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(AHEAD * LANES).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// [`tile_v3`]'s sums as a multiply and an add (the portable loop).
#[inline(always)]
fn tile(
    acc: &mut [[f32; LANES]; PIXELS],
    x: &[f32],
    bases: [usize; PIXELS],
    offs: &[usize],
    w: &[f32],
) {
    for (&off, wk) in offs.iter().zip(w.chunks_exact(LANES)) {
        for (ap, &b) in acc.iter_mut().zip(&bases) {
            let v = x[b + off];
            ap.iter_mut().zip(wk).for_each(|(s, &wl)| *s += v * wl);
        }
    }
}

/// The tiles where the CPU has AVX-512 (Zen 4, Sapphire Rapids): a panel's 16 rows are one
/// 512-bit vector and there are 32 registers, against AVX2's 16 holding a tile of 16 rows by
/// 6 pixels. [`product_columns`] takes one panel by 16 columns (16 tokens took AVX2 three
/// tiles, the last a third wasted, each reading the panel again: the weights now stream
/// through once, fetched ahead, [`super::AHEAD`]); a convolution ([`sweep`]) four panels by 6
/// pixels, each input element broadcast once for 64 channels. The sums are the same fused
/// multiply-adds in the same order as [`tile_v3`]'s, so the bits are too.
#[cfg(target_arch = "x86_64")]
mod wide {
    use pulp::{f32x16, x86::V4};
    use rayon::prelude::*;

    use super::{blocks_of, fetch_ahead, GROUP, LANES, PIXELS, WIDE_KC};
    use std::ops::Range;

    use crate::cpu::math::{with_scratch, Mat};

    /// Columns of a tile.
    const COLS: usize = 16;

    /// `product_columns`' loops, each (panel, tile of columns) handed to `store` as
    /// `super::products` hands its sums; the caller checked the shapes (`b` holds every
    /// column's `k` elements, `panels` is `pack`ed for `m x k`).
    pub(super) fn product_columns(
        simd: V4,
        panels: &[f32],
        [m, k, n]: [usize; 3],
        b: &[f32],
        [rs, cs]: [usize; 2],
        store: impl Fn(usize, Range<usize>, &[f32]) + Sync,
    ) {
        let tiles = n.div_ceil(COLS);
        let blocks = m.div_ceil(LANES);
        // B's columns tile by tile, each `[k][width]` (`width` the tile's columns rounded up
        // to four, the missing ones zero): a tile's elements at one `kk` side by side.
        let width = |t: usize| (n - t * COLS).min(COLS).next_multiple_of(4);
        let start = |t: usize| t * COLS * k;
        with_scratch(start(tiles - 1) + width(tiles - 1) * k, |bt| {
            for t in 0..tiles {
                let w = width(t);
                let cols = t * COLS..(t * COLS + w).min(n);
                gather_columns(b, cols, [rs, cs], k, &mut bt[start(t)..start(t) + w * k]);
            }
            let bt = &*bt;
            // A panel's tiles one after another, so that its weights come from memory once
            // and from cache for its other tiles (tile after tile over every panel streamed
            // the weights once per tile: CLIP's vision encoder, 50 tokens in four tiles,
            // 11.50 -> 10.10 ms on one thread, 6.76 -> 5.31 on two, three processes each).
            let task = |i: usize| {
                let (blk, t) = (i / tiles, i % tiles);
                let panel = &panels[blk * k * LANES..(blk + 1) * k * LANES];
                let x = &bt[start(t)..start(t) + width(t) * k];
                let mut sums = [[0.0f32; LANES]; COLS];
                match width(t) {
                    4 => tile::<4>(simd, panel, x, &mut sums),
                    8 => tile::<8>(simd, panel, x, &mut sums),
                    12 => tile::<12>(simd, panel, x, &mut sums),
                    _ => tile::<16>(simd, panel, x, &mut sums),
                }
                let cols = t * COLS..((t + 1) * COLS).min(n);
                store(
                    blk,
                    cols.clone(),
                    &sums.as_flattened()[..cols.len() * LANES],
                );
            };
            let tasks = blocks * tiles;
            if m * k * n >= 1 << 20 {
                (0..tasks).into_par_iter().for_each(task);
            } else {
                (0..tasks).for_each(task);
            }
        })
    }

    /// B's columns `cols` (element `kk` of column `j` at `b[j * cs + kk * rs]`) side by side
    /// into `bt`, `[k][w]` (`w` = `bt.len() / k`, at least `cols.len()`; the columns past
    /// `cols` zero: computed, not stored): the transpose of the columns as the rows of a view.
    fn gather_columns(
        b: &[f32],
        cols: Range<usize>,
        [rs, cs]: [usize; 2],
        k: usize,
        bt: &mut [f32],
    ) {
        let nc = cols.len();
        let w = bt.len() / k.max(1);
        for row in bt.chunks_exact_mut(w) {
            row[nc..].fill(0.0);
        }
        Mat::strided(&b[cols.start * cs..], nc, k, cs, rs).transpose_into(bt, w);
    }

    /// [`super::sweep`] for a group of up to [`GROUP`] panels (`group`, each `k` rows) at once:
    /// a tile of the group's panels by [`PIXELS`] pixels, each pixel's input element broadcast
    /// once for all of them; `sums` holds the panels' sums one after another, each
    /// pixel-major. The caller checked that the pixels' reach lies inside `planes`.
    pub(super) fn sweep(
        simd: V4,
        planes: &[f32],
        offsets: &[usize],
        group: &[f32],
        at: &[usize],
        sums: &mut [f32],
    ) {
        match group.len() / (offsets.len() * LANES).max(1) {
            1 => sweep_group::<1>(simd, planes, offsets, group, at, sums),
            2 => sweep_group::<2>(simd, planes, offsets, group, at, sums),
            3 => sweep_group::<3>(simd, planes, offsets, group, at, sums),
            _ => sweep_group::<GROUP>(simd, planes, offsets, group, at, sums),
        }
    }

    /// [`sweep`] for `G` panels.
    #[inline(always)]
    fn sweep_group<const G: usize>(
        simd: V4,
        planes: &[f32],
        offsets: &[usize],
        group: &[f32],
        at: &[usize],
        sums: &mut [f32],
    ) {
        let (k, n) = (offsets.len(), at.len());
        assert_eq!(group.len(), G * k * LANES, "a group of whole panels");
        assert_eq!(sums.len(), G * n * LANES, "sums for every panel and pixel");
        simd.vectorize(
            #[inline(always)]
            || {
                let kc = blocks_of(k, WIDE_KC);
                for k0 in (0..k).step_by(kc) {
                    let k1 = (k0 + kc).min(k);
                    let offs = &offsets[k0..k1];
                    let ws = group.as_ptr().wrapping_add(k0 * LANES);
                    // Where the block's taps reach furthest from a pixel's base: once a block.
                    let last = offs.iter().max().copied().unwrap_or(0);
                    let tile = (ws, k, k0 == 0, last);
                    let whole = n - n % PIXELS;
                    for i in (0..whole).step_by(PIXELS) {
                        tile_group::<G, PIXELS>(simd, planes, offs, tile, at, i, sums);
                    }
                    // The last pixels in a tile of their own width: nothing computed and
                    // dropped (49 pixels of a 7x7 plane took nine tiles of six).
                    // (Called in each arm: through a function pointer they were not inlined
                    // into this AVX-512 code, their intrinsics calls.)
                    let i = whole;
                    match n - whole {
                        0 => {}
                        1 => tile_group::<G, 1>(simd, planes, offs, tile, at, i, sums),
                        2 => tile_group::<G, 2>(simd, planes, offs, tile, at, i, sums),
                        3 => tile_group::<G, 3>(simd, planes, offs, tile, at, i, sums),
                        4 => tile_group::<G, 4>(simd, planes, offs, tile, at, i, sums),
                        _ => tile_group::<G, 5>(simd, planes, offs, tile, at, i, sums),
                    }
                }
            },
        )
    }

    /// One tile of [`sweep_group`]: its `G` panels' rows for `offs` (`ws`: where the first
    /// panel's first of them is, each panel `k` rows; `last` the largest of `offs`) times
    /// pixels `i..i + P` of `at`, into their sums in `sums` (each panel's pixel-major,
    /// `at.len()` pixels): added to them, or from zero in the inner dimension's `first` block.
    #[inline(always)]
    fn tile_group<const G: usize, const P: usize>(
        simd: V4,
        planes: &[f32],
        offs: &[usize],
        (ws, k, first, last): (*const f32, usize, bool, usize),
        at: &[usize],
        i: usize,
        sums: &mut [f32],
    ) {
        let n = at.len();
        let bases: [usize; P] = std::array::from_fn(|p| at[i + p]);
        let furthest = bases.iter().max().copied().unwrap_or(0) + last;
        assert!(furthest < planes.len(), "a tile reads past its planes");
        let at_sum = |g: usize, p: usize| (g * n + i + p) * LANES;
        // Pixel-major, each pixel's G vectors reached through its own row (no index into
        // the array varies in the loop: the compiler keeps every one of the 24 in a
        // register, where an index had it spill).
        let mut acc = [[simd.splat_f32x16(0.0); G]; P];
        if !first {
            for (p, px) in acc.iter_mut().enumerate() {
                for (g, a) in px.iter_mut().enumerate() {
                    *a = load(&sums[at_sum(g, p)..][..LANES]);
                }
            }
        }
        let xs: [*const f32; P] = std::array::from_fn(|p| planes.as_ptr().wrapping_add(bases[p]));
        for (r, &off) in offs.iter().enumerate() {
            let w: [f32x16; G] = std::array::from_fn(|g| {
                // Not fetched ahead, unlike a linear layer's rows: these come from L2 in
                // time, and the prefetches took load slots (5-10% slower).
                let row = ws.wrapping_add((g * k + r) * LANES);
                // SAFETY: row r of each of the G panels lies inside the group (the
                // caller's check).
                unsafe { pulp::cast(*row.cast::<[f32; LANES]>()) }
            });
            for (px, xp) in acc.iter_mut().zip(&xs) {
                // SAFETY: bases[p] + off lies inside planes (checked above).
                let v = simd.splat_f32x16(unsafe { *xp.add(off) });
                for (a, &wg) in px.iter_mut().zip(&w) {
                    *a = simd.mul_add_f32x16(v, wg, *a);
                }
            }
        }
        for (p, px) in acc.iter().enumerate() {
            for (g, &a) in px.iter().enumerate() {
                let v: [f32; LANES] = pulp::cast(a);
                sums[at_sum(g, p)..][..LANES].copy_from_slice(&v);
            }
        }
    }

    /// Sixteen sums as a vector.
    #[inline(always)]
    fn load(s: &[f32]) -> f32x16 {
        pulp::cast::<[f32; LANES], f32x16>(s.try_into().expect("16 sums"))
    }

    /// `sums[j][l] = sum over kk of panel[kk][l] * x[kk][j]` for the tile's `P` columns, in
    /// order, one fused multiply-add a term.
    #[inline(always)]
    fn tile<const P: usize>(simd: V4, panel: &[f32], x: &[f32], sums: &mut [[f32; LANES]; COLS]) {
        simd.vectorize(
            #[inline(always)]
            || {
                let mut acc = [simd.splat_f32x16(0.0); P];
                for (i, (w, xs)) in panel.chunks_exact(LANES).zip(x.chunks_exact(P)).enumerate() {
                    fetch_ahead(panel.as_ptr().wrapping_add(i * LANES));
                    let w: f32x16 = pulp::cast::<[f32; LANES], f32x16>(
                        w.try_into().expect("a panel row is 16 weights"),
                    );
                    for (a, &v) in acc.iter_mut().zip(xs) {
                        *a = simd.mul_add_f32x16(simd.splat_f32x16(v), w, *a);
                    }
                }
                for (s, a) in sums.iter_mut().zip(&acc) {
                    *s = pulp::cast::<f32x16, [f32; LANES]>(*a);
                }
            },
        )
    }
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

        /// Any geometry (stride and dilation per axis, uneven padding), output channels in
        /// and out of whole panels and groups of them, pixels in and out of whole tiles, inner
        /// dimensions over several blocks of `KC`, and work split across tasks by panels and
        /// by pixels: the reference's convolution, and the same bits on one thread as on all
        /// and in AVX2's tiles as in AVX-512's.
        #[test]
        fn direct_convolutions_match_the_reference(
            c in 1usize..40, oc in 1usize..90, h in 1usize..24, w in 1usize..40,
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
            let mut planes = vec![f32::NAN; c * plane];
            for (ci, buf) in planes.chunks_mut(plane).enumerate() {
                pad_input(&win, &x[ci * h * w..(ci + 1) * h * w], None, Activation::None, buf);
            }
            let d = Direct { plane, channels: c, taps: win.taps(), out: [oh, ow] };
            prop_assert!(d.reach() <= planes.len());
            let panels = pack(&wt, oc, c * kh * kw, c * kh * kw);
            let a = if relu { Activation::Relu } else { Activation::None };
            let mut y = vec![f32::NAN; oc * oh * ow];
            d.convolve(&planes, &panels, Some(&bias), a, &mut y).unwrap();
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
            one.install(|| d.convolve(&planes, &panels, Some(&bias), a, &mut alone)).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&alone), bits(&y));
            // AVX2's tiles of one panel where `convolve` took AVX-512's of four (on a CPU
            // with it; else the same loops again): the same sums in the same order.
            let mut narrow = vec![f32::NAN; y.len()];
            d.convolve_with(1, &planes, &panels, Some(&bias), a, &mut narrow, false).unwrap();
            prop_assert_eq!(bits(&narrow), bits(&y));
        }
    }

    /// A convolution of `c` channels into `oc` by `k x k` windows at stride one over an
    /// `[h, w]` plane, padded to keep its size: its geometry, its input padded, its weights
    /// packed, and the reference's output with a bias and activation `a`.
    struct Case {
        d: Direct,
        planes: Vec<f32>,
        panels: Vec<f32>,
        bias: Vec<f32>,
        want: Vec<f32>,
        inner: usize,
        act: Activation,
    }

    impl Case {
        fn new(c: usize, oc: usize, [h, w]: [usize; 2], k: usize, a: Activation) -> Case {
            let win = Windows {
                input: [h, w],
                kernel: [k, k],
                stride: [1, 1],
                padding: [k / 2, k / 2],
                dilation: [1, 1],
                out: [h, w],
            };
            let inner = c * k * k;
            let (x, wt, bias) = (values(c * h * w, 1), values(oc * inner, 2), values(oc, 3));
            let plane = win.scratch_len();
            let mut planes = vec![f32::NAN; c * plane];
            for (ci, buf) in planes.chunks_mut(plane).enumerate() {
                pad_input(
                    &win,
                    &x[ci * h * w..(ci + 1) * h * w],
                    None,
                    Activation::None,
                    buf,
                );
            }
            let want = crate::reference::conv2d(
                &x,
                &wt,
                Some(&bias),
                [1, c, h, w],
                oc,
                [k, k],
                [1, 1],
                [k / 2, k / 2],
                [1, 1],
                1,
                win.out,
                a,
            );
            let d = Direct {
                plane,
                channels: c,
                taps: win.taps(),
                out: win.out,
            };
            let panels = pack(&wt, oc, inner, inner);
            Case {
                d,
                planes,
                panels,
                bias,
                want,
                inner,
                act: a,
            }
        }

        /// The convolution on a pool of `threads`, in AVX-512 where `wide` allows it.
        fn run(&self, threads: usize, wide: bool) -> Vec<f32> {
            let mut y = vec![f32::NAN; self.want.len()];
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let (planes, panels, bias) = (&self.planes, &self.panels, Some(&self.bias[..]));
            pool.install(|| {
                self.d
                    .convolve_with(1, planes, panels, bias, self.act, &mut y, wide)
            })
            .unwrap();
            y
        }

        /// `y` within rounding of the reference's output.
        fn check(&self, y: &[f32], what: &str) {
            for (i, (&got, &want)) in y.iter().zip(&self.want).enumerate() {
                let near = (got - want).abs() <= 1e-5 * self.inner as f32;
                assert!(near, "{what}: element {i}, {got} against {want}");
            }
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    /// Pointwise layers on one pixel (squeeze-and-excitation's), their channels stored a
    /// panel at a time: with and without a bias, activations vectorised and not, a last
    /// panel in part: the reference's, the same bits in AVX2's tiles as in AVX-512's.
    #[test]
    fn one_pixel_planes_store_a_panel_at_a_time() {
        let hard = Activation::HardSigmoid {
            alpha: 0.2,
            beta: 0.5,
        };
        let cases = [
            (48usize, 1152usize, Activation::Sigmoid),
            (64, 37, hard),
            (20, 16, Activation::Relu),
            (33, 40, Activation::None),
        ];
        for (c, oc, a) in cases {
            for biased in [true, false] {
                let mut case = Case::new(c, oc, [1, 1], 1, a);
                if !biased {
                    case.bias.fill(0.0);
                }
                let bias = biased.then_some(&case.bias[..]);
                let mut y = vec![f32::NAN; oc];
                let (planes, panels) = (&case.planes, &case.panels);
                case.d.convolve(planes, panels, bias, a, &mut y).unwrap();
                let what = format!("{c}->{oc} {a:?}, bias {biased}");
                let want = crate::reference::conv2d(
                    &values(c, 1),
                    &values(oc * c, 2),
                    bias,
                    [1, c, 1, 1],
                    oc,
                    [1, 1],
                    [1, 1],
                    [0, 0],
                    [1, 1],
                    1,
                    [1, 1],
                    a,
                );
                case.want = want;
                case.check(&y, &what);
                let mut narrow = vec![f32::NAN; oc];
                case.d
                    .convolve_with(1, planes, panels, bias, a, &mut narrow, false)
                    .unwrap();
                assert_eq!(bits(&narrow), bits(&y), "{what}");
            }
        }
    }

    /// Inner dimensions longer than an AVX-512 block (`WIDE_KC`), in two and three blocks,
    /// and one long pointwise layer: the reference's convolution, and the same bits in
    /// AVX-512's equal blocks as in AVX2's blocks of `KC`.
    #[test]
    fn long_inner_dimensions_sum_across_their_blocks() {
        for (c, oc, side, k) in [
            (120usize, 70usize, 9usize, 3usize),
            (260, 32, 5, 3),
            (2100, 20, 4, 1),
        ] {
            let case = Case::new(c, oc, [side, side + 2], k, Activation::None);
            assert!(case.inner > WIDE_KC && blocks_of(case.inner, WIDE_KC) < case.inner);
            let y = case.run(1, true);
            let what = format!("{c}->{oc} {k}x{k}");
            assert_eq!(bits(&y), bits(&case.run(1, false)), "{what}");
            case.check(&y, &what);
        }
    }

    /// Output channels in 20 panels (the last partial), on 7x7 and 14x14 planes, split into
    /// groups of panels as even as the threads allow (6 groups on 2 and 3 threads, 5 on
    /// one): the reference's convolution, and the same bits on every number of threads.
    #[test]
    fn panels_split_evenly_across_threads() {
        for side in [7usize, 14] {
            let case = Case::new(16, 316, [side, side], 3, Activation::Relu);
            let y = case.run(1, true);
            for threads in [2, 3, 4] {
                let what = format!("{side}x{side} on {threads} threads");
                assert_eq!(bits(&case.run(threads, true)), bits(&y), "{what}");
            }
            case.check(&y, &format!("{side}x{side}"));
        }
    }

    /// Chunks of pixels within a task's limit, whole rounds of the threads where the work is
    /// split, and the 28x28 plane of two panels in six chunks on two threads (five before).
    #[test]
    fn pixel_chunks_fit_and_fill_rounds() {
        for pixels in [1usize, 49, 196, 784, 3025, 12544] {
            for blocks in 1..=6usize {
                for threads in 1..=4usize {
                    for wanted in [1, 2 * threads] {
                        let chunks = pixel_chunks(pixels, blocks, wanted, threads);
                        let what = format!("{pixels} by {blocks} on {threads} ({wanted})");
                        assert!(blocks * chunks >= wanted, "{what}");
                        if wanted > 1 {
                            assert!((blocks * chunks).is_multiple_of(threads), "{what}");
                        }
                        for c in 0..chunks {
                            let len = aligned_part(pixels, chunks, PIXELS, c).len();
                            assert!(len <= CHUNK, "{what}: chunk {c} of {len}");
                        }
                    }
                }
            }
        }
        assert_eq!(pixel_chunks(784, 1, 4, 2), 6);
    }

    /// Blocks of equal length: as few as keep each within the limit, covering the whole
    /// inner dimension.
    #[test]
    fn blocks_split_evenly() {
        for (k, most) in [
            (1usize, 1024usize),
            (1024, 1024),
            (1025, 1024),
            (4608, 1024),
            (7, 3),
        ] {
            let len = blocks_of(k, most);
            let count = k.div_ceil(len);
            assert!(len <= most, "{k} by {most}");
            assert_eq!(count, k.div_ceil(most), "{k} by {most}");
            assert!(count * len >= k && (count - 1) * len < k, "{k} by {most}");
        }
        assert_eq!(blocks_of(4608, 1024), 922);
    }

    /// A product of panels with a few columns, B read either way (a column's elements
    /// adjacent or `ldb` apart), C with rows between columns, scaled: the product in `f64`
    /// within rounding, C's other rows untouched, the same bits on one thread as on three and
    /// in AVX-512's tiles of 16 columns (whole, several, and a last one of 4 to 16) as in
    /// AVX2's of 6; a B shorter than the columns' reach is refused.
    #[test]
    fn panel_products_match_the_product_in_f64() {
        for (m, k, n) in [
            (40usize, 300usize, 16usize),
            (16, 5, 1),
            (7, 33, 13),
            (600, 700, 3),
            (33, 70, 37),
            (20, 9, 64),
            (300, 40, 23),
        ] {
            let (w, ldc, ldb) = (values(m * k, 1), m + 3, k.max(n) + 2);
            let panels = pack(&w, m, k, k);
            for trans in [false, true] {
                let strides = if trans { [ldb, 1] } else { [1, ldb] };
                let len = if trans { k * ldb } else { n * ldb };
                let b = values(len, 2);
                let run = |threads: usize, wide: bool| {
                    let mut c = vec![f32::NAN; n * ldc];
                    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
                    pool.unwrap()
                        .install(|| {
                            columns(&panels, [m, k, n], &b, strides, &mut c, ldc, 0.5, wide)
                        })
                        .unwrap();
                    c
                };
                let c = run(3, false);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&c), bits(&run(1, false)), "{m}x{k}x{n}");
                // AVX-512's tiles (where this CPU has it; else the same loops again), on any
                // number of threads: the same bits as AVX2's.
                assert_eq!(bits(&c), bits(&run(3, true)), "{m}x{k}x{n} wide");
                assert_eq!(bits(&c), bits(&run(1, true)), "{m}x{k}x{n} wide");
                for j in 0..n {
                    for i in 0..m {
                        let want: f64 = (0..k)
                            .map(|q| {
                                f64::from(w[i * k + q])
                                    * f64::from(b[j * strides[1] + q * strides[0]])
                            })
                            .sum();
                        let got = f64::from(c[j * ldc + i]);
                        assert!(
                            (got - 0.5 * want).abs() <= 1e-5 * k as f64,
                            "{m}x{k}x{n} ({i}, {j})"
                        );
                    }
                    assert!(c[j * ldc + m..(j + 1) * ldc].iter().all(|v| v.is_nan()));
                }
                let reach = (n - 1) * strides[1] + (k - 1) * strides[0] + 1;
                for wide in [false, true] {
                    let mut c = vec![0.0; n * ldc];
                    let short = &b[..reach - 1];
                    let err = columns(&panels, [m, k, n], short, strides, &mut c, ldc, 1.0, wide);
                    assert!(
                        err.unwrap_err().to_string().contains("reach"),
                        "{m}x{k}x{n}"
                    );
                }
            }
        }
    }

    /// Planes that end before the tiles' reach, or panels of another shape, are refused,
    /// not read past; an empty output is no work.
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
        let panels = pack(&[0.5; 3 * 18], 3, 18, 18);
        let err = d.convolve(&planes, &panels, None, Activation::None, &mut y);
        assert!(err.unwrap_err().to_string().contains("reach"));
        let planes = vec![0.0; d.reach()];
        let err = d.convolve(&planes, &panels[1..], None, Activation::None, &mut y);
        assert!(err.unwrap_err().to_string().contains("not of their shape"));
        d.convolve(&planes, &panels, None, Activation::None, &mut y)
            .unwrap();
        assert!(y.iter().all(|&v| v == 0.0));
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
