//! The sequential baseline: every operator once, in an order that respects every edge, on one
//! GPU, for every zoo model.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use opsched_baselines::Sequential;
use opsched_cost::{AnalyticalModel, DevicePreset, LinkPreset};
use opsched_graph::zoo::{self, ZooConfig};
use opsched_graph::Graph;
use opsched_schedule::{Platform, Schedule, Scheduler};

fn check(g: &Graph, s: &Schedule) {
    let Schedule::Stages(plan) = s else {
        panic!("{}: sequential gives a stage plan", g.name);
    };
    assert_eq!(plan.gpus.len(), 1, "{}: one GPU", g.name);
    let mut position = HashMap::new();
    for (i, st) in plan.gpus[0].iter().enumerate() {
        assert_eq!(st.groups.len(), 1, "{}: one group per stage", g.name);
        assert_eq!(st.groups[0].len(), 1, "{}: one op per stage", g.name);
        let op = st.groups[0][0];
        assert!(
            !g.node(op).op.is_input(),
            "{}: inputs are not scheduled",
            g.name
        );
        assert!(
            position.insert(op, i).is_none(),
            "{}: '{}' scheduled twice",
            g.name,
            g.node(op).name
        );
    }
    assert_eq!(position.len(), g.op_count(), "{}: every op once", g.name);
    for (src, dst, _) in g.edges() {
        if let (Some(a), Some(b)) = (position.get(&src), position.get(&dst)) {
            assert!(
                a < b,
                "{}: '{}' runs before its producer '{}'",
                g.name,
                g.node(dst).name,
                g.node(src).name
            );
        }
    }
}

#[test]
fn covers_every_op_once_in_dependency_order_on_every_zoo_model() {
    let platform = match (DevicePreset::all().first(), LinkPreset::all().first()) {
        (Some(d), Some(l)) => Some((d.clone(), l.clone())),
        _ => None,
    };
    for m in zoo::models() {
        let g = m.build(&ZooConfig::default()).unwrap();
        check(&g, &Sequential::plan(&g));
        match &platform {
            Some((device, link)) => {
                let p = Platform {
                    gpus: 2,
                    streams: 4,
                    device: device.clone(),
                    link: link.clone(),
                };
                let cost = AnalyticalModel::new(device.clone(), link.clone());
                let (s, stats) = Sequential.schedule(&g, &p, &cost).unwrap();
                check(&g, &s);
                assert!(stats.wall_ms >= 0.0);
                assert_eq!(Sequential.name(), "sequential");
            }
            None => eprintln!("no device presets yet: the Scheduler path is not exercised"),
        }
    }
}

#[test]
fn a_platform_without_gpus_is_refused() {
    let (Some(device), Some(link)) = (DevicePreset::all().first(), LinkPreset::all().first())
    else {
        eprintln!("skipping: no device presets yet");
        return;
    };
    let g = zoo::build("squeezenet", &ZooConfig::default()).unwrap();
    let p = Platform {
        gpus: 0,
        streams: 1,
        device: device.clone(),
        link: link.clone(),
    };
    let cost = AnalyticalModel::new(device.clone(), link.clone());
    assert!(Sequential.schedule(&g, &p, &cost).is_err());
}
