//! [`BuildError`] (configuration) and [`StoreError`] (a store that could not decide).

use std::time::Duration;

/// A layer, quota or store that cannot be built as configured. Returned at start-up,
/// never at request time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The quota is not usable (zero limit, zero period, …).
    #[error("invalid quota: {0}")]
    InvalidQuota(String),
    /// Two rules of one layer have the same name.
    #[error("duplicate rule name {0:?}: every rule of a layer needs its own name")]
    DuplicateRule(String),
    /// Another live limiter or layer over the same store (or a clone of it) uses this
    /// rule name: the two would count into one state.
    #[error(
        "rule {rule:?} is already used by another live limiter or layer over this store, and the two would \
         count into one state: give each its own rule name ({hint}), or let every caller share one limiter \
         (RateLimitLayer::from_limiter, then Limiter::check_key by rule name from jobs and admin tasks)"
    )]
    RuleInUse {
        /// The rule's name.
        rule: String,
        /// How the refused limiter was being built, as a hint (e.g.
        /// `Limiter::builder(store).rule("search", quota, key)`).
        hint: &'static str,
    },
    /// A runtime change names a rule the limiter does not have.
    #[error("no rule named {0:?}")]
    UnknownRule(String),
    /// A rule name is empty, too long, or otherwise unusable.
    #[error("invalid rule name {name:?}: {why}")]
    InvalidRuleName {
        /// The name.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// An algorithm name that is not one of the six.
    #[error(
        "unknown algorithm {0:?}: use one of fixed_window, sliding_window_log, sliding_window_counter, \
         token_bucket, leaky_bucket, gcra"
    )]
    UnknownAlgorithm(String),
    /// A key extractor cannot be built as configured (a trusted proxy network that does not
    /// parse, a header name that is not one).
    #[error("invalid key: {0}")]
    InvalidKey(String),
    /// A store could not be configured (bad URL, bad prefix, …).
    #[error("invalid store configuration: {0}")]
    InvalidStore(String),
    /// A configuration entry is wrong; names the rule (when the entry is a rule's) and the
    /// field.
    #[error("{}", config_message(.rule, .field, .why))]
    InvalidConfig {
        /// The rule's name (or its index when it has none).
        rule: String,
        /// The field.
        field: String,
        /// What is wrong with it.
        why: String,
    },
}

/// `rule "name", field `f`: why`, or without the rule for a file-level entry.
fn config_message(rule: &str, field: &str, why: &str) -> String {
    if rule.is_empty() {
        format!("field `{field}`: {why}")
    } else {
        format!("rule {rule:?}, field `{field}`: {why}")
    }
}

/// A store that could not decide. Never becomes the service's error: it goes through
/// [`FailMode`](crate::FailMode).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store did not answer within the deadline.
    #[error("the store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store could not be reached or the connection broke.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store has no connection now (one is being made in the background) and failed
    /// at once, without waiting or sending anything. The circuit breaker does not count
    /// it — there is no wait to spare — so limiting resumes as soon as the connection is
    /// back (a failover, a restart), not a cool-down later.
    #[error("store not connected: {0}")]
    NotConnected(String),
    /// One node of a clustered store failed (its connection broke or could not be made)
    /// while the store's other nodes answer: the keys it serves are undecided, the others
    /// are not affected. One that did not answer in time is
    /// [`NodeTimeout`](StoreError::NodeTimeout). The circuit breaker does not count it (nor take it for
    /// a success), so that one failed node does not stop the calls to the healthy ones.
    #[error("store node unavailable: {0}")]
    NodeUnavailable(String),
    /// One node of a clustered store did not answer in time while the store's other nodes
    /// answer. The call was sent and may still run there: its outcome is unknown (what it
    /// asked is never sent again blindly). As for
    /// [`NodeUnavailable`](StoreError::NodeUnavailable), the circuit breaker does not count
    /// it, so that one stalled node does not stop the calls to the healthy ones.
    #[error("store node timed out: {0}")]
    NodeTimeout(String),
    /// Too many store calls were already in flight; this one was not queued.
    #[error("store overloaded: {0} calls already in flight")]
    Overloaded(usize),
    /// The circuit breaker is open after repeated failures; the store was not called.
    #[error("circuit open: the store failed repeatedly and is not called until {0:?} from now")]
    CircuitOpen(Duration),
    /// An in-process store holds its maximum number of keys
    /// ([`MemoryStore::max_keys`](crate::MemoryStore::max_keys)) and this check needed a
    /// new one: handled by the fail mode, as any store error.
    #[error(
        "store full: it holds its maximum of {0} keys (expired ones are dropped as room is needed, \
         across every shard at most every 100 ms)"
    )]
    Full(usize),
    /// The store answered with an error (a script error, a wrong type, …).
    #[error("store error: {0}")]
    Backend(String),
    /// The limiter has no rule of this name: an admin call ([`Limiter::block`],
    /// [`Limiter::peek`], [`Limiter::reset`]) or a check by key
    /// ([`Limiter::check_key`]) named a rule it does not have (a typo, or a rule a reload
    /// removed).
    ///
    /// [`Limiter::block`]: crate::Limiter::block
    /// [`Limiter::peek`]: crate::Limiter::peek
    /// [`Limiter::reset`]: crate::Limiter::reset
    /// [`Limiter::check_key`]: crate::Limiter::check_key
    #[error("this limiter has no rule named {0:?}")]
    UnknownRule(String),
    /// The call itself was wrong: a check list that names one state (rule, key and
    /// algorithm) twice. A `Limiter` never makes one; a direct [`Store`](crate::store::Store)
    /// caller can.
    #[error("invalid store call: {0}")]
    Invalid(String),
}

impl StoreError {
    /// Whether the call that failed with this error never reached the store (refused
    /// before it left this process: the circuit was open, too many calls in flight, no
    /// connection; or the connection failed, a node's or the store's, with nothing
    /// answered): what the fallback admitted for it is charged to the store later. The one
    /// classification of "unsent" (the decision path, late calls and write-backs all ask
    /// it).
    ///
    /// A timeout — the caller's deadline, a connection's response timeout, one cluster
    /// node's ([`StoreError::NodeTimeout`]) — is "sent, outcome unknown": the store may
    /// still run it, so what it asked is never sent again ([`StoreError::is_timeout`]).
    pub(crate) fn never_sent(&self) -> bool {
        matches!(
            self,
            StoreError::CircuitOpen(_)
                | StoreError::Overloaded(_)
                | StoreError::NotConnected(_)
                | StoreError::Unavailable(_)
                | StoreError::NodeUnavailable(_)
        )
    }

    /// Whether the call was sent and nothing answered in time (the store's or one node's
    /// timeout): its outcome is unknown.
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, StoreError::Timeout(_) | StoreError::NodeTimeout(_))
    }
}

#[cfg(test)]
mod tests {
    use super::BuildError;

    #[test]
    fn a_file_level_config_error_names_no_empty_rule() {
        let err =
            |rule: &str| BuildError::InvalidConfig { rule: rule.into(), field: "timeout".into(), why: "bad".into() };
        assert_eq!(err("").to_string(), "field `timeout`: bad");
        assert_eq!(err("api").to_string(), "rule \"api\", field `timeout`: bad");
    }
}
