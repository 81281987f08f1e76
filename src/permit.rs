//! [`Permit`]: a verdict that holds the permits of its concurrency rules (issue 42,
//! [`Rule::concurrent`](crate::Rule::concurrent)) until it is dropped.

use std::fmt;
use std::ops::Deref;

use crate::verdict::Verdict;

/// What [`Limiter::enter`](crate::Limiter::enter) and
/// [`Limiter::enter_key`](crate::Limiter::enter_key) decided: a [`Verdict`] (read it
/// through `Deref`), and, when allowed, the permits of its concurrency rules, given back
/// when the permit is dropped — exactly once, on every path (the job finished, failed,
/// panicked, or its future was cancelled). Hold it while the work runs.
///
/// Units of the rate rules decided with it are kept, as a [`Verdict`]'s are.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tollgate::BuildError> {
/// use tollgate::{Limiter, MemoryStore, Rule};
///
/// let limiter = Limiter::<_, str>::builder(MemoryStore::new())
///     .add_rule(Rule::concurrent("exports", 1, |account: &str| Some(account.to_owned())))
///     .build()?;
/// let permit = limiter.enter_key("exports", "acme", 1).await;
/// assert!(permit.is_allowed());
/// assert!(limiter.enter_key("exports", "acme", 1).await.is_rejected(), "one in flight");
/// drop(permit); // the export is done
/// assert!(limiter.enter_key("exports", "acme", 1).await.is_allowed());
/// # Ok(()) }
/// ```
#[must_use = "a Permit gives its permits back when dropped: hold it while the work runs"]
pub struct Permit {
    verdict: Verdict,
    /// What gives the permits back when dropped (`None`: none held).
    release: Option<Box<dyn Held>>,
}

/// The stage that gives permits back when dropped, whatever its store.
pub(crate) trait Held: Send + Sync {
    /// How many permits it holds.
    fn permits(&self) -> u64;
}

impl Permit {
    pub(crate) fn new(verdict: Verdict, release: Option<Box<dyn Held>>) -> Self {
        Self { verdict, release }
    }

    /// The verdict.
    #[must_use]
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// How many permits this holds, over every concurrency rule (0 when refused, or when
    /// no concurrency rule applied).
    #[must_use]
    pub fn permits(&self) -> u64 {
        self.release.as_ref().map_or(0, |r| r.permits())
    }

    /// Gives the permits back now (as dropping it does), and returns the verdict.
    pub fn release(self) -> Verdict {
        let Self { verdict, release } = self;
        drop(release);
        verdict
    }
}

impl Deref for Permit {
    type Target = Verdict;

    fn deref(&self) -> &Verdict {
        &self.verdict
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit").field("verdict", &self.verdict).field("permits", &self.permits()).finish()
    }
}
