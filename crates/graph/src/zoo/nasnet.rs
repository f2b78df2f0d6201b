//! nasnet (to be written).

use crate::error::{GraphError, Result};
use crate::graph::Graph;
use crate::zoo::ZooConfig;

pub(super) fn build(_cfg: &ZooConfig, _size: usize) -> Result<Graph> {
    Err(GraphError::invalid("nasnet", "not yet implemented"))
}
