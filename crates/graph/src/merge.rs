//! IOS's operator merge rule: several convolutions reading the same input become one wider
//! convolution whose output channels are the components' output channels side by side (the
//! consumers then read channel slices of it).
//!
//! The rule (IOS, `docs/reference-notes.md`): at least two operators, every one a plain
//! [`Op::Conv2d`] (a convolution inside a `sequential` operator does not count), all reading
//! identical inputs (the same terms with the same values and slices), with the same stride,
//! dilation, activation and bias flag, `groups = 1`, and the same output spatial size. Kernels may
//! differ: the merged kernel is the largest in each dimension, and a smaller kernel is
//! zero-padded around its centre, which needs `(kmax - k)` even in each dimension. Zero-padding
//! a kernel by `e = (kmax - k) / 2` taps on each side (times the dilation) moves its window by
//! `dilation * e` input pixels, so the component must have used `padding + dilation * e` as the
//! merged padding; the rule checks that this is the same for every component (it is the padding
//! of the component with the largest kernel), which also makes the output sizes agree.
//!
//! At batch > 1 a component's output is one run per image of the merged output (a strided
//! view), which only some kernels read in place ([`read_in_place`]); the lowering runs a
//! merged stage as one convolution there only where every reader of every component does.
//!
//! The same merge applies to linear layers (a Transformer's query, key and value projections):
//! at least two [`Op::Linear`] reading identical inputs with the same bias flag and activation
//! become one linear layer whose output features are theirs side by side ([`merged_linear`]).
//! A component's output is then one run per row of the merged output, which the GPU runtime
//! reads in place where each reader is a reshape that splits the last axis into heads, read
//! through head transposes by batched products ([`rows_read_in_place`]).

use crate::graph::{Graph, NodeId};
use crate::op::{concat_shapes, Conv2d, Op};

/// Whether convolution `c` with `in_channels` input channels reads a strided view of its
/// input in place: our depthwise kernel takes its image or pixel stride; cuDNN takes the
/// strides in the input's descriptor, with padding alike before and after (an explicit pad
/// reads a dense input).
pub fn conv_reads_strided(c: &Conv2d, in_channels: usize) -> bool {
    let (before, after) = c.pads();
    crate::fusion::is_depthwise(c, in_channels) || before == after
}

/// Whether every reader of `p`'s output reads it in place when it is a strided view: one run
/// per image (NCHW at batch > 1) or one run of channels per pixel (channels last) of a merged
/// convolution's output or of a concatenation. Where `p` is summed with other whole values,
/// the add kernel reads the runs (any reader; SqueezeNet's bypass, summed with its fire
/// module's output); where it is a term of its own, the reader is a concatenation (whose copy
/// reads the runs, or which `p` writes in place), an element-wise operator (its kernel reads
/// the runs; not a residual sum a convolution computes, which reads `p` through a copy), an
/// activation (run by the element-wise kernel), a pool (its kernels take the image or pixel
/// stride), a convolution that reads a strided input ([`conv_reads_strided`]), or a chain of
/// operators whose first reads it so (NASNet's relu + separable convolutions).
pub fn read_in_place(g: &Graph, p: NodeId) -> bool {
    g.succs(p).all(|c| {
        let node = g.node(c);
        let mut alone = false;
        for t in node.inputs.iter().filter(|t| t.iter().any(|v| v.node == p)) {
            match t.len() {
                1 => alone = true,
                // A sum with a channel slice is copied value by value.
                _ if t.iter().any(|v| v.channels.is_some()) => return false,
                _ => {}
            }
        }
        let channels = || g.input_shapes(c).first().and_then(|s| s.get(1).copied());
        let reads = |op: &Op| match op {
            Op::Conv2d(conv) => channels().is_some_and(|ch| conv_reads_strided(conv, ch)),
            Op::Activation { .. } | Op::Pool2d(_) => true,
            _ => false,
        };
        !alone
            || match &node.op {
                Op::Concat { .. } | Op::Identity => true,
                Op::Elementwise { .. } => {
                    crate::fusion::residual_source(g, c).is_none_or(|(_, z)| z != p)
                }
                Op::Sequential { ops } => ops.first().is_some_and(reads),
                op => reads(op),
            }
    })
}

/// Whether every reader of linear layer `p`'s output reads it in place when it is one run per
/// row of a merged product's output: `p` is not an output of the graph, and each reader is a
/// reshape of the whole value that splits its last axis in two (into heads), not an output of
/// the graph either, whose readers are all head transposes that batched products read through
/// ([`crate::fusion::transposed_operand`]): the products then read the rows with the merged
/// output's row stride.
pub fn rows_read_in_place(g: &Graph, p: NodeId) -> bool {
    let is_output = |n: NodeId| crate::fusion::is_output(g, n);
    let shape = &g.node(p).shape;
    let mut readers = g.succs(p).peekable();
    if is_output(p) || readers.peek().is_none() {
        return false;
    }
    readers.all(|r| {
        let node = g.node(r);
        let whole = matches!(node.inputs.as_slice(), [t] if matches!(t.as_slice(),
            [v] if v.node == p && v.channels.is_none()));
        let splits_last = match (shape.split_last(), node.shape.len().checked_sub(2)) {
            (Some((&last, lead)), Some(k)) => {
                node.shape[..k] == *lead
                    && node.shape[k].checked_mul(node.shape[k + 1]) == Some(last)
            }
            _ => false,
        };
        let mut transposes = g.succs(r).peekable();
        matches!(node.op, Op::Reshape { .. })
            && whole
            && splits_last
            && !is_output(r)
            && transposes.peek().is_some()
            && transposes.all(|t| crate::fusion::transposed_operand(g, t) == Some(r))
    })
}

/// Whether `ops` can run as one merged convolution or linear layer (see the module docs).
pub fn mergeable(g: &Graph, ops: &[NodeId]) -> bool {
    merged_op(g, ops).is_some()
}

/// Whether the GPU runtime runs mergeable `ops` as one kernel, as far as the graph decides it
/// (channels-last storage, transfers and residual sums aside): where each member is one run
/// of the merged output (convolutions at batch 1, linear layers over one row), and else where
/// every member, one run per image (per row) of the merged output, is read in place by every
/// reader ([`read_in_place`], [`rows_read_in_place`]); else it runs them one after another.
pub fn runs_as_one(g: &Graph, ops: &[NodeId]) -> bool {
    let Some((op, _)) = merged_op(g, ops) else {
        return false;
    };
    let shape = |o: NodeId| g.node(o).shape.clone();
    match op {
        Op::Linear { .. } => {
            let rows: usize = ops
                .first()
                .map(|&o| shape(o))
                .and_then(|s| s.split_last().map(|(_, lead)| lead.iter().product()))
                .unwrap_or(1);
            rows <= 1 || ops.iter().all(|&o| rows_read_in_place(g, o))
        }
        _ => {
            let batch = ops
                .first()
                .and_then(|&o| shape(o).first().copied())
                .unwrap_or(1);
            batch <= 1 || ops.iter().all(|&o| read_in_place(g, o))
        }
    }
}

/// The one operator replacing `ops` and the shape of its input: a merged convolution
/// ([`merged_conv`]) or linear layer ([`merged_linear`]); `None` if `ops` cannot be merged.
pub fn merged_op(g: &Graph, ops: &[NodeId]) -> Option<(Op, Vec<usize>)> {
    if let Some((conv, input)) = merged_conv(g, ops) {
        return Some((Op::Conv2d(conv), input));
    }
    merged_linear(g, ops)
}

/// The merged linear layer replacing `ops` (an [`Op::Linear`] with their output features side
/// by side, in their order) and the shape of its input, or `None` if `ops` are not at least two
/// distinct linear layers reading one identical input with the same bias flag and activation.
pub fn merged_linear(g: &Graph, ops: &[NodeId]) -> Option<(Op, Vec<usize>)> {
    if ops.len() < 2 {
        return None;
    }
    let nodes = g.nodes();
    let first = nodes.get(ops[0].index())?;
    let Op::Linear { bias, act, .. } = first.op else {
        return None;
    };
    let mut out_features = 0usize;
    for (i, &id) in ops.iter().enumerate() {
        if ops[..i].contains(&id) {
            return None;
        }
        let node = nodes.get(id.index())?;
        match node.op {
            Op::Linear {
                out_features: f,
                bias: b,
                act: a,
            } if b == bias && a == act && node.inputs == first.inputs => {
                out_features = out_features.checked_add(f)?;
            }
            _ => return None,
        }
    }
    let [input] = g.input_shapes(ops[0]).try_into().ok()?;
    Some((
        Op::Linear {
            out_features,
            bias,
            act,
        },
        input,
    ))
}

/// The merged convolution replacing `ops` and the shape of its input (the components' common
/// input, terms concatenated along channels), or `None` if `ops` cannot be merged.
pub fn merged_conv(g: &Graph, ops: &[NodeId]) -> Option<(Conv2d, Vec<usize>)> {
    if ops.len() < 2 {
        return None;
    }
    let nodes = g.nodes();
    let mut convs = Vec::with_capacity(ops.len());
    for (i, &id) in ops.iter().enumerate() {
        if ops[..i].contains(&id) {
            return None;
        }
        let node = nodes.get(id.index())?;
        let Op::Conv2d(c) = &node.op else {
            return None;
        };
        convs.push((node, c));
    }
    let (first, c0) = *convs.first()?;
    let out_hw = first.shape.get(2..4)?;
    let mut kmax = [0usize; 2];
    let mut out_channels = 0usize;
    for &(node, c) in &convs {
        let same = node.inputs == first.inputs
            && c.padding_end.is_none()
            && c.stride == c0.stride
            && c.dilation == c0.dilation
            && c.act == c0.act
            && c.bias == c0.bias
            && c.groups == 1
            && node.shape.get(2..4) == Some(out_hw);
        if !same {
            return None;
        }
        for (k, &ck) in kmax.iter_mut().zip(&c.kernel) {
            *k = (*k).max(ck);
        }
        out_channels = out_channels.checked_add(c.out_channels)?;
    }
    // Padding of the merged conv: each component's padding plus the zero taps added on each side.
    let mut padding = [0usize; 2];
    for (i, &(_, c)) in convs.iter().enumerate() {
        for d in 0..2 {
            let extra = kmax[d] - c.kernel[d];
            if extra % 2 != 0 {
                return None;
            }
            let p = c.padding[d] + c.dilation[d] * (extra / 2);
            if i == 0 {
                padding[d] = p;
            } else if padding[d] != p {
                return None;
            }
        }
    }
    let terms = g.input_shapes(ops[0]);
    let input = match terms.as_slice() {
        [single] => single.clone(),
        _ => concat_shapes(&terms, 1).ok()?,
    };
    let merged = Conv2d {
        out_channels,
        kernel: kmax,
        stride: c0.stride,
        padding,
        padding_end: None,
        dilation: c0.dilation,
        groups: 1,
        bias: c0.bias,
        act: c0.act,
    };
    // The merged conv must produce the components' spatial size.
    let out = Op::Conv2d(merged.clone())
        .infer_shape(std::slice::from_ref(&input))
        .ok()?;
    if out.get(2..4) != Some(out_hw) {
        return None;
    }
    Some((merged, input))
}
