//! Side by side on a GPU (an ignored test, `cargo xtask gpu-test`): the NVRTC kernels as a GPU
//! last checked them (2026-11-26: 64-bit index division, layer norm as a 1024-thread
//! shared-memory tree) against [`super::nvrtc::SOURCE`]'s, on the shapes where the change
//! should show (BERT-base at batch 16, GoogLeNet's concatenations at batch 16), and the
//! softmax kernel beside cuDNN's softmax, which it may replace, and the depthwise kernel
//! beside its version of ea18c6e (before the input bias and summed inputs, in each layout,
//! with and without an input bias), beside its unrolled and tiled forms (channels last also
//! tiled by fours and by twos), and in NCHW beside its channels-last form (NASNet-A large's
//! shapes), and the sums of NASNet's cells one channel a thread beside several (`pool2d_sum`,
//! `elementwise_runs`, `bias_act_runs`, channels last into a concatenation's slice). The same
//! inputs go to both; the outputs must agree; each kernel's GPU time (events around
//! back-to-back launches, which the GPU runs slower than the host issues them) is printed with
//! the ratio.
#![allow(unsafe_code, clippy::unwrap_used)]

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};

use super::grid;
use super::nvrtc::{act_params, layer_norm_block, SOURCE};

/// The kernels of 2026-11-26, renamed, compiled after `SOURCE`: the old copy and bias +
/// activation are `SOURCE`'s templates on 64-bit indices (their bodies are the old kernels'),
/// the old layer norm, another algorithm, is kept whole.
const BEFORE: &str = r#"
extern "C" __global__ void before_slab_copy(float* dst, const float* src, i64 outer,
        i64 src_axis, i64 src_off, i64 dst_axis, i64 dst_off, i64 len, i64 inner,
        int accumulate) {
    slab_copy_t<i64>(dst, src, outer, src_axis, src_off, dst_axis, dst_off, len, inner,
                     accumulate);
}

extern "C" __global__ void before_bias_act(float* y, const float* bias, const float* residual,
        i64 total, i64 channels, i64 inner, int act, float p0, float p1) {
    bias_act_t<i64>(y, bias, residual, total, channels, inner, act, p0, p1);
}

extern "C" __global__ void before_layer_norm(float* y, const float* x, const float* gamma,
        const float* beta, i64 rows, int dim, float eps) {
    __shared__ float red[1024];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * dim;
        float s = 0.0f;
        for (int d = threadIdx.x; d < dim; d += blockDim.x) s += xr[d];
        red[threadIdx.x] = s;
        __syncthreads();
        for (int k = blockDim.x / 2; k > 0; k >>= 1) {
            if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
            __syncthreads();
        }
        float mean = red[0] / dim;
        __syncthreads();
        float v = 0.0f;
        for (int d = threadIdx.x; d < dim; d += blockDim.x) {
            float c = xr[d] - mean;
            v += c * c;
        }
        red[threadIdx.x] = v;
        __syncthreads();
        for (int k = blockDim.x / 2; k > 0; k >>= 1) {
            if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
            __syncthreads();
        }
        float inv = rsqrtf(red[0] / dim + eps);
        __syncthreads();
        for (int d = threadIdx.x; d < dim; d += blockDim.x)
            y[r * dim + d] = (xr[d] - mean) * inv * gamma[d] + beta[d];
    }
}

// The depthwise kernel of ea18c6e (2026-11-27, before the input bias and summed inputs), its
// loop as it was.
template <typename I, bool NHWC>
__device__ __forceinline__ void before_depthwise_t(float* y, const float* x, const float* wt,
        const float* bias, I nc, int c, I ximage, int xpix, Geo12 g, int pre, float q0,
        float q1, int act, float p0, float p1) {
    int h = g.v[0], w = g.v[1], oh = g.v[2], ow = g.v[3], kh = g.v[4], kw = g.v[5];
    int sh = g.v[6], sw = g.v[7], ph = g.v[8], pw = g.v[9], dh = g.v[10], dw = g.v[11];
    I total = nc * oh * ow;
    const int step = NHWC ? xpix : 1, wstep = NHWC ? c : 1;
    GRID_STRIDE_T(I, t, total) {
        int ch, i, j;
        I image;
        if (NHWC) {
            ch = (int)(t % c);
            I pixel = t / c;
            j = (int)(pixel % ow);
            i = (int)((pixel / ow) % oh);
            image = pixel / ((I)oh * ow);
        } else {
            j = (int)(t % ow);
            i = (int)((t / ow) % oh);
            I plane = t / ((I)oh * ow);
            ch = (int)(plane % c);
            image = plane / c;
        }
        const float* xp = x + image * ximage + (NHWC ? (I)ch : (I)ch * h * w);
        const float* wp = NHWC ? wt + ch : wt + (i64)ch * kh * kw;
        float acc = 0.0f;
        for (int p = 0; p < kh; ++p) {
            int r = i * sh - ph + p * dh;
            if (r < 0 || r >= h) continue;
            for (int q = 0; q < kw; ++q) {
                int s = j * sw - pw + q * dw;
                if (s < 0 || s >= w) continue;
                acc += act_f(xp[((I)r * w + s) * step], pre, q0, q1) * wp[(p * kw + q) * wstep];
            }
        }
        if (bias) acc += bias[ch];
        y[t] = act_f(acc, act, p0, p1);
    }
}

extern "C" __global__ void before_depthwise_conv(float* y, const float* x, const float* wt,
        const float* bias, i64 nc, int c, i64 ximage, int xpix, Geo12 g, int pre, float q0,
        float q1, int act, float p0, float p1) {
    if (FITS32(nc * g.v[2] * g.v[3]) && FITS32(nc / c * ximage))
        before_depthwise_t<unsigned, false>(y, x, wt, bias, nc, c, ximage, xpix, g, pre, q0, q1,
                                            act, p0, p1);
    else
        before_depthwise_t<i64, false>(y, x, wt, bias, nc, c, ximage, xpix, g, pre, q0, q1, act,
                                       p0, p1);
}

extern "C" __global__ void before_depthwise_conv_nhwc(float* y, const float* x, const float* wt,
        const float* bias, i64 nc, int c, i64 ximage, int xpix, Geo12 g, int pre, float q0,
        float q1, int act, float p0, float p1) {
    if (FITS32(nc * g.v[2] * g.v[3]) && FITS32(nc / c * ximage))
        before_depthwise_t<unsigned, true>(y, x, wt, bias, nc, c, ximage, xpix, g, pre, q0, q1,
                                           act, p0, p1);
    else
        before_depthwise_t<i64, true>(y, x, wt, bias, nc, c, ximage, xpix, g, pre, q0, q1, act,
                                      p0, p1);
}
"#;

const REPS: usize = 200;

/// Values in [-2, 2) from a seed.
fn values(n: usize, seed: u64) -> Vec<f32> {
    crate::program::uniform(seed, n, 0.0, 2.0)
}

/// A kernel's GPU time per launch, ms, after a warm-up launch.
fn time(ctx: &Arc<CudaContext>, stream: &CudaStream, launch: &dyn Fn()) -> f64 {
    time_launches(ctx, stream, 1, REPS, launch)
}

/// GPU time of one of `reps` back-to-back launches of `launch` (events around them), ms,
/// after `warmup` launches: the A/B tests' timer.
pub(super) fn time_launches(
    ctx: &Arc<CudaContext>,
    stream: &CudaStream,
    warmup: usize,
    reps: usize,
    launch: &dyn Fn(),
) -> f64 {
    for _ in 0..warmup {
        launch();
    }
    stream.synchronize().unwrap();
    // Timing events: cudarc's default flags disable timing (elapsed_ms would fail).
    let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = ctx.new_event(timed).unwrap();
    let end = ctx.new_event(timed).unwrap();
    start.record(stream).unwrap();
    for _ in 0..reps {
        launch();
    }
    end.record(stream).unwrap();
    end.synchronize().unwrap();
    f64::from(start.elapsed_ms(&end).unwrap()) / reps as f64
}

/// Largest difference relative to the largest magnitude of `want` (at least 1).
fn scaled(got: &[f32], want: &[f32]) -> f64 {
    crate::reference::scaled_error(got, want)
}

/// The old kernels compile after today's source with NVRTC (needs libnvrtc, not a GPU), so
/// the side-by-side test below fails on a GPU for its timings only.
#[test]
#[ignore = "needs libnvrtc: cargo xtask gpu-test"]
fn the_side_by_side_kernels_compile() {
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some("compute_90"),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(format!("{SOURCE}{BEFORE}"), opts)
        .unwrap_or_else(|e| panic!("{e:?}"))
        .to_src();
    for name in [
        "before_slab_copy",
        "before_bias_act",
        "before_layer_norm",
        "before_depthwise_conv",
        "before_depthwise_conv_nhwc",
    ] {
        assert!(
            ptx.contains(&format!(".entry {name}(")),
            "no kernel '{name}'"
        );
    }
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn kernels_side_by_side_with_their_2026_11_26_versions() {
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some("compute_90"),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(format!("{SOURCE}{BEFORE}"), opts).unwrap();
    let module = ctx.load_module(ptx).unwrap();
    let f = |name: &str| -> CudaFunction { module.load_function(name).unwrap() };
    let up = |v: &[f32]| stream.clone_htod(v).unwrap();
    let mut rows = Vec::new();
    let mut report = |what: &str, before: f64, after: f64, err: f64| {
        rows.push(format!(
            "kernel A/B {what}: before {:.2} us, after {:.2} us, after/before {:.2}x, \
             outputs differ by {err:.1e}",
            before * 1e3,
            after * 1e3,
            after / before
        ));
    };

    // Bias + GELU (erf) of BERT-base's first FFN product at batch 16, and bias + relu of a
    // 256-channel convolution at batch 16: y += bias, then the activation, in place.
    for (what, total, channels, inner, act) in [
        (
            "bias+gelu [2048, 3072]",
            2048 * 3072,
            3072,
            1,
            opsched_graph::Activation::Gelu,
        ),
        (
            "bias+relu [16, 256, 28, 28]",
            16 * 256 * 784,
            256,
            784,
            opsched_graph::Activation::Relu,
        ),
    ] {
        let y0 = values(total, 1);
        let bias = up(&values(channels, 2));
        let (code, p0, p1) = act_params(act);
        let run = |name: &str, y: &cudarc::driver::CudaSlice<f32>| {
            let func = f(name);
            let stream = stream.clone();
            let (yp, _) = y.device_ptr(&stream);
            let (bp, _) = bias.device_ptr(&stream);
            let args = (yp, bp, 0u64, total as i64, channels as i64, inner as i64);
            // `bias_act_vec4` takes four elements a thread.
            let threads = if name.ends_with("vec4") {
                total / 4
            } else {
                total
            };
            move || {
                let mut b = stream.launch_builder(&func);
                b.arg(&args.0)
                    .arg(&args.1)
                    .arg(&args.2)
                    .arg(&args.3)
                    .arg(&args.4);
                b.arg(&args.5).arg(&code).arg(&p0).arg(&p1);
                // SAFETY: y holds `total` values, bias `channels`, no residual; for
                // `bias_act_vec4` both are fresh allocations (aligned), total and the bias
                // runs divide by 4 (the shapes above).
                unsafe { b.launch(grid(threads)) }.unwrap();
            }
        };
        let (ya, yb, yc) = (up(&y0), up(&y0), up(&y0));
        // One application each on the same input, compared; then timed (in place, repeated).
        let (before, after) = (run("before_bias_act", &ya), run("bias_act", &yb));
        let by_fours = run("bias_act_vec4", &yc);
        before();
        after();
        by_fours();
        let want = stream.clone_dtoh(&ya).unwrap();
        let err = scaled(&stream.clone_dtoh(&yb).unwrap(), &want);
        assert!(err <= 1e-6, "{what}: {err}");
        let err4 = scaled(&stream.clone_dtoh(&yc).unwrap(), &want);
        assert!(err4 <= 1e-6, "{what}, four at a time: {err4}");
        let t_after = time(&ctx, &stream, &after);
        report(what, time(&ctx, &stream, &before), t_after, err);
        report(
            &format!("{what} four at a time (bias_act_vec4 vs bias_act)"),
            t_after,
            time(&ctx, &stream, &by_fours),
            err4,
        );
    }

    // Layer norm of BERT-base's rows at batch 16.
    {
        let (rows_n, dim) = (2048usize, 768usize);
        let x = up(&values(rows_n * dim, 3));
        let gamma = up(&values(dim, 4));
        let beta = up(&values(dim, 5));
        let (ya, yb) = (up(&vec![0.0; rows_n * dim]), up(&vec![0.0; rows_n * dim]));
        let run = |name: &str, y: &cudarc::driver::CudaSlice<f32>, block: u32| {
            let func = f(name);
            let stream = stream.clone();
            let ptrs = [
                y.device_ptr(&stream).0,
                x.device_ptr(&stream).0,
                gamma.device_ptr(&stream).0,
                beta.device_ptr(&stream).0,
            ];
            move || {
                let mut b = stream.launch_builder(&func);
                let (rows, width, eps) = (rows_n as i64, dim as i32, 1e-12f32);
                b.arg(&ptrs[0]).arg(&ptrs[1]).arg(&ptrs[2]).arg(&ptrs[3]);
                b.arg(&rows).arg(&width).arg(&eps);
                let cfg = LaunchConfig {
                    grid_dim: (rows_n as u32, 1, 1),
                    block_dim: (block, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: x and y hold rows x dim values, gamma and beta dim; the block is
                // what each kernel requires (a power of two, a multiple of 32).
                unsafe { b.launch(cfg) }.unwrap();
            }
        };
        let before = run(
            "before_layer_norm",
            &ya,
            dim.next_power_of_two().clamp(32, 1024) as u32,
        );
        let after = run("layer_norm", &yb, layer_norm_block(dim));
        before();
        after();
        let err = scaled(
            &stream.clone_dtoh(&yb).unwrap(),
            &stream.clone_dtoh(&ya).unwrap(),
        );
        assert!(err <= 1e-5, "layer norm: {err}");
        report(
            "layer norm [2048, 768]",
            time(&ctx, &stream, &before),
            time(&ctx, &stream, &after),
            err,
        );
    }

    // One term of a GoogLeNet concatenation at batch 16: [16, 128, 28, 28] into channels
    // 192..320 of [16, 480, 28, 28].
    {
        let (n, c, total_c, off, hw) = (16usize, 128usize, 480usize, 192usize, 784usize);
        let src = up(&values(n * c * hw, 6));
        let (da, db) = (
            up(&vec![0.0; n * total_c * hw]),
            up(&vec![0.0; n * total_c * hw]),
        );
        let run = |name: &str, dst: &cudarc::driver::CudaSlice<f32>| {
            let func = f(name);
            let stream = stream.clone();
            let (dp, sp) = (dst.device_ptr(&stream).0, src.device_ptr(&stream).0);
            move || {
                let sizes = [n, c, 0, total_c, off, c, hw].map(|v| v as i64);
                let mut b = stream.launch_builder(&func);
                b.arg(&dp).arg(&sp);
                for v in &sizes {
                    b.arg(v);
                }
                b.arg(&0i32);
                let cfg = grid(n * c * hw);
                // SAFETY: src holds n x c x hw values, dst n x total_c x hw, and the slice
                // off..off + c lies within total_c.
                unsafe { b.launch(cfg) }.unwrap();
            }
        };
        let (before, after) = (run("before_slab_copy", &da), run("slab_copy", &db));
        before();
        after();
        let got = stream.clone_dtoh(&db).unwrap();
        assert_eq!(got, stream.clone_dtoh(&da).unwrap(), "the copies differ");
        report(
            "concat copy [16, 128, 28, 28] -> [16, 480, 28, 28]",
            time(&ctx, &stream, &before),
            time(&ctx, &stream, &after),
            0.0,
        );
    }
    // Softmax of BERT-base's attention scores at batch 16 (rows of 128) and of a batch of
    // 1000 logits: cuDNN's channel softmax (what ran on 2026-11-26; the step now times both)
    // against `softmax_rows`, each also against the CPU's formula.
    {
        use cudarc::cudnn::{result as dnn, sys as dnn_sys};
        use std::ffi::c_void;
        let handle = dnn::create_handle().unwrap();
        // SAFETY: a live handle and this test's stream.
        unsafe { dnn::set_stream(handle, stream.cu_stream() as _) }.unwrap();
        for (rows_n, dim) in [(16 * 12 * 128usize, 128usize), (16, 1000)] {
            let host = values(rows_n * dim, 7);
            let x = up(&host);
            let (ya, yb) = (up(&vec![0.0; rows_n * dim]), up(&vec![0.0; rows_n * dim]));
            let desc = super::cudnn::tensor4([rows_n, dim, 1, 1]).unwrap();
            let xp = x.device_ptr(&stream).0;
            let (yap, ybp) = (ya.device_ptr(&stream).0, yb.device_ptr(&stream).0);
            let before = || {
                let (one, zero) = (1.0f32, 0.0f32);
                // SAFETY: one descriptor for x and y, each rows x dim values.
                unsafe {
                    dnn::softmax_forward(
                        handle,
                        dnn_sys::cudnnSoftmaxAlgorithm_t::CUDNN_SOFTMAX_ACCURATE,
                        dnn_sys::cudnnSoftmaxMode_t::CUDNN_SOFTMAX_MODE_CHANNEL,
                        (&one as *const f32).cast::<c_void>(),
                        desc.0,
                        xp as *const c_void,
                        (&zero as *const f32).cast::<c_void>(),
                        desc.0,
                        yap as *mut c_void,
                    )
                }
                .unwrap();
            };
            let func = f("softmax_rows");
            let (n, width, log) = (rows_n as i64, dim as i32, 0i32);
            let after = || {
                let mut b = stream.launch_builder(&func);
                b.arg(&ybp).arg(&xp).arg(&n).arg(&width).arg(&log);
                // SAFETY: x and y hold rows x dim values; a warp per row.
                unsafe { b.launch(grid(rows_n * 32)) }.unwrap();
            };
            before();
            after();
            let want: Vec<f32> = host
                .chunks(dim)
                .flat_map(|row| {
                    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let s: f32 = row.iter().map(|v| (v - m).exp()).sum();
                    row.iter()
                        .map(move |v| (v - m).exp() / s)
                        .collect::<Vec<_>>()
                })
                .collect();
            let (ga, gb) = (
                stream.clone_dtoh(&ya).unwrap(),
                stream.clone_dtoh(&yb).unwrap(),
            );
            let (ea, eb) = (scaled(&ga, &want), scaled(&gb, &want));
            assert!(ea <= 1e-5 && eb <= 1e-5, "softmax: cudnn {ea}, ours {eb}");
            report(
                &format!("softmax [{rows_n}, {dim}] (before: cuDNN)"),
                time(&ctx, &stream, &before),
                time(&ctx, &stream, &after),
                scaled(&gb, &ga),
            );
            // The log form: x - max - log(sum).
            let one = 1i32;
            let mut b = stream.launch_builder(&func);
            b.arg(&ybp).arg(&xp).arg(&n).arg(&width).arg(&one);
            // SAFETY: as above.
            unsafe { b.launch(grid(rows_n * 32)) }.unwrap();
            let got = stream.clone_dtoh(&yb).unwrap();
            let want_log: Vec<f32> = want.iter().map(|p| p.ln()).collect();
            let e = scaled(&got, &want_log);
            assert!(e <= 1e-5, "log-softmax: {e}");
        }
        // SAFETY: created above, used by nothing after this.
        unsafe { dnn::destroy_handle(handle) }.unwrap();
    }
    // Depthwise convolutions of NASNet-A large (relu before, bias after): the kernel of
    // ea18c6e (`before_depthwise_conv*`) against today's without extra inputs (the loop it
    // had) and with an input bias (NASNet's second separable convolutions since deferred
    // biases, fed x where the old one is fed x + bias, so the outputs agree), in each layout;
    // and NCHW against channels last (today's kernels, the NHWC output compared in NCHW).
    for (n, c, hw, k, stride) in [
        (1usize, 96usize, 165usize, 5usize, 2usize),
        (1, 42, 165, 5, 2),
        (1, 168, 42, 5, 1),
        (1, 672, 11, 7, 1),
        (16, 168, 42, 5, 1),
    ] {
        let pad = k / 2;
        let out = (hw + 2 * pad - k) / stride + 1;
        let (shape, out_shape) = ([n, c, hw, hw], [n, c, out, out]);
        let x = values(n * c * hw * hw, 8);
        let in_bias = values(c, 11);
        // x + the input bias, as the kernel adds it (one f32 addition).
        let x_biased: Vec<f32> = (0..x.len())
            .map(|t| x[t] + in_bias[(t / (hw * hw)) % c])
            .collect();
        let last = |v: &[f32]| {
            let mut l = vec![0.0; v.len()];
            crate::program::nchw_to_nhwc(v, shape, &mut l);
            l
        };
        let w = values(c * k * k, 9);
        let w_last: Vec<f32> = (0..c * k * k).map(|t| w[(t % c) * k * k + t / c]).collect();
        let (bias, in_bias) = (up(&values(c, 10)), up(&in_bias));
        let len = n * c * out * out;
        let outputs: Vec<_> = (0..3).map(|_| up(&vec![0.0; len])).collect();
        let geo = [hw, hw, out, out, k, k, stride, stride, pad, pad, 1, 1].map(|v| v as i32);
        // `name` over `x` with weights `w` into `y`; today's kernels take `extra` (an input
        // bias or none), the old ones stop at the activation. The closure keeps the buffers'
        // device addresses, not borrows: each buffer must outlive every call of it.
        let run = |name: &str,
                   y: &cudarc::driver::CudaSlice<f32>,
                   x: &cudarc::driver::CudaSlice<f32>,
                   w: &cudarc::driver::CudaSlice<f32>,
                   extra: Option<&cudarc::driver::CudaSlice<f32>>| {
            let func = f(name);
            let stream = stream.clone();
            let ptrs = [y, x, w, &bias].map(|b| b.device_ptr(&stream).0);
            let old = name.starts_with("before_");
            // A tiled kernel's thread computes 4 outputs of a row at stride 1, 2 at stride 2,
            // the ones by fours and twos those of four and two channels.
            let row = if stride == 1 { 4 } else { 2 };
            let channels = match (name.contains("_tiled4"), name.contains("_tiled2")) {
                (true, _) => 4,
                (_, true) => 2,
                _ => 1,
            };
            let items = match name.contains("_tiled") {
                true => len.div_ceil(channels * row),
                false => len,
            };
            let extra = extra.map_or(0u64, |b| b.device_ptr(&stream).0);
            let (pre, post) = (
                act_params(opsched_graph::Activation::Relu),
                act_params(opsched_graph::Activation::None),
            );
            move || {
                let mut b = stream.launch_builder(&func);
                let (nc, channels) = ((n * c) as i64, c as i32);
                let ximage = (c * hw * hw) as i64;
                b.arg(&ptrs[0]).arg(&ptrs[1]).arg(&ptrs[2]).arg(&ptrs[3]);
                b.arg(&nc)
                    .arg(&channels)
                    .arg(&ximage)
                    .arg(&channels)
                    .arg(&geo);
                b.arg(&pre.0).arg(&pre.1).arg(&pre.2);
                b.arg(&post.0).arg(&post.1).arg(&post.2);
                let (no_sum, none) = (0u64, 0i32);
                if !old {
                    b.arg(&extra).arg(&no_sum).arg(&none);
                }
                // SAFETY: x holds n x c x hw x hw values (dense: images c x hw x hw apart,
                // pixels c apart), y n x c x out x out, the weights c x k x k, the bias and
                // the input bias (where not null) c, no summed inputs (null); Geo12 is
                // twelve ints by value; the old kernels take the arguments up to `act`'s.
                unsafe { b.launch(grid(items)) }.unwrap();
            }
        };
        for nhwc in [false, true] {
            let (suffix, layout) = if nhwc {
                ("_nhwc", "NHWC")
            } else {
                ("", "NCHW")
            };
            let (xs, xbs, ws) = match nhwc {
                false => (up(&x), up(&x_biased), up(&w)),
                true => (up(&last(&x)), up(&last(&x_biased)), up(&w_last)),
            };
            let kernel = |prefix: &str| format!("{prefix}depthwise_conv{suffix}");
            // The old kernel reads x + bias where today's add the input bias to x.
            for (what, old_x, extra) in [("", &xs, None), (", input bias", &xbs, Some(&in_bias))] {
                let old = run(&kernel("before_"), &outputs[0], old_x, &ws, None);
                let now = run(&kernel(""), &outputs[1], &xs, &ws, extra);
                old();
                now();
                let want = stream.clone_dtoh(&outputs[0]).unwrap();
                let err = |y| scaled(&stream.clone_dtoh(y).unwrap(), &want);
                let e_now = err(&outputs[1]);
                assert!(e_now <= 1e-6, "depthwise {shape:?} {layout}{what}: {e_now}");
                let (t_old, t_now) = (time(&ctx, &stream, &old), time(&ctx, &stream, &now));
                let name = format!("depthwise {k}x{k}/{stride} {shape:?} {layout}{what}");
                report(&format!("{name} (before: ea18c6e)"), t_old, t_now, e_now);
                let mut candidates = vec![
                    (
                        format!("depthwise_conv_unrolled{suffix}"),
                        "its width unrolled",
                    ),
                    (format!("depthwise_conv_tiled{suffix}"), "tiled"),
                ];
                if nhwc && c % 4 == 0 {
                    candidates.push(("depthwise_conv_tiled4_nhwc".into(), "tiled by fours"));
                }
                if nhwc {
                    candidates.push(("depthwise_conv_tiled2_nhwc".into(), "tiled by twos"));
                }
                for (candidate, how) in candidates {
                    let after = run(&candidate, &outputs[2], &xs, &ws, extra);
                    after();
                    let e = err(&outputs[2]);
                    assert!(e <= 1e-6, "{candidate} {shape:?} {layout}{what}: {e}");
                    report(
                        &format!("{name} (before: today's, after: {how})"),
                        t_now,
                        time(&ctx, &stream, &after),
                        e,
                    );
                }
            }
        }
        let (ya, yb) = (&outputs[0], &outputs[1]);
        // Named, not temporaries: the closures keep the buffers' addresses, and a buffer
        // dropped before they run is freed to the stream's pool (on 2026-11-27 the NCHW
        // kernel read the channels-last input uploaded into its place).
        let (xa, wa) = (up(&x), up(&w));
        let (xb, wb) = (up(&last(&x)), up(&w_last));
        let before = run("depthwise_conv", ya, &xa, &wa, None);
        let after = run("depthwise_conv_nhwc", yb, &xb, &wb, None);
        before();
        after();
        let nchw = stream.clone_dtoh(ya).unwrap();
        let got = crate::program::nhwc_to_nchw(&stream.clone_dtoh(yb).unwrap(), out_shape);
        let err = scaled(&got, &nchw);
        assert!(err <= 1e-6, "depthwise {shape:?}: {err}");
        report(
            &format!("depthwise {k}x{k}/{stride} {shape:?} (before: NCHW, after: NHWC)"),
            time(&ctx, &stream, &before),
            time(&ctx, &stream, &after),
            err,
        );
    }
    // NASNet-A large's sums channels last, into their cell's concatenation (each pixel's
    // channels a run of the concatenation's): an average pooling 3x3 plus a value
    // (`pool2d_sum`) and two values (`elementwise_runs`), one channel a thread against
    // several (4, or 2 for the stem cells' 42 channels: the width the step picks).
    for (n, c, hw, branches) in [
        (1usize, 42usize, 83usize, 4usize),
        (1, 168, 42, 6),
        (1, 336, 21, 6),
        (16, 168, 42, 6),
    ] {
        let vec = if c % 4 == 0 { 4i32 } else { 2 };
        let len = n * c * hw * hw;
        let (run, stride) = (c as i64, (c * branches) as i64);
        let (xa, xb) = (up(&values(len, 12)), up(&values(len, 13)));
        let bias = up(&values(c, 14));
        let (ya, yb) = (
            up(&vec![0.0; len * branches]),
            up(&vec![0.0; len * branches]),
        );
        let xs = [&xa, &xb].map(|b| b.device_ptr(&stream).0);
        // Pool x_a, add x_b; no bias left to the pooling.
        let pool_ptrs = stream.clone_htod(&[xs[0], xs[1], 0u64]).unwrap();
        let pool_meta = stream.clone_htod(&[c as i64, 0, 0]).unwrap();
        let elem_ptrs = stream.clone_htod(&xs).unwrap();
        let (relu, bp, channels64) = (
            act_params(opsched_graph::Activation::Relu),
            bias.device_ptr(&stream).0,
            c as i64,
        );
        let pooled = |y: &cudarc::driver::CudaSlice<f32>, width: i32| {
            let func = f("pool2d_sum");
            let stream = stream.clone();
            let yp = y.device_ptr(&stream).0;
            let arrays = [
                pool_ptrs.device_ptr(&stream).0,
                pool_meta.device_ptr(&stream).0,
            ];
            let hw32 = hw as i32;
            // h, w, oh, ow, kh, kw, sh, sw, ph, pw, eh, ew, count_pad (NASNet's: no).
            let geo = [hw32, hw32, hw32, hw32, 3, 3, 1, 1, 1, 1, 1, 1, 0];
            move || {
                let mut b = stream.launch_builder(&func);
                b.arg(&yp)
                    .arg(&run)
                    .arg(&stride)
                    .arg(&arrays[0])
                    .arg(&arrays[1]);
                let (npool, nadd, images, channels, nhwc) = (1i32, 1i32, n as i64, c as i32, 1i32);
                b.arg(&npool)
                    .arg(&nadd)
                    .arg(&images)
                    .arg(&channels)
                    .arg(&nhwc);
                for v in &geo {
                    b.arg(v);
                }
                let (is_max, inner, narrow) = (0i32, 1i64, 1i32);
                b.arg(&is_max).arg(&relu.0).arg(&relu.1).arg(&relu.2);
                b.arg(&bp)
                    .arg(&channels64)
                    .arg(&inner)
                    .arg(&narrow)
                    .arg(&width);
                // SAFETY: matches `pool2d_sum`: one input pooled (dense, pixels c apart) and
                // one value added (dense), n x c x hw x hw each, no pooled bias; y holds
                // n x hw x hw runs of c, `branches * c` apart; the bias c values; `width`
                // divides c.
                unsafe { b.launch(grid(len / width as usize)) }.unwrap();
            }
        };
        let summed = |y: &cudarc::driver::CudaSlice<f32>, width: i32| {
            let func = f("elementwise_runs");
            let stream = stream.clone();
            let (yp, sp) = (y.device_ptr(&stream).0, elem_ptrs.device_ptr(&stream).0);
            move || {
                let mut b = stream.launch_builder(&func);
                let (nsrc, total, is_mul, inner) = (2i32, len as i64, 0i32, 1i64);
                b.arg(&yp)
                    .arg(&sp)
                    .arg(&nsrc)
                    .arg(&total)
                    .arg(&run)
                    .arg(&stride);
                b.arg(&is_mul).arg(&relu.0).arg(&relu.1).arg(&relu.2);
                b.arg(&bp).arg(&channels64).arg(&inner).arg(&width);
                // SAFETY: matches `elementwise_runs`: two dense sources of `len` values, y
                // `len` values in runs of c, `branches * c` apart; the bias c values;
                // `width` divides len, the run and the stride.
                unsafe { b.launch(grid(len / width as usize)) }.unwrap();
            }
        };
        // A convolution's bias and relu on its slice, in place (`bias_act_runs`).
        let biased = |y: &cudarc::driver::CudaSlice<f32>, width: i32| {
            let func = f("bias_act_runs");
            let stream = stream.clone();
            let yp = y.device_ptr(&stream).0;
            move || {
                let mut b = stream.launch_builder(&func);
                let (none, total, inner) = (0u64, len as i64, 1i64);
                b.arg(&yp)
                    .arg(&bp)
                    .arg(&none)
                    .arg(&total)
                    .arg(&channels64)
                    .arg(&inner);
                b.arg(&run)
                    .arg(&stride)
                    .arg(&relu.0)
                    .arg(&relu.1)
                    .arg(&relu.2);
                b.arg(&width);
                // SAFETY: matches `bias_act_runs`: y `len` values in runs of c, `branches *
                // c` apart; the bias c values; no residual; `width` divides len, the run and
                // the stride.
                unsafe { b.launch(grid(len / width as usize)) }.unwrap();
            }
        };
        let shape = [n, hw, hw, c];
        let kernel = |which: usize, y: &cudarc::driver::CudaSlice<f32>, width: i32| {
            let launch: Box<dyn Fn()> = match which {
                0 => Box::new(pooled(y, width)),
                1 => Box::new(summed(y, width)),
                _ => Box::new(biased(y, width)),
            };
            launch
        };
        let names = [
            "pool2d_sum avg 3x3 + value",
            "elementwise_runs sum of two",
            "bias_act_runs bias + relu in place",
        ];
        for (which, what) in names.into_iter().enumerate() {
            let (one, wide) = (kernel(which, &ya, 1), kernel(which, &yb, vec));
            one();
            wide();
            let (a, b) = (
                stream.clone_dtoh(&ya).unwrap(),
                stream.clone_dtoh(&yb).unwrap(),
            );
            assert_eq!(a, b, "{what} {shape:?}: {vec} channels a thread differ");
            report(
                &format!(
                    "{what} {shape:?} NHWC into runs of {run} of {stride} (before: one \
                     channel a thread, after: {vec})"
                ),
                time(&ctx, &stream, &one),
                time(&ctx, &stream, &wide),
                0.0,
            );
        }
    }
    for r in &rows {
        println!("{r}");
    }
}
