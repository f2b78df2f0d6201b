//! Kernel launches per operator: the one place that says how many kernels the GPU backend
//! runs for an operator of the IR.
//!
//! A launch costs a fixed floor on the GPU whatever the kernel does (about 1.2 us in a CUDA
//! graph on an H100, 11.75 us of host time in eager mode), so an operator that is several
//! kernels (input copies, a matrix product and its bias epilogue, a concat's copies) costs
//! several floors. The count mirrors `opsched_gpu::program`'s lowering to steps, one launch per
//! step:
//! - input terms: a term that is one whole value is read in place; a sum of whole values is
//!   one add kernel (and one with the activation of an `activation` reading it); a term with a
//!   channel slice is one copy per value; several terms read concatenated along
//!   channels are one copy per value, but a sum of whole values one add kernel writing its
//!   slice (strided at batch > 1); a concat along another axis copies each term (after
//!   materialising it); a concat copies nothing for a producer that writes its slice in place
//!   (`opsched_graph::inplace`), and a reshape that its producer writes in place
//!   (`opsched_graph::inplace::reshape_source`) launches nothing, nor does a head transpose
//!   that a batch matmul reads or writes with strides (`opsched_graph::fusion`);
//! - an activation that runs inside the kernel of the element-wise operator it reads, and a sum
//!   that the convolution feeding it computes (`opsched_graph::fusion`), launch nothing; a
//!   convolution whose bias its readers add (`opsched_graph::fusion::deferred_bias`) runs no
//!   bias kernel, and a sum that a depthwise convolution reads value by value
//!   (`opsched_graph::fusion::depthwise_reads_sum`) no add kernel; a value that its producer
//!   activates in place (`opsched_graph::fusion::producer_activation`) one kernel more for
//!   the producer (none where the add kernels of a concatenation's sums apply it to every
//!   slice, `opsched_graph::fusion::act_by_writers`) and none for its readers' activation; a
//!   pooling that the add kernel of its
//!   reader's sum computes (`opsched_graph::fusion::pool_into_sum`) none;
//! - main kernels: a depthwise convolution 1 (our kernel: bias and activations included); any
//!   other convolution 1 (cuDNN's fused conv + bias + relu, else conv then a bias /
//!   activation kernel when there is a bias or a non-relu activation: 2; the CUDA device also
//!   splits a relu convolution in two where it measured the fused call slower, and runs a
//!   bias-only one as one fused call where that measured no slower, which this count, made
//!   without a GPU, does not know); linear 1 (bias, residual and relu in cuBLASLt's
//!   epilogue), plus a bias / activation kernel for any other activation; identity and
//!   reshape one copy (unless a view); every other operator one kernel; a `sequential` operator the sum of its inner operators (only the first reads
//!   the node's terms), but for an activation that the depthwise convolution after it applies
//!   (`opsched_graph::fusion::pre_activations`), which launches nothing.
//!
//! A test in the facade checks the count against the GPU program's steps on every zoo model, so
//! whoever changes the kernels changes this function in the same commit.

use opsched_graph::{Activation, Graph, NodeId, Op, Shape, Term};

/// Kernel launches of `op` on the GPU backend (0 for graph inputs).
pub fn launches(g: &Graph, op: NodeId) -> u32 {
    use opsched_graph::fusion;
    // A convolution whose readers add its bias runs no bias kernel of its own; a depthwise
    // kernel that reads the values of its input's sum needs no add kernel before it; a value
    // its producer activates in place costs the producer a kernel, and each reader the
    // activation kernel it would have run (none where the depthwise kernel applies it).
    let deferred = fusion::deferred_bias(g, op).is_some();
    let reads_sum = fusion::depthwise_reads_sum(g, op);
    // (None where the add kernels of a concatenation's sums apply it to every slice.)
    let activates =
        fusion::producer_activation(g, op).is_some() && fusion::act_by_writers(g, op) != Some(None);
    let own = own_launches(g, op) + u32::from(activates);
    let skipped = fusion::skips_activation_kernel(g, op);
    own.saturating_sub(u32::from(deferred) + u32::from(reads_sum) + u32::from(skipped))
}

/// [`launches`] with every bias run by its convolution.
fn own_launches(g: &Graph, op: NodeId) -> u32 {
    let node = g.node(op);
    let shapes = g.input_shapes(op);
    match &node.op {
        Op::Sequential { ops } => {
            // An activation that the depthwise convolution after it applies launches nothing;
            // the first operator that launches reads the node's terms.
            let fused = match shapes.as_slice() {
                [one] => opsched_graph::fusion::pre_activations(ops, one),
                _ => vec![false; ops.len()],
            };
            let mut cur = shapes.clone();
            let mut reads_terms = true;
            let mut n = 0;
            for (inner, &fused) in ops.iter().zip(&fused) {
                if !fused {
                    n += if reads_terms {
                        op_launches(inner, Input::Terms(&node.inputs, &shapes))
                    } else {
                        op_launches(inner, Input::Buffer(channels(&cur)))
                    };
                    reads_terms = false;
                }
                match inner.infer_shape(&cur) {
                    Ok(s) => cur = vec![s],
                    Err(_) => break,
                }
            }
            n
        }
        Op::Activation { .. } if opsched_graph::fusion::fused_source(g, op).is_some() => 0,
        Op::Pool2d(_) if opsched_graph::fusion::pool_into_sum(g, op).is_some() => 0,
        Op::Reshape { .. } | Op::Identity
            if opsched_graph::inplace::reshape_source(g, op).is_some() =>
        {
            0
        }
        Op::Transpose { .. } if opsched_graph::fusion::transpose_fused(g, op) => 0,
        Op::Elementwise { .. } if opsched_graph::fusion::residual_source(g, op).is_some() => 0,
        Op::Conv2d(_) | Op::Linear { .. } => {
            let input = Input::Terms(&node.inputs, &shapes);
            match (&node.op, opsched_graph::fusion::residual_of(g, op)) {
                (_, None) => op_launches(&node.op, input),
                // The product's epilogue adds the residual too (or the bias kernel after it,
                // for an activation the epilogue does not have).
                (Op::Linear { .. }, Some((_, act))) => {
                    single_copies(input) + 1 + u32::from(!opsched_graph::fusion::gemm_epilogue(act))
                }
                // cuDNN's fused call with the residual as `z` (relu with any algorithm; a
                // residual alone only with one, else the bias + residual kernel after it).
                (_, Some((_, act))) => {
                    single_copies(input) + 1 + u32::from(act != Activation::Relu)
                }
            }
        }
        // Producers that write their slice in place need no copy.
        Op::Concat { .. } | Op::Identity => {
            op_launches(&node.op, Input::Terms(&node.inputs, &shapes))
                .saturating_sub(opsched_graph::inplace::in_place_terms(g, op) as u32)
        }
        other => op_launches(other, Input::Terms(&node.inputs, &shapes)),
    }
}

/// Where an operator's input comes from: the node's terms (with their shapes), or the previous
/// result of a `sequential` chain (one buffer of so many channels, read in place).
#[derive(Clone, Copy)]
enum Input<'a> {
    Terms(&'a [Term], &'a [Shape]),
    Buffer(usize),
}

/// Channels (axis 1) of terms read concatenated along channels.
fn channels(shapes: &[Shape]) -> usize {
    shapes.iter().filter_map(|s| s.get(1)).sum()
}

/// Kernels that materialise one term: none for one whole value, one add for a sum of whole
/// values, one copy per value otherwise.
fn term_copies(t: &Term) -> u32 {
    match t.as_slice() {
        [v] if v.channels.is_none() => 0,
        vs if is_whole_sum(vs) => 1,
        vs => vs.len() as u32,
    }
}

/// Several values, none a channel slice (summed by one add kernel).
fn is_whole_sum(t: &[opsched_graph::Value]) -> bool {
    t.len() > 1 && t.iter().all(|v| v.channels.is_none())
}

/// Copies that write the terms side by side along `axis`.
fn concat_copies(terms: &[Term], shapes: &[Shape], axis: usize) -> u32 {
    terms
        .iter()
        .zip(shapes.iter().map(Some).chain(std::iter::repeat(None)))
        .map(|(t, shape)| {
            let rank = shape.map_or(0, Vec::len);
            if axis == 1 && rank >= 2 && is_whole_sum(t) {
                // One add kernel writes the slice.
                1
            } else if axis == 1 && rank >= 2 {
                t.len() as u32
            } else {
                term_copies(t) + 1
            }
        })
        .sum()
}

/// Copies that give an operator its single (channel-concatenated) input.
fn single_copies(input: Input<'_>) -> u32 {
    match input {
        Input::Buffer(_) => 0,
        Input::Terms([t], _) => term_copies(t),
        Input::Terms(terms, shapes) => concat_copies(terms, shapes, 1),
    }
}

fn op_launches(op: &Op, input: Input<'_>) -> u32 {
    match op {
        Op::Input { .. } | Op::Constant { .. } => 0,
        Op::Conv2d(c) => {
            let in_channels = match input {
                Input::Terms(_, shapes) => channels(shapes),
                Input::Buffer(c) => c,
            };
            // A depthwise convolution is one kernel of ours, bias and activation included.
            let epilogue = !opsched_graph::fusion::is_depthwise(c, in_channels)
                && c.act != Activation::Relu
                && (c.bias || c.act != Activation::None);
            single_copies(input) + 1 + u32::from(epilogue)
        }
        Op::Linear { bias, act, .. } => {
            let after =
                (*bias || *act != Activation::None) && !opsched_graph::fusion::gemm_epilogue(*act);
            single_copies(input) + 1 + u32::from(after)
        }
        Op::Elementwise { .. }
        | Op::Binary { .. }
        | Op::Where
        | Op::Expand { .. }
        | Op::GatherElements { .. }
        | Op::BatchMatmul { .. } => {
            let copies = match input {
                Input::Buffer(_) => 0,
                Input::Terms(terms, _) => terms.iter().map(term_copies).sum(),
            };
            copies + 1
        }
        Op::Concat { axis } => match input {
            Input::Buffer(_) => 1,
            Input::Terms(terms, shapes) => concat_copies(terms, shapes, *axis),
        },
        // Joined along channels like a concat (a summed term is accumulated in place).
        Op::Identity | Op::Reshape { .. } => match input {
            Input::Terms(terms, shapes) => concat_copies(terms, shapes, 1),
            Input::Buffer(_) => 1,
        },
        // Nested chains (the graph builds none): the plain sum of their operators.
        Op::Sequential { ops } => ops
            .iter()
            .enumerate()
            .map(|(i, inner)| op_launches(inner, if i == 0 { input } else { Input::Buffer(0) }))
            .sum(),
        Op::Abstract { .. } | Op::Opaque { .. } => 1,
        // A scale broadcast, then a shift broadcast.
        Op::Affine => single_copies(input) + 2,
        // The sum and the activation are one kernel.
        Op::Activation { .. } if matches!(input, Input::Terms([t], _) if is_whole_sum(t)) => 1,
        Op::Pool2d(_)
        | Op::Resize(_)
        | Op::Embedding { .. }
        | Op::Slice { .. }
        | Op::Reduce { .. }
        | Op::CumSum { .. }
        | Op::Activation { .. }
        | Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::Pad { .. }
        | Op::LayerNorm { .. }
        | Op::Transpose { .. } => single_copies(input) + 1,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use opsched_graph::zoo::{build, ZooConfig};

    #[test]
    fn counts_copies_and_epilogues() {
        for batch in [1, 16] {
            let cfg = ZooConfig {
                batch,
                ..ZooConfig::default()
            };
            let g = build("inception_v3", &cfg).unwrap();
            // Every operator but a concat launches at least one kernel. A concat of
            // convolution and pooling branches copies nothing: the branches write their slices
            // in place (strided at batch 16).
            assert!(g
                .ops()
                .all(|o| launches(&g, o) >= 1 || matches!(g.node(o).op, Op::Concat { .. })));
            let concat_of = |terms: usize| {
                g.ops()
                    .find(|&o| {
                        matches!(g.node(o).op, Op::Concat { .. }) && g.node(o).inputs.len() == terms
                    })
                    .unwrap()
            };
            assert_eq!(launches(&g, concat_of(4)), 0);
            let with_pool = concat_of(3);
            assert!(g
                .preds(with_pool)
                .any(|p| matches!(g.node(p).op, Op::Pool2d(_))));
            assert_eq!(launches(&g, with_pool), 0);
        }
    }
}
