//! IOS graph JSON: import ([`from_value`], [`from_value_with_batch`], [`from_str`]) and export
//! ([`to_value`], [`to_string`]).
//!
//! The format is the one `ios.ir.Graph.export_config()` writes (IOS, Ding et al. 2021,
//! `python/ios/ir.py`) and IOS's CUDA runtime reads (`src/ios/ios_runtime.cu`):
//!
//! ```json
//! {"name": "inception_v3", "input": {"type": "placeholder", "name": "0", "hint_name": "0",
//!                                    "output_shape": [3, 299, 299]},
//!  "blocks": [{"enter_name": "0", "enter_node": {...a copy of node "0"...},
//!              "inner_nodes": [{"type": "conv", "name": "1", "hint_name": "1",
//!                               "inputs": [[["0", 0, 3]]], "out_channels": 32,
//!                               "kernel": [3, 3], "stride": [2, 2], "padding": [0, 0],
//!                               "groups": 1, "act": "relu", "output_shape": [32, 149, 149]}],
//!              "exit_node": {...}, "stages": [[["1"]], [["2", "3"], ["4"]]]}]}
//! ```
//!
//! ## Mapping
//! Every IOS node becomes one opsched node with the same name. `inputs` is a list of terms, a
//! term a list of values `[node, begin, end]` (channels `[begin, end)`): the values of a term are
//! summed and the terms concatenated on channels, which is our IR's model (see the crate docs),
//! so terms carry over unchanged, except that a value covering all channels of its producer
//! becomes a whole-output [`Value`] (the same tensor; DOT and the edge payloads see no slice).
//!
//! | IOS `type` | opsched [`Op`] |
//! |---|---|
//! | `placeholder` | [`Op::Input`] with shape `[batch, C, H, W]` |
//! | `conv` | [`Op::Conv2d`]; `act` `identity` is [`Activation::None`]; no bias, dilation 1 |
//! | `pool` | [`Op::Pool2d`]; `pool_type` `max`, `avg`, `global_max`, `global_avg` (global kinds ignore kernel, stride and padding) |
//! | `element` | [`Op::Elementwise`] `add` or `mul`, see below |
//! | `identity` | [`Op::Identity`] (IOS's concat: several terms) |
//! | `relu` | [`Op::Activation`] relu |
//! | `activation` | [`Op::Activation`] with `act_type` `relu`, `sigmoid` or `tanh` (`inplace` is dropped) |
//! | `sequential` | [`Op::Sequential`] of the inner nodes' ops |
//!
//! **Element.** IOS's `element` node is *not* "sum the term, then apply the op": IOS's runtime
//! (`struct Element` in `ios_runtime.cu`) requires exactly one term and combines the values *of
//! that term* with the op (`cudnnOpTensor` ADD or MUL of value 0 and value 1), and `ir.py` prints
//! a `mul` node's term as `a*b`. Our [`Op::Elementwise`] combines its *terms* and sums the values
//! inside a term, so an IOS `element` node with inputs `[[a, b]]` becomes an elementwise node
//! with the terms `[[a], [b]]`. An `element` node with more than one term is rejected (IOS's
//! runtime rejects it too). Export reverses this (for `add`, values summed inside a term are
//! flattened into the one IOS term, which is the same sum; a `mul` whose terms sum several values
//! cannot be written and is an error).
//!
//! **Sequential.** `nodes` lists inner node configs run in order; the first carries the real
//! `inputs`, each later one reads the whole output of the one before it (`[[[prev, 0, C]]]`,
//! checked). The sequential node's inputs are its first inner node's inputs (an `inputs` field on
//! the sequential node itself is optional and must agree). Inner node names are not graph nodes;
//! inner `output_shape`s are checked. Nested sequentials and inner placeholders are rejected.
//!
//! **Names.** `hint_name` is dropped: opsched nodes have one name. (IOS's merged convolutions
//! carry the names of the convolutions they merge in `hint_name`, e.g. `"9 11"`; the name of the
//! merged node is its `name`.) Export writes `hint_name` equal to `name`.
//!
//! **Shapes.** IOS writes `output_shape` as `[C, H, W]` without the batch dimension, and IOS
//! graphs are batch 1 in the file. [`from_value_with_batch`] builds the graph for any batch size,
//! prepends it to every declared shape and checks the declared shapes against inference, naming
//! the node on a mismatch. `output_shape` may be absent or `null` except on placeholders.
//!
//! **Blocks.** Each IOS block becomes a [`Block`] named `block{i}` (`i` counting from 0) whose
//! nodes are the inner nodes then the exit node, with the block's `stages` resolved to node ids
//! (`"stages": null` gives `None`). Every stage name must be a node of that block; stages need not
//! cover the block (schedules are validated elsewhere). `enter_name` must name the placeholder or
//! a node of an earlier block, and `enter_node` must be an object with that name (it is a copy
//! of that node and is otherwise not read).
//!
//! Unknown fields, missing fields, unknown node types and values of the wrong kind are errors
//! that name the node (or block).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use serde_json::{json, Map, Value as Json};

use crate::error::{GraphError, Result};
use crate::formats::json::Names;
use crate::graph::{Block, Graph, NodeDef, NodeId, Term, Value};
use crate::op::{Activation, Conv2d, DType, ElementwiseKind, Op, Pool2d, PoolKind, Shape};

/// A value as written in the file: `[node, begin, end]`.
type RawValue = (String, usize, usize);
/// A term as written in the file.
type RawTerm = Vec<RawValue>;
/// Stages as written: stages of groups of node names.
type RawStages = Vec<Vec<Vec<String>>>;
/// Stages resolved to node ids.
type Stages = Vec<Vec<Vec<NodeId>>>;

/// One IOS node, parsed.
struct Parsed {
    name: String,
    op: Op,
    /// Terms as in our IR (an `element` node's values are already split into terms).
    inputs: Vec<RawTerm>,
    /// `[C, H, W]` as declared (no batch).
    shape: Option<Vec<usize>>,
    /// Sequential only: the inner nodes' names and declared shapes.
    inner: Vec<(String, Option<Vec<usize>>)>,
}

/// Parse an IOS graph JSON document, batch size 1 (as IOS writes its graphs).
pub fn from_value(doc: Json) -> Result<Graph> {
    from_value_with_batch(doc, 1)
}

/// Parse an IOS graph JSON text, batch size 1.
pub fn from_str(text: &str) -> Result<Graph> {
    from_value(serde_json::from_str(text)?)
}

/// Parse an IOS graph JSON document for the given batch size: the batch is prepended to every
/// `output_shape` of the file (`[C, H, W]`) and declared shapes are checked against inference.
pub fn from_value_with_batch(doc: Json, batch: usize) -> Result<Graph> {
    if batch == 0 {
        return Err(GraphError::invalid(
            "batch",
            "the batch size must be positive",
        ));
    }
    let top = doc
        .as_object()
        .ok_or_else(|| GraphError::invalid("IOS graph", "top level is not a JSON object"))?;
    check_keys(top, "IOS graph", &["name", "input", "blocks"])?;
    let name = get_str(top, "IOS graph", "name")?.to_string();

    let input = get(top, "IOS graph", "input")?;
    let placeholder = parse_node(input, "IOS graph input", batch, false)?;
    if !placeholder.op.is_input() {
        return Err(GraphError::invalid(
            format!("node '{}'", placeholder.name),
            "the graph input must be a placeholder",
        ));
    }
    let blocks_json = get(top, "IOS graph", "blocks")?
        .as_array()
        .ok_or_else(|| GraphError::invalid("IOS graph", "field 'blocks' must be a list"))?;

    let mut parsed = vec![placeholder];
    let mut defined: HashSet<String> = HashSet::from([parsed[0].name.clone()]);
    // Per block: its name, the indices of its nodes in `parsed`, its raw stages.
    let mut raw_blocks: Vec<(String, Vec<usize>, Option<RawStages>)> = Vec::new();
    for (bi, bj) in blocks_json.iter().enumerate() {
        let bname = format!("block{bi}");
        let loc = format!("block '{bname}'");
        let b = bj
            .as_object()
            .ok_or_else(|| GraphError::invalid(&loc, "expected a JSON object"))?;
        check_keys(
            b,
            &loc,
            &[
                "enter_name",
                "enter_node",
                "inner_nodes",
                "exit_node",
                "stages",
            ],
        )?;
        let enter = get_str(b, &loc, "enter_name")?;
        if !defined.contains(enter) {
            return Err(GraphError::invalid(
                &loc,
                format!("enter node '{enter}' is not the input or a node of an earlier block"),
            ));
        }
        let enter_copy = get(b, &loc, "enter_node")?
            .as_object()
            .ok_or_else(|| GraphError::invalid(&loc, "field 'enter_node' must be an object"))?;
        if enter_copy.get("name").and_then(Json::as_str) != Some(enter) {
            return Err(GraphError::invalid(
                &loc,
                format!("'enter_node' is not a copy of node '{enter}' (its name differs)"),
            ));
        }
        let inner = get(b, &loc, "inner_nodes")?
            .as_array()
            .ok_or_else(|| GraphError::invalid(&loc, "field 'inner_nodes' must be a list"))?;
        let mut members = Vec::with_capacity(inner.len() + 1);
        for (ni, n) in inner.iter().enumerate() {
            let p = parse_node(n, &format!("{loc}, inner node #{ni}"), batch, false)?;
            members.push(parsed.len());
            if !defined.insert(p.name.clone()) {
                return Err(GraphError::DuplicateName { node: p.name });
            }
            parsed.push(p);
        }
        let exit = parse_node(
            get(b, &loc, "exit_node")?,
            &format!("{loc}, exit node"),
            batch,
            false,
        )?;
        members.push(parsed.len());
        if !defined.insert(exit.name.clone()) {
            return Err(GraphError::DuplicateName { node: exit.name });
        }
        parsed.push(exit);
        for &m in &members {
            if parsed[m].op.is_input() {
                return Err(GraphError::invalid(
                    format!("node '{}'", parsed[m].name),
                    "a placeholder may only be the graph input",
                ));
            }
        }
        let stages = match get(b, &loc, "stages")? {
            Json::Null => None,
            s => Some(serde_json::from_value::<RawStages>(s.clone()).map_err(|e| {
                GraphError::invalid(
                    &loc,
                    format!("'stages' must be a list of stages of groups of node names: {e}"),
                )
            })?),
        };
        raw_blocks.push((bname, members, stages));
    }

    // Resolve names and build the graph with the values exactly as written.
    let names = Names::new(parsed.iter().map(|p| p.name.as_str()));
    let defs = parsed
        .iter()
        .map(|p| {
            Ok(NodeDef {
                name: p.name.clone(),
                op: p.op.clone(),
                inputs: p
                    .inputs
                    .iter()
                    .map(|t| {
                        t.iter()
                            .map(|(n, b, e)| Ok(Value::slice(names.get(&p.name, n)?, *b, *e)))
                            .collect::<Result<Term>>()
                    })
                    .collect::<Result<_>>()?,
                declared_shape: if p.op.is_input() {
                    None
                } else {
                    p.shape.as_ref().map(|s| with_batch(batch, s))
                },
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let raw = Graph::from_nodes(name.clone(), DType::F32, defs)?;

    // Values that cover all channels of their producer become whole-output values.
    let defs = raw
        .nodes()
        .iter()
        .map(|n| NodeDef {
            name: n.name.clone(),
            op: n.op.clone(),
            inputs: n
                .inputs
                .iter()
                .map(|t| {
                    t.iter()
                        .map(|v| match v.channels {
                            Some((0, e)) if raw.node(v.node).shape.get(1) == Some(&e) => {
                                Value::whole(v.node)
                            }
                            _ => *v,
                        })
                        .collect()
                })
                .collect(),
            declared_shape: None,
        })
        .collect();
    let g = Graph::from_nodes(name, DType::F32, defs)?;

    // Inner shapes of sequential nodes.
    for (i, p) in parsed.iter().enumerate() {
        if let Op::Sequential { ops } = &p.op {
            let id = NodeId(i as u32);
            let mut shapes = g.input_shapes(id);
            for (op, (inner, declared)) in ops.iter().zip(&p.inner) {
                let out = op
                    .infer_shape(&shapes)
                    .map_err(|message| GraphError::Shape {
                        node: p.name.clone(),
                        message: format!("inner node '{inner}': {message}"),
                    })?;
                if let Some(d) = declared {
                    let d = with_batch(batch, d);
                    if d != out {
                        return Err(GraphError::Shape {
                            node: p.name.clone(),
                            message: format!(
                                "inner node '{inner}': declared output shape {d:?} but inferred {out:?}"
                            ),
                        });
                    }
                }
                shapes = vec![out];
            }
        }
    }

    // Blocks and their stages.
    let mut blocks = Vec::with_capacity(raw_blocks.len());
    for (bname, members, stages) in raw_blocks {
        let ids: Vec<NodeId> = members.iter().map(|&m| NodeId(m as u32)).collect();
        let local: HashMap<&str, NodeId> = members
            .iter()
            .map(|&m| (parsed[m].name.as_str(), NodeId(m as u32)))
            .collect();
        let stages = match stages {
            None => None,
            Some(st) => Some(
                st.iter()
                    .enumerate()
                    .map(|(si, stage)| {
                        stage
                            .iter()
                            .map(|grp| {
                                grp.iter()
                                    .map(|n| {
                                        local.get(n.as_str()).copied().ok_or_else(|| {
                                            let why = if g.find(n).is_some() {
                                                "which is not in this block"
                                            } else {
                                                "which is not a node of the graph"
                                            };
                                            GraphError::invalid(
                                                format!("block '{bname}'"),
                                                format!("stage {si} names node '{n}', {why}"),
                                            )
                                        })
                                    })
                                    .collect::<Result<Vec<_>>>()
                            })
                            .collect::<Result<Vec<_>>>()
                    })
                    .collect::<Result<Vec<_>>>()?,
            ),
        };
        blocks.push(Block {
            name: bname,
            nodes: ids,
            stages,
        });
    }
    g.with_blocks(blocks)
}

fn with_batch(batch: usize, s: &[usize]) -> Shape {
    std::iter::once(batch).chain(s.iter().copied()).collect()
}

fn get<'a>(obj: &'a Map<String, Json>, loc: &str, key: &str) -> Result<&'a Json> {
    obj.get(key)
        .ok_or_else(|| GraphError::invalid(loc, format!("missing field '{key}'")))
}

fn get_str<'a>(obj: &'a Map<String, Json>, loc: &str, key: &str) -> Result<&'a str> {
    get(obj, loc, key)?
        .as_str()
        .ok_or_else(|| GraphError::invalid(loc, format!("field '{key}' must be a string")))
}

fn as_usize(v: &Json) -> Option<usize> {
    v.as_u64().and_then(|x| usize::try_from(x).ok())
}

fn get_usize(obj: &Map<String, Json>, loc: &str, key: &str) -> Result<usize> {
    as_usize(get(obj, loc, key)?).ok_or_else(|| {
        GraphError::invalid(loc, format!("field '{key}' must be a non-negative integer"))
    })
}

fn get_pair(obj: &Map<String, Json>, loc: &str, key: &str) -> Result<[usize; 2]> {
    let bad = || GraphError::invalid(loc, format!("field '{key}' must be a pair of integers"));
    match get(obj, loc, key)?.as_array().map(Vec::as_slice) {
        Some([a, b]) => Ok([as_usize(a).ok_or_else(bad)?, as_usize(b).ok_or_else(bad)?]),
        _ => Err(bad()),
    }
}

fn opt_pair(
    obj: &Map<String, Json>,
    loc: &str,
    key: &str,
    default: [usize; 2],
) -> Result<[usize; 2]> {
    if obj.contains_key(key) {
        get_pair(obj, loc, key)
    } else {
        Ok(default)
    }
}

fn check_keys(obj: &Map<String, Json>, loc: &str, allowed: &[&str]) -> Result<()> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(GraphError::invalid(
            loc,
            format!("unknown field '{k}' (expected {})", allowed.join(", ")),
        )),
        None => Ok(()),
    }
}

fn parse_inputs(obj: &Map<String, Json>, loc: &str) -> Result<Vec<RawTerm>> {
    let terms = get(obj, loc, "inputs")?
        .as_array()
        .ok_or_else(|| GraphError::invalid(loc, "field 'inputs' must be a list of terms"))?;
    terms
        .iter()
        .enumerate()
        .map(|(ti, t)| {
            let values = t.as_array().filter(|vs| !vs.is_empty()).ok_or_else(|| {
                GraphError::invalid(
                    loc,
                    format!("input term {ti} must be a non-empty list of values"),
                )
            })?;
            values
                .iter()
                .map(|v| match v.as_array().map(Vec::as_slice) {
                    Some([n, b, e]) => match (n.as_str(), as_usize(b), as_usize(e)) {
                        (Some(n), Some(b), Some(e)) => Ok((n.to_string(), b, e)),
                        _ => Err(bad_value(loc, ti, v)),
                    },
                    _ => Err(bad_value(loc, ti, v)),
                })
                .collect()
        })
        .collect()
}

fn bad_value(loc: &str, ti: usize, v: &Json) -> GraphError {
    GraphError::invalid(
        loc,
        format!("input term {ti}: value {v} is not [node name, begin, end]"),
    )
}

fn parse_act(s: &str, loc: &str, key: &str, allow_identity: bool) -> Result<Activation> {
    Ok(match s {
        "relu" => Activation::Relu,
        "sigmoid" => Activation::Sigmoid,
        "tanh" => Activation::Tanh,
        "identity" if allow_identity => Activation::None,
        other => {
            return Err(GraphError::invalid(
                loc,
                format!(
                    "unknown {key} '{other}' (expected relu, sigmoid, tanh{})",
                    if allow_identity { " or identity" } else { "" }
                ),
            ))
        }
    })
}

const COMMON: [&str; 5] = ["type", "name", "hint_name", "inputs", "output_shape"];

/// Parse one IOS node config. `at` locates it when it has no usable name.
fn parse_node(cfg: &Json, at: &str, batch: usize, inner: bool) -> Result<Parsed> {
    let obj = cfg
        .as_object()
        .ok_or_else(|| GraphError::invalid(at, "expected a JSON object"))?;
    let name = get_str(obj, at, "name")?.to_string();
    let loc = format!("node '{name}'");
    let loc = loc.as_str();
    let ty = get_str(obj, loc, "type")?;
    let extra: &[&str] = match ty {
        "placeholder" => &[],
        "conv" => &[
            "out_channels",
            "kernel",
            "stride",
            "padding",
            "groups",
            "act",
        ],
        "pool" => &["pool_type", "kernel", "stride", "padding"],
        "element" => &["op_type"],
        "identity" | "relu" => &[],
        "activation" => &["act_type", "inplace"],
        "sequential" => &["nodes"],
        other => {
            return Err(GraphError::invalid(
                loc,
                format!("unknown IOS node type '{other}'"),
            ))
        }
    };
    let allowed: Vec<&str> = COMMON
        .iter()
        .copied()
        .filter(|k| ty != "placeholder" || *k != "inputs")
        .chain(extra.iter().copied())
        .collect();
    check_keys(obj, loc, &allowed)?;
    if let Some(h) = obj.get("hint_name") {
        if !h.is_string() {
            return Err(GraphError::invalid(
                loc,
                "field 'hint_name' must be a string",
            ));
        }
    }
    let shape = match obj.get("output_shape") {
        None | Some(Json::Null) if ty != "placeholder" => None,
        None | Some(Json::Null) => {
            return Err(GraphError::invalid(loc, "missing field 'output_shape'"))
        }
        Some(s) => Some(
            s.as_array()
                .and_then(|a| a.iter().map(as_usize).collect::<Option<Vec<_>>>())
                .ok_or_else(|| {
                    GraphError::invalid(loc, "field 'output_shape' must be a list of integers")
                })?,
        ),
    };
    let mut inner_shapes = Vec::new();
    let (op, inputs) = match ty {
        "placeholder" => {
            if inner {
                return Err(GraphError::invalid(
                    loc,
                    "a placeholder cannot be inside a sequential node",
                ));
            }
            let s = shape.clone().unwrap_or_default();
            (
                Op::Input {
                    shape: with_batch(batch, &s),
                },
                Vec::new(),
            )
        }
        "conv" => {
            let conv = Conv2d {
                out_channels: get_usize(obj, loc, "out_channels")?,
                kernel: get_pair(obj, loc, "kernel")?,
                stride: get_pair(obj, loc, "stride")?,
                padding: get_pair(obj, loc, "padding")?,
                padding_end: None,
                dilation: [1, 1],
                groups: get_usize(obj, loc, "groups")?,
                bias: false,
                act: parse_act(get_str(obj, loc, "act")?, loc, "act", true)?,
            };
            (Op::Conv2d(conv), parse_inputs(obj, loc)?)
        }
        "pool" => {
            let kind = match get_str(obj, loc, "pool_type")? {
                "max" => PoolKind::Max,
                "avg" => PoolKind::Avg,
                "global_max" => PoolKind::GlobalMax,
                "global_avg" => PoolKind::GlobalAvg,
                other => {
                    return Err(GraphError::invalid(
                        loc,
                        format!(
                        "unknown pool_type '{other}' (expected max, avg, global_max or global_avg)"
                    ),
                    ))
                }
            };
            let pool = if kind.is_global() {
                Pool2d {
                    kind,
                    kernel: opt_pair(obj, loc, "kernel", [1, 1])?,
                    stride: opt_pair(obj, loc, "stride", [1, 1])?,
                    padding: opt_pair(obj, loc, "padding", [0, 0])?,
                    padding_end: None,
                    ceil_mode: false,
                    count_include_pad: true,
                }
            } else {
                Pool2d {
                    kind,
                    kernel: get_pair(obj, loc, "kernel")?,
                    stride: get_pair(obj, loc, "stride")?,
                    padding: get_pair(obj, loc, "padding")?,
                    padding_end: None,
                    ceil_mode: false,
                    count_include_pad: true,
                }
            };
            (Op::Pool2d(pool), parse_inputs(obj, loc)?)
        }
        "element" => {
            let kind = match get_str(obj, loc, "op_type")? {
                "add" => ElementwiseKind::Add,
                "mul" => ElementwiseKind::Mul,
                other => {
                    return Err(GraphError::invalid(
                        loc,
                        format!("unknown op_type '{other}' (expected add or mul)"),
                    ))
                }
            };
            let terms = parse_inputs(obj, loc)?;
            let [term] = <[RawTerm; 1]>::try_from(terms).map_err(|t| {
                GraphError::invalid(
                    loc,
                    format!(
                        "an IOS element node combines the values of exactly one term, got {} terms",
                        t.len()
                    ),
                )
            })?;
            // The values of the one term are combined by the op: each becomes its own term.
            (
                Op::Elementwise { kind },
                term.into_iter().map(|v| vec![v]).collect(),
            )
        }
        "identity" => (Op::Identity, parse_inputs(obj, loc)?),
        "relu" => (
            Op::Activation {
                act: Activation::Relu,
            },
            parse_inputs(obj, loc)?,
        ),
        "activation" => {
            let act = parse_act(get_str(obj, loc, "act_type")?, loc, "act_type", false)?;
            if !get(obj, loc, "inplace")?.is_boolean() {
                return Err(GraphError::invalid(
                    loc,
                    "field 'inplace' must be true or false",
                ));
            }
            (Op::Activation { act }, parse_inputs(obj, loc)?)
        }
        "sequential" => {
            if inner {
                return Err(GraphError::invalid(
                    loc,
                    "nested sequential nodes are not supported",
                ));
            }
            let nodes = get(obj, loc, "nodes")?
                .as_array()
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    GraphError::invalid(loc, "field 'nodes' must be a non-empty list of nodes")
                })?;
            let mut ops = Vec::with_capacity(nodes.len());
            let mut inputs = Vec::new();
            let mut prev: Option<&Parsed> = None;
            let parsed_inner = nodes
                .iter()
                .enumerate()
                .map(|(i, n)| parse_node(n, &format!("{loc}, inner node #{i}"), batch, true))
                .collect::<Result<Vec<_>>>()?;
            for (i, p) in parsed_inner.iter().enumerate() {
                match prev {
                    None => inputs = p.inputs.clone(),
                    Some(q) => {
                        let ok = match p.inputs.as_slice() {
                            [t] => match t.as_slice() {
                                [(n, 0, e)] => {
                                    *n == q.name
                                        && q.shape.as_ref().is_none_or(|s| s.first() == Some(e))
                                }
                                _ => false,
                            },
                            _ => false,
                        };
                        if !ok {
                            return Err(GraphError::invalid(
                                loc,
                                format!(
                                    "inner node #{i} ('{}') must read the whole output of the inner node before it ('{}')",
                                    p.name, q.name
                                ),
                            ));
                        }
                    }
                }
                ops.push(p.op.clone());
                inner_shapes.push((p.name.clone(), p.shape.clone()));
                prev = Some(p);
            }
            if obj.contains_key("inputs") {
                // Compare in file form: an element first inner node has its values split.
                let first_file = match &parsed_inner[0].op {
                    Op::Elementwise { .. } => {
                        vec![parsed_inner[0]
                            .inputs
                            .iter()
                            .flatten()
                            .cloned()
                            .collect::<RawTerm>()]
                    }
                    _ => parsed_inner[0].inputs.clone(),
                };
                if parse_inputs(obj, loc)? != first_file {
                    return Err(GraphError::invalid(
                        loc,
                        "field 'inputs' differs from the inputs of the first inner node",
                    ));
                }
            }
            (Op::Sequential { ops }, inputs)
        }
        other => {
            return Err(GraphError::invalid(
                loc,
                format!("unknown IOS node type '{other}'"),
            ))
        }
    };
    Ok(Parsed {
        name,
        op,
        inputs,
        shape,
        inner: inner_shapes,
    })
}

// ---------------------------------------------------------------------------------------------
// Export

/// `[C, H, W]` of a node (its shape without the batch dimension); IOS needs NCHW tensors.
fn chw(g: &Graph, id: NodeId) -> Result<Vec<usize>> {
    chw_of(&g.node(id).name, &g.node(id).shape)
}

fn chw_of(name: &str, shape: &[usize]) -> Result<Vec<usize>> {
    if shape.len() != 4 {
        return Err(GraphError::invalid(
            format!("node '{name}'"),
            format!("IOS graphs hold NCHW tensors, but the shape is {shape:?}"),
        ));
    }
    Ok(shape[1..].to_vec())
}

fn value_json(g: &Graph, v: &Value) -> Result<Json> {
    let src = g.node(v.node);
    let (b, e) = match v.channels {
        Some(r) => r,
        None => (0, chw(g, v.node)?[0]),
    };
    Ok(json!([src.name, b, e]))
}

fn terms_json(g: &Graph, terms: &[Term]) -> Result<Json> {
    terms
        .iter()
        .map(|t| {
            t.iter()
                .map(|v| value_json(g, v))
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<Vec<_>>>()
        .map(Json::from)
}

fn act_name(a: Activation, loc: &str) -> Result<&'static str> {
    Ok(match a {
        Activation::None => "identity",
        Activation::Relu => "relu",
        Activation::Sigmoid => "sigmoid",
        Activation::Tanh => "tanh",
        other => {
            return Err(GraphError::invalid(
                loc,
                format!("IOS has no {other} activation"),
            ));
        }
    })
}

/// The IOS config of one op (not sequential), given its inputs (already in file form) and shape.
fn op_config(
    op: &Op,
    name: &str,
    inputs: Json,
    shape: &[usize],
    loc: &str,
) -> Result<Map<String, Json>> {
    let mut m = Map::new();
    let mut put = |k: &str, v: Json| {
        m.insert(k.to_string(), v);
    };
    let ty = match op {
        Op::Conv2d(c) => {
            if c.dilation != [1, 1] {
                return Err(GraphError::invalid(
                    loc,
                    "IOS convolutions have no dilation",
                ));
            }
            if c.padding_end.is_some() {
                return Err(GraphError::invalid(
                    loc,
                    "IOS convolutions have no asymmetric padding",
                ));
            }
            put("out_channels", json!(c.out_channels));
            put("kernel", json!(c.kernel));
            put("stride", json!(c.stride));
            put("padding", json!(c.padding));
            put("groups", json!(c.groups));
            put("act", json!(act_name(c.act, loc)?));
            "conv"
        }
        Op::Pool2d(p) => {
            if p.ceil_mode {
                return Err(GraphError::invalid(loc, "IOS pools have no ceil mode"));
            }
            if p.padding_end.is_some() || !p.count_include_pad {
                return Err(GraphError::invalid(
                    loc,
                    "IOS pools have no asymmetric padding and count the padding",
                ));
            }
            let kind = match p.kind {
                PoolKind::Max => "max",
                PoolKind::Avg => "avg",
                PoolKind::GlobalMax => "global_max",
                PoolKind::GlobalAvg => "global_avg",
            };
            put("pool_type", json!(kind));
            put("kernel", json!(p.kernel));
            put("stride", json!(p.stride));
            put("padding", json!(p.padding));
            "pool"
        }
        Op::Elementwise { kind } => {
            put(
                "op_type",
                json!(match kind {
                    ElementwiseKind::Add => "add",
                    ElementwiseKind::Mul => "mul",
                }),
            );
            "element"
        }
        Op::Identity
        | Op::Activation {
            act: Activation::None,
        }
        | Op::Concat { axis: 1 } => "identity",
        Op::Activation {
            act: Activation::Relu,
        } => "relu",
        Op::Activation { act } => {
            put("act_type", json!(act_name(*act, loc)?));
            put("inplace", json!(false));
            "activation"
        }
        other => {
            return Err(GraphError::invalid(
                loc,
                format!(
                    "a {} operator cannot be written as an IOS node",
                    other.type_name()
                ),
            ))
        }
    };
    let mut out = Map::new();
    out.insert("type".into(), json!(ty));
    out.insert("name".into(), json!(name));
    out.insert("hint_name".into(), json!(name));
    out.insert("inputs".into(), inputs);
    out.extend(m);
    out.insert("output_shape".into(), json!(chw_of(name, shape)?));
    Ok(out)
}

/// The IOS config of a node of `g`.
fn node_config(g: &Graph, id: NodeId) -> Result<Json> {
    let n = g.node(id);
    let loc = format!("node '{}'", n.name);
    match &n.op {
        Op::Input { .. } => Ok(json!({
            "type": "placeholder",
            "name": n.name,
            "hint_name": n.name,
            "output_shape": chw(g, id)?,
        })),
        Op::Sequential { ops } => {
            let mut shapes = g.input_shapes(id);
            let mut nodes = Vec::with_capacity(ops.len());
            let mut prev: Option<(String, usize)> = None;
            for (i, op) in ops.iter().enumerate() {
                if matches!(op, Op::Sequential { .. } | Op::Input { .. }) {
                    return Err(GraphError::invalid(
                        &loc,
                        "IOS sequential nodes cannot hold sequential nodes or inputs",
                    ));
                }
                let inner = format!("{}.{i}", n.name);
                let out = op
                    .infer_shape(&shapes)
                    .map_err(|message| GraphError::Shape {
                        node: n.name.clone(),
                        message,
                    })?;
                let inputs = match &prev {
                    None => element_inputs(g, op, &n.inputs, &loc)?,
                    Some((p, c)) => json!([[[p, 0, c]]]),
                };
                let cfg = op_config(op, &inner, inputs, &out, &loc)?;
                prev = Some((inner, chw_of(&n.name, &out)?[0]));
                nodes.push(Json::Object(cfg));
                shapes = vec![out];
            }
            Ok(json!({
                "type": "sequential",
                "name": n.name,
                "hint_name": n.name,
                "nodes": nodes,
                "output_shape": chw(g, id)?,
            }))
        }
        op => {
            let inputs = element_inputs(g, op, &n.inputs, &loc)?;
            Ok(Json::Object(op_config(
                op, &n.name, inputs, &n.shape, &loc,
            )?))
        }
    }
}

/// The `inputs` of an op in file form: an elementwise op's terms become the values of one term.
fn element_inputs(g: &Graph, op: &Op, terms: &[Term], loc: &str) -> Result<Json> {
    match op {
        Op::Elementwise { kind } => {
            if *kind == ElementwiseKind::Mul && terms.iter().any(|t| t.len() != 1) {
                return Err(GraphError::invalid(
                    loc,
                    "an IOS mul node cannot sum values inside its inputs",
                ));
            }
            let values = terms
                .iter()
                .flatten()
                .map(|v| value_json(g, v))
                .collect::<Result<Vec<_>>>()?;
            Ok(json!([values]))
        }
        _ => terms_json(g, terms),
    }
}

/// Serialize a graph to an IOS graph JSON document.
///
/// The graph must have exactly one input (the placeholder) and NCHW tensors only. IOS files list
/// blocks, each defining its nodes before they are used: blocks (and operators in no block) are
/// written in a topological order of the blocks, earliest first node first; each block's nodes in
/// the block's own order when that defines every node before its use (else topologically). A
/// block's last node is its exit node and the previous block's exit (the placeholder for the
/// first) its enter node. Consecutive operators in no block are gathered into extra blocks (so a
/// graph without blocks becomes one block of all operators, in topological order, with the
/// placeholder as enter node). Blocks that cannot be ordered (a path leaves a block and comes
/// back) are an error. Stages are written
/// as they are (`null` when absent). `hint_name` is the node name; sequential inner nodes are
/// named `{node}.{i}`. Conv bias flags are not written (IOS has none).
pub fn to_value(g: &Graph) -> Result<Json> {
    let inputs: Vec<NodeId> = g.inputs().collect();
    let [input] = inputs.as_slice() else {
        return Err(GraphError::invalid(
            format!("graph '{}'", g.name),
            format!(
                "an IOS graph has exactly one input, this graph has {}",
                inputs.len()
            ),
        ));
    };
    let input = *input;
    let mut block_of: Vec<Option<usize>> = vec![None; g.len()];
    for (bi, b) in g.blocks().iter().enumerate() {
        for &n in &b.nodes {
            if g.node(n).op.is_input() {
                return Err(GraphError::invalid(
                    format!("block '{}'", b.name),
                    format!("holds the graph input '{}'", g.node(n).name),
                ));
            }
            block_of[n.index()] = Some(bi);
        }
    }
    let mut topo_pos = vec![0; g.len()];
    for (i, &n) in g.topo_order().iter().enumerate() {
        topo_pos[n.index()] = i;
    }

    // Units to order: the blocks, then each operator in no block.
    let nb = g.blocks().len();
    let loose: Vec<NodeId> = g.ops().filter(|n| block_of[n.index()].is_none()).collect();
    let mut loose_index = vec![usize::MAX; g.len()];
    for (i, n) in loose.iter().enumerate() {
        loose_index[n.index()] = i;
    }
    let unit_of = |n: NodeId| block_of[n.index()].unwrap_or_else(|| nb + loose_index[n.index()]);
    let units = nb + loose.len();
    let key: Vec<usize> = (0..units)
        .map(|u| match u.checked_sub(nb) {
            None => g.blocks()[u]
                .nodes
                .iter()
                .map(|n| topo_pos[n.index()])
                .min()
                .unwrap_or(usize::MAX),
            Some(l) => topo_pos[loose[l].index()],
        })
        .collect();
    let mut succ: Vec<HashSet<usize>> = vec![HashSet::new(); units];
    let mut indeg = vec![0usize; units];
    for (s, d, _) in g.edges() {
        if g.node(s).op.is_input() {
            continue;
        }
        let (us, ud) = (unit_of(s), unit_of(d));
        if us != ud && succ[us].insert(ud) {
            indeg[ud] += 1;
        }
    }
    // Kahn's algorithm over units, earliest first node first.
    let mut ready: BinaryHeap<Reverse<(usize, usize)>> = (0..units)
        .filter(|&u| indeg[u] == 0)
        .map(|u| Reverse((key[u], u)))
        .collect();
    let mut unit_order = Vec::with_capacity(units);
    while let Some(Reverse((_, u))) = ready.pop() {
        unit_order.push(u);
        for &v in &succ[u] {
            indeg[v] -= 1;
            if indeg[v] == 0 {
                ready.push(Reverse((key[v], v)));
            }
        }
    }
    if unit_order.len() < units {
        let stuck = (0..nb).find(|&u| indeg[u] > 0).unwrap_or(0);
        return Err(GraphError::invalid(
            format!("block '{}'", g.blocks()[stuck].name),
            "the blocks cannot be written in order: a path leaves this block and comes back into it",
        ));
    }

    // Blocks to write: nodes in file order, stages. Runs of loose operators become blocks.
    let mut out_blocks: Vec<(Vec<NodeId>, Option<&Stages>)> = Vec::new();
    let mut run: Vec<NodeId> = Vec::new();
    for u in unit_order {
        if let Some(l) = u.checked_sub(nb) {
            run.push(loose[l]);
            continue;
        }
        if !run.is_empty() {
            out_blocks.push((std::mem::take(&mut run), None));
        }
        let b = &g.blocks()[u];
        let mut seen: HashSet<NodeId> = HashSet::new();
        let defines_before_use = b.nodes.iter().all(|&n| {
            let ok = g
                .preds(n)
                .all(|p| block_of[p.index()] != Some(u) || seen.contains(&p));
            seen.insert(n);
            ok
        });
        let mut order = b.nodes.clone();
        if !defines_before_use {
            order.sort_by_key(|n| topo_pos[n.index()]);
        }
        out_blocks.push((order, b.stages.as_ref()));
    }
    if !run.is_empty() {
        out_blocks.push((run, None));
    }

    let input_cfg = node_config(g, input)?;
    let mut enter = input;
    let mut blocks = Vec::with_capacity(out_blocks.len());
    for (nodes, stages) in out_blocks {
        let Some((&exit, inner)) = nodes.split_last() else {
            continue;
        };
        let name_of = |n: &NodeId| g.node(*n).name.clone();
        blocks.push(json!({
            "enter_name": g.node(enter).name,
            "enter_node": node_config(g, enter)?,
            "inner_nodes": inner.iter().map(|&n| node_config(g, n)).collect::<Result<Vec<_>>>()?,
            "exit_node": node_config(g, exit)?,
            "stages": stages.map(|st| {
                st.iter()
                    .map(|s| s.iter().map(|grp| grp.iter().map(name_of).collect::<Vec<_>>()).collect::<Vec<_>>())
                    .collect::<Vec<_>>()
            }),
        }));
        enter = exit;
    }
    Ok(json!({
        "name": g.name,
        "input": input_cfg,
        "blocks": blocks,
    }))
}

/// Serialize a graph to pretty IOS graph JSON text.
pub fn to_string(g: &Graph) -> Result<String> {
    Ok(serde_json::to_string_pretty(&to_value(g)?)?)
}
