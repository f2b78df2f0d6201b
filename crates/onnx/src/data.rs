//! Tensor values: the typed fields of a `TensorProto`, its `raw_data`, or a range of an external
//! data file, converted to `f32` (the element type every kernel computes in).
//!
//! External data is read only from regular files inside the model's folder: a `location` that
//! is absolute, climbs out with `..`, resolves (through symbolic links) to a path outside the
//! folder, or names something other than a regular file (a FIFO, a device, a directory) is an
//! error naming the location. The file type is checked before the file is opened, and the file
//! is opened without blocking and checked again, so a FIFO can never hang the import. Errors
//! never quote the file's contents.
//!
//! Ranges are read with positioned reads rather than memory-mapped: every tensor is converted
//! to `f32` (a copy either way), and a mapped file that another process truncates kills the
//! reader with `SIGBUS` instead of returning an error.

use std::fs::File;
use std::path::{Component, Path, PathBuf};

use opsched_graph::Tensor;

use crate::proto::{data_type, TensorProto};

/// Most values one tensor may hold (2^40): beyond, the file is corrupt.
pub const MAX_VALUES: u64 = 1 << 40;

/// Where a tensor's external data is: file, offset and length (in bytes) as the file says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalRef {
    pub location: String,
    pub offset: u64,
    pub length: Option<u64>,
}

/// The external data reference of a tensor, `None` when its data is inline. Malformed
/// entries (no location, a location that leaves the folder, offsets that do not parse) are
/// errors naming the tensor's location.
pub fn external_ref(t: &TensorProto) -> Result<Option<ExternalRef>, String> {
    if t.data_location != 1 && t.external_data.is_empty() {
        return Ok(None);
    }
    let get = |k: &str| {
        t.external_data
            .iter()
            .find(|e| e.key == k)
            .map(|e| e.value.as_str())
    };
    let location = get("location")
        .ok_or_else(|| format!("tensor '{}': external data without a location", t.name))?;
    check_location(location)?;
    let number = |k: &str| -> Result<Option<u64>, String> {
        get(k)
            .map(|v| {
                v.trim().parse::<u64>().map_err(|_| {
                    format!("external data '{location}': {k} '{v}' is not a non-negative integer")
                })
            })
            .transpose()
    };
    Ok(Some(ExternalRef {
        location: location.to_string(),
        offset: number("offset")?.unwrap_or(0),
        length: number("length")?,
    }))
}

/// A location must be a relative path that stays inside the model's folder.
pub fn check_location(location: &str) -> Result<(), String> {
    let bad = |why: &str| format!("external data '{location}': {why}");
    if location.is_empty() {
        return Err(bad("the location is empty"));
    }
    if location.contains('\0') {
        return Err(bad("the location contains a NUL byte"));
    }
    let p = Path::new(location);
    if p.is_absolute() || location.starts_with('/') || location.starts_with('\\') {
        return Err(bad(
            "an absolute location; it must be relative to the model's folder",
        ));
    }
    if p.components().any(|c| {
        matches!(
            c,
            Component::ParentDir | Component::RootDir | Component::Prefix(_)
        )
    }) {
        return Err(bad("the location leaves the model's folder"));
    }
    Ok(())
}

/// Opens external data files inside one folder (the model's), and only regular files.
#[derive(Clone, Debug)]
pub struct Folder {
    dir: Option<PathBuf>,
}

impl Folder {
    /// External files are looked up in `dir` (an empty path is the current directory);
    /// `None` (a model given as bytes) reads no external data at all.
    pub fn new(dir: Option<&Path>) -> Folder {
        Folder {
            dir: dir.map(Path::to_path_buf),
        }
    }

    /// Open `location` (already checked by [`check_location`]): the resolved path must lie
    /// inside the folder and be a regular file, checked before opening and again on the open
    /// file. Returns the file and its length.
    pub fn open(&self, location: &str) -> Result<(File, u64), String> {
        check_location(location)?;
        let bad = |why: String| format!("external data '{location}': {why}");
        let dir = match &self.dir {
            Some(d) if !d.as_os_str().is_empty() => d.clone(),
            Some(_) => PathBuf::from("."),
            None => return Err(bad("the model was given without its folder".into())),
        };
        let root = dir
            .canonicalize()
            .map_err(|e| bad(format!("the model's folder: {e}")))?;
        let path = root
            .join(location)
            .canonicalize()
            .map_err(|e| bad(format!("cannot be opened: {}", io_reason(&e))))?;
        if !path.starts_with(&root) {
            return Err(bad("resolves to a file outside the model's folder".into()));
        }
        let meta = std::fs::metadata(&path).map_err(|e| bad(io_reason(&e)))?;
        if !meta.is_file() {
            return Err(bad("is not a regular file".into()));
        }
        let file = open_nonblocking(&path).map_err(|e| bad(io_reason(&e)))?;
        let meta = file.metadata().map_err(|e| bad(io_reason(&e)))?;
        if !meta.is_file() {
            return Err(bad("is not a regular file".into()));
        }
        Ok((file, meta.len()))
    }

    /// Read `len` bytes at `offset` of `location`; the range must lie inside the file.
    pub fn read(&self, location: &str, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        let (file, size) = self.open(location)?;
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= size)
            .ok_or_else(|| {
                format!(
                    "external data '{location}': bytes {offset}..{} lie beyond the file's {size} bytes",
                    offset.saturating_add(len)
                )
            })?;
        let n = usize::try_from(len)
            .map_err(|_| format!("external data '{location}': {len} bytes do not fit in memory"))?;
        let mut buf = vec![0u8; n];
        read_at(&file, &mut buf, offset).map_err(|e| {
            format!(
                "external data '{location}': reading bytes {offset}..{end}: {}",
                io_reason(&e)
            )
        })?;
        Ok(buf)
    }
}

/// An I/O error's reason without the path (the caller names the location).
fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.kind().to_string(),
    }
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    File::open(path)
}

#[cfg(unix)]
fn read_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(f, buf, offset)
}

#[cfg(not(unix))]
fn read_at(mut f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    f.seek(SeekFrom::Start(offset))?;
    f.read_exact(buf)
}

/// Bytes per element of the types we convert, `None` for the others (strings, complex, ...).
pub fn element_size(dtype: i32) -> Option<u64> {
    Some(match dtype {
        data_type::FLOAT | data_type::INT32 => 4,
        data_type::DOUBLE | data_type::INT64 => 8,
        data_type::FLOAT16 | data_type::BFLOAT16 => 2,
        data_type::INT8 | data_type::UINT8 | data_type::BOOL => 1,
        4 | 5 => 2, // uint16, int16
        12 => 4,    // uint32
        13 => 8,    // uint64
        _ => return None,
    })
}

/// The dimensions of a tensor as a shape, checked: non-negative, at most [`MAX_VALUES`]
/// elements.
pub fn dims(t: &TensorProto) -> Result<(Vec<usize>, u64), String> {
    let mut n = 1u64;
    let mut shape = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        let u = u64::try_from(d).map_err(|_| format!("dimension {d} is negative"))?;
        n = n
            .checked_mul(u)
            .filter(|&n| n <= MAX_VALUES)
            .ok_or_else(|| format!("dimensions {:?} have more than 2^40 elements", t.dims))?;
        shape.push(usize::try_from(u).map_err(|_| format!("dimension {d} is too large"))?);
    }
    Ok((shape, n))
}

/// Decode little-endian values of `dtype` to `f32`.
fn decode(raw: &[u8], dtype: i32) -> Result<Vec<f32>, String> {
    fn each<const N: usize>(raw: &[u8], f: impl Fn([u8; N]) -> f32) -> Vec<f32> {
        raw.chunks_exact(N)
            .map(|c| {
                let mut b = [0u8; N];
                b.copy_from_slice(c);
                f(b)
            })
            .collect()
    }
    Ok(match dtype {
        data_type::FLOAT => each(raw, f32::from_le_bytes),
        data_type::DOUBLE => each(raw, |b| f64::from_le_bytes(b) as f32),
        data_type::FLOAT16 => each(raw, |b| half::f16::from_le_bytes(b).to_f32()),
        data_type::BFLOAT16 => each(raw, |b| half::bf16::from_le_bytes(b).to_f32()),
        data_type::INT64 => each(raw, |b| i64::from_le_bytes(b) as f32),
        data_type::INT32 => each(raw, |b| i32::from_le_bytes(b) as f32),
        13 => each(raw, |b| u64::from_le_bytes(b) as f32),
        12 => each(raw, |b| u32::from_le_bytes(b) as f32),
        5 => each(raw, |b| f32::from(i16::from_le_bytes(b))),
        4 => each(raw, |b| f32::from(u16::from_le_bytes(b))),
        data_type::INT8 => raw.iter().map(|&b| f32::from(b as i8)).collect(),
        data_type::UINT8 | data_type::BOOL => raw.iter().map(|&b| f32::from(b)).collect(),
        other => return Err(format!("element type {other} is not a number type we read")),
    })
}

/// The values of a tensor as `f32`: from its typed fields, `raw_data` or external data (read
/// through `folder`). The number of values must match the dimensions exactly.
pub fn load(t: &TensorProto, folder: &Folder) -> Result<Tensor, String> {
    let (shape, n) = dims(t)?;
    let size = element_size(t.data_type)
        .ok_or_else(|| format!("element type {} is not a number type we read", t.data_type))?;
    let bytes = n
        .checked_mul(size)
        .ok_or_else(|| format!("{n} elements overflow"))?;
    let mismatch = |got: u64, unit: &str| {
        format!(
            "holds {got} {unit}, its dimensions {:?} need {}",
            t.dims,
            if unit == "bytes" { bytes } else { n }
        )
    };
    let values: Vec<f32> = if let Some(ext) = external_ref(t)? {
        if let Some(len) = ext.length {
            if len != bytes {
                return Err(format!(
                    "external data '{}': length {len} but the dimensions {:?} need {bytes} bytes",
                    ext.location, t.dims
                ));
            }
        }
        decode(&folder.read(&ext.location, ext.offset, bytes)?, t.data_type)?
    } else if !t.raw_data.is_empty() || n == 0 {
        if t.raw_data.len() as u64 != bytes {
            return Err(mismatch(t.raw_data.len() as u64, "bytes"));
        }
        decode(&t.raw_data, t.data_type)?
    } else {
        let count = |len: usize| -> Result<(), String> {
            if len as u64 == n {
                Ok(())
            } else {
                Err(mismatch(len as u64, "values"))
            }
        };
        match t.data_type {
            data_type::FLOAT => {
                count(t.float_data.len())?;
                t.float_data.clone()
            }
            data_type::DOUBLE => {
                count(t.double_data.len())?;
                t.double_data.iter().map(|&v| v as f32).collect()
            }
            data_type::INT64 => {
                count(t.int64_data.len())?;
                t.int64_data.iter().map(|&v| v as f32).collect()
            }
            // float16 and bfloat16 keep their bits in int32_data, as do the small integers.
            data_type::FLOAT16 => {
                count(t.int32_data.len())?;
                t.int32_data
                    .iter()
                    .map(|&v| half::f16::from_bits(v as u16).to_f32())
                    .collect()
            }
            data_type::BFLOAT16 => {
                count(t.int32_data.len())?;
                t.int32_data
                    .iter()
                    .map(|&v| half::bf16::from_bits(v as u16).to_f32())
                    .collect()
            }
            data_type::INT32 | data_type::INT8 | data_type::UINT8 | data_type::BOOL | 4 | 5 => {
                count(t.int32_data.len())?;
                t.int32_data.iter().map(|&v| v as f32).collect()
            }
            other => {
                return Err(format!(
                    "element type {other} stored in a typed field we do not read"
                ))
            }
        }
    };
    Tensor::new(shape, values)
}
