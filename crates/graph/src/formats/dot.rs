//! DOT (Graphviz) export: [`to_dot`].
//!
//! One DOT node per graph node, labelled with its name, operator type, key parameters and output
//! shape; graph inputs are dashed boxes, operators rounded boxes. One edge per distinct
//! producer-consumer pair, labelled with the channel slices the consumer reads when it reads
//! slices (`[112:176)`) and with the transfer time when the file gave one (`0.25 ms`). Blocks are
//! `subgraph cluster_{i}` with the block's name as label.
//!
//! DOT node ids are `n{index}` (the [`NodeId`]); node names appear only inside quoted labels,
//! escaped, so any name (quotes, backslashes, newlines) is safe.

use std::fmt::Write as _;

use crate::graph::{Graph, NodeId};
use crate::op::{Activation, ElementwiseKind, Op, PoolKind};

/// Escape text for a double-quoted DOT string used as a label: `"` and `\` are escaped (so
/// Graphviz's `\N`-style escapes cannot be triggered by names) and newlines become `\n`.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

fn act(a: Activation) -> String {
    match a {
        Activation::None => String::new(),
        a => a.to_string(),
    }
}

fn pair(p: [usize; 2]) -> String {
    if p[0] == p[1] {
        p[0].to_string()
    } else {
        format!("{}x{}", p[0], p[1])
    }
}

/// Operator type and key parameters, one short line.
fn describe(op: &Op) -> String {
    match op {
        Op::Input { .. } => "input".into(),
        Op::Constant { .. } => "constant".into(),
        Op::Binary { kind } => format!("binary {}", format!("{kind:?}").to_lowercase()),
        Op::Where => "where".into(),
        Op::Expand { shape } => format!("expand {shape:?}"),
        Op::Affine => "affine".into(),
        Op::Pad { begin, end, value } => format!("pad {begin:?} {end:?} value {value}"),
        Op::LogSoftmax { axis } => format!("log_softmax axis {axis}"),
        Op::Resize(r) => format!("resize {r}"),
        Op::Embedding { rows, dim } => format!("embedding {rows}x{dim}"),
        Op::CumSum {
            axis,
            exclusive,
            reverse,
        } => {
            let how = match (exclusive, reverse) {
                (false, false) => "",
                (true, false) => " exclusive",
                (false, true) => " reverse",
                (true, true) => " exclusive reverse",
            };
            format!("cum_sum axis {axis}{how}")
        }
        Op::GatherElements { axis } => format!("gather_elements axis {axis}"),
        Op::Conv2d(c) => {
            let mut s = format!(
                "conv2d {} {}x{} s{} p{}",
                c.out_channels,
                c.kernel[0],
                c.kernel[1],
                pair(c.stride),
                pair(c.padding)
            );
            if c.dilation != [1, 1] {
                let _ = write!(s, " d{}", pair(c.dilation));
            }
            if c.groups != 1 {
                let _ = write!(s, " g{}", c.groups);
            }
            if c.bias {
                s.push_str(" +bias");
            }
            if c.act != Activation::None {
                let _ = write!(s, " {}", act(c.act));
            }
            s
        }
        Op::Pool2d(p) => {
            let kind = match p.kind {
                PoolKind::Max => "max",
                PoolKind::Avg => "avg",
                PoolKind::GlobalMax => "global_max",
                PoolKind::GlobalAvg => "global_avg",
            };
            if p.kind.is_global() {
                format!("pool2d {kind}")
            } else {
                format!(
                    "pool2d {kind} {}x{} s{} p{}{}",
                    p.kernel[0],
                    p.kernel[1],
                    pair(p.stride),
                    pair(p.padding),
                    if p.ceil_mode { " ceil" } else { "" }
                )
            }
        }
        Op::Activation { act: a } => format!("activation {}", act(*a)).trim_end().to_string(),
        Op::Elementwise { kind } => match kind {
            ElementwiseKind::Add => "elementwise add".into(),
            ElementwiseKind::Mul => "elementwise mul".into(),
        },
        Op::Concat { axis } => format!("concat axis {axis}"),
        Op::Identity => "identity".into(),
        Op::Linear {
            out_features,
            bias,
            act: a,
        } => {
            let mut s = format!("linear {out_features}");
            if *bias {
                s.push_str(" +bias");
            }
            if *a != Activation::None {
                let _ = write!(s, " {}", act(*a));
            }
            s
        }
        Op::BatchMatmul { transpose_b, alpha } => {
            let mut s = String::from("batch_matmul");
            if *transpose_b {
                s.push_str(" b^T");
            }
            if *alpha != 1.0 {
                let _ = write!(s, " x{alpha}");
            }
            s
        }
        Op::Softmax { axis } => format!("softmax axis {axis}"),
        Op::LayerNorm { eps } => format!("layer_norm eps {eps}"),
        Op::Reshape { shape } => format!("reshape {shape:?}"),
        Op::Transpose { perm } => format!("transpose {perm:?}"),
        Op::Slice { axis, begin, end } => format!("slice axis {axis} [{begin}, {end})"),
        Op::Reduce {
            kind, begin, end, ..
        } => format!("reduce {kind:?} axes {begin}..{end}").to_lowercase(),
        Op::Sequential { ops } => {
            let inner: Vec<String> = ops.iter().map(describe).collect();
            format!("sequential [{}]", inner.join("; "))
        }
        Op::Abstract { time_ms, util } => format!("abstract {time_ms} ms util {util}"),
        Op::Opaque { op_type, .. } => format!("opaque {op_type}"),
    }
}

fn shape_str(shape: &[usize]) -> String {
    if shape.is_empty() {
        return "-".into();
    }
    shape
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("x")
}

fn node_stmt(out: &mut String, g: &Graph, id: NodeId, indent: &str) {
    let n = g.node(id);
    let label = format!(
        "{}\\n{}\\n{}",
        esc(&n.name),
        esc(&describe(&n.op)),
        shape_str(&n.shape)
    );
    let style = if n.op.is_input() {
        "shape=box, style=dashed"
    } else {
        "shape=box, style=rounded"
    };
    let _ = writeln!(out, "{indent}n{} [label=\"{label}\", {style}];", id.0);
}

/// Render a graph as Graphviz DOT text.
pub fn to_dot(g: &Graph) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph \"{}\" {{", esc(&g.name));
    out.push_str("  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10];\n");
    out.push_str("  edge [fontname=\"Helvetica\", fontsize=9];\n");

    let mut in_block = vec![false; g.len()];
    for (bi, b) in g.blocks().iter().enumerate() {
        let _ = writeln!(out, "  subgraph cluster_{bi} {{");
        let _ = writeln!(out, "    label=\"{}\";", esc(&b.name));
        out.push_str("    style=dashed;\n");
        for &n in &b.nodes {
            if n.index() < g.len() && !in_block[n.index()] {
                in_block[n.index()] = true;
                node_stmt(&mut out, g, n, "    ");
            }
        }
        out.push_str("  }\n");
    }
    for (i, &inside) in in_block.iter().enumerate() {
        if !inside {
            node_stmt(&mut out, g, NodeId(i as u32), "  ");
        }
    }

    let mut edges: Vec<(NodeId, NodeId, Option<f64>)> =
        g.edges().map(|(s, d, e)| (s, d, e.transfer_ms)).collect();
    edges.sort_by_key(|&(s, d, _)| (d, s));
    for (src, dst, ms) in edges {
        let mut parts: Vec<String> = Vec::new();
        let slices: Vec<String> = g
            .node(dst)
            .inputs
            .iter()
            .flatten()
            .filter(|v| v.node == src)
            .filter_map(|v| v.channels.map(|(b, e)| format!("[{b}:{e})")))
            .collect();
        if !slices.is_empty() {
            parts.push(slices.join(", "));
        }
        if let Some(ms) = ms {
            parts.push(format!("{ms} ms"));
        }
        if parts.is_empty() {
            let _ = writeln!(out, "  n{} -> n{};", src.0, dst.0);
        } else {
            let _ = writeln!(
                out,
                "  n{} -> n{} [label=\"{}\"];",
                src.0,
                dst.0,
                parts.join("\\n")
            );
        }
    }
    out.push_str("}\n");
    out
}
