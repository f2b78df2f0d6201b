//! The simulator: runs a [`LaunchPlan`] on simulated GPUs under a [`CostModel`] and returns a
//! [`Timeline`].
//!
//! ## Semantics
//! A discrete-event simulation with one global clock `now` (ms, starting at 0). Every stream
//! is a queue of commands with a pointer. An idle stream processes its next command at `now`:
//! - `Record(e)`: the event is recorded at `now` and becomes visible to other streams
//!   `event_record_us` later (the cost model's [`Overheads`]; 0 by default); streams waiting for
//!   it resume then. The recording stream goes on at once.
//! - `Wait(e)`: once `e` is visible (at a time `<= now`), the wait costs the stream
//!   `event_wait_us` (a fixed job; nothing when 0), else it blocks until then.
//! - `Recv(x)`: continues if transfer `x` has arrived, else blocks until it does.
//! - `Send { xfer, src, dst, .. }`: the transfer starts at `now` and arrives at
//!   `now + cost.transfer_time(g, src, dst)`. Sends do not block the stream (copy engines run
//!   beside the compute units) and **transfers never contend** with each other or with
//!   operators: each link is assumed free (the HIOS simulation model).
//! - `Launch { op, stage: None }` (stream plans): the operator starts at `now` and runs under
//!   the **fluid law**: on each GPU the set `R` of running stream-plan operators progresses at
//!   the rates `cost.rates(g, R)` (relative to running alone), recomputed whenever `R` changes.
//!   An operator's remaining work, in "alone-milliseconds", starts at `cost.op_time`. The
//!   stream is busy until the operator completes.
//! - `Launch { op, stage: Some(s) }` and `LaunchMerged { ops, stage: Some(s) }` (stage plans):
//!   the stream becomes *ready for stage `s`* on its GPU. When every stream that has stage-`s`
//!   commands on that GPU is ready, the stage starts at `now`. Its time `T` is
//!   `cost.stage_time(g, groups)`, the groups being, per participating stream (in stream
//!   order), the operators of its consecutive stage-`s` launches (only `Send`s may sit between
//!   them); a merged launch (alone in its stage) takes `T = cost.merged_stage_time(g, ops)`
//!   (one merged convolution, or its convolutions one after another where the runtime runs
//!   them so), an error if the model cannot merge them. With `L` the longest group's sum of `op_time`s,
//!   `scale = T / L` (1 if `L = 0`); each stream then runs its stage-`s` launches one after
//!   another as fixed-duration jobs of `scale * op_time` each (a merged launch: `T`), so the
//!   longest group ends exactly `T` after the stage started. `Send`s between the launches fire
//!   when the preceding operator ends. Stage jobs do not take part in the fluid law. A launch
//!   that starts after its place in the stage (eager mode: the host issued it late) still takes
//!   its whole `scale * op_time` (a merged launch: `T`) from then.
//! - `LaunchMerged { ops, stage: None }`: a fixed-duration job of
//!   `cost.merged_stage_time(g, ops)`.
//!
//! **Execution mode** ([`ExecMode`], [`SimOptions`]). Under CUDA-graph replay (the default) the
//! rules above are all. In eager mode the host issues the commands one after another in the
//! runtime's host order ([`crate::HostProgram::issue_order`]: synchronisation as soon as
//! enabled, then the launch earliest in the plan's launch order), at `eager_launch_us` per kernel launch
//! ([`opsched_cost::launches::launches`]) and `eager_sync_us` per other command; a stream may
//! not process a command before the host has issued it. The host never waits for the GPU, so
//! the issue times are fixed in advance.
//!
//! Then `now` advances to the earliest pending happening (a fixed job's end, a fluid
//! completion, a transfer's arrival), everything due then is applied, and the idle streams run
//! again. When nothing is pending and some stream has not finished, the plan deadlocks:
//! [`ScheduleError::Deadlock`] names the GPU, the stream, the blocking command and the next
//! operator of that stream.
//!
//! The plan is checked before it runs: operator, event and transfer ids in range, every
//! operator launched at most once and no graph input launched, every event recorded and every
//! transfer sent at most once, each stage's launches consecutive on a stream, and a merged
//! launch alone in its stage ([`ScheduleError::Invalid`] otherwise).
//!
//! ## Output
//! One [`OpSpan`] per launched operator (every component of a merged operator gets the merged
//! operator's span), sorted by start time (then GPU, stream, operator); one [`TransferSpan`]
//! per send, in the order they were sent; the makespan is the latest end of any operator or
//! transfer (0 for an empty plan).
//!
//! ## Cost
//! Each command is processed once per time it is reached; each happening costs a heap
//! operation; a change of the running set on a GPU costs one `rates` call and a pass over that
//! GPU's running operators. Nothing scans all streams or all operators per event.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use opsched_cost::launches::launches;
use opsched_cost::{CostModel, Overheads};
use opsched_graph::{Graph, NodeId};
use serde::{Deserialize, Serialize};

use crate::lower::op_name;
use crate::{Cmd, LaunchPlan, ScheduleError};

/// How the runtime executes a launch plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecMode {
    /// Captured once as a CUDA graph and replayed: the GPU resolves dependencies itself.
    #[default]
    Graph,
    /// Every command issued by the host each time: launches are host-bound.
    Eager,
}

impl ExecMode {
    /// Every mode, as named on the command line.
    pub const ALL: [ExecMode; 2] = [ExecMode::Graph, ExecMode::Eager];

    pub fn as_str(self) -> &'static str {
        match self {
            ExecMode::Graph => "graph",
            ExecMode::Eager => "eager",
        }
    }
}

impl std::fmt::Display for ExecMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How to simulate.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimOptions {
    pub mode: ExecMode,
}

/// When and where one operator ran.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpSpan {
    pub op: NodeId,
    pub gpu: usize,
    pub stream: usize,
    pub start_ms: f64,
    pub end_ms: f64,
}

/// When one transfer moved a tensor.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TransferSpan {
    pub src: NodeId,
    pub dst: NodeId,
    pub src_gpu: usize,
    pub dst_gpu: usize,
    pub start_ms: f64,
    pub end_ms: f64,
}

/// The simulated run of a launch plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Timeline {
    pub ops: Vec<OpSpan>,
    pub transfers: Vec<TransferSpan>,
    pub makespan_ms: f64,
}

/// A short description of a command for error messages.
pub(crate) fn describe_cmd(g: &Graph, cmd: &Cmd) -> String {
    match cmd {
        Cmd::Launch { op, stage: None } => format!("launch {}", op_name(g, *op)),
        Cmd::Launch { op, stage: Some(s) } => format!("launch {} in stage {s}", op_name(g, *op)),
        Cmd::LaunchMerged { ops, stage } => {
            let names: Vec<String> = ops.iter().map(|&o| op_name(g, o)).collect();
            match stage {
                Some(s) => format!("launch merged [{}] in stage {s}", names.join(", ")),
                None => format!("launch merged [{}]", names.join(", ")),
            }
        }
        Cmd::Record(e) => format!("record event {}", e.0),
        Cmd::Wait(e) => format!("wait for event {}", e.0),
        Cmd::Send {
            xfer,
            src,
            dst,
            dst_gpu,
        } => format!(
            "send transfer {} ({} -> {}) to GPU {dst_gpu}",
            xfer.0,
            op_name(g, *src),
            op_name(g, *dst)
        ),
        Cmd::Recv(x) => format!("receive transfer {}", x.0),
    }
}

/// "op 'x'" for the next operator launched at or after `from` on a stream.
pub(crate) fn next_op(g: &Graph, cmds: &[Cmd], from: usize) -> String {
    cmds.iter()
        .skip(from)
        .find_map(|c| match c {
            Cmd::Launch { op, .. } => Some(format!("next op {}", op_name(g, *op))),
            Cmd::LaunchMerged { ops, .. } => {
                let names: Vec<String> = ops.iter().map(|&o| op_name(g, o)).collect();
                Some(format!("next op merged [{}]", names.join(", ")))
            }
            _ => None,
        })
        .unwrap_or_else(|| "no op after it".into())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ev {
    /// A fixed-duration job of a stream ends.
    Job(usize),
    /// The first fluid completion on a GPU, valid while the GPU's version matches.
    Fluid(usize, u64),
    /// A transfer arrives.
    Arrive(usize),
    /// A recorded event becomes visible to waiting streams.
    Visible(usize),
    /// The host has issued a stream's next command (eager mode).
    Issued(usize),
}

#[derive(Clone, Copy, Debug)]
struct Item {
    t: f64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Item {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Item {
    /// Reversed, so that [`BinaryHeap`] pops the earliest (then the first pushed).
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .t
            .total_cmp(&self.t)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    /// Ready to process its next command.
    Idle,
    /// Blocked on a `Wait` or a `Recv`.
    Blocked,
    /// Its next command is not issued by the host yet (eager mode).
    Unissued,
    /// Running a stream-plan operator under the fluid law.
    Fluid,
    /// Running a fixed-duration job.
    Fixed,
    /// Waiting for the other streams of its stage.
    Ready,
    /// No commands left.
    Done,
}

#[derive(Clone, Copy, Debug)]
struct ActiveStage {
    stage: u32,
    start: f64,
    scale: f64,
    total: f64,
    longest: f64,
    /// Sum of `op_time`s of this stream's stage jobs started so far.
    prefix: f64,
}

struct Strm<'p> {
    gpu: usize,
    idx: usize,
    cmds: &'p [Cmd],
    ptr: usize,
    st: St,
    active: Option<ActiveStage>,
    job_start: f64,
    queued: bool,
    // Fluid state of the running operator.
    rem: f64,
    rate: f64,
    eta: f64,
}

#[derive(Default)]
struct FluidGpu {
    /// Streams running a fluid operator.
    running: Vec<usize>,
    last: f64,
    version: u64,
    dirty: bool,
}

#[derive(Default)]
struct StageState {
    participants: usize,
    ready: Vec<usize>,
}

struct Sim<'a> {
    g: &'a Graph,
    cost: &'a dyn CostModel,
    now: f64,
    seq: u64,
    heap: BinaryHeap<Item>,
    streams: Vec<Strm<'a>>,
    worklist: Vec<usize>,
    fluid: Vec<FluidGpu>,
    dirty: Vec<usize>,
    stages: Vec<HashMap<u32, StageState>>,
    ev_time: Vec<Option<f64>>,
    ev_waiters: Vec<Vec<usize>>,
    /// Where each event is recorded (stream index), for deadlock messages.
    ev_rec: Vec<Option<usize>>,
    x_arrived: Vec<bool>,
    x_waiters: Vec<Vec<usize>>,
    /// Per transfer: the stream that sends it (from the scan), for deadlock messages.
    x_sender: Vec<Option<usize>>,
    op_time: Vec<f64>,
    overheads: Overheads,
    /// Eager mode: per stream, per command, when the host has issued it (ms).
    issued: Option<Vec<Vec<f64>>>,
    spans: Vec<OpSpan>,
    transfers: Vec<TransferSpan>,
    rates_buf: Vec<f64>,
    ops_buf: Vec<NodeId>,
}

fn invalid(msg: String) -> ScheduleError {
    ScheduleError::Invalid(msg)
}

/// Run a launch plan on simulated GPUs under `cost`, replayed as a CUDA graph (see the module
/// docs for the semantics).
pub fn simulate(
    g: &Graph,
    plan: &LaunchPlan,
    cost: &dyn CostModel,
) -> Result<Timeline, ScheduleError> {
    simulate_with(g, plan, cost, &SimOptions::default())
}

/// [`simulate`] in the execution mode of `opts`.
pub fn simulate_with(
    g: &Graph,
    plan: &LaunchPlan,
    cost: &dyn CostModel,
    opts: &SimOptions,
) -> Result<Timeline, ScheduleError> {
    let mut sim = Sim::new(g, plan, cost)?;
    if opts.mode == ExecMode::Eager {
        sim.issued = Some(issue_times(g, plan, &sim.overheads)?);
    }
    sim.run()?;
    Ok(sim.finish())
}

/// Eager mode: when the host has issued each command of each stream (flattened GPU by GPU).
fn issue_times(
    g: &Graph,
    plan: &LaunchPlan,
    o: &Overheads,
) -> Result<Vec<Vec<f64>>, ScheduleError> {
    // The runtime's host order, from the plan's launch order (the one merge there is).
    let order = crate::HostProgram::new(g, plan)?.issue_order;
    let mut base = Vec::with_capacity(plan.gpus.len());
    let mut times: Vec<Vec<f64>> = Vec::new();
    for gl in &plan.gpus {
        base.push(times.len());
        times.extend(gl.streams.iter().map(|s| vec![0.0; s.len()]));
    }
    let (launch_ms, sync_ms) = (
        o.eager_launch_us.max(0.0) / 1e3,
        o.eager_sync_us.max(0.0) / 1e3,
    );
    let mut host = 0.0;
    for step in order {
        let cmd = &plan.gpus[step.gpu].streams[step.stream][step.index];
        host += match cmd {
            Cmd::Launch { op, .. } => f64::from(launches(g, *op)) * launch_ms,
            Cmd::LaunchMerged { ops, .. } => {
                ops.iter()
                    .map(|&op| f64::from(launches(g, op)))
                    .sum::<f64>()
                    * launch_ms
            }
            _ => sync_ms,
        };
        times[base[step.gpu] + step.stream][step.index] = host;
    }
    Ok(times)
}

impl<'a> Sim<'a> {
    fn new(
        g: &'a Graph,
        plan: &'a LaunchPlan,
        cost: &'a dyn CostModel,
    ) -> Result<Self, ScheduleError> {
        let nev = plan.events as usize;
        let nx = plan.transfers as usize;
        let mut streams = Vec::new();
        let mut stages: Vec<HashMap<u32, StageState>> = Vec::with_capacity(plan.gpus.len());
        let mut launched = vec![false; g.len()];
        let mut ev_rec: Vec<Option<usize>> = vec![None; nev];
        let mut x_sender: Vec<Option<usize>> = vec![None; nx];
        for (gpu, gl) in plan.gpus.iter().enumerate() {
            let mut st_map: HashMap<u32, StageState> = HashMap::new();
            for (idx, cmds) in gl.streams.iter().enumerate() {
                let sid = streams.len();
                let here = || format!("GPU {gpu} stream {idx}");
                let mut seen: Vec<u32> = Vec::new();
                let mut current: Option<u32> = None;
                for cmd in cmds {
                    let mut check_op = |op: NodeId| -> Result<(), ScheduleError> {
                        match g.nodes().get(op.index()) {
                            None => Err(invalid(format!(
                                "{}: operator #{} does not exist",
                                here(),
                                op.0
                            ))),
                            Some(n) if n.op.is_input() => Err(invalid(format!(
                                "{}: {} is a graph input, not an operator",
                                here(),
                                op_name(g, op)
                            ))),
                            Some(_) if launched[op.index()] => Err(invalid(format!(
                                "{}: operator {} is launched more than once",
                                here(),
                                op_name(g, op)
                            ))),
                            Some(_) => {
                                launched[op.index()] = true;
                                Ok(())
                            }
                        }
                    };
                    let stage = match cmd {
                        Cmd::Launch { op, stage } => {
                            check_op(*op)?;
                            *stage
                        }
                        Cmd::LaunchMerged { ops, stage } => {
                            if ops.is_empty() {
                                return Err(invalid(format!(
                                    "{}: a merged launch without operators",
                                    here()
                                )));
                            }
                            for &op in ops {
                                check_op(op)?;
                            }
                            *stage
                        }
                        Cmd::Record(e) | Cmd::Wait(e) => {
                            let i = e.0 as usize;
                            if i >= nev {
                                return Err(invalid(format!(
                                    "{}: event {i} is out of range (the plan has {nev})",
                                    here()
                                )));
                            }
                            if matches!(cmd, Cmd::Record(_)) {
                                if ev_rec[i].is_some() {
                                    return Err(invalid(format!(
                                        "{}: event {i} is recorded more than once",
                                        here()
                                    )));
                                }
                                ev_rec[i] = Some(sid);
                            }
                            None
                        }
                        Cmd::Send { xfer, dst_gpu, .. } => {
                            let i = xfer.0 as usize;
                            if i >= nx {
                                return Err(invalid(format!(
                                    "{}: transfer {i} is out of range (the plan has {nx})",
                                    here()
                                )));
                            }
                            if x_sender[i].is_some() {
                                return Err(invalid(format!(
                                    "{}: transfer {i} is sent more than once",
                                    here()
                                )));
                            }
                            if *dst_gpu >= plan.gpus.len() {
                                return Err(invalid(format!(
                                    "{}: transfer {i} goes to GPU {dst_gpu}, but the plan has \
                                     {} GPUs",
                                    here(),
                                    plan.gpus.len()
                                )));
                            }
                            x_sender[i] = Some(sid);
                            // A send keeps the current stage run going.
                            continue;
                        }
                        Cmd::Recv(xfer) => {
                            let i = xfer.0 as usize;
                            if i >= nx {
                                return Err(invalid(format!(
                                    "{}: transfer {i} is out of range (the plan has {nx})",
                                    here()
                                )));
                            }
                            None
                        }
                    };
                    match stage {
                        Some(s) if current == Some(s) => {}
                        Some(s) => {
                            if seen.contains(&s) {
                                return Err(invalid(format!(
                                    "{}: the launches of stage {s} are not consecutive",
                                    here()
                                )));
                            }
                            seen.push(s);
                            st_map.entry(s).or_default().participants += 1;
                            current = Some(s);
                        }
                        None => current = None,
                    }
                }
                streams.push(Strm {
                    gpu,
                    idx,
                    cmds,
                    ptr: 0,
                    st: St::Idle,
                    active: None,
                    job_start: 0.0,
                    queued: true,
                    rem: 0.0,
                    rate: 1.0,
                    eta: 0.0,
                });
            }
            stages.push(st_map);
        }
        let n = streams.len();
        Ok(Sim {
            g,
            cost,
            now: 0.0,
            seq: 0,
            heap: BinaryHeap::new(),
            worklist: (0..n).rev().collect(),
            streams,
            fluid: (0..plan.gpus.len()).map(|_| FluidGpu::default()).collect(),
            dirty: Vec::new(),
            stages,
            ev_time: vec![None; nev],
            ev_waiters: vec![Vec::new(); nev],
            ev_rec,
            x_arrived: vec![false; nx],
            x_waiters: vec![Vec::new(); nx],
            x_sender,
            op_time: vec![f64::NAN; g.len()],
            overheads: cost.overheads(),
            issued: None,
            spans: Vec::with_capacity(g.len()),
            transfers: Vec::with_capacity(nx),
            rates_buf: Vec::new(),
            ops_buf: Vec::new(),
        })
    }

    fn push(&mut self, t: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Item {
            t,
            seq: self.seq,
            ev,
        });
    }

    fn wake(&mut self, s: usize) {
        let st = &mut self.streams[s];
        if st.st != St::Done {
            st.st = St::Idle;
        }
        if !st.queued {
            st.queued = true;
            self.worklist.push(s);
        }
    }

    fn op_time(&mut self, op: NodeId) -> Result<f64, ScheduleError> {
        let cached = self.op_time[op.index()];
        if !cached.is_nan() {
            return Ok(cached);
        }
        let t = self.cost.op_time(self.g, op);
        if !(t.is_finite() && t >= 0.0) {
            return Err(ScheduleError::Config(format!(
                "cost model {} gives operator {} the time {t}",
                self.cost.name(),
                op_name(self.g, op)
            )));
        }
        self.op_time[op.index()] = t;
        Ok(t)
    }

    fn check_time(&self, what: impl FnOnce() -> String, t: f64) -> Result<f64, ScheduleError> {
        if t.is_finite() && t >= 0.0 {
            Ok(t)
        } else {
            Err(ScheduleError::Config(format!(
                "cost model {} gives {} the time {t}",
                self.cost.name(),
                what()
            )))
        }
    }

    fn span(&mut self, op: NodeId, s: usize, start: f64, end: f64) {
        let st = &self.streams[s];
        self.spans.push(OpSpan {
            op,
            gpu: st.gpu,
            stream: st.idx,
            start_ms: start,
            end_ms: end,
        });
    }

    fn run(&mut self) -> Result<(), ScheduleError> {
        loop {
            while let Some(s) = self.worklist.pop() {
                self.streams[s].queued = false;
                self.run_stream(s)?;
            }
            while let Some(gpu) = self.dirty.pop() {
                self.reschedule(gpu)?;
            }
            let Some(first) = self.heap.pop() else { break };
            self.now = self.now.max(first.t);
            self.handle(first.ev)?;
            while self.heap.peek().is_some_and(|i| i.t <= self.now) {
                if let Some(item) = self.heap.pop() {
                    self.handle(item.ev)?;
                }
            }
        }
        self.check_finished()
    }

    fn handle(&mut self, ev: Ev) -> Result<(), ScheduleError> {
        match ev {
            Ev::Job(s) => {
                let start = self.streams[s].job_start;
                let now = self.now;
                let cmds = self.streams[s].cmds;
                match cmds.get(self.streams[s].ptr) {
                    Some(Cmd::Launch { op, .. }) => self.span(*op, s, start, now),
                    Some(Cmd::LaunchMerged { ops, .. }) => {
                        for &op in ops {
                            self.span(op, s, start, now);
                        }
                    }
                    _ => {}
                }
                self.streams[s].ptr += 1;
                self.wake(s);
            }
            Ev::Fluid(gpu, version) => {
                if self.fluid[gpu].version == version {
                    self.fluid_completions(gpu);
                }
            }
            Ev::Arrive(x) => {
                self.x_arrived[x] = true;
                for w in std::mem::take(&mut self.x_waiters[x]) {
                    self.wake(w);
                }
            }
            Ev::Visible(e) => {
                for w in std::mem::take(&mut self.ev_waiters[e]) {
                    self.wake(w);
                }
            }
            Ev::Issued(s) => self.wake(s),
        }
        Ok(())
    }

    /// Bring the remaining work of `gpu`'s running operators up to `now`.
    fn advance(&mut self, gpu: usize) {
        let fg = &mut self.fluid[gpu];
        let dt = self.now - fg.last;
        if dt > 0.0 {
            for &s in &fg.running {
                let st = &mut self.streams[s];
                st.rem = (st.rem - st.rate * dt).max(0.0);
            }
        }
        fg.last = self.now;
    }

    fn mark_dirty(&mut self, gpu: usize) {
        if !self.fluid[gpu].dirty {
            self.fluid[gpu].dirty = true;
            self.dirty.push(gpu);
        }
    }

    fn fluid_completions(&mut self, gpu: usize) {
        let now = self.now;
        let tol = 1e-12 * now.abs().max(1.0);
        let running = std::mem::take(&mut self.fluid[gpu].running);
        let dt = now - self.fluid[gpu].last;
        let mut keep = Vec::with_capacity(running.len());
        for s in running {
            if self.streams[s].eta <= now + tol {
                let cmds = self.streams[s].cmds;
                if let Some(Cmd::Launch { op, .. }) = cmds.get(self.streams[s].ptr) {
                    let start = self.streams[s].job_start;
                    self.span(*op, s, start, now);
                }
                self.streams[s].ptr += 1;
                self.wake(s);
            } else {
                let st = &mut self.streams[s];
                if dt > 0.0 {
                    st.rem = (st.rem - st.rate * dt).max(0.0);
                }
                keep.push(s);
            }
        }
        let fg = &mut self.fluid[gpu];
        fg.running = keep;
        fg.last = now;
        self.mark_dirty(gpu);
    }

    /// New rates and the next completion for `gpu` after its running set changed.
    fn reschedule(&mut self, gpu: usize) -> Result<(), ScheduleError> {
        self.fluid[gpu].dirty = false;
        self.fluid[gpu].version += 1;
        if self.fluid[gpu].running.is_empty() {
            return Ok(());
        }
        self.ops_buf.clear();
        for &s in &self.fluid[gpu].running {
            let st = &self.streams[s];
            if let Some(Cmd::Launch { op, .. }) = st.cmds.get(st.ptr) {
                self.ops_buf.push(*op);
            }
        }
        self.cost.rates(self.g, &self.ops_buf, &mut self.rates_buf);
        if self.rates_buf.len() != self.ops_buf.len() {
            return Err(ScheduleError::Config(format!(
                "cost model {} gave {} rates for {} running operators",
                self.cost.name(),
                self.rates_buf.len(),
                self.ops_buf.len()
            )));
        }
        let last = self.fluid[gpu].last;
        let mut first = f64::INFINITY;
        for (k, &s) in self.fluid[gpu].running.iter().enumerate() {
            let r = self.rates_buf[k];
            if !(r.is_finite() && r > 0.0) {
                return Err(ScheduleError::Config(format!(
                    "cost model {} gives operator {} the rate {r} (rates must lie in (0, 1])",
                    self.cost.name(),
                    op_name(self.g, self.ops_buf[k])
                )));
            }
            let st = &mut self.streams[s];
            st.rate = r;
            st.eta = last + st.rem / r;
            first = first.min(st.eta);
        }
        let version = self.fluid[gpu].version;
        self.push(first, Ev::Fluid(gpu, version));
        Ok(())
    }

    fn run_stream(&mut self, s: usize) -> Result<(), ScheduleError> {
        let cmds = self.streams[s].cmds;
        let gpu = self.streams[s].gpu;
        loop {
            if self.streams[s].st != St::Idle {
                return Ok(());
            }
            let ptr = self.streams[s].ptr;
            let Some(cmd) = cmds.get(ptr) else {
                self.streams[s].st = St::Done;
                self.streams[s].active = None;
                return Ok(());
            };
            let issued = self
                .issued
                .as_ref()
                .and_then(|t| t.get(s)?.get(ptr).copied())
                .unwrap_or(0.0);
            if issued > self.now {
                self.streams[s].st = St::Unissued;
                self.push(issued, Ev::Issued(s));
                return Ok(());
            }
            // Leave the active stage once the stream moves past its launches.
            if let Some(a) = self.streams[s].active {
                let keep = match cmd {
                    Cmd::Launch { stage, .. } | Cmd::LaunchMerged { stage, .. } => {
                        *stage == Some(a.stage)
                    }
                    Cmd::Send { .. } => true,
                    _ => false,
                };
                if !keep {
                    self.streams[s].active = None;
                }
            }
            let now = self.now;
            match cmd {
                Cmd::Record(e) => {
                    let i = e.0 as usize;
                    let visible = now + self.overheads.event_record_us.max(0.0) / 1e3;
                    self.ev_time[i] = Some(visible);
                    if visible > now {
                        self.push(visible, Ev::Visible(i));
                    } else {
                        for w in std::mem::take(&mut self.ev_waiters[i]) {
                            self.wake(w);
                        }
                    }
                    self.streams[s].ptr += 1;
                }
                Cmd::Wait(e) => {
                    let i = e.0 as usize;
                    if self.ev_time[i].is_some_and(|t| t <= now) {
                        let cost = self.overheads.event_wait_us.max(0.0) / 1e3;
                        if cost > 0.0 {
                            // The job's end moves the pointer past the wait.
                            self.start_job(s, now + cost);
                        } else {
                            self.streams[s].ptr += 1;
                        }
                    } else {
                        self.ev_waiters[i].push(s);
                        self.streams[s].st = St::Blocked;
                    }
                }
                Cmd::Recv(x) => {
                    let i = x.0 as usize;
                    if self.x_arrived[i] {
                        self.streams[s].ptr += 1;
                    } else {
                        self.x_waiters[i].push(s);
                        self.streams[s].st = St::Blocked;
                    }
                }
                Cmd::Send {
                    xfer,
                    src,
                    dst,
                    dst_gpu,
                } => {
                    let d = self.cost.transfer_time(self.g, *src, *dst);
                    let d = self.check_time(
                        || {
                            format!(
                                "transfer {} -> {}",
                                op_name(self.g, *src),
                                op_name(self.g, *dst)
                            )
                        },
                        d,
                    )?;
                    let i = xfer.0 as usize;
                    self.transfers.push(TransferSpan {
                        src: *src,
                        dst: *dst,
                        src_gpu: gpu,
                        dst_gpu: *dst_gpu,
                        start_ms: now,
                        end_ms: now + d,
                    });
                    self.push(now + d, Ev::Arrive(i));
                    self.streams[s].ptr += 1;
                }
                Cmd::Launch { op, stage: None } => {
                    let w = self.op_time(*op)?;
                    self.streams[s].job_start = now;
                    if w <= 0.0 {
                        self.span(*op, s, now, now);
                        self.streams[s].ptr += 1;
                        continue;
                    }
                    self.advance(gpu);
                    self.fluid[gpu].running.push(s);
                    let st = &mut self.streams[s];
                    st.rem = w;
                    st.rate = 1.0;
                    st.st = St::Fluid;
                    self.mark_dirty(gpu);
                }
                Cmd::LaunchMerged { ops, stage: None } => {
                    let t = self.merged_time(ops)?;
                    self.start_job(s, now + t);
                }
                Cmd::Launch {
                    op,
                    stage: Some(stage),
                } => match self.streams[s].active {
                    Some(a) if a.stage == *stage => {
                        let w = self.op_time(*op)?;
                        let mut a = a;
                        a.prefix += w;
                        let end = if a.prefix >= a.longest {
                            a.start + a.total
                        } else {
                            a.start + a.scale * a.prefix
                        };
                        self.streams[s].active = Some(a);
                        // Started late (eager mode: issued after its place in the stage), it
                        // still takes its whole scaled time.
                        self.start_job(s, end.max(now + a.scale * w));
                    }
                    _ => self.ready(s, *stage)?,
                },
                Cmd::LaunchMerged {
                    stage: Some(stage), ..
                } => match self.streams[s].active {
                    Some(a) if a.stage == *stage => {
                        self.start_job(s, (a.start + a.total).max(now + a.total));
                    }
                    _ => self.ready(s, *stage)?,
                },
            }
        }
    }

    fn start_job(&mut self, s: usize, end: f64) {
        self.streams[s].job_start = self.now;
        self.streams[s].st = St::Fixed;
        self.push(end, Ev::Job(s));
    }

    fn merged_time(&self, ops: &[NodeId]) -> Result<f64, ScheduleError> {
        let name = || {
            let names: Vec<String> = ops.iter().map(|&o| op_name(self.g, o)).collect();
            format!("merged operator [{}]", names.join(", "))
        };
        match self.cost.merged_stage_time(self.g, ops) {
            Some(t) => self.check_time(name, t),
            None => Err(invalid(format!(
                "cost model {} cannot merge {}",
                self.cost.name(),
                name()
            ))),
        }
    }

    /// Stream `s` reached its first launch of `stage`.
    fn ready(&mut self, s: usize, stage: u32) -> Result<(), ScheduleError> {
        let gpu = self.streams[s].gpu;
        self.streams[s].st = St::Ready;
        let Some(entry) = self.stages[gpu].get_mut(&stage) else {
            return Err(invalid(format!(
                "GPU {gpu}: stage {stage} was not announced"
            )));
        };
        entry.ready.push(s);
        if entry.ready.len() < entry.participants {
            return Ok(());
        }
        let mut ready = std::mem::take(&mut entry.ready);
        ready.sort_unstable_by_key(|&r| self.streams[r].idx);
        self.start_stage(gpu, stage, &ready)
    }

    fn start_stage(
        &mut self,
        gpu: usize,
        stage: u32,
        ready: &[usize],
    ) -> Result<(), ScheduleError> {
        let mut groups: Vec<Vec<NodeId>> = Vec::with_capacity(ready.len());
        let mut merged: Option<&[NodeId]> = None;
        let mut launches = 0usize;
        for &s in ready {
            let cmds: &'a [Cmd] = self.streams[s].cmds;
            let ptr = self.streams[s].ptr.min(cmds.len());
            let mut grp = Vec::new();
            for cmd in &cmds[ptr..] {
                match cmd {
                    Cmd::Launch { op, stage: Some(x) } if *x == stage => grp.push(*op),
                    Cmd::LaunchMerged {
                        ops,
                        stage: Some(x),
                    } if *x == stage => {
                        merged = Some(ops);
                        launches += 1;
                    }
                    Cmd::Send { .. } => {}
                    _ => break,
                }
            }
            launches += grp.len();
            groups.push(grp);
        }
        let (total, longest) = if let Some(ops) = merged {
            if launches > 1 {
                return Err(invalid(format!(
                    "GPU {gpu} stage {stage}: a merged launch must be alone in its stage"
                )));
            }
            (self.merged_time(ops)?, 0.0)
        } else {
            let mut longest = 0.0f64;
            for grp in &groups {
                let mut sum = 0.0;
                for &op in grp {
                    sum += self.op_time(op)?;
                }
                longest = longest.max(sum);
            }
            let t = self.cost.stage_time(self.g, &groups);
            let t = self.check_time(|| format!("stage {stage} on GPU {gpu}"), t)?;
            (t, longest)
        };
        let scale = if longest > 0.0 { total / longest } else { 1.0 };
        let start = self.now;
        for &s in ready {
            self.streams[s].active = Some(ActiveStage {
                stage,
                start,
                scale,
                total,
                longest,
                prefix: 0.0,
            });
            self.wake(s);
        }
        Ok(())
    }

    fn check_finished(&self) -> Result<(), ScheduleError> {
        let stuck = self
            .streams
            .iter()
            .position(|st| st.st == St::Blocked)
            .or_else(|| self.streams.iter().position(|st| st.st != St::Done));
        let Some(s) = stuck else { return Ok(()) };
        let st = &self.streams[s];
        let g = self.g;
        let Some(cmd) = st.cmds.get(st.ptr) else {
            return Err(ScheduleError::Deadlock(format!(
                "GPU {} stream {} stopped at its end",
                st.gpu, st.idx
            )));
        };
        let why = match (st.st, cmd) {
            (St::Blocked, Cmd::Wait(e)) => match self.ev_rec.get(e.0 as usize).copied().flatten() {
                None => "the event is recorded nowhere".to_string(),
                Some(r) => {
                    let rs = &self.streams[r];
                    format!(
                        "the event is recorded on GPU {} stream {}, which is stuck at command {} ({})",
                        rs.gpu,
                        rs.idx,
                        rs.ptr,
                        rs.cmds.get(rs.ptr).map_or("its end".into(), |c| describe_cmd(g, c))
                    )
                }
            },
            (St::Blocked, Cmd::Recv(x)) => match self.x_sender.get(x.0 as usize).copied().flatten()
            {
                None => "the transfer is sent nowhere".to_string(),
                Some(r) => {
                    let rs = &self.streams[r];
                    format!(
                        "the transfer is sent from GPU {} stream {}, which is stuck at command {} ({})",
                        rs.gpu,
                        rs.idx,
                        rs.ptr,
                        rs.cmds.get(rs.ptr).map_or("its end".into(), |c| describe_cmd(g, c))
                    )
                }
            },
            (
                St::Ready,
                Cmd::Launch { stage: Some(x), .. } | Cmd::LaunchMerged { stage: Some(x), .. },
            ) => {
                let missing: Vec<String> = self
                    .streams
                    .iter()
                    .filter(|o| {
                        o.gpu == st.gpu
                            && o.st != St::Ready
                            && o.cmds.iter().any(|c| match c {
                                Cmd::Launch { stage, .. } | Cmd::LaunchMerged { stage, .. } => {
                                    *stage == Some(*x)
                                }
                                _ => false,
                            })
                    })
                    .map(|o| format!("stream {}", o.idx))
                    .collect();
                format!("stage {x} waits for {} to reach it", missing.join(", "))
            }
            _ => "it can never proceed".to_string(),
        };
        Err(ScheduleError::Deadlock(format!(
            "GPU {} stream {} blocks at command {} ({}): {}; {}",
            st.gpu,
            st.idx,
            st.ptr,
            describe_cmd(g, cmd),
            why,
            next_op(g, st.cmds, st.ptr)
        )))
    }

    fn finish(mut self) -> Timeline {
        let mut ops = std::mem::take(&mut self.spans);
        ops.sort_by(|a, b| {
            a.start_ms
                .total_cmp(&b.start_ms)
                .then(a.gpu.cmp(&b.gpu))
                .then(a.stream.cmp(&b.stream))
                .then(a.op.cmp(&b.op))
        });
        let transfers = std::mem::take(&mut self.transfers);
        let makespan_ms = ops
            .iter()
            .map(|s| s.end_ms)
            .chain(transfers.iter().map(|t| t.end_ms))
            .fold(0.0, f64::max);
        Timeline {
            ops,
            transfers,
            makespan_ms,
        }
    }
}
