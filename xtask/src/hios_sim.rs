//! `cargo xtask hios-sim`: the simulation study of the HIOS paper (Figs. 7 to 11).
//!
//! Five sweeps around the default setup (200 ops, 400 edges, 14 layers, p = 0.8, 4 GPUs):
//! GPU count, op count, dependency count, layer count and transfer ratio p. Each point runs
//! `--instances` seeded layered random DAGs (30 by default) through sequential, IOS, HIOS-MR,
//! HIOS-LP and the two inter-only variants, all evaluated by the one simulator under the
//! hios-sim stage law. IOS solves parts of at most `--ios-part` operators (12 by default: its
//! exact DP is exponential in a part's width, and these DAGs are about 14 operators wide). Writes `<out>/hios-sim.csv` (one row per instance and algorithm) and one
//! SVG line plot per sweep, and prints mean and standard deviation per point.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use opsched::cost::{AnalyticalModel, DevicePreset, HiosSimLaw, LinkPreset};
use opsched::graph::random::{layered_dag, LayeredDagParams};
use opsched::schedule::Platform;
use opsched::SchedulerOptions;

use crate::plot;

const ALGOS: &[&str] = &[
    "sequential",
    "ios",
    "hios-mr",
    "hios-lp",
    "hios-mr-inter",
    "hios-lp-inter",
];

/// One point of a sweep: its x value and the parameters it changes.
struct Point {
    x: f64,
    gpus: usize,
    params: LayeredDagParams,
}

struct Sweep {
    name: &'static str,
    x_label: &'static str,
    points: Vec<Point>,
}

fn sweeps(quick: bool) -> Vec<Sweep> {
    let base = LayeredDagParams::default();
    let pick = |v: Vec<usize>| {
        if quick {
            v.into_iter().step_by(2).collect()
        } else {
            v
        }
    };
    // A sweep over one instance parameter on 4 GPUs: `set` writes value v, `x_of` plots it.
    let vary = |name: &'static str,
                x_label: &'static str,
                values: Vec<usize>,
                x_of: fn(usize) -> f64,
                set: fn(&mut LayeredDagParams, usize)| Sweep {
        name,
        x_label,
        points: pick(values)
            .into_iter()
            .map(|v| {
                let mut params = base.clone();
                set(&mut params, v);
                Point {
                    x: x_of(v),
                    gpus: 4,
                    params,
                }
            })
            .collect(),
    };
    let as_x = |v: usize| v as f64;
    vec![
        Sweep {
            name: "gpus",
            x_label: "GPUs",
            points: pick(vec![2, 4, 6, 8, 10, 12])
                .into_iter()
                .map(|m| Point {
                    x: m as f64,
                    gpus: m,
                    params: base.clone(),
                })
                .collect(),
        },
        vary(
            "ops",
            "operators",
            vec![100, 150, 200, 250, 300, 350, 400],
            as_x,
            |p, n| p.ops = n,
        ),
        vary(
            "edges",
            "dependencies",
            vec![400, 450, 500, 550, 600],
            as_x,
            |p, e| p.edges = e,
        ),
        vary("layers", "layers", vec![6, 10, 14, 18, 22], as_x, |p, l| {
            p.layers = l
        }),
        vary(
            "transfer",
            "transfer ratio p",
            vec![4, 6, 8, 10, 12],
            |p10| p10 as f64 / 10.0,
            |p, p10| p.transfer_ratio = p10 as f64 / 10.0,
        ),
    ]
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

/// Makespans of every algorithm on one instance.
fn run_instance(
    params: &LayeredDagParams,
    gpus: usize,
    algos: &[&str],
    opts: &SchedulerOptions,
) -> Result<Vec<f64>> {
    let g = layered_dag(params).with_context(|| format!("generating seed {}", params.seed))?;
    let device = DevicePreset::by_name("h100")?;
    let link = LinkPreset::by_name("nvlink4")?;
    let cost = HiosSimLaw::new(AnalyticalModel::new(device.clone(), link.clone()));
    let platform = Platform {
        gpus,
        streams: 8,
        device,
        link,
    };
    let table = opsched::compare(
        &g,
        algos,
        &platform,
        &cost,
        opts,
        opsched::schedule::ExecMode::Graph,
        &opsched::schedule::NoProgress,
    )
    .with_context(|| format!("instance seed {} on {gpus} GPUs", params.seed))?;
    Ok(table.rows.iter().map(|r| r.makespan_ms).collect())
}

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Writes hios-sim.csv and hios-sim-<sweep>.svg under --out and prints the table.\n\n\
Examples:\n  cargo xtask hios-sim\n  cargo xtask hios-sim --quick\n  \
cargo xtask hios-sim --instances 10 --out target/study"
)]
pub struct Args {
    /// 5 instances per point and every other point (unless --instances).
    #[arg(long)]
    quick: bool,
    /// Random instances per point [default: 30, 5 with --quick].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    instances: Option<u32>,
    /// Operators per part of IOS's DP. IOS's exact DP is exponential in the width of a part, and
    /// these DAGs are about 14 operators wide: parts of 12 keep one instance to a fraction of a
    /// second.
    #[arg(long, value_name = "N", default_value_t = 12)]
    ios_part: usize,
    /// Output folder.
    #[arg(long, value_name = "DIR", default_value = "target/hios-sim")]
    out: PathBuf,
}

pub fn run(a: &Args) -> Result<()> {
    let quick = a.quick;
    let opts = SchedulerOptions {
        ios_part: a.ios_part,
        ..SchedulerOptions::default()
    };
    let out = a.out.clone();
    let instances = a
        .instances
        .map_or(if quick { 5 } else { 30 }, |n| n as usize);
    let known = opsched::scheduler_names();
    let algos: Vec<&str> = ALGOS
        .iter()
        .copied()
        .filter(|a| known.contains(a))
        .collect();
    for missing in ALGOS.iter().filter(|a| !known.contains(a)) {
        eprintln!("note: '{missing}' is not registered in this build; skipped");
    }
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut csv =
        String::from("sweep,x,gpus,ops,edges,layers,p,seed,algorithm,makespan_ms,speedup\n");
    let mut table = String::new();
    let all_sweeps = sweeps(quick);
    let runs: usize = all_sweeps.iter().map(|s| s.points.len() * instances).sum();
    let bar = crate::progress::bar(runs as u64);
    for sweep in all_sweeps {
        let mut means: Vec<Vec<f64>> = vec![Vec::new(); algos.len()];
        let _ = writeln!(table, "\n{} sweep (mean ± std of makespan in ms over {instances} instances; speedup over sequential)", sweep.name);
        let _ = writeln!(
            table,
            "{:>8}  {}",
            sweep.x_label,
            algos.iter().map(|a| format!("{a:>24}")).collect::<String>()
        );
        for point in &sweep.points {
            bar.set_message(format!("{} = {}", sweep.name, point.x));
            // Instances in parallel, one chunk of seeds per thread.
            let seeds: Vec<u64> = (0..instances as u64).collect();
            let results: Vec<Result<(u64, Vec<f64>)>> = std::thread::scope(|s| {
                let handles: Vec<_> = seeds
                    .chunks(instances.div_ceil(threads))
                    .map(|chunk| {
                        let algos = &algos;
                        let point = &point;
                        let opts = &opts;
                        let bar = bar.clone();
                        s.spawn(move || {
                            chunk
                                .iter()
                                .map(|&seed| {
                                    let params = LayeredDagParams {
                                        seed,
                                        ..point.params.clone()
                                    };
                                    let r = run_instance(&params, point.gpus, algos, opts)
                                        .map(|m| (seed, m));
                                    bar.inc(1);
                                    r
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| {
                        h.join().unwrap_or_else(|_| {
                            vec![Err(anyhow::anyhow!("a worker thread panicked"))]
                        })
                    })
                    .collect()
            });
            let mut per_algo: Vec<Vec<f64>> = vec![Vec::new(); algos.len()];
            let mut speedups: Vec<Vec<f64>> = vec![Vec::new(); algos.len()];
            for r in results {
                let (seed, makespans) = r?;
                let seq = makespans.first().copied().unwrap_or(f64::NAN);
                for (i, (&a, &m)) in algos.iter().zip(&makespans).enumerate() {
                    per_algo[i].push(m);
                    speedups[i].push(seq / m);
                    let p = &point.params;
                    let _ = writeln!(
                        csv,
                        "{},{},{},{},{},{},{},{},{},{:.6},{:.6}",
                        sweep.name,
                        point.x,
                        point.gpus,
                        p.ops,
                        p.edges,
                        p.layers,
                        p.transfer_ratio,
                        seed,
                        a,
                        m,
                        seq / m
                    );
                }
            }
            let mut line = format!("{:>8}  ", point.x);
            for i in 0..algos.len() {
                let (m, sd) = mean_std(&per_algo[i]);
                let (sp, _) = mean_std(&speedups[i]);
                means[i].push(m);
                let _ = write!(line, "{:>24}", format!("{m:.1}±{sd:.1} ({sp:.2}x)"));
            }
            let _ = writeln!(table, "{line}");
        }
        let xs: Vec<f64> = sweep.points.iter().map(|p| p.x).collect();
        let series: Vec<(String, Vec<f64>)> =
            algos.iter().map(|a| a.to_string()).zip(means).collect();
        let svg = plot::line_chart(
            &format!("HIOS simulation: {} sweep", sweep.name),
            sweep.x_label,
            "mean latency (ms)",
            &xs,
            &series,
        );
        let path = out.join(format!("hios-sim-{}.svg", sweep.name));
        opsched::io::write(&path, svg.as_bytes())?;
    }
    let csv_path = out.join("hios-sim.csv");
    bar.finish_and_clear();
    opsched::io::write(&csv_path, csv.as_bytes())?;
    println!("{table}");
    println!(
        "wrote {} and one SVG per sweep in {}",
        csv_path.display(),
        out.display()
    );
    Ok(())
}
