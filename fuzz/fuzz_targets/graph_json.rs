//! opsched graph JSON, and whatever `formats::from_str` detects: an error or a valid graph,
//! never a panic, hang or runaway allocation.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = opsched_graph::formats::json::from_str(text);
        let _ = opsched_graph::formats::from_str(text);
    }
});
