//! The simulator (to be written).

use opsched_graph::NodeId;
use serde::Serialize;

/// When and where one operator ran.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpSpan {
    pub op: NodeId,
    pub gpu: usize,
    pub stream: usize,
    pub start_ms: f64,
    pub end_ms: f64,
}

/// When one transfer moved a tensor.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TransferSpan {
    pub src: NodeId,
    pub dst: NodeId,
    pub src_gpu: usize,
    pub dst_gpu: usize,
    pub start_ms: f64,
    pub end_ms: f64,
}

/// The simulated run of a launch plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Timeline {
    pub ops: Vec<OpSpan>,
    pub transfers: Vec<TransferSpan>,
    pub makespan_ms: f64,
}

/// Run a launch plan on simulated GPUs under `cost` (to be written).
pub fn simulate(
    _g: &opsched_graph::Graph,
    _plan: &crate::LaunchPlan,
    _cost: &dyn opsched_cost::CostModel,
) -> Result<Timeline, crate::ScheduleError> {
    Err(crate::ScheduleError::Config("simulation not yet implemented".into()))
}
