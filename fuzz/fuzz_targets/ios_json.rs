//! IOS graph JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(g) = opsched_graph::formats::ios::from_str(text) {
            // A graph that loads also exports.
            let _ = opsched_graph::formats::ios::to_string(&g);
        }
    }
});
