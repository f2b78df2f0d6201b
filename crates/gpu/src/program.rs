//! Lowering of graph operators to *steps*: the primitive kernels the GPU executes (and the CPU
//! step executor replays), with every buffer sized and placed before anything runs.
//!
//! A [`GraphProgram`] is built once per placement of the operators on (logical) GPUs. It holds
//! - [`BufSpec`]s: every device buffer, with its GPU, its length in elements and how it is
//!   initialised (graph inputs and parameters get deterministic pseudo-random data, keyed by the
//!   node's name, so a scheduled run, a sequential run and the CPU reference see the same
//!   numbers), and its place in its GPU's storage ([`crate::memory`]: a producer of a
//!   concatenation's input may write straight into its slice of the output, and a layout may
//!   let buffers share storage);
//! - per operator an [`OpProgram`]: the ordered [`Step`]s that compute its output on its GPU
//!   (the kinds and how each IR operator lowers to them live in [`crate::step`]).
//!
//! ## Inputs: terms and values
//! An operator's input terms are materialised with [`Copy`](struct@Copy) steps (a strided slab copy that can
//! also accumulate): a value that is a channel slice becomes a copy of channels `[b, e)` along
//! axis 1; a term that sums several values becomes a copy followed by accumulating copies; the
//! terms of a concat-like input are copied side by side along the concat axis. A term that is
//! one whole value is read in place (no copy). A value whose producer runs on another GPU is
//! read from that transfer's *replica* buffer on the consumer's GPU.
//!
//! ## Layouts
//! Tensors are dense row-major (NCHW for images). Convolution weights are `[oc, c/groups, kh,
//! kw]`; linear weights `[out, in]` (PyTorch's); layer norm has `gamma` and `beta` of the last
//! dimension. Matrix products are expressed as column-major cuBLAS calls ([`Step::Gemm`]):
//! see [`crate::step::gemm`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use opsched_graph::{Activation, Conv2d, Graph, NodeId, Op, Shape, Value};
use serde::Serialize;

use crate::step::{self, copy::Copy, elementwise::ChannelBias, Step};
use crate::GpuError;

/// Index of a buffer in [`GraphProgram::buffers`].
pub type BufId = usize;

/// What a buffer holds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum BufRole {
    /// A graph input or a constant (one copy per GPU that reads it).
    Input(NodeId),
    /// An operator's output.
    Output(NodeId),
    /// A parameter of an operator (`what`: "weight", "bias", "gamma", "beta"; `inner` is the
    /// index inside a `sequential` operator, 0 otherwise).
    Param {
        node: NodeId,
        inner: usize,
        what: &'static str,
    },
    /// Temporary storage of an operator (gathered inputs, intermediate results of a
    /// `sequential` chain).
    Scratch(NodeId),
    /// The copy of `src`'s output that a transfer delivers to `dst`'s GPU.
    Replica { src: NodeId, dst: NodeId },
    /// A buffer of a timing probe (no operator).
    Probe,
}

/// How a buffer is filled before the first run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Init {
    /// Written by the program before it is read.
    Uninit,
    /// Given values (a model's weights, a user's input), exactly the buffer's length.
    #[serde(skip)]
    Data(Arc<[f32]>),
    /// Uniform in `[center - half_width, center + half_width]`, from a seed.
    Uniform {
        seed: u64,
        center: f32,
        half_width: f32,
    },
    /// Integers uniform in `[0, below)`, from a seed: the indices of an embedding table.
    Indices { seed: u64, below: usize },
}

impl Init {
    /// The values of a buffer of `len` elements that starts as this (`None`: uninitialised).
    pub fn values(&self, len: usize) -> Option<Vec<f32>> {
        match *self {
            Init::Uninit => None,
            Init::Data(ref d) => Some(d.to_vec()),
            Init::Uniform {
                seed,
                center,
                half_width,
            } => Some(uniform(seed, len, center, half_width)),
            Init::Indices { seed, below } => Some(indices(seed, len, below)),
        }
    }
}

/// How graph input `id` starts unless the caller gives its values: uniform in [-1, 1], or
/// where an embedding reads it, indices of the smallest table that does.
pub fn input_init(g: &Graph, id: NodeId) -> Init {
    let seed = input_seed(g, id);
    let tables = g.succs(id).filter_map(|s| match g.node(s).op {
        Op::Embedding { rows, .. } => Some(rows),
        _ => None,
    });
    match tables.min() {
        Some(below) => Init::Indices { seed, below },
        None => Init::Uniform {
            seed,
            center: 0.0,
            half_width: 1.0,
        },
    }
}

/// A device buffer of `f32` elements.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BufSpec {
    pub gpu: usize,
    pub len: usize,
    pub role: BufRole,
    pub init: Init,
    /// First element in the storage of its logical GPU ([`GraphProgram::storage`]); set by a
    /// layout of [`crate::memory`].
    pub offset: usize,
    /// It is a part of another buffer, from the given element on: an operator writing its slice
    /// of a concatenation in place (see [`crate::memory`]).
    pub within: Option<(BufId, usize)>,
    /// A view whose elements are not contiguous in its parent ([`Runs`]): a convolution's,
    /// pooling's or sum's slice of a concatenation at batch > 1. Nothing is a view of such a
    /// buffer.
    pub runs: Option<Runs>,
    /// Its storage holds other buffers while it is dead, so its value is gone after a run.
    pub reused: bool,
}

impl BufSpec {
    /// A buffer of its own, not yet laid out.
    pub fn new(gpu: usize, len: usize, role: BufRole, init: Init) -> BufSpec {
        BufSpec {
            gpu,
            len,
            role,
            init,
            offset: 0,
            within: None,
            runs: None,
            reused: false,
        }
    }

    /// Elements from its first to its last in its parent, both included (its length, unless
    /// it is strided).
    pub fn span(&self) -> usize {
        match self.runs {
            Some(r) => r.span(self.len),
            None => self.len,
        }
    }
}

/// Where a strided view's elements lie in its parent: runs of `run` elements, `stride`
/// elements apart, the first at the view's offset (element `i` at `(i / run) * stride + i %
/// run`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Runs {
    pub run: usize,
    pub stride: usize,
}

impl Runs {
    /// Elements from the first to the last of a view of `len` elements, both included.
    pub fn span(&self, len: usize) -> usize {
        match len.div_ceil(self.run.max(1)) {
            0 => 0,
            rows => (rows - 1) * self.stride + (len - (rows - 1) * self.run),
        }
    }

    /// The storage ranges that hold elements `part` of a buffer of `len` elements whose first
    /// is element `first` of its storage, in order: one range, or one per run it touches
    /// where `runs` makes it a strided view.
    pub fn storage(
        first: usize,
        len: usize,
        runs: Option<Runs>,
        part: std::ops::Range<usize>,
    ) -> Vec<std::ops::Range<usize>> {
        let part = part.start.min(len)..part.end.min(len);
        let shift = |r: std::ops::Range<usize>| first + r.start..first + r.end;
        match runs {
            Some(runs) => runs.ranges(part).map(shift).collect(),
            None => std::iter::once(shift(part)).collect(),
        }
    }

    /// The ranges of its parent (from the view's first element) that hold the view's
    /// elements `part`, in order.
    pub fn ranges(
        &self,
        part: std::ops::Range<usize>,
    ) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        let run = self.run.max(1);
        let rows = part.start / run..part.end.div_ceil(run);
        rows.filter_map(move |r| {
            let (lo, hi) = (part.start.max(r * run), part.end.min((r + 1) * run));
            (lo < hi).then(|| r * self.stride + lo - r * run..r * self.stride + hi - r * run)
        })
    }
}

/// The steps of one operator, run in order on one stream of its GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OpProgram {
    /// The operator's node name (for errors and traces).
    pub name: String,
    pub gpu: usize,
    pub steps: Vec<Step>,
    /// Its output buffer.
    pub output: BufId,
}

/// A transfer of `src`'s output to the GPU of its consumer `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TransferSpec {
    pub src: NodeId,
    pub dst: NodeId,
    pub dst_gpu: usize,
}

/// Every buffer and every operator's steps, for one placement of the operators on GPUs.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GraphProgram {
    pub buffers: Vec<BufSpec>,
    /// Per node (indexed by `NodeId`): the program of an operator, `None` for graph inputs and
    /// for operators the placement leaves out.
    pub ops: Vec<Option<OpProgram>>,
    /// Per transfer (in the order given to [`GraphProgram::build`]): (source buffer on the
    /// producer's GPU, replica buffer on the consumer's GPU).
    pub transfers: Vec<(BufId, BufId)>,
    /// Per node: the buffer that holds its value after a run, on its own GPU (graph inputs: the
    /// copy on the lowest GPU that reads it). `None` for an element-wise operator whose kernel
    /// writes its activation's value instead, and for a convolution or linear layer that writes
    /// the residual sum it feeds ([`opsched_graph::fusion`]).
    pub outputs: Vec<Option<BufId>>,
    /// Number of GPUs the buffers span.
    pub gpus: usize,
    /// Per logical GPU: the elements of storage its buffers are laid out in (see
    /// [`crate::memory`]).
    pub storage: Vec<usize>,
    /// The merged groups of convolutions (or of linear layers) that run as one convolution
    /// (one product), each in its order (see [`GraphProgram::build_merged`]).
    pub merged: Vec<Vec<NodeId>>,
    /// How it stores 4-D activations.
    pub layout: Layout,
    /// Per node: its value is stored channels last ([`Layout::Nhwc`]; `outputs` hold it so).
    pub channels_last: Vec<bool>,
    /// Kernels that convert values between NCHW and NHWC ([`Layout::Nhwc`]): the transposes,
    /// and the gather of a strided view before its transpose.
    pub layout_conversions: usize,
}

/// How 4-D activations are stored (defined beside the cost cache's keys, which record it:
/// [`opsched_cost::signature::measured_in`]).
pub use opsched_cost::Layout;

/// The layout a CUDA device stores activations in unless told otherwise
/// ([`crate::Device::preferred_layout`]): channels last ran every CNN measured on an H100
/// faster (2026-11-27). Measured costs are looked up in it by default, since the cost cache's
/// device presets are GPUs.
pub const CUDA_LAYOUT: Layout = Layout::Nhwc;

/// Which operators' values a program with [`Layout::Nhwc`] stores channels last: a
/// convolution that cuDNN runs (one group, symmetric padding) or our depthwise kernel runs,
/// reading one whole value or one sum of whole values; a `sequential` operator of such
/// convolutions, activations and pools, reading the same, where it has a convolution or reads
/// a channels-last value (NASNet's and RandWire's relu + separable convolution); and, where it
/// reads at least one channels-last value and only whole values, an element-wise operator (no
/// broadcasting; not one whose fused activation is a graph output) or activation of 4-D
/// values, a pooling or resize, a concatenation of several terms
/// along channels (a branch that may write a strided slice writes its own in place, a run of
/// channels per pixel; the others are copied), and IOS's identity of terms that are whole
/// values or sums of them (NASNet's cell outputs); never a graph output.
pub fn channels_last(g: &Graph) -> Vec<bool> {
    let mut nhwc = vec![false; g.len()];
    let outputs: HashSet<NodeId> = g.outputs().iter().map(|o| o.value.node).collect();
    for &id in g.topo_order() {
        let node = g.node(id);
        let four = node.shape.len() == 4;
        let whole = node
            .inputs
            .iter()
            .all(|t| matches!(t.as_slice(), [v] if v.channels.is_none()));
        let no_slices = node.inputs.iter().flatten().all(|v| v.channels.is_none());
        let reads_nhwc = node.inputs.iter().flatten().any(|v| nhwc[v.node.index()]);
        let same_shape = || {
            g.input_shapes(id)
                .iter()
                .all(|s| s.as_slice() == node.shape.as_slice())
        };
        let terms = node.inputs.len();
        // IOS's identity of one term that sums whole values: one add.
        let one_sum = matches!(node.inputs.as_slice(), [t] if t.len() > 1
            && t.iter().all(|v| v.channels.is_none()));
        // One input: a whole value, or a sum of them (one add, whatever the layout).
        let one_input = terms == 1 && (whole || one_sum);
        let input = || g.input_shapes(id).into_iter().next().unwrap_or_default();
        let kind = match &node.op {
            Op::Conv2d(_) => one_input && kernel_channels_last(&node.op, &input()),
            Op::Sequential { ops } => {
                let convolves = ops.iter().any(|o| matches!(o, Op::Conv2d(_)));
                one_input && (convolves || reads_nhwc) && chain_channels_last(ops, input())
            }
            // An element-wise operator whose activation is fused into it stores its value as
            // that activation does (a graph output's is NCHW), so the fusion holds.
            Op::Elementwise { .. } => {
                let fused_output = g.succs(id).any(|a| {
                    outputs.contains(&a) && opsched_graph::fusion::fused_source(g, a) == Some(id)
                });
                whole && reads_nhwc && same_shape() && !fused_output
            }
            Op::Activation { .. } => whole && reads_nhwc && same_shape(),
            Op::Pool2d(_) | Op::Resize(_) => whole && reads_nhwc && terms == 1,
            // A concatenation along channels copies channels-last values as they are.
            Op::Concat { axis: 1 } => whole && reads_nhwc && terms > 1,
            // Terms of whole values or sums of them: each sum one add writing its slice (a run
            // of channels per pixel).
            Op::Identity => reads_nhwc && ((no_slices && terms > 1) || (one_sum && same_shape())),
            _ => false,
        };
        nhwc[id.index()] = four && kind && !outputs.contains(&id);
    }
    nhwc
}

/// Whether operator `op` (not a `sequential` one) reading one value of shape `input` has a
/// channels-last kernel: a convolution that cuDNN runs (one group, symmetric padding) or our
/// depthwise kernel runs, an activation, a pooling.
fn kernel_channels_last(op: &Op, input: &[usize]) -> bool {
    match op {
        Op::Conv2d(c) => {
            let (before, after) = c.pads();
            let depthwise = input
                .get(1)
                .is_some_and(|&ch| opsched_graph::fusion::is_depthwise(c, ch));
            (c.groups == 1 && before == after) || depthwise
        }
        Op::Activation { .. } | Op::Pool2d(_) => true,
        _ => false,
    }
}

/// Whether every operator of a `sequential` chain reading `input` has a channels-last kernel
/// ([`kernel_channels_last`]) and every value along it is 4-D.
fn chain_channels_last(ops: &[Op], mut input: Vec<usize>) -> bool {
    for op in ops {
        if input.len() != 4 || !kernel_channels_last(op, &input) {
            return false;
        }
        match op.infer_shape(std::slice::from_ref(&input)) {
            Ok(s) => input = s,
            Err(_) => return false,
        }
    }
    input.len() == 4
}

/// Where `[n, c, h, w]` values sit in channels-last order (`[n, h, w, c]`): the permutation
/// from NCHW to NHWC, and back.
const TO_NHWC: [usize; 4] = [0, 2, 3, 1];
const TO_NCHW: [usize; 4] = [0, 3, 1, 2];

/// `x` (NHWC values of NCHW shape `shape`) in NCHW order.
pub fn nhwc_to_nchw(x: &[f32], shape: [usize; 4]) -> Vec<f32> {
    let [n, c, h, w] = shape;
    let mut y = vec![0.0; x.len().min(n * c * h * w)];
    step::transpose::permute_into(x, &[n, h, w, c], &TO_NCHW, &mut y);
    y
}

/// `x` (NCHW values of shape `shape`) in NHWC order, into `y`.
pub fn nchw_to_nhwc(x: &[f32], shape: [usize; 4], y: &mut [f32]) {
    step::transpose::permute_into(x, &shape, &TO_NHWC, y);
}

/// `f` (NCHW values of `in_shape` in, of `out_shape` out) run on channels-last `x` into
/// channels-last `y`, between two transposes: how the CPU runs a channels-last kernel, so that
/// both layouts give the same values.
pub(crate) fn through_nchw<E>(
    x: &[f32],
    in_shape: [usize; 4],
    y: &mut [f32],
    out_shape: [usize; 4],
    f: impl FnOnce(&[f32], &mut [f32]) -> Result<(), E>,
) -> Result<(), E> {
    let xc = nhwc_to_nchw(x, in_shape);
    let mut yc = vec![0.0; out_shape.iter().product()];
    f(&xc, &mut yc)?;
    nchw_to_nhwc(&yc, out_shape, y);
    Ok(())
}

/// FNV-1a 64 of a string ([`opsched_cost::cache::fnv1a64`]): the seed of a named buffer.
pub fn seed_of(text: &str) -> u64 {
    opsched_cost::cache::fnv1a64(text.as_bytes())
}

/// The seed of parameter `what` of operator `inner` of `node` (see [`BufRole::Param`]).
pub fn param_seed(g: &Graph, node: NodeId, inner: usize, what: &str) -> u64 {
    seed_of(&format!("{}#{inner}#{what}", g.node(node).name))
}

/// The seed of a graph input's data.
pub fn input_seed(g: &Graph, node: NodeId) -> u64 {
    seed_of(&format!("{}#input", g.node(node).name))
}

/// Weights are uniform in `[-a, a]` with `a = sqrt(3 / fan_in)` (variance `1 / fan_in`), so
/// activations keep their scale through deep stacks.
pub fn weight_half_width(fan_in: usize) -> f32 {
    (3.0 / fan_in.max(1) as f32).sqrt()
}

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

fn unsupported(g: &Graph, node: NodeId, message: impl Into<String>) -> GpuError {
    GpuError::Unsupported {
        node: g.node(node).name.clone(),
        message: message.into(),
    }
}

/// A source of an operator's input: the node's own terms, or one buffer of a given shape
/// (the previous result inside a `sequential` chain).
#[derive(Clone, Copy)]
pub(crate) enum Src<'a> {
    Terms(&'a [Vec<Value>]),
    Buf(BufId, &'a [usize]),
}

/// Where a lowering happens: the operator's node, its GPU, and the index of the primitive
/// inside a `sequential` operator (0 otherwise; it keys parameters).
#[derive(Clone, Copy, Debug)]
pub(crate) struct At {
    pub node: NodeId,
    pub gpu: usize,
    pub inner: usize,
}

/// A batch matmul's operand: its buffer, its shape, and, when it is read in place through a
/// head transpose ([`Builder::fold_transposes`]), its row, matrix (head) and sequence strides
/// (else it is dense).
pub(crate) struct Operand {
    pub buf: BufId,
    pub shape: Shape,
    pub strides: Option<(usize, usize, usize)>,
}

/// The strides of the matrices `[a, d]` of a head transpose's output `[n, b, a, d]` in the
/// untransposed tensor `[n, a, b, d]`: rows `b * d` apart, heads `d` apart, sequences
/// `a * b * d` apart.
fn head_strides(shape: &[usize]) -> Option<(usize, usize, usize)> {
    match shape {
        [_, b, a, d] => Some((b * d, *d, a * b * d)),
        _ => None,
    }
}

/// Whether a transfer sends `n`'s output (from a buffer of its own).
fn sent(transfers: &[TransferSpec], n: NodeId) -> bool {
    transfers.iter().any(|t| t.src == n)
}

/// Builds a [`GraphProgram`]: buffers, input gathering, and the lowering of each operator
/// (delegated to [`crate::step`]).
pub(crate) struct Builder<'g> {
    g: &'g Graph,
    /// GPU of each operator node (None: not placed, or a graph input).
    placement: &'g [Option<usize>],
    buffers: Vec<BufSpec>,
    outputs: Vec<Option<BufId>>,
    /// (input node, gpu) -> buffer.
    input_copies: HashMap<(NodeId, usize), BufId>,
    /// (producer, consumer) -> replica buffer.
    replicas: HashMap<(NodeId, NodeId), BufId>,
    /// Element-wise operator -> the activation its kernel also applies, and the activations
    /// so applied (which have no steps): see [`Builder::fuse_activations`].
    epilogues: HashMap<NodeId, Activation>,
    fused: HashSet<NodeId>,
    /// Convolution or linear layer -> the residual it adds and the activation it then applies,
    /// for the sums it computes (which join `fused`): see [`Builder::fuse_residuals`].
    residuals: HashMap<NodeId, (NodeId, Activation)>,
    /// Convolution -> the inner index of its convolution whose bias its readers add, and the
    /// (producer, reader) pairs where a reader's lowering added it: see
    /// [`Builder::defer_biases`].
    deferred: HashMap<NodeId, usize>,
    added_bias: HashSet<(NodeId, NodeId)>,
    /// Concatenations that pass their terms' biases on to their readers (the terms are in
    /// `deferred`): see [`Builder::defer_biases`].
    passed: HashSet<NodeId>,
    /// Operator -> the activation its steps apply in place to its value after computing it,
    /// and the readers that skip it: see [`Builder::activate_by_producers`].
    producer_acts: HashMap<NodeId, Activation>,
    activated_readers: HashSet<NodeId>,
    /// Poolings that the add kernel of their reader computes: see [`Builder::fuse_pools`].
    pooled: HashSet<NodeId>,
    /// Concatenations activated for their readers whose sums' add kernels apply the
    /// activation, with the one term activated in place after them, if any: see
    /// [`Builder::activate_by_producers`].
    writers_act: HashMap<NodeId, Option<usize>>,
    /// Head transpose -> the value batch matmuls read through it with strides, and batch
    /// matmul -> the head transpose it writes: see [`Builder::fold_transposes`].
    transposed_reads: HashMap<NodeId, NodeId>,
    transposed_writes: HashMap<NodeId, NodeId>,
    /// First convolution of a group a plan merges -> the one convolution the group runs as:
    /// see [`Builder::merge_stages`].
    merged: HashMap<NodeId, MergedConv>,
    /// First linear layer of a group a plan merges -> the one linear layer the group runs as.
    merged_linear: HashMap<NodeId, MergedLinear>,
    /// Per node: its value is stored channels last ([`channels_last`]).
    nhwc: Vec<bool>,
    /// Operator -> its value in the other layout, made by a transpose its own program runs
    /// after its steps (`conversions`), for the readers that want that layout.
    other_layout: HashMap<NodeId, BufId>,
    conversions: HashMap<NodeId, Vec<Step>>,
    /// Transposes between the layouts (the producers' and the readers' own).
    layout_conversions: usize,
}

/// Where a merged convolution's member lies in the merged output: from element `at` (of its
/// first row), `len` elements, one run per row where there are several
/// ([`Builder::merge_rows`]: images in NCHW, pixels channels last).
#[derive(Clone, Copy, Debug)]
struct MemberView {
    at: usize,
    len: usize,
    runs: Option<Runs>,
}

/// Convolutions of a merged stage that run as one convolution (IOS's operator merge,
/// [`opsched_graph::merge`]): `conv` writes `out`, whose channel slices are the members'
/// outputs, in the members' order.
#[derive(Clone, Debug)]
pub(crate) struct MergedConv {
    pub conv: Conv2d,
    pub members: Vec<(NodeId, Conv2d)>,
    pub out: BufId,
    /// Output `[oh, ow]`.
    pub out_hw: [usize; 2],
}

/// Linear layers of a merged stage that run as one (IOS's operator merge applied to products,
/// [`opsched_graph::merge::merged_linear`]): the product writes `out`, each of whose rows holds
/// the members' features side by side, in the members' order.
#[derive(Clone, Debug)]
pub(crate) struct MergedLinear {
    pub out_features: usize,
    pub bias: bool,
    pub act: Activation,
    /// Each member and its output features.
    pub members: Vec<(NodeId, usize)>,
    pub out: BufId,
}

impl<'g> Builder<'g> {
    fn alloc(&mut self, gpu: usize, len: usize, role: BufRole, init: Init) -> BufId {
        self.buffers.push(BufSpec::new(gpu, len.max(1), role, init));
        self.buffers.len() - 1
    }

    /// The GPU `n` runs on (`None`: a graph input, or not placed).
    fn gpu_of(&self, n: NodeId) -> Option<usize> {
        self.placement.get(n.index()).copied().flatten()
    }

    /// Temporary storage of the operator at `at`.
    pub(crate) fn scratch(&mut self, at: At, len: usize) -> BufId {
        self.alloc(at.gpu, len, BufRole::Scratch(at.node), Init::Uninit)
    }

    /// A parameter buffer of the operator at `at`: the graph's weight when it has one (same
    /// layout, see `opsched_graph::weights`), else pseudo-random values uniform in
    /// `[center - half_width, center + half_width]` (see the module docs).
    pub(crate) fn param(
        &mut self,
        at: At,
        what: &'static str,
        len: usize,
        center: f32,
        half_width: f32,
    ) -> Result<BufId, GpuError> {
        let init = self.param_init(at, what, len, center, half_width)?;
        Ok(self.param_buffer(at, what, len, init))
    }

    /// A parameter buffer of `len` elements of the operator at `at` that starts as `init`.
    pub(crate) fn param_buffer(
        &mut self,
        at: At,
        what: &'static str,
        len: usize,
        init: Init,
    ) -> BufId {
        let role = BufRole::Param {
            node: at.node,
            inner: at.inner,
            what,
        };
        self.alloc(at.gpu, len, role, init)
    }

    /// How the bias (`len` values) of the operator at `at` starts ([`Builder::param_init`]): in
    /// one place, so that a merged stage and the readers a bias is left to take the values the
    /// operator's own lowering gives it.
    pub(crate) fn bias_init(&self, at: At, len: usize) -> Result<Init, GpuError> {
        self.param_init(at, "bias", len, 0.0, 0.1)
    }

    /// The bias parameter (`len` values) of the operator at `at` ([`Builder::bias_init`]).
    pub(crate) fn bias_param(&mut self, at: At, len: usize) -> Result<BufId, GpuError> {
        let init = self.bias_init(at, len)?;
        Ok(self.param_buffer(at, "bias", len, init))
    }

    /// A merged stage's member's weights (`wlen` of them, of fan-in `fan_in`) and its `bias`
    /// biases (none: empty), the values its own lowering would have ([`Builder::param_init`]).
    pub(crate) fn member_params(
        &self,
        at: At,
        wlen: usize,
        fan_in: usize,
        bias: Option<usize>,
    ) -> Result<(Vec<f32>, Vec<f32>), GpuError> {
        let init = self.param_init(at, "weight", wlen, 0.0, weight_half_width(fan_in))?;
        let w = init.values(wlen).unwrap_or_default();
        let b = match bias {
            Some(n) => self.bias_init(at, n)?.values(n).unwrap_or_default(),
            None => Vec::new(),
        };
        Ok((w, b))
    }

    /// How [`Builder::param`] fills the parameter (also what a merged convolution's weights
    /// are made of, [`Init::values`]).
    pub(crate) fn param_init(
        &self,
        at: At,
        what: &'static str,
        len: usize,
        center: f32,
        half_width: f32,
    ) -> Result<Init, GpuError> {
        Ok(match self.g.weights().get(at.node, at.inner, what) {
            // `Graph::with_weights` checked the shape against the operator; a length that still
            // differs would be a lowering that disagrees with the weights' layout.
            Some(t) if t.numel() != len => {
                return Err(self.unsupported(
                    at,
                    format!(
                        "weight '{what}' holds {} values, the lowering needs {len}",
                        t.numel()
                    ),
                ))
            }
            Some(t) => Init::Data(t.data.clone()),
            None => Init::Uniform {
                seed: param_seed(self.g, at.node, at.inner, what),
                center,
                half_width,
            },
        })
    }

    /// The error for an operator this lowering cannot run.
    pub(crate) fn unsupported(&self, at: At, message: impl Into<String>) -> GpuError {
        unsupported(self.g, at.node, message)
    }

    /// `s` as `[n, c, h, w]`, or an error naming the operator.
    pub(crate) fn four(&self, at: At, s: &[usize]) -> Result<[usize; 4], GpuError> {
        match s {
            [a, b, c, d] => Ok([*a, *b, *c, *d]),
            _ => Err(self.unsupported(at, format!("expects a 4-D tensor, got {s:?}"))),
        }
    }

    /// The buffer holding `producer`'s whole output as seen by `consumer` on `gpu`.
    /// Whether `n`'s value is 4-D of one pixel per channel, which both layouts store alike.
    fn one_pixel(&self, n: NodeId) -> bool {
        matches!(self.g.node(n).shape.as_slice(), [_, _, h, w] if h * w == 1)
    }

    /// Whether buffer `b` is a strided view ([`Runs`]).
    pub(crate) fn is_strided(&self, b: BufId) -> bool {
        self.buffers[b].runs.is_some()
    }

    /// The graph being lowered.
    pub(crate) fn graph(&self) -> &'g Graph {
        self.g
    }

    /// Whether node `n`'s value is stored channels last ([`Layout::Nhwc`]).
    pub(crate) fn channels_last_at(&self, n: NodeId) -> bool {
        self.nhwc.get(n.index()).copied().unwrap_or(false)
    }

    /// The buffer holding `producer`'s value for the operator at `at`, in that operator's
    /// layout ([`Layout`]): where the two differ (a 4-D value of more than one pixel), the
    /// value in the other layout, which the producer's program makes once (a graph input, or a
    /// value from another GPU: the reader's program, for itself).
    pub(crate) fn source(
        &mut self,
        steps: &mut Vec<Step>,
        at: At,
        producer: NodeId,
    ) -> Result<BufId, GpuError> {
        let raw = self.raw_source(producer, at.node, at.gpu)?;
        let have = self.nhwc[producer.index()];
        let want = self.nhwc[at.node.index()];
        let shape = &self.g.node(producer).shape;
        let &[n, c, h, w] = shape.as_slice() else {
            return Ok(raw);
        };
        if have == want || h * w <= 1 {
            return Ok(raw);
        }
        let (in_shape, perm) = match have {
            true => (vec![n, h, w, c], TO_NCHW),
            false => (vec![n, c, h, w], TO_NHWC),
        };
        let len = n * c * h * w;
        let own = !self.g.node(producer).op.is_input() && self.gpu_of(producer) == Some(at.gpu);
        if !own {
            let y = self.scratch(at, len);
            steps.push(step::transpose::Transpose::of(raw, y, in_shape, &perm).into());
            self.layout_conversions += 1;
            return Ok(y);
        }
        if let Some(&b) = self.other_layout.get(&producer) {
            return Ok(b);
        }
        let y = self.alloc(at.gpu, len, BufRole::Scratch(producer), Init::Uninit);
        let mut convert = Vec::with_capacity(2);
        // A strided view (a merged convolution's member, channels last) is gathered first:
        // the transpose reads dense values.
        let src = match self.buffers[raw].runs {
            Some(r) => {
                let dense = self.alloc(at.gpu, len, BufRole::Scratch(producer), Init::Uninit);
                convert.push(Copy::gather(raw, dense, len, r.run).into());
                dense
            }
            None => raw,
        };
        convert.push(step::transpose::Transpose::of(src, y, in_shape, &perm).into());
        self.layout_conversions += convert.len();
        self.conversions
            .entry(producer)
            .or_default()
            .extend(convert);
        self.other_layout.insert(producer, y);
        Ok(y)
    }

    /// The buffer that holds `producer`'s value where `consumer` on `gpu` reads it, as the
    /// producer stores it.
    fn raw_source(
        &mut self,
        producer: NodeId,
        consumer: NodeId,
        gpu: usize,
    ) -> Result<BufId, GpuError> {
        let pn = self.g.node(producer);
        if pn.op.is_input() {
            if let Some(&b) = self.input_copies.get(&(producer, gpu)) {
                return Ok(b);
            }
            let len = numel(&pn.shape);
            // A constant holds its value from the weights (only constants have a "value":
            // `Graph::with_weights` checks parameters against the operator); a graph input, and
            // a constant without one, starts pseudo-random until the caller writes it.
            let init = match self.g.weights().get(producer, 0, "value") {
                Some(t) if t.numel() != len => {
                    return Err(unsupported(
                        self.g,
                        consumer,
                        format!(
                            "constant '{}' holds {} values, its shape needs {len}",
                            pn.name,
                            t.numel()
                        ),
                    ))
                }
                Some(t) => Init::Data(t.data.clone()),
                None => input_init(self.g, producer),
            };
            let b = self.alloc(gpu, len, BufRole::Input(producer), init);
            self.input_copies.insert((producer, gpu), b);
            return Ok(b);
        }
        match self.gpu_of(producer) {
            Some(pg) if pg == gpu => self.outputs[producer.index()].ok_or_else(|| {
                unsupported(
                    self.g,
                    consumer,
                    format!("input '{}' has no buffer", pn.name),
                )
            }),
            Some(_) => self
                .replicas
                .get(&(producer, consumer))
                .copied()
                .ok_or_else(|| {
                    unsupported(
                        self.g,
                        consumer,
                        format!(
                            "input '{}' runs on another GPU and no transfer brings it here",
                            pn.name
                        ),
                    )
                }),
            None => Err(unsupported(
                self.g,
                consumer,
                format!("input '{}' is not placed on any GPU", pn.name),
            )),
        }
    }

    pub(crate) fn value_shape(&self, v: &Value) -> Shape {
        let mut s = self.g.node(v.node).shape.clone();
        if let (Some((b, e)), Some(c)) = (v.channels, s.get_mut(1)) {
            *c = e - b;
        }
        s
    }

    /// The shape of each term (its first value's, after any channel slice; a sum's values
    /// share it).
    fn term_shapes(&self, terms: &[Vec<Value>]) -> Vec<Shape> {
        terms
            .iter()
            .map(|t| t.first().map(|v| self.value_shape(v)).unwrap_or_default())
            .collect()
    }

    /// Copy (or accumulate) one value into `dst`, whose shape along axis 1 is `dst_axis` wide,
    /// at channel offset `dst_off`.
    #[allow(clippy::too_many_arguments)]
    fn copy_value(
        &mut self,
        steps: &mut Vec<Step>,
        at: At,
        v: &Value,
        dst: BufId,
        dst_axis: usize,
        dst_off: usize,
        accumulate: bool,
    ) -> Result<(), GpuError> {
        let src = self.source(steps, at, v.node)?;
        let full = self.g.node(v.node).shape.clone();
        let shape = self.value_shape(v);
        if shape.len() < 2 {
            let n = numel(&shape);
            let src = self.readable(steps, at, src);
            self.push_copy(
                steps,
                Copy {
                    accumulate,
                    ..Copy::whole(src, dst, n)
                },
            );
            return Ok(());
        }
        let (src_off, len) = match v.channels {
            Some((b, e)) => (b, e - b),
            None => (0, shape[1]),
        };
        // Channels last, a pixel's channels are one run: a copy per pixel.
        let (outer, inner) = match self.channels_last_at(at.node) {
            true => (numel(&shape) / shape[1].max(1), 1),
            false => (shape[0], numel(&shape[2..])),
        };
        let mut c = Copy {
            src,
            dst,
            outer,
            src_axis: full[1],
            src_off,
            dst_axis,
            dst_off,
            len,
            inner,
            accumulate,
        };
        // A copy reads a strided view's runs in place where they are its rows (a merged
        // convolution's member, one run per image), else a dense copy of it.
        if let Some(runs) = self.buffers[src].runs {
            if c.parent_axis(runs).is_none() {
                c.src = self.readable(steps, at, src);
            }
        }
        self.push_copy(steps, c);
        Ok(())
    }

    /// `buf`, or where it is a strided view (a merged convolution's member, a slice of a
    /// concatenation), which the kernel that asks cannot read, a dense copy of it in a
    /// scratch buffer of `at`.
    pub(crate) fn readable(&mut self, steps: &mut Vec<Step>, at: At, buf: BufId) -> BufId {
        if self.buffers[buf].runs.is_none() {
            return buf;
        }
        let (len, runs) = (self.buffers[buf].len, self.buffers[buf].runs);
        let dense = self.scratch(at, len);
        let run = runs.map_or(len, |r| r.run);
        steps.push(Copy::gather(buf, dense, len, run).into());
        dense
    }

    /// Append `c`, unless its source already is the part of `dst` it would write (a producer
    /// that wrote its slice of a concatenation in place, see [`crate::memory`]): the copy
    /// takes its `outer` runs of `len * inner` elements to runs `dst_axis * inner` apart.
    fn push_copy(&self, steps: &mut Vec<Step>, c: Copy) {
        let run = c.len * c.inner;
        let same_runs = match self.buffers.get(c.src).and_then(|b| b.runs) {
            Some(r) => r.run == run && r.stride == c.dst_axis * c.inner,
            None => c.outer == 1 || c.dst_axis == c.len,
        };
        let in_place = !c.accumulate
            && same_runs
            && c.src_off == 0
            && c.len == c.src_axis
            && self.offset_within(c.src, c.dst) == Some(c.dst_off * c.inner);
        if !in_place {
            steps.push(c.into());
        }
    }

    /// Where buffer `b` starts within buffer `outer`, following views (a merged convolution's
    /// member lies within the merged output, which may lie within a concatenation).
    fn offset_within(&self, mut b: BufId, outer: BufId) -> Option<usize> {
        let mut off = 0;
        while let Some((parent, at)) = self.buffers.get(b)?.within {
            off += at;
            if parent == outer {
                return Some(off);
            }
            b = parent;
        }
        None
    }

    /// Where `term` sums several whole values, one add kernel that writes `act(` their sum `+`
    /// the biases left to it `)` into `y` (of `shape`, its elements in `y`'s order), reading
    /// strided views in place: the element-wise add, or the pooling kernel that pools the
    /// values that are poolings given to this reader ([`Builder::fuse_pools`]). `false` (and
    /// nothing done) for one value, or a sum with a channel slice (copied value by value).
    pub(crate) fn sum_into(
        &mut self,
        steps: &mut Vec<Step>,
        at: At,
        term: &[Value],
        y: BufId,
        shape: &[usize],
        act: Activation,
    ) -> Result<bool, GpuError> {
        if !Self::is_whole_sum(term) {
            return Ok(false);
        }
        let (pooled, added): (Vec<Value>, Vec<Value>) =
            term.iter().partition(|v| self.pooled_by_reader(v.node));
        let srcs = added
            .iter()
            .map(|v| self.source(steps, at, v.node))
            .collect::<Result<Vec<_>, _>>()?;
        if !pooled.is_empty() {
            step::pool::lower_sum(self, steps, at, &pooled, &added, srcs, y, shape, act)?;
            return Ok(true);
        }
        let bias = self.term_bias(at, term, shape)?;
        let sum = step::elementwise::Elementwise::sum(srcs, y, numel(shape), act, bias);
        steps.push(sum.into());
        Ok(true)
    }

    /// Whether a term sums several whole values ([`Builder::sum_into`]).
    fn is_whole_sum(term: &[Value]) -> bool {
        term.len() > 1 && term.iter().all(|v| v.channels.is_none())
    }

    /// The biases that the values of `term` (summed by one add kernel of the reader at `at`)
    /// left to it ([`Builder::deferred_bias`]).
    pub(crate) fn term_bias(
        &mut self,
        at: At,
        term: &[Value],
        shape: &[usize],
    ) -> Result<Option<ChannelBias>, GpuError> {
        let nodes: Vec<NodeId> = term.iter().map(|v| v.node).collect();
        self.deferred_bias(at, &nodes, shape)
    }

    /// The biases that the convolutions among `nodes` left to their reader at `at` (whose
    /// kernel adds them to a value of `shape`, 4-D, in its layout), summed per channel, as a
    /// parameter of that reader; `None` where none of them left one. Records that the reader
    /// added them ([`Builder::check_deferred_biases`]).
    pub(crate) fn deferred_bias(
        &mut self,
        at: At,
        nodes: &[NodeId],
        shape: &[usize],
    ) -> Result<Option<ChannelBias>, GpuError> {
        let read: Vec<(NodeId, NodeId)> = nodes.iter().map(|&p| (p, at.node)).collect();
        self.biases_read_by(at, &read, shape)
    }

    /// [`Builder::deferred_bias`] of the values `(p, reader)`, each read by the operator
    /// beside it whose work the kernel at `at` does (a pooling it pools).
    pub(crate) fn biases_read_by(
        &mut self,
        at: At,
        read: &[(NodeId, NodeId)],
        shape: &[usize],
    ) -> Result<Option<ChannelBias>, GpuError> {
        let mut sum: Option<Vec<f32>> = None;
        for &(p, reader) in read {
            let Some(values) = self.left_bias(at.gpu, p)? else {
                continue;
            };
            match sum.as_mut() {
                None => sum = Some(values),
                Some(s) if s.len() == values.len() => {
                    s.iter_mut().zip(&values).for_each(|(a, b)| *a += b);
                }
                Some(_) => return Err(self.unsupported(at, "sums biases of different widths")),
            }
            self.added_bias.insert((p, reader));
        }
        let Some(sum) = sum else {
            return Ok(None);
        };
        let [_, channels, h, w] = self.four(at, shape)?;
        if sum.len() != channels {
            return Err(self.unsupported(at, "a bias left to it does not match its channels"));
        }
        let inner = match self.channels_last_at(at.node) {
            true => 1,
            false => h * w,
        };
        let buf = self.param_buffer(at, "deferred bias", channels, Init::Data(sum.into()));
        Ok(Some(ChannelBias {
            buf,
            channels,
            inner,
        }))
    }

    /// The bias value `p` leaves to its readers, one per channel: its convolution's, or where
    /// it is a concatenation that passes its terms' biases on, theirs side by side; `None`
    /// where it leaves none.
    fn left_bias(&self, gpu: usize, p: NodeId) -> Result<Option<Vec<f32>>, GpuError> {
        if self.passed.contains(&p) {
            let mut all = Vec::new();
            for v in self.g.node(p).inputs.iter().flatten() {
                all.extend(self.left_bias(gpu, v.node)?.unwrap_or_default());
            }
            return Ok(Some(all));
        }
        let Some(&inner) = self.deferred.get(&p) else {
            return Ok(None);
        };
        let channels = self.g.node(p).shape.get(1).copied().unwrap_or(0);
        let own = At {
            node: p,
            gpu,
            inner,
        };
        Ok(Some(
            self.bias_init(own, channels)?
                .values(channels)
                .unwrap_or_default(),
        ))
    }

    /// A buffer holding one term (in place when it is one whole value, summed by one add when
    /// it is several).
    fn term(
        &mut self,
        steps: &mut Vec<Step>,
        at: At,
        term: &[Value],
    ) -> Result<(BufId, Shape), GpuError> {
        let (buf, shape) = self.term_strided(steps, at, term)?;
        Ok((self.readable(steps, at, buf), shape))
    }

    /// [`Builder::term`], where a strided view of one whole value stays one (for a kernel
    /// that reads it in place).
    fn term_strided(
        &mut self,
        steps: &mut Vec<Step>,
        at: At,
        term: &[Value],
    ) -> Result<(BufId, Shape), GpuError> {
        let first = term
            .first()
            .ok_or_else(|| self.unsupported(at, "empty input term"))?;
        let shape = self.value_shape(first);
        if term.len() == 1 && first.channels.is_none() {
            return Ok((self.source(steps, at, first.node)?, shape));
        }
        let dst = self.scratch(at, numel(&shape));
        if self.sum_into(steps, at, term, dst, &shape, Activation::None)? {
            return Ok((dst, shape));
        }
        let axis = shape.get(1).copied().unwrap_or(0);
        for (j, v) in term.iter().enumerate() {
            self.copy_value(steps, at, v, dst, axis, 0, j > 0)?;
        }
        Ok((dst, shape))
    }

    /// A view of `dst` (the output of the operator at `at`, of shape `out`, its terms
    /// concatenated along channels) holding channels `off..off + shape[1]`: a term's slice,
    /// strided where it is not contiguous (one run per image at batch > 1, one run per pixel
    /// channels last).
    fn channel_slice(
        &mut self,
        at: At,
        dst: BufId,
        out: &[usize],
        off: usize,
        shape: &[usize],
    ) -> BufId {
        let len = numel(shape);
        let y = self.alloc(at.gpu, len, BufRole::Scratch(at.node), Init::Uninit);
        let inner = match self.channels_last_at(at.node) {
            true => 1,
            false => numel(&shape[2..]),
        };
        self.buffers[y].within = Some((dst, off * inner));
        let (run, stride) = (shape[1] * inner, out[1] * inner);
        if len > run && run < stride {
            self.buffers[y].runs = Some(Runs { run, stride });
        }
        y
    }

    /// The steps that activate, in place, operator `p`'s value for its readers
    /// ([`Builder::activate_by_producers`]) after its own steps: the whole value, or the one
    /// term its sums' add kernels did not activate as they wrote (none if there is none),
    /// adding the bias its convolution left to it.
    fn activate_in_place(&mut self, at: At, act: Activation) -> Result<Vec<Step>, GpuError> {
        let (p, g) = (at.node, self.g);
        let node = g.node(p);
        let out = self.outputs[p.index()]
            .ok_or_else(|| GpuError::Plan(format!("'{}' has no output buffer", node.name)))?;
        let (y, bias) = match self.writers_act.get(&p).copied() {
            Some(None) => return Ok(Vec::new()),
            Some(Some(term)) => {
                let shapes = self.term_shapes(&node.inputs);
                let off: usize = shapes[..term].iter().map(|s| s[1]).sum();
                let y = self.channel_slice(at, out, &node.shape, off, &shapes[term]);
                // The term's bias, where its convolution left it to this slice.
                let nodes: Vec<NodeId> = node.inputs[term].iter().map(|v| v.node).collect();
                (y, self.deferred_bias(at, &nodes, &shapes[term])?)
            }
            None if self.is_strided(out) => {
                return Err(GpuError::Plan(format!(
                    "'{}' is activated in place for its readers but is a strided view",
                    node.name
                )))
            }
            None => (out, None),
        };
        let total = self.buffers[y].len;
        Ok(vec![step::act::BiasAct {
            y,
            bias: bias.map(|b| b.buf),
            total,
            channels: bias.map_or(1, |b| b.channels),
            inner: bias.map_or(1, |b| b.inner),
            act,
            residual: None,
        }
        .into()])
    }

    /// Concatenate terms along `axis` into `dst` (which must hold the concatenated shape).
    pub(crate) fn concat_into(
        &mut self,
        steps: &mut Vec<Step>,
        at: At,
        terms: &[Vec<Value>],
        axis: usize,
        dst: BufId,
    ) -> Result<Shape, GpuError> {
        let shapes = self.term_shapes(terms);
        let out = if shapes.len() == 1 {
            shapes[0].clone()
        } else {
            opsched_graph::op::concat_shapes(&shapes, axis).map_err(|m| self.unsupported(at, m))?
        };
        let mut off = 0;
        for (t, shape) in terms.iter().zip(&shapes) {
            let channels = axis == 1 && shape.len() >= 2;
            if channels && Self::is_whole_sum(t) {
                // A sum of whole values: one add kernel writing a view of its slice (strided,
                // one run per image at batch > 1, one run per pixel channels last), not a copy
                // per value (NASNet's cell outputs); with the activation of a value activated
                // for its readers where the sums apply it (`Builder::activate_by_producers`).
                let y = self.channel_slice(at, dst, &out, off, shape);
                let act = match self.writers_act.contains_key(&at.node) {
                    true => self
                        .producer_acts
                        .get(&at.node)
                        .copied()
                        .unwrap_or_default(),
                    false => Activation::None,
                };
                self.sum_into(steps, at, t, y, shape, act)?;
            } else if axis == 1 && shape.len() >= 2 {
                for (j, v) in t.iter().enumerate() {
                    self.copy_value(steps, at, v, dst, out[1], off, j > 0)?;
                }
            } else {
                let (src, _) = self.term(steps, at, t)?;
                let a = axis.min(shape.len().saturating_sub(1));
                self.push_copy(
                    steps,
                    Copy {
                        src,
                        dst,
                        outer: numel(&shape[..a]),
                        src_axis: shape.get(a).copied().unwrap_or(1),
                        src_off: 0,
                        dst_axis: out.get(a).copied().unwrap_or(1),
                        dst_off: off,
                        len: shape.get(a).copied().unwrap_or(1),
                        inner: numel(shape.get(a + 1..).unwrap_or(&[])),
                        accumulate: false,
                    },
                );
            }
            off += shape.get(axis).copied().unwrap_or(0);
        }
        Ok(out)
    }

    /// The single input of an operator that reads its terms concatenated along channels.
    pub(crate) fn single(
        &mut self,
        steps: &mut Vec<Step>,
        at: At,
        src: Src<'_>,
    ) -> Result<(BufId, Shape), GpuError> {
        let (buf, shape) = self.single_strided(steps, at, src)?;
        Ok((self.readable(steps, at, buf), shape))
    }

    /// `buf` (of `shape`), where it is dense or a strided view whose runs are whole images
    /// (NCHW) or one pixel's channels (channels last), as the kernels that read strided inputs
    /// take them (pools, our depthwise convolution); else a dense copy
    /// ([`Builder::readable`]).
    pub(crate) fn view_or_copy(
        &mut self,
        steps: &mut Vec<Step>,
        at: At,
        buf: BufId,
        shape: &[usize],
    ) -> BufId {
        let runs = self.buffers[buf].runs;
        let in_place = match (runs, shape) {
            (None, _) => true,
            (Some(_), &[_, c, h, w]) => {
                let nhwc = self.channels_last_at(at.node);
                step::view_strides(nhwc, runs, c, h * w, "input").is_ok()
            }
            _ => false,
        };
        match in_place {
            true => buf,
            false => self.readable(steps, at, buf),
        }
    }

    /// [`Builder::single`], where a strided view of one whole value stays one (for a kernel
    /// that reads it in place: a convolution through cuDNN).
    pub(crate) fn single_strided(
        &mut self,
        steps: &mut Vec<Step>,
        at: At,
        src: Src<'_>,
    ) -> Result<(BufId, Shape), GpuError> {
        match src {
            Src::Buf(b, shape) => Ok((b, shape.to_vec())),
            Src::Terms([t]) => self.term_strided(steps, at, t),
            Src::Terms(terms) => {
                let shapes = self.term_shapes(terms);
                let cat = opsched_graph::op::concat_shapes(&shapes, 1)
                    .map_err(|m| self.unsupported(at, m))?;
                let dst = self.scratch(at, numel(&cat));
                let shape = self.concat_into(steps, at, terms, 1, dst)?;
                Ok((dst, shape))
            }
        }
    }

    /// Input terms as separate buffers (element-wise ops, batch matmul).
    pub(crate) fn terms(
        &mut self,
        steps: &mut Vec<Step>,
        at: At,
        src: Src<'_>,
    ) -> Result<Vec<(BufId, Shape)>, GpuError> {
        let ts = self.terms_strided(steps, at, src)?;
        Ok(ts
            .into_iter()
            .map(|(b, s)| (self.readable(steps, at, b), s))
            .collect())
    }

    /// [`Builder::terms`], where a strided view of one whole value stays one (for the
    /// element-wise kernel, which reads it in place).
    pub(crate) fn terms_strided(
        &mut self,
        steps: &mut Vec<Step>,
        at: At,
        src: Src<'_>,
    ) -> Result<Vec<(BufId, Shape)>, GpuError> {
        match src {
            Src::Buf(b, shape) => Ok(vec![(b, shape.to_vec())]),
            Src::Terms(terms) => terms
                .iter()
                .map(|t| self.term_strided(steps, at, t))
                .collect(),
        }
    }

    /// A batch matmul's operand `term` ([`Operand`]).
    pub(crate) fn operand(
        &mut self,
        steps: &mut Vec<Step>,
        at: At,
        term: &[Value],
    ) -> Result<Operand, GpuError> {
        if let [v] = term {
            if let Some(&s) = self.transposed_reads.get(&v.node) {
                let shape = self.value_shape(v);
                let strides = head_strides(&shape)
                    .ok_or_else(|| self.unsupported(at, "a head transpose that is not 4-D"))?;
                let buf = self.source(steps, at, s)?;
                // A merged product's member, one run per row of the merged output, is read in
                // place: on the GPU the product takes the merged row's stride (`Gemm`'s
                // preparation), the CPU reads the rows gathered.
                let row = shape[1].saturating_mul(shape[3]);
                let buf = match self.buffers[buf].runs {
                    Some(r) if r.run == row => buf,
                    _ => self.readable(steps, at, buf),
                };
                return Ok(Operand {
                    buf,
                    shape,
                    strides: Some(strides),
                });
            }
        }
        let (buf, shape) = self.term(steps, at, term)?;
        Ok(Operand {
            buf,
            shape,
            strides: None,
        })
    }

    /// Where the batch matmul at `at` writes, when it writes the head transpose after it: that
    /// buffer and the strides of its result there ([`head_strides`]).
    pub(crate) fn transposed_out(&self, at: At) -> Option<(BufId, (usize, usize, usize))> {
        let t = *self.transposed_writes.get(&at.node)?;
        let buf = self.outputs[t.index()]?;
        Some((buf, head_strides(&self.g.node(at.node).shape)?))
    }

    /// Lower `op` reading `src` into `out` (of shape `out_shape`): one line per operator kind,
    /// the work is in its step module.
    #[allow(clippy::too_many_arguments)]
    fn lower_op(
        &mut self,
        steps: &mut Vec<Step>,
        at: At,
        op: &Op,
        src: Src<'_>,
        out: BufId,
        out_shape: &[usize],
    ) -> Result<(), GpuError> {
        match op {
            Op::Input { .. } | Op::Constant { .. } => Ok(()),
            Op::Abstract { time_ms, util } => {
                steps.push(
                    step::spin::Spin {
                        time_ms: *time_ms,
                        util: *util,
                    }
                    .into(),
                );
                Ok(())
            }
            Op::Elementwise { kind }
                if matches!(src, Src::Terms(_))
                    && self
                        .g
                        .input_shapes(at.node)
                        .iter()
                        .any(|s| s.as_slice() != out_shape) =>
            {
                step::broadcast::lower(self, steps, at, (*kind).into(), src, out, out_shape)
            }
            Op::Binary { kind } => {
                step::broadcast::lower(self, steps, at, (*kind).into(), src, out, out_shape)
            }
            Op::Where => step::broadcast::lower_where(self, steps, at, src, out, out_shape),
            Op::Expand { .. } => {
                step::broadcast::lower_expand(self, steps, at, src, out, out_shape)
            }
            Op::Pad { begin, end, value } => {
                step::pad::lower(self, steps, at, begin, end, *value, src, out)
            }
            Op::Resize(r) => step::resize::lower(self, steps, at, r, src, out),
            Op::Embedding { rows, dim } => {
                step::embedding::lower(self, steps, at, *rows, *dim, src, out)
            }
            // A foreign ONNX operator has a shape but no semantics we could run.
            Op::Opaque { op_type, .. } => Err(self.unsupported(
                at,
                format!(
                    "'{op_type}' was imported as an opaque operator (--allow-unknown) and has \
                     no kernel"
                ),
            )),
            Op::Conv2d(c) => {
                let residual = self.residuals.get(&at.node).copied();
                let conv = step::conv::Fusion {
                    pre_act: Activation::None,
                    residual,
                };
                step::conv::lower(self, steps, at, c, conv, src, out, out_shape)
            }
            Op::Pool2d(p) => step::pool::lower(self, steps, at, p, src, out, out_shape),
            Op::Activation { act } => step::act::lower(self, steps, at, *act, src, out),
            Op::Elementwise { kind } => {
                let act = self.epilogues.get(&at.node).copied().unwrap_or_default();
                step::elementwise::lower(self, steps, at, *kind, act, src, out, out_shape)
            }
            Op::Concat { axis } => step::copy::lower_concat(self, steps, at, *axis, src, out),
            Op::Identity | Op::Reshape { .. } => {
                step::copy::lower_concat(self, steps, at, 1, src, out)
            }
            Op::Linear {
                out_features,
                bias,
                act,
            } => {
                let residual = self.residuals.get(&at.node).copied();
                let linear = (*out_features, *bias, *act, residual);
                step::gemm::lower_linear(self, steps, at, linear, src, out)
            }
            Op::BatchMatmul { transpose_b, alpha } => {
                let how = (*transpose_b, *alpha);
                step::gemm::lower_batch_matmul(self, steps, at, how, src, out, out_shape)
            }
            Op::Softmax { axis } => step::softmax::lower(self, steps, at, *axis, false, src, out),
            Op::LogSoftmax { axis } => step::softmax::lower(self, steps, at, *axis, true, src, out),
            Op::Affine => {
                let act = self.epilogues.get(&at.node).copied().unwrap_or_default();
                step::broadcast::lower_affine(self, steps, at, act, src, out, out_shape)
            }
            Op::LayerNorm { eps } => step::layer_norm::lower(self, steps, at, *eps, src, out),
            Op::Transpose { perm } => step::transpose::lower(self, steps, at, perm, src, out),
            Op::Slice { axis, begin, end } => {
                step::copy::lower_slice(self, steps, at, [*axis, *begin, *end], src, out)
            }
            Op::Reduce {
                kind, begin, end, ..
            } => step::reduce::lower(self, steps, at, *kind, [*begin, *end], src, out),
            Op::CumSum {
                axis,
                exclusive,
                reverse,
            } => {
                let how = (*axis, *exclusive, *reverse);
                step::cum_sum::lower(self, steps, at, how, src, out)
            }
            Op::GatherElements { axis } => step::gather::lower(self, steps, at, *axis, src, out),
            Op::Sequential { ops } => self.lower_sequential(steps, at, ops, src, out),
        }
    }

    /// A chain of primitives: each writes a scratch buffer the next one reads, the last
    /// writes `out`.
    fn lower_sequential(
        &mut self,
        steps: &mut Vec<Step>,
        at: At,
        ops: &[Op],
        src: Src<'_>,
        out: BufId,
    ) -> Result<(), GpuError> {
        let mut cur: Option<(BufId, Shape)> = None;
        let mut shapes: Vec<Shape> = match src {
            Src::Terms(_) => self.g.input_shapes(at.node),
            Src::Buf(_, s) => vec![s.to_vec()],
        };
        // An activation the next (depthwise) convolution applies to what it reads: lowered
        // with that convolution, reading the activation's input (in a node's own chain, not in
        // a nested one: the launch count knows no shapes there).
        let mut pre_act = Activation::None;
        let fused = match (src, shapes.as_slice()) {
            (Src::Terms(_), [one]) => opsched_graph::fusion::pre_activations(ops, one),
            _ => vec![false; ops.len()],
        };
        // The first activation, where the producer applied it (in the node's own chain).
        let activated = matches!(src, Src::Terms(_)) && self.reads_activated(at.node);
        for (i, inner_op) in ops.iter().enumerate() {
            let shape = inner_op
                .infer_shape(&shapes)
                .map_err(|m| self.unsupported(at, m))?;
            if i == 0 && activated {
                shapes = vec![shape];
                continue;
            }
            if let (true, Op::Activation { act }) = (fused[i], inner_op) {
                pre_act = *act;
                shapes = vec![shape];
                continue;
            }
            let dst = if i + 1 == ops.len() {
                out
            } else {
                self.scratch(at, numel(&shape))
            };
            let s = match &cur {
                None => src,
                Some((b, s)) => Src::Buf(*b, s),
            };
            let inner = At { inner: i, ..at };
            match inner_op {
                Op::Conv2d(c) if pre_act != Activation::None => {
                    let conv = step::conv::Fusion {
                        pre_act,
                        residual: None,
                    };
                    step::conv::lower(self, steps, inner, c, conv, s, dst, &shape)?;
                    pre_act = Activation::None;
                }
                _ => self.lower_op(steps, inner, inner_op, s, dst, &shape)?,
            }
            shapes = vec![shape.clone()];
            cur = Some((dst, shape));
        }
        Ok(())
    }
}

impl Builder<'_> {
    /// Let each group of `merges` run as one convolution or linear layer where it can (see
    /// [`GraphProgram::build_merged`]): the members' output buffers become views of their
    /// slices of the merged output (strided where it has several rows, [`Builder::merge_rows`]:
    /// one run per image at batch > 1, one per pixel channels last), and the members
    /// after the first join `fused`. Where the members are, in order, consecutive terms of one
    /// concatenation, the merged output is itself a view of its slice there: at batch 1 where
    /// its producers may write it in place ([`opsched_graph::inplace::slice_of`]); at a
    /// larger batch whoever else reads a member ([`opsched_graph::inplace::merged_slot`]),
    /// the merged output and the members then being strided views of the concatenation.
    /// Linear layers: [`Builder::merge_linear`]. Before the other in-place rules, which leave
    /// these views be.
    fn merge_stages(&mut self, merges: &[Vec<NodeId>], transfers: &[TransferSpec]) {
        let adds_residual: HashSet<NodeId> = opsched_graph::fusion::residual_sources(self.g)
            .into_iter()
            .flatten()
            .map(|(c, _)| c)
            .collect();
        for group in merges {
            if let Some((op, _)) = opsched_graph::merge::merged_linear(self.g, group) {
                self.merge_linear(group, op, transfers, &adds_residual);
                continue;
            }
            let group = &self.concat_order(group);
            let Some((m, members)) = self.merged_output(group, transfers, &adds_residual) else {
                continue;
            };
            self.view_members(group, m.out, &members);
            self.merged_in_place(group, &m, &members);
            self.merged.insert(group[0], m);
        }
    }

    /// Let linear layers `group` (merged into `op`) run as one product where they run on one
    /// GPU, no transfer sends their outputs, none computes a residual sum, and, over several
    /// rows, every reader reads the members in place
    /// ([`opsched_graph::merge::rows_read_in_place`]). Each member's output becomes a view of
    /// its features in the merged output's rows (one run per row), as do the reshapes that
    /// split it into heads (which then run nothing): the batched products after them read the
    /// rows with the merged row's stride ([`Builder::operand`]).
    fn merge_linear(
        &mut self,
        group: &[NodeId],
        op: Op,
        transfers: &[TransferSpec],
        adds_residual: &HashSet<NodeId>,
    ) -> Option<()> {
        let Op::Linear {
            out_features,
            bias,
            act,
        } = op
        else {
            return None;
        };
        let &head = group.first()?;
        let gpu = self.members_free(group, transfers, adds_residual)?;
        let (_, lead) = self.g.node(head).shape.split_last()?;
        let rows = lead.iter().try_fold(1usize, |r, &d| r.checked_mul(d))?;
        let in_place = rows <= 1
            || group
                .iter()
                .all(|&c| opsched_graph::merge::rows_read_in_place(self.g, c));
        if !in_place {
            return None;
        }
        let members = group
            .iter()
            .map(|&c| match self.g.node(c).op {
                Op::Linear { out_features, .. } => Some((c, out_features)),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        let runs: Vec<usize> = members.iter().map(|&(_, f)| f).collect();
        let (out, views) = self.member_views(gpu, head, &runs, rows)?;
        self.view_members(group, out, &views);
        for (&c, view) in group.iter().zip(&views) {
            if view.runs.is_none() {
                continue;
            }
            // The reshapes into heads are the member's view too, and run nothing.
            for r in self.g.succs(c).collect::<Vec<_>>() {
                if let Some(rb) = self.outputs[r.index()] {
                    self.buffers[rb].within = Some((out, view.at));
                    self.buffers[rb].runs = view.runs;
                    self.fused.insert(r);
                }
            }
        }
        self.merged_linear.insert(
            head,
            MergedLinear {
                out_features,
                bias,
                act,
                members,
                out,
            },
        );
        Some(())
    }

    /// The merged output of a stage whose members write `runs[i]` elements of each of its
    /// `rows` rows, side by side in the members' order (allocated here, on `gpu`, a scratch
    /// buffer of `head`), and each member's view of it: contiguous over one row, one run per
    /// row over several. `None` where a view would not be aligned.
    fn member_views(
        &mut self,
        gpu: usize,
        head: NodeId,
        runs: &[usize],
        rows: usize,
    ) -> Option<(BufId, Vec<MemberView>)> {
        let mut views = Vec::with_capacity(runs.len());
        let mut row = 0usize;
        for &run in runs {
            views.push(MemberView {
                at: row,
                len: run.checked_mul(rows)?,
                runs: None,
            });
            row = row.checked_add(run)?;
        }
        let align = opsched_graph::inplace::VIEW_ALIGN;
        if !(views.iter().all(|v| v.at.is_multiple_of(align))
            && (rows == 1 || row.is_multiple_of(align)))
        {
            return None;
        }
        if rows > 1 {
            for (v, &run) in views.iter_mut().zip(runs) {
                v.runs = Some(Runs { run, stride: row });
            }
        }
        let len = row.checked_mul(rows)?;
        let out = self.alloc(gpu, len, BufRole::Scratch(head), Init::Uninit);
        Some((out, views))
    }

    /// Make each member of merged stage `group` write its view of `out` (`views`, in order);
    /// the members after the first run nothing (the first runs the merged kernel).
    fn view_members(&mut self, group: &[NodeId], out: BufId, views: &[MemberView]) {
        for (&c, view) in group.iter().zip(views) {
            if let Some(o) = self.outputs[c.index()] {
                self.buffers[o].within = Some((out, view.at));
                self.buffers[o].runs = view.runs;
            }
            if c != group[0] {
                self.fused.insert(c);
            }
        }
    }

    /// The GPU every member of merged stage `group` runs on, where no transfer sends a
    /// member's output, none computes a residual sum (in `adds_residual`) and each output is
    /// a buffer of its own yet (no view): what a merged output needs of its members.
    fn members_free(
        &self,
        group: &[NodeId],
        transfers: &[TransferSpec],
        adds_residual: &HashSet<NodeId>,
    ) -> Option<usize> {
        let gpu = self.gpu_of(*group.first()?)?;
        group
            .iter()
            .all(|c| {
                self.gpu_of(*c) == Some(gpu)
                    && !sent(transfers, *c)
                    && !adds_residual.contains(c)
                    && self.outputs[c.index()].is_some_and(|o| self.buffers[o].within.is_none())
            })
            .then_some(gpu)
    }

    /// `group` in the order of its members' slices of one concatenation, where each has one
    /// there (the merged convolution's channels may come in any order, and in this one its
    /// output can be the concatenation's slice), else as it is. Its members run in one launch,
    /// so whichever comes first runs the convolution.
    fn concat_order(&self, group: &[NodeId]) -> Vec<NodeId> {
        let slots: Option<Vec<_>> = group.iter().map(|&c| self.merge_slot(c)).collect();
        let mut order = group.to_vec();
        if let Some(slots) = slots.filter(|s| s.iter().all(|x| x.into == s[0].into)) {
            let mut keyed: Vec<_> = slots.iter().map(|s| s.at).zip(group).collect();
            keyed.sort_by_key(|&(at, _)| at);
            order = keyed.into_iter().map(|(_, &c)| c).collect();
        }
        order
    }

    /// How a merged convolution's member of node `c`'s shape lies in the merged output: in
    /// `rows` runs of its channels times `inner` elements (NCHW: a run per image, a channel
    /// being its pixels; channels last: a run per pixel).
    fn merge_rows(&self, c: NodeId) -> Option<(usize, usize)> {
        let &[n, _, h, w] = self.g.node(c).shape.as_slice() else {
            return None;
        };
        match self.channels_last_at(c) {
            true => Some((n.checked_mul(h)?.checked_mul(w)?, 1)),
            false => Some((n, h.checked_mul(w)?)),
        }
    }

    /// Where merged convolution member `c` would write its slice of a concatenation, in the
    /// member's rows ([`Builder::merge_rows`]): a contiguous slice its producers may write
    /// where it is one row, a strided one else ([`opsched_graph::inplace::merged_slot`]; in
    /// elements of the layout's rows, where the concatenation is stored alike).
    fn merge_slot(&self, c: NodeId) -> Option<opsched_graph::inplace::Slice> {
        let (rows, inner) = self.merge_rows(c)?;
        if rows == 1 {
            return opsched_graph::inplace::slice_of(self.g, c).filter(|s| s.rows == 1);
        }
        let s = opsched_graph::inplace::merged_slot(self.g, c)?;
        if self.channels_last_at(s.into) != self.channels_last_at(c) {
            return None;
        }
        // The slice in NCHW elements (a run per image, `hw` elements a channel) in `inner`
        // elements a channel and `rows` runs, aligned as a strided view must be.
        let hw = numel(self.g.node(c).shape.get(2..)?).max(1);
        let slice = opsched_graph::inplace::Slice {
            at: s.at / hw * inner,
            rows,
            run: s.run / hw * inner,
            stride: s.stride / hw * inner,
            ..s
        };
        let align = opsched_graph::inplace::VIEW_ALIGN;
        (slice.at.is_multiple_of(align) && slice.stride.is_multiple_of(align)).then_some(slice)
    }

    /// Make merged output `m` of `group` (its members' views `members`) a view of the
    /// members' consecutive slices of one concatenation, where they have them (see
    /// [`Builder::merge_stages`]).
    fn merged_in_place(&mut self, group: &[NodeId], m: &MergedConv, members: &[MemberView]) {
        let Some((rows, _)) = self.merge_rows(group[0]) else {
            return;
        };
        let slots: Vec<_> = group.iter().map(|&c| self.merge_slot(c)).collect();
        let Some(first) = slots.first().copied().flatten() else {
            return;
        };
        let consecutive = slots.iter().zip(members).all(|(s, v)| {
            s.is_some_and(|s| {
                (s.into, s.at, s.stride) == (first.into, first.at + v.at, first.stride)
                    && s.run == v.len / rows
            })
        });
        let local = self.gpu_of(first.into) == self.gpu_of(group[0]);
        let (true, true, Some(dst)) = (consecutive, local, self.outputs[first.into.index()]) else {
            return;
        };
        if self.buffers[dst].runs.is_some() {
            return;
        }
        self.buffers[m.out].within = Some((dst, first.at));
        if rows > 1 {
            // The merged output and its members are views of the concatenation itself
            // (nothing is a view of a strided view).
            let merged_run = self.buffers[m.out].len / rows;
            self.buffers[m.out].runs = Some(Runs {
                run: merged_run,
                stride: first.stride,
            });
            for (&c, v) in group.iter().zip(members) {
                if let Some(o) = self.outputs[c.index()] {
                    self.buffers[o].within = Some((dst, first.at + v.at));
                    self.buffers[o].runs = Some(Runs {
                        run: v.len / rows,
                        stride: first.stride,
                    });
                }
            }
        }
    }

    /// The merged output of `group` (allocated here) and each member's view of it, where the
    /// group can run as one convolution (see [`GraphProgram::build_merged`]).
    fn merged_output(
        &mut self,
        group: &[NodeId],
        transfers: &[TransferSpec],
        adds_residual: &HashSet<NodeId>,
    ) -> Option<(MergedConv, Vec<MemberView>)> {
        let &head = group.first()?;
        let gpu = self.members_free(group, transfers, adds_residual)?;
        let (conv, _) = opsched_graph::merge::merged_conv(self.g, group)?;
        let [oh, ow] = self.g.node(head).shape.get(2..4)?.try_into().ok()?;
        // Members alike in layout (a graph output, which stays NCHW, takes no part).
        let nhwc = self.channels_last_at(head);
        if group.iter().any(|&c| self.channels_last_at(c) != nhwc) {
            return None;
        }
        let (rows, inner) = self.merge_rows(head)?;
        // With more than one row the members are strided views: only where every reader
        // takes them in place (a dense copy for another reader would cost what the merge
        // saves).
        if rows > 1
            && !group
                .iter()
                .all(|&c| opsched_graph::merge::read_in_place(self.g, c))
        {
            return None;
        }
        let members = group
            .iter()
            .map(|&c| match &self.g.node(c).op {
                Op::Conv2d(cc) => Some((c, cc.clone())),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        let runs = members
            .iter()
            .map(|(_, cc)| cc.out_channels.checked_mul(inner))
            .collect::<Option<Vec<_>>>()?;
        let (out, views) = self.member_views(gpu, head, &runs, rows)?;
        let m = MergedConv {
            conv,
            members,
            out,
            out_hw: [oh, ow],
        };
        Some((m, views))
    }

    /// Make `p`'s output buffer a view of `into`'s output from element `at` on, where both run
    /// on one GPU, store their values alike ([`Layout`]: one layout, or one pixel), no
    /// transfer sends `p`'s output (a transfer reads a buffer of its own) and `into`'s output
    /// is not strided (nothing is a view of a strided view). Returns whether it did.
    fn view_into(
        &mut self,
        p: NodeId,
        into: NodeId,
        at: usize,
        transfers: &[TransferSpec],
    ) -> bool {
        match (self.outputs[p.index()], self.outputs[into.index()]) {
            (Some(pb), Some(out))
                if !sent(transfers, p)
                    && (self.nhwc[p.index()] == self.nhwc[into.index()] || self.one_pixel(p))
                    && self.buffers[out].runs.is_none()
                    && self.gpu_of(p).is_some()
                    && self.gpu_of(p) == self.gpu_of(into) =>
            {
                self.buffers[pb].within = Some((out, at));
                true
            }
            _ => false,
        }
    }

    /// Make the producers that write their slice of a concatenation in place
    /// ([`opsched_graph::inplace::concat_slices`]) do so where they can ([`Builder::view_into`]),
    /// a strided slice as a strided view ([`Runs`]): [`Builder::push_copy`] then leaves out
    /// their copies.
    fn concat_in_place(&mut self, transfers: &[TransferSpec]) {
        for (i, slot) in opsched_graph::inplace::concat_slices(self.g)
            .into_iter()
            .enumerate()
        {
            let p = NodeId(i as u32);
            // A merged convolution's member is a view of the merged output already.
            let Some(pb) = self.outputs[i].filter(|&b| self.buffers[b].within.is_none()) else {
                continue;
            };
            // A channels-last concatenation's slice is a run per pixel, at any batch.
            let nhwc_slot = opsched_graph::inplace::channels_last_slice(self.g, p)
                .filter(|&(c, _)| self.channels_last_at(c));
            if let Some((c, first)) = nhwc_slot {
                let (cp, ct) = (self.g.node(p).shape[1], self.g.node(c).shape[1]);
                if self.channels_last_at(p) && cp < ct && self.view_into(p, c, first, transfers) {
                    self.buffers[pb].runs = Some(Runs {
                        run: cp,
                        stride: ct,
                    });
                }
                continue;
            }
            let slot = slot.filter(|s| !self.channels_last_at(s.into));
            if let Some(s) = slot {
                if self.view_into(p, s.into, s.at, transfers) && s.rows > 1 {
                    self.buffers[pb].runs = Some(Runs {
                        run: s.run,
                        stride: s.stride,
                    });
                }
            }
        }
    }

    /// Let each element-wise or affine operator apply the activation fused into it
    /// ([`opsched_graph::fusion::fused_source`]) where it can write the activation's output
    /// ([`Builder::view_into`]): its kernel applies the activation, and the activation has no
    /// steps.
    fn fuse_activations(&mut self, transfers: &[TransferSpec]) {
        for (i, src) in opsched_graph::fusion::fused_sources(self.g)
            .into_iter()
            .enumerate()
        {
            let a = NodeId(i as u32);
            if let (Some(e), Op::Activation { act }) = (src, &self.g.node(a).op) {
                if self.view_into(e, a, 0, transfers) {
                    self.epilogues.insert(e, *act);
                    self.fused.insert(a);
                }
            }
        }
    }

    /// Let each convolution or linear layer compute the residual sum it feeds
    /// ([`opsched_graph::fusion::residual_source`]) where it can write the sum's output
    /// ([`Builder::view_into`]) and read the residual on its GPU: its kernel adds the residual
    /// and applies the activation fused into the sum, and the sum has no steps. After
    /// [`Builder::fuse_activations`].
    fn fuse_residuals(&mut self, transfers: &[TransferSpec]) {
        for (i, found) in opsched_graph::fusion::residual_sources(self.g)
            .into_iter()
            .enumerate()
        {
            let Some((c, z)) = found else { continue };
            let e = NodeId(i as u32);
            let reachable = self.g.node(z).op.is_input() || self.gpu_of(z) == self.gpu_of(c);
            if reachable && self.view_into(c, e, 0, transfers) {
                let act = self.epilogues.get(&e).copied().unwrap_or_default();
                self.residuals.insert(c, (z, act));
                self.fused.insert(e);
            }
        }
    }

    /// Let each operator that a reshape views ([`opsched_graph::inplace::reshape_source`])
    /// write its output straight into the reshape's buffer ([`Builder::view_into`]), where it
    /// writes nowhere else already: the reshape has no steps. After the other fusions, whose
    /// views come first.
    fn reshape_in_place(&mut self, transfers: &[TransferSpec]) {
        for (i, src) in opsched_graph::inplace::reshape_sources(self.g)
            .into_iter()
            .enumerate()
        {
            let r = NodeId(i as u32);
            let Some(p) = src else { continue };
            let free = self.outputs[p.index()].is_some_and(|b| self.buffers[b].within.is_none());
            if free && self.view_into(p, r, 0, transfers) {
                self.fused.insert(r);
            }
        }
    }

    /// Let convolutions leave their bias to their readers where
    /// [`opsched_graph::fusion::deferred_bias`] says every reader adds it as it reads (an add
    /// kernel, our depthwise convolution, a pooling, the in-place activation of a slice), but
    /// not a merged convolution's member, whose bias the merged convolution adds, nor a value
    /// whose concatenation (reading it as a term of its own) does not activate that slice in
    /// place ([`Builder::activate_by_producers`]; the rule asks it of the graph alone).
    ///
    /// A concatenation passes its terms' biases on
    /// ([`opsched_graph::fusion::passed_bias`]) where it may leave one and every term does;
    /// where it cannot, its terms add their own.
    fn defer_biases(&mut self) {
        let merged = self.merged_members();
        let g = self.g;
        let slices_activated = |b: &Self, n: NodeId| {
            g.succs(n).all(|c| {
                let alone = [Value::whole(n)];
                match g.node(c).inputs.iter().position(|t| t[..] == alone) {
                    // A concatenation that passes it on (or, where it cannot, its terms keep
                    // their biases: below).
                    Some(_) if opsched_graph::fusion::passed_bias(g, c) => true,
                    Some(t) if matches!(g.node(c).op, Op::Identity | Op::Concat { .. }) => {
                        b.writers_act.get(&c) == Some(&Some(t))
                    }
                    _ => true,
                }
            })
        };
        let deferred = opsched_graph::fusion::deferred_biases(g);
        for (i, inner) in deferred.into_iter().enumerate() {
            let n = NodeId(i as u32);
            if let (Some(inner), false) = (inner, merged.contains(&n)) {
                if slices_activated(self, n) {
                    self.deferred.insert(n, inner);
                }
            }
        }
        for i in 0..g.len() {
            let p = NodeId(i as u32);
            if !opsched_graph::fusion::passed_bias(g, p) {
                continue;
            }
            let terms: Vec<NodeId> = g.preds(p).collect();
            let all_left = terms.iter().all(|t| self.deferred.contains_key(t));
            if all_left && slices_activated(self, p) {
                self.passed.insert(p);
                self.added_bias.extend(terms.iter().map(|&t| (t, p)));
            } else {
                for t in terms {
                    self.deferred.remove(&t);
                }
            }
        }
    }

    /// The members of the merged convolutions and linear layers (their values are views of
    /// the merged output, which the group's first member computes).
    fn merged_members(&self) -> HashSet<NodeId> {
        let convs = self
            .merged
            .values()
            .flat_map(|m| m.members.iter().map(|&(n, _)| n));
        let linears = self
            .merged_linear
            .values()
            .flat_map(|m| m.members.iter().map(|&(n, _)| n));
        convs.chain(linears).collect()
    }

    /// Let operators apply the activation every reader would apply first, once, in place
    /// after their own steps ([`opsched_graph::fusion::producer_activation`]; a transfer
    /// sends the value after them, activated), except a merged stage's member (its value is a
    /// view of the merged output, which the group's first member computes). Where a
    /// concatenation's sums apply it as they write ([`opsched_graph::fusion::act_by_writers`]),
    /// only its other term, if any, is activated after them.
    fn activate_by_producers(&mut self) {
        let merged = self.merged_members();
        for i in 0..self.g.len() {
            let p = NodeId(i as u32);
            let Some(act) = opsched_graph::fusion::producer_activation(self.g, p) else {
                continue;
            };
            if self.gpu_of(p).is_none() || merged.contains(&p) {
                continue;
            }
            self.producer_acts.insert(p, act);
            self.activated_readers.extend(self.g.succs(p));
            if let Some(rest) = opsched_graph::fusion::act_by_writers(self.g, p) {
                self.writers_act.insert(p, rest);
            }
        }
    }

    /// Let the add kernel of each pooling's reader pool it
    /// ([`opsched_graph::fusion::pool_into_sum`]) where the pooling, its reader and the
    /// pooling's input (unless a graph input) run on one GPU: the kernel reads the input where
    /// the pooling would, and the pooling has no steps (its value is never written).
    fn fuse_pools(&mut self) {
        for (i, reader) in opsched_graph::fusion::pools_into_sums(self.g)
            .into_iter()
            .enumerate()
        {
            let (p, Some(c)) = (NodeId(i as u32), reader) else {
                continue;
            };
            let x = self.g.preds(p).next();
            let gpu = self.gpu_of(p);
            let input_here =
                x.is_some_and(|x| self.g.node(x).op.is_input() || self.gpu_of(x) == gpu);
            if gpu.is_some() && self.gpu_of(c) == gpu && input_here {
                self.pooled.insert(p);
                self.fused.insert(p);
            }
        }
    }

    /// Whether the add kernel of pooling `p`'s reader pools it ([`Builder::fuse_pools`]).
    pub(crate) fn pooled_by_reader(&self, p: NodeId) -> bool {
        self.pooled.contains(&p)
    }

    /// Whether operator `c`'s input was activated by its producer, so that `c` skips its first
    /// activation ([`Builder::activate_by_producers`]).
    pub(crate) fn reads_activated(&self, c: NodeId) -> bool {
        self.activated_readers.contains(&c)
    }

    /// Whether the convolution at `at` leaves its bias to its readers.
    pub(crate) fn bias_deferred(&self, at: At) -> bool {
        self.deferred.get(&at.node) == Some(&at.inner)
    }

    /// Whether operator `n`'s depthwise kernel reads the values of its input's sum itself
    /// ([`opsched_graph::fusion::depthwise_reads_sum`]).
    pub(crate) fn depthwise_reads_sum(&self, n: NodeId) -> bool {
        opsched_graph::fusion::depthwise_reads_sum(self.g, n)
    }

    /// An error unless every reader that was lowered added the biases left to it (a lowering
    /// that reads such a value without adding its bias would compute without it).
    fn check_deferred_biases(&self) -> Result<(), GpuError> {
        for &p in self.deferred.keys().chain(&self.passed) {
            if self.gpu_of(p).is_none() {
                continue;
            }
            // A pooling fused into a sum has no steps, but the sum's kernel adds its bias.
            let missed = self.g.succs(p).find(|&c| {
                self.gpu_of(c).is_some()
                    && (!self.fused.contains(&c) || self.pooled.contains(&c))
                    && !self.added_bias.contains(&(p, c))
            });
            if let Some(c) = missed {
                return Err(GpuError::Plan(format!(
                    "'{}' leaves its bias to '{}', whose kernels do not add it",
                    self.g.node(p).name,
                    self.g.node(c).name
                )));
            }
        }
        Ok(())
    }

    /// Let batch matmuls read through the head transposes before them and write through the
    /// one after them ([`opsched_graph::fusion::transposed_operand`],
    /// [`opsched_graph::fusion::transposed_output`]) where everything involved runs on one GPU
    /// and no transfer sends the transpose's or the product's output: the transposes have no
    /// steps. A product writing a transpose's output has its own buffer within it; neither its
    /// own value nor that of a transpose read through is ever written (nor kept), and the
    /// latter's unused buffer lies within the value read through (no storage of its own).
    fn fold_transposes(&mut self, transfers: &[TransferSpec]) {
        for i in 0..self.g.len() {
            let n = NodeId(i as u32);
            if let Some(s) = opsched_graph::fusion::transposed_operand(self.g, n) {
                let here = self.gpu_of(n);
                let local = (self.g.node(s).op.is_input() || self.gpu_of(s) == here)
                    && self.g.succs(n).all(|c| self.gpu_of(c) == here);
                if here.is_some() && local && !sent(transfers, n) {
                    self.transposed_reads.insert(n, s);
                    self.fused.insert(n);
                    // Its own buffer is never used: let it take no storage of its own (where
                    // `s` is a strided view, a merged product's member, the same view).
                    if !self.view_into(n, s, 0, transfers) {
                        if let (Some(tb), Some(sb)) =
                            (self.outputs[n.index()], self.outputs[s.index()])
                        {
                            if self.buffers[sb].runs.is_some() && self.buffers[tb].within.is_none()
                            {
                                self.buffers[tb].within = self.buffers[sb].within;
                                self.buffers[tb].runs = self.buffers[sb].runs;
                            }
                        }
                    }
                }
            }
            if let Some(t) = opsched_graph::fusion::transposed_output(self.g, n) {
                if !sent(transfers, t) && self.view_into(n, t, 0, transfers) {
                    self.transposed_writes.insert(n, t);
                    self.fused.insert(t);
                }
            }
        }
    }
}

impl GraphProgram {
    /// Kernels its operators launch on a GPU ([`Step::kernels`]): fewer than the operators
    /// where views, in-place concatenations and fused activations launch nothing.
    pub fn kernels(&self) -> usize {
        let steps = self.ops.iter().flatten().flat_map(|o| &o.steps);
        steps.map(|s| s.kernels() as usize).sum()
    }

    /// The program of `g` with every operator on GPU 0 and no transfers.
    pub fn single_gpu(g: &Graph) -> Result<GraphProgram, GpuError> {
        Self::single_gpu_in(g, Layout::Nchw)
    }

    /// [`GraphProgram::single_gpu`] with 4-D activations in `layout`.
    pub fn single_gpu_in(g: &Graph, layout: Layout) -> Result<GraphProgram, GpuError> {
        let placement: Vec<Option<usize>> = g
            .nodes()
            .iter()
            .map(|n| (!n.op.is_input()).then_some(0))
            .collect();
        Self::build_with(g, &placement, &[], &[], layout)
    }

    /// Build the program for `placement` (per node, the GPU of an operator; `None` for graph
    /// inputs and operators left out) and the given transfers (each brings a producer's output
    /// to a consumer on another GPU; the order defines [`GraphProgram::transfers`]).
    ///
    /// Only `f32` graphs are supported; operators are lowered in topological order.
    pub fn build(
        g: &Graph,
        placement: &[Option<usize>],
        transfers: &[TransferSpec],
    ) -> Result<GraphProgram, GpuError> {
        Self::build_merged(g, placement, transfers, &[])
    }

    /// [`GraphProgram::build`], where each group of `merges` (the operators of a merged
    /// stage, in the order the stage runs them) runs as one convolution when it can: the
    /// group is mergeable ([`opsched_graph::merge::merged_conv`]), on one GPU, no transfer
    /// sends a member's output, no member adds a residual, and each member's output is an
    /// aligned slice of the merged output, which its buffer then is a view of (at batch > 1
    /// one run per image, where every reader reads that in place:
    /// [`opsched_graph::merge::read_in_place`]). The members are put in the order of their
    /// slices of a concatenation where they have them; the first runs the convolution
    /// (weights: the members' side by side, smaller kernels zero-padded around their centre),
    /// the others run nothing. Linear layers alike run as one product
    /// ([`opsched_graph::merge::merged_linear`]: weights stacked, each member a run per row
    /// of the merged output, read in place by the batched products after its head reshape).
    /// A group that cannot merge runs its operators one after another, as
    /// [`GraphProgram::build`] has them.
    pub fn build_merged(
        g: &Graph,
        placement: &[Option<usize>],
        transfers: &[TransferSpec],
        merges: &[Vec<NodeId>],
    ) -> Result<GraphProgram, GpuError> {
        Self::build_with(g, placement, transfers, merges, Layout::Nchw)
    }

    /// [`GraphProgram::build_merged`] with 4-D activations in `layout`. With
    /// [`Layout::Nhwc`] a merged stage's members are views of the merged output a run of
    /// channels per pixel (read in place where [`opsched_graph::merge::read_in_place`]
    /// holds), and a channels-last value is no view of another operator's buffer but for
    /// such runs (a concatenation's slice, a merged convolution's member), never a reshape
    /// of more than one pixel.
    pub fn build_with(
        g: &Graph,
        placement: &[Option<usize>],
        transfers: &[TransferSpec],
        merges: &[Vec<NodeId>],
        layout: Layout,
    ) -> Result<GraphProgram, GpuError> {
        if g.dtype != opsched_graph::DType::F32 {
            return Err(GpuError::UnsupportedDType(g.dtype.to_string()));
        }
        if placement.len() != g.len() {
            return Err(GpuError::Plan(format!(
                "placement lists {} nodes, the graph has {}",
                placement.len(),
                g.len()
            )));
        }
        let gpus = placement
            .iter()
            .flatten()
            .map(|&p| p + 1)
            .max()
            .unwrap_or(1);
        let mut b = Builder {
            g,
            placement,
            buffers: Vec::new(),
            outputs: vec![None; g.len()],
            input_copies: HashMap::new(),
            replicas: HashMap::new(),
            epilogues: HashMap::new(),
            fused: HashSet::new(),
            residuals: HashMap::new(),
            deferred: HashMap::new(),
            added_bias: HashSet::new(),
            producer_acts: HashMap::new(),
            activated_readers: HashSet::new(),
            pooled: HashSet::new(),
            passed: HashSet::new(),
            writers_act: HashMap::new(),
            transposed_reads: HashMap::new(),
            transposed_writes: HashMap::new(),
            merged: HashMap::new(),
            merged_linear: HashMap::new(),
            nhwc: match layout {
                Layout::Nchw => vec![false; g.len()],
                Layout::Nhwc => channels_last(g),
            },
            other_layout: HashMap::new(),
            conversions: HashMap::new(),
            layout_conversions: 0,
        };
        // Outputs first (so that a transfer's source exists), then replicas, then programs.
        for (i, node) in g.nodes().iter().enumerate() {
            if let Some(gpu) = placement[i] {
                if node.op.is_input() {
                    continue;
                }
                let id = b.alloc(
                    gpu,
                    numel(&node.shape),
                    BufRole::Output(NodeId(i as u32)),
                    Init::Uninit,
                );
                b.outputs[i] = Some(id);
            }
        }
        let mut xfers = Vec::with_capacity(transfers.len());
        for t in transfers {
            let src_gpu = placement.get(t.src.index()).copied().flatten();
            let src_buf = b.outputs.get(t.src.index()).copied().flatten();
            let (Some(sg), Some(sb)) = (src_gpu, src_buf) else {
                return Err(GpuError::Plan(format!(
                    "transfer from '{}', which is not placed",
                    g.node(t.src).name
                )));
            };
            if sg == t.dst_gpu {
                return Err(GpuError::Plan(format!(
                    "transfer '{}' -> '{}' stays on GPU {sg}",
                    g.node(t.src).name,
                    g.node(t.dst).name
                )));
            }
            let len = b.buffers[sb].len;
            let r = b.alloc(
                t.dst_gpu,
                len,
                BufRole::Replica {
                    src: t.src,
                    dst: t.dst,
                },
                Init::Uninit,
            );
            b.replicas.insert((t.src, t.dst), r);
            xfers.push((sb, r));
        }
        b.merge_stages(merges, transfers);
        b.concat_in_place(transfers);
        b.fuse_activations(transfers);
        b.fuse_residuals(transfers);
        b.reshape_in_place(transfers);
        b.fold_transposes(transfers);
        b.activate_by_producers();
        b.fuse_pools();
        // After the slices activated in place are known: they add biases left to them.
        b.defer_biases();
        let mut ops: Vec<Option<OpProgram>> = vec![None; g.len()];
        for &id in g.topo_order() {
            let node = g.node(id);
            let Some(gpu) = placement[id.index()] else {
                continue;
            };
            if node.op.is_input() {
                continue;
            }
            let out = b.outputs[id.index()]
                .ok_or_else(|| GpuError::Plan(format!("'{}' has no output buffer", node.name)))?;
            let mut steps = Vec::new();
            let at = At {
                node: id,
                gpu,
                inner: 0,
            };
            // An operator another one's kernel computes (see `fuse_*`, `merge_stages`) has no
            // steps; the first of a merged group runs the group's convolution or product.
            if let Some(m) = b.merged.get(&id).cloned() {
                step::conv::lower_merged(&mut b, &mut steps, at, &m, Src::Terms(&node.inputs))?;
            } else if let Some(m) = b.merged_linear.get(&id).cloned() {
                let src = Src::Terms(&node.inputs);
                step::gemm::lower_merged_linear(&mut b, &mut steps, at, &m, src)?;
            } else if !b.fused.contains(&id) {
                b.lower_op(
                    &mut steps,
                    at,
                    &node.op,
                    Src::Terms(&node.inputs),
                    out,
                    &node.shape,
                )?;
            }
            // The activation every reader would apply first, once, in place.
            if let Some(&act) = b.producer_acts.get(&id) {
                steps.extend(b.activate_in_place(at, act)?);
            }
            ops[id.index()] = Some(OpProgram {
                name: node.name.clone(),
                gpu,
                steps,
                output: out,
            });
        }
        b.check_deferred_biases()?;
        // The values readers want in the other layout, converted by their producers after
        // their own steps (producers come first in topological order).
        for (id, conversions) in std::mem::take(&mut b.conversions) {
            if let Some(op) = ops[id.index()].as_mut() {
                op.steps.extend(conversions);
            }
        }
        // Graph inputs read by nobody still get a buffer on GPU 0 (their outputs are reported).
        let mut outputs = b.outputs.clone();
        // The own values of a sum that applies an activation, of a convolution that adds a
        // residual, of a product that writes a transpose and of a transpose read through are
        // never written; a convolution that leaves its bias to its readers writes its value
        // without it, as does a concatenation that passes its terms' biases on; an operator
        // that activates its value for its readers keeps it activated.
        for n in b
            .epilogues
            .keys()
            .chain(b.residuals.keys())
            .chain(b.deferred.keys())
            .chain(b.passed.iter())
            .chain(b.producer_acts.keys())
            .chain(b.transposed_writes.keys())
            .chain(b.transposed_reads.keys())
            .chain(b.pooled.iter())
        {
            outputs[n.index()] = None;
        }
        // Nor are the values written in place into a value activated in place.
        let activated: HashSet<BufId> = b
            .producer_acts
            .keys()
            .filter_map(|p| b.outputs[p.index()])
            .collect();
        if !activated.is_empty() {
            for slot in outputs.iter_mut() {
                let mut within = slot.and_then(|o| b.buffers[o].within);
                while let Some((parent, _)) = within {
                    if activated.contains(&parent) {
                        *slot = None;
                        break;
                    }
                    within = b.buffers[parent].within;
                }
            }
        }
        for n in g.inputs() {
            let copy = (0..gpus).find_map(|gpu| b.input_copies.get(&(n, gpu)).copied());
            outputs[n.index()] = copy;
        }
        let mut merged: Vec<Vec<NodeId>> = b
            .merged
            .into_values()
            .map(|m| m.members.into_iter().map(|(n, _)| n).collect())
            .chain(
                b.merged_linear
                    .into_values()
                    .map(|m| m.members.into_iter().map(|(n, _)| n).collect()),
            )
            .collect();
        merged.sort();
        let mut p = GraphProgram {
            buffers: b.buffers,
            ops,
            transfers: xfers,
            outputs,
            gpus,
            storage: Vec::new(),
            merged,
            layout,
            channels_last: b.nhwc,
            layout_conversions: b.layout_conversions,
        };
        crate::memory::layout_distinct(&mut p);
        Ok(p)
    }

    /// Bytes of storage on each GPU (the layout's, see [`crate::memory`]).
    pub fn bytes_per_gpu(&self) -> Vec<u64> {
        let mut v = vec![0u64; self.gpus];
        for (slot, &n) in v.iter_mut().zip(&self.storage) {
            *slot = n as u64 * 4;
        }
        v
    }

    /// The host data a buffer starts with (`None` for buffers written before they are read).
    pub fn initial_data(&self, id: BufId) -> Option<Vec<f32>> {
        let spec = self.buffers.get(id)?;
        spec.init.values(spec.len)
    }
}

/// Every buffer `step` touches exists and holds at least the elements it touches, and no
/// buffer is both read and written. Devices check this before preparing a step, so a kernel
/// never reaches past a buffer.
pub fn check_access(p: &GraphProgram, step: &Step) -> Result<(), GpuError> {
    let a = step.access();
    for (id, need) in a.all() {
        let have = p.buffers.get(id).map(|b| b.len).ok_or_else(|| {
            GpuError::Plan(format!("step {}: buffer {id} does not exist", step.kind()))
        })?;
        if have < need {
            return Err(GpuError::Plan(format!(
                "step {}: buffer {id} holds {have} elements, needs {need}",
                step.kind()
            )));
        }
    }
    if a.reads.iter().any(|r| a.writes.iter().any(|w| w.0 == r.0)) {
        return Err(GpuError::Plan(format!(
            "step {}: a buffer is both read and written",
            step.kind()
        )));
    }
    Ok(())
}

/// `len` integers uniform in `[0, below)` from `seed`, as `f32` (exact below 2^24).
pub fn indices(seed: u64, len: usize, below: usize) -> Vec<f32> {
    let mut rng = opsched_graph::rng::SplitMix64::new(seed);
    (0..len)
        .map(|_| ((rng.next_f64() * below as f64) as usize).min(below.saturating_sub(1)) as f32)
        .collect()
}

/// `len` values uniform in `[center - half_width, center + half_width]` from `seed`.
pub fn uniform(seed: u64, len: usize, center: f32, half_width: f32) -> Vec<f32> {
    let mut rng = opsched_graph::rng::SplitMix64::new(seed);
    // A plain loop, so that the whole generation is compiled here (this crate is optimised
    // even in test builds: large models initialise millions of values per allocation).
    let mut v = Vec::with_capacity(len);
    for _ in 0..len {
        v.push(center + half_width * (2.0 * rng.next_f64() as f32 - 1.0));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::Runs;
    use proptest::prelude::*;

    proptest! {
        /// The ranges of a strided view hold exactly the parent elements its elements map to
        /// (`first + (i / run) * stride + i % run`), in order, and its span reaches the last.
        #[test]
        fn runs_map_elements_as_their_formula_says(
            run in 1usize..9,
            extra in 0usize..5,
            rows in 1usize..6,
            first in 0usize..20,
            a in 0usize..60,
            b in 0usize..60,
        ) {
            let runs = Runs { run, stride: run + extra };
            let len = rows * run;
            let part = a.min(b).min(len)..a.max(b).min(len);
            let want: Vec<usize> = part
                .clone()
                .map(|i| first + (i / run) * runs.stride + i % run)
                .collect();
            let got: Vec<usize> = Runs::storage(first, len, Some(runs), part)
                .into_iter()
                .flatten()
                .collect();
            prop_assert_eq!(got, want);
            prop_assert_eq!(runs.span(len), (rows - 1) * runs.stride + run);
            let dense: Vec<usize> = Runs::storage(first, len, None, 0..len)
                .into_iter()
                .flatten()
                .collect();
            prop_assert_eq!(dense, (first..first + len).collect::<Vec<_>>());
        }

        /// NCHW to NHWC and back is the identity, and element `(b, c, i)` of an NCHW value
        /// sits at `(b * pixels + i) * channels + c` channels last.
        #[test]
        fn the_layouts_map_each_element_where_its_order_says(
            shape in proptest::array::uniform4(1usize..5),
        ) {
            let [n, c, h, w] = shape;
            let len = n * c * h * w;
            let x: Vec<f32> = (0..len).map(|v| v as f32).collect();
            let mut y = vec![0.0; len];
            super::nchw_to_nhwc(&x, shape, &mut y);
            for b in 0..n {
                for ch in 0..c {
                    for i in 0..h * w {
                        prop_assert_eq!(
                            y[(b * h * w + i) * c + ch],
                            x[(b * c + ch) * h * w + i]
                        );
                    }
                }
            }
            prop_assert_eq!(super::nhwc_to_nchw(&y, shape), x);
        }
    }

    #[test]
    fn channels_last_is_for_cudnn_convolutions_and_what_follows_them() {
        use opsched_graph::{Activation, Conv2d, DType, GraphBuilder, Op, Pool2d};
        let mut b = GraphBuilder::new("layouts", DType::F32);
        let x = b.input("x", vec![2, 4, 8, 8]);
        let conv = b.conv("conv", x, Conv2d::new(4, 3));
        let relu = b.act("relu", conv, Activation::Relu);
        let other = b.conv("other", x, Conv2d::new(4, 1));
        let sum = b.add("sum", &[relu, other]);
        let inputs_only = b.add("inputs_only", &[x, x]);
        let depthwise = b.conv("depthwise", sum, Conv2d::new(4, 3).groups(4));
        let mut uneven = Conv2d::new(4, 2);
        uneven.padding_end = Some([0, 0]);
        let uneven = b.conv("uneven", sum, uneven);
        let grouped = b.conv("grouped", sum, Conv2d::new(8, 3).groups(2));
        let cat = b.concat("cat", &[depthwise, uneven]);
        let after_cat = b.conv("after_cat", cat, Conv2d::new(4, 1));
        let relu_op = Op::Activation {
            act: Activation::Relu,
        };
        // NASNet's relu + separable convolution, reading the graph's input; a chain without
        // a convolution that reads only NCHW values; one with a pool after a channels-last
        // value; one with a grouped (not depthwise) convolution.
        let separable = vec![
            relu_op.clone(),
            Op::Conv2d(Conv2d::new(4, 5).groups(4).bias(true)),
            Op::Conv2d(Conv2d::new(4, 1)),
        ];
        let sep = b.sequential("sep", x, separable);
        let acts = b.sequential("acts", uneven, vec![relu_op.clone(), relu_op.clone()]);
        let pooled = vec![relu_op.clone(), Op::Pool2d(Pool2d::max(3, 1, 1))];
        let pooled = b.sequential("pooled", after_cat, pooled);
        let grouped_chain = vec![relu_op, Op::Conv2d(Conv2d::new(4, 3).groups(2))];
        let grouped_chain = b.sequential("grouped_chain", sep, grouped_chain);
        let last = b.conv("last", pooled, Conv2d::new(4, 1));
        let tail = b.concat("tail", &[grouped, acts, grouped_chain]);
        b.add("out", &[last, inputs_only]);
        b.add("out2", &[tail, tail]);
        let g = b.finish().unwrap_or_else(|e| panic!("{e}"));
        let nhwc = super::channels_last(&g);
        let is = |name: &str| nhwc[g.find(name).map_or(usize::MAX, |n| n.index())];
        let last_ones = ["conv", "relu", "other", "sum", "depthwise", "cat"];
        for name in last_ones
            .into_iter()
            .chain(["after_cat", "sep", "pooled", "last"])
        {
            assert!(is(name), "{name} should be channels last");
        }
        // Unevenly padded and grouped convolutions run other kernels, as do chains of them;
        // a chain of activations of NCHW values, the graph's inputs and outputs stay NCHW, as
        // does an add of NCHW values only.
        let nchw = [
            "x",
            "uneven",
            "grouped",
            "grouped_chain",
            "acts",
            "tail",
            "inputs_only",
        ];
        for name in nchw.into_iter().chain(["out", "out2"]) {
            assert!(!is(name), "{name} should be NCHW");
        }
    }
}
