//! Operators: parameters, output-shape inference, FLOPs, bytes and parameter counts.
//!
//! Shapes include the batch dimension. Image tensors are NCHW; sequence tensors are
//! `[batch, seq, hidden]` or `[batch, heads, seq, head_dim]`.
//!
//! An operator sees its inputs as a list of *terms* (see [`crate::Term`]): each term is one
//! tensor (the sum of the channel slices it lists). Most operators take the terms concatenated
//! along the channel axis (axis 1) as their single input, exactly as IOS does; `add` and `mul`
//! combine the terms element by element, `concat` joins them along its axis and `batch_matmul`
//! takes exactly two.
//!
//! FLOPs count a multiply-add as two operations. Bytes count every input element read once,
//! every parameter read once and every output element written once.

use serde::{Deserialize, Serialize};

use crate::limits::{self, add, check_param, count, mul, numel};
use crate::resize::Resize;

/// A tensor shape, batch dimension included.
pub type Shape = Vec<usize>;

/// Element type of every tensor of a graph.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    #[default]
    F32,
    F16,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
        })
    }
}

/// Activation function (any element-wise function of one value), standalone or fused into the
/// kernel before it (a convolution, a linear layer, an element-wise operator).
///
/// Serialized in snake case: the ones without parameters as a string (`"relu"`), the others as
/// an object (`{"clip": {"min": 0.0, "max": 6.0}}`). Parameters are `f32`, as ONNX stores them.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    #[default]
    None,
    Relu,
    Sigmoid,
    Tanh,
    /// GELU, exact form: `x * (1 + erf(x / sqrt 2)) / 2`.
    Gelu,
    /// GELU, tanh approximation (ONNX `Gelu` with `approximate = "tanh"`).
    GeluTanh,
    /// `min(max(x, min), max)`; an absent bound does not clip (ReLU6 is `clip(0, 6)`).
    Clip {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<f32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<f32>,
    },
    /// `x` where `x >= 0`, else `alpha * x`.
    LeakyRelu {
        alpha: f32,
    },
    /// `max(0, min(1, alpha * x + beta))`.
    HardSigmoid {
        alpha: f32,
        beta: f32,
    },
    /// `x * max(0, min(1, x / 6 + 1 / 2))`.
    HardSwish,
    /// `x * sigmoid(alpha * x)` (ONNX `Swish`); with `alpha` 1 (the default) it is SiLU,
    /// which PyTorch exports as `Sigmoid` and `Mul`.
    Swish {
        #[serde(default = "one_f32")]
        alpha: f32,
    },
    /// `log(1 + exp(x))`, computed as `max(x, 0) + log1p(exp(-|x|))` (no overflow).
    Softplus,
    /// `x * tanh(softplus(x))`.
    Mish,
    // Element-wise functions of one value that models write out (an RMS norm's square root
    // and reciprocal, rotary embeddings' sines, a standalone erf): ONNX's operators of the
    // same names. As activations they run in the kernel before them like any other.
    Sqrt,
    Reciprocal,
    Exp,
    Log,
    Neg,
    Abs,
    Erf,
    Sin,
    Cos,
    /// `x` where `x >= 0`, else `alpha * (exp(x) - 1)` (ONNX `Elu`).
    Elu {
        #[serde(default = "one_f32")]
        alpha: f32,
    },
    /// `gamma * x` where `x > 0`, else `gamma * alpha * (exp(x) - 1)` (ONNX `Selu`; its
    /// defaults those of self-normalising networks).
    Selu {
        #[serde(default = "selu_alpha")]
        alpha: f32,
        #[serde(default = "selu_gamma")]
        gamma: f32,
    },
    /// `max(0, x) + min(0, alpha * (exp(x / alpha) - 1))` (ONNX `Celu`).
    Celu {
        #[serde(default = "one_f32")]
        alpha: f32,
    },
    /// `x` where `x > alpha`, else 0 (ONNX `ThresholdedRelu`).
    ThresholdedRelu {
        #[serde(default = "one_f32")]
        alpha: f32,
    },
    /// `x / (1 + |x|)`.
    Softsign,
    /// -1, 0 or 1 as `x` is negative, zero or positive.
    Sign,
    Floor,
    Ceil,
    /// To the nearest integer, halves to even (ONNX `Round`).
    Round,
    /// 1 where `x` is NaN, else 0 (ONNX `IsNaN`: booleans are 1.0 and 0.0).
    IsNan,
    /// 1 where `x` is an infinity of a sign it detects, else 0 (ONNX `IsInf`).
    IsInf {
        #[serde(default = "yes")]
        negative: bool,
        #[serde(default = "yes")]
        positive: bool,
    },
}

fn selu_alpha() -> f32 {
    Activation::SELU_ALPHA
}
fn selu_gamma() -> f32 {
    Activation::SELU_GAMMA
}

impl Activation {
    /// ONNX `Selu`'s default `alpha` and `gamma` (those of self-normalising networks).
    pub const SELU_ALPHA: f32 = 1.673_263_2;
    pub const SELU_GAMMA: f32 = 1.050_701;

    /// Whether every parameter is a finite number (a clip's bounds may be infinite: no bound).
    fn finite(self) -> bool {
        match self {
            Activation::LeakyRelu { alpha }
            | Activation::Swish { alpha }
            | Activation::Elu { alpha }
            | Activation::Celu { alpha }
            | Activation::ThresholdedRelu { alpha } => alpha.is_finite(),
            Activation::Selu { alpha, gamma } => alpha.is_finite() && gamma.is_finite(),
            Activation::HardSigmoid { alpha, beta } => alpha.is_finite() && beta.is_finite(),
            _ => true,
        }
    }

    /// FLOPs per element (a rough count of the arithmetic of a typical implementation).
    pub fn flops_per_element(self) -> u64 {
        match self {
            Activation::None => 0,
            Activation::Relu => 1,
            Activation::Clip { .. } | Activation::LeakyRelu { .. } => 2,
            Activation::HardSigmoid { .. } => 3,
            Activation::Sigmoid | Activation::Tanh | Activation::HardSwish => 4,
            Activation::Swish { .. } => 5,
            Activation::Sqrt | Activation::Reciprocal | Activation::Neg | Activation::Abs => 1,
            Activation::Exp | Activation::Log | Activation::Sin | Activation::Cos => 4,
            Activation::Softplus => 6,
            Activation::Erf => 8,
            Activation::Mish => 10,
            Activation::Gelu | Activation::GeluTanh => 8,
            Activation::Sign
            | Activation::Floor
            | Activation::Ceil
            | Activation::Round
            | Activation::IsNan
            | Activation::IsInf { .. }
            | Activation::ThresholdedRelu { .. } => 1,
            Activation::Softsign => 3,
            Activation::Elu { .. } | Activation::Selu { .. } | Activation::Celu { .. } => 6,
        }
    }

    fn is_none(&self) -> bool {
        *self == Activation::None
    }

    /// The variant's number, for good: the GPU kernels' activation code (`act_f` in
    /// `opsched-gpu`) and, with [`Activation::params`], the key of equality and hashing.
    pub fn code(self) -> u8 {
        match self {
            Activation::None => 0,
            Activation::Relu => 1,
            Activation::Sigmoid => 2,
            Activation::Tanh => 3,
            Activation::Gelu => 4,
            Activation::GeluTanh => 5,
            Activation::Clip { .. } => 6,
            Activation::LeakyRelu { .. } => 7,
            Activation::HardSigmoid { .. } => 8,
            Activation::HardSwish => 9,
            Activation::Swish { .. } => 10,
            Activation::Softplus => 11,
            Activation::Mish => 12,
            Activation::Sqrt => 13,
            Activation::Reciprocal => 14,
            Activation::Exp => 15,
            Activation::Log => 16,
            Activation::Neg => 17,
            Activation::Abs => 18,
            Activation::Erf => 19,
            Activation::Sin => 20,
            Activation::Cos => 21,
            Activation::Elu { .. } => 22,
            Activation::Selu { .. } => 23,
            Activation::Celu { .. } => 24,
            Activation::ThresholdedRelu { .. } => 25,
            Activation::Softsign => 26,
            Activation::Sign => 27,
            Activation::Floor => 28,
            Activation::Ceil => 29,
            Activation::Round => 30,
            Activation::IsNan => 31,
            Activation::IsInf { .. } => 32,
        }
    }

    /// The parameters, in the order the variant declares them (`None`: a clip's bound it does
    /// not have, or no parameter); a detector's flags are 1.0 or 0.0.
    pub fn params(self) -> [Option<f32>; 2] {
        match self {
            Activation::Clip { min, max } => [min, max],
            Activation::LeakyRelu { alpha }
            | Activation::Swish { alpha }
            | Activation::Elu { alpha }
            | Activation::Celu { alpha }
            | Activation::ThresholdedRelu { alpha } => [Some(alpha), None],
            Activation::HardSigmoid { alpha, beta } => [Some(alpha), Some(beta)],
            Activation::Selu { alpha, gamma } => [Some(alpha), Some(gamma)],
            Activation::IsInf { negative, positive } => {
                [negative, positive].map(|on| Some(f32::from(u8::from(on))))
            }
            // No wildcard: a new variant's parameters must join the key.
            Activation::None
            | Activation::Relu
            | Activation::Sigmoid
            | Activation::Tanh
            | Activation::Gelu
            | Activation::GeluTanh
            | Activation::HardSwish
            | Activation::Softplus
            | Activation::Mish
            | Activation::Sqrt
            | Activation::Reciprocal
            | Activation::Exp
            | Activation::Log
            | Activation::Neg
            | Activation::Abs
            | Activation::Erf
            | Activation::Sin
            | Activation::Cos
            | Activation::Softsign
            | Activation::Sign
            | Activation::Floor
            | Activation::Ceil
            | Activation::Round
            | Activation::IsNan => [None; 2],
        }
    }

    /// [`Activation::code`] and the bit patterns of the parameters: equality and hashing
    /// compare parameters bit for bit, so `Eq` holds (a NaN parameter equals itself).
    fn key(&self) -> (u8, [Option<u32>; 2]) {
        (self.code(), self.params().map(|p| p.map(f32::to_bits)))
    }
}

impl PartialEq for Activation {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Activation {}

impl std::hash::Hash for Activation {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

/// Snake case with the parameters: `relu`, `clip(min=0,max=6)`, `leaky_relu(alpha=0.01)`.
impl std::fmt::Display for Activation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Activation::None => f.write_str("none"),
            Activation::Relu => f.write_str("relu"),
            Activation::Sigmoid => f.write_str("sigmoid"),
            Activation::Tanh => f.write_str("tanh"),
            Activation::Gelu => f.write_str("gelu"),
            Activation::GeluTanh => f.write_str("gelu_tanh"),
            Activation::HardSwish => f.write_str("hard_swish"),
            Activation::Softplus => f.write_str("softplus"),
            Activation::Mish => f.write_str("mish"),
            Activation::Sqrt => f.write_str("sqrt"),
            Activation::Reciprocal => f.write_str("reciprocal"),
            Activation::Exp => f.write_str("exp"),
            Activation::Log => f.write_str("log"),
            Activation::Neg => f.write_str("neg"),
            Activation::Abs => f.write_str("abs"),
            Activation::Erf => f.write_str("erf"),
            Activation::Sin => f.write_str("sin"),
            Activation::Cos => f.write_str("cos"),
            Activation::Softsign => f.write_str("softsign"),
            Activation::Sign => f.write_str("sign"),
            Activation::Floor => f.write_str("floor"),
            Activation::Ceil => f.write_str("ceil"),
            Activation::Round => f.write_str("round"),
            Activation::IsNan => f.write_str("is_nan"),
            Activation::IsInf { negative, positive } => {
                write!(f, "is_inf(negative={negative},positive={positive})")
            }
            Activation::Elu { alpha } => write!(f, "elu(alpha={alpha})"),
            Activation::Celu { alpha } => write!(f, "celu(alpha={alpha})"),
            Activation::ThresholdedRelu { alpha } => write!(f, "thresholded_relu(alpha={alpha})"),
            Activation::Selu { alpha, gamma } => write!(f, "selu(alpha={alpha},gamma={gamma})"),
            Activation::Clip { min, max } => {
                f.write_str("clip(")?;
                if let Some(v) = min {
                    write!(f, "min={v}")?;
                }
                if let Some(v) = max {
                    let sep = if min.is_some() { "," } else { "" };
                    write!(f, "{sep}max={v}")?;
                }
                f.write_str(")")
            }
            Activation::LeakyRelu { alpha } => write!(f, "leaky_relu(alpha={alpha})"),
            Activation::Swish { alpha } => write!(f, "swish(alpha={alpha})"),
            Activation::HardSigmoid { alpha, beta } => {
                write!(f, "hard_sigmoid(alpha={alpha},beta={beta})")
            }
        }
    }
}

/// Kind of pooling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    Max,
    Avg,
    GlobalMax,
    GlobalAvg,
}

impl PoolKind {
    /// Whether the pool reduces the whole spatial extent.
    pub fn is_global(self) -> bool {
        matches!(self, PoolKind::GlobalMax | PoolKind::GlobalAvg)
    }
}

/// Element-wise combination of N inputs (shapes broadcast as in numpy).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ElementwiseKind {
    Add,
    Mul,
}

/// How a `reduce` combines the elements it reduces. Serialized in snake case (`"mean"`,
/// `"sum_square"`, `"last_arg_max"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceKind {
    Mean,
    Sum,
    Max,
    Min,
    /// The product (ONNX `ReduceProd`).
    Prod,
    /// The sum of magnitudes (`ReduceL1`).
    L1,
    /// The square root of the sum of squares (`ReduceL2`).
    L2,
    /// The sum of squares (`ReduceSumSquare`).
    SumSquare,
    /// The natural logarithm of the sum (`ReduceLogSum`).
    LogSum,
    /// The index of the first largest element (ONNX `ArgMax`), as a float like every value.
    ArgMax,
    /// The index of the first smallest element (`ArgMin`).
    ArgMin,
    /// The index of the last largest element (`ArgMax` with `select_last_index`).
    LastArgMax,
    /// The index of the last smallest element (`ArgMin` with `select_last_index`).
    LastArgMin,
    /// `log(sum(exp(x)))` (`ReduceLogSumExp`), as `m + log(sum(exp(x - m)))` with `m` the
    /// largest element (no overflow): two passes, the fold of the first the maximum's
    /// ([`ReduceKind::log_sum_exp`] the result).
    LogSumExp,
}

impl ReduceKind {
    /// The value a reduction starts from (an index kind: the best value so far, at index 0).
    pub fn start(self) -> f32 {
        match self {
            ReduceKind::Max
            | ReduceKind::ArgMax
            | ReduceKind::LastArgMax
            | ReduceKind::LogSumExp => f32::NEG_INFINITY,
            ReduceKind::Min | ReduceKind::ArgMin | ReduceKind::LastArgMin => f32::INFINITY,
            ReduceKind::Prod => 1.0,
            _ => 0.0,
        }
    }

    /// `acc` combined with the next element `v` (elements in order, as the reference and the
    /// CUDA kernel sum; the CPU device sums a row of consecutive elements in lanes). An index kind keeps its best value this way and its index by
    /// [`ReduceKind::replaces`].
    pub fn step(self, acc: f32, v: f32) -> f32 {
        match self {
            ReduceKind::Mean | ReduceKind::Sum | ReduceKind::LogSum => acc + v,
            ReduceKind::Max | ReduceKind::LogSumExp => acc.max(v),
            ReduceKind::Min => acc.min(v),
            ReduceKind::ArgMax
            | ReduceKind::ArgMin
            | ReduceKind::LastArgMax
            | ReduceKind::LastArgMin => match self.replaces(v, acc) {
                true => v,
                false => acc,
            },
            ReduceKind::Prod => acc * v,
            ReduceKind::L1 => acc + v.abs(),
            ReduceKind::L2 | ReduceKind::SumSquare => acc + v * v,
        }
    }

    /// The result after `count` elements (a mean divides the sum by them, L2 takes its
    /// square root, LogSum its logarithm).
    pub fn finish(self, acc: f32, count: usize) -> f32 {
        match self {
            ReduceKind::Mean => acc / count as f32,
            ReduceKind::L2 => acc.sqrt(),
            ReduceKind::LogSum => acc.ln(),
            _ => acc,
        }
    }

    /// Whether the result is an index (`ArgMax` and its kin), not a value.
    pub fn is_index(self) -> bool {
        matches!(
            self,
            ReduceKind::ArgMax
                | ReduceKind::ArgMin
                | ReduceKind::LastArgMax
                | ReduceKind::LastArgMin
        )
    }

    /// For an index kind, whether element `v` takes the place of the best one so far, `best`
    /// (ties: the first keeps it, the last takes it; NaN never does).
    pub fn replaces(self, v: f32, best: f32) -> bool {
        match self {
            ReduceKind::ArgMax => v > best,
            ReduceKind::ArgMin => v < best,
            ReduceKind::LastArgMax => v >= best,
            ReduceKind::LastArgMin => v <= best,
            _ => false,
        }
    }

    /// `LogSumExp`'s result from the largest element `max` and the sum of `exp(x - max)`
    /// over the elements: `max` itself where it is infinite (no `inf - inf`).
    pub fn log_sum_exp(max: f32, shifted_sum: f32) -> f32 {
        match max.is_infinite() {
            true => max,
            false => max + shifted_sum.ln(),
        }
    }

    /// The code the CUDA kernel takes (0 mean, 1 sum, 2 max, 3 min, 4 prod, 5 L1, 6 L2,
    /// 7 sum of squares, 8 log of the sum, 9 argmax, 10 argmin, 11 and 12 the last ones,
    /// 13 log of the sum of exponentials).
    pub fn code(self) -> i32 {
        self as i32
    }

    /// Every kind, in the order of their codes.
    pub const ALL: [ReduceKind; 14] = [
        ReduceKind::Mean,
        ReduceKind::Sum,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::Prod,
        ReduceKind::L1,
        ReduceKind::L2,
        ReduceKind::SumSquare,
        ReduceKind::LogSum,
        ReduceKind::ArgMax,
        ReduceKind::ArgMin,
        ReduceKind::LastArgMax,
        ReduceKind::LastArgMin,
        ReduceKind::LogSumExp,
    ];
}

/// Element-wise operation of two ordered inputs (shapes broadcast as in numpy): `a - b`,
/// `a / b`, `a ^ b`, `max(a, b)`, `min(a, b)`, and the comparisons `a == b`, `a < b`, `a > b`,
/// `a <= b`, `a >= b`, `a != b` (ONNX's `Xor` of booleans), which give 1.0 where they hold and
/// 0.0 elsewhere (ONNX's boolean results, as the masks that multiply or select values read
/// them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinaryKind {
    Sub,
    Div,
    Pow,
    Max,
    Min,
    Equal,
    Less,
    Greater,
    LessOrEqual,
    GreaterOrEqual,
    NotEqual,
}

/// `Where`'s element: `a` where `cond` is not 0 (a boolean's 1.0, or any other value), else
/// `b`, as every executor computes it.
pub fn select(cond: f32, a: f32, b: f32) -> f32 {
    if cond != 0.0 {
        a
    } else {
        b
    }
}

impl BinaryKind {
    /// `a op b`, as every executor computes it.
    pub fn apply(self, a: f32, b: f32) -> f32 {
        let holds = |c: bool| if c { 1.0 } else { 0.0 };
        match self {
            BinaryKind::Sub => a - b,
            BinaryKind::Div => a / b,
            BinaryKind::Pow => a.powf(b),
            BinaryKind::Max => a.max(b),
            BinaryKind::Min => a.min(b),
            #[allow(clippy::float_cmp)]
            BinaryKind::Equal => holds(a == b),
            BinaryKind::Less => holds(a < b),
            BinaryKind::Greater => holds(a > b),
            BinaryKind::LessOrEqual => holds(a <= b),
            BinaryKind::GreaterOrEqual => holds(a >= b),
            #[allow(clippy::float_cmp)]
            BinaryKind::NotEqual => holds(a != b),
        }
    }
}

fn one() -> usize {
    1
}
fn one_f32() -> f32 {
    1.0
}
fn one2() -> [usize; 2] {
    [1, 1]
}
fn zero2() -> [usize; 2] {
    [0, 0]
}
fn is_one(v: &usize) -> bool {
    *v == 1
}
#[allow(clippy::float_cmp, clippy::trivially_copy_pass_by_ref)]
fn is_one_f32(v: &f32) -> bool {
    *v == 1.0
}
fn is_one2(v: &[usize; 2]) -> bool {
    *v == [1, 1]
}
fn is_zero2(v: &[usize; 2]) -> bool {
    *v == [0, 0]
}
fn is_false(v: &bool) -> bool {
    !*v
}
fn default_util() -> f64 {
    1.0
}
fn minus_one() -> i64 {
    -1
}
fn default_eps() -> f64 {
    1e-5
}
fn yes() -> bool {
    true
}
fn is_true(v: &bool) -> bool {
    *v
}

/// 2-D convolution (NCHW).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conv2d {
    pub out_channels: usize,
    pub kernel: [usize; 2],
    #[serde(default = "one2", skip_serializing_if = "is_one2")]
    pub stride: [usize; 2],
    /// Top and left padding (and bottom and right unless `padding_end` says otherwise).
    #[serde(default = "zero2", skip_serializing_if = "is_zero2")]
    pub padding: [usize; 2],
    /// Bottom and right padding when they differ from `padding` (ONNX's asymmetric `pads`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub padding_end: Option<[usize; 2]>,
    #[serde(default = "one2", skip_serializing_if = "is_one2")]
    pub dilation: [usize; 2],
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub groups: usize,
    #[serde(default, skip_serializing_if = "is_false")]
    pub bias: bool,
    #[serde(default, skip_serializing_if = "Activation::is_none")]
    pub act: Activation,
}

impl Conv2d {
    /// A square `k x k` convolution with stride 1, "same" padding for odd `k`, no bias, no activation.
    pub fn new(out_channels: usize, k: usize) -> Self {
        Conv2d {
            out_channels,
            kernel: [k, k],
            stride: [1, 1],
            padding: [k / 2, k / 2],
            padding_end: None,
            dilation: [1, 1],
            groups: 1,
            bias: false,
            act: Activation::None,
        }
    }
    /// A `kh x kw` convolution with "same" padding.
    pub fn rect(out_channels: usize, kh: usize, kw: usize) -> Self {
        Conv2d {
            kernel: [kh, kw],
            padding: [kh / 2, kw / 2],
            ..Conv2d::new(out_channels, 1)
        }
    }
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = [s, s];
        self
    }
    pub fn padding(mut self, ph: usize, pw: usize) -> Self {
        self.padding = [ph, pw];
        self
    }
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = [d, d];
        self
    }
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }
    pub fn bias(mut self, b: bool) -> Self {
        self.bias = b;
        self
    }
    pub fn act(mut self, a: Activation) -> Self {
        self.act = a;
        self
    }
    pub fn relu(self) -> Self {
        self.act(Activation::Relu)
    }
    /// Padding before and after each spatial axis: `([top, left], [bottom, right])`.
    pub fn pads(&self) -> ([usize; 2], [usize; 2]) {
        (self.padding, self.padding_end.unwrap_or(self.padding))
    }
}

/// Pooling (NCHW).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pool2d {
    pub kind: PoolKind,
    /// Ignored by global pools.
    #[serde(default = "one2")]
    pub kernel: [usize; 2],
    #[serde(default = "one2", skip_serializing_if = "is_one2")]
    pub stride: [usize; 2],
    /// Top and left padding (and bottom and right unless `padding_end` says otherwise).
    #[serde(default = "zero2", skip_serializing_if = "is_zero2")]
    pub padding: [usize; 2],
    /// Bottom and right padding when they differ from `padding` (ONNX's asymmetric `pads`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub padding_end: Option<[usize; 2]>,
    /// Round the output size up instead of down (PyTorch's `ceil_mode`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub ceil_mode: bool,
    /// Average pools: divide by the window's size counted up to the end of the padding
    /// (PyTorch's default, and what every pool without this field means), else by the number
    /// of input elements in the window (ONNX's default).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub count_include_pad: bool,
}

impl Pool2d {
    pub fn new(kind: PoolKind, k: usize, stride: usize, pad: usize) -> Self {
        Pool2d {
            kind,
            kernel: [k, k],
            stride: [stride, stride],
            padding: [pad, pad],
            padding_end: None,
            ceil_mode: false,
            count_include_pad: true,
        }
    }
    pub fn max(k: usize, stride: usize, pad: usize) -> Self {
        Self::new(PoolKind::Max, k, stride, pad)
    }
    pub fn avg(k: usize, stride: usize, pad: usize) -> Self {
        Self::new(PoolKind::Avg, k, stride, pad)
    }
    pub fn global_avg() -> Self {
        Self::new(PoolKind::GlobalAvg, 1, 1, 0)
    }
    pub fn ceil(mut self) -> Self {
        self.ceil_mode = true;
        self
    }
    /// Padding before and after each spatial axis: `([top, left], [bottom, right])`.
    pub fn pads(&self) -> ([usize; 2], [usize; 2]) {
        (self.padding, self.padding_end.unwrap_or(self.padding))
    }
}

/// An operator. Serialized with a `"type"` tag in snake case, e.g. `{"type": "conv2d", ...}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Op {
    /// A graph input (placeholder). Not counted as an operator.
    Input {
        shape: Shape,
    },
    /// A constant tensor (a weight that is an operand, e.g. a position embedding or an
    /// attention mask). Like an input, not counted as an operator; its values are the graph's
    /// weight `value` of the node (seeded pseudo-random where the graph has none). The shape
    /// may be empty (a scalar).
    Constant {
        shape: Shape,
    },
    Conv2d(Conv2d),
    Pool2d(Pool2d),
    /// Resize of the spatial axes (nearest or bilinear; see [`crate::resize`]).
    Resize(Resize),
    /// A standalone activation.
    Activation {
        act: Activation,
    },
    /// Element-wise add or multiply of all terms; their shapes broadcast as in numpy.
    Elementwise {
        kind: ElementwiseKind,
    },
    /// Element-wise operation of exactly two terms (in order); shapes broadcast as in numpy.
    Binary {
        kind: BinaryKind,
    },
    /// ONNX's `Where` of three terms `(cond, a, b)`, shapes broadcast as in numpy: `a` where
    /// `cond` is not 0, else `b` (masked fills: attention's causal and padding masks).
    Where,
    /// ONNX's `Expand`: the one term broadcast as in numpy against `shape` (the result's shape
    /// is their broadcast; an attention mask expanded over heads and queries).
    Expand {
        shape: Vec<usize>,
    },
    /// Per-channel scale and shift along axis 1, `y = x * scale[c] + shift[c]` (parameters
    /// `scale` and `shift`): a batch normalization that cannot fold into a convolution.
    Affine,
    /// Constant padding: `begin[i]` and `end[i]` elements of `value` before and after axis
    /// `i` (every axis, batch included).
    Pad {
        begin: Vec<usize>,
        end: Vec<usize>,
        #[serde(default)]
        value: f32,
    },
    /// Concatenate the terms along `axis` (default 1, channels).
    Concat {
        #[serde(default = "one")]
        axis: usize,
    },
    /// Pass the (channel-concatenated) input through; IOS uses it as a concat node.
    Identity,
    /// Fully connected layer over the last axis: `[.., K] -> [.., out_features]`.
    Linear {
        out_features: usize,
        #[serde(default, skip_serializing_if = "is_false")]
        bias: bool,
        #[serde(default, skip_serializing_if = "Activation::is_none")]
        act: Activation,
    },
    /// A lookup table of `rows` vectors of `dim` values (parameter `weight`, `[rows, dim]`:
    /// PyTorch's `nn.Embedding`, ONNX's `Gather` of a table by token ids): each input value is
    /// a row's index (an integer, stored as `f32` like every value; a negative one counts from
    /// the end), replaced by that row; output: the input's shape with `dim` appended.
    Embedding {
        rows: usize,
        dim: usize,
    },
    /// Batched matrix product of two inputs, scaled: `alpha [.., M, K] x [.., K, N] -> [..,
    /// M, N]` (`[.., N, K]` for the second when `transpose_b`). `alpha` is attention's
    /// `1 / sqrt(head size)`, which a matrix product applies for free (cuBLAS's alpha); 1 by
    /// default.
    BatchMatmul {
        #[serde(default, skip_serializing_if = "is_false")]
        transpose_b: bool,
        #[serde(default = "one_f32", skip_serializing_if = "is_one_f32")]
        alpha: f32,
    },
    /// Softmax along `axis` (negative counts from the end).
    Softmax {
        #[serde(default = "minus_one")]
        axis: i64,
    },
    /// `log(softmax(x))` along `axis`, computed without the intermediate softmax.
    LogSoftmax {
        #[serde(default = "minus_one")]
        axis: i64,
    },
    /// Layer normalization over the last axis, with scale and shift parameters.
    LayerNorm {
        #[serde(default = "default_eps")]
        eps: f64,
    },
    /// Reshape; one entry may be -1 (inferred), 0 copies the input dimension.
    Reshape {
        shape: Vec<i64>,
    },
    /// The reduction `kind` ([`ReduceKind`]: mean, sum, max, min, product, L1, L2, sum of
    /// squares, log of the sum or of the sum of exponentials, or the index of the largest or
    /// smallest) over axes `begin..end` (consecutive: ONNX's `Reduce*` over
    /// a token axis, the last axis or channels), kept with extent 1 where `keep`, else dropped.
    Reduce {
        kind: ReduceKind,
        begin: usize,
        end: usize,
        #[serde(default, skip_serializing_if = "is_false")]
        keep: bool,
    },
    /// Running sums along `axis` (ONNX's `CumSum`: RoBERTa's position ids, counted from its
    /// token ids at run time): element `i` of the axis is the sum of elements `0..=i` (`0..i`
    /// where `exclusive`; counted from the end where `reverse`), added in that order.
    CumSum {
        axis: usize,
        #[serde(default, skip_serializing_if = "is_false")]
        exclusive: bool,
        #[serde(default, skip_serializing_if = "is_false")]
        reverse: bool,
    },
    /// Elements of the first term picked along `axis` by the second, the indices (ONNX's
    /// `GatherElements`): `y[.., i, ..] = x[.., idx[.., i, ..], ..]`, every other coordinate
    /// the output's. The indices have as many axes as `x`, no longer than its but along
    /// `axis`, and are integers stored as `f32` (a negative one counts from the end,
    /// [`table_row`]); output: the indices' shape.
    GatherElements {
        axis: usize,
    },
    /// Elements `begin..end` of axis `axis` (ONNX's `Slice` with unit steps and `Split` along
    /// an axis other than channels, which values slice themselves).
    Slice {
        axis: usize,
        begin: usize,
        end: usize,
    },
    /// Permute the axes.
    Transpose {
        perm: Vec<usize>,
    },
    /// A chain of primitives run as one schedulable operator (e.g. relu + depthwise + pointwise).
    Sequential {
        ops: Vec<Op>,
    },
    /// An operator known only by a measured time and utilization (cost-annotated DAGs).
    Abstract {
        time_ms: f64,
        #[serde(default = "default_util")]
        util: f64,
    },
    /// An operator the IR does not model (e.g. an ONNX operator imported with
    /// `--allow-unknown`), known by its foreign type name and output shape. Its inputs may have
    /// any shapes (they are not concatenated). It is costed by its tensor sizes: a memory-bound
    /// pass that reads every input element, writes every output element and does one FLOP per
    /// output element.
    Opaque {
        /// The foreign operator type, e.g. `"NonMaxSuppression"`.
        op_type: String,
        /// Output shape, batch included.
        shape: Shape,
    },
}

/// Counts of one operator, for a given input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpStats {
    pub flops: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub params: u64,
}

/// The row of an `embedding` table of `rows` rows that index value `v` names: an integer in
/// `[-rows, rows)`, a negative one counting from the end (ONNX's `Gather`); `None` for any
/// other value.
pub fn table_row(v: f32, rows: usize) -> Option<usize> {
    let r = rows as f64;
    let v = f64::from(v);
    if v != v.trunc() || v < -r || v >= r {
        return None;
    }
    Some(if v < 0.0 { v + r } else { v } as usize)
}

/// Output size of a window of `k` taps dilated by `d`, moved by `s` over `input` padded by
/// `begin` and `end`. Ceil mode (PyTorch's and onnxruntime's rule): round up, but the last
/// window must start inside the input or the leading padding. Checked: sizes from files may be
/// absurd.
pub fn window_out(
    input: usize,
    k: usize,
    s: usize,
    [begin, end]: [usize; 2],
    d: usize,
    ceil: bool,
) -> Result<usize, String> {
    let (k, s, begin, end, d) = (
        check_param("kernel", k)?,
        check_param("stride", s)?,
        check_param("padding", begin)?,
        check_param("padding", end)?,
        check_param("dilation", d)?,
    );
    // Under MAX_PARAM each term fits; checked anyway, as every size from input is.
    let too_big = || {
        format!("window arithmetic overflows (input {input}, kernel {k}, dilation {d}, padding {begin}+{end})")
    };
    let span = d
        .checked_mul(k.max(1) - 1)
        .and_then(|v| v.checked_add(1))
        .ok_or_else(too_big)?;
    let padded = input
        .checked_add(begin)
        .and_then(|v| v.checked_add(end))
        .ok_or_else(too_big)?;
    if padded < span {
        return Err(format!("window {span} larger than padded input {padded}"));
    }
    if s == 0 {
        return Err("stride must be positive".into());
    }
    let steps = padded - span;
    let mut out = steps / s + 1;
    if ceil && !steps.is_multiple_of(s) {
        out += 1;
        if (out - 1).checked_mul(s).ok_or_else(too_big)? >= input.saturating_add(begin) {
            out -= 1;
        }
    }
    Ok(out)
}

/// The numpy broadcast of several shapes (aligned at their last axes; each axis is 1 or the
/// common size).
pub fn broadcast_shapes(shapes: &[Shape]) -> Result<Shape, String> {
    let rank = shapes.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        let skip = rank - s.len();
        for (o, &d) in out[skip..].iter_mut().zip(s) {
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return Err(format!(
                    "shapes {} do not broadcast",
                    shapes
                        .iter()
                        .map(|s| format!("{s:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
    Ok(out)
}

fn require_rank(shape: &[usize], rank: usize, what: &str) -> Result<(), String> {
    if shape.len() != rank {
        return Err(format!("{what} expects a rank-{rank} input, got {shape:?}"));
    }
    Ok(())
}

/// Concatenate shapes along `axis`; all other dimensions must agree.
pub fn concat_shapes(shapes: &[Shape], axis: usize) -> Result<Shape, String> {
    let first = shapes.first().ok_or("needs at least one input")?;
    if axis >= first.len() {
        return Err(format!("concat axis {axis} out of range for {first:?}"));
    }
    let mut out = first.clone();
    for s in &shapes[1..] {
        let same_rest = s.len() == first.len()
            && s.iter()
                .zip(first)
                .enumerate()
                .all(|(i, (a, b))| i == axis || a == b);
        if !same_rest {
            return Err(format!(
                "cannot concatenate {first:?} and {s:?} along axis {axis}"
            ));
        }
        out[axis] = out[axis]
            .checked_add(s[axis])
            .ok_or_else(|| format!("concatenating {first:?} and {s:?} overflows"))?;
    }
    Ok(out)
}

impl Op {
    /// What is wrong with a number of the operator's definition, naming its field: one that is
    /// not finite (from a graph file: an infinity there would poison every value after it), or
    /// a celu's alpha of 0 (it divides by it).
    fn bad_number(&self) -> Option<&'static str> {
        match self {
            Op::Conv2d(Conv2d { act, .. }) | Op::Linear { act, .. } | Op::Activation { act } => {
                match act {
                    a if !a.finite() => Some("act must be a finite number"),
                    Activation::Celu { alpha } if *alpha == 0.0 => {
                        Some("act: a celu's alpha must not be 0 (it divides by it)")
                    }
                    _ => None,
                }
            }
            Op::BatchMatmul { alpha, .. } if !alpha.is_finite() => {
                Some("alpha must be a finite number")
            }
            Op::LayerNorm { eps } if !eps.is_finite() => Some("eps must be a finite number"),
            _ => None,
        }
    }

    /// A batch matmul without a scale (`alpha` 1).
    pub fn batch_matmul(transpose_b: bool) -> Op {
        Op::BatchMatmul {
            transpose_b,
            alpha: 1.0,
        }
    }

    /// The snake-case type name, as in the JSON tag.
    pub fn type_name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Constant { .. } => "constant",
            Op::Binary { .. } => "binary",
            Op::Where => "where",
            Op::Expand { .. } => "expand",
            Op::Affine => "affine",
            Op::Pad { .. } => "pad",
            Op::LogSoftmax { .. } => "log_softmax",
            Op::Conv2d(_) => "conv2d",
            Op::Pool2d(_) => "pool2d",
            Op::Resize(_) => "resize",
            Op::Activation { .. } => "activation",
            Op::Elementwise { .. } => "elementwise",
            Op::Concat { .. } => "concat",
            Op::Identity => "identity",
            Op::Linear { .. } => "linear",
            Op::Embedding { .. } => "embedding",
            Op::BatchMatmul { .. } => "batch_matmul",
            Op::Softmax { .. } => "softmax",
            Op::LayerNorm { .. } => "layer_norm",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Slice { .. } => "slice",
            Op::Reduce { .. } => "reduce",
            Op::CumSum { .. } => "cum_sum",
            Op::GatherElements { .. } => "gather_elements",
            Op::Sequential { .. } => "sequential",
            Op::Abstract { .. } => "abstract",
            Op::Opaque { .. } => "opaque",
        }
    }

    /// Whether this node is where values come from rather than an operator: a graph input or
    /// a constant. Neither is counted as an operator nor scheduled.
    pub fn is_input(&self) -> bool {
        matches!(self, Op::Input { .. } | Op::Constant { .. })
    }

    /// Whether this is a graph input (a value the caller gives), not a constant.
    pub fn is_graph_input(&self) -> bool {
        matches!(self, Op::Input { .. })
    }

    /// Whether the op only moves or re-labels data (no arithmetic).
    pub fn is_cheap(&self) -> bool {
        matches!(
            self,
            Op::Identity
                | Op::Reshape { .. }
                | Op::Transpose { .. }
                | Op::Concat { .. }
                | Op::Pad { .. }
                | Op::Slice { .. }
        )
    }

    /// Output shape for the given term shapes.
    pub fn infer_shape(&self, terms: &[Shape]) -> Result<Shape, String> {
        if let Some(problem) = self.bad_number() {
            return Err(problem.to_string());
        }
        match self {
            Op::Input { shape } => {
                if !terms.is_empty() {
                    return Err("an input takes no inputs".into());
                }
                if shape.is_empty() || shape.contains(&0) {
                    return Err(format!(
                        "input shape {shape:?} must be non-empty and positive"
                    ));
                }
                Ok(shape.clone())
            }
            Op::Constant { shape } => {
                if !terms.is_empty() {
                    return Err("a constant takes no inputs".into());
                }
                if shape.contains(&0) {
                    return Err(format!("constant shape {shape:?} must be positive"));
                }
                Ok(shape.clone())
            }
            Op::Abstract { time_ms, util } => {
                limits::check_time_ms("time_ms", *time_ms)?;
                limits::check_util("util", *util)?;
                Ok(Vec::new())
            }
            Op::Opaque { op_type, shape } => {
                if shape.contains(&0) {
                    return Err(format!(
                        "opaque '{op_type}' output shape {shape:?} must be positive"
                    ));
                }
                Ok(shape.clone())
            }
            Op::Elementwise { .. } => {
                if terms.is_empty() {
                    return Err("elementwise op needs at least one input".into());
                }
                broadcast_shapes(terms)
            }
            Op::Binary { kind } => {
                if terms.len() != 2 {
                    return Err(format!(
                        "binary {kind:?} needs exactly 2 inputs, got {}",
                        terms.len()
                    ));
                }
                broadcast_shapes(terms)
            }
            Op::Where => {
                if terms.len() != 3 {
                    return Err(format!(
                        "where needs exactly 3 inputs (condition, then, else), got {}",
                        terms.len()
                    ));
                }
                broadcast_shapes(terms)
            }
            Op::Expand { shape } => {
                if terms.len() != 1 {
                    return Err(format!("expand needs 1 input, got {}", terms.len()));
                }
                broadcast_shapes(&[terms[0].clone(), shape.clone()])
            }
            Op::Concat { axis } => concat_shapes(terms, *axis),
            Op::BatchMatmul { transpose_b, .. } => {
                let [a, b] = terms else {
                    return Err(format!(
                        "batch_matmul needs exactly 2 inputs, got {}",
                        terms.len()
                    ));
                };
                if a.len() < 2 || a.len() != b.len() {
                    return Err(format!(
                        "batch_matmul inputs {a:?} and {b:?} must have equal rank >= 2"
                    ));
                }
                let r = a.len();
                let (bk, bn) = if *transpose_b {
                    (b[r - 1], b[r - 2])
                } else {
                    (b[r - 2], b[r - 1])
                };
                if a[..r - 2] != b[..r - 2] || a[r - 1] != bk {
                    return Err(format!("batch_matmul shapes {a:?} and {b:?} do not match"));
                }
                let mut out = a.clone();
                out[r - 1] = bn;
                Ok(out)
            }
            Op::GatherElements { axis } => {
                let [x, idx] = terms else {
                    return Err(format!(
                        "gather_elements needs 2 inputs (data, indices), got {}",
                        terms.len()
                    ));
                };
                if *axis >= x.len() || idx.len() != x.len() {
                    return Err(format!(
                        "gather_elements along axis {axis}: indices {idx:?} and data {x:?} must have the same rank, above the axis"
                    ));
                }
                let longer = (0..x.len()).any(|a| a != *axis && idx[a] > x[a]);
                if longer || idx.contains(&0) || x[*axis] == 0 {
                    return Err(format!(
                        "gather_elements along axis {axis}: indices {idx:?} must be positive and no longer than data {x:?} on the other axes"
                    ));
                }
                Ok(idx.clone())
            }
            Op::Sequential { ops } => {
                let (first, rest) = ops.split_first().ok_or("sequential op has no inner ops")?;
                let mut shape = first.infer_shape(terms)?;
                for op in rest {
                    shape = op.infer_shape(std::slice::from_ref(&shape))?;
                }
                Ok(shape)
            }
            _ => {
                let input = concat_shapes(terms, 1).or_else(|e| match terms {
                    [single] => Ok(single.clone()),
                    _ => Err(e),
                })?;
                self.infer_single(&input)
            }
        }
    }

    /// Shape inference for operators with one (channel-concatenated) input.
    fn infer_single(&self, x: &Shape) -> Result<Shape, String> {
        match self {
            Op::Conv2d(c) => {
                require_rank(x, 4, "conv2d")?;
                check_param("out_channels", c.out_channels)?;
                check_param("groups", c.groups)?;
                if c.groups == 0
                    || !x[1].is_multiple_of(c.groups)
                    || !c.out_channels.is_multiple_of(c.groups)
                {
                    return Err(format!(
                        "groups {} must divide input channels {} and output channels {}",
                        c.groups, x[1], c.out_channels
                    ));
                }
                if c.out_channels == 0 {
                    return Err("out_channels must be positive".into());
                }
                let (begin, end) = c.pads();
                let h = window_out(
                    x[2],
                    c.kernel[0],
                    c.stride[0],
                    [begin[0], end[0]],
                    c.dilation[0],
                    false,
                )?;
                let w = window_out(
                    x[3],
                    c.kernel[1],
                    c.stride[1],
                    [begin[1], end[1]],
                    c.dilation[1],
                    false,
                )?;
                Ok(vec![x[0], c.out_channels, h, w])
            }
            Op::Resize(r) => r.out_shape(x),
            Op::Pool2d(p) => {
                require_rank(x, 4, "pool2d")?;
                if p.kind.is_global() {
                    return Ok(vec![x[0], x[1], 1, 1]);
                }
                let (begin, end) = p.pads();
                let h = window_out(
                    x[2],
                    p.kernel[0],
                    p.stride[0],
                    [begin[0], end[0]],
                    1,
                    p.ceil_mode,
                )?;
                let w = window_out(
                    x[3],
                    p.kernel[1],
                    p.stride[1],
                    [begin[1], end[1]],
                    1,
                    p.ceil_mode,
                )?;
                Ok(vec![x[0], x[1], h, w])
            }
            Op::CumSum { axis, .. } => {
                if *axis >= x.len() {
                    return Err(format!("cum_sum axis {axis} out of range for {x:?}"));
                }
                Ok(x.clone())
            }
            Op::Activation { .. } | Op::Identity | Op::LayerNorm { .. } => Ok(x.clone()),
            Op::Softmax { axis } | Op::LogSoftmax { axis } => {
                let r = i64::try_from(x.len()).map_err(|_| "rank overflows".to_string())?;
                if *axis >= r || *axis < -r {
                    return Err(format!("softmax axis {axis} out of range for {x:?}"));
                }
                Ok(x.clone())
            }
            Op::Affine => {
                if x.len() < 2 {
                    return Err(format!(
                        "affine expects rank >= 2 (channels on axis 1), got {x:?}"
                    ));
                }
                Ok(x.clone())
            }
            Op::Pad { begin, end, .. } => {
                if begin.len() != x.len() || end.len() != x.len() {
                    return Err(format!(
                        "pad begin {begin:?} and end {end:?} must have one entry per axis of {x:?}"
                    ));
                }
                x.iter()
                    .zip(begin.iter().zip(end))
                    .map(|(&d, (&b, &e))| {
                        d.checked_add(b)
                            .and_then(|v| v.checked_add(e))
                            .ok_or_else(|| format!("padding {b}+{e} of {d} overflows"))
                    })
                    .collect()
            }
            Op::Embedding { rows, dim } => {
                check_param("rows", *rows)?;
                check_param("dim", *dim)?;
                if *rows == 0 || *dim == 0 {
                    return Err(format!(
                        "embedding of {rows} rows of {dim} must not be empty"
                    ));
                }
                let mut out = x.clone();
                out.push(*dim);
                Ok(out)
            }
            Op::Linear { out_features, .. } => {
                check_param("out_features", *out_features)?;
                if x.len() < 2 {
                    return Err(format!("linear expects rank >= 2, got {x:?}"));
                }
                let mut out = x.clone();
                if let Some(last) = out.last_mut() {
                    *last = *out_features;
                }
                Ok(out)
            }
            Op::Reshape { shape } => {
                let total = numel(x)?;
                let mut out = Vec::with_capacity(shape.len());
                let mut infer_at = None;
                for (i, &d) in shape.iter().enumerate() {
                    match d {
                        -1 if infer_at.is_none() => {
                            infer_at = Some(i);
                            out.push(1);
                        }
                        0 => out.push(
                            *x.get(i)
                                .ok_or(format!("reshape: no input dimension {i} to copy"))?,
                        ),
                        d if d > 0 => out.push(
                            usize::try_from(d)
                                .map_err(|_| format!("reshape: target {d} too large"))?,
                        ),
                        _ => return Err(format!("reshape: invalid target {shape:?}")),
                    }
                }
                let cannot = || format!("cannot reshape {x:?} into {shape:?}");
                let known = numel(&out).map_err(|_| cannot())?;
                if let Some(i) = infer_at {
                    if known == 0 || !total.is_multiple_of(known) {
                        return Err(cannot());
                    }
                    out[i] = usize::try_from(total / known).map_err(|_| cannot())?;
                }
                if numel(&out).map_err(|_| cannot())? != total {
                    return Err(format!("cannot reshape {x:?} into {shape:?}"));
                }
                Ok(out)
            }
            Op::Reduce {
                begin, end, keep, ..
            } => {
                if begin >= end || *end > x.len() {
                    return Err(format!(
                        "reduce axes {begin}..{end} are empty or outside {x:?}"
                    ));
                }
                let mut out = x[..*begin].to_vec();
                if *keep {
                    out.extend(std::iter::repeat_n(1, end - begin));
                }
                out.extend_from_slice(&x[*end..]);
                Ok(out)
            }
            Op::Slice { axis, begin, end } => {
                let dim = *x
                    .get(*axis)
                    .ok_or_else(|| format!("slice axis {axis} out of range for {x:?}"))?;
                if begin >= end || *end > dim {
                    return Err(format!(
                        "slice [{begin}, {end}) of axis {axis} is empty or outside {x:?}"
                    ));
                }
                let mut out = x.clone();
                out[*axis] = end - begin;
                Ok(out)
            }
            Op::Transpose { perm } => {
                let mut seen = vec![false; x.len()];
                if perm.len() != x.len() {
                    return Err(format!(
                        "transpose perm {perm:?} does not match rank of {x:?}"
                    ));
                }
                for &p in perm {
                    if p >= x.len() || std::mem::replace(&mut seen[p], true) {
                        return Err(format!("transpose perm {perm:?} is not a permutation"));
                    }
                }
                Ok(perm.iter().map(|&p| x[p]).collect())
            }
            _ => Err(format!("{} takes no single input", self.type_name())),
        }
    }

    /// The parameter tensors of a primitive operator for the given term shapes, by the names
    /// [`crate::weights`] uses: `(name, shape)`. A `sequential` operator's parameters belong to
    /// its inner operators (see [`crate::Graph::params`]); it returns none itself.
    pub fn params(&self, terms: &[Shape]) -> Vec<(&'static str, Shape)> {
        match self {
            Op::Conv2d(c) => {
                let cin: usize = terms.iter().map(|s| s.get(1).copied().unwrap_or(0)).sum();
                let mut p = vec![(
                    "weight",
                    vec![
                        c.out_channels,
                        cin / c.groups.max(1),
                        c.kernel[0],
                        c.kernel[1],
                    ],
                )];
                if c.bias {
                    p.push(("bias", vec![c.out_channels]));
                }
                p
            }
            Op::Linear {
                out_features, bias, ..
            } => {
                let k = terms
                    .iter()
                    .filter_map(|s| s.last())
                    .copied()
                    .max()
                    .unwrap_or(0);
                let mut p = vec![("weight", vec![*out_features, k])];
                if *bias {
                    p.push(("bias", vec![*out_features]));
                }
                p
            }
            Op::LayerNorm { .. } => {
                let d = terms.first().and_then(|s| s.last()).copied().unwrap_or(0);
                vec![("gamma", vec![d]), ("beta", vec![d])]
            }
            Op::Embedding { rows, dim } => vec![("weight", vec![*rows, *dim])],
            Op::Affine => {
                let c: usize = terms.iter().map(|s| s.get(1).copied().unwrap_or(0)).sum();
                vec![("scale", vec![c]), ("shift", vec![c])]
            }
            Op::Constant { shape } => vec![("value", shape.clone())],
            _ => Vec::new(),
        }
    }

    /// FLOPs, bytes and parameters for the given term shapes and output shape; an error when a
    /// count overflows 64 bits. The values summed inside terms are not counted here (see
    /// `Graph::stats`).
    pub fn stats(&self, terms: &[Shape], out: &Shape, dtype: DType) -> Result<OpStats, String> {
        let e = dtype.size();
        let in_elems = terms
            .iter()
            .try_fold(0u64, |a, s| add("input elements", a, numel(s)?))?;
        let out_elems = numel(out)?;
        let (flops, params) = match self {
            Op::Input { .. } | Op::Constant { .. } | Op::Abstract { .. } => (0, 0),
            Op::Binary { .. } | Op::Where => (out_elems, 0),
            Op::Expand { .. } => (0, 0),
            Op::Affine => {
                let c = count(out.get(1).copied().unwrap_or(0));
                (mul("FLOPs", out_elems, 2)?, mul("parameters", c, 2)?)
            }
            Op::Pad { .. } => (0, 0),
            Op::LogSoftmax { .. } => (mul("FLOPs", out_elems, 5)?, 0),
            Op::Conv2d(c) => {
                let cin = terms.iter().try_fold(0u64, |a, s| {
                    add("input channels", a, count(s.get(1).copied().unwrap_or(0)))
                })?;
                let window = mul("kernel size", count(c.kernel[0]), count(c.kernel[1]))?;
                let per_out = mul("FLOPs", cin / count(c.groups.max(1)), window)?;
                let mut flops = mul("FLOPs", mul("FLOPs", 2, out_elems)?, per_out)?;
                let mut params = mul("parameters", count(c.out_channels), per_out)?;
                if c.bias {
                    flops = add("FLOPs", flops, out_elems)?;
                    params = add("parameters", params, count(c.out_channels))?;
                }
                let act = mul("FLOPs", out_elems, c.act.flops_per_element())?;
                (add("FLOPs", flops, act)?, params)
            }
            Op::Pool2d(p) => {
                if p.kind.is_global() {
                    (in_elems, 0)
                } else {
                    let window = mul("kernel size", count(p.kernel[0]), count(p.kernel[1]))?;
                    (mul("FLOPs", out_elems, window)?, 0)
                }
            }
            Op::Activation { act } => (mul("FLOPs", out_elems, act.flops_per_element())?, 0),
            // Bilinear: four products and three sums per element; nearest moves data only.
            Op::Resize(r) => match r.mode {
                crate::ResizeMode::Nearest => (0, 0),
                crate::ResizeMode::Linear => (mul("FLOPs", out_elems, 7)?, 0),
            },
            Op::Opaque { .. } => (out_elems, 0),
            Op::Elementwise { .. } => (
                mul("FLOPs", out_elems, count(terms.len()).saturating_sub(1))?,
                0,
            ),
            Op::Concat { .. }
            | Op::Identity
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. } => (0, 0),
            Op::Linear {
                out_features,
                bias,
                act,
            } => {
                let k = terms
                    .iter()
                    .filter_map(|s| s.last())
                    .map(|&d| count(d))
                    .max()
                    .unwrap_or(0);
                let n = count(*out_features);
                let mut flops = add(
                    "FLOPs",
                    mul("FLOPs", mul("FLOPs", 2, out_elems)?, k)?,
                    mul("FLOPs", out_elems, act.flops_per_element())?,
                )?;
                let mut params = mul("parameters", k, n)?;
                if *bias {
                    flops = add("FLOPs", flops, out_elems)?;
                    params = add("parameters", params, n)?;
                }
                (flops, params)
            }
            Op::BatchMatmul { .. } => {
                let k = count(terms.first().and_then(|a| a.last()).copied().unwrap_or(0));
                (mul("FLOPs", mul("FLOPs", 2, out_elems)?, k)?, 0)
            }
            Op::Softmax { .. } => (mul("FLOPs", 5, out_elems)?, 0),
            Op::Embedding { rows, dim } => (0, mul("parameters", count(*rows), count(*dim))?),
            Op::Reduce { .. } | Op::CumSum { .. } => (in_elems, 0),
            Op::GatherElements { .. } => (0, 0),
            Op::LayerNorm { .. } => {
                let d = count(out.last().copied().unwrap_or(0));
                (mul("FLOPs", 8, out_elems)?, mul("parameters", 2, d)?)
            }
            Op::Sequential { ops } => {
                let mut total = OpStats::default();
                let mut shapes = terms.to_vec();
                for op in ops {
                    let Ok(next) = op.infer_shape(&shapes) else {
                        break;
                    };
                    let s = op.stats(&shapes, &next, dtype)?;
                    total = OpStats {
                        flops: add("FLOPs", total.flops, s.flops)?,
                        bytes_read: add("bytes read", total.bytes_read, s.bytes_read)?,
                        bytes_written: add("bytes written", total.bytes_written, s.bytes_written)?,
                        params: add("parameters", total.params, s.params)?,
                    };
                    shapes = vec![next];
                }
                return Ok(total);
            }
        };
        let moves_data = !matches!(
            self,
            Op::Input { .. } | Op::Constant { .. } | Op::Abstract { .. }
        );
        // A lookup reads the rows it copies, not its whole table.
        let params_read = match self {
            Op::Embedding { .. } => params.min(out_elems),
            _ => params,
        };
        Ok(OpStats {
            flops,
            bytes_read: if moves_data {
                mul("bytes read", add("bytes read", in_elems, params_read)?, e)?
            } else {
                0
            },
            bytes_written: if moves_data {
                mul("bytes written", out_elems, e)?
            } else {
                0
            },
            params,
        })
    }
}
