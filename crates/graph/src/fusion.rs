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
//!   which is another kernel), or an `affine` (a batch normalization that could not fold
//!   into a convolution, DenseNet's before each of its layers: its shift's kernel applies the
//!   activation);
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
//!
//! A convolution whose bias is all that would run after it (no activation, no residual) leaves
//! the bias to its readers where each of them adds a bias per channel as it reads
//! ([`deferred_bias`]): an add kernel (a sum of whole values, an element-wise add) or our
//! depthwise convolution (before its input activation). The convolution is then one kernel
//! instead of two, as in PyTorch's compiled graphs, whose convolutions leave their bias to the
//! element-wise kernel after them (NASNet's separable convolutions end in such biases: 222 of
//! its 268 convolutions that cuDNN runs). A pooling adds it after pooling (`pool(x + b) =
//! pool(x) + b * share`: 1 for a max, the input elements' share of the divisor for an
//! average), also where a sum's add kernel pools it, and the in-place activation of a
//! concatenation's slice adds it there: NASNet's cells' 1x1 convolutions, read by separable
//! convolutions, poolings, sums and their cell's output.
//!
//! A depthwise convolution whose input is a sum of whole values reads the values and adds
//! them itself ([`depthwise_reads_sum`]: RandWire's nodes sum their inputs, then run relu and
//! a separable convolution): the sum launches no add kernel. Not by default: on an H100 the
//! add kernel and a depthwise kernel reading one value were faster ([`Fusions::DEFAULT`]).
//!
//! A value that every reader activates first (each a `sequential` operator starting with the
//! same activation) is activated once, in place, by its producer ([`producer_activation`]),
//! and its readers skip it ([`reads_activated`]): NASNet's cell outputs, each read by the next
//! two cells through a relu and a 1x1 convolution (or by one, where the sums below activate
//! as they write).
//!
//! A pooling whose only reader adds it to other values in one add kernel is pooled by that
//! kernel ([`pool_into_sum`]): NASNet's `avgpool(x) + y` and `avgpool(x) + avgpool(x)` are one
//! kernel each, the poolings none.
//!
//! A value activated for its readers that concatenates sums of whole values is activated by
//! their add kernels as they write their slices, the one other term, if any, in place after
//! them ([`act_by_writers`]): NASNet's cell outputs activate one slice of six in place, its
//! reduction cells' outputs none.
//!
//! Those last five can be left out one by one, the biases per reader kind ([`Fusions`],
//! [`Graph::with_fusions`](crate::Graph::with_fusions), `opsched run --no-fusion`, and put
//! back with `--fusion`): on an H100 NASNet ran 1.26x slower once the first two were in, with
//! fewer kernels, and a switch per fusion measures each in the same build. One is left out by
//! default since it measured slower ([`Fusions::DEFAULT`]: the depthwise kernel reading a
//! sum's values).

use crate::{Conv2d, Graph, NodeId, Op, Shape};

/// Which of the fusions that can be left out a graph's lowering applies ([`Fusions::DEFAULT`]
/// unless told otherwise: [`Graph::with_fusions`](crate::Graph::with_fusions)). They change which kernels run, never
/// a value. Every other rule of this module always applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fusions {
    /// Add kernels add the bias of a convolution they read ([`deferred_bias`]: a sum's add
    /// kernel, an element-wise add).
    pub bias_into_adds: bool,
    /// Our depthwise kernel adds the bias of a convolution it reads ([`deferred_bias`]).
    pub bias_into_depthwise: bool,
    /// Our depthwise kernel reads the values of the sum before it ([`depthwise_reads_sum`]).
    pub sum_into_depthwise: bool,
    /// A value every reader activates first is activated once, in place, by its producer
    /// ([`producer_activation`]).
    pub act_into_producer: bool,
    /// The add kernel of a sum pools the pools it adds ([`pool_into_sum`]).
    pub pool_into_sum: bool,
    /// A concatenation activated for its readers has its sums' add kernels apply the
    /// activation as they write ([`act_by_writers`]).
    pub act_into_writers: bool,
    /// A pooling adds the bias of the convolution it pools, and the in-place activation of a
    /// concatenation's one other term adds that term's ([`deferred_bias`]).
    pub bias_into_pools: bool,
    /// A concatenation of convolutions passes their biases on to its readers
    /// ([`passed_bias`]).
    pub bias_through_concat: bool,
}

impl Default for Fusions {
    fn default() -> Self {
        Fusions::DEFAULT
    }
}

impl Fusions {
    /// Every fusion.
    pub const ALL: Fusions = Fusions {
        bias_into_adds: true,
        bias_into_depthwise: true,
        sum_into_depthwise: true,
        act_into_producer: true,
        pool_into_sum: true,
        act_into_writers: true,
        bias_into_pools: true,
        bias_through_concat: true,
    };

    /// The fusions a graph's lowering applies unless told otherwise: every one but
    /// `sum-into-depthwise`. On an H100 (2026-11-27, `fixtures/gpu/h100-2026-11-27d/`)
    /// RandWire's LIOS plan channels last ran 0.91x the time of all eight without it (the
    /// depthwise kernel reading three or four values per tap instead of one sum), in each of
    /// three processes; the other fusions held or won (without `bias-into-depthwise` 1.05x).
    /// It changes no other zoo model's kernels.
    pub const DEFAULT: Fusions = Fusions {
        sum_into_depthwise: false,
        ..Fusions::ALL
    };

    /// The fusions' names (`opsched run --fusion NAME`, `--no-fusion NAME`), each with what it
    /// says.
    pub const NAMES: [(&'static str, &'static str); 8] = [
        (
            "bias-into-adds",
            "add kernels add the bias of a convolution they read",
        ),
        (
            "bias-into-depthwise",
            "our depthwise kernel adds the bias of a convolution it reads",
        ),
        (
            "sum-into-depthwise",
            "our depthwise kernel reads the values of the sum before it",
        ),
        (
            "act-into-producer",
            "a value every reader activates first is activated once, in place, by its producer",
        ),
        (
            "pool-into-sum",
            "the add kernel of a sum pools the pools it adds",
        ),
        (
            "act-into-writers",
            "a concatenation activated for its readers has its sums' add kernels apply the activation",
        ),
        (
            "bias-into-pools",
            "a pooling adds the bias of the convolution it pools",
        ),
        (
            "bias-through-concat",
            "a concatenation of convolutions passes their biases on to its readers",
        ),
    ];

    /// These fusions without the one named `name` (one of [`Fusions::NAMES`]).
    pub fn without(self, name: &str) -> Option<Fusions> {
        self.set(name, false)
    }

    /// These fusions with the one named `name` (one of [`Fusions::NAMES`]).
    pub fn with(self, name: &str) -> Option<Fusions> {
        self.set(name, true)
    }

    /// These fusions with the one named `name` applied or not (`on`).
    fn set(mut self, name: &str, on: bool) -> Option<Fusions> {
        let flag = match name {
            "bias-into-adds" => &mut self.bias_into_adds,
            "bias-into-depthwise" => &mut self.bias_into_depthwise,
            "sum-into-depthwise" => &mut self.sum_into_depthwise,
            "act-into-producer" => &mut self.act_into_producer,
            "pool-into-sum" => &mut self.pool_into_sum,
            "act-into-writers" => &mut self.act_into_writers,
            "bias-into-pools" => &mut self.bias_into_pools,
            "bias-through-concat" => &mut self.bias_through_concat,
            _ => return None,
        };
        *flag = on;
        Some(self)
    }

    /// The names of the fusions left out, in [`Fusions::NAMES`]' order.
    pub fn left_out(self) -> Vec<&'static str> {
        let on = [
            self.bias_into_adds,
            self.bias_into_depthwise,
            self.sum_into_depthwise,
            self.act_into_producer,
            self.pool_into_sum,
            self.act_into_writers,
            self.bias_into_pools,
            self.bias_through_concat,
        ];
        Self::NAMES
            .iter()
            .zip(on)
            .filter(|(_, on)| !on)
            .map(|((name, _), _)| *name)
            .collect()
    }
}

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

/// The element-wise or affine operator whose kernel also applies activation `a`, when the
/// rules of the module hold.
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
    if v.channels.is_some() || !matches!(producer.op, Op::Elementwise { .. } | Op::Affine) {
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

/// The inner index of operator `p`'s convolution whose bias its readers may add
/// ([`deferred_bias`]): `p` itself (0) or the last operator of a `sequential` chain, where that
/// convolution has a bias and no activation and is not depthwise.
fn bias_only_conv(g: &Graph, p: NodeId) -> Option<usize> {
    let (inner, c) = match &g.node(p).op {
        Op::Conv2d(c) => (0, c),
        Op::Sequential { ops } => match ops.last() {
            Some(Op::Conv2d(c)) => (ops.len() - 1, c),
            _ => return None,
        },
        _ => return None,
    };
    if !c.bias || c.act != crate::Activation::None {
        return None;
    }
    // Only a grouped convolution can be depthwise: the channels it reads matter then alone
    // (the launch count asks this of every operator, every time a cost is wanted).
    if c.groups > 1 {
        let mut shapes = g.input_shapes(p);
        if let Op::Sequential { ops } = &g.node(p).op {
            for op in &ops[..inner] {
                shapes = vec![op.infer_shape(&shapes).ok()?];
            }
        }
        let channels = shapes.iter().filter_map(|s| s.get(1)).sum::<usize>();
        if is_depthwise(c, channels) {
            return None;
        }
    }
    Some(inner)
}

/// Whether consumer `c` adds a bias per channel to `term`, which holds `p`'s whole value, as it
/// reads it: `term` sums several whole values (one add kernel computes the sum, except in a
/// concatenation along another axis than channels); `term` is `p` alone and `c` is an
/// element-wise add of whole values of its own shape (no broadcasting) that no convolution
/// computes ([`residual_source`]); or `term` is `c`'s only input and `c` is a depthwise
/// convolution, or a `sequential` operator whose first kernel is one (after the activations
/// it applies, [`pre_activations`]); or `c` is a pooling; or `term` is the one term of
/// concatenation `c` activated in place after its sums ([`act_by_writers`]); or `c` is a
/// concatenation that passes the biases on to its readers ([`passed_bias`]). Each kind of
/// reader only where the graph's [`Fusions`] have it (the add kernels, the depthwise kernel,
/// which adds the bias of a sum it reads, the poolings and in-place activations, the
/// concatenations).
fn adds_bias_of(g: &Graph, c: NodeId, term: &[crate::Value]) -> bool {
    let node = g.node(c);
    let f = g.fusions();
    let whole = term.iter().all(|v| v.channels.is_none());
    if term.len() > 1 {
        if !whole || matches!(node.op, Op::Concat { axis } if axis != 1) {
            return false;
        }
        // The sum's add kernel adds it, or the depthwise kernel that reads the sum's values.
        return match (f.bias_into_adds, f.bias_into_depthwise) {
            (adds, depthwise) if adds == depthwise => adds,
            (adds, depthwise) => {
                if depthwise_reads_sum(g, c) {
                    depthwise
                } else {
                    adds
                }
            }
        };
    }
    if !whole {
        return false;
    }
    let shapes = g.input_shapes(c);
    match &node.op {
        // pool(x + b) = pool(x) + b * share (1 for a max; for an average, the input elements'
        // share of what it divides by): the pooling kernel adds that, or the add kernel that
        // pools it into a sum.
        Op::Pool2d(_) => f.bias_into_pools,
        // The in-place activation of the one term the sums' add kernels did not activate; or
        // the concatenation's readers, where it passes its terms' biases on.
        Op::Identity | Op::Concat { .. } => {
            let rest = node.inputs.iter().position(|t| t.as_slice() == term);
            (f.bias_into_pools && rest.is_some() && act_by_writers(g, c) == Some(rest))
                || passed_bias(g, c)
        }
        Op::Elementwise {
            kind: crate::ElementwiseKind::Add,
        } => {
            f.bias_into_adds
                && shapes.iter().all(|s| s.as_slice() == node.shape.as_slice())
                && residual_source(g, c).is_none()
        }
        _ => f.bias_into_depthwise && first_kernel_is_depthwise(g, c),
    }
}

/// Whether the first kernel of operator `c`, which reads one input term, is our depthwise
/// convolution: `c` is one (computing no residual), or a `sequential` chain whose first kernel
/// is one (after the activations it applies to what it reads, [`pre_activations`]).
fn first_kernel_is_depthwise(g: &Graph, c: NodeId) -> bool {
    let node = g.node(c);
    let [term] = node.inputs.as_slice() else {
        return false;
    };
    let Some(one) = term.first().and_then(|v| g.value_shape(v).ok()) else {
        return false;
    };
    if one.len() != 4 {
        return false;
    }
    match &node.op {
        Op::Conv2d(conv) => is_depthwise(conv, one[1]) && residual_of(g, c).is_none(),
        // The first kernel, after an activation it applies ([`pre_activations`]: one directly
        // before a depthwise convolution, which reads the node's shape: activations keep it).
        Op::Sequential { ops } => match ops.as_slice() {
            [Op::Conv2d(conv), ..] | [Op::Activation { .. }, Op::Conv2d(conv), ..] => {
                is_depthwise(conv, one[1])
            }
            _ => false,
        },
        _ => false,
    }
}

/// Whether operator `c`'s depthwise kernel reads the values its only input term sums, adding
/// them as it reads (RandWire's nodes: the sum of their inputs, relu, separable convolution),
/// so that no add kernel computes the sum first: the term sums several whole values, none
/// written in place as a strided slice of a concatenation (the kernel reads the others at the
/// first one's offsets: all dense), and `c`'s first kernel is our depthwise convolution;
/// unless the graph's [`Fusions`] leave it out.
pub fn depthwise_reads_sum(g: &Graph, c: NodeId) -> bool {
    let node = g.node(c);
    let [t] = node.inputs.as_slice() else {
        return false;
    };
    let summed =
        g.fusions().sum_into_depthwise && t.len() > 1 && t.iter().all(|v| v.channels.is_none());
    // The in-place rules last: they are the costliest to ask.
    summed
        && first_kernel_is_depthwise(g, c)
        && t.iter()
            .all(|v| crate::inplace::slice_of(g, v.node).is_none_or(|s| s.rows <= 1))
}

/// The convolution whose bias the readers of operator `p` add instead of it, as its inner
/// index (0 for a `conv2d` operator, the last for a `sequential` chain ending in the
/// convolution), when
/// - that convolution is not depthwise (ours adds its bias in its own kernel) and has a bias
///   and no activation, and a `conv2d` operator computes no residual sum ([`residual_of`]);
/// - `p` is not an output of the graph and has readers, and every term of every reader that
///   holds `p` holds its whole value and adds a bias as it reads (see `adds_bias_of`).
///
/// `p`'s own value (without the bias) is then never kept: the readers see the value with it.
pub fn deferred_bias(g: &Graph, p: NodeId) -> Option<usize> {
    let inner = bias_only_conv(g, p)?;
    if is_output(g, p) || g.succs(p).next().is_none() {
        return None;
    }
    let readers_add_it = g.succs(p).all(|c| {
        g.node(c)
            .inputs
            .iter()
            .filter(|t| t.iter().any(|v| v.node == p))
            .all(|t| adds_bias_of(g, c, t))
    });
    (readers_add_it && residual_of(g, p).is_none()).then_some(inner)
}

/// Whether concatenation `p` passes on to its readers the biases its terms' convolutions leave
/// to it, the biases side by side as its channels are (NASNet's factorized reductions: two
/// strided 1x1 convolutions concatenated, read by separable convolutions, poolings, sums and
/// the cell's output), when
/// - `p` concatenates along channels (an identity, or a concatenation along axis 1) and is
///   not an output of the graph, and the graph's [`Fusions`] have it;
/// - every term is one whole value, a convolution whose bias its readers may add
///   (`bias_only_conv`: no activation, not depthwise) and no residual sum computes, which `p`
///   alone reads, once, and which is not an output;
/// - `p` has readers, and every term of every reader that holds `p` holds its whole value and
///   adds a bias as it reads (see `adds_bias_of`).
///
/// The terms' convolutions then leave their biases ([`deferred_bias`]), and `p`'s own value
/// (without them) is never kept.
pub fn passed_bias(g: &Graph, p: NodeId) -> bool {
    let node = g.node(p);
    let along_channels =
        matches!(node.op, Op::Identity | Op::Concat { axis: 1 }) && node.shape.len() == 4;
    if !g.fusions().bias_through_concat || !along_channels || is_output(g, p) {
        return false;
    }
    let terms_leave_biases = node.inputs.iter().all(|t| match t.as_slice() {
        [v] => {
            let reads = node.inputs.iter().flatten().filter(|u| u.node == v.node);
            v.channels.is_none()
                && reads.count() == 1
                && bias_only_conv(g, v.node).is_some()
                && g.succs(v.node).all(|r| r == p)
                && !is_output(g, v.node)
                && residual_of(g, v.node).is_none()
        }
        _ => false,
    });
    // The readers last: asking them may ask other rules.
    terms_leave_biases
        && g.succs(p).next().is_some()
        && g.succs(p).all(|c| {
            g.node(c)
                .inputs
                .iter()
                .filter(|t| t.iter().any(|v| v.node == p))
                .all(|t| adds_bias_of(g, c, t))
        })
}

/// The activation that every reader of operator `p` applies first, where `p`'s own steps
/// apply it instead, once and in place, after computing `p` (its readers then skip it:
/// [`reads_activated`]): NASNet's cell outputs, which the two next cells each read through a
/// relu and a 1x1 convolution (two relu kernels for one value, each writing a copy). When
/// - every reader reads `p`'s whole value as its one input, and is a `sequential` operator
///   whose first operator is that activation, at least two of them launching a kernel for it
///   (not the ones our depthwise kernel applies as it reads, [`pre_activations`]), or one
///   where the add kernels of `p`'s sums would apply it as they write (`writers_activate`:
///   the reader's kernel over the whole value becomes one over a slice at most);
/// - `p` is an operator, not an output of the graph, no view of another value
///   ([`crate::inplace::reshape_source`]), and leaves no bias to its readers (nor passes
///   one on, [`passed_bias`]);
/// - where `p` concatenates, a value that may write its slice of `p` in place (a term that is
///   one whole value) is read by nothing but `p` and ancestors of `p`, which every schedule
///   runs before `p`'s steps;
/// - the graph's [`Fusions`] have it.
///
/// `p`'s own value (before the activation) is then never kept, nor are those of the values
/// written in place into it.
pub fn producer_activation(g: &Graph, p: NodeId) -> Option<crate::Activation> {
    if !g.fusions().act_into_producer || g.node(p).op.is_input() || is_output(g, p) {
        return None;
    }
    let mut act = None;
    let mut launching = 0;
    for c in g.succs(p) {
        let (a, applied_by_depthwise) = leading_activation(g, c, p)?;
        if *act.get_or_insert(a) != a {
            return None;
        }
        launching += usize::from(!applied_by_depthwise);
    }
    let worth_it = launching >= 2 || (launching == 1 && writers_activate(g, p).is_some());
    if !worth_it
        || crate::inplace::reshape_source(g, p).is_some()
        || deferred_bias(g, p).is_some()
        || passed_bias(g, p)
    {
        return None;
    }
    // A concatenation's terms of one whole value may be written in place (by their producers
    // or by a merged convolution): whatever else reads them has read them before `p` runs.
    let concatenates = matches!(g.node(p).op, Op::Identity | Op::Concat { .. });
    let read_before = !concatenates
        || g.node(p).inputs.iter().all(|term| match term.as_slice() {
            [v] if v.channels.is_none() => g.succs(v.node).all(|r| r == p || is_ancestor(g, r, p)),
            _ => true,
        });
    read_before.then_some(act).flatten()
}

/// Where operator `p` concatenates along channels a value activated for its readers
/// ([`producer_activation`]), whether the add kernels of its terms that sum whole values apply
/// the activation as they write their slices, and which one other term, if any, is activated
/// in place after them (its index): when at least one term is such a sum and at most one is
/// not (written in place by its producer, or copied), and the graph's [`Fusions`] have it.
/// NASNet's cell outputs: five sums and the left input, written in place, which other readers
/// read before the cell's output runs; its reduction cells' outputs: four sums, no activation
/// kernel at all. `None`: the whole value is activated in place after `p`'s steps.
pub fn act_by_writers(g: &Graph, p: NodeId) -> Option<Option<usize>> {
    producer_activation(g, p)?;
    writers_activate(g, p)
}

/// [`act_by_writers`]' conditions on `p` itself (not that its value is activated for its
/// readers): it concatenates along channels at least one sum of whole values and at most one
/// other term (its index), and the graph's [`Fusions`] have it.
fn writers_activate(g: &Graph, p: NodeId) -> Option<Option<usize>> {
    if !g.fusions().act_into_writers {
        return None;
    }
    let node = g.node(p);
    // An identity concatenates its terms along channels, as a concatenation along axis 1
    // does; the sums of values of rank 2 or more are add kernels writing their slices.
    let along_channels =
        matches!(node.op, Op::Identity | Op::Concat { axis: 1 }) && node.shape.len() >= 2;
    let summed = |t: &crate::Term| t.len() > 1 && t.iter().all(|v| v.channels.is_none());
    let mut rest = node.inputs.iter().enumerate().filter(|(_, t)| !summed(t));
    let sums = node.inputs.iter().filter(|t| summed(t)).count();
    match (rest.next(), rest.next()) {
        (first, None) if along_channels && sums > 0 => Some(first.map(|(i, _)| i)),
        _ => None,
    }
}

/// Whether operator `c` reads a value whose producer applied `c`'s first activation to it
/// ([`producer_activation`]): `c` then skips that activation.
pub fn reads_activated(g: &Graph, c: NodeId) -> bool {
    activated_read(g, c).is_some()
}

/// Whether operator `c` reads an activated value ([`reads_activated`]) and so launches no
/// kernel for its first activation (where our depthwise kernel applies it as it reads, it
/// launched none before either).
pub fn skips_activation_kernel(g: &Graph, c: NodeId) -> bool {
    activated_read(g, c) == Some(false)
}

/// Where operator `c` reads a value its producer activated: whether our depthwise kernel
/// would have applied `c`'s first activation ([`leading_activation`]).
fn activated_read(g: &Graph, c: NodeId) -> Option<bool> {
    let [term] = g.node(c).inputs.as_slice() else {
        return None;
    };
    let [v] = term.as_slice() else {
        return None;
    };
    let (_, by_depthwise) = leading_activation(g, c, v.node)?;
    producer_activation(g, v.node).map(|_| by_depthwise)
}

/// The activation `sequential` operator `c` applies first to `p`'s whole value, its one
/// input, and whether our depthwise kernel applies it as it reads ([`pre_activations`]).
fn leading_activation(g: &Graph, c: NodeId, p: NodeId) -> Option<(crate::Activation, bool)> {
    let node = g.node(c);
    let [term] = node.inputs.as_slice() else {
        return None;
    };
    let [v] = term.as_slice() else {
        return None;
    };
    let Op::Sequential { ops } = &node.op else {
        return None;
    };
    let Some(Op::Activation { act }) = ops.first() else {
        return None;
    };
    if v.node != p || v.channels.is_some() {
        return None;
    }
    let by_depthwise = pre_activations(ops, &g.node(p).shape).first() == Some(&true);
    Some((*act, by_depthwise))
}

/// The operator whose add kernel computes pooling `p` as it sums `p`'s value with others,
/// so that `p` launches nothing and its value is never written (NASNet's cells add average
/// and max pools to other branches: `avgpool(x) + y`, `avgpool(x) + avgpool(x)`), when
/// - `p` pools one whole value into a 4-D one and is not an output of the graph;
/// - one operator `c` reads `p`, once, and one add kernel of `c` sums `p`'s value with other
///   whole values: a term of `c` that sums them (unless `c`'s depthwise kernel reads them,
///   [`depthwise_reads_sum`]), or `c` is an element-wise add of whole values of its shape,
///   each a term (unless a convolution computes it, [`residual_source`]);
/// - every pooling that kernel could take this way pools alike (the same pooling of inputs
///   of one shape: the kernel pools each input with one set of windows);
/// - the graph's [`Fusions`] have it.
///
/// `c` is returned. The pooling's input is an ancestor of `c`, so every schedule has it when
/// `c` runs.
pub fn pool_into_sum(g: &Graph, p: NodeId) -> Option<NodeId> {
    if !g.fusions().pool_into_sum {
        return None;
    }
    let (c, values) = pool_reader(g, p)?;
    let alike = |q: NodeId| g.node(q).op == g.node(p).op && g.input_shapes(q) == g.input_shapes(p);
    values
        .iter()
        .filter(|v| v.node != p && pool_reader(g, v.node).is_some_and(|(r, _)| r == c))
        .all(|v| alike(v.node))
        .then_some(c)
}

/// For pooling `p`, the one reader and the values one add kernel of that reader sums with
/// `p`'s ([`pool_into_sum`]'s conditions but the last two).
fn pool_reader(g: &Graph, p: NodeId) -> Option<(NodeId, Vec<crate::Value>)> {
    let node = g.node(p);
    let (Op::Pool2d(_), [term]) = (&node.op, node.inputs.as_slice()) else {
        return None;
    };
    if !matches!(term.as_slice(), [x] if x.channels.is_none())
        || node.shape.len() != 4
        || is_output(g, p)
    {
        return None;
    }
    let c = g.succs(p).next()?;
    let reads = g.node(c).inputs.iter().flatten().filter(|v| v.node == p);
    if g.succs(p).any(|r| r != c) || reads.count() != 1 {
        return None;
    }
    summed_with(g, c, p).map(|values| (c, values))
}

/// The whole values that one add kernel of operator `c` sums, `p`'s among them: the term of
/// `c` that holds `p`, where it sums whole values that `c`'s depthwise kernel does not read
/// itself; or, where that term is `p` alone, every term of an element-wise add of whole
/// values of its shape that no convolution computes.
fn summed_with(g: &Graph, c: NodeId, p: NodeId) -> Option<Vec<crate::Value>> {
    let node = g.node(c);
    let term = node.inputs.iter().find(|t| t.iter().any(|v| v.node == p))?;
    if term.len() > 1 {
        let whole = term.iter().all(|v| v.channels.is_none());
        return (whole && !depthwise_reads_sum(g, c)).then(|| term.clone());
    }
    let add = matches!(
        node.op,
        Op::Elementwise {
            kind: crate::ElementwiseKind::Add
        }
    );
    let values: Vec<crate::Value> = node
        .inputs
        .iter()
        .filter_map(|t| match t.as_slice() {
            [v] if v.channels.is_none() && g.node(v.node).shape == node.shape => Some(*v),
            _ => None,
        })
        .collect();
    let all_whole = values.len() == node.inputs.len() && values.len() > 1;
    (add && all_whole && residual_source(g, c).is_none()).then_some(values)
}

/// [`pool_into_sum`] for every node.
pub fn pools_into_sums(g: &Graph) -> Vec<Option<NodeId>> {
    (0..g.len())
        .map(|i| pool_into_sum(g, NodeId(i as u32)))
        .collect()
}

/// [`deferred_bias`] for every node.
pub fn deferred_biases(g: &Graph) -> Vec<Option<usize>> {
    (0..g.len())
        .map(|i| deferred_bias(g, NodeId(i as u32)))
        .collect()
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
            let s = b.op("s", Op::batch_matmul(true), &[qt, kt]);
            let c = b.op("c", Op::batch_matmul(false), &[s, qt]);
            let ct = b.op("ct", heads(), &[c]);
            // A transpose something else reads too runs; so does one of another permutation.
            let kept = b.op("kept", heads(), &[k]);
            let _relu = b.act("relu", kept, Activation::Relu);
            let s2 = b.op("s2", Op::batch_matmul(true), &[kept, kept]);
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
        // A batch normalization that stays an affine takes its activation too.
        let norm = b.op("norm", Op::Affine, &[x]);
        let norm_relu = b.act("norm_relu", norm, Activation::Relu);
        let out = b.add("out", &[s1, s2, t, norm_relu]);
        let g = b.finish().unwrap();
        let f = fused_sources(&g);
        assert_eq!(f[relu.index()], Some(add));
        assert_eq!(f[norm_relu.index()], Some(norm));
        for n in [x, c, add, mul, s1, s2, t, norm, out] {
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
    fn readers_that_add_a_bias_as_they_read_take_the_convolutions_bias() {
        let relu = || Op::Activation {
            act: Activation::Relu,
        };
        let sep = |c: usize| {
            vec![
                relu(),
                Op::Conv2d(Conv2d::new(c, 3).groups(c).bias(true)),
                Op::Conv2d(Conv2d::new(c, 1).bias(true)),
            ]
        };
        let mut b = GraphBuilder::new("defer", DType::F32);
        let x = b.input("x", vec![1, 8, 6, 6]);
        // NASNet's branch: a separable convolution read by the next one's depthwise kernel,
        // whose output is summed with another branch's in a concatenation's term.
        let s1 = b.sequential("s1", x, sep(8));
        let s2 = b.sequential("s2", s1, sep(8));
        let s3 = b.sequential("s3", x, sep(8));
        let cell = b.node(
            "cell",
            Op::Identity,
            vec![
                vec![Value::whole(s2), Value::whole(s3)],
                vec![Value::whole(x)],
            ],
        );
        // An element-wise add of two convolutions (ResNet's downsampling block), and a
        // depthwise convolution reading one.
        let c1 = b.conv("c1", cell, Conv2d::new(8, 1).bias(true));
        let c2 = b.conv("c2", cell, Conv2d::new(8, 3).bias(true));
        let add = b.add("add", &[c1, c2]);
        let c3 = b.conv("c3", add, Conv2d::new(8, 1).bias(true));
        let dw = b.conv("dw", c3, Conv2d::new(8, 3).groups(8).bias(true));
        // Kept: with an activation; without a bias; depthwise; read by a product, by a
        // concatenation as a whole term, by a pointwise convolution's chain; an output of the
        // graph. (`k1`, read by a pool and a depthwise kernel, leaves its bias to both;
        // `k1_too`, read by an add, to it.)
        let k1 = b.conv("k1", dw, Conv2d::new(8, 1).bias(true));
        let pool = b.pool("pool", k1, crate::Pool2d::max(3, 1, 1));
        let k1_too = b.sequential("k1_too", k1, sep(8));
        let k2 = b.conv("k2", pool, Conv2d::new(8, 1).bias(true).relu());
        let k3 = b.conv("k3", pool, Conv2d::new(8, 1));
        let k4 = b.conv("k4", pool, Conv2d::new(8, 3).groups(8).bias(true));
        let sum = b.add("sum", &[k2, k3, k4, k1_too]);
        let k5 = b.conv("k5", sum, Conv2d::new(8, 1).bias(true));
        let k6 = b.conv("k6", sum, Conv2d::new(8, 1).bias(true));
        let k7 = b.conv("k7", sum, Conv2d::new(8, 1).bias(true));
        let mul = b.mul("mul", &[k5, sum]);
        let cat = b.concat("cat", &[k6, mul]);
        let pw = b.sequential("pw", k7, vec![relu(), Op::Conv2d(Conv2d::new(8, 1))]);
        let last = b.concat("last", &[cat, pw]);
        let out = b.conv("out", last, Conv2d::new(4, 1).bias(true));
        let g = b.finish().unwrap();
        let deferred = [
            (s1, 2),
            (s2, 2),
            (s3, 2),
            (c1, 0),
            (c2, 0),
            (c3, 0),
            (k1, 0),
            (k1_too, 2),
        ];
        for (n, inner) in deferred {
            assert_eq!(deferred_bias(&g, n), Some(inner), "{}", g.node(n).name);
        }
        for n in [k2, k3, k4, k5, k6, k7, out, dw, add, cell] {
            assert_eq!(deferred_bias(&g, n), None, "{}", g.node(n).name);
        }
        // Each reader kind can be left out on its own: the depthwise kernel reads s1, c3 and
        // k1 (which the pool adds too), add kernels the others.
        let by_depthwise = [s1, c3, k1];
        for name in ["bias-into-adds", "bias-into-depthwise"] {
            let fewer = g.clone().with_fusions(Fusions::ALL.without(name).unwrap());
            assert_ne!(fewer.id(), g.id());
            for (n, inner) in deferred {
                let kept = by_depthwise.contains(&n) == (name == "bias-into-adds");
                let want = kept.then_some(inner);
                assert_eq!(deferred_bias(&fewer, n), want, "{name}: {}", g.node(n).name);
            }
        }
        let no_sums = g
            .clone()
            .with_fusions(Fusions::ALL.without("sum-into-depthwise").unwrap());
        for (n, inner) in deferred {
            assert_eq!(deferred_bias(&no_sums, n), Some(inner));
        }
        // A convolution that computes the residual sum it feeds keeps its bias there.
        let mut b = GraphBuilder::new("residual", DType::F32);
        let x = b.input("x", vec![1, 8, 4, 4]);
        let c = b.conv("c", x, Conv2d::new(8, 3).bias(true));
        let sum = b.add("sum", &[c, x]);
        let _ = b.conv("after", sum, Conv2d::new(8, 3));
        let g = b.finish().unwrap();
        assert!(residual_of(&g, c).is_some());
        assert_eq!(deferred_bias(&g, c), None);
    }

    #[test]
    fn a_depthwise_kernel_reads_a_sum_of_dense_whole_values() {
        let relu = || Op::Activation {
            act: Activation::Relu,
        };
        let dw = || Op::Conv2d(Conv2d::new(8, 3).groups(8).bias(true));
        for batch in [1, 2] {
            let mut b = GraphBuilder::new("sums", DType::F32);
            let x = b.input("x", vec![batch, 8, 6, 6]);
            let a = b.conv("a", x, Conv2d::new(8, 1).bias(true));
            let c = b.conv("c", x, Conv2d::new(8, 3).bias(true));
            let sum = |p: NodeId, q: NodeId| vec![Value::whole(p), Value::whole(q)];
            let node = |b: &mut GraphBuilder, name: &str, ops: Vec<Op>, t: Vec<Value>| {
                b.node(name, Op::Sequential { ops }, vec![t])
            };
            let reads = node(&mut b, "reads", vec![relu(), dw()], sum(a, c));
            let plain = b.node(
                "plain",
                Op::Conv2d(Conv2d::new(8, 3).groups(8)),
                vec![sum(a, c)],
            );
            // Not: a chain whose first kernel is a 1x1 convolution, a sum with a channel slice.
            let pw = vec![relu(), Op::Conv2d(Conv2d::new(8, 1))];
            let pointwise = node(&mut b, "pointwise", pw, sum(a, c));
            let sliced = vec![Value::slice(a, 0, 8), Value::whole(c)];
            let sliced = node(&mut b, "sliced", vec![relu(), dw()], sliced);
            // `d` writes its slice of `cat` in place: one run per image at batch 2.
            let d = b.conv("d", x, Conv2d::new(8, 3).bias(true));
            let e = b.conv("e", x, Conv2d::new(8, 3).bias(true));
            let _cat = b.concat("cat", &[d, e]);
            let strided = node(&mut b, "strided", vec![relu(), dw()], sum(d, a));
            // Not by default (`Fusions::DEFAULT`).
            let g = b.finish().unwrap();
            assert!(!depthwise_reads_sum(&g, reads) && !depthwise_reads_sum(&g, plain));
            let g = g.with_fusions(Fusions::ALL);
            assert!(depthwise_reads_sum(&g, reads) && depthwise_reads_sum(&g, plain));
            assert!(!depthwise_reads_sum(&g, pointwise) && !depthwise_reads_sum(&g, sliced));
            assert_eq!(crate::inplace::slice_of(&g, d).map(|s| s.rows), Some(batch));
            assert_eq!(depthwise_reads_sum(&g, strided), batch == 1);
            let g = g.with_fusions(Fusions::ALL.without("sum-into-depthwise").unwrap());
            for n in [reads, plain, strided] {
                assert!(!depthwise_reads_sum(&g, n));
            }
        }
    }

    #[test]
    fn a_producer_activates_a_value_that_every_reader_activates_first() {
        let act = |a| Op::Activation { act: a };
        let then_conv =
            |a, stride: usize| vec![act(a), Op::Conv2d(Conv2d::new(4, 1).stride(stride))];
        let sep = || {
            vec![
                act(Activation::Relu),
                Op::Conv2d(Conv2d::new(4, 3).groups(4)),
            ]
        };
        let mut b = GraphBuilder::new("acts", DType::F32);
        let x = b.input("x", vec![1, 4, 6, 6]);
        let relu = Activation::Relu;
        // Two relu + 1x1 convolutions and a separable one (its relu free): activated.
        let v1 = b.conv("v1", x, Conv2d::new(4, 3).bias(true));
        let r1 = b.sequential("r1", v1, then_conv(relu, 1));
        b.sequential("r2", v1, then_conv(relu, 2));
        let s1 = b.sequential("s1", v1, sep());
        // One that launches its relu, one whose depthwise kernel applies it: nothing to gain.
        let v2 = b.conv("v2", x, Conv2d::new(4, 3));
        b.sequential("r3", v2, then_conv(relu, 1));
        b.sequential("s2", v2, sep());
        // Another reader kind, another activation.
        let v3 = b.conv("v3", x, Conv2d::new(4, 3));
        b.sequential("r4", v3, then_conv(relu, 1));
        b.sequential("r5", v3, then_conv(relu, 1));
        b.pool("pool", v3, crate::Pool2d::max(3, 1, 1));
        let v4 = b.conv("v4", x, Conv2d::new(4, 3));
        b.sequential("r6", v4, then_conv(relu, 1));
        b.sequential("r7", v4, then_conv(Activation::Sigmoid, 1));
        // A concatenation whose in-place term something reads after it: not activated; one
        // whose in-place term only its ancestors read: activated.
        let t = b.conv("t", x, Conv2d::new(4, 3));
        let t2 = b.conv("t2", x, Conv2d::new(4, 1));
        let cat = b.concat("cat", &[t, t2]);
        b.sequential("r8", cat, then_conv(relu, 1));
        b.sequential("r9", cat, then_conv(relu, 1));
        let late = b.sequential("late", t, then_conv(relu, 1));
        let u = b.conv("u", x, Conv2d::new(4, 3));
        let early = b.pool("early", u, crate::Pool2d::max(3, 1, 1));
        let cat2 = b.node(
            "cat2",
            Op::Identity,
            vec![
                vec![Value::whole(u)],
                vec![Value::whole(early), Value::whole(x)],
            ],
        );
        b.sequential("r10", cat2, then_conv(relu, 1));
        b.sequential("r11", cat2, then_conv(relu, 1));
        let g = b.finish().unwrap();
        assert!(crate::inplace::slice_of(&g, t).is_some());
        assert_eq!(producer_activation(&g, v1), Some(relu));
        assert_eq!(producer_activation(&g, cat2), Some(relu));
        for n in [v2, v3, v4, cat, t, late, r1] {
            assert_eq!(producer_activation(&g, n), None, "{}", g.node(n).name);
        }
        assert!(reads_activated(&g, r1) && reads_activated(&g, s1));
        assert!(!reads_activated(&g, late));
        // Left out, or the value an output of the graph: not activated.
        let without = g
            .clone()
            .with_fusions(Fusions::ALL.without("act-into-producer").unwrap());
        assert_eq!(producer_activation(&without, v1), None);
        assert!(!reads_activated(&without, r1));
        let mut outputs = g.outputs().to_vec();
        outputs.push(GraphOutput {
            name: "v1".into(),
            value: Value::whole(v1),
        });
        let g = g.with_outputs(outputs).unwrap();
        assert_eq!(producer_activation(&g, v1), None);
    }

    #[test]
    fn an_add_kernel_pools_the_poolings_only_it_reads() {
        let mut b = GraphBuilder::new("pools", DType::F32);
        let x = b.input("x", vec![1, 4, 6, 6]);
        let y = b.conv("y", x, Conv2d::new(4, 3));
        let avg =
            |b: &mut GraphBuilder, name: &str, v| b.pool(name, v, crate::Pool2d::avg(3, 1, 1));
        let max =
            |b: &mut GraphBuilder, name: &str, v| b.pool(name, v, crate::Pool2d::max(3, 1, 1));
        let sum = |p: NodeId, q: NodeId| vec![Value::whole(p), Value::whole(q)];
        // NASNet's cell: avgpool(x) + y, and two alike poolings summed.
        let p1 = avg(&mut b, "p1", x);
        let p2 = avg(&mut b, "p2", y);
        let p3 = avg(&mut b, "p3", y);
        let cell = b.node("cell", Op::Identity, vec![sum(p1, y), sum(p2, p3)]);
        // An element-wise add of a max pool and a value.
        let p4 = max(&mut b, "p4", y);
        let add = b.add("add", &[p4, x]);
        // Not: poolings that pool differently in one sum, a pooling read in two sums, one
        // alone in a concatenation's term, one in a sum a depthwise kernel reads, one that
        // another operator reads too.
        let q1 = max(&mut b, "q1", y);
        let q2 = avg(&mut b, "q2", y);
        b.node("mixed", Op::Identity, vec![sum(q1, q2)]);
        let r = avg(&mut b, "r", x);
        b.node("twice", Op::Identity, vec![sum(r, y), sum(r, x)]);
        let s = avg(&mut b, "s", y);
        b.concat("alone", &[s, y]);
        let t = avg(&mut b, "t", y);
        let dw = vec![
            Op::Activation {
                act: Activation::Relu,
            },
            Op::Conv2d(Conv2d::new(4, 3).groups(4)),
        ];
        let reads = b.node("reads", Op::Sequential { ops: dw }, vec![sum(t, x)]);
        let u = avg(&mut b, "u", y);
        b.node("u_sum", Op::Identity, vec![sum(u, x)]);
        b.conv("u_too", u, Conv2d::new(4, 1));
        let g = b.finish().unwrap().with_fusions(Fusions::ALL);
        assert!(depthwise_reads_sum(&g, reads));
        for (p, c) in [(p1, cell), (p2, cell), (p3, cell), (p4, add)] {
            assert_eq!(pool_into_sum(&g, p), Some(c), "{}", g.node(p).name);
        }
        for p in [q1, q2, r, s, t, u] {
            assert_eq!(pool_into_sum(&g, p), None, "{}", g.node(p).name);
        }
        // Without a depthwise kernel reading the sum, its add kernel pools; left out, none.
        let g = g.with_fusions(Fusions::ALL.without("sum-into-depthwise").unwrap());
        assert_eq!(pool_into_sum(&g, t), Some(reads));
        let g = g.with_fusions(Fusions::ALL.without("pool-into-sum").unwrap());
        assert!(pools_into_sums(&g).iter().all(Option::is_none));
    }

    #[test]
    fn a_concatenations_sums_activate_their_slices_as_they_write() {
        let relu_conv = || {
            vec![
                Op::Activation {
                    act: Activation::Relu,
                },
                Op::Conv2d(Conv2d::new(4, 1)),
            ]
        };
        let mut b = GraphBuilder::new("writers", DType::F32);
        let x = b.input("x", vec![1, 4, 6, 6]);
        let convs = |b: &mut GraphBuilder, name: &str| {
            let c: Vec<NodeId> = (0..3)
                .map(|i| b.conv(&format!("{name}{i}"), x, Conv2d::new(4, 3)))
                .collect();
            (c[0], c[1], c[2])
        };
        let sum = |p: NodeId, q: NodeId| vec![Value::whole(p), Value::whole(q)];
        let one = |p: NodeId| vec![Value::whole(p)];
        // NASNet's cell: the left input in place, then a sum; its reduction cell: sums only;
        // two terms that are no sums; a sum whose output is not activated.
        let (l, r, s) = convs(&mut b, "c");
        let cell = b.node("cell", Op::Identity, vec![one(l), sum(r, s)]);
        let (l, r, s) = convs(&mut b, "r");
        let red = b.node("red", Op::Identity, vec![sum(l, r), sum(s, l)]);
        let (l, r, s) = convs(&mut b, "t");
        let two = b.node("two", Op::Identity, vec![one(s), sum(l, r), one(r)]);
        let (l, r, _) = convs(&mut b, "p");
        let plain = b.node("plain", Op::Identity, vec![sum(l, r)]);
        for (v, name) in [(cell, "cell"), (red, "red"), (two, "two")] {
            b.sequential(&format!("{name}_a"), v, relu_conv());
            b.sequential(&format!("{name}_b"), v, relu_conv());
        }
        b.conv("plain_c", plain, Conv2d::new(4, 1));
        // One reader: worth it where the sums activate as they write, not otherwise.
        let (l, r, s) = convs(&mut b, "o");
        let lone = b.node("lone", Op::Identity, vec![one(l), sum(r, s)]);
        b.sequential("lone_a", lone, relu_conv());
        let (l, r, _) = convs(&mut b, "n");
        let no_sum = b.node("no_sum", Op::Identity, vec![one(l), one(r)]);
        b.sequential("no_sum_a", no_sum, relu_conv());
        let g = b.finish().unwrap();
        for v in [cell, red, two, lone] {
            assert!(producer_activation(&g, v).is_some());
        }
        assert_eq!(producer_activation(&g, no_sum), None);
        assert_eq!(act_by_writers(&g, cell), Some(Some(0)));
        assert_eq!(act_by_writers(&g, red), Some(None));
        assert_eq!(act_by_writers(&g, lone), Some(Some(0)));
        assert_eq!(act_by_writers(&g, two), None);
        assert_eq!(act_by_writers(&g, plain), None);
        let g = g.with_fusions(Fusions::ALL.without("act-into-writers").unwrap());
        assert_eq!(act_by_writers(&g, red), None);
        assert!(producer_activation(&g, red).is_some());
        assert_eq!(producer_activation(&g, lone), None);
    }

    #[test]
    fn a_bias_passes_through_pooled_sums_and_an_activated_slice() {
        use crate::Pool2d;
        let relu = || Op::Activation {
            act: Activation::Relu,
        };
        let relu_conv = || vec![relu(), Op::Conv2d(Conv2d::new(4, 1).bias(true))];
        let sep = || {
            vec![
                relu(),
                Op::Conv2d(Conv2d::new(4, 3).groups(4).bias(true)),
                Op::Conv2d(Conv2d::new(4, 1).bias(true)),
            ]
        };
        let mut b = GraphBuilder::new("cell", DType::F32);
        let x = b.input("x", vec![1, 4, 6, 6]);
        let sum = |p: NodeId, q: NodeId| vec![Value::whole(p), Value::whole(q)];
        // NASNet's normal cell: its left input read by a separable convolution, two alike
        // average pools (padding counted) summed, a sum and the cell's output, in place.
        let xl = b.sequential("xl", x, relu_conv());
        let xr = b.sequential("xr", x, relu_conv());
        let s = b.sequential("s", xl, sep());
        let p1 = b.pool("p1", xl, Pool2d::avg(3, 1, 1));
        let p2 = b.pool("p2", xl, Pool2d::avg(3, 1, 1));
        let p3 = b.pool("p3", xr, Pool2d::max(3, 1, 1));
        let cell = b.node(
            "cell",
            Op::Identity,
            vec![vec![Value::whole(xl)], sum(p1, p2), sum(s, xl), sum(p3, s)],
        );
        for side in ["a", "b"] {
            b.sequential(&format!("cell_{side}"), cell, relu_conv());
        }
        // A pooling of its own (a reader reads it twice) adds the bias as it pools too; a
        // 1x1 convolution does not.
        let alone = b.sequential("alone", x, relu_conv());
        let q = b.pool("q", alone, Pool2d::max(3, 1, 1));
        b.node("q_sums", Op::Identity, vec![sum(q, x), sum(q, alone)]);
        let kept = b.sequential("kept", x, relu_conv());
        b.pool("kept_pool", kept, Pool2d::max(3, 1, 1));
        b.conv("kept_conv", kept, Conv2d::new(4, 1));
        let g = b.finish().unwrap();
        assert_eq!(act_by_writers(&g, cell), Some(Some(0)));
        // The inner index of the convolution: last of each chain.
        for (v, inner) in [(xl, 1), (xr, 1), (s, 2)] {
            assert_eq!(deferred_bias(&g, v), Some(inner), "{}", g.node(v).name);
        }
        assert_eq!(pool_into_sum(&g, q), None);
        assert_eq!(deferred_bias(&g, alone), Some(1));
        assert_eq!(deferred_bias(&g, kept), None);
        // Left out, the poolings keep the biases; without the slice's activation, xl's; not
        // pooled by the sums, the poolings still add them.
        let without = |name: &str| g.clone().with_fusions(Fusions::ALL.without(name).unwrap());
        let g = without("bias-into-pools");
        assert!([xl, xr, alone]
            .iter()
            .all(|&v| deferred_bias(&g, v).is_none()));
        let g = without("act-into-writers");
        assert_eq!(deferred_bias(&g, xl), None);
        assert!(deferred_bias(&g, xr).is_some());
        let g = without("pool-into-sum");
        assert!([xl, xr, alone]
            .iter()
            .all(|&v| deferred_bias(&g, v).is_some()));
    }

    #[test]
    fn a_concatenation_of_convolutions_passes_their_biases_on() {
        use crate::Pool2d;
        let relu_conv = |out: usize| {
            vec![
                Op::Activation {
                    act: Activation::Relu,
                },
                Op::Conv2d(Conv2d::new(out, 1).stride(2).bias(true)),
            ]
        };
        let sep = || {
            vec![
                Op::Activation {
                    act: Activation::Relu,
                },
                Op::Conv2d(Conv2d::new(4, 3).groups(4).bias(true)),
                Op::Conv2d(Conv2d::new(4, 1).bias(true)),
            ]
        };
        let mut b = GraphBuilder::new("paths", DType::F32);
        let x = b.input("x", vec![1, 4, 8, 8]);
        let one = |v: NodeId| vec![Value::whole(v)];
        let path = |b: &mut GraphBuilder, name: &str| {
            let p1 = b.sequential(&format!("{name}1"), x, relu_conv(2));
            let p2 = b.sequential(&format!("{name}2"), x, relu_conv(2));
            let p = b.node(name, Op::Identity, vec![one(p1), one(p2)]);
            (p, p1, p2)
        };
        // NASNet's factorized reduction: read by a separable convolution, a pooling and a sum.
        let (p, p1, p2) = path(&mut b, "p");
        let s = b.sequential("s", p, sep());
        let q = b.pool("q", p, Pool2d::avg(3, 1, 1));
        b.node(
            "sums",
            Op::Identity,
            vec![vec![Value::whole(s), Value::whole(q)]],
        );
        b.node(
            "sum_p",
            Op::Identity,
            vec![vec![Value::whole(p), Value::whole(s)]],
        );
        // Read by a 1x1 convolution, which adds no bias as it reads.
        let (k, k1, _) = path(&mut b, "k");
        b.conv("k_conv", k, Conv2d::new(4, 1));
        // A term read by another operator too.
        let (t, t1, t2) = path(&mut b, "t");
        b.sequential("t_sep", t, sep());
        b.pool("t1_pool", t1, Pool2d::max(3, 1, 1));
        let g = b.finish().unwrap();
        assert!(passed_bias(&g, p));
        assert_eq!(deferred_bias(&g, p1), Some(1));
        assert_eq!(deferred_bias(&g, p2), Some(1));
        for (c, v) in [(k, k1), (t, t2)] {
            assert!(!passed_bias(&g, c), "{}", g.node(c).name);
            assert_eq!(deferred_bias(&g, v), None, "{}", g.node(v).name);
        }
        // Nor t1, whose pooling would add it, but not t.
        assert!(deferred_bias(&g, t1).is_none());
        let g = g.with_fusions(Fusions::ALL.without("bias-through-concat").unwrap());
        assert!(!passed_bias(&g, p));
        assert_eq!(deferred_bias(&g, p1), None);
    }

    #[test]
    fn fusions_are_named_once_and_left_out_by_name() {
        assert_eq!(Fusions::default(), Fusions::DEFAULT);
        assert_eq!(Fusions::DEFAULT.left_out(), ["sum-into-depthwise"]);
        assert_eq!(
            Fusions::DEFAULT.with("sum-into-depthwise"),
            Some(Fusions::ALL)
        );
        assert!(Fusions::ALL.left_out().is_empty());
        let mut f = Fusions::ALL;
        for (i, (name, _)) in Fusions::NAMES.iter().enumerate() {
            f = f.without(name).unwrap();
            let names: Vec<&str> = Fusions::NAMES[..=i].iter().map(|(n, _)| *n).collect();
            assert_eq!(f.left_out(), names);
        }
        assert_eq!(
            f,
            Fusions {
                bias_into_adds: false,
                bias_into_depthwise: false,
                sum_into_depthwise: false,
                act_into_producer: false,
                pool_into_sum: false,
                act_into_writers: false,
                bias_into_pools: false,
                bias_through_concat: false,
            }
        );
        assert_eq!(Fusions::ALL.without("bias"), None);
        assert_eq!(Fusions::ALL.with("bias"), None);
        // Put back one by one, all of them again.
        let back = Fusions::NAMES
            .iter()
            .try_fold(f, |f, (name, _)| f.with(name));
        assert_eq!(back, Some(Fusions::ALL));
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
