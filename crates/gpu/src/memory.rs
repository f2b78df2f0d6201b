//! Where a program's buffers live: one block of storage per logical GPU, and every buffer's
//! place in it.
//!
//! Two things let buffers share storage:
//! - **In-place concatenation.** [`crate::program::GraphProgram::build`] makes an operator whose
//!   whole output is one input of a concatenation on its GPU write straight into its slice of
//!   the concatenation's output, when that slice starts at a multiple of [`VIEW_ALIGN`]
//!   elements and, where it is not contiguous (one run per image at batch > 1), the operator's
//!   kernel takes an output stride (the rule: [`opsched_graph::inplace`]): its buffer is
//!   then *within* the other one ([`BufSpec::within`]; strided: [`BufSpec::runs`]) and the
//!   concatenation copies nothing for it.
//! - **Reuse** ([`layout_reusing`]): a buffer written and read only by operators that the
//!   schedule orders entirely before, or entirely after, every operator touching another buffer
//!   can take that buffer's place. The order is the execution's (streams, events, transfers),
//!   not the host's issue order: two operators on different streams with no event between them
//!   may run at the same time, so their buffers never share storage. Weights, inputs,
//!   constants, transfer buffers and the buffers of the values a caller reads after a run
//!   (`keep`) are never reused. Placement is greedy by size (largest first, lowest offset free of
//!   every conflicting buffer), as TensorFlow Lite's arena planner does.
//!
//! [`layout_distinct`] gives every buffer its own storage (views still share): what the
//! profiler and the check's sequential reference use, so every value can be read afterwards.

use opsched_graph::NodeId;
use serde::Serialize;

use crate::program::{BufId, BufRole, BufSpec, GraphProgram, Init};

/// Alignment of every buffer that is not a view, in elements (256 bytes: what a separate
/// `cudaMalloc` would give, and what cuDNN and cuBLAS expect for their fastest kernels).
pub const ALIGN: usize = 64;

/// Alignment a view inside another buffer needs, in elements.
pub use opsched_graph::inplace::VIEW_ALIGN;

/// How much storage a layout takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Footprint {
    /// Bytes of storage, all logical GPUs together.
    pub storage_bytes: u64,
    /// Bytes the buffers would take each in storage of its own (aligned as here).
    pub distinct_bytes: u64,
    /// Bytes of the buffers that start with data: weights, constants, inputs.
    pub data_bytes: u64,
}

fn align(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// The buffer `b` lies in (following views to the end) and its first element there.
pub fn root_of(p: &GraphProgram, mut b: BufId) -> (BufId, usize) {
    let mut off = 0;
    // Views point from a producer to its consumer, so the chain is acyclic; the bound only
    // guards a hand-made program.
    for _ in 0..p.buffers.len() {
        match p.buffers.get(b).and_then(|s| s.within) {
            Some((parent, o)) => {
                off += o;
                b = parent;
            }
            None => break,
        }
    }
    (b, off)
}

/// Storage of a layout of `p`.
pub fn footprint(p: &GraphProgram) -> Footprint {
    Footprint {
        storage_bytes: p.storage.iter().map(|&n| n as u64 * 4).sum(),
        distinct_bytes: p
            .buffers
            .iter()
            .filter(|b| b.within.is_none())
            .map(|b| align(b.len, ALIGN) as u64 * 4)
            .sum(),
        data_bytes: p
            .buffers
            .iter()
            .filter(|b| b.init != Init::Uninit)
            .map(|b| b.len as u64 * 4)
            .sum(),
    }
}

/// Give each buffer that is not a view its own place, in buffer order.
pub fn layout_distinct(p: &mut GraphProgram) {
    let (offsets, storage) = one_after_another(p, |_| true);
    apply(p, &offsets, &vec![false; p.buffers.len()], storage);
}

/// Place the buffers that are not views and that `pick` selects one after another in their
/// GPU's storage, in buffer order: (offset per buffer, storage per GPU).
fn one_after_another(p: &GraphProgram, pick: impl Fn(BufId) -> bool) -> (Vec<usize>, Vec<usize>) {
    let mut storage = vec![0usize; p.gpus.max(1)];
    let mut offsets = vec![0usize; p.buffers.len()];
    for (i, b) in p.buffers.iter().enumerate() {
        if b.within.is_none() && pick(i) {
            if storage.len() <= b.gpu {
                storage.resize(b.gpu + 1, 0);
            }
            offsets[i] = align(storage[b.gpu], ALIGN);
            storage[b.gpu] = offsets[i] + b.len;
        }
    }
    (offsets, storage)
}

/// Lay `p` out so that buffers share storage where `before` allows (see the module docs).
/// `before(a, b)`: operator `a` finishes before operator `b` starts, in every execution of the
/// schedule; `keep`: nodes whose values are read after a run.
pub fn layout_reusing(
    p: &mut GraphProgram,
    keep: &[NodeId],
    before: impl Fn(NodeId, NodeId) -> bool,
) {
    let n = p.buffers.len();
    // Who touches each root buffer.
    let mut users: Vec<Vec<NodeId>> = vec![Vec::new(); n];
    for (node, op) in p.ops.iter().enumerate() {
        let Some(op) = op else { continue };
        let node = NodeId(node as u32);
        for step in &op.steps {
            for (b, _) in step.access().all() {
                let (r, _) = root_of(p, b);
                if let Some(u) = users.get_mut(r) {
                    if u.last() != Some(&node) {
                        u.push(node);
                    }
                }
            }
        }
    }
    for u in &mut users {
        u.sort_unstable();
        u.dedup();
    }
    let mut pinned: Vec<bool> = p.buffers.iter().map(|b| !movable(b)).collect();
    for &(src, dst) in &p.transfers {
        for b in [src, dst] {
            pinned[root_of(p, b).0] = true;
        }
    }
    for &k in keep {
        if let Some(Some(b)) = p.outputs.get(k.index()) {
            pinned[root_of(p, *b).0] = true;
        }
    }
    // Pinned buffers first, one after the other; the rest above them, shared.
    let (mut offsets, mut storage) = one_after_another(p, |i| pinned[i]);
    let mut reused = vec![false; n];
    let base: Vec<usize> = storage.iter().map(|&s| align(s, ALIGN)).collect();
    let mut shared: Vec<BufId> = (0..n)
        .filter(|&i| p.buffers[i].within.is_none() && !pinned[i])
        .collect();
    shared.sort_by_key(|&i| (std::cmp::Reverse(p.buffers[i].len), i));
    let disjoint = |x: &[NodeId], y: &[NodeId]| {
        x.iter().all(|&a| y.iter().all(|&b| before(a, b)))
            || y.iter().all(|&b| x.iter().all(|&a| before(b, a)))
    };
    // Placed shared buffers per GPU: (offset, end, id).
    let mut placed: Vec<Vec<(usize, usize, BufId)>> = vec![Vec::new(); storage.len()];
    for &i in &shared {
        let b = &p.buffers[i];
        let mut taken: Vec<(usize, usize)> = placed[b.gpu]
            .iter()
            .filter(|&&(_, _, j)| !disjoint(&users[i], &users[j]))
            .map(|&(s, e, _)| (s, e))
            .collect();
        taken.sort_unstable();
        let mut at = base[b.gpu];
        for (s, e) in taken {
            if at + b.len <= s {
                break;
            }
            at = at.max(align(e, ALIGN));
        }
        offsets[i] = at;
        reused[i] = true;
        placed[b.gpu].push((at, at + b.len, i));
        storage[b.gpu] = storage[b.gpu].max(at + b.len);
    }
    apply(p, &offsets, &reused, storage);
}

/// A buffer whose storage may serve others when it is dead: an operator's output or scratch
/// that starts unwritten.
fn movable(b: &BufSpec) -> bool {
    matches!(b.role, BufRole::Output(_) | BufRole::Scratch(_)) && b.init == Init::Uninit
}

/// Set the offsets of root buffers (`offsets`, `reused` per buffer; views follow their root).
fn apply(p: &mut GraphProgram, offsets: &[usize], reused: &[bool], storage: Vec<usize>) {
    for i in 0..p.buffers.len() {
        let (r, off) = root_of(p, i);
        p.buffers[i].offset = offsets[r] + off;
        p.buffers[i].reused = reused[r];
    }
    p.storage = storage;
}

/// Every buffer lies inside its GPU's storage, and two buffers overlap only where a layout
/// allows it: one is within the other, or both may be reused. A strided view's runs fit its
/// parent and do not overlap, and nothing is a view of it. A device checks this before it
/// allocates, so no kernel can reach storage its buffer does not own.
pub fn check_layout(p: &GraphProgram) -> Result<(), crate::GpuError> {
    let err = |m: String| Err(crate::GpuError::Plan(m));
    for (i, b) in p.buffers.iter().enumerate() {
        if let Some(r) = b.runs {
            if b.within.is_none() || r.run == 0 || r.run > r.stride || b.len % r.run != 0 {
                return err(format!(
                    "buffer {i} is not a view of {} runs of {} elements {} apart",
                    b.len / r.run.max(1),
                    r.run,
                    r.stride
                ));
            }
        }
        let end = b.offset.checked_add(b.span());
        match (p.storage.get(b.gpu), end) {
            (Some(&s), Some(e)) if e <= s => {}
            _ => {
                return err(format!(
                    "buffer {i} (elements {}..+{}) lies outside the storage of GPU {}",
                    b.offset,
                    b.span(),
                    b.gpu
                ))
            }
        }
        if let Some((parent, o)) = b.within {
            let Some(pb) = p.buffers.get(parent) else {
                return err(format!(
                    "buffer {i} lies within buffer {parent}, which does not exist"
                ));
            };
            if pb.gpu != b.gpu || o.checked_add(b.span()).is_none_or(|e| e > pb.len) {
                return err(format!("buffer {i} does not fit within buffer {parent}"));
            }
            if pb.runs.is_some() {
                return err(format!(
                    "buffer {i} lies within buffer {parent}, a strided view"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn buf(len: usize, role: BufRole) -> BufSpec {
        BufSpec::new(0, len, role, Init::Uninit)
    }

    #[test]
    fn views_follow_their_root_through_a_chain() {
        let mut p = GraphProgram {
            buffers: vec![
                buf(100, BufRole::Output(NodeId(0))),
                buf(40, BufRole::Output(NodeId(1))),
                buf(8, BufRole::Output(NodeId(2))),
            ],
            gpus: 1,
            ..GraphProgram::default()
        };
        p.buffers[1].within = Some((0, 60));
        p.buffers[2].within = Some((1, 32));
        layout_distinct(&mut p);
        assert_eq!(root_of(&p, 2), (0, 92));
        assert_eq!(
            p.buffers.iter().map(|b| b.offset).collect::<Vec<_>>(),
            [0, 60, 92]
        );
        assert_eq!(p.storage, [100]);
        check_layout(&p).unwrap();
        p.buffers[2].within = Some((1, 33));
        assert!(check_layout(&p).is_err());
    }

    #[test]
    fn strided_views_fit_their_parent() {
        // Two runs of 6 elements, 16 apart, from element 4 of a 24-element buffer: 4..10 and
        // 20..26 would pass its end; from element 2, 2..8 and 18..24 fit.
        let mut p = GraphProgram {
            buffers: vec![
                buf(24, BufRole::Output(NodeId(0))),
                buf(12, BufRole::Output(NodeId(1))),
                buf(4, BufRole::Output(NodeId(2))),
            ],
            gpus: 1,
            ..GraphProgram::default()
        };
        let runs = crate::program::Runs { run: 6, stride: 16 };
        assert_eq!(runs.span(12), 22);
        assert_eq!(
            runs.ranges(3..10).collect::<Vec<_>>(),
            [3..6, 16..20],
            "elements 3..6 of the first run, 0..4 of the second"
        );
        p.buffers[1].within = Some((0, 4));
        p.buffers[1].runs = Some(runs);
        layout_distinct(&mut p);
        assert!(check_layout(&p).is_err());
        p.buffers[1].within = Some((0, 2));
        layout_distinct(&mut p);
        check_layout(&p).unwrap();
        assert_eq!(p.buffers[1].offset, 2);
        // Runs longer than their stride overlap; a view of a strided view is refused.
        p.buffers[1].runs = Some(crate::program::Runs { run: 6, stride: 4 });
        assert!(check_layout(&p).is_err());
        p.buffers[1].runs = Some(runs);
        p.buffers[2].within = Some((1, 0));
        layout_distinct(&mut p);
        assert!(check_layout(&p).is_err());
    }
}
