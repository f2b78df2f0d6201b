//! Schedule files: JSON that names operators by their node NAMES, so a file is readable and
//! does not depend on node ids.
//!
//! A stage plan (per GPU, a list of stages; a stage's `groups` run concurrently, each group its
//! operators in order; `strategy` is `"concurrent"` or `"merge"`):
//!
//! ```json
//! {"format": "opsched-schedule", "version": 1, "model": "inception_v3", "shape": "stages",
//!  "gpus": [[{"strategy": "concurrent", "groups": [["a", "b"], ["c"]]},
//!            {"strategy": "merge", "groups": [["d", "e"]]}]]}
//! ```
//!
//! A stream plan (per GPU, the operators of each stream in order, and optionally the order in
//! which the host launches them):
//!
//! ```json
//! {"format": "opsched-schedule", "version": 1, "model": "inception_v3", "shape": "streams",
//!  "gpus": [{"streams": [["a"], ["b", "c"]], "launch_order": ["a", "b", "c"]}]}
//! ```
//!
//! `model` is informational (a mismatch with the graph's name is traced, not refused). Unknown
//! fields, a wrong `format` or `version`, names that are not operators of the graph and values
//! of the wrong kind are errors naming the field or the operator. Whether the schedule is
//! *valid* (every operator once, dependencies) is [`crate::validate()`]'s job.
//!
//! [`from_ios_stages`] builds a one-GPU stage plan from the `stages` an IOS graph file carries
//! on each block.

use std::fmt::Write as _;
use std::path::Path;

use opsched_graph::{Graph, NodeId};
use serde_json::{json, Map, Value};

use crate::{GpuStreams, Schedule, ScheduleError, Stage, StagePlan, StageStrategy, StreamPlan};

/// The value of the `format` field.
pub const FORMAT: &str = "opsched-schedule";
/// The current (and only) version.
pub const VERSION: u64 = 1;

fn name_of(g: &Graph, id: NodeId) -> Value {
    match g.nodes().get(id.index()) {
        Some(n) => Value::String(n.name.clone()),
        None => Value::String(format!("#{}", id.0)),
    }
}

fn names(g: &Graph, ids: &[NodeId]) -> Value {
    Value::Array(ids.iter().map(|&i| name_of(g, i)).collect())
}

fn strategy_str(s: StageStrategy) -> &'static str {
    match s {
        StageStrategy::Concurrent => "concurrent",
        StageStrategy::Merge => "merge",
    }
}

/// The schedule as a JSON document (see the module docs).
pub fn to_json(g: &Graph, s: &Schedule) -> Value {
    let (shape, gpus) = match s {
        Schedule::Stages(p) => (
            "stages",
            Value::Array(
                p.gpus
                    .iter()
                    .map(|stages| {
                        Value::Array(
                            stages
                                .iter()
                                .map(|st| {
                                    json!({
                                        "strategy": strategy_str(st.strategy),
                                        "groups": st.groups.iter().map(|grp| names(g, grp)).collect::<Vec<_>>(),
                                    })
                                })
                                .collect(),
                        )
                    })
                    .collect(),
            ),
        ),
        Schedule::Streams(p) => (
            "streams",
            Value::Array(
                p.gpus
                    .iter()
                    .map(|gs| {
                        let mut o = Map::new();
                        o.insert(
                            "streams".into(),
                            Value::Array(gs.streams.iter().map(|st| names(g, st)).collect()),
                        );
                        if let Some(order) = &gs.launch_order {
                            o.insert("launch_order".into(), names(g, order));
                        }
                        Value::Object(o)
                    })
                    .collect(),
            ),
        ),
    };
    json!({
        "format": FORMAT,
        "version": VERSION,
        "model": g.name,
        "shape": shape,
        "gpus": gpus,
    })
}

/// The schedule as text: the document of [`to_json`], one stage (or stream) per line.
pub fn to_string(g: &Graph, s: &Schedule) -> String {
    let doc = to_json(g, s);
    let compact = |v: &Value| serde_json::to_string(v).unwrap_or_else(|_| "null".into());
    let mut out = String::from("{\n");
    for key in ["format", "version", "model", "shape"] {
        let _ = writeln!(out, "  \"{key}\": {},", compact(&doc[key]));
    }
    out.push_str("  \"gpus\": [");
    let gpus = doc["gpus"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for (gi, gpu) in gpus.iter().enumerate() {
        out.push_str(if gi == 0 { "\n" } else { ",\n" });
        match s {
            Schedule::Stages(_) => {
                let stages = gpu.as_array().map(Vec::as_slice).unwrap_or_default();
                if stages.is_empty() {
                    out.push_str("    []");
                    continue;
                }
                out.push_str("    [\n");
                for (si, st) in stages.iter().enumerate() {
                    let sep = if si + 1 < stages.len() { "," } else { "" };
                    let _ = writeln!(
                        out,
                        "      {{\"strategy\": {}, \"groups\": {}}}{sep}",
                        compact(&st["strategy"]),
                        compact(&st["groups"])
                    );
                }
                out.push_str("    ]");
            }
            Schedule::Streams(_) => {
                out.push_str("    {\"streams\": [");
                let streams = gpu["streams"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                for (si, st) in streams.iter().enumerate() {
                    let sep = if si == 0 { "\n" } else { ",\n" };
                    let _ = write!(out, "{sep}      {}", compact(st));
                }
                out.push_str(if streams.is_empty() { "]" } else { "\n    ]" });
                if let Some(order) = gpu.get("launch_order") {
                    let _ = write!(out, ",\n     \"launch_order\": {}", compact(order));
                }
                out.push('}');
            }
        }
    }
    out.push_str(if gpus.is_empty() {
        "]\n}\n"
    } else {
        "\n  ]\n}\n"
    });
    out
}

fn invalid(msg: impl Into<String>) -> ScheduleError {
    ScheduleError::Invalid(msg.into())
}

fn check_keys(o: &Map<String, Value>, at: &str, allowed: &[&str]) -> Result<(), ScheduleError> {
    for k in o.keys() {
        if !allowed.contains(&k.as_str()) {
            return Err(invalid(format!(
                "{at}: unknown field '{k}' (expected {})",
                allowed.join(", ")
            )));
        }
    }
    Ok(())
}

fn object<'a>(v: &'a Value, at: &str) -> Result<&'a Map<String, Value>, ScheduleError> {
    v.as_object()
        .ok_or_else(|| invalid(format!("{at}: expected a JSON object")))
}

fn array<'a>(v: &'a Value, at: &str) -> Result<&'a [Value], ScheduleError> {
    v.as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| invalid(format!("{at}: expected a list")))
}

fn field<'a>(o: &'a Map<String, Value>, at: &str, key: &str) -> Result<&'a Value, ScheduleError> {
    o.get(key)
        .ok_or_else(|| invalid(format!("{at}: missing field '{key}'")))
}

/// Resolve a list of operator names.
fn ops(g: &Graph, v: &Value, at: &str) -> Result<Vec<NodeId>, ScheduleError> {
    array(v, at)?
        .iter()
        .map(|n| {
            let name = n
                .as_str()
                .ok_or_else(|| invalid(format!("{at}: expected operator names, got {n}")))?;
            let id = g.find(name).ok_or_else(|| {
                invalid(format!(
                    "{at}: unknown operator '{name}' (not a node of model '{}')",
                    g.name
                ))
            })?;
            if g.node(id).op.is_input() {
                return Err(invalid(format!(
                    "{at}: '{name}' is a graph input, not an operator"
                )));
            }
            Ok(id)
        })
        .collect()
}

/// Read a schedule document (see the module docs) for graph `g`.
pub fn from_json(g: &Graph, doc: &Value) -> Result<Schedule, ScheduleError> {
    let top = object(doc, "schedule")?;
    check_keys(
        top,
        "schedule",
        &["format", "version", "model", "shape", "gpus"],
    )?;
    match field(top, "schedule", "format")?.as_str() {
        Some(FORMAT) => {}
        Some(other) => {
            return Err(invalid(format!(
                "field 'format' is \"{other}\", expected \"{FORMAT}\""
            )))
        }
        None => return Err(invalid("field 'format' must be a string")),
    }
    match field(top, "schedule", "version")?.as_u64() {
        Some(VERSION) => {}
        Some(v) => {
            return Err(invalid(format!(
                "unsupported version {v} (this build reads version {VERSION})"
            )))
        }
        None => return Err(invalid("field 'version' must be a non-negative integer")),
    }
    if let Some(m) = top.get("model") {
        let m = m
            .as_str()
            .ok_or_else(|| invalid("field 'model' must be a string"))?;
        if m != g.name {
            tracing::warn!(file_model = m, graph = %g.name, "schedule file names another model");
        }
    }
    let gpus = array(field(top, "schedule", "gpus")?, "field 'gpus'")?;
    match field(top, "schedule", "shape")?.as_str() {
        Some("stages") => {
            let mut plan = StagePlan::default();
            for (gi, gv) in gpus.iter().enumerate() {
                let mut stages = Vec::new();
                for (si, sv) in array(gv, &format!("GPU {gi}"))?.iter().enumerate() {
                    let at = format!("GPU {gi} stage {si}");
                    let so = object(sv, &at)?;
                    check_keys(so, &at, &["strategy", "groups"])?;
                    let strategy = match so.get("strategy").map(|v| v.as_str()) {
                        None | Some(Some("concurrent")) => StageStrategy::Concurrent,
                        Some(Some("merge")) => StageStrategy::Merge,
                        Some(other) => {
                            return Err(invalid(format!(
                            "{at}: field 'strategy' must be \"concurrent\" or \"merge\", got {}",
                            other.map_or_else(
                                || so.get("strategy").map_or(String::new(), |v| v.to_string()),
                                |s| format!("\"{s}\"")
                            )
                        )))
                        }
                    };
                    let groups =
                        array(field(so, &at, "groups")?, &format!("{at}: field 'groups'"))?
                            .iter()
                            .enumerate()
                            .map(|(k, grp)| ops(g, grp, &format!("{at} group {k}")))
                            .collect::<Result<Vec<_>, _>>()?;
                    stages.push(Stage { strategy, groups });
                }
                plan.gpus.push(stages);
            }
            Ok(Schedule::Stages(plan))
        }
        Some("streams") => {
            let mut plan = StreamPlan::default();
            for (gi, gv) in gpus.iter().enumerate() {
                let at = format!("GPU {gi}");
                let go = object(gv, &at)?;
                check_keys(go, &at, &["streams", "launch_order"])?;
                let streams = array(
                    field(go, &at, "streams")?,
                    &format!("{at}: field 'streams'"),
                )?
                .iter()
                .enumerate()
                .map(|(k, st)| ops(g, st, &format!("{at} stream {k}")))
                .collect::<Result<Vec<_>, _>>()?;
                let launch_order = match go.get("launch_order") {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(ops(g, v, &format!("{at} launch_order"))?),
                };
                plan.gpus.push(GpuStreams {
                    streams,
                    launch_order,
                });
            }
            Ok(Schedule::Streams(plan))
        }
        Some(other) => Err(invalid(format!(
            "field 'shape' is \"{other}\", expected \"stages\" or \"streams\""
        ))),
        None => Err(invalid("field 'shape' must be a string")),
    }
}

/// Read a schedule file for graph `g`; errors name the file.
pub fn load(g: &Graph, path: impl AsRef<Path>) -> Result<Schedule, ScheduleError> {
    let path = path.as_ref();
    let file_err = |message: String| ScheduleError::File {
        path: path.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| file_err(e.to_string()))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| file_err(e.to_string()))?;
    from_json(g, &doc).map_err(|e| match e {
        ScheduleError::Invalid(m) | ScheduleError::Config(m) => file_err(m),
        other => file_err(other.to_string()),
    })
}

/// Write a schedule file through [`opsched_io::write`] (a regular file is replaced atomically;
/// links, FIFOs and `-` for stdout work as that function says).
pub fn save(
    g: &Graph,
    s: &Schedule,
    path: impl AsRef<Path>,
) -> Result<opsched_io::Written, ScheduleError> {
    let path = path.as_ref();
    opsched_io::write(path, to_string(g, s).as_bytes()).map_err(|e| ScheduleError::File {
        path: path.to_path_buf(),
        message: format!("cannot write: {}", e.message),
    })
}

/// The schedule an IOS graph file carries: one GPU, every block's `stages` in block order, all
/// concurrent. `None` if the graph has no blocks or some block has no stages.
pub fn from_ios_stages(g: &Graph) -> Option<Schedule> {
    if g.blocks().is_empty() {
        return None;
    }
    let mut stages = Vec::new();
    for b in g.blocks() {
        for st in b.stages.as_ref()? {
            stages.push(Stage {
                strategy: StageStrategy::Concurrent,
                groups: st.clone(),
            });
        }
    }
    Some(Schedule::Stages(StagePlan { gpus: vec![stages] }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use opsched_graph::formats::dag;

    fn tiny() -> Option<Graph> {
        dag::from_value(json!({"format": "opsched-dag", "name": "t",
            "ops": [{"id": 1, "time_ms": 1.0}, {"id": 2, "time_ms": 1.0}],
            "edges": [{"src": 1, "dst": 2}]}))
        .ok()
    }

    #[test]
    fn text_parses_back() {
        let Some(g) = tiny() else {
            panic!("tiny graph");
        };
        let (a, b) = (g.find("1"), g.find("2"));
        let (Some(a), Some(b)) = (a, b) else {
            panic!("names");
        };
        for s in [
            Schedule::Stages(StagePlan {
                gpus: vec![vec![Stage::single(a), Stage::single(b)], vec![]],
            }),
            Schedule::Streams(StreamPlan {
                gpus: vec![GpuStreams {
                    streams: vec![vec![a], vec![b]],
                    launch_order: Some(vec![a, b]),
                }],
            }),
            Schedule::Streams(StreamPlan { gpus: vec![] }),
        ] {
            let text = to_string(&g, &s);
            let doc: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            assert_eq!(doc, to_json(&g, &s), "{text}");
            assert_eq!(from_json(&g, &doc).ok(), Some(s));
        }
    }
}
