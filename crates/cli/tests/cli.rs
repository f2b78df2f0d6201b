//! End-to-end tests of the `opsched` binary: output, JSON, exit codes.

#![allow(clippy::unwrap_used)]

mod common;

use common::{opsched, scratch};
use std::process::Output;

fn stdout_json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON value")
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
    let dir = scratch("export");
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
    let v = stdout_json(&opsched(&["inspect", IOS_V100, "--json"]));
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

    let dir = scratch("bad");
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
    // More GPUs or streams than a platform holds: refused before any allocation.
    for args in [
        ["compare", "squeezenet", "--gpus", "257"],
        ["compare", "squeezenet", "--streams", "129"],
        ["simulate", "squeezenet", "--streams", "4294967295"],
    ] {
        let out = opsched(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("error: ") && err.contains("--"), "{err}");
    }
}

#[test]
fn a_spent_ios_budget_warns_and_still_gives_a_valid_schedule() {
    let out = opsched(&[
        "schedule",
        "inception_v3",
        "--algo",
        "ios",
        "--ios-budget",
        "1000",
        "--json",
    ]);
    let v = stdout_json(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("warning: ios on inception_v3: the search budget (1000 transitions)"),
        "{err}"
    );
    assert_eq!(v["stats"]["extra"]["budget_exhausted"], true);
    assert!(v["makespan_ms"].as_f64().unwrap() > 0.0);
    let out = opsched(&["schedule", "squeezenet", "--ios-budget", "0s"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid IOS budget '0s'"));
}

#[test]
fn help_has_examples() {
    let out = opsched(&["inspect", "--help"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Examples:"));
}

/// IOS's Inception-v3 graph with its V100 schedule (fixtures/ios, MIT licensed).
const IOS_V100: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/ios/v100.json");

fn one_line_error(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.starts_with("error: "), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    err
}

#[test]
fn schedule_sequential_json_reports_makespan_bound_and_schedule() {
    let v = stdout_json(&opsched(&[
        "schedule",
        "inception_v3",
        "--algo",
        "sequential",
        "--json",
    ]));
    for field in [
        "model",
        "algo",
        "device",
        "link",
        "gpus",
        "streams",
        "cost",
        "makespan_ms",
        "sequential_ms",
        "speedup",
        "lower_bound_ms",
        "critical_path_ms",
        "capacity_ms",
        "schedule_time_ms",
        "stats",
        "schedule",
    ] {
        assert!(v.get(field).is_some(), "field '{field}' missing from {v}");
    }
    assert_eq!(v["model"], "inception_v3");
    assert_eq!(v["algo"], "sequential");
    assert_eq!(v["device"], "h100");
    assert_eq!(v["link"], "nvlink4");
    assert_eq!(v["gpus"], 1);
    assert_eq!(v["streams"], 8);
    assert_eq!(v["cost"], "analytical");
    let makespan = v["makespan_ms"].as_f64().unwrap();
    let bound = v["lower_bound_ms"].as_f64().unwrap();
    assert!(makespan > 0.0, "{v}");
    assert!(makespan >= bound * (1.0 - 1e-9), "{makespan} < {bound}");
    assert!(bound >= v["critical_path_ms"].as_f64().unwrap() * (1.0 - 1e-12));
    assert!(bound >= v["capacity_ms"].as_f64().unwrap() * (1.0 - 1e-12));
    assert!((v["speedup"].as_f64().unwrap() - 1.0).abs() < 1e-9, "{v}");
    assert_eq!(v["sequential_ms"], v["makespan_ms"]);
    assert!(v["stats"]["wall_ms"].as_f64().is_some());
    assert_eq!(v["schedule"]["format"], "opsched-schedule");
    assert_eq!(v["schedule"]["shape"], "stages");
    assert_eq!(v["schedule"]["gpus"][0].as_array().unwrap().len(), 119);
}

#[test]
fn schedule_text_summary() {
    let out = opsched(&["schedule", "squeezenet", "--algo", "sequential"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for label in [
        "model",
        "algorithm",
        "makespan",
        "sequential",
        "lower bound",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(label)),
            "{label} missing:\n{text}"
        );
    }
}

#[test]
fn schedule_out_then_simulate_gives_the_same_makespan_and_exports() {
    let dir = scratch("sched-out");
    let file = dir.join("s.json");
    let trace = dir.join("t.json");
    let svg = dir.join("g.svg");
    let first = stdout_json(&opsched(&[
        "schedule",
        "inception_v3",
        "--algo",
        "sequential",
        "--json",
        "--out",
        file.to_str().unwrap(),
    ]));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(doc, first["schedule"], "--out writes the reported schedule");
    let sim = stdout_json(&opsched(&[
        "simulate",
        "inception_v3",
        file.to_str().unwrap(),
        "--json",
        "--trace",
        trace.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]));
    assert_eq!(sim["makespan_ms"], first["makespan_ms"]);
    assert_eq!(sim["lower_bound_ms"], first["lower_bound_ms"]);
    assert_eq!(sim["gpus"], 1);
    let per_gpu = sim["per_gpu"].as_array().unwrap();
    assert_eq!(per_gpu.len(), 1);
    assert_eq!(per_gpu[0]["ops"], 119);
    assert!(per_gpu[0]["busy_ms"].as_f64().unwrap() <= sim["makespan_ms"].as_f64().unwrap() + 1e-9);
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let x = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .count();
    assert_eq!(x, 119);
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.starts_with("<svg"));
    assert_eq!(svg_text.matches("<rect class=\"op\"").count(), 119);

    let out = opsched(&["simulate", "inception_v3", file.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.starts_with("makespan")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("GPU 0")), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn simulate_ios_fixture_stages() {
    let path = IOS_V100;
    let v = stdout_json(&opsched(&[
        "simulate", path, "ios", "--device", "v100", "--json",
    ]));
    assert_eq!(v["device"], "v100");
    assert_eq!(v["schedule"], "ios");
    assert_eq!(v["shape"], "stages");
    assert_eq!(v["gpus"], 1);
    assert_eq!(v["ops"], 102);
    let makespan = v["makespan_ms"].as_f64().unwrap();
    assert!(makespan > 0.0);
    assert!(makespan >= v["lower_bound_ms"].as_f64().unwrap() * (1.0 - 1e-9));

    // A zoo model carries no IOS stages.
    let err = one_line_error(&opsched(&["simulate", "googlenet", "ios"]));
    assert!(err.contains("IOS stages"), "{err}");
}

#[test]
fn simulate_refuses_a_schedule_naming_an_unknown_op() {
    let dir = scratch("unknown-op");
    let file = dir.join("s.json");
    std::fs::write(
        &file,
        r#"{"format": "opsched-schedule", "version": 1, "model": "squeezenet", "shape": "stages",
            "gpus": [[{"strategy": "concurrent", "groups": [["no_such_op"]]}]]}"#,
    )
    .unwrap();
    let err = one_line_error(&opsched(&[
        "simulate",
        "squeezenet",
        file.to_str().unwrap(),
    ]));
    assert!(
        err.contains("'no_such_op'") && err.contains("s.json"),
        "{err}"
    );

    // A schedule that leaves operators out is refused by the validator, also with exit 2.
    let sched = stdout_json(&opsched(&[
        "schedule",
        "squeezenet",
        "--algo",
        "sequential",
        "--json",
    ]));
    let mut doc = sched["schedule"].clone();
    doc["gpus"][0].as_array_mut().unwrap().pop();
    std::fs::write(&file, serde_json::to_string(&doc).unwrap()).unwrap();
    one_line_error(&opsched(&[
        "simulate",
        "squeezenet",
        file.to_str().unwrap(),
    ]));

    // More GPUs in the schedule than --gpus allows.
    let mut doc = sched["schedule"].clone();
    doc["gpus"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!([]));
    std::fs::write(&file, serde_json::to_string(&doc).unwrap()).unwrap();
    let err = one_line_error(&opsched(&[
        "simulate",
        "squeezenet",
        file.to_str().unwrap(),
        "--gpus",
        "1",
    ]));
    assert!(err.contains("2 GPUs"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn schedule_user_errors_exit_2_naming_the_problem() {
    let err = one_line_error(&opsched(&["schedule", "inception_v3", "--algo", "magic"]));
    assert!(
        err.contains("'magic'") && err.contains("sequential"),
        "{err}"
    );

    let err = one_line_error(&opsched(&[
        "schedule",
        "inception_v3",
        "--algo",
        "sequential",
        "--cost",
        "hios-sim",
    ]));
    assert!(err.contains("node '"), "{err}");

    let err = one_line_error(&opsched(&[
        "schedule",
        "inception_v3",
        "--algo",
        "sequential",
        "--cost",
        "guess",
    ]));
    assert!(
        err.contains("'guess'") && err.contains("analytical"),
        "{err}"
    );

    let err = one_line_error(&opsched(&[
        "schedule",
        "inception_v3",
        "--algo",
        "sequential",
        "--device",
        "abacus",
    ]));
    assert!(err.contains("'abacus'"), "{err}");

    let out = opsched(&[
        "schedule",
        "inception_v3",
        "--algo",
        "sequential",
        "--gpus",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_cost_annotated_dag_defaults_to_hios_sim() {
    let dir = scratch("dag");
    let file = dir.join("study.json");
    std::fs::write(
        &file,
        r#"{"format": "opsched-dag", "name": "study",
            "ops": [{"id": 1, "time_ms": 2.0, "util": 0.5}, {"id": 2, "time_ms": 1.0},
                    {"id": 3, "time_ms": 3.0, "util": 0.25}, {"id": 4, "time_ms": 1.5}],
            "edges": [{"src": 1, "dst": 2}, {"src": 1, "dst": 3, "transfer_ms": 0.5},
                      {"src": 2, "dst": 4}, {"src": 3, "dst": 4}]}"#,
    )
    .unwrap();
    let v = stdout_json(&opsched(&[
        "schedule",
        file.to_str().unwrap(),
        "--algo",
        "sequential",
        "--json",
    ]));
    assert_eq!(v["cost"], "hios-sim");
    assert_eq!(v["model"], "study");
    let makespan = v["makespan_ms"].as_f64().unwrap();
    assert!(
        (makespan - 7.5).abs() < 1e-9,
        "sequential = sum of times: {v}"
    );
    assert!(makespan >= v["lower_bound_ms"].as_f64().unwrap() * (1.0 - 1e-9));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn schedule_and_simulate_help_have_examples() {
    for cmd in ["schedule", "simulate"] {
        let out = opsched(&[cmd, "--help"]);
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Examples:"), "{cmd}");
        assert!(text.contains(&format!("opsched {cmd} ")), "{cmd}");
    }
}

#[test]
fn simulate_a_stream_plan_file() {
    let sched = stdout_json(&opsched(&[
        "schedule",
        "googlenet",
        "--algo",
        "sequential",
        "--json",
    ]));
    // The sequential order as one stream, and the same ops dealt onto two streams.
    let order: Vec<serde_json::Value> = sched["schedule"]["gpus"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|st| st["groups"][0][0].clone())
        .collect();
    let dir = scratch("streams");
    let file = dir.join("streams.json");
    let doc = serde_json::json!({"format": "opsched-schedule", "version": 1, "model": "googlenet",
        "shape": "streams", "gpus": [{"streams": [order], "launch_order": order}]});
    std::fs::write(&file, serde_json::to_string(&doc).unwrap()).unwrap();
    let v = stdout_json(&opsched(&[
        "simulate",
        "googlenet",
        file.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(v["shape"], "streams");
    assert_eq!(v["streams"], 1);
    let makespan = v["makespan_ms"].as_f64().unwrap();
    assert!(makespan > 0.0);
    assert!(makespan >= v["lower_bound_ms"].as_f64().unwrap() * (1.0 - 1e-9));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn compare_lists_every_algorithm_with_speedups_and_bounds() {
    let v = stdout_json(&opsched(&[
        "compare",
        "inception_v3",
        "--algos",
        "all",
        "--json",
    ]));
    let rows = v["rows"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().filter_map(|r| r["algo"].as_str()).collect();
    for want in ["sequential", "lios", "opara", "hios-lp"] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let bound = v["lower_bound"]["critical_path_ms"].as_f64().unwrap();
    let seq = v["sequential_ms"].as_f64().unwrap();
    for r in rows {
        let m = r["makespan_ms"].as_f64().unwrap();
        assert!(m >= bound * (1.0 - 1e-9), "{r}");
        assert!(
            (r["speedup"].as_f64().unwrap() - seq / m).abs() < 1e-9,
            "{r}"
        );
    }
    let seq_row = rows.iter().find(|r| r["algo"] == "sequential").unwrap();
    assert_eq!(seq_row["speedup"], 1.0);
}

#[test]
fn compare_writes_csv_and_markdown_and_rejects_unknown_names() {
    let dir = scratch("compare");
    let csv = dir.join("t.csv");
    let md = dir.join("t.md");
    let out = opsched(&[
        "compare",
        "squeezenet",
        "--algos",
        "sequential,lios",
        "--csv",
        csv.to_str().unwrap(),
        "--md",
        md.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.starts_with("lios ")), "{text}");
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(csv_text.lines().count(), 3, "header + 2 rows: {csv_text}");
    assert!(std::fs::read_to_string(&md).unwrap().contains("| lios |"));
    let out = opsched(&["compare", "squeezenet", "--algos", " , "]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--algos names no algorithm"));
    let out = opsched(&["compare", "squeezenet", "--algos", "lios,nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown scheduler 'nope'"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn viz_writes_svg_trace_and_html_from_the_extension() {
    let dir = scratch("viz");
    let svg = dir.join("inception.svg");
    let trace = dir.join("inception.json");
    let html = dir.join("inception.html");
    for path in [&svg, &trace, &html] {
        let v = stdout_json(&opsched(&[
            "viz",
            "inception_v3",
            "--algo",
            "ios",
            "--out",
            path.to_str().unwrap(),
            "--json",
        ]));
        assert_eq!(v["schedule"], "ios");
        assert!(v["speedup"].as_f64().unwrap() > 1.0);
        assert!(v["gap"].as_f64().unwrap() >= 1.0 - 1e-9);
    }
    assert_eq!(
        stdout_json(&opsched(&[
            "viz",
            "squeezenet",
            "--algo",
            "greedy",
            "--out",
            trace.to_str().unwrap(),
            "--json"
        ]))["format"],
        "json"
    );

    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.starts_with("<svg"), "{}", &svg_text[..80]);
    assert!(svg_text.trim_end().ends_with("</svg>"));

    // The Chrome trace: one complete ("X") event per operator of the drawn model.
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let ops = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] != "transfer")
        .count();
    assert_eq!(ops, 50, "squeezenet has 50 operators");

    // The HTML page carries the chart and a trace that parses, and fetches nothing.
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(page.contains("<svg"));
    assert!(
        !page.contains("<script src"),
        "the page must be self-contained"
    );
    let start = page.find(r#"id="trace-data">"#).unwrap() + r#"id="trace-data">"#.len();
    let end = start + page[start..].find("</script>").unwrap();
    let embedded: serde_json::Value = serde_json::from_str(&page[start..end]).unwrap();
    let embedded_ops = embedded["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .count();
    assert_eq!(embedded_ops, 119, "inception_v3 has 119 operators");
}

#[test]
fn viz_draws_a_schedule_file_and_rejects_unknown_formats() {
    let dir = scratch("viz-file");
    let s = dir.join("s.json");
    let out = opsched(&[
        "schedule",
        "googlenet",
        "--algo",
        "lios",
        "--out",
        s.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let scheduled = stdout_json(&opsched(&[
        "schedule",
        "googlenet",
        "--algo",
        "lios",
        "--json",
    ]));
    let drawn = stdout_json(&opsched(&[
        "viz",
        "googlenet",
        "--schedule",
        s.to_str().unwrap(),
        "--out",
        dir.join("g.svg").to_str().unwrap(),
        "--json",
    ]));
    let (a, b) = (
        scheduled["makespan_ms"].as_f64().unwrap(),
        drawn["makespan_ms"].as_f64().unwrap(),
    );
    assert!((a - b).abs() <= 1e-9 * a, "{a} vs {b}");

    let bad = opsched(&[
        "viz",
        "googlenet",
        "--algo",
        "ios",
        "--out",
        dir.join("g.png").to_str().unwrap(),
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(one_line_error(&bad).contains("g.png"));
    let neither = opsched(&["viz", "googlenet", "--out", "x.svg"]);
    assert_eq!(neither.status.code(), Some(2));
}

#[test]
fn profile_and_run_on_cuda_without_a_driver_name_the_missing_library() {
    for args in [
        &[
            "profile",
            "squeezenet",
            "--backend",
            "cuda",
            "--repeats",
            "2",
        ][..],
        &[
            "run",
            "squeezenet",
            "--backend",
            "cuda",
            "--algo",
            "ios",
            "--repeats",
            "2",
        ][..],
    ] {
        let out = opsched(args);
        if out.status.success() {
            continue; // a machine with a GPU: the GPU tests cover the run itself
        }
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = one_line_error(&out);
        assert!(
            err.contains("could not be loaded") || err.contains("no CUDA"),
            "{args:?}: {err}"
        );
        assert!(
            err.contains("LD_LIBRARY_PATH") || err.contains("device"),
            "{err}"
        );
    }
}

/// One small LIOS run of `model` on the CPU backend (input 32, one timed run), with `extra`
/// flags.
fn small_cpu_run(model: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "run",
        model,
        "--backend",
        "cpu",
        "--algo",
        "lios",
        "--input-size",
        "32",
        "--warmup",
        "0",
        "--repeats",
        "1",
    ];
    args.extend_from_slice(extra);
    opsched(&args)
}

/// Without `--algo`, `run` runs the schedule the cost model simulates fastest (`best`), says
/// which and by how much in the text report, and names it in the JSON one; an algorithm given
/// is named as it is.
#[test]
fn run_picks_the_best_schedule_unless_told() {
    fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        let mut a = vec!["run", "googlenet", "--backend", "cpu", "--input-size", "32"];
        a.extend_from_slice(&["--warmup", "0", "--repeats", "1", "--graph-capture"]);
        a.extend_from_slice(extra);
        a
    }
    let v = stdout_json(&opsched(&args(&["--json"])));
    let picked = v["schedule"].as_str().unwrap().to_string();
    let algo = picked.strip_prefix("best: ").expect("best: NAME");
    // GoogLeNet's branches run side by side in a captured graph: not the sequential plan.
    assert!(opsched::BEST_CANDIDATES.contains(&algo), "{picked}");
    let out = opsched(&args(&[]));
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("schedule       {picked} (simulated "))
            && text.contains("sequential "),
        "{text}"
    );
    let v = stdout_json(&small_cpu_run("squeezenet", &["--json"]));
    assert_eq!(v["schedule"], "lios");
}

#[test]
fn run_leaves_out_the_fusions_named_with_the_same_values() {
    let run = |extra: &[&str]| small_cpu_run("randwire", &[&["--check"], extra].concat());
    let kernels = |extra: &[&str]| {
        let out = run(&[&["--json"], extra].concat());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v = stdout_json(&out);
        assert_eq!(v["check"]["passed"], true, "{extra:?}");
        let left_out: Vec<String> = v["fusions_left_out"]
            .as_array()
            .map(|a| a.iter().map(|n| n.as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        (v["kernels"].as_u64().unwrap(), left_out)
    };
    // By default the depthwise kernel does not read the sums (it measured slower); put in,
    // RandWire's sums launch no add kernels.
    let (default, default_left_out) = kernels(&[]);
    assert_eq!(default_left_out, ["sum-into-depthwise"]);
    let text = String::from_utf8_lossy(&run(&[]).stdout).to_string();
    assert!(!text.contains("fusions "), "{text}");
    let text =
        String::from_utf8_lossy(&run(&["--fusion", "sum-into-depthwise"]).stdout).to_string();
    assert!(text.contains("fusions        every one in"), "{text}");
    let (all, none_left_out) = kernels(&["--fusion", "sum-into-depthwise"]);
    assert!(none_left_out.is_empty());
    assert!(all < default, "{all} vs {default}");
    // RandWire's depthwise kernels take biases: each of those fusions left out adds kernels.
    for name in ["bias-into-adds", "bias-into-depthwise"] {
        let (fewer_fusions, left_out) = kernels(&["--no-fusion", name]);
        assert!(
            fewer_fusions > default,
            "{name}: {fewer_fusions} vs {default}"
        );
        assert_eq!(left_out, [name, "sum-into-depthwise"]);
    }
    let out = run(&["--no-fusion", "bias-into-adds"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("fusions        left out: bias-into-adds, sum-into-depthwise"),
        "{text}"
    );
    // One name both put in and left out: exit 2, naming it.
    let out = run(&[
        "--fusion",
        "bias-into-adds",
        "--no-fusion",
        "bias-into-adds",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--fusion bias-into-adds and --no-fusion"),
        "{err}"
    );
    // A name that is none: exit 2, naming the ones there are.
    let out = run(&["--no-fusion", "bias"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("'bias'") && err.contains("bias-into-depthwise"),
        "{err}"
    );
}

#[test]
fn run_on_the_cpu_backend_executes_and_checks_the_plan() {
    let out = opsched(&[
        "run",
        "squeezenet",
        "--backend",
        "cpu",
        "--algo",
        "hios-mr",
        "--gpus",
        "2",
        "--graph-capture",
        "--check",
        "--input-size",
        "32",
        "--warmup",
        "0",
        "--repeats",
        "2",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = stdout_json(&out);
    assert_eq!(v["device"]["backend"], "cpu");
    assert_eq!(v["logical_gpus"], 2);
    assert_eq!(v["check"]["passed"], true);
    assert_eq!(v["check"]["vs_sequential"], 0.0);
    assert!(v["check"]["vs_reference"].as_f64().unwrap() < 1e-4);
    assert_eq!(v["latency"]["samples"], 2);
    // One small run, with `extra` flags.
    let run = |extra: &[&str]| small_cpu_run("squeezenet", extra);
    // The text report says which backend ran.
    let out = run(&[]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("cpu backend"), "{text}");
    assert!(text.contains("MB of buffers"), "{text}");
    // Shared storage: less memory than every buffer on its own, which --no-memory-reuse gives.
    let memory = |extra: &[&str]| {
        let v = stdout_json(&run(&[&["--json"], extra].concat()));
        let n = |k: &str| v[k].as_u64().unwrap();
        (n("peak_memory_bytes"), n("buffer_bytes"), n("weight_bytes"))
    };
    let (shared, distinct, weights) = memory(&[]);
    assert!(
        weights < shared && shared < distinct,
        "{shared} {distinct} {weights}"
    );
    let (alone, distinct_too, _) = memory(&["--no-memory-reuse"]);
    assert!(
        alone <= distinct_too && alone > shared,
        "{alone} {distinct_too}"
    );
    // The CPU has one unit.
    let out = opsched(&["profile", "squeezenet", "--backend", "cpu", "--gpu", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(one_line_error(&out).contains("--gpu 1"));
}

/// `--op-times`: every launch's time in the JSON report, in launch order, each operator named
/// once; the text report by operator type and the slowest launches; none without the flag.
#[test]
fn run_reports_each_launch_time_when_asked() {
    let out = small_cpu_run("squeezenet", &["--op-times", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = stdout_json(&out);
    let times = v["op_times"].as_array().unwrap();
    assert_eq!(times.len() as u64, v["launches"].as_u64().unwrap());
    let mut named: Vec<&str> = times
        .iter()
        .flat_map(|t| t["nodes"].as_array().unwrap())
        .map(|n| n.as_str().unwrap())
        .collect();
    let ops = named.len();
    named.sort_unstable();
    named.dedup();
    assert_eq!(named.len(), ops, "an operator in two launches");
    for t in times {
        assert_eq!(t["time"]["samples"], 1);
        assert!(t["time"]["median_ms"].as_f64().unwrap() >= 0.0);
        assert!(!t["op"].as_str().unwrap().is_empty());
    }
    let text =
        String::from_utf8_lossy(&small_cpu_run("squeezenet", &["--op-times"]).stdout).into_owned();
    assert!(
        text.contains("op times") && text.contains("conv2d"),
        "{text}"
    );
    assert!(text.contains("slowest"), "{text}");
    let plain = stdout_json(&small_cpu_run("squeezenet", &["--json"]));
    assert!(plain.get("op_times").is_none());
}

/// Several `--schedule` files run one after another in one process: one report each, in
/// order (a JSON array), each its own schedule's; `--output` takes one.
#[test]
fn run_takes_several_schedule_files() {
    let dir = scratch("several");
    let files: Vec<String> = ["sequential", "lios"]
        .iter()
        .map(|algo| {
            let path = dir.join(format!("{algo}.json"));
            let p = path.to_str().unwrap();
            let out = opsched(&[
                "schedule",
                "squeezenet",
                "--algo",
                algo,
                "--input-size",
                "32",
                "--out",
                p,
            ]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            p.to_string()
        })
        .collect();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "squeezenet",
            "--backend",
            "cpu",
            "--input-size",
            "32",
        ];
        args.extend_from_slice(&["--warmup", "0", "--repeats", "1"]);
        for f in &files {
            args.extend_from_slice(&["--schedule", f.as_str()]);
        }
        args.extend_from_slice(extra);
        opsched(&args)
    };
    let out = run(&["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = stdout_json(&out);
    let reports = v.as_array().expect("an array of reports");
    assert_eq!(reports.len(), 2);
    // Each report names its schedule file.
    for (r, f) in reports.iter().zip(&files) {
        assert_eq!(r["schedule"], f.as_str());
    }
    // The sequential plan waits for nothing; LIOS's streams do.
    assert_eq!(reports[0]["waits"], 0);
    assert!(reports[1]["waits"].as_u64().unwrap() > 0, "{}", reports[1]);
    let text = String::from_utf8_lossy(&run(&[]).stdout).to_string();
    assert_eq!(text.matches("latency ").count(), 2, "{text}");
    assert!(
        text.find(&files[0]).unwrap() < text.find(&files[1]).unwrap(),
        "{text}"
    );
    let out = run(&["--output", dir.join("y.npy").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(one_line_error(&out).contains("give one --schedule"));
    assert!(!dir.join("y.npy").exists());
}

#[test]
fn piped_output_has_no_progress_bar() {
    let out = opsched(&["compare", "squeezenet", "--algos", "ios,lios"]);
    assert!(out.status.success());
    assert!(
        out.stderr.is_empty(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains('\u{1b}'),
        "no terminal escapes in piped output"
    );
}

#[test]
fn a_file_error_is_said_once() {
    let dir = scratch("broken");
    let path = dir.join("broken.json");
    std::fs::write(&path, "garbage").unwrap();
    let out = opsched(&["inspect", path.to_str().unwrap()]);
    let err = one_line_error(&out);
    assert!(err.contains("broken.json"), "{err}");
    assert_eq!(err.matches("expected value").count(), 1, "{err}");
}

/// Real inference: an ONNX model with its weights, inputs from .npy files, outputs to an
/// .npz, on the CPU device under a multi-stream schedule (and under IOS's merge, whose merged
/// convolution is built from the real weights), equals onnxruntime's outputs.
#[test]
fn run_an_onnx_model_with_inputs_and_outputs_on_the_cpu() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/parity");
    let dir = scratch("infer");
    for (model, algo) in [
        ("inception", "lios"),
        ("squeeze_excite", "lios"),
        ("inception", "ios-merge"),
    ] {
        let inputs = opsched::npy::read_npz(&fixtures.join(format!("{model}.inputs.npz"))).unwrap();
        let mut args: Vec<String> = [
            "run",
            "",
            "--backend",
            "cpu",
            "--algo",
            algo,
            "--check",
            "--warmup",
            "0",
            "--repeats",
            "1",
            "--output",
            "",
        ]
        .map(String::from)
        .to_vec();
        args[1] = fixtures.join(format!("{model}.onnx")).display().to_string();
        let out_path = dir.join(format!("{model}.out.npz"));
        args[12] = out_path.display().to_string();
        for (name, t) in &inputs {
            let path = dir.join(format!("{model}-in{}.npy", args.len()));
            let bytes = opsched::npy::encode_outputs(&path, &[(name.clone(), t.clone())]).unwrap();
            std::fs::write(&path, bytes).unwrap();
            args.push("--input".into());
            args.push(format!("{name}={}", path.display()));
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = opsched(&argv);
        assert!(
            out.status.success(),
            "{model}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("PASSED"), "{stdout}");
        if algo == "ios-merge" {
            assert!(stdout.contains("ran as one convolution"), "{stdout}");
        }
        let got = opsched::npy::read_npz(&out_path).unwrap();
        let want = opsched::npy::read_npz(&fixtures.join(format!("{model}.outputs.npz"))).unwrap();
        assert_eq!(got.len(), want.len(), "{model}");
        for (name, w) in &want {
            let (_, g) = got.iter().find(|(n, _)| n == name).unwrap();
            assert_eq!(g.shape, w.shape, "{model}: {name}");
            let scale = w.data.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
            let diff = g
                .data
                .iter()
                .zip(w.data.iter())
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                diff / scale <= 1e-4,
                "{model}: '{name}' differs by {}",
                diff / scale
            );
        }
    }
    // A wrong input name and a wrong shape name the input; exit 2.
    let x = dir.join("x.npy");
    let t = opsched::graph::Tensor::new(vec![1, 2], vec![0.0, 1.0]).unwrap();
    std::fs::write(
        &x,
        opsched::npy::encode_outputs(&x, &[("x".into(), t)]).unwrap(),
    )
    .unwrap();
    let model = fixtures.join("mlp.onnx").display().to_string();
    for input in [format!("nosuch={}", x.display()), x.display().to_string()] {
        let out = opsched(&[
            "run",
            &model,
            "--backend",
            "cpu",
            "--algo",
            "lios",
            "--input",
            &input,
        ]);
        assert_eq!(out.status.code(), Some(2), "{input}");
        let err = one_line_error(&out);
        assert!(err.contains("nosuch") || err.contains("shape"), "{err}");
    }
}

/// Node and model names that try to break out of the page: the HTML keeps exactly its own two
/// script elements, the data block holds no markup, and the names read back from it and from
/// the SVG unchanged.
#[test]
fn viz_html_escapes_hostile_names() {
    let dir = scratch("viz-escape");
    let names = [
        "</script><script>alert(1)</script>",
        "<!--<script>",
        "a&b\"'<x>",
    ];
    let nodes: Vec<serde_json::Value> = names
        .iter()
        .map(|n| serde_json::json!({"name": n, "op": {"type": "abstract", "time_ms": 1.0, "util": 0.5}}))
        .collect();
    let graph = serde_json::json!({"format": "opsched-graph", "version": 1,
        "name": "</title><script>x</script>", "nodes": nodes});
    let path = dir.join("g.json");
    std::fs::write(&path, graph.to_string()).unwrap();
    let html = dir.join("g.html");
    let out = opsched(&[
        "viz",
        path.to_str().unwrap(),
        "--algo",
        "greedy",
        "--out",
        html.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(page.matches("<script").count(), 2, "{page}");
    assert_eq!(page.matches("</script>").count(), 2, "{page}");
    assert!(!page.contains("<!--"));
    let start = page.find("id=\"trace-data\">").unwrap() + "id=\"trace-data\">".len();
    let data = &page[start..start + page[start..].find("</script>").unwrap()];
    assert!(!data.contains(['<', '>', '&']), "{data}");
    let trace: serde_json::Value = serde_json::from_str(data).unwrap();
    let events: Vec<&str> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    for n in names {
        assert!(events.contains(&n), "{n} not in {events:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Usage errors (clap's) are one `error:` line with exit 2, naming the flag or argument;
/// `--help` still prints the whole help and exits 0.
#[test]
fn usage_errors_are_one_line() {
    for (args, names) in [
        (&["compare", "inception_v3", "--gpus", "0"][..], "--gpus"),
        (&["compare", "inception_v3", "--nosuch"][..], "--nosuch"),
        (&["run"][..], "<MODEL>"),
        (
            &["schedule", "inception_v3", "--streams", "x"][..],
            "--streams",
        ),
    ] {
        let err = one_line_error(&opsched(args));
        assert!(err.contains(names), "{args:?}: {err}");
    }
    let help = opsched(&["run", "--help"]);
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).lines().count() > 10);
}

/// Profiling on the CPU reads an ONNX model's weights: RoBERTa's position ids, computed at run
/// time from the token ids and constants (the `positions` parity model), are then rows of
/// their table (with pseudo-random constants they were not, and the lookup refused them).
#[test]
fn profile_on_the_cpu_computes_indices_from_the_real_constants() {
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/parity/positions.onnx");
    let dir = scratch("profile-positions");
    let cache = dir.join("cache.json");
    let out = opsched(&[
        "profile",
        model.to_str().unwrap(),
        "--backend",
        "cpu",
        "--stages-from",
        "none",
        "--warmup",
        "0",
        "--repeats",
        "1",
        "--cache",
        cache.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ops = report["ops"].as_array().unwrap();
    assert!(
        ops.iter()
            .any(|o| o["signature"].as_str().unwrap().starts_with("cum_sum")),
        "{report}"
    );
}
