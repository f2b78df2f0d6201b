//! The IOS dynamic program over the operators of one part.
//!
//! State: the set `S` of the part's operators not yet scheduled, closed under predecessors
//! within the part. `cost(S) = min over endings E of S of cost(S - E) + stage_cost(E)`,
//! `cost({}) = 0`; the cost and the chosen ending are memoized per state, and the plan is
//! rebuilt by walking back from the full set. See the crate docs for how endings are
//! enumerated and how this matches IOS's `optimizer.py`.

use opsched_cost::signature::op_signature;
use opsched_cost::CostModel;
use opsched_graph::{Graph, NodeId, Op};
use opsched_schedule::{Stage, StageStrategy};

use crate::bits::Bits;
use crate::hash::FastMap;
use crate::Meter;

/// Which endings the DP may use.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Most operators per group (`r`).
    pub r: usize,
    /// Most groups per concurrent stage (`s`, already capped by the platform's streams).
    pub s: usize,
    /// Concurrent endings from the chain enumeration.
    pub parallel: bool,
    /// Merge endings (two or more mergeable convolutions).
    pub merge: bool,
    /// Single operators as endings without the chain enumeration (the merge-only variant).
    pub singles: bool,
}

/// Subsets of a merge class larger than this are only enumerated over its first members.
pub(crate) const MERGE_CLASS_CAP: usize = 12;

/// Stage costs shared by all parts, keyed by the stage's canonical signature, so identical
/// stages anywhere in the model are costed once.
///
/// The key is [`stage_signature`](opsched_cost::signature::stage_signature) in interned form: every operator's
/// [`op_signature`] is computed once and numbered, a group is the sequence of its operators'
/// numbers, and the groups are sorted. Two stages get the same key exactly when they get the
/// same `stage_signature` (same multiset of groups, each the same operator signatures in the
/// same order), without formatting strings per stage. Merge stages are keyed by a marker and the
/// sorted numbers of their operators.
#[derive(Default)]
pub(crate) struct StageCosts {
    /// Interned op signature per node index (`u32::MAX`: not computed yet).
    op_ids: Vec<u32>,
    interner: std::collections::HashMap<String, u32>,
    by_key: FastMap<Vec<u32>, f64>,
    key: Vec<u32>,
    flat: Vec<u32>,
    spans: Vec<(usize, usize)>,
    /// Distinct stages costed (cost-model questions).
    pub queries: u64,
    /// Stages found under the key of an identical stage costed before.
    pub hits: u64,
}

const SEP: u32 = u32::MAX;
const MERGE_MARK: u32 = u32::MAX - 1;

impl StageCosts {
    fn op_id(&mut self, g: &Graph, op: NodeId) -> u32 {
        if self.op_ids.len() != g.len() {
            self.op_ids = vec![u32::MAX; g.len()];
        }
        let id = self.op_ids[op.index()];
        if id != u32::MAX {
            return id;
        }
        let next = self.interner.len() as u32;
        let id = *self.interner.entry(op_signature(g, op)).or_insert(next);
        self.op_ids[op.index()] = id;
        id
    }

    /// Build `self.key` for `groups` (each a list of operators in run order).
    fn make_key<'g>(&mut self, g: &Graph, merge: bool, groups: impl Iterator<Item = &'g [NodeId]>) {
        self.flat.clear();
        self.spans.clear();
        for grp in groups {
            let a = self.flat.len();
            for &o in grp {
                let id = self.op_id(g, o);
                self.flat.push(id);
            }
            if self.flat.len() > a {
                self.spans.push((a, self.flat.len()));
            }
        }
        let flat = &self.flat;
        self.spans
            .sort_unstable_by(|&(a, b), &(c, d)| flat[a..b].cmp(&flat[c..d]));
        self.key.clear();
        if merge {
            self.key.push(MERGE_MARK);
        }
        for &(a, b) in &self.spans {
            self.key.extend_from_slice(&flat[a..b]);
            self.key.push(SEP);
        }
    }

    pub(crate) fn concurrent(
        &mut self,
        g: &Graph,
        cost: &dyn CostModel,
        groups: &[Vec<NodeId>],
    ) -> f64 {
        self.make_key(g, false, groups.iter().map(Vec::as_slice));
        if let Some(&c) = self.by_key.get(self.key.as_slice()) {
            self.hits += 1;
            return c;
        }
        self.queries += 1;
        // The stage's events too: a concurrent stage pays for its fork and join.
        let c = cost.stage_time(g, groups) + cost.overheads().fork_join_ms(groups.len());
        let c = if c.is_finite() && c >= 0.0 {
            c
        } else {
            f64::INFINITY
        };
        self.by_key.insert(self.key.clone(), c);
        c
    }

    fn merged(&mut self, g: &Graph, cost: &dyn CostModel, ops: &[NodeId]) -> f64 {
        self.make_key(g, true, ops.chunks(1));
        if let Some(&c) = self.by_key.get(self.key.as_slice()) {
            self.hits += 1;
            return c;
        }
        self.queries += 1;
        let c = match cost.merged_stage_time(g, ops) {
            Some(c) if c.is_finite() && c >= 0.0 => c,
            _ => f64::INFINITY,
        };
        self.by_key.insert(self.key.clone(), c);
        c
    }
}

/// The part as local bitsets; local index order is a topological order.
pub(crate) struct PartGraph<B> {
    pub ops: Vec<NodeId>,
    /// Predecessors within the part.
    pub preds: Vec<B>,
    /// Successors within the part.
    pub succs: Vec<B>,
    /// Descendants within the part (transitive closure, without the operator itself).
    pub desc: Vec<B>,
    /// Chain decomposition: each chain's operators in precedence order.
    pub chains: Vec<Vec<u8>>,
    pub chain_masks: Vec<B>,
    /// Convolutions (groups = 1) reading identical inputs, classes of two or more.
    pub merge_classes: Vec<B>,
}

impl<B: Bits> PartGraph<B> {
    /// Build the part graph of `ops` (a topological order, at most `B::CAP` operators).
    /// `local` is scratch of length `g.len()` filled with `u32::MAX`; it is restored.
    pub fn new(g: &Graph, ops: &[NodeId], local: &mut [u32]) -> Self {
        let n = ops.len();
        for (i, &o) in ops.iter().enumerate() {
            local[o.index()] = i as u32;
        }
        let mut preds = vec![B::ZERO; n];
        let mut succs = vec![B::ZERO; n];
        for (i, &o) in ops.iter().enumerate() {
            for s in g.succs(o) {
                let j = local[s.index()];
                if j != u32::MAX {
                    succs[i] |= B::bit(j as usize);
                    preds[j as usize] |= B::bit(i);
                }
            }
        }
        for &o in ops {
            local[o.index()] = u32::MAX;
        }
        let mut desc = vec![B::ZERO; n];
        for i in (0..n).rev() {
            let mut d = B::ZERO;
            for j in succs[i].ones() {
                d |= desc[j] | B::bit(j);
            }
            desc[i] = d;
        }
        let (chains, chain_masks) = chain_decomposition(&desc);
        let merge_classes = merge_classes(g, ops);
        PartGraph {
            ops: ops.to_vec(),
            preds,
            succs,
            desc,
            chains,
            chain_masks,
            merge_classes,
        }
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }
}

/// IOS's `graph_chain_decomposition`: on the transitive closure, repeatedly split off a longest
/// chain until no operator is left. Ties go to the lowest local index (IOS breaks them by dict
/// order; the set of endings enumerated does not depend on the tie-break, see the crate docs).
fn chain_decomposition<B: Bits>(desc: &[B]) -> (Vec<Vec<u8>>, Vec<B>) {
    let n = desc.len();
    let mut left = B::low(n);
    let mut chains = Vec::new();
    let mut masks = Vec::new();
    let mut depth = vec![0usize; n];
    let mut next = vec![usize::MAX; n];
    while !left.is_zero() {
        for i in (0..n).rev() {
            if (left & B::bit(i)).is_zero() {
                continue;
            }
            let (mut d, mut nx) = (1usize, usize::MAX);
            for j in (desc[i] & left).ones() {
                if depth[j] + 1 > d {
                    d = depth[j] + 1;
                    nx = j;
                }
            }
            depth[i] = d;
            next[i] = nx;
        }
        let mut start = usize::MAX;
        for i in left.ones() {
            if start == usize::MAX || depth[i] > depth[start] {
                start = i;
            }
        }
        let mut chain = Vec::new();
        let mut mask = B::ZERO;
        let mut u = start;
        while u != usize::MAX {
            chain.push(u as u8);
            mask |= B::bit(u);
            u = next[u];
        }
        left &= !mask;
        chains.push(chain);
        masks.push(mask);
    }
    (chains, masks)
}

/// Candidate merge classes: plain convolutions with `groups = 1`, and linear layers, grouped
/// by kind and identical input terms (the first conditions of
/// `opsched_graph::merge::mergeable`; the rest is checked per subset).
fn merge_classes<B: Bits>(g: &Graph, ops: &[NodeId]) -> Vec<B> {
    let mut classes: Vec<(usize, B)> = Vec::new();
    let kind = |o: NodeId| match &g.node(o).op {
        Op::Conv2d(c) if c.groups == 1 => Some(0),
        Op::Linear { .. } => Some(1),
        _ => None,
    };
    for (i, &o) in ops.iter().enumerate() {
        let node = g.node(o);
        let Some(k) = kind(o) else { continue };
        match classes
            .iter_mut()
            .find(|(rep, _)| kind(ops[*rep]) == Some(k) && g.node(ops[*rep]).inputs == node.inputs)
        {
            Some((_, m)) => *m |= B::bit(i),
            None => classes.push((i, B::bit(i))),
        }
    }
    classes
        .into_iter()
        .map(|(_, m)| m)
        .filter(|m| m.count() >= 2)
        .collect()
}

#[derive(Clone, Copy)]
struct Entry<B> {
    cost: f64,
    ending: B,
    merge: bool,
}

/// What solving one part gives.
pub(crate) struct PartResult {
    pub stages: Vec<Stage>,
    pub objective: f64,
    pub states: u64,
    pub transitions: u64,
    /// Scheduled by the fallback after the budget ran out, not by the DP.
    pub fallback: bool,
}

/// The DP of one part.
pub(crate) struct Dp<'a, B> {
    g: &'a Graph,
    cost: &'a dyn CostModel,
    pg: &'a PartGraph<B>,
    lim: Limits,
    costs: &'a mut StageCosts,
    /// The run's work budget, shared by all parts.
    meter: &'a mut Meter,
    memo: FastMap<B, Entry<B>>,
    /// Stage cost per (ending, merge) inside this part (`INFINITY`: not a valid stage).
    local: FastMap<(B, bool), f64>,
    /// Stack of endings: each state pushes its own above those of the states below it.
    endings: Vec<(B, bool)>,
    /// Scratch: candidate groups and their ranges per chain.
    cands: Vec<B>,
    ranges: Vec<(usize, usize)>,
    states: u64,
    transitions: u64,
}

impl<'a, B: Bits> Dp<'a, B> {
    pub fn new(
        g: &'a Graph,
        cost: &'a dyn CostModel,
        pg: &'a PartGraph<B>,
        lim: Limits,
        costs: &'a mut StageCosts,
        meter: &'a mut Meter,
    ) -> Self {
        Dp {
            g,
            cost,
            pg,
            lim,
            costs,
            meter,
            memo: FastMap::default(),
            local: FastMap::default(),
            endings: Vec::with_capacity(1024),
            cands: Vec::with_capacity(64),
            ranges: Vec::with_capacity(64),
            states: 0,
            transitions: 0,
        }
    }

    /// Solve the part and return every state the DP visited (for tests that recount them).
    #[cfg(test)]
    pub fn visited_states(mut self) -> Vec<B> {
        self.solve(B::low(self.pg.len()));
        self.memo.into_keys().collect()
    }

    /// Solve the part; `None` if some state has no valid ending (cannot happen with `r, s >= 1`)
    /// or the work budget ran out (the meter says so).
    pub fn run(mut self) -> Option<PartResult> {
        let full = B::low(self.pg.len());
        let objective = self.solve(full);
        if !objective.is_finite() || self.meter.exhausted() {
            return None;
        }
        let mut stages = Vec::new();
        let mut s = full;
        while !s.is_zero() {
            let e = *self.memo.get(&s)?;
            if e.ending.is_zero() {
                return None;
            }
            stages.push(self.stage_of(e.ending, e.merge));
            s &= !e.ending;
        }
        stages.reverse();
        Some(PartResult {
            stages,
            objective,
            states: self.states,
            transitions: self.transitions,
            fallback: false,
        })
    }

    fn solve(&mut self, s: B) -> f64 {
        if s.is_zero() {
            return 0.0;
        }
        if let Some(e) = self.memo.get(&s) {
            return e.cost;
        }
        self.states += 1;
        let start = self.endings.len();
        self.enumerate(s);
        let end = self.endings.len();
        if self.meter.exhausted() {
            // Unwind without memoizing: the part is abandoned.
            self.endings.truncate(start);
            return f64::INFINITY;
        }
        let mut best = Entry {
            cost: f64::INFINITY,
            ending: B::ZERO,
            merge: false,
        };
        for i in start..end {
            let (e, merge) = self.endings[i];
            let c = self.stage_cost(e, merge);
            if !c.is_finite() {
                // Not a valid stage (operators the cost model cannot merge): like IOS, which
                // checks a merge before counting it, this is no transition.
                continue;
            }
            self.transitions += 1;
            let total = self.solve(s & !e) + c;
            if self.meter.exhausted() {
                self.endings.truncate(start);
                return f64::INFINITY;
            }
            if total < best.cost {
                best = Entry {
                    cost: total,
                    ending: e,
                    merge,
                };
            }
        }
        self.endings.truncate(start);
        self.memo.insert(s, best);
        best.cost
    }

    /// Push the endings of `s` onto `self.endings`: merge stages first (as IOS evaluates them),
    /// then the concurrent endings of the chain enumeration.
    fn enumerate(&mut self, s: B) {
        let pg = self.pg;
        if self.lim.merge || self.lim.singles {
            let mut sinks = B::ZERO;
            for i in s.ones() {
                if (pg.succs[i] & s).is_zero() {
                    sinks |= B::bit(i);
                }
            }
            if self.lim.singles {
                for i in sinks.ones() {
                    if !self.meter.charge() {
                        return;
                    }
                    self.endings.push((B::bit(i), false));
                }
            }
            if self.lim.merge {
                for &class in &pg.merge_classes {
                    let mut m = class & sinks;
                    if m.count() < 2 {
                        continue;
                    }
                    if m.count() as usize > MERGE_CLASS_CAP {
                        let mut capped = B::ZERO;
                        for i in m.ones().take(MERGE_CLASS_CAP) {
                            capped |= B::bit(i);
                        }
                        m = capped;
                    }
                    // Every submask of m with at least two members.
                    let mut sub = m;
                    while !sub.is_zero() {
                        if sub.count() >= 2 {
                            if !self.meter.charge() {
                                return;
                            }
                            self.endings.push((sub, true));
                        }
                        sub = sub.dec() & m;
                    }
                }
            }
        }
        if self.lim.parallel {
            let (c0, r0) = (self.cands.len(), self.ranges.len());
            let r = self.lim.r;
            for (c, chain) in pg.chains.iter().enumerate() {
                // The chain's members in S form a prefix (S is closed under predecessors and
                // the chain is totally ordered), so its length is a popcount.
                let end = (pg.chain_masks[c] & s).count() as usize;
                if end == 0 {
                    continue;
                }
                let before = self.cands.len();
                for p in (end.saturating_sub(r)..end).rev() {
                    let h = chain[p] as usize;
                    let grp = (pg.desc[h] & s) | B::bit(h);
                    // Heads earlier in the chain have larger groups: stop at the first too big.
                    if grp.count() as usize > r {
                        break;
                    }
                    self.cands.push(grp);
                }
                if self.cands.len() > before {
                    self.ranges.push((before, self.cands.len()));
                }
            }
            combos(
                &self.ranges[r0..],
                &self.cands,
                B::ZERO,
                0,
                self.lim.s,
                &mut self.endings,
                self.meter,
            );
            self.cands.truncate(c0);
            self.ranges.truncate(r0);
        }
    }

    fn stage_cost(&mut self, e: B, merge: bool) -> f64 {
        if let Some(&c) = self.local.get(&(e, merge)) {
            return c;
        }
        let c = if merge {
            let ops: Vec<NodeId> = e.ones().map(|i| self.pg.ops[i]).collect();
            self.costs.merged(self.g, self.cost, &ops)
        } else {
            let groups = self.groups_of(e);
            self.costs.concurrent(self.g, self.cost, &groups)
        };
        self.local.insert((e, merge), c);
        c
    }

    /// The groups of a concurrent ending: one per operator of `e` without a predecessor in `e`
    /// (a head), holding the head and its descendants in `e`, in topological order.
    fn groups_of(&self, e: B) -> Vec<Vec<NodeId>> {
        let pg = self.pg;
        e.ones()
            .filter(|&i| (pg.preds[i] & e).is_zero())
            .map(|h| {
                ((pg.desc[h] & e) | B::bit(h))
                    .ones()
                    .map(|i| pg.ops[i])
                    .collect()
            })
            .collect()
    }

    fn stage_of(&self, e: B, merge: bool) -> Stage {
        if merge {
            Stage {
                strategy: StageStrategy::Merge,
                groups: e.ones().map(|i| vec![self.pg.ops[i]]).collect(),
            }
        } else {
            Stage {
                strategy: StageStrategy::Concurrent,
                groups: self.groups_of(e),
            }
        }
    }
}

/// All combinations of at most one candidate group per chain, pairwise disjoint, at most
/// `smax` groups, at least one: IOS's `ending_iterator`, with the disjointness and count
/// checks applied while choosing instead of after. Each ending is charged to `meter`; returns
/// `false` (leaving the enumeration incomplete) once the budget is spent, so one wide state
/// cannot fill memory with endings.
fn combos<B: Bits>(
    ranges: &[(usize, usize)],
    cands: &[B],
    used: B,
    groups: usize,
    smax: usize,
    out: &mut Vec<(B, bool)>,
    meter: &mut Meter,
) -> bool {
    match ranges.split_first() {
        None => {
            if !used.is_zero() {
                if !meter.charge() {
                    return false;
                }
                out.push((used, false));
            }
            true
        }
        Some((&(a, b), rest)) => {
            if !combos(rest, cands, used, groups, smax, out, meter) {
                return false;
            }
            if groups < smax {
                for &grp in &cands[a..b] {
                    if (grp & used).is_zero()
                        && !combos(rest, cands, used | grp, groups + 1, smax, out, meter)
                    {
                        return false;
                    }
                }
            }
            true
        }
    }
}

/// The fallback schedule of a part once the work budget is spent: waves of ready operators
/// (all predecessors in earlier stages), at most `smax` per stage, one group each, in the
/// part's topological order. Linear in the part and always valid.
pub(crate) fn ready_waves<B: Bits>(pg: &PartGraph<B>, smax: usize) -> Vec<Vec<Vec<NodeId>>> {
    let all = B::low(pg.len());
    let mut done = B::ZERO;
    let mut stages = Vec::new();
    while done != all {
        let mut wave = B::ZERO;
        for i in (all & !done)
            .ones()
            .filter(|&i| (pg.preds[i] & !done).is_zero())
        {
            wave |= B::bit(i);
            if wave.count() as usize == smax {
                break;
            }
        }
        done |= wave;
        stages.push(wave.ones().map(|i| vec![pg.ops[i]]).collect());
    }
    stages
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use opsched_cost::signature::stage_signature;
    use opsched_cost::AnalyticalModel;
    use opsched_graph::zoo::{self, ZooConfig};

    use super::*;

    fn limits() -> Limits {
        Limits {
            r: 3,
            s: 8,
            parallel: true,
            merge: true,
            singles: false,
        }
    }

    /// IOS's `check_merge` (optimizer.py), on our IR: one operator always passes; several must
    /// all be convolutions with the first one's input and output spatial size, stride and
    /// activation, `groups = 1` (IOS does not check the first one's groups), and one input term
    /// of one value equal to the first one's first input value.
    fn ios_check_merge(g: &Graph, nds: &[NodeId]) -> bool {
        let [first, rest @ ..] = nds else {
            return false;
        };
        let n0 = g.node(*first);
        if rest.is_empty() {
            return true;
        }
        let Op::Conv2d(c0) = &n0.op else {
            return false;
        };
        let hw = |shape: &[usize]| shape.get(2..4).map(<[usize]>::to_vec);
        let in0 = g.input_shapes(*first);
        rest.iter().all(|&n| {
            let node = g.node(n);
            let Op::Conv2d(c) = &node.op else {
                return false;
            };
            let input = g.input_shapes(n);
            hw(&input[0]) == hw(&in0[0])
                && hw(&node.shape) == hw(&n0.shape)
                && c.stride == c0.stride
                && c.groups == 1
                && c.act == c0.act
                && matches!(node.inputs.as_slice(), [t] if t.len() == 1 && t[0] == n0.inputs[0][0])
        })
    }

    /// The IOS reproduction claim, pinned: on Inception-v3 (r = 3, s = 8) the DP visits the
    /// same 1,206 states as IOS's `optimizer.py` and evaluates 25,486 transitions; IOS counts
    /// 28,874. Recounting every visited state IOS's way gives exactly that, and shows where the
    /// 3,388 come from: IOS's merge loop walks every non-empty subset of the state's sinks that
    /// `check_merge` accepts, one-operator subsets included, and its concurrent loop offers the
    /// same one-operator stages again (a sink is the last operator of its chain's prefix, so it
    /// is a head whose group is itself). We evaluate that stage once. Merge stages of two or more
    /// operators are the same sets under both rules, state by state.
    #[test]
    fn transitions_differ_from_ios_by_its_repeated_single_operator_stages() {
        let g = zoo::build("inception_v3", &ZooConfig::default()).unwrap();
        let cost = AnalyticalModel::default();
        let mut local = vec![u32::MAX; g.len()];
        let (mut states, mut ours, mut ios, mut sinks_total) = (0u64, 0u64, 0u64, 0u64);
        for part in &crate::parts::split(&g, 50).parts {
            let pg = PartGraph::<u64>::new(&g, part, &mut local);
            let mut costs = StageCosts::default();
            let mut meter = Meter::new(crate::IosBudget::default());
            ours += Dp::new(&g, &cost, &pg, limits(), &mut costs, &mut meter)
                .run()
                .unwrap()
                .transitions;
            let mut costs = StageCosts::default();
            let mut meter = Meter::new(crate::IosBudget::default());
            let visited =
                Dp::new(&g, &cost, &pg, limits(), &mut costs, &mut meter).visited_states();
            states += visited.len() as u64;
            for s in visited {
                let sinks = s.ones().filter(|&i| (pg.succs[i] & s).is_zero());
                let sinks: u64 = sinks.fold(0, |m, i| m | u64::bit(i));
                sinks_total += u64::from(sinks.count());
                // IOS's merge loop: every non-empty subset of the sinks that check_merge accepts.
                let mut ios_merges = std::collections::BTreeSet::new();
                let mut sub = sinks;
                while sub != 0 {
                    let ops: Vec<NodeId> = sub.ones().map(|i| pg.ops[i]).collect();
                    if ios_check_merge(&g, &ops) {
                        ios_merges.insert(sub);
                    }
                    sub = (sub - 1) & sinks;
                }
                // Ours: the same enumeration the DP does, valid stages only.
                let mut costs = StageCosts::default();
                let mut meter = Meter::new(crate::IosBudget::default());
                let mut dp = Dp::new(&g, &cost, &pg, limits(), &mut costs, &mut meter);
                dp.enumerate(s);
                let endings = std::mem::take(&mut dp.endings);
                let valid = endings
                    .iter()
                    .filter(|&&(e, merge)| dp.stage_cost(e, merge).is_finite());
                let (merges, concurrent): (Vec<_>, Vec<_>) = valid.partition(|(_, m)| *m);
                let our_merges: std::collections::BTreeSet<u64> =
                    merges.iter().map(|(e, _)| *e).collect();
                let ios_multi: std::collections::BTreeSet<u64> = ios_merges
                    .iter()
                    .copied()
                    .filter(|m| m.count() >= 2)
                    .collect();
                assert_eq!(our_merges, ios_multi, "merge stages differ in state {s:#x}");
                ios += (ios_merges.len() + concurrent.len()) as u64;
            }
        }
        assert_eq!(states, 1206);
        assert_eq!(ours, 25_486);
        assert_eq!(ios, 28_874);
        assert_eq!(ios - ours, sinks_total);
    }

    #[test]
    fn narrow_and_wide_bitsets_agree() {
        let g = zoo::build("inception_v3", &ZooConfig::default()).unwrap();
        let cost = AnalyticalModel::default();
        let mut local = vec![u32::MAX; g.len()];
        for b in g.blocks().iter().take(4) {
            let ops: Vec<NodeId> = g.ops().filter(|o| b.nodes.contains(o)).collect::<Vec<_>>();
            let mut c1 = StageCosts::default();
            let mut m1 = Meter::new(crate::IosBudget::default());
            let pg64 = PartGraph::<u64>::new(&g, &ops, &mut local);
            let r64 = Dp::new(&g, &cost, &pg64, limits(), &mut c1, &mut m1)
                .run()
                .unwrap();
            let mut c2 = StageCosts::default();
            let mut m2 = Meter::new(crate::IosBudget::default());
            let pg128 = PartGraph::<u128>::new(&g, &ops, &mut local);
            let r128 = Dp::new(&g, &cost, &pg128, limits(), &mut c2, &mut m2)
                .run()
                .unwrap();
            assert_eq!(r64.stages, r128.stages);
            assert_eq!(r64.objective, r128.objective);
            assert_eq!(r64.states, r128.states);
            assert!(local.iter().all(|&l| l == u32::MAX));
        }
    }

    #[test]
    fn chains_partition_the_part_into_totally_ordered_lists() {
        let g = zoo::build("nasnet", &ZooConfig::default()).unwrap();
        let mut local = vec![u32::MAX; g.len()];
        for b in g.blocks() {
            let ops: Vec<NodeId> = g.ops().filter(|o| b.nodes.contains(o)).collect();
            let pg = PartGraph::<u64>::new(&g, &ops, &mut local);
            let mut seen = 0u64;
            for (chain, &mask) in pg.chains.iter().zip(&pg.chain_masks) {
                assert_eq!(mask.count() as usize, chain.len());
                assert_eq!(seen & mask, 0);
                seen |= mask;
                for w in chain.windows(2) {
                    let (a, b) = (w[0] as usize, w[1] as usize);
                    assert_ne!(pg.desc[a] & u64::bit(b), 0, "chain not ordered");
                }
            }
            assert_eq!(seen, u64::low(ops.len()));
            // The first chain is a longest one.
            let depth = pg.chains[0].len();
            assert!(pg.chains.iter().all(|c| c.len() <= depth));
        }
    }

    /// The interned key identifies stages exactly as `stage_signature` does.
    #[test]
    fn interned_keys_match_stage_signatures() {
        let g = zoo::build("nasnet", &ZooConfig::default()).unwrap();
        let ops: Vec<NodeId> = g.ops().collect();
        // Stages of one or two groups of up to two operators, from consecutive operators of
        // the whole model (repeated cells give many equal signatures).
        let mut stages: Vec<Vec<Vec<NodeId>>> = Vec::new();
        for w in ops.windows(3).step_by(2) {
            stages.push(vec![vec![w[0]]]);
            stages.push(vec![vec![w[0], w[1]]]);
            stages.push(vec![vec![w[1], w[0]]]);
            stages.push(vec![vec![w[0]], vec![w[1], w[2]]]);
            stages.push(vec![vec![w[1], w[2]], vec![w[0]]]);
        }
        let mut costs = StageCosts::default();
        let keyed: Vec<(Vec<u32>, String)> = stages
            .iter()
            .map(|st| {
                costs.make_key(&g, false, st.iter().map(Vec::as_slice));
                (costs.key.clone(), stage_signature(&g, st))
            })
            .collect();
        let mut equal_pairs = 0;
        for (i, (ki, si)) in keyed.iter().enumerate() {
            for (kj, sj) in &keyed[i + 1..] {
                assert_eq!(ki == kj, si == sj, "{si} vs {sj}");
                equal_pairs += usize::from(si == sj);
            }
        }
        assert!(equal_pairs > 0);
    }
}
