//! What a launch costs on the CPU device beyond its kernel: 200 additions of 4096 values one
//! after another on one stream (the host enqueues them, the stream's thread runs them), then
//! a synchronisation, as one inference of a small model's operators is run. The kernels take
//! a fraction of a microsecond each; the rest is the device's queue, bookkeeping and wake-ups.
//!
//! Run: `cargo bench -p opsched-benches --bench cpu_launches`; with `RAYON_NUM_THREADS=1` and
//! `=2` for one and two threads.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use opsched::gpu::program::GraphProgram;
use opsched::gpu::{CpuDevice, Device, KernelOptions};
use opsched::graph::{DType, GraphBuilder};

const OPERATORS: usize = 200;

fn launches(c: &mut Criterion) {
    let mut b = GraphBuilder::new("chain", DType::F32);
    let x = b.input("x", vec![1, 16, 256]);
    let mut t = x;
    for i in 0..OPERATORS {
        t = b.add(&format!("add{i}"), &[t, x]);
    }
    let g = b.finish().expect("a chain of additions");
    let p = GraphProgram::single_gpu(&g).expect("its program");
    let dev = CpuDevice::with_race_check(false);
    let mem = dev.alloc(&p, &[0]).expect("its buffers");
    let opts = KernelOptions::default();
    let ops: Vec<_> = (p.ops.iter().flatten())
        .map(|op| {
            dev.prepare(&p, &mem, op, &opts)
                .expect("a prepared operator")
        })
        .collect();
    let mut s = dev.stream(0).expect("a stream");
    dev.fit_stream(&mut s, &ops.iter().collect::<Vec<_>>())
        .expect("the operators' stream");
    let mut group = c.benchmark_group("cpu_launches");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    group.bench_function(format!("{OPERATORS} additions of 4096"), |bench| {
        bench.iter(|| {
            for op in &ops {
                dev.launch(op, &s).expect("a launch");
            }
            dev.synchronize().expect("every launch done")
        })
    });
    group.finish();
}

criterion_group!(benches, launches);
criterion_main!(benches);
