//! ONNX protobuf import (no external data: no base folder is given).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let opts = opsched_onnx::OnnxOptions::default();
    let _ = opsched_onnx::import_bytes(data.to_vec(), "fuzz", None, &opts);
});
