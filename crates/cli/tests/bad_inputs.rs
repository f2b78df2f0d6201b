//! The regression corpus of bad inputs (`fixtures/bad/`, its README says the convention):
//! every case found there runs through the `opsched` binary and must end with exit code 2 and a
//! one-line `error:` naming the file, without a panic, within 20 s and 4 GiB.

#![cfg(unix)]
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Per folder: the extension of its cases and the command that runs one (`{case}`: the file).
const COMMANDS: &[(&str, &str, &str)] = &[
    ("graph", "json", "inspect {case}"),
    ("dag", "json", "inspect {case}"),
    ("ios", "json", "inspect {case}"),
    ("onnx", "onnx", "inspect {case}"),
    ("schedule", "json", "simulate squeezenet {case}"),
    (
        "cache",
        "bin",
        "schedule squeezenet --algo greedy --cost cache --cache {case}",
    ),
];

/// Folders whose cases the command may change (a corrupt cache is moved aside).
const MAY_WRITE: &[&str] = &["cache"];

const TIME_LIMIT: Duration = Duration::from_secs(20);
const MEMORY_LIMIT_KB: u64 = 4 << 20;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/bad")
}

/// What a case expects: the folder's command and exit code 2 unless its `.expect` says more.
struct Expect {
    args: String,
    exit: i32,
    stderr: Vec<String>,
}

fn expectation(case: &Path, default_args: &str) -> Expect {
    let mut e = Expect {
        args: default_args.to_string(),
        exit: 2,
        stderr: Vec::new(),
    };
    let Ok(text) = std::fs::read_to_string(case.with_extension("expect")) else {
        return e;
    };
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (key, value) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("{}: '{line}' is not 'key: value'", case.display()));
        let value = value.trim().to_string();
        match key.trim() {
            "args" => e.args = value,
            "exit" => e.exit = value.parse().unwrap(),
            "stderr" => e.stderr.push(value),
            other => panic!("{}: unknown key '{other}'", case.display()),
        }
    }
    e
}

fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).unwrap_or_default())
        })
        .collect()
}

fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Run `opsched args` in `dir` under the memory limit; `None` if it ran past the time limit.
fn run(dir: &Path, args: &[String]) -> Option<(i32, String)> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {MEMORY_LIMIT_KB} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_opsched"))
        .args(args)
        .current_dir(dir)
        // Never the user's cost cache.
        .env("OPSCHED_CACHE", dir.join("no-such-cache.bin"))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            return Some((status.code().unwrap_or(-1), err));
        }
        if start.elapsed() > TIME_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Everything wrong with one case, or nothing.
fn check(folder: &str, case: &Path, default_args: &str, scratch: &Path) -> Vec<String> {
    let name = case.file_name().unwrap().to_string_lossy().into_owned();
    let e = expectation(case, default_args);
    let dir = scratch.join(format!("{folder}-{name}"));
    copy_folder(case.parent().unwrap(), &dir);
    let before = snapshot(&dir);
    let args: Vec<String> = e
        .args
        .split_whitespace()
        .map(|a| a.replace("{case}", &name))
        .collect();
    let Some((code, err)) = run(&dir, &args) else {
        return vec![format!("still running after {TIME_LIMIT:?}")];
    };
    let mut problems = Vec::new();
    if code != e.exit {
        problems.push(format!("exit code {code}, expected {}", e.exit));
    }
    if err.contains("panicked") {
        problems.push("panicked".into());
    }
    let lines: Vec<&str> = err.lines().collect();
    if e.exit != 0 {
        let last = lines.last().copied().unwrap_or("");
        if !last.starts_with("error: ") {
            problems.push("the last line of stderr is not 'error: ...'".into());
        }
        if !last.contains(&name) {
            problems.push("the error does not name the file".into());
        }
        let others = &lines[..lines.len().saturating_sub(1)];
        if others.iter().any(|l| !l.starts_with("warning: ")) {
            problems.push("stderr has more than the error line and warnings".into());
        }
    }
    for want in &e.stderr {
        if !err.contains(want.as_str()) {
            problems.push(format!("stderr lacks '{want}'"));
        }
    }
    if !MAY_WRITE.contains(&folder) && snapshot(&dir) != before {
        problems.push("files in the case's folder changed".into());
    }
    let _ = std::fs::remove_dir_all(&dir);
    problems
        .into_iter()
        .map(|p| {
            format!(
                "{p}\n    stderr: {}",
                err.trim_end().replace('\n', "\n            ")
            )
        })
        .collect()
}

#[test]
fn every_bad_input_exits_2_with_a_one_line_error_naming_the_file() {
    let root = corpus();
    let scratch = std::env::temp_dir().join(format!("opsched-bad-inputs-{}", std::process::id()));
    let mut failures = Vec::new();
    let mut cases = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let entry = entry.unwrap();
        if !entry.file_type().unwrap().is_dir() {
            continue;
        }
        let folder = entry.file_name().to_string_lossy().into_owned();
        let &(_, ext, args) = COMMANDS
            .iter()
            .find(|(f, _, _)| *f == folder)
            .unwrap_or_else(|| {
                panic!("fixtures/bad/{folder}/ has no command: add it to COMMANDS and the README")
            });
        let mut files: Vec<PathBuf> = std::fs::read_dir(entry.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        for case in files
            .iter()
            .filter(|p| p.extension().is_some_and(|x| x == ext))
        {
            cases += 1;
            for problem in check(&folder, case, args, &scratch) {
                failures.push(format!(
                    "{folder}/{}: {problem}",
                    case.file_name().unwrap().to_string_lossy()
                ));
            }
        }
        // A sidecar without its case is a case that silently stopped running.
        for expect in files
            .iter()
            .filter(|p| p.extension().is_some_and(|x| x == "expect"))
        {
            assert!(
                expect.with_extension(ext).is_file(),
                "{} has no case file",
                expect.display()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(
        cases >= 50,
        "only {cases} cases found under {}",
        root.display()
    );
    assert!(
        failures.is_empty(),
        "{} of {cases} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
