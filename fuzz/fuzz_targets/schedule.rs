//! Schedule files, read against SqueezeNet (a zoo model): parse; what parses is validated on
//! a platform as large as it asks for (bounded), and what validates is lowered and simulated.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use opsched_cost::{AnalyticalModel, DevicePreset, LinkPreset};
use opsched_graph::zoo::{self, ZooConfig};
use opsched_graph::Graph;
use opsched_schedule::{Platform, Schedule};

fn graph() -> &'static Graph {
    static G: OnceLock<Graph> = OnceLock::new();
    G.get_or_init(|| zoo::build("squeezenet", &ZooConfig::default()).expect("zoo model"))
}

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let g = graph();
    let Ok(s) = opsched_schedule::io::from_json(g, &doc) else {
        return;
    };
    let (gpus, streams) = match &s {
        Schedule::Stages(p) => (p.gpus.len(), 8),
        Schedule::Streams(p) => (
            p.gpus.len(),
            p.gpus.iter().map(|x| x.streams.len()).max().unwrap_or(1),
        ),
    };
    let platform = Platform {
        gpus: gpus.max(1),
        streams: streams.max(1),
        device: DevicePreset::by_name("h100").expect("preset"),
        link: LinkPreset::by_name("nvlink4").expect("preset"),
    };
    if platform.check("fuzz").is_err() || opsched_schedule::validate(g, &s, &platform).is_err() {
        return;
    }
    let plan = opsched_schedule::lower(g, &s).expect("a valid schedule lowers");
    let cost = AnalyticalModel::default();
    let _ = opsched_schedule::simulate(g, &plan, &cost);
});
