//! Measured cost tables: operator and stage times measured on a real GPU, answering where they
//! can and falling back to another [`CostModel`] (normally the analytical model) elsewhere.
//!
//! A table is keyed by [`signature`](crate::signature)s, so one measurement serves every
//! operator that does the same work, in any model. It comes from the persistent
//! [`CostCache`] (the entries of one device), from in-memory maps, or from a human-readable JSON
//! table (`fixtures/costs/<device>/*.json`): a list of rows
//!
//! ```json
//! [{"signature": "conv2d(oc=64,k=3x3,s=1x1,p=1x1,d=1x1,g=1)[1x64x56x56]f32",
//!   "batch": 1, "dtype": "f32", "median_ms": 0.05, "p10_ms": 0.049, "p90_ms": 0.052,
//!   "repeats": 100}]
//! ```
//!
//! Rows whose signature starts with `stage[` are stages ([`stage_signature`]). A merged
//! group's convolution is an operator row under [`merged_signature`] (the signature of that one
//! convolution), which [`CostModel::merged_time`] reads. `batch` and
//! `dtype` may be left out (the signature already fixes them); when present, an operator only
//! matches a row whose batch ([`batch_of`]) and dtype agree.
//!
//! A row measured channels last has `@nhwc` after its signature
//! ([`measured_in`](crate::signature::measured_in)). A table answers in one layout
//! ([`MeasuredTable::with_layout`], NCHW unless told): with the row of that layout where it
//! has one, else with the other's (a cuDNN convolution measured in NCHW includes the layout
//! conversions cuDNN runs around it: a pessimistic stand-in, but a measurement all the same);
//! [`MeasuredTable::measured_op_in`] says which answered.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use opsched_graph::{Graph, NodeId};
use serde::{Deserialize, Serialize};

use crate::cache::{CostCache, Measurement};
use crate::signature::{
    batch_of, is_stage_signature, merged_signature, op_signature, stage_signature, Layout,
    NHWC_SUFFIX,
};
use crate::{fluid, CostModel, CostStats, ResourceDemand};

/// One row of a measured table (also the JSON table's row).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableRow {
    pub signature: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    pub median_ms: f64,
    pub p10_ms: f64,
    pub p90_ms: f64,
    pub repeats: u32,
}

impl TableRow {
    /// A row from a measurement.
    pub fn new(
        signature: impl Into<String>,
        batch: Option<u32>,
        dtype: Option<String>,
        m: Measurement,
    ) -> Self {
        TableRow {
            signature: signature.into(),
            batch,
            dtype,
            median_ms: m.median_ms,
            p10_ms: m.p10_ms,
            p90_ms: m.p90_ms,
            repeats: m.repeats,
        }
    }

    /// Why the row cannot be used, if it cannot.
    fn problem(&self) -> Option<String> {
        if self.signature.is_empty() {
            return Some("empty signature".into());
        }
        let times = [
            ("median_ms", self.median_ms),
            ("p10_ms", self.p10_ms),
            ("p90_ms", self.p90_ms),
        ];
        times
            .into_iter()
            .find_map(|(field, ms)| opsched_graph::limits::check_time_ms(field, ms).err())
            .map(|why| format!("'{}': {why}", self.signature))
    }

    fn matches(&self, batch: usize, dtype: &str) -> bool {
        self.batch.is_none_or(|b| b as usize == batch)
            && self.dtype.as_deref().is_none_or(|d| d == dtype)
    }
}

/// Measured operator and stage times over a fallback model.
///
/// Counters: every [`CostModel::op_time`] answer is counted as measured or estimated (stage
/// times simulated from operator times count their operators' lookups).
#[derive(Debug)]
pub struct MeasuredTable<M: CostModel> {
    fallback: M,
    /// Where the measurements come from, e.g. the device name.
    source: String,
    ops: HashMap<String, TableRow>,
    stages: HashMap<String, TableRow>,
    /// The layout whose rows answer first.
    layout: Layout,
    share_bound: bool,
    measured: AtomicU64,
    estimated: AtomicU64,
}

impl<M: CostModel> MeasuredTable<M> {
    /// An empty table: every answer comes from `fallback`.
    pub fn new(fallback: M) -> Self {
        MeasuredTable {
            fallback,
            source: "table".into(),
            ops: HashMap::new(),
            stages: HashMap::new(),
            layout: Layout::Nchw,
            share_bound: true,
            measured: AtomicU64::new(0),
            estimated: AtomicU64::new(0),
        }
    }

    /// The entries of `cache` measured on devices named `device` (any driver or cuDNN version;
    /// where several fingerprints of that name measured one signature, the one sorting last,
    /// normally the newest driver, wins). Unusable entries are skipped with a warning.
    pub fn from_cache(cache: &CostCache, device: &str, fallback: M) -> Self {
        let mut t = Self::new(fallback);
        t.source = device.to_string();
        let costs = cache
            .entries_for_device(device)
            .filter(|(k, _)| !k.signature.starts_with(crate::cache::KERNEL_PREFIX));
        for (k, m) in costs {
            let row = TableRow::new(
                k.signature.clone(),
                Some(k.batch),
                Some(k.dtype.clone()),
                *m,
            );
            if let Err(why) = t.insert(row) {
                tracing::warn!(
                    "cost cache {}: skipping entry: {why}",
                    cache.path().display()
                );
            }
        }
        tracing::debug!(
            "measured table for {device}: {} operators, {} stages",
            t.ops.len(),
            t.stages.len()
        );
        t
    }

    /// A table from in-memory maps of operator signatures and stage signatures to
    /// milliseconds. Unusable times (negative, not finite) are skipped with a warning.
    pub fn from_maps(
        fallback: M,
        ops: impl IntoIterator<Item = (String, f64)>,
        stages: impl IntoIterator<Item = (String, f64)>,
    ) -> Self {
        let mut t = Self::new(fallback);
        for (sig, ms) in ops.into_iter().chain(stages) {
            if let Err(why) = t.insert(TableRow::new(sig, None, None, Measurement::exact(ms))) {
                tracing::warn!("measured table: skipping entry: {why}");
            }
        }
        t
    }

    /// Parse a JSON table (a list of [`TableRow`]s). Errors name the bad row.
    pub fn from_json_table(text: &str, fallback: M) -> Result<Self, serde_json::Error> {
        let rows: Vec<TableRow> = serde_json::from_str(text)?;
        let mut t = Self::new(fallback);
        for (i, row) in rows.into_iter().enumerate() {
            t.insert(row).map_err(|why| {
                <serde_json::Error as serde::de::Error>::custom(format!("row {i}: {why}"))
            })?;
        }
        Ok(t)
    }

    /// The table as JSON (pretty, one row per measurement, sorted by signature): the format
    /// [`from_json_table`](Self::from_json_table) reads.
    pub fn to_json_table(&self) -> String {
        let rows = self.rows();
        serde_json::to_string_pretty(&rows).unwrap_or_else(|e| {
            // Rows are plain data; serialization cannot fail short of a serde_json bug.
            tracing::error!("measured table: cannot serialize: {e}");
            "[]".into()
        })
    }

    /// Add a row (an operator's or, when its signature starts with `stage[`, a stage's),
    /// replacing one with the same signature.
    pub fn insert(&mut self, row: TableRow) -> Result<(), String> {
        if let Some(why) = row.problem() {
            return Err(why);
        }
        let map = if is_stage_signature(&row.signature) {
            &mut self.stages
        } else {
            &mut self.ops
        };
        map.insert(row.signature.clone(), row);
        Ok(())
    }

    /// Use the SM and bandwidth shares in [`CostModel::capacity_bound`] (the default). Turn it
    /// off when the fallback's rates law does not keep the running operators' shares within one
    /// GPU (e.g. [`IdealModel`](crate::IdealModel), where nothing slows anything down).
    pub fn with_share_bound(mut self, on: bool) -> Self {
        self.share_bound = on;
        self
    }

    /// Answer with the rows measured in `layout` where there are, else with the other
    /// layout's (see the module documentation).
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// The layout whose rows answer first.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Name the table's source (shown in [`CostModel::name`]).
    pub fn with_source(mut self, source: impl Into<String>) -> Self {
        self.source = source.into();
        self
    }

    pub fn fallback(&self) -> &M {
        &self.fallback
    }

    /// All rows, operators and stages, sorted by signature.
    pub fn rows(&self) -> Vec<TableRow> {
        let mut rows: Vec<TableRow> = self
            .ops
            .values()
            .chain(self.stages.values())
            .cloned()
            .collect();
        rows.sort_by(|a, b| a.signature.cmp(&b.signature));
        rows
    }

    /// Number of measured operators and stages.
    pub fn len(&self) -> usize {
        self.ops.len() + self.stages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The row of `signature` in `map`: measured in this table's layout, else in the other
    /// (with the layout that answered).
    fn lookup<'a>(
        &self,
        map: &'a HashMap<String, TableRow>,
        mut signature: String,
    ) -> Option<(&'a TableRow, Layout)> {
        let base = signature.len();
        for layout in [self.layout, self.layout.other()] {
            signature.truncate(base);
            if layout == Layout::Nhwc {
                signature.push_str(NHWC_SUFFIX);
            }
            if let Some(row) = map.get(&signature) {
                return Some((row, layout));
            }
        }
        None
    }

    /// The measured time of `op` and the layout it was measured in, if the table has it.
    pub fn measured_op_in(&self, g: &Graph, op: NodeId) -> Option<(f64, Layout)> {
        if self.ops.is_empty() {
            return None;
        }
        let (row, layout) = self.lookup(&self.ops, op_signature(g, op))?;
        row.matches(batch_of(g, op), &g.dtype.to_string())
            .then_some((row.median_ms, layout))
    }

    /// The measured time of `op`, if the table has it.
    pub fn measured_op(&self, g: &Graph, op: NodeId) -> Option<f64> {
        self.measured_op_in(g, op).map(|(ms, _)| ms)
    }

    /// The measured time of the one convolution a merged group runs as, if the table has it.
    pub fn measured_merged(&self, g: &Graph, ops: &[NodeId]) -> Option<f64> {
        if self.ops.is_empty() {
            return None;
        }
        let (row, _) = self.lookup(&self.ops, merged_signature(g, ops)?)?;
        row.matches(batch_of(g, *ops.first()?), &g.dtype.to_string())
            .then_some(row.median_ms)
    }

    /// The measured time of a stage, if the table has it.
    pub fn measured_stage(&self, g: &Graph, groups: &[Vec<NodeId>]) -> Option<f64> {
        if self.stages.is_empty() {
            return None;
        }
        let (row, _) = self.lookup(&self.stages, stage_signature(g, groups))?;
        let first = groups.iter().flatten().next()?;
        row.matches(batch_of(g, *first), &g.dtype.to_string())
            .then_some(row.median_ms)
    }

    /// `op_time` without touching the counters: (time, measured?).
    fn time(&self, g: &Graph, op: NodeId) -> (f64, bool) {
        match self.measured_op(g, op) {
            Some(t) => (t, true),
            None => (self.fallback.op_time(g, op), false),
        }
    }
}

impl<M: CostModel> CostModel for MeasuredTable<M> {
    fn name(&self) -> String {
        format!("measured({})+{}", self.source, self.fallback.name())
    }

    /// The measured median where the table has the operator's signature (and its batch and
    /// dtype agree), else the fallback's time.
    fn op_time(&self, g: &Graph, op: NodeId) -> f64 {
        let (t, hit) = self.time(g, op);
        let counter = if hit { &self.measured } else { &self.estimated };
        counter.fetch_add(1, Ordering::Relaxed);
        t
    }

    fn demand(&self, g: &Graph, op: NodeId) -> ResourceDemand {
        self.fallback.demand(g, op)
    }

    fn rates(&self, g: &Graph, running: &[NodeId], out: &mut Vec<f64>) {
        self.fallback.rates(g, running, out);
    }

    /// A measured stage's time where the table has it, raised to the longest group's sum of
    /// operator times if the measurement (noisy) is below it, as the trait requires. Otherwise
    /// the fluid simulation of this table's operator times under the fallback's rates.
    fn stage_time(&self, g: &Graph, groups: &[Vec<NodeId>]) -> f64 {
        match self.measured_stage(g, groups) {
            Some(t) => {
                let longest = groups
                    .iter()
                    .map(|grp| grp.iter().map(|&o| self.time(g, o).0).sum::<f64>())
                    .fold(0.0, f64::max);
                t.max(longest)
            }
            None => fluid::stage_time(self, g, groups),
        }
    }

    /// The measured merged convolution where the table has it, else the fallback's merged
    /// time, raised to the largest of this table's times of `ops` (the trait's floor: a
    /// merged operator is never faster than its slowest part alone).
    fn merged_time(&self, g: &Graph, ops: &[NodeId]) -> Option<f64> {
        let merged = match self.measured_merged(g, ops) {
            Some(t) => t,
            None => self.fallback.merged_time(g, ops)?,
        };
        Some(
            ops.iter()
                .map(|&o| self.time(g, o).0)
                .fold(merged, f64::max),
        )
    }

    fn transfer_time(&self, g: &Graph, src: NodeId, dst: NodeId) -> f64 {
        self.fallback.transfer_time(g, src, dst)
    }

    /// `max(max_i t_i, sum_i t_i s_i / G, sum_i t_i b_i / G)` with this table's times `t_i`,
    /// the fallback's SM shares `s_i` and bandwidth shares `b_i`, and `G` GPUs; only
    /// `max_i t_i` when the share bound is off ([`MeasuredTable::with_share_bound`]).
    ///
    /// Proof: every rate is at most 1 (trait contract), so operator `i` runs for at least
    /// `t_i`: the makespan is at least `max_i t_i`. For the shares, assume (as the analytical
    /// model's and the hios-sim rates laws do) that at every instant the operators running on
    /// one GPU satisfy `sum_j s_j r_j <= 1` and `sum_j b_j r_j <= 1`. Operator `i` finishes when
    /// the integral of its rate reaches `t_i`, so the integral over the schedule of
    /// `sum_j s_j r_j`, summed over all GPUs, equals `sum_i s_i t_i`; it is at most `G * T`
    /// for a makespan `T`. Hence `T >= sum_i s_i t_i / G`, and likewise for `b`. Nothing in the
    /// proof depends on where the times `t_i` came from, so measured times keep it valid.
    fn capacity_bound(&self, g: &Graph, ops: &[NodeId], gpus: usize) -> f64 {
        let (mut longest, mut sm, mut bw) = (0.0f64, 0.0, 0.0);
        for &o in ops {
            let t = self.time(g, o).0;
            longest = longest.max(t);
            if self.share_bound {
                let d = self.fallback.demand(g, o);
                sm += t * d.sm_share.clamp(0.0, 1.0);
                bw += t * d.bw_share.clamp(0.0, 1.0);
            }
        }
        let gpus = gpus.max(1) as f64;
        longest.max(sm / gpus).max(bw / gpus)
    }

    /// The fallback's: measured operator times include their launch floors, events and host
    /// issue stay overheads of the execution.
    fn overheads(&self) -> crate::Overheads {
        self.fallback.overheads()
    }

    fn stats(&self) -> CostStats {
        CostStats {
            measured: self.measured.load(Ordering::Relaxed),
            estimated: self.estimated.load(Ordering::Relaxed),
        }
    }
}
