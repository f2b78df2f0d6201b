//! Summary statistics of repeated timings.

use serde::{Deserialize, Serialize};

/// Median, 10th and 90th percentiles, min and max of a set of timings, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub median_ms: f64,
    pub p10_ms: f64,
    pub p90_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub samples: u32,
}

impl Summary {
    /// Summarise `samples` (non-finite values are dropped); `None` when nothing is left.
    ///
    /// Percentiles interpolate linearly between order statistics (numpy's default), so the
    /// median of an even count is the mean of the two middle values.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(Summary {
            median_ms: percentile(&v, 0.5),
            p10_ms: percentile(&v, 0.1),
            p90_ms: percentile(&v, 0.9),
            min_ms: v[0],
            max_ms: v[v.len() - 1],
            samples: v.len() as u32,
        })
    }

    /// The spread `(p90 - p10) / median` (0 when the median is 0).
    pub fn spread(&self) -> f64 {
        if self.median_ms > 0.0 {
            (self.p90_ms - self.p10_ms) / self.median_ms
        } else {
            0.0
        }
    }

    /// As a cost-cache measurement.
    pub fn measurement(&self) -> opsched_cost::cache::Measurement {
        opsched_cost::cache::Measurement {
            median_ms: self.median_ms,
            p10_ms: self.p10_ms,
            p90_ms: self.p90_ms,
            repeats: self.samples,
        }
    }
}

/// The `q`-quantile of sorted values, interpolated linearly.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = pos.ceil() as usize;
            let frac = pos - lo as f64;
            sorted[lo] + (sorted[hi] - sorted[lo]) * frac
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn percentiles_like_numpy() {
        let s = Summary::of(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!(s.median_ms, 3.0);
        assert!((s.p10_ms - 1.4).abs() < 1e-12);
        assert!((s.p90_ms - 4.6).abs() < 1e-12);
        assert_eq!((s.min_ms, s.max_ms, s.samples), (1.0, 5.0, 5));
        let even = Summary::of(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(even.median_ms, 2.5);
        assert!((s.spread() - 3.2 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn edge_cases() {
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[f64::NAN]).is_none());
        let one = Summary::of(&[0.25, f64::INFINITY]).unwrap();
        assert_eq!((one.median_ms, one.p10_ms, one.p90_ms), (0.25, 0.25, 0.25));
        assert_eq!(Summary::default().spread(), 0.0);
        let m = one.measurement();
        assert_eq!((m.median_ms, m.repeats), (0.25, 1));
    }
}
