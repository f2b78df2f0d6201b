//! Running an execution program on GPUs: buffers, streams, events, optional CUDA graph
//! capture, transfers, timing and the numerical check.

use std::sync::Arc;

use cudarc::driver::{sys as drv_sys, CudaEvent, CudaGraph};
use opsched_gpu::cuda::{self, DeviceMemory, Gpu, PreparedOp, StreamCtx};
use opsched_gpu::{GpuError, GraphProgram, Summary, TransferSpec};
use opsched_graph::Graph;
use opsched_schedule::{LaunchPlan, Schedule};
use serde::Serialize;

use crate::exec::{map_gpus, priorities, ExecProgram, HostCmd};
use crate::{CheckMode, RunOptions, RuntimeError, TransferMode};

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub device: String,
    pub driver: String,
    pub cudnn: String,
    pub physical_gpus: usize,
    pub logical_gpus: usize,
    pub streams: Vec<usize>,
    pub graph_capture: bool,
    pub transfer_mode: String,
    pub warmup: u32,
    pub latency: Summary,
    pub launches: usize,
    pub waits: usize,
    pub waits_dropped: usize,
    pub transfers: usize,
    pub buffer_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<CheckReport>,
}

/// The numerical check's result.
#[derive(Clone, Debug, Serialize)]
pub struct CheckReport {
    /// Largest scaled error of the scheduled run against a sequential run of the same kernels.
    pub vs_sequential: f64,
    pub vs_sequential_node: String,
    /// Against the CPU reference (when the graph was small enough).
    pub vs_cpu: Option<f64>,
    pub vs_cpu_node: Option<String>,
    pub tolerance_sequential: f64,
    pub tolerance_cpu: f64,
    pub passed: bool,
}

/// Everything the timed loop needs, created before timing.
struct Session<'a> {
    g: &'a Graph,
    gpus: &'a [Gpu],
    map: Vec<usize>,
    exec: ExecProgram,
    program: GraphProgram,
    mem: std::cell::RefCell<DeviceMemory>,
    ops: Vec<Option<PreparedOp>>,
    /// streams[logical gpu][stream]
    streams: Vec<Vec<StreamCtx>>,
    /// One copy/communication stream per logical GPU.
    copy: Vec<StreamCtx>,
    origin: StreamCtx,
    fork: CudaEvent,
    events: Vec<Option<CudaEvent>>,
    sent: Vec<CudaEvent>,
    arrived: Vec<CudaEvent>,
    joins: Vec<CudaEvent>,
    nccl: Option<Vec<cudarc::nccl::Comm>>,
}

fn gpu_of<'g>(gpus: &'g [Gpu], map: &[usize], l: usize) -> Result<&'g Gpu, RuntimeError> {
    map.get(l)
        .and_then(|&p| gpus.get(p))
        .ok_or_else(|| RuntimeError::Plan(format!("logical GPU {l} is not mapped")))
}

impl<'a> Session<'a> {
    fn new(
        g: &'a Graph,
        plan: &LaunchPlan,
        priority: &[u64],
        gpus: &'a [Gpu],
        opts: &RunOptions,
    ) -> Result<Session<'a>, RuntimeError> {
        let exec = ExecProgram::new(g, plan, priority)?;
        let map = map_gpus(exec.gpus().max(1), gpus.len())?;
        let specs: Vec<TransferSpec> = exec
            .transfers
            .iter()
            .map(|t| TransferSpec {
                src: t.src,
                dst: t.dst,
                dst_gpu: t.dst_gpu,
            })
            .collect();
        let program = GraphProgram::build(g, &exec.gpu_of(), &specs)?;
        let mem = DeviceMemory::alloc(&program, gpus, &map)?;
        let mut prep: Vec<StreamCtx> =
            gpus.iter().map(Gpu::new_stream).collect::<Result<_, _>>()?;
        let ops = cuda::prepare(&program, &mem, gpus, &map, &mut prep, opts.kernels)?;
        drop(prep);
        let mut streams = Vec::with_capacity(exec.gpus());
        let mut copy = Vec::with_capacity(exec.gpus());
        for (l, &n) in exec.streams.iter().enumerate() {
            let gpu = gpu_of(gpus, &map, l)?;
            let mut v = Vec::with_capacity(n);
            for s in 0..n {
                let mut sc = gpu.new_stream()?;
                let ws = exec
                    .ops_on(l, s)
                    .iter()
                    .filter_map(|o| ops.get(o.index()).and_then(Option::as_ref))
                    .map(|p| p.workspace)
                    .max()
                    .unwrap_or(0);
                sc.ensure_workspace(ws)?;
                v.push(sc);
            }
            streams.push(v);
            copy.push(gpu.new_stream()?);
        }
        let g0 = gpu_of(gpus, &map, 0)?;
        let origin = g0.new_stream()?;
        let fork = g0.event(false)?;
        // Plan events live on the GPU of the stream that records them.
        let mut events: Vec<Option<CudaEvent>> = (0..exec.events).map(|_| None).collect();
        for c in &exec.cmds {
            if let HostCmd::Record { gpu, event, .. } = c {
                events[*event as usize] = Some(gpu_of(gpus, &map, *gpu)?.event(false)?);
            }
        }
        let mut sent = Vec::with_capacity(exec.transfers.len());
        let mut arrived = Vec::with_capacity(exec.transfers.len());
        for t in &exec.transfers {
            sent.push(gpu_of(gpus, &map, t.src_gpu)?.event(false)?);
            arrived.push(gpu_of(gpus, &map, t.dst_gpu)?.event(false)?);
        }
        // One join event per compute stream, then one per copy stream.
        let mut joins = Vec::new();
        for (l, v) in streams.iter().enumerate() {
            let gpu = gpu_of(gpus, &map, l)?;
            for _ in 0..v.len() {
                joins.push(gpu.event(false)?);
            }
        }
        for l in 0..copy.len() {
            joins.push(gpu_of(gpus, &map, l)?.event(false)?);
        }
        // NCCL only when every logical GPU has its own physical GPU and there are several.
        let one_to_one = {
            let mut seen = map.clone();
            seen.sort_unstable();
            seen.dedup();
            seen.len() == map.len()
        };
        let use_nccl = match opts.transfers {
            TransferMode::Copy => false,
            TransferMode::Nccl => {
                if !one_to_one || gpus.len() < 2 {
                    return Err(RuntimeError::Plan(
                        "NCCL transfers need one physical GPU per logical GPU (and at least 2)"
                            .into(),
                    ));
                }
                opsched_gpu::check_libraries(&[opsched_gpu::Lib::Nccl])?;
                true
            }
            TransferMode::Auto => {
                one_to_one
                    && gpus.len() >= 2
                    && !exec.transfers.is_empty()
                    && opsched_gpu::Lib::Nccl.present()
            }
        };
        // Peer access where possible: copies then go GPU to GPU directly, and NCCL, which
        // may access a peer's buffers directly within one process, may touch them.
        for a in gpus {
            for b in gpus {
                cuda::enable_peer_access(a, b)?;
            }
        }
        let nccl = if use_nccl {
            let comm_streams: Vec<Arc<cudarc::driver::CudaStream>> =
                copy.iter().map(|c| c.stream.clone()).collect();
            Some(
                cudarc::nccl::Comm::from_devices(comm_streams)
                    .map_err(|e| GpuError::nccl("creating communicators", e))?,
            )
        } else {
            None
        };
        for gpu in gpus {
            gpu.synchronize()?;
        }
        Ok(Session {
            g,
            gpus,
            map,
            exec,
            program,
            mem: std::cell::RefCell::new(mem),
            ops,
            streams,
            copy,
            origin,
            fork,
            events,
            sent,
            arrived,
            joins,
            nccl,
        })
    }

    fn stream(&self, gpu: usize, stream: usize) -> Result<&StreamCtx, RuntimeError> {
        self.streams
            .get(gpu)
            .and_then(|v| v.get(stream))
            .ok_or_else(|| RuntimeError::Plan(format!("GPU {gpu} has no stream {stream}")))
    }

    fn event(&self, e: u32) -> Result<&CudaEvent, RuntimeError> {
        self.events
            .get(e as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| RuntimeError::Plan(format!("event {e} is never recorded")))
    }

    /// Enqueue one iteration: fork from the origin stream, the host program, join back.
    /// Works both eagerly and under stream capture (every wait follows its record).
    fn enqueue(&self) -> Result<(), RuntimeError> {
        self.origin.record(&self.fork)?;
        for v in &self.streams {
            for sc in v {
                sc.wait(&self.fork)?;
            }
        }
        for sc in &self.copy {
            sc.wait(&self.fork)?;
        }
        for c in &self.exec.cmds {
            match c {
                HostCmd::Launch { gpu, stream, ops } => {
                    let sc = self.stream(*gpu, *stream)?;
                    let dev = gpu_of(self.gpus, &self.map, *gpu)?;
                    for op in ops {
                        let p = self
                            .ops
                            .get(op.index())
                            .and_then(Option::as_ref)
                            .ok_or_else(|| {
                                RuntimeError::Plan(format!("operator #{} was not prepared", op.0))
                            })?;
                        p.launch(dev, sc)?;
                    }
                }
                HostCmd::Record { gpu, stream, event } => {
                    self.stream(*gpu, *stream)?.record(self.event(*event)?)?;
                }
                HostCmd::Wait { gpu, stream, event } => {
                    self.stream(*gpu, *stream)?.wait(self.event(*event)?)?;
                }
                HostCmd::Send { gpu, stream, xfer } => self.send(*gpu, *stream, *xfer as usize)?,
                HostCmd::Recv { gpu, stream, xfer } => {
                    let ev = self.arrived.get(*xfer as usize).ok_or_else(|| {
                        RuntimeError::Plan(format!("transfer {xfer} out of range"))
                    })?;
                    self.stream(*gpu, *stream)?.wait(ev)?;
                }
            }
        }
        let joined = self.streams.iter().flatten().chain(self.copy.iter());
        for (sc, ev) in joined.zip(&self.joins) {
            sc.record(ev)?;
            self.origin.wait(ev)?;
        }
        Ok(())
    }

    fn send(&self, gpu: usize, stream: usize, x: usize) -> Result<(), RuntimeError> {
        let t = self.exec.transfers[x];
        let (src_buf, dst_buf) = self.program.transfers[x];
        let sc = self.stream(gpu, stream)?;
        sc.record(&self.sent[x])?;
        match &self.nccl {
            None => {
                let cs = &self.copy[t.dst_gpu];
                cs.wait(&self.sent[x])?;
                let mem = self.mem.borrow();
                cuda::copy_between(
                    gpu_of(self.gpus, &self.map, t.src_gpu)?,
                    mem.ptr[src_buf],
                    gpu_of(self.gpus, &self.map, t.dst_gpu)?,
                    mem.ptr[dst_buf],
                    mem.bytes(src_buf),
                    cs,
                )?;
                cs.record(&self.arrived[x])?;
            }
            Some(comms) => {
                self.copy[t.src_gpu].wait(&self.sent[x])?;
                let mut mem = self.mem.borrow_mut();
                cudarc::nccl::group_start().map_err(|e| GpuError::nccl("group start", e))?;
                let r1 = match mem.slice(src_buf) {
                    Some(src) => comms[t.src_gpu].send(src, t.dst_gpu as i32),
                    None => Ok(()),
                };
                let r2 = match mem.slice_mut(dst_buf) {
                    Some(dst) => comms[t.dst_gpu].recv(dst, t.src_gpu as i32).map(|_| ()),
                    None => Ok(()),
                };
                cudarc::nccl::group_end().map_err(|e| GpuError::nccl("group end", e))?;
                r1.map_err(|e| GpuError::nccl("send", e))?;
                r2.map_err(|e| GpuError::nccl("recv", e))?;
                self.copy[t.dst_gpu].record(&self.arrived[x])?;
            }
        }
        Ok(())
    }

    /// Time `repeats` iterations after `warmup`, eagerly or by replaying a captured graph.
    fn time(&self, warmup: u32, repeats: u32, capture: bool) -> Result<Vec<f64>, RuntimeError> {
        let g0 = gpu_of(self.gpus, &self.map, 0)?;
        let start = g0.event(true)?;
        let end = g0.event(true)?;
        let graph: Option<CudaGraph> = if capture {
            // One eager iteration first, so that first-use work (lazy kernel loading in
            // cuBLAS, cuDNN and the NVRTC module, NCCL's connection setup between peers,
            // which allocates) happens outside the capture, where it is allowed.
            self.enqueue()?;
            for gpu in self.gpus {
                gpu.synchronize()?;
            }
            self.origin
                .stream
                .begin_capture(drv_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(|e| GpuError::driver("beginning stream capture", e))?;
            let enq = self.enqueue();
            let graph = self
                .origin
                .stream
                .end_capture(drv_sys::CUgraphInstantiate_flags(0))
                .map_err(|e| GpuError::driver("ending stream capture", e));
            enq?;
            let graph = graph?.ok_or_else(|| RuntimeError::Plan("the capture is empty".into()))?;
            graph
                .upload()
                .map_err(|e| GpuError::driver("uploading the graph", e))?;
            Some(graph)
        } else {
            None
        };
        let mut times = Vec::with_capacity(repeats as usize);
        for r in 0..warmup + repeats {
            self.origin.record(&start)?;
            match &graph {
                Some(gr) => gr
                    .launch()
                    .map_err(|e| GpuError::driver("launching the graph", e))?,
                None => self.enqueue()?,
            }
            self.origin.record(&end)?;
            let ms = start
                .elapsed_ms(&end)
                .map_err(|e| GpuError::driver("reading the timing events", e))?;
            if r >= warmup {
                times.push(f64::from(ms));
            }
        }
        for gpu in self.gpus {
            gpu.synchronize()?;
        }
        Ok(times)
    }

    /// Every operator's output, read back (index = NodeId).
    fn outputs(&self) -> Result<Vec<Option<Vec<f32>>>, RuntimeError> {
        let mut out = vec![None; self.g.len()];
        for id in self.g.ops() {
            if let Some(Some(op)) = self.program.ops.get(id.index()) {
                out[id.index()] = Some(self.mem.borrow().read(self.gpus, op.output)?);
            }
        }
        Ok(out)
    }
}

/// Open `n` physical GPUs (all present when `None`).
pub fn open_gpus(n: Option<usize>) -> Result<Vec<Gpu>, RuntimeError> {
    opsched_gpu::check_libraries(opsched_gpu::REQUIRED)?;
    let present = opsched_gpu::devices()?.len();
    let want = n.unwrap_or(present);
    if want == 0 || want > present {
        return Err(RuntimeError::Gpu(GpuError::DeviceIndex {
            requested: want,
            available: present,
        }));
    }
    (0..want)
        .map(|i| Gpu::open(i).map_err(RuntimeError::from))
        .collect()
}

/// Run a launch plan: prepare, time, check. `priority` orders host launches (see
/// [`crate::exec::priorities`]); `None` uses the topological order.
pub fn run_plan(
    g: &Graph,
    plan: &LaunchPlan,
    priority: Option<&[u64]>,
    opts: &RunOptions,
) -> Result<RunReport, RuntimeError> {
    let gpus = open_gpus(opts.gpus)?;
    run_plan_on(g, plan, priority, &gpus, opts)
}

/// [`run_plan`] on GPUs already opened.
pub fn run_plan_on(
    g: &Graph,
    plan: &LaunchPlan,
    priority: Option<&[u64]>,
    gpus: &[Gpu],
    opts: &RunOptions,
) -> Result<RunReport, RuntimeError> {
    let topo: Vec<u64>;
    let priority = match priority {
        Some(p) => p,
        None => {
            let mut v = vec![u64::MAX; g.len()];
            for (i, id) in g.topo_order().iter().enumerate() {
                v[id.index()] = i as u64;
            }
            topo = v;
            &topo
        }
    };
    let session = Session::new(g, plan, priority, gpus, opts)?;
    let times = session.time(opts.warmup, opts.repeats.max(1), opts.graph_capture)?;
    let latency =
        Summary::of(&times).ok_or_else(|| RuntimeError::Plan("no valid timing sample".into()))?;
    let (launches, _, waits, sends, _) = session.exec.counts();
    let check = match opts.check {
        CheckMode::None => None,
        mode => Some(check(&session, gpus, opts, mode)?),
    };
    let info = &gpus[0].info;
    Ok(RunReport {
        device: info.name.clone(),
        driver: info.driver.clone(),
        cudnn: info.cudnn.clone(),
        physical_gpus: gpus.len(),
        logical_gpus: session.exec.gpus(),
        streams: session.exec.streams.clone(),
        graph_capture: opts.graph_capture,
        transfer_mode: if session.nccl.is_some() {
            "nccl".into()
        } else {
            "copy".into()
        },
        warmup: opts.warmup,
        latency,
        launches,
        waits,
        waits_dropped: session.exec.waits_dropped,
        transfers: sends,
        buffer_bytes: session.program.bytes_per_gpu().iter().sum(),
        check,
    })
}

/// Run a schedule (lowered here; its launch order drives the host order).
pub fn run_schedule(g: &Graph, s: &Schedule, opts: &RunOptions) -> Result<RunReport, RuntimeError> {
    let plan = opsched_schedule::lower(g, s)?;
    let pri = priorities(g, s);
    run_plan(g, &plan, Some(&pri), opts)
}

fn worst(g: &Graph, got: &[Option<Vec<f32>>], want: &[Option<Vec<f32>>]) -> (f64, String) {
    let mut best = (0.0f64, String::new());
    for id in g.ops() {
        if let (Some(Some(a)), Some(Some(b))) = (got.get(id.index()), want.get(id.index())) {
            let n = a.len().min(b.len());
            let e = opsched_gpu::cpu::scaled_error(&a[..n], &b[..n]);
            if e > best.0 || best.1.is_empty() {
                best = (e, g.node(id).name.clone());
            }
        }
    }
    best
}

fn check(
    s: &Session<'_>,
    gpus: &[Gpu],
    opts: &RunOptions,
    mode: CheckMode,
) -> Result<CheckReport, RuntimeError> {
    let got = s.outputs()?;
    // Sequential: every operator on one stream of GPU 0, topological order.
    let seq_sched = sequential_plan(s.g);
    let seq_opts = RunOptions {
        graph_capture: false,
        check: CheckMode::None,
        ..opts.clone()
    };
    let pri: Vec<u64> = vec![0; s.g.len()];
    let seq = Session::new(s.g, &seq_sched, &pri, &gpus[..1], &seq_opts)?;
    seq.time(0, 1, false)?;
    let want = seq.outputs()?;
    let (e_seq, n_seq) = worst(s.g, &got, &want);
    let tol_seq = 1e-4;
    let tol_cpu = if opts.kernels.tf32_conv { 2e-2 } else { 1e-3 };
    let flops: u64 = s.g.ops().map(|o| s.g.stats(o).flops).sum();
    let (vs_cpu, vs_cpu_node) = if mode == CheckMode::Full || flops <= opts.cpu_check_max_flops {
        let cpu = opsched_gpu::reference::reference(s.g)?;
        let (e, n) = worst(s.g, &want, &cpu);
        (Some(e), Some(n))
    } else {
        (None, None)
    };
    let passed = e_seq <= tol_seq && vs_cpu.is_none_or(|e| e <= tol_cpu);
    Ok(CheckReport {
        vs_sequential: e_seq,
        vs_sequential_node: n_seq,
        vs_cpu,
        vs_cpu_node,
        tolerance_sequential: tol_seq,
        tolerance_cpu: tol_cpu,
        passed,
    })
}

/// One GPU, one stream, every operator in topological order.
pub fn sequential_plan(g: &Graph) -> LaunchPlan {
    use opsched_schedule::{Cmd, GpuLaunch};
    let cmds = g.ops().map(|op| Cmd::Launch { op, stage: None }).collect();
    LaunchPlan {
        gpus: vec![GpuLaunch {
            streams: vec![cmds],
        }],
        events: 0,
        transfers: 0,
    }
}
