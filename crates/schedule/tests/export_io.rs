//! Exports (Chrome trace, SVG Gantt) of hand-made timelines, and schedule files (name-based
//! JSON, IOS stages).

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use opsched_graph::formats::json as graph_json;
use opsched_graph::zoo::{self, ZooConfig};
use opsched_graph::{Graph, NodeId};
use opsched_schedule::export::{chrome_trace, svg_gantt};
use opsched_schedule::io;
use opsched_schedule::{
    GpuStreams, OpSpan, Schedule, ScheduleError, Stage, StagePlan, StageStrategy, StreamPlan,
    Timeline, TransferSpan,
};
use serde_json::json;

/// A plausible timeline: ops in topological order dealt onto `gpus` GPUs x 3 streams, each
/// starting when its producers (and transfers from other GPUs) are done.
fn fake_timeline(g: &Graph, gpus: usize) -> Timeline {
    let ops: Vec<NodeId> = g.ops().collect();
    let per_gpu = ops.len().div_ceil(gpus);
    let mut end: HashMap<NodeId, (f64, usize)> = HashMap::new();
    let mut stream_free: HashMap<(usize, usize), f64> = HashMap::new();
    let mut t = Timeline::default();
    for (i, &op) in ops.iter().enumerate() {
        let gpu = i / per_gpu;
        let stream = i % 3;
        let mut ready: f64 = *stream_free.get(&(gpu, stream)).unwrap_or(&0.0);
        for p in g.preds(op) {
            if let Some(&(e, pg)) = end.get(&p) {
                if pg != gpu {
                    t.transfers.push(TransferSpan {
                        src: p,
                        dst: op,
                        src_gpu: pg,
                        dst_gpu: gpu,
                        start_ms: e,
                        end_ms: e + 0.02,
                    });
                    ready = ready.max(e + 0.02);
                } else {
                    ready = ready.max(e);
                }
            }
        }
        let dur = 0.03 + 0.01 * (i % 7) as f64;
        t.ops.push(OpSpan {
            op,
            gpu,
            stream,
            start_ms: ready,
            end_ms: ready + dur,
        });
        end.insert(op, (ready + dur, gpu));
        stream_free.insert((gpu, stream), ready + dur);
        t.makespan_ms = t.makespan_ms.max(ready + dur);
    }
    t
}

fn nasty_graph() -> Graph {
    graph_json::from_value(json!({
        "format": "opsched-graph", "version": 1, "name": "nasty",
        "nodes": [
            {"name": "x", "op": {"type": "input", "shape": [1, 3, 8, 8]}},
            {"name": "a<&>b \"q\"", "op": {"type": "conv2d", "out_channels": 4, "kernel": [1, 1]},
             "inputs": ["x"]},
            {"name": "c", "op": {"type": "pool2d", "kind": "max", "kernel": [1, 1]},
             "inputs": ["a<&>b \"q\""]}
        ]
    }))
    .unwrap()
}

#[test]
fn chrome_trace_has_one_complete_event_per_op_in_microseconds() {
    let g = zoo::build("googlenet", &ZooConfig::default()).unwrap();
    let t = fake_timeline(&g, 2);
    assert!(!t.transfers.is_empty());
    let trace = chrome_trace(&g, &t);
    // It survives a text round trip and has the right envelope.
    let text = serde_json::to_string(&trace).unwrap();
    let trace: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(trace["displayTimeUnit"], "ms");
    let events = trace["traceEvents"].as_array().unwrap();

    let by_name: HashMap<&str, &OpSpan> = t
        .ops
        .iter()
        .map(|s| (g.node(s.op).name.as_str(), s))
        .collect();
    let op_events: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] != "transfer")
        .collect();
    assert_eq!(op_events.len(), g.op_count());
    let mut seen = std::collections::HashSet::new();
    for e in &op_events {
        let name = e["name"].as_str().unwrap();
        assert!(seen.insert(name), "{name} twice");
        let s = by_name[name];
        assert!((e["ts"].as_f64().unwrap() - s.start_ms * 1e3).abs() < 1e-3);
        assert!((e["dur"].as_f64().unwrap() - (s.end_ms - s.start_ms) * 1e3).abs() < 1e-3);
        assert_eq!(e["pid"], s.gpu);
        assert_eq!(e["tid"], s.stream);
        assert_eq!(e["cat"], g.node(s.op).op.type_name());
        assert_eq!(e["args"]["op"], g.node(s.op).op.type_name());
        assert_eq!(e["args"]["shape"], json!(g.node(s.op).shape));
    }
    let transfers = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "transfer")
        .count();
    assert_eq!(transfers, t.transfers.len());
    // Metadata names the GPUs, the streams and the transfer rows.
    let meta = |what: &str, name: &str| {
        events
            .iter()
            .any(|e| e["ph"] == "M" && e["name"] == what && e["args"]["name"] == name)
    };
    assert!(meta("process_name", "GPU 0") && meta("process_name", "GPU 1"));
    assert!(meta("thread_name", "stream 0") && meta("thread_name", "stream 2"));
    assert!(meta("thread_name", "transfers -> GPU 1"));
}

#[test]
fn svg_gantt_has_one_bar_per_op_and_escapes_names() {
    let g = zoo::build("inception_v3", &ZooConfig::default()).unwrap();
    let t = fake_timeline(&g, 2);
    let svg = svg_gantt(&g, &t, "inception_v3 <fake> & co");
    assert!(svg.starts_with("<svg"));
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<rect class=\"op\"").count(), g.op_count());
    assert_eq!(
        svg.matches("<rect class=\"xfer\"").count(),
        t.transfers.len()
    );
    assert!(svg.contains("inception_v3 &lt;fake&gt; &amp; co"));
    assert!(svg.contains("makespan"));
    assert!(svg.contains("GPU 1 stream 2"));
    assert!(svg.contains(">conv2d<"), "legend names the op types");
    if let Ok(dir) = std::env::var("OPSCHED_SVG_DIR") {
        std::fs::write(format!("{dir}/inception_fake.svg"), &svg).unwrap();
    }

    let g = nasty_graph();
    let ops: Vec<NodeId> = g.ops().collect();
    let t = Timeline {
        ops: vec![
            OpSpan {
                op: ops[0],
                gpu: 0,
                stream: 0,
                start_ms: 0.0,
                end_ms: 2.0,
            },
            OpSpan {
                op: ops[1],
                gpu: 0,
                stream: 1,
                start_ms: 2.0,
                end_ms: 3.0,
            },
        ],
        transfers: vec![],
        makespan_ms: 3.0,
    };
    let svg = svg_gantt(&g, &t, "nasty");
    if let Ok(dir) = std::env::var("OPSCHED_SVG_DIR") {
        std::fs::write(format!("{dir}/nasty.svg"), &svg).unwrap();
    }
    assert_eq!(svg.matches("<rect class=\"op\"").count(), 2);
    assert!(svg.contains("a&lt;&amp;&gt;b &quot;q&quot;"), "{svg}");
    assert!(!svg.contains("a<&>b"));
    let trace = chrome_trace(&g, &t);
    assert!(trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "a<&>b \"q\""));
}

#[test]
fn empty_timeline_exports() {
    let g = nasty_graph();
    let t = Timeline::default();
    let svg = svg_gantt(&g, &t, "empty");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(
        chrome_trace(&g, &t)["traceEvents"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
}

fn stage_plan(g: &Graph) -> Schedule {
    let ops: Vec<NodeId> = g.ops().collect();
    let mut gpu0 = Vec::new();
    let mut gpu1 = Vec::new();
    for (i, chunk) in ops.chunks(3).enumerate() {
        let stage = Stage {
            strategy: if i % 4 == 3 {
                StageStrategy::Merge
            } else {
                StageStrategy::Concurrent
            },
            groups: chunk.chunks(2).map(<[NodeId]>::to_vec).collect(),
        };
        if i % 2 == 0 {
            gpu0.push(stage);
        } else {
            gpu1.push(stage);
        }
    }
    Schedule::Stages(StagePlan {
        gpus: vec![gpu0, gpu1],
    })
}

fn stream_plan(g: &Graph) -> Schedule {
    let ops: Vec<NodeId> = g.ops().collect();
    let mut streams = vec![Vec::new(); 4];
    for (i, &op) in ops.iter().enumerate() {
        streams[i % 4].push(op);
    }
    Schedule::Streams(StreamPlan {
        gpus: vec![
            GpuStreams {
                streams,
                launch_order: Some(ops.clone()),
            },
            GpuStreams {
                streams: vec![vec![]],
                launch_order: None,
            },
        ],
    })
}

#[test]
fn schedule_files_round_trip_both_shapes() {
    let g = zoo::build("squeezenet", &ZooConfig::default()).unwrap();
    let dir = std::env::temp_dir().join(format!("opsched-export-io-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (tag, s) in [("stages", stage_plan(&g)), ("streams", stream_plan(&g))] {
        let doc = io::to_json(&g, &s);
        assert_eq!(doc["format"], "opsched-schedule");
        assert_eq!(doc["version"], 1);
        assert_eq!(doc["model"], g.name);
        assert_eq!(doc["shape"], tag);
        assert_eq!(io::from_json(&g, &doc).unwrap(), s);
        let path = dir.join(format!("{tag}.json"));
        io::save(&g, &s, &path).unwrap();
        assert_eq!(io::load(&g, &path).unwrap(), s);
        let text = std::fs::read_to_string(&path).unwrap();
        let names_first_op = g.node(g.ops().next().unwrap()).name.clone();
        assert!(
            text.contains(&format!("\"{names_first_op}\"")),
            "names, not ids"
        );
    }
    // Names are all that matters: the stage document reads the same on a rebuilt graph.
    let doc = io::to_json(&g, &stage_plan(&g));
    let again = zoo::build("squeezenet", &ZooConfig::default()).unwrap();
    assert_eq!(io::from_json(&again, &doc).unwrap(), stage_plan(&again));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn err(g: &Graph, doc: serde_json::Value) -> String {
    match io::from_json(g, &doc) {
        Ok(s) => panic!("accepted {doc}: {s:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn schedule_file_errors_name_the_field_or_op() {
    let g = zoo::build("squeezenet", &ZooConfig::default()).unwrap();
    let first = g.node(g.ops().next().unwrap()).name.clone();
    let input = g.node(g.inputs().next().unwrap()).name.clone();
    let base = |gpus: serde_json::Value| {
        json!({"format": "opsched-schedule", "version": 1, "model": "squeezenet",
               "shape": "stages", "gpus": gpus})
    };

    let e = err(
        &g,
        base(json!([[{"strategy": "concurrent", "groups": [[first, "ghost_op"]]}]])),
    );
    assert!(
        e.contains("'ghost_op'") && e.contains("GPU 0 stage 0"),
        "{e}"
    );

    let e = err(
        &g,
        base(json!([[{"strategy": "concurrent", "groups": [[input]]}]])),
    );
    assert!(
        e.contains(&format!("'{input}'")) && e.contains("graph input"),
        "{e}"
    );

    let e = err(
        &g,
        base(json!([[{"strategy": "parallel", "groups": [[first]]}]])),
    );
    assert!(e.contains("strategy") && e.contains("parallel"), "{e}");

    let e = err(
        &g,
        base(json!([[{"strategy": "concurrent", "groups": [[first]], "colour": 1}]])),
    );
    assert!(e.contains("unknown field 'colour'"), "{e}");

    let e = err(&g, base(json!([[{"strategy": "concurrent"}]])));
    assert!(e.contains("missing field 'groups'"), "{e}");

    let mut doc = base(json!([]));
    doc["format"] = json!("opsched-graph");
    assert!(err(&g, doc).contains("format"));

    let mut doc = base(json!([]));
    doc["version"] = json!(2);
    assert!(err(&g, doc).contains("version 2"));

    let mut doc = base(json!([]));
    doc["extra"] = json!(true);
    assert!(err(&g, doc).contains("unknown field 'extra'"));

    let mut doc = base(json!([]));
    doc["shape"] = json!("lanes");
    assert!(err(&g, doc).contains("lanes"));

    let doc = json!({"format": "opsched-schedule", "version": 1, "shape": "streams",
                     "gpus": [{"streams": [[first]], "launch_order": ["nope"]}]});
    let e = err(&g, doc);
    assert!(e.contains("'nope'") && e.contains("launch_order"), "{e}");

    let doc = json!({"format": "opsched-schedule", "version": 1, "shape": "streams",
                     "gpus": [{"streams": [[first]], "order": []}]});
    assert!(err(&g, doc).contains("unknown field 'order'"));

    // File errors name the file.
    let dir = std::env::temp_dir().join(format!("opsched-io-err-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("broken.json");
    std::fs::write(&path, "{ nope").unwrap();
    let e = io::load(&g, &path).unwrap_err();
    assert!(matches!(e, ScheduleError::File { .. }));
    assert!(e.to_string().contains("broken.json"), "{e}");
    std::fs::write(
        &path,
        serde_json::to_string(&base(json!([[{"groups": [["ghost"]]}]]))).unwrap(),
    )
    .unwrap();
    let e = io::load(&g, &path).unwrap_err().to_string();
    assert!(e.contains("broken.json") && e.contains("'ghost'"), "{e}");
    assert!(io::load(&g, dir.join("absent.json")).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ios_fixture_stages_cover_every_op() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/ios/v100.json");
    let g = opsched_graph::formats::load_file(path).unwrap();
    let s = io::from_ios_stages(&g).expect("the IOS file carries stages");
    let Schedule::Stages(plan) = &s else {
        panic!("a stage plan");
    };
    assert_eq!(plan.gpus.len(), 1);
    let mut seen = std::collections::HashSet::new();
    for st in &plan.gpus[0] {
        assert_eq!(st.strategy, StageStrategy::Concurrent);
        for op in st.ops() {
            assert!(seen.insert(op), "'{}' twice", g.node(op).name);
        }
    }
    assert_eq!(g.op_count(), 102);
    assert_eq!(seen.len(), 102);
    // And it round-trips through a file document.
    assert_eq!(io::from_json(&g, &io::to_json(&g, &s)).unwrap(), s);

    // A zoo model has no IOS stages.
    let z = zoo::build("resnet50", &ZooConfig::default()).unwrap();
    assert!(io::from_ios_stages(&z).is_none());
}
