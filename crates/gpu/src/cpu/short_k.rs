//! Matrix products of a short inner dimension in AVX-512 ([`suits`]): stems through im2col (3
//! channels by 3x3 or 7x7 windows: `k` 27 or 147), pointwise convolutions of few input channels
//! on large planes (MobileNet's and RegNet's 16 or 32 on 112x112) and of up to 256 into few
//! outputs (DenseNet's on 56x56), whose products the library ran with as much time packing and
//! storing as summing. Here a block of two vectors of output columns (32 pixels) by up to
//! twelve output rows (or three by eight, `blocks`) keeps its sums in registers across the
//! whole inner dimension: each step loads the vectors of B's row and broadcasts one element of
//! A per output row, then the block is stored once; the blocks of rows outermost, so that each
//! writes its rows front to back (columns outermost, every row of C took a store a block, and
//! the products ran no faster than the library's). Per layer on one thread, three runs of each
//! alternated (`run --op-times`, Zen 5, ms): the 7x7 stems of ResNet-18, GoogLeNet and
//! DenseNet-121 1.36 -> 1.18, 1.35 -> 1.19, 1.35 -> 1.20, Inception-v3's 3x3 0.48 -> 0.40,
//! RegNet's 0.24 -> 0.18; RegNet's 32 -> 48 on 112x112 0.27 -> 0.24, MobileNetV2's 16 -> 96
//! 0.27 -> 0.25 and 32 -> 16 0.093 -> 0.081; DenseNet's 192-256 -> 128 on 56x56 0.85 -> 0.79,
//! ResNeXt's 256 -> 128 0.96 -> 0.89; but ResNeXt's 256 -> 512 on 28x28 2-4% slower (hence the
//! bound on rows where `k` is long). Each output adds its `k` products in order, by fused
//! multiply-adds, from zero.
#![allow(unsafe_code)]

/// The longest inner dimension [`product`] takes: [`LONG_K`] for products of up to
/// [`LONG_K_ROWS`] rows, [`MOST_K`] for any.
pub const MOST_K: usize = 160;
/// See [`MOST_K`].
pub const LONG_K: usize = 288;
/// See [`MOST_K`].
pub const LONG_K_ROWS: usize = 256;

/// Output rows of a block: 12 x 2 sums of the 32 registers (two for B's row, a broadcast).
const ROWS: usize = 12;

/// Lanes of a vector.
const LANES: usize = 16;

/// `c = a * b` for the matrices of `ops` (`a`: `m x k`, row-major; `b`: `k x w`; `c`: `m x
/// w`), where [`suits`] holds; returns `false`, touching nothing, elsewhere.
///
/// # Safety
/// `a` holds `m` rows of `k` from its start, `lda` apart; `b` `k` rows of `w`, `ldb` apart;
/// `c` is valid for writes at `m` rows of `w`, `ldc` apart, and aliases neither.
pub unsafe fn product(ops: Operands, [m, k, w]: [usize; 3]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V4::try_new().filter(|_| suits(m, k)) {
        // SAFETY: the CPU has AVX-512; the caller's promise for the rest.
        unsafe { blocks(simd, ops, [m, k, w]) };
        return true;
    }
    let _ = (ops, w);
    false
}

/// [`product`]'s matrices: where each starts, its rows `ld*` apart.
#[derive(Clone, Copy, Debug)]
pub struct Operands {
    pub a: *const f32,
    pub lda: usize,
    pub b: *const f32,
    pub ldb: usize,
    pub c: *mut f32,
    pub ldc: usize,
}

impl Operands {
    /// The operands of the block of C from row `i` and column `j` on: A's row `i`, B's column
    /// `j`. (Pointers only: each block reads and writes inside its matrices, the caller's
    /// promise.)
    fn at(self, i: usize, j: usize) -> Operands {
        Operands {
            a: self.a.wrapping_add(i * self.lda),
            b: self.b.wrapping_add(j),
            c: self.c.wrapping_add(i * self.ldc + j),
            ..self
        }
    }
}

/// Whether [`product`] takes `m` rows of an inner dimension of `k` on this CPU (AVX-512).
pub fn suits(m: usize, k: usize) -> bool {
    let short = k <= MOST_K || k <= LONG_K && m <= LONG_K_ROWS;
    #[cfg(target_arch = "x86_64")]
    return k > 0 && short && pulp::x86::V4::try_new().is_some();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = short;
        false
    }
}

/// [`product`]'s blocks: [`ROWS`] rows by two vectors of columns, or (where that would leave
/// a block of four rows last) eight rows by three vectors, the last rows fewer, the last
/// columns masked. (A 7x7 stem's 64 output channels in five blocks of twelve and one of four,
/// whose sums take a load for every two multiply-adds: in eight blocks of eight, ResNet-18's
/// stem 1.269 -> 1.211 ms on one thread, three processes of each alternated, 2026-11-29;
/// DenseNet-121's pointwise layers into 128 channels ran 5% slower in blocks of eight.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512cd,avx512dq,avx512vl")]
unsafe fn blocks(simd: pulp::x86::V4, ops: Operands, [m, k, w]: [usize; 3]) {
    // SAFETY (both): the caller's promise.
    match m % ROWS == 4 {
        true => unsafe { blocks_of::<8, 3>(simd, ops, [m, k, w]) },
        false => unsafe { blocks_of::<ROWS, 2>(simd, ops, [m, k, w]) },
    }
}

/// [`blocks`] of `R` rows by `V` vectors of columns (the last rows in blocks of 8, 4 or 1).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn blocks_of<const R: usize, const V: usize>(
    simd: pulp::x86::V4,
    ops: Operands,
    [m, k, w]: [usize; 3],
) {
    // Rows outer: each block of rows writes its rows front to back (a dozen streams of
    // stores), B's tile read again per block of rows (from L2).
    let cols = LANES * V;
    let mut i0 = 0;
    while i0 < m {
        let rows = match m - i0 {
            r if r >= R => R,
            r if r >= 8 => 8,
            r if r >= 4 => 4,
            _ => 1,
        };
        for j0 in (0..w).step_by(cols) {
            // Lanes of the block's vectors inside the columns.
            let n = (w - j0).min(cols);
            let masks: [u16; V] = std::array::from_fn(|v| lanes(n.saturating_sub(LANES * v)));
            let ops = ops.at(i0, j0);
            // SAFETY (each): the caller's promise; the block's rows and columns lie inside.
            unsafe {
                match rows {
                    r if r == R => block::<R, V>(simd, ops, k, masks),
                    8 => block::<8, V>(simd, ops, k, masks),
                    4 => block::<4, V>(simd, ops, k, masks),
                    _ => block::<1, V>(simd, ops, k, masks),
                }
            }
        }
        i0 += rows;
    }
}

/// The mask of the first `n` lanes of a vector of sixteen.
fn lanes(n: usize) -> u16 {
    ((1u32 << n.min(16)) - 1) as u16
}

/// One block: `R` output rows by the `V` vectors of columns `masks` keeps.
///
/// # Safety
/// As [`product`]'s, for the block's rows and columns.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn block<const R: usize, const V: usize>(
    simd: pulp::x86::V4,
    ops: Operands,
    k: usize,
    masks: [u16; V],
) {
    let Operands {
        a,
        lda,
        b,
        ldb,
        c,
        ldc,
    } = ops;
    let f = simd.avx512f;
    let whole = masks == [u16::MAX; V];
    let mut acc = [[f._mm512_setzero_ps(); V]; R];
    for kk in 0..k {
        // SAFETY: row kk of B holds the block's columns (the masks' lanes).
        let row = unsafe { b.add(kk * ldb) };
        let bs: [_; V] = std::array::from_fn(|v| match whole {
            // SAFETY: as above.
            true => unsafe { f._mm512_loadu_ps(row.add(LANES * v)) },
            // SAFETY: as above; the lanes outside the masks are not read.
            false => unsafe { f._mm512_maskz_loadu_ps(masks[v], row.add(LANES * v)) },
        });
        for (r, sums) in acc.iter_mut().enumerate() {
            // SAFETY: A's row r holds k elements.
            let t = f._mm512_set1_ps(unsafe { *a.add(r * lda + kk) });
            for (s, &bv) in sums.iter_mut().zip(&bs) {
                *s = f._mm512_fmadd_ps(t, bv, *s);
            }
        }
    }
    for (r, sums) in acc.iter().enumerate() {
        // SAFETY: C's row r holds the block's columns (the masks' lanes).
        let at = unsafe { c.add(r * ldc) };
        for (v, &sv) in sums.iter().enumerate() {
            match whole {
                // SAFETY: as above.
                true => unsafe { f._mm512_storeu_ps(at.add(LANES * v), sv) },
                // SAFETY: as above; the lanes outside the masks are not written.
                false => unsafe { f._mm512_mask_storeu_ps(at.add(LANES * v), masks[v], sv) },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shape of rows (a whole block, the smaller blocks, single rows), columns (whole
    /// blocks and masked ones, narrower than a vector) and inner dimensions up to the longest,
    /// with strided rows: each element the sum of its products in order, by fused
    /// multiply-adds; the elements around C's block untouched.
    #[test]
    fn products_match_the_sums_in_order() {
        if !suits(1, 1) {
            return;
        }
        let value = |i: usize, s: usize| ((i * 7919 + s * 104_729) % 2001) as f32 / 1000.0 - 1.0;
        let shapes = [
            (12, 16, 64),
            (29, 1, 37),
            (7, 64, 5),
            (1, 160, 200),
            (25, 288, 48),
            (16, 27, 100),
            (40, 147, 53),
        ];
        for (m, k, w) in shapes {
            let (lda, ldb, ldc) = (k + 3, w + 5, w + 2);
            let a: Vec<f32> = (0..m * lda).map(|i| value(i, 1)).collect();
            let b: Vec<f32> = (0..k * ldb).map(|i| value(i, 2)).collect();
            let mut c = vec![f32::NAN; m * ldc];
            // SAFETY: the shapes above, inside the vectors.
            let ops = Operands {
                a: a.as_ptr(),
                lda,
                b: b.as_ptr(),
                ldb,
                c: c.as_mut_ptr(),
                ldc,
            };
            let took = unsafe { product(ops, [m, k, w]) };
            assert!(took);
            for i in 0..m {
                for j in 0..ldc {
                    let got = c[i * ldc + j];
                    if j >= w {
                        assert!(got.is_nan(), "({i}, {j}) of {m}x{k}x{w} written");
                        continue;
                    }
                    let want =
                        (0..k).fold(0.0f32, |s, kk| a[i * lda + kk].mul_add(b[kk * ldb + j], s));
                    assert_eq!(got.to_bits(), want.to_bits(), "({i}, {j}) of {m}x{k}x{w}");
                }
            }
        }
        assert!(!suits(1, 0) && !suits(LONG_K_ROWS + 1, MOST_K + 1) && !suits(1, LONG_K + 1));
    }
}
