//! In-place concatenation: which operators write their output straight into their slice of a
//! concatenation's output, so that the concatenation copies nothing for them.
//!
//! The one rule that the lowering (`opsched_gpu::program`, which also requires the producer to
//! run on the concatenation's GPU with no transfer of its output) and the launch count of the
//! cost model (`opsched_cost::launches`) share. A producer writes in place when
//! - the consumer is a `concat` (or an `identity`, which concatenates its terms along
//!   channels) whose slices are contiguous: every axis before the concatenation axis has
//!   extent 1 (channels at batch 1);
//! - its whole output is one term of the concatenation (not a channel slice, not a sum);
//! - it is an operator (graph inputs and constants keep their own buffers);
//! - its slice starts at a multiple of [`VIEW_ALIGN`] elements;
//! - it is not the slice of another concatenation already: a producer read by several
//!   concatenations writes into the one with the lowest node id (a local rule, so the cost
//!   model can apply it per operator), and a value that appears twice in one concatenation
//!   writes its first slice.
//!
//! A reshape is a view ([`reshape_source`]): a `reshape` (or an `identity` of one term) that
//! reads one whole value of an operator is the same elements in the same order, so that
//! operator writes its output straight into the reshape's buffer and the reshape copies
//! nothing (a Transformer's head split and merge, the flatten before a classifier). The
//! producer must not write elsewhere already (its slice of a concatenation, the output of the
//! activation fused into it, the sum it computes: `crate::fusion`), and of several such
//! reshapes of one value, the one with the lowest node id takes it.

use crate::{Graph, NodeId, Op};

/// Alignment a slice written in place needs, in elements (16 bytes: vector loads and
/// tensor-core kernels need no more).
pub const VIEW_ALIGN: usize = 4;

/// Where concatenation `c` would take producer `p` in place: the first element of `p`'s first
/// slice, when the rules of the module (but the one on several concatenations) hold.
fn slot_in(g: &Graph, c: NodeId, p: NodeId) -> Option<usize> {
    let node = g.node(c);
    let axis = match node.op {
        Op::Concat { axis } => axis,
        // IOS's concatenation: its terms side by side along channels.
        Op::Identity => 1,
        _ => return None,
    };
    if p == c || g.node(p).op.is_input() || axis >= node.shape.len() {
        return None;
    }
    if node.shape[..axis].iter().product::<usize>() != 1 {
        return None;
    }
    let inner: usize = node.shape[axis + 1..].iter().product();
    let mut off = 0;
    for term in &node.inputs {
        let width = term
            .first()
            .and_then(|v| g.value_shape(v).ok())
            .and_then(|s| s.get(axis).copied())?;
        if let [v] = term.as_slice() {
            if v.node == p {
                let whole = v.channels.is_none()
                    && g.node(p).shape.iter().product::<usize>() == width * inner;
                let at = off * inner;
                return (whole && at.is_multiple_of(VIEW_ALIGN)).then_some(at);
            }
        }
        off += width;
    }
    None
}

/// The concatenation `p` writes its output into in place, and the first element of its slice
/// there.
pub fn slice_of(g: &Graph, p: NodeId) -> Option<(NodeId, usize)> {
    g.succs(p)
        .filter_map(|c| slot_in(g, c, p).map(|at| (c, at)))
        .min_by_key(|&(c, _)| c)
}

/// [`slice_of`] for every node.
pub fn concat_slices(g: &Graph) -> Vec<Option<(NodeId, usize)>> {
    (0..g.len())
        .map(|i| slice_of(g, NodeId(i as u32)))
        .collect()
}

/// How many terms of concatenation `c` its producers write in place (0 for any other node).
pub fn in_place_terms(g: &Graph, c: NodeId) -> usize {
    let mut seen = Vec::new();
    g.node(c)
        .inputs
        .iter()
        .filter(|t| match t.as_slice() {
            [v] if !seen.contains(&v.node) => {
                seen.push(v.node);
                slice_of(g, v.node).is_some_and(|(into, _)| into == c)
            }
            _ => false,
        })
        .count()
}

/// The operator whose output reshape `r` is a view of (see the module docs), or `None`.
pub fn reshape_source(g: &Graph, r: NodeId) -> Option<NodeId> {
    let p = whole_reshape_of(g, r)?;
    let writes_elsewhere = slice_of(g, p).is_some()
        || crate::fusion::residual_of(g, p).is_some()
        || crate::fusion::fused_activation(g, p).is_some();
    let first = g
        .succs(p)
        .filter(|&q| whole_reshape_of(g, q) == Some(p))
        .min();
    (!writes_elsewhere && first == Some(r)).then_some(p)
}

/// The operator `r` reshapes, when `r` is a reshape (or an identity of one term) of one whole
/// value of it.
fn whole_reshape_of(g: &Graph, r: NodeId) -> Option<NodeId> {
    let node = g.node(r);
    match (&node.op, node.inputs.as_slice()) {
        (Op::Reshape { .. } | Op::Identity, [term]) => match term.as_slice() {
            [v] if v.channels.is_none() && !g.node(v.node).op.is_input() => Some(v.node),
            _ => None,
        },
        _ => None,
    }
}

/// [`reshape_source`] for every node.
pub fn reshape_sources(g: &Graph) -> Vec<Option<NodeId>> {
    (0..g.len())
        .map(|i| reshape_source(g, NodeId(i as u32)))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{Conv2d, DType, GraphBuilder};

    #[test]
    fn a_reshape_of_a_whole_value_is_a_view_of_it_once() {
        for batch in [1usize, 2] {
            let whole = |n| vec![vec![crate::Value::whole(n)]];
            let flat = || Op::Reshape { shape: vec![-1] };
            let mut b = GraphBuilder::new("reshapes", DType::F32);
            let x = b.input("x", vec![batch, 4, 4, 4]);
            let c = b.conv("c", x, Conv2d::new(8, 1));
            let r1 = b.node("r1", flat(), whole(c));
            let r2 = b.node("r2", flat(), whole(c));
            // An identity of one term at batch 1 is a concatenation its producer writes in
            // place; at other batches, a reshape.
            let f = b.conv("f", x, Conv2d::new(4, 1));
            let rf = b.node("rf", Op::Identity, whole(f));
            // Of the input, of a sum, of a slice: copies.
            let rx = b.node("rx", flat(), whole(x));
            let d = b.conv("d", x, Conv2d::new(8, 1));
            let sum = vec![vec![crate::Value::whole(c), crate::Value::whole(d)]];
            let rs = b.node("rs", flat(), sum);
            let sliced = vec![vec![crate::Value::slice(d, 0, 4)]];
            let rsl = b.node("rsl", Op::Identity, sliced);
            // A producer that writes its slice of a concatenation (at batch 1) keeps writing
            // there.
            let e = b.conv("e", x, Conv2d::new(4, 1));
            let cat = b.concat("cat", &[e, d]);
            let re = b.node("re", flat(), whole(e));
            let g = b.finish().unwrap();
            let s = reshape_sources(&g);
            assert_eq!(s[r1.index()], Some(c));
            assert_eq!(s[r2.index()], None, "c is r1's already");
            for n in [rx, rs, rsl, cat, x, c] {
                assert_eq!(s[n.index()], None, "{}", g.node(n).name);
            }
            assert_eq!(slice_of(&g, e).is_some(), batch == 1);
            assert_eq!(s[re.index()], (batch == 2).then_some(e));
            assert_eq!(slice_of(&g, f), (batch == 1).then_some((rf, 0)));
            assert_eq!(s[rf.index()], (batch == 2).then_some(f));
        }
    }

    #[test]
    fn slices_at_batch_1_only_and_once() {
        for batch in [1, 2] {
            let mut b = GraphBuilder::new("cat", DType::F32);
            let x = b.input("x", vec![batch, 4, 4, 4]);
            let l = b.conv("l", x, Conv2d::new(8, 1));
            let r = b.conv("r", x, Conv2d::new(4, 1));
            let cat = b.concat("cat", &[l, r, x]);
            let again = b.concat("again", &[r, l]);
            let g = b.finish().unwrap();
            let s = concat_slices(&g);
            if batch == 1 {
                assert_eq!(s[l.index()], Some((cat, 0)));
                assert_eq!(s[r.index()], Some((cat, 8 * 16)));
                assert_eq!(in_place_terms(&g, cat), 2);
            } else {
                assert_eq!(s[l.index()], None);
                assert_eq!(s[r.index()], None);
                assert_eq!(in_place_terms(&g, cat), 0);
            }
            assert_eq!(in_place_terms(&g, again), 0);
            // IOS's concatenation, an identity of several terms, takes its producers too.
            let mut b = GraphBuilder::new("ios-cat", DType::F32);
            let x = b.input("x", vec![batch, 4, 4, 4]);
            let p = b.conv("p", x, Conv2d::new(8, 1));
            let q = b.conv("q", x, Conv2d::new(4, 1));
            let terms = vec![
                vec![crate::Value::whole(p)],
                vec![crate::Value::whole(q), crate::Value::whole(x)],
            ];
            let ident = b.node("ident", Op::Identity, terms);
            let h = b.finish().unwrap();
            let want = (batch == 1).then_some((ident, 0));
            assert_eq!(slice_of(&h, p), want);
            assert_eq!(
                slice_of(&h, q),
                None,
                "a summed term is not one whole value"
            );
            assert_eq!(in_place_terms(&h, ident), usize::from(batch == 1));
            assert_eq!(in_place_terms(&g, l), 0);
            // The graph input keeps its buffer; a producer has one slice; concatenations
            // themselves are not sliced into anything here.
            for n in [x, cat, again] {
                assert_eq!(s[n.index()], None);
            }
        }
    }
}
