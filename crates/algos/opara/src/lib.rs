//! # opsched-opara
//!
//! Opara (Chen et al., "Opara: Exploiting Operator Parallelism for Expediting DNN Inference on
//! GPUs", IEEE TPDS 2024): one GPU, several CUDA streams, a stream allocation that keeps
//! dependent operators on one stream (Alg. 1) and a resource- and interference-aware launch
//! order (Alg. 2). The host enqueues the operators in the launch order; cross-stream
//! dependencies become events (lowering records an event after a producer only when some
//! consumer sits on another stream, Opara's rule).
//!
//! ## Launch order (paper Alg. 2)
//! Two ready lists, memory-intensive and compute-intensive operators. An operator is ready
//! when all its operator predecessors are launched (graph inputs are not operators). While a
//! list is non-empty:
//! 1. **Alternate.** When both lists are non-empty, take the list of the class *other than
//!    the last launched operator's*; the very first choice between two non-empty lists is the
//!    compute list (as in the reference code, whose toggle starts on the compute queue). When
//!    only one list is non-empty, take it. (The reference toggles a flag on every iteration,
//!    also when it is forced to one list, so after a forced run it may pick the same class
//!    twice in a row although both are ready; we alternate on what was actually launched,
//!    which is what "alternately choose a non-empty list" means.)
//! 2. **Least demand.** From that list launch the operator with the smallest demand scalar
//!    ([`demand_scalar`]); ties go to the smaller operator id.
//! 3. Successors whose last predecessor was just launched join their class's list.
//!
//! ### Classification
//! The paper classifies by operator type with an offline table (the reference code's list:
//! element-wise ops, activations, pooling, normalization, concat, slicing, reshapes are
//! memory-intensive; everything else, i.e. convolutions and matrix products, is
//! compute-intensive). We ask the cost model instead: an operator is memory-intensive when
//! [`ResourceDemand::memory_bound`] holds, which for the analytical model means that its main
//! kernel's arithmetic intensity (FLOPs per byte) lies below the device's roofline ridge point.
//! That agrees with the type table on everything the table calls memory-intensive (element-wise,
//! pooling, normalization and copy kernels do about one FLOP per byte, far below any ridge), and
//! refines it where a type says little: convolutions and linear layers with little reuse
//! (depthwise convolutions, 1x1 convolutions on few channels, batch-1 matrix-vector products)
//! are memory-bound on the device and are put with the memory-intensive operators. Operators
//! without a kernel (views) and abstract operators of cost-annotated DAGs are not memory-bound
//! and count as compute-intensive.
//!
//! ### Demand scalar
//! The paper's profiler measures, per operator, the shared memory, the registers and the
//! threads of one thread block (the reference code ends up ranking by shared memory per block
//! only). We weigh a whole kernel against the whole GPU, resource by resource, and take the
//! dominant share:
//!
//! ```text
//! threads   = blocks * threads_per_block                        / (max_threads_per_sm    * sms)
//! registers = blocks * threads_per_block * registers_per_thread / (registers_per_sm      * sms)
//! shared    = blocks * shared_mem_per_block                     / (shared_mem_per_sm_kib * 1024 * sms)
//! demand    = max(threads, registers, shared)
//! ```
//!
//! with the limits of the platform's device preset. A value of 1 is one full wave of the GPU
//! in the binding resource; larger values (several waves) are not clipped, so that among big
//! kernels the smaller still goes first. An operator whose demand names no kernel (no blocks
//! or no threads: views, abstract operators) uses its `sm_share` instead, the share of the
//! SMs it fills alone (an abstract operator's utilization).
//!
//! ## Stream allocation (paper Alg. 1)
//! Operators are visited in the launch order. Each operator looks at its operator
//! predecessors **in launch order** (earliest launched first) and joins the stream of the
//! first one whose SYNC flag is still false, setting that flag (the predecessor has now
//! "used up" its one event-free successor); if every predecessor's flag is set, or it has
//! none, it opens a new stream. This reproduces the four cases of the paper's appendix: a
//! root opens a stream; a single successor, and the first successor of a fork, continue
//! their predecessor's stream; later successors of a fork open new streams; a join continues
//! the stream of its first predecessor with a free flag. Streams list their operators in
//! launch order, so each stream runs a subsequence of a topological order and no operator
//! precedes one of its ancestors on its stream.
//!
//! (The reference code visits the operators in launch order too, but a predecessor list in
//! argument order. Argument order is an accident of the operator's signature, e.g. the order of
//! a concat's inputs; launch order makes "first" the predecessor launched first, the one most
//! likely to have finished, and makes the allocation a function of the launch order alone.)
//!
//! ### Stream cap
//! The paper opens as many streams as the rule asks for (28 for GoogLeNet). A platform offers
//! `platform.streams` streams per GPU; when an operator would open a stream beyond that cap it
//! is put on the stream that **becomes free earliest** under a contention-free estimate: every
//! placed operator gets an estimated finish `max(stream free, predecessors' finish) + op_time`
//! (`cost.op_time`, alone), and a stream is free when its last operator finishes. Ties go to
//! the lower stream index. Its SYNC rule is unaffected: a capped operator sets no flag.
//!
//! ## Output and statistics
//! A [`Schedule::Streams`] plan for GPU 0 (Opara is single-GPU; further GPUs stay idle) with
//! `launch_order` = the launch order. [`SchedulerStats::extra`] reports `streams`, `events`
//! (producers that record an event: some consumer on another stream), `cross_stream_edges`
//! (the waits), `memory_ops`, `compute_ops` and `capped_ops` (operators placed by the cap
//! policy). `states` counts operators, `cost_queries` the demand and time questions.
//!
//! Cost: the launch order scans the chosen ready list per step, O(n * width + edges); the
//! allocation sorts each operator's predecessors, O(edges log degree), plus O(streams) per
//! capped operator.

use std::time::Instant;

use opsched_cost::{CostModel, DevicePreset, ResourceDemand};
use opsched_graph::{Graph, NodeId};
use opsched_schedule::{
    GpuStreams, Platform, Schedule, ScheduleError, Scheduler, SchedulerStats, StreamPlan,
};

/// Opara's operator classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpClass {
    /// Limited by memory traffic.
    Memory,
    /// Limited by arithmetic.
    Compute,
}

impl OpClass {
    /// The class of an operator with this demand.
    pub fn of(d: &ResourceDemand) -> Self {
        if d.memory_bound {
            OpClass::Memory
        } else {
            OpClass::Compute
        }
    }
}

/// The demand scalar of the module docs: the dominant share of the GPU's threads, registers
/// and shared memory the kernel asks for, or `sm_share` when the demand names no kernel.
/// Always finite and non-negative.
pub fn demand_scalar(d: &ResourceDemand, device: &DevicePreset) -> f64 {
    let fallback = if d.sm_share.is_finite() {
        d.sm_share.max(0.0)
    } else {
        0.0
    };
    if d.blocks == 0 || d.threads_per_block == 0 {
        return fallback;
    }
    let sms = f64::from(device.sms.max(1));
    let blocks = d.blocks as f64;
    let threads = blocks * f64::from(d.threads_per_block);
    let share = |need: f64, per_sm: f64| {
        if per_sm > 0.0 {
            need / (per_sm * sms)
        } else {
            0.0
        }
    };
    let t = share(threads, f64::from(device.max_threads_per_sm));
    let r = share(
        threads * f64::from(d.registers_per_thread),
        f64::from(device.registers_per_sm),
    );
    let s = share(
        blocks * f64::from(d.shared_mem_per_block),
        f64::from(device.shared_mem_per_sm_kib) * 1024.0,
    );
    let m = t.max(r).max(s);
    if m.is_finite() {
        m
    } else {
        fallback
    }
}

/// Operator predecessors of `v` (graph inputs left out).
fn op_preds(g: &Graph, v: NodeId) -> impl Iterator<Item = NodeId> + '_ {
    g.preds(v).filter(move |&u| !g.node(u).op.is_input())
}

/// Alg. 2: the launch order of all operators of `g`. `class[i]` and `demand[i]` describe node
/// `NodeId(i)` (entries of graph inputs are ignored; missing entries count as compute class
/// and zero demand). The result is a topological order of the operators.
pub fn launch_order(g: &Graph, class: &[OpClass], demand: &[f64]) -> Vec<NodeId> {
    let n = g.len();
    let is_op = |v: NodeId| !g.node(v).op.is_input();
    let class_of = |v: NodeId| class.get(v.index()).copied().unwrap_or(OpClass::Compute);
    let key = |v: NodeId| {
        let d = demand.get(v.index()).copied().unwrap_or(0.0);
        (if d.is_nan() { f64::INFINITY } else { d }, v.0)
    };
    let mut indeg = vec![0usize; n];
    let mut mem: Vec<NodeId> = Vec::new();
    let mut comp: Vec<NodeId> = Vec::new();
    for v in g.ops() {
        let d = op_preds(g, v).count();
        if let Some(slot) = indeg.get_mut(v.index()) {
            *slot = d;
        }
        if d == 0 {
            match class_of(v) {
                OpClass::Memory => mem.push(v),
                OpClass::Compute => comp.push(v),
            }
        }
    }
    let mut order = Vec::with_capacity(g.op_count());
    let mut last: Option<OpClass> = None;
    loop {
        let pick_mem = match (mem.is_empty(), comp.is_empty()) {
            (true, true) => break,
            (false, true) => true,
            (true, false) => false,
            // Both ready: the class other than the last launched one; compute first.
            (false, false) => last == Some(OpClass::Compute),
        };
        let list = if pick_mem { &mut mem } else { &mut comp };
        let mut best = 0usize;
        let mut best_key = (f64::INFINITY, u32::MAX);
        for (i, &v) in list.iter().enumerate() {
            let k = key(v);
            if k.0 < best_key.0 || (k.0 == best_key.0 && k.1 < best_key.1) {
                best = i;
                best_key = k;
            }
        }
        if best >= list.len() {
            break;
        }
        let v = list.swap_remove(best);
        last = Some(if pick_mem {
            OpClass::Memory
        } else {
            OpClass::Compute
        });
        order.push(v);
        for s in g.succs(v) {
            if !is_op(s) {
                continue;
            }
            if let Some(d) = indeg.get_mut(s.index()) {
                *d = d.saturating_sub(1);
                if *d == 0 {
                    match class_of(s) {
                        OpClass::Memory => mem.push(s),
                        OpClass::Compute => comp.push(s),
                    }
                }
            }
        }
    }
    order
}

/// The result of the stream allocation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Allocation {
    /// Operators of each stream, in launch order.
    pub streams: Vec<Vec<NodeId>>,
    /// Stream of each node (`None` for graph inputs and operators not in the order).
    pub stream_of: Vec<Option<usize>>,
    /// Operators placed by the cap policy instead of the SYNC rule.
    pub capped: usize,
}

impl Allocation {
    /// Dependencies between operators on different streams: (producers that record an event,
    /// cross-stream edges).
    pub fn events(&self, g: &Graph) -> (usize, usize) {
        let mut producers = 0;
        let mut edges = 0;
        for u in g.ops() {
            let Some(su) = self.stream_of.get(u.index()).copied().flatten() else {
                continue;
            };
            let cross = g
                .succs(u)
                .filter(|s| {
                    matches!(self.stream_of.get(s.index()).copied().flatten(), Some(x) if x != su)
                })
                .count();
            if cross > 0 {
                producers += 1;
                edges += cross;
            }
        }
        (producers, edges)
    }
}

/// Alg. 1 with a stream cap: visit `order` (a topological order of operators), join the stream
/// of the first predecessor in launch order whose SYNC flag is false, else open a stream; at
/// `cap` streams (`0` means no cap) take the stream that becomes free earliest, estimated with
/// `time[i]` per node (missing entries count as 0). See the module docs.
pub fn allocate_streams(g: &Graph, order: &[NodeId], cap: usize, time: &[f64]) -> Allocation {
    let n = g.len();
    let mut pos = vec![usize::MAX; n];
    for (i, &v) in order.iter().enumerate() {
        if let Some(p) = pos.get_mut(v.index()) {
            *p = i;
        }
    }
    let mut sync = vec![false; n];
    let mut stream_of: Vec<Option<usize>> = vec![None; n];
    let mut finish = vec![0.0f64; n];
    let mut streams: Vec<Vec<NodeId>> = Vec::new();
    let mut free: Vec<f64> = Vec::new();
    let mut capped = 0usize;
    let mut preds: Vec<NodeId> = Vec::new();
    for &v in order {
        if v.index() >= n {
            continue;
        }
        preds.clear();
        preds.extend(op_preds(g, v).filter(|u| pos[u.index()] < pos[v.index()]));
        preds.sort_by_key(|u| (pos[u.index()], u.0));
        let ready = preds
            .iter()
            .map(|u| finish[u.index()])
            .fold(0.0f64, f64::max);
        let mut chosen = None;
        for &u in &preds {
            if !sync[u.index()] {
                if let Some(s) = stream_of[u.index()] {
                    sync[u.index()] = true;
                    chosen = Some(s);
                    break;
                }
            }
        }
        let s = match chosen {
            Some(s) => s,
            None if cap == 0 || streams.len() < cap => {
                streams.push(Vec::new());
                free.push(0.0);
                streams.len() - 1
            }
            None => {
                capped += 1;
                let mut best = 0usize;
                for (i, &f) in free.iter().enumerate() {
                    if f < free[best] {
                        best = i;
                    }
                }
                best
            }
        };
        let t = time.get(v.index()).copied().unwrap_or(0.0);
        let t = if t.is_finite() { t.max(0.0) } else { 0.0 };
        let end = free[s].max(ready) + t;
        free[s] = end;
        finish[v.index()] = end;
        stream_of[v.index()] = Some(s);
        streams[s].push(v);
    }
    Allocation {
        streams,
        stream_of,
        capped,
    }
}

/// Opara: stream allocation plus resource- and interference-aware launch order, one GPU.
#[derive(Clone, Copy, Debug, Default)]
pub struct Opara;

impl Scheduler for Opara {
    fn name(&self) -> &str {
        "opara"
    }

    fn schedule(
        &self,
        g: &Graph,
        platform: &Platform,
        cost: &dyn CostModel,
    ) -> Result<(Schedule, SchedulerStats), ScheduleError> {
        platform.check("opara")?;
        let start = Instant::now();
        let n = g.len();
        let mut class = vec![OpClass::Compute; n];
        let mut demand = vec![0.0f64; n];
        let mut time = vec![0.0f64; n];
        let mut memory_ops = 0u64;
        let mut queries = 0u64;
        for v in g.ops() {
            let d = cost.demand(g, v);
            let c = OpClass::of(&d);
            if c == OpClass::Memory {
                memory_ops += 1;
            }
            class[v.index()] = c;
            demand[v.index()] = demand_scalar(&d, &platform.device);
            time[v.index()] = cost.op_time(g, v);
            queries += 2;
        }
        let order = launch_order(g, &class, &demand);
        if order.len() != g.op_count() {
            return Err(ScheduleError::Invalid(format!(
                "launch order covers {} of {} operators",
                order.len(),
                g.op_count()
            )));
        }
        let alloc = allocate_streams(g, &order, platform.streams, &time);
        let (events, cross) = alloc.events(g);
        let mut extra = serde_json::Map::new();
        extra.insert("streams".into(), alloc.streams.len().into());
        extra.insert("events".into(), events.into());
        extra.insert("cross_stream_edges".into(), cross.into());
        extra.insert("memory_ops".into(), memory_ops.into());
        extra.insert(
            "compute_ops".into(),
            (g.op_count() as u64 - memory_ops).into(),
        );
        extra.insert("capped_ops".into(), alloc.capped.into());
        tracing::debug!(
            model = %g.name,
            ops = g.op_count(),
            streams = alloc.streams.len(),
            events,
            "opara schedule"
        );
        let schedule = Schedule::Streams(StreamPlan {
            gpus: vec![GpuStreams {
                streams: alloc.streams,
                launch_order: Some(order),
            }],
        });
        let stats = SchedulerStats {
            wall_ms: start.elapsed().as_secs_f64() * 1e3,
            states: g.op_count() as u64,
            transitions: g.edge_count() as u64,
            cost_queries: queries,
            extra,
        };
        Ok((schedule, stats))
    }
}
