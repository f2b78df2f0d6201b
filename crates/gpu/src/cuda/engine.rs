//! cuDNN's backend (graph) API for one convolution: the engines its heuristics propose, as
//! candidates beside the legacy API's algorithms.
//!
//! The legacy `cudnnConvolutionForward` reaches a fixed subset of cuDNN's engines; PyTorch
//! goes through the backend API and on an H100 runs engines (sm90 TF32 implicit GEMM, with the
//! NCHW-to-NHWC transforms inside the plan) that the legacy algorithms do not select. Here a
//! convolution becomes a one-operation graph ([`ConvGraph`]); heuristic mode A ranks the
//! engine configurations for it ([`ConvGraph::configs`]); those allowed by the kernel options
//! ([`admissible`]) become execution plans ([`Plan`]) that the convolution step times like its
//! legacy algorithms. Where none of mode A's top is allowed, the fallback list's top is tried
//! (as PyTorch adds it): engines that support the graph, with no promise of speed.
//!
//! A configuration is remembered as ([`EngineRef`]) its engine's global index and its rank in
//! the heuristics' lists (mode A's from 0, the fallback list's from [`TOP`]): the lists are a
//! function of the graph, the device and the cuDNN version (all in the tuning key and the
//! cache's device fingerprint), so a later process rebuilds the same configuration, and a list
//! that changed anyway is detected (the engine at that rank is not the recorded one) rather
//! than run blindly.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::c_void;

use cudarc::cudnn::sys as dnn_sys;
use dnn_sys::cudnnBackendAttributeName_t as A;
use dnn_sys::cudnnBackendAttributeType_t as T;
use dnn_sys::cudnnBackendDescriptorType_t as D;
use dnn_sys::cudnnBackendNumericalNote_t as N;

use super::cudnn::as_i64;
use crate::GpuError;

/// Engine configurations tried per convolution, from the top of a heuristics' list.
pub(crate) const TOP: usize = 8;

/// A list of engine configurations the heuristics give for a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum List {
    /// Heuristic mode A's ranking, best first.
    ModeA,
    /// The fallback list: engines that support the graph, with no promise of speed.
    Fallback,
}

impl List {
    fn mode(self) -> dnn_sys::cudnnBackendHeurMode_t {
        match self {
            List::ModeA => dnn_sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A,
            List::Fallback => dnn_sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK,
        }
    }

    /// The rank that names position `i` of this list.
    fn rank(self, i: usize) -> u32 {
        let base = match self {
            List::ModeA => 0,
            List::Fallback => TOP,
        };
        u32::try_from(base + i).unwrap_or(u32::MAX)
    }

    /// The list and position a rank names.
    fn of_rank(rank: u32) -> (List, usize) {
        let r = rank as usize;
        match r.checked_sub(TOP) {
            None => (List::ModeA, r),
            Some(i) => (List::Fallback, i),
        }
    }
}

/// The alignment declared for every tensor, bytes: views into a concatenation start at
/// multiples of 16 bytes and every other buffer at 256 (`crate::memory`). Constant, so the
/// heuristics see the same graph in every process.
const ALIGNMENT: i64 = 16;

/// Unique ids of the three tensors in the graph and the variant pack.
const X_ID: i64 = 1;
const W_ID: i64 = 2;
const Y_ID: i64 = 3;

/// One engine configuration of a graph, as a later process finds it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct EngineRef {
    /// The engine's global index (`CUDNN_ATTR_ENGINE_GLOBAL_INDEX`).
    pub global: u32,
    /// Its position in heuristic mode A's list for the graph.
    pub rank: u32,
}

/// An owned backend descriptor.
struct Desc(dnn_sys::cudnnBackendDescriptor_t);

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created once by `Desc::new`, destroyed once here.
        let _ = unsafe { dnn_sys::cudnnBackendDestroyDescriptor(self.0) };
    }
}

fn check(status: dnn_sys::cudnnStatus_t, during: &str) -> Result<(), GpuError> {
    status.result().map_err(|e| GpuError::cudnn(during, e))
}

impl Desc {
    fn new(kind: D) -> Result<Desc, GpuError> {
        let mut d: dnn_sys::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: `d` receives a fresh descriptor.
        check(
            unsafe { dnn_sys::cudnnBackendCreateDescriptor(kind, &mut d) },
            "creating a backend descriptor",
        )?;
        Ok(Desc(d))
    }

    /// Set attribute `name` to `values`, whose element type is what `ty` says.
    fn set<V>(&self, name: A, ty: T, values: &[V]) -> Result<(), GpuError> {
        let n = i64::try_from(values.len())
            .map_err(|_| GpuError::Plan("a backend attribute with too many values".into()))?;
        // SAFETY: a live descriptor; `values` holds `n` elements of the type `ty` names
        // (every caller passes the Rust type of that C type).
        check(
            unsafe {
                dnn_sys::cudnnBackendSetAttribute(
                    self.0,
                    name,
                    ty,
                    n,
                    values.as_ptr() as *const c_void,
                )
            },
            "setting a backend attribute",
        )
    }

    fn set_desc(&self, name: A, values: &[&Desc]) -> Result<(), GpuError> {
        let raw: Vec<_> = values.iter().map(|d| d.0).collect();
        self.set(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw)
    }

    fn finalize(self, what: &str) -> Result<Desc, GpuError> {
        // SAFETY: a live descriptor with its attributes set.
        check(
            unsafe { dnn_sys::cudnnBackendFinalize(self.0) },
            &format!("finalizing {what}"),
        )?;
        Ok(self)
    }

    /// How many values attribute `name` has. The array pointer must be null: cuDNN counts
    /// only what it could write when given one, so a zero-length array counts nothing.
    fn count(&self, name: A, ty: T) -> Result<usize, GpuError> {
        // SAFETY: a null array: nothing is written.
        let n = unsafe { self.get_raw(name, ty, 0, std::ptr::null_mut()) }?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Up to `out.len()` values of attribute `name`; returns how many were written.
    fn get<V>(&self, name: A, ty: T, out: &mut [V]) -> Result<usize, GpuError> {
        let n = i64::try_from(out.len()).unwrap_or(i64::MAX);
        // SAFETY: `out` has room for `n` elements of the type `ty` names (every caller passes
        // the Rust type of that C type).
        let count = unsafe { self.get_raw(name, ty, n, out.as_mut_ptr() as *mut c_void) }?;
        Ok(usize::try_from(count).unwrap_or(0).min(out.len()))
    }

    /// `cudnnBackendGetAttribute`: at most `n` values into `out`; cuDNN's count.
    ///
    /// # Safety
    /// `out` is null or has room for `n` elements of the type `ty` names.
    unsafe fn get_raw(&self, name: A, ty: T, n: i64, out: *mut c_void) -> Result<i64, GpuError> {
        let mut count = 0i64;
        // SAFETY: a live, finalized descriptor; `out` as the caller promises.
        check(
            unsafe { dnn_sys::cudnnBackendGetAttribute(self.0, name, ty, n, &mut count, out) },
            "reading a backend attribute",
        )?;
        Ok(count)
    }

    fn get_i64(&self, name: A) -> Result<i64, GpuError> {
        let mut v = [0i64];
        self.get(name, T::CUDNN_TYPE_INT64, &mut v)?;
        Ok(v[0])
    }
}

/// An f32 tensor `[n, c, h, w]` of the graph (a filter: `[k, c, r, s]`), its images `image`
/// elements apart: in NCHW (KCRS) order, or channels last (`[n, h, w, c]`, KRSC; its pixels
/// `image / (h * w)` apart).
fn tensor(id: i64, dims: [usize; 4], image: usize, channels_last: bool) -> Result<Desc, GpuError> {
    let d = dims
        .iter()
        .map(|&v| as_i64(v, "a tensor dimension"))
        .collect::<Result<Vec<_>, _>>()?;
    let image = as_i64(image, "an image stride")?;
    // Channels last, pixels are the image stride over the pixels apart (the channels where
    // dense).
    let pixel = image / (d[2] * d[3]).max(1);
    let strides = match channels_last {
        false => [image, d[2] * d[3], d[3], 1],
        true => [image, 1, d[3] * pixel, pixel],
    };
    let t = Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    t.set(
        A::CUDNN_ATTR_TENSOR_DATA_TYPE,
        T::CUDNN_TYPE_DATA_TYPE,
        &[dnn_sys::cudnnDataType_t::CUDNN_DATA_FLOAT],
    )?;
    t.set(A::CUDNN_ATTR_TENSOR_DIMENSIONS, T::CUDNN_TYPE_INT64, &d)?;
    t.set(A::CUDNN_ATTR_TENSOR_STRIDES, T::CUDNN_TYPE_INT64, &strides)?;
    t.set(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, T::CUDNN_TYPE_INT64, &[id])?;
    t.set(
        A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
        T::CUDNN_TYPE_INT64,
        &[ALIGNMENT],
    )?;
    t.finalize("a tensor descriptor")
}

/// The shape of a convolution, as the step has it (symmetric padding: the step pads an
/// asymmetric remainder itself).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvShape {
    pub x: [usize; 4],
    pub w: [usize; 4],
    pub y: [usize; 4],
    /// Elements between images of `x` (a strided input's, else `c * h * w`).
    pub x_image: usize,
    /// Elements between images of `y` (a strided output's, else `c * h * w`).
    pub y_image: usize,
    /// `x` and `y` channels last, the filter KRSC.
    pub nhwc: bool,
    pub padding: [usize; 2],
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
}

/// A one-convolution operation graph and its heuristics' configurations.
pub(crate) struct ConvGraph {
    graph: Desc,
    /// The first [`TOP`] configurations of each [`List`] (mode A's, the fallback list's),
    /// each read once when first needed.
    lists: [Option<Vec<Desc>>; 2],
    // The graph's parts, kept alive as long as the graph.
    _parts: Vec<Desc>,
}

impl ConvGraph {
    pub(crate) fn new(
        handle: dnn_sys::cudnnHandle_t,
        s: &ConvShape,
    ) -> Result<ConvGraph, GpuError> {
        let dense = |d: [usize; 4]| d[1] * d[2] * d[3];
        let (x, w, y) = (
            tensor(X_ID, s.x, s.x_image, s.nhwc)?,
            tensor(W_ID, s.w, dense(s.w), s.nhwc)?,
            tensor(Y_ID, s.y, s.y_image, s.nhwc)?,
        );
        let two = |v: [usize; 2], what: &str| -> Result<[i64; 2], GpuError> {
            Ok([as_i64(v[0], what)?, as_i64(v[1], what)?])
        };
        let conv = Desc::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
            T::CUDNN_TYPE_DATA_TYPE,
            &[dnn_sys::cudnnDataType_t::CUDNN_DATA_FLOAT],
        )?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
            T::CUDNN_TYPE_CONVOLUTION_MODE,
            &[dnn_sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
        )?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS,
            T::CUDNN_TYPE_INT64,
            &[2i64],
        )?;
        let pad = two(s.padding, "padding")?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
            T::CUDNN_TYPE_INT64,
            &pad,
        )?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
            T::CUDNN_TYPE_INT64,
            &pad,
        )?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
            T::CUDNN_TYPE_INT64,
            &two(s.stride, "stride")?,
        )?;
        conv.set(
            A::CUDNN_ATTR_CONVOLUTION_DILATIONS,
            T::CUDNN_TYPE_INT64,
            &two(s.dilation, "dilation")?,
        )?;
        let conv = conv.finalize("a convolution descriptor")?;
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)?;
        op.set_desc(
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
            &[&conv],
        )?;
        op.set_desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, &[&x])?;
        op.set_desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, &[&w])?;
        op.set_desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, &[&y])?;
        // y = 1 * conv(x, w) + 0 * y: scaling factors are f32 for an f32 computation.
        op.set(
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
            T::CUDNN_TYPE_FLOAT,
            &[1.0f32],
        )?;
        op.set(
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
            T::CUDNN_TYPE_FLOAT,
            &[0.0f32],
        )?;
        let op = op.finalize("a convolution operation")?;
        let graph = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
        graph.set(
            A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
            T::CUDNN_TYPE_HANDLE,
            &[handle],
        )?;
        graph.set_desc(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &[&op])?;
        let graph = graph.finalize("an operation graph")?;
        Ok(ConvGraph {
            graph,
            lists: [None, None],
            _parts: vec![x, w, y, conv, op],
        })
    }

    /// The first [`TOP`] configurations of `list` for the graph, in the list's order.
    fn configs(&mut self, list: List) -> Result<&[Desc], GpuError> {
        let slot = &mut self.lists[list as usize];
        if slot.is_none() {
            let heur = Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
            heur.set_desc(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&self.graph])?;
            heur.set(
                A::CUDNN_ATTR_ENGINEHEUR_MODE,
                T::CUDNN_TYPE_HEUR_MODE,
                &[list.mode()],
            )?;
            let heur = heur.finalize("the engine heuristics")?;
            let ranked = heur.count(
                A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
                T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            )?;
            tracing::debug!("cuDNN's heuristics ({list:?}) list {ranked} engine configurations");
            // Only the top of the list is ever tried: read no more of it.
            let count = ranked.min(TOP);
            let mut configs = (0..count)
                .map(|_| Desc::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
                .collect::<Result<Vec<_>, _>>()?;
            let mut raw: Vec<_> = configs.iter().map(|d| d.0).collect();
            let got = heur.get(
                A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
                T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                &mut raw,
            )?;
            configs.truncate(got);
            *slot = Some(configs);
        }
        Ok(slot.as_deref().unwrap_or_default())
    }

    /// The engine of configuration `cfg`: its global index and its numerical and behaviour
    /// notes.
    fn engine_of(cfg: &Desc) -> Result<(u32, Vec<u32>, Vec<u32>), GpuError> {
        let engine = Desc::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
        let mut raw = [engine.0];
        cfg.get(
            A::CUDNN_ATTR_ENGINECFG_ENGINE,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            &mut raw,
        )?;
        let global = engine.get_i64(A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX)?;
        let global = u32::try_from(global)
            .map_err(|_| GpuError::Plan(format!("engine index {global} out of range")))?;
        let notes = |name: A, ty: T| -> Result<Vec<u32>, GpuError> {
            // The note enums are C enums (32-bit); an engine has a handful of notes.
            let mut v = vec![0u32; engine.count(name, ty)?.min(64)];
            let n = engine.get(name, ty, &mut v)?;
            v.truncate(n);
            Ok(v)
        };
        Ok((
            global,
            notes(
                A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                T::CUDNN_TYPE_NUMERICAL_NOTE,
            )?,
            notes(
                A::CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE,
                T::CUDNN_TYPE_BEHAVIOR_NOTE,
            )?,
        ))
    }

    /// The admissible configurations among the first [`TOP`] of mode A's list, else (none
    /// being admissible) among the first [`TOP`] of the fallback list.
    pub(crate) fn candidates(&mut self, tf32: bool) -> Result<Vec<EngineRef>, GpuError> {
        let mut out = Vec::new();
        for list in [List::ModeA, List::Fallback] {
            for (i, cfg) in self.configs(list)?.iter().enumerate() {
                let (global, numerical, behaviour) = Self::engine_of(cfg)?;
                let ok = admissible(&numerical, &behaviour, tf32);
                let rank = list.rank(i);
                tracing::debug!(
                    "engine {global} at rank {rank} ({list:?}): numerical notes {numerical:?}, \
                     behaviour notes {behaviour:?}: {}",
                    if ok { "a candidate" } else { "not admissible" }
                );
                if ok {
                    out.push(EngineRef { global, rank });
                }
            }
            if !out.is_empty() {
                break;
            }
        }
        Ok(out)
    }

    /// The execution plan of configuration `e`, or an error when the heuristics' list no
    /// longer has that engine at that rank, or cuDNN cannot build it.
    pub(crate) fn plan(
        &mut self,
        handle: dnn_sys::cudnnHandle_t,
        e: EngineRef,
    ) -> Result<Plan, GpuError> {
        let (list, i) = List::of_rank(e.rank);
        let cfg = self
            .configs(list)?
            .get(i)
            .ok_or_else(|| GpuError::Plan(format!("no engine configuration at rank {}", e.rank)))?;
        let (global, _, _) = Self::engine_of(cfg)?;
        if global != e.global {
            return Err(GpuError::Plan(format!(
                "the heuristics rank engine {global} at {}, not {} as measured",
                e.rank, e.global
            )));
        }
        let plan = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
        plan.set(
            A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
            T::CUDNN_TYPE_HANDLE,
            &[handle],
        )?;
        plan.set_desc(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[cfg])?;
        let plan = plan.finalize("an execution plan")?;
        let ws = plan.get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?;
        Ok(Plan {
            plan,
            workspace: usize::try_from(ws).unwrap_or(usize::MAX),
            engine: e,
            pack: RefCell::new(None),
        })
    }
}

/// Whether an engine with these notes may run a convolution: never one that converts its
/// inputs to a narrower type than TF32 or is nondeterministic; one using tensor cores (TF32
/// for f32 data) only where TF32 is allowed; none that compiles at run time (seconds per
/// shape). PyTorch filters its engine configurations alike.
pub(crate) fn admissible(numerical: &[u32], behaviour: &[u32], tf32: bool) -> bool {
    let has = |n: N| numerical.contains(&(n as u32));
    let compiles = behaviour.contains(
        &(dnn_sys::cudnnBackendBehaviorNote_t::CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION as u32),
    );
    !(has(N::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)
        || has(N::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)
        || (!tf32 && has(N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE))
        || compiles)
}

/// An execution plan: one engine configuration, ready to run.
pub(crate) struct Plan {
    plan: Desc,
    pub workspace: usize,
    pub engine: EngineRef,
    /// The variant pack of the last launch and the pointers it holds (x, w, y, workspace):
    /// built once, not per launch, since eager runs pay every host microsecond.
    pack: RefCell<Option<([u64; 4], Desc)>>,
}

impl Plan {
    /// Enqueue `y = conv(x, w)` on the stream of `handle`. The pointers are device addresses
    /// of buffers of the graph's shapes; `ws` holds at least `self.workspace` bytes.
    pub(crate) fn execute(
        &self,
        handle: dnn_sys::cudnnHandle_t,
        x: u64,
        w: u64,
        y: u64,
        ws: u64,
    ) -> Result<(), GpuError> {
        let key = [x, w, y, ws];
        let mut cached = self.pack.borrow_mut();
        if cached.as_ref().is_none_or(|(k, _)| *k != key) {
            *cached = Some((key, variant_pack(x, w, y, ws, self.workspace)?));
        }
        let Some((_, pack)) = cached.as_ref() else {
            return Err(GpuError::Plan("no variant pack".into()));
        };
        // SAFETY: a finalized plan and variant pack; the pointers are live buffers of the
        // shapes the plan's graph describes (the caller's invariant) and the workspace is
        // large enough.
        check(
            unsafe { dnn_sys::cudnnBackendExecute(handle, self.plan.0, pack.0) },
            "running a convolution engine",
        )
    }
}

/// The variant pack binding the graph's tensors to `x`, `w`, `y`, with workspace `ws` (unused
/// when `workspace` is 0).
fn variant_pack(x: u64, w: u64, y: u64, ws: u64, workspace: usize) -> Result<Desc, GpuError> {
    let pack = Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    pack.set(
        A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
        T::CUDNN_TYPE_INT64,
        &[X_ID, W_ID, Y_ID],
    )?;
    let ptrs = [x, w, y].map(|p| p as *mut c_void);
    pack.set(
        A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
        T::CUDNN_TYPE_VOID_PTR,
        &ptrs,
    )?;
    let ws = if workspace > 0 {
        ws as *mut c_void
    } else {
        std::ptr::null_mut()
    };
    pack.set(
        A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
        T::CUDNN_TYPE_VOID_PTR,
        &[ws],
    )?;
    pack.finalize("a variant pack")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_name_a_list_and_a_position() {
        for list in [List::ModeA, List::Fallback] {
            for i in 0..TOP {
                assert_eq!(List::of_rank(list.rank(i)), (list, i));
            }
        }
        assert_eq!(List::of_rank(0), (List::ModeA, 0));
        assert_eq!(List::of_rank(TOP as u32), (List::Fallback, 0));
    }

    #[test]
    fn engines_are_filtered_by_their_notes() {
        let tc = N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE as u32;
        let down = N::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS as u32;
        let nondet = N::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC as u32;
        let winograd = N::CUDNN_NUMERICAL_NOTE_WINOGRAD as u32;
        let rtc =
            dnn_sys::cudnnBackendBehaviorNote_t::CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION as u32;
        assert!(admissible(&[], &[], false));
        assert!(admissible(&[tc, winograd], &[], true));
        assert!(!admissible(&[tc], &[], false), "TF32 off: no tensor cores");
        assert!(!admissible(&[down], &[], true));
        assert!(!admissible(&[nondet], &[], true));
        assert!(!admissible(&[], &[rtc], true));
    }
}
