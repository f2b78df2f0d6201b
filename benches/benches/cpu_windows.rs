//! The CPU device's sliding-window kernels (`opsched_gpu::cpu::window`) on one thread, per
//! plane: NASNet's largest depthwise convolutions (7x7 and 5x5, stride 2, on a 165x165 plane)
//! and GoogLeNet's and NASNet's poolings (3x3 max, stride 2 and 1; a 7x7 plane's rows run
//! stitched into one; 2x2 stride 2 on a 14x14 plane, row by row); and the direct
//! convolution over padded planes (`opsched_gpu::cpu::direct`, on rayon's pool) with
//! GoogLeNet's 3x3 convolutions on 14x14 and 7x7, Inception-v3's 3x1 on 8x8, AlexNet's on
//! 13x13 and ResNet-18's four stages (56x56 to 7x7, im2col's there from 28x28); the bias +
//! activation epilogue (`cpu_activations`); and eight small depthwise planes by the window
//! loops and interleaved (`cpu_small_depthwise`, `opsched_gpu::cpu::lanes`); whole depthwise
//! layers read straight from their input against padded first (`cpu_depthwise_layers`,
//! `opsched_gpu::cpu::depthwise`; MobileNetV2's, EfficientNet's and ConvNeXt's); whole pooling layers the same two ways
//! (`cpu_pooling_layers`); and linear layers over a few tokens by the panel product
//! (`cpu_panel_products`).
//!
//! Run: `cargo bench -p opsched-benches --bench cpu_windows`. What it is for: comparing two
//! builds of these loops (their vectorisation, the padding pass) on the same machine.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use opsched::gpu::cpu::direct::{self, Direct};
use opsched::gpu::cpu::math::{apply_bias_act, bias_act_row};
use opsched::gpu::cpu::window::{pad_input, Windows};
use opsched::gpu::cpu::{depthwise, lanes};
use opsched::graph::Activation;

fn windows(side: usize, k: usize, s: usize) -> Windows {
    let p = k / 2;
    square(side, k, s, p, (side + 2 * p - k) / s + 1)
}

/// Square windows `k x k` at stride `s` over a `side x side` plane, `p` rows and columns of
/// padding before, `out` windows a side (the padding after, if any, as they reach).
fn square(side: usize, k: usize, s: usize, p: usize, out: usize) -> Windows {
    Windows {
        input: [side, side],
        kernel: [k, k],
        stride: [s, s],
        padding: [p, p],
        dilation: [1, 1],
        out: [out, out],
    }
}

fn plane(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

fn kernels(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu_windows");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    for (side, k, s) in [
        (165, 7, 2),
        (165, 5, 2),
        (83, 5, 1),
        (14, 5, 2),
        (7, 5, 1),
        (56, 3, 1),
        (14, 3, 1),
        (28, 5, 1),
        (56, 7, 1),
    ] {
        let win = windows(side, k, s);
        let (x, w) = (plane(side * side), plane(k * k));
        let mut buf = vec![0.0; win.scratch_len()];
        let mut y = vec![0.0; win.out[0] * win.out[1]];
        group.bench_function(format!("pad {k}x{k}/{s} {side}x{side}"), |b| {
            b.iter(|| pad_input(&win, &x, Some(0.5), Activation::Relu, &mut buf))
        });
        group.bench_function(format!("depthwise {k}x{k}/{s} {side}x{side}"), |b| {
            let taps = win.taps();
            b.iter(|| win.convolve(&taps, &buf, &w, Some(&[0.1]), Activation::None, &mut y))
        });
    }
    for (side, k, s) in [(112, 3, 2), (42, 3, 1), (7, 3, 1), (14, 2, 2)] {
        let win = windows(side, k, s);
        let x = plane(side * side);
        let mut buf = vec![0.0; win.scratch_len()];
        let mut y = vec![0.0; win.out[0] * win.out[1]];
        let taps = win.taps();
        group.bench_function(format!("max pool {k}x{k}/{s} {side}x{side}"), |b| {
            b.iter(|| {
                win.pad(&x, |v| v, f32::NEG_INFINITY, &mut buf);
                win.pool(&taps, &buf, true, |_, _| 1.0, &mut y);
            })
        });
    }
    // (input channels, side, output channels, kernel rows, kernel columns), stride 1; the
    // last two pointwise into many channels on 7x7 (MobileNetV2's last, ResNeXt-50's).
    for (c, side, oc, kh, kw) in [
        (160, 14, 320, 3, 3),
        (192, 7, 384, 3, 3),
        (384, 8, 384, 3, 1),
        (384, 13, 256, 3, 3),
        (64, 56, 64, 3, 3),
        (128, 28, 128, 3, 3),
        (256, 14, 256, 3, 3),
        (512, 7, 512, 3, 3),
        (320, 7, 1280, 1, 1),
        (1024, 7, 2048, 1, 1),
    ] {
        let win = Windows {
            input: [side, side],
            kernel: [kh, kw],
            stride: [1, 1],
            padding: [kh / 2, kw / 2],
            dilation: [1, 1],
            out: [side, side],
        };
        let len = win.scratch_len();
        let mut planes = vec![0.0; c * len];
        let x = plane(side * side);
        for buf in planes.chunks_mut(len).take(c) {
            pad_input(&win, &x, None, Activation::None, buf);
        }
        let conv = Direct {
            plane: len,
            channels: c,
            taps: win.taps(),
            out: win.out,
        };
        let k = c * kh * kw;
        let panels = direct::pack(&plane(oc * k), oc, k, k);
        let bias = plane(oc);
        let mut y = vec![0.0; oc * side * side];
        group.bench_function(format!("direct {c}->{oc} {kh}x{kw} {side}x{side}"), |b| {
            b.iter(|| conv.convolve(&planes, &panels, Some(&bias), Activation::Relu, &mut y))
        });
    }
    group.finish();
}

/// The bias + activation epilogue every convolution and product ends with, over one row of
/// 3136 values (a 56x56 plane, a column tile of 112x112): the activations models use in
/// their hot loops.
fn activations(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu_activations");
    group
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300));
    let x = plane(3136);
    let mut row = x.clone();
    for a in [
        Activation::Relu,
        Activation::Clip {
            min: Some(0.0),
            max: Some(6.0),
        },
        Activation::HardSwish,
        Activation::Sigmoid,
        Activation::Swish { alpha: 1.0 },
        Activation::Tanh,
        Activation::Gelu,
        Activation::GeluTanh,
    ] {
        group.bench_function(format!("bias + {a:?} 3136"), |b| {
            b.iter(|| {
                row.copy_from_slice(&x);
                bias_act_row(&mut row, Some(0.25), a)
            })
        });
    }
    group.finish();
}

/// Eight small depthwise planes: by the window loops plane after plane, and interleaved eight
/// channels at a time (`opsched_gpu::cpu::lanes`), where `lanes::suits` chooses between them.
fn small_depthwise(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu_small_depthwise");
    group
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300));
    for (side, k, s) in [
        (14, 5, 2),
        (14, 3, 2),
        (28, 3, 2),
        (14, 5, 1),
        (14, 3, 1),
        (7, 3, 1),
        (7, 5, 1),
    ] {
        let win = windows(side, k, s);
        let planes: Vec<Vec<f32>> = (0..8).map(|_| plane(side * side)).collect();
        let filters: Vec<Vec<f32>> = (0..8).map(|_| plane(k * k)).collect();
        let out = win.out[0] * win.out[1];
        let mut y = vec![0.0; 8 * out];
        let mut buf = vec![0.0; win.scratch_len()];
        let taps = win.taps();
        group.bench_function(format!("windows {k}x{k}/{s} {side}x{side} x8"), |b| {
            b.iter(|| {
                for ((x, w), yp) in planes.iter().zip(&filters).zip(y.chunks_mut(out)) {
                    pad_input(&win, x, None, Activation::None, &mut buf);
                    win.convolve(&taps, &buf, w, Some(&[0.1]), Activation::Relu, yp);
                }
            })
        });
        let mut scratch = vec![0.0; lanes::scratch_len(&win)];
        let xs: Vec<&[f32]> = planes.iter().map(|p| &p[..]).collect();
        let fs: Vec<&[f32]> = filters.iter().map(|p| &p[..]).collect();
        group.bench_function(format!("lanes {k}x{k}/{s} {side}x{side} x8"), |b| {
            b.iter(|| {
                lanes::depthwise(
                    &win,
                    &xs,
                    &fs,
                    &[0.1; 8],
                    &[0.0; 8],
                    Activation::None,
                    Activation::Relu,
                    &mut scratch,
                    &mut y,
                )
            })
        });
    }
    group.finish();
}

/// Whole depthwise layers of MobileNetV2 and EfficientNet-B0 on one thread (ReLU6
/// after): straight from the input (`cpu::depthwise::unpadded`, a layer's planes in one call),
/// against planes padded first, a group at a time, then summed in blocks (`depthwise::sums`,
/// stride one) or by the window loops (stride two), bias and activation in a pass after.
fn depthwise_layers(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu_depthwise_layers");
    group
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300));
    let relu6 = Activation::Clip {
        min: Some(0.0),
        max: Some(6.0),
    };
    // (channels, input side, window, stride)
    for (ch, side, k, s) in [
        (144, 56, 3, 1),
        (192, 28, 3, 1),
        (384, 14, 3, 1),
        (960, 7, 3, 1),
        (240, 28, 5, 1),
        (672, 14, 5, 1),
        (1152, 7, 5, 1),
        (96, 112, 3, 2),
        (144, 56, 3, 2),
        (576, 14, 3, 2),
        (672, 14, 5, 2),
        (240, 28, 5, 2),
        (144, 56, 5, 2),
        (96, 56, 7, 1),
        (192, 28, 7, 1),
        (384, 14, 7, 1),
        (768, 7, 7, 1),
    ] {
        let win = windows(side, k, s);
        let (hw, len) = (side * side, win.out[0] * win.out[1]);
        let (x, w, bias) = (plane(ch * hw), plane(ch * k * k), plane(ch));
        let mut y = vec![0.0; ch * len];
        let name = format!("{ch} x {k}x{k}/{s} {side}x{side}");
        group.bench_function(format!("unpadded {name}"), |b| {
            b.iter(|| depthwise::unpadded(&win, &x, &w, Some(&bias), relu6, &mut y))
        });
        // As `Conv::depthwise` ran them before: planes in groups of about 16K elements of
        // work, each group's planes padded side by side, summed, then bias and activation.
        let pl = win.scratch_len();
        let n = (1usize << 14).div_ceil(pl + len * k * k).min(ch);
        let mut bufs = vec![0.0; n * pl];
        let taps = win.taps();
        group.bench_function(format!("padded {name}"), |b| {
            b.iter(|| {
                let groups = x.chunks(n * hw).zip(y.chunks_mut(n * len));
                for (g, (xs, ys)) in groups.enumerate() {
                    let m = ys.len() / len;
                    for (xp, buf) in xs.chunks(hw).zip(bufs.chunks_mut(pl)) {
                        pad_input(&win, xp, None, Activation::None, buf);
                    }
                    let ws = &w[g * n * k * k..(g * n + m) * k * k];
                    if !depthwise::sums(&win, &bufs[..m * pl], pl, ws, ys) {
                        let planes = ys.chunks_mut(len).zip(bufs.chunks(pl));
                        for (p, (yp, buf)) in planes.enumerate() {
                            let wp = &ws[p * k * k..(p + 1) * k * k];
                            win.convolve(&taps, buf, wp, None, Activation::None, yp);
                        }
                    }
                    let bs = &bias[g * n..g * n + m];
                    apply_bias_act(ys, Some(bs), m, len, relu6);
                }
            })
        });
    }
    group.finish();
}

/// Whole pooling layers on one thread: GoogLeNet's max poolings (3x3 at stride two, the last
/// window reaching past the plane; 3x3 at stride one; 2x2 at stride two), ResNet-18's, an
/// average 2x2 of DenseNet-121 and a 3x3 one of Inception-v3: straight from the input
/// (`cpu::depthwise::pooled`, a layer's planes in one call) against each plane padded, then
/// pooled by the window loops (`Windows::pool`), as `Pool` ran them before.
fn pooling_layers(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu_pooling_layers");
    group
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300));
    // (channels, input side, window, stride, padding, output side, max)
    for (ch, side, k, s, p, out, max) in [
        (64, 112, 3, 2, 0, 56, true),
        (192, 56, 3, 2, 0, 28, true),
        (192, 28, 3, 1, 1, 28, true),
        (480, 28, 3, 2, 0, 14, true),
        (480, 14, 3, 1, 1, 14, true),
        (832, 14, 2, 2, 0, 7, true),
        (832, 7, 3, 1, 1, 7, true),
        (64, 112, 3, 2, 1, 56, true),
        (128, 56, 2, 2, 0, 28, false),
        (192, 35, 3, 1, 1, 35, false),
    ] {
        let win = square(side, k, s, p, out);
        let (hw, len) = (side * side, out * out);
        let x = plane(ch * hw);
        let mut y = vec![0.0; ch * len];
        let kind = if max { "max" } else { "sum" };
        let name = format!("{kind} {ch} x {k}x{k}/{s} {side}x{side} padded {p}");
        group.bench_function(format!("direct {name}"), |b| {
            b.iter(|| depthwise::pooled(&win, &x, max, &mut y))
        });
        let mut buf = vec![0.0; win.scratch_len()];
        let taps = win.taps();
        let fill = if max { f32::NEG_INFINITY } else { 0.0 };
        group.bench_function(format!("windows {name}"), |b| {
            b.iter(|| {
                for (xp, yp) in x.chunks(hw).zip(y.chunks_mut(len)) {
                    win.pad(xp, |v| v, fill, &mut buf);
                    win.pool(&taps, &buf, max, |_, _| 1.0, yp);
                }
            })
        });
    }
    group.finish();
}

/// Linear layers over 16 tokens as the panel product runs them (`direct::product_columns`,
/// the weights packed once): LLaMA's (the survey's two-layer one: 256 -> 512 and back) and
/// BERT-base's (768 -> 768, 768 -> 3072 and back). Each iteration runs the next of enough
/// copies of the weights to fill 16 MiB, so that they come from the last-level cache as in a
/// model, not from L1 or L2 as one layer run again and again would.
fn panel_products(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu_panel_products");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    let tokens = 16;
    let pool = rayon::ThreadPoolBuilder::new()
        .build()
        .expect("a thread pool");
    for (k, m) in [(256, 512), (512, 256), (768, 768), (768, 3072), (3072, 768)] {
        let copies = ((16 << 20) / (4 * m * k)).max(1);
        let weights: Vec<Vec<f32>> = (0..copies)
            .map(|i| direct::pack(&plane(m * k + i)[i..], m, k, k))
            .collect();
        let x = plane(tokens * k);
        let mut y = vec![0.0; tokens * m];
        let mut next = 0;
        group.bench_function(format!("{tokens} tokens {k}->{m}"), |b| {
            // Inside the pool, as a model's steps run: called from outside, each product
            // would wait for the pool's threads to wake (tens of microseconds).
            pool.install(|| {
                b.iter(|| {
                    next = (next + 1) % copies;
                    let w = &weights[next];
                    direct::product_columns(w, [m, k, tokens], &x, [1, k], &mut y, m, 1.0)
                })
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    kernels,
    panel_products,
    activations,
    small_depthwise,
    depthwise_layers,
    pooling_layers
);
criterion_main!(benches);
