//! Lowering of stage plans and stream plans to launch plans (to be written).

use opsched_graph::Graph;

use crate::{LaunchPlan, Schedule, ScheduleError};

/// Lower a schedule to the launch plan the simulator and the runtime execute.
pub fn lower(_g: &Graph, _s: &Schedule) -> Result<LaunchPlan, ScheduleError> {
    Err(ScheduleError::Config("lowering not yet implemented".into()))
}
