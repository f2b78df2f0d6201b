//! Running a launch plan on a device: buffers, streams, events, optional graph capture,
//! transfers, timing and the numerical check.

use opsched_gpu::{Device, DeviceReport, GraphProgram, Summary, TransferSpec};
use opsched_graph::{Graph, NodeId, Tensor};
use opsched_schedule::{HostCmd, HostProgram, LaunchPlan, Schedule};
use serde::Serialize;

use crate::{CheckMode, RunOptions, RuntimeError};

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub device: DeviceReport,
    pub logical_gpus: usize,
    pub streams: Vec<usize>,
    pub graph_capture: bool,
    /// How transfers moved (`nccl`, `copy`, or `none` without transfers).
    pub transfer_mode: String,
    pub warmup: u32,
    pub latency: Summary,
    /// Launches the host issued: one per operator of the plan, one per merged stage.
    pub launches: usize,
    /// Kernels they run on a GPU ([`opsched_gpu::GraphProgram::kernels`]).
    pub kernels: usize,
    /// Merged stages that ran as one convolution or product
    /// ([`opsched_gpu::GraphProgram::merged`]); the plan's other merged stages ran their
    /// operators one after another.
    pub merged_convolutions: usize,
    /// Buffers written through strided views ([`opsched_gpu::program::BufSpec::runs`]): slices
    /// of concatenations at batch > 1 that their producers write in place, a merged
    /// convolution's output and members at batch > 1, and a merged product's members (a run
    /// per row) with the head reshapes and transposes that read them.
    pub strided_views: usize,
    /// How its 4-D activations were stored, and how many kernels converting between NCHW and
    /// NHWC it ran ([`opsched_gpu::program::Layout`]).
    pub layout: opsched_gpu::program::Layout,
    pub layout_conversions: usize,
    /// The fusions its graph left out (`opsched_graph::fusion::Fusions::left_out`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fusions_left_out: Vec<&'static str>,
    pub waits: usize,
    pub waits_dropped: usize,
    pub transfers: usize,
    /// Bytes of device memory the program's buffers take (weights, inputs, activations and
    /// scratch, after in-place concatenation and reuse; convolution workspaces not included),
    /// all GPUs together.
    pub peak_memory_bytes: u64,
    /// What they would take each in storage of its own.
    pub buffer_bytes: u64,
    /// Of `peak_memory_bytes`: weights, constants and inputs.
    pub weight_bytes: u64,
    /// The cuDNN kernels its distinct convolutions run (CUDA only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conv_kernels: Option<opsched_gpu::tuning::ConvKernels>,
    /// The libraries its distinct measured matrix products run (CUDA only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gemm_kernels: Option<opsched_gpu::tuning::GemmKernels>,
    /// Which of our kernels its distinct depthwise convolutions with a choice run (CUDA only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub depthwise_kernels: Option<opsched_gpu::tuning::DepthwiseKernels>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<CheckReport>,
    /// Every launch's time, in the host program's order, when [`RunOptions::op_times`] asked
    /// for them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub op_times: Vec<OpTime>,
    /// The graph's outputs by name, when [`RunOptions::keep_outputs`] asked for them.
    #[serde(skip)]
    pub outputs: Vec<(String, Tensor)>,
}

/// One launch's time within whole runs ([`RunOptions::op_times`]): between timing events
/// recorded on its stream just before and just after it. On a GPU driven eagerly, a launch the
/// host issued late counts the gap it waited; a wait for another stream comes before the first
/// event, so it does not count.
#[derive(Clone, Debug, Serialize)]
pub struct OpTime {
    /// The operators it runs, by name (several for a merged stage).
    pub nodes: Vec<String>,
    /// The first one's operator type.
    pub op: &'static str,
    pub gpu: usize,
    pub stream: usize,
    pub time: Summary,
}

/// The numerical check's result.
#[derive(Clone, Debug, Serialize)]
pub struct CheckReport {
    /// Largest scaled error of the scheduled run against a sequential run of the same kernels
    /// (storing NCHW, whatever the run's layout).
    pub vs_sequential: f64,
    pub vs_sequential_node: String,
    /// Against the reference executor (when the graph was small enough).
    pub vs_reference: Option<f64>,
    pub vs_reference_node: Option<String>,
    pub tolerance_sequential: f64,
    pub tolerance_reference: f64,
    pub passed: bool,
}

/// Map `logical` GPUs onto `units` physical ones round-robin (`l -> l % units`).
pub fn map_gpus(logical: usize, units: usize) -> Result<Vec<usize>, RuntimeError> {
    if units == 0 {
        return Err(RuntimeError::Plan("no device unit to map onto".into()));
    }
    Ok((0..logical).map(|l| l % units).collect())
}

/// A launch plan prepared on a device: everything the timed loop needs, created before
/// timing.
pub struct Session<'a, D: Device> {
    dev: &'a D,
    g: &'a Graph,
    host: HostProgram,
    program: GraphProgram,
    /// Prepared operators (index = `NodeId`); they hold `mem`.
    ops: Vec<Option<D::Op>>,
    mem: D::Memory,
    /// streams[logical gpu][stream]
    streams: Vec<Vec<D::Stream>>,
    /// One copy/communication stream per logical GPU.
    copy: Vec<D::Stream>,
    origin: D::Stream,
    fork: D::Event,
    events: Vec<Option<D::Event>>,
    sent: Vec<D::Event>,
    arrived: Vec<D::Event>,
    joins: Vec<D::Event>,
    transfer_mode: &'static str,
}

fn plan_err(m: impl Into<String>) -> RuntimeError {
    RuntimeError::Plan(m.into())
}

impl<'a, D: Device> Session<'a, D> {
    /// Check `plan`, lay out its buffers on `dev`, prepare every operator, create streams and
    /// events.
    pub fn new(
        dev: &'a D,
        g: &'a Graph,
        plan: &LaunchPlan,
        opts: &RunOptions,
    ) -> Result<Session<'a, D>, RuntimeError> {
        Self::with_host(dev, g, HostProgram::new(g, plan)?, opts)
    }

    /// Prepare a host program as given. [`HostProgram::new`] is what checks a plan's
    /// dependencies; a host program edited after it is not checked again (the CPU device's
    /// race detector is then the remaining guard, which is what tests of that guard need).
    pub fn with_host(
        dev: &'a D,
        g: &'a Graph,
        host: HostProgram,
        opts: &RunOptions,
    ) -> Result<Session<'a, D>, RuntimeError> {
        let map = map_gpus(host.gpus().max(1), dev.units())?;
        let unit = |l: usize| {
            map.get(l)
                .copied()
                .ok_or_else(|| plan_err(format!("GPU {l}")))
        };
        let specs: Vec<TransferSpec> = host
            .transfers
            .iter()
            .map(|t| TransferSpec {
                src: t.src,
                dst: t.dst,
                dst_gpu: t.dst_gpu,
            })
            .collect();
        let merges = host.merged_launches();
        let layout = opts.layout.unwrap_or_else(|| dev.preferred_layout());
        let mut program = GraphProgram::build_with(g, &host.gpu_of(), &specs, &merges, layout)?;
        if opts.reuse_memory {
            let order = host.op_order(g.len());
            let keep: Vec<_> = g.outputs().iter().map(|o| o.value.node).collect();
            opsched_gpu::memory::layout_reusing(&mut program, &keep, |a, b| order.before(a, b));
        }
        let mut mem = dev.alloc(&program, &map)?;
        write_inputs(dev, g, &program, &mem, opts)?;
        let mut ops = Vec::with_capacity(program.ops.len());
        for op in &program.ops {
            ops.push(match op {
                Some(op) => Some(dev.prepare(&program, &mem, op, &opts.kernels)?),
                None => None,
            });
        }
        let mut streams = Vec::with_capacity(host.gpus());
        let mut copy = Vec::with_capacity(host.gpus());
        for (l, &n) in host.streams.iter().enumerate() {
            let mut v = Vec::with_capacity(n);
            for s in 0..n {
                let mut st = dev.stream(unit(l)?)?;
                let on: Vec<&D::Op> = host
                    .ops_on(l, s)
                    .iter()
                    .filter_map(|o| ops.get(o.index()).and_then(Option::as_ref))
                    .collect();
                dev.fit_stream(&mut st, &on)?;
                v.push(st);
            }
            streams.push(v);
            copy.push(dev.stream(unit(l)?)?);
        }
        let origin = dev.stream(unit(0)?)?;
        let fork = dev.event(unit(0)?, false)?;
        // Plan events live on the GPU of the stream that records them.
        let mut events: Vec<Option<D::Event>> = (0..host.events).map(|_| None).collect();
        for c in &host.cmds {
            if let HostCmd::Record { gpu, event, .. } = c {
                events[*event as usize] = Some(dev.event(unit(*gpu)?, false)?);
            }
        }
        let mut sent = Vec::with_capacity(host.transfers.len());
        let mut arrived = Vec::with_capacity(host.transfers.len());
        for t in &host.transfers {
            sent.push(dev.event(unit(t.src_gpu)?, false)?);
            arrived.push(dev.event(unit(t.dst_gpu)?, false)?);
        }
        // One join event per compute stream, then one per copy stream.
        let mut joins = Vec::new();
        for (l, v) in streams.iter().enumerate() {
            for _ in 0..v.len() {
                joins.push(dev.event(unit(l)?, false)?);
            }
        }
        for l in 0..copy.len() {
            joins.push(dev.event(unit(l)?, false)?);
        }
        let transfer_mode = if host.transfers.is_empty() {
            "none"
        } else {
            dev.connect(&mut mem, &copy, opts.transfers)?
        };
        dev.synchronize()?;
        Ok(Session {
            dev,
            g,
            host,
            program,
            ops,
            mem,
            streams,
            copy,
            origin,
            fork,
            events,
            sent,
            arrived,
            joins,
            transfer_mode,
        })
    }

    /// The host program this session runs.
    pub fn host(&self) -> &HostProgram {
        &self.host
    }

    /// The buffers and steps.
    pub fn program(&self) -> &GraphProgram {
        &self.program
    }

    fn stream(&self, gpu: usize, stream: usize) -> Result<&D::Stream, RuntimeError> {
        self.streams
            .get(gpu)
            .and_then(|v| v.get(stream))
            .ok_or_else(|| plan_err(format!("GPU {gpu} has no stream {stream}")))
    }

    fn event(&self, e: u32) -> Result<&D::Event, RuntimeError> {
        self.events
            .get(e as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| plan_err(format!("event {e} is never recorded")))
    }

    /// Enqueue one iteration: fork from the origin stream, the host program, join back.
    /// Works both eagerly and under capture (every wait follows its record).
    pub fn enqueue(&self) -> Result<(), RuntimeError> {
        self.enqueue_marked(&[])
    }

    /// [`Session::enqueue`], recording the `marks` of the host program's `i`-th launch on its
    /// stream just before and just after it (none where `marks` is shorter).
    fn enqueue_marked(&self, marks: &[(D::Event, D::Event)]) -> Result<(), RuntimeError> {
        let dev = self.dev;
        let mut launches = marks.iter();
        dev.record(&self.origin, &self.fork)?;
        for sc in self.streams.iter().flatten().chain(&self.copy) {
            dev.wait(sc, &self.fork)?;
        }
        for c in &self.host.cmds {
            match c {
                HostCmd::Launch { gpu, stream, ops } => {
                    let sc = self.stream(*gpu, *stream)?;
                    let mark = launches.next();
                    if let Some((before, _)) = mark {
                        dev.record(sc, before)?;
                    }
                    for op in ops {
                        let p = self
                            .ops
                            .get(op.index())
                            .and_then(Option::as_ref)
                            .ok_or_else(|| {
                                plan_err(format!("operator #{} is not prepared", op.0))
                            })?;
                        dev.launch(p, sc)?;
                    }
                    if let Some((_, after)) = mark {
                        dev.record(sc, after)?;
                    }
                }
                HostCmd::Record { gpu, stream, event } => {
                    dev.record(self.stream(*gpu, *stream)?, self.event(*event)?)?;
                }
                HostCmd::Wait { gpu, stream, event } => {
                    dev.wait(self.stream(*gpu, *stream)?, self.event(*event)?)?;
                }
                HostCmd::Send { gpu, stream, xfer } => self.send(*gpu, *stream, *xfer as usize)?,
                HostCmd::Recv { gpu, stream, xfer } => {
                    let ev = self
                        .arrived
                        .get(*xfer as usize)
                        .ok_or_else(|| plan_err(format!("transfer {xfer} out of range")))?;
                    dev.wait(self.stream(*gpu, *stream)?, ev)?;
                }
            }
        }
        let joined = self.streams.iter().flatten().chain(&self.copy);
        for (sc, ev) in joined.zip(&self.joins) {
            dev.record(sc, ev)?;
            dev.wait(&self.origin, ev)?;
        }
        Ok(())
    }

    /// The transfer's source is ready on (`gpu`, `stream`): start moving it.
    fn send(&self, gpu: usize, stream: usize, x: usize) -> Result<(), RuntimeError> {
        let dev = self.dev;
        let (Some(t), Some(&(src_buf, dst_buf))) =
            (self.host.transfers.get(x), self.program.transfers.get(x))
        else {
            return Err(plan_err(format!("transfer {x} out of range")));
        };
        dev.record(self.stream(gpu, stream)?, &self.sent[x])?;
        for l in [t.src_gpu, t.dst_gpu] {
            let cs = self
                .copy
                .get(l)
                .ok_or_else(|| plan_err(format!("GPU {l} has no copy stream")))?;
            dev.wait(cs, &self.sent[x])?;
        }
        dev.transfer(
            &self.mem,
            src_buf,
            dst_buf,
            (t.src_gpu, t.dst_gpu),
            &self.copy,
        )?;
        dev.record(&self.copy[t.dst_gpu], &self.arrived[x])?;
        Ok(())
    }

    /// Time `repeats` iterations after `warmup`, eagerly or by replaying a captured graph
    /// (captured after one eager iteration, so first-use work such as lazy kernel loading
    /// or NCCL's connection setup, which allocate, happens outside the capture).
    pub fn time(&self, warmup: u32, repeats: u32, capture: bool) -> Result<Vec<f64>, RuntimeError> {
        let dev = self.dev;
        let unit0 = map_gpus(1, dev.units())?[0];
        let start = dev.event(unit0, true)?;
        let end = dev.event(unit0, true)?;
        let graph = if capture {
            self.enqueue()?;
            dev.synchronize()?;
            dev.begin_capture(&self.origin)?;
            let enq = self.enqueue();
            let graph = dev.end_capture(&self.origin);
            enq?;
            Some(graph?)
        } else {
            None
        };
        let mut times = Vec::with_capacity(repeats as usize);
        for r in 0..warmup + repeats {
            dev.record(&self.origin, &start)?;
            match &graph {
                Some(gr) => dev.replay(gr, &self.origin)?,
                None => self.enqueue()?,
            }
            dev.record(&self.origin, &end)?;
            let ms = dev.elapsed_ms(&start, &end)?;
            if r >= warmup {
                times.push(ms);
            }
        }
        dev.synchronize()?;
        Ok(times)
    }

    /// Time every launch within `warmup + repeats` eager iterations (after `warmup`): the
    /// elapsed time between timing events recorded on its stream just before and just after
    /// it ([`OpTime`]), in the host program's order.
    pub fn time_ops(&self, warmup: u32, repeats: u32) -> Result<Vec<OpTime>, RuntimeError> {
        let dev = self.dev;
        let map = map_gpus(self.host.gpus().max(1), dev.units())?;
        let mut marks = Vec::new();
        for (gpu, ..) in self.host.launches() {
            let unit = *map.get(gpu).ok_or_else(|| plan_err(format!("GPU {gpu}")))?;
            marks.push((dev.event(unit, true)?, dev.event(unit, true)?));
        }
        let mut samples = vec![Vec::with_capacity(repeats as usize); marks.len()];
        for r in 0..warmup + repeats {
            self.enqueue_marked(&marks)?;
            for ((before, after), times) in marks.iter().zip(&mut samples) {
                let ms = dev.elapsed_ms(before, after)?;
                if r >= warmup {
                    times.push(ms);
                }
            }
        }
        dev.synchronize()?;
        self.host
            .launches()
            .zip(&samples)
            .map(|((gpu, stream, ops), times)| {
                let node = |id: &NodeId| self.g.nodes().get(id.index());
                Ok(OpTime {
                    nodes: ops
                        .iter()
                        .filter_map(node)
                        .map(|n| n.name.clone())
                        .collect(),
                    op: ops.first().and_then(node).map_or("?", |n| n.op.type_name()),
                    gpu,
                    stream,
                    time: Summary::of(times)
                        .ok_or_else(|| plan_err("no valid timing sample of a launch"))?,
                })
            })
            .collect()
    }

    /// Every node's value that outlives a run, read back (index = `NodeId`): graph inputs,
    /// constants, the graph's outputs, and every operator's output unless
    /// [`RunOptions::reuse_memory`] let others overwrite it.
    pub fn outputs(&self) -> Result<Vec<Option<Vec<f32>>>, RuntimeError> {
        let mut out = vec![None; self.g.len()];
        for (i, b) in self.program.outputs.iter().enumerate() {
            let b = b.filter(|&b| !self.program.buffers[b].reused);
            if let (Some(b), Some(slot)) = (b, out.get_mut(i)) {
                let v = self.dev.read(&self.mem, b)?;
                // Values stored channels last, in the graph's NCHW order.
                let nhwc = self.program.channels_last.get(i).copied().unwrap_or(false);
                *slot = Some(match self.g.nodes()[i].shape.as_slice() {
                    &[n, c, h, w] if nhwc => opsched_gpu::program::nhwc_to_nchw(&v, [n, c, h, w]),
                    _ => v,
                });
            }
        }
        Ok(out)
    }
}

/// Give every copy of each graph input in `opts.inputs` its values.
fn write_inputs<D: Device>(
    dev: &D,
    g: &Graph,
    program: &GraphProgram,
    mem: &D::Memory,
    opts: &RunOptions,
) -> Result<(), RuntimeError> {
    for (&id, t) in opts.inputs.iter() {
        let node = g
            .nodes()
            .get(id.index())
            .filter(|n| n.op.is_graph_input())
            .ok_or_else(|| plan_err(format!("node #{} is not a graph input", id.0)))?;
        if t.shape != node.shape {
            return Err(plan_err(format!(
                "input '{}' has shape {:?}, the graph takes {:?}",
                node.name, t.shape, node.shape
            )));
        }
        for (b, spec) in program.buffers.iter().enumerate() {
            if spec.role == opsched_gpu::program::BufRole::Input(id) {
                dev.write(mem, b, &t.data)?;
            }
        }
    }
    Ok(())
}

/// Run a launch plan on `dev`: prepare, time, check.
pub fn run_plan<D: Device>(
    dev: &D,
    g: &Graph,
    plan: &LaunchPlan,
    opts: &RunOptions,
) -> Result<RunReport, RuntimeError> {
    let session = Session::new(dev, g, plan, opts)?;
    let times = session.time(opts.warmup, opts.repeats.max(1), opts.graph_capture)?;
    let latency = Summary::of(&times).ok_or_else(|| plan_err("no valid timing sample"))?;
    let op_times = match opts.op_times {
        true => session.time_ops(opts.warmup, opts.repeats.max(1))?,
        false => Vec::new(),
    };
    let counts = session.host.counts();
    let footprint = opsched_gpu::memory::footprint(&session.program);
    // Every node's value, read back once for the check and the outputs.
    let values = match (opts.check, opts.keep_outputs) {
        (CheckMode::None, false) => Vec::new(),
        _ => session.outputs()?,
    };
    let check = match opts.check {
        CheckMode::None => None,
        mode => Some(check(dev, &session, &values, opts, mode)?),
    };
    let outputs = match opts.keep_outputs {
        true => opsched_gpu::reference::outputs(g, &values)?,
        false => Vec::new(),
    };
    Ok(RunReport {
        device: dev.report(),
        logical_gpus: session.host.gpus(),
        streams: session.host.streams.clone(),
        graph_capture: opts.graph_capture,
        transfer_mode: session.transfer_mode.to_string(),
        warmup: opts.warmup,
        latency,
        launches: counts.launches,
        kernels: session.program.kernels(),
        merged_convolutions: session.program.merged.len(),
        strided_views: session
            .program
            .buffers
            .iter()
            .filter(|b| b.runs.is_some())
            .count(),
        layout: session.program.layout,
        layout_conversions: session.program.layout_conversions,
        fusions_left_out: g.fusions().left_out(),
        waits: counts.waits,
        waits_dropped: session.host.waits_dropped,
        transfers: counts.sends,
        peak_memory_bytes: footprint.storage_bytes,
        buffer_bytes: footprint.distinct_bytes,
        weight_bytes: footprint.data_bytes,
        conv_kernels: dev.tuning().map(|t| t.chosen()).filter(|k| k.total() > 0),
        gemm_kernels: dev.tuning().map(|t| t.products()).filter(|k| k.total() > 0),
        depthwise_kernels: dev
            .tuning()
            .map(|t| t.depthwise())
            .filter(|k| k.total() > 0),
        check,
        op_times,
        outputs,
    })
}

/// Run a schedule on `dev` (lowered here, once).
pub fn run_schedule<D: Device>(
    dev: &D,
    g: &Graph,
    s: &Schedule,
    opts: &RunOptions,
) -> Result<RunReport, RuntimeError> {
    let plan = opsched_schedule::lower(g, s)?;
    run_plan(dev, g, &plan, opts)
}

/// The operator whose outputs differ most, and by how much (scaled, see
/// [`opsched_gpu::reference::scaled_error`]).
fn worst(g: &Graph, got: &[Option<Vec<f32>>], want: &[Option<Vec<f32>>]) -> (f64, String) {
    let mut best = (0.0f64, String::new());
    for id in g.ops() {
        if let (Some(Some(a)), Some(Some(b))) = (got.get(id.index()), want.get(id.index())) {
            let e = opsched_gpu::reference::scaled_error(a, b);
            if e > best.0 || best.1.is_empty() {
                best = (e, g.node(id).name.clone());
            }
        }
    }
    best
}

/// Tolerance against the reference executor: TF32 tensor cores round inputs to 10-bit
/// mantissas (GPU convolutions and matrix products); strict f32 only reorders sums.
fn reference_tolerance(dev: &DeviceReport, opts: &RunOptions) -> f64 {
    if dev.backend == "cuda" && opts.kernels.tf32 {
        2e-2
    } else if dev.backend == "cuda" {
        1e-3
    } else {
        1e-4
    }
}

/// Compare `got` (the scheduled run's values, see [`Session::outputs`]) with a sequential run
/// of the same kernels and, per `mode`, with the reference executor.
fn check<D: Device>(
    dev: &D,
    s: &Session<'_, D>,
    got: &[Option<Vec<f32>>],
    opts: &RunOptions,
    mode: CheckMode,
) -> Result<CheckReport, RuntimeError> {
    let seq_plan = opsched_schedule::lower(s.g, &Schedule::sequential(s.g))?;
    // The sequential run stores its activations NCHW, the layout every kernel was checked in
    // against the reference: a channels-last program is checked against it too (the check
    // vs the reference alone skips large graphs).
    let seq_opts = RunOptions {
        graph_capture: false,
        check: CheckMode::None,
        reuse_memory: false,
        layout: Some(opsched_gpu::program::Layout::Nchw),
        ..opts.clone()
    };
    let seq = Session::new(dev, s.g, &seq_plan, &seq_opts)?;
    seq.time(0, 1, false)?;
    let want = seq.outputs()?;
    let (e_seq, n_seq) = worst(s.g, got, &want);
    let tol_ref = reference_tolerance(&dev.report(), opts);
    // The same kernels agree to rounding; a merged convolution is another kernel, as is a
    // channels-last one (on a GPU another algorithm, whose TF32 rounding differs), so they
    // get the reference's tolerance.
    let same_kernels =
        s.program.merged.is_empty() && s.program.layout == opsched_gpu::program::Layout::Nchw;
    let tol_seq = match same_kernels {
        true => 1e-4,
        false => tol_ref.max(1e-4),
    };
    let flops: u64 = s.g.ops().map(|o| s.g.stats(o).flops).sum();
    let (vs_ref, vs_ref_node) = if mode == CheckMode::Full || flops <= opts.reference_max_flops {
        let reference = opsched_gpu::reference::reference_with(s.g, &opts.inputs)?;
        let (e, n) = worst(s.g, &want, &reference);
        (Some(e), Some(n))
    } else {
        (None, None)
    };
    let passed = e_seq <= tol_seq && vs_ref.is_none_or(|e| e <= tol_ref);
    if !passed {
        tracing::warn!("numerical check failed: vs sequential {e_seq:.2e} at '{n_seq}'");
    }
    Ok(CheckReport {
        vs_sequential: e_seq,
        vs_sequential_node: n_seq,
        vs_reference: vs_ref,
        vs_reference_node: vs_ref_node,
        tolerance_sequential: tol_seq,
        tolerance_reference: tol_ref,
        passed,
    })
}
