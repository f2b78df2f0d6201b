//! Canonical, name-independent keys of what an operator (or a concurrent stage) computes.
//!
//! A measurement of an operator is valid for every operator that does the same work: the same
//! type, the same parameters, the same input shapes and the same element type. Node names,
//! positions in the graph and the model they come from do not matter. [`op_signature`] writes
//! that as one string, for example
//!
//! ```text
//! conv2d(oc=64,k=3x3,s=1x1,p=1x1,d=1x1,g=1,bias,act=relu)[1x64x56x56]f32
//! ```
//!
//! The parts:
//! - the operator: its type name and every parameter in a fixed order (flags such as `bias` or
//!   `ceil` appear only when set, `act=` only when there is an activation); a `sequential`
//!   operator lists its inner operators in order inside `{..;..}`. Fusion with a neighbour
//!   changes the kernel, so it is part of the key (`opsched_graph::fusion`): an element-wise
//!   operator that also applies its consumer's activation adds `,act=..`
//!   (`elementwise(add,act=relu)`), and that activation, which runs no kernel, adds `,fused`;
//!   a convolution or linear layer that computes the residual sum it feeds adds `,residual`
//!   (and the sum's activation), and that sum adds `,fused`; a convolution (or a `sequential`
//!   chain ending in one) whose readers add its bias (`opsched_graph::fusion::deferred_bias`)
//!   adds `bias=readers` (its readers' kernels, which add a bias per channel to what they
//!   read, keep their keys), and one whose depthwise kernel reads the values of its input's
//!   sum (`opsched_graph::fusion::depthwise_reads_sum`) `sum=read`; an operator that
//!   activates its own value in place for its readers
//!   (`opsched_graph::fusion::producer_activation`) `then=relu` (its activation; `then=relu/writers`
//!   where its sums' add kernels apply it, `opsched_graph::fusion::act_by_writers`), and those
//!   readers, which skip theirs, `pre=producer`; a reshape that is a view of its
//!   input (`opsched_graph::inplace::reshape_source`) adds `,view` (`identity(view)`); a batch
//!   matmul that reads or writes through a head transpose adds `,strided=in`, `=out` or
//!   `=in+out`, and that transpose `,fused`; a pooling that its reader's add kernel computes
//!   (`opsched_graph::fusion::pool_into_sum`) adds `,fused`, and the reader's term that
//!   sums it `(pooledN:` the pooling and its input's shape `)`;
//! - the input terms in `[..]`, separated by `,`: each term's shape (after any channel slice,
//!   batch included) joined with `x`, followed by `(sumN)` when the term sums `N > 1` values
//!   and `(slice)` when one of its values is a channel slice (a strided read); a term of rank
//!   zero (abstract operators) is written `()`;
//! - the element type (`f32`, `f16`).
//!
//! The batch is part of the key through the input shapes; [`batch_of`] extracts it for cache
//! keys. [`stage_signature`] combines operator signatures into the key of a concurrent stage.
//!
//! A measurement also depends on how its activations were stored ([`Layout`]), which is not
//! part of what an operator computes: [`measured_in`] appends `@nhwc` to the signature of a
//! measurement taken channels last, and leaves NCHW's unmarked (every measurement made before
//! channels last existed was NCHW, so older caches and tables keep their meaning).

use std::fmt::Write as _;

use opsched_graph::{Graph, NodeId, Op, PoolKind};
use serde::{Deserialize, Serialize};

/// How 4-D activations are stored (the GPU crate's programs choose it; a measurement records
/// it, see [`measured_in`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// `[n, c, h, w]`, the IR's order, everywhere.
    #[default]
    Nchw,
    /// Channels last (`[n, h, w, c]`) for the values of convolutions that cuDNN or our
    /// depthwise kernel runs, of `sequential` chains of them, and of the element-wise
    /// operators, activations, pools and concatenations after them
    /// (`opsched_gpu::program::channels_last`); the other operators, the graph's inputs and
    /// outputs stay in NCHW, with a transpose where a value crosses over (made once per value
    /// where its producer runs it).
    Nhwc,
}

impl Layout {
    /// The other layout (where a measurement in the one asked for is missing, a measured
    /// table answers with this one's, see `MeasuredTable`).
    pub fn other(self) -> Layout {
        match self {
            Layout::Nchw => Layout::Nhwc,
            Layout::Nhwc => Layout::Nchw,
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Layout::Nchw => "nchw",
            Layout::Nhwc => "nhwc",
        })
    }
}

/// The suffix of the key of a measurement taken channels last.
pub const NHWC_SUFFIX: &str = "@nhwc";

/// The key of a measurement of `signature` (an operator's, a merged group's or a stage's)
/// taken with activations stored in `layout`: `signature` itself for NCHW, followed by
/// [`NHWC_SUFFIX`] for channels last.
pub fn measured_in(signature: &str, layout: Layout) -> String {
    match layout {
        Layout::Nchw => signature.to_string(),
        Layout::Nhwc => format!("{signature}{NHWC_SUFFIX}"),
    }
}

/// The canonical key of what `op` computes (see the module documentation for the format).
pub fn op_signature(g: &Graph, op: NodeId) -> String {
    let node = g.node(op);
    let mut s = String::with_capacity(96);
    write_op(&mut s, &node.op);
    write_fusion(&mut s, g, op);
    s.push('[');
    let shapes = g.input_shapes(op);
    for (i, term) in node.inputs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        match shapes.get(i) {
            Some(shape) => write_shape(&mut s, shape),
            None => s.push('?'),
        }
        if term.len() > 1 {
            let _ = write!(s, "(sum{})", term.len());
        }
        if term.iter().any(|v| v.channels.is_some()) {
            s.push_str("(slice)");
        }
        write_pooled(&mut s, g, op, term);
    }
    s.push(']');
    let _ = write!(s, "{}", g.dtype);
    s
}

/// The poolings that `op`'s add kernel computes among the values of `term`
/// (`opsched_graph::fusion::pool_into_sum`), which pool alike: `(pooledN:` the pooling and
/// its input shape `)`.
fn write_pooled(s: &mut String, g: &Graph, op: NodeId, term: &opsched_graph::Term) {
    let pooled: Vec<NodeId> = term
        .iter()
        .map(|v| v.node)
        .filter(|&p| opsched_graph::fusion::pool_into_sum(g, p) == Some(op))
        .collect();
    let Some(&first) = pooled.first() else {
        return;
    };
    let _ = write!(s, "(pooled{}:", pooled.len());
    write_op(s, &g.node(first).op);
    s.push('[');
    if let Some(shape) = g.input_shapes(first).first() {
        write_shape(s, shape);
    }
    s.push_str("])");
}

/// The canonical key of a concurrent stage: `stage[<group> | <group> ...]`, where a group is
/// its operators' signatures in run order joined by ` > `. Groups are sorted (by their text),
/// so the same stage written with its groups in another order, or found at another place of
/// another model, has the same key; the order inside a group is kept (it is part of what runs).
/// Empty groups are left out.
pub fn stage_signature(g: &Graph, groups: &[Vec<NodeId>]) -> String {
    let mut parts: Vec<String> = groups
        .iter()
        .filter(|grp| !grp.is_empty())
        .map(|grp| {
            grp.iter()
                .map(|&o| op_signature(g, o))
                .collect::<Vec<_>>()
                .join(" > ")
        })
        .collect();
    parts.sort();
    format!("stage[{}]", parts.join(" | "))
}

/// The key of the one convolution or linear layer a merged group `ops` runs as
/// ([`opsched_graph::merge::merged_op`]), or `None` if they cannot merge: exactly the
/// [`op_signature`] of that operator alone on the group's input, so a measurement of it is
/// an operator row like any other (what the profiler writes for a merged stage).
pub fn merged_signature(g: &Graph, ops: &[NodeId]) -> Option<String> {
    let (op, input) = opsched_graph::merge::merged_op(g, ops)?;
    let mut s = String::with_capacity(96);
    write_op(&mut s, &op);
    s.push('[');
    write_shape(&mut s, &input);
    s.push(']');
    let _ = write!(s, "{}", g.dtype);
    Some(s)
}

/// Whether a signature is a stage's (from [`stage_signature`]) rather than an operator's.
pub fn is_stage_signature(signature: &str) -> bool {
    signature.starts_with("stage[")
}

/// The batch size `op` runs at: the leading dimension of its first input term, else of its
/// output, else 1 (abstract operators have no shapes).
pub fn batch_of(g: &Graph, op: NodeId) -> usize {
    let node = g.node(op);
    g.input_shapes(op)
        .first()
        .and_then(|s| s.first().copied())
        .or_else(|| node.shape.first().copied())
        .filter(|&b| b > 0)
        .unwrap_or(1)
}

fn write_shape(s: &mut String, shape: &[usize]) {
    if shape.is_empty() {
        s.push_str("()");
        return;
    }
    for (i, d) in shape.iter().enumerate() {
        if i > 0 {
            s.push('x');
        }
        let _ = write!(s, "{d}");
    }
}

fn write_list<T: std::fmt::Display>(s: &mut String, items: &[T]) {
    s.push('[');
    for (i, v) in items.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{v}");
    }
    s.push(']');
}

fn lower<T: std::fmt::Debug>(v: T) -> String {
    // Enum names of the graph crate in snake case (they serialize that way too).
    let mut out = String::new();
    for (i, ch) in format!("{v:?}").chars().enumerate() {
        if ch.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(ch.to_ascii_lowercase());
        } else {
            out.push(ch);
        }
    }
    out
}

/// The fusion part of a signature, inside the operator's parentheses (written last, so that
/// it can reopen them).
fn write_fusion(s: &mut String, g: &Graph, op: NodeId) {
    use opsched_graph::fusion::{act_by_writers, producer_activation, reads_activated};
    let marks: Vec<String> = [
        kernel_mark(g, op),
        producer_activation(g, op).map(|act| match act_by_writers(g, op) {
            Some(_) => format!("then={act}/writers"),
            None => format!("then={act}"),
        }),
        reads_activated(g, op).then(|| "pre=producer".to_string()),
    ]
    .into_iter()
    .flatten()
    .collect();
    if marks.is_empty() {
        return;
    }
    let mark = marks.join(",");
    if s.ends_with(')') {
        s.pop();
        let _ = write!(s, ",{mark})");
    } else {
        let _ = write!(s, "({mark})");
    }
}

/// What the kernel of `op` itself fuses, if anything.
fn kernel_mark(g: &Graph, op: NodeId) -> Option<String> {
    use opsched_graph::fusion::{fused_source, residual_of, residual_source};
    let mark = match &g.node(op).op {
        Op::Activation { .. } if fused_source(g, op).is_some() => "fused".to_string(),
        Op::Pool2d(_) if opsched_graph::fusion::pool_into_sum(g, op).is_some() => {
            "fused".to_string()
        }
        Op::Elementwise { .. } if residual_source(g, op).is_some() => "fused".to_string(),
        Op::Reshape { .. } | Op::Identity
            if opsched_graph::inplace::reshape_source(g, op).is_some() =>
        {
            "view".to_string()
        }
        Op::Transpose { .. } if opsched_graph::fusion::transpose_fused(g, op) => {
            "fused".to_string()
        }
        Op::BatchMatmul { .. } => {
            use opsched_graph::fusion::{transposed_operand, transposed_output};
            let reads = g.preds(op).any(|t| transposed_operand(g, t).is_some());
            let writes = transposed_output(g, op).is_some();
            match (reads, writes) {
                (false, false) => return None,
                (true, false) => "strided=in".to_string(),
                (false, true) => "strided=out".to_string(),
                (true, true) => "strided=in+out".to_string(),
            }
        }
        Op::Conv2d(_) | Op::Sequential { .. } | Op::Linear { .. } => {
            use opsched_graph::fusion::{deferred_bias, depthwise_reads_sum};
            let marks: Vec<String> = [
                depthwise_reads_sum(g, op).then(|| "sum=read".to_string()),
                deferred_bias(g, op).map(|_| "bias=readers".to_string()),
                residual_of(g, op).map(|(_, act)| match act {
                    opsched_graph::Activation::None => "residual".to_string(),
                    act => format!("residual,act={act}"),
                }),
            ]
            .into_iter()
            .flatten()
            .collect();
            if marks.is_empty() {
                return None;
            }
            marks.join(",")
        }
        Op::Elementwise { .. } | Op::Affine => match opsched_graph::fusion::fused_activation(g, op)
        {
            Some(act) => format!("act={act}"),
            None => return None,
        },
        _ => return None,
    };
    Some(mark)
}

fn write_op(s: &mut String, op: &Op) {
    s.push_str(op.type_name());
    match op {
        Op::Input { shape } | Op::Constant { shape } => {
            s.push('(');
            write_shape(s, shape);
            s.push(')');
        }
        Op::Binary { kind } => {
            let _ = write!(s, "({})", lower(kind));
        }
        Op::Affine | Op::Where => {}
        Op::Expand { shape } => {
            s.push('(');
            write_shape(s, shape);
            s.push(')');
        }
        Op::Pad { begin, end, value } => {
            s.push_str("(b=");
            write_list(s, begin);
            s.push_str(",e=");
            write_list(s, end);
            let _ = write!(s, ",v={value:e})");
        }
        Op::LogSoftmax { axis } => {
            let _ = write!(s, "(axis={axis})");
        }
        Op::Resize(r) => {
            let _ = write!(s, "({r})");
        }
        Op::Embedding { rows, dim } => {
            let _ = write!(s, "(rows={rows},dim={dim})");
        }
        Op::Slice { axis, begin, end } => {
            let _ = write!(s, "(axis={axis},b={begin},e={end})");
        }
        Op::CumSum {
            axis,
            exclusive,
            reverse,
        } => {
            let _ = write!(s, "(axis={axis}");
            if *exclusive {
                s.push_str(",exclusive");
            }
            if *reverse {
                s.push_str(",reverse");
            }
            s.push(')');
        }
        Op::GatherElements { axis } => {
            let _ = write!(s, "(axis={axis})");
        }
        Op::Reduce {
            kind,
            begin,
            end,
            keep,
        } => {
            let _ = write!(s, "({},{begin}..{end},keep={keep})", lower(kind));
        }
        Op::Conv2d(c) => {
            let _ = write!(
                s,
                "(oc={},k={}x{},s={}x{},p={}x{},d={}x{},g={}",
                c.out_channels,
                c.kernel[0],
                c.kernel[1],
                c.stride[0],
                c.stride[1],
                c.padding[0],
                c.padding[1],
                c.dilation[0],
                c.dilation[1],
                c.groups
            );
            if let Some([b, r]) = c.padding_end {
                let _ = write!(s, ",pe={b}x{r}");
            }
            if c.bias {
                s.push_str(",bias");
            }
            if c.act != opsched_graph::Activation::None {
                let _ = write!(s, ",act={}", c.act);
            }
            s.push(')');
        }
        Op::Pool2d(p) => {
            let _ = write!(s, "({}", lower(p.kind));
            if !matches!(p.kind, PoolKind::GlobalAvg | PoolKind::GlobalMax) {
                let _ = write!(
                    s,
                    ",k={}x{},s={}x{},p={}x{}",
                    p.kernel[0], p.kernel[1], p.stride[0], p.stride[1], p.padding[0], p.padding[1]
                );
                if let Some([b, r]) = p.padding_end {
                    let _ = write!(s, ",pe={b}x{r}");
                }
                if p.ceil_mode {
                    s.push_str(",ceil");
                }
                if !p.count_include_pad {
                    s.push_str(",exclpad");
                }
            }
            s.push(')');
        }
        Op::Activation { act } => {
            let _ = write!(s, "({act})");
        }
        Op::Elementwise { kind } => {
            let _ = write!(s, "({})", lower(kind));
        }
        Op::Concat { axis } => {
            let _ = write!(s, "(axis={axis})");
        }
        Op::Identity => {}
        Op::Linear {
            out_features,
            bias,
            act,
        } => {
            let _ = write!(s, "(out={out_features}");
            if *bias {
                s.push_str(",bias");
            }
            if *act != opsched_graph::Activation::None {
                let _ = write!(s, ",act={act}");
            }
            s.push(')');
        }
        // The scale costs nothing (cuBLAS's alpha): products differing in it cost alike.
        Op::BatchMatmul { transpose_b, .. } => {
            if *transpose_b {
                s.push_str("(tb)");
            }
        }
        Op::Softmax { axis } => {
            let _ = write!(s, "(axis={axis})");
        }
        Op::LayerNorm { eps } => {
            let _ = write!(s, "(eps={eps:e})");
        }
        Op::Reshape { shape } => {
            s.push_str("(shape=");
            write_list(s, shape);
            s.push(')');
        }
        Op::Transpose { perm } => {
            s.push_str("(perm=");
            write_list(s, perm);
            s.push(')');
        }
        Op::Sequential { ops } => {
            s.push('{');
            for (i, inner) in ops.iter().enumerate() {
                if i > 0 {
                    s.push(';');
                }
                write_op(s, inner);
            }
            s.push('}');
        }
        Op::Abstract { time_ms, util } => {
            let _ = write!(s, "(t={time_ms:e},u={util:e})");
        }
        Op::Opaque { op_type, shape } => {
            let _ = write!(s, "({op_type},");
            write_shape(s, shape);
            s.push(')');
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use opsched_graph::{Conv2d, DType, GraphBuilder, Op, Pool2d, Term, Value};

    use super::*;

    fn conv_model(name: &str, batch: usize, stride: usize, prefix_pool: bool) -> (Graph, NodeId) {
        let mut b = GraphBuilder::new(name, DType::F32);
        let mut x = b.input("data", vec![batch, 64, 56, 56]);
        if prefix_pool {
            x = b.pool("some_pool", x, Pool2d::max(3, 1, 1));
        }
        let c = b.conv(
            &format!("{name}_conv"),
            x,
            Conv2d::new(64, 3).stride(stride).bias(true).relu(),
        );
        (b.finish().unwrap(), c)
    }

    #[test]
    fn a_layout_marks_a_measurement_key_and_nothing_else() {
        let (g, c) = conv_model("m", 1, 1, false);
        let sig = op_signature(&g, c);
        assert_eq!(measured_in(&sig, Layout::Nchw), sig);
        assert_eq!(measured_in(&sig, Layout::Nhwc), format!("{sig}@nhwc"));
        let stage = measured_in(&stage_signature(&g, &[vec![c]]), Layout::Nhwc);
        assert!(
            is_stage_signature(&stage) && !is_stage_signature(&measured_in(&sig, Layout::Nhwc))
        );
        assert_eq!(Layout::Nhwc.other(), Layout::Nchw);
        assert_eq!(
            (Layout::Nchw.to_string(), Layout::Nhwc.to_string()),
            ("nchw".into(), "nhwc".into())
        );
    }

    /// A merged group's key is the signature of its convolution alone on the same input.
    #[test]
    fn a_merged_group_is_keyed_as_its_one_convolution() {
        let mut b = GraphBuilder::new("m", DType::F32);
        let x = b.input("data", vec![2, 16, 28, 28]);
        let c1 = b.conv("c1", x, Conv2d::new(8, 1).bias(true).relu());
        let c3 = b.conv("c3", x, Conv2d::new(24, 3).bias(true).relu());
        b.concat("cat", &[c1, c3]);
        let g = b.finish().unwrap();
        let merged = merged_signature(&g, &[c1, c3]).unwrap();
        let mut b = GraphBuilder::new("alone", DType::F32);
        let x = b.input("x", vec![2, 16, 28, 28]);
        let one = b.conv("one", x, Conv2d::new(32, 3).bias(true).relu());
        let alone = b.finish().unwrap();
        assert_eq!(merged, op_signature(&alone, one));
        assert!(
            merged_signature(&g, &[c1]).is_none(),
            "one operator merges nothing"
        );
    }

    #[test]
    fn conv_signature_format() {
        let (g, c) = conv_model("a", 1, 1, false);
        assert_eq!(
            op_signature(&g, c),
            "conv2d(oc=64,k=3x3,s=1x1,p=1x1,d=1x1,g=1,bias,act=relu)[1x64x56x56]f32"
        );
        assert_eq!(batch_of(&g, c), 1);
    }

    #[test]
    fn same_conv_elsewhere_same_signature() {
        let (g1, c1) = conv_model("first", 1, 1, false);
        let (g2, c2) = conv_model("second", 1, 1, true);
        assert_ne!(c1, c2);
        assert_eq!(op_signature(&g1, c1), op_signature(&g2, c2));
    }

    #[test]
    fn stride_and_batch_change_signature() {
        let (g1, c1) = conv_model("a", 1, 1, false);
        let (g2, c2) = conv_model("a", 1, 2, false);
        let (g3, c3) = conv_model("a", 8, 1, false);
        assert_ne!(op_signature(&g1, c1), op_signature(&g2, c2));
        assert_ne!(op_signature(&g1, c1), op_signature(&g3, c3));
        assert_eq!(batch_of(&g3, c3), 8);
    }

    #[test]
    fn sequential_sliced_and_summed_inputs() {
        let mut b = GraphBuilder::new("m", DType::F16);
        let x = b.input("x", vec![2, 16, 8, 8]);
        let y = b.input("y", vec![2, 16, 8, 8]);
        let s = b.sequential(
            "sep",
            x,
            vec![
                Op::Activation {
                    act: opsched_graph::Activation::Relu,
                },
                Op::Conv2d(Conv2d::new(16, 3).groups(16)),
                Op::Conv2d(Conv2d::new(32, 1)),
            ],
        );
        let terms: Vec<Term> = vec![
            vec![Value::whole(x), Value::whole(y)],
            vec![Value::slice(s, 0, 8)],
        ];
        let c = b.node("c", Op::Conv2d(Conv2d::new(4, 1)), terms);
        let g = b.finish().unwrap();
        assert_eq!(
            op_signature(&g, s),
            "sequential{activation(relu);conv2d(oc=16,k=3x3,s=1x1,p=1x1,d=1x1,g=16);\
             conv2d(oc=32,k=1x1,s=1x1,p=0x0,d=1x1,g=1)}[2x16x8x8]f16"
        );
        assert_eq!(
            op_signature(&g, c),
            "conv2d(oc=4,k=1x1,s=1x1,p=0x0,d=1x1,g=1)[2x16x8x8(sum2),2x8x8x8(slice)]f16"
        );
        assert_eq!(batch_of(&g, c), 2);
    }

    #[test]
    fn a_bias_left_to_the_readers_and_a_sum_read_by_a_depthwise_kernel_say_so() {
        let mut b = GraphBuilder::new("m", DType::F32);
        let x = b.input("x", vec![1, 8, 4, 4]);
        let c1 = b.conv("c1", x, Conv2d::new(8, 1).bias(true));
        let c2 = b.conv("c2", x, Conv2d::new(8, 1).bias(true));
        let sum = b.add("sum", &[c1, c2]);
        // A depthwise kernel that reads the values of its input's sum says so too.
        let relu = Op::Activation {
            act: opsched_graph::Activation::Relu,
        };
        let dw = Op::Conv2d(Conv2d::new(8, 3).groups(8));
        let both = vec![Value::whole(c1), Value::whole(c2)];
        let sep = b.node(
            "sep",
            Op::Sequential {
                ops: vec![relu, dw],
            },
            vec![both],
        );
        // By default the depthwise kernel does not read the sum (`Fusions::DEFAULT`).
        let g = b.finish().unwrap();
        assert_eq!(
            op_signature(&g, sep),
            "sequential{activation(relu);conv2d(oc=8,k=3x3,s=1x1,p=1x1,d=1x1,g=8)}\
             [1x8x4x4(sum2)]f32"
        );
        let g = g.with_fusions(opsched_graph::fusion::Fusions::ALL);
        assert_eq!(
            op_signature(&g, c1),
            "conv2d(oc=8,k=1x1,s=1x1,p=0x0,d=1x1,g=1,bias,bias=readers)[1x8x4x4]f32"
        );
        assert_eq!(
            op_signature(&g, sep),
            "sequential{activation(relu);conv2d(oc=8,k=3x3,s=1x1,p=1x1,d=1x1,g=8)}(sum=read)\
             [1x8x4x4(sum2)]f32"
        );
        // An output of the graph keeps its bias.
        let out = |n: NodeId| opsched_graph::GraphOutput {
            name: g.node(n).name.clone(),
            value: Value::whole(n),
        };
        let outputs = vec![out(c1), out(sum), out(sep)];
        let g = g.with_outputs(outputs).unwrap();
        assert_eq!(
            op_signature(&g, c1),
            "conv2d(oc=8,k=1x1,s=1x1,p=0x0,d=1x1,g=1,bias)[1x8x4x4]f32"
        );
    }

    #[test]
    fn a_reshape_that_is_a_view_says_so() {
        let mut b = GraphBuilder::new("m", DType::F32);
        let x = b.input("x", vec![2, 8, 4, 4]);
        let s = b.add("s", &[x, x]);
        let flat = b.op("flat", Op::Reshape { shape: vec![2, -1] }, &[s]);
        let same = b.op("same", Op::Identity, &[s]);
        let copied = b.op("copied", Op::Identity, &[x]);
        let g = b.finish().unwrap();
        assert_eq!(
            op_signature(&g, flat),
            "reshape(shape=[2,-1],view)[2x8x4x4]f32"
        );
        // The second reshape of `s` copies it, as does one of a graph input.
        assert_eq!(op_signature(&g, same), "identity[2x8x4x4]f32");
        assert_eq!(op_signature(&g, copied), "identity[2x8x4x4]f32");
        let mut b = GraphBuilder::new("m", DType::F32);
        let x = b.input("x", vec![2, 8, 4, 4]);
        let s = b.add("s", &[x, x]);
        let only = b.op("only", Op::Identity, &[s]);
        let g = b.finish().unwrap();
        assert_eq!(op_signature(&g, only), "identity(view)[2x8x4x4]f32");
    }

    #[test]
    fn products_through_head_transposes_say_so() {
        let heads = || Op::Transpose {
            perm: vec![0, 2, 1, 3],
        };
        let mut b = GraphBuilder::new("m", DType::F32);
        let q = b.input("q", vec![1, 5, 3, 4]);
        let qt = b.op("qt", heads(), &[q]);
        let s = b.op("s", Op::batch_matmul(true), &[qt, qt]);
        let c = b.op("c", Op::batch_matmul(false), &[s, qt]);
        let ct = b.op("ct", heads(), &[c]);
        let g = b.finish().unwrap();
        let sig = |n| op_signature(&g, n);
        assert_eq!(sig(s), "batch_matmul(tb,strided=in)[1x3x5x4,1x3x5x4]f32");
        assert_eq!(sig(c), "batch_matmul(strided=in+out)[1x3x5x5,1x3x5x4]f32");
        assert_eq!(sig(qt), "transpose(perm=[0,2,1,3],fused)[1x5x3x4]f32");
        assert_eq!(sig(ct), "transpose(perm=[0,2,1,3],fused)[1x3x5x4]f32");
    }

    #[test]
    fn a_fused_activation_is_part_of_both_keys() {
        let mut b = GraphBuilder::new("m", DType::F32);
        let x = b.input("x", vec![1, 8, 4, 4]);
        let sum = b.add("sum", &[x, x]);
        let fused = b.act("fused", sum, opsched_graph::Activation::Relu);
        let alone = b.act("alone", x, opsched_graph::Activation::Relu);
        let g = b.finish().unwrap();
        assert_eq!(
            op_signature(&g, sum),
            "elementwise(add,act=relu)[1x8x4x4,1x8x4x4]f32"
        );
        assert_eq!(
            op_signature(&g, fused),
            "activation(relu,fused)[1x8x4x4]f32"
        );
        assert_eq!(op_signature(&g, alone), "activation(relu)[1x8x4x4]f32");
    }

    #[test]
    fn a_pooling_an_add_kernel_computes_is_part_of_both_keys() {
        let mut b = GraphBuilder::new("m", DType::F32);
        let x = b.input("x", vec![1, 8, 8, 8]);
        let p = b.pool("p", x, Pool2d::avg(3, 2, 1));
        let y = b.conv("y", x, Conv2d::new(8, 3).stride(2));
        let sum = b.node(
            "sum",
            Op::Identity,
            vec![vec![Value::whole(p), Value::whole(y)]],
        );
        let g = b.finish().unwrap();
        assert_eq!(
            op_signature(&g, p),
            "pool2d(avg,k=3x3,s=2x2,p=1x1,fused)[1x8x8x8]f32"
        );
        assert_eq!(
            op_signature(&g, sum),
            "identity[1x8x4x4(sum2)(pooled1:pool2d(avg,k=3x3,s=2x2,p=1x1)[1x8x8x8])]f32"
        );
        let g = g.with_fusions(
            opsched_graph::fusion::Fusions::ALL
                .without("pool-into-sum")
                .unwrap(),
        );
        assert_eq!(
            op_signature(&g, p),
            "pool2d(avg,k=3x3,s=2x2,p=1x1)[1x8x8x8]f32"
        );
        assert_eq!(op_signature(&g, sum), "identity[1x8x4x4(sum2)]f32");
    }

    #[test]
    fn stage_signature_ignores_group_order() {
        let mut b = GraphBuilder::new("m", DType::F32);
        let x = b.input("x", vec![1, 8, 8, 8]);
        let a = b.conv("a", x, Conv2d::new(8, 3));
        let p = b.pool("p", x, Pool2d::max(3, 1, 1));
        let q = b.conv("q", p, Conv2d::new(8, 1));
        let g = b.finish().unwrap();
        let s1 = stage_signature(&g, &[vec![a], vec![p, q]]);
        let s2 = stage_signature(&g, &[vec![p, q], vec![a], vec![]]);
        assert_eq!(s1, s2);
        assert!(is_stage_signature(&s1));
        assert_ne!(s1, stage_signature(&g, &[vec![a], vec![q, p]]));
    }
}
