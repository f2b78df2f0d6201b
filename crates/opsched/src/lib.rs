//! # opsched
//!
//! The facade of the opsched workspace: the CLI, the xtask and the benches import this crate
//! only. It re-exports the graph IR and (as they land) the cost models, the schedulers by name
//! and the simulator.

pub use opsched_graph as graph;
pub use opsched_graph::{formats, zoo, Graph, GraphError};

use std::path::Path;

/// Load a model given as a zoo name or a graph file path (a file wins when both exist).
pub fn load_model(spec: &str, cfg: &zoo::ZooConfig) -> Result<Graph, GraphError> {
    let path = Path::new(spec);
    if path.is_file() {
        return formats::load_file(path);
    }
    match zoo::find(spec) {
        Some(m) => m.build(cfg),
        None if spec.ends_with(".json") || spec.contains('/') => formats::load_file(path),
        None => zoo::build(spec, cfg),
    }
}
