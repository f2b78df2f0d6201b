//! Shape rules of the ONNX operators that have no operator of their own in the IR (or that we
//! also apply to constants). Operators that map to an IR operator get their shapes from
//! [`opsched_graph::Op::infer_shape`]; these helpers only cover ONNX-specific arguments
//! (negative axes, `Squeeze` without axes, `Slice` clamping, broadcasting).

use opsched_graph::{Op, Shape};

/// Normalise a possibly negative axis for a tensor of rank `rank`.
pub fn axis(a: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let n = if a < 0 { a + r } else { a };
    if n < 0 || n >= r {
        return Err(format!("axis {a} out of range for rank {rank}"));
    }
    Ok(n as usize)
}

/// Numpy-style broadcast of two shapes.
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<Shape, String> {
    let r = a.len().max(b.len());
    let mut out = vec![1; r];
    for (i, o) in out.iter_mut().enumerate() {
        let da = if i + a.len() >= r {
            a[i + a.len() - r]
        } else {
            1
        };
        let db = if i + b.len() >= r {
            b[i + b.len() - r]
        } else {
            1
        };
        *o = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(format!("shapes {a:?} and {b:?} do not broadcast")),
        };
    }
    Ok(out)
}

/// ONNX `Reshape` (0 copies the input dimension, -1 is inferred), through the IR's rule.
pub fn reshape(x: &[usize], target: &[i64]) -> Result<Shape, String> {
    // The IR multiplies dimensions unchecked: refuse sizes that overflow first.
    let known: Option<u64> = target.iter().enumerate().try_fold(1u64, |acc, (i, &d)| {
        let d = match d {
            0 => x.get(i).copied().unwrap_or(1) as u64,
            d if d > 0 => d as u64,
            _ => 1,
        };
        acc.checked_mul(d)
    });
    let input = x.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
    if known.is_none() || input.is_none() {
        return Err(format!(
            "cannot reshape {x:?} into {target:?}: the size overflows"
        ));
    }
    Op::Reshape {
        shape: target.to_vec(),
    }
    .infer_shape(&[x.to_vec()])
}

/// ONNX `Flatten`: `[prod(x[..axis]), prod(x[axis..])]`.
pub fn flatten(x: &[usize], axis_attr: i64) -> Result<Shape, String> {
    let r = x.len() as i64;
    let a = if axis_attr < 0 {
        axis_attr + r
    } else {
        axis_attr
    };
    if a < 0 || a > r {
        return Err(format!("flatten axis {axis_attr} out of range for {x:?}"));
    }
    let a = a as usize;
    let prod = |s: &[usize]| crate::consts::numel(s).ok_or("flattened size overflows");
    Ok(vec![prod(&x[..a])?, prod(&x[a..])?])
}

/// ONNX `Unsqueeze`: insert 1s at `axes` of the output.
pub fn unsqueeze(x: &[usize], axes: &[i64]) -> Result<Shape, String> {
    let r = x.len() + axes.len();
    let mut at: Vec<usize> = axes.iter().map(|&a| axis(a, r)).collect::<Result<_, _>>()?;
    at.sort_unstable();
    at.dedup();
    if at.len() != axes.len() {
        return Err(format!("unsqueeze axes {axes:?} repeat an axis"));
    }
    let mut src = x.iter();
    Ok((0..r)
        .map(|i| {
            if at.binary_search(&i).is_ok() {
                1
            } else {
                src.next().copied().unwrap_or(1)
            }
        })
        .collect())
}

/// ONNX `Squeeze`: drop the axes given (which must be 1), or every 1 when none are given.
pub fn squeeze(x: &[usize], axes: Option<&[i64]>) -> Result<Shape, String> {
    match axes {
        None => Ok(x.iter().copied().filter(|&d| d != 1).collect()),
        Some(axes) => {
            let at: Vec<usize> = axes
                .iter()
                .map(|&a| axis(a, x.len()))
                .collect::<Result<_, _>>()?;
            if let Some(&bad) = at.iter().find(|&&a| x[a] != 1) {
                return Err(format!("cannot squeeze axis {bad} of {x:?}: it is not 1"));
            }
            Ok(x.iter()
                .enumerate()
                .filter(|(i, _)| !at.contains(i))
                .map(|(_, &d)| d)
                .collect())
        }
    }
}

/// ONNX `Transpose`.
pub fn transpose(x: &[usize], perm: &[i64]) -> Result<Shape, String> {
    let p = perm_of(perm, x.len())?;
    Ok(p.iter().map(|&i| x[i]).collect())
}

/// A permutation of `0..rank` from ONNX's `perm`.
pub fn perm_of(perm: &[i64], rank: usize) -> Result<Vec<usize>, String> {
    let mut seen = vec![false; rank];
    let mut out = Vec::with_capacity(rank);
    if perm.len() != rank {
        return Err(format!("perm {perm:?} does not match rank {rank}"));
    }
    for &p in perm {
        let i = usize::try_from(p)
            .ok()
            .filter(|&i| i < rank)
            .ok_or_else(|| format!("perm {perm:?} is not a permutation"))?;
        if std::mem::replace(&mut seen[i], true) {
            return Err(format!("perm {perm:?} is not a permutation"));
        }
        out.push(i);
    }
    Ok(out)
}

/// ONNX `Concat` along a possibly negative axis.
pub fn concat(shapes: &[Shape], axis_attr: i64) -> Result<Shape, String> {
    let first = shapes.first().ok_or("concat of nothing")?;
    let a = axis(axis_attr, first.len())?;
    opsched_graph::op::concat_shapes(shapes, a)
}

/// ONNX `Gather`: `data[..axis] ++ indices ++ data[axis+1..]`.
pub fn gather(data: &[usize], indices: &[usize], axis_attr: i64) -> Result<Shape, String> {
    let a = axis(axis_attr, data.len())?;
    let mut out = data[..a].to_vec();
    out.extend_from_slice(indices);
    out.extend_from_slice(&data[a + 1..]);
    Ok(out)
}

/// Clamp a `Slice` of a dimension of size `dim` to `(begin, end, step)` as numpy does.
pub fn slice_range(dim: usize, start: i64, end: i64, step: i64) -> Option<(i64, i64, i64)> {
    if step == 0 {
        return None;
    }
    let d = i64::try_from(dim).ok()?;
    let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
    let (s, e) = (norm(start), norm(end));
    Some(if step > 0 {
        (s.clamp(0, d), e.clamp(0, d), step)
    } else {
        (s.clamp(-1, d - 1), e.clamp(-1, d - 1), step)
    })
}

/// The indices `begin, begin + step, ...` before `end`, at most `limit` of them (`None` beyond:
/// the caller reads values only of small tensors).
pub fn range_indices(begin: i64, end: i64, step: i64, limit: usize) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    let mut i = begin;
    while (step > 0 && i < end) || (step < 0 && i > end) {
        if out.len() == limit {
            return None;
        }
        if let Ok(u) = usize::try_from(i) {
            out.push(u);
        }
        let Some(next) = i.checked_add(step) else {
            break;
        };
        i = next;
    }
    Some(out)
}

fn slice_len(b: i64, e: i64, step: i64) -> usize {
    if step > 0 {
        ((e - b).max(0) as u64).div_ceil(step as u64) as usize
    } else {
        ((b - e).max(0) as u64).div_ceil(step.unsigned_abs()) as usize
    }
}

/// ONNX `Slice` output shape.
pub fn slice(
    x: &[usize],
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Result<Shape, String> {
    if starts.len() != ends.len() {
        return Err(format!(
            "slice starts {starts:?} and ends {ends:?} differ in length"
        ));
    }
    let mut out = x.to_vec();
    for (k, (&s, &e)) in starts.iter().zip(ends).enumerate() {
        let a = match axes {
            Some(ax) => axis(*ax.get(k).ok_or("slice axes shorter than starts")?, x.len())?,
            None => k,
        };
        let step = steps.and_then(|v| v.get(k).copied()).unwrap_or(1);
        let dim = *x.get(a).ok_or("slice axis out of range")?;
        let (b, e, st) = slice_range(dim, s, e, step).ok_or("slice step is 0")?;
        out[a] = slice_len(b, e, st);
    }
    Ok(out)
}

/// `axes` (of a tensor of rank `rank`, negative from the end) as the range `begin..end` they
/// cover where they are consecutive (in any order, each once); `Ok(None)` otherwise.
pub fn consecutive_axes(axes: &[i64], rank: usize) -> Result<Option<(usize, usize)>, String> {
    let mut a: Vec<usize> = axes
        .iter()
        .map(|&v| axis(v, rank))
        .collect::<Result<_, _>>()?;
    a.sort_unstable();
    let (Some(&first), Some(&last)) = (a.first(), a.last()) else {
        return Ok(None);
    };
    let each_once = a.windows(2).all(|w| w[1] == w[0] + 1);
    Ok(each_once.then_some((first, last + 1)))
}

/// The `(axis, begin, end, step)` each axis of a `Slice` with positive steps keeps (elements
/// `begin`, `begin + step`, ... below `end`), one per axis named (in their order); `None` for
/// a negative step, an axis named twice, or an empty range.
pub fn forward_slices(
    x: &[usize],
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Option<Vec<(usize, usize, usize, usize)>> {
    if starts.len() != ends.len() {
        return None;
    }
    let mut out: Vec<(usize, usize, usize, usize)> = Vec::with_capacity(starts.len());
    for (k, (&s, &e)) in starts.iter().zip(ends).enumerate() {
        let a = match axes {
            Some(ax) => axis(*ax.get(k)?, x.len()).ok()?,
            None => k,
        };
        let step = steps.map_or(Some(1), |v| v.get(k).copied())?;
        let step = usize::try_from(step).ok().filter(|&s| s > 0)?;
        let (b, e, _) = slice_range(*x.get(a)?, s, e, step as i64)?;
        if b >= e || out.iter().any(|c| c.0 == a) {
            return None;
        }
        out.push((a, b as usize, e as usize, step));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onnx_shape_rules() {
        assert_eq!(broadcast(&[2, 3, 4], &[3, 1]), Ok(vec![2, 3, 4]));
        assert!(broadcast(&[2, 3], &[4]).is_err());
        assert_eq!(flatten(&[2, 3, 4, 5], 1), Ok(vec![2, 60]));
        assert_eq!(flatten(&[2, 3, 4, 5], 0), Ok(vec![1, 120]));
        assert_eq!(unsqueeze(&[3, 4], &[0, -1]), Ok(vec![1, 3, 4, 1]));
        assert_eq!(squeeze(&[1, 3, 1, 1], None), Ok(vec![3]));
        assert_eq!(squeeze(&[1, 3, 1, 1], Some(&[2, 3])), Ok(vec![1, 3]));
        assert!(squeeze(&[1, 3], Some(&[1])).is_err());
        assert_eq!(transpose(&[1, 2, 3], &[2, 0, 1]), Ok(vec![3, 1, 2]));
        assert_eq!(reshape(&[2, 3, 4], &[0, -1]), Ok(vec![2, 12]));
        assert_eq!(gather(&[4], &[], 0), Ok(vec![]));
        assert_eq!(
            slice(&[1, 10, 8], &[2], &[i64::MAX], Some(&[1]), None),
            Ok(vec![1, 8, 8])
        );
        assert_eq!(
            slice(&[10], &[-1], &[i64::MIN], None, Some(&[-1])),
            Ok(vec![10])
        );
        assert_eq!(
            forward_slices(&[1, 10, 8], &[2], &[5], Some(&[-2]), None),
            Some(vec![(1, 2, 5, 1)])
        );
        // A crop of both spatial axes; every other row from the second; a negative step, an
        // axis twice and an empty range are not.
        assert_eq!(
            forward_slices(
                &[1, 3, 8, 8],
                &[1, 1],
                &[-1, 7],
                Some(&[2, 3]),
                Some(&[1, 1])
            ),
            Some(vec![(2, 1, 7, 1), (3, 1, 7, 1)])
        );
        assert_eq!(
            forward_slices(&[8], &[1], &[i64::MAX], None, Some(&[2])),
            Some(vec![(0, 1, 8, 2)])
        );
        assert_eq!(forward_slices(&[8], &[7], &[0], None, Some(&[-1])), None);
        assert_eq!(
            forward_slices(&[8, 8], &[0, 1], &[4, 5], Some(&[1, -1]), None),
            None
        );
        assert_eq!(forward_slices(&[8], &[5], &[2], None, None), None);
        assert_eq!(consecutive_axes(&[-1], 3), Ok(Some((2, 3))));
        assert_eq!(consecutive_axes(&[3, 2], 4), Ok(Some((2, 4))));
        assert_eq!(consecutive_axes(&[1, 3], 4), Ok(None));
        assert_eq!(consecutive_axes(&[1, 1], 4), Ok(None));
        assert!(consecutive_axes(&[4], 4).is_err());
    }
}
