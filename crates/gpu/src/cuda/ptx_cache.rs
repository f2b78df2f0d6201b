//! Our NVRTC kernels' PTX kept on disk between processes: NVRTC takes about 0.8 s to compile
//! [`super::nvrtc::SOURCE`] (measured with libnvrtc 13.5 on this repository's build machine),
//! which every `opsched run` and every process of `bench-gpu` paid for each GPU it opened. The
//! file is keyed by the source, the target architecture and NVRTC's version, so a changed
//! kernel or library compiles again; the driver keeps the machine code it makes of the PTX in
//! its own cache. The directory is `$OPSCHED_KERNEL_CACHE` (empty: no cache), else
//! `<cache dir>/opsched/kernels`.

use std::path::{Path, PathBuf};

/// Environment variable naming the directory (set and empty: keep nothing).
pub const ENV_VAR: &str = "OPSCHED_KERNEL_CACHE";

/// The directory PTX files are kept in, if any.
pub(crate) fn dir() -> Option<PathBuf> {
    match std::env::var_os(ENV_VAR) {
        Some(v) if v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => dirs::cache_dir().map(|d| d.join("opsched").join("kernels")),
    }
}

/// A stable 64-bit key of `parts`: FNV-1a ([`opsched_cost::cache::fnv1a64`], the same in every
/// build and on every platform, which std's hasher does not promise) over each part's length
/// and bytes.
pub(crate) fn key(parts: &[&[u8]]) -> u64 {
    let mut framed = Vec::with_capacity(parts.iter().map(|p| p.len() + 8).sum());
    for part in parts {
        framed.extend_from_slice(&(part.len() as u64).to_le_bytes());
        framed.extend_from_slice(part);
    }
    opsched_cost::cache::fnv1a64(&framed)
}

fn file(dir: &Path, key: u64) -> PathBuf {
    dir.join(format!("{key:016x}.ptx"))
}

/// The PTX kept under `key`, where there is a file that reads as PTX (text with a version, a
/// target and at least one kernel, and no NUL, which the driver's loader would stop at and
/// cudarc refuses with a panic); anything else is as if there were none.
pub(crate) fn load(dir: &Path, key: u64) -> Option<String> {
    let text = std::fs::read_to_string(file(dir, key)).ok()?;
    let looks_like_ptx = [".version", ".target", ".entry"]
        .iter()
        .all(|d| text.contains(d));
    (looks_like_ptx && !text.contains('\0')).then_some(text)
}

/// Keep `ptx` under `key` for the next process, written as every output is
/// ([`opsched_io::write`]: replaced atomically, so a reader never sees half a file). A failure
/// is logged and costs the next process a compile, nothing more.
pub(crate) fn store(dir: &Path, key: u64, ptx: &str) {
    let written = std::fs::create_dir_all(dir)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            opsched_io::write(file(dir, key), ptx.as_bytes())
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
    if let Err(e) = written {
        tracing::warn!(
            "could not keep the compiled kernels in {} ({e}); the next process compiles them \
             again",
            dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const PTX: &str = "//\n.version 9.0\n.target sm_90\n.visible .entry k(\n)\n{\n\tret;\n}\n";

    #[test]
    fn the_key_changes_with_any_part_and_with_where_parts_split() {
        let base = key(&[b"source", b"compute_90", b"13.5"]);
        assert_eq!(base, key(&[b"source", b"compute_90", b"13.5"]));
        for other in [
            key(&[b"sourcf", b"compute_90", b"13.5"]),
            key(&[b"source", b"compute_89", b"13.5"]),
            key(&[b"source", b"compute_90", b"13.4"]),
            key(&[b"sourcec", b"ompute_90", b"13.5"]),
        ] {
            assert_ne!(base, other);
        }
        // FNV-1a's offset basis for nothing at all: the key does not depend on the build.
        assert_eq!(key(&[]), 0xcbf2_9ce4_8422_2325);
    }

    #[test]
    fn stored_ptx_loads_back_and_anything_else_is_absent() {
        let dir = std::env::temp_dir().join(format!("opsched-ptx-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(load(&dir, 1), None, "nothing there yet");
        store(&dir, 1, PTX);
        assert_eq!(load(&dir, 1).as_deref(), Some(PTX));
        assert_eq!(load(&dir, 2), None, "another key");
        // A truncated or foreign file is no PTX.
        std::fs::write(file(&dir, 3), &PTX[..PTX.len() / 2]).unwrap();
        assert_eq!(load(&dir, 3), None);
        std::fs::write(file(&dir, 3), format!("{PTX}\0")).unwrap();
        assert_eq!(load(&dir, 3), None, "a NUL inside");
        // Nothing half-written is left beside (opsched_io's temporary files).
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            names.iter().all(|n| !n.contains("opsched-tmp")),
            "{names:?}"
        );
        // A directory that cannot be made (a file is in the way): logged, nothing panics.
        let blocked = dir.join("file");
        std::fs::write(&blocked, "x").unwrap();
        store(&blocked, 4, PTX);
        assert_eq!(load(&blocked, 4), None);
        std::fs::remove_dir_all(&dir).ok();
    }
}
