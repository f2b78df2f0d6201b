//! The walk from ONNX nodes to IR nodes: constants, activations, folding, opaque operators.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use opsched_graph::{
    Activation, BinaryKind, Block, Conv2d, DType, ElementwiseKind, Graph, GraphOutput, NearestMode,
    NodeDef, NodeId, Op, Pool2d, PoolKind, ReduceKind, Resize, ResizeCoord, ResizeMode, Shape,
    Tensor, Term, Value, Weights,
};

use crate::consts::{self, Const};
use crate::data::{self, Folder};
use crate::error::{OnnxError, Result};
use crate::fold;
use crate::proto::{data_type, AttributeProto, GraphProto, ModelProto, NodeProto, TensorTypeProto};
use crate::{patterns, shapes};
use crate::{ImportReport, OnnxOptions};

/// An activation: (a channel slice of) the output of an IR node.
#[derive(Clone, Debug)]
struct Act {
    node: usize,
    shape: Shape,
    channels: Option<(usize, usize)>,
}

impl Act {
    fn term(&self) -> Term {
        vec![Value {
            node: NodeId(self.node as u32),
            channels: self.channels,
        }]
    }
}

#[derive(Clone, Debug)]
enum Val {
    Act(Act),
    Const(Const),
}

/// An IR node under construction (operators are still folded into it).
#[derive(Clone, Debug)]
struct PNode {
    name: String,
    op: Op,
    inputs: Vec<Term>,
    shape: Shape,
    /// Module path from the ONNX node name.
    scope: Vec<String>,
    /// The ONNX tensor this node's output currently is (changes as operators fold in).
    out_tensor: String,
    dead: bool,
    /// Parameter tensors (when the import loads weights), by the names of `opsched_graph::weights`.
    params: Vec<(&'static str, Tensor)>,
}

impl PNode {
    fn param(&self, what: &str) -> Option<&Tensor> {
        self.params.iter().find(|(w, _)| *w == what).map(|(_, t)| t)
    }
    fn set_param(&mut self, what: &'static str, t: Tensor) {
        match self.params.iter_mut().find(|(w, _)| *w == what) {
            Some(slot) => slot.1 = t,
            None => self.params.push((what, t)),
        }
    }
}

/// Element-wise operators of several inputs (with broadcasting) beyond Add, Sub, Mul, Div and
/// Sum: `binary` operators ([`BINARY_KINDS`]), `where`, or opaque passes.
const BINARY: &[&str] = &[
    "And",
    "Equal",
    "Greater",
    "GreaterOrEqual",
    "Less",
    "LessOrEqual",
    "Max",
    "Mean",
    "Min",
    "Mod",
    "Or",
    "Pow",
    "PRelu",
    "Where",
    "Xor",
];

/// The two-operand element-wise types that are `binary` operators, and their kinds.
/// Booleans are 1.0 and 0.0 (a Cast to float is a view of them): `And` is their minimum, `Or`
/// their maximum, `Xor` their inequality.
const BINARY_KINDS: &[(&str, BinaryKind)] = &[
    ("Sub", BinaryKind::Sub),
    ("Div", BinaryKind::Div),
    ("Pow", BinaryKind::Pow),
    ("Max", BinaryKind::Max),
    ("Min", BinaryKind::Min),
    ("And", BinaryKind::Min),
    ("Or", BinaryKind::Max),
    ("Xor", BinaryKind::NotEqual),
    ("Equal", BinaryKind::Equal),
    ("Less", BinaryKind::Less),
    ("Greater", BinaryKind::Greater),
    ("LessOrEqual", BinaryKind::LessOrEqual),
    ("GreaterOrEqual", BinaryKind::GreaterOrEqual),
];

/// Why a node was not mapped.
enum Fail {
    /// Not supported: the key for the error's list (the op type, or the op type and variant).
    Unsupported(String),
    /// The node is wrong (or we cannot import it for a reason the user must fix).
    Error(String),
}

impl From<String> for Fail {
    fn from(s: String) -> Self {
        Fail::Error(s)
    }
}

type Mapped = std::result::Result<(), Fail>;

fn unsupported(op: &NodeProto, variant: &str) -> Fail {
    Fail::Unsupported(format!("{} ({variant})", op.op_type))
}

fn attr<'a>(node: &'a NodeProto, name: &str) -> Option<&'a AttributeProto> {
    node.attribute.iter().find(|a| a.name == name)
}
fn attr_i(node: &NodeProto, name: &str, default: i64) -> i64 {
    attr(node, name).map_or(default, |a| a.i)
}
fn attr_f(node: &NodeProto, name: &str, default: f64) -> f64 {
    attr(node, name).map_or(default, |a| f64::from(a.f))
}
fn attr_ints(node: &NodeProto, name: &str) -> Option<Vec<i64>> {
    attr(node, name).map(|a| a.ints.clone())
}
fn attr_s(node: &NodeProto, name: &str) -> Option<String> {
    attr(node, name).map(|a| String::from_utf8_lossy(&a.s).into_owned())
}

/// A node's display name: its name, else its first output, else its type.
fn display_name(n: &NodeProto) -> String {
    if !n.name.is_empty() {
        n.name.clone()
    } else if let Some(o) = n.output.iter().find(|o| !o.is_empty()) {
        o.clone()
    } else {
        n.op_type.clone()
    }
}

/// The module path of a node from the names exporters give, e.g. `["layer1", "layer1.0",
/// "conv1"]` for `/layer1/layer1.0/conv1/Conv` (the last component names the operator).
fn scope_path(name: &str) -> Vec<String> {
    let parts: Vec<&str> = name.split('/').filter(|p| !p.is_empty()).collect();
    match parts.split_last() {
        Some((_, scopes)) => scopes.iter().map(|s| s.to_string()).collect(),
        None => Vec::new(),
    }
}

/// The module path of a node: from its name (`/layer1/layer1.0/conv1/Conv`, PyTorch's
/// TorchScript exporter) or from the `pkg.torch.onnx.name_scopes` metadata (PyTorch's dynamo
/// exporter: `['', 'layer1', 'layer1.0', 'layer1.0.conv1', 'conv2d_1']`).
fn node_scope(node: &NodeProto) -> Vec<String> {
    if node.name.contains('/') {
        return scope_path(&node.name);
    }
    let Some(p) = node
        .metadata_props
        .iter()
        .find(|p| p.key == "pkg.torch.onnx.name_scopes")
    else {
        return Vec::new();
    };
    let items: Vec<String> = p
        .value
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(|s| s.trim().trim_matches(|c| c == '\'' || c == '"').to_string())
        .filter(|s| !s.is_empty())
        .collect();
    match items.split_last() {
        Some((_, scopes)) => scopes.to_vec(),
        None => Vec::new(),
    }
}

/// Block key of a node: its top-level module when that module has operators of its own (an
/// Inception module's concat: `/Mixed_5b/Concat`), else the child of that container
/// (`/layer1/layer1.0/...` gives `layer1.0`; `/features/denseblock1/...` gives
/// `features/denseblock1`). `modules` holds the top-level scopes with operators of their own.
fn block_key(path: &[String], modules: &HashSet<String>) -> Option<String> {
    match path {
        [] => None,
        [first, second, ..] if !modules.contains(first) => {
            if second.starts_with(&format!("{first}.")) {
                Some(second.clone())
            } else {
                Some(format!("{first}/{second}"))
            }
        }
        [first, ..] => Some(first.clone()),
    }
}

/// Most elements of one tensor (2^40, 4 TiB in f32): beyond, sizes are corrupt, and the IR's
/// FLOP and byte counts would overflow.
const MAX_ELEMS: u64 = 1 << 40;

/// The three terms of a two-operand `Einsum` equation with an explicit output (`ab,bc->ac`,
/// no whitespace), each a list of axis labels of rank `r`: a leading `...` stands for the
/// first `r - 2` axes, the same in every term. `None` for any other form, a label used twice
/// in a term, or terms of another rank.
fn einsum_terms(eq: &str, r: usize) -> Option<[Vec<char>; 3]> {
    let (ins, out) = eq.split_once("->")?;
    let (a, b) = ins.split_once(',')?;
    let term = |t: &str| -> Option<Vec<char>> {
        let (batch, rest) = match t.strip_prefix("...") {
            // Batch axes the ellipsis stands for: labels no letter can be (private use).
            Some(rest) => {
                let batch = (0..r.checked_sub(2)?).map(|i| char::from_u32(0xE000 + i as u32));
                (batch.collect::<Option<Vec<_>>>()?, rest)
            }
            None => (Vec::new(), t),
        };
        let labels: Vec<char> = batch.into_iter().chain(rest.chars()).collect();
        let letters = rest.chars().all(|c| c.is_ascii_alphabetic());
        let unique = labels
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len()
            == labels.len();
        (letters && unique && labels.len() == r).then_some(labels)
    };
    Some([term(a)?, term(b)?, term(out)?])
}

/// How a batched matrix product computes an `Einsum` ([`einsum_terms`]): which of the two
/// operands and the output have their last two axes swapped against `ik,kj->ij`.
struct EinsumProduct {
    transpose_a: bool,
    transpose_b: bool,
    transpose_out: bool,
}

impl EinsumProduct {
    fn of(a: &[char], b: &[char], o: &[char]) -> Option<EinsumProduct> {
        let r = a.len();
        if r < 2 || a[..r - 2] != b[..r - 2] || a[..r - 2] != o[..r - 2] {
            return None;
        }
        let (a2, b2, o2) = (&a[r - 2..], &b[r - 2..], &o[r - 2..]);
        // The contracted label: in both operands' last two, not in the output.
        let k = *a2.iter().find(|c| b2.contains(c) && !o2.contains(c))?;
        let i = *a2.iter().find(|&&c| c != k)?;
        let j = *b2.iter().find(|&&c| c != k)?;
        let transpose_out = match o2 {
            [u, v] if (*u, *v) == (i, j) => false,
            [u, v] if (*u, *v) == (j, i) => true,
            _ => return None,
        };
        Some(EinsumProduct {
            transpose_a: a2 == [k, i],
            transpose_b: b2 == [j, k],
            transpose_out,
        })
    }
}

/// A `reshape` operator to `shape`: the IR's views of a value under another shape.
fn view(shape: &[usize]) -> Op {
    Op::Reshape {
        shape: shape.iter().map(|&d| d as i64).collect(),
    }
}

fn check_size(shape: &[usize]) -> std::result::Result<(), String> {
    match shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
    {
        Some(n) if n <= MAX_ELEMS => Ok(()),
        _ => Err(format!("shape {shape:?} is implausibly large")),
    }
}

/// A per-channel parameter of `n` values (`[n]`) from a constant of `n` values (or one).
fn vector(t: &Tensor, n: usize, what: &str) -> std::result::Result<Tensor, String> {
    let v = fold::expand(t, n).map_err(|e| format!("its {what}: {e}"))?;
    Tensor::new(vec![n], v)
}

fn to_usize(v: i64, what: &str) -> std::result::Result<usize, String> {
    usize::try_from(v).map_err(|_| format!("{what} {v} must be non-negative"))
}

fn pair(v: &[i64], what: &str) -> std::result::Result<[usize; 2], String> {
    match v {
        [a, b] => Ok([to_usize(*a, what)?, to_usize(*b, what)?]),
        _ => Err(format!("{what} {v:?} must have 2 entries")),
    }
}

/// Kernel, stride, padding (before and after) and dilation of a 2-D window operator (Conv,
/// MaxPool, AveragePool).
struct Window {
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    padding_end: Option<[usize; 2]>,
    dilation: [usize; 2],
}

fn window(
    node: &NodeProto,
    input: &[usize],
    kernel: [usize; 2],
) -> std::result::Result<Window, Fail> {
    let stride = match attr_ints(node, "strides") {
        Some(v) => pair(&v, "strides")?,
        None => [1, 1],
    };
    let dilation = match attr_ints(node, "dilations") {
        Some(v) => pair(&v, "dilations")?,
        None => [1, 1],
    };
    if stride.contains(&0) || dilation.contains(&0) {
        return Err(Fail::Error(format!(
            "strides {stride:?} and dilations {dilation:?} must be positive"
        )));
    }
    let auto_pad = attr_s(node, "auto_pad").unwrap_or_default();
    let too_big = || Fail::Error("window arithmetic overflows".into());
    let span = |i: usize| {
        dilation[i]
            .checked_mul(kernel[i].max(1) - 1)
            .and_then(|v| v.checked_add(1))
    };
    let pads: [usize; 4] = match auto_pad.as_str() {
        "" | "NOTSET" => match attr_ints(node, "pads") {
            None => [0; 4],
            Some(p) if p.len() == 4 => [
                to_usize(p[0], "pad")?,
                to_usize(p[1], "pad")?,
                to_usize(p[2], "pad")?,
                to_usize(p[3], "pad")?,
            ],
            Some(p) => return Err(Fail::Error(format!("pads {p:?} must have 4 entries"))),
        },
        "VALID" => [0; 4],
        "SAME_UPPER" | "SAME_LOWER" => {
            let mut p = [0; 4];
            for i in 0..2 {
                let out = input[2 + i].div_ceil(stride[i]);
                let total = out
                    .saturating_sub(1)
                    .checked_mul(stride[i])
                    .and_then(|v| v.checked_add(span(i)?))
                    .ok_or_else(too_big)?
                    .saturating_sub(input[2 + i]);
                let (small, big) = (total / 2, total - total / 2);
                let (b, e) = if auto_pad == "SAME_UPPER" {
                    (small, big)
                } else {
                    (big, small)
                };
                p[i] = b;
                p[i + 2] = e;
            }
            p
        }
        other => return Err(Fail::Error(format!("unknown auto_pad '{other}'"))),
    };
    let padding = [pads[0], pads[1]];
    let end = [pads[2], pads[3]];
    Ok(Window {
        kernel,
        stride,
        padding,
        padding_end: (end != padding).then_some(end),
        dilation,
    })
}

/// Everything the walk keeps.
struct Importer<'a> {
    /// Whether parameter values are loaded (`OnnxOptions::weights`).
    weights: bool,
    opset: i64,
    vals: HashMap<String, Val>,
    consumers: HashMap<String, usize>,
    value_info: HashMap<String, &'a TensorTypeProto>,
    symbols: HashMap<String, usize>,
    nodes: Vec<PNode>,
    names: HashSet<String>,
    unknown: BTreeMap<String, usize>,
    report: ImportReport,
    /// Constant nodes made for ONNX tensors used as operands, by tensor name.
    constant_nodes: HashMap<String, usize>,
}

impl<'a> Importer<'a> {
    fn act(&self, ins: &[Option<Val>], i: usize) -> std::result::Result<Act, Fail> {
        match ins.get(i) {
            Some(Some(Val::Act(a))) => Ok(a.clone()),
            Some(Some(Val::Const(_))) => Err(Fail::Unsupported(String::new())),
            _ => Err(Fail::Error(format!("input {i} is missing"))),
        }
    }

    fn konst(ins: &[Option<Val>], i: usize) -> Option<&Const> {
        match ins.get(i) {
            Some(Some(Val::Const(c))) => Some(c),
            _ => None,
        }
    }

    /// The values of constant input `i` (a shape, axes), or an error naming what is missing.
    fn ints(ins: &[Option<Val>], i: usize, what: &str) -> std::result::Result<Vec<i64>, Fail> {
        match ins.get(i) {
            Some(Some(Val::Const(c))) => c.as_ints().ok_or_else(|| {
                Fail::Error(match &c.external {
                    Some(why) => format!(
                        "needs the values of its {what} (input {i}), which could not be read: {why}"
                    ),
                    None => {
                        format!("needs the values of its {what} (input {i}), which are not known")
                    }
                })
            }),
            Some(Some(Val::Act(_))) => Err(Fail::Error(format!(
                "its {what} (input {i}) is computed at run time; opsched needs it constant"
            ))),
            _ => Err(Fail::Error(format!("its {what} (input {i}) is missing"))),
        }
    }

    /// The shape ONNX recorded for a value, with symbolic dimensions resolved.
    fn recorded_shape(&self, tensor: &str) -> Option<Shape> {
        let t = self.value_info.get(tensor)?;
        let dims = &t.shape.as_ref()?.dim;
        dims.iter()
            .map(|d| match (d.dim_value, &d.dim_param) {
                (Some(v), _) if v > 0 => usize::try_from(v).ok(),
                (_, Some(p)) => self.symbols.get(p).copied(),
                _ => None,
            })
            .collect()
    }

    /// Whether `tensor` (the value `a`) can be folded into its producer: the whole output of an
    /// IR node that produced exactly this tensor, read by one consumer only.
    fn fusable(&self, tensor: &str, a: &Act) -> Option<usize> {
        let n = self.nodes.get(a.node)?;
        (a.channels.is_none()
            && n.out_tensor == tensor
            && !n.op.is_input()
            && self.consumers.get(tensor).copied().unwrap_or(0) == 1)
            .then_some(a.node)
    }

    /// The full values of a constant operand when the import loads weights (`None` when it
    /// does not); an error naming `what` when they are needed but not known.
    fn values(&self, c: &Const, what: &str) -> std::result::Result<Option<Tensor>, Fail> {
        if !self.weights {
            return Ok(None);
        }
        c.tensor().map(Some).ok_or_else(|| {
            Fail::Error(format!(
                "the values of its {what} are not known (computed by operators opsched does not \
                 evaluate at import)"
            ))
        })
    }

    /// The values of constant input `i` as a parameter (`None` without weights); an error when
    /// the input is no constant.
    fn param_input(
        &self,
        ins: &[Option<Val>],
        i: usize,
        what: &str,
    ) -> std::result::Result<Option<Tensor>, Fail> {
        match ins.get(i) {
            Some(Some(Val::Const(c))) => self.values(c, what),
            Some(Some(Val::Act(_))) => Err(Fail::Error(format!(
                "its {what} (input {i}) is computed at run time; opsched needs it constant"
            ))),
            _ => Err(Fail::Error(format!("its {what} (input {i}) is missing"))),
        }
    }

    /// The constant node holding ONNX tensor `tensor` (made on first use), as an activation
    /// that operators can read.
    fn constant_node(&mut self, tensor: &str, c: &Const) -> std::result::Result<Act, Fail> {
        let shape = c
            .shape
            .clone()
            .ok_or_else(|| Fail::Error(format!("the shape of constant '{tensor}' is unknown")))?;
        if let Some(&id) = self.constant_nodes.get(tensor) {
            return Ok(Act {
                node: id,
                shape,
                channels: None,
            });
        }
        check_size(&shape)?;
        if shape.contains(&0) {
            return Err(Fail::Error(format!(
                "constant '{tensor}' is empty ({shape:?})"
            )));
        }
        let values = self.values(c, &format!("constant '{tensor}'"))?;
        let name = self.unique_name(tensor);
        let id = self.nodes.len();
        self.nodes.push(PNode {
            name,
            op: Op::Constant {
                shape: shape.clone(),
            },
            inputs: Vec::new(),
            shape: shape.clone(),
            scope: Vec::new(),
            out_tensor: tensor.to_string(),
            dead: false,
            params: values.map(|t| vec![("value", t)]).unwrap_or_default(),
        });
        self.constant_nodes.insert(tensor.to_string(), id);
        Ok(Act {
            node: id,
            shape,
            channels: None,
        })
    }

    /// Input `i` as a term: an activation, or a constant made a constant node.
    fn operand(
        &mut self,
        node: &NodeProto,
        ins: &[Option<Val>],
        i: usize,
    ) -> std::result::Result<Act, Fail> {
        match ins.get(i) {
            Some(Some(Val::Act(a))) => Ok(a.clone()),
            Some(Some(Val::Const(c))) => {
                let c = c.clone();
                self.constant_node(&node.input[i], &c)
            }
            _ => Err(Fail::Error(format!("input {i} is missing"))),
        }
    }

    fn unique_name(&mut self, base: &str) -> String {
        let mut name = base.to_string();
        let mut k = 1;
        while !self.names.insert(name.clone()) {
            k += 1;
            name = format!("{base}#{k}");
        }
        name
    }

    /// Add an IR node producing `tensor`; its shape comes from the IR's inference.
    fn push(
        &mut self,
        node: &NodeProto,
        tensor: &str,
        op: Op,
        inputs: Vec<Term>,
    ) -> std::result::Result<usize, Fail> {
        let terms: Vec<Shape> = inputs
            .iter()
            .map(|t| {
                t.first()
                    .and_then(|v| {
                        let n = self.nodes.get(v.node.index())?;
                        let mut s = n.shape.clone();
                        if let (Some((b, e)), Some(c)) = (v.channels, s.get_mut(1)) {
                            *c = e - b;
                        }
                        Some(s)
                    })
                    .unwrap_or_default()
            })
            .collect();
        let shape = op.infer_shape(&terms)?;
        check_size(&shape)?;
        let base =
            if node.output.len() > 1 && node.output.first().map(String::as_str) != Some(tensor) {
                format!("{}:{tensor}", display_name(node))
            } else {
                display_name(node)
            };
        let name = self.unique_name(&base);
        let id = self.nodes.len();
        self.nodes.push(PNode {
            name,
            op,
            inputs,
            shape: shape.clone(),
            scope: node_scope(node),
            out_tensor: tensor.to_string(),
            dead: false,
            params: Vec::new(),
        });
        self.vals.insert(
            tensor.to_string(),
            Val::Act(Act {
                node: id,
                shape,
                channels: None,
            }),
        );
        Ok(id)
    }

    /// Make `out` another name for `a` (a removed operator), moving the fold point along.
    fn alias(&mut self, input: &str, out: &str, a: Act) {
        if let Some(n) = self.fusable(input, &a) {
            self.nodes[n].out_tensor = out.to_string();
        }
        self.vals.insert(out.to_string(), Val::Act(a));
        self.report.removed += 1;
    }

    /// Fold into producer `n`: `out` is now its output.
    fn fold(&mut self, n: usize, out: &str) {
        let a = Act {
            node: n,
            shape: self.nodes[n].shape.clone(),
            channels: None,
        };
        self.nodes[n].out_tensor = out.to_string();
        self.vals.insert(out.to_string(), Val::Act(a));
    }

    fn out0(node: &NodeProto) -> std::result::Result<&str, Fail> {
        node.output
            .first()
            .map(String::as_str)
            .filter(|o| !o.is_empty())
            .ok_or_else(|| Fail::Error("has no output".into()))
    }

    /// Opaque operators for every output of `node`, reading all its activation inputs.
    fn opaque(&mut self, node: &NodeProto, ins: &[Option<Val>], shape0: Option<Shape>) -> Mapped {
        let mut terms: Vec<Term> = Vec::new();
        let mut first: Option<Shape> = None;
        for v in ins.iter().flatten() {
            if let Val::Act(a) = v {
                first.get_or_insert_with(|| a.shape.clone());
                let t = a.term();
                if !terms.contains(&t) {
                    terms.push(t);
                }
            }
        }
        for (k, out) in node.output.iter().enumerate() {
            if out.is_empty() || (k > 0 && !self.consumers.contains_key(out)) {
                continue;
            }
            let shape = match (k, &shape0) {
                (0, Some(s)) => s.clone(),
                _ => match self.recorded_shape(out) {
                    Some(s) => s,
                    None => {
                        let s = first.clone().unwrap_or_default();
                        tracing::warn!(
                            node = %display_name(node),
                            op_type = %node.op_type,
                            "the model records no shape for output '{out}'; assuming the shape \
                             of the first input, {s:?}"
                        );
                        s
                    }
                },
            };
            let op = Op::Opaque {
                op_type: node.op_type.clone(),
                shape,
            };
            self.push(node, out, op, terms.clone())?;
        }
        Ok(())
    }

    /// The activation an ONNX activation node computes, with its parameters.
    fn activation_of(
        &self,
        node: &NodeProto,
        ins: &[Option<Val>],
    ) -> std::result::Result<Activation, Fail> {
        let f32_attr = |name: &str, default: f32| attr(node, name).map_or(default, |a| a.f);
        Ok(match node.op_type.as_str() {
            "Relu" => Activation::Relu,
            "Sigmoid" => Activation::Sigmoid,
            "Tanh" => Activation::Tanh,
            "HardSwish" => Activation::HardSwish,
            "Swish" => Activation::Swish {
                alpha: f32_attr("alpha", 1.0),
            },
            "Softplus" => Activation::Softplus,
            "Mish" => Activation::Mish,
            "Sqrt" => Activation::Sqrt,
            "Reciprocal" => Activation::Reciprocal,
            "Exp" => Activation::Exp,
            "Log" => Activation::Log,
            "Neg" => Activation::Neg,
            "Abs" => Activation::Abs,
            "Erf" => Activation::Erf,
            "Sin" => Activation::Sin,
            "Cos" => Activation::Cos,
            "Softsign" => Activation::Softsign,
            "Sign" => Activation::Sign,
            "Floor" => Activation::Floor,
            "Ceil" => Activation::Ceil,
            "Round" => Activation::Round,
            "IsNaN" => Activation::IsNan,
            "IsInf" => Activation::IsInf {
                negative: attr_i(node, "detect_negative", 1) != 0,
                positive: attr_i(node, "detect_positive", 1) != 0,
            },
            "Elu" => Activation::Elu {
                alpha: f32_attr("alpha", 1.0),
            },
            "Celu" => Activation::Celu {
                alpha: f32_attr("alpha", 1.0),
            },
            "ThresholdedRelu" => Activation::ThresholdedRelu {
                alpha: f32_attr("alpha", 1.0),
            },
            "Selu" => Activation::Selu {
                alpha: f32_attr("alpha", Activation::SELU_ALPHA),
                gamma: f32_attr("gamma", Activation::SELU_GAMMA),
            },
            "Gelu" => match attr_s(node, "approximate").as_deref() {
                None | Some("none") => Activation::Gelu,
                Some("tanh") => Activation::GeluTanh,
                Some(other) => return Err(Fail::Error(format!("unknown approximate '{other}'"))),
            },
            "LeakyRelu" => Activation::LeakyRelu {
                alpha: f32_attr("alpha", 0.01),
            },
            "HardSigmoid" => Activation::HardSigmoid {
                alpha: f32_attr("alpha", 0.2),
                beta: f32_attr("beta", 0.5),
            },
            "Clip" if self.opset < 11 => Activation::Clip {
                min: attr(node, "min").map(|a| a.f),
                max: attr(node, "max").map(|a| a.f),
            },
            "Clip" => {
                let bound = |i: usize, what: &str| match ins.get(i) {
                    None | Some(None) => Ok(None),
                    Some(Some(Val::Const(c))) => {
                        c.scalar().map(|v| Some(v as f32)).ok_or_else(|| {
                            Fail::Error(format!("its {what} (input {i}) is not a known scalar"))
                        })
                    }
                    Some(Some(Val::Act(_))) => Err(Fail::Error(format!(
                        "its {what} (input {i}) is computed at run time; opsched needs it constant"
                    ))),
                };
                Activation::Clip {
                    min: bound(1, "min")?,
                    max: bound(2, "max")?,
                }
            }
            other => return Err(Fail::Unsupported(other.to_string())),
        })
    }

    /// Fuse an activation into a single-consumer conv or linear producer, else a standalone op.
    fn activation(&mut self, node: &NodeProto, ins: &[Option<Val>], act: Activation) -> Mapped {
        let x = self.act(ins, 0)?;
        let out = Self::out0(node)?;
        let input = &node.input[0];
        if let Some(n) = self.fusable(input, &x) {
            let slot = match &mut self.nodes[n].op {
                Op::Conv2d(c) if c.act == Activation::None => Some(&mut c.act),
                Op::Linear { act: a, .. } if *a == Activation::None => Some(a),
                _ => None,
            };
            if let Some(slot) = slot {
                *slot = act;
                self.fold(n, out);
                self.report.fused_activations += 1;
                return Ok(());
            }
        }
        self.push(node, out, Op::Activation { act }, vec![x.term()])?;
        Ok(())
    }

    /// Map one node with at least one activation input.
    fn map(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let op_type = node.op_type.as_str();
        match op_type {
            "Conv" => self.conv(node, ins),
            "BatchNormalization" => self.batch_norm(node, ins),
            "Relu" | "Sigmoid" | "Tanh" | "Gelu" | "Clip" | "LeakyRelu" | "HardSigmoid"
            | "HardSwish" | "Swish" | "Softplus" | "Mish" | "Sqrt" | "Reciprocal" | "Exp"
            | "Log" | "Neg" | "Abs" | "Erf" | "Sin" | "Cos" | "Softsign" | "Sign" | "Floor"
            | "Ceil" | "Round" | "Elu" | "Celu" | "ThresholdedRelu" | "Selu" | "IsNaN"
            | "IsInf" => {
                let act = self.activation_of(node, ins)?;
                self.activation(node, ins, act)
            }
            "MaxPool" | "AveragePool" => self.pool(node, ins),
            "GlobalAveragePool" | "GlobalMaxPool" => {
                let x = self.act(ins, 0)?;
                if x.shape.len() != 4 {
                    return Err(unsupported(node, "not 2-D"));
                }
                let kind = if op_type == "GlobalMaxPool" {
                    PoolKind::GlobalMax
                } else {
                    PoolKind::GlobalAvg
                };
                let p = Pool2d::new(kind, 1, 1, 0);
                self.push(node, Self::out0(node)?, Op::Pool2d(p), vec![x.term()])?;
                Ok(())
            }
            "Add" | "Sub" | "Mul" | "Div" | "Sum" => self.elementwise(node, ins),
            "Concat" => self.concat(node, ins),
            "Gemm" => self.gemm(node, ins),
            "MatMul" => self.matmul(node, ins),
            "Einsum" => self.einsum(node, ins),
            "Softmax" | "LogSoftmax" => self.softmax(node, ins),
            "LayerNormalization" => self.layer_norm(node, ins),
            "InstanceNormalization" => self.instance_norm(node, ins),
            "Reshape" => {
                let x = self.act(ins, 0)?;
                let target = Self::ints(ins, 1, "target shape")?;
                if attr_i(node, "allowzero", 0) == 1 && target.contains(&0) {
                    return Err(unsupported(node, "allowzero with a zero dimension"));
                }
                let shape = shapes::reshape(&x.shape, &target)?;
                self.reshape(node, x, shape)
            }
            "Flatten" => {
                let x = self.act(ins, 0)?;
                let shape = shapes::flatten(&x.shape, attr_i(node, "axis", 1))?;
                self.reshape(node, x, shape)
            }
            "Squeeze" => {
                let x = self.act(ins, 0)?;
                let axes = match attr_ints(node, "axes") {
                    Some(a) => Some(a),
                    None if node.input.get(1).is_some_and(|s| !s.is_empty()) => {
                        Some(Self::ints(ins, 1, "axes")?)
                    }
                    None => None,
                };
                let shape = shapes::squeeze(&x.shape, axes.as_deref())?;
                self.reshape(node, x, shape)
            }
            "Unsqueeze" => {
                let x = self.act(ins, 0)?;
                let axes = match attr_ints(node, "axes") {
                    Some(a) => a,
                    None => Self::ints(ins, 1, "axes")?,
                };
                let shape = shapes::unsqueeze(&x.shape, &axes)?;
                self.reshape(node, x, shape)
            }
            "Transpose" => {
                let x = self.act(ins, 0)?;
                let rank = x.shape.len();
                let perm =
                    attr_ints(node, "perm").unwrap_or_else(|| (0..rank as i64).rev().collect());
                let perm = shapes::perm_of(&perm, rank)?;
                let out = Self::out0(node)?;
                if perm.iter().enumerate().all(|(i, &p)| i == p) {
                    self.alias(&node.input[0], out, x);
                    return Ok(());
                }
                self.push(node, out, Op::Transpose { perm }, vec![x.term()])?;
                Ok(())
            }
            "CumSum" => {
                let x = self.act(ins, 0)?;
                let &[axis] = Self::ints(ins, 1, "axis")?.as_slice() else {
                    return Err(Fail::Error("its axis (input 1) is not one value".into()));
                };
                let op = Op::CumSum {
                    axis: shapes::axis(axis, x.shape.len())?,
                    exclusive: attr_i(node, "exclusive", 0) != 0,
                    reverse: attr_i(node, "reverse", 0) != 0,
                };
                self.push(node, Self::out0(node)?, op, vec![x.term()])?;
                Ok(())
            }
            "GatherElements" => {
                let data = self.operand(node, ins, 0)?;
                let idx = self.operand(node, ins, 1)?;
                let axis = shapes::axis(attr_i(node, "axis", 0), data.shape.len())?;
                let terms = vec![data.term(), idx.term()];
                self.push(node, Self::out0(node)?, Op::GatherElements { axis }, terms)?;
                Ok(())
            }
            "Identity" | "Dropout" | "Cast" => {
                let x = self.act(ins, 0)?;
                if node
                    .output
                    .iter()
                    .skip(1)
                    .any(|o| self.consumers.contains_key(o))
                {
                    return Err(unsupported(node, "mask output used"));
                }
                let out = Self::out0(node)?;
                self.alias(&node.input[0], out, x);
                Ok(())
            }
            "Split" => self.split(node, ins),
            "Gather" => self.gather(node, ins),
            "Pad" => self.pad(node, ins),
            "Resize" | "Upsample" => self.resize(node, ins),
            "Expand" => {
                let x = self.act(ins, 0)?;
                let target = Self::ints(ins, 1, "target shape")?;
                let target: Shape = target.iter().map(|&d| d.max(1) as usize).collect();
                let shape = shapes::broadcast(&x.shape, &target)?;
                let out = Self::out0(node)?;
                if shape == x.shape {
                    // Nothing to repeat: a view of the input.
                    self.alias(&node.input[0], out, x);
                    return Ok(());
                }
                self.push(node, out, Op::Expand { shape: target }, vec![x.term()])?;
                Ok(())
            }
            op if op.starts_with("Reduce") || op == "ArgMax" || op == "ArgMin" => {
                let x = self.act(ins, 0)?;
                let axes = if op.starts_with("Arg") {
                    Some(vec![attr_i(node, "axis", 0)])
                } else {
                    match attr_ints(node, "axes") {
                        Some(a) => Some(a),
                        None if node.input.get(1).is_some_and(|s| !s.is_empty()) => {
                            Some(Self::ints(ins, 1, "axes")?)
                        }
                        None => None,
                    }
                };
                let keep = attr_i(node, "keepdims", 1) == 1;
                let spatial = axes.as_ref().is_some_and(|a| {
                    let mut a: Vec<i64> =
                        a.iter().map(|&v| if v < 0 { v + 4 } else { v }).collect();
                    a.sort_unstable();
                    a == [2, 3]
                });
                if keep && spatial && x.shape.len() == 4 && matches!(op, "ReduceMean" | "ReduceMax")
                {
                    // A global pool (how the dynamo exporter writes adaptive_avg_pool2d(1)).
                    let kind = if op == "ReduceMax" {
                        PoolKind::GlobalMax
                    } else {
                        PoolKind::GlobalAvg
                    };
                    let p = Pool2d::new(kind, 1, 1, 0);
                    self.push(node, Self::out0(node)?, Op::Pool2d(p), vec![x.term()])?;
                    return Ok(());
                }
                let axes = axes.filter(|a| !a.is_empty());
                let noop = axes.is_none() && attr_i(node, "noop_with_empty_axes", 0) == 1;
                let kind = match op {
                    "ReduceMean" => Some(ReduceKind::Mean),
                    "ReduceSum" => Some(ReduceKind::Sum),
                    "ReduceMax" => Some(ReduceKind::Max),
                    "ReduceMin" => Some(ReduceKind::Min),
                    "ReduceProd" => Some(ReduceKind::Prod),
                    "ReduceL1" => Some(ReduceKind::L1),
                    "ReduceL2" => Some(ReduceKind::L2),
                    "ReduceSumSquare" => Some(ReduceKind::SumSquare),
                    "ReduceLogSum" => Some(ReduceKind::LogSum),
                    "ReduceLogSumExp" => Some(ReduceKind::LogSumExp),
                    "ArgMax" | "ArgMin" => {
                        let last = attr_i(node, "select_last_index", 0) == 1;
                        Some(match (op == "ArgMax", last) {
                            (true, false) => ReduceKind::ArgMax,
                            (false, false) => ReduceKind::ArgMin,
                            (true, true) => ReduceKind::LastArgMax,
                            (false, true) => ReduceKind::LastArgMin,
                        })
                    }
                    _ => None,
                };
                // Consecutive axes (all of them where none are named): a `reduce`.
                let run = match &axes {
                    None => Some((0, x.shape.len())),
                    Some(a) => shapes::consecutive_axes(a, x.shape.len())?,
                };
                if let (Some(kind), Some((begin, end)), false) = (kind, run, noop) {
                    let op = Op::Reduce {
                        kind,
                        begin,
                        end,
                        keep,
                    };
                    self.push(node, Self::out0(node)?, op, vec![x.term()])?;
                    return Ok(());
                }
                let shape = match axes {
                    None if noop => x.shape.clone(),
                    None => {
                        if keep {
                            vec![1; x.shape.len()]
                        } else {
                            Vec::new()
                        }
                    }
                    Some(axes) => {
                        let at: Vec<usize> = axes
                            .iter()
                            .map(|&a| shapes::axis(a, x.shape.len()))
                            .collect::<std::result::Result<_, _>>()?;
                        x.shape
                            .iter()
                            .enumerate()
                            .filter_map(|(i, &d)| match (at.contains(&i), keep) {
                                (false, _) => Some(d),
                                (true, true) => Some(1),
                                (true, false) => None,
                            })
                            .collect()
                    }
                };
                // A reduction reads its input once: one pass, costed by the tensor sizes.
                self.opaque(node, &ins[..1], Some(shape))
            }
            // Booleans are 1.0 and 0.0: `not b` is `b == 0`.
            "Not" => {
                let x = self.operand(node, ins, 0)?;
                let out = Self::out0(node)?;
                let zero = self.constant_node(
                    &format!("{out}#zero"),
                    &Const::floats(Vec::new(), vec![0.0]),
                )?;
                let op = Op::Binary {
                    kind: BinaryKind::Equal,
                };
                self.push(node, out, op, vec![x.term(), zero.term()])?;
                Ok(())
            }
            op if BINARY.contains(&op) => self.elementwise(node, ins),
            "Slice" => self.slice(node, ins),
            _ => Err(Fail::Unsupported(op_type.to_string())),
        }
    }

    /// Softmax and log-softmax. Before opset 13 they normalize the input flattened to 2-D at
    /// `axis` (every axis from `axis` on): a reshape, the softmax and a reshape back, unless
    /// `axis` is the last one anyway.
    fn softmax(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let x = self.act(ins, 0)?;
        let out = Self::out0(node)?;
        let log = node.op_type == "LogSoftmax";
        let make = |axis: i64| {
            if log {
                Op::LogSoftmax { axis }
            } else {
                Op::Softmax { axis }
            }
        };
        let rank = x.shape.len();
        if self.opset >= 13 {
            let axis = attr_i(node, "axis", -1);
            self.push(node, out, make(axis), vec![x.term()])?;
            return Ok(());
        }
        let axis = attr_i(node, "axis", 1);
        let a = shapes::axis(axis, rank)?;
        if a + 1 == rank {
            self.push(node, out, make(axis), vec![x.term()])?;
            return Ok(());
        }
        let flat = shapes::flatten(&x.shape, a as i64)?;
        let (flat_t, soft_t) = (format!("{out}#2d"), format!("{out}#softmax"));
        let r1 = self.push(node, &flat_t, view(&flat), vec![x.term()])?;
        let sm = self.push(
            node,
            &soft_t,
            make(1),
            vec![vec![Value::whole(NodeId(r1 as u32))]],
        )?;
        self.push(
            node,
            out,
            view(&x.shape),
            vec![vec![Value::whole(NodeId(sm as u32))]],
        )?;
        Ok(())
    }

    /// Layer normalization over the last axis, with its scale and (optional) bias; a missing
    /// scale (the rewritten decomposition without one) is 1.
    fn layer_norm(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let x = self.act(ins, 0)?;
        let out = Self::out0(node)?;
        let rank = x.shape.len();
        let axis = shapes::axis(attr_i(node, "axis", -1), rank)?;
        if axis + 1 != rank {
            return Err(unsupported(node, "normalizing more than the last axis"));
        }
        let d = x.shape[rank - 1];
        for (i, what) in [(1, "scale"), (2, "bias")] {
            match ins.get(i) {
                Some(Some(Val::Const(c))) => {
                    let fits = c
                        .shape
                        .as_deref()
                        .and_then(|s| fold::channel_len(s, &x.shape, rank - 1));
                    if fits.is_none() {
                        return Err(Fail::Error(format!(
                            "its {what} (input {i}) of shape {:?} is not one value per element of the last axis ({d})",
                            c.shape
                        )));
                    }
                }
                Some(Some(Val::Act(_))) => {
                    return Err(unsupported(node, "scale or bias computed at run time"))
                }
                _ => {}
            }
        }
        let eps = attr_f(node, "epsilon", 1e-5);
        let mut params = Vec::new();
        if self.weights {
            for (i, what, fill) in [(1, "gamma", 1.0f32), (2, "beta", 0.0)] {
                let t = match ins.get(i) {
                    Some(Some(_)) => vector(
                        &self
                            .param_input(ins, i, what)?
                            .ok_or_else(|| Fail::Error(format!("its {what} is not known")))?,
                        d,
                        what,
                    )?,
                    _ => vector(&Tensor::new(vec![], vec![fill])?, d, what)?,
                };
                params.push((what, t));
            }
        }
        let id = self.push(node, out, Op::LayerNorm { eps }, vec![x.term()])?;
        self.nodes[id].params = params;
        Ok(())
    }

    /// `InstanceNormalization` (GroupNorm with a group per channel, as wav2vec2's feature
    /// encoder exports it): each image's channel normalised over its other axes, a layer norm
    /// of the value viewed as `[n, c, rest]`, then the per-channel scale and bias, an affine.
    fn instance_norm(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let x = self.act(ins, 0)?;
        let out = Self::out0(node)?;
        let (rank, shape) = (x.shape.len(), x.shape.clone());
        if rank < 3 {
            return Err(Fail::Error(format!(
                "needs an input of rank 3 or more, not {shape:?}"
            )));
        }
        let (c, rest) = (shape[1], shape[2..].iter().product::<usize>());
        for (i, what) in [(1, "scale"), (2, "bias")] {
            match ins.get(i) {
                Some(Some(Val::Const(k))) if k.numel() == Some(c) => {}
                Some(Some(Val::Act(_))) => {
                    return Err(unsupported(node, "scale or bias computed at run time"))
                }
                _ => {
                    return Err(Fail::Error(format!(
                        "its {what} (input {i}) must be {c} constants, one per channel"
                    )))
                }
            }
        }
        let flat = [shape[0], c, rest];
        let x = match rank {
            3 => x,
            _ => self.push_act(node, &format!("{out}#flat"), view(&flat), &x)?,
        };
        let eps = attr_f(node, "epsilon", 1e-5);
        let mut normed =
            self.push_act(node, &format!("{out}#normed"), Op::LayerNorm { eps }, &x)?;
        if self.weights {
            let ones = vector(&Tensor::new(vec![], vec![1.0])?, rest, "gamma")?;
            let zeros = vector(&Tensor::new(vec![], vec![0.0])?, rest, "beta")?;
            self.nodes[normed.node].params = vec![("gamma", ones), ("beta", zeros)];
        }
        if rank > 3 {
            normed = self.push_act(node, &format!("{out}#shaped"), view(&shape), &normed)?;
        }
        let id = self.push(node, out, Op::Affine, vec![normed.term()])?;
        if self.weights {
            for (i, what, name) in [(1, "scale", "scale"), (2, "bias", "shift")] {
                let t = self
                    .param_input(ins, i, what)?
                    .ok_or_else(|| Fail::Error(format!("its {what} is not known")))?;
                self.nodes[id].set_param(name, vector(&t, c, what)?);
            }
        }
        Ok(())
    }

    /// `Pad` with constant values and non-negative pads is a `pad` operator; other modes and
    /// cropping (negative pads) are opaque passes.
    fn pad(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let x = self.act(ins, 0)?;
        let pads = match attr_ints(node, "pads") {
            Some(p) => p,
            None => Self::ints(ins, 1, "pads")?,
        };
        let r = x.shape.len();
        let axes: Vec<usize> = match node.input.get(3).filter(|s| !s.is_empty()) {
            Some(_) => Self::ints(ins, 3, "axes")?
                .iter()
                .map(|&a| shapes::axis(a, r))
                .collect::<std::result::Result<_, _>>()?,
            None => (0..r).collect(),
        };
        if pads.len() != 2 * axes.len() {
            return Err(Fail::Error(format!("pads {pads:?} do not fit rank {r}")));
        }
        let mut shape = x.shape.clone();
        let (mut begin, mut end) = (vec![0i64; r], vec![0i64; r]);
        for (k, &a) in axes.iter().enumerate() {
            begin[a] = pads[k];
            end[a] = pads[k + axes.len()];
            let d = i64::try_from(shape[a])
                .ok()
                .and_then(|d| d.checked_add(begin[a])?.checked_add(end[a]))
                .ok_or_else(|| Fail::Error(format!("pads {pads:?} overflow")))?;
            shape[a] = to_usize(d, "padded size")?;
        }
        check_size(&shape)?;
        let mode = attr_s(node, "mode").unwrap_or_else(|| "constant".into());
        let value = match ins.get(2) {
            None | Some(None) => Some(attr(node, "value").map_or(0.0, |a| a.f)),
            Some(Some(Val::Const(c))) => c.scalar().map(|v| v as f32),
            Some(Some(Val::Act(_))) => None,
        };
        let non_negative = begin.iter().chain(&end).all(|&p| p >= 0);
        match value {
            Some(value) if mode == "constant" && non_negative => {
                let to_u = |v: &[i64]| v.iter().map(|&p| p as usize).collect::<Vec<_>>();
                let op = Op::Pad {
                    begin: to_u(&begin),
                    end: to_u(&end),
                    value,
                };
                self.push(node, Self::out0(node)?, op, vec![x.term()])?;
                Ok(())
            }
            _ => self.opaque(node, &ins[..1], Some(shape)),
        }
    }

    /// `Gather`: rows of a constant table by activation indices along axis 0 (an embedding
    /// lookup: token ids) is an `embedding`; one index of an activation's axis 1 (the first
    /// token, BERT's pooler and ViT's class token: `x[:, 0]`) is a channel slice, reshaped
    /// where the index is a scalar; anything else a copy costed by the tensor sizes (opaque).
    fn gather(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let shape_of = |v: &Option<Val>| match v {
            Some(Val::Act(a)) => Some(a.shape.clone()),
            Some(Val::Const(c)) => c.shape.clone(),
            None => None,
        };
        let (data, idx) = (
            ins.first().and_then(shape_of),
            ins.get(1).and_then(shape_of),
        );
        let (Some(data), Some(idx)) = (data, idx) else {
            return Err(Fail::Error("the shape of an operand is unknown".into()));
        };
        let axis = attr_i(node, "axis", 0);
        let shape = shapes::gather(&data, &idx, axis)?;
        let axis = shapes::axis(axis, data.len())?;
        match (&ins[0], &ins[1]) {
            (Some(Val::Const(table)), Some(Val::Act(ids))) if axis == 0 && data.len() == 2 => {
                let weight = self.values(table, "table")?;
                let op = Op::Embedding {
                    rows: data[0],
                    dim: data[1],
                };
                let id = self.push(node, Self::out0(node)?, op, vec![ids.term()])?;
                if let Some(w) = weight {
                    self.nodes[id].set_param("weight", w);
                }
                Ok(())
            }
            (Some(Val::Act(x)), Some(Val::Const(c))) if c.numel() == Some(1) => {
                let i = c
                    .as_ints()
                    .and_then(|v| v.first().copied())
                    .ok_or_else(|| Fail::Error("its index is not known".into()))?;
                let i = usize::try_from(if i < 0 { i + data[axis] as i64 } else { i })
                    .ok()
                    .filter(|&i| i < data[axis])
                    .ok_or_else(|| {
                        Fail::Error(format!("index {i} is outside axis {axis} of {data:?}"))
                    })?;
                let out = Self::out0(node)?;
                let scalar = c.shape.as_ref().is_some_and(|s| s.is_empty());
                // One channel is a slice of the value; one index of another axis a `slice`
                // operator (MultiheadAttention's q, k and v out of one projection).
                let sliced = if axis == 1 {
                    let base = x.channels.map_or(0, |(b, _)| b);
                    let mut sliced = x.clone();
                    sliced.shape[1] = 1;
                    sliced.channels = Some((base + i, base + i + 1));
                    if !scalar {
                        self.vals.insert(out.to_string(), Val::Act(sliced));
                        self.report.removed += 1;
                        return Ok(());
                    }
                    sliced
                } else {
                    let tensor = match scalar {
                        true => format!("{out}#axis{axis}"),
                        false => out.to_string(),
                    };
                    let op = Op::Slice {
                        axis,
                        begin: i,
                        end: i + 1,
                    };
                    let sliced = self.push_act(node, &tensor, op, x)?;
                    if !scalar {
                        return Ok(());
                    }
                    sliced
                };
                self.reshape(node, sliced, shape)
            }
            _ => self.opaque(node, ins, Some(shape)),
        }
    }

    /// `Resize` (and opset 7-10's `Upsample` and `Resize`): a `resize` of the spatial axes of
    /// a 4-D tensor where its modes are ones we compute (nearest and linear; every coordinate
    /// mode but `tf_crop_and_resize`; no antialiasing); otherwise, or on other axes, an opaque
    /// operator of the shape it computes.
    fn resize(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let x = self.act(ins, 0)?;
        let rank = x.shape.len();
        let older = node.op_type == "Upsample" || self.opset < 11;
        let (scales_at, sizes_at) = if older { (1, usize::MAX) } else { (2, 3) };
        // Opset 18's `axes`: which axes the scales or sizes are for (the others keep theirs).
        let axes: Vec<usize> = match attr_ints(node, "axes") {
            Some(a) => a
                .iter()
                .map(|&v| shapes::axis(v, rank))
                .collect::<std::result::Result<_, _>>()?,
            None => (0..rank).collect(),
        };
        let full = |given: &[f64], fill: f64, what: &str| {
            if given.len() != axes.len() {
                return Err(Fail::Error(format!(
                    "{what} {given:?} do not fit {:?}",
                    x.shape
                )));
            }
            let mut v = vec![fill; rank];
            for (&a, &g) in axes.iter().zip(given) {
                v[a] = g;
            }
            Ok(v)
        };
        let sizes_given = node.input.get(sizes_at).is_some_and(|s| !s.is_empty());
        let (shape, scales): (Shape, Option<Vec<f32>>) = if sizes_given {
            let sizes = Self::ints(ins, sizes_at, "sizes")?;
            let sizes = full(
                &sizes.iter().map(|&d| d as f64).collect::<Vec<_>>(),
                -1.0,
                "sizes",
            )?;
            let shape = sizes
                .iter()
                .zip(&x.shape)
                .map(|(&s, &d)| {
                    if s < 0.0 {
                        Ok(d)
                    } else {
                        to_usize(s as i64, "size")
                    }
                })
                .collect::<std::result::Result<_, _>>()?;
            (shape, None)
        } else {
            let given: Vec<f64> = match attr(node, "scales") {
                Some(a) => a.floats.iter().map(|&f| f64::from(f)).collect(),
                None => Self::konst(ins, scales_at)
                    .and_then(Const::as_floats)
                    .ok_or_else(|| Fail::Error("needs constant scales or sizes".into()))?,
            };
            let scales: Vec<f32> = full(&given, 1.0, "scales")?
                .iter()
                .map(|&s| s as f32)
                .collect();
            if let Some(bad) = scales.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
                return Err(Fail::Error(format!(
                    "scale {bad} must be finite and positive"
                )));
            }
            // onnxruntime's output size: the f32 product, truncated.
            let shape = x
                .shape
                .iter()
                .zip(&scales)
                .map(|(&d, &s)| ((d as f32 * s) as usize).max(1))
                .collect();
            (shape, Some(scales))
        };
        check_size(&shape)?;
        match self.resize_op(node, &x.shape, &shape, scales.as_deref(), older) {
            Some(op) => {
                self.push(node, Self::out0(node)?, Op::Resize(op), vec![x.term()])?;
                Ok(())
            }
            None => self.opaque(node, &ins[..1], Some(shape)),
        }
    }

    /// The `resize` operator of a `Resize`/`Upsample` node from `input` to `out`, where we
    /// compute what it does (see [`Importer::resize`]).
    fn resize_op(
        &self,
        node: &NodeProto,
        input: &[usize],
        out: &[usize],
        scales: Option<&[f32]>,
        older: bool,
    ) -> Option<Resize> {
        if input.len() != 4 || input[..2] != out[..2] {
            return None;
        }
        if scales.is_some_and(|s| s[0] != 1.0 || s[1] != 1.0) {
            return None;
        }
        let mode = match attr_s(node, "mode").as_deref() {
            None | Some("nearest") => ResizeMode::Nearest,
            Some("linear" | "bilinear") => ResizeMode::Linear,
            Some(_) => return None,
        };
        if attr_i(node, "antialias", 0) != 0
            || attr_s(node, "keep_aspect_ratio_policy").is_some_and(|p| p != "stretch")
        {
            return None;
        }
        let size = [out[2], out[3]];
        let scale = scales.map(|s| [s[2], s[3]]);
        let spatial = scale.unwrap_or([
            out[2] as f32 / input[2] as f32,
            out[3] as f32 / input[3] as f32,
        ]);
        let (coord, nearest) = if older {
            // Before opset 11: asymmetric coordinates; nearest truncates when enlarging and
            // rounds up when shrinking (onnxruntime's), one rule for both axes.
            let nearest = match spatial {
                [a, b] if a >= 1.0 && b >= 1.0 => NearestMode::Floor,
                [a, b] if a < 1.0 && b < 1.0 => NearestMode::Ceil,
                _ => return None,
            };
            (ResizeCoord::Asymmetric, nearest)
        } else {
            let coord = match attr_s(node, "coordinate_transformation_mode").as_deref() {
                None | Some("half_pixel") => ResizeCoord::HalfPixel,
                Some("pytorch_half_pixel") => ResizeCoord::PytorchHalfPixel,
                Some("align_corners") => ResizeCoord::AlignCorners,
                Some("asymmetric") => ResizeCoord::Asymmetric,
                Some("tf_half_pixel_for_nn") => ResizeCoord::TfHalfPixelForNn,
                Some("half_pixel_symmetric") => ResizeCoord::HalfPixelSymmetric,
                Some(_) => return None,
            };
            let nearest = match attr_s(node, "nearest_mode").as_deref() {
                None | Some("round_prefer_floor") => NearestMode::RoundPreferFloor,
                Some("round_prefer_ceil") => NearestMode::RoundPreferCeil,
                Some("floor") => NearestMode::Floor,
                Some("ceil") => NearestMode::Ceil,
                Some(_) => return None,
            };
            (coord, nearest)
        };
        Some(Resize {
            size,
            scale,
            mode,
            coord,
            nearest,
        })
    }

    fn reshape(&mut self, node: &NodeProto, x: Act, shape: Shape) -> Mapped {
        let out = Self::out0(node)?;
        if shape == x.shape {
            self.alias(&node.input[0], out, x);
            return Ok(());
        }
        self.push(node, out, view(&shape), vec![x.term()])?;
        Ok(())
    }

    fn conv(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let x = self.act(ins, 0)?;
        let w =
            Self::konst(ins, 1).ok_or_else(|| unsupported(node, "weights computed at run time"))?;
        let ws = w
            .shape
            .clone()
            .ok_or_else(|| Fail::Error("the shape of its weights is unknown".into()))?;
        if ws.len() == 3 && x.shape.len() == 3 {
            return self.conv1d(node, ins, x, w.clone());
        }
        if ws.len() != 4 || x.shape.len() != 4 {
            return Err(unsupported(node, "not 1-D or 2-D"));
        }
        let groups = to_usize(attr_i(node, "group", 1), "group")?;
        if groups == 0 || ws[1].checked_mul(groups) != Some(x.shape[1]) {
            return Err(Fail::Error(format!(
                "weights {ws:?} with {groups} groups do not fit an input of {} channels",
                x.shape[1]
            )));
        }
        if let Some(k) = attr_ints(node, "kernel_shape") {
            if pair(&k, "kernel_shape")? != [ws[2], ws[3]] {
                return Err(Fail::Error(format!(
                    "kernel_shape {k:?} differs from the weights' {ws:?}"
                )));
            }
        }
        let win = window(node, &x.shape, [ws[2], ws[3]])?;
        let bias = node.input.get(2).is_some_and(|b| !b.is_empty());
        let conv = Conv2d {
            out_channels: ws[0],
            kernel: win.kernel,
            stride: win.stride,
            padding: win.padding,
            padding_end: win.padding_end,
            dilation: win.dilation,
            groups,
            bias,
            act: Activation::None,
        };
        let weight = self.values(w, "weights")?;
        let b = match bias {
            true => self.param_input(ins, 2, "bias")?,
            false => None,
        };
        let id = self.push(node, Self::out0(node)?, Op::Conv2d(conv), vec![x.term()])?;
        if let Some(w) = weight {
            self.nodes[id].set_param("weight", w);
        }
        if let Some(b) = b {
            self.nodes[id].set_param("bias", vector(&b, ws[0], "bias")?);
        }
        Ok(())
    }

    /// A 1-D convolution (Whisper's and wav2vec2's stems) as a 2-D one over a height of 1:
    /// the input viewed as `[n, c, 1, l]`, the weights as `[o, c / g, 1, k]`, the window's
    /// attributes given a leading height axis, the output viewed back as `[n, o, l']`.
    fn conv1d(&mut self, node: &NodeProto, ins: &[Option<Val>], x: Act, w: Const) -> Mapped {
        let out = Self::out0(node)?;
        let tall = |s: &[usize]| -> Shape { [&s[..2], &[1], &s[2..]].concat() };
        let x = self.push_act(node, &format!("{out}#2d_in"), view(&tall(&x.shape)), &x)?;
        let ws = w.shape.as_deref().map(tall);
        let w = Const {
            values: match (&w.values, &ws) {
                (Some(t), Some(s)) => {
                    Some(Tensor::new(s.clone(), t.data.to_vec()).map_err(Fail::Error)?)
                }
                _ => None,
            },
            shape: ws,
            ..w
        };
        let mut flat = node.clone();
        flat.output = vec![format!("{out}#2d")];
        for a in &mut flat.attribute {
            a.ints = match (a.name.as_str(), a.ints.as_slice()) {
                ("kernel_shape", [k]) => vec![1, *k],
                ("strides", [s]) => vec![1, *s],
                ("dilations", [d]) => vec![1, *d],
                ("pads", [b, e]) => vec![0, *b, 0, *e],
                (_, v) => v.to_vec(),
            };
        }
        let mut ins2 = vec![Some(Val::Act(x)), Some(Val::Const(w))];
        ins2.extend(ins.iter().skip(2).cloned());
        self.conv(&flat, &ins2)?;
        let Some(Val::Act(y)) = self.vals.get(&flat.output[0]).cloned() else {
            return Err(Fail::Error("its 2-D form gave no value".into()));
        };
        let mut back = y.shape.clone();
        back.remove(2);
        self.push_act(node, out, view(&back), &y)?;
        Ok(())
    }

    fn batch_norm(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let x = self.act(ins, 0)?;
        let out = Self::out0(node)?;
        if attr_i(node, "training_mode", 0) != 0 {
            return Err(unsupported(node, "training mode"));
        }
        let Some(&channels) = x.shape.get(1) else {
            return Err(Fail::Error(format!(
                "needs channels on axis 1, the input is {:?}",
                x.shape
            )));
        };
        const STATS: [&str; 4] = ["scale", "bias", "mean", "variance"];
        for (i, what) in STATS.iter().enumerate().map(|(i, w)| (i + 1, w)) {
            match ins.get(i) {
                Some(Some(Val::Const(c))) => {
                    if c.numel() != Some(channels) {
                        return Err(Fail::Error(format!(
                            "its {what} (input {i}) has shape {:?}, {channels} channels need [{channels}]",
                            c.shape
                        )));
                    }
                }
                Some(Some(Val::Act(_))) => {
                    return Err(unsupported(node, "statistics computed at run time"))
                }
                _ => return Err(Fail::Error(format!("its {what} (input {i}) is missing"))),
            }
        }
        let eps = attr_f(node, "epsilon", 1e-5);
        let coeffs = if self.weights {
            let mut t = Vec::with_capacity(4);
            for (i, what) in STATS.iter().enumerate() {
                let v = self
                    .param_input(ins, i + 1, what)?
                    .ok_or_else(|| Fail::Error(format!("its {what} is not known")))?;
                t.push(v);
            }
            Some(fold::batch_norm(&t[0], &t[1], &t[2], &t[3], eps, channels)?)
        } else {
            None
        };
        if let Some(n) = self.fusable(&node.input[0], &x) {
            let folds = match &self.nodes[n].op {
                Op::Conv2d(c) => c.act == Activation::None,
                // A linear layer's features are the batch norm's channels only in 2-D.
                Op::Linear { act, .. } => *act == Activation::None && x.shape.len() == 2,
                _ => false,
            };
            if folds {
                if let Some((scale, shift)) = &coeffs {
                    self.fold_affine(n, scale, shift)?;
                }
                match &mut self.nodes[n].op {
                    Op::Conv2d(c) => c.bias = true,
                    Op::Linear { bias, .. } => *bias = true,
                    _ => {}
                }
                self.fold(n, out);
                self.report.folded_batch_norms += 1;
                return Ok(());
            }
        }
        // A batch norm with no convolution before it: a per-channel scale and shift.
        let id = self.push(node, out, Op::Affine, vec![x.term()])?;
        if let Some((scale, shift)) = coeffs {
            self.nodes[id].set_param("scale", Tensor::new(vec![channels], scale)?);
            self.nodes[id].set_param("shift", Tensor::new(vec![channels], shift)?);
        }
        Ok(())
    }

    /// Fold `y = x * scale[o] + shift[o]` (per output channel) into the weights and bias of
    /// conv or linear node `n`.
    fn fold_affine(&mut self, n: usize, scale: &[f32], shift: &[f32]) -> Mapped {
        let pn = &mut self.nodes[n];
        let w = pn.param("weight").ok_or_else(|| {
            Fail::Error("the weights of the operator before it are not known".into())
        })?;
        let w = fold::scale_rows(w, scale)?;
        let b = fold::scale_shift_bias(pn.param("bias"), scale, shift);
        pn.set_param("weight", w);
        pn.set_param("bias", Tensor::new(vec![scale.len()], b)?);
        Ok(())
    }

    fn pool(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let x = self.act(ins, 0)?;
        if x.shape.len() != 4 {
            return Err(unsupported(node, "not 2-D"));
        }
        if node
            .output
            .iter()
            .skip(1)
            .any(|o| self.consumers.contains_key(o))
        {
            return Err(unsupported(node, "indices output used"));
        }
        let k = attr_ints(node, "kernel_shape")
            .ok_or_else(|| Fail::Error("has no kernel_shape".into()))?;
        let kernel = pair(&k, "kernel_shape")?;
        let ceil = attr_i(node, "ceil_mode", 0) == 1;
        let win = window(node, &x.shape, kernel)?;
        if win.dilation != [1, 1] {
            return Err(unsupported(node, "dilated"));
        }
        let avg = node.op_type == "AveragePool";
        let p = Pool2d {
            kind: if avg { PoolKind::Avg } else { PoolKind::Max },
            kernel: win.kernel,
            stride: win.stride,
            padding: win.padding,
            padding_end: win.padding_end,
            ceil_mode: ceil,
            // ONNX's default is to count only the input elements; max pools ignore it.
            count_include_pad: !avg || attr_i(node, "count_include_pad", 0) != 0,
        };
        self.push(node, Self::out0(node)?, Op::Pool2d(p), vec![x.term()])?;
        Ok(())
    }

    fn elementwise(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let op_type = node.op_type.as_str();
        let out = Self::out0(node)?;
        let present: Vec<usize> = (0..ins.len()).filter(|&i| ins[i].is_some()).collect();
        let mut shape: Shape = Vec::new();
        for v in ins.iter().flatten() {
            let s = match v {
                Val::Act(a) => a.shape.clone(),
                Val::Const(c) => c
                    .shape
                    .clone()
                    .ok_or_else(|| "the shape of a constant operand is unknown".to_string())?,
            };
            shape = shapes::broadcast(&shape, &s)?;
        }
        let op = match (op_type, present.len()) {
            ("Add" | "Sum", _) => Op::Elementwise {
                kind: ElementwiseKind::Add,
            },
            ("Mul", _) => Op::Elementwise {
                kind: ElementwiseKind::Mul,
            },
            // The condition's booleans are 1.0 and 0.0.
            ("Where", 3) => Op::Where,
            (_, 2) => match BINARY_KINDS.iter().find(|(t, _)| *t == op_type) {
                Some(&(_, kind)) => Op::Binary { kind },
                // PRelu, Mod, ...: one pass, costed by the tensor sizes.
                None => return self.opaque(node, ins, Some(shape)),
            },
            _ => return self.opaque(node, ins, Some(shape)),
        };
        // `x op c` with a constant `c` may fold into the operator before `x`.
        if let [a, b] = present[..] {
            let pick = match (&ins[a], &ins[b]) {
                (Some(Val::Act(x)), Some(Val::Const(c))) => Some((a, x.clone(), c.clone())),
                (Some(Val::Const(c)), Some(Val::Act(x))) => Some((b, x.clone(), c.clone())),
                _ => None,
            };
            if let Some((i, x, c)) = pick {
                if self.fold_constant(node, i, &x, &c)? {
                    self.fold(x.node, out);
                    self.report.folded_constants += 1;
                    return Ok(());
                }
            }
        }
        let mut terms = Vec::with_capacity(present.len());
        for i in present {
            terms.push(self.operand(node, ins, i)?.term());
        }
        self.push(node, out, op, terms)?;
        Ok(())
    }

    /// Fold `x op c` (`x` is input `i`, `op` is Add, Sub, Mul or Div) into the operator that
    /// produces `x` when nothing else reads `x`: a bias (or per-channel scale) of a convolution
    /// or linear layer, a scalar scale of a matmul into its alpha. Returns whether it folded
    /// (the caller moves the fold point).
    fn fold_constant(
        &mut self,
        node: &NodeProto,
        i: usize,
        x: &Act,
        c: &Const,
    ) -> std::result::Result<bool, Fail> {
        let op_type = node.op_type.as_str();
        let add = matches!(op_type, "Add" | "Sub");
        // `c - x` and `c / x` do not fold; neither does anything but the four.
        if !matches!(op_type, "Add" | "Sub" | "Mul" | "Div")
            || (i != 0 && !matches!(op_type, "Add" | "Mul"))
        {
            return Ok(false);
        }
        let (Some(n), Some(cshape)) = (self.fusable(&node.input[i], x), c.shape.as_deref()) else {
            return Ok(false);
        };
        let out = &x.shape;
        let axis = match &self.nodes[n].op {
            Op::Conv2d(conv) if conv.act == Activation::None && !(add && conv.bias) => 1,
            Op::Linear { bias, act, .. } if *act == Activation::None && !(add && *bias) => {
                out.len().saturating_sub(1)
            }
            Op::BatchMatmul { .. } if !add && c.numel() == Some(1) => {
                return self.scale_product(n, op_type == "Div", c)
            }
            _ => return Ok(false),
        };
        if fold::channel_len(cshape, out, axis).is_none() {
            return Ok(false);
        }
        let channels = out[axis];
        if let Some(t) = self.values(c, "constant operand")? {
            let v = fold::expand(&t, channels)?;
            match op_type {
                "Add" | "Sub" => {
                    let sign = if op_type == "Sub" { -1.0 } else { 1.0 };
                    let b: Vec<f32> = v.iter().map(|&x| sign * x).collect();
                    self.nodes[n].set_param("bias", Tensor::new(vec![channels], b)?);
                }
                _ => self.scale_params(n, &v, op_type == "Div")?,
            }
        }
        if add {
            match &mut self.nodes[n].op {
                Op::Conv2d(conv) => conv.bias = true,
                Op::Linear { bias, .. } => *bias = true,
                _ => {}
            }
        }
        Ok(true)
    }

    /// Multiply (or divide) the weights and bias of conv or linear node `n` per output channel.
    fn scale_params(&mut self, n: usize, s: &[f32], divide: bool) -> Mapped {
        let s: Vec<f32> = if divide {
            s.iter().map(|&v| (1.0 / f64::from(v)) as f32).collect()
        } else {
            s.to_vec()
        };
        let pn = &mut self.nodes[n];
        let w = pn.param("weight").ok_or_else(|| {
            Fail::Error("the weights of the operator before it are not known".into())
        })?;
        let w = fold::scale_rows(w, &s)?;
        pn.set_param("weight", w);
        if let Some(b) = pn.param("bias") {
            let b = fold::scale_rows(b, &s)?;
            pn.set_param("bias", b);
        }
        Ok(())
    }

    /// A scalar scale after a matmul, `(a @ b) * c` or `(a @ b) / c` (attention's `1 /
    /// sqrt(head size)`): the product's `alpha`, which it applies for free. Returns whether it
    /// folded: not where the scalar is unknown or the scale would not be finite (the operator
    /// then stays, as onnxruntime runs it).
    fn scale_product(
        &mut self,
        matmul: usize,
        divide: bool,
        c: &Const,
    ) -> std::result::Result<bool, Fail> {
        let Some(v) = c.scalar().map(|v| v as f32) else {
            return Ok(false);
        };
        let Op::BatchMatmul { alpha, .. } = &mut self.nodes[matmul].op else {
            return Ok(false);
        };
        let scaled = if divide { *alpha / v } else { *alpha * v };
        if !scaled.is_finite() {
            return Ok(false);
        }
        *alpha = scaled;
        Ok(true)
    }

    fn concat(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let out = Self::out0(node)?;
        let mut acts = Vec::with_capacity(ins.len());
        for (i, v) in ins.iter().enumerate() {
            if v.is_some() {
                // A constant operand (a class token, a cached state) is a constant node.
                acts.push((i, self.operand(node, ins, i)?));
            }
        }
        let rank = acts.first().map_or(0, |(_, a)| a.shape.len());
        let axis = shapes::axis(
            attr(node, "axis")
                .map(|a| a.i)
                .ok_or_else(|| Fail::Error("has no axis".into()))?,
            rank,
        )?;
        // A concat whose only reader is this concat (same axis) dissolves into it.
        let mut terms = Vec::new();
        for (i, a) in &acts {
            match self.fusable(&node.input[*i], a) {
                Some(n) if self.nodes[n].op == (Op::Concat { axis }) => {
                    terms.extend(self.nodes[n].inputs.clone());
                    self.nodes[n].dead = true;
                    self.report.merged_concats += 1;
                }
                _ => terms.push(a.term()),
            }
        }
        if let [only] = terms.as_slice() {
            if let [(i, a)] = acts.as_slice() {
                if only == &a.term() {
                    let input = node.input[*i].clone();
                    self.alias(&input, out, a.clone());
                    return Ok(());
                }
            }
        }
        self.push(node, out, Op::Concat { axis }, terms)?;
        Ok(())
    }

    fn gemm(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let a = self.act(ins, 0)?;
        if attr_i(node, "transA", 0) != 0 {
            return Err(unsupported(node, "transA"));
        }
        let trans_b = attr_i(node, "transB", 0) != 0;
        let (alpha, beta) = (attr_f(node, "alpha", 1.0), attr_f(node, "beta", 1.0));
        let has_c = node.input.get(2).is_some_and(|b| !b.is_empty());
        let out = Self::out0(node)?;
        match ins.get(1) {
            Some(Some(Val::Const(w))) => {
                let ws = w
                    .shape
                    .clone()
                    .ok_or_else(|| Fail::Error("the shape of its weights is unknown".into()))?;
                let [r, c] = ws[..] else {
                    return Err(Fail::Error(format!("weights {ws:?} are not a matrix")));
                };
                let (k, n) = if trans_b { (c, r) } else { (r, c) };
                if a.shape.len() != 2 || a.shape.last() != Some(&k) {
                    return Err(Fail::Error(format!(
                        "input {:?} does not fit weights {ws:?}",
                        a.shape
                    )));
                }
                // C must be a bias per output feature (a scalar, [n] or [1, n]).
                let c_shape = match ins.get(2) {
                    Some(Some(Val::Const(c))) => c.shape.clone(),
                    Some(Some(Val::Act(_))) => {
                        return Err(unsupported(node, "C computed at run time"))
                    }
                    _ => None,
                };
                if has_c
                    && c_shape
                        .as_deref()
                        .and_then(|s| fold::channel_len(s, &[a.shape[0], n], 1))
                        .is_none()
                {
                    return Err(unsupported(node, "C not a bias per output feature"));
                }
                // Our weight layout is PyTorch's [out, in]: Gemm's B with transB, else B^T.
                let weight = match self.values(w, "weights")? {
                    Some(t) => {
                        let t = if trans_b { t } else { fold::transpose2(&t)? };
                        Some(if alpha == 1.0 {
                            t
                        } else {
                            fold::scale_rows(&t, &vec![alpha as f32; n])?
                        })
                    }
                    None => None,
                };
                let bias = match has_c {
                    true => self.param_input(ins, 2, "bias C")?.map(|t| {
                        let v = fold::expand(&t, n)?;
                        let v: Vec<f32> = v.iter().map(|&x| (f64::from(x) * beta) as f32).collect();
                        Tensor::new(vec![n], v)
                    }),
                    false => None,
                }
                .transpose()?;
                let op = Op::Linear {
                    out_features: n,
                    bias: has_c,
                    act: Activation::None,
                };
                let id = self.push(node, out, op, vec![a.term()])?;
                if let Some(w) = weight {
                    self.nodes[id].set_param("weight", w);
                }
                if let Some(b) = bias {
                    self.nodes[id].set_param("bias", b);
                }
                Ok(())
            }
            Some(Some(Val::Act(b))) => {
                if has_c || alpha != 1.0 {
                    return Err(unsupported(node, "two activations with alpha or C"));
                }
                let op = Op::batch_matmul(trans_b);
                self.push(node, out, op, vec![a.term(), b.term()])?;
                Ok(())
            }
            _ => Err(Fail::Error("input 1 is missing".into())),
        }
    }

    /// `Einsum` of two activations that is a batched matrix product: the same batch axes in
    /// both operands and the output, then two axes each, one contracted (`bhid,bhjd->bhij`:
    /// attention's scores, `bhij,bhjd->bhid` its values). A `batch_matmul`, the second operand
    /// transposed by the product, the first and the output by `transpose` operators where the
    /// equation swaps theirs; any other equation is unsupported.
    fn einsum(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let eq: String = attr_s(node, "equation")
            .unwrap_or_default()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let (a, b) = (self.act(ins, 0)?, self.act(ins, 1)?);
        let r = a.shape.len();
        let Some([ia, ib, io]) = einsum_terms(&eq, r) else {
            return Err(unsupported(node, &format!("equation '{eq}'")));
        };
        let Some(product) = EinsumProduct::of(&ia, &ib, &io) else {
            return Err(unsupported(node, &format!("equation '{eq}'")));
        };
        if b.shape.len() != r || a.shape[..r - 2] != b.shape[..r - 2] {
            return Err(Fail::Error(format!(
                "operands {:?} and {:?} do not fit '{eq}'",
                a.shape, b.shape
            )));
        }
        let out = Self::out0(node)?;
        let swap: Vec<usize> = (0..r - 2).chain([r - 1, r - 2]).collect();
        let mut a = a;
        if product.transpose_a {
            let tensor = format!("{out}#a");
            let op = Op::Transpose { perm: swap.clone() };
            a = self.push_act(node, &tensor, op, &a)?;
        }
        let op = Op::BatchMatmul {
            transpose_b: product.transpose_b,
            alpha: 1.0,
        };
        let tensor = match product.transpose_out {
            true => format!("{out}#product"),
            false => out.to_string(),
        };
        let id = self.push(node, &tensor, op, vec![a.term(), b.term()])?;
        if product.transpose_out {
            let op = Op::Transpose { perm: swap };
            self.push_act(node, out, op, &self.whole(id))?;
        }
        Ok(())
    }

    fn matmul(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let a = match self.act(ins, 0) {
            Ok(a) => a,
            Err(Fail::Unsupported(_)) => return Err(unsupported(node, "constant first operand")),
            Err(e) => return Err(e),
        };
        let out = Self::out0(node)?;
        match ins.get(1) {
            Some(Some(Val::Const(w))) => {
                let ws = w
                    .shape
                    .clone()
                    .ok_or_else(|| Fail::Error("the shape of its weights is unknown".into()))?;
                let [k, n] = ws[..] else {
                    return Err(unsupported(node, "constant operand of rank other than 2"));
                };
                if a.shape.len() < 2 || a.shape.last() != Some(&k) {
                    return Err(Fail::Error(format!(
                        "input {:?} does not fit weights {ws:?}",
                        a.shape
                    )));
                }
                // MatMul's B is [in, out]; our linear weight is [out, in].
                let weight = match self.values(w, "weights")? {
                    Some(t) => Some(fold::transpose2(&t)?),
                    None => None,
                };
                let op = Op::Linear {
                    out_features: n,
                    bias: false,
                    act: Activation::None,
                };
                let id = self.push(node, out, op, vec![a.term()])?;
                if let Some(w) = weight {
                    self.nodes[id].set_param("weight", w);
                }
                Ok(())
            }
            Some(Some(Val::Act(b))) => {
                if a.shape.len() != b.shape.len() || a.shape.len() < 2 {
                    return Err(unsupported(node, "broadcast"));
                }
                // Scalar scales of the operands (PyTorch's export of scaled_dot_product_attention
                // scales both by the fourth root of the head size): the product's alpha.
                let (a, a_scale) = self.scaled_operand(&node.input[0], &a);
                let (b, b_scale) = self.scaled_operand(&node.input[1], b);
                let b_tensor = match b_scale {
                    Some(_) => self.nodes[b.node].out_tensor.clone(),
                    None => node.input[1].clone(),
                };
                let scales = [a_scale, b_scale];
                // `x @ transpose(y)` with the last two axes swapped: a transposed operand.
                let r = b.shape.len();
                let mut b_term = b.term();
                let mut folded = None;
                if let Some(n) = self.fusable(&b_tensor, &b) {
                    if let Op::Transpose { perm } = &self.nodes[n].op {
                        let swap_last = perm.len() == r
                            && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p)
                            && perm[r - 2] == r - 1
                            && perm[r - 1] == r - 2;
                        if swap_last {
                            if let Some(t) = self.nodes[n].inputs.first().cloned() {
                                b_term = t;
                                folded = Some(n);
                            }
                        }
                    }
                }
                let alpha = scales.iter().flatten().map(|&(_, s)| s).product();
                let op = Op::BatchMatmul {
                    transpose_b: folded.is_some(),
                    alpha,
                };
                match self.push(node, out, op, vec![a.term(), b_term]) {
                    Ok(_) => {
                        let peeled = scales.iter().flatten().map(|&(n, _)| n);
                        for n in folded.into_iter().chain(peeled) {
                            self.nodes[n].dead = true;
                            self.report.removed += 1;
                        }
                        Ok(())
                    }
                    Err(Fail::Error(_)) if a.shape[..r - 2] != b.shape[..r - 2] => {
                        Err(unsupported(node, "broadcast"))
                    }
                    Err(e) => Err(e),
                }
            }
            _ => Err(Fail::Error("input 1 is missing".into())),
        }
    }

    /// Operand `a` (tensor `tensor`) of a matmul of two activations, or where it is `x * c`,
    /// `c * x` or `x / c` of a constant scalar `c` that nothing else reads, `x` and that node
    /// with the factor (`c` or `1 / c`, where finite), for the product's alpha.
    fn scaled_operand(&self, tensor: &str, a: &Act) -> (Act, Option<(usize, f32)>) {
        let unscaled = (a.clone(), None);
        let Some(n) = self.fusable(tensor, a) else {
            return unscaled;
        };
        let scalar = |t: &Term| -> Option<f32> {
            let [v] = t.as_slice() else { return None };
            let c = &self.nodes[v.node.index()];
            if !matches!(c.op, Op::Constant { .. }) || v.channels.is_some() {
                return None;
            }
            match self.vals.get(&c.out_tensor) {
                Some(Val::Const(k)) => k.scalar().map(|v| v as f32),
                _ => None,
            }
        };
        let pn = &self.nodes[n];
        let (x, factor) = match (&pn.op, pn.inputs.as_slice()) {
            (
                Op::Elementwise {
                    kind: ElementwiseKind::Mul,
                },
                [p, q],
            ) => match (scalar(p), scalar(q)) {
                (None, Some(c)) => (p, c),
                (Some(c), None) => (q, c),
                _ => return unscaled,
            },
            (
                Op::Binary {
                    kind: BinaryKind::Div,
                },
                [p, q],
            ) if scalar(p).is_none() => match scalar(q) {
                Some(c) => (p, 1.0 / c),
                None => return unscaled,
            },
            _ => return unscaled,
        };
        let [v] = x.as_slice() else { return unscaled };
        let xn = &self.nodes[v.node.index()];
        // The value read whole (the transposed-operand fold after this reads its tensor).
        if !factor.is_finite() || v.channels.is_some() || xn.shape != a.shape {
            return unscaled;
        }
        let x = Act {
            node: v.node.index(),
            shape: xn.shape.clone(),
            channels: None,
        };
        (x, Some((n, factor)))
    }

    fn split(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let x = self.act(ins, 0)?;
        let axis = shapes::axis(attr_i(node, "axis", 0), x.shape.len())?;
        let dim = x.shape[axis];
        let parts = node.output.len().max(1);
        let sizes: Vec<usize> = if let Some(s) = attr_ints(node, "split") {
            s.iter()
                .map(|&v| to_usize(v, "split"))
                .collect::<std::result::Result<_, _>>()?
        } else if node.input.get(1).is_some_and(|s| !s.is_empty()) {
            Self::ints(ins, 1, "split sizes")?
                .iter()
                .map(|&v| to_usize(v, "split"))
                .collect::<std::result::Result<_, _>>()?
        } else {
            let each = dim.div_ceil(parts);
            (0..parts)
                .map(|i| each.min(dim.saturating_sub(i * each)))
                .collect()
        };
        let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
        if sizes.len() != node.output.len() || total != Some(dim) {
            return Err(Fail::Error(format!(
                "split sizes {sizes:?} do not cover axis {axis} of {:?}",
                x.shape
            )));
        }
        let mut begin = 0;
        for (out, &len) in node.output.iter().zip(&sizes) {
            let mut shape = x.shape.clone();
            shape[axis] = len;
            if axis == 1 {
                // A channel split is no operator: the consumers read channel slices.
                let base = x.channels.map_or(0, |(b, _)| b);
                self.vals.insert(
                    out.clone(),
                    Val::Act(Act {
                        node: x.node,
                        shape,
                        channels: Some((base + begin, base + begin + len)),
                    }),
                );
            } else if self.consumers.contains_key(out) {
                let op = Op::Slice {
                    axis,
                    begin,
                    end: begin + len,
                };
                self.push(node, out, op, vec![x.term()])?;
            }
            begin += len;
        }
        if axis == 1 {
            self.report.removed += 1;
        }
        Ok(())
    }

    fn slice(&mut self, node: &NodeProto, ins: &[Option<Val>]) -> Mapped {
        let x = self.act(ins, 0)?;
        let cins: Vec<Option<&Const>> = ins
            .iter()
            .map(|v| match v {
                Some(Val::Const(c)) => Some(c),
                _ => None,
            })
            .collect();
        let (starts, ends, axes, steps) = consts::slice_args(node, &cins)
            .ok_or_else(|| Fail::Error("needs constant starts and ends".into()))?;
        let out = Self::out0(node)?;
        let shape = shapes::slice(&x.shape, &starts, &ends, axes.as_deref(), steps.as_deref())?;
        let ranges =
            shapes::forward_slices(&x.shape, &starts, &ends, axes.as_deref(), steps.as_deref());
        let Some(ranges) = ranges else {
            return self.opaque(node, &ins[..1], Some(shape));
        };
        let x_channels = x.channels;
        let mut cur = x;
        // A stride `s` through a whole axis of `n = m * s` from `b < s` (Swin's PatchMerging,
        // `x[:, 0::2, 1::2]`; YOLOv5's Focus): the axis viewed as `[m, s]`, index `b` of the
        // second axis sliced, the view dropped. Other strides stay opaque copies.
        let strided = ranges.iter().filter(|r| r.3 > 1).count();
        let mut cuts: Vec<(usize, usize, usize)> = Vec::new();
        for (axis, begin, end, step) in ranges {
            let n = cur.shape[axis];
            if step == 1 {
                if begin > 0 || end < n {
                    cuts.push((axis, begin, end));
                }
                continue;
            }
            let whole = end.saturating_sub(begin).div_ceil(step) == n / step;
            if n % step != 0 || begin >= step || !whole {
                return self.opaque(node, &ins[..1], Some(shape));
            }
            let mut split = cur.shape.clone();
            split.splice(axis..=axis, [n / step, step]);
            cur = self.push_act(node, &format!("{out}#split{axis}"), view(&split), &cur)?;
            let pick = Op::Slice {
                axis: axis + 1,
                begin,
                end: begin + 1,
            };
            cur = self.push_act(node, &format!("{out}#step{axis}"), pick, &cur)?;
            split.remove(axis + 1);
            cur = self.push_act(node, &format!("{out}#picked{axis}"), view(&split), &cur)?;
        }
        // Unit steps: channels are a slice of the value; every other axis cut is a `slice`
        // operator, one per axis (the last one writes `out`).
        if let Some(&(_, b, e)) = cuts.iter().find(|c| c.0 == 1) {
            let base = cur.channels.map_or(0, |(b, _)| b);
            cur.shape[1] = e - b;
            cur.channels = Some((base + b, base + e));
        }
        let others: Vec<_> = cuts.iter().filter(|c| c.0 != 1).collect();
        for (k, &&(axis, begin, end)) in others.iter().enumerate() {
            let tensor = match k + 1 == others.len() {
                true => out.to_string(),
                false => format!("{out}#axis{axis}"),
            };
            cur = self.push_act(node, &tensor, Op::Slice { axis, begin, end }, &cur)?;
        }
        match (others.is_empty(), strided > 0, cur.channels == x_channels) {
            // The last strided view writes `out`.
            (true, true, _) if cur.channels.is_none() => self.fold(cur.node, out),
            // Nothing cut: the same value.
            (true, false, true) => self.alias(&node.input[0], out, cur),
            // Channels only: a slice of the value (never a fold point).
            (true, strided, _) => {
                self.vals.insert(out.to_string(), Val::Act(cur));
                if !strided {
                    self.report.removed += 1;
                }
            }
            (false, ..) => {}
        }
        Ok(())
    }

    /// Add an IR node computing `op` of `x` into `tensor` ([`Self::push`]): its output.
    fn push_act(
        &mut self,
        node: &NodeProto,
        tensor: &str,
        op: Op,
        x: &Act,
    ) -> std::result::Result<Act, Fail> {
        let id = self.push(node, tensor, op, vec![x.term()])?;
        Ok(self.whole(id))
    }

    /// The whole output of IR node `id`, as an activation.
    fn whole(&self, id: usize) -> Act {
        Act {
            node: id,
            shape: self.nodes[id].shape.clone(),
            channels: None,
        }
    }
}

/// Nodes in a topological order (Kahn over tensor names, stable in file order).
fn topo_order<'g>(nodes: &'g [NodeProto], known: &HashSet<&str>) -> Result<Vec<&'g NodeProto>> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            producer.insert(o.as_str(), i);
        }
    }
    let mut indeg = vec![0usize; nodes.len()];
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        for inp in n.input.iter().filter(|s| !s.is_empty()) {
            match producer.get(inp.as_str()) {
                Some(&p) => {
                    indeg[i] += 1;
                    succ[p].push(i);
                }
                None if known.contains(inp.as_str()) => {}
                None => {
                    return Err(OnnxError::Node {
                        node: display_name(n),
                        op_type: n.op_type.clone(),
                        message: format!(
                            "input '{inp}' is not produced by any node, initializer or graph input"
                        ),
                    })
                }
            }
        }
    }
    let mut ready: std::collections::BTreeSet<usize> =
        (0..nodes.len()).filter(|&i| indeg[i] == 0).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(i) = ready.pop_first() {
        order.push(&nodes[i]);
        for &s in &succ[i] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.insert(s);
            }
        }
    }
    if order.len() != nodes.len() {
        if let Some(i) = (0..nodes.len()).find(|&i| indeg[i] > 0) {
            return Err(OnnxError::Node {
                node: display_name(&nodes[i]),
                op_type: nodes[i].op_type.clone(),
                message: "lies on a cycle".into(),
            });
        }
    }
    Ok(order)
}

fn dtype_of(elem: i32) -> Option<DType> {
    match elem {
        data_type::FLOAT | data_type::DOUBLE => Some(DType::F32),
        data_type::FLOAT16 | data_type::BFLOAT16 => Some(DType::F16),
        _ => None,
    }
}

/// Import a decoded model.
/// Operators that legitimately have no inputs.
const SOURCES: &[&str] = &["Constant", "RandomNormal", "RandomUniform"];

/// Checks at the door, before anything is evaluated: every initializer has sane dimensions and
/// (if external) a location inside the model's folder; every node writes at least one output
/// and reads at least one input (unless it is a source such as `Constant`); no two nodes (or a
/// node and an initializer or graph input) write the same name; every graph output is written
/// by something. Cycles are found by the topological sort.
fn check_graph(g: &GraphProto) -> Result<()> {
    let node_err = |n: &NodeProto, message: String| OnnxError::Node {
        node: display_name(n),
        op_type: n.op_type.clone(),
        message,
    };
    let mut defined: HashMap<&str, String> = HashMap::new();
    for t in &g.initializer {
        let bad = |message: String| OnnxError::Initializer {
            name: t.name.clone(),
            message,
        };
        data::dims(t).map_err(bad)?;
        data::external_ref(t).map_err(bad)?;
        if defined
            .insert(t.name.as_str(), "an initializer".into())
            .is_some()
        {
            return Err(bad("is defined twice".into()));
        }
    }
    for vi in &g.input {
        defined
            .entry(vi.name.as_str())
            .or_insert_with(|| "a graph input".into());
    }
    for n in &g.node {
        for a in n.attribute.iter().filter_map(|a| a.t.as_ref()) {
            data::external_ref(a).map_err(|m| node_err(n, m))?;
        }
        if n.output.iter().all(String::is_empty) {
            return Err(node_err(n, "has no output".into()));
        }
        if n.input.iter().all(String::is_empty) && !SOURCES.contains(&n.op_type.as_str()) {
            return Err(node_err(n, "has no inputs".into()));
        }
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            let me = format!("node '{}'", display_name(n));
            if let Some(other) = defined.insert(o.as_str(), me) {
                return Err(node_err(
                    n,
                    format!("writes '{o}', which {other} already defines"),
                ));
            }
        }
    }
    for o in &g.output {
        if !defined.contains_key(o.name.as_str()) {
            return Err(OnnxError::Output {
                output: o.name.clone(),
                message: "is not produced by any node, initializer or graph input".into(),
            });
        }
    }
    Ok(())
}

pub(crate) fn import(
    model: &ModelProto,
    name: &str,
    base_dir: Option<&Path>,
    opts: &OnnxOptions,
) -> Result<(Graph, ImportReport)> {
    let g = model
        .graph
        .as_ref()
        .filter(|g| !g.node.is_empty() || !g.input.is_empty())
        .ok_or_else(|| OnnxError::NotAModel("the model has no graph".into()))?;
    check_graph(g)?;
    let folder = Folder::new(base_dir);
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map_or(1, |o| o.version);
    if opts.batch == 0 {
        return Err(OnnxError::NotAModel("batch size must be positive".into()));
    }
    let mut imp = Importer {
        weights: opts.weights,
        constant_nodes: HashMap::new(),
        opset,
        vals: HashMap::new(),
        consumers: HashMap::new(),
        value_info: HashMap::new(),
        symbols: HashMap::new(),
        nodes: Vec::new(),
        names: HashSet::new(),
        unknown: BTreeMap::new(),
        report: ImportReport {
            opset,
            producer: format!("{} {}", model.producer_name, model.producer_version)
                .trim()
                .to_string(),
            onnx_nodes: g.node.len(),
            ..ImportReport::default()
        },
    };
    for vi in g.value_info.iter().chain(&g.output).chain(&g.input) {
        if let Some(t) = vi.r#type.as_ref().and_then(|t| t.tensor_type.as_ref()) {
            imp.value_info.insert(vi.name.clone(), t);
        }
    }
    // Decompositions of GELU, layer norm and swish back into one node each.
    let info = |c: Option<Const>| patterns::ConstInfo {
        scalar: c.as_ref().and_then(Const::scalar),
        shape: c.and_then(|c| c.shape),
    };
    let mut constants: HashMap<String, patterns::ConstInfo> = HashMap::new();
    for t in &g.initializer {
        constants.insert(t.name.clone(), info(Some(consts::from_tensor(t, &folder))));
    }
    for n in g.node.iter().filter(|n| n.op_type == "Constant") {
        if let Some(o) = n.output.first() {
            constants.insert(o.clone(), info(consts::from_constant_node(n, &folder)));
        }
    }
    let outputs: HashSet<String> = g.output.iter().map(|o| o.name.clone()).collect();
    let (graph_nodes, rewritten) = patterns::rewrite(&g.node, &outputs, &constants);
    imp.report.rewritten_patterns = rewritten;
    for n in &graph_nodes {
        for i in n.input.iter().filter(|s| !s.is_empty()) {
            *imp.consumers.entry(i.clone()).or_insert(0) += 1;
        }
    }
    for o in &g.output {
        *imp.consumers.entry(o.name.clone()).or_insert(0) += 1;
    }

    // Initializers are constants (they win over a graph input of the same name), with all
    // their values when the import loads weights.
    for t in &g.initializer {
        let mut c = consts::from_tensor(t, &folder);
        if opts.weights {
            let v = data::load(t, &folder).map_err(|message| OnnxError::Initializer {
                name: t.name.clone(),
                message,
            })?;
            c.values = Some(v);
            imp.report.loaded_weights += 1;
        }
        imp.vals.insert(t.name.clone(), Val::Const(c));
    }
    // Graph inputs: concrete shapes, the batch dimension and named dimensions resolved.
    let mut dtype = opts.dtype;
    for vi in &g.input {
        if imp.vals.contains_key(&vi.name) {
            continue;
        }
        let bad = |message: String| OnnxError::Input {
            input: vi.name.clone(),
            message,
        };
        let t = vi
            .r#type
            .as_ref()
            .and_then(|t| t.tensor_type.as_ref())
            .ok_or_else(|| bad("is not a tensor".into()))?;
        if dtype.is_none() {
            dtype = dtype_of(t.elem_type);
        }
        let dims = t.shape.as_ref().map(|s| s.dim.as_slice()).unwrap_or(&[]);
        let mut shape = Vec::with_capacity(dims.len());
        for (i, d) in dims.iter().enumerate() {
            let v = match (d.dim_value, &d.dim_param) {
                (Some(v), _) if v > 0 => {
                    usize::try_from(v).map_err(|_| bad(format!("dimension {i} is {v}")))?
                }
                (_, p) => {
                    let p = p.clone().unwrap_or_default();
                    let v = match opts.dims.get(&p) {
                        Some(&v) => v,
                        None if i == 0 => opts.batch,
                        None => {
                            let what = match d.dim_value {
                                Some(v) if p.is_empty() => v.to_string(),
                                _ if p.is_empty() => "unknown".to_string(),
                                _ => format!("the symbol '{p}'"),
                            };
                            return Err(bad(format!(
                                "dimension {i} is {what}; give it a value (OnnxOptions::dims)"
                            )));
                        }
                    };
                    if !p.is_empty() {
                        if let Some(&prev) = imp.symbols.get(&p) {
                            if prev != v {
                                return Err(bad(format!(
                                    "symbol '{p}' is {prev} elsewhere but {v} here"
                                )));
                            }
                        }
                        imp.symbols.insert(p, v);
                    }
                    if i == 0 {
                        imp.report.dynamic_batch = true;
                    }
                    v
                }
            };
            shape.push(v);
        }
        if shape.is_empty() {
            shape.push(1);
        }
        if shape.contains(&0) {
            return Err(bad(format!("shape {shape:?} has a zero dimension")));
        }
        check_size(&shape).map_err(bad)?;
        let name = imp.unique_name(&vi.name);
        let id = imp.nodes.len();
        imp.nodes.push(PNode {
            name,
            op: Op::Input {
                shape: shape.clone(),
            },
            inputs: Vec::new(),
            shape: shape.clone(),
            scope: Vec::new(),
            out_tensor: vi.name.clone(),
            dead: false,
            params: Vec::new(),
        });
        imp.vals.insert(
            vi.name.clone(),
            Val::Act(Act {
                node: id,
                shape,
                channels: None,
            }),
        );
    }
    if !imp.report.dynamic_batch && opts.batch != 1 {
        tracing::warn!(
            model = name,
            batch = opts.batch,
            "the model's batch dimension is fixed; the batch size asked for is ignored"
        );
    }

    let known: HashSet<&str> = imp.vals.keys().map(String::as_str).collect();
    let order = topo_order(&graph_nodes, &known)?;
    drop(known);

    let mut first_error: Option<OnnxError> = None;
    for node in order {
        let err = |message: String| OnnxError::Node {
            node: display_name(node),
            op_type: node.op_type.clone(),
            message,
        };
        let ins: Vec<Option<Val>> = node
            .input
            .iter()
            .map(|i| {
                if i.is_empty() {
                    None
                } else {
                    imp.vals.get(i).cloned()
                }
            })
            .collect();
        if let Some(i) = node
            .input
            .iter()
            .zip(&ins)
            .find(|(i, v)| !i.is_empty() && v.is_none())
            .map(|(i, _)| i)
        {
            // Produced by a node we could not map (already reported).
            if first_error.is_some() || !imp.unknown.is_empty() {
                continue;
            }
            return Err(err(format!("input '{i}' has no value")));
        }
        let default_domain = node.domain.is_empty() || node.domain == "ai.onnx";
        let any_act = ins.iter().flatten().any(|v| matches!(v, Val::Act(_)));
        let op_type = node.op_type.as_str();

        // Constants and shape arithmetic: evaluated here, no operator.
        if default_domain && matches!(op_type, "Constant" | "Shape" | "Size") {
            let c = match op_type {
                "Constant" => match consts::from_constant_node(node, &folder) {
                    Some(mut c) if opts.weights => {
                        if let Some(t) = node.attribute.first().and_then(|a| a.t.as_ref()) {
                            c.values = Some(data::load(t, &folder).map_err(&err)?);
                        }
                        Some(c)
                    }
                    c => c,
                },
                _ => {
                    let shape = match ins.first() {
                        Some(Some(Val::Act(a))) => Some(a.shape.clone()),
                        Some(Some(Val::Const(c))) => c.shape.clone(),
                        _ => None,
                    };
                    shape.and_then(|s| {
                        if op_type == "Size" {
                            let n = consts::numel(&s).and_then(|n| i64::try_from(n).ok())?;
                            Some(Const::ints(Vec::new(), vec![n]))
                        } else {
                            let r = s.len() as i64;
                            let norm =
                                |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
                            let start = norm(attr_i(node, "start", 0));
                            let end = norm(attr_i(node, "end", r));
                            let dims: Vec<i64> = s
                                .get(start..end.max(start))
                                .unwrap_or(&[])
                                .iter()
                                .map(|&d| i64::try_from(d).ok())
                                .collect::<Option<_>>()?;
                            Some(Const::ints(vec![dims.len()], dims))
                        }
                    })
                }
            };
            let c = c.ok_or_else(|| err("has no value we can read".into()))?;
            if let Some(o) = node.output.first() {
                imp.vals.insert(o.clone(), Val::Const(c));
            }
            imp.report.constant_nodes += 1;
            continue;
        }
        if !any_act {
            let cins: Vec<Option<&Const>> = ins
                .iter()
                .map(|v| match v {
                    Some(Val::Const(c)) => Some(c),
                    _ => None,
                })
                .collect();
            let outs = if default_domain {
                consts::eval(node, &cins)
            } else {
                None
            };
            for (k, o) in node.output.iter().enumerate() {
                let c = outs
                    .as_ref()
                    .and_then(|v| v.get(k).cloned())
                    .map(|mut c| {
                        if c.shape.is_none() {
                            c.shape = imp.recorded_shape(o);
                        }
                        c
                    })
                    .unwrap_or_else(|| Const::shape_only(imp.recorded_shape(o)));
                imp.vals.insert(o.clone(), Val::Const(c));
            }
            imp.report.constant_nodes += 1;
            continue;
        }

        let mapped = if default_domain {
            imp.map(node, &ins)
        } else {
            Err(Fail::Unsupported(format!(
                "{}.{}",
                node.domain, node.op_type
            )))
        };
        match mapped {
            Ok(()) => {}
            Err(Fail::Unsupported(key)) => {
                let key = if key.is_empty() {
                    format!("{} (constant operand)", node.op_type)
                } else {
                    key
                };
                *imp.unknown.entry(key).or_insert(0) += 1;
                let shape = node.output.first().and_then(|o| imp.recorded_shape(o));
                if let Err(Fail::Error(m)) = imp.opaque(node, &ins, shape) {
                    first_error.get_or_insert(err(m));
                }
            }
            Err(Fail::Error(m)) => {
                first_error.get_or_insert(err(m));
            }
        }
    }
    if !imp.unknown.is_empty() && !opts.allow_unknown {
        return Err(OnnxError::Unsupported {
            ops: imp.unknown.into_iter().collect(),
        });
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    imp.report.unknown = imp.unknown.clone();
    // The graph's outputs by their ONNX names (a constant output becomes a constant node).
    let mut outputs = Vec::with_capacity(g.output.len());
    for o in &g.output {
        let bad = |message: String| OnnxError::Output {
            output: o.name.clone(),
            message,
        };
        let a = match imp.vals.get(&o.name).cloned() {
            Some(Val::Act(a)) => a,
            Some(Val::Const(c)) => imp.constant_node(&o.name, &c).map_err(|f| match f {
                Fail::Error(m) | Fail::Unsupported(m) => bad(m),
            })?,
            None => return Err(bad("has no value".into())),
        };
        outputs.push((o.name.clone(), a));
    }
    let dtype = dtype.unwrap_or(DType::F32);
    let modules: HashSet<String> = graph_nodes
        .iter()
        .filter_map(|n| match node_scope(n).as_slice() {
            [only] => Some(only.clone()),
            _ => None,
        })
        .collect();
    finish(imp, name, dtype, &modules, outputs)
}

/// Emit the live nodes as a validated graph with blocks from the node scopes.
fn finish(
    mut imp: Importer<'_>,
    name: &str,
    dtype: DType,
    modules: &HashSet<String>,
    outputs: Vec<(String, Act)>,
) -> Result<(Graph, ImportReport)> {
    // A constant that folds left without a reader (a scale taken into a product's alpha)
    // goes with them.
    let mut read = vec![false; imp.nodes.len()];
    let live_inputs = imp
        .nodes
        .iter()
        .filter(|n| !n.dead)
        .flat_map(|n| n.inputs.iter());
    for v in live_inputs.flatten() {
        read[v.node.index()] = true;
    }
    for (_, a) in &outputs {
        read[a.node] = true;
    }
    for (n, read) in imp.nodes.iter_mut().zip(read) {
        if matches!(n.op, Op::Constant { .. }) && !read {
            n.dead = true;
        }
    }
    let mut report = imp.report;
    let mut index = vec![u32::MAX; imp.nodes.len()];
    let mut live = 0u32;
    for (i, n) in imp.nodes.iter().enumerate() {
        if !n.dead {
            index[i] = live;
            live += 1;
        }
    }
    let remap = |node: usize| NodeId(index.get(node).copied().unwrap_or(u32::MAX));
    let outputs: Vec<GraphOutput> = outputs
        .into_iter()
        .map(|(name, a)| GraphOutput {
            name,
            value: Value {
                node: remap(a.node),
                channels: a.channels,
            },
        })
        .collect();
    let mut defs = Vec::with_capacity(imp.nodes.len());
    let mut weights = Weights::new();
    let mut scopes: Vec<(String, Vec<NodeId>)> = Vec::new();
    let mut scope_at: HashMap<String, usize> = HashMap::new();
    for n in imp.nodes.into_iter().filter(|n| !n.dead) {
        let id = NodeId(defs.len() as u32);
        for (what, t) in n.params {
            weights.insert(id, 0, what, t);
        }
        if let (Some(s), false) = (block_key(&n.scope, modules), n.op.is_input()) {
            let k = *scope_at.entry(s.clone()).or_insert_with(|| {
                scopes.push((s, Vec::new()));
                scopes.len() - 1
            });
            scopes[k].1.push(id);
        }
        if let Op::Opaque { op_type, .. } = &n.op {
            *report.opaque.entry(op_type.clone()).or_insert(0) += 1;
        }
        let inputs = n
            .inputs
            .into_iter()
            .map(|t| {
                t.into_iter()
                    .map(|v| Value {
                        node: NodeId(index.get(v.node.index()).copied().unwrap_or(u32::MAX)),
                        channels: v.channels,
                    })
                    .collect()
            })
            .collect();
        defs.push(NodeDef {
            name: n.name,
            op: n.op,
            inputs,
            declared_shape: None,
        });
    }
    let blocks: Vec<Block> = scopes
        .into_iter()
        .filter(|(_, nodes)| nodes.len() >= 2)
        .map(|(name, nodes)| Block {
            name,
            nodes,
            stages: None,
        })
        .collect();
    let mut graph = Graph::from_nodes(name, dtype, defs)?.with_blocks(blocks)?;
    if !outputs.is_empty() {
        graph = graph.with_outputs(outputs)?;
    }
    if !weights.is_empty() {
        graph = graph.with_weights(weights)?;
    }
    report.ops = graph.op_count();
    tracing::info!(
        model = name,
        onnx_nodes = report.onnx_nodes,
        ops = report.ops,
        folded_batch_norms = report.folded_batch_norms,
        fused_activations = report.fused_activations,
        "imported ONNX model"
    );
    Ok((graph, report))
}
