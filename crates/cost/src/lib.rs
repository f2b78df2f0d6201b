//! # opsched-cost
//!
//! What operators cost. Every scheduler and the simulator ask the same few, pure questions
//! through the [`CostModel`] trait:
//! - the time of one operator alone on one GPU ([`CostModel::op_time`]);
//! - how fast operators run when they share a GPU ([`CostModel::rates`]), and from it the time
//!   of a concurrent stage ([`CostModel::stage_time`]: groups started together, each group
//!   running its operators in order);
//! - the time of a merged operator ([`CostModel::merged_time`]);
//! - the transfer time of a tensor between two GPUs ([`CostModel::transfer_time`]);
//! - the resource demand of an operator ([`CostModel::demand`]), as Opara uses it;
//! - a capacity lower bound on any schedule's makespan under this model
//!   ([`CostModel::capacity_bound`]).
//!
//! Implementations: the [`analytical`] GPU model (the default; device and link presets in
//! [`device`]), the [`hios`] stage law for cost-annotated DAGs, the [`ideal`] model (operators
//! never slow each other down), [`measured`] tables that fall back to the analytical model, and
//! the persistent [`cache`] of measurements keyed by device fingerprint and operator
//! [`signature`]. [`calibration`] reads device files (a preset's parameters fitted to GPU
//! measurements, among them the execution [`Overheads`]); [`launches`] counts the kernels an
//! operator launches.
//!
//! All times are in milliseconds.

pub mod analytical;
pub mod cache;
pub mod calibration;
pub mod device;
pub mod fluid;
pub mod hios;
pub mod ideal;
pub mod launches;
pub mod measured;
pub mod measurements;
pub mod signature;

use opsched_graph::names::UnknownName;
use opsched_graph::{Graph, NodeId};
use serde::{Deserialize, Serialize};

pub use analytical::AnalyticalModel;
pub use calibration::{DeviceFile, Overheads};
pub use device::{DevicePreset, LinkPreset};
pub use hios::HiosSimLaw;
pub use ideal::IdealModel;
pub use signature::Layout;

/// The GPU resources an operator asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceDemand {
    /// Share of the GPU's SMs the operator's thread blocks occupy when it runs alone, in (0, 1].
    pub sm_share: f64,
    /// Share of peak memory bandwidth it draws when it runs alone, in [0, 1].
    pub bw_share: f64,
    /// Thread blocks of its (main) kernel.
    pub blocks: u64,
    /// Threads per block.
    pub threads_per_block: u32,
    /// Registers per thread.
    pub registers_per_thread: u32,
    /// Shared memory per block, bytes.
    pub shared_mem_per_block: u32,
    /// Whether the operator is limited by memory traffic rather than arithmetic
    /// (Opara's memory-intensive class).
    pub memory_bound: bool,
}

/// Counters a cost model keeps, reported in scheduler statistics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CostStats {
    /// Operator times answered from measurements.
    pub measured: u64,
    /// Operator times that fell back to the analytical model.
    pub estimated: u64,
}

/// Errors of the cost crate.
#[derive(Debug, thiserror::Error)]
pub enum CostError {
    #[error(transparent)]
    UnknownDevice(UnknownName),
    #[error(transparent)]
    UnknownLink(UnknownName),
    #[error("node '{node}': {message}")]
    Unsupported { node: String, message: String },
    #[error("cost cache {path}: {message}")]
    Cache {
        path: std::path::PathBuf,
        message: String,
    },
    /// A device file or a measurement file that cannot be used; `message` names the field.
    #[error("{}: {message}", path.display())]
    Calibration {
        path: std::path::PathBuf,
        message: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The questions every scheduler and the simulator ask about costs. Implementations are pure:
/// the same question always gets the same answer (interior counters aside).
pub trait CostModel: Send + Sync {
    /// Short name, e.g. "analytical(h100)" or "hios-sim".
    fn name(&self) -> String;

    /// Time of `op` running alone on one GPU, in ms (launch overhead included).
    fn op_time(&self, g: &Graph, op: NodeId) -> f64;

    /// Resource demand of `op` running alone.
    fn demand(&self, g: &Graph, op: NodeId) -> ResourceDemand;

    /// Speeds of operators running together on one GPU, relative to running alone: `out[i]` is
    /// the rate of `running[i]` (1.0 = as fast as alone). Every rate must lie in (0, 1], so that
    /// no operator ever finishes faster than alone (the critical-path bound relies on it).
    fn rates(&self, g: &Graph, running: &[NodeId], out: &mut Vec<f64>);

    /// Time of a concurrent stage: the groups start together on one GPU, each group runs its
    /// operators in order. The default simulates the groups under [`CostModel::rates`].
    /// Implementations must return at least the longest group's sum of `op_time`s.
    fn stage_time(&self, g: &Graph, groups: &[Vec<NodeId>]) -> f64 {
        fluid::stage_time(self, g, groups)
    }

    /// Time of one merged operator replacing `ops` (convolutions or linear layers reading the
    /// same input, see `opsched_graph::merge`), or `None` if they cannot be merged. At least the largest
    /// `op_time` among `ops`.
    fn merged_time(&self, g: &Graph, ops: &[NodeId]) -> Option<f64>;

    /// Time of a merge stage of `ops` as the GPU runtime runs it, what schedulers and the
    /// simulator charge: [`CostModel::merged_time`] where it runs them as one kernel
    /// ([`opsched_graph::merge::runs_as_one`]), else (over several images or rows, a member
    /// read by a kernel that cannot read it in place) their `op_time`s one after another. `None` if
    /// they cannot be merged.
    fn merged_stage_time(&self, g: &Graph, ops: &[NodeId]) -> Option<f64> {
        if opsched_graph::merge::runs_as_one(g, ops) {
            return self.merged_time(g, ops);
        }
        opsched_graph::merge::mergeable(g, ops)
            .then(|| ops.iter().map(|&o| self.op_time(g, o)).sum())
    }

    /// Time to move the tensor of edge `src -> dst` from one GPU to another.
    fn transfer_time(&self, g: &Graph, src: NodeId, dst: NodeId) -> f64;

    /// A lower bound on the makespan of running `ops` on `gpus` GPUs under this model, from
    /// capacity (work that cannot be done faster than the GPUs' resources allow). Each
    /// implementation proves its bound in its doc comment.
    fn capacity_bound(&self, g: &Graph, ops: &[NodeId], gpus: usize) -> f64;

    /// Counters (measured vs estimated answers).
    fn stats(&self) -> CostStats {
        CostStats::default()
    }

    /// The execution overheads the simulator charges beside operator times (event latency,
    /// eager host issue; see `opsched_schedule::simulate`). None by default: a model of
    /// published figures or of a paper's law has no such costs.
    fn overheads(&self) -> Overheads {
        Overheads::default()
    }
}

/// A boxed model is a model (so `Box<dyn CostModel>` can be a fallback or be passed on).
impl<M: CostModel + ?Sized> CostModel for Box<M> {
    fn name(&self) -> String {
        (**self).name()
    }
    fn op_time(&self, g: &Graph, op: NodeId) -> f64 {
        (**self).op_time(g, op)
    }
    fn demand(&self, g: &Graph, op: NodeId) -> ResourceDemand {
        (**self).demand(g, op)
    }
    fn rates(&self, g: &Graph, running: &[NodeId], out: &mut Vec<f64>) {
        (**self).rates(g, running, out)
    }
    fn stage_time(&self, g: &Graph, groups: &[Vec<NodeId>]) -> f64 {
        (**self).stage_time(g, groups)
    }
    fn merged_time(&self, g: &Graph, ops: &[NodeId]) -> Option<f64> {
        (**self).merged_time(g, ops)
    }
    fn merged_stage_time(&self, g: &Graph, ops: &[NodeId]) -> Option<f64> {
        (**self).merged_stage_time(g, ops)
    }
    fn transfer_time(&self, g: &Graph, src: NodeId, dst: NodeId) -> f64 {
        (**self).transfer_time(g, src, dst)
    }
    fn capacity_bound(&self, g: &Graph, ops: &[NodeId], gpus: usize) -> f64 {
        (**self).capacity_bound(g, ops, gpus)
    }
    fn stats(&self) -> CostStats {
        (**self).stats()
    }
    fn overheads(&self) -> Overheads {
        (**self).overheads()
    }
}
