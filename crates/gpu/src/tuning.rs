//! Kernel choices made by measurement that every process must repeat exactly: which cuDNN
//! kernel runs each convolution (a legacy-API algorithm, or an engine configuration of the
//! backend API: see [`Candidate::engine`]), whether its bias (+ relu) run inside cuDNN's
//! fused call or in our kernel after the convolution ([`epilogue_key`]: the fused call is not
//! faster everywhere, and for a bias alone cuDNN runs it only with one algorithm), and whether
//! a softmax over contiguous rows runs cuDNN's kernel or ours ([`SOFTMAX_KEY`]), and which
//! kernel runs each matrix product: cuBLAS's own choice or one of cuBLASLt's heuristic's top
//! configurations ([`GEMM_KEY`]).
//!
//! Letting `cudnnFindConvolutionForwardAlgorithmEx` pick afresh in every process made the same
//! plan run 2.86 to 4.54 ms on an H100: candidates a few percent apart swap places with timing
//! noise. So the measurements, not the choice, are what a device keeps ([`Tuning`]): every
//! candidate's time (GPU time in a CUDA graph replay), workspace and math type per
//! convolution, stored in the cost cache (one entry per candidate, keyed by the device's
//! fingerprint with its cuDNN version, the convolution's shape, the element type and the
//! layout; see [`to_cache`]). The choice is a function of those measurements alone
//! ([`choose`]): the fastest, where candidates within [`TIE`] of it count as equally fast and
//! the one with less workspace, then the lower algorithm number (legacy algorithms before
//! engines), wins. A process that finds the measurements in the cache therefore runs the same
//! kernels as the process that made them; `--retune` measures again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use opsched_cost::cache::{CacheKey, DeviceFingerprint, Measurement, KERNEL_PREFIX};

/// Candidates within this fraction of the fastest are ties (run-to-run noise on an H100 is a
/// few percent).
pub const TIE: f64 = 0.03;

/// The prefix of a convolution's key (a candidate's signature in the cost cache is
/// [`KERNEL_PREFIX`], the key, then the candidate: `kernel.cudnn_conv_fwd|x=...|algo=1|...`).
pub const CONV_KEY: &str = "cudnn_conv_fwd|";

/// The prefix of a softmax's key: its candidates are [`SOFTMAX_CUDNN`] and [`SOFTMAX_ROWS`].
pub const SOFTMAX_KEY: &str = "softmax|";
/// The candidate "cuDNN's channel softmax" of a [`SOFTMAX_KEY`] (it wins a tie).
pub const SOFTMAX_CUDNN: u32 = 0;
/// The candidate "our `softmax_rows` kernel, a warp per row" of a [`SOFTMAX_KEY`].
pub const SOFTMAX_ROWS: u32 = 1;

/// The prefix of a depthwise convolution's key (its geometry, layout, input strides, the
/// inputs it sums and adds, its activations, the channels its accesses may take at once): its
/// candidates are [`DEPTHWISE_ONE`], [`DEPTHWISE_UNROLLED`], [`DEPTHWISE_TILED`] and
/// [`DEPTHWISE_TILED4`] or [`DEPTHWISE_TILED2`], for the convolutions the latter have a case
/// for. A kept list is reused as it is, so a change of the candidates or of a kernel takes a
/// new version here (`depthwise.4|`), which measures them all again (version 2 added the
/// tiled kernels by fours and twos; version 3 took the summed inputs out of the tiled
/// kernels, which need fewer registers since, and out of their candidates).
pub const DEPTHWISE_KEY: &str = "depthwise.3|";
/// The candidate "our depthwise kernel, one output a thread" of a [`DEPTHWISE_KEY`] (it wins
/// a tie: it ran before the tiled one).
pub const DEPTHWISE_ONE: u32 = 0;
/// The candidate "our tiled depthwise kernel, several outputs of a row a thread".
pub const DEPTHWISE_TILED: u32 = 1;
/// The candidate "our depthwise kernel with its kernel width unrolled".
pub const DEPTHWISE_UNROLLED: u32 = 2;
/// The candidate "our tiled depthwise kernel, four channels of a pixel a thread" (channels
/// last, every access 16 bytes).
pub const DEPTHWISE_TILED4: u32 = 3;
/// The candidate "our tiled depthwise kernel, two channels of a pixel a thread" (channels
/// last, every access 8 bytes; where the channels are not a multiple of 4).
pub const DEPTHWISE_TILED2: u32 = 4;

/// The prefix of a matrix product's key (its shape, operands' layout and alignment, epilogue,
/// math and cuBLAS version): its candidates are [`GEMM_CUBLAS`] or [`GEMM_CUBLAS_SPLIT`] and
/// [`GEMM_LT`] plus a rank in cuBLASLt's heuristic's list, with `math` that configuration's
/// identity ([`lt_identity`]), checked when a later process rebuilds the list. Every candidate
/// uses the stream's cuBLAS workspace (its `workspace` is 0), so a tie goes to the lowest
/// number.
pub const GEMM_KEY: &str = "cublas_gemm|";
/// The candidate "cuBLAS's own choice" of a product without an epilogue (a tie goes to it: it
/// is what ran before products were measured).
pub const GEMM_CUBLAS: u32 = 0;
/// The candidate "cuBLASLt's configuration at rank `r`" is `GEMM_LT + r`.
pub const GEMM_LT: u32 = 1;
/// The candidate "cuBLAS's own choice, then our bias kernel" of a product with an epilogue:
/// after every cuBLASLt configuration, which do the epilogue in the product's kernel.
pub const GEMM_CUBLAS_SPLIT: u32 = 1 << 16;

/// The identity of a cuBLASLt configuration kept as a [`GEMM_KEY`] candidate's `math`: its
/// algorithm (`CUBLASLT_ALGO_CONFIG_ID`) and tile (`CUBLASLT_ALGO_CONFIG_TILE_ID`), 16 bits
/// each.
pub fn lt_identity(algo_id: u32, tile: u32) -> u32 {
    (algo_id & 0xffff) | (tile & 0xffff) << 16
}

/// The candidate "cuDNN's fused conv + bias + relu call" of an [`epilogue_key`].
pub const EPILOGUE_FUSED: u32 = 0;
/// The candidate "convolution, then our bias + activation kernel" of an [`epilogue_key`].
pub const EPILOGUE_SEPARATE: u32 = 1;

/// The key of the epilogue choice (`act`: "relu", or "identity" for a bias alone) of
/// convolution `conv_key` run with cuDNN algorithm `algo` and math type `math` when separate:
/// its candidates are [`EPILOGUE_FUSED`] and [`EPILOGUE_SEPARATE`] (as `algo`, with math and
/// workspace 0), so that [`choose`] gives a tie to the fused call, which launches less.
pub fn epilogue_key(conv_key: &str, act: &str, algo: u32, math: u32) -> String {
    format!("{conv_key}|epilogue={act}|conv={algo}.{math}")
}

/// Candidate numbers from this one on are engine configurations of cuDNN's backend API
/// ([`Candidate::engine`]); below it, legacy algorithms and [`GEMM`].
pub const ENGINE_BASE: u32 = 1 << 24;

/// The candidate number of a 1x1 convolution run as cuBLAS's matrix product
/// (`KernelOptions::conv_gemm`): after the legacy algorithms, before the engines.
pub const GEMM: u32 = 1 << 23;

/// One measured candidate kernel of one convolution.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// cuDNN's algorithm number (`cudnnConvolutionFwdAlgo_t`), [`GEMM`], or [`ENGINE_BASE`]
    /// plus a backend engine's global index.
    pub algo: u32,
    /// The math type it was measured with (`cudnnMathType_t`); for an engine, its
    /// configuration's rank in the heuristics' list (which fixes the knobs).
    pub math: u32,
    /// Median time, ms.
    pub ms: f64,
    /// Workspace bytes.
    pub workspace: usize,
}

impl Candidate {
    /// The backend engine configuration it is, as (engine global index, heuristic rank).
    pub fn engine(&self) -> Option<(u32, u32)> {
        self.algo
            .checked_sub(ENGINE_BASE)
            .map(|global| (global, self.math))
    }

    /// The candidate of engine `global` at `rank` in the heuristics' list.
    pub fn of_engine(global: u32, rank: u32, ms: f64, workspace: usize) -> Candidate {
        Candidate {
            algo: ENGINE_BASE.saturating_add(global),
            math: rank,
            ms,
            workspace,
        }
    }
}

/// The candidate to run among `c` that fit `limit` bytes of workspace (see the module docs).
pub fn choose(c: &[Candidate], limit: usize) -> Option<Candidate> {
    let fit = c
        .iter()
        .filter(|c| c.workspace <= limit && c.ms.is_finite() && c.ms >= 0.0);
    let best = fit.clone().map(|c| c.ms).min_by(f64::total_cmp)?;
    fit.filter(|c| c.ms <= best * (1.0 + TIE))
        .min_by_key(|c| (c.workspace, c.algo, c.math))
        .copied()
}

/// Measured candidates by choice (a convolution, its epilogue, a softmax: the key says
/// everything but the device), shared by every preparation on one device.
#[derive(Debug, Default)]
pub struct Tuning {
    state: Mutex<State>,
}

/// The kind of kernel a measured choice runs: a convolution's (the first three), a matrix
/// product's (the next two) or a depthwise convolution's (the last three).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFamily {
    /// A legacy-API algorithm of cuDNN.
    Legacy,
    /// A backend-API engine configuration of cuDNN.
    Engine,
    /// cuBLAS's matrix product (a 1x1 convolution).
    Gemm,
    /// A product on cuBLAS's own choice.
    Cublas,
    /// A product on a configuration of cuBLASLt's heuristic.
    CublasLt,
    /// Our depthwise kernel, one output a thread.
    DepthwiseOne,
    /// Our depthwise kernel with its kernel width unrolled.
    DepthwiseUnrolled,
    /// Our tiled depthwise kernel.
    DepthwiseTiled,
    /// Our tiled depthwise kernel, four channels a thread.
    DepthwiseTiled4,
    /// Our tiled depthwise kernel, two channels a thread.
    DepthwiseTiled2,
}

/// How many distinct convolutions (tuning keys) this process runs with each kind of kernel
/// ([`Tuning::chosen`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ConvKernels {
    /// A legacy-API algorithm.
    pub legacy: usize,
    /// A backend-API engine configuration.
    pub engines: usize,
    /// cuBLAS's matrix product.
    pub gemm: usize,
}

impl ConvKernels {
    /// Every distinct convolution.
    pub fn total(&self) -> usize {
        self.legacy + self.engines + self.gemm
    }
}

/// How many distinct matrix products (tuning keys) this process runs with each library
/// ([`Tuning::products`]); products without a key (groups through an array of addresses) are
/// not counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GemmKernels {
    /// cuBLAS's own choice.
    pub cublas: usize,
    /// A configuration of cuBLASLt's heuristic.
    pub cublaslt: usize,
}

impl GemmKernels {
    /// Every distinct product.
    pub fn total(&self) -> usize {
        self.cublas + self.cublaslt
    }
}

/// How many distinct depthwise convolutions (tuning keys) with a choice run each of our
/// depthwise kernels ([`Tuning::depthwise`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DepthwiseKernels {
    /// One output a thread.
    pub one: usize,
    /// The kernel width unrolled.
    pub unrolled: usize,
    /// Several outputs of a row a thread.
    pub tiled: usize,
    /// Several outputs of a row, four channels each, a thread.
    pub tiled4: usize,
    /// Several outputs of a row, two channels each, a thread.
    pub tiled2: usize,
}

impl DepthwiseKernels {
    /// Every distinct depthwise convolution with a choice.
    pub fn total(&self) -> usize {
        self.one + self.unrolled + self.tiled + self.tiled4 + self.tiled2
    }
}

#[derive(Debug, Default)]
struct State {
    known: BTreeMap<String, Vec<Candidate>>,
    /// Per convolution or product key, the kind of kernel chosen.
    chosen: BTreeMap<String, KernelFamily>,
    /// Keys measured by this process (what [`Tuning::fresh`] returns).
    fresh: BTreeSet<String>,
    /// Measure again what was loaded.
    retune: bool,
}

impl Tuning {
    /// Measure every choice again instead of trusting loaded measurements.
    pub fn set_retune(&self, retune: bool) {
        self.lock().retune = retune;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The measurements of `key`, unless it must be measured (unknown, or loaded while
    /// retuning).
    pub fn get(&self, key: &str) -> Option<Vec<Candidate>> {
        let s = self.lock();
        if s.retune && !s.fresh.contains(key) {
            return None;
        }
        s.known.get(key).cloned()
    }

    /// The measurements of `key` ([`Tuning::get`]), else `measure`'s, recorded as this
    /// process's ([`Tuning::insert`]).
    pub fn get_or_measure<E>(
        &self,
        key: &str,
        measure: impl FnOnce() -> Result<Vec<Candidate>, E>,
    ) -> Result<Vec<Candidate>, E> {
        if let Some(c) = self.get(key) {
            return Ok(c);
        }
        let c = measure()?;
        tracing::debug!("kernel choice measured for {key}: {c:?}");
        self.insert(key, c.clone());
        Ok(c)
    }

    /// Record this process's measurements of `key`.
    pub fn insert(&self, key: &str, c: Vec<Candidate>) {
        let mut s = self.lock();
        s.known.insert(key.to_string(), c);
        s.fresh.insert(key.to_string());
    }

    /// Record the kind of kernel chosen for convolution or product `key` (the last choice per
    /// key counts).
    pub fn chose(&self, key: &str, family: KernelFamily) {
        self.lock().chosen.insert(key.to_string(), family);
    }

    /// How many distinct keys chose `family`.
    fn count(&self, family: KernelFamily) -> usize {
        self.lock()
            .chosen
            .values()
            .filter(|&&c| c == family)
            .count()
    }

    /// The libraries chosen so far, per distinct product.
    pub fn products(&self) -> GemmKernels {
        GemmKernels {
            cublas: self.count(KernelFamily::Cublas),
            cublaslt: self.count(KernelFamily::CublasLt),
        }
    }

    /// The depthwise kernels chosen so far, per distinct depthwise convolution.
    pub fn depthwise(&self) -> DepthwiseKernels {
        DepthwiseKernels {
            one: self.count(KernelFamily::DepthwiseOne),
            unrolled: self.count(KernelFamily::DepthwiseUnrolled),
            tiled: self.count(KernelFamily::DepthwiseTiled),
            tiled4: self.count(KernelFamily::DepthwiseTiled4),
            tiled2: self.count(KernelFamily::DepthwiseTiled2),
        }
    }

    /// The kernels chosen so far, per distinct convolution.
    pub fn chosen(&self) -> ConvKernels {
        ConvKernels {
            legacy: self.count(KernelFamily::Legacy),
            engines: self.count(KernelFamily::Engine),
            gemm: self.count(KernelFamily::Gemm),
        }
    }

    /// Load the candidates among cache `entries` that belong to `device` (others are ignored).
    /// Returns how many choices they cover.
    pub fn load<'a>(
        &self,
        device: &DeviceFingerprint,
        entries: impl IntoIterator<Item = (&'a CacheKey, &'a Measurement)>,
    ) -> usize {
        let mut s = self.lock();
        let mut keys = BTreeSet::new();
        for (k, m) in entries {
            if &k.device != device {
                continue;
            }
            if let Some((key, c)) = from_cache(k, m) {
                if !s.fresh.contains(&key) {
                    let v = s.known.entry(key.clone()).or_default();
                    v.retain(|o| (o.algo, o.math) != (c.algo, c.math));
                    v.push(c);
                    keys.insert(key);
                }
            }
        }
        keys.len()
    }

    /// This process's measurements as cost-cache entries of `device`.
    pub fn fresh(&self, device: &DeviceFingerprint) -> Vec<(CacheKey, Measurement)> {
        let s = self.lock();
        s.fresh
            .iter()
            .filter_map(|k| s.known.get(k).map(|v| (k, v)))
            .flat_map(|(k, v)| v.iter().map(move |c| to_cache(device, k, c)))
            .collect()
    }
}

/// The cost-cache entry of candidate `c` of choice `key` on `device`.
pub fn to_cache(device: &DeviceFingerprint, key: &str, c: &Candidate) -> (CacheKey, Measurement) {
    (
        CacheKey {
            device: device.clone(),
            signature: format!(
                "{KERNEL_PREFIX}{key}|algo={}|math={}|workspace={}",
                c.algo, c.math, c.workspace
            ),
            batch: 0,
            dtype: "f32".into(),
        },
        Measurement::exact(c.ms),
    )
}

/// The choice's key and candidate of a cost-cache entry (`None`: not a candidate).
pub fn from_cache(k: &CacheKey, m: &Measurement) -> Option<(String, Candidate)> {
    let rest = k.signature.strip_prefix(KERNEL_PREFIX)?;
    let mut fields = rest.rsplitn(4, '|');
    let field = |f: Option<&str>, name: &str| -> Option<u64> {
        f?.strip_prefix(name)?.strip_prefix('=')?.parse().ok()
    };
    let workspace = field(fields.next(), "workspace")?;
    let math = field(fields.next(), "math")?;
    let algo = field(fields.next(), "algo")?;
    let key = fields.next()?.to_string();
    Some((
        key,
        Candidate {
            algo: u32::try_from(algo).ok()?,
            math: u32::try_from(math).ok()?,
            ms: m.median_ms,
            workspace: usize::try_from(workspace).ok()?,
        },
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn h100() -> DeviceFingerprint {
        DeviceFingerprint {
            name: "NVIDIA H100 80GB HBM3".into(),
            sms: 132,
            driver: "13.0".into(),
            cudnn: "91400".into(),
        }
    }

    fn cand(algo: u32, ms: f64, workspace: usize) -> Candidate {
        Candidate {
            algo,
            math: 0,
            ms,
            workspace,
        }
    }

    #[test]
    fn ties_go_to_less_workspace_then_the_lower_algorithm() {
        let c = [cand(6, 1.00, 4096), cand(1, 1.02, 0), cand(0, 1.50, 0)];
        assert_eq!(choose(&c, usize::MAX).unwrap().algo, 1);
        // Out of the tie band, the fastest wins whatever its workspace.
        let c = [cand(6, 1.00, 4096), cand(1, 1.10, 0)];
        assert_eq!(choose(&c, usize::MAX).unwrap().algo, 6);
        // The limit excludes; the order of the input does not matter.
        assert_eq!(choose(&c, 100).unwrap().algo, 1);
        let mut r = c;
        r.reverse();
        assert_eq!(choose(&r, usize::MAX), choose(&c, usize::MAX));
        assert_eq!(choose(&[], 0), None);
        assert_eq!(choose(&[cand(0, f64::NAN, 0)], 0), None);
    }

    #[test]
    fn an_epilogue_choice_is_a_convolution_key_of_its_own() {
        let dev = h100();
        let conv = "x=[1, 64, 56, 56]|oc=64|k=[3, 3]|s=[1, 1]|p=[1, 1]|d=[1, 1]|g=1|nchw|tf32";
        let key = epilogue_key(conv, "relu", 1, 0);
        let t = Tuning::default();
        t.insert(conv, vec![cand(1, 0.02, 0)]);
        t.insert(
            &key,
            vec![
                cand(EPILOGUE_FUSED, 0.0102, 0),
                cand(EPILOGUE_SEPARATE, 0.0100, 0),
            ],
        );
        // Within the tie band the fused call wins; out of it the faster pair does.
        assert_eq!(
            choose(&t.get(&key).unwrap(), usize::MAX).unwrap().algo,
            EPILOGUE_FUSED
        );
        let u = Tuning::default();
        assert_eq!(u.load(&dev, t.fresh(&dev).iter().map(|(k, m)| (k, m))), 2);
        assert_eq!(u.get(conv).unwrap(), [cand(1, 0.02, 0)]);
        let mut e = u.get(&key).unwrap();
        e.sort_by_key(|c| c.algo);
        assert_eq!(e, t.get(&key).unwrap());
        let slower = [
            cand(EPILOGUE_FUSED, 0.02, 0),
            cand(EPILOGUE_SEPARATE, 0.01, 0),
        ];
        assert_eq!(choose(&slower, usize::MAX).unwrap().algo, EPILOGUE_SEPARATE);
    }

    #[test]
    fn convolution_and_softmax_choices_share_the_cache_under_their_own_keys() {
        let dev = h100();
        // A convolution's entry as every cache since 2026-11-22 holds it.
        let conv = "x=[1, 64, 56, 56]|oc=64|k=[3, 3]|s=[1, 1]|p=[1, 1]|d=[1, 1]|g=1|nchw|tf32";
        let written = CacheKey {
            device: dev.clone(),
            signature: format!("kernel.cudnn_conv_fwd|{conv}|algo=1|math=0|workspace=0"),
            batch: 0,
            dtype: "f32".into(),
        };
        let t = Tuning::default();
        assert_eq!(t.load(&dev, [(&written, &Measurement::exact(0.02))]), 1);
        assert_eq!(
            t.get(&format!("{CONV_KEY}{conv}")).unwrap(),
            [cand(1, 0.02, 0)]
        );
        // A softmax's candidates go there and back beside it.
        let softmax = format!("{SOFTMAX_KEY}rows=24576|dim=128|accurate");
        t.insert(
            &softmax,
            vec![
                cand(SOFTMAX_CUDNN, 0.0112, 0),
                cand(SOFTMAX_ROWS, 0.0110, 0),
            ],
        );
        let entries = t.fresh(&dev);
        assert!(entries.iter().all(|(k, _)| k
            .signature
            .starts_with("kernel.softmax|rows=24576|dim=128|")));
        let u = Tuning::default();
        assert_eq!(u.load(&dev, entries.iter().map(|(k, m)| (k, m))), 1);
        // Within the tie band cuDNN's kernel keeps the softmax.
        assert_eq!(
            choose(&u.get(&softmax).unwrap(), usize::MAX).unwrap().algo,
            SOFTMAX_CUDNN
        );
        let faster = [cand(SOFTMAX_CUDNN, 0.02, 0), cand(SOFTMAX_ROWS, 0.01, 0)];
        assert_eq!(choose(&faster, usize::MAX).unwrap().algo, SOFTMAX_ROWS);
    }

    #[test]
    fn product_choices_keep_their_configurations_identity_and_prefer_fewer_launches() {
        let dev = h100();
        let key = format!("{GEMM_KEY}m=768|n=2048|k=768|op=TN|ep=bias");
        let identity = lt_identity(21, 18);
        assert_eq!(identity, 21 | 18 << 16);
        assert_ne!(lt_identity(21, 19), identity);
        let lt = |rank: u32, ms: f64| Candidate {
            algo: GEMM_LT + rank,
            math: identity,
            ms,
            workspace: 0,
        };
        let t = Tuning::default();
        t.insert(
            &key,
            vec![
                cand(GEMM_CUBLAS_SPLIT, 0.0100, 0),
                lt(0, 0.0102),
                lt(2, 0.0101),
            ],
        );
        // The identity goes to the cache and back with the rank.
        let u = Tuning::default();
        assert_eq!(u.load(&dev, t.fresh(&dev).iter().map(|(k, m)| (k, m))), 1);
        let mut back = u.get(&key).unwrap();
        back.sort_by_key(|c| c.algo);
        assert_eq!(
            back,
            [
                lt(0, 0.0102),
                lt(2, 0.0101),
                cand(GEMM_CUBLAS_SPLIT, 0.01, 0)
            ]
        );
        // A tie goes to the product with the epilogue inside (rank 0 before rank 2), and
        // without an epilogue to cuBLAS's own choice; out of the tie band the fastest wins.
        assert_eq!(choose(&back, usize::MAX).unwrap().algo, GEMM_LT);
        let plain = [lt(0, 0.0100), cand(GEMM_CUBLAS, 0.0102, 0)];
        assert_eq!(choose(&plain, usize::MAX).unwrap().algo, GEMM_CUBLAS);
        let faster = [lt(3, 0.0090), cand(GEMM_CUBLAS, 0.0102, 0)];
        assert_eq!(choose(&faster, usize::MAX).unwrap().algo, GEMM_LT + 3);
        // Products are counted per key, the last choice counting.
        t.chose(&key, KernelFamily::Cublas);
        t.chose(&key, KernelFamily::CublasLt);
        t.chose("other", KernelFamily::Cublas);
        assert_eq!(
            t.products(),
            GemmKernels {
                cublas: 1,
                cublaslt: 1
            }
        );
        assert_eq!(t.products().total(), 2);
        assert_eq!(t.chosen().total(), 0, "products are not convolutions");
    }

    #[test]
    fn a_choice_is_measured_once_and_a_failed_measurement_records_nothing() {
        let dev = h100();
        let t = Tuning::default();
        let measured = t.get_or_measure("k", || Ok::<_, ()>(vec![cand(1, 0.01, 0)]));
        assert_eq!(measured, Ok(vec![cand(1, 0.01, 0)]));
        let again = t.get_or_measure("k", || -> Result<Vec<Candidate>, ()> {
            panic!("measured twice")
        });
        assert_eq!(again, Ok(vec![cand(1, 0.01, 0)]));
        assert_eq!(
            t.get_or_measure("e", || Err::<Vec<Candidate>, _>("no GPU")),
            Err("no GPU")
        );
        assert_eq!(t.get("e"), None);
        assert_eq!(
            t.fresh(&dev).len(),
            1,
            "only k's candidate is this process's"
        );
    }

    #[test]
    fn choices_are_counted_per_distinct_convolution() {
        let t = Tuning::default();
        assert_eq!(t.chosen(), ConvKernels::default());
        t.chose("a", KernelFamily::Engine);
        t.chose("a", KernelFamily::Engine);
        t.chose("b", KernelFamily::Legacy);
        t.chose("c", KernelFamily::Engine);
        t.chose("d", KernelFamily::Gemm);
        let k = |legacy, engines, gemm| ConvKernels {
            legacy,
            engines,
            gemm,
        };
        assert_eq!(t.chosen(), k(1, 2, 1));
        assert_eq!(t.chosen().total(), 4);
        // A key chosen again (retuned) counts once, as its last choice.
        t.chose("c", KernelFamily::Legacy);
        assert_eq!(t.chosen(), k(2, 1, 1));
    }

    #[test]
    fn engines_are_candidates_after_the_legacy_algorithms() {
        let e = Candidate::of_engine(58, 3, 0.01, 0);
        assert_eq!(e.engine(), Some((58, 3)));
        assert_eq!(cand(7, 0.01, 0).engine(), None);
        // Equally fast and without workspace, the legacy algorithm wins a tie, and cuBLAS's
        // product (no engine either) wins one against an engine.
        assert_eq!(
            choose(&[e, cand(7, 0.0101, 0)], usize::MAX).unwrap().algo,
            7
        );
        let gemm = cand(GEMM, 0.0101, 0);
        assert_eq!(gemm.engine(), None);
        assert_eq!(choose(&[e, gemm], usize::MAX).unwrap().algo, GEMM);
        assert_eq!(
            choose(&[gemm, cand(7, 0.0101, 0)], usize::MAX)
                .unwrap()
                .algo,
            7
        );
        // Through the cache and back, an engine is the same engine at the same rank.
        let dev = h100();
        let key =
            "x=[1, 64, 56, 56]|oc=64|k=[3, 3]|s=[1, 1]|p=[1, 1]|d=[1, 1]|g=1|nchw|tf32|engines.2";
        let t = Tuning::default();
        let other_rank = Candidate::of_engine(58, 4, 0.02, 512);
        t.insert(key, vec![e, other_rank, cand(1, 0.03, 0)]);
        let u = Tuning::default();
        assert_eq!(u.load(&dev, t.fresh(&dev).iter().map(|(k, m)| (k, m))), 1);
        let mut got = u.get(key).unwrap();
        got.sort_by_key(|c| (c.algo, c.math));
        assert_eq!(got, [cand(1, 0.03, 0), e, other_rank]);
    }

    #[test]
    fn cache_entries_round_trip_and_stay_on_their_device() {
        let dev = h100();
        let key = "x=[1, 64, 56, 56]|oc=64|k=[3, 3]|s=[1, 1]|p=[1, 1]|d=[1, 1]|g=1|nchw|tf32";
        let t = Tuning::default();
        t.insert(key, vec![cand(1, 0.0123, 0), cand(6, 0.011, 1 << 20)]);
        let entries = t.fresh(&dev);
        assert_eq!(entries.len(), 2);
        let other = DeviceFingerprint {
            sms: 114,
            ..dev.clone()
        };
        let u = Tuning::default();
        assert_eq!(u.load(&other, entries.iter().map(|(k, m)| (k, m))), 0);
        assert_eq!(u.get(key), None);
        assert_eq!(u.load(&dev, entries.iter().map(|(k, m)| (k, m))), 1);
        let mut got = u.get(key).unwrap();
        got.sort_by_key(|c| c.algo);
        assert_eq!(got, [cand(1, 0.0123, 0), cand(6, 0.011, 1 << 20)]);
        assert!(u.fresh(&dev).is_empty());
        // Retuning ignores what was loaded until it is measured again.
        u.set_retune(true);
        assert_eq!(u.get(key), None);
        u.insert(key, vec![cand(0, 0.02, 0)]);
        assert_eq!(u.get(key).unwrap(), [cand(0, 0.02, 0)]);
        // Through a cost-cache file and back, as the CLI keeps them between processes.
        let dir = std::env::temp_dir().join(format!("opsched-tuning-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cache.bin");
        let mut cache = opsched_cost::cache::CostCache::open(&path).unwrap();
        for (k, m) in entries.clone() {
            cache.insert(k, m);
        }
        cache.save().unwrap();
        let reopened = opsched_cost::cache::CostCache::open(&path).unwrap();
        let w = Tuning::default();
        assert_eq!(w.load(&dev, reopened.entries()), 1);
        let mut again = w.get(key).unwrap();
        again.sort_by_key(|c| c.algo);
        assert_eq!(again, [cand(1, 0.0123, 0), cand(6, 0.011, 1 << 20)]);
        assert_eq!(
            choose(&again, usize::MAX).unwrap().algo,
            6,
            "0.0123 ms is over 3% slower than 0.011 ms"
        );
        let _ = std::fs::remove_dir_all(&dir);
        // Candidates are kernel measurements, not operator costs; foreign signatures are not
        // candidates.
        assert!(entries[0]
            .0
            .signature
            .starts_with(opsched_cost::cache::KERNEL_PREFIX));
        let (mut k, m) = entries[0].clone();
        k.signature = "conv|x".into();
        assert_eq!(from_cache(&k, &m), None);
    }
}
