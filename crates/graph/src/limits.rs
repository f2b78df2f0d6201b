//! Bounds on what a model file may ask for, checked where the file is read, so that absurd
//! input is an error naming the node and field instead of a hang, a runaway allocation, an
//! overflowed count or an infinite makespan.
//!
//! With every tensor under [`MAX_ELEMENTS`] and every operator parameter under [`MAX_PARAM`],
//! the counts derived from them (FLOPs, bytes, parameters) are still computed with checked
//! arithmetic; an overflow is an error, never a wrapped number. Times under [`MAX_TIME_MS`]
//! keep any sum over a graph finite.

/// Most elements one tensor may have (2^40, 4 TiB of f32: more than any GPU holds).
pub const MAX_ELEMENTS: u64 = 1 << 40;

/// Largest value of an operator parameter: channels, features, kernel, stride, padding,
/// dilation, groups (2^31).
pub const MAX_PARAM: usize = 1 << 31;

/// Longest time one operator or transfer may take, in ms (10^9 ms, about 11.6 days).
pub const MAX_TIME_MS: f64 = 1e9;

/// `value` as a parameter named `field`: at most [`MAX_PARAM`].
pub fn check_param(field: &str, value: usize) -> Result<usize, String> {
    if value > MAX_PARAM {
        return Err(format!("{field} {value} exceeds the limit of {MAX_PARAM}"));
    }
    Ok(value)
}

/// `ms` as a time named `field`: finite, non-negative and at most [`MAX_TIME_MS`].
pub fn check_time_ms(field: &str, ms: f64) -> Result<f64, String> {
    if !(ms.is_finite() && ms >= 0.0) {
        return Err(format!(
            "{field} {} must be finite and non-negative",
            show(ms)
        ));
    }
    if ms > MAX_TIME_MS {
        return Err(format!(
            "{field} {} exceeds the limit of {MAX_TIME_MS:e} ms",
            show(ms)
        ));
    }
    Ok(ms)
}

/// A number as short as it reads: `1.5`, `1e300` (not 300 digits).
fn show(x: f64) -> String {
    if x == 0.0 || (1e-4..1e6).contains(&x.abs()) || !x.is_finite() {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

/// `u` as a utilization named `field`: in (0, 1].
pub fn check_util(field: &str, u: f64) -> Result<f64, String> {
    if !(u.is_finite() && u > 0.0 && u <= 1.0) {
        return Err(format!("{field} {} must lie in (0, 1]", show(u)));
    }
    Ok(u)
}

/// The number of elements of `shape`, or an error when the product overflows 64 bits.
pub fn numel(shape: &[usize]) -> Result<u64, String> {
    shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(u64::try_from(d).ok()?))
        .ok_or_else(|| format!("shape {shape:?} has more elements than 64 bits count"))
}

/// `a * b`, or an error naming what overflowed.
pub fn mul(what: &str, a: u64, b: u64) -> Result<u64, String> {
    a.checked_mul(b)
        .ok_or_else(|| format!("{what} overflows 64 bits ({a} x {b})"))
}

/// `a + b`, or an error naming what overflowed.
pub fn add(what: &str, a: u64, b: u64) -> Result<u64, String> {
    a.checked_add(b)
        .ok_or_else(|| format!("{what} overflows 64 bits ({a} + {b})"))
}

/// A size as a count (lossless where `usize` has at most 64 bits; saturates elsewhere, and the
/// checked arithmetic after it then reports the overflow).
pub fn count(x: usize) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn times_and_utilizations_are_checked() {
        assert_eq!(check_time_ms("t", 0.0), Ok(0.0));
        assert_eq!(check_time_ms("t", 1.5), Ok(1.5));
        for bad in [f64::NAN, f64::INFINITY, -1.0, 1e300] {
            let e = check_time_ms("time_ms", bad).unwrap_err();
            assert!(e.starts_with("time_ms "), "{e}");
        }
        assert_eq!(check_util("u", 1.0), Ok(1.0));
        for bad in [0.0, -0.5, 1.01, f64::NAN] {
            assert!(check_util("util", bad).is_err());
        }
    }

    #[test]
    fn counts_overflow_into_errors() {
        assert_eq!(numel(&[2, 3, 4]), Ok(24));
        assert_eq!(numel(&[]), Ok(1));
        assert!(numel(&[1 << 40, 1 << 40]).is_err());
        assert!(mul("FLOPs", u64::MAX, 2).unwrap_err().contains("FLOPs"));
        assert!(add("bytes", u64::MAX, 1).is_err());
        assert_eq!(check_param("kernel", 3), Ok(3));
        assert!(check_param("padding", 1 << 40).is_err());
    }
}
