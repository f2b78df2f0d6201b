//! Small self-contained SVG charts for xtask reports (no plotting dependency).

use std::fmt::Write as _;

const PALETTE: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#bcbd22", "#7f7f7f",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// "Nice" axis ticks (1, 2, 5 x 10^k) covering `[0, max]`.
fn ticks(max: f64) -> Vec<f64> {
    if !(max.is_finite() && max > 0.0) {
        return vec![0.0, 1.0];
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| max / s <= 6.0)
        .unwrap_or(10.0 * mag);
    let n = (max / step).ceil() as usize;
    (0..=n).map(|i| i as f64 * step).collect()
}

/// The part every chart shares: the plot area, a y axis from 0 with nice ticks, the title.
struct Frame {
    left: f64,
    top: f64,
    /// Plot width and height.
    pw: f64,
    ph: f64,
    y_top: f64,
}

impl Frame {
    /// A frame whose y axis covers the finite values of `ys`.
    fn new(
        left: f64,
        top: f64,
        pw: f64,
        ph: f64,
        ys: impl Iterator<Item = f64>,
    ) -> (Self, Vec<f64>) {
        let y_max = ys.filter(|y| y.is_finite()).fold(0.0, f64::max);
        let yt = ticks(y_max);
        let y_top = yt.last().copied().unwrap_or(1.0).max(f64::MIN_POSITIVE);
        (
            Frame {
                left,
                top,
                pw,
                ph,
                y_top,
            },
            yt,
        )
    }

    fn py(&self, y: f64) -> f64 {
        self.top + self.ph - y / self.y_top * self.ph
    }

    /// The SVG header, white background, title and the horizontal grid with its tick labels.
    fn open(&self, s: &mut String, w: f64, h: f64, title: &str, yt: &[f64]) {
        let left = self.left;
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.0} {h:.0}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="{w:.0}" height="{h:.0}" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{left}" y="22" font-size="15" font-weight="bold">{}</text>"#,
            esc(title)
        );
        for &t in yt {
            let y = self.py(t);
            let _ = writeln!(
                s,
                r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                left + self.pw,
                left - 6.0,
                y + 4.0,
                fmt_num(t)
            );
        }
    }

    /// Both axis lines and the rotated y label.
    fn axes(&self, s: &mut String, y_label: &str) {
        let (left, top) = (self.left, self.top);
        let bottom = top + self.ph;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{bottom:.1}" x2="{:.1}" y2="{bottom:.1}" stroke="#333"/><line x1="{left}" y1="{top}" x2="{left}" y2="{bottom:.1}" stroke="#333"/>"##,
            left + self.pw
        );
        let _ = writeln!(
            s,
            r#"<text transform="translate(16,{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
            top + self.ph / 2.0,
            esc(y_label)
        );
    }
}

/// One line per series over shared x values; `series` is (name, y values) with NaN for gaps.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    xs: &[f64],
    series: &[(String, Vec<f64>)],
) -> String {
    let (w, h, left, right, top, bottom) = (760.0, 420.0, 70.0, 170.0, 40.0, 50.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let (x_min, x_max) = xs
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        });
    let x_span = if x_max > x_min { x_max - x_min } else { 1.0 };
    let (f, yt) = Frame::new(
        left,
        top,
        pw,
        ph,
        series.iter().flat_map(|(_, ys)| ys.iter().copied()),
    );
    let px = |x: f64| left + (x - x_min) / x_span * pw;
    let py = |y: f64| f.py(y);
    let mut s = String::new();
    f.open(&mut s, w, h, title, &yt);
    for &x in xs {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            px(x),
            top + ph + 18.0,
            fmt_num(x)
        );
    }
    f.axes(&mut s, y_label);
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        left + pw / 2.0,
        h - 10.0,
        esc(x_label)
    );
    for (i, (name, ys)) in series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let pts: Vec<String> = xs
            .iter()
            .zip(ys)
            .filter(|(_, y)| y.is_finite())
            .map(|(&x, &y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline class="series" fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        for p in &pts {
            if let Some((x, y)) = p.split_once(',') {
                let _ = writeln!(s, r#"<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>"#);
            }
        }
        let ly = top + 10.0 + i as f64 * 18.0;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            left + pw + 12.0,
            left + pw + 32.0,
            left + pw + 38.0,
            ly + 4.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Grouped bars: one group per category (x axis), one bar per series within it, a dashed
/// reference line at `reference` (e.g. 1.0 for a speedup); NaN values leave a gap.
pub fn bar_chart(
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
    reference: Option<f64>,
) -> String {
    let (left, right, top, bottom) = (70.0, 170.0, 40.0, 110.0);
    let group_w = 18.0 * series.len().max(1) as f64 + 14.0;
    let pw = (group_w * categories.len().max(1) as f64).max(360.0);
    let (w, h) = (left + pw + right, 440.0);
    let ph = h - top - bottom;
    let (f, yt) = Frame::new(
        left,
        top,
        pw,
        ph,
        series
            .iter()
            .flat_map(|(_, ys)| ys.iter().copied())
            .chain(reference),
    );
    let py = |y: f64| f.py(y);
    let mut s = String::new();
    f.open(&mut s, w, h, title, &yt);
    let bar_w = (group_w - 14.0) / series.len().max(1) as f64;
    for (c, name) in categories.iter().enumerate() {
        let gx = left + c as f64 * group_w + 7.0;
        for (i, (sname, ys)) in series.iter().enumerate() {
            let Some(&y) = ys.get(c) else { continue };
            if !y.is_finite() {
                continue;
            }
            let colour = PALETTE[i % PALETTE.len()];
            let (x, top_y) = (gx + i as f64 * bar_w, py(y));
            let _ = writeln!(
                s,
                r#"<rect class="bar" x="{x:.1}" y="{top_y:.1}" width="{:.1}" height="{:.1}" fill="{colour}"><title>{} / {}: {}</title></rect>"#,
                (bar_w - 1.0).max(1.0),
                (top + ph - top_y).max(0.0),
                esc(name),
                esc(sname),
                fmt_num((y * 1000.0).round() / 1000.0)
            );
        }
        let cx = gx + (group_w - 14.0) / 2.0;
        let ly = top + ph + 10.0;
        let _ = writeln!(
            s,
            r#"<text transform="translate({cx:.1},{ly:.1}) rotate(-40)" text-anchor="end">{}</text>"#,
            esc(name)
        );
    }
    if let Some(r) = reference.filter(|r| r.is_finite()) {
        let y = py(r);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#333" stroke-dasharray="5,4"/>"##,
            left + pw
        );
    }
    f.axes(&mut s, y_label);
    for (i, (name, _)) in series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let ly = top + 10.0 + i as f64 * 18.0;
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="14" height="10" fill="{colour}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            left + pw + 12.0,
            ly - 5.0,
            left + pw + 32.0,
            ly + 4.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn fmt_num(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e9 {
        format!("{}", v as i64)
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_cover_the_maximum_with_nice_steps() {
        let t = ticks(7.3);
        assert_eq!(t.first(), Some(&0.0));
        assert!(*t.last().unwrap_or(&0.0) >= 7.3);
        assert!(t.len() <= 8);
    }

    #[test]
    fn chart_has_one_polyline_per_series() {
        let svg = line_chart(
            "t<",
            "x",
            "y",
            &[1.0, 2.0],
            &[
                ("a".into(), vec![1.0, 2.0]),
                ("b&".into(), vec![f64::NAN, 3.0]),
            ],
        );
        assert_eq!(svg.matches("class=\"series\"").count(), 2);
        assert!(svg.contains("t&lt;") && svg.contains("b&amp;"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn bar_chart_has_one_bar_per_finite_value() {
        let svg = bar_chart(
            "speedup",
            "x",
            &["ios".into(), "lios".into(), "greedy".into()],
            &[
                ("h100".into(), vec![1.9, 1.8, f64::NAN]),
                ("v100".into(), vec![1.7, 1.6, 1.5]),
            ],
            Some(1.0),
        );
        assert_eq!(svg.matches("class=\"bar\"").count(), 5);
        assert!(svg.contains("stroke-dasharray"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
