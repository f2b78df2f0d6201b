//! The persistent cost cache: measurements of operators and stages, keyed by the device they
//! were taken on ([`DeviceFingerprint`]), the operator's [`signature`](crate::signature), its
//! batch and its element type.
//!
//! # File format (version 1)
//!
//! All integers little-endian:
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..8 | magic `b"OPSCHEDC"` |
//! | 8..12 | `u32` format version, [`FORMAT_VERSION`] |
//! | 12..20 | `u64` payload length in bytes |
//! | 20..28 | `u64` FNV-1a 64 checksum of the payload ([`fnv1a64`]) |
//! | 28.. | payload: bincode 2 (serde, standard config) of `Vec<(CacheKey, Measurement)>`, sorted by key |
//!
//! The file must be exactly `28 + payload length` bytes long.
//!
//! # Damaged and foreign files
//!
//! A file that is truncated, too long, has the wrong magic, a bad checksum, an undecodable
//! payload or an unknown older version is *moved aside* to `<path>.corrupt-<unix seconds>`
//! (never deleted), a `tracing::warn!` says so, [`CostCache::recovered`] returns a note, and the
//! cache starts empty. A file written by a *newer* format version is left untouched and
//! [`CostCache::open`] (or [`CostCache::save`]) returns [`CostError::Cache`] naming the path and
//! both versions: overwriting it would lose a newer tool's data.
//!
//! # Writes and concurrency
//!
//! Writes go through [`opsched_io::write`]: the new file is written to a temporary file in the
//! same directory, fsynced and renamed over the cache file, and the directory is fsynced (where
//! the platform allows it). Readers therefore see the old or the new file, never a mix, and a
//! failed write leaves the old file as it was.
//!
//! A cache path that is a symbolic link is followed to its target when the cache is opened:
//! the data, the lock file and a damaged file moved aside all sit beside the *target*, so
//! writers that reach one cache through different links exclude each other. A path that names
//! something other than a regular file (a folder, a FIFO, a device such as `/dev/null`) is
//! refused: it is never read, locked beside, moved aside or replaced.
//!
//! Several processes (or threads, each with its own [`CostCache`]) may add entries at once
//! without losing any: every read-modify-write of the file happens while holding an exclusive
//! lock (`std::fs::File::lock`, an OS advisory lock: `flock` on Unix, `LockFileEx` on Windows)
//! on the sidecar file `<target>.lock`. The lock file is created on demand and never removed
//! (removing it would let two processes lock different files). [`CostCache::save`]:
//! 1. takes the lock;
//! 2. re-reads the file from disk;
//! 3. merges: the union of both entry sets; where both hold a key, the entry **this cache
//!    inserted since its last save wins** (it is the newest measurement this process knows);
//!    for keys this cache only loaded from disk earlier, the disk's current entry wins (another
//!    process may have re-measured it since);
//! 4. writes atomically, then releases the lock (also on error, when the lock file is closed).
//!
//! [`CostCache::open`] and [`CostCache::merge_from_disk`] read under the same lock (or, where
//! the lock file cannot be created, e.g. a read-only directory, without it after a warning:
//! atomic renames keep the read whole).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::CostError;

/// The magic bytes opening a cache file.
pub const MAGIC: &[u8; 8] = b"OPSCHEDC";
/// The format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of the header before the payload.
pub const HEADER_LEN: usize = 28;
/// The environment variable that overrides the default cache location.
pub const ENV_VAR: &str = "OPSCHED_CACHE";

/// Signatures that start with this are measurements of candidate kernels (e.g. cuDNN's
/// convolution algorithms, see `opsched_gpu::tuning`), not operator or stage costs.
pub const KERNEL_PREFIX: &str = "kernel.";

/// Payloads larger than this (1 GiB) are refused: a guard against decoding garbage.
const MAX_PAYLOAD: usize = 1 << 30;

type Result<T> = std::result::Result<T, CostError>;

/// What identifies a GPU setup whose measurements are interchangeable.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceFingerprint {
    /// Device name as the driver reports it, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// Streaming multiprocessors (distinguishes MIG slices and cut-down parts).
    pub sms: u32,
    /// Driver version.
    pub driver: String,
    /// cuDNN version (empty when not used).
    pub cudnn: String,
}

/// The key of one measurement.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CacheKey {
    pub device: DeviceFingerprint,
    /// An operator's [`op_signature`](crate::signature::op_signature) or a stage's
    /// [`stage_signature`](crate::signature::stage_signature).
    pub signature: String,
    pub batch: u32,
    /// "f32" or "f16".
    pub dtype: String,
}

/// Timing statistics of one measured operator or stage, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    pub median_ms: f64,
    pub p10_ms: f64,
    pub p90_ms: f64,
    /// Timed repetitions (0 for a time given rather than measured).
    pub repeats: u32,
}

impl Measurement {
    /// A single known time (all percentiles equal, no repetitions).
    pub fn exact(ms: f64) -> Self {
        Measurement {
            median_ms: ms,
            p10_ms: ms,
            p90_ms: ms,
            repeats: 0,
        }
    }
}

/// FNV-1a, 64 bits: the checksum of the payload.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The default cache location for a given value of `OPSCHED_CACHE` and platform cache
/// directory: the variable if set and non-empty, else `<cache_dir>/opsched/costs.bin`.
pub fn resolve_default_path(
    env_value: Option<&OsStr>,
    cache_dir: Option<&Path>,
) -> Result<PathBuf> {
    if let Some(v) = env_value.filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(v));
    }
    match cache_dir {
        Some(dir) => Ok(dir.join("opsched").join("costs.bin")),
        None => Err(CostError::Cache {
            path: PathBuf::from(format!("${ENV_VAR}")),
            message: format!(
                "no cache location: {ENV_VAR} is not set and this platform has no cache directory"
            ),
        }),
    }
}

/// The default cache location: `$OPSCHED_CACHE` if set, else the platform cache directory's
/// `opsched/costs.bin` (e.g. `~/.cache/opsched/costs.bin` on Linux).
pub fn default_path() -> Result<PathBuf> {
    let env = std::env::var_os(ENV_VAR);
    resolve_default_path(env.as_deref(), dirs::cache_dir().as_deref())
}

/// A persistent map from [`CacheKey`] to [`Measurement`].
#[derive(Debug)]
pub struct CostCache {
    /// The path as given (for messages).
    path: PathBuf,
    /// `path` with symbolic links followed: the file read, written, locked beside.
    target: PathBuf,
    entries: BTreeMap<CacheKey, Measurement>,
    /// Keys inserted since the last save: they win over the disk when merging.
    dirty: BTreeSet<CacheKey>,
    recovered: Option<String>,
}

/// What reading the file found.
enum Loaded {
    Missing,
    Entries(Vec<(CacheKey, Measurement)>),
    /// Damaged: why. The file is still in place.
    Damaged(String),
}

/// An exclusive lock on `<path>.lock`, released when dropped (closing the file releases it).
struct LockGuard {
    file: File,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s: OsString = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// An I/O failure on a cache file: `cost cache PATH: what: why`.
fn io_err(path: &Path, what: &str, source: io::Error) -> CostError {
    CostError::Cache {
        path: path.to_path_buf(),
        message: format!("{what}: {source}"),
    }
}

/// The cache file `path` names, links followed; a folder, FIFO or device is refused.
fn resolve(path: &Path) -> Result<PathBuf> {
    let target = opsched_io::resolve(path).map_err(|e| CostError::Cache {
        path: path.to_path_buf(),
        message: e.message,
    })?;
    match fs::metadata(&target) {
        Ok(m) if !m.is_file() => Err(CostError::Cache {
            path: path.to_path_buf(),
            message: "not a regular file (a cache is a file of its own; a folder, FIFO or \
                      device cannot hold one)"
                .into(),
        }),
        Ok(_) => Ok(target),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(target),
        Err(e) => Err(io_err(path, "cannot read", e)),
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn lock(path: &Path) -> Result<LockGuard> {
    let lock_path = with_suffix(path, ".lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&lock_path)
        .map_err(|e| io_err(&lock_path, "cannot open the lock file", e))?;
    file.lock()
        .map_err(|e| io_err(&lock_path, "cannot lock", e))?;
    Ok(LockGuard { file })
}

/// The lock for reading: a cache in a read-only place (a shared or committed file) can still be
/// read without it, with a warning (a concurrent writer's atomic rename keeps the read whole).
fn read_lock(path: &Path) -> Option<LockGuard> {
    match lock(path) {
        Ok(g) => Some(g),
        Err(e) => {
            tracing::warn!(
                "cost cache {}: reading without the lock: {e}",
                path.display()
            );
            None
        }
    }
}

/// Parse a cache file's bytes. `Err` only for a newer format version.
fn parse(
    path: &Path,
    bytes: &[u8],
) -> Result<std::result::Result<Vec<(CacheKey, Measurement)>, String>> {
    let total = bytes.len();
    if total < 12 {
        return Ok(Err(format!(
            "truncated: {total} bytes, shorter than the {HEADER_LEN}-byte header"
        )));
    }
    if &bytes[0..8] != MAGIC {
        return Ok(Err("wrong magic: not an opsched cost cache".into()));
    }
    let mut v = [0u8; 4];
    v.copy_from_slice(&bytes[8..12]);
    let version = u32::from_le_bytes(v);
    if version > FORMAT_VERSION {
        return Err(CostError::Cache {
            path: path.to_path_buf(),
            message: format!(
                "written by a newer opsched (cache format version {version}; this build reads \
                 version {FORMAT_VERSION}); left untouched: upgrade opsched or point \
                 {ENV_VAR} elsewhere"
            ),
        });
    }
    if version != FORMAT_VERSION {
        return Ok(Err(format!("unknown format version {version}")));
    }
    if total < HEADER_LEN {
        return Ok(Err(format!(
            "truncated: {total} bytes, shorter than the {HEADER_LEN}-byte header"
        )));
    }
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[12..20]);
    let len = u64::from_le_bytes(w);
    w.copy_from_slice(&bytes[20..28]);
    let checksum = u64::from_le_bytes(w);
    let have = (total - HEADER_LEN) as u64;
    if len > MAX_PAYLOAD as u64 {
        return Ok(Err(format!("implausible payload length {len}")));
    }
    if have < len {
        return Ok(Err(format!("truncated: payload has {have} of {len} bytes")));
    }
    if have > len {
        return Ok(Err(format!(
            "{} unexpected bytes after the {len}-byte payload",
            have - len
        )));
    }
    let payload = &bytes[HEADER_LEN..];
    let actual = fnv1a64(payload);
    if actual != checksum {
        return Ok(Err(format!(
            "checksum mismatch (stored {checksum:016x}, computed {actual:016x})"
        )));
    }
    let config = bincode::config::standard().with_limit::<MAX_PAYLOAD>();
    match bincode::serde::decode_from_slice::<Vec<(CacheKey, Measurement)>, _>(payload, config) {
        Ok((entries, used)) if used == payload.len() => Ok(Ok(entries)),
        Ok((_, used)) => Ok(Err(format!(
            "payload decodes in {used} of {} bytes",
            payload.len()
        ))),
        Err(e) => Ok(Err(format!("undecodable payload: {e}"))),
    }
}

fn read(path: &Path) -> Result<Loaded> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Loaded::Missing),
        Err(e) => return Err(io_err(path, "cannot read", e)),
    };
    Ok(match parse(path, &bytes)? {
        Ok(entries) => Loaded::Entries(entries),
        Err(why) => Loaded::Damaged(why),
    })
}

/// Move a damaged file aside; returns the note for [`CostCache::recovered`].
fn move_aside(path: &Path, why: &str) -> Result<String> {
    let stamp = unix_now();
    let mut target = with_suffix(path, &format!(".corrupt-{stamp}"));
    let mut n = 1;
    while target.exists() {
        target = with_suffix(path, &format!(".corrupt-{stamp}-{n}"));
        n += 1;
    }
    fs::rename(path, &target).map_err(|e| CostError::Cache {
        path: path.to_path_buf(),
        message: format!(
            "damaged ({why}) and could not be moved aside to {}: {e}",
            target.display()
        ),
    })?;
    let note = format!(
        "{} was damaged ({why}); moved aside to {} and started an empty cache",
        path.display(),
        target.display()
    );
    tracing::warn!("cost cache: {note}");
    Ok(note)
}

fn encode(path: &Path, entries: &BTreeMap<CacheKey, Measurement>) -> Result<Vec<u8>> {
    let list: Vec<(&CacheKey, &Measurement)> = entries.iter().collect();
    let payload =
        bincode::serde::encode_to_vec(&list, bincode::config::standard()).map_err(|e| {
            CostError::Cache {
                path: path.to_path_buf(),
                message: format!("cannot encode entries: {e}"),
            }
        })?;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&fnv1a64(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

impl CostCache {
    /// Open the cache at `path`. A missing file gives an empty cache (the file and its directory
    /// are created by the first [`save`](Self::save)); a damaged one is moved aside (see the
    /// module documentation); a newer format version is an error.
    pub fn open(path: impl Into<PathBuf>) -> Result<CostCache> {
        let path = path.into();
        let target = resolve(&path)?;
        let mut cache = CostCache {
            path,
            target,
            entries: BTreeMap::new(),
            dirty: BTreeSet::new(),
            recovered: None,
        };
        if !cache.target.exists() {
            tracing::debug!("cost cache {}: no file yet", cache.path.display());
            return Ok(cache);
        }
        let _guard = read_lock(&cache.target);
        match read(&cache.target)? {
            Loaded::Missing => {}
            Loaded::Entries(list) => cache.entries = list.into_iter().collect(),
            Loaded::Damaged(why) => cache.recovered = Some(move_aside(&cache.target, &why)?),
        }
        tracing::debug!(
            "cost cache {}: {} entries",
            cache.path.display(),
            cache.entries.len()
        );
        Ok(cache)
    }

    /// Open the cache at [`default_path`].
    pub fn open_default() -> Result<CostCache> {
        Self::open(default_path()?)
    }

    /// The path this cache was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file this cache reads and writes: [`path`](Self::path) with symbolic links followed.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Whether the cache file exists (a cache opened on a missing file is empty until saved).
    pub fn exists(&self) -> bool {
        self.target.is_file()
    }

    /// If the file was damaged when this cache read it: what was wrong and where the damaged
    /// file was moved.
    pub fn recovered(&self) -> Option<&str> {
        self.recovered.as_deref()
    }

    pub fn get(&self, key: &CacheKey) -> Option<&Measurement> {
        self.entries.get(key)
    }

    /// Add or replace a measurement (in memory until [`save`](Self::save)).
    pub fn insert(&mut self, key: CacheKey, m: Measurement) {
        self.dirty.insert(key.clone());
        self.entries.insert(key, m);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether entries were inserted since the last save.
    pub fn is_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// All entries, sorted by key.
    pub fn entries(&self) -> impl Iterator<Item = (&CacheKey, &Measurement)> + '_ {
        self.entries.iter()
    }

    /// Entries measured on devices named `name` (any driver, cuDNN or SM count).
    pub fn entries_for_device<'a>(
        &'a self,
        name: &'a str,
    ) -> impl Iterator<Item = (&'a CacheKey, &'a Measurement)> + 'a {
        self.entries
            .iter()
            .filter(move |(k, _)| k.device.name == name)
    }

    /// Merge the on-disk entries (under the lock): entries new to this cache are added; for keys
    /// this cache inserted since its last save, ours are kept; others take the disk's value.
    /// Returns how many entries were added or changed. A damaged file is moved aside.
    pub fn merge_from_disk(&mut self) -> Result<usize> {
        if !self.target.exists() {
            return Ok(0);
        }
        let _guard = read_lock(&self.target);
        self.merge_locked()
    }

    fn merge_locked(&mut self) -> Result<usize> {
        let mut changed = 0;
        match read(&self.target)? {
            Loaded::Missing => {}
            Loaded::Damaged(why) => self.recovered = Some(move_aside(&self.target, &why)?),
            Loaded::Entries(list) => {
                for (k, m) in list {
                    if self.dirty.contains(&k) {
                        continue;
                    }
                    if self.entries.get(&k) != Some(&m) {
                        self.entries.insert(k, m);
                        changed += 1;
                    }
                }
            }
        }
        Ok(changed)
    }

    /// Write the cache: under the lock, re-read the file, merge (see the module documentation),
    /// write atomically. Creates the cache file's own directory if needed (nothing else).
    /// Afterwards this cache holds the merged entries and nothing is dirty.
    pub fn save(&mut self) -> Result<()> {
        if let Some(dir) = self.target.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(|e| io_err(dir, "cannot create the folder", e))?;
        }
        let _guard = lock(&self.target)?;
        self.merge_locked()?;
        let bytes = encode(&self.path, &self.entries)?;
        opsched_io::write(&self.target, &bytes).map_err(|e| CostError::Cache {
            path: self.path.clone(),
            message: format!("cannot write: {}", e.message),
        })?;
        tracing::debug!(
            "cost cache {}: saved {} entries ({} new here)",
            self.path.display(),
            self.entries.len(),
            self.dirty.len()
        );
        self.dirty.clear();
        Ok(())
    }

    /// Same as [`save`](Self::save).
    pub fn flush(&mut self) -> Result<()> {
        self.save()
    }
}
