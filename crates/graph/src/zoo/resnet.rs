//! ResNet-50 (He et al. 2016) as torchvision defines it (`torchvision.models.resnet50`,
//! "v1.5": the stride of a downsampling bottleneck sits on its 3x3 conv), with batch norm
//! folded into every convolution (a bias).
//!
//! Each bottleneck is conv1x1 + relu, conv3x3 + relu, conv1x1 (no activation), an optional
//! 1x1 downsample conv on the shortcut (first bottleneck of each stage), an element-wise add
//! and a standalone relu. The add and the relu are two operators (relu cannot be fused into a
//! conv here, and an element-wise add with a fused activation does not exist in the IR).
//!
//! Counts at 224x224:
//! - stem: conv7x7/2 + max pool = 2 ops, 1 edge;
//! - plain bottleneck: 3 convs + add + relu = 5 ops; edges: in->conv1, in->add, conv1->conv2,
//!   conv2->conv3, conv3->add, add->relu = 6;
//! - downsampling bottleneck: 6 ops (+ downsample conv); edges: in->conv1, in->downsample,
//!   conv1->conv2, conv2->conv3, conv3->add, downsample->add, add->relu = 7;
//! - head: global average pool, reshape, linear = 3 ops, 3 edges.
//!
//! 16 bottlenecks ([3, 4, 6, 3]), 4 of them downsampling.
//! Ops: 2 + 12 * 5 + 4 * 6 + 3 = 89; edges: 1 + 12 * 6 + 4 * 7 + 3 = 104.

use crate::builder::GraphBuilder;
use crate::error::Result;
use crate::graph::{Graph, NodeId};
use crate::op::{Activation, Conv2d, Op, Pool2d};
use crate::zoo::ZooConfig;

fn bottleneck(
    b: &mut GraphBuilder,
    n: &str,
    x: NodeId,
    width: usize,
    stride: usize,
    downsample: bool,
) -> NodeId {
    b.block(n);
    let out = width * 4;
    let y = b.conv(
        &format!("{n}.conv1"),
        x,
        Conv2d::new(width, 1).bias(true).relu(),
    );
    let y = b.conv(
        &format!("{n}.conv2"),
        y,
        Conv2d::new(width, 3).stride(stride).bias(true).relu(),
    );
    let y = b.conv(&format!("{n}.conv3"), y, Conv2d::new(out, 1).bias(true));
    let shortcut = if downsample {
        b.conv(
            &format!("{n}.downsample"),
            x,
            Conv2d::new(out, 1).stride(stride).bias(true),
        )
    } else {
        x
    };
    let sum = b.add(&format!("{n}.add"), &[y, shortcut]);
    b.act(&format!("{n}.relu"), sum, Activation::Relu)
}

pub(super) fn build(cfg: &ZooConfig, size: usize) -> Result<Graph> {
    let mut b = GraphBuilder::new("resnet50", cfg.dtype);
    let x = b.input("input", vec![cfg.batch, 3, size, size]);

    b.block("stem");
    let x = b.conv(
        "stem.conv1",
        x,
        Conv2d::new(64, 7).stride(2).bias(true).relu(),
    ); // 64 x 112 x 112
    let mut x = b.pool("stem.maxpool", x, Pool2d::max(3, 2, 1)); // 64 x 56 x 56

    // (bottlenecks, width, stride of the first one)
    let stages = [(3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)];
    for (si, &(blocks, width, stride)) in stages.iter().enumerate() {
        for bi in 0..blocks {
            let name = format!("layer{}.{bi}", si + 1);
            let (s, down) = if bi == 0 { (stride, true) } else { (1, false) };
            x = bottleneck(&mut b, &name, x, width, s, down);
        }
    }

    b.block("head");
    let x = b.pool("head.avgpool", x, Pool2d::global_avg()); // 2048 x 1 x 1
    let x = b.op("head.flatten", Op::Reshape { shape: vec![0, -1] }, &[x]);
    b.linear("head.fc", x, 1000, Activation::None);
    b.finish()
}
