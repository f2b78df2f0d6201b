//! In-place concatenation: which operators write their output straight into their slice of a
//! concatenation's output, so that the concatenation copies nothing for them.
//!
//! The one rule that the lowering (`opsched_gpu::program`, which also requires the producer to
//! run on the concatenation's GPU with no transfer of its output) and the launch count of the
//! cost model (`opsched_cost::launches`) share. A producer writes in place when
//! - the consumer is a `concat` (or an `identity`, which concatenates its terms along
//!   channels);
//! - its whole output is one term of the concatenation (not a channel slice, not a sum);
//! - it is an operator (graph inputs and constants keep their own buffers);
//! - its slice starts at a multiple of [`VIEW_ALIGN`] elements;
//! - it is not the slice of another concatenation already: a producer read by several
//!   concatenations writes into the one with the lowest node id (a local rule, so the cost
//!   model can apply it per operator), and a value that appears twice in one concatenation
//!   writes its first slice.
//!
//! Where every axis before the concatenation axis has extent 1 (channels at batch 1), the
//! slice is contiguous and any operator may write it. Otherwise it is [`Slice::rows`] runs,
//! one per image ([`Slice`]): a strided view, which only a kernel that takes an output stride
//! writes, and only some kernels read in place. So there the producer must also be a
//! convolution that is not depthwise (cuDNN writes a strided output tensor; our depthwise
//! kernel does not), a `sequential` chain ending in one, or a pooling (our kernel takes the
//! stride), add no residual, be one term of the concatenation once (it may be summed in
//! others), have every other reader read the strided view in place
//! ([`crate::merge::read_in_place`]: other concatenations, adds, activations, pools,
//! convolutions that take an input stride; NASNet's cell inputs, read by the cell's branches
//! too), and not be an output of the graph; the run stride must be a multiple of
//! [`VIEW_ALIGN`] too.
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

/// Where a producer writes its output in place: `rows` runs of `run` elements, `stride`
/// elements apart in concatenation `into`'s output, the first at element `at`. A contiguous
/// slice (batch 1) is one run (`stride` is then the concatenation's whole image).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slice {
    pub into: NodeId,
    pub at: usize,
    pub rows: usize,
    pub run: usize,
    pub stride: usize,
}

/// Where concatenation `c` would take producer `p` in place: `p`'s first slice, when the rules
/// of the module (but the one on several concatenations) hold.
fn slot_in(g: &Graph, c: NodeId, p: NodeId) -> Option<Slice> {
    let (slice, terms_of_p) = place_in(g, c, p)?;
    let strided = slice.rows > 1 && slice.run < slice.stride;
    let writable = slice.rows == 1 || (strided && terms_of_p == 1 && writes_strided(g, p, c));
    writable.then_some(slice)
}

/// `p`'s first slice in concatenation `c`, where `p` is an operator whose whole output is
/// that term and the slice is aligned (the rules of the module on who may write it aside),
/// with how many of `c`'s terms are `p` alone.
fn place_in(g: &Graph, c: NodeId, p: NodeId) -> Option<(Slice, usize)> {
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
    let rows: usize = node.shape[..axis].iter().product();
    let inner: usize = node.shape[axis + 1..].iter().product();
    let stride = node.shape[axis].checked_mul(inner)?;
    let mut off = 0;
    let mut found = None;
    let mut terms_of_p = 0;
    for term in &node.inputs {
        let width = term
            .first()
            .and_then(|v| g.value_shape(v).ok())
            .and_then(|s| s.get(axis).copied())?;
        // Terms that are `p` alone (a sum that reads `p` is an add kernel's, which reads a
        // strided view in place).
        terms_of_p += usize::from(matches!(term.as_slice(), [v] if v.node == p));
        if let ([v], None) = (term.as_slice(), found) {
            if v.node == p {
                let whole = v.channels.is_none()
                    && g.node(p).shape.iter().product::<usize>() == rows * width * inner;
                let slice = Slice {
                    into: c,
                    at: off * inner,
                    rows,
                    run: width * inner,
                    stride,
                };
                found = Some(whole.then_some(slice));
            }
        }
        off += width;
    }
    let slice = found??;
    // Several runs that follow one another (a concatenation of one term at batch > 1) are
    // left to the reshape rule.
    if slice.rows > 1 && slice.run >= slice.stride {
        return None;
    }
    let aligned = slice.at.is_multiple_of(VIEW_ALIGN)
        && (slice.rows == 1 || slice.stride.is_multiple_of(VIEW_ALIGN));
    aligned.then_some((slice, terms_of_p))
}

/// Where `p` writes its output in place in a concatenation along channels whose values are
/// stored channels last (`[n, h, w, c]`, a GPU program's choice, not the IR's): the
/// concatenation and `p`'s first channel there. Each pixel's channels of `p` are then one run,
/// the concatenation's channels apart, at any batch: so `p` must be one that writes a strided
/// slice (the module's rules for one), and the offset and the concatenation's channels
/// multiples of [`VIEW_ALIGN`].
pub fn channels_last_slice(g: &Graph, p: NodeId) -> Option<(NodeId, usize)> {
    g.succs(p)
        .filter_map(|c| {
            if !matches!(g.node(c).op, Op::Concat { axis: 1 } | Op::Identity) {
                return None;
            }
            let &[_, channels, h, w] = g.node(c).shape.as_slice() else {
                return None;
            };
            let (slice, terms_of_p) = place_in(g, c, p)?;
            let first = slice.at / (h * w).max(1);
            let aligned = first.is_multiple_of(VIEW_ALIGN) && channels.is_multiple_of(VIEW_ALIGN);
            (aligned && terms_of_p == 1 && writes_strided(g, p, c)).then_some((c, first))
        })
        .min_by_key(|&(c, _)| c)
}

/// Where a merged convolution's member `p` lies in a concatenation when the merged
/// convolution writes it: [`slice_of`]'s slice without the rules on who may write a strided
/// one (the merged convolution takes the stride; `p`'s other readers read the strided view).
pub fn merged_slot(g: &Graph, p: NodeId) -> Option<Slice> {
    g.succs(p)
        .filter_map(|c| place_in(g, c, p).map(|(s, _)| s))
        .min_by_key(|s| s.into)
}

/// Whether `p`, read by concatenation `c`, may write a strided slice of it (see the module
/// docs).
fn writes_strided(g: &Graph, p: NodeId, c: NodeId) -> bool {
    let input = g.input_shapes(p).into_iter().next();
    let kernel_takes_stride = match &g.node(p).op {
        Op::Conv2d(conv) => input.is_some_and(|s| cudnn_conv(conv, &s)),
        Op::Pool2d(_) => true,
        // A chain whose last operator is such a convolution (NASNet's relu + 1x1 convolution,
        // its separable convolutions): that convolution writes the chain's output.
        Op::Sequential { ops } => match (input, ops.split_last()) {
            (Some(mut shape), Some((Op::Conv2d(conv), before))) => {
                for op in before {
                    match op.infer_shape(std::slice::from_ref(&shape)) {
                        Ok(s) => shape = s,
                        Err(_) => return false,
                    }
                }
                cudnn_conv(conv, &shape)
            }
            _ => false,
        },
        _ => false,
    };
    kernel_takes_stride
        && crate::fusion::residual_of(g, p).is_none()
        && g.succs(p).any(|s| s == c)
        && crate::merge::read_in_place(g, p)
        && !crate::fusion::is_output(g, p)
}

/// Whether convolution `conv` reading a value of shape `input` runs as cuDNN's (which takes an
/// output stride), not as our depthwise kernel.
fn cudnn_conv(conv: &crate::Conv2d, input: &[usize]) -> bool {
    input
        .get(1)
        .is_some_and(|&ch| !crate::fusion::is_depthwise(conv, ch))
}

/// The concatenation `p` writes its output into in place, and where ([`Slice`]).
pub fn slice_of(g: &Graph, p: NodeId) -> Option<Slice> {
    g.succs(p)
        .filter_map(|c| slot_in(g, c, p))
        .min_by_key(|s| s.into)
}

/// [`slice_of`] for every node.
pub fn concat_slices(g: &Graph) -> Vec<Option<Slice>> {
    (0..g.len())
        .map(|i| slice_of(g, NodeId(i as u32)))
        .collect()
}

/// The producers that write their terms of concatenation `c` in place (none for any other
/// node).
fn in_place_producers(g: &Graph, c: NodeId) -> Vec<NodeId> {
    let mut seen = Vec::new();
    for t in &g.node(c).inputs {
        if let [v] = t.as_slice() {
            if !seen.contains(&v.node) && slice_of(g, v.node).is_some_and(|s| s.into == c) {
                seen.push(v.node);
            }
        }
    }
    seen
}

/// How many terms of concatenation `c` its producers write in place (0 for any other node).
pub fn in_place_terms(g: &Graph, c: NodeId) -> usize {
    in_place_producers(g, c).len()
}

/// The share of concatenation `c`'s output that its producers write in place (0 for any other
/// node): what its copies leave out.
pub fn in_place_share(g: &Graph, c: NodeId) -> f64 {
    let total: usize = g.node(c).shape.iter().product();
    let in_place: usize = in_place_producers(g, c)
        .iter()
        .map(|&p| g.node(p).shape.iter().product::<usize>())
        .sum();
    match total {
        0 => 0.0,
        _ => (in_place as f64 / total as f64).min(1.0),
    }
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
            assert_eq!(
                slice_of(&g, f).map(|s| (s.into, s.at)),
                (batch == 1).then_some((rf, 0))
            );
            assert_eq!(s[rf.index()], (batch == 2).then_some(f));
        }
    }

    /// A slice of one run (batch 1) of `into`'s output, whose images are `stride` elements.
    fn part(into: NodeId, at: usize, run: usize, stride: usize) -> Option<Slice> {
        Some(Slice {
            into,
            at,
            rows: 1,
            run,
            stride,
        })
    }

    #[test]
    fn producers_take_their_first_slice_once() {
        for batch in [1, 2] {
            let mut b = GraphBuilder::new("cat", DType::F32);
            let x = b.input("x", vec![batch, 4, 4, 4]);
            let l = b.conv("l", x, Conv2d::new(8, 1));
            let r = b.conv("r", x, Conv2d::new(4, 1));
            let cat = b.concat("cat", &[l, r, x]);
            let again = b.concat("again", &[r, l]);
            let g = b.finish().unwrap();
            let s = concat_slices(&g);
            // Read by two concatenations: l and r write the first's slice (at batch 2 a
            // strided one, which the second's copies read in place).
            let slice = |at: usize, run: usize| match batch {
                1 => part(cat, at, run, 16 * 16),
                _ => Some(Slice {
                    into: cat,
                    at,
                    rows: batch,
                    run,
                    stride: 16 * 16,
                }),
            };
            assert_eq!(s[l.index()], slice(0, 8 * 16));
            assert_eq!(s[r.index()], slice(8 * 16, 4 * 16));
            assert_eq!(in_place_terms(&g, cat), 2);
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
            let want = match batch {
                1 => part(ident, 0, 8 * 16, 12 * 16),
                _ => Some(Slice {
                    into: ident,
                    at: 0,
                    rows: batch,
                    run: 8 * 16,
                    stride: 12 * 16,
                }),
            };
            assert_eq!(slice_of(&h, p), want);
            assert_eq!(
                slice_of(&h, q),
                None,
                "a summed term is not one whole value"
            );
            assert_eq!(in_place_terms(&h, ident), 1);
            assert_eq!(in_place_terms(&g, l), 0);
            // The graph input keeps its buffer; a producer has one slice; concatenations
            // themselves are not sliced into anything here.
            for n in [x, cat, again] {
                assert_eq!(s[n.index()], None);
            }
        }
    }

    /// A producer that other kernels read too writes its strided slice where each reads the
    /// strided view in place (NASNet's cell inputs: separable convolutions, pools, adds).
    #[test]
    fn strided_slices_other_readers_read_in_place() {
        let relu = Op::Activation {
            act: crate::Activation::Relu,
        };
        let depthwise = Op::Conv2d(Conv2d::new(4, 3).padding(1, 1).groups(4));
        type Reader = fn(&mut GraphBuilder, NodeId) -> NodeId;
        let cases: [(&str, Reader, bool); 5] = [
            (
                "a pool",
                |b, p| b.pool("r", p, crate::Pool2d::avg(3, 1, 1)),
                true,
            ),
            (
                "an activation",
                |b, p| b.act("r", p, crate::Activation::Relu),
                true,
            ),
            ("an add", |b, p| b.add("r", &[p, p]), true),
            (
                "a convolution padded unevenly",
                |b, p| {
                    let mut c = Conv2d::new(4, 2);
                    c.padding_end = Some([0, 0]);
                    b.conv("r", p, c)
                },
                false,
            ),
            (
                "a softmax",
                |b, p| b.op("r", Op::Softmax { axis: 1 }, &[p]),
                false,
            ),
        ];
        for (what, reader, in_place) in cases {
            let mut b = GraphBuilder::new("shared", DType::F32);
            let x = b.input("x", vec![2, 4, 4, 4]);
            let p = b.conv("p", x, Conv2d::new(4, 1));
            let q = b.conv("q", x, Conv2d::new(4, 1));
            b.concat("cat", &[p, q]);
            reader(&mut b, p);
            let g = b.finish().unwrap();
            assert_eq!(slice_of(&g, p).is_some(), in_place, "{what}");
            assert_eq!(channels_last_slice(&g, p).is_some(), in_place, "{what}");
        }
        // A chain whose first operator reads in place: relu + depthwise (the relu applied by
        // the depthwise kernel as it reads).
        let mut b = GraphBuilder::new("sep", DType::F32);
        let x = b.input("x", vec![2, 4, 4, 4]);
        let p = b.conv("p", x, Conv2d::new(4, 1));
        let q = b.conv("q", x, Conv2d::new(4, 1));
        b.concat("cat", &[p, q]);
        b.sequential("sep", p, vec![relu, depthwise]);
        let g = b.finish().unwrap();
        assert!(slice_of(&g, p).is_some());
    }

    #[test]
    fn chains_ending_in_a_cudnn_convolution_write_strided_slices() {
        let relu = Op::Activation {
            act: crate::Activation::Relu,
        };
        let depthwise = Op::Conv2d(Conv2d::new(4, 3).padding(1, 1).groups(4));
        let pointwise = Op::Conv2d(Conv2d::new(4, 1));
        let mut b = GraphBuilder::new("chains", DType::F32);
        let x = b.input("x", vec![2, 4, 4, 4]);
        let sep = vec![relu.clone(), depthwise.clone(), pointwise.clone()];
        let sep = b.sequential("sep", x, sep);
        let ends_depthwise = b.sequential("ends_dw", x, vec![relu, pointwise, depthwise]);
        let cat = b.concat("cat", &[sep, ends_depthwise]);
        let g = b.finish().unwrap();
        let want = Slice {
            into: cat,
            at: 0,
            rows: 2,
            run: 4 * 16,
            stride: 8 * 16,
        };
        assert_eq!(slice_of(&g, sep), Some(want));
        assert_eq!(channels_last_slice(&g, sep), Some((cat, 0)));
        // Our depthwise kernel takes no output stride.
        assert_eq!(slice_of(&g, ends_depthwise), None);
        assert_eq!(channels_last_slice(&g, ends_depthwise), None);
    }

    #[test]
    fn strided_slices_are_for_convolutions_and_pools_whose_readers_read_them_in_place() {
        for batch in [1, 2] {
            let mut b = GraphBuilder::new("strided", DType::F32);
            let x = b.input("x", vec![batch, 4, 4, 4]);
            let a = b.conv("a", x, Conv2d::new(8, 3).padding(1, 1));
            let dw = b.conv("dw", x, Conv2d::new(4, 3).padding(1, 1).groups(4));
            let pl = b.pool("pl", x, crate::Pool2d::max(3, 1, 1));
            let o = b.conv("o", x, Conv2d::new(4, 1));
            // Padded unevenly: an explicit pad, which reads a dense copy.
            let mut uneven = Conv2d::new(4, 2);
            uneven.padding_end = Some([0, 0]);
            let _o2 = b.conv("o2", o, uneven);
            let t = b.conv("t", x, Conv2d::new(4, 1));
            let odd = b.conv("odd", x, Conv2d::new(4, 1));
            let terms: Vec<Vec<crate::Value>> = [a, dw, pl, o, t, t, odd]
                .iter()
                .map(|&n| vec![crate::Value::whole(n)])
                .collect();
            let cat = b.node("cat", Op::Concat { axis: 1 }, terms);
            let g = b.finish().unwrap();
            let s = concat_slices(&g);
            let stride = 32 * 16;
            let at = |c: usize| c * 16;
            if batch == 1 {
                assert_eq!(s[a.index()], part(cat, 0, 8 * 16, stride));
                for (n, c) in [(dw, 8), (pl, 12), (o, 16), (t, 20), (odd, 28)] {
                    assert_eq!(s[n.index()], part(cat, at(c), 4 * 16, stride));
                }
                assert_eq!(in_place_terms(&g, cat), 6);
            } else {
                let want = Slice {
                    into: cat,
                    at: 0,
                    rows: 2,
                    run: 8 * 16,
                    stride,
                };
                assert_eq!(s[a.index()], Some(want));
                // Depthwise, read by a kernel that reads a dense copy, read twice: their own
                // buffers.
                for n in [dw, o, t] {
                    assert_eq!(s[n.index()], None, "{}", g.node(n).name);
                }
                assert_eq!(
                    s[pl.index()].map(|s| (s.at, s.rows)),
                    Some((at(12), 2)),
                    "a pooling kernel takes the stride"
                );
                assert_eq!(
                    s[odd.index()].map(|s| (s.at, s.rows)),
                    Some((at(28), 2)),
                    "an aligned slice of an aligned stride"
                );
                assert_eq!(in_place_terms(&g, cat), 3);
            }
            // A stride that is not a multiple of the alignment: 33 channels of a 3x3 plane.
            let mut b = GraphBuilder::new("unaligned", DType::F32);
            let x = b.input("x", vec![batch, 4, 3, 3]);
            let a = b.conv("a", x, Conv2d::new(8, 1));
            let y = b.input("y", vec![batch, 25, 3, 3]);
            let cat = b.concat("cat", &[a, y]);
            let g = b.finish().unwrap();
            assert_eq!(
                slice_of(&g, a).map(|s| s.into),
                (batch == 1).then_some(cat),
                "a stride of 297 elements"
            );
        }
    }
}
