//! Lower bounds on the makespan (to be written).

use opsched_cost::CostModel;
use opsched_graph::Graph;
use serde::Serialize;

/// Proven lower bounds on any schedule's makespan under a cost model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LowerBound {
    /// Longest path of operator times alone (no transfers).
    pub critical_path_ms: f64,
    /// The cost model's capacity bound.
    pub capacity_ms: f64,
}

impl LowerBound {
    /// The larger of the two.
    pub fn value(&self) -> f64 {
        self.critical_path_ms.max(self.capacity_ms)
    }
}

/// Both bounds for `g` on `gpus` GPUs under `cost`.
pub fn lower_bound(_g: &Graph, _cost: &dyn CostModel, _gpus: usize) -> LowerBound {
    LowerBound::default()
}
