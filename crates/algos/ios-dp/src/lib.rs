//! # opsched-ios-dp
//!
//! IOS (Ding et al., MLSys 2021): a dynamic program over stages that schedules the operators
//! of a model on **one GPU**, each stage running either *concurrent groups* (one stream per
//! group, each group runs its operators in order) or one *merged* convolution (or linear
//! layer, an extension of ours: see below). Three variants
//! are registered: `ios` (both strategies), `ios-parallel` (concurrent stages only) and
//! `ios-merge` (merge stages or single operators only).
//!
//! ## Parts
//! The graph is cut into parts: its blocks in a topological order of the block graph, each block in consecutive chunks of at most
//! [`IosOptions::part`] operators of a topological order, and operators in no block gathered
//! into chunks the same way. Each part is solved on its own and the stages are concatenated.
//!
//! ### Parts and their order
//! Listing the units (blocks, and unblocked operators) in a topological order of the quotient
//! graph, each unit's operators in topological order, gives a topological order `L` of the
//! whole graph. Every part is a contiguous slice of `L`, so an edge either lies inside a part
//! (the part's schedule respects it) or goes from an earlier part to a later one, whose
//! stages all run after the earlier part's. Non-convex blocks (a cycle among units) are ignored
//! and the plain topological order is chunked instead (statistic `blocks_ignored`).
//!
//! ## The DP
//! State: the set `S` of the part's operators not yet scheduled, closed under predecessors
//! (a bitset: `u64` for parts of up to 64 operators, `u128` up to 128; larger parts are refused
//! with an error). `cost(S) = min over endings E of S of cost(S - E) + stage_cost(E)`,
//! `cost({}) = 0`, memoized with the chosen ending; the plan is rebuilt from the full set.
//! An ending is the last stage of `S`: no operator of `E` has a successor in `S - E`.
//!
//! ## Endings, as IOS's `optimizer.py` enumerates them
//! - **Concurrent** (`ending_iterator`): decompose the part into chains (transitive closure,
//!   then repeatedly remove a longest chain). For each chain take its prefix lying in `S` (the
//!   chain's members in `S` always form a prefix) and allow as the chain's *head* any of the
//!   prefix's last `r` operators, or none. A head `h` gives the group `h` plus all its
//!   descendants in `S`. Combinations with more than `s` groups, overlapping groups or a group of
//!   more than `r` operators are rejected. The union of such groups is successor-closed in `S`,
//!   hence an ending, and no edge joins two groups (an edge `x -> y` from group `a` to group `b`
//!   would put `y` among `a`'s descendants, an overlap). A group need not be a chain (a head
//!   with two independent descendants); like IOS (which sorts the group by its topological node
//!   index) we run it in topological order on one stream, which is valid.
//!
//!   The set of endings does not depend on how the chains come out (IOS breaks ties by dict
//!   order, we by lowest index): it is every set `H` of at most `s` operators of `S` whose
//!   groups (each `h` with its descendants in `S`) are pairwise disjoint and of at most `r`
//!   operators. Each `h` lies in exactly one chain, and if its group has at most `r` operators
//!   it is among the last `r` of its chain's prefix (the later ones are its descendants).
//!   Distinct head sets give distinct endings (the heads are the ending's minimal operators),
//!   so no ending is evaluated twice.
//! - **Merge** (`dp` with `merge` in `opt_type`): IOS tries every subset of the *sinks* of `S`
//!   (operators without a successor in `S`; any subset of them is an ending) and keeps those
//!   `check_merge` accepts. Only convolutions reading identical inputs can merge, so we group the
//!   part's `groups = 1` convolutions (and, beyond IOS, its linear layers: a Transformer's
//!   query, key and value projections) by kind and identical input terms once, and per state
//!   enumerate the
//!   subsets (two or more) of each class's sinks; the cost model's
//!   [`merged_time`](opsched_cost::CostModel::merged_time) (which applies
//!   [`opsched_graph::merge::mergeable`]) rejects the rest. IOS considers merge and concurrent
//!   stages for the same set and the DP takes the cheaper.
//! - **ios-merge**: every single sink of `S` (IOS's one-operator "merge" stages), plus the merge
//!   stages.
//!
//! Where we differ from `optimizer.py`, none of which changes the optimum:
//! - The checks on overlap, group size and group count are applied while choosing heads
//!   instead of after building each full combination (the same set of endings, far fewer
//!   candidates looked at); heads earlier in a chain than the first head whose group is too
//!   large are skipped (their groups contain it).
//! - The merge rule is the project's ([`opsched_graph::merge`]): identical input terms (IOS
//!   requires a single one-value term), bias and dilation equal, padding consistent. Merge
//!   classes with more than 12 sinks in a state only try subsets of their first 12.
//! - Ties between endings of equal total may be broken differently (enumeration order).
//! - In the `ios` variant IOS's merge loop also offers every single sink as a one-operator
//!   "merge" stage, which the concurrent enumeration already offers (a sink is the last
//!   operator of its chain's prefix, a head whose group is itself); we evaluate that stage once.
//!   So `states` is IOS's `#states` and `transitions` is IOS's `#transitions` minus the sinks of
//!   every state: on Inception-v3 (r = 3, s = 8) 1,206 states, 25,486 transitions against IOS's
//!   28,874, the difference being its 3,388 repeated one-operator stages (a unit test recounts
//!   every state IOS's way). Merge stages of two or more operators are the same sets there.
//! - Stage costs come from the cost model and are cached by
//!   [`stage_signature`](opsched_cost::signature::stage_signature), so identical stages anywhere
//!   in the model (NASNet's repeated cells) are costed once; IOS measures each distinct operator
//!   set of each part on the GPU. A concurrent stage of several groups also pays its fork and
//!   join ([`Overheads::fork_join_ms`](opsched_cost::Overheads::fork_join_ms): the simulator's
//!   events; zero for an uncalibrated preset), as IOS's measurement of a stage includes its
//!   stream synchronisation.
//! - `s` is also capped by the platform's streams; IOS's default part size is 100, ours is the
//!   paper's 50.
//!
//! ## Work budget
//! The DP is exponential in a part's width (20 mutually independent operators: 2^20 states
//! with up to 263,950 endings each). [`IosOptions::budget`] bounds the endings enumerated over
//! the whole run (default [`DEFAULT_BUDGET_TRANSITIONS`]) or its time; every ending is charged
//! while it is enumerated, so a single wide state cannot exhaust memory either. When the budget
//! runs out the part in progress is abandoned and it and every later part are scheduled as
//! waves of ready operators (at most `s` per stage, one group each); the parts solved before
//! keep their optimal stages. The schedule stays valid; a `tracing` warning says how many parts
//! fell back, and the statistics carry `budget_spent` (endings enumerated, abandoned part
//! included), `budget_exhausted`, `fallback_parts` and `fallback_ops`.
//!
//! ## Statistics
//! `states` (DP states solved, as IOS's `#states` counts them), `transitions` (valid endings
//! evaluated: a merge candidate the merge rule rejects is not one, as in IOS), `cost_queries`
//! (distinct stages costed); `extra`: `parts`, `largest_part`, `stage_cache_hits`, `stages`,
//! `merge_stages`, `objective_ms` (the DP's sum of stage costs), `r`, `s`, `variant`, `budget`,
//! `budget_exhausted` (with `fallback_parts`, `fallback_ops` when true), and `blocks_ignored`
//! when blocks had to be ignored.

mod bits;
mod dp;
mod hash;
mod parts;

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use opsched_cost::CostModel;
use opsched_graph::{Graph, NodeId};
use opsched_schedule::{
    NoProgress, Platform, Progress, Schedule, ScheduleError, Scheduler, SchedulerStats, Stage,
    StagePlan, StageStrategy,
};

use crate::bits::Bits;
use crate::dp::{ready_waves, Dp, Limits, PartGraph, PartResult, StageCosts};

/// Largest part the DP accepts (operators).
pub const MAX_PART: usize = 128;

/// The default work budget: endings enumerated over a whole run. The zoo's largest search
/// (RandWire, 5.1 million) fits twice; 20 to 50 mutually independent operators, whose search
/// is exponential, stop after a few seconds.
pub const DEFAULT_BUDGET_TRANSITIONS: u64 = 10_000_000;

/// How much search the DP may do in one run before the parts still unsolved fall back to
/// waves of ready operators (`--ios-budget`: a count such as `10000000`, or a time such as
/// `30s` or `500ms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IosBudget {
    /// Endings enumerated over the whole run, valid or not (`budget_spent` in the statistics;
    /// `transitions` counts only the valid ones, as IOS does).
    Transitions(u64),
    /// Wall-clock time of the whole run.
    Time(Duration),
}

impl Default for IosBudget {
    fn default() -> Self {
        IosBudget::Transitions(DEFAULT_BUDGET_TRANSITIONS)
    }
}

impl fmt::Display for IosBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IosBudget::Transitions(n) => write!(f, "{n} transitions"),
            IosBudget::Time(d) => write!(f, "{} s", d.as_secs_f64()),
        }
    }
}

impl serde::Serialize for IosBudget {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl FromStr for IosBudget {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let bad = || {
            format!(
                "invalid IOS budget '{text}': expected a positive number of transitions \
                 (10000000) or a time of at most a day (30s, 500ms)"
            )
        };
        // A bare count, or what `Display` writes: "10000000 transitions".
        let count = t.strip_suffix("transitions").unwrap_or(t).trim();
        if let Ok(n) = count.replace('_', "").parse::<u64>() {
            return if n == 0 {
                Err(bad())
            } else {
                Ok(IosBudget::Transitions(n))
            };
        }
        let (number, unit) = if let Some(n) = t.strip_suffix("ms") {
            (n, 1e-3)
        } else if let Some(n) = t.strip_suffix('s') {
            (n, 1.0)
        } else {
            return Err(bad());
        };
        let secs = number.trim().parse::<f64>().map_err(|_| bad())? * unit;
        if secs.is_finite() && secs > 0.0 && secs <= 86_400.0 {
            Ok(IosBudget::Time(Duration::from_secs_f64(secs)))
        } else {
            Err(bad())
        }
    }
}

/// The work spent against an [`IosBudget`] over one run (all parts).
pub(crate) struct Meter {
    budget: IosBudget,
    spent: u64,
    start: Instant,
    out: bool,
}

impl Meter {
    pub(crate) fn new(budget: IosBudget) -> Self {
        Meter {
            budget,
            spent: 0,
            start: Instant::now(),
            out: false,
        }
    }

    /// Count one enumerated ending; `false` once the budget is spent (and ever after).
    #[inline]
    pub(crate) fn charge(&mut self) -> bool {
        if self.out {
            return false;
        }
        self.spent += 1;
        self.out = match self.budget {
            IosBudget::Transitions(n) => self.spent > n,
            // Reading the clock is cheap, but not per ending.
            IosBudget::Time(d) => self.spent.is_multiple_of(256) && self.start.elapsed() > d,
        };
        !self.out
    }

    pub(crate) fn exhausted(&self) -> bool {
        self.out
    }
}

/// Which stage strategies the DP may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IosVariant {
    /// Concurrent and merge stages ("ios", IOS's `dp_parallel_merge`).
    #[default]
    Both,
    /// Concurrent stages only ("ios-parallel", `dp_parallel`).
    Parallel,
    /// Merge stages or single operators only ("ios-merge", `dp_merge`).
    Merge,
}

impl IosVariant {
    /// The registry name of the scheduler with this variant.
    pub fn name(self) -> &'static str {
        match self {
            IosVariant::Both => "ios",
            IosVariant::Parallel => "ios-parallel",
            IosVariant::Merge => "ios-merge",
        }
    }

    /// The variant registered under exactly `name` ("ios", "ios-parallel", "ios-merge").
    pub fn from_name(name: &str) -> Option<Self> {
        [IosVariant::Both, IosVariant::Parallel, IosVariant::Merge]
            .into_iter()
            .find(|v| v.name() == name)
    }

    fn limits(self, r: usize, s: usize) -> Limits {
        Limits {
            r,
            s,
            parallel: self != IosVariant::Merge,
            merge: self != IosVariant::Parallel,
            singles: self == IosVariant::Merge,
        }
    }
}

/// Options of IOS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IosOptions {
    /// Most operators per group (IOS's `max_group_size`, 3).
    pub r: usize,
    /// Most groups per concurrent stage (`max_num_groups`, 8); also capped by the platform's
    /// streams.
    pub s: usize,
    /// Most operators per part (50; at most [`MAX_PART`]).
    pub part: usize,
    pub variant: IosVariant,
    /// Work allowed to the DP over the whole run; the parts left when it runs out are
    /// scheduled as waves of ready operators, with a warning.
    pub budget: IosBudget,
}

impl Default for IosOptions {
    fn default() -> Self {
        IosOptions {
            r: 3,
            s: 8,
            part: 50,
            variant: IosVariant::Both,
            budget: IosBudget::default(),
        }
    }
}

/// The IOS scheduler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ios {
    pub opts: IosOptions,
}

/// A solved IOS schedule: the stages of GPU 0 and what the DP believes they cost.
#[derive(Clone, Debug, PartialEq)]
pub struct IosSolution {
    pub stages: Vec<Stage>,
    /// The DP objective: the sum of the stages' costs, ms.
    pub objective_ms: f64,
    pub stats: SchedulerStats,
}

impl Ios {
    pub fn new(opts: IosOptions) -> Self {
        Ios { opts }
    }

    /// Default options with `variant`.
    pub fn with_variant(variant: IosVariant) -> Self {
        Ios {
            opts: IosOptions {
                variant,
                ..IosOptions::default()
            },
        }
    }

    /// Run the DP and return the stages with the objective and statistics.
    pub fn solve(
        &self,
        g: &Graph,
        platform: &Platform,
        cost: &dyn CostModel,
    ) -> Result<IosSolution, ScheduleError> {
        self.solve_with_progress(g, platform, cost, &NoProgress)
    }

    /// [`Ios::solve`], reporting the operators of each part as it is solved.
    pub fn solve_with_progress(
        &self,
        g: &Graph,
        platform: &Platform,
        cost: &dyn CostModel,
        progress: &dyn Progress,
    ) -> Result<IosSolution, ScheduleError> {
        let o = &self.opts;
        platform.check(self.opts.variant.name())?;
        if o.r == 0 || o.s == 0 || o.part == 0 {
            return Err(ScheduleError::Config(format!(
                "IOS options r, s and part must be positive (got r = {}, s = {}, part = {})",
                o.r, o.s, o.part
            )));
        }
        if o.part > MAX_PART {
            return Err(ScheduleError::Config(format!(
                "IOS part size {} exceeds the supported {MAX_PART} operators",
                o.part
            )));
        }
        let start = Instant::now();
        let s_eff = o.s.min(platform.streams);
        let lim = o.variant.limits(o.r, s_eff);
        let split = parts::split(g, o.part);
        let mut costs = StageCosts::default();
        let mut local = vec![u32::MAX; g.len()];
        let mut stages = Vec::with_capacity(g.op_count());
        let (mut objective, mut states, mut transitions) = (0.0, 0u64, 0u64);
        let mut largest = 0usize;
        let mut meter = Meter::new(o.budget);
        // (first part that fell back, parts, operators)
        let mut fallback: Option<(usize, usize, usize)> = None;
        progress.begin(
            split.parts.iter().map(|p| p.len() as u64).sum(),
            "operators",
        );
        for (k, part) in split.parts.iter().enumerate() {
            largest = largest.max(part.len());
            let res = if part.len() <= u64::CAP {
                solve_part::<u64>(g, cost, part, lim, &mut costs, &mut local, &mut meter)
            } else if part.len() <= u128::CAP {
                solve_part::<u128>(g, cost, part, lim, &mut costs, &mut local, &mut meter)
            } else {
                None
            };
            let res = res.ok_or_else(|| {
                ScheduleError::Invalid(format!(
                    "IOS found no schedule for the part starting at '{}' ({} operators)",
                    part.first().map_or("?", |&o| g.node(o).name.as_str()),
                    part.len()
                ))
            })?;
            if res.fallback {
                let f = fallback.get_or_insert((k, 0, 0));
                f.1 += 1;
                f.2 += part.len();
            }
            objective += res.objective;
            states += res.states;
            transitions += res.transitions;
            stages.extend(res.stages);
            progress.advance(part.len() as u64);
        }
        let merge_stages = stages
            .iter()
            .filter(|st| st.strategy == StageStrategy::Merge)
            .count();
        let mut extra = serde_json::Map::new();
        extra.insert("parts".into(), split.parts.len().into());
        extra.insert("largest_part".into(), largest.into());
        extra.insert("stage_cache_hits".into(), costs.hits.into());
        extra.insert("stages".into(), stages.len().into());
        extra.insert("merge_stages".into(), merge_stages.into());
        extra.insert("objective_ms".into(), objective.into());
        extra.insert("r".into(), o.r.into());
        extra.insert("s".into(), s_eff.into());
        extra.insert("variant".into(), o.variant.name().into());
        if split.blocks_ignored {
            extra.insert("blocks_ignored".into(), true.into());
        }
        extra.insert("budget".into(), o.budget.to_string().into());
        extra.insert("budget_exhausted".into(), fallback.is_some().into());
        extra.insert("budget_spent".into(), meter.spent.into());
        if let Some((first, parts, ops)) = fallback {
            extra.insert("fallback_parts".into(), parts.into());
            extra.insert("fallback_ops".into(), ops.into());
            tracing::warn!(
                "{} on {}: the search budget ({}) ran out in part {} of {}; {parts} part{} \
                 ({ops} operators) scheduled as waves of ready operators instead of by the \
                 dynamic program (raise --ios-budget for the optimum)",
                o.variant.name(),
                g.name,
                o.budget,
                first + 1,
                split.parts.len(),
                if parts == 1 { "" } else { "s" },
            );
        }
        let stats = SchedulerStats {
            wall_ms: start.elapsed().as_secs_f64() * 1e3,
            states,
            transitions,
            cost_queries: costs.queries,
            extra,
        };
        tracing::debug!(
            model = %g.name,
            variant = o.variant.name(),
            parts = split.parts.len(),
            states,
            transitions,
            objective,
            "IOS schedule"
        );
        Ok(IosSolution {
            stages,
            objective_ms: objective,
            stats,
        })
    }
}

/// Solve one part by the DP, or by [`ready_waves`] once the budget is spent (`None`: the DP
/// found no schedule).
fn solve_part<B: Bits>(
    g: &Graph,
    cost: &dyn CostModel,
    part: &[NodeId],
    lim: Limits,
    costs: &mut StageCosts,
    local: &mut [u32],
    meter: &mut Meter,
) -> Option<PartResult> {
    let pg = PartGraph::<B>::new(g, part, local);
    if !meter.exhausted() {
        let res = Dp::new(g, cost, &pg, lim, costs, meter).run();
        if !meter.exhausted() {
            return res;
        }
    }
    let mut objective = 0.0;
    let stages: Vec<Stage> = ready_waves(&pg, lim.s)
        .into_iter()
        .map(|groups| {
            objective += costs.concurrent(g, cost, &groups);
            Stage {
                strategy: StageStrategy::Concurrent,
                groups,
            }
        })
        .collect();
    Some(PartResult {
        states: stages.len() as u64,
        stages,
        objective,
        transitions: 0,
        fallback: true,
    })
}

impl Scheduler for Ios {
    fn name(&self) -> &str {
        self.opts.variant.name()
    }

    fn schedule(
        &self,
        g: &Graph,
        platform: &Platform,
        cost: &dyn CostModel,
    ) -> Result<(Schedule, SchedulerStats), ScheduleError> {
        self.schedule_with_progress(g, platform, cost, &NoProgress)
    }

    fn schedule_with_progress(
        &self,
        g: &Graph,
        platform: &Platform,
        cost: &dyn CostModel,
        progress: &dyn Progress,
    ) -> Result<(Schedule, SchedulerStats), ScheduleError> {
        let sol = self.solve_with_progress(g, platform, cost, progress)?;
        let plan = StagePlan {
            gpus: vec![sol.stages],
        };
        Ok((Schedule::Stages(plan), sol.stats))
    }
}
