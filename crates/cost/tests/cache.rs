//! The persistent cost cache: round trip, damaged files, future versions, concurrent writers
//! (two processes and several threads), the default location.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use opsched_cost::cache::{
    resolve_default_path, CacheKey, CostCache, DeviceFingerprint, Measurement, FORMAT_VERSION,
    HEADER_LEN, MAGIC,
};

const PATH_VAR: &str = "OPSCHED_TEST_CACHE_PATH";
const WRITER_VAR: &str = "OPSCHED_TEST_WRITER";

/// A fresh directory under the system temp dir.
fn temp_dir(tag: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!(
        "opsched-cache-test-{tag}-{}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn device(name: &str) -> DeviceFingerprint {
    DeviceFingerprint {
        name: name.into(),
        sms: 132,
        driver: "550.54".into(),
        cudnn: "9.1.0".into(),
    }
}

fn key(dev: &str, sig: &str, batch: u32) -> CacheKey {
    CacheKey {
        device: device(dev),
        signature: sig.into(),
        batch,
        dtype: "f32".into(),
    }
}

fn meas(ms: f64) -> Measurement {
    Measurement {
        median_ms: ms,
        p10_ms: ms * 0.9,
        p90_ms: ms * 1.1,
        repeats: 50,
    }
}

/// A cache file with `n` entries; returns its bytes.
fn write_cache(path: &Path, n: usize) -> Vec<u8> {
    let mut c = CostCache::open(path).unwrap();
    for i in 0..n {
        c.insert(
            key("h100", &format!("conv2d(oc={i})[1x3x8x8]f32"), 1),
            meas(i as f64),
        );
    }
    c.save().unwrap();
    std::fs::read(path).unwrap()
}

/// Files in `dir` whose names contain `part`.
fn files_with(dir: &Path, part: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().contains(part))
        .collect();
    v.sort();
    v
}

#[test]
fn round_trip() {
    let dir = temp_dir("roundtrip");
    let path = dir.join("nested").join("costs.bin");
    let mut c = CostCache::open(&path).unwrap();
    assert!(c.is_empty());
    assert!(c.recovered().is_none());
    c.insert(key("h100", "conv2d(a)", 1), meas(1.5));
    c.insert(key("h100", "conv2d(a)", 8), meas(6.0));
    c.insert(key("a100", "conv2d(a)", 1), meas(2.5));
    assert!(c.is_dirty());
    c.save().unwrap();
    assert!(!c.is_dirty());

    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..8], MAGIC);
    assert_eq!(
        u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
        FORMAT_VERSION
    );
    let len = u64::from_le_bytes(bytes[12..20].try_into().unwrap());
    assert_eq!(len as usize + HEADER_LEN, bytes.len());

    let r = CostCache::open(&path).unwrap();
    assert_eq!(r.len(), 3);
    assert!(r.recovered().is_none());
    assert_eq!(r.get(&key("h100", "conv2d(a)", 1)), Some(&meas(1.5)));
    assert_eq!(r.get(&key("h100", "conv2d(a)", 8)), Some(&meas(6.0)));
    assert_eq!(r.get(&key("a100", "conv2d(a)", 1)), Some(&meas(2.5)));
    assert_eq!(r.get(&key("h100", "conv2d(b)", 1)), None);
    assert_eq!(r.entries_for_device("h100").count(), 2);
    assert_eq!(r.entries_for_device("a100").count(), 1);
    assert_eq!(r.entries_for_device("v100").count(), 0);
    // No temporary files are left behind.
    assert!(files_with(&dir.join("nested"), ".opsched-tmp.").is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Open a damaged file: empty cache, a note, the original bytes moved aside; saving then works.
fn check_moved_aside(dir: &Path, path: &Path, damaged: &[u8], expect_in_note: &str) {
    let mut c = CostCache::open(path).unwrap();
    assert!(c.is_empty());
    let note = c.recovered().unwrap().to_string();
    assert!(note.contains(expect_in_note), "{note}");
    assert!(note.contains(".corrupt-"), "{note}");
    let aside = files_with(dir, ".corrupt-");
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read(&aside[0]).unwrap(), damaged);
    assert!(!path.exists());
    // The cache is usable again.
    c.insert(key("h100", "fresh", 1), meas(1.0));
    c.save().unwrap();
    let r = CostCache::open(path).unwrap();
    assert_eq!(r.len(), 1);
    assert!(r.recovered().is_none());
}

#[test]
fn truncated_file_is_moved_aside() {
    let dir = temp_dir("truncated");
    let path = dir.join("costs.bin");
    let bytes = write_cache(&path, 50);
    let half = bytes[..bytes.len() / 2].to_vec();
    std::fs::write(&path, &half).unwrap();
    check_moved_aside(&dir, &path, &half, "truncated");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn flipped_byte_is_a_checksum_error() {
    let dir = temp_dir("flipped");
    let path = dir.join("costs.bin");
    let mut bytes = write_cache(&path, 20);
    let at = bytes.len() - 10;
    bytes[at] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    check_moved_aside(&dir, &path, &bytes, "checksum");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn wrong_magic_and_tiny_files_are_moved_aside() {
    let dir = temp_dir("magic");
    let path = dir.join("costs.bin");
    let junk = b"this is not a cost cache at all, just some text".to_vec();
    std::fs::write(&path, &junk).unwrap();
    check_moved_aside(&dir, &path, &junk, "magic");

    let dir2 = temp_dir("tiny");
    let path2 = dir2.join("costs.bin");
    std::fs::write(&path2, b"OPSC").unwrap();
    check_moved_aside(&dir2, &path2, b"OPSC", "truncated");

    // Trailing garbage after a valid payload.
    let dir3 = temp_dir("trailing");
    let path3 = dir3.join("costs.bin");
    let mut bytes = write_cache(&path3, 3);
    bytes.extend_from_slice(b"extra");
    std::fs::write(&path3, &bytes).unwrap();
    check_moved_aside(&dir3, &path3, &bytes, "unexpected bytes");
    for d in [dir, dir2, dir3] {
        std::fs::remove_dir_all(&d).unwrap();
    }
}

#[test]
fn future_version_is_refused_and_left_untouched() {
    let dir = temp_dir("future");
    let path = dir.join("costs.bin");
    let mut bytes = write_cache(&path, 5);
    bytes[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();

    let err = CostCache::open(&path).unwrap_err().to_string();
    assert!(err.contains("version 2"), "{err}");
    assert!(err.contains("version 1"), "{err}");
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    assert!(files_with(&dir, ".corrupt-").is_empty());

    // A cache opened before the newer tool wrote the file must not overwrite it either.
    let other = dir.join("other.bin");
    let mut c = CostCache::open(&other).unwrap();
    std::fs::write(&other, &bytes).unwrap();
    c.insert(key("h100", "x", 1), meas(1.0));
    let err = c.save().unwrap_err().to_string();
    assert!(err.contains("version 2"), "{err}");
    assert_eq!(std::fs::read(&other).unwrap(), bytes);
    let err = c.merge_from_disk().unwrap_err().to_string();
    assert!(err.contains("newer"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn merge_from_disk_and_conflicts() {
    let dir = temp_dir("merge");
    let path = dir.join("costs.bin");
    let mut a = CostCache::open(&path).unwrap();
    let mut b = CostCache::open(&path).unwrap();
    a.insert(key("h100", "shared", 1), meas(1.0));
    a.insert(key("h100", "only_a", 1), meas(2.0));
    a.save().unwrap();

    // b sees a's entries on merge.
    assert_eq!(b.merge_from_disk().unwrap(), 2);
    assert_eq!(b.get(&key("h100", "only_a", 1)), Some(&meas(2.0)));

    // b re-measures "shared": its newer insert wins over the disk on save.
    b.insert(key("h100", "shared", 1), meas(3.0));
    b.save().unwrap();
    let r = CostCache::open(&path).unwrap();
    assert_eq!(r.get(&key("h100", "shared", 1)), Some(&meas(3.0)));

    // a only loaded "shared" (not dirty any more): the disk's newer value wins in a's save.
    a.insert(key("h100", "only_a2", 1), meas(4.0));
    a.save().unwrap();
    assert_eq!(a.get(&key("h100", "shared", 1)), Some(&meas(3.0)));
    let r = CostCache::open(&path).unwrap();
    assert_eq!(r.len(), 3);
    assert_eq!(r.get(&key("h100", "shared", 1)), Some(&meas(3.0)));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Inserts 200 distinct entries in 20 saves, reopening the cache for each round. Run by
/// [`two_processes_lose_nothing`] in child processes; does nothing when run directly.
#[test]
#[ignore = "child process of two_processes_lose_nothing"]
fn writer_child() {
    let (Some(path), Some(id)) = (std::env::var_os(PATH_VAR), std::env::var_os(WRITER_VAR)) else {
        return;
    };
    let id = id.to_string_lossy().into_owned();
    write_rounds(Path::new(&path), &id, 20, 10);
}

fn write_rounds(path: &Path, id: &str, rounds: usize, per_round: usize) {
    for round in 0..rounds {
        let mut c = CostCache::open(path).unwrap();
        assert!(c.recovered().is_none(), "{:?}", c.recovered());
        for j in 0..per_round {
            let n = round * per_round + j;
            c.insert(key("h100", &format!("writer{id}-op{n}"), 1), meas(n as f64));
        }
        c.save().unwrap();
    }
}

fn spawn_writer(path: &Path, id: &str) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "writer_child", "--nocapture", "--ignored"])
        .env(PATH_VAR, path)
        .env(WRITER_VAR, id)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn two_processes_lose_nothing() {
    let dir = temp_dir("procs");
    let path = dir.join("costs.bin");
    let children = [spawn_writer(&path, "A"), spawn_writer(&path, "B")];
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "writer failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The child really ran the writer (not zero filtered tests).
        assert!(stdout.contains("1 passed"), "{stdout}");
    }
    let c = CostCache::open(&path).unwrap();
    assert!(c.recovered().is_none());
    assert_eq!(c.len(), 400);
    for id in ["A", "B"] {
        for n in 0..200 {
            let k = key("h100", &format!("writer{id}-op{n}"), 1);
            assert_eq!(c.get(&k), Some(&meas(n as f64)), "{k:?}");
        }
    }
    assert!(files_with(&dir, ".tmp-").is_empty());
    assert!(files_with(&dir, ".corrupt-").is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn threads_lose_nothing() {
    let dir = temp_dir("threads");
    let path = dir.join("costs.bin");
    std::thread::scope(|s| {
        for t in 0..4 {
            let path = &path;
            s.spawn(move || write_rounds(path, &format!("T{t}"), 10, 5));
        }
    });
    let c = CostCache::open(&path).unwrap();
    assert_eq!(c.len(), 200);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn default_path_resolution() {
    let base = PathBuf::from("/some/cache");
    assert_eq!(
        resolve_default_path(Some("/tmp/x.bin".as_ref()), Some(&base)).unwrap(),
        PathBuf::from("/tmp/x.bin")
    );
    assert_eq!(
        resolve_default_path(None, Some(&base)).unwrap(),
        base.join("opsched").join("costs.bin")
    );
    assert_eq!(
        resolve_default_path(Some("".as_ref()), Some(&base)).unwrap(),
        base.join("opsched").join("costs.bin")
    );
    assert_eq!(
        resolve_default_path(Some("/tmp/x.bin".as_ref()), None).unwrap(),
        PathBuf::from("/tmp/x.bin")
    );
    let err = resolve_default_path(None, None).unwrap_err().to_string();
    assert!(err.contains("OPSCHED_CACHE"), "{err}");
}

/// Opens the default cache (OPSCHED_CACHE set by the parent) and saves one entry. Run by
/// [`env_override_in_child`]; does nothing when run directly.
#[test]
#[ignore = "child process of env_override_in_child"]
fn env_child() {
    let Some(expected) = std::env::var_os(PATH_VAR) else {
        return;
    };
    let mut c = CostCache::open_default().unwrap();
    assert_eq!(c.path(), Path::new(&expected));
    c.insert(key("h100", "from_env", 1), meas(7.0));
    c.save().unwrap();
}

#[test]
fn env_override_in_child() {
    let dir = temp_dir("env");
    let path = dir.join("sub").join("env-costs.bin");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "env_child", "--nocapture", "--ignored"])
        .env(PATH_VAR, &path)
        .env("OPSCHED_CACHE", &path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 passed"), "{stdout}");
    let c = CostCache::open(&path).unwrap();
    assert_eq!(c.get(&key("h100", "from_env", 1)), Some(&meas(7.0)));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A cache reached through symbolic links: the data, the lock file and a damaged file moved
/// aside stay beside the target, the links stay links, and writers through different links
/// share one lock (so they merge instead of losing entries).
#[cfg(unix)]
#[test]
fn a_linked_cache_is_written_and_locked_beside_its_target() {
    use std::os::unix::fs::symlink;
    let dir = temp_dir("links");
    let real = dir.join("real");
    std::fs::create_dir(&real).unwrap();
    let target = real.join("costs.bin");
    let (l1, l2) = (dir.join("a.bin"), dir.join("b.bin"));
    symlink(&target, &l1).unwrap();
    symlink("real/costs.bin", &l2).unwrap();
    let mut a = CostCache::open(&l1).unwrap();
    let mut b = CostCache::open(&l2).unwrap();
    assert_eq!(a.target(), b.target());
    a.insert(key("h100", "from_a", 1), meas(1.0));
    b.insert(key("h100", "from_b", 1), meas(2.0));
    a.save().unwrap();
    b.save().unwrap();
    for l in [&l1, &l2] {
        assert!(std::fs::symlink_metadata(l)
            .unwrap()
            .file_type()
            .is_symlink());
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["a.bin", "b.bin", "real"]);
    assert_eq!(
        files_with(&real, ""),
        [real.join("costs.bin"), real.join("costs.bin.lock")]
    );
    let r = CostCache::open(&target).unwrap();
    assert_eq!(r.len(), 2, "a writer lost the other's entry");
    // A damaged target is moved aside beside the target, not beside the link.
    std::fs::write(&target, b"junk").unwrap();
    let c = CostCache::open(&l1).unwrap();
    assert!(c.recovered().is_some());
    assert_eq!(files_with(&real, ".corrupt-").len(), 1);
    assert!(std::fs::symlink_metadata(&l1)
        .unwrap()
        .file_type()
        .is_symlink());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A FIFO (made here, never a system device) or a folder is not a cache: refused at once,
/// without blocking on the FIFO, and left where it is.
#[cfg(unix)]
#[test]
fn a_fifo_or_folder_is_refused_and_left_alone() {
    use std::os::unix::fs::FileTypeExt;
    let dir = temp_dir("fifo");
    let fifo = dir.join("pipe.bin");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    for path in [fifo.clone(), dir.clone()] {
        let e = CostCache::open(&path).unwrap_err().to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("not a regular file"),
            "{e}"
        );
    }
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(files_with(&dir, ""), [fifo]);
    std::fs::remove_dir_all(&dir).unwrap();
}
