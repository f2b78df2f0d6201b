//! Constants: initializers, `Constant` nodes and the computations on them that exporters
//! leave in graphs (shape arithmetic: `Shape -> Gather -> Unsqueeze -> Concat -> Reshape`;
//! masks and biases computed from shapes: `crate::compute`).
//! Small values (at most [`MAX_CONST_ELEMS`] elements: shapes, axes, scalars) are always read,
//! as integers or `f64`; the full `f32` values of any size ([`Const::values`]) only when the
//! import loads weights, and they follow the constant through the operators that only
//! re-label, reorder or repeat values (`Identity`, `Cast`, `Reshape`, `Flatten`, `Squeeze`,
//! `Unsqueeze`, `Transpose`, `Slice`, `Expand`). What `crate::compute` computes from known
//! elements is kept as data of any size up to its bound.

use opsched_graph::{Shape, Tensor};

use crate::compute::MAX_COMPUTED;
use crate::data::{self, Folder};
use crate::proto::{data_type, AttributeProto, NodeProto, TensorProto};
use crate::shapes;

/// Largest tensor whose values are read (shape tensors, scalars, axes lists).
pub const MAX_CONST_ELEMS: usize = 64;

/// Number of elements of a shape, `None` on overflow.
pub fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// Values of a constant: a small one's as read, or what `crate::compute` computed.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// Not read (a weight), or not computable.
    Unknown,
    Int(Vec<i64>),
    Float(Vec<f64>),
}

/// A constant tensor: its shape when known, its values when small and available.
#[derive(Clone, Debug, PartialEq)]
pub struct Const {
    pub shape: Option<Shape>,
    pub data: Data,
    /// Why values kept in external data were not read (naming the location), when they were
    /// not.
    pub external: Option<String>,
    /// All values as `f32`, when the import loads weights and they are known.
    pub values: Option<Tensor>,
}

impl Const {
    pub fn ints(shape: Shape, v: Vec<i64>) -> Const {
        Const {
            shape: Some(shape),
            data: Data::Int(v),
            external: None,
            values: None,
        }
    }
    pub fn floats(shape: Shape, v: Vec<f64>) -> Const {
        Const {
            shape: Some(shape),
            data: Data::Float(v),
            external: None,
            values: None,
        }
    }
    pub fn shape_only(shape: Option<Shape>) -> Const {
        Const {
            shape,
            data: Data::Unknown,
            external: None,
            values: None,
        }
    }
    /// All values as `f32`: the loaded ones, else the small ones.
    pub fn tensor(&self) -> Option<Tensor> {
        if let Some(t) = &self.values {
            return Some(t.clone());
        }
        let v: Vec<f32> = self.as_floats()?.into_iter().map(|x| x as f32).collect();
        Tensor::new(self.shape.clone()?, v).ok()
    }
    /// Values as integers (floats truncated).
    pub fn as_ints(&self) -> Option<Vec<i64>> {
        match &self.data {
            Data::Int(v) => Some(v.clone()),
            Data::Float(v) => Some(v.iter().map(|&x| x as i64).collect()),
            Data::Unknown => None,
        }
    }
    /// Values as floats.
    pub fn as_floats(&self) -> Option<Vec<f64>> {
        match &self.data {
            Data::Int(v) => Some(v.iter().map(|&x| x as f64).collect()),
            Data::Float(v) => Some(v.clone()),
            Data::Unknown => None,
        }
    }
    /// Whether any values are known (small data or loaded values), all `n` of them.
    fn holds(&self, n: usize) -> bool {
        let data = match &self.data {
            Data::Int(v) => v.len() == n,
            Data::Float(v) => v.len() == n,
            Data::Unknown => false,
        };
        data || self.values.as_ref().is_some_and(|t| t.data.len() == n)
    }
    /// The known values at `offsets` of the row-major flat values, in order (a slice, a
    /// transpose or a broadcast of them), under `shape`: small data and loaded values alike,
    /// each unknown where it was (or where an offset falls outside).
    fn pick(&self, offsets: &[usize], shape: Shape) -> Const {
        let data = match offsets.len() > MAX_COMPUTED {
            true => None,
            false => crate::compute::gather(&self.data, offsets),
        };
        let values = self.values.as_ref().and_then(|t| {
            let v: Option<Vec<f32>> = offsets.iter().map(|&o| t.data.get(o).copied()).collect();
            Tensor::new(shape.clone(), v?).ok()
        });
        Const {
            shape: Some(shape),
            data: data.unwrap_or(Data::Unknown),
            external: None,
            values,
        }
    }
    /// The one value of a single-element constant.
    pub fn scalar(&self) -> Option<f64> {
        match self.as_floats()?.as_slice() {
            [x] => Some(*x),
            _ => None,
        }
    }
    /// Number of elements, when the shape is known.
    pub fn numel(&self) -> Option<usize> {
        self.shape.as_deref().and_then(numel)
    }
}

fn is_int_type(t: i32) -> bool {
    matches!(
        t,
        data_type::INT64 | data_type::INT32 | data_type::INT8 | data_type::UINT8 | data_type::BOOL
    ) || matches!(t, 4 | 5 | 12 | 13) // uint16, int16, uint32, uint64
}

fn f16_to_f64(bits: u16) -> f64 {
    half::f16::from_bits(bits).to_f64()
}

/// Decode `n` little-endian values of `dtype` from raw bytes.
fn from_raw(raw: &[u8], dtype: i32, n: usize) -> Data {
    let take = |size: usize| raw.len() >= n * size;
    match dtype {
        data_type::INT64 if take(8) => Data::Int(
            raw.chunks_exact(8)
                .take(n)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
        ),
        data_type::INT32 if take(4) => Data::Int(
            raw.chunks_exact(4)
                .take(n)
                .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        ),
        data_type::INT8 if take(1) => {
            Data::Int(raw.iter().take(n).map(|&b| i64::from(b as i8)).collect())
        }
        data_type::UINT8 | data_type::BOOL if take(1) => {
            Data::Int(raw.iter().take(n).map(|&b| i64::from(b)).collect())
        }
        data_type::FLOAT if take(4) => Data::Float(
            raw.chunks_exact(4)
                .take(n)
                .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        ),
        data_type::DOUBLE if take(8) => Data::Float(
            raw.chunks_exact(8)
                .take(n)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
        ),
        data_type::FLOAT16 if take(2) => Data::Float(
            raw.chunks_exact(2)
                .take(n)
                .map(|c| f16_to_f64(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        data_type::BFLOAT16 if take(2) => Data::Float(
            raw.chunks_exact(2)
                .take(n)
                .map(|c| {
                    f64::from(f32::from_bits(
                        u32::from(u16::from_le_bytes([c[0], c[1]])) << 16,
                    ))
                })
                .collect(),
        ),
        _ => Data::Unknown,
    }
}

/// The constant a `TensorProto` describes. Values are read when the tensor is small: from the
/// message, or from its external file (inside `folder`) when that file can be read.
/// Dimensions that are negative make the shape unknown.
pub fn from_tensor(t: &TensorProto, folder: &Folder) -> Const {
    let shape: Option<Shape> = t.dims.iter().map(|&d| usize::try_from(d).ok()).collect();
    let n: Option<usize> = shape.as_deref().and_then(numel);
    let mut c = Const::shape_only(shape);
    let Some(n) = n.filter(|&n| n <= MAX_CONST_ELEMS) else {
        return c;
    };
    if t.data_location == 1 || !t.external_data.is_empty() {
        // Malformed references are refused at the door (see `import`); here they read nothing.
        let Ok(Some(ext)) = data::external_ref(t) else {
            return c;
        };
        let size = data::element_size(t.data_type).unwrap_or(1);
        // Never more than the tensor needs, whatever the file claims.
        let len = (n as u64 * size).min(ext.length.unwrap_or(u64::MAX));
        match folder.read(&ext.location, ext.offset, len) {
            Ok(raw) => {
                c.data = from_raw(&raw, t.data_type, n);
                if c.data == Data::Unknown {
                    c.external = Some(format!(
                        "external data '{}': {len} bytes do not hold {n} values of type {}",
                        ext.location, t.data_type
                    ));
                }
            }
            Err(e) => {
                tracing::debug!(tensor = %t.name, "{e}");
                c.external = Some(e);
            }
        }
        return c;
    }
    c.data = if !t.raw_data.is_empty() {
        from_raw(&t.raw_data, t.data_type, n)
    } else if t.int64_data.len() == n && n > 0 {
        Data::Int(t.int64_data.clone())
    } else if t.int32_data.len() == n && n > 0 {
        if is_int_type(t.data_type) {
            Data::Int(t.int32_data.iter().map(|&v| i64::from(v)).collect())
        } else {
            // float16 and bfloat16 values are stored as their bits in int32_data.
            Data::Float(
                t.int32_data
                    .iter()
                    .map(|&v| match t.data_type {
                        data_type::BFLOAT16 => f64::from(f32::from_bits((v as u32) << 16)),
                        _ => f16_to_f64(v as u16),
                    })
                    .collect(),
            )
        }
    } else if t.float_data.len() == n && n > 0 {
        Data::Float(t.float_data.iter().map(|&v| f64::from(v)).collect())
    } else if t.double_data.len() == n && n > 0 {
        Data::Float(t.double_data.clone())
    } else if n == 0 {
        if is_int_type(t.data_type) {
            Data::Int(Vec::new())
        } else {
            Data::Float(Vec::new())
        }
    } else {
        Data::Unknown
    };
    c
}

/// The constant a `Constant` node defines (`value`, `value_int(s)`, `value_float(s)`).
pub fn from_constant_node(node: &NodeProto, folder: &Folder) -> Option<Const> {
    let a: &AttributeProto = node.attribute.first()?;
    Some(match a.name.as_str() {
        "value" => from_tensor(a.t.as_ref()?, folder),
        "value_int" => Const::ints(Vec::new(), vec![a.i]),
        "value_ints" => Const::ints(vec![a.ints.len()], a.ints.clone()),
        "value_float" => Const::floats(Vec::new(), vec![f64::from(a.f)]),
        "value_floats" => Const::floats(
            vec![a.floats.len()],
            a.floats.iter().map(|&f| f64::from(f)).collect(),
        ),
        _ => return None,
    })
}

pub(crate) fn attr<'a>(node: &'a NodeProto, name: &str) -> Option<&'a AttributeProto> {
    node.attribute.iter().find(|a| a.name == name)
}

/// Axes from the `axes` attribute or, from opset 13 on, the second input.
pub fn axes(node: &NodeProto, ins: &[Option<&Const>]) -> Option<Vec<i64>> {
    if let Some(a) = attr(node, "axes") {
        return Some(a.ints.clone());
    }
    ins.get(1).copied().flatten().and_then(Const::as_ints)
}

/// Evaluate a node all of whose inputs are constants. `Some` with one constant per output when
/// the operator is one we evaluate (values when computable, else the shape when computable);
/// `None` when we do not know the operator.
pub fn eval(node: &NodeProto, ins: &[Option<&Const>]) -> Option<Vec<Const>> {
    if let Some(out) = crate::compute::eval(node, ins) {
        return Some(out);
    }
    let x = ins.first().copied().flatten();
    let shape0 = x.and_then(|c| c.shape.clone());
    let one = |c: Const| Some(vec![c]);
    // The same values under a new shape (a view).
    let with_data = |shape: Option<Shape>| -> Const {
        let values = match (&shape, x.and_then(|c| c.values.as_ref())) {
            (Some(s), Some(t)) => Tensor::new(s.clone(), t.data.clone()).ok(),
            _ => None,
        };
        match (shape, x) {
            (Some(s), Some(c)) if c.data != Data::Unknown => Const {
                shape: Some(s),
                data: c.data.clone(),
                external: None,
                values,
            },
            (s, _) => Const {
                values,
                ..Const::shape_only(s)
            },
        }
    };
    match node.op_type.as_str() {
        "Identity" => one(x?.clone()),
        "Cast" => {
            let to = attr(node, "to").map_or(0, |a| i32::try_from(a.i).unwrap_or(0));
            let c = x?;
            let data = match &c.data {
                Data::Unknown => Data::Unknown,
                _ if is_int_type(to) => Data::Int(c.as_ints()?),
                _ => Data::Float(c.as_floats()?),
            };
            let values = c.values.as_ref().map(|t| {
                if is_int_type(to) {
                    let v: Vec<f32> = t.data.iter().map(|v| v.trunc()).collect();
                    Tensor {
                        shape: t.shape.clone(),
                        data: v.into(),
                    }
                } else {
                    t.clone()
                }
            });
            one(Const {
                shape: c.shape.clone(),
                data,
                external: None,
                values,
            })
        }
        "Reshape" => {
            let target = ins.get(1).copied().flatten()?.as_ints();
            let s = match (shape0, target) {
                (Some(s), Some(t)) => shapes::reshape(&s, &t).ok(),
                _ => None,
            };
            one(with_data(s))
        }
        "Flatten" => {
            let axis = attr(node, "axis").map_or(1, |a| a.i);
            one(with_data(
                shape0.and_then(|s| shapes::flatten(&s, axis).ok()),
            ))
        }
        "Unsqueeze" => {
            let ax = axes(node, ins);
            one(with_data(match (shape0, ax) {
                (Some(s), Some(a)) => shapes::unsqueeze(&s, &a).ok(),
                _ => None,
            }))
        }
        "Squeeze" => {
            let ax = axes(node, ins);
            one(with_data(
                shape0.and_then(|s| shapes::squeeze(&s, ax.as_deref()).ok()),
            ))
        }
        "Transpose" => {
            let s = shape0?;
            let perm: Vec<i64> = attr(node, "perm")
                .map(|a| a.ints.clone())
                .unwrap_or_else(|| (0..s.len() as i64).rev().collect());
            let out = shapes::transpose(&s, &perm).ok();
            let c = x?;
            match (out, shapes::perm_of(&perm, s.len())) {
                (Some(o), Ok(p)) if numel(&s).is_some_and(|n| c.holds(n)) => {
                    let st = strides(&s);
                    let along: Vec<Vec<usize>> = p
                        .iter()
                        .map(|&a| (0..s[a]).map(|i| i * st[a]).collect())
                        .collect();
                    one(c.pick(&offsets(&along), o))
                }
                (out, _) => one(Const::shape_only(out)),
            }
        }
        "Concat" => {
            let cs: Option<Vec<&Const>> = ins.iter().copied().collect();
            let cs = cs?;
            let axis = attr(node, "axis").map_or(0, |a| a.i);
            let shapes_in: Option<Vec<Shape>> = cs.iter().map(|c| c.shape.clone()).collect();
            let out = shapes_in.and_then(|s| shapes::concat(&s, axis).ok());
            one(Const::shape_only(out))
        }
        "Gather" => {
            let data = x?;
            let idx = ins.get(1).copied().flatten()?;
            let axis = attr(node, "axis").map_or(0, |a| a.i);
            let (ds, is) = (data.shape.clone(), idx.shape.clone());
            let out = match (&ds, &is) {
                (Some(d), Some(i)) => shapes::gather(d, i, axis).ok(),
                _ => None,
            };
            // Rows of a loaded table by known indices (BERT's position embeddings by the
            // position ids): the rows' values.
            let loaded_ints = || {
                let t = idx.values.as_ref()?;
                let v: Vec<i64> = t.data.iter().map(|&v| v as i64).collect();
                t.data
                    .iter()
                    .zip(&v)
                    .all(|(&f, &i)| f == i as f32)
                    .then_some(v)
            };
            if let (Some(t), Some(iv), Some(d), Some(o), 0) = (
                &data.values,
                idx.as_ints().or_else(loaded_ints),
                &ds,
                &out,
                axis,
            ) {
                let width: usize = d[1..].iter().product();
                let rows = d.first().copied().unwrap_or(0);
                let picked: Option<Vec<f32>> = iv
                    .iter()
                    .map(|&k| {
                        let k = if k < 0 { k + rows as i64 } else { k };
                        let k = usize::try_from(k).ok().filter(|&k| k < rows)?;
                        t.data.get(k * width..(k + 1) * width)
                    })
                    .collect::<Option<Vec<_>>>()
                    .map(|v| v.concat());
                if let Some(v) = picked {
                    let mut c = Const::shape_only(Some(o.clone()));
                    c.values = Tensor::new(o.clone(), v).ok();
                    return one(c);
                }
            }
            one(Const::shape_only(out))
        }
        "Slice" => {
            let s = shape0?;
            let (starts, ends, ax, steps) = slice_args(node, ins)?;
            let out = shapes::slice(&s, &starts, &ends, ax.as_deref(), steps.as_deref()).ok();
            // The values kept (a shape being cut, BERT's position ids cut to the sequence, a
            // padding list reversed): where they are known.
            let c = x?;
            let kept = numel(&s)
                .filter(|&n| c.holds(n))
                .and_then(|_| slice_offsets(&s, &starts, &ends, ax.as_deref(), steps.as_deref()));
            match (kept, out) {
                (Some(k), Some(o)) => one(c.pick(&k, o)),
                (_, out) => one(Const::shape_only(out)),
            }
        }
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "Max" | "Min" | "Equal" | "Less"
        | "Greater" | "LessOrEqual" | "GreaterOrEqual" => {
            let (a, b) = (x?, ins.get(1).copied().flatten()?);
            let out = match (&a.shape, &b.shape) {
                (Some(p), Some(q)) => shapes::broadcast(p, q).ok(),
                _ => None,
            };
            one(Const::shape_only(out))
        }
        // What `crate::compute` computes when every element is known; otherwise the shape:
        // the first input's, or the indices' for GatherElements.
        "Sqrt" | "Neg" | "Reciprocal" | "Abs" | "Exp" | "Log" | "Floor" | "Ceil" | "Sin"
        | "Cos" | "Relu" | "Sigmoid" | "Tanh" | "Sign" | "Not" | "Clip" | "Trilu" | "ScatterND" => {
            one(Const::shape_only(x?.shape.clone()))
        }
        "GatherElements" => one(Const::shape_only(
            ins.get(1).copied().flatten()?.shape.clone(),
        )),
        "Expand" => {
            let target = ins.get(1).copied().flatten()?.as_ints()?;
            let target: Shape = target.iter().map(|&d| d.max(1) as usize).collect();
            let Some((s, Ok(o))) = shape0.map(|s| (s.clone(), shapes::broadcast(&s, &target)))
            else {
                return one(Const::shape_only(None));
            };
            if o == s {
                return one(with_data(Some(o)));
            }
            // The values repeated (ViT's class token for each image), up to a bound.
            let c = x?;
            let known = numel(&s).is_some_and(|n| c.holds(n));
            match numel(&o).filter(|&n| known && n <= MAX_COMPUTED) {
                Some(_) => one(c.pick(&offsets(&broadcast_along(&s, &o)), o)),
                None => one(Const::shape_only(Some(o))),
            }
        }
        "ConstantOfShape" => {
            let dims = x?.as_ints()?;
            let shape: Option<Shape> = dims.iter().map(|&d| usize::try_from(d).ok()).collect();
            one(Const::shape_only(shape))
        }
        "Range" => {
            let (s, l, d) = (
                x?.scalar()?,
                ins.get(1).copied().flatten()?.scalar()?,
                ins.get(2).copied().flatten()?.scalar()?,
            );
            if d == 0.0 {
                return None;
            }
            // start > limit gives an empty range; NaN and absurd lengths give no constant.
            let len = ((l - s) / d).ceil().max(0.0);
            if len.is_nan() || len > crate::data::MAX_VALUES as f64 {
                return None;
            }
            let n = len as usize;
            if n > MAX_COMPUTED {
                return one(Const::shape_only(Some(vec![n])));
            }
            let v: Vec<f64> = (0..n).map(|i| s + d * i as f64).collect();
            one(match x?.data {
                Data::Int(_) => Const::ints(vec![n], v.into_iter().map(|f| f as i64).collect()),
                _ => Const::floats(vec![n], v),
            })
        }
        "Where" => {
            let (c, a, b) = (
                x?,
                ins.get(1).copied().flatten()?,
                ins.get(2).copied().flatten()?,
            );
            let (cs, as_, bs) = (c.shape.as_ref()?, a.shape.as_ref()?, b.shape.as_ref()?);
            let shape = shapes::broadcast(cs, as_)
                .and_then(|s| shapes::broadcast(&s, bs))
                .ok();
            let Some(shape) = shape else {
                return one(Const::shape_only(None));
            };
            one(Const::shape_only(Some(shape)))
        }
        _ => None,
    }
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut st = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        st[i] = st[i + 1] * shape[i + 1];
    }
    st
}

/// Flat offsets into a row-major source, in the output's row-major order: output axis `a`
/// reads the source offsets `along[a]` (positions times the source's stride; repeats allowed).
pub(crate) fn offsets(along: &[Vec<usize>]) -> Vec<usize> {
    along.iter().fold(vec![0], |acc, axis| {
        acc.iter()
            .flat_map(|&o| axis.iter().map(move |&i| o + i))
            .collect()
    })
}

/// [`offsets`]' axes of `shape` broadcast to `out` (numpy's rule, `out` its result): an axis
/// of one, or one `shape` lacks, repeats offset 0.
pub(crate) fn broadcast_along(shape: &[usize], out: &[usize]) -> Vec<Vec<usize>> {
    let st = strides(shape);
    let lead = out.len() - shape.len();
    (0..out.len())
        .map(|d| match d.checked_sub(lead) {
            Some(a) if shape[a] != 1 => (0..out[d]).map(|i| i * st[a]).collect(),
            _ => vec![0; out[d]],
        })
        .collect()
}

/// `(starts, ends, axes, steps)` of a `Slice`.
pub type SliceArgs = (Vec<i64>, Vec<i64>, Option<Vec<i64>>, Option<Vec<i64>>);

/// The flat offsets (row-major) of the elements of a `shape` tensor that a `Slice` keeps, in
/// order; `None` where the arguments do not fit the shape. Allocates per element of `shape`:
/// for tensors whose values are in memory.
fn slice_offsets(
    shape: &[usize],
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Option<Vec<usize>> {
    let n = numel(shape)?;
    // Per axis, the indices kept (all of an axis not sliced).
    let mut kept: Vec<Vec<usize>> = shape.iter().map(|&d| (0..d).collect()).collect();
    for (k, (&b, &e)) in starts.iter().zip(ends).enumerate() {
        let a = match axes {
            Some(ax) => shapes::axis(*ax.get(k)?, shape.len()).ok()?,
            None => k,
        };
        let step = steps.and_then(|v| v.get(k).copied()).unwrap_or(1);
        let (b, e, st) = shapes::slice_range(*shape.get(a)?, b, e, step)?;
        *kept.get_mut(a)? = shapes::range_indices(b, e, st, n)?;
    }
    let st = strides(shape);
    let along: Vec<Vec<usize>> = kept
        .iter()
        .zip(&st)
        .map(|(idx, &s)| idx.iter().map(|&i| i * s).collect())
        .collect();
    Some(offsets(&along))
}

/// The arguments of a `Slice` from its attributes (opset < 10) or inputs.
pub fn slice_args(node: &NodeProto, ins: &[Option<&Const>]) -> Option<SliceArgs> {
    if let (Some(s), Some(e)) = (attr(node, "starts"), attr(node, "ends")) {
        return Some((
            s.ints.clone(),
            e.ints.clone(),
            attr(node, "axes").map(|a| a.ints.clone()),
            None,
        ));
    }
    let get = |i: usize| ins.get(i).copied().flatten().and_then(Const::as_ints);
    Some((get(1)?, get(2)?, get(3), get(4)))
}
