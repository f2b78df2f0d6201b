//! Errors of the graph crate. Every variant names the node (and, through
//! [`GraphError::InFile`], the file) it is about, so a user can find the fault.

use std::path::PathBuf;

/// Everything that can go wrong while building, validating or loading a graph.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// Two nodes share a name.
    #[error("node '{node}': duplicate node name")]
    DuplicateName { node: String },
    /// An input refers to a node that does not exist.
    #[error("node '{node}': input '{input}' is not produced by any node")]
    UnknownInput { node: String, input: String },
    /// The graph has a cycle; `node` lies on it.
    #[error("node '{node}': lies on a cycle")]
    Cycle { node: String },
    /// Shape inference failed for the node.
    #[error("node '{node}': {message}")]
    Shape { node: String, message: String },
    /// The file declares an output shape that differs from the inferred one.
    #[error("node '{node}': declared output shape {declared:?} but inferred {inferred:?}")]
    DeclaredShape {
        node: String,
        declared: Vec<usize>,
        inferred: Vec<usize>,
    },
    /// A field is missing, unknown or out of range.
    #[error("{location}: {message}")]
    Invalid { location: String, message: String },
    /// The JSON text does not parse or does not match the expected schema.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// The file's format could not be recognised.
    #[error("unrecognised graph format: {0}")]
    UnknownFormat(String),
    /// A zoo model name that does not exist.
    #[error(transparent)]
    UnknownModel(crate::names::UnknownName),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Any of the above, located in a file.
    #[error("{path}: {source}")]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<GraphError>,
    },
}

impl GraphError {
    /// Attach the file the error came from (once; an error already located keeps its file).
    pub fn in_file(self, path: impl Into<PathBuf>) -> Self {
        match self {
            e @ (GraphError::InFile { .. } | GraphError::Io { .. }) => e,
            e => GraphError::InFile {
                path: path.into(),
                source: Box::new(e),
            },
        }
    }

    pub(crate) fn invalid(location: impl Into<String>, message: impl Into<String>) -> Self {
        GraphError::Invalid {
            location: location.into(),
            message: message.into(),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = GraphError> = std::result::Result<T, E>;
