//! Fused activations: which standalone activations run inside the kernel of the element-wise
//! operator they read, so that they launch nothing and move no memory of their own (ResNet's
//! `add` + `relu`: one kernel computes `relu(a + b)`).
//!
//! The one rule that the lowering (`opsched_gpu::program`, which also requires both operators
//! on one GPU with no transfer between them) and the launch count of the cost model
//! (`opsched_cost::launches`) share. An `activation` operator `a` is fused into its producer
//! `e` when
//! - `a` reads one term, the whole output of `e` (not a channel slice, not a sum);
//! - `e` is an `elementwise` operator whose terms all have its output shape (no broadcasting,
//!   which is another kernel);
//! - `a` is `e`'s only consumer, and `e` is not an output of the graph: nobody but `a` ever
//!   sees `e`'s own value, which the fused kernel never writes.
//!
//! Both stay operators of the graph (a schedule may put them on different streams): `e`'s
//! kernel writes `act(e)` into `a`'s output, and `a` waits for `e` as before, with no work of
//! its own.
//!
//! A convolution or a linear layer also computes the residual sum it alone feeds
//! ([`residual_source`], ResNet's `conv + identity`, a Transformer's `linear + x`), with the
//! activation fused into that sum ([`residual_of`]).
//!
//! A linear layer's bias, residual and activation run inside its matrix product (cuBLASLt's
//! epilogue) where the activation is none or relu ([`gemm_epilogue`]).
//!
//! A head transpose (`[n, a, b, d] -> [n, b, a, d]`) next to a batched matrix product
//! runs nothing: the product reads the untransposed tensor with strides
//! ([`transposed_operand`]), or writes its result transposed ([`transposed_output`]) — a
//! Transformer's head split before the attention products and its merge after them.
//!
//! Inside a `sequential` operator, an activation followed by a depthwise convolution
//! ([`is_depthwise`]: NASNet's and RandWire's relu + separable convolution) is applied by the
//! convolution's kernel to every input it reads ([`pre_activations`]); a depthwise
//! convolution's kernel also adds its bias and applies its own activation.

use crate::{Conv2d, Graph, NodeId, Op, Shape};

/// Whether a matrix product's own epilogue (cuBLASLt's) adds its bias and residual and then
/// applies `act`: none or relu. Other activations (GELU among them: cuBLASLt's approximates
/// it) run in a kernel after the product.
pub fn gemm_epilogue(act: crate::Activation) -> bool {
    matches!(act, crate::Activation::None | crate::Activation::Relu)
}

/// The value a head transpose `t` reads: a `transpose` with permutation `[0, 2, 1, 3]` of a
/// 4-D tensor, reading one whole value. For each of its `n * b` matrices `[a, d]`, the
/// untransposed tensor `[n, a, b, d]` is that matrix with a row stride of `b * d` elements,
/// the `b` heads of a sequence `d` elements apart and sequences `a * b * d` apart: what a
/// batched product reads and writes with strides.
fn head_transpose_of(g: &Graph, t: NodeId) -> Option<NodeId> {
    let node = g.node(t);
    let Op::Transpose { perm } = &node.op else {
        return None;
    };
    let [term] = node.inputs.as_slice() else {
        return None;
    };
    match (term.as_slice(), node.shape.as_slice()) {
        ([v], [_, _, _, _]) if perm.as_slice() == [0, 2, 1, 3] && v.channels.is_none() => {
            Some(v.node)
        }
        _ => None,
    }
}

pub(crate) fn is_output(g: &Graph, n: NodeId) -> bool {
    g.outputs().iter().any(|o| o.value.node == n)
}

/// The head transpose (a `transpose` `[n, a, b, d] -> [n, b, a, d]` of one whole value) into
/// which batch matmul `m` writes its result directly: `m`'s only consumer, where `m` is not an
/// output of the graph (its own value is never written).
pub fn transposed_output(g: &Graph, m: NodeId) -> Option<NodeId> {
    if !matches!(g.node(m).op, Op::BatchMatmul { .. }) || is_output(g, m) {
        return None;
    }
    let mut succs = g.succs(m);
    let t = succs.next()?;
    let only = succs.all(|s| s == t);
    (only && head_transpose_of(g, t) == Some(m)).then_some(t)
}

/// The value head transpose `t` (a `transpose` `[n, a, b, d] -> [n, b, a, d]` of one whole
/// value) reads, when every consumer of `t` is a batch matmul reading it whole (they then read
/// that value in place, with strides, and `t` runs nothing), `t` is not an output of the
/// graph, and no product writes `t` already ([`transposed_output`]).
pub fn transposed_operand(g: &Graph, t: NodeId) -> Option<NodeId> {
    let s = head_transpose_of(g, t)?;
    if transposed_output(g, s) == Some(t) || is_output(g, t) {
        return None;
    }
    let mut consumers = g.succs(t).peekable();
    consumers.peek()?;
    let all_products = consumers.all(|c| {
        let node = g.node(c);
        matches!(node.op, Op::BatchMatmul { .. })
            && node.inputs.iter().all(|term| {
                !term.iter().any(|v| v.node == t)
                    || matches!(term.as_slice(), [v] if v.channels.is_none())
            })
    });
    all_products.then_some(s)
}

/// Whether head transpose `t` runs nothing: a product reads through it or writes it.
pub fn transpose_fused(g: &Graph, t: NodeId) -> bool {
    transposed_operand(g, t).is_some()
        || head_transpose_of(g, t).is_some_and(|m| transposed_output(g, m) == Some(t))
}

/// A depthwise convolution of `in_channels` channels: one group per channel, one output
/// channel per group (the GPU runs it as one kernel of ours, bias and activations included).
pub fn is_depthwise(c: &Conv2d, in_channels: usize) -> bool {
    depthwise(c.groups, c.out_channels, in_channels)
}

/// [`is_depthwise`] for a convolution known by its groups and channels (a GPU step).
pub fn depthwise(groups: usize, out_channels: usize, in_channels: usize) -> bool {
    groups > 1 && groups == in_channels && out_channels == in_channels
}

/// Per inner operator of a `sequential` operator whose first operator reads `input` (the
/// shape of its single input): whether it is an activation that the depthwise convolution
/// after it applies to its inputs (and so runs no kernel of its own). Stops at the first
/// shape that does not infer (the graph reports that error).
pub fn pre_activations(ops: &[Op], input: &Shape) -> Vec<bool> {
    let mut fused = vec![false; ops.len()];
    let mut shape = input.clone();
    for (i, op) in ops.iter().enumerate() {
        if let (Op::Activation { .. }, Some(Op::Conv2d(c))) = (op, ops.get(i + 1)) {
            fused[i] = shape.len() == 4 && is_depthwise(c, shape[1]);
        }
        match op.infer_shape(std::slice::from_ref(&shape)) {
            Ok(s) => shape = s,
            Err(_) => break,
        }
    }
    fused
}

/// The element-wise operator whose kernel also applies activation `a`, when the rules of the
/// module hold.
pub fn fused_source(g: &Graph, a: NodeId) -> Option<NodeId> {
    let node = g.node(a);
    let Op::Activation { .. } = node.op else {
        return None;
    };
    let [term] = node.inputs.as_slice() else {
        return None;
    };
    let [v] = term.as_slice() else {
        return None;
    };
    let e = v.node;
    let producer = g.node(e);
    if v.channels.is_some() || !matches!(producer.op, Op::Elementwise { .. }) {
        return None;
    }
    let same_shapes = g
        .input_shapes(e)
        .iter()
        .all(|s| s.as_slice() == producer.shape.as_slice());
    let only_consumer = g.succs(e).all(|s| s == a);
    (same_shapes && only_consumer && !is_output(g, e)).then_some(e)
}

/// The convolution or linear layer whose kernels also compute element-wise add `e` (ResNet's
/// residual sum: cuDNN's fused call computes `act(conv(x) + z + bias)`; a Transformer's: the
/// linear layer's bias kernel adds `z` too), with the other term `z`, when
/// - `e` adds exactly two terms, each one whole value of `e`'s shape;
/// - one is a convolution (not depthwise) or a linear layer without an activation, whose only
///   consumer is `e` and which is not an output of the graph;
/// - the other, `z`, is a graph input or constant, or an ancestor of the convolution, so every
///   schedule has it ready when the convolution runs (ResNet's identity branch; a downsampling
///   branch beside the convolution is not).
///
/// `e` then runs no kernel of its own; an activation fused into `e` ([`fused_source`]) is the
/// producer's activation.
pub fn residual_source(g: &Graph, e: NodeId) -> Option<(NodeId, NodeId)> {
    let node = g.node(e);
    if !matches!(
        node.op,
        Op::Elementwise {
            kind: crate::ElementwiseKind::Add
        }
    ) {
        return None;
    }
    let whole: Vec<NodeId> = node
        .inputs
        .iter()
        .filter_map(|t| match t.as_slice() {
            [v] if v.channels.is_none() && g.node(v.node).shape == node.shape => Some(v.node),
            _ => None,
        })
        .collect();
    let [a, b] = whole.as_slice() else {
        return None;
    };
    if node.inputs.len() != 2 || a == b {
        return None;
    }
    let conv_of = |c: NodeId, z: NodeId| {
        let kernel_takes_it = match &g.node(c).op {
            Op::Conv2d(conv) => {
                let in_channels = g.input_shapes(c).iter().filter_map(|s| s.get(1)).sum();
                conv.act == crate::Activation::None && !is_depthwise(conv, in_channels)
            }
            Op::Linear { act, .. } => *act == crate::Activation::None,
            _ => false,
        };
        let usable = kernel_takes_it
            && g.succs(c).all(|s| s == e)
            && !is_output(g, c)
            && (g.node(z).op.is_input() || is_ancestor(g, z, c));
        usable.then_some((c, z))
    };
    conv_of(*a, *b).or_else(|| conv_of(*b, *a))
}

/// The sum that convolution or linear layer `c` computes ([`residual_source`]) and the
/// activation it then
/// applies: the one fused into the sum ([`fused_source`]), else none.
pub fn residual_of(g: &Graph, c: NodeId) -> Option<(NodeId, crate::Activation)> {
    let e = g.succs(c).next()?;
    if residual_source(g, e)?.0 != c {
        return None;
    }
    Some((e, fused_activation(g, e).unwrap_or_default()))
}

/// The activation whose kernel element-wise operator `e` runs ([`fused_source`]).
pub fn fused_activation(g: &Graph, e: NodeId) -> Option<crate::Activation> {
    g.succs(e)
        .find(|&a| fused_source(g, a) == Some(e))
        .and_then(|a| match g.node(a).op {
            Op::Activation { act } => Some(act),
            _ => None,
        })
}

/// [`residual_source`] for every node.
pub fn residual_sources(g: &Graph) -> Vec<Option<(NodeId, NodeId)>> {
    (0..g.len())
        .map(|i| residual_source(g, NodeId(i as u32)))
        .collect()
}

/// Whether `anc` reaches `node` along the graph's edges. The search walks back from `node` only
/// through nodes after `anc` in topological order, so a residual a few operators back costs a
/// few steps, not the graph.
fn is_ancestor(g: &Graph, anc: NodeId, node: NodeId) -> bool {
    let floor = g.topo_position(anc);
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![node];
    while let Some(n) = stack.pop() {
        for p in g.preds(n) {
            if p == anc {
                return true;
            }
            if g.topo_position(p) > floor && seen.insert(p) {
                stack.push(p);
            }
        }
    }
    false
}

/// [`fused_source`] for every node.
pub fn fused_sources(g: &Graph) -> Vec<Option<NodeId>> {
    (0..g.len())
        .map(|i| fused_source(g, NodeId(i as u32)))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{Activation, Conv2d, DType, GraphBuilder, GraphOutput, Value};

    #[test]
    fn products_take_the_head_transposes_next_to_them() {
        for batch in [1usize, 2] {
            let heads = || Op::Transpose {
                perm: vec![0, 2, 1, 3],
            };
            let mut b = GraphBuilder::new("heads", DType::F32);
            let q = b.input("q", vec![batch, 5, 3, 4]);
            let k = b.input("k", vec![batch, 5, 3, 4]);
            let qt = b.op("qt", heads(), &[q]);
            let kt = b.op("kt", heads(), &[k]);
            let s = b.op("s", Op::BatchMatmul { transpose_b: true }, &[qt, kt]);
            let c = b.op("c", Op::BatchMatmul { transpose_b: false }, &[s, qt]);
            let ct = b.op("ct", heads(), &[c]);
            // A transpose something else reads too runs; so does one of another permutation.
            let kept = b.op("kept", heads(), &[k]);
            let _relu = b.act("relu", kept, Activation::Relu);
            let s2 = b.op("s2", Op::BatchMatmul { transpose_b: true }, &[kept, kept]);
            let other = b.op(
                "other",
                Op::Transpose {
                    perm: vec![0, 1, 3, 2],
                },
                &[s2],
            );
            let g = b.finish().unwrap();
            assert_eq!(transposed_operand(&g, qt), Some(q));
            assert_eq!(transposed_operand(&g, kt), Some(k));
            assert_eq!(transposed_output(&g, c), Some(ct));
            assert_eq!(
                transposed_operand(&g, ct),
                None,
                "written by c, not read through"
            );
            assert!(transpose_fused(&g, ct) && transpose_fused(&g, qt));
            assert_eq!(transposed_operand(&g, kept), None);
            assert_eq!(transposed_output(&g, s2), None);
            assert!(!transpose_fused(&g, other) && !transpose_fused(&g, kept));
            assert_eq!(
                transposed_output(&g, s),
                None,
                "s feeds a product, not a transpose"
            );
            // A product whose value is an output keeps it.
            let outputs = [c, ct]
                .iter()
                .map(|&n| GraphOutput {
                    name: format!("o{}", n.0),
                    value: Value::whole(n),
                })
                .collect();
            let g = g.with_outputs(outputs).unwrap();
            assert_eq!(transposed_output(&g, c), None);
            assert!(!transpose_fused(&g, ct));
        }
    }

    #[test]
    fn ancestry_agrees_with_a_path_search_on_random_graphs() {
        for seed in 0..6 {
            let g = crate::random::layered_dag(&crate::random::LayeredDagParams {
                ops: 40,
                layers: 6,
                edges: 70,
                seed,
                ..Default::default()
            })
            .unwrap();
            let ids = || (0..g.len() as u32).map(NodeId);
            for a in ids() {
                for n in ids() {
                    let path = a != n
                        && petgraph::algo::has_path_connecting(
                            g.dag(),
                            petgraph::graph::NodeIndex::new(a.index()),
                            petgraph::graph::NodeIndex::new(n.index()),
                            None,
                        );
                    assert_eq!(is_ancestor(&g, a, n), path, "seed {seed}: {a:?} -> {n:?}");
                }
            }
        }
    }

    #[test]
    fn fuses_a_sole_consumer_without_broadcast() {
        let mut b = GraphBuilder::new("fuse", DType::F32);
        let x = b.input("x", vec![1, 4, 4, 4]);
        let c = b.conv("c", x, Conv2d::new(4, 1));
        let add = b.add("add", &[c, x]);
        let relu = b.act("relu", add, Activation::Relu);
        // Read by two activations: its value is needed twice, nothing fuses.
        let mul = b.mul("mul", &[relu, x]);
        let s1 = b.act("s1", mul, Activation::Sigmoid);
        let s2 = b.act("s2", mul, Activation::Tanh);
        // An activation of a convolution is the convolution's business, not this rule's.
        let t = b.act("t", c, Activation::Tanh);
        let out = b.add("out", &[s1, s2, t]);
        let g = b.finish().unwrap();
        let f = fused_sources(&g);
        assert_eq!(f[relu.index()], Some(add));
        for n in [x, c, add, mul, s1, s2, t, out] {
            assert_eq!(f[n.index()], None, "{}", g.node(n).name);
        }
    }

    #[test]
    fn a_depthwise_convolution_takes_the_activation_before_it() {
        let relu = Op::Activation {
            act: Activation::Relu,
        };
        let dw = |c: usize| Op::Conv2d(Conv2d::new(c, 3).groups(c).bias(true));
        let pw = Op::Conv2d(Conv2d::new(16, 1));
        let x = vec![1, 8, 6, 6];
        assert_eq!(
            pre_activations(&[relu.clone(), dw(8), pw.clone()], &x),
            [true, false, false]
        );
        // Not before a pointwise or a grouped (not depthwise) convolution, nor at the end.
        let grouped = Op::Conv2d(Conv2d::new(8, 3).groups(4));
        assert_eq!(
            pre_activations(
                &[relu.clone(), pw.clone(), relu.clone(), dw(16), relu.clone()],
                &x
            ),
            [false, false, true, false, false]
        );
        assert_eq!(
            pre_activations(&[relu.clone(), grouped], &x),
            [false, false]
        );
        // A depthwise convolution of the wrong width is not depthwise here.
        assert_eq!(pre_activations(&[relu, dw(4)], &x), [false, false]);
    }

    #[test]
    fn a_convolution_takes_a_residual_sum_of_an_ancestor_only() {
        let mut b = GraphBuilder::new("res", DType::F32);
        let x = b.input("x", vec![1, 8, 4, 4]);
        let c1 = b.conv("c1", x, Conv2d::new(8, 3).relu());
        let c2 = b.conv("c2", c1, Conv2d::new(8, 3).bias(true));
        let sum = b.add("sum", &[c2, x]);
        let relu = b.act("relu", sum, Activation::Relu);
        // A branch beside the convolution is not ready for it in every schedule.
        let down = b.conv("down", relu, Conv2d::new(8, 1));
        let c3 = b.conv("c3", relu, Conv2d::new(8, 3));
        let side = b.add("side", &[c3, down]);
        // A convolution with an activation, or read twice, keeps its own output.
        let c4 = b.conv("c4", side, Conv2d::new(8, 3).relu());
        let s4 = b.add("s4", &[c4, side]);
        let c5 = b.conv("c5", s4, Conv2d::new(8, 3));
        let s5 = b.add("s5", &[c5, s4]);
        let _ = b.act("t", c5, Activation::Tanh);
        let g = b.finish().unwrap();
        assert_eq!(residual_source(&g, sum), Some((c2, x)));
        assert_eq!(fused_source(&g, relu), Some(sum));
        assert_eq!(residual_of(&g, c2), Some((sum, Activation::Relu)));
        assert_eq!(residual_of(&g, c3), None);
        for n in [side, s4, s5, relu, c2] {
            assert_eq!(residual_source(&g, n), None, "{}", g.node(n).name);
        }
    }

    #[test]
    fn an_output_or_a_broadcast_keeps_its_own_kernel() {
        let mut b = GraphBuilder::new("fuse", DType::F32);
        let x = b.input("x", vec![1, 4, 2, 2]);
        let bias = b.input("bias", vec![1, 4, 1, 1]);
        let wide = b.add("wide", &[x, bias]);
        let r1 = b.act("r1", wide, Activation::Relu);
        let kept = b.add("kept", &[x, x]);
        let r2 = b.act("r2", kept, Activation::Relu);
        let outputs = [kept, r1, r2]
            .iter()
            .map(|&n| GraphOutput {
                name: format!("o{}", n.0),
                value: Value::whole(n),
            })
            .collect();
        let g = b.finish().unwrap().with_outputs(outputs).unwrap();
        assert_eq!(fused_source(&g, r1), None);
        assert_eq!(fused_source(&g, r2), None);
    }
}
