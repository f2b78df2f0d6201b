//! Parity with onnxruntime: every model of `fixtures/parity` (written with real random weights
//! by `xtask/fixtures/make_parity.py`, with onnxruntime's outputs for seeded inputs), imported
//! with its weights and run by the reference executor from the operator semantics, gives every
//! output within `max|ours - ort| / max|ort| <= 1e-4`. The held-out set (`fixtures/parity/
//! heldout`: another seed, other shapes) is checked the same way and is not looked at while
//! developing. The same models run on the CPU device under a multi-stream schedule
//! (`opsched run --backend cpu` with `--input`), in NCHW and channels last, compared with
//! onnxruntime the same way, and (ignored, `cargo xtask gpu-test`) on a GPU.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use opsched::gpu::reference;
use opsched::graph::{NodeId, Tensor};
use opsched::npy::{self, InputArray};
use opsched::runtime::{CpuDevice, RunOptions};
use opsched::zoo::ZooConfig;
use opsched::{Graph, LoadOptions};

/// Models in each set (`make_parity.py`'s): a file lost or left over fails the count.
const MODELS: usize = 27;

/// The tolerance of the issue: relative to the largest magnitude of onnxruntime's output.
const TOLERANCE: f64 = 1e-4;

fn dir(sub: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/parity")
        .join(sub)
}

fn models(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    v.sort();
    v
}

fn companion(model: &Path, what: &str) -> PathBuf {
    let stem = model.file_stem().unwrap().to_string_lossy();
    model.with_file_name(format!("{stem}.{what}.npz"))
}

fn load(model: &Path, arrays: &[InputArray], weights: bool) -> Graph {
    let cfg = ZooConfig {
        batch: npy::input_batch(arrays).unwrap_or(1),
        ..ZooConfig::default()
    };
    let opts = LoadOptions {
        weights,
        ..LoadOptions::default()
    };
    opsched::load_model_with(model.to_str().unwrap(), &cfg, &opts)
        .unwrap_or_else(|e| panic!("{}: {e}", model.display()))
}

/// How a model's outputs are computed: the reference executor, or a schedule on a device.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Executor {
    Reference,
    /// The CPU device under the named scheduler's schedule.
    CpuDevice(&'static str),
    /// The same with activations channels last (the layout a GPU runs by default).
    CpuChannelsLast(&'static str),
    /// The first CUDA GPU under the named scheduler's schedule, with TF32 tensor cores or in
    /// strict f32 (`--precise`).
    Cuda {
        tf32: bool,
        algo: &'static str,
    },
}

/// What TF32 costs: inputs of convolutions and matrix products rounded to 10-bit mantissas
/// (relative error about 5e-4 each), summed over a model's depth.
const TF32_TOLERANCE: f64 = 1e-2;

/// The model's outputs by name, computed by `exec`.
fn run(g: &Graph, inputs: HashMap<NodeId, Tensor>, exec: Executor) -> Vec<(String, Tensor)> {
    match exec {
        Executor::Reference => {
            let values =
                reference::reference_with(g, &inputs).unwrap_or_else(|e| panic!("{}: {e}", g.name));
            reference::outputs(g, &values).unwrap()
        }
        Executor::CpuDevice(_) | Executor::CpuChannelsLast(_) | Executor::Cuda { .. } => {
            let algo = match exec {
                Executor::CpuDevice(algo)
                | Executor::CpuChannelsLast(algo)
                | Executor::Cuda { algo, .. } => algo,
                Executor::Reference => "opara",
            };
            let s = schedule(g, algo);
            let mut opts = RunOptions {
                inputs: Arc::new(inputs),
                keep_outputs: true,
                warmup: 0,
                repeats: 1,
                ..Default::default()
            };
            if let Executor::CpuChannelsLast(_) = exec {
                opts.layout = Some(opsched::gpu::program::Layout::Nhwc);
            }
            let report = match exec {
                Executor::Cuda { tf32, .. } => {
                    opts.kernels.tf32 = tf32;
                    let dev = opsched::gpu::CudaDevice::open(Some(1)).unwrap();
                    opsched::runtime::run_schedule(&dev, g, &s, &opts)
                }
                _ => opsched::runtime::run_schedule(&CpuDevice::new(), g, &s, &opts),
            };
            report
                .unwrap_or_else(|e| panic!("{} on the device: {e}", g.name))
                .outputs
        }
    }
}

/// `g`'s schedule by scheduler `algo` for one H100 of four streams, under the analytical
/// model.
fn schedule(g: &Graph, algo: &str) -> opsched::schedule::Schedule {
    let platform = opsched::schedule::Platform {
        gpus: 1,
        streams: 4,
        device: opsched::cost::DevicePreset::by_name("h100").unwrap(),
        link: opsched::cost::LinkPreset::by_name("nvlink4").unwrap(),
    };
    let cost = opsched::cost::AnalyticalModel::new(platform.device.clone(), platform.link.clone());
    let (s, _) = opsched::scheduler(algo)
        .unwrap()
        .schedule(g, &platform, &cost)
        .unwrap();
    s
}

/// `(output, relative error)` of every output of one model.
fn relative_errors(model: &Path, exec: Executor) -> Vec<(String, f64)> {
    let arrays: Vec<InputArray> = npy::read_npz(&companion(model, "inputs"))
        .unwrap()
        .into_iter()
        .map(|(name, tensor)| InputArray {
            name: Some(name),
            path: companion(model, "inputs"),
            tensor,
        })
        .collect();
    let g = load(model, &arrays, true);
    assert!(!g.weights().is_empty(), "{}: no weights", model.display());
    let inputs = npy::bind_inputs(&g, arrays).unwrap();
    let ours = run(&g, inputs, exec);
    let want = npy::read_npz(&companion(model, "outputs")).unwrap();
    assert_eq!(ours.len(), want.len(), "{}: outputs", model.display());
    want.iter()
        .map(|(name, w)| {
            let (_, o) = ours
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("{}: no output '{name}'", model.display()));
            assert_eq!(o.shape, w.shape, "{}: output '{name}'", model.display());
            let scale = w.data.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
            let diff = o.data.iter().zip(w.data.iter()).fold(0f64, |m, (&a, &b)| {
                m.max((f64::from(a) - f64::from(b)).abs())
            });
            assert!(
                scale > 0.0 && diff.is_finite(),
                "{}: '{name}'",
                model.display()
            );
            (name.clone(), diff / scale)
        })
        .collect()
}

/// Every model of `dir` computed by `exec` matches onnxruntime within [`TOLERANCE`]
/// ([`TF32_TOLERANCE`] on a GPU with TF32).
fn check_all(dir: &Path, expected_models: usize, exec: Executor) {
    let tolerance = match exec {
        Executor::Cuda { tf32: true, .. } => TF32_TOLERANCE,
        _ => TOLERANCE,
    };
    let models = models(dir);
    assert_eq!(models.len(), expected_models, "{}", dir.display());
    let mut report = String::new();
    let mut failed = Vec::new();
    for m in &models {
        let name = m.file_stem().unwrap().to_string_lossy().into_owned();
        for (output, err) in relative_errors(m, exec) {
            report.push_str(&format!("{name:16} {output:50} {err:.2e}\n"));
            if err > tolerance {
                failed.push(format!("{name}: '{output}' {err:.2e}"));
            }
        }
    }
    eprintln!("{}:\n{report}", dir.display());
    assert!(
        failed.is_empty(),
        "beyond {tolerance}: {failed:?}\n{report}"
    );
}

#[test]
fn every_parity_model_matches_onnxruntime() {
    check_all(&dir(""), MODELS, Executor::Reference);
}

#[test]
fn held_out_models_match_onnxruntime() {
    check_all(&dir("heldout"), MODELS, Executor::Reference);
}

/// The CPU device under a four-stream Opara schedule, with the models' real weights and
/// inputs: the device's kernels (im2col + sgemm, broadcasts, pads), not the reference's loops.
#[test]
fn parity_models_on_the_cpu_device_match_onnxruntime() {
    check_all(&dir(""), MODELS, Executor::CpuDevice("opara"));
    check_all(&dir("heldout"), MODELS, Executor::CpuDevice("opara"));
}

/// The same channels last (what a GPU runs by default): the transposes at the layout's edges,
/// the channels-last convolutions, pools and concatenations, with real weights.
#[test]
fn parity_models_channels_last_match_onnxruntime() {
    check_all(&dir(""), MODELS, Executor::CpuChannelsLast("opara"));
    check_all(&dir("heldout"), MODELS, Executor::CpuChannelsLast("opara"));
    // The convolutions' values were channels last indeed.
    for name in ["conv_bn_relu", "inception", "residual", "squeeze_excite"] {
        let g = load(&dir("").join(format!("{name}.onnx")), &[], true);
        let opts = RunOptions {
            warmup: 0,
            repeats: 1,
            layout: Some(opsched::gpu::program::Layout::Nhwc),
            ..Default::default()
        };
        let r =
            opsched::runtime::run_schedule(&CpuDevice::new(), &g, &schedule(&g, "opara"), &opts)
                .unwrap();
        assert!(r.layout_conversions > 0, "{name}: nothing channels last");
    }
}

/// IOS's merge-only schedule on the CPU device, with the models' real weights: the merged
/// convolutions (Inception's 1x1 branches) and the merged query, key and value projections
/// of the exported attention blocks, their weights stacked from the ONNX initializers, match
/// onnxruntime; the attention blocks run their three projections as one product.
#[test]
fn merged_stages_with_real_weights_match_onnxruntime() {
    check_all(&dir(""), MODELS, Executor::CpuDevice("ios-merge"));
    for name in ["attention13", "attention17"] {
        let m = dir("").join(format!("{name}.onnx"));
        let g = load(&m, &[], true);
        let r = opsched::runtime::run_schedule(
            &CpuDevice::new(),
            &g,
            &schedule(&g, "ios-merge"),
            &RunOptions {
                warmup: 0,
                repeats: 1,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(r.merged_convolutions, 1, "{name}");
    }
}

/// On a GPU (`cargo xtask gpu-test`): strict f32 (`--precise`) meets the CPU's tolerance,
/// TF32 the stated [`TF32_TOLERANCE`].
#[test]
#[ignore = "needs a GPU: cargo xtask gpu-test"]
fn parity_models_on_the_gpu_match_onnxruntime() {
    for tf32 in [false, true] {
        let algo = "opara";
        check_all(&dir(""), MODELS, Executor::Cuda { tf32, algo });
        check_all(&dir("heldout"), MODELS, Executor::Cuda { tf32, algo });
        // Merged convolutions and merged projections (the attention blocks') too.
        let algo = "ios-merge";
        check_all(&dir(""), MODELS, Executor::Cuda { tf32, algo });
    }
}

/// Loading weights changes nothing of the graph's structure: the folds are decided on shapes.
#[test]
fn weights_do_not_change_the_graph() {
    for m in models(&dir("")) {
        let arrays: Vec<InputArray> = npy::read_npz(&companion(&m, "inputs"))
            .unwrap()
            .into_iter()
            .map(|(name, tensor)| InputArray {
                name: Some(name),
                path: m.clone(),
                tensor,
            })
            .collect();
        let (a, b) = (load(&m, &arrays, false), load(&m, &arrays, true));
        assert!(a.weights().is_empty());
        assert_eq!(
            opsched::graph::formats::json::to_string(&a),
            opsched::graph::formats::json::to_string(&b),
            "{}",
            m.display()
        );
    }
}

/// PyTorch's export of scaled_dot_product_attention scales the query and the transposed key
/// by the fourth root of 1 / head size before their product; a second product scales its
/// query by a scalar (`c * q`), divides its transposed key by one and is divided after it:
/// each scale becomes the product's alpha, with or without weights, and no element-wise
/// operator is left (the values are checked against onnxruntime above).
#[test]
fn attention_scales_fold_into_the_products() {
    for weights in [false, true] {
        let g = load(&dir("").join("sdpa.onnx"), &[], weights);
        let mut alphas: Vec<(String, f32)> = g
            .ops()
            .filter_map(|id| match g.node(id).op {
                opsched::graph::Op::BatchMatmul { alpha, .. } => {
                    Some((g.node(id).name.clone(), alpha))
                }
                _ => None,
            })
            .collect();
        alphas.sort_by(|a, b| a.0.cmp(&b.0));
        let head = 8f32;
        let want = [1.0 / head.sqrt(), 1.0, 0.0625];
        assert_eq!(alphas.len(), want.len(), "{alphas:?}");
        for ((name, got), want) in alphas.iter().zip(want) {
            assert!((got - want).abs() <= 1e-7, "{name}: {got} against {want}");
        }
        let elementwise = g
            .ops()
            .filter(|&id| g.node(id).op.type_name().starts_with("elementwise"))
            .count();
        assert_eq!(elementwise, 0);
    }
}
