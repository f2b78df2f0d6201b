//! The cost cache file: opened from a scratch folder of this process (a damaged file is moved
//! aside there), then cleared for the next input.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("opsched-fuzz-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch folder");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = scratch();
    let path = dir.join("cache.bin");
    std::fs::write(&path, data).expect("scratch file");
    if let Ok(cache) = opsched_cost::cache::CostCache::open(&path) {
        let _ = cache.len();
    }
    for entry in std::fs::read_dir(dir).expect("scratch folder").flatten() {
        let _ = std::fs::remove_file(entry.path());
    }
});
