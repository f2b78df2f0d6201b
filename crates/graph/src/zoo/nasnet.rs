//! NASNet-A large (Zoph et al. 2018), "NASNet 6 @ 4032", built with the graph structure of IOS
//! (`python/models/nasnet.py` of mit-han-lab/inter-operator-scheduler).
//!
//! # Operators
//! As in IOS, every `relu + separable conv` (relu, depthwise k x k, pointwise 1x1) and every
//! `relu + 1x1 conv` is one [`Op::Sequential`]; additions are terms with several values (the
//! consumer sums them) and concatenations are [`Op::Identity`] nodes with several terms. The
//! combination nodes `comb_iter_0` / `comb_iter_1` of the stem and reduction cells, which are
//! read by other operators, are identity nodes whose single term sums the two branches. Batch
//! norm is folded into the convolutions (every convolution has a bias, as in IOS).
//!
//! # Counts (IOS's way)
//! At any input size: 374 operators, as in the IOS paper: stem conv 1 + cell stem 0: 18 + cell
//! stem 1: 21 + 3 first cells x 18 + 15 normal cells x 16 + 2 reduction cells x 19 + head
//! (relu, global average pool) 2 = 374.
//!
//! 572 edges ([`Graph::edge_count`]: distinct producer -> consumer pairs between operators).
//! Edges into each cell, counting those from earlier cells: cell stem 0: 26, cell stem 1: 29,
//! first cell: 28, normal cell: 25, reduction cell: 28, head: 2; 26 + 29 + 3 x 28 + 15 x 25 +
//! 2 x 28 + 2 = 572. IOS's 576 counts value uses instead of distinct pairs: its graph (which this
//! one reproduces edge for edge) reads one producer in two terms of the same output node four
//! times: `comb1` in cell stem 1's output (`[comb1]` and `[avgpool(comb0), comb1]`) and `x_left`
//! in each of the three first cells' outputs (`[x_left]` and `[avgpool(x_right), x_left]`);
//! 572 + 4 = 576.
//!
//! IOS has no classifier: the model ends with relu and a global average pool over 4032 channels
//! (no 4032 -> 1000 fully connected layer), so neither does this one. Parameters: 84,703,878
//! (NASNet-A large: 88.9M with its classifier, 84.7M without); 47.9 GFLOPs at 331 (23.9G
//! multiply-adds; the paper: 23.8G).
//!
//! # Differences from IOS's model code (none changes an operator or a distinct edge)
//! * Normal cells concatenate six terms `[x_left, comb0, .., comb4]` as NASNet-A does; IOS's
//!   `normal_cell` leaves out the leading `x_left` term (its cells output 5 x F channels, not
//!   6 x F, and the network ends with 3360 channels instead of 4032). `x_left` already feeds the
//!   output through `comb2 = avgpool(x_right) + x_left`, so the edge set is the same (counted
//!   IOS's way, with repeats, this graph would have 15 more value uses: 591).
//! * In cell stem 1 the two strided 1x1 paths of `x_right` are concatenated (NASNet-A's factorized
//!   reduction, 2 x F/2 = F channels); IOS sums them (F/2 channels). Same edges.
//!
//! Kept from IOS although NASNet-A differs: in cell stem 0 `comb3 = avgpool(comb0) + comb0`
//! (NASNet-A adds `comb1`); changing it would remove the edge `comb0 -> out` (572 -> 571). The
//! two factorized reduction paths are strided 1x1 convolutions (NASNet-A: a 1x1 average pool
//! with stride 2, one of them on a shifted input, then a 1x1 convolution); same counts. Blocks:
//! one per cell, plus `stem` (the stem conv) and `head` (relu and pool; IOS's `get_parts` puts
//! them in two parts).

use crate::error::{GraphError, Result};
use crate::graph::{Graph, NodeId, Value};
use crate::op::{Activation, Conv2d, Op, Pool2d};
use crate::zoo::ZooConfig;
use crate::GraphBuilder;

/// Smallest input side accepted. The network downsamples by 32 (stem conv, two stem cells, two
/// reduction cells); below 32 the last cells would run on padding-dominated 1x1 maps.
pub(crate) const MIN_INPUT_SIZE: usize = 32;

/// Filters of the stem convolution.
const STEM_FILTERS: usize = 96;
/// Penultimate filters `F` of NASNet-A large (the last cells have 4F each, 6 x 4F = 4032 out).
const FILTERS: usize = 168;

pub(super) fn build(cfg: &ZooConfig, size: usize) -> Result<Graph> {
    if size < MIN_INPUT_SIZE {
        return Err(GraphError::invalid(
            "nasnet",
            format!("input size {size} is too small (at least {MIN_INPUT_SIZE})"),
        ));
    }
    let mut n = Net {
        b: GraphBuilder::new("nasnet_large", cfg.dtype),
    };
    let x = n.b.input("input", vec![cfg.batch, 3, size, size]);
    let f = FILTERS;

    n.b.block("stem");
    let v1 = n.b.conv(
        "stem_conv",
        x,
        Conv2d::new(STEM_FILTERS, 3)
            .stride(2)
            .padding(0, 0)
            .bias(true),
    );
    n.b.block("cell_stem_0");
    let v2 = n.stem0("cell_stem_0", v1, f / 4);
    n.b.block("cell_stem_1");
    let v3 = n.stem1("cell_stem_1", v2, v1, f / 2);

    // (kind, left filters, right filters) of the 20 cells after the stem, in order; each cell
    // reads the outputs of the two cells before it, except that a first cell after a reduction
    // cell reads the reduction cell and the cell before the reduction's inputs (as NASNet-A).
    #[derive(Clone, Copy)]
    enum Kind {
        First,
        Normal,
        Reduction,
    }
    let mut cells: Vec<(Kind, usize, usize)> = Vec::with_capacity(20);
    for (i, mult) in [1usize, 2, 4].into_iter().enumerate() {
        if i > 0 {
            cells.push((Kind::Reduction, mult * f, mult * f));
        }
        cells.push((Kind::First, mult * f / 2, mult * f));
        for _ in 0..5 {
            cells.push((Kind::Normal, mult * f, mult * f));
        }
    }

    // `outs` holds every cell output in order: v2, v3, v4, ...
    let mut outs: Vec<NodeId> = vec![v2, v3];
    for (i, &(kind, left, right)) in cells.iter().enumerate() {
        let name = format!("cell_{i}");
        n.b.block(name.clone());
        let last = outs.len() - 1;
        let out = match kind {
            Kind::Normal => n.normal(&name, outs[last], outs[last - 1], left, right),
            Kind::Reduction => n.reduction(&name, outs[last], outs[last - 1], left, right),
            Kind::First => {
                // After the stem: (v3, v2). After a reduction cell: (reduction, the cell
                // before the reduction cell's inputs), e.g. v11 = first(v10, v8).
                let prev = if last == 1 { outs[0] } else { outs[last - 2] };
                n.first(&name, outs[last], prev, left, right)
            }
        };
        outs.push(out);
    }

    n.b.block("head");
    let last = outs[outs.len() - 1];
    let r = n.b.act("head_relu", last, Activation::Relu);
    n.b.pool("head_pool", r, Pool2d::global_avg());
    n.b.end_block();
    n.b.finish()
}

/// The builder plus the NASNet building blocks of IOS's `nasnet.py`.
struct Net {
    b: GraphBuilder,
}

impl Net {
    /// relu + separable conv (depthwise `k x k` with `stride`, pointwise to `out`): one op.
    fn relu_sep(&mut self, name: &str, x: NodeId, out: usize, k: usize, stride: usize) -> NodeId {
        let cin = self.b.channels(x).max(1);
        let ops = vec![
            Op::Activation {
                act: Activation::Relu,
            },
            Op::Conv2d(Conv2d::new(cin, k).stride(stride).groups(cin).bias(true)),
            Op::Conv2d(Conv2d::new(out, 1).bias(true)),
        ];
        self.b.sequential(name, x, ops)
    }

    /// relu + 1x1 conv: one op.
    fn relu_conv(&mut self, name: &str, x: NodeId, out: usize, stride: usize) -> NodeId {
        let ops = vec![
            Op::Activation {
                act: Activation::Relu,
            },
            Op::Conv2d(Conv2d::new(out, 1).stride(stride).bias(true)),
        ];
        self.b.sequential(name, x, ops)
    }

    /// NASNet's `BranchSeparables`: sep conv in -> in (strided), then in -> out.
    fn branch_sep(&mut self, name: &str, x: NodeId, out: usize, k: usize, stride: usize) -> NodeId {
        let cin = self.b.channels(x);
        let a = self.relu_sep(&format!("{name}_sep1"), x, cin, k, stride);
        self.relu_sep(&format!("{name}_sep2"), a, out, k, 1)
    }

    /// NASNet's `BranchSeparablesStem`: sep conv in -> out (strided), then out -> out.
    fn branch_sep_stem(
        &mut self,
        name: &str,
        x: NodeId,
        out: usize,
        k: usize,
        stride: usize,
    ) -> NodeId {
        let a = self.relu_sep(&format!("{name}_sep1"), x, out, k, stride);
        self.relu_sep(&format!("{name}_sep2"), a, out, k, 1)
    }

    fn max3(&mut self, name: &str, x: NodeId, stride: usize) -> NodeId {
        self.b.pool(name, x, Pool2d::max(3, stride, 1))
    }

    fn avg3(&mut self, name: &str, x: NodeId, stride: usize) -> NodeId {
        self.b.pool(name, x, Pool2d::avg(3, stride, 1))
    }

    /// An identity node: each inner list is one term, its nodes are summed; terms are
    /// concatenated along channels.
    fn identity(&mut self, name: &str, terms: &[&[NodeId]]) -> NodeId {
        let terms = terms
            .iter()
            .map(|t| t.iter().map(|&v| Value::whole(v)).collect())
            .collect();
        self.b.node(name, Op::Identity, terms)
    }

    /// Cell stem 0 on the stem convolution's output `x` (18 ops).
    fn stem0(&mut self, p: &str, x: NodeId, nf: usize) -> NodeId {
        let x1 = self.relu_conv(&format!("{p}/conv_1x1"), x, nf, 1);
        let c0l = self.branch_sep(&format!("{p}/comb0_left"), x1, nf, 5, 2);
        let c0r = self.branch_sep_stem(&format!("{p}/comb0_right"), x, nf, 7, 2);
        let c0 = self.identity(&format!("{p}/comb0"), &[&[c0l, c0r]]);
        let c1l = self.max3(&format!("{p}/comb1_left"), x1, 2);
        let c1r = self.branch_sep_stem(&format!("{p}/comb1_right"), x, nf, 7, 2);
        let c1 = self.identity(&format!("{p}/comb1"), &[&[c1l, c1r]]);
        let c2l = self.avg3(&format!("{p}/comb2_left"), x1, 2);
        let c2r = self.branch_sep_stem(&format!("{p}/comb2_right"), x, nf, 5, 2);
        let c3r = self.avg3(&format!("{p}/comb3_right"), c0, 1);
        let c4l = self.branch_sep(&format!("{p}/comb4_left"), c0, nf, 3, 1);
        let c4r = self.max3(&format!("{p}/comb4_right"), x1, 2);
        // IOS: comb3 = avgpool(comb0) + comb0 (NASNet-A adds comb1; kept for IOS's edge count).
        self.identity(
            &format!("{p}/out"),
            &[&[c1], &[c2l, c2r], &[c3r, c0], &[c4l, c4r]],
        )
    }

    /// Cell stem 1 on `hp` (cell stem 0) and `h` (the stem convolution) (21 ops).
    fn stem1(&mut self, p: &str, hp: NodeId, h: NodeId, nf: usize) -> NodeId {
        let xl = self.relu_conv(&format!("{p}/conv_1x1"), hp, nf, 1);
        let xr1 = self.relu_conv(&format!("{p}/path1"), h, nf / 2, 2);
        let xr2 = self.relu_conv(&format!("{p}/path2"), h, nf / 2, 2);
        // Concatenated as in NASNet-A (IOS sums the two paths; same edges).
        let xr = self.identity(&format!("{p}/path"), &[&[xr1], &[xr2]]);
        let c0l = self.branch_sep(&format!("{p}/comb0_left"), xl, nf, 5, 2);
        let c0r = self.branch_sep(&format!("{p}/comb0_right"), xr, nf, 7, 2);
        let c0 = self.identity(&format!("{p}/comb0"), &[&[c0l, c0r]]);
        let c1l = self.max3(&format!("{p}/comb1_left"), xl, 2);
        let c1r = self.branch_sep(&format!("{p}/comb1_right"), xr, nf, 7, 2);
        let c1 = self.identity(&format!("{p}/comb1"), &[&[c1l, c1r]]);
        let c2l = self.avg3(&format!("{p}/comb2_left"), xl, 2);
        let c2r = self.branch_sep(&format!("{p}/comb2_right"), xr, nf, 5, 2);
        let c3r = self.avg3(&format!("{p}/comb3_right"), c0, 1);
        let c4l = self.branch_sep(&format!("{p}/comb4_left"), c0, nf, 3, 1);
        let c4r = self.max3(&format!("{p}/comb4_right"), xl, 2);
        self.identity(
            &format!("{p}/out"),
            &[&[c1], &[c2l, c2r], &[c3r, c1], &[c4l, c4r]],
        )
    }

    /// First cell after the stem or a reduction cell: `x_prev` has twice the resolution, so
    /// the left input is a factorized reduction (two strided 1x1 paths, concatenated) (18 ops).
    fn first(&mut self, p: &str, x: NodeId, x_prev: NodeId, left: usize, right: usize) -> NodeId {
        let xl1 = self.relu_conv(&format!("{p}/path1"), x_prev, left, 2);
        let xl2 = self.relu_conv(&format!("{p}/path2"), x_prev, left, 2);
        let xl = self.identity(&format!("{p}/path"), &[&[xl1], &[xl2]]);
        let xr = self.relu_conv(&format!("{p}/conv_1x1"), x, right, 1);
        let c0l = self.branch_sep(&format!("{p}/comb0_left"), xr, right, 5, 1);
        let c0r = self.branch_sep(&format!("{p}/comb0_right"), xr, right, 3, 1);
        let c1l = self.branch_sep(&format!("{p}/comb1_left"), xl, right, 5, 1);
        let c1r = self.branch_sep(&format!("{p}/comb1_right"), xl, right, 3, 1);
        let c2l = self.avg3(&format!("{p}/comb2_left"), xr, 1);
        let c3l = self.avg3(&format!("{p}/comb3_left"), xl, 1);
        let c3r = self.avg3(&format!("{p}/comb3_right"), xl, 1);
        let c4l = self.branch_sep(&format!("{p}/comb4_left"), xr, right, 3, 1);
        self.identity(
            &format!("{p}/out"),
            &[
                &[xl],
                &[c0l, c0r],
                &[c1l, c1r],
                &[c2l, xl],
                &[c3l, c3r],
                &[c4l, xr],
            ],
        )
    }

    /// Normal cell (16 ops).
    fn normal(&mut self, p: &str, x: NodeId, x_prev: NodeId, left: usize, right: usize) -> NodeId {
        let xl = self.relu_conv(&format!("{p}/conv_prev_1x1"), x_prev, left, 1);
        let xr = self.relu_conv(&format!("{p}/conv_1x1"), x, right, 1);
        let c0l = self.branch_sep(&format!("{p}/comb0_left"), xr, right, 5, 1);
        let c0r = self.branch_sep(&format!("{p}/comb0_right"), xl, left, 3, 1);
        let c1l = self.branch_sep(&format!("{p}/comb1_left"), xl, left, 5, 1);
        let c1r = self.branch_sep(&format!("{p}/comb1_right"), xl, left, 3, 1);
        let c2l = self.avg3(&format!("{p}/comb2_left"), xr, 1);
        let c3l = self.avg3(&format!("{p}/comb3_left"), xl, 1);
        let c3r = self.avg3(&format!("{p}/comb3_right"), xl, 1);
        let c4l = self.branch_sep(&format!("{p}/comb4_left"), xr, right, 3, 1);
        // NASNet-A concatenates x_left too (IOS leaves this term out; x_left -> out is an
        // edge either way, through comb2).
        self.identity(
            &format!("{p}/out"),
            &[
                &[xl],
                &[c0l, c0r],
                &[c1l, c1r],
                &[c2l, xl],
                &[c3l, c3r],
                &[c4l, xr],
            ],
        )
    }

    /// Reduction cell: halves the resolution (19 ops).
    fn reduction(
        &mut self,
        p: &str,
        x: NodeId,
        x_prev: NodeId,
        left: usize,
        right: usize,
    ) -> NodeId {
        let xl = self.relu_conv(&format!("{p}/conv_prev_1x1"), x_prev, left, 1);
        let xr = self.relu_conv(&format!("{p}/conv_1x1"), x, right, 1);
        let c0l = self.branch_sep(&format!("{p}/comb0_left"), xr, right, 5, 2);
        let c0r = self.branch_sep(&format!("{p}/comb0_right"), xl, right, 7, 2);
        let c0 = self.identity(&format!("{p}/comb0"), &[&[c0l, c0r]]);
        let c1l = self.max3(&format!("{p}/comb1_left"), xr, 2);
        let c1r = self.branch_sep(&format!("{p}/comb1_right"), xl, right, 7, 2);
        let c1 = self.identity(&format!("{p}/comb1"), &[&[c1l, c1r]]);
        let c2l = self.avg3(&format!("{p}/comb2_left"), xr, 2);
        let c2r = self.branch_sep(&format!("{p}/comb2_right"), xl, right, 5, 2);
        let c3r = self.avg3(&format!("{p}/comb3_right"), c0, 1);
        let c4l = self.branch_sep(&format!("{p}/comb4_left"), c0, right, 3, 1);
        let c4r = self.max3(&format!("{p}/comb4_right"), xr, 2);
        self.identity(
            &format!("{p}/out"),
            &[&[c1l, c1r], &[c2l, c2r], &[c1, c3r], &[c4l, c4r]],
        )
    }
}
