//! The ideal model: operators never slow each other down. It is the machine model of list
//! scheduling papers such as LIOS (each stream a processor of its own), used for their worked
//! examples and for cost-annotated DAGs. Operator times are the `time_ms` of abstract
//! operators; other operators cost what the wrapped analytical model says.

use opsched_graph::{Graph, NodeId, Op};

use crate::{AnalyticalModel, CostModel, ResourceDemand};

/// Operators run at full speed whatever else runs.
#[derive(Clone, Debug)]
pub struct IdealModel {
    base: AnalyticalModel,
}

impl IdealModel {
    /// `base` answers for operators that carry no measured time.
    pub fn new(base: AnalyticalModel) -> Self {
        IdealModel { base }
    }
}

/// The `(time_ms, util)` of an abstract operator.
pub fn abstract_cost(g: &Graph, op: NodeId) -> Option<(f64, f64)> {
    match g.node(op).op {
        Op::Abstract { time_ms, util } => Some((time_ms, util)),
        _ => None,
    }
}

/// The time of the tensor on edge `src -> dst` as the file gave it, if it did.
pub fn annotated_transfer(g: &Graph, src: NodeId, dst: NodeId) -> Option<f64> {
    g.edge(src, dst).and_then(|e| e.transfer_ms)
}

impl CostModel for IdealModel {
    fn name(&self) -> String {
        "ideal".into()
    }
    fn op_time(&self, g: &Graph, op: NodeId) -> f64 {
        abstract_cost(g, op).map_or_else(|| self.base.op_time(g, op), |(t, _)| t)
    }
    fn demand(&self, g: &Graph, op: NodeId) -> ResourceDemand {
        self.base.demand(g, op)
    }
    fn rates(&self, _g: &Graph, running: &[NodeId], out: &mut Vec<f64>) {
        out.clear();
        out.resize(running.len(), 1.0);
    }
    /// The longest group.
    fn stage_time(&self, g: &Graph, groups: &[Vec<NodeId>]) -> f64 {
        groups
            .iter()
            .map(|grp| grp.iter().map(|&o| self.op_time(g, o)).sum::<f64>())
            .fold(0.0, f64::max)
    }
    fn merged_time(&self, g: &Graph, ops: &[NodeId]) -> Option<f64> {
        self.base.merged_time(g, ops)
    }
    fn transfer_time(&self, g: &Graph, src: NodeId, dst: NodeId) -> f64 {
        annotated_transfer(g, src, dst).unwrap_or_else(|| self.base.transfer_time(g, src, dst))
    }
    /// Nothing limits capacity in this model: every operator could run at once, so the only
    /// bound is the longest single operator (it must run somewhere, at rate 1).
    fn capacity_bound(&self, g: &Graph, ops: &[NodeId], _gpus: usize) -> f64 {
        ops.iter().map(|&o| self.op_time(g, o)).fold(0.0, f64::max)
    }
}
