//! Which activation layout cuDNN's convolutions run faster in on this GPU (an ignored test,
//! `cargo xtask gpu-test`), before channels-last activations (#14's item 2) are built: every
//! distinct convolution of ResNet-50 and Inception-v3 at batch 1 and 16, in NCHW (what our
//! programs run) and in NHWC (channels-last, what PyTorch's compiled models run; its eager
//! NCHW convolutions were seen converting to NHWC around cuDNN's sm90 kernels on 2026-11-22),
//! each with its fastest legacy algorithm (`cudnnFindConvolutionForwardAlgorithmEx`, TF32
//! allowed, as the convolution step searches), timed as back-to-back launches between events.
//! The totals, each shape weighted by how often the model runs it, say what the layout would
//! buy a sequential plan's convolutions: one `layout A/B` line per model and batch.
#![allow(unsafe_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::ffi::c_void;

use cudarc::cudnn::{result as dnn, sys as dnn_sys};
use cudarc::driver::{CudaContext, CudaStream, DevicePtr};
use opsched_graph::zoo::ZooConfig;
use opsched_graph::Op;

use super::cudnn::{find_forward, tensor4_in, ConvDesc, FilterDesc};

/// A convolution's shape: input `[n, c, h, w]`, output channels, kernel, stride, padding (the
/// same before and after), dilation, groups.
type Shape = (
    [usize; 4],
    usize,
    [usize; 2],
    [usize; 2],
    [usize; 2],
    [usize; 2],
    usize,
);

/// Back-to-back launches timed per measurement.
const REPS: usize = 50;

/// Every convolution of `model` at `batch` with symmetric padding (the step pads an
/// asymmetric remainder itself), and how often each shape occurs.
fn shapes(model: &str, batch: usize) -> BTreeMap<Shape, usize> {
    let cfg = ZooConfig {
        batch,
        ..ZooConfig::default()
    };
    let g = opsched_graph::zoo::build(model, &cfg).unwrap();
    let mut out = BTreeMap::new();
    for op in g.ops() {
        let Op::Conv2d(c) = &g.node(op).op else {
            continue;
        };
        let inputs = g.input_shapes(op);
        let Some(first) = inputs.first() else {
            continue;
        };
        let channels: usize = inputs.iter().filter_map(|s| s.get(1)).sum();
        let (begin, end) = c.pads();
        if begin != end || first.len() != 4 {
            continue;
        }
        let key = (
            [first[0], channels, first[2], first[3]],
            c.out_channels,
            c.kernel,
            c.stride,
            begin,
            c.dilation,
            c.groups.max(1),
        );
        *out.entry(key).or_insert(0) += 1;
    }
    out
}

/// The time of one launch of `s`'s fastest legacy algorithm with activations (and weights) in
/// `format`, ms.
fn fastest(
    ctx: &std::sync::Arc<CudaContext>,
    stream: &std::sync::Arc<CudaStream>,
    handle: dnn_sys::cudnnHandle_t,
    s: &Shape,
    format: dnn_sys::cudnnTensorFormat_t,
) -> f64 {
    let &(x, oc, k, stride, pad, dilation, groups) = s;
    let conv = ConvDesc::new(pad, stride, dilation, groups).unwrap();
    conv.set_math(dnn_sys::cudnnMathType_t::CUDNN_DEFAULT_MATH)
        .unwrap();
    let xd = tensor4_in(x, format).unwrap();
    let wd = FilterDesc::new([oc, x[1] / groups, k[0], k[1]], format).unwrap();
    let mut y = [0i32; 4];
    // SAFETY: live descriptors; `y` has room for four dimensions.
    unsafe {
        dnn_sys::cudnnGetConvolution2dForwardOutputDim(
            conv.0, xd.0, wd.0, &mut y[0], &mut y[1], &mut y[2], &mut y[3],
        )
    }
    .result()
    .unwrap();
    let y = y.map(|v| usize::try_from(v).unwrap());
    let yd = tensor4_in(y, format).unwrap();
    let numel = |d: [usize; 4]| d.iter().product::<usize>();
    let xb = stream.alloc_zeros::<f32>(numel(x)).unwrap();
    let wb = stream
        .alloc_zeros::<f32>(oc * x[1] / groups * k[0] * k[1])
        .unwrap();
    let yb = stream.alloc_zeros::<f32>(numel(y)).unwrap();
    let limit = crate::KernelOptions::default().conv_workspace_limit;
    let ws = stream.alloc_zeros::<u8>(limit).unwrap();
    let (xp, wp, yp, wsp) = (
        xb.device_ptr(stream).0,
        wb.device_ptr(stream).0,
        yb.device_ptr(stream).0,
        ws.device_ptr(stream).0,
    );
    // SAFETY: descriptors match the buffers; the workspace is `limit` bytes.
    let found = unsafe { find_forward(handle, &xd, xp, &wd, wp, &conv, &yd, yp, wsp, limit) };
    let best = found
        .unwrap()
        .into_iter()
        .min_by(|a, b| a.time.total_cmp(&b.time))
        .unwrap();
    conv.set_math(best.mathType).unwrap();
    let run = || {
        let (one, zero) = (1.0f32, 0.0f32);
        // SAFETY: as for the search; the algorithm's workspace fits the limit.
        unsafe {
            dnn_sys::cudnnConvolutionForward(
                handle,
                (&one as *const f32).cast(),
                xd.0,
                xp as *const c_void,
                wd.0,
                wp as *const c_void,
                conv.0,
                best.algo,
                wsp as *mut c_void,
                best.memory,
                (&zero as *const f32).cast(),
                yd.0,
                yp as *mut c_void,
            )
        }
        .result()
        .unwrap();
    };
    super::nvrtc_ab::time_launches(ctx, stream, 3, REPS, &run)
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn convolutions_in_nchw_and_in_nhwc() {
    use dnn_sys::cudnnTensorFormat_t::{CUDNN_TENSOR_NCHW as NCHW, CUDNN_TENSOR_NHWC as NHWC};
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let handle = dnn::create_handle().unwrap();
    // SAFETY: a live handle and this test's stream.
    unsafe { dnn::set_stream(handle, stream.cu_stream() as _) }.unwrap();
    let mut lines = Vec::new();
    for (model, batch) in [
        ("resnet50", 1),
        ("resnet50", 16),
        ("inception_v3", 1),
        ("inception_v3", 16),
    ] {
        let shapes = shapes(model, batch);
        let (mut nchw, mut nhwc, mut convs) = (0.0, 0.0, 0);
        for (s, &n) in &shapes {
            let (a, b) = (
                fastest(&ctx, &stream, handle, s, NCHW),
                fastest(&ctx, &stream, handle, s, NHWC),
            );
            nchw += a * n as f64;
            nhwc += b * n as f64;
            convs += n;
        }
        lines.push(format!(
            "layout A/B {model} b{batch}: NCHW {nchw:.3} ms, NHWC {nhwc:.3} ms, NHWC/NCHW \
             {:.2}x over {convs} convolutions ({} shapes)",
            nhwc / nchw,
            shapes.len()
        ));
    }
    // SAFETY: created above, used by nothing after this.
    unsafe { dnn::destroy_handle(handle) }.unwrap();
    for l in &lines {
        println!("{l}");
    }
}

#[test]
fn the_shapes_are_every_symmetric_convolution_of_the_model() {
    // ResNet-50: 53 convolutions (the stem's 7x7, 16 bottlenecks of 3, 4 projections), all
    // padded alike on both sides.
    let s = shapes("resnet50", 1);
    assert_eq!(s.values().sum::<usize>(), 53);
    assert!(s.len() < 53, "shapes repeat across bottlenecks");
    assert!(s.keys().all(|k| k.0[0] == 1));
    assert_eq!(
        shapes("resnet50", 16).values().sum::<usize>(),
        53,
        "the batch changes no shape but n"
    );
}
