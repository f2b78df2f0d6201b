//! A dense, operator-only view of a [`Graph`] with every cost the algorithms need, asked of the
//! cost model once.
//!
//! Operators get dense indices `0..n` in the order of [`Graph::ops`], which is topological, so
//! a predecessor always has a smaller dense index than its consumer. Graph inputs are not
//! operators: their edges are dropped (their tensors are present on every GPU from the start,
//! as the lowering assumes).

use opsched_cost::CostModel;
use opsched_graph::{Graph, NodeId};
use opsched_schedule::ScheduleError;

/// The operators of a graph with their costs.
#[derive(Clone, Debug)]
pub(crate) struct Dense {
    /// Dense index -> node id.
    pub ids: Vec<NodeId>,
    /// `cost.op_time` per operator.
    pub time: Vec<f64>,
    /// `cost.stage_time` of a stage holding just this operator.
    pub single: Vec<f64>,
    /// Producers that are operators, with the transfer time of the edge.
    pub preds: Vec<Vec<(usize, f64)>>,
    /// Consumers, with the transfer time of the edge.
    pub succs: Vec<Vec<(usize, f64)>>,
    /// Operators by descending priority indicator (the longest path from the operator to an
    /// exit, counting operator times and transfer times, HIOS Sec. IV-A) (ties: topological position); a topological order.
    pub order: Vec<usize>,
    /// Questions asked of the cost model while building.
    pub cost_queries: u64,
}

fn check_time(g: &Graph, what: &str, id: NodeId, t: f64) -> Result<f64, ScheduleError> {
    if t.is_finite() && t >= 0.0 {
        Ok(t)
    } else {
        Err(ScheduleError::Config(format!(
            "the cost model gives {what} {t} for operator '{}'; HIOS needs finite, non-negative \
             times",
            g.node(id).name
        )))
    }
}

impl Dense {
    pub fn new(g: &Graph, cost: &dyn CostModel) -> Result<Dense, ScheduleError> {
        let ids: Vec<NodeId> = g.ops().collect();
        let n = ids.len();
        let mut index = vec![usize::MAX; g.len()];
        for (i, id) in ids.iter().enumerate() {
            if let Some(slot) = index.get_mut(id.index()) {
                *slot = i;
            }
        }
        let mut queries = 0u64;
        let mut time = Vec::with_capacity(n);
        let mut single = Vec::with_capacity(n);
        for &id in &ids {
            time.push(check_time(g, "op time", id, cost.op_time(g, id))?);
            single.push(check_time(
                g,
                "stage time",
                id,
                cost.stage_time(g, &[vec![id]]),
            )?);
            queries += 2;
        }
        let mut preds: Vec<Vec<(usize, f64)>> = vec![Vec::new(); n];
        let mut succs: Vec<Vec<(usize, f64)>> = vec![Vec::new(); n];
        for (v, &vid) in ids.iter().enumerate() {
            let mut ps: Vec<NodeId> = g.preds(vid).collect();
            ps.sort_unstable();
            ps.dedup();
            for uid in ps {
                let u = index.get(uid.index()).copied().unwrap_or(usize::MAX);
                if u == usize::MAX {
                    continue; // a graph input
                }
                let tr = check_time(g, "transfer time", uid, cost.transfer_time(g, uid, vid))?;
                queries += 1;
                if let Some(p) = preds.get_mut(v) {
                    p.push((u, tr));
                }
                if let Some(s) = succs.get_mut(u) {
                    s.push((v, tr));
                }
            }
        }
        // Priorities, consumers first (reverse topological order).
        let mut prio = vec![0.0f64; n];
        for v in (0..n).rev() {
            let tail = succs[v]
                .iter()
                .map(|&(s, tr)| tr + prio.get(s).copied().unwrap_or(0.0))
                .fold(0.0f64, f64::max);
            prio[v] = time[v] + tail;
        }
        // Descending priority; ties by topological position. With non-negative weights a
        // producer's priority is at least its consumer's (in floating point too: adding a
        // non-negative number never decreases a sum), so this order is topological.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| prio[b].total_cmp(&prio[a]).then(a.cmp(&b)));
        Ok(Dense {
            ids,
            time,
            single,
            preds,
            succs,
            order,
            cost_queries: queries,
        })
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }
}
