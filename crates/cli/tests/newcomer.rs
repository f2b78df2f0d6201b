//! What a newcomer meets first: `--help` on every command (built from the registries, so it
//! lists exactly what is accepted), exact names with suggestions, per-device link defaults,
//! plural-aware lines and what `inspect` shows of a cost-annotated DAG.

#![allow(clippy::unwrap_used)]

mod common;

use common::{opsched, stdout};

/// The subcommands `opsched --help` lists.
fn commands() -> Vec<String> {
    let help = stdout(&opsched(&["--help"]));
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(String::from)
        .collect()
}

#[test]
fn every_command_answers_help_with_exit_0_and_does_nothing_else() {
    let cmds = commands();
    for c in [
        "models", "inspect", "schedule", "compare", "simulate", "viz", "profile", "run",
    ] {
        assert!(cmds.iter().any(|x| x == c), "{c} missing from {cmds:?}");
    }
    for c in &cmds {
        for flag in ["--help", "-h"] {
            let out = opsched(&[c, flag]);
            let text = stdout(&out);
            assert!(text.contains("Usage: opsched"), "{c} {flag}: {text}");
            assert!(out.stderr.is_empty(), "{c} {flag} wrote to stderr");
        }
    }
}

#[test]
fn help_lists_every_algorithm_device_link_and_cost_model_from_the_registries() {
    for cmd in ["schedule", "compare", "viz", "run"] {
        let help = stdout(&opsched(&[cmd, "--help"]));
        for s in opsched::schedulers() {
            let line = help
                .lines()
                .find(|l| l.split_whitespace().next() == Some(s.name))
                .unwrap_or_else(|| panic!("{cmd} --help lacks {}", s.name));
            assert!(line.contains(s.about), "{cmd}: {line}");
        }
        for d in opsched::cost::DevicePreset::all() {
            assert!(
                help.lines()
                    .any(|l| l.split_whitespace().next() == Some(d.name)
                        && l.contains(d.default_link.name)),
                "{cmd} --help lacks device {}",
                d.name
            );
        }
        for l in opsched::cost::LinkPreset::all() {
            assert!(help.contains(l.name), "{cmd} --help lacks link {}", l.name);
        }
        for k in opsched::CostKind::ALL {
            assert!(help.contains(k.about()), "{cmd} --help lacks cost {k}");
        }
    }
    // Short help stays short but still names h200.
    let short = stdout(&opsched(&["schedule", "-h"]));
    assert!(short.contains("h200"), "{short}");
}

#[test]
fn inspect_help_names_every_input_format_including_onnx() {
    let help = stdout(&opsched(&["inspect", "--help"]));
    assert!(help.contains("ONNX"), "{help}");
    for f in opsched::input_formats() {
        assert!(
            help.contains(f.name) && help.contains(f.about),
            "{}",
            f.name
        );
    }
    for m in opsched::zoo::models() {
        assert!(help.contains(m.name), "{}", m.name);
    }
}

#[test]
fn near_miss_names_exit_2_and_suggest_the_closest() {
    let cases: [(&[&str], &str); 8] = [
        (&["inspect", "inceptionv3"], "'inception_v3'"),
        (&["inspect", "resnet"], "'resnet50'"),
        (&["inspect", "bert"], "'transformer'"),
        (&["inspect", "squeeze"], "'squeezenet'"),
        (&["schedule", "squeezenet", "--algo", "IOS"], "'ios'"),
        (
            &[
                "schedule",
                "squeezenet",
                "--algo",
                "greedy",
                "--device",
                "H100",
            ],
            "'h100'",
        ),
        (
            &[
                "schedule",
                "squeezenet",
                "--algo",
                "greedy",
                "--link",
                "nvlink",
            ],
            "'nvlink2'",
        ),
        (
            &[
                "schedule",
                "squeezenet",
                "--algo",
                "greedy",
                "--cost",
                "analytic",
            ],
            "'analytical'",
        ),
    ];
    for (args, meant) in cases {
        let out = opsched(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} printed a result");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("did you mean") && err.contains(meant),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn the_link_defaults_to_the_devices_own_and_one_stream_is_singular() {
    let platform = |flags: &[&str]| {
        let args = [&["schedule", "squeezenet", "--algo", "sequential"], flags].concat();
        let text = stdout(&opsched(&args));
        let line = text
            .lines()
            .find(|l| l.starts_with("platform"))
            .unwrap_or_default();
        line.trim_start_matches("platform").trim().to_string()
    };
    for (device, link) in [
        ("k80", "pcie3"),
        ("v100", "nvlink2"),
        ("a40", "pcie4"),
        ("h200", "nvlink4"),
    ] {
        assert_eq!(
            platform(&["--device", device, "--streams", "1"]),
            format!("1 x {device}, 1 stream per GPU, {link}")
        );
    }
    // An explicit --link wins.
    assert_eq!(
        platform(&["--device", "k80", "--link", "nvlink3"]),
        "1 x k80, 8 streams per GPU, nvlink3"
    );
}

#[test]
fn inspect_of_a_cost_annotated_dag_shows_only_what_it_has() {
    let dir = std::env::temp_dir().join(format!("opsched-newcomer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("study.json");
    std::fs::write(
        &file,
        r#"{"format": "opsched-dag", "name": "study",
            "ops": [{"id": 1, "time_ms": 2.0, "util": 0.5}, {"id": 2, "time_ms": 1.0},
                    {"id": 3, "time_ms": 3.0, "util": 0.25}],
            "edges": [{"src": 1, "dst": 2, "transfer_ms": 0.5}, {"src": 1, "dst": 3}]}"#,
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let text = stdout(&opsched(&["inspect", path]));
    assert!(text.contains("study (cost-annotated)"), "{text}");
    assert!(
        text.contains("op time      6.0000 ms in all (mean util 0.583)"),
        "{text}"
    );
    assert!(text.contains("transfers    0.5000 ms in all"), "{text}");
    assert!(text.contains("width        2"), "{text}");
    for absent in ["FLOPs", "dtype", "params", "input", "bytes"] {
        assert!(!text.contains(absent), "{absent} in {text}");
    }
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&opsched(&["inspect", path, "--json"]))).unwrap();
    assert_eq!(v["ops"], 3);
    assert_eq!(v["op_time_ms"], 6.0);
    for absent in ["flops", "dtype", "params", "input_shapes"] {
        assert!(v.get(absent).is_none(), "{absent} in {v}");
    }
    // A model keeps its tensor figures.
    let text = stdout(&opsched(&["inspect", "squeezenet"]));
    assert!(
        text.contains("dtype") && !text.contains("cost-annotated"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
