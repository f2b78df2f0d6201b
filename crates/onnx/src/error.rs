//! Errors of the ONNX import. Every variant names what it is about (the node and its operator
//! type, the graph input, the initializer) and, through [`OnnxError::InFile`], the file.
//!
//! Messages are one line and complete: a variant that shows an inner error in its message does
//! not also return it as its `source()`, so printing the chain (as `anyhow`'s `{:#}` does) does
//! not repeat it.

use std::path::PathBuf;

use opsched_graph::GraphError;

/// Everything that can go wrong while importing an ONNX model.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// Reading the file failed.
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The bytes are not an ONNX protobuf message (truncated, or another kind of file).
    #[error("not an ONNX model: the protobuf does not decode ({0}); is the file truncated?")]
    Decode(prost::DecodeError),
    /// The model has no graph (or an empty one).
    #[error("not an ONNX model: {0}")]
    NotAModel(String),
    /// Operators the importer does not map, with their counts, in name order.
    #[error(
        "unsupported ONNX operators: {} (with --allow-unknown they are imported as opaque \
         operators costed by their tensor sizes)",
        list_ops(.ops)
    )]
    Unsupported { ops: Vec<(String, usize)> },
    /// A node cannot be imported.
    #[error("node '{node}' ({op_type}): {message}")]
    Node {
        node: String,
        op_type: String,
        message: String,
    },
    /// A graph input cannot be imported (e.g. a dynamic dimension with no value).
    #[error("graph input '{input}': {message}")]
    Input { input: String, message: String },
    /// A graph output cannot be imported (nothing produces it).
    #[error("graph output '{output}': {message}")]
    Output { output: String, message: String },
    /// An initializer is malformed, or its values cannot be read (external data outside the
    /// model's folder, a short file, a wrong length).
    #[error("initializer '{name}': {message}")]
    Initializer { name: String, message: String },
    /// The imported graph does not validate.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// Any of the above, located in a file.
    #[error("{path}: {error}")]
    InFile {
        path: PathBuf,
        error: Box<OnnxError>,
    },
}

impl From<prost::DecodeError> for OnnxError {
    fn from(e: prost::DecodeError) -> Self {
        OnnxError::Decode(e)
    }
}

impl OnnxError {
    /// Attach the file the error came from (once).
    pub fn in_file(self, path: impl Into<PathBuf>) -> Self {
        match self {
            e @ (OnnxError::InFile { .. } | OnnxError::Io { .. }) => e,
            e => OnnxError::InFile {
                path: path.into(),
                error: Box::new(e),
            },
        }
    }

    /// The error without its file location.
    pub fn located(&self) -> &OnnxError {
        match self {
            OnnxError::InFile { error, .. } => error.located(),
            e => e,
        }
    }
}

/// `s` with control characters escaped (`\n` as `\\n`): names and values from a file may hold
/// any character, and an error stays one line.
fn escaped(s: String) -> String {
    if s.chars().any(char::is_control) {
        s.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect()
    } else {
        s
    }
}

impl OnnxError {
    /// The error with control characters escaped in every name and message it holds (all of
    /// them may come from the file), so that it prints as one line.
    pub fn escape_controls(self) -> Self {
        use GraphError as G;
        let e = escaped;
        match self {
            OnnxError::Unsupported { ops } => OnnxError::Unsupported {
                ops: ops.into_iter().map(|(op, n)| (e(op), n)).collect(),
            },
            OnnxError::NotAModel(m) => OnnxError::NotAModel(e(m)),
            OnnxError::Node {
                node,
                op_type,
                message,
            } => OnnxError::Node {
                node: e(node),
                op_type: e(op_type),
                message: e(message),
            },
            OnnxError::Input { input, message } => OnnxError::Input {
                input: e(input),
                message: e(message),
            },
            OnnxError::Output { output, message } => OnnxError::Output {
                output: e(output),
                message: e(message),
            },
            OnnxError::Initializer { name, message } => OnnxError::Initializer {
                name: e(name),
                message: e(message),
            },
            OnnxError::Graph(g) => OnnxError::Graph(match g {
                G::DuplicateName { node } => G::DuplicateName { node: e(node) },
                G::UnknownInput { node, input } => G::UnknownInput {
                    node: e(node),
                    input: e(input),
                },
                G::Cycle { node } => G::Cycle { node: e(node) },
                G::Shape { node, message } => G::Shape {
                    node: e(node),
                    message: e(message),
                },
                G::DeclaredShape {
                    node,
                    declared,
                    inferred,
                } => G::DeclaredShape {
                    node: e(node),
                    declared,
                    inferred,
                },
                G::Invalid { location, message } => G::Invalid {
                    location: e(location),
                    message: e(message),
                },
                other => other,
            }),
            OnnxError::InFile { path, error } => OnnxError::InFile {
                path,
                error: Box::new(error.escape_controls()),
            },
            other => other,
        }
    }
}

/// `"Foo x2, Bar x1"`.
fn list_ops(ops: &[(String, usize)]) -> String {
    ops.iter()
        .map(|(op, n)| format!("{op} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Result alias of this crate.
pub type Result<T, E = OnnxError> = std::result::Result<T, E>;
