//! The internal evaluator: the makespan of a stage plan, fast enough to be called for every
//! candidate of Alg. 1, 2 and 3.
//!
//! ## Semantics
//! Stages are walked in a topological order of the **stage graph** (nodes: all stages of all
//! GPUs; edges: each stage to the next one on its GPU, and the stage of a producer to the stage
//! of each consumer). If the stage graph has a cycle (or a dependency inside one stage), the
//! plan cannot run and the evaluator answers `None`.
//!
//! A stage starts at the latest of the end of the previous stage on its GPU and, for every
//! operator of the stage and each of its producers, the producer's finish time, plus the
//! transfer time when the producer ran on another GPU. It lasts `T = cost.stage_time(groups)`.
//!
//! Finish times of the operators inside a stage follow the simulator of `opsched-schedule`
//! exactly: with `L` the longest group's sum of operator times and `scale = T / L`, each group
//! runs its operators back to back for `scale * op_time` each, and the longest group ends at
//! `T`. A producer's outgoing transfer starts when the producer finishes. (The HIOS paper
//! lets transfers start at the end of the producer's stage; the simulator sends as soon as the
//! operator is done. Following the simulator makes this evaluator's makespan equal to the
//! simulated makespan, so Alg. 2 improves exactly what is reported. For single-operator stages,
//! all that Alg. 1 and Alg. 3 build, both readings coincide.)
//!
//! Cost: `O(stages + operators + edges)` per call, no cost-model query (stage times are cached
//! in [`StageRec`]).

use crate::dense::Dense;

/// One stage: groups of dense operator indices, with the stage time cached.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StageRec {
    pub groups: Vec<Vec<usize>>,
    /// `cost.stage_time` of the groups.
    pub time: f64,
}

impl StageRec {
    pub fn single(d: &Dense, op: usize) -> StageRec {
        StageRec {
            groups: vec![vec![op]],
            time: d.single.get(op).copied().unwrap_or(0.0),
        }
    }
    pub fn op_count(&self) -> usize {
        self.groups.iter().map(Vec::len).sum()
    }
}

const NONE: u32 = u32::MAX;

/// Scratch buffers, reused across calls.
#[derive(Debug, Default)]
pub(crate) struct Evaluator {
    stage_of: Vec<u32>,
    gpu_of_stage: Vec<u32>,
    next_on_gpu: Vec<u32>,
    indeg: Vec<u32>,
    fin: Vec<f64>,
    stage_start: Vec<f64>,
    stages: Vec<(u32, u32)>,
    queue: Vec<u32>,
    /// Calls answered.
    pub calls: u64,
}

impl Evaluator {
    /// Makespan of `gpus` (per GPU, its stages in order), or `None` if the stage graph has a
    /// cycle or an operator appears twice. Operators absent from the plan are ignored (their
    /// edges too), so partial plans can be evaluated.
    pub fn makespan(&mut self, d: &Dense, gpus: &[&[StageRec]]) -> Option<f64> {
        self.calls += 1;
        let n = d.len();
        self.stage_of.clear();
        self.stage_of.resize(n, NONE);
        self.fin.clear();
        self.fin.resize(n, 0.0);
        self.stages.clear();
        self.gpu_of_stage.clear();
        self.next_on_gpu.clear();
        for (gi, list) in gpus.iter().enumerate() {
            for (k, st) in list.iter().enumerate() {
                let s = u32::try_from(self.stages.len()).ok()?;
                self.stages.push((gi as u32, k as u32));
                self.gpu_of_stage.push(gi as u32);
                self.next_on_gpu
                    .push(if k + 1 < list.len() { s + 1 } else { NONE });
                for grp in &st.groups {
                    for &op in grp {
                        let slot = self.stage_of.get_mut(op)?;
                        if *slot != NONE {
                            return None; // twice
                        }
                        *slot = s;
                    }
                }
            }
        }
        let ns = self.stages.len();
        self.indeg.clear();
        self.indeg.resize(ns, 0);
        self.stage_start.clear();
        self.stage_start.resize(ns, 0.0);
        for s in 0..ns {
            if let Some(&nx) = self.next_on_gpu.get(s) {
                if nx != NONE {
                    *self.indeg.get_mut(nx as usize)? += 1;
                }
            }
        }
        for v in 0..n {
            let sv = self.stage_of[v];
            if sv == NONE {
                continue;
            }
            for &(u, _) in &d.preds[v] {
                let su = *self.stage_of.get(u)?;
                if su == NONE {
                    continue;
                }
                if su == sv {
                    return None; // a dependency inside a stage
                }
                *self.indeg.get_mut(sv as usize)? += 1;
            }
        }
        self.queue.clear();
        self.queue
            .extend((0..ns as u32).filter(|&s| self.indeg[s as usize] == 0));
        let mut gpu_end = vec![0.0f64; gpus.len()];
        let mut makespan = 0.0f64;
        let mut head = 0usize;
        // Each stage enters the queue once (when its in-degree reaches zero), so this loop
        // runs at most `ns` times.
        while let Some(&s) = self.queue.get(head) {
            head += 1;
            let s = s as usize;
            let (gi, k) = self.stages[s];
            let gi = gi as usize;
            let st = gpus.get(gi)?.get(k as usize)?;
            let mut start = gpu_end[gi];
            for grp in &st.groups {
                for &v in grp {
                    for &(u, tr) in &d.preds[v] {
                        let su = self.stage_of[u];
                        if su == NONE {
                            continue;
                        }
                        let arrive = if self.gpu_of_stage[su as usize] as usize == gi {
                            self.fin[u]
                        } else {
                            self.fin[u] + tr
                        };
                        start = start.max(arrive);
                    }
                }
            }
            // The simulator's law for operator ends inside a stage.
            let total = st.time;
            let longest = st
                .groups
                .iter()
                .map(|grp| grp.iter().map(|&v| d.time[v]).sum::<f64>())
                .fold(0.0f64, f64::max);
            let scale = if longest > 0.0 { total / longest } else { 1.0 };
            for grp in &st.groups {
                let mut prefix = 0.0f64;
                let mut now = start;
                for &v in grp {
                    prefix += d.time[v];
                    let end = if prefix >= longest {
                        start + total
                    } else {
                        start + scale * prefix
                    };
                    now = end.max(now);
                    self.fin[v] = now;
                }
            }
            let end = start + total;
            self.stage_start[s] = start;
            gpu_end[gi] = end;
            makespan = makespan.max(end);
            let nx = self.next_on_gpu[s];
            if nx != NONE {
                self.release(nx)?;
            }
            for grp in &st.groups {
                for &v in grp {
                    for &(w, _) in &d.succs[v] {
                        let sw = self.stage_of[w];
                        if sw != NONE && sw as usize != s {
                            self.release(sw)?;
                        }
                    }
                }
            }
        }
        if head < ns {
            return None; // a cycle among stages
        }
        Some(makespan)
    }

    fn release(&mut self, s: u32) -> Option<()> {
        let d = self.indeg.get_mut(s as usize)?;
        *d = d.checked_sub(1)?;
        if *d == 0 {
            self.queue.push(s);
        }
        Some(())
    }

    /// Finish time of each operator in the last evaluated plan (0 for absent operators).
    #[cfg(test)]
    pub fn finish(&self) -> &[f64] {
        &self.fin
    }
}

/// Earliest-start list scheduling of single-operator stages (Alg. 1, lines 10-13): the
/// operators with a GPU in `gpu_of` (`usize::MAX`: not mapped) are taken in priority order
/// (a topological order), each appended to its GPU at the earliest time its GPU is free and its
/// mapped producers' outputs have arrived. Returns the latest finish time. Equal to
/// [`Evaluator::makespan`] of the plan with one stage per operator in priority order.
pub(crate) fn list_schedule(d: &Dense, gpu_of: &[usize], gpus: usize, fin: &mut Vec<f64>) -> f64 {
    fin.clear();
    fin.resize(d.len(), 0.0);
    let mut free = vec![0.0f64; gpus];
    let mut makespan = 0.0f64;
    for &v in &d.order {
        let g = gpu_of.get(v).copied().unwrap_or(usize::MAX);
        let Some(&gfree) = free.get(g) else { continue };
        let mut start = gfree;
        for &(u, tr) in &d.preds[v] {
            let gu = gpu_of.get(u).copied().unwrap_or(usize::MAX);
            if gu == usize::MAX {
                continue;
            }
            let arrive = if gu == g { fin[u] } else { fin[u] + tr };
            start = start.max(arrive);
        }
        let end = start + d.single[v];
        fin[v] = end;
        if let Some(f) = free.get_mut(g) {
            *f = end;
        }
        makespan = makespan.max(end);
    }
    makespan
}

/// One single-operator stage per mapped operator, per GPU in priority order.
pub(crate) fn singleton_plan(d: &Dense, gpu_of: &[usize], gpus: usize) -> Vec<Vec<StageRec>> {
    let mut plan: Vec<Vec<StageRec>> = vec![Vec::new(); gpus];
    for &v in &d.order {
        if let Some(list) = gpu_of.get(v).and_then(|&g| plan.get_mut(g)) {
            list.push(StageRec::single(d, v));
        }
    }
    plan
}
