//! How far TF32 (the GPU's default math for convolutions and products) takes the zoo models'
//! values: the reference with every product's operands rounded to TF32 against strict `f32`.
//! The GPU check compares a run with the reference at 2e-2 (`opsched_runtime`'s TF32
//! tolerance); a model whose values TF32 alone moves further cannot pass it on any GPU, which
//! is what happened to the zoo Transformer's unscaled attention scores on an H100 (2026-11-27).
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use opsched_gpu::reference::{reference_in, scaled_error, tf32, Math};
use opsched_graph::formats::{self, json};
use opsched_graph::zoo::{self, ZooConfig};
use opsched_graph::{DType, Graph};

/// The GPU check's tolerance against the reference with TF32 on.
const TF32_TOLERANCE: f64 = 2e-2;

/// Small inputs, as the GPU tests run them, so that the reference stays fast.
fn small(name: &str) -> Graph {
    let size = match name {
        "inception_v3" => 75,
        "transformer" => 16,
        _ => 32,
    };
    let cfg = ZooConfig {
        batch: 1,
        input_size: Some(size),
        dtype: DType::F32,
    };
    zoo::build(name, &cfg).unwrap()
}

/// The largest scaled difference over every operator's values between TF32 and strict `f32`
/// products, and where.
fn tf32_error(g: &Graph) -> (f64, String) {
    let inputs = HashMap::new();
    let exact = reference_in(g, &inputs, Math::F32).unwrap();
    let rounded = reference_in(g, &inputs, Math::Tf32).unwrap();
    let mut worst = (0.0, String::new());
    for id in g.ops() {
        if let (Some(a), Some(b)) = (&rounded[id.index()], &exact[id.index()]) {
            let e = scaled_error(a, b);
            if e > worst.0 {
                worst = (e, g.node(id).name.clone());
            }
        }
    }
    worst
}

#[test]
fn tf32_rounds_to_ten_mantissa_bits_to_nearest_ties_away() {
    let ulp = 2f32.powi(-10);
    assert_eq!(tf32(1.0), 1.0);
    assert_eq!(tf32(1.0 + ulp), 1.0 + ulp);
    // Below half an ulp down, half an ulp and above up (ties away from zero), both signs.
    assert_eq!(tf32(1.0 + 0.49 * ulp), 1.0);
    assert_eq!(tf32(1.0 + 0.5 * ulp), 1.0 + ulp);
    assert_eq!(tf32(-(1.0 + 0.5 * ulp)), -(1.0 + ulp));
    assert_eq!(tf32(1.0 + 1.51 * ulp), 1.0 + 2.0 * ulp);
    assert_eq!(tf32(f32::INFINITY), f32::INFINITY);
    assert!(tf32(f32::NAN).is_nan());
    for x in [0.1f32, -3.7, 1e-20, 6.5e4, 123_456.79] {
        let r = tf32(x);
        assert_eq!(r.to_bits() & 0x1fff, 0, "{x}");
        assert!(((r - x) / x).abs() <= 2f32.powi(-11), "{x} -> {r}");
    }
}

/// Every zoo model stays within the GPU check's tolerance under TF32, so a GPU run that fails
/// the check has a bug, not a model TF32 cannot compute.
#[test]
fn tf32_keeps_every_zoo_model_within_the_checks_tolerance() {
    let mut report = Vec::new();
    for spec in zoo::models() {
        let (e, node) = tf32_error(&small(spec.name));
        report.push(format!("{}: {e:.1e} at '{node}'", spec.name));
        assert!(e > 0.0, "{}: TF32 changed nothing", spec.name);
        assert!(e <= TF32_TOLERANCE / 4.0, "{}", report.join("; "));
    }
    println!("{}", report.join("\n"));
}

/// The Transformer as it was before its scores were scaled (alpha 1): logits of standard
/// deviation 8, near one-hot softmaxes that TF32's rounding flips between tokens.
#[test]
fn unscaled_attention_scores_are_beyond_what_tf32_can_check() {
    let g = small("transformer");
    let text = json::to_string(&g).replace("\"alpha\": 0.125,", "");
    let unscaled = formats::from_str(&text).unwrap();
    let (scaled_e, _) = tf32_error(&g);
    let (e, node) = tf32_error(&unscaled);
    println!("unscaled: {e:.1e} at '{node}' (scaled {scaled_e:.1e})");
    assert!(e > TF32_TOLERANCE, "{e:.1e} at '{node}'");
    assert!(e > 20.0 * scaled_e, "{e:.1e} against {scaled_e:.1e} scaled");
}
