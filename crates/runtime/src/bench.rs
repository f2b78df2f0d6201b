//! Timing pieces of a graph on one device unit: one operator alone, a concurrent stage
//! (groups started together on separate streams, each running its operators in order), a
//! transfer. This is what the profiler measures.
//!
//! Times come from the device, not the host: the piece is captured `copies` times back to
//! back into one graph, the graph is replayed between two timing events, and the elapsed
//! time is divided by `copies`. Host enqueue cost (about 12 us per launch on an H100, more
//! than many operators take) is thus out of the measurement, and what remains is what the
//! operator costs inside a replayed graph, which is how plans run. [`Bench::time_eager`]
//! keeps the host-enqueued measurement for comparison.
//!
//! Every buffer of the graph is allocated and every operator prepared once, and the whole
//! graph runs once first, so that every input holds real data.

use opsched_gpu::program::{BufRole, BufSpec, Init, Layout};
use opsched_gpu::{Device, GraphProgram, KernelOptions, Summary, TransferMode};
use opsched_graph::{Graph, NodeId};

use crate::RuntimeError;

/// A graph prepared on one unit of a device with a pool of streams.
pub struct Bench<'a, D: Device> {
    dev: &'a D,
    program: GraphProgram,
    ops: Vec<Option<D::Op>>,
    _mem: D::Memory,
    streams: Vec<D::Stream>,
    origin: D::Stream,
    fork: D::Event,
    joins: Vec<D::Event>,
    start: D::Event,
    end: D::Event,
}

fn sample(v: &[f64]) -> Result<Summary, RuntimeError> {
    Summary::of(v).ok_or_else(|| RuntimeError::Plan("no valid timing sample".into()))
}

impl<'a, D: Device> Bench<'a, D> {
    /// Prepare `g` on unit `unit` of `dev` with `streams` streams (at least 1), its
    /// activations stored as the device prefers (as `opsched run` stores them:
    /// [`opsched_gpu::Device::preferred_layout`]), so an operator's time includes the
    /// transposes its program runs.
    pub fn new(
        dev: &'a D,
        unit: usize,
        g: &Graph,
        streams: usize,
        kernels: KernelOptions,
    ) -> Result<Bench<'a, D>, RuntimeError> {
        Self::new_in(dev, unit, g, streams, kernels, dev.preferred_layout())
    }

    /// [`Bench::new`] with the activations stored in `layout`.
    pub fn new_in(
        dev: &'a D,
        unit: usize,
        g: &Graph,
        streams: usize,
        kernels: KernelOptions,
        layout: Layout,
    ) -> Result<Bench<'a, D>, RuntimeError> {
        let program = GraphProgram::single_gpu_in(g, layout)?;
        let mem = dev.alloc(&program, &[unit])?;
        let mut ops = Vec::with_capacity(program.ops.len());
        for op in &program.ops {
            ops.push(match op {
                Some(op) => Some(dev.prepare(&program, &mem, op, &kernels)?),
                None => None,
            });
        }
        let all: Vec<&D::Op> = ops.iter().flatten().collect();
        let mut pool = Vec::with_capacity(streams.max(1));
        let mut joins = Vec::with_capacity(streams.max(1));
        for _ in 0..streams.max(1) {
            let mut s = dev.stream(unit)?;
            dev.fit_stream(&mut s, &all)?;
            pool.push(s);
            joins.push(dev.event(unit, false)?);
        }
        let mut origin = dev.stream(unit)?;
        dev.fit_stream(&mut origin, &all)?;
        let b = Bench {
            dev,
            program,
            ops,
            _mem: mem,
            streams: pool,
            origin,
            fork: dev.event(unit, false)?,
            joins,
            start: dev.event(unit, true)?,
            end: dev.event(unit, true)?,
        };
        // One full sequential pass: every buffer now holds what the graph computes.
        let all: Vec<NodeId> = g.ops().collect();
        b.enqueue(&[all])?;
        dev.synchronize()?;
        Ok(b)
    }

    /// The program (its operators' steps, for resource tables).
    pub fn program(&self) -> &GraphProgram {
        &self.program
    }

    fn op(&self, op: NodeId) -> Result<&D::Op, RuntimeError> {
        self.ops
            .get(op.index())
            .and_then(Option::as_ref)
            .ok_or_else(|| RuntimeError::Plan(format!("#{} is not an operator", op.0)))
    }

    /// One group runs on the origin stream; several fork from it and join back.
    fn enqueue(&self, groups: &[Vec<NodeId>]) -> Result<(), RuntimeError> {
        let dev = self.dev;
        if let [only] = groups {
            for &op in only {
                dev.launch(self.op(op)?, &self.origin)?;
            }
            return Ok(());
        }
        if groups.len() > self.streams.len() {
            return Err(RuntimeError::Plan(format!(
                "{} groups but only {} streams",
                groups.len(),
                self.streams.len()
            )));
        }
        dev.record(&self.origin, &self.fork)?;
        for (s, grp) in self.streams.iter().zip(groups) {
            dev.wait(s, &self.fork)?;
            for &op in grp {
                dev.launch(self.op(op)?, s)?;
            }
        }
        for ((s, ev), _) in self.streams.iter().zip(&self.joins).zip(groups) {
            dev.record(s, ev)?;
            dev.wait(&self.origin, ev)?;
        }
        Ok(())
    }

    /// Device time of `groups` run concurrently (one group alone: an operator chain; one
    /// operator alone: its time), from `repeats` replays (after `warmup`) of a graph holding
    /// `copies` back-to-back copies of it.
    pub fn time(
        &self,
        groups: &[Vec<NodeId>],
        copies: u32,
        warmup: u32,
        repeats: u32,
    ) -> Result<Summary, RuntimeError> {
        let dev = self.dev;
        let copies = copies.max(1);
        dev.begin_capture(&self.origin)?;
        let enq = (0..copies).try_for_each(|_| self.enqueue(groups));
        let graph = dev.end_capture(&self.origin);
        enq?;
        let graph = graph?;
        let mut v = Vec::with_capacity(repeats as usize);
        for r in 0..warmup + repeats.max(1) {
            dev.record(&self.origin, &self.start)?;
            dev.replay(&graph, &self.origin)?;
            dev.record(&self.origin, &self.end)?;
            let ms = dev.elapsed_ms(&self.start, &self.end)?;
            if r >= warmup {
                v.push(ms / f64::from(copies));
            }
        }
        sample(&v)
    }

    /// Host-enqueued time of `groups` (launch overhead included), as eager execution sees it.
    pub fn time_eager(
        &self,
        groups: &[Vec<NodeId>],
        warmup: u32,
        repeats: u32,
    ) -> Result<Summary, RuntimeError> {
        let dev = self.dev;
        let mut v = Vec::with_capacity(repeats as usize);
        for r in 0..warmup + repeats.max(1) {
            dev.record(&self.origin, &self.start)?;
            self.enqueue(groups)?;
            dev.record(&self.origin, &self.end)?;
            let ms = dev.elapsed_ms(&self.start, &self.end)?;
            if r >= warmup {
                v.push(ms);
            }
        }
        sample(&v)
    }
}

/// Device time of moving `bytes` from unit `src` to unit `dst` of `dev` (the same unit: a
/// device-to-device copy), timed on the destination's copy stream.
pub fn time_transfer<D: Device>(
    dev: &D,
    (src, dst): (usize, usize),
    bytes: usize,
    warmup: u32,
    repeats: u32,
) -> Result<Summary, RuntimeError> {
    let n = bytes.div_ceil(4).max(1);
    let buf = |gpu| BufSpec::new(gpu, n, BufRole::Probe, Init::Uninit);
    let mut program = GraphProgram {
        buffers: vec![buf(0), buf(1)],
        transfers: vec![(0, 1)],
        gpus: 2,
        ..GraphProgram::default()
    };
    opsched_gpu::memory::layout_distinct(&mut program);
    let mut mem = dev.alloc(&program, &[src, dst])?;
    let copy = vec![dev.stream(src)?, dev.stream(dst)?];
    dev.connect(&mut mem, &copy, TransferMode::Copy)?;
    let (start, end) = (dev.event(dst, true)?, dev.event(dst, true)?);
    let mut v = Vec::with_capacity(repeats as usize);
    for r in 0..warmup + repeats.max(1) {
        dev.record(&copy[1], &start)?;
        dev.transfer(&mem, 0, 1, (0, 1), &copy)?;
        dev.record(&copy[1], &end)?;
        let ms = dev.elapsed_ms(&start, &end)?;
        if r >= warmup {
            v.push(ms);
        }
    }
    dev.synchronize()?;
    sample(&v)
}
