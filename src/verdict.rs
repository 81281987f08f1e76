//! [`Verdict`]: what a [`Limiter`](crate::Limiter) decided for one input.

use std::time::Duration;

use smallvec::SmallVec;

use crate::store::{Check, Decisions};
use crate::{Decision, Quota, StoreError};

/// What a [`Limiter`](crate::Limiter) decided for one input: allowed, rejected, or
/// undecided because the store failed (and then what the fail mode chose), with each
/// enforced rule's [`Decision`].
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
#[derive(Debug, Clone)]
pub struct Verdict {
    pub(crate) state: State,
    /// The enforced rules' checks, with each one's rule index.
    pub(crate) checks: SmallVec<[Check; 2]>,
    pub(crate) rules: SmallVec<[usize; 2]>,
    /// One per check; empty when the store failed.
    pub(crate) decisions: Decisions,
}

#[derive(Debug, Clone)]
pub(crate) enum State {
    /// Every enforced rule accepted (or none applied).
    Allowed,
    /// At least one enforced rule rejected.
    Rejected,
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
}

impl Verdict {
    pub(crate) fn new(
        state: State,
        checks: SmallVec<[Check; 2]>,
        rules: SmallVec<[usize; 2]>,
        decisions: Decisions,
    ) -> Self {
        Self { state, checks, rules, decisions }
    }

    /// Whether the caller may go ahead: every rule accepted (after waiting
    /// [`Verdict::delay`], for a leaky bucket), or the store failed and the fail mode is
    /// [`FailMode::Open`](crate::FailMode::Open).
    #[must_use]
    pub fn is_allowed(&self) -> bool {
        match &self.state {
            State::Allowed => true,
            State::Rejected => false,
            State::Failed { closed, .. } => !closed,
        }
    }

    /// Whether a rule rejected: the input is over a limit.
    #[must_use]
    pub fn is_rejected(&self) -> bool {
        matches!(self.state, State::Rejected)
    }

    /// The store's error when it could not decide (then [`Verdict::is_allowed`] says what
    /// the fail mode chose, and there are no decisions).
    #[must_use]
    pub fn store_error(&self) -> Option<&StoreError> {
        match &self.state {
            State::Failed { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Each enforced rule's decision, in the order of the rules (none when the store
    /// failed, or when no rule applied).
    pub fn decisions(&self) -> impl Iterator<Item = RuleDecision<'_>> + '_ {
        self.checks.iter().zip(&self.decisions).map(|(c, d)| RuleDecision {
            rule: &c.rule,
            quota: c.params.quota,
            decision: d,
        })
    }

    /// The index (in `checks`) of the rejecting rule that makes the caller wait longest
    /// (a rule that can never accept counts as longest).
    pub(crate) fn worst(&self) -> Option<usize> {
        self.decisions
            .iter()
            .enumerate()
            .filter(|(_, d)| !d.allowed)
            .max_by_key(|(_, d)| d.retry_after.unwrap_or(Duration::MAX))
            .map(|(i, _)| i)
    }

    /// The index of the most restrictive rule: the worst rejecting one, else the one with
    /// the fewest units left.
    pub(crate) fn most(&self) -> Option<usize> {
        self.worst().or_else(|| self.decisions.iter().enumerate().min_by_key(|(_, d)| d.remaining).map(|(i, _)| i))
    }

    fn at(&self, i: usize) -> RuleDecision<'_> {
        RuleDecision { rule: &self.checks[i].rule, quota: self.checks[i].params.quota, decision: &self.decisions[i] }
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
        self.rejected_by().and_then(|r| r.decision.retry_after)
    }

    /// Leaky bucket rules: how long to wait before going ahead (zero otherwise).
    #[must_use]
    pub fn delay(&self) -> Duration {
        if !matches!(self.state, State::Allowed) {
            return Duration::ZERO;
        }
        self.decisions.iter().map(|d| d.delay).max().unwrap_or(Duration::ZERO)
    }
}
