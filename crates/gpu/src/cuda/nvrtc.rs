//! NVRTC kernel sources (compiled once per device when a program is prepared).
//!
//! Every kernel is a grid-stride loop over 64-bit indices, so any launch size covers any
//! tensor. Activation codes: 0 none, 1 relu, 2 sigmoid, 3 tanh, 4 gelu (erf form).

use opsched_graph::Activation;

/// The CUDA C++ source of all NVRTC kernels.
pub const SOURCE: &str = r#"
typedef long long i64;

struct Dims6 { i64 d[6]; };

__device__ __forceinline__ float act_f(float x, int a) {
    switch (a) {
    case 1: return fmaxf(x, 0.0f);
    case 2: return 1.0f / (1.0f + expf(-x));
    case 3: return tanhf(x);
    case 4: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    default: return x;
    }
}

#define GRID_STRIDE(t, total) \
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < (total); \
         t += (i64)blockDim.x * gridDim.x)

extern "C" __global__ void slab_copy(float* dst, const float* src, i64 outer, i64 src_axis,
                                     i64 src_off, i64 dst_axis, i64 dst_off, i64 len,
                                     i64 inner, int accumulate) {
    i64 total = outer * len * inner;
    GRID_STRIDE(t, total) {
        i64 i = t % inner;
        i64 r = t / inner;
        i64 a = r % len;
        i64 o = r / len;
        float v = src[(o * src_axis + src_off + a) * inner + i];
        i64 d = (o * dst_axis + dst_off + a) * inner + i;
        if (accumulate) dst[d] += v; else dst[d] = v;
    }
}

extern "C" __global__ void bias_act(float* y, const float* bias, i64 total, i64 channels,
                                    i64 inner, int act) {
    GRID_STRIDE(t, total) {
        float v = y[t];
        if (bias) v += bias[(t / inner) % channels];
        y[t] = act_f(v, act);
    }
}

extern "C" __global__ void act_kernel(float* y, const float* x, i64 n, int act) {
    GRID_STRIDE(t, n) { y[t] = act_f(x[t], act); }
}

extern "C" __global__ void pool2d(float* y, const float* x, i64 nc, int h, int w, int oh,
                                  int ow, int kh, int kw, int sh, int sw, int ph, int pw,
                                  int is_max) {
    i64 total = nc * oh * ow;
    GRID_STRIDE(t, total) {
        int j = (int)(t % ow);
        int i = (int)((t / ow) % oh);
        i64 bc = t / ((i64)oh * ow);
        int hs = i * sh - ph, ws = j * sw - pw;
        int he = min(hs + kh, h + ph), we = min(ws + kw, w + pw);
        int size = (he - hs) * (we - ws);
        if (size < 1) size = 1;
        hs = max(hs, 0); ws = max(ws, 0); he = min(he, h); we = min(we, w);
        const float* xp = x + bc * h * w;
        float m = -__int_as_float(0x7f800000), s = 0.0f;
        for (int p = hs; p < he; ++p)
            for (int q = ws; q < we; ++q) {
                float v = xp[p * w + q];
                m = fmaxf(m, v);
                s += v;
            }
        y[t] = is_max ? m : s / (float)size;
    }
}

extern "C" __global__ void elementwise(float* y, const float* const* srcs, int nsrc, i64 n,
                                       int is_mul) {
    GRID_STRIDE(t, n) {
        float acc = is_mul ? 1.0f : 0.0f;
        for (int k = 0; k < nsrc; ++k) {
            float v = srcs[k][t];
            acc = is_mul ? acc * v : acc + v;
        }
        y[t] = acc;
    }
}

// One block per row; blockDim.x must be a power of two <= 1024.
extern "C" __global__ void layer_norm(float* y, const float* x, const float* gamma,
                                      const float* beta, i64 rows, int dim, float eps) {
    __shared__ float red[1024];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * dim;
        float s = 0.0f;
        for (int d = threadIdx.x; d < dim; d += blockDim.x) s += xr[d];
        red[threadIdx.x] = s;
        __syncthreads();
        for (int k = blockDim.x / 2; k > 0; k >>= 1) {
            if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
            __syncthreads();
        }
        float mean = red[0] / dim;
        __syncthreads();
        float v = 0.0f;
        for (int d = threadIdx.x; d < dim; d += blockDim.x) {
            float c = xr[d] - mean;
            v += c * c;
        }
        red[threadIdx.x] = v;
        __syncthreads();
        for (int k = blockDim.x / 2; k > 0; k >>= 1) {
            if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
            __syncthreads();
        }
        float inv = rsqrtf(red[0] / dim + eps);
        __syncthreads();
        for (int d = threadIdx.x; d < dim; d += blockDim.x)
            y[r * dim + d] = (xr[d] - mean) * inv * gamma[d] + beta[d];
    }
}

// out_dims: the output shape; src_strides: for each output axis, the input stride of the
// input axis it comes from.
extern "C" __global__ void permute(float* y, const float* x, i64 total, int rank,
                                   Dims6 out_dims, Dims6 src_strides) {
    GRID_STRIDE(t, total) {
        i64 rem = t, src = 0;
        for (int d = rank - 1; d >= 0; --d) {
            i64 idx = rem % out_dims.d[d];
            rem /= out_dims.d[d];
            src += idx * src_strides.d[d];
        }
        y[t] = x[src];
    }
}

// Abstract operators: every block waits until `ns` nanoseconds have passed.
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
"#;

/// Kernel names in [`SOURCE`].
pub const NAMES: &[&str] = &[
    "slab_copy",
    "bias_act",
    "act_kernel",
    "pool2d",
    "elementwise",
    "layer_norm",
    "permute",
    "spin",
];

/// The most axes [`SOURCE`]'s `permute` handles.
pub const MAX_RANK: usize = 6;

/// The activation code the kernels use.
pub fn act_code(a: Activation) -> i32 {
    match a {
        Activation::None => 0,
        Activation::Relu => 1,
        Activation::Sigmoid => 2,
        Activation::Tanh => 3,
        Activation::Gelu => 4,
    }
}

/// Threads per block of the element-wise kernels.
pub const BLOCK: u32 = 256;

/// Blocks for a grid-stride loop over `n` elements (at least 1, at most 65 535 * 16).
pub fn blocks_for(n: usize) -> u32 {
    let b = n.div_ceil(BLOCK as usize).max(1);
    b.min(65_535 * 16) as u32
}

/// Block size for the layer-norm kernel: the smallest power of two >= `dim`, in [32, 1024].
pub fn layer_norm_block(dim: usize) -> u32 {
    (dim.next_power_of_two().clamp(32, 1024)) as u32
}

/// For `permute`: output dims and, per output axis, the input stride it reads with; `None`
/// when the rank exceeds [`MAX_RANK`].
pub fn permute_params(in_shape: &[usize], perm: &[usize]) -> Option<([i64; 6], [i64; 6])> {
    let r = in_shape.len();
    if r > MAX_RANK || perm.len() != r {
        return None;
    }
    let mut strides = vec![1i64; r];
    for i in (0..r.saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * in_shape[i + 1] as i64;
    }
    let mut dims = [1i64; 6];
    let mut src = [0i64; 6];
    for (d, &p) in perm.iter().enumerate() {
        dims[d] = *in_shape.get(p)? as i64;
        src[d] = strides[p];
    }
    Some((dims, src))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_kernel_name_is_in_the_source() {
        for n in NAMES {
            assert!(SOURCE.contains(&format!("void {n}(")), "kernel {n} missing");
        }
    }

    #[test]
    fn launch_sizes() {
        assert_eq!(blocks_for(0), 1);
        assert_eq!(blocks_for(256), 1);
        assert_eq!(blocks_for(257), 2);
        assert_eq!(blocks_for(usize::MAX / 2), 65_535 * 16);
        assert_eq!(layer_norm_block(1), 32);
        assert_eq!(layer_norm_block(768), 1024);
        assert_eq!(layer_norm_block(4096), 1024);
    }

    #[test]
    fn permute_params_match_the_cpu_transpose() {
        // [2, 3, 4] with perm [2, 0, 1]: output [4, 2, 3]; strides of input (12, 4, 1).
        let (dims, src) = permute_params(&[2, 3, 4], &[2, 0, 1]).unwrap();
        assert_eq!(&dims[..3], &[4, 2, 3]);
        assert_eq!(&src[..3], &[1, 12, 4]);
        // Emulate the kernel's index arithmetic and compare with the CPU transpose.
        let x: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let want = crate::reference::transpose(&x, &[2, 3, 4], &[2, 0, 1]);
        let got: Vec<f32> = (0..24i64)
            .map(|t| {
                let (mut rem, mut s) = (t, 0i64);
                for d in (0..3).rev() {
                    s += (rem % dims[d]) * src[d];
                    rem /= dims[d];
                }
                x[s as usize]
            })
            .collect();
        assert_eq!(got, want);
        assert!(permute_params(&[1; 7], &[0, 1, 2, 3, 4, 5, 6]).is_none());
    }
}
