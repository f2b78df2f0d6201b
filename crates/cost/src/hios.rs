//! The stage law of the HIOS simulation study, for cost-annotated DAGs.
//!
//! For a stage S of operators started together on one GPU, with times `w` and utilizations
//! `u`: `t(S) = 0.5 * sum(w) + 0.5 * max(sum(w * u), max(w))`. A single operator takes its own
//! time. A group (operators run in order inside the stage) counts as one operator with
//! `w = sum of its times` and `w * u = sum of its w * u`.
//!
//! The law is stated for stages; stream plans (operators starting at different times) need
//! rates. We use the law for `k` operators of equal time: every running operator progresses at
//! `1 / (0.5 * k + 0.5 * max(sum(u), 1))`, which is 1 for a single operator and keeps the total
//! progress rate at most 2 (the capacity bound below relies on this).

use opsched_graph::{Graph, NodeId};

use crate::ideal::{abstract_cost, annotated_transfer};
use crate::{AnalyticalModel, CostError, CostModel, ResourceDemand};

/// HIOS's stage law over abstract operators.
#[derive(Clone, Debug)]
pub struct HiosSimLaw {
    base: AnalyticalModel,
}

impl HiosSimLaw {
    /// `base` answers for operators that carry no measured time (use [`HiosSimLaw::check`] to
    /// refuse such graphs).
    pub fn new(base: AnalyticalModel) -> Self {
        HiosSimLaw { base }
    }

    /// The law needs every operator to be abstract (time and utilization); name the first that
    /// is not.
    pub fn check(g: &Graph) -> Result<(), CostError> {
        match g.ops().find(|&o| abstract_cost(g, o).is_none()) {
            None => Ok(()),
            Some(o) => Err(CostError::Unsupported {
                node: g.node(o).name.clone(),
                message: format!(
                    "the hios-sim law needs abstract operators with time_ms and util, not {}",
                    g.node(o).op.type_name()
                ),
            }),
        }
    }

    fn wu(&self, g: &Graph, op: NodeId) -> (f64, f64) {
        abstract_cost(g, op).unwrap_or_else(|| {
            let t = self.base.op_time(g, op);
            (
                t,
                self.base
                    .demand(g, op)
                    .sm_share
                    .clamp(f64::MIN_POSITIVE, 1.0),
            )
        })
    }

    /// The law for (w, w*u) pairs.
    pub fn law(items: impl IntoIterator<Item = (f64, f64)>) -> f64 {
        let (mut sum_w, mut sum_wu, mut max_w, mut n) = (0.0, 0.0, 0.0f64, 0usize);
        for (w, wu) in items {
            sum_w += w;
            sum_wu += wu;
            max_w = max_w.max(w);
            n += 1;
        }
        match n {
            0 => 0.0,
            1 => sum_w,
            _ => 0.5 * sum_w + 0.5 * sum_wu.max(max_w),
        }
    }
}

impl CostModel for HiosSimLaw {
    fn name(&self) -> String {
        "hios-sim".into()
    }
    fn op_time(&self, g: &Graph, op: NodeId) -> f64 {
        self.wu(g, op).0
    }
    fn demand(&self, g: &Graph, op: NodeId) -> ResourceDemand {
        match abstract_cost(g, op) {
            Some((_, u)) => ResourceDemand {
                sm_share: u,
                bw_share: u,
                ..self.base.demand(g, op)
            },
            None => self.base.demand(g, op),
        }
    }
    fn rates(&self, g: &Graph, running: &[NodeId], out: &mut Vec<f64>) {
        let k = running.len() as f64;
        let sum_u: f64 = running.iter().map(|&o| self.wu(g, o).1).sum();
        let slowdown = if running.len() <= 1 {
            1.0
        } else {
            0.5 * k + 0.5 * sum_u.max(1.0)
        };
        out.clear();
        out.resize(running.len(), 1.0 / slowdown);
    }
    fn stage_time(&self, g: &Graph, groups: &[Vec<NodeId>]) -> f64 {
        Self::law(groups.iter().filter(|grp| !grp.is_empty()).map(|grp| {
            grp.iter().fold((0.0, 0.0), |(w, wu), &o| {
                let (t, u) = self.wu(g, o);
                (w + t, wu + t * u)
            })
        }))
    }
    fn merged_time(&self, g: &Graph, ops: &[NodeId]) -> Option<f64> {
        self.base.merged_time(g, ops)
    }
    fn transfer_time(&self, g: &Graph, src: NodeId, dst: NodeId) -> f64 {
        annotated_transfer(g, src, dst).unwrap_or_else(|| self.base.transfer_time(g, src, dst))
    }
    /// Half the total work divided by the GPU count.
    ///
    /// Proof: a stage of total time `W` lasts at least `0.5 * W` by the law; a single operator
    /// lasts its own time `w >= 0.5 * w`; under the rates, `k >= 2` running operators progress
    /// at a total of `k / (0.5 k + 0.5 max(sum u, 1)) < 2`. So each GPU completes at most two
    /// units of work per unit of time, and `M` GPUs need at least `0.5 * W / M`.
    fn capacity_bound(&self, g: &Graph, ops: &[NodeId], gpus: usize) -> f64 {
        let total: f64 = ops.iter().map(|&o| self.op_time(g, o)).sum();
        0.5 * total / gpus.max(1) as f64
    }
}
