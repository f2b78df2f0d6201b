//! Our depthwise and pooling kernels compiled for the host (a test; needs a C++ compiler, `c++` or
//! `$CXX`, not a GPU): their CUDA source is plain C++ once `__global__` and friends are
//! defined away and a grid of one thread strides over every element, so the index arithmetic
//! of every template case (layouts, strides, widths, input biases, summed inputs, input
//! activations, strided inputs) is checked in CI against an independent loop, and the
//! unrolled and tiled kernels (which the GPU runs where they measure faster; the tiled one
//! also four or two channels a thread) against the one-output-a-thread kernel, element for element.
#![allow(clippy::unwrap_used)]

use super::nvrtc::SOURCE;

/// `SOURCE` from the line that starts with `from` to the one that starts with `to`
/// (excluded): the parts the depthwise kernels need.
fn part(from: &str, to: &str) -> &'static str {
    let start = SOURCE
        .find(from)
        .unwrap_or_else(|| panic!("SOURCE has no '{from}'"));
    let len = SOURCE[start..]
        .find(to)
        .unwrap_or_else(|| panic!("SOURCE has no '{to}' after '{from}'"));
    &SOURCE[start..start + len]
}

/// `x` as a C float literal: NaN and the infinities as `<math.h>` spells them.
fn c_float(x: f32) -> String {
    match x {
        x if x.is_nan() => "NAN".to_string(),
        x if x.is_infinite() => format!("{}INFINITY", if x < 0.0 { "-" } else { "" }),
        x => format!("{x:?}f"),
    }
}

/// `v` as the elements of a C array initializer ([`c_float`] each).
fn c_floats(v: &[f32]) -> String {
    v.iter().map(|&x| c_float(x)).collect::<Vec<_>>().join(",")
}

/// What makes CUDA C++ host C++: a grid of one block of one thread, whose grid-stride loops
/// then visit every element.
const SHIM: &str = r#"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <random>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __noinline__
#define __global__
struct Dim { unsigned x; };
static const Dim blockIdx{0}, threadIdx{0}, blockDim{1}, gridDim{1};
typedef long long i64;
#define FITS32(n) ((n) <= 0x7fffffffLL)
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, sizeof f); return f; }
struct float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct float2 { float x, y; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
"#;

/// The cases, each run through today's kernel, the candidates and an independent loop.
const DRIVER: &str = r#"
static int failures = 0;

// `spare`: x a strided view, its pixels c + spare elements apart channels last, its images
// c * h * w + spare apart in NCHW (a slice of a concatenation).
static void one(int n, int c, int h, int w, int k, int stride, int pad, bool nhwc, bool in_bias,
                int nmore, int pre, int spare = 0) {
    const int oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
    std::mt19937 rng(n * 7 + c * 13 + h * 17 + k * 19 + stride * 23 + nmore * 3 + in_bias);
    std::uniform_real_distribution<float> d(-2, 2);
    const int xpix = nhwc ? c + spare : c;
    const i64 ximage = nhwc ? (i64)xpix * h * w : (i64)c * h * w + spare;
    std::vector<float> x(n * ximage), wt(c * k * k), bias(c), ib(c);
    for (auto* v : {&x, &wt, &bias, &ib})
        for (auto& e : *v) e = d(rng);
    std::vector<std::vector<float>> more(nmore, std::vector<float>(x.size()));
    std::vector<const float*> mp;
    for (auto& m : more) {
        for (auto& e : m) e = d(rng);
        mp.push_back(m.data());
    }
    const size_t len = (size_t)n * c * oh * ow;
    std::vector<float> y(len, 7.0f), unrolled(len, 7.0f), tiled(len, 7.0f), tiled4(len, 7.0f),
        tiled2(len, 7.0f);
    Geo12 g{{h, w, oh, ow, k, k, stride, stride, pad, pad, 1, 1}};
    const i64 nc = (i64)n * c;
    const float* ibp = in_bias ? ib.data() : nullptr;
    const float* const* mpp = nmore ? mp.data() : nullptr;
    const float q0 = 0.1f, q1 = 0.0f;  // LeakyRelu's alpha where pre is 7
    if (nhwc) {
        depthwise_conv_nhwc(y.data(), x.data(), wt.data(), bias.data(), nc, c, ximage, xpix, g,
                            pre, q0, q1, 0, 0, 0, ibp, mpp, nmore);
        depthwise_conv_unrolled_nhwc(unrolled.data(), x.data(), wt.data(), bias.data(), nc, c,
                                     ximage, xpix, g, pre, q0, q1, 0, 0, 0, ibp, mpp, nmore);
        depthwise_conv_tiled_nhwc(tiled.data(), x.data(), wt.data(), bias.data(), nc, c, ximage,
                                  xpix, g, pre, q0, q1, 0, 0, 0, ibp, mpp, nmore);
        depthwise_conv_tiled4_nhwc(tiled4.data(), x.data(), wt.data(), bias.data(), nc, c,
                                   ximage, xpix, g, pre, q0, q1, 0, 0, 0, ibp, mpp, nmore);
        depthwise_conv_tiled2_nhwc(tiled2.data(), x.data(), wt.data(), bias.data(), nc, c,
                                   ximage, xpix, g, pre, q0, q1, 0, 0, 0, ibp, mpp, nmore);
    } else {
        depthwise_conv(y.data(), x.data(), wt.data(), bias.data(), nc, c, ximage, xpix, g, pre, q0,
                       q1, 0, 0, 0, ibp, mpp, nmore);
        depthwise_conv_unrolled(unrolled.data(), x.data(), wt.data(), bias.data(), nc, c,
                                ximage, xpix, g, pre, q0, q1, 0, 0, 0, ibp, mpp, nmore);
        depthwise_conv_tiled(tiled.data(), x.data(), wt.data(), bias.data(), nc, c, ximage,
                             xpix, g, pre, q0, q1, 0, 0, 0, ibp, mpp, nmore);
    }
    // The independent loop: x and y [n, c, h, w] or [n, h, w, c], the weights [c, k, k] or
    // [k, k, c]; padding adds nothing.
    double worst = 0;
    size_t differ_unrolled = 0, differ_tiled = 0, differ_tiled4 = 0, differ_tiled2 = 0;
    for (int im = 0; im < n; ++im)
        for (int ch = 0; ch < c; ++ch)
            for (int i = 0; i < oh; ++i)
                for (int j = 0; j < ow; ++j) {
                    double acc = 0;
                    for (int p = 0; p < k; ++p)
                        for (int q = 0; q < k; ++q) {
                            const int r = i * stride - pad + p, s = j * stride - pad + q;
                            if (r < 0 || r >= h || s < 0 || s >= w) continue;
                            const size_t o = nhwc ? im * ximage + ((size_t)r * w + s) * xpix + ch
                                                  : im * ximage + ((size_t)ch * h + r) * w + s;
                            float v = x[o];
                            for (int m = 0; m < nmore; ++m) v += more[m][o];
                            if (in_bias) v += ib[ch];
                            if (pre == 1) v = v > 0 ? v : 0;
                            if (pre == 7) v = v >= 0 ? v : q0 * v;
                            const int tap = nhwc ? (p * k + q) * c + ch : (ch * k + p) * k + q;
                            acc += (double)v * wt[tap];
                        }
                    acc += bias[ch];
                    const size_t t = nhwc ? (((size_t)im * oh + i) * ow + j) * c + ch
                                          : (((size_t)im * c + ch) * oh + i) * ow + j;
                    worst = fmax(worst, fabs(y[t] - acc));
                    differ_unrolled += unrolled[t] != y[t];
                    differ_tiled += tiled[t] != y[t];
                    differ_tiled4 += nhwc && tiled4[t] != y[t];
                    differ_tiled2 += nhwc && tiled2[t] != y[t];
                }
    const bool ok = worst <= 1e-4 && differ_unrolled == 0 && differ_tiled == 0 &&
                    differ_tiled4 == 0 && differ_tiled2 == 0;
    if (!ok) {
        ++failures;
        printf("%s n%d c%d %dx%d k%d s%d p%d in_bias %d sums %d pre %d: off by %g from the "
               "loop; unrolled differs at %zu, tiled at %zu, tiled by fours at %zu, by twos at "
               "%zu of %zu\n",
               nhwc ? "NHWC" : "NCHW", n, c, h, w, k, stride, pad, in_bias, nmore, pre, worst,
               differ_unrolled, differ_tiled, differ_tiled4, differ_tiled2, len);
    }
}

int main() {
    int cases = 0;
    for (bool nhwc : {false, true})
        for (int k : {3, 4, 5, 7})
            for (int s : {1, 2})
                for (int extra = 0; extra < 3; ++extra)
                    for (int pre : {0, 1, 7}) {
                        one(2, 5, 11 + k, 9 + s, k, s, k / 2, nhwc, extra == 1,
                            extra == 2 ? 2 : 0, pre);
                        ++cases;
                    }
    // No padding with odd sizes; a kernel wider than the image; NASNet's first reduction;
    // strided views of x in both layouts (summed inputs are dense: not with a view).
    one(1, 8, 7, 6, 5, 1, 0, true, true, 1, 1);
    one(1, 3, 4, 5, 7, 1, 3, false, true, 0, 1);
    one(1, 96, 33, 33, 5, 2, 2, false, false, 0, 1);
    for (bool nhwc : {false, true})
        for (int k : {3, 5})
            for (int s : {1, 2}) one(2, 6, 9, 10, k, s, k / 2, nhwc, true, 0, 1, 5);
    cases += 11;
    // Four channels a thread (depthwise_conv_tiled4_nhwc, where channels and strides are
    // multiples of 4): dense, a strided view 4 past each pixel's channels, three input
    // activations, and 12 channels; the other cases above check its fallback.
    for (int k : {3, 5, 7})
        for (int s : {1, 2})
            for (int extra = 0; extra < 3; ++extra) {
                one(2, 8, 11 + k, 9 + s, k, s, k / 2, true, extra == 1, extra == 2 ? 2 : 0, 1);
                one(1, 12, 8 + k, 13 - s, k, s, k / 2, true, extra == 1, 0, 1, 4);
                cases += 2;
            }
    for (int pre : {0, 7}) one(1, 8, 9, 9, 3, 1, 1, true, true, 1, pre);
    cases += 2;
    // Two channels a thread (depthwise_conv_tiled2_nhwc, where channels and strides are even;
    // the cases of 8 and 12 channels above take it too): 6 and 10 channels, a view 2 past
    // each pixel's channels, and NASNet's stem (42 channels, 5x5 at stride 2).
    for (int k : {3, 5, 7})
        for (int s : {1, 2})
            for (int extra = 0; extra < 3; ++extra) {
                one(2, 6, 10 + k, 8 + s, k, s, k / 2, true, extra == 1, extra == 2 ? 2 : 0, 1);
                one(1, 10, 7 + k, 12 - s, k, s, k / 2, true, extra == 1, 0, 1, 2);
                cases += 2;
            }
    one(1, 42, 21, 21, 5, 2, 2, true, false, 0, 1);
    ++cases;
    printf("%d cases, %d failed\n", cases, failures);
    return failures != 0;
}
"#;

/// The shim, the activations and the grid-stride loop: what every kernel needs.
fn prelude() -> String {
    [
        SHIM,
        part(
            "__device__ __forceinline__ float softplus_f",
            "__device__ __forceinline__ float bin_f",
        ),
        part("#define GRID_STRIDE(", "\n\n"),
        "\n",
        part(
            "// CV consecutive floats at p",
            "// Where element t of a `[n, c, rows, cols]`",
        ),
        part("// Where element t of a `[n, c, rows, cols]`", "\n\n"),
        "\n",
    ]
    .concat()
}

#[test]
fn depthwise_kernels_agree_on_the_host() {
    compile_and_run(
        "depthwise",
        &[
            part(
                "// Depthwise convolution (one group",
                "// Abstract operators",
            ),
            DRIVER,
        ],
    );
}

/// The `pool2d_sum` cases: every input pooled, the values added, the bias and a relu, against
/// an independent loop; both layouts, strided inputs, values and output (their gaps must stay
/// untouched), max and both averages, padding, strides, a global window, 32- and 64-bit
/// indices, and a bias left to the poolings, which the loop adds to every input element it
/// pools; and each input pooled alone by `pool2d`, `pool2d_runs` and `pool2d_nhwc` with its
/// bias against the same loop (`pool2d_nhwc` asked for four channels a thread, which it takes
/// where the accesses allow).
const POOL_SUM_DRIVER: &str = r#"
static int failures = 0;

// `spare`: the inputs, the first value added and y are strided views with `spare` elements
// after each image (NCHW) or pixel (channels last).
// `vec`: the channels a thread the kernel should take (fit_cv's answer for these accesses,
// asked for 4); each case also runs asking for 1, 2 and 4, every output bit for bit alike.
static void one(int n, int c, int h, int w, int k, int stride, int pad, bool is_max,
                bool count_pad, bool nhwc, int npool, int nadd, bool with_bias, int spare,
                int narrow, bool pooled_bias, int vec = 1) {
    const int oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
    std::mt19937 rng(n * 7 + c * 13 + h * 17 + k * 19 + stride * 23 + npool * 3 + nadd);
    std::uniform_real_distribution<float> d(-2, 2);
    const i64 xstride = nhwc ? c + spare : (i64)c * h * w + spare;
    const i64 ximages = nhwc ? (i64)h * w * xstride : xstride;
    std::vector<std::vector<float>> xs(npool, std::vector<float>(n * ximages));
    for (auto& x : xs)
        for (auto& e : x) e = d(rng);
    const i64 len = (i64)n * c * oh * ow;
    // y and the first value added: runs of an image (NCHW) or a pixel's channels.
    const i64 run = spare ? (nhwc ? c : (i64)c * oh * ow) : 0, vstride = spare ? run + spare : 0;
    auto at = [&](i64 t, bool view) { return view && run ? (t / run) * vstride + t % run : t; };
    const i64 vlen = spare ? len / run * vstride : len;
    std::vector<std::vector<float>> adds(nadd);
    for (int a = 0; a < nadd; ++a) {
        adds[a].assign(a == 0 ? vlen : len, 0.0f);
        for (auto& e : adds[a]) e = d(rng);
    }
    // Each input's own bias left to its pooling.
    std::vector<float> bias(c), y(vlen, 7.0f);
    std::vector<std::vector<float>> pbias(npool, std::vector<float>(c));
    for (auto& e : bias) e = d(rng);
    for (auto& pb : pbias)
        for (auto& e : pb) e = d(rng);
    std::vector<const float*> ptrs;
    std::vector<i64> meta;
    for (auto& x : xs) {
        ptrs.push_back(x.data());
        meta.push_back(xstride);
    }
    for (int a = 0; a < nadd; ++a) {
        ptrs.push_back(adds[a].data());
        meta.push_back(a == 0 ? run : 0);
        meta.push_back(a == 0 ? vstride : 0);
    }
    for (auto& pb : pbias) ptrs.push_back(pooled_bias ? pb.data() : nullptr);
    // Each input pooled alone (pool2d, pool2d_runs into a strided y, pool2d_nhwc), with its
    // bias, laid out as y.
    std::vector<std::vector<float>> alone(npool, std::vector<float>(vlen, 7.0f));
    for (int xi = 0; xi < npool; ++xi) {
        const float* pb = pooled_bias ? pbias[xi].data() : nullptr;
        const float* x = xs[xi].data();
        float* out = alone[xi].data();
        if (nhwc)
            pool2d_nhwc(out, x, n, c, h, w, oh, ow, k, k, stride, stride, pad, pad,
                        pad, pad, count_pad, is_max, pb, spare ? vstride : c, xstride, 4);
        else if (spare)
            pool2d_runs(out, x, (i64)n * c, c, xstride, h, w, oh, ow, k, k, stride,
                        stride, pad, pad, pad, pad, count_pad, is_max, pb, run, vstride);
        else
            pool2d(out, x, (i64)n * c, c, xstride, h, w, oh, ow, k, k, stride, stride,
                   pad, pad, pad, pad, count_pad, is_max, pb);
    }
    auto sum = [&](std::vector<float>& out, int ask) {
        pool2d_sum(out.data(), run, vstride, ptrs.data(), meta.data(), npool, nadd, n, c, nhwc,
                   h, w, oh, ow, k, k, stride, stride, pad, pad, pad, pad, count_pad, is_max, 1,
                   0, 0, with_bias ? bias.data() : nullptr, c, nhwc ? 1 : oh * ow, narrow, ask);
    };
    sum(y, 1);
    size_t differ_vec = 0;
    for (int ask : {2, 4}) {
        std::vector<float> yv(vlen, 7.0f);
        sum(yv, ask);
        for (i64 e = 0; e < vlen; ++e) differ_vec += yv[e] != y[e];
    }
    // The width the kernel takes: what it reads and writes several floats at a time.
    unsigned long long bits = ptr_bits(ptrs.data(), npool + nadd) | (unsigned long long)y.data() |
                              (unsigned long long)(c | run | vstride) * 4;
    for (i64 m : meta) bits |= (unsigned long long)m * 4;
    const int took = nhwc ? fit_cv(4, bits) : 1;
    double worst = 0, worst_alone = 0;
    size_t gaps = 0;
    for (int im = 0; im < n; ++im)
        for (int ch = 0; ch < c; ++ch)
            for (int i = 0; i < oh; ++i)
                for (int j = 0; j < ow; ++j) {
                    const i64 t = nhwc ? (((i64)im * oh + i) * ow + j) * c + ch
                                       : (((i64)im * c + ch) * oh + i) * ow + j;
                    double acc = 0;
                    for (int xi = 0; xi < npool; ++xi) {
                        const auto& x = xs[xi];
                        double m = -INFINITY, s = 0;
                        int inside = 0, padded = 0;
                        for (int p = 0; p < k; ++p)
                            for (int q = 0; q < k; ++q) {
                                const int r = i * stride - pad + p, u = j * stride - pad + q;
                                if (r >= h + pad || u >= w + pad) continue;
                                ++padded;
                                if (r < 0 || r >= h || u < 0 || u >= w) continue;
                                ++inside;
                                const i64 o = nhwc ? im * ximages + ((i64)r * w + u) * xstride + ch
                                                   : im * ximages + ((i64)ch * h + r) * w + u;
                                const double v = x[o] + (pooled_bias ? pbias[xi][ch] : 0.0);
                                m = fmax(m, v);
                                s += v;
                            }
                        const double pooled = is_max ? m : s / (count_pad ? padded : inside);
                        worst_alone = fmax(worst_alone, fabs(alone[xi][at(t, true)] - pooled));
                        acc += pooled;
                    }
                    for (int a = 0; a < nadd; ++a) acc += adds[a][at(t, a == 0)];
                    if (with_bias) acc += bias[ch];
                    acc = acc > 0 ? acc : 0;
                    worst = fmax(worst, fabs(y[at(t, true)] - acc));
                }
    if (spare)
        for (i64 e = 0; e < vlen; ++e) {
            gaps += e % vstride >= run && y[e] != 7.0f;
            for (auto& a : alone) gaps += e % vstride >= run && a[e] != 7.0f;
        }
    if (worst > 1e-4 || worst_alone > 1e-4 || gaps || differ_vec || took != vec) {
        ++failures;
        printf("%s n%d c%d %dx%d k%d s%d p%d max %d count_pad %d pools %d adds %d bias %d "
               "spare %d narrow %d pooled bias %d: off by %g (pooled alone: %g), %zu gap "
               "elements written, %zu differ with more channels a thread (%d of them, not "
               "%d)\n",
               nhwc ? "NHWC" : "NCHW", n, c, h, w, k, stride, pad, is_max, count_pad, npool,
               nadd, with_bias, spare, narrow, pooled_bias, worst, worst_alone, gaps,
               differ_vec, took, vec);
    }
}

int main() {
    int cases = 0;
    for (bool nhwc : {false, true})
        for (int kind = 0; kind < 3; ++kind)
            for (int s : {1, 2})
                for (int spare : {0, 3})
                    for (int narrow : {0, 1}) {
                        // NASNet's: an average plus a value; two alike pools; a pool, two values
                        // and a bias. Half of them pool values whose bias was left to them
                        // (averages counting the padding: less than the bias at the edges).
                        one(2, 5, 9, 8, 3, s, 1, kind == 1, kind != 0, nhwc, 1 + (kind == 1),
                            kind == 1 ? 0 : 1 + (kind == 2), kind == 2, spare, narrow,
                            narrow == (spare == 0));
                        ++cases;
                    }
    // A window wider than the padding allows at the edge; a global window (one output pixel).
    one(1, 3, 6, 7, 4, 3, 2, false, true, false, 2, 1, true, 0, 1, true);
    one(2, 4, 5, 5, 5, 1, 0, false, true, true, 1, 1, true, 0, 1, true, 4);
    cases += 2;
    // Several channels a thread channels last: 4 where the channels, the views' strides and
    // runs divide by 4, else 2 (NASNet's 42 channels); every case above with 5 or 3 channels
    // takes one.
    for (int c : {8, 6})
        for (int spare : {0, 2, 4})
            for (int kind = 0; kind < 3; ++kind) {
                one(2, c, 7, 6, 3, 1 + (kind == 1), 1, kind == 1, kind != 0, true,
                    1 + (kind == 1), kind == 1 ? 0 : 1 + (kind == 2), kind == 2, spare, kind % 2,
                    kind != 1, c % 4 == 0 && spare % 4 == 0 ? 4 : 2);
                ++cases;
            }
    printf("%d cases, %d failed\n", cases, failures);
    return failures != 0;
}
"#;

#[test]
fn the_pooling_sum_kernel_agrees_with_a_loop_on_the_host() {
    compile_and_run(
        "pool_sum",
        &[
            // CUDA's integer min and max.
            "#include <algorithm>\nusing std::max;\nusing std::min;\n",
            part(
                "// Where element t of a tensor is",
                "template <typename I, typename At",
            ),
            part(
                "// The window of pool2d's output pixel",
                "// The activation (act_f's code",
            ),
            part(
                "// The add kernel of a sum that pools",
                "// The sum of `v` over the block",
            ),
            POOL_SUM_DRIVER,
        ],
    );
}

/// The `elementwise` and `elementwise_runs` cases: sums and products of dense sources with a
/// bias per channel (channels last and NCHW) and a relu, into a dense y or runs of a strided
/// one, each asking for 1, 2 and 4 elements a thread, against a loop of the same f32
/// operations, bit for bit (the gaps between runs untouched), and the width the kernel takes;
/// and `bias_act_runs` (a convolution's bias, residual and relu on its concatenation slice) the
/// same way.
const ELEMENTWISE_DRIVER: &str = r#"
static int failures = 0;

static void one(i64 n, int nsrc, bool mul, i64 channels, i64 inner, i64 run, i64 stride,
                int vec) {
    std::mt19937 rng(n * 7 + nsrc * 13 + run * 17 + stride * 19 + mul);
    std::uniform_real_distribution<float> d(-2, 2);
    std::vector<std::vector<float>> src(nsrc, std::vector<float>(n));
    std::vector<const float*> sp;
    for (auto& v : src) {
        for (auto& e : v) e = d(rng);
        sp.push_back(v.data());
    }
    std::vector<float> bias(channels);
    for (auto& e : bias) e = d(rng);
    const i64 ylen = run ? n / run * stride : n;
    std::vector<float> want(ylen, 7.0f);
    for (i64 t = 0; t < n; ++t) {
        float acc = mul ? 1.0f : 0.0f;
        for (auto& v : src) acc = mul ? acc * v[t] : acc + v[t];
        acc += bias[(t / inner) % channels];
        want[run ? t / run * stride + t % run : t] = acc > 0 ? acc : 0;
    }
    size_t differ = 0;
    for (int ask : {1, 2, 4}) {
        std::vector<float> y(ylen, 7.0f);
        if (run)
            elementwise_runs(y.data(), sp.data(), nsrc, n, run, stride, mul, 1, 0, 0,
                             bias.data(), channels, inner, ask);
        else
            elementwise(y.data(), sp.data(), nsrc, n, mul, 1, 0, 0, bias.data(), channels,
                        inner, ask);
        for (i64 e = 0; e < ylen; ++e) differ += y[e] != want[e];
    }
    // The width the kernel takes.
    std::vector<float> probe(ylen);
    const int took = fit_cv(4, ptr_bits(sp.data(), nsrc) | (unsigned long long)probe.data() |
                                   (unsigned long long)(n | run | stride) * 4);
    if (differ || took != vec) {
        ++failures;
        printf("n %lld sources %d mul %d bias %lld x %lld runs %lld of %lld: %zu differ, %d "
               "elements a thread, not %d\n",
               n, nsrc, mul, channels, inner, run, stride, differ, took, vec);
    }
}

// bias_act_runs: y a strided view (runs of `run`, `stride` apart) given a bias per channel
// (channels last), a dense residual where `res`, and a relu, asking for 1, 2 and 4 elements a
// thread, against a loop of the same f32 operations, bit for bit (the gaps untouched).
static void one_bias(i64 n, i64 channels, i64 run, i64 stride, bool res, int vec) {
    std::mt19937 rng(n * 3 + channels * 5 + run * 7 + stride * 11 + res);
    std::uniform_real_distribution<float> d(-2, 2);
    const i64 ylen = n / run * stride;
    std::vector<float> y0(ylen), bias(channels), residual(n);
    for (auto* v : {&y0, &bias, &residual})
        for (auto& e : *v) e = d(rng);
    std::vector<float> want = y0;
    for (i64 t = 0; t < n; ++t) {
        float& v = want[t / run * stride + t % run];
        v += bias[t % channels];
        if (res) v += residual[t];
        v = v > 0 ? v : 0;
    }
    size_t differ = 0;
    for (int ask : {1, 2, 4}) {
        std::vector<float> y = y0;
        bias_act_runs(y.data(), bias.data(), res ? residual.data() : nullptr, n, channels, 1,
                      run, stride, 1, 0, 0, ask);
        for (i64 e = 0; e < ylen; ++e) differ += y[e] != want[e];
    }
    const int took = fit_cv(4, (unsigned long long)y0.data() |
                                   (unsigned long long)(res ? residual.data() : nullptr) |
                                   (unsigned long long)(run | stride | n) * 4);
    if (differ || took != vec) {
        ++failures;
        printf("bias_act_runs n %lld bias %lld runs %lld of %lld residual %d: %zu differ, %d "
               "elements a thread, not %d\n",
               n, channels, run, stride, res, differ, took, vec);
    }
}

int main() {
    int cases = 0;
    for (bool res : {false, true}) {
        one_bias(240, 8, 8, 24, res, 4);
        one_bias(240, 6, 6, 10, res, 2);
        one_bias(240, 5, 5, 7, res, 1);
        cases += 3;
    }
    for (bool mul : {false, true})
        for (int nsrc : {1, 2, 3}) {
            // Channels last (a bias per element of a pixel), dense and a concatenation's
            // slice; NCHW (a bias per 20-element plane); lengths and runs of twos and ones.
            one(240, nsrc, mul, 8, 1, 0, 0, 4);
            one(240, nsrc, mul, 8, 1, 8, 24, 4);
            one(240, nsrc, mul, 6, 1, 6, 10, 2);
            one(240, nsrc, mul, 5, 1, 5, 7, 1);
            one(240, nsrc, mul, 3, 20, 0, 0, 4);
            one(242, nsrc, mul, 11, 1, 0, 0, 2);
            one(243, nsrc, mul, 3, 27, 0, 0, 1);
            cases += 7;
        }
    printf("%d cases, %d failed\n", cases, failures);
    return failures != 0;
}
"#;

#[test]
fn the_elementwise_kernels_agree_with_a_loop_at_every_width_on_the_host() {
    compile_and_run(
        "elementwise",
        &[
            part(
                "// Where element t of a tensor is",
                "template <typename I, typename At",
            ),
            part(
                "template <typename I, typename At = Dense<I> >",
                "extern \"C\" __global__ void act_kernel(",
            ),
            part(
                "// The activation (act_f's code and parameters) is fused in",
                "// elementwise where sources may be strided views too",
            ),
            ELEMENTWISE_DRIVER,
        ],
    );
}

/// Compile the prelude and `pieces` (the kernels' parts, then a driver) as one C++ file with the
/// host's compiler (`c++`, or `$CXX`), run it, and check that it says that none of its cases
/// failed.
fn compile_and_run(name: &str, pieces: &[&str]) {
    let source = [prelude().as_str(), &pieces.concat()].concat();
    let dir =
        std::env::temp_dir().join(format!("opsched-host-check-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cpp, exe) = (dir.join(format!("{name}.cpp")), dir.join(name));
    std::fs::write(&cpp, source).unwrap();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let built = std::process::Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-w", "-o"])
        .arg(&exe)
        .arg(&cpp)
        .output()
        .unwrap_or_else(|e| panic!("this test needs a C++ compiler ({cxx}, or set CXX): {e}"));
    assert!(
        built.status.success(),
        "{cxx} failed on {}:\n{}",
        cpp.display(),
        String::from_utf8_lossy(&built.stderr)
    );
    let run = std::process::Command::new(&exe).output().unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{out}");
    assert!(out.contains(", 0 failed"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The `resize2d` kernels (both layouts, nearest and bilinear, enlarging and shrinking, one
/// and several images) against the reference executor's resize, element for element: the
/// inputs, the tap tables the step uploads and the reference's outputs are written into the
/// driver as literals.
#[test]
fn the_resize_kernels_agree_with_the_reference_on_the_host() {
    use opsched_graph::{NearestMode, Resize, ResizeCoord};
    use std::fmt::Write;
    let mut driver = String::from(
        "static int failures = 0, cases = 0;\n\
         static void check(const float* x, const int* index, const float* weight,\n\
                           const float* want, int n, int c, int h, int w, int oh, int ow,\n\
                           int linear, bool nhwc) {\n\
             std::vector<float> y((size_t)n * c * oh * ow, 7.0f);\n\
             if (nhwc) resize2d_nhwc(y.data(), x, n, c, h, w, oh, ow, index, weight, linear);\n\
             else resize2d(y.data(), x, n, c, h, w, oh, ow, index, weight, linear);\n\
             size_t bad = 0;\n\
             for (size_t t = 0; t < y.size(); ++t) bad += fabs(y[t] - want[t]) > 1e-6;\n\
             if (bad) { ++failures; printf(\"case %d: %zu of %zu differ\\n\", cases, bad, y.size()); }\n\
             ++cases;\n\
         }\n\
         int main() {\n",
    );
    let cases = [
        (
            [2, 3, 5, 4],
            Resize::nearest([9, 7], ResizeCoord::Asymmetric, NearestMode::Floor),
        ),
        (
            [1, 4, 6, 6],
            Resize::linear([9, 13], ResizeCoord::PytorchHalfPixel),
        ),
        (
            [2, 2, 7, 9],
            Resize::linear([3, 4], ResizeCoord::AlignCorners),
        ),
        (
            [3, 5, 4, 4],
            Resize::nearest([2, 7], ResizeCoord::HalfPixel, NearestMode::Ceil),
        ),
    ];
    let mut seed = 1u32;
    for (shape, r) in cases {
        let [n, c, h, w] = shape;
        let x: Vec<f32> = (0..n * c * h * w)
            .map(|_| {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (seed >> 8) as f32 / (1 << 24) as f32 * 4.0 - 2.0
            })
            .collect();
        let want = crate::reference::resize(&x, &shape, &r);
        let (rows, cols) = (r.taps(0, h), r.taps(1, w));
        let taps = || rows.iter().chain(&cols);
        let index: Vec<String> = taps()
            .flat_map(|t| [t.lo, t.hi])
            .map(|v| v.to_string())
            .collect();
        let weight: Vec<f32> = taps().flat_map(|t| [t.w_lo, t.w_hi]).collect();
        let [oh, ow] = r.size;
        let linear = i32::from(r.mode == opsched_graph::ResizeMode::Linear);
        for nhwc in [false, true] {
            let (mut xs, mut ys) = (x.clone(), want.clone());
            if nhwc {
                crate::program::nchw_to_nhwc(&x, shape, &mut xs);
                crate::program::nchw_to_nhwc(&want, [n, c, oh, ow], &mut ys);
            }
            let _ = writeln!(
                driver,
                "{{ static const float x[] = {{{}}}; static const int index[] = {{{}}};\n\
                 static const float weight[] = {{{}}}; static const float want[] = {{{}}};\n\
                 check(x, index, weight, want, {n}, {c}, {h}, {w}, {oh}, {ow}, {linear}, {nhwc}); }}",
                c_floats(&xs),
                index.join(","),
                c_floats(&weight),
                c_floats(&ys),
            );
        }
    }
    driver.push_str(
        "printf(\"%d cases, %d failed\\n\", cases, failures);\nreturn failures != 0;\n}\n",
    );
    compile_and_run(
        "resize",
        &[
            part(
                "// Resize of the spatial axes",
                "extern \"C\" __global__ void pad(",
            ),
            &driver,
        ],
    );
}

/// The `embedding` kernel against `table_row` (the CPU's rule): in-range indices, negative
/// ones from the end, and zeros for what names no row (a fraction, one past either end).
#[test]
fn the_embedding_kernel_agrees_with_the_row_rule_on_the_host() {
    use opsched_graph::op::table_row;
    let (rows, dim) = (5usize, 3usize);
    let table: Vec<f32> = (0..rows * dim).map(|v| v as f32 + 0.5).collect();
    let idx = [0.0f32, 4.0, -1.0, -5.0, 2.5, 5.0, -6.0, 3.0];
    let want: Vec<f32> = idx
        .iter()
        .flat_map(|&v| match table_row(v, rows) {
            Some(r) => table[r * dim..][..dim].to_vec(),
            None => vec![0.0; dim],
        })
        .collect();
    let driver = format!(
        "int main() {{\n\
         static const float table[] = {{{}}}; static const float idx[] = {{{}}};\n\
         static const float want[] = {{{}}}; float y[{}];\n\
         embedding(y, idx, table, {}, {rows}, {dim});\n\
         int bad = 0;\n\
         for (int t = 0; t < {}; ++t) bad += y[t] != want[t];\n\
         printf(\"1 cases, %d failed\\n\", bad != 0);\n\
         return bad != 0;\n}}\n",
        c_floats(&table),
        c_floats(&idx),
        c_floats(&want),
        want.len(),
        want.len(),
        want.len(),
    );
    compile_and_run(
        "embedding",
        &[
            part(
                "// Table lookup (step/embedding.rs)",
                "// Running sums along the middle axis",
            ),
            &driver,
        ],
    );
}

/// The `cum_sum` kernel against the CPU step, bit for bit (both add in the axis's order),
/// in every direction, along the middle axis of `[2, 5, 3]` and along a whole vector.
#[test]
fn the_running_sums_kernel_agrees_with_the_cpu_on_the_host() {
    use crate::cpu::CpuIo;
    use crate::step::{cum_sum::CumSum, StepKernel};
    let x: Vec<f32> = (0..30)
        .map(|v| ((v * 37) % 23) as f32 * 0.37 - 4.1)
        .collect();
    let mut driver = format!(
        "int main() {{\nstatic const float x[] = {{{}}};\nint bad = 0, cases = 0;\nfloat y[30];\n",
        c_floats(&x)
    );
    for (outer, n, inner) in [(2usize, 5usize, 3usize), (1, 30, 1)] {
        for (exclusive, reverse) in [(false, false), (true, false), (false, true), (true, true)] {
            let s = CumSum {
                x: 0,
                y: 1,
                outer,
                n,
                inner,
                exclusive,
                reverse,
            };
            let mut want = vec![0.0f32; 30];
            s.run_cpu(&mut CpuIo::of(vec![(0, &x[..])], vec![(1, &mut want[..])]))
                .unwrap();
            driver.push_str(&format!(
                "{{ static const float want[] = {{{}}};\n\
                 cum_sum(y, x, {outer}, {n}, {inner}, {}, {});\n\
                 for (int t = 0; t < 30; ++t) bad += y[t] != want[t];\n++cases; }}\n",
                c_floats(&want),
                i32::from(exclusive),
                i32::from(reverse),
            ));
        }
    }
    driver.push_str("printf(\"%d cases, %d failed\\n\", cases, bad != 0);\nreturn bad != 0;\n}\n");
    compile_and_run(
        "cum_sum",
        &[
            part(
                "// Running sums along the middle axis",
                "// Elements gathered along an axis",
            ),
            &driver,
        ],
    );
}

/// The `gather_elements` kernel against the CPU step where the indices are in the axis
/// (negative ones from the end), and zeros where one is not (a fraction, one past either end),
/// along each axis of a `[3, 4, 2]` data tensor with `[2, 3, 2]` indices.
#[test]
fn the_gather_kernel_agrees_with_the_cpu_on_the_host() {
    use crate::cpu::CpuIo;
    use crate::step::{gather::GatherElements, StepKernel};
    let data = vec![3usize, 4, 2];
    let x: Vec<f32> = (0..24).map(|v| v as f32 + 0.5).collect();
    let mut driver = format!(
        "int main() {{\nstatic const float x[] = {{{}}};\nint bad = 0, cases = 0;\nfloat y[12];\n",
        c_floats(&x)
    );
    for axis in 0..3 {
        let out = vec![2usize, 3, 2];
        let n = data[axis] as i64;
        let idx: Vec<f32> = (0..12)
            .map(|t| ((t * 5) as i64 % (2 * n) - n) as f32)
            .collect();
        let s = GatherElements {
            x: 0,
            idx: 1,
            y: 2,
            data: data.clone(),
            out: out.clone(),
            axis,
        };
        let mut want = vec![0.0f32; 12];
        s.run_cpu(&mut CpuIo::of(
            vec![(0, &x[..]), (1, &idx[..])],
            vec![(2, &mut want[..])],
        ))
        .unwrap();
        // What names no element: a fraction, one past the end, one before the start.
        let mut bad_idx = idx.clone();
        bad_idx[..3].copy_from_slice(&[0.5, n as f32, -(n as f32) - 1.0]);
        let mut bad_want = want.clone();
        bad_want[..3].fill(0.0);
        let strides = [8, 2, 1];
        for (ix, w) in [(&idx, &want), (&bad_idx, &bad_want)] {
            driver.push_str(&format!(
                "{{ static const float idx[] = {{{}}}; static const float want[] = {{{}}};\n\
                 Dims6 dims = {{{{2, 3, 2, 1, 1, 1}}}}, strides = {{{{{}, {}, {}, 0, 0, 0}}}};\n\
                 gather_elements(y, x, idx, 12, 3, {axis}, {n}, dims, strides);\n\
                 for (int t = 0; t < 12; ++t) bad += y[t] != want[t];\n++cases; }}\n",
                c_floats(ix),
                c_floats(w),
                strides[0],
                strides[1],
                strides[2],
            ));
        }
    }
    driver.push_str("printf(\"%d cases, %d failed\\n\", cases, bad != 0);\nreturn bad != 0;\n}\n");
    compile_and_run(
        "gather_elements",
        &[
            part("struct Dims6", "\n"),
            "\n",
            part(
                "// Elements gathered along an axis",
                "// Resize of the spatial axes",
            ),
            &driver,
        ],
    );
}

/// The `reduce_mid` kernel against the reference's reduction, each kind over the middle
/// axis of `[3, 5, 4]`, and over a whole tensor (outer and inner 1).
#[test]
fn the_reduce_kernel_agrees_with_the_kinds_on_the_host() {
    use opsched_graph::ReduceKind;
    let x: Vec<f32> = (0..60).map(|v| ((v * 37) % 23) as f32 - 11.5).collect();
    // A product over sixty elements overflows and a logarithm of a negative sum is NaN
    // (`c_float` spells those), and NaN counts as equal to NaN.
    let mut driver = format!(
        "int main() {{\nstatic const float x[] = {{{}}};\nint bad = 0, cases = 0;\nfloat y[60];\n",
        c_floats(&x)
    );
    for kind in ReduceKind::ALL {
        for (outer, red, inner) in [(3usize, 5usize, 4usize), (1, 60, 1)] {
            let want = crate::reference::reduce(&x[..outer * red * inner], red, inner, kind);
            driver.push_str(&format!(
                "{{ static const float want[] = {{{}}};\n\
                 reduce_mid(y, x, {outer}, {red}, {inner}, {});\n\
                 for (int t = 0; t < {}; ++t) bad += y[t] != want[t] && !(isnan(y[t]) && isnan(want[t]));\n++cases; }}\n",
                c_floats(&want),
                kind.code(),
                want.len()
            ));
        }
    }
    driver.push_str("printf(\"%d cases, %d failed\\n\", cases, bad != 0);\nreturn bad != 0;\n}\n");
    compile_and_run(
        "reduce",
        &[
            part(
                "// Reduction over the middle axis",
                "// Table lookup (step/embedding.rs)",
            ),
            &driver,
        ],
    );
}

/// The kernels' `act_f`, every activation code with its parameters, against the reference's
/// activations (`crate::reference::act`) over [-10, 10] and at NaN and the infinities: within
/// 1e-6 relative (the reference's erf is its own, CUDA's is `erff`), NaN where it is NaN.
#[test]
fn the_activations_agree_with_the_reference_on_the_host() {
    let mut xs: Vec<f32> = (-80..=80).map(|i| i as f32 * 0.125).collect();
    xs.extend([
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        2.5,
        -2.5,
        0.5,
        -0.5,
    ]);
    let mut driver = format!(
        "int main() {{\nint bad = 0, cases = 0;\nstatic const float xs[] = {{{}}};\n",
        c_floats(&xs)
    );
    for a in super::nvrtc::every_activation() {
        let (code, p0, p1) = super::nvrtc::act_params(a);
        let want: Vec<f32> = xs.iter().map(|&x| crate::reference::act(x, a)).collect();
        driver.push_str(&format!(
            "{{ static const float want[] = {{{}}};\n\
             for (int i = 0; i < {}; ++i) {{\n\
             float got = act_f(xs[i], {code}, {}, {});\n\
             bool same = got == want[i] || (isnan(got) && isnan(want[i]))\n\
             || fabsf(got - want[i]) <= 1e-6f * fmaxf(fabsf(want[i]), 1.0f);\n\
             if (!same) {{ ++bad; printf(\"code {code} at %g: %g, want %g\\n\", xs[i], got, want[i]); }}\n\
             ++cases; }} }}\n",
            c_floats(&want),
            xs.len(),
            c_float(p0),
            c_float(p1),
        ));
    }
    driver.push_str("printf(\"%d cases, %d failed\\n\", cases, bad);\nreturn bad != 0;\n}\n");
    compile_and_run("activations", &[&driver]);
}
