//! Scheduling time of every algorithm on Inception-v3, RandWire and NASNet under the analytical
//! H100 model (one thread), and of HIOS-LP on the default 200-op HIOS instance on 4 GPUs.
//!
//! Run: `cargo bench -p opsched-benches` (add `-- ios` to filter). Targets (issue 4/5): LIOS,
//! Opara, greedy and Nimble under 10 ms on NASNet; IOS (r=3, s=8) under 0.5 s on Inception-v3
//! and 5 s on NASNet; IOPS under 10 s on NASNet; HIOS-LP under 100 ms on the HIOS instance.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use opsched::cost::{AnalyticalModel, CostModel, DevicePreset, HiosSimLaw, LinkPreset};
use opsched::graph::random::{layered_dag, LayeredDagParams};
use opsched::schedule::Platform;
use opsched::zoo::ZooConfig;
use opsched::SchedulerOptions;

fn platform(gpus: usize) -> Platform {
    Platform {
        gpus,
        streams: 8,
        device: DevicePreset::by_name("h100").expect("h100 preset"),
        link: LinkPreset::by_name("nvlink4").expect("nvlink4 preset"),
    }
}

fn zoo(c: &mut Criterion) {
    let p = platform(1);
    let cost = AnalyticalModel::new(p.device.clone(), p.link.clone());
    let opts = SchedulerOptions::default();
    for model in ["inception_v3", "randwire", "nasnet"] {
        let g = opsched::zoo::build(model, &ZooConfig::default()).expect("zoo model");
        let mut group = c.benchmark_group(format!("schedule/{model}"));
        group
            .measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_millis(500));
        for info in opsched::schedulers()
            .iter()
            .filter(|s| !s.name.contains("rand"))
        {
            let sched = opsched::scheduler_with(info.name, &opts).expect("registered");
            // The slow searches get fewer samples; their time is what we measure, not noise.
            if matches!(info.name, "ios" | "ios-parallel" | "iops") {
                group.sample_size(10);
            } else {
                group.sample_size(30);
            }
            group.bench_function(BenchmarkId::from_parameter(info.name), |b| {
                b.iter(|| {
                    sched
                        .schedule(&g, &p, &cost as &dyn CostModel)
                        .expect("schedules")
                })
            });
        }
        group.finish();
    }
}

fn hios_instance(c: &mut Criterion) {
    let p = platform(4);
    let g = layered_dag(&LayeredDagParams::default()).expect("default instance");
    let cost = HiosSimLaw::new(AnalyticalModel::new(p.device.clone(), p.link.clone()));
    let mut group = c.benchmark_group("schedule/hios-200ops-4gpus");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(3));
    for name in ["hios-lp", "hios-mr", "hios-lp-inter", "hios-mr-inter"] {
        let sched = opsched::scheduler(name).expect("registered");
        group.bench_function(name, |b| {
            b.iter(|| sched.schedule(&g, &p, &cost).expect("schedules"))
        });
    }
    group.finish();
}

criterion_group!(benches, zoo, hios_instance);
criterion_main!(benches);
