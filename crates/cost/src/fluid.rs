//! Stage time by fluid simulation: groups start together, each runs its operators in order, and
//! at every instant each running operator progresses at the rate the cost model gives for the
//! set of operators running then.

use opsched_graph::{Graph, NodeId};

use crate::CostModel;

/// Time of a concurrent stage under `m`'s [`CostModel::rates`].
///
/// Because every rate is at most 1, the result is at least the longest group's sum of
/// operator times.
pub fn stage_time<M: CostModel + ?Sized>(m: &M, g: &Graph, groups: &[Vec<NodeId>]) -> f64 {
    let mut pos = vec![0usize; groups.len()];
    let mut left: Vec<f64> = groups
        .iter()
        .map(|grp| grp.first().map_or(0.0, |&o| m.op_time(g, o)))
        .collect();
    let mut running = Vec::with_capacity(groups.len());
    let mut who = Vec::with_capacity(groups.len());
    let mut rates = Vec::with_capacity(groups.len());
    let mut now = 0.0;
    loop {
        running.clear();
        who.clear();
        for (i, grp) in groups.iter().enumerate() {
            if let Some(&op) = grp.get(pos[i]) {
                running.push(op);
                who.push(i);
            }
        }
        if running.is_empty() {
            return now;
        }
        m.rates(g, &running, &mut rates);
        // Advance to the first completion.
        let dt = who
            .iter()
            .zip(&rates)
            .map(|(&i, &r)| left[i] / r.max(f64::MIN_POSITIVE))
            .fold(f64::INFINITY, f64::min);
        now += dt;
        for (&i, &r) in who.iter().zip(&rates) {
            let r = r.max(f64::MIN_POSITIVE);
            // Operators finishing within rounding of the first are done too.
            if left[i] / r <= dt * (1.0 + 1e-12) {
                pos[i] += 1;
                left[i] = groups[i].get(pos[i]).map_or(0.0, |&o| m.op_time(g, o));
            } else {
                left[i] -= r * dt;
            }
        }
    }
}
