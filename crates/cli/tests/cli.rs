//! End-to-end tests of the `opsched` binary: output, JSON, exit codes.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

fn opsched(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_opsched"))
        .args(args)
        .output()
        .expect("the opsched binary runs")
}

fn stdout_json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON value")
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("opsched-cli-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn models_json_lists_every_zoo_model_with_counts() {
    let v = stdout_json(&opsched(&["models", "--json"]));
    let rows = v.as_array().expect("an array");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    for want in [
        "inception_v3",
        "squeezenet",
        "randwire",
        "nasnet",
        "resnet50",
        "googlenet",
        "transformer",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let inception = rows
        .iter()
        .find(|r| r["name"] == "inception_v3")
        .expect("inception");
    assert_eq!(inception["ops"], 119);
    assert_eq!(inception["edges"], 153);
    assert_eq!(
        inception["input_shape"],
        serde_json::json!([1, 3, 299, 299])
    );
}

#[test]
fn models_table_is_aligned_text() {
    let out = opsched(&["models"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().next().is_some_and(|l| l.starts_with("model")));
    assert!(text
        .lines()
        .any(|l| l.starts_with("squeezenet") && l.contains(" 50 ")));
}

#[test]
fn inspect_inception_json() {
    let v = stdout_json(&opsched(&["inspect", "inception_v3", "--json"]));
    assert_eq!(v["ops"], 119);
    assert_eq!(v["edges"], 153);
    assert!(v["flops"].as_u64().is_some_and(|f| f > 5_000_000_000));
    assert!(v["depth"].as_u64().is_some_and(|d| d > 10 && d < 119));
    assert!(v["width"].as_u64().is_some_and(|w| w >= 6));
}

#[test]
fn inspect_batch_scales_flops() {
    let one = stdout_json(&opsched(&["inspect", "squeezenet", "--json"]));
    let many = stdout_json(&opsched(&[
        "inspect",
        "squeezenet",
        "--json",
        "--batch",
        "8",
    ]));
    assert_eq!(
        many["flops"].as_u64().unwrap(),
        8 * one["flops"].as_u64().unwrap()
    );
    assert_eq!(many["input_shapes"][0][0], 8);
}

#[test]
fn inspect_exports_and_reloads_a_graph_file() {
    let dir = temp_dir("export");
    let json = dir.join("g.json");
    let dot = dir.join("g.dot");
    let first = stdout_json(&opsched(&[
        "inspect",
        "googlenet",
        "--json",
        "--export",
        json.to_str().unwrap(),
        "--dot",
        dot.to_str().unwrap(),
    ]));
    let again = stdout_json(&opsched(&["inspect", json.to_str().unwrap(), "--json"]));
    assert_eq!(
        first, again,
        "a graph file inspects exactly like the model it came from"
    );
    let dot_text = std::fs::read_to_string(&dot).unwrap();
    assert!(dot_text.starts_with("digraph"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn inspect_ios_fixture() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/fixtures/ios/v100.json"
    );
    if !std::path::Path::new(path).exists() {
        eprintln!("skipping: {path} is not present");
        return;
    }
    let v = stdout_json(&opsched(&["inspect", path, "--json"]));
    assert!(v["ops"].as_u64().is_some_and(|n| n > 90));
    assert_eq!(v["blocks"], 13);
}

#[test]
fn user_errors_exit_2_with_one_line() {
    let out = opsched(&["inspect", "no_such_model"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: unknown model 'no_such_model'"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    let dir = temp_dir("bad");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"format\": \"opsched-graph\", \"version\": 1, \"name\": \"b\", \"nodes\": [{\"name\": \"a\", \"op\": {\"type\": \"identity\"}, \"inputs\": [\"ghost\"]}]}").unwrap();
    let out = opsched(&["inspect", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.json") && err.contains("node 'a'") && err.contains("ghost"),
        "{err}"
    );

    std::fs::write(&bad, "{ oops").unwrap();
    let out = opsched(&["inspect", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.json"));

    let out = opsched(&["inspect", "inception_v3", "--input-size", "10"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();

    let out = opsched(&["inspect", "inception_v3", "--batch", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let out = opsched(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn help_has_examples() {
    let out = opsched(&["inspect", "--help"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Examples:"));
}
