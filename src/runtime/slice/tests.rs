//! The slices against a small model of a fleet: several simulated servers (each its own
//! [`Slices`], its own clock offset), one store (a `MemoryStore` on the model's time), and
//! random requests, slices asked, run and answered in any order and late, give-backs,
//! sweeps, kills and window ends. "Never over" is checked after every step: in every
//! window, the units admitted and not given back while that window lasted are at most L.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::algorithm::Params;
use crate::store::memory::MemoryStore;

const SERVERS: usize = 3;
/// 600 per 200 ms: 100 a server per period, slices pay.
const LIMIT: u64 = 600;
const WINDOW_US: u64 = 200_000;

fn quota() -> Quota {
    Quota::new(LIMIT, Duration::from_micros(WINDOW_US))
}

fn check(algorithm: Algorithm, cost: u64) -> Check {
    let mut params = Params::new(quota());
    params.cost = cost;
    Check { rule: "hot".into(), key: "k".into(), algorithm, params }
}

#[derive(Debug, Clone)]
enum Step {
    /// `n` requests of `cost` at one server.
    Requests { server: usize, n: u32, cost: u64 },
    /// The store runs a slice request that was sent (the oldest, or a later one).
    Run { pick: usize },
    /// The answer of a slice request the store ran reaches its server.
    Answer { pick: usize },
    /// Time passes.
    Advance { us: u64 },
    /// A server gives back one unit it admitted (a status that does not count, a dropped
    /// lease): to its slice while open, else to the store.
    GiveBack { server: usize, pick: usize },
    /// A server's sweeper runs.
    Sweep { server: usize, prune: bool },
    /// A server dies (`kill -9`): its slices and the answers it waits for are gone; it
    /// starts again empty.
    Kill { server: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0..SERVERS, 1..40u32, prop_oneof![4 => Just(1u64), 1 => 2..5u64])
            .prop_map(|(server, n, cost)| Step::Requests { server, n, cost }),
        3 => (0..4usize).prop_map(|pick| Step::Run { pick }),
        3 => (0..4usize).prop_map(|pick| Step::Answer { pick }),
        4 => prop_oneof![3 => 0..20_000u64, 1 => 20_000..150_000u64].prop_map(|us| Step::Advance { us }),
        2 => (0..SERVERS, 0..64usize).prop_map(|(server, pick)| Step::GiveBack { server, pick }),
        2 => (0..SERVERS, any::<bool>()).prop_map(|(server, prune)| Step::Sweep { server, prune }),
        1 => (0..SERVERS).prop_map(|server| Step::Kill { server }),
    ]
}

/// A unit a server admitted: its window, and how to give it back.
struct Admitted {
    window: u64,
    cost: u64,
    slice: Option<Arc<Slice>>,
    taken: Taken,
    /// Its place in [`Fleet::stamps`].
    id: usize,
}

struct Server {
    slices: Slices,
    /// This server's clock reads the model's time plus this.
    offset: u64,
    admitted: Vec<Admitted>,
}

/// A slice request on its way: sent at `sent` (model time) by `server` (its life), for
/// `check`; once the store ran it, its outcome.
struct Asked {
    server: usize,
    life: u64,
    sent: u64,
    check: Check,
    epoch: u64,
    outcome: Option<Outcome>,
}

struct Fleet {
    algorithm: Algorithm,
    store: MemoryStore,
    servers: Vec<Server>,
    lives: Vec<u64>,
    asked: Vec<Asked>,
    now: u64,
    /// Per window: units admitted and not given back while it lasted.
    used: BTreeMap<u64, u64>,
    /// Every admission: the reading of the store's clock its decision used, its cost, and
    /// whether it still counts (not given back). A bucket's bound is checked on these.
    stamps: Vec<(u64, u64, bool)>,
    from_slices: u64,
    /// Requests a bucket's slice refused with no store call.
    waited: u64,
    /// Review: stamp every admission with the model's (the store's) real time instead.
    real_time: bool,
}

impl Fleet {
    fn new(algorithm: Algorithm, offsets: &[u64]) -> Self {
        let servers =
            offsets.iter().map(|&offset| Server { slices: Slices::new(100), offset, admitted: Vec::new() }).collect();
        Self {
            algorithm,
            store: MemoryStore::new(),
            servers,
            lives: vec![0; SERVERS],
            asked: Vec::new(),
            // Not at 0: the first window is a whole one.
            now: 10 * WINDOW_US,
            used: BTreeMap::new(),
            stamps: Vec::new(),
            from_slices: 0,
            waited: 0,
            real_time: false,
        }
    }

    fn local(&self, server: usize) -> u64 {
        self.now + self.servers[server].offset
    }

    fn admit(&mut self, server: usize, cost: u64, slice: Option<Arc<Slice>>, taken: Taken, stamp: u64) {
        // A unit counts in the window it is admitted in (a slice's too, whatever window the
        // store counted the slice in: one used past its window is over the next one's L).
        let window = self.now / WINDOW_US;
        self.from_slices += u64::from(slice.is_some());
        *self.used.entry(window).or_insert(0) += cost;
        let id = self.stamps.len();
        let stamp = if self.real_time { self.now } else { stamp };
        self.stamps.push((stamp, cost, true));
        self.servers[server].admitted.push(Admitted { window, cost, slice, taken, id });
    }

    fn run(&mut self, step: Step) {
        match step {
            Step::Requests { server, n, cost } => {
                for _ in 0..n {
                    let c = check(self.algorithm, cost);
                    let local = self.local(server);
                    let take = self.servers[server].slices.take(ID, &c, SERVERS as u64, local);
                    if let Some((k, epoch)) = take.fetch {
                        let asked = slice_check(&c, k, take.after);
                        let (life, sent) = (self.lives[server], self.now);
                        self.asked.push(Asked { server, life, sent, check: asked, epoch, outcome: None });
                    }
                    if let Some(d) = take.wait {
                        assert!(!d.allowed && d.retry_after().is_some(), "a slice's wait says when");
                        self.waited += 1;
                        continue;
                    }
                    match take.unit {
                        Some(SliceUnit { slice, decision: d, taken }) => {
                            assert!(d.allowed);
                            // A bucket's unit: admitted at `reset_after` before the TAT it
                            // left, on its reading of the store's clock.
                            let stamp = if slotted(self.algorithm) {
                                let at = taken.at - u64::try_from(d.reset_after().as_micros()).unwrap();
                                assert_eq!(d.decided_at_micros(), at, "stamped with its reading");
                                at
                            } else {
                                self.now
                            };
                            self.admit(server, cost, Some(slice), taken, stamp);
                        }
                        None => {
                            let o = self.store.check_at(std::slice::from_ref(&c), self.now).unwrap().remove(0);
                            self.servers[server].slices.learn(ID, &c, &o, local, local);
                            if let Some(taken) = o.taken {
                                assert_eq!(o.decision.decided_at_micros(), self.now, "the store's reading");
                                self.admit(server, cost, None, taken, self.now);
                            }
                        }
                    }
                }
            }
            Step::Run { pick } => {
                let now = self.now;
                if let Some(a) = self.asked.iter_mut().filter(|a| a.outcome.is_none()).nth(pick) {
                    let o = self.store.check_at(std::slice::from_ref(&a.check), now).unwrap().remove(0);
                    a.outcome = Some(o);
                }
            }
            Step::Answer { pick } => {
                let Some(i) =
                    self.asked.iter().enumerate().filter(|(_, a)| a.outcome.is_some()).nth(pick).map(|(i, _)| i)
                else {
                    return;
                };
                let a = self.asked.remove(i);
                if a.life != self.lives[a.server] {
                    return; // its server died: the units are stranded in the store
                }
                let s = &self.servers[a.server];
                let (asked, local) = (a.sent + s.offset, self.local(a.server));
                let o = a.outcome.expect("ran");
                if let Some(refund) = s.slices.install(ID, a.epoch, &a.check, &o, asked, local) {
                    self.store.refund_at(&[refund], self.now);
                }
            }
            Step::Advance { us } => self.now += us,
            Step::GiveBack { server, pick } => {
                let s = &mut self.servers[server];
                if s.admitted.is_empty() {
                    return;
                }
                let u = s.admitted.swap_remove(pick % s.admitted.len());
                let back = u.slice.as_ref().is_some_and(|slice| slice.give_back(u.cost, u.taken));
                if !back {
                    let refund = match &u.slice {
                        Some(slice) => slice.refund(u.cost, u.taken),
                        None => Refund { check: check(self.algorithm, u.cost), taken: u.taken },
                    };
                    self.store.refund_at(&[refund], self.now);
                }
                // Given back: it no longer counts against the bucket's bound (a give-back
                // the algorithm drops leaves its slot used, which only helps the bound).
                self.stamps[u.id].2 = false;
                // Given back while its window lasts, a unit may be admitted again in it.
                if u.window == self.now / WINDOW_US {
                    *self.used.get_mut(&u.window).expect("counted") -= u.cost;
                }
            }
            Step::Sweep { server, prune } => {
                let local = self.local(server);
                let refunds = self.servers[server].slices.sweep(local, prune);
                self.store.refund_at(&refunds, self.now);
            }
            Step::Kill { server } => {
                self.lives[server] += 1;
                let s = &mut self.servers[server];
                s.slices = Slices::new(100);
                // What it admitted stays admitted; nothing of it comes back.
                s.admitted.clear();
                self.asked.retain(|a| a.server != server || a.outcome.is_some());
            }
        }
    }

    fn never_over(&self) -> Result<(), TestCaseError> {
        if slotted(self.algorithm) {
            return self.within_the_bucket();
        }
        for (w, used) in &self.used {
            prop_assert!(*used <= LIMIT, "window {} used {} > {}", w, used, LIMIT);
        }
        Ok(())
    }

    /// A bucket's bound on the admission timeline: for the admissions that count, sorted
    /// by the clock reading their decisions used, `t_1 <= … <= t_m`, every run `i..=j`
    /// holds at most `B + r·(t_j - t_i)` units (`r = 1/T`): `units·T - (t_j - t_i) <= B·T`.
    fn within_the_bucket(&self) -> Result<(), TestCaseError> {
        let q = quota();
        let (t, span) = (q.emission_interval_micros(), q.burst_size() * q.emission_interval_micros());
        let mut live: Vec<(u64, u64)> = self.stamps.iter().filter(|s| s.2).map(|s| (s.0, s.1)).collect();
        live.sort_unstable();
        // With P_k the units of the first k: (P_j·T - t_j) - (P_{i-1}·T - t_i) <= B·T for
        // every i <= j; `least` is the smallest P_{i-1}·T - t_i so far.
        let (t, span) = (i128::from(t), i128::from(span));
        let (mut units, mut least) = (0i128, i128::MAX);
        for &(at, cost) in &live {
            let at = i128::from(at);
            least = least.min(units * t - at);
            units += i128::from(cost);
            let run = units * t - at - least;
            prop_assert!(run <= span, "a run ending at {} holds {} µs of slots past r·Δ: over B·T = {}", at, run, span);
        }
        Ok(())
    }
}

const ID: RuleId = 7;

fn fleet_never_over(algorithm: Algorithm, offsets: &[u64], steps: Vec<Step>) -> Result<u64, TestCaseError> {
    fleet_never_over_on(algorithm, offsets, steps, false)
}

fn fleet_never_over_on(
    algorithm: Algorithm,
    offsets: &[u64],
    steps: Vec<Step>,
    real_time: bool,
) -> Result<u64, TestCaseError> {
    let mut fleet = Fleet::new(algorithm, offsets);
    fleet.real_time = real_time;
    for step in steps {
        fleet.run(step);
        fleet.never_over()?;
    }
    Ok(fleet.from_slices)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn a_fixed_window_fleet_is_never_over(
        offsets in proptest::collection::vec(0..1_000_000_000u64, SERVERS),
        steps in proptest::collection::vec(step(), 50..400),
    ) {
        fleet_never_over(Algorithm::FixedWindow, &offsets, steps)?;
    }

    #[test]
    fn a_sliding_window_counter_fleet_is_never_over(
        offsets in proptest::collection::vec(0..1_000_000_000u64, SERVERS),
        steps in proptest::collection::vec(step(), 50..400),
    ) {
        fleet_never_over(Algorithm::SlidingWindowCounter, &offsets, steps)?;
    }

    #[test]
    fn a_gcra_fleet_keeps_the_bucket_bound(
        offsets in proptest::collection::vec(0..1_000_000_000u64, SERVERS),
        steps in proptest::collection::vec(step(), 50..400),
    ) {
        fleet_never_over(Algorithm::Gcra, &offsets, steps)?;
    }

    /// Review: the same fleet, the bound checked on the store's real clock at each
    /// admission (the model's time) rather than on the servers' readings of it.
    #[test]
    fn review_a_gcra_fleet_keeps_the_bucket_bound_in_real_time(
        offsets in proptest::collection::vec(0..1_000_000_000u64, SERVERS),
        steps in proptest::collection::vec(step(), 50..400),
    ) {
        fleet_never_over_on(Algorithm::Gcra, &offsets, steps, true)?;
    }

    #[test]
    fn a_token_bucket_fleet_keeps_the_bucket_bound(
        offsets in proptest::collection::vec(0..1_000_000_000u64, SERVERS),
        steps in proptest::collection::vec(step(), 50..400),
    ) {
        fleet_never_over(Algorithm::TokenBucket, &offsets, steps)?;
    }
}

/// The bucket's model is not vacuous either: at the edge (the burst spent), slices are
/// granted past it, spent at their slots, and requests before their slot wait.
#[test]
fn the_bucket_model_spends_slices_at_the_edge() {
    let mut steps = Vec::new();
    for round in 0..60 {
        for server in 0..SERVERS {
            steps.push(Step::Requests { server, n: 15, cost: 1 });
        }
        steps.push(Step::Run { pick: 0 });
        steps.push(Step::Answer { pick: 0 });
        // A unit admitted long ago given back: lost, as a request's (its slot is not the
        // last one taken); taken back, it would make room that does not exist.
        if round % 4 == 3 {
            steps.push(Step::GiveBack { server: round % SERVERS, pick: 0 });
        }
        steps.push(Step::Advance { us: 5_000 });
    }
    let mut fleet = Fleet::new(Algorithm::Gcra, &[0, 5, 9]);
    for step in steps {
        fleet.run(step);
        fleet.never_over().unwrap();
    }
    // 2,700 arrivals in 300 ms against 600 + 900 (the burst and 300 ms of rate).
    let admitted: u64 = fleet.stamps.iter().filter(|s| s.2).map(|s| s.1).sum();
    assert!(fleet.from_slices > 500, "{} units from slices", fleet.from_slices);
    assert!(fleet.waited > 100, "{} waited for their slot", fleet.waited);
    assert!(admitted > 1_200, "{admitted} admitted of 1,500 the bucket allows");
}

/// The model test is not vacuous: slices are asked, granted and spent in it.
#[test]
fn the_model_spends_slices() {
    let mut steps = Vec::new();
    for _ in 0..20 {
        steps.push(Step::Requests { server: 0, n: 30, cost: 1 });
        steps.push(Step::Run { pick: 0 });
        steps.push(Step::Answer { pick: 0 });
        steps.push(Step::Advance { us: 5_000 });
    }
    let from_slices = fleet_never_over(Algorithm::FixedWindow, &[0, 5, 9], steps).unwrap();
    assert!(from_slices > 300, "{from_slices} units from slices");
}

/// A slice's units are admitted only while its window surely lasts: counted from when it
/// was asked, not answered (a slow answer shortens its life, never moves it past the
/// window's end on the store's clock).
#[test]
fn a_slice_ends_with_its_window_counted_from_when_it_was_asked() {
    let s = Slices::new(10);
    let c = check(Algorithm::FixedWindow, 1);
    // Demand: 40 units in one period.
    for i in 0..40 {
        let _ = s.take(ID, &c, 1, 1_000 + i);
    }
    // Asked at local 2,000; the store ran it at its 190,000 (10 ms before its window's end
    // at 200,000); the answer came at local 9,000.
    let mut k = c.clone();
    k.params.cost = 20;
    let o = Outcome { decision: Decision::allow(LIMIT, 500, 10_000, 0), taken: Some(Taken { at: 190_000 }) };
    assert!(s.install(ID, 0, &k, &o, 2_000, 9_000).is_none());
    // Until 2,000 + 10,000 locally: 11,999 admits, 12,000 does not.
    assert!(s.take(ID, &c, 1, 11_999).unit.is_some());
    assert!(s.take(ID, &c, 1, 12_000).unit.is_none());
    // The sweep at 12,000 closes it; its window has surely ended only at 9,000 + 10,000:
    // what it left goes back to the store.
    let refunds = s.sweep(12_000, false);
    assert_eq!(refunds.len(), 1);
    assert_eq!((refunds[0].check.params.cost, refunds[0].taken.at), (19, 190_000));
    assert_eq!(s.stats.given_back.load(Ordering::Relaxed), 19);
}

/// Below [`MIN_UNITS`] of demand, or of a fair part of what remains, no slice is asked.
#[test]
fn no_slice_where_it_does_not_pay() {
    let s = Slices::new(10);
    let c = check(Algorithm::FixedWindow, 1);
    for i in 0..15 {
        assert!(s.take(ID, &c, 3, 1_000 + i).fetch.is_none(), "15 units of demand");
    }
    let (k, _) = s.take(ID, &c, 3, 1_020).fetch.expect("16 units of demand");
    assert_eq!(k, 16);
    // The store says 40 remain: a third of it is below 16 — the edge.
    let mut asked = c.clone();
    asked.params.cost = k;
    let refused = Outcome { decision: Decision::reject(LIMIT, 40, 1_000, Some(1_000)), taken: None };
    assert!(s.install(ID, 0, &asked, &refused, 1_020, 1_100).is_none());
    for i in 0..50 {
        assert!(s.take(ID, &c, 3, 1_200 + i).fetch.is_none(), "at the edge");
    }
    assert!(!pays(Quota::per_second(479), 3), "16 a server per 100 ms needs 480 a second");
    assert!(pays(Quota::per_second(480), 3));
}

/// A slice whose answer comes after its life (the store was slow): its units go back at
/// once; one never answered (sent, outcome unknown) is counted stranded, and not asked
/// again before a period passes.
#[test]
fn a_late_slice_goes_back_and_an_unanswered_one_is_stranded() {
    let s = Slices::new(10);
    let c = check(Algorithm::FixedWindow, 1);
    for i in 0..40 {
        let _ = s.take(ID, &c, 1, 1_000 + i);
    }
    let mut k = c.clone();
    k.params.cost = 30;
    let o = Outcome { decision: Decision::allow(LIMIT, 500, 100_000, 0), taken: Some(Taken { at: 100_000 }) };
    // Asked at 2,000, answered at 2,000 + 100 ms: too late to use.
    let refund = s.install(ID, 0, &k, &o, 2_000, 102_000).expect("given back at once");
    assert_eq!((refund.check.params.cost, refund.taken.at), (30, 100_000));
    assert_eq!(s.stats.given_back.load(Ordering::Relaxed), 30);
    let take = s.take(ID, &c, 1, 102_001);
    assert!(take.unit.is_none());
    // Asked again, never answered.
    let (asked, _) = take.fetch.expect("asked again");
    k.params.cost = asked;
    s.not_granted(ID, 0, &k, true, 103_000);
    assert_eq!(s.stats.stranded.load(Ordering::Relaxed), asked);
    for i in 0..40 {
        assert!(s.take(ID, &c, 1, 150_000 + i).fetch.is_none(), "asked again at once after an unknown outcome");
    }
    assert!(s.take(ID, &c, 1, 203_000).fetch.is_some(), "never asked again");
}

/// A slice asked for before a reset (or block) of its key on this server and answered
/// after it is not opened: the store granted it from the state the reset forgot (a
/// review found it opened, admitting on the fresh state).
#[test]
fn a_slice_asked_before_a_reset_and_answered_after_it_is_not_opened() {
    let s = Slices::new(10);
    let c = check(Algorithm::FixedWindow, 1);
    let mut fetch = None;
    for i in 0..40 {
        fetch = fetch.or(s.take(ID, &c, 1, 1_000 + i).fetch);
    }
    let (k, epoch) = fetch.expect("a slice asked for");
    let mut asked = c.clone();
    asked.params.cost = k;
    // The store grants it (at its 5,000), then the reset forgets the key's state; this
    // server voids its slices of the key at local 2,100, before the answer arrives.
    let refunds = s.void(ID, &c.key, 2_100);
    assert!(refunds.is_empty());
    let o = Outcome { decision: Decision::allow(LIMIT, 500, 195_000, 0), taken: Some(Taken { at: 5_000 }) };
    let _ = s.install(ID, epoch, &asked, &o, 1_050, 2_200);
    let after = s.take(ID, &c, 1, 2_300);
    assert!(after.unit.is_none(), "a slice of the state the reset forgot admits after the reset");
}

/// A bucket's slice (1,000 a second, burst 10, so `T` = 1 ms and `B·T` = 10 ms) granted at
/// the edge: its units are admitted at their slots, exactly as a request's check would be
/// on the store, and one that comes early waits exactly until its slot.
fn edge_slice() -> (Slices, Check) {
    let s = Slices::new(10);
    let mut c = check(Algorithm::Gcra, 1);
    c.params.quota = Quota::per_second(1_000).burst(10);
    for i in 0..40 {
        let _ = s.take(ID, &c, 1, 1_000 + i);
    }
    // Asked at local 5,000; the store, at its 1,000,000, found the TAT at the edge
    // (1,010,000: the burst used) and reserved 50 slots past it: TAT 1,060,000.
    let k = slice_check(&c, 50, 0);
    assert_eq!(k.params.ahead_us, REACH_US);
    let o = Outcome { decision: Decision::allow_units(1_000, 0, 1_000, 60_000), taken: Some(Taken { at: 1_060_000 }) };
    assert!(s.install(ID, 0, &k, &o, 5_000, 6_000).is_none());
    (s, c)
}

#[test]
fn a_bucket_slice_admits_each_unit_at_its_slot() {
    let (s, c) = edge_slice();
    // Unit j's slot ends at 1,011,000 + j ms: admitted from 10 ms before on the store's
    // clock, 1,001,000 + j ms. This server reads that clock counted from when the answer
    // came (6,000 here stands for the store's 1,000,000 at the latest): 7,000 + j ms here,
    // a round trip later than the store could, never earlier.
    let wait = s.take(ID, &c, 1, 6_500).wait.expect("before its slot");
    assert_eq!(wait.retry_after(), Some(Duration::from_micros(500)));
    let first = s.take(ID, &c, 1, 7_000).unit.expect("at its slot");
    assert_eq!(first.taken.at, 1_011_000);
    assert_eq!(first.decision.reset_after(), Duration::from_micros(10_000), "the burst's span, as the store says");
    assert_eq!(first.decision.decided_at_micros(), 1_001_000, "stamped with the reading that is never ahead");
    let wait = s.take(ID, &c, 1, 7_000).wait.expect("the next slot");
    assert_eq!(wait.retry_after(), Some(Duration::from_millis(1)));
    assert_eq!(s.take(ID, &c, 1, 8_000).unit.expect("its slot").taken.at, 1_012_000);
}

#[test]
fn a_bucket_slice_takes_a_unit_back_only_while_it_is_the_last() {
    let (s, c) = edge_slice();
    let a = s.take(ID, &c, 1, 7_000).unit.unwrap();
    let b = s.take(ID, &c, 1, 8_000).unit.unwrap();
    // `a` is not the last: lost, as a request's refund would be (counted stranded); its
    // slot is not reused.
    assert!(a.slice.give_back(1, a.taken), "nothing owed to the store");
    assert!(s.take(ID, &c, 1, 8_000).wait.is_some(), "a's give-back made room");
    // `b` is: its slot comes back.
    assert!(b.slice.give_back(1, b.taken));
    assert_eq!(s.take(ID, &c, 1, 8_000).unit.expect("b's slot again").taken.at, 1_012_000);
    let _ = s.sweep(5_000 + LAPSE_US, false);
    assert_eq!(s.stats.stranded.load(Ordering::Relaxed), 1, "a's slot");
}

#[test]
fn a_bucket_slice_gives_back_its_last_slots_and_strands_the_ones_time_passed() {
    let (s, c) = edge_slice();
    let _ = s.take(ID, &c, 1, 7_000).unit.unwrap();
    // 20 ms later (the store's 1,021,000 to 1,022,000): the 11 slots the clock may have
    // passed unused are stranded; the unit takes the slot that surely starts after now.
    let late = s.take(ID, &c, 1, 27_000).unit.unwrap();
    assert_eq!(late.taken.at, 1_023_000);
    let refunds = s.sweep(5_000 + LAPSE_US, false);
    assert_eq!(refunds.len(), 1);
    // 37 slots left at the end: the refund of GCRA's commit that left 1,060,000.
    assert_eq!((refunds[0].check.params.cost, refunds[0].taken.at), (37, 1_060_000));
    assert_eq!(refunds[0].check.params.ahead_us, 0);
    assert_eq!(s.stats.given_back.load(Ordering::Relaxed), 37);
    assert_eq!(s.stats.stranded.load(Ordering::Relaxed), 11);
}

// ---- review (issue 43) ----

/// A bucket's bound checked on `(stamp, cost)` admissions for a quota: the worst run's µs
/// of slots past `B·T` (≤ 0: holds).
fn review_past_the_bound(q: Quota, mut live: Vec<(u64, u64)>) -> i128 {
    let (t, span) =
        (i128::from(q.emission_interval_micros()), i128::from(q.burst_size() * q.emission_interval_micros()));
    live.sort_unstable();
    let (mut units, mut least, mut worst) = (0i128, i128::MAX, i128::MIN);
    for &(at, cost) in &live {
        let at = i128::from(at);
        least = least.min(units * t - at);
        units += i128::from(cost);
        worst = worst.max(units * t - at - least - span);
    }
    worst
}

/// A swap that changes only a bucket rule's burst keeps the slices' name (`slice_id` hashes
/// the limit and the period, not the burst): the slices taken under the old burst go on
/// admitting under the new quota with the old `B·T`, though "a slice holds only under the
/// quota it was taken under".
#[test]
fn review_a_swap_to_a_smaller_burst_does_not_reach_open_bucket_slices() {
    let big = Quota::per_second(1_000).burst(100);
    let small = Quota::per_second(1_000).burst(10);
    let (old_id, new_id) = (slice_id(1, big), slice_id(1, small));
    let s = Slices::new(10);
    let mut c = check(Algorithm::Gcra, 1);
    c.params.quota = big;
    for i in 0..40 {
        let _ = s.take(old_id, &c, 1, 1_000 + i);
    }
    // The store, at its 1,000,000, on an idle key: 50 slots from now, TAT 1,050,000.
    let k = slice_check(&c, 50, 0);
    let o = Outcome { decision: Decision::allow_units(1_000, 50, 1_000, 50_000), taken: Some(Taken { at: 1_050_000 }) };
    assert!(s.install(old_id, 0, &k, &o, 5_000, 6_000).is_none());
    // The swap: the same rule, burst 10.
    let mut swapped = c.clone();
    swapped.params.quota = small;
    let mut live = Vec::new();
    for _ in 0..50 {
        if let Some(u) = s.take(new_id, &swapped, 1, 6_000).unit {
            live.push((u.decision.decided_at_micros(), 1));
        }
    }
    let past = review_past_the_bound(small, live.clone());
    assert!(
        past <= 0,
        "old_id == new_id: {}; {} units admitted at one instant under burst 10: {past} µs of slots past B·T",
        old_id == new_id,
        live.len()
    );
}

/// A request whose cost is above the burst is refused by the store for good
/// (`retry_after` None: no wait makes it fit), as a per-request GCRA says; a bucket's
/// slice says "wait" instead, with a retry that never comes true.
#[test]
fn review_a_cost_above_the_burst_is_never_told_to_wait() {
    let (s, mut c) = edge_slice();
    c.params.cost = 11; // B = 10
    let store = crate::algorithm::gcra::Gcra::default().decide(&c.params, 1_000_000);
    assert!(!store.allowed && store.retry_after().is_none(), "the store: never");
    let mut now = 6_000;
    let mut told = Vec::new();
    while let Some(w) = s.take(ID, &c, 1, now).wait {
        let retry = u64::try_from(w.retry_after().expect("a wait says when").as_micros()).unwrap();
        told.push(retry);
        now += retry;
        if told.len() > 100 {
            break;
        }
    }
    assert!(
        told.is_empty(),
        "the slice told it to retry {} times ({:?}…), the store says never",
        told.len(),
        &told[..told.len().min(5)]
    );
}

/// A slice answered late: asked at real time R − 20 ms (the request queued for a pool's
/// connection, a pipeline, the network), run by the store at R, right after the key's
/// burst was spent at R by requests. The server maps its clock to the store's from when
/// it *asked*, so at R it reads the store's clock as R + 20 ms: it admits a burst's worth
/// of units at once whose slots all end past R + B·T, which no request's check at R
/// would be given. On the decisions' stamps (R + 20 ms) the bound holds; on the real
/// clock, at the instant R, 2·B units were admitted.
#[test]
fn review_a_late_answered_bucket_slice_admits_past_the_burst_in_real_time() {
    const R: u64 = 1_000_000_000;
    let q = Quota::per_second(1_000).burst(10); // T = 1 ms, B·T = 10 ms
    let store = MemoryStore::new();
    let mut c = check(Algorithm::Gcra, 1);
    c.params.quota = q;
    let s = Slices::new(10);
    for i in 0..40 {
        let _ = s.take(ID, &c, 1, R - 30_000 + i);
    }
    let (mut real, mut stamped) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        let o = store.check_at(std::slice::from_ref(&c), R).unwrap().remove(0);
        assert!(o.taken.is_some(), "the burst");
        real.push((R, 1));
        stamped.push((o.decision.decided_at_micros(), 1));
    }
    let k = slice_check(&c, 30, 0);
    let o = store.check_at(std::slice::from_ref(&k), R).unwrap().remove(0);
    assert!(o.taken.is_some(), "a slice at the edge");
    assert!(s.install(ID, 0, &k, &o, R - 20_000, R).is_none());
    while let Some(u) = s.take(ID, &c, 1, R).unit {
        real.push((R, 1));
        stamped.push((u.decision.decided_at_micros(), 1));
    }
    assert!(review_past_the_bound(q, stamped) <= 0, "the stamps' bound");
    let past = review_past_the_bound(q, real.clone());
    assert!(
        past <= 0,
        "{} units admitted at the real instant R under burst 10: {past} µs of slots past B·T",
        real.len()
    );
}

/// Every slot of a bucket's slice ends admitted, given back or reported stranded (issue
/// 43's "the shortfall at most the stranded units reported"): a give-back a later unit
/// made too late to take (`give_back` says `true`, as if taken back) loses its slot with
/// no count anywhere — what a request refused by another rule does at the edge, where
/// other requests take slots between its take and its give-back.
#[test]
fn review_a_give_back_too_late_for_its_slice_is_counted_somewhere() {
    let (s, c) = edge_slice();
    let a = s.take(ID, &c, 1, 7_000).unit.unwrap();
    let _b = s.take(ID, &c, 1, 8_000).unit.unwrap();
    assert!(a.slice.give_back(1, a.taken), "taken back (as the caller sees it)");
    let refunds = s.sweep(5_000 + LAPSE_US, false);
    let back: u64 = refunds.iter().map(|r| r.check.params.cost).sum();
    let stranded = s.stats.stranded.load(Ordering::Relaxed);
    let kept = 1; // b
    assert_eq!(kept + back + stranded, 50, "kept {kept} + given back {back} + stranded {stranded} of the slice's 50");
}
