//! The arithmetic of folding constants into the operator before them, on real weights: batch
//! norms into convolutions and linear layers, constant scales and biases, Gemm's `alpha`,
//! `beta` and transposed operands. Coefficients are computed in `f64` and rounded once.

use opsched_graph::Tensor;

/// The length of a constant that is a per-channel vector of a tensor of shape `out` along
/// `axis` under numpy broadcasting: its dimensions, aligned at the end, are all 1 except the
/// one at `axis`, which is 1 or `out[axis]`. `None` if the constant varies along another axis
/// or has more dimensions than `out` (broadcasting would grow the output).
pub fn channel_len(c: &[usize], out: &[usize], axis: usize) -> Option<usize> {
    if c.len() > out.len() || axis >= out.len() {
        return None;
    }
    let skip = out.len() - c.len();
    let mut len = 1;
    for (i, &d) in c.iter().enumerate() {
        let at = skip + i;
        if at == axis {
            if d != 1 && d != out[axis] {
                return None;
            }
            len = d;
        } else if d != 1 {
            return None;
        }
    }
    Some(len)
}

/// Most values a parameter made from a scalar may have (a per-channel vector: 16 M channels).
pub const MAX_EXPANDED: usize = 1 << 24;

/// `n` values from a scalar (repeated) or a tensor of `n` values.
pub fn expand(t: &Tensor, n: usize) -> Result<Vec<f32>, String> {
    match t.data.len() {
        _ if n > MAX_EXPANDED && t.data.len() != n => Err(format!(
            "a parameter of {n} values made from a scalar is implausibly large"
        )),
        1 => Ok(vec![t.data[0]; n]),
        len if len == n => Ok(t.data.to_vec()),
        len => Err(format!(
            "a constant of {len} values where {n} (or 1) are needed"
        )),
    }
}

/// `w` with every slice along its first axis `o` multiplied by `s[o]` (the output channels of
/// a convolution's weight, the rows of a linear layer's).
pub fn scale_rows(w: &Tensor, s: &[f32]) -> Result<Tensor, String> {
    let rows = w.shape.first().copied().unwrap_or(1);
    if rows != s.len() {
        return Err(format!("{} scales for {rows} output channels", s.len()));
    }
    let per = w.numel() / rows.max(1);
    let data: Vec<f32> = w
        .data
        .iter()
        .enumerate()
        .map(|(i, &v)| (f64::from(v) * f64::from(s[i / per.max(1)])) as f32)
        .collect();
    Tensor::new(w.shape.clone(), data)
}

/// A matrix `[r, c]` transposed to `[c, r]`.
pub fn transpose2(w: &Tensor) -> Result<Tensor, String> {
    let [r, c] = w.shape[..] else {
        return Err(format!("{:?} is not a matrix", w.shape));
    };
    let mut data = Vec::with_capacity(w.numel());
    for j in 0..c {
        for i in 0..r {
            data.push(w.data[i * c + j]);
        }
    }
    Tensor::new(vec![c, r], data)
}

/// A batch norm as a per-channel `y = x * scale + shift`:
/// `scale = gamma / sqrt(var + eps)`, `shift = beta - mean * scale`.
pub fn batch_norm(
    gamma: &Tensor,
    beta: &Tensor,
    mean: &Tensor,
    var: &Tensor,
    eps: f64,
    channels: usize,
) -> Result<(Vec<f32>, Vec<f32>), String> {
    let (g, b, m, v) = (
        expand(gamma, channels)?,
        expand(beta, channels)?,
        expand(mean, channels)?,
        expand(var, channels)?,
    );
    let mut scale = Vec::with_capacity(channels);
    let mut shift = Vec::with_capacity(channels);
    for c in 0..channels {
        let s = f64::from(g[c]) / (f64::from(v[c]) + eps).sqrt();
        scale.push(s as f32);
        shift.push((f64::from(b[c]) - f64::from(m[c]) * s) as f32);
    }
    Ok((scale, shift))
}

/// `bias * scale + shift` per channel (a missing bias is zero).
pub fn scale_shift_bias(bias: Option<&Tensor>, scale: &[f32], shift: &[f32]) -> Vec<f32> {
    (0..scale.len())
        .map(|c| {
            let b = bias.map_or(0.0, |t| f64::from(t.data[c]));
            (b * f64::from(scale[c]) + f64::from(shift[c])) as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn t(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::new(shape.to_vec(), v.to_vec()).unwrap()
    }

    #[test]
    fn channel_vectors_under_broadcasting() {
        let out = [2, 3, 4, 5];
        assert_eq!(channel_len(&[3, 1, 1], &out, 1), Some(3));
        assert_eq!(channel_len(&[1, 3, 1, 1], &out, 1), Some(3));
        assert_eq!(channel_len(&[], &out, 1), Some(1));
        assert_eq!(channel_len(&[1], &out, 1), Some(1));
        // A vector of 3 aligns with the last axis, not the channels.
        assert_eq!(channel_len(&[3], &out, 1), None);
        assert_eq!(channel_len(&[5], &out, 3), Some(5));
        assert_eq!(channel_len(&[1, 1, 3, 1, 1], &out, 1), None);
        assert_eq!(channel_len(&[2, 3, 1, 1], &out, 1), None);
    }

    #[test]
    fn batch_norm_folds_exactly() {
        let (s, b) = batch_norm(
            &t(&[2], &[2.0, 1.0]),
            &t(&[2], &[0.5, 0.0]),
            &t(&[2], &[1.0, -1.0]),
            &t(&[2], &[3.0, 0.0]),
            1.0,
            2,
        )
        .unwrap();
        assert_eq!(s, vec![1.0, 1.0]);
        assert_eq!(b, vec![-0.5, 1.0]);
        let w = scale_rows(&t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]), &[2.0, -1.0]).unwrap();
        assert_eq!(&w.data[..], &[2.0, 4.0, -3.0, -4.0]);
        assert_eq!(
            scale_shift_bias(Some(&t(&[2], &[1.0, 2.0])), &[2.0, 3.0], &[1.0, 0.0]),
            vec![3.0, 6.0]
        );
        let tr = transpose2(&t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])).unwrap();
        assert_eq!(
            (tr.shape.clone(), tr.data.to_vec()),
            (vec![3, 2], vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0])
        );
        assert!(expand(&t(&[3], &[1.0, 2.0, 3.0]), 2).is_err());
    }
}
