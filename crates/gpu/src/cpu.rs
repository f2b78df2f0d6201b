//! The step executor on the CPU: a [`GraphProgram`]'s steps replayed on host buffers,
//! exactly as the GPU runs them, including transfers between (logical) GPUs. Slow (naive
//! loops); for numerical checks on small inputs.

use opsched_graph::{ElementwiseKind, Graph, NodeId};

use crate::program::{BufId, GraphProgram, Step};
use crate::reference::{act, conv2d, gemm, layer_norm, numel, pool2d, softmax, transpose};
use crate::GpuError;

// ---------------------------------------------------------------------------------------------
// Step executor: what the GPU runs, on host buffers.

fn take(bufs: &[Vec<f32>], id: BufId) -> Result<&[f32], GpuError> {
    bufs.get(id)
        .map(Vec::as_slice)
        .ok_or_else(|| GpuError::Plan(format!("buffer {id} does not exist")))
}

/// Run one step on host buffers.
pub fn run_step(bufs: &mut [Vec<f32>], step: &Step) -> Result<(), GpuError> {
    let check = |id: BufId, need: usize, bufs: &[Vec<f32>]| -> Result<(), GpuError> {
        let have = bufs.get(id).map_or(0, Vec::len);
        if have < need {
            return Err(GpuError::Plan(format!(
                "step {}: buffer {id} holds {have} elements, needs {need}",
                step.kind()
            )));
        }
        Ok(())
    };
    match step {
        Step::Copy {
            src,
            dst,
            outer,
            src_axis,
            src_off,
            dst_axis,
            dst_off,
            len,
            inner,
            accumulate,
        } => {
            check(*src, outer * src_axis * inner, bufs)?;
            check(*dst, outer * dst_axis * inner, bufs)?;
            let s = take(bufs, *src)?.to_vec();
            let d = &mut bufs[*dst];
            for o in 0..*outer {
                for a in 0..*len {
                    for i in 0..*inner {
                        let sv = s[(o * src_axis + src_off + a) * inner + i];
                        let di = (o * dst_axis + dst_off + a) * inner + i;
                        if *accumulate {
                            d[di] += sv;
                        } else {
                            d[di] = sv;
                        }
                    }
                }
            }
        }
        Step::Conv {
            x,
            w,
            bias,
            y,
            input,
            out_channels,
            kernel,
            stride,
            padding,
            dilation,
            groups,
            out_hw,
            act: a,
        } => {
            check(*x, numel(input), bufs)?;
            check(*y, input[0] * out_channels * out_hw[0] * out_hw[1], bufs)?;
            let b = match bias {
                Some(b) => Some(take(bufs, *b)?.to_vec()),
                None => None,
            };
            let r = conv2d(
                take(bufs, *x)?,
                take(bufs, *w)?,
                b.as_deref(),
                *input,
                *out_channels,
                *kernel,
                *stride,
                *padding,
                *dilation,
                *groups,
                *out_hw,
                *a,
            );
            bufs[*y][..r.len()].copy_from_slice(&r);
        }
        Step::BiasAct {
            y,
            bias,
            total,
            channels,
            inner,
            act: a,
        } => {
            check(*y, *total, bufs)?;
            let b = match bias {
                Some(b) => Some(take(bufs, *b)?.to_vec()),
                None => None,
            };
            for (i, v) in bufs[*y][..*total].iter_mut().enumerate() {
                let add = b
                    .as_ref()
                    .map_or(0.0, |b| b[(i / inner.max(&1)) % channels.max(&1)]);
                *v = act(*v + add, *a);
            }
        }
        Step::Act { x, y, len, act: a } => {
            check(*x, *len, bufs)?;
            check(*y, *len, bufs)?;
            let r: Vec<f32> = take(bufs, *x)?[..*len]
                .iter()
                .map(|&v| act(v, *a))
                .collect();
            bufs[*y][..*len].copy_from_slice(&r);
        }
        Step::Pool {
            x,
            y,
            input,
            out_hw,
            max,
            kernel,
            stride,
            padding,
        } => {
            check(*x, numel(input), bufs)?;
            let r = pool2d(
                take(bufs, *x)?,
                *input,
                *out_hw,
                *max,
                *kernel,
                *stride,
                *padding,
            );
            check(*y, r.len(), bufs)?;
            bufs[*y][..r.len()].copy_from_slice(&r);
        }
        Step::Gemm {
            a,
            b,
            c,
            trans_a,
            trans_b,
            m,
            n,
            k,
            lda,
            ldb,
            ldc,
            stride_a,
            stride_b,
            stride_c,
            batch,
        } => {
            check(*c, batch.saturating_sub(1) * stride_c + ldc * n, bufs)?;
            let av = take(bufs, *a)?.to_vec();
            let bv = take(bufs, *b)?.to_vec();
            gemm(
                &av,
                &bv,
                &mut bufs[*c],
                *trans_a,
                *trans_b,
                *m,
                *n,
                *k,
                *lda,
                *ldb,
                *ldc,
                [*stride_a, *stride_b, *stride_c],
                *batch,
            );
        }
        Step::Softmax {
            x,
            y,
            outer,
            dim,
            inner,
        } => {
            let len = outer * dim * inner;
            check(*x, len, bufs)?;
            check(*y, len, bufs)?;
            let r = softmax(&take(bufs, *x)?[..len], *outer, *dim, *inner);
            bufs[*y][..len].copy_from_slice(&r);
        }
        Step::LayerNorm {
            x,
            gamma,
            beta,
            y,
            rows,
            dim,
            eps,
        } => {
            let len = rows * dim;
            check(*x, len, bufs)?;
            check(*y, len, bufs)?;
            let r = layer_norm(
                &take(bufs, *x)?[..len],
                take(bufs, *gamma)?,
                take(bufs, *beta)?,
                *rows,
                *dim,
                *eps,
            );
            bufs[*y][..len].copy_from_slice(&r);
        }
        Step::Elementwise { srcs, y, len, kind } => {
            check(*y, *len, bufs)?;
            let mut acc = vec![
                match kind {
                    ElementwiseKind::Add => 0.0f32,
                    ElementwiseKind::Mul => 1.0,
                };
                *len
            ];
            for &s in srcs {
                check(s, *len, bufs)?;
                for (a, v) in acc.iter_mut().zip(&bufs[s][..*len]) {
                    match kind {
                        ElementwiseKind::Add => *a += v,
                        ElementwiseKind::Mul => *a *= v,
                    }
                }
            }
            bufs[*y][..*len].copy_from_slice(&acc);
        }
        Step::Transpose {
            x,
            y,
            in_shape,
            perm,
        } => {
            let len = numel(in_shape);
            check(*x, len, bufs)?;
            check(*y, len, bufs)?;
            let r = transpose(&take(bufs, *x)?[..len], in_shape, perm);
            bufs[*y][..len].copy_from_slice(&r);
        }
        Step::Spin { .. } => {}
    }
    Ok(())
}

/// Replay a program on host buffers: operators in topological order, each transfer right
/// before its consumer. Returns all buffers (index = [`BufId`]).
pub fn run_program(
    g: &Graph,
    p: &GraphProgram,
    transfer_dsts: &[NodeId],
) -> Result<Vec<Vec<f32>>, GpuError> {
    let mut bufs: Vec<Vec<f32>> = (0..p.buffers.len())
        .map(|i| {
            p.initial_data(i)
                .unwrap_or_else(|| vec![0.0; p.buffers[i].len])
        })
        .collect();
    for &id in g.topo_order() {
        for (x, &(src, dst)) in p.transfers.iter().enumerate() {
            if transfer_dsts.get(x) == Some(&id) {
                let data = take(&bufs, src)?.to_vec();
                bufs[dst].copy_from_slice(&data);
            }
        }
        if let Some(Some(op)) = p.ops.get(id.index()) {
            for s in &op.steps {
                run_step(&mut bufs, s)?;
            }
        }
    }
    Ok(bufs)
}

/// How far `got` is from `want`: the largest absolute difference divided by the largest
/// absolute reference value (at least 1), so the measure is scale-free for large activations
/// and absolute for small ones.
pub fn scaled_error(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let scale = want.iter().fold(1.0f64, |m, v| m.max(f64::from(v.abs())));
    let mut worst = 0.0f64;
    for (a, b) in got.iter().zip(want) {
        let d = f64::from(*a) - f64::from(*b);
        if !d.is_finite() {
            return f64::INFINITY;
        }
        worst = worst.max(d.abs());
    }
    worst / scale
}
