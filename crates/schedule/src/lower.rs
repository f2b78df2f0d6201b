//! Lowering of stage plans and stream plans to launch plans.
//!
//! A [`LaunchPlan`] is what the simulator ([`crate::simulate()`]) and the GPU runtime execute:
//! per GPU, per stream, an ordered list of [`Cmd`]s. Lowering is deterministic.
//!
//! ## Stage plans
//! On GPU `g`, the plan uses as many streams as the widest stage of `g` has groups (a merge
//! stage counts as one). Stage `s` (its index on `g`):
//! - group `j` runs on stream `j` as one `Cmd::Launch { op, stage: Some(s) }` per operator, in
//!   group order; a merge stage is one `Cmd::LaunchMerged { ops, stage: Some(s) }` on stream 0;
//! - between consecutive (non-empty) stages `s` and `s + 1` there is a barrier, built from
//!   events so that a real runtime gets the same ordering: every stream `j > 0` used by stage
//!   `s` records an event, stream 0 waits for all of them (join); then, if stage `s + 1` uses
//!   any stream `j > 0`, stream 0 records a barrier event and every such stream waits for it
//!   (fork). Stream 0 runs every stage's group 0, so it needs no event of its own. (A barrier
//!   event that nobody would wait for is not emitted.)
//! - A dependency `u -> v` between operators on different GPUs `a -> b` becomes one transfer:
//!   `Cmd::Send { xfer, src: u, dst: v, dst_gpu: b }` right after `u`'s launch on `u`'s stream,
//!   and `Cmd::Recv(xfer)` on `v`'s stream of GPU `b`. For stage plans the receives of all the
//!   operators a stream runs in a stage come right before that stream's first launch of the
//!   stage (after the barrier waits), so the stage starts once all its inputs have arrived.
//!
//! ## Stream plans
//! Streams are taken as given, each running its operators in the given order as
//! `Cmd::Launch { op, stage: None }`. For a dependency `u -> v`:
//! - same GPU, same stream: the stream order is enough;
//! - same GPU, different streams: `u`'s stream records an event right after `u` (one event per
//!   producer, shared by all its consumers on other streams) and `v`'s stream waits for it
//!   right before `v`;
//! - different GPUs: a transfer as for stage plans, the `Recv` right before `v`.
//!
//! Before an operator come its waits, then its receives; after it come its event record, then
//! its sends. A stream plan's `launch_order` (the host's enqueue order) does not change the
//! launch plan: the launch plan fixes the order per stream and the synchronisation between
//! streams, which is all the simulator looks at; the runtime uses the launch order itself.
//!
//! ## Launch order
//! [`LaunchPlan::launch_order`] is the order in which a host issues the launches: stage by
//! stage for stage plans (topological within a stage), a stream plan's own `launch_order`
//! where it has one (else topological). [`crate::host::HostProgram`] merges the streams in
//! this order.
//!
//! Transfers and events are numbered in the order their producers appear in the schedule
//! (GPU by GPU, stage by stage or stream by stream). [`LaunchPlan::events`] and
//! [`LaunchPlan::transfers`] are set to the counts.
//!
//! Lowering does not validate the schedule (see [`crate::validate()`]); it only refuses what
//! it cannot lower: an operator id outside the graph, an operator placed twice, or more stages
//! than fit in a `u32`. Dependencies on operators the schedule lacks (and on graph inputs) are
//! ignored.

use opsched_graph::{Graph, NodeId};

use crate::{
    Cmd, EventId, GpuLaunch, LaunchPlan, Schedule, ScheduleError, StagePlan, StageStrategy,
    StreamPlan, TransferId,
};

/// A readable name for an operator id: `'name'` if it is in the graph, `#index` otherwise.
pub(crate) fn op_name(g: &Graph, op: NodeId) -> String {
    match g.nodes().get(op.index()) {
        Some(n) => format!("'{}'", n.name),
        None => format!("#{}", op.0),
    }
}

/// Where an operator runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Loc {
    gpu: usize,
    stream: usize,
}

/// Operator locations, refusing unknown and repeated operators.
struct Placement {
    loc: Vec<Option<Loc>>,
    /// Operators in schedule order.
    order: Vec<NodeId>,
}

impl Placement {
    fn new(g: &Graph) -> Self {
        Placement {
            loc: vec![None; g.len()],
            order: Vec::new(),
        }
    }

    fn place(&mut self, g: &Graph, op: NodeId, loc: Loc) -> Result<(), ScheduleError> {
        match self.loc.get_mut(op.index()) {
            None => Err(ScheduleError::Invalid(format!(
                "operator #{} does not exist (the graph has {} nodes)",
                op.0,
                g.len()
            ))),
            Some(Some(_)) => Err(ScheduleError::Invalid(format!(
                "operator {} is scheduled more than once",
                op_name(g, op)
            ))),
            Some(slot) => {
                *slot = Some(loc);
                self.order.push(op);
                Ok(())
            }
        }
    }

    fn get(&self, op: NodeId) -> Option<Loc> {
        self.loc.get(op.index()).copied().flatten()
    }
}

/// The transfers of all cross-GPU dependencies.
struct Transfers {
    /// Per producer: (consumer, consumer's GPU, transfer).
    out: Vec<Vec<(NodeId, usize, TransferId)>>,
    /// Per consumer: its incoming transfers.
    inc: Vec<Vec<TransferId>>,
    count: u32,
}

fn sorted_succs(g: &Graph, op: NodeId) -> Vec<NodeId> {
    let mut v: Vec<NodeId> = g.succs(op).collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn sorted_preds(g: &Graph, op: NodeId) -> Vec<NodeId> {
    let mut v: Vec<NodeId> = g.preds(op).collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn too_many(what: &str) -> ScheduleError {
    ScheduleError::Config(format!("too many {what} for a launch plan (at most 2^32)"))
}

fn plan_transfers(g: &Graph, pl: &Placement) -> Result<Transfers, ScheduleError> {
    let mut t = Transfers {
        out: vec![Vec::new(); g.len()],
        inc: vec![Vec::new(); g.len()],
        count: 0,
    };
    for &u in &pl.order {
        let Some(lu) = pl.get(u) else { continue };
        for v in sorted_succs(g, u) {
            let Some(lv) = pl.get(v) else { continue };
            if lv.gpu != lu.gpu {
                let x = TransferId(t.count);
                t.count = t
                    .count
                    .checked_add(1)
                    .ok_or_else(|| too_many("transfers"))?;
                t.out[u.index()].push((v, lv.gpu, x));
                t.inc[v.index()].push(x);
            }
        }
    }
    Ok(t)
}

fn push_sends(cmds: &mut Vec<Cmd>, t: &Transfers, u: NodeId) {
    if let Some(out) = t.out.get(u.index()) {
        for &(v, gpu, x) in out {
            cmds.push(Cmd::Send {
                xfer: x,
                src: u,
                dst: v,
                dst_gpu: gpu,
            });
        }
    }
}

fn push_recvs(cmds: &mut Vec<Cmd>, t: &Transfers, v: NodeId) {
    if let Some(inc) = t.inc.get(v.index()) {
        cmds.extend(inc.iter().map(|&x| Cmd::Recv(x)));
    }
}

struct Events(u32);

impl Events {
    fn fresh(&mut self) -> Result<EventId, ScheduleError> {
        let e = EventId(self.0);
        self.0 = self.0.checked_add(1).ok_or_else(|| too_many("events"))?;
        Ok(e)
    }
}

/// Lower a schedule to the launch plan the simulator and the runtime execute (see the module
/// docs for the exact shape).
pub fn lower(g: &Graph, s: &Schedule) -> Result<LaunchPlan, ScheduleError> {
    match s {
        Schedule::Stages(p) => lower_stages(g, p),
        Schedule::Streams(p) => lower_streams(g, p),
    }
}

/// The streams a stage uses (indices of its non-empty groups; stream 0 for a merge stage).
fn used_streams(stage: &crate::Stage) -> Vec<usize> {
    match stage.strategy {
        StageStrategy::Merge => {
            if stage.ops().next().is_some() {
                vec![0]
            } else {
                Vec::new()
            }
        }
        StageStrategy::Concurrent => stage
            .groups
            .iter()
            .enumerate()
            .filter(|(_, grp)| !grp.is_empty())
            .map(|(j, _)| j)
            .collect(),
    }
}

fn lower_stages(g: &Graph, p: &StagePlan) -> Result<LaunchPlan, ScheduleError> {
    let mut pl = Placement::new(g);
    for (gpu, stages) in p.gpus.iter().enumerate() {
        for stage in stages {
            match stage.strategy {
                StageStrategy::Merge => {
                    for op in stage.ops() {
                        pl.place(g, op, Loc { gpu, stream: 0 })?;
                    }
                }
                StageStrategy::Concurrent => {
                    for (j, grp) in stage.groups.iter().enumerate() {
                        for &op in grp {
                            pl.place(g, op, Loc { gpu, stream: j })?;
                        }
                    }
                }
            }
        }
    }
    let t = plan_transfers(g, &pl)?;
    let mut ev = Events(0);
    let mut gpus = Vec::with_capacity(p.gpus.len());
    for stages in &p.gpus {
        let width = stages
            .iter()
            .filter_map(|st| used_streams(st).last().map(|&j| j + 1))
            .max()
            .unwrap_or(0);
        let mut streams: Vec<Vec<Cmd>> = vec![Vec::new(); width];
        let mut prev_used: Option<Vec<usize>> = None;
        for (si, stage) in stages.iter().enumerate() {
            let used = used_streams(stage);
            if used.is_empty() {
                continue;
            }
            let s = u32::try_from(si).map_err(|_| too_many("stages"))?;
            if let Some(prev) = &prev_used {
                // Join the previous stage's streams into stream 0 ...
                for &j in prev.iter().filter(|&&j| j > 0) {
                    let e = ev.fresh()?;
                    streams[j].push(Cmd::Record(e));
                    streams[0].push(Cmd::Wait(e));
                }
                // ... and fork this stage's streams from it.
                if used.iter().any(|&j| j > 0) {
                    let b = ev.fresh()?;
                    streams[0].push(Cmd::Record(b));
                    for &j in used.iter().filter(|&&j| j > 0) {
                        streams[j].push(Cmd::Wait(b));
                    }
                }
            }
            match stage.strategy {
                StageStrategy::Merge => {
                    let ops: Vec<NodeId> = stage.ops().collect();
                    let cmds = &mut streams[0];
                    for &v in &ops {
                        push_recvs(cmds, &t, v);
                    }
                    cmds.push(Cmd::LaunchMerged {
                        ops: ops.clone(),
                        stage: Some(s),
                    });
                    for &u in &ops {
                        push_sends(cmds, &t, u);
                    }
                }
                StageStrategy::Concurrent => {
                    for (j, grp) in stage.groups.iter().enumerate() {
                        let cmds = &mut streams[j];
                        for &v in grp {
                            push_recvs(cmds, &t, v);
                        }
                        for &u in grp {
                            cmds.push(Cmd::Launch {
                                op: u,
                                stage: Some(s),
                            });
                            push_sends(cmds, &t, u);
                        }
                    }
                }
            }
            prev_used = Some(used);
        }
        gpus.push(GpuLaunch { streams });
    }
    // Stage by stage (on every GPU), topological within a stage.
    let mut stage_of = vec![u32::MAX; g.len()];
    for stages in &p.gpus {
        for (si, stage) in stages.iter().enumerate() {
            let s = u32::try_from(si).map_err(|_| too_many("stages"))?;
            for op in stage.ops() {
                stage_of[op.index()] = s;
            }
        }
    }
    let launch_order = order_by(g, &pl, |op| u64::from(stage_of[op.index()]));
    Ok(LaunchPlan {
        gpus,
        events: ev.0,
        transfers: t.count,
        launch_order,
    })
}

/// The placed operators sorted by `key`, ties in topological order.
fn order_by(g: &Graph, pl: &Placement, key: impl Fn(NodeId) -> u64) -> Vec<NodeId> {
    let mut v: Vec<(u64, usize, NodeId)> = g
        .topo_order()
        .iter()
        .enumerate()
        .filter(|(_, &op)| pl.get(op).is_some())
        .map(|(i, &op)| (key(op), i, op))
        .collect();
    v.sort_unstable();
    v.into_iter().map(|(_, _, op)| op).collect()
}

fn lower_streams(g: &Graph, p: &StreamPlan) -> Result<LaunchPlan, ScheduleError> {
    let mut pl = Placement::new(g);
    for (gpu, gs) in p.gpus.iter().enumerate() {
        for (stream, ops) in gs.streams.iter().enumerate() {
            for &op in ops {
                pl.place(g, op, Loc { gpu, stream })?;
            }
        }
    }
    let t = plan_transfers(g, &pl)?;
    // One event per producer with a consumer on another stream of its GPU.
    let mut ev = Events(0);
    let mut event_of: Vec<Option<EventId>> = vec![None; g.len()];
    for &u in &pl.order {
        let Some(lu) = pl.get(u) else { continue };
        let needs = g.succs(u).any(|v| {
            pl.get(v)
                .is_some_and(|lv| lv.gpu == lu.gpu && lv.stream != lu.stream)
        });
        if needs {
            event_of[u.index()] = Some(ev.fresh()?);
        }
    }
    let mut gpus = Vec::with_capacity(p.gpus.len());
    for (gpu, gs) in p.gpus.iter().enumerate() {
        let mut streams = Vec::with_capacity(gs.streams.len());
        for (stream, ops) in gs.streams.iter().enumerate() {
            let mut cmds = Vec::with_capacity(ops.len() * 2);
            for &v in ops {
                for u in sorted_preds(g, v) {
                    if let (Some(lu), Some(e)) = (pl.get(u), event_of[u.index()]) {
                        if lu.gpu == gpu && lu.stream != stream {
                            cmds.push(Cmd::Wait(e));
                        }
                    }
                }
                push_recvs(&mut cmds, &t, v);
                cmds.push(Cmd::Launch { op: v, stage: None });
                if let Some(e) = event_of[v.index()] {
                    cmds.push(Cmd::Record(e));
                }
                push_sends(&mut cmds, &t, v);
            }
            streams.push(cmds);
        }
        gpus.push(GpuLaunch { streams });
    }
    // A GPU's explicit launch order where given (the k-th launches of all GPUs together),
    // else the topological order after them.
    let mut rank = vec![u64::MAX; g.len()];
    for gs in &p.gpus {
        for (k, op) in gs.launch_order.iter().flatten().enumerate() {
            if let Some(slot) = rank.get_mut(op.index()) {
                *slot = k as u64;
            }
        }
    }
    let launch_order = order_by(g, &pl, |op| rank[op.index()]);
    Ok(LaunchPlan {
        gpus,
        events: ev.0,
        transfers: t.count,
        launch_order,
    })
}
