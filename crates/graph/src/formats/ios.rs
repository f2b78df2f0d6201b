//! IOS graph JSON import (to be written).

use crate::error::{GraphError, Result};
use crate::graph::Graph;

/// Parse an IOS graph JSON document.
pub fn from_value(_doc: serde_json::Value) -> Result<Graph> {
    Err(GraphError::UnknownFormat(
        "IOS import not yet implemented".into(),
    ))
}
