//! Output files through the binary: every write reported on stderr (unless `--quiet`), the
//! result printed before any file is written, a failed write exits 2 without losing the result,
//! `-` is stdout, links and FIFOs are written through, never replaced.

#![allow(clippy::unwrap_used)]

use std::path::Path;
mod common;

use common::{opsched, scratch};
use std::process::Command;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_failed_write_exits_2_after_the_table_and_the_other_files() {
    let dir = scratch("fail");
    let csv = dir.join("missing-folder").join("t.csv");
    let md = dir.join("t.md");
    let out = opsched(&[
        "compare",
        "squeezenet",
        "--algos",
        "sequential,lios",
        "--csv",
        s(&csv),
        "--md",
        s(&md),
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stdout.lines().any(|l| l.starts_with("lios ")), "{stdout}");
    let md_len = std::fs::metadata(&md).unwrap().len();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines,
        [
            format!("wrote {} ({md_len} B)", md.display()),
            format!(
                "error: {}: cannot write: the folder {} does not exist",
                csv.display(),
                csv.parent().unwrap().display()
            )
        ],
        "{stderr}"
    );
    assert!(!csv.parent().unwrap().exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn writes_are_reported_unless_quiet_and_dash_is_stdout() {
    let dir = scratch("quiet");
    let dot = dir.join("g.dot");
    let out = opsched(&["inspect", "squeezenet", "--dot", s(&dot)]);
    assert!(out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(&format!("wrote {} (", dot.display())) && stderr.ends_with(" kB)\n"),
        "{stderr}"
    );
    let out = opsched(&["inspect", "squeezenet", "--dot", s(&dot), "--quiet"]);
    assert!(out.status.success());
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    // `-`: the DOT text follows the summary on stdout.
    let out = opsched(&["inspect", "squeezenet", "--dot", "-", "-q"]);
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("model        squeezenet"), "{stdout}");
    assert!(
        stdout.contains("digraph") && stdout.trim_end().ends_with('}'),
        "{stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_folder_as_output_is_refused_with_exit_2() {
    let dir = scratch("folder");
    let out = opsched(&["schedule", "squeezenet", "--algo", "lios", "--out", s(&dir)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stdout).contains("makespan"));
    assert_eq!(
        text(&out.stderr),
        format!("error: {}: cannot write: is a directory\n", dir.display())
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[cfg(unix)]
#[test]
fn links_and_fifos_are_written_through_not_replaced() {
    use std::io::Read;
    use std::os::unix::fs::FileTypeExt;
    let dir = scratch("links");
    let target = dir.join("real.svg");
    let link = dir.join("link.svg");
    std::os::unix::fs::symlink("real.svg", &link).unwrap();
    let out = opsched(&["viz", "squeezenet", "--algo", "lios", "--out", s(&link)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(std::fs::read_to_string(&target)
        .unwrap()
        .starts_with("<svg"));

    let fifo = dir.join("pipe.csv");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut got = String::new();
            std::fs::File::open(fifo)
                .unwrap()
                .read_to_string(&mut got)
                .unwrap();
            got
        })
    };
    let out = opsched(&[
        "compare",
        "squeezenet",
        "--algos",
        "sequential",
        "--csv",
        s(&fifo),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(reader.join().unwrap().starts_with("model,device,"));
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    std::fs::remove_dir_all(&dir).unwrap();
}
