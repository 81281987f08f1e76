//! Markdown output: the figures table, the memory table, and the generated blocks of
//! `docs/accuracy.md` (or of any file that has the same markers).

use std::fmt::Write as _;

use tollgate::store::Params;
use tollgate::{Algorithm, Quota};

use super::sim::{Figures, Run, Trace, TraceKind};

/// One trace and the runs of every algorithm over it.
pub(crate) struct Replayed {
    /// The trace.
    pub(crate) trace: Trace,
    /// One run per algorithm, in [`Algorithm::ALL`] order.
    pub(crate) runs: Vec<Run>,
}

/// `1234567` → `1,234,567`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A percentage with three significant digits (`0.00312%`), or `0` when it is exactly 0.
pub(crate) fn percent(p: f64) -> String {
    if p == 0.0 {
        return "0".to_owned();
    }
    let decimals = (2.0 - p.log10().floor()).clamp(0.0, 8.0) as usize;
    format!("{p:.decimals$}%")
}

/// `+1.23%`, `−0.04%`, `0`.
fn signed_percent(p: f64) -> String {
    if p == 0.0 {
        "0".to_owned()
    } else if p > 0.0 {
        format!("+{}", percent(p))
    } else {
        format!("−{}", percent(-p))
    }
}

/// `count (percent)`.
fn count_and_percent(f: &Figures, count: u64) -> String {
    if count == 0 {
        "0".to_owned()
    } else {
        format!("{} ({})", thousands(count), percent(f.percent(count)))
    }
}

/// Seconds with a sensible precision: `0.6 s`, `9.6 s`, `10 s`, `36 s`.
fn seconds(us: u64) -> String {
    let tenths = (us as f64 / 1e5).round();
    if tenths >= 100.0 || tenths % 10.0 == 0.0 {
        format!("{:.0} s", tenths / 10.0)
    } else {
        format!("{:.1} s", tenths / 10.0)
    }
}

/// `1 request`, `17 requests`.
fn requests(n: u64) -> String {
    if n == 1 {
        "1 request".to_owned()
    } else {
        format!("{} requests", thousands(n))
    }
}

/// `12,510` or `3.0`.
fn periods(p: f64) -> String {
    if p >= 100.0 {
        thousands(p.round() as u64)
    } else {
        format!("{p:.1}")
    }
}

/// The heavy-tail trace's shape: the hottest source's share of the requests and its rate
/// in limits, and the median requests per source.
fn heavy_tail_shape(trace: &Trace) -> String {
    let mut per_key = vec![0u64; trace.keys as usize];
    for r in &trace.requests {
        per_key[r.key as usize] += 1;
    }
    let n = trace.requests.len() as f64;
    let windows = trace.duration() as f64 / trace.quota.period_micros() as f64;
    let hottest = per_key.iter().copied().max().unwrap_or(0) as f64;
    per_key.sort_unstable();
    let median = per_key.get(per_key.len() / 2).copied().unwrap_or(0);
    format!(
        "the hottest source sends {} of the requests ({:.0}× the limit), the median source {median}",
        percent(100.0 * hottest / n),
        hottest / windows.max(1.0) / trace.quota.limit() as f64,
    )
}

/// One line describing a trace.
pub(crate) fn describe(trace: &Trace) -> String {
    let span = trace.duration() as f64 / trace.quota.period_micros() as f64;
    let keys = if trace.keys == 1 { "1 key".to_owned() } else { format!("{} keys", thousands(u64::from(trace.keys))) };
    let what = match trace.kind {
        TraceKind::PoissonBelow => "Poisson arrivals at 80% of the limit".to_owned(),
        TraceKind::PoissonAbove => "Poisson arrivals at 150% of the limit".to_owned(),
        TraceKind::Boundary => format!(
            "the seed example scaled to L (one request at 0.4 W, L − 1 over 0.7–0.8 W, L over 1.4–1.6 W; at \
             3/min exactly \"0.4, 0.7, 0.8 and 1.4, 1.5, 1.6 minutes\"), then L = {} requests in the last 1% \
             before the boundary at 3 W and L in the first 1% after it",
            trace.quota.limit()
        ),
        TraceKind::Bursty => {
            "bursts at 5× the limit lasting 0.2 W on average, separated by silences of 1 W on average (mean rate \
             ≈ 0.83× the limit)"
                .to_owned()
        }
        TraceKind::HeavyTail => format!(
            "Poisson arrivals, each from a source drawn with Zipf popularity (exponent 1.1): {}",
            heavy_tail_shape(trace)
        ),
    };
    format!(
        "`{}` — {} requests from {keys} over {} periods: {what}.",
        trace.kind.name(),
        thousands(trace.requests.len() as u64),
        periods(span),
    )
}

/// The figures table, one row per (trace, algorithm), with one bullet per trace above it.
pub(crate) fn figures_table(replayed: &[Replayed], store: &str) -> String {
    let mut out = String::new();
    for r in replayed {
        let _ = writeln!(out, "- {}", describe(&r.trace));
    }
    let quota = replayed.first().map(|r| r.trace.quota);
    let _ = writeln!(
        out,
        "\n| trace | algorithm | accepted | vs. log | over-admitted | wrongly refused | worst window ÷ L |\n\
         |---|---|---:|---:|---:|---:|---:|"
    );
    for r in replayed {
        let l = r.trace.quota.limit() as f64;
        let exact =
            r.runs.iter().find(|run| run.algorithm == Algorithm::SlidingWindowLog).map(|run| run.figures.accepted);
        for run in &r.runs {
            let f = &run.figures;
            let versus = match exact {
                Some(e) if run.algorithm != Algorithm::SlidingWindowLog && e > 0 => {
                    signed_percent(100.0 * (f.accepted as f64 - e as f64) / e as f64)
                }
                _ => "—".to_owned(),
            };
            let _ = writeln!(
                out,
                "| {} | `{}` | {} | {versus} | {} | {} | {:.2} |",
                r.trace.kind.name(),
                run.algorithm.name(),
                thousands(f.accepted),
                count_and_percent(f, f.over_admitted),
                count_and_percent(f, f.wrongly_refused),
                f.worst_window as f64 / l,
            );
        }
    }
    let _ = writeln!(out, "\n{}", same_decisions(replayed, Algorithm::TokenBucket, Algorithm::Gcra));
    if let Some(q) = quota {
        let _ = write!(
            out,
            "\nQuota {q} (`B = L`, leaky bucket `max_delay` {}), seed {}, {store} store. Percentages are of all \
             requests of the trace.",
            seconds(Params::new(q).max_delay_us),
            replayed.first().map_or(0, |r| r.trace.seed),
        );
    }
    out
}

/// Whether two algorithms decided every request of every trace alike.
pub(crate) fn same_decisions(replayed: &[Replayed], a: Algorithm, b: Algorithm) -> String {
    fn allowed(r: &Replayed, algorithm: Algorithm) -> Option<&[bool]> {
        r.runs.iter().find(|run| run.algorithm == algorithm).map(|run| run.allowed.as_slice())
    }
    let differ: Vec<String> = replayed
        .iter()
        .filter_map(|r| {
            let (x, y) = (allowed(r, a)?, allowed(r, b)?);
            let n = x.iter().zip(y).filter(|(x, y)| x != y).count();
            (n > 0).then(|| format!("{} on {}", thousands(n as u64), r.trace.kind.name()))
        })
        .collect();
    if differ.is_empty() {
        format!("`{a}` and `{b}` made the same decision on every request above.")
    } else {
        format!("`{a}` and `{b}` decided differently: {} requests.", differ.join(", "))
    }
}

/// The leaky bucket's queue and its delays on each trace.
pub(crate) fn leaky_delays(replayed: &[Replayed]) -> String {
    let parts: Vec<String> = replayed
        .iter()
        .filter_map(|r| {
            let run = r.runs.iter().find(|run| run.algorithm == Algorithm::LeakyBucket)?;
            let f = &run.figures;
            let mean = f.total_delay_us.checked_div(f.accepted).unwrap_or(0);
            Some(format!("{} {} / {}", r.trace.kind.name(), seconds(mean), seconds(f.max_delay_us)))
        })
        .collect();
    let mut out = String::new();
    if let Some(r) = replayed.first() {
        let p = Params::new(r.trace.quota);
        let t = p.quota.emission_interval_micros();
        let waiting = p.quota.burst_size().min(p.max_delay_us / t);
        let b = p.quota.burst_size();
        let why = if waiting < b {
            format!("with `max_delay` {}, although `B = {b}` would let {b} wait", seconds(p.max_delay_us))
        } else {
            format!("`B = {b}`")
        };
        let _ = write!(
            out,
            "Leaky bucket at {}: one slot every {}; at most {} can be in the bucket at once (the one leaving and \
             {waiting} waiting): {why}. ",
            p.quota,
            seconds(t),
            requests(waiting + 1),
        );
    }
    let _ = write!(out, "Delay of forwarded requests, mean / max: {}.", parts.join("; "));
    out
}

/// The heavy-tail trace per source, and the sliding window counter next to Cloudflare's
/// figure.
pub(crate) fn heavy_tail_summary(replayed: &[Replayed]) -> Option<String> {
    let r = replayed.iter().find(|r| r.trace.kind == TraceKind::HeavyTail)?;
    let swc = &r.runs.iter().find(|run| run.algorithm == Algorithm::SlidingWindowCounter)?.figures;
    let mut out = String::from(
        "| algorithm | requests decided wrongly | sources limited although within the limit | sources over the \
         limit never limited |\n|---|---:|---:|---:|\n",
    );
    for run in &r.runs {
        let f = &run.figures;
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            run.algorithm.name(),
            count_and_percent(f, f.over_admitted + f.wrongly_refused),
            thousands(f.sources_limited_within),
            thousands(f.sources_unlimited_above),
        );
    }
    let _ = write!(
        out,
        "\nOn the heavy-tail trace ({} requests from {} sources, quota {}), the sliding window counter decided {} \
         of the requests wrongly ({} over-admitted, {} wrongly refused), limited {} of the {} sources that never \
         sent more than L in a window, and left {} of the {} that did unlimited. Cloudflare reports 0.003% of \
         requests wrongly allowed or limited for its sliding window counter, on 400 million requests from 270,000 \
         sources of its own traffic. The data differ: ours are synthetic Poisson sources with Zipf popularity, and \
         {} of the requests come from the {} sources above the limit, where the counter keeps deciding at the edge \
         of its estimate ({} of its wrong refusals came when the window had room for exactly one more); \
         Cloudflare's are real clients, limited as a whole once they cross the threshold.",
        thousands(swc.requests),
        thousands(u64::from(r.trace.keys)),
        r.trace.quota,
        percent(swc.percent(swc.over_admitted + swc.wrongly_refused)),
        thousands(swc.over_admitted),
        thousands(swc.wrongly_refused),
        thousands(swc.sources_limited_within),
        thousands(swc.sources - swc.sources_above),
        thousands(swc.sources_unlimited_above),
        thousands(swc.sources_above),
        percent(swc.percent(swc.requests_from_above)),
        thousands(swc.sources_above),
        percent(if swc.wrongly_refused == 0 { 0.0 } else { 100.0 * swc.near_ties as f64 / swc.wrongly_refused as f64 }),
    );
    Some(out)
}

/// The row of the memory table filled by hand from the Redis measurement.
pub(crate) const REDIS_ROW: &str = "| Redis (`MEMORY USAGE` of the key) |";

/// What one (rule, key) costs in memory, per algorithm, beyond its fixed-size state. The
/// Redis row is measured elsewhere: `redis_row` keeps the one
/// already in the document, else a placeholder is written.
pub(crate) fn memory_table(quota: Quota, redis_row: Option<&str>) -> String {
    // Run-length encoded `(µs, units)` pairs; a VecDeque may hold up to twice what it uses.
    let log_entry = size_of::<(u64, u64)>();
    let l = quota.limit() as usize;
    let mut out = String::from("| | ");
    out += &Algorithm::ALL.map(|a| format!("`{}`", a.name())).join(" | ");
    out += " |\n|---|";
    out += &"---:|".repeat(Algorithm::ALL.len());
    out += "\n| heap per key | ";
    out += &Algorithm::ALL
        .map(|a| match a {
            Algorithm::SlidingWindowLog => format!(
                "{log_entry} B per accepted µs in the window: ≤ {} B at {quota}",
                thousands((log_entry * l.next_power_of_two()) as u64)
            ),
            _ => "0".to_owned(),
        })
        .join(" | ");
    out += " |\n";
    match redis_row {
        Some(row) => out += row,
        None => {
            out += REDIS_ROW;
            out += &[" _(measurement pending)_ |"].repeat(Algorithm::ALL.len()).concat();
        }
    }
    out
}

/// The text between the markers of block `name` in `doc`, if any.
pub(crate) fn block<'a>(doc: &'a str, name: &str) -> Option<&'a str> {
    let begin = format!("<!-- BEGIN simulate:{name} -->");
    let end = format!("<!-- END simulate:{name} -->");
    let start = doc.find(&begin)? + begin.len();
    let stop = doc[start..].find(&end)? + start;
    Some(&doc[start..stop])
}

/// Replaces the text between `<!-- BEGIN simulate:NAME -->` and `<!-- END simulate:NAME -->`
/// in `doc` by `content`.
///
/// # Errors
///
/// When a marker is missing.
pub(crate) fn replace_block(doc: &str, name: &str, content: &str) -> Result<String, String> {
    let begin = format!("<!-- BEGIN simulate:{name} -->");
    let end = format!("<!-- END simulate:{name} -->");
    let start = doc.find(&begin).ok_or_else(|| format!("no `{begin}` marker"))? + begin.len();
    let stop = doc[start..].find(&end).ok_or_else(|| format!("no `{end}` marker after `{begin}`"))? + start;
    Ok(format!("{}\n{}\n{}", &doc[..start], content.trim_end(), &doc[stop..]))
}
