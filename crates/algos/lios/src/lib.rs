//! # opsched-lios
//!
//! LIOS (Ping et al., "Latency-Based Inter-Operator Scheduling for CNN Inference Acceleration
//! on GPU", IEEE TSC 2024): list scheduling of the operators of one GPU onto its streams.
//!
//! ## The algorithm (paper Sec. IV, Algorithm 1)
//! Each stream is a FIFO task queue; the machine model is the paper's Sec. II-D, in which
//! operators on different streams do not slow each other down (our `IdealModel`); the
//! operator weights are `cost.op_time`.
//!
//! 1. **Priority (Sec. IV-B, Eq. 5).** `Rank(v) = node_weight(v)`, the operator's own latency.
//!    This is *not* HEFT's upward rank: in Table III, step 3 picks `v8` (weight 7) over `v2`
//!    (weight 5, but on a path of 35 to the exit), which only the node weight explains.
//! 2. **Wait list (Algorithm 1, lines 3, 5-6, 12-14).** An ordered list of the operators whose
//!    predecessors are all scheduled. It starts with the entry operators (those with no
//!    operator predecessor; graph inputs are not operators), in node order; each step removes
//!    the picked operator and *appends* the operators it made ready, in node order (Table III:
//!    `v2, v3, v4, v8` after step 2, `v4, v6` after step 5). The pick is the operator of the
//!    highest rank; among equal ranks the one **earliest in the wait list** (Table III, step 4:
//!    `v2` of `v2, v3, v4`, all weighing 5).
//! 3. **Stream selection (Sec. II-D Eqs. 1-2, Sec. IV-C Eq. 6).**
//!    `EST(v, p) = max(free(p), max_{u in pred(v)} FT(u))` where `free(p)` is the finish time of
//!    the last operator placed on `p` (no insertion into idle gaps: a stream is a FIFO queue),
//!    `EFT(v, p) = EST(v, p) + w(v)`; the operator goes to the stream of the smallest EFT, ties
//!    to the **lowest stream index** ("LIOS selects the first stream that achieves the smallest
//!    EFT", Sec. IV-C example). It starts at its EST and finishes at its EFT.
//!
//! Each step costs O(wait list + streams + in-degree), so a whole run is
//! O(n * (width + streams) + edges), against the paper's stated O(x n^2).
//!
//! ## Ablations (Sec. V-B, RQ3)
//! - `lios-rand1` (LIOS-Rand1): the operator is picked uniformly at random from the wait list
//!   instead of by rank; the stream is still chosen by EFT.
//! - `lios-rand2` (LIOS-Rand2): the operator is picked by rank; the stream is drawn uniformly
//!   at random among all streams (the operator starts at its EST on that stream).
//! - `lios-rand` (LIOS-Rand): both picks are random.
//!
//! Randomness comes from [`SplitMix64`] seeded with [`Lios::seed`]; one generator serves the
//! whole run (per step: the operator draw, then the stream draw), so a seed fixes the schedule.
//!
//! ## Output
//! A [`Schedule::Streams`] plan for one GPU: each stream lists its operators in execution
//! order, and `launch_order` is the order LIOS scheduled them (a topological order). Streams
//! that received no operator are left out and the others keep their relative order (the
//! deterministic variants always fill a prefix of the streams, so their indices are the
//! paper's `p1, p2, ...` minus one). [`Lios::run`] gives the full trace: every
//! `(operator, stream, start, finish)` tuple of the paper's Definition 6 and LIOS's own
//! makespan, which the simulator reproduces under the ideal model.

use std::time::Instant;

use opsched_cost::CostModel;
use opsched_graph::rng::SplitMix64;
use opsched_graph::{Graph, NodeId};
use opsched_schedule::{
    GpuStreams, Platform, Schedule, ScheduleError, Scheduler, SchedulerStats, StreamPlan,
};

/// Which of the paper's four methods (LIOS and its RQ3 ablations).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LiosVariant {
    /// Highest rank first, stream of the earliest finish time.
    #[default]
    Lios,
    /// Random operator from the wait list, stream of the earliest finish time.
    Rand1,
    /// Highest rank first, random stream.
    Rand2,
    /// Random operator, random stream.
    Rand,
}

impl LiosVariant {
    /// All variants, LIOS first.
    pub const ALL: [LiosVariant; 4] = [
        LiosVariant::Lios,
        LiosVariant::Rand1,
        LiosVariant::Rand2,
        LiosVariant::Rand,
    ];

    /// The registry name: "lios", "lios-rand1", "lios-rand2" or "lios-rand".
    pub fn name(self) -> &'static str {
        match self {
            LiosVariant::Lios => "lios",
            LiosVariant::Rand1 => "lios-rand1",
            LiosVariant::Rand2 => "lios-rand2",
            LiosVariant::Rand => "lios-rand",
        }
    }

    /// The variant registered under exactly `name`.
    pub fn from_name(name: &str) -> Option<LiosVariant> {
        Self::ALL.into_iter().find(|v| v.name() == name)
    }

    /// Whether the operator is drawn at random instead of by rank.
    pub fn random_operator(self) -> bool {
        matches!(self, LiosVariant::Rand1 | LiosVariant::Rand)
    }

    /// Whether the stream is drawn at random instead of by earliest finish time.
    pub fn random_stream(self) -> bool {
        matches!(self, LiosVariant::Rand2 | LiosVariant::Rand)
    }
}

/// The LIOS scheduler (one GPU, `platform.streams` streams).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Lios {
    variant: LiosVariant,
    seed: u64,
}

/// One scheduling step: the paper's schedule tuple `(v, p, ST, FT)` (Definition 6).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Step {
    pub op: NodeId,
    /// Stream index as LIOS chose it, `0..streams` (the paper's `p1` is 0).
    pub stream: usize,
    pub start_ms: f64,
    pub finish_ms: f64,
}

/// The outcome of one LIOS run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiosRun {
    /// The steps in scheduling order.
    pub steps: Vec<Step>,
    /// Number of streams LIOS could choose from.
    pub streams: usize,
    /// LIOS's own makespan: the latest finish time (0 for a graph without operators).
    pub makespan_ms: f64,
    /// Stream finish-time evaluations (EFT computations).
    pub evaluations: u64,
}

impl LiosRun {
    /// The stream plan of this run: one GPU, non-empty streams in index order, each listing
    /// its operators in execution order; `launch_order` is the scheduling order.
    pub fn plan(&self) -> StreamPlan {
        let mut streams: Vec<Vec<NodeId>> = vec![Vec::new(); self.streams];
        for s in &self.steps {
            if let Some(list) = streams.get_mut(s.stream) {
                list.push(s.op);
            }
        }
        streams.retain(|s| !s.is_empty());
        StreamPlan {
            gpus: vec![GpuStreams {
                streams,
                launch_order: Some(self.steps.iter().map(|s| s.op).collect()),
            }],
        }
    }

    /// The step that scheduled `op`, if any.
    pub fn step_of(&self, op: NodeId) -> Option<&Step> {
        self.steps.iter().find(|s| s.op == op)
    }
}

impl Lios {
    /// A scheduler of the given variant; `seed` drives the random variants (LIOS ignores it).
    pub fn new(variant: LiosVariant, seed: u64) -> Self {
        Lios { variant, seed }
    }

    /// The heuristic LIOS of the paper (the same as [`Lios::default`]).
    pub fn heuristic() -> Self {
        Lios::new(LiosVariant::Lios, 0)
    }

    /// The scheduler of a registry name ("lios", "lios-rand1", "lios-rand2", "lios-rand").
    pub fn from_name(name: &str, seed: u64) -> Option<Self> {
        LiosVariant::from_name(name).map(|v| Lios::new(v, seed))
    }

    pub fn variant(&self) -> LiosVariant {
        self.variant
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Run LIOS on `g` with `streams` streams, operator weights from `cost.op_time`.
    ///
    /// Errors: no stream, or an operator weight that is not a finite non-negative number.
    pub fn run(
        &self,
        g: &Graph,
        streams: usize,
        cost: &dyn CostModel,
    ) -> Result<LiosRun, ScheduleError> {
        if streams == 0 {
            return Err(ScheduleError::Config(
                "LIOS needs at least one stream".to_string(),
            ));
        }
        let n = g.len();
        // Operator weights (Rank = weight, Eq. 5) and unscheduled operator predecessors.
        let mut weight = vec![0.0f64; n];
        let mut waiting = vec![0usize; n];
        let mut is_op = vec![false; n];
        for op in g.ops() {
            let w = cost.op_time(g, op);
            if !(w.is_finite() && w >= 0.0) {
                return Err(ScheduleError::Config(format!(
                    "cost model {} gives operator '{}' the time {w}",
                    cost.name(),
                    g.node(op).name
                )));
            }
            let i = op.index();
            weight[i] = w;
            is_op[i] = true;
        }
        let mut wait_list: Vec<NodeId> = Vec::new();
        for i in 0..n {
            if !is_op[i] {
                continue;
            }
            let id = NodeId(i as u32);
            waiting[i] = g.preds(id).filter(|p| is_op[p.index()]).count();
            if waiting[i] == 0 {
                wait_list.push(id);
            }
        }

        let total = is_op.iter().filter(|&&b| b).count();
        let mut rng = SplitMix64::new(self.seed);
        let mut finish = vec![0.0f64; n];
        let mut free = vec![0.0f64; streams];
        let mut run = LiosRun {
            steps: Vec::with_capacity(total),
            streams,
            makespan_ms: 0.0,
            evaluations: 0,
        };
        let mut newly: Vec<NodeId> = Vec::new();

        while !wait_list.is_empty() {
            // Operator prioritizing (Algorithm 1, line 6).
            let pick = if self.variant.random_operator() {
                rng.below(wait_list.len())
            } else {
                highest_rank(&wait_list, &weight)
            };
            let v = wait_list.remove(pick);
            let w = weight[v.index()];
            let ready = g
                .preds(v)
                .filter(|p| is_op[p.index()])
                .map(|p| finish[p.index()])
                .fold(0.0, f64::max);

            // Stream selection (lines 7-10).
            let stream = if self.variant.random_stream() {
                rng.below(streams)
            } else {
                run.evaluations += streams as u64;
                earliest_finish(&free, ready, w)
            };
            let start = free.get(stream).copied().unwrap_or(0.0).max(ready);
            let end = start + w;
            if let Some(f) = free.get_mut(stream) {
                *f = end;
            }
            finish[v.index()] = end;
            run.makespan_ms = run.makespan_ms.max(end);
            run.steps.push(Step {
                op: v,
                stream,
                start_ms: start,
                finish_ms: end,
            });

            // Update the data dependencies and append the newly ready operators (lines 12-14).
            newly.clear();
            for s in g.succs(v) {
                let i = s.index();
                if !is_op[i] || waiting[i] == 0 {
                    continue;
                }
                waiting[i] -= 1;
                if waiting[i] == 0 {
                    newly.push(s);
                }
            }
            newly.sort_unstable();
            wait_list.extend_from_slice(&newly);
        }

        if run.steps.len() != total {
            // Unreachable for a validated (acyclic) graph; refuse rather than drop operators.
            return Err(ScheduleError::Invalid(format!(
                "LIOS scheduled {} of {} operators of {}",
                run.steps.len(),
                total,
                g.name
            )));
        }
        Ok(run)
    }
}

/// Index of the highest-weight operator in the wait list; ties to the earliest entry.
fn highest_rank(wait_list: &[NodeId], weight: &[f64]) -> usize {
    let mut best = 0;
    let mut best_w = f64::NEG_INFINITY;
    for (k, v) in wait_list.iter().enumerate() {
        let w = weight.get(v.index()).copied().unwrap_or(0.0);
        if w > best_w {
            best = k;
            best_w = w;
        }
    }
    best
}

/// The stream of the smallest `EFT = max(free, ready) + w`; ties to the lowest index.
fn earliest_finish(free: &[f64], ready: f64, w: f64) -> usize {
    let mut best = 0;
    let mut best_eft = f64::INFINITY;
    for (j, &f) in free.iter().enumerate() {
        let eft = f.max(ready) + w;
        if eft < best_eft {
            best = j;
            best_eft = eft;
        }
    }
    best
}

impl Scheduler for Lios {
    fn name(&self) -> &str {
        self.variant.name()
    }

    fn schedule(
        &self,
        g: &Graph,
        platform: &Platform,
        cost: &dyn CostModel,
    ) -> Result<(Schedule, SchedulerStats), ScheduleError> {
        platform.check(self.variant.name())?;
        let start = Instant::now();
        let run = self.run(g, platform.streams, cost)?;
        let plan = run.plan();
        let mut extra = serde_json::Map::new();
        extra.insert(
            "lios_makespan_ms".to_string(),
            serde_json::json!(run.makespan_ms),
        );
        extra.insert(
            "streams_used".to_string(),
            serde_json::json!(plan.gpus.first().map_or(0, |gs| gs.streams.len())),
        );
        if self.variant != LiosVariant::Lios {
            extra.insert("seed".to_string(), serde_json::json!(self.seed));
        }
        let stats = SchedulerStats {
            wall_ms: start.elapsed().as_secs_f64() * 1e3,
            states: run.steps.len() as u64,
            transitions: run.evaluations,
            cost_queries: g.op_count() as u64,
            extra,
        };
        tracing::debug!(
            model = %g.name,
            variant = self.variant.name(),
            ops = run.steps.len(),
            makespan_ms = run.makespan_ms,
            "lios schedule"
        );
        Ok((Schedule::Streams(plan), stats))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_ties_go_to_the_earliest_wait_list_entry() {
        let weight = [5.0, 5.0, 8.0, 8.0, 1.0];
        let list = [NodeId(4), NodeId(1), NodeId(0), NodeId(3), NodeId(2)];
        assert_eq!(highest_rank(&list, &weight), 3);
        let list = [NodeId(1), NodeId(0), NodeId(4)];
        assert_eq!(highest_rank(&list, &weight), 0);
    }

    #[test]
    fn eft_ties_go_to_the_lowest_stream() {
        // Everything ready at 3 fits on any stream free by then: the first one.
        assert_eq!(earliest_finish(&[18.0, 3.0, 0.0], 3.0, 5.0), 1);
        assert_eq!(earliest_finish(&[0.0, 0.0, 0.0], 0.0, 1.0), 0);
        assert_eq!(earliest_finish(&[18.0, 23.0, 8.0], 8.0, 5.0), 2);
    }
}
