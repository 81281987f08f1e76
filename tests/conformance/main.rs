//! One table of scenarios run against every store — `MemoryStore`, Redis standalone and a
//! real 3-node Redis Cluster — with time under the test's control: every store must give
//! the identical sequence of decisions, and no store call may fail (a broken script,
//! `CROSSSLOT` or `WRONGTYPE` is a failure here, never "allowed").
//!
//! Then, per algorithm, the Redis scripts on the server's own `TIME`.
#![cfg(feature = "redis")]

#[path = "../support/mod.rs"]
mod support;

use std::fmt::Write as _;
use std::time::Duration;

use support::fake::sliding_log_refund_example;
use support::redis::{RedisCluster, RedisServer};
use tollgate::clock::{Clock, ManualClock};
use tollgate::key::Key;
use tollgate::store::Params;
use tollgate::store::{Check, Store};
use tollgate::store::{Outcome as StoreOutcome, Refund};
use tollgate::{Algorithm, Decision, MemoryStore, Quota, RedisStore};

/// 2023-11-14T22:13:20Z, in µs.
const T0: u64 = 1_700_000_000_000_000;
const MS: u64 = 1_000;
const SEC: u64 = 1_000_000;
const MIN: u64 = 60 * SEC;
/// Generous: a slow CI machine must not turn into a store error.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
struct Rule {
    name: &'static str,
    key: &'static str,
    algorithm: Algorithm,
    quota: Quota,
    max_delay_us: Option<u64>,
    /// `Rule::block_for`, in µs.
    block_us: u64,
    /// `Rule::blockable`: the key can be blocked by hand (`Step::Block`).
    blockable: bool,
    /// The check's role: `Rule::shadow` (decided in the same call, never refuses it,
    /// committed only when every enforced check passes).
    shadow: bool,
}

fn rule(name: &'static str, key: &'static str, algorithm: Algorithm, quota: Quota) -> Rule {
    Rule { name, key, algorithm, quota, max_delay_us: None, block_us: 0, blockable: false, shadow: false }
}

fn shadow(name: &'static str, key: &'static str, algorithm: Algorithm, quota: Quota) -> Rule {
    Rule { shadow: true, ..rule(name, key, algorithm, quota) }
}

#[derive(Debug, Clone)]
enum Step {
    /// One request checked against these (rule index, cost).
    Check(Vec<(usize, u64)>),
    /// Refund what the `k`-th most recent check took (1: the last one), by the
    /// identities this store returned for it: nothing when it took nothing.
    Undo(usize),
    Peek(usize, u64),
    Reset(usize),
    Advance(u64),
    /// The clock steps back (NTP, a Redis failover to a server whose clock is behind).
    Back(u64),
    /// A charge reported after the work (`Store::charge`): (rule index, units), taken
    /// whatever the rule decides.
    Charge(usize, u64),
    /// A block by hand (`Store::block`): (rule index, µs; 0 lifts it).
    Block(usize, u64),
}

use Step::{Advance, Back, Charge, Peek, Reset, Undo};

/// One request on every rule, cost 1.
fn all(rules: usize) -> Step {
    Step::Check((0..rules).map(|i| (i, 1)).collect())
}

fn one(rule: usize, cost: u64) -> Step {
    Step::Check(vec![(rule, cost)])
}

fn times(n: usize, step: Step) -> Vec<Step> {
    vec![step; n]
}

#[derive(Debug, Clone)]
struct Scenario {
    name: String,
    start: u64,
    rules: Vec<Rule>,
    steps: Vec<Step>,
}

fn scenario(name: impl Into<String>, start: u64, rules: Vec<Rule>, steps: Vec<Vec<Step>>) -> Scenario {
    Scenario { name: name.into(), start, rules, steps: steps.into_iter().flatten().collect() }
}

/// The next multiple of `period` after `t`.
fn boundary_after(t: u64, period: u64) -> u64 {
    (t / period + 1) * period
}

/// The other algorithm used as the "wide" rule beside `a`.
fn partner(a: Algorithm) -> Algorithm {
    match a {
        Algorithm::SlidingWindowLog => Algorithm::FixedWindow,
        _ => Algorithm::SlidingWindowLog,
    }
}

/// The table. Periods are minutes or longer: Redis TTLs run on real time, and a scenario
/// finishes long before any key it wrote could expire for real.
fn scenarios() -> Vec<Scenario> {
    let mut out = Vec::new();
    for a in Algorithm::ALL {
        let q5 = Quota::per_minute(5);
        out.push(scenario(
            format!("{a}: cost 1, the limit, refill over time"),
            T0,
            vec![rule("r", "k", a, q5)],
            vec![
                times(7, one(0, 1)),
                vec![Advance(SEC), one(0, 1), Advance(11 * SEC)],
                times(2, one(0, 1)),
                vec![Advance(30 * SEC)],
                times(3, one(0, 1)),
                vec![Advance(61 * SEC)],
                times(6, one(0, 1)),
                vec![Advance(10 * MIN)],
                times(2, one(0, 1)),
            ],
        ));
        out.push(scenario(
            format!("{a}: cost > 1"),
            T0 + 7 * SEC,
            vec![rule("r", "k", a, q5)],
            vec![
                times(3, one(0, 2)),
                vec![Advance(13 * SEC), one(0, 2), one(0, 1), Advance(47 * SEC), one(0, 3), one(0, 5)],
                vec![Advance(2 * MIN), one(0, 5), one(0, 1), Advance(12 * SEC), one(0, 2), one(0, 1)],
            ],
        ));
        out.push(scenario(
            format!("{a}: cost above the capacity is rejected for good and consumes nothing"),
            T0,
            vec![rule("r", "k", a, q5)],
            vec![vec![
                one(0, 7),
                one(0, 1),
                one(0, 1 << 50),
                one(0, u64::from(u32::MAX) + 10),
                one(0, 4),
                one(0, 6),
                Advance(MIN),
                one(0, 7),
                one(0, 3),
            ]],
        ));
        out.push(scenario(
            format!("{a}: burst"),
            T0,
            vec![rule("r", "k", a, Quota::per_minute(10).burst(3))],
            vec![
                times(5, one(0, 1)),
                vec![Advance(6 * SEC)],
                times(2, one(0, 1)),
                vec![Advance(30 * SEC)],
                times(5, one(0, 1)),
                vec![Advance(5 * MIN), one(0, 3), one(0, 1), one(0, 4)],
            ],
        ));
        let edge = boundary_after(T0, MIN);
        out.push(scenario(
            format!("{a}: window boundaries"),
            edge - 2 * SEC,
            vec![rule("r", "k", a, q5)],
            vec![
                times(6, one(0, 1)),
                // 1 µs before the boundary, at it, and just after.
                vec![Advance(2 * SEC - 1), one(0, 1), Advance(1)],
                times(6, one(0, 1)),
                vec![Advance(1)],
                times(2, one(0, 1)),
                vec![Advance(15 * SEC)],
                times(3, one(0, 1)),
                vec![Advance(45 * SEC - 2)],
                times(3, one(0, 1)),
                vec![Advance(1)],
                times(3, one(0, 1)),
                vec![Advance(MIN + 30 * SEC)],
                times(6, one(0, 1)),
            ],
        ));
        // The sliding window counter's vectors (prev 84, curr 15, a quarter in; prev 9,
        // curr 5, 15 s of 60), run on every algorithm.
        out.push(scenario(
            format!("{a}: large costs across windows"),
            boundary_after(T0, MIN) + 50 * SEC,
            vec![rule("r", "k", a, Quota::per_minute(100))],
            vec![vec![
                one(0, 84),
                Advance(10 * SEC),
                one(0, 15),
                Advance(15 * SEC),
                one(0, 1),
                one(0, 2),
                one(0, 20),
                Advance(2 * MIN - 25 * SEC),
                one(0, 9),
                Advance(MIN),
                one(0, 5),
                Advance(15 * SEC),
                one(0, 86),
                one(0, 87),
                one(0, 88),
                Advance(7 * SEC + 333_333),
                one(0, 88),
                one(0, 1),
            ]],
        ));
        // prev 920 of 1000, 9 s into the next minute: 920 · 51 / 60 = 782 exactly, and
        // 782 + 218 = 1000 fits. Any other order of the double operations (e.g.
        // `prev / W · (W − e)` = 782.0000000000001) rejects: this catches a script that
        // drifts from the stated computation.
        out.push(scenario(
            format!("{a}: the estimate's double rounding at the limit"),
            boundary_after(T0, MIN),
            vec![rule("r", "k", a, Quota::per_minute(1000))],
            vec![vec![
                one(0, 920),
                Advance(MIN + 9 * SEC),
                one(0, 218),
                one(0, 1),
                Advance(MIN),
                one(0, 1000),
                one(0, 1001),
            ]],
        ));
        out.push(scenario(
            format!("{a}: refund, peek, reset"),
            T0,
            vec![rule("r", "k", a, q5)],
            vec![
                times(3, one(0, 1)),
                vec![Peek(0, 1), Peek(0, 3), Undo(1), Peek(0, 1)],
                times(4, one(0, 1)),
                // The last check was rejected: it took nothing, and refunds nothing.
                vec![Peek(0, 1), Undo(1), Peek(0, 2), Undo(3), Peek(0, 5), Undo(3), Peek(0, 5)],
                vec![one(0, 2), Reset(0), Peek(0, 1), one(0, 2), Advance(20 * SEC), Undo(1)],
                vec![Peek(0, 1), Advance(10 * MIN), Undo(3), Peek(0, 1), one(0, 5)],
                // Undo of a check made before a reset.
                vec![Reset(0), Undo(1), Peek(0, 5), one(0, 5), one(0, 1)],
                times(7, one(0, 1)),
                // Undo of a check made before a reset, after checks made since: the window
                // algorithms give nothing back (their state says when it was first
                // written); the others give back into the fresh count.
                vec![Advance(10 * MIN), one(0, 2), Advance(SEC), Reset(0), Advance(SEC)],
                vec![one(0, 1), one(0, 1), Undo(3), Peek(0, 1), one(0, 1), one(0, 1), one(0, 1)],
            ],
        ));
        // Refunds carry their commit's identity: after a window boundary, after the units
        // expired, after later requests took units of their own.
        let edge = boundary_after(T0, MIN);
        out.push(scenario(
            format!("{a}: refunds after a boundary, after expiry, after later requests"),
            edge - 10 * SEC,
            vec![rule("r", "k", a, Quota::per_minute(4))],
            vec![
                vec![one(0, 2), one(0, 1), Advance(15 * SEC), one(0, 1), one(0, 1)],
                // Refund the 2 units taken before the boundary, then the 1 after it.
                vec![Undo(4), Peek(0, 1), Peek(0, 3), one(0, 2), Undo(3), Peek(0, 1)],
                times(3, one(0, 1)),
                vec![Advance(40 * SEC), one(0, 1), Undo(2), Peek(0, 1), one(0, 2)],
                // Long after: the units have left; giving them back changes nothing.
                vec![Advance(3 * MIN), Undo(1), Undo(2), Peek(0, 1), Peek(0, 4)],
                times(6, one(0, 1)),
                vec![Advance(61 * SEC), one(0, 3), one(0, 1), Undo(2), Undo(2), Peek(0, 1), one(0, 2)],
            ],
        ));
        // Late refunds, and refunds after later commits. GCRA and the token bucket give
        // back all of a commit's units when no commit was made on the key since, none
        // otherwise (this used to give back a part, less one unit per T since); the
        // windows give back what is still in the window.
        out.push(scenario(
            format!("{a}: late refunds, and refunds after later commits"),
            T0,
            vec![rule("r", "k", a, Quota::per_minute(1).burst(2))],
            vec![
                vec![one(0, 1), Advance(60 * SEC), one(0, 1), one(0, 1), one(0, 1)],
                vec![Undo(4), Peek(0, 1), one(0, 1)],
                vec![Advance(20 * SEC), Undo(4), Peek(0, 1), one(0, 1), one(0, 1), Peek(0, 1)],
                vec![Advance(70 * SEC), Undo(2), Peek(0, 1), Peek(0, 2)],
            ],
        ));
        // All or nothing (GCRA, token bucket): no commit since gives back all c; a commit
        // since, nothing; two commits refunded last first, both; first first, the last's.
        out.push(scenario(
            format!("{a}: refunds with and without a commit since"),
            T0,
            vec![rule("r", "k", a, Quota::per_minute(3))],
            vec![
                vec![one(0, 3), Advance(SEC), Undo(1), Peek(0, 3), one(0, 3), one(0, 1)],
                vec![Advance(3 * MIN), one(0, 1), one(0, 1), Undo(2), Peek(0, 1), Peek(0, 2)],
                vec![Advance(3 * MIN), one(0, 1), Advance(MS), one(0, 1), Undo(1), Undo(2), Peek(0, 3)],
                vec![one(0, 1), one(0, 1), Undo(2), Undo(1), Peek(0, 2), one(0, 3)],
            ],
        ));
        // A refund that leaves the state as never seen, then the clock steps back: Redis
        // deleted the key, and MemoryStore must forget the state alike.
        out.push(scenario(
            format!("{a}: refunded to nothing, then the clock steps back"),
            T0,
            vec![rule("r", "k", a, Quota::per_minute(4).burst(4))],
            vec![
                vec![one(0, 1), Undo(1), Back(2 * SEC), Peek(0, 1), Peek(0, 4), one(0, 4), one(0, 1)],
                vec![Advance(5 * SEC), one(0, 2), Undo(1), Back(SEC), Peek(0, 1), one(0, 4)],
            ],
        ));
        // The clock steps back across a window boundary: the stored window's counts hold
        // (they used to be wiped, admitting the limit again), and refunds still find them.
        out.push(scenario(
            format!("{a}: a step back across a boundary"),
            edge + MS,
            vec![rule("r", "k", a, Quota::per_minute(5))],
            vec![
                vec![one(0, 3), one(0, 2), Back(2 * MS), one(0, 1), Peek(0, 1), one(0, 3), Undo(2)],
                vec![Back(MS), Peek(0, 1), one(0, 3), Advance(4 * MS), one(0, 1), Peek(0, 5)],
                vec![Advance(61 * SEC), one(0, 5)],
            ],
        ));
        // (Found by a review.) a state past its expiry is "never seen", whether the store
        // forgot it (MemoryStore) or still holds it (Redis, whose TTLs run on real time
        // here, or whose clock is behind a client's). The next commit keeps the held
        // state's `born`; a forgotten one is born anew: then a step back within the window
        // and the refund of a commit made there is given back by Redis only.
        out.push(scenario(
            format!("{a}: a state held past its expiry, a step back, a refund"),
            T0,
            vec![rule("r", "k", a, Quota::per_minute(5))],
            vec![vec![
                one(0, 1),
                Advance(3 * MIN),
                one(0, 1),
                Back(SEC),
                one(0, 1),
                Undo(1),
                Peek(0, 1),
                one(0, 3),
                one(0, 100),
            ]],
        ));
        // Penalties: a rejection blocks the key; blocked requests take nothing (from any
        // rule); a rejection during the block does not extend it; peek never starts one;
        // reset lifts it.
        let blocking = |name, key, q, block_us| Rule { block_us, ..rule(name, key, a, q) };
        out.push(scenario(
            format!("{a}: a rejection blocks the key"),
            T0,
            vec![
                blocking("login", "k", Quota::per_minute(3), 2 * MIN),
                rule("wide", "k", partner(a), Quota::per_minute(100)),
                blocking("other", "j", Quota::per_minute(1), 30 * SEC),
            ],
            vec![
                times(3, all(2)),
                vec![Peek(0, 1), Peek(0, 1), all(2), Peek(0, 1), Peek(1, 1), one(1, 1)],
                vec![Advance(61 * SEC), all(2), Advance(40 * SEC), all(2), Peek(0, 1), Advance(20 * SEC)],
                vec![all(2), all(2), Peek(1, 1), one(0, 5), Peek(0, 1)],
                vec![one(2, 1), one(2, 1), one(2, 1), Advance(10 * SEC), one(2, 1), Reset(2), one(2, 1), Peek(2, 1)],
                vec![Advance(3 * MIN), one(0, 1), Step::Check(vec![(0, 1), (2, 1)]), Peek(2, 1)],
            ],
        ));
        // Roles: shadow checks ride in the enforced checks' call. A shadow check never
        // refuses the call, is committed only when it and every enforced check accept,
        // and nothing is committed when an enforced check rejects. "t" sits on another
        // key (another slot on a cluster: a slot of shadow checks only).
        out.push(scenario(
            format!("{a}: shadow checks in the enforced checks' call"),
            T0 + 11 * SEC,
            vec![
                rule("e", "k", a, Quota::per_minute(3)),
                shadow("s", "k", partner(a), Quota::per_minute(2)),
                shadow("t", "j", a, Quota::per_minute(5)),
            ],
            vec![
                times(2, all(3)),
                vec![all(3), all(3), Peek(1, 1), Peek(2, 1), Undo(2), Peek(0, 1), Peek(2, 1)],
                vec![one(1, 1), one(2, 4), Step::Check(vec![(1, 1), (2, 1)]), Peek(2, 1)],
                vec![Advance(MIN), all(3), Step::Check(vec![(0, 2), (1, 3), (2, 1)]), Peek(1, 1)],
            ],
        ));
        // A cost the quota can never admit is refused with no retry, and starts no block:
        // the key's ordinary requests go on (it used to block the key for the whole block).
        out.push(scenario(
            format!("{a}: a cost that can never fit starts no block"),
            T0 + 5 * SEC,
            vec![blocking("login", "k", Quota::per_minute(3), 2 * MIN)],
            vec![vec![one(0, 10), Peek(0, 1), one(0, 1), one(0, 10), one(0, 1)], times(3, one(0, 1)), vec![Peek(0, 1)]],
        ));
        // Charges (Rule::charged): a probe (cost 0) takes nothing and admits while the key
        // is within its quota; a charge takes its units whatever the decision, into debt;
        // a key in debt is refused (the probe too) until the debt is paid. A probe beside
        // an ordinary rule: all or nothing, as ever.
        out.push(scenario(
            format!("{a}: charges after the work, into debt"),
            T0 + 7 * SEC,
            vec![
                rule("tokens", "k", a, Quota::per_minute(10)),
                rule("requests", "k", partner(a), Quota::per_minute(100)),
            ],
            vec![
                vec![one(0, 0), Peek(0, 1), Charge(0, 4), Peek(0, 1), one(0, 0), Charge(0, 6), Peek(0, 0)],
                vec![Step::Check(vec![(0, 0), (1, 1)]), Peek(1, 1), Charge(0, 7), Peek(0, 0), Peek(0, 1)],
                vec![Step::Check(vec![(0, 0), (1, 1)]), Peek(1, 1), Advance(20 * SEC), one(0, 0), Peek(0, 0)],
                vec![Advance(25 * SEC), one(0, 0), Peek(0, 1), Charge(0, 40), Peek(0, 0), Advance(61 * SEC)],
                vec![Peek(0, 0), one(0, 0), Advance(2 * MIN), one(0, 0), Peek(0, 1), one(0, 1), Charge(1, 3)],
                vec![Peek(1, 1), Charge(0, 0), Peek(0, 1)],
                // Charges past any horizon: the debt stops at MAX_DEBT, whose numbers every
                // store still computes exactly (no error, no overflow); charges add up to it.
                vec![Charge(0, u64::MAX), Peek(0, 0), Charge(0, 1 << 45), Peek(0, 0), one(0, 0), Charge(1, 1 << 41)],
                vec![Peek(1, 0), Advance(MIN), Charge(0, 3), Peek(0, 0)],
            ],
        ));
        let b = partner(a);
        out.push(scenario(
            format!("{a}: two rules on one key, a rejected rule consumes nothing from the other"),
            T0,
            vec![rule("narrow", "k", a, Quota::per_minute(2)), rule("wide", "k", b, Quota::per_minute(10))],
            vec![
                times(5, all(2)),
                vec![Peek(1, 1), one(1, 1), Advance(40 * SEC)],
                times(4, all(2)),
                vec![Step::Check(vec![(0, 1), (1, 20)]), Peek(0, 1)],
                vec![Undo(2), Undo(3), Peek(0, 1), Peek(1, 1)],
            ],
        ));
        out.push(scenario(
            format!("{a}: rules on different keys (different cluster slots)"),
            T0,
            vec![
                rule("a", "alpha", a, Quota::per_minute(3)),
                rule("b", "beta", Algorithm::Gcra, Quota::per_minute(10)),
                rule("c", "gamma", b, Quota::per_minute(4)),
            ],
            vec![
                times(6, all(3)),
                vec![Peek(0, 1), Peek(1, 1), Peek(2, 1), Advance(61 * SEC)],
                times(2, all(3)),
                vec![Step::Check(vec![(0, 1), (1, 1), (2, 5)]), Peek(0, 1), Peek(1, 1)],
                vec![Undo(2), Undo(3), Peek(0, 1), Peek(1, 1), Peek(2, 1)],
            ],
        ));
    }
    // A block is the key's under its rule, whatever the algorithm (issue 37 item 7): one
    // rule swapped to another algorithm (the same name and key, as `set_rules` does) counts
    // afresh but stays blocked — a block by hand, and a `block_for` penalty started under
    // either — until the block ends or is lifted under either.
    for a in Algorithm::ALL {
        let b = partner(a);
        let swapped =
            |algorithm| Rule { blockable: true, block_us: 0, ..rule("r", "k", algorithm, Quota::per_minute(2)) };
        let penalised = |algorithm| Rule { block_us: 2 * MIN, ..swapped(algorithm) };
        out.push(scenario(
            format!("{a}: a block outlives a swap to {b}"),
            T0,
            vec![swapped(a), swapped(b), penalised(a), penalised(b)],
            vec![
                vec![one(0, 1), Step::Block(0, 10 * MIN), one(0, 1), one(1, 1), Peek(1, 1)],
                vec![Advance(MIN), one(1, 1), Step::Block(1, 0), one(0, 1), one(1, 1)],
                // A penalty started under b, then back to a (whose state is still held).
                vec![one(3, 1), one(3, 1), one(3, 1), one(2, 1), Peek(2, 1), Advance(MIN), one(0, 1)],
                vec![Advance(2 * MIN), one(0, 1), one(1, 1)],
            ],
        ));
    }
    // Leaky bucket: the queue bound and the max delay.
    out.push(scenario(
        "leaky bucket: delays, queue bound, max delay",
        T0,
        vec![
            rule("queue", "k", Algorithm::LeakyBucket, Quota::new(5, Duration::from_secs(10)).burst(3)),
            Rule {
                name: "delay",
                key: "k2",
                algorithm: Algorithm::LeakyBucket,
                quota: Quota::new(5, Duration::from_secs(10)).burst(10),
                max_delay_us: Some(5 * SEC),
                block_us: 0,
                blockable: false,
                shadow: false,
            },
        ],
        vec![
            times(6, one(0, 1)),
            times(6, one(1, 1)),
            vec![Advance(SEC), one(0, 1), Advance(SEC), one(0, 1), one(0, 2), one(1, 2), Advance(9 * SEC)],
            vec![one(0, 4), one(0, 5), one(1, 3), Peek(0, 1), Peek(1, 1)],
        ],
    ));
    // Every algorithm in one check, on one key and on six keys.
    let six = |keys: [&'static str; 6]| -> Vec<Rule> {
        Algorithm::ALL
            .iter()
            .zip(keys)
            .zip(["fw", "swl", "swc", "tb", "lb", "gcra"])
            .zip([4, 6, 5, 7, 3, 8])
            .map(|(((&a, k), n), l)| rule(n, k, a, Quota::per_minute(l).burst(l.min(4))))
            .collect()
    };
    for (label, keys) in [("one key", ["u"; 6]), ("six keys", ["u1", "u2", "u3", "u4", "u5", "u6"])] {
        out.push(scenario(
            format!("all six algorithms in one check, {label}"),
            T0 + 3 * SEC,
            six(keys),
            vec![
                times(6, all(6)),
                vec![Advance(15 * SEC)],
                times(3, all(6)),
                vec![Step::Check((0..6).map(|i| (i, 2)).collect()), Advance(MIN)],
                times(2, Step::Check((0..6).map(|i| (i, 2)).collect())),
                vec![Undo(1), Undo(3)],
                (0..6).map(|i| Peek(i, 1)).collect(),
                vec![Reset(2), Reset(5), all(6), Advance(10 * MIN), all(6)],
            ],
        ));
    }
    // The sliding window log past the head that Redis reads in one go (its marks and 8
    // members): a rejection whose k-th unit lies beyond it, a long expired prefix, refunds
    // from a member two commits share, and the clock stepping back behind the newest.
    let log = Algorithm::SlidingWindowLog;
    out.push(scenario(
        "sliding window log: a log longer than the head read",
        T0,
        vec![rule("r", "k", log, Quota::per_minute(20))],
        vec![
            // 20 members, one a second.
            (0..20).flat_map(|_| [one(0, 1), Advance(SEC)]).collect(),
            vec![one(0, 1), one(0, 12), Peek(0, 15), Peek(0, 1)],
            // 14 members expired (ts <= T0 + 13 s), 6 left.
            vec![Advance(53 * SEC), Peek(0, 1), one(0, 3), one(0, 12), one(0, 11), one(0, 2)],
            // The 11 units come back from the member they share with the 3.
            vec![Undo(2), Peek(0, 1), one(0, 2), Undo(1), Undo(4)],
            // Back behind the newest member: a commit joins it.
            vec![Back(30 * SEC), one(0, 1), one(0, 5), Peek(0, 1), Undo(2), Peek(0, 1)],
            vec![Advance(2 * MIN), one(0, 20), one(0, 1), Peek(0, 1)],
        ],
    ));
    out.push(scenario(
        "sliding window log: a refund of the newest member, then the clock steps back",
        T0,
        vec![rule("r", "k", log, Quota::per_minute(5))],
        vec![
            vec![one(0, 1), Advance(SEC), one(0, 1), Advance(SEC), one(0, 2), Undo(1), Peek(0, 1)],
            // The newest is the member at T0 + 1 s again: a commit behind it joins it.
            vec![Back(3 * SEC), one(0, 1)],
            times(3, one(0, 1)),
            vec![Peek(0, 1), Undo(1), Undo(2), Peek(0, 2), one(0, 2), one(0, 1)],
            // Every member refunded: the log is gone, as never seen.
            vec![Advance(10 * SEC), Undo(2), Undo(3), Undo(5), Undo(6), Undo(7), Undo(9), Peek(0, 1)],
            vec![one(0, 5), one(0, 1), Peek(0, 1)],
        ],
    ));
    // Review: two tiers of one rule and key (a second's quota and a minute's, as a plan
    // change makes them): a refund under the second's tier after its units left its
    // window gives nothing back, and must not forget the minute's units. MemoryStore
    // forgets the whole log (its refund drops a state past the refund's own window).
    out.push(scenario(
        "review: sliding window log: a shorter tier's refund keeps a longer tier's units",
        T0,
        vec![rule("r", "k", log, Quota::per_second(10)), rule("r", "k", log, Quota::per_minute(10))],
        vec![vec![one(0, 4), one(1, 5), Advance(2 * SEC), Undo(2), Peek(1, 2), one(1, 8), one(1, 1), Peek(1, 1)]],
    ));
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    /// Each rule's decision and what its commit took (the same identity on every store).
    Checked(Vec<Option<StoreOutcome>>),
    Peeked(Decision),
    Done,
}

fn check_of(ns: &str, r: &Rule, cost: u64) -> Check {
    let mut params = Params::new(r.quota);
    params.cost = cost; // 0: a probe
    if let Some(d) = r.max_delay_us {
        params.max_delay_us = d;
    }
    params.block_us = r.block_us;
    params.blockable = r.blockable;
    params.shadow = r.shadow;
    Check { rule: format!("{ns}/{}", r.name).into(), key: Key::from(r.key), algorithm: r.algorithm, params }
}

/// Runs `sc` on `store`; rule names get `ns` in front so that scenarios never share state.
async fn run<S: Store>(store: &S, clock: &ManualClock, sc: &Scenario, ns: &str) -> Vec<Outcome> {
    let rules = &sc.rules;
    clock.set(sc.start);
    let mut out = Vec::with_capacity(sc.steps.len());
    // Every check made so far, with its outcomes, for Undo.
    let mut made: Vec<(Vec<Check>, Vec<Option<StoreOutcome>>)> = Vec::new();
    for (i, step) in sc.steps.iter().enumerate() {
        let fail = |e: tollgate::StoreError| -> ! { panic!("{ns} {:?}, step {i} {step:?}: store error {e}", sc.name) };
        let outcome = match step {
            Step::Check(list) => {
                let checks: Vec<Check> = list.iter().map(|&(r, c)| check_of(ns, &rules[r], c)).collect();
                let outcomes = store.check(&checks).await.unwrap_or_else(|e| fail(e));
                made.push((checks, outcomes.clone()));
                Outcome::Checked(outcomes)
            }
            Step::Undo(k) => {
                let (checks, outcomes) = made
                    .len()
                    .checked_sub(*k)
                    .map(|i| &made[i])
                    .unwrap_or_else(|| panic!("{:?}, step {i}: Undo({k}) after {} checks", sc.name, made.len()));
                let refunds: Vec<Refund> = checks
                    .iter()
                    .zip(outcomes)
                    .filter_map(|(c, o)| o.as_ref()?.taken.map(|taken| Refund { check: c.clone(), taken }))
                    .collect();
                store.refund(&refunds).await.unwrap_or_else(|e| fail(e));
                Outcome::Done
            }
            Step::Peek(r, c) => {
                Outcome::Peeked(store.peek(&check_of(ns, &rules[*r], *c)).await.unwrap_or_else(|e| fail(e)))
            }
            Step::Reset(r) => {
                let r = &rules[*r];
                store
                    .reset(&format!("{ns}/{}", r.name), &Key::from(r.key), r.algorithm)
                    .await
                    .unwrap_or_else(|e| fail(e));
                Outcome::Done
            }
            Step::Advance(us) => {
                clock.advance(Duration::from_micros(*us));
                Outcome::Done
            }
            Step::Back(us) => {
                clock.set(clock.now_micros() - us);
                Outcome::Done
            }
            Step::Charge(r, units) => {
                store.charge(&[check_of(ns, &rules[*r], *units)]).await.unwrap_or_else(|e| fail(e));
                Outcome::Done
            }
            Step::Block(r, us) => {
                let check = check_of(ns, &rules[*r], 1);
                store.block(&check, Duration::from_micros(*us)).await.unwrap_or_else(|e| fail(e));
                Outcome::Done
            }
        };
        out.push(outcome);
    }
    out
}

fn compare(sc: &Scenario, want_name: &str, want: &[Outcome], got_name: &str, got: &[Outcome]) -> Option<String> {
    if want == got {
        return None;
    }
    let mut msg = format!("scenario {:?}: {got_name} differs from {want_name}\n", sc.name);
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        if w != g {
            let _ = writeln!(msg, "  step {i} {:?}:\n    {want_name}: {w:?}\n    {got_name}: {g:?}", sc.steps[i]);
        }
    }
    Some(msg)
}

fn allowed(o: &[Outcome]) -> usize {
    o.iter().filter(|o| matches!(o, Outcome::Checked(d) if d.iter().flatten().all(|o| o.decision.allowed))).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_decides_alike() {
    let table = scenarios();
    assert!(table.len() >= 6 * 9, "the table lost scenarios");

    let memory_clock = ManualClock::new(T0);
    let memory = MemoryStore::with_clock(memory_clock.clone());

    let server = RedisServer::start();
    let redis_clock = ManualClock::new(T0);
    let redis =
        RedisStore::from_url(&server.url()).unwrap().response_timeout(RESPONSE_TIMEOUT).with_clock(redis_clock.clone());
    redis.ping().await.expect("standalone redis answers");

    let cluster = RedisCluster::start(3);
    let cluster_clock = ManualClock::new(T0);
    let clustered = RedisStore::cluster(cluster.urls())
        .unwrap()
        .response_timeout(RESPONSE_TIMEOUT)
        .with_clock(cluster_clock.clone());
    clustered.ping().await.expect("redis cluster answers");

    let mut failures = Vec::new();
    let mut decisions = 0;
    for (i, sc) in table.iter().enumerate() {
        let ns = format!("s{i}");
        let want = run(&memory, &memory_clock, sc, &ns).await;
        let standalone = run(&redis, &redis_clock, sc, &ns).await;
        let clustered = run(&clustered, &cluster_clock, sc, &ns).await;
        failures.extend(compare(sc, "memory", &want, "redis", &standalone));
        failures.extend(compare(sc, "memory", &want, "redis cluster", &clustered));
        // Each scenario both accepts and rejects something, or it tests little.
        let checks = want.iter().filter(|o| matches!(o, Outcome::Checked(_))).count();
        let passed = allowed(&want);
        assert!(passed > 0 && passed < checks, "{:?} accepts {passed} of {checks}", sc.name);
        decisions += checks;
    }
    assert!(failures.is_empty(), "{} scenarios differ:\n{}", failures.len(), failures.join("\n"));
    eprintln!(
        "conformance: {} scenarios, {decisions} checks, identical on memory, redis and redis cluster",
        table.len()
    );

    // The multi-slot scenarios really spanned several nodes of the cluster.
    let slots: Vec<String> = ["alpha", "beta", "gamma"]
        .iter()
        .map(|k| cluster.node(0).cmd(&["CLUSTER", "KEYSLOT", &format!("tollgate:{{{k}}}:x")]))
        .collect();
    let owners: std::collections::BTreeSet<usize> = slots
        .iter()
        .map(|s| {
            let slot: usize = s.parse().unwrap();
            (0..3).find(|&n| owns(&cluster, n, slot)).unwrap()
        })
        .collect();
    assert!(owners.len() >= 2, "alpha/beta/gamma all on one node: slots {slots:?}");
}

fn owns(cluster: &RedisCluster, node: usize, slot: usize) -> bool {
    let port = cluster.node(node).port().to_string();
    let nodes = cluster.node(0).cmd(&["CLUSTER", "NODES"]);
    nodes.lines().filter(|l| l.contains(&format!(":{port}@"))).any(|l| {
        l.split_whitespace().skip(8).any(|r| match r.split_once('-') {
            Some((a, b)) => a.parse::<usize>().is_ok_and(|a| a <= slot) && b.parse::<usize>().is_ok_and(|b| slot <= b),
            None => r.parse::<usize>() == Ok(slot),
        })
    })
}

/// On the server's own `TIME`: exactly the limit of `limit + 5` immediate requests pass,
/// every rejection says when to retry, and `remaining` counts down.
async fn server_time(algorithm: Algorithm) {
    let server = RedisServer::start();
    let store = RedisStore::from_url(&server.url()).unwrap().response_timeout(RESPONSE_TIMEOUT);
    store.ping().await.unwrap();
    // Long periods: a window boundary during the test is all but impossible, and no
    // refill happens within it. The leaky bucket shapes: 5/s with a queue of 3 admits 4.
    let (quota, want) = match algorithm {
        Algorithm::LeakyBucket => (Quota::per_second(5).burst(3), 4),
        _ => (Quota::per_day(10), 10),
    };
    let check = Check { rule: "st".into(), key: "k".into(), algorithm, params: Params::new(quota) };
    let mut decisions = Vec::new();
    for _ in 0..want + 5 {
        decisions.push(store.check_one(&check).await.unwrap().decision);
    }
    let passed = decisions.iter().filter(|d| d.allowed).count();
    assert_eq!(passed, want, "{algorithm}: {decisions:#?}");
    assert!(decisions[..want].iter().all(|d| d.allowed), "{algorithm}: the first {want} pass");
    for d in &decisions[want..] {
        assert!(d.retry_after().is_some_and(|r| r > Duration::ZERO), "{algorithm}: {d:?}");
        assert_eq!(d.remaining(), 0, "{algorithm}: {d:?}");
    }
    if algorithm == Algorithm::LeakyBucket {
        let delays: Vec<u128> = decisions[..want].iter().map(|d| d.delay().as_millis()).collect();
        // 0, 200, 400, 600 ms, less the µs that passed between the requests.
        for (i, d) in delays.iter().enumerate() {
            let slot = 200 * i as u128;
            assert!(*d <= slot && d + 50 >= slot, "leaky bucket delays {delays:?}");
        }
    } else {
        let remaining: Vec<u64> = decisions[..want].iter().map(|d| d.remaining()).collect();
        assert_eq!(remaining, (0..10).rev().collect::<Vec<u64>>(), "{algorithm}");
    }
    // Peek agrees and consumes nothing.
    assert!(!store.peek(&check).await.unwrap().allowed);
    let key_count: u64 = server.cmd(&["DBSIZE"]).parse().unwrap();
    assert_eq!(key_count, 1, "{algorithm}: one key per (rule, key)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_time_fixed_window() {
    server_time(Algorithm::FixedWindow).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_time_sliding_window_log() {
    server_time(Algorithm::SlidingWindowLog).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_time_sliding_window_counter() {
    server_time(Algorithm::SlidingWindowCounter).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_time_token_bucket() {
    server_time(Algorithm::TokenBucket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_time_leaky_bucket() {
    server_time(Algorithm::LeakyBucket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_time_gcra() {
    server_time(Algorithm::Gcra).await;
}

/// Issue 40: a GCRA or token-bucket refund gives back all of the commit's units when no
/// commit was made on the key since, none otherwise — with explicit expectations, on
/// `store` (the table above holds every store to the same decisions).
async fn a_bucket_refund_is_all_or_nothing<S: Store>(store: &S, clock: &ManualClock, ns: &str) {
    for a in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let check = |rule: &str, cost: u64| Check {
            rule: format!("{ns}/{a}/{rule}").into(),
            key: Key::from("k"),
            algorithm: a,
            params: Params::new(Quota::per_minute(3)).cost(cost),
        };
        let take = |rule: &'static str, cost: u64| {
            let c = check(rule, cost);
            async move {
                let taken = store.check_one(&c).await.unwrap().taken.unwrap_or_else(|| panic!("{a}: {rule} refused"));
                Refund { check: c, taken }
            }
        };
        let peek = |rule: &'static str, cost: u64| {
            let c = check(rule, cost);
            async move { store.peek(&c).await.unwrap().allowed }
        };
        clock.set(T0);
        // (a) No commit since, a second later: all 3 units back.
        let r = take("a", 3).await;
        clock.set(T0 + SEC);
        store.refund(&[r]).await.unwrap();
        assert!(peek("a", 3).await, "{a}: a refund with no commit since gave back less than all");
        // (b) A commit since: nothing back.
        let (r1, _r2) = (take("b", 1).await, take("b", 1).await);
        store.refund(&[r1]).await.unwrap();
        assert!(peek("b", 1).await && !peek("b", 2).await, "{a}: a refund after another commit gave something back");
        // (c) Two commits refunded last first: both back.
        let (r1, r2) = (take("c", 1).await, take("c", 2).await);
        store.refund(&[r2]).await.unwrap();
        store.refund(&[r1]).await.unwrap();
        assert!(peek("c", 3).await, "{a}: refunding the last then the first did not give back both");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_refund_is_all_or_nothing_on_memory_and_redis() {
    let memory_clock = ManualClock::new(T0);
    let memory = MemoryStore::with_clock(memory_clock.clone());
    a_bucket_refund_is_all_or_nothing(&memory, &memory_clock, "m").await;
    let server = RedisServer::start();
    let redis_clock = ManualClock::new(T0);
    let redis =
        RedisStore::from_url(&server.url()).unwrap().response_timeout(RESPONSE_TIMEOUT).with_clock(redis_clock.clone());
    redis.ping().await.unwrap();
    a_bucket_refund_is_all_or_nothing(&redis, &redis_clock, "r").await;
}

/// Issue 43: a quota slice's check of a bucket reserves future emission slots, up to
/// `ahead_us` past the burst and no earlier than `after_us` from now, alike on every store
/// (the script's arithmetic is checked against the Rust algorithm's on each call; this
/// holds the stores to explicit numbers).
async fn a_slice_reserves_slots_past_the_burst<S: Store>(store: &S, clock: &ManualClock, ns: &str) {
    const MS: u64 = 1_000;
    for a in [Algorithm::Gcra, Algorithm::TokenBucket] {
        // T = 100 ms, B·T = 200 ms.
        let check = |key: &str, cost: u64, ahead: u64, after: u64| {
            let mut params = Params::new(Quota::per_second(10).burst(2)).cost(cost);
            (params.ahead_us, params.after_us) = (ahead * MS, after * MS);
            Check { rule: format!("{ns}/{a}/slice").into(), key: Key::from(key), algorithm: a, params }
        };
        let ask = |c: Check| async move { store.check_one(&c).await.unwrap() };
        clock.set(T0);
        for _ in 0..2 {
            assert!(ask(check("edge", 1, 0, 0)).await.decision.allowed, "{a}: the burst");
        }
        let refused = ask(check("edge", 1, 0, 0)).await.decision;
        assert!(!refused.allowed, "{a}: a request at the edge");
        // Three slots past the burst, within 300 ms of reach: TAT 200 → 500 ms.
        let slice = ask(check("edge", 3, 300, 0)).await;
        assert_eq!(slice.taken.map(|t| t.at), Some(T0 + 500 * MS), "{a}: a slice at the edge");
        assert_eq!(slice.decision.reset_after(), Duration::from_millis(500), "{a}");
        assert_eq!(slice.decision.decided_at_micros(), T0, "{a}: the store's clock");
        // A fourth is past the reach: refused, retry when it would fit.
        let past = ask(check("edge", 1, 300, 0)).await.decision;
        assert_eq!((past.allowed, past.retry_after()), (false, Some(Duration::from_millis(100))), "{a}");
        // `after`: a run that starts 150 ms from now on an idle key (its first 150 ms of
        // slots skipped): past the burst's 200 ms, so it needs reach.
        assert!(!ask(check("ahead", 2, 0, 150)).await.decision.allowed, "{a}: no reach");
        let run = ask(check("ahead", 2, 200, 150)).await;
        assert_eq!(run.taken.map(|t| t.at), Some(T0 + 350 * MS), "{a}: a run 150 ms ahead");
        // A request's check reads the slots as taken.
        let after = ask(check("ahead", 1, 0, 0)).await.decision;
        assert_eq!((after.allowed, after.retry_after()), (false, Some(Duration::from_millis(250))), "{a}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_reserves_slots_past_the_burst_on_every_store() {
    let memory_clock = ManualClock::new(T0);
    let memory = MemoryStore::with_clock(memory_clock.clone());
    a_slice_reserves_slots_past_the_burst(&memory, &memory_clock, "m").await;
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let redis =
        RedisStore::from_url(&server.url()).unwrap().response_timeout(RESPONSE_TIMEOUT).with_clock(clock.clone());
    redis.ping().await.unwrap();
    a_slice_reserves_slots_past_the_burst(&redis, &clock, "r").await;
    let cluster = RedisCluster::start(3);
    let clustered =
        RedisStore::cluster(cluster.urls()).unwrap().response_timeout(RESPONSE_TIMEOUT).with_clock(clock.clone());
    a_slice_reserves_slots_past_the_burst(&clustered, &clock, "c").await;
}

/// The review's sliding log example with explicit expectations, on Redis and on a cluster
/// (the memory store runs it in `tests/http/refunds.rs`): a refund after its units left the
/// window refunds nothing; one while they are in it refunds exactly them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_log_refund_gives_back_its_own_units_on_redis_and_cluster() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let redis =
        RedisStore::from_url(&server.url()).unwrap().response_timeout(RESPONSE_TIMEOUT).with_clock(clock.clone());
    sliding_log_refund_example(redis, &clock).await;
    let cluster = RedisCluster::start(3);
    let clustered =
        RedisStore::cluster(cluster.urls()).unwrap().response_timeout(RESPONSE_TIMEOUT).with_clock(clock.clone());
    sliding_log_refund_example(clustered, &clock).await;
}

/// The roles' semantics, asserted outright on every store (the table above only compares
/// the stores with each other): a shadow check never refuses the call, is committed only
/// when it and every enforced check accept, and nothing is committed when an enforced
/// check rejects — on a cluster also when the shadow check sits in a slot of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_checks_ride_in_the_call_on_every_store() {
    let (server, cluster, clock) = (RedisServer::start(), RedisCluster::start(3), ManualClock::new(T0));
    let (yes, no) = ((true, true), (false, false));
    let want = [
        vec![yes, yes, yes],
        vec![yes, yes, yes],
        // s is full: it says so, takes nothing, and refuses nothing.
        vec![yes, no, yes],
        // e is full: the call is refused, and nothing is taken (t accepted alone).
        vec![no, no, (true, false)],
    ];
    let memory = MemoryStore::with_clock(clock.clone());
    assert_eq!(roles(&memory, "memory").await, want, "memory");
    let redis = RedisStore::from_url(&server.url()).unwrap().with_clock(clock.clone());
    assert_eq!(roles(&redis, "redis").await, want, "redis");
    let clustered = RedisStore::cluster(cluster.urls()).unwrap().with_clock(clock.clone());
    assert_eq!(roles(&clustered, "cluster").await, want, "redis cluster");
}

/// Four calls of one enforced and two shadow checks: each check's (allowed, taken).
async fn roles<S: Store>(store: &S, ns: &str) -> Vec<Vec<(bool, bool)>> {
    let rules = [
        rule("e", "k", Algorithm::Gcra, Quota::per_minute(3)),
        shadow("s", "k", Algorithm::SlidingWindowLog, Quota::per_minute(2)),
        shadow("t", "j", Algorithm::FixedWindow, Quota::per_minute(5)),
    ];
    let checks: Vec<Check> = rules.iter().map(|r| check_of(ns, r, 1)).collect();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let outcomes = store.check(&checks).await.unwrap_or_else(|e| panic!("{ns}: {e}"));
        seen.push(
            outcomes
                .iter()
                .map(|o| o.as_ref().map_or((false, false), |o| (o.decision.allowed, o.taken.is_some())))
                .collect(),
        );
    }
    seen
}

/// Review: a rule swapped (`set_rules`) from blockable to not blockable, same name, key
/// and algorithm: Redis stops reading the key's block (its checks read it only when
/// `reads_block`), and so does a lane (GCRA, the token bucket); a window algorithm's state
/// on MemoryStore holds the block in the entry and keeps refusing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_a_block_after_the_rule_stops_being_blockable_decides_alike() {
    let mut table = Vec::new();
    for a in Algorithm::ALL {
        let blockable = Rule { blockable: true, ..rule("r", "k", a, Quota::per_minute(5)) };
        let plain = rule("r", "k", a, Quota::per_minute(5));
        table.push(scenario(
            format!("review: {a}: blocked, then the rule is not blockable"),
            T0,
            vec![blockable, plain],
            vec![vec![one(0, 1), Step::Block(0, 10 * MIN), one(0, 1), one(1, 1), Peek(1, 1), one(1, 1)]],
        ));
    }
    let memory_clock = ManualClock::new(T0);
    let memory = MemoryStore::with_clock(memory_clock.clone());
    let server = RedisServer::start();
    let redis_clock = ManualClock::new(T0);
    let redis =
        RedisStore::from_url(&server.url()).unwrap().response_timeout(RESPONSE_TIMEOUT).with_clock(redis_clock.clone());
    redis.ping().await.expect("standalone redis answers");
    let mut failures = Vec::new();
    for (i, sc) in table.iter().enumerate() {
        let ns = format!("rb{i}");
        let want = run(&memory, &memory_clock, sc, &ns).await;
        let got = run(&redis, &redis_clock, sc, &ns).await;
        failures.extend(compare(sc, "memory", &want, "redis", &got));
    }
    assert!(failures.is_empty(), "{} scenarios differ:\n{}", failures.len(), failures.join("\n"));
}

/// Review: the table's "a shorter tier's refund keeps a longer tier's units" scenario on
/// its own, memory against standalone Redis. Fails today: MemoryStore forgets the minute's
/// 9 units at the second's refund and admits 8 more (17 in a minute of 10); Redis keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_a_shorter_tiers_refund_keeps_a_longer_tiers_units() {
    let sc =
        scenarios().into_iter().find(|s| s.name.starts_with("review: sliding window log: a shorter tier")).unwrap();
    let memory_clock = ManualClock::new(T0);
    let memory = MemoryStore::with_clock(memory_clock.clone());
    let server = RedisServer::start();
    let redis_clock = ManualClock::new(T0);
    let redis =
        RedisStore::from_url(&server.url()).unwrap().response_timeout(RESPONSE_TIMEOUT).with_clock(redis_clock.clone());
    redis.ping().await.unwrap();
    let want = run(&memory, &memory_clock, &sc, "rv").await;
    let got = run(&redis, &redis_clock, &sc, "rv").await;
    if let Some(msg) = compare(&sc, "memory", &want, "redis", &got) {
        panic!("{msg}");
    }
}
