//! The validator: checks a schedule against its graph and platform, and a launch plan against
//! its graph. Every error names the operator at fault (by its node name).
//!
//! [`validate`] checks, in this order:
//! 1. every scheduled id is an operator of the graph (not out of range, not a graph input);
//! 2. the platform's limits: at most `platform.gpus` GPUs; stage plans: at most
//!    `platform.streams` groups per concurrent stage (a merge stage runs on one stream);
//!    stream plans: at most `platform.streams` streams per GPU (errors name the first
//!    operator beyond the limit);
//! 3. shape rules: stage plans have no empty stage and no empty group, and a merge stage's
//!    operators satisfy [`opsched_graph::merge::mergeable`]; a stream plan's `launch_order`,
//!    where given, lists exactly that GPU's operators, keeps each stream's order and puts every
//!    operator after its predecessors on the same GPU;
//! 4. every operator exactly once;
//! 5. dependencies: stage plans: for a dependency `u -> v` on one GPU, `u`'s stage comes
//!    before `v`'s, or both are in the same group of the same concurrent stage with `u` first
//!    (operators of a merge stage are independent); stream plans: no operator precedes one of
//!    its own ancestors on the same stream (that would deadlock). Dependencies across GPUs are
//!    always allowed (they become transfers);
//! 6. the schedule is lowered ([`crate::lower()`]) and the launch plan checked with
//!    [`validate_launch`], which finds wait cycles across streams and GPUs (for example two
//!    GPUs whose stages wait for each other).
//!
//! [`validate_launch`] checks a launch plan on its own: every operator launched exactly once
//! (and no graph input), event and transfer ids in range, every event recorded at most once
//! and every waited event recorded on the same GPU, every transfer sent at most once, every
//! received transfer sent to the receiving GPU, a send after its source operator on the same
//! stream; then the **command graph** (stream order, record -> wait, send -> recv, and the
//! start of each stage, which the simulator makes wait for all the stage's streams) must be
//! acyclic (a cycle is a [`ScheduleError::Deadlock`] naming an operator on it or right after
//! it), and every dependency `u -> v` of the graph must be ordered by it (`u`'s launch
//! happens before `v`'s). The structural checks and the dependency check are those of
//! [`crate::host::HostProgram::new`], which every runtime runs too: one check, one place.

use opsched_graph::merge::mergeable;
use opsched_graph::{Graph, NodeId};

use crate::lower::{lower, op_name};
use crate::simulate::{describe_cmd, next_op};
use crate::{
    Cmd, LaunchPlan, Platform, Schedule, ScheduleError, StagePlan, StageStrategy, StreamPlan,
};

fn invalid(msg: String) -> ScheduleError {
    ScheduleError::Invalid(msg)
}

/// Check a schedule: every operator exactly once, dependencies respected, limits of the
/// platform kept, no cycle among waits. Errors name the operator (see the module docs).
pub fn validate(g: &Graph, s: &Schedule, p: &Platform) -> Result<(), ScheduleError> {
    match s {
        Schedule::Stages(sp) => validate_stages(g, sp, p)?,
        Schedule::Streams(sp) => validate_streams(g, sp, p)?,
    }
    let plan = lower(g, s)?;
    validate_launch(g, &plan)
}

/// The id is an operator of `g`.
fn check_op(g: &Graph, op: NodeId, at: &dyn Fn() -> String) -> Result<(), ScheduleError> {
    match g.nodes().get(op.index()) {
        None => Err(invalid(format!(
            "operator #{} ({}) does not exist: the graph has {} nodes",
            op.0,
            at(),
            g.len()
        ))),
        Some(n) if n.op.is_input() => Err(invalid(format!(
            "{} ({}) is a graph input, not an operator; it must not be scheduled",
            op_name(g, op),
            at()
        ))),
        Some(_) => Ok(()),
    }
}

/// Every operator of `g` exactly once among `ops` (all known to be operators of `g`).
fn check_each_once(g: &Graph, ops: impl Iterator<Item = NodeId>) -> Result<(), ScheduleError> {
    let mut seen = vec![false; g.len()];
    for op in ops {
        match seen.get_mut(op.index()) {
            Some(true) => {
                return Err(invalid(format!(
                    "operator {} is scheduled more than once",
                    op_name(g, op)
                )))
            }
            Some(slot) => *slot = true,
            None => {}
        }
    }
    match g
        .ops()
        .find(|o| !seen.get(o.index()).copied().unwrap_or(false))
    {
        Some(o) => Err(invalid(format!(
            "operator {} is missing from the schedule",
            op_name(g, o)
        ))),
        None => Ok(()),
    }
}

fn names(g: &Graph, ops: &[NodeId]) -> String {
    ops.iter()
        .map(|&o| op_name(g, o))
        .collect::<Vec<_>>()
        .join(", ")
}

fn too_many_gpus(
    g: &Graph,
    first: Option<(usize, NodeId)>,
    used: usize,
    p: &Platform,
) -> ScheduleError {
    invalid(match first {
        Some((gi, op)) => format!(
            "operator {} is on GPU {gi}, but the platform has {} GPU(s)",
            op_name(g, op),
            p.gpus
        ),
        None => format!(
            "the schedule has {used} GPUs (the extra ones empty), but the platform has {}",
            p.gpus
        ),
    })
}

fn validate_stages(g: &Graph, sp: &StagePlan, p: &Platform) -> Result<(), ScheduleError> {
    if sp.gpus.len() > p.gpus {
        let first = sp
            .gpus
            .iter()
            .enumerate()
            .skip(p.gpus)
            .find_map(|(gi, stages)| {
                stages
                    .iter()
                    .flat_map(|st| st.ops())
                    .next()
                    .map(|o| (gi, o))
            });
        return Err(too_many_gpus(g, first, sp.gpus.len(), p));
    }
    for (gi, stages) in sp.gpus.iter().enumerate() {
        for (si, stage) in stages.iter().enumerate() {
            for (j, grp) in stage.groups.iter().enumerate() {
                for &op in grp {
                    check_op(g, op, &|| format!("GPU {gi} stage {si} group {j}"))?;
                }
            }
            if stage.ops().next().is_none() {
                return Err(invalid(format!("GPU {gi} stage {si} is empty")));
            }
            match stage.strategy {
                StageStrategy::Concurrent => {
                    if let Some(j) = stage.groups.iter().position(|grp| grp.is_empty()) {
                        return Err(invalid(format!(
                            "GPU {gi} stage {si}: group {j} is empty (the stage has {})",
                            names(g, &stage.ops().collect::<Vec<_>>())
                        )));
                    }
                    if stage.groups.len() > p.streams {
                        let op = stage.groups[p.streams][0];
                        return Err(invalid(format!(
                            "operator {} is in group {} of GPU {gi} stage {si}, which has {} \
                             groups, but the platform has {} stream(s) per GPU",
                            op_name(g, op),
                            p.streams,
                            stage.groups.len(),
                            p.streams
                        )));
                    }
                }
                StageStrategy::Merge => {
                    let ops: Vec<NodeId> = stage.ops().collect();
                    if !mergeable(g, &ops) {
                        return Err(invalid(format!(
                            "GPU {gi} stage {si}: operators [{}] cannot be merged",
                            names(g, &ops)
                        )));
                    }
                }
            }
        }
    }
    if p.streams == 0 && sp.gpus.iter().any(|st| !st.is_empty()) {
        return Err(ScheduleError::Config("the platform has no streams".into()));
    }
    check_each_once(g, sp.gpus.iter().flatten().flat_map(|st| st.ops()))?;

    // Where each operator is: (gpu, stage, group, index in group, merge stage).
    #[derive(Clone, Copy)]
    struct Pos {
        gpu: usize,
        stage: usize,
        group: usize,
        index: usize,
        merge: bool,
    }
    let mut pos: Vec<Option<Pos>> = vec![None; g.len()];
    for (gpu, stages) in sp.gpus.iter().enumerate() {
        for (stage, st) in stages.iter().enumerate() {
            let merge = st.strategy == StageStrategy::Merge;
            for (group, grp) in st.groups.iter().enumerate() {
                for (index, &op) in grp.iter().enumerate() {
                    if let Some(slot) = pos.get_mut(op.index()) {
                        *slot = Some(Pos {
                            gpu,
                            stage,
                            group,
                            index,
                            merge,
                        });
                    }
                }
            }
        }
    }
    for v in g.ops() {
        let Some(pv) = pos.get(v.index()).copied().flatten() else {
            continue;
        };
        for u in g.preds(v) {
            let Some(pu) = pos.get(u.index()).copied().flatten() else {
                continue;
            };
            if pu.gpu != pv.gpu {
                continue;
            }
            let ok = pu.stage < pv.stage
                || (pu.stage == pv.stage
                    && !pv.merge
                    && pu.group == pv.group
                    && pu.index < pv.index);
            if !ok {
                let what = if pu.stage == pv.stage && pv.merge {
                    format!("both are in merge stage {}", pv.stage)
                } else {
                    format!(
                        "{} is in stage {} group {} and {} in stage {} group {}",
                        op_name(g, u),
                        pu.stage,
                        pu.group,
                        op_name(g, v),
                        pv.stage,
                        pv.group
                    )
                };
                return Err(invalid(format!(
                    "dependency {} -> {} is not respected on GPU {}: {what}",
                    op_name(g, u),
                    op_name(g, v),
                    pv.gpu
                )));
            }
        }
    }
    Ok(())
}

fn validate_streams(g: &Graph, sp: &StreamPlan, p: &Platform) -> Result<(), ScheduleError> {
    for (gi, gs) in sp.gpus.iter().enumerate() {
        for (j, ops) in gs.streams.iter().enumerate() {
            for &op in ops {
                check_op(g, op, &|| format!("GPU {gi} stream {j}"))?;
            }
        }
    }
    // The platform's limits, naming the first operator beyond them.
    if sp.gpus.len() > p.gpus {
        let first = sp
            .gpus
            .iter()
            .enumerate()
            .skip(p.gpus)
            .find_map(|(gi, gs)| gs.streams.iter().flatten().next().map(|&o| (gi, o)));
        return Err(too_many_gpus(g, first, sp.gpus.len(), p));
    }
    for (gi, gs) in sp.gpus.iter().enumerate() {
        if gs.streams.len() > p.streams {
            let first = gs
                .streams
                .iter()
                .enumerate()
                .skip(p.streams)
                .find_map(|(j, st)| st.first().map(|&o| (j, o)));
            return Err(invalid(match first {
                Some((j, op)) => format!(
                    "operator {} is on stream {j} of GPU {gi}, but the platform has {} \
                     stream(s) per GPU",
                    op_name(g, op),
                    p.streams
                ),
                None => format!(
                    "GPU {gi} has {} streams (the extra ones empty), but the platform has {} \
                     per GPU",
                    gs.streams.len(),
                    p.streams
                ),
            }));
        }
    }
    check_each_once(
        g,
        sp.gpus
            .iter()
            .flat_map(|gs| gs.streams.iter().flatten().copied()),
    )?;

    // (gpu, stream, position) of every operator.
    let mut pos: Vec<Option<(usize, usize, usize)>> = vec![None; g.len()];
    for (gi, gs) in sp.gpus.iter().enumerate() {
        for (j, ops) in gs.streams.iter().enumerate() {
            for (k, &op) in ops.iter().enumerate() {
                if let Some(slot) = pos.get_mut(op.index()) {
                    *slot = Some((gi, j, k));
                }
            }
        }
    }
    let at = |op: NodeId| pos.get(op.index()).copied().flatten();

    // Launch orders.
    for (gi, gs) in sp.gpus.iter().enumerate() {
        let Some(order) = &gs.launch_order else {
            continue;
        };
        let mut rank: Vec<Option<usize>> = vec![None; g.len()];
        for (r, &op) in order.iter().enumerate() {
            check_op(g, op, &|| format!("launch order of GPU {gi}"))?;
            if at(op).is_none_or(|(og, _, _)| og != gi) {
                return Err(invalid(format!(
                    "operator {} is in the launch order of GPU {gi} but does not run there",
                    op_name(g, op)
                )));
            }
            match rank.get_mut(op.index()) {
                Some(Some(_)) => {
                    return Err(invalid(format!(
                        "operator {} is twice in the launch order of GPU {gi}",
                        op_name(g, op)
                    )))
                }
                Some(slot) => *slot = Some(r),
                None => {}
            }
        }
        let rank_of = |op: NodeId| rank.get(op.index()).copied().flatten();
        for (j, ops) in gs.streams.iter().enumerate() {
            let mut prev: Option<(NodeId, usize)> = None;
            for &op in ops {
                let Some(r) = rank_of(op) else {
                    return Err(invalid(format!(
                        "operator {} (GPU {gi} stream {j}) is missing from the launch order",
                        op_name(g, op)
                    )));
                };
                if let Some((pop, pr)) = prev {
                    if pr > r {
                        return Err(invalid(format!(
                            "the launch order of GPU {gi} puts {} before {}, against the order \
                             of stream {j}",
                            op_name(g, op),
                            op_name(g, pop)
                        )));
                    }
                }
                prev = Some((op, r));
                for u in g.preds(op) {
                    if let Some(ru) = rank_of(u) {
                        if ru > r {
                            return Err(invalid(format!(
                                "the launch order of GPU {gi} puts {} before its predecessor {}",
                                op_name(g, op),
                                op_name(g, u)
                            )));
                        }
                    }
                }
            }
        }
    }

    // No operator before one of its ancestors on the same stream: per stream, `late[x]` is
    // the latest position on that stream of a strict ancestor of `x` (on the stream).
    let topo = g.topo_order();
    let mut late: Vec<Option<usize>> = vec![None; g.len()];
    for (gi, gs) in sp.gpus.iter().enumerate() {
        for (j, ops) in gs.streams.iter().enumerate() {
            if ops.len() < 2 {
                continue;
            }
            late.iter_mut().for_each(|x| *x = None);
            for &v in topo {
                let mut best: Option<usize> = None;
                for u in g.preds(v) {
                    let own = match at(u) {
                        Some((ug, uj, uk)) if ug == gi && uj == j => Some(uk),
                        _ => None,
                    };
                    let inherited = late.get(u.index()).copied().flatten();
                    best = best.max(own).max(inherited);
                }
                if let Some(slot) = late.get_mut(v.index()) {
                    *slot = best;
                }
                if let (Some((vg, vj, vk)), Some(b)) = (at(v), best) {
                    if vg == gi && vj == j && b > vk {
                        return Err(invalid(format!(
                            "operator {} comes before its ancestor {} on GPU {gi} stream {j} \
                             (that deadlocks)",
                            op_name(g, v),
                            op_name(g, ops[b])
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Check a launch plan (see the module docs): operators, events and transfers consistent, no
/// wait cycle (stage starts included), every dependency ordered.
pub fn validate_launch(g: &Graph, plan: &LaunchPlan) -> Result<(), ScheduleError> {
    crate::host::check_plan(g, plan, |flat| check_wait_cycles(g, plan, flat)).map(|_| ())
}

/// The command graph (stream order, record -> wait, send -> recv, and the start of each
/// stage, which the simulator makes wait for all the stage's streams) is acyclic. Runs after
/// the structural checks (every waited event is recorded, every received transfer sent).
fn check_wait_cycles(
    g: &Graph,
    plan: &LaunchPlan,
    flat: &[(usize, usize, &[Cmd])],
) -> Result<(), ScheduleError> {
    // Flatten the commands: command c is (gpu, stream, index).
    let mut where_: Vec<(usize, usize, usize)> = Vec::new();
    let mut cmds: Vec<&Cmd> = Vec::new();
    for &(gi, j, stream) in flat {
        for (k, c) in stream.iter().enumerate() {
            where_.push((gi, j, k));
            cmds.push(c);
        }
    }
    let n = cmds.len();
    let mut rec_at: Vec<Option<usize>> = vec![None; plan.events as usize];
    let mut send_at: Vec<Option<usize>> = vec![None; plan.transfers as usize];
    for (c, cmd) in cmds.iter().enumerate() {
        match cmd {
            Cmd::Record(e) => rec_at[e.0 as usize] = Some(c),
            Cmd::Send { xfer, .. } => send_at[xfer.0 as usize] = Some(c),
            _ => {}
        }
    }
    // Predecessors in the command graph; stage starts are extra nodes after the commands.
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut stage_nodes: std::collections::HashMap<(usize, u32), usize> =
        std::collections::HashMap::new();
    let mut extra: Vec<Vec<usize>> = Vec::new();
    for c in 0..n {
        let (gi, _, k) = where_[c];
        let prev = if k > 0 { Some(c - 1) } else { None };
        let stage_of = |x: &Cmd| match x {
            Cmd::Launch { stage, .. } | Cmd::LaunchMerged { stage, .. } => *stage,
            _ => None,
        };
        let cmd = cmds[c];
        // The first launch of a stage run on its stream waits for the stage's start.
        let first_of_stage = stage_of(cmd).filter(|&s| {
            let mut q = prev;
            while let Some(p) = q {
                match cmds[p] {
                    Cmd::Send { .. } => {}
                    other => return stage_of(other) != Some(s),
                }
                if where_[p].2 == 0 {
                    return true;
                }
                q = Some(p - 1);
            }
            true
        });
        if let Some(s) = first_of_stage {
            let next_id = n + extra.len();
            let node = *stage_nodes.entry((gi, s)).or_insert(next_id);
            if node == next_id {
                extra.push(Vec::new());
            }
            if let Some(p) = prev {
                extra[node - n].push(p);
            }
            preds[c].push(node);
        }
        if let Some(p) = prev {
            preds[c].push(p);
        }
        match cmd {
            Cmd::Wait(e) => preds[c].extend(rec_at[e.0 as usize]),
            Cmd::Recv(x) => preds[c].extend(send_at[x.0 as usize]),
            _ => {}
        }
    }
    let total = n + extra.len();
    preds.extend(extra);

    // Kahn's algorithm over the command graph.
    let mut indeg = vec![0usize; total];
    let mut succ_start = vec![0usize; total + 1];
    for ps in &preds {
        for &p in ps {
            succ_start[p + 1] += 1;
        }
    }
    for i in 0..total {
        succ_start[i + 1] += succ_start[i];
    }
    let mut fill = succ_start.clone();
    let mut succs = vec![0usize; succ_start[total]];
    for (c, ps) in preds.iter().enumerate() {
        indeg[c] = ps.len();
        for &p in ps {
            succs[fill[p]] = c;
            fill[p] += 1;
        }
    }
    let mut seen = 0;
    let mut stack: Vec<usize> = (0..total).filter(|&c| indeg[c] == 0).collect();
    while let Some(c) = stack.pop() {
        seen += 1;
        for &s in &succs[succ_start[c]..succ_start[c + 1]] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                stack.push(s);
            }
        }
    }
    if seen < total {
        return Err(cycle_error(g, plan, &cmds, &where_, &preds, &indeg, n));
    }
    Ok(())
}

/// "next op 'x'" after command `c`.
fn next_after(g: &Graph, plan: &LaunchPlan, where_: &[(usize, usize, usize)], c: usize) -> String {
    let (gi, j, k) = where_[c];
    match plan.gpus.get(gi).and_then(|gl| gl.streams.get(j)) {
        Some(cmds) => next_op(g, cmds, k),
        None => String::new(),
    }
}

fn cycle_error(
    g: &Graph,
    plan: &LaunchPlan,
    cmds: &[&Cmd],
    where_: &[(usize, usize, usize)],
    preds: &[Vec<usize>],
    indeg: &[usize],
    n: usize,
) -> ScheduleError {
    // Every node left with a positive in-degree has a predecessor left too: walk back until a
    // node repeats; the nodes from its first visit on form a cycle.
    let left = |c: usize| indeg[c] > 0;
    let Some(start) = (0..indeg.len()).find(|&c| left(c)) else {
        return ScheduleError::Deadlock("the launch plan has a wait cycle".into());
    };
    let mut seen = vec![usize::MAX; indeg.len()];
    let mut path = Vec::new();
    let mut c = start;
    while seen[c] == usize::MAX {
        seen[c] = path.len();
        path.push(c);
        match preds[c].iter().copied().find(|&p| left(p)) {
            Some(p) => c = p,
            None => break,
        }
    }
    let cycle: Vec<usize> = match seen.get(c).copied() {
        Some(i) if i != usize::MAX && i < path.len() => path[i..].to_vec(),
        _ => path,
    };
    // Prefer a launch on the cycle; else the command on the cycle and its stream's next op.
    let real: Vec<usize> = cycle.iter().copied().filter(|&c| c < n).collect();
    let pick = real
        .iter()
        .copied()
        .find(|&c| matches!(cmds[c], Cmd::Launch { .. } | Cmd::LaunchMerged { .. }))
        .or_else(|| real.first().copied());
    let Some(c) = pick else {
        return ScheduleError::Deadlock("stage starts wait for each other".into());
    };
    let (gi, j, k) = where_[c];
    let what = match cmds[c] {
        Cmd::Launch { op, .. } => format!("op {}", op_name(g, *op)),
        Cmd::LaunchMerged { ops, .. } => format!("merged op [{}]", names(g, ops)),
        _ => next_after(g, plan, where_, c),
    };
    ScheduleError::Deadlock(format!(
        "the launch plan has a wait cycle through GPU {gi} stream {j} command {k} ({}), {what}; \
         the cycle has {} commands",
        describe_cmd(g, cmds[c]),
        cycle.len()
    ))
}
