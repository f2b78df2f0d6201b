//! A BERT-base style Transformer encoder (Devlin et al. 2019): 12 layers, hidden 768, 12 heads
//! of 64, FFN 3072 with GELU, post-layer-norm residual blocks.
//!
//! The input node `"input"` is `[batch, seq, 768]`: the embeddings are done. Each layer is one
//! block `layer{i}` of 21 operators:
//! - `q`, `k`, `v`: three parallel linear layers 768 -> 768 (with bias);
//! - each reshaped to `[b, s, 12, 64]` and transposed to `[b, 12, s, 64]`;
//! - `scores = q k^T / sqrt(64)` as `batch_matmul` with `transpose_b` and `alpha` 1/8 ->
//!   `[b, 12, s, s]` (the product scales for free; without the scale, random weights make
//!   logits of standard deviation 8, a softmax that TF32's rounding flips between tokens);
//! - `softmax` over the last axis, `context = probs v` -> `[b, 12, s, 64]`;
//! - transpose back to `[b, s, 12, 64]`, reshape to `[b, s, 768]`, output linear;
//! - residual add, layer norm, FFN linear 3072 with GELU fused, linear 768, residual add,
//!   layer norm.

use crate::builder::GraphBuilder;
use crate::error::Result;
use crate::graph::{Graph, NodeId};
use crate::op::{Activation, Op};
use crate::zoo::ZooConfig;

/// Hidden size.
const HIDDEN: usize = 768;
/// Attention heads.
const HEADS: usize = 12;
/// Size of one head.
const HEAD_DIM: usize = HIDDEN / HEADS;
/// Inner size of the feed-forward network.
const FFN: usize = 3072;
/// Encoder layers.
const LAYERS: usize = 12;

fn dim(d: usize) -> i64 {
    i64::try_from(d).unwrap_or(i64::MAX)
}

/// `[b, s, 768] -> [b, s, 12, 64] -> [b, 12, s, 64]`.
fn split_heads(b: &mut GraphBuilder, name: &str, x: NodeId, batch: usize, seq: usize) -> NodeId {
    let r = b.op(
        &format!("{name}_reshape"),
        Op::Reshape {
            shape: vec![dim(batch), dim(seq), dim(HEADS), dim(HEAD_DIM)],
        },
        &[x],
    );
    b.op(
        &format!("{name}_transpose"),
        Op::Transpose {
            perm: vec![0, 2, 1, 3],
        },
        &[r],
    )
}

fn encoder_layer(b: &mut GraphBuilder, i: usize, x: NodeId, batch: usize, seq: usize) -> NodeId {
    let p = format!("layer{i}");
    b.block(p.clone());
    let q = b.linear(&format!("{p}_q"), x, HIDDEN, Activation::None);
    let k = b.linear(&format!("{p}_k"), x, HIDDEN, Activation::None);
    let v = b.linear(&format!("{p}_v"), x, HIDDEN, Activation::None);
    let q = split_heads(b, &format!("{p}_q"), q, batch, seq);
    let k = split_heads(b, &format!("{p}_k"), k, batch, seq);
    let v = split_heads(b, &format!("{p}_v"), v, batch, seq);
    let scores = b.op(
        &format!("{p}_scores"),
        Op::BatchMatmul {
            transpose_b: true,
            alpha: 1.0 / (HEAD_DIM as f32).sqrt(),
        },
        &[q, k],
    );
    let probs = b.op(&format!("{p}_softmax"), Op::Softmax { axis: -1 }, &[scores]);
    let ctx = b.op(
        &format!("{p}_context"),
        Op::batch_matmul(false),
        &[probs, v],
    );
    let ctx = b.op(
        &format!("{p}_context_transpose"),
        Op::Transpose {
            perm: vec![0, 2, 1, 3],
        },
        &[ctx],
    );
    let ctx = b.op(
        &format!("{p}_context_reshape"),
        Op::Reshape {
            shape: vec![dim(batch), dim(seq), dim(HIDDEN)],
        },
        &[ctx],
    );
    let out = b.linear(&format!("{p}_attn_out"), ctx, HIDDEN, Activation::None);
    let res = b.add(&format!("{p}_attn_residual"), &[out, x]);
    let ln1 = b.op(
        &format!("{p}_attn_norm"),
        Op::LayerNorm { eps: 1e-12 },
        &[res],
    );
    let f1 = b.linear(&format!("{p}_ffn1"), ln1, FFN, Activation::Gelu);
    let f2 = b.linear(&format!("{p}_ffn2"), f1, HIDDEN, Activation::None);
    let res = b.add(&format!("{p}_ffn_residual"), &[f2, ln1]);
    let y = b.op(
        &format!("{p}_ffn_norm"),
        Op::LayerNorm { eps: 1e-12 },
        &[res],
    );
    b.end_block();
    y
}

/// Build the encoder for sequence length `size` (default 128) and batch `cfg.batch`.
pub(super) fn build(cfg: &ZooConfig, size: usize) -> Result<Graph> {
    let mut b = GraphBuilder::new("transformer", cfg.dtype);
    let mut x = b.input("input", vec![cfg.batch, size, HIDDEN]);
    for i in 0..LAYERS {
        x = encoder_layer(&mut b, i, x, cfg.batch, size);
    }
    b.finish()
}
