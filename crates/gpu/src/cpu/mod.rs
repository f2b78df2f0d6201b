//! The CPU device: the same programs and launch plans as a GPU, on the host.
//!
//! - **Streams are worker threads**, each with a queue: work on one stream runs in order,
//!   streams run concurrently (kernels use rayon inside large operators as well). Where a plan
//!   has one compute stream (one that [`Device::fit_stream`] gave operators), its thread is
//!   worker 0 of a thread pool of its own and runs its kernels' parallel loops itself; several
//!   compute streams share rayon's global pool, so that operators running at once do not
//!   oversubscribe the cores.
//! - **Events are real synchronisation**: recording an event numbers a new point of it; a wait
//!   enqueued after that blocks its stream until the point is reached (CUDA's semantics: a
//!   wait refers to the most recent record enqueued before it; waiting on an event never
//!   recorded does nothing). A plan with a missing wait therefore really races here.
//! - **A race detector** (on by default) makes such races deterministic: every stream keeps a
//!   vector clock (advanced by its own work, joined by waits and by a device-wide
//!   synchronisation), every buffer remembers its last writer and its readers since, and an
//!   access that is not ordered after a conflicting one is reported as an error naming both
//!   operators, whether or not the timing happened to work out.
//! - **Graph capture is checked as CUDA checks it**: during a capture, a stream takes part
//!   only after waiting for an event recorded in the capture, a captured wait may only refer
//!   to an event recorded in the capture, and every stream that took part must be joined back
//!   into the capturing stream before the capture ends. A replay enqueues the captured work
//!   again, in the captured order.
//! - **Errors of asynchronous work** (a race, a failing kernel) are kept and returned by the
//!   next [`Device::synchronize`], [`Device::read`] or [`Device::elapsed_ms`], like CUDA's
//!   sticky errors.

pub mod depthwise;
pub mod direct;
pub mod lanes;
pub mod math;
pub mod resize;
pub mod short_k;
pub mod window;

use std::cell::UnsafeCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use opsched_cost::cache::DeviceFingerprint;

use crate::device::{Device, DeviceReport, KernelOptions, TransferMode};
use crate::program::{BufId, GraphProgram, OpProgram};
use crate::step::Step;
use crate::GpuError;

/// Buffers one step reads and writes, as host slices (a step's CPU kernel gets them).
pub struct CpuIo<'a> {
    reads: Vec<(BufId, &'a [f32])>,
    writes: Vec<(BufId, &'a mut [f32])>,
}

impl<'a> CpuIo<'a> {
    /// The buffers of one step run on host vectors (a test's).
    #[cfg(test)]
    pub(crate) fn of(
        reads: Vec<(BufId, &'a [f32])>,
        writes: Vec<(BufId, &'a mut [f32])>,
    ) -> CpuIo<'a> {
        CpuIo { reads, writes }
    }

    /// A buffer the step reads.
    pub fn read(&self, id: BufId) -> Result<&'a [f32], GpuError> {
        self.reads
            .iter()
            .find(|(b, _)| *b == id)
            .map(|(_, s)| *s)
            .ok_or_else(|| GpuError::Plan(format!("buffer {id} is not among the step's reads")))
    }

    /// The buffer the step writes.
    pub fn write(&mut self, id: BufId) -> Result<&mut [f32], GpuError> {
        self.writes
            .iter_mut()
            .find(|(b, _)| *b == id)
            .map(|(_, s)| &mut **s)
            .ok_or_else(|| GpuError::Plan(format!("buffer {id} is not among the step's writes")))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A vector clock: per stream id, how much of its work is ordered before a point.
type VClock = Vec<u64>;

fn join(into: &mut VClock, other: &[u64]) {
    if into.len() < other.len() {
        into.resize(other.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(other) {
        *a = (*a).max(*b);
    }
}

fn covers(clock: &[u64], stream: usize, tick: u64) -> bool {
    clock.get(stream).copied().unwrap_or(0) >= tick
}

/// One access of a buffer, for the race detector.
#[derive(Clone)]
struct Touch {
    stream: usize,
    tick: u64,
    op: Arc<str>,
}

#[derive(Default)]
struct BufMeta {
    last_write: Option<Touch>,
    /// Reads since the last write (one per stream, the latest).
    reads: Vec<Touch>,
}

/// Where a buffer's elements are: `len` of them from element `first` of storage block
/// `block`, contiguous or in runs (a strided view, see [`crate::program::Runs`]).
#[derive(Clone, Copy)]
struct Place {
    block: usize,
    first: usize,
    len: usize,
    runs: Option<crate::program::Runs>,
}

impl Place {
    /// The block's ranges that hold the buffer's elements `part`, in order.
    fn ranges(&self, part: Range<usize>) -> Vec<Range<usize>> {
        crate::program::Runs::storage(self.first, self.len, self.runs, part)
    }
}

/// A program's storage on the host: one block per logical GPU, each buffer a range of one or
/// runs of one (buffers overlap where the layout lets them, see [`crate::memory`]).
struct MemInner {
    /// Per logical GPU. Cells, because steps on different streams write disjoint ranges of one
    /// block at the same time: every access goes through [`with_io`], which holds its ranges
    /// exclusively (writes) or shared (reads) while the step runs.
    blocks: Vec<Box<[UnsafeCell<f32>]>>,
    /// Per buffer: where its elements are.
    place: Vec<Place>,
    /// Ranges held by running steps, and how many steps wait for some to be released.
    held: Mutex<HeldRanges>,
    released: Condvar,
    /// The race detector's records, per *atom*: the pieces that buffer boundaries cut the
    /// blocks into, so that buffers sharing storage share records.
    meta: Vec<Mutex<BufMeta>>,
    /// Per block: the atoms' boundaries, and the index of its first atom.
    cuts: Vec<(Vec<usize>, usize)>,
}

// SAFETY: the cells are only read or written through slices that `with_io` hands out while it
// holds their ranges in `held` (no write range overlaps any other held range), so no two
// threads ever access one element unsynchronised; everything else is `Sync` already.
#[allow(unsafe_code)]
unsafe impl Sync for MemInner {}

impl MemInner {
    fn new(p: &GraphProgram) -> Result<MemInner, GpuError> {
        crate::memory::check_layout(p)?;
        let blocks = p
            .storage
            .iter()
            .map(|&n| (0..n).map(|_| UnsafeCell::new(0.0)).collect())
            .collect();
        let place: Vec<Place> = p
            .buffers
            .iter()
            .map(|b| Place {
                block: b.gpu,
                first: b.offset,
                len: b.len,
                runs: b.runs,
            })
            .collect();
        // Atom boundaries per block: where every buffer's ranges start and end.
        let mut cuts: Vec<Vec<usize>> = vec![Vec::new(); p.storage.len()];
        for pl in &place {
            let Some(c) = cuts.get_mut(pl.block) else {
                return Err(GpuError::Plan(format!(
                    "a buffer lives on GPU {}, which has no storage",
                    pl.block
                )));
            };
            for r in pl.ranges(0..pl.len) {
                c.extend([r.start, r.end]);
            }
        }
        let mut atoms_total = 0;
        let cuts = cuts
            .into_iter()
            .map(|mut c| {
                c.sort_unstable();
                c.dedup();
                let first = atoms_total;
                atoms_total += c.len().saturating_sub(1);
                (c, first)
            })
            .collect();
        Ok(MemInner {
            blocks,
            place,
            held: Mutex::new(HeldRanges::default()),
            released: Condvar::new(),
            meta: (0..atoms_total)
                .map(|_| Mutex::new(BufMeta::default()))
                .collect(),
            cuts,
        })
    }

    /// The race detector's records of the elements `part` of buffer `b` (all of it for
    /// `None`): every atom the part overlaps.
    fn atoms(
        &self,
        b: BufId,
        part: Option<Range<usize>>,
    ) -> Result<Vec<&Mutex<BufMeta>>, GpuError> {
        let pl = self.place(b)?;
        let (cuts, first) = self
            .cuts
            .get(pl.block)
            .ok_or_else(|| GpuError::Plan(format!("buffer {b} has no storage")))?;
        let mut out = Vec::new();
        for r in pl.ranges(part.unwrap_or(0..pl.len)) {
            // Atom k spans cuts[k]..cuts[k + 1].
            let from = cuts.partition_point(|&c| c <= r.start).saturating_sub(1);
            let to = cuts.partition_point(|&c| c < r.end).max(from);
            out.extend(
                self.meta.get(first + from..first + to).ok_or_else(|| {
                    GpuError::Plan(format!("buffer {b} lies outside its storage"))
                })?,
            );
        }
        Ok(out)
    }

    fn place(&self, b: BufId) -> Result<Place, GpuError> {
        self.place
            .get(b)
            .copied()
            .ok_or_else(|| GpuError::Plan(format!("buffer {b} does not exist")))
    }
}

/// A range of one storage block: (block, start, end, written).
type HeldRange = (usize, usize, usize, bool);

/// The ranges running steps hold ([`with_io`]).
#[derive(Default)]
struct HeldRanges {
    ranges: Vec<HeldRange>,
    /// Steps waiting for a conflicting range to be released: a release wakes them only
    /// where there are some (a wake-up is a system call, which every step paid).
    waiters: usize,
}

/// Ranges of storage held by one step; released when dropped (also when a kernel panics).
struct Held<'a> {
    mem: &'a MemInner,
    ranges: &'a [HeldRange],
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut held = lock(&self.mem.held);
        for r in self.ranges {
            if let Some(i) = held.ranges.iter().position(|h| h == r) {
                held.ranges.swap_remove(i);
            }
        }
        if held.waiters > 0 {
            self.mem.released.notify_all();
        }
    }
}

fn overlap(a: &(usize, usize, usize, bool), b: &(usize, usize, usize, bool)) -> bool {
    a.0 == b.0 && a.1 < b.2 && b.1 < a.2
}

/// A program's buffers on the host.
pub struct CpuMemory {
    inner: Arc<MemInner>,
}

struct OpInner {
    mem: Arc<MemInner>,
    name: Arc<str>,
    steps: Vec<Step>,
    /// Per step, its constant weights repacked once: op(A) of a product for `gemm`
    /// (`Gemm::packed_cpu`), a convolution's for the direct kernel (`Conv::panels_cpu`).
    packed: Vec<Option<Arc<[f32]>>>,
    /// Per step, the buffers it touches, found once.
    io: Vec<StepIo>,
}

/// What one step of an operator reads and writes, found when the operator is prepared: the
/// buffers (and the parts written) for the race detector, the storage [`with_io`] holds.
struct StepIo {
    reads: Vec<BufId>,
    /// The buffers written, with the parts written.
    parts: Vec<(BufId, Option<Vec<Range<usize>>>)>,
    /// Why the storage cannot be held, where it cannot: running the step reports it.
    plan: Result<IoPlan, String>,
}

impl StepIo {
    fn new(mem: &MemInner, s: &Step) -> StepIo {
        let access = s.access();
        let reads: Vec<BufId> = access.reads.iter().map(|a| a.0).collect();
        let writes: Vec<BufId> = access.writes.iter().map(|a| a.0).collect();
        let parts = writes.iter().map(|&b| (b, s.written())).collect();
        let plan = IoPlan::new(mem, &reads, &writes).map_err(|e| match e {
            GpuError::Plan(why) => why,
            e => e.to_string(),
        });
        StepIo { reads, parts, plan }
    }
}

/// A prepared operator (it holds the memory it runs on).
pub struct CpuOp {
    inner: Arc<OpInner>,
}

struct EvState {
    /// Points recorded (enqueued) so far.
    enqueued: u64,
    /// The latest point reached.
    done: u64,
    /// When the latest point was reached.
    time: Option<Instant>,
    /// The recording stream's clock at recent points (for the race detector).
    clocks: VecDeque<(u64, VClock)>,
}

struct EventInner {
    state: Mutex<EvState>,
    cv: Condvar,
}

/// An event of the CPU device.
pub struct CpuEvent {
    inner: Arc<EventInner>,
}

/// A command of a stream, before its event points are resolved.
#[derive(Clone)]
enum Cmd {
    Run(Arc<OpInner>),
    Record(Arc<EventInner>),
    Wait(Arc<EventInner>),
    Copy {
        mem: Arc<MemInner>,
        src: BufId,
        dst: BufId,
    },
}

/// A command with its event point resolved (at enqueue time, as CUDA does).
enum Job {
    Run(Arc<OpInner>),
    Record(Arc<EventInner>, u64),
    Wait(Arc<EventInner>, u64),
    Copy {
        mem: Arc<MemInner>,
        src: BufId,
        dst: BufId,
    },
}

/// Jobs a stream was given and has not finished: counted without a lock (the host and the
/// worker touch it once a job each), the lock and the condition variable only for
/// [`Device::synchronize`] to sleep on.
struct Pending {
    count: AtomicUsize,
    /// How many threads wait for the count to reach zero.
    waiters: Mutex<usize>,
    cv: Condvar,
}

impl Pending {
    /// One job done; wakes the waiters where it was the last.
    fn done(&self) {
        if self.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Under the lock: a waiter saw a non-zero count under it, so it is either not
            // yet waiting (and sees zero next) or already asleep (and is woken).
            if *lock(&self.waiters) > 0 {
                self.cv.notify_all();
            }
        }
    }

    /// Sleep until every job given so far is done.
    fn wait(&self) {
        let mut waiters = lock(&self.waiters);
        while self.count.load(Ordering::Acquire) > 0 {
            *waiters += 1;
            waiters = self
                .cv
                .wait(waiters)
                .unwrap_or_else(PoisonError::into_inner);
            *waiters -= 1;
        }
    }
}

struct StreamInner {
    id: usize,
    /// Given operators to run by [`Device::fit_stream`] (a plan's compute stream).
    fitted: AtomicBool,
    tx: Mutex<Option<Sender<Job>>>,
    pending: Arc<Pending>,
    clock: Arc<Mutex<VClock>>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        // Close the queue; the worker finishes what it has and stops.
        lock(&self.tx).take();
        if let Some(h) = lock(&self.worker).take() {
            let _ = h.join();
        }
    }
}

/// A stream of the CPU device: a worker thread with a queue.
pub struct CpuStream {
    inner: Arc<StreamInner>,
}

struct CaptureState {
    origin: usize,
    members: HashSet<usize>,
    cmds: Vec<(Arc<StreamInner>, Cmd)>,
    /// Per captured command, the commands it directly follows (same stream, or the record a
    /// wait refers to).
    preds: Vec<Vec<usize>>,
    /// Latest captured command per stream.
    last: HashMap<usize, usize>,
    /// Latest captured record per event (by address).
    recorded: HashMap<usize, usize>,
}

/// A captured iteration.
pub struct CpuGraph {
    origin: usize,
    cmds: Vec<(Arc<StreamInner>, Cmd)>,
}

struct Shared {
    next_stream: AtomicUsize,
    streams: Mutex<Vec<Weak<StreamInner>>>,
    capture: Mutex<Option<CaptureState>>,
    error: Mutex<Option<GpuError>>,
    check_races: bool,
}

impl Shared {
    fn fail(&self, e: GpuError) {
        let mut slot = lock(&self.error);
        if slot.is_none() {
            *slot = Some(e);
        }
    }

    fn take_error(&self) -> Result<(), GpuError> {
        match lock(&self.error).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Live streams that [`Device::fit_stream`] gave operators to.
    fn compute_streams(&self) -> usize {
        let streams = lock(&self.streams);
        let live = streams.iter().filter_map(Weak::upgrade);
        live.filter(|s| s.fitted.load(Ordering::Relaxed)).count()
    }
}

/// The host as a device (see the module docs).
pub struct CpuDevice {
    shared: Arc<Shared>,
}

impl Default for CpuDevice {
    fn default() -> Self {
        CpuDevice::new()
    }
}

impl CpuDevice {
    /// A CPU device with the race detector on.
    pub fn new() -> CpuDevice {
        Self::with_race_check(true)
    }

    /// A CPU device; `check_races: false` skips the detector's bookkeeping.
    pub fn with_race_check(check_races: bool) -> CpuDevice {
        CpuDevice {
            shared: Arc::new(Shared {
                next_stream: AtomicUsize::new(0),
                streams: Mutex::new(Vec::new()),
                capture: Mutex::new(None),
                error: Mutex::new(None),
                check_races,
            }),
        }
    }

    /// Enqueue `cmd` on `s`, or capture it when a capture is under way.
    fn submit(&self, s: &Arc<StreamInner>, cmd: Cmd) -> Result<(), GpuError> {
        {
            let mut cap = lock(&self.shared.capture);
            if let Some(c) = cap.as_mut() {
                return capture(c, s, cmd);
            }
        }
        let job = match cmd {
            Cmd::Run(op) => Job::Run(op),
            Cmd::Copy { mem, src, dst } => Job::Copy { mem, src, dst },
            Cmd::Record(ev) => {
                let gen = {
                    let mut st = lock(&ev.state);
                    st.enqueued += 1;
                    st.enqueued
                };
                Job::Record(ev, gen)
            }
            Cmd::Wait(ev) => {
                let gen = lock(&ev.state).enqueued;
                if gen == 0 {
                    return Ok(());
                }
                Job::Wait(ev, gen)
            }
        };
        s.pending.count.fetch_add(1, Ordering::AcqRel);
        let sent = lock(&s.tx).as_ref().map(|tx| tx.send(job).is_ok());
        if sent != Some(true) {
            s.pending.done();
            return Err(GpuError::Plan(format!("stream {} is closed", s.id)));
        }
        Ok(())
    }

    fn streams(&self) -> Vec<Arc<StreamInner>> {
        let mut v = lock(&self.shared.streams);
        v.retain(|w| w.strong_count() > 0);
        v.iter().filter_map(Weak::upgrade).collect()
    }
}

fn capture(c: &mut CaptureState, s: &Arc<StreamInner>, cmd: Cmd) -> Result<(), GpuError> {
    let idx = c.cmds.len();
    let mut preds: Vec<usize> = c.last.get(&s.id).copied().into_iter().collect();
    match &cmd {
        Cmd::Wait(ev) => match c.recorded.get(&event_key(ev)) {
            Some(&r) => {
                preds.push(r);
                c.members.insert(s.id);
            }
            None => {
                return Err(GpuError::Plan(format!(
                    "stream capture: stream {} waits for an event not recorded in the capture",
                    s.id
                )))
            }
        },
        _ if !c.members.contains(&s.id) => {
            return Err(GpuError::Plan(format!(
                "stream capture: stream {} is used without joining the capture (it must first \
                 wait for an event recorded in it)",
                s.id
            )))
        }
        Cmd::Record(ev) => {
            c.recorded.insert(event_key(ev), idx);
        }
        _ => {}
    }
    c.last.insert(s.id, idx);
    c.preds.push(preds);
    c.cmds.push((s.clone(), cmd));
    Ok(())
}

fn event_key(ev: &Arc<EventInner>) -> usize {
    Arc::as_ptr(ev) as usize
}

/// What a worker needs besides its queue.
struct WorkerCx {
    id: usize,
    clock: Arc<Mutex<VClock>>,
    pending: Arc<Pending>,
    shared: Arc<Shared>,
}

fn worker(rx: Receiver<Job>, cx: WorkerCx) {
    // Decided at the first operator, kept for the thread's life.
    let mut pool: Option<Option<OwnPool>> = None;
    while let Ok(job) = rx.recv() {
        if matches!(job, Job::Run(_)) {
            let own = pool.get_or_insert_with(|| own_pool(&cx));
            if let Some(own) = own {
                own.keep_warm(&cx.pending);
            }
        }
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| execute(&cx, job)))
            .unwrap_or_else(|_| Err(GpuError::Plan("a CPU kernel panicked".into())));
        if let Err(e) = r {
            cx.shared.fail(e);
        }
        cx.pending.done();
    }
}

/// The thread pool of the stream's own thread, where it is the only compute stream: the
/// thread is its worker 0, so a kernel's parallel loop runs on it, the pool's other threads
/// stealing parts, instead of being handed to rayon's global pool while the stream thread
/// sleeps (a wake-up of each side per loop: on 2 cores, a tenth of GoogLeNet's time and most
/// of a small model's). Several compute streams share the global pool instead, so that
/// operators running at once do not oversubscribe the cores.
fn own_pool(cx: &WorkerCx) -> Option<OwnPool> {
    if cx.shared.compute_streams() > 1 {
        return None;
    }
    let id = cx.id;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(rayon::current_num_threads())
        .use_current_thread()
        .thread_name(move |i| format!("opsched-pool-{id}.{i}"))
        .build();
    let pool = pool
        .map_err(|e| tracing::warn!("stream {id}: rayon's global pool ({e})"))
        .ok()?;
    Some(OwnPool {
        pool,
        warm: Arc::new(AtomicUsize::new(0)),
    })
}

/// A stream's own thread pool ([`own_pool`]) and how many of its other threads are kept
/// warm ([`OwnPool::keep_warm`]).
struct OwnPool {
    pool: rayon::ThreadPool,
    warm: Arc<AtomicUsize>,
}

/// How long the pool's other threads stay warm after the stream's last job.
const WARM_FOR: std::time::Duration = std::time::Duration::from_micros(100);

impl OwnPool {
    /// Keep the pool's other threads looking for work while the stream has jobs (and
    /// [`WARM_FOR`] after), instead of asleep between kernels: rayon puts an idle thread to
    /// sleep after a few dozen rounds of looking, and each parallel loop then waited for a
    /// futex wake-up before its parts were stolen. A thread kept warm runs a job that
    /// executes the pool's pending work as it appears (`rayon::yield_now`), yielding its core
    /// between, and returns once the stream has been idle that long; a job that lands on
    /// worker 0 (the stream's own thread, waiting inside a kernel's loop) returns at once, as
    /// it would otherwise hold that kernel up. On 2 cores (2026-11-29, medians of four
    /// processes alternated): GoogLeNet 8.87 -> 8.79 ms, EfficientNet-B0 4.30 -> 4.19, LLaMA
    /// 0.279 -> 0.249; spinning instead of yielding measured alike.
    fn keep_warm(&self, pending: &Arc<Pending>) {
        let others = self.pool.current_num_threads().saturating_sub(1);
        let cold = others.saturating_sub(self.warm.load(Ordering::Acquire));
        for _ in 0..cold {
            self.warm.fetch_add(1, Ordering::AcqRel);
            let (warm, pending) = (self.warm.clone(), pending.clone());
            self.pool.spawn(move || {
                if rayon::current_thread_index() != Some(0) {
                    let mut idle_since: Option<Instant> = None;
                    loop {
                        if let Some(rayon::Yield::Executed) = rayon::yield_now() {
                            idle_since = None;
                            continue;
                        }
                        if pending.count.load(Ordering::Acquire) > 0 {
                            idle_since = None;
                        } else if idle_since.get_or_insert_with(Instant::now).elapsed() > WARM_FOR {
                            break;
                        }
                        // (The core to another thread that wants it: a copy stream's.)
                        std::thread::yield_now();
                    }
                }
                warm.fetch_sub(1, Ordering::AcqRel);
            });
        }
    }
}

fn execute(cx: &WorkerCx, job: Job) -> Result<(), GpuError> {
    match job {
        Job::Run(op) => {
            let tick = advance(cx);
            for ((s, packed), io) in op.steps.iter().zip(&op.packed).zip(&op.io) {
                touch(cx, &op.mem, &io.reads, &io.parts, tick, &op.name)?;
                // A kernel that refuses its data (an index outside its table) names the
                // operator.
                let run = |io: &mut CpuIo<'_>| match (s, packed) {
                    (Step::Gemm(g), Some(a)) => g.run_cpu_packed(io, Some(a)),
                    (Step::Conv(c), Some(w)) => c.run_cpu_packed(io, Some(w)),
                    _ => s.kernel().run_cpu(io),
                };
                let ran = match &io.plan {
                    Ok(plan) => with_planned_io(&op.mem, plan, run),
                    Err(why) => Err(GpuError::Plan(why.clone())),
                };
                ran.map_err(|e| match e {
                    GpuError::Plan(m) => GpuError::Unsupported {
                        node: op.name.to_string(),
                        message: m,
                    },
                    e => e,
                })?;
            }
            Ok(())
        }
        Job::Copy { mem, src, dst } => {
            let tick = advance(cx);
            touch(cx, &mem, &[src], &[(dst, None)], tick, "transfer")?;
            with_io(&mem, &[src], &[dst], |io| {
                let s = io.read(src)?;
                let d = io.write(dst)?;
                if s.len() != d.len() {
                    return Err(GpuError::Plan(format!(
                        "transfer of {} values into a buffer of {}",
                        s.len(),
                        d.len()
                    )));
                }
                d.copy_from_slice(s);
                Ok(())
            })
        }
        Job::Record(ev, gen) => {
            let clock = lock(&cx.clock).clone();
            let mut st = lock(&ev.state);
            st.done = st.done.max(gen);
            st.time = Some(Instant::now());
            st.clocks.push_back((gen, clock));
            while st.clocks.len() > 16 {
                st.clocks.pop_front();
            }
            ev.cv.notify_all();
            Ok(())
        }
        Job::Wait(ev, gen) => {
            let mut st = lock(&ev.state);
            while st.done < gen {
                st = ev.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
            }
            // The clock of the point waited for (or of the earliest later one still kept).
            if let Some((_, c)) = st.clocks.iter().find(|(g, _)| *g >= gen) {
                join(&mut lock(&cx.clock), c);
            }
            Ok(())
        }
    }
}

/// Advance the stream's own clock entry: the tick of the work about to run.
fn advance(cx: &WorkerCx) -> u64 {
    let mut c = lock(&cx.clock);
    if c.len() <= cx.id {
        c.resize(cx.id + 1, 0);
    }
    c[cx.id] += 1;
    c[cx.id]
}

/// The race detector: check that this access is ordered after every conflicting one, then
/// record it.
fn touch(
    cx: &WorkerCx,
    mem: &MemInner,
    reads: &[BufId],
    writes: &[(BufId, Option<Vec<Range<usize>>>)],
    tick: u64,
    op: &str,
) -> Result<(), GpuError> {
    if !cx.shared.check_races {
        return Ok(());
    }
    let clock = lock(&cx.clock).clone();
    let me: Arc<str> = Arc::from(op);
    let race = |b: BufId, what: &str, other: &Touch| {
        GpuError::Plan(format!(
            "race on buffer {b}: '{op}' (stream {}) {what} '{}' (stream {}) with nothing \
             ordering them (a missing wait)",
            cx.id, other.op, other.stream
        ))
    };
    for &b in reads {
        for meta in mem.atoms(b, None)? {
            let mut m = lock(meta);
            if let Some(w) = &m.last_write {
                if w.stream != cx.id && !covers(&clock, w.stream, w.tick) {
                    return Err(race(b, "reads what is written by", w));
                }
            }
            m.reads.retain(|r| r.stream != cx.id);
            m.reads.push(Touch {
                stream: cx.id,
                tick,
                op: me.clone(),
            });
        }
    }
    for (b, parts) in writes {
        let b = *b;
        let atoms = match parts {
            None => mem.atoms(b, None)?,
            Some(parts) => {
                let mut atoms = Vec::new();
                for p in parts {
                    atoms.extend(mem.atoms(b, Some(p.clone()))?);
                }
                atoms
            }
        };
        for meta in atoms {
            let mut m = lock(meta);
            if let Some(w) = &m.last_write {
                if w.stream != cx.id && !covers(&clock, w.stream, w.tick) {
                    return Err(race(b, "overwrites what is written by", w));
                }
            }
            if let Some(r) = m
                .reads
                .iter()
                .find(|r| r.stream != cx.id && !covers(&clock, r.stream, r.tick))
            {
                return Err(race(b, "overwrites what is read by", r));
            }
            m.reads.clear();
            m.last_write = Some(Touch {
                stream: cx.id,
                tick,
                op: me.clone(),
            });
        }
    }
    Ok(())
}

/// Where the buffers one step reads and writes lie, and the storage ranges it holds while
/// it runs: found once per step when an operator is prepared ([`StepIo`]), not on every run.
struct IoPlan {
    /// Each buffer once, sorted, with whether the step writes it.
    ids: Vec<(BufId, bool)>,
    places: Vec<Place>,
    ranges: Vec<HeldRange>,
}

impl IoPlan {
    fn new(mem: &MemInner, reads: &[BufId], writes: &[BufId]) -> Result<IoPlan, GpuError> {
        let mut ids: Vec<(BufId, bool)> = reads
            .iter()
            .map(|&b| (b, false))
            .chain(writes.iter().map(|&b| (b, true)))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let mut ranges = Vec::with_capacity(ids.len());
        let mut places = Vec::with_capacity(ids.len());
        for &(b, w) in &ids {
            let pl = mem.place(b)?;
            ranges.extend(
                pl.ranges(0..pl.len)
                    .into_iter()
                    .map(|r| (pl.block, r.start, r.end, w)),
            );
            places.push(pl);
        }
        for (i, a) in ranges.iter().enumerate() {
            if ranges[..i].iter().any(|b| (a.3 || b.3) && overlap(a, b)) {
                return Err(GpuError::Plan(
                    "a step reads and writes the same storage".into(),
                ));
            }
        }
        Ok(IoPlan {
            ids,
            places,
            ranges,
        })
    }
}

/// Hold the storage of the buffers a step reads and writes (all at once, so concurrent steps
/// cannot deadlock; waiting while a conflicting range is held) and run `f` on them.
fn with_io<T>(
    mem: &MemInner,
    reads: &[BufId],
    writes: &[BufId],
    f: impl FnOnce(&mut CpuIo<'_>) -> Result<T, GpuError>,
) -> Result<T, GpuError> {
    with_planned_io(mem, &IoPlan::new(mem, reads, writes)?, f)
}

/// [`with_io`] of a plan made before.
#[allow(unsafe_code)]
fn with_planned_io<T>(
    mem: &MemInner,
    plan: &IoPlan,
    f: impl FnOnce(&mut CpuIo<'_>) -> Result<T, GpuError>,
) -> Result<T, GpuError> {
    let IoPlan {
        ids,
        places,
        ranges,
    } = plan;
    let guard = {
        let mut held = lock(&mem.held);
        let conflict = |held: &HeldRanges| {
            ranges
                .iter()
                .any(|a| held.ranges.iter().any(|b| (a.3 || b.3) && overlap(a, b)))
        };
        while conflict(&held) {
            held.waiters += 1;
            held = mem
                .released
                .wait(held)
                .unwrap_or_else(PoisonError::into_inner);
            held.waiters -= 1;
        }
        held.ranges.extend(ranges.iter().copied());
        Held { mem, ranges }
    };
    let cells = |b: BufId, pl: &Place, r: Range<usize>| {
        mem.blocks
            .get(pl.block)
            .and_then(|blk| blk.get(r))
            .ok_or_else(|| GpuError::Plan(format!("buffer {b} lies outside its storage")))
    };
    // A strided view is gathered into a vector of its own for the step (and written back
    // after it), so every kernel sees one slice; the vectors are this thread's, kept between
    // steps (no fresh pages to fault in every inference).
    let mut gathered: Vec<Vec<f32>> = Vec::with_capacity(ids.len());
    for (&(b, _), pl) in ids.iter().zip(places) {
        let mut v = Vec::new();
        if pl.runs.is_some() {
            v = GATHERED.with(|g| g.borrow_mut().pop()).unwrap_or_default();
            v.clear();
            v.reserve(pl.len);
            for r in pl.ranges(0..pl.len) {
                // SAFETY: `guard` holds the range (for reading at least): nobody writes it.
                v.extend(cells(b, pl, r)?.iter().map(|c| unsafe { *c.get() }));
            }
        }
        gathered.push(v);
    }
    let mut io = CpuIo {
        reads: Vec::with_capacity(ids.len()),
        writes: Vec::with_capacity(ids.len()),
    };
    for ((&(b, w), pl), own) in ids.iter().zip(places).zip(gathered.iter_mut()) {
        if pl.runs.is_some() {
            if w {
                io.writes.push((b, own.as_mut_slice()));
            } else {
                io.reads.push((b, own.as_slice()));
            }
            continue;
        }
        let cells = cells(b, pl, pl.first..pl.first + pl.len)?;
        let ptr = UnsafeCell::raw_get(cells.as_ptr());
        if w {
            // SAFETY: `cells` is in bounds, `UnsafeCell<f32>` has the layout of `f32`, and
            // `guard` holds this range for writing: no other slice of it exists until the
            // guard drops, which outlives `io`.
            io.writes.push((b, unsafe {
                std::slice::from_raw_parts_mut(ptr, cells.len())
            }));
        } else {
            // SAFETY: as above; the range is held for reading, so nobody writes it meanwhile.
            io.reads
                .push((b, unsafe { std::slice::from_raw_parts(ptr, cells.len()) }));
        }
    }
    let r = f(&mut io);
    drop(io);
    for ((&(b, w), pl), own) in ids.iter().zip(places).zip(&gathered) {
        if !(w && pl.runs.is_some()) {
            continue;
        }
        let mut from = own.iter();
        for range in pl.ranges(0..pl.len) {
            for (c, v) in cells(b, pl, range)?.iter().zip(&mut from) {
                // SAFETY: `guard` still holds the range for writing.
                unsafe { *c.get() = *v };
            }
        }
    }
    drop(guard);
    GATHERED.with(|g| {
        g.borrow_mut()
            .extend(gathered.into_iter().filter(|v| v.capacity() > 0))
    });
    r
}

thread_local! {
    /// Vectors [`with_io`] gathers strided views into, kept between steps.
    static GATHERED: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Device for CpuDevice {
    type Stream = CpuStream;
    type Event = CpuEvent;
    type Memory = CpuMemory;
    type Op = CpuOp;
    type Graph = CpuGraph;

    fn report(&self) -> DeviceReport {
        let threads = rayon::current_num_threads();
        let name = format!("CPU ({threads} threads)");
        DeviceReport {
            backend: "cpu",
            name: name.clone(),
            driver: String::new(),
            libraries: "gemm 0.19, rayon 1".into(),
            units: 1,
            fingerprint: DeviceFingerprint {
                name,
                sms: u32::try_from(threads).unwrap_or(u32::MAX),
                driver: String::new(),
                cudnn: String::new(),
            },
        }
    }

    fn units(&self) -> usize {
        1
    }

    fn alloc(&self, p: &GraphProgram, _map: &[usize]) -> Result<CpuMemory, GpuError> {
        let inner = Arc::new(MemInner::new(p)?);
        for i in 0..p.buffers.len() {
            if let Some(data) = p.initial_data(i) {
                with_io(&inner, &[], &[i], |io| {
                    io.write(i)?.copy_from_slice(&data);
                    Ok(())
                })?;
            }
        }
        Ok(CpuMemory { inner })
    }

    fn read(&self, m: &CpuMemory, id: BufId) -> Result<Vec<f32>, GpuError> {
        self.synchronize()?;
        with_io(&m.inner, &[id], &[], |io| Ok(io.read(id)?.to_vec()))
    }

    fn write(&self, m: &CpuMemory, id: BufId, data: &[f32]) -> Result<(), GpuError> {
        self.synchronize()?;
        with_io(&m.inner, &[], &[id], |io| {
            let b = io.write(id)?;
            if b.len() != data.len() {
                return Err(GpuError::Plan(format!(
                    "buffer {id} holds {} values, {} given",
                    b.len(),
                    data.len()
                )));
            }
            b.copy_from_slice(data);
            Ok(())
        })
    }

    fn stream(&self, _unit: usize) -> Result<CpuStream, GpuError> {
        let id = self.shared.next_stream.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = channel();
        let pending = Arc::new(Pending {
            count: AtomicUsize::new(0),
            waiters: Mutex::new(0),
            cv: Condvar::new(),
        });
        let clock = Arc::new(Mutex::new(VClock::new()));
        let cx = WorkerCx {
            id,
            clock: clock.clone(),
            pending: pending.clone(),
            shared: self.shared.clone(),
        };
        let handle = std::thread::Builder::new()
            .name(format!("opsched-stream-{id}"))
            .spawn(move || worker(rx, cx))
            .map_err(|e| GpuError::Plan(format!("starting a stream thread: {e}")))?;
        let inner = Arc::new(StreamInner {
            id,
            fitted: AtomicBool::new(false),
            tx: Mutex::new(Some(tx)),
            pending,
            clock,
            worker: Mutex::new(Some(handle)),
        });
        lock(&self.shared.streams).push(Arc::downgrade(&inner));
        Ok(CpuStream { inner })
    }

    fn event(&self, _unit: usize, _timing: bool) -> Result<CpuEvent, GpuError> {
        Ok(CpuEvent {
            inner: Arc::new(EventInner {
                state: Mutex::new(EvState {
                    enqueued: 0,
                    done: 0,
                    time: None,
                    clocks: VecDeque::new(),
                }),
                cv: Condvar::new(),
            }),
        })
    }

    fn record(&self, s: &CpuStream, e: &CpuEvent) -> Result<(), GpuError> {
        self.submit(&s.inner, Cmd::Record(e.inner.clone()))
    }

    fn wait(&self, s: &CpuStream, e: &CpuEvent) -> Result<(), GpuError> {
        self.submit(&s.inner, Cmd::Wait(e.inner.clone()))
    }

    fn elapsed_ms(&self, start: &CpuEvent, end: &CpuEvent) -> Result<f64, GpuError> {
        let reached = |e: &CpuEvent| -> Result<Instant, GpuError> {
            let mut st = lock(&e.inner.state);
            if st.enqueued == 0 {
                return Err(GpuError::Plan("timing an event never recorded".into()));
            }
            let want = st.enqueued;
            while st.done < want {
                st = e.inner.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
            }
            st.time
                .ok_or_else(|| GpuError::Plan("an event without a time".into()))
        };
        let (a, b) = (reached(start)?, reached(end)?);
        self.shared.take_error()?;
        Ok(b.saturating_duration_since(a).as_secs_f64() * 1e3)
    }

    fn prepare(
        &self,
        p: &GraphProgram,
        m: &CpuMemory,
        op: &OpProgram,
        _opts: &KernelOptions,
    ) -> Result<CpuOp, GpuError> {
        for s in &op.steps {
            crate::program::check_access(p, s)?;
        }
        // A linear layer's or a convolution's weights, repacked once as they are now (the
        // runtime writes only inputs later; `Device::write` says weights go before `prepare`).
        // No kernel writes a weight: it is read where it lies, without waiting for the streams.
        let constant = |b: BufId| {
            matches!(
                p.buffers.get(b).map(|b| &b.role),
                Some(crate::program::BufRole::Param { .. })
            )
        };
        let (steps, packed): (Vec<Step>, Vec<_>) = op
            .steps
            .iter()
            .map(|s| match s {
                Step::Gemm(g) if constant(g.a) => {
                    let packed =
                        with_io(&m.inner, &[g.a], &[], |io| Ok(g.packed_cpu(io.read(g.a)?)));
                    match packed.ok().flatten() {
                        Some((g, t)) => (Step::Gemm(g), Some(Arc::from(t))),
                        None => (s.clone(), None),
                    }
                }
                Step::Conv(c) if constant(c.w) => {
                    let panels =
                        with_io(&m.inner, &[c.w], &[], |io| Ok(c.panels_cpu(io.read(c.w)?)));
                    (s.clone(), panels.ok().flatten().map(Arc::from))
                }
                _ => (s.clone(), None),
            })
            .unzip();
        let io = steps.iter().map(|s| StepIo::new(&m.inner, s)).collect();
        Ok(CpuOp {
            inner: Arc::new(OpInner {
                mem: m.inner.clone(),
                name: Arc::from(op.name.as_str()),
                steps,
                packed,
                io,
            }),
        })
    }

    fn fit_stream(&self, s: &mut CpuStream, ops: &[&CpuOp]) -> Result<(), GpuError> {
        s.inner.fitted.store(!ops.is_empty(), Ordering::Relaxed);
        Ok(())
    }

    fn launch(&self, op: &CpuOp, s: &CpuStream) -> Result<(), GpuError> {
        self.submit(&s.inner, Cmd::Run(op.inner.clone()))
    }

    fn connect(
        &self,
        _m: &mut CpuMemory,
        _copy: &[CpuStream],
        mode: TransferMode,
    ) -> Result<&'static str, GpuError> {
        match mode {
            TransferMode::Nccl => Err(GpuError::Plan(
                "NCCL transfers need CUDA GPUs (the CPU device copies)".into(),
            )),
            TransferMode::Auto | TransferMode::Copy => Ok("copy"),
        }
    }

    fn transfer(
        &self,
        m: &CpuMemory,
        src: BufId,
        dst: BufId,
        (_, dst_gpu): (usize, usize),
        copy: &[CpuStream],
    ) -> Result<(), GpuError> {
        let s = copy
            .get(dst_gpu)
            .ok_or_else(|| GpuError::Plan(format!("no copy stream for GPU {dst_gpu}")))?;
        self.submit(
            &s.inner,
            Cmd::Copy {
                mem: m.inner.clone(),
                src,
                dst,
            },
        )
    }

    fn synchronize(&self) -> Result<(), GpuError> {
        let streams = self.streams();
        for s in &streams {
            s.pending.wait();
        }
        // Everything done so far is now ordered before anything enqueued later.
        let mut all = VClock::new();
        for s in &streams {
            join(&mut all, &lock(&s.clock));
        }
        for s in &streams {
            join(&mut lock(&s.clock), &all);
        }
        self.shared.take_error()
    }

    fn begin_capture(&self, s: &CpuStream) -> Result<(), GpuError> {
        let mut cap = lock(&self.shared.capture);
        if cap.is_some() {
            return Err(GpuError::Plan(
                "a stream capture is already under way".into(),
            ));
        }
        *cap = Some(CaptureState {
            origin: s.inner.id,
            members: HashSet::from([s.inner.id]),
            cmds: Vec::new(),
            preds: Vec::new(),
            last: HashMap::new(),
            recorded: HashMap::new(),
        });
        Ok(())
    }

    fn end_capture(&self, s: &CpuStream) -> Result<CpuGraph, GpuError> {
        let c = lock(&self.shared.capture)
            .take()
            .ok_or_else(|| GpuError::Plan("no stream capture is under way".into()))?;
        if c.origin != s.inner.id {
            return Err(GpuError::Plan(format!(
                "stream capture began on stream {} and ends on stream {}",
                c.origin, s.inner.id
            )));
        }
        let Some(&end) = c.last.get(&c.origin) else {
            return Err(GpuError::Plan("the capture is empty".into()));
        };
        // Every captured command must be ordered before the capturing stream's last one.
        let mut joined = vec![false; c.cmds.len()];
        let mut stack = vec![end];
        while let Some(i) = stack.pop() {
            if !std::mem::replace(&mut joined[i], true) {
                stack.extend(&c.preds[i]);
            }
        }
        if let Some(i) = joined.iter().position(|j| !j) {
            return Err(GpuError::Plan(format!(
                "stream capture: work on stream {} is not joined back into the capturing \
                 stream before the capture ends",
                c.cmds[i].0.id
            )));
        }
        Ok(CpuGraph {
            origin: c.origin,
            cmds: c.cmds,
        })
    }

    fn replay(&self, g: &CpuGraph, s: &CpuStream) -> Result<(), GpuError> {
        for (stream, cmd) in &g.cmds {
            let target = if stream.id == g.origin {
                &s.inner
            } else {
                stream
            };
            self.submit(target, cmd.clone())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rayon::prelude::*;
    use std::time::Duration;

    /// A stream's own pool keeps its other thread warm while the stream has a job (one job
    /// however often asked), runs parallel work on it meanwhile, and lets it go once the
    /// stream is idle (the job keeping it warm returns).
    #[test]
    fn pool_threads_stay_warm_only_while_the_stream_has_jobs() {
        // On a thread of its own, which becomes the pool's worker 0.
        std::thread::spawn(|| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .use_current_thread()
                .build()
                .unwrap();
            let own = OwnPool {
                pool,
                warm: Arc::new(AtomicUsize::new(0)),
            };
            let pending = Arc::new(Pending {
                count: AtomicUsize::new(1),
                waiters: Mutex::new(0),
                cv: Condvar::new(),
            });
            own.keep_warm(&pending);
            own.keep_warm(&pending);
            assert_eq!(own.warm.load(Ordering::Acquire), 1, "one job keeps it warm");
            std::thread::sleep(WARM_FOR * 50);
            assert_eq!(
                own.warm.load(Ordering::Acquire),
                1,
                "cold while the stream had a job"
            );
            let sum: u64 = (0..1_000_000u64).into_par_iter().map(|v| v % 7).sum();
            assert_eq!(sum, (0..1_000_000u64).map(|v| v % 7).sum::<u64>());
            pending.count.store(0, Ordering::Release);
            let start = Instant::now();
            while own.warm.load(Ordering::Acquire) > 0 {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "still warm when idle"
                );
                std::thread::yield_now();
            }
        })
        .join()
        .unwrap();
    }
}
