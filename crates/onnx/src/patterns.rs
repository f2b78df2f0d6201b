//! Rewrites of the decompositions exporters write for operators that older opsets lack, back
//! into one node each, before the walk:
//!
//! - GELU (a `Gelu` operator only exists from opset 20): `Div(x, sqrt 2) -> Erf -> Add(1) ->
//!   Mul(x) -> Mul(0.5)`, also with `Mul(x, 1/sqrt 2)` first or the `0.5` applied to `x` first;
//!   and its tanh form (GPT-2's): `Pow(x, 3)` (or `x * x * x`) `-> Mul(0.044715) -> Add(x) ->
//!   Mul(sqrt(2 / pi)) -> Tanh -> Add(1)`, then the products with `x` and `0.5`;
//! - layer normalization (`LayerNormalization` only exists from opset 17):
//!   `ReduceMean(x) -> Sub(x, mean) -> Pow(2) -> ReduceMean -> Add(eps) -> Sqrt -> Div`, then an
//!   optional `Mul(scale)` and `Add(bias)`;
//! - swish (a `Swish` operator only exists from opset 24; PyTorch exports `SiLU` so):
//!   `Sigmoid(x) -> Mul(x)`, also with `Mul(x, alpha)` before the sigmoid.
//!
//! A pattern matches only when every intermediate tensor is read by the pattern alone (and is
//! not a graph output), the operands outside the chain are constants, and the constants have
//! the values that make the chain that operator (`sqrt 2`, `1`, `0.5`; `0.044715`,
//! `sqrt(2 / pi)` and an exponent of 3; an exponent of 2, a mean over the last axis, a scale
//! and shift per element of the last axis), so a rewrite never changes what the model
//! computes.

use std::collections::{HashMap, HashSet};

use crate::proto::{AttributeProto, NodeProto};

struct Index<'a> {
    nodes: &'a [NodeProto],
    producer: HashMap<&'a str, usize>,
    readers: HashMap<&'a str, Vec<usize>>,
    outputs: &'a HashSet<String>,
    constants: &'a HashMap<String, ConstInfo>,
}

/// What the rewrite knows of a constant: its value when it has one element, its shape.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConstInfo {
    pub scalar: Option<f64>,
    pub shape: Option<Vec<usize>>,
}

/// Whether `x` is `want` up to the rounding of an `f32` constant.
fn near(x: Option<f64>, want: f64) -> bool {
    x.is_some_and(|x| (x - want).abs() <= 1e-6 * want.abs().max(1.0))
}

impl<'a> Index<'a> {
    /// The only reader of `t` (and `t` is no graph output).
    fn sole_reader(&self, t: &str) -> Option<usize> {
        match self.readers.get(t).map(Vec::as_slice) {
            Some([r]) if !self.outputs.contains(t) => Some(*r),
            _ => None,
        }
    }
    fn node(&self, i: usize) -> &'a NodeProto {
        &self.nodes[i]
    }
    fn out(&self, i: usize) -> Option<&'a str> {
        self.nodes[i].output.first().map(String::as_str)
    }
    fn is_const(&self, t: &str) -> bool {
        self.constants.contains_key(t)
    }
    fn scalar(&self, t: &str) -> Option<f64> {
        self.constants.get(t).and_then(|c| c.scalar)
    }
    /// A constant that varies along the last axis at most (all other dimensions 1).
    fn is_last_axis_vector(&self, t: &str) -> bool {
        self.constants
            .get(t)
            .and_then(|c| c.shape.as_deref())
            .is_some_and(|s| {
                s.split_last()
                    .is_none_or(|(_, rest)| rest.iter().all(|&d| d == 1))
            })
    }
    /// Whether a reduction node averages the last axis only, keeping it.
    fn reduces_last_axis(&self, i: usize) -> bool {
        let n = &self.nodes[i];
        let keep = n
            .attribute
            .iter()
            .find(|a| a.name == "keepdims")
            .is_none_or(|a| a.i == 1);
        let axes = match n.attribute.iter().find(|a| a.name == "axes") {
            Some(a) => a.ints == [-1],
            None => n.input.get(1).is_some_and(|t| near(self.scalar(t), -1.0)),
        };
        keep && axes
    }
    /// For a binary node, the input that is not `t`, and whether `t` came first.
    fn other(&self, i: usize, t: &str) -> Option<(&'a str, bool)> {
        match self.nodes[i].input.as_slice() {
            [a, b] if a == t => Some((b.as_str(), true)),
            [a, b] if b == t => Some((a.as_str(), false)),
            _ => None,
        }
    }
    /// `t`'s sole reader if it has type `op`.
    fn next(&self, t: &str, op: &str) -> Option<usize> {
        self.sole_reader(t).filter(|&r| self.nodes[r].op_type == op)
    }
}

fn synthetic(
    op_type: &str,
    base: &NodeProto,
    inputs: Vec<String>,
    output: &str,
    attrs: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto {
        input: inputs,
        output: vec![output.to_string()],
        name: base.name.clone(),
        op_type: op_type.to_string(),
        attribute: attrs,
        domain: String::new(),
        metadata_props: base.metadata_props.clone(),
    }
}

/// GELU starting at the `Erf` node `e`: `(nodes of the pattern, x, output)`.
fn match_gelu(ix: &Index<'_>, e: usize) -> Option<(Vec<usize>, String, String)> {
    let erf_in = ix.node(e).input.first()?;
    let scale = *ix.producer.get(erf_in.as_str())?;
    let scale_node = ix.node(scale);
    if !matches!(scale_node.op_type.as_str(), "Div" | "Mul") || ix.sole_reader(erf_in) != Some(e) {
        return None;
    }
    let [x, c] = scale_node.input.as_slice() else {
        return None;
    };
    let divisor = match scale_node.op_type.as_str() {
        "Div" => ix.scalar(c),
        _ => ix.scalar(c).map(|m| 1.0 / m),
    };
    if !near(divisor, std::f64::consts::SQRT_2) {
        return None;
    }
    let add = ix.next(ix.out(e)?, "Add")?;
    let (one, _) = ix.other(add, ix.out(e)?)?;
    if !near(ix.scalar(one), 1.0) {
        return None;
    }
    let (tail, out) = times_half_x(ix, add, x)?;
    let mut nodes = vec![scale, e, add];
    nodes.extend(tail);
    Some((nodes, x.clone(), out))
}

/// The end both GELU forms share after their `Add(1)` node `one_add` (whose output is
/// `1 + erf` or `1 + tanh`): `Mul(x) -> Mul(0.5)`, or a `Mul` by `Mul(x, 0.5)`; its nodes and
/// the pattern's output.
fn times_half_x(ix: &Index<'_>, one_add: usize, x: &str) -> Option<(Vec<usize>, String)> {
    let one_out = ix.out(one_add)?;
    let m1 = ix.next(one_out, "Mul")?;
    let (other, _) = ix.other(m1, one_out)?;
    let m1_out = ix.out(m1)?;
    if other == x {
        // x * (1 + f) * 0.5
        let m2 = ix.next(m1_out, "Mul")?;
        let (half, _) = ix.other(m2, m1_out)?;
        let out = ix.out(m2)?.to_string();
        return near(ix.scalar(half), 0.5).then_some((vec![m1, m2], out));
    }
    // (x * 0.5) * (1 + f)
    let half_node = *ix.producer.get(other)?;
    if ix.node(half_node).op_type != "Mul" || ix.sole_reader(other) != Some(m1) {
        return None;
    }
    let (half, _) = ix.other(half_node, x)?;
    near(ix.scalar(half), 0.5).then(|| (vec![half_node, m1], m1_out.to_string()))
}

/// GELU's tanh form (GPT-2's `NewGELUActivation`) around the `Tanh` node `t`:
/// `x^3 -> Mul(0.044715) -> Add(x) -> Mul(sqrt(2 / pi)) -> Tanh -> Add(1)`, then the product
/// with `x` and `0.5` in either order, the cube a `Pow(x, 3)` or `Mul(Mul(x, x), x)`:
/// `(nodes of the pattern, x, output)`.
fn match_gelu_tanh(ix: &Index<'_>, t: usize) -> Option<(Vec<usize>, String, String)> {
    let t_in = ix.node(t).input.first()?;
    let scale = *ix.producer.get(t_in.as_str())?;
    if ix.node(scale).op_type != "Mul" || ix.sole_reader(t_in) != Some(t) {
        return None;
    }
    let [p, q] = ix.node(scale).input.as_slice() else {
        return None;
    };
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let inner = match (near(ix.scalar(p), c), near(ix.scalar(q), c)) {
        (true, false) => q,
        (false, true) => p,
        _ => return None,
    };
    let add = *ix.producer.get(inner.as_str())?;
    if ix.node(add).op_type != "Add" || ix.sole_reader(inner) != Some(scale) {
        return None;
    }
    // x + 0.044715 * cube(x): either operand may be x.
    let [a, b] = ix.node(add).input.as_slice() else {
        return None;
    };
    let (x, cubic, cube_nodes) = [(a, b), (b, a)].into_iter().find_map(|(x, m)| {
        let mul = *ix.producer.get(m.as_str())?;
        if ix.node(mul).op_type != "Mul" || ix.sole_reader(m) != Some(add) {
            return None;
        }
        let [u, v] = ix.node(mul).input.as_slice() else {
            return None;
        };
        let cube = match (near(ix.scalar(u), 0.044_715), near(ix.scalar(v), 0.044_715)) {
            (true, false) => v,
            (false, true) => u,
            _ => return None,
        };
        let nodes = cube_of(ix, cube, x, mul)?;
        Some((x, mul, nodes))
    })?;
    let one_add = ix.next(ix.out(t)?, "Add")?;
    let (one, _) = ix.other(one_add, ix.out(t)?)?;
    if !near(ix.scalar(one), 1.0) || ix.is_const(x) {
        return None;
    }
    let (tail, out) = times_half_x(ix, one_add, x)?;
    let mut nodes = cube_nodes;
    nodes.extend([cubic, add, scale, t, one_add]);
    nodes.extend(tail);
    Some((nodes, x.clone(), out))
}

/// The nodes computing tensor `t` as `x^3` for their sole reader `reader`: `Pow(x, 3)`, or
/// `Mul(Mul(x, x), x)` (either operand order).
fn cube_of(ix: &Index<'_>, t: &str, x: &str, reader: usize) -> Option<Vec<usize>> {
    let n = *ix.producer.get(t)?;
    if ix.sole_reader(t) != Some(reader) {
        return None;
    }
    let node = ix.node(n);
    match (node.op_type.as_str(), node.input.as_slice()) {
        ("Pow", [base, e]) if base == x && near(ix.scalar(e), 3.0) => Some(vec![n]),
        ("Mul", [u, v]) => {
            let sq_name = match (u == x, v == x) {
                (true, false) => v,
                (false, true) => u,
                _ => return None,
            };
            let sq = *ix.producer.get(sq_name.as_str())?;
            let sq_node = ix.node(sq);
            let squares = sq_node.op_type == "Mul" && sq_node.input.iter().all(|i| i == x);
            (squares && ix.sole_reader(sq_name) == Some(n)).then(|| vec![sq, n])
        }
        _ => None,
    }
}

/// Swish ending at the `Mul` that reads the `Sigmoid` node `s`: `(nodes of the pattern, x,
/// alpha, output)`.
fn match_swish(ix: &Index<'_>, s: usize) -> Option<(Vec<usize>, String, f64, String)> {
    let t = ix.node(s).input.first()?;
    let s_out = ix.out(s)?;
    let m = ix.next(s_out, "Mul")?;
    let (x, _) = ix.other(m, s_out)?;
    let out = ix.out(m)?.to_string();
    if x == t {
        // x * sigmoid(x); a constant x is the folder's.
        return (!ix.is_const(x)).then(|| (vec![s, m], x.to_string(), 1.0, out));
    }
    // x * sigmoid(alpha * x)
    let scale = *ix.producer.get(t.as_str())?;
    if ix.node(scale).op_type != "Mul" || ix.sole_reader(t) != Some(s) || ix.is_const(x) {
        return None;
    }
    let (alpha, _) = ix.other(scale, x)?;
    let alpha = ix.scalar(alpha).filter(|a| a.is_finite())?;
    Some((vec![scale, s, m], x.to_string(), alpha, out))
}

/// A matched layer norm: its nodes, input, output, epsilon, and the scale and shift constants
/// (when the chain has them).
struct LayerNormMatch {
    nodes: Vec<usize>,
    x: String,
    out: String,
    eps: f32,
    scale: Option<String>,
    shift: Option<String>,
}

/// Layer norm starting at the first `ReduceMean` node `r`.
fn match_layer_norm(ix: &Index<'_>, r: usize) -> Option<LayerNormMatch> {
    if !ix.reduces_last_axis(r) {
        return None;
    }
    let x = ix.node(r).input.first()?.clone();
    let mean = ix.out(r)?;
    let sub = ix.next(mean, "Sub")?;
    if ix.node(sub).input.first() != Some(&x) {
        return None;
    }
    let d = ix.out(sub)?;
    // `d` is read by Pow and by Div.
    let readers = ix.readers.get(d)?;
    if readers.len() != 2 || ix.outputs.contains(d) {
        return None;
    }
    let pow = *readers.iter().find(|&&i| ix.node(i).op_type == "Pow")?;
    let div = *readers.iter().find(|&&i| ix.node(i).op_type == "Div")?;
    let exponent = ix.node(pow).input.get(1)?;
    if ix.node(pow).input.first().map(String::as_str) != Some(d) || !near(ix.scalar(exponent), 2.0)
    {
        return None;
    }
    let r2 = ix.next(ix.out(pow)?, "ReduceMean")?;
    if !ix.reduces_last_axis(r2) {
        return None;
    }
    let add = ix.next(ix.out(r2)?, "Add")?;
    let (eps_name, _) = ix.other(add, ix.out(r2)?)?;
    let eps = ix.scalar(eps_name)?;
    let sqrt = ix.next(ix.out(add)?, "Sqrt")?;
    if ix.next(ix.out(sqrt)?, "Div") != Some(div)
        || ix.node(div).input.first().map(String::as_str) != Some(d)
    {
        return None;
    }
    let mut nodes = vec![r, sub, pow, r2, add, sqrt, div];
    let mut out = ix.out(div)?.to_string();
    let (mut scale, mut shift) = (None, None);
    let vector = |c: &str| ix.is_const(c) && ix.is_last_axis_vector(c);
    if let Some(mul) = ix.next(&out, "Mul") {
        if let Some((c, _)) = ix.other(mul, &out).filter(|(c, _)| vector(c)) {
            nodes.push(mul);
            scale = Some(c.to_string());
            out = ix.out(mul)?.to_string();
            if let Some(bias) = ix.next(&out, "Add") {
                if let Some((c, _)) = ix.other(bias, &out).filter(|(c, _)| vector(c)) {
                    nodes.push(bias);
                    shift = Some(c.to_string());
                    out = ix.out(bias)?.to_string();
                }
            }
        }
    }
    Some(LayerNormMatch {
        nodes,
        x,
        out,
        eps: eps as f32,
        scale,
        shift,
    })
}

/// Rewrite the patterns in `nodes` (any order). `outputs` are the graph's output names,
/// `constants` the names of initializers and of `Constant` outputs, with their value when they
/// are scalars and their shapes. Returns the new node list and how many patterns were
/// rewritten.
pub fn rewrite(
    nodes: &[NodeProto],
    outputs: &HashSet<String>,
    constants: &HashMap<String, ConstInfo>,
) -> (Vec<NodeProto>, usize) {
    let mut producer = HashMap::new();
    let mut readers: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            producer.insert(o.as_str(), i);
        }
        let mut seen = HashSet::new();
        for inp in n.input.iter().filter(|s| !s.is_empty()) {
            if seen.insert(inp.as_str()) {
                readers.entry(inp.as_str()).or_default().push(i);
            }
        }
    }
    let ix = Index {
        nodes,
        producer,
        readers,
        outputs,
        constants,
    };
    let mut taken = vec![false; nodes.len()];
    // Replacement node, placed at the position of the pattern's last node.
    let mut replace: HashMap<usize, NodeProto> = HashMap::new();
    let mut count = 0;
    for (i, n) in nodes.iter().enumerate() {
        let found = match (n.domain.is_empty(), n.op_type.as_str()) {
            (true, "Erf") => match_gelu(&ix, i).map(|(ns, x, out)| {
                let base = &nodes[ns[0]];
                (ns, synthetic("Gelu", base, vec![x], &out, Vec::new()))
            }),
            (true, "Tanh") => match_gelu_tanh(&ix, i).map(|(ns, x, out)| {
                let base = &nodes[ns[0]];
                let attrs = vec![AttributeProto {
                    name: "approximate".into(),
                    s: b"tanh".to_vec(),
                    r#type: 3,
                    ..AttributeProto::default()
                }];
                (ns, synthetic("Gelu", base, vec![x], &out, attrs))
            }),
            (true, "Sigmoid") => match_swish(&ix, i).map(|(ns, x, alpha, out)| {
                let base = &nodes[ns[0]];
                let attrs = vec![AttributeProto {
                    name: "alpha".into(),
                    f: alpha as f32,
                    r#type: 1,
                    ..AttributeProto::default()
                }];
                (ns, synthetic("Swish", base, vec![x], &out, attrs))
            }),
            (true, "ReduceMean") => match_layer_norm(&ix, i).map(|m| {
                let base = &nodes[m.nodes[0]];
                let attrs = vec![AttributeProto {
                    name: "epsilon".into(),
                    f: m.eps,
                    r#type: 1,
                    ..AttributeProto::default()
                }];
                let inputs = std::iter::once(m.x).chain(m.scale).chain(m.shift).collect();
                let node = synthetic("LayerNormalization", base, inputs, &m.out, attrs);
                (m.nodes, node)
            }),
            _ => None,
        };
        let Some((ns, node)) = found else { continue };
        if ns.iter().any(|&k| taken[k]) {
            continue;
        }
        for &k in &ns {
            taken[k] = true;
        }
        if let Some(&last) = ns.iter().max() {
            replace.insert(last, node);
        }
        count += 1;
    }
    let out = nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| match replace.remove(&i) {
            Some(r) => Some(r),
            None if taken[i] => None,
            None => Some(n.clone()),
        })
        .collect();
    (out, count)
}
