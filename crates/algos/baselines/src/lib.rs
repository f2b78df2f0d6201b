//! # opsched-baselines
//!
//! Baseline schedulers, the yardsticks every search is compared against.
//!
//! - [`Sequential`]: one GPU, one operator per stage, in the graph's topological order. This is
//!   what a framework does without inter-operator parallelism; its simulated makespan is the
//!   denominator of every speedup we report.
//! - [`Greedy`]: IOS's greedy baseline, a stage plan on one GPU: every ready operator in the
//!   current stage, one group each, at most `platform.streams` groups per stage, leftovers first
//!   in the next stage ([`greedy`] has the exact rules).
//! - [`Nimble`]: Nimble's stream assignment, a stream plan on one GPU: a maximum matching on
//!   the transitive reduction gives chains, chains merge (Nimble's own merging, completed to a
//!   minimum chain cover: as many logical streams as the graph's width), and these fold onto
//!   the platform's streams when there are too many ([`nimble`] has the details).

pub mod greedy;
pub mod nimble;

pub use greedy::Greedy;
pub use nimble::{transitive_reduction, Nimble, NimbleAnalysis, Reduction};

use std::time::Instant;

use opsched_cost::CostModel;
use opsched_graph::Graph;
use opsched_schedule::{
    Platform, Schedule, ScheduleError, Scheduler, SchedulerStats, Stage, StagePlan,
};

/// One operator at a time on one GPU, in topological order.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sequential;

impl Sequential {
    /// The sequential schedule of `g`: one GPU, one single-operator stage per operator, in
    /// [`Graph::ops`] order.
    pub fn plan(g: &Graph) -> Schedule {
        Schedule::Stages(StagePlan {
            gpus: vec![g.ops().map(Stage::single).collect()],
        })
    }
}

impl Scheduler for Sequential {
    fn name(&self) -> &str {
        "sequential"
    }

    fn schedule(
        &self,
        g: &Graph,
        platform: &Platform,
        _cost: &dyn CostModel,
    ) -> Result<(Schedule, SchedulerStats), ScheduleError> {
        platform.check("sequential")?;
        let start = Instant::now();
        let s = Self::plan(g);
        let stats = SchedulerStats {
            wall_ms: start.elapsed().as_secs_f64() * 1e3,
            states: g.op_count() as u64,
            ..SchedulerStats::default()
        };
        tracing::debug!(model = %g.name, ops = g.op_count(), "sequential schedule");
        Ok((s, stats))
    }
}
