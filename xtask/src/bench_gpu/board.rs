//! The scoreboard's data: per-process medians aggregated, the rows, the JSON file scripts read
//! and the Markdown table people read. No device, no processes and no files here, so all of it
//! is unit-tested.

use std::fmt::Write as _;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::torch::TorchVersions;

/// bench-gpu's models, in the order of its tables (`--models`' default).
pub const MODELS: &str = "inception_v3,googlenet,squeezenet,resnet50,nasnet,transformer,randwire";

/// `header.format` of the JSON file.
pub const FORMAT: &str = "opsched-gpu-scoreboard";
/// `header.version`: bumped when a field changes meaning or goes away.
pub const VERSION: u32 = 1;

/// `x` to 6 decimals: what the JSON file keeps (1 ns of a millisecond, 0.0001% of a ratio).
/// Such a number prints in few digits and parses back to the same `f64`, so a file
/// round-trips exactly.
pub fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// One configuration's per-process medians, aggregated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    /// Median of the per-process medians.
    pub median_ms: f64,
    /// max/min - 1 of the per-process medians: 0.05 is "the slowest process took 5% longer".
    pub spread: f64,
    /// Every process's median, in the order the processes ran.
    pub per_process_ms: Vec<f64>,
}

impl Aggregate {
    /// None without samples, or when one is not a positive finite time (a broken run must not
    /// turn into a fast one).
    pub fn of(per_process_ms: &[f64]) -> Option<Aggregate> {
        if per_process_ms.is_empty() || per_process_ms.iter().any(|&t| !(t.is_finite() && t > 0.0))
        {
            return None;
        }
        let per_process_ms: Vec<f64> = per_process_ms.iter().map(|&t| round6(t)).collect();
        let mut s = per_process_ms.clone();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median_ms = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Some(Aggregate {
            median_ms: round6(median_ms),
            spread: round6(s[n - 1] / s[0] - 1.0),
            per_process_ms,
        })
    }
}

/// The fastest configuration by median of medians: its index. Ties go to the earlier one, so
/// the choice depends on the numbers and the candidates' order alone (sequential first, then
/// the algorithms as given). `None` when no candidate has a result.
pub fn fastest<'a>(candidates: impl IntoIterator<Item = Option<&'a Aggregate>>) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, c) in candidates.into_iter().enumerate() {
        if let Some(a) = c {
            if best.is_none_or(|(_, t)| a.median_ms < t) {
                best = Some((i, a.median_ms));
            }
        }
    }
    best.map(|(i, _)| i)
}

/// `a / b` when both are known.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(round6(a / b)),
        _ => None,
    }
}

/// One schedule of one row: how it did in every process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScheduleResult {
    pub algo: String,
    /// Makespan simulated under the search's cost model (None when the search failed).
    pub simulated_ms: Option<f64>,
    /// CUDA-graph replay, aggregated over the processes (None unless every process ran).
    pub graph: Option<Aggregate>,
    /// Peak device memory of the plan, MB (10^6 bytes), as the run reported it.
    pub memory_mb: Option<f64>,
    /// Why there is no result: the search's or a process's error, one line.
    pub error: Option<String>,
}

/// The PyTorch side of one row, every mode aggregated over the processes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TorchResult {
    pub eager: Option<Aggregate>,
    pub graph: Option<Aggregate>,
    pub compile: Option<Aggregate>,
    /// Compile (and CUDA-graph recording) seconds of each process; the first compiled with an
    /// empty inductor cache, the later ones reused it.
    pub compile_s_per_process: Vec<f64>,
    /// Why a mode or the whole model has no result, one line each.
    pub notes: Vec<String>,
}

/// One model at one batch size. The fields up to `peak_memory_mb` are the issue's; `null` in
/// JSON where a value is unknown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub model: String,
    pub batch: usize,
    /// Separate processes every configuration ran in.
    pub processes: u32,
    pub ours_sequential_graph_ms: Option<f64>,
    pub ours_best_graph_ms: Option<f64>,
    pub best_algo: Option<String>,
    /// Spread of the best schedule's per-process medians.
    pub ours_spread: Option<f64>,
    pub torch_eager_ms: Option<f64>,
    pub torch_graph_ms: Option<f64>,
    pub torch_compile_ms: Option<f64>,
    /// Cold compile time: the first process's, with an empty inductor cache.
    pub torch_compile_s: Option<f64>,
    /// Of the best schedule, MB (10^6 bytes).
    pub peak_memory_mb: Option<f64>,
    /// ours_best_graph_ms / torch_compile_ms (below 1: we are faster).
    pub best_vs_compile: Option<f64>,
    /// ours_sequential_graph_ms / torch_graph_ms (the kernels alone, no concurrency).
    pub sequential_vs_torch_graph: Option<f64>,
    /// Sequential / best makespan simulated under the search's cost model.
    pub predicted_speedup: Option<f64>,
    /// ours_sequential_graph_ms / ours_best_graph_ms.
    pub measured_speedup: Option<f64>,
    /// What PyTorch ran for this model (None: nothing).
    pub torch_model: Option<String>,
    /// Every schedule tried, sequential first.
    pub schedules: Vec<ScheduleResult>,
    pub torch: TorchResult,
    /// When this row was measured (RFC 3339, UTC): rows kept by `--merge` keep theirs.
    pub date: String,
    /// Whether its first process checked every schedule's outputs (`opsched run --check`:
    /// against a sequential NCHW run, and the CPU reference on small graphs) and kept a
    /// figure only where the check passed: every row since 2026-11-27, none before.
    #[serde(default)]
    pub checked: bool,
    /// The cost model its schedules were searched under (`CostModel::name`: where a device
    /// file calibrates the preset, its date and kernels); empty where not recorded.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cost_model: String,
}

impl Row {
    /// The row of `schedules` (sequential first) and the PyTorch side: the best schedule, the
    /// ratios, and the issue's fields filled in from them.
    pub fn new(
        model: &str,
        batch: usize,
        processes: u32,
        schedules: Vec<ScheduleResult>,
        torch: TorchResult,
        torch_model: Option<String>,
        date: &str,
    ) -> Row {
        let seq = schedules.first().filter(|s| s.algo == "sequential");
        let best = fastest(schedules.iter().map(|s| s.graph.as_ref())).map(|i| &schedules[i]);
        let seq_ms = seq.and_then(|s| s.graph.as_ref()).map(|a| a.median_ms);
        let best_ms = best.and_then(|s| s.graph.as_ref()).map(|a| a.median_ms);
        let median = |a: &Option<Aggregate>| a.as_ref().map(|a| a.median_ms);
        Row {
            model: model.to_string(),
            batch,
            processes,
            ours_sequential_graph_ms: seq_ms,
            ours_best_graph_ms: best_ms,
            best_algo: best.map(|s| s.algo.clone()),
            ours_spread: best.and_then(|s| s.graph.as_ref()).map(|a| a.spread),
            torch_eager_ms: median(&torch.eager),
            torch_graph_ms: median(&torch.graph),
            torch_compile_ms: median(&torch.compile),
            torch_compile_s: torch.compile_s_per_process.first().copied(),
            peak_memory_mb: best.and_then(|s| s.memory_mb),
            best_vs_compile: ratio(best_ms, median(&torch.compile)),
            sequential_vs_torch_graph: ratio(seq_ms, median(&torch.graph)),
            predicted_speedup: ratio(
                seq.and_then(|s| s.simulated_ms),
                best.and_then(|s| s.simulated_ms),
            ),
            measured_speedup: ratio(seq_ms, best_ms),
            torch_model,
            schedules,
            torch,
            date: date.to_string(),
            checked: true,
            cost_model: String::new(),
        }
    }
}

/// An earlier run whose rows `--merge` kept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EarlierRun {
    pub date: String,
    pub command: String,
}

/// How our convolutions chose their kernels, in words.
fn convolution_method(h: &Header) -> String {
    let cudnn = match h.conv_api.as_str() {
        "legacy" => "cuDNN's legacy-API algorithms",
        "backend" => "cuDNN's backend-API engines",
        _ => "cuDNN's legacy-API algorithms and backend-API engines",
    };
    match h.conv_gemm.as_str() {
        "always" => format!(
            "our 1x1 convolutions ran as cuBLAS's product, the others chose among {cudnn} by \
             measured time"
        ),
        "timed" => format!(
            "our convolutions chose among {cudnn} (1x1 ones also cuBLAS's product) by measured \
             time"
        ),
        _ => format!("our convolutions chose among {cudnn} by measured time"),
    }
}

/// How our activations were stored, and the fusions our runs left out, in words.
fn layout_method(h: &Header) -> String {
    let mut s = match h.layout.as_str() {
        "nhwc" => {
            "; our activations were stored channels last (NHWC) where cuDNN's convolutions run"
                .to_string()
        }
        _ => String::new(),
    };
    if !h.fusions_left_out.is_empty() {
        s.push_str(&format!(
            "; our runs left out the fusions {} (`opsched run --no-fusion`)",
            h.fusions_left_out.join(", ")
        ));
    }
    s
}

/// How our matrix products chose their kernels, in words.
fn product_method(h: &Header) -> &'static str {
    match h.gemm.as_str() {
        "measured" => {
            "our matrix products ran the faster, as measured, of cuBLAS's own choice and the top \
             configurations of cuBLASLt's heuristic"
        }
        _ => {
            "our matrix products ran cuBLAS's own choice (cuBLASLt's first configuration where \
             the bias, residual or relu is in the product)"
        }
    }
}

/// `conv_gemm` of a table written before the option existed.
fn off() -> String {
    "off".into()
}

/// `gemm` of a table written before the option existed: nothing was measured.
fn heuristic() -> String {
    "heuristic".into()
}

/// `layout` of a table written before the option existed.
fn nchw() -> String {
    "nchw".into()
}

/// What every row of one file shares: the machine, the software and the method.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub format: String,
    pub version: u32,
    pub device: String,
    /// `cuda` or `cpu` (a rehearsal of the pipeline).
    pub backend: String,
    pub driver: String,
    /// The cuDNN our runs loaded (empty on the CPU).
    pub cudnn: String,
    /// Our device's kernel libraries as it reports them.
    pub libraries: String,
    /// PyTorch's versions and settings; None when its columns were not measured.
    pub torch: Option<TorchVersions>,
    /// Why the PyTorch columns are empty, when they are.
    pub torch_note: Option<String>,
    pub date: String,
    pub command: String,
    pub processes: u32,
    /// Timed CUDA-graph replays per process, after `warmup` untimed ones.
    pub repeats: u32,
    pub warmup: u32,
    /// Candidates for "best", after sequential.
    pub algos: Vec<String>,
    /// How schedules were searched (cost model, preset, streams).
    pub search: String,
    /// The cuDNN kernels our convolutions chose among: `both` (legacy algorithms and backend
    /// engines), `legacy` or `backend`.
    pub conv_api: String,
    /// Whether 1x1 convolutions could run as cuBLAS's product: `off`, `timed` (a candidate)
    /// or `always` (tables before the option have none: off).
    #[serde(default = "off")]
    pub conv_gemm: String,
    /// How matrix products chose their kernel: `measured` or `heuristic` (tables before the
    /// option have none: heuristic).
    #[serde(default = "heuristic")]
    pub gemm: String,
    /// How our activations were stored: `nchw` or `nhwc` (tables before the option: nchw).
    #[serde(default = "nchw")]
    pub layout: String,
    /// The fusions our runs left out (`opsched run --no-fusion`; tables before the option
    /// had all that there were then).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fusions_left_out: Vec<String>,
    pub opsched_version: String,
    /// Runs whose rows `--merge` kept, oldest first.
    pub earlier: Vec<EarlierRun>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scoreboard {
    pub header: Header,
    pub rows: Vec<Row>,
}

impl Scoreboard {
    pub fn to_json(&self) -> Result<String> {
        Ok(serde_json::to_string_pretty(self)? + "\n")
    }

    /// A file written by [`Scoreboard::to_json`]; `what` names it in errors.
    pub fn from_json(text: &str, what: &str) -> Result<Scoreboard> {
        let b: Scoreboard =
            serde_json::from_str(text).with_context(|| format!("{what}: not a scoreboard"))?;
        if b.header.format != FORMAT || b.header.version != VERSION {
            bail!(
                "{what}: format '{}' version {}, expected '{FORMAT}' version {VERSION}",
                b.header.format,
                b.header.version
            );
        }
        Ok(b)
    }

    /// This run's rows with those of `older` that it did not measure again, ordered by model
    /// ([`MODELS`]' order, then others as they come, this run's first) and batch, so a table
    /// merged from several runs reads the same whatever their order. Refuses a file from another machine,
    /// other software or another method, naming the field: one table, one configuration
    /// (`libraries` is not compared: a run learns it from its first process, and the driver and
    /// cuDNN versions already pin it).
    pub fn merge(mut self, older: Scoreboard, what: &str) -> Result<Scoreboard> {
        let (a, b) = (&self.header, &older.header);
        let same = [
            ("device", a.device == b.device),
            ("backend", a.backend == b.backend),
            ("driver", a.driver == b.driver),
            ("cudnn", a.cudnn == b.cudnn),
            ("processes", a.processes == b.processes),
            ("repeats", a.repeats == b.repeats),
            ("warmup", a.warmup == b.warmup),
            ("algos", a.algos == b.algos),
            ("search", a.search == b.search),
            ("conv_api", a.conv_api == b.conv_api),
            ("conv_gemm", a.conv_gemm == b.conv_gemm),
            ("gemm", a.gemm == b.gemm),
            ("layout", a.layout == b.layout),
            ("fusions_left_out", a.fusions_left_out == b.fusions_left_out),
            (
                "torch",
                a.torch.is_none() || b.torch.is_none() || a.torch == b.torch,
            ),
        ];
        if let Some((field, _)) = same.iter().find(|(_, ok)| !ok) {
            bail!("{what}: cannot merge, its header.{field} differs from this run's");
        }
        if self.header.torch.is_none() {
            self.header.torch = older.header.torch.clone();
        }
        let mut earlier = older.header.earlier.clone();
        earlier.push(EarlierRun {
            date: older.header.date.clone(),
            command: older.header.command.clone(),
        });
        earlier.retain(|e| {
            older
                .rows
                .iter()
                .any(|r| r.date == e.date && !self.has(&r.model, r.batch))
        });
        let kept: Vec<Row> = older
            .rows
            .into_iter()
            .filter(|r| !self.has(&r.model, r.batch))
            .collect();
        self.rows.extend(kept);
        let order: Vec<String> = MODELS
            .split(',')
            .map(String::from)
            .chain(self.rows.iter().map(|r| r.model.clone()))
            .collect();
        let rank = |m: &str| order.iter().position(|o| o == m).unwrap_or(order.len());
        self.rows.sort_by_key(|r| (rank(&r.model), r.batch));
        self.header.earlier = earlier;
        Ok(self)
    }

    fn has(&self, model: &str, batch: usize) -> bool {
        self.rows
            .iter()
            .any(|r| r.model == model && r.batch == batch)
    }

    /// The table for people: the headline figures, every ratio to torch.compile, then every
    /// schedule, and what each cell means.
    pub fn markdown(&self) -> String {
        let h = &self.header;
        let mut md = String::new();
        let _ = writeln!(md, "# GPU scoreboard: {}\n", h.device);
        let machine = if h.backend == "cuda" {
            // The device's own report names cuDNN's version already.
            let libraries = match h.libraries.is_empty() {
                true => format!("cuDNN {}", h.cudnn),
                false => h.libraries.clone(),
            };
            format!("{} (driver API {}, {libraries})", h.device, h.driver)
        } else {
            format!(
                "{} ({} backend, {}): a rehearsal of the pipeline, not a GPU measurement",
                h.device, h.backend, h.libraries
            )
        };
        let _ = write!(md, "Measured on {machine}; opsched {}", h.opsched_version);
        match &h.torch {
            Some(t) => {
                let _ = writeln!(md, "; {}.", t.describe());
            }
            None => {
                let why = h.torch_note.as_deref().unwrap_or("not measured");
                let _ = writeln!(md, "; PyTorch: not measured ({why}), its columns are n/a.");
            }
        }
        let _ = writeln!(md, "Run {} by `{}`.", h.date, h.command);
        for e in &h.earlier {
            let _ = writeln!(md, "Rows measured earlier: {} by `{}`.", e.date, e.command);
        }
        let _ = writeln!(
            md,
            "\nEvery configuration ran in {p} separate processes; each replayed its captured CUDA \
             graph {r} times after {w} warm-up replays and reports the median. A latency cell \
             (ms) is the median of the {p} per-process medians, \"spread\" is max/min - 1 of \
             them. \"best\" is the schedule with the lowest such latency among sequential, {a} \
             (a tie goes to the earlier in that list); each was searched once ({s}) and every \
             process ran the same schedule file. Eager latency is not used: it measures the \
             host's launches, not the schedule. f32 inputs, TF32 math on both sides, random \
             weights, one GPU; {k}; {g}{l}.\n",
            p = h.processes,
            r = h.repeats,
            w = h.warmup,
            a = h.algos.join(", "),
            s = h.search,
            k = convolution_method(h),
            g = product_method(h),
            l = layout_method(h),
        );
        md.push_str(
            "| model | batch | ours sequential + graph | ours best + graph | best | spread | \
             PyTorch eager | PyTorch graph | torch.compile | compile s | best / torch.compile | \
             sequential / PyTorch graph | peak MB |\n",
        );
        md.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for r in &self.rows {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.model,
                r.batch,
                ms(r.ours_sequential_graph_ms),
                ms(r.ours_best_graph_ms),
                r.best_algo.as_deref().unwrap_or("n/a"),
                percent(r.ours_spread),
                ms(r.torch_eager_ms),
                ms(r.torch_graph_ms),
                ms(r.torch_compile_ms),
                fixed(r.torch_compile_s, 0),
                times(r.best_vs_compile),
                times(r.sequential_vs_torch_graph),
                fixed(r.peak_memory_mb, 1),
            );
        }
        md.push_str(
            "\n\"best / torch.compile\" below 1.00x means our best schedule is faster. torch.compile \
             runs mode=\"reduce-overhead\" (its CUDA graphs); \"compile s\" is the first process's \
             compile and graph recording with an empty inductor cache (later processes reuse \
             it). \"peak MB\" is the device memory (10^6 bytes) of the best plan's buffers under \
             our memory plan, as `opsched run` reports it (cuDNN workspaces not included). n/a: not measured or failed (see below and the JSON file).\n",
        );
        md.push_str(&self.checked_note());
        md.push_str(&self.searched_note());
        self.markdown_compared(&mut md);
        self.markdown_schedules(&mut md);
        md
    }

    /// Which rows' figures are of checked outputs.
    fn checked_note(&self) -> String {
        let unchecked: Vec<String> = self
            .rows
            .iter()
            .filter(|r| !r.checked)
            .map(|r| format!("{} b{}", r.model, r.batch))
            .collect();
        let mut note = String::from(
            "\nThe first process ran every schedule with `--check`: its outputs against a \
             sequential run storing NCHW (and the CPU reference on graphs of at most 2 GFLOPs); \
             a schedule whose check failed has no figure",
        );
        match unchecked.len() {
            0 => note.push_str(".\n"),
            n if n == self.rows.len() => {
                note = "\nNo row's outputs were checked by bench-gpu (measured before it checked \
                        them).\n"
                    .into()
            }
            _ => {
                note.push_str(&format!(
                    ", except in the rows measured before bench-gpu checked them ({}).\n",
                    unchecked.join(", ")
                ));
            }
        }
        note
    }

    /// Which cost model each row's schedules were searched under, where recorded (a refit of
    /// the device file changes the schedules a search finds).
    fn searched_note(&self) -> String {
        let mut models: Vec<(&str, Vec<String>)> = Vec::new();
        for r in &self.rows {
            let key = match r.cost_model.as_str() {
                "" => "not recorded",
                m => m,
            };
            let row = format!("{} b{}", r.model, r.batch);
            match models.iter_mut().find(|(m, _)| *m == key) {
                Some((_, rows)) => rows.push(row),
                None => models.push((key, vec![row])),
            }
        }
        if models.iter().all(|(m, _)| *m == "not recorded") {
            return String::new();
        }
        let parts: Vec<String> = models
            .iter()
            .map(|(m, rows)| format!("{m} ({})", rows.join(", ")))
            .collect();
        format!(
            "\nThe schedules were searched under: {}.\n",
            parts.join("; ")
        )
    }

    /// What PyTorch ran for each model, and why a cell is empty.
    fn markdown_compared(&self, md: &mut String) {
        let mut seen: Vec<&str> = Vec::new();
        let mut lines = Vec::new();
        for r in &self.rows {
            let skipped = r.torch.notes.iter().find(|n| n.starts_with("skipped:"));
            if !seen.contains(&r.model.as_str()) {
                seen.push(&r.model);
                match (&r.torch_model, skipped) {
                    (Some(what), _) => lines.push(format!("- {}: PyTorch ran {what}.", r.model)),
                    (None, Some(why)) => lines.push(format!("- {}: PyTorch {why}.", r.model)),
                    (None, None) => {}
                }
            }
            for n in r.torch.notes.iter().filter(|n| Some(*n) != skipped) {
                lines.push(format!("- {} b{}: PyTorch {n}", r.model, r.batch));
            }
            for s in &r.schedules {
                if let Some(e) = &s.error {
                    lines.push(format!("- {} b{} {}: {e}", r.model, r.batch, s.algo));
                }
            }
        }
        if !lines.is_empty() {
            md.push_str("\nWhat was compared, and what failed:\n\n");
            md.push_str(&lines.join("\n"));
            md.push('\n');
        }
    }

    /// Every schedule of every row: median of medians (spread).
    fn markdown_schedules(&self, md: &mut String) {
        let mut algos: Vec<&str> = Vec::new();
        for s in self.rows.iter().flat_map(|r| &r.schedules) {
            if !algos.contains(&s.algo.as_str()) {
                algos.push(&s.algo);
            }
        }
        if algos.is_empty() {
            return;
        }
        md.push_str(
            "\n## Every schedule\n\nCUDA-graph replay, ms: median of the per-process medians \
             (spread); \"predicted\" is the best schedule's simulated speedup over sequential \
             under the search's cost model, \"measured\" the same ratio of the latencies above.\n\n",
        );
        let _ = writeln!(
            md,
            "| model | batch | {} | predicted | measured |",
            algos.join(" | ")
        );
        let _ = writeln!(md, "|---|---|{}---|---|", "---|".repeat(algos.len()));
        for r in &self.rows {
            let cells: Vec<String> = algos
                .iter()
                .map(|a| match r.schedules.iter().find(|s| s.algo == *a) {
                    Some(ScheduleResult { graph: Some(g), .. }) => {
                        format!("{:.3} ({})", g.median_ms, percent(Some(g.spread)))
                    }
                    Some(_) => "failed".into(),
                    None => "n/a".into(),
                })
                .collect();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                r.model,
                r.batch,
                cells.join(" | "),
                times(r.predicted_speedup),
                times(r.measured_speedup)
            );
        }
    }
}

fn fixed(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "n/a".into(), |x| format!("{x:.digits$}"))
}

fn ms(v: Option<f64>) -> String {
    fixed(v, 3)
}

fn times(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |x| format!("{x:.2}x"))
}

fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".into(), |x| format!("{:.1}%", x * 100.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agg(ms: &[f64]) -> Option<Aggregate> {
        Aggregate::of(ms)
    }

    fn sched(algo: &str, sim: f64, ms: &[f64]) -> ScheduleResult {
        ScheduleResult {
            algo: algo.into(),
            simulated_ms: Some(sim),
            graph: agg(ms),
            memory_mb: Some(12.5),
            error: None,
        }
    }

    fn header() -> Header {
        Header {
            format: FORMAT.into(),
            version: VERSION,
            device: "NVIDIA H100 80GB HBM3".into(),
            backend: "cuda".into(),
            driver: "13.0".into(),
            cudnn: "9.14.0".into(),
            libraries: "cuDNN 9.14.0, cuBLAS".into(),
            torch: None,
            torch_note: Some("--no-torch".into()),
            date: "2026-11-23T14:00:00Z".into(),
            command: "cargo xtask bench-gpu".into(),
            processes: 3,
            repeats: 100,
            warmup: 20,
            algos: vec!["ios".into(), "lios".into()],
            search: "analytical cost model, h100 preset, 8 streams".into(),
            conv_api: "both".into(),
            conv_gemm: "off".into(),
            gemm: "measured".into(),
            layout: "nchw".into(),
            fusions_left_out: Vec::new(),
            opsched_version: "0.1.0".into(),
            earlier: Vec::new(),
        }
    }

    fn row(model: &str, batch: usize, date: &str) -> Row {
        let torch = TorchResult {
            eager: agg(&[9.0, 9.2, 8.8]),
            graph: agg(&[1.8, 1.7, 1.9]),
            compile: agg(&[1.0, 1.1, 1.05]),
            compile_s_per_process: vec![35.0, 4.0, 4.1],
            notes: Vec::new(),
        };
        Row::new(
            model,
            batch,
            3,
            vec![
                sched("sequential", 3.0, &[3.1, 3.0, 3.3]),
                sched("ios", 2.0, &[2.3, 2.2, 2.5]),
                sched("lios", 1.5, &[1.5, 1.6, 1.4]),
            ],
            torch,
            Some("torchvision inception_v3".into()),
            date,
        )
    }

    #[test]
    fn median_of_medians_and_spread() {
        let a = agg(&[3.0, 1.0, 2.0]).expect("valid");
        assert_eq!(a.median_ms, 2.0);
        assert!((a.spread - 2.0).abs() < 1e-12, "3/1 - 1");
        assert_eq!(a.per_process_ms, vec![3.0, 1.0, 2.0], "kept in run order");
        let even = agg(&[4.0, 1.0, 2.0, 3.0]).expect("valid");
        assert_eq!(even.median_ms, 2.5);
        assert_eq!(agg(&[1.25]).expect("valid").spread, 0.0);
        assert_eq!(agg(&[]), None);
        assert_eq!(agg(&[1.0, f64::NAN, 2.0]), None);
        assert_eq!(agg(&[1.0, 0.0]), None);
        assert_eq!(agg(&[1.0, f64::INFINITY]), None);
    }

    #[test]
    fn aggregation_matches_a_sort_on_random_inputs() {
        // A small LCG: the property over many inputs without a new dependency.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..500 {
            let n = 1 + (x % 7) as usize;
            let v: Vec<f64> = (0..n)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    round6(0.1 + (x >> 40) as f64 / 1e5)
                })
                .collect();
            let a = agg(&v).expect("positive");
            let below = v.iter().filter(|&&t| t < a.median_ms).count();
            let above = v.iter().filter(|&&t| t > a.median_ms).count();
            assert!(below <= n / 2 && above <= n / 2, "{v:?} -> {}", a.median_ms);
            let (lo, hi) = v
                .iter()
                .fold((f64::MAX, 0.0f64), |(l, h), &t| (l.min(t), h.max(t)));
            assert!((a.spread - (hi / lo - 1.0)).abs() <= 5e-7);
            assert!(a.spread >= 0.0);
        }
    }

    #[test]
    fn best_is_the_lowest_median_and_ties_go_to_the_earlier() {
        let a = agg(&[2.0, 2.0, 2.0]);
        let b = agg(&[1.0, 3.0, 1.5]);
        let c = agg(&[1.5, 1.5, 1.5]);
        assert_eq!(fastest([a.as_ref(), b.as_ref(), c.as_ref()]), Some(1));
        assert_eq!(fastest([a.as_ref(), c.as_ref(), b.as_ref()]), Some(1));
        assert_eq!(fastest([c.as_ref(), b.as_ref()]), Some(0), "tie: earlier");
        assert_eq!(fastest([None, a.as_ref(), None]), Some(1));
        assert_eq!(fastest([None, None]), None);
    }

    #[test]
    fn a_row_ranks_by_graph_replay_and_states_the_ratios() {
        let r = row("inception_v3", 1, "d");
        assert_eq!(r.best_algo.as_deref(), Some("lios"));
        assert_eq!(r.ours_best_graph_ms, Some(1.5));
        assert_eq!(r.ours_sequential_graph_ms, Some(3.1));
        assert!((r.ours_spread.expect("spread") - (1.6 / 1.4 - 1.0)).abs() <= 5e-7);
        assert_eq!(r.torch_compile_ms, Some(1.05));
        assert_eq!(r.torch_compile_s, Some(35.0), "the cold process's");
        assert!((r.best_vs_compile.expect("ratio") - 1.5 / 1.05).abs() <= 5e-7);
        assert!((r.predicted_speedup.expect("ratio") - 2.0).abs() < 1e-12);
        assert_eq!(r.peak_memory_mb, Some(12.5));
        // A schedule without a result never wins, and sequential can.
        let mut s = row("x", 1, "d").schedules;
        s[1].graph = None;
        s[2].graph = agg(&[4.0, 4.0, 4.0]);
        let r = Row::new("x", 1, 3, s, TorchResult::default(), None, "d");
        assert_eq!(r.best_algo.as_deref(), Some("sequential"));
        assert_eq!(r.torch_compile_ms, None);
        assert_eq!(r.best_vs_compile, None);
    }

    #[test]
    fn json_round_trips_with_the_issues_field_names() {
        let b = Scoreboard {
            header: header(),
            rows: vec![row("inception_v3", 1, "d"), row("inception_v3", 16, "d")],
        };
        let text = b.to_json().expect("serialises");
        assert_eq!(Scoreboard::from_json(&text, "t").expect("parses"), b);
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        for f in [
            "device",
            "driver",
            "cudnn",
            "torch",
            "date",
            "command",
            "processes",
            "repeats",
        ] {
            assert!(v["header"].get(f).is_some(), "header.{f}");
        }
        let row = v["rows"][0].as_object().expect("object");
        for f in [
            "model",
            "batch",
            "processes",
            "ours_sequential_graph_ms",
            "ours_best_graph_ms",
            "best_algo",
            "ours_spread",
            "torch_eager_ms",
            "torch_graph_ms",
            "torch_compile_ms",
            "torch_compile_s",
            "peak_memory_mb",
        ] {
            assert!(row.contains_key(f), "rows[].{f}");
        }
        assert_eq!(row["best_algo"], "lios");
        assert_eq!(row["batch"], 1);
        // Unknown values are null, not missing.
        let empty = Row::new(
            "randwire",
            1,
            3,
            Vec::new(),
            TorchResult::default(),
            None,
            "d",
        );
        let e = serde_json::to_value(&empty).expect("json");
        assert!(e["torch_compile_ms"].is_null() && e["peak_memory_mb"].is_null());
        let wrong = text.replace(FORMAT, "something-else");
        let err = Scoreboard::from_json(&wrong, "gpu.json").expect_err("format");
        assert!(err.to_string().starts_with("gpu.json: format"), "{err}");
    }

    /// The committed H100 tables read back (today's, channels last, and the NCHW one of
    /// 2026-11-26), and each row's headline figures and ratios are what its own per-schedule
    /// and PyTorch results give.
    #[test]
    fn the_committed_h100_tables_are_consistent() {
        let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/gpu");
        let table = |path: String, layout: &str| {
            let b = committed_table(&path);
            assert_eq!(b.header.layout, layout, "{path}");
        };
        table(format!("{fixtures}/nvidia-h100-80gb-hbm3.json"), "nhwc");
        table(
            format!("{fixtures}/h100-2026-11-26/scoreboard-nchw.json"),
            "nchw",
        );
    }

    /// The committed table at `path`, checked against itself.
    fn committed_table(path: &str) -> Scoreboard {
        let text = std::fs::read_to_string(path).expect("the committed table");
        let b = Scoreboard::from_json(&text, path).expect("it parses");
        assert!(!b.rows.is_empty());
        // Measured with the default kernels: no cuBLAS product for 1x1 convolutions.
        assert_eq!(b.header.conv_gemm, "off");
        // The people's copy is this file's rendering, rows in the merge's order.
        let md = std::fs::read_to_string(path.replace(".json", ".md")).expect("the table's .md");
        assert!(md == b.markdown(), "the .md is not the .json's markdown");
        let rank = |m: &str| MODELS.split(',').position(|o| o == m);
        let keys: Vec<_> = b.rows.iter().map(|r| (rank(&r.model), r.batch)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
        for r in &b.rows {
            let again = Row::new(
                &r.model,
                r.batch,
                r.processes,
                r.schedules.clone(),
                r.torch.clone(),
                r.torch_model.clone(),
                &r.date,
            );
            let again = Row {
                checked: r.checked,
                cost_model: r.cost_model.clone(),
                ..again
            };
            assert_eq!(&again, r, "{} b{}", r.model, r.batch);
            assert!(r.processes >= 3, "{} b{}", r.model, r.batch);
        }
        b
    }

    #[test]
    fn markdown_states_every_ratio_and_every_schedule() {
        let b = Scoreboard {
            header: header(),
            rows: vec![row("inception_v3", 1, "d"), row("inception_v3", 16, "d")],
        };
        let md = b.markdown();
        assert!(md.starts_with("# GPU scoreboard: NVIDIA H100 80GB HBM3\n"));
        assert!(md.contains("PyTorch: not measured (--no-torch)"), "{md}");
        // cuDNN named once, by the device's own report.
        assert_eq!(md.matches("cuDNN 9.14").count(), 1, "{md}");
        let table: Vec<&str> = md
            .lines()
            .filter(|l| l.starts_with("| inception_v3"))
            .collect();
        assert_eq!(
            table.len(),
            4,
            "two headline rows and two schedule rows: {md}"
        );
        // b1 and b16 both carry best / torch.compile = 1.5 / 1.05.
        for l in &table[..2] {
            assert!(l.contains("| 1.43x |"), "{l}");
            assert!(l.contains("| 3.100 | 1.500 | lios | 14.3% |"), "{l}");
        }
        assert!(
            table[2].contains("| 3.100 (10.0%) | 2.300 (13.6%) | 1.500 (14.3%) | 2.00x | 2.07x |")
        );
        assert!(md.contains("- inception_v3: PyTorch ran torchvision inception_v3."));
        assert!(
            md.contains("a schedule whose check failed has no figure.\n"),
            "{md}"
        );
        // A row kept from a table measured before the check says so.
        let mut old = b.clone();
        old.rows[1].checked = false;
        let md_old = old.markdown();
        assert!(
            md_old.contains(
                "except in the rows measured before bench-gpu checked them (inception_v3 b16)"
            ),
            "{md_old}"
        );
        old.rows[0].checked = false;
        assert!(old.markdown().contains("No row's outputs were checked"));
        // The cost model each row was searched under, where recorded (a refit changes the
        // schedules); none recorded, no sentence.
        assert!(!md.contains("searched under:"), "{md}");
        let mut refit = b.clone();
        refit.rows[0].cost_model = "analytical(h100, calibrated 2026-11-27)".into();
        assert!(
            refit.markdown().contains(
                "searched under: analytical(h100, calibrated 2026-11-27) (inception_v3 b1); \
                 not recorded (inception_v3 b16).\n"
            ),
            "{}",
            refit.markdown()
        );
        let skipped = TorchResult {
            notes: vec!["skipped: ours only".into()],
            ..Default::default()
        };
        let mut failed = sched("ios", 1.0, &[]);
        failed.error = Some("process 2 failed: out of memory".into());
        let ours_only = |batch| {
            Row::new(
                "randwire",
                batch,
                3,
                vec![failed.clone()],
                skipped.clone(),
                None,
                "d",
            )
        };
        let b = Scoreboard {
            header: header(),
            rows: vec![ours_only(1), ours_only(16)],
        };
        let md = b.markdown();
        assert_eq!(
            md.matches("- randwire: PyTorch skipped: ours only.")
                .count(),
            1,
            "{md}"
        );
        assert!(
            md.contains("- randwire b16 ios: process 2 failed: out of memory\n"),
            "{md}"
        );
        assert!(
            md.contains("| randwire | 16 | n/a | n/a | n/a | n/a |"),
            "{md}"
        );
        // Every row of a table has as many cells as its header.
        for block in md.split("\n\n").filter(|b| b.starts_with("| model")) {
            let widths: Vec<usize> = block.lines().map(|l| l.matches('|').count()).collect();
            assert!(widths.iter().all(|&w| w == widths[0]), "{block}");
        }
    }

    #[test]
    fn merge_keeps_rows_not_measured_again_and_refuses_other_setups() {
        let older = Scoreboard {
            header: Header {
                date: "old".into(),
                command: "cargo xtask bench-gpu --models a,b".into(),
                ..header()
            },
            rows: vec![row("a", 1, "old"), row("b", 1, "old"), row("b", 16, "old")],
        };
        let now = Scoreboard {
            header: header(),
            rows: vec![
                row("b", 1, "new"),
                row("c", 1, "new"),
                row("googlenet", 1, "new"),
            ],
        };
        let m = now
            .clone()
            .merge(older.clone(), "f.json")
            .expect("same setup");
        let keys: Vec<(&str, usize, &str)> = m
            .rows
            .iter()
            .map(|r| (r.model.as_str(), r.batch, r.date.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                ("googlenet", 1, "new"),
                ("b", 1, "new"),
                ("b", 16, "old"),
                ("c", 1, "new"),
                ("a", 1, "old")
            ]
        );
        assert_eq!(m.header.earlier.len(), 1);
        assert_eq!(
            m.header.earlier[0].command,
            "cargo xtask bench-gpu --models a,b"
        );
        let mut other = older.clone();
        other.header.driver = "12.8".into();
        let err = now
            .clone()
            .merge(other, "f.json")
            .expect_err("driver differs");
        assert_eq!(
            err.to_string(),
            "f.json: cannot merge, its header.driver differs from this run's"
        );
        // Convolutions that chose among other cuDNN kernels are another configuration.
        let mut legacy = older.clone();
        legacy.header.conv_api = "legacy".into();
        let err = now
            .clone()
            .merge(legacy, "f.json")
            .expect_err("conv_api differs");
        assert!(err.to_string().contains("header.conv_api"), "{err}");
        // So are 1x1 convolutions that could run as cuBLAS's product.
        let mut gemm = older.clone();
        gemm.header.conv_gemm = "timed".into();
        let err = now
            .clone()
            .merge(gemm.clone(), "f.json")
            .expect_err("conv_gemm differs");
        assert!(err.to_string().contains("header.conv_gemm"), "{err}");
        assert!(gemm.markdown().contains("(1x1 ones also cuBLAS's product)"));
        // And matrix products that measured nothing: what a table before the option holds.
        let text = older.to_json().expect("written");
        let mut json: serde_json::Value = serde_json::from_str(&text).expect("json");
        let header = json["header"].as_object_mut().expect("a header");
        header.remove("gemm");
        header.remove("layout");
        let before = Scoreboard::from_json(&json.to_string(), "f.json").expect("read back");
        assert_eq!(before.header.gemm, "heuristic");
        assert!(before
            .markdown()
            .contains("products ran cuBLAS's own choice"));
        assert!(now
            .markdown()
            .contains("as measured, of cuBLAS's own choice"));
        assert_eq!(before.header.layout, "nchw");
        let err = now
            .clone()
            .merge(before, "f.json")
            .expect_err("gemm differs");
        assert!(err.to_string().contains("header.gemm"), "{err}");
        // And channels-last activations.
        let mut nhwc = now.clone();
        nhwc.header.layout = "nhwc".into();
        assert!(nhwc.markdown().contains("stored channels last (NHWC)"));
        let err = nhwc
            .clone()
            .merge(now.clone(), "f.json")
            .expect_err("layout differs");
        assert!(err.to_string().contains("header.layout"), "{err}");
        // And fusions left out: said, kept through JSON (absent: none), and merged only with
        // the same ones.
        assert!(!now.to_json().expect("written").contains("fusions_left_out"));
        let mut fewer = nhwc.clone();
        fewer.header.fusions_left_out = vec!["bias-into-depthwise".into()];
        assert!(fewer
            .markdown()
            .contains("left out the fusions bias-into-depthwise"));
        let back =
            Scoreboard::from_json(&fewer.to_json().expect("written"), "f.json").expect("read");
        assert_eq!(back.header, fewer.header);
        let err = fewer.merge(nhwc, "f.json").expect_err("fusions differ");
        assert!(err.to_string().contains("header.fusions_left_out"), "{err}");
    }
}
