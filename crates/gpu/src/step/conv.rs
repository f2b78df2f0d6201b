//! 2-D convolution (NCHW), then `+ bias` per output channel and the activation.
//!
//! - CPU: im2col and a matrix product per image and group (`matrixmultiply`), rows of the
//!   output split across threads (rayon); grouped and depthwise convolutions run the groups in
//!   parallel instead.
//! - CUDA: cuDNN's legacy API; every algorithm is timed (median of three
//!   `cudnnFindConvolutionForwardAlgorithmEx` searches) once per device and shape, the
//!   measurements kept in the device's [`crate::tuning::Tuning`] (and by the CLI in the cost
//!   cache, so later processes run the same kernel), and the choice made from them
//!   deterministically; conv + bias + relu runs as cuDNN's fused call where it works with that
//!   algorithm, else the convolution is followed by the `bias_act` kernel.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use cudarc::cudnn::{result as dnn, sys as dnn_sys};
use cudarc::driver::{CudaSlice, DevicePtr};
use opsched_graph::{Activation, Conv2d};
use rayon::prelude::*;
use serde::Serialize;

use super::{product, Access, Step, StepKernel};
use crate::cpu::math::{apply_bias_act, sgemm, Mat};
use crate::cpu::CpuIo;
use crate::cuda::cudnn::{tensor4, ActDesc, ConvDesc, FilterDesc, TensorDesc};
use crate::cuda::{Enqueue, Gpu, PrepareCx, StreamCtx};
use crate::program::{weight_half_width, At, BufId, Builder, Src};
use crate::GpuError;

/// A convolution step; `w` is `[oc, c / groups, kh, kw]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Conv {
    pub x: BufId,
    pub w: BufId,
    pub bias: Option<BufId>,
    pub y: BufId,
    /// Input `[n, c, h, w]`.
    pub input: [usize; 4],
    pub out_channels: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    /// Padding before (top, left) and after (bottom, right) each spatial axis.
    pub padding: [usize; 2],
    pub padding_end: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    /// Output `[oh, ow]`.
    pub out_hw: [usize; 2],
    pub act: Activation,
}

/// Lower a `conv2d` operator reading `src` into `out`.
pub(crate) fn lower(
    b: &mut Builder<'_>,
    steps: &mut Vec<Step>,
    at: At,
    c: &Conv2d,
    src: Src<'_>,
    out: BufId,
    out_shape: &[usize],
) -> Result<(), GpuError> {
    let (x, xs) = b.single(steps, at, src)?;
    let [n, ch, h, w] = b.four(at, &xs)?;
    let [_, oc, oh, ow] = b.four(at, out_shape)?;
    let groups = c.groups.max(1);
    if ch % groups != 0 || oc % groups != 0 {
        return Err(b.unsupported(
            at,
            format!("{ch} input and {oc} output channels do not split into {groups} groups"),
        ));
    }
    let fan_in = product(
        &[ch / groups, c.kernel[0], c.kernel[1]],
        "convolution fan-in",
    )?;
    let wlen = product(&[oc, fan_in], "convolution weights")?;
    let wb = b.param(at, "weight", wlen, 0.0, weight_half_width(fan_in))?;
    let bias = c
        .bias
        .then(|| b.param(at, "bias", oc, 0.0, 0.1))
        .transpose()?;
    steps.push(
        Conv {
            x,
            w: wb,
            bias,
            y: out,
            input: [n, ch, h, w],
            out_channels: oc,
            kernel: c.kernel,
            stride: c.stride,
            padding: c.pads().0,
            padding_end: c.pads().1,
            dilation: c.dilation,
            groups,
            out_hw: [oh, ow],
            act: c.act,
        }
        .into(),
    );
    Ok(())
}

impl Conv {
    fn out_len(&self) -> usize {
        self.input[0] * self.out_channels * self.out_hw[0] * self.out_hw[1]
    }

    /// Rows of the im2col matrix of one group: `c / groups * kh * kw`.
    fn col_rows(&self) -> usize {
        self.input[1] / self.groups * self.kernel[0] * self.kernel[1]
    }

    /// A 1x1, stride-1, unpadded convolution reads its input as the im2col matrix.
    fn is_pointwise(&self) -> bool {
        self.kernel == [1, 1]
            && self.stride == [1, 1]
            && self.padding == [0, 0]
            && self.padding_end == [0, 0]
    }

    /// Fill `col` (`col_rows x oh*ow`, row-major) with group `g` of image `x` (`[c, h, w]`).
    fn im2col(&self, x: &[f32], g: usize, col: &mut [f32]) {
        let [_, c, h, w] = self.input;
        let [oh, ow] = self.out_hw;
        let cg = c / self.groups;
        let (kh, kw) = (self.kernel[0], self.kernel[1]);
        let cols = oh * ow;
        let fill = |(r, row): (usize, &mut [f32])| {
            let ci = g * cg + r / (kh * kw);
            let (p, q) = ((r / kw) % kh, r % kw);
            let plane = &x[ci * h * w..(ci + 1) * h * w];
            for i in 0..oh {
                let hi =
                    (i * self.stride[0] + p * self.dilation[0]) as isize - self.padding[0] as isize;
                let out = &mut row[i * ow..(i + 1) * ow];
                if hi < 0 || hi >= h as isize {
                    out.fill(0.0);
                    continue;
                }
                let line = &plane[hi as usize * w..(hi as usize + 1) * w];
                for (j, v) in out.iter_mut().enumerate() {
                    let wi = (j * self.stride[1] + q * self.dilation[1]) as isize
                        - self.padding[1] as isize;
                    *v = if wi < 0 || wi >= w as isize {
                        0.0
                    } else {
                        line[wi as usize]
                    };
                }
            }
        };
        if cols * self.col_rows() >= 1 << 16 {
            col.par_chunks_mut(cols).enumerate().for_each(fill);
        } else {
            col.chunks_mut(cols).enumerate().for_each(fill);
        }
    }

    /// `y_g = w_g * col` for the output rows `rows` of group `g`, into `y` (those rows).
    fn product(
        &self,
        w: &[f32],
        g: usize,
        col: &[f32],
        rows: std::ops::Range<usize>,
        y: &mut [f32],
    ) -> Result<(), GpuError> {
        let k = self.col_rows();
        let cols = self.out_hw[0] * self.out_hw[1];
        let og = self.out_channels / self.groups;
        let w0 = (g * og + rows.start) * k;
        let m = rows.len();
        sgemm(
            Mat::row_major(&w[w0..w0 + m * k], m, k),
            Mat::row_major(col, k, cols),
            y,
        )
    }
}

impl StepKernel for Conv {
    fn kind(&self) -> &'static str {
        "conv"
    }

    fn access(&self) -> Access {
        let mut reads = vec![
            (self.x, self.input.iter().product()),
            (self.w, self.out_channels * self.col_rows()),
        ];
        reads.extend(self.bias.map(|b| (b, self.out_channels)));
        Access {
            reads,
            writes: vec![(self.y, self.out_len())],
        }
    }

    fn run_cpu(&self, io: &mut CpuIo<'_>) -> Result<(), GpuError> {
        let x = io.read(self.x)?;
        let w = io.read(self.w)?;
        let bias = self.bias.map(|b| io.read(b)).transpose()?;
        let y = io.write(self.y)?;
        if self.out_len() == 0 {
            return Ok(());
        }
        let [n, c, h, wd] = self.input;
        let cols = self.out_hw[0] * self.out_hw[1];
        let og = self.out_channels / self.groups;
        let (xlen, ylen) = (c * h * wd, self.out_channels * cols);
        for b in 0..n {
            let xb = &x[b * xlen..(b + 1) * xlen];
            let yb = &mut y[b * ylen..(b + 1) * ylen];
            if self.groups == 1 {
                let owned;
                let col: &[f32] = if self.is_pointwise() {
                    xb
                } else {
                    let mut v = vec![0.0f32; self.col_rows() * cols];
                    self.im2col(xb, 0, &mut v);
                    owned = v;
                    &owned
                };
                // Blocks of output rows, one task each (one block for small products).
                let tasks = if og * cols * self.col_rows() >= 1 << 20 {
                    (2 * rayon::current_num_threads()).min(og)
                } else {
                    1
                };
                let rows_per = og.div_ceil(tasks.max(1));
                yb.par_chunks_mut(rows_per * cols)
                    .enumerate()
                    .try_for_each(|(t, chunk)| {
                        let r0 = t * rows_per;
                        self.product(w, 0, col, r0..r0 + chunk.len() / cols, chunk)
                    })?;
            } else {
                yb.par_chunks_mut(og * cols)
                    .enumerate()
                    .try_for_each(|(g, chunk)| {
                        let mut col = vec![0.0f32; self.col_rows() * cols];
                        self.im2col(xb, g, &mut col);
                        self.product(w, g, &col, 0..og, chunk)
                    })?;
            }
        }
        apply_bias_act(y, bias, self.out_channels, cols, self.act);
        Ok(())
    }

    fn prepare_cuda(&self, cx: &mut PrepareCx<'_>) -> Result<Box<dyn Enqueue>, GpuError> {
        if self.padding != self.padding_end {
            return Err(cx.no_kernel("a convolution padded differently before and after"));
        }
        Ok(Box::new(prepare(self, cx)?))
    }
}

// --- CUDA --------------------------------------------------------------------------------

/// What the convolution algorithm search found, cached per device and convolution.
#[derive(Clone, Copy, Debug)]
struct ConvChoice {
    algo: dnn_sys::cudnnConvolutionFwdAlgo_t,
    workspace: usize,
    /// The math type the search ran `algo` with (cuDNN needs both on the descriptor).
    math: dnn_sys::cudnnMathType_t,
    /// The fused conv + bias + relu call works with `algo` (meaningful once `fused_tested`).
    fused_ok: bool,
    /// Whether the fused call was tried: a cache entry made by a convolution without relu
    /// has not, and a later convolution of the same shape with relu must still try it.
    fused_tested: bool,
}

fn conv_cache() -> &'static Mutex<HashMap<String, ConvChoice>> {
    static C: OnceLock<Mutex<HashMap<String, ConvChoice>>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

struct CudaConv {
    x: u64,
    w: u64,
    y: u64,
    bias: u64,
    x_desc: TensorDesc,
    y_desc: TensorDesc,
    bias_desc: TensorDesc,
    w_desc: FilterDesc,
    conv: ConvDesc,
    relu: ActDesc,
    choice: ConvChoice,
    /// Run the fused conv + bias + relu call (else conv, then the bias_act kernel).
    fused: bool,
    /// The unfused epilogue: bias and activation (None: nothing to do).
    epilogue: Option<super::act::CudaBiasAct>,
    /// A zero bias for a fused convolution without its own bias.
    _zero_bias: Option<CudaSlice<f32>>,
}

fn prepare(s: &Conv, cx: &mut PrepareCx<'_>) -> Result<CudaConv, GpuError> {
    let [n, c, _, _] = s.input;
    let oc = s.out_channels;
    let x_desc = tensor4(s.input)?;
    let y_desc = tensor4([n, oc, s.out_hw[0], s.out_hw[1]])?;
    let bias_desc = tensor4([1, oc, 1, 1])?;
    let w_desc = FilterDesc::new(
        [oc, c / s.groups, s.kernel[0], s.kernel[1]],
        dnn_sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
    )?;
    let conv = ConvDesc::new(s.padding, s.stride, s.dilation, s.groups)?;
    conv.set_math(if cx.opts.tf32 {
        dnn_sys::cudnnMathType_t::CUDNN_DEFAULT_MATH
    } else {
        dnn_sys::cudnnMathType_t::CUDNN_FMA_MATH
    })?;
    let relu = ActDesc::relu()?;
    let (xp, wp, yp) = (cx.ptr(s.x)?, cx.ptr(s.w)?, cx.ptr(s.y)?);
    // What the tuning table keys by (the device is the cache entry's fingerprint).
    let tuning_key = format!(
        "x={:?}|oc={oc}|k={:?}|s={:?}|p={:?}|d={:?}|g={}|nchw|{}",
        s.input,
        s.kernel,
        s.stride,
        s.padding,
        s.dilation,
        s.groups,
        if cx.opts.tf32 { "tf32" } else { "fp32" }
    );
    let key = format!("{}|{tuning_key}", cx.gpu.info.name);
    let cached = conv_cache().lock().ok().and_then(|m| m.get(&key).copied());
    let mut choice = match cached {
        Some(c) => c,
        None => {
            let candidates = match cx.tuning.get(&tuning_key) {
                Some(c) => c,
                None => {
                    let c = find_algos(cx, &x_desc, xp, &w_desc, wp, &conv, &y_desc, yp)?;
                    cx.tuning.insert(&tuning_key, c.clone());
                    c
                }
            };
            let c = choice_of(&candidates, cx.opts)?;
            if let Ok(mut m) = conv_cache().lock() {
                m.insert(key.clone(), c);
            }
            c
        }
    };
    // cuDNN picks the kernel from the algorithm *and* the math type: run with the math type
    // the search measured (PyTorch does the same).
    conv.set_math(choice.math)?;
    cx.sc.ensure_workspace(choice.workspace)?;
    let want_fused = s.act == Activation::Relu;
    let (zero_bias, bias_ptr) = match s.bias {
        Some(b) => (None, cx.ptr(b)?),
        None if want_fused => {
            let z = cx.gpu.zeros(oc)?;
            let (p, _) = z.device_ptr(&cx.gpu.alloc_stream);
            (Some(z), p)
        }
        None => (None, 0),
    };
    let mut plan = CudaConv {
        x: xp,
        w: wp,
        y: yp,
        bias: bias_ptr,
        x_desc,
        y_desc,
        bias_desc,
        w_desc,
        conv,
        relu,
        choice,
        fused: want_fused && choice.fused_ok,
        epilogue: None,
        _zero_bias: zero_bias,
    };
    if plan.fused && !choice.fused_tested {
        // The fused call does not support every algorithm everywhere: try it once now.
        let ok = plan.run_conv(cx.sc).is_ok() && cx.sc.synchronize().is_ok();
        if !ok {
            tracing::debug!("fused conv+bias+relu not supported for {key}; using conv + kernel");
        }
        choice.fused_ok = ok;
        choice.fused_tested = true;
        plan.choice = choice;
        plan.fused = ok;
        if let Ok(mut m) = conv_cache().lock() {
            m.insert(key, choice);
        }
    }
    if !plan.fused && (s.bias.is_some() || s.act != Activation::None) {
        let inner = s.out_hw[0] * s.out_hw[1];
        let step = super::act::BiasAct {
            y: s.y,
            bias: s.bias,
            total: n * oc * inner,
            channels: oc,
            inner,
            act: s.act,
        };
        plan.epilogue = Some(super::act::CudaBiasAct::new(cx, &step)?);
    }
    Ok(plan)
}

/// Every algorithm cuDNN can run the convolution with, timed on the GPU: the median of three
/// `cudnnFindConvolutionForwardAlgorithmEx` searches (each times every algorithm once), so one
/// noisy search does not decide.
#[allow(clippy::too_many_arguments)]
fn find_algos(
    cx: &mut PrepareCx<'_>,
    x_desc: &TensorDesc,
    x: u64,
    w_desc: &FilterDesc,
    w: u64,
    conv: &ConvDesc,
    y_desc: &TensorDesc,
    y: u64,
) -> Result<Vec<crate::tuning::Candidate>, GpuError> {
    const N: usize = 8;
    const SEARCHES: usize = 3;
    let limit = cx.opts.conv_workspace_limit;
    let ws = cx.gpu.zeros_bytes(limit.max(1))?;
    let (wsp, _) = ws.device_ptr(&cx.gpu.alloc_stream);
    // (algo, math) -> (workspace, times)
    let mut seen: HashMap<(u32, u32), (usize, Vec<f64>)> = HashMap::new();
    for _ in 0..SEARCHES {
        let mut count = 0i32;
        // SAFETY: zeroed plain-old-data structs the call fills in.
        let mut perf: [dnn_sys::cudnnConvolutionFwdAlgoPerf_t; N] = unsafe { std::mem::zeroed() };
        // SAFETY: descriptors match the buffers (sizes from the same program, checked at
        // preparation); the workspace is `limit` bytes; the handle's stream belongs to the bound
        // context. The search writes `y` (an output nobody has read yet).
        unsafe {
            dnn_sys::cudnnFindConvolutionForwardAlgorithmEx(
                cx.sc.cudnn(),
                x_desc.0,
                x as *const c_void,
                w_desc.0,
                w as *const c_void,
                conv.0,
                y_desc.0,
                y as *mut c_void,
                N as i32,
                &mut count,
                perf.as_mut_ptr(),
                wsp as *mut c_void,
                limit,
            )
        }
        .result()
        .map_err(|e| GpuError::cudnn("searching a convolution algorithm", e))?;
        for p in perf.iter().take(count.max(0) as usize) {
            if p.status == dnn_sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS && p.memory <= limit {
                let e = seen
                    .entry((p.algo as u32, p.mathType as u32))
                    .or_insert((p.memory, Vec::new()));
                e.1.push(f64::from(p.time));
            }
        }
    }
    let mut out: Vec<crate::tuning::Candidate> = seen
        .into_iter()
        .map(|((algo, math), (workspace, mut t))| {
            t.sort_by(f64::total_cmp);
            crate::tuning::Candidate {
                algo,
                math,
                ms: t[t.len() / 2],
                workspace,
            }
        })
        .collect();
    out.sort_by_key(|c| (c.algo, c.math));
    tracing::debug!("conv algorithms measured: {out:?}");
    Ok(out)
}

/// The algorithm to run among measured `candidates` ([`crate::tuning::choose`]).
fn choice_of(
    candidates: &[crate::tuning::Candidate],
    opts: &crate::KernelOptions,
) -> Result<ConvChoice, GpuError> {
    use dnn_sys::cudnnConvolutionFwdAlgo_t as A;
    use dnn_sys::cudnnMathType_t as M;
    let none = |m: &str| GpuError::Cudnn {
        during: "choosing a convolution algorithm".into(),
        message: m.into(),
    };
    let best = crate::tuning::choose(candidates, opts.conv_workspace_limit)
        .ok_or_else(|| none("no algorithm succeeded"))?;
    let algo = [
        A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
        A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        A::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
        A::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
        A::CUDNN_CONVOLUTION_FWD_ALGO_FFT,
        A::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
        A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
        A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
    ]
    .into_iter()
    .find(|a| *a as u32 == best.algo)
    .ok_or_else(|| none("a cached algorithm number this cuDNN does not have"))?;
    let math = [
        M::CUDNN_DEFAULT_MATH,
        M::CUDNN_TENSOR_OP_MATH,
        M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
        M::CUDNN_FMA_MATH,
    ]
    .into_iter()
    .find(|m| *m as u32 == best.math)
    .ok_or_else(|| none("a cached math type this cuDNN does not have"))?;
    Ok(ConvChoice {
        algo,
        workspace: best.workspace,
        math: search_math(opts.tf32, math),
        fused_ok: true,
        fused_tested: false,
    })
}

/// The math type to run a searched algorithm with: the one the search measured it with,
/// except that without TF32 the convolution stays in plain FMA math (cuDNN's default math
/// type allows TF32 on Ampere and later).
fn search_math(tf32: bool, searched: dnn_sys::cudnnMathType_t) -> dnn_sys::cudnnMathType_t {
    if tf32 {
        searched
    } else {
        dnn_sys::cudnnMathType_t::CUDNN_FMA_MATH
    }
}

impl CudaConv {
    fn run_conv(&self, sc: &StreamCtx) -> Result<(), GpuError> {
        let one = 1.0f32;
        let zero = 0.0f32;
        let (ws_ptr, ws_bytes) = if self.choice.workspace > 0 {
            (sc.workspace_ptr() as *mut c_void, self.choice.workspace)
        } else {
            (std::ptr::null_mut(), 0)
        };
        if self.fused {
            // SAFETY: descriptors match the buffers; z aliases y with alpha2 = 0 (allowed);
            // the stream's workspace holds at least `choice.workspace` bytes (fitted before
            // any launch).
            unsafe {
                dnn::convolution_bias_activation_forward(
                    sc.cudnn(),
                    (&one) as *const f32 as *const c_void,
                    self.x_desc.0,
                    self.x as *const c_void,
                    self.w_desc.0,
                    self.w as *const c_void,
                    self.conv.0,
                    self.choice.algo,
                    ws_ptr,
                    ws_bytes,
                    (&zero) as *const f32 as *const c_void,
                    self.y_desc.0,
                    self.y as *const c_void,
                    self.bias_desc.0,
                    self.bias as *const c_void,
                    self.relu.0,
                    self.y_desc.0,
                    self.y as *mut c_void,
                )
            }
            .map_err(|e| GpuError::cudnn("running a fused convolution", e))
        } else {
            // SAFETY: as above.
            unsafe {
                dnn::convolution_forward(
                    sc.cudnn(),
                    (&one) as *const f32 as *const c_void,
                    self.x_desc.0,
                    self.x as *const c_void,
                    self.w_desc.0,
                    self.w as *const c_void,
                    self.conv.0,
                    self.choice.algo,
                    ws_ptr,
                    ws_bytes,
                    (&zero) as *const f32 as *const c_void,
                    self.y_desc.0,
                    self.y as *mut c_void,
                )
            }
            .map_err(|e| GpuError::cudnn("running a convolution", e))
        }
    }
}

impl Enqueue for CudaConv {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        if sc.workspace_bytes() < self.choice.workspace {
            return Err(GpuError::Plan(format!(
                "a convolution needs {} bytes of workspace, its stream has {}",
                self.choice.workspace,
                sc.workspace_bytes()
            )));
        }
        self.run_conv(sc)?;
        if let Some(e) = &self.epilogue {
            e.enqueue(gpu, sc)?;
        }
        Ok(())
    }

    fn workspace(&self) -> usize {
        self.choice.workspace
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dnn_sys::cudnnMathType_t as M;

    #[test]
    fn searched_math_type_is_kept_unless_tf32_is_off() {
        assert_eq!(
            search_math(true, M::CUDNN_TENSOR_OP_MATH),
            M::CUDNN_TENSOR_OP_MATH
        );
        assert_eq!(search_math(true, M::CUDNN_FMA_MATH), M::CUDNN_FMA_MATH);
        assert_eq!(search_math(false, M::CUDNN_DEFAULT_MATH), M::CUDNN_FMA_MATH);
    }
}
