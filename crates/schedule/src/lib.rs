//! # opsched-schedule
//!
//! One schedule type in two shapes, one launch plan, one evaluator.
//!
//! - A **stage plan** ([`StagePlan`]; IOS, HIOS, IOPS, greedy, sequential): per GPU, a sequence
//!   of stages; a stage is a set of groups run concurrently on separate streams (each group
//!   runs its operators in order), or one merged operator.
//! - A **stream plan** ([`StreamPlan`]; LIOS, Opara, Nimble): per GPU, streams with ordered
//!   operators and an optional explicit launch order; cross-stream waits follow from the
//!   dependencies.
//! - Both lower ([`lower()`]) to one **launch plan** ([`LaunchPlan`]): per GPU, per stream, an
//!   ordered list of commands (launch an operator, record or wait for an event, send a tensor to
//!   another GPU, wait for a received tensor). The [`simulate()`] function runs launch plans under a
//!   cost model and returns a [`Timeline`]; the GPU runtime will run the same plans.
//!   [`simulate_with`] picks the execution mode ([`ExecMode`]: CUDA-graph replay or eager,
//!   whose host issues commands in the runtime's order, [`HostProgram::issue_order`]).
//! - The [`validate()`] function checks any schedule (every operator exactly once, dependencies
//!   respected, no cycle among waits); [`bounds`] gives proven lower bounds on the makespan;
//!   [`export`] writes timelines as Chrome traces and SVG Gantt charts.
//! - The [`Scheduler`] trait is what every algorithm implements.

pub mod bounds;
pub mod export;
pub mod host;
pub mod io;
pub mod lower;
pub mod plan;
pub mod simulate;
pub mod validate;

pub use bounds::{lower_bound, LowerBound};
pub use host::{HostCmd, HostProgram, HostStep, OpOrder, Transfer};
pub use lower::lower;
pub use plan::{
    Cmd, EventId, GpuLaunch, GpuStreams, LaunchPlan, Platform, Schedule, Stage, StagePlan,
    StageStrategy, StreamPlan, TransferId, MAX_GPUS, MAX_STREAMS,
};
pub use simulate::{simulate, simulate_with, ExecMode, OpSpan, SimOptions, Timeline, TransferSpan};
pub use validate::validate;

use opsched_cost::CostModel;
use opsched_graph::Graph;
use serde::Serialize;

/// Errors of the schedule layer; each names the operator, stage or event at fault.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// The schedule breaks a rule (operator missing or twice, dependency violated, ...).
    #[error("invalid schedule: {0}")]
    Invalid(String),
    /// The launch plan deadlocks: a wait can never be satisfied.
    #[error("deadlock: {0}")]
    Deadlock(String),
    /// The platform or the options are out of range.
    #[error("{0}")]
    Config(String),
    /// Reading, parsing or writing a schedule file.
    #[error("{path}: {message}")]
    File {
        path: std::path::PathBuf,
        message: String,
    },
}

/// Statistics a scheduler reports with its schedule.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SchedulerStats {
    /// Wall-clock scheduling time, ms.
    pub wall_ms: f64,
    /// Search states explored (DP states, candidate evaluations, ...).
    pub states: u64,
    /// Transitions considered.
    pub transitions: u64,
    /// Questions asked of the cost model.
    pub cost_queries: u64,
    /// Anything else worth reporting, by name.
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// Receives the progress of a long search (IOS's parts, a sweep's runs) so a front end can draw
/// it; every method has an empty default, and [`NoProgress`] ignores everything.
pub trait Progress: Sync {
    /// A named step of a longer job begins (one scheduler of a comparison, one sweep point).
    fn step(&self, _label: &str) {}
    /// A search with `total` units of work begins (`unit` names them, e.g. "operators").
    fn begin(&self, _total: u64, _unit: &str) {}
    /// `done` more units are finished.
    fn advance(&self, _done: u64) {}
}

/// Progress that nobody watches.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}

/// A scheduling algorithm.
pub trait Scheduler {
    /// The registry name, e.g. "sequential", "ios", "hios-lp".
    fn name(&self) -> &str;
    /// Find a schedule for `g` on `platform` under `cost`.
    fn schedule(
        &self,
        g: &Graph,
        platform: &Platform,
        cost: &dyn CostModel,
    ) -> Result<(Schedule, SchedulerStats), ScheduleError>;
    /// [`Scheduler::schedule`], reporting progress to `progress`; searches that can take
    /// seconds override it, the others need not.
    fn schedule_with_progress(
        &self,
        g: &Graph,
        platform: &Platform,
        cost: &dyn CostModel,
        progress: &dyn Progress,
    ) -> Result<(Schedule, SchedulerStats), ScheduleError> {
        let _ = progress;
        self.schedule(g, platform, cost)
    }
}
