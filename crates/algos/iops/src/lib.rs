//! # opsched-iops
//!
//! IOPS (Xie, Xu, Zhu, He: "IOPS: computational graph optimization based on inter-operators
//! parallel scheduling"): a single-GPU stage scheduler that
//! 1. splits the graph into blocks of at most [`Iops::max_block`] operators at minimum cuts
//!    weighted by operator-replacement opportunities (Sec. 2.2, Algorithm 1; [`split`]);
//! 2. schedules each block with a dynamic program over predecessor-closed operator sets whose
//!    every step ("process", our stage) is the better of *parallel scheduling* (concurrent
//!    groups) and *operator replacement* (a merged convolution) (Sec. 2.1, 2.3, 2.4, Eq. (1),
//!    Algorithm 2; module `dp`);
//! 3. reuses the schedule of a structurally identical block solved before, a *template*, instead
//!    of solving again (Algorithm 2, lines 6-9; module `template`);
//! 4. concatenates the blocks' processes: the total latency is the sum of the processes'
//!    times (Eq. (2)), which is what the simulator computes for a stage plan.
//!
//! Terms: the paper's *process* (`Pro`) is our [`Stage`]; *parallel scheduling* is a
//! [`StageStrategy::Concurrent`] stage; *operator replacement* is a [`StageStrategy::Merge`]
//! stage (IOS's rule, [`opsched_graph::merge`]); *ProTimes* is the stage's time under the cost
//! model, plus its fork and join where it runs several groups
//! ([`Overheads::fork_join_ms`](opsched_cost::Overheads::fork_join_ms): the simulator's events;
//! zero for an uncalibrated preset).
//!
//! ## The paper's limits: "4 parallel operators per process, 8 processes"
//!
//! Sec. 3.2 and 3.3 set "the maximum parallel operator quantity for (Pro) to be 4, and the
//! maximum number of processes to be processed is 8, thus reducing the search range". We read:
//! - [`Iops::max_parallel`] = 4: a process runs at most 4 operator groups side by side (at most
//!   4 streams; also capped by the platform's streams), and replaces at most 4 convolutions by
//!   one merged operator;
//! - [`Iops::max_processes`] = 8: both limits are there to bound the search, and a cap on the
//!   number of a block's processes cannot be meant (a 50-operator block with at most 4
//!   concurrent operators per process needs more than 8 processes). We take it as the number
//!   of operators one process may handle in all: the groups of a concurrent process (each a
//!   head operator and its descendants still unscheduled, run in order) hold at most 8
//!   operators together. This bounds the enumeration of processes per DP state the same way
//!   IOS's `r` (operators per group) and `s` (groups per stage) do.
//!
//! ## Statistics
//!
//! [`SchedulerStats::extra`] holds `blocks`, `template_hits`, `merge_stages`,
//! `concurrent_stages`, `replacement_chosen` / `parallel_chosen` (processes whose operators both
//! strategies could run, by the winner), `cut_weight`, `split_order`, the limits, and
//! `per_block`: for each block its operator count, stages, merge and concurrent stage counts,
//! its strategy (`"parallel"`, `"replacement"` or `"mixed"`), its cost, DP states, and whether
//! it was a template hit (with the block it reused).

mod dp;
pub mod split;
mod template;

use std::collections::HashMap;
use std::time::Instant;

use opsched_cost::CostModel;
use opsched_graph::merge::mergeable;
use opsched_graph::{Graph, NodeId};
use opsched_schedule::{
    Platform, Schedule, ScheduleError, Scheduler, SchedulerStats, Stage, StagePlan, StageStrategy,
};
use serde_json::{json, Map, Value};

use crate::dp::{BlockDp, LocalStage, SharedCache, Solution};

/// The largest block the bitset DP handles (one `u64` per state).
pub const MAX_BLOCK_LIMIT: usize = 64;

/// The IOPS scheduler (one GPU). See the crate docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Iops {
    /// Most operators per block (the paper's 50; at most [`MAX_BLOCK_LIMIT`]).
    pub max_block: usize,
    /// Most groups of a concurrent process and most convolutions of one merge (4).
    pub max_parallel: usize,
    /// Most operators one process handles in all (8; see the crate docs).
    pub max_processes: usize,
}

impl Default for Iops {
    fn default() -> Self {
        Iops {
            max_block: 50,
            max_parallel: 4,
            max_processes: 8,
        }
    }
}

/// A schedule with what IOPS found on the way.
#[derive(Clone, Debug)]
pub struct IopsResult {
    pub schedule: Schedule,
    /// Sum of the stages' costs (Eq. (2)): the simulated makespan of the stage plan.
    pub objective_ms: f64,
    pub stats: SchedulerStats,
}

struct BlockReport {
    ops: usize,
    stages: usize,
    merge: usize,
    concurrent: usize,
    cost: f64,
    states: u64,
    template_of: Option<usize>,
}

impl Iops {
    fn check(&self, platform: &Platform) -> Result<(), ScheduleError> {
        platform.check("iops")?;
        if self.max_block == 0 || self.max_block > MAX_BLOCK_LIMIT {
            return Err(ScheduleError::Config(format!(
                "iops: max_block must lie in 1..={MAX_BLOCK_LIMIT}, got {}",
                self.max_block
            )));
        }
        if self.max_parallel == 0 || self.max_processes == 0 {
            return Err(ScheduleError::Config(format!(
                "iops: max_parallel and max_processes must be positive (got {} and {})",
                self.max_parallel, self.max_processes
            )));
        }
        Ok(())
    }

    /// Schedule `g` on one GPU of `platform` and return the objective with the schedule.
    pub fn run(
        &self,
        g: &Graph,
        platform: &Platform,
        cost: &dyn CostModel,
    ) -> Result<IopsResult, ScheduleError> {
        self.check(platform)?;
        let start = Instant::now();
        let max_parallel = self.max_parallel.min(platform.streams);
        let families = split::merge_families(g);
        let pairs = split::mergeable_pairs(g, &families);
        let sp = split::split(g, self.max_block, &pairs);

        let mut shared = SharedCache::new(g);
        let mut local_of = vec![u32::MAX; g.len()];
        let mut templates: HashMap<String, (usize, Solution)> = HashMap::new();
        let mut stages: Vec<Stage> = Vec::with_capacity(g.op_count());
        let mut reports: Vec<BlockReport> = Vec::with_capacity(sp.blocks.len());
        let mut stats = SchedulerStats::default();
        let mut objective = 0.0;
        let (mut replacement_chosen, mut parallel_chosen) = (0u64, 0u64);

        for (bi, range) in sp.blocks.iter().enumerate() {
            let ops = sp.order.get(range.clone()).unwrap_or(&[]);
            for (i, &v) in ops.iter().enumerate() {
                local_of[v.index()] = i as u32;
            }
            let sig = template::block_signature(g, ops, &local_of);
            let mut hit = None;
            let mut states = 0;
            let mut mapped = None;
            if let Some((from, sol)) = templates.get(&sig) {
                let st = map_stages(&sol.stages, ops);
                // Merge stages must still merge (always so for equal signatures; checked
                // because a wrong merge would be an invalid schedule).
                let ok = st
                    .iter()
                    .all(|s| s.strategy != StageStrategy::Merge || mergeable(g, &stage_ops(s)));
                if ok {
                    hit = Some(*from);
                    mapped = Some((st, sol.replacement_won, sol.parallel_won));
                }
            }
            let (block_stages, rep, par) = match mapped {
                Some(m) => m,
                None => {
                    let mut dp = BlockDp::new(
                        &mut shared,
                        g,
                        cost,
                        ops,
                        &local_of,
                        &families,
                        max_parallel,
                        self.max_processes,
                    );
                    let sol = dp.solve();
                    stats.states += dp.counters.states;
                    stats.transitions += dp.counters.transitions;
                    stats.cost_queries += dp.counters.cost_queries;
                    states = dp.counters.states;
                    let st = map_stages(&sol.stages, ops);
                    let out = (st, sol.replacement_won, sol.parallel_won);
                    templates.entry(sig).or_insert((bi, sol));
                    out
                }
            };
            replacement_chosen += rep;
            parallel_chosen += par;
            // The block's cost, recomputed on its own operators (Eq. (2)).
            let mut block_cost = 0.0;
            let (mut merge, mut concurrent) = (0, 0);
            for s in &block_stages {
                stats.cost_queries += 1;
                block_cost += stage_cost(g, cost, s)?;
                match s.strategy {
                    StageStrategy::Merge => merge += 1,
                    StageStrategy::Concurrent => concurrent += 1,
                }
            }
            objective += block_cost;
            reports.push(BlockReport {
                ops: ops.len(),
                stages: block_stages.len(),
                merge,
                concurrent,
                cost: block_cost,
                states,
                template_of: hit,
            });
            stages.extend(block_stages);
            for &v in ops {
                local_of[v.index()] = u32::MAX;
            }
        }

        stats.wall_ms = start.elapsed().as_secs_f64() * 1e3;
        stats.extra = self.extra(&sp, &reports, replacement_chosen, parallel_chosen);
        tracing::debug!(
            model = %g.name,
            blocks = reports.len(),
            objective_ms = objective,
            wall_ms = stats.wall_ms,
            "iops schedule"
        );
        Ok(IopsResult {
            schedule: Schedule::Stages(StagePlan { gpus: vec![stages] }),
            objective_ms: objective,
            stats,
        })
    }

    fn extra(
        &self,
        sp: &split::Split,
        reports: &[BlockReport],
        replacement_chosen: u64,
        parallel_chosen: u64,
    ) -> Map<String, Value> {
        let mut m = Map::new();
        let hits = reports.iter().filter(|r| r.template_of.is_some()).count();
        let merge: usize = reports.iter().map(|r| r.merge).sum();
        let concurrent: usize = reports.iter().map(|r| r.concurrent).sum();
        m.insert("blocks".into(), json!(reports.len()));
        m.insert("template_hits".into(), json!(hits));
        m.insert("merge_stages".into(), json!(merge));
        m.insert("concurrent_stages".into(), json!(concurrent));
        m.insert("replacement_chosen".into(), json!(replacement_chosen));
        m.insert("parallel_chosen".into(), json!(parallel_chosen));
        m.insert("cut_weight".into(), json!(sp.total_weight()));
        m.insert("split_order".into(), json!(sp.order_kind));
        m.insert("max_block".into(), json!(self.max_block));
        m.insert("max_parallel".into(), json!(self.max_parallel));
        m.insert("max_processes".into(), json!(self.max_processes));
        let per_block: Vec<Value> = reports
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let strategy = match (r.merge, r.concurrent) {
                    (0, _) => "parallel",
                    (_, 0) => "replacement",
                    _ => "mixed",
                };
                json!({
                    "block": i,
                    "ops": r.ops,
                    "stages": r.stages,
                    "merge_stages": r.merge,
                    "concurrent_stages": r.concurrent,
                    "strategy": strategy,
                    "cost_ms": r.cost,
                    "states": r.states,
                    "template_hit": r.template_of.is_some(),
                    "template_of": r.template_of,
                })
            })
            .collect();
        m.insert("per_block".into(), Value::Array(per_block));
        m
    }
}

/// Local stages to stages of the block's operators.
fn map_stages(local: &[LocalStage], ops: &[NodeId]) -> Vec<Stage> {
    let at = |i: &u8| ops.get(*i as usize).copied();
    local
        .iter()
        .map(|s| match s {
            LocalStage::Concurrent(groups) => Stage {
                strategy: StageStrategy::Concurrent,
                groups: groups
                    .iter()
                    .map(|grp| grp.iter().filter_map(at).collect())
                    .collect(),
            },
            LocalStage::Merge(set) => Stage {
                strategy: StageStrategy::Merge,
                groups: vec![set.iter().filter_map(at).collect()],
            },
        })
        .collect()
}

fn stage_ops(s: &Stage) -> Vec<NodeId> {
    s.ops().collect()
}

/// Time of one stage under `cost`.
fn stage_cost(g: &Graph, cost: &dyn CostModel, s: &Stage) -> Result<f64, ScheduleError> {
    match s.strategy {
        StageStrategy::Concurrent => {
            Ok(cost.stage_time(g, &s.groups) + cost.overheads().fork_join_ms(s.groups.len()))
        }
        StageStrategy::Merge => {
            let ops: Vec<NodeId> = s.ops().collect();
            cost.merged_stage_time(g, &ops).ok_or_else(|| {
                ScheduleError::Invalid(format!(
                    "iops: a merge stage of {} operators cannot be merged",
                    ops.len()
                ))
            })
        }
    }
}

impl Scheduler for Iops {
    fn name(&self) -> &str {
        "iops"
    }

    fn schedule(
        &self,
        g: &Graph,
        platform: &Platform,
        cost: &dyn CostModel,
    ) -> Result<(Schedule, SchedulerStats), ScheduleError> {
        let r = self.run(g, platform, cost)?;
        Ok((r.schedule, r.stats))
    }
}
