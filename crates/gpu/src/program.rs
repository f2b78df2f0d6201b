//! Lowering of graph operators to *steps*: the primitive kernels the GPU executes (and the CPU
//! step executor replays), with every buffer sized and placed before anything runs.
//!
//! A [`GraphProgram`] is built once per placement of the operators on (logical) GPUs. It holds
//! - [`BufSpec`]s: every device buffer, with its GPU, its length in elements and how it is
//!   initialised (graph inputs and parameters get deterministic pseudo-random data, keyed by the
//!   node's name, so a scheduled run, a sequential run and the CPU reference see the same
//!   numbers);
//! - per operator an [`OpProgram`]: the ordered [`Step`]s that compute its output on its GPU.
//!
//! ## Inputs: terms and values
//! An operator's input terms are materialised with [`Step::Copy`] (a strided slab copy that can
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
//! a row-major `[r, c]` buffer is the column-major `c x r` matrix, i.e. the transpose, so
//! `Y = X W^T` (row-major) is `Y^T = W X^T`, computed as `gemm(T, N, m = out, n = rows, k = in)`.

use std::collections::HashMap;

use opsched_graph::{Activation, ElementwiseKind, Graph, NodeId, Op, PoolKind, Shape, Value};

use crate::GpuError;

/// Index of a buffer in [`GraphProgram::buffers`].
pub type BufId = usize;

/// What a buffer holds.
#[derive(Clone, Debug, PartialEq)]
pub enum BufRole {
    /// A graph input (one copy per GPU that reads it).
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
}

/// How a buffer is filled before the first run.
#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    /// Written by the program before it is read.
    Uninit,
    /// Uniform in `[center - half_width, center + half_width]`, from a seed.
    Uniform {
        seed: u64,
        center: f32,
        half_width: f32,
    },
}

/// A device buffer of `f32` elements.
#[derive(Clone, Debug, PartialEq)]
pub struct BufSpec {
    pub gpu: usize,
    pub len: usize,
    pub role: BufRole,
    pub init: Init,
}

/// One primitive kernel.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Strided slab copy, for `o < outer, a < len, i < inner`:
    /// `dst[(o * dst_axis + dst_off + a) * inner + i] (+)= src[(o * src_axis + src_off + a) * inner + i]`.
    Copy {
        src: BufId,
        dst: BufId,
        outer: usize,
        src_axis: usize,
        src_off: usize,
        dst_axis: usize,
        dst_off: usize,
        len: usize,
        inner: usize,
        accumulate: bool,
    },
    /// 2-D convolution (NCHW), then `+ bias` (per output channel) and the activation.
    Conv {
        x: BufId,
        w: BufId,
        bias: Option<BufId>,
        y: BufId,
        /// Input `[n, c, h, w]`.
        input: [usize; 4],
        out_channels: usize,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
        /// Output `[oh, ow]`.
        out_hw: [usize; 2],
        act: Activation,
    },
    /// In place: `y[i] = act(y[i] + bias[(i / inner) % channels])` over `total` elements.
    BiasAct {
        y: BufId,
        bias: Option<BufId>,
        total: usize,
        channels: usize,
        inner: usize,
        act: Activation,
    },
    /// `y = act(x)` over `len` elements.
    Act {
        x: BufId,
        y: BufId,
        len: usize,
        act: Activation,
    },
    /// Max or average pooling (NCHW); average counts padding (PyTorch's default) with the
    /// window clipped to the padded input (PyTorch's `ceil_mode` rule).
    Pool {
        x: BufId,
        y: BufId,
        input: [usize; 4],
        out_hw: [usize; 2],
        max: bool,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    },
    /// Column-major, strided-batched `C = op(A) op(B)` (cuBLAS semantics, alpha 1, beta 0).
    Gemm {
        a: BufId,
        b: BufId,
        c: BufId,
        trans_a: bool,
        trans_b: bool,
        m: usize,
        n: usize,
        k: usize,
        lda: usize,
        ldb: usize,
        ldc: usize,
        stride_a: usize,
        stride_b: usize,
        stride_c: usize,
        batch: usize,
    },
    /// Softmax over the middle axis of `[outer, dim, inner]`.
    Softmax {
        x: BufId,
        y: BufId,
        outer: usize,
        dim: usize,
        inner: usize,
    },
    /// Layer norm over the last axis of `[rows, dim]` with `gamma` and `beta`.
    LayerNorm {
        x: BufId,
        gamma: BufId,
        beta: BufId,
        y: BufId,
        rows: usize,
        dim: usize,
        eps: f32,
    },
    /// `y = srcs[0] op srcs[1] op ...` element by element over `len` elements.
    Elementwise {
        srcs: Vec<BufId>,
        y: BufId,
        len: usize,
        kind: ElementwiseKind,
    },
    /// `y = permute(x)`: `y` has shape `perm.map(|p| in_shape[p])`.
    Transpose {
        x: BufId,
        y: BufId,
        in_shape: Vec<usize>,
        perm: Vec<usize>,
    },
    /// An abstract operator: keep `util` of the GPU's SMs busy for `time_ms`.
    Spin { time_ms: f64, util: f64 },
}

impl Step {
    /// Short name of the kernel kind (for traces and resource-demand tables).
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Copy { .. } => "copy",
            Step::Conv { .. } => "conv",
            Step::BiasAct { .. } => "bias_act",
            Step::Act { .. } => "act",
            Step::Pool { .. } => "pool",
            Step::Gemm { .. } => "gemm",
            Step::Softmax { .. } => "softmax",
            Step::LayerNorm { .. } => "layer_norm",
            Step::Elementwise { .. } => "elementwise",
            Step::Transpose { .. } => "transpose",
            Step::Spin { .. } => "spin",
        }
    }
}

/// The steps of one operator, run in order on one stream of its GPU.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpProgram {
    pub gpu: usize,
    pub steps: Vec<Step>,
    /// Its output buffer.
    pub output: BufId,
}

/// A transfer of `src`'s output to the GPU of its consumer `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferSpec {
    pub src: NodeId,
    pub dst: NodeId,
    pub dst_gpu: usize,
}

/// Every buffer and every operator's steps, for one placement of the operators on GPUs.
#[derive(Clone, Debug, Default)]
pub struct GraphProgram {
    pub buffers: Vec<BufSpec>,
    /// Per node (indexed by `NodeId`): the program of an operator, `None` for graph inputs and
    /// for operators the placement leaves out.
    pub ops: Vec<Option<OpProgram>>,
    /// Per transfer (in the order given to [`GraphProgram::build`]): (source buffer on the
    /// producer's GPU, replica buffer on the consumer's GPU).
    pub transfers: Vec<(BufId, BufId)>,
    /// Per node: its output buffer on its own GPU (graph inputs: the copy on the lowest GPU
    /// that reads it).
    pub outputs: Vec<Option<BufId>>,
    /// Number of GPUs the buffers span.
    pub gpus: usize,
}

/// FNV-1a 64 of a string: the seed of a named buffer.
pub fn seed_of(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
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
enum Src<'a> {
    Terms(&'a [Vec<Value>]),
    Buf(BufId, &'a [usize]),
}

struct Builder<'g> {
    g: &'g Graph,
    /// GPU of each operator node (None: not placed, or a graph input).
    placement: &'g [Option<usize>],
    buffers: Vec<BufSpec>,
    outputs: Vec<Option<BufId>>,
    /// (input node, gpu) -> buffer.
    input_copies: HashMap<(NodeId, usize), BufId>,
    /// (producer, consumer) -> replica buffer.
    replicas: HashMap<(NodeId, NodeId), BufId>,
}

impl<'g> Builder<'g> {
    fn alloc(&mut self, gpu: usize, len: usize, role: BufRole, init: Init) -> BufId {
        self.buffers.push(BufSpec {
            gpu,
            len: len.max(1),
            role,
            init,
        });
        self.buffers.len() - 1
    }

    fn scratch(&mut self, gpu: usize, node: NodeId, len: usize) -> BufId {
        self.alloc(gpu, len, BufRole::Scratch(node), Init::Uninit)
    }

    #[allow(clippy::too_many_arguments)]
    fn param(
        &mut self,
        gpu: usize,
        node: NodeId,
        inner: usize,
        what: &'static str,
        len: usize,
        center: f32,
        half_width: f32,
    ) -> BufId {
        let seed = param_seed(self.g, node, inner, what);
        self.alloc(
            gpu,
            len,
            BufRole::Param { node, inner, what },
            Init::Uniform {
                seed,
                center,
                half_width,
            },
        )
    }

    /// The buffer holding `producer`'s whole output as seen by `consumer` on `gpu`.
    fn source(
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
            let b = self.alloc(
                gpu,
                numel(&pn.shape),
                BufRole::Input(producer),
                Init::Uniform {
                    seed: input_seed(self.g, producer),
                    center: 0.0,
                    half_width: 1.0,
                },
            );
            self.input_copies.insert((producer, gpu), b);
            return Ok(b);
        }
        match self.placement.get(producer.index()).copied().flatten() {
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

    fn value_shape(&self, v: &Value) -> Shape {
        let mut s = self.g.node(v.node).shape.clone();
        if let (Some((b, e)), Some(c)) = (v.channels, s.get_mut(1)) {
            *c = e - b;
        }
        s
    }

    /// Copy (or accumulate) one value into `dst`, whose shape along axis 1 is `dst_axis` wide,
    /// at channel offset `dst_off`.
    #[allow(clippy::too_many_arguments)]
    fn copy_value(
        &mut self,
        steps: &mut Vec<Step>,
        node: NodeId,
        gpu: usize,
        v: &Value,
        dst: BufId,
        dst_axis: usize,
        dst_off: usize,
        accumulate: bool,
    ) -> Result<(), GpuError> {
        let src = self.source(v.node, node, gpu)?;
        let full = self.g.node(v.node).shape.clone();
        let shape = self.value_shape(v);
        if shape.len() < 2 {
            let n = numel(&shape);
            steps.push(Step::Copy {
                src,
                dst,
                outer: 1,
                src_axis: n,
                src_off: 0,
                dst_axis: n,
                dst_off: 0,
                len: n,
                inner: 1,
                accumulate,
            });
            return Ok(());
        }
        let (src_off, len) = match v.channels {
            Some((b, e)) => (b, e - b),
            None => (0, shape[1]),
        };
        steps.push(Step::Copy {
            src,
            dst,
            outer: shape[0],
            src_axis: full[1],
            src_off,
            dst_axis,
            dst_off,
            len,
            inner: numel(&shape[2..]),
            accumulate,
        });
        Ok(())
    }

    /// A buffer holding one term (in place when it is one whole value).
    fn term(
        &mut self,
        steps: &mut Vec<Step>,
        node: NodeId,
        gpu: usize,
        term: &[Value],
    ) -> Result<(BufId, Shape), GpuError> {
        let first = term
            .first()
            .ok_or_else(|| unsupported(self.g, node, "empty input term"))?;
        let shape = self.value_shape(first);
        if term.len() == 1 && first.channels.is_none() {
            return Ok((self.source(first.node, node, gpu)?, shape));
        }
        let dst = self.scratch(gpu, node, numel(&shape));
        let axis = shape.get(1).copied().unwrap_or(0);
        for (j, v) in term.iter().enumerate() {
            self.copy_value(steps, node, gpu, v, dst, axis, 0, j > 0)?;
        }
        Ok((dst, shape))
    }

    /// Concatenate terms along `axis` into `dst` (which must hold the concatenated shape).
    fn concat_into(
        &mut self,
        steps: &mut Vec<Step>,
        node: NodeId,
        gpu: usize,
        terms: &[Vec<Value>],
        axis: usize,
        dst: BufId,
    ) -> Result<Shape, GpuError> {
        let shapes: Vec<Shape> = terms
            .iter()
            .map(|t| t.first().map(|v| self.value_shape(v)).unwrap_or_default())
            .collect();
        let out = if shapes.len() == 1 {
            shapes[0].clone()
        } else {
            opsched_graph::op::concat_shapes(&shapes, axis)
                .map_err(|m| unsupported(self.g, node, m))?
        };
        let mut off = 0;
        for (t, shape) in terms.iter().zip(&shapes) {
            if axis == 1 && shape.len() >= 2 {
                for (j, v) in t.iter().enumerate() {
                    self.copy_value(steps, node, gpu, v, dst, out[1], off, j > 0)?;
                }
            } else {
                let (src, _) = self.term(steps, node, gpu, t)?;
                let a = axis.min(shape.len().saturating_sub(1));
                steps.push(Step::Copy {
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
                });
            }
            off += shape.get(axis).copied().unwrap_or(0);
        }
        Ok(out)
    }

    /// The single input of an operator that reads its terms concatenated along channels.
    fn single(
        &mut self,
        steps: &mut Vec<Step>,
        node: NodeId,
        gpu: usize,
        src: Src<'_>,
    ) -> Result<(BufId, Shape), GpuError> {
        match src {
            Src::Buf(b, shape) => Ok((b, shape.to_vec())),
            Src::Terms([t]) => self.term(steps, node, gpu, t),
            Src::Terms(terms) => {
                let shapes: Vec<Shape> = terms
                    .iter()
                    .map(|t| t.first().map(|v| self.value_shape(v)).unwrap_or_default())
                    .collect();
                let cat = opsched_graph::op::concat_shapes(&shapes, 1)
                    .map_err(|m| unsupported(self.g, node, m))?;
                let dst = self.scratch(gpu, node, numel(&cat));
                let shape = self.concat_into(steps, node, gpu, terms, 1, dst)?;
                Ok((dst, shape))
            }
        }
    }

    /// Input terms as separate buffers (element-wise ops, batch matmul).
    fn terms(
        &mut self,
        steps: &mut Vec<Step>,
        node: NodeId,
        gpu: usize,
        src: Src<'_>,
    ) -> Result<Vec<(BufId, Shape)>, GpuError> {
        match src {
            Src::Buf(b, shape) => Ok(vec![(b, shape.to_vec())]),
            Src::Terms(terms) => terms
                .iter()
                .map(|t| self.term(steps, node, gpu, t))
                .collect(),
        }
    }

    /// Lower `op` reading `src` into `out` (of shape `out_shape`). `inner` numbers the
    /// operators of a sequential chain (for parameter seeds).
    #[allow(clippy::too_many_arguments)]
    fn lower_op(
        &mut self,
        steps: &mut Vec<Step>,
        node: NodeId,
        gpu: usize,
        op: &Op,
        inner: usize,
        src: Src<'_>,
        out: BufId,
        out_shape: &[usize],
    ) -> Result<(), GpuError> {
        match op {
            Op::Input { .. } => {}
            // Not lowered yet (issue #16, phase 2): refused rather than run with wrong results.
            Op::Constant { .. } | Op::Binary { .. } | Op::Affine | Op::Pad { .. } | Op::LogSoftmax { .. } => return Err(unsupported(self.g, node, format!("{} has no GPU lowering yet", op.type_name()))),
            Op::Conv2d(c) if c.padding_end.is_some() || !crate::kernels::has_kernel(c.act) => return Err(unsupported(self.g, node, "asymmetric padding or this activation has no GPU lowering yet")),
            Op::Linear { act, .. } | Op::Activation { act } if !crate::kernels::has_kernel(*act) => return Err(unsupported(self.g, node, format!("activation {act} has no GPU lowering yet"))),
            Op::Pool2d(p) if p.padding_end.is_some() || !p.count_include_pad => return Err(unsupported(self.g, node, "asymmetric padding or count_include_pad = false has no GPU lowering yet")),
            Op::Elementwise { .. } if matches!(src, Src::Terms(_)) && self.g.input_shapes(node).iter().any(|s| s.as_slice() != out_shape) => return Err(unsupported(self.g, node, "broadcasting has no GPU lowering yet")),
            Op::Abstract { time_ms, util } => steps.push(Step::Spin {
                time_ms: *time_ms,
                util: *util,
            }),
            // A foreign ONNX operator has a shape but no semantics we could run.
            Op::Opaque { op_type, .. } => {
                return Err(GpuError::Unsupported {
                    node: self.g.node(node).name.clone(),
                    message: format!(
                        "'{op_type}' was imported as an opaque operator (--allow-unknown) and has no GPU kernel"
                    ),
                })
            }
            Op::Conv2d(c) => {
                let (x, xs) = self.single(steps, node, gpu, src)?;
                let [n, ch, h, w] = four(self.g, node, &xs)?;
                let [_, oc, oh, ow] = four(self.g, node, out_shape)?;
                let fan_in = ch / c.groups.max(1) * c.kernel[0] * c.kernel[1];
                let wlen = oc * fan_in;
                let a = weight_half_width(fan_in);
                let wb = self.param(gpu, node, inner, "weight", wlen, 0.0, a);
                let bias = c
                    .bias
                    .then(|| self.param(gpu, node, inner, "bias", oc, 0.0, 0.1));
                steps.push(Step::Conv {
                    x,
                    w: wb,
                    bias,
                    y: out,
                    input: [n, ch, h, w],
                    out_channels: oc,
                    kernel: c.kernel,
                    stride: c.stride,
                    padding: c.padding,
                    dilation: c.dilation,
                    groups: c.groups,
                    out_hw: [oh, ow],
                    act: c.act,
                });
            }
            Op::Pool2d(p) => {
                let (x, xs) = self.single(steps, node, gpu, src)?;
                let [n, ch, h, w] = four(self.g, node, &xs)?;
                let [_, _, oh, ow] = four(self.g, node, out_shape)?;
                let global = p.kind.is_global();
                steps.push(Step::Pool {
                    x,
                    y: out,
                    input: [n, ch, h, w],
                    out_hw: [oh, ow],
                    max: matches!(p.kind, PoolKind::Max | PoolKind::GlobalMax),
                    kernel: if global { [h, w] } else { p.kernel },
                    stride: if global { [1, 1] } else { p.stride },
                    padding: if global { [0, 0] } else { p.padding },
                });
            }
            Op::Activation { act } => {
                let (x, xs) = self.single(steps, node, gpu, src)?;
                steps.push(Step::Act {
                    x,
                    y: out,
                    len: numel(&xs),
                    act: *act,
                });
            }
            Op::Elementwise { kind } => {
                let ts = self.terms(steps, node, gpu, src)?;
                steps.push(Step::Elementwise {
                    srcs: ts.iter().map(|t| t.0).collect(),
                    y: out,
                    len: numel(out_shape),
                    kind: *kind,
                });
            }
            Op::Concat { axis } => match src {
                Src::Terms(terms) => {
                    self.concat_into(steps, node, gpu, terms, *axis, out)?;
                }
                Src::Buf(b, s) => steps.push(copy_whole(b, out, numel(s))),
            },
            Op::Identity | Op::Reshape { .. } => match src {
                Src::Terms(terms) if terms.len() > 1 => {
                    self.concat_into(steps, node, gpu, terms, 1, out)?;
                }
                _ => {
                    let (x, xs) = self.single(steps, node, gpu, src)?;
                    steps.push(copy_whole(x, out, numel(&xs)));
                }
            },
            Op::Linear {
                out_features,
                bias,
                act,
            } => {
                let (x, xs) = self.single(steps, node, gpu, src)?;
                let k = xs.last().copied().unwrap_or(1);
                let rows = numel(&xs) / k.max(1);
                let nf = *out_features;
                let a = weight_half_width(k);
                let w = self.param(gpu, node, inner, "weight", nf * k, 0.0, a);
                let b = bias.then(|| self.param(gpu, node, inner, "bias", nf, 0.0, 0.1));
                steps.push(Step::Gemm {
                    a: w,
                    b: x,
                    c: out,
                    trans_a: true,
                    trans_b: false,
                    m: nf,
                    n: rows,
                    k,
                    lda: k,
                    ldb: k,
                    ldc: nf,
                    stride_a: 0,
                    stride_b: 0,
                    stride_c: 0,
                    batch: 1,
                });
                if b.is_some() || *act != Activation::None {
                    steps.push(Step::BiasAct {
                        y: out,
                        bias: b,
                        total: rows * nf,
                        channels: nf,
                        inner: 1,
                        act: *act,
                    });
                }
            }
            Op::BatchMatmul { transpose_b } => {
                let ts = self.terms(steps, node, gpu, src)?;
                let [(a, sa), (b, _)] = ts.as_slice() else {
                    return Err(unsupported(self.g, node, "batch_matmul needs two inputs"));
                };
                let r = sa.len();
                if r < 2 {
                    return Err(unsupported(self.g, node, "batch_matmul needs rank >= 2"));
                }
                let (m, k) = (sa[r - 2], sa[r - 1]);
                let n = out_shape.last().copied().unwrap_or(1);
                let batch = numel(&sa[..r - 2]);
                // Row-major C[M,N] = A[M,K] B[K,N]  <=>  column-major C^T = B^T A^T.
                steps.push(Step::Gemm {
                    a: *b,
                    b: *a,
                    c: out,
                    trans_a: *transpose_b,
                    trans_b: false,
                    m: n,
                    n: m,
                    k,
                    lda: if *transpose_b { k } else { n },
                    ldb: k,
                    ldc: n,
                    stride_a: k * n,
                    stride_b: m * k,
                    stride_c: m * n,
                    batch,
                });
            }
            Op::Softmax { axis } => {
                let (x, xs) = self.single(steps, node, gpu, src)?;
                let r = xs.len() as i64;
                let ax = if *axis < 0 { r + axis } else { *axis };
                if ax < 0 || ax >= r {
                    return Err(unsupported(self.g, node, "softmax axis out of range"));
                }
                let ax = ax as usize;
                steps.push(Step::Softmax {
                    x,
                    y: out,
                    outer: numel(&xs[..ax]),
                    dim: xs[ax],
                    inner: numel(&xs[ax + 1..]),
                });
            }
            Op::LayerNorm { eps } => {
                let (x, xs) = self.single(steps, node, gpu, src)?;
                let dim = xs.last().copied().unwrap_or(1);
                let gamma = self.param(gpu, node, inner, "gamma", dim, 1.0, 0.1);
                let beta = self.param(gpu, node, inner, "beta", dim, 0.0, 0.1);
                steps.push(Step::LayerNorm {
                    x,
                    gamma,
                    beta,
                    y: out,
                    rows: numel(&xs) / dim.max(1),
                    dim,
                    eps: *eps as f32,
                });
            }
            Op::Transpose { perm } => {
                let (x, xs) = self.single(steps, node, gpu, src)?;
                steps.push(Step::Transpose {
                    x,
                    y: out,
                    in_shape: xs,
                    perm: perm.clone(),
                });
            }
            Op::Sequential { ops } => {
                let mut cur: Option<(BufId, Shape)> = None;
                let mut shapes: Vec<Shape> = match src {
                    Src::Terms(_) => self.g.input_shapes(node),
                    Src::Buf(_, s) => vec![s.to_vec()],
                };
                for (i, inner_op) in ops.iter().enumerate() {
                    let shape = inner_op
                        .infer_shape(&shapes)
                        .map_err(|m| unsupported(self.g, node, m))?;
                    let last = i + 1 == ops.len();
                    let dst = if last {
                        out
                    } else {
                        self.scratch(gpu, node, numel(&shape))
                    };
                    let s = match &cur {
                        None => src,
                        Some((b, s)) => Src::Buf(*b, s),
                    };
                    self.lower_op(steps, node, gpu, inner_op, i, s, dst, &shape)?;
                    shapes = vec![shape.clone()];
                    cur = Some((dst, shape));
                }
            }
        }
        Ok(())
    }
}

fn four(g: &Graph, node: NodeId, s: &[usize]) -> Result<[usize; 4], GpuError> {
    match s {
        [a, b, c, d] => Ok([*a, *b, *c, *d]),
        _ => Err(unsupported(
            g,
            node,
            format!("expects a 4-D tensor, got {s:?}"),
        )),
    }
}

fn copy_whole(src: BufId, dst: BufId, n: usize) -> Step {
    Step::Copy {
        src,
        dst,
        outer: 1,
        src_axis: n,
        src_off: 0,
        dst_axis: n,
        dst_off: 0,
        len: n,
        inner: 1,
        accumulate: false,
    }
}

impl GraphProgram {
    /// The program of `g` with every operator on GPU 0 and no transfers.
    pub fn single_gpu(g: &Graph) -> Result<GraphProgram, GpuError> {
        let placement: Vec<Option<usize>> = g
            .nodes()
            .iter()
            .map(|n| (!n.op.is_input()).then_some(0))
            .collect();
        Self::build(g, &placement, &[])
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
            b.lower_op(
                &mut steps,
                id,
                gpu,
                &node.op,
                0,
                Src::Terms(&node.inputs),
                out,
                &node.shape,
            )?;
            ops[id.index()] = Some(OpProgram {
                gpu,
                steps,
                output: out,
            });
        }
        // Graph inputs read by nobody still get a buffer on GPU 0 (their outputs are reported).
        let mut outputs = b.outputs.clone();
        for n in g.inputs() {
            let copy = (0..gpus).find_map(|gpu| b.input_copies.get(&(n, gpu)).copied());
            outputs[n.index()] = copy;
        }
        Ok(GraphProgram {
            buffers: b.buffers,
            ops,
            transfers: xfers,
            outputs,
            gpus,
        })
    }

    /// Total bytes of the buffers on each GPU.
    pub fn bytes_per_gpu(&self) -> Vec<u64> {
        let mut v = vec![0u64; self.gpus];
        for b in &self.buffers {
            if let Some(slot) = v.get_mut(b.gpu) {
                *slot += b.len as u64 * 4;
            }
        }
        v
    }

    /// The host data a buffer starts with (`None` for buffers written before they are read).
    pub fn initial_data(&self, id: BufId) -> Option<Vec<f32>> {
        let spec = self.buffers.get(id)?;
        match spec.init {
            Init::Uninit => None,
            Init::Uniform {
                seed,
                center,
                half_width,
            } => Some(uniform(seed, spec.len, center, half_width)),
        }
    }
}

/// `len` values uniform in `[center - half_width, center + half_width]` from `seed`.
pub fn uniform(seed: u64, len: usize, center: f32, half_width: f32) -> Vec<f32> {
    let mut rng = opsched_graph::rng::SplitMix64::new(seed);
    (0..len)
        .map(|_| center + half_width * (2.0 * rng.next_f64() as f32 - 1.0))
        .collect()
}
