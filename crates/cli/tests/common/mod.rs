//! Helpers shared by the CLI's test files (each test file uses some of them).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// Run the `opsched` binary under test.
pub fn opsched(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_opsched"))
        .args(args)
        .output()
        .expect("the opsched binary runs")
}

/// Its stdout, after checking that it succeeded.
pub fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An empty folder of this test process for `tag`.
pub fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("opsched-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    dir
}
