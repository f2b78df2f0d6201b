//! # opsched-hios
//!
//! HIOS (Hierarchical Inter-Operator Scheduler, multi-GPU): two inter-GPU mappings followed by
//! an intra-GPU sliding-window parallelization, as in the paper "HIOS: A Hierarchical
//! Inter-Operator Scheduler for Real-Time Inference of DAG-Structured Deep Learning Models on
//! Multiple GPUs".
//!
//! | name            | inter-GPU mapping              | intra-GPU step |
//! |-----------------|--------------------------------|----------------|
//! | `hios-lp`       | Alg. 1, longest valid paths    | Alg. 2         |
//! | `hios-lp-inter` | Alg. 1                         | none           |
//! | `hios-mr`       | Alg. 3, mapping recording      | Alg. 2         |
//! | `hios-mr-inter` | Alg. 3                         | none           |
//!
//! **Priority indicator** (Sec. IV-A): the longest path from an operator to an exit, counting
//! operator times (`cost.op_time`) and transfer times (`cost.transfer_time`). Descending
//! priority (ties by topological position) is a topological order; all three algorithms walk
//! operators in it.
//!
//! **Alg. 1** (HIOS-LP, lines 1-16): repeatedly take the longest *valid* path of the unmapped
//! operators (line 5: its intermediate operators have no edge from or to a mapped operator;
//! its end operators may, and the boundary edges count towards its length), and map all of it
//! to the GPU on which the earliest-start list schedule of every mapped operator, in priority
//! order, ends first (lines 8-16; ties to the lowest GPU). Unlike the reference code, the
//! validity rule is enforced ([`HiosLp::always_longest_path`] gives the reference behaviour
//! for comparison).
//!
//! **Alg. 3** (HIOS-MR, lines 1-26): a table over (operator, GPU) of earliest finish times with
//! back pointers, honouring *all* producers of an operator (the reference code only the
//! first).
//!
//! **Alg. 2** (both, unless `inter_only`): per operator in priority order, group it with the
//! next `p <= w - 1` operators of its GPU into one stage (one group each, at most
//! `platform.streams` groups) if they are independent and the stage graph stays acyclic
//! across GPUs; keep the best such grouping if the latency does not grow.
//!
//! **Evaluation.** Every latency the algorithms compare comes from one internal evaluator that
//! walks stages in a topological order of the stage graph and reproduces the simulator of
//! `opsched-schedule` (see the `eval` module docs): its makespan equals
//! `opsched_schedule::simulate`'s for the same plan and cost model. Each stage-time and
//! transfer-time question is asked of the cost model once.
//!
//! **Output.** A [`Schedule::Stages`] plan with exactly `platform.gpus` GPUs (some possibly
//! empty); on each GPU, operators in priority order, one operator per group.
//!
//! Graph inputs are not operators: they are not scheduled and their edges are ignored.

mod dense;
mod eval;
mod lp;
mod mr;
mod window;

use std::time::Instant;

use opsched_cost::CostModel;
use opsched_graph::Graph;
use opsched_schedule::{
    Platform, Schedule, ScheduleError, Scheduler, SchedulerStats, Stage, StagePlan, StageStrategy,
};

use crate::dense::Dense;
use crate::eval::{singleton_plan, Evaluator, StageRec};

/// Options shared by both HIOS variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HiosOptions {
    /// Maximum window size `w` of Alg. 2 (operators grouped into one stage); the paper's
    /// default is 2. Values below 2 disable grouping.
    pub window: usize,
    /// Stop after the inter-GPU mapping (the paper's "inter-GPU w/ LP" and "w/ MR").
    pub inter_only: bool,
}

impl Default for HiosOptions {
    fn default() -> Self {
        HiosOptions {
            window: 2,
            inter_only: false,
        }
    }
}

impl HiosOptions {
    /// The default options with `inter_only` set.
    pub fn inter_only() -> Self {
        HiosOptions {
            inter_only: true,
            ..HiosOptions::default()
        }
    }
}

/// HIOS-LP: Alg. 1 (iterative longest valid paths), then Alg. 2 unless `inter_only`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HiosLp {
    pub options: HiosOptions,
    /// Enforce line 5's rule on intermediate vertices (the paper); off: always the longest
    /// path (the reference code).
    valid_path_rule: bool,
}

impl HiosLp {
    pub fn new(options: HiosOptions) -> Self {
        HiosLp {
            options,
            valid_path_rule: true,
        }
    }

    /// Like [`HiosLp::new`], but always taking the longest path, ignoring the rule of line 5
    /// (what the reference code does, its check being dead code). For comparisons.
    pub fn always_longest_path(options: HiosOptions) -> Self {
        HiosLp {
            options,
            valid_path_rule: false,
        }
    }

    /// Whether line 5's rule on intermediate vertices is enforced.
    pub fn valid_path_rule(&self) -> bool {
        self.valid_path_rule
    }
}

impl Default for HiosLp {
    fn default() -> Self {
        HiosLp::new(HiosOptions::default())
    }
}

/// HIOS-MR: Alg. 3 (mapping recording), then Alg. 2 unless `inter_only`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HiosMr {
    pub options: HiosOptions,
}

impl HiosMr {
    pub fn new(options: HiosOptions) -> Self {
        HiosMr { options }
    }
}

impl Scheduler for HiosLp {
    fn name(&self) -> &str {
        if self.options.inter_only {
            "hios-lp-inter"
        } else {
            "hios-lp"
        }
    }

    fn schedule(
        &self,
        g: &Graph,
        platform: &Platform,
        cost: &dyn CostModel,
    ) -> Result<(Schedule, SchedulerStats), ScheduleError> {
        let rule = self.valid_path_rule;
        run(self.name(), self.options, g, platform, cost, |d, gpus| {
            let out = lp::map_paths(d, gpus, rule);
            let mut extra = serde_json::Map::new();
            extra.insert("paths".into(), out.paths.into());
            extra.insert("valid_path_rule".into(), rule.into());
            Mapping {
                gpu_of: out.gpu_of,
                states: out.paths,
                transitions: out.candidates,
                extra,
            }
        })
    }
}

impl Scheduler for HiosMr {
    fn name(&self) -> &str {
        if self.options.inter_only {
            "hios-mr-inter"
        } else {
            "hios-mr"
        }
    }

    fn schedule(
        &self,
        g: &Graph,
        platform: &Platform,
        cost: &dyn CostModel,
    ) -> Result<(Schedule, SchedulerStats), ScheduleError> {
        run(self.name(), self.options, g, platform, cost, |d, gpus| {
            let out = mr::map_recording(d, gpus);
            Mapping {
                gpu_of: out.gpu_of,
                states: out.cells,
                transitions: out.tries,
                extra: serde_json::Map::new(),
            }
        })
    }
}

/// An inter-GPU mapping with its statistics.
struct Mapping {
    gpu_of: Vec<usize>,
    states: u64,
    transitions: u64,
    extra: serde_json::Map<String, serde_json::Value>,
}

fn run(
    name: &str,
    options: HiosOptions,
    g: &Graph,
    platform: &Platform,
    cost: &dyn CostModel,
    map: impl FnOnce(&Dense, usize) -> Mapping,
) -> Result<(Schedule, SchedulerStats), ScheduleError> {
    platform.check(name)?;
    let clock = Instant::now();
    let d = Dense::new(g, cost)?;
    let gpus = platform.gpus;
    let mapping = map(&d, gpus);
    if let Some(v) = (0..d.len()).find(|&v| mapping.gpu_of.get(v).is_none_or(|&x| x >= gpus)) {
        return Err(ScheduleError::Invalid(format!(
            "{name}: internal error: operator '{}' was left unmapped",
            g.node(d.ids[v]).name
        )));
    }
    let mut plan = singleton_plan(&d, &mapping.gpu_of, gpus);
    let mut ev = Evaluator::default();
    let inter = {
        let views: Vec<&[StageRec]> = plan.iter().map(|l| &l[..]).collect();
        ev.makespan(&d, &views)
    };
    let Some(inter) = inter else {
        return Err(ScheduleError::Invalid(format!(
            "{name}: internal error: the inter-GPU schedule has a cycle among its stages"
        )));
    };
    let mut stats = SchedulerStats {
        states: mapping.states,
        transitions: mapping.transitions,
        cost_queries: d.cost_queries,
        extra: mapping.extra,
        ..SchedulerStats::default()
    };
    let mut latency = inter;
    if !options.inter_only {
        let (l, w) = window::parallelize(
            g,
            cost,
            &d,
            &mut plan,
            inter,
            options.window,
            platform.streams,
            &mut ev,
        );
        latency = l;
        stats.transitions += w.candidates;
        stats.cost_queries += w.cost_queries;
        stats
            .extra
            .insert("groupings_accepted".into(), w.accepted.into());
    }
    stats.extra.insert("inter_makespan_ms".into(), inter.into());
    stats.extra.insert("makespan_ms".into(), latency.into());
    stats.extra.insert("evaluations".into(), ev.calls.into());
    let out = StagePlan {
        gpus: plan
            .into_iter()
            .map(|list| {
                list.into_iter()
                    .map(|st| Stage {
                        strategy: StageStrategy::Concurrent,
                        groups: st
                            .groups
                            .into_iter()
                            .map(|grp| grp.into_iter().map(|v| d.ids[v]).collect())
                            .collect(),
                    })
                    .collect()
            })
            .collect(),
    };
    stats.wall_ms = clock.elapsed().as_secs_f64() * 1e3;
    tracing::debug!(
        algo = name,
        model = %g.name,
        ops = d.len(),
        gpus,
        inter_ms = inter,
        makespan_ms = latency,
        wall_ms = stats.wall_ms,
        "hios schedule"
    );
    Ok((Schedule::Stages(out), stats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use opsched_graph::random::{layered_dag, LayeredDagParams};

    /// The fast list scheduler of Alg. 1 and the stage evaluator agree on single-operator
    /// plans, and both are ordered by the priority order.
    #[test]
    fn list_schedule_equals_the_stage_evaluator() {
        let cost = opsched_cost::HiosSimLaw::new(opsched_cost::AnalyticalModel::default());
        for seed in 0..5 {
            let g = layered_dag(&LayeredDagParams {
                ops: 40,
                layers: 6,
                edges: 70,
                seed,
                ..LayeredDagParams::default()
            })
            .unwrap_or_else(|e| panic!("{e}"));
            let d = Dense::new(&g, &cost).unwrap_or_else(|e| panic!("{e}"));
            for (i, &v) in d.order.iter().enumerate() {
                for &(u, _) in &d.preds[v] {
                    let ru = d.order.iter().position(|&x| x == u).unwrap_or(usize::MAX);
                    assert!(ru < i, "priority order is topological");
                }
            }
            let gpu_of: Vec<usize> = (0..d.len()).map(|v| (v * 7 + seed as usize) % 3).collect();
            let mut fin = Vec::new();
            let a = eval::list_schedule(&d, &gpu_of, 3, &mut fin);
            let plan = singleton_plan(&d, &gpu_of, 3);
            let views: Vec<&[StageRec]> = plan.iter().map(|l| &l[..]).collect();
            let mut ev = Evaluator::default();
            let b = ev.makespan(&d, &views);
            assert_eq!(Some(a), b);
            assert_eq!(&fin[..], ev.finish());
        }
    }
}
