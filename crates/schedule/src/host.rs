//! The host order: the one sequence in which the host issues a launch plan's commands.
//!
//! CUDA needs every `Record(e)` enqueued before any `Wait(e)` (a wait on an event not yet
//! recorded is a no-op) and every `Send` before its `Recv`. The runtime
//! (`opsched_runtime::exec`) therefore merges the streams: commands that only synchronise are
//! issued as soon as they are enabled, and among the streams whose next command is a launch,
//! the launch with the smallest priority goes first ([`launch_priorities`]: the stream plan's
//! host launch order when given, else the stage index, else the topological position; ties by
//! stream). The eager simulation charges host time in this order; a facade test checks that the
//! runtime launches in the same order.

use opsched_graph::Graph;

use crate::{Cmd, LaunchPlan, Schedule, ScheduleError};

/// One command of the host order: command `index` of stream `stream` of GPU `gpu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostStep {
    pub gpu: usize,
    pub stream: usize,
    pub index: usize,
}

/// Priorities by topological position alone (no schedule to say otherwise).
pub(crate) fn topo_priorities(g: &Graph) -> Vec<u64> {
    let mut pri = vec![u64::MAX; g.len()];
    for (i, &id) in g.topo_order().iter().enumerate() {
        pri[id.index()] = (1u64 << 40) + i as u64;
    }
    pri
}

/// The host launch order of a schedule: per operator a priority (smaller first). Opara's
/// launch order where a stream plan gives one, else the stage index (then the topological
/// position), else the topological position.
pub fn launch_priorities(g: &Graph, s: &Schedule) -> Vec<u64> {
    let mut pri = topo_priorities(g);
    match s {
        Schedule::Stages(p) => {
            for stages in &p.gpus {
                for (si, st) in stages.iter().enumerate() {
                    for op in st.ops() {
                        if let Some(slot) = pri.get_mut(op.index()) {
                            *slot = ((si as u64) << 20) + (*slot & 0xF_FFFF);
                        }
                    }
                }
            }
        }
        Schedule::Streams(p) => {
            for gs in &p.gpus {
                if let Some(order) = &gs.launch_order {
                    for (k, op) in order.iter().enumerate() {
                        if let Some(slot) = pri.get_mut(op.index()) {
                            *slot = k as u64;
                        }
                    }
                }
            }
        }
    }
    pri
}

/// Merge a launch plan's streams into the host order (see the module docs). `priority[op]`
/// orders launches; missing entries count as last. A plan whose synchronisation can never be
/// issued (a wait for an event recorded nowhere) is [`ScheduleError::Deadlock`].
pub fn host_order(plan: &LaunchPlan, priority: &[u64]) -> Result<Vec<HostStep>, ScheduleError> {
    let flat: Vec<(usize, usize, &[Cmd])> = plan
        .gpus
        .iter()
        .enumerate()
        .flat_map(|(gpu, gl)| {
            gl.streams
                .iter()
                .enumerate()
                .map(move |(stream, cmds)| (gpu, stream, cmds.as_slice()))
        })
        .collect();
    let total: usize = flat.iter().map(|f| f.2.len()).sum();
    let mut pos = vec![0usize; flat.len()];
    let mut recorded = vec![false; plan.events as usize];
    let mut sent = vec![false; plan.transfers as usize];
    let mut out = Vec::with_capacity(total);
    let step = |s: usize, index: usize| HostStep {
        gpu: flat[s].0,
        stream: flat[s].1,
        index,
    };
    while out.len() < total {
        let before = out.len();
        for s in 0..flat.len() {
            while let Some(c) = flat[s].2.get(pos[s]) {
                let enabled = match c {
                    Cmd::Record(e) => {
                        if let Some(r) = recorded.get_mut(e.0 as usize) {
                            *r = true;
                        }
                        true
                    }
                    Cmd::Send { xfer, .. } => {
                        if let Some(x) = sent.get_mut(xfer.0 as usize) {
                            *x = true;
                        }
                        true
                    }
                    Cmd::Wait(e) => recorded.get(e.0 as usize).copied().unwrap_or(false),
                    Cmd::Recv(x) => sent.get(x.0 as usize).copied().unwrap_or(false),
                    Cmd::Launch { .. } | Cmd::LaunchMerged { .. } => false,
                };
                if !enabled {
                    break;
                }
                out.push(step(s, pos[s]));
                pos[s] += 1;
            }
        }
        let best = (0..flat.len())
            .filter_map(|s| {
                let p = match flat[s].2.get(pos[s])? {
                    Cmd::Launch { op, .. } => priority.get(op.index()).copied(),
                    Cmd::LaunchMerged { ops, .. } => ops
                        .iter()
                        .filter_map(|o| priority.get(o.index()).copied())
                        .min(),
                    _ => return None,
                };
                Some((p.unwrap_or(u64::MAX), s))
            })
            .min();
        if let Some((_, s)) = best {
            out.push(step(s, pos[s]));
            pos[s] += 1;
        }
        if out.len() == before {
            let (gpu, stream, cmds) = flat
                .iter()
                .zip(&pos)
                .find(|((_, _, cmds), &p)| p < cmds.len())
                .map(|(f, &p)| (f.0, f.1, &f.2[p..]))
                .unwrap_or((0, 0, &[]));
            return Err(ScheduleError::Deadlock(format!(
                "the host cannot issue GPU {gpu} stream {stream}'s next command ({:?}): it waits \
                 for an event or a transfer that is never issued",
                cmds.first()
            )));
        }
    }
    Ok(out)
}
