//! Exports of a simulated [`Timeline`]: a Chrome trace ([`chrome_trace`]) and an SVG Gantt
//! chart ([`svg_gantt`]).
//!
//! **Chrome trace.** The [trace event format] that chrome://tracing and Perfetto
//! (<https://ui.perfetto.dev>) open: `{"traceEvents": [...], "displayTimeUnit": "ms"}`. Each GPU
//! is a process (`pid` = GPU index, named "GPU i"), each stream a thread (`tid` = stream index,
//! named "stream s"); every operator is one complete event (`"ph": "X"`) with `ts` and `dur` in
//! microseconds, `name` = the operator's name, `cat` = its type and `args` = its type and output
//! shape. A transfer is a complete event in the sending GPU's process, on a thread named
//! "transfers -> GPU b" (`tid` = [`TRANSFER_TID_BASE`] + b), with the edge in `args`.
//!
//! **SVG Gantt chart.** One self-contained SVG: a row per (GPU, stream) that ran something, then a
//! row per pair of GPUs that exchanged tensors; one `<rect class="op">` per operator coloured by
//! operator type (a fixed palette with a legend), the operator's name inside the bar when it
//! fits and in a tooltip (`<title>`) always; transfers as thin `<rect class="xfer">` bars; a time
//! axis with ticks at 1, 2 or 5 times a power of ten milliseconds; the title and the makespan.
//!
//! [trace event format]: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use opsched_graph::{Graph, NodeId};
use serde_json::{json, Value};

use crate::Timeline;

/// Thread ids of transfer rows in the Chrome trace: `TRANSFER_TID_BASE + destination GPU`.
pub const TRANSFER_TID_BASE: usize = 10_000;

fn us(ms: f64) -> f64 {
    // Round to nanoseconds so that the JSON stays short and exact enough.
    (ms * 1e3 * 1e3).round() / 1e3
}

fn op_type(g: &Graph, op: NodeId) -> &'static str {
    g.nodes()
        .get(op.index())
        .map_or("unknown", |n| n.op.type_name())
}

fn op_name(g: &Graph, op: NodeId) -> String {
    g.nodes()
        .get(op.index())
        .map_or_else(|| format!("#{}", op.0), |n| n.name.clone())
}

fn op_shape(g: &Graph, op: NodeId) -> Vec<usize> {
    g.nodes()
        .get(op.index())
        .map(|n| n.shape.clone())
        .unwrap_or_default()
}

/// The timeline as a Chrome trace (see the module docs).
pub fn chrome_trace(g: &Graph, t: &Timeline) -> Value {
    let mut events = Vec::with_capacity(t.ops.len() + t.transfers.len() + 16);

    // Processes (GPUs) and their threads (streams, transfer rows).
    let mut gpus: BTreeSet<usize> = BTreeSet::new();
    let mut streams: BTreeSet<(usize, usize)> = BTreeSet::new();
    let mut xfer_rows: BTreeSet<(usize, usize)> = BTreeSet::new();
    for s in &t.ops {
        gpus.insert(s.gpu);
        streams.insert((s.gpu, s.stream));
    }
    for x in &t.transfers {
        gpus.insert(x.src_gpu);
        gpus.insert(x.dst_gpu);
        xfer_rows.insert((x.src_gpu, x.dst_gpu));
    }
    for &gpu in &gpus {
        events.push(
            json!({"ph": "M", "name": "process_name", "pid": gpu, "tid": 0,
                           "args": {"name": format!("GPU {gpu}")}}),
        );
        events.push(
            json!({"ph": "M", "name": "process_sort_index", "pid": gpu, "tid": 0,
                           "args": {"sort_index": gpu}}),
        );
    }
    for &(gpu, stream) in &streams {
        events.push(
            json!({"ph": "M", "name": "thread_name", "pid": gpu, "tid": stream,
                           "args": {"name": format!("stream {stream}")}}),
        );
        events.push(
            json!({"ph": "M", "name": "thread_sort_index", "pid": gpu, "tid": stream,
                           "args": {"sort_index": stream}}),
        );
    }
    for &(src, dst) in &xfer_rows {
        let tid = TRANSFER_TID_BASE + dst;
        events.push(
            json!({"ph": "M", "name": "thread_name", "pid": src, "tid": tid,
                           "args": {"name": format!("transfers -> GPU {dst}")}}),
        );
        events.push(
            json!({"ph": "M", "name": "thread_sort_index", "pid": src, "tid": tid,
                           "args": {"sort_index": tid}}),
        );
    }

    for s in &t.ops {
        let ty = op_type(g, s.op);
        events.push(json!({
            "ph": "X",
            "name": op_name(g, s.op),
            "cat": ty,
            "pid": s.gpu,
            "tid": s.stream,
            "ts": us(s.start_ms),
            "dur": us((s.end_ms - s.start_ms).max(0.0)),
            "args": {"op": ty, "shape": op_shape(g, s.op)},
        }));
    }
    for x in &t.transfers {
        let (src, dst) = (op_name(g, x.src), op_name(g, x.dst));
        events.push(json!({
            "ph": "X",
            "name": format!("{src} -> {dst}"),
            "cat": "transfer",
            "pid": x.src_gpu,
            "tid": TRANSFER_TID_BASE + x.dst_gpu,
            "ts": us(x.start_ms),
            "dur": us((x.end_ms - x.start_ms).max(0.0)),
            "args": {"src": src, "dst": dst, "src_gpu": x.src_gpu, "dst_gpu": x.dst_gpu,
                     "shape": op_shape(g, x.src)},
        }));
    }

    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"model": g.name, "makespan_ms": t.makespan_ms},
    })
}

/// Escape text for XML content and attribute values.
pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Not allowed in XML 1.0 documents at all.
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' && c != '\r' => out.push(' '),
            '\u{FFFE}' | '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// JSON text made safe inside an HTML `<script>` element: `<`, `>` and `&` (which occur only
/// inside strings) and the JavaScript line separators become `\uXXXX` escapes, the same JSON
/// value. Escaping `</` alone is not enough: `<!--<script>` in a string would switch the HTML
/// parser into a state where the element's own `</script>` no longer ends it.
pub fn script_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// The fill colour of an operator type (a fixed palette: the same type has the same colour in
/// every chart).
pub fn op_colour(op_type: &str) -> &'static str {
    match op_type {
        "conv2d" => "#4e79a7",
        "pool2d" => "#f28e2b",
        "activation" => "#e15759",
        "elementwise" => "#76b7b2",
        "concat" => "#59a14f",
        "identity" => "#edc948",
        "linear" => "#b07aa1",
        "batch_matmul" => "#ff9da7",
        "softmax" => "#9c755f",
        "layer_norm" => "#bab0ac",
        "reshape" => "#8cd17d",
        "transpose" => "#86bcb6",
        "sequential" => "#d37295",
        "abstract" => "#79706e",
        "input" => "#d4d4d4",
        _ => "#a0a0a0",
    }
}

/// Text colour readable on a `#rrggbb` fill.
fn text_colour(fill: &str) -> &'static str {
    let hex = fill.trim_start_matches('#');
    let chan = |i: usize| {
        hex.get(i..i + 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .map_or(0.5, |v| f64::from(v) / 255.0)
    };
    let lum = 0.299 * chan(0) + 0.587 * chan(2) + 0.114 * chan(4);
    if lum > 0.6 {
        "#1a1a1a"
    } else {
        "#ffffff"
    }
}

/// A tick step of 1, 2 or 5 times a power of ten giving about `target` ticks over `span`.
fn nice_step(span: f64, target: f64) -> f64 {
    if !(span.is_finite() && span > 0.0) {
        return 1.0;
    }
    let raw = span / target.max(1.0);
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let f = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    f * mag
}

/// Decimals needed to print multiples of `step` exactly enough.
fn step_decimals(step: f64) -> usize {
    if step >= 1.0 {
        0
    } else {
        (-step.log10()).ceil().clamp(0.0, 9.0) as usize
    }
}

/// Row kinds of the chart.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Row {
    Stream { gpu: usize, stream: usize },
    Transfer { src: usize, dst: usize },
}

impl Row {
    fn gpu(self) -> usize {
        match self {
            Row::Stream { gpu, .. } => gpu,
            Row::Transfer { src, .. } => src,
        }
    }
    fn label(self) -> String {
        match self {
            Row::Stream { gpu, stream } => format!("GPU {gpu} stream {stream}"),
            Row::Transfer { src, dst } => format!("GPU {src} -> GPU {dst}"),
        }
    }
}

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 140.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 64.0;
const ROW_H: f64 = 22.0;
const XFER_ROW_H: f64 = 14.0;
const GPU_GAP: f64 = 8.0;
const FONT_PX: f64 = 10.0;
/// Average glyph advance of the bar font, as a share of the font size.
const GLYPH: f64 = 0.6;

/// The timeline as a self-contained SVG Gantt chart (see the module docs).
pub fn svg_gantt(g: &Graph, t: &Timeline, title: &str) -> String {
    // Rows: per GPU, its streams, then its outgoing transfer rows.
    let mut rows: BTreeSet<Row> = BTreeSet::new();
    for s in &t.ops {
        rows.insert(Row::Stream {
            gpu: s.gpu,
            stream: s.stream,
        });
    }
    for x in &t.transfers {
        rows.insert(Row::Transfer {
            src: x.src_gpu,
            dst: x.dst_gpu,
        });
    }
    let mut row_y: BTreeMap<Row, (f64, f64)> = BTreeMap::new();
    let mut y = TOP;
    let mut prev_gpu = None;
    let mut separators = Vec::new();
    for &r in &rows {
        if prev_gpu.is_some_and(|p| p != r.gpu()) {
            separators.push(y + GPU_GAP / 2.0);
            y += GPU_GAP;
        }
        prev_gpu = Some(r.gpu());
        let h = match r {
            Row::Stream { .. } => ROW_H,
            Row::Transfer { .. } => XFER_ROW_H,
        };
        row_y.insert(r, (y, h));
        y += h;
    }
    let rows_bottom = y;

    let end = t
        .ops
        .iter()
        .map(|s| s.end_ms)
        .chain(t.transfers.iter().map(|x| x.end_ms))
        .fold(t.makespan_ms, f64::max);
    let span = if end.is_finite() && end > 0.0 {
        end
    } else {
        1.0
    };
    let plot_w = WIDTH - LEFT - RIGHT;
    let x_of = |ms: f64| LEFT + (ms.max(0.0) / span) * plot_w;

    // Legend: the op types present, in palette order of first appearance by name.
    let types: BTreeSet<&'static str> = t.ops.iter().map(|s| op_type(g, s.op)).collect();
    let legend_y = rows_bottom + 44.0;
    let per_line = ((WIDTH - LEFT) / 130.0).floor().max(1.0) as usize;
    let legend_lines = types.len().div_ceil(per_line).max(1);
    let height = legend_y + legend_lines as f64 * 18.0 + 10.0;

    let mut s = String::with_capacity(256 + t.ops.len() * 220);
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="11">"##
    );
    s.push_str(concat!(
        "<style>",
        ".op{stroke:#ffffff;stroke-width:0.5}",
        ".xfer{fill:#555555;stroke:none}",
        ".grid{stroke:#dddddd;stroke-width:1}",
        ".sep{stroke:#888888;stroke-width:1}",
        ".lbl{fill:#222222}",
        ".bar{font-size:10px;pointer-events:none}",
        "</style>\n"
    ));
    s.push_str("<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="22" font-size="16" font-weight="bold">{}</text>"##,
        xml_escape(title)
    );
    let gpus: BTreeSet<usize> = rows.iter().map(|r| r.gpu()).collect();
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="40" font-size="12">makespan {:.3} ms, {} operators, {} GPU{}, {} transfers</text>"##,
        t.makespan_ms,
        t.ops.len(),
        gpus.len(),
        if gpus.len() == 1 { "" } else { "s" },
        t.transfers.len()
    );

    // Row backgrounds and labels.
    for (i, (r, &(ry, h))) in row_y.iter().enumerate() {
        let fill = if i % 2 == 0 { "#f6f6f6" } else { "#ffffff" };
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{ry}" width="{plot_w}" height="{h}" fill="{fill}"/>"##
        );
        let _ = writeln!(
            s,
            r##"<text class="lbl" x="{:.1}" y="{:.1}" text-anchor="end" dominant-baseline="middle" font-size="{}">{}</text>"##,
            LEFT - 6.0,
            ry + h / 2.0,
            if matches!(r, Row::Stream { .. }) {
                11
            } else {
                9
            },
            xml_escape(&r.label())
        );
    }
    for sy in &separators {
        let _ = writeln!(
            s,
            r##"<line class="sep" x1="8" x2="{}" y1="{sy}" y2="{sy}"/>"##,
            WIDTH - RIGHT
        );
    }

    // Time axis: grid lines and labels.
    let step = nice_step(span, 10.0);
    let decimals = step_decimals(step);
    let axis_y = rows_bottom + 4.0;
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" x2="{}" y1="{axis_y}" y2="{axis_y}" stroke="#444444"/>"##,
        LEFT + plot_w
    );
    let ticks = (span / step).floor() as usize;
    for k in 0..=ticks.min(1000) {
        let ms = k as f64 * step;
        let x = x_of(ms);
        let _ = writeln!(
            s,
            r##"<line class="grid" x1="{x:.2}" x2="{x:.2}" y1="{TOP}" y2="{rows_bottom}"/>"##
        );
        let _ = writeln!(
            s,
            r##"<line x1="{x:.2}" x2="{x:.2}" y1="{axis_y}" y2="{:.1}" stroke="#444444"/>"##,
            axis_y + 4.0
        );
        let _ = writeln!(
            s,
            r##"<text x="{x:.2}" y="{:.1}" text-anchor="middle" font-size="10">{ms:.decimals$}</text>"##,
            axis_y + 16.0
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="10">time (ms)</text>"##,
        LEFT + plot_w,
        axis_y + 30.0
    );

    // Operators.
    for span_ in &t.ops {
        let Some(&(ry, h)) = row_y.get(&Row::Stream {
            gpu: span_.gpu,
            stream: span_.stream,
        }) else {
            continue;
        };
        let ty = op_type(g, span_.op);
        let fill = op_colour(ty);
        let name = op_name(g, span_.op);
        let x0 = x_of(span_.start_ms);
        let w = (x_of(span_.end_ms) - x0).max(0.5);
        let _ = write!(
            s,
            r##"<rect class="op" x="{x0:.2}" y="{:.1}" width="{w:.2}" height="{:.1}" fill="{fill}"><title>{} ({ty}) {:.3}-{:.3} ms</title></rect>"##,
            ry + 2.0,
            h - 4.0,
            xml_escape(&name),
            span_.start_ms,
            span_.end_ms,
        );
        let text_w = name.chars().count() as f64 * FONT_PX * GLYPH;
        if text_w + 4.0 <= w {
            let _ = write!(
                s,
                r##"<text class="bar" x="{:.2}" y="{:.1}" text-anchor="middle" dominant-baseline="middle" fill="{}">{}</text>"##,
                x0 + w / 2.0,
                ry + h / 2.0 + 0.5,
                text_colour(fill),
                xml_escape(&name)
            );
        }
        s.push('\n');
    }

    // Transfers.
    for x in &t.transfers {
        let Some(&(ry, h)) = row_y.get(&Row::Transfer {
            src: x.src_gpu,
            dst: x.dst_gpu,
        }) else {
            continue;
        };
        let x0 = x_of(x.start_ms);
        let w = (x_of(x.end_ms) - x0).max(0.5);
        let _ = writeln!(
            s,
            r##"<rect class="xfer" x="{x0:.2}" y="{:.1}" width="{w:.2}" height="{:.1}"><title>{} -> {} (GPU {} -> GPU {}) {:.3}-{:.3} ms</title></rect>"##,
            ry + h * 0.3,
            h * 0.4,
            xml_escape(&op_name(g, x.src)),
            xml_escape(&op_name(g, x.dst)),
            x.src_gpu,
            x.dst_gpu,
            x.start_ms,
            x.end_ms
        );
    }

    // Makespan marker.
    if t.makespan_ms.is_finite() && t.makespan_ms > 0.0 {
        let mx = x_of(t.makespan_ms);
        let _ = writeln!(
            s,
            r##"<line x1="{mx:.2}" x2="{mx:.2}" y1="{:.1}" y2="{rows_bottom}" stroke="#c00000" stroke-dasharray="4 3"/>"##,
            TOP - 6.0
        );
    }

    // Legend.
    for (i, ty) in types.iter().enumerate() {
        let lx = LEFT + (i % per_line) as f64 * 130.0;
        let ly = legend_y + (i / per_line) as f64 * 18.0;
        let _ = writeln!(
            s,
            r##"<rect x="{lx}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"##,
            ly - 10.0,
            op_colour(ty),
            lx + 17.0,
            ly,
            xml_escape(ty)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(10.0, 10.0), 1.0);
        assert_eq!(nice_step(17.0, 10.0), 2.0);
        assert_eq!(nice_step(45.0, 10.0), 5.0);
        assert!((nice_step(0.9, 10.0) - 0.1).abs() < 1e-12);
        assert_eq!(step_decimals(0.05), 2);
        assert_eq!(step_decimals(2.0), 0);
    }

    #[test]
    fn escapes() {
        assert_eq!(xml_escape("a<&>\"'"), "a&lt;&amp;&gt;&quot;&apos;");
        assert_eq!(xml_escape("a\u{1}b\u{FFFF}"), "a b\u{FFFD}");
    }

    #[test]
    fn script_json_has_no_markup_and_reads_back_the_same() {
        let names = [
            "</script><b>x</b>",
            "<!--<script>",
            "a & b\u{2028}c",
            "\"\\</",
        ];
        let json = serde_json::to_string(&names).expect("strings serialize");
        let safe = script_json(&json);
        assert!(!safe.contains(['<', '>', '&', '\u{2028}']), "{safe}");
        let back: Vec<String> = serde_json::from_str(&safe).expect("escaped JSON parses");
        assert_eq!(back, names);
    }
}
