//! # opsched-io
//!
//! The one way opsched writes an output file: the CLI's `--csv`, `--md`, `--out`, `--svg`,
//! `--trace`, `--export` and `--dot`, schedule files, the cost cache, the profiler's tables and
//! the xtask reports all go through [`write`](fn@write), which does what a user naming a path expects:
//!
//! | the path names | what happens |
//! |---|---|
//! | `-` | the bytes go to stdout |
//! | a symbolic link | followed (chains too, relative links from their own folder) to its target, which is written as below; the link stays a link |
//! | a regular file, or nothing yet | the bytes go to a temporary file beside the target, `.NAME.opsched-tmp.PID.N`, which is fsynced and renamed over the target: readers see the old or the new file, never a mix; on any failure the old file is left as it was and the temporary file removed; the old file's permissions are kept |
//! | a FIFO or a character device | opened and written directly, never replaced (`/dev/null`, `/dev/stdout`, a named pipe) |
//! | a directory, a block device, a socket, a read-only file | refused |
//!
//! Nothing is created outside the target's folder and no folder is created: a missing folder is
//! an error naming it. Errors are one line naming the path ([`OutputError`]).
//!
//! **Stale temporary files.** A writer holds an advisory lock on its temporary file
//! (`std::fs::File::lock`) until it has renamed it. A writer killed in between leaves the file
//! behind; the next write to the same target removes every temporary file of that target that
//! nobody holds locked and that is older than a few seconds (the age rules out a file another
//! writer created a moment ago and has not locked yet). Files of other names are never touched.
//!
//! [`resolve`] is the symlink resolution alone, for writers that keep files beside their target
//! (the cost cache's lock file); [`check_writable`] says before long work whether [`write`](fn@write)
//! would refuse its path.
//!
//! This is the bottom crate of the workspace: it imports nothing of opsched, so every crate
//! that writes can use it.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The path that means stdout.
pub const STDOUT: &str = "-";

/// Most symbolic links followed before giving up (Linux's own limit).
const MAX_LINKS: usize = 40;

/// A temporary file nobody holds locked is only removed once it is at least this old.
const STALE_AFTER: Duration = Duration::from_secs(10);

/// The marker in temporary file names: `.NAME.opsched-tmp.PID.N`.
const TMP_MARK: &str = ".opsched-tmp.";

/// Longest file name a temporary name keeps of its target (names are limited to 255 bytes).
const MAX_TMP_STEM: usize = 180;

/// A write that did not happen; the message names the path as the user gave it.
#[derive(Debug, thiserror::Error)]
#[error("{}: cannot write: {message}", path.display())]
pub struct OutputError {
    /// The path as given.
    pub path: PathBuf,
    /// The kind of the underlying I/O error (`Other` for refusals).
    pub kind: io::ErrorKind,
    /// Why, in words.
    pub message: String,
}

impl OutputError {
    fn new(path: &Path, kind: io::ErrorKind, message: impl Into<String>) -> Self {
        OutputError {
            path: path.to_path_buf(),
            kind,
            message: message.into(),
        }
    }

    fn io(path: &Path, e: &io::Error) -> Self {
        Self::new(path, e.kind(), e.to_string())
    }
}

/// Where the bytes of a [`write`](fn@write) went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// A regular file, replaced atomically.
    File,
    /// A FIFO or character device, written in place.
    Stream,
    /// Standard output (`-`).
    Stdout,
}

/// A write that happened. Its `Display` is the report a front end prints:
/// `wrote target/x.svg (12 kB)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// The path as given.
    pub path: PathBuf,
    pub bytes: u64,
    pub to: Destination,
}

impl fmt::Display for Written {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to {
            Destination::Stdout => write!(f, "wrote {} to stdout", size(self.bytes)),
            _ => write!(f, "wrote {} ({})", self.path.display(), size(self.bytes)),
        }
    }
}

/// A byte count for people: `512 B`, `1.5 kB`, `12 kB`, `3.4 MB` (powers of 1000).
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["kB", "MB", "GB", "TB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1000.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 999.5 {
            break;
        }
        v /= 1000.0;
        unit = u;
    }
    if v < 9.95 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.0} {unit}")
    }
}

/// What a resolved path names.
enum Kind {
    Missing,
    Regular { readonly: bool },
    Stream,
    Refused(&'static str),
}

fn kind_of(target: &Path) -> io::Result<Kind> {
    let meta = match fs::metadata(target) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Kind::Missing),
        Err(e) => return Err(e),
    };
    let ft = meta.file_type();
    if ft.is_file() {
        return Ok(Kind::Regular {
            readonly: meta.permissions().readonly(),
        });
    }
    if ft.is_dir() {
        return Ok(Kind::Refused("is a directory"));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() || ft.is_char_device() {
            return Ok(Kind::Stream);
        }
        if ft.is_block_device() {
            return Ok(Kind::Refused(
                "is a block device (opsched writes regular files, FIFOs and character devices)",
            ));
        }
        if ft.is_socket() {
            return Ok(Kind::Refused("is a socket"));
        }
    }
    Ok(Kind::Refused("is not a regular file"))
}

/// The folder a file lives in (`.` for a bare name).
fn folder(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Follow `path` through symbolic links (chains too; a relative link is read from the link's own
/// folder) to the file it finally names, which need not exist yet (a dangling link names the
/// file to create). A path that is no link comes back unchanged.
pub fn resolve(path: &Path) -> Result<PathBuf, OutputError> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let link = fs::read_link(&p).map_err(|e| OutputError::io(path, &e))?;
                p = if link.is_absolute() {
                    link
                } else {
                    folder(&p).join(link)
                };
            }
            Ok(_) => return Ok(p),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(p),
            Err(e) => return Err(OutputError::io(path, &e)),
        }
    }
    Err(OutputError::new(
        path,
        io::ErrorKind::Other,
        format!("more than {MAX_LINKS} symbolic links (a loop?)"),
    ))
}

/// Write `bytes` to `path` as the module docs say: `-` is stdout, links are followed, FIFOs and
/// character devices are written in place, regular files are replaced atomically.
pub fn write(path: impl AsRef<Path>, bytes: &[u8]) -> Result<Written, OutputError> {
    let path = path.as_ref();
    let written = |to| Written {
        path: path.to_path_buf(),
        bytes: bytes.len() as u64,
        to,
    };
    if path.as_os_str() == STDOUT {
        let mut out = io::stdout().lock();
        out.write_all(bytes)
            .and_then(|()| out.flush())
            .map_err(|e| OutputError::io(Path::new("stdout"), &e))?;
        return Ok(written(Destination::Stdout));
    }
    match destination(path)? {
        (target, Kind::Stream) => {
            write_in_place(&target, bytes).map_err(|e| OutputError::io(path, &e))?;
            Ok(written(Destination::Stream))
        }
        (target, _) => {
            replace(path, &target, |f| f.write_all(bytes))?;
            Ok(written(Destination::File))
        }
    }
}

/// Whether [`write`](fn@write) would refuse `path` for what it names (a read-only file, a directory, a
/// link loop, an empty path), checked before long work whose result goes there; nothing is
/// written or created. A folder that cannot be written is still found only by the write.
pub fn check_writable(path: impl AsRef<Path>) -> Result<(), OutputError> {
    let path = path.as_ref();
    if path.as_os_str() == STDOUT {
        return Ok(());
    }
    destination(path).map(|_| ())
}

/// The file a write to `path` (not stdout) replaces or streams into, and what it is now; a
/// path [`write`](fn@write) refuses is an error naming it.
fn destination(path: &Path) -> Result<(PathBuf, Kind), OutputError> {
    if path.as_os_str().is_empty() {
        return Err(OutputError::new(path, io::ErrorKind::Other, "empty path"));
    }
    let target = resolve(path)?;
    match kind_of(&target).map_err(|e| OutputError::io(path, &e))? {
        Kind::Refused(why) => Err(OutputError::new(path, io::ErrorKind::Other, why)),
        Kind::Regular { readonly: true } => Err(OutputError::new(
            path,
            io::ErrorKind::PermissionDenied,
            "the file is read-only",
        )),
        kind => Ok((target, kind)),
    }
}

/// A FIFO or character device: open it for writing (no create, no truncate) and write. The
/// opened file is checked again, so a regular file swapped in since the check is not overwritten
/// in place.
fn write_in_place(target: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = OpenOptions::new().write(true).open(target)?;
    if f.metadata()?.file_type().is_file() {
        return Err(io::Error::other(
            "became a regular file while being opened; not written",
        ));
    }
    f.write_all(bytes)?;
    f.flush()
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The prefix of every temporary file of the target named `name`.
fn tmp_prefix(name: &str) -> String {
    let mut stem = name;
    if stem.len() > MAX_TMP_STEM {
        let mut cut = MAX_TMP_STEM;
        while !stem.is_char_boundary(cut) {
            cut -= 1;
        }
        stem = &stem[..cut];
    }
    format!(".{stem}{TMP_MARK}")
}

/// Replace the regular file `target` (or create it) atomically with what `fill` writes.
/// `path` is the name the user gave, for messages.
fn replace(
    path: &Path,
    target: &Path,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), OutputError> {
    let dir = folder(target);
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| OutputError::new(path, io::ErrorKind::Other, "names no file"))?;
    if !dir.is_dir() {
        return Err(OutputError::new(
            path,
            io::ErrorKind::NotFound,
            format!("the folder {} does not exist", dir.display()),
        ));
    }
    let prefix = tmp_prefix(&name);
    remove_stale(dir, &prefix);
    let keep_permissions = fs::metadata(target).ok().map(|m| m.permissions());
    let (tmp, mut file) = create_tmp(dir, &prefix).map_err(|e| {
        OutputError::new(
            path,
            e.kind(),
            format!("cannot create a temporary file in {}: {e}", dir.display()),
        )
    })?;
    // Held until the file is closed: tells `remove_stale` of other writers that it is in use.
    // A file system without locks still gets its write.
    let _ = file.lock();
    let result = (|| {
        fill(&mut file)?;
        if let Some(p) = keep_permissions {
            file.set_permissions(p)?;
        }
        file.sync_all()?;
        fs::rename(&tmp, target)
    })();
    drop(file);
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(OutputError::io(path, &e));
    }
    // Make the rename durable; not every platform can open a folder, so this is best effort.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn create_tmp(dir: &Path, prefix: &str) -> io::Result<(PathBuf, File)> {
    loop {
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!("{prefix}{}.{n}", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Remove the temporary files of one target that their writers left behind (see the module
/// docs). Best effort: anything unexpected leaves the file where it is.
fn remove_stale(dir: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        // PID.N, both decimal: a file of ours, not one that merely starts alike.
        let ours = rest
            .split_once('.')
            .is_some_and(|(pid, n)| is_decimal(pid) && is_decimal(n));
        if !ours {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age >= STALE_AFTER);
        if !meta.file_type().is_file() || !old {
            continue;
        }
        let Ok(f) = OpenOptions::new().write(true).open(&path) else {
            continue;
        };
        if f.try_lock().is_ok() && fs::remove_file(&path).is_ok() {
            tracing::debug!("removed the stale temporary file {}", path.display());
        }
    }
}

fn is_decimal(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "opsched-io-unit-{name}-{}-{}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
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
    fn a_failed_fill_leaves_the_old_file_and_no_temporary() {
        let dir = scratch("fail");
        let target = dir.join("table.csv");
        fs::write(&target, "old\n").unwrap();
        let e = replace(&target, &target, |f| {
            f.write_all(b"half of the new")?;
            Err(io::Error::other("disk full"))
        })
        .unwrap_err();
        assert!(e.to_string().contains("disk full"), "{e}");
        assert_eq!(fs::read_to_string(&target).unwrap(), "old\n");
        assert_eq!(names(&dir), ["table.csv"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sizes_read_like_people_write_them() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(999), "999 B");
        assert_eq!(size(1000), "1.0 kB");
        assert_eq!(size(1540), "1.5 kB");
        assert_eq!(size(12_345), "12 kB");
        assert_eq!(size(999_999), "1.0 MB");
        assert_eq!(size(3_400_000), "3.4 MB");
        assert_eq!(size(7_000_000_000_000_000), "7000 TB");
    }

    #[test]
    fn temporary_names_stay_short_and_on_char_boundaries() {
        let long = "é".repeat(200);
        let p = tmp_prefix(&long);
        assert!(p.len() <= MAX_TMP_STEM + TMP_MARK.len() + 1);
        assert!(p.ends_with(TMP_MARK));
        assert_eq!(tmp_prefix("x.csv"), ".x.csv.opsched-tmp.");
    }
}
