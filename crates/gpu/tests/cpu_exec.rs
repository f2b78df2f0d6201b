//! Tests of the device layer without a GPU: hand-computed reference kernels, the lowering of
//! every operator kind executed on [`CpuDevice`] against the reference executor, multi-GPU
//! placements with transfers, buffer planning, the CPU device's stream/event/capture semantics
//! and its race detector, and error paths. The CUDA test at the end is `#[ignore]`d (run it
//! with `cargo xtask gpu-test`): it executes the same programs through the same helper.
#![allow(clippy::unwrap_used)]

use opsched_gpu::program::{BufRole, GraphProgram, Init, Layout, TransferSpec};
use opsched_gpu::reference::{self, scaled_error};
use opsched_gpu::step::copy::Copy;
use opsched_gpu::{
    ConvApi, ConvGemm, CpuDevice, Device, GemmKernel, GpuError, KernelOptions, Step, TransferMode,
};
use opsched_graph::fusion::Fusions;
use opsched_graph::zoo::{self, ZooConfig};
use opsched_graph::{
    Activation, Conv2d, DType, ElementwiseKind, Graph, GraphBuilder, NodeId, Op, Pool2d,
    ReduceKind, Value,
};

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() < 1e-5
}

#[test]
fn conv_by_hand() {
    // 1x1x3x3 input 1..9, one 2x2 filter of ones, stride 1, no padding: window sums.
    let x: Vec<f32> = (1..=9).map(|v| v as f32).collect();
    let y = reference::conv2d(
        &x,
        &[1.0; 4],
        Some(&[0.5]),
        [1, 1, 3, 3],
        1,
        [2, 2],
        [1, 1],
        [0, 0],
        [1, 1],
        1,
        [2, 2],
        Activation::None,
    );
    assert_eq!(y, vec![12.5, 16.5, 24.5, 28.5]);
    // Padding 1, stride 2, relu of a negative filter: all zero.
    let y = reference::conv2d(
        &x,
        &[-1.0; 4],
        None,
        [1, 1, 3, 3],
        1,
        [2, 2],
        [2, 2],
        [1, 1],
        [1, 1],
        1,
        [2, 2],
        Activation::Relu,
    );
    assert_eq!(y, vec![0.0; 4]);
    // Depthwise (groups = channels): each channel scaled by its own 1x1 weight.
    let x = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
    let y = reference::conv2d(
        &x,
        &[2.0, -1.0],
        None,
        [1, 2, 2, 2],
        2,
        [1, 1],
        [1, 1],
        [0, 0],
        [1, 1],
        2,
        [2, 2],
        Activation::None,
    );
    assert_eq!(y, vec![2.0, 4.0, 6.0, 8.0, -5.0, -6.0, -7.0, -8.0]);
}

#[test]
fn pooling_by_hand() {
    // 4x4 of 0..16, max 3x3 stride 2, ceil mode: 2x2 output, last window clipped.
    let x: Vec<f32> = (0..16).map(|v| v as f32).collect();
    let y = reference::pool2d(&x, [1, 1, 4, 4], [2, 2], true, [3, 3], [2, 2], [0, 0]);
    assert_eq!(y, vec![10.0, 11.0, 14.0, 15.0]);
    // Average 3x3 stride 1 pad 1 on 2x2 [1,2,3,4]: PyTorch counts the padding (divide by 9).
    let y = reference::pool2d(
        &[1.0, 2.0, 3.0, 4.0],
        [1, 1, 2, 2],
        [2, 2],
        false,
        [3, 3],
        [1, 1],
        [1, 1],
    );
    assert!(y.iter().all(|v| close(*v, 10.0 / 9.0)), "{y:?}");
    // Global average: kernel = whole image.
    let y = reference::pool2d(
        &[1.0, 2.0, 3.0, 6.0],
        [1, 1, 2, 2],
        [1, 1],
        false,
        [2, 2],
        [1, 1],
        [0, 0],
    );
    assert_eq!(y, vec![3.0]);
}

#[test]
fn small_kernels_by_hand() {
    let s = reference::softmax(&[0.0, 1.0, 0.0, 1.0], 1, 2, 2);
    assert!(s.iter().all(|v| close(*v, 0.5)));
    let s = reference::softmax(&[1.0, 2.0, 3.0], 1, 3, 1);
    let e: Vec<f32> = [1.0f32, 2.0, 3.0].iter().map(|v| v.exp()).collect();
    let t: f32 = e.iter().sum();
    assert!(s.iter().zip(&e).all(|(a, b)| close(*a, b / t)));
    let l = reference::layer_norm(&[1.0, 3.0], &[2.0, 2.0], &[1.0, 1.0], 1, 2, 0.0);
    assert!(close(l[0], -1.0) && close(l[1], 3.0), "{l:?}");
    assert!(close(reference::act(1.0, Activation::Gelu), 0.841_344_7));
    assert!(close(reference::erf(0.5), 0.520_499_9));
    assert!(close(reference::act(0.0, Activation::Sigmoid), 0.5));
    assert_eq!(reference::act(-2.0, Activation::Relu), 0.0);
    let t = reference::transpose(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &[1, 0]);
    assert_eq!(t, vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
}

#[test]
fn gemm_column_major_trick() {
    // Row-major X [2,3], W [4,3]; Y = X W^T [2,4] computed as col-major gemm(T, N, 4, 2, 3).
    let x: Vec<f32> = (0..6).map(|v| v as f32).collect();
    let w: Vec<f32> = (0..12).map(|v| v as f32 * 0.5).collect();
    let mut y = vec![0.0; 8];
    reference::gemm(&w, &x, &mut y, true, false, 4, 2, 3, 3, 3, 4, [0, 0, 0], 1);
    for r in 0..2 {
        for o in 0..4 {
            let want: f32 = (0..3).map(|k| x[r * 3 + k] * w[o * 3 + k]).sum();
            assert!(close(y[r * 4 + o], want));
        }
    }
}

/// Every operator kind, slices, summed terms, concats on several axes, a sequential chain.
fn every_op_graph() -> Graph {
    let mut b = GraphBuilder::new("every-op", DType::F32);
    let x = b.input("x", vec![2, 6, 9, 9]);
    let y = b.input("y", vec![2, 6, 9, 9]);
    let c1 = b.conv("c1", x, Conv2d::new(8, 3).bias(true).relu());
    let c2 = b.conv("c2", x, Conv2d::new(8, 3).stride(2).act(Activation::Tanh));
    let c3 = b.conv(
        "c3",
        y,
        Conv2d::rect(6, 1, 3).groups(3).dilation(1).bias(true),
    );
    // A conv reading a summed term and a channel slice (IOS's input model).
    let c4 = b.node(
        "c4",
        Op::Conv2d(Conv2d::new(4, 1).bias(true).act(Activation::Sigmoid)),
        vec![
            vec![Value::whole(x), Value::whole(c3)],
            vec![Value::slice(c1, 2, 6)],
        ],
    );
    let p1 = b.pool("p1", c1, Pool2d::max(3, 2, 0).ceil());
    let p2 = b.pool("p2", c4, Pool2d::avg(3, 1, 1));
    let g1 = b.pool("g1", c2, Pool2d::global_avg());
    let a1 = b.act("a1", p2, Activation::Gelu);
    let cat = b.concat("cat", &[c1, c4, a1]);
    let cat0 = b.op("cat0", Op::Concat { axis: 0 }, &[c4, a1]);
    let cat3 = b.op("cat3", Op::Concat { axis: 3 }, &[c4, a1]);
    let ident = b.node(
        "sum",
        Op::Identity,
        vec![vec![Value::slice(cat, 0, 8), Value::whole(c1)]],
    );
    let add = b.node(
        "add",
        Op::Elementwise {
            kind: ElementwiseKind::Add,
        },
        vec![
            vec![Value::whole(c4)],
            vec![Value::whole(a1), Value::slice(c1, 0, 4)],
            vec![Value::slice(cat, 12, 16)],
        ],
    );
    let mul = b.mul("mul", &[add, a1]);
    // An activation of a summed term: one add kernel with the activation.
    let sum_act = b.node(
        "sum_act",
        Op::Activation {
            act: Activation::HardSigmoid {
                alpha: 0.2,
                beta: 0.5,
            },
        },
        vec![vec![Value::whole(c4), Value::whole(a1), Value::whole(c4)]],
    );
    // Residual sums the convolutions compute: with a bias alone, then with the relu after it.
    let rc = b.conv("rc", c1, Conv2d::new(8, 3).bias(true));
    let radd = b.add("radd", &[rc, c1]);
    let rc2 = b.conv("rc2", radd, Conv2d::new(8, 1));
    let radd2 = b.add("radd2", &[radd, rc2]);
    let rrelu = b.act("rrelu", radd2, Activation::Relu);
    let conv_sum = b.node(
        "conv_sum",
        Op::Conv2d(Conv2d::new(3, 1)),
        vec![vec![Value::whole(c4), Value::whole(a1)]],
    );
    // Fused into mul's kernel (its only reader), with the activation's parameter.
    let leaky = b.act("leaky", mul, Activation::LeakyRelu { alpha: 0.2 });
    let seq = b.sequential(
        "sep",
        ident,
        vec![
            Op::Activation {
                act: Activation::Relu,
            },
            Op::Conv2d(Conv2d::new(8, 3).groups(8)),
            Op::Conv2d(Conv2d::new(5, 1).bias(true)),
        ],
    );
    let flat = b.op("flat", Op::Reshape { shape: vec![2, -1] }, &[g1]);
    let fc = b.op(
        "fc",
        Op::Linear {
            out_features: 7,
            bias: true,
            act: Activation::Gelu,
        },
        &[flat],
    );
    let sm = b.op("sm", Op::Softmax { axis: -1 }, &[fc]);
    let sm1 = b.op("sm1", Op::Softmax { axis: 1 }, &[leaky]);
    let tr = b.op(
        "tr",
        Op::Transpose {
            perm: vec![0, 2, 3, 1],
        },
        &[seq],
    );
    let _ = (p1, sm, sm1, tr, cat0, cat3, sum_act, conv_sum, rrelu);
    b.finish().unwrap()
}

/// The semantics ONNX models need beyond the zoo's: broadcasting, binary ops, pads, affine,
/// log-softmax, asymmetric and count_include_pad = false pooling, parameterised activations
/// (SiLU in a convolution's kernel, a swish with alpha alone).
fn onnx_semantics_graph() -> Graph {
    let mut b = GraphBuilder::new("onnx-semantics", DType::F32);
    let x = b.input("x", vec![2, 6, 9, 9]);
    let c4 = b.conv("c4", x, Conv2d::new(5, 3).padding(1, 1));
    let gate = b.pool("gate", c4, Pool2d::global_avg());
    let scaled = b.op(
        "scaled",
        Op::Elementwise {
            kind: ElementwiseKind::Mul,
        },
        &[c4, gate],
    );
    let diff = b.op(
        "diff",
        Op::Binary {
            kind: opsched_graph::BinaryKind::Sub,
        },
        &[scaled, gate],
    );
    let padded = b.op(
        "padded",
        Op::Pad {
            begin: vec![0, 1, 2, 0],
            end: vec![1, 0, 1, 3],
            value: -0.5,
        },
        &[diff],
    );
    let aff = b.op("aff", Op::Affine, &[padded]);
    // A batch normalization left an affine (DenseNet's), its activation fused into it.
    let norm = b.op("norm", Op::Affine, &[diff]);
    b.act("norm_relu", norm, Activation::Relu);
    let mut asym = Pool2d::avg(3, 2, 1);
    asym.padding_end = Some([0, 2]);
    asym.count_include_pad = false;
    let ap = b.pool("asym_pool", aff, asym);
    let hs = b.act(
        "hsig",
        ap,
        Activation::HardSigmoid {
            alpha: 0.2,
            beta: 0.5,
        },
    );
    let ls = b.op("logsm", Op::LogSoftmax { axis: 1 }, &[hs]);
    // TensorFlow's "SAME" padding at stride 2: one more row and column after than before.
    let mut same = Conv2d::new(3, 3).stride(2).bias(true).relu();
    same.padding = [0, 0];
    same.padding_end = Some([1, 1]);
    b.conv("same_pad", ls, same);
    let silu = Conv2d::new(4, 1)
        .bias(true)
        .act(Activation::Swish { alpha: 1.0 });
    let silu = b.conv("silu_conv", ls, silu);
    b.act("swish", silu, Activation::Swish { alpha: 1.702 });
    b.act("scaled_swish", scaled, Activation::Swish { alpha: -0.5 });
    b.finish().unwrap()
}

/// Linear, batch matmul (plain, and transposed and scaled as attention's scores), softmax,
/// layer norm, reshape and transpose.
fn attention_graph() -> Graph {
    attention_graph_of(2)
}

/// [`attention_graph`] for `batch` sequences.
fn attention_graph_of(batch: usize) -> Graph {
    let mut b = GraphBuilder::new("attn", DType::F32);
    let x = b.input("x", vec![batch, 5, 12]);
    let bt = batch as i64;
    let ln = b.op("ln", Op::LayerNorm { eps: 1e-5 }, &[x]);
    let q = b.op(
        "q",
        Op::Linear {
            out_features: 12,
            bias: true,
            act: Activation::None,
        },
        &[ln],
    );
    let k = b.op(
        "k",
        Op::Linear {
            out_features: 12,
            bias: false,
            act: Activation::None,
        },
        &[ln],
    );
    let v = b.linear("v", ln, 12, Activation::Relu);
    let split = |b: &mut GraphBuilder, name: &str, t: NodeId| {
        let r = b.op(
            &format!("{name}.r"),
            Op::Reshape {
                shape: vec![bt, 5, 3, 4],
            },
            &[t],
        );
        b.op(
            &format!("{name}.t"),
            Op::Transpose {
                perm: vec![0, 2, 1, 3],
            },
            &[r],
        )
    };
    let (qh, kh, vh) = (
        split(&mut b, "q", q),
        split(&mut b, "k", k),
        split(&mut b, "v", v),
    );
    let scores = Op::BatchMatmul {
        transpose_b: true,
        alpha: 0.5,
    };
    let s = b.op("scores", scores, &[qh, kh]);
    let p = b.op("probs", Op::Softmax { axis: -1 }, &[s]);
    let o = b.op("ctx", Op::batch_matmul(false), &[p, vh]);
    let ot = b.op(
        "ctx.t",
        Op::Transpose {
            perm: vec![0, 2, 1, 3],
        },
        &[o],
    );
    let or = b.op(
        "ctx.r",
        Op::Reshape {
            shape: vec![bt, 5, 12],
        },
        &[ot],
    );
    let res = b.add("res", &[or, x]);
    let ln2 = b.op("ln2", Op::LayerNorm { eps: 1e-5 }, &[res]);
    // A feed-forward block: an exact GELU keeps its kernel after the product; the second
    // layer computes the residual sum and its relu in its epilogue.
    let f1 = b.linear("f1", ln2, 16, Activation::Gelu);
    let f2 = b.linear("f2", f1, 12, Activation::None);
    let res2 = b.add("res2", &[f2, ln2]);
    let _ = b.act("res2.relu", res2, Activation::Relu);
    b.finish().unwrap()
}

/// Execute every operator of `p` on `dev` in topological order on one stream (all logical GPUs
/// on unit 0, transfers through copy streams), and read every operator's output back.
fn execute<D: Device>(
    dev: &D,
    g: &Graph,
    p: &GraphProgram,
    opts: &KernelOptions,
) -> Result<Vec<Option<Vec<f32>>>, GpuError> {
    let map = vec![0; p.gpus.max(1)];
    let mut mem = dev.alloc(p, &map)?;
    let mut ops = Vec::with_capacity(p.ops.len());
    for op in &p.ops {
        ops.push(match op {
            Some(op) => Some(dev.prepare(p, &mem, op, opts)?),
            None => None,
        });
    }
    let mut s = dev.stream(0)?;
    let refs: Vec<&D::Op> = ops.iter().flatten().collect();
    dev.fit_stream(&mut s, &refs)?;
    let copy = (0..map.len())
        .map(|_| dev.stream(0))
        .collect::<Result<Vec<_>, _>>()?;
    if !p.transfers.is_empty() {
        dev.connect(&mut mem, &copy, TransferMode::Copy)?;
    }
    let ready = dev.event(0, false)?;
    let arrived = dev.event(0, false)?;
    for &id in g.topo_order() {
        if let Some(Some(op)) = ops.get(id.index()) {
            dev.launch(op, &s)?;
        }
        // Transfers out of `id` (the program lists them by producer's output buffer).
        let Some(Some(op)) = p.ops.get(id.index()) else {
            continue;
        };
        for &(src, dst) in p.transfers.iter().filter(|t| t.0 == op.output) {
            let (a, b) = (p.buffers[src].gpu, p.buffers[dst].gpu);
            dev.record(&s, &ready)?;
            dev.wait(&copy[a], &ready)?;
            dev.wait(&copy[b], &ready)?;
            dev.transfer(&mem, src, dst, (a, b), &copy)?;
            dev.record(&copy[b], &arrived)?;
            dev.wait(&s, &arrived)?;
        }
    }
    dev.synchronize()?;
    // What holds each operator's value (not a sum's whose kernel wrote its activation's).
    let mut out = vec![None; g.len()];
    for id in g.ops() {
        if let Some(&Some(b)) = p.outputs.get(id.index()) {
            out[id.index()] = Some(dev.read(&mem, b)?);
        }
    }
    // Transfer replicas hold their producer's output.
    for &(src, dst) in &p.transfers {
        assert_eq!(dev.read(&mem, src)?, dev.read(&mem, dst)?, "replica {dst}");
    }
    Ok(out)
}

/// Compare every operator's output of `p` executed on `dev` with the reference executor.
fn check_program<D: Device>(dev: &D, g: &Graph, p: &GraphProgram, opts: &KernelOptions, tol: f64) {
    let want = reference::reference(g).unwrap();
    let got = execute(dev, g, p, opts).unwrap();
    for id in g.ops() {
        let (Some(w), Some(got)) = (&want[id.index()], &got[id.index()]) else {
            continue;
        };
        // A value stored channels last, in the reference's order.
        let got = match g.node(id).shape.as_slice() {
            &[n, c, h, w] if p.channels_last[id.index()] => {
                opsched_gpu::program::nhwc_to_nchw(&got[..n * c * h * w], [n, c, h, w])
            }
            _ => got.clone(),
        };
        let err = scaled_error(&got[..w.len()], w);
        assert!(
            err <= tol,
            "{} on {}: node '{}' differs by {err:e}",
            g.name,
            dev.report().backend,
            g.node(id).name
        );
    }
}

fn cpu() -> CpuDevice {
    CpuDevice::new()
}

/// Layer norms over rows the CUDA kernel holds in registers in one warp, in several warps
/// (a BERT row), and longer than its largest block holds (read twice).
fn layer_norm_graph() -> Graph {
    let mut b = GraphBuilder::new("layer_norms", DType::F32);
    for (i, shape) in [vec![3, 7], vec![2, 3, 768], vec![2, 5000]]
        .into_iter()
        .enumerate()
    {
        let x = b.input(&format!("x{i}"), shape);
        b.op(&format!("ln{i}"), Op::LayerNorm { eps: 1e-5 }, &[x]);
    }
    b.finish().unwrap()
}

/// Convolutions that leave their bias to every kind of reader that adds one
/// (`opsched_graph::fusion::deferred_bias`) at batch 2: a separable convolution read by the
/// next one's depthwise kernel (after its input relu), by a plain depthwise convolution, sums
/// in a concatenation's terms (each writing its strided slice), in an activation's input and
/// in a separable convolution's (whose depthwise kernel reads the sum's values), and an
/// element-wise add with its relu fused.
fn deferred_bias_graph() -> Graph {
    let sep = |c: usize| {
        vec![
            Op::Activation {
                act: Activation::Relu,
            },
            Op::Conv2d(Conv2d::new(c, 3).groups(c).bias(true)),
            Op::Conv2d(Conv2d::new(c, 1).bias(true)),
        ]
    };
    let mut b = GraphBuilder::new("deferred-bias", DType::F32);
    let x = b.input("x", vec![2, 6, 7, 7]);
    let s1 = b.sequential("s1", x, sep(6));
    let s2 = b.sequential("s2", s1, sep(6));
    let s3 = b.sequential("s3", x, sep(6));
    let sum = |a: NodeId, c: NodeId| vec![Value::whole(a), Value::whole(c)];
    let cell = b.node(
        "cell",
        Op::Identity,
        vec![sum(s2, s3), vec![Value::whole(x)], sum(s3, x)],
    );
    let c1 = b.conv("c1", cell, Conv2d::new(6, 1).bias(true));
    let c2 = b.conv("c2", cell, Conv2d::new(6, 3).stride(2).bias(true));
    let c3 = b.conv("c3", cell, Conv2d::new(6, 3).stride(2).bias(true));
    let add = b.add("add", &[c2, c3]);
    b.act("add_relu", add, Activation::Relu);
    let dw = b.conv("dw", c1, Conv2d::new(6, 5).groups(6).bias(true).relu());
    let c4 = b.conv("c4", dw, Conv2d::new(6, 1).bias(true));
    let c5 = b.conv("c5", dw, Conv2d::new(6, 1).bias(true));
    b.node(
        "sig",
        Op::Activation {
            act: Activation::Sigmoid,
        },
        vec![sum(c4, c5)],
    );
    let g = b.finish().unwrap();
    for n in [s1, s2, s3, c1, c2, c3, c4, c5] {
        assert!(
            opsched_graph::fusion::deferred_bias(&g, n).is_some(),
            "{}",
            g.node(n).name
        );
    }
    g
}

/// Values activated in place by their producers for their readers
/// (`opsched_graph::fusion::producer_activation`) at batch 2: NASNet's cell output (a
/// concatenation whose first term a convolution writes in place, strided, after a pool read
/// it, activated after its sum's add kernel activated its own slice), read by two relu + 1x1
/// convolutions and a relu + separable convolution; a convolution's value read by two relu +
/// 1x1 convolutions; one that a pool reads too, which keeps its readers' relus; NASNet's
/// reduction cell output (sums only, their add kernels activate every slice); and a cell
/// output with one reader, activated by its sums and in its first slice all the same.
fn producer_activation_graph() -> Graph {
    let relu = || Op::Activation {
        act: Activation::Relu,
    };
    let relu_conv = |stride: usize| vec![relu(), Op::Conv2d(Conv2d::new(6, 1).stride(stride))];
    let mut b = GraphBuilder::new("producer-activation", DType::F32);
    let x = b.input("x", vec![2, 6, 7, 7]);
    let a = b.conv("a", x, Conv2d::new(6, 3).bias(true));
    let p = b.pool("p", a, Pool2d::max(3, 1, 1));
    let c = b.conv("c", x, Conv2d::new(6, 1).bias(true));
    let cell = b.node(
        "cell",
        Op::Identity,
        vec![
            vec![Value::whole(a)],
            vec![Value::whole(p), Value::whole(c)],
        ],
    );
    b.sequential("r1", cell, relu_conv(1));
    b.sequential("r2", cell, relu_conv(2));
    let sep = vec![
        relu(),
        Op::Conv2d(Conv2d::new(12, 3).groups(12).bias(true)),
        Op::Conv2d(Conv2d::new(6, 1)),
    ];
    b.sequential("r3", cell, sep);
    let d = b.conv("d", x, Conv2d::new(6, 3).bias(true));
    b.sequential("d1", d, relu_conv(1));
    b.sequential("d2", d, relu_conv(1));
    let e = b.conv("e", x, Conv2d::new(6, 3).bias(true));
    b.sequential("e1", e, relu_conv(1));
    b.sequential("e2", e, relu_conv(2));
    b.pool("e3", e, Pool2d::max(3, 1, 1));
    // NASNet's reduction cell: sums only, each activated by its add kernel as it writes.
    let f: Vec<NodeId> = (0..3)
        .map(|i| b.conv(&format!("f{i}"), x, Conv2d::new(6, 3).bias(true)))
        .collect();
    let fp = b.pool("fp", x, Pool2d::avg(3, 1, 1));
    let sum = |p: NodeId, q: NodeId| vec![Value::whole(p), Value::whole(q)];
    let red = b.node("red", Op::Identity, vec![sum(f[0], f[1]), sum(fp, f[2])]);
    b.sequential("red1", red, relu_conv(1));
    b.sequential("red2", red, relu_conv(2));
    // NASNet's last cell before a reduction: one reader, and still its sums activate their
    // slices as they write, the first term after them (with its bias).
    let a2 = b.conv("a2", x, Conv2d::new(6, 3).bias(true));
    let p2 = b.pool("p2", a2, Pool2d::avg(3, 1, 1));
    let c2 = b.conv("c2", x, Conv2d::new(6, 1).bias(true));
    let lone = b.node(
        "lone",
        Op::Identity,
        vec![
            vec![Value::whole(a2)],
            vec![Value::whole(p2), Value::whole(c2)],
        ],
    );
    b.sequential("lone1", lone, relu_conv(1));
    let g = b.finish().unwrap();
    use opsched_graph::fusion::{act_by_writers, producer_activation};
    assert_eq!(act_by_writers(&g, cell), Some(Some(0)));
    assert_eq!(act_by_writers(&g, red), Some(None));
    assert_eq!(act_by_writers(&g, lone), Some(Some(0)));
    assert_eq!(producer_activation(&g, cell), Some(Activation::Relu));
    assert_eq!(producer_activation(&g, d), Some(Activation::Relu));
    assert_eq!(producer_activation(&g, e), None);
    assert!(opsched_graph::inplace::slice_of(&g, a).is_some());
    // a's bias: added by the add kernel that pools p, and by the in-place activation of its
    // slice of the cell; e's pool keeps its kernel, and e its bias.
    use opsched_graph::fusion::deferred_bias;
    assert!(deferred_bias(&g, a).is_some());
    assert!(deferred_bias(&g, a2).is_some());
    assert!(deferred_bias(&g, e).is_none());
    g
}

/// Poolings that the add kernel of their reader computes
/// (`opsched_graph::fusion::pool_into_sum`) at batch 2: NASNet's cell (a concatenation whose
/// first term a convolution writes in place, strided, while pools read it, summed with a
/// value whose bias is left to the sum, and two alike pools summed), a strided average pool
/// beside a strided convolution, an element-wise add of a max pool with its relu fused, a
/// sigmoid of a sum, and global pools; with the pools each pooling differently, in a
/// concatenation along another axis, which keep their kernels. Convolutions whose bias their
/// poolings add (an average counting the padding, a strided max into an element-wise add, a
/// pooling into a concatenation along another axis) besides sums reading them.
fn pooled_sum_graph() -> Graph {
    let mut b = GraphBuilder::new("pooled-sums", DType::F32);
    let x = b.input("x", vec![2, 6, 7, 7]);
    let a = b.conv("a", x, Conv2d::new(6, 3).bias(true));
    let y = b.conv("y", x, Conv2d::new(6, 1).bias(true));
    let z = b.conv("z", x, Conv2d::new(6, 1).bias(true));
    let mut avg = Pool2d::avg(3, 1, 1);
    avg.count_include_pad = false;
    let p1 = b.pool("p1", a, avg.clone());
    let p2 = b.pool("p2", a, avg.clone());
    let p3 = b.pool("p3", a, avg.clone());
    let p4 = b.pool("p4", y, Pool2d::max(3, 1, 1));
    let sum = |p: NodeId, q: NodeId| vec![Value::whole(p), Value::whole(q)];
    let cell = b.node(
        "cell",
        Op::Identity,
        vec![vec![Value::whole(a)], sum(p1, z), sum(p2, p3), sum(p4, x)],
    );
    b.conv("after", cell, Conv2d::new(6, 1));
    let p5 = b.pool("p5", x, Pool2d::avg(3, 2, 1));
    let s2 = b.conv("s2", x, Conv2d::new(6, 3).stride(2).bias(true));
    b.node("strided", Op::Identity, vec![sum(p5, s2)]);
    let p6 = b.pool("p6", x, Pool2d::max(3, 1, 1));
    let add = b.add("add", &[p6, y]);
    b.act("add_relu", add, Activation::Relu);
    let p7 = b.pool("p7", y, Pool2d::avg(3, 1, 1));
    b.node(
        "sig",
        Op::Activation {
            act: Activation::Sigmoid,
        },
        vec![sum(p7, x)],
    );
    let g1 = b.pool("g1", x, Pool2d::global_avg());
    let g2 = b.pool("g2", a, Pool2d::global_avg());
    b.node("gsum", Op::Identity, vec![sum(g1, g2)]);
    // Not pooled by their reader: two poolings that pool differently, a concatenation along
    // the width.
    let q1 = b.pool("q1", x, Pool2d::max(3, 1, 1));
    let q2 = b.pool("q2", x, Pool2d::avg(3, 1, 1));
    b.node("mixed", Op::Identity, vec![sum(q1, q2)]);
    let q3 = b.pool("q3", y, Pool2d::avg(3, 1, 1));
    b.node(
        "wide",
        Op::Concat { axis: 3 },
        vec![sum(q3, x), vec![Value::whole(x)]],
    );
    let v = b.conv("v", x, Conv2d::new(6, 1).bias(true));
    let p8 = b.pool("p8", v, Pool2d::avg(3, 1, 1));
    let p9 = b.pool("p9", v, Pool2d::max(3, 2, 1));
    b.node("vsum", Op::Identity, vec![sum(p8, v)]);
    let vadd = b.add("vadd", &[p9, s2]);
    b.act("vadd_relu", vadd, Activation::Relu);
    let g = b.finish().unwrap();
    use opsched_graph::fusion::pool_into_sum;
    for p in [p1, p2, p3, p4, p5, p6, p7, g1, g2, q3, p8, p9] {
        assert!(pool_into_sum(&g, p).is_some(), "{}", g.node(p).name);
    }
    for p in [q1, q2] {
        assert!(pool_into_sum(&g, p).is_none(), "{}", g.node(p).name);
    }
    assert!(opsched_graph::inplace::slice_of(&g, a).is_some());
    for c in [z, s2, v] {
        assert!(opsched_graph::fusion::deferred_bias(&g, c).is_some());
    }
    // y's poolings add its bias, one of them (q3) a kernel of its own.
    assert!(opsched_graph::fusion::deferred_bias(&g, y).is_some());
    g
}

/// Concatenations that pass their convolutions' biases on
/// (`opsched_graph::fusion::passed_bias`) at batch 2: NASNet's factorized reduction (two
/// strided relu + 1x1 convolutions, each writing its slice in place) read by a separable
/// convolution's depthwise kernel, a pooling that a sum's add kernel computes, and a cell
/// activated for its readers whose in-place activation of that slice adds the biases; beside
/// one read by a 1x1 convolution, whose terms keep their biases.
fn passed_bias_graph() -> Graph {
    let relu = || Op::Activation {
        act: Activation::Relu,
    };
    let relu_conv = |out: usize, stride: usize| {
        vec![
            relu(),
            Op::Conv2d(Conv2d::new(out, 1).stride(stride).bias(true)),
        ]
    };
    let mut b = GraphBuilder::new("passed-bias", DType::F32);
    let x = b.input("x", vec![2, 6, 8, 8]);
    let one = |v: NodeId| vec![Value::whole(v)];
    // Slices of 4 channels: channels last, each pixel's run of them stays 16-byte aligned.
    let p1 = b.sequential("p1", x, relu_conv(4, 2));
    let p2 = b.sequential("p2", x, relu_conv(4, 2));
    let path = b.node("path", Op::Identity, vec![one(p1), one(p2)]);
    let sep = vec![
        relu(),
        Op::Conv2d(Conv2d::new(8, 3).groups(8).bias(true)),
        Op::Conv2d(Conv2d::new(8, 1).bias(true)),
    ];
    let s = b.sequential("s", path, sep);
    let q = b.pool("q", path, Pool2d::avg(3, 1, 1));
    let cell = b.node(
        "cell",
        Op::Identity,
        vec![one(path), vec![Value::whole(q), Value::whole(s)]],
    );
    b.sequential("r1", cell, relu_conv(6, 1));
    b.sequential("r2", cell, relu_conv(6, 2));
    let k1 = b.sequential("k1", x, relu_conv(4, 2));
    let k2 = b.sequential("k2", x, relu_conv(4, 2));
    let kept = b.node("kept", Op::Identity, vec![one(k1), one(k2)]);
    b.conv("kept_conv", kept, Conv2d::new(6, 1));
    let g = b.finish().unwrap();
    use opsched_graph::fusion::{act_by_writers, deferred_bias, passed_bias};
    assert!(passed_bias(&g, path));
    assert!(!passed_bias(&g, kept));
    assert_eq!(act_by_writers(&g, cell), Some(Some(0)));
    for (v, left) in [(p1, true), (p2, true), (k1, false), (k2, false)] {
        assert_eq!(deferred_bias(&g, v).is_some(), left, "{}", g.node(v).name);
    }
    g
}

/// An FPN's top-down path at batch 2: a coarse level resized to the lateral's size (nearest,
/// PyTorch's rule), added to it and convolved; a bilinear enlargement and a shrinking read by
/// convolutions (each resize reads and writes channels last there), and a resize that is an
/// output.
fn resize_graph() -> Graph {
    use opsched_graph::{NearestMode, Resize, ResizeCoord};
    let mut b = GraphBuilder::new("resize", DType::F32);
    let x = b.input("x", vec![2, 4, 9, 7]);
    let fine = b.conv("fine", x, Conv2d::new(8, 3).padding(1, 1).bias(true).relu());
    let coarse = b.conv("coarse", fine, Conv2d::new(8, 3).stride(2).bias(true));
    let nearest = Resize::nearest([9, 7], ResizeCoord::Asymmetric, NearestMode::Floor);
    let up = b.op("up", Op::Resize(nearest), &[coarse]);
    let lateral = b.conv("lateral", fine, Conv2d::new(8, 1).bias(true));
    let sum = b.add("sum", &[up, lateral]);
    let smooth = b.conv("smooth", sum, Conv2d::new(8, 3).padding(1, 1).bias(true));
    let mut bilinear = Resize::linear([14, 11], ResizeCoord::PytorchHalfPixel);
    bilinear.scale = Some([1.5, 1.6]);
    let big = b.op("big", Op::Resize(bilinear), &[smooth]);
    b.conv("big_conv", big, Conv2d::new(4, 1));
    let small = Resize::linear([4, 3], ResizeCoord::AlignCorners);
    let small = b.op("small", Op::Resize(small), &[smooth]);
    b.conv("small_conv", small, Conv2d::new(4, 1));
    let last = Resize::nearest([5, 5], ResizeCoord::HalfPixel, NearestMode::RoundPreferCeil);
    b.op("last", Op::Resize(last), &[smooth]);
    b.finish().unwrap()
}

#[test]
fn resizes_match_the_reference_in_both_layouts() {
    let g = resize_graph();
    check_in_both_layouts(&g);
    let p = GraphProgram::build_with(&g, &vec![Some(0); g.len()], &[], &[], Layout::Nhwc).unwrap();
    for (name, nhwc) in [
        ("up", true),
        ("big", true),
        ("small", true),
        ("last", false),
    ] {
        let id = g.find(name).unwrap();
        assert_eq!(p.channels_last[id.index()], nhwc, "{name}");
    }
}

/// Every reduction kind over consecutive elements (the last axis, and the last two), rows of
/// 37 (two sixteen-lane chunks and a rest: the CPU sums in lanes) and of 5 (in order), against
/// the reference's in-order loops.
#[test]
fn reductions_over_the_last_axes_match_the_reference() {
    let mut b = GraphBuilder::new("last_axes", DType::F32);
    let kinds = [
        ReduceKind::Mean,
        ReduceKind::Sum,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::Prod,
        ReduceKind::L1,
        ReduceKind::L2,
        ReduceKind::SumSquare,
        ReduceKind::LogSum,
        ReduceKind::LogSumExp,
        ReduceKind::ArgMax,
        ReduceKind::LastArgMin,
    ];
    for (shape, tag) in [(vec![3, 4, 37], "long"), (vec![2, 3, 5], "short")] {
        let x = b.input(tag, shape);
        // Magnitudes: a log of the sum needs a positive sum.
        let positive = b.act(&format!("{tag}_abs"), x, Activation::Abs);
        for kind in kinds {
            for (begin, keep) in [(2, true), (1, false)] {
                let from = if kind == ReduceKind::LogSum {
                    positive
                } else {
                    x
                };
                let name = format!("{tag}_{kind:?}_{begin}");
                let op = Op::Reduce {
                    kind,
                    begin,
                    end: 3,
                    keep,
                };
                b.op(&name, op, &[from]);
            }
        }
    }
    check_in_both_layouts(&b.finish().unwrap());
}

/// Token ids read by two tables (the default ids are rows of the smaller), their vectors
/// summed, normalized and projected; the first token taken as a channel slice; the tokens'
/// mean, and the largest value of each vector.
fn embedding_graph() -> Graph {
    let mut b = GraphBuilder::new("embedding", DType::F32);
    let ids = b.input("ids", vec![2, 5]);
    let words = b.op("words", Op::Embedding { rows: 11, dim: 8 }, &[ids]);
    let types = b.op("types", Op::Embedding { rows: 3, dim: 8 }, &[ids]);
    let sum = b.add("sum", &[words, types]);
    let norm = b.op("norm", Op::LayerNorm { eps: 1e-5 }, &[sum]);
    let reduce = |kind, begin, end, keep| Op::Reduce {
        kind,
        begin,
        end,
        keep,
    };
    b.op("mean", reduce(ReduceKind::Mean, 1, 2, false), &[norm]);
    b.op("max", reduce(ReduceKind::Max, 2, 3, true), &[norm]);
    let first = b.node(
        "first",
        Op::Reshape { shape: vec![2, 8] },
        vec![vec![Value::slice(norm, 0, 1)]],
    );
    b.op(
        "pool",
        Op::Linear {
            out_features: 4,
            bias: true,
            act: Activation::Tanh,
        },
        &[first],
    );
    b.finish().unwrap()
}

#[test]
fn embeddings_look_up_their_rows_and_refuse_other_indices() {
    let g = embedding_graph();
    check_in_both_layouts(&g);
    // The default ids are rows of the 3-row table.
    let ids = opsched_gpu::program::input_init(&g, g.find("ids").unwrap());
    let v = ids.values(10).unwrap();
    assert!(
        v.iter().all(|&i| i == i.trunc() && (0.0..3.0).contains(&i)),
        "{v:?}"
    );
    assert!(v.iter().any(|&i| i > 0.0), "{v:?}");
    // An id of the larger table only: the smaller one's lookup is refused, naming it.
    let mut inputs = std::collections::HashMap::new();
    let bad = opsched_graph::Tensor::new(
        vec![2, 5],
        vec![0.0, 1.0, 2.0, 7.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    )
    .unwrap();
    inputs.insert(g.find("ids").unwrap(), bad);
    let e = reference::reference_with(&g, &inputs)
        .unwrap_err()
        .to_string();
    assert!(e.contains("'types'") && e.contains("index 7"), "{e}");
}

/// The graphs that hold every operator kind and fusion between them.
fn op_graphs() -> [Graph; 11] {
    [
        every_op_graph(),
        attention_graph(),
        attention_graph_of(1),
        onnx_semantics_graph(),
        layer_norm_graph(),
        deferred_bias_graph(),
        producer_activation_graph(),
        pooled_sum_graph(),
        passed_bias_graph(),
        resize_graph(),
        embedding_graph(),
    ]
}

/// `g` on one GPU in both layouts: every value against the reference, and the kernels the
/// cost model counts (`opsched_cost::launches`) those the program runs, but for channels
/// last's transposes between the layouts.
fn check_in_both_layouts(g: &Graph) {
    let launches: u32 = g
        .ops()
        .map(|o| opsched_cost::launches::launches(g, o))
        .sum();
    for layout in [Layout::Nchw, Layout::Nhwc] {
        let p = GraphProgram::build_with(g, &vec![Some(0); g.len()], &[], &[], layout).unwrap();
        check_program(&cpu(), g, &p, &KernelOptions::default(), 1e-5);
        assert_eq!(
            p.kernels(),
            launches as usize + p.layout_conversions,
            "{layout:?}, left out {:?}",
            g.fusions().left_out()
        );
    }
}

/// `g` with fusion `name` left out runs `more` kernels more than `g`, with the same values
/// (both checked in both layouts by [`check_in_both_layouts`]).
fn left_out_runs_more(g: &Graph, name: &str, more: usize) {
    let without = g.clone().with_fusions(Fusions::ALL.without(name).unwrap());
    let kernels = |g: &Graph| GraphProgram::single_gpu(g).unwrap().kernels();
    assert_eq!(
        kernels(&without) - kernels(g),
        more,
        "{} without {name}",
        g.name
    );
    check_in_both_layouts(&without);
}

/// Which of the named values `g`'s program on one GPU keeps.
fn assert_kept(g: &Graph, kept: &[(&str, bool)]) {
    let p = GraphProgram::single_gpu(g).unwrap();
    let values = execute(&cpu(), g, &p, &KernelOptions::default()).unwrap();
    for &(name, kept) in kept {
        let n = g.find(name).unwrap();
        assert_eq!(values[n.index()].is_some(), kept, "{name}");
    }
}

#[test]
fn values_activated_by_their_producers_run_fewer_kernels_with_the_same_outputs() {
    let g = producer_activation_graph();
    check_in_both_layouts(&g);
    // cell: 3 relu kernels (one in r3's depthwise kernel) -> 1; d: 2 -> 1; red: 2 -> 0;
    // lone: 1 -> 1 (a slice); and a's and a2's biases, which the in-place activations of
    // their slices add.
    left_out_runs_more(&g, "act-into-producer", 6);
    // Without the sums' add kernels activating, red's value is activated in place: 1; lone's
    // reader activates it (1 -> 1); and a and a2 keep their bias kernels: 2.
    left_out_runs_more(&g, "act-into-writers", 3);
    // The values activated in place, and the one written in place into the cell, are not
    // kept; nor is the pool that the cell's add kernel computes.
    let kept = [
        ("cell", false),
        ("a", false),
        ("d", false),
        ("e", true),
        ("p", false),
        ("red", false),
    ];
    assert_kept(&g, &kept);
}

#[test]
fn poolings_that_their_readers_add_run_no_kernel_with_the_same_outputs() {
    let g = pooled_sum_graph();
    check_in_both_layouts(&g);
    // p1..p9, g1, g2 and q3: twelve pooling kernels fewer; q1 and q2 keep theirs (the
    // poolings add the biases left to them either way).
    left_out_runs_more(&g, "pool-into-sum", 12);
    // The poolings' own values are never written, nor kept.
    assert_kept(
        &g,
        &[("p1", false), ("g2", false), ("q3", false), ("q1", true)],
    );
}

#[test]
fn biases_through_poolings_and_slices_run_fewer_kernels_with_the_same_outputs() {
    // v's and y's bias kernels; a's and a2's (their pooled sums and their slices' in-place
    // activations add them).
    left_out_runs_more(&pooled_sum_graph(), "bias-into-pools", 2);
    left_out_runs_more(&producer_activation_graph(), "bias-into-pools", 2);
    // Without the slice's in-place activation, a keeps its bias.
    let g =
        producer_activation_graph().with_fusions(Fusions::ALL.without("act-into-writers").unwrap());
    assert!(opsched_graph::fusion::deferred_bias(&g, g.find("a").unwrap()).is_none());
}

#[test]
fn concatenations_passing_biases_on_run_fewer_kernels_with_the_same_outputs() {
    let g = passed_bias_graph();
    check_in_both_layouts(&g);
    // p1's and p2's bias kernels.
    left_out_runs_more(&g, "bias-through-concat", 2);
    // The concatenation's own value, without the biases, is not kept.
    assert_kept(
        &g,
        &[("path", false), ("p1", false), ("kept", true), ("k1", true)],
    );
}

/// Every operator kind lowered, in both layouts (as the GPU test runs them).
#[test]
fn every_op_lowered_matches_the_reference() {
    let mut channels_last = 0;
    for g in op_graphs() {
        let p = GraphProgram::single_gpu(&g).unwrap();
        check_program(&cpu(), &g, &p, &KernelOptions::default(), 1e-5);
        let one_gpu = vec![Some(0); g.len()];
        let p = GraphProgram::build_with(&g, &one_gpu, &[], &[], Layout::Nhwc).unwrap();
        check_program(&cpu(), &g, &p, &KernelOptions::default(), 1e-5);
        channels_last += usize::from(p.layout_conversions > 0);
    }
    // The graphs of convolutions (not the attention, embedding or layer norm ones).
    assert!(
        channels_last >= 7,
        "{channels_last} graphs stored any value channels last"
    );
}

/// Ops alternate between GPUs; every cross-GPU edge is a transfer with its own replica.
fn two_gpu_placement(g: &Graph) -> (Vec<Option<usize>>, Vec<TransferSpec>) {
    let mut placement = vec![None; g.len()];
    for (i, id) in g.ops().enumerate() {
        placement[id.index()] = Some(i % 2);
    }
    let mut xfers = Vec::new();
    for u in g.ops() {
        for v in g.succs(u) {
            let (Some(a), Some(b)) = (placement[u.index()], placement[v.index()]) else {
                continue;
            };
            if a != b {
                xfers.push(TransferSpec {
                    src: u,
                    dst: v,
                    dst_gpu: b,
                });
            }
        }
    }
    (placement, xfers)
}

#[test]
fn two_gpu_program_with_transfers_matches_the_reference() {
    for g in [every_op_graph(), attention_graph()] {
        let (placement, xfers) = two_gpu_placement(&g);
        assert!(!xfers.is_empty());
        let p = GraphProgram::build(&g, &placement, &xfers).unwrap();
        assert_eq!(p.gpus, 2);
        assert_eq!(p.transfers.len(), xfers.len());
        // Every replica is on the consumer's GPU and as large as the producer's output.
        for (&(src, dst), t) in p.transfers.iter().zip(&xfers) {
            assert_eq!(p.buffers[dst].gpu, t.dst_gpu);
            assert_ne!(p.buffers[src].gpu, t.dst_gpu);
            assert_eq!(p.buffers[src].len, p.buffers[dst].len);
        }
        // Operators read and write only buffers on their own GPU.
        for op in p.ops.iter().flatten() {
            for s in &op.steps {
                for (b, _) in s.access().all() {
                    assert_eq!(p.buffers[b].gpu, op.gpu, "{s:?}");
                }
            }
        }
        check_program(&cpu(), &g, &p, &KernelOptions::default(), 1e-5);
    }
}

#[test]
fn zoo_models_lowered_match_the_reference() {
    // Small inputs so the naive reference stays fast; NASNet at batch 2 in both layouts (its
    // pooled sums, its cell outputs activated by their writers, strided slices).
    let cases = [
        ("squeezenet", 48, 1, Layout::Nchw),
        ("googlenet", 48, 1, Layout::Nchw),
        ("resnet50", 32, 1, Layout::Nchw),
        ("nasnet", 32, 2, Layout::Nchw),
        ("nasnet", 32, 2, Layout::Nhwc),
    ];
    for (name, size, batch, layout) in cases {
        let g = zoo::build(
            name,
            &ZooConfig {
                batch,
                input_size: Some(size),
                dtype: DType::F32,
            },
        )
        .unwrap();
        let p = GraphProgram::build_with(&g, &vec![Some(0); g.len()], &[], &[], layout).unwrap();
        check_program(&cpu(), &g, &p, &KernelOptions::default(), 1e-4);
    }
}

#[test]
fn buffer_plan_sizes_and_roles() {
    let g = every_op_graph();
    let p = GraphProgram::single_gpu(&g).unwrap();
    for id in g.ops() {
        let op = p.ops[id.index()].as_ref().unwrap();
        let n: usize = g.node(id).shape.iter().product();
        assert_eq!(p.buffers[op.output].len, n.max(1));
        assert_eq!(p.buffers[op.output].role, BufRole::Output(id));
    }
    // Inputs and parameters are initialised, outputs and scratch are not.
    for (i, b) in p.buffers.iter().enumerate() {
        let seeded = matches!(b.role, BufRole::Input(_) | BufRole::Param { .. });
        assert_eq!(seeded, b.init != Init::Uninit, "buffer {i}: {b:?}");
        assert_eq!(seeded, p.initial_data(i).is_some());
    }
    // One conv weight of c1: 8 x 6 x 3 x 3.
    let c1 = g.find("c1").unwrap();
    let w = p
        .buffers
        .iter()
        .find(|b| {
            b.role
                == BufRole::Param {
                    node: c1,
                    inner: 0,
                    what: "weight",
                }
        })
        .unwrap();
    assert_eq!(w.len, 8 * 6 * 9);
    // A whole-value single term is read in place: c1's program has just its conv.
    assert_eq!(p.ops[c1.index()].as_ref().unwrap().steps.len(), 1);
    // The distinct layout: every buffer that is not a slice of another has storage of its own,
    // 256-byte aligned.
    let fp = opsched_gpu::memory::footprint(&p);
    let roots: u64 = p
        .buffers
        .iter()
        .filter(|b| b.within.is_none())
        .map(|b| b.len as u64 * 4)
        .sum();
    assert_eq!(p.bytes_per_gpu(), vec![fp.storage_bytes]);
    assert!(fp.storage_bytes >= roots && fp.storage_bytes <= fp.distinct_bytes);
    assert!(fp.distinct_bytes < roots + 256 * p.buffers.len() as u64);
    opsched_gpu::memory::check_layout(&p).unwrap();
    // Same data on every build (seeded by names).
    let q = GraphProgram::single_gpu(&g).unwrap();
    let wi = p.buffers.iter().position(|b| b == w).unwrap();
    assert_eq!(p.initial_data(wi), q.initial_data(wi));
}

#[test]
fn a_sum_of_whole_values_is_one_add_kernel() {
    let g = every_op_graph();
    let p = GraphProgram::single_gpu(&g).unwrap();
    let steps = |n: &str| &p.ops[g.find(n).unwrap().index()].as_ref().unwrap().steps;
    // The activation of a three-value sum: one kernel doing both.
    let [Step::Elementwise(e)] = steps("sum_act").as_slice() else {
        panic!("{:?}", steps("sum_act"));
    };
    assert_eq!(e.srcs.len(), 3);
    assert!(matches!(e.act, Activation::HardSigmoid { .. }));
    // A convolution of a sum reads one add's output; a sum with a channel slice is copied
    // value by value.
    assert!(matches!(
        steps("conv_sum").as_slice(),
        [Step::Elementwise(_), Step::Conv(_)]
    ));
    assert!(matches!(steps("add")[0], Step::Copy(_)));
    for name in ["sum_act", "conv_sum", "add"] {
        let s = steps(name);
        let n = opsched_cost::launches::launches(&g, g.find(name).unwrap());
        assert_eq!(n as usize, s.len(), "{name}");
    }
}

#[test]
fn a_depthwise_convolution_applies_the_activation_before_it() {
    let g = every_op_graph();
    let p = GraphProgram::single_gpu(&g).unwrap();
    let sep = g.find("sep").unwrap();
    // relu, depthwise, pointwise: the relu runs inside the depthwise convolution's kernel.
    let steps = &p.ops[sep.index()].as_ref().unwrap().steps;
    let [Step::Conv(dw), Step::Conv(pw)] = steps.as_slice() else {
        panic!("{steps:?}");
    };
    assert_eq!((dw.pre_act, dw.groups), (Activation::Relu, 8));
    assert_eq!((pw.pre_act, pw.groups), (Activation::None, 1));
    // On a GPU: the depthwise kernel, then cuDNN's pointwise convolution and its bias.
    assert_eq!(opsched_cost::launches::launches(&g, sep), 3);
}

#[test]
fn convolutions_compute_the_residual_sums_they_feed() {
    let g = every_op_graph();
    let p = GraphProgram::single_gpu(&g).unwrap();
    let steps = |n: &str| &p.ops[g.find(n).unwrap().index()].as_ref().unwrap().steps;
    for (conv, sum, act) in [
        ("rc", "radd", Activation::None),
        ("rc2", "radd2", Activation::Relu),
    ] {
        let [Step::Conv(c)] = steps(conv).as_slice() else {
            panic!("{conv}: {:?}", steps(conv));
        };
        assert!(c.residual.is_some() && c.act == act, "{conv}: {c:?}");
        assert!(steps(sum).is_empty(), "{sum}");
        let n = opsched_cost::launches::launches(&g, g.find(sum).unwrap());
        assert_eq!(n, 0, "{sum}");
    }
    assert!(steps("rrelu").is_empty());
    // The sum read by a convolution and a sum keeps its value; the convolutions' are not kept.
    assert!(p.outputs[g.find("radd").unwrap().index()].is_some());
    assert!(p.outputs[g.find("rc").unwrap().index()].is_none());
}

#[test]
fn a_linear_layer_adds_bias_residual_and_relu_in_its_product() {
    let g = attention_graph();
    let p = GraphProgram::single_gpu(&g).unwrap();
    let steps = |n: &str| &p.ops[g.find(n).unwrap().index()].as_ref().unwrap().steps;
    let epilogue = |n: &str| match steps(n).as_slice() {
        [Step::Gemm(m)] => m.epilogue.clone(),
        other => panic!("{n}: {other:?}"),
    };
    let q = epilogue("q").unwrap();
    assert!(q.bias.is_some() && q.residual.is_none() && q.act == Activation::None);
    assert_eq!(
        epilogue("k"),
        None,
        "no bias, no activation: a plain product"
    );
    assert_eq!(epilogue("v").unwrap().act, Activation::Relu);
    let f2 = epilogue("f2").unwrap();
    assert!(f2.bias.is_some() && f2.residual.is_some() && f2.act == Activation::Relu);
    assert!(matches!(
        steps("f1").as_slice(),
        [Step::Gemm(m), Step::BiasAct(a)] if m.epilogue.is_none() && a.act == Activation::Gelu
    ));
    for name in ["q", "k", "v", "f1", "f2", "res2", "res2.relu"] {
        let n = opsched_cost::launches::launches(&g, g.find(name).unwrap());
        assert_eq!(n as usize, steps(name).len(), "{name}");
    }
}

#[test]
fn a_reshape_is_a_view_its_producer_writes() {
    let g = attention_graph();
    let p = GraphProgram::single_gpu(&g).unwrap();
    let op = |n: &str| p.ops[g.find(n).unwrap().index()].as_ref().unwrap();
    // The head split's reshape of `q` and the merge's reshape of the transposed context.
    for (producer, reshape) in [("q", "q.r"), ("ctx.t", "ctx.r")] {
        assert!(op(reshape).steps.is_empty(), "{reshape}");
        assert_eq!(
            p.buffers[op(producer).output].within,
            Some((op(reshape).output, 0)),
            "{producer} writes {reshape}'s buffer"
        );
        let n = opsched_cost::launches::launches(&g, g.find(reshape).unwrap());
        assert_eq!(n, 0, "{reshape}");
        // Both values stay readable after a run.
        for n in [producer, reshape] {
            assert!(p.outputs[g.find(n).unwrap().index()].is_some(), "{n}");
        }
    }
}

#[test]
fn products_read_and_write_through_the_head_transposes() {
    for batch in [1, 2] {
        let g = attention_graph_of(batch);
        let p = GraphProgram::single_gpu(&g).unwrap();
        let op = |n: &str| p.ops[g.find(n).unwrap().index()].as_ref().unwrap();
        let gemm = |n: &str| match op(n).steps.as_slice() {
            [Step::Gemm(m)] => m.clone(),
            other => panic!("{n}: {other:?}"),
        };
        for t in ["q.t", "k.t", "v.t", "ctx.t"] {
            assert!(op(t).steps.is_empty(), "{t}");
            let n = opsched_cost::launches::launches(&g, g.find(t).unwrap());
            assert_eq!(n, 0, "{t}");
        }
        // 3 heads of 4 over 5 positions: in the untransposed tensor a head's rows are 12
        // apart, heads 4 apart, sequences 60 apart; the scores (5 x 5 per head) are dense.
        let scores = gemm("scores");
        let ctx = gemm("ctx");
        assert_eq!((scores.batch, scores.outer), (3, batch));
        assert_eq!((scores.lda, scores.stride_a), (12, 4), "k read in place");
        assert_eq!((scores.ldb, scores.stride_b), (12, 4), "q read in place");
        assert_eq!(scores.outer_stride, [60, 60, 75]);
        assert_eq!((ctx.lda, ctx.stride_a), (12, 4), "v read in place");
        assert_eq!((ctx.ldc, ctx.stride_c), (12, 4), "written transposed");
        assert_eq!(ctx.outer_stride, [60, 75, 60]);
        assert_eq!(ctx.c, op("ctx.t").output);
        assert!(p.outputs[g.find("ctx").unwrap().index()].is_none());
    }
}

#[test]
fn inputs_are_copied_to_every_gpu_that_reads_them() {
    let g = every_op_graph();
    let (placement, xfers) = two_gpu_placement(&g);
    let p = GraphProgram::build(&g, &placement, &xfers).unwrap();
    let x = g.find("x").unwrap();
    let copies: Vec<_> = p
        .buffers
        .iter()
        .enumerate()
        .filter(|(_, b)| b.role == BufRole::Input(x))
        .collect();
    assert_eq!(copies.len(), 2);
    assert_eq!(p.initial_data(copies[0].0), p.initial_data(copies[1].0));
}

#[test]
fn error_paths_are_typed() {
    // f16 graphs are refused.
    let mut b = GraphBuilder::new("half", DType::F16);
    let x = b.input("x", vec![1, 4, 4, 4]);
    b.conv("c", x, Conv2d::new(4, 3));
    let g = b.finish().unwrap();
    assert!(matches!(
        GraphProgram::single_gpu(&g),
        Err(GpuError::UnsupportedDType(_))
    ));
    assert!(matches!(
        reference::reference(&g),
        Err(GpuError::UnsupportedDType(_))
    ));
    // A cross-GPU edge without a transfer names the consumer.
    let g = every_op_graph();
    let (placement, _) = two_gpu_placement(&g);
    let e = GraphProgram::build(&g, &placement, &[]).unwrap_err();
    assert!(
        matches!(&e, GpuError::Unsupported { message, .. } if message.contains("no transfer")),
        "{e}"
    );
    // A wrong-length placement and a transfer that stays on one GPU are plan errors.
    assert!(matches!(
        GraphProgram::build(&g, &[], &[]),
        Err(GpuError::Plan(_))
    ));
    let c1 = g.find("c1").unwrap();
    let p1 = g.find("p1").unwrap();
    let all0: Vec<Option<usize>> = g
        .nodes()
        .iter()
        .map(|n| (!n.op.is_input()).then_some(0))
        .collect();
    let e = GraphProgram::build(
        &g,
        &all0,
        &[TransferSpec {
            src: c1,
            dst: p1,
            dst_gpu: 0,
        }],
    )
    .unwrap_err();
    assert!(e.to_string().contains("stays on GPU 0"), "{e}");
    // A step reading past its buffer is refused when prepared, not a panic when run.
    let mut p = GraphProgram::single_gpu(&g).unwrap();
    let op = p.ops[c1.index()].clone().unwrap();
    let src = op.steps[0].access().reads[0].0;
    let step: Step = Copy {
        src,
        dst: op.output,
        outer: 1,
        src_axis: p.buffers[src].len + 1,
        src_off: 0,
        dst_axis: p.buffers[src].len + 1,
        dst_off: 0,
        len: p.buffers[src].len + 1,
        inner: 1,
        accumulate: false,
    }
    .into();
    assert!(matches!(
        opsched_gpu::program::check_access(&p, &step),
        Err(GpuError::Plan(_))
    ));
    p.ops[c1.index()].as_mut().unwrap().steps = vec![step];
    let dev = cpu();
    let mem = dev.alloc(&p, &[0]).unwrap();
    let e = dev
        .prepare(
            &p,
            &mem,
            p.ops[c1.index()].as_ref().unwrap(),
            &KernelOptions::default(),
        )
        .err()
        .unwrap();
    assert!(matches!(e, GpuError::Plan(_)), "{e}");
}

#[test]
fn abstract_ops_spin() {
    let g = opsched_graph::random::layered_dag(&opsched_graph::random::LayeredDagParams {
        ops: 20,
        layers: 4,
        edges: 30,
        ..Default::default()
    })
    .unwrap();
    let p = GraphProgram::single_gpu(&g).unwrap();
    for op in p.ops.iter().flatten() {
        assert!(
            matches!(op.steps.as_slice(), [Step::Spin(s)] if s.time_ms > 0.0 && s.util > 0.0),
            "{:?}",
            op.steps
        );
    }
    check_program(&cpu(), &g, &p, &KernelOptions::default(), 0.0);
}

// --- The CPU device's semantics -------------------------------------------------------------

/// x -> a -> b (two relus), the smallest program with a dependency.
fn chain() -> (Graph, GraphProgram) {
    let mut b = GraphBuilder::new("chain", DType::F32);
    let x = b.input("x", vec![1, 4, 8, 8]);
    let a = b.act("a", x, Activation::Relu);
    b.act("b", a, Activation::Sigmoid);
    let g = b.finish().unwrap();
    let p = GraphProgram::single_gpu(&g).unwrap();
    (g, p)
}

fn prepared<D: Device>(dev: &D, g: &Graph, p: &GraphProgram) -> (D::Memory, D::Op, D::Op) {
    let mem = dev.alloc(p, &[0]).unwrap();
    let op = |n: &str| {
        let id = g.find(n).unwrap();
        dev.prepare(
            p,
            &mem,
            p.ops[id.index()].as_ref().unwrap(),
            &KernelOptions::default(),
        )
        .unwrap()
    };
    let (a, b) = (op("a"), op("b"));
    (mem, a, b)
}

#[test]
fn a_missing_wait_is_a_race_the_detector_reports() {
    let (g, p) = chain();
    let dev = cpu();
    let (_mem, a, b) = prepared(&dev, &g, &p);
    let (s0, s1) = (dev.stream(0).unwrap(), dev.stream(0).unwrap());
    // b reads a's output on another stream with no event between them: whatever the threads'
    // timing, the detector's clocks see that nothing orders the read after the write.
    dev.launch(&a, &s0).unwrap();
    dev.launch(&b, &s1).unwrap();
    let e = dev.synchronize().unwrap_err().to_string();
    assert!(
        e.contains("race on buffer") && e.contains("'b'") && e.contains("'a'"),
        "{e}"
    );
    // With the wait, the same two launches are clean (on a fresh device: errors are sticky).
    let dev = cpu();
    let (_mem, a, b) = prepared(&dev, &g, &p);
    let (s0, s1) = (dev.stream(0).unwrap(), dev.stream(0).unwrap());
    let e = dev.event(0, false).unwrap();
    dev.launch(&a, &s0).unwrap();
    dev.record(&s0, &e).unwrap();
    dev.wait(&s1, &e).unwrap();
    dev.launch(&b, &s1).unwrap();
    dev.synchronize().unwrap();
}

#[test]
fn a_wait_sees_the_record_enqueued_before_it_and_events_are_reusable() {
    let (g, p) = chain();
    let dev = cpu();
    let (_mem, a, b) = prepared(&dev, &g, &p);
    let (s0, s1) = (dev.stream(0).unwrap(), dev.stream(0).unwrap());
    let e = dev.event(0, false).unwrap();
    // Recorded before a: waiting for it does not order b after a (a race).
    dev.record(&s0, &e).unwrap();
    dev.launch(&a, &s0).unwrap();
    dev.wait(&s1, &e).unwrap();
    dev.launch(&b, &s1).unwrap();
    assert!(dev.synchronize().is_err());
    // One event recorded again after each launch orders each next wait (CUDA's semantics).
    let dev = cpu();
    let (_mem, a, b) = prepared(&dev, &g, &p);
    let (s0, s1) = (dev.stream(0).unwrap(), dev.stream(0).unwrap());
    let e = dev.event(0, false).unwrap();
    for _ in 0..3 {
        dev.launch(&a, &s0).unwrap();
        dev.record(&s0, &e).unwrap();
        dev.wait(&s1, &e).unwrap();
        dev.launch(&b, &s1).unwrap();
        dev.record(&s1, &e).unwrap();
        dev.wait(&s0, &e).unwrap();
    }
    dev.synchronize().unwrap();
}

#[test]
fn capture_replays_the_work_and_checks_its_shape() {
    let (g, p) = chain();
    let dev = cpu();
    let (mem, a, b) = prepared(&dev, &g, &p);
    let (s0, s1) = (dev.stream(0).unwrap(), dev.stream(0).unwrap());
    let (fork, join) = (dev.event(0, false).unwrap(), dev.event(0, false).unwrap());
    let out = p.ops[g.find("b").unwrap().index()].as_ref().unwrap().output;
    // A fork/join capture: s1 joins through `fork`, returns through `join`.
    dev.begin_capture(&s0).unwrap();
    dev.launch(&a, &s0).unwrap();
    dev.record(&s0, &fork).unwrap();
    dev.wait(&s1, &fork).unwrap();
    dev.launch(&b, &s1).unwrap();
    dev.record(&s1, &join).unwrap();
    dev.wait(&s0, &join).unwrap();
    let graph = dev.end_capture(&s0).unwrap();
    // Nothing ran during the capture.
    dev.synchronize().unwrap();
    assert!(dev.read(&mem, out).unwrap().iter().all(|v| *v == 0.0));
    dev.replay(&graph, &s0).unwrap();
    dev.replay(&graph, &s0).unwrap();
    dev.synchronize().unwrap();
    let want = reference::reference(&g).unwrap();
    let w = want[g.find("b").unwrap().index()].as_ref().unwrap();
    assert!(scaled_error(&dev.read(&mem, out).unwrap(), w) < 1e-6);

    // A stream that joined the capture but was never joined back is an error.
    let dev = cpu();
    let (_mem, a, b) = prepared(&dev, &g, &p);
    let (s0, s1) = (dev.stream(0).unwrap(), dev.stream(0).unwrap());
    let fork = dev.event(0, false).unwrap();
    dev.begin_capture(&s0).unwrap();
    dev.launch(&a, &s0).unwrap();
    dev.record(&s0, &fork).unwrap();
    dev.wait(&s1, &fork).unwrap();
    dev.launch(&b, &s1).unwrap();
    let e = dev.end_capture(&s0).err().unwrap().to_string();
    assert!(e.contains("stream"), "{e}");

    // Waiting inside a capture for an event recorded outside it is refused (isolation), as
    // are ending a capture on another stream, a second capture and an empty one.
    let dev = cpu();
    let (_mem, a, _b) = prepared(&dev, &g, &p);
    let (s0, s1) = (dev.stream(0).unwrap(), dev.stream(0).unwrap());
    let outside = dev.event(0, false).unwrap();
    dev.launch(&a, &s1).unwrap();
    dev.record(&s1, &outside).unwrap();
    dev.synchronize().unwrap();
    dev.begin_capture(&s0).unwrap();
    assert!(dev.begin_capture(&s1).is_err());
    assert!(dev.wait(&s0, &outside).is_err());
    assert!(dev.end_capture(&s1).is_err());
    assert!(dev.end_capture(&s0).is_err(), "empty capture");
}

#[test]
fn kernels_run_concurrently_on_separate_streams() {
    // Two independent chains on two streams both finish, and their results equal a
    // one-stream run of the same operators.
    let mut b = GraphBuilder::new("two", DType::F32);
    let x = b.input("x", vec![1, 8, 16, 16]);
    let l = b.conv("l", x, Conv2d::new(8, 3));
    let r = b.conv("r", x, Conv2d::new(8, 3));
    b.add("sum", &[l, r]);
    let g = b.finish().unwrap();
    let p = GraphProgram::single_gpu(&g).unwrap();
    let dev = cpu();
    let mem = dev.alloc(&p, &[0]).unwrap();
    let prep = |n: &str| {
        let id = g.find(n).unwrap();
        dev.prepare(
            &p,
            &mem,
            p.ops[id.index()].as_ref().unwrap(),
            &KernelOptions::default(),
        )
        .unwrap()
    };
    let (ol, or, os) = (prep("l"), prep("r"), prep("sum"));
    let (s0, s1) = (dev.stream(0).unwrap(), dev.stream(0).unwrap());
    let e = dev.event(0, false).unwrap();
    dev.launch(&ol, &s0).unwrap();
    dev.launch(&or, &s1).unwrap();
    dev.record(&s1, &e).unwrap();
    dev.wait(&s0, &e).unwrap();
    dev.launch(&os, &s0).unwrap();
    dev.synchronize().unwrap();
    let sum = p.ops[g.find("sum").unwrap().index()]
        .as_ref()
        .unwrap()
        .output;
    let got = dev.read(&mem, sum).unwrap();
    let want = execute(&cpu(), &g, &p, &KernelOptions::default()).unwrap();
    assert_eq!(&got, want[g.find("sum").unwrap().index()].as_ref().unwrap());
}

/// Two streams running the same operators with nothing ordering them (the race detector
/// off): the steps that touch one buffer take turns, each waiting for the other's storage and
/// woken when it is released; every launch finishes, with the values of one stream alone.
#[test]
fn unordered_streams_take_turns_on_shared_storage() {
    let (g, p) = chain();
    let out = p.ops[g.find("b").unwrap().index()].as_ref().unwrap().output;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let dev = CpuDevice::with_race_check(false);
        let (mem, a, b) = prepared(&dev, &g, &p);
        let (s0, s1) = (dev.stream(0).unwrap(), dev.stream(0).unwrap());
        for _ in 0..2000 {
            for s in [&s0, &s1] {
                dev.launch(&a, s).unwrap();
                dev.launch(&b, s).unwrap();
            }
        }
        dev.synchronize().unwrap();
        let _ = tx.send((
            dev.read(&mem, out).unwrap(),
            reference::reference(&g).unwrap(),
        ));
    });
    let (got, want) = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("every launch finishes");
    let (g, _) = chain();
    let w = want[g.find("b").unwrap().index()].as_ref().unwrap();
    assert!(scaled_error(&got, w) < 1e-6);
}

/// On a GPU: every operator kind, each op's output against the reference
/// (TF32 off so the tolerance can be tight), through the same helper as the CPU tests; the
/// convolutions choose among all cuDNN kernels, then among the legacy API's algorithms alone,
/// then with cuBLAS's product for every 1x1 convolution, then among the backend API's engines
/// alone; the matrix products run the measured choice, then the unmeasured one, then
/// cuBLASLt's configurations at ranks 0, 1, 3 and 7 of its heuristic's list; and once more
/// with activations channels last (the channels-last pooling, pooling sums and sums, several
/// channels a thread where the channels allow: two of the pooled sums' six).
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn gpu_every_op_matches_the_reference() {
    let dev = opsched_gpu::CudaDevice::open(Some(1)).unwrap();
    let m = GemmKernel::Measured;
    let apis = [
        (ConvApi::Both, ConvGemm::Off, m),
        (ConvApi::Legacy, ConvGemm::Off, m),
        (ConvApi::Both, ConvGemm::Always, m),
        (ConvApi::Backend, ConvGemm::Off, m),
        (ConvApi::Both, ConvGemm::Off, GemmKernel::Heuristic),
        (ConvApi::Both, ConvGemm::Off, GemmKernel::LtRank(0)),
        (ConvApi::Both, ConvGemm::Off, GemmKernel::LtRank(1)),
        (ConvApi::Both, ConvGemm::Off, GemmKernel::LtRank(3)),
        (ConvApi::Both, ConvGemm::Off, GemmKernel::LtRank(7)),
    ];
    for (conv_api, conv_gemm, gemm) in apis {
        let precise = KernelOptions {
            tf32: false,
            conv_api,
            conv_gemm,
            gemm,
            ..Default::default()
        };
        for g in op_graphs() {
            let p = GraphProgram::single_gpu(&g).unwrap();
            check_program(&dev, &g, &p, &precise, 1e-3);
            let (placement, xfers) = two_gpu_placement(&g);
            let p = GraphProgram::build(&g, &placement, &xfers).unwrap();
            check_program(&dev, &g, &p, &precise, 1e-3);
        }
    }
    let precise = KernelOptions {
        tf32: false,
        ..Default::default()
    };
    for g in op_graphs() {
        let one_gpu = vec![Some(0); g.len()];
        let p = GraphProgram::build_with(&g, &one_gpu, &[], &[], Layout::Nhwc).unwrap();
        check_program(&dev, &g, &p, &precise, 1e-3);
    }
}

/// A random CNN of `kinds.len()` operators on 4 channels (batch `batch`, 6x6), each reading
/// earlier values picked by `picks`: 0 a 1x1 convolution with a bias, 1 a 3x3 one with a bias
/// and a relu, 2 a relu + separable convolution (NASNet's), 3 a depthwise convolution, 4 an
/// element-wise add, 5 a sum read by a relu, 6 an identity concatenating a sum and a value
/// (read back to 4 channels by a 1x1 convolution), 7 a max pool, 8 a separable convolution of
/// a sum (RandWire's node), 9 a convolution read by two relu + 1x1 convolutions (NASNet's
/// readers of a cell's output) and their sum, 10 NASNet's pooled sums (an average pool plus a
/// value, two alike max pools summed, concatenated and read back to 4 channels by a 1x1
/// convolution), 11 a concatenation of sums (and, for odd picks, of a value too) read by two
/// relu + 1x1 convolutions and their sum (NASNet's cell outputs: activated by the sums' add
/// kernels as they write, the value's slice after them), 12 NASNet's factorized reduction (two
/// relu + 1x1 convolutions of 2 channels each, concatenated: it passes their biases on where
/// its readers add them). Convolutions with a bias and no activation leave
/// it to whichever readers add it; a value that only relu-first chains read, two of them 1x1
/// ones, is activated by its producer.
fn random_cnn(kinds: &[u8], picks: &[(usize, usize)], batch: usize) -> Graph {
    let mut b = GraphBuilder::new("random-cnn", DType::F32);
    let mut vals = vec![b.input("x", vec![batch, 4, 6, 6])];
    for (i, (&k, &(p, q))) in kinds.iter().zip(picks).enumerate() {
        let (a, c) = (vals[p % vals.len()], vals[q % vals.len()]);
        let name = format!("n{i}");
        let sum = vec![Value::whole(a), Value::whole(c)];
        let sep = || {
            vec![
                Op::Activation {
                    act: Activation::Relu,
                },
                Op::Conv2d(Conv2d::new(4, 3).groups(4).bias(true)),
                Op::Conv2d(Conv2d::new(4, 1).bias(true)),
            ]
        };
        let v = match k % 13 {
            0 => b.conv(&name, a, Conv2d::new(4, 1).bias(true)),
            1 => b.conv(&name, a, Conv2d::new(4, 3).bias(true).relu()),
            2 => b.sequential(&name, a, sep()),
            3 => b.conv(&name, a, Conv2d::new(4, 3).groups(4).bias(true)),
            4 => b.add(&name, &[a, c]),
            5 => b.node(
                &name,
                Op::Activation {
                    act: Activation::Relu,
                },
                vec![sum],
            ),
            6 => {
                let cat = b.node(&name, Op::Identity, vec![sum, vec![Value::whole(c)]]);
                b.conv(&format!("{name}_back"), cat, Conv2d::new(4, 1).bias(true))
            }
            7 => b.pool(&name, a, Pool2d::max(3, 1, 1)),
            8 => b.node(&name, Op::Sequential { ops: sep() }, vec![sum]),
            10 => {
                let pool = |b: &mut GraphBuilder, side: &str, v: NodeId, p: Pool2d| {
                    b.pool(&format!("{name}_{side}"), v, p)
                };
                let avg = pool(&mut b, "avg", a, Pool2d::avg(3, 1, 1));
                let m1 = pool(&mut b, "m1", c, Pool2d::max(3, 1, 1));
                let m2 = pool(&mut b, "m2", c, Pool2d::max(3, 1, 1));
                let pooled = |p: NodeId, q: NodeId| vec![Value::whole(p), Value::whole(q)];
                let terms = vec![pooled(avg, c), pooled(m1, m2)];
                let cat = b.node(&format!("{name}_cat"), Op::Identity, terms);
                b.conv(&name, cat, Conv2d::new(4, 1).bias(true))
            }
            11 => {
                let mut terms = vec![sum.clone(), vec![Value::whole(c), Value::whole(a)]];
                if (p + q) % 2 == 1 {
                    terms.push(vec![Value::whole(c)]);
                }
                let cat = b.node(&format!("{name}_cat"), Op::Identity, terms);
                let mut relu_conv = |side: &str| {
                    let ops = vec![sep()[0].clone(), Op::Conv2d(Conv2d::new(4, 1))];
                    b.sequential(&format!("{name}_{side}"), cat, ops)
                };
                let (l, r) = (relu_conv("l"), relu_conv("r"));
                b.add(&name, &[l, r])
            }
            12 => {
                let mut half = |side: &str| {
                    let ops = vec![sep()[0].clone(), Op::Conv2d(Conv2d::new(2, 1).bias(true))];
                    b.sequential(&format!("{name}_{side}"), a, ops)
                };
                let (l, r) = (half("l"), half("r"));
                let terms = vec![vec![Value::whole(l)], vec![Value::whole(r)]];
                b.node(&name, Op::Identity, terms)
            }
            _ => {
                // A convolution read by two relu + 1x1 convolutions (its producer activates
                // it unless a later operator reads it too), their sum the node's value.
                let p = b.conv(&format!("{name}_p"), a, Conv2d::new(4, 3).bias(true));
                let mut relu_conv = |side: &str| {
                    let ops = vec![sep()[0].clone(), Op::Conv2d(Conv2d::new(4, 1))];
                    b.sequential(&format!("{name}_{side}"), p, ops)
                };
                let (l, r) = (relu_conv("l"), relu_conv("r"));
                vals.push(p);
                b.add(&name, &[l, r])
            }
        };
        vals.push(v);
    }
    b.finish().unwrap()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Whatever reads a convolution's value, every reader that the rule lets add its bias does
    /// (the program builds: its check finds none missed), and every value the program keeps
    /// equals the reference's, on one GPU and on two with transfers between them (sums that a
    /// depthwise kernel reads value by value among them); with any of the fusions that can be
    /// left out left out (`left_out`: a bit per `Fusions::NAMES` entry).
    #[test]
    fn random_cnns_with_deferred_biases_match_the_reference(
        kinds in proptest::collection::vec(0u8..13, 2..14),
        picks in proptest::collection::vec((0usize..64, 0usize..64), 14),
        batch in 1usize..3,
        left_out in 0usize..256,
    ) {
        let fusions = Fusions::NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| left_out >> i & 1 == 1)
            .fold(Fusions::ALL, |f, (_, (name, _))| f.without(name).unwrap());
        let g = random_cnn(&kinds, &picks, batch).with_fusions(fusions);
        let p = GraphProgram::single_gpu(&g).unwrap();
        check_program(&cpu(), &g, &p, &KernelOptions::default(), 1e-5);
        let launches: u32 = g.ops().map(|o| opsched_cost::launches::launches(&g, o)).sum();
        proptest::prop_assert_eq!(p.kernels(), launches as usize);
        let (placement, xfers) = two_gpu_placement(&g);
        let p = GraphProgram::build(&g, &placement, &xfers).unwrap();
        check_program(&cpu(), &g, &p, &KernelOptions::default(), 1e-5);
    }
}
