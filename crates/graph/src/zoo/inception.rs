//! Inception-v3 (Szegedy et al. 2016) as IOS defines it (`python/ios/models/inception_v3.py`
//! of mit-han-lab/inter-operator-scheduler): no auxiliary head and no classifier; the last
//! block is a global average pool. Every convolution has batch norm folded in (a bias) and a
//! fused relu; every module ends in one concat.
//!
//! Counts at 299x299 (IOS's): 119 operators and 153 edges.
//! - stem: 5 convs + 2 max pools = 7 ops, a chain of 6 edges;
//! - inception_a (x3): 7 convs + 1 avg pool + concat = 9 ops; 4 edges in, 4 inside the
//!   branches, 4 into the concat = 12 edges;
//! - inception_b: 4 convs + 1 max pool + concat = 6 ops; 3 + 2 + 3 = 8 edges;
//! - inception_c (x4): 10 convs + 1 avg pool + concat = 12 ops; 4 + 7 + 4 = 15 edges;
//! - inception_d: 6 convs + 1 max pool + concat = 8 ops; 3 + 4 + 3 = 10 edges;
//! - inception_e (x2): 9 convs + 1 avg pool + concat = 11 ops; 4 + 6 + 6 = 16 edges;
//! - logits: 1 global average pool, 1 edge.
//!
//! Ops: 7 + 27 + 6 + 48 + 8 + 22 + 1 = 119; edges: 6 + 36 + 8 + 60 + 10 + 32 + 1 = 153.
//! Operators are named `<block>.<branch>_<n>` (e.g. `a1.branch5x5_2`), blocks are `stem`,
//! `a1`..`a3`, `b`, `c1`..`c4`, `d`, `e1`, `e2`, `logits`.

use crate::builder::GraphBuilder;
use crate::error::Result;
use crate::graph::{Graph, NodeId};
use crate::op::{Conv2d, Pool2d};
use crate::zoo::ZooConfig;

/// A convolution with folded batch norm and relu: `kh x kw`, stride `s`, padding `(ph, pw)`.
fn conv(
    b: &mut GraphBuilder,
    name: &str,
    x: NodeId,
    out: usize,
    (kh, kw): (usize, usize),
    s: usize,
    (ph, pw): (usize, usize),
) -> NodeId {
    let c = Conv2d::rect(out, kh, kw)
        .stride(s)
        .padding(ph, pw)
        .bias(true)
        .relu();
    b.conv(name, x, c)
}

fn stem(b: &mut GraphBuilder, x: NodeId) -> NodeId {
    b.block("stem");
    let x = conv(b, "stem.conv1a", x, 32, (3, 3), 2, (0, 0)); // 32 x 149 x 149
    let x = conv(b, "stem.conv2a", x, 32, (3, 3), 1, (0, 0)); // 32 x 147 x 147
    let x = conv(b, "stem.conv2b", x, 64, (3, 3), 1, (1, 1)); // 64 x 147 x 147
    let x = b.pool("stem.pool1", x, Pool2d::max(3, 2, 0)); // 64 x 73 x 73
    let x = conv(b, "stem.conv3b", x, 80, (1, 1), 1, (0, 0)); // 80 x 73 x 73
    let x = conv(b, "stem.conv4a", x, 192, (3, 3), 1, (0, 0)); // 192 x 71 x 71
    b.pool("stem.pool2", x, Pool2d::max(3, 2, 0)) // 192 x 35 x 35
}

fn inception_a(b: &mut GraphBuilder, n: &str, x: NodeId, pool_features: usize) -> NodeId {
    b.block(n);
    let b1 = conv(b, &format!("{n}.branch1x1"), x, 64, (1, 1), 1, (0, 0));

    let b5 = conv(b, &format!("{n}.branch5x5_1"), x, 48, (1, 1), 1, (0, 0));
    let b5 = conv(b, &format!("{n}.branch5x5_2"), b5, 64, (5, 5), 1, (2, 2));

    let b3 = conv(b, &format!("{n}.branch3x3dbl_1"), x, 64, (1, 1), 1, (0, 0));
    let b3 = conv(b, &format!("{n}.branch3x3dbl_2"), b3, 96, (3, 3), 1, (1, 1));
    let b3 = conv(b, &format!("{n}.branch3x3dbl_3"), b3, 96, (3, 3), 1, (1, 1));

    let bp = b.pool(&format!("{n}.branch_pool_1"), x, Pool2d::avg(3, 1, 1));
    let bp = conv(
        b,
        &format!("{n}.branch_pool_2"),
        bp,
        pool_features,
        (1, 1),
        1,
        (0, 0),
    );
    b.concat(&format!("{n}.concat"), &[b1, b5, b3, bp])
}

fn inception_b(b: &mut GraphBuilder, n: &str, x: NodeId) -> NodeId {
    b.block(n);
    let b3 = conv(b, &format!("{n}.branch3x3"), x, 384, (3, 3), 2, (0, 0));

    let bd = conv(b, &format!("{n}.branch3x3dbl_1"), x, 64, (1, 1), 1, (0, 0));
    let bd = conv(b, &format!("{n}.branch3x3dbl_2"), bd, 96, (3, 3), 1, (1, 1));
    let bd = conv(b, &format!("{n}.branch3x3dbl_3"), bd, 96, (3, 3), 2, (0, 0));

    let bp = b.pool(&format!("{n}.branch_pool"), x, Pool2d::max(3, 2, 0));
    b.concat(&format!("{n}.concat"), &[b3, bd, bp])
}

fn inception_c(b: &mut GraphBuilder, n: &str, x: NodeId, c7: usize) -> NodeId {
    b.block(n);
    let b1 = conv(b, &format!("{n}.branch1x1"), x, 192, (1, 1), 1, (0, 0));

    let b7 = conv(b, &format!("{n}.branch7x7_1"), x, c7, (1, 1), 1, (0, 0));
    let b7 = conv(b, &format!("{n}.branch7x7_2"), b7, c7, (1, 7), 1, (0, 3));
    let b7 = conv(b, &format!("{n}.branch7x7_3"), b7, 192, (7, 1), 1, (3, 0));

    let bd = conv(b, &format!("{n}.branch7x7dbl_1"), x, c7, (1, 1), 1, (0, 0));
    let bd = conv(b, &format!("{n}.branch7x7dbl_2"), bd, c7, (7, 1), 1, (3, 0));
    let bd = conv(b, &format!("{n}.branch7x7dbl_3"), bd, c7, (1, 7), 1, (0, 3));
    let bd = conv(b, &format!("{n}.branch7x7dbl_4"), bd, c7, (7, 1), 1, (3, 0));
    let bd = conv(
        b,
        &format!("{n}.branch7x7dbl_5"),
        bd,
        192,
        (1, 7),
        1,
        (0, 3),
    );

    let bp = b.pool(&format!("{n}.branch_pool_1"), x, Pool2d::avg(3, 1, 1));
    let bp = conv(b, &format!("{n}.branch_pool_2"), bp, 192, (1, 1), 1, (0, 0));
    b.concat(&format!("{n}.concat"), &[b1, b7, bd, bp])
}

fn inception_d(b: &mut GraphBuilder, n: &str, x: NodeId) -> NodeId {
    b.block(n);
    let b3 = conv(b, &format!("{n}.branch3x3_1"), x, 192, (1, 1), 1, (0, 0));
    let b3 = conv(b, &format!("{n}.branch3x3_2"), b3, 320, (3, 3), 2, (0, 0));

    let b7 = conv(b, &format!("{n}.branch7x7x3_1"), x, 192, (1, 1), 1, (0, 0));
    let b7 = conv(b, &format!("{n}.branch7x7x3_2"), b7, 192, (1, 7), 1, (0, 3));
    let b7 = conv(b, &format!("{n}.branch7x7x3_3"), b7, 192, (7, 1), 1, (3, 0));
    let b7 = conv(b, &format!("{n}.branch7x7x3_4"), b7, 192, (3, 3), 2, (0, 0));

    let bp = b.pool(&format!("{n}.branch_pool"), x, Pool2d::max(3, 2, 0));
    b.concat(&format!("{n}.concat"), &[b3, b7, bp])
}

fn inception_e(b: &mut GraphBuilder, n: &str, x: NodeId) -> NodeId {
    b.block(n);
    let b1 = conv(b, &format!("{n}.branch1x1"), x, 320, (1, 1), 1, (0, 0));

    let b3 = conv(b, &format!("{n}.branch3x3_1"), x, 384, (1, 1), 1, (0, 0));
    let b3a = conv(b, &format!("{n}.branch3x3_2a"), b3, 384, (1, 3), 1, (0, 1));
    let b3b = conv(b, &format!("{n}.branch3x3_2b"), b3, 384, (3, 1), 1, (1, 0));

    let bd = conv(b, &format!("{n}.branch3x3dbl_1"), x, 448, (1, 1), 1, (0, 0));
    let bd = conv(
        b,
        &format!("{n}.branch3x3dbl_2"),
        bd,
        384,
        (3, 3),
        1,
        (1, 1),
    );
    let bda = conv(
        b,
        &format!("{n}.branch3x3dbl_3a"),
        bd,
        384,
        (1, 3),
        1,
        (0, 1),
    );
    let bdb = conv(
        b,
        &format!("{n}.branch3x3dbl_3b"),
        bd,
        384,
        (3, 1),
        1,
        (1, 0),
    );

    let bp = b.pool(&format!("{n}.branch_pool_1"), x, Pool2d::avg(3, 1, 1));
    let bp = conv(b, &format!("{n}.branch_pool_2"), bp, 192, (1, 1), 1, (0, 0));
    b.concat(&format!("{n}.concat"), &[b1, b3a, b3b, bda, bdb, bp])
}

pub(super) fn build(cfg: &ZooConfig, size: usize) -> Result<Graph> {
    let mut b = GraphBuilder::new("inception_v3", cfg.dtype);
    let x = b.input("input", vec![cfg.batch, 3, size, size]);
    let mut x = stem(&mut b, x);
    for (i, pf) in [32, 64, 64].into_iter().enumerate() {
        x = inception_a(&mut b, &format!("a{}", i + 1), x, pf);
    }
    x = inception_b(&mut b, "b", x);
    for (i, c7) in [128, 160, 160, 192].into_iter().enumerate() {
        x = inception_c(&mut b, &format!("c{}", i + 1), x, c7);
    }
    x = inception_d(&mut b, "d", x);
    for i in 1..=2 {
        x = inception_e(&mut b, &format!("e{i}"), x);
    }
    b.block("logits");
    b.pool("logits.global_pool", x, Pool2d::global_avg());
    b.finish()
}
