//! Alg. 2 of HIOS: intra-GPU inter-operator parallelization with a sliding window.

use opsched_cost::CostModel;
use opsched_graph::{Graph, NodeId};

use crate::dense::Dense;
use crate::eval::{Evaluator, StageRec};

/// What the window pass did, for statistics.
#[derive(Clone, Debug, Default)]
pub(crate) struct WindowOutcome {
    /// Candidate groupings evaluated.
    pub candidates: u64,
    /// Groupings kept.
    pub accepted: u64,
    /// Stage-time questions asked of the cost model.
    pub cost_queries: u64,
}

/// Alg. 2 on `plan` (per GPU, stages in order; on entry one operator per stage), whose
/// makespan is `latency`. Operators are visited in priority order (line 2-3); for an operator
/// still alone in its stage, windows of it and the next `p` operators on its GPU,
/// `1 <= p <= window - 1` and `p + 1 <= streams` (lines 5-6), are candidates when those
/// operators are alone in their stages and mutually independent (line 7: no edge among
/// them) and grouping them into one stage, each operator its own group, leaves the stage graph
/// acyclic across all GPUs (lines 9-10, answered by the evaluator). The candidate with the
/// lowest latency is kept if it does not exceed the current latency (lines 12-15, with ties
/// accepted: a change is kept unless the latency grows). Returns the final latency, never above
/// `latency`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn parallelize(
    g: &Graph,
    cost: &dyn CostModel,
    d: &Dense,
    plan: &mut [Vec<StageRec>],
    latency: f64,
    window: usize,
    streams: usize,
    ev: &mut Evaluator,
) -> (f64, WindowOutcome) {
    let mut out = WindowOutcome::default();
    let mut latency = latency;
    let max_p = window.min(streams).saturating_sub(1);
    if max_p == 0 {
        return (latency, out);
    }
    let n = d.len();
    // Where each operator is: (gpu, stage index); refreshed after every accepted change.
    let mut loc = vec![(usize::MAX, usize::MAX); n];
    let locate = |plan: &[Vec<StageRec>], loc: &mut Vec<(usize, usize)>| {
        for (gi, list) in plan.iter().enumerate() {
            for (k, st) in list.iter().enumerate() {
                for &v in st.groups.iter().flatten() {
                    if let Some(l) = loc.get_mut(v) {
                        *l = (gi, k);
                    }
                }
            }
        }
    };
    locate(plan, &mut loc);
    let mut in_window = vec![false; n];
    let mut ids: Vec<Vec<NodeId>> = Vec::new();
    for &v in &d.order {
        let (gi, k) = loc[v];
        let Some(list) = plan.get(gi) else { continue };
        if list.get(k).is_none_or(|st| st.op_count() != 1) {
            continue; // already grouped (the paper's example skips such operators)
        }
        let mut best: Option<(f64, usize, StageRec)> = None;
        let mut members: Vec<usize> = vec![v];
        for p in 1..=max_p {
            let Some(next) = list.get(k + p) else { break };
            if next.op_count() != 1 {
                break;
            }
            let Some(&x) = next.groups.iter().flatten().next() else {
                break;
            };
            members.push(x);
            // Line 7: mutually independent (a path through other operators shows up as a
            // cycle in the stage graph below).
            for &m in &members {
                in_window[m] = true;
            }
            let dependent = members
                .iter()
                .any(|&m| d.succs[m].iter().any(|&(s, _)| in_window[s]));
            for &m in &members {
                in_window[m] = false;
            }
            if dependent {
                break;
            }
            // Line 9: group the window into one stage, each operator its own group.
            ids.clear();
            ids.extend(members.iter().map(|&m| vec![d.ids[m]]));
            let time = cost.stage_time(g, &ids);
            out.cost_queries += 1;
            if !(time.is_finite() && time >= 0.0) {
                continue;
            }
            let stage = StageRec {
                groups: members.iter().map(|&m| vec![m]).collect(),
                time,
            };
            let mut cand: Vec<StageRec> = Vec::with_capacity(list.len() - p);
            cand.extend_from_slice(&list[..k]);
            cand.push(stage.clone());
            cand.extend_from_slice(&list[k + p + 1..]);
            let views: Vec<&[StageRec]> = plan
                .iter()
                .enumerate()
                .map(|(i, l)| if i == gi { &cand[..] } else { &l[..] })
                .collect();
            out.candidates += 1;
            // Lines 10-13: `None` is a cycle in the stage graph.
            let Some(l) = ev.makespan(d, &views) else {
                continue;
            };
            if best.as_ref().is_none_or(|(b, _, _)| l < *b) {
                best = Some((l, p, stage));
            }
        }
        // Lines 14-15.
        if let Some((l, p, stage)) = best {
            if l <= latency {
                if let Some(list) = plan.get_mut(gi) {
                    list.splice(k..=k + p, std::iter::once(stage));
                }
                latency = l;
                out.accepted += 1;
                locate(plan, &mut loc);
            }
        }
    }
    (latency, out)
}
