//! The `opsched` binary on ONNX files: inspect, compare, the batch size of a dynamic batch,
//! and the error for unsupported operators.

#![allow(clippy::unwrap_used)]

mod common;

use common::opsched;
use std::process::Output;

fn fixture(name: &str) -> String {
    format!("{}/../../fixtures/onnx/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn inspect_and_compare_an_onnx_export() {
    let v = json(&opsched(&[
        "inspect",
        &fixture("torchvision/resnet50.onnx"),
        "--json",
    ]));
    assert_eq!(
        (v["ops"].as_u64(), v["edges"].as_u64()),
        (Some(89), Some(104))
    );
    let out = opsched(&[
        "compare",
        &fixture("torchvision/googlenet.onnx"),
        "--algos",
        "sequential,lios",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("googlenet (82 operators)") && text.contains("lios"),
        "{text}"
    );
}

#[test]
fn batch_applies_to_a_dynamic_batch_dimension() {
    let one = json(&opsched(&[
        "inspect",
        &fixture("dynamic_batch.onnx"),
        "--json",
    ]));
    let four = json(&opsched(&[
        "inspect",
        &fixture("dynamic_batch.onnx"),
        "--batch",
        "4",
        "--json",
    ]));
    assert_eq!(four["input_shapes"][0][0].as_u64(), Some(4));
    assert_eq!(
        four["flops"].as_u64().unwrap(),
        4 * one["flops"].as_u64().unwrap()
    );
}

#[test]
fn unsupported_operators_exit_2_with_the_list() {
    let out = opsched(&["inspect", &fixture("unsupported.onnx")]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unsupported.onnx")
            && err.contains("DepthToSpace x2, LRN x1, com.example.Custom x1"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn allow_unknown_imports_unsupported_operators_as_opaque() {
    let path = fixture("unsupported.onnx");
    let v = json(&opsched(&["inspect", &path, "--allow-unknown", "--json"]));
    assert_eq!(v["ops"], 6);
    assert_eq!(v["op_types"]["opaque"], 4);
    // Opaque operators are scheduled like any other.
    let c = json(&opsched(&[
        "compare",
        &path,
        "--allow-unknown",
        "--algos",
        "sequential,ios,lios",
        "--json",
    ]));
    assert_eq!(c["rows"].as_array().unwrap().len(), 3);
}
