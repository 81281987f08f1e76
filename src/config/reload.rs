//! Reloading a running limiter from a [`LayerConfig`]: the configuration's side of
//! [`LimiterHandle`], so that the limiter never names the configuration.

use crate::error::BuildError;
use crate::head::RequestHead;
use crate::limiter::LimiterHandle;
use crate::rule::Rule;

use super::LayerConfig;

impl LimiterHandle<RequestHead> {
    /// Swaps in the rules and settings of `config`: the rules that came from a
    /// configuration (by [`LayerConfig::build`](LayerConfig::build),
    /// [`LayerConfig::builder`](LayerConfig::builder),
    /// [`LayerConfig::to_rules`](LayerConfig::to_rules)) are replaced by
    /// `config`'s, in its order, and the rules added in code stay, after them. The
    /// layer-wide settings `config` names (`algorithm`, `fail_mode`, `timeout`,
    /// `headers`) take effect, also over the same settings made in code when the layer was
    /// built; those it does not name stay as they are.
    ///
    /// A rule from a configuration is replaced as the configuration now says: what code
    /// added to it (a `bypass_if`, a `count_if`) is not carried over — use
    /// [`LimiterHandle::reload_with`] to add it again.
    ///
    /// # Errors
    ///
    /// As [`LimiterHandle::set_rules`]; the rules in force stay.
    pub fn reload(&self, config: &LayerConfig) -> Result<(), BuildError> {
        self.reload_with(config, |rule| rule)
    }

    /// [`LimiterHandle::reload`], passing each of `config`'s rules through `adjust` first:
    /// what code adds to configured rules (an allow-list's `bypass_if`) stays with them.
    ///
    /// # Errors
    ///
    /// As [`LimiterHandle::set_rules`]; the rules in force stay.
    pub fn reload_with(
        &self,
        config: &LayerConfig,
        adjust: impl Fn(Rule<RequestHead>) -> Rule<RequestHead>,
    ) -> Result<(), BuildError> {
        self.swap(|draft| {
            let from_code = draft.rules.drain(..).filter(|r| !r.from_config);
            let adjusted = config.to_rules().into_iter().map(|r| Rule { from_config: true, ..adjust(r) });
            let mut rules: Vec<_> = adjusted.collect();
            rules.extend(from_code);
            draft.rules = rules;
            config.apply_to(draft);
            Ok(())
        })
    }
}
