//! [`Verdict`]: what a [`Limiter`](crate::Limiter) decided for one input.

use std::time::Duration;

use smallvec::SmallVec;

pub use crate::decision::DecidedBy;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::limiter::held::Held;
use crate::quota::Quota;
use crate::store::{RuleName, Taken};

/// What a [`Limiter`](crate::Limiter) decided for one input: allowed, rejected, or
/// undecided because the store failed (and then what the fail mode chose), with each
/// enforced rule's [`Decision`] and what its commit took.
///
/// ```
/// # async fn run(limiter: tollgate::Limiter<tollgate::MemoryStore, str>) {
/// let verdict = limiter.check("user-42").await;
/// if verdict.is_allowed() {
///     // go ahead
/// } else if let Some(wait) = verdict.retry_after() {
///     println!("over the limit, retry in {wait:?}");
/// }
/// # }
/// ```
///
/// `{}` says it in a line (`rejected by "api" for key "mallory" (decided by the store):
/// retry in 31 s`); `{:?}` lists what was decided, each rule with its decision.
pub struct Verdict {
    pub(crate) ruling: Ruling,
    /// The enforced rules that were decided, in the order of the rules.
    pub(crate) decided: SmallVec<[Decided; 1]>,
    /// Who decided the enforced rules (`None` when nothing was decided).
    pub(crate) source: Option<DecidedBy>,
    /// What the input holds (an allowed verdict): the units its rules took, enforced and
    /// shadow, and its charged rules' probes. Kept when the verdict is dropped; refunded
    /// by [`Limiter::refund`](crate::Limiter::refund).
    pub(crate) held: Held,
}

/// One enforced rule's decision: the rule's index, its name and the quota it decided
/// under (a tier's), and what it decided. What the headers and [`RuleDecision`] say, and
/// nothing more: a response future carries these (not the checks, whose keys only a
/// rejection shows: see [`Ruling::Rejected`]).
#[derive(Debug)]
pub(crate) struct Decided {
    pub(crate) rule: usize,
    pub(crate) name: RuleName,
    pub(crate) quota: Quota,
    pub(crate) decision: Decision,
    /// The units the check asked for: what a count-by-outcome rule gives back when the
    /// response's status does not count.
    pub(crate) cost: u64,
    /// A concurrency rule's decision (`Rule::concurrent`): never the one the rate-limit
    /// headers describe.
    pub(crate) permits: bool,
}

impl Decided {
    /// As [`RuleDecision`], its rule shown as `shown`.
    pub(crate) fn as_shown<'a>(&'a self, shown: &'a str, taken: Option<Taken>) -> RuleDecision<'a> {
        RuleDecision { rule: shown, quota: self.quota, decision: &self.decision, taken }
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Ruling {
    /// Every enforced rule accepted (or none applied).
    Allowed,
    /// At least one enforced rule rejected: `worst` (an index in `decided`) makes the
    /// caller wait longest (one that can never accept counts as longest; the last of
    /// equals), and `key` is the key it limits.
    Rejected { worst: usize, key: Key },
    /// The store could not decide; `closed`: a rule's fail mode refuses.
    Failed { error: StoreError, closed: bool },
}

/// One rule's decision within a [`Verdict`].
#[derive(Debug, Clone, Copy)]
pub struct RuleDecision<'a> {
    /// The rule's name.
    pub rule: &'a str,
    /// The quota it decided under (the tier's, for rules with a per-input quota).
    pub quota: Quota,
    /// What it decided.
    pub decision: &'a Decision,
    /// What its commit took (allowed verdicts only): the identity a refund needs.
    pub taken: Option<Taken>,
}

impl Verdict {
    /// A verdict with no decisions (allowed: no rule applied; or failed).
    pub(crate) fn empty(ruling: Ruling, held: Held) -> Self {
        Self { ruling, decided: SmallVec::new(), source: None, held }
    }

    /// Whether the caller may go ahead: every rule accepted (after waiting
    /// [`Verdict::delay`], for a leaky bucket), or the store failed and the fail mode is
    /// [`FailMode::Open`](crate::FailMode::Open).
    #[must_use]
    pub fn is_allowed(&self) -> bool {
        !matches!(self.ruling, Ruling::Rejected { .. } | Ruling::Failed { closed: true, .. })
    }

    /// Whether a rule rejected: the input is over a limit.
    #[must_use]
    pub fn is_rejected(&self) -> bool {
        matches!(self.ruling, Ruling::Rejected { .. })
    }

    /// The store's error when it could not decide (then [`Verdict::is_allowed`] says what
    /// the fail mode chose, and there are no decisions).
    #[must_use]
    pub fn store_error(&self) -> Option<&StoreError> {
        match &self.ruling {
            Ruling::Failed { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Who decided the enforced rules: the store, the fallback limiter, or the local cache
    /// of blocked keys (`None` when nothing was decided: no enforced rule applied — shadow
    /// rules only, or none — or the store failed and no fallback decided).
    #[must_use]
    pub fn decided_by(&self) -> Option<DecidedBy> {
        self.source
    }

    /// Each enforced rule's decision, in the order of the rules (none when the store
    /// failed, or when no rule applied).
    pub fn decisions(&self) -> impl Iterator<Item = RuleDecision<'_>> + '_ {
        (0..self.decided.len()).map(|i| self.at(i))
    }

    /// The index (in `decided`) of the rejecting rule that makes the caller wait longest.
    pub(crate) fn worst(&self) -> Option<usize> {
        match self.ruling {
            Ruling::Rejected { worst, .. } => Some(worst),
            _ => None,
        }
    }

    /// The index of the most restrictive rule: the worst rejecting one, else the one with
    /// the fewest units left.
    pub(crate) fn most(&self) -> Option<usize> {
        self.worst().or_else(|| fewest_left(&self.decided))
    }

    fn at(&self, i: usize) -> RuleDecision<'_> {
        let d = &self.decided[i];
        d.as_shown(&d.name, self.held.units.iter().find(|u| u.rule == d.rule).map(|u| u.refund.taken))
    }

    /// The rejecting rule that makes the caller wait longest.
    #[must_use]
    pub fn rejected_by(&self) -> Option<RuleDecision<'_>> {
        self.worst().map(|i| self.at(i))
    }

    /// The most restrictive rule: the one that rejected, else the one with the fewest
    /// units left. This is the rule the rate-limit headers describe.
    #[must_use]
    pub fn most_restrictive(&self) -> Option<RuleDecision<'_>> {
        self.most().map(|i| self.at(i))
    }

    /// When rejected: how long until the same input would be accepted if nobody else
    /// consumed anything (`None` when allowed, when undecided, and when the input can never
    /// be accepted, its cost being above a rule's capacity).
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        self.rejected_by().and_then(|r| r.decision.retry_after())
    }

    /// Leaky bucket rules: how long to wait before going ahead (zero otherwise).
    #[must_use]
    pub fn delay(&self) -> Duration {
        if !matches!(self.ruling, Ruling::Allowed) {
            return Duration::ZERO;
        }
        self.decided.iter().map(|d| d.decision.delay()).max().unwrap_or(Duration::ZERO)
    }
}

impl std::fmt::Debug for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        struct Rules<'a>(&'a Verdict);
        impl std::fmt::Debug for Rules<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_map().entries(self.0.decided.iter().map(|d| (d.name.as_str(), &d.decision))).finish()
            }
        }
        let mut s = f.debug_struct("Verdict");
        s.field("allowed", &self.is_allowed());
        if let Ruling::Rejected { worst, key } = &self.ruling {
            s.field("rejected_by", &self.decided[*worst].name.as_str()).field("key", key);
        }
        s.field("decided_by", &self.source).field("decisions", &Rules(self));
        if let Some(error) = self.store_error() {
            s.field("store_error", error);
        }
        s.finish_non_exhaustive()
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let by = match self.source {
            Some(DecidedBy::Store) => "the store",
            Some(DecidedBy::Fallback) => "the fallback (this server's share, while the store fails)",
            Some(DecidedBy::LocalCache) => "the blocked-key cache",
            Some(DecidedBy::Slice) => "a quota slice this server holds",
            None => "nobody",
        };
        match &self.ruling {
            Ruling::Rejected { worst, key } => {
                let d = &self.decided[*worst];
                write!(f, "rejected by {:?} for key ", d.name.as_str())?;
                if key.is_hashed() {
                    write!(f, "{key:?}")?;
                } else {
                    write!(f, "{:?}", String::from_utf8_lossy(&key.as_bytes()))?;
                }
                write!(f, " (decided by {by}): ")?;
                match d.decision.retry_after_secs() {
                    Some(s) => write!(f, "retry in {s} s"),
                    None => f.write_str("its cost can never pass"),
                }
            }
            Ruling::Failed { error, closed } => {
                let then = if *closed { "refused (fail closed)" } else { "passed (fail open)" };
                write!(f, "undecided, {then}: {error}")
            }
            Ruling::Allowed => match self.most() {
                Some(i) => {
                    let d = &self.decided[i];
                    let (name, left, limit) = (d.name.as_str(), d.decision.remaining(), d.decision.limit);
                    write!(f, "allowed by {by}: {name:?} has {left} of {limit} left")
                }
                None => f.write_str("allowed: no rule applied"),
            },
        }
    }
}

/// The index of the decision with the fewest units left (the first of equals).
/// Concurrency rules are not counted: they are never the one the headers describe.
pub(crate) fn fewest_left(decided: &[Decided]) -> Option<usize> {
    decided.iter().enumerate().filter(|(_, d)| !d.permits).min_by_key(|(_, d)| d.decision.remaining()).map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use crate::{Limiter, MemoryStore, Quota};

    fn user(u: &str) -> Option<crate::key::Key> {
        Some(u.into())
    }

    #[tokio::test]
    async fn a_verdict_reads_as_a_sentence_and_its_debug_lists_the_decisions() {
        let limiter = Limiter::builder(MemoryStore::new()).rule("api", Quota::per_minute(2), user).build().unwrap();
        let v = limiter.check("ada").await;
        assert_eq!(v.to_string(), "allowed by the store: \"api\" has 1 of 2 left");
        let _ = limiter.check("ada").await;
        let v = limiter.check("ada").await;
        let said = v.to_string();
        assert!(said.starts_with("rejected by \"api\" for key \"ada\" (decided by the store): retry in "), "{said}");
        let debug = format!("{v:?}");
        assert!(debug.starts_with("Verdict { allowed: false, rejected_by: \"api\""), "{debug}");
        assert!(debug.contains("decisions: {\"api\": Decision {") && !debug.contains("held"), "{debug}");
        let v = limiter.check_key("api", "bob", 3).await;
        assert!(v.to_string().ends_with("its cost can never pass"), "{v}");
    }
}
