//! What `opsched_io::write` does to each kind of path. Device nodes are never the machine's own:
//! FIFOs are made in a scratch folder with `mkfifo`, and the character device test makes its
//! own node with `mknod` (root only; skipped otherwise).

#![allow(clippy::unwrap_used)]

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use opsched_io::{check_writable, write, Destination};

static N: AtomicUsize = AtomicUsize::new(0);

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "opsched-io-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn creates_and_replaces_regular_files_leaving_nothing_else() {
    let dir = scratch("regular");
    let out = dir.join("a.csv");
    let w = write(&out, b"one\n").unwrap();
    assert_eq!(w.to, Destination::File);
    assert_eq!(w.bytes, 4);
    assert_eq!(w.to_string(), format!("wrote {} (4 B)", out.display()));
    write(&out, b"two\n").unwrap();
    assert_eq!(fs::read_to_string(&out).unwrap(), "two\n");
    assert_eq!(names(&dir), ["a.csv"]);
    fs::remove_dir_all(&dir).unwrap();
}

#[cfg(unix)]
#[test]
fn keeps_the_permissions_of_the_file_it_replaces() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("perm");
    let out = dir.join("secret.json");
    fs::write(&out, "{}").unwrap();
    fs::set_permissions(&out, fs::Permissions::from_mode(0o600)).unwrap();
    write(&out, b"[]").unwrap();
    assert_eq!(
        fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o600
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn refuses_read_only_files_and_leaves_them() {
    let dir = scratch("readonly");
    let out = dir.join("keep.md");
    fs::write(&out, "keep").unwrap();
    let mut p = fs::metadata(&out).unwrap().permissions();
    p.set_readonly(true);
    fs::set_permissions(&out, p).unwrap();
    let e = write(&out, b"new").unwrap_err().to_string();
    assert!(e.contains("keep.md") && e.contains("read-only"), "{e}");
    // The same refusal before any work, and no other file there.
    assert_eq!(check_writable(&out).unwrap_err().to_string(), e);
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
    assert_eq!(fs::read_to_string(&out).unwrap(), "keep");
    let mut p = fs::metadata(&out).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    p.set_readonly(false);
    fs::set_permissions(&out, p).unwrap();
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn refuses_directories_and_missing_folders_creating_nothing() {
    let dir = scratch("dirs");
    let sub = dir.join("sub");
    fs::create_dir(&sub).unwrap();
    let e = write(&sub, b"x").unwrap_err().to_string();
    assert!(e.contains("sub") && e.contains("is a directory"), "{e}");
    assert_eq!(check_writable(&sub).unwrap_err().to_string(), e);
    // A file not there yet, or stdout, may be written; checking creates nothing.
    check_writable(dir.join("new.json")).unwrap();
    check_writable("-").unwrap();
    assert!(!dir.join("new.json").exists());
    let missing = dir.join("nope").join("x.csv");
    let e = write(&missing, b"x").unwrap_err();
    assert_eq!(e.kind, std::io::ErrorKind::NotFound);
    assert!(
        e.to_string().contains("x.csv") && e.to_string().contains("does not exist"),
        "{e}"
    );
    assert_eq!(names(&dir), ["sub"]);
    assert!(names(&sub).is_empty());
    fs::remove_dir_all(&dir).unwrap();
}

#[cfg(unix)]
#[test]
fn writes_through_symbolic_links_to_their_targets() {
    use std::os::unix::fs::symlink;
    let dir = scratch("links");
    let real = dir.join("real");
    fs::create_dir(&real).unwrap();
    let target = real.join("t.svg");
    fs::write(&target, "old").unwrap();
    // A relative link, read from the link's own folder, and a link to that link.
    symlink("real/t.svg", dir.join("link.svg")).unwrap();
    symlink(dir.join("link.svg"), dir.join("link2.svg")).unwrap();
    write(dir.join("link2.svg"), b"new").unwrap();
    assert_eq!(fs::read_to_string(&target).unwrap(), "new");
    for l in ["link.svg", "link2.svg"] {
        let m = fs::symlink_metadata(dir.join(l)).unwrap();
        assert!(m.file_type().is_symlink(), "{l} was replaced");
    }
    // A dangling link creates its target (in the target's folder, nothing else).
    symlink("real/new.json", dir.join("dangling.json")).unwrap();
    write(dir.join("dangling.json"), b"{}").unwrap();
    assert_eq!(fs::read_to_string(real.join("new.json")).unwrap(), "{}");
    assert_eq!(names(&real), ["new.json", "t.svg"]);
    assert_eq!(
        names(&dir),
        ["dangling.json", "link.svg", "link2.svg", "real"]
    );
    // A loop is an error, not a hang.
    symlink("loop-b", dir.join("loop-a")).unwrap();
    symlink("loop-a", dir.join("loop-b")).unwrap();
    let e = write(dir.join("loop-a"), b"x").unwrap_err().to_string();
    assert!(e.contains("loop-a") && e.contains("symbolic links"), "{e}");
    fs::remove_dir_all(&dir).unwrap();
}

#[cfg(unix)]
fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfifo {}", path.display());
}

#[cfg(unix)]
fn is_fifo(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    fs::symlink_metadata(path).unwrap().file_type().is_fifo()
}

#[cfg(unix)]
#[test]
fn writes_into_a_fifo_without_replacing_it_also_through_a_link() {
    let dir = scratch("fifo");
    let fifo = dir.join("pipe");
    mkfifo(&fifo);
    std::os::unix::fs::symlink(&fifo, dir.join("to-pipe.csv")).unwrap();
    for name in ["pipe", "to-pipe.csv"] {
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let mut s = String::new();
                fs::File::open(&fifo)
                    .unwrap()
                    .read_to_string(&mut s)
                    .unwrap();
                s
            })
        };
        let w = write(dir.join(name), b"through the pipe\n").unwrap();
        assert_eq!(w.to, Destination::Stream);
        assert_eq!(reader.join().unwrap(), "through the pipe\n");
        assert!(is_fifo(&fifo), "the FIFO was replaced");
    }
    assert_eq!(names(&dir), ["pipe", "to-pipe.csv"]);
    fs::remove_dir_all(&dir).unwrap();
}

/// A character device of our own (the same device as /dev/null, made in the scratch folder), so
/// a bug could only ever replace this node.
#[cfg(unix)]
#[test]
fn writes_into_a_character_device_without_replacing_it() {
    use std::os::unix::fs::FileTypeExt;
    let dir = scratch("chardev");
    let dev = dir.join("null");
    let made = std::process::Command::new("mknod")
        .arg(&dev)
        .args(["c", "1", "3"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !made {
        eprintln!("skipped: mknod needs root");
        fs::remove_dir_all(&dir).unwrap();
        return;
    }
    let w = write(&dev, b"discarded").unwrap();
    assert_eq!(w.to, Destination::Stream);
    let ft = fs::symlink_metadata(&dev).unwrap().file_type();
    assert!(ft.is_char_device(), "the device node was replaced");
    assert_eq!(names(&dir), ["null"]);
    fs::remove_dir_all(&dir).unwrap();
}

#[cfg(unix)]
#[test]
fn removes_stale_temporary_files_of_its_target_only() {
    let dir = scratch("stale");
    let old = SystemTime::now() - Duration::from_secs(3600);
    let make = |name: &str, age: SystemTime| {
        let p = dir.join(name);
        fs::write(&p, "partial").unwrap();
        fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(age)
            .unwrap();
        p
    };
    make(".out.csv.opsched-tmp.4000000.0", old); // crashed writer: removed
    make(".out.csv.opsched-tmp.4000001.3", SystemTime::now()); // just created: kept
    let held = make(".out.csv.opsched-tmp.4000002.1", old); // a live writer's: kept
    make(".other.csv.opsched-tmp.4000003.0", old); // another target's: kept
    make(".out.csv.opsched-tmp.notapid", old); // not our name: kept
    let lock = fs::File::options().write(true).open(&held).unwrap();
    lock.lock().unwrap();
    write(dir.join("out.csv"), b"a,b\n").unwrap();
    drop(lock);
    assert_eq!(
        names(&dir),
        [
            ".other.csv.opsched-tmp.4000003.0",
            ".out.csv.opsched-tmp.4000001.3",
            ".out.csv.opsched-tmp.4000002.1",
            ".out.csv.opsched-tmp.notapid",
            "out.csv",
        ]
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn concurrent_writers_leave_one_whole_file() {
    let dir = scratch("race");
    let out = dir.join("r.json");
    let payloads: Vec<Vec<u8>> = (0..8u8).map(|i| vec![b'a' + i; 100_000]).collect();
    std::thread::scope(|s| {
        for p in &payloads {
            let out = &out;
            s.spawn(move || {
                for _ in 0..5 {
                    write(out, p).unwrap();
                }
            });
        }
    });
    let got = fs::read(&out).unwrap();
    assert!(payloads.contains(&got), "a mix of writes");
    assert_eq!(names(&dir), ["r.json"]);
    fs::remove_dir_all(&dir).unwrap();
}
