//! The CUDA device: NVIDIA GPUs through cudarc (driver API, cuDNN, cuBLAS, NVRTC, NCCL).
//!
//! - [`CudaDevice`] opens the physical GPUs ([`Gpu`]: a context with cudarc's event tracking
//!   off, the compiled NVRTC kernels, an allocation stream, a preparation stream for algorithm
//!   searches) and implements [`Device`].
//! - [`StreamCtx`] is one stream with its own cuDNN and cuBLAS handles and workspaces.
//! - [`CudaMemory`] owns a program's buffers; prepared operators ([`CudaOp`]) hold it, so the
//!   device pointers they resolved stay valid as long as they exist. Raw pointers never leave
//!   this module tree (the per-kind CUDA halves in [`crate::step`] belong to it).
//!
//! Synchronisation is ours alone: cudarc never inserts a wait or an event record, every
//! cross-stream order comes from the launch plan's events.
//!
//! All calls into CUDA libraries are `unsafe`: each block states the invariant it relies on
//! (pointers come from live allocations of the sizes the program computed and were checked
//! against each step's access at preparation, descriptors match the buffers, the right context
//! is bound).
#![allow(unsafe_code)]

pub(crate) mod cudnn;
pub(crate) mod engine;
#[cfg(test)]
mod host_check;
#[cfg(test)]
mod layout_ab;
pub mod nvrtc;
#[cfg(test)]
mod nvrtc_ab;
pub mod ptx_cache;

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::Arc;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::cudnn::{result as dnn, sys as dnn_sys};
use cudarc::driver::{
    result as drv, sys as drv_sys, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream,
    DevicePtr, LaunchArgs, LaunchConfig,
};

use crate::device::{Device, DeviceReport, KernelOptions, TransferMode};
use crate::discovery::{check_libraries, DeviceInfo, Lib, REQUIRED};
use crate::program::{BufId, GraphProgram, OpProgram};
use crate::GpuError;
use nvrtc::{blocks_for, BLOCK};

/// cuBLAS workspace per stream (NVIDIA recommends 32 MiB on Hopper; needed for CUDA graph
/// capture, where cuBLAS must not allocate).
pub(crate) const CUBLAS_WORKSPACE: usize = 32 << 20;

/// One physical GPU: its context and the compiled NVRTC kernels.
pub struct Gpu {
    pub info: DeviceInfo,
    ctx: Arc<CudaContext>,
    funcs: HashMap<&'static str, CudaFunction>,
    /// The stream buffers are allocated and initialised on (synchronised before use).
    pub(crate) alloc_stream: Arc<CudaStream>,
    /// The stream algorithm searches run on (created on first use).
    prep: RefCell<Option<StreamCtx>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("info", &self.info).finish()
    }
}

/// Our NVRTC kernels as a module on `ctx`, their PTX from the kernel cache where it holds
/// this source's for `arch` and this NVRTC ([`ptx_cache`]), else compiled and kept there.
fn load_kernels(
    ctx: &Arc<CudaContext>,
    arch: Option<&'static str>,
) -> Result<Arc<cudarc::driver::CudaModule>, GpuError> {
    use cudarc::nvrtc::Ptx;
    let compile = || {
        let opts = cudarc::nvrtc::CompileOptions {
            arch,
            ..Default::default()
        };
        cudarc::nvrtc::compile_ptx_with_opts(nvrtc::SOURCE, opts)
            .map(|p| p.to_src())
            .map_err(|e| GpuError::Nvrtc {
                kernel: "opsched kernels".into(),
                log: format!("{e:?}"),
            })
    };
    let load = |ptx: String| {
        ctx.load_module(Ptx::from_src(ptx))
            .map_err(|e| GpuError::driver("loading the NVRTC module", e))
    };
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through the pointers it is given, both valid
    // (check_libraries found libnvrtc before this).
    let asked = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    let version = match asked {
        cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS => format!("{major}.{minor}"),
        _ => "unknown".to_string(),
    };
    let key = ptx_cache::key(&[
        nvrtc::SOURCE.as_bytes(),
        arch.unwrap_or("default").as_bytes(),
        version.as_bytes(),
    ]);
    let Some(dir) = ptx_cache::dir() else {
        return load(compile()?);
    };
    // A kept module that lacks a kernel (another source under a colliding key) compiles anew.
    let whole = |ptx: &String| {
        nvrtc::NAMES
            .iter()
            .all(|n| ptx.contains(&format!(".entry {n}(")))
    };
    if let Some(kept) = ptx_cache::load(&dir, key).filter(whole) {
        match load(kept) {
            Ok(module) => return Ok(module),
            Err(e) => tracing::warn!("the kept kernels did not load ({e}): compiling them again"),
        }
    }
    let ptx = compile()?;
    let module = load(ptx.clone())?;
    ptx_cache::store(&dir, key, &ptx);
    Ok(module)
}

fn arch_for(cc: (i32, i32)) -> Option<&'static str> {
    Some(match cc {
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        _ => return None,
    })
}

impl Gpu {
    /// Open physical GPU `ordinal`: check the libraries, create the context with event
    /// tracking off, compile the NVRTC kernels.
    pub fn open(ordinal: usize) -> Result<Gpu, GpuError> {
        check_libraries(REQUIRED)?;
        let infos = crate::discovery::devices()?;
        let info = infos.get(ordinal).cloned().ok_or(GpuError::DeviceIndex {
            requested: ordinal,
            available: infos.len(),
        })?;
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| GpuError::driver(format!("creating a context on GPU {ordinal}"), e))?;
        // SAFETY: called before any allocation on this context; from here on the runtime
        // orders every cross-stream use with its own events (see the module docs).
        unsafe { ctx.disable_event_tracking() };
        let alloc_stream = ctx
            .new_stream()
            .map_err(|e| GpuError::driver("creating the allocation stream", e))?;
        let arch = arch_for(info.compute_capability);
        let module = load_kernels(&ctx, arch)?;
        let mut funcs = HashMap::new();
        for &name in nvrtc::NAMES {
            let f = module
                .load_function(name)
                .map_err(|e| GpuError::driver(format!("loading kernel {name}"), e))?;
            funcs.insert(name, f);
        }
        tracing::info!(
            "GPU {ordinal}: {} ({} SMs, cc {}.{}, driver {}, cuDNN {})",
            info.name,
            info.sms,
            info.compute_capability.0,
            info.compute_capability.1,
            info.driver,
            info.cudnn
        );
        Ok(Gpu {
            info,
            ctx,
            funcs,
            alloc_stream,
            prep: RefCell::new(None),
        })
    }

    /// A compiled NVRTC kernel.
    pub(crate) fn function(&self, name: &str) -> Result<&CudaFunction, GpuError> {
        self.funcs
            .get(name)
            .ok_or_else(|| GpuError::Plan(format!("no kernel named {name}")))
    }

    /// Registers, static shared memory and the largest block of an NVRTC kernel.
    pub fn kernel_resources(&self, name: &str) -> Result<(u32, u32, u32), GpuError> {
        let f = self.function(name)?;
        let d = |e| GpuError::driver(format!("reading attributes of {name}"), e);
        Ok((
            f.num_regs().map_err(d)?.max(0) as u32,
            f.shared_size_bytes().map_err(d)?.max(0) as u32,
            f.max_threads_per_block().map_err(d)?.max(0) as u32,
        ))
    }

    /// Make this GPU's context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<(), GpuError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| GpuError::driver("binding the context", e))
    }

    /// Wait for all work on this GPU.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.ctx
            .synchronize()
            .map_err(|e| GpuError::driver("synchronising the device", e))
    }

    /// A new non-blocking stream with its own cuDNN and cuBLAS handles.
    pub(crate) fn new_stream(&self) -> Result<StreamCtx, GpuError> {
        let stream = self
            .ctx
            .new_stream()
            .map_err(|e| GpuError::driver("creating a stream", e))?;
        StreamCtx::new(self, stream)
    }

    /// `n` zeroed floats (ready when this returns).
    pub(crate) fn zeros(&self, n: usize) -> Result<CudaSlice<f32>, GpuError> {
        let z = self
            .alloc_stream
            .alloc_zeros::<f32>(n)
            .map_err(|e| GpuError::driver(format!("allocating {n} floats"), e))?;
        self.sync_alloc()?;
        Ok(z)
    }

    /// `n` zeroed bytes (ready when this returns).
    pub(crate) fn zeros_bytes(&self, n: usize) -> Result<CudaSlice<u8>, GpuError> {
        let z = self
            .alloc_stream
            .alloc_zeros::<u8>(n)
            .map_err(|e| GpuError::driver(format!("allocating {n} bytes"), e))?;
        self.sync_alloc()?;
        Ok(z)
    }

    /// A copy of `v` on this GPU (ready when this returns).
    pub(crate) fn upload<T: cudarc::driver::DeviceRepr>(
        &self,
        v: &[T],
    ) -> Result<CudaSlice<T>, GpuError> {
        let d = self
            .alloc_stream
            .clone_htod(v)
            .map_err(|e| GpuError::driver("uploading to the GPU", e))?;
        self.sync_alloc()?;
        Ok(d)
    }

    /// [`Gpu::upload`], with the array's device pointer: an array a kernel reads through a
    /// pointer argument (held by the prepared operator as long as it launches).
    pub(crate) fn upload_array<T: cudarc::driver::DeviceRepr>(
        &self,
        v: &[T],
    ) -> Result<(u64, CudaSlice<T>), GpuError> {
        let d = self.upload(v)?;
        let (p, _) = d.device_ptr(&self.alloc_stream);
        Ok((p, d))
    }

    fn sync_alloc(&self) -> Result<(), GpuError> {
        self.alloc_stream
            .synchronize()
            .map_err(|e| GpuError::driver("synchronising the allocation stream", e))
    }
}

struct CudnnHandle(dnn_sys::cudnnHandle_t);
impl Drop for CudnnHandle {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `create_handle` and is destroyed once.
        let _ = unsafe { dnn::destroy_handle(self.0) };
    }
}

struct CublasHandle(blas_sys::cublasHandle_t);
impl Drop for CublasHandle {
    fn drop(&mut self) {
        // SAFETY: created by `create_handle`, destroyed once.
        let _ = unsafe { blas::destroy_handle(self.0) };
    }
}

/// A stream with its cuDNN and cuBLAS handles (bound to it) and workspaces.
pub struct StreamCtx {
    stream: Arc<CudaStream>,
    /// Index of its GPU among the device's GPUs.
    unit: usize,
    cudnn: CudnnHandle,
    cublas: CublasHandle,
    _cublas_ws: CudaSlice<u8>,
    /// Its address: cuBLASLt calls on this stream use the same workspace.
    cublas_ws_ptr: u64,
    workspace: Option<CudaSlice<u8>>,
    ws_ptr: u64,
    ws_bytes: usize,
}

impl Drop for StreamCtx {
    fn drop(&mut self) {
        // Runs before the fields drop: cuDNN and cuBLAS release a handle's resources on the
        // current device, so make this stream's context current (another GPU's may be).
        let _ = self.stream.context().bind_to_thread();
    }
}

impl StreamCtx {
    fn new(gpu: &Gpu, stream: Arc<CudaStream>) -> Result<StreamCtx, GpuError> {
        gpu.bind()?;
        let h = dnn::create_handle().map_err(|e| GpuError::cudnn("creating a handle", e))?;
        let cudnn = CudnnHandle(h);
        // SAFETY: valid handle and stream of the bound context.
        unsafe { dnn::set_stream(cudnn.0, stream.cu_stream() as _) }
            .map_err(|e| GpuError::cudnn("setting the stream", e))?;
        let b = blas::create_handle().map_err(|e| GpuError::cublas("creating a handle", e))?;
        let cublas = CublasHandle(b);
        // SAFETY: valid handle and stream.
        unsafe { blas::set_stream(cublas.0, stream.cu_stream() as _) }
            .map_err(|e| GpuError::cublas("setting the stream", e))?;
        let ws = stream
            .alloc_zeros::<u8>(CUBLAS_WORKSPACE)
            .map_err(|e| GpuError::driver("allocating the cuBLAS workspace", e))?;
        let (ws_ptr, _) = ws.device_ptr(&stream);
        // SAFETY: the workspace lives as long as the handle (both owned here; the handle is
        // dropped first, fields drop in declaration order).
        unsafe {
            blas_sys::cublasSetWorkspace_v2(cublas.0, ws_ptr as *mut c_void, CUBLAS_WORKSPACE)
                .result()
                .map_err(|e| GpuError::cublas("setting the workspace", e))?;
        }
        stream
            .synchronize()
            .map_err(|e| GpuError::driver("synchronising a new stream", e))?;
        Ok(StreamCtx {
            stream,
            unit: gpu.info.ordinal,
            cudnn,
            cublas,
            _cublas_ws: ws,
            cublas_ws_ptr: ws_ptr,
            workspace: None,
            ws_ptr: 0,
            ws_bytes: 0,
        })
    }

    /// Make sure the cuDNN workspace holds at least `bytes` (allocates: outside timing).
    pub(crate) fn ensure_workspace(&mut self, bytes: usize) -> Result<(), GpuError> {
        if bytes <= self.ws_bytes {
            return Ok(());
        }
        let ws = self
            .stream
            .alloc_zeros::<u8>(bytes)
            .map_err(|e| GpuError::driver(format!("allocating a {bytes}-byte workspace"), e))?;
        let (p, _) = ws.device_ptr(&self.stream);
        self.ws_ptr = p;
        self.ws_bytes = bytes;
        self.workspace = Some(ws);
        self.synchronize()
    }

    pub(crate) fn workspace_ptr(&self) -> u64 {
        self.ws_ptr
    }

    pub(crate) fn workspace_bytes(&self) -> usize {
        self.ws_bytes
    }

    pub(crate) fn cudnn(&self) -> dnn_sys::cudnnHandle_t {
        self.cudnn.0
    }

    pub(crate) fn cublas(&self) -> blas_sys::cublasHandle_t {
        self.cublas.0
    }

    /// The cuBLAS workspace ([`CUBLAS_WORKSPACE`] bytes), for cuBLASLt calls on this stream
    /// (stream order keeps them from overlapping cuBLAS's own use).
    pub(crate) fn cublas_workspace(&self) -> u64 {
        self.cublas_ws_ptr
    }

    pub(crate) fn cu_stream(&self) -> drv_sys::CUstream {
        self.stream.cu_stream()
    }

    /// A kernel launch on this stream.
    pub(crate) fn launch_builder<'a>(&'a self, f: &'a CudaFunction) -> LaunchArgs<'a> {
        self.stream.launch_builder(f)
    }

    pub(crate) fn synchronize(&self) -> Result<(), GpuError> {
        self.stream
            .synchronize()
            .map_err(|e| GpuError::driver("synchronising a stream", e))
    }

    /// GPU time of one `run`, ms, as a CUDA graph runs it: after an eager warm-up, `reps`
    /// runs are captured into one graph, and the median of three replays between two events,
    /// divided by `reps`, is the time. Eager launches would time the host's issue rate for
    /// kernels shorter than their launch (~12 us on an H100); a replay pays what the graphs
    /// opsched runs pay (~1.2 us per kernel), so fewer launches still win. A `run` that cannot
    /// be captured fails here, as it would in the plan's graph.
    pub(crate) fn time_ms(
        &self,
        gpu: &Gpu,
        reps: usize,
        run: &dyn Fn() -> Result<(), GpuError>,
    ) -> Result<f64, GpuError> {
        let event = || {
            gpu.ctx
                .new_event(Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| GpuError::driver("creating a timing event", e))
        };
        let timing = |e| GpuError::driver("timing a kernel choice", e);
        run()?;
        self.synchronize()?;
        let reps = reps.max(1);
        self.stream
            .begin_capture(drv_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| GpuError::driver("beginning a timing capture", e))?;
        let captured = (0..reps).try_for_each(|_| run());
        // End the capture whatever happened, so the stream is usable again.
        let graph = self
            .stream
            .end_capture(drv_sys::CUgraphInstantiate_flags(0));
        captured?;
        let graph = graph
            .map_err(|e| GpuError::driver("capturing a kernel choice", e))?
            .ok_or_else(|| GpuError::Plan("timing captured nothing".into()))?;
        graph.launch().map_err(timing)?;
        self.synchronize()?;
        let mut t = Vec::with_capacity(3);
        for _ in 0..3 {
            let (start, end) = (event()?, event()?);
            start.record(&self.stream).map_err(timing)?;
            graph.launch().map_err(timing)?;
            end.record(&self.stream).map_err(timing)?;
            end.synchronize().map_err(timing)?;
            t.push(f64::from(start.elapsed_ms(&end).map_err(timing)?) / reps as f64);
        }
        t.sort_by(f64::total_cmp);
        Ok(t[1])
    }
}

/// An event of a [`CudaDevice`].
pub struct Event(CudaEvent);

/// The buffers of a program on the device (see the module docs).
pub struct CudaMemory {
    inner: Rc<MemInner>,
    /// NCCL communicators, one per logical GPU, when transfers use NCCL.
    nccl: Option<Vec<cudarc::nccl::Comm>>,
}

struct MemInner {
    /// Per logical GPU: its storage, one allocation; buffers are ranges of it (see
    /// [`crate::memory`]). In a cell only for NCCL, whose receive wants the range mutably.
    blocks: Vec<RefCell<CudaSlice<f32>>>,
    /// Per buffer: its logical GPU and first element there.
    at: Vec<(usize, usize)>,
    ptr: Vec<u64>,
    len: Vec<usize>,
    /// A strided view's runs (see [`crate::program::Runs`]).
    runs: Vec<Option<crate::program::Runs>>,
    /// Physical GPU (index into the device's GPUs) of each buffer.
    home: Vec<usize>,
    /// Physical GPU of each logical GPU.
    map: Vec<usize>,
}

impl MemInner {
    /// The block (logical GPU) and the range of elements of buffer `id`, which must be
    /// contiguous.
    fn range(&self, id: BufId) -> Result<(usize, std::ops::Range<usize>), GpuError> {
        match (self.at.get(id), self.len.get(id), self.runs.get(id)) {
            (Some(&(l, o)), Some(&n), Some(None)) => Ok((l, o..o + n)),
            (Some(_), Some(_), Some(Some(_))) => Err(GpuError::Plan(format!(
                "buffer {id} is a strided view, not one range"
            ))),
            _ => Err(GpuError::Plan(format!("buffer {id} does not exist"))),
        }
    }

    /// The block (logical GPU) of buffer `id`, and the ranges of it that hold its elements, in
    /// order.
    fn ranges(&self, id: BufId) -> Result<(usize, Vec<std::ops::Range<usize>>), GpuError> {
        match (self.at.get(id), self.len.get(id), self.runs.get(id)) {
            (Some(&(l, o)), Some(&n), Some(&runs)) => {
                Ok((l, crate::program::Runs::storage(o, n, runs, 0..n)))
            }
            _ => Err(GpuError::Plan(format!("buffer {id} does not exist"))),
        }
    }
}

/// A prepared operator: its steps with resolved pointers, descriptors and algorithms. It
/// holds the memory it points into.
pub struct CudaOp {
    _mem: Rc<MemInner>,
    /// Physical GPU it runs on.
    unit: usize,
    steps: Vec<Box<dyn Enqueue>>,
    workspace: usize,
}

impl CudaOp {
    /// cuDNN workspace it needs on its stream, bytes.
    pub fn workspace(&self) -> usize {
        self.workspace
    }
}

/// A captured iteration.
pub struct CudaGraphExec(cudarc::driver::CudaGraph);

/// One prepared step, enqueued on a stream of its GPU without allocating.
pub(crate) trait Enqueue {
    fn enqueue(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError>;
    /// cuDNN workspace it needs, bytes.
    fn workspace(&self) -> usize {
        0
    }
}

/// One candidate kernel's run on a stream, for timing it.
pub(crate) type Launch<'a> = dyn Fn() -> Result<(), GpuError> + 'a;

/// What a step's CUDA preparation sees: its GPU, the memory, a stream for algorithm
/// searches, the kernel options.
pub(crate) struct PrepareCx<'a> {
    pub(crate) gpu: &'a Gpu,
    mem: &'a MemInner,
    unit: usize,
    pub(crate) sc: &'a mut StreamCtx,
    pub(crate) opts: &'a KernelOptions,
    pub(crate) tuning: &'a crate::tuning::Tuning,
    /// The operator being prepared (for errors).
    op: &'a str,
}

impl PrepareCx<'_> {
    /// The error for a step this device has no kernel for yet (the CPU device runs it).
    pub(crate) fn no_kernel(&self, what: impl std::fmt::Display) -> GpuError {
        GpuError::Unsupported {
            node: self.op.to_string(),
            message: format!("{what} has no CUDA kernel yet (--backend cpu runs it)"),
        }
    }

    /// The device pointer of buffer `id`, which must live on this GPU and be contiguous (a
    /// kernel that writes a strided view asks [`PrepareCx::strided`]).
    pub(crate) fn ptr(&self, id: BufId) -> Result<u64, GpuError> {
        match self.strided(id)? {
            (p, None) => Ok(p),
            (_, Some(_)) => Err(GpuError::Plan(format!(
                "buffer {id} is a strided view, which this kernel cannot take (operator '{}')",
                self.op
            ))),
        }
    }

    /// The candidate kernels' times for tuning key `key`: kept ones where the tuning table
    /// has them, else each `(code, run)` timed now on the preparation stream (`reps` runs per
    /// captured graph; a candidate whose run fails is left out). For kernels that need no
    /// workspace and no math choice; [`crate::tuning::choose`] picks among them.
    pub(crate) fn timed(
        &self,
        key: &str,
        reps: usize,
        candidates: &[(u32, &Launch<'_>)],
    ) -> Result<Vec<crate::tuning::Candidate>, GpuError> {
        self.tuning.get_or_measure(key, || {
            let mut c = Vec::with_capacity(candidates.len());
            for &(algo, run) in candidates {
                match self.sc.time_ms(self.gpu, reps, run) {
                    Ok(ms) => c.push(crate::tuning::Candidate {
                        algo,
                        math: 0,
                        ms,
                        workspace: 0,
                    }),
                    Err(e) => tracing::debug!("candidate {algo} of {key} left out: {e}"),
                }
            }
            Ok(c)
        })
    }

    /// The device pointer of the first element of buffer `id`, a strided view or not, for a
    /// kernel whose own strides read the view's runs (a product whose leading dimension is
    /// the runs' stride: [`crate::step::gemm`]'s `over_runs`).
    pub(crate) fn first(&self, id: BufId) -> Result<u64, GpuError> {
        Ok(self.strided(id)?.0)
    }

    /// The device pointer of buffer `id` (its first element), which must live on this GPU,
    /// and its runs where it is a strided view.
    pub(crate) fn strided(
        &self,
        id: BufId,
    ) -> Result<(u64, Option<crate::program::Runs>), GpuError> {
        let runs = self.mem.runs.get(id).copied().flatten();
        match (self.mem.ptr.get(id), self.mem.home.get(id)) {
            (Some(&p), Some(&h)) if h == self.unit => Ok((p, runs)),
            (Some(_), Some(&h)) => Err(GpuError::Plan(format!(
                "buffer {id} lives on GPU {h}, the operator runs on GPU {}",
                self.unit
            ))),
            _ => Err(GpuError::Plan(format!("buffer {id} does not exist"))),
        }
    }
}

/// A grid-stride launch over `n` elements.
pub(crate) fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks_for(n), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// How many consecutive floats (4, 2 or 1) a thread of a vectorized kernel (`elementwise`,
/// `elementwise_runs`, `pool2d_nhwc`, `pool2d_sum`, `bias_act_runs`, the tiled depthwise
/// kernels by fours and twos) may access at once: the widest whose
/// accesses are all aligned, every count (channels, strides, runs, lengths) a multiple of it
/// and every pointer (0: none) 4 x it bytes aligned. The kernels check the same themselves
/// and fall back to narrower accesses.
pub(crate) fn vector_width(
    counts: impl IntoIterator<Item = usize>,
    ptrs: impl IntoIterator<Item = u64>,
) -> usize {
    // Only the low 4 bits matter: wrapping keeps them.
    let counts = counts
        .into_iter()
        .fold(0u64, |bits, c| bits | (c as u64).wrapping_mul(4));
    let bits = ptrs.into_iter().fold(counts, |bits, p| bits | p);
    [4, 2]
        .into_iter()
        .find(|v| bits % (4 * v) == 0)
        .unwrap_or(1) as usize
}

/// A kernel launch's result, with the kernel's name.
pub(crate) fn launched(
    r: Result<Option<(CudaEvent, CudaEvent)>, drv::DriverError>,
    what: &str,
) -> Result<(), GpuError> {
    r.map(|_| ())
        .map_err(|e| GpuError::driver(format!("launching {what}"), e))
}

/// NVIDIA GPUs (see the module docs).
pub struct CudaDevice {
    gpus: Vec<Gpu>,
    tuning: crate::tuning::Tuning,
}

impl CudaDevice {
    /// Open the first `n` GPUs of this machine (all when `None`).
    pub fn open(n: Option<usize>) -> Result<CudaDevice, GpuError> {
        check_libraries(REQUIRED)?;
        let present = crate::discovery::devices()?.len();
        let want = n.unwrap_or(present);
        if want == 0 || want > present {
            return Err(GpuError::DeviceIndex {
                requested: want,
                available: present,
            });
        }
        let gpus = (0..want).map(Gpu::open).collect::<Result<_, _>>()?;
        Ok(CudaDevice {
            gpus,
            tuning: crate::tuning::Tuning::default(),
        })
    }

    /// The opened GPUs.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    fn gpu(&self, unit: usize) -> Result<&Gpu, GpuError> {
        self.gpus.get(unit).ok_or(GpuError::DeviceIndex {
            requested: unit,
            available: self.gpus.len(),
        })
    }
}

impl Device for CudaDevice {
    type Stream = StreamCtx;
    type Event = Event;
    type Memory = CudaMemory;
    type Op = CudaOp;
    type Graph = CudaGraphExec;

    /// Channels last: on an H100 on 2026-11-27 ResNet-50's sequential plan took 0.494 ms
    /// against 0.723 in NCHW, Inception-v3's 1.005 against 1.435, every checked CNN faster at
    /// batch 1 (`fixtures/gpu/h100-2026-11-27b/README.md`).
    fn preferred_layout(&self) -> crate::program::Layout {
        crate::program::CUDA_LAYOUT
    }

    fn report(&self) -> DeviceReport {
        let info = &self.gpus[0].info;
        DeviceReport {
            backend: "cuda",
            name: info.name.clone(),
            driver: info.driver.clone(),
            libraries: format!("cuDNN {}", info.cudnn),
            units: self.gpus.len(),
            fingerprint: info.fingerprint(),
        }
    }

    fn units(&self) -> usize {
        self.gpus.len()
    }

    fn tuning(&self) -> Option<&crate::tuning::Tuning> {
        Some(&self.tuning)
    }

    fn kernel_resources(&self, unit: usize, kernel: &str) -> Option<(u32, u32, u32)> {
        self.gpus.get(unit)?.kernel_resources(kernel).ok()
    }

    fn alloc(&self, p: &GraphProgram, map: &[usize]) -> Result<CudaMemory, GpuError> {
        crate::memory::check_layout(p)?;
        let unit = |l: usize| {
            map.get(l)
                .copied()
                .ok_or_else(|| GpuError::Plan(format!("logical GPU {l} is not mapped to a unit")))
        };
        let mut blocks = Vec::with_capacity(p.storage.len());
        for (l, &n) in p.storage.iter().enumerate() {
            let s = &self.gpu(unit(l)?)?.alloc_stream;
            let block = s.alloc_zeros::<f32>(n.max(1)).map_err(|e| {
                GpuError::driver(format!("allocating the storage of GPU {l} ({n} floats)"), e)
            })?;
            blocks.push(RefCell::new(block));
        }
        let n = p.buffers.len();
        let (mut at, mut ptr, mut len, mut home) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for (i, b) in p.buffers.iter().enumerate() {
            let phys = unit(b.gpu)?;
            let s = &self.gpu(phys)?.alloc_stream;
            let mut block = blocks[b.gpu].borrow_mut();
            let range = b.offset..b.offset + b.span();
            if let Some(data) = p.initial_data(i) {
                if b.runs.is_some() {
                    return Err(GpuError::Plan(format!(
                        "buffer {i} is a strided view that starts with data"
                    )));
                }
                s.memcpy_htod(&data, &mut block.slice_mut(range.clone()))
                    .map_err(|e| {
                        GpuError::driver(format!("initialising buffer {i} ({} floats)", b.len), e)
                    })?;
            }
            let (dp, _) = block.slice(range).device_ptr(s);
            at.push((b.gpu, b.offset));
            ptr.push(dp);
            len.push(b.len);
            home.push(phys);
        }
        for g in &self.gpus {
            g.sync_alloc()?;
        }
        Ok(CudaMemory {
            inner: Rc::new(MemInner {
                blocks,
                at,
                ptr,
                len,
                runs: p.buffers.iter().map(|b| b.runs).collect(),
                home,
                map: map.to_vec(),
            }),
            nccl: None,
        })
    }

    fn read(&self, m: &CudaMemory, id: BufId) -> Result<Vec<f32>, GpuError> {
        let mem = &m.inner;
        let (l, ranges) = mem.ranges(id)?;
        let gpu = self.gpu(mem.home[id])?;
        gpu.synchronize()?;
        let mut v = Vec::new();
        for r in ranges {
            let part = gpu
                .alloc_stream
                .clone_dtoh(&mem.blocks[l].borrow().slice(r))
                .map_err(|e| GpuError::driver(format!("reading buffer {id}"), e))?;
            v.extend(part);
        }
        gpu.sync_alloc()?;
        Ok(v)
    }

    fn write(&self, m: &CudaMemory, id: BufId, data: &[f32]) -> Result<(), GpuError> {
        let mem = &m.inner;
        let (l, ranges) = mem.ranges(id)?;
        let n: usize = ranges.iter().map(|r| r.len()).sum();
        if data.len() != n {
            return Err(GpuError::Plan(format!(
                "buffer {id} holds {n} values, {} given",
                data.len()
            )));
        }
        let gpu = self.gpu(mem.home[id])?;
        gpu.synchronize()?;
        let mut from = 0;
        for r in ranges {
            let part = &data[from..from + r.len()];
            from += r.len();
            gpu.alloc_stream
                .memcpy_htod(part, &mut mem.blocks[l].borrow_mut().slice_mut(r))
                .map_err(|e| GpuError::driver(format!("writing buffer {id}"), e))?;
        }
        gpu.sync_alloc()
    }

    fn stream(&self, unit: usize) -> Result<StreamCtx, GpuError> {
        self.gpu(unit)?.new_stream()
    }

    fn event(&self, unit: usize, timing: bool) -> Result<Event, GpuError> {
        let flags = if timing {
            drv_sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            drv_sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        self.gpu(unit)?
            .ctx
            .new_event(Some(flags))
            .map(Event)
            .map_err(|e| GpuError::driver("creating an event", e))
    }

    fn record(&self, s: &StreamCtx, e: &Event) -> Result<(), GpuError> {
        e.0.record(&s.stream)
            .map_err(|e| GpuError::driver("recording an event", e))
    }

    fn wait(&self, s: &StreamCtx, e: &Event) -> Result<(), GpuError> {
        // cudarc's wait binds the stream's context first (the previous call may have left
        // another GPU's context current); a cross-device wait is allowed by the driver.
        s.stream
            .wait(&e.0)
            .map_err(|e| GpuError::driver("waiting for an event", e))
    }

    fn elapsed_ms(&self, start: &Event, end: &Event) -> Result<f64, GpuError> {
        start
            .0
            .elapsed_ms(&end.0)
            .map(f64::from)
            .map_err(|e| GpuError::driver("reading timing events", e))
    }

    fn prepare(
        &self,
        p: &GraphProgram,
        m: &CudaMemory,
        op: &OpProgram,
        opts: &KernelOptions,
    ) -> Result<CudaOp, GpuError> {
        let unit = *m
            .inner
            .map
            .get(op.gpu)
            .ok_or_else(|| GpuError::Plan(format!("logical GPU {} is not mapped", op.gpu)))?;
        let gpu = self.gpu(unit)?;
        gpu.bind()?;
        let mut prep = gpu.prep.borrow_mut();
        if prep.is_none() {
            *prep = Some(gpu.new_stream()?);
        }
        let sc = prep
            .as_mut()
            .ok_or_else(|| GpuError::Plan("no preparation stream".into()))?;
        let mut steps = Vec::with_capacity(op.steps.len());
        let mut workspace = 0;
        for s in &op.steps {
            crate::program::check_access(p, s)?;
            let mut cx = PrepareCx {
                gpu,
                mem: &m.inner,
                unit,
                sc: &mut *sc,
                opts,
                tuning: &self.tuning,
                op: &op.name,
            };
            let e = s.kernel().prepare_cuda(&mut cx)?;
            workspace = workspace.max(e.workspace());
            steps.push(e);
        }
        gpu.synchronize()?;
        Ok(CudaOp {
            _mem: m.inner.clone(),
            unit,
            steps,
            workspace,
        })
    }

    fn fit_stream(&self, s: &mut StreamCtx, ops: &[&CudaOp]) -> Result<(), GpuError> {
        let ws = ops.iter().map(|o| o.workspace).max().unwrap_or(0);
        s.ensure_workspace(ws)
    }

    fn launch(&self, op: &CudaOp, s: &StreamCtx) -> Result<(), GpuError> {
        if op.unit != s.unit {
            return Err(GpuError::Plan(format!(
                "an operator of GPU {} launched on a stream of GPU {}",
                op.unit, s.unit
            )));
        }
        let gpu = self.gpu(op.unit)?;
        gpu.bind()?;
        for e in &op.steps {
            e.enqueue(gpu, s)?;
        }
        Ok(())
    }

    fn connect(
        &self,
        m: &mut CudaMemory,
        copy: &[StreamCtx],
        mode: TransferMode,
    ) -> Result<&'static str, GpuError> {
        let map = &m.inner.map;
        let one_to_one = {
            let mut seen = map.clone();
            seen.sort_unstable();
            seen.dedup();
            seen.len() == map.len()
        };
        let use_nccl = match mode {
            TransferMode::Copy => false,
            TransferMode::Nccl => {
                if !one_to_one || self.gpus.len() < 2 {
                    return Err(GpuError::Plan(
                        "NCCL transfers need one physical GPU per logical GPU (and at least 2)"
                            .into(),
                    ));
                }
                check_libraries(&[Lib::Nccl])?;
                true
            }
            TransferMode::Auto => one_to_one && self.gpus.len() >= 2 && Lib::Nccl.present(),
        };
        // Peer access where possible: copies then go GPU to GPU directly, and NCCL, which
        // may access a peer's buffers directly within one process, may touch them.
        for a in &self.gpus {
            for b in &self.gpus {
                enable_peer_access(a, b)?;
            }
        }
        if !use_nccl {
            return Ok("copy");
        }
        let streams = copy.iter().map(|c| c.stream.clone()).collect();
        m.nccl = Some(
            cudarc::nccl::Comm::from_devices(streams)
                .map_err(|e| GpuError::nccl("creating communicators", e))?,
        );
        Ok("nccl")
    }

    fn transfer(
        &self,
        m: &CudaMemory,
        src: BufId,
        dst: BufId,
        (src_gpu, dst_gpu): (usize, usize),
        copy: &[StreamCtx],
    ) -> Result<(), GpuError> {
        let mem = &m.inner;
        let bad = || GpuError::Plan(format!("transfer of buffer {src} into {dst}"));
        let (&sp, &dp, &sl, &dl) = (
            mem.ptr.get(src).ok_or_else(bad)?,
            mem.ptr.get(dst).ok_or_else(bad)?,
            mem.len.get(src).ok_or_else(bad)?,
            mem.len.get(dst).ok_or_else(bad)?,
        );
        if sl != dl {
            return Err(bad());
        }
        let cs = copy.get(dst_gpu).ok_or_else(bad)?;
        match &m.nccl {
            None => {
                let (from, to) = (self.gpu(mem.home[src])?, self.gpu(mem.home[dst])?);
                copy_between(from, sp, to, dp, sl * 4, cs)
            }
            Some(comms) => {
                let (sc, dc) = (
                    comms.get(src_gpu).ok_or_else(bad)?,
                    comms.get(dst_gpu).ok_or_else(bad)?,
                );
                let ((sb, sr), (db, dr)) = (mem.range(src)?, mem.range(dst)?);
                cudarc::nccl::group_start().map_err(|e| GpuError::nccl("group start", e))?;
                let r1 = sc.send(&mem.blocks[sb].borrow().slice(sr), dst_gpu as i32);
                let r2 = dc
                    .recv(
                        &mut mem.blocks[db].borrow_mut().slice_mut(dr),
                        src_gpu as i32,
                    )
                    .map(|_| ());
                cudarc::nccl::group_end().map_err(|e| GpuError::nccl("group end", e))?;
                r1.map_err(|e| GpuError::nccl("send", e))?;
                r2.map_err(|e| GpuError::nccl("recv", e))
            }
        }
    }

    fn synchronize(&self) -> Result<(), GpuError> {
        for g in &self.gpus {
            g.synchronize()?;
        }
        Ok(())
    }

    fn begin_capture(&self, s: &StreamCtx) -> Result<(), GpuError> {
        s.stream
            .begin_capture(drv_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| GpuError::driver("beginning stream capture", e))
    }

    fn end_capture(&self, s: &StreamCtx) -> Result<CudaGraphExec, GpuError> {
        let g = s
            .stream
            .end_capture(drv_sys::CUgraphInstantiate_flags(0))
            .map_err(|e| GpuError::driver("ending stream capture", e))?
            .ok_or_else(|| GpuError::Plan("the capture is empty".into()))?;
        g.upload()
            .map_err(|e| GpuError::driver("uploading the graph", e))?;
        Ok(CudaGraphExec(g))
    }

    fn replay(&self, g: &CudaGraphExec, _s: &StreamCtx) -> Result<(), GpuError> {
        // A cudarc graph launches on the stream it was captured on.
        g.0.launch()
            .map_err(|e| GpuError::driver("launching the graph", e))
    }
}

/// Copy `bytes` from `src` on `src_gpu` to `dst` on `dst_gpu`, enqueued on `sc` (a stream of
/// the destination GPU). Same device: a device-to-device copy; else a peer copy.
fn copy_between(
    src_gpu: &Gpu,
    src: u64,
    dst_gpu: &Gpu,
    dst: u64,
    bytes: usize,
    sc: &StreamCtx,
) -> Result<(), GpuError> {
    dst_gpu.bind()?;
    if src_gpu.info.ordinal == dst_gpu.info.ordinal {
        // SAFETY: both buffers hold `bytes` bytes on this device (equal lengths checked).
        unsafe { drv::memcpy_dtod_async(dst, src, bytes, sc.cu_stream()) }
            .map_err(|e| GpuError::driver("copying between logical GPUs", e))
    } else {
        // SAFETY: both buffers hold `bytes` bytes on their devices; contexts are live.
        unsafe {
            drv::memcpy_peer_async(
                dst_gpu.ctx.cu_ctx(),
                dst,
                src_gpu.ctx.cu_ctx(),
                src,
                bytes,
                sc.cu_stream(),
            )
        }
        .map_err(|e| GpuError::driver("copying between GPUs", e))
    }
}

/// Let `a` access `b`'s memory directly where the hardware allows (peer copies then avoid
/// the host). Returns whether peer access is on.
fn enable_peer_access(a: &Gpu, b: &Gpu) -> Result<bool, GpuError> {
    if a.info.ordinal == b.info.ordinal {
        return Ok(true);
    }
    let mut can = 0i32;
    // SAFETY: out-parameter call with valid devices.
    unsafe { drv_sys::cuDeviceCanAccessPeer(&mut can, a.ctx.cu_device(), b.ctx.cu_device()) }
        .result()
        .map_err(|e| GpuError::driver("querying peer access", e))?;
    if can == 0 {
        return Ok(false);
    }
    a.bind()?;
    // SAFETY: valid peer context; "already enabled" is not an error for us.
    let r = unsafe { drv_sys::cuCtxEnablePeerAccess(b.ctx.cu_ctx(), 0) };
    match r {
        drv_sys::CUresult::CUDA_SUCCESS
        | drv_sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
        other => return Err(GpuError::driver("enabling peer access", other)),
    }
    // cudarc allocates from the device's default stream-ordered memory pool
    // (cuMemAllocAsync), and context peer access does not cover pool memory: grant `a`
    // read/write access to `b`'s pool too (NCCL in one process may read and write user
    // buffers of the peer directly).
    let mut pool: drv_sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: out-parameter call with a valid device.
    match unsafe { drv_sys::cuDeviceGetDefaultMemPool(&mut pool, b.ctx.cu_device()) } {
        drv_sys::CUresult::CUDA_SUCCESS => {}
        // No memory pools on this device: cudarc then allocates with cuMemAlloc, which
        // context peer access covers.
        drv_sys::CUresult::CUDA_ERROR_NOT_SUPPORTED => return Ok(true),
        other => return Err(GpuError::driver("querying the default memory pool", other)),
    }
    let desc = drv_sys::CUmemAccessDesc {
        location: drv_sys::CUmemLocation {
            type_: drv_sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: a.ctx.cu_device(),
        },
        flags: drv_sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: `pool` is `b`'s live default pool, `desc` one valid entry naming device `a`
    // (a peer of `b`, checked above).
    unsafe { drv_sys::cuMemPoolSetAccess(pool, &desc, 1) }
        .result()
        .map_err(|e| GpuError::driver("granting peer access to the memory pool", e))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::vector_width;

    #[test]
    fn the_vector_width_is_the_widest_every_count_and_pointer_allows() {
        let (a, b) = (0x7f00_0000_1000u64, 0x7f00_0000_2040u64);
        // NASNet's cells channels last: 168 channels into runs of 168 of 1008.
        assert_eq!(vector_width([168, 168, 1008], [a, b]), 4);
        // Its stem cells' 42 channels: twos.
        assert_eq!(vector_width([42, 42, 168], [a, b]), 2);
        assert_eq!(vector_width([42 * 4, 41], [a]), 1, "an odd stride");
        // A pointer 8 bytes off 16 allows twos, 4 bytes off ones; 0 (none) and dense views
        // (run and stride 0) constrain nothing.
        assert_eq!(vector_width([8], [a + 8, b]), 2);
        assert_eq!(vector_width([8], [a, b + 4]), 1);
        assert_eq!(vector_width([8, 0, 0], [a, 0]), 4);
        // Counts beyond 2^62 keep their low bits.
        assert_eq!(vector_width([usize::MAX - 3], [a]), 4);
        assert_eq!(vector_width([usize::MAX], [a]), 1);
    }
}
