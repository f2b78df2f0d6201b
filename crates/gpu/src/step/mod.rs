//! Steps: the primitive kernels a [`crate::GraphProgram`] is made of, one module per kind.
//!
//! Each module holds everything about its kind side by side: the struct with its validated
//! parameters and buffers, the lowering of the IR operators that produce it (called from
//! [`crate::program`]), the CPU kernel (`StepKernel::run_cpu`) and the CUDA preparation and
//! launch (`StepKernel::prepare_cuda`). Adding a kernel touches its module and one line of
//! the `steps!` list below; no backend matches on the kinds.
//!
//! Buffers are `f32` and dense row-major (NCHW for images) unless a step says otherwise.

use serde::Serialize;

use crate::cpu::CpuIo;
use crate::cuda::{Enqueue, PrepareCx};
use crate::program::BufId;
use crate::GpuError;

pub mod act;
pub mod broadcast;
pub mod conv;
pub mod copy;
pub mod cum_sum;
pub mod elementwise;
pub mod embedding;
pub mod gather;
pub mod gemm;
pub mod layer_norm;
pub mod pad;
pub mod pool;
pub mod reduce;
pub mod resize;
pub mod softmax;
pub mod spin;
pub mod transpose;

/// The buffers a step reads and writes, each with the number of elements it touches.
/// Reads and writes are disjoint; a write may depend on the buffer's previous content
/// (accumulation, in-place epilogues).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    pub reads: Vec<(BufId, usize)>,
    pub writes: Vec<(BufId, usize)>,
}

impl Access {
    /// Every buffer, reads first.
    pub fn all(&self) -> impl Iterator<Item = (BufId, usize)> + '_ {
        self.reads.iter().chain(&self.writes).copied()
    }
}

/// What every step kind provides (crate-private: the CUDA half uses the device's internals).
pub(crate) trait StepKernel {
    /// Short name of the kind (traces, resource tables).
    fn kind(&self) -> &'static str;
    /// The buffers it touches.
    fn access(&self) -> Access;
    /// Run on host buffers.
    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError>;
    /// Resolve buffers, descriptors and algorithms for one CUDA GPU.
    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError>;
    /// The NVRTC kernel it launches, when it is one of ours (for resource tables).
    fn nvrtc_kernel(&self) -> Option<&'static str> {
        None
    }
    /// Kernels it launches on a GPU (helper kernels inside cuDNN and cuBLAS not counted).
    fn kernels(&self) -> u32 {
        1
    }
    /// The parts of the buffer it writes that it writes, where it writes only some (a copy
    /// into a slice of a concatenation: a run per image or pixel); `None`: anything up to the
    /// access' extent.
    fn written(&self) -> Option<Vec<std::ops::Range<usize>>> {
        None
    }
}

/// The list of step kinds: generates [`Step`], its dispatch and conversions.
macro_rules! steps {
    ($($variant:ident($ty:ty)),* $(,)?) => {
        /// One primitive kernel (see the module of each kind).
        #[derive(Clone, Debug, PartialEq, Serialize)]
        #[serde(tag = "kind", rename_all = "snake_case")]
        pub enum Step {
            $($variant($ty)),*
        }

        impl Step {
            /// The kind's implementation.
            pub(crate) fn kernel(&self) -> &dyn StepKernel {
                match self {
                    $(Step::$variant(s) => s),*
                }
            }
        }

        $(impl From<$ty> for Step {
            fn from(s: $ty) -> Step {
                Step::$variant(s)
            }
        })*
    };
}

steps! {
    Copy(copy::Copy),
    Conv(conv::Conv),
    BiasAct(act::BiasAct),
    Act(act::Act),
    Pool(pool::Pool),
    PoolSum(pool::PoolSum),
    Resize(resize::Resize),
    Reduce(reduce::Reduce),
    Gemm(gemm::Gemm),
    Softmax(softmax::Softmax),
    LayerNorm(layer_norm::LayerNorm),
    Elementwise(elementwise::Elementwise),
    Embedding(embedding::Embedding),
    GatherElements(gather::GatherElements),
    CumSum(cum_sum::CumSum),
    Broadcast(broadcast::Broadcast),
    Affine(broadcast::Affine),
    Pad(pad::Pad),
    Transpose(transpose::Transpose),
    Spin(spin::Spin),
}

impl Step {
    /// Short name of the kernel kind.
    pub fn kind(&self) -> &'static str {
        self.kernel().kind()
    }
    /// The buffers it touches.
    pub fn access(&self) -> Access {
        self.kernel().access()
    }
    /// The NVRTC kernel it launches, when it is one of ours (for resource tables).
    pub fn nvrtc_kernel(&self) -> Option<&'static str> {
        self.kernel().nvrtc_kernel()
    }
    /// Kernels it launches on a GPU, as the CUDA device plans them (helper kernels inside
    /// cuDNN and cuBLAS not counted); the cost model's `opsched_cost::launches` agrees.
    pub fn kernels(&self) -> u32 {
        self.kernel().kernels()
    }
    /// The parts of the buffer it writes that it writes, where it writes only some (a copy
    /// into a slice of a concatenation): what the CPU device's race detector tracks.
    pub fn written(&self) -> Option<Vec<std::ops::Range<usize>>> {
        self.kernel().written()
    }
}

/// The result's axes `out`, with each operand's `strides` through them, merged where every
/// operand steps through two neighbours as through one axis (contiguous in both, or
/// broadcast along both) and without the axes of length 1: the same elements in fewer,
/// longer rows (a broadcast's `x[n, c, h, w] * gate[n, c, 1, 1]` is `n * c` rows of `h * w`,
/// not `n * c * h` rows of `w`; a transpose of `[n, c, h, w]` to `[n, h, w, c]` reads
/// `[h * w, c]` from `[c, h * w]`). At least one axis.
pub(crate) fn merged_axes<const N: usize>(
    out: &[usize],
    strides: [Vec<usize>; N],
) -> (Vec<usize>, [Vec<usize>; N]) {
    let mut dims: Vec<usize> = Vec::new();
    let mut merged: [Vec<usize>; N] = std::array::from_fn(|_| Vec::new());
    for ax in (0..out.len()).rev() {
        let d = out[ax];
        if d == 1 {
            continue;
        }
        if let Some(inner) = dims.last_mut() {
            let joins =
                (0..N).all(|k| merged[k].last().map(|&s| s * *inner) == Some(strides[k][ax]));
            if joins {
                *inner *= d;
                continue;
            }
        }
        dims.push(d);
        for k in 0..N {
            merged[k].push(strides[k][ax]);
        }
    }
    if dims.is_empty() {
        dims.push(1);
        merged.iter_mut().for_each(|m| m.push(0));
    }
    dims.reverse();
    merged.iter_mut().for_each(|m| m.reverse());
    (dims, merged)
}

/// The offset by `strides` (one per axis of `dims`) of row `row` of `dims`: the rows are the
/// indices of every axis but the last, the last axis fastest.
pub(crate) fn row_offset(row: usize, dims: &[usize], strides: &[usize]) -> usize {
    let (mut rem, mut at) = (row, 0);
    for ax in (0..dims.len().saturating_sub(1)).rev() {
        at += (rem % dims[ax]) * strides[ax];
        rem /= dims[ax];
    }
    at
}

/// `a * b * ...` of sizes, or an error naming `what` on overflow.
pub(crate) fn product(dims: &[usize], what: &str) -> Result<usize, GpuError> {
    dims.iter().try_fold(1usize, |acc, &d| {
        acc.checked_mul(d)
            .ok_or_else(|| GpuError::Plan(format!("{what}: {dims:?} overflows")))
    })
}

/// The image stride and, channels last, the pixel stride of a 4-D input or output (`what`) of
/// `channels` channels and `pixels` pixels, from its runs where it is a strided view (a
/// merged convolution's member, a slice of a concatenation): NCHW, one run per image (its
/// stride); channels last, one run of its channels per pixel (its stride the pixel stride).
/// Dense: `channels * pixels` and `channels`.
pub(crate) fn view_strides(
    nhwc: bool,
    runs: Option<crate::program::Runs>,
    channels: usize,
    pixels: usize,
    what: &str,
) -> Result<(usize, usize), GpuError> {
    let dense = channels * pixels;
    match (nhwc, runs) {
        (_, None) => Ok((dense, channels)),
        (false, Some(r)) if r.run == dense => Ok((r.stride, channels)),
        (true, Some(r)) if r.run == channels => Ok((r.stride * pixels, r.stride)),
        (_, Some(r)) => Err(GpuError::Plan(format!(
            "a strided {what} in runs of {} elements, not its {}",
            r.run,
            match nhwc {
                true => format!("{channels} channels per pixel"),
                false => format!("images of {dense}"),
            }
        ))),
    }
}
