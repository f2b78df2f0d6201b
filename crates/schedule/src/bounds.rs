//! Lower bounds on the makespan.
//!
//! Two bounds, both valid for every schedule that [`crate::validate()`] accepts, simulated by
//! [`crate::simulate()`] under the same cost model:
//!
//! **Critical path.** `critical_path_ms` is the longest path through the operators, an
//! operator weighing `cost.op_time` (graph inputs weigh nothing; transfers are ignored, which
//! only makes the bound smaller).
//!
//! *Proof.* (1) Every operator's span lasts at least its `op_time`: a stream-plan operator
//! progresses at rates in (0, 1] (the [`CostModel::rates`] contract), so doing `op_time`
//! alone-milliseconds of work takes at least `op_time`; a stage-plan operator runs for
//! `scale * op_time` with `scale = T / L >= 1`, because the stage time `T` is at least the
//! longest group's sum of operator times `L` ([`CostModel::stage_time`]'s contract); a merged
//! operator runs for `merged_time >= max op_time` of its components
//! ([`CostModel::merged_time`]'s contract). (2) An operator starts only after all its
//! predecessors have ended: in a valid schedule every dependency `u -> v` is ordered in the
//! launch plan (stream order, an event recorded after `u` and waited for before `v`, a stage
//! barrier, or a transfer sent after `u` and received before `v`), and every one of these
//! orders `v`'s start after `u`'s end. So along any path `v1 -> ... -> vk` the spans are
//! disjoint and in order, and the makespan is at least `sum op_time(vi)`; the longest path
//! gives the bound. Execution overheads only add delay: an event becomes visible
//! `event_record_us` after its record and a wait costs its stream `event_wait_us` (both
//! non-negative), and in eager mode a command cannot start before the host issued it; none of
//! them shortens a span or lets an operator start before an input ends, so (1) and (2) hold in
//! both execution modes. (The simulator ends a fluid operator when its completion is within a
//! relative 1e-12 of the current time, so the bound holds up to that rounding.)
//!
//! **Capacity.** `capacity_ms` is [`CostModel::capacity_bound`] of all operators on `gpus`
//! GPUs; each cost model proves its own.

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

/// The longest path through the operators of `g`, weighted by `cost.op_time`.
pub fn critical_path(g: &Graph, cost: &dyn CostModel) -> f64 {
    let mut finish = vec![0.0f64; g.len()];
    let mut best = 0.0f64;
    for &v in g.topo_order() {
        if g.node(v).op.is_input() {
            continue;
        }
        let start = g
            .preds(v)
            .map(|u| finish.get(u.index()).copied().unwrap_or(0.0))
            .fold(0.0, f64::max);
        let end = start + cost.op_time(g, v);
        if let Some(f) = finish.get_mut(v.index()) {
            *f = end;
        }
        best = best.max(end);
    }
    best
}

/// Both bounds for `g` on `gpus` GPUs under `cost`.
pub fn lower_bound(g: &Graph, cost: &dyn CostModel, gpus: usize) -> LowerBound {
    let ops: Vec<_> = g.ops().collect();
    LowerBound {
        critical_path_ms: critical_path(g, cost),
        capacity_ms: cost.capacity_bound(g, &ops, gpus),
    }
}
