//! The greedy baseline of IOS (Ding et al., MLSys 2021, "greedy" in its tables): stage after
//! stage, run every operator that is ready, each on its own stream.
//!
//! # Algorithm
//! IOS's `Block.greedy_schedule(max_num_stream)` keeps a FIFO queue of ready operators (all
//! predecessors scheduled). Each round:
//! 1. the stage is the first `K` operators of the queue, each its own group (`K` =
//!    `platform.streams`); the rest of the queue (`remain`) waits;
//! 2. the successors of the stage's operators, taken in stage order, lose one pending
//!    predecessor each; those that reach zero become ready, in that order (`nqu`);
//! 3. the next queue is `remain` followed by `nqu`: operators left over from a full stage go
//!    first, before anything that became ready later.
//!
//! We keep exactly these semantics. Where IOS takes operators in the order its model code
//! created them (the first queue in block order, successors in the order of their uses), we take
//! them in definition order, [`NodeId`] ascending (for the zoo, the order the model code adds
//! the nodes): the first queue is the operators without operator predecessors (graph inputs are
//! not operators) by id, and each operator's successors are visited by id.
//!
//! # Whole graph, not per block
//! IOS runs this per block (a stage never mixes operators of two blocks) and concatenates the
//! blocks' stages. We run it over the whole graph in topological waves: a stage may hold
//! operators of two blocks when both are ready. Where consecutive blocks meet in one operator
//! (every operator of a block follows the previous block's exit) nothing of the next block is
//! ready before that exit has run, so the stages are IOS's per-block stages; where cells read
//! two earlier cells (NASNet) or there are no blocks at all (random DAGs), ours may pack more
//! ready operators into a stage than IOS's per-block run would. The IOS semantics inside a
//! wave (FIFO queue, at most `K` groups, leftovers first) are unchanged.
//! Every schedule is on GPU 0.

use std::collections::VecDeque;
use std::time::Instant;

use opsched_cost::CostModel;
use opsched_graph::{Graph, NodeId};
use opsched_schedule::{
    Platform, Schedule, ScheduleError, Scheduler, SchedulerStats, Stage, StagePlan, StageStrategy,
};

/// IOS's greedy schedule: every ready operator in the current stage, one group each, at most
/// `platform.streams` groups per stage, leftovers first in the next stage.
#[derive(Clone, Copy, Debug, Default)]
pub struct Greedy;

impl Greedy {
    /// The greedy stages of `g` with at most `streams` groups per stage (`streams` of 0 is
    /// treated as 1). See the module docs for the exact order.
    pub fn stages(g: &Graph, streams: usize) -> Vec<Stage> {
        let k = streams.max(1);
        let mut ops: Vec<NodeId> = g.ops().collect();
        ops.sort_unstable();
        let mut pos = vec![usize::MAX; g.len()];
        for (i, op) in ops.iter().enumerate() {
            pos[op.index()] = i;
        }
        let is_op = |n: NodeId| pos.get(n.index()).is_some_and(|&p| p != usize::MAX);
        // Pending operator predecessors of each op (by position = id order), and successors
        // by id.
        let mut pending: Vec<usize> = ops
            .iter()
            .map(|&op| g.preds(op).filter(|&p| is_op(p)).count())
            .collect();
        let succs: Vec<Vec<usize>> = ops
            .iter()
            .map(|&op| {
                let mut s: Vec<usize> = g
                    .succs(op)
                    .filter_map(|n| pos.get(n.index()).copied())
                    .filter(|&p| p != usize::MAX)
                    .collect();
                s.sort_unstable();
                s
            })
            .collect();

        let mut queue: VecDeque<usize> = (0..ops.len()).filter(|&i| pending[i] == 0).collect();
        let mut stages = Vec::new();
        while !queue.is_empty() {
            let take = queue.len().min(k);
            let stage: Vec<usize> = queue.drain(..take).collect();
            // `queue` now holds `remain`; newly ready ops go after it.
            for &u in &stage {
                for &v in &succs[u] {
                    if let Some(c) = pending.get_mut(v) {
                        *c = c.saturating_sub(1);
                        if *c == 0 {
                            queue.push_back(v);
                        }
                    }
                }
            }
            stages.push(Stage {
                strategy: StageStrategy::Concurrent,
                groups: stage.into_iter().map(|i| vec![ops[i]]).collect(),
            });
        }
        stages
    }

    /// The greedy schedule of `g`: one GPU, [`Greedy::stages`].
    pub fn plan(g: &Graph, streams: usize) -> Schedule {
        Schedule::Stages(StagePlan {
            gpus: vec![Self::stages(g, streams)],
        })
    }
}

impl Scheduler for Greedy {
    fn name(&self) -> &str {
        "greedy"
    }

    fn schedule(
        &self,
        g: &Graph,
        platform: &Platform,
        _cost: &dyn CostModel,
    ) -> Result<(Schedule, SchedulerStats), ScheduleError> {
        platform.check("greedy")?;
        let start = Instant::now();
        let stages = Self::stages(g, platform.streams);
        let n_stages = stages.len();
        let widest = stages.iter().map(|s| s.groups.len()).max().unwrap_or(0);
        let mut stats = SchedulerStats {
            states: g.op_count() as u64,
            ..SchedulerStats::default()
        };
        stats.extra.insert("stages".into(), n_stages.into());
        stats.extra.insert("widest_stage".into(), widest.into());
        let s = Schedule::Stages(StagePlan { gpus: vec![stages] });
        stats.wall_ms = start.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(
            model = %g.name,
            ops = g.op_count(),
            stages = n_stages,
            streams = platform.streams,
            "greedy schedule"
        );
        Ok((s, stats))
    }
}
