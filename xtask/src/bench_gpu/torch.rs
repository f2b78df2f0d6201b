//! The PyTorch side: what `xtask/gpu/torch_bench.py` writes (one file per process) and how the
//! processes' results become a row's [`TorchResult`].

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::board::{round6, Aggregate, TorchResult};

/// The script's `format` and `version`.
const FORMAT: &str = "opsched-torch-bench";
const VERSION: u32 = 2;

/// PyTorch's versions and settings, as the scoreboard's header keeps them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TorchVersions {
    pub torch: String,
    pub torchvision: Option<String>,
    /// None when timm does not import (NASNet is then skipped).
    pub timm: Option<String>,
    pub cuda: Option<String>,
    /// As `torch.backends.cudnn.version()` says it, e.g. 91900.
    pub cudnn: Option<u64>,
    pub device: String,
    pub allow_tf32: AllowTf32,
    /// torch.compile's settings, in words.
    pub compile: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllowTf32 {
    pub cudnn: bool,
    pub matmul: bool,
}

impl TorchVersions {
    /// "PyTorch 2.11 (torchvision 0.26, timm 1.0, CUDA 13.0, cuDNN 91900, TF32 ...)".
    pub fn describe(&self) -> String {
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "absent".into());
        format!(
            "PyTorch {} (torchvision {}, timm {}, CUDA {}, cuDNN {}, TF32 in cuDNN {} and matmul \
             {}; torch.compile {})",
            self.torch,
            opt(&self.torchvision),
            opt(&self.timm),
            opt(&self.cuda),
            self.cudnn
                .map_or_else(|| "absent".into(), |v| v.to_string()),
            self.allow_tf32.cudnn,
            self.allow_tf32.matmul,
            self.compile
        )
    }
}

/// One process's output.
#[derive(Clone, Debug, Deserialize)]
pub struct TorchRun {
    pub format: String,
    pub version: u32,
    #[serde(flatten)]
    pub versions: TorchVersions,
    pub models: Vec<TorchModel>,
    pub results: Vec<TorchSample>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct TorchModel {
    pub model: String,
    /// What PyTorch ran for it; None when skipped.
    pub compared: Option<String>,
    /// Why it was skipped.
    pub skipped: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Eager,
    CudaGraph,
    Compile,
}

#[derive(Clone, Debug, Deserialize)]
pub struct TorchSample {
    pub model: String,
    pub batch: usize,
    pub mode: Mode,
    /// None when this mode failed (`error` says why).
    pub median_ms: Option<f64>,
    pub compile_s: Option<f64>,
    pub error: Option<String>,
}

impl TorchRun {
    /// The script's output; `what` names it in errors.
    pub fn parse(text: &str, what: &str) -> Result<TorchRun> {
        let run: TorchRun = serde_json::from_str(text)
            .with_context(|| format!("{what}: not the output of torch_bench.py"))?;
        if run.format != FORMAT || run.version != VERSION {
            bail!(
                "{what}: format '{}' version {}, expected '{FORMAT}' version {VERSION}",
                run.format,
                run.version
            );
        }
        Ok(run)
    }

    /// What PyTorch ran for `model` (None: skipped or not asked).
    pub fn compared(&self, model: &str) -> Option<String> {
        self.model(model).and_then(|m| m.compared.clone())
    }

    fn model(&self, model: &str) -> Option<&TorchModel> {
        self.models.iter().find(|m| m.model == model)
    }

    fn sample(&self, model: &str, batch: usize, mode: Mode) -> Option<&TorchSample> {
        self.results
            .iter()
            .find(|s| s.model == model && s.batch == batch && s.mode == mode)
    }
}

/// `model` at `batch` over every process's run (in the order they ran): a mode has a result
/// only when every process measured it, else a note says which process did not and why.
pub fn result(runs: &[TorchRun], model: &str, batch: usize) -> TorchResult {
    let mut out = TorchResult::default();
    if let Some(why) = runs.first().and_then(|r| r.model(model)?.skipped.clone()) {
        out.notes.push(format!("skipped: {why}"));
        return out;
    }
    for (mode, name) in [
        (Mode::Eager, "eager"),
        (Mode::CudaGraph, "CUDA graph"),
        (Mode::Compile, "torch.compile"),
    ] {
        let mut medians = Vec::with_capacity(runs.len());
        let mut missing = None;
        for (p, run) in runs.iter().enumerate() {
            match run.sample(model, batch, mode) {
                Some(TorchSample {
                    median_ms: Some(ms),
                    ..
                }) => medians.push(*ms),
                Some(TorchSample { error, .. }) => {
                    let why = error.as_deref().unwrap_or("no median");
                    missing = Some(format!("{name} failed in process {}: {why}", p + 1));
                    break;
                }
                None => {
                    missing = Some(format!("{name}: not in process {}'s output", p + 1));
                    break;
                }
            }
        }
        if let Some(note) = missing {
            out.notes.push(note);
            continue;
        }
        let agg = Aggregate::of(&medians);
        match mode {
            Mode::Eager => out.eager = agg,
            Mode::CudaGraph => out.graph = agg,
            Mode::Compile => {
                out.compile = agg;
                out.compile_s_per_process = runs
                    .iter()
                    .filter_map(|r| r.sample(model, batch, mode)?.compile_s.map(round6))
                    .collect();
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TorchRun {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/gpu/torch_bench.sample.json");
        let text = std::fs::read_to_string(path).expect("the committed sample");
        TorchRun::parse(&text, "sample").expect("parses")
    }

    #[test]
    fn the_committed_sample_parses() {
        let run = sample();
        assert_eq!(run.versions.torch, "2.11.0+cu130");
        assert_eq!(run.versions.cudnn, Some(91900));
        assert!(run.versions.allow_tf32.cudnn && !run.versions.allow_tf32.matmul);
        assert!(run.versions.describe().contains("timm absent"));
        let s = run
            .sample("inception_v3", 1, Mode::CudaGraph)
            .expect("graph b1");
        assert!((s.median_ms.expect("ms") - 1.7794560194015503).abs() < 1e-12);
        let c = run
            .sample("transformer", 1, Mode::Compile)
            .expect("compile");
        assert_eq!((c.median_ms, c.compile_s), (Some(2.443), Some(4.0)));
        assert!(run
            .compared("transformer")
            .expect("ran")
            .starts_with("BERT-base"));
        assert_eq!(run.compared("randwire"), None);
    }

    #[test]
    fn processes_aggregate_per_mode_and_a_failure_leaves_a_note() {
        let a = sample();
        let mut b = sample();
        let mut c = sample();
        for r in b.results.iter_mut().chain(c.results.iter_mut()) {
            r.median_ms = r.median_ms.map(|m| m * 1.1);
            r.compile_s = r.compile_s.map(|_| 1.0);
        }
        let t = result(&[a.clone(), b.clone(), c.clone()], "transformer", 1);
        let graph = t.graph.expect("three processes");
        assert!((graph.median_ms - 2.260 * 1.1).abs() < 1e-9);
        assert!((graph.spread - 0.1).abs() < 1e-9);
        assert_eq!(t.compile_s_per_process, vec![4.0, 1.0, 1.0]);
        assert!(t.notes.is_empty(), "{:?}", t.notes);

        // Process 2 failed torch.compile: no compile result, a note; the other modes stand.
        let s = b
            .results
            .iter_mut()
            .find(|s| s.model == "transformer" && s.mode == Mode::Compile)
            .expect("compile row");
        s.median_ms = None;
        s.error = Some("OutOfMemoryError: CUDA out of memory".into());
        let t = result(&[a.clone(), b, c], "transformer", 1);
        assert!(t.compile.is_none() && t.eager.is_some());
        assert_eq!(
            t.notes,
            ["torch.compile failed in process 2: OutOfMemoryError: CUDA out of memory"]
        );

        let skipped = result(std::slice::from_ref(&a), "randwire", 1);
        assert_eq!(
            skipped.notes,
            ["skipped: ours only: no PyTorch counterpart"]
        );
        let absent = result(std::slice::from_ref(&a), "resnet50", 2);
        assert_eq!(absent.notes.len(), 3, "{:?}", absent.notes);
    }

    #[test]
    fn another_format_is_an_error_naming_the_file() {
        let err = TorchRun::parse(r#"{"format": "x", "version": 1}"#, "p1.json").expect_err("x");
        assert!(err.to_string().starts_with("p1.json: "), "{err}");
        let err = TorchRun::parse(r#"{"results": 3}"#, "p1.json").expect_err("x");
        assert!(err.to_string().starts_with("p1.json: "), "{err}");
    }
}
