//! Graph file formats: our graph JSON ([`json`]), IOS graph JSON ([`ios`]), cost-annotated DAG
//! JSON ([`dag`]) and DOT export ([`dot`]). [`load_file`] detects the format of a file.

use std::path::Path;

use crate::error::{GraphError, Result};
use crate::graph::Graph;

pub mod dag;
pub mod dot;
pub mod ios;
pub mod json;

/// The formats a graph file can be in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `{"format": "opsched-graph", ...}`
    Opsched,
    /// IOS graph JSON: `{"name", "input", "blocks"}`
    Ios,
    /// `{"format": "opsched-dag", ...}`
    Dag,
}

impl Format {
    /// Every format [`load_file`] reads.
    pub const ALL: [Format; 3] = [Format::Opsched, Format::Ios, Format::Dag];

    /// The format's name, for help texts.
    pub fn name(self) -> &'static str {
        match self {
            Format::Opsched => "opsched graph JSON",
            Format::Ios => "IOS graph JSON",
            Format::Dag => "cost-annotated DAG JSON",
        }
    }

    /// How it is recognised and what it holds, one line.
    pub fn about(self) -> &'static str {
        match self {
            Format::Opsched => {
                "{\"format\": \"opsched-graph\", ...}: every operator with its parameters"
            }
            Format::Ios => "{\"name\", \"input\", \"blocks\"} as IOS writes it, with its stages",
            Format::Dag => {
                "{\"format\": \"opsched-dag\", ...}: operators known by a time and a utilization"
            }
        }
    }
}

/// Recognise the format of a parsed JSON document.
pub fn detect(doc: &serde_json::Value) -> Result<Format> {
    let obj = doc
        .as_object()
        .ok_or_else(|| GraphError::UnknownFormat("top level is not a JSON object".into()))?;
    match obj.get("format").and_then(|f| f.as_str()) {
        Some(json::FORMAT) => Ok(Format::Opsched),
        Some(dag::FORMAT) => Ok(Format::Dag),
        Some(other) => Err(GraphError::UnknownFormat(format!(
            "\"format\": \"{other}\" (expected \"{}\" or \"{}\")",
            json::FORMAT,
            dag::FORMAT
        ))),
        None if obj.contains_key("blocks") && obj.contains_key("input") => Ok(Format::Ios),
        None => Err(GraphError::UnknownFormat(
            "no \"format\" field and not an IOS graph (needs \"input\" and \"blocks\")".into(),
        )),
    }
}

/// Parse a graph from JSON text in any supported format.
pub fn from_str(text: &str) -> Result<Graph> {
    let doc: serde_json::Value = serde_json::from_str(text)?;
    match detect(&doc)? {
        Format::Opsched => json::from_value(doc),
        Format::Ios => ios::from_value(doc),
        Format::Dag => dag::from_value(doc),
    }
}

/// Load a graph file, detecting its format; errors name the file.
pub fn load_file(path: impl AsRef<Path>) -> Result<Graph> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| GraphError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    from_str(&text).map_err(|e| e.in_file(path))
}
