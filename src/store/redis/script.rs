//! The Lua scripts, their arguments and their replies.
//!
//! A script returns the state it read; the pure functions of [`crate::algorithm`] decide
//! from it, so every store decides alike. The script's own verdict must agree, or the
//! check is an error.

use std::sync::LazyLock;

use redis::Value;

use super::keys;
use crate::algorithm::concurrency::Concurrency;
use crate::algorithm::fixed_window::FixedWindow;
use crate::algorithm::gcra::Gcra;
use crate::algorithm::leaky_bucket::LeakyBucket;
use crate::algorithm::sliding_window_counter::SlidingWindowCounter;
use crate::algorithm::sliding_window_log::Summary;
use crate::algorithm::token_bucket::TokenBucket;
use crate::algorithm::{Algorithm, MAX_COST};
use crate::error::StoreError;
use crate::store::Check;
use crate::store::{Outcome, Outcomes, Taken};

/// One script: its text (for `EVAL`) and its SHA1 (for `EVALSHA`).
pub(crate) struct Script {
    pub(crate) text: &'static str,
    pub(crate) sha: String,
}

impl Script {
    fn new(text: &'static str) -> Self {
        Self { text, sha: redis::Script::new(text).get_hash().to_owned() }
    }
}

/// A generic script: the shared library, the algorithms' `scripts/<alg>.lua` (all of them
/// when none is named; `gcra.lua` is the token bucket's too), then `scripts/<main>.lua`.
macro_rules! generic_script {
    ($main:literal) => {
        generic_script!($main: "fixed_window", "sliding_window_log", "sliding_window_counter", "leaky_bucket",
            "gcra", "concurrency")
    };
    ($main:literal: $($alg:literal),+) => {
        concat!(
            include_str!("scripts/floordiv.lua"),
            include_str!("scripts/lib.lua"),
            $(include_str!(concat!("scripts/", $alg, ".lua")),)+
            include_str!(concat!("scripts/", $main, ".lua"))
        )
    };
}

/// Every script, hashed once.
pub(crate) struct Scripts {
    single: [Script; 7],
    /// Group commit: one decision per key, each a single-rule check on its own.
    batch: [Script; 7],
    /// Any number of rules of any algorithms, all or nothing.
    pub(crate) multi: Script,
    /// Group commit of multi-checks: each decided all or nothing, as `multi` decides one.
    pub(crate) multi_batch: Script,
    /// The same for multi-checks of straight-line rules only, over the algorithms' own
    /// `decide` functions.
    pub(crate) multi_single: Script,
    /// `State::refund` for any number of rules of any algorithms.
    pub(crate) refund: Script,
    /// Renews permits of concurrency rules (issue 42).
    pub(crate) renew: Script,
    /// `refund` for permits only, straight-line: releases (issue 42).
    pub(crate) release: Script,
}

/// A straight-line script: the shared `now` prologue, what the algorithm's script builds on
/// (`tat_single.lua` for GCRA and its twin, the token bucket), `scripts/<alg>_single.lua`
/// (its `decide` function), then a main: `single_main.lua` (one rule) or `batch_main.lua`
/// (group commit: many single-rule decisions, see `batch.rs`).
macro_rules! single_script {
    ($alg:literal, $main:literal $(, $base:literal)?) => {
        concat!(
            include_str!("scripts/floordiv.lua"),
            include_str!("scripts/single_now.lua"),
            $(include_str!(concat!("scripts/", $base, "_single.lua")),)?
            include_str!(concat!("scripts/", $alg, "_single.lua")),
            include_str!(concat!("scripts/", $main, ".lua"))
        )
    };
}

/// The sliding window log's straight-line script: its functions sit on the shared library
/// (`lib.lua`, `sliding_window_log.lua`, as in the generic scripts), then the `now`
/// prologue, `sliding_window_log_single.lua` (its `decide`) and a main.
macro_rules! log_script {
    ($main:literal) => {
        concat!(
            include_str!("scripts/floordiv.lua"),
            include_str!("scripts/lib.lua"),
            include_str!("scripts/sliding_window_log.lua"),
            include_str!("scripts/single_now.lua"),
            include_str!("scripts/sliding_window_log_single.lua"),
            include_str!(concat!("scripts/", $main, ".lua"))
        )
    };
}

/// The straight-line multi-check batch script: the log's functions on the shared library
/// (as `log_script!`), the `now` prologue, then every algorithm's `decide` from its
/// `<alg>_single.lua`, each in a block of its own and kept in `DECIDE` by its tag, then
/// `scripts/multi_single_main.lua`.
macro_rules! multi_single_script {
    () => {
        concat!(
            include_str!("scripts/floordiv.lua"),
            include_str!("scripts/lib.lua"),
            include_str!("scripts/sliding_window_log.lua"),
            include_str!("scripts/single_now.lua"),
            "local DECIDE = {}\ndo\n",
            include_str!("scripts/fixed_window_single.lua"),
            "DECIDE.fw = decide\nend\ndo\n",
            include_str!("scripts/sliding_window_log_single.lua"),
            "DECIDE.swl = decide\nend\ndo\n",
            include_str!("scripts/sliding_window_counter_single.lua"),
            "DECIDE.swc = decide\nend\ndo\n",
            include_str!("scripts/tat_single.lua"),
            include_str!("scripts/token_bucket_single.lua"),
            "DECIDE.tb = decide\nend\ndo\n",
            include_str!("scripts/leaky_bucket_single.lua"),
            "DECIDE.lb = decide\nend\ndo\n",
            include_str!("scripts/tat_single.lua"),
            include_str!("scripts/gcra_single.lua"),
            "DECIDE.gcra = decide\nend\ndo\n",
            include_str!("scripts/concurrency_single.lua"),
            "DECIDE.conc = decide\nend\n",
            include_str!("scripts/multi_single_main.lua")
        )
    };
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    // One rule: a straight-line script per algorithm (`scripts/<alg>_single.lua`), with the
    // arguments, reply and writes of the generic one at about half its CPU inside Redis
    // (see docs/performance.md).
    single: [
        Script::new(single_script!("fixed_window", "single_main")),
        Script::new(log_script!("single_main")),
        Script::new(single_script!("sliding_window_counter", "single_main")),
        Script::new(single_script!("token_bucket", "single_main", "tat")),
        Script::new(single_script!("leaky_bucket", "single_main")),
        Script::new(single_script!("gcra", "single_main", "tat")),
        Script::new(single_script!("concurrency", "single_main")),
    ],
    batch: [
        Script::new(single_script!("fixed_window", "batch_main")),
        Script::new(log_script!("batch_main")),
        Script::new(single_script!("sliding_window_counter", "batch_main")),
        Script::new(single_script!("token_bucket", "batch_main", "tat")),
        Script::new(single_script!("leaky_bucket", "batch_main")),
        Script::new(single_script!("gcra", "batch_main", "tat")),
        Script::new(single_script!("concurrency", "batch_main")),
    ],
    multi: Script::new(generic_script!("check")),
    multi_batch: Script::new(generic_script!("multi_batch")),
    multi_single: Script::new(multi_single_script!()),
    refund: Script::new(generic_script!("refund")),
    renew: Script::new(generic_script!("renew")),
    release: Script::new(concat!(
        include_str!("scripts/floordiv.lua"),
        include_str!("scripts/single_now.lua"),
        include_str!("scripts/release_main.lua")
    )),
});

impl Scripts {
    /// The check script for these rules: the algorithm's own for one rule, else `multi`.
    pub(crate) fn check_for(&self, checks: &[&Check]) -> &Script {
        match checks {
            [one] if straight_line(one) => &self.single[index(one.algorithm)],
            _ => &self.multi,
        }
    }

    /// The batch script that can decide `check` together with others of its algorithm: a
    /// straight-line check (the log's decisions that leave the O(1) path answer
    /// [`Batched::Alone`]).
    pub(crate) fn batch_for(&self, check: &Check) -> Option<&Script> {
        straight_line(check).then(|| &self.batch[index(check.algorithm)])
    }
}

/// Whether the multi-check batch script (`scripts/multi_batch.lua`) decides `checks`
/// together with other multi-checks: two rules or more, none of which reads a block (a
/// block's key and its write stay with the generic script). Shadow rules and probes (cost
/// 0) are decided there as `check.lua` decides them.
pub(crate) fn multi_batchable(checks: &[Check]) -> bool {
    checks.len() > 1 && checks.iter().all(|c| !c.params.reads_block())
}

/// Whether every rule of the multi-check `checks` is straight-line: the straight-line
/// multi-check batch script (`scripts/multi_single_main.lua`) decides it.
pub(crate) fn multi_straight(checks: &[Check]) -> bool {
    checks.iter().all(straight_line)
}

/// Whether the straight-line scripts (`scripts/<alg>_single.lua`) decide `check`: they know
/// nothing of blocks, nor of probes (cost 0), which are decided and never written.
fn straight_line(check: &Check) -> bool {
    !check.params.reads_block() && check.params.cost > 0 && !check.params.shadow
}

/// The algorithm's place in [`Scripts`]' tables.
pub(crate) fn index(algorithm: Algorithm) -> usize {
    match algorithm {
        Algorithm::FixedWindow => 0,
        Algorithm::SlidingWindowLog => 1,
        Algorithm::SlidingWindowCounter => 2,
        Algorithm::TokenBucket => 3,
        Algorithm::LeakyBucket => 4,
        Algorithm::Gcra => 5,
        Algorithm::Concurrent => 6,
    }
}

/// Script mode: decide and commit when every rule accepts.
pub(crate) const MODE_CHECK: &str = "c";
/// Script mode: decide only, never write.
pub(crate) const MODE_PEEK: &str = "p";
/// Script mode: every rule takes its cost whatever it decides (charges).
pub(crate) const MODE_FORCE: &str = "f";
/// Script mode: each rule's block is set to end its block argument from now (lifted for
/// -1: `Limiter::block` with a zero duration).
pub(crate) const MODE_BLOCK: &str = "b";

/// Every number a script handles must stay exact in a Lua double.
const EXACT: u128 = 1 << 52;

/// Checks that Lua can compute `check`'s quota exactly ([`StoreError::Backend`] if not).
pub(crate) fn validate(check: &Check) -> Result<(), StoreError> {
    let q = &check.params.quota;
    let (w, b, t) = (q.period_micros(), q.burst_size(), q.emission_interval_micros());
    if u128::from(b + 1) * u128::from(t) > EXACT || u128::from(w) * 2 > EXACT {
        return Err(StoreError::Backend(format!(
            "rule {:?}: quota {q} with burst {b} spans more than 2^52 µs (burst × period / limit), \
             which Redis's Lua cannot compute exactly; lower the burst",
            check.rule
        )));
    }
    let p = &check.params;
    if p.ahead_us >= SLICE_ARG || p.after_us >= SLICE_ARG {
        return Err(StoreError::Backend(format!(
            "rule {:?}: a quota slice's ahead_us ({}) and after_us ({}) must each be below 2^26 µs (67 s)",
            check.rule, p.ahead_us, p.after_us
        )));
    }
    Ok(())
}

/// `verb` (`EVALSHA` or `EVAL`) of `script` (its SHA1 or text) over `checks`, written
/// straight into one command: `KEYS` are the rules' names under `prefix`, `ARGV` the time
/// (`now`, else empty for the server's `TIME`), the mode, and each rule's 7 arguments, then
/// its `at` when `ats` has one per check (refunds). Call [`validate`] on every check first.
pub(crate) fn script_cmd(
    verb: &str,
    script: &str,
    names: &keys::Names,
    checks: &[&Check],
    ats: &[u64],
    mode: &str,
    now: Option<u64>,
) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(5 + 10 * checks.len(), script.len() + 16 + 112 * checks.len());
    // A check of a rule that blocks (`Rule::block_for`) also declares its block's key,
    // after every state key, in the order of the checks; refunds never touch blocks.
    let blocking = |c: &&&Check| ats.is_empty() && c.params.reads_block();
    cmd.arg(verb).arg(script).arg(checks.len() + checks.iter().filter(blocking).count());
    for c in checks {
        cmd.arg(names.name(&c.rule, &c.key, c.algorithm));
    }
    for c in checks.iter().filter(blocking) {
        cmd.arg(names.block_name(&c.rule, &c.key));
    }
    match now {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    if (mode == MODE_CHECK || mode == MODE_PEEK) && checks.iter().any(|c| c.params.shadow) {
        // Each check's role after the mode: `e`nforced or `s`hadow (see check.lua).
        let roles: String = checks.iter().map(|c| if c.params.shadow { 's' } else { 'e' }).collect();
        cmd.arg(format!("{mode}{roles}"));
    } else {
        cmd.arg(mode);
    }
    for (i, c) in checks.iter().enumerate() {
        write_rule_args(&mut cmd, c);
        if let Some(at) = ats.get(i) {
            cmd.arg(at);
        }
    }
    cmd
}

/// `verb` of the batch script `script` over `checks`, one decision each (see
/// `scripts/batch_main.lua`): `KEYS` are the states' names, `ARGV` the time, the mode
/// (check), each decision's offset of its rule's arguments, then the arguments of each
/// distinct (algorithm, parameters) once. Call [`validate`] on every check first.
pub(crate) fn batch_cmd(
    verb: &str,
    script: &str,
    names: &keys::Names,
    checks: &[&Check],
    now: Option<u64>,
) -> redis::Cmd {
    let n = checks.len();
    let mut cmd = redis::Cmd::with_capacity(5 + 2 * n + 8, script.len() + 16 + 64 * n);
    cmd.arg(verb).arg(script).arg(n);
    for c in checks {
        cmd.arg(names.name(&c.rule, &c.key, c.algorithm));
    }
    match now {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    cmd.arg(MODE_CHECK);
    // Most decisions of a batch share their rule's arguments: each distinct set is sent
    // once (a short search; a batch of many distinct sets sends some twice, which is
    // only longer).
    let mut sets: smallvec::SmallVec<[&Check; 4]> = smallvec::SmallVec::new();
    for c in checks {
        let j = match sets.iter().take(16).position(|s| s.algorithm == c.algorithm && s.params == c.params) {
            Some(j) => j,
            None => {
                sets.push(c);
                sets.len() - 1
            }
        };
        cmd.arg(2 + n + 8 * j);
    }
    for s in &sets {
        write_rule_args(&mut cmd, s);
    }
    cmd
}

/// `verb` of the multi-check batch script over `lists` (see `scripts/multi_batch.lua`):
/// `KEYS` are every rule's state name, list after list; `ARGV` the time, the mode (check),
/// the number of lists, each list's length (and its rules' roles when one is a shadow
/// rule), each rule's offset of its arguments, then the arguments of each distinct
/// (algorithm, parameters) once. Call [`validate`] on every check first.
pub(crate) fn multi_batch_cmd(
    verb: &str,
    script: &str,
    names: &keys::Names,
    lists: &[&[Check]],
    now: Option<u64>,
) -> redis::Cmd {
    let m = lists.len();
    let r: usize = lists.iter().map(|l| l.len()).sum();
    let mut cmd = redis::Cmd::with_capacity(6 + m + 2 * r + 16, script.len() + 16 + 64 * r);
    cmd.arg(verb).arg(script).arg(r);
    for c in lists.iter().flat_map(|l| l.iter()) {
        cmd.arg(names.name(&c.rule, &c.key, c.algorithm));
    }
    match now {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    cmd.arg(MODE_CHECK).arg(m);
    for l in lists {
        if l.iter().any(|c| c.params.shadow) {
            let roles: String = l.iter().map(|c| if c.params.shadow { 's' } else { 'e' }).collect();
            cmd.arg(format!("{}{roles}", l.len()));
        } else {
            cmd.arg(l.len());
        }
    }
    // As in `batch_cmd`: each distinct set of arguments once (a short search).
    let mut sets: smallvec::SmallVec<[&Check; 4]> = smallvec::SmallVec::new();
    for c in lists.iter().flat_map(|l| l.iter()) {
        let j = match sets.iter().take(16).position(|s| s.algorithm == c.algorithm && s.params == c.params) {
            Some(j) => j,
            None => {
                sets.push(c);
                sets.len() - 1
            }
        };
        cmd.arg(3 + m + r + 8 * j);
    }
    for s in &sets {
        write_rule_args(&mut cmd, s);
    }
    cmd
}

/// Writes the 8 script arguments of one rule (see `scripts/lib.lua`) into `cmd`, numbers
/// straight into its buffer. Call [`validate`] first.
fn write_rule_args(cmd: &mut redis::Cmd, check: &Check) {
    let q = &check.params.quota;
    cmd.arg(check.algorithm.tag())
        .arg(q.limit())
        .arg(q.period_micros())
        .arg(q.burst_size())
        .arg(q.emission_interval_micros())
        .arg(check.params.cost.min(MAX_COST))
        .arg(seventh(&check.params, check.algorithm))
        .arg(block_arg(&check.params));
}

/// A rule's 7th argument: the leaky bucket's max delay; for GCRA and the token bucket, a
/// quota slice's reach past the burst and its first slot's least distance from now, as
/// `ahead + after·2^26` (each below 2^26 µs, 67 s; exact in Lua's doubles; the scripts
/// split it), 0 for a request's check.
fn seventh(p: &crate::algorithm::Params, algorithm: Algorithm) -> u64 {
    match algorithm {
        Algorithm::Gcra | Algorithm::TokenBucket => {
            p.ahead_us.min(SLICE_ARG - 1) + p.after_us.min(SLICE_ARG - 1) * SLICE_ARG
        }
        _ => p.max_delay_us.min(1 << 53),
    }
}

/// The base of [`seventh`]'s packing.
const SLICE_ARG: u64 = 1 << 26;

/// A rule's block argument: the block a rejection starts (µs), 0 for none, or -1 for a
/// rule that starts none but whose block is read (`Rule::blockable`).
fn block_arg(p: &crate::algorithm::Params) -> i64 {
    match (p.block_us, p.blockable) {
        (0, true) => -1,
        (us, _) => i64::try_from(us.min(1 << 52)).unwrap_or(i64::MAX),
    }
}

/// What a check script answered.
#[derive(Debug)]
pub(crate) struct Reply {
    /// Whether every rule accepted (and, in check mode, the script committed).
    pub(crate) all: bool,
    /// The outcomes, in the order of the rules.
    pub(crate) outcomes: Outcomes,
}

fn bad_reply(what: &str, v: &Value) -> StoreError {
    StoreError::Backend(format!("unexpected reply from the tollgate script ({what}): {v:?}"))
}

/// A number of a reply: every value a script returns is an integer in `0..=2^53`.
fn int(v: &Value) -> Result<u64, StoreError> {
    match v {
        Value::Int(i) => u64::try_from(*i)
            .ok()
            .filter(|&n| u128::from(n) <= 2 * EXACT)
            .ok_or_else(|| bad_reply("number out of range", v)),
        _ => Err(bad_reply("not an integer", v)),
    }
}

/// Decides from a check script's reply with the algorithms' pure functions, and checks
/// that the script's verdicts agree. When the script committed (`mode` is
/// [`MODE_CHECK`] and every rule accepted), each outcome says where its units went, as
/// the algorithm's `commit` would: the decision's time (a window's start when the clock
/// stepped back before it), the newest log entry's when the clock stepped back, the leaky
/// bucket's first slot, the TAT that GCRA's or the token bucket's commit left. A malformed reply, or a script that disagrees, is an error.
pub(crate) fn parse_check(reply: &Value, checks: &[&Check], mode: &str) -> Result<Reply, StoreError> {
    let Value::Array(items) = reply else {
        return Err(bad_reply("not an array", reply));
    };
    if items.len() != 2 + 5 * checks.len() {
        return Err(bad_reply("wrong length", reply));
    }
    let now = int(&items[0])?;
    let all = int(&items[1])? == 1;
    let committed = all && mode == MODE_CHECK;
    let mut outcomes = Outcomes::with_capacity(checks.len());
    for (check, fields) in checks.iter().zip(items[2..].chunks_exact(5)) {
        let read = Read {
            allowed: int(&fields[0])? == 1,
            fields: [int(&fields[1])?, int(&fields[2])?, int(&fields[3])?],
            blocked_until: int(&fields[4])?,
        };
        outcomes.push(Some(outcome(check, now, &read, committed)?));
    }
    let enforced = checks.iter().zip(&outcomes).filter(|(c, _)| !c.params.shadow);
    if all != enforced.filter_map(|(_, o)| o.as_ref()).all(|o| o.decision.allowed) {
        return Err(bad_reply("overall verdict does not match the rules'", reply));
    }
    Ok(Reply { all, outcomes })
}

/// What a script read and decided for one rule.
struct Read {
    allowed: bool,
    /// The state's three fields (see each algorithm's script).
    fields: [u64; 3],
    /// The end of the rule's block, 0 when none.
    blocked_until: u64,
}

/// The outcome of one rule from what the script read, decided by the algorithm's pure
/// function, which must agree with the script's verdict; `committed`: whether the script
/// wrote the rule's units.
fn outcome(check: &Check, now: u64, read: &Read, committed: bool) -> Result<Outcome, StoreError> {
    let [f1, f2, f3] = read.fields;
    let p = &check.params;
    let d = match check.algorithm {
        Algorithm::FixedWindow => FixedWindow { window: f1, count: f2, born: 0 }.decide(p, now),
        Algorithm::SlidingWindowLog => Summary { in_window: f1, kth: f2, newest: f3 }.decide(p, now),
        Algorithm::SlidingWindowCounter => {
            SlidingWindowCounter { window: f1, prev: f2, curr: f3, born: 0 }.decide(p, now)
        }
        Algorithm::TokenBucket => TokenBucket(Gcra { tat: f1 }).decide(p, now),
        Algorithm::LeakyBucket => LeakyBucket { next: f1 }.decide(p, now),
        Algorithm::Gcra => Gcra { tat: f1 }.decide(p, now),
        Algorithm::Concurrent => concurrency_read(f1, f2).decide(p, now),
    };
    let (d, _) = crate::algorithm::blocking(d, read.blocked_until, p, now);
    let d = d.at(now);
    if d.allowed != read.allowed {
        return Err(StoreError::Backend(format!(
            "redis script and algorithm disagree on rule {:?} ({}): the script {} at {now} µs \
             from state {f1}:{f2}:{f3}, the algorithm {}",
            check.rule,
            check.algorithm,
            if read.allowed { "accepted" } else { "rejected" },
            if d.allowed { "accepts" } else { "rejects" },
        )));
    }
    let taken = (committed && d.allowed && p.cost > 0).then(|| Taken {
        at: match check.algorithm {
            Algorithm::LeakyBucket => f1.max(now),
            Algorithm::SlidingWindowLog => f3.max(now),
            // The TAT the commit left (`Gcra::commit`): what a refund tests.
            Algorithm::TokenBucket | Algorithm::Gcra => Gcra { tat: f1 }.commit(p, now),
            Algorithm::FixedWindow => FixedWindow { window: f1, count: f2, born: 0 }.commit(p, now),
            Algorithm::SlidingWindowCounter => {
                SlidingWindowCounter { window: f1, prev: f2, curr: f3, born: 0 }.commit(p, now)
            }
            // The permit's id (`concurrency.lua`'s `conc_id`).
            Algorithm::Concurrent => f3.max(now),
        },
    });
    Ok(Outcome { decision: d, taken })
}

/// A concurrency state as the script read it: `used` permits held, and its median hold
/// time (0: none) as its one recorded hold.
fn concurrency_read(used: u64, median: u64) -> Concurrency {
    let mut s = Concurrency::default();
    if used > 0 {
        s.held.push(crate::algorithm::concurrency::Held { id: 0, units: used, since: 0 });
    }
    s.holds[0] = median;
    s
}

/// One decision's answer in a batch script's reply (a multi-check's: `T` its outcomes).
#[derive(Debug)]
pub(crate) enum Batched<T = Outcome> {
    /// Decided (and committed when it accepted), or failed on its own.
    Decided(Result<T, StoreError>),
    /// Neither decided nor written: deciding it would have left the O(1) path (the
    /// sliding window log's long expired prefix, or its k-th unit past the head), so it
    /// goes on its own (see `scripts/sliding_window_log_single.lua`).
    Alone,
}

/// The outcomes of a batch script's reply (see `scripts/batch_main.lua`), one per check,
/// each on its own: a decision the script failed is that decision's error only; a
/// malformed reply fails the whole batch.
pub(crate) fn parse_batch(reply: &Value, checks: &[&Check]) -> Result<Vec<Batched>, StoreError> {
    let Value::Array(items) = reply else {
        return Err(bad_reply("not an array", reply));
    };
    if items.len() != 1 + 4 * checks.len() {
        return Err(bad_reply("wrong length", reply));
    }
    let now = int(&items[0])?;
    let one = |check: &Check, fields: &[Value]| match int(&fields[0]) {
        Ok(verdict @ (0 | 1)) => Batched::Decided((|| {
            let read = Read {
                allowed: verdict == 1,
                fields: [int(&fields[1])?, int(&fields[2])?, int(&fields[3])?],
                blocked_until: 0,
            };
            // A check decided on its own commits when it accepts.
            outcome(check, now, &read, true)
        })()),
        Ok(3) if check.algorithm == Algorithm::SlidingWindowLog => Batched::Alone,
        _ => Batched::Decided(Err(StoreError::Backend(format!(
            "redis refused the check of rule {:?} ({}): {}",
            check.rule,
            check.algorithm,
            match &fields[1] {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                other => format!("{other:?}"),
            }
        )))),
    };
    Ok(checks.iter().zip(items[1..].chunks_exact(4)).map(|(c, f)| one(c, f)).collect())
}

/// The outcomes of a multi-check batch script's reply (see `scripts/multi_batch.lua`), one
/// list per multi-check, each on its own and checked as [`parse_check`] checks one call's:
/// a multi-check the script failed is that multi-check's error only; a malformed reply
/// fails the whole batch.
pub(crate) fn parse_multi_batch(reply: &Value, lists: &[&[Check]]) -> Result<Vec<Batched<Outcomes>>, StoreError> {
    let Value::Array(items) = reply else {
        return Err(bad_reply("not an array", reply));
    };
    if items.len() != 1 + lists.iter().map(|l| 1 + 4 * l.len()).sum::<usize>() {
        return Err(bad_reply("wrong length", reply));
    }
    let mut at = 1;
    let mut out = Vec::with_capacity(lists.len());
    for list in lists {
        let part = &items[at..at + 1 + 4 * list.len()];
        at += part.len();
        let checks: smallvec::SmallVec<[&Check; 2]> = list.iter().collect();
        out.push(match int(&part[0]) {
            Ok(0 | 1) => {
                // As one call of `check.lua` would have answered (no block is read).
                let mut one = Vec::with_capacity(2 + 5 * list.len());
                one.push(items[0].clone());
                one.push(part[0].clone());
                for fields in part[1..].chunks_exact(4) {
                    one.extend(fields.iter().cloned());
                    one.push(Value::Int(0));
                }
                Batched::Decided(parse_check(&Value::Array(one), &checks, MODE_CHECK).map(|r| r.outcomes))
            }
            Ok(3) => Batched::Alone,
            _ => Batched::Decided(Err(StoreError::Backend(format!(
                "redis refused the check of rules {:?}: {}",
                list.iter().map(|c| &c.rule).collect::<Vec<_>>(),
                match &part[1] {
                    Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    other => format!("{other:?}"),
                }
            )))),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generic scripts, now made by one macro, are byte for byte the texts spelled out
    /// before (so the SHA1s a server has cached, and `EVALSHA`, stay the same).
    #[test]
    fn the_generic_scripts_are_the_texts_spelled_out_before() {
        const LIB: &str = concat!(include_str!("scripts/floordiv.lua"), include_str!("scripts/lib.lua"));
        const ALL: &str = concat!(
            include_str!("scripts/fixed_window.lua"),
            include_str!("scripts/sliding_window_log.lua"),
            include_str!("scripts/sliding_window_counter.lua"),
            include_str!("scripts/leaky_bucket.lua"),
            include_str!("scripts/gcra.lua"),
            include_str!("scripts/concurrency.lua"),
        );
        let refund = format!("{LIB}{ALL}{}", include_str!("scripts/refund.lua"));
        let multi = format!("{LIB}{ALL}{}", include_str!("scripts/check.lua"));
        assert_eq!(SCRIPTS.refund.text, refund);
        assert_eq!(SCRIPTS.refund.sha, redis::Script::new(&refund).get_hash());
        assert_eq!(SCRIPTS.multi.text, multi);
    }
}
