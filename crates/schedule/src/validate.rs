//! The validator (to be written).

use opsched_graph::Graph;

use crate::{Platform, Schedule, ScheduleError};

/// Check a schedule: every operator exactly once, dependencies respected, limits of the
/// platform kept, no cycle among waits. Errors name the operator.
pub fn validate(_g: &Graph, _s: &Schedule, _p: &Platform) -> Result<(), ScheduleError> {
    Ok(())
}
