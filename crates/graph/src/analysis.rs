//! Structural summaries of a graph: counts, FLOPs, critical-path depth and maximum width.

use serde::Serialize;

use crate::graph::{Graph, NodeId};
use crate::op::Op;

/// What `opsched inspect` shows about a graph. A cost-annotated DAG has no tensors: its
/// `flops`, `params`, bytes, `dtype` and `input_shapes` mean nothing, and `times` holds what
/// it has instead.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub name: String,
    pub dtype: String,
    /// Operators (graph inputs excluded).
    pub ops: usize,
    /// Producer -> consumer edges between operators.
    pub edges: usize,
    /// Shapes of the graph inputs.
    pub input_shapes: Vec<Vec<usize>>,
    pub flops: u64,
    pub params: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Operators on the longest dependency chain.
    pub depth: usize,
    /// Largest set of mutually independent operators (maximum antichain).
    pub width: usize,
    pub blocks: usize,
    /// Operator count per type name.
    pub op_types: std::collections::BTreeMap<String, usize>,
    /// The given times of a cost-annotated DAG ([`is_cost_annotated`]); `None` for models.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub times: Option<DagTimes>,
}

/// The given times of a cost-annotated DAG.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DagTimes {
    /// Sum of the operators' `time_ms`.
    pub op_time_ms: f64,
    /// Sum of the edges' `transfer_ms`.
    pub transfer_ms: f64,
    /// Mean of the operators' `util`.
    pub mean_util: f64,
}

/// Whether `g` is a cost-annotated DAG: it has operators and every one is known only by a
/// time ([`Op::Abstract`]).
pub fn is_cost_annotated(g: &Graph) -> bool {
    let mut ops = g.ops().peekable();
    ops.peek().is_some() && ops.all(|o| matches!(g.node(o).op, Op::Abstract { .. }))
}

fn dag_times(g: &Graph) -> Option<DagTimes> {
    if !is_cost_annotated(g) {
        return None;
    }
    let (mut op_time_ms, mut util) = (0.0, 0.0);
    for o in g.ops() {
        if let Op::Abstract { time_ms, util: u } = g.node(o).op {
            op_time_ms += time_ms;
            util += u;
        }
    }
    Some(DagTimes {
        op_time_ms,
        transfer_ms: g.edges().filter_map(|(_, _, e)| e.transfer_ms).sum(),
        mean_util: util / g.op_count().max(1) as f64,
    })
}

/// Summarize a graph.
pub fn summarize(g: &Graph) -> Summary {
    let mut s = Summary {
        name: g.name.clone(),
        dtype: g.dtype.to_string(),
        ops: g.op_count(),
        edges: g.edge_count(),
        input_shapes: g.inputs().map(|n| g.node(n).shape.clone()).collect(),
        flops: 0,
        params: 0,
        bytes_read: 0,
        bytes_written: 0,
        depth: depth(g),
        width: width(g),
        blocks: g.blocks().len(),
        op_types: Default::default(),
        times: dag_times(g),
    };
    for id in g.ops() {
        let st = g.stats(id);
        s.flops += st.flops;
        s.params += st.params;
        s.bytes_read += st.bytes_read;
        s.bytes_written += st.bytes_written;
        *s.op_types
            .entry(g.node(id).op.type_name().to_string())
            .or_default() += 1;
    }
    s
}

/// Number of operators on the longest path (graph inputs do not count).
pub fn depth(g: &Graph) -> usize {
    let mut level = vec![0usize; g.len()];
    let mut best = 0;
    for &n in g.topo_order() {
        let own = usize::from(!g.node(n).op.is_input());
        let l = g.preds(n).map(|p| level[p.index()]).max().unwrap_or(0) + own;
        level[n.index()] = l;
        best = best.max(l);
    }
    best
}

/// Reachability among operators as bitsets: `reach[i]` has bit `j` when op `j` is a strict
/// descendant of op `i`. Indices are positions in `ops`.
pub fn reachability(g: &Graph, ops: &[NodeId]) -> Vec<Vec<u64>> {
    let mut pos = vec![usize::MAX; g.len()];
    for (i, &n) in ops.iter().enumerate() {
        pos[n.index()] = i;
    }
    let words = ops.len().div_ceil(64);
    let mut reach = vec![vec![0u64; words]; g.len()];
    for &n in g.topo_order().iter().rev() {
        let mut acc = vec![0u64; words];
        for s in g.succs(n) {
            let p = pos[s.index()];
            if p != usize::MAX {
                acc[p / 64] |= 1 << (p % 64);
            }
            for (a, b) in acc.iter_mut().zip(&reach[s.index()]) {
                *a |= b;
            }
        }
        reach[n.index()] = acc;
    }
    ops.iter()
        .map(|n| std::mem::take(&mut reach[n.index()]))
        .collect()
}

/// Size of the largest antichain of operators: the most operators that could ever run at the
/// same time.
///
/// By Dilworth's theorem this is the fewest chains covering the operators, i.e. the fewest paths
/// of the DAG covering every operator when paths may share operators: a minimum flow with a
/// lower bound of 1 through every operator. We start from a feasible flow (a greedy path
/// partition in topological order) and cancel as much of it as possible with a maximum flow from
/// the sink back to the source (Dinic) in the residual network. Time and memory are linear in
/// operators and edges per augmentation phase; nothing of the transitive closure is built.
pub fn width(g: &Graph) -> usize {
    let ops: Vec<NodeId> = g.ops().collect();
    let n = ops.len();
    if n == 0 {
        return 0;
    }
    let mut pos = vec![usize::MAX; g.len()];
    for (i, &o) in ops.iter().enumerate() {
        pos[o.index()] = i;
    }
    // Greedy path partition: each operator continues the path of its first predecessor whose
    // path is still open, else starts a path.
    let mut open = vec![true; n];
    let mut from = vec![usize::MAX; n];
    for (i, &o) in ops.iter().enumerate() {
        if let Some(u) = g
            .preds(o)
            .map(|p| pos[p.index()])
            .filter(|&u| u != usize::MAX && open[u])
            .min()
        {
            open[u] = false;
            from[i] = u;
        }
    }
    let paths = from.iter().filter(|&&u| u == usize::MAX).count();
    // Residual network: operator i is in(2i) -> out(2i + 1); s = 2n, t = 2n + 1. Every arc of the
    // flow network has infinite capacity; cancelling flow is the reverse arc, whose capacity is
    // the flow above the lower bound (0 on in -> out: every operator carries exactly 1).
    let (s, t) = (2 * n, 2 * n + 1);
    let mut net = Residual::new(2 * n + 2);
    for i in 0..n {
        net.arc(2 * i, 2 * i + 1, 0);
        match from[i] {
            usize::MAX => net.arc(s, 2 * i, 1),
            u => net.arc(2 * u + 1, 2 * i, 1),
        }
        net.arc(2 * i + 1, t, u64::from(open[i]));
        for p in g.preds(ops[i]) {
            let u = pos[p.index()];
            if u != usize::MAX && u != from[i] {
                net.arc(2 * u + 1, 2 * i, 0);
            }
        }
    }
    paths - net.max_flow(t, s)
}

/// A flow network for [`width`]: arcs of infinite capacity, each with its reverse arc holding
/// the flow that can be cancelled; Dinic's maximum flow with iterative searches (no recursion:
/// chains of 10^5 operators are common).
struct Residual {
    head: Vec<u32>,
    next: Vec<u32>,
    to: Vec<u32>,
    cap: Vec<u64>,
}

const NONE: u32 = u32::MAX;
const INF: u64 = u64::MAX / 4;

impl Residual {
    fn new(nodes: usize) -> Self {
        Residual {
            head: vec![NONE; nodes],
            next: Vec::new(),
            to: Vec::new(),
            cap: Vec::new(),
        }
    }

    fn push_arc(&mut self, a: usize, b: usize, cap: u64) {
        let id = self.to.len() as u32;
        self.to.push(b as u32);
        self.cap.push(cap);
        self.next.push(self.head[a]);
        self.head[a] = id;
    }

    /// An arc `a -> b` of infinite capacity carrying `flow`: arc `2k` is `a -> b`, `2k + 1` its
    /// reverse `b -> a` with capacity `flow`.
    fn arc(&mut self, a: usize, b: usize, flow: u64) {
        self.push_arc(a, b, INF);
        self.push_arc(b, a, flow);
    }

    fn max_flow(&mut self, s: usize, t: usize) -> usize {
        let nodes = self.head.len();
        let mut level = vec![u32::MAX; nodes];
        let mut it = vec![NONE; nodes];
        let mut queue = Vec::with_capacity(nodes);
        let mut total = 0u64;
        loop {
            level.iter_mut().for_each(|l| *l = u32::MAX);
            level[s] = 0;
            queue.clear();
            queue.push(s);
            let mut qi = 0;
            while qi < queue.len() {
                let u = queue[qi];
                qi += 1;
                let mut e = self.head[u];
                while e != NONE {
                    let v = self.to[e as usize] as usize;
                    if self.cap[e as usize] > 0 && level[v] == u32::MAX {
                        level[v] = level[u] + 1;
                        queue.push(v);
                    }
                    e = self.next[e as usize];
                }
            }
            if level[t] == u32::MAX {
                return usize::try_from(total).unwrap_or(usize::MAX);
            }
            it.copy_from_slice(&self.head);
            // Blocking flow: walk the level graph from s, one path at a time; a dead end is
            // cut off by advancing its parent's arc pointer.
            let mut path: Vec<u32> = Vec::new();
            let mut u = s;
            loop {
                if u == t {
                    let push = path
                        .iter()
                        .map(|&e| self.cap[e as usize])
                        .min()
                        .unwrap_or(0);
                    for &e in &path {
                        self.cap[e as usize] -= push;
                        self.cap[(e ^ 1) as usize] += push;
                    }
                    total += push;
                    path.clear();
                    u = s;
                    continue;
                }
                let mut e = it[u];
                while e != NONE {
                    let v = self.to[e as usize] as usize;
                    if self.cap[e as usize] > 0 && level[v] == level[u] + 1 {
                        break;
                    }
                    e = self.next[e as usize];
                }
                it[u] = e;
                if e != NONE {
                    path.push(e);
                    u = self.to[e as usize] as usize;
                    continue;
                }
                // Dead end: retreat and skip the arc that led here.
                level[u] = u32::MAX;
                match path.pop() {
                    None => break,
                    Some(back) => {
                        u = self.to[(back ^ 1) as usize] as usize;
                        it[u] = self.next[it[u] as usize];
                    }
                }
            }
        }
    }
}
