//! SqueezeNet 1.0 (Iandola et al. 2016) as IOS defines it (`python/ios/models/squeezenet.py`
//! of mit-han-lab/inter-operator-scheduler). IOS's fire module is the "complex bypass"
//! variant: squeeze 1x1, expand 3x3 and expand 1x1, a concat of the two expands, and a
//! residual sum with the module input, through a 1x1 projection conv when the channel counts
//! differ. The sum is one `identity` whose single term sums the two values, as in IOS.
//! IOS also pads the 7x7/2 stem conv by 3 (torchvision does not) and ends in a 1x1 conv to
//! 1000 classes and a global average pool. All convs carry folded batch norm (bias) and relu.
//!
//! Counts at 224x224 (IOS's): 50 operators and 65 edges, which IOS's definition gives exactly.
//! - front: conv + max pool = 2 ops, 1 edge;
//! - fire with a projection (input channels != 2 * expand): squeeze, expand3x3, expand1x1,
//!   concat, projection, sum = 6 ops; edges: in->squeeze, in->proj, squeeze->e3, squeeze->e1,
//!   e3->concat, e1->concat, concat->sum, proj->sum = 8;
//! - fire without projection: 5 ops; edges: in->squeeze, in->sum, 2 + 2 in the expands and
//!   concat, concat->sum = 7;
//! - middle max pool: 1 op, 1 edge; tail: 1x1 conv + global pool = 2 ops, 2 edges.
//!
//! Fires (input -> output channels): 96->128 (proj), 128->128, 128->256 (proj), pool,
//! 256->256, 256->384 (proj), 384->384, 384->512 (proj), pool, 512->512.
//! Ops: 2 + (6+5+6) + 1 + (5+6+5+6) + 1 + 5 + 2 = 50;
//! edges: 1 + (8+7+8) + 1 + (7+8+7+8) + 1 + 7 + 2 = 65.

use crate::builder::GraphBuilder;
use crate::error::Result;
use crate::graph::{Graph, NodeId, Value};
use crate::op::{Conv2d, Op, Pool2d};
use crate::zoo::ZooConfig;

/// A convolution with folded batch norm and relu.
fn conv(b: &mut GraphBuilder, name: &str, x: NodeId, out: usize, k: usize) -> NodeId {
    b.conv(name, x, Conv2d::new(out, k).bias(true).relu())
}

fn fire(b: &mut GraphBuilder, n: &str, x: NodeId, squeeze: usize, expand: usize) -> NodeId {
    b.block(n);
    let s = conv(b, &format!("{n}.squeeze"), x, squeeze, 1);
    let e3 = conv(b, &format!("{n}.expand3x3"), s, expand, 3);
    let e1 = conv(b, &format!("{n}.expand1x1"), s, expand, 1);
    let cat = b.concat(&format!("{n}.concat"), &[e3, e1]);
    let bypass = if b.channels(x) == 2 * expand {
        x
    } else {
        conv(b, &format!("{n}.bypass"), x, 2 * expand, 1)
    };
    b.node(
        &format!("{n}.sum"),
        Op::Identity,
        vec![vec![Value::whole(cat), Value::whole(bypass)]],
    )
}

pub(super) fn build(cfg: &ZooConfig, size: usize) -> Result<Graph> {
    let mut b = GraphBuilder::new("squeezenet", cfg.dtype);
    let x = b.input("input", vec![cfg.batch, 3, size, size]);

    b.block("front");
    let x = b.conv(
        "front.conv",
        x,
        Conv2d::new(96, 7).stride(2).padding(3, 3).bias(true).relu(),
    );
    let mut x = b.pool("front.pool", x, Pool2d::max(3, 2, 0));

    x = fire(&mut b, "fire2", x, 16, 64);
    x = fire(&mut b, "fire3", x, 16, 64);
    x = fire(&mut b, "fire4", x, 32, 128);
    b.block("pool4");
    x = b.pool("pool4.pool", x, Pool2d::max(3, 2, 0));
    x = fire(&mut b, "fire5", x, 32, 128);
    x = fire(&mut b, "fire6", x, 48, 192);
    x = fire(&mut b, "fire7", x, 48, 192);
    x = fire(&mut b, "fire8", x, 64, 256);
    b.block("pool8");
    x = b.pool("pool8.pool", x, Pool2d::max(3, 2, 0));
    x = fire(&mut b, "fire9", x, 64, 256);

    b.block("tail");
    let x = conv(&mut b, "tail.conv", x, 1000, 1);
    b.pool("tail.global_pool", x, Pool2d::global_avg());
    b.finish()
}
