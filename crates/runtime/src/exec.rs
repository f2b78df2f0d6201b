//! The execution program: a launch plan turned into one host-side sequence of commands.
//!
//! A launch plan fixes, per GPU and stream, the order of commands and the events between
//! streams. CUDA needs one more thing: the host must enqueue every `Record(e)` before any
//! `Wait(e)` (a wait on an event not yet recorded is a no-op), and every `Send` before its
//! `Recv`. [`ExecProgram::new`] merges the streams into such a host order:
//! - commands that only synchronise (record, wait, send, recv) are enqueued as soon as they
//!   are enabled;
//! - among the streams whose next command is a launch, the operator with the smallest
//!   priority goes first: the stream plan's host launch order (Opara) when given, else the
//!   stage index, else the topological position. Interleaving the streams this way lets the
//!   GPU start concurrent operators as early as the host can issue them.
//!
//! While merging, a vector clock per stream records what each stream is already ordered
//! after. It serves two purposes:
//! 1. **Completeness**: before each launch of `v`, every producer `u` of `v` (placed by the
//!    plan) must be ordered before it: same stream and earlier, or covered by the clock
//!    through a chain of records, waits and transfers. Otherwise [`RuntimeError::Plan`].
//! 2. **Minimality**: a `Wait(e)` that the stream's clock already covers (it is implied by
//!    earlier waits) is dropped, and so is a `Record(e)` nobody waits for any more.
//!
//! Logical GPUs map onto physical ones ([`map_gpus`]): several logical GPUs may share one
//! physical GPU (each keeps its own streams; transfers become device-to-device copies), so a
//! multi-GPU schedule can run on one GPU.

use std::collections::HashMap;

use opsched_graph::{Graph, NodeId};
use opsched_schedule::{Cmd, LaunchPlan, Schedule};

use crate::RuntimeError;

/// One command of the host sequence. `gpu` is a logical GPU, `stream` its stream index.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// The transfer's source is ready on this stream: record it and start the copy.
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

/// A transfer of the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    pub src: NodeId,
    pub dst: NodeId,
    pub src_gpu: usize,
    pub dst_gpu: usize,
}

/// What the runtime executes: the host order and everything derived from the plan.
#[derive(Clone, Debug, Default)]
pub struct ExecProgram {
    pub cmds: Vec<HostCmd>,
    /// Streams per logical GPU.
    pub streams: Vec<usize>,
    /// Per node: (logical GPU, stream) of an operator the plan launches.
    pub placement: Vec<Option<(usize, usize)>>,
    /// Per transfer id.
    pub transfers: Vec<Transfer>,
    /// Number of events of the plan (ids `0..events`).
    pub events: u32,
    /// Waits the plan had and the ones dropped as implied by others.
    pub waits_in_plan: usize,
    pub waits_dropped: usize,
}

/// Map `logical` GPUs onto `physical` ones round-robin (`l -> l % physical`).
pub fn map_gpus(logical: usize, physical: usize) -> Result<Vec<usize>, RuntimeError> {
    if physical == 0 {
        return Err(RuntimeError::Plan("no physical GPU to map onto".into()));
    }
    Ok((0..logical).map(|l| l % physical).collect())
}

/// The host launch order of a schedule: per operator a priority (smaller first). The schedule
/// layer owns the rule, so that the eager simulation issues in the same order.
pub fn priorities(g: &Graph, s: &Schedule) -> Vec<u64> {
    opsched_schedule::launch_priorities(g, s)
}

fn plan_err(m: impl Into<String>) -> RuntimeError {
    RuntimeError::Plan(m.into())
}

fn name(g: &Graph, op: NodeId) -> String {
    g.nodes()
        .get(op.index())
        .map_or_else(|| format!("#{}", op.0), |n| format!("'{}'", n.name))
}

impl ExecProgram {
    /// Merge `plan` into a host order (see the module docs). `priority[op]` orders launches
    /// (smaller first); missing entries count as last.
    pub fn new(
        g: &Graph,
        plan: &LaunchPlan,
        priority: &[u64],
    ) -> Result<ExecProgram, RuntimeError> {
        // Flatten streams.
        let mut base = Vec::with_capacity(plan.gpus.len());
        let mut streams = Vec::with_capacity(plan.gpus.len());
        let mut flat: Vec<(usize, usize, &[Cmd])> = Vec::new();
        for (gi, gl) in plan.gpus.iter().enumerate() {
            base.push(flat.len());
            streams.push(gl.streams.len());
            for (si, s) in gl.streams.iter().enumerate() {
                flat.push((gi, si, s.as_slice()));
            }
        }
        let ns = flat.len();
        let nev = plan.events as usize;
        let nx = plan.transfers as usize;
        // Placement, records, sends; consistency checks.
        let mut placement: Vec<Option<(usize, usize)>> = vec![None; g.len()];
        let mut recorded = vec![0usize; nev];
        let mut waited = vec![0usize; nev];
        let mut sends: Vec<Option<Transfer>> = vec![None; nx];
        let mut recvs = vec![None::<usize>; nx];
        for &(gi, si, cmds) in &flat {
            for c in cmds {
                match c {
                    Cmd::Launch { op, .. } => place(g, &mut placement, *op, gi, si)?,
                    Cmd::LaunchMerged { ops, .. } => {
                        for op in ops {
                            place(g, &mut placement, *op, gi, si)?;
                        }
                    }
                    Cmd::Record(e) => {
                        *recorded
                            .get_mut(e.0 as usize)
                            .ok_or_else(|| plan_err(format!("event {} out of range", e.0)))? += 1;
                    }
                    Cmd::Wait(e) => {
                        *waited
                            .get_mut(e.0 as usize)
                            .ok_or_else(|| plan_err(format!("event {} out of range", e.0)))? += 1;
                    }
                    Cmd::Send {
                        xfer,
                        src,
                        dst,
                        dst_gpu,
                    } => {
                        let slot = sends
                            .get_mut(xfer.0 as usize)
                            .ok_or_else(|| plan_err(format!("transfer {} out of range", xfer.0)))?;
                        if slot.is_some() {
                            return Err(plan_err(format!("transfer {} is sent twice", xfer.0)));
                        }
                        if *dst_gpu >= plan.gpus.len() || *dst_gpu == gi {
                            return Err(plan_err(format!(
                                "transfer {} goes from GPU {gi} to GPU {dst_gpu}",
                                xfer.0
                            )));
                        }
                        *slot = Some(Transfer {
                            src: *src,
                            dst: *dst,
                            src_gpu: gi,
                            dst_gpu: *dst_gpu,
                        });
                    }
                    Cmd::Recv(x) => {
                        let slot = recvs
                            .get_mut(x.0 as usize)
                            .ok_or_else(|| plan_err(format!("transfer {} out of range", x.0)))?;
                        if slot.replace(gi).is_some() {
                            return Err(plan_err(format!("transfer {} is received twice", x.0)));
                        }
                    }
                }
            }
        }
        for e in 0..nev {
            if waited[e] > 0 && recorded[e] != 1 {
                return Err(plan_err(format!(
                    "event {e} is waited for but recorded {} times (must be once)",
                    recorded[e]
                )));
            }
            if recorded[e] > 1 {
                return Err(plan_err(format!(
                    "event {e} is recorded {} times",
                    recorded[e]
                )));
            }
        }
        let mut transfers = Vec::with_capacity(nx);
        for (x, t) in sends.iter().enumerate() {
            let t = t.ok_or_else(|| plan_err(format!("transfer {x} is never sent")))?;
            match recvs[x] {
                Some(gpu) if gpu == t.dst_gpu => {}
                Some(gpu) => {
                    return Err(plan_err(format!(
                        "transfer {x} is sent to GPU {} but received on GPU {gpu}",
                        t.dst_gpu
                    )))
                }
                None => return Err(plan_err(format!("transfer {x} is never received"))),
            }
            transfers.push(t);
        }

        // Merge with vector clocks. clock[s][t] = commands of stream t ordered before the
        // current point of stream s.
        let mut pos = vec![0usize; ns];
        let mut clock = vec![vec![0usize; ns]; ns];
        let mut ev_clock: Vec<Option<Vec<usize>>> = vec![None; nev];
        let mut x_clock: Vec<Option<Vec<usize>>> = vec![None; nx];
        // Position (stream, index) of each op's launch.
        let mut at: HashMap<NodeId, (usize, usize)> = HashMap::new();
        let mut out: Vec<(usize, HostCmd)> = Vec::new();
        let mut waits_in_plan = 0;
        let mut dropped = 0;
        let total: usize = flat.iter().map(|f| f.2.len()).sum();
        let mut done = 0;
        while done < total {
            let mut progressed = false;
            // Synchronisation commands first, as soon as enabled.
            for s in 0..ns {
                while let Some(c) = flat[s].2.get(pos[s]) {
                    let (gpu, stream) = (flat[s].0, flat[s].1);
                    match c {
                        Cmd::Record(e) => {
                            let mut v = clock[s].clone();
                            v[s] = pos[s] + 1;
                            ev_clock[e.0 as usize] = Some(v);
                            out.push((
                                s,
                                HostCmd::Record {
                                    gpu,
                                    stream,
                                    event: e.0,
                                },
                            ));
                        }
                        Cmd::Wait(e) => {
                            let Some(v) = &ev_clock[e.0 as usize] else {
                                break;
                            };
                            waits_in_plan += 1;
                            if v.iter().zip(&clock[s]).all(|(a, b)| a <= b) {
                                dropped += 1;
                            } else {
                                for (c, a) in clock[s].iter_mut().zip(v) {
                                    *c = (*c).max(*a);
                                }
                                out.push((
                                    s,
                                    HostCmd::Wait {
                                        gpu,
                                        stream,
                                        event: e.0,
                                    },
                                ));
                            }
                        }
                        Cmd::Send { xfer, .. } => {
                            let mut v = clock[s].clone();
                            v[s] = pos[s] + 1;
                            x_clock[xfer.0 as usize] = Some(v);
                            out.push((
                                s,
                                HostCmd::Send {
                                    gpu,
                                    stream,
                                    xfer: xfer.0,
                                },
                            ));
                        }
                        Cmd::Recv(x) => {
                            let Some(v) = &x_clock[x.0 as usize] else {
                                break;
                            };
                            for (c, a) in clock[s].iter_mut().zip(v) {
                                *c = (*c).max(*a);
                            }
                            out.push((
                                s,
                                HostCmd::Recv {
                                    gpu,
                                    stream,
                                    xfer: x.0,
                                },
                            ));
                        }
                        Cmd::Launch { .. } | Cmd::LaunchMerged { .. } => break,
                    }
                    pos[s] += 1;
                    done += 1;
                    progressed = true;
                }
            }
            // Then the launch with the smallest priority.
            let best = (0..ns)
                .filter_map(|s| {
                    let c = flat[s].2.get(pos[s])?;
                    let ops: Vec<NodeId> = match c {
                        Cmd::Launch { op, .. } => vec![*op],
                        Cmd::LaunchMerged { ops, .. } => ops.clone(),
                        _ => return None,
                    };
                    let p = ops
                        .iter()
                        .map(|o| priority.get(o.index()).copied().unwrap_or(u64::MAX))
                        .min()
                        .unwrap_or(u64::MAX);
                    Some((p, s, ops))
                })
                .min_by_key(|(p, s, _)| (*p, *s));
            if let Some((_, s, ops)) = best {
                for &v in &ops {
                    for u in g.preds(v) {
                        if g.node(u).op.is_input() || placement[u.index()].is_none() {
                            continue;
                        }
                        let covered = match at.get(&u) {
                            Some(&(t, i)) if t == s => i < pos[s],
                            Some(&(t, i)) => clock[s][t] > i,
                            None => false,
                        };
                        let cross_gpu = placement[u.index()].map(|p| p.0) != Some(flat[s].0);
                        // Cross-GPU inputs arrive through a transfer (its Recv precedes the
                        // launch in the plan and is checked through the clock as well).
                        if !covered {
                            return Err(plan_err(format!(
                                "{} (GPU {}, stream {}) may start before its input {} has \
                                 finished{}: no wait or transfer orders them",
                                name(g, v),
                                flat[s].0,
                                flat[s].1,
                                name(g, u),
                                if cross_gpu { " on another GPU" } else { "" }
                            )));
                        }
                    }
                }
                for &v in &ops {
                    at.insert(v, (s, pos[s]));
                }
                out.push((
                    s,
                    HostCmd::Launch {
                        gpu: flat[s].0,
                        stream: flat[s].1,
                        ops,
                    },
                ));
                pos[s] += 1;
                done += 1;
                progressed = true;
            }
            if !progressed {
                let stuck: Vec<String> = (0..ns)
                    .filter_map(|s| {
                        flat[s]
                            .2
                            .get(pos[s])
                            .map(|c| format!("GPU {} stream {} at {c:?}", flat[s].0, flat[s].1))
                    })
                    .collect();
                return Err(plan_err(format!(
                    "the launch plan deadlocks: {}",
                    stuck.join("; ")
                )));
            }
        }
        // Drop records nobody waits for any more.
        let mut still_waited = vec![false; nev];
        for (_, c) in &out {
            if let HostCmd::Wait { event, .. } = c {
                still_waited[*event as usize] = true;
            }
        }
        let cmds: Vec<HostCmd> = out
            .into_iter()
            .map(|(_, c)| c)
            .filter(
                |c| !matches!(c, HostCmd::Record { event, .. } if !still_waited[*event as usize]),
            )
            .collect();
        Ok(ExecProgram {
            cmds,
            streams,
            placement,
            transfers,
            events: plan.events,
            waits_in_plan,
            waits_dropped: dropped,
        })
    }

    /// Number of logical GPUs.
    pub fn gpus(&self) -> usize {
        self.streams.len()
    }

    /// The operators each stream launches, in order (for the workspace sizes).
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

    /// Per node, the logical GPU of an operator.
    pub fn gpu_of(&self) -> Vec<Option<usize>> {
        self.placement.iter().map(|p| p.map(|(g, _)| g)).collect()
    }

    /// Counts by kind: (launches, records, waits, sends, recvs).
    pub fn counts(&self) -> (usize, usize, usize, usize, usize) {
        let mut c = (0, 0, 0, 0, 0);
        for cmd in &self.cmds {
            match cmd {
                HostCmd::Launch { .. } => c.0 += 1,
                HostCmd::Record { .. } => c.1 += 1,
                HostCmd::Wait { .. } => c.2 += 1,
                HostCmd::Send { .. } => c.3 += 1,
                HostCmd::Recv { .. } => c.4 += 1,
            }
        }
        c
    }
}

fn place(
    g: &Graph,
    placement: &mut [Option<(usize, usize)>],
    op: NodeId,
    gpu: usize,
    stream: usize,
) -> Result<(), RuntimeError> {
    let slot = placement
        .get_mut(op.index())
        .ok_or_else(|| plan_err(format!("operator #{} is not in the graph", op.0)))?;
    if slot.replace((gpu, stream)).is_some() {
        return Err(plan_err(format!("{} is launched twice", name(g, op))));
    }
    if g.node(op).op.is_input() {
        return Err(plan_err(format!(
            "{} is a graph input, not an operator",
            name(g, op)
        )));
    }
    Ok(())
}
