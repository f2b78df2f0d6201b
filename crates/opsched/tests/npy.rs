//! Model inputs and outputs as NumPy arrays (`opsched::npy`): `--input` arguments, arrays bound
//! to a model's inputs by name with their element type and shape checked (a symbolic batch
//! takes the arrays' batch), errors naming the input or the file, and outputs written as `.npy`
//! or `.npz` that read back unchanged.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn};
use ndarray_npy::WriteNpyExt;
use opsched::graph::Tensor;
use opsched::npy::{self, ArrayError, InputArg, InputArray};
use opsched::zoo::ZooConfig;
use opsched::{Graph, LoadOptions};

/// A scratch directory of this test process.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("opsched-npy-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A tensor of `shape` with distinct values.
fn ramp(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::new(
        shape.to_vec(),
        (0..n).map(|i| i as f32 * 0.25 - 3.0).collect::<Vec<_>>(),
    )
    .unwrap()
}

fn write_npy(path: &Path, t: &Tensor) {
    std::fs::write(
        path,
        npy::encode_outputs(path, &[("x".into(), t.clone())]).unwrap(),
    )
    .unwrap();
}

/// The attention model of the parity set: inputs `hidden [batch, 8, 32]` and `mask [batch, 1,
/// 1, 8]`, loaded at `batch`.
fn attention(batch: usize) -> Graph {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/parity/attention17.onnx");
    let cfg = ZooConfig {
        batch,
        ..ZooConfig::default()
    };
    opsched::load_model_with(path.to_str().unwrap(), &cfg, &LoadOptions::default()).unwrap()
}

fn arg(s: &str) -> InputArg {
    s.parse().unwrap()
}

#[test]
fn input_arguments_are_a_file_or_name_equals_file() {
    assert_eq!(
        arg("x.npy"),
        InputArg {
            name: None,
            path: "x.npy".into()
        }
    );
    assert_eq!(
        arg("hidden=data/h=1.npy"),
        InputArg {
            name: Some("hidden".into()),
            path: "data/h=1.npy".into()
        }
    );
    for bad in ["", "=x.npy", "hidden="] {
        assert!(bad.parse::<InputArg>().is_err(), "'{bad}'");
    }
    // An existing file whose name holds '=' is that file, not NAME=FILE.
    let dir = scratch("args");
    let odd = dir.join("a=b.npy");
    write_npy(&odd, &ramp(&[2]));
    let a = arg(odd.to_str().unwrap());
    assert_eq!(a.name, None);
    assert_eq!(a.path, odd);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn arrays_bind_by_name_and_a_symbolic_batch_takes_theirs() {
    let dir = scratch("bind");
    let (h, m) = (ramp(&[3, 8, 32]), ramp(&[3, 1, 1, 8]));
    write_npy(&dir.join("h.npy"), &h);
    write_npy(&dir.join("m.npy"), &m);
    let args = [
        arg(&format!("mask={}", dir.join("m.npy").display())),
        arg(&format!("hidden={}", dir.join("h.npy").display())),
    ];
    let arrays = npy::read_inputs(&args).unwrap();
    assert_eq!(npy::input_batch(&arrays), Some(3));
    let g = attention(3);
    let bound = npy::bind_inputs(&g, arrays).unwrap();
    assert_eq!(bound.len(), 2);
    assert_eq!(bound[&g.find("hidden").unwrap()], h);
    assert_eq!(bound[&g.find("mask").unwrap()], m);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An array given for an input: its name (`None`: unnamed) and shape.
type Given<'a> = (Option<&'a str>, &'a [usize]);

/// `bind_inputs`' error for `arrays` on the attention model at batch 2.
fn bind_error(arrays: &[Given<'_>]) -> String {
    let arrays = arrays
        .iter()
        .map(|&(name, shape)| InputArray {
            name: name.map(str::to_string),
            path: PathBuf::from(format!("{}.npy", name.unwrap_or("x"))),
            tensor: ramp(shape),
        })
        .collect();
    let e = npy::bind_inputs(&attention(2), arrays).unwrap_err();
    let s = e.to_string();
    assert!(!s.contains('\n'), "not one line: {s}");
    s
}

#[test]
fn inputs_that_do_not_fit_the_model_are_named() {
    let (h, m): (&[usize], &[usize]) = (&[2, 8, 32], &[2, 1, 1, 8]);
    let cases: [(&[Given<'_>], &[&str]); 6] = [
        (
            &[(Some("hidden"), &[2, 8, 31]), (Some("mask"), m)],
            &["input 'hidden'", "hidden.npy", "[2, 8, 31]", "[2, 8, 32]"],
        ),
        (&[(Some("hidden"), h)], &["input 'mask'", "missing"]),
        (
            &[(Some("hidden"), h), (Some("mask"), m), (Some("tokens"), m)],
            &["input 'tokens'", "no such input", "hidden, mask"],
        ),
        (&[(None, h)], &["2 inputs", "hidden, mask", "NAME=FILE"]),
        (
            &[(Some("hidden"), h), (Some("hidden"), h), (Some("mask"), m)],
            &["input 'hidden'", "given twice"],
        ),
        // A batch other than the model's: the shape check names it.
        (
            &[(Some("hidden"), &[3, 8, 32]), (Some("mask"), &[3, 1, 1, 8])],
            &["input 'hidden'", "[3, 8, 32]", "[2, 8, 32]"],
        ),
    ];
    for (arrays, expected) in cases {
        let err = bind_error(arrays);
        for e in expected {
            assert!(err.contains(e), "expected '{e}' in: {err}");
        }
    }
}

/// A version 1.0 `.npy` image of little-endian `float32` values with the shape `shape` (as
/// Python writes it) over `data`, whatever they hold.
fn npy_image(shape: &str, data: &[u8]) -> Vec<u8> {
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&u16::try_from(header.len()).unwrap().to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

#[test]
fn arrays_that_are_not_float32_or_exact_integers_or_not_npy_are_refused_by_file() {
    let dir = scratch("dtype");
    let f64_path = dir.join("double.npy");
    let a = ArrayD::<f64>::zeros(IxDyn(&[2, 3]));
    a.write_npy(std::fs::File::create(&f64_path).unwrap())
        .unwrap();
    // Integers are indices, taken where float32 holds them exactly: not 2^24 + 1.
    let i64_path = dir.join("ints.npy");
    let a = ArrayD::<i64>::from_shape_vec(IxDyn(&[2]), vec![3, (1 << 24) + 1]).unwrap();
    a.write_npy(std::fs::File::create(&i64_path).unwrap())
        .unwrap();
    let ids = dir.join("ids.npy");
    let a = ArrayD::<i64>::from_shape_vec(IxDyn(&[1, 3]), vec![101, -2, 1 << 24]).unwrap();
    a.write_npy(std::fs::File::create(&ids).unwrap()).unwrap();
    let t = npy::read_npy(&ids).unwrap();
    assert_eq!(
        (t.shape.as_slice(), &t.data[..]),
        (&[1, 3][..], &[101.0, -2.0, 16_777_216.0][..])
    );
    let ids32 = dir.join("ids32.npy");
    let a = ArrayD::<i32>::from_shape_vec(IxDyn(&[2]), vec![7, 0]).unwrap();
    a.write_npy(std::fs::File::create(&ids32).unwrap()).unwrap();
    assert_eq!(&npy::read_npy(&ids32).unwrap().data[..], &[7.0, 0.0]);
    // A header claiming 2^40 values over 16 bytes of data: refused before any allocation.
    let huge_path = dir.join("huge.npy");
    std::fs::write(&huge_path, npy_image("(1099511627776,)", &[0u8; 16])).unwrap();
    let malformed = dir.join("malformed.npy");
    std::fs::write(&malformed, npy_image("(4.,)", &[0u8; 16])).unwrap();
    let not_npy = dir.join("text.npy");
    std::fs::write(&not_npy, "hello").unwrap();

    for (path, why) in [
        (&f64_path, "float64"),
        (&i64_path, "int64 value 16777217"),
        (&huge_path, "missing 4398046511088 bytes"),
        (&malformed, "not a readable .npy array"),
        (&not_npy, "not a readable .npy array"),
        (&dir.join("missing.npy"), "missing.npy"),
    ] {
        let e = npy::read_npy(path).unwrap_err();
        assert!(matches!(e, ArrayError::File { .. }), "{e:?}");
        let s = e.to_string();
        assert!(s.starts_with(&path.display().to_string()), "{s}");
        assert!(s.contains(why), "expected '{why}' in: {s}");
        assert!(!s.contains('\n'), "{s}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn outputs_round_trip_through_npy_and_npz() {
    let dir = scratch("out");
    let (a, b) = (ramp(&[2, 5]), ramp(&[1, 3, 2, 2]));
    let one = dir.join("y.npy");
    std::fs::write(
        &one,
        npy::encode_outputs(&one, &[("y".into(), a.clone())]).unwrap(),
    )
    .unwrap();
    assert_eq!(npy::read_npy(&one).unwrap(), a);

    let all = dir.join("out.NPZ");
    let outputs = vec![
        ("logits".to_string(), a.clone()),
        ("attn/probs".to_string(), b.clone()),
    ];
    std::fs::write(&all, npy::encode_outputs(&all, &outputs).unwrap()).unwrap();
    let mut back = npy::read_npz(&all).unwrap();
    back.sort_by(|x, y| x.0.cmp(&y.0));
    let mut want = outputs.clone();
    want.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(back, want);

    let e = npy::encode_outputs(&one, &outputs).unwrap_err().to_string();
    assert!(
        e.contains("2 outputs (logits, attn/probs)") && e.contains(".npz"),
        "{e}"
    );
    let e = npy::encode_outputs(&dir.join("y.csv"), &outputs[..1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("y.csv") && e.contains(".npy"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
