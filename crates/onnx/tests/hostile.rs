//! Hostile and careless ONNX files (issue #17): every one imports or fails with an error that
//! names what is wrong; none panics, hangs, allocates without bound, reads outside the model's
//! folder or echoes a file's bytes.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use opsched_onnx::proto::ModelProto;
use opsched_onnx::{import_bytes, import_file, OnnxOptions};
use prost::Message;

fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

/// A scratch directory of this test process.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("opsched-hostile-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn decode(path: &Path) -> ModelProto {
    ModelProto::decode(std::fs::read(path).unwrap().as_slice()).unwrap()
}

/// Sets one integer of a model to a value.
type Mutation = Box<dyn Fn(&mut ModelProto, i64)>;

/// Values that break careless arithmetic: zero, negatives, the extremes, sizes past 2^40.
const EXTREMES: [i64; 8] = [0, -1, -(1 << 40), 1 << 40, 1 << 62, i64::MAX, i64::MIN, 3];

/// Every integer a model carries that shapes depend on (attribute ints, small integer
/// initializers, dimensions of initializers and graph inputs), set in turn to each extreme:
/// every import ends, without a panic.
#[test]
fn extreme_integers_anywhere_never_panic() {
    let models = [
        "fixtures/onnx/multi_branch_cnn.onnx",
        "fixtures/onnx/transformer_block_opset13.onnx",
        "fixtures/onnx/dynamic_batch.onnx",
        "fixtures/parity/pooling.onnx",
        "fixtures/parity/attention13.onnx",
        "fixtures/parity/mlp.onnx",
        "fixtures/parity/resize.onnx",
        "fixtures/parity/slices.onnx",
        "fixtures/parity/bert_ids.onnx",
        "fixtures/parity/reduce.onnx",
        "fixtures/parity/math.onnx",
    ];
    let mut imports = 0usize;
    for rel in models {
        let path = repo(rel);
        let base = decode(&path);
        let g = base.graph.clone().unwrap();
        let mut sites: Vec<Mutation> = Vec::new();
        for (n, node) in g.node.iter().enumerate() {
            for (a, attr) in node.attribute.iter().enumerate() {
                sites.push(Box::new(move |m, v| {
                    m.graph.as_mut().unwrap().node[n].attribute[a].i = v;
                }));
                for k in 0..attr.ints.len() {
                    sites.push(Box::new(move |m, v| {
                        m.graph.as_mut().unwrap().node[n].attribute[a].ints[k] = v;
                    }));
                }
            }
        }
        for (t, init) in g.initializer.iter().enumerate() {
            for k in 0..init.dims.len() {
                sites.push(Box::new(move |m, v| {
                    m.graph.as_mut().unwrap().initializer[t].dims[k] = v;
                }));
            }
            if init.data_type == 7 && init.raw_data.len() <= 64 {
                for k in 0..init.raw_data.len() / 8 {
                    sites.push(Box::new(move |m, v| {
                        let t = &mut m.graph.as_mut().unwrap().initializer[t];
                        let mut raw = t.raw_data.to_vec();
                        raw[8 * k..8 * k + 8].copy_from_slice(&v.to_le_bytes());
                        t.raw_data = raw.into();
                    }));
                }
                for k in 0..init.int64_data.len() {
                    sites.push(Box::new(move |m, v| {
                        m.graph.as_mut().unwrap().initializer[t].int64_data[k] = v;
                    }));
                }
            }
        }
        for (i, input) in g.input.iter().enumerate() {
            let dims = input
                .r#type
                .as_ref()
                .and_then(|t| t.tensor_type.as_ref())
                .and_then(|t| t.shape.as_ref())
                .map_or(0, |s| s.dim.len());
            for k in 0..dims {
                sites.push(Box::new(move |m, v| {
                    let d = &mut m.graph.as_mut().unwrap().input[i]
                        .r#type
                        .as_mut()
                        .unwrap()
                        .tensor_type
                        .as_mut()
                        .unwrap()
                        .shape
                        .as_mut()
                        .unwrap()
                        .dim[k];
                    d.dim_value = Some(v);
                    d.dim_param = None;
                }));
            }
        }
        for site in &sites {
            for v in EXTREMES {
                let mut m = base.clone();
                site(&mut m, v);
                let bytes = m.encode_to_vec();
                for weights in [false, true] {
                    let opts = OnnxOptions {
                        allow_unknown: true,
                        weights,
                        batch: 2,
                        ..OnnxOptions::default()
                    };
                    let _ = import_bytes(bytes.clone(), "mutant", path.parent(), &opts);
                    imports += 1;
                }
            }
        }
    }
    assert!(imports > 5000, "{imports} imports");
}

/// What each regression case of `fixtures/bad/onnx` must say: the file (as `opsched inspect`
/// is given it), what is wrong and where (node, input, output or initializer). Every file in
/// the folder must be listed here, so a new case states its expected error.
const BAD_CASES: [(&str, &[&str]); 33] = [
    (
        "concat-dims-overflow",
        &["initializer 'big'", "more than 2^40 elements"],
    ),
    ("conv-group-zero", &["node 'conv' (Conv)", "0 groups"]),
    (
        "conv-pads-2e62",
        &["node 'conv' (Conv)", "exceeds the limit"],
    ),
    (
        "conv-stride-zero",
        &["node 'conv' (Conv)", "strides [0, 1]", "must be positive"],
    ),
    ("cycle", &["node 'a' (Add)", "cycle"]),
    (
        "duplicate-output",
        &["node 'second' (Sigmoid)", "writes 'y'", "node 'first'"],
    ),
    ("empty", &["not an ONNX model", "the file is empty"]),
    (
        "expand-to-2e40",
        &["node 'expand' (Expand)", "implausibly large"],
    ),
    (
        "external-data-absolute",
        &["initializer 'target'", "'/etc/passwd'", "absolute"],
    ),
    (
        "external-data-bad-offset",
        &["initializer 'target'", "offset 'twelve'"],
    ),
    (
        "external-data-beyond-end",
        &["node 'reshape' (Reshape)", "lie beyond the file"],
    ),
    (
        "external-data-directory",
        &["node 'reshape' (Reshape)", "'.'", "not a regular file"],
    ),
    (
        "external-data-empty-location",
        &["initializer 'target'", "location is empty"],
    ),
    (
        "external-data-no-location",
        &["initializer 'target'", "without a location"],
    ),
    (
        "external-data-parent-dir",
        &["initializer 'target'", "leaves the model's folder"],
    ),
    (
        "external-data-proc-environ",
        &["initializer 'target'", "'/proc/self/environ'", "absolute"],
    ),
    (
        "graph-output-unproduced",
        &["graph output 'nowhere'", "not produced"],
    ),
    (
        "initializer-dims-negative",
        &["initializer 'w'", "dimension -1 is negative"],
    ),
    (
        "initializer-dims-overflow",
        &["initializer 'w'", "more than 2^40 elements"],
    ),
    (
        "input-dims-overflow",
        &["graph input 'x'", "implausibly large"],
    ),
    ("input-zero-dim", &["graph input 'x'", "dimension 1 is 0"]),
    (
        "maxpool-pads-2e40",
        &["node 'pool' (MaxPool)", "exceeds the limit"],
    ),
    (
        "node-name-with-newline",
        &[
            "node 'orphan\\nerror: injected line' (Relu)",
            "has no inputs",
        ],
    ),
    (
        "node-without-inputs",
        &["node 'orphan' (Relu)", "has no inputs"],
    ),
    (
        "node-without-outputs",
        &["node 'silent' (Relu)", "has no output"],
    ),
    ("not-protobuf", &["not an ONNX model", "does not decode"]),
    (
        "output-overwrites-initializer",
        &["node 'relu' (Relu)", "writes 'w'", "initializer"],
    ),
    (
        "range-start-after-limit",
        &["node 'reshape' (Reshape)", "into []"],
    ),
    (
        "reshape-to-2e40",
        &["node 'reshape' (Reshape)", "[1, 1099511627776]"],
    ),
    (
        "shape-slice-start-after-end",
        &["node 'reshape' (Reshape)", "into []"],
    ),
    (
        "slice-of-2e40-dims",
        &["node 'reshape' (Reshape)", "not known"],
    ),
    (
        "slice-start-after-end",
        &["node 'slice' (Slice)", "[1, 0, 8, 8]"],
    ),
    ("truncated", &["does not decode", "truncated"]),
];

/// An import's error, checked to be one line naming the file.
fn one_line_error(path: &Path, opts: &OnnxOptions) -> String {
    let err = match import_file(path, opts) {
        Ok(_) => panic!("{} imported without an error", path.display()),
        Err(e) => e.to_string(),
    };
    assert!(
        !err.contains('\n'),
        "{}: not one line: {err}",
        path.display()
    );
    assert!(
        err.starts_with(&path.display().to_string()),
        "{}: does not name the file: {err}",
        path.display()
    );
    err
}

/// Every regression case fails with its stated error, with and without loading weights, and
/// every file in the folder is a stated case.
#[test]
fn regression_cases_fail_with_their_stated_errors() {
    let dir = repo("fixtures/bad/onnx");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let stated: Vec<String> = BAD_CASES.iter().map(|(f, _)| format!("{f}.onnx")).collect();
    assert_eq!(files, stated, "fixtures/bad/onnx and BAD_CASES differ");
    for (name, expected) in BAD_CASES {
        let path = dir.join(format!("{name}.onnx"));
        let err = one_line_error(&path, &OnnxOptions::default());
        for e in expected {
            assert!(err.contains(e), "{name}: expected '{e}' in: {err}");
        }
        let weights = OnnxOptions {
            weights: true,
            ..OnnxOptions::default()
        };
        one_line_error(&path, &weights);
    }
}

/// A copy of the case that reshapes by a tensor kept in external data, reading it from
/// `location`, written into `dir`.
fn external_case(dir: &Path, location: &str) -> PathBuf {
    let mut m = decode(&repo("fixtures/bad/onnx/external-data-absolute.onnx"));
    let t = &mut m.graph.as_mut().unwrap().initializer[0];
    let entry = t
        .external_data
        .iter_mut()
        .find(|e| e.key == "location")
        .unwrap();
    entry.value = location.to_string();
    let path = dir.join("model.onnx");
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    path
}

/// External data through links out of the model's folder, FIFOs and /proc files is refused by
/// name, without blocking and without quoting a byte of what it points at; a regular file
/// inside the folder (also through a link that stays inside) is read.
#[cfg(unix)]
#[test]
fn external_data_stays_in_the_models_folder() {
    use std::os::unix::fs::symlink;
    let root = scratch("confine");
    let models = root.join("models");
    std::fs::create_dir_all(models.join("sub")).unwrap();
    let secret = root.join("secret.bin");
    let secret_text = "SECRETSECRETSECR";
    std::fs::write(&secret, secret_text).unwrap();
    symlink(&secret, models.join("out-link")).unwrap();
    symlink("/proc/self/environ", models.join("environ-link")).unwrap();
    symlink(&root, models.join("parent-link")).unwrap();
    let fifo = models.join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo failed");
    // Two int64 values: the target shape [4, 64] of the 1x4x8x8 input.
    let target: Vec<u8> = [4i64, 64].iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(models.join("sub/target.bin"), &target).unwrap();
    symlink("sub/target.bin", models.join("in-link")).unwrap();

    for (location, why) in [
        ("out-link", "outside the model's folder"),
        ("environ-link", "outside the model's folder"),
        ("parent-link/secret.bin", "outside the model's folder"),
        ("fifo", "not a regular file"),
        ("sub", "not a regular file"),
        ("missing.bin", "no such file"),
    ] {
        let path = external_case(&models, location);
        let err = one_line_error(&path, &OnnxOptions::default());
        assert!(err.contains(&format!("'{location}'")), "{location}: {err}");
        assert!(err.contains(why), "{location}: expected '{why}' in: {err}");
        assert!(!err.contains("SECRET"), "{location}: leaks the file: {err}");
    }
    for location in ["sub/target.bin", "in-link"] {
        let path = external_case(&models, location);
        let g = import_file(&path, &OnnxOptions::default())
            .unwrap_or_else(|e| panic!("{location}: {e}"))
            .graph;
        let out = &g.outputs()[0];
        assert_eq!(
            g.value_shape(&out.value).unwrap(),
            vec![4, 64],
            "{location}"
        );
    }
    std::fs::remove_dir_all(&root).unwrap();
}

/// Single-byte changes all over the parity models, imported with their weights (so values are
/// decoded and folded, and external data read from the model's folder): each imports or fails
/// with an error, never a panic.
#[test]
fn byte_mutations_with_weights_never_panic() {
    let opts = OnnxOptions {
        allow_unknown: true,
        weights: true,
        batch: 2,
        ..OnnxOptions::default()
    };
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let (mut imported, mut failed) = (0usize, 0usize);
    for name in [
        "conv_bn_relu",
        "grouped",
        "pooling",
        "activations",
        "squeeze_excite",
        "mlp",
        "attention13",
        "external_data",
        "swish",
        "resize",
        "bert_ids",
        "slices",
        "reduce",
        "math",
        "sdpa",
        "compare",
        "reductions",
        "unary",
    ] {
        let path = repo(&format!("fixtures/parity/{name}.onnx"));
        let bytes = std::fs::read(&path).unwrap();
        for _ in 0..400 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mut b = bytes.clone();
            let at = usize::try_from(state % b.len() as u64).unwrap();
            b[at] = state.to_le_bytes()[4];
            match import_bytes(b, name, path.parent(), &opts) {
                Ok(_) => imported += 1,
                Err(e) => {
                    assert!(!e.to_string().contains('\n'), "{name}: {e}");
                    failed += 1;
                }
            }
        }
    }
    // Both outcomes occur: the mutations reach the weights and the structure.
    assert!(
        imported > 100 && failed > 100,
        "{imported} imported, {failed} failed"
    );
}
