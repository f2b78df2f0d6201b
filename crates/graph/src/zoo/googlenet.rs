//! GoogLeNet / Inception-v1 (Szegedy et al. 2015) as torchvision defines it
//! (`torchvision.models.googlenet`), without the auxiliary heads and without the input
//! transform. Batch norm is folded into every convolution (a bias) and the relu is fused.
//! As in torchvision, the "5x5" branch of each inception module uses a 3x3 convolution, and
//! the max pools use `ceil_mode`.
//!
//! Counts at 224x224:
//! - stem: conv7x7/2, maxpool, conv1x1, conv3x3, maxpool = 5 ops, a chain of 4 edges;
//! - each of the 9 inception modules: 6 convs + 1 max pool + 1 concat = 8 ops; edges: 4 from
//!   the module input (1x1, 3x3 reduce, 5x5 reduce, pool), 3 inside the branches, 4 into the
//!   concat = 11;
//! - max pools 3 and 4 between the stages: 2 ops, 1 edge each into them (the edges out of
//!   them are counted by the next module);
//! - head: global average pool, reshape, linear = 3 ops, 3 edges (from 5b's concat on).
//!
//! Ops: 5 + 9 * 8 + 2 + 3 = 82; edges: 4 + 9 * 11 + 2 + 3 = 108.

use crate::builder::GraphBuilder;
use crate::error::Result;
use crate::graph::{Graph, NodeId};
use crate::op::{Activation, Conv2d, Op, Pool2d};
use crate::zoo::ZooConfig;

/// A convolution with folded batch norm and relu, `k x k` with "same" padding.
fn conv(b: &mut GraphBuilder, name: &str, x: NodeId, out: usize, k: usize) -> NodeId {
    b.conv(name, x, Conv2d::new(out, k).bias(true).relu())
}

/// Channels of an inception module: 1x1, 3x3 reduce, 3x3, 5x5 reduce, "5x5", pool projection.
struct Module {
    name: &'static str,
    ch1x1: usize,
    ch3x3red: usize,
    ch3x3: usize,
    ch5x5red: usize,
    ch5x5: usize,
    pool_proj: usize,
}

const fn module(
    name: &'static str,
    [ch1x1, ch3x3red, ch3x3, ch5x5red, ch5x5, pool_proj]: [usize; 6],
) -> Module {
    Module {
        name,
        ch1x1,
        ch3x3red,
        ch3x3,
        ch5x5red,
        ch5x5,
        pool_proj,
    }
}

fn inception(b: &mut GraphBuilder, m: &Module, x: NodeId) -> NodeId {
    let n = m.name;
    b.block(n);
    let b1 = conv(b, &format!("{n}.branch1"), x, m.ch1x1, 1);

    let b2 = conv(b, &format!("{n}.branch2_1"), x, m.ch3x3red, 1);
    let b2 = conv(b, &format!("{n}.branch2_2"), b2, m.ch3x3, 3);

    // torchvision's "5x5" branch is a 3x3 convolution.
    let b3 = conv(b, &format!("{n}.branch3_1"), x, m.ch5x5red, 1);
    let b3 = conv(b, &format!("{n}.branch3_2"), b3, m.ch5x5, 3);

    let b4 = b.pool(&format!("{n}.branch4_1"), x, Pool2d::max(3, 1, 1).ceil());
    let b4 = conv(b, &format!("{n}.branch4_2"), b4, m.pool_proj, 1);
    b.concat(&format!("{n}.concat"), &[b1, b2, b3, b4])
}

const STAGE3: [Module; 2] = [
    module("inception3a", [64, 96, 128, 16, 32, 32]),
    module("inception3b", [128, 128, 192, 32, 96, 64]),
];
const STAGE4: [Module; 5] = [
    module("inception4a", [192, 96, 208, 16, 48, 64]),
    module("inception4b", [160, 112, 224, 24, 64, 64]),
    module("inception4c", [128, 128, 256, 24, 64, 64]),
    module("inception4d", [112, 144, 288, 32, 64, 64]),
    module("inception4e", [256, 160, 320, 32, 128, 128]),
];
const STAGE5: [Module; 2] = [
    module("inception5a", [256, 160, 320, 32, 128, 128]),
    module("inception5b", [384, 192, 384, 48, 128, 128]),
];

pub(super) fn build(cfg: &ZooConfig, size: usize) -> Result<Graph> {
    let mut b = GraphBuilder::new("googlenet", cfg.dtype);
    let x = b.input("input", vec![cfg.batch, 3, size, size]);

    b.block("stem");
    let x = b.conv(
        "stem.conv1",
        x,
        Conv2d::new(64, 7).stride(2).bias(true).relu(),
    ); // 64 x 112 x 112
    let x = b.pool("stem.maxpool1", x, Pool2d::max(3, 2, 0).ceil()); // 64 x 56 x 56
    let x = conv(&mut b, "stem.conv2", x, 64, 1);
    let x = conv(&mut b, "stem.conv3", x, 192, 3); // 192 x 56 x 56
    let mut x = b.pool("stem.maxpool2", x, Pool2d::max(3, 2, 0).ceil()); // 192 x 28 x 28

    for m in &STAGE3 {
        x = inception(&mut b, m, x);
    }
    b.block("maxpool3");
    x = b.pool("maxpool3", x, Pool2d::max(3, 2, 0).ceil()); // 480 x 14 x 14
    for m in &STAGE4 {
        x = inception(&mut b, m, x);
    }
    b.block("maxpool4");
    x = b.pool("maxpool4", x, Pool2d::max(2, 2, 0).ceil()); // 832 x 7 x 7
    for m in &STAGE5 {
        x = inception(&mut b, m, x);
    }

    b.block("head");
    let x = b.pool("head.avgpool", x, Pool2d::global_avg()); // 1024 x 1 x 1
    let x = b.op("head.flatten", Op::Reshape { shape: vec![0, -1] }, &[x]);
    b.linear("head.fc", x, 1000, Activation::None);
    b.finish()
}
