//! The host program: a launch plan merged into the one sequence of commands a host issues.
//!
//! A launch plan fixes, per GPU and stream, the order of commands and the events between
//! streams. A device needs one more thing: the host must issue every `Record(e)` before any
//! `Wait(e)` (on CUDA, a wait on an event not yet recorded is a no-op), and every `Send` before
//! its `Recv`. [`HostProgram::new`] merges the streams into such a host order:
//! - commands that only synchronise (record, wait, send, recv) are issued as soon as they are
//!   enabled;
//! - among the streams whose next command is a launch, the operator earliest in the plan's
//!   [`LaunchPlan::launch_order`] goes first (Opara's launch order, else stage by stage, else
//!   the topological order; see [`crate::lower()`]), so the host issues concurrent operators as
//!   early as it can.
//!
//! While merging, a vector clock per stream records what each stream is already ordered
//! after. It serves two purposes:
//! 1. **Completeness**: before each launch of `v`, every producer `u` of `v` must be ordered
//!    before it: same stream and earlier, or covered by the clock through a chain of records,
//!    waits and transfers. Otherwise [`ScheduleError::Invalid`] names both operators. This is
//!    the one dependency check of launch plans ([`crate::validate::validate_launch`] uses it).
//! 2. **Minimality**: a `Wait(e)` that the stream's clock already covers (it is implied by
//!    earlier waits) is dropped, and so is a `Record(e)` nobody waits for any more.
//!
//! A plan whose streams wait for each other in a cycle cannot be merged: the error names the
//! command each stream is stuck at.

use opsched_graph::{Graph, NodeId};
use serde::Serialize;

use crate::lower::op_name;
use crate::{Cmd, LaunchPlan, ScheduleError};

/// One command of the host sequence. `gpu` is a (logical) GPU of the plan, `stream` its
/// stream index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum HostCmd {
    /// Run operators (one, or the operators of a merged stage one after another).
    Launch {
        gpu: usize,
        stream: usize,
        ops: Vec<NodeId>,
    },
    Record {
        gpu: usize,
        stream: usize,
        event: u32,
    },
    Wait {
        gpu: usize,
        stream: usize,
        event: u32,
    },
    /// The transfer's source is ready on this stream: mark it and start the copy.
    Send {
        gpu: usize,
        stream: usize,
        xfer: u32,
    },
    /// This stream waits until the transfer has arrived.
    Recv {
        gpu: usize,
        stream: usize,
        xfer: u32,
    },
}

/// A transfer of the plan: `src`'s output goes from `src_gpu` to `dst_gpu` for `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Transfer {
    pub src: NodeId,
    pub dst: NodeId,
    pub src_gpu: usize,
    pub dst_gpu: usize,
}

/// What a runtime executes: the host order and everything it needs from the plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct HostProgram {
    pub cmds: Vec<HostCmd>,
    /// Streams per GPU.
    pub streams: Vec<usize>,
    /// Per node: (GPU, stream) of an operator the plan launches.
    pub placement: Vec<Option<(usize, usize)>>,
    /// Per transfer id.
    pub transfers: Vec<Transfer>,
    /// Number of events of the plan (ids `0..events`).
    pub events: u32,
    /// Waits the plan had, and the ones dropped as implied by others.
    pub waits_in_plan: usize,
    pub waits_dropped: usize,
    /// Every command of the plan (dropped ones included) in the order the host reaches it:
    /// what the simulator's eager mode charges host time in.
    pub issue_order: Vec<HostStep>,
}

/// One command of a launch plan: command `index` of stream `stream` of GPU `gpu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct HostStep {
    pub gpu: usize,
    pub stream: usize,
    pub index: usize,
}

/// Counts of a host program's commands by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HostCounts {
    pub launches: usize,
    pub records: usize,
    pub waits: usize,
    pub sends: usize,
    pub recvs: usize,
}

fn invalid(m: impl Into<String>) -> ScheduleError {
    ScheduleError::Invalid(m.into())
}

/// The streams of a plan, flattened: (gpu, stream, commands).
pub(crate) type Flat<'p> = Vec<(usize, usize, &'p [Cmd])>;

impl HostProgram {
    /// Check `plan` against `g` and merge it into a host order (see the module docs).
    pub fn new(g: &Graph, plan: &LaunchPlan) -> Result<HostProgram, ScheduleError> {
        check_plan(g, plan, |_| Ok(()))
    }

    /// Number of GPUs.
    pub fn gpus(&self) -> usize {
        self.streams.len()
    }

    /// The operators a stream launches, in order.
    pub fn ops_on(&self, gpu: usize, stream: usize) -> Vec<NodeId> {
        self.cmds
            .iter()
            .filter_map(|c| match c {
                HostCmd::Launch {
                    gpu: g,
                    stream: s,
                    ops,
                } if *g == gpu && *s == stream => Some(ops.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// Per node, the GPU of an operator.
    pub fn gpu_of(&self) -> Vec<Option<usize>> {
        self.placement.iter().map(|p| p.map(|(g, _)| g)).collect()
    }

    /// Every launch in host order: its GPU, stream and operators (several for a merged
    /// stage).
    pub fn launches(&self) -> impl Iterator<Item = (usize, usize, &[NodeId])> {
        self.cmds.iter().filter_map(|c| match c {
            HostCmd::Launch { gpu, stream, ops } => Some((*gpu, *stream, ops.as_slice())),
            _ => None,
        })
    }

    /// The operators of each merged launch (a merged stage's), in launch order.
    pub fn merged_launches(&self) -> Vec<Vec<NodeId>> {
        self.launches()
            .filter(|(.., ops)| ops.len() > 1)
            .map(|(.., ops)| ops.to_vec())
            .collect()
    }

    /// Counts by kind.
    pub fn counts(&self) -> HostCounts {
        let mut c = HostCounts::default();
        for cmd in &self.cmds {
            match cmd {
                HostCmd::Launch { .. } => c.launches += 1,
                HostCmd::Record { .. } => c.records += 1,
                HostCmd::Wait { .. } => c.waits += 1,
                HostCmd::Send { .. } => c.sends += 1,
                HostCmd::Recv { .. } => c.recvs += 1,
            }
        }
        c
    }
}

/// Which operators of a host program finish before which start, in every execution (streams
/// run concurrently; only stream order, events and transfers order work across them): what
/// decides whether two buffers may share memory.
#[derive(Clone, Debug, Default)]
pub struct OpOrder {
    /// Per node: (flat stream, its launch count on that stream, the stream's vector clock at
    /// the launch).
    at: Vec<Option<(usize, usize, Vec<usize>)>>,
}

impl OpOrder {
    /// `a` finishes before `b` starts (false for `a == b` and for operators not launched).
    pub fn before(&self, a: NodeId, b: NodeId) -> bool {
        match (self.at.get(a.index()), self.at.get(b.index())) {
            (Some(Some((sa, ta, _))), Some(Some((_, _, cb)))) if a != b => {
                cb.get(*sa).is_some_and(|t| t >= ta)
            }
            _ => false,
        }
    }
}

impl HostProgram {
    /// The order of its operators (see [`OpOrder`]), for a graph of `nodes` nodes.
    pub fn op_order(&self, nodes: usize) -> OpOrder {
        let mut first = Vec::with_capacity(self.streams.len());
        let mut total = 0;
        for &n in &self.streams {
            first.push(total);
            total += n;
        }
        let flat = |gpu: usize, stream: usize| first.get(gpu).map_or(usize::MAX, |f| f + stream);
        let mut clock = vec![vec![0usize; total]; total];
        let mut recorded: Vec<Option<Vec<usize>>> = vec![None; self.events as usize];
        let mut sent: Vec<Option<Vec<usize>>> = vec![None; self.transfers.len()];
        let mut at = vec![None; nodes];
        for cmd in &self.cmds {
            // A record or send publishes its stream's clock; a wait or receive joins it.
            let (gpu, stream, slot, publish) = match cmd {
                HostCmd::Launch { gpu, stream, ops } => {
                    let s = flat(*gpu, *stream);
                    let Some(c) = clock.get_mut(s) else { continue };
                    for op in ops {
                        c[s] += 1;
                        if let Some(slot) = at.get_mut(op.index()) {
                            *slot = Some((s, c[s], c.clone()));
                        }
                    }
                    continue;
                }
                HostCmd::Record { gpu, stream, event } => {
                    (gpu, stream, recorded.get_mut(*event as usize), true)
                }
                HostCmd::Wait { gpu, stream, event } => {
                    (gpu, stream, recorded.get_mut(*event as usize), false)
                }
                HostCmd::Send { gpu, stream, xfer } => {
                    (gpu, stream, sent.get_mut(*xfer as usize), true)
                }
                HostCmd::Recv { gpu, stream, xfer } => {
                    (gpu, stream, sent.get_mut(*xfer as usize), false)
                }
            };
            let (Some(c), Some(slot)) = (clock.get_mut(flat(*gpu, *stream)), slot) else {
                continue;
            };
            match (publish, slot) {
                (true, slot) => *slot = Some(c.clone()),
                (false, Some(seen)) => join(c, seen),
                (false, None) => {}
            }
        }
        OpOrder { at }
    }
}

/// The structural checks, then `extra` (the validator's wait-cycle check, which needs a
/// structurally sound plan), then the merge.
pub(crate) fn check_plan(
    g: &Graph,
    plan: &LaunchPlan,
    extra: impl FnOnce(&Flat<'_>) -> Result<(), ScheduleError>,
) -> Result<HostProgram, ScheduleError> {
    let mut streams = Vec::with_capacity(plan.gpus.len());
    let mut flat: Flat<'_> = Vec::new();
    for (gi, gl) in plan.gpus.iter().enumerate() {
        streams.push(gl.streams.len());
        for (si, s) in gl.streams.iter().enumerate() {
            flat.push((gi, si, s.as_slice()));
        }
    }
    let (placement, transfers) = check_structure(g, plan, &flat)?;
    extra(&flat)?;
    let rank = launch_rank(g, plan);
    let merged = merge(g, plan, &flat, &placement, &rank)?;
    Ok(HostProgram {
        cmds: merged.cmds,
        streams,
        placement,
        transfers,
        events: plan.events,
        waits_in_plan: merged.waits_in_plan,
        waits_dropped: merged.waits_dropped,
        issue_order: merged.issue_order,
    })
}

/// Per node, its position in the plan's launch order (missing operators come last, in
/// topological order).
fn launch_rank(g: &Graph, plan: &LaunchPlan) -> Vec<u64> {
    let mut rank = vec![u64::MAX; g.len()];
    for (i, &id) in g.topo_order().iter().enumerate() {
        rank[id.index()] = (1u64 << 40) + i as u64;
    }
    for (k, op) in plan.launch_order.iter().enumerate() {
        if let Some(slot) = rank.get_mut(op.index()) {
            *slot = k as u64;
        }
    }
    rank
}

/// Operators, events and transfers of `plan` are consistent with `g` and each other: every
/// operator of `g` launched exactly once (never a graph input), every waited event recorded
/// exactly once and on the waiting GPU, every transfer sent once (right after its source on
/// the source's stream, to the GPU its consumer runs on) and received once there. Returns the
/// placement and the transfers.
#[allow(clippy::type_complexity)]
fn check_structure(
    g: &Graph,
    plan: &LaunchPlan,
    flat: &Flat<'_>,
) -> Result<(Vec<Option<(usize, usize)>>, Vec<Transfer>), ScheduleError> {
    let nev = plan.events as usize;
    let nx = plan.transfers as usize;
    let mut placement: Vec<Option<(usize, usize)>> = vec![None; g.len()];
    let mut recorded: Vec<Option<usize>> = vec![None; nev];
    let mut sends: Vec<Option<Transfer>> = vec![None; nx];
    let mut recvs: Vec<Option<usize>> = vec![None; nx];
    let here = |gi: usize, si: usize, k: usize| format!("GPU {gi} stream {si} command {k}");
    for &(gi, si, cmds) in flat {
        for (k, c) in cmds.iter().enumerate() {
            let event = |e: u32| -> Result<usize, ScheduleError> {
                let i = e as usize;
                if i >= nev {
                    return Err(invalid(format!(
                        "{}: event {i} is out of range (the plan has {nev})",
                        here(gi, si, k)
                    )));
                }
                Ok(i)
            };
            let xfer = |x: u32| -> Result<usize, ScheduleError> {
                let i = x as usize;
                if i >= nx {
                    return Err(invalid(format!(
                        "{}: transfer {i} is out of range (the plan has {nx})",
                        here(gi, si, k)
                    )));
                }
                Ok(i)
            };
            match c {
                Cmd::Launch { op, .. } => {
                    place(g, &mut placement, *op, gi, si, &|| here(gi, si, k))?
                }
                Cmd::LaunchMerged { ops, .. } => {
                    if ops.is_empty() {
                        return Err(invalid(format!(
                            "{}: merged launch without operators",
                            here(gi, si, k)
                        )));
                    }
                    for op in ops {
                        place(g, &mut placement, *op, gi, si, &|| here(gi, si, k))?;
                    }
                }
                Cmd::Record(e) => {
                    let i = event(e.0)?;
                    if recorded[i].replace(gi).is_some() {
                        return Err(invalid(format!(
                            "{}: event {i} is recorded twice",
                            here(gi, si, k)
                        )));
                    }
                }
                Cmd::Wait(e) => {
                    event(e.0)?;
                }
                Cmd::Send {
                    xfer: x,
                    src,
                    dst,
                    dst_gpu,
                } => {
                    let i = xfer(x.0)?;
                    if sends[i].is_some() {
                        return Err(invalid(format!(
                            "{}: transfer {i} is sent twice",
                            here(gi, si, k)
                        )));
                    }
                    if *dst_gpu >= plan.gpus.len() || *dst_gpu == gi {
                        return Err(invalid(format!(
                            "{}: transfer {i} ({} -> {}) goes from GPU {gi} to GPU {dst_gpu} \
                             (the plan has {} GPU(s))",
                            here(gi, si, k),
                            op_name(g, *src),
                            op_name(g, *dst),
                            plan.gpus.len()
                        )));
                    }
                    let follows_src = cmds[..k].iter().any(|p| match p {
                        Cmd::Launch { op, .. } => op == src,
                        Cmd::LaunchMerged { ops, .. } => ops.contains(src),
                        _ => false,
                    });
                    if !follows_src {
                        return Err(invalid(format!(
                            "{}: transfer {i} does not follow the launch of {} on its stream",
                            here(gi, si, k),
                            op_name(g, *src)
                        )));
                    }
                    sends[i] = Some(Transfer {
                        src: *src,
                        dst: *dst,
                        src_gpu: gi,
                        dst_gpu: *dst_gpu,
                    });
                }
                Cmd::Recv(x) => {
                    let i = xfer(x.0)?;
                    if recvs[i].replace(gi).is_some() {
                        return Err(invalid(format!(
                            "{}: transfer {i} is received twice",
                            here(gi, si, k)
                        )));
                    }
                }
            }
        }
    }
    if let Some(o) = g.ops().find(|o| placement[o.index()].is_none()) {
        return Err(invalid(format!(
            "operator {} is never launched",
            op_name(g, o)
        )));
    }
    for &(gi, si, cmds) in flat {
        for (k, c) in cmds.iter().enumerate() {
            if let Cmd::Wait(e) = c {
                match recorded[e.0 as usize] {
                    None => {
                        return Err(invalid(format!(
                            "{}: event {} is waited for but never recorded",
                            here(gi, si, k),
                            e.0
                        )))
                    }
                    Some(r) if r != gi => {
                        return Err(invalid(format!(
                            "{}: event {} is recorded on GPU {r}, not on the waiting GPU",
                            here(gi, si, k),
                            e.0
                        )))
                    }
                    Some(_) => {}
                }
            }
        }
    }
    let mut transfers = Vec::with_capacity(nx);
    for (x, t) in sends.iter().enumerate() {
        let t = t.ok_or_else(|| {
            invalid(if recvs[x].is_some() {
                format!("transfer {x} is received but never sent")
            } else {
                format!("transfer {x} is never sent")
            })
        })?;
        match recvs[x] {
            Some(gpu) if gpu == t.dst_gpu => {}
            Some(gpu) => {
                return Err(invalid(format!(
                    "transfer {x} ({} -> {}) is sent to GPU {} but received on GPU {gpu}",
                    op_name(g, t.src),
                    op_name(g, t.dst),
                    t.dst_gpu
                )))
            }
            None => return Err(invalid(format!("transfer {x} is never received"))),
        }
        if placement[t.dst.index()].map(|p| p.0) != Some(t.dst_gpu) {
            return Err(invalid(format!(
                "transfer {x} goes to GPU {} but {} does not run there",
                t.dst_gpu,
                op_name(g, t.dst)
            )));
        }
        transfers.push(t);
    }
    Ok((placement, transfers))
}

fn place(
    g: &Graph,
    placement: &mut [Option<(usize, usize)>],
    op: NodeId,
    gpu: usize,
    stream: usize,
    here: &dyn Fn() -> String,
) -> Result<(), ScheduleError> {
    let slot = placement.get_mut(op.index()).ok_or_else(|| {
        invalid(format!(
            "{}: operator #{} does not exist (the graph has {} nodes)",
            here(),
            op.0,
            g.len()
        ))
    })?;
    if g.node(op).op.is_input() {
        return Err(invalid(format!(
            "{}: {} is a graph input, not an operator",
            here(),
            op_name(g, op)
        )));
    }
    if slot.replace((gpu, stream)).is_some() {
        return Err(invalid(format!(
            "operator {} is launched more than once",
            op_name(g, op)
        )));
    }
    Ok(())
}

/// The clock a record or send at command `pos` of stream `s` publishes: the stream's clock
/// with that command included.
fn mark(clock: &[usize], s: usize, pos: usize) -> Vec<usize> {
    let mut v = clock.to_vec();
    v[s] = pos + 1;
    v
}

/// A wait or receive: the stream now follows everything `seen` orders.
fn join(clock: &mut [usize], seen: &[usize]) {
    for (c, a) in clock.iter_mut().zip(seen) {
        *c = (*c).max(*a);
    }
}

struct Merged {
    cmds: Vec<HostCmd>,
    issue_order: Vec<HostStep>,
    waits_in_plan: usize,
    waits_dropped: usize,
}

/// The merge with vector clocks (see the module docs). `clock[s][t]` counts the commands of
/// stream `t` ordered before the current point of stream `s`.
fn merge(
    g: &Graph,
    plan: &LaunchPlan,
    flat: &Flat<'_>,
    placement: &[Option<(usize, usize)>],
    rank: &[u64],
) -> Result<Merged, ScheduleError> {
    let ns = flat.len();
    let nev = plan.events as usize;
    let nx = plan.transfers as usize;
    let mut pos = vec![0usize; ns];
    let mut clock = vec![vec![0usize; ns]; ns];
    let mut ev_clock: Vec<Option<Vec<usize>>> = vec![None; nev];
    let mut x_clock: Vec<Option<Vec<usize>>> = vec![None; nx];
    // (flat stream, index) of each operator's launch.
    let mut at: Vec<Option<(usize, usize)>> = vec![None; g.len()];
    let mut out: Vec<HostCmd> = Vec::new();
    let mut issue_order: Vec<HostStep> = Vec::with_capacity(
        plan.gpus
            .iter()
            .flat_map(|g| &g.streams)
            .map(Vec::len)
            .sum(),
    );
    let mut waits_in_plan = 0;
    let mut dropped = 0;
    let total: usize = flat.iter().map(|f| f.2.len()).sum();
    let mut done = 0;
    while done < total {
        let mut progressed = false;
        // Synchronisation commands first, as soon as they are enabled.
        for s in 0..ns {
            let (gpu, stream, cmds) = flat[s];
            while let Some(c) = cmds.get(pos[s]) {
                match c {
                    Cmd::Record(e) => {
                        ev_clock[e.0 as usize] = Some(mark(&clock[s], s, pos[s]));
                        out.push(HostCmd::Record {
                            gpu,
                            stream,
                            event: e.0,
                        });
                    }
                    Cmd::Wait(e) => {
                        let Some(v) = &ev_clock[e.0 as usize] else {
                            break;
                        };
                        waits_in_plan += 1;
                        if v.iter().zip(&clock[s]).all(|(a, b)| a <= b) {
                            dropped += 1;
                        } else {
                            join(&mut clock[s], v);
                            out.push(HostCmd::Wait {
                                gpu,
                                stream,
                                event: e.0,
                            });
                        }
                    }
                    Cmd::Send { xfer, .. } => {
                        x_clock[xfer.0 as usize] = Some(mark(&clock[s], s, pos[s]));
                        out.push(HostCmd::Send {
                            gpu,
                            stream,
                            xfer: xfer.0,
                        });
                    }
                    Cmd::Recv(x) => {
                        let Some(v) = &x_clock[x.0 as usize] else {
                            break;
                        };
                        join(&mut clock[s], v);
                        out.push(HostCmd::Recv {
                            gpu,
                            stream,
                            xfer: x.0,
                        });
                    }
                    Cmd::Launch { .. } | Cmd::LaunchMerged { .. } => break,
                }
                issue_order.push(HostStep {
                    gpu,
                    stream,
                    index: pos[s],
                });
                pos[s] += 1;
                done += 1;
                progressed = true;
            }
        }
        // Then the launch earliest in the launch order.
        let best = (0..ns)
            .filter_map(|s| {
                let ops: &[NodeId] = match flat[s].2.get(pos[s])? {
                    Cmd::Launch { op, .. } => std::slice::from_ref(op),
                    Cmd::LaunchMerged { ops, .. } => ops,
                    _ => return None,
                };
                let r = ops
                    .iter()
                    .map(|o| rank[o.index()])
                    .min()
                    .unwrap_or(u64::MAX);
                Some((r, s, ops))
            })
            .min_by_key(|(r, s, _)| (*r, *s));
        if let Some((_, s, ops)) = best {
            let (gpu, stream, _) = flat[s];
            for &v in ops {
                for u in g.preds(v) {
                    if g.node(u).op.is_input() {
                        continue;
                    }
                    let covered = match at[u.index()] {
                        Some((t, i)) if t == s => i < pos[s],
                        Some((t, i)) => clock[s][t] > i,
                        None => false,
                    };
                    if !covered {
                        let cross = placement[u.index()].map(|p| p.0) != Some(gpu);
                        return Err(invalid(format!(
                            "dependency {} -> {} is not ordered by the launch plan: {} (GPU \
                             {gpu}, stream {stream}) can start before {} ends{}",
                            op_name(g, u),
                            op_name(g, v),
                            op_name(g, v),
                            op_name(g, u),
                            if cross {
                                " on another GPU (no transfer brings it)"
                            } else {
                                " (no wait orders them)"
                            }
                        )));
                    }
                }
            }
            for &v in ops {
                at[v.index()] = Some((s, pos[s]));
            }
            out.push(HostCmd::Launch {
                gpu,
                stream,
                ops: ops.to_vec(),
            });
            issue_order.push(HostStep {
                gpu,
                stream,
                index: pos[s],
            });
            pos[s] += 1;
            done += 1;
            progressed = true;
        }
        if !progressed {
            let stuck: Vec<String> = (0..ns)
                .filter_map(|s| {
                    let (gpu, stream, cmds) = flat[s];
                    cmds.get(pos[s])
                        .map(|c| format!("GPU {gpu} stream {stream} at {}", describe(g, c)))
                })
                .collect();
            return Err(ScheduleError::Deadlock(format!(
                "the launch plan's streams wait for each other: {}",
                stuck.join("; ")
            )));
        }
    }
    // Drop records nobody waits for any more.
    let mut still_waited = vec![false; nev];
    for c in &out {
        if let HostCmd::Wait { event, .. } = c {
            still_waited[*event as usize] = true;
        }
    }
    out.retain(|c| !matches!(c, HostCmd::Record { event, .. } if !still_waited[*event as usize]));
    Ok(Merged {
        cmds: out,
        issue_order,
        waits_in_plan,
        waits_dropped: dropped,
    })
}

fn describe(g: &Graph, c: &Cmd) -> String {
    match c {
        Cmd::Launch { op, .. } => format!("launch {}", op_name(g, *op)),
        Cmd::LaunchMerged { ops, .. } => format!("merged launch of {} operators", ops.len()),
        Cmd::Record(e) => format!("record event {}", e.0),
        Cmd::Wait(e) => format!("wait for event {}", e.0),
        Cmd::Send { xfer, .. } => format!("send transfer {}", xfer.0),
        Cmd::Recv(x) => format!("receive transfer {}", x.0),
    }
}
