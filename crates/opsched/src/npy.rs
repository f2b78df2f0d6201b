//! A model's inputs and outputs as NumPy arrays: `--input x.npy` (a model with one input),
//! `--input NAME=FILE.npy` (repeated, one per input), `--output y.npy` (a model with one output)
//! and `--output out.npz` (every output, by name).
//!
//! Files are read and written with `ndarray-npy` (jturner314, the ndarray team's crate), not a
//! parser of ours. We weighed `npyz` too: it reads without ndarray, but its `.npz` support pulls
//! `zip` 0.6 with every compression and encryption backend (`bzip2-sys` and `zstd-sys` are C
//! builds), where `ndarray-npy` takes `zip` 6 without them; `.npz` archives made by
//! `numpy.savez` (uncompressed) read, `numpy.savez_compressed` ones are refused with a message.
//!
//! A `.npy` file is read whole and viewed in place (its header is checked against its length
//! before anything is allocated for the array), so a header claiming a huge shape costs
//! nothing. `float32` arrays are taken as they are (the models compute in `f32`), `int64` and
//! `int32` ones (token ids, attention masks) as `f32` where it holds every value exactly (up to
//! 2^24 in magnitude); another element type, or a larger integer, is an error naming the input. A model whose batch dimension is symbolic
//! takes the batch of the arrays: [`input_batch`] tells the loader which one.

use std::collections::HashMap;
use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};

use ndarray::{ArrayD, ArrayViewD, IxDyn};
use ndarray_npy::{NpzWriter, ViewNpyError, ViewNpyExt, WriteNpyExt};
use opsched_graph::{DType, Graph, NodeId, Tensor};

/// Errors reading or binding inputs and writing outputs; each names the file or the input.
#[derive(Debug, thiserror::Error)]
pub enum ArrayError {
    /// A file cannot be read or written, or holds no usable array.
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    /// An input does not fit the model (name, element type, shape).
    #[error("input '{input}': {message}")]
    Input { input: String, message: String },
    /// The arguments do not fit the model (an unnamed array for a model with several inputs,
    /// a `.npy` output for several outputs).
    #[error("{0}")]
    Usage(String),
}

fn file_err(path: &Path, message: impl Into<String>) -> ArrayError {
    ArrayError::File {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// One `--input` argument: `FILE.npy`, or `NAME=FILE.npy` for the model input `NAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputArg {
    pub name: Option<String>,
    pub path: PathBuf,
}

impl std::str::FromStr for InputArg {
    type Err = String;

    /// An existing file wins (its name may contain `=`); else `NAME=FILE` splits at the
    /// first `=`.
    fn from_str(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("an empty input argument".into());
        }
        match s.split_once('=') {
            Some((name, path)) if !Path::new(s).exists() => {
                if name.is_empty() || path.is_empty() {
                    return Err(format!("'{s}': expected NAME=FILE.npy or FILE.npy"));
                }
                Ok(InputArg {
                    name: Some(name.to_string()),
                    path: PathBuf::from(path),
                })
            }
            _ => Ok(InputArg {
                name: None,
                path: PathBuf::from(s),
            }),
        }
    }
}

/// An array read for an input.
#[derive(Clone, Debug, PartialEq)]
pub struct InputArray {
    pub name: Option<String>,
    pub path: PathBuf,
    pub tensor: Tensor,
}

/// NumPy's name of an element type descriptor (`'<f8'` is `float64`).
fn dtype_name(descr: &str) -> String {
    let code = descr.trim_start_matches(['<', '>', '|', '=']);
    let name = match code {
        "f2" => "float16",
        "f4" => "float32",
        "f8" => "float64",
        "i1" => "int8",
        "i2" => "int16",
        "i4" => "int32",
        "i8" => "int64",
        "u1" => "uint8",
        "u2" => "uint16",
        "u4" => "uint32",
        "u8" => "uint64",
        "b1" => "bool",
        _ => return format!("'{descr}'"),
    };
    name.to_string()
}

/// The largest integer magnitude up to which `f32` holds every integer (2^24).
const EXACT_IN_F32: i64 = 1 << 24;

/// An integer array (token ids, masks) as `f32`, where `f32` holds each value exactly.
fn ints_as_f32<T: Copy + Into<i64>>(view: ArrayViewD<'_, T>, name: &str) -> Result<Tensor, String> {
    let shape = view.shape().to_vec();
    let data = view
        .iter()
        .map(|&v| {
            let v: i64 = v.into();
            match v.abs() <= EXACT_IN_F32 {
                true => Ok(v as f32),
                false => Err(format!(
                    "holds {name} value {v}, beyond what float32 holds exactly (2^24)"
                )),
            }
        })
        .collect::<Result<Vec<f32>, String>>()?;
    Tensor::new(shape, data)
}

/// Decode one `.npy` image as `f32`: `float32` values as they are, `int64` and `int32` ones
/// (token ids, masks) converted where `f32` holds them exactly.
fn decode_npy(bytes: &[u8]) -> Result<Tensor, String> {
    if let Ok(v) = ArrayViewD::<i64>::view_npy(bytes) {
        return ints_as_f32(v, "int64");
    }
    if let Ok(v) = ArrayViewD::<i32>::view_npy(bytes) {
        return ints_as_f32(v, "int32");
    }
    let view = ArrayViewD::<f32>::view_npy(bytes).map_err(|e| match e {
        ViewNpyError::WrongDescriptor(d) => {
            let d = d.to_string();
            format!(
                "holds {} values; the model takes float32 (or int64 and int32 indices)",
                dtype_name(d.trim_matches(['\'', '"']))
            )
        }
        ViewNpyError::NonNativeEndian => "holds big-endian values; write it little-endian".into(),
        // The header parser's messages span lines (a caret under the column): keep one.
        e => format!(
            "not a readable .npy array: {}",
            e.to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        ),
    })?;
    let shape = view.shape().to_vec();
    let data: Vec<f32> = view.iter().copied().collect();
    Tensor::new(shape, data)
}

/// Read a `float32` `.npy` file.
pub fn read_npy(path: &Path) -> Result<Tensor, ArrayError> {
    let bytes = std::fs::read(path).map_err(|e| file_err(path, e.to_string()))?;
    decode_npy(&bytes).map_err(|m| file_err(path, m))
}

/// Read every array of an `.npz` file (as written by `numpy.savez`), by name.
pub fn read_npz(path: &Path) -> Result<Vec<(String, Tensor)>, ArrayError> {
    let file = std::fs::File::open(path).map_err(|e| file_err(path, e.to_string()))?;
    let mut zip = zip::ZipArchive::new(file)
        .map_err(|e| file_err(path, format!("not a readable .npz archive: {e}")))?;
    let mut out = Vec::with_capacity(zip.len());
    for i in 0..zip.len() {
        let mut entry = zip
            .by_index(i)
            .map_err(|e| file_err(path, format!("entry {i}: {e}")))?;
        let name = entry.name().to_string();
        let mut bytes = Vec::new();
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| file_err(path, format!("'{name}': {e}")))?;
        let t = decode_npy(&bytes).map_err(|m| file_err(path, format!("'{name}': {m}")))?;
        let name = name.strip_suffix(".npy").unwrap_or(&name).to_string();
        out.push((name, t));
    }
    Ok(out)
}

/// Read the arrays of `--input` arguments.
pub fn read_inputs(args: &[InputArg]) -> Result<Vec<InputArray>, ArrayError> {
    args.iter()
        .map(|a| {
            Ok(InputArray {
                name: a.name.clone(),
                path: a.path.clone(),
                tensor: read_npy(&a.path)?,
            })
        })
        .collect()
}

/// The batch the inputs give a model with a symbolic batch: the first dimension of the arrays,
/// when they all have one and agree (else `None`; binding then reports the mismatch).
pub fn input_batch(arrays: &[InputArray]) -> Option<usize> {
    let mut batch = None;
    for a in arrays {
        let b = *a.tensor.shape.first()?;
        if batch.is_some_and(|x| x != b) {
            return None;
        }
        batch = Some(b);
    }
    batch
}

/// Give each graph input its array: by name, or the one array to a model's one input. Every
/// input needs exactly one array of exactly its shape.
pub fn bind_inputs(
    g: &Graph,
    arrays: Vec<InputArray>,
) -> Result<HashMap<NodeId, Tensor>, ArrayError> {
    if g.dtype != DType::F32 {
        return Err(ArrayError::Usage(format!(
            "the model computes in {}; only f32 models take input arrays",
            g.dtype
        )));
    }
    let inputs: Vec<NodeId> = g.inputs().collect();
    let names = || {
        inputs
            .iter()
            .map(|&n| g.node(n).name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut bound: HashMap<NodeId, Tensor> = HashMap::new();
    let unnamed = arrays.iter().filter(|a| a.name.is_none()).count();
    if unnamed > 0 && (arrays.len() > 1 || inputs.len() != 1) {
        return Err(ArrayError::Usage(format!(
            "the model has {} inputs ({}); give each as --input NAME=FILE.npy",
            inputs.len(),
            names()
        )));
    }
    for a in arrays {
        let id = match &a.name {
            None => inputs[0],
            Some(name) => g
                .find(name)
                .filter(|&id| g.node(id).op.is_graph_input())
                .ok_or_else(|| ArrayError::Input {
                    input: name.clone(),
                    message: format!("the model has no such input (its inputs: {})", names()),
                })?,
        };
        let node = g.node(id);
        if a.tensor.shape != node.shape {
            return Err(ArrayError::Input {
                input: node.name.clone(),
                message: format!(
                    "{} has shape {:?}, the model takes {:?}",
                    a.path.display(),
                    a.tensor.shape,
                    node.shape
                ),
            });
        }
        if bound.insert(id, a.tensor).is_some() {
            return Err(ArrayError::Input {
                input: node.name.clone(),
                message: "given twice".into(),
            });
        }
    }
    if let Some(&missing) = inputs.iter().find(|id| !bound.contains_key(id)) {
        return Err(ArrayError::Input {
            input: g.node(missing).name.clone(),
            message: "is missing; give it as --input NAME=FILE.npy".into(),
        });
    }
    Ok(bound)
}

fn to_array(t: &Tensor) -> Result<ArrayD<f32>, String> {
    ArrayD::from_shape_vec(IxDyn(&t.shape), t.data.to_vec()).map_err(|e| e.to_string())
}

/// The bytes of the outputs file `path`: a `.npy` for a model's one output, a `.npz` (by
/// output name) for any number.
pub fn encode_outputs(path: &Path, outputs: &[(String, Tensor)]) -> Result<Vec<u8>, ArrayError> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let mut buf = Cursor::new(Vec::new());
    match ext.as_str() {
        "npy" => {
            let [(_, t)] = outputs else {
                return Err(ArrayError::Usage(format!(
                    "the model has {} outputs ({}); write them to an .npz file",
                    outputs.len(),
                    outputs
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            };
            to_array(t)
                .map_err(|m| file_err(path, m))?
                .write_npy(&mut buf)
                .map_err(|e| file_err(path, e.to_string()))?;
        }
        "npz" => {
            let mut npz = NpzWriter::new(&mut buf);
            for (name, t) in outputs {
                let a = to_array(t).map_err(|m| file_err(path, m))?;
                npz.add_array(name.as_str(), &a)
                    .map_err(|e| file_err(path, format!("'{name}': {e}")))?;
            }
            npz.finish().map_err(|e| file_err(path, e.to_string()))?;
        }
        _ => {
            return Err(file_err(
                path,
                "outputs are written to a .npy (one output) or .npz (all outputs) file",
            ))
        }
    }
    Ok(buf.into_inner())
}
