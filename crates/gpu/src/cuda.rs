//! The CUDA side: one [`Gpu`] per physical device, one [`StreamCtx`] (stream, cuDNN handle,
//! cuBLAS handle, workspaces) per stream, device memory for a [`GraphProgram`], and prepared
//! operators ([`PreparedOp`]) that enqueue their steps on a stream without allocating.
//!
//! Synchronisation is ours alone: every context is created with cudarc's event tracking
//! disabled, so cudarc never inserts a wait or an event record; the runtime places every
//! wait itself (from the launch plan).
//!
//! All calls into CUDA libraries are `unsafe`: each block states the invariant it relies on
//! (pointers come from live allocations of the sizes the program computed, descriptors match
//! the buffers, the right context is bound).
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::cudnn::{result as dnn, sys as dnn_sys};
use cudarc::driver::{
    result as drv, sys as drv_sys, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream,
    DevicePtr, LaunchConfig, PushKernelArg,
};

use crate::discovery::{check_libraries, DeviceInfo, REQUIRED};
use crate::kernels::{self, act_code, blocks_for, BLOCK};
use crate::program::{BufId, GraphProgram, Step};
use crate::GpuError;

/// Options of the kernels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelOptions {
    /// Let cuDNN use TF32 tensor cores for f32 convolutions (PyTorch's default). cuBLAS always
    /// computes in full f32 (PyTorch's default for matmul).
    pub tf32_conv: bool,
    /// The most workspace one convolution algorithm may use, bytes.
    pub conv_workspace_limit: usize,
}

impl Default for KernelOptions {
    fn default() -> Self {
        KernelOptions {
            tf32_conv: true,
            conv_workspace_limit: 256 << 20,
        }
    }
}

/// cuBLAS workspace per stream (NVIDIA recommends 32 MiB on Hopper; needed for CUDA graph
/// capture, where cuBLAS must not allocate).
const CUBLAS_WORKSPACE: usize = 32 << 20;

/// One physical GPU: its context and the compiled NVRTC kernels.
pub struct Gpu {
    pub info: DeviceInfo,
    pub ctx: Arc<CudaContext>,
    funcs: HashMap<&'static str, CudaFunction>,
    /// The stream buffers are allocated and initialised on (synchronised before use).
    pub alloc_stream: Arc<CudaStream>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("info", &self.info).finish()
    }
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
        let opts = cudarc::nvrtc::CompileOptions {
            arch: arch_for(info.compute_capability),
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(kernels::SOURCE, opts).map_err(|e| {
            GpuError::Nvrtc {
                kernel: "opsched kernels".into(),
                log: format!("{e:?}"),
            }
        })?;
        let module = ctx
            .load_module(ptx)
            .map_err(|e| GpuError::driver("loading the NVRTC module", e))?;
        let mut funcs = HashMap::new();
        for &name in kernels::NAMES {
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
        })
    }

    /// A compiled NVRTC kernel.
    pub fn function(&self, name: &str) -> Result<&CudaFunction, GpuError> {
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
    pub fn bind(&self) -> Result<(), GpuError> {
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
    pub fn new_stream(&self) -> Result<StreamCtx, GpuError> {
        let stream = self
            .ctx
            .new_stream()
            .map_err(|e| GpuError::driver("creating a stream", e))?;
        StreamCtx::new(self, stream)
    }

    /// An event; `timing` for elapsed-time measurements (else created with timing disabled,
    /// which is cheaper for pure synchronisation).
    pub fn event(&self, timing: bool) -> Result<CudaEvent, GpuError> {
        let flags = if timing {
            drv_sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            drv_sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        self.ctx
            .new_event(Some(flags))
            .map_err(|e| GpuError::driver("creating an event", e))
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
    pub stream: Arc<CudaStream>,
    cudnn: CudnnHandle,
    cublas: CublasHandle,
    _cublas_ws: CudaSlice<u8>,
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
            blas_sys::cublasSetMathMode(cublas.0, blas_sys::cublasMath_t::CUBLAS_DEFAULT_MATH)
                .result()
                .map_err(|e| GpuError::cublas("setting the math mode", e))?;
        }
        stream
            .synchronize()
            .map_err(|e| GpuError::driver("synchronising a new stream", e))?;
        Ok(StreamCtx {
            stream,
            cudnn,
            cublas,
            _cublas_ws: ws,
            workspace: None,
            ws_ptr: 0,
            ws_bytes: 0,
        })
    }

    /// Make sure the cuDNN workspace holds at least `bytes` (allocates outside timing).
    pub fn ensure_workspace(&mut self, bytes: usize) -> Result<(), GpuError> {
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
        self.stream
            .synchronize()
            .map_err(|e| GpuError::driver("synchronising after allocation", e))
    }

    /// Record `event` on this stream.
    pub fn record(&self, event: &CudaEvent) -> Result<(), GpuError> {
        event
            .record(&self.stream)
            .map_err(|e| GpuError::driver("recording an event", e))
    }

    /// Make this stream wait for `event` (which may belong to another GPU).
    pub fn wait(&self, event: &CudaEvent) -> Result<(), GpuError> {
        // cudarc's wait binds the stream's context first (the previous call may have left
        // another GPU's context current); a cross-device wait is allowed by the driver.
        self.stream
            .wait(event)
            .map_err(|e| GpuError::driver("waiting for an event", e))
    }
}

/// The device buffers of a [`GraphProgram`], each on the physical GPU of its logical GPU.
pub struct DeviceMemory {
    slices: Vec<CudaSlice<f32>>,
    /// Raw device pointer of each buffer.
    pub ptr: Vec<u64>,
    /// Physical GPU index (into the `gpus` slice given to [`DeviceMemory::alloc`]) of each.
    pub home: Vec<usize>,
}

impl DeviceMemory {
    /// Allocate and initialise every buffer of `p`; logical GPU `l` lives on
    /// `gpus[map[l]]`. Synchronises before returning, so the memory is ready for any stream.
    pub fn alloc(p: &GraphProgram, gpus: &[Gpu], map: &[usize]) -> Result<DeviceMemory, GpuError> {
        let mut slices = Vec::with_capacity(p.buffers.len());
        let mut ptr = Vec::with_capacity(p.buffers.len());
        let mut home = Vec::with_capacity(p.buffers.len());
        for (i, b) in p.buffers.iter().enumerate() {
            let phys = *map.get(b.gpu).ok_or_else(|| {
                GpuError::Plan(format!(
                    "buffer {i} on logical GPU {}, which is not mapped",
                    b.gpu
                ))
            })?;
            let gpu = gpus.get(phys).ok_or(GpuError::DeviceIndex {
                requested: phys,
                available: gpus.len(),
            })?;
            let s = &gpu.alloc_stream;
            let slice = match p.initial_data(i) {
                Some(data) => s.clone_htod(&data),
                None => s.alloc_zeros::<f32>(b.len),
            }
            .map_err(|e| {
                GpuError::driver(format!("allocating buffer {i} ({} floats)", b.len), e)
            })?;
            let (dp, _) = slice.device_ptr(s);
            ptr.push(dp);
            home.push(phys);
            slices.push(slice);
        }
        for g in gpus {
            g.alloc_stream
                .synchronize()
                .map_err(|e| GpuError::driver("synchronising after allocation", e))?;
        }
        Ok(DeviceMemory { slices, ptr, home })
    }

    /// Copy buffer `id` back to the host (synchronous).
    pub fn read(&self, gpus: &[Gpu], id: BufId) -> Result<Vec<f32>, GpuError> {
        let slice = self
            .slices
            .get(id)
            .ok_or_else(|| GpuError::Plan(format!("buffer {id} does not exist")))?;
        let gpu = self
            .home
            .get(id)
            .and_then(|&h| gpus.get(h))
            .ok_or_else(|| GpuError::Plan(format!("buffer {id}: its GPU is not open")))?;
        let s = &gpu.alloc_stream;
        let v = s
            .clone_dtoh(slice)
            .map_err(|e| GpuError::driver(format!("reading buffer {id}"), e))?;
        s.synchronize()
            .map_err(|e| GpuError::driver("synchronising a read", e))?;
        Ok(v)
    }

    /// The slice of buffer `id`.
    pub fn slice(&self, id: BufId) -> Option<&CudaSlice<f32>> {
        self.slices.get(id)
    }

    /// The slice of buffer `id`, mutably (NCCL receives into it).
    pub fn slice_mut(&mut self, id: BufId) -> Option<&mut CudaSlice<f32>> {
        self.slices.get_mut(id)
    }

    /// Bytes of buffer `id`.
    pub fn bytes(&self, id: BufId) -> usize {
        self.slices.get(id).map_or(0, |s| s.len() * 4)
    }
}

// --- cuDNN descriptors (RAII over raw handles) -------------------------------------------------

struct TensorDesc(dnn_sys::cudnnTensorDescriptor_t);
impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once.
        let _ = unsafe { dnn::destroy_tensor_descriptor(self.0) };
    }
}
struct FilterDesc(dnn_sys::cudnnFilterDescriptor_t);
impl Drop for FilterDesc {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once.
        let _ = unsafe { dnn::destroy_filter_descriptor(self.0) };
    }
}
struct ConvDesc(dnn_sys::cudnnConvolutionDescriptor_t);
impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once.
        let _ = unsafe { dnn::destroy_convolution_descriptor(self.0) };
    }
}
struct ActDesc(dnn_sys::cudnnActivationDescriptor_t);
impl Drop for ActDesc {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once.
        let _ = unsafe { dnn_sys::cudnnDestroyActivationDescriptor(self.0) };
    }
}

fn c_int(v: usize, what: &str) -> Result<i32, GpuError> {
    i32::try_from(v).map_err(|_| GpuError::Plan(format!("{what} = {v} exceeds a C int")))
}

fn tensor4(dims: [usize; 4]) -> Result<TensorDesc, GpuError> {
    let d = TensorDesc(
        dnn::create_tensor_descriptor()
            .map_err(|e| GpuError::cudnn("creating a tensor descriptor", e))?,
    );
    let dims = [
        c_int(dims[0], "n")?,
        c_int(dims[1], "c")?,
        c_int(dims[2], "h")?,
        c_int(dims[3], "w")?,
    ];
    // SAFETY: fresh descriptor.
    unsafe {
        dnn::set_tensor4d_descriptor(
            d.0,
            dnn_sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
            dnn_sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            dims,
        )
    }
    .map_err(|e| GpuError::cudnn(format!("describing tensor {dims:?}"), e))?;
    Ok(d)
}

/// What the convolution algorithm search found, cached per device and convolution.
#[derive(Clone, Copy, Debug)]
struct ConvChoice {
    algo: dnn_sys::cudnnConvolutionFwdAlgo_t,
    workspace: usize,
    /// The math type the search ran `algo` with (cuDNN needs both on the descriptor).
    math: dnn_sys::cudnnMathType_t,
    /// The fused conv + bias + relu call works with `algo` (meaningful once `fused_tested`).
    fused_ok: bool,
    /// Whether the fused call was tried: a cache entry made by a convolution without relu
    /// has not, and a later convolution of the same shape with relu must still try it.
    fused_tested: bool,
}

fn conv_cache() -> &'static Mutex<HashMap<String, ConvChoice>> {
    static C: OnceLock<Mutex<HashMap<String, ConvChoice>>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

struct ConvPlan {
    x: u64,
    w: u64,
    y: u64,
    bias: u64,
    x_desc: TensorDesc,
    y_desc: TensorDesc,
    bias_desc: TensorDesc,
    w_desc: FilterDesc,
    conv: ConvDesc,
    relu: ActDesc,
    choice: ConvChoice,
    /// Run the fused conv + bias + relu call (else conv, then the bias_act kernel).
    fused: bool,
    /// Bias, channels, inner, activation for the unfused epilogue (None: nothing to do).
    epilogue: Option<(u64, i64, i64, i64, i32)>,
    /// A zero bias for a fused convolution without its own bias.
    _zero_bias: Option<CudaSlice<f32>>,
}

struct SoftmaxPlan {
    x: u64,
    y: u64,
    desc: TensorDesc,
}

/// One step, with every pointer and descriptor resolved.
enum PStep {
    Memcpy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
    Slab {
        dst: u64,
        src: u64,
        a: [i64; 7],
        acc: i32,
        total: usize,
    },
    Conv(Box<ConvPlan>),
    BiasAct {
        y: u64,
        bias: u64,
        total: i64,
        channels: i64,
        inner: i64,
        act: i32,
    },
    Act {
        y: u64,
        x: u64,
        n: i64,
        act: i32,
    },
    Pool {
        y: u64,
        x: u64,
        nc: i64,
        p: [i32; 11],
        is_max: i32,
        total: usize,
    },
    Gemm {
        a: u64,
        b: u64,
        c: u64,
        ta: bool,
        tb: bool,
        mnk: [i32; 3],
        ld: [i32; 3],
        strides: [i64; 3],
        batch: i32,
    },
    Softmax(Box<SoftmaxPlan>),
    LayerNorm {
        y: u64,
        x: u64,
        gamma: u64,
        beta: u64,
        rows: i64,
        dim: i32,
        eps: f32,
    },
    Elementwise {
        y: u64,
        _srcs: CudaSlice<u64>,
        srcs_ptr: u64,
        nsrc: i32,
        n: i64,
        is_mul: i32,
    },
    Permute {
        y: u64,
        x: u64,
        total: i64,
        rank: i32,
        dims: [i64; 6],
        strides: [i64; 6],
    },
    Spin {
        ns: u64,
        blocks: u32,
    },
}

/// An operator ready to enqueue: its steps with resolved pointers and descriptors.
pub struct PreparedOp {
    /// Physical GPU (index into the `gpus` slice).
    pub phys: usize,
    steps: Vec<PStep>,
    /// cuDNN workspace it needs on its stream, bytes.
    pub workspace: usize,
    /// Kernel kinds of its steps (for traces and resource tables).
    pub kinds: Vec<&'static str>,
}

/// Prepare every operator of `p` (placed by `map` on `gpus`): descriptors, convolution
/// algorithms (searched once per device and convolution, by measurement, then cached),
/// device pointer arrays. `prep` holds one stream context per physical GPU for the search.
pub fn prepare(
    p: &GraphProgram,
    mem: &DeviceMemory,
    gpus: &[Gpu],
    map: &[usize],
    prep: &mut [StreamCtx],
    opts: KernelOptions,
) -> Result<Vec<Option<PreparedOp>>, GpuError> {
    let mut out = Vec::with_capacity(p.ops.len());
    for op in &p.ops {
        let Some(op) = op else {
            out.push(None);
            continue;
        };
        let phys = *map
            .get(op.gpu)
            .ok_or_else(|| GpuError::Plan(format!("logical GPU {} is not mapped", op.gpu)))?;
        let gpu = &gpus[phys];
        gpu.bind()?;
        let sc = prep
            .get_mut(phys)
            .ok_or_else(|| GpuError::Plan("no preparation stream for a GPU".into()))?;
        let mut steps = Vec::with_capacity(op.steps.len());
        let mut ws = 0usize;
        for s in &op.steps {
            let ps = prepare_step(s, mem, gpu, sc, opts)?;
            if let PStep::Conv(c) = &ps {
                ws = ws.max(c.choice.workspace);
            }
            steps.push(ps);
        }
        out.push(Some(PreparedOp {
            phys,
            steps,
            workspace: ws,
            kinds: op.steps.iter().map(Step::kind).collect(),
        }));
    }
    for g in gpus {
        g.synchronize()?;
    }
    Ok(out)
}

fn ptr(mem: &DeviceMemory, id: BufId) -> Result<u64, GpuError> {
    mem.ptr
        .get(id)
        .copied()
        .ok_or_else(|| GpuError::Plan(format!("buffer {id} does not exist")))
}

fn prepare_step(
    s: &Step,
    mem: &DeviceMemory,
    gpu: &Gpu,
    sc: &mut StreamCtx,
    opts: KernelOptions,
) -> Result<PStep, GpuError> {
    let i64_ = |v: usize| v as i64;
    Ok(match s {
        Step::Copy {
            src,
            dst,
            outer,
            src_axis,
            src_off,
            dst_axis,
            dst_off,
            len,
            inner,
            accumulate,
        } => {
            let total = outer * len * inner;
            let contiguous = *outer == 1 && *src_off == 0 && *dst_off == 0 && !*accumulate;
            if contiguous {
                PStep::Memcpy {
                    dst: ptr(mem, *dst)?,
                    src: ptr(mem, *src)?,
                    bytes: total * 4,
                }
            } else {
                PStep::Slab {
                    dst: ptr(mem, *dst)?,
                    src: ptr(mem, *src)?,
                    a: [
                        i64_(*outer),
                        i64_(*src_axis),
                        i64_(*src_off),
                        i64_(*dst_axis),
                        i64_(*dst_off),
                        i64_(*len),
                        i64_(*inner),
                    ],
                    acc: i32::from(*accumulate),
                    total,
                }
            }
        }
        Step::Conv { .. } => PStep::Conv(Box::new(prepare_conv(s, mem, gpu, sc, opts)?)),
        Step::BiasAct {
            y,
            bias,
            total,
            channels,
            inner,
            act,
        } => PStep::BiasAct {
            y: ptr(mem, *y)?,
            bias: match bias {
                Some(b) => ptr(mem, *b)?,
                None => 0,
            },
            total: i64_(*total),
            channels: i64_((*channels).max(1)),
            inner: i64_((*inner).max(1)),
            act: act_code(*act),
        },
        Step::Act { x, y, len, act } => PStep::Act {
            y: ptr(mem, *y)?,
            x: ptr(mem, *x)?,
            n: i64_(*len),
            act: act_code(*act),
        },
        Step::Pool {
            x,
            y,
            input,
            out_hw,
            max,
            kernel,
            stride,
            padding,
        } => PStep::Pool {
            y: ptr(mem, *y)?,
            x: ptr(mem, *x)?,
            nc: i64_(input[0] * input[1]),
            p: [
                c_int(input[2], "h")?,
                c_int(input[3], "w")?,
                c_int(out_hw[0], "oh")?,
                c_int(out_hw[1], "ow")?,
                c_int(kernel[0], "kh")?,
                c_int(kernel[1], "kw")?,
                c_int(stride[0], "sh")?,
                c_int(stride[1], "sw")?,
                c_int(padding[0], "ph")?,
                c_int(padding[1], "pw")?,
                0,
            ],
            is_max: i32::from(*max),
            total: input[0] * input[1] * out_hw[0] * out_hw[1],
        },
        Step::Gemm {
            a,
            b,
            c,
            trans_a,
            trans_b,
            m,
            n,
            k,
            lda,
            ldb,
            ldc,
            stride_a,
            stride_b,
            stride_c,
            batch,
        } => PStep::Gemm {
            a: ptr(mem, *a)?,
            b: ptr(mem, *b)?,
            c: ptr(mem, *c)?,
            ta: *trans_a,
            tb: *trans_b,
            mnk: [c_int(*m, "m")?, c_int(*n, "n")?, c_int(*k, "k")?],
            ld: [
                c_int(*lda, "lda")?,
                c_int(*ldb, "ldb")?,
                c_int(*ldc, "ldc")?,
            ],
            strides: [i64_(*stride_a), i64_(*stride_b), i64_(*stride_c)],
            batch: c_int(*batch, "batch")?,
        },
        Step::Softmax {
            x,
            y,
            outer,
            dim,
            inner,
        } => PStep::Softmax(Box::new(SoftmaxPlan {
            x: ptr(mem, *x)?,
            y: ptr(mem, *y)?,
            desc: tensor4([*outer, *dim, *inner, 1])?,
        })),
        Step::LayerNorm {
            x,
            gamma,
            beta,
            y,
            rows,
            dim,
            eps,
        } => PStep::LayerNorm {
            y: ptr(mem, *y)?,
            x: ptr(mem, *x)?,
            gamma: ptr(mem, *gamma)?,
            beta: ptr(mem, *beta)?,
            rows: i64_(*rows),
            dim: c_int(*dim, "dim")?,
            eps: *eps,
        },
        Step::Elementwise { srcs, y, len, kind } => {
            let ptrs = srcs
                .iter()
                .map(|&b| ptr(mem, b))
                .collect::<Result<Vec<u64>, _>>()?;
            let dev = gpu
                .alloc_stream
                .clone_htod(&ptrs)
                .map_err(|e| GpuError::driver("uploading pointer arrays", e))?;
            let (dp, _) = dev.device_ptr(&gpu.alloc_stream);
            PStep::Elementwise {
                y: ptr(mem, *y)?,
                _srcs: dev,
                srcs_ptr: dp,
                nsrc: c_int(ptrs.len(), "inputs")?,
                n: i64_(*len),
                is_mul: i32::from(matches!(kind, opsched_graph::ElementwiseKind::Mul)),
            }
        }
        Step::Transpose {
            x,
            y,
            in_shape,
            perm,
        } => {
            let (dims, strides) = kernels::permute_params(in_shape, perm).ok_or_else(|| {
                GpuError::Plan(format!(
                    "transpose of rank {} (at most {})",
                    in_shape.len(),
                    kernels::MAX_RANK
                ))
            })?;
            PStep::Permute {
                y: ptr(mem, *y)?,
                x: ptr(mem, *x)?,
                total: in_shape.iter().product::<usize>() as i64,
                rank: in_shape.len() as i32,
                dims,
                strides,
            }
        }
        Step::Spin { time_ms, util } => PStep::Spin {
            ns: (time_ms * 1e6).max(0.0) as u64,
            blocks: ((util * f64::from(gpu.info.sms)).ceil() as u32).max(1),
        },
    })
}

fn prepare_conv(
    s: &Step,
    mem: &DeviceMemory,
    gpu: &Gpu,
    sc: &mut StreamCtx,
    opts: KernelOptions,
) -> Result<ConvPlan, GpuError> {
    let Step::Conv {
        x,
        w,
        bias,
        y,
        input,
        out_channels,
        kernel,
        stride,
        padding,
        dilation,
        groups,
        out_hw,
        act,
    } = s
    else {
        return Err(GpuError::Plan("not a convolution".into()));
    };
    let [n, c, _, _] = *input;
    let oc = *out_channels;
    let x_desc = tensor4(*input)?;
    let y_desc = tensor4([n, oc, out_hw[0], out_hw[1]])?;
    let bias_desc = tensor4([1, oc, 1, 1])?;
    let w_desc = FilterDesc(
        dnn::create_filter_descriptor()
            .map_err(|e| GpuError::cudnn("creating a filter descriptor", e))?,
    );
    let wdims = [
        c_int(oc, "oc")?,
        c_int(c / (*groups).max(1), "c/groups")?,
        c_int(kernel[0], "kh")?,
        c_int(kernel[1], "kw")?,
    ];
    // SAFETY: fresh descriptors; all dims checked to fit a C int.
    unsafe {
        dnn::set_filter4d_descriptor(
            w_desc.0,
            dnn_sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            dnn_sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
            wdims,
        )
        .map_err(|e| GpuError::cudnn("describing the filter", e))?;
    }
    let conv = ConvDesc(
        dnn::create_convolution_descriptor()
            .map_err(|e| GpuError::cudnn("creating a convolution descriptor", e))?,
    );
    // SAFETY: fresh descriptor.
    unsafe {
        dnn::set_convolution2d_descriptor(
            conv.0,
            c_int(padding[0], "pad")?,
            c_int(padding[1], "pad")?,
            c_int(stride[0], "stride")?,
            c_int(stride[1], "stride")?,
            c_int(dilation[0], "dilation")?,
            c_int(dilation[1], "dilation")?,
            dnn_sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
            dnn_sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
        )
        .map_err(|e| GpuError::cudnn("describing the convolution", e))?;
        dnn::set_convolution_group_count(conv.0, c_int(*groups, "groups")?)
            .map_err(|e| GpuError::cudnn("setting the group count", e))?;
        let math = if opts.tf32_conv {
            dnn_sys::cudnnMathType_t::CUDNN_DEFAULT_MATH
        } else {
            dnn_sys::cudnnMathType_t::CUDNN_FMA_MATH
        };
        dnn::set_convolution_math_type(conv.0, math)
            .map_err(|e| GpuError::cudnn("setting the math type", e))?;
    }
    let relu = ActDesc({
        let a = dnn::create_activation_descriptor()
            .map_err(|e| GpuError::cudnn("creating an activation descriptor", e))?;
        // SAFETY: fresh descriptor.
        unsafe {
            dnn::set_activation_descriptor(
                a,
                dnn_sys::cudnnActivationMode_t::CUDNN_ACTIVATION_RELU,
                dnn_sys::cudnnNanPropagation_t::CUDNN_NOT_PROPAGATE_NAN,
                0.0,
            )
        }
        .map_err(|e| GpuError::cudnn("describing relu", e))?;
        a
    });
    let (xp, wp, yp) = (ptr(mem, *x)?, ptr(mem, *w)?, ptr(mem, *y)?);
    let key = format!(
        "{}|{input:?}|{oc}|{kernel:?}|{stride:?}|{padding:?}|{dilation:?}|{groups}|{}",
        gpu.info.name, opts.tf32_conv
    );
    let cached = conv_cache().lock().ok().and_then(|m| m.get(&key).copied());
    let mut choice = match cached {
        Some(c) => c,
        None => {
            let c = find_algo(gpu, sc, &x_desc, xp, &w_desc, wp, &conv, &y_desc, yp, opts)?;
            if let Ok(mut m) = conv_cache().lock() {
                m.insert(key.clone(), c);
            }
            c
        }
    };
    // SAFETY: live descriptor. cuDNN picks the kernel from the algorithm *and* the math type:
    // run with the math type the search measured (PyTorch does the same).
    unsafe { dnn::set_convolution_math_type(conv.0, choice.math) }
        .map_err(|e| GpuError::cudnn("setting the searched math type", e))?;
    sc.ensure_workspace(choice.workspace)?;
    let want_fused = *act == opsched_graph::Activation::Relu;
    let (zero_bias, bias_ptr) = match bias {
        Some(b) => (None, ptr(mem, *b)?),
        None if want_fused => {
            let z = gpu
                .alloc_stream
                .alloc_zeros::<f32>(oc)
                .map_err(|e| GpuError::driver("allocating a zero bias", e))?;
            gpu.alloc_stream
                .synchronize()
                .map_err(|e| GpuError::driver("synchronising", e))?;
            let (p, _) = z.device_ptr(&gpu.alloc_stream);
            (Some(z), p)
        }
        None => (None, 0),
    };
    let mut plan = ConvPlan {
        x: xp,
        w: wp,
        y: yp,
        bias: bias_ptr,
        x_desc,
        y_desc,
        bias_desc,
        w_desc,
        conv,
        relu,
        choice,
        fused: want_fused && choice.fused_ok,
        epilogue: None,
        _zero_bias: zero_bias,
    };
    if plan.fused && !choice.fused_tested {
        // The fused call does not support every algorithm everywhere: try it once now.
        let ok = launch_conv(&plan, sc).is_ok() && sc.stream.synchronize().is_ok();
        if !ok {
            tracing::debug!("fused conv+bias+relu not supported for {key}; using conv + kernel");
        }
        choice.fused_ok = ok;
        choice.fused_tested = true;
        plan.choice = choice;
        plan.fused = ok;
        if let Ok(mut m) = conv_cache().lock() {
            m.insert(key, choice);
        }
    }
    if !plan.fused && (bias.is_some() || *act != opsched_graph::Activation::None) {
        let inner = (out_hw[0] * out_hw[1]) as i64;
        plan.epilogue = Some((
            match bias {
                Some(b) => ptr(mem, *b)?,
                None => 0,
            },
            oc as i64,
            inner,
            (n * oc) as i64 * inner,
            act_code(*act),
        ));
    }
    Ok(plan)
}

#[allow(clippy::too_many_arguments)]
fn find_algo(
    gpu: &Gpu,
    sc: &StreamCtx,
    x_desc: &TensorDesc,
    x: u64,
    w_desc: &FilterDesc,
    w: u64,
    conv: &ConvDesc,
    y_desc: &TensorDesc,
    y: u64,
    opts: KernelOptions,
) -> Result<ConvChoice, GpuError> {
    const N: usize = 8;
    let limit = opts.conv_workspace_limit;
    let ws = gpu
        .alloc_stream
        .alloc_zeros::<u8>(limit.max(1))
        .map_err(|e| GpuError::driver("allocating the algorithm-search workspace", e))?;
    gpu.alloc_stream
        .synchronize()
        .map_err(|e| GpuError::driver("synchronising", e))?;
    let (wsp, _) = ws.device_ptr(&gpu.alloc_stream);
    let mut count = 0i32;
    // SAFETY: zeroed plain-old-data structs the call fills in.
    let mut perf: [dnn_sys::cudnnConvolutionFwdAlgoPerf_t; N] = unsafe { std::mem::zeroed() };
    // SAFETY: descriptors match the buffers (sizes from the same program); the workspace is
    // `limit` bytes; the handle's stream belongs to the bound context. The search writes `y`
    // (an output nobody has read yet).
    unsafe {
        dnn_sys::cudnnFindConvolutionForwardAlgorithmEx(
            sc.cudnn.0,
            x_desc.0,
            x as *const c_void,
            w_desc.0,
            w as *const c_void,
            conv.0,
            y_desc.0,
            y as *mut c_void,
            N as i32,
            &mut count,
            perf.as_mut_ptr(),
            wsp as *mut c_void,
            limit,
        )
    }
    .result()
    .map_err(|e| GpuError::cudnn("searching a convolution algorithm", e))?;
    let best = perf
        .iter()
        .take(count.max(0) as usize)
        .filter(|p| p.status == dnn_sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS && p.memory <= limit)
        .min_by(|a, b| a.time.total_cmp(&b.time))
        .ok_or_else(|| GpuError::Cudnn {
            during: "searching a convolution algorithm".into(),
            message: "no algorithm succeeded".into(),
        })?;
    tracing::debug!(
        "conv algorithm {:?}: {:.3} ms, {} bytes",
        best.algo,
        best.time,
        best.memory
    );
    Ok(ConvChoice {
        algo: best.algo,
        workspace: best.memory,
        math: search_math(opts.tf32_conv, best.mathType),
        fused_ok: true,
        fused_tested: false,
    })
}

/// The math type to run a searched algorithm with: the one the search measured it with,
/// except that without TF32 the convolution stays in plain FMA math (cuDNN's default math
/// type allows TF32 on Ampere and later).
fn search_math(tf32: bool, searched: dnn_sys::cudnnMathType_t) -> dnn_sys::cudnnMathType_t {
    if tf32 {
        searched
    } else {
        dnn_sys::cudnnMathType_t::CUDNN_FMA_MATH
    }
}

fn launch_conv(c: &ConvPlan, sc: &StreamCtx) -> Result<(), GpuError> {
    let one = 1.0f32;
    let zero = 0.0f32;
    let ws_ptr = if c.choice.workspace > 0 {
        sc.ws_ptr as *mut c_void
    } else {
        std::ptr::null_mut()
    };
    if c.fused {
        // SAFETY: descriptors match the buffers; z aliases y with alpha2 = 0 (allowed);
        // the workspace holds at least `choice.workspace` bytes (ensured at preparation).
        unsafe {
            dnn::convolution_bias_activation_forward(
                sc.cudnn.0,
                (&one) as *const f32 as *const c_void,
                c.x_desc.0,
                c.x as *const c_void,
                c.w_desc.0,
                c.w as *const c_void,
                c.conv.0,
                c.choice.algo,
                ws_ptr,
                c.choice.workspace,
                (&zero) as *const f32 as *const c_void,
                c.y_desc.0,
                c.y as *const c_void,
                c.bias_desc.0,
                c.bias as *const c_void,
                c.relu.0,
                c.y_desc.0,
                c.y as *mut c_void,
            )
        }
        .map_err(|e| GpuError::cudnn("running a fused convolution", e))
    } else {
        // SAFETY: as above.
        unsafe {
            dnn::convolution_forward(
                sc.cudnn.0,
                (&one) as *const f32 as *const c_void,
                c.x_desc.0,
                c.x as *const c_void,
                c.w_desc.0,
                c.w as *const c_void,
                c.conv.0,
                c.choice.algo,
                ws_ptr,
                c.choice.workspace,
                (&zero) as *const f32 as *const c_void,
                c.y_desc.0,
                c.y as *mut c_void,
            )
        }
        .map_err(|e| GpuError::cudnn("running a convolution", e))
    }
}

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks_for(n), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn launched(
    r: Result<Option<(CudaEvent, CudaEvent)>, drv::DriverError>,
    what: &str,
) -> Result<(), GpuError> {
    r.map(|_| ())
        .map_err(|e| GpuError::driver(format!("launching {what}"), e))
}

impl PreparedOp {
    /// Enqueue this operator's steps on `sc` (a stream of its GPU). Allocates nothing.
    pub fn launch(&self, gpu: &Gpu, sc: &StreamCtx) -> Result<(), GpuError> {
        gpu.bind()?;
        let st = &sc.stream;
        for s in &self.steps {
            match s {
                PStep::Memcpy { dst, src, bytes } => {
                    // SAFETY: both buffers hold at least `bytes` (sizes from the program).
                    unsafe { drv::memcpy_dtod_async(*dst, *src, *bytes, st.cu_stream()) }
                        .map_err(|e| GpuError::driver("copying", e))?;
                }
                PStep::Slab {
                    dst,
                    src,
                    a,
                    acc,
                    total,
                } => {
                    let f = gpu.function("slab_copy")?;
                    let mut b = st.launch_builder(f);
                    b.arg(dst).arg(src);
                    for v in a {
                        b.arg(v);
                    }
                    b.arg(acc);
                    // SAFETY: the argument list matches `slab_copy`'s signature; indices stay
                    // inside the buffers (checked by the CPU step executor's bounds logic).
                    launched(unsafe { b.launch(grid(*total)) }, "slab_copy")?;
                }
                PStep::Conv(c) => {
                    launch_conv(c, sc)?;
                    if let Some((bias, channels, inner, total, act)) = &c.epilogue {
                        let f = gpu.function("bias_act")?;
                        let mut b = st.launch_builder(f);
                        b.arg(&c.y)
                            .arg(bias)
                            .arg(total)
                            .arg(channels)
                            .arg(inner)
                            .arg(act);
                        // SAFETY: matches `bias_act`; bias has `channels` elements or is null.
                        launched(unsafe { b.launch(grid(*total as usize)) }, "bias_act")?;
                    }
                }
                PStep::BiasAct {
                    y,
                    bias,
                    total,
                    channels,
                    inner,
                    act,
                } => {
                    let f = gpu.function("bias_act")?;
                    let mut b = st.launch_builder(f);
                    b.arg(y)
                        .arg(bias)
                        .arg(total)
                        .arg(channels)
                        .arg(inner)
                        .arg(act);
                    // SAFETY: matches `bias_act`.
                    launched(unsafe { b.launch(grid(*total as usize)) }, "bias_act")?;
                }
                PStep::Act { y, x, n, act } => {
                    let f = gpu.function("act_kernel")?;
                    let mut b = st.launch_builder(f);
                    b.arg(y).arg(x).arg(n).arg(act);
                    // SAFETY: matches `act_kernel`.
                    launched(unsafe { b.launch(grid(*n as usize)) }, "act_kernel")?;
                }
                PStep::Pool {
                    y,
                    x,
                    nc,
                    p,
                    is_max,
                    total,
                } => {
                    let f = gpu.function("pool2d")?;
                    let mut b = st.launch_builder(f);
                    b.arg(y).arg(x).arg(nc);
                    for v in &p[..10] {
                        b.arg(v);
                    }
                    b.arg(is_max);
                    // SAFETY: matches `pool2d` (10 ints after nc, then is_max).
                    launched(unsafe { b.launch(grid(*total)) }, "pool2d")?;
                }
                PStep::Gemm {
                    a,
                    b,
                    c,
                    ta,
                    tb,
                    mnk,
                    ld,
                    strides,
                    batch,
                } => {
                    let op = |t: bool| {
                        if t {
                            blas_sys::cublasOperation_t::CUBLAS_OP_T
                        } else {
                            blas_sys::cublasOperation_t::CUBLAS_OP_N
                        }
                    };
                    let (one, zero) = (1.0f32, 0.0f32);
                    // SAFETY: dimensions and leading dimensions describe the buffers (from
                    // the program, checked on the CPU); the handle is bound to this stream.
                    unsafe {
                        if *batch == 1 {
                            blas::sgemm(
                                sc.cublas.0,
                                op(*ta),
                                op(*tb),
                                mnk[0],
                                mnk[1],
                                mnk[2],
                                &one,
                                *a as *const f32,
                                ld[0],
                                *b as *const f32,
                                ld[1],
                                &zero,
                                *c as *mut f32,
                                ld[2],
                            )
                        } else {
                            blas::sgemm_strided_batched(
                                sc.cublas.0,
                                op(*ta),
                                op(*tb),
                                mnk[0],
                                mnk[1],
                                mnk[2],
                                &one,
                                *a as *const f32,
                                ld[0],
                                strides[0],
                                *b as *const f32,
                                ld[1],
                                strides[1],
                                &zero,
                                *c as *mut f32,
                                ld[2],
                                strides[2],
                                *batch,
                            )
                        }
                    }
                    .map_err(|e| GpuError::cublas("running a gemm", e))?;
                }
                PStep::Softmax(p) => {
                    let (one, zero) = (1.0f32, 0.0f32);
                    // SAFETY: one descriptor for x and y of equal size.
                    unsafe {
                        dnn::softmax_forward(
                            sc.cudnn.0,
                            dnn_sys::cudnnSoftmaxAlgorithm_t::CUDNN_SOFTMAX_ACCURATE,
                            dnn_sys::cudnnSoftmaxMode_t::CUDNN_SOFTMAX_MODE_CHANNEL,
                            (&one) as *const f32 as *const c_void,
                            p.desc.0,
                            p.x as *const c_void,
                            (&zero) as *const f32 as *const c_void,
                            p.desc.0,
                            p.y as *mut c_void,
                        )
                    }
                    .map_err(|e| GpuError::cudnn("running softmax", e))?;
                }
                PStep::LayerNorm {
                    y,
                    x,
                    gamma,
                    beta,
                    rows,
                    dim,
                    eps,
                } => {
                    let f = gpu.function("layer_norm")?;
                    let mut b = st.launch_builder(f);
                    b.arg(y)
                        .arg(x)
                        .arg(gamma)
                        .arg(beta)
                        .arg(rows)
                        .arg(dim)
                        .arg(eps);
                    let cfg = LaunchConfig {
                        grid_dim: ((*rows).clamp(1, 65_535 * 16) as u32, 1, 1),
                        block_dim: (kernels::layer_norm_block(*dim as usize), 1, 1),
                        shared_mem_bytes: 0,
                    };
                    // SAFETY: matches `layer_norm`; the block is a power of two <= 1024.
                    launched(unsafe { b.launch(cfg) }, "layer_norm")?;
                }
                PStep::Elementwise {
                    y,
                    _srcs: _,
                    srcs_ptr,
                    nsrc,
                    n,
                    is_mul,
                } => {
                    let f = gpu.function("elementwise")?;
                    let mut b = st.launch_builder(f);
                    b.arg(y).arg(srcs_ptr).arg(nsrc).arg(n).arg(is_mul);
                    // SAFETY: matches `elementwise`; the pointer array lives in this op.
                    launched(unsafe { b.launch(grid(*n as usize)) }, "elementwise")?;
                }
                PStep::Permute {
                    y,
                    x,
                    total,
                    rank,
                    dims,
                    strides,
                } => {
                    let f = gpu.function("permute")?;
                    let mut b = st.launch_builder(f);
                    b.arg(y).arg(x).arg(total).arg(rank).arg(dims).arg(strides);
                    // SAFETY: matches `permute` (two 48-byte Dims6 structs by value).
                    launched(unsafe { b.launch(grid(*total as usize)) }, "permute")?;
                }
                PStep::Spin { ns, blocks } => {
                    let f = gpu.function("spin")?;
                    let mut b = st.launch_builder(f);
                    b.arg(ns);
                    let cfg = LaunchConfig {
                        grid_dim: (*blocks, 1, 1),
                        block_dim: (32, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    // SAFETY: matches `spin`.
                    launched(unsafe { b.launch(cfg) }, "spin")?;
                }
            }
        }
        Ok(())
    }
}

/// Copy `bytes` from `src` on `src_gpu` to `dst` on `dst_gpu`, enqueued on `sc` (a stream of
/// the destination GPU). Same device: a device-to-device copy; else a peer copy.
pub fn copy_between(
    src_gpu: &Gpu,
    src: u64,
    dst_gpu: &Gpu,
    dst: u64,
    bytes: usize,
    sc: &StreamCtx,
) -> Result<(), GpuError> {
    dst_gpu.bind()?;
    if src_gpu.info.ordinal == dst_gpu.info.ordinal {
        // SAFETY: both buffers hold `bytes` bytes on this device.
        unsafe { drv::memcpy_dtod_async(dst, src, bytes, sc.stream.cu_stream()) }
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
                sc.stream.cu_stream(),
            )
        }
        .map_err(|e| GpuError::driver("copying between GPUs", e))
    }
}

/// Let `a` access `b`'s memory directly where the hardware allows (peer copies then avoid
/// the host). Returns whether peer access is on.
pub fn enable_peer_access(a: &Gpu, b: &Gpu) -> Result<bool, GpuError> {
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
    use super::*;
    use dnn_sys::cudnnMathType_t as M;

    #[test]
    fn searched_math_type_is_kept_unless_tf32_is_off() {
        assert_eq!(
            search_math(true, M::CUDNN_TENSOR_OP_MATH),
            M::CUDNN_TENSOR_OP_MATH
        );
        assert_eq!(search_math(true, M::CUDNN_FMA_MATH), M::CUDNN_FMA_MATH);
        assert_eq!(search_math(false, M::CUDNN_DEFAULT_MATH), M::CUDNN_FMA_MATH);
    }
}
