//! Numerical building blocks of the CPU kernels: a bounds-checked matrix product over
//! `matrixmultiply` (packed, SIMD, any strides) and the bias + activation epilogue.
#![allow(unsafe_code)]

use opsched_graph::Activation;
use rayon::prelude::*;

use crate::reference::act;
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

/// `c = a * b` with `c`'s element `(i, j)` at `c[i * rsc + j * csc]`; errors as [`sgemm`],
/// and when `c`'s strides make two elements alias.
pub fn sgemm_strided(
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    rsc: usize,
    csc: usize,
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
    let s = |v: usize| v as isize;
    // SAFETY: every element the call touches lies inside its slice (the reach checks above:
    // the largest index of each view is below its length), C's strides do not alias (checked),
    // C is borrowed mutably and A, B immutably for the whole call, and beta = 0 means C's old
    // content is never read.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.data.as_ptr(),
            s(a.rs),
            s(a.cs),
            b.data.as_ptr(),
            s(b.rs),
            s(b.cs),
            0.0,
            c.as_mut_ptr(),
            s(rsc),
            s(csc),
        );
    }
    Ok(())
}

/// `y[i] = act(y[i] + bias[(i / inner) % channels])` over all of `y`, in parallel for large
/// tensors.
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
    let inner = inner.max(1);
    let channels = channels.max(1);
    let f = |(row, chunk): (usize, &mut [f32])| {
        let b = bias.map_or(0.0, |b| b[row % channels]);
        for v in chunk {
            *v = act(*v + b, a);
        }
    };
    if y.len() >= 1 << 16 {
        y.par_chunks_mut(inner).enumerate().for_each(f);
    } else {
        y.chunks_mut(inner).enumerate().for_each(f);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
    fn bias_act_per_channel() {
        let mut y = vec![-1.0, 1.0, -1.0, 1.0];
        apply_bias_act(&mut y, Some(&[0.5, 2.0]), 2, 2, Activation::Relu);
        assert_eq!(y, vec![0.0, 1.5, 1.0, 3.0]);
    }
}
