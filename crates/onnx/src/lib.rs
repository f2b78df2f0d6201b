//! # opsched-onnx
//!
//! Imports ONNX models (`.onnx` files as exported by PyTorch, TensorFlow and others) into the
//! opsched operator graph IR, so that `opsched inspect|compare|schedule model.onnx` work on the
//! models people already have. Scheduling needs only shapes, so by default weights are not
//! read: a model whose weights live in an absent external data file imports fine. With
//! [`OnnxOptions::weights`] every initializer is loaded (see *Weights* below) and the graph
//! carries them ([`opsched_graph::Graph::weights`]), for executors that compute real outputs.
//!
//! ```no_run
//! let opts = opsched_onnx::OnnxOptions { batch: 8, ..Default::default() };
//! let g = opsched_onnx::load_file("resnet50.onnx", &opts)?;
//! println!("{} operators", g.op_count());
//! # Ok::<(), opsched_onnx::OnnxError>(())
//! ```
//!
//! ## Parser: hand-written prost messages
//! The [`proto`] module declares the subset of `onnx.proto` we read as `#[derive(prost::Message)]`
//! structs. We weighed:
//! - **onnx-ir** (burn): a full ONNX IR, but it pulls in `burn-tensor`, `regex`, `half`,
//!   `memmap2` and generates code from `.proto` at build time with `protobuf-codegen`; minutes
//!   of build on a 2-core machine for far more than we need, and it loads weights.
//! - **tract-onnx**: an inference engine (`tract-core`, `tract-hir`, `ndarray`, ...); its
//!   protobuf layer is not published on its own.
//! - **prost with `prost-build`**: needs `protoc` (or a vendored build of it) at build time.
//! - **prost derive on hand-written structs** (chosen): `prost` and `prost-derive` are small,
//!   maintained (tokio-rs), build offline without `protoc` or a build script in a few seconds,
//!   and reuse `syn`/`quote` that the workspace builds anyway. ONNX's schema is stable
//!   (fields are only ever added), and undeclared fields are skipped by the decoder, so the
//!   subset cannot break on newer files. Weight bytes are sliced, never copied or parsed.
//!
//! ## Mapping (ONNX operator -> IR operator)
//! Every mapping is exact: with the model's weights, the IR graph computes what onnxruntime
//! computes (the parity tests of the facade check it within 1e-4).
//!
//! | ONNX | IR |
//! |---|---|
//! | `Conv` (2-D; groups, asymmetric pads, strides, dilations, `auto_pad`) | `conv2d` |
//! | `BatchNormalization` after a conv (or Gemm/MatMul) read only by it | folded into its weights and bias (scale, shift, epsilon, running mean and variance) |
//! | `BatchNormalization` elsewhere | `affine` (per-channel `scale`, `shift`) |
//! | `Relu`, `Sigmoid`, `Tanh`, `Gelu` (erf and tanh forms), `Clip` (min/max), `LeakyRelu` (alpha), `HardSigmoid` (alpha, beta), `HardSwish`, `Swish` (alpha), `Softplus`, `Mish`, `Elu`, `Selu`, `Celu`, `ThresholdedRelu` (their alphas and gamma), `Softsign` and the functions of one value `Sqrt`, `Reciprocal`, `Exp`, `Log`, `Neg`, `Abs`, `Erf`, `Sin`, `Cos`, `Sign`, `Floor`, `Ceil`, `Round`, `IsNaN`, `IsInf` (1.0 or 0.0) after a conv or linear read only by it | fused into it (`act`) |
//! | the same elsewhere | `activation` |
//! | `MaxPool`, `AveragePool` (2-D, asymmetric pads, `ceil_mode`, `count_include_pad`), `GlobalAveragePool`, `GlobalMaxPool` | `pool2d` |
//! | `ReduceMean`/`ReduceMax` over both spatial axes of an NCHW tensor, keeping dimensions | global `pool2d` (the dynamo exporter's adaptive pool) |
//! | `ReduceMean`, `ReduceSum`, `ReduceMax`, `ReduceMin`, `ReduceProd`, `ReduceL1`, `ReduceL2`, `ReduceSumSquare`, `ReduceLogSum`, `ReduceLogSumExp` (shifted by the maximum) over consecutive axes (named in any order, or all), `ArgMax`, `ArgMin` (`select_last_index` too; the index a float), otherwise | `reduce` (the axes kept with extent 1 or dropped, as `keepdims` says) |
//! | `Add`, `Mul`, `Sum` (numpy broadcasting) | `elementwise` |
//! | `Sub`, `Div`, `Pow`, `Max`, `Min`, and the comparisons `Equal`, `Less`, `Greater`, `LessOrEqual`, `GreaterOrEqual` (booleans as 1.0 and 0.0), of two operands (numpy broadcasting) | `binary` |
//! | `Add`/`Sub` of a constant after a conv or linear | folded into its bias |
//! | `Mul`/`Div` by a scalar (or per-channel) constant after a conv or linear | folded into its weights (and bias) |
//! | `Mul`/`Div` by a scalar constant after a `MatMul` of two activations (attention's `1 / sqrt(head size)`), or of its operands before it, each read by the `MatMul` only (PyTorch's export of `scaled_dot_product_attention`) | the `batch_matmul`'s `alpha` |
//! | a constant operand that does not fold (a position embedding, an attention mask) | a `constant` node (not an operator) |
//! | `Concat` | `concat`; a concat read only by another concat on the same axis dissolves into it |
//! | `Gemm` (`alpha`, `beta`, `transB`; `transA` is unsupported), `MatMul` with a constant matrix | `linear` (weight in PyTorch's `[out, in]` layout; bias from `C`, or from a following `Add`) |
//! | `MatMul` of two activations | `batch_matmul`; a `Transpose` of the last two axes before it becomes `transpose_b` |
//! | `Softmax`, `LogSoftmax` | `softmax`, `log_softmax` |
//! | `LayerNormalization` | `layer_norm` |
//! | `Gather` of a constant 2-D table by activation indices along axis 0 (token ids) | `embedding` (the table its `weight`) |
//! | `GatherElements` with an operand known only at run time (RoBERTa's token types gathered at its position ids) | `gather_elements` (a constant operand a `constant` node) |
//! | `CumSum` of an activation (`exclusive`, `reverse`; its axis constant) | `cum_sum` |
//! | `Gather` of one constant index along axis 1 of an activation (the first token: BERT's pooler, ViT's class token) | removed: the consumers read that channel slice (a `reshape` of it for a scalar index) |
//! | `Pad` (constant mode) | `pad` |
//! | `Resize` of the spatial axes of a 4-D tensor, nearest (every `nearest_mode`) or linear, every `coordinate_transformation_mode` but `tf_crop_and_resize`, `scales` or `sizes` (also through `axes`), no `antialias`; `Upsample` and opset 10's `Resize` (asymmetric, truncating when enlarging and rounding up when shrinking) | `resize` (the given scales kept: the coordinates divide by them) |
//! | `Reshape`, `Flatten`, `Squeeze`, `Unsqueeze` | `reshape` (a view); removed when the shape does not change |
//! | `Transpose` | `transpose`; removed for the identity permutation |
//! | `Identity`, `Dropout`, `Cast` of an activation | removed |
//! | `Split`, `Slice` along axis 1 (channels) | removed: consumers read channel slices |
//! | `Split`, unit-step `Slice` along other axes (GPT-2's fused query, key and value; crops) | `slice`, one per axis cut (a slab copy) |
//! | GELU, layer norm and swish written out (`Div, Erf, Add, Mul, Mul`; GPT-2's tanh GELU `Pow, Mul, Add, Mul, Tanh, Add, Mul, Mul`; `ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add`; `Sigmoid, Mul` as PyTorch exports SiLU, or `Mul, Sigmoid, Mul`) | rewritten into one `Gelu` / `LayerNormalization` / `Swish` first (only when their constants are the right ones) |
//! | `Where` (the condition's booleans 1.0 and 0.0; numpy broadcasting) | `where` |
//! | `And`, `Or`, `Xor`, `Not` of booleans (1.0 and 0.0) | `binary` `min`, `max`, `not_equal`, and `equal` to a constant 0 |
//! | `Expand` | `expand` (one copy); removed where the shape does not change |
//! | other reductions (of axes apart), other `Gather`s, `Slice`s with other steps, other resizes (cubic, crop and resize, of the batch or channels) | `opaque` with the shape we compute (scheduling only: no executor runs them) |
//! | `Constant`, `Shape`, `Size`, and any node whose inputs are all constants | evaluated at import (shape arithmetic), no operator |
//! | anything else | an error listing every unsupported type with its count; with [`OnnxOptions::allow_unknown`], `opaque` |
//!
//! "Read only by it" means the tensor has exactly one consumer and is not a graph output, so
//! folding never changes what another operator sees. After folding, a torchvision
//! conv-BN-ReLU is one `conv2d` with a bias and a fused ReLU, as in the model zoo.
//!
//! `opaque` operators ([`opsched_graph::Op::Opaque`]) keep the ONNX type name and the output
//! shape; they are costed by their tensor sizes (one memory-bound pass). The output shape of an
//! unknown operator comes from the model's `value_info` (run `onnx.shape_inference` on models
//! that lack it); failing that, the shape of its first input is assumed, with a warning.
//!
//! ## Shapes and the batch dimension
//! Graph input shapes come from the model; a symbolic or unknown first dimension takes
//! [`OnnxOptions::batch`] (default 1), other symbolic dimensions take their value from
//! [`OnnxOptions::dims`] (by symbol name), else the import fails naming the input and the
//! symbol. Every other shape is inferred by the IR's own rules (`Op::infer_shape`); shape
//! computations in the graph (`Shape -> Gather -> Concat -> Reshape`) are evaluated on these
//! concrete shapes, so a model exported with a dynamic batch imports at any batch size.
//! A model with a fixed batch dimension keeps it (a warning says so when another was asked).
//!
//! ## Blocks
//! Exporters name nodes after the module they come from (`/layer1/layer1.0/conv1/Conv`,
//! `/Mixed_5b/branch1x1/conv/Conv`; PyTorch's dynamo exporter records the same path in the
//! node's `pkg.torch.onnx.name_scopes` metadata, which we read when the name has none). Operators are grouped into blocks by their top-level
//! module when it has operators of its own (`/Mixed_5b/Concat`: an Inception module), else by
//! the child of that container (`layer1.0`: a bottleneck; `features/denseblock1`), which gives
//! IOS and IOPS the same parts as the zoo's Inception modules and bottlenecks. Single-operator
//! groups are not blocks; models whose node names carry no module path get no blocks.
//!
//! ## Weights
//! With [`OnnxOptions::weights`], every initializer is read: `raw_data` or the typed fields, in
//! float, float16, bfloat16, double and the integer types (all converted to `f32`), and
//! external data (`location`, `offset`, `length`). The folds above are then applied to the
//! values, so the graph's parameters are exactly what its operators need (the table of names
//! and layouts is in `opsched_graph::weights`). Without the option, only small integer tensors
//! that shapes depend on are read; `inspect` and `compare` never touch the weights.
//!
//! External data is read only from regular files inside the model's folder ([`data`]): an
//! absolute location, one with `..`, one that resolves (through symbolic links) outside the
//! folder, or one that is not a regular file (a FIFO, a device, a directory, a `/proc` file)
//! is an error naming the location; the file type is checked before opening, so a FIFO never
//! blocks, and no error quotes the file's bytes. Files are read with positioned reads, not
//! memory-mapped: `memmap2`'s map is `unsafe` (forbidden outside crates/gpu), every value is
//! converted to `f32` anyway, and a mapped file truncated by another process would kill the
//! reader with `SIGBUS` instead of giving an error.
//!
//! ## Hostile files
//! Every size read from a file is checked (`checked_mul`, `try_from`; tensors of more than
//! 2^40 values and shapes whose operators would be implausibly large are refused before anything
//! is allocated); the graph is checked at the door for nodes without inputs or outputs, two
//! writers of one tensor, cycles and outputs nothing produces. Errors name the node (and its
//! type), graph input, graph output or initializer. `fixtures/bad/onnx` holds one regression
//! file per case (written by `xtask/fixtures/make_bad_onnx.py`), with its stated error in
//! `tests/hostile.rs`.
//!
//! ## Limits
//! Control flow (`If`, `Loop`, `Scan`) and sequences are not supported (with `allow_unknown`
//! they are opaque operators without their sub-graphs). Shape computations are evaluated for
//! the operators exporters use for them (`Shape`, `Gather`, `Unsqueeze`, `Concat`, `Slice`,
//! `Cast`, arithmetic, comparisons, `Where`, `Range`, `ConstantOfShape`, `Expand`); a shape
//! that depends on anything else is an error naming the node. Convolutions and pools are 2-D.
//!
//! ## Element type
//! The element type is that of the first floating-point graph input (float16 and bfloat16 are
//! `f16`, float and double `f32`) unless [`OnnxOptions::dtype`] says otherwise.

mod compute;
pub mod consts;
pub mod data;
pub mod error;
mod fold;
mod import;
mod patterns;
pub mod proto;
pub mod shapes;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use opsched_graph::{DType, Graph};
use prost::Message;

pub use error::{OnnxError, Result};

/// How to import a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OnnxOptions {
    /// Import unsupported operators as opaque operators instead of failing.
    pub allow_unknown: bool,
    /// Size of a symbolic or unknown first dimension of a graph input (default 1).
    pub batch: usize,
    /// Values of other symbolic dimensions, by symbol name (e.g. `"sequence" -> 128`); a name
    /// given here also overrides the batch rule for a first dimension of that name.
    pub dims: HashMap<String, usize>,
    /// Element type of the graph; `None` takes the model's.
    pub dtype: Option<DType>,
    /// Load every initializer's values (inline or from external data files) and attach them
    /// to the graph as its weights ([`Graph::weights`]), folds applied. Off by default:
    /// scheduling needs only shapes, and a model's weights may be large or absent.
    pub weights: bool,
}

impl Default for OnnxOptions {
    fn default() -> Self {
        OnnxOptions {
            allow_unknown: false,
            batch: 1,
            dims: HashMap::new(),
            dtype: None,
            weights: false,
        }
    }
}

/// What the import did, for logs, `inspect` and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportReport {
    /// Version of the default (`ai.onnx`) operator set.
    pub opset: i64,
    /// Producer name and version, as the file says.
    pub producer: String,
    /// Nodes in the ONNX graph.
    pub onnx_nodes: usize,
    /// Operators in the imported graph.
    pub ops: usize,
    /// Batch norms folded into the convolution (or linear layer) before them.
    pub folded_batch_norms: usize,
    /// Activations fused into the convolution or linear layer before them.
    pub fused_activations: usize,
    /// Constant biases and scales folded into the operator before them.
    pub folded_constants: usize,
    /// Concats dissolved into the concat that reads them.
    pub merged_concats: usize,
    /// Operators removed: identities, dropouts, casts, no-op reshapes, channel splits and
    /// slices, transposes folded into a matmul.
    pub removed: usize,
    /// Decomposed GELUs, layer norms and swishes rewritten into one operator each.
    pub rewritten_patterns: usize,
    /// Nodes evaluated at import: constants and computations on constants.
    pub constant_nodes: usize,
    /// Whether a graph input's first dimension was symbolic (it took the batch size).
    pub dynamic_batch: bool,
    /// Opaque operators in the graph by ONNX type (supported ones without an IR operator of
    /// their own, and the unknown ones below).
    pub opaque: BTreeMap<String, usize>,
    /// Unsupported operators imported as opaque ones (with `allow_unknown`), by type.
    pub unknown: BTreeMap<String, usize>,
    /// Initializers whose values were loaded ([`OnnxOptions::weights`]).
    pub loaded_weights: usize,
}

/// An imported model and what the import did.
#[derive(Clone, Debug)]
pub struct Imported {
    pub graph: Graph,
    pub report: ImportReport,
}

/// Whether `path` names an ONNX file (by its extension, `.onnx`, any case).
pub fn is_onnx_path(path: impl AsRef<Path>) -> bool {
    path.as_ref()
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// Import an ONNX model from its bytes. `name` names the graph; `base_dir` is where external
/// data files would be (only small shape tensors are ever read from them).
pub fn import_bytes(
    bytes: impl Into<bytes::Bytes>,
    name: &str,
    base_dir: Option<&Path>,
    opts: &OnnxOptions,
) -> Result<Imported> {
    let bytes: bytes::Bytes = bytes.into();
    if bytes.is_empty() {
        return Err(OnnxError::NotAModel("the file is empty".into()));
    }
    let model = proto::ModelProto::decode(bytes)?;
    if model.graph.is_none() && model.opset_import.is_empty() {
        return Err(OnnxError::NotAModel(
            "no graph and no operator sets (is this an ONNX file?)".into(),
        ));
    }
    let (graph, report) =
        import::import(&model, name, base_dir, opts).map_err(OnnxError::escape_controls)?;
    Ok(Imported { graph, report })
}

/// Import an ONNX file; errors name the file. The graph is named after the file's stem.
pub fn import_file(path: impl AsRef<Path>, opts: &OnnxOptions) -> Result<Imported> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|error| OnnxError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "onnx".into());
    import_bytes(bytes, &name, path.parent(), opts).map_err(|e| e.in_file(path))
}

/// Load an ONNX file as a graph; errors name the file.
pub fn load_file(path: impl AsRef<Path>, opts: &OnnxOptions) -> Result<Graph> {
    import_file(path, opts).map(|i| i.graph)
}
