//! Alg. 1 of HIOS, lines 1-16: inter-GPU operator mapping by iterative longest valid paths.

use crate::dense::Dense;
use crate::eval::list_schedule;

/// What the mapping found, for statistics.
#[derive(Clone, Debug, Default)]
pub(crate) struct LpOutcome {
    /// GPU of each operator (dense index).
    pub gpu_of: Vec<usize>,
    /// Paths mapped.
    pub paths: u64,
    /// Candidate mappings evaluated (list schedules run).
    pub candidates: u64,
}

const UNMAPPED: usize = usize::MAX;

/// The longest valid path among the unmapped operators (Alg. 1, line 5), as dense indices from
/// first to last; never empty while some operator is unmapped.
///
/// A path of `G'` is a chain `x1 -> ... -> xk` of unmapped operators, plus, where they exist,
/// the edge into `x1` from a mapped operator and the edge out of `xk` to a mapped operator
/// (edges stay in `G'` while one end is unmapped; the paper's example counts them). Its length
/// counts operator times, the transfer times of its inner edges and of those two boundary
/// edges (the heaviest one at each end): the upper bound of the path's latency when adjacent
/// operators sit on different GPUs. With `rule` on, the intermediate operators `x2 .. x(k-1)`
/// must have no edge from or to a mapped operator; with it off, every path is valid (what the
/// reference code does, its check being dead code).
///
/// Dynamic programming in topological order: `F(v)` is the heaviest valid prefix ending at
/// `v`; a prefix may be extended past `u` only if `u` is clean (no mapped neighbour) or `u` is
/// its first operator. `O(V + E)`.
pub(crate) fn longest_valid_path(d: &Dense, gpu_of: &[usize], rule: bool) -> Vec<usize> {
    let n = d.len();
    let mut f = vec![f64::NEG_INFINITY; n];
    let mut start_w = vec![0.0f64; n];
    let mut clean = vec![true; n];
    let mut parent = vec![UNMAPPED; n];
    let mut best: Option<(f64, usize)> = None;
    let mapped = |x: usize| gpu_of.get(x).is_some_and(|&gx| gx != UNMAPPED);
    // Dense indices are a topological order: producers come first.
    for v in 0..n {
        if mapped(v) {
            continue;
        }
        let mut in_w = 0.0f64;
        let mut out_w = 0.0f64;
        let mut touches = false;
        for &(u, tr) in &d.preds[v] {
            if mapped(u) {
                in_w = in_w.max(tr);
                touches = true;
            }
        }
        for &(w, tr) in &d.succs[v] {
            if mapped(w) {
                out_w = out_w.max(tr);
                touches = true;
            }
        }
        clean[v] = !(rule && touches);
        start_w[v] = in_w + d.time[v];
        let mut fv = start_w[v];
        let mut pv = UNMAPPED;
        for &(u, tr) in &d.preds[v] {
            if mapped(u) {
                continue;
            }
            // The heaviest prefix ending at u that may continue past u.
            let eu = if clean[u] { f[u] } else { start_w[u] };
            let cand = eu + tr + d.time[v];
            if cand > fv {
                fv = cand;
                pv = u;
            }
        }
        f[v] = fv;
        parent[v] = pv;
        let total = fv + out_w;
        if best.is_none_or(|(b, _)| total > b) {
            best = Some((total, v));
        }
    }
    let Some((_, last)) = best else {
        return Vec::new();
    };
    let mut path = vec![last];
    let mut cur = last;
    // Each step moves to a producer (a smaller dense index), so at most n - 1 steps.
    for _ in 0..n {
        let u = parent[cur];
        if u == UNMAPPED {
            break;
        }
        path.push(u);
        if !clean[u] {
            break; // u began this prefix
        }
        cur = u;
    }
    path.reverse();
    path
}

/// Alg. 1, lines 1-16: map the longest valid path of the unmapped operators to the GPU where
/// the list schedule of all mapped operators (priority order, earliest start) ends first;
/// repeat until every operator is mapped.
pub(crate) fn map_paths(d: &Dense, gpus: usize, rule: bool) -> LpOutcome {
    let n = d.len();
    let mut out = LpOutcome {
        gpu_of: vec![UNMAPPED; n],
        ..LpOutcome::default()
    };
    let mut unmapped = n;
    let mut fin = Vec::with_capacity(n);
    let mut trial = vec![UNMAPPED; n];
    let mut used = vec![false; gpus];
    // Every round maps at least one operator (the path is never empty while one is
    // unmapped), so there are at most n rounds.
    for _ in 0..n {
        if unmapped == 0 {
            break;
        }
        let path = longest_valid_path(d, &out.gpu_of, rule);
        if path.is_empty() {
            break; // cannot happen while an operator is unmapped; the caller checks coverage
        }
        out.paths += 1;
        // Lines 7-15: try each GPU; all empty GPUs are alike (homogeneous GPUs), so only the
        // first empty one is tried, which is the one strict `<` would keep anyway.
        let mut best: Option<(f64, usize)> = None;
        let mut tried_empty = false;
        for (gi, &busy) in used.iter().enumerate() {
            if !busy {
                if tried_empty {
                    continue;
                }
                tried_empty = true;
            }
            trial.clone_from(&out.gpu_of);
            for &v in &path {
                trial[v] = gi;
            }
            let l = list_schedule(d, &trial, gpus, &mut fin);
            out.candidates += 1;
            if best.is_none_or(|(b, _)| l < b) {
                best = Some((l, gi));
            }
        }
        let Some((_, gi)) = best else { break };
        used[gi] = true;
        for &v in &path {
            if out.gpu_of[v] == UNMAPPED {
                out.gpu_of[v] = gi;
                unmapped -= 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dense graph by hand: times and edges (src, dst, transfer), ids already topological.
    fn dense(time: &[f64], edges: &[(usize, usize, f64)]) -> Dense {
        let n = time.len();
        let mut preds = vec![Vec::new(); n];
        let mut succs = vec![Vec::new(); n];
        for &(u, v, tr) in edges {
            preds[v].push((u, tr));
            succs[u].push((v, tr));
        }
        let mut prio = vec![0.0f64; n];
        for v in (0..n).rev() {
            let tail = succs[v]
                .iter()
                .map(|&(s, tr): &(usize, f64)| tr + prio[s])
                .fold(0.0f64, f64::max);
            prio[v] = time[v] + tail;
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| prio[b].total_cmp(&prio[a]).then(a.cmp(&b)));
        Dense {
            ids: (0..n as u32).map(opsched_graph::NodeId).collect(),
            time: time.to_vec(),
            single: time.to_vec(),
            preds,
            succs,
            order,
            cost_queries: 0,
        }
    }

    /// The situation of the paper's Fig. 4: after the first path 0 -> 1 -> 3 -> 5 -> 7 is
    /// mapped, the path 2 -> 4 -> 6 is longer than 2 -> 4, but its intermediate vertex 4
    /// feeds the mapped 5, so the valid path is 2 -> 4 (with the edge 4 -> 5 counted).
    #[test]
    fn intermediate_vertices_must_not_touch_mapped_ones() {
        let d = dense(
            &[2.0, 3.0, 2.0, 3.0, 2.0, 3.0, 1.5, 2.0],
            &[
                (0, 1, 1.0),
                (0, 2, 1.0),
                (1, 3, 1.0),
                (2, 4, 1.0),
                (3, 5, 1.0),
                (4, 5, 1.0),
                (4, 6, 1.0),
                (5, 7, 1.0),
                (6, 7, 1.0),
            ],
        );
        let mut gpu_of = vec![UNMAPPED; 8];
        let first = longest_valid_path(&d, &gpu_of, true);
        assert_eq!(first, vec![0, 1, 3, 5, 7]);
        for v in first {
            gpu_of[v] = 0;
        }
        assert_eq!(longest_valid_path(&d, &gpu_of, true), vec![2, 4]);
        assert_eq!(longest_valid_path(&d, &gpu_of, false), vec![2, 4, 6]);
        for v in [2, 4] {
            gpu_of[v] = 1;
        }
        assert_eq!(longest_valid_path(&d, &gpu_of, true), vec![6]);
        let out = map_paths(&d, 2, true);
        assert_eq!(out.paths, 3);
        assert!(out.gpu_of.iter().all(|&g| g < 2));
    }

    #[test]
    fn a_path_is_never_empty_while_an_operator_is_unmapped() {
        let d = dense(&[1.0, 0.0, 0.0], &[(0, 1, 0.0), (1, 2, 0.0)]);
        let mut gpu_of = vec![UNMAPPED; 3];
        gpu_of[1] = 0;
        for rule in [true, false] {
            let p = longest_valid_path(&d, &gpu_of, rule);
            assert!(!p.is_empty());
            assert!(p.iter().all(|&v| gpu_of[v] == UNMAPPED));
        }
        let out = map_paths(&d, 3, true);
        assert!(out.gpu_of.iter().all(|&g| g < 3));
    }
}
