//! [`Disciplined`]: wall-clock time from a fast monotonic counter, re-anchored to the wall
//! clock without ever stepping back.
//!
//! The output is a piecewise-linear function of the monotonic counter. Each piece (a
//! [`Segment`]) starts where the previous one would be at that moment, so the function
//! is continuous, and runs at a rate between ½ and 2: it never decreases. At most once per
//! [`Tuning::sync`] a reader compares the output with the wall clock and starts a new
//! piece that spreads the difference over [`Tuning::slew`] (a difference of more than
//! [`Tuning::step`] ahead is taken at once: forward only).
//!
//! Readers never lock: the two latest pieces sit behind a sequence lock. A new piece
//! starts [`Tuning::lead`] after the counter reading it was computed from, and readers
//! before its start still use the previous piece, so a reader that read the counter
//! before the new piece was published, and one that reads it after, agree on one
//! function of the counter.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use super::wall_micros;

/// Where time comes from: the wall clock, and a monotonic counter.
pub(crate) trait Source: Send + Sync + 'static {
    /// Wall-clock µs since the Unix epoch (may jump either way).
    fn wall_micros(&self) -> u64;
    /// Monotonic ns since an arbitrary origin (may run at a slightly wrong rate).
    fn mono_nanos(&self) -> u64;
}

/// The system's sources: `SystemTime`, and the time-stamp counter through `quanta`.
pub(crate) struct Tsc {
    clock: quanta::Clock,
    origin: u64,
}

impl Tsc {
    pub(crate) fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        Self { clock, origin }
    }
}

impl Source for Tsc {
    fn wall_micros(&self) -> u64 {
        wall_micros()
    }

    fn mono_nanos(&self) -> u64 {
        // A raw counter read and one scaling.
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }
}

/// How a [`Disciplined`] clock follows the wall clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tuning {
    /// How often (ns of the counter) the output is compared with the wall clock.
    pub(crate) sync: u64,
    /// Over how long (µs of output) a difference is spread.
    pub(crate) slew: u64,
    /// A difference ahead of the output larger than this (µs) is stepped, not spread.
    pub(crate) step: u64,
    /// How far after its counter reading (ns) a new piece starts.
    pub(crate) lead: u64,
}

impl Tuning {
    pub(crate) const DEFAULT: Tuning =
        Tuning { sync: 1_000_000_000, slew: 1_000_000, step: 1_000_000, lead: 1_000_000 };
}

/// One piece of the output: from counter reading `start` (ns) on, `out` (µs) plus the µs
/// elapsed, plus a correction at `rate` (in 2⁻³² per µs, between -½ and 1) over the first
/// `slew` µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    start: u64,
    out: u64,
    rate: i64,
}

impl Segment {
    /// `corr` µs spread over `slew` µs.
    fn spreading(start: u64, out: u64, corr: i64, slew: u64) -> Self {
        let rate = (i128::from(corr) << 32) / i128::from(slew.max(1));
        Self { start, out, rate: i64::try_from(rate).unwrap_or(0) }
    }

    /// The output at counter reading `mono` (at least `start`; earlier reads as `start`).
    /// Non-decreasing in `mono`: each µs adds 1 and the correction's floor moves by at
    /// least -1 (the rate is at least -½).
    fn at(&self, mono: u64, slew: u64) -> u64 {
        let elapsed = mono.saturating_sub(self.start) / 1_000;
        // A multiplication and a shift: no division on the read path. `min(slew)` keeps
        // the product within i64 (slew ≤ 2³⁰ µs, |rate| ≤ 2³²).
        let spread = (self.rate * i64::try_from(elapsed.min(slew)).unwrap_or(i64::MAX)) >> 32;
        self.out.saturating_add(elapsed).saturating_add_signed(spread)
    }
}

/// The two latest pieces behind a sequence lock: even `seq` is stable, odd is being
/// written.
struct Pieces {
    seq: AtomicU64,
    prev: [AtomicU64; 3],
    cur: [AtomicU64; 3],
    /// The counter reading (ns) from which the next reader re-anchors.
    next_sync: AtomicU64,
}

fn load(a: &[AtomicU64; 3]) -> Segment {
    Segment {
        start: a[0].load(Ordering::Relaxed),
        out: a[1].load(Ordering::Relaxed),
        #[allow(clippy::cast_possible_wrap, reason = "stored as the bits of an i64")]
        rate: a[2].load(Ordering::Relaxed) as i64,
    }
}

fn store(a: &[AtomicU64; 3], s: Segment) {
    a[0].store(s.start, Ordering::Relaxed);
    a[1].store(s.out, Ordering::Relaxed);
    #[allow(clippy::cast_sign_loss, reason = "stored as the bits of an i64")]
    a[2].store(s.rate as u64, Ordering::Relaxed);
}

/// Wall-clock µs from a monotonic counter, following the wall clock without stepping
/// back (see the module docs).
pub(crate) struct Disciplined<S> {
    source: S,
    tuning: Tuning,
    pieces: Pieces,
}

impl<S: Source> Disciplined<S> {
    pub(crate) fn new(source: S, tuning: Tuning) -> Self {
        assert!((1..=1 << 30).contains(&tuning.slew), "slew out of range");
        let first = Segment { start: source.mono_nanos(), out: source.wall_micros(), rate: 0 };
        let cell = |s: Segment| {
            let a = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
            store(&a, s);
            a
        };
        let pieces = Pieces {
            seq: AtomicU64::new(0),
            prev: cell(first),
            cur: cell(first),
            next_sync: AtomicU64::new(first.start.saturating_add(tuning.sync)),
        };
        Self { source, tuning, pieces }
    }

    /// µs since the Unix epoch; never less than an earlier reading.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        let p = &self.pieces;
        let mut spins = 0u32;
        loop {
            let seq = p.seq.load(Ordering::Acquire);
            if seq & 1 == 1 {
                // A re-anchor is being written (a few loads and stores long).
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
            let cur = load(&p.cur);
            let mono = self.source.mono_nanos();
            // The previous piece only in the `lead` after a re-anchor.
            let piece = if mono >= cur.start { cur } else { load(&p.prev) };
            fence(Ordering::Acquire);
            if p.seq.load(Ordering::Relaxed) != seq {
                continue;
            }
            let out = piece.at(mono, self.tuning.slew);
            if mono >= p.next_sync.load(Ordering::Relaxed) {
                self.sync(seq);
            }
            return out;
        }
    }

    /// Starts a new piece, if no other reader is doing it: continuous with the current
    /// one, spreading (or, forward only, stepping) its difference with the wall clock.
    fn sync(&self, seq: u64) {
        let p = &self.pieces;
        if p.seq.compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return;
        }
        fence(Ordering::Release);
        // Read after the sequence turned odd: a reader whose counter reading is later
        // than this one retries, and then sees the new piece.
        let mono = self.source.mono_nanos();
        if mono >= p.next_sync.load(Ordering::Relaxed) {
            let t = self.tuning;
            let cur = load(&p.cur);
            let start = mono + t.lead;
            let base = cur.at(start, t.slew);
            let target = self.source.wall_micros().saturating_add(t.lead / 1_000);
            let ahead = i128::from(target) - i128::from(base);
            let slew = i128::from(t.slew);
            let next = if ahead > i128::from(t.step) {
                Segment { start, out: target, rate: 0 }
            } else {
                // Between half and twice the rate: the output never decreases.
                let corr = ahead.clamp(-slew / 2, slew);
                Segment::spreading(start, base, i64::try_from(corr).unwrap_or(0), t.slew)
            };
            store(&p.prev, cur);
            store(&p.cur, next);
            p.next_sync.store(mono.saturating_add(t.sync), Ordering::Relaxed);
        }
        p.seq.store(seq + 2, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicI64;
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;

    const SEC_NS: u64 = 1_000_000_000;
    const T0: u64 = 1_700_000_000_000_000;

    /// A source under the test's control: the counter in ns, the wall clock its own.
    #[derive(Default)]
    struct Fake {
        mono: AtomicU64,
        wall: AtomicU64,
    }

    impl Source for Arc<Fake> {
        fn wall_micros(&self) -> u64 {
            self.wall.load(Ordering::SeqCst)
        }
        fn mono_nanos(&self) -> u64 {
            self.mono.load(Ordering::SeqCst)
        }
    }

    fn fake() -> (Arc<Fake>, Disciplined<Arc<Fake>>) {
        let f = Arc::new(Fake { mono: AtomicU64::new(5 * SEC_NS), wall: AtomicU64::new(T0) });
        let clock = Disciplined::new(f.clone(), Tuning::DEFAULT);
        (f, clock)
    }

    /// Both sources move on by `wall_us`; the counter `ppm` parts per million faster.
    fn run(f: &Fake, wall_us: u64, ppm: i64) {
        f.wall.fetch_add(wall_us, Ordering::SeqCst);
        let ns = i128::from(wall_us) * 1_000 * (1_000_000 + i128::from(ppm)) / 1_000_000;
        f.mono.fetch_add(u64::try_from(ns).unwrap(), Ordering::SeqCst);
    }

    /// Reads the clock after each of `steps` × 10 ms at the true rate, asserting it never
    /// goes back from `last`; the last reading.
    fn follow(f: &Fake, clock: &Disciplined<Arc<Fake>>, mut last: u64, steps: usize) -> u64 {
        for _ in 0..steps {
            run(f, 10_000, 0);
            let now = clock.now();
            assert!(now >= last, "{last} -> {now}");
            last = now;
        }
        last
    }

    #[test]
    fn a_fast_counter_stays_within_milliseconds_of_the_wall_clock() {
        // 1% fast, read every 10 ms for an hour: without re-anchoring the output would
        // be 36 s ahead.
        let (f, clock) = fake();
        let mut last = clock.now();
        for i in 0..360_000 {
            run(&f, 10_000, 10_000);
            let now = clock.now();
            assert!(now >= last, "stepped back at {i}: {last} -> {now}");
            last = now;
            let wall = f.wall_micros();
            if i > 300 {
                assert!(now.abs_diff(wall) <= 25_000, "at {i}: {now} vs wall {wall}");
            }
        }
    }

    #[test]
    fn a_wall_clock_stepped_back_is_followed_slowly_and_never_backwards() {
        let (f, clock) = fake();
        run(&f, 10 * 1_000_000, 0);
        let before = clock.now();
        f.wall.fetch_sub(5_000_000, Ordering::SeqCst); // NTP steps the wall clock back 5 s
        let last = follow(&f, &clock, before, 2_000);
        // 20 s on: at half speed, 5 s behind is made up within about 10 s.
        assert!(last.abs_diff(f.wall_micros()) <= 2_000, "{last} vs {}", f.wall_micros());
        assert!(last - before >= 10_000_000, "time moved at least at half speed: {}", last - before);
    }

    #[test]
    fn a_wall_clock_stepped_forward_is_followed_at_once() {
        let (f, clock) = fake();
        run(&f, 2_000_000, 0);
        f.wall.fetch_add(3_600_000_000, Ordering::SeqCst); // an hour ahead (a resumed VM)
        let last = follow(&f, &clock, clock.now(), 300);
        assert!(last.abs_diff(f.wall_micros()) <= 2_000, "{last} vs {}", f.wall_micros());
    }

    #[test]
    fn readers_on_two_threads_never_see_time_go_back() {
        // The real counter, a wall clock that swings ±40 ms around it, and a re-anchor
        // every 50 µs: the pieces change under the readers all the time.
        struct Swinging {
            tsc: Tsc,
            swing: AtomicI64,
        }
        impl Source for Arc<Swinging> {
            fn wall_micros(&self) -> u64 {
                let s = self.swing.fetch_add(1, Ordering::Relaxed);
                let offset = if s % 2 == 0 { 40_000 } else { -40_000 };
                T0.saturating_add_signed(offset + i64::try_from(self.tsc.mono_nanos() / 1_000).unwrap())
            }
            fn mono_nanos(&self) -> u64 {
                self.tsc.mono_nanos()
            }
        }
        let source = Arc::new(Swinging { tsc: Tsc::new(), swing: AtomicI64::new(0) });
        let tuning = Tuning { sync: 50_000, slew: 1_000, step: 1_000_000, lead: 20_000 };
        let clock = Arc::new(Disciplined::new(source.clone(), tuning));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let clock = clock.clone();
                std::thread::spawn(move || {
                    let mut last = 0;
                    for i in 0..2_000_000 {
                        let now = clock.now();
                        assert!(now >= last, "read {i}: {last} -> {now}");
                        last = now;
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().unwrap();
        }
        assert!(source.swing.load(Ordering::Relaxed) > 100, "the clock was re-anchored");
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Both move on (ms); the counter `ppm` fast or slow.
        Run(u16, i16),
        /// The wall clock jumps by this many ms.
        Jump(i32),
        Read,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1u16..3_000, -20_000i16..20_000).prop_map(|(ms, ppm)| Op::Run(ms, ppm)),
            1 => (-5_000i32..5_000).prop_map(Op::Jump),
            4 => Just(Op::Read),
        ]
    }

    proptest! {
        /// Whatever the counter's rate and the wall clock's jumps: readings never go back;
        /// and after five quiet minutes (no jumps, true rate) the clock is back on the wall
        /// clock (at half speed, five minutes make up two and a half behind).
        #[test]
        fn never_back_and_back_on_time(ops in proptest::collection::vec(op(), 1..200)) {
            let (f, clock) = fake();
            let mut last = clock.now();
            for op in ops {
                match op {
                    Op::Run(ms, ppm) => run(&f, u64::from(ms) * 1_000, i64::from(ppm)),
                    Op::Jump(ms) => {
                        let w = f.wall_micros().saturating_add_signed(i64::from(ms) * 1_000);
                        f.wall.store(w, Ordering::SeqCst);
                    }
                    Op::Read => {}
                }
                let now = clock.now();
                prop_assert!(now >= last, "{} -> {}", last, now);
                last = now;
            }
            let last = follow(&f, &clock, last, 30_000);
            prop_assert!(last.abs_diff(f.wall_micros()) <= 2_000, "{} vs {}", last, f.wall_micros());
        }
    }
}
