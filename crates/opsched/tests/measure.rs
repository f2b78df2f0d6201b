//! The measuring half of calibration on the CPU device: every kind of sample comes out, the
//! file checks as a measurement file, and each run's schedule reads back for its model.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use opsched::cost::measurements::{Measurements, OverheadKind};
use opsched::measure::{measure, MeasureOptions, CONTENTION_CONVS};
use opsched::runtime::{CpuDevice, KernelOptions};
use opsched::zoo::ZooConfig;

#[test]
fn a_cpu_measurement_file_has_every_sample_and_checks() {
    let o = MeasureOptions {
        preset: "h100".into(),
        models: vec!["squeezenet".into()],
        batches: vec![1],
        input_size: Some(32),
        algorithms: vec!["sequential".into(), "lios".into()],
        streams: 4,
        warmup: 0,
        repeats: 2,
        copies: 2,
        kernels: KernelOptions::default(),
        measured_on: "2026-11-23".into(),
        revision: "test".into(),
    };
    let mut heard = Vec::new();
    let m = measure(&CpuDevice::new(), &o, |w| heard.push(w.to_string())).unwrap();
    assert!(
        heard.iter().any(|w| w == "squeezenet b1: lios"),
        "{heard:?}"
    );
    // Overheads: one per kernel, then fork/join and chains at 2, 4 and 8 streams, then eager.
    let kinds: Vec<(OverheadKind, Option<u32>)> =
        m.overheads.iter().map(|s| (s.what, s.streams)).collect();
    assert_eq!(kinds.len(), 8);
    assert_eq!(kinds[0], (OverheadKind::GraphKernel, None));
    for s in [2, 4, 8] {
        assert!(kinds.contains(&(OverheadKind::ForkJoin, Some(s))));
        assert!(kinds.contains(&(OverheadKind::Chains, Some(s))));
    }
    assert!(m.overheads.iter().all(|s| s.us.is_finite() && s.us > 0.0));
    assert_eq!(m.contention.len(), CONTENTION_CONVS.len());
    // One operator per distinct signature, named by its node.
    let g = opsched::load_model(
        "squeezenet",
        &ZooConfig {
            batch: 1,
            input_size: Some(32),
            ..ZooConfig::default()
        },
    )
    .unwrap();
    assert_eq!(m.ops.len(), opsched::profiler::distinct_ops(&g).len());
    for s in &m.ops {
        let id = g.find(&s.node).unwrap();
        assert_eq!(s.signature, opsched::cost::signature::op_signature(&g, id));
    }
    assert_eq!(m.runs.len(), 2);
    for r in &m.runs {
        let doc = r.schedule.as_ref().unwrap();
        opsched::schedule::io::from_json(&g, doc).unwrap();
        assert_eq!(r.ms.len(), 1);
    }
    // It checks as a measurement file (floats may differ in their last digit after JSON).
    let text = serde_json::to_string(&m).unwrap();
    let back = Measurements::parse(&text, Path::new("m.json")).unwrap();
    assert_eq!(
        (
            back.overheads.len(),
            back.contention.len(),
            back.ops.len(),
            back.runs.len()
        ),
        (8, CONTENTION_CONVS.len(), m.ops.len(), 2)
    );
}
