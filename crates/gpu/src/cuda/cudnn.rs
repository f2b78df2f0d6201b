//! cuDNN descriptors as owned values (created and destroyed exactly once).
#![allow(unsafe_code)]

use cudarc::cudnn::{result as dnn, sys as dnn_sys};

use crate::GpuError;

/// A size as a C `int`, or an error naming it.
pub(crate) fn c_int(v: usize, what: &str) -> Result<i32, GpuError> {
    i32::try_from(v).map_err(|_| GpuError::Plan(format!("{what} = {v} exceeds a C int")))
}

/// A size as an `int64` (the backend API's integers, our kernels' sizes), or an error naming it.
pub(crate) fn as_i64(v: usize, what: &str) -> Result<i64, GpuError> {
    i64::try_from(v).map_err(|_| GpuError::Plan(format!("{what} = {v} exceeds an int64")))
}

/// A strided view's run and stride as our kernels take them (`*_runs`: two `int64`s after
/// the size); `None` for a dense buffer.
pub(crate) fn runs_args(
    runs: Option<crate::program::Runs>,
) -> Result<Option<(i64, i64)>, GpuError> {
    runs.map(|r| {
        Ok((
            as_i64(r.run.max(1), "run")?,
            as_i64(r.stride, "run stride")?,
        ))
    })
    .transpose()
}

/// A tensor descriptor.
pub(crate) struct TensorDesc(pub(crate) dnn_sys::cudnnTensorDescriptor_t);
impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: created once by `new_tensor`, destroyed once here.
        let _ = unsafe { dnn::destroy_tensor_descriptor(self.0) };
    }
}

/// A filter descriptor.
pub(crate) struct FilterDesc(pub(crate) dnn_sys::cudnnFilterDescriptor_t);
impl Drop for FilterDesc {
    fn drop(&mut self) {
        // SAFETY: created once by `FilterDesc::new`, destroyed once here.
        let _ = unsafe { dnn::destroy_filter_descriptor(self.0) };
    }
}

/// A convolution descriptor.
pub(crate) struct ConvDesc(pub(crate) dnn_sys::cudnnConvolutionDescriptor_t);
impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: created once by `ConvDesc::new`, destroyed once here.
        let _ = unsafe { dnn::destroy_convolution_descriptor(self.0) };
    }
}

/// An activation descriptor.
pub(crate) struct ActDesc(pub(crate) dnn_sys::cudnnActivationDescriptor_t);
impl Drop for ActDesc {
    fn drop(&mut self) {
        // SAFETY: created once by `ActDesc::relu`, destroyed once here.
        let _ = unsafe { dnn_sys::cudnnDestroyActivationDescriptor(self.0) };
    }
}

/// `dims` as C ints, each named in the error of one that does not fit.
fn c_ints(dims: [usize; 4], names: [&'static str; 4]) -> Result<[i32; 4], GpuError> {
    Ok([
        c_int(dims[0], names[0])?,
        c_int(dims[1], names[1])?,
        c_int(dims[2], names[2])?,
        c_int(dims[3], names[3])?,
    ])
}

fn new_tensor() -> Result<TensorDesc, GpuError> {
    Ok(TensorDesc(dnn::create_tensor_descriptor().map_err(
        |e| GpuError::cudnn("creating a tensor descriptor", e),
    )?))
}

/// A dense NCHW f32 tensor descriptor.
pub(crate) fn tensor4(dims: [usize; 4]) -> Result<TensorDesc, GpuError> {
    tensor4_in(dims, dnn_sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW)
}

/// A dense f32 tensor descriptor of `[n, c, h, w]` stored channels last.
pub(crate) fn tensor4_nhwc(dims: [usize; 4]) -> Result<TensorDesc, GpuError> {
    tensor4_in(dims, dnn_sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC)
}

/// A dense f32 tensor descriptor of `[n, c, h, w]` in `format`.
pub(crate) fn tensor4_in(
    dims: [usize; 4],
    format: dnn_sys::cudnnTensorFormat_t,
) -> Result<TensorDesc, GpuError> {
    let d = new_tensor()?;
    let dims = c_ints(dims, ["n", "c", "h", "w"])?;
    // SAFETY: a fresh descriptor; dims fit a C int.
    unsafe {
        dnn::set_tensor4d_descriptor(
            d.0,
            format,
            dnn_sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            dims,
        )
    }
    .map_err(|e| GpuError::cudnn(format!("describing tensor {dims:?}"), e))?;
    Ok(d)
}

/// An NCHW f32 tensor descriptor whose images are `image` elements apart, each dense (a
/// convolution's slice of a concatenation at batch > 1: its images are a whole concatenated
/// image apart); [`tensor4`] where that is dense.
pub(crate) fn tensor4_images(dims: [usize; 4], image: usize) -> Result<TensorDesc, GpuError> {
    if image == dims[1] * dims[2] * dims[3] {
        return tensor4(dims);
    }
    tensor4_strided(dims, [image, dims[2] * dims[3], dims[3], 1])
}

/// An f32 tensor descriptor of `[n, c, h, w]` stored channels last, its pixels `pixel`
/// elements apart (a slice of a channels-last concatenation of `pixel` channels);
/// [`tensor4_nhwc`] where that is dense.
pub(crate) fn tensor4_nhwc_pixels(dims: [usize; 4], pixel: usize) -> Result<TensorDesc, GpuError> {
    if pixel == dims[1] {
        return tensor4_nhwc(dims);
    }
    tensor4_strided(dims, [dims[2] * dims[3] * pixel, 1, dims[3] * pixel, pixel])
}

/// An f32 tensor descriptor of `[n, c, h, w]` with these strides.
fn tensor4_strided(dims: [usize; 4], strides: [usize; 4]) -> Result<TensorDesc, GpuError> {
    let d = new_tensor()?;
    let strides = c_ints(
        strides,
        [
            "image stride",
            "channel stride",
            "row stride",
            "column stride",
        ],
    )?;
    let dims = c_ints(dims, ["n", "c", "h", "w"])?;
    // SAFETY: a fresh descriptor; dims and strides fit a C int.
    unsafe {
        dnn::set_tensor4d_descriptor_ex(
            d.0,
            dnn_sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            dims,
            strides,
        )
    }
    .map_err(|e| {
        GpuError::cudnn(
            format!("describing tensor {dims:?} with strides {strides:?}"),
            e,
        )
    })?;
    Ok(d)
}

impl FilterDesc {
    /// An f32 filter `[k, c, h, w]` in `format`.
    pub(crate) fn new(
        dims: [usize; 4],
        format: dnn_sys::cudnnTensorFormat_t,
    ) -> Result<FilterDesc, GpuError> {
        let d = FilterDesc(
            dnn::create_filter_descriptor()
                .map_err(|e| GpuError::cudnn("creating a filter descriptor", e))?,
        );
        let dims = c_ints(dims, ["oc", "c/groups", "kh", "kw"])?;
        // SAFETY: a fresh descriptor; dims fit a C int.
        unsafe {
            dnn::set_filter4d_descriptor(
                d.0,
                dnn_sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
                format,
                dims,
            )
        }
        .map_err(|e| GpuError::cudnn("describing the filter", e))?;
        Ok(d)
    }
}

impl ConvDesc {
    /// A cross-correlation with f32 accumulation.
    pub(crate) fn new(
        padding: [usize; 2],
        stride: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Result<ConvDesc, GpuError> {
        let d = ConvDesc(
            dnn::create_convolution_descriptor()
                .map_err(|e| GpuError::cudnn("creating a convolution descriptor", e))?,
        );
        // SAFETY: a fresh descriptor; every value fits a C int.
        unsafe {
            dnn::set_convolution2d_descriptor(
                d.0,
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
            dnn::set_convolution_group_count(d.0, c_int(groups, "groups")?)
                .map_err(|e| GpuError::cudnn("setting the group count", e))?;
        }
        Ok(d)
    }

    /// Set the math type (TF32 tensor ops allowed or not).
    pub(crate) fn set_math(&self, math: dnn_sys::cudnnMathType_t) -> Result<(), GpuError> {
        // SAFETY: a live descriptor.
        unsafe { dnn::set_convolution_math_type(self.0, math) }
            .map_err(|e| GpuError::cudnn("setting the math type", e))
    }
}

impl ActDesc {
    /// ReLU (for the fused convolution).
    pub(crate) fn relu() -> Result<ActDesc, GpuError> {
        Self::new(dnn_sys::cudnnActivationMode_t::CUDNN_ACTIVATION_RELU)
    }

    /// No activation (the fused convolution adding a bias alone).
    pub(crate) fn identity() -> Result<ActDesc, GpuError> {
        Self::new(dnn_sys::cudnnActivationMode_t::CUDNN_ACTIVATION_IDENTITY)
    }

    fn new(mode: dnn_sys::cudnnActivationMode_t) -> Result<ActDesc, GpuError> {
        let a = dnn::create_activation_descriptor()
            .map_err(|e| GpuError::cudnn("creating an activation descriptor", e))?;
        let d = ActDesc(a);
        // SAFETY: a fresh descriptor.
        unsafe {
            dnn::set_activation_descriptor(
                d.0,
                mode,
                dnn_sys::cudnnNanPropagation_t::CUDNN_NOT_PROPAGATE_NAN,
                0.0,
            )
        }
        .map_err(|e| GpuError::cudnn("describing an activation", e))?;
        Ok(d)
    }
}

/// The legacy algorithms that `cudnnFindConvolutionForwardAlgorithmEx` finds working for these
/// descriptors within `limit` bytes of workspace (of the 8 it ranks first), each with its time
/// as cuDNN measured it, its math type and its workspace. The search writes `y`.
///
/// # Safety
/// The descriptors describe the buffers at `x`, `w` and `y`, `ws` holds `limit` bytes, and the
/// handle's stream belongs to the current context.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn find_forward(
    handle: dnn_sys::cudnnHandle_t,
    x_desc: &TensorDesc,
    x: u64,
    w_desc: &FilterDesc,
    w: u64,
    conv: &ConvDesc,
    y_desc: &TensorDesc,
    y: u64,
    ws: u64,
    limit: usize,
) -> Result<Vec<dnn_sys::cudnnConvolutionFwdAlgoPerf_t>, GpuError> {
    const N: usize = 8;
    let mut count = 0i32;
    // SAFETY: zeroed plain-old-data structs the call fills in.
    let mut perf: [dnn_sys::cudnnConvolutionFwdAlgoPerf_t; N] = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's contract; `perf` has room for N results.
    unsafe {
        dnn_sys::cudnnFindConvolutionForwardAlgorithmEx(
            handle,
            x_desc.0,
            x as *const std::ffi::c_void,
            w_desc.0,
            w as *const std::ffi::c_void,
            conv.0,
            y_desc.0,
            y as *mut std::ffi::c_void,
            N as i32,
            &mut count,
            perf.as_mut_ptr(),
            ws as *mut std::ffi::c_void,
            limit,
        )
    }
    .result()
    .map_err(|e| GpuError::cudnn("searching a convolution algorithm", e))?;
    Ok(perf
        .iter()
        .take(count.max(0) as usize)
        .filter(|p| p.status == dnn_sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS && p.memory <= limit)
        .copied()
        .collect())
}
