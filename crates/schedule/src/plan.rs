//! The schedule types: stage plans, stream plans, launch plans, and the platform they run on.

use opsched_graph::NodeId;
use serde::{Deserialize, Serialize};

/// What a schedule runs on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Platform {
    pub gpus: usize,
    /// Streams available per GPU (the most groups a stage may have).
    pub streams: usize,
    pub device: opsched_cost::DevicePreset,
    pub link: opsched_cost::LinkPreset,
}

impl Platform {
    /// Every scheduler needs at least one GPU and one stream; `scheduler` names the one asking.
    pub fn check(&self, scheduler: &str) -> Result<(), crate::ScheduleError> {
        if self.gpus == 0 || self.streams == 0 {
            return Err(crate::ScheduleError::Config(format!(
                "{scheduler}: the platform needs at least one GPU and one stream (got {} GPUs, {} streams)",
                self.gpus, self.streams
            )));
        }
        Ok(())
    }
}

/// How a stage runs its operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StageStrategy {
    /// Groups run concurrently, one stream each; each group runs its operators in order.
    Concurrent,
    /// All operators (convolutions reading one input) run as one merged operator.
    Merge,
}

/// One stage: groups started together on one GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    pub strategy: StageStrategy,
    pub groups: Vec<Vec<NodeId>>,
}

impl Stage {
    /// A stage of one operator.
    pub fn single(op: NodeId) -> Self {
        Stage {
            strategy: StageStrategy::Concurrent,
            groups: vec![vec![op]],
        }
    }
    /// All operators of the stage.
    pub fn ops(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.groups.iter().flatten().copied()
    }
}

/// Per GPU, a sequence of stages run one after another.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StagePlan {
    pub gpus: Vec<Vec<Stage>>,
}

/// The streams of one GPU in a stream plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuStreams {
    /// Operators of each stream, in order.
    pub streams: Vec<Vec<NodeId>>,
    /// The order in which the host launches this GPU's operators (Opara's launch order); when
    /// absent, a topological order consistent with the streams is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_order: Option<Vec<NodeId>>,
}

/// Per GPU, streams with ordered operators.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamPlan {
    pub gpus: Vec<GpuStreams>,
}

/// A schedule in either shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "shape", rename_all = "lowercase")]
pub enum Schedule {
    Stages(StagePlan),
    Streams(StreamPlan),
}

impl Schedule {
    /// The sequential schedule: every operator of `g` on GPU 0, one after another in
    /// topological order (one operator per stage).
    pub fn sequential(g: &opsched_graph::Graph) -> Schedule {
        Schedule::Stages(StagePlan {
            gpus: vec![g.ops().map(Stage::single).collect()],
        })
    }
}

/// An event of a launch plan (recorded once, waited on by any stream of the same GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EventId(pub u32);

/// A tensor transfer between GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TransferId(pub u32);

/// One command of a stream in a launch plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Cmd {
    /// Run an operator. `stage` is the index of its stage on this GPU for stage plans (the
    /// operators of a stage start together and the stage's time comes from the cost model's
    /// stage law); `None` for stream plans (operators share the GPU as they overlap).
    Launch { op: NodeId, stage: Option<u32> },
    /// Run several operators as one merged operator (a merge stage).
    LaunchMerged {
        ops: Vec<NodeId>,
        stage: Option<u32>,
    },
    /// Record an event once everything before it on this stream has finished.
    Record(EventId),
    /// Wait until an event is recorded.
    Wait(EventId),
    /// Send the output of `src` (finished earlier on this stream) to `dst_gpu` for `dst`.
    Send {
        xfer: TransferId,
        src: NodeId,
        dst: NodeId,
        dst_gpu: usize,
    },
    /// Wait until a transfer has arrived on this GPU.
    Recv(TransferId),
}

/// The commands of one GPU's streams.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuLaunch {
    pub streams: Vec<Vec<Cmd>>,
}

/// What the simulator and the runtime execute.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LaunchPlan {
    pub gpus: Vec<GpuLaunch>,
    /// Number of events (ids are `0..events`).
    pub events: u32,
    /// Number of transfers (ids are `0..transfers`).
    pub transfers: u32,
    /// The order in which a host issues the launches (every launched operator once): Opara's
    /// launch order for stream plans that have one, stage by stage for stage plans, else the
    /// topological order. It does not change what the simulator computes on CUDA graphs (the
    /// streams and their events fix that); it is the host order of eager execution.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub launch_order: Vec<NodeId>,
}
