//! docs/ten-minutes.md, run: every `opsched` command of its `sh` blocks must succeed (or exit 2
//! where the page says so), and every `console` block's output must be what the command prints,
//! except the columns that time the search. The commands are read from the page, so the page
//! and this test cannot drift apart.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One command of the page: its words, its expected exit code and, for a console block, the
/// output shown.
#[derive(Debug)]
struct Step {
    words: Vec<String>,
    exit: i32,
    shown: Option<String>,
}

/// The steps of a markdown page, in order. `sh` blocks: every line is a command; a trailing
/// `# exits N` comment sets the expected exit code. `console` blocks: a `$ ` line, then output.
fn steps(page: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut lines = page.lines();
    while let Some(line) = lines.next() {
        let kind = match line.trim() {
            "```sh" => "sh",
            "```console" => "console",
            _ => continue,
        };
        let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
        if kind == "sh" {
            for l in block.iter().filter(|l| !l.trim().is_empty()) {
                let (cmd, comment) = l.split_once('#').unwrap_or((l, ""));
                let exit = comment
                    .trim()
                    .strip_prefix("exits ")
                    .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                    .map_or(0, |n| n.parse().unwrap());
                steps.push(Step {
                    words: cmd.split_whitespace().map(String::from).collect(),
                    exit,
                    shown: None,
                });
            }
        } else {
            let (first, output) = block.split_first().expect("a console block has a command");
            let cmd = first
                .strip_prefix("$ ")
                .expect("a console block starts with `$ `");
            steps.push(Step {
                words: cmd.split_whitespace().map(String::from).collect(),
                exit: 0,
                shown: Some(output.iter().map(|l| format!("{l}\n")).collect()),
            });
        }
    }
    steps
}

/// Output with the machine-dependent figures blanked: the `schedule ms` column of comparison
/// tables and the search time of `schedule`.
fn stable(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let is_row = words.len() == 6 && words[2].ends_with('x');
            if is_row {
                format!(
                    "{} {} {} {} _ {}",
                    words[0], words[1], words[2], words[3], words[5]
                )
            } else if words.first() == Some(&"search") {
                "search _".to_string()
            } else {
                l.trim_end().to_string()
            }
        })
        .collect()
}

#[test]
fn every_command_of_the_ten_minute_page_runs_as_shown() {
    let root = repo();
    let page = std::fs::read_to_string(root.join("docs/ten-minutes.md")).unwrap();
    let steps = steps(&page);
    let mut ran = 0;
    for step in &steps {
        let line = step.words.join(" ");
        match step.words.first().map(String::as_str) {
            Some("opsched") => {}
            Some("mkdir") => {
                assert_eq!(step.words[1], "-p", "{line}");
                std::fs::create_dir_all(root.join(&step.words[2])).unwrap();
                continue;
            }
            // The setup the test has already done: the binary under test is built.
            Some("cargo") if line == "cargo build --release" => continue,
            Some("export") if line.starts_with("export PATH=") => continue,
            _ => panic!("the page has a command this test cannot run: {line}"),
        }
        let out = Command::new(env!("CARGO_BIN_EXE_opsched"))
            .args(&step.words[1..])
            .current_dir(&root)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(step.exit),
            "{line}\nstdout: {stdout}\nstderr: {stderr}"
        );
        if let Some(shown) = &step.shown {
            assert_eq!(stable(&stdout), stable(shown), "output of `{line}`");
        }
        ran += 1;
    }
    // The page's tour: models, inspect, a near miss, compare, schedule, simulate, viz, ONNX.
    assert!(ran >= 10, "only {ran} commands in {steps:?}");
    for (what, needle) in [
        ("ONNX import", ".onnx"),
        ("the HTML timeline", "--out target/tour/inception.html"),
        ("a near miss", "inceptionv3"),
    ] {
        assert!(
            steps.iter().any(|s| s.words.join(" ").contains(needle)),
            "the page lost {what}"
        );
    }
    let html = std::fs::read_to_string(root.join("target/tour/inception.html")).unwrap();
    assert!(html.contains("<svg") && html.contains("Download the Chrome trace"));
}

#[test]
fn the_page_parser_reads_commands_exit_codes_and_outputs() {
    let page = "text\n```sh\nmkdir -p x\nopsched inspect bad   # exits 2: no\n```\n\
                ```console\n$ opsched models\na  b\n```\n```rust\nnot a command\n```\n";
    let s = steps(page);
    assert_eq!(s.len(), 3, "{s:?}");
    assert_eq!(s[1].words, ["opsched", "inspect", "bad"]);
    assert_eq!(s[1].exit, 2);
    assert_eq!(s[2].shown.as_deref(), Some("a  b\n"));
    assert_eq!(
        stable("ios  1.6737  1.927x  1.000  22.4  1206\nsearch 1 ms\n"),
        ["ios 1.6737 1.927x 1.000 _ 1206", "search _"]
    );
}
