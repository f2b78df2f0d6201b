//! Measured tables: hits and misses, the fallback, stages, the cache and JSON tables.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use opsched_cost::cache::{CacheKey, CostCache, DeviceFingerprint, Measurement};
use opsched_cost::measured::{MeasuredTable, TableRow};
use opsched_cost::signature::{merged_signature, op_signature, stage_signature};
use opsched_cost::{CostModel, CostStats, ResourceDemand};
use opsched_graph::{Conv2d, DType, Graph, GraphBuilder, NodeId, Pool2d};

/// Every operator takes 1 ms alone, occupies half the SMs and a quarter of the bandwidth;
/// `k` running operators share the GPU fairly (rate `1/k`), so `sum(s r) <= 1`.
#[derive(Debug)]
struct Fixed;

impl CostModel for Fixed {
    fn name(&self) -> String {
        "fixed".into()
    }
    fn op_time(&self, _g: &Graph, _op: NodeId) -> f64 {
        1.0
    }
    fn demand(&self, _g: &Graph, _op: NodeId) -> ResourceDemand {
        ResourceDemand {
            sm_share: 0.5,
            bw_share: 0.25,
            ..ResourceDemand::default()
        }
    }
    fn rates(&self, _g: &Graph, running: &[NodeId], out: &mut Vec<f64>) {
        out.clear();
        out.resize(running.len(), 1.0 / running.len().max(1) as f64);
    }
    fn merged_time(&self, _g: &Graph, ops: &[NodeId]) -> Option<f64> {
        Some(0.5 * ops.len() as f64)
    }
    fn transfer_time(&self, _g: &Graph, _src: NodeId, _dst: NodeId) -> f64 {
        0.125
    }
    fn capacity_bound(&self, _g: &Graph, ops: &[NodeId], _gpus: usize) -> f64 {
        if ops.is_empty() {
            0.0
        } else {
            1.0
        }
    }
}

struct Model {
    g: Graph,
    conv: NodeId,
    pool: NodeId,
    convs: Vec<NodeId>,
}

/// A conv and a pool side by side (plus three more convs with other channel counts).
fn model(name: &str, batch: usize, extra_first: bool) -> Model {
    let mut b = GraphBuilder::new(name, DType::F32);
    let mut x = b.input("in", vec![batch, 16, 14, 14]);
    if extra_first {
        x = b.conv("stem", x, Conv2d::new(16, 1));
    }
    let conv = b.conv(&format!("{name}_c"), x, Conv2d::new(32, 3).relu());
    let pool = b.pool(&format!("{name}_p"), x, Pool2d::max(3, 1, 1));
    let convs = (0..3)
        .map(|i| b.conv(&format!("{name}_k{i}"), x, Conv2d::new(8 * (i + 1), 1)))
        .collect();
    Model {
        g: b.finish().unwrap(),
        conv,
        pool,
        convs,
    }
}

fn fp(name: &str) -> DeviceFingerprint {
    DeviceFingerprint {
        name: name.into(),
        sms: 132,
        driver: "550".into(),
        cudnn: "9".into(),
    }
}

#[test]
fn hits_misses_and_fallback() {
    let m = model("a", 1, false);
    let table = MeasuredTable::from_maps(
        Fixed,
        [(op_signature(&m.g, m.conv), 0.25)],
        std::iter::empty(),
    );
    assert_eq!(table.op_time(&m.g, m.conv), 0.25);
    assert_eq!(table.op_time(&m.g, m.pool), 1.0);
    assert_eq!(table.op_time(&m.g, m.conv), 0.25);
    assert_eq!(
        table.stats(),
        CostStats {
            measured: 2,
            estimated: 1
        }
    );
    // The same conv elsewhere in another model hits; at another batch it misses.
    let other = model("b", 1, true);
    assert_eq!(table.op_time(&other.g, other.conv), 0.25);
    let big = model("a", 4, false);
    assert_eq!(table.op_time(&big.g, big.conv), 1.0);
    assert_eq!(
        table.stats(),
        CostStats {
            measured: 3,
            estimated: 2
        }
    );
    // Delegated questions.
    assert_eq!(table.transfer_time(&m.g, m.conv, m.pool), 0.125);
    assert_eq!(table.demand(&m.g, m.pool).sm_share, 0.5);
    assert!(table.name().contains("fixed"));
    // Merged: the fallback's 1.0 for two ops, but never below the slowest part alone.
    assert_eq!(table.merged_time(&m.g, &[m.conv, m.pool]), Some(1.0));
    assert_eq!(table.merged_time(&m.g, &[m.conv, m.convs[0]]), Some(1.0));
    assert_eq!(table.merged_time(&m.g, &[m.conv]), Some(0.5));
}

/// A measured merged convolution (its row: the one convolution's signature) answers
/// `merged_time` for every group that merges into it, floored at its slowest member.
#[test]
fn merged_groups_read_their_measured_convolution() {
    let m = model("a", 1, false);
    let (k0, k1, k2) = (m.convs[0], m.convs[1], m.convs[2]);
    let sig = merged_signature(&m.g, &[k0, k1]).unwrap();
    let table = MeasuredTable::from_maps(
        Fixed,
        [
            (sig, 0.75),
            (op_signature(&m.g, k0), 0.5),
            (op_signature(&m.g, k1), 0.9),
        ],
        std::iter::empty(),
    );
    assert_eq!(
        table.measured_merged(&m.g, &[k1, k0]),
        Some(0.75),
        "in any order"
    );
    assert_eq!(
        table.merged_time(&m.g, &[k0, k1]),
        Some(0.9),
        "floored at k1"
    );
    // Another group (other channels) falls back: 0.5 per op (floored at k2's 1.0).
    assert_eq!(table.measured_merged(&m.g, &[k0, k2]), None);
    assert_eq!(table.merged_time(&m.g, &[k0, k1, k2]), Some(1.5));
    // At another batch the row does not apply.
    let big = model("a", 2, false);
    assert_eq!(table.measured_merged(&big.g, &big.convs[..2]), None);
}

#[test]
fn row_batch_and_dtype_must_agree() {
    let m = model("a", 1, false);
    let sig = op_signature(&m.g, m.conv);
    let mut table = MeasuredTable::new(Fixed);
    table
        .insert(TableRow::new(
            sig.clone(),
            Some(2),
            Some("f32".into()),
            Measurement::exact(0.1),
        ))
        .unwrap();
    assert_eq!(table.measured_op(&m.g, m.conv), None);
    table
        .insert(TableRow::new(
            sig.clone(),
            Some(1),
            Some("f16".into()),
            Measurement::exact(0.1),
        ))
        .unwrap();
    assert_eq!(table.measured_op(&m.g, m.conv), None);
    table
        .insert(TableRow::new(
            sig,
            Some(1),
            Some("f32".into()),
            Measurement::exact(0.1),
        ))
        .unwrap();
    assert_eq!(table.measured_op(&m.g, m.conv), Some(0.1));
    assert!(table
        .insert(TableRow::new("x", None, None, Measurement::exact(f64::NAN)))
        .is_err());
}

#[test]
fn stages_measured_or_simulated() {
    let m = model("a", 1, false);
    let (c, p) = (m.conv, m.pool);
    let stage = stage_signature(&m.g, &[vec![c], vec![p]]);
    let table = MeasuredTable::from_maps(Fixed, [(op_signature(&m.g, c), 0.3)], [(stage, 1.5)]);
    // Measured, whatever the group order.
    assert_eq!(table.stage_time(&m.g, &[vec![c], vec![p]]), 1.5);
    assert_eq!(table.stage_time(&m.g, &[vec![p], vec![c]]), 1.5);
    // Not measured: fluid simulation with the measured conv (0.3) and the fallback's pool
    // (1.0) at rate 1/2 each: the conv ends at 0.6, the pool's last 0.7 runs alone.
    let t = table.stage_time(&m.g, &[vec![c, m.convs[0]], vec![p]]);
    let expect = {
        // c (0.3) and p (1.0) at 1/2: c done at 0.6, p has 0.7 left; k0 (1.0) and p at 1/2:
        // p done after 1.4 more (t = 2.0), k0 has 0.3 left alone: 2.3.
        2.3
    };
    assert!((t - expect).abs() < 1e-9, "{t}");
    // A measurement below the longest group's sum is raised to it.
    let low = MeasuredTable::from_maps(
        Fixed,
        std::iter::empty(),
        [(stage_signature(&m.g, &[vec![c], vec![p]]), 0.2)],
    );
    assert_eq!(low.stage_time(&m.g, &[vec![p], vec![c]]), 1.0);
}

#[test]
fn from_cache_filters_by_device() {
    let m = model("a", 1, false);
    let dir = std::env::temp_dir().join(format!(
        "opsched-measured-test-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let mut cache = CostCache::open(dir.join("costs.bin")).unwrap();
    let k = |dev: &str, sig: String| CacheKey {
        device: fp(dev),
        signature: sig,
        batch: 1,
        dtype: "f32".into(),
    };
    cache.insert(
        k("h100", op_signature(&m.g, m.conv)),
        Measurement::exact(0.4),
    );
    cache.insert(
        k("a100", op_signature(&m.g, m.pool)),
        Measurement::exact(0.6),
    );
    cache.insert(
        k("h100", stage_signature(&m.g, &[vec![m.conv], vec![m.pool]])),
        Measurement::exact(1.25),
    );
    cache.save().unwrap();
    let cache = CostCache::open(dir.join("costs.bin")).unwrap();

    let table = MeasuredTable::from_cache(&cache, "h100", Fixed);
    assert_eq!(table.len(), 2);
    assert_eq!(table.op_time(&m.g, m.conv), 0.4);
    assert_eq!(table.op_time(&m.g, m.pool), 1.0); // a100's measurement is not used
    assert_eq!(table.stage_time(&m.g, &[vec![m.pool], vec![m.conv]]), 1.25);
    assert!(table.name().contains("h100"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn json_table_round_trip() {
    let m = model("a", 1, false);
    let mut table = MeasuredTable::new(Fixed);
    table
        .insert(TableRow::new(
            op_signature(&m.g, m.conv),
            Some(1),
            Some("f32".into()),
            Measurement {
                median_ms: 0.05,
                p10_ms: 0.049,
                p90_ms: 0.052,
                repeats: 100,
            },
        ))
        .unwrap();
    table
        .insert(TableRow::new(
            stage_signature(&m.g, &[vec![m.conv], vec![m.pool]]),
            None,
            None,
            Measurement::exact(0.9),
        ))
        .unwrap();
    let text = table.to_json_table();
    assert!(text.contains("\"median_ms\": 0.05"), "{text}");
    let back = MeasuredTable::from_json_table(&text, Fixed).unwrap();
    assert_eq!(back.rows(), table.rows());
    assert_eq!(back.to_json_table(), text);
    assert_eq!(back.op_time(&m.g, m.conv), 0.05);
    assert_eq!(back.stage_time(&m.g, &[vec![m.conv], vec![m.pool]]), 1.0);

    // Hand-written: batch and dtype optional; bad rows name themselves.
    let hand = format!(
        r#"[{{"signature": "{}", "median_ms": 0.5, "p10_ms": 0.4, "p90_ms": 0.6, "repeats": 3}}]"#,
        op_signature(&m.g, m.pool)
    );
    let t = MeasuredTable::from_json_table(&hand, Fixed).unwrap();
    assert_eq!(t.op_time(&m.g, m.pool), 0.5);
    let bad = r#"[{"signature": "x", "median_ms": -1, "p10_ms": 0, "p90_ms": 0, "repeats": 1}]"#;
    let err = MeasuredTable::from_json_table(bad, Fixed)
        .unwrap_err()
        .to_string();
    assert!(err.contains("row 0"), "{err}");
    let unknown = r#"[{"signature": "x", "median": 1}]"#;
    assert!(MeasuredTable::from_json_table(unknown, Fixed).is_err());
    // Every time of a row is checked at the door: finite, non-negative, not absurd.
    for (median, p10, p90, field) in [
        ("1", "-0.5", "1", "p10_ms"),
        ("1", "1", "1e300", "p90_ms"),
        ("2e9", "1", "1", "median_ms"),
    ] {
        let rows = format!(
            r#"[{{"signature": "ok", "median_ms": 1, "p10_ms": 1, "p90_ms": 1, "repeats": 1}},
                {{"signature": "y", "median_ms": {median}, "p10_ms": {p10}, "p90_ms": {p90},
                  "repeats": 1}}]"#
        );
        let err = MeasuredTable::from_json_table(&rows, Fixed)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("row 1") && err.contains(field),
            "{field}: {err}"
        );
    }
}

#[test]
fn capacity_bound_uses_measured_times() {
    let m = model("a", 1, false);
    let ops: HashMap<String, f64> = m
        .convs
        .iter()
        .map(|&o| (op_signature(&m.g, o), 2.0))
        .collect();
    let table = MeasuredTable::from_maps(Fixed, ops, std::iter::empty());
    let all = [m.conv, m.pool, m.convs[0], m.convs[1], m.convs[2]];
    // sum(t * s) = (1 + 1 + 2 + 2 + 2) * 0.5 = 4; longest 2.
    assert_eq!(table.capacity_bound(&m.g, &all, 1), 4.0);
    assert_eq!(table.capacity_bound(&m.g, &all, 4), 2.0);
    let no_share = MeasuredTable::from_maps(
        Fixed,
        [(op_signature(&m.g, m.convs[0]), 2.0)],
        std::iter::empty(),
    )
    .with_share_bound(false);
    assert_eq!(no_share.capacity_bound(&m.g, &all, 1), 2.0);
    assert_eq!(table.capacity_bound(&m.g, &[], 1), 0.0);
    // The bound never exceeds the makespan of running everything in one stage on one GPU.
    let stage: Vec<Vec<NodeId>> = all.iter().map(|&o| vec![o]).collect();
    assert!(table.capacity_bound(&m.g, &all, 1) <= table.stage_time(&m.g, &stage) + 1e-9);
}
