// Included by loadtest.rs as its module `run::conc` (it uses the load test's own pieces).
//
// W1 with a concurrency rule (issue 42): W1's workload through the layer with a rate rule
// and a concurrency rule on the same key (`x-api-key`), 64 in flight, an instant handler,
// beside the same load with the rate rule alone, in the same run and on the same store.
//
// - Throughput of each, and their ratio (goal: ≥ 0.5×).
// - Store calls per decision, counted by a wrapper around the `RedisStore` (`Counted`):
//   to enter, `Store::check` (the multi-check of both rules) or `check_one` (the rate rule
//   alone); to leave, `Store::refund` of the permit. Goal: one each.
// - Redis script calls and the commands inside them per decision, for enter and leave
//   apart: `INFO commandstats` counts every script alike, so a separate pass of the same
//   load (shorter, not timed: `MONITOR` slows Redis) reads every call off the wire and
//   tells an enter (the multi-check batch script, or a check script when one went alone)
//   from a release (the refund script, named permits) and a renewal. Goal: one batched
//   call to enter, one batched call to leave (each well under 1 a decision).
// - Renewals apart: `Store::renew` calls in the timed run, against the bound of one per
//   server, per slot, per renewal period (`hold_limit / 3`; the rule's hold limit is 3 s
//   here so that a run of a few seconds sees several periods).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use futures_util::StreamExt;
use http::{HeaderValue, Request, Response};
use tollgate::key::{self, Key};
use tollgate::store::{Announced, Check, Outcome, Refund, Store};
use tollgate::{Algorithm, Decision, FailMode, Quota, RateLimitLayer, RedisStore, Rule, StoreError};
use tower::Layer;

use super::{drive, split_stats, Ctl, Error, Run, Shape, Target, ViaLayer, HEADER, IN_FLIGHT, RULE};

/// The concurrency rule's `n`: W1's keys are drawn from 10,000, so 64 in flight rarely
/// meet on one key; the rule decides every request all the same.
const CONC_N: u64 = 3;
/// The concurrency rule's hold limit: renewals every second.
const CONC_HOLD: Duration = Duration::from_secs(3);
const CONC_RULE: &str = "in-flight";

/// Store calls, by method.
#[derive(Default)]
pub(super) struct Counts {
    check_one: AtomicU64,
    check: AtomicU64,
    refund: AtomicU64,
    renew: AtomicU64,
    other: AtomicU64,
}

#[derive(Clone, Copy, Default)]
pub(super) struct Counted {
    check_one: u64,
    check: u64,
    refund: u64,
    renew: u64,
    other: u64,
}

impl Counts {
    fn take(&self) -> Counted {
        Counted {
            check_one: self.check_one.swap(0, Ordering::Relaxed),
            check: self.check.swap(0, Ordering::Relaxed),
            refund: self.refund.swap(0, Ordering::Relaxed),
            renew: self.renew.swap(0, Ordering::Relaxed),
            other: self.other.swap(0, Ordering::Relaxed),
        }
    }
}

/// A `RedisStore` that counts the calls made to it.
#[derive(Clone)]
struct Counting {
    store: RedisStore,
    counts: Arc<Counts>,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Store for Counting {
    async fn check_one(&self, check: &Check) -> Result<Outcome, StoreError> {
        bump(&self.counts.check_one);
        self.store.check_one(check).await
    }
    async fn check(&self, checks: &[Check]) -> Result<Vec<Option<Outcome>>, StoreError> {
        bump(&self.counts.check);
        self.store.check(checks).await
    }
    async fn refund(&self, refunds: &[Refund]) -> Result<(), StoreError> {
        bump(&self.counts.refund);
        self.store.refund(refunds).await
    }
    async fn charge(&self, charges: &[Check]) -> Result<(), StoreError> {
        bump(&self.counts.other);
        self.store.charge(charges).await
    }
    async fn peek(&self, check: &Check) -> Result<Decision, StoreError> {
        bump(&self.counts.other);
        self.store.peek(check).await
    }
    async fn renew(&self, permits: &[Refund]) -> Result<(), StoreError> {
        bump(&self.counts.renew);
        self.store.renew(permits).await
    }
    async fn reset(&self, rule: &str, key: &Key, algorithm: Algorithm) -> Result<(), StoreError> {
        bump(&self.counts.other);
        self.store.reset(rule, key, algorithm).await
    }
    async fn block(&self, check: &Check, duration: Duration) -> Result<(), StoreError> {
        bump(&self.counts.other);
        self.store.block(check, duration).await
    }
    fn identity(&self) -> Option<usize> {
        self.store.identity()
    }
    fn servers(&self) -> Option<u64> {
        self.store.servers()
    }
    fn announce(&self) -> Announced {
        self.store.announce()
    }
    fn real_clock(&self) -> bool {
        self.store.real_clock()
    }
    fn timed_out(&self, checks: &[Check], deadline: Duration) -> StoreError {
        self.store.timed_out(checks, deadline)
    }
}

/// The layer over an instant handler: the rate rule alone, or with the concurrency rule.
fn via(store: &Counting, names: &[String], algorithm: Algorithm, quota: Quota, conc: bool) -> Result<impl Target, Error> {
    let mut b = RateLimitLayer::builder(store.clone())
        .add_rule(Rule::new(RULE, quota, key::header(HEADER)).algorithm(algorithm))
        .fail_mode(FailMode::Closed);
    if conc {
        b = b.add_rule(Rule::concurrent(CONC_RULE, CONC_N, key::header(HEADER)).hold_limit(CONC_HOLD));
    }
    let layer = b.build()?;
    let inner = tower::service_fn(|_req: Request<Body>| async { Ok::<_, std::convert::Infallible>(Response::new(Body::empty())) });
    let keys = names.iter().map(|n| HeaderValue::from_str(n)).collect::<Result<Vec<_>, _>>()?;
    Ok(ViaLayer { svc: layer.layer(inner), keys: keys.into() })
}

/// One timed run: warm-up, an empty Redis, the measured sequence, then a moment for the
/// last releases (sent from tasks) to land before the counts are read.
async fn timed<T: Target>(
    ctl: &mut Ctl,
    target: &T,
    counts: &Counts,
    warm: &Arc<[u32]>,
    seq: &Arc<[u32]>,
) -> Result<(Run, Counted), Error> {
    let shape = Shape::of(IN_FLIGHT);
    drive(target, warm, shape).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    ctl.fresh().await?;
    counts.take();
    let cpu = ctl.cpu();
    let (elapsed, latencies, accepted, failed) = drive(target, seq, shape).await;
    let (client_cpu, redis_cpu) = ctl.cpu();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let counted = counts.take();
    let (calls, inside) = split_stats(&ctl.commandstats().await?);
    let reads = ctl.reads().await?;
    let run = Run {
        decisions: seq.len(),
        elapsed,
        latencies,
        accepted,
        failed,
        calls,
        inside,
        client_cpu: client_cpu.saturating_sub(cpu.0),
        redis_cpu: redis_cpu.saturating_sub(cpu.1),
        reads,
    };
    Ok((run, counted))
}

/// What the `MONITOR` pass read: script calls and the commands inside them, by kind.
#[derive(Default, Debug)]
pub(super) struct Wire {
    decisions: usize,
    accepted: usize,
    /// kind → (script calls, commands inside them).
    kinds: BTreeMap<&'static str, (u64, u64)>,
    /// kind → (script calls, µs in Redis, state keys) from `SLOWLOG` (every call logged),
    /// in a pass of its own.
    times: BTreeMap<&'static str, (u64, u64, u64)>,
}

/// The kind of a script call from its arguments (`EVALSHA sha numkeys keys… now mode …`):
/// the multi-check batch script has the count of its multi-checks after the mode; the
/// refund and renew scripts name permits (`conc`, 9 arguments each); any other is a check
/// script (an entry sent on its own). Releases and renewals share a shape: the renewals
/// are the calls whose SHA is not the one most calls of that shape have.
fn kind(args: &[String]) -> Option<(&'static str, String)> {
    let verb = args.first()?.to_ascii_lowercase();
    if verb != "evalsha" && verb != "eval" {
        return None;
    }
    let keys: usize = args.get(2)?.parse().ok()?;
    let after_mode = args.get(3 + keys + 2)?;
    let sha = args[1].clone();
    Some(if after_mode.parse::<u64>().is_ok() {
        ("enter, batched", sha)
    } else if after_mode == "conc" && args.len() == 3 + keys + 2 + 9 * keys {
        ("leave", sha)
    } else {
        ("enter, alone", sha)
    })
}

/// The same load as the timed run, `seq` of it, with every call read off the wire.
async fn on_the_wire<T: Target>(ctl: &mut Ctl, target: &T, warm: &Arc<[u32]>, seq: &Arc<[u32]>) -> Result<Wire, Error> {
    let shape = Shape::of(IN_FLIGHT);
    drive(target, warm, shape).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    ctl.fresh().await?;
    let mut seen = redis::Client::open(ctl.url.as_str())?.get_async_monitor().await?.into_on_message::<String>();
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let reader = tokio::spawn(async move {
        // (kind, sha) → (calls, commands inside).
        let mut by: BTreeMap<(&'static str, String), (u64, u64)> = BTreeMap::new();
        let mut last: Option<(&'static str, String)> = None;
        loop {
            tokio::select! {
                line = seen.next() => {
                    let Some(line) = line else { break };
                    if line.contains("[0 lua]") {
                        if let Some(k) = &last {
                            by.entry(k.clone()).or_default().1 += 1;
                        }
                        continue;
                    }
                    let args = super::monitor_args(&line);
                    last = kind(&args);
                    if let Some(k) = &last {
                        by.entry(k.clone()).or_default().0 += 1;
                    }
                }
                _ = &mut stop_rx => break,
            }
        }
        by
    });
    // The monitor is on before the load starts.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (_, _, accepted, _) = drive(target, seq, shape).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = stop_tx.send(());
    let by = reader.await?;
    // Then the same load again, without the monitor (which costs Redis a write per command
    // to its client), with a slow log of every call: the time each takes inside Redis.
    ctl.fresh().await?;
    ctl.cmd::<()>(&["CONFIG", "SET", "slowlog-max-len", "1000000"]).await?;
    ctl.cmd::<()>(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]).await?;
    ctl.cmd::<()>(&["SLOWLOG", "RESET"]).await?;
    drive(target, seq, shape).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    ctl.cmd::<()>(&["CONFIG", "SET", "slowlog-log-slower-than", "10000"]).await?;
    // (sha, µs, state keys) of every script call.
    let mut slow: Vec<(String, u64, u64)> = Vec::new();
    if let redis::Value::Array(entries) = ctl.cmd::<redis::Value>(&["SLOWLOG", "GET", "-1"]).await? {
        for e in entries {
            let redis::Value::Array(f) = e else { continue };
            let (Some(us), Some(args)) = (f.get(2), f.get(3)) else { continue };
            let us: u64 = redis::from_redis_value(us.clone()).unwrap_or(0);
            let args: Vec<String> = redis::from_redis_value(args.clone()).unwrap_or_default();
            if args.first().is_some_and(|a| a.eq_ignore_ascii_case("evalsha")) && args.len() > 2 {
                slow.push((args[1].clone(), us, args[2].parse().unwrap_or(0)));
            }
        }
    }
    ctl.cmd::<()>(&["SLOWLOG", "RESET"]).await?;
    // Of the release-shaped calls, the SHA with the most is the refund script's.
    let refund_sha = by.iter().filter(|((k, _), _)| *k == "leave").max_by_key(|(_, (n, _))| *n).map(|((_, s), _)| s.clone());
    let mut wire = Wire { decisions: seq.len(), accepted, kinds: BTreeMap::new(), times: BTreeMap::new() };
    let mut kind_of: BTreeMap<String, &'static str> = BTreeMap::new();
    for ((k, sha), (calls, inside)) in by {
        let k = if k == "leave" && Some(&sha) != refund_sha.as_ref() { "renew" } else { k };
        // A SHA of two kinds (a batch script whose entry also went alone) counts as enter.
        kind_of.entry(sha).or_insert(k);
        let e = wire.kinds.entry(k).or_default();
        e.0 += calls;
        e.1 += inside;
    }
    for (sha, us, keys) in slow {
        let Some(&k) = kind_of.get(&sha) else { continue };
        let e = wire.times.entry(k).or_default();
        e.0 += 1;
        e.1 += us;
        e.2 += keys;
    }
    Ok(wire)
}

/// One repetition: the rate rule alone, then with the concurrency rule.
pub(super) struct ConcRow {
    pub(super) alone: Run,
    pub(super) alone_counts: Counted,
    pub(super) both: Run,
    pub(super) both_counts: Counted,
}

pub(super) struct Conc {
    pub(super) algorithm: Algorithm,
    pub(super) rows: Vec<ConcRow>,
    pub(super) wire: Wire,
}

/// Runs the W1 concurrency figure `reps` times (and the `MONITOR` pass once).
#[allow(clippy::too_many_arguments)]
pub(super) async fn run(
    ctl: &mut Ctl,
    url: &str,
    names: &[String],
    algorithm: Algorithm,
    quota: Quota,
    warm: &Arc<[u32]>,
    seq: &Arc<[u32]>,
    reps: usize,
) -> Result<Conc, Error> {
    let counts = Arc::new(Counts::default());
    let store = Counting { store: RedisStore::from_url(url)?, counts: counts.clone() };
    store.store.ping().await?;
    let mut rows = Vec::new();
    for rep in 0..reps {
        // One layer at a time: a rule name is one live limiter's on a store.
        let (alone, alone_counts) = {
            let layer = via(&store, names, algorithm, quota, false)?;
            timed(ctl, &layer, &counts, warm, seq).await?
        };
        let (both, both_counts) = {
            let layer = via(&store, names, algorithm, quota, true)?;
            timed(ctl, &layer, &counts, warm, seq).await?
        };
        eprintln!(
            "  W1 + concurrency, run {}: rate rule alone {:.0}/s, with the concurrency rule {:.0}/s ({:.2}×)",
            rep + 1,
            alone.rate(),
            both.rate(),
            both.rate() / alone.rate()
        );
        rows.push(ConcRow { alone, alone_counts, both, both_counts });
    }
    let both = via(&store, names, algorithm, quota, true)?;
    let short: Arc<[u32]> = seq[..seq.len().min(5_000)].into();
    let wire = on_the_wire(ctl, &both, warm, &short).await?;
    Ok(Conc { algorithm, rows, wire })
}

#[allow(clippy::cast_precision_loss)]
fn per(n: u64, d: usize) -> f64 {
    n as f64 / d.max(1) as f64
}

fn min_med_max(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

/// The section of the report, and its targets (name, value, pass).
pub(super) fn report(c: &Conc, s: &mut String) -> Vec<(String, String, bool)> {
    let alg = c.algorithm.name();
    let n = c.rows[0].both.decisions;
    let _ = writeln!(
        s,
        "\n### W1 with a concurrency rule: rate rule ({alg}) + `Rule::concurrent` (n = {CONC_N}, hold limit {} s) on \
         the same key, {IN_FLIGHT} in flight, instant handler, {n} decisions, {} runs\n",
        CONC_HOLD.as_secs(),
        c.rows.len()
    );
    let _ = writeln!(
        s,
        "| run | rate rule alone /s | rate + concurrency /s | ratio | p99 µs alone | p99 µs both | alone: store calls / \
         decision | enter: store calls / decision | leave: store calls / admitted | renewals (store calls) | EVALSHA / decision, alone | EVALSHA / \
         decision, both | commands in scripts / decision, both | client CPU µs / decision, alone → both | Redis \
         CPU µs / decision, alone → both | errors |"
    );
    let _ = writeln!(s, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for (i, r) in c.rows.iter().enumerate() {
        let b = &r.both_counts;
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {:.3} | {:.3} | {:.2} | {:.1} → {:.1} | {:.1} → {:.1} | {} |",
            i + 1,
            r.alone.rate(),
            r.both.rate(),
            r.both.rate() / r.alone.rate(),
            r.alone.quantile_us(0.99),
            r.both.quantile_us(0.99),
            per(r.alone_counts.check + r.alone_counts.check_one + r.alone_counts.refund, r.alone.decisions),
            per(b.check + b.check_one, r.both.decisions),
            per(b.refund, r.both.accepted),
            b.renew,
            r.alone.per_decision(r.alone.calls),
            r.both.per_decision(r.both.calls),
            r.both.per_decision(r.both.inside),
            r.alone.cpu_us().0,
            r.both.cpu_us().0,
            r.alone.cpu_us().1,
            r.both.cpu_us().1,
            r.alone.failed + r.both.failed,
        );
    }
    let ratios = min_med_max(c.rows.iter().map(|r| r.both.rate() / r.alone.rate()).collect());
    let alone = min_med_max(c.rows.iter().map(|r| r.alone.rate()).collect());
    let both = min_med_max(c.rows.iter().map(|r| r.both.rate()).collect());
    let _ = writeln!(
        s,
        "\nmin–median–max: rate rule alone {:.0}–{:.0}–{:.0}/s; with the concurrency rule {:.0}–{:.0}–{:.0}/s; ratio \
         {:.2}–{:.2}–{:.2}×.",
        alone.0, alone.1, alone.2, both.0, both.1, both.2, ratios.0, ratios.1, ratios.2
    );
    let w = &c.wire;
    let _ = writeln!(
        s,
        "\nOn the wire (`MONITOR`, a separate pass of {} decisions, {} admitted; not timed):\n\n| calls | script calls | \
         per decision | per admitted | commands inside / call | commands inside / decision |\n|---|--:|--:|--:|--:|--:|",
        w.decisions, w.accepted
    );
    for (k, (calls, inside)) in &w.kinds {
        let _ = writeln!(
            s,
            "| {k} | {calls} | {:.3} | {:.3} | {:.1} | {:.2} |",
            per(*calls, w.decisions),
            per(*calls, w.accepted),
            per(*inside, usize::try_from(*calls).unwrap_or(1)),
            per(*inside, w.decisions)
        );
    }
    let _ = writeln!(
        s,
        "\nTime inside Redis per script call (`SLOWLOG` of every call, in a third pass of the same load without `MONITOR`):\n\n| calls | logged calls | µs / \
         call | state keys / call | µs / state key |\n|---|--:|--:|--:|--:|"
    );
    for (k, (calls, us, keys)) in &w.times {
        let _ = writeln!(
            s,
            "| {k} | {calls} | {:.0} | {:.1} | {:.1} |",
            per(*us, usize::try_from(*calls).unwrap_or(1)),
            per(*keys, usize::try_from(*calls).unwrap_or(1)),
            per(*us, usize::try_from(*keys).unwrap_or(1))
        );
    }
    let mut t = Vec::new();
    t.push((
        format!("W1 + concurrency ({alg}): throughput ≥ 0.5× the rate rule alone (median of {})", c.rows.len()),
        format!("{:.2}× (min {:.2}×)", ratios.1, ratios.0),
        ratios.1 >= 0.5,
    ));
    let enter = c
        .rows
        .iter()
        .all(|r| r.both_counts.check + r.both_counts.check_one == r.both.decisions as u64 && r.both_counts.other == 0);
    let leave = c.rows.iter().all(|r| r.both_counts.refund == r.both.accepted as u64);
    t.push(("W1 + concurrency: one store call to enter, one to leave".to_owned(), format!("enter {enter}, leave {leave}"), enter && leave));
    let batched_enter = w.kinds.get("enter, batched").map_or(0, |k| k.0);
    let alone_enter = w.kinds.get("enter, alone").map_or(0, |k| k.0);
    let leave_calls = w.kinds.get("leave").map_or(0, |k| k.0);
    let batched = per(batched_enter + alone_enter, w.decisions) < 1.0 && per(leave_calls, w.accepted) < 1.0;
    t.push((
        "W1 + concurrency: enters and leaves batched (fewer script calls than decisions)".to_owned(),
        format!(
            "enter {:.3} calls / decision ({alone_enter} alone), leave {:.3} / admitted",
            per(batched_enter + alone_enter, w.decisions),
            per(leave_calls, w.accepted)
        ),
        batched,
    ));
    let renew_ok = c.rows.iter().all(|r| {
        let periods = r.both.elapsed.as_secs_f64() / (CONC_HOLD.as_secs_f64() / 3.0);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let most = periods.ceil() as u64 + 1;
        r.both_counts.renew <= most
    });
    t.push((
        "W1 + concurrency: renewals ≤ one call per server, per slot, per renewal period".to_owned(),
        c.rows
            .iter()
            .map(|r| format!("{} in {:.1} s", r.both_counts.renew, r.both.elapsed.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", "),
        renew_ok,
    ));
    t
}
