//! Timing pieces of a graph on one GPU: one operator alone, or a concurrent stage (groups
//! started together on separate streams, each running its operators in order). This is what
//! the profiler measures; every buffer of the graph is allocated and every operator prepared
//! once, and the whole graph runs once first so that every input holds real data.

use cudarc::driver::CudaEvent;
use opsched_gpu::cuda::{self, DeviceMemory, Gpu, KernelOptions, PreparedOp, StreamCtx};
use opsched_gpu::{GraphProgram, Summary};
use opsched_graph::{Graph, NodeId};

use crate::RuntimeError;

/// A graph prepared on one GPU with a pool of streams.
pub struct Bench<'a> {
    pub gpu: &'a Gpu,
    pub program: GraphProgram,
    pub mem: DeviceMemory,
    pub ops: Vec<Option<PreparedOp>>,
    streams: Vec<StreamCtx>,
    origin: StreamCtx,
    fork: CudaEvent,
    joins: Vec<CudaEvent>,
    start: CudaEvent,
    end: CudaEvent,
}

impl<'a> Bench<'a> {
    /// Prepare `g` on `gpu` with `streams` streams (at least 1).
    pub fn new(
        g: &Graph,
        gpu: &'a Gpu,
        streams: usize,
        kernels: KernelOptions,
    ) -> Result<Bench<'a>, RuntimeError> {
        let program = GraphProgram::single_gpu(g)?;
        let gpus = std::slice::from_ref(gpu);
        let mem = DeviceMemory::alloc(&program, gpus, &[0])?;
        let mut prep = vec![gpu.new_stream()?];
        let ops = cuda::prepare(&program, &mem, gpus, &[0], &mut prep, kernels)?;
        let ws = ops.iter().flatten().map(|p| p.workspace).max().unwrap_or(0);
        let mut pool = Vec::with_capacity(streams.max(1));
        let mut joins = Vec::with_capacity(streams.max(1));
        for _ in 0..streams.max(1) {
            let mut sc = gpu.new_stream()?;
            sc.ensure_workspace(ws)?;
            pool.push(sc);
            joins.push(gpu.event(false)?);
        }
        let b = Bench {
            gpu,
            program,
            mem,
            ops,
            streams: pool,
            origin: gpu.new_stream()?,
            fork: gpu.event(false)?,
            joins,
            start: gpu.event(true)?,
            end: gpu.event(true)?,
        };
        // One full sequential pass: every buffer now holds what the graph computes.
        let all: Vec<NodeId> = g.ops().collect();
        b.enqueue(&[all])?;
        gpu.synchronize()?;
        Ok(b)
    }

    fn enqueue(&self, groups: &[Vec<NodeId>]) -> Result<(), RuntimeError> {
        if groups.len() > self.streams.len() {
            return Err(RuntimeError::Plan(format!(
                "{} groups but only {} streams",
                groups.len(),
                self.streams.len()
            )));
        }
        self.origin.record(&self.fork)?;
        for (sc, grp) in self.streams.iter().zip(groups) {
            sc.wait(&self.fork)?;
            for op in grp {
                let p = self
                    .ops
                    .get(op.index())
                    .and_then(Option::as_ref)
                    .ok_or_else(|| RuntimeError::Plan(format!("#{} is not an operator", op.0)))?;
                p.launch(self.gpu, sc)?;
            }
        }
        for ((sc, ev), _) in self.streams.iter().zip(&self.joins).zip(groups) {
            sc.record(ev)?;
            self.origin.wait(ev)?;
        }
        Ok(())
    }

    /// Time `groups` run concurrently (one group alone: an operator chain; one operator alone:
    /// its time), `repeats` times after `warmup`.
    pub fn time(
        &self,
        groups: &[Vec<NodeId>],
        warmup: u32,
        repeats: u32,
    ) -> Result<Summary, RuntimeError> {
        let mut v = Vec::with_capacity(repeats as usize);
        for r in 0..warmup + repeats.max(1) {
            self.origin.record(&self.start)?;
            self.enqueue(groups)?;
            self.origin.record(&self.end)?;
            let ms = self
                .start
                .elapsed_ms(&self.end)
                .map_err(|e| opsched_gpu::GpuError::driver("reading timing events", e))?;
            if r >= warmup {
                v.push(f64::from(ms));
            }
        }
        Summary::of(&v).ok_or_else(|| RuntimeError::Plan("no valid timing sample".into()))
    }
}

/// Time copies of `bytes` from physical GPU `src` to `dst` (the same GPU: a device-to-device
/// copy), on a stream of `dst`.
pub fn time_copy(
    src: &Gpu,
    dst: &Gpu,
    bytes: usize,
    warmup: u32,
    repeats: u32,
) -> Result<Summary, RuntimeError> {
    use cudarc::driver::DevicePtr;
    let n = bytes.div_ceil(4).max(1);
    let a = src
        .alloc_stream
        .alloc_zeros::<f32>(n)
        .map_err(|e| opsched_gpu::GpuError::driver("allocating a transfer buffer", e))?;
    let b = dst
        .alloc_stream
        .alloc_zeros::<f32>(n)
        .map_err(|e| opsched_gpu::GpuError::driver("allocating a transfer buffer", e))?;
    src.synchronize()?;
    dst.synchronize()?;
    cuda::enable_peer_access(dst, src)?;
    let (pa, _) = a.device_ptr(&src.alloc_stream);
    let (pb, _) = b.device_ptr(&dst.alloc_stream);
    let sc = dst.new_stream()?;
    let (start, end) = (dst.event(true)?, dst.event(true)?);
    let mut v = Vec::new();
    for r in 0..warmup + repeats.max(1) {
        sc.record(&start)?;
        cuda::copy_between(src, pa, dst, pb, n * 4, &sc)?;
        sc.record(&end)?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(|e| opsched_gpu::GpuError::driver("reading timing events", e))?;
        if r >= warmup {
            v.push(f64::from(ms));
        }
    }
    Summary::of(&v).ok_or_else(|| RuntimeError::Plan("no valid timing sample".into()))
}
