//! Alg. 3 of HIOS, lines 1-26: inter-GPU operator mapping by mapping recording.

use crate::dense::Dense;

/// What the mapping found, for statistics.
#[derive(Clone, Debug, Default)]
pub(crate) struct MrOutcome {
    /// GPU of each operator (dense index).
    pub gpu_of: Vec<usize>,
    /// Table cells filled.
    pub cells: u64,
    /// (i, j, k) triples tried.
    pub tries: u64,
}

/// Alg. 3: operators in priority order `v1 .. vn`; cell `(i, j)` records the earliest finish
/// time `t[i][j]` of `vi` on GPU `j` and the GPU `g[i][j]` of `v(i-1)` in the recorded
/// schedule that achieves it. For each `(i, j)` and each GPU `k` of `v(i-1)` (lines 7-8), the
/// schedule of `v1 .. v(i-1)` is read back from the table (lines 10-12), `vi` starts when GPU
/// `j` is free (line 14) and **every** producer's output has arrived (lines 15-19: the
/// reference code honours only the first producer), and the best `k` is recorded (lines
/// 20-21). The last row's best cell is followed back (lines 22-26).
///
/// The read-back does not depend on `j`, so it is done once per `(i, k)`: `O(n^2 M + n E M)`.
pub(crate) fn map_recording(d: &Dense, gpus: usize) -> MrOutcome {
    let n = d.len();
    let mut out = MrOutcome {
        gpu_of: vec![usize::MAX; n],
        ..MrOutcome::default()
    };
    if n == 0 || gpus == 0 {
        return out;
    }
    let m = gpus;
    let order = &d.order;
    let mut rank = vec![0usize; n];
    for (i, &v) in order.iter().enumerate() {
        rank[v] = i;
    }
    // Lines 2-4.
    let mut t = vec![f64::INFINITY; n * m];
    let mut g = vec![0usize; n * m];
    // Line 5: v1 on the first GPU.
    t[0] = d.single[order[0]];
    out.cells += 1;
    let mut t_f = vec![0.0f64; n];
    let mut g_v = vec![0usize; n];
    let mut free = vec![0.0f64; m];
    for i in 1..n {
        let v = order[i];
        for k in 0..m.min(i) {
            // Lines 10-12: the recorded schedule of v1 .. v(i-1) with v(i-1) on GPU k.
            let mut mm = k;
            for l in (0..i).rev() {
                t_f[l] = t[l * m + mm];
                g_v[l] = mm;
                mm = g[l * m + mm];
            }
            free.iter_mut().for_each(|f| *f = 0.0);
            for l in 0..i {
                if let Some(f) = free.get_mut(g_v[l]) {
                    *f = f.max(t_f[l]);
                }
            }
            for j in 0..m.min(i + 1) {
                out.tries += 1;
                // Line 14: GPU j is free.
                let mut tk = free[j];
                // Lines 15-19: every producer (all of them precede vi in priority order).
                for &(u, tr) in &d.preds[v] {
                    let ru = rank[u];
                    if ru >= i {
                        continue; // cannot happen: the priority order is topological
                    }
                    tk = if g_v[ru] == j {
                        tk.max(t_f[ru])
                    } else {
                        tk.max(t_f[ru] + tr)
                    };
                }
                // Lines 20-21.
                let fin = tk + d.single[v];
                if t[i * m + j] > fin {
                    if t[i * m + j] == f64::INFINITY {
                        out.cells += 1;
                    }
                    t[i * m + j] = fin;
                    g[i * m + j] = k;
                }
            }
        }
    }
    // Line 22: the first GPU with the earliest finish of vn.
    let last = n - 1;
    let mut jbest = 0usize;
    for j in 1..m.min(n) {
        if t[last * m + j] < t[last * m + jbest] {
            jbest = j;
        }
    }
    // Lines 23-25.
    let mut mm = jbest;
    for i in (0..n).rev() {
        out.gpu_of[order[i]] = mm;
        mm = g[i * m + mm];
    }
    out
}
