//! Helpers shared by the CLI's test files (each test file uses some of them).
#![allow(dead_code)]

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
