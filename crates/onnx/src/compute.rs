//! Constant subgraphs computed at import whatever the size of their tensors (up to
//! [`MAX_COMPUTED`] elements): what exporters leave of shape-dependent code. Swin's
//! shifted-window attention mask is one (`ConstantOfShape`, `ScatterND` of slices, `Range`s
//! expanded and concatenated into indices, differences of windows, `Where` of a comparison),
//! Swin V2's relative position bias another (a small MLP, `MatMul`, `Relu` and `Sigmoid`, over a
//! constant table), GPT-2's causal mask (`Trilu`) and BERT's token types (`GatherElements` of a
//! buffer) others. Elements stay typed (integers for indices and masks, floats for values), as
//! onnxruntime computes them; an integer overflow or a division by zero gives no constant.

use opsched_graph::Shape;

use crate::consts::{attr, broadcast_along, numel, offsets, Const, Data};
use crate::data::Folder;
use crate::proto::NodeProto;
use crate::shapes;

/// Most elements a constant computed at import holds, and most an operand of such a
/// computation may have (the loaded weights of a large table are read where they are, never
/// copied here).
pub const MAX_COMPUTED: usize = 1 << 22;

/// Most multiply-adds a constant `MatMul` computes at import (Swin V2's bias MLP takes 10^5).
const MAX_MATMUL_WORK: usize = 1 << 26;

/// The elements of `c`, typed, when all are known (small data, or loaded weights as floats),
/// with its shape; `None` past [`MAX_COMPUTED`].
fn known(c: &Const) -> Option<(Shape, Data)> {
    let shape = c.shape.clone()?;
    let n = numel(&shape).filter(|&n| n <= MAX_COMPUTED)?;
    let data = match (&c.data, &c.values) {
        (Data::Int(v), _) if v.len() == n => c.data.clone(),
        (Data::Float(v), _) if v.len() == n => c.data.clone(),
        (_, Some(t)) if t.data.len() == n => {
            Data::Float(t.data.iter().map(|&v| f64::from(v)).collect())
        }
        _ => return None,
    };
    Some((shape, data))
}

fn constant(shape: Shape, data: Data) -> Const {
    Const {
        shape: Some(shape),
        data,
        external: None,
        values: None,
    }
}

fn floats(d: &Data) -> Vec<f64> {
    match d {
        Data::Int(v) => v.iter().map(|&x| x as f64).collect(),
        Data::Float(v) => v.clone(),
        Data::Unknown => Vec::new(),
    }
}

/// Element `i` of `d` as a truth value.
fn truth(d: &Data, i: usize) -> Option<bool> {
    match d {
        Data::Int(v) => v.get(i).map(|&x| x != 0),
        Data::Float(v) => v.get(i).map(|&x| x != 0.0),
        Data::Unknown => None,
    }
}

/// The elements of `d` at `offsets`, in order (`None` where unknown or an offset is outside).
pub(crate) fn gather(d: &Data, offsets: &[usize]) -> Option<Data> {
    Some(match d {
        Data::Int(v) => Data::Int(
            offsets
                .iter()
                .map(|&o| v.get(o).copied())
                .collect::<Option<_>>()?,
        ),
        Data::Float(v) => Data::Float(
            offsets
                .iter()
                .map(|&o| v.get(o).copied())
                .collect::<Option<_>>()?,
        ),
        Data::Unknown => return None,
    })
}

/// Offsets of each of `shapes` broadcast to their common shape, and that shape (bounded).
fn broadcast_all(shapes_in: &[&Shape]) -> Option<(Shape, Vec<Vec<usize>>)> {
    let out = shapes_in
        .iter()
        .try_fold(Vec::new(), |acc, s| shapes::broadcast(&acc, s).ok())?;
    numel(&out).filter(|&n| n <= MAX_COMPUTED)?;
    let offs = shapes_in
        .iter()
        .map(|s| offsets(&broadcast_along(s, &out)))
        .collect();
    Some((out, offs))
}

/// Evaluate `node` when every input it reads is a constant whose elements are known: `Some`
/// with one constant per output for the operators here, `None` otherwise (the caller's
/// shape-only rules apply).
pub fn eval(node: &NodeProto, ins: &[Option<&Const>]) -> Option<Vec<Const>> {
    let input = |i: usize| ins.get(i).copied().flatten().and_then(known);
    let op = node.op_type.as_str();
    let one = |c: Const| Some(vec![c]);
    match op {
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "Max" | "Min" | "Equal" | "Less"
        | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" | "Xor" => {
            let ((sa, a), (sb, b)) = (input(0)?, input(1)?);
            let (out, offs) = broadcast_all(&[&sa, &sb])?;
            // fmod = 1: the remainder takes the dividend's sign (C's fmod).
            let fmod = op == "Mod" && attr(node, "fmod").is_some_and(|a| a.i == 1);
            let op = if fmod { "Fmod" } else { op };
            one(constant(out, binary(op, &a, &offs[0], &b, &offs[1])?))
        }
        "Where" => {
            let ((sc, c), (sx, x), (sy, y)) = (input(0)?, input(1)?, input(2)?);
            let (out, offs) = broadcast_all(&[&sc, &sx, &sy])?;
            let pick = |k: usize| -> Option<(bool, usize, usize)> {
                Some((truth(&c, offs[0][k])?, offs[1][k], offs[2][k]))
            };
            let n = offs[0].len();
            let data = match (&x, &y) {
                (Data::Int(p), Data::Int(q)) => Data::Int(
                    (0..n)
                        .map(|k| {
                            pick(k)
                                .and_then(|(t, i, j)| if t { p.get(i) } else { q.get(j) }.copied())
                        })
                        .collect::<Option<_>>()?,
                ),
                _ => {
                    let (p, q) = (floats(&x), floats(&y));
                    Data::Float(
                        (0..n)
                            .map(|k| {
                                pick(k).and_then(|(t, i, j)| {
                                    if t { p.get(i) } else { q.get(j) }.copied()
                                })
                            })
                            .collect::<Option<_>>()?,
                    )
                }
            };
            one(constant(out, data))
        }
        "Not" => {
            let (s, x) = input(0)?;
            let n = numel(&s)?;
            one(constant(
                s,
                Data::Int(
                    (0..n)
                        .map(|i| truth(&x, i).map(|t| i64::from(!t)))
                        .collect::<Option<_>>()?,
                ),
            ))
        }
        "Neg" | "Abs" | "Relu" | "Sign" => {
            let (s, x) = input(0)?;
            let data = match x {
                Data::Int(v) => Data::Int(
                    v.iter()
                        .map(|&i| match op {
                            "Neg" => i.checked_neg(),
                            "Abs" => i.checked_abs(),
                            "Relu" => Some(i.max(0)),
                            _ => Some(i.signum()),
                        })
                        .collect::<Option<_>>()?,
                ),
                x => Data::Float(floats(&x).into_iter().map(|v| unary(op, v)).collect()),
            };
            one(constant(s, data))
        }
        "Sqrt" | "Reciprocal" | "Exp" | "Log" | "Floor" | "Ceil" | "Sin" | "Cos" | "Sigmoid"
        | "Tanh" => {
            let (s, x) = input(0)?;
            one(constant(
                s,
                Data::Float(floats(&x).into_iter().map(|v| unary(op, v)).collect()),
            ))
        }
        "Clip" => {
            let (s, x) = input(0)?;
            // Bounds: inputs from opset 11, attributes before; absent ones do not bound.
            let bound = |i: usize, name: &str, none: f64| -> Option<f64> {
                match ins.get(i).copied().flatten() {
                    Some(c) => c.scalar(),
                    None => Some(attr(node, name).map_or(none, |a| f64::from(a.f))),
                }
            };
            let (lo, hi) = (
                bound(1, "min", f64::NEG_INFINITY)?,
                bound(2, "max", f64::INFINITY)?,
            );
            one(constant(
                s,
                Data::Float(floats(&x).into_iter().map(|v| v.max(lo).min(hi)).collect()),
            ))
        }
        "ConstantOfShape" => {
            let (_, dims) = input(0)?;
            let shape: Shape = floats(&dims)
                .into_iter()
                .map(|d| (d >= 0.0).then_some(d as usize))
                .collect::<Option<_>>()?;
            let n = numel(&shape).filter(|&n| n <= MAX_COMPUTED)?;
            let value = attr(node, "value")
                .and_then(|a| a.t.as_ref())
                .map(|t| crate::consts::from_tensor(t, &Folder::new(None)).data);
            let data = match value {
                Some(Data::Int(v)) => Data::Int(vec![v.first().copied().unwrap_or(0); n]),
                Some(Data::Float(v)) => Data::Float(vec![v.first().copied().unwrap_or(0.0); n]),
                _ => Data::Float(vec![0.0; n]),
            };
            one(constant(shape, data))
        }
        "Concat" => {
            let parts: Vec<(Shape, Data)> = (0..ins.len()).map(input).collect::<Option<_>>()?;
            let shapes_in: Vec<Shape> = parts.iter().map(|(s, _)| s.clone()).collect();
            let axis = attr(node, "axis").map_or(0, |a| a.i);
            let out = shapes::concat(&shapes_in, axis).ok()?;
            numel(&out).filter(|&n| n <= MAX_COMPUTED)?;
            let axis = shapes::axis(axis, out.len()).ok()?;
            let outer: usize = out[..axis].iter().product();
            // Each part's block per outer index: its extent along the axis times the inner size.
            let inner: usize = out[axis + 1..].iter().product();
            let mut offs: Vec<(usize, usize)> = Vec::new();
            for o in 0..outer {
                for (k, (s, _)) in parts.iter().enumerate() {
                    let block = s[axis] * inner;
                    offs.extend((0..block).map(|i| (k, o * block + i)));
                }
            }
            let all_int = parts.iter().all(|(_, d)| matches!(d, Data::Int(_)));
            let data = if all_int {
                let vs: Vec<&Vec<i64>> = parts
                    .iter()
                    .filter_map(|(_, d)| match d {
                        Data::Int(v) => Some(v),
                        _ => None,
                    })
                    .collect();
                Data::Int(
                    offs.iter()
                        .map(|&(k, i)| vs[k].get(i).copied())
                        .collect::<Option<_>>()?,
                )
            } else {
                let vs: Vec<Vec<f64>> = parts.iter().map(|(_, d)| floats(d)).collect();
                Data::Float(
                    offs.iter()
                        .map(|&(k, i)| vs[k].get(i).copied())
                        .collect::<Option<_>>()?,
                )
            };
            one(constant(out, data))
        }
        "Gather" => {
            let ((sd, d), (si, idx)) = (input(0)?, input(1)?);
            let axis = attr(node, "axis").map_or(0, |a| a.i);
            let out = shapes::gather(&sd, &si, axis).ok()?;
            numel(&out).filter(|&n| n <= MAX_COMPUTED)?;
            let axis = shapes::axis(axis, sd.len()).ok()?;
            let (outer, len) = (sd[..axis].iter().product::<usize>(), sd[axis]);
            let inner: usize = sd[axis + 1..].iter().product();
            let rows: Vec<usize> = floats(&idx)
                .into_iter()
                .map(|k| {
                    let k = if k < 0.0 { k + len as f64 } else { k };
                    (k >= 0.0 && (k as usize) < len).then_some(k as usize)
                })
                .collect::<Option<_>>()?;
            let offs: Vec<usize> = (0..outer)
                .flat_map(|o| {
                    rows.iter()
                        .flat_map(move |&r| (0..inner).map(move |i| (o * len + r) * inner + i))
                })
                .collect();
            one(constant(out, gather(&d, &offs)?))
        }
        "GatherElements" => {
            let ((sd, d), (si, idx)) = (input(0)?, input(1)?);
            let axis = shapes::axis(attr(node, "axis").map_or(0, |a| a.i), sd.len()).ok()?;
            if si.len() != sd.len() {
                return None;
            }
            // Element `p` of the output is the data's element at `p` with its `axis`
            // coordinate replaced by the index there.
            let (sti, std) = (crate::consts::strides(&si), crate::consts::strides(&sd));
            let offs: Vec<usize> = floats(&idx)
                .iter()
                .enumerate()
                .map(|(p, &k)| {
                    let k = if k < 0.0 { k + sd[axis] as f64 } else { k };
                    if k < 0.0 || k as usize >= sd[axis] {
                        return None;
                    }
                    (0..si.len()).try_fold(0usize, |at, a| {
                        let c = if a == axis {
                            k as usize
                        } else {
                            p / sti[a] % si[a]
                        };
                        (c < sd[a]).then_some(at + c * std[a])
                    })
                })
                .collect::<Option<_>>()?;
            one(constant(si, gather(&d, &offs)?))
        }
        "Trilu" => {
            let (s, x) = input(0)?;
            let k = match ins.get(1).copied().flatten() {
                Some(c) => c.scalar()? as i64,
                None => 0,
            };
            let upper = attr(node, "upper").is_none_or(|a| a.i != 0);
            let r = s.len();
            if r < 2 {
                return None;
            }
            let (rows, cols) = (s[r - 2], s[r - 1]);
            // Element (i, j) of each matrix stays where j - i >= k (upper) or <= k (lower).
            let keep = |p: usize| {
                let (i, j) = ((p / cols % rows) as i64, (p % cols) as i64);
                if upper {
                    j - i >= k
                } else {
                    j - i <= k
                }
            };
            let data = match x {
                Data::Int(v) => Data::Int(
                    v.iter()
                        .enumerate()
                        .map(|(p, &e)| if keep(p) { e } else { 0 })
                        .collect(),
                ),
                x => Data::Float(
                    floats(&x)
                        .iter()
                        .enumerate()
                        .map(|(p, &e)| if keep(p) { e } else { 0.0 })
                        .collect(),
                ),
            };
            one(constant(s, data))
        }
        "ScatterND" => {
            if attr(node, "reduction").is_some_and(|a| !a.s.is_empty() && a.s != b"none") {
                return None;
            }
            let ((sd, d), (si, idx), (_, upd)) = (input(0)?, input(1)?, input(2)?);
            let k = *si.last()?;
            if k == 0 || k > sd.len() {
                return None;
            }
            let st = crate::consts::strides(&sd);
            let slice: usize = sd[k..].iter().product();
            let idx = floats(&idx);
            let upd_f = floats(&upd);
            let mut out = d.clone();
            for (t, tuple) in idx.chunks(k).enumerate() {
                let mut at = 0usize;
                for (a, &i) in tuple.iter().enumerate() {
                    let i = if i < 0.0 { i + sd[a] as f64 } else { i };
                    if i < 0.0 || i as usize >= sd[a] {
                        return None;
                    }
                    at += i as usize * st[a];
                }
                for e in 0..slice {
                    let from = t * slice + e;
                    match (&mut out, &upd) {
                        (Data::Int(o), Data::Int(u)) => *o.get_mut(at + e)? = *u.get(from)?,
                        (Data::Float(o), _) => *o.get_mut(at + e)? = *upd_f.get(from)?,
                        (Data::Int(o), _) => *o.get_mut(at + e)? = *upd_f.get(from)? as i64,
                        (Data::Unknown, _) => return None,
                    }
                }
            }
            one(constant(sd, out))
        }
        "MatMul" => {
            let ((sa, a), (sb, b)) = (input(0)?, input(1)?);
            let (ra, rb) = (sa.len(), sb.len());
            if ra < 2 || rb != 2 {
                return None;
            }
            let (m, k, n) = (sa[ra - 2], sa[ra - 1], sb[1]);
            if sb[0] != k {
                return None;
            }
            let batch: usize = sa[..ra - 2].iter().product();
            let mut out = sa.clone();
            out[ra - 1] = n;
            let work = numel(&out)?.checked_mul(k)?;
            if numel(&out)? > MAX_COMPUTED || work > MAX_MATMUL_WORK {
                return None;
            }
            let (a, b) = (floats(&a), floats(&b));
            let mut c = vec![0.0; batch * m * n];
            for (p, row) in c.chunks_mut(n).enumerate() {
                let x = &a[p * k..(p + 1) * k];
                for (j, v) in row.iter_mut().enumerate() {
                    *v = x.iter().enumerate().map(|(q, &xv)| xv * b[q * n + j]).sum();
                }
            }
            one(constant(out, Data::Float(c)))
        }
        _ => None,
    }
}

fn unary(op: &str, v: f64) -> f64 {
    match op {
        "Neg" => -v,
        "Abs" => v.abs(),
        "Relu" => v.max(0.0),
        "Sign" => {
            if v == 0.0 || v.is_nan() {
                v
            } else {
                v.signum()
            }
        }
        "Sqrt" => v.sqrt(),
        "Reciprocal" => 1.0 / v,
        "Exp" => v.exp(),
        "Log" => v.ln(),
        "Floor" => v.floor(),
        "Ceil" => v.ceil(),
        "Sin" => v.sin(),
        "Cos" => v.cos(),
        "Sigmoid" => 1.0 / (1.0 + (-v).exp()),
        _ => v.tanh(),
    }
}

/// `a op b` element by element, `ia` and `ib` the broadcast offsets of each: integers where
/// both are (a comparison or logical operator gives integers 0 and 1 either way).
fn binary(op: &str, a: &Data, ia: &[usize], b: &Data, ib: &[usize]) -> Option<Data> {
    let logical = matches!(op, "And" | "Or" | "Xor");
    if logical {
        let v = ia
            .iter()
            .zip(ib)
            .map(|(&i, &j)| {
                let (p, q) = (truth(a, i)?, truth(b, j)?);
                Some(i64::from(match op {
                    "And" => p && q,
                    "Or" => p || q,
                    _ => p != q,
                }))
            })
            .collect::<Option<_>>()?;
        return Some(Data::Int(v));
    }
    if let (Data::Int(x), Data::Int(y)) = (a, b) {
        let v = ia
            .iter()
            .zip(ib)
            .map(|(&i, &j)| {
                let (p, q) = (*x.get(i)?, *y.get(j)?);
                Some(match op {
                    "Add" => p.checked_add(q)?,
                    "Sub" => p.checked_sub(q)?,
                    "Mul" => p.checked_mul(q)?,
                    "Div" => p.checked_div(q)?,
                    // ONNX Mod with fmod = 0: the sign of the divisor, as in Python.
                    "Mod" => p.checked_rem(q)?.checked_add(q)?.checked_rem(q)?,
                    "Fmod" => p.checked_rem(q)?,
                    "Pow" => p.checked_pow(u32::try_from(q).ok()?)?,
                    "Max" => p.max(q),
                    "Min" => p.min(q),
                    "Equal" => i64::from(p == q),
                    "Less" => i64::from(p < q),
                    "Greater" => i64::from(p > q),
                    "LessOrEqual" => i64::from(p <= q),
                    _ => i64::from(p >= q),
                })
            })
            .collect::<Option<_>>()?;
        return Some(Data::Int(v));
    }
    let (x, y) = (floats(a), floats(b));
    let compare = matches!(
        op,
        "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual"
    );
    let v: Vec<f64> = ia
        .iter()
        .zip(ib)
        .map(|(&i, &j)| {
            let (p, q) = (*x.get(i)?, *y.get(j)?);
            let flag = |t: bool| if t { 1.0 } else { 0.0 };
            Some(match op {
                "Add" => p + q,
                "Sub" => p - q,
                "Mul" => p * q,
                "Div" => p / q,
                "Pow" => p.powf(q),
                // fmod = 0 on floats: the sign of the divisor.
                "Mod" => p - q * (p / q).floor(),
                "Fmod" => p % q,
                "Max" => p.max(q),
                "Min" => p.min(q),
                "Equal" => flag(p == q),
                "Less" => flag(p < q),
                "Greater" => flag(p > q),
                "LessOrEqual" => flag(p <= q),
                _ => flag(p >= q),
            })
        })
        .collect::<Option<_>>()?;
    Some(match compare {
        true => Data::Int(v.into_iter().map(|f| f as i64).collect()),
        false => Data::Float(v),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::proto::AttributeProto;

    fn node(op: &str, attrs: Vec<AttributeProto>) -> NodeProto {
        NodeProto {
            op_type: op.into(),
            attribute: attrs,
            ..NodeProto::default()
        }
    }

    fn int(name: &str, i: i64) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            i,
            r#type: 2,
            ..AttributeProto::default()
        }
    }

    fn run(n: &NodeProto, ins: &[Const]) -> Option<Const> {
        let ins: Vec<Option<&Const>> = ins.iter().map(Some).collect();
        eval(n, &ins).map(|mut v| v.remove(0))
    }

    /// Integer semantics as onnxruntime's: Mod takes the divisor's sign unless `fmod`, Div
    /// truncates, overflow and division by zero give no constant; comparisons give integers;
    /// operands broadcast both ways.
    #[test]
    fn arithmetic_is_typed_and_broadcasts() {
        let a = Const::ints(vec![2, 1], vec![-7, 7]);
        let b = Const::ints(vec![3], vec![2, -2, 3]);
        let got = |op: &str, attrs| run(&node(op, attrs), &[a.clone(), b.clone()]).unwrap();
        assert_eq!(got("Mod", vec![]).data, Data::Int(vec![1, -1, 2, 1, -1, 1]));
        assert_eq!(
            got("Mod", vec![int("fmod", 1)]).data,
            Data::Int(vec![-1, -1, -1, 1, 1, 1])
        );
        assert_eq!(
            got("Div", vec![]).data,
            Data::Int(vec![-3, 3, -2, 3, -3, 2])
        );
        assert_eq!(got("Div", vec![]).shape, Some(vec![2, 3]));
        let zero = Const::ints(vec![1], vec![0]);
        assert!(run(&node("Div", vec![]), &[a.clone(), zero]).is_none());
        let max = Const::ints(vec![1], vec![i64::MAX]);
        assert!(run(&node("Add", vec![]), &[max.clone(), max]).is_none());
        let f = Const::floats(vec![2], vec![0.5, 7.0]);
        let less = run(&node("Less", vec![]), &[a.clone(), f]).unwrap();
        assert_eq!(less.data, Data::Int(vec![1, 1, 0, 0]));
    }

    /// Concat along an inner axis interleaves the parts' blocks; Gather picks along any axis
    /// (negative indices from the end); ScatterND writes slices and refuses indices outside.
    #[test]
    fn tensors_are_concatenated_gathered_and_scattered() {
        let x = Const::ints(vec![2, 2], vec![1, 2, 3, 4]);
        let y = Const::ints(vec![2, 1], vec![9, 8]);
        let cat = run(&node("Concat", vec![int("axis", 1)]), &[x.clone(), y]).unwrap();
        assert_eq!(cat.data, Data::Int(vec![1, 2, 9, 3, 4, 8]));
        let idx = Const::ints(vec![2], vec![-1, 0]);
        let g = run(&node("Gather", vec![int("axis", 1)]), &[x.clone(), idx]).unwrap();
        assert_eq!(
            (g.shape, g.data),
            (Some(vec![2, 2]), Data::Int(vec![2, 1, 4, 3]))
        );
        let at = Const::ints(vec![1, 1], vec![1]);
        let row = Const::ints(vec![1, 2], vec![5, 6]);
        let s = run(&node("ScatterND", vec![]), &[x.clone(), at, row.clone()]).unwrap();
        assert_eq!(s.data, Data::Int(vec![1, 2, 5, 6]));
        let outside = Const::ints(vec![1, 1], vec![2]);
        assert!(run(&node("ScatterND", vec![]), &[x, outside, row]).is_none());
    }

    /// A product past the work bound, and operands past the size bound, are not computed.
    #[test]
    fn large_computations_are_left_alone() {
        let n = 1 << 12;
        let a = Const::floats(vec![n, n / 4], vec![1.0; n * n / 4]);
        let b = Const::floats(vec![n / 4, n / 4], vec![1.0; n * n / 16]);
        assert!(run(&node("MatMul", vec![]), &[a, b]).is_none());
        let huge = Const::shape_only(Some(vec![1 << 40]));
        assert!(run(&node("Neg", vec![]), &[huge]).is_none());
    }
}
