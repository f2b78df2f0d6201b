//! NVRTC kernel sources (compiled once per device when a program is prepared).
//!
//! Every kernel is a grid-stride loop over 64-bit indices, so any launch size covers any
//! tensor; the ones that divide indices per element (copies, bias + activation, pooling,
//! depthwise convolution) switch to 32-bit indices where every index of the launch fits, since
//! a GPU emulates 64-bit division (`FITS32`). Activations are a code and two parameters
//! ([`act_params`], from [`Activation::code`]): 0 none, 1 relu, 2 sigmoid, 3 tanh, 4 gelu (erf form), 5 gelu (tanh
//! form), 6 clip(p0, p1), 7 leaky relu(p0), 8 hard sigmoid(p0, p1), 9 hard swish, 10
//! swish(p0) (SiLU where p0 is 1), 11 softplus, 12 mish, 13 sqrt, 14 reciprocal, 15 exp, 16
//! log, 17 neg, 18 abs, 19 erf, 20 sin, 21 cos, 22 elu(p0), 23 selu(p0, p1), 24 celu(p0), 25
//! thresholded relu(p0), 26 softsign, 27 sign, 28 floor, 29 ceil, 30 round (halves to even),
//! 31 is NaN, 32 is an infinity (p0 negative ones, p1 positive ones: 1 or 0);
//! each is the CPU kernel's formula ([`crate::reference::act`]), checked on the host
//! (`host_check`).

use opsched_graph::Activation;

/// The CUDA C++ source of all NVRTC kernels.
pub const SOURCE: &str = r#"
typedef long long i64;

struct Dims6 { i64 d[6]; };

__device__ __forceinline__ float softplus_f(float x) {
    return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
}

__device__ __forceinline__ float act_f(float x, int a, float p0, float p1) {
    switch (a) {
    case 1: return fmaxf(x, 0.0f);
    case 2: return 1.0f / (1.0f + expf(-x));
    case 3: return tanhf(x);
    case 4: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case 5: return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case 6: return fminf(fmaxf(x, p0), p1);
    case 7: return x >= 0.0f ? x : p0 * x;
    case 8: return x != x ? x : fminf(fmaxf(p0 * x + p1, 0.0f), 1.0f);  // NaN stays, as the CPU's clamp
    case 9: return x * fminf(fmaxf(x / 6.0f + 0.5f, 0.0f), 1.0f);
    case 10: return x / (1.0f + expf(-p0 * x));
    case 11: return softplus_f(x);
    case 12: return x * tanhf(softplus_f(x));
    case 13: return sqrtf(x);
    case 14: return 1.0f / x;
    case 15: return expf(x);
    case 16: return logf(x);
    case 17: return -x;
    case 18: return fabsf(x);
    case 19: return erff(x);
    case 20: return sinf(x);
    case 21: return cosf(x);
    case 22: return x >= 0.0f ? x : p0 * expm1f(x);
    case 23: return x > 0.0f ? p1 * x : p1 * (p0 * expm1f(x));
    case 24: return fmaxf(x, 0.0f) + fminf(p0 * expm1f(x / p0), 0.0f);
    case 25: return x > p0 ? x : 0.0f;
    case 26: return x / (1.0f + fabsf(x));
    case 27: return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : x == 0.0f ? 0.0f : x;
    case 28: return floorf(x);
    case 29: return ceilf(x);
    case 30: return rintf(x);
    case 31: return x != x ? 1.0f : 0.0f;
    case 32: return isinf(x) && (x > 0.0f ? p1 != 0.0f : p0 != 0.0f) ? 1.0f : 0.0f;
    default: return x;
    }
}

// act_f where a kernel applies it to several values a thread (the depthwise kernels, sums,
// poolings): none and relu, what those mostly end in, inline, the others a call, so that the
// module does not hold an inlined copy of every activation per value (with them inline the
// tiled depthwise kernels alone were 12 MB of PTX and NVRTC took half as long again).
__device__ __noinline__ float act_call(float x, int a, float p0, float p1) {
    return act_f(x, a, p0, p1);
}

__device__ __forceinline__ float act_lean(float x, int a, float p0, float p1) {
    return a == 0 ? x : a == 1 ? fmaxf(x, 0.0f) : act_call(x, a, p0, p1);
}

// step::broadcast's BinOp::code: the comparisons give 1 where they hold, else 0.
__device__ __forceinline__ float bin_f(float x, float y, int op) {
    switch (op) {
    case 0: return x + y;
    case 1: return x * y;
    case 2: return x - y;
    case 3: return x / y;
    case 4: return powf(x, y);
    case 5: return fmaxf(x, y);
    case 7: return x == y ? 1.0f : 0.0f;
    case 8: return x < y ? 1.0f : 0.0f;
    case 9: return x > y ? 1.0f : 0.0f;
    case 10: return x <= y ? 1.0f : 0.0f;
    case 11: return x >= y ? 1.0f : 0.0f;
    case 13: return x;
    case 14: return x != y ? 1.0f : 0.0f;
    default: return fminf(x, y);
    }
}

#define GRID_STRIDE(t, total) GRID_STRIDE_T(i64, t, total)
#define GRID_STRIDE_T(I, t, total) \
    for (I t = (I)blockIdx.x * blockDim.x + threadIdx.x; t < (total); \
         t += (I)blockDim.x * gridDim.x)

// Whether every index a launch computes fits 32 bits (then the kernel divides on 32 bits:
// a 64-bit division is emulated, several times slower, and these kernels divide per element).
// A grid-stride step is below 2^28, so t + step stays below 2^32.
#define FITS32(n) ((n) <= 0x7fffffffLL)

// CV consecutive floats at p, kept in v: one 16- or 8-byte access where CV is 4 or 2 (the
// caller checked the alignment), else CV of 4 bytes. The vectorized kernels' loads and stores
// (CV channels of one pixel channels last, or CV elements of a sum).
template <int CV>
__device__ __forceinline__ void load_cv(const float* p, float* v) {
    if constexpr (CV == 4) {
        const float4 f = *reinterpret_cast<const float4*>(p);
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else if constexpr (CV == 2) {
        const float2 f = *reinterpret_cast<const float2*>(p);
        v[0] = f.x, v[1] = f.y;
    } else {
#pragma unroll
        for (int k = 0; k < CV; ++k) v[k] = p[k];
    }
}

template <int CV>
__device__ __forceinline__ void store_cv(float* p, const float* v) {
    if constexpr (CV == 4) {
        *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    } else if constexpr (CV == 2) {
        *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
    } else {
#pragma unroll
        for (int k = 0; k < CV; ++k) p[k] = v[k];
    }
}

// The vectorized kernels' own check of the width the host chose (cuda::vector_width): `bits`
// ORs every pointer they access CV floats at and every count (stride, run, length) times 4
// bytes; the widest of cv, cv / 2, ..., 1 whose accesses are all aligned.
__device__ __forceinline__ int fit_cv(int cv, unsigned long long bits) {
    while (cv > 1 && (bits & (unsigned long long)(4 * cv - 1))) cv /= 2;
    return cv;
}

__device__ __forceinline__ unsigned long long ptr_bits(const float* const* p, int n) {
    unsigned long long bits = 0;
    for (int k = 0; k < n; ++k) bits |= (unsigned long long)p[k];
    return bits;
}

// fn<I, V>(args...) for V = cv (4 or 2; else 1): the vectorized kernels' dispatch on the width
// fit_cv allows.
#define AT_WIDTH(cv, fn, I, ...)                  \
    switch (cv) {                                 \
    case 4: fn<I, 4>(__VA_ARGS__); break;         \
    case 2: fn<I, 2>(__VA_ARGS__); break;         \
    default: fn<I, 1>(__VA_ARGS__);               \
    }

// Where element t of a `[n, c, rows, cols]` tensor lies (its channel, row, column and image),
// NCHW or channels last (NHWC: channels vary fastest): an output of the depthwise convolution or
// a resize, or for the tiled depthwise kernel a group of a row's outputs.
template <typename I, bool NHWC>
__device__ __forceinline__ void element_at(I t, int c, int rows, int cols, int& ch, int& i,
                                           int& j, I& image) {
    if (NHWC) {
        ch = (int)(t % c);
        const I pixel = t / c;
        j = (int)(pixel % cols);
        i = (int)((pixel / cols) % rows);
        image = pixel / ((I)rows * cols);
    } else {
        j = (int)(t % cols);
        i = (int)((t / cols) % rows);
        const I plane = t / ((I)rows * cols);
        ch = (int)(plane % c);
        image = plane / c;
    }
}


template <typename I>
__device__ __forceinline__ void slab_copy_t(float* dst, const float* src, I outer, I src_axis,
                                            I src_off, I dst_axis, I dst_off, I len, I inner,
                                            int accumulate) {
    I total = outer * len * inner;
    GRID_STRIDE_T(I, t, total) {
        I i = t % inner;
        I r = t / inner;
        I a = r % len;
        I o = r / len;
        float v = src[(o * src_axis + src_off + a) * inner + i];
        I d = (o * dst_axis + dst_off + a) * inner + i;
        if (accumulate) dst[d] += v; else dst[d] = v;
    }
}

extern "C" __global__ void slab_copy(float* dst, const float* src, i64 outer, i64 src_axis,
                                     i64 src_off, i64 dst_axis, i64 dst_off, i64 len,
                                     i64 inner, int accumulate) {
    if (FITS32(outer * len * inner) && FITS32(outer * src_axis * inner) &&
        FITS32(outer * dst_axis * inner))
        slab_copy_t<unsigned>(dst, src, outer, src_axis, src_off, dst_axis, dst_off, len,
                              inner, accumulate);
    else
        slab_copy_t<i64>(dst, src, outer, src_axis, src_off, dst_axis, dst_off, len, inner,
                         accumulate);
}

// Where element t of a tensor is: dense, or in runs of `run` elements `stride` apart (a
// strided view: an operator's slice of a concatenation at batch > 1).
template <typename I> struct Dense {
    __device__ __forceinline__ I operator()(I t) const { return t; }
};
template <typename I> struct Runs {
    I run, stride;
    __device__ __forceinline__ I operator()(I t) const { return (t / run) * stride + t % run; }
};

template <typename I, typename At = Dense<I> >
__device__ __forceinline__ void bias_act_t(float* y, const float* bias, const float* residual,
                                           I total, I channels, I inner, int act, float p0,
                                           float p1, At at = At()) {
    GRID_STRIDE_T(I, t, total) {
        I yt = at(t);
        float v = y[yt];
        if (bias) v += bias[(t / inner) % channels];
        if (residual) v += residual[t];
        y[yt] = act_f(v, act, p0, p1);
    }
}

extern "C" __global__ void bias_act(float* y, const float* bias, const float* residual,
                                    i64 total, i64 channels, i64 inner, int act, float p0,
                                    float p1) {
    if (FITS32(total))
        bias_act_t<unsigned>(y, bias, residual, total, channels, inner, act, p0, p1);
    else
        bias_act_t<i64>(y, bias, residual, total, channels, inner, act, p0, p1);
}

// bias_act four elements at a time (16-byte loads and stores: the GEMM epilogue's bias + GELU
// of a Transformer's FFN is memory-bound), where y is dense and its total a multiple of 4, and
// four consecutive elements share a bias (inner % 4 == 0) or read four consecutive ones
// (inner == 1, channels % 4 == 0); y, bias and the residual 16-byte aligned. The same sums in
// the same order as bias_act.
template <typename I>
__device__ __forceinline__ void bias_act_vec4_t(float* y, const float* bias,
                                                const float* residual, I total, I channels,
                                                I inner, int act, float p0, float p1) {
    float4* y4 = reinterpret_cast<float4*>(y);
    GRID_STRIDE_T(I, q, total / 4) {
        float4 v = y4[q];
        I t = q * 4;
        if (bias) {
            float4 b;
            if (inner == 1) {
                b = reinterpret_cast<const float4*>(bias)[(t % channels) / 4];
            } else {
                float c = bias[(t / inner) % channels];
                b = make_float4(c, c, c, c);
            }
            v.x += b.x; v.y += b.y; v.z += b.z; v.w += b.w;
        }
        if (residual) {
            float4 r = reinterpret_cast<const float4*>(residual)[q];
            v.x += r.x; v.y += r.y; v.z += r.z; v.w += r.w;
        }
        v.x = act_f(v.x, act, p0, p1);
        v.y = act_f(v.y, act, p0, p1);
        v.z = act_f(v.z, act, p0, p1);
        v.w = act_f(v.w, act, p0, p1);
        y4[q] = v;
    }
}

extern "C" __global__ void bias_act_vec4(float* y, const float* bias, const float* residual,
                                         i64 total, i64 channels, i64 inner, int act, float p0,
                                         float p1) {
    if (FITS32(total))
        bias_act_vec4_t<unsigned>(y, bias, residual, total, channels, inner, act, p0, p1);
    else
        bias_act_vec4_t<i64>(y, bias, residual, total, channels, inner, act, p0, p1);
}

// bias_act on a strided y (the residual, if any, is dense): a convolution's output written
// into its slice of a concatenation. V elements a thread (4 or 2 where the run, its stride,
// the total, y and the residual allow V-float accesses: the host's `vec`, checked by fit_cv;
// the bias is read element by element), the same sums in the same order as bias_act_t.
template <typename I, int V>
__device__ __forceinline__ void bias_act_runs_t(float* y, const float* bias,
                                                const float* residual, I total, I channels,
                                                I inner, Runs<I> at, int act, float p0,
                                                float p1) {
    GRID_STRIDE_T(I, q, total / V) {
        const I t = q * V;
        float v[V], r[V];
        load_cv<V>(y + at(t), v);
        if (residual) load_cv<V>(residual + t, r);
#pragma unroll
        for (int u = 0; u < V; ++u) {
            if (bias) v[u] += bias[((t + u) / inner) % channels];
            if (residual) v[u] += r[u];
            v[u] = act_lean(v[u], act, p0, p1);
        }
        store_cv<V>(y + at(t), v);
    }
}

template <typename I>
__device__ __forceinline__ void bias_act_runs_vec(float* y, const float* bias,
                                                  const float* residual, I total, I channels,
                                                  I inner, Runs<I> at, int act, float p0,
                                                  float p1, int vec) {
    const int cv = fit_cv(vec, (unsigned long long)y | (unsigned long long)residual |
                                   (unsigned long long)(at.run | at.stride | total) * 4);
    AT_WIDTH(cv, bias_act_runs_t, I, y, bias, residual, total, channels, inner, at, act, p0,
             p1);
}

extern "C" __global__ void bias_act_runs(float* y, const float* bias, const float* residual,
                                         i64 total, i64 channels, i64 inner, i64 run,
                                         i64 stride, int act, float p0, float p1, int vec) {
    if (FITS32(total) && FITS32((total / run + 1) * stride)) {
        Runs<unsigned> at = {(unsigned)run, (unsigned)stride};
        bias_act_runs_vec<unsigned>(y, bias, residual, total, channels, inner, at, act, p0, p1,
                                    vec);
    } else {
        Runs<i64> at = {run, stride};
        bias_act_runs_vec<i64>(y, bias, residual, total, channels, inner, at, act, p0, p1, vec);
    }
}

extern "C" __global__ void act_kernel(float* y, const float* x, i64 n, int act, float p0,
                                      float p1) {
    GRID_STRIDE(t, n) { y[t] = act_f(x[t], act, p0, p1); }
}

// The window of pool2d's output pixel (i, j): rows [hs, he) and columns [ws, we) of the input,
// and what an average divides by. ph/pw pad before, eh/ew after; the average divides by the
// window clipped to the padded input (count_include_pad) or to the input.
struct PoolWin {
    int hs, he, ws, we, size;
};

__device__ __forceinline__ PoolWin pool_window(int i, int j, int h, int w, int kh, int kw,
                                               int sh, int sw, int ph, int pw, int eh, int ew,
                                               int count_pad) {
    int hs = i * sh - ph, ws = j * sw - pw;
    int he = min(hs + kh, h + eh), we = min(ws + kw, w + ew);
    int padded = (he - hs) * (we - ws);
    hs = max(hs, 0); ws = max(ws, 0); he = min(he, h); we = min(we, w);
    int size = count_pad ? padded : max(he - hs, 0) * max(we - ws, 0);
    PoolWin win = {hs, he, ws, we, size < 1 ? 1 : size};
    return win;
}

// What pooling x + b adds to pooling x per unit of a bias b per channel (a convolution's,
// left to the pooling: opsched_graph::fusion::deferred_bias): 1 for a max, the input elements'
// share of what the average divides by.
__device__ __forceinline__ float pool_share(PoolWin win, int is_max) {
    if (is_max) return 1.0f;
    return (float)(max(win.he - win.hs, 0) * max(win.we - win.ws, 0)) / (float)win.size;
}

// Pooling `win` of one input plane at xp (rows w elements wide, elements `step` apart: 1 in
// NCHW, the pixel stride channels last), plus the bias left to the pooling (`bias`, one per
// channel, or null) times its share: every pooling kernel's value of one output element, or
// with CV > 1 of CV consecutive channels of a pixel (channels last; xp and step aligned for
// load_cv), into out[0..CV).
template <typename I, int CV>
__device__ __forceinline__ void pool_values(const float* xp, PoolWin win, int w, I step,
                                            int is_max, const float* bias, int ch, float* out) {
    float m[CV], s[CV];
#pragma unroll
    for (int k = 0; k < CV; ++k) m[k] = -__int_as_float(0x7f800000), s[k] = 0.0f;
    for (int p = win.hs; p < win.he; ++p)
        for (int q = win.ws; q < win.we; ++q) {
            float v[CV];
            load_cv<CV>(xp + ((I)p * w + q) * step, v);
#pragma unroll
            for (int k = 0; k < CV; ++k) {
                m[k] = fmaxf(m[k], v[k]);
                s[k] += v[k];
            }
        }
#pragma unroll
    for (int k = 0; k < CV; ++k) {
        out[k] = is_max ? m[k] : s[k] / (float)win.size;
        if (bias) out[k] += bias[ch + k] * pool_share(win, is_max);
    }
}

template <typename I>
__device__ __forceinline__ float pool_value(const float* xp, PoolWin win, int w, I step,
                                            int is_max, const float* bias, int ch) {
    float v;
    pool_values<I, 1>(xp, win, w, step, is_max, bias, ch, &v);
    return v;
}

// x's images are `ximage` elements apart (c * h * w where dense; more where x is a strided
// view, one run per image: a merged convolution's member, a slice of a concatenation).
template <typename I, typename At = Dense<I> >
__device__ __forceinline__ void pool2d_t(float* y, const float* x, I nc, int c, I ximage, int h,
                                         int w, int oh, int ow, int kh, int kw, int sh, int sw,
                                         int ph, int pw, int eh, int ew, int count_pad,
                                         int is_max, const float* bias, At at = At()) {
    I total = nc * oh * ow;
    GRID_STRIDE_T(I, t, total) {
        int j = (int)(t % ow);
        int i = (int)((t / ow) % oh);
        I bc = t / ((I)oh * ow);
        PoolWin win = pool_window(i, j, h, w, kh, kw, sh, sw, ph, pw, eh, ew, count_pad);
        const float* xp = x + bc / c * ximage + (bc % c) * h * w;
        y[at(t)] = pool_value<I>(xp, win, w, 1, is_max, bias, (int)(bc % c));
    }
}

extern "C" __global__ void pool2d(float* y, const float* x, i64 nc, int c, i64 ximage, int h,
                                  int w, int oh, int ow, int kh, int kw, int sh, int sw, int ph,
                                  int pw, int eh, int ew, int count_pad, int is_max,
                                  const float* bias) {
    if (FITS32(nc * oh * ow) && FITS32(nc / c * ximage))
        pool2d_t<unsigned>(y, x, nc, c, ximage, h, w, oh, ow, kh, kw, sh, sw, ph, pw, eh, ew,
                           count_pad, is_max, bias);
    else
        pool2d_t<i64>(y, x, nc, c, ximage, h, w, oh, ow, kh, kw, sh, sw, ph, pw, eh, ew,
                      count_pad, is_max, bias);
}

// pool2d into a strided y (a pooling branch's slice of a concatenation at batch > 1).
extern "C" __global__ void pool2d_runs(float* y, const float* x, i64 nc, int c, i64 ximage,
                                       int h, int w, int oh, int ow, int kh, int kw, int sh,
                                       int sw, int ph, int pw, int eh, int ew, int count_pad,
                                       int is_max, const float* bias, i64 run, i64 stride) {
    i64 total = nc * oh * ow;
    if (FITS32(total) && FITS32(nc / c * ximage) && FITS32((total / run + 1) * stride)) {
        Runs<unsigned> at = {(unsigned)run, (unsigned)stride};
        pool2d_t<unsigned>(y, x, nc, c, ximage, h, w, oh, ow, kh, kw, sh, sw, ph, pw, eh, ew,
                           count_pad, is_max, bias, at);
    } else {
        Runs<i64> at = {run, stride};
        pool2d_t<i64>(y, x, nc, c, ximage, h, w, oh, ow, kh, kw, sh, sw, ph, pw, eh, ew,
                      count_pad, is_max, bias, at);
    }
}

// pool2d over channels-last values: x is [n, h, w, c] with its pixels xpix elements apart,
// y [n, oh, ow, c] with its pixels ypix elements apart (c where dense; a merged convolution's
// member, a slice of a channels-last concatenation of that many channels); the same windows
// as pool2d. V consecutive channels a thread (4 or 2 where c, both pixel strides and both
// pointers allow V-float accesses: the host's `vec`, checked by fit_cv), the same sums.
template <typename I, int V>
__device__ __forceinline__ void pool2d_nhwc_t(float* y, const float* x, I n, int c, int h,
                                              int w, int oh, int ow, int kh, int kw, int sh,
                                              int sw, int ph, int pw, int eh, int ew,
                                              int count_pad, int is_max, const float* bias,
                                              I ypix, I xpix) {
    I total = n * oh * ow * c;
    GRID_STRIDE_T(I, q, total / V) {
        const I t = q * V;
        int ch = (int)(t % c);
        I pix = t / c;
        int j = (int)(pix % ow);
        int i = (int)((pix / ow) % oh);
        I b = pix / ((I)oh * ow);
        PoolWin win = pool_window(i, j, h, w, kh, kw, sh, sw, ph, pw, eh, ew, count_pad);
        const float* xp = x + b * h * w * xpix + ch;
        float v[V];
        pool_values<I, V>(xp, win, w, xpix, is_max, bias, ch, v);
        store_cv<V>(y + pix * ypix + ch, v);
    }
}

template <typename I>
__device__ __forceinline__ void pool2d_nhwc_vec(float* y, const float* x, i64 n, int c, int h,
                                                int w, int oh, int ow, int kh, int kw, int sh,
                                                int sw, int ph, int pw, int eh, int ew,
                                                int count_pad, int is_max, const float* bias,
                                                i64 ypix, i64 xpix, int vec) {
    const int cv = fit_cv(vec, (unsigned long long)y | (unsigned long long)x |
                                   (unsigned long long)(c | ypix | xpix) * 4);
    AT_WIDTH(cv, pool2d_nhwc_t, I, y, x, (I)n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, eh, ew,
             count_pad, is_max, bias, (I)ypix, (I)xpix);
}

extern "C" __global__ void pool2d_nhwc(float* y, const float* x, i64 n, int c, int h, int w,
                                       int oh, int ow, int kh, int kw, int sh, int sw, int ph,
                                       int pw, int eh, int ew, int count_pad, int is_max,
                                       const float* bias, i64 ypix, i64 xpix, int vec) {
    if (FITS32(n * oh * ow * ypix) && FITS32(n * h * w * xpix))
        pool2d_nhwc_vec<unsigned>(y, x, n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, eh, ew,
                                  count_pad, is_max, bias, ypix, xpix, vec);
    else
        pool2d_nhwc_vec<i64>(y, x, n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, eh, ew,
                             count_pad, is_max, bias, ypix, xpix, vec);
}

// The activation (act_f's code and parameters) is fused in: ResNet's add + relu is one kernel.
// `bias` (where not null) is added before it, element t's `bias[(t / inner) % channels]`: the
// biases of convolutions that left theirs to the sum (NASNet's branches). V elements a thread
// (1, 2 or 4; where V > 1, n, y's runs and their stride are multiples of V and every pointer
// but the bias's 4V-byte aligned): one source pointer load and one y index for V elements,
// 8- or 16-byte accesses; the same sums in the same order as V = 1.
template <typename I, int V, typename At>
__device__ __forceinline__ void elementwise_t(float* y, const float* const* srcs, int nsrc,
                                              I n, int is_mul, int act, float p0, float p1,
                                              At at, const float* bias, I channels, I inner) {
    GRID_STRIDE_T(I, q, n / V) {
        const I t = q * V;
        float acc[V];
#pragma unroll
        for (int u = 0; u < V; ++u) acc[u] = is_mul ? 1.0f : 0.0f;
        for (int k = 0; k < nsrc; ++k) {
            float v[V];
            load_cv<V>(srcs[k] + t, v);
#pragma unroll
            for (int u = 0; u < V; ++u) acc[u] = is_mul ? acc[u] * v[u] : acc[u] + v[u];
        }
#pragma unroll
        for (int u = 0; u < V; ++u) {
            if (bias) acc[u] += bias[((t + u) / inner) % channels];
            acc[u] = act_lean(acc[u], act, p0, p1);
        }
        store_cv<V>(y + at(t), acc);
    }
}

// elementwise_t at the widest of `vec` (the host's choice), 2 and 1 that fits (fit_cv).
template <typename I, typename At>
__device__ __forceinline__ void elementwise_vec(float* y, const float* const* srcs, int nsrc,
                                                I n, int is_mul, int act, float p0, float p1,
                                                At at, const float* bias, I channels, I inner,
                                                unsigned long long bits, int vec) {
    const int cv = fit_cv(vec, bits | ptr_bits(srcs, nsrc) | (unsigned long long)y |
                                   (unsigned long long)n * 4);
    AT_WIDTH(cv, elementwise_t, I, y, srcs, nsrc, n, is_mul, act, p0, p1, at, bias, channels,
             inner);
}

extern "C" __global__ void elementwise(float* y, const float* const* srcs, int nsrc, i64 n,
                                       int is_mul, int act, float p0, float p1,
                                       const float* bias, i64 channels, i64 inner, int vec) {
    if (FITS32(n))
        elementwise_vec<unsigned>(y, srcs, nsrc, n, is_mul, act, p0, p1, Dense<unsigned>(),
                                  bias, channels, inner, 0, vec);
    else
        elementwise_vec<i64>(y, srcs, nsrc, n, is_mul, act, p0, p1, Dense<i64>(), bias,
                             channels, inner, 0, vec);
}

// elementwise into a strided y (a sum's slice of a concatenation: channels last each pixel's
// channels are a run, in NCHW at batch > 1 each image's).
extern "C" __global__ void elementwise_runs(float* y, const float* const* srcs, int nsrc,
                                            i64 n, i64 run, i64 stride, int is_mul, int act,
                                            float p0, float p1, const float* bias, i64 channels,
                                            i64 inner, int vec) {
    const unsigned long long bits = (unsigned long long)(run | stride) * 4;
    if (FITS32(n) && FITS32((n / run + 1) * stride)) {
        Runs<unsigned> at = {(unsigned)run, (unsigned)stride};
        elementwise_vec<unsigned>(y, srcs, nsrc, n, is_mul, act, p0, p1, at, bias, channels,
                                  inner, bits, vec);
    } else {
        Runs<i64> at = {run, stride};
        elementwise_vec<i64>(y, srcs, nsrc, n, is_mul, act, p0, p1, at, bias, channels, inner,
                             bits, vec);
    }
}

// elementwise where sources may be strided views too (a sum reading a merged convolution's
// member at batch > 1, one run per image): source k's element t is at
// (t / run) * stride + t % run for its (run, stride) = views[2k], views[2k + 1], a run of 0
// being dense; y likewise with (y_run, y_stride).
__device__ __forceinline__ i64 view_at(i64 t, i64 run, i64 stride) {
    return run ? (t / run) * stride + t % run : t;
}

extern "C" __global__ void elementwise_views(float* y, const float* const* srcs,
                                             const i64* views, int nsrc, i64 n, i64 y_run,
                                             i64 y_stride, int is_mul, int act, float p0,
                                             float p1, const float* bias, i64 channels,
                                             i64 inner) {
    GRID_STRIDE(t, n) {
        float acc = is_mul ? 1.0f : 0.0f;
        for (int k = 0; k < nsrc; ++k) {
            float v = srcs[k][view_at(t, views[2 * k], views[2 * k + 1])];
            acc = is_mul ? acc * v : acc + v;
        }
        if (bias) acc += bias[(t / inner) % channels];
        y[view_at(t, y_run, y_stride)] = act_f(acc, act, p0, p1);
    }
}

// The add kernel of a sum that pools the poolings it adds (opsched_graph::fusion::
// pool_into_sum): y = act(pool(x_0) + ... + pool(x_{npool-1}) + add_0 + ... + bias), every x
// pooled with pool2d's windows, in NCHW or channels last (`nhwc`), each pooling adding the
// bias left to it as pool2d does (b_k * pool_share). `ptrs` holds the npool inputs, the nadd
// values added, then each input's bias (null where it has none); `meta` each input's image
// stride (NCHW) or pixel stride (channels last), then each added value's run and stride (0, 0
// where dense: element t at (t / run) * stride + t % run); y's element t (in its layout's
// order) is written there for (y_run, y_stride). `narrow`: every index fits 32 bits (the host
// checked each buffer's extent). Channels last, V consecutive channels of a pixel a thread
// (V = 4 or 2 where the channels, every stride and run and every input, value and y pointer
// allow V-float accesses: the host's `vec`, checked by fit_cv): the window's positions and
// every index computed once for V outputs; the same sums in the same order as V = 1.
template <typename I>
__device__ __forceinline__ I view_at_t(I t, I run, I stride) {
    return run ? (t / run) * stride + t % run : t;
}

template <typename I, int V>
__device__ __forceinline__ void pool2d_sum_t(float* y, I y_run, I y_stride,
                                             const float* const* ptrs, const i64* meta,
                                             int npool, int nadd, I n, int c, int nhwc, int h,
                                             int w, int oh, int ow, int kh, int kw, int sh,
                                             int sw, int ph, int pw, int eh, int ew,
                                             int count_pad, int is_max, int act, float p0,
                                             float p1, const float* bias, I channels,
                                             I inner) {
    I total = n * c * oh * ow;
    GRID_STRIDE_T(I, q, total / V) {
        const I t = q * V;
        int ch, i, j;
        I b;
        if (nhwc)
            element_at<I, true>(t, c, oh, ow, ch, i, j, b);
        else
            element_at<I, false>(t, c, oh, ow, ch, i, j, b);
        PoolWin win = pool_window(i, j, h, w, kh, kw, sh, sw, ph, pw, eh, ew, count_pad);
        float acc[V], v[V];
#pragma unroll
        for (int u = 0; u < V; ++u) acc[u] = 0.0f;
        for (int k = 0; k < npool; ++k) {
            I s = (I)meta[k];
            const float* xp = nhwc ? ptrs[k] + b * h * w * s + ch
                                   : ptrs[k] + b * s + (I)ch * h * w;
            I step = nhwc ? s : 1;
            pool_values<I, V>(xp, win, w, step, is_max, ptrs[npool + nadd + k], ch, v);
#pragma unroll
            for (int u = 0; u < V; ++u) acc[u] += v[u];
        }
        for (int k = 0; k < nadd; ++k) {
            const i64* m = meta + npool + 2 * k;
            load_cv<V>(ptrs[npool + k] + view_at_t<I>(t, (I)m[0], (I)m[1]), v);
#pragma unroll
            for (int u = 0; u < V; ++u) acc[u] += v[u];
        }
#pragma unroll
        for (int u = 0; u < V; ++u) {
            if (bias) acc[u] += bias[((t + u) / inner) % channels];
            acc[u] = act_lean(acc[u], act, p0, p1);
        }
        store_cv<V>(y + view_at_t<I>(t, y_run, y_stride), acc);
    }
}

template <typename I>
__device__ __forceinline__ void pool2d_sum_vec(float* y, i64 y_run, i64 y_stride,
                                               const float* const* ptrs, const i64* meta,
                                               int npool, int nadd, i64 n, int c, int nhwc,
                                               int h, int w, int oh, int ow, int kh, int kw,
                                               int sh, int sw, int ph, int pw, int eh, int ew,
                                               int count_pad, int is_max, int act, float p0,
                                               float p1, const float* bias, i64 channels,
                                               i64 inner, int vec) {
    unsigned long long bits = ptr_bits(ptrs, npool + nadd) | (unsigned long long)y |
                              (unsigned long long)(c | y_run | y_stride) * 4;
    for (int k = 0; k < npool + 2 * nadd; ++k) bits |= (unsigned long long)meta[k] * 4;
    AT_WIDTH(nhwc ? fit_cv(vec, bits) : 1, pool2d_sum_t, I, y, (I)y_run, (I)y_stride, ptrs,
             meta, npool, nadd, (I)n, c, nhwc, h, w, oh, ow, kh, kw, sh, sw, ph, pw, eh, ew,
             count_pad, is_max, act, p0, p1, bias, (I)channels, (I)inner);
}

extern "C" __global__ void pool2d_sum(float* y, i64 y_run, i64 y_stride,
                                      const float* const* ptrs, const i64* meta, int npool,
                                      int nadd, i64 n, int c, int nhwc, int h, int w, int oh,
                                      int ow, int kh, int kw, int sh, int sw, int ph, int pw,
                                      int eh, int ew, int count_pad, int is_max, int act,
                                      float p0, float p1, const float* bias, i64 channels,
                                      i64 inner, int narrow, int vec) {
    if (narrow)
        pool2d_sum_vec<unsigned>(y, y_run, y_stride, ptrs, meta, npool, nadd, n, c, nhwc, h, w,
                                 oh, ow, kh, kw, sh, sw, ph, pw, eh, ew, count_pad, is_max, act,
                                 p0, p1, bias, channels, inner, vec);
    else
        pool2d_sum_vec<i64>(y, y_run, y_stride, ptrs, meta, npool, nadd, n, c, nhwc, h, w, oh,
                            ow, kh, kw, sh, sw, ph, pw, eh, ew, count_pad, is_max, act, p0, p1,
                            bias, channels, inner, vec);
}

// The sum of `v` over the block (every thread gets it): warp shuffles, then one value per warp
// through `red` (32 floats). blockDim.x must be a multiple of 32; every thread must call it.
__device__ __forceinline__ float block_sum(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();  // every warp has read `red` of the previous sum
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = lane < (int)(blockDim.x >> 5) ? red[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

// Softmax (log-softmax where `log`) of each contiguous row of `dim` elements, as the CPU
// kernel computes it (max, exponentials and their sum, then each exponential divided by the
// sum, or x - max - log(sum)): one warp per row, grid-stride over rows, warp-shuffle max and
// sum. A lane keeps SM_VPT values of its row in registers (rows up to 32 * SM_VPT are read
// once), reads the rest again. For short rows (attention scores: 128 per row in BERT) where
// cuDNN's channel softmax may spend a block per row; the step times both.
#define SM_VPT 8
extern "C" __global__ void softmax_rows(float* y, const float* x, i64 rows, int dim, int log) {
    const float inf = __int_as_float(0x7f800000);
    int lane = threadIdx.x & 31;
    i64 warps = ((i64)gridDim.x * blockDim.x) >> 5;
    for (i64 r = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += warps) {
        const float* xr = x + r * dim;
        float* yr = y + r * dim;
        float v[SM_VPT];
        float m = -inf;
#pragma unroll
        for (int k = 0; k < SM_VPT; ++k) {
            int d = lane + 32 * k;
            v[k] = d < dim ? xr[d] : -inf;
            m = fmaxf(m, v[k]);
        }
        for (int d = lane + 32 * SM_VPT; d < dim; d += 32) m = fmaxf(m, xr[d]);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < SM_VPT; ++k)
            if (lane + 32 * k < dim) s += expf(v[k] - m);
        for (int d = lane + 32 * SM_VPT; d < dim; d += 32) s += expf(xr[d] - m);
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        float ls = logf(s);
#pragma unroll
        for (int k = 0; k < SM_VPT; ++k) {
            int d = lane + 32 * k;
            if (d < dim) yr[d] = log ? v[k] - m - ls : expf(v[k] - m) / s;
        }
        for (int d = lane + 32 * SM_VPT; d < dim; d += 32)
            yr[d] = log ? xr[d] - m - ls : expf(xr[d] - m) / s;
    }
}

// One block per row (grid-stride over rows); blockDim.x a multiple of 32, <= 1024. Each
// thread keeps LN_VPT of the row's values in registers (layer_norm_block sizes the block so
// that the row fits: one read of x), the rest of a longer row is read again. Mean, then the
// mean of squared deviations (two passes, as the CPU kernel).
#define LN_VPT 4
extern "C" __global__ void layer_norm(float* y, const float* x, const float* gamma,
                                      const float* beta, i64 rows, int dim, float eps) {
    __shared__ float red[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * dim;
        float* yr = y + r * dim;
        float v[LN_VPT];
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < LN_VPT; ++k) {
            int d = threadIdx.x + k * blockDim.x;
            v[k] = d < dim ? xr[d] : 0.0f;
            s += v[k];
        }
        for (int d = threadIdx.x + LN_VPT * blockDim.x; d < dim; d += blockDim.x) s += xr[d];
        float mean = block_sum(s, red) / dim;
        float q = 0.0f;
#pragma unroll
        for (int k = 0; k < LN_VPT; ++k) {
            float c = v[k] - mean;
            if (threadIdx.x + k * blockDim.x < dim) q += c * c;
        }
        for (int d = threadIdx.x + LN_VPT * blockDim.x; d < dim; d += blockDim.x) {
            float c = xr[d] - mean;
            q += c * c;
        }
        float inv = rsqrtf(block_sum(q, red) / dim + eps);
#pragma unroll
        for (int k = 0; k < LN_VPT; ++k) {
            int d = threadIdx.x + k * blockDim.x;
            if (d < dim) yr[d] = (v[k] - mean) * inv * gamma[d] + beta[d];
        }
        for (int d = threadIdx.x + LN_VPT * blockDim.x; d < dim; d += blockDim.x)
            yr[d] = (xr[d] - mean) * inv * gamma[d] + beta[d];
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

// y = a op b with NumPy broadcasting: out_dims is the result's shape, sa/sb/sc each operand's
// stride per result axis (0 where it repeats). Op 12 (`Where`) is c != 0 ? a : b, the
// condition c broadcast likewise; c is null for the others.
extern "C" __global__ void broadcast(float* y, const float* a, const float* b, const float* c,
                                     i64 total, int rank, Dims6 out_dims, Dims6 sa, Dims6 sb,
                                     Dims6 sc, int op) {
    GRID_STRIDE(t, total) {
        i64 rem = t, ia = 0, ib = 0, ic = 0;
        for (int d = rank - 1; d >= 0; --d) {
            i64 idx = rem % out_dims.d[d];
            rem /= out_dims.d[d];
            ia += idx * sa.d[d];
            ib += idx * sb.d[d];
            ic += idx * sc.d[d];
        }
        y[t] = op == 12 ? (c[ic] != 0.0f ? a[ia] : b[ib]) : bin_f(a[ia], b[ib], op);
    }
}

// Constant padding: y (out_dims) is x (in_dims) shifted by `begin` on every axis, `value`
// around it.
// Reduction over the middle axis of [outer, red, inner] (step/reduce.rs): one output a thread,
// the elements in order from ReduceKind::start (kind 0 mean, 1 sum, 2 max, 3 min, 4 prod, 5 L1,
// 6 L2, 7 sum of squares, 8 log of the sum; 9-12 an index: the first or last largest or
// smallest element's; 13 log of the sum of exponentials, shifted by the largest), as the CPU.
extern "C" __global__ void reduce_mid(float* y, const float* x, i64 outer, i64 red, i64 inner,
                                      int kind) {
    GRID_STRIDE(t, outer * inner) {
        const i64 o = t / inner, i = t % inner;
        const float* p = x + o * red * inner + i;
        const float inf = __int_as_float(0x7f800000);
        if (kind == 13) {
            // log(sum(exp(x))) shifted by the largest element (ReduceKind::log_sum_exp).
            float m = -inf, sum = 0.0f;
            for (i64 r = 0; r < red; ++r) m = fmaxf(m, p[r * inner]);
            for (i64 r = 0; r < red; ++r) sum += expf(p[r * inner] - m);
            y[t] = isinf(m) ? m : m + logf(sum);
            continue;
        }
        if (kind >= 9) {
            // An index: the first (9 max, 10 min) or last (11, 12) best element's.
            const bool most = kind == 9 || kind == 11, last = kind >= 11;
            float best = most ? -inf : inf, at = 0.0f;
            for (i64 r = 0; r < red; ++r) {
                const float v = p[r * inner];
                const bool take = most ? (last ? v >= best : v > best) : (last ? v <= best : v < best);
                if (take) {
                    best = v;
                    at = (float)r;
                }
            }
            y[t] = at;
            continue;
        }
        float acc = kind == 2 ? -inf : kind == 3 ? inf : kind == 4 ? 1.0f : 0.0f;
        for (i64 r = 0; r < red; ++r) {
            const float v = p[r * inner];
            acc = kind == 2   ? fmaxf(acc, v)
                  : kind == 3 ? fminf(acc, v)
                  : kind == 4 ? acc * v
                  : kind == 5 ? acc + fabsf(v)
                  : kind >= 6 && kind <= 7 ? acc + v * v
                              : acc + v;
        }
        y[t] = kind == 0 ? acc / (float)red : kind == 6 ? sqrtf(acc) : kind == 8 ? logf(acc) : acc;
    }
}

// Table lookup (step/embedding.rs): element d of output row i is element d of the table's row
// that index idx[i] names (op::table_row: an integer in [-rows, rows), negative from the end),
// zero for any other index (the CPU refuses those).
extern "C" __global__ void embedding(float* y, const float* idx, const float* table, i64 total,
                                     i64 rows, int dim) {
    GRID_STRIDE(t, total) {
        const float v = idx[t / dim];
        const bool row = v == truncf(v) && v >= -(float)rows && v < (float)rows;
        const i64 r = row ? (i64)v + (v < 0.0f ? rows : 0) : 0;
        y[t] = row ? table[r * dim + t % dim] : 0.0f;
    }
}

// Running sums along the middle axis of [outer, n, inner] (step/cum_sum.rs): one (outer, inner)
// line a thread, added in the axis's order (from its end where `reverse`), each output the sum
// before (`exclusive`) or after its element, as the CPU.
extern "C" __global__ void cum_sum(float* y, const float* x, i64 outer, i64 n, i64 inner,
                                   int exclusive, int reverse) {
    GRID_STRIDE(t, outer * inner) {
        const i64 o = t / inner, i = t % inner;
        float sum = 0.0f;
        for (i64 s = 0; s < n; ++s) {
            const i64 at = (o * n + (reverse ? n - 1 - s : s)) * inner + i;
            const float v = x[at];
            if (exclusive) y[at] = sum;
            sum += v;
            if (!exclusive) y[at] = sum;
        }
    }
}

// Elements gathered along an axis (step/gather.rs): output t (of the indices' shape `dims`) is
// the data's element at t's coordinates but idx[t] along `axis` (an integer in [-n, n), a
// negative one from the end); zero where idx[t] is no such integer, as `embedding`.
extern "C" __global__ void gather_elements(float* y, const float* x, const float* idx, i64 total,
                                           int rank, int axis, i64 n, Dims6 dims,
                                           Dims6 strides) {
    GRID_STRIDE(t, total) {
        const float v = idx[t];
        const bool row = v == truncf(v) && v >= -(float)n && v < (float)n;
        const i64 r = row ? (i64)v + (v < 0.0f ? n : 0) : 0;
        i64 rem = t, src = 0;
        for (int d = rank - 1; d >= 0; --d) {
            const i64 c = rem % dims.d[d];
            rem /= dims.d[d];
            src += (d == axis ? r : c) * strides.d[d];
        }
        y[t] = row ? x[src] : 0.0f;
    }
}

// Resize of the spatial axes (step/resize.rs): output element (i, j) of a plane reads input
// rows rows[i] = (lo, hi) and columns cols[j], with weights alike; tables `index` and `weight`
// hold oh row pairs, then ow column pairs. Bilinear: the products of weights first, summed in
// Tap::blend's order (onnxruntime's); nearest: x[lo, lo] as it is.
template <typename I, bool NHWC>
__device__ __forceinline__ void resize2d_t(float* y, const float* x, I images, int c, int h,
                                           int w, int oh, int ow, const int* index,
                                           const float* weight, int linear) {
    const I total = images * c * oh * ow;
    GRID_STRIDE_T(I, t, total) {
        int ch, i, j;
        I image;
        element_at<I, NHWC>(t, c, oh, ow, ch, i, j, image);
        const int r0 = index[2 * i], r1 = index[2 * i + 1];
        const int c0 = index[2 * (oh + j)], c1 = index[2 * (oh + j) + 1];
        // Element (r, s) of this image and channel.
        const float* p = NHWC ? x + image * h * w * c + ch : x + (image * c + ch) * h * w;
        const int step = NHWC ? c : 1;
        const float x00 = p[((I)r0 * w + c0) * step];
        if (!linear) {
            y[t] = x00;
            continue;
        }
        const float x01 = p[((I)r0 * w + c1) * step], x10 = p[((I)r1 * w + c0) * step];
        const float x11 = p[((I)r1 * w + c1) * step];
        const float wr0 = weight[2 * i], wr1 = weight[2 * i + 1];
        const float wc0 = weight[2 * (oh + j)], wc1 = weight[2 * (oh + j) + 1];
        y[t] = wr0 * wc0 * x00 + wr0 * wc1 * x01 + wr1 * wc0 * x10 + wr1 * wc1 * x11;
    }
}

#define RESIZE_PARAMS                                                                       \
    float* y, const float* x, i64 images, int c, int h, int w, int oh, int ow,              \
        const int* index, const float* weight, int linear
#define RESIZE_ARGS y, x, images, c, h, w, oh, ow, index, weight, linear

template <bool NHWC>
__device__ __forceinline__ void resize2d_cases(RESIZE_PARAMS) {
    const i64 most = images * c * (i64)(h * (i64)w > oh * (i64)ow ? h * (i64)w : oh * (i64)ow);
    if (FITS32(most))
        resize2d_t<unsigned, NHWC>(y, x, (unsigned)images, c, h, w, oh, ow, index, weight,
                                   linear);
    else
        resize2d_t<i64, NHWC>(RESIZE_ARGS);
}

extern "C" __global__ void resize2d(RESIZE_PARAMS) { resize2d_cases<false>(RESIZE_ARGS); }

extern "C" __global__ void resize2d_nhwc(RESIZE_PARAMS) { resize2d_cases<true>(RESIZE_ARGS); }

extern "C" __global__ void pad(float* y, const float* x, i64 total, int rank, Dims6 out_dims,
                               Dims6 in_dims, Dims6 begin, float value) {
    GRID_STRIDE(t, total) {
        i64 rem = t, src = 0, stride = 1;
        bool inside = true;
        for (int d = rank - 1; d >= 0; --d) {
            i64 idx = rem % out_dims.d[d] - begin.d[d];
            rem /= out_dims.d[d];
            if (idx < 0 || idx >= in_dims.d[d]) inside = false;
            src += idx * stride;
            stride *= in_dims.d[d];
        }
        y[t] = inside ? x[src] : value;
    }
}

// Depthwise convolution (one group per channel, one output channel per group): one thread
// per output element. The `nmore` arrays of `more` (dense, as x) are added to every input
// element read (the values of a sum it reads), then `in_bias` (when not null: the bias a
// convolution before it left to it), then `pre` (act_f code and parameters) applies to it
// (padding stays zero); then the bias (when not null) and `act`. g: h, w, oh, ow, kh, kw, sh,
// sw, ph, pw (padding before), dh, dw. NCHW, or channels last (NHWC: x and y `[n, h, w, c]`,
// the weights `[kh, kw, c]`; channels fastest, so that a warp reads neighbouring channels of
// one pixel in one transaction, and their weights alike).
//
// The tap loop is the kernel's time, so what it does per tap is a template case: EXTRA (the
// summed inputs and input bias are read), PRE (the input activation: 0 none, 1 relu, -1
// act_f's switch) and KW (a kernel width the loop unrolls fully, as PyTorch's depthwise
// kernel does; 0: the width is g's). depthwise_conv runs KW = 0; depthwise_conv_unrolled
// unrolls widths 3, 5 and 7, and depthwise_conv_tiled computes several outputs a thread:
// which of the three runs a convolution is measured on the GPU (tuning's DEPTHWISE_KEY).
// NVRTC takes seconds for them all (0.58 s before these cases), once per machine: the PTX is
// kept (cuda/ptx_cache.rs). On an H100 (2026-11-27b), NASNet ran 1.26x slower once the loop
// read the extra inputs for every convolution; the kernel A/B times these cases against that
// loop's earlier form.
struct Geo12 { int v[12]; };

template <int PRE>
__device__ __forceinline__ float pre_f(float v, int pre, float q0, float q1) {
    return PRE == 0 ? v : PRE == 1 ? fmaxf(v, 0.0f) : act_f(v, pre, q0, q1);
}

template <typename I, bool NHWC, bool EXTRA, int PRE, int KW>
__device__ __forceinline__ void depthwise_conv_t(float* y, const float* x, const float* wt,
                                                 const float* bias, I nc, int c, I ximage,
                                                 int xpix, Geo12 g, int pre, float q0,
                                                 float q1, int act, float p0, float p1,
                                                 const float* in_bias,
                                                 const float* const* more, int nmore) {
    int h = g.v[0], w = g.v[1], oh = g.v[2], ow = g.v[3], kh = g.v[4];
    const int kw = KW ? KW : g.v[5];
    int sh = g.v[6], sw = g.v[7], ph = g.v[8], pw = g.v[9], dh = g.v[10], dw = g.v[11];
    I total = nc * oh * ow;
    // Neighbouring pixels of one channel of x are `step` elements apart, neighbouring taps of
    // its weights `wstep`.
    const int step = NHWC ? xpix : 1, wstep = NHWC ? c : 1;
    GRID_STRIDE_T(I, t, total) {
        int ch, i, j;
        I image;
        element_at<I, NHWC>(t, c, oh, ow, ch, i, j, image);
        const I xoff = image * ximage + (NHWC ? (I)ch : (I)ch * h * w);
        const float* xp = x + xoff;
        const float* wp = NHWC ? wt + ch : wt + (i64)ch * kh * kw;
        const float ib = EXTRA && in_bias ? in_bias[ch] : 0.0f;
        float acc = 0.0f;
        for (int p = 0; p < kh; ++p) {
            int r = i * sh - ph + p * dh;
            if (r < 0 || r >= h) continue;
#pragma unroll
            for (int q = 0; q < (KW ? KW : kw); ++q) {
                int s = j * sw - pw + q * dw;
                if (s < 0 || s >= w) continue;
                const I o = ((I)r * w + s) * step;
                float v = xp[o];
                if (EXTRA) {
                    for (int k = 0; k < nmore; ++k) v += more[k][xoff + o];
                    v += ib;
                }
                acc += pre_f<PRE>(v, pre, q0, q1) * wp[(p * kw + q) * wstep];
            }
        }
        if (bias) acc += bias[ch];
        y[t] = act_f(acc, act, p0, p1);
    }
}

// The parameters of the entry points and of every function that picks a case, and the
// arguments they pass on.
#define DEPTHWISE_PARAMS                                                                    \
    float* y, const float* x, const float* wt, const float* bias, i64 nc, int c, i64 ximage, \
        int xpix, Geo12 g, int pre, float q0, float q1, int act, float p0, float p1,         \
        const float* in_bias, const float* const* more, int nmore
#define DEPTHWISE_ARGS                                                                      \
    y, x, wt, bias, nc, c, ximage, xpix, g, pre, q0, q1, act, p0, p1, in_bias, more, nmore

// Whether every index of a depthwise convolution fits 32 bits (FITS32), so that the kernel
// may divide on 32 bits.
__device__ __forceinline__ bool depthwise_fits32(i64 nc, int c, i64 ximage, Geo12 g) {
    return FITS32(nc * g.v[2] * g.v[3]) && FITS32(nc / c * ximage);
}

// x's images are `ximage` elements apart (c * h * w where dense; more where x is a strided
// view: NCHW one run per image, channels last one run of channels per pixel, the pixels
// `xpix` elements apart). Any other input activation, or 64-bit indices: one general case,
// which reads the extra inputs where they are null too.
template <bool NHWC>
__device__ __forceinline__ void depthwise_cases(DEPTHWISE_PARAMS) {
    const bool small = depthwise_fits32(nc, c, ximage, g);
    const bool extra = in_bias != nullptr || nmore > 0;
    if (!small || pre > 1) {
        if (small)
            depthwise_conv_t<unsigned, NHWC, true, -1, 0>(DEPTHWISE_ARGS);
        else
            depthwise_conv_t<i64, NHWC, true, -1, 0>(DEPTHWISE_ARGS);
    } else if (extra && pre == 1) {
        depthwise_conv_t<unsigned, NHWC, true, 1, 0>(DEPTHWISE_ARGS);
    } else if (extra) {
        depthwise_conv_t<unsigned, NHWC, true, 0, 0>(DEPTHWISE_ARGS);
    } else if (pre == 1) {
        depthwise_conv_t<unsigned, NHWC, false, 1, 0>(DEPTHWISE_ARGS);
    } else {
        depthwise_conv_t<unsigned, NHWC, false, 0, 0>(DEPTHWISE_ARGS);
    }
}

// One entry point per layout (written out: the kernels are found by name).
extern "C" __global__ void depthwise_conv(DEPTHWISE_PARAMS) {
    depthwise_cases<false>(DEPTHWISE_ARGS);
}

extern "C" __global__ void depthwise_conv_nhwc(DEPTHWISE_PARAMS) {
    depthwise_cases<true>(DEPTHWISE_ARGS);
}

// The depthwise convolution with its kernel width unrolled (depthwise_conv_t's KW) for a
// relu before it, widths 3, 5 and 7, 32-bit indices; anything else as depthwise_conv runs it.
template <bool NHWC>
__device__ __forceinline__ void unrolled_cases(DEPTHWISE_PARAMS) {
    const bool small = depthwise_fits32(nc, c, ximage, g);
    const bool extra = in_bias != nullptr || nmore > 0;
    switch (small && pre == 1 ? g.v[5] * 2 + extra : 0) {
    case 6: depthwise_conv_t<unsigned, NHWC, false, 1, 3>(DEPTHWISE_ARGS); break;
    case 7: depthwise_conv_t<unsigned, NHWC, true, 1, 3>(DEPTHWISE_ARGS); break;
    case 10: depthwise_conv_t<unsigned, NHWC, false, 1, 5>(DEPTHWISE_ARGS); break;
    case 11: depthwise_conv_t<unsigned, NHWC, true, 1, 5>(DEPTHWISE_ARGS); break;
    case 14: depthwise_conv_t<unsigned, NHWC, false, 1, 7>(DEPTHWISE_ARGS); break;
    case 15: depthwise_conv_t<unsigned, NHWC, true, 1, 7>(DEPTHWISE_ARGS); break;
    default: depthwise_cases<NHWC>(DEPTHWISE_ARGS);
    }
}

extern "C" __global__ void depthwise_conv_unrolled(DEPTHWISE_PARAMS) {
    unrolled_cases<false>(DEPTHWISE_ARGS);
}

extern "C" __global__ void depthwise_conv_unrolled_nhwc(DEPTHWISE_PARAMS) {
    unrolled_cases<true>(DEPTHWISE_ARGS);
}

// The depthwise convolution tiled: V outputs of a row per thread (stride S, kernel width KW,
// no dilation along the width), each of CV consecutive channels (4 or 2 only channels last,
// every access 16 or 8 bytes): each input value of the row segment the V outputs read is loaded, given
// the input bias (EXTRA) and the input activation once, and kept in registers for every output
// that reads it (a 5x5 at stride 1 with V = 4 loads 8 values per kernel row instead of 20).
// Summed inputs are not among its cases: reading them here took the tiled entry points'
// registers from 106 to 138 by fours, 80 to 90 by twos, 80 to 89 by ones channels last (ptxas
// -v, sm_90; an entry point is allocated its costliest case's), so 1 resident block of 256
// threads per SM instead of 2 by fours, 2 instead of 3 by twos and ones, for every launch, for
// a fusion that is off by default (sum-into-depthwise).
// The sums run in depthwise_conv_t's order, so the outputs are equal. One thread per V x CV
// outputs: the host launches a grid for len / (V CV) (step::conv's `tiled_outputs`).
template <bool NHWC, bool EXTRA, int PRE, int KW, int S, int V, int CV>
__device__ __forceinline__ void tiled_depthwise_t(float* y, const float* x, const float* wt,
        const float* bias, unsigned nc, int c, unsigned ximage, int xpix, Geo12 g, int pre,
        float q0, float q1, int act, float p0, float p1, const float* in_bias,
        const float* const* more, int nmore) {
    static_assert(CV == 1 || NHWC, "channels of one pixel are adjacent channels last only");
    const int h = g.v[0], w = g.v[1], oh = g.v[2], ow = g.v[3], kh = g.v[4];
    const int sh = g.v[6], ph = g.v[8], pw = g.v[9], dh = g.v[10];
    const int owv = (ow + V - 1) / V;
    const unsigned total = nc / CV * oh * owv;
    const int step = NHWC ? xpix : 1, wstep = NHWC ? c : 1;
    constexpr int SPAN = (V - 1) * S + KW;
    GRID_STRIDE_T(unsigned, t, total) {
        int ch, i, jt;
        unsigned image;
        element_at<unsigned, NHWC>(t, c / CV, oh, owv, ch, i, jt, image);
        ch *= CV;
        const int j0 = jt * V;
        const unsigned xoff = image * ximage + (NHWC ? (unsigned)ch : (unsigned)ch * h * w);
        const float* xp = x + xoff;
        const float* wp = NHWC ? wt + ch : wt + (unsigned)ch * kh * KW;
        float ib[CV];
#pragma unroll
        for (int k = 0; k < CV; ++k) ib[k] = 0.0f;
        if (EXTRA && in_bias) load_cv<CV>(in_bias + ch, ib);
        float acc[V][CV];
#pragma unroll
        for (int v = 0; v < V; ++v)
#pragma unroll
            for (int k = 0; k < CV; ++k) acc[v][k] = 0.0f;
        const int s0 = j0 * S - pw;
        for (int p = 0; p < kh; ++p) {
            const int r = i * sh - ph + p * dh;
            if (r < 0 || r >= h) continue;
            float xv[SPAN][CV];
#pragma unroll
            for (int u = 0; u < SPAN; ++u) {
                const int s = s0 + u;
#pragma unroll
                for (int k = 0; k < CV; ++k) xv[u][k] = 0.0f;
                if (s >= 0 && s < w) {
                    const unsigned o = ((unsigned)r * w + s) * step;
                    load_cv<CV>(xp + o, xv[u]);
                    if (EXTRA) {
#pragma unroll
                        for (int k = 0; k < CV; ++k) xv[u][k] += ib[k];
                    }
#pragma unroll
                    for (int k = 0; k < CV; ++k) xv[u][k] = pre_f<PRE>(xv[u][k], pre, q0, q1);
                }
            }
#pragma unroll
            for (int q = 0; q < KW; ++q) {
                float wq[CV];
                load_cv<CV>(wp + (p * KW + q) * wstep, wq);
#pragma unroll
                for (int v = 0; v < V; ++v)
#pragma unroll
                    for (int k = 0; k < CV; ++k) acc[v][k] += xv[v * S + q][k] * wq[k];
            }
        }
        float b[CV];
#pragma unroll
        for (int k = 0; k < CV; ++k) b[k] = 0.0f;
        if (bias) load_cv<CV>(bias + ch, b);
#pragma unroll
        for (int v = 0; v < V; ++v) {
            const int j = j0 + v;
            if (j < ow) {
                float a[CV];
#pragma unroll
                for (int k = 0; k < CV; ++k) {
                    a[k] = acc[v][k];
                    if (bias) a[k] += b[k];
                    a[k] = act_lean(a[k], act, p0, p1);
                }
                const unsigned yt = NHWC ? ((image * oh + i) * ow + j) * c + ch
                                         : ((image * c + ch) * oh + i) * ow + j;
                store_cv<CV>(y + yt, a);
            }
        }
    }
}

// Outputs per thread: 4 at stride 1, 2 at stride 2.
template <bool NHWC, bool EXTRA, int KW, int S, int CV>
__device__ __forceinline__ void tiled_one(DEPTHWISE_PARAMS) {
    tiled_depthwise_t<NHWC, EXTRA, 1, KW, S, S == 1 ? 4 : 2, CV>(DEPTHWISE_ARGS);
}

template <bool NHWC, bool EXTRA, int CV>
__device__ __forceinline__ void tiled_width(DEPTHWISE_PARAMS) {
    switch (g.v[5] * 10 + g.v[7]) {
    case 31: tiled_one<NHWC, EXTRA, 3, 1, CV>(DEPTHWISE_ARGS); break;
    case 32: tiled_one<NHWC, EXTRA, 3, 2, CV>(DEPTHWISE_ARGS); break;
    case 51: tiled_one<NHWC, EXTRA, 5, 1, CV>(DEPTHWISE_ARGS); break;
    case 52: tiled_one<NHWC, EXTRA, 5, 2, CV>(DEPTHWISE_ARGS); break;
    case 71: tiled_one<NHWC, EXTRA, 7, 1, CV>(DEPTHWISE_ARGS); break;
    case 72: tiled_one<NHWC, EXTRA, 7, 2, CV>(DEPTHWISE_ARGS); break;
    default: depthwise_cases<NHWC>(DEPTHWISE_ARGS);
    }
}

// Whether CV channels of a pixel are one aligned access everywhere the tiled kernel reads or
// writes them: channels, strides and every pointer multiples of CV floats (summed inputs are
// none of its cases).
template <int CV>
__device__ __forceinline__ bool by_cv(DEPTHWISE_PARAMS) {
    unsigned long long bits = (unsigned long long)y | (unsigned long long)x |
                              (unsigned long long)wt | (unsigned long long)bias |
                              (unsigned long long)in_bias;
    bits |= (unsigned long long)((unsigned long long)c | xpix | ximage) * 4;
    return fit_cv(CV, bits) == CV;
}

// Relu before, 32-bit indices, no dilation along the width, widths 3, 5, 7 at strides 1 and
// 2, no summed inputs (and for CV > 1, channels last, `by_cv`); anything else as the entry
// points run it (over the same grid: it strides).
template <bool NHWC, int CV>
__device__ __forceinline__ void tiled_cases(DEPTHWISE_PARAMS) {
    if constexpr (CV > 1) {
        if (!by_cv<CV>(DEPTHWISE_ARGS)) return tiled_cases<NHWC, 1>(DEPTHWISE_ARGS);
    }
    const bool small = depthwise_fits32(nc, c, ximage, g);
    if (!small || pre != 1 || g.v[11] != 1 || nmore > 0)
        depthwise_cases<NHWC>(DEPTHWISE_ARGS);
    else if (in_bias != nullptr)
        tiled_width<NHWC, true, CV>(DEPTHWISE_ARGS);
    else
        tiled_width<NHWC, false, CV>(DEPTHWISE_ARGS);
}

extern "C" __global__ void depthwise_conv_tiled(DEPTHWISE_PARAMS) {
    tiled_cases<false, 1>(DEPTHWISE_ARGS);
}

extern "C" __global__ void depthwise_conv_tiled_nhwc(DEPTHWISE_PARAMS) {
    tiled_cases<true, 1>(DEPTHWISE_ARGS);
}

// Channels last, four channels of a pixel a thread: every load and store 16 bytes.
extern "C" __global__ void depthwise_conv_tiled4_nhwc(DEPTHWISE_PARAMS) {
    tiled_cases<true, 4>(DEPTHWISE_ARGS);
}

// Channels last, two channels of a pixel a thread, 8-byte accesses: for channels that are
// not a multiple of 4 (NASNet's 42-channel stem cells).
extern "C" __global__ void depthwise_conv_tiled2_nhwc(DEPTHWISE_PARAMS) {
    tiled_cases<true, 2>(DEPTHWISE_ARGS);
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
    "bias_act_vec4",
    "bias_act_runs",
    "act_kernel",
    "pool2d",
    "pool2d_runs",
    "pool2d_nhwc",
    "elementwise",
    "elementwise_runs",
    "elementwise_views",
    "pool2d_sum",
    "layer_norm",
    "softmax_rows",
    "permute",
    "broadcast",
    "pad",
    "resize2d",
    "resize2d_nhwc",
    "embedding",
    "cum_sum",
    "gather_elements",
    "reduce_mid",
    "depthwise_conv",
    "depthwise_conv_nhwc",
    "depthwise_conv_tiled",
    "depthwise_conv_tiled_nhwc",
    "depthwise_conv_tiled4_nhwc",
    "depthwise_conv_tiled2_nhwc",
    "depthwise_conv_unrolled",
    "depthwise_conv_unrolled_nhwc",
    "spin",
];

/// The most axes [`SOURCE`]'s `permute` handles.
pub const MAX_RANK: usize = 6;

/// The activation code and parameters the kernels take for `a` (see the module docs):
/// [`Activation::code`] and [`Activation::params`], a clip's missing bounds infinite (the
/// other activations ignore a parameter they do not have).
pub fn act_params(a: Activation) -> (i32, f32, f32) {
    let [p0, p1] = a.params();
    (
        i32::from(a.code()),
        p0.unwrap_or(f32::NEG_INFINITY),
        p1.unwrap_or(f32::INFINITY),
    )
}

/// [`act_f`'s](SOURCE) formula on the host, for tests: what the kernels compute for
/// `act_params(a)`.
#[cfg(test)]
#[allow(clippy::manual_clamp)] // fmaxf/fminf, as the kernel: NaN-ignoring, unlike clamp
pub(crate) fn act_f_host(x: f32, (a, p0, p1): (i32, f32, f32)) -> f32 {
    match a {
        1 => x.max(0.0),
        2 => 1.0 / (1.0 + (-x).exp()),
        3 => x.tanh(),
        4 => 0.5 * x * (1.0 + crate::reference::erf(x * std::f32::consts::FRAC_1_SQRT_2)),
        5 => 0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh()),
        6 => x.max(p0).min(p1),
        7 => {
            if x >= 0.0 {
                x
            } else {
                p0 * x
            }
        }
        8 => (p0 * x + p1).clamp(0.0, 1.0),
        9 => x * (x / 6.0 + 0.5).max(0.0).min(1.0),
        10 => x / (1.0 + (-p0 * x).exp()),
        11 => x.max(0.0) + (-x.abs()).exp().ln_1p(),
        12 => x * (x.max(0.0) + (-x.abs()).exp().ln_1p()).tanh(),
        13 => x.sqrt(),
        14 => 1.0 / x,
        15 => x.exp(),
        16 => x.ln(),
        17 => -x,
        18 => x.abs(),
        19 => crate::reference::erf(x),
        20 => x.sin(),
        21 => x.cos(),
        22 => {
            if x >= 0.0 {
                x
            } else {
                p0 * x.exp_m1()
            }
        }
        23 => {
            if x > 0.0 {
                p1 * x
            } else {
                p1 * (p0 * x.exp_m1())
            }
        }
        24 => x.max(0.0) + (p0 * (x / p0).exp_m1()).min(0.0),
        25 => {
            if x > p0 {
                x
            } else {
                0.0
            }
        }
        26 => x / (1.0 + x.abs()),
        27 => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x * 0.0
            }
        }
        28 => x.floor(),
        29 => x.ceil(),
        30 => x.round_ties_even(),
        31 => f32::from(u8::from(x.is_nan())),
        32 => {
            let hit = x.is_infinite() && if x > 0.0 { p1 != 0.0 } else { p0 != 0.0 };
            f32::from(u8::from(hit))
        }
        _ => x,
    }
}

/// Every activation, with parameters worth checking: what the tests run through the kernels'
/// formula and the reference.
#[cfg(test)]
pub(crate) fn every_activation() -> Vec<Activation> {
    vec![
        Activation::None,
        Activation::Relu,
        Activation::Sigmoid,
        Activation::Tanh,
        Activation::Gelu,
        Activation::GeluTanh,
        Activation::Clip {
            min: Some(-0.5),
            max: None,
        },
        Activation::Clip {
            min: Some(0.0),
            max: Some(6.0),
        },
        Activation::LeakyRelu { alpha: 0.1 },
        Activation::HardSigmoid {
            alpha: 0.2,
            beta: 0.5,
        },
        Activation::HardSwish,
        Activation::Swish { alpha: 1.0 },
        Activation::Swish { alpha: 1.702 },
        Activation::Softplus,
        Activation::Mish,
        Activation::Sqrt,
        Activation::Reciprocal,
        Activation::Exp,
        Activation::Log,
        Activation::Neg,
        Activation::Abs,
        Activation::Erf,
        Activation::Sin,
        Activation::Cos,
        Activation::Elu { alpha: 1.0 },
        Activation::Elu { alpha: 0.5 },
        Activation::Selu {
            alpha: Activation::SELU_ALPHA,
            gamma: Activation::SELU_GAMMA,
        },
        Activation::Celu { alpha: 1.0 },
        Activation::Celu { alpha: 2.5 },
        Activation::ThresholdedRelu { alpha: 1.0 },
        Activation::Softsign,
        Activation::Sign,
        Activation::Floor,
        Activation::Ceil,
        Activation::Round,
        Activation::IsNan,
        Activation::IsInf {
            negative: true,
            positive: true,
        },
        Activation::IsInf {
            negative: false,
            positive: true,
        },
        Activation::IsInf {
            negative: true,
            positive: false,
        },
    ]
}

/// `v` in a kernel's `Dims6` (six 64-bit slots, the rest `fill`); `None` for more than six
/// values or one beyond `i64`.
pub fn dims6(v: &[usize], fill: i64) -> Option<[i64; 6]> {
    let mut d = [fill; 6];
    if v.len() > d.len() {
        return None;
    }
    for (slot, &e) in d.iter_mut().zip(v) {
        *slot = i64::try_from(e).ok()?;
    }
    Some(d)
}

/// Right-aligned NumPy broadcasting as the `broadcast` kernel takes it: per result axis, the
/// result's extent and each operand's stride (0 where it repeats); `None` beyond
/// [`MAX_RANK`] axes or when an operand has more axes than the result.
pub fn broadcast_params(a: &[usize], b: &[usize], out: &[usize]) -> Option<[[i64; 6]; 3]> {
    let r = out.len();
    if r > MAX_RANK || a.len() > r || b.len() > r {
        return None;
    }
    // The CPU step's strides.
    let strides = |s: &[usize]| dims6(&crate::step::broadcast::strides(s, out), 0);
    Some([dims6(out, 1)?, strides(a)?, strides(b)?])
}

/// Threads per block of the element-wise kernels.
pub const BLOCK: u32 = 256;

/// Blocks for a grid-stride loop over `n` elements (at least 1, at most 65 535 * 16).
pub fn blocks_for(n: usize) -> u32 {
    let b = n.div_ceil(BLOCK as usize).max(1);
    b.min(65_535 * 16) as u32
}

/// Values of a row each thread of the layer-norm kernel keeps in registers (`LN_VPT`).
const LN_VPT: usize = 4;

/// Block size for the layer-norm kernel: enough threads for `LN_VPT` values each to hold the
/// row (one read of it), a multiple of 32 (its warp reductions), in [32, 1024].
pub fn layer_norm_block(dim: usize) -> u32 {
    (dim.div_ceil(LN_VPT).next_multiple_of(32).clamp(32, 1024)) as u32
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
    fn kernel_activations_are_the_reference_activations() {
        let all = every_activation();
        for a in all {
            for i in -40..=40 {
                let x = i as f32 * 0.25;
                let (got, want) = (act_f_host(x, act_params(a)), crate::reference::act(x, a));
                // The square root and logarithm of a negative are NaN in both.
                let same = got == want || (got.is_nan() && want.is_nan());
                assert!(
                    same || (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "{a:?} at {x}"
                );
            }
        }
    }

    #[test]
    fn broadcast_params_index_like_the_cpu_step() {
        // [2, 3, 4] op [3, 1]: b repeats along the last axis and the first.
        let [dims, sa, sb] = broadcast_params(&[2, 3, 4], &[3, 1], &[2, 3, 4]).unwrap();
        assert_eq!(
            (&dims[..3], &sa[..3], &sb[..3]),
            (&[2, 3, 4][..], &[12, 4, 1][..], &[0, 1, 0][..])
        );
        let a: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let b = [10.0f32, 20.0, 30.0];
        for t in 0..24i64 {
            let (mut rem, mut ia, mut ib) = (t, 0, 0);
            for d in (0..3).rev() {
                ia += (rem % dims[d]) * sa[d];
                ib += (rem % dims[d]) * sb[d];
                rem /= dims[d];
            }
            let row = (t / 4 % 3) as usize;
            assert_eq!(a[ia as usize] + b[ib as usize], t as f32 + b[row]);
        }
        assert!(broadcast_params(&[1; 7], &[1], &[1; 7]).is_none());
        assert!(broadcast_params(&[2, 2], &[2], &[2]).is_none());
    }

    /// The source compiles with NVRTC for the H100 (needs libnvrtc, not a GPU: `cargo xtask
    /// gpu-test`, or LD_LIBRARY_PATH pointing at the nvidia-cuda-nvrtc wheel).
    #[test]
    #[ignore]
    fn the_source_compiles() {
        let opts = cudarc::nvrtc::CompileOptions {
            arch: Some("compute_90"),
            ..Default::default()
        };
        let ptx = match cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts) {
            Ok(ptx) => ptx.to_src(),
            Err(e) => panic!("{e:?}"),
        };
        // Every kernel the steps launch by name is an entry point.
        for name in NAMES {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "no kernel '{name}'"
            );
        }
    }

    #[test]
    fn launch_sizes() {
        assert_eq!(blocks_for(0), 1);
        assert_eq!(blocks_for(256), 1);
        assert_eq!(blocks_for(257), 2);
        assert_eq!(blocks_for(usize::MAX / 2), 65_535 * 16);
        // A multiple of 32 holding the row in LN_VPT values per thread, at most 1024.
        assert_eq!(layer_norm_block(1), 32);
        assert_eq!(layer_norm_block(768), 192);
        assert_eq!(layer_norm_block(1000), 256);
        assert_eq!(layer_norm_block(4096), 1024);
        assert_eq!(layer_norm_block(100_000), 1024);
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
