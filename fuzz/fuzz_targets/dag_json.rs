//! Cost-annotated DAG JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(g) = opsched_graph::formats::dag::from_str(text) {
            let _ = opsched_graph::formats::dag::to_string(&g);
        }
    }
});
