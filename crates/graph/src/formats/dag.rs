//! Cost-annotated DAG JSON (to be written).

use crate::error::{GraphError, Result};
use crate::graph::Graph;

/// The value of the `format` field.
pub const FORMAT: &str = "opsched-dag";

/// Parse a cost-annotated DAG document.
pub fn from_value(_doc: serde_json::Value) -> Result<Graph> {
    Err(GraphError::UnknownFormat(
        "DAG import not yet implemented".into(),
    ))
}
