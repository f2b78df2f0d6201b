//! The CPU device's stream threads and their thread pools. A plan's only compute stream runs
//! its kernels' parallel loops on a pool of its own (its thread is worker 0), several compute
//! streams share rayon's global pool: the same bits either way, and a stream takes its
//! threads with it. A test binary of its own, since it counts this process's threads.
#![allow(clippy::unwrap_used)]

use opsched_gpu::program::GraphProgram;
use opsched_gpu::{CpuDevice, Device, KernelOptions};
use opsched_graph::zoo::{self, ZooConfig};
use opsched_graph::Graph;

/// SqueezeNet on a 64x64 image: convolutions, poolings and concatenations, in a moment.
fn model() -> (Graph, GraphProgram) {
    let cfg = ZooConfig {
        input_size: Some(64),
        ..ZooConfig::default()
    };
    let g = zoo::build("squeezenet", &cfg).unwrap();
    let p = GraphProgram::single_gpu(&g).unwrap();
    (g, p)
}

/// This process's threads, by name (as the kernel keeps it: 15 bytes at most).
fn threads() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let comm = |t: std::fs::DirEntry| std::fs::read_to_string(t.path().join("comm")).ok();
    tasks
        .flatten()
        .filter_map(comm)
        .map(|c| c.trim().to_string())
        .collect()
}

/// Run every operator of `p` in order on the first of `streams` compute streams (each given
/// every operator, as a plan's streams are) on a fresh device: the last one's output, and the
/// stream pools' threads while the device lived.
fn run(g: &Graph, p: &GraphProgram, streams: usize) -> (Vec<f32>, usize) {
    let dev = CpuDevice::new();
    let mem = dev.alloc(p, &vec![0; p.gpus.max(1)]).unwrap();
    let opts = KernelOptions::default();
    let order: Vec<_> = g.topo_order().to_vec();
    let ops: Vec<_> = (order.iter())
        .filter_map(|id| p.ops[id.index()].as_ref())
        .map(|op| dev.prepare(p, &mem, op, &opts).unwrap())
        .collect();
    let refs: Vec<_> = ops.iter().collect();
    let mut all: Vec<_> = (0..streams).map(|_| dev.stream(0).unwrap()).collect();
    for s in &mut all {
        dev.fit_stream(s, &refs).unwrap();
    }
    for op in &ops {
        dev.launch(op, &all[0]).unwrap();
    }
    dev.synchronize().unwrap();
    let pooled = threads()
        .iter()
        .filter(|t| t.starts_with("opsched-pool-"))
        .count();
    let last = order.last().unwrap();
    (
        dev.read(&mem, p.outputs[last.index()].unwrap()).unwrap(),
        pooled,
    )
}

#[test]
fn a_lone_compute_stream_computes_the_same_bits_and_leaves_no_threads_behind() {
    let (g, p) = model();
    // Several compute streams: the kernels on rayon's global pool (started here).
    let (shared, pooled) = run(&g, &p, 2);
    assert_eq!(pooled, 0);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let before = threads().len();
    let helpers = rayon::current_num_threads() - 1;
    for _ in 0..8 {
        // (The last run's pool threads end a moment after its stream: not counted here.)
        for _ in 0..100 {
            if !threads().iter().any(|t| t.starts_with("opsched-pool-")) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // One compute stream: a pool of its own (its thread and the helpers), the same bits.
        let (alone, pooled) = run(&g, &p, 1);
        assert_eq!(pooled, helpers);
        assert_eq!(bits(&alone), bits(&shared));
    }
    // The pools' threads end as their streams go (a moment after).
    let mut after = threads().len();
    for _ in 0..100 {
        if after <= before {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        after = threads().len();
    }
    assert!(after <= before, "{before} threads before, {after} after");
}
