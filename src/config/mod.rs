#![doc = include_str!("../../docs/config.md")]
#![cfg_attr(docsrs, doc(cfg(feature = "config")))]

mod key_spec;
mod reload;

use std::time::Duration;

use serde::{Deserialize, Deserializer};
use toml::{Table, Value};

pub use self::key_spec::KeySpec;
use crate::algorithm::Algorithm;
use crate::error::BuildError;
use crate::head::RequestHead;
use crate::headers::HeaderStyle;
use crate::layer::RateLimitLayer;
use crate::limiter::LimiterBuilder;
use crate::quota::unit_micros;
use crate::quota::Quota;
use crate::rule::check_rule_name;
use crate::rule::{FailMode, Rule};

/// The rules of one layer and its layer-wide settings, read and checked from a
/// configuration file. See the [module docs](self) for the format.
///
/// It also implements [`serde::Deserialize`], so it can be a section of an application's
/// own configuration struct; a mistake then fails that deserialization with the same
/// message.
#[derive(Debug, Clone, Default)]
pub struct LayerConfig {
    rules: Vec<RuleConfig>,
    algorithm: Option<Algorithm>,
    headers: Option<HeaderStyle>,
    fail_mode: Option<FailMode>,
    timeout: Option<Duration>,
}

/// One checked `[[rule]]` entry.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RuleConfig {
    /// `name`: unique within the layer.
    pub name: String,
    /// `key`: what the rule limits.
    pub key: KeySpec,
    /// `quota` with its `burst`.
    pub quota: Quota,
    /// `algorithm`: `None` uses the layer's.
    pub algorithm: Option<Algorithm>,
    /// `fail_mode`: `None` uses the layer's.
    pub fail_mode: Option<FailMode>,
    /// `shadow`: decide and record, never reject.
    pub shadow: bool,
    /// `max_delay` (leaky bucket): `None` keeps the default (10 s).
    pub max_delay: Option<Duration>,
    /// `block_for`: how long a rejection blocks the key (`None`: no block).
    pub block_for: Option<Duration>,
}

impl LayerConfig {
    /// Reads and checks a TOML document.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidConfig`] naming the rule (its `name`, or `#<n>` counting
    /// `[[rule]]` entries from 1 when it has none) and the field: a quota, algorithm, key,
    /// header name, duration or mode that does not parse, a missing required field, an
    /// unknown field (a typo must not silently mean "default"), a value of the wrong type,
    /// or a duplicate name. A TOML syntax error has the field `toml`.
    pub fn from_toml(toml: &str) -> Result<Self, BuildError> {
        let table: Table =
            toml::from_str(toml).map_err(|e| invalid(String::new(), "toml", e.to_string().trim_end().to_owned()))?;
        Self::from_table(&table)
    }

    /// The checked rules, in file order.
    #[must_use]
    pub fn rules(&self) -> &[RuleConfig] {
        &self.rules
    }

    /// Every configured rule as a [`Rule`], to adjust before building (e.g. add
    /// `bypass_if` to each).
    #[must_use]
    pub fn to_rules(&self) -> Vec<Rule<RequestHead>> {
        self.rules.iter().map(RuleConfig::to_rule).collect()
    }

    /// A layer's builder holding the configured rules and settings, to add rules and
    /// settings in code.
    #[must_use]
    pub fn builder<St>(&self, store: St) -> LimiterBuilder<St, RequestHead, RateLimitLayer<St>> {
        let builder = RateLimitLayer::builder(store);
        self.apply(self.rules.iter().fold(builder, |b, r| b.add_rule(r.to_rule())))
    }

    /// The layer: the configured rules and settings over `store`.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidConfig`] when the configuration has no rule.
    pub fn build<St: crate::store::Store>(&self, store: St) -> Result<RateLimitLayer<St>, BuildError> {
        self.builder(store).build()
    }

    /// Sets the settings that the configuration names (`algorithm`, `headers`,
    /// `fail_mode`, `timeout`) on a layer's `builder` (for rules taken with
    /// [`LayerConfig::to_rules`]); the others stay as they are.
    #[must_use]
    pub fn apply<St>(
        &self,
        mut builder: LimiterBuilder<St, RequestHead, RateLimitLayer<St>>,
    ) -> LimiterBuilder<St, RequestHead, RateLimitLayer<St>> {
        if let Some(a) = self.algorithm {
            builder = builder.algorithm(a);
        }
        if let Some(h) = self.headers {
            builder = builder.headers(h);
        }
        if let Some(m) = self.fail_mode {
            builder = builder.fail_mode(m);
        }
        if let Some(t) = self.timeout {
            builder = builder.timeout(t);
        }
        builder
    }

    /// The layer-wide settings this configuration names, onto a reloaded rule set.
    pub(crate) fn apply_to<I: ?Sized>(&self, draft: &mut crate::limiter::Draft<I>) {
        if let Some(a) = self.algorithm {
            draft.algorithm = a;
        }
        if let Some(h) = self.headers {
            draft.headers = Some(h);
        }
        if let Some(m) = self.fail_mode {
            draft.fail_mode = m;
        }
        if let Some(t) = self.timeout {
            draft.deadline = t;
        }
    }

    fn from_table(table: &Table) -> Result<Self, BuildError> {
        let top = Fields { rule: String::new(), table };
        if let Some(unknown) = table.keys().find(|k| !LAYER_FIELDS.contains(&k.as_str())) {
            let why = if unknown == "rules" {
                "unknown setting: did you mean [[rule]]?".to_owned()
            } else {
                format!("unknown setting: expected one of {}", LAYER_FIELDS.join(", "))
            };
            return Err(top.err(unknown, why));
        }
        let mut config = LayerConfig {
            rules: Vec::new(),
            algorithm: top.optional("algorithm", "an algorithm name", |s| s.parse().map_err(why))?,
            headers: top.optional("headers", "legacy, ietf, both or none", |s| s.parse().map_err(why))?,
            fail_mode: top.optional("fail_mode", "open or closed", |s| s.parse().map_err(why))?,
            timeout: top.optional("timeout", "a duration like \"50ms\"", parse_timeout)?,
        };
        let entries = match table.get("rule") {
            None => &[][..],
            Some(Value::Array(a)) => a.as_slice(),
            Some(v) => return Err(top.err("rule", format!("expected [[rule]] tables, found {}", v.type_str()))),
        };
        for (i, entry) in entries.iter().enumerate() {
            let label = format!("#{}", i + 1);
            let Value::Table(t) = entry else {
                return Err(invalid(label, "rule", format!("expected a [[rule]] table, found {}", entry.type_str())));
            };
            let rule = RuleConfig::from_table(t, label)?;
            if config.rules.iter().any(|r| r.name == rule.name) {
                let why = format!(
                    "another rule is already named {:?}: names must be unique (they are part of the store keys)",
                    rule.name
                );
                return Err(invalid(rule.name, "name", why));
            }
            config.rules.push(rule);
        }
        Ok(config)
    }
}

impl RuleConfig {
    /// The [`Rule`] this entry describes.
    #[must_use]
    pub fn to_rule(&self) -> Rule<RequestHead> {
        let mut rule = Rule::new(self.name.clone(), self.quota, self.key.clone()).shadow(self.shadow);
        rule.from_config = true;
        if let Some(a) = self.algorithm {
            rule = rule.algorithm(a);
        }
        if let Some(m) = self.fail_mode {
            rule = rule.fail_mode(m);
        }
        if let Some(d) = self.max_delay {
            rule = rule.max_delay(d);
        }
        if let Some(b) = self.block_for {
            rule = rule.block_for(b);
        }
        rule
    }

    fn from_table(table: &Table, label: String) -> Result<Self, BuildError> {
        // Errors name the rule by its name once it is known to be a usable one.
        let rule = match table.get("name") {
            Some(Value::String(n)) if check_rule_name(n).is_ok() => n.clone(),
            _ => label,
        };
        let f = Fields { rule, table };
        if let Some(unknown) = table.keys().find(|k| !RULE_FIELDS.contains(&k.as_str())) {
            return Err(f.err(unknown, format!("unknown field: expected one of {}", RULE_FIELDS.join(", "))));
        }
        let name = f.required("name", "a rule name", |s| check_rule_name(s).map(|()| s.to_owned()).map_err(why))?;
        let key = f.required("key", "a key spec like \"peer_ip\"", |s| s.parse::<KeySpec>().map_err(why))?;
        let mut quota = f.required("quota", "a quota like \"100/min\"", |s| s.parse::<Quota>().map_err(why))?;
        if let Some(v) = table.get("burst") {
            let burst = match v {
                Value::Integer(b) => u64::try_from(*b).map_err(|_| f.err("burst", format!("{b} is negative")))?,
                other => return Err(f.err("burst", format!("expected a whole number, found {}", other.type_str()))),
            };
            quota = quota.try_burst(burst).map_err(|e| f.err("burst", why(e)))?;
        }
        let algorithm = f.optional("algorithm", "an algorithm name", |s| s.parse().map_err(why))?;
        let fail_mode = f.optional("fail_mode", "open or closed", |s| s.parse().map_err(why))?;
        let max_delay = f.optional("max_delay", "a duration like \"2s\"", parse_duration)?;
        let block_for = f.optional("block_for", "a duration like \"1h\"", parse_duration)?;
        let shadow = match table.get("shadow") {
            None => false,
            Some(Value::Boolean(b)) => *b,
            Some(other) => return Err(f.err("shadow", format!("expected true or false, found {}", other.type_str()))),
        };
        Ok(RuleConfig { name, key, quota, algorithm, fail_mode, shadow, max_delay, block_for })
    }
}

const LAYER_FIELDS: [&str; 5] = ["rule", "algorithm", "headers", "fail_mode", "timeout"];
const RULE_FIELDS: [&str; 9] =
    ["name", "key", "quota", "algorithm", "burst", "fail_mode", "shadow", "max_delay", "block_for"];

/// The fields of one table, with errors that name the rule.
struct Fields<'a> {
    rule: String,
    table: &'a Table,
}

impl Fields<'_> {
    fn err(&self, field: &str, why: String) -> BuildError {
        invalid(self.rule.clone(), field, why)
    }

    fn optional<T>(
        &self,
        field: &str,
        expected: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, BuildError> {
        self.table
            .get(field)
            .map(|value| match value {
                Value::String(s) => parse(s).map_err(|why| self.err(field, why)),
                other => Err(self.err(field, format!("expected {expected} as a string, found {}", other.type_str()))),
            })
            .transpose()
    }

    fn required<T>(
        &self,
        field: &str,
        expected: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<T, BuildError> {
        self.optional(field, expected, parse)?.ok_or_else(|| self.err(field, format!("missing: expected {expected}")))
    }
}

fn invalid(rule: String, field: &str, why: String) -> BuildError {
    BuildError::InvalidConfig { rule, field: field.to_owned(), why }
}

/// The message of an error from a parser of this crate, without its variant's prefix.
fn why(e: BuildError) -> String {
    match e {
        BuildError::InvalidQuota(why)
        | BuildError::InvalidStore(why)
        | BuildError::InvalidKey(why)
        | BuildError::InvalidRuleName { why, .. }
        | BuildError::InvalidConfig { why, .. } => why,
        other => other.to_string(),
    }
}

/// `"50ms"`, `"2s"`, `"1min"`, `"250us"`, `"1h"`: a whole number and a unit (the units of
/// a quota's period).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(digits);
    let n: u64 = n.parse().map_err(|_| format!("{s:?}: expected a whole number and a unit, e.g. 2s or 500ms"))?;
    let unit_us = match unit.trim() {
        "" => return Err(format!("{s:?}: the duration has no unit (ms, s, min, h)")),
        unit => unit_micros(unit).ok_or_else(|| format!("{s:?}: unknown unit (use us, ms, s, min or h)"))?,
    };
    Ok(Duration::from_micros(n.saturating_mul(unit_us)))
}

/// A store deadline: a duration above zero (a zero deadline would fail every call, and
/// with the default fail mode silently turn limiting off).
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("{s:?}: the store deadline must be above zero (e.g. 50ms)"));
    }
    Ok(d)
}

impl<'de> Deserialize<'de> for LayerConfig {
    /// Reads a table of the same shape as the TOML format, from any serde format, and
    /// checks it as [`LayerConfig::from_toml`] does.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let table = Table::deserialize(deserializer)?;
        Self::from_table(&table).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("50ms"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_duration(" 2s "), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1min"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert!(parse_duration("2").unwrap_err().contains("no unit"));
        assert!(parse_duration("1.5s").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("s").unwrap_err().contains("whole number"));
        assert_eq!(parse_duration("1hour"), Ok(Duration::from_secs(3600)), "the units of a quota");
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(2 * 86_400)));
        assert!(parse_timeout("0ms").unwrap_err().contains("above zero"));
        assert_eq!(parse_timeout("20ms"), Ok(Duration::from_millis(20)));
    }
}
