//! IOPS Sec. 2.1 and 2.4, Eq. (1) and Algorithm 2: the dynamic program of one block.
//!
//! The state is the set `S` of the block's operators not yet scheduled, closed under
//! predecessors (a bitset over the block's local indices, which follow a topological order).
//! `Cost(S) = min over last processes L of ProTimes(L) + Cost(S - L)`, `Cost(empty) = 0`
//! (Eq. (1)); the memo keeps the cost and the chosen process per state ("Times" and "Policy"
//! of Algorithm 2), and the schedule is rebuilt by walking back from the full block.
//!
//! A process `L` (a stage) is an *ending* of `S`: no edge leads from `L` back to `S - L`. Two
//! kinds are enumerated (Algorithm 2, lines 10-12):
//! - **parallel scheduling** (`L_par`): at most `max_parallel` groups run concurrently, one
//!   stream each. A group is a head operator `h` with all its descendants inside `S` (an
//!   up-set of `S`, run in topological order, a chain in the common case); groups must be
//!   disjoint, and the process holds at most `max_ops` operators in all. Disjoint up-sets have
//!   no edge between them, so the groups are independent and `S - L` stays closed under
//!   predecessors. Its time is [`CostModel::stage_time`].
//! - **operator replacement** (`L_trans`): two to `max_parallel` convolutions that are sinks
//!   of `S` and merge into one operator ([`opsched_graph::merge::mergeable`]); its time is
//!   [`CostModel::merged_time`]. Where no merge applies, `L_trans = infinity`.
//!
//! For a set of operators that both strategies can run, the DP keeps the faster one; it also
//! weighs every other split of the remaining operators, so the choice between replacement and
//! parallelism is made per process with the rest of the block in view.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use opsched_cost::CostModel;
use opsched_graph::{Graph, NodeId};

/// A small multiplicative hasher for `u64` keys (FxHash's constant).
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

pub(crate) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// One process of a block's schedule, in local indices.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum LocalStage {
    /// Concurrent groups, each in run order.
    Concurrent(Vec<Vec<u8>>),
    /// One merged operator replacing these convolutions.
    Merge(Vec<u8>),
}

/// A solved block.
#[derive(Clone, Debug, Default)]
pub(crate) struct Solution {
    pub stages: Vec<LocalStage>,
    /// Processes where both strategies could run the same operators, and which one won.
    pub replacement_won: u64,
    pub parallel_won: u64,
}

/// Counters of one block's search.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counters {
    pub states: u64,
    pub transitions: u64,
    pub cost_queries: u64,
}

#[derive(Clone, Copy, Debug)]
enum Choice {
    /// Heads of the groups (bitset); the groups are the heads' up-sets in the state.
    Concurrent(u64),
    /// The merged operators (bitset).
    Merge(u64),
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    cost: f64,
    choice: Choice,
}

/// Stage times shared by all blocks of a graph, keyed by the operators' signature ids (group by
/// group, groups sorted: the key of [`opsched_cost::signature::stage_signature`], interned).
/// Cost models answer per operator signature, so equal keys have equal times.
#[derive(Default)]
pub(crate) struct SharedCache {
    /// Interned [`opsched_cost::signature::op_signature`] of every node (by node index).
    pub sig_id: Vec<u32>,
    pub stages: FxMap<Vec<Vec<u32>>, f64>,
}

impl SharedCache {
    pub fn new(g: &Graph) -> Self {
        let mut ids: HashMap<String, u32> = HashMap::new();
        let sig_id = (0..g.len())
            .map(|i| {
                let sig = opsched_cost::signature::op_signature(g, NodeId(i as u32));
                let next = ids.len() as u32;
                *ids.entry(sig).or_insert(next)
            })
            .collect();
        SharedCache {
            sig_id,
            stages: FxMap::default(),
        }
    }
}

/// The DP of one block.
pub(crate) struct BlockDp<'a> {
    shared: &'a mut SharedCache,
    g: &'a Graph,
    cost: &'a dyn CostModel,
    ops: &'a [NodeId],
    /// Strict descendants inside the block.
    desc: Vec<u64>,
    /// Each operator's time alone.
    op_time: Vec<f64>,
    /// Longest path (operator times) from the block's start to each operator, itself included.
    top: Vec<f64>,
    /// Local indices by decreasing `top`.
    by_top: Vec<u8>,
    /// Merge families inside the block (bitsets of convolutions reading identical inputs).
    families: Vec<u64>,
    max_parallel: usize,
    max_ops: usize,
    memo: FxMap<u64, Entry>,
    stage_cache: FxMap<(u64, u64), f64>,
    merge_cache: FxMap<u64, Option<f64>>,
    pub counters: Counters,
}

fn bits(mut m: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if m == 0 {
            None
        } else {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            Some(i)
        }
    })
}

impl<'a> BlockDp<'a> {
    /// A DP over `ops` (at most 64, in topological order). `local_of` maps a node index to
    /// its local index in this block (`u32::MAX` outside it); `families` are the graph's
    /// merge families.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shared: &'a mut SharedCache,
        g: &'a Graph,
        cost: &'a dyn CostModel,
        ops: &'a [NodeId],
        local_of: &[u32],
        families: &[Vec<NodeId>],
        max_parallel: usize,
        max_ops: usize,
    ) -> Self {
        let n = ops.len();
        let local = |v: NodeId| -> Option<usize> {
            local_of
                .get(v.index())
                .copied()
                .filter(|&l| (l as usize) < n && ops.get(l as usize) == Some(&v))
                .map(|l| l as usize)
        };
        let mut desc = vec![0u64; n];
        for i in (0..n).rev() {
            let mut acc = 0u64;
            for s in g.succs(ops[i]) {
                if let Some(j) = local(s) {
                    acc |= (1u64 << j) | desc[j];
                }
            }
            desc[i] = acc;
        }
        let op_time: Vec<f64> = ops.iter().map(|&v| cost.op_time(g, v)).collect();
        let mut top = vec![0.0f64; n];
        for i in 0..n {
            let before = (0..i)
                .filter(|&j| desc[j] >> i & 1 == 1)
                .map(|j| top[j])
                .fold(0.0, f64::max);
            top[i] = before + op_time[i];
        }
        let mut by_top: Vec<u8> = (0..n as u8).collect();
        by_top.sort_by(|&a, &b| top[b as usize].total_cmp(&top[a as usize]));
        let families = families
            .iter()
            .map(|f| {
                f.iter()
                    .filter_map(|&v| local(v))
                    .fold(0u64, |m, j| m | 1 << j)
            })
            .filter(|m| m.count_ones() >= 2)
            .collect();
        BlockDp {
            shared,
            g,
            cost,
            ops,
            desc,
            op_time,
            top,
            by_top,
            families,
            max_parallel: max_parallel.max(1),
            max_ops: max_ops.max(1),
            memo: FxMap::default(),
            stage_cache: FxMap::default(),
            merge_cache: FxMap::default(),
            counters: Counters::default(),
        }
    }

    fn full(&self) -> u64 {
        match self.ops.len() {
            0 => 0,
            n if n >= 64 => u64::MAX,
            n => (1u64 << n) - 1,
        }
    }

    /// The group of head `h` in state `s`: `h` and its descendants in `s`, in local order.
    fn group_mask(&self, s: u64, h: usize) -> u64 {
        (self.desc[h] & s) | (1u64 << h)
    }

    fn groups_of(&self, s: u64, heads: u64) -> Vec<Vec<NodeId>> {
        bits(heads)
            .map(|h| {
                bits(self.group_mask(s, h))
                    .map(|i| self.ops[i])
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn stage_time(&mut self, s: u64, set: u64, heads: u64) -> f64 {
        if let Some(&t) = self.stage_cache.get(&(set, heads)) {
            return t;
        }
        let groups = self.groups_of(s, heads);
        let sig = &self.shared.sig_id;
        let mut key: Vec<Vec<u32>> = groups
            .iter()
            .map(|grp| {
                grp.iter()
                    .map(|v| sig.get(v.index()).copied().unwrap_or(u32::MAX))
                    .collect()
            })
            .collect();
        key.sort_unstable();
        let t = match self.shared.stages.get(&key) {
            Some(&t) => t,
            None => {
                self.counters.cost_queries += 1;
                // The stage's events too: a concurrent stage pays for its fork and join.
                let t = self.cost.stage_time(self.g, &groups)
                    + self.cost.overheads().fork_join_ms(groups.len());
                self.shared.stages.insert(key, t);
                t
            }
        };
        self.stage_cache.insert((set, heads), t);
        t
    }

    fn merge_time(&mut self, set: u64) -> Option<f64> {
        if let Some(&t) = self.merge_cache.get(&set) {
            return t;
        }
        let ops: Vec<NodeId> = bits(set).map(|i| self.ops[i]).collect();
        self.counters.cost_queries += 1;
        let t = if opsched_graph::merge::mergeable(self.g, &ops) {
            self.cost.merged_stage_time(self.g, &ops)
        } else {
            None
        };
        self.merge_cache.insert(set, t);
        t
    }

    /// A lower bound on `Cost(s)`: the longest path inside `s`. Every process takes at least
    /// its longest group's operator times (merged: its longest component), and the operators
    /// of a path lie in distinct processes or in order in one group, so the processes' times
    /// add up to at least the path's. As `s` is closed under predecessors, the longest path
    /// ending at an operator of `s` lies inside `s`.
    fn bound(&self, s: u64) -> f64 {
        self.by_top
            .iter()
            .find(|&&i| s >> i & 1 == 1)
            .map_or(0.0, |&i| self.top[i as usize])
    }

    /// `Cost(s)` of Eq. (1), memoized.
    fn solve_state(&mut self, s: u64) -> f64 {
        if s == 0 {
            return 0.0;
        }
        if let Some(e) = self.memo.get(&s) {
            return e.cost;
        }
        self.counters.states += 1;
        // Candidate heads: their group fits in one process.
        let mut cands: Vec<(usize, u64, usize, f64)> = Vec::new();
        for h in bits(s) {
            let m = self.group_mask(s, h);
            let size = m.count_ones() as usize;
            if size <= self.max_ops {
                let len: f64 = bits(m).map(|i| self.op_time[i]).sum();
                cands.push((h, m, size, len));
            }
        }
        let mut best = Entry {
            cost: f64::INFINITY,
            choice: Choice::Concurrent(0),
        };
        // Parallel scheduling: every combination of at most max_parallel disjoint groups,
        // tried in order of a lower bound on its total (the longest group plus the longest
        // path left), so that the search can stop at the first bound no better than the best.
        let mut combos: Vec<(f64, u64, u64)> = Vec::new();
        let mut stack: Vec<(usize, u64, u64, usize, usize, f64)> = vec![(0, 0, 0, 0, 0, 0.0)];
        // (next candidate, heads, union, ops, groups, longest group)
        while let Some((next, heads, set, nops, ngroups, longest)) = stack.pop() {
            if heads != 0 {
                combos.push((longest + self.bound(s & !set), heads, set));
            }
            if ngroups >= self.max_parallel {
                continue;
            }
            for (k, &(h, m, size, len)) in cands.iter().enumerate().skip(next) {
                if m & set != 0 || nops + size > self.max_ops {
                    continue;
                }
                stack.push((
                    k + 1,
                    heads | 1 << h,
                    set | m,
                    nops + size,
                    ngroups + 1,
                    longest.max(len),
                ));
            }
        }
        combos.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (lb, heads, set) in combos {
            if lb >= best.cost {
                break;
            }
            self.counters.transitions += 1;
            let rest = s & !set;
            let t = self.stage_time(s, set, heads);
            if t + self.bound(rest) >= best.cost {
                continue;
            }
            let total = t + self.solve_state(rest);
            if total < best.cost {
                best = Entry {
                    cost: total,
                    choice: Choice::Concurrent(heads),
                };
            }
        }
        // Operator replacement: mergeable subsets of sinks of s within one family.
        let sinks = bits(s)
            .filter(|&i| self.desc[i] & s == 0)
            .fold(0u64, |m, i| m | 1 << i);
        for fi in 0..self.families.len() {
            let cand = self.families[fi] & sinks;
            if cand.count_ones() < 2 {
                continue;
            }
            // Every sub-mask of cand with 2..=max_parallel members.
            let mut sub = cand;
            while sub != 0 {
                let k = sub.count_ones() as usize;
                if k >= 2 && k <= self.max_parallel {
                    self.counters.transitions += 1;
                    if let Some(t) = self.merge_time(sub) {
                        if t + self.bound(s & !sub) < best.cost {
                            let total = t + self.solve_state(s & !sub);
                            if total < best.cost {
                                best = Entry {
                                    cost: total,
                                    choice: Choice::Merge(sub),
                                };
                            }
                        }
                    }
                }
                sub = (sub - 1) & cand;
            }
        }
        self.memo.insert(s, best);
        best.cost
    }

    /// Solve the whole block and rebuild its processes in run order.
    pub fn solve(&mut self) -> Solution {
        let full = self.full();
        self.solve_state(full);
        let mut stages = Vec::new();
        let mut s = full;
        let mut replacement_won = 0;
        let mut parallel_won = 0;
        while s != 0 {
            let Some(e) = self.memo.get(&s).copied() else {
                break;
            };
            match e.choice {
                Choice::Concurrent(heads) => {
                    let groups: Vec<Vec<u8>> = bits(heads)
                        .map(|h| bits(self.group_mask(s, h)).map(|i| i as u8).collect())
                        .collect();
                    let set = bits(heads).fold(0u64, |m, h| m | self.group_mask(s, h));
                    // Could the same operators have been replaced by one merged operator?
                    if heads == set && set.count_ones() >= 2 && self.merge_time(set).is_some() {
                        parallel_won += 1;
                    }
                    stages.push(LocalStage::Concurrent(groups));
                    s &= !set;
                }
                Choice::Merge(set) => {
                    // The merged sinks could also have run as parallel single-op groups.
                    replacement_won += 1;
                    stages.push(LocalStage::Merge(bits(set).map(|i| i as u8).collect()));
                    s &= !set;
                }
            }
        }
        stages.reverse();
        Solution {
            stages,
            replacement_won,
            parallel_won,
        }
    }
}
