//! How exact is each algorithm? Replays request traces through every algorithm with
//! simulated time (no sleeping) and judges each decision against the exact sliding-window
//! rule: at most `L` accepted units in any window of length `W`, per key.
//!
//! ```text
//! cargo run --release -p tollgate-bench --example simulate -- --trace bursty --quota 100/min [--seed N] [--svg out.svg]
//! cargo run --release -p tollgate-bench --example simulate -- --all      # every trace: docs/accuracy.md and docs/img/*.svg
//! ```
//!
//! Traces: `poisson-below`, `poisson-above`, `boundary`, `bursty`, `heavy-tail` (see
//! `bench/simulate/sim.rs`). The table gives, per algorithm: the requests accepted,
//! the over-admitted ones (accepted although their trailing window then held more than
//! `L`), the wrongly refused ones (refused although the window had room), and the largest
//! number accepted in any `W`-long window, divided by `L`.

#[path = "simulate/plot.rs"]
mod plot;
#[path = "simulate/report.rs"]
mod report;
#[path = "simulate/sim.rs"]
mod sim;
#[path = "simulate/store.rs"]
mod store;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use tollgate::{Algorithm, Quota};

use report::Replayed;
use sim::{replay, BoxError, Run, Trace, TraceKind};
use store::Backend;

const USAGE: &str = "\
usage: simulate --trace NAME [--quota Q] [--seed N] [--requests N] [--svg PATH] [--store memory|redis]
       simulate --all [--quota Q] [--seed N] [--report PATH] [--img-dir DIR] [--store memory|redis]

  --trace NAME     poisson-below | poisson-above | boundary | bursty | heavy-tail
  --quota Q        the limit, e.g. 100/min, 10/s, 5/30s (default 100/min)
  --seed N         seed of the trace generator (default 1)
  --requests N     requests in the trace (default: 1,000,000; heavy-tail 2,000,000; boundary is always 4L)
  --svg PATH       also draw key 0's accepted requests in the trailing window, per algorithm
  --store S        memory (default) or redis (REDIS_URL; needs a build with redis support)
  --all            replay every trace, print the tables and regenerate the report and figures
  --report PATH    the markdown file whose generated blocks --all rewrites (default docs/accuracy.md)
  --img-dir DIR    where --all writes boundary.svg and bursty.svg (default docs/img)";

/// The largest trace the simulator builds (about 2 GB with the judge and the decisions).
const MAX_REQUESTS: u64 = 50_000_000;

/// The command line, parsed.
struct Options {
    trace: Option<TraceKind>,
    all: bool,
    quota: Quota,
    seed: u64,
    requests: Option<usize>,
    svg: Option<PathBuf>,
    backend: Backend,
    report: PathBuf,
    img_dir: PathBuf,
}

/// What the command line asks for.
enum Command {
    Run(Box<Options>),
    Help,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut o = Options {
        trace: None,
        all: false,
        quota: Quota::per_minute(100),
        seed: 1,
        requests: None,
        svg: None,
        backend: Backend::Memory,
        report: PathBuf::from("docs/accuracy.md"),
        img_dir: PathBuf::from("docs/img"),
    };
    let mut report_given = false;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let mut value = || inline.clone().or_else(|| args.next()).ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--all" => o.all = true,
            "--trace" => {
                let v = value()?;
                o.trace = Some(TraceKind::from_name(&v).ok_or_else(|| {
                    let names: Vec<&str> = TraceKind::ALL.iter().map(|k| k.name()).collect();
                    format!("unknown trace {v:?}: use one of {}", names.join(", "))
                })?);
            }
            "--quota" => o.quota = value()?.parse().map_err(|e| format!("--quota: {e}"))?,
            "--seed" => {
                let v = value()?;
                o.seed = v.parse().map_err(|_| format!("--seed {v:?}: expected a whole number"))?;
            }
            "--requests" => {
                let v = value()?;
                let n: usize = v.parse().map_err(|_| format!("--requests {v:?}: expected a whole number"))?;
                if n == 0 {
                    return Err("--requests 0: a trace needs at least one request".to_owned());
                }
                o.requests = Some(n);
            }
            "--svg" => o.svg = Some(PathBuf::from(value()?)),
            "--store" => o.backend = Backend::parse(&value()?)?,
            "--report" => {
                o.report = PathBuf::from(value()?);
                report_given = true;
            }
            "--img-dir" => {
                o.img_dir = PathBuf::from(value()?);
                report_given = true;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    match (o.trace, o.all) {
        (Some(_), true) => return Err("--trace and --all exclude each other".to_owned()),
        (None, false) => return Err("say which trace to replay (--trace NAME) or --all".to_owned()),
        _ => {}
    }
    if o.all && (o.svg.is_some() || o.requests.is_some()) {
        return Err("--svg and --requests go with --trace; --all uses the full traces and --img-dir".to_owned());
    }
    if !o.all && report_given {
        return Err("--report and --img-dir go with --all".to_owned());
    }
    let kinds = if o.all { TraceKind::ALL.to_vec() } else { o.trace.into_iter().collect() };
    for kind in kinds {
        let size = kind.size(o.quota, o.requests);
        if size > MAX_REQUESTS {
            return Err(format!(
                "the {} trace would hold {} requests at {}: at most {} fit in memory here{}",
                kind.name(),
                report::thousands(size),
                o.quota,
                report::thousands(MAX_REQUESTS),
                if kind == TraceKind::Boundary { " (it has 4L requests: use a smaller limit)" } else { "" },
            ));
        }
    }
    Ok(Command::Run(Box::new(o)))
}

fn main() -> ExitCode {
    let options = match parse_args(std::env::args().skip(1)) {
        Ok(Command::Run(o)) => o,
        Ok(Command::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("simulate: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = if options.all { run_all(&options) } else { run_one(&options) };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("simulate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How far the figures reach: until one period after the last request, at most 10
/// periods, in whole periods.
fn plot_span(trace: &Trace) -> u64 {
    let w = trace.quota.period_micros();
    (trace.duration() / w + 2).min(10) * w
}

/// Generates one trace and replays it through a fresh store per algorithm.
fn replay_trace(kind: TraceKind, o: &Options, requests: Option<usize>) -> Result<Replayed, BoxError> {
    let started = Instant::now();
    let trace = kind.generate(o.quota, o.seed, requests);
    let span = plot_span(&trace);
    let runs = Algorithm::ALL
        .into_iter()
        .map(|a| {
            let mut decider = o.backend.decider(a, trace.quota, trace.keys)?;
            replay(&trace, a, decider.as_mut(), span)
        })
        .collect::<Result<Vec<Run>, BoxError>>()?;
    eprintln!(
        "{}: {} decisions in {:.1} s ({} store)",
        kind.name(),
        report::thousands((trace.requests.len() * runs.len()) as u64),
        started.elapsed().as_secs_f64(),
        o.backend.name(),
    );
    Ok(Replayed { trace, runs })
}

fn run_one(o: &Options) -> Result<(), BoxError> {
    let kind = o.trace.ok_or("no trace")?;
    let r = replay_trace(kind, o, o.requests)?;
    let replayed = [r];
    println!("{}\n", report::figures_table(&replayed, o.backend.name()));
    println!("{}", report::leaky_delays(&replayed));
    if let Some(s) = report::heavy_tail_summary(&replayed) {
        println!("\n{s}");
    }
    if let Some(path) = &o.svg {
        let r = &replayed[0];
        plot::trailing_window_svg(path, &r.trace, &r.runs, plot_span(&r.trace))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn run_all(o: &Options) -> Result<(), BoxError> {
    let doc = std::fs::read_to_string(&o.report)
        .map_err(|e| format!("reading {}: {e} (it holds the prose around the generated blocks)", o.report.display()))?;
    let replayed = TraceKind::ALL.into_iter().map(|k| replay_trace(k, o, None)).collect::<Result<Vec<_>, _>>()?;
    let table = report::figures_table(&replayed, o.backend.name());
    println!("{table}\n");
    let leaky = report::leaky_delays(&replayed);
    println!("{leaky}\n");
    let heavy = report::heavy_tail_summary(&replayed).ok_or("no heavy-tail run")?;
    println!("{heavy}");
    // Keep the Redis row once it has been filled in from the Redis measurement.
    let redis_row = report::block(&doc, "memory")
        .and_then(|b| b.lines().find(|l| l.starts_with(report::REDIS_ROW) && !l.contains("pending")));
    let memory = report::memory_table(o.quota, redis_row);

    std::fs::create_dir_all(&o.img_dir).map_err(|e| format!("creating {}: {e}", o.img_dir.display()))?;
    for r in replayed.iter().filter(|r| matches!(r.trace.kind, TraceKind::Boundary | TraceKind::Bursty)) {
        let path = o.img_dir.join(format!("{}.svg", r.trace.kind.name()));
        plot::trailing_window_svg(&path, &r.trace, &r.runs, plot_span(&r.trace))?;
        eprintln!("wrote {}", path.display());
    }

    let mut doc = doc;
    for (name, content) in [("figures", &table), ("leaky", &leaky), ("heavy-tail", &heavy), ("memory", &memory)] {
        doc = report::replace_block(&doc, name, content).map_err(|e| format!("{}: {e}", o.report.display()))?;
    }
    write(&o.report, &doc)?;
    eprintln!("wrote {}", o.report.display());
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<(), BoxError> {
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()).into())
}
